/*
 * Scale: 1 M actors spawned and stopped (zero leaks under ASan: every block is freed when the
 * system is destroyed), a skynet tree of 100,000 leaves with the right sum, and many
 * concurrent senders to one actor.
 */
#include "../runtime/rt_test.h"

enum { T_GO = KRT_MSG_USER, T_RESULT, T_INC, T_GET };
enum { EV_DONE = 1 };

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_million_actors),
        cmocka_unit_test(test_skynet),
        cmocka_unit_test(test_concurrent_senders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
