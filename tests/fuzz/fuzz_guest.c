/*
 * fuzz_guest: bytes a hostile guest writes on its channel, as the node reads them: through a
 * real socketpair into ka_guestconn (framing with ka_gp_frame_next, msgpack decoding), then
 * every frame read the way the node's users read them: ka_guestconn_call's data callback and
 * end/err/msg (the guest link and process actors), the process record (ka_gp_frame_process),
 * and the keys the sandbox actor routes (offset, written, size, a process's argv strings).
 *
 * Input: the bytes the guest sends after the node's one request (a ping, id 1); at most
 * FUZZ_GUEST_MAX of them, so that all fit in the socket's buffer before the node reads.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "guestconn.h"

#define FUZZ_GUEST_MAX (64u << 10)

static size_t s_seen;

static void s_on_data(void *user, const char *key, const char *data, size_t len, uint64_t offset)
{
    for (size_t i = 0; i < len; i++) /* the whole range must be readable */
        s_seen += (unsigned char)data[i];
    s_seen += offset + strlen(key);
}

/* What the sandbox actor and the process actor take from one frame. */
static void s_read_frame(const ka_gp_frame_t *f)
{
    const msgpack_object *m = ka_gp_frame_map(f);
    s_seen += ka_gp_frame_id(f) + ka_gp_frame_is_end(f) + (size_t)-ka_gp_frame_err(f);
    s_seen += strlen(ka_gp_frame_msg(f));
    static const char *const keys[] = {"stdout", "stderr", "chunk", "msg"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const char *p;
        size_t n;
        uint64_t off = 0;
        if (ka_gp_get_bytes(m, keys[i], &p, &n)) {
            ka_gp_get_u64(m, "offset", &off);
            s_on_data(NULL, keys[i], p, n, off);
        }
    }
    uint64_t u = 0;
    int64_t i64 = 0;
    bool b = false;
    s_seen += ka_gp_get_u64(m, "written", &u) + ka_gp_get_u64(m, "size", &u) +
              ka_gp_get_i64(m, "pid", &i64) + ka_gp_get_bool(m, "close", &b) + u;
    ka_gp_process_t p;
    if (ka_gp_frame_process(f, &p) == 0)
        s_seen += p.proc + (size_t)p.pid + p.state;
    const msgpack_object *proc = ka_gp_get(m, "process");
    const msgpack_object *argv = ka_gp_get(proc ? proc : ka_gp_get(m, "exit"), "argv");
    if (argv && argv->type == MSGPACK_OBJECT_ARRAY)
        for (uint32_t k = 0; k < argv->via.array.size; k++)
            if (argv->via.array.ptr[k].type == MSGPACK_OBJECT_STR)
                s_on_data(NULL, "argv", argv->via.array.ptr[k].via.str.ptr,
                          argv->via.array.ptr[k].via.str.size, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_GUEST_MAX)
        size = FUZZ_GUEST_MAX;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    ka_guestconn_t *gc = ka_guestconn_new(sv[0], true);
    uint64_t id = 0;
    if (!gc || ka_guestconn_ping(gc, &id) || ka_guestconn_flush(gc))
        abort();
    int sz = (int)size + 4096;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    for (size_t off = 0; off < size;) { /* the guest's bytes, then it exits */
        ssize_t n = write(sv[1], data + off, size - off);
        if (n <= 0)
            abort();
        off += (size_t)n;
    }
    close(sv[1]);
    ka_gp_frame_t *fin = NULL;
    int rc = ka_guestconn_call(gc, id, 5000, s_on_data, NULL, &fin);
    if (rc == -ETIMEDOUT)
        abort(); /* the peer is closed: the node must never wait for more */
    if (fin) {
        s_read_frame(fin);
        ka_gp_frame_free(&fin);
    }
    for (;;) { /* what follows, as the sandbox actor's reader takes it */
        ka_gp_frame_t *f = NULL;
        if (ka_guestconn_recv(gc, &f) != 0)
            break;
        s_read_frame(f);
        ka_gp_frame_free(&f);
    }
    ka_guestconn_destroy(&gc);
    return 0;
}
