/*
 * Scale: 1 M actors spawned and stopped (zero leaks under ASan: every block is freed when the
 * system is destroyed), a skynet tree of 100,000 leaves with the right sum, many concurrent
 * senders to one actor, and a turn's batched sends (runs to one target, target switches,
 * targets that stop while senders hold them) keeping every sender's order.
 */
#include "../runtime/rt_test.h"

enum { T_GO = KRT_MSG_USER, T_RESULT, T_INC, T_GET, T_SEQ, T_DONE };
enum { EV_DONE = 1, EV_SENT, EV_BAD };

#define MILLION 1000000

/* A spawner that makes 1 M short-lived actors in batches (each exits in init). */
static int brief_init(krt_ctx_t *ctx, void *state, void *arg)
{
    krt_send(ctx, krt_parent(ctx), T_RESULT, NULL, 0);
    krt_exit(ctx, KRT_EXIT_NORMAL);
    return 0;
}
static void nothing(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
}
static const krt_behaviour_t brief_b = {
    .kind = "brief", .state_size = 24, .init = brief_init, .handle = nothing};

typedef struct {
    int spawned, reported;
} spawner_t;
static void spawner_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    spawner_t *s = state;
    if (msg->type == T_GO) {
        for (int i = 0; i < 10000 && s->spawned < MILLION; i++, s->spawned++)
            assert_int_equal(krt_spawn(ctx, &brief_b, NULL, NULL, NULL), 0);
        if (s->spawned < MILLION)
            krt_send(ctx, krt_self(ctx), T_GO, NULL, 0);
    } else if (msg->type == T_RESULT) {
        if (++s->reported == MILLION)
            rt_ev(EV_DONE, s->reported, 0, 0);
    }
}
static const krt_behaviour_t spawner_b = {
    .kind = "spawner", .state_size = sizeof(spawner_t), .handle = spawner_handle};

static void test_million_actors(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t sp;
    assert_int_equal(krt_system_spawn(sys, &spawner_b, NULL, NULL, &sp), 0);
    krt_system_send(sys, sp, T_GO, NULL, 0);
    assert_true(rt_wait(EV_DONE, 120000, NULL));
    krt_stats_t st;
    for (int i = 0; i < 2000; i++) {
        krt_system_stats(sys, &st);
        if (st.actors_live == 1)
            break;
        rt_sleep_ms(1);
    }
    assert_int_equal(st.actors_live, 1);
    assert_int_equal(st.actors_spawned, MILLION + 1);
    krt_system_destroy(&sys);
}

/* skynet, 100,000 leaves */
typedef struct {
    int64_t sum;
    int pending;
} sky_t;
static const krt_behaviour_t sky_b;
static int sky_init(krt_ctx_t *ctx, void *state, void *arg)
{
    uint64_t packed = (uint64_t)(uintptr_t)arg;
    int64_t num = (int64_t)(packed & 0xffffffffu), size = (int64_t)(packed >> 32);
    sky_t *s = state;
    if (size == 1) {
        krt_send(ctx, krt_parent(ctx), T_RESULT, &num, sizeof num);
        krt_exit(ctx, KRT_EXIT_NORMAL);
        return 0;
    }
    int64_t sub = size / 10;
    s->pending = 10;
    for (int64_t i = 0; i < 10; i++)
        krt_spawn(ctx, &sky_b,
                  (void *)(uintptr_t)((uint64_t)(num + i * sub) | ((uint64_t)sub << 32)), NULL,
                  NULL);
    return 0;
}
static void sky_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    sky_t *s = state;
    s->sum += *(const int64_t *)msg->body;
    if (--s->pending == 0) {
        if (krt_parent(ctx) == KRT_ADDR_NONE)
            rt_ev(EV_DONE, s->sum, 0, 0);
        else
            krt_send(ctx, krt_parent(ctx), T_RESULT, &s->sum, sizeof s->sum);
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
}
static const krt_behaviour_t sky_b = {
    .kind = "sky", .state_size = sizeof(sky_t), .init = sky_init, .handle = sky_handle};

static void test_skynet(void **unused)
{
    krt_system_t *sys = rt_system(2);
    assert_int_equal(
        krt_system_spawn(sys, &sky_b, (void *)(uintptr_t)((uint64_t)100000 << 32), NULL, NULL), 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_DONE, 60000, &ev));
    assert_int_equal(ev.a, 4999950000LL);
    krt_system_destroy(&sys);
}

/* Many threads and actors sending to one counter. */
typedef struct {
    int64_t n;
} counter_t;
static void counter_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    counter_t *c = state;
    if (msg->type == T_INC)
        c->n++;
    else if (msg->type == T_GET)
        krt_reply(ctx, msg, T_GET, &c->n, sizeof c->n);
}
static const krt_behaviour_t counter_b = {
    .kind = "counter", .state_size = sizeof(counter_t), .handle = counter_handle};

static int sender_init(krt_ctx_t *ctx, void *state, void *arg)
{
    for (int i = 0; i < 20000; i++)
        krt_send(ctx, *(krt_addr_t *)arg, T_INC, NULL, 0);
    krt_exit(ctx, KRT_EXIT_NORMAL);
    return 0;
}
static const krt_behaviour_t sender_b = {.kind = "sender", .init = sender_init, .handle = nothing};

typedef struct {
    krt_system_t *sys;
    krt_addr_t to;
} thr_arg_t;
static void *thr_main(void *p)
{
    thr_arg_t *a = p;
    for (int i = 0; i < 20000; i++)
        krt_system_send(a->sys, a->to, T_INC, NULL, 0);
    return NULL;
}

static void test_concurrent_senders(void **unused)
{
    krt_system_t *sys = rt_system(2);
    static krt_addr_t c;
    assert_int_equal(krt_system_spawn(sys, &counter_b, NULL, NULL, &c), 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(krt_system_spawn(sys, &sender_b, &c, NULL, NULL), 0);
    pthread_t th[4];
    thr_arg_t ta = {sys, c};
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, thr_main, &ta);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    krt_stats_t st;
    for (int i = 0; i < 5000; i++) {
        krt_system_stats(sys, &st);
        if (st.actors_live == 1)
            break;
        rt_sleep_ms(1);
    }
    krt_reply_t r;
    assert_int_equal(krt_call(sys, c, T_GET, NULL, 0, 10000, &r), 0);
    assert_int_equal(*(int64_t *)r.body, 14 * 20000);
    krt_reply_free(&r);
    krt_system_destroy(&sys);
}

/* Batched sends: senders send runs of 1-150 messages to one of four targets at a time (from
 * the second message of a run on, a handler's sends are batched; the batch is pushed when the
 * target changes, when it holds KRT_OUT_BATCH, and when the handler returns), then one to
 * themselves. Every target checks that each sender's numbers arrive in order and without gaps;
 * two targets stop after 5,000 messages while the senders keep sending to them (their reaper
 * waits for the senders' pins). */
#define BS_SENDERS 6
#define BS_TARGETS 4
#define BS_MORTAL  2 /* targets [BS_TARGETS - BS_MORTAL, BS_TARGETS) stop early */
#define BS_ROUNDS  200

typedef struct {
    int32_t sender;
    int32_t seq;
} bs_msg_t;

typedef struct {
    int64_t handled;
    int32_t expect[BS_SENDERS];
    bool mortal;
} bs_target_t;

static int bs_target_init(krt_ctx_t *ctx, void *state, void *arg)
{
    (void)ctx;
    ((bs_target_t *)state)->mortal = arg != NULL;
    return 0;
}

static void bs_target_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    bs_target_t *t = state;
    if (msg->type == T_GET) {
        krt_reply(ctx, msg, T_GET, &t->handled, sizeof t->handled);
        return;
    }
    const bs_msg_t *m = msg->body;
    if (msg->type != T_SEQ || m->sender < 0 || m->sender >= BS_SENDERS ||
        m->seq != t->expect[m->sender]++)
        rt_ev(EV_BAD, msg->type, m->sender, m->seq);
    if (++t->handled == 5000 && t->mortal)
        krt_exit(ctx, KRT_EXIT_NORMAL);
}
static const krt_behaviour_t bs_target_b = {.kind = "bs_target",
                                            .state_size = sizeof(bs_target_t),
                                            .init = bs_target_init,
                                            .handle = bs_target_handle};

typedef struct {
    krt_addr_t to[BS_TARGETS];
    int32_t id;
} bs_arg_t;

typedef struct {
    bs_arg_t arg;
    int32_t seq[BS_TARGETS];
    int64_t ok[BS_TARGETS]; /* sends that returned 0 */
    int round;
} bs_sender_t;

static int bs_sender_init(krt_ctx_t *ctx, void *state, void *arg)
{
    bs_sender_t *s = state;
    s->arg = *(const bs_arg_t *)arg;
    return krt_send(ctx, krt_self(ctx), T_GO, NULL, 0);
}

static void bs_sender_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    bs_sender_t *s = state;
    if (msg->type == T_DONE) { /* the last sends were pushed when the last T_GO returned */
        rt_ev(EV_SENT, s->ok[0], s->ok[1], 0);
        krt_exit(ctx, KRT_EXIT_NORMAL);
        return;
    }
    for (int k = 0; k < 4; k++) {
        int t = (s->round * 7 + k + s->arg.id) % BS_TARGETS;
        int run = 1 + (s->round * 31 + k * 17 + s->arg.id * 5) % 150;
        for (int i = 0; i < run; i++) {
            bs_msg_t m = {s->arg.id, s->seq[t]};
            int rc = krt_send(ctx, s->arg.to[t], T_SEQ, &m, sizeof m);
            if (rc == 0) {
                s->seq[t]++;
                s->ok[t]++;
            } else if (rc != KRT_ENOACTOR || t < BS_TARGETS - BS_MORTAL) {
                rt_ev(EV_BAD, rc, s->arg.id, t);
            }
        }
    }
    krt_send(ctx, krt_self(ctx), ++s->round < BS_ROUNDS ? T_GO : T_DONE, NULL, 0);
}
static const krt_behaviour_t bs_sender_b = {.kind = "bs_sender",
                                            .state_size = sizeof(bs_sender_t),
                                            .init = bs_sender_init,
                                            .handle = bs_sender_handle};

static void test_batched_sends(void **unused)
{
    (void)unused;
    krt_system_t *sys = rt_system(2);
    bs_arg_t args[BS_SENDERS];
    for (int t = 0; t < BS_TARGETS; t++) {
        void *mortal = t >= BS_TARGETS - BS_MORTAL ? (void *)1 : NULL;
        assert_int_equal(krt_system_spawn(sys, &bs_target_b, mortal, NULL, &args[0].to[t]), 0);
    }
    for (int i = 0; i < BS_SENDERS; i++) {
        memcpy(args[i].to, args[0].to, sizeof args[i].to);
        args[i].id = i;
        assert_int_equal(krt_system_spawn(sys, &bs_sender_b, &args[i], NULL, NULL), 0);
    }
    int64_t ok[2] = {0, 0};
    for (int i = 0; i < BS_SENDERS; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_SENT, 60000, &ev));
        ok[0] += ev.a;
        ok[1] += ev.b;
    }
    for (int t = 0; t < 2; t++) {
        krt_reply_t r;
        assert_int_equal(krt_call(sys, args[0].to[t], T_GET, NULL, 0, 10000, &r), 0);
        assert_int_equal(*(int64_t *)r.body, ok[t]);
        krt_reply_free(&r);
    }
    for (int t = BS_TARGETS - BS_MORTAL; t < BS_TARGETS; t++) {
        int rc = krt_system_wait(sys, args[0].to[t], 10000); /* gone, or going */
        assert_true(rc == KRT_ENOACTOR || rc == KRT_EXIT_NORMAL);
    }
    assert_int_equal(rt_count(EV_BAD), 0);
    krt_system_destroy(&sys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_actors),
        cmocka_unit_test(test_skynet),
        cmocka_unit_test(test_concurrent_senders),
        cmocka_unit_test(test_batched_sends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
