/*
 * Shared helpers for the runtime unit tests: an event log that actors append to and the test
 * thread waits on, and a system constructor.
 */
#ifndef RT_TEST_H
#define RT_TEST_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "krt.h"

typedef struct rt_ev {
    int kind;
    int64_t a, b, c;
} rt_ev_t;

#define RT_MAX_EVS 65536

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    rt_ev_t evs[RT_MAX_EVS];
    bool used[RT_MAX_EVS];
    int n;
    int64_t seq;
} rt_log = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {{0}}, {0}, 0, 0};

static inline void rt_ev(int kind, int64_t a, int64_t b, int64_t c)
{
    pthread_mutex_lock(&rt_log.lock);
    if (rt_log.n < RT_MAX_EVS) {
        rt_log.evs[rt_log.n] = (rt_ev_t){kind, a, b, c};
        rt_log.used[rt_log.n] = false;
        rt_log.n++;
    }
    pthread_cond_broadcast(&rt_log.cond);
    pthread_mutex_unlock(&rt_log.lock);
}

/* A global sequence number (for ordering checks). */
static inline int64_t rt_seq(void)
{
    pthread_mutex_lock(&rt_log.lock);
    int64_t s = ++rt_log.seq;
    pthread_mutex_unlock(&rt_log.lock);
    return s;
}

static inline void rt_reset(void)
{
    pthread_mutex_lock(&rt_log.lock);
    rt_log.n = 0;
    rt_log.seq = 0;
    pthread_mutex_unlock(&rt_log.lock);
}

/* Waits for (and consumes) the first unconsumed event of kind; false on timeout. */
static inline bool rt_wait(int kind, int timeout_ms, rt_ev_t *out)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&rt_log.lock);
    for (;;) {
        for (int i = 0; i < rt_log.n; i++) {
            if (!rt_log.used[i] && rt_log.evs[i].kind == kind) {
                rt_log.used[i] = true;
                if (out)
                    *out = rt_log.evs[i];
                pthread_mutex_unlock(&rt_log.lock);
                return true;
            }
        }
        if (pthread_cond_timedwait(&rt_log.cond, &rt_log.lock, &dl) != 0) {
            pthread_mutex_unlock(&rt_log.lock);
            return false;
        }
    }
}

/* Number of unconsumed events of kind (not consuming them). */
static inline int rt_count(int kind)
{
    int n = 0;
    pthread_mutex_lock(&rt_log.lock);
    for (int i = 0; i < rt_log.n; i++)
        n += !rt_log.used[i] && rt_log.evs[i].kind == kind;
    pthread_mutex_unlock(&rt_log.lock);
    return n;
}

static inline krt_system_t *rt_system(int schedulers)
{
    krt_config_t cfg = {.node_id = 1, .schedulers = schedulers, .name = "node-1"};
    krt_system_t *sys = krt_system_new(&cfg);
    assert_non_null(sys);
    assert_int_equal(krt_system_start(sys), 0);
    rt_reset();
    return sys;
}

static inline void rt_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
