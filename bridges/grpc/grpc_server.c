/* kb_grpc: gRPC server on gRPC C core. See grpc_server.h for the contracts.
 *
 * Every call is a state machine driven by completion-queue tags embedded in the call:
 *   t_close  RECV_CLOSE_ON_SERVER, started at call start: tells us about cancellation.
 *   t_recv   RECV_MESSAGE, one at a time.
 *   t_send   SEND_MESSAGE (+ initial metadata the first time), one at a time.
 *   t_status SEND_STATUS_FROM_SERVER (+ initial metadata, + the unary reply message).
 * A call is reference counted: one reference for the handler's hold (or the server's, before a
 * handler runs) and one per batch in flight. The last release frees it. grpc_call_start_batch
 * is serialised by the call mutex; callbacks run without it.
 */
#include "grpc_server.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "krt.h"
#include "metrics.h"

#define LOG_PATH "bridges/grpc"

typedef enum { TAG_NEW, TAG_RECV, TAG_SEND, TAG_STATUS, TAG_CLOSE, TAG_SHUTDOWN } tag_kind_t;

typedef struct {
    tag_kind_t kind;
    kb_grpc_call_t *call;
} s_tag_t;

struct kb_grpc_call {
    kb_grpc_server_t *srv;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    const kb_grpc_method_t *method; /* NULL for unknown methods */
    pthread_mutex_t mu;
    int refs;
    s_tag_t t_new, t_recv, t_send, t_status, t_close;
    grpc_byte_buffer *recv_buf;
    grpc_byte_buffer *send_buf;   /* owned until t_send completes */
    grpc_byte_buffer *status_buf; /* owned until t_status completes */
    int close_cancelled;          /* filled by RECV_CLOSE_ON_SERVER */
    bool md_sent;                 /* initial metadata went out */
    bool status_sent;             /* the status batch was started (by anyone) */
    bool completed;               /* the hold was released by the handler or the server */
    bool cancelled;               /* the call is known to be dead */
    bool send_busy;               /* a t_send batch is in flight */
    bool pending_finish;          /* finish requested while a send was in flight */
    bool end_delivered;           /* on_end was called */
    bool recv_paused;             /* the handler holds the next message back */
    bool recv_parked;             /* ... and a RECV_MESSAGE is due once it resumes */
    bool live;                    /* counted in calls_started */
    kb_grpc_call_t *eos_next;     /* in srv->eos_head while an end of stream is held back */
    int64_t eos_at_ms;            /* when the end of stream arrived */
    kb_grpc_code_t fin_code;
    char *fin_msg;
    kb_grpc_sent_fn sent_cb;
    void *sent_arg;
    kb_grpc_cancel_fn cancel_cb;
    void *cancel_arg;
    ProtobufCMessage *request; /* unary/server-streaming request, freed with the call */
    void *data;
    void (*free_fn)(void *); /* kb_grpc_call_on_free: runs when the call is freed */
    void *free_arg;
    double began; /* ka_metric_now() when the call arrived */
};

struct kb_grpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    kb_grpc_method_t *methods; /* sorted by path */
    size_t n_methods;
    size_t max_recv, max_send;
    char *listen_addr;
    int port;
    bool started;
    pthread_t thread;
    s_tag_t t_shutdown;
    pthread_mutex_t mu; /* guards the fields below */
    bool shutting_down;
    bool shutdown_done;
    uint64_t started_n, completed_n, cancelled_n, unimpl_n, bad_n;
    kb_grpc_call_t *eos_head; /* held-back ends of client streams (server thread only) */
};

/* A client's cancellation surfaces first as a clean end of stream (RECV_MESSAGE succeeds with
 * no message) and only then through RECV_CLOSE_ON_SERVER. An end of stream is therefore held
 * back this long, so that an upload the client cancelled is not mistaken for a complete one. */
#define S_EOS_GRACE_MS 30

static void s_on_call_cancel(kb_grpc_call_t *c);

/* ---------- helpers ---------- */

static int64_t s_now_ms(void)
{
    gpr_timespec t = gpr_now(GPR_CLOCK_MONOTONIC);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int s_method_cmp(const void *a, const void *b)
{
    return strcmp(((const kb_grpc_method_t *)a)->path, ((const kb_grpc_method_t *)b)->path);
}

static const kb_grpc_method_t *s_find_method(kb_grpc_server_t *srv, grpc_slice path)
{
    size_t len = GRPC_SLICE_LENGTH(path);
    const char *p = (const char *)GRPC_SLICE_START_PTR(path);
    size_t lo = 0, hi = srv->n_methods;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *m = srv->methods[mid].path;
        size_t mlen = strlen(m);
        int r = memcmp(m, p, mlen < len ? mlen : len);
        if (r == 0)
            r = (mlen > len) - (mlen < len);
        if (r == 0)
            return &srv->methods[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void s_count(kb_grpc_server_t *srv, uint64_t *counter)
{
    pthread_mutex_lock(&srv->mu);
    (*counter)++;
    pthread_mutex_unlock(&srv->mu);
}

/* Encodes msg into a new byte buffer. 0, -EMSGSIZE, -ENOMEM. */
static int s_encode(const ProtobufCMessage *msg, size_t max, grpc_byte_buffer **out)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    if (n > max)
        return -EMSGSIZE;
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    *out = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return *out ? 0 : -ENOMEM;
}

/* Decodes buf as desc; NULL when the bytes are not a valid message. */
static ProtobufCMessage *s_decode(grpc_byte_buffer *buf, const ProtobufCMessageDescriptor *desc)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, buf))
        return NULL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return m;
}

/* ---------- call lifetime ---------- */

static void s_call_free(kb_grpc_call_t *c)
{
    kb_grpc_server_t *srv = c->srv;
    if (c->recv_buf)
        grpc_byte_buffer_destroy(c->recv_buf);
    if (c->send_buf)
        grpc_byte_buffer_destroy(c->send_buf);
    if (c->status_buf)
        grpc_byte_buffer_destroy(c->status_buf);
    if (c->request)
        protobuf_c_message_free_unpacked(c->request, NULL);
    free(c->fin_msg);
    grpc_metadata_array_destroy(&c->md);
    grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    pthread_mutex_destroy(&c->mu);
    bool live = c->live;
    void (*fn)(void *) = c->free_fn;
    void *arg = c->free_arg;
    free(c);
    if (fn)
        fn(arg);
    if (live)
        s_count(srv, &srv->completed_n);
}

static void s_unref(kb_grpc_call_t *c)
{
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left == 0)
        s_call_free(c);
}

static kb_grpc_call_t *s_call_new(kb_grpc_server_t *srv)
{
    kb_grpc_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->srv = srv;
    pthread_mutex_init(&c->mu, NULL);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    c->t_new = (s_tag_t){TAG_NEW, c};
    c->t_recv = (s_tag_t){TAG_RECV, c};
    c->t_send = (s_tag_t){TAG_SEND, c};
    c->t_status = (s_tag_t){TAG_STATUS, c};
    c->t_close = (s_tag_t){TAG_CLOSE, c};
    c->refs = 1;
    return c;
}

/* Arms the next request_call. Returns 0 or -EIO (server shutting down). */
static int s_request_call(kb_grpc_server_t *srv)
{
    kb_grpc_call_t *c = s_call_new(srv);
    if (!c)
        return -ENOMEM;
    grpc_call_error e = grpc_server_request_call(srv->server, &c->call, &c->details, &c->md,
                                                 srv->cq, srv->cq, &c->t_new);
    if (e != GRPC_CALL_OK) {
        krt_log(KRT_LOG_ERROR, LOG_PATH, "request_call_failed", "error=%d", (int)e);
        grpc_metadata_array_destroy(&c->md);
        grpc_call_details_destroy(&c->details);
        pthread_mutex_destroy(&c->mu);
        free(c);
        return -EIO;
    }
    return 0;
}

/* ---------- batches (call mutex held) ---------- */

/* Starts the status batch. Caller holds c->mu; takes a reference for the batch. */
static void s_status_locked(kb_grpc_call_t *c, kb_grpc_code_t code, const char *message,
                            grpc_byte_buffer *reply)
{
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->md_sent = true;
    }
    if (reply) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = reply;
        n++;
    }
    grpc_slice details = grpc_slice_from_copied_string(message ? message : "");
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = &details;
    n++;
    c->status_sent = true;
    c->status_buf = reply;
    ka_metric_observe(KA_METRIC_GRPC, c->method ? c->method->path : "unknown",
                      kb_grpc_code_name(code), ka_metric_now() - c->began);
    c->refs++;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_status, NULL);
    grpc_slice_unref(details);
    if (e != GRPC_CALL_OK) {
        krt_log(KRT_LOG_WARN, LOG_PATH, "status_batch_failed", "error=%d", (int)e);
        c->refs--;
        c->cancelled = true;
    }
}

/* Starts a RECV_MESSAGE batch. Caller holds c->mu. false if it could not be started (the call
 * is then marked cancelled). */
static bool s_recv_locked(kb_grpc_call_t *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    c->refs++;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_recv, NULL) != GRPC_CALL_OK) {
        c->refs--;
        c->cancelled = true;
        return false;
    }
    return true;
}

static void s_deliver_end(kb_grpc_call_t *c, int status);

void kb_grpc_call_pause_recv(kb_grpc_call_t *call)
{
    pthread_mutex_lock(&call->mu);
    call->recv_paused = true;
    pthread_mutex_unlock(&call->mu);
}

void kb_grpc_call_resume_recv(kb_grpc_call_t *call)
{
    pthread_mutex_lock(&call->mu);
    call->recv_paused = false;
    bool parked = call->recv_parked;
    call->recv_parked = false;
    bool more = parked && !call->completed && !call->status_sent;
    bool broken = more && (call->cancelled || !s_recv_locked(call));
    pthread_mutex_unlock(&call->mu);
    if (broken)
        s_deliver_end(call, -ECANCELED);
}

/* Server-side completion (no handler holds the call): answer and release the hold. */
static void s_server_fail(kb_grpc_call_t *c, kb_grpc_code_t code, const char *message)
{
    pthread_mutex_lock(&c->mu);
    if (!c->status_sent)
        s_status_locked(c, code, message, NULL);
    c->completed = true;
    pthread_mutex_unlock(&c->mu);
    s_unref(c);
}

/* ---------- public completion API ---------- */

static int s_complete(kb_grpc_call_t *c, kb_grpc_code_t code, const char *message,
                      const ProtobufCMessage *reply)
{
    int rc = 0;
    grpc_byte_buffer *buf = NULL;
    if (reply) {
        rc = s_encode(reply, c->srv->max_send, &buf);
        if (rc < 0) {
            krt_log(KRT_LOG_ERROR, LOG_PATH, "reply_encode_failed", "method=%s rc=%d",
                    kb_grpc_call_method(c), rc);
            code = KB_GRPC_INTERNAL;
            message = rc == -EMSGSIZE ? "response exceeds the message size limit"
                                      : "cannot encode response";
        }
    }
    pthread_mutex_lock(&c->mu);
    assert(!c->completed && "kb_grpc call completed twice");
    c->completed = true;
    if (c->status_sent) {
        rc = -ECANCELED;
    } else if (c->send_busy) {
        /* a stream send is in flight: the status follows it (see s_on_send) */
        c->pending_finish = true;
        c->fin_code = code;
        c->fin_msg = strdup(message ? message : "");
    } else {
        s_status_locked(c, code, message, buf);
        buf = NULL;
        if (c->cancelled && rc == 0)
            rc = -ECANCELED;
    }
    pthread_mutex_unlock(&c->mu);
    if (buf)
        grpc_byte_buffer_destroy(buf);
    s_unref(c);
    return rc;
}

int kb_grpc_reply(kb_grpc_call_t *call, const ProtobufCMessage *msg)
{
    kb_grpc_kind_t k = call->method ? call->method->kind : KB_GRPC_UNARY;
    if (!msg || k == KB_GRPC_SERVER_STREAM || k == KB_GRPC_BIDI_STREAM) {
        s_complete(call, KB_GRPC_INTERNAL, "server replied with a wrong message shape", NULL);
        return -EINVAL;
    }
    return s_complete(call, KB_GRPC_OK, NULL, msg);
}

int kb_grpc_fail(kb_grpc_call_t *call, kb_grpc_code_t code, const char *message)
{
    return s_complete(call, code, message, NULL);
}

int kb_grpc_finish(kb_grpc_call_t *call, kb_grpc_code_t code, const char *message)
{
    return s_complete(call, code, message, NULL);
}

int kb_grpc_stream_send(kb_grpc_call_t *c, const ProtobufCMessage *msg, kb_grpc_sent_fn done_cb,
                        void *arg)
{
    kb_grpc_kind_t k = c->method ? c->method->kind : KB_GRPC_UNARY;
    if (!msg || (k != KB_GRPC_SERVER_STREAM && k != KB_GRPC_BIDI_STREAM))
        return -EINVAL;
    grpc_byte_buffer *buf = NULL;
    int rc = s_encode(msg, c->srv->max_send, &buf);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&c->mu);
    if (c->completed || c->status_sent)
        rc = -EINVAL;
    else if (c->cancelled)
        rc = -ECANCELED;
    else if (c->send_busy)
        rc = -EBUSY;
    if (rc < 0) {
        pthread_mutex_unlock(&c->mu);
        grpc_byte_buffer_destroy(buf);
        return rc;
    }
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = buf;
    n++;
    c->send_buf = buf;
    c->send_busy = true;
    c->sent_cb = done_cb;
    c->sent_arg = arg;
    c->refs++;
    if (grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL) != GRPC_CALL_OK) {
        c->refs--;
        c->send_busy = false;
        c->send_buf = NULL;
        c->cancelled = true;
        rc = -ECANCELED;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc < 0)
        grpc_byte_buffer_destroy(buf);
    return rc;
}

/* ---------- accessors ---------- */

const char *kb_grpc_call_method(const kb_grpc_call_t *call)
{
    return call->method ? call->method->path : "?";
}

static bool s_key_eq(grpc_slice k, const char *key)
{
    size_t n = strlen(key);
    return GRPC_SLICE_LENGTH(k) == n && memcmp(GRPC_SLICE_START_PTR(k), key, n) == 0;
}

size_t kb_grpc_call_metadata_count(const kb_grpc_call_t *call, const char *key)
{
    size_t n = 0;
    for (size_t i = 0; i < call->md.count; i++)
        if (s_key_eq(call->md.metadata[i].key, key))
            n++;
    return n;
}

int kb_grpc_call_metadata_at(const kb_grpc_call_t *call, const char *key, size_t idx,
                             const char **value, size_t *len)
{
    for (size_t i = 0; i < call->md.count; i++) {
        if (!s_key_eq(call->md.metadata[i].key, key))
            continue;
        if (idx-- == 0) {
            *value = (const char *)GRPC_SLICE_START_PTR(call->md.metadata[i].value);
            *len = GRPC_SLICE_LENGTH(call->md.metadata[i].value);
            return 0;
        }
    }
    return -ENOENT;
}

int kb_grpc_call_metadata_one(const kb_grpc_call_t *call, const char *key, char **out)
{
    *out = NULL;
    size_t n = kb_grpc_call_metadata_count(call, key);
    if (n == 0)
        return -ENOENT;
    if (n > 1)
        return -EMLINK;
    const char *v = NULL;
    size_t len = 0;
    if (kb_grpc_call_metadata_at(call, key, 0, &v, &len) < 0)
        return -ENOENT;
    if (memchr(v, 0, len))
        return -EINVAL;
    *out = strndup(v, len);
    return *out ? 0 : -ENOMEM;
}

int64_t kb_grpc_call_timeout_ms(const kb_grpc_call_t *call)
{
    gpr_timespec d = call->details.deadline;
    if (gpr_time_cmp(d, gpr_inf_future(d.clock_type)) == 0)
        return -1;
    gpr_timespec now = gpr_now(d.clock_type);
    if (gpr_time_cmp(d, now) <= 0)
        return 0;
    return gpr_time_to_millis(gpr_time_sub(d, now));
}

char *kb_grpc_call_peer(const kb_grpc_call_t *call)
{
    char *p = grpc_call_get_peer(call->call);
    char *r = p ? strdup(p) : NULL;
    gpr_free(p);
    return r;
}

void kb_grpc_call_set_data(kb_grpc_call_t *call, void *data)
{
    call->data = data;
}

void *kb_grpc_call_data(const kb_grpc_call_t *call)
{
    return call->data;
}

void kb_grpc_call_on_free(kb_grpc_call_t *call, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&call->mu);
    call->free_fn = fn;
    call->free_arg = arg;
    pthread_mutex_unlock(&call->mu);
}

void kb_grpc_call_ref(kb_grpc_call_t *call)
{
    pthread_mutex_lock(&call->mu);
    call->refs++;
    pthread_mutex_unlock(&call->mu);
}

void kb_grpc_call_unref(kb_grpc_call_t *call)
{
    s_unref(call);
}

int kb_grpc_call_on_cancel(kb_grpc_call_t *c, kb_grpc_cancel_fn fn, void *arg)
{
    pthread_mutex_lock(&c->mu);
    int rc = 0;
    if (c->cancelled) {
        rc = -ECANCELED;
    } else {
        c->cancel_cb = fn;
        c->cancel_arg = arg;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

bool kb_grpc_call_is_cancelled(kb_grpc_call_t *c)
{
    pthread_mutex_lock(&c->mu);
    bool r = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return r;
}

const char *kb_grpc_code_name(kb_grpc_code_t code)
{
    return ka_metric_code_name((int)code); /* the status codes are gRPC's */
}

/* ---------- completion handlers (server thread) ---------- */

/* Delivers on_end once, if the handler still holds the call. */
static void s_deliver_end(kb_grpc_call_t *c, int status)
{
    pthread_mutex_lock(&c->mu);
    bool deliver = !c->completed && !c->end_delivered && c->method && c->method->on_end;
    c->end_delivered = true;
    pthread_mutex_unlock(&c->mu);
    if (deliver)
        c->method->on_end(c, status, c->method->user);
}

static void s_on_new(kb_grpc_server_t *srv, kb_grpc_call_t *c, bool ok)
{
    pthread_mutex_lock(&srv->mu);
    bool shutting = srv->shutting_down;
    pthread_mutex_unlock(&srv->mu);
    if (!ok) { /* server shutting down: this request_call never got a call */
        s_unref(c);
        return;
    }
    if (!shutting)
        s_request_call(srv);
    c->live = true;
    c->began = ka_metric_now();
    s_count(srv, &srv->started_n);

    pthread_mutex_lock(&c->mu);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->refs++;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) {
        c->refs--;
        c->cancelled = true;
    }
    c->method = s_find_method(srv, c->details.method);
    pthread_mutex_unlock(&c->mu);

    if (!c->method) {
        char *path = grpc_slice_to_c_string(c->details.method);
        char msg[512];
        snprintf(msg, sizeof msg, "unknown method %.400s", path);
        krt_log(KRT_LOG_INFO, LOG_PATH, "unimplemented", "method=%.400s", path);
        gpr_free(path);
        s_count(srv, &srv->unimpl_n);
        s_server_fail(c, KB_GRPC_UNIMPLEMENTED, msg);
        return;
    }
    pthread_mutex_lock(&c->mu);
    bool reading = s_recv_locked(c);
    pthread_mutex_unlock(&c->mu);
    kb_grpc_kind_t k = c->method->kind;
    if (k == KB_GRPC_CLIENT_STREAM || k == KB_GRPC_BIDI_STREAM) {
        c->method->handler(c, NULL, c->method->user); /* the hold passes to the handler */
        if (!reading)
            s_deliver_end(c, -ECANCELED);
    } else if (!reading) {
        s_server_fail(c, KB_GRPC_CANCELLED, "call cancelled before the request arrived");
    }
}

static void s_on_recv(kb_grpc_server_t *srv, kb_grpc_call_t *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    grpc_byte_buffer *buf = c->recv_buf;
    c->recv_buf = NULL;
    bool done = c->completed || c->status_sent;
    pthread_mutex_unlock(&c->mu);
    const kb_grpc_method_t *m = c->method;
    bool streaming = m->kind == KB_GRPC_CLIENT_STREAM || m->kind == KB_GRPC_BIDI_STREAM;

    if (done) {
        /* answered already: drop whatever arrived */
    } else if (!ok) {
        if (streaming)
            s_deliver_end(c, -ECANCELED);
        else
            s_server_fail(c, KB_GRPC_CANCELLED, "call cancelled before the request arrived");
    } else if (!buf) {
        if (streaming) {
            /* hold it back (see S_EOS_GRACE_MS); the list keeps a reference */
            pthread_mutex_lock(&c->mu);
            c->refs++;
            pthread_mutex_unlock(&c->mu);
            c->eos_at_ms = s_now_ms();
            c->eos_next = srv->eos_head;
            srv->eos_head = c;
        } else
            s_server_fail(c, KB_GRPC_INVALID_ARGUMENT, "request message missing");
    } else {
        ProtobufCMessage *msg = s_decode(buf, m->request);
        if (!msg) {
            char text[256];
            snprintf(text, sizeof text, "cannot decode request as %s (%zu bytes)", m->request->name,
                     grpc_byte_buffer_length(buf));
            krt_log(KRT_LOG_INFO, LOG_PATH, "bad_request", "method=%s type=%s", m->path,
                    m->request->name);
            s_count(srv, &srv->bad_n);
            if (streaming) {
                pthread_mutex_lock(&c->mu);
                if (!c->status_sent)
                    s_status_locked(c, KB_GRPC_INVALID_ARGUMENT, text, NULL);
                pthread_mutex_unlock(&c->mu);
                s_deliver_end(c, -EBADMSG);
            } else {
                s_server_fail(c, KB_GRPC_INVALID_ARGUMENT, text);
            }
        } else if (streaming) {
            m->on_message(c, msg, m->user);
            pthread_mutex_lock(&c->mu);
            bool more = !c->completed && !c->status_sent;
            if (more && c->recv_paused && !c->cancelled) { /* kb_grpc_call_resume_recv reads on */
                c->recv_parked = true;
                more = false;
            }
            bool broken = more && (c->cancelled || !s_recv_locked(c));
            pthread_mutex_unlock(&c->mu);
            if (broken) /* the stream will not deliver more: tell the handler */
                s_deliver_end(c, -ECANCELED);
        } else {
            c->request = msg;
            m->handler(c, msg, m->user); /* the hold passes to the handler */
        }
    }
    if (buf)
        grpc_byte_buffer_destroy(buf);
    s_unref(c);
}

static void s_on_send(kb_grpc_call_t *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    c->send_busy = false;
    if (c->send_buf) {
        grpc_byte_buffer_destroy(c->send_buf);
        c->send_buf = NULL;
    }
    if (!ok)
        c->cancelled = true;
    kb_grpc_sent_fn cb = c->sent_cb;
    void *arg = c->sent_arg;
    c->sent_cb = NULL;
    pthread_mutex_unlock(&c->mu);
    if (cb)
        cb(c, ok ? 0 : -ECANCELED, arg);
    pthread_mutex_lock(&c->mu);
    if (c->pending_finish && !c->send_busy && !c->status_sent) {
        c->pending_finish = false;
        s_status_locked(c, c->fin_code, c->fin_msg, NULL);
    }
    pthread_mutex_unlock(&c->mu);
    s_unref(c);
}

static void s_on_status(kb_grpc_call_t *c, bool ok)
{
    pthread_mutex_lock(&c->mu);
    if (c->status_buf) {
        grpc_byte_buffer_destroy(c->status_buf);
        c->status_buf = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    s_unref(c);
}

/* The client cancelled or the deadline passed: tell the handler once. */
static void s_on_call_cancel(kb_grpc_call_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->cancelled = true;
    kb_grpc_cancel_fn cb = c->completed ? NULL : c->cancel_cb;
    void *arg = c->cancel_arg;
    c->cancel_cb = NULL;
    pthread_mutex_unlock(&c->mu);
    s_count(c->srv, &c->srv->cancelled_n);
    if (cb)
        cb(c, arg);
}

static void s_on_close(kb_grpc_call_t *c, bool ok)
{
    if (!ok || c->close_cancelled)
        s_on_call_cancel(c);
    s_unref(c);
}

/* Delivers held-back ends of stream: -ECANCELED as soon as the call is known cancelled, 0 once
 * the grace period passed. Returns the milliseconds until the next one is due (or 100). */
static int64_t s_flush_eos(kb_grpc_server_t *srv)
{
    int64_t now = s_now_ms(), next = 100;
    kb_grpc_call_t **pp = &srv->eos_head;
    while (*pp) {
        kb_grpc_call_t *c = *pp;
        bool cancelled = kb_grpc_call_is_cancelled(c);
        int64_t due = c->eos_at_ms + S_EOS_GRACE_MS - now;
        if (!cancelled && due > 0) {
            if (due < next)
                next = due;
            pp = &c->eos_next;
            continue;
        }
        *pp = c->eos_next;
        s_deliver_end(c, cancelled ? -ECANCELED : 0);
        s_unref(c);
    }
    return next;
}

static uint64_t s_live(kb_grpc_server_t *srv)
{
    pthread_mutex_lock(&srv->mu);
    uint64_t n = srv->started_n - srv->completed_n;
    pthread_mutex_unlock(&srv->mu);
    return n;
}

static void *s_thread(void *arg)
{
    kb_grpc_server_t *srv = arg;
    int64_t waited_ms = 0;
    bool cq_shut = false;
    int64_t wait_ms = 100;
    for (;;) {
        gpr_timespec dl =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(srv->cq, dl, NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            s_tag_t *t = ev.tag;
            switch (t->kind) {
            case TAG_NEW:
                s_on_new(srv, t->call, ev.success);
                break;
            case TAG_RECV:
                s_on_recv(srv, t->call, ev.success);
                break;
            case TAG_SEND:
                s_on_send(t->call, ev.success);
                break;
            case TAG_STATUS:
                s_on_status(t->call, ev.success);
                break;
            case TAG_CLOSE:
                s_on_close(t->call, ev.success);
                break;
            case TAG_SHUTDOWN:
                pthread_mutex_lock(&srv->mu);
                srv->shutdown_done = true;
                pthread_mutex_unlock(&srv->mu);
                break;
            }
        } else if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        wait_ms = srv->eos_head ? s_flush_eos(srv) : 100;
        pthread_mutex_lock(&srv->mu);
        bool stop = srv->shutdown_done;
        pthread_mutex_unlock(&srv->mu);
        if (stop && !cq_shut) {
            if (s_live(srv) == 0) {
                grpc_completion_queue_shutdown(srv->cq);
                cq_shut = true;
            } else if (ev.type == GRPC_QUEUE_TIMEOUT && (waited_ms += 100) % 5000 == 0) {
                krt_log(KRT_LOG_WARN, LOG_PATH, "shutdown_waiting",
                        "live_calls=%llu hint=\"handlers have not completed their calls\"",
                        (unsigned long long)s_live(srv));
            }
        }
    }
    return NULL;
}

/* ---------- server ---------- */

kb_grpc_server_t *kb_grpc_server_new(const kb_grpc_options_t *opts)
{
    kb_grpc_server_t *srv = calloc(1, sizeof *srv);
    if (!srv)
        return NULL;
    srv->max_recv = opts && opts->max_recv_bytes ? opts->max_recv_bytes : KB_GRPC_DEFAULT_MAX_RECV;
    srv->max_send = opts && opts->max_send_bytes ? opts->max_send_bytes : KB_GRPC_DEFAULT_MAX_SEND;
    if (opts && opts->listen_addr) {
        srv->listen_addr = strdup(opts->listen_addr);
        if (!srv->listen_addr) {
            free(srv);
            return NULL;
        }
    }
    pthread_mutex_init(&srv->mu, NULL);
    srv->t_shutdown = (s_tag_t){TAG_SHUTDOWN, NULL};
    grpc_init();
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[0].value.integer = 0;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[1].value.integer = srv->max_recv > INT32_MAX ? INT32_MAX : (int)srv->max_recv;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[2].value.integer = srv->max_send > INT32_MAX ? INT32_MAX : (int)srv->max_send;
    grpc_channel_args cargs = {3, args};
    srv->server = grpc_server_create(&cargs, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    return srv;
}

int kb_grpc_server_add_methods(kb_grpc_server_t *srv, const kb_grpc_method_t *methods, size_t n)
{
    if (srv->started)
        return -EBUSY;
    for (size_t i = 0; i < n; i++) {
        const kb_grpc_method_t *m = &methods[i];
        if (!m->path || m->path[0] != '/' || !m->request || !m->handler)
            return -EINVAL;
        if ((m->kind == KB_GRPC_CLIENT_STREAM || m->kind == KB_GRPC_BIDI_STREAM) &&
            (!m->on_message || !m->on_end))
            return -EINVAL;
        for (size_t j = 0; j < srv->n_methods; j++)
            if (strcmp(srv->methods[j].path, m->path) == 0)
                return -EEXIST;
        for (size_t j = 0; j < i; j++)
            if (strcmp(methods[j].path, m->path) == 0)
                return -EEXIST;
    }
    kb_grpc_method_t *t = realloc(srv->methods, (srv->n_methods + n) * sizeof *t);
    if (!t)
        return -ENOMEM;
    memcpy(t + srv->n_methods, methods, n * sizeof *t);
    srv->methods = t;
    srv->n_methods += n;
    qsort(srv->methods, srv->n_methods, sizeof *t, s_method_cmp);
    return 0;
}

int kb_grpc_server_start(kb_grpc_server_t *srv)
{
    if (srv->started)
        return -EALREADY;
    if (srv->listen_addr) {
        grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
        srv->port = grpc_server_add_http2_port(srv->server, srv->listen_addr, creds);
        grpc_server_credentials_release(creds);
        if (srv->port == 0) {
            krt_log(KRT_LOG_ERROR, LOG_PATH, "bind_failed",
                    "addr=%s error=\"cannot bind (address in use or invalid)\"", srv->listen_addr);
            return -EADDRINUSE;
        }
    }
    grpc_server_start(srv->server);
    srv->started = true;
    int rc = s_request_call(srv);
    if (rc == 0 && pthread_create(&srv->thread, NULL, s_thread, srv) != 0)
        rc = -EAGAIN;
    if (rc < 0) {
        srv->started = false; /* destroy will still shut the core server down */
        srv->port = 0;
        return rc;
    }
    krt_log(KRT_LOG_INFO, LOG_PATH, "started", "methods=%zu addr=%s port=%d", srv->n_methods,
            srv->listen_addr ? srv->listen_addr : "-", srv->port);
    return 0;
}

int kb_grpc_server_port(const kb_grpc_server_t *srv)
{
    return srv->port;
}

int kb_grpc_server_add_fd(kb_grpc_server_t *srv, int fd)
{
    pthread_mutex_lock(&srv->mu);
    bool ok = srv->started && !srv->shutting_down;
    pthread_mutex_unlock(&srv->mu);
    if (!ok || fd < 0) {
        if (fd >= 0)
            close(fd);
        return -EINVAL;
    }
    /* gRPC core's endpoints assume non-blocking sockets: a blocking one can stall its poller */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK))
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    grpc_server_add_channel_from_fd(srv->server, fd, creds);
    grpc_server_credentials_release(creds);
    return 0;
}

void kb_grpc_server_stats(kb_grpc_server_t *srv, kb_grpc_stats_t *out)
{
    pthread_mutex_lock(&srv->mu);
    out->calls_started = srv->started_n;
    out->calls_completed = srv->completed_n;
    out->calls_cancelled = srv->cancelled_n;
    out->unimplemented = srv->unimpl_n;
    out->bad_requests = srv->bad_n;
    out->calls_live = srv->started_n - srv->completed_n;
    pthread_mutex_unlock(&srv->mu);
}

void kb_grpc_server_destroy(kb_grpc_server_t **srv_p)
{
    kb_grpc_server_t *srv = srv_p ? *srv_p : NULL;
    if (!srv)
        return;
    *srv_p = NULL;
    pthread_mutex_lock(&srv->mu);
    srv->shutting_down = true;
    pthread_mutex_unlock(&srv->mu);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->t_shutdown);
    grpc_server_cancel_all_calls(srv->server);
    if (srv->started) {
        pthread_join(srv->thread, NULL);
    } else {
        /* never started (or failed to): drain here */
        bool shut = false;
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(
                srv->cq,
                gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN)),
                NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
            if (ev.type == GRPC_OP_COMPLETE) {
                s_tag_t *t = ev.tag;
                if (t->kind == TAG_SHUTDOWN) {
                    shut = true;
                    grpc_completion_queue_shutdown(srv->cq);
                } else if (t->kind == TAG_NEW) {
                    s_unref(t->call);
                }
            } else if (shut) {
                grpc_completion_queue_shutdown(srv->cq);
            }
        }
    }
    grpc_server_destroy(srv->server);
    grpc_completion_queue_destroy(srv->cq);
    grpc_shutdown();
    krt_log(KRT_LOG_INFO, LOG_PATH, "stopped", "calls=%llu cancelled=%llu",
            (unsigned long long)srv->started_n, (unsigned long long)srv->cancelled_n);
    pthread_mutex_destroy(&srv->mu);
    free(srv->methods);
    free(srv->listen_addr);
    free(srv);
}
