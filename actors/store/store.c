/* ka_store: the store actor. See store.h for the contract. */
#include "store.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "phases.h"
#include "schema.h"
#include "store_sql.h"

#define S_MSG_TICK          (KA_STORE_MSG_BASE + 0xF0) /* engine deadline */
#define S_MSG_MIGRATE_RETRY (KA_STORE_MSG_BASE + 0xF1)
#define S_MAX_SUBS          64
#define S_MAX_PARKED        4096

/* ---------------------------------------------------------------------------------------- */
/* Names                                                                                    */

static const char *const s_states[] = {"RUNTIME_STATE_UNSPECIFIED", "RUNTIME_STATE_CREATING",
                                       "RUNTIME_STATE_READY",       "RUNTIME_STATE_SUSPENDED",
                                       "RUNTIME_STATE_FAILED",      "RUNTIME_STATE_DELETING",
                                       "RUNTIME_STATE_DELETED"};
static const char *const s_ops[] = {"RUNTIME_OPERATION_NONE", "RUNTIME_OPERATION_CREATE",
                                    "RUNTIME_OPERATION_SUSPEND", "RUNTIME_OPERATION_RESUME",
                                    "RUNTIME_OPERATION_DELETE"};
static const char *const s_revs[] = {"PREPARING", "PREPARED", "FAILED", "RETIRED"};

#define S_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int s_parse(const char *const *names, int n, const char *name)
{
    for (int i = 0; name && i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

const char *ka_state_name(int state)
{
    return state >= 0 && state < S_COUNT(s_states) ? s_states[state] : NULL;
}

int ka_state_parse(const char *name)
{
    return s_parse(s_states, S_COUNT(s_states), name);
}

const char *ka_op_name(int op)
{
    return op >= 0 && op < S_COUNT(s_ops) ? s_ops[op] : NULL;
}

int ka_op_parse(const char *name)
{
    return s_parse(s_ops, S_COUNT(s_ops), name);
}

const char *ka_rev_state_name(int st)
{
    return st >= 0 && st < S_COUNT(s_revs) ? s_revs[st] : NULL;
}

static int s_rev_state_parse(const char *name)
{
    return s_parse(s_revs, S_COUNT(s_revs), name);
}

/* ---------------------------------------------------------------------------------------- */
/* State                                                                                    */

typedef struct s_job {
    _Atomic int refs; /* the actor and the job thread */
    char *conninfo;
    int version;
    char err[512];
} s_job_t;

typedef struct s_parked {
    struct s_parked *next;
    krt_msg_t msg; /* body points into data */
    unsigned char data[];
} s_parked_t;

typedef struct s_store {
    krt_ctx_t *ctx; /* valid during the current turn only */
    char *conninfo;
    ka_pgconn_opts_t opts;
    bool skip_migrate;
    ka_pgconn_t *eng;
    s_job_t *job;
    int schema_version;
    int migrate_backoff_ms;
    s_parked_t *parked_head, *parked_tail;
    int nparked;
    int wfd;
    uint32_t wev;
    bool watching;
    uint64_t watch_gen; /* fd watch tag; bumped when the engine closes its socket */
    krt_timer_t tick;
    uint64_t tick_at; /* krt_now_ms deadline of tick, 0 = idle */
    krt_timer_t migrate_timer;
    krt_addr_t subs[S_MAX_SUBS];
    int nsubs;
    bool logged_down; /* a db_unavailable warning was logged since the last connect */
} s_store_t;

/* A request waiting for the engine: what the reply needs. */
typedef struct s_call {
    s_store_t *self;
    krt_addr_t from;
    uint64_t ref;
    uint32_t type;
    int32_t limit;    /* lists: page size requested (one more row is fetched) */
    char *creator;    /* create: "creator\0request_id" kept for a receipt re-read */
    char *request_id; /* points into creator's allocation */
    double began;     /* ka_metric_now() at submit: a create's intent phase */
} s_call_t;

/* ---------------------------------------------------------------------------------------- */
/* Replies                                                                                  */

static void s_reply_to(s_store_t *self, krt_addr_t from, uint64_t ref, uint32_t type,
                       const void *body, size_t len)
{
    krt_msg_t m = {.type = type, .from = from, .ref = ref};
    int rc = krt_reply(self->ctx, &m, type, body, len);
    if (rc && rc != KRT_ENOACTOR)
        krt_log_actor(self->ctx, KRT_LOG_WARN, "reply_failed", "type=%u err=%s", type,
                      krt_strerror(rc));
}

/* Answers a request with an error reply: err (KA_STORE_E* or -ENOMEM) and msg. */
static void s_reply_err(s_store_t *self, krt_addr_t from, uint64_t ref, int err, const char *msg)
{
    int rc = krt_reply_error_to(self->ctx, from, ref, err, msg);
    if (rc && rc != KRT_ENOACTOR)
        krt_log_actor(self->ctx, KRT_LOG_WARN, "reply_failed", "err=%d rc=%s", err,
                      krt_strerror(rc));
}

int ka_store_outcome(int err, const krt_msg_t *msg, size_t size, const char **why)
{
    const char *text = "";
    if (err == KRT_ENOACTOR || err == KRT_ETIMEDOUT || err == KRT_EREMOTE || err == KRT_ESHUTDOWN ||
        err == KRT_ENOCONN) { /* the runtime's: no answer came */
        text = err == KRT_ETIMEDOUT ? "the sandbox store did not answer in time; retry"
                                    : "the sandbox store is unavailable; retry";
        err = KA_STORE_EUNAVAIL;
    } else if (err) { /* the store's error reply */
        if (msg && msg->type == KRT_MSG_ERROR && msg->len &&
            ((const char *)msg->body)[msg->len - 1] == '\0')
            text = msg->body;
    } else if (!msg || msg->len < size) {
        err = KA_STORE_EINVAL;
        text = "malformed store reply";
    }
    if (why)
        *why = text;
    return err;
}

static void s_call_err(s_call_t *call, int err, const char *msg)
{
    s_reply_err(call->self, call->from, call->ref, err, msg);
}

/* Maps an engine outcome to a store error code. */
static int s_map_err(const ka_pg_outcome_t *out)
{
    switch (out->err) {
    case 0:
        return 0;
    case KA_PG_EUNAVAIL:
        return KA_STORE_EUNAVAIL;
    case KA_PG_ECONFLICT:
        return KA_STORE_ECONFLICT;
    default:
        /* invalid input text (bad uuid, json, number) is the caller's error */
        if (strncmp(out->sqlstate, "22", 2) == 0)
            return KA_STORE_EINVAL;
        return KA_STORE_EDB;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Row decoding                                                                             */

static void s_cpy(char *dst, size_t cap, const PGresult *r, int row, int col)
{
    snprintf(dst, cap, "%s", PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col));
}

static int64_t s_i64(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static void s_row_sandbox(const PGresult *r, int row, ka_store_sandbox_t *sb)
{
    memset(sb, 0, sizeof(*sb));
    s_cpy(sb->id, sizeof(sb->id), r, row, 0);
    s_cpy(sb->creator, sizeof(sb->creator), r, row, 1);
    s_cpy(sb->request_id, sizeof(sb->request_id), r, row, 2);
    s_cpy(sb->name, sizeof(sb->name), r, row, 3);
    s_cpy(sb->template_namespace, sizeof(sb->template_namespace), r, row, 4);
    s_cpy(sb->template_name, sizeof(sb->template_name), r, row, 5);
    s_cpy(sb->revision, sizeof(sb->revision), r, row, 6);
    int st = ka_state_parse(PQgetvalue(r, row, 7));
    int op = ka_op_parse(PQgetvalue(r, row, 8));
    sb->state = st < 0 ? KA_STATE_UNSPECIFIED : st;
    sb->operation = op < 0 ? KA_OP_NONE : op;
    s_cpy(sb->failure_reason, sizeof(sb->failure_reason), r, row, 9);
    s_cpy(sb->failure_message, sizeof(sb->failure_message), r, row, 10);
    s_cpy(sb->node, sizeof(sb->node), r, row, 11);
    sb->created_ms = s_i64(r, row, 12);
    sb->updated_ms = s_i64(r, row, 13);
    sb->expires_ms = s_i64(r, row, 14);
    sb->deleted_ms = s_i64(r, row, 15);
}

static size_t s_align8(size_t n)
{
    return (n + 7u) & ~(size_t)7u;
}

static size_t s_template_size(const PGresult *r, int row)
{
    return s_align8(sizeof(ka_store_template_t) + (size_t)PQgetlength(r, row, 10) + 1 +
                    (size_t)PQgetlength(r, row, 11) + 1);
}

static void s_row_template(const PGresult *r, int row, ka_store_template_t *t)
{
    size_t size = s_template_size(r, row);
    memset(t, 0, size);
    t->size = (uint32_t)size;
    s_cpy(t->namespace_, sizeof(t->namespace_), r, row, 0);
    s_cpy(t->name, sizeof(t->name), r, row, 1);
    s_cpy(t->uid, sizeof(t->uid), r, row, 2);
    t->deleted = PQgetvalue(r, row, 3)[0] == 't';
    t->generation = s_i64(r, row, 4);
    t->observed_generation = s_i64(r, row, 5);
    s_cpy(t->desired_revision, sizeof(t->desired_revision), r, row, 6);
    s_cpy(t->latest_revision, sizeof(t->latest_revision), r, row, 7);
    t->created_ms = s_i64(r, row, 8);
    t->updated_ms = s_i64(r, row, 9);
    t->spec_len = (uint32_t)PQgetlength(r, row, 10);
    t->status_len = (uint32_t)PQgetlength(r, row, 11);
    memcpy(t->text, PQgetvalue(r, row, 10), t->spec_len);
    memcpy(t->text + t->spec_len + 1, PQgetvalue(r, row, 11), t->status_len);
}

static size_t s_revision_size(const PGresult *r, int row)
{
    return s_align8(sizeof(ka_store_revision_t) + (size_t)PQgetlength(r, row, 9) + 1);
}

static void s_row_revision(const PGresult *r, int row, ka_store_revision_t *v)
{
    size_t size = s_revision_size(r, row);
    memset(v, 0, size);
    v->size = (uint32_t)size;
    s_cpy(v->hash, sizeof(v->hash), r, row, 0);
    s_cpy(v->namespace_, sizeof(v->namespace_), r, row, 1);
    s_cpy(v->name, sizeof(v->name), r, row, 2);
    v->generation = s_i64(r, row, 3);
    int st = s_rev_state_parse(PQgetvalue(r, row, 4));
    v->state = st < 0 ? KA_REV_PREPARING : st;
    s_cpy(v->reason, sizeof(v->reason), r, row, 5);
    s_cpy(v->message, sizeof(v->message), r, row, 6);
    v->created_ms = s_i64(r, row, 7);
    v->updated_ms = s_i64(r, row, 8);
    v->spec_len = (uint32_t)PQgetlength(r, row, 9);
    memcpy(v->spec, PQgetvalue(r, row, 9), v->spec_len);
}

static void s_row_node(const PGresult *r, int row, ka_store_node_t *n)
{
    memset(n, 0, sizeof(*n));
    s_cpy(n->id, sizeof(n->id), r, row, 0);
    s_cpy(n->name, sizeof(n->name), r, row, 1);
    s_cpy(n->endpoint, sizeof(n->endpoint), r, row, 2);
    s_cpy(n->pools, sizeof(n->pools), r, row, 3);
    n->capacity = (int32_t)s_i64(r, row, 4);
    n->started_ms = s_i64(r, row, 5);
    n->heartbeat_ms = s_i64(r, row, 6);
    n->lease_expires_ms = s_i64(r, row, 7);
    s_cpy(n->mesh_endpoint, sizeof(n->mesh_endpoint), r, row, 8);
    s_cpy(n->public_key, sizeof(n->public_key), r, row, 9);
    n->incarnation = s_i64(r, row, 10);
    n->alive = PQgetvalue(r, row, 11)[0] == 't';
    n->sandboxes = (int32_t)s_i64(r, row, 12);
    n->draining = PQgetvalue(r, row, 13)[0] == 't';
}

const void *ka_store_blob_next(const ka_store_blob_t *b, size_t len, const void *prev)
{
    if (!b || len < sizeof(*b) || b->bytes > len - sizeof(*b))
        return NULL;
    const unsigned char *end = b->data + b->bytes;
    const unsigned char *p = prev ? (const unsigned char *)prev + *(const uint32_t *)prev : b->data;
    if (p + sizeof(uint32_t) > end)
        return NULL;
    uint32_t size = *(const uint32_t *)p;
    if (size < sizeof(uint32_t) || size > (size_t)(end - p))
        return NULL;
    return p;
}

/* Allocates a body of `fixed` bytes followed by text and its NUL; *len receives the size. */
static void *s_body_with_text(size_t fixed, const char *text, size_t *len)
{
    size_t n = strlen(text);
    if (n > UINT32_MAX - 1)
        return NULL;
    unsigned char *b = calloc(1, fixed + n + 1);
    if (!b)
        return NULL;
    memcpy(b + fixed, text, n);
    *len = fixed + n + 1;
    return b;
}

ka_store_template_put_t *ka_store_template_put_new(const char *ns, const char *name,
                                                   const char *spec, size_t *len)
{
    if (!ns || !name || !spec || !len)
        return NULL;
    ka_store_template_put_t *b =
        s_body_with_text(offsetof(ka_store_template_put_t, spec), spec, len);
    if (b) {
        snprintf(b->namespace_, sizeof(b->namespace_), "%s", ns);
        snprintf(b->name, sizeof(b->name), "%s", name);
        b->spec_len = (uint32_t)strlen(spec);
    }
    return b;
}

ka_store_template_status_t *ka_store_template_status_new(const char *ns, const char *name,
                                                         const char *status, size_t *len)
{
    if (!ns || !name || !status || !len)
        return NULL;
    ka_store_template_status_t *b =
        s_body_with_text(offsetof(ka_store_template_status_t, status), status, len);
    if (b) {
        snprintf(b->namespace_, sizeof(b->namespace_), "%s", ns);
        snprintf(b->name, sizeof(b->name), "%s", name);
        b->status_len = (uint32_t)strlen(status);
    }
    return b;
}

ka_store_revision_put_t *ka_store_revision_put_new(const char *hash, const char *ns,
                                                   const char *name, const char *spec, size_t *len)
{
    if (!hash || !ns || !name || !spec || !len)
        return NULL;
    ka_store_revision_put_t *b =
        s_body_with_text(offsetof(ka_store_revision_put_t, spec), spec, len);
    if (b) {
        snprintf(b->hash, sizeof(b->hash), "%s", hash);
        snprintf(b->namespace_, sizeof(b->namespace_), "%s", ns);
        snprintf(b->name, sizeof(b->name), "%s", name);
        b->spec_len = (uint32_t)strlen(spec);
    }
    return b;
}

const char *ka_store_template_spec(const ka_store_template_t *t)
{
    return t->text;
}

const char *ka_store_template_status(const ka_store_template_t *t)
{
    return t->text + t->spec_len + 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Completions                                                                              */

static const PGresult *s_res(const ka_pg_outcome_t *out, int i)
{
    return i < out->nresults ? out->results[i] : NULL;
}

static void s_done_sandbox(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    if (out->err) {
        s_call_err(call, s_map_err(out), out->message);
        free(call);
        return;
    }
    ka_store_sandbox_reply_t rep;
    memset(&rep, 0, sizeof(rep));
    const PGresult *first = s_res(out, 0);
    const PGresult *second = s_res(out, 1);
    if (first && PQntuples(first) == 1) {
        s_row_sandbox(first, 0, &rep.sandbox);
        s_reply_to(call->self, call->from, call->ref, call->type, &rep, sizeof(rep));
    } else if (call->type == KA_STORE_SANDBOX_CREATE) {
        /* the receipt re-read after a concurrent duplicate (s_done_create): not created here */
        s_call_err(call, KA_STORE_EDB, "create: receipt row not found");
    } else if (call->type == KA_STORE_SANDBOX_UPDATE && second && PQntuples(second) == 1) {
        s_row_sandbox(second, 0, &rep.sandbox);
        s_call_err(call, KA_STORE_ESTALE,
                   rep.sandbox.deleted_ms ? "sandbox is deleted"
                                          : "sandbox state changed concurrently");
    } else {
        s_call_err(call, KA_STORE_ENOTFOUND, "sandbox not found");
    }
    free(call);
}

/* Create: one row back (created or the receipt's). No row means a concurrent duplicate
 * committed on another connection after this statement's snapshot: read the receipt again
 * (a new statement sees it). */
static void s_done_create(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    const PGresult *r = out->err ? NULL : out->results[0];
    if (r && PQntuples(r) == 0 && call->creator) {
        const char *p[2] = {call->creator, call->request_id};
        ka_pg_stmt_t st = {"sb_receipt", 2, p};
        int rc = ka_pgconn_submit(call->self->eng, &st, 1, 0, s_done_sandbox, call);
        free(call->creator);
        call->creator = NULL;
        if (rc == 0)
            return;
        s_call_err(call, KA_STORE_EUNAVAIL, "database unavailable");
        free(call);
        return;
    }
    free(call->creator);
    if (out->err) {
        s_call_err(call, s_map_err(out), out->message);
        free(call);
        return;
    }
    ka_store_sandbox_reply_t rep;
    memset(&rep, 0, sizeof(rep));
    if (PQntuples(r) == 1) {
        s_row_sandbox(r, 0, &rep.sandbox);
        rep.created = PQgetvalue(r, 0, 16)[0] == 't';
        if (rep.created)
            ka_phase_record(rep.sandbox.id, KA_PHASE_STORE_INTENT, ka_metric_now() - call->began);
        s_reply_to(call->self, call->from, call->ref, call->type, &rep, sizeof(rep));
    } else {
        s_call_err(call, KA_STORE_EDB, "create: receipt row not found");
    }
    free(call);
}

static void s_done_sandbox_list(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    if (out->err) {
        s_call_err(call, s_map_err(out), out->message);
        free(call);
        return;
    }
    const PGresult *r = out->results[0];
    int n = PQntuples(r);
    int more = n > call->limit;
    if (more)
        n = call->limit;
    size_t len = sizeof(ka_store_sandbox_list_t) + sizeof(ka_store_sandbox_t) * (size_t)n;
    ka_store_sandbox_list_t *l = calloc(1, len);
    if (!l) {
        s_call_err(call, -ENOMEM, "out of memory");
        free(call);
        return;
    }
    l->count = (uint32_t)n;
    l->more = more;
    for (int i = 0; i < n; i++)
        s_row_sandbox(r, i, &l->items[i]);
    s_reply_to(call->self, call->from, call->ref, call->type, l, len);
    free(l);
    free(call);
}

/* Templates and revisions: results[idx] holds the rows to return. */
static void s_done_blob(s_call_t *call, const ka_pg_outcome_t *out, int idx, bool templates)
{
    if (out->err) {
        s_call_err(call, s_map_err(out), out->message);
        return;
    }
    const PGresult *r = s_res(out, idx);
    int n = r ? PQntuples(r) : 0;
    int more = call->limit > 0 && n > call->limit;
    if (more)
        n = call->limit;
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += templates ? s_template_size(r, i) : s_revision_size(r, i);
    size_t len = sizeof(ka_store_blob_t) + bytes;
    ka_store_blob_t *b = calloc(1, len);
    if (!b) {
        s_call_err(call, -ENOMEM, "out of memory");
        return;
    }
    b->count = (uint32_t)n;
    b->bytes = (uint32_t)bytes;
    b->more = more;
    unsigned char *p = b->data;
    for (int i = 0; i < n; i++) {
        if (templates) {
            s_row_template(r, i, (ka_store_template_t *)(void *)p);
            p += ((ka_store_template_t *)(void *)p)->size;
        } else {
            s_row_revision(r, i, (ka_store_revision_t *)(void *)p);
            p += ((ka_store_revision_t *)(void *)p)->size;
        }
    }
    if (n == 0 && call->limit == 0)
        s_call_err(call, KA_STORE_ENOTFOUND,
                   templates ? "template not found" : "revision not found");
    else
        s_reply_to(call->self, call->from, call->ref, call->type, b, len);
    free(b);
}

static void s_done_template(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    s_done_blob(call, out, 0, true);
    free(call);
}

static void s_done_revision(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    s_done_blob(call, out, out->nresults - 1, false); /* the last statement reads the row */
    free(call);
}

static void s_done_pools(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    if (out->err) {
        s_call_err(call, s_map_err(out), out->message);
        free(call);
        return;
    }
    const PGresult *r = out->results[0];
    int n = PQntuples(r);
    size_t len = sizeof(ka_store_pool_list_t) + sizeof(ka_store_pool_t) * (size_t)n;
    ka_store_pool_list_t *l = calloc(1, len);
    if (l) {
        l->count = (uint32_t)n;
        for (int i = 0; i < n; i++) {
            s_cpy(l->items[i].name, sizeof(l->items[i].name), r, i, 0);
            s_cpy(l->items[i].sandbox_class, sizeof(l->items[i].sandbox_class), r, i, 1);
            l->items[i].capacity = (int32_t)s_i64(r, i, 2);
            l->items[i].updated_ms = s_i64(r, i, 3);
        }
        s_reply_to(call->self, call->from, call->ref, call->type, l, len);
        free(l);
    } else {
        s_call_err(call, -ENOMEM, "out of memory");
    }
    free(call);
}

static void s_done_nodes(void *user, const ka_pg_outcome_t *out)
{
    s_call_t *call = user;
    if (out->err) {
        s_call_err(call, s_map_err(out), out->message);
        free(call);
        return;
    }
    const PGresult *r = out->results[0];
    int n = PQntuples(r);
    if (n == 0 && (call->type == KA_STORE_NODE_HEARTBEAT || call->type == KA_STORE_NODE_DRAIN)) {
        s_call_err(call, KA_STORE_ENOTFOUND,
                   call->type == KA_STORE_NODE_DRAIN
                       ? "no such node"
                       : "no lease to renew (lapsed, or another incarnation)");
        free(call);
        return;
    }
    size_t len = sizeof(ka_store_node_list_t) + sizeof(ka_store_node_t) * (size_t)n;
    ka_store_node_list_t *l = calloc(1, len);
    if (l) {
        l->count = (uint32_t)n;
        for (int i = 0; i < n; i++)
            s_row_node(r, i, &l->items[i]);
        s_reply_to(call->self, call->from, call->ref, call->type, l, len);
        free(l);
    } else {
        s_call_err(call, -ENOMEM, "out of memory");
    }
    free(call);
}

/* ---------------------------------------------------------------------------------------- */
/* Requests                                                                                 */

/* True if the fixed string field is NUL-terminated (and, if required, non-empty). */
static bool s_str_ok(const char *f, size_t cap, bool required)
{
    size_t n = strnlen(f, cap);
    return n < cap && (!required || n > 0);
}
#define S_STR(field, req) s_str_ok((field), sizeof(field), (req))

static bool s_uuid_ok(const char *id)
{
    if (strnlen(id, KA_STORE_ID_LEN) != 36)
        return false;
    for (int i = 0; i < 36; i++) {
        char c = id[i];
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? c != '-'
                 : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return false;
    }
    return true;
}

static int s_limit(int32_t limit)
{
    return limit <= 0 || limit > KA_STORE_LIST_MAX ? KA_STORE_LIST_MAX : limit;
}

/* Submits stmts for msg; replies with an error itself if that fails. keep (optional) is a
 * "creator\0request_id" copy the completion may need (ownership moves to the call). */
static void s_submit_keep(s_store_t *self, const krt_msg_t *msg, const ka_pg_stmt_t *stmts, int n,
                          ka_pg_done_fn done, int32_t limit, char *keep)
{
    s_call_t *call = malloc(sizeof(*call));
    if (!call) {
        free(keep);
        s_reply_err(self, msg->from, msg->ref, -ENOMEM, "out of memory");
        return;
    }
    *call = (s_call_t){.self = self,
                       .from = msg->from,
                       .ref = msg->ref,
                       .type = msg->type,
                       .limit = limit,
                       .creator = keep,
                       .request_id = keep ? keep + strlen(keep) + 1 : NULL,
                       .began = ka_metric_now()};
    int rc = self->eng ? ka_pgconn_submit(self->eng, stmts, n, 0, done, call) : KA_PG_EUNAVAIL;
    if (rc) {
        s_call_err(call,
                   rc == KA_PG_EUNAVAIL ? KA_STORE_EUNAVAIL
                   : rc == -EINVAL      ? KA_STORE_EINVAL
                                        : rc,
                   rc == KA_PG_EUNAVAIL ? "database unavailable" : "request not accepted");
        free(call->creator);
        free(call);
    }
}

static void s_submit(s_store_t *self, const krt_msg_t *msg, const ka_pg_stmt_t *stmts, int n,
                     ka_pg_done_fn done, int32_t limit)
{
    s_submit_keep(self, msg, stmts, n, done, limit, NULL);
}

#define S_BODY(T, var)                                                                             \
    const T *var = msg->body;                                                                      \
    if (msg->len < sizeof(T) || !msg->body) {                                                      \
        s_reply_err(self, msg->from, msg->ref, KA_STORE_EINVAL, "bad request body");               \
        return;                                                                                    \
    }

#define S_INVALID(what)                                                                            \
    do {                                                                                           \
        s_reply_err(self, msg->from, msg->ref, KA_STORE_EINVAL, what);                             \
        return;                                                                                    \
    } while (0)

static void s_sandbox_create(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_sandbox_create_t, b);
    if (!S_STR(b->creator, true) || !S_STR(b->request_id, true) || !S_STR(b->name, false) ||
        !S_STR(b->template_namespace, true) || !S_STR(b->template_name, true) ||
        !S_STR(b->revision, false) || !S_STR(b->node, false) || b->ttl_ms <= 0)
        S_INVALID("create: creator, request_id, template and a positive ttl are required");
    if (!S_STR(b->id, false) || (b->id[0] && !s_uuid_ok(b->id)))
        S_INVALID("create: id must be empty or a UUID");
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%lld", (long long)b->ttl_ms);
    const char *p[10] = {b->creator,
                         b->request_id,
                         b->name,
                         b->template_namespace,
                         b->template_name,
                         b->revision,
                         b->node,
                         ttl,
                         b->id,
                         b->ready ? "true" : "false"};
    ka_pg_stmt_t st = {"sb_create", 10, p};
    size_t lc = strlen(b->creator), lr = strlen(b->request_id);
    char *keep = malloc(lc + lr + 2);
    if (!keep) {
        s_reply_err(self, msg->from, msg->ref, -ENOMEM, "out of memory");
        return;
    }
    memcpy(keep, b->creator, lc + 1);
    memcpy(keep + lc + 1, b->request_id, lr + 1);
    s_submit_keep(self, msg, &st, 1, s_done_create, 0, keep);
}

static void s_sandbox_receipt(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_receipt_key_t, b);
    if (!S_STR(b->creator, true) || !S_STR(b->request_id, true))
        S_INVALID("receipt: creator and request_id are required");
    const char *p[2] = {b->creator, b->request_id};
    ka_pg_stmt_t st = {"sb_receipt", 2, p};
    s_submit(self, msg, &st, 1, s_done_sandbox, 0);
}

static void s_sandbox_get_delete(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_sandbox_key_t, b);
    if (!S_STR(b->id, true) || !S_STR(b->creator, false))
        S_INVALID("sandbox id required");
    if (!s_uuid_ok(b->id)) {
        s_reply_err(self, msg->from, msg->ref, KA_STORE_ENOTFOUND,
                    "sandbox not found (id is not a UUID)");
        return;
    }
    char inc[32];
    if (!S_STR(b->node, false) || !S_STR(b->fence.node_id, false))
        S_INVALID("bad node or fence");
    snprintf(inc, sizeof inc, "%lld", (long long)b->fence.incarnation);
    const char *p[5] = {b->id, b->creator, b->node, b->fence.node_id, inc};
    if (msg->type == KA_STORE_SANDBOX_GET) {
        ka_pg_stmt_t st = {"sb_get", 2, p};
        s_submit(self, msg, &st, 1, s_done_sandbox, 0);
    } else {
        ka_pg_stmt_t st[2] = {{"sb_delete", 5, p}, {"sb_tombstone", 1, p}};
        s_submit(self, msg, st, 2, s_done_sandbox, 0);
    }
}

static void s_sandbox_list(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_sandbox_query_t, b);
    if (!S_STR(b->creator, false) || !S_STR(b->template_namespace, false) ||
        !S_STR(b->template_name, false) || !S_STR(b->node, false) || b->offset < 0)
        S_INVALID("bad list query");
    int limit = s_limit(b->limit);
    char lim[16], off[16];
    snprintf(lim, sizeof(lim), "%d", limit + 1);
    snprintf(off, sizeof(off), "%d", b->offset);
    const char *p[7] = {b->creator,
                        b->template_namespace,
                        b->template_name,
                        b->include_deleted ? "true" : "false",
                        lim,
                        off,
                        b->node};
    ka_pg_stmt_t st = {"sb_list", 7, p};
    s_submit(self, msg, &st, 1, s_done_sandbox_list, limit);
}

static void s_sandbox_expiry(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_expiry_query_t, b);
    if (b->offset < 0)
        S_INVALID("bad expiry query");
    int limit = s_limit(b->limit);
    char lim[16], off[16];
    snprintf(lim, sizeof(lim), "%d", limit + 1);
    snprintf(off, sizeof(off), "%d", b->offset);
    const char *p[3] = {b->expired ? "true" : "false", lim, off};
    ka_pg_stmt_t st = {"sb_expiry", 3, p};
    s_submit(self, msg, &st, 1, s_done_sandbox_list, limit);
}

static void s_sandbox_update(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_sandbox_update_t, b);
    if (!S_STR(b->id, true) || !S_STR(b->failure_reason, false) ||
        !S_STR(b->failure_message, false) || !S_STR(b->node, false) ||
        !S_STR(b->expect_node, false) || !S_STR(b->fence.node_id, false))
        S_INVALID("bad update");
    const char *state = (b->set & KA_SB_SET_STATE) ? ka_state_name(b->state) : NULL;
    const char *op = (b->set & KA_SB_SET_OPERATION) ? ka_op_name(b->operation) : NULL;
    const char *expect = b->expect_state >= 0 ? ka_state_name(b->expect_state) : NULL;
    if (((b->set & KA_SB_SET_STATE) && !state) || ((b->set & KA_SB_SET_OPERATION) && !op) ||
        (b->expect_state >= 0 && !expect))
        S_INVALID("unknown state or operation");
    if (!s_uuid_ok(b->id)) {
        s_reply_err(self, msg->from, msg->ref, KA_STORE_ENOTFOUND,
                    "sandbox not found (id is not a UUID)");
        return;
    }
    bool fail = b->set & KA_SB_SET_FAILURE;
    char inc[32];
    snprintf(inc, sizeof inc, "%lld", (long long)b->fence.incarnation);
    const char *p[10] = {b->id,
                         state,
                         op,
                         fail ? b->failure_reason : NULL,
                         fail ? b->failure_message : NULL,
                         (b->set & KA_SB_SET_NODE) ? b->node : NULL,
                         expect,
                         b->expect_node,
                         b->fence.node_id,
                         inc};
    const char *g[2] = {b->id, ""};
    ka_pg_stmt_t st[2] = {{"sb_update", 10, p}, {"sb_get", 2, g}};
    s_submit(self, msg, st, 2, s_done_sandbox, 0);
}

/* Variable-length bodies: the text must fit in the message and end with NUL. */
static bool s_text_ok(const krt_msg_t *msg, size_t fixed, uint32_t text_len)
{
    if (msg->len < fixed || (size_t)text_len + 1 > msg->len - fixed)
        return false;
    return ((const char *)msg->body)[fixed + text_len] == '\0';
}

static void s_template_put(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_template_put_t, b);
    if (!S_STR(b->namespace_, true) || !S_STR(b->name, true) ||
        !s_text_ok(msg, offsetof(ka_store_template_put_t, spec), b->spec_len))
        S_INVALID("template put: namespace, name and spec required");
    const char *p[3] = {b->namespace_, b->name, b->spec};
    ka_pg_stmt_t st = {"tp_put", 3, p};
    s_submit(self, msg, &st, 1, s_done_template, 0);
}

static void s_template_status(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_template_status_t, b);
    if (!S_STR(b->namespace_, true) || !S_STR(b->name, true) ||
        !S_STR(b->desired_revision, false) || !S_STR(b->latest_revision, false) ||
        !s_text_ok(msg, offsetof(ka_store_template_status_t, status), b->status_len))
        S_INVALID("template status: bad body");
    char gen[32];
    snprintf(gen, sizeof(gen), "%lld", (long long)b->observed_generation);
    const char *p[6] = {
        b->namespace_,       b->name,           b->status_len ? b->status : "{}", gen,
        b->desired_revision, b->latest_revision};
    ka_pg_stmt_t st = {"tp_status", 6, p};
    s_submit(self, msg, &st, 1, s_done_template, 0);
}

static void s_template_key(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_template_key_t, b);
    bool list = msg->type == KA_STORE_TEMPLATE_LIST;
    if (!S_STR(b->namespace_, !list) || !S_STR(b->name, !list) || b->offset < 0)
        S_INVALID("template key: namespace and name required");
    const char *incl = b->include_deleted ? "true" : "false";
    if (list) {
        int limit = s_limit(b->limit);
        char lim[16], off[16];
        snprintf(lim, sizeof(lim), "%d", limit + 1);
        snprintf(off, sizeof(off), "%d", b->offset);
        const char *p[4] = {b->namespace_, incl, lim, off};
        ka_pg_stmt_t st = {"tp_list", 4, p};
        s_submit(self, msg, &st, 1, s_done_template, limit);
    } else if (msg->type == KA_STORE_TEMPLATE_GET) {
        const char *p[3] = {b->namespace_, b->name, incl};
        ka_pg_stmt_t st = {"tp_get", 3, p};
        s_submit(self, msg, &st, 1, s_done_template, 0);
    } else {
        const char *p[2] = {b->namespace_, b->name};
        ka_pg_stmt_t st = {"tp_delete", 2, p};
        s_submit(self, msg, &st, 1, s_done_template, 0);
    }
}

static void s_revision_put(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_revision_put_t, b);
    const char *state = ka_rev_state_name(b->state);
    if (!S_STR(b->hash, true) || !S_STR(b->namespace_, true) || !S_STR(b->name, true) ||
        !S_STR(b->reason, false) || !S_STR(b->message, false) || !state ||
        !s_text_ok(msg, offsetof(ka_store_revision_put_t, spec), b->spec_len))
        S_INVALID("revision put: bad body");
    char gen[32];
    snprintf(gen, sizeof(gen), "%lld", (long long)b->generation);
    const char *p[8] = {b->hash, b->namespace_, b->name,    gen,
                        state,   b->reason,     b->message, b->spec};
    ka_pg_stmt_t st[2] = {{"rv_ins", 8, p}, {"rv_get", 1, p}};
    s_submit(self, msg, st, 2, s_done_revision, 0);
}

static void s_revision_state(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_revision_state_t, b);
    const char *state = ka_rev_state_name(b->state);
    if (!S_STR(b->hash, true) || !S_STR(b->reason, false) || !S_STR(b->message, false) || !state)
        S_INVALID("revision state: bad body");
    const char *p[4] = {b->hash, state, b->reason, b->message};
    ka_pg_stmt_t st[3] = {{"rv_state", 4, p}, {"rv_latest", 1, p}, {"rv_get", 1, p}};
    s_submit(self, msg, st, 3, s_done_revision, 0);
}

static void s_revision_get(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_revision_key_t, b);
    if (!S_STR(b->hash, true))
        S_INVALID("revision hash required");
    const char *p[1] = {b->hash};
    ka_pg_stmt_t st = {"rv_get", 1, p};
    s_submit(self, msg, &st, 1, s_done_revision, 0);
}

static void s_pool(s_store_t *self, const krt_msg_t *msg)
{
    if (msg->type == KA_STORE_POOL_LIST) {
        ka_pg_stmt_t st = {"pool_list", 0, NULL};
        s_submit(self, msg, &st, 1, s_done_pools, 0);
        return;
    }
    S_BODY(ka_store_pool_t, b);
    if (!S_STR(b->name, true) || !S_STR(b->sandbox_class, true) || b->capacity < 0)
        S_INVALID("pool: name and class required");
    char cap[16];
    snprintf(cap, sizeof(cap), "%d", b->capacity);
    const char *p[3] = {b->name, b->sandbox_class, cap};
    ka_pg_stmt_t st = {"pool_put", 3, p};
    s_submit(self, msg, &st, 1, s_done_pools, 0);
}

static void s_node(s_store_t *self, const krt_msg_t *msg)
{
    if (msg->type == KA_STORE_NODE_LIST) {
        ka_pg_stmt_t st = {"node_list", 0, NULL};
        s_submit(self, msg, &st, 1, s_done_nodes, 0);
        return;
    }
    char lease[32], inc[32];
    if (msg->type == KA_STORE_NODE_DRAIN) {
        S_BODY(ka_store_node_heartbeat_t, b);
        if (!S_STR(b->id, true))
            S_INVALID("drain: the node id is required");
        const char *p[1] = {b->id};
        ka_pg_stmt_t st = {"node_drain", 1, p};
        s_submit(self, msg, &st, 1, s_done_nodes, 0);
        return;
    }
    if (msg->type == KA_STORE_NODE_HEARTBEAT || msg->type == KA_STORE_NODE_FORGET) {
        S_BODY(ka_store_node_heartbeat_t, b);
        if (!S_STR(b->id, true) || b->lease_ms < 0)
            S_INVALID("heartbeat: id and lease required");
        snprintf(lease, sizeof(lease), "%lld", (long long)b->lease_ms);
        snprintf(inc, sizeof(inc), "%lld", (long long)b->incarnation);
        bool forget = msg->type == KA_STORE_NODE_FORGET;
        const char *p[3] = {b->id, forget ? inc : lease, forget ? lease : inc};
        ka_pg_stmt_t st = {forget ? "node_forget" : "node_hb", 3, p};
        s_submit(self, msg, &st, 1, s_done_nodes, 0);
        return;
    }
    S_BODY(ka_store_node_t, b);
    if (!S_STR(b->id, true) || !S_STR(b->name, true) || !S_STR(b->endpoint, false) ||
        !S_STR(b->mesh_endpoint, false) || !S_STR(b->public_key, false) ||
        !S_STR(b->pools, false) || b->lease_ms <= 0 || b->capacity < 0)
        S_INVALID("node: id, name and lease required");
    char cap[16];
    snprintf(cap, sizeof(cap), "%d", b->capacity);
    snprintf(lease, sizeof(lease), "%lld", (long long)b->lease_ms);
    const char *p[8] = {b->id,         b->name,  b->endpoint, b->mesh_endpoint,
                        b->public_key, b->pools, cap,         lease};
    ka_pg_stmt_t st = {"node_put", 8, p};
    s_submit(self, msg, &st, 1, s_done_nodes, 0);
}

static void s_node_takeover(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_takeover_t, b);
    if (!S_STR(b->node_id, true) || !S_STR(b->taker_id, true) || !S_STR(b->taker, true) ||
        !S_STR(b->reason, true) || !S_STR(b->message, false))
        S_INVALID("takeover: the node, the taker and a reason are required");
    int limit = s_limit(b->limit);
    char inc[32], tinc[32], lim[16];
    snprintf(inc, sizeof inc, "%lld", (long long)b->incarnation);
    snprintf(tinc, sizeof tinc, "%lld", (long long)b->taker_incarnation);
    snprintf(lim, sizeof lim, "%d", limit);
    const char *p[8] = {b->node_id, inc, b->taker, b->taker_id, tinc, b->reason, b->message, lim};
    ka_pg_stmt_t st = {"node_takeover", 8, p};
    s_submit(self, msg, &st, 1, s_done_sandbox_list, limit);
}

static void s_subscribe(s_store_t *self, const krt_msg_t *msg)
{
    S_BODY(ka_store_subscribe_t, b);
    krt_addr_t who = b->who ? b->who : msg->from;
    bool known = false;
    for (int i = 0; i < self->nsubs; i++)
        known |= self->subs[i] == who;
    if (who == KRT_ADDR_NONE) {
        s_reply_err(self, msg->from, msg->ref, KA_STORE_EINVAL, "no subscriber address");
        return;
    }
    if (!known && self->nsubs == S_MAX_SUBS) {
        s_reply_err(self, msg->from, msg->ref, -ENOSPC, "too many subscribers");
        return;
    }
    if (!known)
        self->subs[self->nsubs++] = who;
    s_reply_to(self, msg->from, msg->ref, msg->type, NULL, 0);
}

static void s_info(s_store_t *self, const krt_msg_t *msg)
{
    ka_store_info_t info;
    memset(&info, 0, sizeof(info));
    info.conn_state = self->eng ? (int32_t)ka_pgconn_state(self->eng) : KA_PG_IDLE;
    info.schema_version = self->schema_version;
    if (self->eng)
        ka_pgconn_stats(self->eng, &info.stats);
    s_reply_to(self, msg->from, msg->ref, msg->type, &info, sizeof(info));
}

static void s_dispatch(s_store_t *self, const krt_msg_t *msg)
{
    switch (msg->type) {
    case KA_STORE_SANDBOX_CREATE:
        s_sandbox_create(self, msg);
        break;
    case KA_STORE_SANDBOX_GET:
    case KA_STORE_SANDBOX_DELETE:
        s_sandbox_get_delete(self, msg);
        break;
    case KA_STORE_SANDBOX_RECEIPT:
        s_sandbox_receipt(self, msg);
        break;
    case KA_STORE_SANDBOX_LIST:
        s_sandbox_list(self, msg);
        break;
    case KA_STORE_SANDBOX_UPDATE:
        s_sandbox_update(self, msg);
        break;
    case KA_STORE_SANDBOX_EXPIRY:
        s_sandbox_expiry(self, msg);
        break;
    case KA_STORE_TEMPLATE_PUT:
        s_template_put(self, msg);
        break;
    case KA_STORE_TEMPLATE_STATUS:
        s_template_status(self, msg);
        break;
    case KA_STORE_TEMPLATE_GET:
    case KA_STORE_TEMPLATE_LIST:
    case KA_STORE_TEMPLATE_DELETE:
        s_template_key(self, msg);
        break;
    case KA_STORE_REVISION_PUT:
        s_revision_put(self, msg);
        break;
    case KA_STORE_REVISION_STATE:
        s_revision_state(self, msg);
        break;
    case KA_STORE_REVISION_GET:
        s_revision_get(self, msg);
        break;
    case KA_STORE_POOL_PUT:
    case KA_STORE_POOL_LIST:
        s_pool(self, msg);
        break;
    case KA_STORE_NODE_TAKEOVER:
        s_node_takeover(self, msg);
        break;
    case KA_STORE_NODE_DRAIN:
    case KA_STORE_NODE_FORGET:
    case KA_STORE_NODE_PUT:
    case KA_STORE_NODE_HEARTBEAT:
    case KA_STORE_NODE_LIST:
        s_node(self, msg);
        break;
    default:
        break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Engine plumbing                                                                          */

static void s_hook_fd_closing(void *user, int fd)
{
    s_store_t *self = user;
    if (self->watching && self->wfd == fd && self->ctx)
        krt_fd_unwatch(self->ctx, fd);
    self->watch_gen++; /* readiness events still queued for the old socket are stale */
    if (self->wfd == fd) {
        self->watching = false;
        self->wfd = -1;
        self->wev = 0;
    }
}

/* Copies s for a quoted log value: newlines become spaces, double quotes single ones. */
static void s_log_value(char *out, size_t cap, const char *s)
{
    size_t j = 0;
    for (; s && *s && j + 1 < cap; s++)
        out[j++] = *s == '\n' || *s == '\r' || *s == '\t' ? ' ' : *s == '"' ? '\'' : *s;
    while (j > 0 && out[j - 1] == ' ')
        j--;
    out[j] = '\0';
}

static void s_hook_state(void *user, ka_pgconn_state_t st, const char *message)
{
    s_store_t *self = user;
    if (!self->ctx)
        return;
    if (st == KA_PG_READY) {
        krt_log_actor(self->ctx, KRT_LOG_INFO, "db_connected", "state=ready");
        self->logged_down = false;
    } else if (st == KA_PG_BACKOFF) {
        /* the first failure is a warning; the retries that follow are debug noise */
        char why[512];
        s_log_value(why, sizeof(why), message);
        krt_log_actor(self->ctx, self->logged_down ? KRT_LOG_DEBUG : KRT_LOG_WARN, "db_unavailable",
                      "why=\"%s\"", why);
        self->logged_down = true;
    }
}

static void s_hook_notify(void *user, const char *channel, const char *payload)
{
    s_store_t *self = user;
    if (!self->ctx)
        return;
    ka_store_event_t ev;
    memset(&ev, 0, sizeof(ev));
    snprintf(ev.channel, sizeof(ev.channel), "%s", channel);
    snprintf(ev.payload, sizeof(ev.payload), "%s", payload);
    for (int i = 0; i < self->nsubs;) {
        int rc = krt_send(self->ctx, self->subs[i], KA_STORE_EVENT, &ev, sizeof(ev));
        if (rc == KRT_ENOACTOR) {
            self->subs[i] = self->subs[--self->nsubs];
            continue;
        }
        i++;
    }
}

/* After every turn: watch what the engine waits for and arm its deadline. */
static void s_sync_io(s_store_t *self, krt_ctx_t *ctx)
{
    if (!self->eng)
        return;
    int fd;
    uint32_t ev;
    int64_t delay;
    ka_pgconn_interest(self->eng, &fd, &ev, &delay);
    uint32_t kev = ((ev & KA_PG_READ) ? KRT_FD_READ : 0) | ((ev & KA_PG_WRITE) ? KRT_FD_WRITE : 0);
    if (self->watching && (fd != self->wfd || kev != self->wev)) {
        krt_fd_unwatch(ctx, self->wfd);
        self->watching = false;
    }
    if (!self->watching && fd >= 0 && kev) {
        int rc = krt_fd_watch(ctx, fd, kev, self->watch_gen);
        if (rc == 0) {
            self->watching = true;
            self->wfd = fd;
            self->wev = kev;
        } else {
            krt_log_actor(ctx, KRT_LOG_ERROR, "fd_watch_failed", "fd=%d err=%s", fd,
                          krt_strerror(rc));
            if (delay < 0 || delay > 10)
                delay = 10; /* poll the engine instead */
        }
    }
    if (delay >= 0) {
        uint64_t at = krt_now_ms() + (uint64_t)delay;
        if (!krt_timer_armed(&self->tick) || at < self->tick_at || at > self->tick_at + 5) {
            krt_timer_arm(ctx, &self->tick, (uint64_t)delay, S_MSG_TICK, 0);
            self->tick_at = at;
        }
    } else if (krt_timer_armed(&self->tick)) {
        krt_timer_cancel(ctx, &self->tick);
    }
}

static int s_engine_start(s_store_t *self, krt_ctx_t *ctx)
{
    ka_pgconn_hooks_t hooks = {.user = self,
                               .fd_closing = s_hook_fd_closing,
                               .state = s_hook_state,
                               .notify = s_hook_notify};
    self->eng = ka_pgconn_new(self->conninfo, &self->opts, &hooks);
    if (!self->eng)
        return -ENOMEM;
    int rc = ka_store_sql_register(self->eng);
    if (!rc)
        rc = ka_pgconn_listen(self->eng, "ka_sandbox");
    if (!rc)
        rc = ka_pgconn_listen(self->eng, "ka_template");
    if (!rc)
        rc = ka_pgconn_start(self->eng);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Migrations (job thread) and parked requests                                              */

static void s_job_unref(s_job_t *job)
{
    if (atomic_fetch_sub(&job->refs, 1) == 1) {
        free(job->conninfo);
        free(job);
    }
}

static int s_migrate_job(void *arg)
{
    s_job_t *job = arg;
    int to = 0;
    int rc = ka_schema_migrate_url(job->conninfo, NULL, &to, job->err, sizeof(job->err));
    job->version = to;
    s_job_unref(job);
    return rc;
}

static int s_migrate_start(s_store_t *self, krt_ctx_t *ctx)
{
    s_job_t *job = calloc(1, sizeof(*job));
    if (!job)
        return -ENOMEM;
    job->conninfo = strdup(self->conninfo);
    if (!job->conninfo) {
        free(job);
        return -ENOMEM;
    }
    atomic_init(&job->refs, 2);
    /* matched by arg on JOB_DONE, so no ref is needed */
    int rc = krt_job_submit(ctx, s_migrate_job, job, NULL);
    if (rc) {
        free(job->conninfo);
        free(job);
        return rc;
    }
    self->job = job;
    return 0;
}

static void s_park(s_store_t *self, const krt_msg_t *msg)
{
    if (self->nparked >= S_MAX_PARKED) {
        s_reply_err(self, msg->from, msg->ref, KA_STORE_EUNAVAIL,
                    "database unavailable: store still starting");
        return;
    }
    s_parked_t *p = malloc(sizeof(*p) + msg->len);
    if (!p) {
        s_reply_err(self, msg->from, msg->ref, -ENOMEM, "out of memory");
        return;
    }
    p->next = NULL;
    p->msg = *msg;
    if (msg->len && msg->body)
        memcpy(p->data, msg->body, msg->len);
    p->msg.body = p->data;
    if (self->parked_tail)
        self->parked_tail->next = p;
    else
        self->parked_head = p;
    self->parked_tail = p;
    self->nparked++;
}

/* Dispatches (engine up) or fails (err != 0) every parked request. */
static void s_unpark(s_store_t *self, int err, const char *why)
{
    s_parked_t *p = self->parked_head;
    self->parked_head = self->parked_tail = NULL;
    self->nparked = 0;
    while (p) {
        s_parked_t *next = p->next;
        if (err)
            s_reply_err(self, p->msg.from, p->msg.ref, err, why);
        else
            s_dispatch(self, &p->msg);
        free(p);
        p = next;
    }
}

static void s_on_migrated(s_store_t *self, krt_ctx_t *ctx, int result)
{
    s_job_t *job = self->job;
    self->job = NULL;
    if (result == 0) {
        self->schema_version = job->version;
        krt_log_actor(ctx, KRT_LOG_INFO, "schema_ready", "version=%d", job->version);
        s_job_unref(job);
        int rc = s_engine_start(self, ctx);
        if (rc) {
            krt_log_actor(ctx, KRT_LOG_ERROR, "engine_start_failed", "err=%s", krt_strerror(rc));
            s_unpark(self, KA_STORE_EUNAVAIL, "database unavailable: engine failed to start");
            krt_exit(ctx, KRT_EXIT_ERROR);
            return;
        }
        s_unpark(self, 0, NULL);
        return;
    }
    if (result == KA_SCHEMA_ENEWER) {
        char why[512];
        s_log_value(why, sizeof(why), job->err);
        krt_log_actor(ctx, KRT_LOG_ERROR, "schema_newer", "why=\"%s\"", why);
        s_unpark(self, KA_STORE_EUNAVAIL, job->err);
        s_job_unref(job);
        krt_exit(ctx, KA_STORE_EXIT_SCHEMA_NEWER);
        return;
    }
    char quoted[512];
    s_log_value(quoted, sizeof(quoted), job->err);
    krt_log_actor(ctx, self->logged_down ? KRT_LOG_DEBUG : KRT_LOG_WARN, "migrate_failed",
                  "retry_ms=%d why=\"%s\"", self->migrate_backoff_ms, quoted);
    self->logged_down = true;
    char why[600];
    snprintf(why, sizeof(why), "database unavailable: %s", job->err);
    s_unpark(self, KA_STORE_EUNAVAIL, why);
    s_job_unref(job);
    krt_timer_arm(ctx, &self->migrate_timer, (uint64_t)self->migrate_backoff_ms,
                  S_MSG_MIGRATE_RETRY, 0);
    self->migrate_backoff_ms *= 2;
    if (self->migrate_backoff_ms > self->opts.backoff_max_ms)
        self->migrate_backoff_ms = self->opts.backoff_max_ms;
}

/* ---------------------------------------------------------------------------------------- */
/* Behaviour                                                                                */

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_store_t *self = state;
    const ka_store_args_t *args = arg;
    self->ctx = ctx;
    self->wfd = -1;
    self->conninfo = strdup(args && args->conninfo ? args->conninfo : "");
    if (!self->conninfo)
        return KRT_ENOMEM;
    if (args)
        self->opts = args->opts;
    if (self->opts.backoff_min_ms <= 0)
        self->opts.backoff_min_ms = 50;
    if (self->opts.backoff_max_ms <= 0)
        self->opts.backoff_max_ms = 2000;
    self->migrate_backoff_ms = self->opts.backoff_min_ms;
    self->skip_migrate = args && args->skip_migrate;
    int rc;
    if (self->skip_migrate) {
        rc = s_engine_start(self, ctx);
        if (!rc)
            s_sync_io(self, ctx);
    } else {
        rc = s_migrate_start(self, ctx);
    }
    self->ctx = NULL;
    if (rc) {
        ka_pgconn_destroy(&self->eng);
        free(self->conninfo);
        self->conninfo = NULL;
        return KRT_EXIT_ERROR;
    }
    return 0;
}

static bool s_is_request(uint32_t type)
{
    return type > KA_STORE_MSG_BASE && type < KA_STORE_MSG_LAST_ && type != KA_STORE_EVENT &&
           type != KA_STORE_SUBSCRIBE && type != KA_STORE_INFO;
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_store_t *self = state;
    self->ctx = ctx;
    switch (msg->type) {
    case KRT_MSG_FD_READY: {
        const krt_fd_event_t *ev = msg->body;
        if (!ev || ev->tag != self->watch_gen)
            break; /* about a closed socket; the current watch is still armed */
        self->watching = false;
        if (self->eng && ev->fd == self->wfd) {
            uint32_t e = ((ev->events & KRT_FD_READ) ? KA_PG_READ : 0) |
                         ((ev->events & KRT_FD_WRITE) ? KA_PG_WRITE : 0);
            ka_pgconn_on_io(self->eng, e ? e : KA_PG_READ | KA_PG_WRITE);
        }
        break;
    }
    case S_MSG_TICK:
        self->tick_at = 0;
        if (self->eng)
            ka_pgconn_on_timer(self->eng);
        break;
    case S_MSG_MIGRATE_RETRY:
        if (!self->eng && !self->job && s_migrate_start(self, ctx) != 0)
            krt_timer_arm(ctx, &self->migrate_timer, (uint64_t)self->migrate_backoff_ms,
                          S_MSG_MIGRATE_RETRY, 0);
        break;
    case KRT_MSG_JOB_DONE: {
        const krt_job_done_t *jd = msg->body;
        if (jd && self->job && jd->arg == self->job)
            s_on_migrated(self, ctx, jd->result);
        break;
    }
    case KA_STORE_SUBSCRIBE:
        s_subscribe(self, msg);
        break;
    case KA_STORE_INFO:
        s_info(self, msg);
        break;
    default:
        if (s_is_request(msg->type)) {
            if (!self->eng && self->job)
                s_park(self, msg);
            else if (!self->eng)
                s_reply_err(self, msg->from, msg->ref, KA_STORE_EUNAVAIL,
                            "database unavailable: schema migration pending");
            else
                s_dispatch(self, msg);
        }
        break;
    }
    s_sync_io(self, ctx);
    self->ctx = NULL;
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_store_t *self = state;
    self->ctx = ctx;
    s_unpark(self, KA_STORE_EUNAVAIL, "database unavailable: store stopping");
    if (self->watching)
        krt_fd_unwatch(ctx, self->wfd);
    self->watching = false;
    ka_pgconn_destroy(&self->eng); /* in-flight requests get KA_STORE_EUNAVAIL replies */
    krt_timer_cancel(ctx, &self->tick);
    krt_timer_cancel(ctx, &self->migrate_timer);
    if (self->job) {
        s_job_unref(self->job); /* the job thread frees it when it returns */
        self->job = NULL;
    }
    free(self->conninfo);
    self->conninfo = NULL;
    self->ctx = NULL;
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_store_t *self = state;
    ka_pgconn_stats_t st = {0};
    if (self->eng)
        ka_pgconn_stats(self->eng, &st);
    snprintf(out, cap,
             "{\"db\":\"%s\",\"schema\":%d,\"pending\":%u,\"inflight\":%u,\"commits\":%llu,"
             "\"requests\":%llu,\"failed\":%llu,\"reconnects\":%llu}",
             self->eng ? ka_pgconn_state_name(ka_pgconn_state(self->eng))
                       : (self->job ? "migrating" : "down"),
             self->schema_version, st.pending, st.inflight, (unsigned long long)st.segments,
             (unsigned long long)st.requests, (unsigned long long)st.failed,
             (unsigned long long)st.losses);
}

const krt_behaviour_t ka_store_behaviour = {
    .kind = "store",
    .state_size = sizeof(s_store_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
