/*
 * Unit tests for the runtime core: spawn/send/call, links and monitors (including targets that
 * are already dead), request timeouts and late replies, registry, pointer messages, jobs and fd
 * readiness, tree dump, shutdown with live actors and full mailboxes, the idle spin that
 * adapts, work sharing that keeps a long turn's consumer, message node classes, and the order
 * spawned actors run in.
 */
#include "rt_test.h"

#include <stdatomic.h>
#include <stdio.h>

#include "krt_int.h" /* krt__reg_release: what a release looks at */
#include <unistd.h>

enum {
    T_ECHO = KRT_MSG_USER,
    T_INC,
    T_GET,
    T_EXIT_WITH,
    T_ASK,
    T_ANSWER,
    T_NOW,
    T_PTR,
    T_PING,
};

enum { EV_DOWN = 1, EV_EXIT, EV_TERM, EV_ANSWER, EV_OTHER, EV_JOB, EV_FD, EV_PTR, EV_INIT };

/* ---------------------------------------------------------------------------------------- */
/* Behaviours                                                                                 */

static void echo_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_ECHO || msg->type == T_PING)
        krt_reply(ctx, msg, msg->type, msg->body, msg->len);
    else if (msg->type == T_EXIT_WITH)
        krt_exit(ctx, *(const int *)msg->body);
}
static const krt_behaviour_t echo_b = {.kind = "echo", .handle = echo_handle};

typedef struct {
    long n;
} counter_t;
static void counter_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    counter_t *c = state;
    if (msg->type == T_INC)
        c->n++;
    else if (msg->type == T_GET)
        krt_reply(ctx, msg, T_GET, &c->n, sizeof c->n);
}
static void counter_describe(const void *state, char *out, size_t cap)
{
    snprintf(out, cap, "{\"n\":%ld}", ((const counter_t *)state)->n);
}
static const krt_behaviour_t counter_b = {.kind = "counter",
                                          .state_size = sizeof(counter_t),
                                          .handle = counter_handle,
                                          .describe = counter_describe};

enum { W_MON, W_LINK, W_LINK_TRAP };
typedef struct {
    krt_addr_t target;
    int mode;
} watch_arg_t;
typedef struct {
    krt_addr_t target;
    uint64_t ref;
} watch_t;
static int watch_init(krt_ctx_t *ctx, void *state, void *arg)
{
    watch_t *w = state;
    const watch_arg_t *a = arg;
    w->target = a->target;
    if (a->mode == W_MON) {
        w->ref = krt_monitor(ctx, a->target);
    } else {
        krt_trap_exit(ctx, a->mode == W_LINK_TRAP);
        krt_link(ctx, a->target);
    }
    return 0;
}
static void watch_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    watch_t *w = state;
    if (msg->type == KRT_MSG_DOWN) {
        const krt_down_t *d = msg->body;
        rt_ev(EV_DOWN, d->reason, d->who == w->target, d->ref == w->ref);
    } else if (msg->type == KRT_MSG_EXIT) {
        const krt_exit_t *e = msg->body;
        rt_ev(EV_EXIT, e->reason, e->who == w->target, 0);
    } else if (msg->type == T_EXIT_WITH) {
        krt_exit(ctx, *(const int *)msg->body);
    }
}
static void watch_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    rt_ev(EV_TERM, reason, 0, 0);
}
static const krt_behaviour_t watch_b = {.kind = "watch",
                                        .state_size = sizeof(watch_t),
                                        .init = watch_init,
                                        .handle = watch_handle,
                                        .terminate = watch_terminate};

/* Keeps one request and answers it only when told (T_NOW). */
typedef struct {
    krt_addr_t from;
    uint64_t ref;
} silent_t;
static void silent_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    silent_t *s = state;
    if (msg->type == T_ASK) {
        s->from = msg->from;
        s->ref = msg->ref;
    } else if (msg->type == T_PING) {
        krt_reply(ctx, msg, T_PING, NULL, 0);
    } else if (msg->type == T_NOW) {
        int v = 42;
        krt_reply_to(ctx, s->from, s->ref, T_ANSWER, &v, sizeof v);
    }
}
static const krt_behaviour_t silent_b = {
    .kind = "silent", .state_size = sizeof(silent_t), .handle = silent_handle};

static void ping_sync(krt_system_t *sys, krt_addr_t a)
{
    krt_reply_t r;
    assert_int_equal(krt_call(sys, a, T_PING, NULL, 0, 5000, &r), 0);
    krt_reply_free(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* Tests                                                                                      */

static void test_call_and_count(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t echo, counter;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &echo), 0);
    assert_int_equal(krt_system_spawn(sys, &counter_b, NULL, NULL, &counter), 0);
    assert_int_equal(krt_addr_node(echo), 1);
    krt_reply_t r;
    assert_int_equal(krt_call(sys, echo, T_ECHO, "hello", 6, 5000, &r), 0);
    assert_int_equal(r.type, T_ECHO);
    assert_int_equal(r.len, 6);
    assert_string_equal(r.body, "hello");
    krt_reply_free(&r);
    /* a body larger than the inline size */
    char big[4000];
    memset(big, 'x', sizeof big);
    assert_int_equal(krt_call(sys, echo, T_ECHO, big, sizeof big, 5000, &r), 0);
    assert_int_equal(r.len, sizeof big);
    assert_memory_equal(r.body, big, sizeof big);
    krt_reply_free(&r);
    for (int i = 0; i < 20000; i++)
        assert_int_equal(krt_system_send(sys, counter, T_INC, NULL, 0), 0);
    assert_int_equal(krt_call(sys, counter, T_GET, NULL, 0, 5000, &r), 0);
    assert_int_equal(*(long *)r.body, 20000);
    krt_reply_free(&r);
    /* a stopped actor: sends and calls fail, its address is never reused */
    int reason = 7;
    assert_int_equal(krt_system_send(sys, echo, T_EXIT_WITH, &reason, sizeof reason), 0);
    krt_stats_t st;
    for (int i = 0; i < 500; i++) {
        krt_system_stats(sys, &st);
        if (st.actors_live == 1)
            break;
        rt_sleep_ms(2);
    }
    assert_int_equal(st.actors_live, 1);
    assert_true(st.bytes_live >= sizeof(counter_t) + 100 && st.bytes_live < 4096);
    assert_true(st.actors_spawned >= 2);
    assert_int_equal(krt_call(sys, echo, T_ECHO, "x", 1, 1000, &r), KRT_ENOACTOR);
    assert_int_equal(krt_system_send(sys, echo, T_ECHO, "x", 1), KRT_ENOACTOR);
    krt_addr_t again;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &again), 0);
    assert_true(again != echo);
    assert_int_equal(krt_system_send(sys, echo, T_ECHO, "x", 1), KRT_ENOACTOR);
    assert_true(st.messages >= 20000);
    assert_int_equal(krt_call(sys, KRT_ADDR_NONE, T_ECHO, NULL, 0, 100, &r), KRT_ENOACTOR);
    krt_system_destroy(&sys);
    assert_null(sys);
    krt_system_destroy(&sys);
}

static void test_wait_reason(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &a), 0);
    assert_int_equal(krt_system_wait(sys, a, 50), KRT_ETIMEDOUT);
    int reason = 12;
    assert_int_equal(krt_system_send(sys, a, T_EXIT_WITH, &reason, sizeof reason), 0);
    int got = krt_system_wait(sys, a, 5000);
    assert_true(got == 12 || got == KRT_ENOACTOR);
    assert_int_equal(krt_system_wait(sys, a, 10), KRT_ENOACTOR);
    krt_system_destroy(&sys);
}

static void test_monitor_and_link_dead_target(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t dead;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &dead), 0);
    krt_system_kill(sys, dead, KRT_EXIT_KILLED);
    while (krt_system_send(sys, dead, T_PING, NULL, 0) == 0)
        rt_sleep_ms(1);

    static watch_arg_t mon, trap, plain;
    mon = (watch_arg_t){dead, W_MON};
    trap = (watch_arg_t){dead, W_LINK_TRAP};
    plain = (watch_arg_t){dead, W_LINK};
    krt_addr_t w1, w2, w3;
    rt_ev_t ev = {0};
    assert_int_equal(krt_system_spawn(sys, &watch_b, &mon, NULL, &w1), 0);
    assert_true(rt_wait(EV_DOWN, 5000, &ev));
    assert_int_equal(ev.a, KRT_EXIT_NOPROC);
    assert_int_equal(ev.b, 1);
    assert_int_equal(ev.c, 1);
    assert_int_equal(krt_system_spawn(sys, &watch_b, &trap, NULL, &w2), 0);
    assert_true(rt_wait(EV_EXIT, 5000, &ev));
    assert_int_equal(ev.a, KRT_EXIT_NOPROC);
    assert_int_equal(ev.b, 1);
    /* not trapping: linking to a dead actor kills the linker with NOPROC */
    assert_int_equal(krt_system_spawn(sys, &watch_b, &plain, NULL, &w3), 0);
    assert_true(rt_wait(EV_TERM, 5000, &ev));
    assert_int_equal(ev.a, KRT_EXIT_NOPROC);
    assert_int_equal(rt_count(EV_TERM), 0);
    krt_system_destroy(&sys);
    /* shutdown terminated the two live watchers */
    assert_int_equal(rt_count(EV_TERM), 2);
}

static void test_monitor_and_link_live_target(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t t1, t2, t3;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &t1), 0);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &t2), 0);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &t3), 0);
    static watch_arg_t mon, trap, plain;
    mon = (watch_arg_t){t1, W_MON};
    trap = (watch_arg_t){t2, W_LINK_TRAP};
    plain = (watch_arg_t){t3, W_LINK};
    krt_addr_t w1, w2, w3;
    assert_int_equal(krt_system_spawn(sys, &watch_b, &mon, NULL, &w1), 0);
    assert_int_equal(krt_system_spawn(sys, &watch_b, &trap, NULL, &w2), 0);
    assert_int_equal(krt_system_spawn(sys, &watch_b, &plain, NULL, &w3), 0);
    /* make sure the links/monitors are established (the watchers ran init) */
    ping_sync(sys, t1);
    rt_sleep_ms(20);
    int r9 = 9, rn = KRT_EXIT_NORMAL;
    rt_ev_t ev = {0};
    krt_system_send(sys, t1, T_EXIT_WITH, &r9, sizeof r9);
    assert_true(rt_wait(EV_DOWN, 5000, &ev));
    assert_int_equal(ev.a, 9);
    assert_int_equal(ev.b, 1);
    assert_int_equal(ev.c, 1);
    krt_system_send(sys, t2, T_EXIT_WITH, &r9, sizeof r9);
    assert_true(rt_wait(EV_EXIT, 5000, &ev));
    assert_int_equal(ev.a, 9);
    assert_int_equal(ev.b, 1);
    /* a normal exit does not kill a linked actor; an abnormal one does */
    krt_system_send(sys, t3, T_EXIT_WITH, &rn, sizeof rn);
    rt_sleep_ms(50);
    assert_int_equal(rt_count(EV_TERM), 0);
    krt_addr_t t4;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &t4), 0);
    static watch_arg_t plain2;
    plain2 = (watch_arg_t){t4, W_LINK};
    krt_addr_t w4;
    assert_int_equal(krt_system_spawn(sys, &watch_b, &plain2, NULL, &w4), 0);
    rt_sleep_ms(20);
    krt_system_send(sys, t4, T_EXIT_WITH, &r9, sizeof r9);
    assert_true(rt_wait(EV_TERM, 5000, &ev));
    assert_int_equal(ev.a, 9);
    /* and the link is bidirectional: killing the watcher kills its target */
    krt_addr_t t5, w5;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &t5), 0);
    static watch_arg_t plain3;
    plain3 = (watch_arg_t){t5, W_LINK};
    assert_int_equal(krt_system_spawn(sys, &watch_b, &plain3, NULL, &w5), 0);
    rt_sleep_ms(20);
    int r11 = 11;
    krt_system_send(sys, w5, T_EXIT_WITH, &r11, sizeof r11);
    assert_true(rt_wait(EV_TERM, 5000, &ev));
    assert_int_equal(ev.a, 11);
    for (int i = 0; i < 500 && krt_system_send(sys, t5, T_PING, NULL, 0) == 0; i++)
        rt_sleep_ms(2);
    assert_int_equal(krt_system_send(sys, t5, T_PING, NULL, 0), KRT_ENOACTOR);
    krt_system_destroy(&sys);
}

/* Actors spawned from outside the schedulers (as bridges spawn a stream sink per call) and
 * freed on them: the schedulers' spare actor blocks stay within their byte budget, so a node's
 * memory does not creep up with every request. */
typedef struct {
    char pad[600];
} wide_t;
static atomic_int wide_gone;
static void wide_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    (void)state;
    (void)msg;
    krt_exit(ctx, KRT_EXIT_NORMAL);
}
static void wide_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    (void)ctx;
    (void)state;
    (void)reason;
    atomic_fetch_add(&wide_gone, 1);
}
static const krt_behaviour_t wide_b = {.kind = "wide",
                                       .state_size = sizeof(wide_t),
                                       .handle = wide_handle,
                                       .terminate = wide_terminate};

static uint64_t wide_round(krt_system_t *sys, int n)
{
    atomic_store(&wide_gone, 0);
    for (int i = 0; i < n; i++) {
        krt_addr_t a;
        assert_int_equal(krt_system_spawn(sys, &wide_b, NULL, NULL, &a), 0);
        assert_int_equal(krt_system_send(sys, a, T_PING, NULL, 0), 0);
    }
    for (int waited = 0; atomic_load(&wide_gone) < n && waited < 10000; waited++)
        rt_sleep_ms(1);
    assert_int_equal(atomic_load(&wide_gone), n);
    rt_sleep_ms(20); /* the last frees run after terminate */
    krt_stats_t st;
    krt_system_stats(sys, &st);
    return st.bytes_spare;
}

static void test_actor_cache_bounded(void **unused)
{
    krt_system_t *sys = rt_system(2);
    uint64_t few = wide_round(sys, 200);
    uint64_t many = wide_round(sys, 8000);
    /* 8000 blocks of ~750 B are 6 MB; two schedulers may keep 512 KiB each */
    print_message("spare actor blocks: %llu bytes after 200 actors, %llu after 8000\n",
                  (unsigned long long)few, (unsigned long long)many);
    assert_true(few > 0);
    assert_true(many <= 1024 * 1024);
    krt_system_destroy(&sys);
}

static void test_call_timeout_and_async(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t silent, echo;
    assert_int_equal(krt_system_spawn(sys, &silent_b, NULL, NULL, &silent), 0);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &echo), 0);
    krt_reply_t r;
    uint64_t t0 = krt_now_ms();
    assert_int_equal(krt_call(sys, silent, T_ASK, NULL, 0, 50, &r), KRT_ETIMEDOUT);
    assert_true(krt_now_ms() - t0 >= 45);
    /* deferred reply to the timed-out call is harmless */
    krt_system_send(sys, silent, T_NOW, NULL, 0);
    assert_int_equal(krt_call(sys, echo, T_ECHO, "z", 2, 5000, &r), 0);
    krt_reply_free(&r);
    krt_system_destroy(&sys);
}

typedef struct {
    int err;
    uint32_t len;
    char body[16];
} async_res_t;
static void async_cb(void *user, int err, const krt_msg_t *reply)
{
    async_res_t *res = user;
    res->err = err;
    if (reply) {
        res->len = reply->len;
        memcpy(res->body, reply->body, reply->len < 16 ? reply->len : 16);
    }
    rt_ev(EV_ANSWER, err, 0, 0);
}

static void test_call_async(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t silent, echo;
    assert_int_equal(krt_system_spawn(sys, &silent_b, NULL, NULL, &silent), 0);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &echo), 0);
    static async_res_t a1, a2;
    rt_ev_t ev = {0};
    assert_int_equal(krt_call_async(sys, echo, T_ECHO, "abc", 4, 1000, async_cb, &a1), 0);
    assert_true(rt_wait(EV_ANSWER, 5000, &ev));
    assert_int_equal(a1.err, 0);
    assert_string_equal(a1.body, "abc");
    assert_int_equal(krt_call_async(sys, silent, T_ASK, NULL, 0, 30, async_cb, &a2), 0);
    assert_true(rt_wait(EV_ANSWER, 5000, &ev));
    assert_int_equal(a2.err, KRT_ETIMEDOUT);
    krt_system_send(sys, silent, T_NOW, NULL, 0); /* late: no second callback */
    rt_sleep_ms(30);
    assert_int_equal(rt_count(EV_ANSWER), 0);
    /* failing to start: no callback */
    assert_int_equal(krt_call_async(sys, silent + 12345, T_ASK, NULL, 0, 30, async_cb, &a2),
                     KRT_ENOACTOR);
    /* deferred reply via krt_reply_to for krt_call */
    assert_int_equal(krt_call_async(sys, silent, T_ASK, NULL, 0, 5000, async_cb, &a2), 0);
    krt_system_send(sys, silent, T_NOW, NULL, 0);
    assert_true(rt_wait(EV_ANSWER, 5000, &ev));
    assert_int_equal(a2.err, 0);
    assert_int_equal(*(int *)a2.body, 42);
    krt_system_destroy(&sys);
}

static void test_registry(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t a, b;
    krt_spawn_opts_t o = {.name = "alpha", .register_name = true};
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, &o, &a), 0);
    assert_int_equal(krt_whereis(sys, "alpha"), a);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, &o, &b), KRT_EEXIST);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &b), 0);
    assert_int_equal(krt_register(sys, "alpha", b), KRT_EEXIST);
    assert_int_equal(krt_register(sys, "beta", b), 0);
    assert_int_equal(krt_register(sys, "beta2", b), 0);
    assert_int_equal(krt_whereis(sys, "beta"), b);
    assert_int_equal(krt_unregister(sys, "beta2"), 0);
    assert_int_equal(krt_unregister(sys, "beta2"), KRT_ENOACTOR);
    assert_int_equal(krt_whereis(sys, "nope"), KRT_ADDR_NONE);
    /* a remote address can be registered */
    krt_addr_t remote = ((krt_addr_t)7 << 48) | 99;
    assert_int_equal(krt_register(sys, "far", remote), 0);
    assert_int_equal(krt_whereis(sys, "far"), remote);
    /* names go away with their actor */
    int r = 0;
    krt_system_send(sys, b, T_EXIT_WITH, &r, sizeof r);
    for (int i = 0; i < 500 && krt_whereis(sys, "beta") != KRT_ADDR_NONE; i++)
        rt_sleep_ms(2);
    assert_int_equal(krt_whereis(sys, "beta"), KRT_ADDR_NONE);
    assert_int_equal(krt_register(sys, "gamma", b), KRT_ENOACTOR);
    assert_int_equal(krt_whereis(sys, "alpha"), a);
    /* many names */
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(krt_register(sys, name, a), 0);
    }
    assert_int_equal(krt_whereis(sys, "n999"), a);
    krt_system_destroy(&sys);
}

/* Releasing an actor's names looks at its names only (plus one address bucket's chain), not at
 * every name registered: 20,000 other names change nothing. A name taken over by another actor
 * after unregister stays with it when the old holder stops. */
static void test_registry_release_is_per_actor(void **unused)
{
    krt_system_t *sys = rt_system(2);
    char name[48];
    for (uint64_t i = 0; i < 20000; i++) { /* remote holders: never released on their own */
        snprintf(name, sizeof name, "other/%llu", (unsigned long long)i);
        assert_int_equal(krt_register(sys, name, ((krt_addr_t)7 << 48) | (i + 1)), 0);
    }
    krt_addr_t a, b;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &a), 0);
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &b), 0);
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "a/%d", i);
        assert_int_equal(krt_register(sys, name, a), 0);
    }
    assert_int_equal(krt_register(sys, "taken-over", a), 0);
    assert_int_equal(krt_unregister(sys, "taken-over"), 0);
    assert_int_equal(krt_register(sys, "taken-over", b), 0);
    /* the same release the runtime runs when a registered actor stops, on a copy of a's
     * address held by nobody: it looks at a's three names and a short chain */
    krt_addr_t far = ((krt_addr_t)9 << 48) | 5;
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "far/%d", i);
        assert_int_equal(krt_register(sys, name, far), 0);
    }
    size_t seen = krt__reg_release(sys, far);
    print_message("release of 3 names among 20,006: %zu entries looked at\n", seen);
    assert_true(seen >= 3 && seen <= 3 + 8);
    assert_int_equal(krt_whereis(sys, "far/0"), KRT_ADDR_NONE);
    assert_int_equal(krt_whereis(sys, "far/2"), KRT_ADDR_NONE);
    /* a stops: its names go, b's and the others stay */
    int r = 0;
    krt_system_send(sys, a, T_EXIT_WITH, &r, sizeof r);
    assert_int_not_equal(krt_system_wait(sys, a, 5000), KRT_ETIMEDOUT);
    for (int i = 0; i < 500 && krt_whereis(sys, "a/0") != KRT_ADDR_NONE; i++)
        rt_sleep_ms(2);
    assert_int_equal(krt_whereis(sys, "a/0"), KRT_ADDR_NONE);
    assert_int_equal(krt_whereis(sys, "a/2"), KRT_ADDR_NONE);
    assert_int_equal(krt_whereis(sys, "taken-over"), b);
    assert_int_equal(krt_whereis(sys, "other/0"), ((krt_addr_t)7 << 48) | 1);
    assert_int_equal(krt_whereis(sys, "other/19999"), ((krt_addr_t)7 << 48) | 20000);
    assert_int_equal(krt_unregister(sys, "other/77"), 0);
    assert_int_equal(krt_whereis(sys, "other/77"), KRT_ADDR_NONE);
    krt_system_destroy(&sys);
}

/* Pointer messages: taken bodies are not freed, others are freed once. */
static _Atomic int freed_count;
static void counting_free(void *p)
{
    freed_count++;
    free(p);
}
static void taker_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_PTR && *(const int *)msg->body % 2 == 0) {
        int *p = krt_msg_take(ctx, msg);
        rt_ev(EV_PTR, *p, 0, 0);
        free(p);
    } else if (msg->type == T_PING) {
        krt_reply(ctx, msg, T_PING, NULL, 0);
    }
}
static const krt_behaviour_t taker_b = {.kind = "taker", .handle = taker_handle};

typedef struct {
    krt_addr_t to;
    int n;
} sender_arg_t;
static int sender_init(krt_ctx_t *ctx, void *state, void *arg)
{
    const sender_arg_t *a = arg;
    for (int i = 0; i < a->n; i++) {
        int *p = malloc(sizeof *p);
        *p = i;
        krt_send_ptr(ctx, a->to, T_PTR, p, counting_free);
    }
    rt_ev(EV_OTHER, a->n, 0, 0);
    return 0;
}
static void noop_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
}
static const krt_behaviour_t sender_b = {
    .kind = "sender", .init = sender_init, .handle = noop_handle};

static void test_send_ptr(void **unused)
{
    krt_system_t *sys = rt_system(2);
    freed_count = 0;
    krt_addr_t taker, sender;
    assert_int_equal(krt_system_spawn(sys, &taker_b, NULL, NULL, &taker), 0);
    static sender_arg_t sa;
    sa = (sender_arg_t){taker, 100};
    assert_int_equal(krt_system_spawn(sys, &sender_b, &sa, NULL, &sender), 0);
    for (int i = 0; i < 50; i++)
        assert_true(rt_wait(EV_PTR, 5000, NULL));
    ping_sync(sys, taker);
    assert_int_equal(freed_count, 50);
    /* to a dead actor: freed at once */
    static sender_arg_t sb;
    sb = (sender_arg_t){taker + 999, 10};
    assert_int_equal(krt_system_spawn(sys, &sender_b, &sb, NULL, &sender), 0);
    for (int i = 0; i < 500 && freed_count < 60; i++)
        rt_sleep_ms(2);
    assert_int_equal(freed_count, 60);
    krt_system_destroy(&sys);
}

/* Jobs and fd readiness. */
static int job_fn(void *arg)
{
    rt_sleep_ms(5);
    return (int)(intptr_t)arg * 2;
}
typedef struct {
    uint64_t ref;
    int fd;
} io_t;
static int io_init(krt_ctx_t *ctx, void *state, void *arg)
{
    io_t *s = state;
    s->fd = (int)(intptr_t)arg;
    assert_int_equal(krt_job_submit(ctx, job_fn, (void *)(intptr_t)21, &s->ref), 0);
    return krt_fd_watch(ctx, s->fd, KRT_FD_READ, 77);
}
static void io_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    io_t *s = state;
    if (msg->type == KRT_MSG_JOB_DONE) {
        const krt_job_done_t *d = msg->body;
        rt_ev(EV_JOB, d->result, msg->ref == s->ref, (intptr_t)d->arg);
    } else if (msg->type == KRT_MSG_FD_READY) {
        const krt_fd_event_t *e = msg->body;
        char buf[16];
        ssize_t n = read(e->fd, buf, sizeof buf);
        rt_ev(EV_FD, e->fd == s->fd, (int64_t)e->tag, n);
        krt_fd_watch(ctx, s->fd, KRT_FD_READ, 78);
    }
}
static void io_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    krt_fd_unwatch(ctx, ((io_t *)state)->fd);
}
static const krt_behaviour_t io_b = {.kind = "io",
                                     .state_size = sizeof(io_t),
                                     .init = io_init,
                                     .handle = io_handle,
                                     .terminate = io_terminate};

static void test_jobs_and_fds(void **unused)
{
    krt_system_t *sys = rt_system(2);
    int p[2];
    assert_int_equal(pipe(p), 0);
    krt_addr_t io;
    assert_int_equal(krt_system_spawn(sys, &io_b, (void *)(intptr_t)p[0], NULL, &io), 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_JOB, 5000, &ev));
    assert_int_equal(ev.a, 42);
    assert_int_equal(ev.b, 1);
    assert_int_equal(ev.c, 21);
    rt_sleep_ms(20);
    assert_int_equal(rt_count(EV_FD), 0); /* nothing to read yet */
    assert_int_equal(write(p[1], "abc", 3), 3);
    assert_true(rt_wait(EV_FD, 5000, &ev));
    assert_int_equal(ev.a, 1);
    assert_int_equal(ev.b, 77);
    assert_int_equal(ev.c, 3);
    assert_int_equal(write(p[1], "de", 2), 2);
    assert_true(rt_wait(EV_FD, 5000, &ev));
    assert_int_equal(ev.b, 78);
    assert_int_equal(ev.c, 2);
    krt_system_destroy(&sys);
    close(p[0]);
    close(p[1]);
}

/* Tree dump. */
static void test_tree_json(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_child_spec_t kids[] = {
        {"count-a", &counter_b, NULL, KRT_PERMANENT, false},
        {"echo-b", &echo_b, NULL, KRT_PERMANENT, false},
    };
    krt_sup_spec_t spec = {KRT_ONE_FOR_ONE, 3, 1000, kids, 2};
    krt_spawn_opts_t o = {.name = "top"};
    krt_addr_t sup;
    assert_int_equal(krt_supervisor_spawn(sys, NULL, &spec, &o, &sup), 0);
    krt_addr_t ca = KRT_ADDR_NONE;
    for (int i = 0; i < 500 && ca == KRT_ADDR_NONE; i++) {
        ca = krt_supervisor_child(sys, sup, "count-a");
        rt_sleep_ms(1);
    }
    assert_true(ca != KRT_ADDR_NONE);
    for (int i = 0; i < 5; i++)
        krt_system_send(sys, ca, T_INC, NULL, 0);
    krt_reply_t r;
    assert_int_equal(krt_call(sys, ca, T_GET, NULL, 0, 5000, &r), 0);
    krt_reply_free(&r);
    /* an actor busy at that instant shows "state":null: retry until it is idle */
    char *json = NULL;
    for (int i = 0; i < 500; i++) {
        free(json);
        json = krt_tree_json(sys, KRT_ADDR_NONE);
        assert_non_null(json);
        if (strstr(json, "\"state\":{\"n\":5}"))
            break;
        rt_sleep_ms(1);
    }
    assert_non_null(strstr(json, "\"kind\":\"supervisor\""));
    assert_non_null(strstr(json, "\"path\":\"node-1/top\""));
    assert_non_null(strstr(json, "\"path\":\"node-1/top/count-a\""));
    assert_non_null(strstr(json, "\"state\":{\"n\":5}"));
    assert_non_null(strstr(json, "\"strategy\":\"one_for_one\""));
    assert_non_null(strstr(json, "\"handled\":"));
    assert_non_null(strstr(json, "\"mailbox\":0"));
    /* oldest child first */
    assert_true(strstr(json, "count-a") < strstr(json, "echo-b"));
    free(json);
    json = krt_tree_json(sys, ca);
    assert_non_null(json);
    assert_int_equal(json[0], '[');
    assert_non_null(strstr(json, "\"path\":\"node-1/top/count-a\""));
    assert_null(strstr(json, "supervisor"));
    free(json);
    json = krt_tree_json(sys, ca + 5555);
    assert_string_equal(json, "[]");
    free(json);
    krt_system_destroy(&sys);
}

/* The depth the tree shows during a long turn: the message being handled no longer waits, so
 * only the two sent meanwhile count. */
static _Atomic int gate_state; /* 1: in the handler; 2: let it return */

static void gate_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *m)
{
    if (atomic_load(&gate_state) != 0)
        return;
    atomic_store(&gate_state, 1);
    while (atomic_load(&gate_state) != 2)
        rt_sleep_ms(1);
}

static const krt_behaviour_t gate_b = {.kind = "gate", .handle = gate_handle};

static int s_depth(krt_system_t *sys, krt_addr_t a)
{
    char *json = krt_tree_json(sys, a);
    const char *m = json ? strstr(json, "\"mailbox\":") : NULL;
    int n = m ? atoi(m + strlen("\"mailbox\":")) : -1;
    free(json);
    return n;
}

static void test_depth_during_a_turn(void **unused)
{
    krt_system_t *sys = rt_system(2);
    atomic_store(&gate_state, 0);
    krt_addr_t g;
    assert_int_equal(krt_system_spawn(sys, &gate_b, NULL, NULL, &g), 0);
    assert_int_equal(krt_system_send(sys, g, T_INC, NULL, 0), 0);
    for (int i = 0; i < 5000 && atomic_load(&gate_state) != 1; i++)
        rt_sleep_ms(1);
    assert_int_equal(atomic_load(&gate_state), 1);
    assert_int_equal(s_depth(sys, g), 0);
    assert_int_equal(krt_system_send(sys, g, T_INC, NULL, 0), 0);
    assert_int_equal(krt_system_send(sys, g, T_INC, NULL, 0), 0);
    assert_int_equal(s_depth(sys, g), 2);
    atomic_store(&gate_state, 2);
    int depth = -1;
    for (int i = 0; i < 5000 && depth != 0; i++, rt_sleep_ms(1))
        depth = s_depth(sys, g);
    assert_int_equal(depth, 0);
    krt_system_destroy(&sys);
}

/* Shutdown: live actors with full mailboxes, trees stopped children first. */
static _Atomic int term_count;
static int64_t term_seq[64];
typedef struct {
    int id;
    int parent;
    int depth;
} tree_arg_t;
static tree_arg_t tree_args[64];
static const krt_behaviour_t tree_b;
static int tree_init(krt_ctx_t *ctx, void *state, void *arg)
{
    const tree_arg_t *a = arg;
    *(int *)state = a->id;
    rt_ev(EV_INIT, a->id, 0, 0);
    if (a->depth < 2) {
        for (int k = 0; k < 3; k++) {
            int id = a->id * 3 + k + 1;
            tree_args[id] = (tree_arg_t){id, a->id, a->depth + 1};
            krt_spawn(ctx, &tree_b, &tree_args[id], NULL, NULL);
        }
    }
    return 0;
}
static void tree_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    term_seq[*(int *)state] = rt_seq();
    term_count++;
}
static const krt_behaviour_t tree_b = {.kind = "tree",
                                       .state_size = sizeof(int),
                                       .init = tree_init,
                                       .handle = noop_handle,
                                       .terminate = tree_terminate};

static void slow_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_PTR)
        rt_sleep_ms(1);
}
static const krt_behaviour_t slow_b = {.kind = "slow", .handle = slow_handle};

/* A supervised child with register_name is found by name, and again under its new address
 * after a crash; a start with a taken name fails. Also measures one lookup. */
static void test_sup_registered_child(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_child_spec_t kids[] = {{"reg-echo", &echo_b, NULL, KRT_PERMANENT, true}};
    krt_sup_spec_t spec = {KRT_ONE_FOR_ONE, 3, 1000, kids, 1};
    krt_addr_t sup;
    assert_int_equal(krt_supervisor_spawn(sys, NULL, &spec, NULL, &sup), 0);
    krt_addr_t a = KRT_ADDR_NONE;
    for (int i = 0; i < 500 && a == KRT_ADDR_NONE; i++, rt_sleep_ms(1))
        a = krt_whereis(sys, "reg-echo");
    assert_true(a != KRT_ADDR_NONE);
    assert_int_equal(krt_supervisor_child(sys, sup, "reg-echo"), a);
    assert_int_equal(krt_system_kill(sys, a, KRT_EXIT_KILLED), 0);
    krt_addr_t b = a;
    for (int i = 0; i < 500 && (b == a || b == KRT_ADDR_NONE); i++, rt_sleep_ms(1))
        b = krt_whereis(sys, "reg-echo");
    assert_true(b != a && b != KRT_ADDR_NONE);
    assert_int_equal(krt_supervisor_child(sys, sup, "reg-echo"), b);
    ping_sync(sys, b);
    krt_child_spec_t dup = {"reg-echo-2", &echo_b, NULL, KRT_TEMPORARY, true};
    assert_int_equal(krt_register(sys, "reg-echo-2", b), 0);
    assert_int_equal(krt_supervisor_start_child(sys, sup, &dup, NULL), KRT_EEXIST);
    enum { N = 1000000 };
    int64_t t0 = krt_mono_ms();
    for (int i = 0; i < N; i++)
        assert_true(krt_whereis(sys, "reg-echo") == b);
    int64_t t1 = krt_mono_ms();
    print_message("krt_whereis: %.1f ns per lookup\n", (double)(t1 - t0) * 1e6 / N);
    krt_system_destroy(&sys);
}

static void test_shutdown_full_mailboxes(void **unused)
{
    krt_system_t *sys = rt_system(2);
    freed_count = 0;
    term_count = 0;
    tree_args[0] = (tree_arg_t){0, -1, 0};
    assert_int_equal(krt_system_spawn(sys, &tree_b, &tree_args[0], NULL, NULL), 0);
    krt_addr_t slow[20];
    int sent = 0;
    for (int i = 0; i < 20; i++) {
        assert_int_equal(krt_system_spawn(sys, &slow_b, NULL, NULL, &slow[i]), 0);
    }
    /* pointer bodies from outside go through an actor: use a sender per slow actor */
    static sender_arg_t sa[20];
    for (int i = 0; i < 20; i++) {
        sa[i] = (sender_arg_t){slow[i], 1000};
        assert_int_equal(krt_system_spawn(sys, &sender_b, &sa[i], NULL, NULL), 0);
        sent += 1000;
    }
    for (int i = 0; i < 13; i++)
        assert_true(rt_wait(EV_INIT, 5000, NULL));
    for (int i = 0; i < 20; i++)
        assert_true(rt_wait(EV_OTHER, 5000, NULL));
    for (int i = 0; i < 500; i++) {
        krt_stats_t st;
        krt_system_stats(sys, &st);
        if (st.actors_live >= 13 + 40)
            break;
        rt_sleep_ms(1);
    }
    rt_sleep_ms(20);
    uint64_t t0 = krt_now_ms();
    krt_system_stop(sys);
    assert_true(krt_now_ms() - t0 < 5000); /* not through 20,000 ms of queued messages */
    assert_int_equal(term_count, 13);
    for (int id = 1; id < 13; id++)
        assert_true(term_seq[id] < term_seq[tree_args[id].parent]);
    /* every pointer body was freed exactly once (handled ones after the handler) */
    assert_int_equal(freed_count, sent);
    krt_stats_t st;
    krt_system_stats(sys, &st);
    assert_int_equal(st.actors_live, 0);
    /* after stop: spawning fails */
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, NULL), KRT_ESHUTDOWN);
    krt_system_destroy(&sys);
}

static void test_destroy_never_started(void **unused)
{
    krt_config_t cfg = {.schedulers = 2};
    krt_system_t *sys = krt_system_new(&cfg);
    assert_non_null(sys);
    freed_count = 0;
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &counter_b, NULL, NULL, &a), 0);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(krt_system_send(sys, a, T_INC, NULL, 0), 0);
    krt_system_destroy(&sys);
    assert_null(sys);
}

/* Transport hook: sends to other nodes go through it; deliver injects. */
static int tp_sends;
static krt_addr_t tp_to;
static int tp_send(void *self, krt_addr_t to, const krt_msg_t *msg)
{
    tp_sends++;
    tp_to = to;
    return msg->len == 3 ? 0 : KRT_EMSGSIZE;
}

static void test_transport(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t remote = ((krt_addr_t)2 << 48) | 12345;
    assert_int_equal(krt_system_send(sys, remote, T_ECHO, "abc", 3), KRT_EREMOTE);
    krt_transport_t t = {tp_send, NULL, NULL};
    krt_system_set_transport(sys, &t);
    assert_int_equal(krt_system_send(sys, remote, T_ECHO, "abc", 3), 0);
    assert_int_equal(tp_sends, 1);
    assert_int_equal(tp_to, remote);
    assert_int_equal(krt_system_send(sys, remote, T_ECHO, "ab", 2), KRT_EMSGSIZE);
    krt_addr_t counter;
    assert_int_equal(krt_system_spawn(sys, &counter_b, NULL, NULL, &counter), 0);
    krt_msg_t m = {.type = T_INC, .from = remote};
    assert_int_equal(krt_system_deliver(sys, counter, &m), 0);
    assert_int_equal(krt_system_deliver(sys, counter, &m), 0);
    krt_reply_t r;
    assert_int_equal(krt_call(sys, counter, T_GET, NULL, 0, 5000, &r), 0);
    assert_int_equal(*(long *)r.body, 2);
    krt_reply_free(&r);
    assert_int_equal(krt_system_node_id(sys), 1);
    assert_string_equal(krt_strerror(KRT_ENOACTOR), "no such actor");
    krt_system_destroy(&sys);
}

/* A scheduler whose idle spells all end in a park (here: one call every 2 ms) polls its run
 * queues less and less before parking, down to KRT_SPIN_MIN (it started at KRT_SPIN_MAX). */
static void test_idle_spin_adapts(void **unused)
{
    krt_system_t *sys = rt_system(1);
    krt_addr_t echo;
    assert_int_equal(krt_system_spawn(sys, &echo_b, NULL, NULL, &echo), 0);
    for (int i = 0; i < 10; i++) {
        krt_reply_t r;
        assert_int_equal(krt_call(sys, echo, T_ECHO, "x", 1, 5000, &r), 0);
        krt_reply_free(&r);
        rt_sleep_ms(2);
    }
    assert_int_equal(__atomic_load_n(&sys->scheds[0].spin, __ATOMIC_RELAXED), KRT_SPIN_MIN);
    krt_system_destroy(&sys);
}

/* ---------------------------------------------------------------------------------------- */
/* Work sharing: a long turn's sends to one actor do not hand that actor to the idle scheduler
 * (a producer and its consumer on two cores moved every message's line between them). */

enum { STREAM_N = 20000 };
static atomic_long s_tallied;

static void tally_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_INC)
        atomic_fetch_add(&s_tallied, 1);
    else if (msg->type == T_GET)
        krt_reply(ctx, msg, T_GET, NULL, 0);
}
static const krt_behaviour_t tally_b = {.kind = "tally", .handle = tally_handle};

/* On T_GO (body: the tally's address) sends it STREAM_N messages in one turn; EV_OTHER: how
 * many it had handled when the turn's sends were done. */
static void streamer_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    krt_addr_t to = *(const krt_addr_t *)msg->body;
    for (int i = 0; i < STREAM_N; i++)
        krt_send(ctx, to, T_INC, NULL, 0);
    rt_ev(EV_OTHER, atomic_load(&s_tallied), 0, 0);
}
static const krt_behaviour_t streamer_b = {.kind = "streamer", .handle = streamer_handle};

/* Two schedulers, one idle: the tally runs after the streamer's turn, and gets every message. */
static void test_stream_target_not_shared(void **unused)
{
    atomic_store(&s_tallied, 0);
    krt_system_t *sys = rt_system(2);
    krt_addr_t tally, streamer;
    assert_int_equal(krt_system_spawn(sys, &tally_b, NULL, NULL, &tally), 0);
    assert_int_equal(krt_system_spawn(sys, &streamer_b, NULL, NULL, &streamer), 0);
    krt_reply_t r;
    assert_int_equal(krt_call(sys, tally, T_GET, NULL, 0, 5000, &r), 0);
    krt_reply_free(&r);
    rt_sleep_ms(20); /* the tally has gone idle: it is not running elsewhere when sends start */
    assert_int_equal(krt_system_send(sys, streamer, T_PING, &tally, sizeof tally), 0);
    rt_ev_t ev;
    assert_true(rt_wait(EV_OTHER, 10000, &ev));
    assert_int_equal(ev.a, 0);
    for (int i = 0; i < 5000 && atomic_load(&s_tallied) < STREAM_N; i++)
        rt_sleep_ms(1);
    assert_int_equal(atomic_load(&s_tallied), STREAM_N);
    krt_system_destroy(&sys);
}

/* ---------------------------------------------------------------------------------------- */
/* Message node classes: body-less, inline and big bodies in one stream, from an actor and from
 * outside the schedulers, keep their bytes and their order through spills and refills of both
 * classes' free stacks (a 64-byte node must never carry a body). */

enum { MIX_N = 6000 };
static const uint32_t s_mix_len[] = {0, 1, 0, 8, 0, KRT_INLINE_CAP, KRT_INLINE_CAP + 1, 300};
enum { MIX_K = sizeof s_mix_len / sizeof s_mix_len[0] };

static void mix_fill(unsigned char *b, uint32_t len, uint32_t seq)
{
    for (uint32_t i = 0; i < len; i++)
        b[i] = (unsigned char)(seq * 31u + i * 7u);
}

/* Checks each stream (by sender) in order; EV_OTHER when both are done: (good, bad). */
typedef struct {
    uint32_t next[2];
    long good, bad;
} mixcheck_t;
static void mixcheck_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    mixcheck_t *m = state;
    int from_actor = msg->from != KRT_ADDR_NONE;
    uint32_t seq = m->next[from_actor]++;
    uint32_t len = s_mix_len[seq % MIX_K];
    unsigned char want[400];
    mix_fill(want, len, seq);
    bool ok = msg->type == T_INC && msg->len == len && (!len || memcmp(msg->body, want, len) == 0);
    if (ok)
        m->good++;
    else
        m->bad++;
    if (m->next[0] == MIX_N && m->next[1] == MIX_N)
        rt_ev(EV_OTHER, m->good, m->bad, 0);
}
static const krt_behaviour_t mixcheck_b = {
    .kind = "mixcheck", .state_size = sizeof(mixcheck_t), .handle = mixcheck_handle};

static void mix_send_all(krt_ctx_t *ctx, krt_system_t *sys, krt_addr_t to)
{
    unsigned char b[400];
    for (uint32_t seq = 0; seq < MIX_N; seq++) {
        uint32_t len = s_mix_len[seq % MIX_K];
        mix_fill(b, len, seq);
        int rc = ctx ? krt_send(ctx, to, T_INC, len ? b : NULL, len)
                     : krt_system_send(sys, to, T_INC, len ? b : NULL, len);
        assert_int_equal(rc, 0);
    }
}
static void mixsend_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    mix_send_all(ctx, NULL, *(const krt_addr_t *)msg->body);
}
static const krt_behaviour_t mixsend_b = {.kind = "mixsend", .handle = mixsend_handle};

static void test_node_classes(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t check, sender;
    assert_int_equal(krt_system_spawn(sys, &mixcheck_b, NULL, NULL, &check), 0);
    assert_int_equal(krt_system_spawn(sys, &mixsend_b, NULL, NULL, &sender), 0);
    assert_int_equal(krt_system_send(sys, sender, T_PING, &check, sizeof check), 0);
    mix_send_all(NULL, sys, check);
    rt_ev_t ev;
    assert_true(rt_wait(EV_OTHER, 10000, &ev));
    assert_int_equal(ev.a, 2 * MIX_N);
    assert_int_equal(ev.b, 0);
    krt_system_destroy(&sys);
}

/* ---------------------------------------------------------------------------------------- */
/* Spawn order: a spawning tree runs depth-first (the young stack), yet neither the FIFO queue
 * nor the oldest young actor waits for an endless chain of spawns above it. */

static atomic_bool s_chain_stop;
static atomic_long s_chain_len;

static const krt_behaviour_t chain_b;
/* Each link spawns the next and exits, until the stopper runs. */
static int chain_init(krt_ctx_t *ctx, void *state, void *arg)
{
    atomic_fetch_add(&s_chain_len, 1);
    if (!atomic_load(&s_chain_stop))
        krt_spawn(ctx, &chain_b, NULL, NULL, NULL);
    krt_exit(ctx, KRT_EXIT_NORMAL);
    return 0;
}
static const krt_behaviour_t chain_b = {.kind = "chain", .init = chain_init, .handle = noop_handle};

/* Stops the chain from its init (arg not NULL) or on a message; EV_OTHER: the chain's length. */
static void stopper_stop(void)
{
    atomic_store(&s_chain_stop, true);
    rt_ev(EV_OTHER, atomic_load(&s_chain_len), 0, 0);
}
static int stopper_init(krt_ctx_t *ctx, void *state, void *arg)
{
    if (arg)
        stopper_stop();
    return 0;
}
static void stopper_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    stopper_stop();
}
static const krt_behaviour_t stopper_b = {
    .kind = "stopper", .init = stopper_init, .handle = stopper_handle};

/* Spawns a stopper that stops the chain from its init (arg not NULL), then the chain. */
static int chain_root_init(krt_ctx_t *ctx, void *state, void *arg)
{
    if (arg)
        krt_spawn(ctx, &stopper_b, arg, NULL, NULL);
    return krt_spawn(ctx, &chain_b, NULL, NULL, NULL);
}
static const krt_behaviour_t chain_root_b = {
    .kind = "chain_root", .init = chain_root_init, .handle = noop_handle};

/* One scheduler: the stopper, spawned first, sits under the chain's links on the young stack;
 * the chain runs before it (newest first), and it still runs within KRT_YOUNG_AGE pops. */
static void test_spawn_oldest_ages_out(void **unused)
{
    atomic_store(&s_chain_stop, false);
    atomic_store(&s_chain_len, 0);
    krt_system_t *sys = rt_system(1);
    assert_int_equal(krt_system_spawn(sys, &chain_root_b, (void *)1, NULL, NULL), 0);
    rt_ev_t ev;
    assert_true(rt_wait(EV_OTHER, 10000, &ev));
    assert_true(ev.a > 1);
    assert_true(ev.a <= KRT_YOUNG_AGE);
    krt_system_destroy(&sys);
}

/* One scheduler running an endless chain of spawns: an actor a message woke (FIFO queue) still
 * runs. */
static void test_spawn_chain_leaves_queue_served(void **unused)
{
    atomic_store(&s_chain_stop, false);
    atomic_store(&s_chain_len, 0);
    krt_system_t *sys = rt_system(1);
    krt_addr_t stopper;
    assert_int_equal(krt_system_spawn(sys, &stopper_b, NULL, NULL, &stopper), 0);
    assert_int_equal(krt_system_spawn(sys, &chain_root_b, NULL, NULL, NULL), 0);
    for (int i = 0; i < 5000 && atomic_load(&s_chain_len) < 1000; i++)
        rt_sleep_ms(1);
    assert_true(atomic_load(&s_chain_len) >= 1000);
    assert_int_equal(krt_system_send(sys, stopper, T_PING, NULL, 0), 0);
    assert_true(rt_wait(EV_OTHER, 10000, NULL));
    krt_system_destroy(&sys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_and_count),
        cmocka_unit_test(test_wait_reason),
        cmocka_unit_test(test_monitor_and_link_dead_target),
        cmocka_unit_test(test_monitor_and_link_live_target),
        cmocka_unit_test(test_call_timeout_and_async),
        cmocka_unit_test(test_actor_cache_bounded),
        cmocka_unit_test(test_call_async),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_registry_release_is_per_actor),
        cmocka_unit_test(test_send_ptr),
        cmocka_unit_test(test_jobs_and_fds),
        cmocka_unit_test(test_tree_json),
        cmocka_unit_test(test_depth_during_a_turn),
        cmocka_unit_test(test_sup_registered_child),
        cmocka_unit_test(test_shutdown_full_mailboxes),
        cmocka_unit_test(test_destroy_never_started),
        cmocka_unit_test(test_transport),
        cmocka_unit_test(test_idle_spin_adapts),
        cmocka_unit_test(test_stream_target_not_shared),
        cmocka_unit_test(test_node_classes),
        cmocka_unit_test(test_spawn_oldest_ages_out),
        cmocka_unit_test(test_spawn_chain_leaves_queue_served),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
