/*
 * Blocking work and the outside world: job threads (krt_job_submit), an epoll poller thread
 * (krt_fd_watch; it also ticks the timeouts of krt_call_async), and the table of calls made
 * from non-actor threads (krt_call, krt_call_async).
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define KRT_CALL_BUCKETS 256
#define KRT_EV_WAKE      UINT64_MAX

typedef struct krt_job {
    struct krt_job *next;
    int (*fn)(void *);
    void *arg;
    krt_addr_t to;
    uint64_t ref;
} krt_job_t;

typedef struct krt_callrec {
    krt_tmr_t timer; /* async timeout in the global wheel; must stay first */
    struct krt_callrec *next;
    uint64_t ref;
    krt_addr_t to;
    bool async;
    krt_call_cb cb;
    void *user;
    pthread_cond_t cond;
    bool done;
    int err;
    krt_reply_t reply;
} krt_callrec_t;

typedef struct krt_watch {
    krt_addr_t to;
    uint64_t tag;
    bool active;
} krt_watch_t;

struct krt_io {
    krt_system_t *sys;
    pthread_mutex_t job_lock;
    pthread_cond_t job_cond;
    krt_job_t *jhead, *jtail;
    bool jquit;
    pthread_t *jthreads;
    int n_jthreads;
    int epfd, evfd;
    pthread_t poller;
    bool poller_started;
    _Atomic int pquit;
    pthread_mutex_t watch_lock;
    krt_watch_t *watches;
    int cap_watches;
    pthread_mutex_t call_lock;
    krt_callrec_t *calls[KRT_CALL_BUCKETS];
    _Atomic uint64_t call_seq;
    krt_wheel_t gwheel;
    _Atomic uint64_t poll_until; /* when the sleeping poller wakes by itself (UINT64_MAX: never) */
};

/* ---------------------------------------------------------------------------------------- */
/* Calls                                                                                      */

static krt_callrec_t **s_call_slot(krt_io_t *io, uint64_t ref)
{
    krt_callrec_t **pp = &io->calls[(ref * 0x9E3779B97F4A7C15ull) >> 56];
    while (*pp && (*pp)->ref != ref)
        pp = &(*pp)->next;
    return pp;
}

/* Removes the call from the table (call_lock held); NULL if it is gone. */
static krt_callrec_t *s_call_take(krt_io_t *io, uint64_t ref)
{
    krt_callrec_t **pp = s_call_slot(io, ref), *r = *pp;
    if (r)
        *pp = r->next;
    return r;
}

static void s_call_put(krt_io_t *io, krt_callrec_t *r)
{
    krt_callrec_t **head = &io->calls[(r->ref * 0x9E3779B97F4A7C15ull) >> 56];
    r->next = *head;
    *head = r;
}

/* The async record r is ours (taken from the table): run its callback, stop its timer, free. */
static void s_async_finish(krt_io_t *io, krt_callrec_t *r, int err, const krt_msg_t *reply)
{
    r->cb(r->user, err, reply);
    krt__wheel_lock(&io->gwheel);
    if ((r->timer.state & KRT_TS_MASK) == KRT_TS_ARMED)
        krt__wheel_del(&io->gwheel, &r->timer);
    krt__wheel_unlock(&io->gwheel);
    free(r);
}

static void s_finish(krt_system_t *sys, uint64_t ref, int err, krt_addr_t from, uint32_t type,
                     int32_t status, const void *body, size_t len, bool *found)
{
    krt_io_t *io = sys->io;
    krt__out_sync(sys); /* the caller may send next to an actor the replier just sent to */
    pthread_mutex_lock(&io->call_lock);
    krt_callrec_t *r = s_call_take(io, ref);
    bool async = r && r->async; /* a blocking record may vanish once we unlock */
    if (r && !async) {
        r->err = err;
        if (!err) {
            r->reply.type = type;
            r->reply.status = status;
            r->reply.len = (uint32_t)len;
            r->reply.body = malloc(len ? len : 1);
            if (!r->reply.body)
                r->err = KRT_ENOMEM;
            else if (len)
                memcpy(r->reply.body, body, len);
        }
        r->done = true;
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&io->call_lock);
    if (found)
        *found = r != NULL;
    if (async) {
        krt_msg_t m = {type, (uint32_t)len, from, ref, body, status, KRT_KIND_REPLY};
        s_async_finish(io, r, err ? err : status, err ? NULL : &m);
    }
}

bool krt__call_complete(krt_system_t *sys, uint64_t ref, krt_addr_t from, uint32_t type,
                        int32_t status, const void *body, size_t len)
{
    bool found;
    s_finish(sys, ref, 0, from, type, status, body, len, &found);
    return found;
}

void krt__call_fail(krt_system_t *sys, uint64_t ref, int err)
{
    s_finish(sys, ref, err, KRT_ADDR_NONE, 0, 0, NULL, 0, NULL);
}

static uint64_t s_call_ref(krt_io_t *io)
{
    return KRT_CALL_REF_BIT | (atomic_fetch_add(&io->call_seq, 1) + 1);
}

/* The sender of a call: none locally; this node's service address for a remote target, so
 * the reply comes back through the transport. */
static krt_addr_t s_call_from(krt_system_t *sys, krt_addr_t to)
{
    return krt_addr_node(to) == sys->node_id ? KRT_ADDR_NONE : krt_node_addr(sys->node_id);
}

void krt__calls_fail_node(krt_system_t *sys, uint16_t node)
{
    krt_io_t *io = sys->io;
    for (;;) {
        uint64_t ref = 0;
        pthread_mutex_lock(&io->call_lock);
        for (size_t b = 0; !ref && b < KRT_CALL_BUCKETS; b++)
            for (krt_callrec_t *r = io->calls[b]; r && !ref; r = r->next)
                if (krt_addr_node(r->to) == node && r->to != KRT_ADDR_NONE)
                    ref = r->ref;
        pthread_mutex_unlock(&io->call_lock);
        if (!ref)
            return;
        krt__call_fail(sys, ref, KRT_ENOCONN);
    }
}

int krt_call(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len,
             int timeout_ms, krt_reply_t *reply)
{
    if (!sys || !reply)
        return KRT_EINVAL;
    memset(reply, 0, sizeof *reply);
    if (krt__self_sched(sys))
        return KRT_EINVAL; /* would block a scheduler: use krt_request */
    krt_io_t *io = sys->io;
    krt_callrec_t r;
    memset(&r, 0, sizeof r);
    r.ref = s_call_ref(io);
    r.to = to;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&io->call_lock);
    s_call_put(io, &r);
    pthread_mutex_unlock(&io->call_lock);
    int rc = krt__send_copy(sys, to, s_call_from(sys, to), type, r.ref, KRT_NK_REQUEST, body, len);
    pthread_mutex_lock(&io->call_lock);
    if (rc) {
        if (s_call_take(io, r.ref)) {
            pthread_mutex_unlock(&io->call_lock);
            pthread_cond_destroy(&r.cond);
            return rc;
        }
    }
    struct timespec dl;
    krt_deadline(CLOCK_MONOTONIC, timeout_ms, &dl);
    while (!r.done) {
        int w = timeout_ms < 0 ? pthread_cond_wait(&r.cond, &io->call_lock)
                               : pthread_cond_timedwait(&r.cond, &io->call_lock, &dl);
        if (w != 0 && !r.done && s_call_take(io, r.ref)) {
            r.done = true;
            r.err = KRT_ETIMEDOUT;
        }
    }
    pthread_mutex_unlock(&io->call_lock);
    pthread_cond_destroy(&r.cond);
    if (r.err == 0)
        *reply = r.reply;
    return r.err;
}

void krt_reply_free(krt_reply_t *reply)
{
    if (!reply)
        return;
    free(reply->body);
    memset(reply, 0, sizeof *reply);
}

static void s_wake_poller(krt_io_t *io)
{
    uint64_t one = 1;
    ssize_t n = write(io->evfd, &one, sizeof one);
    (void)n;
}

int krt_call_async(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len,
                   int timeout_ms, krt_call_cb cb, void *user)
{
    if (!sys || !cb)
        return KRT_EINVAL;
    krt_io_t *io = sys->io;
    krt_callrec_t *r = calloc(1, sizeof *r);
    if (!r)
        return KRT_ENOMEM;
    r->ref = s_call_ref(io);
    r->to = to;
    r->async = true;
    r->cb = cb;
    r->user = user;
    r->timer.state = KRT_TF_CALL;
    r->timer.ref = r->ref;
    /* Arm before sending (the reply may come at once); both under call_lock for the table. */
    pthread_mutex_lock(&io->call_lock);
    s_call_put(io, r);
    pthread_mutex_unlock(&io->call_lock);
    if (timeout_ms > 0) {
        uint64_t now = krt_now_ms();
        krt__wheel_lock(&io->gwheel);
        r->timer.state = KRT_TF_CALL | KRT_TS_ARMED;
        krt__wheel_add_in(&io->gwheel, &r->timer, now, (uint64_t)timeout_ms);
        bool late = r->timer.expires < atomic_load(&io->poll_until); /* it sleeps past this */
        krt__wheel_unlock(&io->gwheel);
        if (late)
            s_wake_poller(io);
    }
    int rc = krt__send_copy(sys, to, s_call_from(sys, to), type, r->ref, KRT_NK_REQUEST, body, len);
    if (rc) {
        pthread_mutex_lock(&io->call_lock);
        krt_callrec_t *mine = s_call_take(io, r->ref);
        pthread_mutex_unlock(&io->call_lock);
        if (mine) { /* nobody else will touch it: drop it without the callback */
            krt__wheel_lock(&io->gwheel);
            if ((r->timer.state & KRT_TS_MASK) == KRT_TS_ARMED)
                krt__wheel_del(&io->gwheel, &r->timer);
            krt__wheel_unlock(&io->gwheel);
            free(r);
            return rc;
        }
        return 0; /* a timeout or failure already owns it and will call back */
    }
    return 0;
}

/* Global wheel fire: runs under gwheel.lock; collects the calls it wins (takes from the table). */
typedef struct krt_tick {
    krt_io_t *io;
    krt_callrec_t *won;
} krt_tick_t;

static void s_call_fire(void *user, krt_tmr_t *t)
{
    krt_tick_t *tk = user;
    t->state &= (uint8_t)~KRT_TS_MASK;
    pthread_mutex_lock(&tk->io->call_lock);
    krt_callrec_t *mine = s_call_take(tk->io, t->ref);
    pthread_mutex_unlock(&tk->io->call_lock);
    if (mine) {
        mine->next = tk->won;
        tk->won = mine;
    }
}

static void s_tick_calls(krt_io_t *io)
{
    krt_tick_t tk = {io, NULL};
    krt__wheel_lock(&io->gwheel);
    krt__wheel_advance(&io->gwheel, krt_now_ms(), s_call_fire, &tk);
    krt__wheel_unlock(&io->gwheel);
    while (tk.won) {
        krt_callrec_t *r = tk.won;
        tk.won = r->next;
        r->cb(r->user, KRT_ETIMEDOUT, NULL);
        free(r);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Poller                                                                                     */

static void s_fd_event(krt_io_t *io, int fd, uint32_t ev)
{
    krt_fd_event_t e = {fd, 0, 0};
    krt_addr_t to = KRT_ADDR_NONE;
    pthread_mutex_lock(&io->watch_lock);
    if (fd < io->cap_watches && io->watches[fd].active) {
        io->watches[fd].active = false;
        to = io->watches[fd].to;
        e.tag = io->watches[fd].tag;
    }
    pthread_mutex_unlock(&io->watch_lock);
    if (to == KRT_ADDR_NONE)
        return;
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
        e.events |= KRT_FD_READ;
    if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        e.events |= KRT_FD_WRITE;
    krt__send_copy(io->sys, to, KRT_ADDR_NONE, KRT_MSG_FD_READY, 0, KRT_NK_USER, &e, sizeof e);
}

static void *s_poller_main(void *arg)
{
    krt_io_t *io = arg;
    struct epoll_event evs[64];
    while (!atomic_load(&io->pquit)) {
        int timeout = krt__wheel_wait_ms(&io->gwheel, krt_now_ms(), &io->poll_until);
        int n = epoll_wait(io->epfd, evs, 64, timeout);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == KRT_EV_WAKE) {
                uint64_t v;
                ssize_t r = read(io->evfd, &v, sizeof v);
                (void)r;
            } else {
                s_fd_event(io, (int)evs[i].data.u64, evs[i].events);
            }
        }
        if (__atomic_load_n(&io->gwheel.count, __ATOMIC_RELAXED))
            s_tick_calls(io);
    }
    return NULL;
}

int krt_fd_watch(krt_ctx_t *ctx, int fd, uint32_t events, uint64_t tag)
{
    krt_io_t *io = ctx->sys->io;
    if (fd < 0 || !(events & (KRT_FD_READ | KRT_FD_WRITE)))
        return KRT_EINVAL;
    pthread_mutex_lock(&io->watch_lock);
    if (fd >= io->cap_watches) {
        int cap = io->cap_watches ? io->cap_watches : 64;
        while (cap <= fd)
            cap *= 2;
        krt_watch_t *w = realloc(io->watches, (size_t)cap * sizeof *w);
        if (!w) {
            pthread_mutex_unlock(&io->watch_lock);
            return KRT_ENOMEM;
        }
        memset(w + io->cap_watches, 0, (size_t)(cap - io->cap_watches) * sizeof *w);
        io->watches = w;
        io->cap_watches = cap;
    }
    io->watches[fd] = (krt_watch_t){ctx->actor->addr, tag, true};
    struct epoll_event ev = {0};
    ev.events = EPOLLONESHOT | ((events & KRT_FD_READ) ? EPOLLIN | EPOLLRDHUP : 0) |
                ((events & KRT_FD_WRITE) ? EPOLLOUT : 0);
    ev.data.u64 = (uint64_t)fd;
    int rc = 0;
    if (epoll_ctl(io->epfd, EPOLL_CTL_MOD, fd, &ev) != 0) {
        if (errno != ENOENT || epoll_ctl(io->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            rc = -errno;
            io->watches[fd].active = false;
        }
    }
    pthread_mutex_unlock(&io->watch_lock);
    return rc;
}

int krt_fd_unwatch(krt_ctx_t *ctx, int fd)
{
    krt_io_t *io = ctx->sys->io;
    if (fd < 0)
        return KRT_EINVAL;
    pthread_mutex_lock(&io->watch_lock);
    if (fd < io->cap_watches)
        io->watches[fd].active = false;
    epoll_ctl(io->epfd, EPOLL_CTL_DEL, fd, NULL);
    pthread_mutex_unlock(&io->watch_lock);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Jobs                                                                                       */

static void *s_job_main(void *arg)
{
    krt_io_t *io = arg;
    for (;;) {
        pthread_mutex_lock(&io->job_lock);
        while (!io->jhead && !io->jquit)
            pthread_cond_wait(&io->job_cond, &io->job_lock);
        krt_job_t *j = io->jhead;
        if (!j) {
            pthread_mutex_unlock(&io->job_lock);
            return NULL;
        }
        io->jhead = j->next;
        if (!io->jhead)
            io->jtail = NULL;
        pthread_mutex_unlock(&io->job_lock);
        krt_job_done_t d = {j->arg, j->fn(j->arg)};
        krt__send_copy(io->sys, j->to, KRT_ADDR_NONE, KRT_MSG_JOB_DONE, j->ref, KRT_NK_USER, &d,
                       sizeof d);
        free(j);
    }
}

int krt_job_submit(krt_ctx_t *ctx, int (*fn)(void *arg), void *arg, uint64_t *ref)
{
    krt_io_t *io = ctx->sys->io;
    if (!fn)
        return KRT_EINVAL;
    krt_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return KRT_ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->to = ctx->actor->addr;
    j->ref = krt__new_ref(ctx);
    krt__out_sync(ctx->sys);
    uint64_t r = j->ref; /* j belongs to the job thread once queued: never read it after */
    pthread_mutex_lock(&io->job_lock);
    if (io->jquit) {
        pthread_mutex_unlock(&io->job_lock);
        free(j);
        return KRT_ESHUTDOWN;
    }
    if (io->jtail)
        io->jtail->next = j;
    else
        io->jhead = j;
    io->jtail = j;
    pthread_cond_signal(&io->job_cond);
    pthread_mutex_unlock(&io->job_lock);
    if (ref)
        *ref = r;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle                                                                                  */

krt_io_t *krt__io_new(krt_system_t *sys)
{
    krt_io_t *io = calloc(1, sizeof *io);
    if (!io)
        return NULL;
    io->sys = sys;
    io->epfd = epoll_create1(EPOLL_CLOEXEC);
    io->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&io->job_lock, NULL);
    pthread_cond_init(&io->job_cond, NULL);
    pthread_mutex_init(&io->watch_lock, NULL);
    pthread_mutex_init(&io->call_lock, NULL);
    krt__wheel_init(&io->gwheel, krt_now_ms());
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = KRT_EV_WAKE};
    if (io->epfd < 0 || io->evfd < 0 || epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->evfd, &ev) != 0) {
        krt__io_destroy(&io);
        return NULL;
    }
    return io;
}

int krt__io_start(krt_io_t *io)
{
    io->jthreads = calloc((size_t)io->sys->n_jobs, sizeof(pthread_t));
    if (!io->jthreads)
        return KRT_ENOMEM;
    for (int i = 0; i < io->sys->n_jobs; i++) {
        if (pthread_create(&io->jthreads[i], NULL, s_job_main, io) != 0)
            break;
        io->n_jthreads++;
    }
    if (pthread_create(&io->poller, NULL, s_poller_main, io) != 0)
        return KRT_ENOMEM;
    io->poller_started = true;
    return io->n_jthreads ? 0 : KRT_ENOMEM;
}

void krt__io_stop(krt_io_t *io)
{
    if (!io)
        return;
    pthread_mutex_lock(&io->job_lock);
    io->jquit = true;
    pthread_cond_broadcast(&io->job_cond);
    pthread_mutex_unlock(&io->job_lock);
    for (int i = 0; i < io->n_jthreads; i++)
        pthread_join(io->jthreads[i], NULL);
    io->n_jthreads = 0;
    while (io->jhead) {
        krt_job_t *j = io->jhead;
        io->jhead = j->next;
        free(j);
    }
    io->jtail = NULL;
    if (io->poller_started) {
        atomic_store(&io->pquit, 1);
        s_wake_poller(io);
        pthread_join(io->poller, NULL);
        io->poller_started = false;
    }
    /* Outstanding async calls fail now; blocking callers time out on their own. */
    for (int b = 0; b < KRT_CALL_BUCKETS; b++) {
        pthread_mutex_lock(&io->call_lock);
        krt_callrec_t *r = io->calls[b], **pp = &io->calls[b];
        while (r && !r->async) {
            pp = &r->next;
            r = r->next;
        }
        if (r)
            *pp = r->next;
        pthread_mutex_unlock(&io->call_lock);
        if (r) {
            s_async_finish(io, r, KRT_ESHUTDOWN, NULL);
            b--;
        }
    }
}

void krt__io_destroy(krt_io_t **io_p)
{
    if (!io_p || !*io_p)
        return;
    krt_io_t *io = *io_p;
    *io_p = NULL;
    krt__io_stop(io);
    free(io->jthreads);
    free(io->watches);
    if (io->epfd >= 0)
        close(io->epfd);
    if (io->evfd >= 0)
        close(io->evfd);
    pthread_mutex_destroy(&io->job_lock);
    pthread_cond_destroy(&io->job_cond);
    pthread_mutex_destroy(&io->watch_lock);
    pthread_mutex_destroy(&io->call_lock);
    free(io);
}
