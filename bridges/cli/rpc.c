/*
 * kb_rpc: synchronous gRPC C core client calls for the CLI. See rpc.h.
 */
#include "rpc.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#define S_MAX_RECV   (80 * 1024 * 1024) /* above the 64 MiB transfer cap; tree JSON can be big */
#define S_POLL_MS    100                /* how often a blocked call looks at the interrupt flag */
#define S_MAX_MD     3
#define S_TARGET_CAP 512

static volatile sig_atomic_t s_interrupted;

struct kb_rpc {
    grpc_channel *channel;
    grpc_completion_queue *cq; /* pluck queue shared by this client's (sequential) calls */
    gpr_timespec deadline;     /* absolute, monotonic; inf_future when no --timeout */
    char *user_id;
    char *auth;   /* "Bearer <token>" or NULL */
    char *target; /* host:port */
    FILE *trace;  /* borrowed; NULL = no tracing */
};

struct kb_rpc_call {
    kb_rpc_t *rpc;
    grpc_call *call;
    grpc_metadata md[S_MAX_MD];
    size_t n_md;
    /* Status batch, started with the call and plucked by finish. */
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code status;
    grpc_slice details;
    bool status_started;
    bool status_done;
    bool failed;      /* a batch failed: the call is over, the status says why */
    bool half_closed; /* SEND_CLOSE_FROM_CLIENT done (server streams: with the request) */
    char method[128]; /* for tracing */
    gpr_timespec started;
    int tag_status; /* tag storage: addresses only */
    int tag_op;
};

/* ------------------------------------------------------------------------------------------ */

void kb_rpc_interrupt(void)
{
    s_interrupted = 1;
}

void kb_rpc_reset_interrupt(void)
{
    s_interrupted = 0;
}

const char *kb_rpc_code_name(int code)
{
    static const char *const names[] = {
        "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
        "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
        "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
        "DataLoss", "Unauthenticated"};
    if (code >= 0 && code < (int)(sizeof names / sizeof names[0]))
        return names[code];
    return "Unknown";
}

void kb_rpc_format_error(const kb_rpc_status_t *st, char *buf, size_t cap)
{
    snprintf(buf, cap, "rpc error: code = %s desc = %s", kb_rpc_code_name(st->code), st->message);
}

bool kb_rpc_outcome_unknown(const kb_rpc_status_t *st)
{
    switch (st->code) {
    case GRPC_STATUS_UNAVAILABLE:
    case GRPC_STATUS_DEADLINE_EXCEEDED:
    case GRPC_STATUS_CANCELLED:
    case GRPC_STATUS_UNKNOWN:
    case GRPC_STATUS_INTERNAL:
    case GRPC_STATUS_DATA_LOSS:
        return true;
    default:
        return false;
    }
}

static void s_status(kb_rpc_status_t *st, int code, const char *msg)
{
    if (!st)
        return;
    st->code = code;
    snprintf(st->message, sizeof st->message, "%s", msg);
}

/* ------------------------------------------------------------------------------------------ */
/* Client                                                                                     */

static char *s_read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* Splits "http[s]://host:port[/...]" into target "host:port" (default port 80/443). */
static int s_parse_url(const char *url, char *target, size_t cap, bool *tls)
{
    const char *rest;
    if (strncmp(url, "http://", 7) == 0) {
        rest = url + 7;
        *tls = false;
    } else if (strncmp(url, "https://", 8) == 0) {
        rest = url + 8;
        *tls = true;
    } else {
        return -EINVAL;
    }
    size_t n = strcspn(rest, "/?#");
    if (n == 0 || n >= cap - 8)
        return -EINVAL;
    memcpy(target, rest, n);
    target[n] = '\0';
    /* A port is present unless the authority ends in a host (or a bracketed IPv6 host). */
    const char *colon = strrchr(target, ':');
    const char *bracket = strrchr(target, ']');
    if (!colon || (bracket && bracket > colon))
        snprintf(target + n, cap - n, ":%d", *tls ? 443 : 80);
    return 0;
}

static bool s_set(const char *s)
{
    return s && *s;
}

/* Reads one PEM file named by a flag into *out (caller frees). 0, or -1 with err set. */
static int s_read_flag(const char *flag, const char *path, char **out, char *err, size_t cap)
{
    *out = s_read_file(path);
    if (*out)
        return 0;
    snprintf(err, cap, "read --%s %s: %s", flag, path, strerror(errno));
    return -1;
}

/* The channel's credentials: TLS (roots from --ca-file or the system, a client certificate
 * from --cert-file/--key-file) for https://, insecure for http://. NULL with err set. */
static grpc_channel_credentials *s_creds(const kb_rpc_opts_t *o, bool tls, char *err, size_t cap)
{
    bool pair = s_set(o->cert_file) || s_set(o->key_file);
    if (!tls && (pair || s_set(o->ca_file))) {
        snprintf(err, cap, "--ca-file, --cert-file and --key-file need an https:// --api-url");
        return NULL;
    }
    if (!tls)
        return grpc_insecure_credentials_create();
    if (pair && !(s_set(o->cert_file) && s_set(o->key_file))) {
        snprintf(err, cap, "--cert-file and --key-file go together");
        return NULL;
    }
    char *roots = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if ((!s_set(o->ca_file) || !s_read_flag("ca-file", o->ca_file, &roots, err, cap)) &&
        (!pair || (!s_read_flag("cert-file", o->cert_file, &cert, err, cap) &&
                   !s_read_flag("key-file", o->key_file, &key, err, cap)))) {
        grpc_ssl_pem_key_cert_pair kp = {.private_key = key, .cert_chain = cert};
        creds = grpc_ssl_credentials_create(roots, pair ? &kp : NULL, NULL, NULL);
        if (!creds)
            snprintf(err, cap, "cannot create TLS credentials");
    }
    free(roots);
    free(cert);
    if (key) {
        explicit_bzero(key, strlen(key));
        free(key);
    }
    return creds;
}

kb_rpc_t *kb_rpc_new(const kb_rpc_opts_t *o, char *err, size_t errcap)
{
    char target[S_TARGET_CAP];
    bool tls = false;
    if (!o->api_url || s_parse_url(o->api_url, target, sizeof target, &tls) != 0) {
        snprintf(err, errcap,
                 "invalid --api-url \"%s\": want http://HOST:PORT or https://HOST:PORT",
                 o->api_url ? o->api_url : "");
        return NULL;
    }
    kb_rpc_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    self->target = strdup(target);
    self->user_id = strdup(o->user_id ? o->user_id : "");
    if (o->token && *o->token && asprintf(&self->auth, "Bearer %s", o->token) < 0)
        self->auth = NULL;
    grpc_channel_credentials *creds = s_creds(o, tls, err, errcap);
    if (!creds) {
        kb_rpc_destroy(&self);
        return NULL;
    }
    grpc_arg args[2];
    size_t nargs = 0;
    args[nargs].type = GRPC_ARG_INTEGER;
    args[nargs].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[nargs].value.integer = S_MAX_RECV;
    nargs++;
    if (tls && o->server_name && *o->server_name) {
        args[nargs].type = GRPC_ARG_STRING;
        args[nargs].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[nargs].value.string = (char *)o->server_name;
        nargs++;
    }
    grpc_channel_args cargs = {.num_args = nargs, .args = args};
    self->channel = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    self->cq = grpc_completion_queue_create_for_pluck(NULL);
    self->trace = o->trace;
    if (o->timeout_ms > 0)
        self->deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                      gpr_time_from_millis(o->timeout_ms, GPR_TIMESPAN));
    else
        self->deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    if (!self->target || !self->user_id || !self->channel || !self->cq) {
        snprintf(err, errcap, "cannot create a gRPC channel to %s", target);
        kb_rpc_destroy(&self);
        return NULL;
    }
    return self;
}

void kb_rpc_destroy(kb_rpc_t **p)
{
    kb_rpc_t *self = *p;
    if (!self)
        return;
    if (self->channel)
        grpc_channel_destroy(self->channel);
    if (self->cq) {
        grpc_completion_queue_shutdown(self->cq);
        grpc_completion_queue_destroy(self->cq);
    }
    free(self->user_id);
    free(self->auth);
    free(self->target);
    free(self);
    *p = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Calls                                                                                      */

/* Waits for tag, cancelling the call when interrupted. Returns the event's success flag. */
static bool s_wait(kb_rpc_call_t *c, void *tag)
{
    bool cancelled = false;
    for (;;) {
        if (s_interrupted && !cancelled) {
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_CANCELLED, "interrupted", NULL);
            cancelled = true;
        }
        gpr_timespec t = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                      gpr_time_from_millis(S_POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_pluck(c->rpc->cq, tag, t, NULL);
        if (ev.type == GRPC_OP_COMPLETE)
            return ev.success != 0;
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return false;
    }
}

static grpc_byte_buffer *s_pack(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* Unpacks and destroys bb. NULL if it does not parse as desc. */
static ProtobufCMessage *s_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc)
{
    grpc_byte_buffer_reader r;
    ProtobufCMessage *m = NULL;
    if (grpc_byte_buffer_reader_init(&r, bb)) {
        grpc_slice s = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
        m = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_destroy(bb);
    return m;
}

static void s_add_md(kb_rpc_call_t *c, const char *key, const char *value)
{
    grpc_metadata *m = &c->md[c->n_md++];
    memset(m, 0, sizeof *m);
    m->key = grpc_slice_from_static_string(key);
    m->value = grpc_slice_from_copied_string(value);
}

/* Creates the call, starts SEND_INITIAL_METADATA (+ request and half-close when req is
 * non-NULL) and the status batch. NULL on failure (st set). */
static kb_rpc_call_t *s_start(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                              const ProtobufCMessage *req, kb_rpc_status_t *st)
{
    kb_rpc_call_t *c = calloc(1, sizeof *c);
    if (!c) {
        s_status(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->rpc = rpc;
    c->details = grpc_empty_slice();
    snprintf(c->method, sizeof c->method, "%s", method);
    c->started = gpr_now(GPR_CLOCK_MONOTONIC);
    grpc_metadata_array_init(&c->initial_md);
    grpc_metadata_array_init(&c->trailing_md);
    if (rpc->user_id[0])
        s_add_md(c, "x-user-id", rpc->user_id);
    if (rpc->auth)
        s_add_md(c, "authorization", rpc->auth);
    if (sandbox_id)
        s_add_md(c, "kagent-sandbox-id", sandbox_id);
    grpc_slice m = grpc_slice_from_copied_string(method);
    c->call = grpc_channel_create_call(rpc->channel, NULL, GRPC_PROPAGATE_DEFAULTS, rpc->cq, m,
                                       NULL, rpc->deadline, NULL);
    grpc_slice_unref(m);
    if (!c->call) {
        s_status(st, GRPC_STATUS_INTERNAL, "cannot create call");
        kb_rpc_call_destroy(&c);
        return NULL;
    }
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = c->n_md;
    ops[n].data.send_initial_metadata.metadata = c->md;
    n++;
    grpc_byte_buffer *bb = NULL;
    if (req) {
        bb = s_pack(req);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        n++;
        ops[n].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        n++;
        c->half_closed = true;
    }
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->tag_op, NULL);
    bool ok = e == GRPC_CALL_OK && s_wait(c, &c->tag_op);
    if (bb)
        grpc_byte_buffer_destroy(bb);
    if (e != GRPC_CALL_OK) {
        s_status(st, GRPC_STATUS_INTERNAL, "cannot start call");
        kb_rpc_call_destroy(&c);
        return NULL;
    }
    grpc_op sops[2];
    memset(sops, 0, sizeof sops);
    sops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    sops[0].data.recv_initial_metadata.recv_initial_metadata = &c->initial_md;
    sops[1].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sops[1].data.recv_status_on_client.trailing_metadata = &c->trailing_md;
    sops[1].data.recv_status_on_client.status = &c->status;
    sops[1].data.recv_status_on_client.status_details = &c->details;
    if (grpc_call_start_batch(c->call, sops, 2, &c->tag_status, NULL) != GRPC_CALL_OK) {
        s_status(st, GRPC_STATUS_INTERNAL, "cannot start call");
        kb_rpc_call_destroy(&c);
        return NULL;
    }
    c->status_started = true;
    if (!ok)
        c->failed = true; /* the status batch will say why */
    return c;
}

/* Plucks the status batch (once) and copies it to st. */
static int s_collect_status(kb_rpc_call_t *c, kb_rpc_status_t *st)
{
    if (c->status_started && !c->status_done) {
        s_wait(c, &c->tag_status);
        c->status_done = true;
    }
    char *d = grpc_slice_to_c_string(c->details);
    int code = c->status_done ? (int)c->status : GRPC_STATUS_INTERNAL;
    if (code == GRPC_STATUS_CANCELLED && s_interrupted)
        s_status(st, code, "interrupted");
    else if (code == GRPC_STATUS_DEADLINE_EXCEEDED && (!d || !*d))
        s_status(st, code, "context deadline exceeded");
    else
        s_status(st, code, d ? d : "");
    gpr_free(d);
    if (c->rpc->trace) {
        gpr_timespec el = gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), c->started);
        fprintf(c->rpc->trace, "grpc %s %s -> %s (%.1f ms)\n", c->rpc->target, c->method,
                kb_rpc_code_name(code), (double)gpr_time_to_millis(el));
    }
    return code == GRPC_STATUS_OK ? 0 : -EIO;
}

kb_rpc_call_t *kb_rpc_server_stream(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                                    const ProtobufCMessage *req, kb_rpc_status_t *st)
{
    return s_start(rpc, method, sandbox_id, req, st);
}

kb_rpc_call_t *kb_rpc_client_stream(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                                    kb_rpc_status_t *st)
{
    return s_start(rpc, method, sandbox_id, NULL, st);
}

int kb_rpc_call_read(kb_rpc_call_t *c, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **msg)
{
    *msg = NULL;
    if (c->failed)
        return -EIO;
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_op, NULL) != GRPC_CALL_OK ||
        !s_wait(c, &c->tag_op)) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        c->failed = true;
        return -EIO;
    }
    if (!bb)
        return 0; /* end of stream: the status tells whether it ended well */
    *msg = s_unpack(bb, desc);
    if (!*msg) {
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_INTERNAL,
                                     "cannot parse a response message", NULL);
        c->failed = true;
        return -EIO;
    }
    return 1;
}

int kb_rpc_call_write(kb_rpc_call_t *c, const ProtobufCMessage *msg)
{
    if (c->failed || c->half_closed)
        return -EPIPE;
    grpc_byte_buffer *bb = s_pack(msg);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    bool ok = grpc_call_start_batch(c->call, &op, 1, &c->tag_op, NULL) == GRPC_CALL_OK &&
              s_wait(c, &c->tag_op);
    grpc_byte_buffer_destroy(bb);
    if (!ok) {
        c->failed = true;
        return -EPIPE;
    }
    return 0;
}

int kb_rpc_call_finish(kb_rpc_call_t *c, const ProtobufCMessageDescriptor *resp_desc,
                       ProtobufCMessage **resp, kb_rpc_status_t *st)
{
    if (resp)
        *resp = NULL;
    grpc_byte_buffer *bb = NULL;
    if (!c->failed && (!c->half_closed || resp_desc)) {
        grpc_op ops[2];
        memset(ops, 0, sizeof ops);
        size_t n = 0;
        if (!c->half_closed) {
            ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
            c->half_closed = true;
        }
        if (resp_desc) {
            ops[n].op = GRPC_OP_RECV_MESSAGE;
            ops[n].data.recv_message.recv_message = &bb;
            n++;
        }
        if (grpc_call_start_batch(c->call, ops, n, &c->tag_op, NULL) != GRPC_CALL_OK ||
            !s_wait(c, &c->tag_op))
            c->failed = true;
    }
    int rc = s_collect_status(c, st);
    if (bb && rc == 0 && resp_desc) {
        *resp = s_unpack(bb, resp_desc);
        bb = NULL;
        if (!*resp) {
            s_status(st, GRPC_STATUS_INTERNAL, "cannot parse the response message");
            rc = -EIO;
        }
    } else if (rc == 0 && resp_desc) {
        s_status(st, GRPC_STATUS_INTERNAL, "server sent no response message");
        rc = -EIO;
    }
    if (bb)
        grpc_byte_buffer_destroy(bb);
    return rc;
}

void kb_rpc_call_destroy(kb_rpc_call_t **p)
{
    kb_rpc_call_t *c = *p;
    if (!c)
        return;
    if (c->call) {
        if (c->status_started && !c->status_done) {
            grpc_call_cancel(c->call, NULL);
            grpc_completion_queue_pluck(c->rpc->cq, &c->tag_status,
                                        gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        }
        grpc_call_unref(c->call);
    }
    for (size_t i = 0; i < c->n_md; i++)
        grpc_slice_unref(c->md[i].value);
    grpc_metadata_array_destroy(&c->initial_md);
    grpc_metadata_array_destroy(&c->trailing_md);
    grpc_slice_unref(c->details);
    free(c);
    *p = NULL;
}

int kb_rpc_unary(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 ProtobufCMessage **resp, kb_rpc_status_t *st)
{
    *resp = NULL;
    kb_rpc_call_t *c = s_start(rpc, method, sandbox_id, req, st);
    if (!c)
        return -EIO;
    int rc = kb_rpc_call_finish(c, resp_desc, resp, st);
    kb_rpc_call_destroy(&c);
    return rc;
}
