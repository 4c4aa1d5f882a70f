/*
 * Timers: the wheel alone at level boundaries (driven tick by tick with synthetic time), its lock
 * under two threads, actor timers in order, cancel and re-arm while the fired message is in
 * flight, 1 M timers armed with half cancelled, send_after, an actor stopping with armed timers,
 * and the clock read once per message.
 */
#include "../runtime/rt_test.h"
#include "krt_int.h"

enum { T_GO = KRT_MSG_USER, T_FIRE, T_CHECK, T_AFTER };
enum { EV_FIRE = 1, EV_CHECK, EV_DONE, EV_AFTER };

/* ---------------------------------------------------------------------------------------- */
/* The wheel on its own                                                                       */

typedef struct {
    krt_wheel_t *w;
    uint64_t fired, wrong;
} wheel_ctx_t;

static void wheel_fire(void *user, krt_tmr_t *t)
{
    wheel_ctx_t *c = user;
    c->fired++;
    if (c->w->now != t->expires)
        c->wrong++;
    t->state = 0;
}

/* jump: advance straight to krt__wheel_next each time, as a sleeping scheduler does; every
 * timer must still fire exactly at its expiry, in far fewer steps than ticks. */
static uint64_t run_wheel(uint64_t start, const uint64_t *deltas, size_t n, uint64_t randoms,
                          uint64_t max_random, bool jump)
{
    krt_wheel_t *w = malloc(sizeof *w);
    assert_non_null(w);
    krt__wheel_init(w, start);
    size_t total = n + randoms;
    krt_tmr_t *ts = calloc(total, sizeof *ts);
    assert_non_null(ts);
    uint64_t last = start, seed = 12345;
    for (size_t i = 0; i < total; i++) {
        uint64_t d;
        if (i < n) {
            d = deltas[i];
        } else {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            d = 1 + (seed >> 33) % max_random;
        }
        ts[i].expires = start + d;
        if (ts[i].expires > last)
            last = ts[i].expires;
        krt__wheel_add(w, &ts[i]);
    }
    assert_int_equal(w->count, total);
    wheel_ctx_t c = {w, 0, 0};
    /* uneven steps, as a busy scheduler would advance it */
    uint64_t now = start, steps = 0;
    while (now < last + 2) {
        uint64_t next = krt__wheel_next(w);
        if (jump && next == UINT64_MAX)
            break;
        assert_true(next > w->now);
        now = jump ? next : now + 1 + (now % 7 == 0 ? 5 : 0);
        krt__wheel_advance(w, now, wheel_fire, &c);
        steps++;
    }
    assert_int_equal(krt__wheel_next(w), UINT64_MAX);
    if (jump && total > 0)
        assert_true(steps < last - start);
    assert_int_equal(c.fired, total);
    assert_int_equal(c.wrong, 0);
    assert_int_equal(w->count, 0);
    free(ts);
    free(w);
    return steps;
}

static void test_wheel_boundaries(void **unused)
{
    static const uint64_t d[] = {1,        2,
                                 62,       63,
                                 64,       65,
                                 127,      128,
                                 129,      4095,
                                 4096,     4097,
                                 4159,     4160,
                                 8191,     8192,
                                 262143,   262144,
                                 262145,   266239,
                                 1 << 20,  (1 << 20) + 1,
                                 16777215, 16777216,
                                 16777217};
    const size_t n = sizeof d / sizeof d[0];
    for (int jump = 0; jump <= 1; jump++) {
        run_wheel(1000, d, n, 20000, 300000, jump);
        /* starting right before level boundaries */
        run_wheel(63, d, 21, 5000, 100000, jump);
        run_wheel(4095, d, 21, 5000, 100000, jump);
        run_wheel(262143, d, 21, 5000, 100000, jump);
        run_wheel(0, d, 21, 0, 1, jump);
    }
    /* a sparse wheel: a few far timers are reached in a few steps, not one per tick */
    static const uint64_t sparse[] = {5000, 70000, 300000};
    uint64_t steps = run_wheel(12345, sparse, 3, 0, 1, true);
    assert_true(steps <= 3 * KRT_WHEEL_LEVELS * 2);
}

/* The wheel's spin lock excludes: two threads (as a scheduler arming and another cancelling
 * across wheels) increment a plain counter under it. */
#define LOCK_ROUNDS 1000000
typedef struct {
    krt_wheel_t w;
    uint64_t counter;
} locked_t;

static void *lock_hammer(void *arg)
{
    locked_t *l = arg;
    for (int i = 0; i < LOCK_ROUNDS; i++) {
        krt__wheel_lock(&l->w);
        l->counter++;
        krt__wheel_unlock(&l->w);
    }
    return NULL;
}

static void test_wheel_lock_excludes(void **unused)
{
    locked_t *l = calloc(1, sizeof *l);
    assert_non_null(l);
    krt__wheel_init(&l->w, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, lock_hammer, l), 0);
    lock_hammer(l);
    pthread_join(t, NULL);
    assert_int_equal(l->counter, 2 * LOCK_ROUNDS);
    free(l);
}

/* An idle node with a TTL far away: the scheduler sleeps until the timer is due instead of
 * waking every millisecond (the old code woke ~300 times in 300 ms), and a shorter timer armed
 * next still fires on time. */
typedef struct {
    krt_timer_t far, near;
} idle_t;
static void idle_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    idle_t *s = state;
    if (msg->type == T_GO) {
        krt_timer_arm(ctx, &s->far, 10000, T_FIRE, 1);
        rt_ev(EV_DONE, 0, 0, 0);
    } else if (msg->type == T_CHECK) {
        krt_timer_arm(ctx, &s->near, 60, T_FIRE, 2);
    } else if (msg->type == T_FIRE) {
        rt_ev(EV_FIRE, (int64_t)msg->ref, (int64_t)krt_now_ms(), 0);
    }
}
static const krt_behaviour_t idle_b = {
    .kind = "idle", .state_size = sizeof(idle_t), .handle = idle_handle};

static uint64_t wakeups(krt_system_t *sys)
{
    uint64_t n = 0;
    for (int i = 0; i < sys->n_sched; i++)
        n += atomic_load(&sys->scheds[i].wakeups);
    return n;
}

static void test_idle_with_timer(void **unused)
{
    rt_reset();
    krt_system_t *sys = rt_system(2);
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &idle_b, NULL, NULL, &a), 0);
    krt_system_send(sys, a, T_GO, NULL, 0);
    assert_true(rt_wait(EV_DONE, 5000, NULL));
    rt_sleep_ms(50);
    uint64_t before = wakeups(sys);
    rt_sleep_ms(300);
    uint64_t idle = wakeups(sys) - before;
    print_message("scheduler wake-ups in 300 ms idle with a 10 s timer: %llu\n",
                  (unsigned long long)idle);
    assert_true(idle <= 10);
    uint64_t t0 = krt_now_ms();
    krt_system_send(sys, a, T_CHECK, NULL, 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_FIRE, 5000, &ev));
    assert_int_equal(ev.a, 2);
    assert_true((uint64_t)ev.b - t0 >= 60 && (uint64_t)ev.b - t0 < 1000);
    krt_system_destroy(&sys);
}

static void test_wheel_cancel_and_clamp(void **unused)
{
    krt_wheel_t w;
    krt__wheel_init(&w, 500);
    krt_tmr_t a = {0}, b = {0}, far = {0};
    a.expires = 600;
    b.expires = 400; /* in the past: fires on the next tick */
    far.expires = UINT64_MAX / 2;
    krt__wheel_add(&w, &a);
    krt__wheel_add(&w, &b);
    krt__wheel_add(&w, &far);
    krt__wheel_del(&w, &a);
    wheel_ctx_t c = {&w, 0, 0};
    krt__wheel_advance(&w, 700, wheel_fire, &c);
    assert_int_equal(c.fired, 1);
    assert_int_equal(w.count, 1);
    assert_true(far.expires < UINT64_MAX / 2); /* clamped to the wheel's range */
    krt__wheel_del(&w, &far);
    assert_int_equal(w.count, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Actor timers                                                                               */

typedef struct {
    krt_timer_t t[3];
    uint64_t armed_at;
} three_t;

static int three_init(krt_ctx_t *ctx, void *state, void *arg)
{
    three_t *s = state;
    s->armed_at = krt_now_ms();
    krt_timer_arm(ctx, &s->t[0], 30, T_FIRE, 30);
    krt_timer_arm(ctx, &s->t[1], 10, T_FIRE, 10);
    krt_timer_arm(ctx, &s->t[2], 20, T_FIRE, 20);
    assert_true(krt_timer_armed(&s->t[0]));
    return 0;
}
static void three_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    three_t *s = state;
    if (msg->type == T_FIRE) {
        int idx = msg->ref == 30 ? 0 : msg->ref == 10 ? 1 : 2;
        rt_ev(EV_FIRE, (int64_t)msg->ref, (int64_t)(krt_now_ms() - s->armed_at),
              krt_timer_armed(&s->t[idx]));
    }
}
static const krt_behaviour_t three_b = {
    .kind = "three", .state_size = sizeof(three_t), .init = three_init, .handle = three_handle};

static void test_actor_timers_in_order(void **unused)
{
    krt_system_t *sys = rt_system(2);
    assert_int_equal(krt_system_spawn(sys, &three_b, NULL, NULL, NULL), 0);
    for (int i = 1; i <= 3; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_FIRE, 5000, &ev));
        assert_int_equal(ev.a, i * 10);
        assert_true(ev.b >= i * 10);
        assert_int_equal(ev.c, 0); /* not armed any more while its message is handled */
    }
    krt_system_destroy(&sys);
}

/* Cancel, or re-arm, after the timer fired but before its message is handled. */
typedef struct {
    krt_timer_t t;
    int mode;
    int fires;
} cdf_t;

static void cdf_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    cdf_t *s = state;
    if (msg->type == T_GO) {
        s->mode = *(const int *)msg->body;
        krt_timer_arm(ctx, &s->t, 1, T_FIRE, 7);
        uint64_t t0 = krt_now_ms();
        while (krt_now_ms() < t0 + 3)
            ;
        /* fire our scheduler's wheel from inside the turn: the message is now queued */
        krt__timers_fire(ctx->sched, krt_now_ms());
        assert_true(krt_timer_armed(&s->t));
        if (s->mode == 0) {
            bool cancelled = krt_timer_cancel(ctx, &s->t);
            rt_ev(EV_CHECK, cancelled, krt_timer_armed(&s->t), 0);
            krt_send_after(ctx, krt_self(ctx), 30, T_CHECK, NULL, 0);
        } else {
            krt_timer_arm(ctx, &s->t, 20, T_FIRE, 8);
            krt_send_after(ctx, krt_self(ctx), 80, T_CHECK, NULL, 0);
        }
    } else if (msg->type == T_FIRE) {
        s->fires++;
        rt_ev(EV_FIRE, (int64_t)msg->ref, 0, 0);
    } else if (msg->type == T_CHECK) {
        rt_ev(EV_DONE, s->fires, 0, 0);
    }
}
static const krt_behaviour_t cdf_b = {
    .kind = "cdf", .state_size = sizeof(cdf_t), .handle = cdf_handle};

static void test_cancel_during_fire(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &cdf_b, NULL, NULL, &a), 0);
    int mode = 0;
    krt_system_send(sys, a, T_GO, &mode, sizeof mode);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_CHECK, 5000, &ev));
    assert_int_equal(ev.a, 1); /* cancel reports it will not fire */
    assert_int_equal(ev.b, 0);
    assert_true(rt_wait(EV_DONE, 5000, &ev));
    assert_int_equal(ev.a, 0); /* and it did not */
    /* re-arm while the old message is queued: exactly one fire, the new one */
    krt_addr_t b;
    assert_int_equal(krt_system_spawn(sys, &cdf_b, NULL, NULL, &b), 0);
    mode = 1;
    krt_system_send(sys, b, T_GO, &mode, sizeof mode);
    assert_true(rt_wait(EV_DONE, 5000, &ev));
    assert_int_equal(ev.a, 1);
    assert_true(rt_wait(EV_FIRE, 5000, &ev));
    assert_int_equal(ev.a, 8);
    assert_int_equal(rt_count(EV_FIRE), 0);
    krt_system_destroy(&sys);
}

/* 1 M timers in one actor: arm all, cancel half, count the fires. */
#define MANY 1000000
typedef struct {
    krt_timer_t t[MANY];
    int fired;
    uint64_t arm_ns, cancel_ns;
} many_t;

static uint64_t ns_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int many_init(krt_ctx_t *ctx, void *state, void *arg)
{
    many_t *s = state;
    uint64_t t0 = ns_now();
    for (int i = 0; i < MANY; i++)
        if (krt_timer_arm(ctx, &s->t[i], 20 + (uint64_t)(i % 300), T_FIRE, (uint64_t)i) != 0)
            return 99;
    uint64_t t1 = ns_now();
    int cancelled = 0;
    for (int i = 1; i < MANY; i += 2)
        cancelled += krt_timer_cancel(ctx, &s->t[i]);
    s->arm_ns = t1 - t0;
    s->cancel_ns = ns_now() - t1;
    return cancelled == MANY / 2 ? 0 : 98;
}
static void many_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    many_t *s = state;
    if (msg->type == T_FIRE) {
        if (msg->ref % 2 == 1)
            rt_ev(EV_FIRE, (int64_t)msg->ref, 0, 0); /* a cancelled one: must never happen */
        if (++s->fired == MANY / 2)
            rt_ev(EV_DONE, s->fired, (int64_t)s->arm_ns, (int64_t)s->cancel_ns);
    } else if (msg->type == T_CHECK) {
        rt_ev(EV_CHECK, s->fired, 0, 0);
    }
}
static const krt_behaviour_t many_b = {
    .kind = "many", .state_size = sizeof(many_t), .init = many_init, .handle = many_handle};

static void test_million_timers(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &many_b, NULL, NULL, &a), 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_DONE, 60000, &ev));
    print_message("1M timers: arm %.0f ns/op, cancel %.0f ns/op\n", (double)ev.b / MANY,
                  (double)ev.c / (MANY / 2));
    krt_stats_t st;
    krt_system_stats(sys, &st);
    assert_int_equal(st.timers_armed, 0);
    rt_sleep_ms(20);
    krt_system_send(sys, a, T_CHECK, NULL, 0);
    assert_true(rt_wait(EV_CHECK, 5000, &ev));
    assert_int_equal(ev.a, MANY / 2);
    assert_int_equal(rt_count(EV_FIRE), 0);
    krt_system_destroy(&sys);
}

/* send_after, and an actor stopping with armed timers (ASan checks nothing dangles). */
typedef struct {
    krt_timer_t t[4];
} stopper_t;
static int stopper_init(krt_ctx_t *ctx, void *state, void *arg)
{
    stopper_t *s = state;
    for (int i = 0; i < 4; i++)
        krt_timer_arm(ctx, &s->t[i], 5 + (uint64_t)i * 1000, T_FIRE, 0);
    krt_send_after(ctx, *(krt_addr_t *)arg, 25, T_AFTER, "later", 6);
    krt_exit(ctx, KRT_EXIT_NORMAL);
    return 0;
}
static void after_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_AFTER)
        rt_ev(EV_AFTER, msg->len, strcmp(msg->body, "later") == 0, 0);
    else if (msg->type == T_FIRE)
        rt_ev(EV_FIRE, 0, 0, 0);
}
static const krt_behaviour_t stopper_b = {.kind = "stopper",
                                          .state_size = sizeof(stopper_t),
                                          .init = stopper_init,
                                          .handle = after_handle};
static const krt_behaviour_t sink_b = {.kind = "sink", .handle = after_handle};

static void test_send_after_and_stop_with_timers(void **unused)
{
    krt_system_t *sys = rt_system(2);
    static krt_addr_t sink;
    assert_int_equal(krt_system_spawn(sys, &sink_b, NULL, NULL, &sink), 0);
    uint64_t t0 = krt_now_ms();
    for (int i = 0; i < 100; i++)
        assert_int_equal(krt_system_spawn(sys, &stopper_b, &sink, NULL, NULL), 0);
    for (int i = 0; i < 100; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_AFTER, 5000, &ev));
        assert_int_equal(ev.a, 6);
        assert_int_equal(ev.b, 1);
    }
    assert_true(krt_now_ms() - t0 >= 25);
    rt_sleep_ms(20);
    assert_int_equal(rt_count(EV_FIRE), 0);
    krt_stats_t st;
    krt_system_stats(sys, &st);
    assert_int_equal(st.timers_armed, 0);
    /* a pending send_after at shutdown is freed */
    krt_addr_t x;
    assert_int_equal(krt_system_spawn(sys, &stopper_b, &sink, NULL, &x), 0);
    krt_system_destroy(&sys);
}

/* An actor that migrated: its timer sits in another scheduler's wheel; cancel and re-arm
 * from here must take that wheel out of it. */
typedef struct {
    krt_timer_t t;
} mig_t;
static void mig_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    mig_t *s = state;
    if (msg->type == T_GO) {
        krt_system_t *sys = krt_ctx_system(ctx);
        krt_sched_t *other = &sys->scheds[(ctx->sched->idx + 1) % sys->n_sched];
        krt_tmr_t *t = (krt_tmr_t *)&s->t;
        t->type = T_FIRE;
        assert_non_null(krt__ext(ctx->actor));     /* what krt_timer_arm does first */
        krt__tmr_arm(other, ctx->actor, t, 60000); /* as if armed while running there */
        bool in_other = other->wheel.count == 1;
        bool cancelled = krt_timer_cancel(ctx, &s->t);
        bool emptied = other->wheel.count == 0;
        krt__tmr_arm(other, ctx->actor, t, 60000);
        krt_timer_arm(ctx, &s->t, 5, T_FIRE, 3); /* moves it to our wheel */
        rt_ev(EV_CHECK, in_other && cancelled && emptied, other->wheel.count == 0, 0);
    } else if (msg->type == T_FIRE) {
        rt_ev(EV_FIRE, (int64_t)msg->ref, 0, 0);
    }
}
static const krt_behaviour_t mig_b = {
    .kind = "mig", .state_size = sizeof(mig_t), .handle = mig_handle};

static void test_timer_in_other_wheel(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &mig_b, NULL, NULL, &a), 0);
    krt_system_send(sys, a, T_GO, NULL, 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_CHECK, 5000, &ev));
    assert_int_equal(ev.a, 1);
    assert_int_equal(ev.b, 1);
    assert_true(rt_wait(EV_FIRE, 5000, &ev));
    assert_int_equal(ev.a, 3);
    rt_sleep_ms(20);
    assert_int_equal(rt_count(EV_FIRE), 0);
    krt_system_destroy(&sys);
}

/* The clock is read once per message, not per timer: a timer armed by a later message counts
 * from that message, not from the reading an earlier one took (one scheduler, so both messages
 * run on the same thread and a stale reading would show). */
typedef struct {
    krt_timer_t first, second;
} clk_t;
static void clk_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    clk_t *s = state;
    if (msg->type == T_GO)
        krt_timer_arm(ctx, &s->first, 10000, T_FIRE, 1);
    else if (msg->type == T_CHECK)
        krt_timer_arm(ctx, &s->second, 40, T_FIRE, 2);
    else if (msg->type == T_FIRE)
        rt_ev(EV_FIRE, (int64_t)msg->ref, (int64_t)krt_now_ms(), 0);
}
static const krt_behaviour_t clk_b = {
    .kind = "clk", .state_size = sizeof(clk_t), .handle = clk_handle};

static void test_clock_read_per_message(void **unused)
{
    rt_reset();
    krt_system_t *sys = rt_system(1);
    krt_addr_t a;
    assert_int_equal(krt_system_spawn(sys, &clk_b, NULL, NULL, &a), 0);
    krt_system_send(sys, a, T_GO, NULL, 0);
    rt_sleep_ms(100);
    uint64_t t0 = krt_now_ms();
    krt_system_send(sys, a, T_CHECK, NULL, 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_FIRE, 5000, &ev));
    assert_int_equal(ev.a, 2);
    assert_true((uint64_t)ev.b - t0 >= 40);
    krt_system_destroy(&sys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wheel_boundaries),
        cmocka_unit_test(test_wheel_cancel_and_clamp),
        cmocka_unit_test(test_wheel_lock_excludes),
        cmocka_unit_test(test_actor_timers_in_order),
        cmocka_unit_test(test_cancel_during_fire),
        cmocka_unit_test(test_million_timers),
        cmocka_unit_test(test_send_after_and_stop_with_timers),
        cmocka_unit_test(test_timer_in_other_wheel),
        cmocka_unit_test(test_idle_with_timer),
        cmocka_unit_test(test_clock_read_per_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
