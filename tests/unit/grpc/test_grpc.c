/* Unit tests for kb_grpc (server core + reflection), driven by a gRPC C-core client in-process
 * against kbtest.TestService (tests/integration/grpc/test_service.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "grpc_reflection.h"
#include "grpc_server.h"
#include "kbtest.pb-c.h"
#include "test_service.h"

/* ---------- fixture: server + service + reflection + client channel ---------- */

typedef struct {
    kb_grpc_server_t *srv;
    kbt_service_t *svc;
    kb_grpc_reflection_t *refl;
    grpc_channel *ch;
    grpc_completion_queue *cq; /* pluck queue for the client */
} fx_t;

static int s_setup_with(void **state, size_t max_send)
{
    grpc_init();
    fx_t *f = calloc(1, sizeof *f);
    kb_grpc_options_t o = {.listen_addr = "127.0.0.1:0", .max_send_bytes = max_send};
    f->srv = kb_grpc_server_new(&o);
    f->svc = kbt_service_new();
    f->refl = kb_grpc_reflection_new();
    assert_non_null(f->srv);
    assert_int_equal(kb_grpc_reflection_add_set(f->refl, kb_grpc_protoset, kb_grpc_protoset_len),
                     0);
    assert_int_equal(kbt_service_register(f->svc, f->srv), 0);
    assert_int_equal(kb_grpc_reflection_register(f->refl, f->srv), 0);
    assert_int_equal(kb_grpc_server_start(f->srv), 0);
    assert_true(kb_grpc_server_port(f->srv) > 0);
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", kb_grpc_server_port(f->srv));
    grpc_channel_credentials *cc = grpc_insecure_credentials_create();
    f->ch = grpc_channel_create(target, cc, NULL);
    grpc_channel_credentials_release(cc);
    f->cq = grpc_completion_queue_create_for_pluck(NULL);
    *state = f;
    return 0;
}

static int s_setup(void **state)
{
    return s_setup_with(state, 0);
}

static int s_setup_small_send(void **state)
{
    return s_setup_with(state, 1024);
}

static void s_client_close(fx_t *f)
{
    if (f->ch)
        grpc_channel_destroy(f->ch);
    f->ch = NULL;
    if (f->cq) {
        /* every operation was plucked already: nothing to drain */
        grpc_completion_queue_shutdown(f->cq);
        grpc_completion_queue_destroy(f->cq);
        f->cq = NULL;
    }
}

static int s_teardown(void **state)
{
    fx_t *f = *state;
    s_client_close(f);
    kb_grpc_server_destroy(&f->srv);
    kb_grpc_server_destroy(&f->srv); /* idempotent */
    kbt_service_destroy(&f->svc);
    kb_grpc_reflection_destroy(&f->refl);
    free(f);
    grpc_shutdown();
    return 0;
}

/* ---------- a small C-core client ---------- */

typedef struct {
    grpc_status_code status;
    char details[512];
    ProtobufCMessage *resp;  /* unary: the reply */
    ProtobufCMessage **msgs; /* streaming: every reply */
    size_t n_msgs;
} result_t;

static grpc_byte_buffer *s_pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *b = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return b;
}

static ProtobufCMessage *s_unpack(grpc_byte_buffer *b, const ProtobufCMessageDescriptor *d)
{
    grpc_byte_buffer_reader r;
    grpc_byte_buffer_reader_init(&r, b);
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return m;
}

static void s_wait(grpc_completion_queue *cq, void *tag)
{
    grpc_event ev = grpc_completion_queue_pluck(
        cq, tag, gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(30, GPR_TIMESPAN)),
        NULL);
    assert_int_equal(ev.type, GRPC_OP_COMPLETE);
}

/* One call: sends reqs (raw if raw != NULL), half-closes, reads every reply and the status. */
static void s_call(fx_t *f, const char *method, const ProtobufCMessage **reqs, size_t n_reqs,
                   const grpc_byte_buffer *raw, const ProtobufCMessageDescriptor *rdesc,
                   const grpc_metadata *md, size_t n_md, int timeout_ms, result_t *out)
{
    memset(out, 0, sizeof *out);
    gpr_timespec dl = timeout_ms > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                                                    gpr_time_from_millis(timeout_ms, GPR_TIMESPAN))
                                     : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_slice path = grpc_slice_from_static_string(method);
    grpc_call *c =
        grpc_channel_create_call(f->ch, NULL, GRPC_PROPAGATE_DEFAULTS, f->cq, path, NULL, dl, NULL);
    grpc_metadata_array init_md, trail_md;
    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trail_md);
    grpc_slice details;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = (grpc_metadata *)md;
    ops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[1].data.recv_status_on_client.trailing_metadata = &trail_md;
    ops[1].data.recv_status_on_client.status = &out->status;
    ops[1].data.recv_status_on_client.status_details = &details;
    assert_int_equal(grpc_call_start_batch(c, ops, 2, (void *)1, NULL), GRPC_CALL_OK);
    /* requests, one batch each */
    for (size_t i = 0; i <= n_reqs; i++) {
        memset(ops, 0, sizeof ops);
        grpc_byte_buffer *b = NULL;
        if (raw && i == 0)
            b = grpc_byte_buffer_copy((grpc_byte_buffer *)raw);
        else if (!raw && i < n_reqs)
            b = s_pack(reqs[i]);
        if (!b) {
            ops[0].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        } else {
            ops[0].op = GRPC_OP_SEND_MESSAGE;
            ops[0].data.send_message.send_message = b;
        }
        assert_int_equal(grpc_call_start_batch(c, ops, 1, (void *)2, NULL), GRPC_CALL_OK);
        s_wait(f->cq, (void *)2);
        if (b)
            grpc_byte_buffer_destroy(b);
        else
            break;
    }
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    assert_int_equal(grpc_call_start_batch(c, ops, 1, (void *)3, NULL), GRPC_CALL_OK);
    s_wait(f->cq, (void *)3);
    for (;;) {
        grpc_byte_buffer *b = NULL;
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_RECV_MESSAGE;
        ops[0].data.recv_message.recv_message = &b;
        assert_int_equal(grpc_call_start_batch(c, ops, 1, (void *)4, NULL), GRPC_CALL_OK);
        s_wait(f->cq, (void *)4);
        if (!b)
            break;
        ProtobufCMessage *m = s_unpack(b, rdesc);
        grpc_byte_buffer_destroy(b);
        assert_non_null(m);
        out->msgs = realloc(out->msgs, (out->n_msgs + 1) * sizeof *out->msgs);
        out->msgs[out->n_msgs++] = m;
    }
    out->resp = out->n_msgs ? out->msgs[0] : NULL;
    s_wait(f->cq, (void *)1);
    char *d = grpc_slice_to_c_string(details);
    snprintf(out->details, sizeof out->details, "%s", d);
    gpr_free(d);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trail_md);
    grpc_call_unref(c);
}

static void s_result_free(result_t *r)
{
    for (size_t i = 0; i < r->n_msgs; i++)
        protobuf_c_message_free_unpacked(r->msgs[i], NULL);
    free(r->msgs);
    memset(r, 0, sizeof *r);
}

static void s_unary(fx_t *f, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *rdesc, result_t *out)
{
    s_call(f, method, &req, 1, NULL, rdesc, NULL, 0, 10000, out);
}

/* ---------- tests ---------- */

static void test_unary(void **state)
{
    fx_t *f = *state;
    Kbtest__EchoRequest req = KBTEST__ECHO_REQUEST__INIT;
    req.text = "hello";
    result_t r;
    s_unary(f, "/kbtest.TestService/Echo", &req.base, &kbtest__echo_reply__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    assert_int_equal(r.n_msgs, 1);
    assert_string_equal(((Kbtest__EchoReply *)r.resp)->text, "hello");
    s_result_free(&r);
    /* answered later from the service's worker thread */
    req.text = "later";
    req.delay_ms = 20;
    s_unary(f, "/kbtest.TestService/Echo", &req.base, &kbtest__echo_reply__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    assert_string_equal(((Kbtest__EchoReply *)r.resp)->text, "later");
    s_result_free(&r);
}

static void test_unknown_method(void **state)
{
    fx_t *f = *state;
    Kbtest__Empty req = KBTEST__EMPTY__INIT;
    result_t r;
    s_unary(f, "/kbtest.Missing/Nope", &req.base, &kbtest__empty__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_UNIMPLEMENTED);
    assert_non_null(strstr(r.details, "/kbtest.Missing/Nope"));
    assert_int_equal(r.n_msgs, 0);
    s_result_free(&r);
}

static void test_undecodable_request(void **state)
{
    fx_t *f = *state;
    static const uint8_t bad[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f};
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)bad, sizeof bad);
    grpc_byte_buffer *raw = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    result_t r;
    s_call(f, "/kbtest.TestService/Echo", NULL, 0, raw, &kbtest__echo_reply__descriptor, NULL, 0,
           5000, &r);
    assert_int_equal(r.status, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(r.details, "cannot decode request as kbtest.EchoRequest"));
    s_result_free(&r);
    /* the same for a client stream */
    s_call(f, "/kbtest.TestService/Upload", NULL, 0, raw, &kbtest__upload_reply__descriptor, NULL,
           0, 5000, &r);
    assert_int_equal(r.status, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(r.details, "kbtest.Chunk"));
    s_result_free(&r);
    grpc_byte_buffer_destroy(raw);
    kb_grpc_stats_t st;
    kb_grpc_server_stats(f->srv, &st);
    assert_int_equal(st.bad_requests, 2);
}

static void test_metadata_and_deadline(void **state)
{
    fx_t *f = *state;
    grpc_metadata md[3];
    memset(md, 0, sizeof md);
    md[0].key = grpc_slice_from_static_string("kagent-sandbox-id");
    md[0].value = grpc_slice_from_static_string("s1");
    md[1].key = grpc_slice_from_static_string("x-user-id");
    md[1].value = grpc_slice_from_static_string("alice");
    md[2].key = grpc_slice_from_static_string("kagent-sandbox-id");
    md[2].value = grpc_slice_from_static_string("s2");
    Kbtest__MetaRequest req = KBTEST__META_REQUEST__INIT;
    const ProtobufCMessage *reqs[] = {&req.base};
    result_t r;
    req.key = "x-user-id";
    s_call(f, "/kbtest.TestService/Meta", reqs, 1, NULL, &kbtest__meta_reply__descriptor, md, 3,
           5000, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    Kbtest__MetaReply *m = (Kbtest__MetaReply *)r.resp;
    assert_int_equal(m->n_values, 1);
    assert_string_equal(m->one, "alice");
    assert_int_equal(m->one_error, 0);
    assert_true(m->timeout_ms > 3000 && m->timeout_ms <= 5500);
    s_result_free(&r);

    req.key = "kagent-sandbox-id";
    s_call(f, "/kbtest.TestService/Meta", reqs, 1, NULL, &kbtest__meta_reply__descriptor, md, 3, 0,
           &r);
    m = (Kbtest__MetaReply *)r.resp;
    assert_int_equal(m->n_values, 2);
    assert_string_equal(m->values[0], "s1");
    assert_string_equal(m->values[1], "s2");
    assert_int_equal(m->one_error, -EMLINK);
    assert_int_equal(m->timeout_ms, -1);
    s_result_free(&r);

    req.key = "authorization";
    s_call(f, "/kbtest.TestService/Meta", reqs, 1, NULL, &kbtest__meta_reply__descriptor, md, 3, 0,
           &r);
    m = (Kbtest__MetaReply *)r.resp;
    assert_int_equal(m->n_values, 0);
    assert_int_equal(m->one_error, -ENOENT);
    s_result_free(&r);
}

static void test_deadline_cancels_handler(void **state)
{
    fx_t *f = *state;
    Kbtest__SleepRequest req = KBTEST__SLEEP_REQUEST__INIT;
    req.ms = 10000;
    const ProtobufCMessage *reqs[] = {&req.base};
    result_t r;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s_call(f, "/kbtest.TestService/Sleep", reqs, 1, NULL, &kbtest__empty__descriptor, NULL, 0, 200,
           &r);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(r.status, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_true(t1.tv_sec - t0.tv_sec < 3);
    s_result_free(&r);
    for (int i = 0; i < 200 && kbt_service_handler_cancels(f->svc) < 1; i++)
        usleep(10000);
    assert_int_equal(kbt_service_handler_cancels(f->svc), 1);
}

static void test_server_streaming(void **state)
{
    fx_t *f = *state;
    Kbtest__CountRequest req = KBTEST__COUNT_REQUEST__INIT;
    req.n = 300;
    req.pad_bytes = 10;
    result_t r;
    s_unary(f, "/kbtest.TestService/Count", &req.base, &kbtest__count_reply__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    assert_int_equal(r.n_msgs, 300);
    for (size_t i = 0; i < r.n_msgs; i++)
        assert_int_equal(((Kbtest__CountReply *)r.msgs[i])->seq, (int)i);
    s_result_free(&r);
}

static void test_client_streaming(void **state)
{
    fx_t *f = *state;
    enum { N = 8, SZ = 256 * 1024 };
    static uint8_t data[N][SZ];
    Kbtest__Chunk ch[N];
    const ProtobufCMessage *reqs[N];
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        memset(data[i], 'a' + i, SZ);
        kbtest__chunk__init(&ch[i]);
        ch[i].data.data = data[i];
        ch[i].data.len = SZ;
        reqs[i] = &ch[i].base;
        total += SZ;
    }
    result_t r;
    s_call(f, "/kbtest.TestService/Upload", reqs, N, NULL, &kbtest__upload_reply__descriptor, NULL,
           0, 10000, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    Kbtest__UploadReply *u = (Kbtest__UploadReply *)r.resp;
    assert_int_equal(u->total_bytes, total);
    assert_int_equal(u->chunks, N);
    s_result_free(&r);
}

static void test_message_size_cap(void **state)
{
    fx_t *f = *state;
    size_t n = KB_GRPC_DEFAULT_MAX_RECV + 1;
    char *big = malloc(n + 1);
    memset(big, 'x', n);
    big[n] = '\0';
    Kbtest__EchoRequest req = KBTEST__ECHO_REQUEST__INIT;
    req.text = big;
    result_t r;
    s_unary(f, "/kbtest.TestService/Echo", &req.base, &kbtest__echo_reply__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
    s_result_free(&r);
    free(big);
}

/* A reply over max_send_bytes becomes INTERNAL with a clear message; streams refuse it. */
static void test_send_size_cap(void **state)
{
    fx_t *f = *state;
    char text[2048];
    memset(text, 'y', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    Kbtest__EchoRequest req = KBTEST__ECHO_REQUEST__INIT;
    req.text = text;
    result_t r;
    s_unary(f, "/kbtest.TestService/Echo", &req.base, &kbtest__echo_reply__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_INTERNAL);
    assert_non_null(strstr(r.details, "message size limit"));
    s_result_free(&r);
    Kbtest__CountRequest cr = KBTEST__COUNT_REQUEST__INIT;
    cr.n = 3;
    cr.pad_bytes = 4096; /* each message over the cap: the handler gives up */
    s_unary(f, "/kbtest.TestService/Count", &cr.base, &kbtest__count_reply__descriptor, &r);
    assert_int_not_equal(r.status, GRPC_STATUS_OK);
    assert_int_equal(r.n_msgs, 0);
    s_result_free(&r);
}

static void test_reflection(void **state)
{
    fx_t *f = *state;
    Grpc__Reflection__V1alpha__ServerReflectionRequest q[3];
    for (int i = 0; i < 3; i++)
        grpc__reflection__v1alpha__server_reflection_request__init(&q[i]);
    q[0].message_request_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES;
    q[0].list_services = "";
    q[1].message_request_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
    q[1].file_containing_symbol = "kagent.api.v1.SandboxService";
    q[2].message_request_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME;
    q[2].file_by_filename = "no/such.proto";
    const ProtobufCMessage *reqs[] = {&q[0].base, &q[1].base, &q[2].base};
    result_t r;
    s_call(f, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", reqs, 3, NULL,
           &grpc__reflection__v1alpha__server_reflection_response__descriptor, NULL, 0, 5000, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    assert_int_equal(r.n_msgs, 3);
    Grpc__Reflection__V1alpha__ServerReflectionResponse *a = (void *)r.msgs[0];
    assert_non_null(a->list_services_response);
    bool found = false;
    for (size_t i = 0; i < a->list_services_response->n_service; i++)
        found |= strcmp(a->list_services_response->service[i]->name,
                        "kagent.api.v1.SandboxService") == 0;
    assert_true(found);
    Grpc__Reflection__V1alpha__ServerReflectionResponse *b = (void *)r.msgs[1];
    assert_non_null(b->file_descriptor_response);
    assert_true(b->file_descriptor_response->n_file_descriptor_proto >= 2); /* file + deps */
    Grpc__Reflection__V1alpha__ServerReflectionResponse *c = (void *)r.msgs[2];
    assert_non_null(c->error_response);
    assert_int_equal(c->error_response->error_code, GRPC_STATUS_NOT_FOUND);
    s_result_free(&r);
}

static void test_reflection_index(void **state)
{
    kb_grpc_reflection_t *r = kb_grpc_reflection_new();
    static const uint8_t junk[] = {0x12, 0x03, 'a', 'b', 'c'};
    assert_int_equal(kb_grpc_reflection_add_set(r, junk, sizeof junk), -EBADMSG);
    static const uint8_t truncated[] = {0x0a, 0x40, 0x0a};
    assert_int_equal(kb_grpc_reflection_add_set(r, truncated, sizeof truncated), -EBADMSG);
    assert_int_equal(kb_grpc_reflection_add_set(r, NULL, 0), -EBADMSG);
    assert_int_equal(kb_grpc_reflection_add_file(r, "/nonexistent/x.protoset"), -ENOENT);
    assert_int_equal(kb_grpc_reflection_add_set(r, kb_grpc_protoset, kb_grpc_protoset_len), 0);
    size_t n = kb_grpc_reflection_service_count(r);
    assert_true(n >= 5);
    /* adding the same set again does not duplicate anything */
    assert_int_equal(kb_grpc_reflection_add_set(r, kb_grpc_protoset, kb_grpc_protoset_len), 0);
    assert_int_equal(kb_grpc_reflection_service_count(r), n);
    kb_grpc_reflection_destroy(&r);
    kb_grpc_reflection_destroy(&r);
}

static void s_noop_handler(kb_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    kb_grpc_fail(call, KB_GRPC_INTERNAL, "unused");
}

static void test_method_table(void **state)
{
    kb_grpc_server_t *srv = kb_grpc_server_new(NULL);
    kb_grpc_method_t m[2] = {
        {"/a.B/C", KB_GRPC_UNARY, &kbtest__empty__descriptor, s_noop_handler, NULL, NULL, NULL},
        {"/a.B/C", KB_GRPC_UNARY, &kbtest__empty__descriptor, s_noop_handler, NULL, NULL, NULL},
    };
    assert_int_equal(kb_grpc_server_add_methods(srv, m, 2), -EEXIST);
    assert_int_equal(kb_grpc_server_add_methods(srv, m, 1), 0);
    assert_int_equal(kb_grpc_server_add_methods(srv, m, 1), -EEXIST);
    kb_grpc_method_t bad = {
        "no-slash", KB_GRPC_UNARY, &kbtest__empty__descriptor, s_noop_handler, NULL, NULL, NULL};
    assert_int_equal(kb_grpc_server_add_methods(srv, &bad, 1), -EINVAL);
    kb_grpc_method_t cs = {
        "/a.B/D", KB_GRPC_CLIENT_STREAM, &kbtest__empty__descriptor, s_noop_handler, NULL, NULL,
        NULL}; /* no on_message */
    assert_int_equal(kb_grpc_server_add_methods(srv, &cs, 1), -EINVAL);
    assert_int_equal(kb_grpc_server_start(srv), 0);
    m[1].path = "/a.B/E";
    assert_int_equal(kb_grpc_server_add_methods(srv, &m[1], 1), -EBUSY);
    assert_int_equal(kb_grpc_server_start(srv), -EALREADY);
    kb_grpc_server_destroy(&srv);
    assert_null(srv);
    /* never started */
    srv = kb_grpc_server_new(NULL);
    kb_grpc_server_destroy(&srv);
}

static void test_bind_conflict(void **state)
{
    fx_t *f = *state;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", kb_grpc_server_port(f->srv));
    kb_grpc_options_t o = {.listen_addr = addr};
    kb_grpc_server_t *second = kb_grpc_server_new(&o);
    assert_int_equal(kb_grpc_server_start(second), -EADDRINUSE); /* SO_REUSEPORT is off */
    kb_grpc_server_destroy(&second);
}

/* A connected pair of TCP sockets over loopback (gRPC core wants TCP endpoints). */
static void s_tcp_pair(int sv[2])
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    sv[1] = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(sv[1], (struct sockaddr *)&a, sizeof a), 0);
    sv[0] = accept(l, NULL, NULL);
    assert_true(sv[0] >= 0);
    close(l);
    /* gRPC core drives both ends: its endpoints need non-blocking sockets */
    for (int i = 0; i < 2; i++)
        assert_int_equal(fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK), 0);
}

static void test_add_fd(void **state)
{
    fx_t *f = *state;
    int sv[2];
    s_tcp_pair(sv);
    assert_int_equal(kb_grpc_server_add_fd(f->srv, sv[0]), 0);
    grpc_channel_credentials *cc = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create_from_fd("fd-test", sv[1], cc, NULL);
    grpc_channel_credentials_release(cc);
    grpc_channel *tcp = f->ch;
    f->ch = ch;
    Kbtest__EchoRequest req = KBTEST__ECHO_REQUEST__INIT;
    req.text = "over a socketpair";
    result_t r;
    s_unary(f, "/kbtest.TestService/Echo", &req.base, &kbtest__echo_reply__descriptor, &r);
    assert_int_equal(r.status, GRPC_STATUS_OK);
    assert_string_equal(((Kbtest__EchoReply *)r.resp)->text, "over a socketpair");
    s_result_free(&r);
    grpc_channel_destroy(ch);
    f->ch = tcp;
    assert_int_equal(kb_grpc_server_add_fd(f->srv, -1), -EINVAL);
}

/* Shutdown with calls in flight: every call is cancelled and completed exactly once (ASan
 * checks the "exactly"), and the destroy returns promptly (the handlers would otherwise sleep
 * 30 s). What a remote client sees (UNAVAILABLE "Cancelling all calls") is checked by the
 * integration test with python3-grpcio; this in-process C client does not reliably see the
 * server's final frames, so it cancels its own calls after the destroy. */
enum { SHUT_N = 4 };

typedef struct {
    grpc_completion_queue *cq;
    grpc_call *calls[SHUT_N];
    int got[SHUT_N];
} shut_t;

static void *s_shut_client(void *arg)
{
    shut_t *sh = arg;
    gpr_timespec dl =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(20, GPR_TIMESPAN));
    for (int i = 0; i < SHUT_N; i++)
        sh->got[i] = grpc_completion_queue_pluck(sh->cq, &sh->calls[i], dl, NULL).type;
    return NULL;
}

static void test_shutdown_cancels_inflight(void **state)
{
    fx_t *f = *state;
    shut_t sh = {.cq = f->cq};
    grpc_status_code status[SHUT_N];
    grpc_slice details[SHUT_N];
    grpc_metadata_array trail[SHUT_N];
    Kbtest__SleepRequest req = KBTEST__SLEEP_REQUEST__INIT;
    req.ms = 30000;
    for (int i = 0; i < SHUT_N; i++) {
        sh.calls[i] =
            grpc_channel_create_call(f->ch, NULL, GRPC_PROPAGATE_DEFAULTS, f->cq,
                                     grpc_slice_from_static_string("/kbtest.TestService/Sleep"),
                                     NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        grpc_metadata_array_init(&trail[i]);
        grpc_byte_buffer *b = s_pack(&req.base);
        grpc_op ops[4];
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = b;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[3].data.recv_status_on_client.trailing_metadata = &trail[i];
        ops[3].data.recv_status_on_client.status = &status[i];
        ops[3].data.recv_status_on_client.status_details = &details[i];
        assert_int_equal(grpc_call_start_batch(sh.calls[i], ops, 4, &sh.calls[i], NULL),
                         GRPC_CALL_OK);
        grpc_byte_buffer_destroy(b);
    }
    kb_grpc_stats_t st;
    for (int i = 0; i < 500; i++) {
        kb_grpc_server_stats(f->srv, &st);
        if (st.calls_live == SHUT_N)
            break;
        usleep(10000);
    }
    assert_int_equal(st.calls_live, SHUT_N);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kb_grpc_server_destroy(&f->srv);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 5);
    assert_int_equal(kbt_service_handler_cancels(f->svc), SHUT_N);
    for (int i = 0; i < SHUT_N; i++)
        grpc_call_cancel(sh.calls[i], NULL);
    s_shut_client(&sh);
    for (int i = 0; i < SHUT_N; i++) {
        assert_int_equal(sh.got[i], GRPC_OP_COMPLETE);
        assert_int_not_equal(status[i], GRPC_STATUS_OK);
        grpc_slice_unref(details[i]);
        grpc_metadata_array_destroy(&trail[i]);
        grpc_call_unref(sh.calls[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_method, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_undecodable_request, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_metadata_and_deadline, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_deadline_cancels_handler, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_server_streaming, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_client_streaming, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_message_size_cap, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_send_size_cap, s_setup_small_send, s_teardown),
        cmocka_unit_test_setup_teardown(test_reflection, s_setup, s_teardown),
        cmocka_unit_test(test_reflection_index),
        cmocka_unit_test(test_method_table),
        cmocka_unit_test_setup_teardown(test_bind_conflict, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_add_fd, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_cancels_inflight, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
