/*
 * Location transparency over the real mesh (tcp loopback): links and monitors of actors on
 * another node and their exit reasons, remote kill, names (name@node) and krt_call across
 * nodes, and node down in every form (goodbye on stop, krt_mesh_disconnect, a peer process
 * SIGSTOPped past the heartbeat timeout, a peer process restarted under a new incarnation):
 * DOWN/EXIT with KRT_EXIT_NOCONN and pending requests failing at once with KRT_ENOCONN.
 * Relays (krt_relay) to a name on this node and on another, the sender kept.
 * Hostile frames (truncated, forged, stale) are dropped and counted.
 *
 * Peer processes are this binary re-executed with --peer (a node of its own).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "krt.h"
#include "krt_mesh_frame.h"

enum {
    T_PING = KRT_MSG_USER + 1, /* request: answered with T_PONG and the same body */
    T_PONG,
    T_HOLD, /* request: never answered */
    T_COUNT /* plain: counted */
};

#define WAIT_MS     10000
#define HOLD_MS     30000 /* the timeout of requests that must fail long before it */
#define AT_ONCE_MS  2000  /* "at once": well under HOLD_MS, with room for a loaded machine */
#define REASON_TEST 77

/* ------------------------------------------------------------------------------------------ */
/* Actors                                                                                     */

static void echo_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    _Atomic uint64_t *count = *(_Atomic uint64_t **)state;
    if (msg->type == T_PING)
        krt_reply(ctx, msg, T_PONG, msg->body, msg->len);
    else if (msg->type == T_COUNT && count)
        atomic_fetch_add(count, 1);
}

static int echo_init(krt_ctx_t *ctx, void *state, void *arg)
{
    *(void **)state = arg;
    return 0;
}

static const krt_behaviour_t s_echo = {
    .kind = "echo", .state_size = sizeof(void *), .init = echo_init, .handle = echo_handle};

/* What a watcher saw. */
typedef struct obs {
    _Atomic int down, exit, req; /* reasons / request error; -1000 until seen */
    _Atomic bool ready;          /* the target answered a ping sent after link/monitor */
    _Atomic krt_addr_t down_who, exit_who;
    _Atomic int64_t req_ms; /* from the request to its failure */
} obs_t;

typedef struct watch_arg {
    obs_t *o;
    krt_addr_t target;
    bool link, monitor, request, trap;
} watch_arg_t;

typedef struct watcher {
    obs_t *o;
    int64_t t0;
} watcher_t;

static void obs_init(obs_t *o)
{
    atomic_store(&o->down, -1000);
    atomic_store(&o->exit, -1000);
    atomic_store(&o->req, -1000);
    atomic_store(&o->down_who, 0);
    atomic_store(&o->exit_who, 0);
    atomic_store(&o->req_ms, -1);
    atomic_store(&o->ready, false);
}

static void watch_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    watcher_t *w = state;
    if (user) { /* the ping: what was sent before it has arrived */
        atomic_store(&w->o->ready, err == 0);
        return;
    }
    atomic_store(&w->o->req_ms, krt_mono_ms() - w->t0);
    atomic_store(&w->o->req, err);
}

static int watch_init(krt_ctx_t *ctx, void *state, void *arg)
{
    watcher_t *w = state;
    watch_arg_t *a = arg;
    w->o = a->o;
    krt_trap_exit(ctx, a->trap);
    if (a->monitor)
        krt_monitor(ctx, a->target);
    if (a->link)
        krt_link(ctx, a->target);
    if (a->request) {
        w->t0 = krt_mono_ms();
        krt_request(ctx, a->target, T_HOLD, "x", 1, HOLD_MS, watch_done, NULL);
    }
    krt_request(ctx, a->target, T_PING, "p", 1, WAIT_MS, watch_done, w);
    return 0;
}

static void watch_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    watcher_t *w = state;
    if (msg->type == KRT_MSG_DOWN) {
        const krt_down_t *d = msg->body;
        atomic_store(&w->o->down_who, d->who);
        atomic_store(&w->o->down, d->reason);
    } else if (msg->type == KRT_MSG_EXIT) {
        const krt_exit_t *e = msg->body;
        atomic_store(&w->o->exit_who, e->who);
        atomic_store(&w->o->exit, e->reason);
    } else if (msg->type == T_COUNT) {
        krt_exit(ctx, REASON_TEST);
    } else if (msg->type == T_PING) {
        krt_reply(ctx, msg, T_PONG, msg->body, msg->len);
    }
}

static const krt_behaviour_t s_watcher = {
    .kind = "watcher", .state_size = sizeof(watcher_t), .init = watch_init, .handle = watch_handle};

/* Sends n T_COUNT messages to its target in one turn (batching). */
typedef struct burst_arg {
    krt_addr_t target;
    int n;
} burst_arg_t;

static int burst_init(krt_ctx_t *ctx, void *state, void *arg)
{
    burst_arg_t *b = arg;
    for (int i = 0; i < b->n; i++)
        if (krt_send(ctx, b->target, T_COUNT, &i, sizeof i))
            return KRT_EXIT_ERROR;
    krt_exit(ctx, KRT_EXIT_NORMAL);
    return 0;
}

static const krt_behaviour_t s_burst = {.kind = "burst", .init = burst_init, .handle = echo_handle};

/* ------------------------------------------------------------------------------------------ */
/* Nodes                                                                                      */

typedef struct node {
    krt_system_t *sys;
    krt_mesh_t *mesh;
    char ep[128];
} node_t;

static void node_up(node_t *n, uint16_t id, const char *bind, int hb_ms, int timeout_ms)
{
    krt_config_t cfg = {.node_id = id, .schedulers = 1, .job_threads = 1};
    n->sys = krt_system_new(&cfg);
    assert_non_null(n->sys);
    assert_int_equal(krt_system_start(n->sys), 0);
    krt_mesh_config_t mc = {.bind = bind, .heartbeat_ms = hb_ms, .peer_timeout_ms = timeout_ms};
    n->mesh = krt_mesh_new(n->sys, &mc);
    assert_non_null(n->mesh);
    assert_int_equal(krt_mesh_start(n->mesh), 0);
    snprintf(n->ep, sizeof n->ep, "%s", krt_mesh_endpoint(n->mesh));
}

static void node_join(node_t *a, uint16_t a_id, node_t *b, uint16_t b_id)
{
    assert_int_equal(krt_mesh_connect(a->mesh, b_id, b->ep, NULL), 0);
    assert_int_equal(krt_mesh_connect(b->mesh, a_id, a->ep, NULL), 0);
}

static void node_stop(node_t *n)
{
    krt_mesh_stop(n->mesh);
    krt_system_stop(n->sys);
    krt_mesh_destroy(&n->mesh);
    krt_system_destroy(&n->sys);
}

static krt_addr_t spawn(krt_system_t *sys, const krt_behaviour_t *b, void *arg, const char *name)
{
    krt_addr_t a = 0;
    krt_spawn_opts_t o = {.name = name, .register_name = name != NULL};
    assert_int_equal(krt_system_spawn(sys, b, arg, &o, &a), 0);
    return a;
}

/* Polls cond (an expression) every 2 ms until true or WAIT_MS passed. */
#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        int64_t dl_ = krt_mono_ms() + WAIT_MS;                                                     \
        while (!(cond) && krt_mono_ms() < dl_)                                                     \
            usleep(2000);                                                                          \
        assert_true(cond);                                                                         \
    } while (0)

static void wait_up(node_t *n, uint16_t peer)
{
    WAIT_FOR(krt_mesh_node_up(n->mesh, peer));
}

/* ------------------------------------------------------------------------------------------ */
/* Peer processes                                                                             */

typedef struct peer {
    pid_t pid;
    char ep[128];
} peer_t;

/* --peer ID PARENT_EP BIND HB_MS: a node with "svc" registered, connected to node 1. */
static int peer_main(char **argv)
{
    node_t n;
    uint16_t id = (uint16_t)atoi(argv[2]);
    node_up(&n, id, argv[4], atoi(argv[5]), 0);
    spawn(n.sys, &s_echo, NULL, "svc");
    if (krt_mesh_connect(n.mesh, 1, argv[3], NULL))
        return 1;
    printf("%s\n", n.ep);
    fflush(stdout);
    for (;;)
        pause(); /* until the test kills it */
}

static void peer_start(peer_t *p, uint16_t id, const node_t *parent, const char *bind, int hb_ms)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    char sid[8], shb[16];
    snprintf(sid, sizeof sid, "%u", id);
    snprintf(shb, sizeof shb, "%d", hb_ms);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl("/proc/self/exe", "test_mesh_remote", "--peer", sid, parent->ep, bind, shb,
              (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    struct pollfd pfd = {fd[0], POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, WAIT_MS), 1);
    ssize_t n = read(fd[0], p->ep, sizeof p->ep - 1);
    assert_true(n > 1);
    p->ep[n - 1] = 0; /* the newline */
    close(fd[0]);
}

static void peer_kill(peer_t *p)
{
    kill(p->pid, SIGCONT);
    kill(p->pid, SIGKILL);
    int st;
    assert_int_equal(waitpid(p->pid, &st, 0), p->pid);
}

/* ------------------------------------------------------------------------------------------ */
/* Tests                                                                                      */

/* Monitor and link (trapping) a remote actor, kill it remotely: DOWN and EXIT carry its
 * reason across. Dead remote targets: NOPROC. A non-trapping remote peer of a link dies with
 * the local actor's reason. KRT_EXIT_KILLED kills a trapping remote actor. */
/* A monitor of target on its own node (its DOWN tells the exit reason without racing it). */
static void local_monitor(obs_t *o, watch_arg_t *w, krt_system_t *sys, krt_addr_t target)
{
    obs_init(o);
    *w = (watch_arg_t){.o = o, .target = target, .monitor = true};
    spawn(sys, &s_watcher, w, NULL);
    WAIT_FOR(atomic_load(&o->ready));
}

static void test_remote_link_monitor_kill(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);

    krt_addr_t victim = spawn(b.sys, &s_echo, NULL, NULL);
    obs_t mon, lnk;
    obs_init(&mon);
    obs_init(&lnk);
    watch_arg_t wm = {.o = &mon, .target = victim, .monitor = true};
    watch_arg_t wl = {.o = &lnk, .target = victim, .link = true, .trap = true};
    spawn(a.sys, &s_watcher, &wm, NULL);
    krt_addr_t linker = spawn(a.sys, &s_watcher, &wl, NULL);
    WAIT_FOR(atomic_load(&mon.ready) && atomic_load(&lnk.ready));
    krt_reply_t r;
    assert_int_equal(krt_call(a.sys, victim, T_PING, "hi", 2, WAIT_MS, &r), 0);
    assert_int_equal(r.type, T_PONG);
    krt_reply_free(&r);
    assert_int_equal(krt_system_kill(a.sys, victim, REASON_TEST), 0);
    WAIT_FOR(atomic_load(&mon.down) == REASON_TEST && atomic_load(&lnk.exit) == REASON_TEST);
    assert_int_equal(atomic_load(&mon.down_who), victim);
    assert_int_equal(atomic_load(&lnk.exit_who), victim);

    /* dead (never existing) remote targets */
    krt_addr_t ghost = krt_node_addr(2) | 999999;
    obs_t gm;
    obs_init(&gm);
    watch_arg_t wg = {.o = &gm, .target = ghost, .monitor = true, .link = true, .trap = true};
    spawn(a.sys, &s_watcher, &wg, NULL);
    WAIT_FOR(atomic_load(&gm.down) == KRT_EXIT_NOPROC && atomic_load(&gm.exit) == KRT_EXIT_NOPROC);

    /* the link works the other way: the linker on node 1 exits, its remote peer dies */
    krt_addr_t peer = spawn(b.sys, &s_echo, NULL, NULL);
    obs_t l2;
    obs_init(&l2);
    watch_arg_t w2 = {.o = &l2, .target = peer, .link = true};
    krt_addr_t l2a = spawn(a.sys, &s_watcher, &w2, NULL);
    WAIT_FOR(atomic_load(&l2.ready));
    obs_t pm;
    watch_arg_t pw;
    local_monitor(&pm, &pw, b.sys, peer);
    assert_int_equal(krt_system_send(a.sys, l2a, T_COUNT, NULL, 0), 0); /* exits with 77 */
    WAIT_FOR(atomic_load(&pm.down) == REASON_TEST);

    /* KRT_EXIT_KILLED cannot be trapped, remotely either */
    obs_t km;
    watch_arg_t kw;
    local_monitor(&km, &kw, a.sys, linker);
    assert_int_equal(krt_system_kill(b.sys, linker, KRT_EXIT_KILLED), 0);
    WAIT_FOR(atomic_load(&km.down) == KRT_EXIT_KILLED);
    node_stop(&a);
    node_stop(&b);
}

/* Names: registered on node 2, looked up and called from node 1 (name@N, name@node-N). */
static void test_remote_names_and_call(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);
    krt_addr_t svc = spawn(b.sys, &s_echo, NULL, "svc");

    krt_addr_t got = 0;
    assert_int_equal(krt_whereis_at(a.sys, "svc@2", WAIT_MS, &got), 0);
    assert_int_equal(got, svc);
    assert_int_equal(krt_whereis_at(a.sys, "svc@node-2", WAIT_MS, &got), 0);
    assert_int_equal(got, svc);
    assert_int_equal(krt_whereis_at(a.sys, "none@2", WAIT_MS, &got), KRT_ENOACTOR);
    assert_int_equal(krt_whereis_at(a.sys, "svc@", WAIT_MS, &got), KRT_EINVAL);
    assert_int_equal(krt_whereis_at(a.sys, "@2", WAIT_MS, &got), KRT_EINVAL);
    assert_int_equal(krt_whereis_at(a.sys, "svc@2x", WAIT_MS, &got), KRT_EINVAL);
    assert_int_equal(krt_whereis_at(a.sys, "svc@9", WAIT_MS, &got), KRT_EREMOTE);

    krt_reply_t r;
    assert_int_equal(krt_call_name(a.sys, "svc@2", T_PING, "hello", 5, WAIT_MS, &r), 0);
    assert_int_equal(r.type, T_PONG);
    assert_int_equal(r.len, 5);
    assert_memory_equal(r.body, "hello", 5);
    krt_reply_free(&r);
    assert_int_equal(krt_call_name(a.sys, "none@2", T_PING, "x", 1, WAIT_MS, &r), KRT_ENOACTOR);
    /* a remote address nobody has: the node answers for it */
    assert_int_equal(krt_call(a.sys, krt_node_addr(2) | 999999, T_PING, "x", 1, WAIT_MS, &r),
                     KRT_ENOACTOR);
    /* a remote call that is never answered times out as a local one */
    assert_int_equal(krt_call(a.sys, svc, T_HOLD, "x", 1, 50, &r), KRT_ETIMEDOUT);

    /* a burst in one turn goes as few frames */
    _Atomic uint64_t count = 0;
    krt_addr_t counter = spawn(b.sys, &s_echo, &count, NULL);
    krt_mesh_stats_t s0, s1;
    krt_mesh_stats(a.mesh, &s0);
    burst_arg_t ba = {counter, 1000};
    spawn(a.sys, &s_burst, &ba, NULL);
    WAIT_FOR(atomic_load(&count) == 1000);
    krt_mesh_stats(a.mesh, &s1);
    assert_true(s1.sent - s0.sent >= 1000);
    assert_true(s1.frames - s0.frames <= 20);
    node_stop(&a);
    node_stop(&b);
}

/* Relays every message to the name its body's first byte picks: 'l' "svc" on this node, 'r'
 * "svc" on node 2, 'n' "none" on node 2, 'c' "counter" on node 2; the body is relayed as is. */
static void relay_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->len < 1)
        return;
    char k = *(const char *)msg->body;
    const char *name = k == 'n' ? "none" : k == 'c' ? "counter" : "svc";
    int rc = krt_relay(ctx, k == 'l' ? 1 : 2, name, msg, msg->body, msg->len);
    if (rc && msg->kind == KRT_KIND_REQUEST)
        krt_reply_error(ctx, msg, rc, "not relayed");
}

static const krt_behaviour_t s_relay = {.kind = "relay", .handle = relay_handle};

static void test_relay(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);
    spawn(b.sys, &s_echo, NULL, "svc");
    spawn(a.sys, &s_echo, NULL, "svc");
    _Atomic uint64_t count = 0;
    spawn(b.sys, &s_echo, &count, "counter");
    krt_addr_t relay = spawn(a.sys, &s_relay, NULL, NULL);

    krt_reply_t r;
    /* a call relayed to the other node is answered there, straight back to the caller */
    assert_int_equal(krt_call(a.sys, relay, T_PING, "r-hello", 7, WAIT_MS, &r), 0);
    assert_int_equal(r.type, T_PONG);
    assert_int_equal(r.len, 7);
    assert_memory_equal(r.body, "r-hello", 7);
    krt_reply_free(&r);
    /* ... and to this node's registry */
    assert_int_equal(krt_call(a.sys, relay, T_PING, "l-x", 3, WAIT_MS, &r), 0);
    assert_int_equal(r.type, T_PONG);
    krt_reply_free(&r);
    /* a name the other node does not know: that node answers the request ENOACTOR */
    assert_int_equal(krt_call(a.sys, relay, T_PING, "n", 1, WAIT_MS, &r), KRT_ENOACTOR);
    /* a plain message keeps its kind: counted there, no answer expected */
    for (int i = 0; i < 10; i++)
        assert_int_equal(krt_system_send(a.sys, relay, T_COUNT, "c", 1), 0);
    WAIT_FOR(atomic_load(&count) == 10);
    node_stop(&a);
    node_stop(&b);
}

/* krt_request_name from an actor: the name's answer, or the error, with its time. */
typedef struct named {
    const char *name;
    uint32_t type;
    _Atomic int err; /* -1000 until answered */
    _Atomic int64_t ms;
    char body[16];
    int64_t t0;
} named_t;

static void named_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    named_t *n = *(named_t **)state;
    if (!err && reply->len < sizeof n->body)
        memcpy(n->body, reply->body, reply->len);
    atomic_store(&n->ms, krt_mono_ms() - n->t0);
    atomic_store(&n->err, err);
}

static int named_init(krt_ctx_t *ctx, void *state, void *arg)
{
    named_t *n = arg;
    *(named_t **)state = n;
    n->t0 = krt_mono_ms();
    return krt_request_name(ctx, 2, n->name, n->type, "hi", 2, HOLD_MS, named_done, NULL);
}

static void named_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
}

static const krt_behaviour_t s_named = {
    .kind = "named", .state_size = sizeof(void *), .init = named_init, .handle = named_handle};

static void named_start(named_t *n, node_t *a, const char *name, uint32_t type)
{
    *n = (named_t){.name = name, .type = type};
    atomic_store(&n->err, -1000);
    spawn(a->sys, &s_named, n, NULL);
}

/* A request to a name on another node in one message: answered by that actor; a name the node
 * does not know fails KRT_ENOACTOR; a request held there fails KRT_ENOCONN at once when the
 * node goes down (the request is with that node, not with a relay on this one). */
static void test_request_name(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);
    spawn(b.sys, &s_echo, NULL, "svc");
    named_t ok, none, held;
    named_start(&ok, &a, "svc", T_PING);
    named_start(&none, &a, "none", T_PING);
    named_start(&held, &a, "svc", T_HOLD);
    WAIT_FOR(atomic_load(&ok.err) == 0 && atomic_load(&none.err) == KRT_ENOACTOR);
    assert_memory_equal(ok.body, "hi", 2);
    int64_t t0 = krt_mono_ms();
    assert_int_equal(krt_mesh_disconnect(a.mesh, 2), 0);
    WAIT_FOR(atomic_load(&held.err) == KRT_ENOCONN);
    assert_true(krt_mono_ms() - t0 < AT_ONCE_MS);
    node_stop(&a);
    node_stop(&b);
}

/* A watcher on node 1 of `target` on node 2 (monitor, trapping link, held request), and a
 * krt_call_async held there too. */
typedef struct held {
    obs_t o;
    _Atomic int call_err;
    _Atomic int64_t call_ms;
    int64_t t0;
} held_t;

static void held_cb(void *user, int err, const krt_msg_t *reply)
{
    held_t *h = user;
    atomic_store(&h->call_ms, krt_mono_ms() - h->t0);
    atomic_store(&h->call_err, err);
}

static void held_start(held_t *h, node_t *a, krt_addr_t target)
{
    obs_init(&h->o);
    atomic_store(&h->call_err, -1000);
    watch_arg_t w = {
        .o = &h->o, .target = target, .monitor = true, .link = true, .request = true, .trap = true};
    spawn(a->sys, &s_watcher, &w, NULL);
    h->t0 = krt_mono_ms();
    assert_int_equal(krt_call_async(a->sys, target, T_HOLD, "x", 1, HOLD_MS, held_cb, h), 0);
    WAIT_FOR(atomic_load(&h->o.ready));
}

/* Node down: everything held fails with NOCONN / ENOCONN, each well before its timeout;
 * still_down: new requests to the node fail at once. */
static void held_check(held_t *h, node_t *a, krt_addr_t target, int64_t since, bool still_down)
{
    WAIT_FOR(atomic_load(&h->o.down) == KRT_EXIT_NOCONN &&
             atomic_load(&h->o.exit) == KRT_EXIT_NOCONN && atomic_load(&h->o.req) == KRT_ENOCONN &&
             atomic_load(&h->call_err) == KRT_ENOCONN);
    assert_int_equal(atomic_load(&h->o.down_who), target);
    assert_int_equal(atomic_load(&h->o.exit_who), target);
    int64_t late = krt_mono_ms() - since;
    assert_true(late < AT_ONCE_MS);
    assert_true(atomic_load(&h->o.req_ms) < HOLD_MS / 2);
    assert_true(atomic_load(&h->call_ms) < HOLD_MS / 2);
    if (!still_down)
        return;
    krt_reply_t r;
    int rc = krt_call(a->sys, target, T_PING, "x", 1, HOLD_MS, &r);
    assert_true(rc == KRT_ENOCONN || rc == KRT_EREMOTE);
}

static void test_node_down_bye(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0); /* no heartbeats: the goodbye alone tells */
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);
    krt_addr_t t = spawn(b.sys, &s_echo, NULL, NULL);
    held_t h;
    held_start(&h, &a, t);
    int64_t t0 = krt_mono_ms();
    krt_mesh_stop(b.mesh);
    held_check(&h, &a, t, t0, true);
    assert_false(krt_mesh_node_up(a.mesh, 2));
    node_stop(&b);
    node_stop(&a);
}

static void test_node_down_disconnect(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);
    krt_addr_t t = spawn(b.sys, &s_echo, NULL, NULL);
    obs_t local; /* a monitor of t on its own node */
    obs_init(&local);
    watch_arg_t wl = {.o = &local, .target = t, .monitor = true};
    spawn(b.sys, &s_watcher, &wl, NULL);
    WAIT_FOR(atomic_load(&local.ready));
    held_t h;
    held_start(&h, &a, t);
    int64_t t0 = krt_mono_ms();
    assert_int_equal(krt_mesh_disconnect(a.mesh, 2), 0);
    assert_int_equal(krt_mesh_disconnect(a.mesh, 2), KRT_EINVAL);
    held_check(&h, &a, t, t0, true);
    /* node 2 heard the goodbye: its view of node 1 is down too */
    WAIT_FOR(!krt_mesh_node_up(b.mesh, 1));
    /* ... so the target, linked to the watcher on node 1 and not trapping, died with it */
    WAIT_FOR(atomic_load(&local.down) == KRT_EXIT_NOCONN);
    node_stop(&b);
    node_stop(&a);
}

/* A peer process stopped (SIGSTOP) past the heartbeat timeout. */
static void test_node_down_sigstop(void **unused)
{
    node_t a;
    node_up(&a, 1, "tcp://127.0.0.1:*", 50, 400);
    peer_t p;
    peer_start(&p, 3, &a, "tcp://127.0.0.1:*", 50);
    assert_int_equal(krt_mesh_connect(a.mesh, 3, p.ep, NULL), 0);
    wait_up(&a, 3);
    krt_addr_t svc = 0;
    assert_int_equal(krt_whereis_at(a.sys, "svc@3", WAIT_MS, &svc), 0);
    held_t h;
    held_start(&h, &a, svc);
    int64_t t0 = krt_mono_ms();
    assert_int_equal(kill(p.pid, SIGSTOP), 0);
    held_check(&h, &a, svc, t0, true);
    assert_true(krt_mono_ms() - t0 >= 350); /* the heartbeat timeout, not sooner */
    assert_int_equal(kill(p.pid, SIGCONT), 0);
    wait_up(&a, 3); /* back: same incarnation, heard again */
    /* it was told (sever): svc, linked to the watcher and not trapping, died and its name with
     * it */
    WAIT_FOR(krt_whereis_at(a.sys, "svc@3", WAIT_MS, &svc) == KRT_ENOACTOR);
    peer_kill(&p);
    node_stop(&a);
}

/* A peer process killed and started again on the same endpoint: with heartbeats off, only its
 * new incarnation tells node 1 that the old actors are gone; their addresses reach nobody. */
static void test_node_restart_incarnation(void **unused)
{
    node_t a;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    peer_t p;
    peer_start(&p, 2, &a, "tcp://127.0.0.1:*", 0);
    assert_int_equal(krt_mesh_connect(a.mesh, 2, p.ep, NULL), 0);
    krt_addr_t svc = 0;
    assert_int_equal(krt_whereis_at(a.sys, "svc@2", WAIT_MS, &svc), 0);
    held_t h;
    held_start(&h, &a, svc);
    char ep[128];
    snprintf(ep, sizeof ep, "%s", p.ep);
    peer_kill(&p);
    assert_int_equal(atomic_load(&h.o.down), -1000); /* nothing told node 1 yet */
    peer_start(&p, 2, &a, ep, 0);
    int64_t t0 = krt_mono_ms();         /* it is up (its goodbye-less restart is news to node 1) */
    held_check(&h, &a, svc, t0, false); /* up again at once: its new life */
    krt_addr_t svc2 = 0;
    assert_int_equal(krt_whereis_at(a.sys, "svc@2", WAIT_MS, &svc2), 0);
    krt_reply_t r;
    assert_int_equal(krt_call(a.sys, svc2, T_PING, "x", 1, WAIT_MS, &r), 0);
    krt_reply_free(&r);
    /* the old life's address names no actor of the new one, though the new svc took the same
     * slot: a call to it fails instead of reaching the new svc */
    assert_int_not_equal(svc2, svc);
    assert_int_equal(krt_call(a.sys, svc, T_PING, "x", 1, WAIT_MS, &r), KRT_ENOACTOR);
    peer_kill(&p);
    node_stop(&a);
}

/* Raw frames on node 2's ROUTER from a client claiming node 7. */
static size_t s_frame(uint8_t *buf, size_t cap, uint64_t dst_inc, krt_addr_t to, const krt_msg_t *m)
{
    size_t elen = 0, hdr = KRT_MFRAME_HEADER + KRT_MFRAME_LEN;
    assert_int_equal(krt_envelope_encode_buf(buf + hdr, cap - hdr, to, m, &elen), 0);
    krt_mframe_header(buf, 5, dst_inc);
    krt_mframe_len(buf + KRT_MFRAME_HEADER, (uint32_t)elen);
    return hdr + elen;
}

static void test_hostile_frames(void **unused)
{
    node_t a, b;
    node_up(&a, 1, "tcp://127.0.0.1:*", 0, 0);
    node_up(&b, 2, "tcp://127.0.0.1:*", 0, 0);
    node_join(&a, 1, &b, 2);
    krt_addr_t t = spawn(b.sys, &s_echo, NULL, NULL);
    void *ctx = zmq_ctx_new();
    void *raw = zmq_socket(ctx, ZMQ_DEALER);
    const uint8_t id7[3] = {'K', 0, 7};
    int zero = 0;
    assert_int_equal(zmq_setsockopt(raw, ZMQ_ROUTING_ID, id7, 3), 0);
    assert_int_equal(zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_connect(raw, b.ep), 0);

    uint8_t buf[256];
    krt_msg_t m = {.type = T_COUNT, .len = 1, .from = krt_node_addr(7) | 1, .body = "x"};
    size_t len = s_frame(buf, sizeof buf, 0, t, &m);
    /* malformed: short header, wrong magic, a length past the end, a truncated envelope */
    assert_int_equal(zmq_send(raw, buf, 10, 0), 10);
    buf[0] = 'X';
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    buf[0] = 'K';
    krt_mframe_len(buf + KRT_MFRAME_HEADER, 200);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    krt_mframe_len(buf + KRT_MFRAME_HEADER,
                   (uint32_t)(len - KRT_MFRAME_HEADER - KRT_MFRAME_LEN - 1));
    assert_int_equal(zmq_send(raw, buf, len - 1, 0), (int)len - 1);
    /* malformed: a forged sender (an actor of node 1, from node 7's connection) */
    krt_msg_t forged = {.type = 64 + 10,
                        .len = 12,
                        .from = krt_node_addr(1) | 5,
                        .body = "\x02\0\0\0\0\0\0\0\0\0\0\0"}; /* an EXIT signal, KILLED */
    len = s_frame(buf, sizeof buf, 0, t, &forged);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    /* stale: meant for another incarnation of node 2 */
    len = s_frame(buf, sizeof buf, 12345, t, &m);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);
    /* undeliverable: a signal with a body of the wrong size, from node 7 itself */
    krt_msg_t bad = {.type = 64 + 10, .len = 3, .from = krt_node_addr(7) | 1, .body = "abc"};
    len = s_frame(buf, sizeof buf, 0, t, &bad);
    assert_int_equal(zmq_send(raw, buf, len, 0), (int)len);

    krt_mesh_stats_t st = {0};
    WAIT_FOR(
        (krt_mesh_stats(b.mesh, &st), st.malformed >= 5 && st.stale >= 1 && st.undeliverable >= 1));
    usleep(100000); /* room for anything else to arrive */
    krt_mesh_stats(b.mesh, &st);
    assert_int_equal(st.malformed, 5);
    assert_int_equal(st.stale, 1);
    assert_int_equal(st.undeliverable, 1);
    zmq_close(raw);
    assert_int_equal(zmq_ctx_term(ctx), 0);
    /* the target is alive and the mesh works */
    krt_reply_t r;
    assert_int_equal(krt_call(a.sys, t, T_PING, "x", 1, WAIT_MS, &r), 0);
    krt_reply_free(&r);
    node_stop(&a);
    node_stop(&b);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--peer") == 0)
        return peer_main(argv);
    krt_log_configure(KRT_LOG_ERROR, false, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_remote_link_monitor_kill),
        cmocka_unit_test(test_remote_names_and_call),
        cmocka_unit_test(test_relay),
        cmocka_unit_test(test_request_name),
        cmocka_unit_test(test_node_down_bye),
        cmocka_unit_test(test_node_down_disconnect),
        cmocka_unit_test(test_node_down_sigstop),
        cmocka_unit_test(test_node_restart_incarnation),
        cmocka_unit_test(test_hostile_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
