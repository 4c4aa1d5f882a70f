/*
 * The sandbox actor's guest channel (see sandbox_int.h): requests multiplexed by id, every
 * reply frame checked (ka_guestcalls) and routed to its caller. Every open call has a
 * deadline (a guest that sends nothing for the idle time fails it) and, for a stream, a
 * monitor on its sink both ways (a sink that goes away cancels its call; the sink watches the
 * sandbox actor after KA_SBX_GUEST_BOUND).
 */
#include "sandbox_int.h"
#include "sandbox_fs.h"
#include "svc_frames.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWEEP_MS          5000
#define GUEST_IDLE_MS     120000 /* default: streams get keepalives every KA_GP_KEEPALIVE_MS */
#define MAX_GUEST_STREAMS 16     /* open streams per sandbox: KA_GP_WINDOW each in the node */
#define MAX_GUEST_CALLS   64
#define FRAMES_PER_TURN   64

/* The caller of a guest call (the user of its ka_gc_call_t). ref != 0: one reply
 * (krt_reply_to); 0: a stream sink whose frames go to `to` as KA_SBX_GUEST_FRAME messages. */
typedef struct s_waiter {
    krt_addr_t to;
    uint64_t ref;
    int op;
} s_waiter_t;

/* Ends guest call (to, ref; ref 0: a stream reader) with a final frame of the failure err (a
 * negative errno) and message. */
static void s_final(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void s_final(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int err, const char *fmt, ...)
{
    char why[KA_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    ka_guest_fail(ctx, to, ref, err, why);
}

static uint64_t s_idle_ms(const ka_sbx_t *self)
{
    return self->a.guest_idle_ms ? self->a.guest_idle_ms : GUEST_IDLE_MS;
}

static uint64_t s_sweep_ms(const ka_sbx_t *self)
{
    uint64_t q = s_idle_ms(self) / 4;
    return q < SWEEP_MS ? (q ? q : 1) : SWEEP_MS;
}

/* Watches the guest channel for replies, and for writability while a request is only partly
 * sent (a READ-only watch would never fire for the rest of a large frame: the guest waits). */
static void s_watch(krt_ctx_t *ctx, ka_sbx_t *self)
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

void ka_sbx_guest_attach(krt_ctx_t *ctx, ka_sbx_t *self)
{
    /* calls of an earlier guest (before a suspend) cannot be answered by this one, and its
     * ids start over */
    ka_sbx_guest_fail_all(ctx, self, KA_EUNAVAIL, "the sandbox guest restarted");
    self->gc = ka_guestconn_new(ka_driver_channel(self->a.driver, self->compute), false);
    if (self->gc)
        ka_guestconn_set_window(self->gc, KA_GP_WINDOW);
    s_watch(ctx, self);
}

void ka_sbx_guest_detach(krt_ctx_t *ctx, ka_sbx_t *self)
{
    if (self->watching && self->gc)
        krt_fd_unwatch(ctx, ka_guestconn_fd(self->gc));
    self->watching = false;
    ka_guestconn_destroy(&self->gc);
}

/* Ends guest call c: its caller gets a final frame with the failure err (nothing if 0: the
 * frame went already). */
static void s_end_call(krt_ctx_t *ctx, ka_sbx_t *self, ka_gc_call_t *c, int err,
                       const char *message)
{
    s_waiter_t *w = c->user;
    if (err)
        s_final(ctx, w->to, w->ref, err, "%s", message);
    free(w);
    ka_gc_remove(&self->calls, c);
}

void ka_sbx_guest_fail_all(krt_ctx_t *ctx, ka_sbx_t *self, int err, const char *message)
{
    while (self->calls.head)
        s_end_call(ctx, self, self->calls.head, err, message);
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

/* Sends w frame r (consumed; sizeof *r + its tail): a sink on this node gets the pointer (a
 * data frame is not copied again), a sink on another node and a one-reply caller a copy. */
static void s_send_frame(krt_ctx_t *ctx, const s_waiter_t *w, ka_guest_reply_t *r)
{
    size_t len = sizeof *r + r->tail_len;
    bool local = krt_addr_node(w->to) == krt_system_node_id(krt_ctx_system(ctx));
    if (!w->ref && local) {
        krt_send_ptr(ctx, w->to, KA_SBX_GUEST_FRAME_PTR, r, free);
        return;
    }
    if (w->ref && r->final)
        krt_reply_to(ctx, w->to, w->ref, KA_SBX_GUEST, r, len);
    else if (!w->ref)
        krt_send(ctx, w->to, KA_SBX_GUEST_FRAME, r, len);
    free(r);
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

/* The message of a guest failure err (a negative errno from the guest, or the node's own in
 * sending the call) whose own text is message (may be NULL). */
static const char *s_guest_why(int err, const char *message)
{
    return err == -EFBIG ? KA_MSG_FILE_TOO_LARGE : message;
}

/* Sends w the frame that carries a process (a final one with its argv in the tail) or ends
 * the call with the guest's failure (its message the tail) and counts. */
static void s_process_frame(krt_ctx_t *ctx, const s_waiter_t *w, const ka_gp_frame_t *f,
                            const msgpack_object *pobj, bool final)
{
    const msgpack_object *m = ka_gp_frame_map(f);
    int err = ka_gp_frame_err(f);
    const msgpack_object *argv = pobj && final && !err ? ka_gp_get(pobj, "argv") : NULL;
    size_t tail = err ? KA_MSG_LEN : s_argv_size(argv);
    ka_guest_reply_t *r = calloc(1, sizeof *r + tail);
    if (!r)
        return;
    r->final = final;
    if (err)
        ka_frame_set_failure(r, ka_err_of_guest(err), s_guest_why(err, ka_gp_frame_msg(f)));
    ka_gp_process_t p;
    if (pobj && ka_gp_process_decode(pobj, &p) == 0) {
        r->has_process = 1;
        s_process_info(&p, &r->process);
        if (argv) {
            r->tail_len = (uint32_t)tail;
            s_argv_pack(argv, r->tail);
        }
    }
    if (!ka_gp_get_u64(m, "written", &r->written))
        ka_gp_get_u64(m, "size", &r->written);
    s_send_frame(ctx, w, r);
}

/* Turns one guest frame into a data frame and/or a final frame for its waiter. Returns true
 * when the waiter is done. */
static bool s_route_frame(krt_ctx_t *ctx, s_waiter_t *w, const ka_gp_frame_t *f)
{
    const msgpack_object *m = ka_gp_frame_map(f);
    static const struct {
        const char *key;
        int stream;
    } data_keys[] = {{"stdout", KA_STREAM_STDOUT},
                     {"stderr", KA_STREAM_STDERR},
                     {"chunk", KA_STREAM_FILE},
                     {"event", KA_STREAM_EVENT}};
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
        s_send_frame(ctx, w, r);
    }
    bool end = ka_gp_frame_is_end(f);
    if (end && !ka_gp_frame_err(f) && (w->op == KA_GUEST_LIST || w->op == KA_GUEST_STAT)) {
        size_t len;
        ka_guest_reply_t *r = ka_sbx_fs_final(f, &len);
        if (r)
            s_send_frame(ctx, w, r);
        else
            s_final(ctx, w->to, w->ref, -EIO, "out of memory");
        return true;
    }
    const msgpack_object *pobj = ka_gp_get(m, "process");
    if (!pobj)
        pobj = ka_gp_get(m, "exit");
    if (end || pobj) /* a followed start's first frame: its process, not final */
        s_process_frame(ctx, w, f, pobj, end);
    return end;
}

/* The guest is gone or was stopped: every caller learns it, the channel closes, and the state
 * machine decides what it means for the sandbox. */
static void s_drop_guest(krt_ctx_t *ctx, ka_sbx_t *self, const char *reason, const char *message)
{
    ka_sbx_guest_fail_all(ctx, self, KA_EUNAVAIL, message);
    ka_sbx_guest_detach(ctx, self);
    ka_sbx_on_guest_exit(ctx, self, reason, message);
}

/* The guest exited (its channel closed). */
static void s_guest_lost(krt_ctx_t *ctx, ka_sbx_t *self)
{
    krt_log_actor(ctx, KRT_LOG_WARN, "guest_lost", "sandbox=%s", self->a.record.id);
    s_drop_guest(ctx, self, KA_FAIL_GUEST_EXITED,
                 "the sandbox guest exited; delete the sandbox and create a new one");
}

/* The guest broke the protocol (guest_proto.h): it is hostile or broken. It is killed, never
 * trusted again; the node goes on. */
static void s_guest_violation(krt_ctx_t *ctx, ka_sbx_t *self, const char *why)
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
static bool s_guest_frame(krt_ctx_t *ctx, ka_sbx_t *self, const ka_gp_frame_t *f)
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
        s_end_call(ctx, self, c, 0, "");
    return true;
}

/* Writes what is queued for the guest; false if there is no guest (any more: a failed write
 * means it is lost). */
static bool s_flush_or_lose(krt_ctx_t *ctx, ka_sbx_t *self)
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
void ka_sbx_guest_io(krt_ctx_t *ctx, ka_sbx_t *self, bool from_fd)
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
    krt_send(ctx, krt_self(ctx), KA_SBX_MSG_GUEST_MORE, NULL, 0);
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

static int s_guest_start(ka_sbx_t *self, const ka_guest_req_t *q, uint64_t *gid)
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
                                .timeout_ms = q->timeout_ms,
                                .follow = q->follow != 0,
                                .tty = q->tty != 0,
                                .rows = q->rows,
                                .cols = q->cols};
            rc = ka_guestconn_start(self->gc, &st, gid);
        }
    }
    free(argv);
    free(env);
    return rc;
}

static int s_guest_send(ka_sbx_t *self, const ka_guest_req_t *q, uint64_t *gid)
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
    case KA_GUEST_RESIZE:
        return ka_guestconn_resize(self->gc, q->proc, q->rows, q->cols, gid);
    case KA_GUEST_WRITE:
        if (q->tail_len > KA_GP_FILE_CAP)
            return -EFBIG;
        return ka_guestconn_write(self->gc, q->path, q->mode, q->seek_offset, q->tail, q->tail_len,
                                  gid);
    default:
        return ka_sbx_fs_send(self->gc, q, gid);
    }
}

/* What the guest's frames for q may be. */
static ka_gc_kind_t s_guest_kind(const ka_guest_req_t *q)
{
    switch (q->op) {
    case KA_GUEST_START: /* with follow: the output to the exit, one round trip */
        return q->follow ? KA_GC_FOLLOW : KA_GC_START;
    case KA_GUEST_GET:
    case KA_GUEST_SIGNAL:
    case KA_GUEST_RESIZE:
        return KA_GC_PROC;
    case KA_GUEST_INPUT:
        return KA_GC_INPUT;
    case KA_GUEST_OUTPUT:
        return KA_GC_OUTPUT;
    case KA_GUEST_READ:
        return KA_GC_READ;
    default:
        return ka_sbx_fs_kind(q->op);
    }
}

/* Writes what is queued for the guest and watches the channel. */
static void s_guest_flush(krt_ctx_t *ctx, ka_sbx_t *self)
{
    if (s_flush_or_lose(ctx, self))
        s_watch(ctx, self);
}

bool ka_sbx_guest_req_ok(const void *body, size_t len)
{
    const ka_guest_req_t *q = body;
    return len >= sizeof *q && len == sizeof *q + q->tail_len &&
           memchr(q->caller, 0, sizeof q->caller) && memchr(q->cwd, 0, sizeof q->cwd) &&
           memchr(q->path, 0, sizeof q->path);
}

void ka_sbx_guest_call(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t from, uint64_t ref,
                       const ka_guest_req_t *q)
{
    if (!self->gc || krt_wall_ms() >= self->a.record.expires_ms) {
        s_final(ctx, from, ref, -EBUSY, KA_MSG_NOT_READY);
        return;
    }
    ka_gc_kind_t kind = s_guest_kind(q);
    bool streams = ka_gc_kind_streams(kind);
    if (self->calls.n >= MAX_GUEST_CALLS ||
        (streams && self->calls.n_streams >= MAX_GUEST_STREAMS)) {
        s_final(ctx, from, ref, -ENOSPC,
                "too many open calls on this sandbox (%d streams and %d calls at most); "
                "retry when one has ended",
                MAX_GUEST_STREAMS, MAX_GUEST_CALLS);
        return;
    }
    if (kind == KA_GC_WATCH && ka_gc_count(&self->calls, KA_GC_WATCH) >= KA_GP_MAX_WATCHES) {
        s_final(ctx, from, ref, -ENOSPC,
                "too many watches on this sandbox (%d at most); end one first", KA_GP_MAX_WATCHES);
        return;
    }
    s_waiter_t *w = calloc(1, sizeof *w);
    uint64_t gid = 0;
    int rc = w ? s_guest_send(self, q, &gid) : -ENOMEM;
    const uint64_t off[2] = {q->stdout_offset, q->stderr_offset};
    uint64_t window = kind == KA_GC_WATCH ? KA_GP_WATCH_WINDOW : streams ? KA_GP_WINDOW : 0;
    ka_gc_call_t *call =
        rc ? NULL : ka_gc_add(&self->calls, gid, kind, q->proc, off, window, krt_now_ms(), w);
    if (!rc && (!call || ka_sbx_fs_track(call, q))) {
        if (call)
            ka_gc_remove(&self->calls, call);
        rc = -ENOMEM; /* the request went out: its reply will be dropped as stale */
    } else if (call) {
        call->sent = q->tail_len;
    }
    if (rc) {
        free(w);
        s_final(ctx, from, ref, ka_err_of_guest(rc), "%s", s_guest_why(rc, strerror(-rc)));
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
        krt_timer_arm(ctx, &self->sweep, s_sweep_ms(self), KA_SBX_MSG_SWEEP, 0);
    s_guest_flush(ctx, self);
}

/* The guest stream call of sink `from` (NULL if none). */
static ka_gc_call_t *s_call_of(ka_sbx_t *self, krt_addr_t from)
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
void ka_sbx_guest_cancel(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t from)
{
    ka_gc_call_t *c;
    while ((c = s_call_of(self, from))) {
        if (self->gc && ka_gc_kind_streams(c->kind))
            ka_guestconn_cancel(self->gc, c->id, NULL);
        s_end_call(ctx, self, c, 0, "");
    }
    s_guest_flush(ctx, self);
}

/* A sink's reader consumed data: the guest may send that much more (never more than was
 * delivered: a sink cannot grant the guest credit it did not spend). */
void ka_sbx_guest_credit(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t from, const void *body,
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

/* Deadlines: a call whose guest sent nothing for the idle time fails (a stream waiting for
 * its reader to take data is not waiting for the guest, nor is any call while the sandbox is
 * paused); without a guest every call fails. */
void ka_sbx_guest_sweep(krt_ctx_t *ctx, ka_sbx_t *self)
{
    uint64_t now = krt_now_ms();
    ka_gc_call_t *c = self->calls.head;
    while (c) {
        ka_gc_call_t *next = c->next;
        bool blocked = c->credit == 0;
        if (!self->gc)
            s_end_call(ctx, self, c, -ENOTCONN, "the sandbox guest is not running");
        else if (self->state != KA_SBX_PAUSED && !blocked && now - c->last_ms > s_idle_ms(self)) {
            if (ka_gc_kind_streams(c->kind))
                ka_guestconn_cancel(self->gc, c->id, NULL);
            s_end_call(ctx, self, c, -ETIMEDOUT, "the sandbox guest did not answer in time");
        }
        c = next;
    }
    s_guest_flush(ctx, self);
    if (self->calls.head)
        krt_timer_arm(ctx, &self->sweep, s_sweep_ms(self), KA_SBX_MSG_SWEEP, 0);
}

void ka_sbx_guest_touch(ka_sbx_t *self)
{
    uint64_t now = krt_now_ms();
    for (ka_gc_call_t *c = self->calls.head; c; c = c->next)
        c->last_ms = now;
}
