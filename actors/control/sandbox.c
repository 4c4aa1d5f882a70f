/*
 * ka_sandbox: one actor per live sandbox. Lifecycle FSM, TTL timer, owner checks, and the
 * sandbox's guest connection (requests multiplexed by id, replies routed to their callers).
 *
 * A mutation persists its intent (state/operation) before it acts, does the blocking part
 * (driver start/stop, snapshot copies) on a job thread, then persists the result and answers.
 * While one runs, another mutation gets ABORTED, except delete, which waits for it and then
 * supersedes it; TTL expiry is a delete without a caller.
 */
#include "sandboxes.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "guestconn.h"
#include "ka_guestcalls.h"
#include "ka_objstore.h"
#include "ka_snapobj.h"
#include "ka_snapshot.h"
#include "ka_tree.h"

#define STORE_TIMEOUT_MS     30000
#define RETRY_DELETE_MS      1000
#define RETRY_RESULT_MS      500
#define MSG_TTL              (KA_CTL_MSG_LAST_ + 1) /* the TTL timer's message type */
#define MSG_RETRY_RESULT     (KA_CTL_MSG_LAST_ + 2) /* write the result again (store was away) */
#define FILE_SCHEME          "file://"
#define SNAPSHOT_DEADLINE_MS (10 * 60 * 1000) /* a snapshot copy ends by then, done or failed */
#define MSG_SWEEP            (KA_CTL_MSG_LAST_ + 3) /* the guest calls' deadline sweep */
#define MSG_GUEST_MORE       (KA_CTL_MSG_LAST_ + 4) /* frames left to read after a full turn */
#define SWEEP_MS             5000
/* a guest call with no frame for this long fails (streams get keepalives every
 * KA_GP_KEEPALIVE_MS) */
#define GUEST_IDLE_MS     120000
#define MAX_GUEST_STREAMS 16 /* open streams per sandbox: KA_GP_WINDOW each in the node */
#define MAX_GUEST_CALLS   64
#define FRAMES_PER_TURN   64

typedef enum { JOB_NONE, JOB_BOOT, JOB_STOP, JOB_SUSPEND, JOB_RESUME } s_job_kind_t;

/* The blocking part of a mutation; only the job thread touches it until JOB_DONE. */
typedef struct s_job {
    s_job_kind_t kind;
    ka_driver_t *driver;
    char id[KA_STORE_ID_LEN];
    char rootfs[1024];
    char snapshot[PATH_MAX]; /* this sandbox's snapshot dir, or its s3:// / gs:// location */
    char revision[KA_STORE_REV_LEN];
    ka_sandbox_t *sb; /* in: to stop; out: started */
    char err[512];
    /* failed, but the sandbox is as it was: READY with sb (a restarted compute, its /data
     * intact) after a suspend, SUSPENDED after a resume (sb, if any, is to stop) */
    bool kept;
} s_job_t;

/* The caller of a guest call (the user of its ka_gc_call_t). ref != 0: one reply
 * (krt_reply_to); 0: a stream sink whose frames go to `to` as KA_SBX_GUEST_FRAME messages. */
typedef struct s_waiter {
    krt_addr_t to;
    uint64_t ref;
    int op;
} s_waiter_t;

typedef enum { SS_IDLE, SS_INTENT, SS_RESULT, SS_TOMBSTONE } s_store_step_t;

/* A replayed create (same creator and request id) that arrived while the create runs: it gets
 * the create's own answer. */
typedef struct s_joiner s_joiner_t;
struct s_joiner {
    s_joiner_t *next;
    krt_addr_t to;
    uint64_t ref;
};

typedef struct {
    ka_sandbox_args_t a; /* a.record is the live record */
    ka_sandbox_t *compute;
    ka_guestconn_t *gc;
    bool watching;
    uint32_t watch_ev; /* what the armed watch waits for */
    krt_timer_t ttl;
    ka_gc_table_t calls; /* guest calls in flight, each checked frame by frame */
    krt_timer_t sweep;   /* their deadlines */
    uint64_t dropped;    /* guest frames dropped (forged or stale) */
    /* the running mutation */
    uint32_t op_type; /* KA_SBX_* being served, 0 if none */
    krt_addr_t op_from;
    uint64_t op_ref;
    bool op_answer;              /* someone waits for the answer */
    int before_state, before_op; /* the record's, when it began: back if the intent is lost */
    s_job_t *job;                /* in flight on a job thread */
    uint64_t job_ref;
    s_store_step_t store_step;
    uint64_t store_ref;
    ka_store_sandbox_update_t result; /* the SS_RESULT write, kept to be sent again */
    krt_timer_t result_retry;
    uint64_t runtime_ref; /* resume: waiting for the pinned revision's runtime */
    s_joiner_t *joiners;  /* create: replays waiting for its answer */
    /* a delete that arrived during another mutation, or TTL expiry */
    bool delete_pending;
    krt_addr_t del_from;
    uint64_t del_ref;
    bool del_answer;
    int result_code; /* what the SS_RESULT write's caller gets (KA_OK: the record) */
    char result_message[512];
} s_sbx_t;

static void s_start_delete(krt_ctx_t *ctx, s_sbx_t *self);

/* ---- helpers ------------------------------------------------------------------------------ */

static void s_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static void s_reply_status(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int code,
                           const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void s_reply_status(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int code,
                           const char *fmt, ...)
{
    ka_sbx_reply_t r;
    memset(&r, 0, sizeof r);
    r.status.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.status.message, sizeof r.status.message, fmt, ap);
    va_end(ap);
    if (type == KA_SBX_GUEST) { /* guest callers read a ka_guest_reply_t */
        ka_guest_reply_t g;
        memset(&g, 0, sizeof g);
        g.status = r.status;
        g.final = 1;
        if (ref)
            krt_reply_to(ctx, to, ref, type, &g, sizeof g);
        else
            krt_send(ctx, to, KA_SBX_GUEST_FRAME, &g, sizeof g);
        return;
    }
    krt_reply_to(ctx, to, ref, type, &r, sizeof r);
}

static void s_reply_record(krt_ctx_t *ctx, s_sbx_t *self, krt_addr_t to, uint64_t ref,
                           uint32_t type)
{
    ka_sbx_reply_t r;
    memset(&r, 0, sizeof r);
    r.sandbox = self->a.record;
    krt_reply_to(ctx, to, ref, type, &r, sizeof r);
}

/* The directory a file:// snapshot location gives this sandbox, an s3:// or gs:// location
 * as it is (the objects are named by the sandbox id), or "" for other schemes. */
static int s_snapshot_dir(const s_sbx_t *self, const char *location, char *out, size_t cap)
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

/* ---- blocking work (job threads) ---------------------------------------------------------- */

/* A snapshot copy's budget: a sandbox cannot hold a job thread for longer. */
static ka_tree_opts_t s_tree_opts(int64_t owner)
{
    return (ka_tree_opts_t){.deadline_ms = krt_mono_ms() + SNAPSHOT_DEADLINE_MS, .owner = owner};
}

static int s_job_start(s_job_t *j);

/* After a failed save to object storage the sandbox comes back READY with its /data: the
 * halted compute's /data goes to an unnamed temporary file on the node (ka_snapshot_tmpfile),
 * a fresh compute replaces it and gets that /data back. 0, or the error that lost the
 * sandbox. */
static int s_job_rescue(s_job_t *j)
{
    char why[KA_SNAPSHOT_ERR_CAP] = "";
    ka_tree_opts_t o = s_tree_opts(-1);
    int fd = ka_snapshot_tmpfile();
    int rc = fd < 0 ? fd
                    : ka_snapshot_write(ka_driver_data_dir(j->driver, j->sb), &o,
                                        ka_snapshot_fd_sink, &fd, NULL, why, sizeof why);
    if (!rc)
        rc = ka_driver_stop(j->driver, &j->sb);
    char err[sizeof j->err];
    s_copy(err, sizeof err, j->err);
    if (!rc && !(rc = s_job_start(j)) && !(rc = lseek(fd, 0, SEEK_SET) < 0 ? -errno : 0)) {
        o.owner = ka_driver_owner(j->driver, j->sb);
        rc = ka_snapshot_read(ka_driver_data_dir(j->driver, j->sb), fd, &o, NULL, why, sizeof why);
    }
    if (fd >= 0)
        close(fd);
    if (rc)
        snprintf(j->err, sizeof j->err, "%.300s; keeping /data on the node failed too: %.150s", err,
                 why[0] ? why : strerror(-rc));
    else
        s_copy(j->err, sizeof j->err, err);
    return rc;
}

/* Saves /data: the sandbox is halted first (nothing inside runs while it is read), and the
 * walk never follows a link out of it nor opens anything but regular files. A save to object
 * storage that fails leaves the sandbox READY with its /data (s_job_rescue). */
static int s_job_suspend(s_job_t *j)
{
    ka_tree_opts_t o = s_tree_opts(-1);
    char why[sizeof j->err - 64] = "";
    bool object = ka_objstore_is_location(j->snapshot);
    int rc = ka_driver_halt(j->driver, j->sb);
    if (!rc && object)
        rc = ka_snapobj_save(j->snapshot, j->id, j->revision, ka_driver_data_dir(j->driver, j->sb),
                             &o, why, sizeof why);
    else if (!rc && !(rc = ka_tree_remove(j->snapshot, &o)))
        rc = ka_tree_copy(ka_driver_data_dir(j->driver, j->sb), j->snapshot, &o, NULL);
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
static int s_job_restore(s_job_t *j)
{
    ka_tree_opts_t o = s_tree_opts(ka_driver_owner(j->driver, j->sb));
    char why[sizeof j->err - 64] = "";
    const char *data = ka_driver_data_dir(j->driver, j->sb);
    bool object = ka_objstore_is_location(j->snapshot);
    int rc = object ? ka_snapobj_restore(j->snapshot, j->id, data, &o, why, sizeof why)
                    : ka_tree_copy(j->snapshot, data, &o, NULL);
    if (rc)
        snprintf(j->err, sizeof j->err, "restoring /data from the snapshot failed: %s",
                 why[0] ? why : strerror(-rc));
    j->kept = rc && object;
    return rc;
}

/* Removes the sandbox's snapshot (a delete); a failure leaves objects behind, said in the log. */
static void s_job_remove_snapshot(s_job_t *j)
{
    ka_tree_opts_t o = s_tree_opts(-1);
    char why[sizeof j->err] = "";
    if (!ka_objstore_is_location(j->snapshot))
        ka_tree_remove(j->snapshot, &o);
    else if (ka_snapobj_remove(j->snapshot, j->id, &o, why, sizeof why))
        krt_log(KRT_LOG_WARN, "sandboxes", "snapshot_remove_failed", "sandbox=%s %s", j->id, why);
}

static int s_job_start(s_job_t *j)
{
    const char *lower[] = {j->rootfs};
    ka_sandbox_spec_t spec = {.id = j->id, .lowerdirs = lower, .n_lower = 1};
    int rc = ka_driver_start(j->driver, &spec, &j->sb);
    if (rc)
        snprintf(j->err, sizeof j->err, "starting the sandbox failed: %s", strerror(-rc));
    return rc;
}

static int s_job_run(void *arg)
{
    s_job_t *j = arg;
    int rc = 0;
    switch (j->kind) {
    case JOB_BOOT:
        return s_job_start(j);
    case JOB_RESUME:
        return (rc = s_job_start(j)) ? rc : s_job_restore(j);
    case JOB_SUSPEND:
        return s_job_suspend(j);
    case JOB_STOP:
        if (j->sb)
            rc = ka_driver_stop(j->driver, &j->sb);
        s_job_remove_snapshot(j);
        return rc;
    default:
        return 0;
    }
}

static int s_submit(krt_ctx_t *ctx, s_sbx_t *self, s_job_kind_t kind, const char *rootfs,
                    const char *snapshot)
{
    s_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    j->kind = kind;
    j->driver = self->a.driver;
    s_copy(j->id, sizeof j->id, self->a.record.id);
    s_copy(j->rootfs, sizeof j->rootfs, rootfs);
    s_copy(j->snapshot, sizeof j->snapshot, snapshot);
    s_copy(j->revision, sizeof j->revision, self->a.record.revision);
    if (kind == JOB_SUSPEND || kind == JOB_STOP) { /* the job takes the compute */
        ka_guestconn_destroy(&self->gc);
        if (self->watching)
            krt_fd_unwatch(ctx, ka_driver_channel(self->a.driver, self->compute));
        self->watching = false;
        j->sb = self->compute;
        self->compute = NULL;
    }
    int rc = krt_job_submit(ctx, s_job_run, j, &self->job_ref);
    if (rc) {
        self->compute = j->sb;
        free(j);
        return rc;
    }
    self->job = j;
    return 0;
}

/* ---- store writes --------------------------------------------------------------------------- */

static int s_store_update(krt_ctx_t *ctx, s_sbx_t *self, s_store_step_t step, int state, int op,
                          const char *reason, const char *message)
{
    ka_store_sandbox_update_t u;
    memset(&u, 0, sizeof u);
    s_copy(u.id, sizeof u.id, self->a.record.id);
    u.set = KA_SB_SET_STATE | KA_SB_SET_OPERATION | (reason ? KA_SB_SET_FAILURE : 0);
    u.expect_state = -1;
    u.state = state;
    u.operation = op;
    s_copy(u.failure_reason, sizeof u.failure_reason, reason);
    s_copy(u.failure_message, sizeof u.failure_message, message);
    self->store_step = step;
    if (step == SS_RESULT)
        self->result = u;
    return krt_request(ctx, self->a.store, KA_STORE_SANDBOX_UPDATE, &u, sizeof u, STORE_TIMEOUT_MS,
                       &self->store_ref);
}

/* A result (READY, SUSPENDED, FAILED, ...) describes work already done (compute started or
 * stopped): the record must catch up with it, so a write lost to an unavailable store is sent
 * again until it lands, and the caller, who waits, then gets the result. Answering "retry"
 * instead would leave the record behind the compute for good (a create's replay would read
 * CREATING while the guest runs). */
static void s_retry_result(krt_ctx_t *ctx, s_sbx_t *self)
{
    self->store_step = SS_RESULT;
    if (krt_request(ctx, self->a.store, KA_STORE_SANDBOX_UPDATE, &self->result, sizeof self->result,
                    STORE_TIMEOUT_MS, &self->store_ref))
        krt_timer_arm(ctx, &self->result_retry, RETRY_RESULT_MS, MSG_RETRY_RESULT, 0);
}

static int s_store_tombstone(krt_ctx_t *ctx, s_sbx_t *self)
{
    ka_store_sandbox_key_t k;
    memset(&k, 0, sizeof k);
    s_copy(k.id, sizeof k.id, self->a.record.id);
    self->store_step = SS_TOMBSTONE;
    return krt_request(ctx, self->a.store, KA_STORE_SANDBOX_DELETE, &k, sizeof k, STORE_TIMEOUT_MS,
                       &self->store_ref);
}

/* ---- the running mutation ------------------------------------------------------------------- */

static void s_begin(s_sbx_t *self, uint32_t type, krt_addr_t from, uint64_t ref, bool answer)
{
    self->op_type = type;
    self->op_from = from;
    self->op_ref = ref;
    self->op_answer = answer;
    self->before_state = self->a.record.state;
    self->before_op = self->a.record.operation;
}

static void s_answer(krt_ctx_t *ctx, s_sbx_t *self, krt_addr_t to, uint64_t ref, uint32_t type,
                     int code, const char *message)
{
    if (code == KA_OK)
        s_reply_record(ctx, self, to, ref, type);
    else
        s_reply_status(ctx, to, ref, type, code, "%s", message);
}

static void s_answer_joiners(krt_ctx_t *ctx, s_sbx_t *self, int code, const char *message)
{
    while (self->joiners) {
        s_joiner_t *j = self->joiners;
        self->joiners = j->next;
        s_answer(ctx, self, j->to, j->ref, KA_SBX_CREATE, code, message);
        free(j);
    }
}

/* Ends the running mutation: answers its caller (and a create's replays) with the record (code
 * OK) or an error, then starts a delete that was waiting. */
static void s_finish(krt_ctx_t *ctx, s_sbx_t *self, int code, const char *message)
{
    if (self->op_answer)
        s_answer(ctx, self, self->op_from, self->op_ref, self->op_type, code, message);
    s_answer_joiners(ctx, self, code, message);
    self->op_type = 0;
    self->op_answer = false;
    self->store_step = SS_IDLE;
    if (self->delete_pending)
        s_start_delete(ctx, self);
}

static void s_arm_ttl(krt_ctx_t *ctx, s_sbx_t *self)
{
    int64_t left = self->a.record.expires_ms - krt_wall_ms();
    krt_timer_arm(ctx, &self->ttl, left > 0 ? (uint64_t)left : 0, MSG_TTL, 0);
}

/* ---- guest connection ----------------------------------------------------------------------- */

/* Watches the guest channel for replies, and for writability while a request is only partly
 * sent (a READ-only watch would never fire for the rest of a large frame: the guest waits). */
static void s_watch(krt_ctx_t *ctx, s_sbx_t *self)
{
    if (!self->gc)
        return;
    uint32_t ev = KRT_FD_READ | (ka_guestconn_pending(self->gc) ? KRT_FD_WRITE : 0);
    if (self->watching && self->watch_ev == ev)
        return;
    int fd = ka_guestconn_fd(self->gc);
    if (self->watching)
        krt_fd_unwatch(ctx, fd);
    self->watching = krt_fd_watch(ctx, fd, ev, 1) == 0;
    self->watch_ev = ev;
}

/* Ends guest call c: its caller gets a final frame with code (nothing if KA_OK: the frame
 * went already). */
static void s_end_call(krt_ctx_t *ctx, s_sbx_t *self, ka_gc_call_t *c, int code,
                       const char *message)
{
    s_waiter_t *w = c->user;
    if (code != KA_OK)
        s_reply_status(ctx, w->to, w->ref, KA_SBX_GUEST, code, "%s", message);
    free(w);
    ka_gc_remove(&self->calls, c);
}

static void s_fail_waiters(krt_ctx_t *ctx, s_sbx_t *self, int code, const char *message)
{
    while (self->calls.head)
        s_end_call(ctx, self, self->calls.head, code, message);
}

static int s_code_of_errno(int err)
{
    switch (err) {
    case -ENOENT:
        return KA_NOT_FOUND;
    case -EAGAIN:
    case -EFBIG:
    case -ENOSPC:
        return KA_RESOURCE_EXHAUSTED;
    case -EINVAL:
    case -ENAMETOOLONG:
    case -EISDIR:
    case -ENOTDIR:
        return KA_INVALID_ARGUMENT;
    case -EACCES:
    case -EPERM:
        return KA_PERMISSION_DENIED;
    case -EPIPE:
        return KA_FAILED_PRECONDITION;
    case -ETIMEDOUT:
        return KA_DEADLINE_EXCEEDED;
    default:
        return KA_INTERNAL;
    }
}

static void s_process_info(const ka_gp_process_t *p, ka_process_info_t *out)
{
    out->proc = p->proc;
    out->pid = p->pid;
    out->state = (int32_t)p->state;
    out->exit_code = (int32_t)p->exit_code;
    out->started_ms = (int64_t)p->started_ms;
    out->finished_ms = (int64_t)p->finished_ms;
}

static void s_send_frame(krt_ctx_t *ctx, const s_waiter_t *w, const ka_guest_reply_t *r, size_t len)
{
    if (w->ref && r->final)
        krt_reply_to(ctx, w->to, w->ref, KA_SBX_GUEST, r, len);
    else if (!w->ref)
        krt_send(ctx, w->to, KA_SBX_GUEST_FRAME, r, len);
}

/* Bytes to hold a process's argv as NUL-terminated strings (0 if absent or malformed). */
static size_t s_argv_size(const msgpack_object *argv)
{
    if (!argv || argv->type != MSGPACK_OBJECT_ARRAY)
        return 0;
    size_t n = 0;
    for (uint32_t i = 0; i < argv->via.array.size; i++) {
        const msgpack_object *a = &argv->via.array.ptr[i];
        if (a->type != MSGPACK_OBJECT_STR)
            return 0;
        n += a->via.str.size + 1;
    }
    return n;
}

static void s_argv_pack(const msgpack_object *argv, char *out)
{
    if (!s_argv_size(argv))
        return;
    for (uint32_t i = 0; i < argv->via.array.size; i++) {
        const msgpack_object *a = &argv->via.array.ptr[i];
        memcpy(out, a->via.str.ptr, a->via.str.size);
        out += a->via.str.size;
        *out++ = '\0';
    }
}

/* Turns one guest frame into a data frame and/or a final frame for its waiter. Returns true
 * when the waiter is done. */
static bool s_route_frame(krt_ctx_t *ctx, s_waiter_t *w, const ka_gp_frame_t *f)
{
    const msgpack_object *m = ka_gp_frame_map(f);
    static const struct {
        const char *key;
        int stream;
    } data_keys[] = {
        {"stdout", KA_STREAM_STDOUT}, {"stderr", KA_STREAM_STDERR}, {"chunk", KA_STREAM_FILE}};
    for (size_t i = 0; i < sizeof data_keys / sizeof data_keys[0]; i++) {
        const char *p;
        size_t n;
        if (!ka_gp_get_bytes(m, data_keys[i].key, &p, &n))
            continue;
        ka_guest_reply_t *r = calloc(1, sizeof *r + n);
        if (!r)
            break;
        r->stream = data_keys[i].stream;
        ka_gp_get_u64(m, "offset", &r->offset);
        r->tail_len = (uint32_t)n;
        memcpy(r->tail, p, n);
        s_send_frame(ctx, w, r, sizeof *r + n);
        free(r);
    }
    if (!ka_gp_frame_is_end(f))
        return false;
    const msgpack_object *pobj = ka_gp_get(m, "process");
    if (!pobj)
        pobj = ka_gp_get(m, "exit");
    const msgpack_object *argv = pobj ? ka_gp_get(pobj, "argv") : NULL;
    size_t tail = s_argv_size(argv);
    ka_guest_reply_t *r = calloc(1, sizeof *r + tail);
    if (!r)
        return true;
    r->final = 1;
    int err = ka_gp_frame_err(f);
    if (err) {
        r->status.code = s_code_of_errno(err);
        s_copy(r->status.message, sizeof r->status.message,
               err == -EFBIG ? KA_MSG_FILE_TOO_LARGE : ka_gp_frame_msg(f));
    }
    ka_gp_process_t p;
    if (pobj && ka_gp_process_decode(pobj, &p) == 0) {
        r->has_process = 1;
        s_process_info(&p, &r->process);
        r->tail_len = (uint32_t)tail;
        s_argv_pack(argv, r->tail);
    }
    if (!ka_gp_get_u64(m, "written", &r->written))
        ka_gp_get_u64(m, "size", &r->written);
    s_send_frame(ctx, w, r, sizeof *r + r->tail_len);
    free(r);
    return true;
}

/* Records a state change nobody asked for (guest lost, compute lost at node start). */
static void s_mark(krt_ctx_t *ctx, s_sbx_t *self, int state, const char *reason,
                   const char *message)
{
    self->a.record.state = state;
    self->a.record.operation = KA_OP_NONE;
    s_begin(self, 0, KRT_ADDR_NONE, 0, false);
    if (s_store_update(ctx, self, SS_RESULT, state, KA_OP_NONE, reason, message))
        self->store_step = SS_IDLE;
}

/* The guest is gone or was stopped: every caller learns it, the sandbox is FAILED with reason
 * (unless a lifecycle operation is running, which decides the state itself). */
static void s_drop_guest(krt_ctx_t *ctx, s_sbx_t *self, const char *reason, const char *message)
{
    s_fail_waiters(ctx, self, KA_UNAVAILABLE, message);
    if (self->watching && self->gc)
        krt_fd_unwatch(ctx, ka_guestconn_fd(self->gc));
    ka_guestconn_destroy(&self->gc);
    self->watching = false;
    if (self->op_type == 0 && !self->delete_pending)
        s_mark(ctx, self, KA_STATE_FAILED, reason, message);
}

/* The guest exited (its channel closed). */
static void s_guest_lost(krt_ctx_t *ctx, s_sbx_t *self)
{
    krt_log_actor(ctx, KRT_LOG_WARN, "guest_lost", "sandbox=%s", self->a.record.id);
    s_drop_guest(ctx, self, KA_FAIL_GUEST_EXITED,
                 "the sandbox guest exited; delete the sandbox and create a new one");
}

/* The guest broke the protocol (guest_proto.h): it is hostile or broken. It is killed, never
 * trusted again; the node goes on. */
static void s_guest_violation(krt_ctx_t *ctx, s_sbx_t *self, const char *why)
{
    ka_gc_count_violation();
    krt_log_actor(ctx, KRT_LOG_WARN, "guest_protocol_violation", "sandbox=%s why=\"%s\"",
                  self->a.record.id, why);
    if (self->compute)
        ka_driver_kill(self->a.driver, self->compute);
    char msg[256];
    snprintf(msg, sizeof msg,
             "the sandbox guest broke the protocol (%s) and was stopped; delete the sandbox and "
             "create a new one",
             why);
    s_drop_guest(ctx, self, KA_FAIL_GUEST_PROTO, msg);
}

/* Acts on one frame the guest sent: delivered, dropped (counted) or fatal. False when the
 * guest was dropped. */
static bool s_guest_frame(krt_ctx_t *ctx, s_sbx_t *self, const ka_gp_frame_t *f)
{
    ka_gc_call_t *c;
    const char *why;
    ka_gc_verdict_t v =
        ka_gc_check(&self->calls, ka_guestconn_last_id(self->gc), f, krt_now_ms(), &c, &why);
    if (v == KA_GC_FATAL) {
        s_guest_violation(ctx, self, why);
        return false;
    }
    uint64_t n = v == KA_GC_DROP && why ? ++self->dropped : 0;
    if (n && !(n & (n - 1))) /* the 1st, 2nd, 4th, 8th, ... */
        krt_log_actor(ctx, KRT_LOG_WARN, "guest_frame_dropped",
                      "sandbox=%s why=\"%s\" dropped=%llu", self->a.record.id, why,
                      (unsigned long long)self->dropped);
    if (v == KA_GC_DELIVER && s_route_frame(ctx, c->user, f))
        s_end_call(ctx, self, c, KA_OK, "");
    return true;
}

/* Writes what is queued for the guest; false if there is no guest (any more: a failed write
 * means it is lost). */
static bool s_flush_or_lose(krt_ctx_t *ctx, s_sbx_t *self)
{
    if (!self->gc)
        return false;
    int rc = ka_guestconn_flush(self->gc);
    if (rc && rc != -EAGAIN) {
        s_guest_lost(ctx, self);
        return false;
    }
    return true;
}

/* Reads and routes what the guest sent, FRAMES_PER_TURN frames at most per turn (a flood
 * cannot hold a scheduler thread). from_fd: the watch fired (it is one-shot). */
static void s_on_guest_io(krt_ctx_t *ctx, s_sbx_t *self, bool from_fd)
{
    if (from_fd)
        self->watching = false;
    if (!s_flush_or_lose(ctx, self))
        return;
    for (int i = 0; i < FRAMES_PER_TURN; i++) {
        ka_gp_frame_t *f = NULL;
        int rc = ka_guestconn_recv(self->gc, &f);
        if (rc == -EAGAIN) {
            s_watch(ctx, self);
            return;
        }
        if (rc == -EMSGSIZE || rc == -EBADMSG) {
            s_guest_violation(ctx, self,
                              rc == -EMSGSIZE ? "a frame over the size limit"
                                              : "a frame that is not one bounded msgpack map");
            return;
        }
        if (rc) {
            s_guest_lost(ctx, self);
            return;
        }
        bool alive = s_guest_frame(ctx, self, f);
        ka_gp_frame_free(&f);
        if (!alive)
            return;
    }
    krt_send(ctx, krt_self(ctx), MSG_GUEST_MORE, NULL, 0);
}

/* ---- guest requests ------------------------------------------------------------------------- */

/* Appends tail strings (n of them, NUL-separated) to out[*k], up to cap; 0 or -EINVAL. */
static int s_strings(const char **cur, const char *end, uint32_t n, const char **out, size_t *k,
                     size_t cap)
{
    for (uint32_t i = 0; i < n; i++) {
        const char *nul = memchr(*cur, '\0', (size_t)(end - *cur));
        if (!nul || *k + 1 >= cap)
            return -EINVAL;
        out[(*k)++] = *cur;
        *cur = nul + 1;
    }
    return 0;
}

static int s_guest_start(s_sbx_t *self, const ka_guest_req_t *q, uint64_t *gid)
{
    enum { MAX_STRINGS = 4096 };
    const char **argv = calloc(MAX_STRINGS, sizeof *argv);
    const char **env = calloc(MAX_STRINGS, sizeof *env);
    int rc = -ENOMEM;
    if (argv && env) {
        const char *cur = q->tail, *end = q->tail + q->tail_len;
        size_t na = 0, ne = 0;
        /* template env first; the request's entries override by coming later */
        const char *tcur = self->a.runtime.env;
        const char *tend = self->a.runtime.env + sizeof self->a.runtime.env;
        rc = s_strings(&cur, end, q->n_argv, argv, &na, MAX_STRINGS);
        if (!rc)
            rc = s_strings(&tcur, tend, self->a.runtime.n_env, env, &ne, MAX_STRINGS);
        if (!rc)
            rc = s_strings(&cur, end, q->n_env, env, &ne, MAX_STRINGS);
        if (!rc && na == 0)
            rc = -EINVAL;
        if (!rc) {
            ka_gp_start_t st = {.argv = argv,
                                .cwd = q->cwd[0] ? q->cwd : NULL,
                                .env = env,
                                .stdin_open = q->stdin_open != 0,
                                .timeout_ms = q->timeout_ms};
            rc = ka_guestconn_start(self->gc, &st, gid);
        }
    }
    free(argv);
    free(env);
    return rc;
}

static int s_guest_send(s_sbx_t *self, const ka_guest_req_t *q, uint64_t *gid)
{
    switch (q->op) {
    case KA_GUEST_START:
        return s_guest_start(self, q, gid);
    case KA_GUEST_GET:
        return ka_guestconn_get(self->gc, q->proc, gid);
    case KA_GUEST_SIGNAL:
        return ka_guestconn_signal(self->gc, q->proc, q->signal, gid);
    case KA_GUEST_INPUT:
        return ka_guestconn_input(self->gc, q->proc, q->tail, q->tail_len, q->close != 0, gid);
    case KA_GUEST_OUTPUT:
        return ka_guestconn_output(self->gc, q->proc, q->stdout_offset, q->stderr_offset,
                                   q->follow != 0, gid);
    case KA_GUEST_READ:
        return ka_guestconn_read(self->gc, q->path, q->mode, gid);
    case KA_GUEST_WRITE:
        if (q->tail_len > KA_GP_FILE_CAP)
            return -EFBIG;
        return ka_guestconn_write(self->gc, q->path, q->mode, q->seek_offset, q->tail, q->tail_len,
                                  gid);
    default:
        return -EINVAL;
    }
}

/* What the guest's frames for q may be. */
static ka_gc_kind_t s_guest_kind(const ka_guest_req_t *q)
{
    switch (q->op) {
    case KA_GUEST_START:
        return KA_GC_START;
    case KA_GUEST_GET:
    case KA_GUEST_SIGNAL:
        return KA_GC_PROC;
    case KA_GUEST_OUTPUT:
        return KA_GC_OUTPUT;
    case KA_GUEST_READ:
        return KA_GC_READ;
    default:
        return KA_GC_UNARY;
    }
}

/* Writes what is queued for the guest and watches the channel. */
static void s_guest_flush(krt_ctx_t *ctx, s_sbx_t *self)
{
    if (s_flush_or_lose(ctx, self))
        s_watch(ctx, self);
}

static bool s_guest_req_ok(const void *body, size_t len)
{
    const ka_guest_req_t *q = body;
    return len >= sizeof *q && len == sizeof *q + q->tail_len &&
           memchr(q->caller, 0, sizeof q->caller) && memchr(q->cwd, 0, sizeof q->cwd) &&
           memchr(q->path, 0, sizeof q->path);
}

static bool s_guest_ready(const s_sbx_t *self)
{
    return self->gc && self->a.record.state == KA_STATE_READY &&
           self->a.record.operation == KA_OP_NONE && krt_wall_ms() < self->a.record.expires_ms;
}

static void s_on_guest(krt_ctx_t *ctx, s_sbx_t *self, krt_addr_t from, uint64_t ref,
                       const void *body, size_t len)
{
    if (!s_guest_req_ok(body, len)) {
        s_reply_status(ctx, from, ref, KA_SBX_GUEST, KA_INVALID_ARGUMENT,
                       "malformed guest request");
        return;
    }
    const ka_guest_req_t *q = body;
    if (strcmp(q->caller, self->a.record.creator) != 0) {
        s_reply_status(ctx, from, ref, KA_SBX_GUEST, KA_NOT_FOUND, KA_MSG_NOT_FOUND);
        return;
    }
    if (!s_guest_ready(self)) {
        s_reply_status(ctx, from, ref, KA_SBX_GUEST, KA_FAILED_PRECONDITION, KA_MSG_NOT_READY);
        return;
    }
    ka_gc_kind_t kind = s_guest_kind(q);
    bool streams = ka_gc_kind_streams(kind);
    if (self->calls.n >= MAX_GUEST_CALLS ||
        (streams && self->calls.n_streams >= MAX_GUEST_STREAMS)) {
        s_reply_status(ctx, from, ref, KA_SBX_GUEST, KA_RESOURCE_EXHAUSTED,
                       "too many open calls on this sandbox (%d streams and %d calls at most); "
                       "retry when one has ended",
                       MAX_GUEST_STREAMS, MAX_GUEST_CALLS);
        return;
    }
    s_waiter_t *w = calloc(1, sizeof *w);
    uint64_t gid = 0;
    int rc = w ? s_guest_send(self, q, &gid) : -ENOMEM;
    const uint64_t off[2] = {q->stdout_offset, q->stderr_offset};
    if (!rc && !ka_gc_add(&self->calls, gid, kind, q->proc, off, streams ? KA_GP_WINDOW : 0,
                          krt_now_ms(), w))
        rc = -ENOMEM; /* the request went out: its reply will be dropped as stale */
    if (rc) {
        free(w);
        s_reply_status(ctx, from, ref, KA_SBX_GUEST, s_code_of_errno(rc), "%s",
                       rc == -EFBIG ? KA_MSG_FILE_TOO_LARGE : strerror(-rc));
        return;
    }
    w->to = from;
    w->ref = ref;
    w->op = q->op;
    if (!ref) { /* a sink: each watches the other (a sink that vanishes frees its window) */
        krt_send(ctx, from, KA_SBX_GUEST_BOUND, NULL, 0);
        krt_monitor(ctx, from);
    }
    if (!krt_timer_armed(&self->sweep))
        krt_timer_arm(ctx, &self->sweep, SWEEP_MS, MSG_SWEEP, 0);
    s_guest_flush(ctx, self);
}

/* The guest stream call of sink `from` (NULL if none). */
static ka_gc_call_t *s_call_of(s_sbx_t *self, krt_addr_t from)
{
    for (ka_gc_call_t *c = self->calls.head; c; c = c->next) {
        const s_waiter_t *w = c->user;
        if (w->to == from && !w->ref)
            return c;
    }
    return NULL;
}

/* A sink's reader went away: its call ends here and now (a stream is cancelled in the guest;
 * what the guest still sends for it is dropped as stale), nothing more is answered. */
static void s_on_cancel(krt_ctx_t *ctx, s_sbx_t *self, krt_addr_t from)
{
    ka_gc_call_t *c;
    while ((c = s_call_of(self, from))) {
        if (self->gc && ka_gc_kind_streams(c->kind))
            ka_guestconn_cancel(self->gc, c->id, NULL);
        s_end_call(ctx, self, c, KA_OK, "");
    }
    s_guest_flush(ctx, self);
}

/* A sink's reader consumed data: the guest may send that much more (never more than was
 * delivered: a sink cannot grant the guest credit it did not spend). */
static void s_on_credit(krt_ctx_t *ctx, s_sbx_t *self, krt_addr_t from, const void *body,
                        size_t len)
{
    const ka_sbx_credit_t *cr = body;
    ka_gc_call_t *c = len == sizeof *cr ? s_call_of(self, from) : NULL;
    if (!c || !self->gc || !ka_gc_kind_streams(c->kind))
        return;
    uint64_t grant = ka_gc_credit(c, cr->bytes);
    if (grant && ka_guestconn_credit(self->gc, c->id, grant) == 0)
        s_guest_flush(ctx, self);
}

/* Deadlines: a call whose guest sent nothing for GUEST_IDLE_MS fails (a stream waiting for
 * its reader to take data is not waiting for the guest); without a guest every call fails. */
static void s_on_sweep(krt_ctx_t *ctx, s_sbx_t *self)
{
    uint64_t now = krt_now_ms();
    ka_gc_call_t *c = self->calls.head;
    while (c) {
        ka_gc_call_t *next = c->next;
        bool blocked = c->credit == 0;
        if (!self->gc)
            s_end_call(ctx, self, c, KA_UNAVAILABLE, "the sandbox guest is not running");
        else if (!blocked && now - c->last_ms > GUEST_IDLE_MS) {
            if (ka_gc_kind_streams(c->kind))
                ka_guestconn_cancel(self->gc, c->id, NULL);
            s_end_call(ctx, self, c, KA_DEADLINE_EXCEEDED,
                       "the sandbox guest did not answer in time");
        }
        c = next;
    }
    s_guest_flush(ctx, self);
    if (self->calls.head)
        krt_timer_arm(ctx, &self->sweep, SWEEP_MS, MSG_SWEEP, 0);
}

/* ---- lifecycle requests -----------------------------------------------------------------------
 */

static void s_start_delete(krt_ctx_t *ctx, s_sbx_t *self)
{
    s_begin(self, KA_SBX_DELETE, self->del_from, self->del_ref, self->del_answer);
    self->delete_pending = false;
    self->del_answer = false;
    krt_timer_cancel(ctx, &self->ttl);
    s_fail_waiters(ctx, self, KA_FAILED_PRECONDITION, KA_MSG_NOT_READY);
    self->a.record.state = KA_STATE_DELETING;
    self->a.record.operation = KA_OP_DELETE;
    if (s_store_update(ctx, self, SS_INTENT, KA_STATE_DELETING, KA_OP_DELETE, NULL, NULL))
        s_finish(ctx, self, KA_UNAVAILABLE, "the store is not running");
}

static bool s_busy(const s_sbx_t *self)
{
    return self->op_type != 0 || self->store_step != SS_IDLE;
}

/* A create replayed by the manager (its receipt names this sandbox): while the create runs, the
 * replay waits for its answer; after, it gets the record as this actor knows it (which is ahead
 * of the store's while a result is being written). */
static void s_on_replay(krt_ctx_t *ctx, s_sbx_t *self, krt_addr_t from, uint64_t ref,
                        const void *body, size_t len)
{
    const ka_sbx_create_t *c = body;
    if (len != sizeof *c || !memchr(c->caller, 0, sizeof c->caller) ||
        strcmp(c->caller, self->a.record.creator) != 0) {
        s_reply_status(ctx, from, ref, KA_SBX_CREATE, KA_INVALID_ARGUMENT, "malformed request");
        return;
    }
    if (self->op_type != KA_SBX_CREATE) {
        s_reply_record(ctx, self, from, ref, KA_SBX_CREATE);
        return;
    }
    s_joiner_t *j = malloc(sizeof *j);
    if (!j) {
        s_reply_status(ctx, from, ref, KA_SBX_CREATE, KA_UNAVAILABLE, "out of memory; retry");
        return;
    }
    *j = (s_joiner_t){self->joiners, from, ref};
    self->joiners = j;
}

static void s_on_mutation(krt_ctx_t *ctx, s_sbx_t *self, uint32_t type, krt_addr_t from,
                          uint64_t ref, const void *body, size_t len)
{
    const ka_sbx_key_t *k = body;
    if (len != sizeof *k || !memchr(k->caller, 0, sizeof k->caller)) {
        s_reply_status(ctx, from, ref, type, KA_INVALID_ARGUMENT, "malformed request");
        return;
    }
    if (strcmp(k->caller, self->a.record.creator) != 0) {
        s_reply_status(ctx, from, ref, type, KA_NOT_FOUND, KA_MSG_NOT_FOUND);
        return;
    }
    if (type == KA_SBX_DELETE) {
        if (self->a.record.deleted_ms) { /* retired: the tombstone, as for any deleted one */
            s_reply_record(ctx, self, from, ref, type);
            return;
        }
        if (self->delete_pending || self->op_type == KA_SBX_DELETE) {
            s_reply_status(ctx, from, ref, type, KA_ABORTED, "a delete of this sandbox is running");
            return;
        }
        self->delete_pending = true;
        self->del_from = from;
        self->del_ref = ref;
        self->del_answer = true;
        if (!s_busy(self))
            s_start_delete(ctx, self);
        return;
    }
    if (s_busy(self) || self->delete_pending) {
        s_reply_status(ctx, from, ref, type, KA_ABORTED,
                       "another lifecycle operation on this sandbox is running; retry later");
        return;
    }
    const ka_store_sandbox_t *r = &self->a.record;
    bool suspend = type == KA_SBX_SUSPEND;
    int need = suspend ? KA_STATE_READY : KA_STATE_SUSPENDED;
    if (r->state != need) {
        s_reply_status(ctx, from, ref, type, KA_FAILED_PRECONDITION,
                       "cannot %s a sandbox in state %s", suspend ? "suspend" : "resume",
                       ka_state_name(r->state));
        return;
    }
    char dir[PATH_MAX];
    int rc = s_snapshot_dir(self, self->a.runtime.snapshot_location, dir, sizeof dir);
    if (rc && self->a.runtime.snapshot_location[0]) {
        s_reply_status(ctx, from, ref, type, KA_FAILED_PRECONDITION,
                       "snapshot location \"%s\" is not supported: use a file://, s3:// or gs:// "
                       "location",
                       self->a.runtime.snapshot_location);
        return;
    }
    s_begin(self, type, from, ref, true);
    if (!suspend && !self->a.runtime.rootfs[0]) { /* adopted at node start: fetch the runtime */
        ka_tpl_runtime_req_t rr;
        memset(&rr, 0, sizeof rr);
        s_copy(rr.revision, sizeof rr.revision, r->revision);
        if (krt_request(ctx, self->a.templates, KA_TPL_RUNTIME, &rr, sizeof rr, STORE_TIMEOUT_MS,
                        &self->runtime_ref))
            s_finish(ctx, self, KA_UNAVAILABLE, KA_MSG_NO_RUNTIME);
        return;
    }
    self->a.record.operation = suspend ? KA_OP_SUSPEND : KA_OP_RESUME;
    if (s_store_update(ctx, self, SS_INTENT, r->state, self->a.record.operation, NULL, NULL))
        s_finish(ctx, self, KA_UNAVAILABLE, "the store is not running");
}

static void s_on_runtime(krt_ctx_t *ctx, s_sbx_t *self, const krt_msg_t *msg)
{
    self->runtime_ref = 0;
    const ka_tpl_resolved_t *res = msg->body;
    if (msg->type == KRT_MSG_CALL_TIMEOUT || msg->len != sizeof *res || res->status.code) {
        s_finish(ctx, self, KA_UNAVAILABLE, KA_MSG_NO_RUNTIME);
        return;
    }
    self->a.runtime = *res;
    self->a.record.operation = KA_OP_RESUME;
    if (s_store_update(ctx, self, SS_INTENT, self->a.record.state, KA_OP_RESUME, NULL, NULL))
        s_finish(ctx, self, KA_UNAVAILABLE, "the store is not running");
}

/* ---- results -------------------------------------------------------------------------------- */

/* The intent is persisted: do the blocking part. */
static void s_after_intent(krt_ctx_t *ctx, s_sbx_t *self)
{
    char dir[PATH_MAX];
    s_snapshot_dir(self, self->a.runtime.snapshot_location, dir, sizeof dir);
    s_job_kind_t kind = self->op_type == KA_SBX_DELETE    ? JOB_STOP
                        : self->op_type == KA_SBX_SUSPEND ? JOB_SUSPEND
                                                          : JOB_RESUME;
    if (kind == JOB_SUSPEND) /* the guest stops with the compute: its callers learn it now */
        s_fail_waiters(ctx, self, KA_FAILED_PRECONDITION, KA_MSG_NOT_READY);
    if (s_submit(ctx, self, kind, self->a.runtime.rootfs, dir))
        s_finish(ctx, self, KA_UNAVAILABLE, "cannot start the work: out of memory");
}

/* The record is a tombstone. Calls the manager routed here before it learns that are still on
 * their way, so the actor stays and answers them as a deleted sandbox (from its record) until
 * the manager, which then routes nothing more here, stops it (KA_SBX_STOP_). */
static void s_retire(krt_ctx_t *ctx)
{
    if (krt_send(ctx, krt_parent(ctx), KA_SBX_RETIRE_, NULL, 0))
        krt_exit(ctx, KRT_EXIT_NORMAL); /* no manager: nothing routes here */
}

static void s_on_store_reply(krt_ctx_t *ctx, s_sbx_t *self, const krt_msg_t *msg)
{
    self->store_ref = 0;
    const ka_store_sandbox_reply_t *r = msg->body;
    s_store_step_t step = self->store_step;
    int err = msg->type == KRT_MSG_CALL_TIMEOUT      ? KA_STORE_EUNAVAIL
              : msg->len < sizeof(ka_store_status_t) ? KA_STORE_EINVAL
                                                     : r->status.err;
    if (!err && msg->len == sizeof *r)
        self->a.record = r->sandbox;
    if (err) {
        krt_log_actor(ctx, KRT_LOG_WARN, "store_write_failed", "sandbox=%s step=%d err=%d",
                      self->a.record.id, step, err);
        if (self->op_type == KA_SBX_DELETE && !self->op_answer) { /* expiry: try again soon */
            self->op_type = 0;
            self->store_step = SS_IDLE;
            krt_timer_arm(ctx, &self->ttl, RETRY_DELETE_MS, MSG_TTL, 0);
            return;
        }
        if (step == SS_RESULT && err == KA_STORE_EUNAVAIL) { /* still busy: nothing else runs */
            krt_timer_arm(ctx, &self->result_retry, RETRY_RESULT_MS, MSG_RETRY_RESULT, 0);
            return;
        }
        if (step == SS_INTENT) { /* nothing was done: the sandbox stays as it was, usable */
            self->a.record.state = self->before_state;
            self->a.record.operation = self->before_op;
        }
        if (self->op_type == KA_SBX_DELETE) /* its TTL still ends it if nobody retries */
            s_arm_ttl(ctx, self);
        s_finish(ctx, self, ka_code_of_store(err), "the sandbox store is unavailable; retry");
        return;
    }
    switch (step) {
    case SS_INTENT:
        s_after_intent(ctx, self);
        break;
    case SS_RESULT: {
        int code = self->result_code; /* once: later results (s_mark) answer nobody */
        self->result_code = KA_OK;
        s_finish(ctx, self, code, self->result_message);
        break;
    }
    case SS_TOMBSTONE:
        krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_deleted", "sandbox=%s", self->a.record.id);
        s_finish(ctx, self, KA_OK, "");
        s_retire(ctx);
        break;
    default:
        break;
    }
}

static void s_adopt_compute(krt_ctx_t *ctx, s_sbx_t *self, ka_sandbox_t *sb)
{
    /* calls of an earlier guest (before a suspend) cannot be answered by this one, and its
     * ids start over */
    s_fail_waiters(ctx, self, KA_UNAVAILABLE, "the sandbox guest restarted");
    self->compute = sb;
    self->gc = ka_guestconn_new(ka_driver_channel(self->a.driver, sb), false);
    if (self->gc)
        ka_guestconn_set_window(self->gc, KA_GP_WINDOW);
    s_watch(ctx, self);
}

static void s_on_job_done(krt_ctx_t *ctx, s_sbx_t *self, const krt_msg_t *msg)
{
    const krt_job_done_t *d = msg->body;
    s_job_t *j = d->arg;
    int rc = d->result;
    self->job = NULL;
    s_job_kind_t kind = j->kind;
    bool kept = rc && j->kept; /* failed, the sandbox as it was: its state stays */
    bool live = rc ? kept && kind == JOB_SUSPEND : kind == JOB_BOOT || kind == JOB_RESUME;
    if (rc && j->sb && !live) /* half-done: never leave compute that no record points at */
        ka_driver_stop(j->driver, &j->sb);
    if (live)
        s_adopt_compute(ctx, self, j->sb);
    char err[sizeof j->err];
    s_copy(err, sizeof err, j->err[0] ? j->err : strerror(rc < 0 ? -rc : EIO));
    free(j);
    krt_log_actor(ctx, rc ? KRT_LOG_WARN : KRT_LOG_DEBUG, "sandbox_job_done",
                  "sandbox=%s job=%d rc=%d", self->a.record.id, kind, rc);
    if (kind == JOB_STOP) { /* compute released (or already gone): tombstone */
        if (s_store_tombstone(ctx, self))
            s_finish(ctx, self, KA_UNAVAILABLE, "the store is not running");
        return;
    }
    const char *reason = kind == JOB_BOOT     ? KA_FAIL_START
                         : kind == JOB_RESUME ? KA_FAIL_RESUME
                                              : KA_FAIL_SUSPEND;
    int state = kept                  ? self->before_state
                : rc                  ? KA_STATE_FAILED
                : kind == JOB_SUSPEND ? KA_STATE_SUSPENDED
                                      : KA_STATE_READY;
    self->result_code = kept ? KA_UNAVAILABLE : KA_OK;
    s_copy(self->result_message, sizeof self->result_message, kept ? err : "");
    if (s_store_update(ctx, self, SS_RESULT, state, KA_OP_NONE, rc && !kept ? reason : NULL,
                       rc && !kept ? err : NULL))
        s_finish(ctx, self, KA_UNAVAILABLE, "the store is not running");
}

/* ---- the actor --------------------------------------------------------------------------------
 */

static void s_dispatch(krt_ctx_t *ctx, s_sbx_t *self, uint32_t type, krt_addr_t from, uint64_t ref,
                       const void *body, size_t len)
{
    switch (type) {
    case KA_SBX_CREATE:
        s_on_replay(ctx, self, from, ref, body, len);
        break;
    case KA_SBX_SUSPEND:
    case KA_SBX_RESUME:
    case KA_SBX_DELETE:
        s_on_mutation(ctx, self, type, from, ref, body, len);
        break;
    case KA_SBX_GUEST:
        s_on_guest(ctx, self, from, ref, body, len);
        break;
    case KA_SBX_GUEST_CANCEL:
        s_on_cancel(ctx, self, from);
        break;
    case KA_SBX_GUEST_CREDIT:
        s_on_credit(ctx, self, from, body, len);
        break;
    case KA_SBX_GET:
        s_reply_record(ctx, self, from, ref, type);
        break;
    default:
        break;
    }
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_sbx_t *self = state;
    if (msg->ref && msg->ref == self->store_ref) {
        s_on_store_reply(ctx, self, msg);
        return;
    }
    if (msg->ref && msg->ref == self->runtime_ref) {
        s_on_runtime(ctx, self, msg);
        return;
    }
    switch (msg->type) {
    case KRT_MSG_JOB_DONE:
        s_on_job_done(ctx, self, msg);
        break;
    case KRT_MSG_FD_READY:
        s_on_guest_io(ctx, self, true);
        break;
    case MSG_GUEST_MORE:
        s_on_guest_io(ctx, self, false);
        break;
    case MSG_SWEEP:
        s_on_sweep(ctx, self);
        break;
    case KRT_MSG_DOWN: /* a sink stopped: what it still had open ends */
        if (msg->len == sizeof(krt_down_t))
            s_on_cancel(ctx, self, ((const krt_down_t *)msg->body)->who);
        break;
    case MSG_RETRY_RESULT:
        if (self->store_step == SS_RESULT && !self->store_ref)
            s_retry_result(ctx, self);
        break;
    case MSG_TTL:
        if (self->a.record.deleted_ms) /* retired: a timer that fired as the delete ended */
            break;
        krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_expired", "sandbox=%s", self->a.record.id);
        if (!self->delete_pending && self->op_type != KA_SBX_DELETE) {
            self->delete_pending = true;
            self->del_answer = false;
            if (!s_busy(self))
                s_start_delete(ctx, self);
        }
        break;
    case KA_SBX_STOP_:
        if (msg->from == krt_parent(ctx) && self->a.record.deleted_ms)
            krt_exit(ctx, KRT_EXIT_NORMAL);
        break;
    case KA_SBX_FORWARD_: {
        const ka_sbx_forward_t *f = msg->body;
        if (msg->len >= sizeof *f && msg->len == sizeof *f + f->len)
            s_dispatch(ctx, self, f->type, f->from, f->ref, f->body, f->len);
        break;
    }
    default:
        s_dispatch(ctx, self, msg->type, msg->from, msg->ref, msg->body, msg->len);
    }
}

/* A record recovered at node start: nothing of its compute survived the node. */
static void s_adopt(krt_ctx_t *ctx, s_sbx_t *self)
{
    const ka_store_sandbox_t *r = &self->a.record;
    if (r->state == KA_STATE_DELETING) { /* finish what was acknowledged */
        self->delete_pending = true;
        s_start_delete(ctx, self);
    } else if (r->state == KA_STATE_SUSPENDED) {
        if (r->operation != KA_OP_NONE) /* a resume was cut off: /data is still saved */
            s_mark(ctx, self, KA_STATE_SUSPENDED, NULL, NULL);
    } else if (r->state != KA_STATE_FAILED) {
        s_mark(ctx, self, KA_STATE_FAILED, KA_FAIL_COMPUTE_LOST,
               "the sandbox's compute was lost when its node restarted; delete it and create a new "
               "one");
    }
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_sbx_t *self = state;
    if (!arg)
        return KRT_EINVAL;
    self->a = *(const ka_sandbox_args_t *)arg;
    free(arg); /* malloc'd by the manager for this actor */
    s_arm_ttl(ctx, self);
    if (self->a.mode != KA_SBX_BOOT) {
        s_adopt(ctx, self);
        return 0;
    }
    s_begin(self, KA_SBX_CREATE, self->a.reply_to, self->a.reply_ref, true);
    if (s_submit(ctx, self, JOB_BOOT, self->a.runtime.rootfs, "")) {
        s_finish(ctx, self, KA_UNAVAILABLE, "cannot start the sandbox: out of memory");
        return KRT_ENOMEM;
    }
    return 0;
}

/* Runs when the actor stops for any reason: nothing may keep running for a record that no
 * actor watches, so the compute is released here too (synchronously: a stop is milliseconds). */
static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_sbx_t *self = state;
    s_fail_waiters(ctx, self, KA_UNAVAILABLE, "the sandbox is shutting down");
    if (self->op_answer)
        s_reply_status(ctx, self->op_from, self->op_ref, self->op_type, KA_UNAVAILABLE,
                       "the node is shutting down; retry");
    s_answer_joiners(ctx, self, KA_UNAVAILABLE, "the node is shutting down; retry");
    if (self->delete_pending && self->del_answer)
        s_reply_status(ctx, self->del_from, self->del_ref, KA_SBX_DELETE, KA_UNAVAILABLE,
                       "the node is shutting down; retry");
    if (self->watching && self->gc)
        krt_fd_unwatch(ctx, ka_guestconn_fd(self->gc));
    ka_guestconn_destroy(&self->gc);
    if (self->compute)
        ka_driver_stop(self->a.driver, &self->compute);
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_sbx_t *self = state;
    size_t n = self->calls.n;
    snprintf(out, cap,
             "{\"id\":\"%s\",\"creator\":\"%s\",\"state\":\"%s\",\"operation\":\"%s\","
             "\"expires_ms\":%lld,\"guest_calls\":%zu}",
             self->a.record.id, self->a.record.creator, ka_state_name(self->a.record.state),
             ka_op_name(self->a.record.operation), (long long)self->a.record.expires_ms, n);
}

const krt_behaviour_t ka_sandbox_behaviour = {
    .kind = "sandbox",
    .state_size = sizeof(s_sbx_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
