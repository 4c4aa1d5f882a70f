/*
 * Supervisor semantics: one_for_one, one_for_all, rest_for_one (who is stopped, in which
 * order, who is restarted), restart intensity overflow, permanent/transient/temporary
 * children, dynamic children, and shutdown order (reverse start order, children first).
 */
#include "../runtime/rt_test.h"

enum { T_CRASH = KRT_MSG_USER, T_PING };
enum { EV_START = 1, EV_STOP, EV_DOWN };

static int ids[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

typedef struct {
    int id;
} worker_t;

static int worker_init(krt_ctx_t *ctx, void *state, void *arg)
{
    worker_t *w = state;
    w->id = *(int *)arg;
    rt_ev(EV_START, w->id, (int64_t)krt_self(ctx), rt_seq());
    return 0;
}
static void worker_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_CRASH)
        krt_exit(ctx, *(const int *)msg->body);
    else if (msg->type == T_PING)
        krt_reply(ctx, msg, T_PING, NULL, 0);
}
static void worker_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    rt_ev(EV_STOP, ((worker_t *)state)->id, rt_seq(), reason);
}
static const krt_behaviour_t worker_b = {.kind = "worker",
                                         .state_size = sizeof(worker_t),
                                         .init = worker_init,
                                         .handle = worker_handle,
                                         .terminate = worker_terminate};

/* Monitors arg's address and reports its DOWN reason. */
static int obs_init(krt_ctx_t *ctx, void *state, void *arg)
{
    krt_monitor(ctx, *(krt_addr_t *)arg);
    return 0;
}
static void obs_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == KRT_MSG_DOWN)
        rt_ev(EV_DOWN, ((const krt_down_t *)msg->body)->reason, 0, 0);
}
static const krt_behaviour_t obs_b = {.kind = "obs", .init = obs_init, .handle = obs_handle};

/* Waits for n starts; returns the set of ids (inits may run concurrently, in any order). */
static int start_set(int n)
{
    int set = 0;
    for (int i = 0; i < n; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_START, 5000, &ev));
        set |= 1 << ev.a;
    }
    return set;
}

static krt_addr_t start_sup(krt_system_t *sys, krt_strategy_t strat, int intensity,
                            const krt_restart_t *kinds, int n)
{
    static char names[16][16];
    krt_child_spec_t kids[16];
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "w%d", i + 1);
        kids[i] = (krt_child_spec_t){names[i], &worker_b, &ids[i + 1],
                                     kinds ? kinds[i] : KRT_PERMANENT, false};
    }
    krt_sup_spec_t spec = {strat, intensity, 5000, kids, (size_t)n};
    krt_spawn_opts_t o = {.name = "sup"};
    krt_addr_t sup;
    assert_int_equal(krt_supervisor_spawn(sys, NULL, &spec, &o, &sup), 0);
    assert_int_equal(start_set(n), ((1 << n) - 1) << 1); /* every child started */
    return sup;
}

static krt_addr_t child(krt_system_t *sys, krt_addr_t sup, int i)
{
    char name[16];
    snprintf(name, sizeof name, "w%d", i);
    return krt_supervisor_child(sys, sup, name);
}

static void crash(krt_system_t *sys, krt_addr_t who, int reason)
{
    assert_true(who != KRT_ADDR_NONE);
    assert_int_equal(krt_system_send(sys, who, T_CRASH, &reason, sizeof reason), 0);
}

/* Waits for n STOP events, returning their ids in order. */
static void stops(int n, int *out_ids, int *out_reasons)
{
    for (int i = 0; i < n; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_STOP, 5000, &ev));
        out_ids[i] = (int)ev.a;
        if (out_reasons)
            out_reasons[i] = (int)ev.c;
    }
}

static void starts(int n, int *out_ids)
{
    for (int i = 0; i < n; i++) {
        rt_ev_t ev = {0};
        assert_true(rt_wait(EV_START, 5000, &ev));
        out_ids[i] = (int)ev.a;
    }
}

static void quiet(void)
{
    rt_sleep_ms(50);
    assert_int_equal(rt_count(EV_START), 0);
    assert_int_equal(rt_count(EV_STOP), 0);
}

static void test_one_for_one(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t sup = start_sup(sys, KRT_ONE_FOR_ONE, 5, NULL, 3);
    krt_addr_t w1 = child(sys, sup, 1), w2 = child(sys, sup, 2), w3 = child(sys, sup, 3);
    crash(sys, w2, KRT_EXIT_ERROR);
    int id[3], rs[3];
    stops(1, id, rs);
    assert_int_equal(id[0], 2);
    assert_int_equal(rs[0], KRT_EXIT_ERROR);
    starts(1, id);
    assert_int_equal(id[0], 2);
    quiet();
    assert_int_equal(child(sys, sup, 1), w1);
    assert_int_equal(child(sys, sup, 3), w3);
    krt_addr_t w2b = child(sys, sup, 2);
    assert_true(w2b != KRT_ADDR_NONE && w2b != w2);
    /* the tree shows the restart count */
    char *json = krt_tree_json(sys, w2b);
    assert_non_null(strstr(json, "\"restarts\":1"));
    free(json);
    krt_system_destroy(&sys);
}

static void test_one_for_all(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t sup = start_sup(sys, KRT_ONE_FOR_ALL, 5, NULL, 3);
    krt_addr_t w1 = child(sys, sup, 1);
    crash(sys, child(sys, sup, 2), KRT_EXIT_ERROR);
    int id[3], rs[3];
    stops(3, id, rs);
    assert_int_equal(id[0], 2);
    assert_int_equal(id[1], 3); /* the others, newest first */
    assert_int_equal(id[2], 1);
    assert_int_equal(rs[1], KRT_EXIT_SHUTDOWN);
    assert_int_equal(rs[2], KRT_EXIT_SHUTDOWN);
    assert_int_equal(start_set(3), 0xe);
    quiet();
    assert_true(child(sys, sup, 1) != w1);
    krt_system_destroy(&sys);
}

static void test_rest_for_one(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t sup = start_sup(sys, KRT_REST_FOR_ONE, 5, NULL, 4);
    krt_addr_t w1 = child(sys, sup, 1);
    crash(sys, child(sys, sup, 2), KRT_EXIT_ERROR);
    int id[4], rs[4];
    stops(3, id, rs);
    assert_int_equal(id[0], 2);
    assert_int_equal(id[1], 4);
    assert_int_equal(id[2], 3);
    assert_int_equal(start_set(3), 0x1c);
    quiet();
    assert_int_equal(child(sys, sup, 1), w1);
    krt_system_destroy(&sys);
}

static void test_intensity_overflow(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t sup = start_sup(sys, KRT_ONE_FOR_ONE, 2, NULL, 3);
    assert_int_equal(krt_system_spawn(sys, &obs_b, &sup, NULL, NULL), 0);
    rt_sleep_ms(20);
    int id[3], rs[3];
    for (int round = 0; round < 2; round++) {
        crash(sys, child(sys, sup, 1), KRT_EXIT_ERROR);
        stops(1, id, rs);
        starts(1, id);
        assert_int_equal(id[0], 1);
    }
    crash(sys, child(sys, sup, 1), KRT_EXIT_ERROR); /* third in the window: too many */
    stops(3, id, rs);
    assert_int_equal(id[0], 1);
    assert_int_equal(id[1], 3);
    assert_int_equal(id[2], 2);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_DOWN, 5000, &ev));
    assert_int_equal(ev.a, KRT_EXIT_ERROR);
    assert_int_equal(rt_count(EV_START), 0);
    assert_int_equal(krt_system_send(sys, sup, T_PING, NULL, 0), KRT_ENOACTOR);
    krt_system_destroy(&sys);
}

static void test_restart_kinds(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_restart_t kinds[] = {KRT_PERMANENT, KRT_TRANSIENT, KRT_TEMPORARY, KRT_TRANSIENT,
                             KRT_TEMPORARY};
    krt_addr_t sup = start_sup(sys, KRT_ONE_FOR_ONE, 10, kinds, 5);
    int id[2];
    /* normal exits: permanent restarts, transient and temporary do not */
    crash(sys, child(sys, sup, 1), KRT_EXIT_NORMAL);
    stops(1, id, NULL);
    starts(1, id);
    assert_int_equal(id[0], 1);
    crash(sys, child(sys, sup, 2), KRT_EXIT_NORMAL);
    crash(sys, child(sys, sup, 3), KRT_EXIT_NORMAL);
    stops(2, id, NULL);
    quiet();
    assert_int_equal(child(sys, sup, 2), KRT_ADDR_NONE);
    assert_int_equal(child(sys, sup, 3), KRT_ADDR_NONE);
    /* abnormal: transient restarts, temporary does not */
    crash(sys, child(sys, sup, 4), KRT_EXIT_ERROR + 3);
    stops(1, id, NULL);
    starts(1, id);
    assert_int_equal(id[0], 4);
    crash(sys, child(sys, sup, 5), KRT_EXIT_ERROR);
    stops(1, id, NULL);
    quiet();
    assert_int_equal(child(sys, sup, 5), KRT_ADDR_NONE);
    krt_system_destroy(&sys);
}

static void test_dynamic_children_and_shutdown_order(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_addr_t sup = start_sup(sys, KRT_ONE_FOR_ONE, 5, NULL, 2);
    krt_child_spec_t extra = {"w9", &worker_b, &ids[9], KRT_PERMANENT, false};
    krt_addr_t w9;
    assert_int_equal(krt_supervisor_start_child(sys, sup, &extra, &w9), 0);
    rt_ev_t ev = {0};
    assert_true(rt_wait(EV_START, 5000, &ev));
    assert_int_equal(ev.a, 9);
    assert_int_equal(ev.b, (int64_t)w9);
    assert_int_equal(krt_supervisor_child(sys, sup, "w9"), w9);
    assert_int_equal(krt_supervisor_start_child(sys, sup, &extra, &w9), KRT_EEXIST);
    /* a dynamic child is supervised like the others */
    crash(sys, w9, KRT_EXIT_ERROR);
    int id[3], rs[3];
    stops(1, id, NULL);
    starts(1, id);
    assert_int_equal(id[0], 9);
    /* stop: children in reverse start order, then the supervisor */
    assert_int_equal(krt_system_spawn(sys, &obs_b, &sup, NULL, NULL), 0);
    rt_sleep_ms(20);
    assert_int_equal(krt_system_kill(sys, sup, KRT_EXIT_SHUTDOWN), 0);
    stops(3, id, rs);
    assert_int_equal(id[0], 9);
    assert_int_equal(id[1], 2);
    assert_int_equal(id[2], 1);
    assert_int_equal(rs[0], KRT_EXIT_SHUTDOWN);
    assert_true(rt_wait(EV_DOWN, 5000, &ev));
    assert_int_equal(ev.a, KRT_EXIT_SHUTDOWN);
    assert_int_equal(krt_supervisor_start_child(sys, sup, &extra, &w9), KRT_ENOACTOR);
    krt_system_destroy(&sys);
}

/* Nested supervisors under system stop: leaves first, each level in reverse order. */
static void test_nested_system_stop(void **unused)
{
    krt_system_t *sys = rt_system(2);
    krt_child_spec_t inner_kids[] = {{"a", &worker_b, &ids[1], KRT_PERMANENT, false},
                                     {"b", &worker_b, &ids[2], KRT_PERMANENT, false}};
    krt_sup_spec_t inner = {KRT_ONE_FOR_ONE, 3, 1000, inner_kids, 2};
    krt_child_spec_t outer_kids[] = {
        {"c", &worker_b, &ids[3], KRT_PERMANENT, false},
        {"inner", &krt_supervisor_behaviour, &inner, KRT_PERMANENT, false},
        {"d", &worker_b, &ids[4], KRT_PERMANENT, false}};
    krt_sup_spec_t outer = {KRT_ONE_FOR_ALL, 3, 1000, outer_kids, 3};
    krt_addr_t sup;
    assert_int_equal(krt_supervisor_spawn(sys, NULL, &outer, NULL, &sup), 0);
    int id[4];
    starts(4, id); /* spawned in order; inits run concurrently on the two schedulers */
    int seen = 0;
    for (int i = 0; i < 4; i++)
        seen |= 1 << id[i];
    assert_int_equal(seen, 0x1e);
    krt_system_stop(sys);
    stops(4, id, NULL);
    assert_int_equal(id[0], 4);
    assert_int_equal(id[1], 2);
    assert_int_equal(id[2], 1);
    assert_int_equal(id[3], 3);
    assert_int_equal(rt_count(EV_START), 0);
    krt_system_destroy(&sys);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_for_one),
        cmocka_unit_test(test_one_for_all),
        cmocka_unit_test(test_rest_for_one),
        cmocka_unit_test(test_intensity_overflow),
        cmocka_unit_test(test_restart_kinds),
        cmocka_unit_test(test_dynamic_children_and_shutdown_order),
        cmocka_unit_test(test_nested_system_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
