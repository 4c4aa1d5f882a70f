/*
 * The MCP bridge's tools and prompts (reference section 2): argument schemas and checks,
 * translation to the service layer (ka_service), results as MCP CallToolResults. Service errors
 * become results with isError: true and the service's message, so an agent can correct itself.
 * Waiting on the service happens here, on the caller's thread, with a periodic tick (progress).
 */
#include "checks.h"
#include "mcp_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control_msgs.h"
#include "sandboxes.h"
#include "store.h"

/* ---- small helpers -------------------------------------------------------------------------- */

static const char *const s_code_names[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

static const char *s_code_name(int code)
{
    return code >= 0 && code <= KA_UNAUTHENTICATED ? s_code_names[code] : "UNKNOWN";
}

/* A tool error result: "<CODE>: <message>". */
static json_t *s_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *s_error(int code, const char *fmt, ...)
{
    char msg[1024], text[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(text, sizeof text, "%s: %s", s_code_name(code), msg);
    return json_pack("{s:[{s:s,s:s}],s:b,s:{s:s}}", "content", "type", "text", "text", text,
                     "isError", 1, "_meta", "kagent.dev/error-code", s_code_name(code));
}

static json_t *s_status_error(const ka_status_t *st)
{
    return s_error(st->code ? st->code : KA_INTERNAL, "%s",
                   st->message[0] ? st->message : "the call failed");
}

/* A success result: the object as JSON text (and structuredContent). Steals obj. */
static json_t *s_ok(kb_mcp_call_t *c, json_t *obj)
{
    if (!obj)
        return NULL;
    char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_t *r = text ? json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text,
                                 "isError", 0)
                     : NULL;
    free(text);
    if (r && c->structured)
        json_object_set(r, "structuredContent", obj);
    json_decref(obj);
    return r;
}

static const char *s_str(const json_t *args, const char *key, const char *def)
{
    const char *v = json_string_value(json_object_get(args, key));
    return v ? v : def;
}

static int64_t s_int(const json_t *args, const char *key, int64_t def)
{
    const json_t *v = json_object_get(args, key);
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_real(v))
        return (int64_t)json_real_value(v);
    return def;
}

/* Copies s into a fixed field; false when it does not fit. */
static bool s_put(char *dst, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (n >= cap)
        return false;
    memcpy(dst, s, n + 1);
    return true;
}

/* ---- waiting on the service ------------------------------------------------------------------ */

typedef struct s_frame {
    struct s_frame *next;
    size_t len;
    _Alignas(8) unsigned char bytes[]; /* a ka_guest_reply_t and its tail */
} s_frame_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    ka_status_t st;
    void *body;
    size_t len;
    s_frame_t *head, **tail;
} s_wait_t;

static void s_wait_init(s_wait_t *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->tail = &w->head;
}

static void s_wait_fini(s_wait_t *w)
{
    while (w->head) {
        s_frame_t *f = w->head;
        w->head = f->next;
        free(f);
    }
    free(w->body);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* Waits (lock held) until ready(w) or the tick interval passes; runs the tick unlocked. */
static void s_wait_step(kb_mcp_call_t *c, s_wait_t *w)
{
    int ms = c->tick && c->tick_ms > 0 ? c->tick_ms : 1000;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT && c->tick) {
        pthread_mutex_unlock(&w->mu);
        c->tick(c->tick_arg);
        pthread_mutex_lock(&w->mu);
    }
}

static void s_on_unary(void *user, const ka_status_t *st, const void *body, size_t len)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    w->st = *st;
    if (body && len && (w->body = malloc(len))) {
        memcpy(w->body, body, len);
        w->len = len;
    }
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* A unary service call. Returns the status code; *st the status; on success *out and *out_len the
 * reply (malloc'd, caller frees). */
static int s_unary(kb_mcp_call_t *c, uint32_t type, const void *body, size_t len, ka_status_t *st,
                   void **out, size_t *out_len)
{
    s_wait_t w;
    s_wait_init(&w);
    int rc = ka_svc_call(c->svc, type, body, len, 0, s_on_unary, &w);
    if (rc) {
        s_wait_fini(&w);
        memset(st, 0, sizeof *st);
        st->code = KA_UNAVAILABLE;
        snprintf(st->message, sizeof st->message, "the control plane is not running");
        return st->code;
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done) /* the service answers exactly once, within its timeout */
        s_wait_step(c, &w);
    pthread_mutex_unlock(&w.mu);
    *st = w.st;
    if (out && st->code == KA_OK && w.body) {
        *out = w.body;
        *out_len = w.len;
        w.body = NULL;
    }
    s_wait_fini(&w);
    return st->code;
}

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_wait_t *w = user;
    s_frame_t *fr = malloc(sizeof *fr + len);
    pthread_mutex_lock(&w->mu);
    if (fr) {
        fr->next = NULL;
        fr->len = len;
        memcpy(fr->bytes, f, len);
        *w->tail = fr;
        w->tail = &fr->next;
    } else if (f->final) { /* out of memory: still end the wait */
        w->st = f->status;
        w->done = true;
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Takes data frames; returns false when it needs no more (the stream is then cancelled). */
typedef bool (*s_data_fn)(void *u, const ka_guest_reply_t *f);

/* A guest call (q is consumed). Data frames go to on_data; *fin receives the final frame's
 * header, and *tail (when not NULL) a copy of its tail (malloc'd, fin->tail_len bytes; NULL if
 * none). Returns the final status code. */
static int s_guest_tail(kb_mcp_call_t *c, ka_guest_req_t *q, s_data_fn on_data, void *u,
                        ka_guest_reply_t *fin, void **tail)
{
    if (tail)
        *tail = NULL;
    memset(fin, 0, sizeof *fin);
    if (!q) {
        fin->status.code = KA_INTERNAL;
        snprintf(fin->status.message, sizeof fin->status.message, "out of memory");
        return KA_INTERNAL;
    }
    s_wait_t w;
    s_wait_init(&w);
    krt_addr_t stream = KRT_ADDR_NONE;
    int rc = ka_svc_stream(c->svc, q, sizeof *q + q->tail_len, s_on_frame, &w, &stream);
    free(q);
    if (rc) {
        s_wait_fini(&w);
        fin->status.code = KA_UNAVAILABLE;
        snprintf(fin->status.message, sizeof fin->status.message,
                 "the sandbox service is not running");
        return KA_UNAVAILABLE;
    }
    int64_t deadline = krt_mono_ms() + KB_MCP_GUEST_WAIT_MS;
    bool cancelled = false, have_final = false;
    pthread_mutex_lock(&w.mu);
    while (!have_final && !w.done) {
        if (!w.head) {
            if (!cancelled && krt_mono_ms() > deadline) {
                cancelled = true;
                ka_svc_stream_cancel(c->svc, stream);
            }
            s_wait_step(c, &w);
            continue;
        }
        s_frame_t *fr = w.head;
        w.head = fr->next;
        if (!w.head)
            w.tail = &w.head;
        pthread_mutex_unlock(&w.mu);
        const ka_guest_reply_t *f = (const ka_guest_reply_t *)fr->bytes;
        if (f->final) {
            *fin = *f;
            fin->tail_len = 0;
            have_final = true;
            if (tail && f->tail_len && fr->len >= sizeof *f + f->tail_len &&
                (*tail = malloc(f->tail_len))) {
                memcpy(*tail, f->tail, f->tail_len);
                fin->tail_len = f->tail_len;
            }
        } else if (!cancelled && on_data && fr->len >= sizeof *f + f->tail_len && !on_data(u, f)) {
            cancelled = true;
            ka_svc_stream_cancel(c->svc, stream);
        } else {
            ka_svc_stream_ack(c->svc, stream, f->tail_len); /* taken: the guest may send more */
        }
        free(fr);
        pthread_mutex_lock(&w.mu);
    }
    if (!have_final)
        fin->status = w.st;
    pthread_mutex_unlock(&w.mu);
    s_wait_fini(&w);
    return fin->status.code;
}

static int s_guest(kb_mcp_call_t *c, ka_guest_req_t *q, s_data_fn on_data, void *u,
                   ka_guest_reply_t *fin)
{
    return s_guest_tail(c, q, on_data, u, fin, NULL);
}

/* ---- results shared by tools ---------------------------------------------------------------- */

void kb_mcp_rfc3339(int64_t ms, char *out, size_t cap)
{
    time_t sec = (time_t)(ms / 1000);
    int frac = (int)(ms % 1000);
    if (frac < 0) {
        frac += 1000;
        sec--;
    }
    struct tm tm;
    gmtime_r(&sec, &tm);
    char base[64];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!frac) {
        snprintf(out, cap, "%sZ", base);
        return;
    }
    char f[8];
    snprintf(f, sizeof f, "%03d", frac);
    for (int i = 2; i > 0 && f[i] == '0'; i--)
        f[i] = '\0';
    snprintf(out, cap, "%s.%sZ", base, f);
}

/* The reference's sandbox summary. */
static json_t *s_summary(const ka_store_sandbox_t *sb)
{
    char exp[64];
    kb_mcp_rfc3339(sb->expires_ms, exp, sizeof exp);
    const char *state = ka_state_name(sb->state), *op = ka_op_name(sb->operation);
    json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "id", sb->id, "sandbox_template", "namespace",
                          sb->template_namespace, "name", sb->template_name);
    if (!o)
        return NULL;
    if (sb->name[0])
        json_object_set_new(o, "name", json_string(sb->name));
    json_object_set_new(o, "state", json_string(state ? state : "RUNTIME_STATE_UNSPECIFIED"));
    json_object_set_new(o, "operation", json_string(op ? op : "RUNTIME_OPERATION_NONE"));
    json_object_set_new(o, "expires_at", json_string(exp));
    if (sb->failure_reason[0] || sb->failure_message[0])
        json_object_set_new(
            o, "failure",
            json_pack("{s:s,s:s}", "reason", sb->failure_reason, "message", sb->failure_message));
    return o;
}

/* A ka_sbx_reply_t as the tool's result: the summary, with "paused" after a pause or unpause
 * and whenever it is paused. */
static json_t *s_reply_summary(kb_mcp_call_t *c, uint32_t type, const void *body, size_t len)
{
    if (len < sizeof(ka_sbx_reply_t))
        return s_error(KA_INTERNAL, "short reply");
    const ka_sbx_reply_t *rep = body;
    json_t *o = s_summary(&rep->sandbox);
    if (type == KA_SBX_PAUSE || type == KA_SBX_UNPAUSE || rep->paused)
        json_object_set_new(o, "paused", json_boolean(rep->paused != 0));
    return s_ok(c, o);
}

const char *kb_mcp_process_status(int state, int exit_code)
{
    if (state != 2)
        return "PROCESS_STATUS_RUNNING";
    if (exit_code == 0)
        return "PROCESS_STATUS_COMPLETED";
    if (exit_code > 128 && exit_code <= 128 + 64)
        return "PROCESS_STATUS_TERMINATED";
    return "PROCESS_STATUS_FAILED";
}

static json_t *s_process_id(uint64_t proc)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, proc);
    return json_string(b);
}

/* process_id as start_sandbox_process returns it: decimal digits. */
static bool s_parse_proc(const char *s, uint64_t *out)
{
    if (!s || !*s || strlen(s) > 20)
        return false;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        uint64_t d = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* ---- lifecycle tools --------------------------------------------------------------------------
 */

static json_t *t_list_templates(kb_mcp_call_t *c, json_t *args)
{
    ka_tpl_key_t k;
    memset(&k, 0, sizeof k);
    if (!s_put(k.namespace_, sizeof k.namespace_, s_str(args, "namespace", "")))
        return s_error(KA_INVALID_ARGUMENT, "namespace: must be a DNS label of 1-63 characters");
    ka_status_t st;
    void *body = NULL;
    size_t len = 0;
    if (s_unary(c, KA_TPL_LIST, &k, sizeof k, &st, &body, &len) != KA_OK)
        return s_status_error(&st);
    json_t *list = json_array();
    if (len >= sizeof(ka_tpl_reply_t)) {
        const ka_tpl_reply_t *tr = body;
        size_t blen = len - offsetof(ka_tpl_reply_t, blob);
        for (const ka_store_template_t *t = ka_store_blob_next(&tr->blob, blen, NULL); t;
             t = ka_store_blob_next(&tr->blob, blen, t))
            if (!t->deleted)
                json_array_append_new(
                    list, json_pack("{s:s,s:s}", "namespace", t->namespace_, "name", t->name));
    }
    free(body);
    return s_ok(c, json_pack("{s:o}", "templates", list));
}

static json_t *t_create(kb_mcp_call_t *c, json_t *args)
{
    ka_sbx_create_t q;
    memset(&q, 0, sizeof q);
    s_put(q.caller, sizeof q.caller, c->caller);
    if (!s_put(q.template_namespace, sizeof q.template_namespace, s_str(args, "namespace", "")))
        return s_error(KA_INVALID_ARGUMENT,
                       "sandbox_template.namespace: must be a DNS label of 1-63 characters");
    if (!s_put(q.template_name, sizeof q.template_name, s_str(args, "template", "")))
        return s_error(KA_INVALID_ARGUMENT,
                       "sandbox_template.name: must be a DNS subdomain of 1-253 characters");
    const char *why = ka_check_request_id(s_str(args, "request_id", ""));
    if (!why)
        why = ka_check_sandbox_name(s_str(args, "name", ""));
    if (why)
        return s_error(KA_INVALID_ARGUMENT, "%s", why);
    s_put(q.request_id, sizeof q.request_id, s_str(args, "request_id", ""));
    s_put(q.name, sizeof q.name, s_str(args, "name", ""));
    int64_t ttl = s_int(args, "ttl_seconds", 0);
    q.ttl_ms = ttl * 1000;
    ka_status_t st;
    void *body = NULL;
    size_t len = 0;
    if (s_unary(c, KA_SBX_CREATE, &q, sizeof q, &st, &body, &len) != KA_OK)
        return s_status_error(&st);
    json_t *r = s_reply_summary(c, KA_SBX_CREATE, body, len);
    free(body);
    return r;
}

static json_t *t_list_sandboxes(kb_mcp_call_t *c, json_t *args)
{
    ka_sbx_list_req_t q;
    memset(&q, 0, sizeof q);
    s_put(q.caller, sizeof q.caller, c->caller);
    q.limit = (int32_t)s_int(args, "page_size", 0);
    const char *tok = s_str(args, "page_token", "");
    if (*tok) {
        uint64_t off;
        if (!s_parse_proc(tok, &off) || off > INT32_MAX)
            return s_error(KA_INVALID_ARGUMENT, "invalid page_token");
        q.offset = (int32_t)off;
    }
    ka_status_t st;
    void *body = NULL;
    size_t len = 0;
    if (s_unary(c, KA_SBX_LIST, &q, sizeof q, &st, &body, &len) != KA_OK)
        return s_status_error(&st);
    const ka_sbx_list_t *l = body;
    json_t *items = json_array();
    uint32_t n = 0;
    if (len >= sizeof *l) {
        n = l->count;
        if (n > (len - sizeof *l) / sizeof l->items[0])
            n = (uint32_t)((len - sizeof *l) / sizeof l->items[0]);
        for (uint32_t i = 0; i < n; i++)
            json_array_append_new(items, s_summary(&l->items[i]));
    }
    json_t *o = json_pack("{s:o}", "sandboxes", items);
    if (len >= sizeof *l && l->more) {
        char next[32];
        snprintf(next, sizeof next, "%" PRId64, (int64_t)q.offset + n);
        json_object_set_new(o, "next_page_token", json_string(next));
    }
    free(body);
    return s_ok(c, o);
}

static json_t *s_sandbox_id_error(void)
{
    return s_error(KA_INVALID_ARGUMENT, "%s", KA_MSG_NOT_UUID);
}

static json_t *s_lifecycle(kb_mcp_call_t *c, json_t *args, uint32_t type)
{
    const char *id = s_str(args, "sandbox_id", "");
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    s_put(k.caller, sizeof k.caller, c->caller);
    if (ka_check_uuid(id) || !s_put(k.id, sizeof k.id, id))
        return s_sandbox_id_error();
    ka_status_t st;
    void *body = NULL;
    size_t len = 0;
    if (s_unary(c, type, &k, sizeof k, &st, &body, &len) != KA_OK)
        return s_status_error(&st);
    json_t *r = s_reply_summary(c, type, body, len);
    free(body);
    return r;
}

static json_t *t_get(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, KA_SBX_GET);
}
static json_t *t_suspend(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, KA_SBX_SUSPEND);
}
static json_t *t_resume(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, KA_SBX_RESUME);
}
static json_t *t_pause(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, KA_SBX_PAUSE);
}
static json_t *t_unpause(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, KA_SBX_UNPAUSE);
}
static json_t *t_delete(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, KA_SBX_DELETE);
}

/* ---- process tools ----------------------------------------------------------------------------
 */

/* A guest request for args' sandbox_id (and process_id when want_proc); NULL with *err set. */
static ka_guest_req_t *s_guest_req(kb_mcp_call_t *c, json_t *args, int op, size_t tail,
                                   bool want_proc, json_t **err)
{
    const char *id = s_str(args, "sandbox_id", "");
    if (ka_check_uuid(id) || strlen(id) >= KA_STORE_ID_LEN) {
        *err = s_sandbox_id_error();
        return NULL;
    }
    uint64_t proc = 0;
    if (want_proc && !s_parse_proc(s_str(args, "process_id", ""), &proc)) {
        *err = s_error(KA_INVALID_ARGUMENT,
                       "process_id must be a process id returned by start_sandbox_process");
        return NULL;
    }
    ka_guest_req_t *q = ka_guest_req_new(c->caller, id, op, tail);
    if (!q) {
        *err = s_error(KA_INTERNAL, "out of memory");
        return NULL;
    }
    q->proc = proc;
    return q;
}

static json_t *t_start(kb_mcp_call_t *c, json_t *args)
{
    json_t *cmd = json_object_get(args, "command"), *env = json_object_get(args, "env");
    size_t tail = 0, n_env = 0;
    size_t i;
    json_t *v;
    const char *key;
    const char *why =
        ka_check_command(json_array_size(cmd), json_string_value(json_array_get(cmd, 0)));
    if (why)
        return s_error(KA_INVALID_ARGUMENT, "%s", why);
    json_array_foreach(cmd, i, v) tail += strlen(json_string_value(v)) + 1;
    json_object_foreach(env, key, v)
    {
        if ((why = ka_check_env_key(key)))
            return s_error(KA_INVALID_ARGUMENT, "%s", why);
        tail += strlen(key) + 1 + strlen(json_string_value(v)) + 1;
        n_env++;
    }
    const char *cwd = s_str(args, "cwd", "");
    if ((why = ka_check_start_size(tail)) || (why = ka_check_cwd(cwd)))
        return s_error(KA_INVALID_ARGUMENT, "%s", why);
    json_t *err = NULL;
    ka_guest_req_t *q = s_guest_req(c, args, KA_GUEST_START, tail, false, &err);
    if (!q)
        return err;
    s_put(q->cwd, sizeof q->cwd, cwd);
    char *p = q->tail;
    json_array_foreach(cmd, i, v) p = stpcpy(p, json_string_value(v)) + 1;
    json_object_foreach(env, key, v)
    {
        p = stpcpy(p, key);
        *p++ = '=';
        p = stpcpy(p, json_string_value(v)) + 1;
    }
    q->n_argv = (uint32_t)json_array_size(cmd);
    q->n_env = (uint32_t)n_env;
    ka_guest_reply_t fin;
    if (s_guest(c, q, NULL, NULL, &fin) != KA_OK)
        return s_status_error(&fin.status);
    return s_ok(c, json_pack("{s:o}", "process_id", s_process_id(fin.process.proc)));
}

static json_t *s_process_json(const ka_process_info_t *p, bool with_status)
{
    json_t *o = json_pack("{s:o}", "process_id", s_process_id(p->proc));
    if (with_status)
        json_object_set_new(o, "status",
                            json_string(kb_mcp_process_status(p->state, p->exit_code)));
    json_object_set_new(o, "exit_code", json_integer(p->exit_code));
    return o;
}

static json_t *t_get_process(kb_mcp_call_t *c, json_t *args)
{
    json_t *err = NULL;
    ka_guest_req_t *q = s_guest_req(c, args, KA_GUEST_GET, 0, true, &err);
    if (!q)
        return err;
    ka_guest_reply_t fin;
    if (s_guest(c, q, NULL, NULL, &fin) != KA_OK)
        return s_status_error(&fin.status);
    return s_ok(c, s_process_json(&fin.process, true));
}

static json_t *t_kill_process(kb_mcp_call_t *c, json_t *args)
{
    json_t *err = NULL;
    ka_guest_req_t *q = s_guest_req(c, args, KA_GUEST_SIGNAL, 0, true, &err);
    if (!q)
        return err;
    q->signal = SIGKILL;
    ka_guest_reply_t fin;
    if (s_guest(c, q, NULL, NULL, &fin) != KA_OK)
        return s_status_error(&fin.status);
    /* the kill is asynchronous: wait (bounded) for the exit to report its code */
    ka_process_info_t p = fin.process;
    for (int i = 0; i < 100 && !(fin.has_process && p.state == 2); i++) {
        q = s_guest_req(c, args, KA_GUEST_GET, 0, true, &err);
        if (!q)
            return err;
        if (s_guest(c, q, NULL, NULL, &fin) != KA_OK)
            return s_status_error(&fin.status);
        p = fin.process;
        if (p.state != 2) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return s_ok(c, s_process_json(&p, p.state != 2));
}

bool kb_mcp_outputs_add(kb_mcp_outputs_t *o, int stream, uint64_t offset, const char *data,
                        size_t len)
{
    int i = stream == KA_STREAM_STDERR ? 1 : 0;
    if (o->truncated)
        return false;
    if (offset + len <= o->off[i])
        return true; /* already returned */
    if (offset < o->off[i]) {
        size_t skip = (size_t)(o->off[i] - offset);
        data += skip;
        len -= skip;
        offset = o->off[i];
    }
    if (offset > o->off[i]) /* the spool dropped bytes: continue after the gap */
        o->off[i] = offset;
    size_t used = o->len[0] + o->len[1];
    size_t room = o->cap > used ? o->cap - used : 0;
    size_t take = len < room ? len : room;
    if (take) {
        char *nb = realloc(o->buf[i], o->len[i] + take);
        if (!nb) {
            o->truncated = true;
            return false;
        }
        memcpy(nb + o->len[i], data, take);
        o->buf[i] = nb;
        o->len[i] += take;
        o->off[i] += take;
    }
    if (take < len) {
        o->truncated = true;
        return false;
    }
    return true;
}

void kb_mcp_outputs_free(kb_mcp_outputs_t *o)
{
    free(o->buf[0]);
    free(o->buf[1]);
    o->buf[0] = o->buf[1] = NULL;
}

static bool s_outputs_data(void *u, const ka_guest_reply_t *f)
{
    if (f->stream != KA_STREAM_STDOUT && f->stream != KA_STREAM_STDERR)
        return true;
    return kb_mcp_outputs_add(u, f->stream, f->offset, f->tail, f->tail_len);
}

static json_t *t_read_outputs(kb_mcp_call_t *c, json_t *args)
{
    json_t *err = NULL;
    ka_guest_req_t *q = s_guest_req(c, args, KA_GUEST_OUTPUT, 0, true, &err);
    if (!q)
        return err;
    kb_mcp_outputs_t o;
    memset(&o, 0, sizeof o);
    o.cap = KB_MCP_OUTPUT_CAP;
    o.off[0] = q->stdout_offset = (uint64_t)s_int(args, "stdout_offset", 0);
    o.off[1] = q->stderr_offset = (uint64_t)s_int(args, "stderr_offset", 0);
    q->follow = 0;
    ka_guest_reply_t fin;
    int code = s_guest(c, q, s_outputs_data, &o, &fin);
    if (code != KA_OK && !(code == KA_CANCELLED && o.truncated)) {
        kb_mcp_outputs_free(&o);
        return s_status_error(&fin.status);
    }
    char *b0 = kb_mcp_b64_encode(o.buf[0], o.len[0]), *b1 = kb_mcp_b64_encode(o.buf[1], o.len[1]);
    bool exited = code == KA_OK && fin.has_process && fin.process.state == 2;
    json_t *r =
        json_pack("{s:s,s:s,s:I,s:I,s:b,s:b}", "stdout_base64", b0 ? b0 : "", "stderr_base64",
                  b1 ? b1 : "", "stdout_offset", (json_int_t)o.off[0], "stderr_offset",
                  (json_int_t)o.off[1], "truncated", o.truncated, "exited", exited);
    if (r && exited)
        json_object_set_new(r, "exit_code", json_integer(fin.process.exit_code));
    free(b0);
    free(b1);
    kb_mcp_outputs_free(&o);
    return s_ok(c, r);
}

/* ---- file tools -------------------------------------------------------------------------------
 */

static json_t *t_write_file(kb_mcp_call_t *c, json_t *args)
{
    const char *path = s_str(args, "path", ""), *b64 = s_str(args, "data_base64", "");
    size_t blen = strlen(b64);
    if (blen > (KB_MCP_FILE_CAP + 2) / 3 * 4)
        return s_error(KA_INVALID_ARGUMENT, "file exceeds MCP 1 MiB limit");
    unsigned char *data = NULL;
    size_t len = 0;
    char msg[128];
    if (kb_mcp_b64_decode(b64, blen, &data, &len, msg, sizeof msg))
        return s_error(KA_INVALID_ARGUMENT, "invalid base64: %s", msg);
    if (len > KB_MCP_FILE_CAP) {
        free(data);
        return s_error(KA_INVALID_ARGUMENT, "file exceeds MCP 1 MiB limit");
    }
    json_t *err = NULL;
    ka_guest_req_t *q = s_guest_req(c, args, KA_GUEST_WRITE, len, false, &err);
    if (!q) {
        free(data);
        return err;
    }
    if (!*path || !s_put(q->path, sizeof q->path, path)) {
        free(data);
        free(q);
        return s_error(KA_INVALID_ARGUMENT, "path must be 1-1023 bytes");
    }
    if (len)
        memcpy(q->tail, data, len);
    free(data);
    q->mode = (uint32_t)s_int(args, "mode", 0);
    q->seek_offset = 0; /* always the whole file */
    ka_guest_reply_t fin;
    if (s_guest(c, q, NULL, NULL, &fin) != KA_OK)
        return s_status_error(&fin.status);
    return s_ok(c, json_pack("{s:I}", "bytes_written", (json_int_t)fin.written));
}

enum { S_KIND_UNDECIDED, S_KIND_TEXT, S_KIND_IMAGE, S_KIND_BINARY };

typedef struct {
    uint64_t byte_offset;
    unsigned char head[KB_MCP_SNIFF_LEN];
    size_t head_len;
    int kind;
    const char *mime;
    kb_mcp_pager_t *pager;
    bool page_done;
    unsigned char *win; /* bytes [byte_offset, byte_offset + win_len) */
    size_t win_len;
    uint64_t pos; /* bytes seen */
    bool oom;
} s_read_t;

static bool s_is_image(const char *mime)
{
    return strncmp(mime, "image/", 6) == 0;
}

/* Routes bytes at file position r->pos to the chosen kind; false when done. */
static bool s_read_route(s_read_t *r, const unsigned char *p, size_t n)
{
    if (r->kind == S_KIND_TEXT) {
        r->pos += n;
        if (!r->page_done)
            r->page_done = kb_mcp_pager_feed(r->pager, (const char *)p, n);
        return !r->page_done;
    }
    /* image or binary: keep the window (a whole image up to its cap), count the rest */
    uint64_t start = r->pos, end = r->pos + n;
    bool whole = r->kind == S_KIND_IMAGE && r->byte_offset == 0;
    uint64_t ws = r->byte_offset,
             we = r->byte_offset + (whole ? KB_MCP_IMAGE_CAP : KB_MCP_FILE_CAP);
    uint64_t a = start > ws ? start : ws, b = end < we ? end : we;
    if (a < b) {
        unsigned char *nw = realloc(r->win, r->win_len + (size_t)(b - a));
        if (!nw) {
            r->oom = true;
            return false;
        }
        memcpy(nw + r->win_len, p + (a - start), (size_t)(b - a));
        r->win = nw;
        r->win_len += (size_t)(b - a);
    }
    r->pos = end;
    return true; /* read on: the final frame tells the size */
}

static void s_read_decide(s_read_t *r, uint64_t offset, uint64_t limit)
{
    r->mime = kb_mcp_sniff(r->head, r->head_len);
    if (strncmp(r->mime, "text/", 5) == 0) {
        r->kind = S_KIND_TEXT;
        r->pager = kb_mcp_pager_new(offset, limit);
    } else {
        r->kind = s_is_image(r->mime) ? S_KIND_IMAGE : S_KIND_BINARY;
    }
}

typedef struct {
    s_read_t *r;
    uint64_t offset, limit;
} s_read_ctx_t;

static bool s_read_data(void *u, const ka_guest_reply_t *f)
{
    s_read_ctx_t *x = u;
    s_read_t *r = x->r;
    const unsigned char *p = (const unsigned char *)f->tail;
    size_t n = f->tail_len;
    if (r->kind == S_KIND_UNDECIDED) {
        size_t take = KB_MCP_SNIFF_LEN - r->head_len;
        if (take > n)
            take = n;
        memcpy(r->head + r->head_len, p, take);
        r->head_len += take;
        p += take;
        n -= take;
        if (r->head_len < KB_MCP_SNIFF_LEN)
            return true;
        s_read_decide(r, x->offset, x->limit);
        if (!s_read_route(r, r->head, r->head_len))
            return false;
    }
    return n ? s_read_route(r, p, n) : true;
}

/* An image as the model sees it: re-encoded when large (mcp_image.c), captioned with its
 * sizes. NULL when it cannot be decoded (then it is read as a binary file). */
static json_t *s_read_image(s_read_t *r)
{
    kb_mcp_image_t img;
    char msg[256], cap[256];
    int rc = kb_mcp_image_prepare(r->win, r->win_len, r->mime, &img, msg, sizeof msg);
    if (rc == KB_MCP_IMAGE_TOO_LARGE)
        return s_error(KA_INVALID_ARGUMENT, "%s", msg);
    if (rc)
        return NULL;
    int n = img.w ? snprintf(cap, sizeof cap, "%s, %u\xc3\x97%u px", r->mime, img.w, img.h)
                  : snprintf(cap, sizeof cap, "%s", r->mime);
    if (img.reencoded)
        snprintf(cap + n, sizeof cap - (size_t)n, ", shown at %u\xc3\x97%u (%s, %zu bytes)",
                 img.shown_w, img.shown_h, img.mime, img.len);
    char *b = img.reencoded ? kb_mcp_b64_encode(img.data, img.len)
                            : kb_mcp_b64_encode(r->win, r->win_len);
    json_t *res = json_pack("{s:[{s:s,s:s},{s:s,s:s,s:s,s:{s:s}}],s:b}", "content", "type", "text",
                            "text", cap, "type", "image", "data", b ? b : "", "mimeType", img.mime,
                            "_meta", "codex/imageDetail", "original", "isError", 0);
    free(b);
    kb_mcp_image_free(&img);
    return res;
}

static json_t *s_read_binary(kb_mcp_call_t *c, s_read_t *r, uint64_t size)
{
    if (r->kind == S_KIND_IMAGE && r->byte_offset == 0 && size <= KB_MCP_IMAGE_CAP &&
        r->win_len == size) {
        json_t *res = s_read_image(r);
        if (res)
            return res;
    }
    if (r->win_len > KB_MCP_FILE_CAP) /* an image kept whole, shown as a binary file */
        r->win_len = KB_MCP_FILE_CAP;
    char *b = kb_mcp_b64_encode(r->win, r->win_len);
    json_t *o = json_pack("{s:s,s:I,s:I,s:s}", "mime_type", r->mime, "size", (json_int_t)size,
                          "byte_offset", (json_int_t)r->byte_offset, "data_base64", b ? b : "");
    free(b);
    uint64_t next = r->byte_offset + r->win_len;
    if (next < size)
        json_object_set_new(o, "next_byte_offset", json_integer((json_int_t)next));
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    char desc[160];
    if (next < size)
        snprintf(desc, sizeof desc,
                 "binary file, %s (%" PRIu64 " bytes; continue with byte_offset=%" PRIu64 ")",
                 r->mime, size, next);
    else
        snprintf(desc, sizeof desc, "binary file, %s (%" PRIu64 " bytes)", r->mime, size);
    json_t *res = json_pack("{s:[{s:s,s:s},{s:s,s:s}],s:b}", "content", "type", "text", "text",
                            desc, "type", "text", "text", text ? text : "{}", "isError", 0);
    free(text);
    if (res && c->structured)
        json_object_set(res, "structuredContent", o);
    json_decref(o);
    return res;
}

static json_t *t_read_file(kb_mcp_call_t *c, json_t *args)
{
    const char *path = s_str(args, "path", "");
    json_t *err = NULL;
    ka_guest_req_t *q = s_guest_req(c, args, KA_GUEST_READ, 0, false, &err);
    if (!q)
        return err;
    if (!*path || !s_put(q->path, sizeof q->path, path)) {
        free(q);
        return s_error(KA_INVALID_ARGUMENT, "path must be 1-1023 bytes");
    }
    s_read_t r;
    memset(&r, 0, sizeof r);
    r.byte_offset = (uint64_t)s_int(args, "byte_offset", 0);
    s_read_ctx_t x = {&r, (uint64_t)s_int(args, "offset", 1),
                      (uint64_t)s_int(args, "limit", KB_MCP_LINES_DEF)};
    ka_guest_reply_t fin;
    int code = s_guest(c, q, s_read_data, &x, &fin);
    json_t *res;
    if (code != KA_OK && !(code == KA_CANCELLED && r.page_done)) {
        res = s_status_error(&fin.status);
    } else if (r.oom) {
        res = s_error(KA_INTERNAL, "out of memory");
    } else {
        if (r.kind == S_KIND_UNDECIDED) { /* a file shorter than the sniff length */
            s_read_decide(&r, x.offset, x.limit);
            s_read_route(&r, r.head, r.head_len);
        }
        if (r.kind == S_KIND_TEXT) {
            char *text = kb_mcp_pager_finish(r.pager);
            r.pager = NULL;
            res = text ? json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text,
                                   "isError", 0)
                       : s_error(KA_INTERNAL, "out of memory");
            free(text);
        } else {
            res = s_read_binary(c, &r, code == KA_OK ? fin.written : r.pos);
        }
    }
    if (r.pager)
        free(kb_mcp_pager_finish(r.pager));
    free(r.win);
    return res;
}

/* ---- the tool table ---------------------------------------------------------------------------
 */

#define S_ID_PROP                                                                                  \
    "\"sandbox_id\":{\"type\":\"string\",\"description\":\"The sandbox's id (a UUID) as "          \
    "create_sandbox or list_sandboxes returned it.\"}"
#define S_PROC_PROP                                                                                \
    "\"process_id\":{\"type\":\"string\",\"description\":\"The id start_sandbox_process "          \
    "returned.\"}"

typedef kb_mcp_tool_t s_tool_t;

static const s_tool_t s_tools[] = {
    {"list_sandbox_templates", "List sandbox templates",
     "Lists the SandboxTemplates a sandbox can be created from, as {templates: [{namespace, "
     "name}]}. It says nothing about readiness or installed programs.",
     "{\"type\":\"object\",\"properties\":{\"namespace\":{\"type\":\"string\",\"description\":"
     "\"Only templates of this namespace.\",\"maxLength\":63}},\"additionalProperties\":false}",
     t_list_templates, true, false, true},
    {"create_sandbox", "Create a sandbox",
     "Creates a sandbox from a template and returns its summary {id, sandbox_template, name, "
     "state, operation, expires_at, failure}. Idempotent on request_id: a retry with the same "
     "request_id returns the same sandbox (also after it was deleted), so keep the request_id "
     "and reuse it for retries. The lifetime (ttl_seconds, 1-86400; 0 or omitted = the operator "
     "default) is never extended.",
     "{\"type\":\"object\",\"properties\":{"
     "\"namespace\":{\"type\":\"string\",\"description\":\"The template's namespace.\","
     "\"minLength\":1,\"maxLength\":63},"
     "\"template\":{\"type\":\"string\",\"description\":\"The template's name.\",\"minLength\":1,"
     "\"maxLength\":253},"
     "\"request_id\":{\"type\":\"string\",\"description\":\"Your idempotency key (1-128 "
     "characters); reuse it when retrying.\",\"minLength\":1,\"maxLength\":128},"
     "\"name\":{\"type\":\"string\",\"description\":\"An optional display name.\",\"maxLength\":"
     "200},"
     "\"ttl_seconds\":{\"type\":\"integer\",\"description\":\"Lifetime in seconds (1-86400); 0 "
     "or omitted = the operator default.\",\"minimum\":0,\"maximum\":86400}},"
     "\"required\":[\"namespace\",\"template\",\"request_id\"],\"additionalProperties\":false}",
     t_create, false, false, true},
    {"list_sandboxes", "List sandboxes",
     "Lists your sandboxes as {sandboxes: [summary], next_page_token}. Observes only; never "
     "advances pending work.",
     "{\"type\":\"object\",\"properties\":{"
     "\"page_size\":{\"type\":\"integer\",\"description\":\"At most this many (0-100; 0 = "
     "100).\",\"minimum\":0,\"maximum\":100},"
     "\"page_token\":{\"type\":\"string\",\"description\":\"next_page_token of the previous "
     "page.\"}},\"additionalProperties\":false}",
     t_list_sandboxes, true, false, true},
    {"get_sandbox", "Get a sandbox",
     "Returns a sandbox's summary. Observes only; never advances pending work.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_get, true, false, true},
    {"suspend_sandbox", "Suspend a sandbox",
     "Suspends a sandbox: its compute is released and /data is kept. Running commands and "
     "transfers may be interrupted; process handles do not survive.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_suspend, false, true, true},
    {"resume_sandbox", "Resume a sandbox",
     "Resumes a suspended sandbox with its /data. Earlier process handles become invalid.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_resume, false, false, true},
    {"delete_sandbox", "Delete a sandbox",
     "Deletes a sandbox with its workspace and files. Collect artifacts first.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_delete, false, true, true},
    {"start_sandbox_process", "Start a process",
     "Starts a command in a sandbox and returns {process_id} before it completes. command is "
     "an argv array; shell syntax needs an explicit [\"sh\",\"-c\",\"...\"]. cwd defaults to "
     "/data/workspace. Never blindly retry a start: check get_sandbox_process first.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"command\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,"
     "\"description\":\"argv: the program and its arguments.\"},"
     "\"cwd\":{\"type\":\"string\",\"description\":\"Working directory (default "
     "/data/workspace).\"},"
     "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},"
     "\"description\":\"Extra environment variables.\"}},"
     "\"required\":[\"sandbox_id\",\"command\"],\"additionalProperties\":false}",
     t_start, false, false, false},
    {"get_sandbox_process", "Get a process",
     "Returns {process_id, status, exit_code}. status is PROCESS_STATUS_RUNNING or one of the "
     "terminal PROCESS_STATUS_COMPLETED, _FAILED, _TERMINATED; exit_code means nothing while "
     "RUNNING.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP "," S_PROC_PROP
     "},\"required\":[\"sandbox_id\",\"process_id\"],\"additionalProperties\":false}",
     t_get_process, true, false, true},
    {"kill_sandbox_process", "Kill a process",
     "Kills a process (SIGKILL to its process group) and returns {process_id, exit_code}.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP "," S_PROC_PROP
     "},\"required\":[\"sandbox_id\",\"process_id\"],\"additionalProperties\":false}",
     t_kill_process, false, true, true},
    {"read_sandbox_outputs", "Read process output",
     "Returns the output available now, from the given offsets: {stdout_base64, stderr_base64, "
     "stdout_offset, stderr_offset, truncated, exited, exit_code}. At most 1 MiB of stdout and "
     "stderr combined; truncated is true when more is waiting. Pass both returned offsets back "
     "to continue. Empty output does not mean the process finished: it has when exited is true "
     "(then exit_code is set) and truncated is false.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP "," S_PROC_PROP ","
     "\"stdout_offset\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Bytes of stdout "
     "already read.\"},"
     "\"stderr_offset\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Bytes of stderr "
     "already read.\"}},"
     "\"required\":[\"sandbox_id\",\"process_id\"],\"additionalProperties\":false}",
     t_read_outputs, true, false, true},
    {"write_sandbox_file", "Write a file",
     "Writes a whole file (replacing it) from standard base64 data of at most 1 MiB decoded; "
     "relative paths are under /data/workspace, parents are created. Returns {bytes_written}. "
     "An interrupted write can leave a partial file.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":\"File path (relative to "
     "/data/workspace, or absolute inside it).\"},"
     "\"data_base64\":{\"type\":\"string\",\"description\":\"The content, standard base64 "
     "(at most 1 MiB decoded).\"},"
     "\"mode\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":4095,\"description\":\"Unix "
     "permission bits in decimal, e.g. 420 = 0644.\"}},"
     "\"required\":[\"sandbox_id\",\"path\",\"data_base64\"],\"additionalProperties\":false}",
     t_write_file, false, true, true},
    {"read_sandbox_file", "Read a file",
     "Reads a file. Text comes back as numbered lines \"<n>: <line>\" from offset (first line, "
     "from 1), at most limit lines (default 2000) and 32 KiB; long lines are cut; when there is "
     "more the text ends with (lines A-B; continue with offset=N). Images (PNG, JPEG, GIF, WebP) "
     "up to 16 MiB come back as image content, re-encoded as JPEG when over 2000 px or 500,000 "
     "bytes; over 50 M pixels they are refused. Other binary files come back as data_base64 of at "
     "most 1 MiB from byte_offset, with next_byte_offset when there is more.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":\"File path (relative to "
     "/data/workspace, or absolute inside it).\"},"
     "\"offset\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"Text: the first line "
     "to return, from 1.\"},"
     "\"limit\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"Text: at most this many "
     "lines (default 2000).\"},"
     "\"byte_offset\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Binary files: the "
     "first byte to return.\"}},"
     "\"required\":[\"sandbox_id\",\"path\"],\"additionalProperties\":false}",
     t_read_file, true, false, true},
    /* beyond the reference: after its tools, in the same shape */
    {"pause_sandbox", "Pause a sandbox",
     "Freezes every process of a READY sandbox: memory and processes stay, no CPU is used, the "
     "TTL keeps running. Commands and file calls are refused until unpause_sandbox.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_pause, false, false, true},
    {"unpause_sandbox", "Unpause a sandbox",
     "Thaws a paused sandbox: its processes go on where they stopped.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_unpause, false, false, true},
};

#define S_N_OWN   (sizeof s_tools / sizeof s_tools[0])
#define S_N_TOOLS (S_N_OWN + KB_MCP_FILE_TOOLS_N)

/* Tool i: ours, then the Files API's (mcp_files.c). */
static const s_tool_t *s_tool_at(size_t i)
{
    return i < S_N_OWN ? &s_tools[i] : &kb_mcp_file_tools[i - S_N_OWN];
}

static json_t *s_schemas[S_N_TOOLS];
static pthread_once_t s_schemas_once = PTHREAD_ONCE_INIT;

static void s_schemas_load(void)
{
    for (size_t i = 0; i < S_N_TOOLS; i++) {
        json_error_t e;
        s_schemas[i] = json_loads(s_tool_at(i)->schema, JSON_PRESERVE_ORDER, &e);
        if (!s_schemas[i]) {
            fprintf(stderr, "mcp: schema of %s: %s at %d\n", s_tool_at(i)->name, e.text,
                    e.position);
            abort(); /* a bug in the table above */
        }
    }
}

static const s_tool_t *s_find(const char *name, size_t *idx)
{
    for (size_t i = 0; name && i < S_N_TOOLS; i++)
        if (strcmp(s_tool_at(i)->name, name) == 0) {
            if (idx)
                *idx = i;
            return s_tool_at(i);
        }
    return NULL;
}

json_t *kb_mcp_tools_list(void)
{
    pthread_once(&s_schemas_once, s_schemas_load);
    json_t *a = json_array();
    for (size_t i = 0; a && i < S_N_TOOLS; i++) {
        const s_tool_t *t = s_tool_at(i);
        json_array_append_new(a, json_pack("{s:s,s:s,s:s,s:O,s:{s:s,s:b,s:b,s:b,s:b}}", "name",
                                           t->name, "title", t->title, "description",
                                           t->description, "inputSchema", s_schemas[i],
                                           "annotations", "title", t->title, "readOnlyHint",
                                           t->read_only, "destructiveHint", t->destructive,
                                           "idempotentHint", t->idempotent, "openWorldHint", 0));
    }
    return a;
}

bool kb_mcp_tool_exists(const char *name)
{
    return s_find(name, NULL) != NULL;
}

json_t *kb_mcp_tool_call(kb_mcp_call_t *c, const char *name, json_t *args)
{
    pthread_once(&s_schemas_once, s_schemas_load);
    size_t i;
    const s_tool_t *t = s_find(name, &i);
    if (!t)
        return s_error(KA_INVALID_ARGUMENT, "unknown tool \"%s\"", name ? name : "");
    char msg[512];
    json_t *empty = NULL;
    if (!args)
        args = empty = json_object();
    json_t *r;
    if (kb_mcp_check_args(s_schemas[i], args, msg, sizeof msg))
        r = s_error(KA_INVALID_ARGUMENT, "%s", msg);
    else
        r = t->fn(c, args);
    json_decref(empty);
    return r;
}

/* ---- prompts and instructions ---------------------------------------------------------------- */

static const char s_instructions[] =
    "kagent sandboxes: isolated Linux workspaces for running commands and handling files.\n"
    "- Sandboxes live independently of Sessions, and they have no network egress (loopback "
    "only).\n"
    "- Upload inputs with write_sandbox_file and work in /data/workspace (the default cwd and "
    "the root of relative paths).\n"
    "- create_sandbox is idempotent on request_id: keep the request_id and retry with the same "
    "one; lifecycle retries must use the same request_id. Check state, operation and "
    "expires_at in every summary.\n"
    "- Never blindly retry start_sandbox_process: check get_sandbox_process first.\n"
    "- Continue read_sandbox_outputs with both returned offsets. Empty output does not mean "
    "completion; the process has finished when exited is true and truncated is false.\n"
    "- MCP transfers are limited to 1 MiB per call (base64 payloads).\n"
    "- Collect artifacts before deleting a sandbox.\n"
    "- Suspend can interrupt work. Files under /data survive a resume; process handles do not.\n"
    "- get_sandbox and list_sandboxes never advance pending work.\n"
    "- Every tool result may be an error: check isError even when the call completed.";

const char *kb_mcp_instructions(void)
{
    return s_instructions;
}

static const char s_task_guidance[] =
    "Carry out the task below in a kagent sandbox, using the sandbox tools of this server.\n"
    "1. Find a template with list_sandbox_templates, unless one is given.\n"
    "2. create_sandbox with the namespace, the template and a new request_id. Keep the "
    "request_id: if the call fails or times out, retry with the same request_id (a retry never "
    "creates a second sandbox). Go on once state is RUNTIME_STATE_READY and operation is "
    "RUNTIME_OPERATION_NONE; note expires_at.\n"
    "3. Upload inputs with write_sandbox_file (standard base64, at most 1 MiB per call). Work "
    "in /data/workspace.\n"
    "4. Run commands with start_sandbox_process. command is an argv array: use "
    "[\"sh\",\"-c\",\"...\"] for shell syntax. Never blindly retry a start: check "
    "get_sandbox_process first.\n"
    "5. Read output with read_sandbox_outputs and pass both returned offsets back. Empty output "
    "does not mean the process finished: it has when exited is true and truncated is false (or "
    "get_sandbox_process says so).\n"
    "6. Read results with read_sandbox_file (numbered lines; continue with the offset it "
    "names).\n"
    "7. Collect every artifact you need, then delete_sandbox.\n"
    "Check isError on every tool result and fix the cause before retrying.";

static const char s_recovery_guidance[] =
    "Recover the kagent sandbox named below.\n"
    "1. get_sandbox: read state, operation, expires_at and failure. get_sandbox never advances "
    "pending work.\n"
    "2. If operation is not RUNTIME_OPERATION_NONE, a lifecycle operation is in progress: wait "
    "and get_sandbox again; retry an interrupted create with the same request_id.\n"
    "3. RUNTIME_STATE_SUSPENDED: resume_sandbox. Files under /data survive, earlier process "
    "handles do not: start the work again where it is not done.\n"
    "4. RUNTIME_STATE_READY: for a process whose result you do not know, call "
    "get_sandbox_process and read_sandbox_outputs from your last offsets; do not restart it "
    "blindly.\n"
    "5. RUNTIME_STATE_FAILED, RUNTIME_STATE_DELETED, or expires_at in the past: the sandbox "
    "cannot be used again. Create a new one with a new request_id and upload the inputs "
    "again.\n"
    "6. A NOT_FOUND error means the sandbox is not yours or does not exist.";

json_t *kb_mcp_prompts_list(void)
{
    return json_pack(
        "[{s:s,s:s,s:s,s:[{s:s,s:s,s:b},{s:s,s:s,s:b},{s:s,s:s,s:b}]},"
        "{s:s,s:s,s:s,s:[{s:s,s:s,s:b}]}]",
        "name", "sandbox-task", "title", "Do a task in a sandbox", "description",
        "Guidance for carrying out a task in a kagent sandbox with the sandbox tools.", "arguments",
        "name", "task", "description", "What to do.", "required", 1, "name", "namespace",
        "description", "The template's namespace.", "required", 0, "name", "template",
        "description", "The template to use (requires namespace).", "required", 0, "name",
        "sandbox-recovery", "title", "Recover a sandbox", "description",
        "Guidance for recovering a sandbox after an error, a timeout or a suspend.", "arguments",
        "name", "sandbox_id", "description", "The sandbox's id (a UUID).", "required", 1);
}

static json_t *s_user_text(const char *text)
{
    return json_pack("{s:s,s:{s:s,s:s}}", "role", "user", "content", "type", "text", "text", text);
}

json_t *kb_mcp_prompt_get(const char *name, json_t *args, int *code, char *msg, size_t cap)
{
    *code = -32602;
    static const char *const task_args[] = {"task", "namespace", "template", NULL};
    static const char *const rec_args[] = {"sandbox_id", NULL};
    const char *const *known;
    if (name && strcmp(name, "sandbox-task") == 0)
        known = task_args;
    else if (name && strcmp(name, "sandbox-recovery") == 0)
        known = rec_args;
    else
        return snprintf(msg, cap, "unknown prompt \"%s\"", name ? name : ""), NULL;
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v)
    {
        bool ok = false;
        for (const char *const *a = known; *a; a++)
            ok |= strcmp(*a, k) == 0;
        if (!ok)
            return snprintf(msg, cap, "unknown prompt argument \"%s\"", k), NULL;
        if (!json_is_string(v))
            return snprintf(msg, cap, "%s must be a string", k), NULL;
    }
    if (known == task_args) {
        const char *task = s_str(args, "task", ""), *ns = s_str(args, "namespace", "");
        const char *tpl = s_str(args, "template", "");
        if (!*task)
            return snprintf(msg, cap, "task is required"), NULL;
        if (*tpl && !*ns)
            return snprintf(msg, cap, "namespace is required when template is supplied"), NULL;
        json_t *params = json_pack("{s:s}", "task", task);
        if (*ns)
            json_object_set_new(params, "namespace", json_string(ns));
        if (*tpl)
            json_object_set_new(params, "template", json_string(tpl));
        char *pj = json_dumps(params, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(params);
        char *second = NULL;
        if (!pj || asprintf(&second, "Task parameters:\n%s", pj) < 0)
            second = NULL;
        free(pj);
        json_t *r = second
                        ? json_pack("{s:s,s:[o,o]}", "description", "Do a task in a sandbox",
                                    "messages", s_user_text(s_task_guidance), s_user_text(second))
                        : NULL;
        free(second);
        return r;
    }
    const char *id = s_str(args, "sandbox_id", "");
    if (!*id)
        return snprintf(msg, cap, "sandbox_id is required"), NULL;
    if (ka_check_uuid(id))
        return snprintf(msg, cap, "sandbox_id must be a UUID"), NULL;
    char *second = NULL;
    if (asprintf(&second, "Sandbox to recover: %s", id) < 0)
        return snprintf(msg, cap, "out of memory"), *code = -32603, NULL;
    json_t *r = json_pack("{s:s,s:[o,o]}", "description", "Recover a sandbox", "messages",
                          s_user_text(s_recovery_guidance), s_user_text(second));
    free(second);
    return r;
}

/* ---- for the Files API tools (mcp_files.c) ----------------------------------------------------
 */

json_t *kb_mcp_error(int code, const char *message)
{
    return s_error(code, "%s", message);
}

json_t *kb_mcp_status_error(const ka_status_t *st)
{
    return s_status_error(st);
}

json_t *kb_mcp_ok(kb_mcp_call_t *c, json_t *obj)
{
    return s_ok(c, obj);
}

ka_guest_req_t *kb_mcp_guest_req(kb_mcp_call_t *c, json_t *args, int op, size_t tail, json_t **err)
{
    return s_guest_req(c, args, op, tail, false, err);
}

int kb_mcp_guest_call(kb_mcp_call_t *c, ka_guest_req_t *q, ka_guest_reply_t *fin, void **tail)
{
    return s_guest_tail(c, q, NULL, NULL, fin, tail);
}
