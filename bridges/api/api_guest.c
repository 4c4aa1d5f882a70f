/*
 * ateenv.v1alpha ProcessService and FileSystemService: calls into one sandbox's guest.
 *
 * Every call is a guest stream of the service layer (frames, then a final frame). Unary
 * methods answer from the final frame; server streams forward frames one send at a time
 * (a queue absorbs what arrives while a send is in flight) and return each data frame's bytes
 * as credit once gRPC core has taken them (ka_svc_stream_ack), so the queue never holds more
 * than the stream's window: a client that does not read stalls its own stream, end to end;
 * client streams (WriteFile, WriteProcessInput) go to the guest in chunks of what arrived
 * (KB_API_CHUNK or more), gathered straight into the next guest request: while one chunk's
 * request is in flight the call reads on into the next, and once that one is full it reads no
 * further message, so the client's HTTP/2 window holds the rest and the node never holds
 * more than two chunks of an upload (64 MiB at most in total; a write past the cap fails,
 * keeping what was written before it).
 */
#include "checks.h"
#include "api_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the Process message ------------------------------------------------------------------ */

typedef struct {
    Ateenv__V1alpha__Process p;
    Google__Protobuf__Timestamp started, finished;
    char id[24];
    char **argv; /* owned array; strings point into the frame copy */
    const ka_guest_reply_t *frame;
} s_pb_process_t;

static void s_process(s_pb_process_t *out, const ka_guest_reply_t *f)
{
    memset(out, 0, sizeof *out);
    ateenv__v1alpha__process__init(&out->p);
    const ka_process_info_t *i = &f->process;
    snprintf(out->id, sizeof out->id, "%llu", (unsigned long long)i->proc);
    out->p.process_id = out->id;
    out->p.pid = i->pid;
    out->p.state = i->state == 2 ? ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED
                                 : ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING;
    out->p.exit_code = i->exit_code;
    if (i->started_ms) {
        kb_api_ts(&out->started, i->started_ms);
        out->p.started_at = &out->started;
    }
    if (i->finished_ms) {
        kb_api_ts(&out->finished, i->finished_ms);
        out->p.finished_at = &out->finished;
    }
    size_t n = 0;
    for (uint32_t k = 0; k < f->tail_len; k++)
        n += f->tail[k] == '\0';
    out->argv = n ? calloc(n, sizeof *out->argv) : NULL;
    const char *s = f->tail;
    for (size_t k = 0; out->argv && k < n; k++) {
        out->argv[k] = (char *)s;
        s += strlen(s) + 1;
    }
    out->p.n_command = out->argv ? n : 0;
    out->p.command = out->argv;
}

static int s_proc_id(const char *s, uint64_t *out)
{
    char *end;
    if (!s[0] || s[0] == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    *out = v;
    return *end || v == 0 ? -1 : 0;
}

/* ---- one call's state ----------------------------------------------------------------------- */

typedef struct s_item s_item_t;
struct s_item {
    s_item_t *next;
    size_t len;
    ka_guest_reply_t frame; /* followed by its tail */
};

typedef enum { K_START, K_GET, K_SIGNAL, K_OUTPUT, K_READ, K_INPUT, K_WRITE } s_kind_t;

typedef struct {
    pthread_mutex_t lock;
    kb_api_t *api;
    kb_grpc_call_t *call;
    s_kind_t kind;
    char caller[KB_AUTH_ID_MAX + 1];
    char sandbox[KA_STORE_ID_LEN];
    krt_addr_t stream;
    bool cancel_wanted;
    /* server streams */
    s_item_t *head, *tail;
    bool sending;
    uint64_t in_flight; /* data bytes of the send in flight (credit once it is done) */
    bool final_seen;
    ka_status_t final;
    bool gone; /* the client went away: drop data, wait for the final frame */
    /* client streams */
    bool started; /* first message seen */
    char path[1024];
    uint32_t mode;
    int64_t seek;
    uint64_t proc;
    bool close_input;
    ka_guest_req_t *next; /* the chunk being gathered, in the guest request that sends it */
    size_t len, cap;      /* bytes gathered in next->tail, room there */
    uint64_t sent;        /* bytes the guest has taken */
    bool writing;         /* a chunk's guest request is in flight */
    bool paused;          /* receiving is paused: the next chunk is full while one is in flight */
    bool ended;           /* the client half-closed */
    bool last;            /* the chunk in flight is the last one */
    bool answered;        /* the call was completed (c lives on while a chunk is in flight) */
    size_t pending;       /* bytes of the chunk in flight */
} s_call_t;

#define KB_API_CHUNK (1u << 20)

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
        free(c);
        return NULL;
    }
    return c;
}

static void s_call_free(s_call_t *c)
{
    while (c->head) {
        s_item_t *i = c->head;
        c->head = i->next;
        free(i);
    }
    pthread_mutex_destroy(&c->lock);
    free(c->next);
    free(c);
}

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len);

/* Starts the guest stream for c with q (consumed). On failure answers and frees c.
 * A unary call's final frame may arrive, be answered and free c before ka_svc_stream even
 * returns, so c is not touched afterwards; a server stream holds c->lock across the start so
 * its frames wait until the stream's address is recorded (s_pump frees c only under the lock). */
static void s_open(s_call_t *c, ka_guest_req_t *q)
{
    if (!q) {
        kb_grpc_fail(c->call, KB_GRPC_INTERNAL, "out of memory");
        s_call_free(c);
        return;
    }
    bool streams = c->kind == K_OUTPUT || c->kind == K_READ;
    krt_addr_t stream = KRT_ADDR_NONE;
    ka_service_t *svc = c->api->o.svc;
    if (streams)
        pthread_mutex_lock(&c->lock);
    int rc =
        ka_svc_stream(svc, q, sizeof *q + q->tail_len, s_on_frame, c, streams ? &stream : NULL);
    free(q);
    if (rc) {
        if (streams)
            pthread_mutex_unlock(&c->lock);
        kb_grpc_fail(c->call, KB_GRPC_UNAVAILABLE, "the control plane is not running");
        s_call_free(c);
        return;
    }
    if (!streams)
        return;
    c->stream = stream;
    bool cancel = c->cancel_wanted && !c->final_seen;
    pthread_mutex_unlock(&c->lock);
    if (cancel)
        ka_svc_stream_cancel(svc, stream);
}

/* ---- unary answers ------------------------------------------------------------------------- */

static void s_answer(s_call_t *c, const ka_guest_reply_t *f)
{
    if (f->status.code != KA_OK) {
        kb_api_fail(c->call, &f->status);
        return;
    }
    s_pb_process_t p;
    switch (c->kind) {
    case K_START: {
        s_process(&p, f);
        Ateenv__V1alpha__StartProcessResponse r = ATEENV__V1ALPHA__START_PROCESS_RESPONSE__INIT;
        r.process = &p.p;
        kb_grpc_reply(c->call, &r.base);
        free(p.argv);
        break;
    }
    default: { /* K_GET, K_SIGNAL */
        s_process(&p, f);
        /* GetProcessResponse and SignalProcessResponse share one shape */
        Ateenv__V1alpha__GetProcessResponse g = ATEENV__V1ALPHA__GET_PROCESS_RESPONSE__INIT;
        Ateenv__V1alpha__SignalProcessResponse s = ATEENV__V1ALPHA__SIGNAL_PROCESS_RESPONSE__INIT;
        g.process = s.process = &p.p;
        kb_grpc_reply(c->call, c->kind == K_GET ? &g.base : &s.base);
        free(p.argv);
        break;
    }
    }
}

/* ---- server streams ------------------------------------------------------------------------ */

static void s_on_sent(kb_grpc_call_t *call, int status, void *arg);

/* Sends the next queued frame, or finishes the call once the final frame came and the queue
 * is empty. Called with c->lock held; returns true if c was freed (lock released). */
static bool s_pump(s_call_t *c)
{
    while (!c->sending && c->head && !c->gone) {
        s_item_t *i = c->head;
        c->head = i->next;
        if (!c->head)
            c->tail = NULL;
        const ka_guest_reply_t *f = &i->frame;
        Ateenv__V1alpha__ProcessOutput po;
        ateenv__v1alpha__process_output__init(&po); /* (the INIT macro trips -Wmissing-braces) */
        Ateenv__V1alpha__ReadFileResponse rf = ATEENV__V1ALPHA__READ_FILE_RESPONSE__INIT;
        s_pb_process_t p = {0};
        ProtobufCMessage *msg = &po.base;
        if (c->kind == K_READ) {
            rf.chunk.data = (uint8_t *)f->tail;
            rf.chunk.len = f->tail_len;
            msg = &rf.base;
        } else if (f->final) { /* the exit record */
            s_process(&p, f);
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
        c->sending = true;
        c->in_flight = f->final ? 0 : f->tail_len;
        int rc = kb_grpc_stream_send(c->call, msg, s_on_sent, c);
        free(p.argv);
        free(i);
        if (rc) {
            c->sending = false;
            c->gone = true;
        }
    }
    if (c->gone && !c->final_seen && !c->cancel_wanted) {
        c->cancel_wanted = true;
        if (c->stream)
            ka_svc_stream_cancel(c->api->o.svc, c->stream);
    }
    if (c->sending || !c->final_seen || (c->head && !c->gone))
        return false;
    ka_status_t st = c->final;
    pthread_mutex_unlock(&c->lock);
    kb_grpc_finish(c->call, kb_api_code(st.code), st.message);
    s_call_free(c);
    return true;
}

static void s_on_sent(kb_grpc_call_t *call, int status, void *arg)
{
    s_call_t *c = arg;
    pthread_mutex_lock(&c->lock);
    c->sending = false;
    if (status)
        c->gone = true;
    else if (c->in_flight && c->stream)
        ka_svc_stream_ack(c->api->o.svc, c->stream, c->in_flight);
    c->in_flight = 0;
    if (!s_pump(c))
        pthread_mutex_unlock(&c->lock);
}

static void s_on_cancel(kb_grpc_call_t *call, void *arg)
{
    s_call_t *c = arg;
    pthread_mutex_lock(&c->lock);
    c->gone = true;
    if (!s_pump(c))
        pthread_mutex_unlock(&c->lock);
}

static void s_queue(s_call_t *c, const ka_guest_reply_t *f, size_t len)
{
    s_item_t *i = malloc(sizeof *i - sizeof i->frame + len);
    if (!i) {
        c->gone = true;
        return;
    }
    i->next = NULL;
    i->len = len;
    memcpy(&i->frame, f, len);
    if (c->tail)
        c->tail->next = i;
    else
        c->head = i;
    c->tail = i;
}

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_call_t *c = user;
    if (c->kind != K_OUTPUT && c->kind != K_READ) { /* unary: only the final frame matters */
        if (f->final) {
            s_answer(c, f);
            s_call_free(c);
        }
        return;
    }
    pthread_mutex_lock(&c->lock);
    if (!c->gone && (!f->final || (c->kind == K_OUTPUT && f->has_process &&
                                   f->status.code == KA_OK && f->process.state == 2)))
        s_queue(c, f, len);
    if (f->final) {
        c->final_seen = true;
        c->final = f->status;
        if (c->gone && c->final.code == KA_OK)
            c->final.code = KA_CANCELLED;
    }
    if (!s_pump(c))
        pthread_mutex_unlock(&c->lock);
}

/* ---- ProcessService ------------------------------------------------------------------------ */

static void s_start(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Ateenv__V1alpha__StartProcessRequest *req = (const void *)m;
    s_call_t *c = s_call_new(user, call, K_START);
    if (!c)
        return;
    size_t tail = 0;
    const char *why = ka_check_command(req->n_command, req->n_command ? req->command[0] : NULL);
    if (!why)
        why = ka_check_cwd(req->cwd);
    for (size_t i = 0; !why && i < req->n_command; i++)
        tail += strlen(req->command[i]) + 1;
    for (size_t i = 0; !why && i < req->n_env; i++) {
        why = ka_check_env_key(req->env[i]->key);
        tail += strlen(req->env[i]->key) + strlen(req->env[i]->value) + 2;
    }
    if (!why)
        why = ka_check_start_size(tail);
    if (why) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, why);
        s_call_free(c);
        return;
    }
    ka_guest_req_t *q = ka_guest_req_new(c->caller, c->sandbox, KA_GUEST_START, tail);
    if (q) {
        char *p = q->tail;
        for (size_t i = 0; i < req->n_command; i++)
            p = stpcpy(p, req->command[i]) + 1;
        for (size_t i = 0; i < req->n_env; i++)
            p += sprintf(p, "%s=%s", req->env[i]->key, req->env[i]->value) + 1;
        q->n_argv = (uint32_t)req->n_command;
        q->n_env = (uint32_t)req->n_env;
        snprintf(q->cwd, sizeof q->cwd, "%s", req->cwd);
        q->stdin_open = req->stdin;
        if (req->timeout)
            q->timeout_ms =
                (uint64_t)(req->timeout->seconds * 1000 + req->timeout->nanos / 1000000);
    }
    s_open(c, q);
}

static void s_by_process(kb_grpc_call_t *call, void *user, s_kind_t kind, const char *id, int op,
                         int sig)
{
    s_call_t *c = s_call_new(user, call, kind);
    if (!c)
        return;
    uint64_t proc;
    if (s_proc_id(id, &proc)) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     "process_id must be a process id from StartProcess");
        s_call_free(c);
        return;
    }
    ka_guest_req_t *q = ka_guest_req_new(c->caller, c->sandbox, op, 0);
    if (q) {
        q->proc = proc;
        q->signal = sig;
    }
    s_open(c, q);
}

static void s_get(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_process(call, user, K_GET, ((const Ateenv__V1alpha__GetProcessRequest *)m)->process_id,
                 KA_GUEST_GET, 0);
}

static void s_signal(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Ateenv__V1alpha__SignalProcessRequest *req = (const void *)m;
    if (req->signal < 1 || req->signal > 31) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     "signal must be one of SIGNAL_HUP ... SIGNAL_SYS");
        return;
    }
    s_by_process(call, user, K_SIGNAL, req->process_id, KA_GUEST_SIGNAL, req->signal);
}

static void s_output(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Ateenv__V1alpha__StreamProcessOutputRequest *req = (const void *)m;
    s_call_t *c = s_call_new(user, call, K_OUTPUT);
    if (!c)
        return;
    uint64_t proc;
    if (s_proc_id(req->process_id, &proc) || req->stdout_offset < 0 || req->stderr_offset < 0) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     req->stdout_offset < 0 || req->stderr_offset < 0
                         ? "output offsets must be nonnegative"
                         : "process_id must be a process id from StartProcess");
        s_call_free(c);
        return;
    }
    kb_grpc_call_on_cancel(call, s_on_cancel, c);
    ka_guest_req_t *q = ka_guest_req_new(c->caller, c->sandbox, KA_GUEST_OUTPUT, 0);
    if (q) {
        q->proc = proc;
        q->stdout_offset = (uint64_t)req->stdout_offset;
        q->stderr_offset = (uint64_t)req->stderr_offset;
        q->follow = req->follow;
    }
    s_open(c, q);
}

/* ---- FileSystemService --------------------------------------------------------------------- */

static void s_read(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Ateenv__V1alpha__ReadFileRequest *req = (const void *)m;
    s_call_t *c = s_call_new(user, call, K_READ);
    if (!c)
        return;
    if (!req->path[0] || strlen(req->path) >= sizeof c->path) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, "path must be 1-1023 characters");
        s_call_free(c);
        return;
    }
    kb_grpc_call_on_cancel(call, s_on_cancel, c);
    ka_guest_req_t *q = ka_guest_req_new(c->caller, c->sandbox, KA_GUEST_READ, 0);
    if (q) {
        snprintf(q->path, sizeof q->path, "%s", req->path);
        q->mode = req->mode;
    }
    s_open(c, q);
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

/* Completes a client-streaming call with an error; c stays (a chunk may be in flight). */
static void s_client_fail(s_call_t *c, kb_grpc_code_t code, const char *message)
{
    kb_grpc_call_set_data(c->call, NULL);
    kb_grpc_fail(c->call, code, message);
    c->answered = true;
}

/* Appends bytes to the chunk; false (after answering) past the 64 MiB cap. */
static bool s_gather(s_call_t *c, const uint8_t *p, size_t n)
{
    if (n == 0) /* a message with only a close flag, or the first with only a path */
        return true;
    if (c->sent + c->pending + c->len + n > KB_API_MAX_FILE) {
        s_client_fail(c, KB_GRPC_RESOURCE_EXHAUSTED, KA_MSG_FILE_TOO_LARGE);
        return false;
    }
    if (!c->next || c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : KB_API_CHUNK + (64u << 10);
        while (cap < c->len + n)
            cap *= 2;
        ka_guest_req_t *grown = realloc(c->next, sizeof *grown + cap);
        if (!grown) {
            s_client_fail(c, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
            return false;
        }
        if (!c->next) /* the fields s_send_chunk does not set */
            memset(grown, 0, sizeof *grown);
        c->next = grown;
        c->cap = cap;
    }
    memcpy(c->next->tail + c->len, p, n);
    c->len += n;
    return true;
}

static void s_on_chunk(void *user, const ka_guest_reply_t *f, size_t len);

/* Sends the gathered chunk as one guest request (the last one once the client half-closed).
 * Called with c->lock held and receiving paused; false (after answering) if it failed. */
static bool s_send_chunk(s_call_t *c)
{
    bool write = c->kind == K_WRITE;
    if (!c->next && !(c->next = ka_guest_req_new("", "", 0, 0))) { /* nothing gathered */
        s_client_fail(c, KB_GRPC_INTERNAL, "out of memory");
        return false;
    }
    ka_guest_req_t *q = c->next;
    snprintf(q->caller, sizeof q->caller, "%s", c->caller);
    snprintf(q->sandbox_id, sizeof q->sandbox_id, "%s", c->sandbox);
    q->op = write ? KA_GUEST_WRITE : KA_GUEST_INPUT;
    q->tail_len = (uint32_t)c->len;
    snprintf(q->path, sizeof q->path, "%s", c->path);
    q->mode = c->mode;
    q->seek_offset = (uint64_t)c->seek + c->sent; /* 0 only for the first: it truncates */
    q->proc = c->proc;
    q->close = c->ended && c->close_input;
    c->pending = c->len;
    c->len = 0;
    c->writing = true;
    c->last = c->ended;
    int rc = ka_svc_stream(c->api->o.svc, q, sizeof *q + q->tail_len, s_on_chunk, c, NULL);
    if (rc) { /* (the request was copied: q gathers the next chunk) */
        c->writing = false;
        s_client_fail(c, KB_GRPC_UNAVAILABLE, "the control plane is not running");
        return false;
    }
    return true;
}

/* Answers the call from the totals (unless it was answered) and frees c. Called with c->lock
 * held; releases it. */
static void s_client_done(s_call_t *c)
{
    if (!c->answered) {
        kb_grpc_call_set_data(c->call, NULL);
        if (c->kind == K_WRITE) {
            Ateenv__V1alpha__WriteFileResponse r = ATEENV__V1ALPHA__WRITE_FILE_RESPONSE__INIT;
            r.bytes_written = (int64_t)c->sent;
            kb_grpc_reply(c->call, &r.base);
        } else {
            Ateenv__V1alpha__WriteProcessInputResponse r =
                ATEENV__V1ALPHA__WRITE_PROCESS_INPUT_RESPONSE__INIT;
            r.bytes_written = (int64_t)c->sent;
            kb_grpc_reply(c->call, &r.base);
        }
    }
    pthread_mutex_unlock(&c->lock);
    s_call_free(c);
}

/* A chunk's guest request ended: send the next one if it is full (or the last one), read on
 * if that was paused, or answer. */
static void s_on_chunk(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_call_t *c = user;
    if (!f->final)
        return;
    pthread_mutex_lock(&c->lock);
    c->writing = false;
    if (!c->answered && f->status.code != KA_OK) {
        kb_grpc_call_set_data(c->call, NULL);
        kb_api_fail(c->call, &f->status);
        c->answered = true;
    }
    c->sent += c->kind == K_WRITE ? f->written : c->pending;
    c->pending = 0;
    if (c->answered || c->last || ((c->ended || c->len >= KB_API_CHUNK) && !s_send_chunk(c))) {
        s_client_done(c);
        return;
    }
    bool resume = c->paused && !c->ended; /* else the last chunk is in flight */
    c->paused = c->paused && !resume;
    pthread_mutex_unlock(&c->lock);
    if (resume)
        kb_grpc_call_resume_recv(c->call);
}

/* The first message names the target; false (after answering) if it is invalid. */
static bool s_first(s_call_t *c, const ProtobufCMessage *m)
{
    c->started = true;
    if (c->kind == K_WRITE) {
        const Ateenv__V1alpha__WriteFileRequest *w = (const void *)m;
        if (!w->path[0] || strlen(w->path) >= sizeof c->path || w->seek_offset < 0) {
            s_client_fail(c, KB_GRPC_INVALID_ARGUMENT,
                          w->seek_offset < 0 ? "seek_offset must be nonnegative"
                                             : "path must be 1-1023 characters");
            return false;
        }
        snprintf(c->path, sizeof c->path, "%s", w->path);
        c->mode = w->mode;
        c->seek = w->seek_offset;
        return true;
    }
    const Ateenv__V1alpha__WriteProcessInputRequest *in = (const void *)m;
    if (s_proc_id(in->process_id, &c->proc)) {
        s_client_fail(c, KB_GRPC_INVALID_ARGUMENT,
                      "process_id must be a process id from StartProcess");
        return false;
    }
    return true;
}

static void s_on_message(kb_grpc_call_t *call, ProtobufCMessage *m, void *user)
{
    s_call_t *c = kb_grpc_call_data(call);
    if (!c) {
        protobuf_c_message_free_unpacked(m, NULL);
        return;
    }
    pthread_mutex_lock(&c->lock);
    bool ok = c->started || s_first(c, m);
    if (ok && c->kind == K_WRITE) {
        const Ateenv__V1alpha__WriteFileRequest *w = (const void *)m;
        ok = s_gather(c, w->chunk.data, w->chunk.len);
    } else if (ok) {
        const Ateenv__V1alpha__WriteProcessInputRequest *in = (const void *)m;
        c->close_input = c->close_input || in->close;
        ok = s_gather(c, in->data.data, in->data.len);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    if (ok && c->len >= KB_API_CHUNK && c->writing) {
        kb_grpc_call_pause_recv(call); /* resumed by s_on_chunk, once it sent this chunk */
        c->paused = true;
    } else if (ok && c->len >= KB_API_CHUNK) {
        s_send_chunk(c);
    }
    if (c->answered && !c->writing) {
        s_client_done(c);
        return;
    }
    pthread_mutex_unlock(&c->lock);
}

static void s_on_end(kb_grpc_call_t *call, int status, void *user)
{
    s_call_t *c = kb_grpc_call_data(call);
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->ended = true;
    if (status)
        s_client_fail(c, status == -EBADMSG ? KB_GRPC_INVALID_ARGUMENT : KB_GRPC_CANCELLED,
                      "the request stream ended abnormally");
    else if (!c->started)
        s_client_fail(c, KB_GRPC_INVALID_ARGUMENT,
                      c->kind == K_WRITE ? "the first message must name the path"
                                         : "the first message must name the process");
    else if (!c->writing) /* else the chunk in flight sends the last one when it ends */
        s_send_chunk(c);
    if (c->answered && !c->writing) {
        s_client_done(c);
        return;
    }
    pthread_mutex_unlock(&c->lock);
}

#define PSVC "/ateenv.v1alpha.ProcessService/"
#define FSVC "/ateenv.v1alpha.FileSystemService/"
const kb_grpc_method_t kb_api_guest_methods[] = {
    {PSVC "StartProcess", KB_GRPC_UNARY, &ateenv__v1alpha__start_process_request__descriptor,
     s_start, NULL, NULL, NULL},
    {PSVC "GetProcess", KB_GRPC_UNARY, &ateenv__v1alpha__get_process_request__descriptor, s_get,
     NULL, NULL, NULL},
    {PSVC "StreamProcessOutput", KB_GRPC_SERVER_STREAM,
     &ateenv__v1alpha__stream_process_output_request__descriptor, s_output, NULL, NULL, NULL},
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
