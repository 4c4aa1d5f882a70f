/*
 * Runtime benchmarks: the six workloads of bench/runtime/README.md on a 2-scheduler system.
 * Prints one "name value" line per figure (run.sh turns them into BENCH lines beside Erlang).
 * Usage: bench_runtime [name...]   (no names: all)
 */
#include "krt.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { T_GO = KRT_MSG_USER, T_RESULT, T_PING, T_PONG, T_INC, T_GET, T_TOKEN, T_NEXT };

static uint64_t s_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Completion: the last actor of a workload posts a value here. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    int64_t value;
} s_done = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0};

static void s_post(int64_t v)
{
    pthread_mutex_lock(&s_done.lock);
    s_done.value = v;
    s_done.done = true;
    pthread_cond_signal(&s_done.cond);
    pthread_mutex_unlock(&s_done.lock);
}

static int64_t s_wait(void)
{
    pthread_mutex_lock(&s_done.lock);
    while (!s_done.done)
        pthread_cond_wait(&s_done.cond, &s_done.lock);
    s_done.done = false;
    int64_t v = s_done.value;
    pthread_mutex_unlock(&s_done.lock);
    return v;
}

static krt_system_t *s_sys(void)
{
    krt_config_t cfg = {.schedulers = 2};
    krt_system_t *sys = krt_system_new(&cfg);
    if (!sys || krt_system_start(sys)) {
        fprintf(stderr, "bench: cannot start the runtime\n");
        exit(1);
    }
    return sys;
}

/* ---------------------------------------------------------------------------------------- */
/* skynet: every node a fresh actor; leaves report their number, inner nodes the sum.         */

typedef struct {
    int64_t sum;
    int pending;
} sky_t;

static const krt_behaviour_t sky_b;

/* arg packs num (low 32 bits) and size (high 32). */
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
    for (int64_t i = 0; i < 10; i++) {
        uint64_t a = (uint64_t)(num + i * sub) | ((uint64_t)sub << 32);
        krt_spawn(ctx, &sky_b, (void *)(uintptr_t)a, NULL, NULL);
    }
    return 0;
}

static void sky_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    sky_t *s = state;
    if (msg->type != T_RESULT)
        return;
    s->sum += *(const int64_t *)msg->body;
    if (--s->pending == 0) {
        krt_addr_t p = krt_parent(ctx);
        if (p == KRT_ADDR_NONE)
            s_post(s->sum);
        else
            krt_send(ctx, p, T_RESULT, &s->sum, sizeof s->sum);
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
}

static const krt_behaviour_t sky_b = {
    .kind = "sky", .state_size = sizeof(sky_t), .init = sky_init, .handle = sky_handle};

static double bench_skynet(void)
{
    krt_system_t *sys = s_sys();
    uint64_t t0 = s_ns();
    krt_system_spawn(sys, &sky_b, (void *)(uintptr_t)((uint64_t)1000000 << 32), NULL, NULL);
    int64_t sum = s_wait();
    uint64_t t1 = s_ns();
    krt_system_destroy(&sys);
    if (sum != 499999500000LL) {
        fprintf(stderr, "skynet: wrong sum %lld\n", (long long)sum);
        exit(1);
    }
    return (double)(t1 - t0) / 1111111.0;
}

/* ---------------------------------------------------------------------------------------- */
/* ping-pong                                                                                  */

typedef struct {
    krt_addr_t peer;
    int64_t left;
} pp_t;

static void pp_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    pp_t *s = state;
    if (msg->type == T_GO) {
        s->peer = *(const krt_addr_t *)msg->body;
        s->left = 1000000;
        krt_send(ctx, s->peer, T_PING, NULL, 0);
    } else if (msg->type == T_PING) {
        krt_send(ctx, msg->from, T_PONG, NULL, 0);
    } else if (msg->type == T_PONG) {
        if (--s->left == 0)
            s_post(0);
        else
            krt_send(ctx, s->peer, T_PING, NULL, 0);
    }
}
static const krt_behaviour_t pp_b = {.kind = "pp", .state_size = sizeof(pp_t), .handle = pp_handle};

static double bench_pingpong(void)
{
    krt_system_t *sys = s_sys();
    krt_addr_t a, b;
    krt_system_spawn(sys, &pp_b, NULL, NULL, &a);
    krt_system_spawn(sys, &pp_b, NULL, NULL, &b);
    uint64_t t0 = s_ns();
    krt_system_send(sys, a, T_GO, &b, sizeof b);
    s_wait();
    uint64_t t1 = s_ns();
    krt_system_destroy(&sys);
    return 2000000.0 / ((double)(t1 - t0) / 1e9);
}

/* ---------------------------------------------------------------------------------------- */
/* request/reply: krt_request with a callback and a timeout, one in flight                    */

static void rr_ask(krt_ctx_t *ctx, pp_t *s);

static void rr_got(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    pp_t *s = state;
    if (err)
        s_post(-1);
    else if (--s->left == 0)
        s_post(0);
    else
        rr_ask(ctx, s);
}

static void rr_ask(krt_ctx_t *ctx, pp_t *s)
{
    if (krt_request(ctx, s->peer, T_PING, NULL, 0, 30000, rr_got, NULL))
        s_post(-1);
}

static void rr_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    pp_t *s = state;
    if (msg->type == T_GO) {
        s->peer = *(const krt_addr_t *)msg->body;
        s->left = 1000000;
        rr_ask(ctx, s);
    } else if (msg->type == T_PING) {
        krt_reply(ctx, msg, T_PONG, NULL, 0);
    }
}
static const krt_behaviour_t rr_b = {.kind = "rr", .state_size = sizeof(pp_t), .handle = rr_handle};

static double bench_request(void)
{
    krt_system_t *sys = s_sys();
    krt_addr_t a, b;
    krt_system_spawn(sys, &rr_b, NULL, NULL, &a);
    krt_system_spawn(sys, &rr_b, NULL, NULL, &b);
    uint64_t t0 = s_ns();
    krt_system_send(sys, a, T_GO, &b, sizeof b);
    int64_t rc = s_wait();
    uint64_t t1 = s_ns();
    krt_system_destroy(&sys);
    if (rc) {
        fprintf(stderr, "request: a request failed\n");
        exit(1);
    }
    return 1000000.0 / ((double)(t1 - t0) / 1e9);
}

/* ---------------------------------------------------------------------------------------- */
/* counting                                                                                   */

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

static void driver_got(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_post(err ? -1 : *(const int64_t *)reply->body);
}

static void driver_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_GO) {
        krt_addr_t c = *(const krt_addr_t *)msg->body;
        for (int i = 0; i < 1000000; i++)
            krt_send(ctx, c, T_INC, NULL, 0);
        if (krt_request(ctx, c, T_GET, NULL, 0, 0, driver_got, NULL))
            s_post(-1);
    }
}
static const krt_behaviour_t driver_b = {.kind = "driver", .handle = driver_handle};

/* A million increments through the driver, then the count; msgs/s. */
static double s_counting_run(krt_system_t *sys, krt_addr_t c, krt_addr_t d, int64_t before)
{
    uint64_t t0 = s_ns();
    krt_system_send(sys, d, T_GO, &c, sizeof c);
    int64_t n = s_wait() - before;
    uint64_t t1 = s_ns();
    if (n != 1000000) {
        fprintf(stderr, "counting: wrong count %lld\n", (long long)n);
        exit(1);
    }
    return 1000000.0 / ((double)(t1 - t0) / 1e9);
}

/* warm: the million timed is the system's second, as in the peer's VM after its first run
 * (a fresh system's first million also pays the kernel for the pages its queue grows into) */
static double s_counting(bool warm)
{
    krt_system_t *sys = s_sys();
    krt_addr_t c, d;
    krt_system_spawn(sys, &counter_b, NULL, NULL, &c);
    krt_system_spawn(sys, &driver_b, NULL, NULL, &d);
    double rate = s_counting_run(sys, c, d, 0);
    if (warm)
        rate = s_counting_run(sys, c, d, 1000000);
    krt_system_destroy(&sys);
    return rate;
}

static double bench_counting(void)
{
    return s_counting(true);
}

static double bench_counting_first(void)
{
    return s_counting(false);
}

/* ---------------------------------------------------------------------------------------- */
/* ring                                                                                       */

typedef struct {
    krt_addr_t next;
} ring_t;

static void ring_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    ring_t *r = state;
    if (msg->type == T_NEXT) {
        r->next = *(const krt_addr_t *)msg->body;
    } else if (msg->type == T_TOKEN) {
        int64_t left = *(const int64_t *)msg->body - 1;
        if (left == 0)
            s_post(0);
        else
            krt_send(ctx, r->next, T_TOKEN, &left, sizeof left);
    }
}
static const krt_behaviour_t ring_b = {
    .kind = "ring", .state_size = sizeof(ring_t), .handle = ring_handle};

static double bench_ring(void)
{
    krt_system_t *sys = s_sys();
    krt_addr_t r[100];
    for (int i = 0; i < 100; i++)
        krt_system_spawn(sys, &ring_b, NULL, NULL, &r[i]);
    for (int i = 0; i < 100; i++)
        krt_system_send(sys, r[i], T_NEXT, &r[(i + 1) % 100], sizeof(krt_addr_t));
    int64_t hops = 100000;
    uint64_t t0 = s_ns();
    krt_system_send(sys, r[0], T_TOKEN, &hops, sizeof hops);
    s_wait();
    uint64_t t1 = s_ns();
    krt_system_destroy(&sys);
    return 100000.0 / ((double)(t1 - t0) / 1e9);
}

/* ---------------------------------------------------------------------------------------- */
/* timers                                                                                     */

#define NTIMERS 1000000
typedef struct {
    krt_timer_t t[NTIMERS];
} timers_t;

static void timers_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    timers_t *s = state;
    if (msg->type != T_GO)
        return;
    memset(s->t, 0, sizeof s->t); /* touch the pages: state allocation, not timer cost */
    uint64_t t0 = s_ns();
    for (int i = 0; i < NTIMERS; i++)
        krt_timer_arm(ctx, &s->t[i], 3600 * 1000, T_PING, 0);
    for (int i = 0; i < NTIMERS; i++)
        krt_timer_cancel(ctx, &s->t[i]);
    uint64_t t1 = s_ns();
    s_post((int64_t)(t1 - t0));
}
static const krt_behaviour_t timers_b = {
    .kind = "timers", .state_size = sizeof(timers_t), .handle = timers_handle};

static double bench_timers(void)
{
    krt_system_t *sys = s_sys();
    krt_addr_t a;
    krt_system_spawn(sys, &timers_b, NULL, NULL, &a);
    krt_system_send(sys, a, T_GO, NULL, 0);
    int64_t ns = s_wait();
    krt_system_destroy(&sys);
    return (double)ns / (2.0 * NTIMERS);
}

/* ---------------------------------------------------------------------------------------- */
/* idle actor memory                                                                          */

static int idle_init(krt_ctx_t *ctx, void *state, void *arg)
{
    if ((uintptr_t)arg)
        s_post(0);
    return 0;
}
static void idle_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
}
static const krt_behaviour_t idle_b = {
    .kind = "idle", .state_size = 16, .init = idle_init, .handle = idle_handle};

static size_t s_heap(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static double bench_idle(void)
{
    krt_system_t *sys = s_sys();
    krt_addr_t a;
    /* warm the allocator and the slot table's first chunk */
    krt_system_spawn(sys, &idle_b, (void *)1, NULL, &a);
    s_wait();
    size_t before = s_heap();
    for (int i = 0; i < 100000; i++)
        krt_system_spawn(sys, &idle_b, (void *)(uintptr_t)(i == 99999), NULL, &a);
    s_wait();
    /* let every init run (the last spawned may not be the last to init) */
    krt_stats_t st;
    for (int i = 0; i < 100; i++) {
        krt_system_stats(sys, &st);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    size_t after = s_heap();
    krt_system_destroy(&sys);
    return (double)(after - before) / 100000.0;
}

/* ---------------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    double (*fn)(void);
} s_benches[] = {
    {"spawn_skynet_1m", bench_skynet},           {"pingpong_1m", bench_pingpong},
    {"request_reply_1m", bench_request},         {"counting_1m", bench_counting},
    {"counting_1m_first", bench_counting_first}, {"ring_100x100k", bench_ring},
    {"timers_1m_arm_cancel", bench_timers},      {"idle_actor_bytes", bench_idle},
};

int main(int argc, char **argv)
{
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    for (size_t i = 0; i < sizeof s_benches / sizeof s_benches[0]; i++) {
        bool want = argc < 2;
        for (int k = 1; k < argc; k++)
            want |= strcmp(argv[k], s_benches[i].name) == 0;
        if (!want)
            continue;
        double best = 0;
        int runs = strcmp(s_benches[i].name, "idle_actor_bytes") == 0 ? 1 : 3;
        bool lower_better =
            strstr(s_benches[i].name, "skynet") || strstr(s_benches[i].name, "timers");
        for (int r = 0; r < runs; r++) {
            double v = s_benches[i].fn();
            if (r == 0 || (lower_better ? v < best : v > best))
                best = v;
        }
        printf("%s %.1f\n", s_benches[i].name, best);
        fflush(stdout);
    }
    return 0;
}
