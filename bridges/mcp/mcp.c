/*
 * kb_mcp: MCP Streamable HTTP on kb_http. See mcp.h.
 *
 * A POST carries one JSON-RPC message. s_serve turns (headers, body) into an answer without
 * touching HTTP (the unit tests call it directly); the kb_http handler only copies headers in
 * and the answer out. A tools/call whose client accepts SSE and asked for progress
 * (_meta.progressToken) runs on a worker thread that writes progress events into the response
 * stream while the service works, then the result event (libmicrohttpd sends nothing before the
 * handler returns, so the work cannot stay on the connection thread). Every other answer is
 * computed on the connection thread and sent whole, as JSON or as one SSE event.
 */
#include "mcp.h"

#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "krt.h"
#include "mcp_int.h"
#include "metrics.h"

#define LOG_PATH "bridges/mcp"

#define S_DEFAULT_VERSION "2025-03-26" /* assumed without _meta, session or header */

#define S_RPC_RESOURCE_NOT_FOUND_LEGACY (-32002) /* 2025-11-25 and earlier */

#define S_NO_LOG KB_MCP_N_LEVELS /* a level above every level: no log notifications */

typedef struct s_session {
    struct s_session *next;
    char id[33];
    char owner[KB_AUTH_ID_MAX + 1];
    char version[16];
    int level; /* a kb_mcp_log_level index: log notifications at or above it */
    time_t used;
} s_session_t;

struct kb_mcp {
    kb_http_t *http;
    ka_service_t *svc;
    const kb_auth_t *auth;
    char **hosts, **origins;
    size_t n_origins; /* slots in origins (some may be NULL after a failed allocation) */
    char *name, *version;
    size_t max_body;
    int max_sessions, progress_ms;
    pthread_mutex_t mu; /* sessions, n_sessions, workers */
    pthread_cond_t idle;
    s_session_t *sessions;
    int n_sessions;
    int workers; /* progress workers still running */
    atomic_ulong requests, tool_calls, tool_errors;
};

/* ---- the transport-free request and answer ------------------------------------------------- */

typedef struct {
    const char *method; /* HTTP method */
    const char *host, *origin, *accept, *content_type, *session, *protocol;
    const char *mcp_method, *mcp_name; /* 2026-07-28 request headers */
    const char *authorization, *user_id;
    int conn_fd; /* the connection's socket: its TLS client identity, if any */
    const char *body;
    size_t len;
} s_in_t;

typedef struct s_job s_job_t;

typedef struct {
    unsigned status;
    const char *ctype; /* NULL: no body */
    char *body;        /* malloc'd */
    size_t len;
    const char *allow;
    char session[33]; /* Mcp-Session-Id to send, "" none */
    bool www_auth;
    s_job_t *job; /* set: answer with a stream and run the job */
} s_out_t;

/* A tools/call run on a worker thread, writing SSE events. */
struct s_job {
    kb_mcp_t *m;
    char caller[KB_AUTH_ID_MAX + 1];
    char tool[128];
    bool structured;
    bool modern; /* the result carries resultType (2026-07-28) */
    json_t *id, *args, *token;
    int level;
    kb_http_stream_t *stream;
    pthread_mutex_t mu; /* guards writes to stream */
    double progress;
    bool plain;       /* no progress: the answer is one JSON body or one SSE event */
    bool sse;         /* plain: answer as text/event-stream */
    char version[16]; /* plain: the request's revision */
};

/* ---- helpers --------------------------------------------------------------------------------- */

static char **s_strv_dup(const char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    char **out = calloc(n + 1, sizeof *out);
    for (size_t i = 0; out && i < n; i++)
        if (!(out[i] = strdup(v[i]))) {
            for (size_t j = 0; j < i; j++)
                free(out[j]);
            free(out);
            return NULL;
        }
    return out;
}

static void s_strv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static char *s_dump(const json_t *j, size_t *len)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    *len = s ? strlen(s) : 0;
    return s;
}

static json_t *s_rpc_error(const json_t *id, int code, const char *msg)
{
    return json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(),
                     "error", "code", code, "message", msg);
}

/* An error response with data (stolen; NULL = none). */
static json_t *s_rpc_error_data(const json_t *id, int code, const char *msg, json_t *data)
{
    json_t *e = s_rpc_error(id, code, msg);
    if (e && data)
        json_object_set_new(json_object_get(e, "error"), "data", data);
    else
        json_decref(data);
    return e;
}

static json_t *s_rpc_result(const json_t *id, json_t *result)
{
    return json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result", result);
}

/* Frames one JSON-RPC message as an SSE event. malloc'd. */
static char *s_sse_event(const json_t *msg, size_t *len)
{
    size_t jl;
    char *j = s_dump(msg, &jl), *ev = NULL;
    int n = j ? asprintf(&ev, "event: message\ndata: %s\n\n", j) : -1;
    free(j);
    *len = n > 0 ? (size_t)n : 0;
    return n > 0 ? ev : NULL;
}

/* The answer: one message as JSON or as an SSE event. Steals msg. */
static void s_answer(s_out_t *out, unsigned status, json_t *msg, bool sse)
{
    out->status = status;
    if (!msg) {
        out->status = 500;
        out->ctype = "text/plain; charset=utf-8";
        out->body = strdup("out of memory\n");
        out->len = out->body ? strlen(out->body) : 0;
        return;
    }
    if (sse) {
        out->ctype = "text/event-stream";
        out->body = s_sse_event(msg, &out->len);
    } else {
        out->ctype = "application/json";
        out->body = s_dump(msg, &out->len);
    }
    json_decref(msg);
}

static void s_answer_error(s_out_t *out, unsigned status, const json_t *id, int code,
                           const char *msg)
{
    s_answer(out, status, s_rpc_error(id, code, msg), false);
}

static bool s_list_has(const char *list, const char *item)
{
    size_t n = strlen(item);
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (strncasecmp(p, item, n) == 0 &&
            (p[n] == '\0' || p[n] == ',' || p[n] == ';' || p[n] == ' '))
            return true;
        p = strchr(p, ',');
    }
    return false;
}

static bool s_origin_allowed(const kb_mcp_t *m, const char *origin)
{
    for (size_t i = 0; i < m->n_origins; i++) {
        const char *a = m->origins[i];
        if (strcmp(a, "*") == 0 || strcasecmp(a, origin) == 0)
            return true;
        /* "scheme://host" without a port accepts any port */
        const char *as = strstr(a, "://"), *os = strstr(origin, "://");
        if (!as || !os || (as - a) != (os - origin) || strncasecmp(a, origin, (size_t)(as - a)))
            continue;
        const char *one[] = {as + 3, NULL};
        if (kb_http_host_part(as + 3) == strlen(as + 3) && kb_http_host_allowed(one, os + 3))
            return true;
    }
    return false;
}

/* An initialize-based revision we serve. */
static bool s_version_legacy(const char *v)
{
    for (size_t i = 0; v && kb_mcp_versions[i]; i++)
        if (strcmp(v, kb_mcp_versions[i]) == 0)
            return !kb_mcp_version_modern(v);
    return false;
}

/* ---- sessions ---------------------------------------------------------------------------------
 */

static int s_random_hex(char *out, size_t nbytes)
{
    unsigned char b[32];
    if (nbytes > sizeof b)
        return -EINVAL;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, b, nbytes);
    close(fd);
    if (n != (ssize_t)nbytes)
        return -EIO;
    for (size_t i = 0; i < nbytes; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
    return 0;
}

/* Drops sessions idle too long and, above the cap, the least recently used. Lock held. */
static void s_sessions_trim(kb_mcp_t *m, int room)
{
    time_t now = time(NULL);
    for (s_session_t **pp = &m->sessions; *pp;) {
        if (now - (*pp)->used > KB_MCP_SESSION_IDLE_S) {
            s_session_t *s = *pp;
            *pp = s->next;
            free(s);
            m->n_sessions--;
        } else {
            pp = &(*pp)->next;
        }
    }
    while (m->n_sessions + room > m->max_sessions && m->sessions) {
        s_session_t **oldest = &m->sessions;
        for (s_session_t **pp = &m->sessions; *pp; pp = &(*pp)->next)
            if ((*pp)->used < (*oldest)->used)
                oldest = pp;
        s_session_t *s = *oldest;
        *oldest = s->next;
        free(s);
        m->n_sessions--;
    }
}

static int s_session_new(kb_mcp_t *m, const char *owner, const char *version, char *id_out)
{
    s_session_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    int rc = s_random_hex(s->id, 16);
    if (rc) {
        free(s);
        return rc;
    }
    snprintf(s->owner, sizeof s->owner, "%s", owner);
    snprintf(s->version, sizeof s->version, "%s", version);
    s->level = 1; /* info */
    s->used = time(NULL);
    pthread_mutex_lock(&m->mu);
    s_sessions_trim(m, 1);
    s->next = m->sessions;
    m->sessions = s;
    m->n_sessions++;
    pthread_mutex_unlock(&m->mu);
    memcpy(id_out, s->id, sizeof s->id);
    return 0;
}

/* Finds the caller's session (lock held); NULL when unknown or another identity's. */
static s_session_t *s_session_find(kb_mcp_t *m, const char *id, const char *owner)
{
    for (s_session_t *s = m->sessions; s; s = s->next)
        if (strcmp(s->id, id) == 0)
            return strcmp(s->owner, owner) == 0 ? s : NULL;
    return NULL;
}

static bool s_session_delete(kb_mcp_t *m, const char *id, const char *owner)
{
    bool found = false;
    pthread_mutex_lock(&m->mu);
    for (s_session_t **pp = &m->sessions; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->id, id) == 0 && strcmp((*pp)->owner, owner) == 0) {
            s_session_t *s = *pp;
            *pp = s->next;
            free(s);
            m->n_sessions--;
            found = true;
            break;
        }
    pthread_mutex_unlock(&m->mu);
    return found;
}

/* ---- methods -----------------------------------------------------------------------------------
 */

typedef struct {
    kb_mcp_t *m;
    const char *caller;
    char version[16]; /* the request's revision: negotiated (session), named, or assumed */
    char session[33]; /* "" without a session */
    int level;        /* log notifications at or above this index; S_NO_LOG none */
    bool modern;      /* 2026-07-28: stateless, results carry resultType */
    bool sse;         /* the client accepts text/event-stream */
    bool json;        /* the client accepts application/json */
} s_ctx_t;

/* The capabilities of initialize and server/discover (new reference). */
static json_t *s_capabilities(void)
{
    return json_pack("{s:{s:b},s:{s:b},s:{},s:{}}", "tools", "listChanged", 0, "prompts",
                     "listChanged", 0, "resources", "logging");
}

/* resources/read: this server offers no resources, so every URI is not found: -32602 from
 * 2026-07-28 on, -32002 before (data.uri names it). *code, buf and *data say so. */
static void s_resource_read(bool modern, const json_t *params, int *code, char *buf, size_t cap,
                            json_t **data)
{
    const char *uri = json_string_value(json_object_get(params, "uri"));
    *code = modern || !uri ? KB_RPC_PARAMS : S_RPC_RESOURCE_NOT_FOUND_LEGACY;
    if (!uri) {
        snprintf(buf, cap, "uri is required");
        return;
    }
    snprintf(buf, cap, "Resource not found: %.500s", uri);
    *data = json_pack("{s:s}", "uri", uri);
}

static json_t *s_initialize(s_ctx_t *x, const json_t *params, s_out_t *out, int *code,
                            const char **emsg)
{
    const char *want = json_string_value(json_object_get(params, "protocolVersion"));
    if (!want) {
        *code = KB_RPC_PARAMS;
        *emsg = "protocolVersion is required";
        return NULL;
    }
    const char *v = s_version_legacy(want) ? want : KB_MCP_LEGACY_LATEST;
    if (s_session_new(x->m, x->caller, v, out->session)) {
        *code = KB_RPC_INTERNAL;
        *emsg = "cannot create a session";
        return NULL;
    }
    krt_log(KRT_LOG_INFO, LOG_PATH, "session_start", "session=%s caller=%s version=%s",
            out->session, x->caller, v);
    return json_pack("{s:s,s:o,s:{s:s,s:s,s:s},s:s}", "protocolVersion", v, "capabilities",
                     s_capabilities(), "serverInfo", "name", x->m->name, "title",
                     "kagent sandboxes", "version", x->m->version, "instructions",
                     kb_mcp_instructions());
}

/* server/discover (2026-07-28): every revision served, capabilities, instructions. */
static json_t *s_discover(void)
{
    return json_pack("{s:o,s:o,s:s}", "supportedVersions", kb_mcp_versions_json(), "capabilities",
                     s_capabilities(), "instructions", kb_mcp_instructions());
}

static json_t *s_set_level(s_ctx_t *x, const json_t *params, int *code, const char **emsg)
{
    int idx = kb_mcp_log_level(json_string_value(json_object_get(params, "level")));
    if (idx < 0) {
        *code = KB_RPC_PARAMS;
        *emsg = "level must be one of debug, info, notice, warning, error, critical, alert, "
                "emergency";
        return NULL;
    }
    if (x->session[0]) {
        pthread_mutex_lock(&x->m->mu);
        s_session_t *s = s_session_find(x->m, x->session, x->caller);
        if (s)
            s->level = idx;
        pthread_mutex_unlock(&x->m->mu);
    }
    return json_object();
}

/* A notifications/message for a failed tool call, if the level admits warnings. */
static json_t *s_log_note(int level, const char *tool, const json_t *result)
{
    if (level > 3 || !json_is_true(json_object_get(result, "isError")))
        return NULL;
    const char *text = json_string_value(
        json_object_get(json_array_get(json_object_get(result, "content"), 0), "text"));
    return json_pack("{s:s,s:s,s:{s:s,s:s,s:{s:s,s:s}}}", "jsonrpc", "2.0", "method",
                     "notifications/message", "params", "level", "warning", "logger", "kagent",
                     "data", "tool", tool, "error", text ? text : "");
}

/* A 2026-07-28 result: resultType, the server's identity in _meta, and for a cacheable one
 * (lists, discover) its freshness hints; the lists are the same for every caller. Legacy
 * results pass unchanged. Returns r. */
static json_t *s_result_finish(kb_mcp_t *m, bool modern, json_t *r, bool cacheable)
{
    if (!modern || !r)
        return r;
    json_object_set_new(r, "resultType", json_string("complete"));
    json_t *meta = json_object_get(r, "_meta");
    if (!json_is_object(meta)) {
        meta = json_object();
        json_object_set_new(r, "_meta", meta);
    }
    json_object_set_new(meta, KB_MCP_META_SERVER,
                        json_pack("{s:s,s:s}", "name", m->name, "version", m->version));
    if (cacheable) {
        json_object_set_new(r, "ttlMs", json_integer(KB_MCP_LIST_TTL_MS));
        json_object_set_new(r, "cacheScope", json_string("public"));
    }
    return r;
}

static bool s_structured(const char *version)
{
    return strcmp(version, "2025-06-18") >= 0;
}

static void s_count_result(kb_mcp_t *m, const json_t *r)
{
    atomic_fetch_add(&m->tool_calls, 1);
    if (!r || json_is_true(json_object_get(r, "isError")))
        atomic_fetch_add(&m->tool_errors, 1);
}

/* Runs a tools/call synchronously; with SSE, a failure's log note goes before the result. */
static void s_tools_call_sync(s_ctx_t *x, const json_t *id, const char *name, json_t *args,
                              s_out_t *out)
{
    kb_mcp_call_t c = {
        .svc = x->m->svc, .caller = x->caller, .structured = s_structured(x->version)};
    json_t *r = s_result_finish(x->m, x->modern, kb_mcp_tool_call(&c, name, args), false);
    s_count_result(x->m, r);
    json_t *note = x->sse ? s_log_note(x->level, name, r) : NULL;
    bool sse = x->sse && (!x->json || note);
    s_answer(out, 200, r ? s_rpc_result(id, r) : s_rpc_error(id, KB_RPC_INTERNAL, "out of memory"),
             sse);
    if (note && out->body) {
        size_t nl;
        char *ne = s_sse_event(note, &nl), *both = NULL;
        if (ne && asprintf(&both, "%s%s", ne, out->body) > 0) {
            free(out->body);
            out->body = both;
            out->len = nl + out->len;
        }
        free(ne);
    }
    json_decref(note);
}

/* A tools/call answered as a progress stream: the job the handler runs on a worker. */
static s_job_t *s_job_new(s_ctx_t *x, const json_t *id, const char *name, json_t *args,
                          json_t *token)
{
    s_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->m = x->m;
    snprintf(j->caller, sizeof j->caller, "%s", x->caller);
    snprintf(j->tool, sizeof j->tool, "%s", name);
    j->structured = s_structured(x->version);
    j->modern = x->modern;
    j->id = json_incref((json_t *)id);
    j->args = json_is_object(args) ? json_incref(args) : NULL;
    j->token = json_incref(token);
    j->level = x->level;
    pthread_mutex_init(&j->mu, NULL);
    return j;
}

/* tools/call: argument errors answer at once; the call itself runs synchronously or, for a
 * client asking for progress over SSE, as a job. Returns false when *code / *emsg say why. */
static bool s_tools_call(s_ctx_t *x, const json_t *id, const json_t *params, s_out_t *out,
                         int *code, const char **emsg, char *buf, size_t cap)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    json_t *token = json_object_get(json_object_get(params, "_meta"), "progressToken");
    *code = KB_RPC_PARAMS;
    if (!name) {
        *emsg = "name is required";
    } else if (!kb_mcp_tool_exists(name)) {
        snprintf(buf, cap, "Unknown tool: %.500s", name);
        *emsg = buf;
    } else if (args && !json_is_object(args) && !json_is_null(args)) {
        *emsg = "arguments must be an object";
    } else if (x->sse && (json_is_string(token) || json_is_integer(token))) {
        if (!(out->job = s_job_new(x, id, name, args, token))) {
            *code = KB_RPC_INTERNAL;
            *emsg = "out of memory";
            return false;
        }
        out->status = 200;
        out->ctype = "text/event-stream";
        return true;
    } else { /* the call runs on a worker: an HTTP thread never waits on the service */
        if (!(out->job = s_job_new(x, id, name, args, NULL))) {
            *code = KB_RPC_INTERNAL;
            *emsg = "out of memory";
            return false;
        }
        out->job->plain = true;
        out->job->sse = x->sse && (!x->json || x->level <= 3); /* a failure's log note fits */
        snprintf(out->job->version, sizeof out->job->version, "%s", x->version);
        out->status = 200;
        out->ctype = out->job->sse ? "text/event-stream" : "application/json";
        return true;
    }
    return false;
}

static json_t *s_prompts_get(const json_t *params, int *code, const char **emsg, char *buf,
                             size_t cap)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    *code = KB_RPC_PARAMS;
    if (!name) {
        *emsg = "name is required";
        return NULL;
    }
    if (args && !json_is_object(args) && !json_is_null(args)) {
        *emsg = "arguments must be an object";
        return NULL;
    }
    *emsg = buf;
    return kb_mcp_prompt_get(name, json_is_object(args) ? args : NULL, code, buf, cap);
}

/* Methods of one era only: initialize-based revisions have initialize, ping and
 * logging/setLevel; 2026-07-28 has server/discover (its log level is per request). */
static bool s_method_in_era(const char *method, bool modern)
{
    static const char *const legacy_only[] = {"initialize", "ping", "logging/setLevel"};
    if (strcmp(method, "server/discover") == 0)
        return modern;
    for (size_t i = 0; i < sizeof legacy_only / sizeof legacy_only[0]; i++)
        if (strcmp(method, legacy_only[i]) == 0)
            return !modern;
    return true;
}

static void s_dispatch(s_ctx_t *x, const json_t *id, const char *method, const json_t *params,
                       s_out_t *out)
{
    int code = 0;
    const char *emsg = NULL;
    char buf[600];
    json_t *result = NULL, *edata = NULL;
    bool cacheable = false;
    if (!s_method_in_era(method, x->modern)) {
        code = KB_RPC_METHOD;
    } else if (strcmp(method, "initialize") == 0) {
        result = s_initialize(x, params, out, &code, &emsg);
    } else if (strcmp(method, "server/discover") == 0) {
        result = s_discover();
        cacheable = true;
    } else if (strcmp(method, "ping") == 0) {
        result = json_object();
    } else if (strcmp(method, "tools/list") == 0) {
        result = json_pack("{s:o}", "tools", kb_mcp_tools_list());
        cacheable = true;
    } else if (strcmp(method, "prompts/list") == 0) {
        result = json_pack("{s:o}", "prompts", kb_mcp_prompts_list());
        cacheable = true;
    } else if (strcmp(method, "resources/list") == 0) {
        result = json_pack("{s:[]}", "resources");
        cacheable = true;
    } else if (strcmp(method, "resources/templates/list") == 0) {
        result = json_pack("{s:[]}", "resourceTemplates");
        cacheable = true;
    } else if (strcmp(method, "resources/read") == 0) {
        s_resource_read(x->modern, params, &code, buf, sizeof buf, &edata);
        emsg = buf;
    } else if (strcmp(method, "logging/setLevel") == 0) {
        result = s_set_level(x, params, &code, &emsg);
    } else if (strcmp(method, "prompts/get") == 0) {
        result = s_prompts_get(params, &code, &emsg, buf, sizeof buf);
    } else if (strcmp(method, "tools/call") == 0) {
        if (s_tools_call(x, id, params, out, &code, &emsg, buf, sizeof buf))
            return;
    } else {
        code = KB_RPC_METHOD;
    }
    if (result) {
        result = s_result_finish(x->m, x->modern, result, cacheable);
        s_answer(out, 200, s_rpc_result(id, result), x->sse && !x->json);
        return;
    }
    if (code == KB_RPC_METHOD) {
        snprintf(buf, sizeof buf, "Method not found: %.500s", method);
        emsg = buf;
    } else if (!code) {
        code = KB_RPC_INTERNAL;
        emsg = "out of memory";
    }
    /* 2026-07-28: an unknown method is 404, so a client tells it from a legacy server's */
    unsigned status = x->modern && code == KB_RPC_METHOD ? 404 : 200;
    s_answer(out, status, s_rpc_error_data(id, code, emsg, edata), x->sse && !x->json);
}

/* ---- the request -------------------------------------------------------------------------------
 */

static void s_answer_verdict(s_out_t *out, const json_t *id, kb_mcp_verdict_t *v)
{
    s_answer(out, v->status, s_rpc_error_data(id, v->code, v->msg, v->data), false);
    v->data = NULL;
}

/* Finds the legacy session a request names (Mcp-Session-Id) and takes its revision and log
 * level; false when the id is unknown or another identity's. */
static bool s_legacy_session(kb_mcp_t *m, const s_in_t *in, s_ctx_t *x)
{
    pthread_mutex_lock(&m->mu);
    s_session_t *s = s_session_find(m, in->session, x->caller);
    if (s) {
        s->used = time(NULL);
        snprintf(x->version, sizeof x->version, "%s", s->version);
        snprintf(x->session, sizeof x->session, "%s", s->id);
        x->level = s->level;
    }
    pthread_mutex_unlock(&m->mu);
    return s != NULL;
}

/* A well-formed JSON-RPC request: picks its revision, applies that revision's rules, then
 * dispatches. */
static void s_serve_request(kb_mcp_t *m, const s_in_t *in, s_ctx_t *x, const json_t *id,
                            const char *method, const json_t *params, s_out_t *out)
{
    const char *version;
    kb_mcp_verdict_t v;
    if (kb_mcp_era(in->protocol, params, &version, &v)) {
        s_answer_verdict(out, id, &v);
        return;
    }
    x->modern = kb_mcp_version_modern(version); /* a modern initialize is a removed method */
    snprintf(x->version, sizeof x->version, "%s", version ? version : S_DEFAULT_VERSION);
    if (x->modern) { /* stateless: Mcp-Session-Id is ignored, none is minted or echoed */
        int level;
        if (kb_mcp_modern_check(in->protocol, in->mcp_method, in->mcp_name, method, params, &level,
                                &v)) {
            s_answer_verdict(out, id, &v);
            return;
        }
        x->level = level < 0 ? S_NO_LOG : level;
        s_dispatch(x, id, method, params, out);
        return;
    }
    if (in->session && strcmp(method, "initialize") != 0 && !s_legacy_session(m, in, x)) {
        s_answer_error(out, 404, id, KB_RPC_SESSION, "Session not found");
        return;
    }
    s_dispatch(x, id, method, params, out);
    if (x->session[0] && !out->session[0])
        snprintf(out->session, sizeof out->session, "%s", x->session);
}

static void s_serve_post(kb_mcp_t *m, const s_in_t *in, const char *caller, s_out_t *out)
{
    s_ctx_t x = {.m = m, .caller = caller, .level = 1};
    const char *acc = in->accept;
    x.json = !acc || !*acc || s_list_has(acc, "application/json") ||
             s_list_has(acc, "application/*") || s_list_has(acc, "*/*");
    x.sse = acc && s_list_has(acc, "text/event-stream");
    if (!x.json && !x.sse) {
        s_answer_error(out, 406, NULL, KB_RPC_INVALID,
                       "Not Acceptable: Accept must include application/json or "
                       "text/event-stream");
        return;
    }
    if (!in->content_type || strncasecmp(in->content_type, "application/json", 16) != 0) {
        s_answer_error(out, 415, NULL, KB_RPC_INVALID,
                       "Unsupported Media Type: Content-Type must be application/json");
        return;
    }
    if (in->len > m->max_body) {
        s_answer_error(out, 413, NULL, KB_RPC_INVALID, "Request body too large");
        return;
    }
    json_error_t jerr;
    json_t *msg = json_loadb(in->body ? in->body : "", in->len,
                             JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!msg) {
        char t[300];
        snprintf(t, sizeof t, "Parse error: %s", jerr.text);
        s_answer_error(out, 400, NULL, KB_RPC_PARSE, t);
        return;
    }
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    json_t *params = json_object_get(msg, "params");
    bool id_ok = !id || json_is_string(id) || json_is_integer(id);
    if (json_is_array(msg)) {
        s_answer_error(out, 400, NULL, KB_RPC_INVALID,
                       "Invalid Request: batch requests are not supported; send one message per "
                       "POST");
    } else if (!json_is_object(msg) ||
               strcmp(json_string_value(json_object_get(msg, "jsonrpc")) ?: "", "2.0") != 0) {
        s_answer_error(out, 400, id_ok ? id : NULL, KB_RPC_INVALID,
                       "Invalid Request: not a JSON-RPC 2.0 message");
    } else if (!id_ok) {
        s_answer_error(out, 400, NULL, KB_RPC_INVALID,
                       "Invalid Request: id must be a string or an integer");
    } else if (!method) {
        if (id && (json_object_get(msg, "result") || json_object_get(msg, "error")))
            out->status = 202; /* a response to us: we send no requests, nothing to do */
        else
            s_answer_error(out, 400, id, KB_RPC_INVALID, "Invalid Request: method is required");
    } else if (!id) {
        out->status = 202; /* a notification (initialized, cancelled, ...) */
    } else if (params && !json_is_object(params)) {
        s_answer_error(out, 200, id, KB_RPC_PARAMS, "Invalid params: params must be an object");
    } else {
        double began = ka_metric_now();
        s_serve_request(m, in, &x, id, method, params, out);
        char code[16]; /* the HTTP status: a streamed answer counts until its stream opens */
        snprintf(code, sizeof code, "%d", (int)out->status);
        ka_metric_observe(KA_METRIC_MCP, method, code, ka_metric_now() - began);
    }
    atomic_fetch_add(&m->requests, 1);
    json_decref(msg);
}

static void s_serve(kb_mcp_t *m, const s_in_t *in, s_out_t *out)
{
    memset(out, 0, sizeof *out);
    /* DNS-rebinding protection first: a browser page must not reach us through a name it
     * controls */
    if (!in->host || !kb_http_host_allowed((const char *const *)m->hosts, in->host)) {
        s_answer_error(out, 403, NULL, KB_RPC_INVALID, "Forbidden: Host header not allowed");
        return;
    }
    if (in->origin && !s_origin_allowed(m, in->origin)) {
        s_answer_error(out, 403, NULL, KB_RPC_INVALID, "Forbidden: Origin header not allowed");
        return;
    }
    char caller[KB_AUTH_ID_MAX + 1], why[KB_AUTH_ID_MAX + 1];
    if (kb_auth_identify_conn(m->auth, in->conn_fd, in->authorization, in->user_id, caller,
                              sizeof caller)) {
        snprintf(why, sizeof why, "%s", caller);
        char msg[KB_AUTH_ID_MAX + 32];
        snprintf(msg, sizeof msg, "Unauthorized: %s", why);
        s_answer_error(out, 401, NULL, KB_RPC_SERVER, msg);
        out->www_auth = kb_auth_mode(m->auth) == KB_AUTH_TOKENS;
        return;
    }
    if (strcmp(in->method, "POST") == 0) {
        s_serve_post(m, in, caller, out);
    } else if (strcmp(in->method, "DELETE") == 0) {
        if (!in->session)
            s_answer_error(out, 400, NULL, KB_RPC_INVALID,
                           "Bad Request: Mcp-Session-Id header is required");
        else if (!s_session_delete(m, in->session, caller))
            s_answer_error(out, 404, NULL, KB_RPC_SESSION, "Session not found");
        else
            out->status = 200;
    } else {
        out->allow = "POST, DELETE";
        s_answer_error(out, 405, NULL, KB_RPC_INVALID,
                       "Method Not Allowed: this server offers no standalone SSE stream");
    }
}

/* ---- progress workers
 * ---------------------------------------------------------------------------- */

static void s_job_write(s_job_t *j, json_t *msg)
{
    size_t len;
    char *ev = msg ? s_sse_event(msg, &len) : NULL;
    json_decref(msg);
    if (!ev)
        return;
    pthread_mutex_lock(&j->mu);
    if (j->stream)
        kb_http_stream_write(j->stream, ev, len);
    pthread_mutex_unlock(&j->mu);
    free(ev);
}

static void s_job_tick(void *arg)
{
    s_job_t *j = arg;
    j->progress += 1;
    s_job_write(j,
                json_pack("{s:s,s:s,s:{s:O,s:f,s:s}}", "jsonrpc", "2.0", "method",
                          "notifications/progress", "params", "progressToken", j->token, "progress",
                          j->progress, "message", "waiting for the sandbox service"));
}

static void s_job_free(s_job_t *j)
{
    json_decref(j->id);
    json_decref(j->args);
    json_decref(j->token);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* A plain job's answer into *out, as s_tools_call_sync makes it. */
static void s_job_answer(s_job_t *j, s_out_t *out)
{
    s_ctx_t x = {.m = j->m,
                 .caller = j->caller,
                 .level = j->level,
                 .modern = j->modern,
                 .sse = j->sse,
                 .json = !j->sse};
    snprintf(x.version, sizeof x.version, "%s", j->version);
    memset(out, 0, sizeof *out);
    s_tools_call_sync(&x, j->id, j->tool, j->args, out);
}

/* Runs the job to its end and closes the stream (the stream may be NULL in tests). */
static void s_job_run(s_job_t *j)
{
    if (j->plain) {
        s_out_t out;
        s_job_answer(j, &out);
        pthread_mutex_lock(&j->mu);
        if (j->stream && out.body)
            kb_http_stream_write(j->stream, out.body, out.len);
        kb_http_stream_close(&j->stream);
        pthread_mutex_unlock(&j->mu);
        free(out.body);
        return;
    }
    kb_mcp_call_t c = {.svc = j->m->svc,
                       .caller = j->caller,
                       .structured = j->structured,
                       .tick_ms = j->m->progress_ms,
                       .tick = s_job_tick,
                       .tick_arg = j};
    /* one progress event at once, so even a quick call shows the client it is under way */
    s_job_write(j, json_pack("{s:s,s:s,s:{s:O,s:i,s:s}}", "jsonrpc", "2.0", "method",
                             "notifications/progress", "params", "progressToken", j->token,
                             "progress", 0, "message", j->tool));
    json_t *r = s_result_finish(j->m, j->modern, kb_mcp_tool_call(&c, j->tool, j->args), false);
    s_count_result(j->m, r);
    s_job_write(j, s_log_note(j->level, j->tool, r));
    s_job_write(j,
                r ? s_rpc_result(j->id, r) : s_rpc_error(j->id, KB_RPC_INTERNAL, "out of memory"));
    pthread_mutex_lock(&j->mu);
    kb_http_stream_close(&j->stream);
    pthread_mutex_unlock(&j->mu);
}

static void *s_job_main(void *arg)
{
    s_job_t *j = arg;
    kb_mcp_t *m = j->m;
    s_job_run(j);
    s_job_free(j);
    pthread_mutex_lock(&m->mu);
    if (--m->workers == 0)
        pthread_cond_broadcast(&m->idle);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

unsigned kb_mcp_post(kb_mcp_t *m, const char *accept, const char *user_id, const char *session,
                     const char *protocol, const char *body, size_t len, char **answer,
                     size_t *answer_len)
{
    s_in_t in = {.method = "POST",
                 .host = "localhost",
                 .accept = accept,
                 .content_type = "application/json",
                 .session = session,
                 .protocol = protocol,
                 .user_id = user_id,
                 .body = body,
                 .len = len};
    /* Mcp-Method and Mcp-Name as a conforming client derives them from the body */
    json_t *msg = json_loadb(body ? body : "", len, JSON_DECODE_ANY, NULL);
    json_t *params = json_object_get(msg, "params");
    in.mcp_method = json_string_value(json_object_get(msg, "method"));
    in.mcp_name = json_string_value(json_object_get(params, "name"))
                      ?: json_string_value(json_object_get(params, "uri"));
    s_out_t out;
    s_serve(m, &in, &out);
    json_decref(msg);
    if (out.job && out.job->plain) { /* no HTTP thread to spare: answer here */
        s_job_t *j = out.job;
        s_job_answer(j, &out);
        s_job_free(j);
    } else if (out.job) { /* no stream: the job's events go nowhere */
        s_job_run(out.job);
        s_job_free(out.job);
    }
    *answer = out.body;
    *answer_len = out.body ? out.len : 0;
    return out.status;
}

/* ---- kb_http glue ---------------------------------------------------------------------------- */

static void s_handler(kb_http_req_t *req, void *arg)
{
    kb_mcp_t *m = arg;
    s_in_t in = {.method = kb_http_req_method(req),
                 .host = kb_http_req_header(req, "Host"),
                 .origin = kb_http_req_header(req, "Origin"),
                 .accept = kb_http_req_header(req, "Accept"),
                 .content_type = kb_http_req_header(req, "Content-Type"),
                 .session = kb_http_req_header(req, "Mcp-Session-Id"),
                 .protocol = kb_http_req_header(req, "Mcp-Protocol-Version"),
                 .mcp_method = kb_http_req_header(req, "Mcp-Method"),
                 .mcp_name = kb_http_req_header(req, "Mcp-Name"),
                 .authorization = kb_http_req_header(req, "Authorization"),
                 .user_id = kb_http_req_header(req, "X-User-Id"),
                 .conn_fd = kb_http_req_conn_fd(req)};
    in.body = kb_http_req_body(req, &in.len);
    s_out_t out;
    s_serve(m, &in, &out);
    if (out.session[0])
        kb_http_req_add_header(req, "Mcp-Session-Id", out.session);
    if (out.allow)
        kb_http_req_add_header(req, "Allow", out.allow);
    if (out.www_auth)
        kb_http_req_add_header(req, "WWW-Authenticate", "Bearer realm=\"kagent\"");
    if (out.job) {
        kb_http_req_add_header(req, "Cache-Control", "no-cache, no-transform");
        kb_http_req_add_header(req, "X-Accel-Buffering", "no");
        s_job_t *j = out.job;
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        bool started = false;
        if (kb_http_respond_stream(req, 200, out.ctype, &j->stream) == 0) {
            pthread_mutex_lock(&m->mu);
            m->workers++;
            pthread_mutex_unlock(&m->mu);
            started = pthread_create(&th, &attr, s_job_main, j) == 0;
            if (!started) {
                pthread_mutex_lock(&m->mu);
                m->workers--;
                pthread_mutex_unlock(&m->mu);
                s_job_run(j); /* no thread: answer here (no live progress) */
                s_job_free(j);
            }
        } else {
            kb_http_respond(req, 500, "text/plain; charset=utf-8", "cannot stream\n", 14);
            s_job_free(j);
        }
        pthread_attr_destroy(&attr);
        return;
    }
    if (out.ctype && out.ctype[0] == 't' && strcmp(out.ctype, "text/event-stream") == 0)
        kb_http_req_add_header(req, "Cache-Control", "no-cache, no-transform");
    kb_http_respond(req, out.status, out.ctype, out.body, out.body ? out.len : 0);
    free(out.body);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

kb_mcp_t *kb_mcp_new(kb_http_t *http, ka_service_t *svc, const kb_auth_t *auth,
                     const kb_mcp_options_t *opts)
{
    static const char *const loopback[] = {"localhost", "127.0.0.1", "[::1]", NULL};
    kb_mcp_options_t o = opts ? *opts : (kb_mcp_options_t){0};
    if (!auth)
        return NULL;
    kb_mcp_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->http = http;
    m->svc = svc;
    m->auth = auth;
    m->hosts = s_strv_dup(o.allowed_hosts ? o.allowed_hosts : loopback);
    bool ok = m->hosts != NULL;
    if (o.allowed_origins) {
        m->origins = s_strv_dup(o.allowed_origins);
        while (m->origins && m->origins[m->n_origins])
            m->n_origins++;
    } else if (m->hosts) { /* http:// and https:// with each allowed host */
        size_t n = 0;
        while (m->hosts[n])
            n++;
        m->origins = calloc(2 * n + 1, sizeof *m->origins);
        m->n_origins = m->origins ? 2 * n : 0;
        for (size_t i = 0; m->origins && i < n; i++) {
            if (strcmp(m->hosts[i], "*") == 0) {
                m->origins[2 * i] = strdup("*");
                m->origins[2 * i + 1] = strdup("*");
            } else {
                if (asprintf(&m->origins[2 * i], "http://%s", m->hosts[i]) < 0)
                    m->origins[2 * i] = NULL;
                if (asprintf(&m->origins[2 * i + 1], "https://%s", m->hosts[i]) < 0)
                    m->origins[2 * i + 1] = NULL;
            }
        }
    }
    m->name = strdup(o.server_name ? o.server_name : "kagent");
    m->version = strdup(o.server_version ? o.server_version : "0.1.0");
    m->max_body = o.max_body ? o.max_body : KB_MCP_MAX_BODY;
    m->max_sessions = o.max_sessions > 0 ? o.max_sessions : KB_MCP_MAX_SESSIONS;
    m->progress_ms = o.progress_interval_ms > 0 ? o.progress_interval_ms : 1000;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->idle, NULL);
    ok = ok && m->origins && m->name && m->version;
    for (size_t i = 0; ok && i < m->n_origins; i++)
        ok = m->origins[i] != NULL;
    if (ok && http) {
        int rc = kb_http_route(http, KB_MCP_PATH, KB_HTTP_GET | KB_HTTP_POST | KB_HTTP_DELETE,
                               s_handler, m);
        if (rc) {
            krt_log(KRT_LOG_ERROR, LOG_PATH, "route_failed", "path=%s err=%d", KB_MCP_PATH, rc);
            ok = false;
        }
    }
    if (!ok) {
        kb_mcp_destroy(&m);
        return NULL;
    }
    json_decref(kb_mcp_tools_list()); /* parse the schemas once, now */
    return m;
}

void kb_mcp_destroy(kb_mcp_t **m_p)
{
    if (!m_p || !*m_p)
        return;
    kb_mcp_t *m = *m_p;
    *m_p = NULL;
    pthread_mutex_lock(&m->mu);
    while (m->workers > 0) /* each ends once its service call answers */
        pthread_cond_wait(&m->idle, &m->mu);
    while (m->sessions) {
        s_session_t *s = m->sessions;
        m->sessions = s->next;
        free(s);
    }
    pthread_mutex_unlock(&m->mu);
    pthread_cond_destroy(&m->idle);
    pthread_mutex_destroy(&m->mu);
    s_strv_free(m->hosts);
    for (size_t i = 0; m->origins && i < m->n_origins; i++)
        free(m->origins[i]);
    free(m->origins);
    free(m->name);
    free(m->version);
    free(m);
}

void kb_mcp_stats(kb_mcp_t *m, kb_mcp_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->requests = atomic_load(&m->requests);
    out->tool_calls = atomic_load(&m->tool_calls);
    out->tool_errors = atomic_load(&m->tool_errors);
    pthread_mutex_lock(&m->mu);
    out->sessions = (unsigned long)m->n_sessions;
    pthread_mutex_unlock(&m->mu);
}
