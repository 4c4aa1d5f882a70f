/*
 * ka_templates: SandboxTemplates, their revisions and preparation, as one actor.
 *
 * Each request becomes a chain of asynchronous steps: store and images requests made with
 * krt_request, each naming the callback that is the next step; an s_op_t holds a chain's
 * context and is the callbacks' user pointer. Nothing blocks: the store and images actors do
 * the I/O. The actor owns its ops in flight (answered and freed if it stops).
 */
#include "templates_actor.h"

#include <czmq.h>
#include <stdarg.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control_msgs.h"
#include "images_actor.h"
#include "peer.h"
#include "store.h"
#include "template_doc.h"

#define STORE_TIMEOUT_MS   30000
#define PREPARE_TIMEOUT_MS (15 * 60 * 1000) /* a first unpack or a pull can take a while */
#define KEY_LEN            (KA_STORE_NS_LEN + KA_STORE_TNAME_LEN + 2)

typedef struct s_op s_op_t;
struct s_op {
    s_op_t *prev, *next; /* the actor's ops in flight */
    krt_addr_t from;     /* who to answer; KRT_ADDR_NONE + from_ref 0 = nobody */
    uint64_t from_ref;
    uint32_t reply_type;
    char ns[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    char uid[KA_STORE_ID_LEN];
    int64_t generation;
    char revision[KA_STORE_REV_LEN];
    char *spec_json;        /* owned */
    ka_template_doc_t *doc; /* owned (apply) */
    bool prepared;          /* the revision was already prepared */
    char reason[KA_STORE_REASON_LEN];
    char message[KA_STORE_MESSAGE_LEN];
    ka_tpl_resolved_t *res; /* owned (resolve) */
};

typedef struct {
    ka_templates_args_t a;
    s_op_t *ops; /* in flight, owned */
    size_t n_ops;
    zhashx_t *latest;      /* "ns/name" -> prepared revision that creates pin (char *) */
    zhashx_t *desired;     /* "ns/name" -> revision being prepared (char *) */
    zhashx_t *runtimes;    /* revision -> ka_tpl_resolved_t * (immutable, cached) */
    krt_addr_t subscribed; /* the store instance whose change events reach us */
} s_tpl_t;

/* ---- small helpers ------------------------------------------------------------------------ */

static void s_key(char *out, const char *ns, const char *name)
{
    snprintf(out, KEY_LEN, "%s/%s", ns, name);
}

static void s_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

/* A new op answering msg later, owned by self. NULL if out of memory. */
static s_op_t *s_op_new(s_tpl_t *self, const krt_msg_t *msg)
{
    s_op_t *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    op->from = msg->from;
    op->from_ref = msg->ref;
    op->reply_type = msg->type;
    op->next = self->ops;
    if (self->ops)
        self->ops->prev = op;
    self->ops = op;
    self->n_ops++;
    return op;
}

static void s_op_free(s_tpl_t *self, s_op_t *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        self->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    self->n_ops--;
    free(op->spec_json);
    ka_template_free(&op->doc);
    free(op->res);
    free(op);
}

static void s_fail_op(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Sends a request for op to the peer registered as `peer` (self->a.store or self->a.images);
 * its reply (or failure, KRT_ENOACTOR while the peer is down) runs `next` with op as user. */
static void s_ask(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op, krt_reply_fn next, const char *peer,
                  uint32_t type, const void *body, size_t len, int timeout_ms)
{
    if (krt_request(ctx, ka_peer(ctx, peer), type, body, len, timeout_ms, next, op))
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "out of memory asking the %s service",
                  peer == self->a.images ? "image" : "store");
}

/* Common head of a step: the op if the store/images service answered with a body that starts
 * with its status, else NULL after failing the op (the service timed out, is gone, or sent
 * something malformed). */
static s_op_t *s_answered(krt_ctx_t *ctx, s_tpl_t *self, void *user, int err, const krt_msg_t *msg,
                          const char *service)
{
    s_op_t *op = user;
    if (err == KRT_ETIMEDOUT)
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "the %s service did not answer in time", service);
    else if (err == KRT_ENOACTOR)
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "the %s service is not running", service);
    else if (err)
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "the %s service failed: %s", service,
                  krt_strerror(err));
    else if (msg->len < sizeof(int32_t))
        s_fail_op(ctx, self, op, -EIO, "malformed reply");
    else
        return op;
    return NULL;
}

/* Common head of a store step: the op if the store answered with a reply of at least size
 * bytes, else NULL after failing the op with the store's code and "<what>: <message>". */
static s_op_t *s_stored(krt_ctx_t *ctx, s_tpl_t *self, void *user, int err, const krt_msg_t *msg,
                        size_t size, const char *what)
{
    const char *why;
    int serr = ka_store_outcome(err, msg, size, &why);
    if (!serr)
        return user;
    s_fail_op(ctx, self, user, serr, "%s%s%s", what, *what ? ": " : "", why);
    return NULL;
}

static void s_answer(krt_ctx_t *ctx, s_op_t *op, const void *body, size_t len)
{
    if (op->from || op->from_ref)
        krt_reply_to(ctx, op->from, op->from_ref, op->reply_type, body, len);
    op->from = KRT_ADDR_NONE;
    op->from_ref = 0;
}

/* Answers op's caller with the failure err (a negative errno) and message. */
static void s_answer_fail(krt_ctx_t *ctx, s_op_t *op, int err, const char *message)
{
    if (op->from || op->from_ref)
        ka_reply_fail(ctx, op->from, op->from_ref, err, message);
    op->from = KRT_ADDR_NONE;
    op->from_ref = 0;
}

static void s_fail_op(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op, int err, const char *fmt, ...)
{
    char msg[KA_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    krt_log_actor(ctx, KRT_LOG_WARN, "template_request_failed", "template=%s/%s code=%s msg=\"%s\"",
                  op->ns, op->name, ka_err_name(err), msg);
    s_answer_fail(ctx, op, err, msg);
    s_op_free(self, op);
}

/* The first template record of a store blob reply, or NULL. */
static const ka_store_template_t *s_first_template(const krt_msg_t *msg)
{
    const ka_store_blob_t *b = msg->body;
    if (msg->len < sizeof *b || b->count == 0)
        return NULL;
    return ka_store_blob_next(b, msg->len, NULL);
}

/* The steps, in the order a request runs them. */
static void s_on_put(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_rev(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_apply_status(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg);
static void s_on_prep_image(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_prep_guest(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_prep_mark(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_store_answer(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg);
static void s_on_res_tpl(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_res_rev(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
static void s_on_res_image(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);

/* ---- revision identity -------------------------------------------------------------------- */

/* The revision id: SHA-256 hex of the canonical JSON of {kind "sandbox", schemaVersion 2,
 * namespace, name, uid, spec, sandboxClass, policy {guestImage, cpu, memory}}. out: 65 bytes. */
static int s_revision_hash(const char *ns, const char *name, const char *uid, const char *spec_json,
                           const char *sandbox_class, const ka_policy_t *policy, char out[65])
{
    json_error_t jerr;
    json_t *spec = json_loads(spec_json, 0, &jerr);
    if (!spec)
        return -EINVAL;
    json_t *doc = json_pack(
        "{s:s, s:i, s:s, s:s, s:s, s:o, s:s, s:{s:s, s:I, s:I}}", "kind", "sandbox",
        "schemaVersion", 2, "namespace", ns, "name", name, "uid", uid, "spec", spec, "sandboxClass",
        sandbox_class, "policy", "guestImage", policy->guest_image_digest, "cpuMillis",
        (json_int_t)policy->cpu_millis, "memoryBytes", (json_int_t)policy->memory_bytes);
    char *canon = doc ? json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    if (!canon)
        return -ENOMEM;
    unsigned char md[32];
    unsigned int n = 0;
    int ok = EVP_Digest(canon, strlen(canon), md, &n, EVP_sha256(), NULL);
    free(canon);
    if (!ok || n != 32)
        return -EIO;
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

static const char *s_pool_class(const s_tpl_t *self, const char *pool)
{
    for (size_t i = 0; i < self->a.policy.n_pools; i++)
        if (strcmp(self->a.policy.pools[i].name, pool) == 0)
            return self->a.policy.pools[i].klass;
    return NULL;
}

/* ---- status ------------------------------------------------------------------------------- */

static char *s_status_json(int64_t generation, bool ready, const char *reason, const char *message)
{
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *st = json_pack("{s:I, s:[{s:s, s:s, s:s, s:s, s:I, s:s}]}", "observedGeneration",
                           (json_int_t)generation, "conditions", "type", "Ready", "status",
                           ready ? "True" : "False", "reason", reason, "message", message,
                           "observedGeneration", (json_int_t)generation, "lastTransitionTime", now);
    char *s = st ? json_dumps(st, JSON_COMPACT) : NULL;
    json_decref(st);
    return s;
}

/* Publishes the template's Ready condition; latest "" keeps the last good revision. */
static void s_put_status(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op, krt_reply_fn next, bool ready,
                         const char *reason, const char *message, const char *latest)
{
    char *json = s_status_json(op->generation, ready, reason, message);
    size_t jl = json ? strlen(json) : 0;
    ka_store_template_status_t *b = calloc(1, sizeof *b + jl + 1);
    if (!json || !b) {
        free(json);
        free(b);
        s_fail_op(ctx, self, op, -EIO, "out of memory");
        return;
    }
    s_copy(b->namespace_, sizeof b->namespace_, op->ns);
    s_copy(b->name, sizeof b->name, op->name);
    b->observed_generation = op->generation;
    s_copy(b->desired_revision, sizeof b->desired_revision, op->revision);
    s_copy(b->latest_revision, sizeof b->latest_revision, latest);
    b->status_len = (uint32_t)jl;
    memcpy(b->status, json, jl + 1);
    s_ask(ctx, self, op, next, self->a.store, KA_STORE_TEMPLATE_STATUS, b, sizeof *b + jl + 1,
          STORE_TIMEOUT_MS);
    free(json);
    free(b);
}

/* Answers an apply or get with the store's template records. */
static void s_answer_templates(krt_ctx_t *ctx, s_op_t *op, const krt_msg_t *msg)
{
    const ka_store_blob_t *b = msg->body;
    size_t extra = msg->len - sizeof(ka_store_blob_t);
    ka_tpl_reply_t *r = calloc(1, sizeof *r + extra);
    if (!r) {
        s_answer_fail(ctx, op, -EIO, "out of memory");
        return;
    }
    memcpy(&r->blob, b, msg->len);
    s_answer(ctx, op, r, sizeof *r + extra);
    free(r);
}

/* ---- apply -------------------------------------------------------------------------------- */

static void s_apply(krt_ctx_t *ctx, s_tpl_t *self, const krt_msg_t *msg)
{
    const ka_tpl_apply_t *req = msg->body;
    s_op_t *op = s_op_new(self, msg);
    if (!op)
        return;
    if (msg->len < sizeof *req || msg->len != sizeof *req + req->yaml_len + 1 ||
        req->yaml[req->yaml_len] != '\0' || !memchr(req->default_namespace, 0, KA_STORE_NS_LEN)) {
        s_fail_op(ctx, self, op, -EINVAL, "malformed apply request");
        return;
    }
    char err[KA_TEMPLATE_ERR_CAP];
    if (ka_template_parse(req->yaml, req->yaml_len, req->default_namespace, &op->doc, err,
                          sizeof err)) {
        s_fail_op(ctx, self, op, -EINVAL, "%s", err);
        return;
    }
    s_copy(op->ns, sizeof op->ns, op->doc->namespace_);
    s_copy(op->name, sizeof op->name, op->doc->name);
    op->spec_json = ka_template_spec_json(op->doc);
    size_t sl = op->spec_json ? strlen(op->spec_json) : 0;
    ka_store_template_put_t *put = calloc(1, sizeof *put + sl + 1);
    if (!op->spec_json || !put) {
        free(put);
        s_fail_op(ctx, self, op, -EIO, "out of memory");
        return;
    }
    s_copy(put->namespace_, sizeof put->namespace_, op->ns);
    s_copy(put->name, sizeof put->name, op->name);
    put->spec_len = (uint32_t)sl;
    memcpy(put->spec, op->spec_json, sl + 1);
    s_ask(ctx, self, op, s_on_put, self->a.store, KA_STORE_TEMPLATE_PUT, put, sizeof *put + sl + 1,
          STORE_TIMEOUT_MS);
    free(put);
}

static void s_on_put(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_stored(ctx, self, user, err, msg, sizeof(ka_store_blob_t), "store template");
    if (!op)
        return;
    const ka_store_template_t *t = s_first_template(msg);
    if (!t) {
        s_fail_op(ctx, self, op, -EIO, "store template: no record");
        return;
    }
    s_copy(op->uid, sizeof op->uid, t->uid);
    op->generation = t->generation;
    const char *klass = s_pool_class(self, op->doc->pool);
    if (!klass) { /* stored, but nothing to prepare until the pool exists */
        op->revision[0] = '\0';
        s_put_status(ctx, self, op, s_on_apply_status, false, KA_READY_NO_POOL,
                     KA_READY_NO_POOL_MSG, "");
        return;
    }
    if (s_revision_hash(op->ns, op->name, op->uid, op->spec_json, klass, &self->a.policy,
                        op->revision)) {
        s_fail_op(ctx, self, op, -EIO, "cannot compute the revision id");
        return;
    }
    char key[KEY_LEN];
    s_key(key, op->ns, op->name);
    zhashx_update(self->desired, key, strdup(op->revision));
    size_t sl = strlen(op->spec_json);
    ka_store_revision_put_t *rp = calloc(1, sizeof *rp + sl + 1);
    if (!rp) {
        s_fail_op(ctx, self, op, -EIO, "out of memory");
        return;
    }
    s_copy(rp->hash, sizeof rp->hash, op->revision);
    s_copy(rp->namespace_, sizeof rp->namespace_, op->ns);
    s_copy(rp->name, sizeof rp->name, op->name);
    rp->generation = op->generation;
    rp->state = KA_REV_PREPARING;
    s_copy(rp->reason, sizeof rp->reason, KA_READY_PREPARING);
    rp->spec_len = (uint32_t)sl;
    memcpy(rp->spec, op->spec_json, sl + 1);
    s_ask(ctx, self, op, s_on_rev, self->a.store, KA_STORE_REVISION_PUT, rp, sizeof *rp + sl + 1,
          STORE_TIMEOUT_MS);
    free(rp);
}

static void s_on_rev(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_stored(ctx, self, user, err, msg, sizeof(ka_store_blob_t), "store revision");
    if (!op)
        return;
    const ka_store_revision_t *r = ka_store_blob_next(msg->body, msg->len, NULL);
    if (!r) {
        s_fail_op(ctx, self, op, -EIO, "store revision: no record");
        return;
    }
    op->prepared = r->state == KA_REV_PREPARED;
    if (op->prepared)
        s_put_status(ctx, self, op, s_on_apply_status, true, KA_READY_PREPARED,
                     KA_READY_PREPARED_MSG, op->revision);
    else
        s_put_status(ctx, self, op, s_on_apply_status, false, KA_READY_PREPARING,
                     KA_READY_PREPARING_MSG, "");
}

static void s_prepare(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op)
{
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    s_copy(req.arg, sizeof req.arg, op->doc->image);
    krt_log_actor(ctx, KRT_LOG_INFO, "revision_preparing", "template=%s/%s revision=%.16s image=%s",
                  op->ns, op->name, op->revision, op->doc->image);
    s_ask(ctx, self, op, s_on_prep_image, self->a.images, KA_IMAGES_PREPARE, &req, sizeof req,
          PREPARE_TIMEOUT_MS);
}

static void s_on_apply_status(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_stored(ctx, self, user, err, msg, sizeof(ka_store_blob_t), "");
    if (!op)
        return;
    s_answer_templates(ctx, op, msg);
    if (!op->revision[0] || op->prepared) {
        if (op->prepared) {
            char key[KEY_LEN];
            s_key(key, op->ns, op->name);
            zhashx_update(self->latest, key, strdup(op->revision));
        }
        s_op_free(self, op);
        return;
    }
    s_prepare(ctx, self, op);
}

/* Preparation failed: mark the revision, keep the last good one, publish PreparationFailed. */
static void s_prep_failed(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op, const char *why)
{
    krt_log_actor(ctx, KRT_LOG_WARN, "revision_failed", "template=%s/%s revision=%.16s why=\"%s\"",
                  op->ns, op->name, op->revision, why);
    ka_store_revision_state_t rs;
    memset(&rs, 0, sizeof rs);
    s_copy(rs.hash, sizeof rs.hash, op->revision);
    rs.state = KA_REV_FAILED;
    s_copy(rs.reason, sizeof rs.reason, KA_READY_FAILED);
    s_copy(rs.message, sizeof rs.message, why);
    s_copy(op->reason, sizeof op->reason, KA_READY_FAILED);
    s_ask(ctx, self, op, s_on_prep_mark, self->a.store, KA_STORE_REVISION_STATE, &rs, sizeof rs,
          STORE_TIMEOUT_MS);
}

/* Common head of a preparation step: a failure of the images service fails the revision. */
static s_op_t *s_prep_answered(krt_ctx_t *ctx, s_tpl_t *self, void *user, int err,
                               const krt_msg_t *msg)
{
    s_op_t *op = user;
    if (err == KRT_ETIMEDOUT)
        s_prep_failed(ctx, self, op, "image preparation timed out");
    else if (err)
        s_prep_failed(ctx, self, op,
                      err == KRT_ENOACTOR ? "the image service is not running" : krt_strerror(err));
    else if (msg->len < sizeof(ka_images_reply_t))
        s_prep_failed(ctx, self, op, "malformed reply from the image service");
    else
        return op;
    return NULL;
}

static void s_on_prep_image(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_prep_answered(ctx, self, user, err, msg);
    if (!op)
        return;
    const ka_images_reply_t *r = msg->body;
    if (r->err) {
        s_prep_failed(ctx, self, op, r->message);
        return;
    }
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    s_copy(req.arg, sizeof req.arg, self->a.policy.guest_image_digest);
    s_ask(ctx, self, op, s_on_prep_guest, self->a.images, KA_IMAGES_RESOLVE, &req, sizeof req,
          STORE_TIMEOUT_MS);
}

static void s_on_prep_guest(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_prep_answered(ctx, self, user, err, msg);
    if (!op)
        return;
    const ka_images_reply_t *r = msg->body;
    if (r->err) {
        char why[KA_STORE_MESSAGE_LEN + 128];
        snprintf(why, sizeof why, "guest image %s: %s", self->a.policy.guest_image_digest,
                 r->message);
        s_prep_failed(ctx, self, op, why);
        return;
    }
    ka_store_revision_state_t rs;
    memset(&rs, 0, sizeof rs);
    s_copy(rs.hash, sizeof rs.hash, op->revision);
    rs.state = KA_REV_PREPARED;
    s_copy(rs.reason, sizeof rs.reason, KA_READY_PREPARED);
    s_copy(op->reason, sizeof op->reason, KA_READY_PREPARED);
    s_ask(ctx, self, op, s_on_prep_mark, self->a.store, KA_STORE_REVISION_STATE, &rs, sizeof rs,
          STORE_TIMEOUT_MS);
}

/* True while op's revision is still the one its template wants (no newer apply or delete). */
static bool s_still_desired(s_tpl_t *self, const s_op_t *op)
{
    char key[KEY_LEN];
    s_key(key, op->ns, op->name);
    const char *want = zhashx_lookup(self->desired, key);
    return want && strcmp(want, op->revision) == 0;
}

static void s_on_prep_mark(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_stored(ctx, self, user, err, msg, sizeof(ka_store_blob_t), "store revision");
    if (!op)
        return;
    bool ok = strcmp(op->reason, KA_READY_PREPARED) == 0;
    if (!s_still_desired(self, op)) { /* superseded or deleted: the newer work publishes */
        s_op_free(self, op);
        return;
    }
    if (ok) {
        char key[KEY_LEN];
        s_key(key, op->ns, op->name);
        zhashx_update(self->latest, key, strdup(op->revision));
        krt_log_actor(ctx, KRT_LOG_INFO, "revision_prepared", "template=%s/%s revision=%.16s",
                      op->ns, op->name, op->revision);
        s_put_status(ctx, self, op, s_on_store_answer, true, KA_READY_PREPARED,
                     KA_READY_PREPARED_MSG, op->revision);
    } else {
        s_put_status(ctx, self, op, s_on_store_answer, false, KA_READY_FAILED, KA_READY_FAILED_MSG,
                     "");
    }
}

/* ---- reads, delete ------------------------------------------------------------------------ */

static bool s_key_ok(const krt_msg_t *msg)
{
    const ka_tpl_key_t *k = msg->body;
    return msg->len == sizeof *k && memchr(k->namespace_, 0, sizeof k->namespace_) &&
           memchr(k->name, 0, sizeof k->name);
}

static void s_forward(krt_ctx_t *ctx, s_tpl_t *self, const krt_msg_t *msg, uint32_t store_type)
{
    s_op_t *op = s_op_new(self, msg);
    if (!op)
        return;
    if (!s_key_ok(msg)) {
        s_fail_op(ctx, self, op, -EINVAL, "malformed template key");
        return;
    }
    const ka_tpl_key_t *k = msg->body;
    s_copy(op->ns, sizeof op->ns, k->namespace_);
    s_copy(op->name, sizeof op->name, k->name);
    if (store_type == KA_STORE_TEMPLATE_DELETE) { /* retire preparation and the pin cache */
        char key[KEY_LEN];
        s_key(key, op->ns, op->name);
        zhashx_delete(self->desired, key);
        zhashx_delete(self->latest, key);
    }
    ka_store_template_key_t sk;
    memset(&sk, 0, sizeof sk);
    s_copy(sk.namespace_, sizeof sk.namespace_, op->ns);
    s_copy(sk.name, sizeof sk.name, op->name);
    s_ask(ctx, self, op, s_on_store_answer, self->a.store, store_type, &sk, sizeof sk,
          STORE_TIMEOUT_MS);
}

/* The last step of a forward or of a preparation: the store's answer goes back as-is. */
static void s_on_store_answer(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_stored(ctx, self, user, err, msg, sizeof(ka_store_blob_t), "");
    if (!op)
        return;
    s_answer_templates(ctx, op, msg);
    s_op_free(self, op);
}

/* ---- resolve: what a sandbox pins, and a pinned revision's runtime ------------------------ */

static void s_runtime_from_revision(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op);

static void s_answer_resolved(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op,
                              const ka_tpl_resolved_t *res)
{
    s_answer(ctx, op, res, sizeof *res);
    s_op_free(self, op);
}

static void s_resolve(krt_ctx_t *ctx, s_tpl_t *self, const krt_msg_t *msg)
{
    s_op_t *op = s_op_new(self, msg);
    if (!op)
        return;
    if (msg->type == KA_TPL_RUNTIME) {
        const ka_tpl_runtime_req_t *r = msg->body;
        if (msg->len != sizeof *r || !memchr(r->revision, 0, sizeof r->revision) ||
            !r->revision[0]) {
            s_fail_op(ctx, self, op, -EINVAL, "malformed runtime request");
            return;
        }
        s_copy(op->revision, sizeof op->revision, r->revision);
        s_runtime_from_revision(ctx, self, op);
        return;
    }
    if (!s_key_ok(msg)) {
        s_fail_op(ctx, self, op, -EINVAL, "malformed template key");
        return;
    }
    const ka_tpl_key_t *k = msg->body;
    s_copy(op->ns, sizeof op->ns, k->namespace_);
    s_copy(op->name, sizeof op->name, k->name);
    char key[KEY_LEN];
    s_key(key, op->ns, op->name);
    const char *latest = zhashx_lookup(self->latest, key);
    if (latest) { /* fast path: the pin is known, the runtime probably cached */
        s_copy(op->revision, sizeof op->revision, latest);
        s_runtime_from_revision(ctx, self, op);
        return;
    }
    ka_store_template_key_t sk;
    memset(&sk, 0, sizeof sk);
    s_copy(sk.namespace_, sizeof sk.namespace_, op->ns);
    s_copy(sk.name, sizeof sk.name, op->name);
    s_ask(ctx, self, op, s_on_res_tpl, self->a.store, KA_STORE_TEMPLATE_GET, &sk, sizeof sk,
          STORE_TIMEOUT_MS);
}

static void s_on_res_tpl(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = user;
    const char *why;
    int serr = ka_store_outcome(err, msg, sizeof(ka_store_blob_t), &why);
    const ka_store_template_t *t = serr ? NULL : s_first_template(msg);
    if (!t) {
        if (serr == KA_STORE_ENOTFOUND || serr == 0)
            s_fail_op(ctx, self, op, -ENOENT, "sandbox template %s/%s not found", op->ns, op->name);
        else
            s_fail_op(ctx, self, op, serr, "%s", why);
        return;
    }
    if (!t->latest_revision[0]) {
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "%s", KA_MSG_NO_RUNTIME);
        return;
    }
    char key[KEY_LEN];
    s_key(key, op->ns, op->name);
    zhashx_update(self->latest, key, strdup(t->latest_revision));
    s_copy(op->revision, sizeof op->revision, t->latest_revision);
    s_runtime_from_revision(ctx, self, op);
}

static void s_runtime_from_revision(krt_ctx_t *ctx, s_tpl_t *self, s_op_t *op)
{
    const ka_tpl_resolved_t *cached = zhashx_lookup(self->runtimes, op->revision);
    if (cached) {
        s_answer_resolved(ctx, self, op, cached);
        return;
    }
    ka_store_revision_key_t rk;
    memset(&rk, 0, sizeof rk);
    s_copy(rk.hash, sizeof rk.hash, op->revision);
    s_ask(ctx, self, op, s_on_res_rev, self->a.store, KA_STORE_REVISION_GET, &rk, sizeof rk,
          STORE_TIMEOUT_MS);
}

/* Fills res from a revision's spec JSON: snapshot location and env. */
static int s_fill_from_spec(ka_tpl_resolved_t *res, const char *spec_json, char *image, size_t cap)
{
    json_error_t jerr;
    json_t *spec = json_loads(spec_json, 0, &jerr);
    const char *img = NULL, *loc = NULL;
    json_t *env = NULL;
    if (!spec || json_unpack(spec, "{s:{s:s}, s:o, s:{s:{s:s}}}", "workload", "image", &img, "env",
                             &env, "substrate", "snapshotPolicy", "location", &loc)) {
        json_decref(spec);
        return -EINVAL;
    }
    s_copy(image, cap, img);
    s_copy(res->snapshot_location, sizeof res->snapshot_location, loc);
    json_t *pool = json_object_get(
        json_object_get(json_object_get(spec, "substrate"), "workerPoolRef"), "name");
    s_copy(res->pool, sizeof res->pool, json_string_value(pool));
    size_t i, off = 0;
    json_t *e;
    json_array_foreach(env, i, e)
    {
        const char *k = json_string_value(json_object_get(e, "name"));
        const char *v = json_string_value(json_object_get(e, "value"));
        int n = snprintf(res->env + off, sizeof res->env - off, "%s=%s", k ? k : "", v ? v : "");
        if (n < 0 || (size_t)n >= sizeof res->env - off) {
            json_decref(spec);
            return -E2BIG;
        }
        off += (size_t)n + 1;
        res->n_env++;
    }
    json_decref(spec);
    return 0;
}

static void s_on_res_rev(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = user;
    const ka_store_revision_t *r = ka_store_outcome(err, msg, sizeof(ka_store_blob_t), NULL)
                                       ? NULL
                                       : ka_store_blob_next(msg->body, msg->len, NULL);
    if (!r || r->state != KA_REV_PREPARED) {
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "%s", KA_MSG_NO_RUNTIME);
        return;
    }
    op->res = calloc(1, sizeof *op->res);
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    if (!op->res || s_fill_from_spec(op->res, r->spec, req.arg, sizeof req.arg)) {
        s_fail_op(ctx, self, op, -EIO, "revision %.16s has an unreadable spec", op->revision);
        return;
    }
    s_copy(op->res->revision, sizeof op->res->revision, op->revision);
    s_ask(ctx, self, op, s_on_res_image, self->a.images, KA_IMAGES_PREPARE, &req, sizeof req,
          PREPARE_TIMEOUT_MS);
}

static void s_on_res_image(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_op_t *op = s_answered(ctx, self, user, err, msg, "image");
    if (!op)
        return;
    const ka_images_reply_t *r = msg->body;
    if (r->err) {
        s_fail_op(ctx, self, op, KA_EUNAVAIL, "%s: %s", KA_MSG_NO_RUNTIME, r->message);
        return;
    }
    s_copy(op->res->rootfs, sizeof op->res->rootfs, r->path);
    ka_tpl_resolved_t *cached = malloc(sizeof *cached);
    if (cached) {
        *cached = *op->res;
        zhashx_update(self->runtimes, op->revision, cached);
    }
    s_answer_resolved(ctx, self, op, op->res);
}

/* ---- the actor ---------------------------------------------------------------------------- */

/* Another node changed a template: forget what this node believed about it. */
static void s_on_store_event(s_tpl_t *self, const krt_msg_t *msg)
{
    const ka_store_event_t *ev = msg->body;
    if (msg->len != sizeof *ev || strcmp(ev->channel, "ka_template") != 0)
        return;
    char key[KEY_LEN];
    snprintf(key, sizeof key, "%.*s", (int)strcspn(ev->payload, " "), ev->payload);
    zhashx_delete(self->latest, key);
}

/* A restarted store (new address) has forgotten our subscription and we may have missed
 * events meanwhile: subscribe again and forget the cached latest revisions. */
static void s_follow_store(krt_ctx_t *ctx, s_tpl_t *self)
{
    krt_addr_t store = ka_peer(ctx, self->a.store);
    if (store == self->subscribed || store == KRT_ADDR_NONE)
        return;
    if (self->subscribed != KRT_ADDR_NONE)
        zhashx_purge(self->latest);
    ka_store_subscribe_t sub = {KRT_ADDR_NONE};
    if (krt_send(ctx, store, KA_STORE_SUBSCRIBE, &sub, sizeof sub) == 0)
        self->subscribed = store;
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_tpl_t *self = state;
    s_follow_store(ctx, self);
    switch (msg->type) {
    case KA_TPL_APPLY:
        s_apply(ctx, self, msg);
        break;
    case KA_TPL_GET:
        s_forward(ctx, self, msg, KA_STORE_TEMPLATE_GET);
        break;
    case KA_TPL_LIST:
        s_forward(ctx, self, msg, KA_STORE_TEMPLATE_LIST);
        break;
    case KA_TPL_DELETE:
        s_forward(ctx, self, msg, KA_STORE_TEMPLATE_DELETE);
        break;
    case KA_TPL_RESOLVE:
    case KA_TPL_RUNTIME:
        s_resolve(ctx, self, msg);
        break;
    case KA_STORE_EVENT:
        s_on_store_event(self, msg);
        break;
    default:
        break; /* a late store reply (subscribe ack) or noise: nothing to do */
    }
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_tpl_t *self = state;
    if (!arg)
        return KRT_EINVAL;
    self->a = *(const ka_templates_args_t *)arg;
    self->latest = zhashx_new();
    self->desired = zhashx_new();
    self->runtimes = zhashx_new();
    if (!self->latest || !self->desired || !self->runtimes)
        return KRT_ENOMEM;
    zhashx_set_destructor(self->latest, (zhashx_destructor_fn *)zstr_free);
    zhashx_set_destructor(self->desired, (zhashx_destructor_fn *)zstr_free);
    zhashx_set_destructor(self->runtimes, (zhashx_destructor_fn *)zstr_free);
    s_follow_store(ctx, self);
    return 0;
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_tpl_t *self = state;
    while (self->ops) {
        s_op_t *op = self->ops;
        s_answer_fail(ctx, op, KA_EUNAVAIL, "the template service is stopping");
        s_op_free(self, op);
    }
    zhashx_destroy(&self->latest);
    zhashx_destroy(&self->desired);
    zhashx_destroy(&self->runtimes);
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_tpl_t *self = state;
    snprintf(out, cap, "{\"in_flight\":%zu,\"pinned\":%zu,\"runtimes\":%zu}", self->n_ops,
             self->latest ? zhashx_size(self->latest) : 0,
             self->runtimes ? zhashx_size(self->runtimes) : 0);
}

const krt_behaviour_t ka_templates_behaviour = {
    .kind = "templates",
    .state_size = sizeof(s_tpl_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
