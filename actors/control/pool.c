/* ka_pool: warm sandboxes per template revision (see pool.h). */
#include "pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics.h"
#include "peer.h"
#include "phases.h"
#include "store.h"

#define KEY_LEN     (KA_STORE_NS_LEN + KA_STORE_TNAME_LEN + 2)
#define ASK_SLOTS   32 /* template refreshes in flight */
#define ASK_LIST    (ASK_SLOTS + 1)
#define ASK_TIMEOUT (15 * 60 * 1000)
#define MARKER_MAX  (KA_POOL_DIR_MAX + KA_STORE_ID_LEN + 2)
#define DISCARD_MAX 256 /* markers of a previous run discarded at start */

/* Who frees a boot job: the pool (it handles JOB_DONE) or the job (the pool is gone). */
enum { JOB_RUNNING, JOB_FINISHED, JOB_ORPHANED };

/* One warm sandbox, booted and idle. */
typedef struct s_warm s_warm_t;
struct s_warm {
    s_warm_t *next;
    char id[KA_STORE_ID_LEN];
    ka_sandbox_t *sb;
    uint64_t tag; /* its fd watch */
};

/* One template's pool: the revision it keeps warm. */
typedef struct s_target s_target_t;
struct s_target {
    s_target_t *next;
    char key[KEY_LEN];
    ka_tpl_resolved_t res;
    const ka_warm_cfg_t *cfg;
    s_warm_t *ready;
    uint32_t n_ready;
    uint32_t booting;
};

/* A warm boot or stop on a job thread; only that thread touches it until JOB_DONE. A stop frees
 * itself; a boot is the pool's unless orphaned. */
typedef struct s_job s_job_t;
struct s_job {
    s_job_t *next; /* the pool's boots in flight */
    bool boot;
    ka_driver_t *driver;
    char id[KA_STORE_ID_LEN];
    char key[KEY_LEN];
    char revision[KA_STORE_REV_LEN];
    char rootfs[1024];
    char marker[MARKER_MAX]; /* "" none */
    ka_sandbox_t *sb;
    uint64_t ref;
    double began;
    atomic_int owner;
};

struct ka_pool {
    ka_pool_opts_t o;
    ka_warm_cfg_t pools[KA_POOL_MAX_POOLS];
    char dir[KA_POOL_DIR_MAX];
    s_target_t *targets;
    s_job_t *boots;
    uint32_t n_boots;
    krt_timer_t pump;
    int64_t last_take_ms;  /* the last create (refills wait for quiet after it) */
    int64_t hold_until_ms; /* a boot failed: none before then */
    uint64_t next_tag;
    uint64_t hits, misses, refills;
    krt_addr_t subscribed; /* the store instance whose events reach the manager */
    bool active;           /* some pool keeps sandboxes warm */
    struct s_ask {
        ka_pool_t *p;
        char key[KEY_LEN]; /* "" free */
    } asks[ASK_SLOTS];     /* template refreshes in flight; each one's address is its user */
};

static void s_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void s_marker(const ka_pool_t *p, const char *id, char *out, size_t cap)
{
    if (p->dir[0])
        snprintf(out, cap, "%s/%s", p->dir, id);
    else
        out[0] = '\0';
}

static void s_unmark(const char *marker)
{
    if (marker[0])
        unlink(marker);
}

static const ka_warm_cfg_t *s_cfg(const ka_pool_t *p, const char *pool)
{
    for (size_t i = 0; i < p->o.n_pools; i++)
        if (strcmp(p->pools[i].name, pool) == 0)
            return p->pools[i].warm > 0 ? &p->pools[i] : NULL;
    return NULL;
}

static s_target_t *s_target(const ka_pool_t *p, const char *key)
{
    for (s_target_t *t = p->targets; t; t = t->next)
        if (strcmp(t->key, key) == 0)
            return t;
    return NULL;
}

/* Warm sandboxes of pool cfg, ready and booting. */
static size_t s_held(const ka_pool_t *p, const ka_warm_cfg_t *cfg)
{
    size_t n = 0;
    for (const s_target_t *t = p->targets; t; t = t->next)
        if (t->cfg == cfg)
            n += t->n_ready + t->booting;
    return n;
}

/* What the manager holds for pool cfg (live sandboxes, creates admitted). */
static size_t s_used(const ka_pool_t *p, const ka_warm_cfg_t *cfg)
{
    return p->o.used ? p->o.used(p->o.used_arg, cfg->name) : 0;
}

/* Room for one more warm boot of pool cfg. */
static bool s_room(const ka_pool_t *p, const ka_warm_cfg_t *cfg)
{
    return ka_pool_room(cfg->capacity, s_used(p, cfg), s_held(p, cfg));
}

/* ---- jobs ---------------------------------------------------------------------------------- */

static int s_job_boot(s_job_t *j)
{
    if (j->marker[0]) { /* first: a crash from here on leaves a name for the next start */
        int fd = open(j->marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
            return -errno;
        close(fd);
    }
    const char *lower[] = {j->rootfs};
    ka_sandbox_spec_t spec = {.id = j->id, .lowerdirs = lower, .n_lower = 1};
    ka_phase_next(j->id, KA_PHASE_COMPUTE_START); /* the sandbox's phases, as a cold boot's */
    int rc = ka_driver_start(j->driver, &spec, &j->sb);
    ka_phase_end(j->id);
    if (rc)
        s_unmark(j->marker);
    return rc;
}

static int s_job_run(void *arg)
{
    s_job_t *j = arg;
    if (!j->boot) { /* a stop: the job owns everything */
        ka_driver_stop(j->driver, &j->sb);
        s_unmark(j->marker);
        free(j);
        return 0;
    }
    int rc = s_job_boot(j);
    if (atomic_exchange(&j->owner, JOB_FINISHED) == JOB_ORPHANED) { /* nobody will take it */
        if (j->sb)
            ka_driver_stop(j->driver, &j->sb);
        s_unmark(j->marker);
        free(j);
    }
    return rc;
}

/* Discards what the driver kept for the ids a previous run left markers for (then the
 * markers). arg: a NULL-terminated array of marker paths, freed here. */
static int s_job_discard(void *arg)
{
    char **paths = arg;
    ka_driver_t *driver = (ka_driver_t *)paths[0];
    for (size_t i = 1; paths[i]; i++) {
        const char *id = strrchr(paths[i], '/');
        ka_driver_discard(driver, id ? id + 1 : paths[i]);
        unlink(paths[i]);
        free(paths[i]);
    }
    free(paths);
    return 0;
}

/* Stops a warm sandbox on a job thread (or here, if no job can be had). */
static void s_stop(krt_ctx_t *ctx, ka_pool_t *p, const char *id, ka_sandbox_t **sb)
{
    s_job_t *j = calloc(1, sizeof *j);
    uint64_t ref;
    if (j) {
        j->driver = p->o.driver;
        j->sb = *sb;
        s_copy(j->id, sizeof j->id, id);
        s_marker(p, id, j->marker, sizeof j->marker);
        if (krt_job_submit(ctx, s_job_run, j, &ref) == 0) {
            *sb = NULL;
            return;
        }
        free(j);
    }
    char marker[MARKER_MAX];
    s_marker(p, id, marker, sizeof marker);
    ka_driver_stop(p->o.driver, sb);
    s_unmark(marker);
}

/* A UUIDv7 like the store's ids (RFC 9562: 48 bits of Unix ms, version 7, variant 10). */
static int s_uuidv7(char out[KA_STORE_ID_LEN])
{
    uint8_t b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        return -EIO;
    uint64_t ms = (uint64_t)krt_wall_ms();
    for (int i = 0; i < 6; i++)
        b[i] = (uint8_t)(ms >> (40 - 8 * i));
    b[6] = (uint8_t)(0x70 | (b[6] & 0x0f));
    b[8] = (uint8_t)(0x80 | (b[8] & 0x3f));
    snprintf(out, KA_STORE_ID_LEN,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    return 0;
}

static int s_boot(krt_ctx_t *ctx, ka_pool_t *p, s_target_t *t)
{
    s_job_t *j = calloc(1, sizeof *j);
    if (!j || s_uuidv7(j->id)) {
        free(j);
        return -ENOMEM;
    }
    j->boot = true;
    j->driver = p->o.driver;
    s_copy(j->key, sizeof j->key, t->key);
    s_copy(j->revision, sizeof j->revision, t->res.revision);
    s_copy(j->rootfs, sizeof j->rootfs, t->res.rootfs);
    s_marker(p, j->id, j->marker, sizeof j->marker);
    j->began = ka_metric_now();
    atomic_init(&j->owner, JOB_RUNNING);
    if (krt_job_submit(ctx, s_job_run, j, &j->ref)) {
        free(j);
        return -ENOMEM;
    }
    j->next = p->boots;
    p->boots = j;
    p->n_boots++;
    t->booting++;
    return 0;
}

/* ---- filling ------------------------------------------------------------------------------- */

/* The target with the largest deficit that has room, or NULL. */
static s_target_t *s_neediest(const ka_pool_t *p)
{
    s_target_t *best = NULL;
    int64_t need = 0;
    for (s_target_t *t = p->targets; t; t = t->next) {
        int64_t d = (int64_t)t->cfg->warm - (int64_t)(t->n_ready + t->booting);
        if (d > need && t->res.rootfs[0] && s_room(p, t->cfg)) {
            best = t;
            need = d;
        }
    }
    return best;
}

/* Stops ready warm sandboxes of any pool whose used + warm exceeds its capacity (creates took
 * the room): a warm sandbox stays only if it would have room to boot now. */
static void s_trim(krt_ctx_t *ctx, ka_pool_t *p)
{
    for (s_target_t *t = p->targets; t; t = t->next)
        while (t->ready &&
               !ka_pool_room(t->cfg->capacity, s_used(p, t->cfg), s_held(p, t->cfg) - 1)) {
            s_warm_t *w = t->ready;
            t->ready = w->next;
            t->n_ready--;
            krt_fd_unwatch(ctx, ka_driver_channel(p->o.driver, w->sb));
            s_stop(ctx, p, w->id, &w->sb);
            free(w);
        }
}

/* Starts the boots the pools lack, once creates have been quiet long enough. */
static void s_pump(krt_ctx_t *ctx, ka_pool_t *p)
{
    s_trim(ctx, p);
    int64_t now = krt_mono_ms();
    int64_t quiet = p->o.quiet_ms ? p->o.quiet_ms : KA_POOL_QUIET_MS;
    int64_t at = p->last_take_ms + quiet;
    if (p->hold_until_ms > at)
        at = p->hold_until_ms;
    if (now < at) {
        krt_timer_arm(ctx, &p->pump, (uint64_t)(at - now), KA_POOL_MSG_PUMP, 0);
        return;
    }
    while (p->n_boots < KA_POOL_PARALLEL) {
        s_target_t *t = s_neediest(p);
        if (!t || s_boot(ctx, p, t))
            break;
    }
}

/* A boot held back by a pool's capacity waits for room: nothing else pumps once creates stop
 * (a node full of sandboxes that are then deleted would keep its pools empty until the next
 * create). */
void ka_pool_freed(krt_ctx_t *ctx, ka_pool_t *p)
{
    if (p)
        s_pump(ctx, p);
}

static void s_watch(krt_ctx_t *ctx, ka_pool_t *p, s_warm_t *w)
{
    w->tag = ++p->next_tag;
    krt_fd_watch(ctx, ka_driver_channel(p->o.driver, w->sb), KRT_FD_READ, w->tag);
}

static void s_add_ready(krt_ctx_t *ctx, ka_pool_t *p, s_target_t *t, const char *id,
                        ka_sandbox_t **sb)
{
    s_warm_t *w = calloc(1, sizeof *w);
    if (!w) {
        s_stop(ctx, p, id, sb);
        return;
    }
    s_copy(w->id, sizeof w->id, id);
    w->sb = *sb;
    *sb = NULL;
    w->next = t->ready;
    t->ready = w;
    t->n_ready++;
    s_watch(ctx, p, w);
}

/* Empties t (its warm sandboxes are stopped; boots in flight are stopped when they end). */
static void s_drain(krt_ctx_t *ctx, ka_pool_t *p, s_target_t *t)
{
    while (t->ready) {
        s_warm_t *w = t->ready;
        t->ready = w->next;
        krt_fd_unwatch(ctx, ka_driver_channel(p->o.driver, w->sb));
        s_stop(ctx, p, w->id, &w->sb);
        free(w);
    }
    t->n_ready = 0;
}

/* The template now pins res (a new revision: its pool is rebuilt), in pool cfg. */
static s_target_t *s_retarget(krt_ctx_t *ctx, ka_pool_t *p, const char *key,
                              const ka_tpl_resolved_t *res, const ka_warm_cfg_t *cfg)
{
    s_target_t *t = s_target(p, key);
    if (!t) {
        if (!(t = calloc(1, sizeof *t)))
            return NULL;
        s_copy(t->key, sizeof t->key, key);
        t->next = p->targets;
        p->targets = t;
    } else if (strcmp(t->res.revision, res->revision) != 0) {
        krt_log_actor(ctx, KRT_LOG_INFO, "warm_pool_rebuilt", "template=%s revision=%.16s", key,
                      res->revision);
        s_drain(ctx, p, t);
    }
    t->res = *res;
    t->cfg = cfg;
    return t;
}

static void s_forget(krt_ctx_t *ctx, ka_pool_t *p, const char *key)
{
    for (s_target_t **pp = &p->targets; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->key, key) == 0) {
            s_target_t *t = *pp;
            s_drain(ctx, p, t);
            *pp = t->next;
            free(t);
            krt_log_actor(ctx, KRT_LOG_INFO, "warm_pool_dropped", "template=%s", key);
            return;
        }
}

/* ---- learning templates -------------------------------------------------------------------- */

static void s_on_resolved(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);

/* Asks the templates actor what ns/name (key) pins now. */
static void s_refresh(krt_ctx_t *ctx, ka_pool_t *p, const char *key)
{
    size_t slot = ASK_SLOTS;
    for (size_t i = 0; i < ASK_SLOTS; i++) {
        if (strcmp(p->asks[i].key, key) == 0)
            return; /* one in flight sees this change too */
        if (!p->asks[i].key[0] && slot == ASK_SLOTS)
            slot = i;
    }
    const char *slash = strchr(key, '/');
    if (slot == ASK_SLOTS || !slash)
        return; /* too many at once: the next create of it refreshes it */
    ka_tpl_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.namespace_, sizeof k.namespace_, "%.*s", (int)(slash - key), key);
    s_copy(k.name, sizeof k.name, slash + 1);
    if (krt_request(ctx, ka_peer(ctx, p->o.templates), KA_TPL_RESOLVE, &k, sizeof k, ASK_TIMEOUT,
                    s_on_resolved, &p->asks[slot]) == 0) {
        p->asks[slot].p = p;
        s_copy(p->asks[slot].key, sizeof p->asks[slot].key, key);
    }
}

static void s_on_resolved(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    struct s_ask *ask = user;
    ka_pool_t *p = ask->p;
    char key[KEY_LEN];
    s_copy(key, sizeof key, ask->key);
    ask->key[0] = '\0';
    err = ka_reply_outcome(err, msg, sizeof(ka_tpl_resolved_t), NULL);
    const ka_tpl_resolved_t *res = err ? NULL : msg->body;
    if (ka_err_code(err) == KA_NOT_FOUND) {
        s_forget(ctx, p, key);
    } else if (res && msg->len == sizeof *res) {
        const ka_warm_cfg_t *cfg = s_cfg(p, res->pool);
        if (!cfg)
            s_forget(ctx, p, key);
        else
            s_retarget(ctx, p, key, res, cfg);
        s_pump(ctx, p);
    }
}

static void s_on_listed(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    ka_pool_t *p = user;
    if (ka_reply_outcome(err, msg, sizeof(ka_tpl_reply_t), NULL))
        return;
    const ka_tpl_reply_t *r = msg->body;
    size_t blen = msg->len - offsetof(ka_tpl_reply_t, blob);
    for (const ka_store_template_t *t = ka_store_blob_next(&r->blob, blen, NULL); t;
         t = ka_store_blob_next(&r->blob, blen, t)) {
        char key[KEY_LEN];
        snprintf(key, sizeof key, "%s/%s", t->namespace_, t->name);
        if (!t->deleted && t->latest_revision[0])
            s_refresh(ctx, p, key);
    }
}

/* A restarted store (new address) forgot the subscription: subscribe again. */
static void s_follow_store(krt_ctx_t *ctx, ka_pool_t *p)
{
    krt_addr_t store = ka_peer(ctx, p->o.store);
    if (store == p->subscribed || store == KRT_ADDR_NONE)
        return;
    ka_store_subscribe_t sub = {KRT_ADDR_NONE};
    if (krt_send(ctx, store, KA_STORE_SUBSCRIBE, &sub, sizeof sub) == 0)
        p->subscribed = store;
}

static void s_on_event(krt_ctx_t *ctx, ka_pool_t *p, const krt_msg_t *msg)
{
    const ka_store_event_t *ev = msg->body;
    if (msg->len != sizeof *ev || strcmp(ev->channel, "ka_template") != 0 ||
        !memchr(ev->payload, 0, sizeof ev->payload))
        return;
    char key[KEY_LEN];
    snprintf(key, sizeof key, "%.*s", (int)strcspn(ev->payload, " "), ev->payload);
    s_refresh(ctx, p, key);
}

/* ---- jobs done, guests lost ---------------------------------------------------------------- */

static s_job_t *s_take_boot(ka_pool_t *p, uint64_t ref)
{
    for (s_job_t **pp = &p->boots; *pp; pp = &(*pp)->next)
        if ((*pp)->ref == ref) {
            s_job_t *j = *pp;
            *pp = j->next;
            p->n_boots--;
            return j;
        }
    return NULL;
}

static void s_on_job_done(krt_ctx_t *ctx, ka_pool_t *p, s_job_t *j, int rc)
{
    s_target_t *t = s_target(p, j->key);
    if (t && t->booting)
        t->booting--;
    if (rc || !j->sb) {
        krt_log_actor(ctx, KRT_LOG_WARN, "warm_boot_failed", "template=%s rc=%d", j->key, rc);
        p->hold_until_ms = krt_mono_ms() + KA_POOL_RETRY_MS;
    } else if (!t || strcmp(t->res.revision, j->revision) != 0) { /* rebuilt or dropped since */
        s_stop(ctx, p, j->id, &j->sb);
    } else {
        double s = ka_metric_now() - j->began;
        p->refills++;
        ka_metric_observe(KA_METRIC_WARM_REFILL, t->cfg->name, NULL, s);
        krt_log_actor(ctx, KRT_LOG_DEBUG, "warm_booted", "template=%s sandbox=%s ms=%.1f", j->key,
                      j->id, s * 1000);
        s_add_ready(ctx, p, t, j->id, &j->sb);
    }
    free(j);
    s_pump(ctx, p);
}

/* A warm guest's channel became readable: it exited or spoke unasked. Either way it is not
 * handed out: stopped and replaced. */
static void s_on_fd(krt_ctx_t *ctx, ka_pool_t *p, const krt_fd_event_t *ev)
{
    for (s_target_t *t = p->targets; t; t = t->next)
        for (s_warm_t **pp = &t->ready; *pp; pp = &(*pp)->next)
            if ((*pp)->tag == ev->tag) {
                s_warm_t *w = *pp;
                *pp = w->next;
                t->n_ready--;
                krt_log_actor(ctx, KRT_LOG_WARN, "warm_guest_lost", "template=%s sandbox=%s",
                              t->key, w->id);
                krt_fd_unwatch(ctx, ev->fd);
                s_stop(ctx, p, w->id, &w->sb);
                free(w);
                s_pump(ctx, p);
                return;
            }
}

bool ka_pool_handle(krt_ctx_t *ctx, ka_pool_t *p, const krt_msg_t *msg)
{
    if (!p || !p->active)
        return false;
    s_follow_store(ctx, p);
    switch (msg->type) {
    case KRT_MSG_JOB_DONE: {
        const krt_job_done_t *d = msg->body;
        s_job_t *j = msg->len == sizeof *d ? s_take_boot(p, msg->ref) : NULL;
        if (j)
            s_on_job_done(ctx, p, j, d->result);
        return true; /* the manager runs no other jobs; stops free themselves */
    }
    case KRT_MSG_FD_READY:
        if (msg->len == sizeof(krt_fd_event_t))
            s_on_fd(ctx, p, msg->body);
        return true;
    case KA_POOL_MSG_PUMP:
        s_pump(ctx, p);
        return true;
    case KA_STORE_EVENT:
        s_on_event(ctx, p, msg);
        return true;
    default:
        return false;
    }
}

/* ---- claims -------------------------------------------------------------------------------- */

/* True if a warm guest is still there: its idle channel has nothing to read and no hang-up. */
static bool s_alive(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
    return fd >= 0 && poll(&pf, 1, 0) == 0;
}

int ka_pool_take(krt_ctx_t *ctx, ka_pool_t *p, const char *ns, const char *name,
                 const ka_tpl_resolved_t *res, ka_pool_claim_t *out)
{
    const ka_warm_cfg_t *cfg = p ? s_cfg(p, res->pool) : NULL;
    if (!cfg)
        return -1;
    char key[KEY_LEN];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    p->last_take_ms = krt_mono_ms();
    s_target_t *t = s_retarget(ctx, p, key, res, cfg);
    int got = 0;
    while (t && t->ready && !got) {
        s_warm_t *w = t->ready;
        t->ready = w->next;
        t->n_ready--;
        int fd = ka_driver_channel(p->o.driver, w->sb);
        krt_fd_unwatch(ctx, fd);
        if (s_alive(fd)) {
            memset(out, 0, sizeof *out);
            s_copy(out->id, sizeof out->id, w->id);
            s_copy(out->key, sizeof out->key, key);
            s_copy(out->revision, sizeof out->revision, res->revision);
            out->sb = w->sb;
            got = 1;
        } else {
            krt_log_actor(ctx, KRT_LOG_WARN, "warm_guest_lost", "template=%s sandbox=%s", key,
                          w->id);
            s_stop(ctx, p, w->id, &w->sb);
        }
        free(w);
    }
    s_pump(ctx, p); /* arms the quiet period */
    return got;
}

void ka_pool_bound(ka_pool_t *p, const ka_pool_claim_t *c)
{
    char marker[MARKER_MAX];
    s_marker(p, c->id, marker, sizeof marker);
    s_unmark(marker);
    p->hits++;
}

void ka_pool_release(krt_ctx_t *ctx, ka_pool_t *p, ka_pool_claim_t *c, bool reuse)
{
    if (!c->sb)
        return;
    s_target_t *t = s_target(p, c->key);
    if (reuse && t && strcmp(t->res.revision, c->revision) == 0)
        s_add_ready(ctx, p, t, c->id, &c->sb);
    else
        s_stop(ctx, p, c->id, &c->sb);
}

void ka_pool_drop(ka_pool_t *p, ka_pool_claim_t *c)
{
    if (!p || !c->sb)
        return;
    char marker[MARKER_MAX];
    s_marker(p, c->id, marker, sizeof marker);
    ka_driver_stop(p->o.driver, &c->sb);
    s_unmark(marker);
}

void ka_pool_missed(ka_pool_t *p)
{
    if (p)
        p->misses++;
}

void ka_pool_report(const ka_pool_t *p, ka_sbx_count_t *out)
{
    if (!p)
        return;
    out->warm_hits = p->hits;
    out->warm_misses = p->misses;
    out->warm_refills = p->refills;
    out->n_warm = 0;
    for (const s_target_t *t = p->targets; t && out->n_warm < KA_SBX_WARM_MAX; t = t->next) {
        ka_sbx_warm_depth_t *d = &out->warm[out->n_warm++];
        const char *slash = strchr(t->key, '/');
        s_copy(d->pool, sizeof d->pool, t->cfg->name);
        snprintf(d->template_namespace, sizeof d->template_namespace, "%.*s",
                 (int)(slash ? slash - t->key : 0), t->key);
        snprintf(d->template_name, sizeof d->template_name, "%.*s",
                 (int)sizeof d->template_name - 1, slash ? slash + 1 : t->key);
        s_copy(d->revision, sizeof d->revision, t->res.revision);
        d->ready = t->n_ready;
        d->booting = t->booting;
    }
}

/* ---- start and stop ------------------------------------------------------------------------ */

/* The markers a previous run left, discarded on a job thread. */
static void s_discard_leftovers(krt_ctx_t *ctx, ka_pool_t *p)
{
    DIR *d = opendir(p->dir);
    if (!d)
        return;
    char **paths = calloc(DISCARD_MAX + 2, sizeof *paths);
    size_t n = 1;
    struct dirent *e;
    while (paths && n <= DISCARD_MAX && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= KA_STORE_ID_LEN)
            continue;
        char path[MARKER_MAX];
        int len = snprintf(path, sizeof path, "%s/%.*s", p->dir, KA_STORE_ID_LEN, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path)
            continue;
        if (!(paths[n] = strdup(path)))
            break;
        n++;
    }
    closedir(d);
    uint64_t ref;
    if (!paths || n == 1) {
        free(paths);
        return;
    }
    paths[0] = (char *)p->o.driver;
    krt_log_actor(ctx, KRT_LOG_INFO, "warm_leftovers", "discarding=%zu", n - 1);
    if (krt_job_submit(ctx, s_job_discard, paths, &ref))
        s_job_discard(paths);
}

ka_pool_t *ka_pool_new(krt_ctx_t *ctx, const ka_pool_opts_t *opts)
{
    ka_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->o = *opts;
    p->o.n_pools = opts->n_pools < KA_POOL_MAX_POOLS ? opts->n_pools : KA_POOL_MAX_POOLS;
    memcpy(p->pools, opts->pools, p->o.n_pools * sizeof p->pools[0]);
    p->o.pools = p->pools;
    s_copy(p->dir, sizeof p->dir, opts->dir);
    if (p->dir[0] && mkdir(p->dir, 0700) < 0 && errno != EEXIST)
        p->dir[0] = '\0';
    if (p->dir[0])
        s_discard_leftovers(ctx, p);
    for (size_t i = 0; i < p->o.n_pools; i++)
        p->active = p->active || p->pools[i].warm > 0;
    if (!p->active)
        return p;
    s_follow_store(ctx, p);
    ka_tpl_key_t all;
    memset(&all, 0, sizeof all);
    krt_request(ctx, ka_peer(ctx, p->o.templates), KA_TPL_LIST, &all, sizeof all, ASK_TIMEOUT,
                s_on_listed, p);
    return p;
}

void ka_pool_destroy(krt_ctx_t *ctx, ka_pool_t **pp)
{
    ka_pool_t *p = pp ? *pp : NULL;
    if (!p)
        return;
    krt_timer_cancel(ctx, &p->pump); /* the actor's timer list must not keep it */
    while (p->targets) {
        s_target_t *t = p->targets;
        p->targets = t->next;
        while (t->ready) {
            s_warm_t *w = t->ready;
            t->ready = w->next;
            ka_pool_claim_t c = {.sb = w->sb};
            s_copy(c.id, sizeof c.id, w->id);
            ka_pool_drop(p, &c);
            free(w);
        }
        free(t);
    }
    while (p->boots) {
        s_job_t *j = p->boots;
        p->boots = j->next;
        if (atomic_exchange(&j->owner, JOB_ORPHANED) == JOB_FINISHED) { /* done, not handled */
            if (j->sb)
                ka_driver_stop(j->driver, &j->sb);
            s_unmark(j->marker);
            free(j);
        }
    }
    free(p);
    *pp = NULL;
}
