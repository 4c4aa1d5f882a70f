/*
 * The node side of the guest channel against a hostile guest: a test guest on a socketpair
 * writes forged and malformed frames (oversize lengths, bad or unbounded msgpack, ids never
 * issued, frames for another call or process, data past its credit).
 *
 * 1. guestconn + ka_guestcalls alone: every frame gets the verdict the protocol says.
 * 2. A real sandbox actor (actors/control/sandbox.c) with a fake driver and a fake store,
 *    called through the real service layer: forged frames are dropped and counted while the
 *    call goes on; a malformed frame kills the guest, FAILs the sandbox with a reason and ends
 *    the call with UNAVAILABLE; credit flows back to the guest as the reader acks; a guest that
 *    ignores its credit is killed; a call whose sandbox actor goes away ends (monitor).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "guestconn.h"
#include "ka_guestcalls.h"
#include "sandboxes.h"
#include "service.h"
#include "svc_frames.h"

/* ---- the test guest's side of the channel ------------------------------------------------- */

/* Writes all of buf (the channel is a socketpair: this does not block for these sizes). */
static void g_write(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        assert_true(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t off;
} g_frame_t;

static void g_begin(g_frame_t *f, uint32_t nkeys)
{
    msgpack_sbuffer_init(&f->sb);
    msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
    f->off = ka_gp_frame_begin(&f->sb);
    msgpack_pack_map(&f->pk, nkeys);
}

static void g_u64(g_frame_t *f, const char *k, uint64_t v)
{
    ka_gp_pack_cstr(&f->pk, k);
    msgpack_pack_uint64(&f->pk, v);
}

static void g_bin(g_frame_t *f, const char *k, const void *p, size_t n)
{
    ka_gp_pack_cstr(&f->pk, k);
    ka_gp_pack_bytes(&f->pk, p, n, true);
}

static void g_true(g_frame_t *f, const char *k)
{
    ka_gp_pack_cstr(&f->pk, k);
    msgpack_pack_true(&f->pk);
}

static void g_proc(g_frame_t *f, const char *k, uint64_t proc)
{
    ka_gp_pack_cstr(&f->pk, k);
    msgpack_pack_map(&f->pk, 2);
    g_u64(f, "proc", proc);
    g_u64(f, "state", KA_GP_STATE_RUNNING);
}

static void g_send(int fd, g_frame_t *f)
{
    ka_gp_frame_end(&f->sb, f->off);
    g_write(fd, f->sb.data, f->sb.size);
    msgpack_sbuffer_destroy(&f->sb);
}

/* A data frame: {"id", key: n bytes of 'x', "offset"?}. */
static void g_data(int fd, uint64_t id, const char *key, size_t n, const uint64_t *offset)
{
    char *d = malloc(n ? n : 1);
    assert_non_null(d);
    memset(d, 'x', n);
    g_frame_t f;
    g_begin(&f, offset ? 3 : 2);
    g_u64(&f, "id", id);
    g_bin(&f, key, d, n);
    if (offset)
        g_u64(&f, "offset", *offset);
    g_send(fd, &f);
    free(d);
}

static void g_end(int fd, uint64_t id, const char *u64key, uint64_t v)
{
    g_frame_t f;
    g_begin(&f, u64key ? 3 : 2);
    g_u64(&f, "id", id);
    if (u64key)
        g_u64(&f, u64key, v);
    g_true(&f, "end");
    g_send(fd, &f);
}

/* A raw frame: a length header then body bytes as given. */
static void g_raw(int fd, uint32_t announced, const void *body, size_t n)
{
    uint8_t h[4] = {(uint8_t)(announced >> 24), (uint8_t)(announced >> 16),
                    (uint8_t)(announced >> 8), (uint8_t)announced};
    g_write(fd, h, 4);
    if (n)
        g_write(fd, body, n);
}

/* Reads one request frame the node sent (waits up to 5 s): its op, id and "target"/"bytes". */
typedef struct {
    char op[16];
    uint64_t id, target, bytes, window;
} g_req_t;

static uint8_t g_in[1 << 20];
static size_t g_in_len;

static void g_recv(int fd, g_req_t *r)
{
    memset(r, 0, sizeof *r);
    for (;;) {
        const uint8_t *body;
        size_t blen;
        long used = ka_gp_frame_next(g_in, g_in_len, sizeof g_in, &body, &blen);
        assert_true(used >= 0);
        if (used > 0) {
            msgpack_unpacked up;
            msgpack_unpacked_init(&up);
            size_t off = 0;
            assert_int_equal(msgpack_unpack_next(&up, (const char *)body, blen, &off),
                             MSGPACK_UNPACK_SUCCESS);
            const char *op;
            size_t on;
            assert_true(ka_gp_get_bytes(&up.data, "op", &op, &on) && on < sizeof r->op);
            memcpy(r->op, op, on);
            ka_gp_get_u64(&up.data, "id", &r->id);
            ka_gp_get_u64(&up.data, "target", &r->target);
            ka_gp_get_u64(&up.data, "bytes", &r->bytes);
            ka_gp_get_u64(&up.data, "window", &r->window);
            msgpack_unpacked_destroy(&up);
            memmove(g_in, g_in + used, g_in_len - (size_t)used);
            g_in_len -= (size_t)used;
            return;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 5000), 1);
        ssize_t n = read(fd, g_in + g_in_len, sizeof g_in - g_in_len);
        assert_true(n > 0);
        g_in_len += (size_t)n;
    }
}

/* ---- 1. the parser and the call table ----------------------------------------------------- */

typedef struct {
    int guest; /* the test guest's end */
    ka_guestconn_t *gc;
    ka_gc_table_t t;
} pt_t;

static void pt_up(pt_t *p)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    p->guest = sv[1];
    p->gc = ka_guestconn_new(sv[0], true);
    assert_non_null(p->gc);
    memset(&p->t, 0, sizeof p->t);
}

static void pt_down(pt_t *p)
{
    while (p->t.head)
        ka_gc_remove(&p->t, p->t.head);
    ka_guestconn_destroy(&p->gc);
    close(p->guest);
}

/* Receives the next frame (it was written already) and checks it. */
static ka_gc_verdict_t pt_check(pt_t *p, ka_gc_call_t **c)
{
    ka_gp_frame_t *f = NULL;
    int rc = ka_guestconn_recv(p->gc, &f);
    assert_int_equal(rc, 0);
    const char *why;
    ka_gc_verdict_t v = ka_gc_check(&p->t, ka_guestconn_last_id(p->gc), f, 1, c, &why);
    assert_true(v == KA_GC_DELIVER ? why == NULL : (v == KA_GC_FATAL ? why != NULL : 1));
    ka_gp_frame_free(&f);
    return v;
}

static int pt_recv_err(pt_t *p)
{
    ka_gp_frame_t *f = NULL;
    int rc = ka_guestconn_recv(p->gc, &f);
    ka_gp_frame_free(&f);
    return rc;
}

static void test_check_bounds_lengths(void **state)
{
    (void)state;
    pt_t p;
    pt_up(&p);
    g_raw(p.guest, KA_GP_MAX_REPLY + 1, NULL, 0); /* announces more than a reply may be */
    assert_int_equal(pt_recv_err(&p), -EMSGSIZE);
    pt_down(&p);

    static const uint8_t bad[][8] = {
        {0xc1},                         /* a byte msgpack never uses */
        {0xdd, 0xff, 0xff, 0xff, 0xff}, /* an array of 4 G values in 5 bytes */
        {0xdf, 0x00, 0x10, 0x00, 0x00}, /* a map of 1 M pairs in 5 bytes */
        {0xc6, 0x7f, 0xff, 0xff, 0xff}, /* a 2 GiB bin in 5 bytes */
        {0x92, 0x01},                   /* an array missing a value */
    };
    static const size_t bad_n[] = {1, 5, 5, 5, 2};
    for (size_t i = 0; i < sizeof bad_n / sizeof bad_n[0]; i++) {
        pt_up(&p);
        g_raw(p.guest, (uint32_t)bad_n[i], bad[i], bad_n[i]);
        assert_int_equal(pt_recv_err(&p), -EBADMSG);
        pt_down(&p);
    }
    uint8_t deep[40];
    for (size_t i = 0; i < sizeof deep; i++)
        deep[i] = 0x91; /* [[[[...]]]] deeper than msgpack's unpacker goes */
    deep[sizeof deep - 1] = 0x01;
    pt_up(&p);
    g_raw(p.guest, sizeof deep, deep, sizeof deep);
    assert_int_equal(pt_recv_err(&p), -EBADMSG);
    pt_down(&p);
    uint8_t arr[] = {0x93, 0x01, 0x02, 0x03}; /* bounded, but not a map */
    pt_up(&p);
    g_raw(p.guest, sizeof arr, arr, sizeof arr);
    assert_int_equal(pt_recv_err(&p), -EBADMSG);
    pt_down(&p);
}

static void test_check_ids_and_calls(void **state)
{
    (void)state;
    pt_t p;
    pt_up(&p);
    ka_guestconn_set_window(p.gc, 1000);
    uint64_t get_id, read_id, out_id;
    assert_int_equal(ka_guestconn_get(p.gc, 7, &get_id), 0);
    assert_int_equal(ka_guestconn_read(p.gc, "f", 0, &read_id), 0);
    assert_int_equal(ka_guestconn_output(p.gc, 7, 100, 0, true, &out_id), 0);
    ka_gc_add(&p.t, get_id, KA_GC_PROC, 7, NULL, 0, 0, NULL);
    ka_gc_call_t *rc_ = ka_gc_add(&p.t, read_id, KA_GC_READ, 0, NULL, 1000, 0, NULL);
    const uint64_t off[2] = {100, 0};
    ka_gc_add(&p.t, out_id, KA_GC_OUTPUT, 7, off, 1000, 0, NULL);
    ka_gc_stats_t before, after;
    ka_gc_stats(&before);
    ka_gc_call_t *c;

    g_data(p.guest, 999, "chunk", 10, NULL); /* an id never issued */
    assert_int_equal(pt_check(&p, &c), KA_GC_DROP);
    g_data(p.guest, 0, "chunk", 10, NULL); /* id 0 is the guest's own (ready) */
    assert_int_equal(pt_check(&p, &c), KA_GC_DROP);
    g_data(p.guest, read_id, "chunk", 600, NULL); /* within the credit */
    assert_int_equal(pt_check(&p, &c), KA_GC_DELIVER);
    assert_ptr_equal(c, rc_);
    assert_int_equal(c->credit, 400);
    /* credit comes back only for what was delivered */
    assert_int_equal(ka_gc_credit(c, 5000), 600);
    assert_int_equal(c->credit, 1000);
    assert_int_equal(ka_gc_credit(c, 1), 0);
    g_end(p.guest, read_id, "size", 600);
    assert_int_equal(pt_check(&p, &c), KA_GC_DELIVER);
    ka_gc_remove(&p.t, c);
    g_end(p.guest, read_id, "size", 600); /* a request already finished: stale */
    assert_int_equal(pt_check(&p, &c), KA_GC_DROP);
    ka_gc_stats(&after);
    assert_int_equal(after.forged - before.forged, 2);
    assert_int_equal(after.stale - before.stale, 1);

    uint64_t o = 100;
    g_data(p.guest, out_id, "stdout", 10, &o);
    assert_int_equal(pt_check(&p, &c), KA_GC_DELIVER);
    g_frame_t f; /* a keepalive */
    g_begin(&f, 1);
    g_u64(&f, "id", out_id);
    g_send(p.guest, &f);
    assert_int_equal(pt_check(&p, &c), KA_GC_DROP);
    g_data(p.guest, out_id, "stdout", 10, &o); /* offset 100 again: out of order */
    assert_int_equal(pt_check(&p, &c), KA_GC_FATAL);
    pt_down(&p);

    /* frames that belong to another call or process, and data past the credit */
    struct {
        int what;
    } cases[] = {{0}, {1}, {2}, {3}, {4}, {5}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pt_up(&p);
        ka_guestconn_set_window(p.gc, 1000);
        assert_int_equal(ka_guestconn_get(p.gc, 7, &get_id), 0);
        assert_int_equal(ka_guestconn_read(p.gc, "f", 0, &read_id), 0);
        ka_gc_add(&p.t, get_id, KA_GC_PROC, 7, NULL, 0, 0, NULL);
        ka_gc_add(&p.t, read_id, KA_GC_READ, 0, NULL, 1000, 0, NULL);
        switch (cases[i].what) {
        case 0: /* a GET answered with another process */
            g_begin(&f, 3);
            g_u64(&f, "id", get_id);
            g_proc(&f, "process", 8);
            g_true(&f, "end");
            g_send(p.guest, &f);
            break;
        case 1: /* file data on a GET */
            g_data(p.guest, get_id, "chunk", 10, NULL);
            break;
        case 2: /* process output on a file read */
            o = 0;
            g_data(p.guest, read_id, "stdout", 10, &o);
            break;
        case 3: /* past the credit */
            g_data(p.guest, read_id, "chunk", 1001, NULL);
            break;
        case 4: /* a read whose size is not what it sent */
            g_end(p.guest, read_id, "size", 5);
            break;
        default: /* a frame without an id */
            g_begin(&f, 1);
            g_true(&f, "end");
            g_send(p.guest, &f);
            break;
        }
        assert_int_equal(pt_check(&p, &c), KA_GC_FATAL);
        pt_down(&p);
    }
}

/* ---- 2. a sandbox actor with a fake driver and a fake store ------------------------------- */

struct ka_sandbox {
    int channel;
};

static int s_guest_fd = -1;
static atomic_int s_kills;

static int fd_start(ka_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t **out)
{
    (void)d;
    (void)spec;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        return -errno;
    ka_sandbox_t *sb = calloc(1, sizeof *sb);
    sb->channel = sv[0];
    s_guest_fd = sv[1];
    *out = sb;
    return 0;
}

static int fd_stop(ka_driver_t *d, ka_sandbox_t **sb)
{
    (void)d;
    close((*sb)->channel);
    free(*sb);
    *sb = NULL;
    return 0;
}

static int fd_stats(ka_driver_t *d, ka_sandbox_t *sb, ka_sandbox_stats_t *out)
{
    (void)d;
    (void)sb;
    memset(out, 0, sizeof *out);
    return 0;
}

static int fd_channel(ka_driver_t *d, ka_sandbox_t *sb)
{
    (void)d;
    return sb->channel;
}

static int fd_kill(ka_driver_t *d, ka_sandbox_t *sb)
{
    (void)d;
    (void)sb;
    atomic_fetch_add(&s_kills, 1);
    return 0;
}

static void fd_destroy(ka_driver_t *d)
{
    (void)d;
}

static const ka_driver_ops_t s_fake_ops = {.name = "fake",
                                           .start = fd_start,
                                           .stop = fd_stop,
                                           .stats = fd_stats,
                                           .channel = fd_channel,
                                           .kill = fd_kill,
                                           .destroy = fd_destroy};
static ka_driver_t s_fake_driver = {&s_fake_ops};

/* The fake store: applies updates to one record and answers them. */
static pthread_mutex_t s_rec_mu = PTHREAD_MUTEX_INITIALIZER;
static ka_store_sandbox_t s_rec;

static void st_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    (void)state;
    ka_store_sandbox_reply_t r;
    memset(&r, 0, sizeof r);
    pthread_mutex_lock(&s_rec_mu);
    if (msg->type == KA_STORE_SANDBOX_UPDATE && msg->len == sizeof(ka_store_sandbox_update_t)) {
        const ka_store_sandbox_update_t *u = msg->body;
        s_rec.state = u->state;
        s_rec.operation = u->operation;
        if (u->set & KA_SB_SET_FAILURE) {
            snprintf(s_rec.failure_reason, sizeof s_rec.failure_reason, "%s", u->failure_reason);
            snprintf(s_rec.failure_message, sizeof s_rec.failure_message, "%s", u->failure_message);
        }
    }
    r.sandbox = s_rec;
    pthread_mutex_unlock(&s_rec_mu);
    krt_reply(ctx, msg, msg->type, &r, sizeof r);
}

static const krt_behaviour_t s_store_behaviour = {.kind = "fake-store", .handle = st_handle};

typedef struct {
    krt_system_t *sys;
    krt_addr_t store, sbx;
    ka_service_t *svc;
} at_t;

static int s_rec_state(void)
{
    pthread_mutex_lock(&s_rec_mu);
    int st = s_rec.state;
    pthread_mutex_unlock(&s_rec_mu);
    return st;
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Whether the sandbox actor's own state machine is READY (its tree description says so). */
static bool s_actor_ready(krt_system_t *sys, krt_addr_t sbx)
{
    char *json = krt_tree_json(sys, sbx);
    bool ready = json && strstr(json, "\"fsm\":\"READY\"");
    free(json);
    return ready;
}

static void at_up(at_t *a)
{
    memset(&s_rec, 0, sizeof s_rec);
    snprintf(s_rec.id, sizeof s_rec.id, "0190a0a0-0000-7000-8000-000000000001");
    snprintf(s_rec.creator, sizeof s_rec.creator, "alice");
    s_rec.state = KA_STATE_CREATING;
    s_rec.expires_ms = (int64_t)time(NULL) * 1000 + 3600 * 1000;
    atomic_store(&s_kills, 0);
    krt_config_t cfg = {.schedulers = 2, .name = "test-guestcalls"};
    a->sys = krt_system_new(&cfg);
    assert_non_null(a->sys);
    assert_int_equal(krt_system_start(a->sys), 0);
    krt_spawn_opts_t so = {.name = KA_STORE_NAME, .register_name = true};
    assert_int_equal(krt_system_spawn(a->sys, &s_store_behaviour, NULL, &so, &a->store), 0);
    ka_sandbox_args_t *sa = calloc(1, sizeof *sa);
    sa->mode = KA_SBX_BOOT;
    sa->record = s_rec;
    sa->store = KA_STORE_NAME;
    sa->driver = &s_fake_driver;
    krt_spawn_opts_t xo = {.name = "sbx-under-test", .register_name = true};
    assert_int_equal(krt_system_spawn(a->sys, &ka_sandbox_behaviour, sa, &xo, &a->sbx), 0);
    /* READY as the actor has it: the store's record is READY a moment before the actor takes
     * the store's answer, and a guest call in between is refused (not ready) */
    for (int i = 0; i < 500 && !s_actor_ready(a->sys, a->sbx); i++)
        s_sleep_ms(10);
    assert_true(s_actor_ready(a->sys, a->sbx));
    assert_int_equal(s_rec_state(), KA_STATE_READY);
    /* the service sends guest calls straight to the sandbox actor (no manager here) */
    a->svc = ka_service_new(a->sys, NULL, "sbx-under-test");
    assert_non_null(a->svc);
}

static void at_down(at_t *a)
{
    krt_system_destroy(&a->sys);
    ka_service_destroy(&a->svc);
    close(s_guest_fd);
    s_guest_fd = -1;
    g_in_len = 0;
}

/* What a call's frames said. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t data;
    bool done;
    ka_frame_end_t end; /* the final frame's outcome */
} sink_t;

static void sink_cb(void *user, const ka_guest_reply_t *f, size_t len)
{
    sink_t *s = user;
    pthread_mutex_lock(&s->mu);
    if (f->final) {
        s->done = true;
        ka_frame_end(&s->end, f, len);
    } else {
        s->data += f->tail_len;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void sink_init(sink_t *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

/* Waits up to secs for the call to end (done) or to have `data` bytes. */
static void sink_wait_s(sink_t *s, bool done, size_t data, int secs)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += secs;
    pthread_mutex_lock(&s->mu);
    while (done ? !s->done : s->data < data)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT)
            break;
    bool ok = done ? s->done : s->data >= data;
    pthread_mutex_unlock(&s->mu);
    assert_true(ok);
}

static void sink_wait(sink_t *s, bool done, size_t data)
{
    sink_wait_s(s, done, data, 5);
}

static krt_addr_t at_call(at_t *a, int op, uint64_t proc, sink_t *s)
{
    sink_init(s);
    ka_guest_req_t *q = ka_guest_req_new("alice", s_rec.id, op, 0);
    q->proc = proc;
    snprintf(q->path, sizeof q->path, "f");
    krt_addr_t stream = KRT_ADDR_NONE;
    assert_int_equal(ka_svc_stream(a->svc, &q, sink_cb, s, &stream), 0);
    return stream;
}

/* Terminal sessions: an input is answered with exactly the bytes it carried (the guest
 * acknowledges stdin once the process took it), a resize like a signal (that process). */
static void test_check_input_and_resize(void **state)
{
    (void)state;
    pt_t p;
    ka_gc_call_t *c;
    g_frame_t f;
    uint64_t id;
    static const struct {
        uint64_t written; /* what the guest claims */
        bool ok;
    } in[] = {{5, true}, {4, false}, {6, false}, {UINT64_MAX, false}};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        pt_up(&p);
        assert_int_equal(ka_guestconn_input(p.gc, 3, "hello", 5, false, &id), 0);
        ka_gc_call_t *call = ka_gc_add(&p.t, id, KA_GC_INPUT, 3, NULL, 0, 0, NULL);
        assert_non_null(call);
        call->sent = 5;
        g_end(p.guest, id, "written", in[i].written);
        assert_int_equal(pt_check(&p, &c), in[i].ok ? KA_GC_DELIVER : KA_GC_FATAL);
        pt_down(&p);
    }
    pt_up(&p); /* an input answered without "written" */
    assert_int_equal(ka_guestconn_input(p.gc, 3, NULL, 0, true, &id), 0);
    ka_gc_add(&p.t, id, KA_GC_INPUT, 3, NULL, 0, 0, NULL);
    g_end(p.guest, id, NULL, 0);
    assert_int_equal(pt_check(&p, &c), KA_GC_FATAL);
    pt_down(&p);
    pt_up(&p); /* an input refused (the process is busy): an error ends it */
    assert_int_equal(ka_guestconn_input(p.gc, 3, "x", 1, false, &id), 0);
    ka_gc_add(&p.t, id, KA_GC_INPUT, 3, NULL, 0, 0, NULL)->sent = 1;
    g_begin(&f, 4);
    g_u64(&f, "id", id);
    ka_gp_pack_cstr(&f.pk, "err");
    msgpack_pack_int64(&f.pk, -EBUSY);
    ka_gp_pack_cstr(&f.pk, "msg");
    ka_gp_pack_cstr(&f.pk, "busy");
    g_true(&f, "end");
    g_send(p.guest, &f);
    assert_int_equal(pt_check(&p, &c), KA_GC_DELIVER);
    pt_down(&p);
    for (int other = 0; other < 2; other++) { /* a resize answered with its process or not */
        pt_up(&p);
        assert_int_equal(ka_guestconn_resize(p.gc, 3, 40, 120, &id), 0);
        ka_gc_add(&p.t, id, KA_GC_PROC, 3, NULL, 0, 0, NULL);
        g_begin(&f, 3);
        g_u64(&f, "id", id);
        g_proc(&f, "process", other ? 4 : 3);
        g_true(&f, "end");
        g_send(p.guest, &f);
        assert_int_equal(pt_check(&p, &c), other ? KA_GC_FATAL : KA_GC_DELIVER);
        pt_down(&p);
    }
    pt_up(&p); /* data on an input: not what it can get */
    assert_int_equal(ka_guestconn_input(p.gc, 3, "x", 1, false, &id), 0);
    ka_gc_add(&p.t, id, KA_GC_INPUT, 3, NULL, 0, 0, NULL)->sent = 1;
    uint64_t o = 0;
    g_data(p.guest, id, "stdout", 1, &o);
    assert_int_equal(pt_check(&p, &c), KA_GC_FATAL);
    pt_down(&p);
}

static void test_actor_drops_forged_then_kills_malformed(void **state)
{
    (void)state;
    at_t a;
    at_up(&a);
    sink_t rd;
    at_call(&a, KA_GUEST_READ, 0, &rd);
    g_req_t r;
    g_recv(s_guest_fd, &r);
    assert_string_equal(r.op, "read");
    assert_int_equal(r.window, KA_GP_WINDOW);
    ka_gc_stats_t before, after;
    ka_gc_stats(&before);
    g_data(s_guest_fd, r.id + 50, "chunk", 100, NULL); /* never issued */
    g_data(s_guest_fd, r.id, "chunk", 100, NULL);
    g_end(s_guest_fd, r.id, "size", 100);
    sink_wait(&rd, true, 0);
    assert_int_equal(ka_err_code(rd.end.err), KA_OK);
    assert_int_equal(rd.data, 100); /* the forged chunk went nowhere */
    ka_gc_stats(&after);
    assert_int_equal(after.forged - before.forged, 1);
    assert_int_equal(atomic_load(&s_kills), 0);
    assert_int_equal(s_rec_state(), KA_STATE_READY);

    sink_t get;
    at_call(&a, KA_GUEST_GET, 3, &get);
    g_recv(s_guest_fd, &r);
    assert_string_equal(r.op, "get");
    static const uint8_t junk[] = {0x81, 0xa2, 'i', 'd', 0xc1};
    g_raw(s_guest_fd, sizeof junk, junk, sizeof junk);
    sink_wait(&get, true, 0);
    assert_int_equal(ka_err_code(get.end.err), KA_UNAVAILABLE);
    assert_non_null(strstr(get.end.message, "broke the protocol"));
    assert_int_equal(atomic_load(&s_kills), 1);
    for (int i = 0; i < 200 && s_rec_state() != KA_STATE_FAILED; i++)
        s_sleep_ms(10);
    assert_int_equal(s_rec_state(), KA_STATE_FAILED);
    assert_string_equal(s_rec.failure_reason, KA_FAIL_GUEST_PROTO);
    ka_gc_stats(&after);
    assert_true(after.violations > before.violations);
    /* the sandbox refuses further guest calls; the node (this runtime) goes on */
    sink_t again;
    at_call(&a, KA_GUEST_GET, 3, &again);
    sink_wait(&again, true, 0);
    assert_int_equal(ka_err_code(again.end.err), KA_FAILED_PRECONDITION);
    at_down(&a);
}

static void test_actor_credit_and_flood(void **state)
{
    (void)state;
    at_t a;
    at_up(&a);
    sink_t rd;
    krt_addr_t stream = at_call(&a, KA_GUEST_READ, 0, &rd);
    g_req_t r;
    g_recv(s_guest_fd, &r);
    uint64_t id = r.id;
    for (unsigned i = 0; i < KA_GP_WINDOW / KA_GP_CHUNK; i++) /* the whole window */
        g_data(s_guest_fd, id, "chunk", KA_GP_CHUNK, NULL);
    sink_wait(&rd, false, KA_GP_WINDOW);
    ka_svc_stream_ack(a.svc, stream, KA_GP_CHUNK); /* the reader took one chunk */
    g_recv(s_guest_fd, &r);
    assert_string_equal(r.op, "credit");
    assert_int_equal(r.target, id);
    assert_int_equal(r.bytes, KA_GP_CHUNK);
    g_data(s_guest_fd, id, "chunk", KA_GP_CHUNK, NULL); /* spends exactly that */
    sink_wait(&rd, false, KA_GP_WINDOW + KA_GP_CHUNK);
    assert_int_equal(atomic_load(&s_kills), 0);
    g_data(s_guest_fd, id, "chunk", 1, NULL); /* one byte past its credit */
    sink_wait(&rd, true, 0);
    assert_int_equal(ka_err_code(rd.end.err), KA_UNAVAILABLE);
    assert_int_equal(atomic_load(&s_kills), 1);
    at_down(&a);
}

static void test_actor_gone_ends_calls(void **state)
{
    (void)state;
    at_t a;
    at_up(&a);
    sink_t rd;
    at_call(&a, KA_GUEST_OUTPUT, 1, &rd);
    g_req_t r;
    g_recv(s_guest_fd, &r); /* the guest never answers; then the sandbox actor goes away */
    assert_int_equal(krt_system_kill(a.sys, a.sbx, KRT_EXIT_KILLED), 0);
    sink_wait(&rd, true, 0);
    assert_int_equal(ka_err_code(rd.end.err), KA_UNAVAILABLE);
    /* a call to an actor that is gone ends at once (and one whose message is dropped on the
     * way, at the sink's KA_SVC_BIND_MS deadline) */
    sink_t late;
    at_call(&a, KA_GUEST_GET, 1, &late);
    sink_wait_s(&late, true, 0, KA_SVC_BIND_MS / 1000 + 5);
    assert_int_equal(ka_err_code(late.end.err), KA_UNAVAILABLE);
    at_down(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_bounds_lengths),
        cmocka_unit_test(test_check_ids_and_calls),
        cmocka_unit_test(test_check_input_and_resize),
        cmocka_unit_test(test_actor_drops_forged_then_kills_malformed),
        cmocka_unit_test(test_actor_credit_and_flood),
        cmocka_unit_test(test_actor_gone_ends_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
