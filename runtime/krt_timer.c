/*
 * Timers: a hierarchical timing wheel per scheduler (1 ms tick, 6 levels of 64 slots, about
 * 795 days of range), entries embedded in actor state.
 *
 * A timer is armed in the wheel of the scheduler its owner runs on; the wheel's lock guards its
 * buckets and the ARMED->FIRED transition. Firing pushes a KRT_NK_TIMER node carrying the timer
 * and its seq (a request's timeout: a KRT_NK_REQ_TIMEOUT carrying the request's ref, looked up
 * again at delivery, since a reply handled in between frees the entry); every arm and cancel
 * bumps seq, so a fired message whose timer was cancelled or
 * re-armed in the meantime is dropped at delivery ("cancel during fire" is safe). An actor's
 * timers that are not idle sit on its ext->timers list, so reaping can cancel them.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A krt_send_after timer: allocated, fires once, then frees itself. */
typedef struct krt_heap_tmr {
    krt_tmr_t t;
    krt_addr_t to, from;
    size_t len;
    _Alignas(8) unsigned char body[];
} krt_heap_tmr_t;

/* ---------------------------------------------------------------------------------------- */
/* The wheel                                                                                  */

static void s_tl_init(krt_tlist_t *h)
{
    h->next = h->prev = h;
}

static void s_tl_insert(krt_tlist_t *h, krt_tlist_t *n)
{
    n->next = h;
    n->prev = h->prev;
    h->prev->next = n;
    h->prev = n;
}

static void s_tl_remove(krt_tlist_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = NULL;
}

void krt__wheel_init(krt_wheel_t *w, uint64_t now)
{
    atomic_init(&w->lock.held, false);
    w->now = now;
    w->count = 0;
    for (int l = 0; l < KRT_WHEEL_LEVELS; l++)
        for (unsigned i = 0; i < KRT_WHEEL_SLOTS; i++)
            s_tl_init(&w->slots[l][i]);
}

/* Places t by its expiry relative to w->now (expiry >= now). */
static void s_place(krt_wheel_t *w, krt_tmr_t *t)
{
    uint64_t e = t->expires, delta = e - w->now;
    int level = 0;
    while (level < KRT_WHEEL_LEVELS - 1 && delta >= (UINT64_C(1) << (KRT_WHEEL_BITS * (level + 1))))
        level++;
    if (delta >= (UINT64_C(1) << (KRT_WHEEL_BITS * KRT_WHEEL_LEVELS))) {
        e = w->now + (UINT64_C(1) << (KRT_WHEEL_BITS * KRT_WHEEL_LEVELS)) - 1;
        t->expires = e;
    }
    unsigned slot = (unsigned)(e >> (KRT_WHEEL_BITS * level)) & (KRT_WHEEL_SLOTS - 1);
    s_tl_insert(&w->slots[level][slot], &t->link);
}

void krt__wheel_add(krt_wheel_t *w, krt_tmr_t *t)
{
    if (t->expires <= w->now)
        t->expires = w->now + 1;
    s_place(w, t);
    __atomic_store_n(&w->count, w->count + 1, __ATOMIC_RELAXED);
}

void krt__wheel_add_in(krt_wheel_t *w, krt_tmr_t *t, uint64_t now, uint64_t delay_ms)
{
    if (!w->count && now > w->now)
        __atomic_store_n(&w->now, now, __ATOMIC_RELAXED);
    t->expires = now + delay_ms;
    krt__wheel_add(w, t);
}

void krt__wheel_del(krt_wheel_t *w, krt_tmr_t *t)
{
    s_tl_remove(&t->link);
    __atomic_store_n(&w->count, w->count - 1, __ATOMIC_RELAXED);
}

/* Moves a bucket's entries to a private list (so callbacks may re-arm safely). */
static void s_detach(krt_tlist_t *h, krt_tlist_t *out)
{
    s_tl_init(out);
    if (h->next == h)
        return;
    out->next = h->next;
    out->prev = h->prev;
    out->next->prev = out;
    out->prev->next = out;
    s_tl_init(h);
}

void krt__wheel_advance(krt_wheel_t *w, uint64_t now, krt_fire_fn fire, void *user)
{
    while (w->now < now) {
        if (!w->count) {
            __atomic_store_n(&w->now, now, __ATOMIC_RELAXED);
            return;
        }
        uint64_t tick = w->now + 1;
        __atomic_store_n(&w->now, tick, __ATOMIC_RELAXED);
        for (int l = 1; l < KRT_WHEEL_LEVELS; l++) {
            if (tick & ((UINT64_C(1) << (KRT_WHEEL_BITS * l)) - 1))
                break;
            unsigned slot = (unsigned)(tick >> (KRT_WHEEL_BITS * l)) & (KRT_WHEEL_SLOTS - 1);
            krt_tlist_t tmp;
            s_detach(&w->slots[l][slot], &tmp);
            while (tmp.next != &tmp) {
                krt_tmr_t *t = (krt_tmr_t *)tmp.next;
                s_tl_remove(&t->link);
                s_place(w, t);
            }
        }
        krt_tlist_t due;
        s_detach(&w->slots[0][tick & (KRT_WHEEL_SLOTS - 1)], &due);
        while (due.next != &due) {
            krt_tmr_t *t = (krt_tmr_t *)due.next;
            s_tl_remove(&t->link);
            __atomic_store_n(&w->count, w->count - 1, __ATOMIC_RELAXED);
            fire(user, t);
        }
    }
}

uint64_t krt__wheel_next(const krt_wheel_t *w)
{
    uint64_t best = UINT64_MAX;
    if (!w->count)
        return best;
    for (int l = 0; l < KRT_WHEEL_LEVELS; l++) {
        unsigned shift = KRT_WHEEL_BITS * (unsigned)l;
        for (uint64_t k = 1; k <= KRT_WHEEL_SLOTS; k++) {
            uint64_t tick = ((w->now >> shift) + k) << shift; /* level l is looked at then */
            if (tick >= best)
                break;
            const krt_tlist_t *h = &w->slots[l][(tick >> shift) & (KRT_WHEEL_SLOTS - 1)];
            if (h->next != h) {
                best = tick;
                break;
            }
        }
    }
    return best;
}

int krt__wheel_wait_ms(krt_wheel_t *w, uint64_t now, _Atomic uint64_t *until)
{
    krt__wheel_lock(w);
    uint64_t next = krt__wheel_next(w);
    int ms = -1;
    if (next != UINT64_MAX)
        ms = next <= now + 1 ? 1 : next - now > INT32_MAX ? INT32_MAX : (int)(next - now);
    if (until)
        atomic_store(until, ms < 0 ? UINT64_MAX : now + (uint64_t)ms);
    krt__wheel_unlock(w);
    return ms;
}

/* ---------------------------------------------------------------------------------------- */
/* Scheduler wheels                                                                           */

static void s_list_add(krt_actor_t *a, krt_tmr_t *t)
{
    krt_ext_t *e = a->ext;
    t->aprev = NULL;
    t->anext = e->timers;
    if (e->timers)
        e->timers->aprev = t;
    e->timers = t;
}

static void s_list_del(krt_actor_t *a, krt_tmr_t *t)
{
    if (t->aprev)
        t->aprev->anext = t->anext;
    else
        a->ext->timers = t->anext;
    if (t->anext)
        t->anext->aprev = t->aprev;
    t->anext = t->aprev = NULL;
}

/* Fire callback of scheduler wheels; runs under the wheel lock on that scheduler's thread. */
static void s_fire(void *user, krt_tmr_t *t)
{
    krt_sched_t *s = user;
    if (t->state & KRT_TF_HEAP) {
        krt_heap_tmr_t *h = (krt_heap_tmr_t *)t;
        krt__send_copy(s->sys, h->to, h->from, t->type, 0, KRT_NK_USER, h->body, h->len);
        free(h);
        return;
    }
    t->state = (uint8_t)((t->state & ~KRT_TS_MASK) | KRT_TS_FIRED);
    krt_node_t *n = krt__node_new(s, 0);
    if (!n)
        return; /* stays FIRED: cancel still reports true, the message is lost */
    if (t->state & KRT_TF_REQ) {
        n->kind = KRT_NK_REQ_TIMEOUT;
        n->msg.ref = t->ref;
    } else {
        n->kind = KRT_NK_TIMER;
        n->aux = t->seq;
        n->msg.body = t;
    }
    krt__push(s->sys, t->owner, n);
}

void krt__timers_fire(krt_sched_t *s, uint64_t now)
{
    krt__wheel_lock(&s->wheel);
    krt__wheel_advance(&s->wheel, now, s_fire, s);
    krt__wheel_unlock(&s->wheel);
}

/* The time the current message's timers count from: the clock is read once per message
 * handled (scheduler s clears clock_ms before each), not once per timer. */
static uint64_t s_clock(krt_sched_t *s)
{
    if (!s->clock_ms)
        s->clock_ms = krt_now_ms();
    return s->clock_ms;
}

void krt__tmr_arm(krt_sched_t *s, krt_actor_t *owner, krt_tmr_t *t, uint64_t delay_ms)
{
    if ((t->state & KRT_TS_MASK) != KRT_TS_IDLE)
        krt__tmr_cancel(s->sys, owner, t);
    krt_wheel_t *w = &s->wheel;
    uint64_t now = s_clock(s);
    t->owner = owner;
    t->seq++;
    t->wheel = (uint8_t)s->idx;
    t->state = (uint8_t)((t->state & ~KRT_TS_MASK) | KRT_TS_ARMED);
    krt__wheel_lock(w);
    krt__wheel_add_in(w, t, now, delay_ms);
    krt__wheel_unlock(w);
    s_list_add(owner, t);
}

bool krt__tmr_cancel(krt_system_t *sys, krt_actor_t *owner, krt_tmr_t *t)
{
    if ((t->state & KRT_TS_MASK) == KRT_TS_IDLE)
        return false; /* only this actor moves a timer out of IDLE */
    krt_wheel_t *w = &sys->scheds[t->wheel].wheel;
    krt__wheel_lock(w);
    if ((t->state & KRT_TS_MASK) == KRT_TS_ARMED)
        krt__wheel_del(w, t);
    t->state &= (uint8_t)~KRT_TS_MASK;
    t->seq++;
    krt__wheel_unlock(w);
    s_list_del(owner, t);
    return true;
}

void krt__timers_cancel_all(krt_system_t *sys, krt_actor_t *a)
{
    while (a->ext && a->ext->timers)
        krt__tmr_cancel(sys, a, a->ext->timers);
}

bool krt__timer_deliver(krt_ctx_t *ctx, krt_node_t *n, krt_msg_t *out)
{
    krt_tmr_t *t = (krt_tmr_t *)n->msg.body;
    if ((t->state & KRT_TS_MASK) != KRT_TS_FIRED || t->seq != (uint16_t)n->aux)
        return false; /* cancelled or re-armed after it fired */
    t->state &= (uint8_t)~KRT_TS_MASK;
    s_list_del(ctx->actor, t);
    memset(out, 0, sizeof *out);
    out->type = t->type;
    out->ref = t->ref;
    return true;
}

void krt__wheel_free_heap(krt_wheel_t *w)
{
    for (int l = 0; l < KRT_WHEEL_LEVELS; l++) {
        for (unsigned i = 0; i < KRT_WHEEL_SLOTS; i++) {
            krt_tlist_t *h = &w->slots[l][i];
            krt_tlist_t *n = h->next;
            while (n && n != h) {
                krt_tlist_t *next = n->next;
                krt_tmr_t *t = (krt_tmr_t *)n;
                if (t->state & KRT_TF_HEAP) {
                    s_tl_remove(n);
                    w->count--;
                    free(t);
                }
                n = next;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Public API                                                                                 */

int krt_timer_arm(krt_ctx_t *ctx, krt_timer_t *timer, uint64_t delay_ms, uint32_t type,
                  uint64_t ref)
{
    krt_tmr_t *t = (krt_tmr_t *)timer;
    if (!t || (t->state & (KRT_TF_HEAP | KRT_TF_REQ | KRT_TF_CALL)))
        return KRT_EINVAL;
    if ((t->state & KRT_TS_MASK) != KRT_TS_IDLE && t->owner != ctx->actor)
        return KRT_EINVAL;
    if (!krt__ext(ctx->actor))
        return KRT_ENOMEM;
    if ((t->state & KRT_TS_MASK) != KRT_TS_IDLE)
        krt__tmr_cancel(ctx->sys, ctx->actor, t);
    t->type = type;
    t->ref = ref;
    krt__tmr_arm(ctx->sched, ctx->actor, t, delay_ms);
    return 0;
}

bool krt_timer_cancel(krt_ctx_t *ctx, krt_timer_t *timer)
{
    krt_tmr_t *t = (krt_tmr_t *)timer;
    if (!t || (t->state & KRT_TS_MASK) == KRT_TS_IDLE || t->owner != ctx->actor)
        return false;
    return krt__tmr_cancel(ctx->sys, ctx->actor, t);
}

bool krt_timer_armed(const krt_timer_t *timer)
{
    const krt_tmr_t *t = (const krt_tmr_t *)timer;
    return t && (t->state & KRT_TS_MASK) != KRT_TS_IDLE;
}

int krt_send_after(krt_ctx_t *ctx, krt_addr_t to, uint64_t delay_ms, uint32_t type,
                   const void *body, size_t len)
{
    if (len && !body)
        return KRT_EINVAL;
    krt_heap_tmr_t *h = calloc(1, sizeof *h + len);
    if (!h)
        return KRT_ENOMEM;
    h->to = to;
    h->from = ctx->actor->addr;
    h->len = len;
    if (len)
        memcpy(h->body, body, len);
    h->t.type = type;
    h->t.state = KRT_TF_HEAP | KRT_TS_ARMED;
    h->t.wheel = (uint8_t)ctx->sched->idx;
    krt_wheel_t *w = &ctx->sched->wheel;
    uint64_t now = s_clock(ctx->sched);
    krt__wheel_lock(w);
    krt__wheel_add_in(w, &h->t, now, delay_ms);
    krt__wheel_unlock(w);
    return 0;
}

int64_t krt_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t krt_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
