/*
 * The MCP bridge without a node. The bridge's own .c files are included to reach s_serve (the
 * transport-free request handler) and the helpers; a fake control plane (one actor on the real
 * runtime, answering the sandboxes actor's messages with canned records, frames and files)
 * stands behind a real ka_service, so the waiting, streaming and paging code runs for real. The
 * last tests go through kb_http on loopback sockets (headers, SSE, progress worker).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sys/socket.h>

#include "mcp.c"

/* s_serve, then what the worker does for a tools/call without progress: its answer. */
static void s_serve_answered(kb_mcp_t *m, const s_in_t *in, s_out_t *out)
{
    s_serve(m, in, out);
    if (out->job && out->job->plain) {
        s_job_t *j = out->job;
        s_job_answer(j, out);
        s_job_free(j);
    }
}
#include "mcp_tools.c"
#include "mcp_content.c"
#include "mcp_pager.c"
#include "mcp_schema.c"
#include "mcp_era.c"
#include "mcp_image.c"
#include "mcp_files.c"

#include <webp/encode.h>

#define CHUNK (256u << 10)
#define ALICE "alice@example.com"
#define BOB   "bob@example.com"
#define SBX   "0198c0de-0000-7000-8000-000000000001"
#define SLOW  "0198c0de-0000-7000-8000-00000000000f"

/* ---- the fake control plane ------------------------------------------------------------------ */

typedef struct {
    char path[64];
    unsigned char *data;
    size_t len;
} s_file_t;

static struct {
    krt_system_t *sys;
    krt_addr_t fake;
    ka_service_t *svc;
    kb_auth_t *auth;
    kb_mcp_t *m;
    pthread_mutex_t mu;
    s_file_t files[8];
    int n_files;
    char *out; /* stdout of process 7 */
    size_t out_len;
    char last_argv[512]; /* the last START's tail, NULs as '|' */
    uint32_t last_mode;
} F;

static void s_add_file(const char *path, const void *data, size_t len)
{
    pthread_mutex_lock(&F.mu);
    s_file_t *f = NULL;
    for (int i = 0; i < F.n_files; i++)
        if (strcmp(F.files[i].path, path) == 0)
            f = &F.files[i];
    if (!f) {
        assert_true(F.n_files < 8);
        f = &F.files[F.n_files++];
        snprintf(f->path, sizeof f->path, "%s", path);
    }
    free(f->data);
    f->data = malloc(len ? len : 1);
    memcpy(f->data, data, len);
    f->len = len;
    pthread_mutex_unlock(&F.mu);
}

static void s_sandbox(const char *id, const char *caller, ka_store_sandbox_t *sb)
{
    memset(sb, 0, sizeof *sb);
    snprintf(sb->id, sizeof sb->id, "%s", id);
    snprintf(sb->creator, sizeof sb->creator, "%s", caller);
    snprintf(sb->template_namespace, sizeof sb->template_namespace, "kagent");
    snprintf(sb->template_name, sizeof sb->template_name, "python");
    sb->state = KA_STATE_READY;
    sb->operation = KA_OP_NONE;
    snprintf(sb->node, sizeof sb->node, "node-1");
    sb->expires_ms = 1767225600120; /* 2026-01-01T00:00:00.12Z */
}

static void s_frame(krt_ctx_t *ctx, krt_addr_t to, int final, int code, int stream, uint64_t offset,
                    const void *data, size_t len, const ka_guest_reply_t *tmpl)
{
    if (code != KA_OK) { /* a failing frame: its errno and message only */
        ka_frame_fail_t e;
        size_t n = ka_frame_final(&e, ka_err_of_code(code),
                                  code == KA_NOT_FOUND ? "no such file or directory" : "");
        e.frame.final = final;
        krt_send(ctx, to, KA_SBX_GUEST_FRAME, &e, n);
        return;
    }
    ka_guest_reply_t *f = calloc(1, sizeof *f + len);
    if (tmpl)
        *f = *tmpl;
    f->final = final;
    f->stream = stream;
    f->offset = offset;
    f->tail_len = (uint32_t)len;
    if (len)
        memcpy(f->tail, data, len);
    krt_send(ctx, to, KA_SBX_GUEST_FRAME, f, sizeof *f + len);
    free(f);
}

static void s_fake_guest(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const ka_guest_req_t *q = msg->body;
    ka_guest_reply_t t;
    memset(&t, 0, sizeof t);
    if (strcmp(q->caller, ALICE) != 0) {
        s_frame(ctx, msg->from, 1, KA_NOT_FOUND, 0, 0, NULL, 0, NULL);
        return;
    }
    if (strcmp(q->sandbox_id, SLOW) == 0)
        usleep(300 * 1000); /* a slow call: progress ticks while it waits */
    t.has_process = 1;
    t.process.proc = 7;
    switch (q->op) {
    case KA_GUEST_START: {
        size_t n = q->tail_len < sizeof F.last_argv - 1 ? q->tail_len : sizeof F.last_argv - 1;
        for (size_t i = 0; i < n; i++)
            F.last_argv[i] = q->tail[i] ? q->tail[i] : '|';
        F.last_argv[n] = '\0';
        t.process.state = 1;
        s_frame(ctx, msg->from, 1, KA_OK, 0, 0, NULL, 0, &t);
        break;
    }
    case KA_GUEST_GET:
        t.process.state = 2;
        t.process.exit_code = 137;
        s_frame(ctx, msg->from, 1, KA_OK, 0, 0, NULL, 0, &t);
        break;
    case KA_GUEST_SIGNAL:
        t.process.state = 1;
        s_frame(ctx, msg->from, 1, q->signal == SIGKILL ? KA_OK : KA_INVALID_ARGUMENT, 0, 0, NULL,
                0, &t);
        break;
    case KA_GUEST_OUTPUT: {
        for (uint64_t off = q->stdout_offset; off < F.out_len; off += CHUNK) {
            size_t n = F.out_len - off < CHUNK ? F.out_len - off : CHUNK;
            s_frame(ctx, msg->from, 0, KA_OK, KA_STREAM_STDOUT, off, F.out + off, n, NULL);
        }
        if (q->stderr_offset < 4)
            s_frame(ctx, msg->from, 0, KA_OK, KA_STREAM_STDERR, q->stderr_offset,
                    "oops" + q->stderr_offset, 4 - q->stderr_offset, NULL);
        t.process.state = 2;
        t.process.exit_code = 3;
        s_frame(ctx, msg->from, 1, KA_OK, 0, 0, NULL, 0, &t);
        break;
    }
    case KA_GUEST_READ: {
        t.has_process = 0;
        pthread_mutex_lock(&F.mu);
        s_file_t *f = NULL;
        for (int i = 0; i < F.n_files; i++)
            if (strcmp(F.files[i].path, q->path) == 0)
                f = &F.files[i];
        if (!f) {
            pthread_mutex_unlock(&F.mu);
            s_frame(ctx, msg->from, 1, KA_NOT_FOUND, 0, 0, NULL, 0, &t);
            break;
        }
        for (size_t off = 0; off < f->len; off += CHUNK) {
            size_t n = f->len - off < CHUNK ? f->len - off : CHUNK;
            s_frame(ctx, msg->from, 0, KA_OK, KA_STREAM_FILE, off, f->data + off, n, NULL);
        }
        t.written = f->len;
        pthread_mutex_unlock(&F.mu);
        s_frame(ctx, msg->from, 1, KA_OK, 0, 0, NULL, 0, &t);
        break;
    }
    case KA_GUEST_WRITE:
        F.last_mode = q->mode;
        s_add_file(q->path, q->tail, q->tail_len);
        t.has_process = 0;
        t.written = q->tail_len;
        s_frame(ctx, msg->from, 1, KA_OK, 0, 0, NULL, 0, &t);
        break;
    }
}

static void s_fake_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    switch (msg->type) {
    case KA_SBX_GET:
    case KA_SBX_DELETE: {
        const ka_sbx_key_t *k = msg->body;
        ka_sbx_reply_t r;
        memset(&r, 0, sizeof r);
        s_sandbox(k->id, k->caller, &r.sandbox);
        if (msg->type == KA_SBX_DELETE)
            r.sandbox.state = KA_STATE_DELETED;
        if (strcmp(k->id, SLOW) == 0)
            usleep(300 * 1000);
        if (strcmp(k->caller, ALICE) != 0)
            krt_reply_error(ctx, msg, -ENOENT, KA_MSG_NOT_FOUND);
        else
            krt_reply_to(ctx, msg->from, msg->ref, msg->type, &r, sizeof r);
        break;
    }
    case KA_SBX_CREATE: {
        const ka_sbx_create_t *c = msg->body;
        ka_sbx_reply_t r;
        memset(&r, 0, sizeof r);
        s_sandbox(SBX, c->caller, &r.sandbox);
        snprintf(r.sandbox.name, sizeof r.sandbox.name, "%s", c->name);
        if (c->ttl_ms != 0 && c->ttl_ms < 1000)
            krt_reply_error(ctx, msg, -EINVAL, "ttl must be between 1s and 86400s");
        else
            krt_reply_to(ctx, msg->from, msg->ref, msg->type, &r, sizeof r);
        break;
    }
    case KA_SBX_LIST: {
        const ka_sbx_list_req_t *q = msg->body;
        size_t len = sizeof(ka_sbx_list_t) + 2 * sizeof(ka_store_sandbox_t);
        ka_sbx_list_t *l = calloc(1, len);
        l->count = 2;
        l->more = q->offset == 0;
        s_sandbox(SBX, q->caller, &l->items[0]);
        s_sandbox(SLOW, q->caller, &l->items[1]);
        l->items[1].node[0] = '\0'; /* not placed */
        krt_reply_to(ctx, msg->from, msg->ref, msg->type, l, len);
        free(l);
        break;
    }
    case KA_SBX_GUEST:
        s_fake_guest(ctx, msg);
        break;
    default:
        break;
    }
}

static const krt_behaviour_t s_fake = {.kind = "fake-sandboxes", .handle = s_fake_handle};

static int s_setup(void **state)
{
    pthread_mutex_init(&F.mu, NULL);
    krt_config_t cfg = {.node_id = 1, .name = "node-test"};
    F.sys = krt_system_new(&cfg);
    assert_non_null(F.sys);
    assert_int_equal(krt_system_start(F.sys), 0);
    krt_spawn_opts_t fo = {.name = "fake", .register_name = true};
    assert_int_equal(krt_system_spawn(F.sys, &s_fake, NULL, &fo, &F.fake), 0);
    F.svc = ka_service_new(F.sys, "fake", "fake");
    assert_non_null(F.svc);
    int err = 0;
    F.auth = kb_auth_new(KB_AUTH_USER_HEADER, NULL, &err, NULL, 0);
    assert_non_null(F.auth);
    kb_mcp_options_t o = {.max_sessions = 8, .progress_interval_ms = 50};
    F.m = kb_mcp_new(NULL, F.svc, F.auth, &o);
    assert_non_null(F.m);
    return 0;
}

static int s_teardown(void **state)
{
    kb_mcp_destroy(&F.m);
    kb_mcp_destroy(&F.m); /* idempotent */
    kb_auth_destroy(&F.auth);
    ka_service_destroy(&F.svc);
    krt_system_destroy(&F.sys);
    for (int i = 0; i < F.n_files; i++)
        free(F.files[i].data);
    free(F.out);
    pthread_mutex_destroy(&F.mu);
    return 0;
}

/* ---- request helpers ---------------------------------------------------------------------------
 */

static s_in_t s_in(const char *body)
{
    return (s_in_t){.method = "POST",
                    .host = "localhost:8083",
                    .accept = "application/json, text/event-stream",
                    .content_type = "application/json",
                    .user_id = ALICE,
                    .body = body,
                    .len = body ? strlen(body) : 0};
}

/* The last JSON-RPC message of an answer (JSON body, or the last SSE data line). */
static json_t *s_msg(const s_out_t *o)
{
    assert_non_null(o->body);
    const char *p = o->body;
    if (strcmp(o->ctype, "text/event-stream") == 0) {
        const char *last = NULL;
        for (const char *d = strstr(p, "data: "); d; d = strstr(d + 1, "data: "))
            last = d + 6;
        assert_non_null(last);
        p = last;
    }
    json_error_t e;
    json_t *j = json_loadb(p, strcspn(p, "\n") ? strcspn(p, "\n") : strlen(p), 0, &e);
    if (!j)
        fail_msg("not JSON (%s): %s", e.text, o->body);
    return j;
}

/* POSTs body as ALICE with JSON accepted; returns the last message (caller decrefs). */
static json_t *s_rpc(const char *body, unsigned want_status)
{
    s_in_t in = s_in(body);
    in.accept = "application/json";
    s_out_t out;
    s_serve_answered(F.m, &in, &out);
    assert_null(out.job);
    if (out.status != want_status)
        fail_msg("status %u, want %u: %s", out.status, want_status, out.body ? out.body : "");
    json_t *j = out.body ? s_msg(&out) : NULL;
    free(out.body);
    return j;
}

static int s_err_code(const json_t *j)
{
    return (int)json_integer_value(json_object_get(json_object_get(j, "error"), "code"));
}

static const char *s_err_msg(const json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "message"));
}

/* Calls a tool (JSON answer); returns the result object (borrowed from *holder). */
static json_t *s_tool(const char *name, const char *args_json, json_t **holder)
{
    char *body = NULL;
    assert_true(asprintf(&body,
                         "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":"
                         "{\"name\":\"%s\",\"arguments\":%s}}",
                         name, args_json) > 0);
    *holder = s_rpc(body, 200);
    free(body);
    json_t *r = json_object_get(*holder, "result");
    if (!r)
        fail_msg("no result: %s", json_dumps(*holder, 0));
    return r;
}

static const char *s_text(const json_t *result, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(result, "content"), i), "text"));
}

static bool s_is_error(const json_t *result)
{
    return json_is_true(json_object_get(result, "isError"));
}

/* A tool result's JSON text, parsed (caller decrefs). */
static json_t *s_obj(const json_t *result)
{
    assert_false(s_is_error(result));
    json_t *o = json_loads(s_text(result, 0), 0, NULL);
    assert_non_null(o);
    return o;
}

/* ---- JSON-RPC parsing and dispatch ---------------------------------------------------------- */

static void test_jsonrpc_errors(void **unused)
{
    json_t *j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,", 400);
    assert_int_equal(s_err_code(j), -32700);
    assert_true(json_is_null(json_object_get(j, "id")));
    json_decref(j);
    j = s_rpc("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]", 400);
    assert_int_equal(s_err_code(j), -32600);
    assert_non_null(strstr(s_err_msg(j), "batch"));
    json_decref(j);
    j = s_rpc("\"ping\"", 400);
    assert_int_equal(s_err_code(j), -32600);
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}", 400);
    assert_int_equal(s_err_code(j), -32600);
    assert_int_equal(json_integer_value(json_object_get(j, "id")), 1);
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"ping\"}", 400);
    assert_int_equal(s_err_code(j), -32600);
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", 400);
    assert_int_equal(s_err_code(j), -32600);
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1}", 400);
    assert_int_equal(s_err_code(j), -32600);
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"ping\"}", 400); /* duplicate */
    assert_int_equal(s_err_code(j), -32700);
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"completion/complete\"}", 200);
    assert_int_equal(s_err_code(j), -32601);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "a");
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"params\":[1]}", 200);
    assert_int_equal(s_err_code(j), -32602);
    json_decref(j);
    /* notifications and responses: 202, no body */
    assert_null(s_rpc("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", 202));
    assert_null(s_rpc("{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}", 202));
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}", 200);
    assert_int_equal(json_object_size(json_object_get(j, "result")), 0);
    assert_true(json_is_object(json_object_get(j, "result")));
    json_decref(j);
}

static json_t *s_init(const char *version, char *session_out)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{"
             "\"protocolVersion\":\"%s\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\","
             "\"version\":\"1\"}}}",
             version);
    s_in_t in = s_in(body);
    s_out_t out;
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 200);
    assert_int_equal(strlen(out.session), 32);
    if (session_out)
        strcpy(session_out, out.session);
    json_t *j = s_msg(&out);
    free(out.body);
    return j;
}

static void test_initialize_negotiates(void **unused)
{
    const char *ok[] = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"};
    for (size_t i = 0; i < 4; i++) {
        json_t *j = s_init(ok[i], NULL);
        json_t *r = json_object_get(j, "result");
        assert_string_equal(json_string_value(json_object_get(r, "protocolVersion")), ok[i]);
        json_decref(j);
    }
    json_t *j = s_init("2099-01-01", NULL);
    json_t *r = json_object_get(j, "result");
    assert_string_equal(json_string_value(json_object_get(r, "protocolVersion")), "2025-11-25");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r, "serverInfo"), "name")), "kagent");
    assert_non_null(strstr(json_string_value(json_object_get(r, "instructions")), "request_id"));
    json_t *caps = json_object_get(r, "capabilities");
    assert_non_null(json_object_get(caps, "tools"));
    assert_non_null(json_object_get(caps, "prompts"));
    assert_non_null(json_object_get(caps, "logging"));
    assert_int_equal(json_object_size(json_object_get(caps, "resources")), 0); /* none offered */
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{}}", 200);
    assert_int_equal(s_err_code(j), -32602);
    json_decref(j);
    /* the session cap drops the oldest */
    kb_mcp_stats_t st;
    kb_mcp_stats(F.m, &st);
    assert_true(st.sessions <= 8);
}

static void test_sessions(void **unused)
{
    char sid[33];
    json_decref(s_init("2025-06-18", sid));
    const char *ping = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}";
    s_in_t in = s_in(ping);
    in.session = sid;
    s_out_t out;
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 200);
    assert_string_equal(out.session, sid);
    free(out.body);
    /* another identity cannot use or end it */
    in.user_id = BOB;
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 404);
    free(out.body);
    in.method = "DELETE";
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 404);
    free(out.body);
    /* unknown session */
    in = s_in(ping);
    in.session = "00000000000000000000000000000000";
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 404);
    json_t *j = s_msg(&out);
    assert_int_equal(s_err_code(j), -32001);
    json_decref(j);
    free(out.body);
    /* logging/setLevel in the session */
    in = s_in("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"logging/setLevel\",\"params\":{"
              "\"level\":\"error\"}}");
    in.session = sid;
    s_serve_answered(F.m, &in, &out);
    j = s_msg(&out);
    assert_int_equal(json_object_size(json_object_get(j, "result")), 0);
    json_decref(j);
    free(out.body);
    in = s_in("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"logging/setLevel\",\"params\":{"
              "\"level\":\"loud\"}}");
    s_serve_answered(F.m, &in, &out);
    j = s_msg(&out);
    assert_int_equal(s_err_code(j), -32602);
    json_decref(j);
    free(out.body);
    /* DELETE ends it */
    in = s_in(NULL);
    in.method = "DELETE";
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 400); /* no session header */
    free(out.body);
    in.session = sid;
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 200);
    free(out.body);
    in = s_in(ping);
    in.session = sid;
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 404);
    free(out.body);
    /* without a session header the server is stateless: identity alone decides */
    in = s_in(ping);
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 200);
    free(out.body);
}

/* ---- 2026-07-28: stateless requests -------------------------------------------------------- */

#define MODERN_META                                                                                \
    "\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\","                       \
    "\"io.modelcontextprotocol/clientCapabilities\":{}"

/* A 2026-07-28 request: in with the standard headers for method (and name), body built from
 * params_head (members before _meta, may be "") and meta_tail (more _meta members, may be ""). */
static s_in_t s_modern_in(char **body, const char *method, const char *name,
                          const char *params_head, const char *meta_tail)
{
    assert_true(
        asprintf(body,
                 "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"%s\",\"params\":{%s%s" MODERN_META
                 "%s}}}",
                 method, params_head, *params_head ? "," : "", meta_tail) > 0);
    s_in_t in = s_in(*body);
    in.accept = "application/json, text/event-stream";
    in.protocol = "2026-07-28";
    in.mcp_method = method;
    in.mcp_name = name;
    return in;
}

/* Serves in; checks the status; returns the last message (caller decrefs). */
static json_t *s_serve_want(s_in_t *in, unsigned status, s_out_t *out)
{
    s_serve_answered(F.m, in, out);
    if (out->status != status)
        fail_msg("status %u, want %u: %s", out->status, status, out->body ? out->body : "");
    assert_null(out->job);
    json_t *j = out->body ? s_msg(out) : NULL;
    free(out->body);
    return j;
}

static void test_modern_results(void **unused)
{
    char *body;
    s_out_t out;
    s_in_t in = s_modern_in(&body, "server/discover", NULL, "", "");
    in.session = "0123456789abcdef0123456789abcdef"; /* ignored, never echoed */
    json_t *j = s_serve_want(&in, 200, &out);
    assert_string_equal(out.session, "");
    json_t *r = json_object_get(j, "result");
    assert_string_equal(json_string_value(json_object_get(r, "resultType")), "complete");
    json_t *sv = json_object_get(r, "supportedVersions");
    assert_string_equal(json_string_value(json_array_get(sv, 0)), "2026-07-28");
    assert_string_equal(json_string_value(json_array_get(sv, 1)), "2025-11-25");
    assert_non_null(json_object_get(json_object_get(r, "capabilities"), "tools"));
    assert_non_null(json_object_get(json_object_get(r, "capabilities"), "prompts"));
    assert_non_null(strstr(json_string_value(json_object_get(r, "instructions")), "request_id"));
    assert_int_equal(json_integer_value(json_object_get(r, "ttlMs")), KB_MCP_LIST_TTL_MS);
    assert_string_equal(json_string_value(json_object_get(r, "cacheScope")), "public");
    json_t *si = json_object_get(json_object_get(r, "_meta"), "io.modelcontextprotocol/serverInfo");
    assert_string_equal(json_string_value(json_object_get(si, "name")), "kagent");
    json_decref(j);
    free(body);
    const char *lists[] = {"tools/list", "prompts/list", "resources/list",
                           "resources/templates/list"};
    for (size_t i = 0; i < 4; i++) {
        in = s_modern_in(&body, lists[i], NULL, "", "");
        j = s_serve_want(&in, 200, &out);
        r = json_object_get(j, "result");
        assert_string_equal(json_string_value(json_object_get(r, "resultType")), "complete");
        assert_true(json_is_integer(json_object_get(r, "ttlMs")));
        assert_string_equal(json_string_value(json_object_get(r, "cacheScope")), "public");
        json_decref(j);
        free(body);
    }
    /* a tool call: structured content, resultType; Mcp-Name whitespace and base64 decoded */
    const char *names[] = {"get_sandbox", "  get_sandbox ", "=?base64?Z2V0X3NhbmRib3g=?="};
    for (size_t i = 0; i < 3; i++) {
        in = s_modern_in(&body, "tools/call", names[i],
                         "\"name\":\"get_sandbox\",\"arguments\":{\"sandbox_id\":\"" SBX "\"}", "");
        j = s_serve_want(&in, 200, &out);
        r = json_object_get(j, "result");
        assert_false(s_is_error(r));
        assert_string_equal(json_string_value(json_object_get(r, "resultType")), "complete");
        assert_non_null(json_object_get(r, "structuredContent"));
        assert_null(json_object_get(r, "ttlMs"));
        json_decref(j);
        free(body);
    }
    /* prompts/get */
    in = s_modern_in(&body, "prompts/get", "sandbox-task",
                     "\"name\":\"sandbox-task\",\"arguments\":{\"task\":\"t\"}", "");
    j = s_serve_want(&in, 200, &out);
    r = json_object_get(j, "result");
    assert_string_equal(json_string_value(json_object_get(r, "resultType")), "complete");
    assert_int_equal(json_array_size(json_object_get(r, "messages")), 2);
    json_decref(j);
    free(body);
    /* no resources: not found is -32602 with the URI, -32002 for the legacy revisions */
    in = s_modern_in(&body, "resources/read", "file:///x", "\"uri\":\"file:///x\"", "");
    j = s_serve_want(&in, 200, &out);
    assert_int_equal(s_err_code(j), -32602);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(j, "error"), "data"), "uri")),
                        "file:///x");
    json_decref(j);
    free(body);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"resources/read\",\"params\":{\"uri\":"
              "\"file:///x\"}}",
              200);
    assert_int_equal(s_err_code(j), -32002);
    json_decref(j);
}

static void test_modern_refusals(void **unused)
{
    struct {
        const char *method, *name, *head, *meta, *proto, *mcp_method;
        unsigned status;
        int code;
    } cases[] = {
        /* removed and unknown methods: 404 -32601 */
        {"initialize", NULL, "", "", "2026-07-28", "initialize", 404, -32601},
        {"ping", NULL, "", "", "2026-07-28", "ping", 404, -32601},
        {"logging/setLevel", NULL, "\"level\":\"debug\"", "", "2026-07-28", "logging/setLevel", 404,
         -32601},
        {"subscriptions/listen", NULL, "", "", "2026-07-28", "subscriptions/listen", 404, -32601},
        {"no/such", NULL, "", "", "2026-07-28", "no/such", 404, -32601},
        /* headers: required and matching the body */
        {"tools/list", NULL, "", "", NULL, "tools/list", 400, -32020},
        {"tools/list", NULL, "", "", "2025-11-25", "tools/list", 400, -32020},
        {"tools/list", NULL, "", "", "2026-07-28", NULL, 400, -32020},
        {"tools/list", NULL, "", "", "2026-07-28", "prompts/list", 400, -32020},
        {"tools/list", NULL, "", "", "2026-07-28", "TOOLS/LIST", 400, -32020},
        {"tools/call", NULL, "\"name\":\"get_sandbox\"", "", "2026-07-28", "tools/call", 400,
         -32020},
        {"tools/call", "list_sandboxes", "\"name\":\"get_sandbox\"", "", "2026-07-28", "tools/call",
         400, -32020},
        {"tools/call", "=?base64?!!?=", "\"name\":\"get_sandbox\"", "", "2026-07-28", "tools/call",
         400, -32020},
        {"prompts/get", "x", "\"name\":\"sandbox-task\"", "", "2026-07-28", "prompts/get", 400,
         -32020},
        /* a log level that is none of the eight */
        {"tools/list", NULL, "", ",\"io.modelcontextprotocol/logLevel\":\"loud\"", "2026-07-28",
         "tools/list", 400, -32602},
        {"tools/list", NULL, "", ",\"io.modelcontextprotocol/clientInfo\":\"me\"", "2026-07-28",
         "tools/list", 400, -32602},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *body;
        s_out_t out;
        s_in_t in =
            s_modern_in(&body, cases[i].method, cases[i].name, cases[i].head, cases[i].meta);
        in.protocol = cases[i].proto;
        in.mcp_method = cases[i].mcp_method;
        s_serve_answered(F.m, &in, &out);
        if (out.status != cases[i].status)
            fail_msg("case %zu: status %u, want %u: %s", i, out.status, cases[i].status, out.body);
        json_t *j = s_msg(&out);
        if (s_err_code(j) != cases[i].code)
            fail_msg("case %zu: code %d, want %d", i, s_err_code(j), cases[i].code);
        assert_int_equal(json_integer_value(json_object_get(j, "id")), 7); /* the request's */
        assert_string_equal(out.session, "");
        json_decref(j);
        free(out.body);
        free(body);
    }
    /* the _meta envelope: both required fields, checked before the headers */
    const char *bodies[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\",\"params\":{}}",
        "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}",
        "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\","
        "\"io.modelcontextprotocol/clientCapabilities\":[]}}}",
        "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":2026,"
        "\"io.modelcontextprotocol/clientCapabilities\":{}}}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        s_in_t in = s_in(bodies[i]);
        in.protocol = "2026-07-28";
        in.mcp_method = "server/discover";
        s_out_t out;
        json_t *j = s_serve_want(&in, 400, &out);
        if (s_err_code(j) != -32602)
            fail_msg("body %zu: code %d", i, s_err_code(j));
        json_decref(j);
    }
    /* a revision we do not serve: -32022 with what we do and what was asked */
    const char *asked[][2] = {{"v999.0.0", "v999.0.0"}, {NULL, "2099-01-01"}};
    for (size_t i = 0; i < 2; i++) {
        char *body = NULL;
        assert_true(asprintf(&body,
                             "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\","
                             "\"params\":{\"_meta\":{%s%s%s"
                             "\"io.modelcontextprotocol/clientCapabilities\":{}}}}",
                             asked[i][0] ? "\"io.modelcontextprotocol/protocolVersion\":\"" : "",
                             asked[i][0] ? asked[i][0] : "", asked[i][0] ? "\"," : "") > 0);
        s_in_t in = s_in(body);
        in.protocol = asked[i][1];
        in.mcp_method = "server/discover";
        s_out_t out;
        json_t *j = s_serve_want(&in, 400, &out);
        assert_int_equal(s_err_code(j), -32022);
        json_t *data = json_object_get(json_object_get(j, "error"), "data");
        assert_string_equal(json_string_value(json_object_get(data, "requested")), asked[i][1]);
        assert_string_equal(
            json_string_value(json_array_get(json_object_get(data, "supported"), 0)), "2026-07-28");
        json_decref(j);
        free(body);
    }
    /* _meta and header disagree: -32020 */
    s_in_t in = s_in("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"server/discover\",\"params\":{"
                     "\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"v999.0.0\","
                     "\"io.modelcontextprotocol/clientCapabilities\":{}}}}");
    in.protocol = "2026-07-28";
    in.mcp_method = "server/discover";
    s_out_t out;
    json_t *j = s_serve_want(&in, 400, &out);
    assert_int_equal(s_err_code(j), -32020);
    json_decref(j);
    /* nothing was changed by any of it: no session was minted */
    kb_mcp_stats_t st;
    kb_mcp_stats(F.m, &st);
    unsigned long before = st.sessions;
    char *body;
    in = s_modern_in(&body, "initialize", NULL, "\"protocolVersion\":\"2026-07-28\"", "");
    j = s_serve_want(&in, 404, &out);
    json_decref(j);
    free(body);
    kb_mcp_stats(F.m, &st);
    assert_int_equal(st.sessions, before);
}

/* Log notifications only for a request that asked with logLevel, at or below warning. */
static void test_modern_logging(void **unused)
{
    const char *metas[] = {"", ",\"io.modelcontextprotocol/logLevel\":\"warning\"",
                           ",\"io.modelcontextprotocol/logLevel\":\"error\""};
    for (size_t i = 0; i < 3; i++) {
        char *body;
        s_in_t in = s_modern_in(&body, "tools/call", "get_sandbox",
                                "\"name\":\"get_sandbox\",\"arguments\":{\"sandbox_id\":\"nope\"}",
                                metas[i]);
        s_out_t out;
        s_serve_answered(F.m, &in, &out);
        assert_int_equal(out.status, 200);
        bool note = out.body && strstr(out.body, "notifications/message");
        assert_true(note == (i == 1));
        json_t *j = s_msg(&out);
        assert_true(s_is_error(json_object_get(j, "result")));
        json_decref(j);
        free(out.body);
        free(body);
    }
}

/* ---- images for the model ---------------------------------------------------------------- */

/* A w x h RGB image: noise when noisy (incompressible), else a gradient. malloc'd. */
static s_rgb_t s_test_rgb(unsigned w, unsigned h, bool noisy)
{
    s_rgb_t img = {malloc((size_t)w * h * 3), w, h};
    assert_non_null(img.px);
    uint32_t seed = 1;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        seed = seed * 1103515245u + 12345u;
        img.px[i] = noisy ? (unsigned char)(seed >> 24) : (unsigned char)(i / 3 % w * 255 / w);
    }
    return img;
}

static unsigned char *s_test_png(const s_rgb_t *img, size_t *len)
{
    png_image p;
    memset(&p, 0, sizeof p);
    p.version = PNG_IMAGE_VERSION;
    p.width = img->w;
    p.height = img->h;
    p.format = PNG_FORMAT_RGB;
    png_alloc_size_t n = 0;
    assert_true(png_image_write_to_memory(&p, NULL, &n, 0, img->px, 0, NULL));
    unsigned char *buf = malloc(n);
    assert_true(png_image_write_to_memory(&p, buf, &n, 0, img->px, 0, NULL));
    *len = n;
    return buf;
}

static int s_test_gif_write(GifFileType *g, const GifByteType *b, int n)
{
    s_mem_t *m = g->UserData;
    unsigned char *p = realloc((void *)m->p, m->len + (size_t)n);
    assert_non_null(p);
    memcpy(p + m->len, b, (size_t)n);
    m->p = p;
    m->len += (size_t)n;
    return n;
}

/* A w x h GIF of 4 colours in stripes. */
static unsigned char *s_test_gif(unsigned w, unsigned h, size_t *len)
{
    s_mem_t m = {NULL, 0, 0};
    int err;
    GifFileType *g = EGifOpen(&m, s_test_gif_write, &err);
    assert_non_null(g);
    GifColorType colors[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 9, 9}};
    ColorMapObject *cm = GifMakeMapObject(4, colors);
    assert_int_equal(EGifPutScreenDesc(g, (int)w, (int)h, 2, 0, cm), GIF_OK);
    assert_int_equal(EGifPutImageDesc(g, 0, 0, (int)w, (int)h, false, NULL), GIF_OK);
    GifPixelType *line = malloc(w);
    for (unsigned y = 0; y < h; y++) {
        for (unsigned x = 0; x < w; x++)
            line[x] = (GifPixelType)(x / 7 % 4);
        assert_int_equal(EGifPutLine(g, line, (int)w), GIF_OK);
    }
    free(line);
    GifFreeMapObject(cm);
    assert_int_equal(EGifCloseFile(g, &err), GIF_OK);
    *len = m.len;
    return (unsigned char *)m.p;
}

/* Decodes a prepared JPEG back and checks its size. */
static void s_test_jpeg_is(const kb_mcp_image_t *img, unsigned w, unsigned h)
{
    s_rgb_t back;
    char msg[200];
    assert_int_equal(s_decode_jpeg(img->data, img->len, &back, msg, sizeof msg), 0);
    assert_int_equal(back.w, w);
    assert_int_equal(back.h, h);
    free(back.px);
}

static void test_images(void **unused)
{
    char msg[256];
    kb_mcp_image_t img;
    size_t len;
    /* small: shown as it is */
    s_rgb_t rgb = s_test_rgb(120, 80, false);
    unsigned char *png = s_test_png(&rgb, &len);
    assert_int_equal(kb_mcp_image_prepare(png, len, "image/png", &img, msg, sizeof msg), 0);
    assert_false(img.reencoded);
    assert_null(img.data);
    assert_int_equal(img.w, 120);
    assert_string_equal(img.mime, "image/png");
    free(png);
    free(rgb.px);
    /* a long side over 2000 px: JPEG, shrunk by 0.75 steps (3000 -> 2250 -> 1688) */
    rgb = s_test_rgb(3000, 40, false);
    png = s_test_png(&rgb, &len);
    assert_true(len < KB_MCP_IMAGE_MAX_BYTES);
    assert_int_equal(kb_mcp_image_prepare(png, len, "image/png", &img, msg, sizeof msg), 0);
    assert_true(img.reencoded);
    assert_string_equal(img.mime, "image/jpeg");
    assert_int_equal(img.w, 3000);
    assert_int_equal(img.shown_w, 1688);
    assert_int_equal(img.shown_h, 23);
    s_test_jpeg_is(&img, 1688, 23);
    kb_mcp_image_free(&img);
    free(png);
    free(rgb.px);
    /* over 500,000 bytes (noise): JPEG within the byte budget, shrunk if the ladder is not
     * enough */
    rgb = s_test_rgb(1200, 900, true);
    png = s_test_png(&rgb, &len);
    assert_true(len > KB_MCP_IMAGE_MAX_BYTES);
    assert_int_equal(kb_mcp_image_prepare(png, len, "image/png", &img, msg, sizeof msg), 0);
    assert_true(img.reencoded);
    assert_true(img.len <= KB_MCP_IMAGE_MAX_BYTES);
    assert_true(img.shown_w <= 1200 && img.shown_w * 3 == img.shown_h * 4);
    s_test_jpeg_is(&img, img.shown_w, img.shown_h);
    kb_mcp_image_free(&img);
    free(png);
    /* the same pixels as JPEG and as WebP */
    unsigned char *jpg;
    assert_int_equal(s_encode_jpeg(&rgb, 98, &jpg, &len), 0);
    assert_true(len > KB_MCP_IMAGE_MAX_BYTES);
    assert_int_equal(kb_mcp_image_prepare(jpg, len, "image/jpeg", &img, msg, sizeof msg), 0);
    assert_true(img.reencoded && img.len <= KB_MCP_IMAGE_MAX_BYTES);
    kb_mcp_image_free(&img);
    free(jpg);
    free(rgb.px);
    rgb = s_test_rgb(2100, 30, false);
    uint8_t *webp;
    len = WebPEncodeRGB(rgb.px, 2100, 30, 2100 * 3, 90, &webp);
    assert_true(len > 0);
    assert_int_equal(kb_mcp_image_prepare(webp, len, "image/webp", &img, msg, sizeof msg), 0);
    assert_true(img.reencoded);
    assert_int_equal(img.w, 2100);
    assert_int_equal(img.shown_w, 1575);
    kb_mcp_image_free(&img);
    WebPFree(webp);
    free(rgb.px);
    /* GIF: its first frame */
    unsigned char *gif = s_test_gif(2100, 20, &len);
    assert_int_equal(kb_mcp_image_prepare(gif, len, "image/gif", &img, msg, sizeof msg), 0);
    assert_true(img.reencoded);
    assert_int_equal(img.shown_w, 1575);
    s_test_jpeg_is(&img, 1575, 15);
    kb_mcp_image_free(&img);
    /* the same GIF cut short: cannot be decoded, said so */
    assert_int_equal(kb_mcp_image_prepare(gif, len / 2, "image/gif", &img, msg, sizeof msg),
                     KB_MCP_IMAGE_CORRUPT);
    assert_non_null(strstr(msg, "cannot decode image/gif"));
    free(gif);
    /* hostile headers: over 50 M pixels is refused before anything is decoded */
    rgb = s_test_rgb(8, 8, false);
    png = s_test_png(&rgb, &len);
    png[16] = 0, png[17] = 0, png[18] = 0x27, png[19] = 0x10; /* width 10000 */
    png[20] = 0, png[21] = 0, png[22] = 0x17, png[23] = 0x70; /* height 6000 */
    assert_int_equal(kb_mcp_image_prepare(png, len, "image/png", &img, msg, sizeof msg),
                     KB_MCP_IMAGE_TOO_LARGE);
    assert_non_null(strstr(msg, "10000\xc3\x97"
                                "6000 px: too large to read"));
    /* a header that lies small, garbage after it: a decode error, not a crash */
    png[18] = 0x0b, png[19] = 0xb8, png[22] = 0, png[23] = 8; /* 3000 x 8, data for 8 x 8 */
    assert_int_equal(kb_mcp_image_prepare(png, len, "image/png", &img, msg, sizeof msg),
                     KB_MCP_IMAGE_CORRUPT);
    free(png);
    free(rgb.px);
    static const unsigned char junk_jpeg[] = {0xff, 0xd8, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x0b,
                                              0xb8, 0x0b, 0xb8, 0x03, 0x01, 0x22, 0x00, 0x02,
                                              0x11, 0x01, 0x03, 0x11, 0x01, 0xff, 0xd9};
    assert_int_equal(
        kb_mcp_image_prepare(junk_jpeg, sizeof junk_jpeg, "image/jpeg", &img, msg, sizeof msg),
        KB_MCP_IMAGE_CORRUPT);
    static const unsigned char gif_bomb[] = {'G',  'I',  'F',  '8',  '9',  'a', 0x40, 0x1f,
                                             0x40, 0x1f, 0x00, 0x00, 0x00, ';'}; /* 8000 x 8000 */
    assert_int_equal(
        kb_mcp_image_prepare(gif_bomb, sizeof gif_bomb, "image/gif", &img, msg, sizeof msg),
        KB_MCP_IMAGE_TOO_LARGE);
}

static void test_http_level_checks(void **unused)
{
    const char *ping = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}";
    s_out_t out;
    struct {
        const char *host, *origin, *accept, *ctype, *proto, *method;
        unsigned status;
    } cases[] = {
        {"evil.example.com", NULL, NULL, NULL, NULL, NULL, 403},
        {"localhost.evil.com:8083", NULL, NULL, NULL, NULL, NULL, 403},
        {NULL, NULL, NULL, NULL, NULL, NULL, 403},
        {"127.0.0.1:9", "http://evil.example.com", NULL, NULL, NULL, NULL, 403},
        {"[::1]:8083", "http://localhost:3000", NULL, NULL, NULL, NULL, 200},
        {"127.0.0.1", "https://127.0.0.1:8443", NULL, NULL, NULL, NULL, 200},
        {"localhost", "null", NULL, NULL, NULL, NULL, 403},
        {"localhost", NULL, "text/html", NULL, NULL, NULL, 406},
        {"localhost", NULL, "text/event-stream", NULL, NULL, NULL, 200},
        {"localhost", NULL, "*/*", NULL, NULL, NULL, 200},
        {"localhost", NULL, NULL, "text/plain", NULL, NULL, 415},
        {"localhost", NULL, NULL, NULL, "1999-01-01", NULL, 400},
        {"localhost", NULL, NULL, NULL, "2025-06-18", NULL, 200},
        {"localhost", NULL, NULL, NULL, NULL, "GET", 405},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s_in_t in = s_in(ping);
        in.host = cases[i].host;
        in.origin = cases[i].origin;
        if (cases[i].accept)
            in.accept = cases[i].accept;
        if (cases[i].ctype)
            in.content_type = cases[i].ctype;
        in.protocol = cases[i].proto;
        if (cases[i].method)
            in.method = cases[i].method;
        s_serve_answered(F.m, &in, &out);
        if (out.status != cases[i].status)
            fail_msg("case %zu: status %u, want %u", i, out.status, cases[i].status);
        if (cases[i].status == 405)
            assert_string_equal(out.allow, "POST, DELETE");
        free(out.body);
    }
    /* the body cap */
    size_t big = KB_MCP_MAX_BODY + 10;
    char *body = malloc(big + 1);
    memset(body, ' ', big);
    body[big] = '\0';
    s_in_t in = s_in(body);
    s_serve_answered(F.m, &in, &out);
    assert_int_equal(out.status, 413);
    free(out.body);
    free(body);
}

static void test_bearer_tokens(void **unused)
{
    char path[] = "/tmp/kagent-mcp-tokens.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unsigned char h[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)"s3cret", 6, h);
    char line[128];
    int n = 0;
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%02x", h[i]);
    n += snprintf(line + n, sizeof line - (size_t)n, " " ALICE "\n");
    assert_int_equal(write(fd, line, (size_t)n), n);
    close(fd);
    int err = 0;
    kb_auth_t *auth = kb_auth_new(KB_AUTH_TOKENS, path, &err, NULL, 0);
    unlink(path);
    assert_non_null(auth);
    kb_mcp_t *m = kb_mcp_new(NULL, F.svc, auth, NULL);
    assert_non_null(m);
    s_in_t in = s_in("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                     "\"name\":\"get_sandbox\",\"arguments\":{\"sandbox_id\":\"" SBX "\"}}}");
    in.accept = "application/json";
    in.user_id = ALICE; /* a user header grants nothing in tokens mode */
    s_out_t out;
    s_serve_answered(m, &in, &out);
    assert_int_equal(out.status, 401);
    assert_true(out.www_auth);
    free(out.body);
    in.authorization = "Bearer wrong";
    s_serve_answered(m, &in, &out);
    assert_int_equal(out.status, 401);
    free(out.body);
    in.authorization = "Bearer s3cret";
    s_serve_answered(m, &in, &out);
    assert_int_equal(out.status, 200);
    json_t *j = s_msg(&out);
    assert_false(s_is_error(json_object_get(j, "result")));
    json_decref(j);
    free(out.body);
    kb_mcp_destroy(&m);
    kb_auth_destroy(&auth);
}

/* ---- tools ----------------------------------------------------------------------------------- */

static void test_tools_list_schemas(void **unused)
{
    static const char *const names[] = {"list_sandbox_templates", "create_sandbox",
                                        "list_sandboxes",         "get_sandbox",
                                        "suspend_sandbox",        "resume_sandbox",
                                        "delete_sandbox",         "start_sandbox_process",
                                        "get_sandbox_process",    "kill_sandbox_process",
                                        "read_sandbox_outputs",   "write_sandbox_file",
                                        "read_sandbox_file",      "pause_sandbox",
                                        "unpause_sandbox",        "fork_sandbox",
                                        "list_sandbox_files",     "stat_sandbox_file",
                                        "remove_sandbox_file",    "make_sandbox_directory",
                                        "move_sandbox_file"};
    json_t *j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}", 200);
    json_t *tools = json_object_get(json_object_get(j, "result"), "tools");
    assert_int_equal(json_array_size(tools), 21);
    for (size_t i = 0; i < 21; i++) {
        json_t *t = json_array_get(tools, i);
        assert_string_equal(json_string_value(json_object_get(t, "name")), names[i]);
        assert_true(strlen(json_string_value(json_object_get(t, "description"))) > 20);
        json_t *s = json_object_get(t, "inputSchema");
        assert_string_equal(json_string_value(json_object_get(s, "type")), "object");
        assert_true(json_is_false(json_object_get(s, "additionalProperties")));
        /* every property is snake_case and typed */
        const char *k;
        json_t *p;
        json_object_foreach(json_object_get(s, "properties"), k, p)
        {
            for (const char *c = k; *c; c++)
                assert_true((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_');
            assert_non_null(json_object_get(p, "type"));
        }
    }
    json_decref(j);
}

static void test_tool_argument_errors(void **unused)
{
    struct {
        const char *tool, *args, *text;
    } cases[] = {
        {"get_sandbox", "{}", "INVALID_ARGUMENT: sandbox_id is required"},
        {"get_sandbox", "{\"sandbox_id\":42}", "INVALID_ARGUMENT: sandbox_id must be a string"},
        {"get_sandbox", "{\"sandbox_id\":\"nope\"}", "INVALID_ARGUMENT: Sandbox ID must be a UUID"},
        {"get_sandbox", "{\"sandbox_id\":\"" SBX "\",\"x\":1}",
         "INVALID_ARGUMENT: unknown argument \"x\""},
        {"create_sandbox", "{\"namespace\":\"kagent\",\"template\":\"python\"}",
         "INVALID_ARGUMENT: request_id is required"},
        {"create_sandbox", "{\"namespace\":\"kagent\",\"template\":\"python\",\"request_id\":\"\"}",
         "INVALID_ARGUMENT: request_id must be between 1 and 128 characters"},
        {"create_sandbox",
         "{\"namespace\":\"kagent\",\"template\":\"python\",\"request_id\":\"r\",\"ttl_seconds\":"
         "\"60\"}",
         "INVALID_ARGUMENT: ttl_seconds must be an integer"},
        {"create_sandbox",
         "{\"namespace\":\"kagent\",\"template\":\"python\",\"request_id\":\"r\",\"ttl_seconds\":"
         "90000}",
         "INVALID_ARGUMENT: ttl_seconds must be between 0 and 86400"},
        {"start_sandbox_process", "{\"sandbox_id\":\"" SBX "\",\"command\":\"ls -l\"}",
         "INVALID_ARGUMENT: command must be an array of strings"},
        {"start_sandbox_process", "{\"sandbox_id\":\"" SBX "\",\"command\":[]}",
         "INVALID_ARGUMENT: command must not be empty"},
        {"start_sandbox_process",
         "{\"sandbox_id\":\"" SBX "\",\"command\":[\"ls\"],\"env\":{\"A\":1}}",
         "INVALID_ARGUMENT: env.A must be a string"},
        {"get_sandbox_process", "{\"sandbox_id\":\"" SBX "\",\"process_id\":\"x1\"}",
         "INVALID_ARGUMENT: process_id must be the decimal id a process start returned"},
        {"write_sandbox_file",
         "{\"sandbox_id\":\"" SBX "\",\"path\":\"a\",\"data_base64\":\"@@@@\"}",
         "INVALID_ARGUMENT: invalid base64: illegal base64 data at input byte 0"},
        {"write_sandbox_file",
         "{\"sandbox_id\":\"" SBX "\",\"path\":\"a\",\"data_base64\":\"aGk\"}",
         "INVALID_ARGUMENT: invalid base64: illegal base64 data at input byte 3"},
        {"read_sandbox_file", "{\"sandbox_id\":\"" SBX "\",\"path\":\"a\",\"offset\":0}",
         "INVALID_ARGUMENT: offset must be at least 1"},
        {"list_sandboxes", "{\"page_token\":\"abc\"}", "INVALID_ARGUMENT: page_token is not valid"},
        {"get_sandbox", "[1]", NULL}, /* arguments not an object: a protocol error */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *body = NULL;
        assert_true(asprintf(&body,
                             "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":"
                             "{\"name\":\"%s\",\"arguments\":%s}}",
                             cases[i].tool, cases[i].args) > 0);
        json_t *j = s_rpc(body, 200);
        free(body);
        if (!cases[i].text) {
            assert_int_equal(s_err_code(j), -32602);
        } else {
            json_t *r = json_object_get(j, "result");
            assert_true(s_is_error(r));
            if (strcmp(s_text(r, 0), cases[i].text) != 0)
                fail_msg("case %zu: got \"%s\", want \"%s\"", i, s_text(r, 0), cases[i].text);
        }
        json_decref(j);
    }
    /* unknown tool and missing name: JSON-RPC invalid params */
    json_t *j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{"
                      "\"name\":\"rm_rf\"}}",
                      200);
    assert_int_equal(s_err_code(j), -32602);
    assert_string_equal(s_err_msg(j), "Unknown tool: rm_rf");
    json_decref(j);
    j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{}}", 200);
    assert_int_equal(s_err_code(j), -32602);
    json_decref(j);
    /* an oversized file: refused before decoding */
    size_t n = (KB_MCP_FILE_CAP / 3 + 2) * 4;
    char *big = malloc(n + 200);
    int k = snprintf(big, 200, "{\"sandbox_id\":\"" SBX "\",\"path\":\"a\",\"data_base64\":\"");
    memset(big + k, 'A', n);
    strcpy(big + k + n, "\"}");
    json_t *h;
    json_t *r = s_tool("write_sandbox_file", big, &h);
    assert_true(s_is_error(r));
    assert_string_equal(s_text(r, 0), "INVALID_ARGUMENT: file exceeds MCP 1 MiB limit");
    json_decref(h);
    free(big);
}

static void test_lifecycle_tools(void **unused)
{
    json_t *h;
    json_t *r = s_tool("create_sandbox",
                       "{\"namespace\":\"kagent\",\"template\":\"python\",\"request_id\":\"r1\","
                       "\"name\":\"demo\",\"ttl_seconds\":600}",
                       &h);
    json_t *o = s_obj(r);
    assert_string_equal(json_string_value(json_object_get(o, "id")), SBX);
    assert_string_equal(json_string_value(json_object_get(o, "name")), "demo");
    assert_string_equal(json_string_value(json_object_get(o, "state")), "RUNTIME_STATE_READY");
    assert_string_equal(json_string_value(json_object_get(o, "operation")),
                        "RUNTIME_OPERATION_NONE");
    assert_string_equal(json_string_value(json_object_get(o, "node")), "node-1");
    assert_string_equal(json_string_value(json_object_get(o, "expires_at")),
                        "2026-01-01T00:00:00.12Z");
    json_t *tpl = json_object_get(o, "sandbox_template");
    assert_string_equal(json_string_value(json_object_get(tpl, "namespace")), "kagent");
    assert_null(json_object_get(o, "failure"));
    json_decref(o);
    json_decref(h);
    /* structuredContent only for protocol >= 2025-06-18 (stateless default is 2025-03-26) */
    r = s_tool("get_sandbox", "{\"sandbox_id\":\"" SBX "\"}", &h);
    assert_null(json_object_get(r, "structuredContent"));
    json_decref(h);
    /* a service error is a result with isError and the service's message */
    s_in_t in = s_in("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                     "\"name\":\"delete_sandbox\",\"arguments\":{\"sandbox_id\":\"" SBX "\"}}}");
    in.user_id = BOB;
    in.accept = "application/json";
    s_out_t out;
    s_serve_answered(F.m, &in, &out);
    h = s_msg(&out);
    free(out.body);
    r = json_object_get(h, "result");
    assert_true(s_is_error(r));
    assert_string_equal(s_text(r, 0), "NOT_FOUND: sandbox not found");
    json_decref(h);
    /* pages */
    r = s_tool("list_sandboxes", "{\"page_size\":2}", &h);
    o = s_obj(r);
    assert_int_equal(json_array_size(json_object_get(o, "sandboxes")), 2);
    json_t *items = json_object_get(o, "sandboxes");
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 0), "node")),
                        "node-1");
    assert_null(json_object_get(json_array_get(items, 1), "node")); /* "" is left out */
    assert_string_equal(json_string_value(json_object_get(o, "next_page_token")), "2");
    json_decref(o);
    json_decref(h);
    r = s_tool("list_sandboxes", "{\"page_token\":\"2\"}", &h);
    o = s_obj(r);
    assert_null(json_object_get(o, "next_page_token"));
    json_decref(o);
    json_decref(h);
}

static void test_process_tools(void **unused)
{
    json_t *h;
    json_t *r = s_tool("start_sandbox_process",
                       "{\"sandbox_id\":\"" SBX "\",\"command\":[\"sh\",\"-c\",\"echo hi\"],"
                       "\"env\":{\"A\":\"1\"},\"cwd\":\"/data/workspace/x\"}",
                       &h);
    json_t *o = s_obj(r);
    assert_string_equal(json_string_value(json_object_get(o, "process_id")), "7");
    assert_string_equal(F.last_argv, "sh|-c|echo hi|A=1|");
    json_decref(o);
    json_decref(h);
    r = s_tool("get_sandbox_process", "{\"sandbox_id\":\"" SBX "\",\"process_id\":\"7\"}", &h);
    o = s_obj(r);
    assert_string_equal(json_string_value(json_object_get(o, "status")),
                        "PROCESS_STATUS_TERMINATED");
    assert_int_equal(json_integer_value(json_object_get(o, "exit_code")), 137);
    json_decref(o);
    json_decref(h);
    r = s_tool("kill_sandbox_process", "{\"sandbox_id\":\"" SBX "\",\"process_id\":\"7\"}", &h);
    o = s_obj(r);
    assert_int_equal(json_integer_value(json_object_get(o, "exit_code")), 137);
    json_decref(o);
    json_decref(h);
    assert_string_equal(kb_mcp_process_status(1, 0), "PROCESS_STATUS_RUNNING");
    assert_string_equal(kb_mcp_process_status(2, 0), "PROCESS_STATUS_COMPLETED");
    assert_string_equal(kb_mcp_process_status(2, 1), "PROCESS_STATUS_FAILED");

    /* outputs: 1.5 MiB of stdout and 4 bytes of stderr, read in two calls */
    F.out_len = (3u << 20) / 2;
    F.out = malloc(F.out_len);
    for (size_t i = 0; i < F.out_len; i++)
        F.out[i] = (char)('a' + i % 26);
    r = s_tool("read_sandbox_outputs", "{\"sandbox_id\":\"" SBX "\",\"process_id\":\"7\"}", &h);
    o = s_obj(r);
    assert_true(json_is_true(json_object_get(o, "truncated")));
    assert_true(json_is_boolean(json_object_get(o, "exited"))); /* the process state, as known */
    json_int_t so = json_integer_value(json_object_get(o, "stdout_offset"));
    json_int_t eo = json_integer_value(json_object_get(o, "stderr_offset"));
    assert_int_equal(so + eo, KB_MCP_OUTPUT_CAP);
    const char *b64 = json_string_value(json_object_get(o, "stdout_base64"));
    unsigned char *dec;
    size_t dl;
    char msg[64];
    assert_int_equal(kb_mcp_b64_decode(b64, strlen(b64), &dec, &dl, msg, sizeof msg), 0);
    assert_int_equal(dl, (size_t)so);
    assert_memory_equal(dec, F.out, dl);
    free(dec);
    char args[256];
    snprintf(args, sizeof args,
             "{\"sandbox_id\":\"" SBX "\",\"process_id\":\"7\",\"stdout_offset\":%lld,"
             "\"stderr_offset\":%lld}",
             (long long)so, (long long)eo);
    json_decref(o);
    json_decref(h);
    r = s_tool("read_sandbox_outputs", args, &h);
    o = s_obj(r);
    assert_true(json_is_false(json_object_get(o, "truncated")));
    assert_true(json_is_true(json_object_get(o, "exited")));
    assert_int_equal(json_integer_value(json_object_get(o, "exit_code")), 3);
    assert_int_equal(json_integer_value(json_object_get(o, "stdout_offset")), F.out_len);
    assert_int_equal(json_integer_value(json_object_get(o, "stderr_offset")), 4);
    b64 = json_string_value(json_object_get(o, "stdout_base64"));
    assert_int_equal(kb_mcp_b64_decode(b64, strlen(b64), &dec, &dl, msg, sizeof msg), 0);
    assert_int_equal(dl, F.out_len - (size_t)so);
    assert_memory_equal(dec, F.out + so, dl);
    free(dec);
    json_decref(o);
    json_decref(h);
}

static void test_file_tools(void **unused)
{
    json_t *h;
    json_t *r = s_tool("write_sandbox_file",
                       "{\"sandbox_id\":\"" SBX "\",\"path\":\"notes/a.txt\",\"data_base64\":"
                       "\"b25lCnR3bwp0aHJlZQ==\",\"mode\":420}",
                       &h);
    json_t *o = s_obj(r);
    assert_int_equal(json_integer_value(json_object_get(o, "bytes_written")), 13);
    assert_int_equal(F.last_mode, 0644);
    json_decref(o);
    json_decref(h);
    r = s_tool("read_sandbox_file", "{\"sandbox_id\":\"" SBX "\",\"path\":\"notes/a.txt\"}", &h);
    assert_false(s_is_error(r));
    assert_string_equal(s_text(r, 0), "1: one\n2: two\n3: three\n");
    json_decref(h);
    r = s_tool("read_sandbox_file",
               "{\"sandbox_id\":\"" SBX "\",\"path\":\"notes/a.txt\",\"offset\":2,\"limit\":1}",
               &h);
    assert_string_equal(s_text(r, 0), "2: two\n(lines 2\xe2\x80\x93"
                                      "2; continue with offset=3)");
    json_decref(h);
    r = s_tool("read_sandbox_file",
               "{\"sandbox_id\":\"" SBX "\",\"path\":\"notes/a.txt\",\"offset\":9}", &h);
    assert_string_equal(s_text(r, 0), "(the file has 3 lines)");
    json_decref(h);
    r = s_tool("read_sandbox_file", "{\"sandbox_id\":\"" SBX "\",\"path\":\"missing\"}", &h);
    assert_true(s_is_error(r));
    assert_string_equal(s_text(r, 0), "NOT_FOUND: no such file or directory");
    json_decref(h);

    /* a big text file: pages of 2000 lines or 32 KiB, continued by offset, never stops early */
    size_t cap = 8u << 20, len = 0;
    char *big = malloc(cap);
    for (int i = 1; i <= 100000; i++)
        len += (size_t)snprintf(big + len, cap - len, "line number %d\n", i);
    s_add_file("big.txt", big, len);
    free(big);
    r = s_tool("read_sandbox_file", "{\"sandbox_id\":\"" SBX "\",\"path\":\"big.txt\"}", &h);
    const char *t = s_text(r, 0);
    assert_true(strlen(t) <= KB_MCP_TEXT_BUDGET + 100);
    assert_true(strncmp(t, "1: line number 1\n", 17) == 0);
    const char *cont = strstr(t, "continue with offset=");
    assert_non_null(cont);
    int next = atoi(cont + 21);
    assert_true(next > 1000 && next <= 2001);
    json_decref(h);
    char a2[160];
    snprintf(a2, sizeof a2, "{\"sandbox_id\":\"" SBX "\",\"path\":\"big.txt\",\"offset\":%d}",
             next);
    r = s_tool("read_sandbox_file", a2, &h);
    char want[64];
    snprintf(want, sizeof want, "%d: line number %d\n", next, next);
    assert_true(strncmp(s_text(r, 0), want, strlen(want)) == 0);
    json_decref(h);

    /* a PNG: image content with its size */
    unsigned char png[64] = "\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x03\0\0\0\x02\x08\x06";
    s_add_file("img.png", png, sizeof png);
    r = s_tool("read_sandbox_file", "{\"sandbox_id\":\"" SBX "\",\"path\":\"img.png\"}", &h);
    assert_string_equal(s_text(r, 0), "image/png, 3\xc3\x97"
                                      "2 px");
    json_t *img = json_array_get(json_object_get(r, "content"), 1);
    assert_string_equal(json_string_value(json_object_get(img, "type")), "image");
    assert_string_equal(json_string_value(json_object_get(img, "mimeType")), "image/png");
    char *pb = kb_mcp_b64_encode(png, sizeof png);
    assert_string_equal(json_string_value(json_object_get(img, "data")), pb);
    free(pb);
    json_decref(h);

    /* other binaries: 1 MiB windows of data_base64, continued by byte_offset */
    size_t bl = (3u << 20) / 2;
    unsigned char *bin = malloc(bl);
    for (size_t i = 0; i < bl; i++)
        bin[i] = (unsigned char)(i * 7);
    s_add_file("blob.bin", bin, bl);
    r = s_tool("read_sandbox_file", "{\"sandbox_id\":\"" SBX "\",\"path\":\"blob.bin\"}", &h);
    assert_true(strncmp(s_text(r, 0), "binary file, application/octet-stream", 37) == 0);
    o = json_loads(s_text(r, 1), 0, NULL);
    assert_int_equal(json_integer_value(json_object_get(o, "size")), bl);
    assert_int_equal(json_integer_value(json_object_get(o, "next_byte_offset")), KB_MCP_FILE_CAP);
    json_decref(o);
    json_decref(h);
    r = s_tool("read_sandbox_file",
               "{\"sandbox_id\":\"" SBX "\",\"path\":\"blob.bin\",\"byte_offset\":1048576}", &h);
    o = json_loads(s_text(r, 1), 0, NULL);
    const char *b64 = json_string_value(json_object_get(o, "data_base64"));
    unsigned char *dec;
    size_t dl;
    char msg[64];
    assert_int_equal(kb_mcp_b64_decode(b64, strlen(b64), &dec, &dl, msg, sizeof msg), 0);
    assert_int_equal(dl, bl - KB_MCP_FILE_CAP);
    assert_memory_equal(dec, bin + KB_MCP_FILE_CAP, dl);
    assert_null(json_object_get(o, "next_byte_offset"));
    free(dec);
    free(bin);
    json_decref(o);
    json_decref(h);
}

/* ---- prompts -----------------------------------------------------------------------------------
 */

static json_t *s_prompt(const char *name, const char *args)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"prompts/get\",\"params\":{\"name\":"
             "\"%s\",\"arguments\":%s}}",
             name, args);
    return s_rpc(body, 200);
}

static void test_prompts(void **unused)
{
    json_t *j = s_rpc("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"prompts/list\"}", 200);
    json_t *ps = json_object_get(json_object_get(j, "result"), "prompts");
    assert_int_equal(json_array_size(ps), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ps, 0), "name")),
                        "sandbox-task");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ps, 1), "name")),
                        "sandbox-recovery");
    json_decref(j);
    j = s_prompt("sandbox-task", "{\"task\":\"count words\",\"namespace\":\"kagent\"}");
    json_t *msgs = json_object_get(json_object_get(j, "result"), "messages");
    assert_int_equal(json_array_size(msgs), 2);
    const char *second = json_string_value(
        json_object_get(json_object_get(json_array_get(msgs, 1), "content"), "text"));
    assert_true(strncmp(second, "Task parameters:\n", 17) == 0);
    json_t *params = json_loads(second + 17, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(params, "task")), "count words");
    json_decref(params);
    json_decref(j);
    struct {
        const char *name, *args, *msg;
    } bad[] = {
        {"sandbox-task", "{}", "task is required"},
        {"sandbox-task", "{\"task\":\"x\",\"template\":\"python\"}",
         "namespace is required when template is supplied"},
        {"sandbox-task", "{\"task\":\"x\",\"colour\":\"red\"}",
         "unknown prompt argument \"colour\""},
        {"sandbox-recovery", "{\"sandbox_id\":\"nope\"}", "sandbox_id must be a UUID"},
        {"sandbox-recovery", "{}", "sandbox_id is required"},
        {"no-such-prompt", "{}", "unknown prompt \"no-such-prompt\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = s_prompt(bad[i].name, bad[i].args);
        assert_int_equal(s_err_code(j), -32602);
        assert_string_equal(s_err_msg(j), bad[i].msg);
        json_decref(j);
    }
    j = s_prompt("sandbox-recovery", "{\"sandbox_id\":\"" SBX "\"}");
    assert_non_null(json_object_get(j, "result"));
    json_decref(j);
}

/* ---- helpers -------------------------------------------------------------------------------- */

static void test_helpers(void **unused)
{
    char msg[64];
    unsigned char *d;
    size_t dl;
    for (size_t n = 0; n < 40; n++) {
        unsigned char src[40];
        for (size_t i = 0; i < n; i++)
            src[i] = (unsigned char)(i * 37 + n);
        char *e = kb_mcp_b64_encode(src, n);
        assert_int_equal(strlen(e), (n + 2) / 3 * 4);
        assert_int_equal(kb_mcp_b64_decode(e, strlen(e), &d, &dl, msg, sizeof msg), 0);
        assert_int_equal(dl, n);
        assert_memory_equal(d, src, n);
        free(d);
        free(e);
    }
    assert_int_equal(kb_mcp_b64_decode("aGk=aGk=", 8, &d, &dl, msg, sizeof msg), -1);
    assert_int_equal(kb_mcp_b64_decode("a===", 4, &d, &dl, msg, sizeof msg), -1);
    assert_string_equal(kb_mcp_sniff((const unsigned char *)"hello\n", 6),
                        "text/plain; charset=utf-8");
    assert_string_equal(kb_mcp_sniff((const unsigned char *)"\x7f"
                                                            "ELF\x02\x01\x01\0",
                                     8),
                        "application/octet-stream");
    assert_string_equal(kb_mcp_sniff((const unsigned char *)"%PDF-1.7", 8), "application/pdf");
    assert_string_equal(kb_mcp_sniff((const unsigned char *)"GIF89a", 6), "image/gif");
    assert_string_equal(kb_mcp_sniff((const unsigned char *)"", 0), "text/plain; charset=utf-8");
    unsigned w = 0, h = 0;
    assert_int_equal(kb_mcp_image_size((const unsigned char *)"GIF89a\x0a\x00\x14\x00", 10, &w, &h),
                     0);
    assert_int_equal(w, 10);
    assert_int_equal(h, 20);
    unsigned char jpg[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00, 0xFF, 0xC0, 0x00, 0x11,
                           0x08, 0x00, 0x30, 0x00, 0x40, 0x03, 0,    0,    0,    0,    0,    0};
    assert_int_equal(kb_mcp_image_size(jpg, sizeof jpg, &w, &h), 0);
    assert_int_equal(w, 64);
    assert_int_equal(h, 48);
    char ts[64];
    kb_mcp_rfc3339(0, ts, sizeof ts);
    assert_string_equal(ts, "1970-01-01T00:00:00Z");
    kb_mcp_rfc3339(1767225600001, ts, sizeof ts);
    assert_string_equal(ts, "2026-01-01T00:00:00.001Z");
    kb_mcp_rfc3339(1767225600500, ts, sizeof ts);
    assert_string_equal(ts, "2026-01-01T00:00:00.5Z");

    /* the pager: long lines cut, invalid UTF-8 replaced, CRLF, a last line without newline */
    kb_mcp_pager_t *p = kb_mcp_pager_new(1, 10);
    char longline[5000];
    memset(longline, 'x', sizeof longline);
    longline[sizeof longline - 1] = '\n';
    kb_mcp_pager_feed(p, longline, sizeof longline);
    kb_mcp_pager_feed(p, "bad \xff byte\r\nend", 15);
    char *t = kb_mcp_pager_finish(p);
    assert_true(strncmp(t, "1: xxx", 6) == 0);
    assert_non_null(strstr(t, "x [line cut]\n2: bad \xef\xbf\xbd byte\n3: end\n"));
    assert_int_equal(strstr(t, " [line cut]") - t, 3 + KB_MCP_LINE_MAX);
    free(t);
    /* a cut inside a multi-byte character never leaves half of it */
    p = kb_mcp_pager_new(1, 10);
    char uline[KB_MCP_LINE_MAX + 10];
    memset(uline, 'a', sizeof uline);
    memcpy(uline + KB_MCP_LINE_MAX - 1, "\xc3\xa9", 2);
    kb_mcp_pager_feed(p, uline, sizeof uline);
    t = kb_mcp_pager_finish(p);
    assert_null(strstr(t, "\xef\xbf\xbd"));
    assert_non_null(strstr(t, "a [line cut]"));
    free(t);
    p = kb_mcp_pager_new(1, 10);
    t = kb_mcp_pager_finish(p);
    assert_string_equal(t, "(the file has 0 lines)");
    free(t);

    /* the outputs collector: overlap skipped, gap jumped, cap enforced */
    kb_mcp_outputs_t o = {.cap = 10};
    o.off[0] = 2;
    assert_true(kb_mcp_outputs_add(&o, KA_STREAM_STDOUT, 0, "abcd", 4)); /* keeps "cd" */
    assert_true(kb_mcp_outputs_add(&o, KA_STREAM_STDERR, 0, "xy", 2));
    assert_true(kb_mcp_outputs_add(&o, KA_STREAM_STDOUT, 8, "ij", 2)); /* gap 4..8 */
    assert_int_equal(o.off[0], 10);
    assert_false(kb_mcp_outputs_add(&o, KA_STREAM_STDOUT, 10, "klmnop", 6));
    assert_true(o.truncated);
    assert_int_equal(o.len[0] + o.len[1], 10);
    assert_memory_equal(o.buf[0], "cdijklmn", 8);
    assert_int_equal(o.off[0], 14);
    kb_mcp_outputs_free(&o);

    /* schema checks reject what the table would not (explicit null = omitted) */
    json_t *schema =
        json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},"
                   "\"required\":[\"a\"]}",
                   0, NULL);
    json_t *args = json_loads("{\"a\":null}", 0, NULL);
    assert_int_equal(kb_mcp_check_args(schema, args, msg, sizeof msg), -1);
    assert_string_equal(msg, "a is required");
    json_decref(args);
    args = json_loads("{\"a\":1}", 0, NULL);
    assert_int_equal(kb_mcp_check_args(schema, args, msg, sizeof msg), -1);
    assert_string_equal(msg, "a must be a boolean");
    json_decref(args);
    json_decref(schema);
}

/* ---- through kb_http ------------------------------------------------------------------------- */

static int s_connect(kb_http_t *h)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    int s = accept(l, (struct sockaddr *)&peer, &plen);
    assert_true(s >= 0);
    close(l);
    assert_int_equal(kb_http_add_connection(h, s, (struct sockaddr *)&peer, plen), 0);
    return c;
}

/* One request with Connection: close; the whole response. */
static char *s_http(kb_http_t *h, const char *method, const char *extra, const char *body)
{
    int c = s_connect(h);
    char *req = NULL;
    size_t blen = body ? strlen(body) : 0;
    int n = asprintf(&req,
                     "%s /mcp HTTP/1.1\r\nHost: 127.0.0.1:8083\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nX-User-Id: " ALICE "\r\n%s"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, extra, blen, body ? body : "");
    assert_true(n > 0);
    assert_int_equal(write(c, req, (size_t)n), n);
    free(req);
    size_t cap = 8192, len = 0;
    char *out = malloc(cap);
    for (;;) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 10000), 1);
        if (len + 1024 > cap)
            out = realloc(out, cap *= 2);
        ssize_t r = read(c, out + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    out[len] = '\0';
    close(c);
    return out;
}

static void test_over_http(void **unused)
{
    kb_http_options_t ho = {0};
    kb_http_t *h = kb_http_new(&ho);
    assert_non_null(h);
    kb_mcp_options_t o = {.progress_interval_ms = 50};
    kb_mcp_t *m = kb_mcp_new(h, F.svc, F.auth, &o);
    assert_non_null(m);
    assert_null(kb_mcp_new(h, F.svc, F.auth, &o)); /* /mcp is taken */

    char *rsp = s_http(h, "POST", "Accept: application/json, text/event-stream\r\n",
                       "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{"
                       "\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{"
                       "\"name\":\"t\",\"version\":\"1\"}}}");
    assert_true(strncmp(rsp, "HTTP/1.1 200", 12) == 0);
    const char *sh = strcasestr(rsp, "Mcp-Session-Id: ");
    assert_non_null(sh);
    char sid[33];
    memcpy(sid, sh + 16, 32);
    sid[32] = '\0';
    assert_non_null(strcasestr(rsp, "Content-Type: application/json"));
    assert_non_null(strstr(rsp, "\"protocolVersion\":\"2025-06-18\""));
    free(rsp);

    char hdr[256];
    snprintf(hdr, sizeof hdr,
             "Accept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\n"
             "Mcp-Protocol-Version: 2025-06-18\r\n",
             sid);
    rsp = s_http(h, "POST", hdr, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
    assert_true(strncmp(rsp, "HTTP/1.1 202", 12) == 0);
    free(rsp);
    rsp = s_http(h, "GET", "Accept: text/event-stream\r\n", NULL);
    assert_true(strncmp(rsp, "HTTP/1.1 405", 12) == 0);
    assert_non_null(strcasestr(rsp, "Allow: POST, DELETE"));
    free(rsp);
    rsp = s_http(h, "POST", "Accept: application/json\r\nOrigin: http://evil.example.com\r\n",
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    assert_true(strncmp(rsp, "HTTP/1.1 403", 12) == 0);
    free(rsp);

    /* a slow tool call with a progress token: progress events stream before the result */
    rsp = s_http(h, "POST", hdr,
                 "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":"
                 "\"get_sandbox\",\"arguments\":{\"sandbox_id\":\"" SLOW "\"},\"_meta\":{"
                 "\"progressToken\":\"tok-1\"}}}");
    assert_true(strncmp(rsp, "HTTP/1.1 200", 12) == 0);
    assert_non_null(strcasestr(rsp, "Content-Type: text/event-stream"));
    const char *p0 = strstr(rsp, "\"progress\":0");
    const char *p1 = strstr(rsp, "\"progress\":1");
    const char *res = strstr(rsp, "\"id\":7,\"result\"");
    assert_non_null(p0);
    assert_non_null(p1); /* ticked while the fake slept 300 ms */
    assert_non_null(res);
    assert_true(p0 < p1 && p1 < res);
    assert_non_null(strstr(rsp, "\"progressToken\":\"tok-1\""));
    assert_non_null(strstr(rsp, "\"structuredContent\"")); /* 2025-06-18 session */
    free(rsp);

    /* an error with SSE: a warning log notification comes first */
    snprintf(hdr, sizeof hdr, "Accept: text/event-stream\r\nMcp-Session-Id: %s\r\n", sid);
    rsp = s_http(h, "POST", hdr,
                 "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/call\",\"params\":{\"name\":"
                 "\"get_sandbox\",\"arguments\":{\"sandbox_id\":\"bad\"}}}");
    const char *note = strstr(rsp, "notifications/message");
    res = strstr(rsp, "\"id\":8,\"result\"");
    assert_non_null(note);
    assert_non_null(res);
    assert_true(note < res);
    free(rsp);

    snprintf(hdr, sizeof hdr, "Mcp-Session-Id: %s\r\n", sid);
    rsp = s_http(h, "DELETE", hdr, NULL);
    assert_true(strncmp(rsp, "HTTP/1.1 200", 12) == 0);
    free(rsp);
    rsp = s_http(h, "DELETE", hdr, NULL);
    assert_true(strncmp(rsp, "HTTP/1.1 404", 12) == 0);
    free(rsp);

    kb_mcp_stats_t st;
    kb_mcp_stats(m, &st);
    assert_true(st.tool_calls >= 2);
    assert_true(st.tool_errors >= 1);
    kb_http_destroy(&h);
    kb_mcp_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonrpc_errors),
        cmocka_unit_test(test_initialize_negotiates),
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_modern_results),
        cmocka_unit_test(test_modern_refusals),
        cmocka_unit_test(test_modern_logging),
        cmocka_unit_test(test_images),
        cmocka_unit_test(test_http_level_checks),
        cmocka_unit_test(test_bearer_tokens),
        cmocka_unit_test(test_tools_list_schemas),
        cmocka_unit_test(test_tool_argument_errors),
        cmocka_unit_test(test_lifecycle_tools),
        cmocka_unit_test(test_process_tools),
        cmocka_unit_test(test_file_tools),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_helpers),
        cmocka_unit_test(test_over_http),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
