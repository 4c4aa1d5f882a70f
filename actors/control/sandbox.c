/*
 * ka_sandbox: one actor per live sandbox: its lifecycle as an explicit state machine, its TTL
 * timer and owner checks (the guest channel is sandbox_guest.c).
 *
 * s_table says, for every state and event, what happens: an action, or a refusal with one code
 * and message (ABORTED while a conflicting attempt runs, FAILED_PRECONDITION where the state
 * does not allow it, as the reference answers). A lifecycle operation persists its intent, does
 * its blocking part on a job thread (driver start, stop and halt, snapshot copies: nothing blocks
 * a scheduler thread but the actor's end, which parks its compute at once so that the record's
 * next owner finds it parked), then persists its result and answers. A result describes work
 * already done, so its write is sent again while the store is away (the caller waits). Delete
 * (and expiry, a delete without a caller) waits for a running operation and then supersedes it.
 * Only delete and expiry remove a sandbox's /data: a sandbox whose compute was lost comes back
 * SUSPENDED (ComputeLost) and a resume boots it on the /data the driver kept.
 *
 * Pause (beyond the reference) freezes a READY sandbox's processes in its cgroup (PAUSED:
 * memory kept, no CPU, the TTL runs on) and unpause thaws them; both are a bounded driver call
 * of a few ms made in the actor (no job: a thaw is a cgroup write and one poll), and neither
 * is persisted: the record stays READY, the reply says paused. Guest calls on a paused sandbox
 * are refused (those already open wait: their idle deadline stops while paused and starts again
 * at unpause); suspend is refused too (unpause first: a suspend saves what the caller left
 * running, not what it froze). Delete, expiry and a guest lost thaw it first, then go on as
 * from READY.
 *
 * Fork (beyond the reference): the manager records the forks (CREATING, the intent) and asks
 * the source's actor to copy itself for them (KA_SBX_FORK_COPY_). A READY source is frozen as
 * a pause freezes it, FORKING while a job copies its /data and root changes for each fork
 * (the driver keeps them under the fork's id), and thawed when the job ends, done or not; the
 * manager then boots the forks on their copies. Not persisted: a crash leaves the source READY
 * (then SUSPENDED, ComputeLost) and the forks CREATING (then FAILED, deleted as any other).
 */
#include "sandbox_int.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ka_objstore.h"
#include "metrics.h"
#include "ka_snapobj.h"
#include "ka_tree.h"
#include "peer.h"
#include "phases.h"

#define STORE_TIMEOUT_MS     30000
#define RETRY_DELETE_MS      1000
#define RETRY_RESULT_MS      500
#define FILE_SCHEME          "file://"
#define SNAPSHOT_DEADLINE_MS (10 * 60 * 1000) /* a snapshot copy ends by then, done or failed */

#define MSG_BUSY       "another lifecycle operation on this sandbox is running; retry later"
#define MSG_DELETING   "a delete of this sandbox is running"
#define MSG_IN_STATE   "cannot %s a sandbox in state %s"
#define MSG_PAUSED     "sandbox is paused; unpause it first"
#define MSG_NOT_PAUSED "the sandbox is not paused"
#define MSG_STORE      "the sandbox store is unavailable; retry"
#define MSG_LOST                                                                                   \
    "the sandbox's compute was lost when its node restarted; its /data is kept: resume it"

typedef enum { JOB_BOOT, JOB_STOP, JOB_SUSPEND, JOB_RESUME, JOB_FORK } s_job_kind_t;

/* Who frees a job: the actor (it handles JOB_DONE) or the job itself (the actor stopped). */
enum { JOB_RUNNING, JOB_FINISHED, JOB_ORPHANED };

/* The blocking part of an operation; only the job thread touches it until JOB_DONE. */
struct ka_sbx_job {
    s_job_kind_t kind;
    ka_driver_t *driver;
    char id[KA_STORE_ID_LEN];
    char rootfs[1024];
    char snapshot[PATH_MAX]; /* this sandbox's snapshot dir, or its s3:// / gs:// location */
    char revision[KA_STORE_REV_LEN];
    ka_sandbox_t *sb; /* in: to stop; out: started */
    bool lost;        /* resume: the compute was lost, its /data kept where it was */
    char err[512];
    /* failed, but the sandbox is as it was: READY with sb (booted again on its kept /data)
     * after a suspend, SUSPENDED after a resume (sb, if any, is stopped) */
    bool kept;
    bool fork;       /* boot: on the /data and root changes a fork copy kept for id */
    uint32_t n_fork; /* fork: the forks' ids */
    char forks[KA_FORK_MAX][KA_STORE_ID_LEN];
    uint64_t bytes; /* suspend, resume, fork: file bytes copied */
    double began;   /* ka_metric_now() when submitted */
    atomic_int owner;
};

/* ---- events and the transition table --------------------------------------------------------- */

typedef enum {
    EV_CREATE,        /* a create replayed by the manager (same creator and request id) */
    EV_GUEST,         /* exec, process and file calls */
    EV_SUSPEND,       /* lifecycle requests */
    EV_RESUME,        /*   " */
    EV_PAUSE,         /*   " */
    EV_UNPAUSE,       /*   " */
    EV_FORK,          /*   " (the manager, for the caller: copy me for these forks) */
    EV_DELETE,        /*   " */
    EV_TTL,           /* the sandbox expired */
    EV_GUEST_EXIT,    /* its guest went away (exited, or killed for breaking the protocol) */
    EV_RUNTIME,       /* the templates actor answered (resume of an adopted record) */
    EV_JOB_DONE,      /* the blocking part succeeded */
    EV_DRIVER_FAILED, /* ... or failed (driver start/stop/halt, snapshot copy) */
    EV_STORE_DONE,    /* an intent or result is persisted */
    EV_STORE_FAILED,  /* ... or the store refused it, or did not answer */
    EV_N
} s_event_t;

typedef struct s_ev {
    s_event_t type;
    ka_sbx_caller_t from; /* requests */
    const void *body;     /* requests: the body (checked) */
    const krt_msg_t *msg; /* completions */
    int err;              /* EV_STORE_FAILED: KA_STORE_E* */
    const char *reason;   /* EV_GUEST_EXIT */
    const char *message;  /* EV_GUEST_EXIT, EV_DRIVER_FAILED */
    bool kept;            /* EV_DRIVER_FAILED: the sandbox is as it was (object storage away) */
    int code;             /* EV_DRIVER_FAILED of a fork: the caller's negative errno */
} s_ev_t;

typedef void (*s_action_t)(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev);

/* One cell: an action, or (act NULL) a refusal answered to the caller with code (a negative
 * errno) and message (nothing when the event has no caller, or code is 0: ignored). */
typedef struct s_cell {
    s_action_t act;
    int code;
    const char *message;
} s_cell_t;

/* A refusal whose message names the operation and the state. */
static const char s_in_state[] = MSG_IN_STATE;

static void a_join(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_record(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_guest(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_suspend(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_resume(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_delete(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_queue_delete(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_expire(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_guest_failed(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_guest_later(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_runtime(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_job_done(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_job_failed(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_store_done(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_store_failed(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_bug(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_pause(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_unpause(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_thaw_then(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_fork(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);
static void a_forked(krt_ctx_t *, ka_sbx_t *, const s_ev_t *);

/* The table reads as a grid: clang-format leaves it as laid out. */
/* clang-format off */
#define DO(fn)    {fn, 0, NULL}
#define BUSY      {NULL, -EAGAIN, MSG_BUSY}
#define NOT_READY {NULL, -EBUSY, KA_MSG_NOT_READY}
#define IN_STATE  {NULL, -EBUSY, s_in_state}
#define DELETING  {NULL, -EAGAIN, MSG_DELETING}
#define IGNORE    {NULL, 0, NULL}
#define PAUSED    {NULL, -EBUSY, MSG_PAUSED}
#define UNPAUSED  {NULL, -EBUSY, MSG_NOT_PAUSED}
#define BUG       {a_bug, 0, NULL}

/* Completions of the operation a transient state runs, and of a result a stable state writes on
 * its own (FAILED for a guest lost, what a record recovered at node start becomes). */
#define RUNNING   DO(a_job_done), DO(a_job_failed), DO(a_store_done), DO(a_store_failed)
#define MARKING   BUG, BUG, DO(a_store_done), DO(a_store_failed)
#define NONE      BUG, BUG, BUG, BUG
#define FORKED    DO(a_forked), DO(a_forked), BUG, BUG

static const s_cell_t s_table[KA_SBX_N_STATES][EV_N] = {
    /*                     create        guest        suspend        resume        pause        unpause
     *                     fork          delete              ttl                 guest exit          runtime
     *                     job done, driver failed, store done, store failed */
    [KA_SBX_CREATING]   = {DO(a_join),   NOT_READY,   BUSY,          BUSY,         BUSY,        BUSY,
                           BUSY,         DO(a_queue_delete), DO(a_queue_delete), DO(a_guest_later),  BUG,
                           RUNNING},
    [KA_SBX_READY]      = {DO(a_record), DO(a_guest), DO(a_suspend), IN_STATE,     DO(a_pause), UNPAUSED,
                           DO(a_fork),   DO(a_delete),       DO(a_expire),       DO(a_guest_failed), BUG,
                           NONE},
    [KA_SBX_SUSPENDING] = {DO(a_record), NOT_READY,   BUSY,          BUSY,         BUSY,        BUSY,
                           BUSY,         DO(a_queue_delete), DO(a_queue_delete), IGNORE,             BUG,
                           RUNNING},
    [KA_SBX_SUSPENDED]  = {DO(a_record), NOT_READY,   IN_STATE,      DO(a_resume), IN_STATE,    IN_STATE,
                           IN_STATE,     DO(a_delete),       DO(a_expire),       IGNORE,             BUG,
                           MARKING},
    [KA_SBX_RESUMING]   = {DO(a_record), NOT_READY,   BUSY,          BUSY,         BUSY,        BUSY,
                           BUSY,         DO(a_queue_delete), DO(a_queue_delete), DO(a_guest_later),  DO(a_runtime),
                           RUNNING},
    [KA_SBX_DELETING]   = {DO(a_record), NOT_READY,   BUSY,          BUSY,         BUSY,        BUSY,
                           DELETING,     DELETING,           IGNORE,             IGNORE,             BUG,
                           RUNNING},
    [KA_SBX_DELETED]    = {DO(a_record), NOT_READY,   IN_STATE,      IN_STATE,     IN_STATE,    IN_STATE,
                           IN_STATE,     DO(a_record),       IGNORE,             IGNORE,             BUG,
                           NONE},
    [KA_SBX_FAILED]     = {DO(a_record), NOT_READY,   IN_STATE,      IN_STATE,     IN_STATE,    IN_STATE,
                           IN_STATE,     DO(a_delete),       DO(a_expire),       IGNORE,             BUG,
                           MARKING},
    [KA_SBX_PAUSED]     = {DO(a_record), PAUSED,      PAUSED,        PAUSED,       DO(a_record), DO(a_unpause),
                           PAUSED,       DO(a_thaw_then),    DO(a_thaw_then),    DO(a_thaw_then),    BUG,
                           NONE},
    [KA_SBX_FORKING]    = {DO(a_record), BUSY,        BUSY,          BUSY,         BUSY,        BUSY,
                           BUSY,         DO(a_queue_delete), DO(a_queue_delete), DO(a_guest_later),  BUG,
                           FORKED},
};
/* clang-format on */

/* The states each state may move to (a stable state may also be entered again). */
#define TO(s) (1u << (s))
static const uint32_t s_next[KA_SBX_N_STATES] = {
    [KA_SBX_CREATING] = TO(KA_SBX_READY) | TO(KA_SBX_FAILED),
    [KA_SBX_READY] = TO(KA_SBX_SUSPENDING) | TO(KA_SBX_DELETING) | TO(KA_SBX_FAILED) |
                     TO(KA_SBX_PAUSED) | TO(KA_SBX_FORKING),
    [KA_SBX_SUSPENDING] = TO(KA_SBX_SUSPENDED) | TO(KA_SBX_FAILED) | TO(KA_SBX_READY),
    [KA_SBX_SUSPENDED] = TO(KA_SBX_SUSPENDED) | TO(KA_SBX_RESUMING) | TO(KA_SBX_DELETING),
    [KA_SBX_RESUMING] = TO(KA_SBX_READY) | TO(KA_SBX_FAILED) | TO(KA_SBX_SUSPENDED),
    [KA_SBX_DELETING] =
        TO(KA_SBX_DELETED) | TO(KA_SBX_READY) | TO(KA_SBX_SUSPENDED) | TO(KA_SBX_FAILED),
    [KA_SBX_DELETED] = 0,
    [KA_SBX_FAILED] = TO(KA_SBX_FAILED) | TO(KA_SBX_DELETING),
    [KA_SBX_PAUSED] = TO(KA_SBX_READY),
    [KA_SBX_FORKING] = TO(KA_SBX_READY),
};

static atomic_ullong s_violations; /* transitions or events the table forbids (bugs) */

uint64_t ka_sandbox_fsm_violations(void)
{
    return atomic_load(&s_violations);
}

/* The name of a ka_sbx_state_t ("READY"). */
static const char *s_state_name(int state)
{
    static const char *const names[KA_SBX_N_STATES] = {
        "CREATING", "READY",   "SUSPENDING", "SUSPENDED", "RESUMING",
        "DELETING", "DELETED", "FAILED",     "PAUSED",    "FORKING"};
    return state >= 0 && state < KA_SBX_N_STATES ? names[state] : "?";
}

/* ---- helpers ------------------------------------------------------------------------------- */

static void s_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void s_reply_record(krt_ctx_t *ctx, ka_sbx_t *self, const ka_sbx_caller_t *c)
{
    ka_sbx_reply_t r;
    memset(&r, 0, sizeof r);
    r.sandbox = self->a.record;
    r.paused = self->state == KA_SBX_PAUSED;
    krt_reply_to(ctx, c->to, c->ref, c->type, &r, sizeof r);
}

static void s_answer(krt_ctx_t *ctx, ka_sbx_t *self, const ka_sbx_caller_t *c, int code,
                     const char *message)
{
    if (code == 0)
        s_reply_record(ctx, self, c);
    else
        ka_fail(ctx, c->to, c->ref, c->type, code, "%s", message);
}

/* The record state of a stable sandbox state. */
static int s_record_state(ka_sbx_state_t s)
{
    switch (s) {
    case KA_SBX_READY:
    case KA_SBX_PAUSED:
    case KA_SBX_FORKING:
        return KA_STATE_READY;
    case KA_SBX_SUSPENDED:
        return KA_STATE_SUSPENDED;
    case KA_SBX_DELETED:
        return KA_STATE_DELETED;
    case KA_SBX_FAILED:
        return KA_STATE_FAILED;
    default:
        return KA_STATE_CREATING;
    }
}

/* FAILED with no compute (a boot, resume or suspend that failed, a record recovered FAILED):
 * it never runs again, only a delete moves on; the manager stops counting it against its pool's
 * capacity (what the driver may keep of its /data goes with the delete). */
static void s_note_released(krt_ctx_t *ctx, ka_sbx_t *self)
{
    if (self->state != KA_SBX_FAILED || self->compute || self->released)
        return;
    self->released = true;
    krt_send(ctx, krt_parent(ctx), KA_SBX_RELEASED_, NULL, 0);
}

static void s_enter(krt_ctx_t *ctx, ka_sbx_t *self, ka_sbx_state_t to)
{
    if (!(s_next[self->state] & TO(to)) && to != self->state) {
        atomic_fetch_add(&s_violations, 1);
        krt_log_actor(ctx, KRT_LOG_ERROR, "sandbox_bad_transition", "sandbox=%s from=%s to=%s",
                      self->a.record.id, s_state_name(self->state), s_state_name(to));
    }
    self->state = to;
    s_note_released(ctx, self);
}

static bool s_busy(const ka_sbx_t *self)
{
    return self->op.phase != KA_PH_IDLE;
}

static void s_arm_ttl(krt_ctx_t *ctx, ka_sbx_t *self)
{
    int64_t left = self->a.record.expires_ms - krt_wall_ms();
    krt_timer_arm(ctx, &self->ttl, left > 0 ? (uint64_t)left : 0, KA_SBX_MSG_TTL, 0);
}

/* The directory a file:// snapshot location gives this sandbox, an s3:// or gs:// location
 * as it is (the objects are named by the sandbox id), or "" for other schemes. */
static int s_snapshot_dir(const ka_sbx_t *self, const char *location, char *out, size_t cap)
{
    out[0] = '\0';
    if (ka_objstore_is_location(location))
        return (size_t)snprintf(out, cap, "%s", location) < cap ? 0 : -ENAMETOOLONG;
    if (strncmp(location, FILE_SCHEME, strlen(FILE_SCHEME)) != 0)
        return -EPROTONOSUPPORT;
    const char *path = location + strlen(FILE_SCHEME);
    if (path[0] != '/')
        return -EINVAL;
    int n = snprintf(out, cap, "%s%s%s", path, path[strlen(path) - 1] == '/' ? "" : "/",
                     self->a.record.id);
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

/* ---- blocking work (job threads) ----------------------------------------------------------- */

/* A snapshot copy's budget: a sandbox cannot hold a job thread for longer. */
static ka_tree_opts_t s_tree_opts(int64_t owner)
{
    return (ka_tree_opts_t){.deadline_ms = krt_mono_ms() + SNAPSHOT_DEADLINE_MS, .owner = owner};
}

static int s_job_start(ka_sbx_job_t *j, bool reuse_data);

/* A snapshot copy from `from` to `to`, its file bytes counted for the metrics: a plain tree
 * copy (file://), or a save to (`to` a location) or a restore from (`from` one) object storage,
 * whose reason for a failure goes to why. */
static int s_job_copy(ka_sbx_job_t *j, const char *from, const char *to, const ka_tree_opts_t *o,
                      char *why, size_t cap)
{
    ka_tree_stats_t st = {0};
    int rc = ka_objstore_is_location(to)
                 ? ka_snapobj_save(to, j->id, j->revision, from, o, &st, why, cap)
             : ka_objstore_is_location(from) ? ka_snapobj_restore(from, j->id, to, o, &st, why, cap)
                                             : ka_tree_copy(from, to, o, &st);
    j->bytes += st.bytes;
    return rc;
}

/* After a failed save to object storage the sandbox comes back READY with its /data: the
 * halted compute is parked (its /data kept under its id) and booted again on it. 0, or the
 * error that lost it. */
static int s_job_rescue(ka_sbx_job_t *j)
{
    char err[sizeof j->err];
    s_copy(err, sizeof err, j->err);
    int rc = ka_driver_park(j->driver, &j->sb);
    if (!rc && !ka_driver_kept(j->driver, j->id))
        rc = -ENOTSUP; /* a driver that keeps nothing */
    if (!rc)
        rc = s_job_start(j, true);
    if (rc)
        snprintf(j->err, sizeof j->err, "%.300s; booting on the kept /data failed too: %.150s", err,
                 strerror(-rc));
    else
        s_copy(j->err, sizeof j->err, err);
    return rc;
}

/* Saves /data: the sandbox is halted first (nothing inside runs while it is read), and the
 * walk never follows a link out of it nor opens anything but regular files. A save to object
 * storage that fails leaves the sandbox READY with its /data (s_job_rescue). */
static int s_job_suspend(ka_sbx_job_t *j)
{
    ka_tree_opts_t o = s_tree_opts(-1);
    char why[sizeof j->err - 64] = "";
    bool object = ka_objstore_is_location(j->snapshot);
    ka_phase_next(j->id, KA_PHASE_SUSPEND_UPLOAD);
    int rc = ka_driver_halt(j->driver, j->sb);
    if (!rc && !object)
        rc = ka_tree_remove(j->snapshot, &o);
    if (!rc)
        rc = s_job_copy(j, ka_driver_data_dir(j->driver, j->sb), j->snapshot, &o, why, sizeof why);
    ka_phase_end(j->id);
    if (rc) {
        snprintf(j->err, sizeof j->err, "saving /data to the snapshot location failed: %s",
                 why[0] ? why : strerror(-rc));
        j->kept = object && j->sb && s_job_rescue(j) == 0;
        return rc;
    }
    return ka_driver_stop(j->driver, &j->sb);
}

/* Restores /data into a fresh sandbox, owned by its new host uid. A restore from object
 * storage that fails leaves the sandbox SUSPENDED: a later resume tries again. */
static int s_job_restore(ka_sbx_job_t *j)
{
    ka_tree_opts_t o = s_tree_opts(ka_driver_owner(j->driver, j->sb));
    char why[sizeof j->err - 64] = "";
    const char *data = ka_driver_data_dir(j->driver, j->sb);
    bool object = ka_objstore_is_location(j->snapshot);
    ka_phase_next(j->id, KA_PHASE_RESUME_DOWNLOAD);
    int rc = s_job_copy(j, j->snapshot, data, &o, why, sizeof why);
    ka_phase_end(j->id);
    if (rc == -ENOENT && object && j->lost)
        return 0; /* lost before anything was saved: a fresh /data */
    if (rc)
        snprintf(j->err, sizeof j->err, "restoring /data from the snapshot failed: %s",
                 why[0] ? why : strerror(-rc));
    j->kept = rc && object;
    return rc;
}

/* Removes the sandbox's snapshot (a delete); a failure leaves objects behind, said in the log. */
static void s_job_remove_snapshot(ka_sbx_job_t *j)
{
    ka_tree_opts_t o = s_tree_opts(-1);
    char why[sizeof j->err] = "";
    if (!ka_objstore_is_location(j->snapshot))
        ka_tree_remove(j->snapshot, &o);
    else if (ka_snapobj_remove(j->snapshot, j->id, &o, why, sizeof why))
        krt_log(KRT_LOG_WARN, "sandboxes", "snapshot_remove_failed", "sandbox=%s %s", j->id, why);
}

static int s_job_start(ka_sbx_job_t *j, bool reuse_data)
{
    const char *lower[] = {j->rootfs};
    ka_sandbox_spec_t spec = {.id = j->id,
                              .lowerdirs = lower,
                              .n_lower = 1,
                              .reuse_data = reuse_data,
                              .reuse_root = j->fork};
    ka_phase_next(j->id, KA_PHASE_COMPUTE_START);
    int rc = ka_driver_start(j->driver, &spec, &j->sb);
    ka_phase_end(j->id); /* a start that failed before its guest ran */
    if (rc)
        snprintf(j->err, sizeof j->err, "starting the sandbox failed: %s", strerror(-rc));
    return rc;
}

/* Boots on the /data the driver kept if the compute was lost (a node crash loses none), else
 * restores it from the snapshot (what a resume cut off left in the driver is dropped). */
static int s_job_resume(ka_sbx_job_t *j)
{
    bool kept = ka_driver_kept(j->driver, j->id);
    if (kept && !j->lost) {
        ka_driver_discard(j->driver, j->id);
        kept = false;
    }
    int rc = s_job_start(j, kept);
    if (rc || kept)
        return rc;
    if (j->lost && !ka_objstore_is_location(j->snapshot) && access(j->snapshot, F_OK) != 0)
        return 0; /* lost before anything was saved: a fresh /data */
    return s_job_restore(j);
}

/* Releases the compute (if any), what the driver kept of its /data, and the snapshot. */
static int s_job_stop(ka_sbx_job_t *j)
{
    int rc = j->sb ? ka_driver_stop(j->driver, &j->sb) : 0;
    int r2 = ka_driver_discard(j->driver, j->id);
    s_job_remove_snapshot(j);
    return rc ? rc : r2;
}

/* Copies the (frozen) compute for each fork; on a failure none of the forks keeps a copy. */
static int s_job_fork(ka_sbx_job_t *j)
{
    int rc = 0;
    uint32_t done = 0;
    for (; done < j->n_fork && rc == 0; done += rc == 0) {
        uint64_t b = 0;
        rc = ka_driver_fork(j->driver, j->sb, j->forks[done], &b);
        j->bytes += b;
    }
    if (!rc)
        return 0;
    for (uint32_t i = 0; i < done; i++)
        ka_driver_discard(j->driver, j->forks[i]);
    snprintf(j->err, sizeof j->err, "forking the sandbox failed: %s",
             rc == -EDQUOT    ? "its /data and root changes do not fit a fork's disk quota"
             : rc == -ENOTSUP ? "this node's sandbox driver cannot fork"
                              : strerror(-rc));
    return rc;
}

static int s_job_do(ka_sbx_job_t *j)
{
    switch (j->kind) {
    case JOB_BOOT:
        return s_job_start(j, j->fork);
    case JOB_FORK:
        return s_job_fork(j);
    case JOB_RESUME:
        return s_job_resume(j);
    case JOB_SUSPEND:
        return s_job_suspend(j);
    default:
        return s_job_stop(j);
    }
}

static int s_job_run(void *arg)
{
    ka_sbx_job_t *j = arg;
    int rc = s_job_do(j);
    /* READY again on its /data, or a fork's source (given back either way) */
    bool live = (rc && j->kept && j->kind == JOB_SUSPEND) || j->kind == JOB_FORK;
    if (rc && j->sb && !live && j->kind == JOB_SUSPEND) /* not saved: /data stays (FAILED) */
        ka_driver_park(j->driver, &j->sb);
    else if (rc && j->sb && !live) /* half-done: never leave compute that no record points at */
        ka_driver_stop(j->driver, &j->sb);
    if (atomic_exchange(&j->owner, JOB_FINISHED) == JOB_ORPHANED) { /* nobody will take it */
        ka_driver_park(j->driver, &j->sb);
        free(j);
    }
    return rc;
}

/* Runs kind on a job thread; a suspend or stop takes the compute (and closes the guest), a
 * fork borrows it (its guest channel stays) for the forks in f. */
static int s_submit(krt_ctx_t *ctx, ka_sbx_t *self, s_job_kind_t kind, const char *snapshot,
                    const ka_sbx_fork_copy_t *f)
{
    ka_sbx_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    j->kind = kind;
    j->driver = self->a.driver;
    s_copy(j->id, sizeof j->id, self->a.record.id);
    s_copy(j->rootfs, sizeof j->rootfs, self->a.runtime.rootfs);
    s_copy(j->snapshot, sizeof j->snapshot, snapshot);
    s_copy(j->revision, sizeof j->revision, self->a.record.revision);
    j->lost = strcmp(self->a.record.failure_reason, KA_FAIL_COMPUTE_LOST) == 0;
    j->fork = self->a.fork;
    j->began = ka_metric_now();
    atomic_init(&j->owner, JOB_RUNNING);
    if (kind == JOB_SUSPEND || kind == JOB_STOP) {
        ka_sbx_guest_detach(ctx, self); /* before the job closes the channel under it */
        j->sb = self->compute;
        self->compute = NULL;
    } else if (kind == JOB_FORK) {
        j->n_fork = f->count;
        memcpy(j->forks, f->ids, sizeof j->forks);
        j->sb = self->compute;
        self->compute = NULL;
    }
    int rc = krt_job_submit(ctx, s_job_run, j, &self->op.ref);
    if (rc) {
        self->compute = j->sb;
        if (self->compute && kind != JOB_FORK)
            ka_sbx_guest_attach(ctx, self);
        free(j);
        return rc;
    }
    self->op.phase = KA_PH_JOB;
    self->op.job = j;
    return 0;
}

/* ---- store writes -------------------------------------------------------------------------- */

static void s_on_answer(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);

/* A store or templates request whose answer is the current operation's next event. */
static int s_ask(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t to, uint32_t type, const void *body,
                 size_t len)
{
    int rc = krt_request(ctx, to, type, body, len, STORE_TIMEOUT_MS, s_on_answer, NULL);
    self->op.asking = rc == 0;
    return rc;
}

/* This node's fence for a write (none on a node alone). */
static void s_fence_of(const ka_sbx_t *self, ka_store_fence_t *f)
{
    if (!self->a.member)
        return;
    s_copy(f->node_id, sizeof f->node_id, self->a.member->self_id);
    f->incarnation = atomic_load(&self->a.member->incarnation);
}

/* Every write is fenced: only while this node holds its lease (a node past its lease, e.g.
 * stopped and continued, writes nothing before its membership notices) and, in the store, only
 * while the record still names this node (another node took it over) and the node's lease holds
 * under the incarnation it wrote with (the fencing counter): else KA_STORE_ESTALE. */
static int s_send_write(krt_ctx_t *ctx, ka_sbx_t *self)
{
    const ka_store_sandbox_update_t *u = &self->op.write;
    if (self->a.member && !ka_membership_member(self->a.member))
        return KRT_ENOCONN;
    if (self->op.phase == KA_PH_INTENT)
        ka_phase_next(u->id, KA_PHASE_STORE_INTENT);
    if (self->op.phase == KA_PH_RESULT && self->op.target == KA_SBX_DELETED) {
        ka_store_sandbox_key_t k;
        memset(&k, 0, sizeof k);
        s_copy(k.id, sizeof k.id, u->id);
        s_copy(k.node, sizeof k.node, u->expect_node);
        k.fence = u->fence;
        return s_ask(ctx, self, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_DELETE, &k, sizeof k);
    }
    return s_ask(ctx, self, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_UPDATE, u, sizeof *u);
}

/* Persists an intent (state and operation) or a result (which also sets the failure, "" when
 * none). A result for KA_SBX_DELETED is the tombstone. */
static int s_write(krt_ctx_t *ctx, ka_sbx_t *self, ka_sbx_phase_t phase, int state, int op,
                   const char *reason, const char *message)
{
    ka_store_sandbox_update_t *u = &self->op.write;
    memset(u, 0, sizeof *u);
    s_copy(u->id, sizeof u->id, self->a.record.id);
    s_copy(u->expect_node, sizeof u->expect_node, self->a.record.node);
    s_fence_of(self, &u->fence);
    u->set =
        KA_SB_SET_STATE | KA_SB_SET_OPERATION | (phase == KA_PH_RESULT ? KA_SB_SET_FAILURE : 0);
    u->expect_state = -1;
    u->state = state;
    u->operation = op;
    s_copy(u->failure_reason, sizeof u->failure_reason, reason);
    s_copy(u->failure_message, sizeof u->failure_message, message);
    self->op.phase = phase;
    if (phase == KA_PH_INTENT) {
        self->a.record.state = state;
        self->a.record.operation = op;
    }
    return s_send_write(ctx, self);
}

/* ---- operations ---------------------------------------------------------------------------- */

/* Starts an operation: `to` is the transient state, c its caller (NULL: nobody waits). */
static void s_begin(krt_ctx_t *ctx, ka_sbx_t *self, ka_sbx_state_t to, const ka_sbx_caller_t *c)
{
    ka_sbx_op_t *op = &self->op;
    op->answer = c != NULL;
    if (c)
        op->caller = *c;
    op->before = self->state;
    op->before_op = self->a.record.operation;
    op->code = 0;
    op->target = to;
    s_enter(ctx, self, to);
}

static void s_answer_joiners(krt_ctx_t *ctx, ka_sbx_t *self, int code, const char *message)
{
    while (self->op.joiners) {
        ka_sbx_joiner_t *j = self->op.joiners;
        self->op.joiners = j->next;
        s_answer(ctx, self, &j->c, code, message);
        free(j);
    }
}

static void s_start_delete(krt_ctx_t *ctx, ka_sbx_t *self, const ka_sbx_caller_t *c);

/* What waits behind an operation that ended: the guest's loss, then a queued delete. */
static void s_after_op(krt_ctx_t *ctx, ka_sbx_t *self)
{
    if (self->state == KA_SBX_READY && self->lost_reason[0]) {
        s_ev_t ev = {
            .type = EV_GUEST_EXIT, .reason = self->lost_reason, .message = self->lost_message};
        a_guest_failed(ctx, self, &ev);
        return; /* its write runs first; the delete follows it */
    }
    if (self->op.delete_queued && self->state != KA_SBX_DELETED) {
        ka_sbx_caller_t c = self->op.deleter;
        bool answer = self->op.delete_answer;
        self->op.delete_queued = false;
        s_start_delete(ctx, self, answer ? &c : NULL);
    }
}

/* The intent was not persisted (or the work could not start): nothing was done, the sandbox is
 * as it was and usable; the caller gets code (a negative errno). */
static void s_intent_lost(krt_ctx_t *ctx, ka_sbx_t *self, int code, const char *message)
{
    ka_sbx_op_t *op = &self->op;
    bool deleting = self->state == KA_SBX_DELETING;
    op->phase = KA_PH_IDLE;
    self->a.record.state = s_record_state(op->before);
    self->a.record.operation = op->before_op;
    s_enter(ctx, self, op->before);
    bool answer = op->answer;
    if (answer)
        s_answer(ctx, self, &op->caller, code, message);
    op->answer = false;
    if (deleting && answer) /* its TTL still ends it if nobody retries */
        s_arm_ttl(ctx, self);
    else if (deleting) /* an expiry tries again soon */
        krt_timer_arm(ctx, &self->ttl, RETRY_DELETE_MS, KA_SBX_MSG_TTL, 0);
    s_after_op(ctx, self);
}

/* The result is persisted (rec: the record the store returned; NULL: applied here): the
 * operation's state is entered and its caller answered. */
static void s_settle(krt_ctx_t *ctx, ka_sbx_t *self, const ka_store_sandbox_t *rec)
{
    ka_sbx_op_t *op = &self->op;
    if (rec) {
        self->a.record = *rec;
    } else { /* the store refused it for good: this actor goes on from what was done */
        ka_store_sandbox_t *r = &self->a.record;
        r->state = op->target == KA_SBX_DELETED ? KA_STATE_DELETED : op->write.state;
        r->operation = KA_OP_NONE;
        s_copy(r->failure_reason, sizeof r->failure_reason, op->write.failure_reason);
        s_copy(r->failure_message, sizeof r->failure_message, op->write.failure_message);
        if (op->target == KA_SBX_DELETED)
            r->deleted_ms = krt_wall_ms();
    }
    op->phase = KA_PH_IDLE;
    krt_timer_cancel(ctx, &self->retry);
    s_enter(ctx, self, op->target);
    /* Deleted: the manager learns it before the caller does (its pool has room for the
     * caller's next create). Calls the manager routed here before it learns it are still on
     * their way: the actor answers them from the tombstone until the manager stops it
     * (KA_SBX_STOP_, behind this turn). */
    bool orphan = self->state == KA_SBX_DELETED &&
                  krt_send(ctx, krt_parent(ctx), KA_SBX_RETIRE_, NULL, 0) != 0;
    if (op->answer)
        s_answer(ctx, self, &op->caller, op->code, op->message);
    op->answer = false;
    op->code = 0;
    s_answer_joiners(ctx, self, 0, "");
    if (self->state == KA_SBX_DELETED) {
        krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_deleted", "sandbox=%s", self->a.record.id);
        krt_timer_cancel(ctx, &self->ttl);
        if (orphan)
            krt_exit(ctx, KRT_EXIT_NORMAL); /* no manager: nothing routes here */
        return;
    }
    s_after_op(ctx, self);
}

/* Writes the result that enters `to` (state, failure); a write that cannot be sent is tried
 * again by the retry timer. */
static void s_result(krt_ctx_t *ctx, ka_sbx_t *self, ka_sbx_state_t to, const char *reason,
                     const char *message)
{
    self->op.target = to;
    if (s_write(ctx, self, KA_PH_RESULT, s_record_state(to), KA_OP_NONE, reason, message))
        krt_timer_arm(ctx, &self->retry, RETRY_RESULT_MS, KA_SBX_MSG_RETRY, 0);
}

/* Records a state nobody asked for (the guest lost, a record recovered at node start). */
static void s_mark(krt_ctx_t *ctx, ka_sbx_t *self, ka_sbx_state_t to, const char *reason,
                   const char *message)
{
    s_begin(ctx, self, to, NULL);
    s_result(ctx, self, to, reason, message);
}

static void s_start_delete(krt_ctx_t *ctx, ka_sbx_t *self, const ka_sbx_caller_t *c)
{
    s_begin(ctx, self, KA_SBX_DELETING, c);
    krt_timer_cancel(ctx, &self->ttl);
    ka_sbx_guest_fail_all(ctx, self, -EBUSY, KA_MSG_NOT_READY);
    if (s_write(ctx, self, KA_PH_INTENT, KA_STATE_DELETING, KA_OP_DELETE, NULL, NULL))
        s_intent_lost(ctx, self, KA_EUNAVAIL, "the store is not running");
}

/* The intent is persisted: the blocking part. */
static void s_run_job(krt_ctx_t *ctx, ka_sbx_t *self)
{
    char dir[PATH_MAX];
    s_snapshot_dir(self, self->a.runtime.snapshot_location, dir, sizeof dir);
    s_job_kind_t kind = self->state == KA_SBX_DELETING     ? JOB_STOP
                        : self->state == KA_SBX_SUSPENDING ? JOB_SUSPEND
                                                           : JOB_RESUME;
    if (kind == JOB_SUSPEND) /* the guest stops with the compute: its callers learn it now */
        ka_sbx_guest_fail_all(ctx, self, -EBUSY, KA_MSG_NOT_READY);
    if (s_submit(ctx, self, kind, dir, NULL))
        s_intent_lost(ctx, self, KA_EUNAVAIL, "cannot start the work: out of memory; retry");
}

/* ---- actions ------------------------------------------------------------------------------- */

static void a_bug(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    atomic_fetch_add(&s_violations, 1);
    krt_log_actor(ctx, KRT_LOG_ERROR, "sandbox_unexpected_event", "sandbox=%s state=%s event=%d",
                  self->a.record.id, s_state_name(self->state), ev->type);
}

/* A create replayed while the create runs: it gets the create's own answer. */
static void a_join(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    ka_sbx_joiner_t *j = malloc(sizeof *j);
    if (!j) {
        ka_fail(ctx, ev->from.to, ev->from.ref, KA_SBX_CREATE, KA_EUNAVAIL, "out of memory; retry");
        return;
    }
    *j = (ka_sbx_joiner_t){self->op.joiners, ev->from};
    self->op.joiners = j;
}

static void a_record(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    s_reply_record(ctx, self, &ev->from);
}

static void a_guest(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    ka_sbx_guest_call(ctx, self, ev->from.to, ev->from.ref, ev->body);
}

/* The snapshot location must be one this node writes (file://) or none. */
static bool s_location_ok(krt_ctx_t *ctx, ka_sbx_t *self, const ka_sbx_caller_t *c)
{
    char dir[PATH_MAX];
    const char *loc = self->a.runtime.snapshot_location;
    if (!loc[0] || s_snapshot_dir(self, loc, dir, sizeof dir) == 0)
        return true;
    ka_fail(ctx, c->to, c->ref, c->type, -EBUSY,
            "snapshot location \"%s\" is not supported: use a file://, s3:// or "
            "gs:// location",
            loc);
    return false;
}

static void a_suspend(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    if (!s_location_ok(ctx, self, &ev->from))
        return;
    s_begin(ctx, self, KA_SBX_SUSPENDING, &ev->from);
    if (s_write(ctx, self, KA_PH_INTENT, KA_STATE_READY, KA_OP_SUSPEND, NULL, NULL))
        s_intent_lost(ctx, self, KA_EUNAVAIL, "the store is not running");
}

static void s_resume_intent(krt_ctx_t *ctx, ka_sbx_t *self)
{
    if (s_write(ctx, self, KA_PH_INTENT, KA_STATE_SUSPENDED, KA_OP_RESUME, NULL, NULL))
        s_intent_lost(ctx, self, KA_EUNAVAIL, "the store is not running");
}

static void a_resume(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    const ka_sbx_caller_t *c = &ev->from;
    if (s_busy(self)) { /* a recovered record's state is still being written */
        ka_fail(ctx, c->to, c->ref, c->type, -EAGAIN, MSG_BUSY);
        return;
    }
    if (self->a.runtime.rootfs[0] && !s_location_ok(ctx, self, c))
        return;
    s_begin(ctx, self, KA_SBX_RESUMING, c);
    if (self->a.runtime.rootfs[0]) {
        s_resume_intent(ctx, self);
        return;
    }
    ka_tpl_runtime_req_t rr; /* adopted at node start: fetch the pinned revision's runtime */
    memset(&rr, 0, sizeof rr);
    s_copy(rr.revision, sizeof rr.revision, self->a.record.revision);
    self->op.phase = KA_PH_RUNTIME;
    if (s_ask(ctx, self, ka_peer(ctx, self->a.templates), KA_TPL_RUNTIME, &rr, sizeof rr))
        s_intent_lost(ctx, self, KA_EUNAVAIL, KA_MSG_NO_RUNTIME);
}

static void a_runtime(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    const krt_msg_t *msg = ev->msg;
    const ka_tpl_resolved_t *res = msg ? msg->body : NULL;
    if (!msg || msg->len != sizeof *res) {
        s_intent_lost(ctx, self, KA_EUNAVAIL, KA_MSG_NO_RUNTIME);
        return;
    }
    self->a.runtime = *res;
    char dir[PATH_MAX];
    const char *loc = res->snapshot_location;
    if (loc[0] && s_snapshot_dir(self, loc, dir, sizeof dir)) {
        s_intent_lost(ctx, self, -EBUSY,
                      "the snapshot location is not supported: use a file://, s3:// or gs:// "
                      "location");
        return;
    }
    s_resume_intent(ctx, self);
}

static void a_delete(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    if (s_busy(self)) { /* a result of its own is being written: after it */
        a_queue_delete(ctx, self, ev);
        return;
    }
    s_start_delete(ctx, self, &ev->from);
}

/* A delete (or an expiry) waits for the running operation, then supersedes it. */
static void a_queue_delete(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    ka_sbx_op_t *op = &self->op;
    bool expiry = ev->type == EV_TTL;
    if (op->delete_queued) {
        if (!expiry)
            ka_fail(ctx, ev->from.to, ev->from.ref, ev->from.type, -EAGAIN, MSG_DELETING);
        return;
    }
    op->delete_queued = true;
    op->delete_answer = !expiry;
    if (!expiry)
        op->deleter = ev->from;
}

static void a_expire(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_expired", "sandbox=%s", self->a.record.id);
    if (s_busy(self))
        a_queue_delete(ctx, self, ev);
    else
        s_start_delete(ctx, self, NULL);
}

static void s_fire(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev);

/* Freezes or thaws the compute: 0, or the driver's error answered to c (nothing changed). */
static int s_freeze(krt_ctx_t *ctx, ka_sbx_t *self, bool frozen, const ka_sbx_caller_t *c)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ka_driver_freeze(self->a.driver, self->compute, frozen);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    krt_log_actor(
        ctx, rc ? KRT_LOG_WARN : KRT_LOG_INFO, frozen ? "sandbox_paused" : "sandbox_unpaused",
        "sandbox=%s rc=%d us=%lld", self->a.record.id, rc,
        (long long)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000));
    if (rc && c)
        ka_fail(ctx, c->to, c->ref, c->type, rc == -ENOTSUP ? -EBUSY : KA_EUNAVAIL,
                "%s the sandbox failed: %s", frozen ? "pausing" : "unpausing",
                rc == -ENOTSUP ? "this node cannot freeze sandboxes (cgroup v2 needed)"
                               : strerror(-rc));
    return rc;
}

/* Enters PAUSED or leaves it for READY (a get, answered here, shows it). */
static void s_set_paused(krt_ctx_t *ctx, ka_sbx_t *self, bool paused)
{
    s_enter(ctx, self, paused ? KA_SBX_PAUSED : KA_SBX_READY);
    if (!paused)
        ka_sbx_guest_touch(self);
}

static void a_pause(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    if (s_freeze(ctx, self, true, &ev->from))
        return;
    s_set_paused(ctx, self, true);
    s_reply_record(ctx, self, &ev->from);
}

static void a_unpause(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    if (s_freeze(ctx, self, false, &ev->from))
        return;
    s_set_paused(ctx, self, false);
    s_reply_record(ctx, self, &ev->from);
}

/* Delete, expiry or a guest lost while paused: thawed (a thaw that fails still lets the stop
 * kill it: SIGKILL reaches frozen tasks), then as from READY. */
static void a_thaw_then(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    s_freeze(ctx, self, false, NULL);
    s_set_paused(ctx, self, false);
    s_fire(ctx, self, ev);
}

/* Copies the sandbox for the forks the manager recorded: frozen as a pause freezes it (nothing
 * inside writes while its /data and root changes are copied), the copy on a job, thawed when
 * the job ends, done or not (a_forked). */
static void a_fork(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    if (s_freeze(ctx, self, true, &ev->from))
        return;
    s_begin(ctx, self, KA_SBX_FORKING, &ev->from);
    if (s_submit(ctx, self, JOB_FORK, "", ev->body) == 0)
        return;
    s_freeze(ctx, self, false, NULL);
    self->op.answer = false;
    s_enter(ctx, self, KA_SBX_READY);
    ka_fail(ctx, ev->from.to, ev->from.ref, ev->from.type, KA_EUNAVAIL,
            "cannot start the work: out of memory; retry");
}

/* The fork's copy ended: thawed, READY again; the caller learns how it went. */
static void a_forked(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    ka_sbx_op_t *op = &self->op;
    s_freeze(ctx, self, false, NULL);
    op->phase = KA_PH_IDLE;
    s_enter(ctx, self, KA_SBX_READY);
    ka_sbx_guest_touch(self);
    if (op->answer && ev->type == EV_JOB_DONE)
        s_reply_record(ctx, self, &op->caller);
    else if (op->answer)
        ka_fail(ctx, op->caller.to, op->caller.ref, op->caller.type, ev->code, "%s", ev->message);
    op->answer = false;
    s_after_op(ctx, self);
}

/* READY and the guest is gone: FAILED with its reason. */
static void a_guest_failed(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    char reason[KA_STORE_REASON_LEN], message[KA_STORE_MESSAGE_LEN];
    s_copy(reason, sizeof reason, ev->reason);
    s_copy(message, sizeof message, ev->message);
    self->lost_reason[0] = self->lost_message[0] = '\0';
    s_mark(ctx, self, KA_SBX_FAILED, reason, message);
}

/* The guest went away while an operation boots it: applied when that operation ends READY. */
static void a_guest_later(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    s_copy(self->lost_reason, sizeof self->lost_reason, ev->reason);
    s_copy(self->lost_message, sizeof self->lost_message, ev->message);
}

static void a_job_done(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    switch (self->state) {
    case KA_SBX_CREATING:
    case KA_SBX_RESUMING:
        s_result(ctx, self, KA_SBX_READY, NULL, NULL);
        break;
    case KA_SBX_SUSPENDING:
        s_result(ctx, self, KA_SBX_SUSPENDED, NULL, NULL);
        break;
    default: /* deleting: the compute is released (or was gone): the tombstone */
        s_result(ctx, self, KA_SBX_DELETED, NULL, NULL);
        break;
    }
}

static void a_job_failed(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    const char *reason = self->state == KA_SBX_CREATING   ? KA_FAIL_START
                         : self->state == KA_SBX_RESUMING ? KA_FAIL_RESUME
                                                          : KA_FAIL_SUSPEND;
    if (self->state == KA_SBX_DELETING) /* a stop leaves nothing either way */
        a_job_done(ctx, self, ev);
    else if (ev->kept) { /* object storage away: the caller learns why, nothing changed */
        self->op.code = KA_EUNAVAIL;
        s_copy(self->op.message, sizeof self->op.message, ev->message);
        s_result(ctx, self, self->op.before, NULL, NULL);
    } else
        s_result(ctx, self, KA_SBX_FAILED, reason, ev->message);
}

static void a_store_done(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    const ka_store_sandbox_reply_t *r = ev->msg->body;
    const ka_store_sandbox_t *rec = ev->msg->len == sizeof *r ? &r->sandbox : NULL;
    if (self->op.phase == KA_PH_INTENT) {
        ka_phase_end(self->a.record.id);
        if (rec)
            self->a.record = *rec;
        s_run_job(ctx, self);
    } else {
        s_settle(ctx, self, rec);
    }
}

static void a_store_failed(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    krt_log_actor(ctx, KRT_LOG_WARN, "store_write_failed", "sandbox=%s state=%s phase=%d err=%d",
                  self->a.record.id, s_state_name(self->state), self->op.phase, ev->err);
    if (self->op.phase == KA_PH_INTENT)
        s_intent_lost(ctx, self, ev->err, MSG_STORE);
    else if (ev->err == KA_STORE_EUNAVAIL) /* the work is done: the record must catch up */
        krt_timer_arm(ctx, &self->retry, RETRY_RESULT_MS, KA_SBX_MSG_RETRY, 0);
    else /* refused for good: the actor goes on from what was done */
        s_settle(ctx, self, NULL);
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static const char *s_verb(s_event_t e)
{
    return e == EV_SUSPEND   ? "suspend"
           : e == EV_RESUME  ? "resume"
           : e == EV_PAUSE   ? "pause"
           : e == EV_UNPAUSE ? "unpause"
           : e == EV_FORK    ? "fork"
                             : "delete";
}

static void s_fire(krt_ctx_t *ctx, ka_sbx_t *self, const s_ev_t *ev)
{
    const s_cell_t *cell = &s_table[self->state][ev->type];
    if (cell->act) {
        cell->act(ctx, self, ev);
        return;
    }
    if (cell->code == 0 || ev->type > EV_DELETE)
        return; /* ignored, or nobody to tell (the requests come first in s_event_t) */
    const ka_sbx_caller_t *c = &ev->from;
    if (cell->message == s_in_state)
        ka_fail(ctx, c->to, c->ref, c->type, cell->code, MSG_IN_STATE, s_verb(ev->type),
                ka_state_name(self->a.record.state));
    else
        ka_fail(ctx, c->to, c->ref, c->type, cell->code, "%s", cell->message);
}

void ka_sbx_on_guest_exit(krt_ctx_t *ctx, ka_sbx_t *self, const char *reason, const char *message)
{
    s_ev_t ev = {.type = EV_GUEST_EXIT, .reason = reason, .message = message};
    s_fire(ctx, self, &ev);
}

static bool s_fork_ids_ok(const ka_sbx_fork_copy_t *f)
{
    for (uint32_t i = 0; i < f->count; i++)
        if (!memchr(f->ids[i], 0, sizeof f->ids[i]) || ka_check_uuid(f->ids[i]))
            return false;
    return true;
}

/* A request from a caller: checked (shape, owner) before the table sees it. */
static void s_on_request(krt_ctx_t *ctx, ka_sbx_t *self, uint32_t type, krt_addr_t from,
                         uint64_t ref, const void *body, size_t len)
{
    s_ev_t ev = {.from = {from, ref, type}, .body = body};
    const char *caller = NULL;
    if (type == KA_SBX_CREATE) {
        const ka_sbx_create_t *c = body;
        ev.type = EV_CREATE;
        if (len == sizeof *c && memchr(c->caller, 0, sizeof c->caller))
            caller = c->caller;
    } else if (type == KA_SBX_GUEST) {
        ev.type = EV_GUEST;
        if (ka_sbx_guest_req_ok(body, len))
            caller = ((const ka_guest_req_t *)body)->caller;
    } else if (type == KA_SBX_FORK_COPY_) {
        const ka_sbx_fork_copy_t *f = body;
        ev.type = EV_FORK;
        if (len == sizeof *f && memchr(f->caller, 0, sizeof f->caller) && f->count >= 1 &&
            f->count <= KA_FORK_MAX && s_fork_ids_ok(f))
            caller = f->caller;
    } else {
        const ka_sbx_key_t *k = body;
        ev.type = type == KA_SBX_SUSPEND   ? EV_SUSPEND
                  : type == KA_SBX_RESUME  ? EV_RESUME
                  : type == KA_SBX_PAUSE   ? EV_PAUSE
                  : type == KA_SBX_UNPAUSE ? EV_UNPAUSE
                                           : EV_DELETE;
        if (len == sizeof *k && memchr(k->caller, 0, sizeof k->caller))
            caller = k->caller;
    }
    if (!caller) {
        ka_fail(ctx, from, ref, type, -EINVAL,
                type == KA_SBX_GUEST ? "malformed guest request" : "malformed request");
        return;
    }
    if (strcmp(caller, self->a.record.creator) != 0) {
        ka_fail(ctx, from, ref, type, type == KA_SBX_CREATE ? -EINVAL : -ENOENT,
                type == KA_SBX_CREATE ? "malformed request" : KA_MSG_NOT_FOUND);
        return;
    }
    s_fire(ctx, self, &ev);
}

/* The store's record for a get (s_get): answered with paused from this actor's state. */
static void s_on_got(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    ka_sbx_t *self = state;
    ka_sbx_joiner_t *w = user, **pp = &self->reads;
    while (*pp != w)
        pp = &(*pp)->next;
    *pp = w->next;
    ka_sbx_answer_read(ctx, w->c.to, w->c.ref, w->c.type, err, msg, self->state == KA_SBX_PAUSED);
    free(w);
}

/* A get, in any state and outside the table (it changes nothing): the owner gets the record as
 * the store has it, as the manager answers for a sandbox with no actor; anyone else NOT_FOUND. */
static void s_get(krt_ctx_t *ctx, ka_sbx_t *self, const krt_msg_t *msg)
{
    const ka_sbx_key_t *k = msg->body;
    ka_sbx_caller_t c = {msg->from, msg->ref, KA_SBX_GET};
    if (msg->len != sizeof *k || !memchr(k->caller, 0, sizeof k->caller)) {
        ka_fail(ctx, c.to, c.ref, c.type, -EINVAL, "malformed request");
        return;
    }
    if (strcmp(k->caller, self->a.record.creator) != 0) {
        ka_fail(ctx, c.to, c.ref, c.type, -ENOENT, KA_MSG_NOT_FOUND);
        return;
    }
    ka_sbx_joiner_t *w = malloc(sizeof *w);
    ka_store_sandbox_key_t sk;
    memset(&sk, 0, sizeof sk);
    s_copy(sk.id, sizeof sk.id, self->a.record.id);
    s_copy(sk.creator, sizeof sk.creator, k->caller);
    if (!w || krt_request(ctx, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_GET, &sk, sizeof sk,
                          STORE_TIMEOUT_MS, s_on_got, w)) {
        free(w);
        ka_fail(ctx, c.to, c.ref, c.type, KA_EUNAVAIL, "out of memory; retry");
        return;
    }
    *w = (ka_sbx_joiner_t){self->reads, c};
    self->reads = w;
}

/* The answer to s_ask (err: it timed out, its target is gone, or it was refused). */
static void s_on_answer(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    (void)user;
    ka_sbx_t *self = state;
    s_ev_t ev = {.msg = err ? NULL : msg};
    self->op.asking = false;
    if (self->op.phase == KA_PH_RUNTIME) {
        ev.type = EV_RUNTIME;
    } else {
        ev.err = ka_store_outcome(err, msg, 0, NULL);
        ev.type = ev.err ? EV_STORE_FAILED : EV_STORE_DONE;
    }
    s_fire(ctx, self, &ev);
}

/* Snapshot and fork durations and bytes (kagent_snapshot_*, kagent_fork_*). */
static void s_job_observe(const ka_sbx_job_t *j, int rc)
{
    const char *what = j->kind == JOB_SUSPEND  ? "suspend"
                       : j->kind == JOB_RESUME ? "resume"
                       : j->kind == JOB_FORK   ? "fork"
                                               : NULL;
    if (what)
        ka_metric_job(what, rc == 0, ka_metric_now() - j->began, j->bytes);
}

/* The error (a negative errno) a fork's caller gets for the job's error. */
static int s_fork_err(int rc)
{
    return rc == -EDQUOT || rc == -ENOSPC ? -ENOSPC
           : rc == -ENOTSUP               ? -EBUSY
           : rc == -EEXIST                ? -EEXIST
                                          : KA_EUNAVAIL;
}

static void s_on_job_done(krt_ctx_t *ctx, ka_sbx_t *self, const krt_msg_t *msg)
{
    const krt_job_done_t *d = msg->body;
    ka_sbx_job_t *j = d->arg;
    int rc = d->result;
    self->op.job = NULL;
    self->op.ref = 0;
    bool kept = rc && j->kept; /* failed, the sandbox as it was: its state stays */
    if ((!rc && (j->kind == JOB_BOOT || j->kind == JOB_RESUME)) ||
        (kept && j->kind == JOB_SUSPEND)) {
        self->compute = j->sb;
        ka_sbx_guest_attach(ctx, self);
    } else if (j->kind == JOB_FORK) { /* borrowed: its guest channel stayed */
        self->compute = j->sb;
    }
    s_job_observe(j, rc);
    char err[sizeof j->err];
    s_copy(err, sizeof err, j->err[0] ? j->err : strerror(rc < 0 ? -rc : EIO));
    krt_log_actor(ctx, rc ? KRT_LOG_WARN : KRT_LOG_DEBUG, "sandbox_job_done",
                  "sandbox=%s job=%d rc=%d", self->a.record.id, j->kind, rc);
    free(j);
    s_ev_t ev = {.type = rc ? EV_DRIVER_FAILED : EV_JOB_DONE,
                 .message = err,
                 .kept = kept,
                 .code = s_fork_err(rc)};
    s_fire(ctx, self, &ev);
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    ka_sbx_t *self = state;
    if (msg->type == KRT_MSG_JOB_DONE && msg->ref && msg->ref == self->op.ref) {
        s_on_job_done(ctx, self, msg);
        return;
    }
    switch (msg->type) {
    case KRT_MSG_FD_READY:
        ka_sbx_guest_io(ctx, self, true);
        break;
    case KA_SBX_MSG_GUEST_MORE:
        ka_sbx_guest_io(ctx, self, false);
        break;
    case KA_SBX_MSG_SWEEP:
        ka_sbx_guest_sweep(ctx, self);
        break;
    case KRT_MSG_DOWN: /* a sink stopped: what it still had open ends */
        if (msg->len == sizeof(krt_down_t))
            ka_sbx_guest_cancel(ctx, self, ((const krt_down_t *)msg->body)->who);
        break;
    case KA_SBX_MSG_RETRY:
        if (self->op.phase == KA_PH_RESULT && !self->op.asking &&
            s_send_write(ctx, self)) /* the store is not even running */
            krt_timer_arm(ctx, &self->retry, RETRY_RESULT_MS, KA_SBX_MSG_RETRY, 0);
        break;
    case KA_SBX_MSG_TTL: {
        s_ev_t ev = {.type = EV_TTL};
        s_fire(ctx, self, &ev);
        break;
    }
    case KA_SBX_STOP_:
        if (msg->from == krt_parent(ctx) && self->state == KA_SBX_DELETED)
            krt_exit(ctx, KRT_EXIT_NORMAL);
        break;
    case KA_SBX_FORWARD_: {
        const ka_sbx_forward_t *f = msg->body;
        if (msg->len >= sizeof *f && msg->len == sizeof *f + f->len && f->type >= KA_SBX_CREATE &&
            f->type < KA_SBX_FORWARD_)
            s_handle(ctx, state,
                     &(krt_msg_t){.type = f->type,
                                  .len = f->len,
                                  .from = f->from,
                                  .ref = f->ref,
                                  .body = f->body});
        break;
    }
    case KA_SBX_CREATE:
    case KA_SBX_SUSPEND:
    case KA_SBX_RESUME:
    case KA_SBX_PAUSE:
    case KA_SBX_UNPAUSE:
    case KA_SBX_DELETE:
    case KA_SBX_GUEST:
    case KA_SBX_FORK_COPY_:
        s_on_request(ctx, self, msg->type, msg->from, msg->ref, msg->body, msg->len);
        break;
    case KA_SBX_GUEST_PTR: { /* a sink on this node: the request, valid through this turn */
        const ka_guest_req_t *q = ((const ka_guest_req_ref_t *)msg->body)->req;
        s_on_request(ctx, self, KA_SBX_GUEST, msg->from, msg->ref, q, sizeof *q + q->tail_len);
        break;
    }
    case KA_SBX_GUEST_CANCEL:
        ka_sbx_guest_cancel(ctx, self, msg->from);
        break;
    case KA_SBX_GUEST_CREDIT:
        ka_sbx_guest_credit(ctx, self, msg->from, msg->body, msg->len);
        break;
    case KA_SBX_GET:
        s_get(ctx, self, msg);
        break;
    default:
        break;
    }
}

/* ---- start and stop ------------------------------------------------------------------------ */

/* A record recovered at node start: nothing of its compute survived the node. One that was
 * live comes back SUSPENDED (reason ComputeLost): its /data is kept where it was and a resume
 * boots it again; only delete and expiry remove data. */
static void s_adopt(krt_ctx_t *ctx, ka_sbx_t *self)
{
    const ka_store_sandbox_t *r = &self->a.record;
    switch (r->state) {
    case KA_STATE_DELETING:          /* finish what was acknowledged */
        self->state = KA_SBX_FAILED; /* whatever it was: only a delete moves on */
        s_start_delete(ctx, self, NULL);
        break;
    case KA_STATE_SUSPENDED:
        self->state = KA_SBX_SUSPENDED;
        if (r->operation != KA_OP_NONE) /* a resume was cut off: /data is still saved */
            s_mark(ctx, self, KA_SBX_SUSPENDED, r->failure_reason, r->failure_message);
        break;
    case KA_STATE_FAILED:
        self->state = KA_SBX_FAILED;
        break;
    case KA_STATE_CREATING: /* never acknowledged: nothing of it to keep */
        self->state = KA_SBX_FAILED;
        s_mark(ctx, self, KA_SBX_FAILED, KA_FAIL_COMPUTE_LOST,
               "the sandbox's compute was lost while it was being created; delete it and create "
               "a new one");
        break;
    default: /* READY, or a suspend cut off */
        self->state = KA_SBX_SUSPENDED;
        s_mark(ctx, self, KA_SBX_SUSPENDED, KA_FAIL_COMPUTE_LOST, MSG_LOST);
        break;
    }
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    ka_sbx_t *self = state;
    if (!arg)
        return KRT_EINVAL;
    self->a = *(const ka_sandbox_args_t *)arg;
    free(arg); /* malloc'd by the manager for this actor */
    s_arm_ttl(ctx, self);
    if (self->a.mode == KA_SBX_WARM) { /* claimed from the warm pool: READY is written */
        self->state = KA_SBX_READY;
        self->compute = self->a.compute;
        ka_sbx_guest_attach(ctx, self);
        s_reply_record(ctx, self,
                       &(ka_sbx_caller_t){self->a.reply_to, self->a.reply_ref, KA_SBX_CREATE});
        return 0;
    }
    if (self->a.mode != KA_SBX_BOOT) {
        s_adopt(ctx, self);
        s_note_released(ctx, self);
        return 0;
    }
    self->state = KA_SBX_CREATING;
    self->op.answer = !self->a.fork; /* a fork has nobody: the manager joins it */
    self->op.caller = (ka_sbx_caller_t){self->a.reply_to, self->a.reply_ref, KA_SBX_CREATE};
    self->op.before = KA_SBX_CREATING;
    if (s_submit(ctx, self, JOB_BOOT, "", NULL)) {
        ka_fail(ctx, self->a.reply_to, self->a.reply_ref, KA_SBX_CREATE, KA_EUNAVAIL,
                "cannot start the sandbox: out of memory");
        return KRT_ENOMEM;
    }
    return 0;
}

/* Runs when the actor stops for any reason (node shutdown, its manager gone): every waiter is
 * answered, and nothing may keep running for a record that no actor watches, so the compute
 * is parked here, its /data kept for the next owner of the record (at once, on this thread:
 * that owner must find it parked), and a job still running parks its own. */
static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    ka_sbx_t *self = state;
    ka_sbx_op_t *op = &self->op;
    const char *why = "the node is shutting down; retry";
    ka_sbx_guest_fail_all(ctx, self, KA_EUNAVAIL, "the sandbox is shutting down");
    if (op->answer)
        ka_fail(ctx, op->caller.to, op->caller.ref, op->caller.type, KA_EUNAVAIL, "%s", why);
    s_answer_joiners(ctx, self, KA_EUNAVAIL, why);
    if (op->delete_queued && op->delete_answer)
        ka_fail(ctx, op->deleter.to, op->deleter.ref, KA_SBX_DELETE, KA_EUNAVAIL, "%s", why);
    while (self->reads) { /* their store requests are dropped with this actor */
        ka_sbx_joiner_t *w = self->reads;
        self->reads = w->next;
        ka_fail(ctx, w->c.to, w->c.ref, w->c.type, KA_EUNAVAIL, "%s", why);
        free(w);
    }
    ka_sbx_guest_detach(ctx, self);
    if (self->compute)
        ka_driver_park(self->a.driver, &self->compute);
    ka_sbx_job_t *j = op->job;
    if (j && atomic_exchange(&j->owner, JOB_ORPHANED) == JOB_FINISHED) { /* done, not handled */
        ka_driver_park(j->driver, &j->sb);
        free(j);
    }
    op->job = NULL;
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const ka_sbx_t *self = state;
    snprintf(out, cap,
             "{\"id\":\"%s\",\"creator\":\"%s\",\"state\":\"%s\",\"operation\":\"%s\","
             "\"fsm\":\"%s\",\"phase\":%d,\"expires_ms\":%lld,\"guest_calls\":%zu}",
             self->a.record.id, self->a.record.creator, ka_state_name(self->a.record.state),
             ka_op_name(self->a.record.operation), s_state_name(self->state), self->op.phase,
             (long long)self->a.record.expires_ms, self->calls.n);
}

const krt_behaviour_t ka_sandbox_behaviour = {
    .kind = "sandbox",
    .state_size = sizeof(ka_sbx_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
