/*
 * kagent.api.v1 TerminalService/Session: one bidirectional stream per interactive process.
 *
 * The first message starts a process (the StartProcess request, kb_api_start_req, with stdin
 * open, optionally on a tty, and the guest's start-with-follow: one guest stream carries its
 * output to the exit) or attaches to one (an output stream with follow). Later messages become
 * one guest request each (input, resize, signal); while one is in flight the call reads no
 * further message, and the guest answers input only once the process has taken it, so the
 * node holds at most one client message per session and the client's HTTP/2 window holds the
 * rest. Output goes out one send at a time with credit returned as gRPC core takes it (as
 * api_guest's server streams do).
 *
 * A client that goes away (cancel, broken stream, bad message) hangs a started process up:
 * SIGHUP to its process group, and its output stream is cancelled. An attached process is
 * left running.
 *
 * Lifetime: the session is reference counted. The gRPC call owns one reference, released by
 * kb_grpc_call_on_free once every callback of the call has returned (so a late cancel
 * callback never sees freed state); each guest request in flight owns one, released by its
 * final frame. The call is completed exactly once (answered).
 */
#include "api_int.h"
#include "svc_frames.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct s_out s_out_t;
struct s_out {
    s_out_t *next;
    ka_guest_reply_t frame; /* followed by its tail */
};

typedef struct {
    pthread_mutex_t lock;
    int refs;
    kb_api_t *api;
    kb_grpc_call_t *call;
    char caller[KB_AUTH_ID_MAX + 1];
    char sandbox[KA_STORE_ID_LEN];
    bool begun;           /* the first message (start or attach) came */
    bool attached;        /* an attach: going away leaves the process running */
    uint64_t proc;        /* the process; 0 until a start's process frame */
    krt_addr_t stream;    /* the output stream */
    bool final_seen;      /* its final frame came */
    ka_frame_end_t final; /* ... with this outcome */
    s_out_t *head, *tail;
    bool sending;       /* a send to the client is in flight */
    uint64_t in_flight; /* data bytes of that send (credit once it is done) */
    bool ctl_busy;      /* an input/resize/signal request is in flight */
    bool held;          /* receiving is paused (until the process runs, or while ctl_busy) */
    bool gone;          /* the client went away: drop output, hang up */
    bool hung_up;       /* SIGHUP was sent */
    bool answered;      /* the call was completed (or is, at the next s_unlock) */
    bool fin_due;       /* ... by s_unlock, with: */
    kb_grpc_code_t fin_code;
    char fin_msg[KA_MSG_LEN];
} s_term_t;

static void s_unref(s_term_t *t)
{
    pthread_mutex_lock(&t->lock);
    int left = --t->refs;
    pthread_mutex_unlock(&t->lock);
    if (left)
        return;
    while (t->head) {
        s_out_t *o = t->head;
        t->head = o->next;
        free(o);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static void s_release(void *arg)
{
    s_unref(arg);
}

/* Completes the call once: at the next s_unlock (lock held). */
static void s_answer(s_term_t *t, kb_grpc_code_t code, const char *message)
{
    if (t->answered)
        return;
    t->answered = t->fin_due = true;
    t->fin_code = code;
    snprintf(t->fin_msg, sizeof t->fin_msg, "%s", message ? message : "");
}

/* Releases the lock, then completes the call if s_answer asked for it: completing may free
 * the call and with it the call's reference to t, so it never runs under the lock (the
 * caller must hold its own reference or be a callback of the call when it uses t after). */
static void s_unlock(s_term_t *t)
{
    bool fin = t->fin_due;
    t->fin_due = false;
    kb_grpc_code_t code = t->fin_code;
    char msg[sizeof t->fin_msg];
    memcpy(msg, t->fin_msg, sizeof msg);
    kb_grpc_call_t *call = t->call;
    pthread_mutex_unlock(&t->lock);
    if (fin)
        kb_grpc_finish(call, code, msg);
}

static void s_on_ctl(void *user, const ka_guest_reply_t *f, size_t len);
static void s_on_hup(void *user, const ka_guest_reply_t *f, size_t len);

/* Sends one guest request of the session (lock held; takes a reference for it). */
static int s_guest(s_term_t *t, ka_guest_req_t *q, ka_svc_frame_cb cb, krt_addr_t *stream)
{
    if (!q)
        return -1;
    t->refs++;
    int rc = ka_svc_stream(t->api->o.svc, &q, cb, t, stream);
    if (rc)
        t->refs--;
    return rc ? -1 : 0;
}

/* The client is gone: a started process is hung up (SIGHUP to its group) and the output
 * stream cancelled; while the process is still starting, that waits for its process frame
 * (lock held). */
static void s_hang_up(s_term_t *t)
{
    t->gone = true;
    if (t->hung_up || t->final_seen || (!t->attached && !t->proc))
        return;
    t->hung_up = true;
    if (!t->attached) {
        ka_guest_req_t *q = ka_guest_req_new(t->caller, t->sandbox, KA_GUEST_SIGNAL, 0);
        if (q) {
            q->proc = t->proc;
            q->signal = SIGHUP;
        }
        s_guest(t, q, s_on_hup, NULL);
    }
    ka_svc_stream_cancel(t->api->o.svc, t->stream);
}

/* Fails the call for a bad client message and hangs up (lock held). */
static void s_refuse(s_term_t *t, const char *why)
{
    s_answer(t, KB_GRPC_INVALID_ARGUMENT, why);
    s_hang_up(t);
}

/* Whether receiving must stay paused now (lock held). */
static bool s_must_hold(const s_term_t *t)
{
    return t->ctl_busy || (t->begun && !t->attached && !t->proc && !t->final_seen);
}

/* ---- output to the client ------------------------------------------------------------------ */

static void s_on_sent(kb_grpc_call_t *call, int status, void *arg);

/* Sends the next queued frame, or finishes the call once the final frame came and the queue
 * is empty (lock held). */
static void s_pump(s_term_t *t)
{
    while (!t->sending && t->head && !t->gone && !t->answered) {
        s_out_t *o = t->head;
        t->head = o->next;
        if (!t->head)
            t->tail = NULL;
        const ka_guest_reply_t *f = &o->frame;
        Kagent__Api__V1__TerminalResponse r = KAGENT__API__V1__TERMINAL_RESPONSE__INIT;
        kb_api_process_t p = {0};
        if (f->has_process) {
            kb_api_process(&p, &(ka_svc_process_t){f->process, f->tail, f->tail_len});
            r.msg_case = f->final ? KAGENT__API__V1__TERMINAL_RESPONSE__MSG_EXIT
                                  : KAGENT__API__V1__TERMINAL_RESPONSE__MSG_STARTED;
            r.exit = r.started = &p.p;
        } else {
            bool err = f->stream == KA_STREAM_STDERR;
            r.msg_case = err ? KAGENT__API__V1__TERMINAL_RESPONSE__MSG_STDERR
                             : KAGENT__API__V1__TERMINAL_RESPONSE__MSG_STDOUT;
            ProtobufCBinaryData *b = err ? &r.stderr : &r.stdout;
            b->data = (uint8_t *)f->tail;
            b->len = f->tail_len;
        }
        t->sending = true;
        t->in_flight = f->has_process ? 0 : f->tail_len;
        int rc = kb_grpc_stream_send(t->call, &r.base, s_on_sent, t);
        free(p.argv);
        free(o);
        if (rc) {
            t->sending = false;
            s_hang_up(t);
        }
    }
    if (!t->sending && t->final_seen && (!t->head || t->gone))
        s_answer(t, t->gone ? KB_GRPC_CANCELLED : kb_api_code(ka_err_code(t->final.err)),
                 t->gone ? "the client went away" : t->final.message);
}

static void s_on_sent(kb_grpc_call_t *call, int status, void *arg)
{
    s_term_t *t = arg;
    (void)call;
    pthread_mutex_lock(&t->lock);
    t->sending = false;
    if (status)
        s_hang_up(t);
    else if (t->in_flight && t->stream)
        ka_svc_stream_ack(t->api->o.svc, t->stream, t->in_flight);
    t->in_flight = 0;
    s_pump(t);
    s_unlock(t);
}

static void s_queue(s_term_t *t, const ka_guest_reply_t *f, size_t len)
{
    s_out_t *o = malloc(sizeof *o - sizeof o->frame + len);
    if (!o) {
        s_hang_up(t);
        return;
    }
    o->next = NULL;
    memcpy(&o->frame, f, len);
    if (t->tail)
        t->tail->next = o;
    else
        t->head = o;
    t->tail = o;
}

/* Resumes receiving if nothing holds it any more (lock held: it is recursive, as a resume may
 * deliver on_end at once; the call is not completed yet, so it is alive). */
static void s_resume(s_term_t *t)
{
    if (!t->held || s_must_hold(t) || t->answered)
        return;
    t->held = false;
    kb_grpc_call_resume_recv(t->call);
}

/* A frame of the output stream: the process frame (started), data, and the final frame. */
static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_term_t *t = user;
    pthread_mutex_lock(&t->lock);
    bool exited = f->has_process && !f->err && f->process.state == 2;
    if (f->has_process && !f->final && !t->proc) {
        t->proc = f->process.proc;
        if (t->gone)
            s_hang_up(t); /* the client left while the process was starting */
    }
    if (!t->gone && (!f->final || exited))
        s_queue(t, f, len);
    if (f->final) {
        t->final_seen = true;
        ka_frame_end(&t->final, f, len);
    }
    s_pump(t);
    s_resume(t);
    s_unlock(t);
    if (f->final)
        s_unref(t);
}

/* The final frame of an input, resize or signal request: read on. Its failure (the process
 * exited, or closed its stdin) changes nothing else: the output stream tells the client. */
static void s_on_ctl(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_term_t *t = user;
    (void)len;
    if (!f->final)
        return;
    pthread_mutex_lock(&t->lock);
    t->ctl_busy = false;
    s_resume(t);
    s_unlock(t);
    s_unref(t);
}

/* The hang-up's answer: nothing to do but release it. */
static void s_on_hup(void *user, const ka_guest_reply_t *f, size_t len)
{
    (void)len;
    if (f->final)
        s_unref(user);
}

/* ---- input from the client ----------------------------------------------------------------- */

/* The first message: start or attach (lock held). */
static void s_begin(s_term_t *t, const Kagent__Api__V1__TerminalRequest *m)
{
    t->begun = true;
    ka_guest_req_t *q = NULL;
    const char *why = NULL;
    if (m->msg_case == KAGENT__API__V1__TERMINAL_REQUEST__MSG_START && m->start->process) {
        const Kagent__Api__V1__TerminalStart *s = m->start;
        if (s->rows > 0xffff || s->cols > 0xffff) {
            s_refuse(t, "rows and cols must be at most 65535");
            return;
        }
        q = kb_api_start_req(s->process, t->caller, t->sandbox, &why);
        if (q) {
            q->stdin_open = 1;
            q->follow = 1;
            q->tty = s->tty;
            q->rows = s->rows;
            q->cols = s->cols;
        }
    } else if (m->msg_case == KAGENT__API__V1__TERMINAL_REQUEST__MSG_ATTACH) {
        const Kagent__Api__V1__TerminalAttach *a = m->attach;
        uint64_t proc;
        if (kb_api_proc_id(a->process_id, &proc) || a->stdout_offset < 0 || a->stderr_offset < 0) {
            s_refuse(t, a->stdout_offset < 0 || a->stderr_offset < 0
                            ? "output offsets must be nonnegative"
                            : KB_API_MSG_PROC_ID);
            return;
        }
        t->attached = true;
        t->proc = proc;
        q = ka_guest_req_new(t->caller, t->sandbox, KA_GUEST_OUTPUT, 0);
        if (q) {
            q->proc = proc;
            q->follow = 1;
            q->stdout_offset = (uint64_t)a->stdout_offset;
            q->stderr_offset = (uint64_t)a->stderr_offset;
        }
    } else {
        s_refuse(t, "the first message must be a start (with its process) or an attach");
        return;
    }
    if (why) {
        s_refuse(t, why);
        return;
    }
    if (s_guest(t, q, s_on_frame, &t->stream))
        s_answer(t, KB_GRPC_UNAVAILABLE, "the control plane is not running");
}

/* A later message: one guest request (lock held). */
static void s_control(s_term_t *t, const Kagent__Api__V1__TerminalRequest *m)
{
    ka_guest_req_t *q = NULL;
    switch (m->msg_case) {
    case KAGENT__API__V1__TERMINAL_REQUEST__MSG_STDIN:
    case KAGENT__API__V1__TERMINAL_REQUEST__MSG_STDIN_EOF: {
        bool eof = m->msg_case == KAGENT__API__V1__TERMINAL_REQUEST__MSG_STDIN_EOF;
        size_t n = eof ? 0 : m->stdin.len;
        q = ka_guest_req_new(t->caller, t->sandbox, KA_GUEST_INPUT, n);
        if (q) {
            if (n)
                memcpy(q->tail, m->stdin.data, n);
            q->close = eof;
        }
        break;
    }
    case KAGENT__API__V1__TERMINAL_REQUEST__MSG_RESIZE:
        if (m->resize->rows < 1 || m->resize->rows > 0xffff || m->resize->cols < 1 ||
            m->resize->cols > 0xffff) {
            s_refuse(t, "rows and cols must be 1-65535");
            return;
        }
        q = ka_guest_req_new(t->caller, t->sandbox, KA_GUEST_RESIZE, 0);
        if (q) {
            q->rows = m->resize->rows;
            q->cols = m->resize->cols;
        }
        break;
    case KAGENT__API__V1__TERMINAL_REQUEST__MSG_SIGNAL:
        if (m->signal < 1 || m->signal > 31) {
            s_refuse(t, "signal must be one of SIGNAL_HUP ... SIGNAL_SYS");
            return;
        }
        q = ka_guest_req_new(t->caller, t->sandbox, KA_GUEST_SIGNAL, 0);
        if (q)
            q->signal = m->signal;
        break;
    default:
        s_refuse(t, m->msg_case == KAGENT__API__V1__TERMINAL_REQUEST__MSG_START ||
                            m->msg_case == KAGENT__API__V1__TERMINAL_REQUEST__MSG_ATTACH
                        ? "a session starts or attaches once, with its first message"
                        : "an empty message");
        return;
    }
    if (q)
        q->proc = t->proc;
    if (s_guest(t, q, s_on_ctl, NULL)) {
        s_answer(t, KB_GRPC_UNAVAILABLE, "the control plane is not running");
        s_hang_up(t);
        return;
    }
    t->ctl_busy = true;
}

static void s_on_message(kb_grpc_call_t *call, ProtobufCMessage *msg, void *user)
{
    s_term_t *t = kb_grpc_call_data(call);
    (void)user;
    const Kagent__Api__V1__TerminalRequest *m = (const void *)msg;
    pthread_mutex_lock(&t->lock);
    if (t->answered || t->gone)
        ; /* nothing more is taken */
    else if (!t->begun)
        s_begin(t, m);
    else if (t->final_seen) /* the process has ended: what comes now has nowhere to go */
        ;
    else
        s_control(t, m);
    if (s_must_hold(t) && !t->answered && !t->held) {
        t->held = true;
        kb_grpc_call_pause_recv(call);
    }
    s_unlock(t);
    protobuf_c_message_free_unpacked(msg, NULL);
}

/* The client half-closed (status 0: the output still flows) or went away. */
static void s_on_end(kb_grpc_call_t *call, int status, void *user)
{
    s_term_t *t = kb_grpc_call_data(call);
    (void)user;
    pthread_mutex_lock(&t->lock);
    if (!t->begun) {
        t->begun = true;
        s_answer(t, status == -ECANCELED ? KB_GRPC_CANCELLED : KB_GRPC_INVALID_ARGUMENT,
                 "the session ended before its start or attach message");
    } else if (status) {
        if (status == -EBADMSG) /* the server answered INVALID_ARGUMENT already */
            s_answer(t, KB_GRPC_INVALID_ARGUMENT, "a message that cannot be decoded");
        s_hang_up(t);
        s_pump(t);
    }
    s_unlock(t);
}

static void s_on_cancel(kb_grpc_call_t *call, void *arg)
{
    s_term_t *t = arg;
    (void)call;
    pthread_mutex_lock(&t->lock);
    s_hang_up(t);
    s_pump(t);
    s_unlock(t);
}

static void s_session(kb_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    (void)req;
    s_term_t *t = calloc(1, sizeof *t);
    if (!t) {
        kb_grpc_fail(call, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&t->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    t->refs = 1; /* the call's, released when the call is freed */
    t->api = user;
    t->call = call;
    kb_grpc_call_on_free(call, s_release, t);
    if (kb_api_guest_target(t->api, call, t->caller, sizeof t->caller, t->sandbox,
                            sizeof t->sandbox)) {
        t->answered = t->begun = t->gone = true; /* answered there; on_end finds it done */
        kb_grpc_call_set_data(call, t);
        return;
    }
    kb_grpc_call_set_data(call, t);
    kb_grpc_call_on_cancel(call, s_on_cancel, t);
}

const kb_grpc_method_t kb_api_terminal_methods[] = {
    {"/kagent.api.v1.TerminalService/Session", KB_GRPC_BIDI_STREAM,
     &kagent__api__v1__terminal_request__descriptor, s_session, s_on_message, s_on_end, NULL},
};
const size_t kb_api_terminal_n = sizeof kb_api_terminal_methods / sizeof kb_api_terminal_methods[0];
