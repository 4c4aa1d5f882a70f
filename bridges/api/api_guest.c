/*
 * ateenv.v1alpha ProcessService and FileSystemService, and kagent.api.v1 ProcessService/Exec
 * (StartProcess and a followed StreamProcessOutput in one call and one guest round trip):
 * calls into one sandbox's guest.
 *
 * Every call is a guest stream of the service layer (frames, then a final frame). Unary
 * methods answer from the final frame; server streams are kb_api_stream's (api_stream.h);
 * client streams (WriteFile, WriteProcessInput) go to the guest in chunks of what arrived
 * (KB_API_CHUNK or more): while as many chunks' guest requests are in flight as may be (two
 * for a file once its first chunk is written, one for process input) the call reads no
 * further message, so the client's HTTP/2 window holds the rest and the node never holds
 * a whole upload (64 MiB at most in total; a write past the cap fails, keeping what was
 * written before it, and what a chunk already in flight writes).
 *
 * A call's state (s_call_t) lives as long as its gRPC call: kb_grpc_call_on_free releases it
 * once every gRPC callback has returned, and it is freed when that and every chunk's hold is
 * gone. So a callback that races the answer (a message beside a chunk's end) finds it alive and
 * answered, and does nothing. The answer is decided under
 * c->lock and sent once it is released (s_unlock): completing a call may release it at once,
 * and the release takes the lock.
 */
#include "api_int.h"
#include "api_stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- one call's state ----------------------------------------------------------------------- */

typedef enum { K_START, K_GET, K_SIGNAL, K_INPUT, K_WRITE } s_kind_t;

#define KB_API_CHUNK     (1u << 20)
#define KB_API_IN_FLIGHT 2 /* a file's chunks in flight at once (process input: 1) */

typedef struct s_call s_call_t;

/* A chunk whose guest request is in flight (the request's user). */
typedef struct {
    s_call_t *c;
    size_t len;
    bool busy;
} s_chunk_t;

struct s_call {
    pthread_mutex_t lock;
    kb_api_t *api;
    kb_grpc_call_t *call;
    s_kind_t kind;
    char caller[KB_AUTH_ID_MAX + 1];
    char sandbox[KA_STORE_ID_LEN];
    /* client streams */
    bool started; /* first message seen */
    char path[1024];
    uint32_t mode;
    int64_t seek;
    char proc[24];
    bool close_input;
    char *data; /* the chunk being gathered */
    size_t len, cap;
    uint64_t sent;    /* bytes the guest has taken */
    unsigned writing; /* chunks in flight (receiving pauses while no more may go) */
    bool ended;       /* the client half-closed */
    bool last;        /* the last chunk was sent */
    size_t pending;   /* bytes of the chunks in flight */
    s_chunk_t chunk[KB_API_IN_FLIGHT];
    /* the answer */
    bool answered;       /* decided (only the first reason to answer does) */
    bool due;            /* decided, not yet sent: s_unlock sends it */
    kb_grpc_code_t code; /* KB_GRPC_OK: a client stream's reply */
    char message[KA_MSG_LEN];
    unsigned holds; /* the gRPC call's, one per chunk in flight, one per chunk's end under way */
};

static void s_call_free(s_call_t *c)
{
    pthread_mutex_destroy(&c->lock);
    free(c->data);
    free(c);
}

static void s_answer(kb_grpc_call_t *call, s_kind_t kind, kb_grpc_code_t code, const char *message,
                     uint64_t written);

/* Releases c->lock, then sends the answer decided under it, if one is due. */
static void s_unlock(s_call_t *c)
{
    bool due = c->due;
    c->due = false;
    kb_grpc_call_t *call = c->call;
    s_kind_t kind = c->kind;
    kb_grpc_code_t code = c->code;
    char message[KA_MSG_LEN];
    memcpy(message, c->message, sizeof message);
    uint64_t written = c->sent;
    pthread_mutex_unlock(&c->lock);
    if (due)
        s_answer(call, kind, code, message, written);
}

/* Drops one hold (c->lock held): unlocks as s_unlock does, and frees c if it was the last. */
static void s_release(s_call_t *c)
{
    bool last = --c->holds == 0;
    s_unlock(c);
    if (last)
        s_call_free(c);
}

/* kb_grpc_call_on_free: the gRPC call's hold. */
static void s_on_call_free(void *arg)
{
    s_call_t *c = arg;
    pthread_mutex_lock(&c->lock);
    s_release(c);
}

/* Decides the answer (c->lock held) unless one was decided: only the first reason answers. */
static void s_decide(s_call_t *c, kb_grpc_code_t code, const char *message)
{
    if (c->answered)
        return;
    c->answered = c->due = true;
    c->code = code;
    snprintf(c->message, sizeof c->message, "%s", message ? message : "the call failed");
}

/* s_decide with a service status. */
static void s_decide_st(s_call_t *c, const ka_svc_status_t *st)
{
    s_decide(c, kb_api_code(ka_err_code(st->err)), st->message);
}

static s_call_t *s_call_new(kb_api_t *api, kb_grpc_call_t *call, s_kind_t kind)
{
    s_call_t *c = calloc(1, sizeof *c);
    if (!c) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->api = api;
    c->call = call;
    c->kind = kind;
    if (kb_api_guest_target(api, call, c->caller, sizeof c->caller, c->sandbox,
                            sizeof c->sandbox)) {
        s_call_free(c);
        return NULL;
    }
    c->holds = 1;
    kb_grpc_call_on_free(call, s_on_call_free, c);
    return c;
}

static ka_svc_caller_t s_who(const s_call_t *c)
{
    return (ka_svc_caller_t){c->caller, 0};
}

/* Answers a refused start (the callback will not run). */
static void s_refused(s_call_t *c, ka_svc_status_t st)
{
    if (st.err)
        kb_api_fail_err(c->call, &st);
}

/* ---- unary answers ------------------------------------------------------------------------- */

/* A unary call's reply. It may run before the op even returns, so c is not touched after a
 * start. */
static void s_on_process(void *user, const ka_svc_status_t *st, const ka_svc_process_t *sp)
{
    s_call_t *c = user;
    if (st->err) {
        kb_api_fail_err(c->call, st);
        return;
    }
    kb_api_process_t p;
    kb_api_process(&p, sp);
    if (c->kind == K_START) {
        Ateenv__V1alpha__StartProcessResponse r = ATEENV__V1ALPHA__START_PROCESS_RESPONSE__INIT;
        r.process = &p.p;
        kb_grpc_reply(c->call, &r.base);
    } else { /* GetProcessResponse and SignalProcessResponse share one shape */
        Ateenv__V1alpha__GetProcessResponse g = ATEENV__V1ALPHA__GET_PROCESS_RESPONSE__INIT;
        Ateenv__V1alpha__SignalProcessResponse s = ATEENV__V1ALPHA__SIGNAL_PROCESS_RESPONSE__INIT;
        g.process = s.process = &p.p;
        kb_grpc_reply(c->call, c->kind == K_GET ? &g.base : &s.base);
    }
    free(p.argv);
}

/* ---- server streams ------------------------------------------------------------------------ */

/* A server stream's start: who calls into which sandbox, and the request (borrowed). */
typedef struct {
    kb_api_t *api;
    char caller[KB_AUTH_ID_MAX + 1];
    char sandbox[KA_STORE_ID_LEN];
    const void *req;
} s_open_t;

/* Identifies the caller and the sandbox, then forwards the stream start opens. */
static void s_open(kb_api_t *api, kb_grpc_call_t *call, const ProtobufCMessage *m,
                   const kb_api_stream_ops_t *ops, kb_api_stream_start_fn start)
{
    s_open_t o = {.api = api, .req = m};
    if (kb_api_guest_target(api, call, o.caller, sizeof o.caller, o.sandbox, sizeof o.sandbox))
        return;
    kb_api_stream_open(api, call, ops, start, &o);
}

/* ReadFile sends data; StreamProcessOutput and Exec also the exit (an exited process's final
 * frame). */
static bool s_keep_data(const ka_guest_reply_t *f)
{
    return !f->final;
}

static bool s_keep_exit(const ka_guest_reply_t *f)
{
    return !f->final || (f->has_process && !f->err && f->process.state == 2);
}

static int s_send_read(kb_grpc_call_t *call, const ka_guest_reply_t *f, kb_grpc_sent_fn sent,
                       void *arg)
{
    Ateenv__V1alpha__ReadFileResponse rf = ATEENV__V1ALPHA__READ_FILE_RESPONSE__INIT;
    rf.chunk.data = (uint8_t *)f->tail;
    rf.chunk.len = f->tail_len;
    return kb_grpc_stream_send(call, &rf.base, sent, arg);
}

/* An Exec stream's frame as its message: the process frame (Started), data, the exit (Exit). */
static int s_send_exec(kb_grpc_call_t *call, const ka_guest_reply_t *f, kb_grpc_sent_fn sent,
                       void *arg)
{
    Kagent__Api__V1__ExecResponse er;
    kagent__api__v1__exec_response__init(&er);
    kb_api_process_t p = {0};
    if (f->has_process) {
        ka_svc_process_t sp = {f->process, f->tail, f->tail_len};
        kb_api_process(&p, &sp);
        er.msg_case = f->final ? KAGENT__API__V1__EXEC_RESPONSE__MSG_EXIT
                               : KAGENT__API__V1__EXEC_RESPONSE__MSG_STARTED;
        er.started = &p.p; /* one union with exit */
    } else {
        bool err = f->stream == KA_STREAM_STDERR;
        er.msg_case = err ? KAGENT__API__V1__EXEC_RESPONSE__MSG_STDERR
                          : KAGENT__API__V1__EXEC_RESPONSE__MSG_STDOUT;
        ProtobufCBinaryData *b = err ? &er.stderr : &er.stdout;
        b->data = (uint8_t *)f->tail;
        b->len = f->tail_len;
    }
    int rc = kb_grpc_stream_send(call, &er.base, sent, arg);
    free(p.argv);
    return rc;
}

/* A StreamProcessOutput frame as its message: data, or the exit record. */
static int s_send_output(kb_grpc_call_t *call, const ka_guest_reply_t *f, kb_grpc_sent_fn sent,
                         void *arg)
{
    Ateenv__V1alpha__ProcessOutput po;
    ateenv__v1alpha__process_output__init(&po); /* (the INIT macro trips -Wmissing-braces) */
    kb_api_process_t p = {0};
    if (f->final) {
        ka_svc_process_t sp = {f->process, f->tail, f->tail_len};
        kb_api_process(&p, &sp);
        po.output_case = ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_EXIT;
        po.exit = &p.p;
    } else {
        bool err = f->stream == KA_STREAM_STDERR;
        po.output_case = err ? ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDERR
                             : ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDOUT;
        ProtobufCBinaryData *b = err ? &po.stderr : &po.stdout;
        b->data = (uint8_t *)f->tail;
        b->len = f->tail_len;
    }
    int rc = kb_grpc_stream_send(call, &po.base, sent, arg);
    free(p.argv);
    return rc;
}

static const kb_api_stream_ops_t s_read_ops = {s_keep_data, s_send_read};
static const kb_api_stream_ops_t s_exec_ops = {s_keep_exit, s_send_exec};
static const kb_api_stream_ops_t s_output_ops = {s_keep_exit, s_send_output};

/* ---- ProcessService ------------------------------------------------------------------------ */

static void s_start(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_call_t *c = s_call_new(user, call, K_START);
    if (!c)
        return;
    ka_svc_exec_args_t a;
    ka_svc_env_t *env;
    ka_svc_status_t st = kb_api_exec_args((const void *)m, c->sandbox, &a, &env);
    ka_svc_caller_t who = s_who(c);
    if (!st.err)
        st = ka_svc_exec(c->api->o.svc, &who, &a, s_on_process, c);
    free(env);
    s_refused(c, st);
}

static ka_svc_status_t s_exec_start(kb_api_stream_t *s, void *arg, krt_addr_t *stream)
{
    const s_open_t *o = arg;
    ka_svc_exec_args_t a;
    ka_svc_env_t *env;
    ka_svc_status_t st = kb_api_exec_args(o->req, o->sandbox, &a, &env);
    ka_svc_caller_t who = {o->caller, 0};
    if (!st.err)
        st = ka_svc_exec_follow(o->api->o.svc, &who, &a, kb_api_stream_frame, s, stream);
    free(env);
    return st;
}

/* kagent.api.v1.ProcessService/Exec: a server stream of the followed start. */
static void s_exec(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_open(user, call, m, &s_exec_ops, s_exec_start);
}

static void s_get(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_call_t *c = s_call_new(user, call, K_GET);
    if (!c)
        return;
    ka_svc_caller_t who = s_who(c);
    s_refused(c, ka_svc_process(c->api->o.svc, &who, c->sandbox,
                                ((const Ateenv__V1alpha__GetProcessRequest *)m)->process_id,
                                s_on_process, c));
}

static void s_signal(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Ateenv__V1alpha__SignalProcessRequest *req = (const void *)m;
    s_call_t *c = s_call_new(user, call, K_SIGNAL);
    if (!c)
        return;
    ka_svc_caller_t who = s_who(c);
    s_refused(c, ka_svc_signal(c->api->o.svc, &who, c->sandbox, req->process_id, (int)req->signal,
                               s_on_process, c));
}

static ka_svc_status_t s_output_start(kb_api_stream_t *s, void *arg, krt_addr_t *stream)
{
    const s_open_t *o = arg;
    const Ateenv__V1alpha__StreamProcessOutputRequest *req = o->req;
    ka_svc_output_args_t a = {o->sandbox, req->process_id, req->stdout_offset, req->stderr_offset,
                              req->follow};
    ka_svc_caller_t who = {o->caller, 0};
    return ka_svc_output(o->api->o.svc, &who, &a, kb_api_stream_frame, s, stream);
}

static void s_output(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_open(user, call, m, &s_output_ops, s_output_start);
}

/* ---- FileSystemService --------------------------------------------------------------------- */

static ka_svc_status_t s_read_start(kb_api_stream_t *s, void *arg, krt_addr_t *stream)
{
    const s_open_t *o = arg;
    const Ateenv__V1alpha__ReadFileRequest *req = o->req;
    ka_svc_read_args_t a = {o->sandbox, req->path, req->mode};
    ka_svc_caller_t who = {o->caller, 0};
    return ka_svc_file_read(o->api->o.svc, &who, &a, kb_api_stream_frame, s, stream);
}

static void s_read(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_open(user, call, m, &s_read_ops, s_read_start);
}

/* ---- client streams: WriteFile, WriteProcessInput ------------------------------------------ */

static void s_client_start(kb_grpc_call_t *call, void *user, s_kind_t kind)
{
    s_call_t *c = s_call_new(user, call, kind);
    if (c)
        kb_grpc_call_set_data(call, c);
}

static void s_write_start(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_client_start(call, user, K_WRITE);
}

static void s_input_start(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_client_start(call, user, K_INPUT);
}

/* False (after answering) if n more bytes would pass the 64 MiB cap. */
static bool s_fits(s_call_t *c, size_t n)
{
    if (c->sent + c->pending + c->len + n <= KB_API_MAX_FILE)
        return true;
    s_decide(c, KB_GRPC_RESOURCE_EXHAUSTED, KA_MSG_FILE_TOO_LARGE);
    return false;
}

/* Appends bytes to the chunk; false (after answering) past the 64 MiB cap. */
static bool s_gather(s_call_t *c, const uint8_t *p, size_t n)
{
    if (n == 0) /* a message with only a close flag, or the first with only a path */
        return true;
    if (!s_fits(c, n))
        return false;
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 1 << 16;
        while (cap < c->len + n)
            cap *= 2;
        char *grown = realloc(c->data, cap);
        if (!grown) {
            s_decide(c, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return false;
        }
        c->data = grown;
        c->cap = cap;
    }
    memcpy(c->data + c->len, p, n);
    c->len += n;
    return true;
}

static void s_on_chunk(void *user, const ka_svc_status_t *st, uint64_t written);

/* Whether another chunk may go to the guest now. Process input goes in order, one chunk at a
 * time. A file's chunks carry their offsets, so the order they reach the guest in does not
 * matter, once the first (it truncates the file) has been written: then two are in flight, and
 * the client's next chunk arrives while the guest writes one. */
static bool s_may_send(const s_call_t *c)
{
    unsigned most = c->kind == K_WRITE && c->sent > 0 ? KB_API_IN_FLIGHT : 1;
    return c->writing < most;
}

/* A free chunk slot for len bytes (s_may_send holds: there is one); the chunk holds c. */
static s_chunk_t *s_chunk_take(s_call_t *c, size_t len)
{
    s_chunk_t *k = c->chunk;
    while (k->busy)
        k++;
    *k = (s_chunk_t){c, len, true};
    c->writing++;
    c->pending += len;
    c->holds++;
    return k;
}

/* Frees a chunk slot; never the last hold (the caller holds c too). */
static void s_chunk_put(s_chunk_t *k)
{
    k->c->writing--;
    k->c->pending -= k->len;
    k->c->holds--;
    k->busy = false;
}

/* Sends data (the gathered chunk, or a whole message's bytes when nothing was gathered: the
 * service copies them into its request) as one guest request (the last one once the client
 * half-closed). Called with c->lock held when s_may_send; false (after answering) if it
 * failed. */
static bool s_send_chunk(s_call_t *c, const char *data, size_t len)
{
    int64_t at = c->seek + (int64_t)(c->sent + c->pending);
    s_chunk_t *k = s_chunk_take(c, len);
    c->len = 0;
    c->last = c->ended;
    ka_svc_caller_t who = s_who(c);
    ka_svc_status_t st;
    if (c->kind == K_WRITE) {
        /* seek 0 only for the first chunk: it truncates */
        ka_svc_write_args_t a = {c->sandbox, c->path, c->mode, at, data, len};
        st = ka_svc_file_write(c->api->o.svc, &who, &a, s_on_chunk, k);
    } else {
        ka_svc_input_args_t a = {c->sandbox, c->proc, data, len, c->ended && c->close_input};
        st = ka_svc_input(c->api->o.svc, &who, &a, s_on_chunk, k);
    }
    if (st.err) {
        s_chunk_put(k);
        s_decide_st(c, &st);
        return false;
    }
    return true;
}

/* Sends a decided answer: a client stream's reply from its totals when it is OK, else the
 * status (a server stream's end, a failure). */
static void s_answer(kb_grpc_call_t *call, s_kind_t kind, kb_grpc_code_t code, const char *message,
                     uint64_t written)
{
    if (kind == K_WRITE && code == KB_GRPC_OK) {
        Ateenv__V1alpha__WriteFileResponse r = ATEENV__V1ALPHA__WRITE_FILE_RESPONSE__INIT;
        r.bytes_written = (int64_t)written;
        kb_grpc_reply(call, &r.base);
    } else if (kind == K_INPUT && code == KB_GRPC_OK) {
        Ateenv__V1alpha__WriteProcessInputResponse r =
            ATEENV__V1ALPHA__WRITE_PROCESS_INPUT_RESPONSE__INIT;
        r.bytes_written = (int64_t)written;
        kb_grpc_reply(call, &r.base);
    } else { /* an error */
        kb_grpc_finish(call, code, message);
    }
}

/* A chunk's guest request ended: read on, send the last chunk, or answer once none is in
 * flight. */
static void s_on_chunk(void *user, const ka_svc_status_t *st, uint64_t written)
{
    s_chunk_t *k = user;
    s_call_t *c = k->c;
    pthread_mutex_lock(&c->lock);
    c->holds++; /* this callback's, while the chunk's goes */
    size_t len = k->len;
    s_chunk_put(k);
    if (st->err)
        s_decide_st(c, st);
    c->sent += c->kind == K_WRITE ? written : st->err ? 0 : len;
    if (!c->answered && !c->last && c->ended)
        s_send_chunk(c, c->data, c->len);
    if (c->last && !c->writing)
        s_decide(c, KB_GRPC_OK, "");
    bool resume = !c->answered && !c->ended && s_may_send(c);
    kb_grpc_call_t *call = c->call;
    if (resume) /* not answered: the call is live; the reference keeps it (and c) */
        kb_grpc_call_ref(call);
    s_release(c);
    if (resume) {
        kb_grpc_call_resume_recv(call); /* may deliver the end (s_on_end) */
        kb_grpc_call_unref(call);
    }
}

/* The first message names the target; false (after answering) if it is invalid. */
static bool s_first(s_call_t *c, const ProtobufCMessage *m)
{
    c->started = true;
    ka_svc_status_t st;
    if (c->kind == K_WRITE) {
        const Ateenv__V1alpha__WriteFileRequest *w = (const void *)m;
        ka_svc_write_args_t a = {c->sandbox, w->path, w->mode, w->seek_offset, NULL, 0};
        st = ka_svc_file_write_check(&a);
        if (!st.err) {
            snprintf(c->path, sizeof c->path, "%s", w->path);
            c->mode = w->mode;
            c->seek = w->seek_offset;
        }
    } else {
        const Ateenv__V1alpha__WriteProcessInputRequest *in = (const void *)m;
        ka_svc_input_args_t a = {c->sandbox, in->process_id, NULL, 0, false};
        st = ka_svc_input_check(&a);
        if (!st.err)
            snprintf(c->proc, sizeof c->proc, "%s", in->process_id);
    }
    if (st.err)
        s_decide_st(c, &st);
    return !st.err;
}

static void s_on_message(kb_grpc_call_t *call, ProtobufCMessage *m, void *user)
{
    s_call_t *c = kb_grpc_call_data(call);
    if (!c) {
        protobuf_c_message_free_unpacked(m, NULL);
        return;
    }
    pthread_mutex_lock(&c->lock);
    bool ok = !c->answered && (c->started || s_first(c, m)); /* answered meanwhile: dropped */
    const ProtobufCBinaryData *b;
    if (c->kind == K_WRITE) {
        b = &((const Ateenv__V1alpha__WriteFileRequest *)(const void *)m)->chunk;
    } else {
        const Ateenv__V1alpha__WriteProcessInputRequest *in = (const void *)m;
        c->close_input = c->close_input || in->close;
        b = &in->data;
    }
    bool whole = ok && c->len == 0 && b->len >= KB_API_CHUNK; /* sent as it is: no gather */
    ok = ok && (whole ? s_fits(c, b->len) : s_gather(c, b->data, b->len));
    if (ok && (whole || c->len >= KB_API_CHUNK)) /* receiving goes on only while s_may_send */
        s_send_chunk(c, whole ? (const char *)b->data : c->data, whole ? b->len : c->len);
    if (!c->answered && !s_may_send(c)) /* under c->lock: a chunk's end resumes after this */
        kb_grpc_call_pause_recv(call);
    protobuf_c_message_free_unpacked(m, NULL);
    s_unlock(c);
}

static void s_on_end(kb_grpc_call_t *call, int status, void *user)
{
    s_call_t *c = kb_grpc_call_data(call);
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->ended = true;
    if (status)
        s_decide(c, status == -EBADMSG ? KB_GRPC_INVALID_ARGUMENT : KB_GRPC_CANCELLED,
                 "the request stream ended abnormally");
    else if (!c->started)
        s_decide(c, KB_GRPC_INVALID_ARGUMENT,
                 c->kind == K_WRITE ? "the first message must name the path"
                                    : "the first message must name the process");
    else if (!c->answered && s_may_send(c)) /* else a chunk in flight sends the last one */
        s_send_chunk(c, c->data, c->len);
    s_unlock(c);
}

#define PSVC "/ateenv.v1alpha.ProcessService/"
#define KSVC "/kagent.api.v1.ProcessService/"
#define FSVC "/ateenv.v1alpha.FileSystemService/"
const kb_grpc_method_t kb_api_guest_methods[] = {
    {PSVC "StartProcess", KB_GRPC_UNARY, &ateenv__v1alpha__start_process_request__descriptor,
     s_start, NULL, NULL, NULL},
    {PSVC "GetProcess", KB_GRPC_UNARY, &ateenv__v1alpha__get_process_request__descriptor, s_get,
     NULL, NULL, NULL},
    {PSVC "StreamProcessOutput", KB_GRPC_SERVER_STREAM,
     &ateenv__v1alpha__stream_process_output_request__descriptor, s_output, NULL, NULL, NULL},
    {KSVC "Exec", KB_GRPC_SERVER_STREAM, &ateenv__v1alpha__start_process_request__descriptor,
     s_exec, NULL, NULL, NULL},
    {PSVC "SignalProcess", KB_GRPC_UNARY, &ateenv__v1alpha__signal_process_request__descriptor,
     s_signal, NULL, NULL, NULL},
    {PSVC "WriteProcessInput", KB_GRPC_CLIENT_STREAM,
     &ateenv__v1alpha__write_process_input_request__descriptor, s_input_start, s_on_message,
     s_on_end, NULL},
    {FSVC "ReadFile", KB_GRPC_SERVER_STREAM, &ateenv__v1alpha__read_file_request__descriptor,
     s_read, NULL, NULL, NULL},
    {FSVC "WriteFile", KB_GRPC_CLIENT_STREAM, &ateenv__v1alpha__write_file_request__descriptor,
     s_write_start, s_on_message, s_on_end, NULL},
};
const size_t kb_api_guest_n = sizeof kb_api_guest_methods / sizeof kb_api_guest_methods[0];
