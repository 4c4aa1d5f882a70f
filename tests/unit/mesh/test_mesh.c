/*
 * Unit tests for runtime/mesh_zmq.c: two real krt systems (node 1 and node 2) in this
 * process, joined by the mesh over inproc:// and ipc:// (and tcp:// with CURVE). Actors on
 * node 1 talk to actors on node 2 with krt_request/krt_reply (replies, error replies, timeouts
 * and missing targets behave as they do locally), ping-pong 10,000 messages and
 * stream 10,000 more (complete and in order), sends to an unknown node fail with KRT_EREMOTE,
 * a silent node is reported as DOWN/KRT_EXIT_NOCONN, and shutdown leaves no thread behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <czmq.h>
#include <dirent.h>
#include <ftw.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "krt.h"
#include "krt_mesh_frame.h"

enum {
    T_PING = KRT_MSG_USER + 1, /* body: uint64_t seq (or any bytes for echo) */
    T_PONG,
    T_STREAM, /* body: uint64_t seq */
    T_STREAM_DONE,
    T_GO,
    T_FAIL,    /* request: answered with an error reply -EPERM "nope" */
    T_HOLD,    /* request: kept until T_RELEASE */
    T_RELEASE, /* answers the held request */
};

#define PINGPONG_N 10000
#define STREAM_N   10000
#define WAIT_MS    30000

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

/* A mesh frame (incarnation 1, destination unknown) holding one envelope, as a raw client
 * sends it. */
static int s_frame_encode(uint8_t *buf, size_t cap, krt_addr_t to, const krt_msg_t *m, size_t *len)
{
    size_t elen;
    size_t hdr = KRT_MFRAME_HEADER + KRT_MFRAME_LEN;
    int rc = krt_envelope_encode_buf(buf + hdr, cap - hdr, to, m, &elen);
    if (rc)
        return rc;
    krt_mframe_header(buf, 1, 0);
    krt_mframe_len(buf + KRT_MFRAME_HEADER, (uint32_t)elen);
    *len = hdr + elen;
    return 0;
}

static int s_threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Temporary directories, registered so that the group teardown removes them even when a
 * failed assertion left a test half way. */
static char s_tmpdirs[64][64];
static int s_n_tmpdirs;

static void s_mkdtemp(char *dir, size_t cap)
{
    assert_true(s_n_tmpdirs < 64);
    snprintf(dir, cap, "/tmp/krt-mesh-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(s_tmpdirs[s_n_tmpdirs++], sizeof s_tmpdirs[0], "%s", dir);
}

static int s_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static int s_teardown(void **unused)
{
    for (int i = 0; i < s_n_tmpdirs; i++)
        nftw(s_tmpdirs[i], s_rm_entry, 8, FTW_DEPTH | FTW_PHYS); /* gone already if passed */
    return 0;
}

static krt_addr_t s_node_addr(uint16_t node, uint64_t local)
{
    return ((krt_addr_t)node << 48) | local;
}

/* Two nodes joined by the mesh. */
typedef struct pair {
    krt_system_t *sys[2];
    krt_mesh_t *mesh[2];
    char dir[64]; /* ipc socket directory, "" if none */
} pair_t;

static uint64_t s_pair_seq;

/* kind: "inproc", "ipc" or "tcp-curve". */
static void s_pair_up(pair_t *p, const char *kind, int heartbeat_ms)
{
    memset(p, 0, sizeof *p);
    char ep[2][128];
    zcert_t *cert[2] = {NULL, NULL};
    uint64_t seq = ++s_pair_seq;
    if (strcmp(kind, "ipc") == 0) {
        s_mkdtemp(p->dir, sizeof p->dir);
    }
    for (int i = 0; i < 2; i++) {
        krt_config_t cfg = {.node_id = (uint16_t)(i + 1), .schedulers = 1, .job_threads = 1};
        p->sys[i] = krt_system_new(&cfg);
        assert_non_null(p->sys[i]);
        assert_int_equal(krt_system_start(p->sys[i]), 0);
        krt_mesh_config_t mc = {.heartbeat_ms = heartbeat_ms};
        if (strcmp(kind, "inproc") == 0) {
            snprintf(ep[i], sizeof ep[i], "inproc://test-mesh-%llu-%d", (unsigned long long)seq,
                     i + 1);
        } else if (strcmp(kind, "ipc") == 0) {
            snprintf(ep[i], sizeof ep[i], "ipc://%s/node-%d", p->dir, i + 1);
        } else {
            snprintf(ep[i], sizeof ep[i], "tcp://127.0.0.1:*");
            cert[i] = zcert_new();
            assert_non_null(cert[i]);
            mc.curve_public = zcert_public_txt(cert[i]);
            mc.curve_secret = zcert_secret_txt(cert[i]);
        }
        mc.bind = ep[i];
        p->mesh[i] = krt_mesh_new(p->sys[i], &mc);
        assert_non_null(p->mesh[i]);
        assert_int_equal(krt_mesh_start(p->mesh[i]), 0);
        assert_non_null(krt_mesh_endpoint(p->mesh[i]));
    }
    for (int i = 0; i < 2; i++) {
        int o = 1 - i;
        const char *key = cert[o] ? zcert_public_txt(cert[o]) : NULL;
        assert_int_equal(
            krt_mesh_connect(p->mesh[i], (uint16_t)(o + 1), krt_mesh_endpoint(p->mesh[o]), key), 0);
        assert_true(krt_mesh_has_peer(p->mesh[i], (uint16_t)(o + 1)));
        assert_int_equal(
            krt_mesh_connect(p->mesh[i], (uint16_t)(o + 1), krt_mesh_endpoint(p->mesh[o]), key),
            KRT_EEXIST);
    }
    for (int i = 0; i < 2; i++)
        zcert_destroy(&cert[i]);
}

/* Tears down in the documented order: meshes, then systems; removes the ipc directory. */
static void s_pair_down(pair_t *p)
{
    for (int i = 0; i < 2; i++)
        krt_mesh_stop(p->mesh[i]);
    for (int i = 0; i < 2; i++) {
        krt_system_destroy(&p->sys[i]);
        assert_null(p->sys[i]);
        krt_mesh_destroy(&p->mesh[i]);
        assert_null(p->mesh[i]);
    }
    if (p->dir[0]) {
        for (int i = 1; i <= 2; i++) {
            char path[128];
            snprintf(path, sizeof path, "%s/node-%d", p->dir, i);
            assert_int_equal(access(path, F_OK), -1); /* the mesh removed its socket file */
        }
        assert_int_equal(rmdir(p->dir), 0);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Actors                                                                                     */

/* Node 2: answers T_PING requests with T_PONG carrying the same body; answers plain T_PING
 * messages (ping-pong) by sending T_PONG back to the sender, checking the sequence; counts a
 * T_STREAM burst, checking order, and reports with T_STREAM_DONE. */
typedef struct echo_state {
    uint64_t next_ping;
    uint64_t next_stream;
    uint64_t out_of_order;
    krt_addr_t held_from;
    uint64_t held_ref;
} echo_state_t;

static void echo_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    echo_state_t *st = state;
    uint64_t seq = 0;
    if (msg->len == sizeof seq)
        memcpy(&seq, msg->body, sizeof seq);
    switch (msg->type) {
    case T_FAIL:
        krt_reply_error(ctx, msg, -EPERM, "nope");
        return;
    case T_HOLD:
        st->held_from = msg->from;
        st->held_ref = msg->ref;
        return;
    case T_RELEASE:
        krt_reply_to(ctx, st->held_from, st->held_ref, T_PONG, NULL, 0);
        return;
    case T_PING:
        if (msg->kind == KRT_KIND_REQUEST) {
            krt_reply(ctx, msg, T_PONG, msg->body, msg->len);
            return;
        }
        if (seq != st->next_ping)
            st->out_of_order++;
        st->next_ping = seq + 1;
        krt_send(ctx, msg->from, T_PONG, &seq, sizeof seq);
        return;
    case T_STREAM:
        if (seq != st->next_stream)
            st->out_of_order++;
        st->next_stream = seq + 1;
        if (st->next_stream == STREAM_N) {
            uint64_t report[2] = {st->next_stream, st->out_of_order};
            krt_send(ctx, msg->from, T_STREAM_DONE, report, sizeof report);
        }
        return;
    default:
        return;
    }
}

static const krt_behaviour_t s_echo = {
    .kind = "echo", .state_size = sizeof(echo_state_t), .handle = echo_handle};

/* What a client actor on node 1 reports to the test thread. */
typedef struct report {
    krt_addr_t target;  /* in: the echo actor on node 2 */
    size_t body_len;    /* in: request body size (request test) */
    uint32_t type;      /* in: request type (T_PING if 0) */
    int timeout_ms;     /* in: request timeout (10 s if 0) */
    bool stay;          /* in: keep running after the reply (until T_GO) */
    _Atomic int calls;  /* out: callbacks that ran */
    _Atomic int result; /* out: 0 ok, else a negative error or 1 for a wrong answer */
    _Atomic uint64_t count;
    _Atomic uint64_t out_of_order;
    _Atomic uint64_t remote_out_of_order;
    krt_down_t down;   /* out: the DOWN received (monitor test) */
    _Atomic bool done; /* out: the client actor terminated */
} report_t;

typedef struct client_state {
    report_t *r;
    uint64_t next;
    uint8_t *body;
} client_state_t;

/* The reply (or failure) of the request: result 0 for the echoed body, the error for an
 * expected failure (error reply -EPERM "nope" with its status, timeout with no reply,
 * missing target with the runtime's error reply), 1 for anything else. */
static void req_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    client_state_t *st = state;
    int result = 1;
    if (user != st || krt_addr_node(krt_self(ctx)) != 1)
        result = 1;
    else if (err == 0)
        result = reply && reply->type == T_PONG && reply->status == 0 &&
                         reply->from == st->r->target && reply->len == st->r->body_len &&
                         (reply->len == 0 || memcmp(reply->body, st->body, reply->len) == 0)
                     ? 0
                     : 1;
    else if (err == -EPERM)
        result = reply && reply->type == KRT_MSG_ERROR && reply->status == -EPERM &&
                         strcmp(reply->body, "nope") == 0
                     ? err
                     : 1;
    else if (err == KRT_ETIMEDOUT)
        result = reply ? 1 : err;
    else if (err == KRT_ENOACTOR)
        result = reply && reply->status == err ? err : 1;
    atomic_store(&st->r->result, result);
    atomic_fetch_add(&st->r->calls, 1);
    if (!st->r->stay)
        krt_exit(ctx, KRT_EXIT_NORMAL);
}

/* Request/reply: one krt_request to the echo actor, checks the reply, exits. */
static int req_init(krt_ctx_t *ctx, void *state, void *arg)
{
    client_state_t *st = state;
    st->r = arg;
    size_t n = st->r->body_len;
    st->body = malloc(n);
    if (!st->body)
        return KRT_EXIT_ERROR;
    for (size_t i = 0; i < n; i++)
        st->body[i] = (uint8_t)(i * 7 + 3);
    report_t *r = st->r;
    int rc = krt_request(ctx, r->target, r->type ? r->type : T_PING, st->body, n,
                         r->timeout_ms ? r->timeout_ms : 10000, req_done, st);
    if (rc) {
        atomic_store(&st->r->result, rc);
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
    return 0;
}

static void req_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_GO)
        krt_exit(ctx, KRT_EXIT_NORMAL);
    else if (msg->kind == KRT_KIND_REPLY)
        atomic_store(&((client_state_t *)state)->r->result, 2); /* never as a message */
}

/* Every client actor's terminate: tells the test thread it is finished. */
static void client_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    client_state_t *st = state;
    if (st->r)
        atomic_store(&st->r->done, true);
}

static void req_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    client_state_t *st = state;
    free(st->body);
    client_terminate(ctx, state, reason);
}

static const krt_behaviour_t s_requester = {.kind = "requester",
                                            .state_size = sizeof(client_state_t),
                                            .init = req_init,
                                            .handle = req_handle,
                                            .terminate = req_terminate};

/* Ping-pong: PINGPONG_N round trips, one in flight, then a STREAM_N burst. */
static void pp_send_ping(krt_ctx_t *ctx, client_state_t *st)
{
    int rc = krt_send(ctx, st->r->target, T_PING, &st->next, sizeof st->next);
    if (rc) {
        atomic_store(&st->r->result, rc);
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
}

static int pp_init(krt_ctx_t *ctx, void *state, void *arg)
{
    client_state_t *st = state;
    st->r = arg;
    atomic_store(&st->r->result, 1); /* not finished */
    pp_send_ping(ctx, st);
    return 0;
}

static void pp_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    client_state_t *st = state;
    uint64_t seq = 0;
    if (msg->type == T_PONG && msg->len == sizeof seq) {
        memcpy(&seq, msg->body, sizeof seq);
        if (seq != st->next)
            atomic_fetch_add(&st->r->out_of_order, 1);
        atomic_fetch_add(&st->r->count, 1);
        st->next = seq + 1;
        if (st->next < PINGPONG_N) {
            pp_send_ping(ctx, st);
            return;
        }
        /* Round trips done: now a burst, many messages in flight at once. */
        for (uint64_t i = 0; i < STREAM_N; i++) {
            int rc = krt_send(ctx, st->r->target, T_STREAM, &i, sizeof i);
            if (rc) {
                atomic_store(&st->r->result, rc);
                krt_exit(ctx, KRT_EXIT_NORMAL);
                return;
            }
        }
    } else if (msg->type == T_STREAM_DONE && msg->len == 2 * sizeof(uint64_t)) {
        uint64_t report[2];
        memcpy(report, msg->body, sizeof report);
        atomic_store(&st->r->remote_out_of_order, report[1]);
        atomic_store(&st->r->result, report[0] == STREAM_N ? 0 : 1);
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
}

static const krt_behaviour_t s_pingponger = {.kind = "pingpong",
                                             .state_size = sizeof(client_state_t),
                                             .init = pp_init,
                                             .handle = pp_handle,
                                             .terminate = client_terminate};

/* Sends to a node no transport reaches; reports what krt_send returned. */
static int unknown_init(krt_ctx_t *ctx, void *state, void *arg)
{
    client_state_t *st = state;
    report_t *r = st->r = arg;
    atomic_store(&r->result, krt_send(ctx, s_node_addr(3, 1), T_PING, "x", 1));
    krt_exit(ctx, KRT_EXIT_NORMAL);
    return 0;
}

static void noop_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
}

static const krt_behaviour_t s_unknown = {.kind = "unknown",
                                          .state_size = sizeof(client_state_t),
                                          .init = unknown_init,
                                          .handle = noop_handle,
                                          .terminate = client_terminate};

/* Node monitor: waits for the DOWN of node 2 (the monitor is added by the test thread). */
static int watch_init(krt_ctx_t *ctx, void *state, void *arg)
{
    client_state_t *st = state;
    st->r = arg;
    return 0;
}

static void watch_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    client_state_t *st = state;
    if (msg->type == KRT_MSG_DOWN && msg->len == sizeof(krt_down_t)) {
        memcpy(&st->r->down, msg->body, sizeof(krt_down_t));
        atomic_store(&st->r->result, 0);
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
}

static const krt_behaviour_t s_watcher = {.kind = "watcher",
                                          .state_size = sizeof(client_state_t),
                                          .init = watch_init,
                                          .handle = watch_handle,
                                          .terminate = client_terminate};

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                      */

/* Waits for a client actor to finish. krt_system_wait reports an actor that is stopping or
 * stopped when the wait begins as KRT_ENOACTOR (its slot dies before terminate runs), so
 * completion is confirmed through the report, which terminate sets. */
static void s_wait(krt_system_t *sys, krt_addr_t a, report_t *r)
{
    int rc = krt_system_wait(sys, a, WAIT_MS);
    assert_true(rc == KRT_EXIT_NORMAL || rc == KRT_ENOACTOR);
    for (int i = 0; i < WAIT_MS && !atomic_load(&r->done); i++)
        usleep(1000);
    assert_true(atomic_load(&r->done));
}

static krt_addr_t s_spawn(krt_system_t *sys, const krt_behaviour_t *b, void *arg)
{
    krt_addr_t a = KRT_ADDR_NONE;
    assert_int_equal(krt_system_spawn(sys, b, arg, NULL, &a), 0);
    assert_true(a != KRT_ADDR_NONE);
    return a;
}

static void s_request_reply(const char *kind, size_t body_len)
{
    int threads = s_threads();
    pair_t p;
    s_pair_up(&p, kind, 0);
    report_t r = {.body_len = body_len, .result = 99};
    r.target = s_spawn(p.sys[1], &s_echo, NULL);
    assert_int_equal(krt_addr_node(r.target), 2);
    krt_addr_t c = s_spawn(p.sys[0], &s_requester, &r);
    assert_int_equal(krt_addr_node(c), 1);
    s_wait(p.sys[0], c, &r);
    assert_int_equal(atomic_load(&r.result), 0);

    krt_mesh_stats_t st;
    krt_mesh_stats(p.mesh[1], &st);
    assert_true(st.received >= 1);
    assert_true(st.sent >= 1);
    assert_int_equal(st.malformed, 0);
    s_pair_down(&p);
    assert_int_equal(s_threads(), threads);
}

static void test_request_reply_inproc(void **unused)
{
    s_request_reply("inproc", 5);
}

static void test_request_reply_ipc(void **unused)
{
    s_request_reply("ipc", 5);
}

static void test_request_reply_large_body(void **unused)
{
    s_request_reply("ipc", 1 << 20); /* above the zero-copy threshold */
}

static void test_request_reply_tcp_curve(void **unused)
{
    s_request_reply("tcp-curve", 100);
}

/* One request from node 1 to `target` on node 2; returns the result (see req_done). */
static int s_remote_request(pair_t *p, krt_addr_t target, uint32_t type, int timeout_ms)
{
    report_t r = {.target = target, .type = type, .timeout_ms = timeout_ms, .result = 99};
    krt_addr_t c = s_spawn(p->sys[0], &s_requester, &r);
    s_wait(p->sys[0], c, &r);
    assert_int_equal(atomic_load(&r.calls), 1);
    return atomic_load(&r.result);
}

/* Error replies, timeouts and missing targets across the mesh, as they are locally. */
static void test_request_errors_remote(void **unused)
{
    pair_t p;
    s_pair_up(&p, "inproc", 0);
    krt_addr_t echo = s_spawn(p.sys[1], &s_echo, NULL);
    assert_int_equal(s_remote_request(&p, echo, T_FAIL, 0), -EPERM);
    assert_int_equal(s_remote_request(&p, echo, T_HOLD, 50), KRT_ETIMEDOUT);
    assert_int_equal(s_remote_request(&p, s_node_addr(2, 999999), T_PING, 0), KRT_ENOACTOR);
    /* a remote target that has stopped: its node answers KRT_ENOACTOR */
    krt_addr_t gone = s_spawn(p.sys[1], &s_echo, NULL);
    assert_int_equal(krt_system_kill(p.sys[1], gone, KRT_EXIT_KILLED), 0);
    assert_true(krt_system_wait(p.sys[1], gone, WAIT_MS) >= KRT_ENOACTOR);
    assert_int_equal(s_remote_request(&p, gone, T_PING, 0), KRT_ENOACTOR);

    /* a reply after the timeout is dropped: the callback ran once, with the timeout */
    report_t r = {.target = echo, .type = T_HOLD, .timeout_ms = 30, .stay = true, .result = 99};
    krt_addr_t c = s_spawn(p.sys[0], &s_requester, &r);
    for (int i = 0; i < WAIT_MS && atomic_load(&r.calls) == 0; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&r.result), KRT_ETIMEDOUT);
    krt_mesh_stats_t before, after;
    krt_mesh_stats(p.mesh[0], &before);
    assert_int_equal(krt_system_send(p.sys[1], echo, T_RELEASE, NULL, 0), 0);
    for (int i = 0; i < WAIT_MS; i++) {
        krt_mesh_stats(p.mesh[0], &after);
        if (after.received > before.received)
            break;
        usleep(1000);
    }
    assert_true(after.received > before.received); /* the late reply reached node 1 */
    assert_int_equal(krt_system_send(p.sys[0], c, T_GO, NULL, 0), 0);
    s_wait(p.sys[0], c, &r);
    assert_int_equal(atomic_load(&r.calls), 1);
    assert_int_equal(atomic_load(&r.result), KRT_ETIMEDOUT);
    s_pair_down(&p);
}

static void s_pingpong(const char *kind)
{
    int threads = s_threads();
    pair_t p;
    s_pair_up(&p, kind, 0);
    report_t r = {0};
    r.target = s_spawn(p.sys[1], &s_echo, NULL);
    krt_addr_t c = s_spawn(p.sys[0], &s_pingponger, &r);
    s_wait(p.sys[0], c, &r);
    assert_int_equal(atomic_load(&r.result), 0);
    assert_int_equal(atomic_load(&r.count), PINGPONG_N);
    assert_int_equal(atomic_load(&r.out_of_order), 0);
    assert_int_equal(atomic_load(&r.remote_out_of_order), 0);
    krt_mesh_stats_t st;
    krt_mesh_stats(p.mesh[0], &st);
    assert_int_equal(st.dropped, 0);
    assert_int_equal(st.received, PINGPONG_N + 1); /* pongs + stream report */
    krt_mesh_stats(p.mesh[1], &st);
    assert_int_equal(st.received, PINGPONG_N + STREAM_N);
    s_pair_down(&p);
    assert_int_equal(s_threads(), threads);
}

static void test_pingpong_inproc(void **unused)
{
    s_pingpong("inproc");
}

static void test_pingpong_ipc(void **unused)
{
    s_pingpong("ipc");
}

static void test_unknown_node(void **unused)
{
    int threads = s_threads();
    pair_t p;
    s_pair_up(&p, "inproc", 0);
    report_t r = {.result = 99};
    krt_addr_t c = s_spawn(p.sys[0], &s_unknown, &r);
    s_wait(p.sys[0], c, &r);
    assert_int_equal(atomic_load(&r.result), KRT_EREMOTE);
    /* From outside any actor as well. */
    assert_int_equal(krt_system_send(p.sys[0], s_node_addr(3, 1), T_PING, "x", 1), KRT_EREMOTE);
    assert_false(krt_mesh_has_peer(p.mesh[0], 3));
    /* Bad peers are refused. */
    assert_int_equal(krt_mesh_connect(p.mesh[0], 1, "inproc://self", NULL), KRT_EINVAL);
    assert_int_equal(krt_mesh_connect(p.mesh[0], 0, "inproc://zero", NULL), KRT_EINVAL);
    assert_true(krt_mesh_connect(p.mesh[0], 4, "nonsense://x", NULL) < 0);
    assert_false(krt_mesh_has_peer(p.mesh[0], 4));

    /* After the mesh stops, remote sends fail and connects are refused. */
    krt_mesh_stop(p.mesh[0]);
    assert_int_equal(krt_system_send(p.sys[0], s_node_addr(2, 1), T_PING, "x", 1), KRT_EREMOTE);
    assert_int_equal(krt_mesh_connect(p.mesh[0], 5, "inproc://five", NULL), KRT_ESHUTDOWN);
    s_pair_down(&p);
    assert_int_equal(s_threads(), threads);
}

/* A raw CURVE client (not a mesh) with its own keys and routing id, in its own context. */
static void *s_curve_client(void *ctx, zcert_t *cert, const char *server_key, uint16_t node,
                            const char *endpoint)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(s);
    const uint8_t id[3] = {'K', (uint8_t)(node >> 8), (uint8_t)node};
    int zero = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_ROUTING_ID, id, sizeof id), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key, 40), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, zcert_public_txt(cert), 40), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, zcert_secret_txt(cert), 40), 0);
    assert_int_equal(zmq_connect(s, endpoint), 0);
    return s;
}

/* CURVE authenticates peers: a node accepts a connection only with the key it was given for
 * that node (krt_mesh_connect), and only for the routing id of that node. */
/* Nodes learn each other's keys at different moments: a handshake from a node whose key is
 * not known yet waits for it (it used to be refused, and ZeroMQ then may never retry: the
 * request was lost). */
static void test_curve_late_key(void **unused)
{
    zcert_t *cert[2] = {zcert_new(), zcert_new()};
    krt_system_t *sys[2];
    krt_mesh_t *mesh[2];
    for (int i = 0; i < 2; i++) {
        krt_config_t cfg = {.node_id = (uint16_t)(i + 1), .schedulers = 1, .job_threads = 1};
        sys[i] = krt_system_new(&cfg);
        assert_non_null(sys[i]);
        assert_int_equal(krt_system_start(sys[i]), 0);
        krt_mesh_config_t mc = {.bind = "tcp://127.0.0.1:*",
                                .curve_public = zcert_public_txt(cert[i]),
                                .curve_secret = zcert_secret_txt(cert[i])};
        mesh[i] = krt_mesh_new(sys[i], &mc);
        assert_non_null(mesh[i]);
        assert_int_equal(krt_mesh_start(mesh[i]), 0);
    }
    krt_addr_t echo = s_spawn(sys[1], &s_echo, NULL);
    report_t r = {.body_len = 3, .result = 99, .target = echo};
    assert_int_equal(
        krt_mesh_connect(mesh[0], 2, krt_mesh_endpoint(mesh[1]), zcert_public_txt(cert[1])), 0);
    krt_addr_t c = s_spawn(sys[0], &s_requester, &r);
    usleep(300000); /* node 1's handshake reached node 2, which does not know its key yet */
    assert_int_equal(
        krt_mesh_connect(mesh[1], 1, krt_mesh_endpoint(mesh[0]), zcert_public_txt(cert[0])), 0);
    s_wait(sys[0], c, &r);
    assert_int_equal(atomic_load(&r.result), 0);
    for (int i = 0; i < 2; i++)
        krt_mesh_stop(mesh[i]);
    for (int i = 0; i < 2; i++) {
        krt_system_destroy(&sys[i]);
        krt_mesh_destroy(&mesh[i]);
        zcert_destroy(&cert[i]);
    }
}

static void test_curve_authentication(void **unused)
{
    int threads = s_threads();
    zcert_t *c1 = zcert_new(), *c2 = zcert_new(), *c3 = zcert_new(), *wrong = zcert_new();
    char dir[32];
    s_mkdtemp(dir, sizeof dir);
    char certfile[64], ep[2][64];
    snprintf(certfile, sizeof certfile, "%s/node1.cert", dir);
    assert_int_equal(zcert_save(c1, certfile), 0);
    krt_system_t *sys[2];
    krt_mesh_t *mesh[2];
    for (int i = 0; i < 2; i++) {
        krt_config_t cfg = {.node_id = (uint16_t)(i + 1), .schedulers = 1, .job_threads = 1};
        sys[i] = krt_system_new(&cfg);
        assert_non_null(sys[i]);
        assert_int_equal(krt_system_start(sys[i]), 0);
        snprintf(ep[i], sizeof ep[i], "ipc://%s/n%d", dir, i + 1);
        krt_mesh_config_t mc = {.bind = ep[i]};
        if (i == 0) {
            mc.curve_cert = certfile; /* keys from a zcert file */
        } else {
            mc.curve_public = zcert_public_txt(c2);
            mc.curve_secret = zcert_secret_txt(c2);
        }
        mesh[i] = krt_mesh_new(sys[i], &mc);
        assert_non_null(mesh[i]);
        assert_int_equal(krt_mesh_start(mesh[i]), 0);
    }
    assert_int_equal(krt_mesh_connect(mesh[0], 2, ep[1], NULL), KRT_EINVAL); /* key needed */
    assert_int_equal(krt_mesh_connect(mesh[0], 2, ep[1], "not a z85 key, but forty chars long!!!"),
                     KRT_EINVAL);
    assert_int_equal(krt_mesh_connect(mesh[0], 2, ep[1], zcert_public_txt(c2)), 0);
    /* Node 2 is told a wrong key for node 1, and node 3's real key. */
    assert_int_equal(krt_mesh_connect(mesh[1], 1, ep[0], zcert_public_txt(wrong)), 0);
    char ep3[96];
    snprintf(ep3, sizeof ep3, "ipc://%s/n3", dir); /* nobody listens there */
    assert_int_equal(krt_mesh_connect(mesh[1], 3, ep3, zcert_public_txt(c3)), 0);

    krt_addr_t echo = s_spawn(sys[1], &s_echo, NULL);
    report_t r = {.body_len = 3, .result = 99, .target = echo};
    s_spawn(sys[0], &s_requester, &r); /* refused: node 2 does not accept node 1's real key */

    void *ctx = zmq_ctx_new();
    const char *k2 = zcert_public_txt(c2);
    void *spoof = s_curve_client(ctx, c3, k2, 1, ep[1]); /* node 3's key, node 1's id */
    void *three = s_curve_client(ctx, c3, k2, 3, ep[1]); /* node 3, honest */
    uint8_t buf[96];
    size_t len = 0;
    krt_msg_t m = {.type = T_STREAM, .len = 1, .from = s_node_addr(3, 1), .body = "x"};
    assert_int_equal(s_frame_encode(buf, sizeof buf, s_node_addr(2, 999999), &m, &len), 0);
    assert_int_equal(zmq_send(spoof, buf, len, 0), (int)len);
    assert_int_equal(zmq_send(three, buf, len, 0), (int)len);

    krt_mesh_stats_t st = {0};
    for (int i = 0; i < 1000 && (st.malformed < 1 || st.undeliverable < 1); i++) {
        usleep(5000);
        krt_mesh_stats(mesh[1], &st);
    }
    usleep(300000); /* room for the refused request to arrive, if it could */
    krt_mesh_stats(mesh[1], &st);
    assert_int_equal(st.undeliverable, 1); /* node 3's message was accepted */
    assert_int_equal(st.malformed, 1);     /* the spoofed routing id was not */
    assert_int_equal(st.received, 0);      /* node 1's request never got in */
    assert_int_equal(atomic_load(&r.result), 99);
    zmq_close(spoof);
    zmq_close(three);
    assert_int_equal(zmq_ctx_term(ctx), 0);
    for (int i = 0; i < 2; i++)
        krt_mesh_stop(mesh[i]);
    for (int i = 0; i < 2; i++) {
        krt_system_destroy(&sys[i]);
        krt_mesh_destroy(&mesh[i]);
    }

    /* A zcert file without its secret half is refused. */
    krt_config_t cfg = {.node_id = 1, .schedulers = 1, .job_threads = 1};
    krt_system_t *sys1 = krt_system_new(&cfg);
    char pubonly[80];
    snprintf(pubonly, sizeof pubonly, "%s/pub.cert", dir);
    assert_int_equal(zcert_save_public(c1, pubonly), 0);
    krt_mesh_config_t mc = {.bind = "inproc://pubonly", .curve_cert = pubonly};
    assert_null(krt_mesh_new(sys1, &mc));
    krt_system_destroy(&sys1);
    unlink(pubonly);
    char secret[96];
    snprintf(secret, sizeof secret, "%s_secret", certfile);
    unlink(secret);
    unlink(certfile);
    assert_int_equal(rmdir(dir), 0);
    zcert_destroy(&c1);
    zcert_destroy(&c2);
    zcert_destroy(&c3);
    zcert_destroy(&wrong);
    assert_int_equal(s_threads(), threads);
}

static void test_node_down(void **unused)
{
    int threads = s_threads();
    pair_t p;
    s_pair_up(&p, "inproc", 20);
    /* Wait until each node has heard the other's heartbeats. */
    for (int i = 0; i < 500 && !(krt_mesh_node_up(p.mesh[0], 2) && krt_mesh_node_up(p.mesh[1], 1));
         i++)
        usleep(10000);
    assert_true(krt_mesh_node_up(p.mesh[0], 2));
    assert_true(krt_mesh_node_up(p.mesh[1], 1));

    report_t r = {.result = 99};
    krt_addr_t w = s_spawn(p.sys[0], &s_watcher, &r);
    uint64_t ref = 0, ref2 = 0;
    assert_int_equal(krt_mesh_monitor_node(p.mesh[0], 2, w, &ref), 0);
    assert_true(ref != 0);
    /* A second monitor, removed before it fires, must not deliver. */
    assert_int_equal(krt_mesh_monitor_node(p.mesh[0], 2, w, &ref2), 0);
    assert_int_equal(krt_mesh_demonitor_node(p.mesh[0], ref2), 0);

    /* A node connected to but never heard from is down too. */
    report_t r9 = {.result = 99};
    krt_addr_t w9 = s_spawn(p.sys[0], &s_watcher, &r9);
    assert_int_equal(krt_mesh_connect(p.mesh[0], 9, "inproc://nobody-listens-here", NULL), 0);
    uint64_t ref9 = 0;
    assert_int_equal(krt_mesh_monitor_node(p.mesh[0], 9, w9, &ref9), 0);
    s_wait(p.sys[0], w9, &r9);
    assert_true(r9.down.who == s_node_addr(9, 0));
    assert_true(r9.down.ref == ref9);
    assert_int_equal(r9.down.reason, KRT_EXIT_NOCONN);
    assert_true(krt_mesh_node_up(p.mesh[0], 2)); /* node 2 unaffected */

    krt_mesh_stop(p.mesh[1]); /* node 2 goes silent */
    s_wait(p.sys[0], w, &r);
    assert_int_equal(atomic_load(&r.result), 0);
    assert_true(r.down.who == s_node_addr(2, 0));
    assert_true(r.down.ref == ref);
    assert_int_equal(r.down.reason, KRT_EXIT_NOCONN);
    assert_false(krt_mesh_node_up(p.mesh[0], 2));
    krt_mesh_stats_t st;
    krt_mesh_stats(p.mesh[0], &st);
    assert_true(st.heartbeats > 0);
    s_pair_down(&p);
    assert_int_equal(s_threads(), threads);
}

/* A node that stops and comes back at the same endpoint is reconnected to and is up again;
 * messages flow again. */
static void test_node_restart(void **unused)
{
    int threads = s_threads();
    pair_t p;
    s_pair_up(&p, "ipc", 20);
    for (int i = 0; i < 500 && !krt_mesh_node_up(p.mesh[0], 2); i++)
        usleep(10000);
    assert_true(krt_mesh_node_up(p.mesh[0], 2));
    char ep2[128], ep1[128];
    snprintf(ep2, sizeof ep2, "%s", krt_mesh_endpoint(p.mesh[1]));
    snprintf(ep1, sizeof ep1, "%s", krt_mesh_endpoint(p.mesh[0]));

    krt_mesh_destroy(&p.mesh[1]); /* node 2's mesh goes away; its system keeps running */
    for (int i = 0; i < 500 && krt_mesh_node_up(p.mesh[0], 2); i++)
        usleep(10000);
    assert_false(krt_mesh_node_up(p.mesh[0], 2));

    krt_mesh_config_t mc = {.bind = ep2, .heartbeat_ms = 20};
    p.mesh[1] = krt_mesh_new(p.sys[1], &mc);
    assert_non_null(p.mesh[1]);
    assert_int_equal(krt_mesh_start(p.mesh[1]), 0);
    assert_int_equal(krt_mesh_connect(p.mesh[1], 1, ep1, NULL), 0);
    for (int i = 0; i < 500 && !krt_mesh_node_up(p.mesh[0], 2); i++)
        usleep(10000);
    assert_true(krt_mesh_node_up(p.mesh[0], 2));

    report_t r = {.body_len = 8, .result = 99};
    r.target = s_spawn(p.sys[1], &s_echo, NULL);
    krt_addr_t c = s_spawn(p.sys[0], &s_requester, &r);
    s_wait(p.sys[0], c, &r);
    assert_int_equal(atomic_load(&r.result), 0);
    s_pair_down(&p);
    assert_int_equal(s_threads(), threads);
}

/* Hostile traffic on a node's ROUTER (raw ZeroMQ clients, not meshes): garbage, misaddressed
 * and multipart frames are counted and dropped, a client without a mesh routing id is
 * ignored, an impostor claiming a connected node's id is refused, and the mesh keeps
 * working. */
/* One request from a fresh requester on node 1 to echo on node 2, answered correctly. */
static void s_request(pair_t *p, krt_addr_t echo)
{
    report_t r = {.body_len = 4, .result = 99, .target = echo};
    krt_addr_t c = s_spawn(p->sys[0], &s_requester, &r);
    s_wait(p->sys[0], c, &r);
    assert_int_equal(atomic_load(&r.result), 0);
}

static void *s_raw_dealer(void *ctx, const char *endpoint, const uint8_t *id)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(s);
    int zero = 0;
    if (id)
        assert_int_equal(zmq_setsockopt(s, ZMQ_ROUTING_ID, id, 3), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_connect(s, endpoint), 0);
    return s;
}

static void test_hostile_frames(void **unused)
{
    int threads = s_threads();
    pair_t p;
    s_pair_up(&p, "ipc", 0);
    krt_addr_t echo = s_spawn(p.sys[1], &s_echo, NULL);
    s_request(&p, echo); /* node 1 is connected to node 2 from here on */
    void *ctx = zmq_ctx_new();
    assert_non_null(ctx);
    const uint8_t id7[3] = {'K', 0, 7}, id1[3] = {'K', 0, 1};
    void *raw = s_raw_dealer(ctx, krt_mesh_endpoint(p.mesh[1]), id7);
    void *anon = s_raw_dealer(ctx, krt_mesh_endpoint(p.mesh[1]), NULL);
    void *impostor = s_raw_dealer(ctx, krt_mesh_endpoint(p.mesh[1]), id1);

    uint8_t buf[96];
    size_t len = 0;
    krt_msg_t m = {.type = T_PING, .len = 1, .from = s_node_addr(7, 1), .body = "x"};
    /* 1: garbage */
    assert_int_equal(zmq_send(raw, "\xc1\x00garbage", 9, 0), 9);
    /* 2: an envelope for another node */
    assert_int_equal(s_frame_encode(buf, sizeof buf, s_node_addr(5, 1), &m, &len), 0);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    /* 3: a two-part message */
    assert_int_equal(zmq_send(raw, buf, len, ZMQ_SNDMORE), (int)len);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    /* 4: well-formed, for an actor that does not exist on node 2: undeliverable */
    assert_int_equal(s_frame_encode(buf, sizeof buf, s_node_addr(2, 999999), &m, &len), 0);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    /* 5: well-formed, from a client without a mesh routing id: malformed */
    assert_int_equal(zmq_send(anon, buf, len, 0), (int)len);
    /* never arrives: node 1 is connected under that id already */
    assert_int_equal(zmq_send(impostor, buf, len, 0), (int)len);

    krt_mesh_stats_t st = {0};
    for (int i = 0; i < 1000 && (st.malformed < 4 || st.undeliverable < 1); i++) {
        usleep(5000);
        krt_mesh_stats(p.mesh[1], &st);
    }
    usleep(100000); /* room for anything else (the impostor's message) to arrive */
    krt_mesh_stats(p.mesh[1], &st);
    assert_int_equal(st.malformed, 4);
    assert_int_equal(st.undeliverable, 1);
    assert_int_equal(st.received, 1); /* the first request only */
    zmq_close(raw);
    zmq_close(anon);
    zmq_close(impostor);
    assert_int_equal(zmq_ctx_term(ctx), 0);

    s_request(&p, echo); /* the mesh still works */
    s_pair_down(&p);
    assert_int_equal(s_threads(), threads);
}

int main(void)
{
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_reply_inproc),
        cmocka_unit_test(test_request_reply_ipc),
        cmocka_unit_test(test_request_reply_large_body),
        cmocka_unit_test(test_request_reply_tcp_curve),
        cmocka_unit_test(test_request_errors_remote),
        cmocka_unit_test(test_pingpong_inproc),
        cmocka_unit_test(test_pingpong_ipc),
        cmocka_unit_test(test_unknown_node),
        cmocka_unit_test(test_hostile_frames),
        cmocka_unit_test(test_curve_authentication),
        cmocka_unit_test(test_curve_late_key),
        cmocka_unit_test(test_node_down),
        cmocka_unit_test(test_node_restart),
    };
    return cmocka_run_group_tests(tests, NULL, s_teardown);
}
