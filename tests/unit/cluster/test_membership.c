/*
 * Tests for the membership actor (actors/cluster/membership.c) against a fake store actor
 * registered as "store", whose answers the test sets: registration (a new incarnation each
 * time), renewal refused (the lease was taken or lapsed), the database away (no lease can be
 * renewed: the node fences itself when its own lease ends), and the node table it serves.
 * Renewals every 20 ms; leases of 1 s where fencing is tested, else 60 s; every wait is on a
 * condition with a deadline.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "krt.h"
#include "membership.h"

#define RENEW_MS    20
#define LEASE_MS    1000  /* the fencing tests: renewals take far less even under valgrind */
#define LONG_MS     60000 /* the others: a lease that cannot lapse during the test */
#define DEADLINE_MS 10000

enum { FAKE_OK = 0, FAKE_REFUSE, FAKE_AWAY };

static atomic_int s_mode;           /* how the fake answers renewals (FAKE_*) */
static atomic_llong s_incarnation;  /* the fake's current incarnation of node 7 */
static atomic_int s_registrations;  /* NODE_PUT received */
static atomic_int s_renewals;       /* NODE_HEARTBEAT received */
static atomic_llong s_refused_at;   /* krt_mono_ms of the last renewal refused */
static atomic_llong s_put_at;       /* krt_mono_ms of the last registration */
static atomic_int s_left;           /* a heartbeat with lease_ms 0 (the node leaves) */
static ka_membership_args_t s_args; /* the membership actor's */

static void s_reply_row(krt_ctx_t *ctx, const krt_msg_t *msg, const ka_store_node_t *self,
                        uint32_t count)
{
    size_t len = sizeof(ka_store_node_list_t) + 2 * sizeof(ka_store_node_t);
    ka_store_node_list_t *l = calloc(1, len);
    l->count = count;
    l->items[0] = *self;
    l->items[0].incarnation = atomic_load(&s_incarnation);
    l->items[0].alive = 1;
    if (count == 2) { /* a peer without a mesh endpoint: listed, never connected */
        snprintf(l->items[1].id, sizeof l->items[1].id, "9");
        snprintf(l->items[1].name, sizeof l->items[1].name, "node-9");
        l->items[1].incarnation = 4;
        l->items[1].alive = 1;
    }
    krt_reply(ctx, msg, msg->type, l, sizeof *l + count * sizeof l->items[0]);
    free(l);
}

/* As the store answers a failure: an error reply. */
static void s_reply_err(krt_ctx_t *ctx, const krt_msg_t *msg, int err)
{
    char why[32];
    snprintf(why, sizeof why, "fake: %d", err);
    krt_reply_error(ctx, msg, err, why);
}

typedef struct {
    ka_store_node_t self; /* as last registered */
} s_fake_t;

static void s_fake(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_fake_t *f = state;
    int mode = atomic_load(&s_mode);
    switch (msg->type) {
    case KA_STORE_NODE_PUT:
        atomic_fetch_add(&s_registrations, 1);
        atomic_store(&s_put_at, krt_mono_ms());
        if (mode == FAKE_AWAY)
            return s_reply_err(ctx, msg, KA_STORE_EUNAVAIL);
        assert_int_equal(msg->len, sizeof f->self);
        memcpy(&f->self, msg->body, sizeof f->self);
        assert_int_equal(f->self.lease_ms, s_args.lease_ms);
        atomic_fetch_add(&s_incarnation, 1);
        return s_reply_row(ctx, msg, &f->self, 1);
    case KA_STORE_NODE_HEARTBEAT: {
        atomic_fetch_add(&s_renewals, 1);
        const ka_store_node_heartbeat_t *hb = msg->body;
        assert_int_equal(msg->len, sizeof *hb);
        assert_string_equal(hb->id, "7");
        if (hb->lease_ms == 0)
            atomic_store(&s_left, 1);
        if (mode == FAKE_AWAY)
            return s_reply_err(ctx, msg, KA_STORE_EUNAVAIL);
        if (mode == FAKE_REFUSE || hb->incarnation != atomic_load(&s_incarnation)) {
            atomic_store(&s_refused_at, krt_mono_ms());
            return s_reply_err(ctx, msg, KA_STORE_ENOTFOUND);
        }
        return s_reply_row(ctx, msg, &f->self, 1);
    }
    case KA_STORE_NODE_LIST:
        if (mode == FAKE_AWAY)
            return s_reply_err(ctx, msg, KA_STORE_EUNAVAIL);
        return s_reply_row(ctx, msg, &f->self, 2);
    default:
        break;
    }
}

static const krt_behaviour_t s_fake_store = {
    .kind = "fake_store", .state_size = sizeof(s_fake_t), .handle = s_fake};

static krt_system_t *s_sys;
static ka_membership_status_t s_status;

static int s_setup_lease(int lease_ms)
{
    atomic_store(&s_mode, FAKE_OK);
    atomic_store(&s_incarnation, 0);
    atomic_store(&s_registrations, 0);
    atomic_store(&s_renewals, 0);
    atomic_store(&s_refused_at, 0);
    atomic_store(&s_put_at, 0);
    atomic_store(&s_left, 0);
    memset(&s_status, 0, sizeof s_status);
    memset(&s_args, 0, sizeof s_args);
    s_args.store = "store";
    s_args.status = &s_status;
    s_args.renew_ms = RENEW_MS;
    s_args.lease_ms = lease_ms;
    snprintf(s_args.self.id, sizeof s_args.self.id, "7");
    snprintf(s_args.self.name, sizeof s_args.self.name, "node-7");
    s_sys = krt_system_new(&(krt_config_t){.node_id = 7, .schedulers = 2, .name = "node-7"});
    if (!s_sys || krt_system_start(s_sys))
        return -1;
    krt_addr_t a;
    if (krt_system_spawn(s_sys, &s_fake_store, NULL,
                         &(krt_spawn_opts_t){.name = "store", .register_name = true}, &a))
        return -1;
    return krt_system_spawn(s_sys, &ka_membership_behaviour, &s_args,
                            &(krt_spawn_opts_t){.name = KA_CLUSTER_NAME, .register_name = true},
                            &a);
}

static int s_setup(void **state)
{
    return s_setup_lease(LONG_MS);
}

static int s_setup_fencing(void **state)
{
    return s_setup_lease(LEASE_MS);
}

static int s_teardown(void **state)
{
    krt_system_destroy(&s_sys);
    return 0;
}

/* Waits until cond() holds, or fails after DEADLINE_MS. */
#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        int64_t until_ = krt_mono_ms() + DEADLINE_MS;                                              \
        while (!(cond)) {                                                                          \
            if (krt_mono_ms() > until_)                                                            \
                fail_msg("timed out waiting for %s", #cond);                                       \
            usleep(2000);                                                                          \
        }                                                                                          \
    } while (0)

static void test_registers_and_renews(void **unused)
{
    WAIT_FOR(ka_membership_member(&s_status));
    assert_int_equal(atomic_load(&s_status.incarnation), 1);
    int renewals = atomic_load(&s_renewals);
    WAIT_FOR(atomic_load(&s_renewals) >= renewals + 5);
    /* renewals bump nothing but the lease: still the first registration */
    assert_int_equal(atomic_load(&s_registrations), 1);
    assert_true(ka_membership_member(&s_status));
    assert_int_equal(atomic_load(&s_status.fenced_total), 0);
}

/* The number of nodes in the membership's table; r keeps the reply when it holds some. */
static uint32_t s_nodes(krt_addr_t c, krt_reply_t *r)
{
    if (krt_call(s_sys, c, KA_CLUSTER_NODES, NULL, 0, 2000, r) != 0)
        return 0;
    assert_int_equal(r->status, 0);
    uint32_t n = ((const ka_cluster_nodes_t *)r->body)->count;
    if (!n)
        krt_reply_free(r);
    return n;
}

static void test_nodes_and_tree(void **unused)
{
    WAIT_FOR(ka_membership_member(&s_status));
    krt_addr_t c = krt_whereis(s_sys, KA_CLUSTER_NAME);
    krt_reply_t r;
    assert_true(s_nodes(c, &r) >= 1); /* from its registration on: at least itself */
    krt_reply_free(&r);
    WAIT_FOR(s_nodes(c, &r) == 2);
    const ka_cluster_nodes_t *l = r.body;
    assert_int_equal(r.len, sizeof *l + 2 * sizeof l->items[0]);
    assert_true(l->member);
    assert_string_equal(l->items[0].row.name, "node-7");
    assert_true(l->items[0].self);
    assert_false(l->items[1].self);
    assert_false(l->items[1].connected); /* no mesh here */
    krt_reply_free(&r);
    assert_int_equal(krt_call(s_sys, c, KA_CLUSTER_TREE, "", 1, 2000, &r), 0);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.body, "\"node-7/store\""));
    krt_reply_free(&r);
    assert_int_equal(krt_call(s_sys, c, KA_CLUSTER_TREE, "nobody", 7, 2000, &r), 0);
    assert_int_equal(r.status, KRT_ENOACTOR);
    krt_reply_free(&r);
}

/* A refused renewal (another incarnation holds the row, or the lease lapsed): fenced at once,
 * out for one lease, then a new incarnation. */
static void test_refused_renewal_fences(void **unused)
{
    WAIT_FOR(ka_membership_member(&s_status));
    atomic_store(&s_mode, FAKE_REFUSE);
    WAIT_FOR(!ka_membership_member(&s_status));
    WAIT_FOR(atomic_load(&s_status.fenced_total) == 1);
    atomic_store(&s_mode, FAKE_OK);
    WAIT_FOR(ka_membership_member(&s_status));
    /* it stayed out for a lease after the refusal (both times taken inside the runtime) */
    assert_true(atomic_load(&s_put_at) - atomic_load(&s_refused_at) >= LEASE_MS);
    assert_int_equal(atomic_load(&s_status.incarnation), 2);
    assert_int_equal(atomic_load(&s_registrations), 2);
}

/* The database away: renewals fail, the node is no member from the moment its lease ends (the
 * flag checks the deadline itself), then it registers again once the database is back. */
static void test_unrenewable_lease_fences(void **unused)
{
    WAIT_FOR(ka_membership_member(&s_status));
    atomic_store(&s_mode, FAKE_AWAY);
    WAIT_FOR(!ka_membership_member(&s_status));
    WAIT_FOR(atomic_load(&s_status.fenced_total) == 1);
    atomic_store(&s_mode, FAKE_OK);
    WAIT_FOR(ka_membership_member(&s_status));
    assert_int_equal(atomic_load(&s_status.incarnation), 2);
}

/* A clean stop: the lease ends in the table now, the node is no member, renews nothing more. */
static void test_leave_ends_lease(void **unused)
{
    WAIT_FOR(ka_membership_member(&s_status));
    krt_reply_t r;
    assert_int_equal(
        krt_call(s_sys, krt_whereis(s_sys, KA_CLUSTER_NAME), KA_CLUSTER_LEAVE, NULL, 0, 2000, &r),
        0);
    assert_int_equal(r.status, 0);
    krt_reply_free(&r);
    assert_int_equal(atomic_load(&s_left), 1);
    assert_false(ka_membership_member(&s_status));
    int renewals = atomic_load(&s_renewals), registrations = atomic_load(&s_registrations);
    usleep(10 * RENEW_MS * 1000); /* an absence: ten renewal periods pass without a request */
    assert_int_equal(atomic_load(&s_renewals), renewals);
    assert_int_equal(atomic_load(&s_registrations), registrations);
    assert_int_equal(atomic_load(&s_status.fenced_total), 0);
}

/* Placement with a node excluded (one that just refused a create for room): never that node,
 * whatever the draw, even when it is this node or the least loaded; -ENOENT when it was the only
 * one of the pool with room. Full, draining and lapsed nodes never qualify. */
static void test_place_excludes(void **unused)
{
    static const struct {
        const char *id, *name, *pools;
        int32_t capacity, sandboxes, alive, draining;
    } rows[] = {
        {"7", "node-7", "p", 4, 0, 1, 0},   /* this node, empty */
        {"8", "node-8", "p,q", 4, 3, 1, 0}, /* room for one */
        {"9", "node-9", "p", 4, 4, 1, 0},   /* full */
        {"10", "node-10", "p", 4, 0, 1, 1}, /* draining */
        {"11", "node-11", "p", 4, 0, 0, 0}, /* lapsed */
        {"12", "node-12", "q", 4, 0, 1, 0}, /* another pool */
    };
    enum { N = sizeof rows / sizeof rows[0] };
    ka_store_node_list_t *l = calloc(1, sizeof *l + N * sizeof l->items[0]);
    assert_non_null(l);
    l->count = N;
    for (int i = 0; i < N; i++) {
        ka_store_node_t *r = &l->items[i];
        snprintf(r->id, sizeof r->id, "%s", rows[i].id);
        snprintf(r->name, sizeof r->name, "%s", rows[i].name);
        snprintf(r->pools, sizeof r->pools, "%s", rows[i].pools);
        r->capacity = rows[i].capacity;
        r->sandboxes = rows[i].sandboxes;
        r->alive = rows[i].alive;
        r->draining = rows[i].draining;
    }
    ka_membership_status_t st;
    memset(&st, 0, sizeof st);
    snprintf(st.self_id, sizeof st.self_id, "7");
    assert_null(ka_membership_publish(&st, l));
    ka_store_node_t out;
    int seen7 = 0, seen8 = 0;
    for (uint64_t seed = 0; seed < 64; seed++) {
        assert_int_equal(ka_membership_place(&st, "p", NULL, seed, &out), 0);
        seen7 += !strcmp(out.name, "node-7");
        seen8 += !strcmp(out.name, "node-8");
        assert_int_equal(ka_membership_place(&st, "p", "node-7", seed, &out), 0);
        assert_string_equal(out.name, "node-8");
        assert_int_equal(ka_membership_place(&st, "p", "node-8", seed, &out), 0);
        assert_string_equal(out.name, "node-7");
        assert_int_equal(ka_membership_place(&st, "q", "node-12", seed, &out), 0);
        assert_string_equal(out.name, "node-8");
    }
    assert_int_equal(seen7 + seen8, 64); /* never a full, draining or lapsed node */
    assert_int_equal(ka_membership_place(&st, "q", "node-8", 1, &out), 0);
    assert_string_equal(out.name, "node-12");
    l->items[1].sandboxes = 4; /* node-8 full: node-7 was the only one with room */
    assert_int_equal(ka_membership_place(&st, "p", "node-7", 5, &out), -ENOENT);
    free(ka_membership_publish(&st, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_registers_and_renews, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_nodes_and_tree, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_refused_renewal_fences, s_setup_fencing, s_teardown),
        cmocka_unit_test_setup_teardown(test_unrenewable_lease_fences, s_setup_fencing, s_teardown),
        cmocka_unit_test_setup_teardown(test_leave_ends_lease, s_setup, s_teardown),
        cmocka_unit_test(test_place_excludes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
