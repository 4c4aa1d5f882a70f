/* ka_service: requests to control-plane actors, replies to callbacks; streams via a sink actor.
 *
 * The calls for one sandbox go straight to its actor, found by its registered name
 * (ka_sandbox_name), when they pass the checks that need no record (well-formed, an
 * authenticated caller, a UUID). The manager gets them when no actor holds the name, or when the
 * actor stopped before it took the call (KRT_ENOACTOR: a retired tombstone, a crash): once, so
 * a call never hangs and is never taken twice (an actor that took a call answers it, even when
 * it stops). The manager answers the checks' refusals and, for a sandbox without an actor, from
 * the store. */
#include "service.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "phases.h"
#include "sandboxes.h"
#include "svc_frames.h"

#define MSG_STREAM_CANCEL (KA_CTL_MSG_LAST_ + 16)
#define MSG_STREAM_ACK    (KA_CTL_MSG_LAST_ + 17) /* body uint64_t: bytes the reader consumed */
#define MSG_BIND_TIMEOUT  (KA_CTL_MSG_LAST_ + 18)

struct ka_service {
    krt_system_t *sys;
    const char *templates; /* registered names, resolved at each request */
    const char *sandboxes;
};

ka_service_t *ka_service_new(krt_system_t *sys, const char *templates, const char *sandboxes)
{
    ka_service_t *svc = calloc(1, sizeof *svc);
    if (svc) {
        svc->sys = sys;
        svc->templates = templates;
        svc->sandboxes = sandboxes;
    }
    return svc;
}

void ka_service_destroy(ka_service_t **svc_p)
{
    if (svc_p && *svc_p) {
        free(*svc_p);
        *svc_p = NULL;
    }
}

krt_system_t *ka_service_system(ka_service_t *svc)
{
    return svc->sys;
}

static krt_addr_t s_route(const ka_service_t *svc, uint32_t type)
{
    if (type > KA_CTL_MSG_BASE && type < KA_SBX_CREATE)
        return krt_whereis(svc->sys, svc->templates);
    if ((type >= KA_SBX_CREATE && type < KA_SBX_FORWARD_) || type == KA_SBX_FORK)
        return krt_whereis(svc->sys, svc->sandboxes);
    return KRT_ADDR_NONE;
}

/* The actor registered for the sandbox a call is for, when the call may skip the manager (see
 * the top); else KRT_ADDR_NONE. */
static krt_addr_t s_sandbox_actor(krt_system_t *sys, uint32_t type, const void *body, size_t len)
{
    bool one = type == KA_SBX_GET || type == KA_SBX_SUSPEND || type == KA_SBX_RESUME ||
               type == KA_SBX_PAUSE || type == KA_SBX_UNPAUSE || type == KA_SBX_DELETE ||
               type == KA_SBX_GUEST;
    const char *caller = NULL;
    const char *id = one ? ka_sbx_target(type, body, len, &caller) : NULL;
    if (!id || !caller[0] || ka_check_uuid(id))
        return KRT_ADDR_NONE;
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, id);
    return krt_whereis(sys, name);
}

/* What is left of timeout_ms (> 0; else no deadline: as it is) since began (ka_metric_now()),
 * at least 1 ms. */
static int s_left(int timeout_ms, double began)
{
    if (timeout_ms <= 0)
        return timeout_ms;
    double left = timeout_ms - (ka_metric_now() - began) * 1000.0;
    return left < 1 ? 1 : (int)left;
}

/* The status of a call no actor answered (err: the runtime's failure). */
static ka_svc_status_t s_unanswered(int err)
{
    if (err == KRT_ETIMEDOUT)
        return (ka_svc_status_t){-ETIMEDOUT, "the control plane did not answer in time"};
    return (ka_svc_status_t){-ENOTCONN, "the control plane is not running"};
}

typedef struct {
    ka_svc_cb cb;
    void *user;
    uint32_t type;
    double began; /* ka_metric_now() when sent */
    int timeout_ms;
    krt_system_t *sys;
    const char *sandboxes; /* the manager's name, for a call its sandbox's actor did not take */
    bool direct;           /* sent to the sandbox's actor: body (len bytes) kept for the manager */
    size_t len;
    char body[];
} s_call_t;

static void s_on_reply(void *user, int err, const krt_msg_t *reply);

/* Sends c to `to`; a call for the sandbox's actor goes to the manager instead when that actor
 * is gone (to is KRT_ADDR_NONE, or the send finds it stopped). */
static int s_call_send(s_call_t *c, krt_addr_t to, const void *body)
{
    int rc = to ? krt_call_async(c->sys, to, c->type, body, c->len, s_left(c->timeout_ms, c->began),
                                 s_on_reply, c)
                : KRT_ENOACTOR;
    if (rc == KRT_ENOACTOR && c->direct) {
        c->direct = false;
        return s_call_send(c, krt_whereis(c->sys, c->sandboxes), body);
    }
    return rc;
}

/* A create answered READY (body a success reply): its sandbox's create_seconds (once per
 * sandbox). */
static void s_observe(uint32_t type, double began, const void *body, size_t len)
{
    const ka_sbx_reply_t *r = body;
    if (type == KA_SBX_CREATE && len == sizeof *r && r->sandbox.state == KA_STATE_READY)
        ka_phase_created(r->sandbox.id, ka_metric_now() - began);
}

static void s_on_reply(void *user, int err, const krt_msg_t *reply)
{
    s_call_t *c = user;
    /* the sandbox's actor stopped before it took the call: the manager answers */
    if (err == KRT_ENOACTOR && c->direct && s_call_send(c, KRT_ADDR_NONE, c->body) == 0)
        return;
    const char *why;
    int rc = ka_reply_outcome(err, reply, 1, &why);
    ka_svc_status_t st = rc && !why ? s_unanswered(rc) : (ka_svc_status_t){rc, why};
    if (st.err) {
        c->cb(c->user, &st, NULL, 0);
    } else {
        s_observe(c->type, c->began, reply->body, reply->len);
        c->cb(c->user, &st, reply->body, reply->len);
    }
    free(c);
}

int ka_svc_call(ka_service_t *svc, uint32_t type, const void *body, size_t len, int timeout_ms,
                ka_svc_cb cb, void *user)
{
    krt_addr_t actor = s_sandbox_actor(svc->sys, type, body, len);
    krt_addr_t to = actor ? actor : s_route(svc, type);
    if (!to || type == KA_SBX_GUEST_CANCEL)
        return KRT_EINVAL;
    s_call_t *c = malloc(sizeof *c + (actor ? len : 0));
    if (!c)
        return KRT_ENOMEM;
    *c = (s_call_t){.cb = cb,
                    .user = user,
                    .type = type,
                    .began = ka_metric_now(),
                    .timeout_ms = timeout_ms ? timeout_ms : KA_SVC_TIMEOUT_MS,
                    .sys = svc->sys,
                    .sandboxes = svc->sandboxes,
                    .direct = actor != KRT_ADDR_NONE,
                    .len = len};
    if (actor)
        memcpy(c->body, body, len);
    int rc = s_call_send(c, to, body);
    if (rc)
        free(c);
    return rc;
}

/* krt_call, the runtime's error replies (no actor answered) as its return value. */
static int s_call_sync(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body,
                       size_t len, int timeout_ms, krt_reply_t *reply)
{
    int rc = krt_call(sys, to, type, body, len, timeout_ms, reply);
    if (!rc && ka_reply_unanswered(reply->status)) {
        rc = reply->status;
        krt_reply_free(reply);
    }
    return rc;
}

int ka_svc_call_sync(ka_service_t *svc, uint32_t type, const void *body, size_t len, int timeout_ms,
                     krt_reply_t *reply)
{
    memset(reply, 0, sizeof *reply);
    double began = ka_metric_now();
    timeout_ms = timeout_ms ? timeout_ms : KA_SVC_TIMEOUT_MS;
    krt_addr_t actor = s_sandbox_actor(svc->sys, type, body, len);
    int rc =
        actor ? s_call_sync(svc->sys, actor, type, body, len, timeout_ms, reply) : KRT_ENOACTOR;
    if (rc == KRT_ENOACTOR) { /* no actor, or it stopped before taking the call */
        krt_addr_t to = s_route(svc, type);
        if (!to)
            return actor ? KA_UNAVAILABLE : KA_INVALID_ARGUMENT;
        rc = s_call_sync(svc->sys, to, type, body, len, s_left(timeout_ms, began), reply);
    }
    if (rc)
        return ka_err_code(ka_err_unanswered(rc));
    if (reply->status)
        return ka_err_code(reply->status);
    s_observe(type, began, reply->body, reply->len);
    return KA_OK;
}

/* ---- streams: one sink actor per stream -----------------------------------------------------
 *
 * The sink sends the request to the sandbox's actor, monitored from then on (or to the
 * manager, which forwards it to the actor it knows or refuses it from the record); the actor
 * answers KA_SBX_GUEST_BOUND when it takes the call (or a final frame if it refuses it). An
 * actor that ends before either (its DOWN comes first) never took the call: the sink sends it
 * to the manager, once. Once bound, the sink monitors the actor that took it (its end ends the
 * call with UNAVAILABLE) and returns the reader's credit to it directly. A call that no actor
 * takes within KA_SVC_BIND_MS (the message was dropped on the manager's way) ends UNAVAILABLE
 * too: no caller waits forever. */

typedef struct {
    ka_svc_frame_cb cb;
    void *user;
    const char *sandboxes;   /* the manager's registered name */
    ka_sbx_key_t key;        /* for the cancel message */
    ka_guest_req_ref_t *req; /* kept until an actor takes the call: the manager may get it then */
    size_t len;
} s_sink_args_t;

typedef struct {
    s_sink_args_t a;
    bool done;
    krt_addr_t to;      /* where the call went: the sandbox's actor, or the manager */
    bool direct;        /* to is the sandbox's actor, monitored, and it has not taken the call */
    krt_addr_t sandbox; /* the sandbox actor that took the call (0 until then) */
    uint64_t monitor;   /* of `to` while direct, then of sandbox */
    krt_timer_t bind;
    int op;       /* KA_GUEST_* */
    double began; /* ka_metric_now() when sent */
} s_sink_t;

static const char *s_op_name(int op)
{
    static const char *const names[] = {"",       "start", "get",   "signal", "input",
                                        "output", "read",  "write", "list",   "stat",
                                        "remove", "mkdir", "move",  "watch"};
    return op > 0 && op < (int)(sizeof names / sizeof names[0]) ? names[op] : "unknown";
}

static void s_sink_final(krt_ctx_t *ctx, s_sink_t *self, const ka_guest_reply_t *f, size_t len)
{
    ka_metric_observe(KA_METRIC_GUEST_CALL, s_op_name(self->op),
                      ka_metric_code_name(ka_err_code(f->err)), ka_metric_now() - self->began);
    self->done = true;
    self->a.cb(self->a.user, f, len);
    krt_exit(ctx, KRT_EXIT_NORMAL);
}

static void s_sink_fail(krt_ctx_t *ctx, s_sink_t *self, int err, const char *message)
{
    ka_frame_fail_t f;
    size_t len = ka_frame_final(&f, err, message);
    s_sink_final(ctx, self, &f.frame, len);
}

/* Sends the call to the sandbox's actor: a pointer to the request when the actor is on this node
 * (the message holds a reference: an upload chunk is not copied again), else a copy. */
static int s_sink_push(krt_ctx_t *ctx, s_sink_t *self)
{
    if (krt_addr_node(self->to) != krt_system_node_id(krt_ctx_system(ctx)))
        return krt_send(ctx, self->to, KA_SBX_GUEST, self->a.req->req, self->a.len);
    atomic_fetch_add(&self->a.req->refs, 1);
    return krt_send_ptr(ctx, self->to, KA_SBX_GUEST_PTR, self->a.req, ka_guest_req_unref);
}

/* Sends the call to its sandbox's actor (direct, when one is registered) or to the manager;
 * a direct send that finds the actor gone goes to the manager. 0, or the manager's send error. */
static int s_sink_send(krt_ctx_t *ctx, s_sink_t *self, bool direct)
{
    krt_system_t *sys = krt_ctx_system(ctx);
    self->to = direct ? s_sandbox_actor(sys, KA_SBX_GUEST, self->a.req->req, self->a.len) : 0;
    self->direct = self->to != KRT_ADDR_NONE;
    if (self->direct) {
        self->monitor = krt_monitor(ctx, self->to);
        if (s_sink_push(ctx, self) == 0)
            return 0;
        krt_demonitor(ctx, self->monitor); /* a DOWN already queued no longer matches */
        self->monitor = 0;
        self->direct = false;
    }
    self->to = krt_whereis(sys, self->a.sandboxes);
    return krt_send(ctx, self->to, KA_SBX_GUEST, self->a.req->req, self->a.len);
}

static void s_sink_bound(krt_ctx_t *ctx, s_sink_t *self, krt_addr_t sandbox)
{
    if (self->sandbox)
        return;
    krt_timer_cancel(ctx, &self->bind);
    self->sandbox = sandbox;
    if (!self->direct || sandbox != self->to) {
        if (self->monitor)
            krt_demonitor(ctx, self->monitor);
        self->monitor = krt_monitor(ctx, sandbox);
    }
    self->direct = false;
    ka_guest_req_unref(self->a.req);
    self->a.req = NULL;
}

/* The monitored actor ended: before it took the call (the call goes to the manager), or while
 * it was open. */
static void s_sink_down(krt_ctx_t *ctx, s_sink_t *self)
{
    self->monitor = 0;
    if (self->direct && !self->sandbox) {
        if (s_sink_send(ctx, self, false))
            s_sink_fail(ctx, self, -ENOTCONN, "the sandbox service is not running; retry");
        return;
    }
    s_sink_fail(ctx, self, -ENOTCONN,
                "the sandbox went away while the call was open (deleted, stopped or "
                "restarting); the call may have had effects");
}

static void s_sink_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_sink_t *self = state;
    if (self->done)
        return;
    bool ptr = msg->type == KA_SBX_GUEST_FRAME_PTR && msg->body;
    if (ptr || (msg->type == KA_SBX_GUEST_FRAME && msg->len >= sizeof(ka_guest_reply_t))) {
        const ka_guest_reply_t *f = msg->body;
        size_t len = ptr ? sizeof *f + f->tail_len : msg->len;
        if (f->final)
            s_sink_final(ctx, self, f, len);
        else
            self->a.cb(self->a.user, f, len);
    } else if (msg->type == KA_SBX_GUEST_BOUND) {
        s_sink_bound(ctx, self, msg->from);
    } else if (msg->type == MSG_STREAM_ACK && msg->len == sizeof(uint64_t) && self->sandbox) {
        ka_sbx_credit_t cr = {.bytes = *(const uint64_t *)msg->body};
        krt_send(ctx, self->sandbox, KA_SBX_GUEST_CREDIT, &cr, sizeof cr);
    } else if (msg->type == KRT_MSG_DOWN && self->monitor &&
               ((const krt_down_t *)msg->body)->ref == self->monitor) {
        s_sink_down(ctx, self);
    } else if (msg->type == MSG_BIND_TIMEOUT) {
        s_sink_fail(ctx, self, -ENOTCONN, "the sandbox did not take the call; retry");
    } else if (msg->type == MSG_STREAM_CANCEL) {
        krt_send(ctx, self->sandbox ? self->sandbox : self->to, KA_SBX_GUEST_CANCEL, &self->a.key,
                 sizeof self->a.key);
        s_sink_fail(ctx, self, -ECANCELED, "the call was cancelled");
    }
}

static int s_sink_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_sink_t *self = state;
    self->a = *(s_sink_args_t *)arg;
    free(arg);
    self->op = self->a.req->req->op;
    self->began = ka_metric_now();
    int rc = s_sink_send(ctx, self, true);
    if (!rc)
        rc = krt_timer_arm(ctx, &self->bind, KA_SVC_BIND_MS, MSG_BIND_TIMEOUT, 0);
    if (rc) { /* terminate does not run after a failed init: the caller learns it here */
        ka_guest_req_unref(self->a.req);
        self->a.req = NULL;
        ka_frame_fail_t f;
        size_t len = ka_frame_final(&f, -ENOTCONN, "the sandbox service is not running; retry");
        self->done = true;
        self->a.cb(self->a.user, &f.frame, len);
    }
    return rc;
}

static void s_sink_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_sink_t *self = state;
    if (!self->done) { /* stopped before its end (node shutting down) */
        ka_frame_fail_t f;
        size_t len = ka_frame_final(&f, -ENOTCONN, "the sandbox service stopped");
        self->done = true;
        self->a.cb(self->a.user, &f.frame, len);
    }
    ka_guest_req_unref(self->a.req);
}

static const krt_behaviour_t s_sink_behaviour = {
    .kind = "guest-stream",
    .state_size = sizeof(s_sink_t),
    .init = s_sink_init,
    .handle = s_sink_handle,
    .terminate = s_sink_terminate,
};

int ka_svc_stream(ka_service_t *svc, ka_guest_req_t **req_p, ka_svc_frame_cb cb, void *user,
                  krt_addr_t *stream)
{
    ka_guest_req_t *req = *req_p;
    *req_p = NULL;
    if (!req)
        return KRT_EINVAL;
    s_sink_args_t *a = calloc(1, sizeof *a);
    if (!a || !(a->req = malloc(sizeof *a->req))) {
        free(a);
        free(req);
        return KRT_ENOMEM;
    }
    atomic_init(&a->req->refs, 1);
    a->req->req = req;
    a->len = sizeof *req + req->tail_len;
    a->cb = cb;
    a->user = user;
    a->sandboxes = svc->sandboxes;
    snprintf(a->key.caller, sizeof a->key.caller, "%s", req->caller);
    snprintf(a->key.id, sizeof a->key.id, "%s", req->sandbox_id);
    krt_addr_t addr = KRT_ADDR_NONE;
    int rc = krt_system_spawn(svc->sys, &s_sink_behaviour, a, NULL, &addr);
    if (rc) { /* init never ran: the arguments are still ours */
        ka_guest_req_unref(a->req);
        free(a);
        return rc;
    }
    if (stream)
        *stream = addr;
    return 0;
}

void ka_svc_stream_cancel(ka_service_t *svc, krt_addr_t stream)
{
    krt_system_send(svc->sys, stream, MSG_STREAM_CANCEL, NULL, 0);
}

void ka_svc_stream_ack(ka_service_t *svc, krt_addr_t stream, uint64_t bytes)
{
    if (bytes)
        krt_system_send(svc->sys, stream, MSG_STREAM_ACK, &bytes, sizeof bytes);
}

void ka_guest_req_unref(void *ref)
{
    ka_guest_req_ref_t *r = ref;
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) {
        free(r->req);
        free(r);
    }
}

ka_guest_req_t *ka_guest_req_new(const char *caller, const char *sandbox_id, int op,
                                 size_t tail_len)
{
    ka_guest_req_t *q = calloc(1, sizeof *q + tail_len);
    if (q) {
        snprintf(q->caller, sizeof q->caller, "%s", caller);
        snprintf(q->sandbox_id, sizeof q->sandbox_id, "%s", sandbox_id);
        q->op = op;
        q->tail_len = (uint32_t)tail_len;
    }
    return q;
}
