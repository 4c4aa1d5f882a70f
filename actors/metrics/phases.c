/* ka_phases: per-sandbox phase timings. See phases.h. */
#include "phases.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "krt.h"
#include "metrics.h"

#define ID_LEN   40 /* a UUID and its NUL, with room */
#define LOG_PATH "actors/phases"

typedef struct {
    char id[ID_LEN];
    int running;  /* ka_phase_t running, -1 none */
    double began; /* ka_metric_now() when it began */
    ka_phase_times_t t;
} s_slot_t;

static pthread_mutex_t s_mu = PTHREAD_MUTEX_INITIALIZER;
static s_slot_t s_slots[KA_PHASES_SLOTS];

static const char *const s_names[KA_PHASE_N_] = {
    [KA_PHASE_STORE_INTENT] = "store_intent",       [KA_PHASE_COMPUTE_START] = "compute_start",
    [KA_PHASE_GUEST_READY] = "guest_ready",         [KA_PHASE_SUSPEND_UPLOAD] = "suspend_upload",
    [KA_PHASE_RESUME_DOWNLOAD] = "resume_download",
};

const char *ka_phase_name(ka_phase_t p)
{
    return (unsigned)p < KA_PHASE_N_ ? s_names[p] : "unknown";
}

static size_t s_hash(const char *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return (size_t)(h % KA_PHASES_SLOTS);
}

/* The slot of id; with create, a slot taken over for id if another sandbox held it.
 * NULL: no slot for id. Under s_mu. */
static s_slot_t *s_slot(const char *id, bool create)
{
    if (!id || !*id || strlen(id) >= ID_LEN)
        return NULL;
    s_slot_t *s = &s_slots[s_hash(id)];
    if (strcmp(s->id, id) == 0)
        return s;
    if (!create)
        return NULL;
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
    s->running = -1;
    for (int p = 0; p < KA_PHASE_N_; p++)
        s->t.seconds[p] = -1;
    s->t.create_seconds = -1;
    return s;
}

static void s_report(const char *id, ka_phase_t p, double seconds)
{
    ka_metric_observe(KA_METRIC_SANDBOX_PHASE, s_names[p], NULL, seconds);
    krt_log(KRT_LOG_INFO, LOG_PATH, "sandbox_phase", "sandbox=%s phase=%s ms=%.3f", id, s_names[p],
            seconds * 1e3);
}

/* Ends the running phase of s at now; its phase (or -1) and duration. Under s_mu. */
static int s_stop(s_slot_t *s, double now, double *seconds)
{
    int p = s->running;
    if (p < 0)
        return -1;
    *seconds = now - s->began;
    s->running = -1;
    s->t.seconds[p] = *seconds;
    return p;
}

void ka_phase_next(const char *id, ka_phase_t p)
{
    if ((unsigned)p >= KA_PHASE_N_)
        return;
    double now = ka_metric_now(), took = 0;
    pthread_mutex_lock(&s_mu);
    s_slot_t *s = s_slot(id, true);
    int ended = s ? s_stop(s, now, &took) : -1;
    if (s) {
        s->running = (int)p;
        s->began = now;
    }
    pthread_mutex_unlock(&s_mu);
    if (ended >= 0)
        s_report(id, (ka_phase_t)ended, took);
}

void ka_phase_end(const char *id)
{
    double now = ka_metric_now(), took = 0;
    pthread_mutex_lock(&s_mu);
    s_slot_t *s = s_slot(id, false);
    int ended = s ? s_stop(s, now, &took) : -1;
    pthread_mutex_unlock(&s_mu);
    if (ended >= 0)
        s_report(id, (ka_phase_t)ended, took);
}

void ka_phase_record(const char *id, ka_phase_t p, double seconds)
{
    if ((unsigned)p >= KA_PHASE_N_)
        return;
    pthread_mutex_lock(&s_mu);
    s_slot_t *s = s_slot(id, true);
    if (s)
        s->t.seconds[p] = seconds;
    pthread_mutex_unlock(&s_mu);
    if (s)
        s_report(id, p, seconds);
}

void ka_phase_created(const char *id, double seconds)
{
    pthread_mutex_lock(&s_mu);
    s_slot_t *s = s_slot(id, true);
    bool first = s && s->t.create_seconds < 0;
    if (first)
        s->t.create_seconds = seconds;
    pthread_mutex_unlock(&s_mu);
    if (!first)
        return;
    ka_metric_observe(KA_METRIC_SANDBOX_CREATE, NULL, NULL, seconds);
    krt_log(KRT_LOG_INFO, LOG_PATH, "sandbox_create_ready", "sandbox=%s ms=%.3f", id,
            seconds * 1e3);
}

int ka_phase_get(const char *id, ka_phase_times_t *out)
{
    pthread_mutex_lock(&s_mu);
    s_slot_t *s = s_slot(id, false);
    if (s)
        *out = s->t;
    pthread_mutex_unlock(&s_mu);
    return s ? 0 : -ENOENT;
}
