/* Unit tests for bridges/cli (the kagent CLI): argument parsing and every client-side
 * validation message, table and JSON rendering, and the RPC paths against FAKE_SERVER, an
 * in-process fake gRPC server built on gRPC core that exists only inside this test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "ateenv/v1alpha/guest.pb-c.h"
#include "cli.h"
#include "cli_int.h"
#include "kagent/api/v1/process.pb-c.h"
#include "kagent/api/v1/sandbox_templates.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"
#include "kagent/runtime/v1/runtime.pb-c.h"

#define SB_ID     "0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04"
#define EXPIRES   1790872200 /* 2026-10-01T16:30:00Z */
#define FAKE_OUT  "hello\n"
#define FAKE_ERR  "oops\n"
#define MAX_LOG   32
#define FILE_SIZE (2 * 1024 * 1024 + 512 * 1024) /* 2.5 MiB: three upload chunks */

/* ========================================================================================== */
/* FAKE_SERVER: unit-test-only gRPC server. One thread, calls handled one at a time.           */

typedef struct {
    char method[128];
    char user_id[128];
    char auth[256];
    char sandbox_id[64];
    int n_sandbox_id;
    uint8_t *req; /* first request message, packed */
    size_t req_len;
} fake_call_t;

static struct {
    grpc_server *server;
    grpc_completion_queue *cq;      /* notifications (next) */
    grpc_completion_queue *call_cq; /* call operations (pluck) */
    pthread_t thread;
    char url[64];
    pthread_mutex_t mu;
    bool stopping;
    /* behaviour, set by tests before running a command */
    int exit_code;       /* the exit message's code */
    bool stream_hang;    /* StreamProcessOutput never sends anything (Exec: after Started) */
    bool stream_no_exit; /* StreamProcessOutput and Exec end OK without an exit message */
    bool no_exec;        /* Exec is UNIMPLEMENTED: a server with the reference's API only */
    bool start_hang;     /* Exec sends nothing, not even Started */
    int fail_code;       /* non-zero: lifecycle and process unary calls fail with it */
    const char *fail_msg;
    bool read_fail_midway;
    bool write_fail;
    uint8_t *file; /* ReadFile content */
    size_t file_len;
    /* records */
    fake_call_t log[MAX_LOG];
    int ncalls;
    uint8_t *upload;
    size_t upload_len;
    int upload_msgs;
    char upload_path[256];
    uint32_t upload_mode;
    int upload_paths_after_first; /* messages after the first that carried a path */
} s_fake;

static bool s_fake_op(grpc_call *c, grpc_op *ops, size_t n)
{
    int tag;
    if (grpc_call_start_batch(c, ops, n, &tag, NULL) != GRPC_CALL_OK)
        return false;
    grpc_event ev =
        grpc_completion_queue_pluck(s_fake.call_cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* Receives one message (malloc'd bytes); false at the end of the client's stream. */
static bool s_fake_recv(grpc_call *c, uint8_t **buf, size_t *len)
{
    grpc_byte_buffer *bb = NULL;
    grpc_op op = {.op = GRPC_OP_RECV_MESSAGE};
    op.data.recv_message.recv_message = &bb;
    if (!s_fake_op(c, &op, 1) || !bb)
        return false;
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, bb);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    *len = GRPC_SLICE_LENGTH(s);
    *buf = malloc(*len + 1);
    memcpy(*buf, GRPC_SLICE_START_PTR(s), *len);
    grpc_slice_unref(s);
    grpc_byte_buffer_destroy(bb);
    return true;
}

static grpc_byte_buffer *s_fake_pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static bool s_fake_send(grpc_call *c, const ProtobufCMessage *m)
{
    grpc_op op = {.op = GRPC_OP_SEND_MESSAGE};
    grpc_byte_buffer *bb = s_fake_pack(m);
    op.data.send_message.send_message = bb;
    bool ok = s_fake_op(c, &op, 1);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

/* Sends the optional response and the status, and waits for the client's close. */
static void s_fake_finish(grpc_call *c, const ProtobufCMessage *resp, int code, const char *msg)
{
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    grpc_byte_buffer *bb = NULL;
    if (resp && code == 0) {
        bb = s_fake_pack(resp);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        n++;
    }
    grpc_slice details = grpc_slice_from_copied_string(msg ? msg : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    int cancelled = 0;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &cancelled;
    n++;
    s_fake_op(c, ops, n);
    grpc_slice_unref(details);
    if (bb)
        grpc_byte_buffer_destroy(bb);
}

static Kagent__Api__V1__Sandbox *s_fake_sandbox(Kagent__Api__V1__Sandbox *sb,
                                                Kagent__Api__V1__ResourceReference *ref,
                                                Google__Protobuf__Timestamp *ts, int state)
{
    kagent__api__v1__resource_reference__init(ref);
    ref->namespace_ = "kagent";
    ref->name = "scratch";
    google__protobuf__timestamp__init(ts);
    ts->seconds = EXPIRES;
    kagent__api__v1__sandbox__init(sb);
    sb->id = SB_ID;
    sb->sandbox_template = ref;
    sb->state = state;
    sb->expires_at = ts;
    sb->created_at = ts;
    sb->node = "node-1";
    return sb;
}

static void s_fake_process(Ateenv__V1alpha__Process *p, int state, int code)
{
    ateenv__v1alpha__process__init(p);
    p->process_id = "proc-1";
    p->state = state;
    p->exit_code = code;
}

/* One message of an output stream: ProcessOutput, or ExecResponse for Exec. i is 0 (stdout),
 * 1 (stderr) or 2 (p: the exit; for Exec 3 is p as Started). */
static void s_fake_send_output(grpc_call *c, bool exec, int i, ProtobufCBinaryData d,
                               Ateenv__V1alpha__Process *p)
{
    if (exec) {
        Kagent__Api__V1__ExecResponse r;
        kagent__api__v1__exec_response__init(&r);
        static const Kagent__Api__V1__ExecResponse__MsgCase cases[] = {
            KAGENT__API__V1__EXEC_RESPONSE__MSG_STDOUT, KAGENT__API__V1__EXEC_RESPONSE__MSG_STDERR,
            KAGENT__API__V1__EXEC_RESPONSE__MSG_EXIT, KAGENT__API__V1__EXEC_RESPONSE__MSG_STARTED};
        r.msg_case = cases[i];
        if (i == 0)
            r.stdout = d;
        else if (i == 1)
            r.stderr = d;
        else
            r.exit = p; /* one union with started */
        s_fake_send(c, &r.base);
        return;
    }
    Ateenv__V1alpha__ProcessOutput o;
    ateenv__v1alpha__process_output__init(&o);
    if (i == 0) {
        o.output_case = ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDOUT;
        o.stdout = d;
    } else if (i == 1) {
        o.output_case = ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDERR;
        o.stderr = d;
    } else {
        o.output_case = ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_EXIT;
        o.exit = p;
    }
    s_fake_send(c, &o.base);
}

/* StreamProcessOutput: the bytes past each offset, then the exit message (or a hang). Exec:
 * the same from offset 0 after Started (or its failure before any message). */
static void s_fake_stream_output(grpc_call *c, const uint8_t *req, size_t len, bool exec)
{
    int64_t so = 0, eo = 0;
    Ateenv__V1alpha__Process p;
    if (exec && (s_fake.fail_code || s_fake.no_exec)) {
        s_fake_finish(c, NULL, s_fake.no_exec ? GRPC_STATUS_UNIMPLEMENTED : s_fake.fail_code,
                      s_fake.no_exec ? "no such method" : s_fake.fail_msg);
        return;
    }
    if (exec && !s_fake.start_hang) {
        s_fake_process(&p, ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING, 0);
        s_fake_send_output(c, true, 3, (ProtobufCBinaryData){0}, &p);
    } else if (!exec) {
        Ateenv__V1alpha__StreamProcessOutputRequest *r =
            ateenv__v1alpha__stream_process_output_request__unpack(NULL, len, req);
        so = r ? r->stdout_offset : 0;
        eo = r ? r->stderr_offset : 0;
        ateenv__v1alpha__stream_process_output_request__free_unpacked(r, NULL);
    }
    if (s_fake.stream_hang || s_fake.start_hang) {
        int cancelled = 0;
        grpc_op op = {.op = GRPC_OP_RECV_CLOSE_ON_SERVER};
        op.data.recv_close_on_server.cancelled = &cancelled;
        s_fake_op(c, &op, 1); /* until the client gives up */
        grpc_slice details = grpc_slice_from_static_string("gone");
        grpc_op st = {.op = GRPC_OP_SEND_STATUS_FROM_SERVER};
        st.data.send_status_from_server.status = GRPC_STATUS_CANCELLED;
        st.data.send_status_from_server.status_details = &details;
        s_fake_op(c, &st, 1);
        return;
    }
    const char *streams[2] = {FAKE_OUT, FAKE_ERR};
    int64_t offs[2] = {so, eo};
    for (int i = 0; i < 2; i++) {
        int64_t l = (int64_t)strlen(streams[i]);
        if (offs[i] < l)
            s_fake_send_output(
                c, exec, i,
                (ProtobufCBinaryData){(size_t)(l - offs[i]), (uint8_t *)streams[i] + offs[i]},
                NULL);
    }
    if (!s_fake.stream_no_exit) {
        s_fake_process(&p, ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED, s_fake.exit_code);
        s_fake_send_output(c, exec, 2, (ProtobufCBinaryData){0}, &p);
    }
    s_fake_finish(c, NULL, 0, NULL);
}

static void s_fake_write_file(grpc_call *c, fake_call_t *rec)
/* rec is the call's log slot (or NULL): its req is set from the first message, under mu. */
{
    uint8_t *buf;
    size_t len;
    while (s_fake_recv(c, &buf, &len)) {
        Ateenv__V1alpha__WriteFileRequest *r =
            ateenv__v1alpha__write_file_request__unpack(NULL, len, buf);
        pthread_mutex_lock(&s_fake.mu);
        if (s_fake.upload_msgs == 0) {
            snprintf(s_fake.upload_path, sizeof s_fake.upload_path, "%s", r->path);
            s_fake.upload_mode = r->mode;
        } else if (r->path[0]) {
            s_fake.upload_paths_after_first++;
        }
        s_fake.upload = realloc(s_fake.upload, s_fake.upload_len + r->chunk.len + 1);
        if (r->chunk.len)
            memcpy(s_fake.upload + s_fake.upload_len, r->chunk.data, r->chunk.len);
        s_fake.upload_len += r->chunk.len;
        s_fake.upload_msgs++;
        if (rec && !rec->req) {
            rec->req = buf;
            rec->req_len = len;
            buf = NULL;
        }
        pthread_mutex_unlock(&s_fake.mu);
        ateenv__v1alpha__write_file_request__free_unpacked(r, NULL);
        free(buf);
        if (s_fake.write_fail) {
            s_fake_finish(c, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED,
                          "File exceeds 64 MiB transfer limit");
            return;
        }
    }
    Ateenv__V1alpha__WriteFileResponse resp = ATEENV__V1ALPHA__WRITE_FILE_RESPONSE__INIT;
    resp.bytes_written = (int64_t)s_fake.upload_len;
    s_fake_finish(c, &resp.base, 0, NULL);
}

static void s_fake_read_file(grpc_call *c)
{
    size_t chunk = 1000, off = 0;
    int sent = 0;
    while (off < s_fake.file_len) {
        if (s_fake.read_fail_midway && sent == 1) {
            s_fake_finish(c, NULL, GRPC_STATUS_UNAVAILABLE, "guest went away");
            return;
        }
        size_t n = s_fake.file_len - off < chunk ? s_fake.file_len - off : chunk;
        Ateenv__V1alpha__ReadFileResponse r = ATEENV__V1ALPHA__READ_FILE_RESPONSE__INIT;
        r.chunk.data = s_fake.file + off;
        r.chunk.len = n;
        s_fake_send(c, &r.base);
        off += n;
        sent++;
    }
    s_fake_finish(c, NULL, 0, NULL);
}

/* Unary methods: the response for a method, or a failure status. */
static void s_fake_unary(grpc_call *c, const char *m, const uint8_t *req, size_t len)
{
    Kagent__Api__V1__Sandbox sb;
    Kagent__Api__V1__ResourceReference ref;
    Google__Protobuf__Timestamp ts;
    Ateenv__V1alpha__Process p;
    const char *svc = "/kagent.api.v1.SandboxService/";
    if (strncmp(m, svc, strlen(svc)) == 0) {
        if (s_fake.fail_code) {
            s_fake_finish(c, NULL, s_fake.fail_code, s_fake.fail_msg);
            return;
        }
        int state = strstr(m, "Suspend") ? KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_SUSPENDED
                                         : KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_READY;
        s_fake_sandbox(&sb, &ref, &ts, state);
        if (strstr(m, "ListSandboxes")) {
            Kagent__Api__V1__Sandbox sb2;
            Kagent__Api__V1__ResourceReference ref2;
            Google__Protobuf__Timestamp ts2;
            s_fake_sandbox(&sb2, &ref2, &ts2, KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_FAILED);
            sb2.id = "0198c3f1-0000-7000-8000-000000000002";
            Kagent__Api__V1__Failure f = KAGENT__API__V1__FAILURE__INIT;
            f.message = "image pull failed";
            sb2.failure = &f;
            Kagent__Api__V1__Sandbox *list[] = {&sb, &sb2};
            Kagent__Api__V1__PageResponse page = KAGENT__API__V1__PAGE_RESPONSE__INIT;
            page.next_page_token = "tok2";
            Kagent__Api__V1__ListSandboxesResponse r =
                KAGENT__API__V1__LIST_SANDBOXES_RESPONSE__INIT;
            r.n_sandboxes = 2;
            r.sandboxes = list;
            r.page = &page;
            s_fake_finish(c, &r.base, 0, NULL);
            return;
        }
        /* Every other lifecycle response is { Sandbox sandbox = 1; }. */
        Kagent__Api__V1__GetSandboxResponse r = KAGENT__API__V1__GET_SANDBOX_RESPONSE__INIT;
        r.sandbox = &sb;
        s_fake_finish(c, &r.base, 0, NULL);
        return;
    }
    if (strcmp(m, "/ateenv.v1alpha.ProcessService/StartProcess") == 0 ||
        strcmp(m, "/ateenv.v1alpha.ProcessService/GetProcess") == 0 ||
        strcmp(m, "/ateenv.v1alpha.ProcessService/SignalProcess") == 0) {
        if (s_fake.fail_code) {
            s_fake_finish(c, NULL, s_fake.fail_code, s_fake.fail_msg);
            return;
        }
        s_fake_process(&p, ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING, 0);
        Ateenv__V1alpha__GetProcessResponse r = ATEENV__V1ALPHA__GET_PROCESS_RESPONSE__INIT;
        r.process = &p;
        s_fake_finish(c, &r.base, 0, NULL);
        return;
    }
    if (strncmp(m, "/kagent.api.v1.SandboxTemplateService/", 38) == 0) {
        Kagent__Api__V1__Condition cond = KAGENT__API__V1__CONDITION__INIT;
        cond.type = "Ready";
        cond.status = "True";
        cond.reason = "Prepared";
        Kagent__Api__V1__Condition *conds[] = {&cond};
        Kagent__Api__V1__SandboxTemplate t = KAGENT__API__V1__SANDBOX_TEMPLATE__INIT;
        kagent__api__v1__resource_reference__init(&ref);
        ref.namespace_ = "kagent";
        ref.name = "python";
        t.ref = &ref;
        t.workload_image = "docker.io/library/python:3.13-slim@sha256:abc";
        t.n_conditions = 1;
        t.conditions = conds;
        Kagent__Api__V1__SandboxTemplate *ts_list[] = {&t};
        if (strstr(m, "ListSandboxTemplates")) {
            Kagent__Api__V1__ListSandboxTemplatesResponse r =
                KAGENT__API__V1__LIST_SANDBOX_TEMPLATES_RESPONSE__INIT;
            r.n_sandbox_templates = 1;
            r.sandbox_templates = ts_list;
            s_fake_finish(c, &r.base, 0, NULL);
        } else if (strstr(m, "DeleteSandboxTemplate")) {
            Kagent__Api__V1__DeleteSandboxTemplateResponse r =
                KAGENT__API__V1__DELETE_SANDBOX_TEMPLATE_RESPONSE__INIT;
            s_fake_finish(c, &r.base, 0, NULL);
        } else { /* Create and Get share { SandboxTemplate sandbox_template = 1; } */
            Kagent__Api__V1__GetSandboxTemplateResponse r =
                KAGENT__API__V1__GET_SANDBOX_TEMPLATE_RESPONSE__INIT;
            r.sandbox_template = &t;
            s_fake_finish(c, &r.base, 0, NULL);
        }
        return;
    }
    if (strcmp(m, "/kagent.runtime.v1.RuntimeService/GetStats") == 0) {
        Kagent__Runtime__V1__GetStatsResponse r = KAGENT__RUNTIME__V1__GET_STATS_RESPONSE__INIT;
        r.actors_live = 12;
        r.sandboxes_live = 3;
        s_fake_finish(c, &r.base, 0, NULL);
        return;
    }
    s_fake_finish(c, NULL, GRPC_STATUS_UNIMPLEMENTED, "no such method");
}

static void s_fake_md(const grpc_metadata_array *md, fake_call_t *rec)
{
    for (size_t i = 0; i < md->count; i++) {
        char *k = grpc_slice_to_c_string(md->metadata[i].key);
        char *v = grpc_slice_to_c_string(md->metadata[i].value);
        if (strcmp(k, "x-user-id") == 0)
            snprintf(rec->user_id, sizeof rec->user_id, "%s", v);
        else if (strcmp(k, "authorization") == 0)
            snprintf(rec->auth, sizeof rec->auth, "%s", v);
        else if (strcmp(k, "kagent-sandbox-id") == 0) {
            snprintf(rec->sandbox_id, sizeof rec->sandbox_id, "%s", v);
            rec->n_sandbox_id++;
        }
        gpr_free(k);
        gpr_free(v);
    }
}

static void s_fake_handle(grpc_call *c, const grpc_call_details *det, const grpc_metadata_array *md)
{
    fake_call_t rec;
    memset(&rec, 0, sizeof rec);
    char *m = grpc_slice_to_c_string(det->method);
    snprintf(rec.method, sizeof rec.method, "%s", m);
    s_fake_md(md, &rec);
    grpc_op op = {.op = GRPC_OP_SEND_INITIAL_METADATA};
    s_fake_op(c, &op, 1);
    bool client_stream = strstr(m, "/WriteFile") || strstr(m, "/ImportImage");
    if (!client_stream)
        s_fake_recv(c, &rec.req, &rec.req_len);
    /* Record before answering so the test sees it as soon as the CLI returns. */
    pthread_mutex_lock(&s_fake.mu);
    fake_call_t *slot = s_fake.ncalls < MAX_LOG ? &s_fake.log[s_fake.ncalls] : NULL;
    s_fake.ncalls++;
    if (slot)
        *slot = rec;
    else
        free(rec.req);
    pthread_mutex_unlock(&s_fake.mu);
    if (strstr(m, "/StreamProcessOutput") || strcmp(m, "/kagent.api.v1.ProcessService/Exec") == 0)
        s_fake_stream_output(c, rec.req, rec.req_len, strstr(m, "/Exec") != NULL);
    else if (strstr(m, "/WriteFile"))
        s_fake_write_file(c, slot);
    else if (strstr(m, "/ReadFile"))
        s_fake_read_file(c);
    else
        s_fake_unary(c, m, rec.req, rec.req_len);
    gpr_free(m);
}

static void *s_fake_loop(void *arg)
{
    int tag_new, *tag_shutdown = arg;
    for (;;) {
        grpc_call *call = NULL;
        grpc_call_details det;
        grpc_metadata_array md;
        grpc_call_details_init(&det);
        grpc_metadata_array_init(&md);
        pthread_mutex_lock(&s_fake.mu);
        bool stopping = s_fake.stopping;
        pthread_mutex_unlock(&s_fake.mu);
        bool armed =
            !stopping && grpc_server_request_call(s_fake.server, &call, &det, &md, s_fake.call_cq,
                                                  s_fake.cq, &tag_new) == GRPC_CALL_OK;
        grpc_event ev;
        do {
            ev = grpc_completion_queue_next(s_fake.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        } while (ev.type == GRPC_OP_COMPLETE && ev.tag != &tag_new && ev.tag != tag_shutdown);
        if (ev.type == GRPC_OP_COMPLETE && ev.tag == &tag_new && ev.success)
            s_fake_handle(call, &det, &md);
        if (call)
            grpc_call_unref(call);
        grpc_call_details_destroy(&det);
        grpc_metadata_array_destroy(&md);
        if (ev.type != GRPC_OP_COMPLETE || ev.tag == tag_shutdown)
            break;
        (void)armed;
    }
    return NULL;
}

static int s_tag_shutdown;

static void s_fake_reset(void)
{
    pthread_mutex_lock(&s_fake.mu);
    for (int i = 0; i < MAX_LOG; i++)
        free(s_fake.log[i].req);
    memset(s_fake.log, 0, sizeof s_fake.log);
    s_fake.ncalls = 0;
    s_fake.exit_code = 0;
    s_fake.stream_hang = s_fake.stream_no_exit = s_fake.no_exec = s_fake.start_hang = false;
    s_fake.fail_code = 0;
    s_fake.fail_msg = "sandbox not found";
    s_fake.read_fail_midway = s_fake.write_fail = false;
    free(s_fake.upload);
    s_fake.upload = NULL;
    s_fake.upload_len = 0;
    s_fake.upload_msgs = 0;
    s_fake.upload_paths_after_first = 0;
    s_fake.upload_path[0] = '\0';
    s_fake.upload_mode = 0;
    pthread_mutex_unlock(&s_fake.mu);
}

static int s_fake_start(void **state)
{
    grpc_init();
    pthread_mutex_init(&s_fake.mu, NULL);
    s_fake.cq = grpc_completion_queue_create_for_next(NULL);
    s_fake.call_cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT};
    arg.value.integer = 0;
    grpc_channel_args args = {.num_args = 1, .args = &arg};
    s_fake.server = grpc_server_create(&args, NULL);
    grpc_server_register_completion_queue(s_fake.server, s_fake.cq, NULL);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    int port = grpc_server_add_http2_port(s_fake.server, "127.0.0.1:0", creds);
    grpc_server_credentials_release(creds);
    if (port <= 0)
        fail_msg("FAKE_SERVER: cannot bind 127.0.0.1:0");
    snprintf(s_fake.url, sizeof s_fake.url, "http://127.0.0.1:%d", port);
    grpc_server_start(s_fake.server);
    pthread_create(&s_fake.thread, NULL, s_fake_loop, &s_tag_shutdown);
    return 0;
}

static int s_fake_stop(void **state)
{
    pthread_mutex_lock(&s_fake.mu);
    s_fake.stopping = true;
    pthread_mutex_unlock(&s_fake.mu);
    grpc_server_shutdown_and_notify(s_fake.server, s_fake.cq, &s_tag_shutdown);
    grpc_server_cancel_all_calls(s_fake.server);
    pthread_join(s_fake.thread, NULL);
    grpc_server_destroy(s_fake.server);
    grpc_completion_queue_shutdown(s_fake.cq);
    while (grpc_completion_queue_next(s_fake.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(s_fake.cq);
    grpc_completion_queue_shutdown(s_fake.call_cq);
    grpc_completion_queue_destroy(s_fake.call_cq);
    s_fake_reset();
    free(s_fake.file);
    grpc_shutdown();
    return 0;
}

/* ========================================================================================== */
/* Running the CLI in-process                                                                  */

typedef struct {
    int rc;
    char *out;
    char *err;
    double secs;
} run_t;

static run_t s_last;

/* Runs `kagent --api-url <fake> ARGS...` (NULL-terminated) and keeps its output in s_last. */
static run_t *s_run(const char *first, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = "kagent";
    argv[argc++] = "--api-url";
    argv[argc++] = s_fake.url;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    free(s_last.out);
    free(s_last.err);
    size_t ol, el;
    FILE *out = open_memstream(&s_last.out, &ol);
    FILE *err = open_memstream(&s_last.err, &el);
    kb_rpc_reset_interrupt();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s_last.rc = kb_cli_main(argc, argv, out, err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s_last.secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fclose(out);
    fclose(err);
    return &s_last;
}

static void s_expect(const run_t *r, int rc, const char *in_out, const char *in_err)
{
    if (r->rc != rc || (in_out && !strstr(r->out, in_out)) || (in_err && !strstr(r->err, in_err)))
        fail_msg("rc=%d (want %d)\n--- stdout:\n%s\n--- stderr:\n%s\n--- wanted stdout~ %s / "
                 "stderr~ %s",
                 r->rc, rc, r->out, r->err, in_out ? in_out : "-", in_err ? in_err : "-");
}

static int s_calls(void)
{
    pthread_mutex_lock(&s_fake.mu);
    int n = s_fake.ncalls;
    pthread_mutex_unlock(&s_fake.mu);
    return n;
}

static const fake_call_t *s_call(int i)
{
    assert_true(i < s_calls());
    return &s_fake.log[i];
}

static int s_setup(void **state)
{
    s_fake_reset();
    return 0;
}

/* A scratch directory under /tmp, removed by s_rmdir. */
static char *s_tmpdir(void)
{
    char *d = strdup("/tmp/kagent-cli-test-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void s_rmdir(char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
    free(dir);
}

static int s_count_temp(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, ".kagent-download-", 17) == 0)
            n++;
    if (d)
        closedir(d);
    return n;
}

static void s_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static char *s_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* ========================================================================================== */
/* Tests                                                                                       */

static void test_usage_and_validation(void **state)
{
    const char *hint = "Run 'kagent sandbox create --help' for usage.";
    s_expect(s_run("sandbox", "create", "scratch", "--request-id", "", NULL), 2, NULL,
             "Error: request-id must not be empty\n");
    s_expect(&s_last, 2, NULL, hint);
    s_expect(s_run("sandbox", "create", "scratch", NULL), 2, NULL, "request-id must not be empty");
    const char *bad_ttl[] = {"0s", "999ms", "24h0m1s", "25h", "-1h"};
    for (size_t i = 0; i < sizeof bad_ttl / sizeof bad_ttl[0]; i++)
        s_expect(
            s_run("sandbox", "create", "scratch", "--request-id", "r", "--ttl", bad_ttl[i], NULL),
            2, NULL, "Error: ttl must be between 1s and 24h\n");
    s_expect(s_run("sandbox", "create", "scratch", "--request-id", "r", "--ttl", "soon", NULL), 2,
             NULL, "invalid argument \"soon\" for \"--ttl\" flag");
    /* exec: `--` right after ID and a command after it */
    const char *sep = "Error: separate the sandbox ID and command with --\n";
    s_expect(s_run("sandbox", "exec", SB_ID, "python", NULL), 2, NULL, sep);
    s_expect(s_run("sandbox", "exec", SB_ID, "python", "--", "x", NULL), 2, NULL, sep);
    s_expect(s_run("sandbox", "exec", SB_ID, "--", NULL), 2, NULL, sep);
    s_expect(s_run("sandbox", "exec", "--", "python", NULL), 2, NULL, sep);
    s_expect(s_run("sandbox", "wait", SB_ID, "proc-1", "--stdout-offset", "-1", NULL), 2, NULL,
             "Error: output offsets must be nonnegative\n");
    s_expect(s_run("sandbox", "wait", SB_ID, "proc-1", "--stderr-offset=-5", NULL), 2, NULL,
             "output offsets must be nonnegative");
    s_expect(s_run("sandbox", "list", "--page-size", "101", NULL), 2, NULL,
             "page-size must be between 0 and 100");
    /* Cobra-style argument and flag errors */
    s_expect(s_run("sandbox", "get", NULL), 2, NULL, "Error: accepts 1 arg(s), received 0\n");
    s_expect(s_run("sandbox", "get", "a", "b", NULL), 2, NULL, "accepts 1 arg(s), received 2");
    s_expect(s_run("sandbox", "list", "--bogus", NULL), 2, NULL,
             "Error: unknown flag: --bogus\nRun 'kagent sandbox list --help' for usage.\n");
    s_expect(s_run("sandbox", "list", "-o", "xml", NULL), 2, NULL,
             "invalid output format \"xml\": want table, json, yaml or jsonpath=TEMPLATE");
    s_expect(s_run("sandbox", "list", "-o", "jsonpath={.items[", NULL), 2, NULL,
             "jsonpath: expected an index, a slice, *, a quoted name or ?(filter) at column");
    s_expect(s_run("sandbox", "frob", NULL), 2, NULL,
             "unknown command \"frob\" for \"kagent sandbox\"");
    s_expect(s_run("sandbox", "--", "get", NULL), 2, NULL,
             "unknown command \"get\" for \"kagent sandbox\"");
    s_expect(s_run("sandbox", "upload", SB_ID, "/x", "y", "--mode", "rw", NULL), 2, NULL,
             "invalid argument \"rw\" for \"--mode\" flag");
    s_expect(s_run("sandbox", "list", "--timeout", NULL), 2, NULL,
             "flag needs an argument: --timeout");
    s_expect(s_run("apply", NULL), 2, NULL, "must specify -f FILE");

    /* upload size and kind are checked before any network call */
    char *dir = s_tmpdir();
    char big[256];
    snprintf(big, sizeof big, "%s/big.bin", dir);
    FILE *f = fopen(big, "wb");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), 64 * 1024 * 1024 + 1), 0); /* sparse */
    fclose(f);
    const char *lim = "Error: upload requires a regular file of at most 64 MiB\n";
    s_expect(s_run("sandbox", "upload", SB_ID, big, "big.bin", NULL), 1, NULL, lim);
    s_expect(s_run("sandbox", "upload", SB_ID, dir, "d", NULL), 1, NULL, lim);
    assert_int_equal(s_calls(), 0); /* nothing above reached the server */
    s_rmdir(dir);
}

static void test_help_everywhere(void **state)
{
    const char *paths[][3] = {
        {"sandbox", NULL},     {"sandbox", "templates"}, {"sandbox", "create"},
        {"sandbox", "list"},   {"sandbox", "get"},       {"sandbox", "suspend"},
        {"sandbox", "resume"}, {"sandbox", "delete"},    {"sandbox", "exec"},
        {"sandbox", "wait"},   {"sandbox", "process"},   {"sandbox", "kill"},
        {"sandbox", "upload"}, {"sandbox", "download"},  {"apply", NULL},
        {"get", "template"},   {"delete", "template"},   {"image", "import"},
        {"image", "list"},     {"image", "rm"},          {"runtime", "tree"},
        {"runtime", "nodes"},  {"runtime", "pools"},     {"runtime", "stats"},
        {"image", NULL},       {"runtime", NULL},
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        if (paths[i][1])
            s_run(paths[i][0], paths[i][1], "--help", NULL);
        else
            s_run(paths[i][0], "-h", NULL);
        s_expect(&s_last, 0, "Usage:\n", NULL);
        s_expect(&s_last, 0, "Global Flags:\n", NULL);
    }
    s_expect(s_run("sandbox", "exec", "--help", NULL), 0,
             "  kagent sandbox exec ID -- COMMAND [ARG...] [flags]\n", NULL);
    s_expect(&s_last, 0, "--cwd string", NULL);
    s_expect(&s_last, 0, "(default \"/data/workspace\")", NULL);
    s_expect(s_run("sandbox", NULL), 0, "Run commands and transfer files in standalone sandboxes",
             NULL);
    s_expect(&s_last, 0, "  download     Download a file, replacing the local destination only",
             NULL);
    s_expect(s_run("help", "sandbox", "create", NULL), 0, "--request-id string", NULL);
    s_expect(s_run("sandbox", "--help", NULL), 0, "\n  get          get a sandbox\n", NULL);
    s_expect(s_run("sandbox", "get", "--help", NULL), 0, "retry the same mutation", NULL);
    assert_int_equal(s_calls(), 0);
}

static void test_table_rendering(void **state)
{
    Kagent__Api__V1__Sandbox a, b;
    Kagent__Api__V1__ResourceReference ra, rb;
    Google__Protobuf__Timestamp ta, tb;
    s_fake_sandbox(&a, &ra, &ta, KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_READY);
    s_fake_sandbox(&b, &rb, &tb, KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_CREATING);
    b.id = "short";
    b.operation = KAGENT__API__V1__RUNTIME_OPERATION__RUNTIME_OPERATION_CREATE;
    b.expires_at = NULL;
    b.node = ""; /* not placed yet */
    Kagent__Api__V1__Failure f = KAGENT__API__V1__FAILURE__INIT;
    f.message = "boom";
    b.failure = &f;
    Kagent__Api__V1__Sandbox *list[] = {&a, &b};
    char *buf = NULL;
    size_t len;
    FILE *out = open_memstream(&buf, &len);
    kb_print_sandboxes(out, list, 2);
    fclose(out);
    assert_string_equal(
        buf, "ID                                    TEMPLATE        STATE                   "
             "OPERATION                 NODE    EXPIRES               FAILURE\n" SB_ID
             "  kagent/scratch  RUNTIME_STATE_READY     RUNTIME_OPERATION_NONE    node-1  "
             "2026-10-01T16:30:00Z\n"
             "short                                 kagent/scratch  RUNTIME_STATE_CREATING  "
             "RUNTIME_OPERATION_CREATE                                boom\n");
    free(buf);

    Ateenv__V1alpha__Process p;
    s_fake_process(&p, ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING, 0);
    out = open_memstream(&buf, &len);
    kb_print_process(out, &p);
    p.state = ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED;
    p.exit_code = 137;
    kb_print_process(out, &p);
    fclose(out);
    assert_string_equal(buf, "proc-1  PROCESS_STATE_RUNNING\n"
                             "proc-1  PROCESS_STATE_EXITED  exit_code=137\n");
    free(buf);
}

static void test_lifecycle_rpcs(void **state)
{
    s_expect(s_run("sandbox", "create", "scratch", "--request-id", "my-first-sandbox", "--ttl",
                   "1h30m", "--name", "demo", "--user-id", "alice@example.com", "--token", "T0K",
                   NULL),
             0,
             SB_ID "  kagent/scratch  RUNTIME_STATE_READY  RUNTIME_OPERATION_NONE  node-1  "
                   "2026-10-01T16:30:00Z\n",
             NULL);
    assert_int_equal(s_calls(), 1);
    const fake_call_t *c = s_call(0);
    assert_string_equal(c->method, "/kagent.api.v1.SandboxService/CreateSandbox");
    assert_string_equal(c->user_id, "alice@example.com");
    assert_string_equal(c->auth, "Bearer T0K");
    assert_int_equal(c->n_sandbox_id, 0);
    Kagent__Api__V1__CreateSandboxRequest *cr =
        kagent__api__v1__create_sandbox_request__unpack(NULL, c->req_len, c->req);
    assert_non_null(cr);
    assert_string_equal(cr->request_id, "my-first-sandbox");
    assert_string_equal(cr->name, "demo");
    assert_string_equal(cr->sandbox_template->namespace_, "kagent");
    assert_string_equal(cr->sandbox_template->name, "scratch");
    assert_int_equal(cr->ttl->seconds, 5400);
    kagent__api__v1__create_sandbox_request__free_unpacked(cr, NULL);

    /* default identity, no token, -n, no ttl */
    s_fake_reset();
    s_expect(
        s_run("-n", "team", "sandbox", "create", "py", "--request-id", "r2", "-o", "json", NULL), 0,
        "\"id\": \"" SB_ID "\"", NULL);
    c = s_call(0);
    assert_string_equal(c->user_id, "admin@kagent.dev");
    assert_string_equal(c->auth, "");
    cr = kagent__api__v1__create_sandbox_request__unpack(NULL, c->req_len, c->req);
    assert_string_equal(cr->sandbox_template->namespace_, "team");
    assert_null(cr->ttl);
    kagent__api__v1__create_sandbox_request__free_unpacked(cr, NULL);

    /* create failure keeps the retry advice */
    s_fake.fail_code = GRPC_STATUS_UNAVAILABLE;
    s_expect(s_run("sandbox", "create", "scratch", "--request-id", "r3", NULL), 1, NULL,
             "Error: create sandbox (retry with request-id \"r3\" and identical inputs): rpc "
             "error: code = Unavailable desc = sandbox not found\n");
    s_fake.fail_code = GRPC_STATUS_NOT_FOUND;
    s_expect(s_run("sandbox", "get", SB_ID, NULL), 1, NULL,
             "Error: get sandbox " SB_ID ": rpc error: code = NotFound desc = sandbox not found\n");
    s_expect(s_run("sandbox", "delete", "nope", NULL), 1, NULL,
             "Error: delete sandbox nope: rpc error: code = NotFound");
    s_fake.fail_code = 0;

    s_fake_reset();
    const char *verbs[] = {"get", "suspend", "resume", "delete"};
    const char *methods[] = {"GetSandbox", "SuspendSandbox", "ResumeSandbox", "DeleteSandbox"};
    for (int i = 0; i < 4; i++) {
        s_expect(s_run("sandbox", verbs[i], SB_ID, NULL), 0, SB_ID "  kagent/scratch", NULL);
        s_expect(&s_last, 0, "OPERATION               NODE    EXPIRES", NULL);
        s_expect(&s_last, 0, "RUNTIME_OPERATION_NONE  node-1  2026-10-01T16:30:00Z\n", NULL);
        c = s_call(i);
        assert_non_null(strstr(c->method, methods[i]));
        Kagent__Api__V1__GetSandboxRequest *g =
            kagent__api__v1__get_sandbox_request__unpack(NULL, c->req_len, c->req);
        assert_string_equal(g->sandbox_id, SB_ID);
        kagent__api__v1__get_sandbox_request__free_unpacked(g, NULL);
    }
    s_expect(&s_last, 0, NULL, NULL);

    /* list: table, next-page hint on stderr, paging request */
    s_fake_reset();
    s_expect(s_run("sandbox", "list", "--page-size", "5", "--page-token", "tok1", NULL), 0,
             "0198c3f1-0000-7000-8000-000000000002  kagent/scratch  RUNTIME_STATE_FAILED  "
             "RUNTIME_OPERATION_NONE  node-1  2026-10-01T16:30:00Z  image pull failed\n",
             "Next page: --page-token tok2\n");
    s_expect(&s_last, 0, "OPERATION               NODE    EXPIRES               FAILURE\n", NULL);
    assert_null(strstr(s_last.out, "Next page"));
    c = s_call(0);
    Kagent__Api__V1__ListSandboxesRequest *lr =
        kagent__api__v1__list_sandboxes_request__unpack(NULL, c->req_len, c->req);
    assert_int_equal(lr->page->limit, 5);
    assert_string_equal(lr->page->page_token, "tok1");
    kagent__api__v1__list_sandboxes_request__free_unpacked(lr, NULL);
}

static void test_json_output_shape(void **state)
{
    s_expect(s_run("sandbox", "get", SB_ID, "-o", "json", NULL), 0, NULL, NULL);
    json_error_t je;
    json_t *j = json_loads(s_last.out, 0, &je);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "id")), SB_ID);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "RUNTIME_STATE_READY");
    assert_string_equal(json_string_value(json_object_get(j, "expiresAt")), "2026-10-01T16:30:00Z");
    assert_string_equal(json_string_value(json_object_get(j, "node")), "node-1");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "sandboxTemplate"), "namespace")),
        "kagent");
    assert_null(json_object_get(j, "operation")); /* default omitted, as protojson does */
    assert_null(json_object_get(j, "expires_at"));
    json_decref(j);

    s_expect(s_run("sandbox", "list", "--output-format=json", NULL), 0, NULL, NULL);
    assert_null(strstr(s_last.err, "Next page")); /* JSON carries the token itself */
    j = json_loads(s_last.out, 0, &je);
    assert_non_null(j);
    assert_int_equal(json_array_size(json_object_get(j, "sandboxes")), 2);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(j, "sandboxes"), 1), "node")),
                        "node-1");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "page"), "nextPageToken")), "tok2");
    json_decref(j);

    s_expect(s_run("sandbox", "templates", "-o", "json", NULL), 0, NULL, NULL);
    j = json_loads(s_last.out, 0, &je);
    assert_non_null(j);
    json_t *t0 = json_array_get(json_object_get(j, "sandboxTemplates"), 0);
    assert_string_equal(json_string_value(json_object_get(t0, "workloadImage")),
                        "docker.io/library/python:3.13-slim@sha256:abc");
    json_decref(j);
}

static void test_exec_follows_stream_to_exit_code(void **state)
{
    s_fake.exit_code = 3;
    s_expect(s_run("sandbox", "exec", SB_ID, "--env", "A=1,B=x", "--env=C=3", "--", "sh", "-c",
                   "echo hello; exit 3", NULL),
             3, NULL, NULL);
    assert_string_equal(s_last.out, FAKE_OUT); /* raw remote stdout */
    assert_string_equal(s_last.err, "Process proc-1 in sandbox " SB_ID
                                    ": started (stdout offset 0, stderr offset 0)\n" FAKE_ERR
                                    "Process proc-1: PROCESS_STATE_EXITED, exit_code=3\n");
    assert_int_equal(s_calls(), 1); /* one Exec stream: started, output, exit; no polling */
    const fake_call_t *start = s_call(0);
    assert_string_equal(start->method, "/kagent.api.v1.ProcessService/Exec");
    assert_int_equal(start->n_sandbox_id, 1);
    assert_string_equal(start->sandbox_id, SB_ID);
    Ateenv__V1alpha__StartProcessRequest *sr =
        ateenv__v1alpha__start_process_request__unpack(NULL, start->req_len, start->req);
    assert_int_equal(sr->n_command, 3);
    assert_string_equal(sr->command[2], "echo hello; exit 3");
    assert_string_equal(sr->cwd, "/data/workspace");
    assert_int_equal(sr->n_env, 3);
    assert_string_equal(sr->env[1]->key, "B");
    assert_string_equal(sr->env[1]->value, "x");
    assert_string_equal(sr->env[2]->value, "3");
    ateenv__v1alpha__start_process_request__free_unpacked(sr, NULL);
    char *exec_out = strdup(s_last.out), *exec_err = strdup(s_last.err);

    /* a server without Exec (UNIMPLEMENTED: nothing started): StartProcess, then the follow
     * stream, and the very same output */
    s_fake_reset();
    s_fake.exit_code = 3;
    s_fake.no_exec = true;
    s_expect(s_run("sandbox", "exec", SB_ID, "--env", "A=1,B=x", "--env=C=3", "--", "sh", "-c",
                   "echo hello; exit 3", NULL),
             3, exec_out, exec_err);
    assert_string_equal(s_last.out, exec_out);
    assert_string_equal(s_last.err, exec_err);
    free(exec_out);
    free(exec_err);
    assert_int_equal(s_calls(), 3);
    assert_string_equal(s_call(1)->method, "/ateenv.v1alpha.ProcessService/StartProcess");
    const fake_call_t *follow = s_call(2);
    assert_string_equal(follow->method, "/ateenv.v1alpha.ProcessService/StreamProcessOutput");
    for (int i = 0; i < 3; i++) {
        assert_int_equal(s_call(i)->n_sandbox_id, 1);
        assert_string_equal(s_call(i)->sandbox_id, SB_ID);
    }
    assert_int_equal(s_call(1)->req_len, start->req_len); /* the same request, sent again */
    Ateenv__V1alpha__StreamProcessOutputRequest *fr =
        ateenv__v1alpha__stream_process_output_request__unpack(NULL, follow->req_len, follow->req);
    assert_true(fr->follow);
    assert_string_equal(fr->process_id, "proc-1");
    assert_int_equal(fr->stdout_offset, 0);
    ateenv__v1alpha__stream_process_output_request__free_unpacked(fr, NULL);

    /* a stream that ends OK after Started without the exit: resumable, as a wait's */
    s_fake_reset();
    s_fake.stream_no_exit = true;
    s_expect(s_run("sandbox", "exec", SB_ID, "--", "x", NULL), 1, FAKE_OUT,
             "(stdout offset 6, stderr offset 5); use sandbox wait to continue: output stream "
             "ended before the process exited\n");

    /* JSON events */
    s_fake_reset();
    s_fake.exit_code = 3;
    s_expect(s_run("sandbox", "exec", SB_ID, "-o", "json", "--cwd", "/tmp", "--", "false", NULL), 3,
             NULL, NULL);
    assert_string_equal(
        s_last.out,
        "{\"event\":\"started\",\"sandbox_id\":\"" SB_ID "\",\"process_id\":\"proc-1\","
        "\"stdout_offset\":0,\"stderr_offset\":0}\n"
        "{\"event\":\"output\",\"sandbox_id\":\"" SB_ID "\",\"process_id\":\"proc-1\","
        "\"source\":\"stdout\",\"data\":\"aGVsbG8K\",\"stdout_offset\":6,\"stderr_offset\":0}\n"
        "{\"event\":\"output\",\"sandbox_id\":\"" SB_ID "\",\"process_id\":\"proc-1\","
        "\"source\":\"stderr\",\"data\":\"b29wcwo=\",\"stdout_offset\":6,\"stderr_offset\":5}\n"
        "{\"event\":\"finished\",\"sandbox_id\":\"" SB_ID "\",\"process_id\":\"proc-1\","
        "\"status\":\"PROCESS_STATE_EXITED\",\"exit_code\":3,\"stdout_offset\":6,"
        "\"stderr_offset\":5}\n");
    assert_string_equal(s_last.err, "");

    /* exit codes: 0 -> 0, out of range -> 1 */
    s_fake_reset();
    s_expect(s_run("sandbox", "exec", SB_ID, "--", "true", NULL), 0, FAKE_OUT, NULL);
    s_fake.exit_code = 300;
    s_expect(s_run("sandbox", "exec", SB_ID, "--", "x", NULL), 1, NULL, "exit_code=300");
    s_fake.exit_code = 137;
    s_expect(s_run("sandbox", "exec", SB_ID, "--", "x", NULL), 137, NULL, NULL);

    /* --wait=false: started, then exit 0 without following */
    s_fake_reset();
    s_expect(s_run("sandbox", "exec", SB_ID, "--wait=false", "--", "sleep", "100", NULL), 0, NULL,
             "Process proc-1 in sandbox " SB_ID ": started");
    assert_int_equal(s_calls(), 1);

    /* a refused start: never retried, and no "may have started" (nothing ran) */
    static const struct {
        int code;
        const char *name;
    } refusals[] = {{GRPC_STATUS_INVALID_ARGUMENT, "InvalidArgument"},
                    {GRPC_STATUS_NOT_FOUND, "NotFound"},
                    {GRPC_STATUS_PERMISSION_DENIED, "PermissionDenied"},
                    {GRPC_STATUS_FAILED_PRECONDITION, "FailedPrecondition"}};
    char want[256];
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        s_fake_reset();
        s_fake.fail_code = refusals[i].code;
        s_fake.fail_msg = "Sandbox ID must be a UUID";
        snprintf(want, sizeof want,
                 "Error: start process in sandbox bad-id: rpc error: code = %s desc = Sandbox ID "
                 "must be a UUID\n",
                 refusals[i].name);
        s_expect(s_run("sandbox", "exec", "bad-id", "--", "x", NULL), 1, NULL, want);
        assert_null(strstr(s_last.err, "may have started"));
        assert_int_equal(s_calls(), 1);
        assert_string_equal(s_call(0)->sandbox_id, "bad-id");
    }
    /* an unknown outcome: never retried, with the advice */
    static const struct {
        int code;
        const char *name;
    } unknown[] = {{GRPC_STATUS_UNAVAILABLE, "Unavailable"},
                   {GRPC_STATUS_DEADLINE_EXCEEDED, "DeadlineExceeded"},
                   {GRPC_STATUS_UNKNOWN, "Unknown"}};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        s_fake_reset();
        s_fake.fail_code = unknown[i].code;
        s_fake.fail_msg = "connection lost";
        snprintf(want, sizeof want,
                 "Error: start process in sandbox " SB_ID ": command may have started; do not "
                 "blindly retry: rpc error: code = %s desc = connection lost\n",
                 unknown[i].name);
        s_expect(s_run("sandbox", "exec", SB_ID, "--", "x", NULL), 1, NULL, want);
        assert_int_equal(s_calls(), 1);
    }
    /* the deadline before the process was reported: unknown too */
    s_fake_reset();
    s_fake.start_hang = true;
    s_expect(s_run("sandbox", "exec", SB_ID, "--timeout", "300ms", "--", "x", NULL), 1, NULL,
             "Error: start process in sandbox " SB_ID ": command may have started; do not "
             "blindly retry: rpc error: code = DeadlineExceeded");
    assert_int_equal(s_calls(), 1);
}

static void test_wait_interrupted_by_timeout(void **state)
{
    s_fake.stream_hang = true;
    s_expect(s_run("sandbox", "wait", SB_ID, "proc-1", "--stdout-offset", "5", "--stderr-offset",
                   "2", "--timeout", "300ms", NULL),
             1, NULL,
             "Error: wait interrupted; sandbox " SB_ID " process proc-1 (stdout offset 5, stderr "
             "offset 2); use sandbox wait to continue: rpc error: code = DeadlineExceeded");
    assert_true(s_last.secs < 5.0);
    assert_true(s_last.secs >= 0.25);
    assert_int_equal(s_calls(), 1); /* only the stream: nothing was killed */
    const fake_call_t *c = s_call(0);
    Ateenv__V1alpha__StreamProcessOutputRequest *fr =
        ateenv__v1alpha__stream_process_output_request__unpack(NULL, c->req_len, c->req);
    assert_int_equal(fr->stdout_offset, 5);
    assert_int_equal(fr->stderr_offset, 2);
    ateenv__v1alpha__stream_process_output_request__free_unpacked(fr, NULL);

    /* JSON mode emits the interrupted record too */
    s_fake_reset();
    s_fake.stream_hang = true;
    s_expect(s_run("sandbox", "exec", SB_ID, "-o", "json", "--timeout", "300ms", "--", "sleep", "9",
                   NULL),
             1, "{\"event\":\"interrupted\"", "use sandbox wait to continue");

    /* a stream that ends without an exit message is an interruption with resumable offsets */
    s_fake_reset();
    s_fake.stream_no_exit = true;
    s_expect(s_run("sandbox", "wait", SB_ID, "proc-1", NULL), 1, FAKE_OUT,
             "(stdout offset 6, stderr offset 5); use sandbox wait to continue: output stream "
             "ended before the process exited\n");
}

static void *s_interrupt_later(void *arg)
{
    usleep(300 * 1000);
    kb_rpc_interrupt(); /* what the SIGINT handler does */
    return NULL;
}

static void test_exec_interrupted_by_ctrl_c(void **state)
{
    s_fake.stream_hang = true;
    pthread_t t;
    pthread_create(&t, NULL, s_interrupt_later, NULL);
    s_expect(s_run("sandbox", "exec", SB_ID, "--", "sleep", "100", NULL), 1, NULL,
             "Error: wait interrupted; sandbox " SB_ID " process proc-1 (stdout offset 0, stderr "
             "offset 0); use sandbox wait to continue: rpc error: code = Canceled desc = "
             "interrupted\n");
    pthread_join(t, NULL);
    assert_true(s_last.secs < 5.0);
    assert_int_equal(s_calls(), 1); /* the Exec stream only; no kill */
}

/* Client-observed exec round trip (start + follow to exit) against the fake, in-process:
 * prints p50/p99 and checks a loose bound so a stall (e.g. falling back to polling) fails. */
static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void test_exec_round_trip_latency(void **state)
{
    enum { N = 200 };
    double t[N];
    for (int i = 0; i < N; i++) {
        s_fake_reset();
        s_run("sandbox", "exec", SB_ID, "-o", "json", "--", "true", NULL);
        assert_int_equal(s_last.rc, 0);
        t[i] = s_last.secs * 1000.0;
    }
    qsort(t, N, sizeof t[0], s_cmp_double);
    printf("exec round trip (in-process CLI + fake server, new channel per run): p50 %.2f ms, "
           "p99 %.2f ms over %d runs\n",
           t[N / 2], t[N * 99 / 100], N);
    assert_true(t[N / 2] < 250.0);
}

static void test_process_and_kill(void **state)
{
    s_expect(s_run("sandbox", "process", SB_ID, "proc-1", NULL), 0,
             "proc-1  PROCESS_STATE_RUNNING\n", NULL);
    s_expect(s_run("sandbox", "process", SB_ID, "proc-1", "-o", "json", NULL), 0,
             "\"processId\": \"proc-1\"", NULL);
    s_fake_reset();
    s_fake.exit_code = 137;
    s_expect(s_run("sandbox", "kill", SB_ID, "proc-1", NULL), 0, "proc-1  exit_code=137\n", NULL);
    const fake_call_t *c = s_call(0);
    assert_string_equal(c->method, "/ateenv.v1alpha.ProcessService/SignalProcess");
    assert_int_equal(c->n_sandbox_id, 1);
    Ateenv__V1alpha__SignalProcessRequest *sr =
        ateenv__v1alpha__signal_process_request__unpack(NULL, c->req_len, c->req);
    assert_int_equal(sr->signal, ATEENV__V1ALPHA__SIGNAL__SIGNAL_KILL);
    ateenv__v1alpha__signal_process_request__free_unpacked(sr, NULL);
    s_expect(s_run("sandbox", "kill", SB_ID, "proc-1", "-o", "json", NULL), 0, "\"exitCode\": 137",
             NULL);
}

static void test_upload(void **state)
{
    char *dir = s_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    uint8_t *data = malloc(FILE_SIZE);
    for (size_t i = 0; i < FILE_SIZE; i++)
        data[i] = (uint8_t)(i * 7 + i / 251);
    s_write(path, data, FILE_SIZE);
    s_expect(s_run("sandbox", "upload", SB_ID, path, "data.bin", "--mode", "0644", NULL), 0,
             "Wrote 2621440 bytes to data.bin\n", NULL);
    assert_int_equal(s_fake.upload_msgs, 3); /* 1 MiB chunks */
    assert_int_equal(s_fake.upload_len, FILE_SIZE);
    assert_memory_equal(s_fake.upload, data, FILE_SIZE);
    assert_string_equal(s_fake.upload_path, "data.bin");
    assert_int_equal(s_fake.upload_mode, 0644);
    assert_int_equal(s_fake.upload_paths_after_first, 0);
    assert_int_equal(s_call(0)->n_sandbox_id, 1);

    s_fake_reset();
    s_expect(s_run("sandbox", "upload", SB_ID, path, "/data/workspace/d", "-o", "json", NULL), 0,
             "\"bytesWritten\": \"2621440\"", NULL);

    /* an empty file is one message carrying the path */
    s_fake_reset();
    snprintf(path, sizeof path, "%s/empty", dir);
    s_write(path, "", 0);
    s_expect(s_run("sandbox", "upload", SB_ID, path, "e", NULL), 0, "Wrote 0 bytes to e\n", NULL);
    assert_int_equal(s_fake.upload_msgs, 1);
    assert_string_equal(s_fake.upload_path, "e");

    s_fake_reset();
    s_fake.write_fail = true;
    s_expect(s_run("sandbox", "upload", SB_ID, path, "e", NULL), 1, NULL,
             "Error: upload failed; remote file may be partial: rpc error: code = "
             "ResourceExhausted desc = File exceeds 64 MiB transfer limit\n");
    free(data);
    s_rmdir(dir);
}

static void test_download(void **state)
{
    char *dir = s_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    s_fake.file_len = 4500;
    free(s_fake.file);
    s_fake.file = malloc(s_fake.file_len);
    for (size_t i = 0; i < s_fake.file_len; i++)
        s_fake.file[i] = (uint8_t)(i % 253);
    s_write(path, "OLD", 3);

    /* fails midway: the old file stays, no temporary left */
    s_fake.read_fail_midway = true;
    s_expect(s_run("sandbox", "download", SB_ID, "out.bin", path, NULL), 1, NULL,
             "rpc error: code = Unavailable desc = guest went away");
    s_expect(&s_last, 1, NULL, "Error: download failed; ");
    size_t len;
    char *got = s_read(path, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(got, "OLD", 3);
    free(got);
    assert_int_equal(s_count_temp(dir), 0);

    /* success: byte-exact, replaced, no temporary left */
    s_fake.read_fail_midway = false;
    s_expect(s_run("sandbox", "download", SB_ID, "out.bin", path, NULL), 0, path, NULL);
    got = s_read(path, &len);
    assert_int_equal(len, s_fake.file_len);
    assert_memory_equal(got, s_fake.file, len);
    free(got);
    assert_int_equal(s_count_temp(dir), 0);
    const fake_call_t *c = s_call(1);
    assert_string_equal(c->method, "/ateenv.v1alpha.FileSystemService/ReadFile");
    assert_int_equal(c->n_sandbox_id, 1);

    s_expect(s_run("sandbox", "download", SB_ID, "out.bin", path, "-o", "json", NULL), 0,
             "\"path\": \"", NULL);
    s_rmdir(dir);
}

static void test_templates_and_apply(void **state)
{
    s_expect(s_run("sandbox", "templates", NULL), 0,
             "NAMESPACE  NAME    IMAGE\nkagent     python  "
             "docker.io/library/python:3.13-slim@sha256:abc\n",
             NULL);
    Kagent__Api__V1__ListSandboxTemplatesRequest *lr =
        kagent__api__v1__list_sandbox_templates_request__unpack(NULL, s_call(0)->req_len,
                                                                s_call(0)->req);
    assert_string_equal(lr->namespace_, "kagent");
    kagent__api__v1__list_sandbox_templates_request__free_unpacked(lr, NULL);

    char *dir = s_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.yaml", dir);
    const char *doc = "apiVersion: api.kagent.dev/v1alpha3\nkind: SandboxTemplate\nmetadata:\n"
                      "  name: scratch\n  namespace: team\nspec:\n  workload:\n    image: x\n";
    s_write(path, doc, strlen(doc));
    s_fake_reset();
    s_expect(s_run("apply", "-f", path, NULL), 0,
             "sandboxtemplate.api.kagent.dev/scratch applied\n", NULL);
    const fake_call_t *c = s_call(0);
    assert_string_equal(c->method, "/kagent.api.v1.SandboxTemplateService/CreateSandboxTemplate");
    Kagent__Api__V1__CreateSandboxTemplateRequest *cr =
        kagent__api__v1__create_sandbox_template_request__unpack(NULL, c->req_len, c->req);
    assert_string_equal(cr->ref->namespace_, "team");
    assert_string_equal(cr->ref->name, "scratch");
    assert_string_equal(cr->yaml, doc);
    kagent__api__v1__create_sandbox_template_request__free_unpacked(cr, NULL);

    const char *noname = "kind: SandboxTemplate\nmetadata: {}\n";
    s_write(path, noname, strlen(noname));
    s_expect(s_run("apply", "-f", path, NULL), 1, NULL, "metadata.name: Required value");
    s_write(path, "a: [", 4);
    s_expect(s_run("apply", "-f", path, NULL), 1, NULL, "Error: ");
    snprintf(path, sizeof path, "%s/missing.yaml", dir);
    s_expect(s_run("apply", "-f", path, NULL), 1, NULL, "No such file or directory");
    s_rmdir(dir);

    s_expect(s_run("get", "template", "python", NULL), 0,
             "NAMESPACE  NAME    READY  REASON    IMAGE        ", NULL);
    s_expect(&s_last, 0, "kagent     python  True   Prepared  docker.io", NULL);
    s_expect(s_run("delete", "template", "python", NULL), 0,
             "sandboxtemplate.api.kagent.dev/python deleted\n", NULL);
}

static void test_runtime_and_errors(void **state)
{
    s_expect(s_run("runtime", "stats", NULL), 0, "actors_live     12\n", NULL);
    s_expect(&s_last, 0, "sandboxes_live  3\n", NULL);
    s_expect(s_run("runtime", "stats", "-o", "json", "-v", NULL), 0, "\"actorsLive\": \"12\"",
             "/kagent.runtime.v1.RuntimeService/GetStats -> OK (");
    s_expect(s_run("runtime", "nodes", NULL), 1, NULL,
             "Error: list nodes: rpc error: code = Unimplemented desc = no such method\n");
    /* An unreachable server is an Unavailable error, exit 1. */
    char *argv[] = {"kagent", "--api-url", "http://127.0.0.1:1", "sandbox", "list", NULL};
    char *o = NULL, *e = NULL;
    size_t ol, el;
    FILE *out = open_memstream(&o, &ol), *err = open_memstream(&e, &el);
    int rc = kb_cli_main(5, argv, out, err);
    fclose(out);
    fclose(err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(e, "Error: list sandboxes: rpc error: code = Unavailable"));
    free(o);
    free(e);
    s_expect(s_run("--api-url", "grpc://x", "sandbox", "list", NULL), 1, NULL,
             "invalid --api-url \"grpc://x\"");
}

/* Nothing reached a server that refused the connection: an exec says so, without the "may have
 * started" warning that a cut-off call gets. */
static void test_unreachable_exec_is_known_not_started(void **state)
{
    (void)state;
    char *argv[] = {"kagent", "--api-url", "http://127.0.0.1:1", "sandbox", "exec", SB_ID, "--",
                    "true",   NULL};
    char *o = NULL, *e = NULL;
    size_t ol, el;
    FILE *out = open_memstream(&o, &ol), *err = open_memstream(&e, &el);
    int rc = kb_cli_main(8, argv, out, err);
    fclose(out);
    fclose(err);
    assert_int_equal(rc, 1);
    assert_string_equal(e, "Error: start process in sandbox " SB_ID ": rpc error: code = "
                           "Unavailable desc = connect to 127.0.0.1:1: Connection refused\n");
    free(o);
    free(e);
}

static void test_duration_parser(void **state)
{
    int64_t ns;
    assert_int_equal(kb_parse_duration("5m0s", &ns), 0);
    assert_true(ns == 300LL * KB_NS_PER_SEC);
    assert_int_equal(kb_parse_duration("1.5h", &ns), 0);
    assert_true(ns == 5400LL * KB_NS_PER_SEC);
    assert_int_equal(kb_parse_duration("300ms", &ns), 0);
    assert_true(ns == 300000000LL);
    assert_int_equal(kb_parse_duration("1h2m3s4ms", &ns), 0);
    assert_true(ns == 3723004000000LL);
    assert_int_equal(kb_parse_duration("0", &ns), 0);
    assert_true(ns == 0);
    assert_int_equal(kb_parse_duration("-2s", &ns), 0);
    assert_true(ns == -2LL * KB_NS_PER_SEC);
    const char *bad[] = {"", "5", "5x", "m", "1h 2m", "--1s", "s5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (kb_parse_duration(bad[i], &ns) != -EINVAL)
            fail_msg("accepted duration \"%s\"", bad[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_usage_and_validation, s_setup),
        cmocka_unit_test_setup(test_help_everywhere, s_setup),
        cmocka_unit_test_setup(test_table_rendering, s_setup),
        cmocka_unit_test_setup(test_lifecycle_rpcs, s_setup),
        cmocka_unit_test_setup(test_json_output_shape, s_setup),
        cmocka_unit_test_setup(test_exec_follows_stream_to_exit_code, s_setup),
        cmocka_unit_test_setup(test_wait_interrupted_by_timeout, s_setup),
        cmocka_unit_test_setup(test_exec_interrupted_by_ctrl_c, s_setup),
        cmocka_unit_test_setup(test_exec_round_trip_latency, s_setup),
        cmocka_unit_test_setup(test_process_and_kill, s_setup),
        cmocka_unit_test_setup(test_upload, s_setup),
        cmocka_unit_test_setup(test_download, s_setup),
        cmocka_unit_test_setup(test_templates_and_apply, s_setup),
        cmocka_unit_test_setup(test_runtime_and_errors, s_setup),
        cmocka_unit_test_setup(test_unreachable_exec_is_known_not_started, s_setup),
        cmocka_unit_test(test_duration_parser),
    };
    int rc = cmocka_run_group_tests(tests, s_fake_start, s_fake_stop);
    free(s_last.out);
    free(s_last.err);
    return rc;
}
