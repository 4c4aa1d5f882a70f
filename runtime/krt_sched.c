/*
 * Schedulers: run queues (FIFO, a young stack for spawns) with a LIFO slot, work stealing, waking
 * and parking on a futex, and running an actor: one turn of its mailbox, each message dispatched by
 * kind, signals, reaping.
 */
#include "krt_int.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

__thread krt_sched_t *krt__tls;

static void s_futex_wait(_Atomic uint32_t *w, uint32_t val, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, timeout_ms >= 0 ? &ts : NULL, NULL, 0);
}

void krt__futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Run queues, waking and parking                                                            */

void krt__spin_wait(krt_spin_t *l)
{
    for (unsigned spins = 0;; spins++) {
        if (krt__spin_trylock(l))
            return;
        if (spins < 64)
            krt__relax();
        else
            sched_yield(); /* the holder may be preempted: let it run */
    }
}

void krt__lock_wait(krt_lock_t *l)
{
    for (int spins = 0; spins < 100; spins++) {
        uint32_t unheld = 0;
        if (atomic_load_explicit(&l->state, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&l->state, &unheld, 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
        krt__relax();
    }
    /* Marked as waited for, so that the holder's unlock wakes us; we hold the lock once the
     * exchange finds it free (and it stays marked: at worst one wake-up too many). */
    while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
        s_futex_wait(&l->state, 2, -1);
}

/* Appends the chain first..last (linked through run_next) to s's FIFO queue; rq_lock held. */
static void s_fifo_append(krt_sched_t *s, krt_actor_t *first, krt_actor_t *last)
{
    last->run_next = NULL;
    if (s->rq_tail)
        s->rq_tail->run_next = first;
    else
        s->rq_head = first;
    s->rq_tail = last;
}

static krt_actor_t *s_fifo_take(krt_sched_t *s)
{
    krt_actor_t *a = s->rq_head;
    if (a) {
        s->rq_head = a->run_next;
        if (!s->rq_head)
            s->rq_tail = NULL;
    }
    return a;
}

/* Puts a on top of s's young stack; a full stack's oldest moves to the FIFO queue. rq_lock
 * held; the caller counts a in rq_len. */
static void s_young_put(krt_sched_t *s, krt_actor_t *a)
{
    if (s->young_hi - s->young_lo == KRT_YOUNG_CAP) {
        krt_actor_t *old = s->young[s->young_lo++ % KRT_YOUNG_CAP];
        s_fifo_append(s, old, old);
    }
    s->young[s->young_hi++ % KRT_YOUNG_CAP] = a;
}

/* The newest young actor, or the oldest; NULL if there is none. rq_lock held. */
static krt_actor_t *s_young_take(krt_sched_t *s, bool oldest)
{
    if (s->young_lo == s->young_hi)
        return NULL;
    return oldest ? s->young[s->young_lo++ % KRT_YOUNG_CAP]
                  : s->young[--s->young_hi % KRT_YOUNG_CAP];
}

static void s_rq_push(krt_sched_t *s, krt_actor_t *a)
{
    krt__spin_lock(&s->rq_lock);
    s_fifo_append(s, a, a);
    atomic_fetch_add(&s->rq_len, 1);
    krt__spin_unlock(&s->rq_lock);
}

/* The owner's next actor from its queues: the newest young one, except that every other pop
 * serves the FIFO queue first and every KRT_YOUNG_AGE-th takes the oldest young one, so neither
 * the queue nor the bottom of the stack waits for a spawning tree to finish. */
static krt_actor_t *s_rq_pop(krt_sched_t *s)
{
    if (!atomic_load_explicit(&s->rq_len, memory_order_relaxed))
        return NULL;
    uint32_t tick = ++s->pops;
    krt__spin_lock(&s->rq_lock);
    krt_actor_t *a = (tick & 1) ? s_fifo_take(s) : NULL;
    if (!a)
        a = s_young_take(s, tick % KRT_YOUNG_AGE == 0);
    if (!a)
        a = s_fifo_take(s);
    if (a)
        atomic_fetch_sub_explicit(&s->rq_len, 1, memory_order_relaxed);
    krt__spin_unlock(&s->rq_lock);
    return a;
}

/* Takes the older half of v's young stack (v->rq_lock held, released here): returns the
 * oldest, the rest go onto s's young stack in their order. NULL if v has none. */
static krt_actor_t *s_steal_young(krt_sched_t *s, krt_sched_t *v)
{
    krt_actor_t *got[KRT_YOUNG_CAP / 2];
    uint32_t take = (v->young_hi - v->young_lo + 1) / 2;
    for (uint32_t k = 0; k < take; k++)
        got[k] = v->young[v->young_lo++ % KRT_YOUNG_CAP];
    atomic_fetch_sub(&v->rq_len, take);
    krt__spin_unlock(&v->rq_lock);
    if (take > 1) {
        krt__spin_lock(&s->rq_lock);
        for (uint32_t k = 1; k < take; k++)
            s_young_put(s, got[k]);
        atomic_fetch_add(&s->rq_len, take - 1);
        krt__spin_unlock(&s->rq_lock);
    }
    return take ? got[0] : NULL;
}

/* Takes the first half of v's FIFO queue, at most KRT_STEAL_MAX (v->rq_lock held, released
 * here): returns the first, the rest join s's queue. NULL if v's queue is empty. */
static krt_actor_t *s_steal_fifo(krt_sched_t *s, krt_sched_t *v)
{
    krt_actor_t *first = v->rq_head, *last = first;
    uint32_t take = 1;
    if (first) {
        uint32_t len = atomic_load_explicit(&v->rq_len, memory_order_relaxed);
        for (; take < (len + 1) / 2 && take < KRT_STEAL_MAX && last->run_next; take++)
            last = last->run_next;
        v->rq_head = last->run_next;
        if (!v->rq_head)
            v->rq_tail = NULL;
        atomic_fetch_sub(&v->rq_len, take);
    }
    krt__spin_unlock(&v->rq_lock);
    if (first && first != last) {
        krt__spin_lock(&s->rq_lock);
        s_fifo_append(s, first->run_next, last);
        atomic_fetch_add(&s->rq_len, take - 1);
        krt__spin_unlock(&s->rq_lock);
    }
    return first;
}

/* Takes half of a victim's young stack (its oldest), else half of its FIFO queue: returns one
 * actor and queues the rest locally. */
static krt_actor_t *s_steal(krt_sched_t *s)
{
    krt_system_t *sys = s->sys;
    for (int i = 1; i < sys->n_sched; i++) {
        krt_sched_t *v = &sys->scheds[(s->idx + i) % sys->n_sched];
        if (!atomic_load_explicit(&v->rq_len, memory_order_relaxed))
            continue;
        if (!krt__spin_trylock(&v->rq_lock))
            continue;
        krt_actor_t *a = v->young_lo != v->young_hi ? s_steal_young(s, v) : s_steal_fifo(s, v);
        if (a)
            return a;
    }
    return NULL;
}

static void s_wake(krt_sched_t *s)
{
    if (atomic_load(&s->parked) && atomic_exchange(&s->wake, 1) == 0)
        krt__futex_wake(&s->wake);
}

static void s_wake_one(krt_system_t *sys, krt_sched_t *except)
{
    for (int i = 0; i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        if (s != except && atomic_load(&s->parked) && atomic_load(&s->wake) == 0) {
            s_wake(s);
            return;
        }
    }
}

/* Whether a scheduler other than me polls for work or is parked. */
static bool s_any_idle(krt_system_t *sys, krt_sched_t *me)
{
    for (int i = 0; i < sys->n_sched; i++)
        if (&sys->scheds[i] != me &&
            atomic_load_explicit(&sys->scheds[i].idle, memory_order_relaxed))
            return true;
    return false;
}

/* A long turn that keeps producing work: let an idle scheduler take our queued actors, except
 * the one this turn keeps sending to. Run beside its producer, that consumer reads each message
 * on a line the producer's core just wrote, the producer reuses nodes the consumer's core last
 * read, and the consumer runs dry and is handed over again batch after batch: on the 2-core
 * development VM (2026-12-07) counting_1m's driver then took ~150 ns a send, 6-9 M msgs/s,
 * against ~17 ns a send and 26-30 M with the counter run after the turn on the driver's core
 * (where cross-core lines are cheap that parallel mode reached 97 M, 2026-12-02; no cheap
 * measure tells the two hosts apart, so the safe side is taken). */
void krt__share_work(krt_system_t *sys, krt_sched_t *me)
{
    if (!s_any_idle(sys, me))
        return;
    if (me->next && me->next->addr != me->out_last) {
        /* a polling scheduler steals it from the queue; a parked one is woken */
        s_rq_push(me, me->next);
        me->next = NULL;
    }
    if (atomic_load(&sys->n_parked) && atomic_load_explicit(&me->rq_len, memory_order_relaxed))
        s_wake_one(sys, me);
}

/* Puts a (whose sched flag the caller just set to 1) on a run queue. spawned: a new actor
 * (on a scheduler, it goes to the young stack). */
void krt__schedule(krt_system_t *sys, krt_actor_t *a, bool spawned)
{
    krt_sched_t *me = krt__self_sched(sys);
    if (me && spawned) {
        krt__spin_lock(&me->rq_lock);
        s_young_put(me, a);
        uint32_t len = atomic_fetch_add(&me->rq_len, 1) + 1;
        krt__spin_unlock(&me->rq_lock);
        if (len > 1 && atomic_load(&sys->n_parked))
            s_wake_one(sys, me);
        return;
    }
    if (me) {
        /* LIFO slot: the actor just made runnable runs next on this thread (message locality,
         * depth-first spawning); the one it displaces goes to the stealable queue. */
        krt_actor_t *old = me->next;
        me->next = a;
        if (old) {
            s_rq_push(me, old);
            if (atomic_load(&sys->n_parked))
                s_wake_one(sys, me);
        }
        return;
    }
    krt_sched_t *s = &sys->scheds[atomic_fetch_add(&sys->rr, 1) % (uint32_t)sys->n_sched];
    s_rq_push(s, a);
    if (atomic_load(&s->parked))
        s_wake(s);
    else if (atomic_load(&sys->n_parked))
        s_wake_one(sys, s);
}

static bool s_any_work(krt_system_t *sys)
{
    for (int i = 0; i < sys->n_sched; i++)
        if (atomic_load(&sys->scheds[i].rq_len))
            return true;
    return false;
}

static uint64_t s_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleeps until woken (or the next timer); returns how long it slept in ns (0: work came first). */
static uint64_t s_park(krt_sched_t *s)
{
    krt_system_t *sys = s->sys;
    uint64_t slept = 0;
    atomic_store(&s->wake, 0);
    atomic_store(&s->parked, 1);
    atomic_fetch_add(&sys->n_parked, 1);
    if (!s_any_work(sys) && !atomic_load(&sys->quit)) {
        uint64_t t0 = s_ns();
        /* Only this thread arms timers on its wheel, so none can come due earlier meanwhile. */
        s_futex_wait(&s->wake, 0, krt__wheel_wait_ms(&s->wheel, krt_now_ms(), NULL));
        slept = s_ns() - t0;
        atomic_fetch_add_explicit(&s->wakeups, 1, memory_order_relaxed);
    }
    atomic_store(&s->parked, 0);
    atomic_fetch_sub(&sys->n_parked, 1);
    return slept;
}

/* Sets signal bits on a (kept alive by the caller) and makes sure it runs. */
void krt__signal(krt_system_t *sys, krt_actor_t *a, uint32_t bits)
{
    atomic_fetch_or(&a->sig, bits);
    if (atomic_load(&a->sched) == 0 && atomic_exchange(&a->sched, 1) == 0)
        krt__schedule(sys, a, false);
}

/* ---------------------------------------------------------------------------------------- */
/* Running an actor                                                                           */

static void s_handle(krt_ctx_t *ctx, krt_actor_t *a, krt_node_t *n, const krt_msg_t *m)
{
    ctx->node = n;
    a->b->handle(ctx, a->state, m);
    ctx->node = NULL;
}

static void s_exit_signal(krt_ctx_t *ctx, krt_actor_t *a, krt_node_t *n, bool link)
{
    int reason = (int)n->aux;
    if (a->flags & KRT_AF_TRAP) {
        krt_exit_t e = {n->msg.from, reason};
        krt_msg_t m = {.type = KRT_MSG_EXIT, .len = sizeof e, .body = &e};
        s_handle(ctx, a, n, &m);
    } else if (!(link && reason == KRT_EXIT_NORMAL)) {
        krt_exit(ctx, reason);
    }
}

static void s_dispatch(krt_sched_t *s, krt_actor_t *a, krt_node_t *n)
{
    krt_ctx_t *ctx = &s->ctx;
    if (n->kind == KRT_NK_USER && n->msg.type != KRT_MSG_STOP) { /* the common case first */
        s_handle(ctx, a, n, &n->msg);
        krt__node_free(s, n);
        return;
    }
    krt_msg_t tm;
    switch (n->kind) {
    case KRT_NK_REPLY:
        if (krt__request_reply(ctx, n))
            s_handle(ctx, a, n, &n->msg);
        break;
    case KRT_NK_REQUEST:
        ctx->replied = false;
        s_handle(ctx, a, n, &n->msg);
        if (!ctx->replied && n->msg.from != KRT_ADDR_NONE) {
            if (krt_addr_node(n->msg.from) != s->sys->node_id)
                krt__remote_interest(s->sys, a);
            krt__rel_add(a, KRT_REL_REQ_IN, n->msg.from, n->msg.ref);
        }
        break;
    case KRT_NK_USER: /* KRT_MSG_STOP */
        s_handle(ctx, a, n, &n->msg);
        if (!(a->flags & (KRT_AF_EXITING | KRT_AF_SUPERVISOR)))
            krt_exit(ctx, KRT_EXIT_SHUTDOWN);
        break;
    case KRT_NK_INIT: {
        int rc = a->b->init ? a->b->init(ctx, a->state, (void *)n->msg.body) : 0;
        if (rc)
            krt_exit(ctx, rc);
        else
            a->flags |= KRT_AF_INITED;
        break;
    }
    case KRT_NK_REQ_TIMEOUT:
        krt__request_expired(ctx, n->msg.ref);
        break;
    case KRT_NK_TIMER:
        if (krt__timer_deliver(ctx, n, &tm))
            s_handle(ctx, a, n, &tm);
        break;
    case KRT_NK_LINK:
        if (krt_addr_node(n->msg.from) != s->sys->node_id)
            krt__remote_interest(s->sys, a);
        krt__rel_add(a, KRT_REL_LINK, n->msg.from, 0);
        break;
    case KRT_NK_UNLINK:
        krt__rel_del(a, KRT_REL_LINK, n->msg.from, 0, NULL);
        break;
    case KRT_NK_MONITOR:
        if (krt_addr_node(n->msg.from) != s->sys->node_id)
            krt__remote_interest(s->sys, a);
        krt__rel_add(a, KRT_REL_MON_IN, n->msg.from, n->msg.ref);
        break;
    case KRT_NK_NODEDOWN:
        krt__remote_nodedown(ctx, (uint16_t)n->aux);
        break;
    case KRT_NK_DEMONITOR: /* a monitor, or a request answered by another actor */
        if (!krt__rel_del(a, KRT_REL_MON_IN, 0, n->msg.ref, NULL))
            krt__rel_del(a, KRT_REL_REQ_IN, n->msg.from, n->msg.ref, NULL);
        break;
    case KRT_NK_EXIT:
        s_exit_signal(ctx, a, n, false);
        break;
    case KRT_NK_LINKEXIT:
        if (krt__rel_del(a, KRT_REL_LINK, n->msg.from, 0, NULL))
            s_exit_signal(ctx, a, n, true);
        break;
    case KRT_NK_DOWN:
        if (krt__rel_del(a, KRT_REL_MON_OUT, 0, n->msg.ref, NULL)) {
            tm = n->msg;
            tm.type = KRT_MSG_DOWN;
            tm.from = KRT_ADDR_NONE;
            s_handle(ctx, a, n, &tm);
        }
        break;
    default:
        break;
    }
    krt__node_free(s, n);
}

/* Out-of-band signals: kill, shutdown (children first), poke (a child went away). */
static void s_signals(krt_sched_t *s, krt_actor_t *a)
{
    krt_system_t *sys = s->sys;
    uint32_t sig = atomic_exchange(&a->sig, 0);
    if (sig & KRT_SIG_KILL) {
        krt_exit(&s->ctx, atomic_load(&a->sig_reason));
        return;
    }
    if (sig & KRT_SIG_SHUTDOWN)
        atomic_fetch_or(&a->aflags, KRT_AAF_SHUTDOWN);
    if (!(atomic_load(&a->aflags) & KRT_AAF_SHUTDOWN))
        return;
    krt__lock(&sys->tree_lock);
    if (!a->first_child) {
        krt_exit(&s->ctx, KRT_EXIT_SHUTDOWN);
    } else if (a->flags & KRT_AF_SUPERVISOR) {
        krt__signal(sys, a->first_child, KRT_SIG_SHUTDOWN); /* newest first, one at a time */
    } else if (sig & KRT_SIG_SHUTDOWN) {
        for (krt_actor_t *c = a->first_child; c; c = c->next_sib)
            krt__signal(sys, c, KRT_SIG_SHUTDOWN);
    }
    krt__unlock(&sys->tree_lock);
}

void krt__cleanup(krt_system_t *sys, krt_sched_t *s, krt_actor_t *a);

static void s_reap(krt_sched_t *s, krt_actor_t *a)
{
    krt_ctx_t *ctx = &s->ctx;
    ctx->node = NULL;
    s->clock_ms = 0;
    krt__slot_kill(s->sys, a); /* no new messages or pins; then terminate sees a quiet actor */
    if (a->b->terminate && (a->flags & KRT_AF_INITED))
        a->b->terminate(ctx, a->state, a->exit_reason);
    krt__cleanup(s->sys, s, a);
}

static void s_run(krt_sched_t *s, krt_actor_t *a)
{
    krt_system_t *sys = s->sys;
    s->ctx.actor = a;
    s->ctx.node = NULL;
    s->turn_sends = 0;
    s->out_on = true;
    uint32_t n = 0;
    while (n < sys->budget) {
        s->clock_ms = 0; /* timers armed from here count from a new clock reading */
        if (atomic_load_explicit(&a->sig, memory_order_relaxed)) {
            s_signals(s, a);
            if (a->flags & KRT_AF_EXITING)
                break;
        }
        krt_mlink_t *l = krt__mb_pop(a);
        if (!l)
            break;
        /* counted before the handler: a depth read during a long turn counts what waits */
        atomic_store_explicit(&a->popped,
                              atomic_load_explicit(&a->popped, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        n++;
        s_dispatch(s, a, (krt_node_t *)l);
        krt__out_end(s); /* what the handler sent; before a reap, as the batch may pin a */
        if (a->flags & KRT_AF_EXITING)
            break;
    }
    s->out_on = false;
    if (n) {
        atomic_store_explicit(&s->handled,
                              atomic_load_explicit(&s->handled, memory_order_relaxed) + n,
                              memory_order_relaxed);
    }
    if (a->flags & KRT_AF_EXITING) {
        s_reap(s, a);
        return;
    }
    if (krt__mb_tail_busy(a) || atomic_load(&a->sig) || n == sys->budget) {
        s_rq_push(s, a);
        return;
    }
    /* Going idle. Once sched is 0 another scheduler may run a, stop it and free it: our
     * hazard pointer makes that reaper wait while we re-check for late messages. The hazard
     * store needs no fence of its own: a reaper runs a only after an exchange of sched that
     * reads our store of 0 (directly or through the inspector's CAS, which read it), so it
     * happens before the reaper's loads of the hazard. */
    atomic_store_explicit(&s->hazard, a, memory_order_relaxed);
    atomic_store(&a->sched, 0);
    if ((krt__mb_head_busy(a) || atomic_load(&a->sig)) && atomic_exchange(&a->sched, 1) == 0)
        s_rq_push(s, a);
    atomic_store_explicit(&s->hazard, NULL, memory_order_release);
}

/* Runs describe on an idle actor, owning it for the duration (sched 0 -> 2 -> 0). Caller holds
 * the tree lock, so a cannot be freed. False if the actor is busy. */
bool krt__describe(krt_system_t *sys, krt_actor_t *a, char *buf, size_t cap)
{
    uint32_t idle = 0;
    if (!a->b->describe || !atomic_compare_exchange_strong(&a->sched, &idle, 2))
        return false;
    buf[0] = 0;
    a->b->describe(a->state, buf, cap);
    atomic_store(&a->sched, 0);
    if ((krt__mb_head_busy(a) || atomic_load(&a->sig)) && atomic_exchange(&a->sched, 1) == 0)
        krt__schedule(sys, a, false);
    return true;
}

/* The end of a turn: what this thread sent remotely goes out. */
static void s_flush(krt_sched_t *s)
{
    if (!s->remote_dirty)
        return;
    s->remote_dirty = false;
    s->rt.flush(s->rt.self);
}

static void s_timers(krt_sched_t *s)
{
    if (!__atomic_load_n(&s->wheel.count, __ATOMIC_RELAXED))
        return;
    uint64_t now = krt_now_ms();
    if (now > __atomic_load_n(&s->wheel.now, __ATOMIC_RELAXED))
        krt__timers_fire(s, now);
}

/* Nothing to run: polls the run queues up to s->spin times, then parks. The count doubles when
 * work came soon (found while polling, or a park shorter than KRT_PARK_SHORT_NS) and halves
 * after a long park: a scheduler whose idle spells outlast any spin (each waits on a remote
 * reply) stops burning ~25 µs of CPU per spell that the threads it waits for need, while one
 * whose work comes back within a spin keeps spinning. */
static void s_idle(krt_sched_t *s)
{
    atomic_store_explicit(&s->idle, true, memory_order_relaxed);
    bool soon = s->next != NULL;
    for (uint32_t i = 0; i < s->spin && !soon; i++) {
        krt__relax();
        soon = s_any_work(s->sys);
    }
    if (!soon)
        soon = s_park(s) < KRT_PARK_SHORT_NS;
    if (soon)
        s->spin = s->spin * 2 < KRT_SPIN_MAX ? s->spin * 2 : KRT_SPIN_MAX;
    else
        s->spin = s->spin / 2 > KRT_SPIN_MIN ? s->spin / 2 : KRT_SPIN_MIN;
    atomic_store_explicit(&s->idle, false, memory_order_relaxed);
}

void *krt__sched_main(void *arg)
{
    krt_sched_t *s = arg;
    krt_system_t *sys = s->sys;
    krt__tls = s;
    uint32_t turns = 0;
    while (!atomic_load_explicit(&sys->quit, memory_order_relaxed)) {
        krt_actor_t *a = s->next;
        if (a && s->next_streak < sys->budget) {
            s->next = NULL;
            s->next_streak++;
        } else {
            if (a) { /* the LIFO slot had its share: let the queue run */
                s->next = NULL;
                s_rq_push(s, a);
            }
            s->next_streak = 0;
            a = s_rq_pop(s);
        }
        if (!a)
            a = s_steal(s);
        if (a) {
            s_run(s, a);
            if ((++turns & 15) == 0)
                s_timers(s);
            s_flush(s);
            continue;
        }
        s_timers(s);
        s_flush(s);
        s_idle(s);
    }
    krt__tls = NULL;
    return NULL;
}
