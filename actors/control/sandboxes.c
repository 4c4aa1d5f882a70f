/*
 * ka_sandboxes: the sandboxes manager. Creates (idempotent through the store) and registers
 * each sandbox's actor under its name, lists from the store, answers the calls for one sandbox
 * that found no registered actor (forwarded to an actor it knows, else from the store), and
 * recovers this node's live records at start.
 */
#include "sandboxes.h"
#include "checks.h"

#include <ctype.h>
#include <czmq.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"
#include "sandboxes_int.h"
#include "template_doc.h"

#define RECOVER_PAGE 100

/* ---- helpers ------------------------------------------------------------------------------ */

void ka_mgr_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

int ka_check_uuid(const char *s)
{
    static const int dash[] = {8, 13, 18, 23};
    if (!s || strlen(s) != 36)
        return -EINVAL;
    for (int i = 0, d = 0; i < 36; i++) {
        if (d < 4 && i == dash[d]) {
            if (s[i] != '-')
                return -EINVAL;
            d++;
        } else if (!isxdigit((unsigned char)s[i])) {
            return -EINVAL;
        }
    }
    return 0;
}

static void s_fork_free(struct s_fork *f);

void ka_mgr_op_free(s_mgr_t *self, s_op_t *op)
{
    if (!op)
        return;
    if (op->prev)
        op->prev->next = op->next;
    else
        self->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    ka_mgr_unreserve(self, op);
    free(op->body);
    s_fork_free(op->fork);
    free(op);
}

/* A new op answering msg (NULL: nobody to answer) later, owned by self. */
s_op_t *ka_mgr_op_new(s_mgr_t *self, const krt_msg_t *msg)
{
    s_op_t *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    if (msg) {
        op->from = msg->from;
        op->from_ref = msg->ref;
        op->type = msg->type;
        op->kind = msg->kind;
    }
    op->next = self->ops;
    if (self->ops)
        self->ops->prev = op;
    self->ops = op;
    return op;
}

void ka_mgr_fail_op(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, int err, const char *message)
{
    ka_fail(ctx, op->from, op->from_ref, op->type, err, "%s", message);
    ka_mgr_op_free(self, op);
}

/* Sends a request for op; its reply (or failure) runs `next` with op as user. */
void ka_mgr_ask(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, krt_reply_fn next, krt_addr_t to,
                uint32_t type, const void *body, size_t len, int timeout_ms)
{
    if (krt_request(ctx, to, type, body, len, timeout_ms, next, op))
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, "out of memory; retry");
}

void ka_mgr_ask_receipt(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, krt_reply_fn next,
                        const char *creator, const char *request_id)
{
    ka_store_receipt_key_t k;
    memset(&k, 0, sizeof k);
    ka_mgr_copy(k.creator, sizeof k.creator, creator);
    ka_mgr_copy(k.request_id, sizeof k.request_id, request_id);
    ka_mgr_ask(ctx, self, op, next, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_RECEIPT, &k,
               sizeof k, STORE_TIMEOUT_MS);
}

/* Why a request to a control-plane service failed (err != 0): the caller gets UNAVAILABLE. */
static const char *s_unavailable_why(int err)
{
    return err == KRT_ETIMEDOUT ? "a control-plane service did not answer in time; retry"
                                : "a control-plane service is not running; retry";
}

/* Common head of a step: the op if its service answered with success, else NULL after failing
 * the op with the service's error reply, or UNAVAILABLE when it did not answer. */
static s_op_t *s_answered(krt_ctx_t *ctx, s_mgr_t *self, void *user, int err, const krt_msg_t *msg)
{
    s_op_t *op = user;
    const char *why;
    err = ka_reply_outcome(err, msg, 0, &why);
    if (!err)
        return op;
    ka_mgr_fail_op(ctx, self, op, why ? err : KA_EUNAVAIL, why ? why : s_unavailable_why(err));
    return NULL;
}

/* Common head of a store step: the store's reply to op (at least size bytes), or NULL after
 * failing op with the store's code and message (KA_MSG_NOT_FOUND for a record not there). */
static const void *s_store_reply(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, int err,
                                 const krt_msg_t *msg, size_t size)
{
    const char *why;
    int serr = ka_store_outcome(err, msg, size, &why);
    if (!serr)
        return msg->body;
    ka_mgr_fail_op(ctx, self, op, serr, serr == KA_STORE_ENOTFOUND ? KA_MSG_NOT_FOUND : why);
    return NULL;
}

static krt_addr_t s_live(s_mgr_t *self, const char *id)
{
    s_slot_t *a = zhashx_lookup(self->live, id);
    return a ? a->addr : KRT_ADDR_NONE;
}

/* Registers a new sandbox actor under its name. A holder still there is an actor of the same
 * id that is stopping (the previous manager's, parking its compute): the name moves to the new
 * one, and the old one's exit releases only its own names. Without a name (out of memory) the
 * actor is still reached, through this manager. */
static void s_register(krt_ctx_t *ctx, const char *id, krt_addr_t addr)
{
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, id);
    krt_system_t *sys = krt_ctx_system(ctx);
    int rc = krt_register(sys, name, addr);
    if (rc == KRT_EEXIST) {
        krt_unregister(sys, name);
        rc = krt_register(sys, name, addr);
    }
    if (rc && rc != KRT_ENOACTOR) /* ENOACTOR: its init failed, DOWN follows */
        krt_log_actor(ctx, KRT_LOG_WARN, "sandbox_register_failed", "sandbox=%s err=%d", id, rc);
}

/* Spawns, maps and registers a sandbox's actor. */
static int s_mgr_spawn(krt_ctx_t *ctx, s_mgr_t *self, const ka_sandbox_args_t *args)
{
    krt_addr_t addr;
    uint64_t mref;
    /* linked: a sandbox actor never outlives its manager (a new manager would adopt the same
     * record while the old actor still held its compute); monitored: DOWN keeps the map */
    krt_spawn_opts_t opts = {
        .name = args->record.id, .link = true, .monitor = true, .monitor_ref = &mref};
    ka_sandbox_args_t *copy = malloc(sizeof *copy); /* init runs later: it takes this copy */
    if (!copy)
        return KRT_ENOMEM;
    *copy = *args;
    copy->member = self->a.member;
    int rc = krt_spawn(ctx, &ka_sandbox_behaviour, copy, &opts, &addr);
    if (rc) {
        free(copy);
        return rc;
    }
    rc = ka_mgr_slot_add(self, args->record.id, addr, args->runtime.pool);
    if (rc)
        return rc;
    s_register(ctx, args->record.id, addr);
    return 0;
}

/* Hands a call to a live sandbox's actor, which answers the original requester. */
static void s_forward(krt_ctx_t *ctx, krt_addr_t actor, krt_addr_t from, uint64_t ref,
                      uint32_t type, const void *body, size_t len)
{
    ka_sbx_forward_t *f = malloc(sizeof *f + len);
    if (!f) {
        ka_fail(ctx, from, ref, type, KA_EUNAVAIL, "out of memory; retry");
        return;
    }
    f->from = from;
    f->ref = ref;
    f->type = type;
    f->len = len;
    memcpy(f->body, body, len);
    if (krt_send(ctx, actor, KA_SBX_FORWARD_, f, sizeof *f + len))
        ka_fail(ctx, from, ref, type, KA_EUNAVAIL, "the sandbox is restarting; retry");
    free(f);
}

/* ---- create ------------------------------------------------------------------------------- */

/* The steps: each is the callback of the request the previous one made. */
static void s_on_resolved(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_admit(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, bool read_receipt);
static void s_on_receipt(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_record(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op);
static void s_on_inserted(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_read(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_not_live(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_routed(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);

static int s_check_create(const s_mgr_t *self, const ka_sbx_create_t *c, char *why, size_t cap)
{
    if (!memchr(c->caller, 0, sizeof c->caller) ||
        !memchr(c->request_id, 0, sizeof c->request_id) || !memchr(c->name, 0, sizeof c->name) ||
        !memchr(c->template_namespace, 0, sizeof c->template_namespace) ||
        !memchr(c->template_name, 0, sizeof c->template_name))
        return snprintf(why, cap, "malformed create request"), -EINVAL;
    if (!c->caller[0])
        return snprintf(why, cap, "creating a sandbox requires an authenticated owner"), -EACCES;
    const char *bad = ka_check_request_id(c->request_id);
    if (!bad)
        bad = ka_check_sandbox_name(c->name);
    if (bad)
        return snprintf(why, cap, "%s", bad), -EINVAL;
    if (ka_check_dns_label(c->template_namespace))
        return snprintf(why, cap,
                        "sandbox_template.namespace: must be a DNS label of 1-63 characters"),
               -EINVAL;
    if (ka_check_dns_subdomain(c->template_name))
        return snprintf(why, cap,
                        "sandbox_template.name: must be a DNS subdomain of 1-253 characters"),
               -EINVAL;
    if (c->ttl_ms != 0 && (c->ttl_ms < 1000 || c->ttl_ms > self->a.max_ttl_ms))
        return snprintf(why, cap, "ttl must be between 1s and %llds",
                        (long long)self->a.max_ttl_ms / 1000),
               -EINVAL;
    return 0;
}

static void s_create(krt_ctx_t *ctx, s_mgr_t *self, const krt_msg_t *msg)
{
    s_op_t *op = ka_mgr_op_new(self, msg);
    if (!op)
        return;
    char why[KA_MSG_LEN];
    if (msg->len != sizeof op->cr) {
        ka_mgr_fail_op(ctx, self, op, -EINVAL, "malformed create request");
        return;
    }
    memcpy(&op->cr, msg->body, sizeof op->cr);
    int code = s_check_create(self, &op->cr, why, sizeof why);
    if (code) {
        ka_mgr_fail_op(ctx, self, op, code, why);
        return;
    }
    if (self->a.member && !ka_membership_member(self->a.member)) {
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL,
                       "this node is not a member of the cluster right now (its lease lapsed); "
                       "retry, or use another node");
        return;
    }
    if (self->a.member && !op->cr.placed && ka_membership_others(self->a.member))
        ka_mgr_place(ctx, self, op);
    else
        ka_mgr_create_here(ctx, self, op);
}

void ka_mgr_create_here(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    ka_tpl_key_t k;
    memset(&k, 0, sizeof k);
    ka_mgr_copy(k.namespace_, sizeof k.namespace_, op->cr.template_namespace);
    ka_mgr_copy(k.name, sizeof k.name, op->cr.template_name);
    ka_mgr_ask(ctx, self, op, s_on_resolved, ka_peer(ctx, self->a.templates), KA_TPL_RESOLVE, &k,
               sizeof k, RESOLVE_TIMEOUT_MS);
}

static void s_on_resolved(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = s_answered(ctx, self, user, err, msg);
    if (!op)
        return;
    const ka_tpl_resolved_t *res = msg->body;
    if (msg->len != sizeof *res) {
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, KA_MSG_NO_RUNTIME);
        return;
    }
    op->res = *res;
    s_admit(ctx, self, op, true);
}

/* Admits the create into its pool's room on this node (sandboxes_cap.c), then records it. A
 * full pool records nothing: the create's receipt is read (read_receipt) and a replay answered
 * from it, as the store would; a request id never used is refused RESOURCE_EXHAUSTED and stays
 * unused, so a retry once there is room goes ahead. */
static void s_admit(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, bool read_receipt)
{
    char why[KA_MSG_LEN];
    int rc = ka_mgr_reserve(self, op, 1, why, sizeof why);
    if (rc == 0) {
        s_record(ctx, self, op);
        return;
    }
    if (!read_receipt) {
        krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_refused", "creator=%s request_id=%s msg=\"%s\"",
                      op->cr.caller, op->cr.request_id, why);
        if (!ka_mgr_place_again(ctx, self, op, why)) /* placed here: another node may have room */
            ka_mgr_fail_op(ctx, self, op, rc, why);
        return;
    }
    ka_mgr_ask_receipt(ctx, self, op, s_on_receipt, op->cr.caller, op->cr.request_id);
}

/* A full pool's create: a replay is answered as the insert would (its sandbox, even deleted);
 * with no receipt it is admitted if room came meanwhile, else refused. */
static void s_on_receipt(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_op_t *op = user;
    if (ka_store_outcome(err, msg, sizeof(ka_store_sandbox_reply_t), NULL) == KA_STORE_ENOTFOUND) {
        s_admit(ctx, state, op, false);
        return;
    }
    ka_mgr_on_receipt(ctx, state, user, err, msg);
}

void ka_mgr_on_receipt(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_op_t *op = user;
    op->warm = -1; /* a replay claims no warm sandbox */
    s_on_inserted(ctx, state, user, err, msg);
}

/* Records the admitted create (a warm sandbox claimed if its pool has one ready). */
static void s_record(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    const ka_tpl_resolved_t *res = &op->res;
    ka_store_sandbox_create_t c;
    memset(&c, 0, sizeof c);
    ka_mgr_copy(c.creator, sizeof c.creator, op->cr.caller);
    ka_mgr_copy(c.request_id, sizeof c.request_id, op->cr.request_id);
    ka_mgr_copy(c.name, sizeof c.name, op->cr.name);
    ka_mgr_copy(c.template_namespace, sizeof c.template_namespace, op->cr.template_namespace);
    ka_mgr_copy(c.template_name, sizeof c.template_name, op->cr.template_name);
    ka_mgr_copy(c.revision, sizeof c.revision, res->revision);
    ka_mgr_copy(c.node, sizeof c.node, self->a.node);
    c.ttl_ms = op->cr.ttl_ms ? op->cr.ttl_ms : self->a.default_ttl_ms;
    op->warm = ka_pool_take(ctx, self->pool, op->cr.template_namespace, op->cr.template_name, res,
                            &op->claim);
    if (op->warm == 1) { /* one commit writes it READY under the warm sandbox's id */
        ka_mgr_copy(c.id, sizeof c.id, op->claim.id);
        c.ready = 1;
    }
    ka_mgr_ask(ctx, self, op, s_on_inserted, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_CREATE,
               &c, sizeof c, STORE_TIMEOUT_MS);
}

static void s_on_inserted(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const char *why;
    int serr = ka_store_outcome(err, msg, sizeof(ka_store_sandbox_reply_t), &why);
    const ka_store_sandbox_reply_t *r = serr ? NULL : msg->body;
    if (op->warm == 1 && (!r || !r->created))
        ka_pool_release(ctx, self->pool, &op->claim, r && !r->created);
    if (serr) {
        ka_mgr_fail_op(ctx, self, op, serr, why);
        return;
    }
    krt_addr_t actor = r->created ? KRT_ADDR_NONE : s_live(self, r->sandbox.id);
    if (actor) { /* idempotent replay of a live sandbox: its actor knows more than the row */
        s_forward(ctx, actor, op->from, op->from_ref, op->type, &op->cr, sizeof op->cr);
        ka_mgr_op_free(self, op);
        return;
    }
    if (!r->created) { /* idempotent replay: the winning insert, even after delete */
        ka_sbx_reply_t out;
        memset(&out, 0, sizeof out);
        out.sandbox = r->sandbox;
        krt_reply_to(ctx, op->from, op->from_ref, op->type, &out, sizeof out);
        ka_mgr_op_free(self, op);
        return;
    }
    bool warm = op->warm == 1;
    if (warm)
        ka_pool_bound(self->pool, &op->claim);
    else if (op->warm == 0)
        ka_pool_missed(self->pool);
    ka_sandbox_args_t a = {.mode = warm ? KA_SBX_WARM : KA_SBX_BOOT,
                           .record = r->sandbox,
                           .runtime = op->res,
                           .store = self->a.store,
                           .templates = self->a.templates,
                           .driver = self->a.driver,
                           .reply_to = op->from,
                           .reply_ref = op->from_ref,
                           .guest_idle_ms = self->a.guest_idle_ms,
                           .compute = warm ? op->claim.sb : NULL};
    if (s_mgr_spawn(ctx, self, &a)) {
        ka_pool_release(ctx, self->pool, &op->claim, false);
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, "cannot start the sandbox actor");
        return;
    }
    op->claim.sb = NULL; /* the sandbox actor's now */
    krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_created",
                  "sandbox=%s creator=%s template=%s/%s warm=%d", r->sandbox.id, r->sandbox.creator,
                  r->sandbox.template_namespace, r->sandbox.template_name, warm);
    ka_mgr_op_free(self, op); /* the sandbox actor answers the creator */
}

/* ---- reads -------------------------------------------------------------------------------- */

static void s_list(krt_ctx_t *ctx, s_mgr_t *self, const krt_msg_t *msg)
{
    s_op_t *op = ka_mgr_op_new(self, msg);
    const ka_sbx_list_req_t *q = msg->body;
    if (!op)
        return;
    if (msg->len != sizeof *q || !memchr(q->caller, 0, sizeof q->caller) || !q->caller[0] ||
        !memchr(q->template_namespace, 0, sizeof q->template_namespace) ||
        !memchr(q->template_name, 0, sizeof q->template_name)) {
        ka_mgr_fail_op(ctx, self, op, -EINVAL, "malformed list request");
        return;
    }
    if (q->limit < 0 || q->limit > KA_STORE_LIST_MAX || q->offset < 0) {
        ka_mgr_fail_op(ctx, self, op, -EINVAL, "page.limit must be between 0 and 100");
        return;
    }
    ka_store_sandbox_query_t sq;
    memset(&sq, 0, sizeof sq);
    ka_mgr_copy(sq.creator, sizeof sq.creator, q->caller);
    ka_mgr_copy(sq.template_namespace, sizeof sq.template_namespace, q->template_namespace);
    ka_mgr_copy(sq.template_name, sizeof sq.template_name, q->template_name);
    sq.limit = q->limit;
    sq.offset = q->offset;
    ka_mgr_ask(ctx, self, op, s_on_read, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_LIST, &sq,
               sizeof sq, STORE_TIMEOUT_MS);
}

void ka_sbx_answer_read(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int err,
                        const krt_msg_t *msg, bool paused)
{
    const char *why;
    int serr = ka_store_outcome(err, msg, sizeof(ka_store_sandbox_reply_t), &why);
    if (serr) {
        ka_reply_fail(ctx, to, ref, serr, serr == KA_STORE_ENOTFOUND ? KA_MSG_NOT_FOUND : why);
        return;
    }
    ka_sbx_reply_t out;
    memset(&out, 0, sizeof out);
    out.sandbox = ((const ka_store_sandbox_reply_t *)msg->body)->sandbox;
    out.paused = paused && out.sandbox.state == KA_STATE_READY;
    krt_reply_to(ctx, to, ref, type, &out, sizeof out);
}

/* A store read answered: a list as a ka_sbx_list_t, a record as a ka_sbx_reply_t. */
static void s_on_read(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    if (op->type != KA_SBX_LIST) {
        ka_sbx_answer_read(ctx, op->from, op->from_ref, op->type, err, msg, false);
        ka_mgr_op_free(self, op);
        return;
    }
    const ka_store_sandbox_list_t *l = s_store_reply(ctx, self, op, err, msg, sizeof *l);
    if (!l)
        return;
    if (l->count > (msg->len - sizeof *l) / sizeof l->items[0]) {
        ka_mgr_fail_op(ctx, self, op, -EIO, "the store sent a short list");
        return;
    }
    size_t len = sizeof(ka_sbx_list_t) + l->count * sizeof l->items[0];
    ka_sbx_list_t *out = malloc(len);
    if (!out) {
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, "out of memory; retry");
        return;
    }
    out->count = l->count;
    out->more = l->more;
    memcpy(out->items, l->items, l->count * sizeof l->items[0]);
    krt_reply_to(ctx, op->from, op->from_ref, op->type, out, len);
    free(out);
    ka_mgr_op_free(self, op);
}

/* ---- calls for one sandbox ---------------------------------------------------------------- */

const char *ka_sbx_target(uint32_t type, const void *body, size_t len, const char **caller)
{
    if (type == KA_SBX_GUEST) {
        const ka_guest_req_t *q = body;
        if (len < sizeof *q || !memchr(q->sandbox_id, 0, sizeof q->sandbox_id) ||
            !memchr(q->caller, 0, sizeof q->caller))
            return NULL;
        *caller = q->caller;
        return q->sandbox_id;
    }
    const ka_sbx_key_t *k = body;
    if (len != sizeof *k || !memchr(k->id, 0, sizeof k->id) ||
        !memchr(k->caller, 0, sizeof k->caller))
        return NULL;
    *caller = k->caller;
    return k->id;
}

/* A call for one sandbox that found no actor by name: the checks every such call gets (the
 * service sends only calls that pass them to a sandbox's actor), then the actor this manager
 * knows (it may have spawned it after the caller looked), else the record. */
static void s_route(krt_ctx_t *ctx, s_mgr_t *self, const krt_msg_t *msg)
{
    const char *caller = NULL;
    const char *id = ka_sbx_target(msg->type, msg->body, msg->len, &caller);
    if (!id) {
        ka_fail(ctx, msg->from, msg->ref, msg->type, -EINVAL, "malformed request");
        return;
    }
    if (!caller[0]) { /* the store reads "" as any creator: never let that through */
        ka_fail(ctx, msg->from, msg->ref, msg->type, -EACCES, "authentication required");
        return;
    }
    if (ka_check_uuid(id)) {
        ka_fail(ctx, msg->from, msg->ref, msg->type, -EINVAL, KA_MSG_NOT_UUID);
        return;
    }
    krt_addr_t actor = s_live(self, id);
    if (actor) {
        s_forward(ctx, actor, msg->from, msg->ref, msg->type, msg->body, msg->len);
        return;
    }
    if (msg->type == KA_SBX_GUEST_CANCEL)
        return;
    s_op_t *op = ka_mgr_op_new(self, msg);
    if (!op || !(op->body = malloc(msg->len))) {
        ka_mgr_op_free(self, op);
        ka_fail(ctx, msg->from, msg->ref, msg->type, KA_EUNAVAIL, "out of memory; retry");
        return;
    }
    memcpy(op->body, msg->body, msg->len);
    op->len = msg->len;
    if (!ka_mgr_relay_known(ctx, self, op, id))
        ka_mgr_route_read(ctx, self, op, id, caller);
}

void ka_mgr_route_read(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const char *id,
                       const char *caller)
{
    ka_store_sandbox_key_t sk;
    memset(&sk, 0, sizeof sk);
    ka_mgr_copy(sk.id, sizeof sk.id, id);
    ka_mgr_copy(sk.creator, sizeof sk.creator, caller);
    ka_mgr_ask(ctx, self, op, s_on_routed, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_GET, &sk,
               sizeof sk, STORE_TIMEOUT_MS);
}

/* The record of a call no actor here holds: another node's sandbox goes there; else a get is
 * answered from the record and the rest as the record allows. */
static void s_on_routed(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    const ka_store_sandbox_reply_t *r =
        ka_store_outcome(err, msg, sizeof *r, NULL) ? NULL : msg->body;
    if (r && ka_mgr_relay_owner(ctx, self, user, &r->sandbox))
        return;
    (((s_op_t *)user)->type == KA_SBX_GET ? s_on_read : s_on_not_live)(ctx, state, user, err, msg);
}

/* No actor holds this sandbox: it is deleted, failed elsewhere, or unknown. */
static void s_on_not_live(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const ka_store_sandbox_reply_t *r = s_store_reply(ctx, self, op, err, msg, sizeof *r);
    if (!r)
        return;
    const ka_store_sandbox_t *sb = &r->sandbox;
    if (op->type == KA_SBX_GUEST) {
        ka_mgr_fail_op(ctx, self, op, -EBUSY, KA_MSG_NOT_READY);
        return;
    }
    if (op->type == KA_SBX_DELETE) {
        if (sb->deleted_ms) { /* already deleted: the tombstone */
            ka_sbx_reply_t out;
            memset(&out, 0, sizeof out);
            out.sandbox = *sb;
            krt_reply_to(ctx, op->from, op->from_ref, op->type, &out, sizeof out);
            ka_mgr_op_free(self, op);
            return;
        }
        ka_store_sandbox_key_t sk;
        memset(&sk, 0, sizeof sk);
        ka_mgr_copy(sk.id, sizeof sk.id, sb->id);
        ka_mgr_ask(ctx, self, op, s_on_read, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_DELETE,
                   &sk, sizeof sk, STORE_TIMEOUT_MS);
        return;
    }
    char why[KA_MSG_LEN];
    snprintf(why, sizeof why, "cannot %s a sandbox in state %s",
             op->type == KA_SBX_SUSPEND  ? "suspend"
             : op->type == KA_SBX_RESUME ? "resume"
             : op->type == KA_SBX_PAUSE  ? "pause"
                                         : "unpause",
             ka_state_name(sb->state));
    ka_mgr_fail_op(ctx, self, op, -EBUSY, why);
}

/* ---- fork --------------------------------------------------------------------------------- */

#define FORK_COPY_TIMEOUT_MS (11 * 60 * 1000) /* the source's copy job ends within 10 minutes */
#define FORK_JOIN_TIMEOUT_MS (2 * 60 * 1000)  /* a fork's boot, READY or FAILED */
_Static_assert(KA_FORK_MAX == 16, "the count message says 16");

/* A fork in flight: the steps fill it fork by fork. */
typedef struct s_fork {
    ka_sbx_fork_t q;
    ka_store_sandbox_t source;
    uint32_t i;                /* the fork a step is at */
    bool created[KA_FORK_MAX]; /* recorded by this call (not a replay) */
    ka_sbx_create_t join;      /* a fork's create, as its actor's creator sees it */
    ka_sbx_list_t *out;        /* the answer: count records */
} s_fork_t;

static void s_fork_free(s_fork_t *f)
{
    if (f)
        free(f->out);
    free(f);
}

static void s_on_fork_source(krt_ctx_t *ctx, void *state, void *user, int err,
                             const krt_msg_t *msg);
static void s_on_fork_runtime(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg);
static void s_on_fork_recorded(krt_ctx_t *ctx, void *state, void *user, int err,
                               const krt_msg_t *msg);
static void s_on_fork_copied(krt_ctx_t *ctx, void *state, void *user, int err,
                             const krt_msg_t *msg);
static void s_on_fork_joined(krt_ctx_t *ctx, void *state, void *user, int err,
                             const krt_msg_t *msg);
static void s_fork_admit(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, bool read_receipt);
static void s_on_fork_receipt(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg);

/* The request id fork i of the caller's request id is recorded under: the caller's own when
 * it fits, else its hash (FNV-1a, two seeds), so a replay finds the same records. */
static void s_fork_reqid(const char *rid, uint32_t i, char *out, size_t cap)
{
    if (snprintf(out, cap, "fork/%u/%s", i, rid) < (int)cap)
        return;
    uint64_t h[2] = {1469598103934665603ull, 1099511628211ull * 31};
    for (const unsigned char *p = (const unsigned char *)rid; *p; p++)
        for (int k = 0; k < 2; k++)
            h[k] = (h[k] ^ *p) * 1099511628211ull;
    snprintf(out, cap, "fork/%u/#%016llx%016llx", i, (unsigned long long)h[0],
             (unsigned long long)h[1]);
}

static const char *s_check_fork(const s_mgr_t *self, const ka_sbx_fork_t *q, int *code)
{
    *code = -EINVAL;
    if (!memchr(q->caller, 0, sizeof q->caller) || !memchr(q->id, 0, sizeof q->id) ||
        !memchr(q->request_id, 0, sizeof q->request_id))
        return "malformed fork request";
    if (!q->caller[0])
        return *code = -EACCES, "forking a sandbox requires an authenticated owner";
    if (ka_check_uuid(q->id))
        return KA_MSG_NOT_UUID;
    const char *bad = ka_check_request_id(q->request_id);
    if (bad)
        return bad;
    if (q->count < 1 || q->count > KA_FORK_MAX)
        return "count must be between 1 and 16";
    if (q->ttl_ms != 0 && (q->ttl_ms < 1000 || q->ttl_ms > self->a.max_ttl_ms))
        return "ttl must be between 1s and the node's maximum";
    *code = 0;
    return NULL;
}

static void s_fork(krt_ctx_t *ctx, s_mgr_t *self, const krt_msg_t *msg)
{
    s_op_t *op = ka_mgr_op_new(self, msg);
    if (!op)
        return;
    int code = -EINVAL;
    const char *why = "malformed fork request";
    if (msg->len == sizeof(ka_sbx_fork_t))
        why = s_check_fork(self, msg->body, &code);
    if (why) {
        ka_mgr_fail_op(ctx, self, op, code, why);
        return;
    }
    s_fork_t *f = op->fork = calloc(1, sizeof *f);
    if (!f || !(f->out = calloc(1, sizeof *f->out + KA_FORK_MAX * sizeof f->out->items[0]))) {
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, "out of memory; retry");
        return;
    }
    memcpy(&f->q, msg->body, sizeof f->q);
    ka_store_sandbox_key_t sk; /* the owner check: another caller's source is not found */
    memset(&sk, 0, sizeof sk);
    ka_mgr_copy(sk.id, sizeof sk.id, f->q.id);
    ka_mgr_copy(sk.creator, sizeof sk.creator, f->q.caller);
    ka_mgr_ask(ctx, self, op, s_on_fork_source, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_GET,
               &sk, sizeof sk, STORE_TIMEOUT_MS);
}

static void s_on_fork_source(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const ka_store_sandbox_reply_t *r = s_store_reply(ctx, self, op, err, msg, sizeof *r);
    if (!r)
        return;
    op->fork->source = r->sandbox; /* deleted: a replay still finds its forks */
    if (self->a.member && (op->body = malloc(sizeof op->fork->q))) { /* another node's source */
        memcpy(op->body, &op->fork->q, sizeof op->fork->q);          /* is forked there */
        op->len = sizeof op->fork->q;
        if (ka_mgr_relay_owner(ctx, self, op, &r->sandbox))
            return;
    }
    ka_tpl_runtime_req_t rr;
    memset(&rr, 0, sizeof rr);
    ka_mgr_copy(rr.revision, sizeof rr.revision, r->sandbox.revision);
    ka_mgr_ask(ctx, self, op, s_on_fork_runtime, ka_peer(ctx, self->a.templates), KA_TPL_RUNTIME,
               &rr, sizeof rr, RESOLVE_TIMEOUT_MS);
}

/* Records fork f->i (idempotent on its derived request id). */
static void s_fork_record(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    s_fork_t *f = op->fork;
    const ka_store_sandbox_t *src = &f->source;
    ka_store_sandbox_create_t c;
    memset(&c, 0, sizeof c);
    ka_mgr_copy(c.creator, sizeof c.creator, f->q.caller);
    s_fork_reqid(f->q.request_id, f->i, c.request_id, sizeof c.request_id);
    ka_mgr_copy(c.template_namespace, sizeof c.template_namespace, src->template_namespace);
    ka_mgr_copy(c.template_name, sizeof c.template_name, src->template_name);
    ka_mgr_copy(c.revision, sizeof c.revision, src->revision);
    ka_mgr_copy(c.node, sizeof c.node, self->a.node);
    c.ttl_ms = f->q.ttl_ms ? f->q.ttl_ms : self->a.default_ttl_ms;
    ka_mgr_ask(ctx, self, op, s_on_fork_recorded, ka_peer(ctx, self->a.store),
               KA_STORE_SANDBOX_CREATE, &c, sizeof c, STORE_TIMEOUT_MS);
}

static void s_on_fork_runtime(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const char *why;
    err = ka_reply_outcome(err, msg, 0, &why);
    if (err && !why) {
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, s_unavailable_why(err));
        return;
    }
    const ka_tpl_resolved_t *res = msg->body;
    if (err || msg->len != sizeof *res) {
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, KA_MSG_NO_RUNTIME);
        return;
    }
    op->res = *res;
    s_fork_admit(ctx, self, op, true);
}

/* Admits the fork into its pool's room on this node for all of its forks at once (reserved in
 * the manager's turn, so creates and forks together never overshoot), then records them. A pool
 * short of room records nothing: a replay of a fork that recorded all of its forks (the last
 * one's receipt is there; they are recorded in order) is answered as it is today, the store
 * finding each fork; anything else is refused RESOURCE_EXHAUSTED with the room there is. */
static void s_fork_admit(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, bool read_receipt)
{
    s_fork_t *f = op->fork;
    char why[KA_MSG_LEN];
    int rc = ka_mgr_reserve(self, op, (uint32_t)f->q.count, why, sizeof why);
    if (rc == 0) {
        s_fork_record(ctx, self, op);
        return;
    }
    if (!read_receipt) {
        krt_log_actor(ctx, KRT_LOG_INFO, "fork_refused",
                      "creator=%s request_id=%s source=%s msg=\"%s\"", f->q.caller, f->q.request_id,
                      f->q.id, why);
        ka_mgr_fail_op(ctx, self, op, rc, why);
        return;
    }
    char last[KA_STORE_REQID_LEN];
    s_fork_reqid(f->q.request_id, (uint32_t)f->q.count - 1, last, sizeof last);
    ka_mgr_ask_receipt(ctx, self, op, s_on_fork_receipt, f->q.caller, last);
}

/* A fork short of room: with its last fork's receipt it is a replay (every fork recorded, none
 * to create: it needs no room); without, admitted if room came meanwhile, else refused. */
static void s_on_fork_receipt(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const char *why;
    int serr = ka_store_outcome(err, msg, sizeof(ka_store_sandbox_reply_t), &why);
    if (serr == KA_STORE_ENOTFOUND)
        s_fork_admit(ctx, self, op, false);
    else if (serr)
        ka_mgr_fail_op(ctx, self, op, serr, why);
    else
        s_fork_record(ctx, self, op);
}

static void s_forget_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    (void)ctx, (void)state, (void)user, (void)msg;
    if (err)
        krt_log(KRT_LOG_WARN, "sandboxes", "fork_forget_failed", "err=%d", err);
}

/* The fork failed: the records this call made become tombstones (their copies are gone). */
static void s_fork_fail(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, int code, const char *why)
{
    s_fork_t *f = op->fork;
    for (uint32_t i = 0; i < (uint32_t)f->q.count; i++) {
        if (!f->created[i])
            continue;
        ka_store_sandbox_key_t sk;
        memset(&sk, 0, sizeof sk);
        ka_mgr_copy(sk.id, sizeof sk.id, f->out->items[i].id);
        krt_request(ctx, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_DELETE, &sk, sizeof sk,
                    STORE_TIMEOUT_MS, s_forget_done, NULL);
    }
    ka_mgr_fail_op(ctx, self, op, code, why);
}

/* Every fork is recorded: the source's actor copies itself for the new ones. */
static void s_fork_copy(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    s_fork_t *f = op->fork;
    ka_sbx_fork_copy_t c;
    memset(&c, 0, sizeof c);
    ka_mgr_copy(c.caller, sizeof c.caller, f->q.caller);
    for (uint32_t i = 0; i < (uint32_t)f->q.count; i++)
        if (f->created[i])
            ka_mgr_copy(c.ids[c.count++], sizeof c.ids[0], f->out->items[i].id);
    krt_addr_t src = s_live(self, f->q.id);
    if (!src && f->source.deleted_ms) {
        s_fork_fail(ctx, self, op, -ENOENT, KA_MSG_NOT_FOUND);
    } else if (!src) {
        char why[KA_MSG_LEN];
        snprintf(why, sizeof why, "cannot fork a sandbox in state %s",
                 ka_state_name(f->source.state));
        s_fork_fail(ctx, self, op, -EBUSY, why);
    } else if (krt_request(ctx, src, KA_SBX_FORK_COPY_, &c, sizeof c, FORK_COPY_TIMEOUT_MS,
                           s_on_fork_copied, op)) {
        s_fork_fail(ctx, self, op, KA_EUNAVAIL, "out of memory; retry");
    }
}

/* Waits for fork f->i's actor to answer its create (READY or FAILED); a fork without an actor
 * answers from its record. */
static void s_fork_join(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    s_fork_t *f = op->fork;
    for (; f->i < (uint32_t)f->q.count; f->i++) {
        krt_addr_t actor = s_live(self, f->out->items[f->i].id);
        if (!actor)
            continue;
        memset(&f->join, 0, sizeof f->join);
        ka_mgr_copy(f->join.caller, sizeof f->join.caller, f->q.caller);
        ka_mgr_copy(f->join.request_id, sizeof f->join.request_id, f->out->items[f->i].request_id);
        ka_mgr_ask(ctx, self, op, s_on_fork_joined, actor, KA_SBX_CREATE, &f->join, sizeof f->join,
                   FORK_JOIN_TIMEOUT_MS);
        return;
    }
    f->out->count = (uint32_t)f->q.count;
    krt_reply_to(ctx, op->from, op->from_ref, op->type, f->out,
                 sizeof *f->out + f->out->count * sizeof f->out->items[0]);
    ka_mgr_op_free(self, op);
}

static void s_on_fork_recorded(krt_ctx_t *ctx, void *state, void *user, int err,
                               const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    s_fork_t *f = op->fork;
    const char *why;
    int serr = ka_store_outcome(err, msg, sizeof(ka_store_sandbox_reply_t), &why);
    if (serr) {
        s_fork_fail(ctx, self, op, serr, why);
        return;
    }
    const ka_store_sandbox_reply_t *r = msg->body;
    f->out->items[f->i] = r->sandbox;
    f->created[f->i] = r->created != 0;
    if (++f->i < (uint32_t)f->q.count) {
        s_fork_record(ctx, self, op);
        return;
    }
    bool any = false;
    for (uint32_t i = 0; i < f->i; i++)
        any |= f->created[i];
    f->i = 0;
    if (any) {
        s_fork_copy(ctx, self, op);
    } else { /* a replay: the same forks, as they are now; it needs no room */
        ka_mgr_unreserve(self, op);
        s_fork_join(ctx, self, op);
    }
}

static void s_on_fork_copied(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    s_fork_t *f = op->fork;
    const char *why;
    err = ka_reply_outcome(err, msg, sizeof(ka_sbx_reply_t), &why);
    if (err) {
        s_fork_fail(ctx, self, op, why ? err : KA_EUNAVAIL,
                    why ? why : "the source sandbox did not finish the copy");
        return;
    }
    ka_mgr_unreserve(self, op); /* the forks' actors count from here, in this same turn */
    for (uint32_t i = 0; i < (uint32_t)f->q.count; i++) {
        if (!f->created[i])
            continue;
        ka_sandbox_args_t a = {.mode = KA_SBX_BOOT,
                               .record = f->out->items[i],
                               .runtime = op->res,
                               .store = self->a.store,
                               .templates = self->a.templates,
                               .driver = self->a.driver,
                               .guest_idle_ms = self->a.guest_idle_ms,
                               .fork = true};
        if (s_mgr_spawn(ctx, self, &a)) /* its record stays CREATING: recovery fails it */
            krt_log_actor(ctx, KRT_LOG_WARN, "fork_spawn_failed", "sandbox=%s", a.record.id);
        else
            krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_forked", "sandbox=%s source=%s", a.record.id,
                          f->q.id);
    }
    s_fork_join(ctx, self, op);
}

static void s_on_fork_joined(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    s_fork_t *f = op->fork;
    const ka_sbx_reply_t *r = msg ? msg->body : NULL;
    if (ka_reply_unanswered(err)) { /* its actor did not answer */
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, s_unavailable_why(err));
        return;
    }
    if (!err && msg->len == sizeof *r)
        f->out->items[f->i] = r->sandbox;
    f->i++;
    s_fork_join(ctx, self, op);
}

/* ---- recovery at start -------------------------------------------------------------------- */

static void s_on_recover(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);

void ka_mgr_adopt(krt_ctx_t *ctx, s_mgr_t *self, const ka_store_sandbox_t *sb, const char *event)
{
    ka_sandbox_args_t a = {.mode = KA_SBX_ADOPT,
                           .record = *sb,
                           .store = self->a.store,
                           .templates = self->a.templates,
                           .driver = self->a.driver,
                           .guest_idle_ms = self->a.guest_idle_ms};
    if (s_mgr_spawn(ctx, self, &a))
        return;
    krt_log_actor(ctx, KRT_LOG_INFO, event, "sandbox=%s state=%s", sb->id,
                  ka_state_name(sb->state));
    ka_mgr_learn_pool(ctx, self, sb);
}

void ka_mgr_recover(krt_ctx_t *ctx, s_mgr_t *self, int32_t expired, int32_t offset)
{
    s_op_t *op = ka_mgr_op_new(self, NULL); /* nobody to answer */
    if (!op)
        return;
    op->expired = expired;
    op->offset = offset;
    ka_store_expiry_query_t q = {.expired = expired, .limit = RECOVER_PAGE, .offset = offset};
    if (krt_request(ctx, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_EXPIRY, &q, sizeof q,
                    STORE_TIMEOUT_MS, s_on_recover, op))
        ka_mgr_op_free(self, op);
}

static void s_on_recover(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const ka_store_sandbox_list_t *l =
        ka_store_outcome(err, msg, sizeof *l, NULL) ? NULL : msg->body;
    if (!l || msg->len < sizeof *l + l->count * sizeof l->items[0]) {
        krt_log_actor(ctx, KRT_LOG_WARN, "recover_retry", "expired=%d offset=%d", op->expired,
                      op->offset);
        ka_sbx_recover_t again = {op->expired, op->offset};
        krt_send_after(ctx, krt_self(ctx), 1000, KA_SBX_RECOVER_, &again, sizeof again);
        ka_mgr_op_free(self, op);
        return;
    }
    for (uint32_t i = 0; i < l->count; i++) {
        const ka_store_sandbox_t *sb = &l->items[i];
        if ((sb->node[0] && strcmp(sb->node, self->a.node) != 0) || s_live(self, sb->id))
            continue;
        ka_mgr_adopt(ctx, self, sb, "sandbox_recovered");
    }
    if (l->more)
        ka_mgr_recover(ctx, self, op->expired, op->offset + (int32_t)l->count);
    ka_mgr_op_free(self, op);
}

/* ---- what the driver kept ------------------------------------------------------------------ */

/* Discards (on a job thread: disk work) what the driver kept of sandbox id. */
typedef struct {
    ka_driver_t *driver;
    char id[KA_STORE_ID_LEN];
} s_discard_t;

static int s_discard_job(void *arg)
{
    s_discard_t *d = arg;
    ka_driver_discard(d->driver, d->id);
    free(d);
    return 0;
}

/* A kept sandbox's record: one that is gone, deleted or another node's now leaves nothing here
 * (taken over: FAILED there; an id that cannot be a record's: a warm sandbox's). */
static void s_on_kept_read(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const ka_store_sandbox_reply_t *r = msg ? msg->body : NULL;
    int serr = ka_store_outcome(err, msg, sizeof *r, NULL);
    bool gone = serr == KA_STORE_ENOTFOUND || serr == KA_STORE_EINVAL ||
                (!serr && (r->sandbox.deleted_ms ||
                           (r->sandbox.node[0] && strcmp(r->sandbox.node, self->a.node) != 0)));
    s_discard_t *d = gone && !s_live(self, op->rec.id) ? malloc(sizeof *d) : NULL;
    uint64_t ref;
    if (d) {
        d->driver = self->a.driver;
        ka_mgr_copy(d->id, sizeof d->id, op->rec.id);
        krt_log_actor(ctx, KRT_LOG_INFO, "sandbox_forgotten", "sandbox=%s node=%s", d->id,
                      serr ? "-" : r->sandbox.node);
        if (krt_job_submit(ctx, s_discard_job, d, &ref))
            free(d);
    }
    ka_mgr_op_free(self, op);
}

static void s_read_kept(krt_ctx_t *ctx, s_mgr_t *self, const char *id)
{
    s_op_t *op = ka_mgr_op_new(self, NULL);
    if (!op)
        return;
    ka_mgr_copy(op->rec.id, sizeof op->rec.id, id);
    ka_store_sandbox_key_t k;
    memset(&k, 0, sizeof k);
    ka_mgr_copy(k.id, sizeof k.id, id);
    if (krt_request(ctx, ka_peer(ctx, self->a.store), KA_STORE_SANDBOX_GET, &k, sizeof k,
                    STORE_TIMEOUT_MS, s_on_kept_read, op))
        ka_mgr_op_free(self, op);
}

void ka_mgr_sweep_kept(krt_ctx_t *ctx, s_mgr_t *self)
{
    size_t n = ka_driver_kept_ids(self->a.driver, NULL, 0);
    char(*ids)[KA_DRIVER_ID_LEN] = n ? calloc(n, sizeof *ids) : NULL;
    n = ids ? ka_driver_kept_ids(self->a.driver, ids, n) : 0;
    for (size_t i = 0; i < n; i++)
        s_read_kept(ctx, self, ids[i]);
    free(ids);
}

/* ---- the actor ---------------------------------------------------------------------------- */

static bool s_is_child(s_mgr_t *self, krt_addr_t who)
{
    return ka_mgr_slot_of(self, who) != NULL;
}

static void s_on_down(krt_ctx_t *ctx, s_mgr_t *self, const krt_msg_t *msg)
{
    const krt_down_t *d = msg->body;
    s_slot_t *slot = ka_mgr_slot_of(self, d->who);
    if (slot) {
        ka_mgr_slot_drop(self, slot);
        ka_pool_freed(ctx, self->pool);
    }
}

/* A sandbox actor whose record is a tombstone: forward nothing more to it (later calls read the
 * record), then stop it. Everything forwarded to it before is already in its mailbox, ahead of
 * the stop, and it answers those first; calls the service sent it by name after the stop end
 * KRT_ENOACTOR and come here. Its name goes with it. Unlinked first: its normal exit must not
 * reach us as the exit of an actor that is not our child. */
static void s_on_retire(krt_ctx_t *ctx, s_mgr_t *self, krt_addr_t who)
{
    s_slot_t *slot = ka_mgr_slot_of(self, who);
    if (!slot)
        return;
    ka_mgr_slot_drop(self, slot);
    krt_unlink(ctx, who);
    krt_send(ctx, who, KA_SBX_STOP_, NULL, 0);
    ka_pool_freed(ctx, self->pool);
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    if (ka_pool_handle(ctx, self->pool, msg))
        return;
    switch (msg->type) {
    case KA_SBX_CREATE:
        s_create(ctx, self, msg);
        break;
    case KA_SBX_LIST:
        s_list(ctx, self, msg);
        break;
    case KA_SBX_GET:
    case KA_SBX_SUSPEND:
    case KA_SBX_RESUME:
    case KA_SBX_PAUSE:
    case KA_SBX_UNPAUSE:
    case KA_SBX_DELETE:
    case KA_SBX_GUEST:
    case KA_SBX_GUEST_CANCEL:
        s_route(ctx, self, msg);
        break;
    case KA_SBX_FORK:
        s_fork(ctx, self, msg);
        break;
    case KA_SBX_COUNT: {
        ka_sbx_count_t c;
        memset(&c, 0, sizeof c);
        c.live = zhashx_size(self->live);
        ka_pool_report(self->pool, &c);
        ka_mgr_pool_report(self, &c);
        krt_reply(ctx, msg, msg->type, &c, sizeof c);
        break;
    }
    case KRT_MSG_DOWN:
        s_on_down(ctx, self, msg);
        break;
    case KA_SBX_RETIRE_:
        s_on_retire(ctx, self, msg->from);
        break;
    case KA_SBX_RELEASED_:
        ka_mgr_released(ctx, self, msg->from);
        break;
    case KRT_MSG_EXIT: { /* trapped: a child's exit is handled by DOWN; anyone else's stops us */
        const krt_exit_t *e = msg->body;
        if (msg->len == sizeof *e && !s_is_child(self, e->who))
            krt_exit(ctx, e->reason);
        break;
    }
    case KA_SBX_CLUSTER_:
        ka_mgr_cluster_tick(ctx, self);
        break;
    case KA_SBX_RECOVER_:
        if (msg->len == sizeof(ka_sbx_recover_t)) {
            const ka_sbx_recover_t *r = msg->body;
            ka_mgr_recover(ctx, self, r->expired, r->offset);
        }
        break;
    default:
        break;
    }
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_mgr_t *self = state;
    if (!arg || !((const ka_sandboxes_args_t *)arg)->driver)
        return KRT_EINVAL;
    self->a = *(const ka_sandboxes_args_t *)arg;
    if (ka_mgr_slots_init(self))
        return KRT_ENOMEM;
    krt_trap_exit(ctx, true);
    ka_pool_opts_t po = {.driver = self->a.driver,
                         .store = self->a.store,
                         .templates = self->a.templates,
                         .pools = self->a.warm,
                         .n_pools = self->a.n_warm,
                         .dir = self->a.warm_dir,
                         .quiet_ms = self->a.warm_quiet_ms,
                         .used = ka_mgr_pool_used,
                         .used_arg = self};
    if (!(self->pool = ka_pool_new(ctx, &po)))
        return KRT_ENOMEM;
    if (self->a.member) /* recovers once the node holds its lease (sandboxes_cluster.c) */
        return ka_mgr_cluster_start(ctx, self);
    ka_mgr_recover(ctx, self, 1, 0);
    ka_mgr_recover(ctx, self, 0, 0);
    ka_mgr_sweep_kept(ctx, self);
    return 0;
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_mgr_t *self = state;
    while (self->ops) {
        s_op_t *op = self->ops;
        if (op->type)
            ka_fail(ctx, op->from, op->from_ref, op->type, KA_EUNAVAIL,
                    "the node is shutting down; retry");
        ka_pool_drop(self->pool, &op->claim);
        ka_mgr_op_free(self, op);
    }
    ka_pool_destroy(ctx, &self->pool);
    ka_mgr_slots_free(self);
    ka_mgr_cluster_free(self);
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_mgr_t *self = state;
    snprintf(out, cap, "{\"live\":%zu,\"by_addr\":%zu}", self->live ? zhashx_size(self->live) : 0,
             self->by_addr ? zhashx_size(self->by_addr) : 0); /* equal: the indexes in step */
}

const krt_behaviour_t ka_sandboxes_behaviour = {
    .kind = "sandboxes",
    .state_size = sizeof(s_mgr_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
