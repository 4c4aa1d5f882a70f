/*
 * System lifecycle: creating, starting, stopping and destroying a system (stop signals the
 * top-level actors and waits for the tree to drain), statistics, error names, clocks.
 */
#include "krt_int.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define KRT_STOP_WAIT_MS 10000

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                              */

const char *krt_strerror(int err)
{
    switch (err) {
    case KRT_OK:
        return "ok";
    case KRT_ENOACTOR:
        return "no such actor";
    case KRT_ETIMEDOUT:
        return "timed out";
    case KRT_ENOMEM:
        return "out of memory";
    case KRT_ESHUTDOWN:
        return "system is stopping";
    case KRT_EINVAL:
        return "invalid argument";
    case KRT_EEXIST:
        return "name already registered";
    case KRT_EREMOTE:
        return "node unreachable";
    case KRT_EMSGSIZE:
        return "message too large or not sendable off-node";
    case KRT_ENOCONN:
        return "the target's node is down";
    default:
        return err < 0 ? strerror(-err) : "unknown error";
    }
}

uint64_t krt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void krt_deadline(clockid_t clock, int timeout_ms, struct timespec *dl)
{
    clock_gettime(clock, dl);
    if (timeout_ms < 0)
        return;
    dl->tv_sec += timeout_ms / 1000;
    dl->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl->tv_nsec >= 1000000000L) {
        dl->tv_sec++;
        dl->tv_nsec -= 1000000000L;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* System lifecycle                                                                           */

/* Live actors: spawned minus stopped, summed over schedulers (transiently off by in-flight). */
static int64_t s_live(krt_system_t *sys)
{
    int64_t n = (int64_t)atomic_load(&sys->ext_spawned) - (int64_t)atomic_load(&sys->ext_exited);
    for (int i = 0; i < sys->n_sched; i++) {
        n += (int64_t)atomic_load_explicit(&sys->scheds[i].spawned, memory_order_acquire);
        n -= (int64_t)atomic_load_explicit(&sys->scheds[i].exited, memory_order_acquire);
    }
    return n;
}

/* 1 .. 2^23: every slot still has at least 2^23 generations before it retires. */
static uint32_t s_gen_base(void)
{
    uint32_t r;
    if (getrandom(&r, sizeof r, 0) != sizeof r)
        r = (uint32_t)krt_wall_ms() ^ ((uint32_t)getpid() << 8);
    return 1 + (r & ((UINT32_C(1) << 23) - 1));
}

krt_system_t *krt_system_new(const krt_config_t *cfg)
{
    krt_config_t c = cfg ? *cfg : (krt_config_t){0};
    krt_system_t *sys = calloc(1, sizeof *sys);
    if (!sys)
        return NULL;
    sys->node_id = c.node_id ? c.node_id : 1;
    int n = c.schedulers > 0 ? c.schedulers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    sys->n_sched = n < 1 ? 1 : n > 64 ? 64 : n;
    sys->n_jobs = c.job_threads > 0 ? c.job_threads : 2;
    sys->budget = c.turn_budget > 0 ? (uint32_t)c.turn_budget : 64;
    /* Grow malloc heaps in big steps: millions of small actor blocks otherwise cost one
     * mprotect/brk per few KiB (process-wide setting, harmless for other code). */
    mallopt(M_TOP_PAD, 64 << 20);
    if (c.name) {
        sys->name = strdup(c.name);
    } else {
        char buf[32];
        snprintf(buf, sizeof buf, "node-%u", sys->node_id);
        sys->name = strdup(buf);
    }
    atomic_init(&sys->next_slot, 1);
    sys->gen_base = s_gen_base();
    pthread_mutex_init(&sys->slot_lock, NULL);
    pthread_mutex_init(&sys->pool_lock, NULL);
    pthread_mutex_init(&sys->transport_lock, NULL);
    pthread_mutex_init(&sys->wait_lock, NULL);
    pthread_cond_init(&sys->wait_cond, NULL);
    sys->root = calloc(1, sizeof(krt_actor_t));
    sys->scheds = calloc((size_t)sys->n_sched, sizeof(krt_sched_t));
    if (!sys->name || !sys->root || !sys->scheds) {
        krt_system_destroy(&sys);
        return NULL;
    }
    sys->root->flags = KRT_AF_ROOT;
    uint64_t now = krt_now_ms();
    for (int i = 0; i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        s->sys = sys;
        s->idx = i;
        s->spin = KRT_SPIN_MAX;
        krt__wheel_init(&s->wheel, now);
        s->ctx.sys = sys;
        s->ctx.sched = s;
    }
    if (!(sys->io = krt__io_new(sys)) || !(sys->reg = krt__reg_new()) ||
        !(sys->remote = krt__remote_new())) {
        krt_system_destroy(&sys);
        return NULL;
    }
    return sys;
}

int krt_system_start(krt_system_t *sys)
{
    if (atomic_exchange(&sys->started, 1))
        return 0;
    for (int i = 0; i < sys->n_sched; i++) {
        if (pthread_create(&sys->scheds[i].thread, NULL, krt__sched_main, &sys->scheds[i]) != 0) {
            sys->n_sched = i; /* run with what started */
            if (!i)
                return KRT_ENOMEM;
            break;
        }
    }
    return krt__io_start(sys->io);
}

/* Frees actors that never stopped (system not started, or stuck past the stop deadline). */
static void s_force_cleanup(krt_system_t *sys)
{
    for (;;) {
        krt__lock(&sys->tree_lock);
        krt_actor_t *a = sys->root->first_child;
        while (a && a->first_child)
            a = a->first_child;
        krt__unlock(&sys->tree_lock);
        if (!a)
            break;
        if (a->exit_reason == 0)
            a->exit_reason = KRT_EXIT_SHUTDOWN;
        krt__slot_kill(sys, a);
        krt__cleanup(sys, NULL, a);
    }
}

void krt_system_stop(krt_system_t *sys)
{
    if (!sys || krt__self_sched(sys)) /* from inside an actor it would wait for itself */
        return;
    if (atomic_exchange(&sys->stopped, 1))
        return;
    krt__lock(&sys->tree_lock);
    atomic_store(&sys->stopping, 1);
    for (krt_actor_t *c = sys->root->first_child; c; c = c->next_sib)
        krt__signal(sys, c, KRT_SIG_SHUTDOWN);
    krt__unlock(&sys->tree_lock);
    if (atomic_load(&sys->started)) {
        uint64_t deadline = krt_now_ms() + KRT_STOP_WAIT_MS;
        while (s_live(sys) > 0 && krt_now_ms() < deadline) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
        if (s_live(sys) > 0)
            krt_log(KRT_LOG_WARN, sys->name, "stop_timeout", "live=%lld", (long long)s_live(sys));
        atomic_store(&sys->quit, 1);
        for (int i = 0; i < sys->n_sched; i++) {
            atomic_store(&sys->scheds[i].wake, 1);
            krt__futex_wake(&sys->scheds[i].wake);
        }
        for (int i = 0; i < sys->n_sched; i++)
            pthread_join(sys->scheds[i].thread, NULL);
    }
    krt__io_stop(sys->io);
    s_force_cleanup(sys);
}

void krt_system_destroy(krt_system_t **sys_p)
{
    if (!sys_p || !*sys_p)
        return;
    krt_system_t *sys = *sys_p;
    *sys_p = NULL;
    if (sys->scheds && sys->root)
        krt_system_stop(sys);
    krt__io_destroy(&sys->io);
    krt__reg_destroy(&sys->reg);
    krt__remote_destroy(&sys->remote);
    krt__nodes_fini(sys);
    for (int i = 0; sys->scheds && i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        krt__wheel_free_heap(&s->wheel);
        for (int c = 0; c < KRT_ACACHE_CLASSES; c++) {
            while (s->acache[c]) {
                void *blk = s->acache[c];
                memcpy(&s->acache[c], blk, sizeof(void *));
                free(blk);
            }
        }
        free(s->free_slots);
        krt__requests_fini(s);
    }
    for (uint32_t i = 0; i < KRT_NCHUNKS; i++)
        free(atomic_load(&sys->chunks[i]));
    free(sys->gfree);
    free(sys->scheds);
    free(sys->root);
    free(sys->name);
    pthread_mutex_destroy(&sys->slot_lock);
    pthread_mutex_destroy(&sys->pool_lock);
    pthread_mutex_destroy(&sys->transport_lock);
    pthread_mutex_destroy(&sys->wait_lock);
    pthread_cond_destroy(&sys->wait_cond);
    free(sys);
}

void krt_system_stats(krt_system_t *sys, krt_stats_t *out)
{
    memset(out, 0, sizeof *out);
    uint64_t spawned = atomic_load(&sys->ext_spawned);
    for (int i = 0; i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        spawned += atomic_load_explicit(&s->spawned, memory_order_relaxed);
        out->messages += atomic_load_explicit(&s->handled, memory_order_relaxed);
        out->timers_armed += __atomic_load_n(&s->wheel.count, __ATOMIC_RELAXED);
        out->bytes_spare += __atomic_load_n(&s->acache_bytes, __ATOMIC_RELAXED);
    }
    int64_t live = s_live(sys);
    out->actors_live = live > 0 ? (uint64_t)live : 0;
    out->actors_spawned = spawned;
    int64_t bytes = atomic_load(&sys->ext_bytes);
    for (int i = 0; i < sys->n_sched; i++)
        bytes += atomic_load_explicit(&sys->scheds[i].bytes, memory_order_relaxed);
    bytes += (int64_t)out->actors_live * (int64_t)sizeof(krt_slot_t);
    out->bytes_live = bytes > 0 ? (uint64_t)bytes : 0;
}

void krt_log_actor(krt_ctx_t *ctx, krt_log_level_t level, const char *event, const char *fmt, ...)
{
    if (!krt_log_enabled(level))
        return;
    char path[256];
    krt_actor_t *a = ctx->actor;
    snprintf(path, sizeof path, "%s/%s-%llx", ctx->sys->name, a->name ? a->name : a->b->kind,
             (unsigned long long)(a->addr & KRT_LOCAL_MASK));
    va_list ap;
    va_start(ap, fmt);
    krt_vlog(level, path, event, fmt, ap);
    va_end(ap);
}
