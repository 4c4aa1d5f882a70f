/*
 * Requests with callbacks (krt_request.c): the callback runs once, in the caller's turn, with
 * the caller's state; replies, error replies, timeouts, targets that are or get gone, callers
 * that stop first, late replies, relays, many requests at once, requests to self, and the
 * status of error replies seen by krt_call / krt_call_async.
 */
#include "rt_test.h"

#include <stdatomic.h>

enum {
    T_ECHO = KRT_MSG_USER, /* request: answered with the same body */
    T_FAIL,                /* request: answered with an error reply -EPERM "not allowed" */
    T_HOLD,                /* request: kept until T_RELEASE */
    T_RELEASE,             /* answers the held request (42) */
    T_HOLD_DIE,            /* request: kept, then the server stops */
    T_RELAY,               /* request: handed to the worker, which answers it */
    T_EXIT,                /* stop now */
    T_CMD,                 /* to the client: a cmd_t */
    T_COUNT,               /* to the client (krt_call): how many callbacks ran */
    T_WORK                 /* to the worker: answer (from, ref) in the body */
};

enum { EV_DONE = 1, EV_CLIENT_TERM };

/* ---- the server and the worker ------------------------------------------------------------ */

typedef struct {
    krt_addr_t from;
    uint64_t ref;
    krt_addr_t worker;
} srv_t;

typedef struct {
    krt_addr_t from;
    uint64_t ref;
} work_t;

static void srv_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    srv_t *s = state;
    switch (msg->type) {
    case T_ECHO:
        krt_reply(ctx, msg, T_ECHO, msg->body, msg->len);
        break;
    case T_FAIL:
        krt_reply_error(ctx, msg, -EPERM, "not allowed");
        break;
    case T_HOLD:
    case T_HOLD_DIE:
        s->from = msg->from;
        s->ref = msg->ref;
        if (msg->type == T_HOLD_DIE)
            krt_exit(ctx, KRT_EXIT_NORMAL);
        break;
    case T_RELEASE: {
        int v = 42;
        krt_reply_to(ctx, s->from, s->ref, T_ECHO, &v, sizeof v);
        break;
    }
    case T_RELAY: {
        work_t w = {msg->from, msg->ref};
        krt_send(ctx, s->worker, T_WORK, &w, sizeof w);
        break;
    }
    case T_EXIT:
        krt_exit(ctx, KRT_EXIT_NORMAL);
        break;
    default:
        break;
    }
}
static int srv_init(krt_ctx_t *ctx, void *state, void *arg)
{
    (void)ctx;
    ((srv_t *)state)->worker = arg ? *(const krt_addr_t *)arg : KRT_ADDR_NONE;
    return 0;
}
static const krt_behaviour_t srv_b = {
    .kind = "srv", .state_size = sizeof(srv_t), .init = srv_init, .handle = srv_handle};

static void worker_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    (void)state;
    if (msg->type == T_WORK && msg->len == sizeof(work_t)) {
        const work_t *w = msg->body;
        int v = 7;
        krt_reply_to(ctx, w->from, w->ref, T_ECHO, &v, sizeof v);
    }
}
static const krt_behaviour_t worker_b = {.kind = "worker", .handle = worker_handle};

/* ---- the client --------------------------------------------------------------------------- */

typedef struct {
    krt_addr_t to;
    uint32_t type;
    int timeout_ms;
    int n;           /* requests to make (tags base .. base + n - 1) */
    int base;        /* first tag */
    bool exit_after; /* stop in the same turn */
    bool kill_first; /* send T_EXIT to `to` just before the requests */
    int busy_ms;     /* then stay in the turn this long (replies and timeouts pile up) */
} cmd_t;

typedef struct {
    krt_addr_t me;
    void *self_state; /* what init saw: the callback must get the same pointer */
    _Atomic int in_turn;
    long count;
} client_t;

/* Logs (err, tag, what): what is the echoed int, 100 for the expected error reply, -1 for no
 * reply, -999 if the callback did not run in the client's own turn with its state. */
static void client_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    client_t *c = state;
    int64_t what = -1;
    if (reply && reply->type == KRT_MSG_ERROR)
        what = reply->status == err && reply->len == sizeof "not allowed" &&
                       strcmp(reply->body, "not allowed") == 0
                   ? 100
                   : 101 + (reply->status == err ? 0 : 1000);
    else if (reply && reply->len == sizeof(int))
        what = *(const int *)reply->body;
    if (state != c->self_state || krt_self(ctx) != c->me || atomic_load(&c->in_turn))
        what = -999;
    c->count++;
    rt_ev(EV_DONE, err, (int64_t)(intptr_t)user, what);
}

static void client_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    client_t *c = state;
    atomic_store(&c->in_turn, 1); /* a callback may never run inside another handler */
    if (msg->type == T_CMD && msg->len == sizeof(cmd_t)) {
        const cmd_t *cmd = msg->body;
        if (cmd->kill_first)
            krt_send(ctx, cmd->to, T_EXIT, NULL, 0);
        for (int i = 0; i < cmd->n; i++) {
            int v = cmd->base + i;
            int rc = krt_request(ctx, cmd->to, cmd->type, &v, sizeof v, cmd->timeout_ms,
                                 client_done, (void *)(intptr_t)v);
            if (rc)
                rt_ev(EV_DONE, 1000 + rc, v, 0);
        }
        for (int64_t until = krt_mono_ms() + cmd->busy_ms; krt_mono_ms() < until;)
            ;
        if (cmd->exit_after)
            krt_exit(ctx, KRT_EXIT_NORMAL);
    } else if (msg->type == T_COUNT) {
        krt_reply(ctx, msg, T_COUNT, &c->count, sizeof c->count);
    } else if (msg->type == T_ECHO) { /* requests to self */
        krt_reply(ctx, msg, T_ECHO, msg->body, msg->len);
    }
    atomic_store(&c->in_turn, 0);
}
static int client_init(krt_ctx_t *ctx, void *state, void *arg)
{
    (void)arg;
    client_t *c = state;
    c->me = krt_self(ctx);
    c->self_state = state;
    return 0;
}
static void client_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    (void)ctx;
    (void)state;
    rt_ev(EV_CLIENT_TERM, reason, 0, 0);
}
static const krt_behaviour_t client_b = {.kind = "client",
                                         .state_size = sizeof(client_t),
                                         .init = client_init,
                                         .handle = client_handle,
                                         .terminate = client_terminate};

/* ---- helpers ------------------------------------------------------------------------------ */

static krt_addr_t s_spawn(krt_system_t *sys, const krt_behaviour_t *b, void *arg)
{
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, b, arg, NULL, &a), 0);
    return a;
}

static void s_cmd(krt_system_t *sys, krt_addr_t client, cmd_t cmd)
{
    assert_int_equal(krt_system_send(sys, client, T_CMD, &cmd, sizeof cmd), 0);
}

static long s_count(krt_system_t *sys, krt_addr_t client)
{
    krt_reply_t r;
    assert_int_equal(krt_call(sys, client, T_COUNT, NULL, 0, 5000, &r), 0);
    long n = *(const long *)r.body;
    krt_reply_free(&r);
    return n;
}

/* Waits until a stops (KRT_ENOACTOR: it was already stopping when the wait began). */
static void s_gone(krt_system_t *sys, krt_addr_t a)
{
    int rc = krt_system_wait(sys, a, 5000);
    assert_true(rc >= 0 || rc == KRT_ENOACTOR);
}

/* Waits for one EV_DONE and checks it. */
static void s_expect(int err, int64_t tag, int64_t what)
{
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_DONE, 5000, &ev));
    assert_int_equal(ev.a, err);
    assert_int_equal(ev.b, tag);
    assert_int_equal(ev.c, what);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_reply_runs_in_callers_turn(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL), client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_ECHO, .timeout_ms = 1000, .n = 1, .base = 5});
    s_expect(0, 5, 5);
    assert_int_equal(s_count(sys, client), 1); /* the callback changed the state */
    krt_system_destroy(&sys);
}

static void test_error_reply(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL), client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_FAIL, .timeout_ms = 1000, .n = 1, .base = 1});
    s_expect(-EPERM, 1, 100);
    /* krt_call sees the status in the reply, the message as its body */
    krt_reply_t r;
    assert_int_equal(krt_call(sys, srv, T_FAIL, NULL, 0, 5000, &r), 0);
    assert_int_equal(r.status, -EPERM);
    assert_int_equal(r.type, KRT_MSG_ERROR);
    assert_string_equal(r.body, "not allowed");
    krt_reply_free(&r);
    /* a success reply has status 0 */
    assert_int_equal(krt_call(sys, srv, T_ECHO, "x", 2, 5000, &r), 0);
    assert_int_equal(r.status, 0);
    krt_reply_free(&r);
    krt_system_destroy(&sys);
}

static _Atomic int s_async_err = 1;
static void s_async_cb(void *user, int err, const krt_msg_t *reply)
{
    (void)user;
    atomic_store(&s_async_err,
                 reply && reply->status == err && strcmp(reply->body, "not allowed") == 0 ? err
                                                                                          : 1);
}

static void test_error_reply_call_async(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL);
    assert_int_equal(krt_call_async(sys, srv, T_FAIL, NULL, 0, 5000, s_async_cb, NULL), 0);
    for (int i = 0; i < 500 && atomic_load(&s_async_err) == 1; i++)
        rt_sleep_ms(10);
    assert_int_equal(atomic_load(&s_async_err), -EPERM);
    krt_system_destroy(&sys);
}

static void test_timeout_then_late_reply_dropped(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL), client = s_spawn(sys, &client_b, NULL);
    uint64_t t0 = krt_now_ms();
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_HOLD, .timeout_ms = 30, .n = 1, .base = 3});
    s_expect(KRT_ETIMEDOUT, 3, -1);
    assert_true(krt_now_ms() - t0 >= 25);
    assert_int_equal(krt_system_send(sys, srv, T_RELEASE, NULL, 0), 0); /* the late reply */
    krt_reply_t r;
    assert_int_equal(krt_call(sys, srv, T_ECHO, NULL, 0, 5000, &r), 0); /* srv answered it */
    krt_reply_free(&r);
    assert_int_equal(s_count(sys, client), 1); /* ... and the client dropped it */
    assert_int_equal(rt_count(EV_DONE), 0);
    /* an answered request never times out */
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_HOLD, .timeout_ms = 100, .n = 1, .base = 4});
    rt_sleep_ms(10);
    assert_int_equal(krt_system_send(sys, srv, T_RELEASE, NULL, 0), 0);
    s_expect(0, 4, 42);
    rt_sleep_ms(200);
    assert_int_equal(rt_count(EV_DONE), 0);
    krt_system_destroy(&sys);
}

static void test_target_gone(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t client = s_spawn(sys, &client_b, NULL);
    /* never existed (no timeout: the runtime alone must answer) */
    krt_addr_t dead = s_spawn(sys, &srv_b, NULL);
    assert_int_equal(krt_system_send(sys, dead, T_EXIT, NULL, 0), 0);
    s_gone(sys, dead);
    s_cmd(sys, client, (cmd_t){.to = dead, .type = T_ECHO, .n = 1, .base = 1});
    s_expect(KRT_ENOACTOR, 1, 101);
    s_cmd(sys, client, (cmd_t){.to = KRT_ADDR_NONE, .type = T_ECHO, .n = 1, .base = 2});
    s_expect(KRT_ENOACTOR, 2, 101);
    /* stops with the request still in its mailbox */
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_ECHO, .n = 1, .base = 3, .kill_first = true});
    s_expect(KRT_ENOACTOR, 3, 101);
    /* takes the request, does not answer, stops */
    srv = s_spawn(sys, &srv_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_HOLD_DIE, .n = 1, .base = 4});
    s_expect(KRT_ENOACTOR, 4, 101);
    /* killed while holding it */
    srv = s_spawn(sys, &srv_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_HOLD, .n = 1, .base = 5});
    krt_reply_t r;
    assert_int_equal(krt_call(sys, srv, T_ECHO, NULL, 0, 5000, &r), 0); /* it holds it now */
    krt_reply_free(&r);
    assert_int_equal(krt_system_kill(sys, srv, KRT_EXIT_KILLED), 0);
    s_expect(KRT_ENOACTOR, 5, 101);
    assert_int_equal(s_count(sys, client), 5);
    krt_system_destroy(&sys);
}

static void test_caller_stops_first(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL), client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client,
          (cmd_t){
              .to = srv, .type = T_HOLD, .timeout_ms = 50, .n = 1, .base = 1, .exit_after = true});
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_CLIENT_TERM, 5000, &ev));
    assert_int_equal(krt_system_send(sys, srv, T_RELEASE, NULL, 0), 0); /* to a dead client */
    rt_sleep_ms(100);                                                   /* past the timeout */
    assert_int_equal(rt_count(EV_DONE), 0);                             /* fn never ran */
    /* many pending at once, and one that would time out: all freed, none called */
    client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client,
          (cmd_t){.to = srv, .type = T_HOLD, .timeout_ms = 20, .n = 100, .exit_after = true});
    assert_true(rt_wait(EV_CLIENT_TERM, 5000, &ev));
    rt_sleep_ms(60);
    assert_int_equal(rt_count(EV_DONE), 0);
    krt_system_destroy(&sys);
}

static void test_relay_answers(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t worker = s_spawn(sys, &worker_b, NULL);
    krt_addr_t relay = s_spawn(sys, &srv_b, &worker), client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = relay, .type = T_RELAY, .n = 1, .base = 1});
    s_expect(0, 1, 7);
    /* the relay forgot the request: its stop answers nothing more */
    assert_int_equal(krt_system_send(sys, relay, T_EXIT, NULL, 0), 0);
    s_gone(sys, relay);
    rt_sleep_ms(50); /* what its stop sent has arrived */
    assert_int_equal(s_count(sys, client), 1);
    assert_int_equal(rt_count(EV_DONE), 0);
    krt_system_destroy(&sys);
}

static void test_many_concurrent(void **unused)
{
    (void)unused;
    enum { N = 20000 };
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL), client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_ECHO, .timeout_ms = 20000, .n = N});
    static bool seen[N];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_DONE, 10000, &ev));
        assert_int_equal(ev.a, 0);
        assert_true(ev.b >= 0 && ev.b < N && !seen[ev.b]);
        assert_int_equal(ev.c, ev.b); /* each reply went to its own request */
        seen[ev.b] = true;
    }
    assert_int_equal(s_count(sys, client), N);
    /* half answered, half timed out, interleaved */
    rt_reset();
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_ECHO, .timeout_ms = 20000, .n = 50});
    s_cmd(sys, client, (cmd_t){.to = srv, .type = T_HOLD, .timeout_ms = 10, .n = 50, .base = 50});
    int ok = 0, timed_out = 0;
    for (int i = 0; i < 100; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_DONE, 5000, &ev));
        ok += ev.a == 0 && ev.b < 50;
        timed_out += ev.a == KRT_ETIMEDOUT && ev.b >= 50;
    }
    assert_int_equal(ok, 50);
    assert_int_equal(timed_out, 50);
    krt_system_destroy(&sys);
}

/* Timeouts that fire while their replies wait in the mailbox: each request completes once. */
static void test_timeout_racing_reply(void **unused)
{
    (void)unused;
    enum { N = 300, ROUNDS = 20 };
    krt_system_t *sys = rt_system(2);
    krt_addr_t srv = s_spawn(sys, &srv_b, NULL), client = s_spawn(sys, &client_b, NULL);
    static int seen[N * ROUNDS];
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < ROUNDS; r++)
        s_cmd(sys, client,
              (cmd_t){
                  .to = srv, .type = T_ECHO, .timeout_ms = 1, .n = N, .base = r * N, .busy_ms = 3});
    for (int i = 0; i < N * ROUNDS; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_DONE, 10000, &ev));
        assert_true(ev.a == 0 || ev.a == KRT_ETIMEDOUT);
        assert_true(ev.b >= 0 && ev.b < N * ROUNDS);
        seen[ev.b]++;
    }
    for (int i = 0; i < N * ROUNDS; i++)
        assert_int_equal(seen[i], 1);
    rt_sleep_ms(20);
    assert_int_equal(rt_count(EV_DONE), 0);
    assert_int_equal(s_count(sys, client), N * ROUNDS);
    krt_system_destroy(&sys);
}

static void test_request_to_self(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t client = s_spawn(sys, &client_b, NULL);
    s_cmd(sys, client,
          (cmd_t){.to = client, .type = T_ECHO, .timeout_ms = 1000, .n = 3, .base = 9});
    s_expect(0, 9, 9);
    s_expect(0, 10, 10);
    s_expect(0, 11, 11);
    /* to self, never answered: the timeout still fires */
    s_cmd(sys, client, (cmd_t){.to = client, .type = T_HOLD, .timeout_ms = 20, .n = 1, .base = 1});
    s_expect(KRT_ETIMEDOUT, 1, -1);
    krt_system_destroy(&sys);
}

/* A request that cannot be sent fails through an error reply the runtime queues to the caller
 * itself: it comes after what the caller sent itself earlier in the same handler (which may
 * still wait in the scheduler's outgoing batch). */
typedef struct {
    int seen; /* T_ECHO messages handled */
} order_t;
static void order_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    (void)ctx;
    (void)user;
    (void)reply;
    rt_ev(EV_DONE, err, ((order_t *)state)->seen, 0);
}
static int order_init(krt_ctx_t *ctx, void *state, void *arg)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        krt_send(ctx, krt_self(ctx), T_ECHO, NULL, 0);
    return krt_request(ctx, *(const krt_addr_t *)arg, T_ECHO, NULL, 0, 1000, order_done, NULL);
}
static void order_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    (void)ctx;
    if (msg->type == T_ECHO)
        ((order_t *)state)->seen++;
}
static const krt_behaviour_t order_b = {
    .kind = "order", .state_size = sizeof(order_t), .init = order_init, .handle = order_handle};

static void test_error_after_own_sends(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    krt_addr_t gone = krt_node_addr(2); /* another node, and no transport: KRT_EREMOTE */
    s_spawn(sys, &order_b, &gone);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_DONE, 5000, &ev));
    assert_int_equal(ev.a, KRT_EREMOTE);
    assert_int_equal(ev.b, 3);
    krt_system_destroy(&sys);
}

/* Invalid arguments start nothing; an error reply needs a negative status. */
typedef struct {
    int rc_nofn, rc_status, rc_body;
} bad_t;
static bad_t s_bad;
static int bad_init(krt_ctx_t *ctx, void *state, void *arg)
{
    (void)state;
    (void)arg;
    s_bad.rc_nofn = krt_request(ctx, krt_self(ctx), T_ECHO, NULL, 0, 10, NULL, NULL);
    s_bad.rc_body = krt_request(ctx, krt_self(ctx), T_ECHO, NULL, 4, 10, client_done, NULL);
    s_bad.rc_status = krt_reply_error_to(ctx, krt_self(ctx), 1, 0, "no");
    rt_ev(EV_CLIENT_TERM, 0, 0, 0);
    return 0;
}
static const krt_behaviour_t bad_b = {.kind = "bad", .init = bad_init, .handle = srv_handle};

static void test_bad_arguments(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(1);
    s_spawn(sys, &bad_b, NULL);
    assert_true(rt_wait(EV_CLIENT_TERM, 5000, NULL));
    assert_int_equal(s_bad.rc_nofn, KRT_EINVAL);
    assert_int_equal(s_bad.rc_body, KRT_EINVAL);
    assert_int_equal(s_bad.rc_status, KRT_EINVAL);
    rt_sleep_ms(30);
    assert_int_equal(rt_count(EV_DONE), 0);
    krt_system_destroy(&sys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply_runs_in_callers_turn),
        cmocka_unit_test(test_error_reply),
        cmocka_unit_test(test_error_reply_call_async),
        cmocka_unit_test(test_timeout_then_late_reply_dropped),
        cmocka_unit_test(test_target_gone),
        cmocka_unit_test(test_caller_stops_first),
        cmocka_unit_test(test_relay_answers),
        cmocka_unit_test(test_many_concurrent),
        cmocka_unit_test(test_timeout_racing_reply),
        cmocka_unit_test(test_request_to_self),
        cmocka_unit_test(test_error_after_own_sends),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
