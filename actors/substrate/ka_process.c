/* ka_process: the per-process actor (see ka_process.h). */
#include "ka_process.h"
#include "ka_guestlink.h"

#include <stdlib.h>
#include <string.h>

enum { S_TAG_START = 1, S_TAG_SIGNAL = 2, S_TAG_INPUT = 3 };

struct ka_process_args {
    krt_addr_t link;
    ka_gl_req_t *req;
};

typedef struct s_waiter {
    krt_addr_t from;
    uint64_t ref;
} s_waiter_t;

typedef struct s_proc {
    krt_addr_t link;
    ka_process_info_t info;
    s_waiter_t waiters[KA_PROC_MAX_WAITERS];
    size_t n_waiters;
} s_proc_t;

ka_process_args_t *ka_process_args_new(krt_addr_t link, const ka_gp_start_t *st)
{
    ka_process_args_t *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    ka_gp_start_t s = *st;
    s.follow = true; /* the actor tracks offsets and the exit from the stream */
    a->link = link;
    a->req = ka_gl_req_start(KRT_ADDR_NONE, S_TAG_START, &s);
    if (!a->req) {
        free(a);
        return NULL;
    }
    return a;
}

void ka_process_args_free(ka_process_args_t *a)
{
    if (!a)
        return;
    ka_gl_req_free(a->req);
    free(a);
}

static bool s_done(const s_proc_t *p)
{
    return p->info.state == KA_PROC_EXITED || p->info.state == KA_PROC_FAILED;
}

static void s_wake(krt_ctx_t *ctx, s_proc_t *p)
{
    for (size_t i = 0; i < p->n_waiters; i++)
        krt_reply_to(ctx, p->waiters[i].from, p->waiters[i].ref, KA_PROC_INFO, &p->info,
                     sizeof(p->info));
    p->n_waiters = 0;
}

static void s_fail(krt_ctx_t *ctx, s_proc_t *p, int err)
{
    if (s_done(p))
        return;
    p->info.state = KA_PROC_FAILED;
    p->info.err = err;
    s_wake(ctx, p);
}

static void s_take_process(s_proc_t *p, const ka_gp_process_t *gp)
{
    p->info.proc = gp->proc;
    p->info.pid = gp->pid;
    p->info.started_ms = gp->started_ms;
    if (gp->state == KA_GP_STATE_EXITED) {
        p->info.state = KA_PROC_EXITED;
        p->info.exit_code = (int)gp->exit_code;
        p->info.finished_ms = gp->finished_ms;
    } else if (p->info.state == KA_PROC_STARTING) {
        p->info.state = KA_PROC_RUNNING;
    }
}

static void s_on_frame(krt_ctx_t *ctx, s_proc_t *p, const ka_gl_frame_t *w)
{
    if (w->tag != S_TAG_START)
        return; /* signal replies carry nothing the stream will not */
    const ka_gp_frame_t *f = w->frame;
    int err = ka_gp_frame_err(f);
    if (err < 0) {
        s_fail(ctx, p, err);
        return;
    }
    const msgpack_object *m = ka_gp_frame_map(f);
    static const char *const keys[2] = {"stdout", "stderr"};
    for (int k = 0; k < 2; k++) {
        const char *d;
        size_t n;
        uint64_t off = 0;
        if (ka_gp_get_bytes(m, keys[k], &d, &n)) {
            ka_gp_get_u64(m, "offset", &off);
            uint64_t *b = k ? &p->info.stderr_bytes : &p->info.stdout_bytes;
            if (off + n > *b)
                *b = off + n;
        }
    }
    ka_gp_process_t gp;
    if (ka_gp_frame_process(f, &gp) == 0)
        s_take_process(p, &gp);
    if (p->info.state == KA_PROC_EXITED)
        s_wake(ctx, p);
    else if (ka_gp_frame_is_end(f))
        s_fail(ctx, p, -EPROTO); /* a stream must end with the exit */
}

static void s_on_signal(krt_ctx_t *ctx, s_proc_t *p, const krt_msg_t *msg)
{
    if (msg->len == sizeof(int) && p->info.state == KA_PROC_RUNNING) {
        int sig;
        memcpy(&sig, msg->body, sizeof(sig));
        ka_gl_send(ctx, p->link, ka_gl_req_signal(krt_self(ctx), S_TAG_SIGNAL, p->info.proc, sig));
    }
    krt_reply(ctx, msg, KA_PROC_INFO, &p->info, sizeof(p->info));
}

static void s_on_input(krt_ctx_t *ctx, s_proc_t *p, const krt_msg_t *msg)
{
    if (msg->len >= 1 && p->info.state == KA_PROC_RUNNING) {
        const uint8_t *b = msg->body;
        ka_gl_send(ctx, p->link,
                   ka_gl_req_input(krt_self(ctx), S_TAG_INPUT, p->info.proc, b + 1, msg->len - 1,
                                   (b[0] & KA_PROC_INPUT_CLOSE) != 0));
    }
    krt_reply(ctx, msg, KA_PROC_INFO, &p->info, sizeof(p->info));
}

static void s_on_wait(krt_ctx_t *ctx, s_proc_t *p, const krt_msg_t *msg)
{
    if (s_done(p)) {
        krt_reply(ctx, msg, KA_PROC_INFO, &p->info, sizeof(p->info));
        return;
    }
    if (p->n_waiters == KA_PROC_MAX_WAITERS) {
        ka_process_info_t busy = p->info;
        busy.err = -EBUSY;
        krt_reply(ctx, msg, KA_PROC_INFO, &busy, sizeof(busy));
        return;
    }
    p->waiters[p->n_waiters++] = (s_waiter_t){.from = msg->from, .ref = msg->ref};
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_proc_t *p = state;
    ka_process_args_t *a = arg;
    p->link = a->link;
    ka_gl_req_t *req = a->req;
    a->req = NULL;
    ka_process_args_free(a);
    ka_gl_req_set_owner(req, krt_self(ctx));
    int rc = ka_gl_send(ctx, p->link, req);
    if (rc < 0) {
        p->info.state = KA_PROC_FAILED;
        p->info.err = rc;
    }
    return 0;
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_proc_t *p = state;
    switch (msg->type) {
    case KA_GL_FRAME:
        s_on_frame(ctx, p, msg->body);
        break;
    case KA_GL_CLOSED:
        if (msg->len == sizeof(ka_gl_closed_t) &&
            ((const ka_gl_closed_t *)msg->body)->tag == S_TAG_START)
            s_fail(ctx, p, -ECONNRESET);
        break;
    case KA_PROC_GET:
        krt_reply(ctx, msg, KA_PROC_INFO, &p->info, sizeof(p->info));
        break;
    case KA_PROC_WAIT:
        s_on_wait(ctx, p, msg);
        break;
    case KA_PROC_SIGNAL:
        s_on_signal(ctx, p, msg);
        break;
    case KA_PROC_INPUT:
        s_on_input(ctx, p, msg);
        break;
    case KRT_MSG_STOP:
        krt_exit(ctx, KRT_EXIT_SHUTDOWN);
        break;
    default:
        break;
    }
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    (void)reason;
    s_proc_t *p = state;
    s_wake(ctx, p); /* waiters learn the state as it is */
    ka_gl_forget_t fg = {.owner = krt_self(ctx)};
    krt_send(ctx, p->link, KA_GL_FORGET, &fg, sizeof(fg));
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_proc_t *p = state;
    snprintf(out, cap,
             "{\"state\":%d,\"proc\":%llu,\"pid\":%lld,\"exit_code\":%d,\"stdout\":%llu,"
             "\"stderr\":%llu,\"waiters\":%zu}",
             p->info.state, (unsigned long long)p->info.proc, (long long)p->info.pid,
             p->info.exit_code, (unsigned long long)p->info.stdout_bytes,
             (unsigned long long)p->info.stderr_bytes, p->n_waiters);
}

const krt_behaviour_t ka_process_behaviour = {
    .kind = "process",
    .state_size = sizeof(s_proc_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
