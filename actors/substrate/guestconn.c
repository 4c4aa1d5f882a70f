/* guestconn: node side of the guest protocol (see guestconn.h). */
#include "guestconn.h"
#include "krt.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ka_guestconn {
    int fd;
    bool own_fd;
    uint64_t next_id;
    uint64_t window; /* credit per stream request; 0: streams are not credit-bound */
    msgpack_sbuffer out;
    size_t out_off;
    msgpack_packer pk;
    uint8_t *in;
    size_t in_off, in_len, in_cap; /* unparsed bytes are in[in_off .. in_len) */
};

struct ka_gp_frame {
    msgpack_unpacked up;
    uint8_t *body; /* the frame's msgpack bytes, inside mem */
    uint8_t *mem;  /* what to free */
    char msg[256];
};

/* A data frame at least this big is moved out of the input buffer rather than copied, when
 * what follows it there is at most a quarter of it (that much is copied instead). */
#define S_MOVE_MIN (64u << 10)

ka_guestconn_t *ka_guestconn_new(int fd, bool own_fd)
{
    if (fd < 0)
        return NULL;
    ka_guestconn_t *gc = calloc(1, sizeof(*gc));
    if (!gc)
        return NULL;
    gc->fd = fd;
    gc->own_fd = own_fd;
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    msgpack_sbuffer_init(&gc->out);
    msgpack_packer_init(&gc->pk, &gc->out, msgpack_sbuffer_write);
    return gc;
}

void ka_guestconn_destroy(ka_guestconn_t **gc_p)
{
    if (!gc_p || !*gc_p)
        return;
    ka_guestconn_t *gc = *gc_p;
    if (gc->own_fd)
        close(gc->fd);
    msgpack_sbuffer_destroy(&gc->out);
    free(gc->in);
    free(gc);
    *gc_p = NULL;
}

int ka_guestconn_fd(const ka_guestconn_t *gc)
{
    return gc->fd;
}

void ka_guestconn_set_window(ka_guestconn_t *gc, uint64_t bytes)
{
    gc->window = bytes;
}

uint64_t ka_guestconn_last_id(const ka_guestconn_t *gc)
{
    return gc->next_id;
}

/* --- encoding ------------------------------------------------------------------------------- */

static void s_key(ka_guestconn_t *gc, const char *k)
{
    ka_gp_pack_cstr(&gc->pk, k);
}

/* Starts a request map with op and id plus nkeys more pairs. */
static size_t s_begin(ka_guestconn_t *gc, const char *op, uint32_t nkeys, uint64_t *id)
{
    size_t off = ka_gp_frame_begin(&gc->out);
    uint64_t rid = ++gc->next_id;
    msgpack_pack_map(&gc->pk, nkeys + 2);
    s_key(gc, "op");
    ka_gp_pack_cstr(&gc->pk, op);
    s_key(gc, "id");
    msgpack_pack_uint64(&gc->pk, rid);
    if (id)
        *id = rid;
    return off;
}

static int s_end(ka_guestconn_t *gc, size_t off)
{
    if (!gc->out.data)
        return -ENOMEM;
    ka_gp_frame_end(&gc->out, off);
    return 0;
}

static void s_kv_u64(ka_guestconn_t *gc, const char *k, uint64_t v)
{
    s_key(gc, k);
    msgpack_pack_uint64(&gc->pk, v);
}

/* The "window" key of a stream request, if the connection sets one. */
static void s_window(ka_guestconn_t *gc)
{
    if (gc->window)
        s_kv_u64(gc, "window", gc->window);
}

int ka_guestconn_ping(ka_guestconn_t *gc, uint64_t *id)
{
    return s_end(gc, s_begin(gc, "ping", 0, id));
}

int ka_guestconn_start(ka_guestconn_t *gc, const ka_gp_start_t *req, uint64_t *id)
{
    if (!req || !req->argv || !req->argv[0])
        return -EINVAL;
    size_t argc = 0, envc = 0;
    while (req->argv[argc])
        argc++;
    while (req->env && req->env[envc])
        envc++;
    for (size_t i = 0; i < envc; i++)
        if (!strchr(req->env[i], '='))
            return -EINVAL;
    bool win = req->follow && gc->window;
    size_t off = s_begin(gc, "start",
                         3 + (req->cwd ? 1 : 0) + (envc ? 1 : 0) + (req->follow ? 1 : 0) + win +
                             (req->tty ? 3 : 0),
                         id);
    if (req->tty) {
        s_key(gc, "tty");
        msgpack_pack_true(&gc->pk);
        s_kv_u64(gc, "rows", req->rows);
        s_kv_u64(gc, "cols", req->cols);
    }
    if (req->follow) {
        s_key(gc, "follow");
        msgpack_pack_true(&gc->pk);
    }
    if (win)
        s_window(gc);
    s_key(gc, "argv");
    msgpack_pack_array(&gc->pk, argc);
    for (size_t i = 0; i < argc; i++)
        ka_gp_pack_cstr(&gc->pk, req->argv[i]);
    if (req->cwd) {
        s_key(gc, "cwd");
        ka_gp_pack_cstr(&gc->pk, req->cwd);
    }
    if (envc) {
        s_key(gc, "env");
        msgpack_pack_map(&gc->pk, envc);
        for (size_t i = 0; i < envc; i++) {
            const char *eq = strchr(req->env[i], '=');
            ka_gp_pack_bytes(&gc->pk, req->env[i], (size_t)(eq - req->env[i]), false);
            ka_gp_pack_cstr(&gc->pk, eq + 1);
        }
    }
    s_key(gc, "stdin");
    if (req->stdin_open)
        msgpack_pack_true(&gc->pk);
    else
        msgpack_pack_false(&gc->pk);
    s_kv_u64(gc, "timeout_ms", req->timeout_ms);
    return s_end(gc, off);
}

int ka_guestconn_get(ka_guestconn_t *gc, uint64_t proc, uint64_t *id)
{
    size_t off = s_begin(gc, "get", 1, id);
    s_kv_u64(gc, "proc", proc);
    return s_end(gc, off);
}

int ka_guestconn_signal(ka_guestconn_t *gc, uint64_t proc, int sig, uint64_t *id)
{
    size_t off = s_begin(gc, "signal", 2, id);
    s_kv_u64(gc, "proc", proc);
    s_key(gc, "signal");
    msgpack_pack_int64(&gc->pk, sig);
    return s_end(gc, off);
}

int ka_guestconn_resize(ka_guestconn_t *gc, uint64_t proc, uint32_t rows, uint32_t cols,
                        uint64_t *id)
{
    size_t off = s_begin(gc, "resize", 3, id);
    s_kv_u64(gc, "proc", proc);
    s_kv_u64(gc, "rows", rows);
    s_kv_u64(gc, "cols", cols);
    return s_end(gc, off);
}

int ka_guestconn_input(ka_guestconn_t *gc, uint64_t proc, const void *data, size_t len,
                       bool close_after, uint64_t *id)
{
    size_t off = s_begin(gc, "input", 3, id);
    s_kv_u64(gc, "proc", proc);
    s_key(gc, "data");
    ka_gp_pack_bytes(&gc->pk, data ? data : "", len, true);
    s_key(gc, "close");
    if (close_after)
        msgpack_pack_true(&gc->pk);
    else
        msgpack_pack_false(&gc->pk);
    return s_end(gc, off);
}

int ka_guestconn_output(ka_guestconn_t *gc, uint64_t proc, uint64_t stdout_off, uint64_t stderr_off,
                        bool follow, uint64_t *id)
{
    size_t off = s_begin(gc, "output", 4 + (gc->window ? 1 : 0), id);
    s_window(gc);
    s_kv_u64(gc, "proc", proc);
    s_kv_u64(gc, "stdout_offset", stdout_off);
    s_kv_u64(gc, "stderr_offset", stderr_off);
    s_key(gc, "follow");
    if (follow)
        msgpack_pack_true(&gc->pk);
    else
        msgpack_pack_false(&gc->pk);
    return s_end(gc, off);
}

int ka_guestconn_read(ka_guestconn_t *gc, const char *path, uint32_t mode, uint64_t *id)
{
    if (!path)
        return -EINVAL;
    size_t off = s_begin(gc, "read", 2 + (gc->window ? 1 : 0), id);
    s_window(gc);
    s_key(gc, "path");
    ka_gp_pack_cstr(&gc->pk, path);
    s_kv_u64(gc, "mode", mode);
    return s_end(gc, off);
}

int ka_guestconn_write(ka_guestconn_t *gc, const char *path, uint32_t mode, uint64_t seek,
                       const void *data, size_t len, uint64_t *id)
{
    if (!path)
        return -EINVAL;
    if (len > KA_GP_FILE_CAP)
        return -EFBIG;
    size_t off = s_begin(gc, "write", 4, id);
    s_key(gc, "path");
    ka_gp_pack_cstr(&gc->pk, path);
    s_kv_u64(gc, "mode", mode);
    s_kv_u64(gc, "seek_offset", seek);
    s_key(gc, "data");
    ka_gp_pack_bytes(&gc->pk, data ? data : "", len, true);
    return s_end(gc, off);
}

int ka_guestconn_cancel(ka_guestconn_t *gc, uint64_t target, uint64_t *id)
{
    size_t off = s_begin(gc, "cancel", 1, id);
    s_kv_u64(gc, "target", target);
    return s_end(gc, off);
}

static void s_kv_str(ka_guestconn_t *gc, const char *k, const char *v)
{
    s_key(gc, k);
    ka_gp_pack_cstr(&gc->pk, v);
}

int ka_guestconn_fs(ka_guestconn_t *gc, const ka_gp_fs_t *req, uint64_t *id)
{
    static const struct {
        const char *op, *flag;
    } ops[] = {{"list", NULL},       {"stat", NULL},        {"remove", "recursive"},
               {"mkdir", "parents"}, {"move", "overwrite"}, {"watch", NULL}};
    size_t i = 0;
    while (i < sizeof ops / sizeof ops[0] && strcmp(ops[i].op, req->op) != 0)
        i++;
    if (i == sizeof ops / sizeof ops[0] || !req->path || (i == 4 && !req->to))
        return -EINVAL;
    bool after = i == 0 && req->after && req->after[0];
    uint32_t n = 1 + (i == 0) + after + (ops[i].flag != NULL) + (i == 3) + (i == 4) +
                 (i == 5 && req->window);
    size_t off = s_begin(gc, req->op, n, id);
    s_kv_str(gc, "path", req->path);
    if (i == 0)
        s_kv_u64(gc, "limit", req->limit);
    if (after)
        s_kv_str(gc, "after", req->after);
    if (ops[i].flag) {
        s_key(gc, ops[i].flag);
        if (req->flag)
            msgpack_pack_true(&gc->pk);
        else
            msgpack_pack_false(&gc->pk);
    }
    if (i == 3)
        s_kv_u64(gc, "mode", req->mode);
    if (i == 4)
        s_kv_str(gc, "to", req->to);
    if (i == 5 && req->window)
        s_kv_u64(gc, "window", req->window);
    return s_end(gc, off);
}

int ka_guestconn_credit(ka_guestconn_t *gc, uint64_t target, uint64_t bytes)
{
    size_t off = s_begin(gc, "credit", 2, NULL);
    s_kv_u64(gc, "target", target);
    s_kv_u64(gc, "bytes", bytes);
    return s_end(gc, off);
}

/* --- I/O ------------------------------------------------------------------------------------ */

bool ka_guestconn_pending(const ka_guestconn_t *gc)
{
    return gc->out_off < gc->out.size;
}

int ka_guestconn_flush(ka_guestconn_t *gc)
{
    while (gc->out_off < gc->out.size) {
        ssize_t n = write(gc->fd, gc->out.data + gc->out_off, gc->out.size - gc->out_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return -EAGAIN;
        if (n < 0)
            return -errno;
        gc->out_off += (size_t)n;
    }
    gc->out.size = 0;
    gc->out_off = 0;
    return 0;
}

/* Takes one complete frame out of the input buffer, if there is one. */
static int s_take(ka_guestconn_t *gc, ka_gp_frame_t **out)
{
    const uint8_t *body;
    size_t blen;
    if (gc->in_off == gc->in_len) /* nothing buffered (before the first read, in is NULL) */
        return -EAGAIN;
    long used = ka_gp_frame_next(gc->in + gc->in_off, gc->in_len - gc->in_off, KA_GP_MAX_REPLY,
                                 &body, &blen);
    if (used < 0)
        return -EMSGSIZE;
    if (used == 0)
        return -EAGAIN;
    ka_gp_frame_t *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    size_t rest = gc->in_len - gc->in_off - (size_t)used;
    uint8_t *fresh = blen >= S_MOVE_MIN && rest <= blen / 4 ? malloc(gc->in_cap) : NULL;
    if (fresh) { /* the buffer goes with the frame; what follows it starts a new one */
        memcpy(fresh, body + blen, rest);
        f->mem = gc->in;
        f->body = (uint8_t *)body;
        gc->in = fresh;
        gc->in_off = 0;
        gc->in_len = rest;
    } else {
        f->mem = f->body = malloc(blen ? blen : 1);
        if (!f->body) {
            free(f);
            return -ENOMEM;
        }
        memcpy(f->body, body, blen);
        gc->in_off += (size_t)used;
        if (gc->in_off == gc->in_len)
            gc->in_off = gc->in_len = 0;
    }
    msgpack_unpacked_init(&f->up);
    size_t off = 0;
    if (ka_gp_frame_check(f->body, blen) != 0 ||
        msgpack_unpack_next(&f->up, (const char *)f->body, blen, &off) != MSGPACK_UNPACK_SUCCESS ||
        f->up.data.type != MSGPACK_OBJECT_MAP) {
        ka_gp_frame_free(&f);
        return -EBADMSG;
    }
    const char *m;
    size_t mn;
    if (ka_gp_get_bytes(&f->up.data, "msg", &m, &mn)) {
        if (mn >= sizeof(f->msg))
            mn = sizeof(f->msg) - 1;
        memcpy(f->msg, m, mn);
    }
    *out = f;
    return 0;
}

int ka_guestconn_recv(ka_guestconn_t *gc, ka_gp_frame_t **out)
{
    int rc = s_take(gc, out);
    if (rc != -EAGAIN)
        return rc;
    for (;;) {
        if (gc->in_off > 0) { /* compact: only a partial frame is left */
            memmove(gc->in, gc->in + gc->in_off, gc->in_len - gc->in_off);
            gc->in_len -= gc->in_off;
            gc->in_off = 0;
        }
        if (gc->in_cap - gc->in_len < 65536) {
            size_t cap = gc->in_cap ? gc->in_cap * 2 : 262144;
            uint8_t *n = realloc(gc->in, cap);
            if (!n)
                return -ENOMEM;
            gc->in = n;
            gc->in_cap = cap;
        }
        ssize_t n = read(gc->fd, gc->in + gc->in_len, gc->in_cap - gc->in_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return -EAGAIN;
        if (n <= 0)
            return -ECONNRESET;
        gc->in_len += (size_t)n;
        rc = s_take(gc, out);
        if (rc != -EAGAIN)
            return rc;
    }
}

int ka_guestconn_wait(ka_guestconn_t *gc, int timeout_ms, ka_gp_frame_t **out)
{
    int64_t until = timeout_ms < 0 ? -1 : krt_mono_ms() + timeout_ms;
    for (;;) {
        int frc = ka_guestconn_flush(gc);
        if (frc < 0 && frc != -EAGAIN)
            return frc;
        int rc = ka_guestconn_recv(gc, out);
        if (rc != -EAGAIN)
            return rc;
        int left = -1;
        if (until >= 0) {
            int64_t l = until - krt_mono_ms();
            if (l <= 0)
                return -ETIMEDOUT;
            left = (int)l;
        }
        struct pollfd p = {.fd = gc->fd, .events = POLLIN | (frc == -EAGAIN ? POLLOUT : 0)};
        if (poll(&p, 1, left) < 0 && errno != EINTR)
            return -errno;
    }
}

int ka_guestconn_call(ka_guestconn_t *gc, uint64_t id, int timeout_ms, ka_gp_data_cb cb, void *user,
                      ka_gp_frame_t **final)
{
    int64_t until = timeout_ms < 0 ? -1 : krt_mono_ms() + timeout_ms;
    static const char *const keys[] = {"stdout", "stderr", "chunk"};
    for (;;) {
        int left = -1;
        if (until >= 0) {
            int64_t l = until - krt_mono_ms();
            left = l < 0 ? 0 : (int)l;
        }
        ka_gp_frame_t *f = NULL;
        int rc = ka_guestconn_wait(gc, left, &f);
        if (rc < 0)
            return rc;
        if (ka_gp_frame_id(f) != id) {
            ka_gp_frame_free(&f);
            continue;
        }
        if (cb) {
            for (size_t i = 0; i < 3; i++) {
                const char *d;
                size_t n;
                uint64_t off = 0;
                if (ka_gp_get_bytes(&f->up.data, keys[i], &d, &n)) {
                    ka_gp_get_u64(&f->up.data, "offset", &off);
                    cb(user, keys[i], d, n, off);
                }
            }
        }
        if (!ka_gp_frame_is_end(f)) {
            ka_gp_frame_free(&f);
            continue;
        }
        rc = ka_gp_frame_err(f);
        if (final)
            *final = f;
        else
            ka_gp_frame_free(&f);
        return rc;
    }
}

/* --- frames --------------------------------------------------------------------------------- */

uint64_t ka_gp_frame_id(const ka_gp_frame_t *f)
{
    uint64_t id = 0;
    ka_gp_get_u64(&f->up.data, "id", &id);
    return id;
}

bool ka_gp_frame_is_end(const ka_gp_frame_t *f)
{
    bool end = false;
    ka_gp_get_bool(&f->up.data, "end", &end);
    return end;
}

int ka_gp_frame_err(const ka_gp_frame_t *f)
{
    int64_t e = 0;
    if (!ka_gp_get_i64(&f->up.data, "err", &e))
        return 0;
    return e < 0 ? (int)e : -EPROTO;
}

const char *ka_gp_frame_msg(const ka_gp_frame_t *f)
{
    return f->msg;
}

const msgpack_object *ka_gp_frame_map(const ka_gp_frame_t *f)
{
    return &f->up.data;
}

int ka_gp_frame_process(const ka_gp_frame_t *f, ka_gp_process_t *out)
{
    const msgpack_object *p = ka_gp_get(&f->up.data, "process");
    if (!p)
        p = ka_gp_get(&f->up.data, "exit");
    if (!p)
        return -ENOENT;
    return ka_gp_process_decode(p, out);
}

void ka_gp_frame_free(ka_gp_frame_t **f_p)
{
    if (!f_p || !*f_p)
        return;
    msgpack_unpacked_destroy(&(*f_p)->up);
    free((*f_p)->mem);
    free(*f_p);
    *f_p = NULL;
}
