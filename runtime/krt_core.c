/*
 * krt core: address slots, message nodes, mailboxes, schedulers, spawn/send/exit, links and
 * monitors, reaping and system lifecycle. See krt_int.h for the memory model.
 */
#include "krt_int.h"

#include <linux/futex.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __thread krt_sched_t *s_tls;

#define KRT_STOP_WAIT_MS 10000

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                              */

const char *krt_strerror(int err)
{
    switch (err) {
    case KRT_OK:
        return "ok";
    case KRT_ENOACTOR:
        return "no such actor";
    case KRT_ETIMEDOUT:
        return "timed out";
    case KRT_ENOMEM:
        return "out of memory";
    case KRT_ESHUTDOWN:
        return "system is stopping";
    case KRT_EINVAL:
        return "invalid argument";
    case KRT_EEXIST:
        return "name already registered";
    case KRT_EREMOTE:
        return "node unreachable";
    case KRT_EMSGSIZE:
        return "message too large or not sendable off-node";
    default:
        return err < 0 ? strerror(-err) : "unknown error";
    }
}

uint64_t krt_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void s_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void s_futex_wait(_Atomic uint32_t *w, uint32_t val, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, val, timeout_ms >= 0 ? &ts : NULL, NULL, 0);
}

static void s_futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

krt_sched_t *krt__self_sched(krt_system_t *sys)
{
    return (s_tls && s_tls->sys == sys) ? s_tls : NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Message nodes: per-scheduler free lists, batches exchanged through the system.
 * Scheduler threads carve small nodes from slabs (KRT_NF_SLAB: never freed one by one; the
 * slabs go with the system). Other threads malloc them; those are freed once the system keeps
 * more than KRT_POOL_MAX_BATCHES spare batches. */

typedef struct krt_slab {
    struct krt_slab *next;
    _Alignas(16) unsigned char nodes[];
} krt_slab_t;

/* Frees the malloc'd nodes of a chain and returns the slab ones, relinked, counting them. */
static krt_mlink_t *s_free_chain(krt_mlink_t *l, uint32_t *kept)
{
    krt_mlink_t *keep = NULL;
    uint32_t n = 0;
    while (l) {
        krt_mlink_t *next = atomic_load_explicit(&l->next, memory_order_relaxed);
        if (((krt_node_t *)l)->flags & KRT_NF_SLAB) {
            atomic_store_explicit(&l->next, keep, memory_order_relaxed);
            keep = l;
            n++;
        } else {
            free(l);
        }
        l = next;
    }
    if (kept)
        *kept = n;
    return keep;
}

/* Adds a batch of n nodes to the system's spares (pool_lock held); false if out of memory. */
static bool s_batch_put(krt_system_t *sys, krt_mlink_t *batch, uint32_t n)
{
    if (sys->n_batches == sys->cap_batches) {
        uint32_t cap = sys->cap_batches ? sys->cap_batches * 2 : 16;
        krt_batch_t *nb = realloc(sys->batches, cap * sizeof *nb);
        if (!nb)
            return false;
        sys->batches = nb;
        sys->cap_batches = cap;
    }
    sys->batches[sys->n_batches++] = (krt_batch_t){batch, n};
    return true;
}

static bool s_pool_refill(krt_sched_t *s)
{
    krt_system_t *sys = s->sys;
    krt_batch_t b = {NULL, 0};
    pthread_mutex_lock(&sys->pool_lock);
    if (sys->n_batches)
        b = sys->batches[--sys->n_batches];
    pthread_mutex_unlock(&sys->pool_lock);
    if (!b.head) {
        krt_slab_t *slab = malloc(sizeof *slab + (size_t)KRT_POOL_BATCH * KRT_NODE_SIZE);
        if (!slab)
            return false;
        for (uint32_t i = 0; i < KRT_POOL_BATCH; i++) {
            krt_node_t *n = (krt_node_t *)(slab->nodes + (size_t)i * KRT_NODE_SIZE);
            n->flags = KRT_NF_SLAB;
            atomic_store_explicit(&n->link.next, b.head, memory_order_relaxed);
            b.head = &n->link;
        }
        b.n = KRT_POOL_BATCH;
        pthread_mutex_lock(&sys->pool_lock);
        slab->next = sys->slabs;
        sys->slabs = slab;
        pthread_mutex_unlock(&sys->pool_lock);
    }
    s->pool = b.head;
    s->pool_n = b.n;
    return true;
}

static void s_pool_spill(krt_sched_t *s)
{
    krt_system_t *sys = s->sys;
    krt_mlink_t *batch = s->pool, *last = batch;
    uint32_t n = KRT_POOL_BATCH;
    for (uint32_t i = 1; i < n; i++)
        last = atomic_load_explicit(&last->next, memory_order_relaxed);
    s->pool = atomic_load_explicit(&last->next, memory_order_relaxed);
    atomic_store_explicit(&last->next, NULL, memory_order_relaxed);
    s->pool_n -= n;
    pthread_mutex_lock(&sys->pool_lock);
    if (sys->n_batches >= KRT_POOL_MAX_BATCHES) {
        pthread_mutex_unlock(&sys->pool_lock);
        batch = s_free_chain(batch, &n);
        if (!batch)
            return;
        pthread_mutex_lock(&sys->pool_lock);
    }
    if (!s_batch_put(sys, batch, n)) {
        pthread_mutex_unlock(&sys->pool_lock);
        s_free_chain(batch, NULL); /* slab nodes stay with their slab */
        return;
    }
    pthread_mutex_unlock(&sys->pool_lock);
}

krt_node_t *krt__node_new(krt_sched_t *s, size_t len)
{
    krt_node_t *n;
    uint16_t flags = 0;
    if (len <= KRT_INLINE_CAP) {
        if (s && (s->pool || s_pool_refill(s))) {
            n = (krt_node_t *)s->pool;
            s->pool = atomic_load_explicit(&s->pool->next, memory_order_relaxed);
            s->pool_n--;
            flags = n->flags & KRT_NF_SLAB;
        } else {
            n = malloc(KRT_NODE_SIZE);
        }
    } else {
        if (len > UINT32_MAX)
            return NULL;
        n = malloc(sizeof(krt_node_t) + len);
        flags = KRT_NF_BIG;
    }
    if (!n)
        return NULL;
    memset(&n->msg, 0, sizeof n->msg);
    n->kind = KRT_NK_USER;
    n->flags = flags;
    n->aux = 0;
    return n;
}

void krt__node_free(krt_sched_t *s, krt_node_t *n)
{
    if ((n->flags & KRT_NF_PTR) && !(n->flags & KRT_NF_TAKEN)) {
        krt_free_fn free_fn;
        memcpy(&free_fn, n->data, sizeof free_fn);
        if (free_fn)
            free_fn((void *)n->msg.body);
    }
    if (n->flags & KRT_NF_BIG) {
        free(n);
        return;
    }
    n->flags &= KRT_NF_SLAB;
    if (!s) {
        if (!(n->flags & KRT_NF_SLAB))
            free(n);
        return; /* a slab node freed off-scheduler stays unused until its slab goes */
    }
    atomic_store_explicit(&n->link.next, s->pool, memory_order_relaxed);
    s->pool = &n->link;
    if (++s->pool_n >= 2 * KRT_POOL_BATCH)
        s_pool_spill(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Slots                                                                                      */

static krt_slot_t *s_slot(krt_system_t *sys, uint32_t idx)
{
    krt_slot_t *c = atomic_load_explicit(&sys->chunks[idx >> KRT_CHUNK_BITS], memory_order_acquire);
    return c ? &c[idx & (KRT_CHUNK_SIZE - 1)] : NULL;
}

static krt_slot_t *s_slot_make(krt_system_t *sys, uint32_t idx)
{
    krt_slot_t *slot = s_slot(sys, idx);
    if (slot)
        return slot;
    krt_slot_t *c = calloc(KRT_CHUNK_SIZE, sizeof *c), *expect = NULL;
    if (!c)
        return NULL;
    if (!atomic_compare_exchange_strong(&sys->chunks[idx >> KRT_CHUNK_BITS], &expect, c))
        free(c);
    return s_slot(sys, idx);
}

static int s_slot_alloc(krt_system_t *sys, krt_sched_t *s, uint32_t *out)
{
    uint32_t idx = 0;
    if (s && s->n_free_slots) {
        idx = s->free_slots[--s->n_free_slots];
    } else {
        pthread_mutex_lock(&sys->slot_lock);
        if (sys->n_gfree)
            idx = sys->gfree[--sys->n_gfree];
        pthread_mutex_unlock(&sys->slot_lock);
    }
    if (!idx) {
        if (s) {
            if (s->fresh_next == s->fresh_end) {
                s->fresh_next = atomic_fetch_add(&sys->next_slot, 64);
                s->fresh_end = s->fresh_next + 64;
            }
            idx = s->fresh_next++;
        } else {
            idx = atomic_fetch_add(&sys->next_slot, 1);
        }
        if (idx > KRT_SLOT_MASK)
            return KRT_ENOMEM;
    }
    if (!s_slot_make(sys, idx))
        return KRT_ENOMEM;
    *out = idx;
    return 0;
}

static void s_push_idx(uint32_t **arr, uint32_t *n, uint32_t *cap, uint32_t idx)
{
    if (*n == *cap) {
        uint32_t nc = *cap ? *cap * 2 : 256;
        uint32_t *na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return; /* the slot is lost, never reused: harmless */
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = idx;
}

/* Returns the slot to a free list with its generation bumped (retired when exhausted). */
static void s_slot_free(krt_system_t *sys, krt_sched_t *s, uint32_t idx)
{
    krt_slot_t *slot = s_slot(sys, idx);
    uint64_t gen = (atomic_load(&slot->word) >> 32) + 1;
    atomic_store_explicit(&slot->actor, NULL, memory_order_relaxed);
    atomic_store_explicit(&slot->word, gen << 32, memory_order_release);
    if (gen > KRT_GEN_MAX)
        return;
    if (s) {
        s_push_idx(&s->free_slots, &s->n_free_slots, &s->cap_free_slots, idx);
    } else {
        pthread_mutex_lock(&sys->slot_lock);
        s_push_idx(&sys->gfree, &sys->n_gfree, &sys->cap_gfree, idx);
        pthread_mutex_unlock(&sys->slot_lock);
    }
}

krt_actor_t *krt__acquire(krt_system_t *sys, krt_addr_t addr)
{
    uint64_t local = addr & KRT_LOCAL_MASK;
    uint32_t idx = (uint32_t)(local & KRT_SLOT_MASK);
    uint64_t gen = local >> KRT_SLOT_BITS;
    if (!idx || !gen || krt_addr_node(addr) != sys->node_id)
        return NULL;
    krt_slot_t *slot = s_slot(sys, idx);
    if (!slot)
        return NULL;
    uint64_t w = atomic_load_explicit(&slot->word, memory_order_relaxed);
    do {
        if ((w >> 32) != gen || !(w & KRT_SLOT_ALIVE))
            return NULL;
    } while (!atomic_compare_exchange_weak_explicit(&slot->word, &w, w + 1, memory_order_acquire,
                                                    memory_order_relaxed));
    return atomic_load_explicit(&slot->actor, memory_order_relaxed);
}

void krt__release(krt_system_t *sys, krt_addr_t addr)
{
    krt_slot_t *slot = s_slot(sys, (uint32_t)(addr & KRT_SLOT_MASK));
    atomic_fetch_sub_explicit(&slot->word, 1, memory_order_release);
}

/* Marks the actor dead and waits until no sender holds it. */
static void s_slot_kill(krt_system_t *sys, krt_actor_t *a)
{
    krt_slot_t *slot = s_slot(sys, (uint32_t)(a->addr & KRT_SLOT_MASK));
    atomic_fetch_and(&slot->word, ~KRT_SLOT_ALIVE);
    for (int spins = 0; atomic_load_explicit(&slot->word, memory_order_acquire) & KRT_SLOT_REFS;
         spins++) {
        if (spins < 100)
            s_relax();
        else
            sched_yield();
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Mailbox: Vyukov's intrusive MPSC queue                                                     */

static void s_mb_init(krt_actor_t *a)
{
    atomic_store_explicit(&a->mb_stub.next, NULL, memory_order_relaxed);
    atomic_store_explicit(&a->mb_head, &a->mb_stub, memory_order_relaxed);
    a->mb_tail = &a->mb_stub;
}

static inline void s_mb_push(krt_actor_t *a, krt_mlink_t *n)
{
    atomic_store_explicit(&n->next, NULL, memory_order_relaxed);
    krt_mlink_t *prev = atomic_exchange_explicit(&a->mb_head, n, memory_order_seq_cst);
    atomic_store_explicit(&prev->next, n, memory_order_release);
}

/* NULL when empty, or when a producer is between its two steps (the caller retries later). */
static krt_mlink_t *s_mb_pop(krt_actor_t *a)
{
    krt_mlink_t *tail = a->mb_tail;
    krt_mlink_t *next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (tail == &a->mb_stub) {
        if (!next)
            return NULL;
        a->mb_tail = next;
        tail = next;
        next = atomic_load_explicit(&next->next, memory_order_acquire);
    }
    if (next) {
        a->mb_tail = next;
        return tail;
    }
    if (tail != atomic_load_explicit(&a->mb_head, memory_order_acquire))
        return NULL;
    s_mb_push(a, &a->mb_stub);
    next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (next) {
        a->mb_tail = next;
        return tail;
    }
    return NULL;
}

/* Consumer-side part of "has messages": true if the consumer end holds something. */
static inline bool s_mb_tail_busy(krt_actor_t *a)
{
    return a->mb_tail != &a->mb_stub ||
           atomic_load_explicit(&a->mb_stub.next, memory_order_acquire) != NULL;
}

/* Producer-side part: valid only after s_mb_tail_busy was false. */
static inline bool s_mb_head_busy(krt_actor_t *a)
{
    return atomic_load_explicit(&a->mb_head, memory_order_seq_cst) != &a->mb_stub;
}

/* ---------------------------------------------------------------------------------------- */
/* Run queues, waking and parking                                                            */

static void s_rq_push(krt_sched_t *s, krt_actor_t *a)
{
    a->run_next = NULL;
    pthread_mutex_lock(&s->rq_lock);
    if (s->rq_tail)
        s->rq_tail->run_next = a;
    else
        s->rq_head = a;
    s->rq_tail = a;
    atomic_fetch_add(&s->rq_len, 1);
    pthread_mutex_unlock(&s->rq_lock);
}

static krt_actor_t *s_rq_pop(krt_sched_t *s)
{
    if (!atomic_load_explicit(&s->rq_len, memory_order_relaxed))
        return NULL;
    pthread_mutex_lock(&s->rq_lock);
    krt_actor_t *a = s->rq_head;
    if (a) {
        s->rq_head = a->run_next;
        if (!s->rq_head)
            s->rq_tail = NULL;
        atomic_fetch_sub_explicit(&s->rq_len, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->rq_lock);
    return a;
}

/* Takes half of a victim's queue: returns one actor and queues the rest locally. */
static krt_actor_t *s_steal(krt_sched_t *s)
{
    krt_system_t *sys = s->sys;
    for (int i = 1; i < sys->n_sched; i++) {
        krt_sched_t *v = &sys->scheds[(s->idx + i) % sys->n_sched];
        if (!atomic_load_explicit(&v->rq_len, memory_order_relaxed))
            continue;
        if (pthread_mutex_trylock(&v->rq_lock) != 0)
            continue;
        uint32_t len = atomic_load_explicit(&v->rq_len, memory_order_relaxed);
        uint32_t take = (len + 1) / 2;
        krt_actor_t *first = v->rq_head, *last = first;
        if (!first) {
            pthread_mutex_unlock(&v->rq_lock);
            continue;
        }
        for (uint32_t k = 1; k < take; k++)
            last = last->run_next;
        v->rq_head = last->run_next;
        if (!v->rq_head)
            v->rq_tail = NULL;
        atomic_fetch_sub(&v->rq_len, take);
        pthread_mutex_unlock(&v->rq_lock);
        last->run_next = NULL;
        krt_actor_t *rest = first->run_next;
        while (rest) {
            krt_actor_t *next = rest->run_next;
            s_rq_push(s, rest);
            rest = next;
        }
        return first;
    }
    return NULL;
}

static void s_wake(krt_sched_t *s)
{
    if (atomic_load(&s->parked) && atomic_exchange(&s->wake, 1) == 0)
        s_futex_wake(&s->wake);
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

/* A long turn that keeps producing work: let an idle scheduler take our queued actors. */
static void s_share_work(krt_system_t *sys, krt_sched_t *me)
{
    if (!atomic_load(&sys->n_parked))
        return;
    if (me->next) {
        s_rq_push(me, me->next);
        me->next = NULL;
    }
    if (atomic_load_explicit(&me->rq_len, memory_order_relaxed))
        s_wake_one(sys, me);
}

/* Puts a (whose sched flag the caller just set to 1) on a run queue. fifo: a new actor, which
 * must start after those spawned before it. */
static void s_schedule_x(krt_system_t *sys, krt_actor_t *a, bool fifo)
{
    krt_sched_t *me = krt__self_sched(sys);
    if (me && fifo) {
        s_rq_push(me, a);
        if (atomic_load(&sys->n_parked) &&
            atomic_load_explicit(&me->rq_len, memory_order_relaxed) > 1)
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

static void s_schedule(krt_system_t *sys, krt_actor_t *a)
{
    s_schedule_x(sys, a, false);
}

static bool s_any_work(krt_system_t *sys)
{
    for (int i = 0; i < sys->n_sched; i++)
        if (atomic_load(&sys->scheds[i].rq_len))
            return true;
    return false;
}

static void s_park(krt_sched_t *s)
{
    krt_system_t *sys = s->sys;
    atomic_store(&s->wake, 0);
    atomic_store(&s->parked, 1);
    atomic_fetch_add(&sys->n_parked, 1);
    if (!s_any_work(sys) && !atomic_load(&sys->quit)) {
        bool timers = __atomic_load_n(&s->wheel.count, __ATOMIC_RELAXED) != 0;
        s_futex_wait(&s->wake, 0, timers ? 1 : -1);
    }
    atomic_store(&s->parked, 0);
    atomic_fetch_sub(&sys->n_parked, 1);
}

/* Sets signal bits on a (kept alive by the caller) and makes sure it runs. */
static void s_signal(krt_system_t *sys, krt_actor_t *a, uint32_t bits)
{
    atomic_fetch_or(&a->sig, bits);
    if (atomic_load(&a->sched) == 0 && atomic_exchange(&a->sched, 1) == 0)
        s_schedule(sys, a);
}

void krt__push(krt_system_t *sys, krt_actor_t *a, krt_node_t *n)
{
    /* approximate under concurrent producers (introspection only): no locked instruction */
    atomic_store_explicit(&a->pushed, atomic_load_explicit(&a->pushed, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    s_mb_push(a, &n->link);
    if (atomic_load(&a->sched) == 0 && atomic_exchange(&a->sched, 1) == 0)
        s_schedule(sys, a);
}

/* ---------------------------------------------------------------------------------------- */
/* Sending                                                                                    */

int krt__send_remote(krt_system_t *sys, krt_addr_t to, krt_node_t *n)
{
    int rc;
    if (n->flags & KRT_NF_PTR) {
        rc = KRT_EMSGSIZE;
    } else if (!atomic_load(&sys->has_transport)) {
        rc = KRT_EREMOTE;
    } else {
        pthread_mutex_lock(&sys->transport_lock);
        krt_transport_t t = sys->transport;
        pthread_mutex_unlock(&sys->transport_lock);
        rc = t.send ? t.send(t.self, to, &n->msg) : KRT_EREMOTE;
    }
    krt__node_free(krt__self_sched(sys), n);
    return rc;
}

int krt__send_node(krt_system_t *sys, krt_addr_t to, krt_node_t *n)
{
    if (to == KRT_ADDR_NONE) {
        krt__node_free(krt__self_sched(sys), n);
        return KRT_ENOACTOR;
    }
    if (krt_addr_node(to) != sys->node_id)
        return krt__send_remote(sys, to, n);
    krt_actor_t *a = krt__acquire(sys, to);
    if (!a) {
        krt__node_free(krt__self_sched(sys), n);
        return KRT_ENOACTOR;
    }
    krt__push(sys, a, n);
    krt__release(sys, to);
    return 0;
}

/* The envelope kind of a node kind. */
static inline uint8_t s_env_kind(uint16_t kind)
{
    return kind == KRT_NK_REQUEST ? KRT_KIND_REQUEST
           : kind == KRT_NK_REPLY ? KRT_KIND_REPLY
                                  : KRT_KIND_PLAIN;
}

int krt__send_copy(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint32_t type, uint64_t ref,
                   uint16_t kind, const void *body, size_t len)
{
    return krt__send_env(sys, to, from, type, ref, kind, 0, body, len);
}

int krt__send_env(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint32_t type, uint64_t ref,
                  uint16_t kind, int32_t status, const void *body, size_t len)
{
    if (len && !body)
        return KRT_EINVAL;
    krt_sched_t *me = krt__self_sched(sys);
    if (me && (++me->turn_sends & 63) == 0)
        s_share_work(sys, me);
    krt_node_t *n = krt__node_new(me, len);
    if (!n)
        return KRT_ENOMEM;
    n->kind = kind;
    n->msg.type = type;
    n->msg.len = (uint32_t)len;
    n->msg.from = from;
    n->msg.ref = ref;
    n->msg.status = status;
    n->msg.kind = s_env_kind(kind);
    n->msg.body = n->data;
    if (len)
        memcpy(n->data, body, len);
    return krt__send_node(sys, to, n);
}

void krt__send_sys(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint16_t kind, uint64_t ref,
                   uint32_t aux, const void *body, size_t len)
{
    krt_node_t *n = krt__node_new(krt__self_sched(sys), len);
    if (!n)
        return;
    n->kind = kind;
    n->aux = aux;
    n->msg.from = from;
    n->msg.ref = ref;
    n->msg.len = (uint32_t)len;
    n->msg.body = n->data;
    if (len)
        memcpy(n->data, body, len);
    krt__send_node(sys, to, n);
}

static void s_push_self(krt_ctx_t *ctx, krt_addr_t from, uint16_t kind, uint64_t ref, uint32_t aux,
                        const void *body, size_t len)
{
    krt_node_t *n = krt__node_new(ctx->sched, len);
    if (!n)
        return;
    n->kind = kind;
    n->aux = aux;
    n->msg.from = from;
    n->msg.ref = ref;
    n->msg.len = (uint32_t)len;
    n->msg.body = n->data;
    if (len)
        memcpy(n->data, body, len);
    krt__push(ctx->sys, ctx->actor, n);
}

int krt_send(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, const void *body, size_t len)
{
    return krt__send_copy(ctx->sys, to, ctx->actor->addr, type, 0, KRT_NK_USER, body, len);
}

int krt_send_ptr(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, void *ptr, void (*free_fn)(void *))
{
    krt_node_t *n = krt__node_new(ctx->sched, sizeof(krt_free_fn));
    if (!n) {
        if (free_fn)
            free_fn(ptr);
        return KRT_ENOMEM;
    }
    n->flags |= KRT_NF_PTR;
    memcpy(n->data, &free_fn, sizeof(krt_free_fn));
    n->msg.type = type;
    n->msg.from = ctx->actor->addr;
    n->msg.body = ptr;
    return krt__send_node(ctx->sys, to, n);
}

void *krt_msg_take(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    krt_node_t *n = ctx->node;
    if (!n || &n->msg != msg || !(n->flags & KRT_NF_PTR))
        return NULL;
    n->flags |= KRT_NF_TAKEN;
    return (void *)msg->body;
}

int krt_system_send(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len)
{
    return krt__send_copy(sys, to, KRT_ADDR_NONE, type, 0, KRT_NK_USER, body, len);
}

int krt_system_deliver(krt_system_t *sys, krt_addr_t to, const krt_msg_t *msg)
{
    if (krt_addr_node(to) != sys->node_id)
        return KRT_EREMOTE;
    uint16_t kind = msg->kind == KRT_KIND_REQUEST ? KRT_NK_REQUEST
                    : msg->kind == KRT_KIND_REPLY ? KRT_NK_REPLY
                                                  : KRT_NK_USER;
    int rc = krt__send_env(sys, to, msg->from, msg->type, msg->ref, kind, msg->status, msg->body,
                           msg->len);
    if (rc == KRT_ENOACTOR && kind == KRT_NK_REQUEST && msg->from != KRT_ADDR_NONE)
        krt__request_orphan(sys, to, msg->from, msg->ref);
    return rc;
}

void krt_system_set_transport(krt_system_t *sys, const krt_transport_t *t)
{
    pthread_mutex_lock(&sys->transport_lock);
    if (t)
        sys->transport = *t;
    else
        memset(&sys->transport, 0, sizeof sys->transport);
    atomic_store(&sys->has_transport, t && t->send);
    pthread_mutex_unlock(&sys->transport_lock);
}

uint16_t krt_system_node_id(const krt_system_t *sys)
{
    return sys->node_id;
}

/* ---------------------------------------------------------------------------------------- */
/* Relations (links and monitors), kept by each side in its ext                             */

krt_ext_t *krt__ext(krt_actor_t *a)
{
    if (!a->ext)
        a->ext = calloc(1, sizeof *a->ext);
    return a->ext;
}

static krt_rel_t *s_rel_find(krt_actor_t *a, int kind, krt_addr_t peer, uint64_t ref)
{
    if (!a->ext)
        return NULL;
    for (uint32_t i = 0; i < a->ext->n_rels; i++) {
        krt_rel_t *r = &a->ext->rels[i];
        if (r->kind != kind)
            continue;
        if (kind == KRT_REL_LINK ? r->peer == peer
                                 : r->ref == ref && (kind != KRT_REL_REQ_IN || r->peer == peer))
            return r;
    }
    return NULL;
}

int krt__rel_add(krt_actor_t *a, int kind, krt_addr_t peer, uint64_t ref)
{
    if (kind == KRT_REL_LINK && s_rel_find(a, kind, peer, 0))
        return 0;
    krt_ext_t *e = krt__ext(a);
    if (!e)
        return KRT_ENOMEM;
    if (e->n_rels == e->cap_rels) {
        uint32_t cap = e->cap_rels ? e->cap_rels * 2 : 4;
        krt_rel_t *r = realloc(e->rels, cap * sizeof *r);
        if (!r)
            return KRT_ENOMEM;
        e->rels = r;
        e->cap_rels = cap;
    }
    e->rels[e->n_rels++] = (krt_rel_t){peer, ref, kind};
    return 0;
}

/* Removes the relation; returns true if it existed. */
bool krt__rel_del(krt_actor_t *a, int kind, krt_addr_t peer, uint64_t ref, krt_rel_t *out)
{
    krt_rel_t *r = s_rel_find(a, kind, peer, ref);
    if (!r)
        return false;
    if (out)
        *out = *r;
    *r = a->ext->rels[--a->ext->n_rels];
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* Actor API                                                                                  */

krt_addr_t krt_self(krt_ctx_t *ctx)
{
    return ctx->actor->addr;
}

krt_system_t *krt_ctx_system(krt_ctx_t *ctx)
{
    return ctx->sys;
}

krt_addr_t krt_parent(krt_ctx_t *ctx)
{
    return ctx->actor->spawner;
}

uint64_t krt__new_ref(krt_ctx_t *ctx)
{
    return ((uint64_t)(ctx->sched->idx + 1) << 48) | ++ctx->sched->next_ref;
}

bool krt__stopping(krt_ctx_t *ctx)
{
    return atomic_load(&ctx->sys->stopping) ||
           (atomic_load(&ctx->actor->aflags) & KRT_AAF_SHUTDOWN);
}

void krt_exit(krt_ctx_t *ctx, int reason)
{
    ctx->actor->flags |= KRT_AF_EXITING;
    ctx->actor->exit_reason = reason;
}

void krt_trap_exit(krt_ctx_t *ctx, bool on)
{
    if (on)
        ctx->actor->flags |= KRT_AF_TRAP;
    else
        ctx->actor->flags &= ~(uint32_t)KRT_AF_TRAP;
}

static int s_kill(krt_system_t *sys, krt_addr_t from, krt_addr_t who, int reason)
{
    if (krt_addr_node(who) != sys->node_id)
        return KRT_EREMOTE;
    if (reason != KRT_EXIT_KILLED) {
        krt_node_t *n = krt__node_new(krt__self_sched(sys), 0);
        if (!n)
            return KRT_ENOMEM;
        n->kind = KRT_NK_EXIT;
        n->aux = (uint32_t)reason;
        n->msg.from = from;
        return krt__send_node(sys, who, n);
    }
    krt_actor_t *a = krt__acquire(sys, who);
    if (!a)
        return KRT_ENOACTOR;
    atomic_store(&a->sig_reason, reason);
    s_signal(sys, a, KRT_SIG_KILL);
    krt__release(sys, who);
    return 0;
}

int krt_kill(krt_ctx_t *ctx, krt_addr_t who, int reason)
{
    if (who == ctx->actor->addr) {
        krt_exit(ctx, reason);
        return 0;
    }
    return s_kill(ctx->sys, ctx->actor->addr, who, reason);
}

int krt_system_kill(krt_system_t *sys, krt_addr_t who, int reason)
{
    return s_kill(sys, KRT_ADDR_NONE, who, reason);
}

int krt_link(krt_ctx_t *ctx, krt_addr_t other)
{
    krt_actor_t *a = ctx->actor;
    if (other == a->addr || s_rel_find(a, KRT_REL_LINK, other, 0))
        return 0;
    if (krt_addr_node(other) != ctx->sys->node_id)
        return KRT_EREMOTE;
    int rc = krt__rel_add(a, KRT_REL_LINK, other, 0);
    if (rc)
        return rc;
    krt_node_t *n = krt__node_new(ctx->sched, 0);
    if (!n) {
        krt__rel_del(a, KRT_REL_LINK, other, 0, NULL);
        return KRT_ENOMEM;
    }
    n->kind = KRT_NK_LINK;
    n->msg.from = a->addr;
    if (krt__send_node(ctx->sys, other, n) == KRT_ENOACTOR)
        s_push_self(ctx, other, KRT_NK_LINKEXIT, 0, KRT_EXIT_NOPROC, NULL, 0);
    return 0;
}

int krt_unlink(krt_ctx_t *ctx, krt_addr_t other)
{
    if (krt__rel_del(ctx->actor, KRT_REL_LINK, other, 0, NULL))
        krt__send_sys(ctx->sys, other, ctx->actor->addr, KRT_NK_UNLINK, 0, 0, NULL, 0);
    return 0;
}

uint64_t krt_monitor(krt_ctx_t *ctx, krt_addr_t target)
{
    uint64_t ref = krt__new_ref(ctx);
    krt_down_t d = {target, ref, KRT_EXIT_NOPROC};
    if (krt__rel_add(ctx->actor, KRT_REL_MON_OUT, target, ref) != 0)
        return ref; /* out of memory: no DOWN will ever come */
    if (krt_addr_node(target) != ctx->sys->node_id) {
        d.reason = KRT_EXIT_NOCONN;
        s_push_self(ctx, KRT_ADDR_NONE, KRT_NK_DOWN, ref, 0, &d, sizeof d);
        return ref;
    }
    krt_node_t *n = krt__node_new(ctx->sched, 0);
    if (!n)
        return ref;
    n->kind = KRT_NK_MONITOR;
    n->msg.from = ctx->actor->addr;
    n->msg.ref = ref;
    if (krt__send_node(ctx->sys, target, n) == KRT_ENOACTOR)
        s_push_self(ctx, KRT_ADDR_NONE, KRT_NK_DOWN, ref, 0, &d, sizeof d);
    return ref;
}

void krt_demonitor(krt_ctx_t *ctx, uint64_t ref)
{
    krt_rel_t r;
    if (krt__rel_del(ctx->actor, KRT_REL_MON_OUT, 0, ref, &r))
        krt__send_sys(ctx->sys, r.peer, ctx->actor->addr, KRT_NK_DEMONITOR, ref, 0, NULL, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Spawning                                                                                   */

static void s_tree_insert(krt_actor_t *parent, krt_actor_t *a)
{
    a->parent = parent;
    a->prev_sib = NULL;
    a->next_sib = parent->first_child;
    if (parent->first_child)
        parent->first_child->prev_sib = a;
    parent->first_child = a;
    parent->n_children++;
}

static void s_tree_remove(krt_actor_t *a)
{
    krt_actor_t *p = a->parent;
    if (a->prev_sib)
        a->prev_sib->next_sib = a->next_sib;
    else
        p->first_child = a->next_sib;
    if (a->next_sib)
        a->next_sib->prev_sib = a->prev_sib;
    p->n_children--;
    a->parent = a->next_sib = a->prev_sib = NULL;
}

/* Actor blocks: per-scheduler free lists by 16-byte size class, else calloc/free. */
static size_t s_actor_size(const krt_behaviour_t *b)
{
    return sizeof(krt_actor_t) + ((b->state_size + 15) & ~(size_t)15);
}

static krt_actor_t *s_actor_alloc(krt_sched_t *s, size_t size)
{
    size_t c = size / 16;
    if (s && c < KRT_ACACHE_CLASSES && s->acache[c]) {
        void *blk = s->acache[c];
        memcpy(&s->acache[c], blk, sizeof(void *));
        s->acache_n[c]--;
        memset(blk, 0, size);
        return blk;
    }
    return calloc(1, size);
}

static void s_actor_free(krt_sched_t *s, krt_actor_t *a)
{
    if (a->ext) {
        free(a->ext->rels);
        free(a->ext);
    }
    free(a->name);
    size_t c = s_actor_size(a->b) / 16;
    if (s && c < KRT_ACACHE_CLASSES && s->acache_n[c] < KRT_ACACHE_MAX) {
        memcpy((void *)a, &s->acache[c], sizeof(void *));
        s->acache[c] = a;
        s->acache_n[c]++;
        return;
    }
    free(a);
}

int krt__spawn(krt_system_t *sys, krt_ctx_t *ctx, const krt_behaviour_t *b, void *arg,
               void (*arg_free)(void *), const krt_spawn_opts_t *opts, uint32_t restarts,
               uint32_t flags, krt_addr_t *out)
{
    if (!sys || !b || !b->handle)
        return KRT_EINVAL;
    if (atomic_load(&sys->stopping))
        return KRT_ESHUTDOWN;
    krt_sched_t *s = ctx ? ctx->sched : krt__self_sched(sys);
    krt_actor_t *a = s_actor_alloc(s, s_actor_size(b));
    krt_node_t *init = krt__node_new(s, sizeof(krt_free_fn));
    uint32_t idx = 0;
    int rc = KRT_ENOMEM;
    if (!a || !init)
        goto fail;
    if (opts && opts->name && !(a->name = strdup(opts->name)))
        goto fail;
    if ((rc = s_slot_alloc(sys, s, &idx)) != 0)
        goto fail;
    krt_slot_t *slot = s_slot(sys, idx);
    uint64_t gen = atomic_load(&slot->word) >> 32;
    if (!gen)
        gen = 1;
    a->addr = ((uint64_t)sys->node_id << 48) | (gen << KRT_SLOT_BITS) | idx;
    a->b = b;
    a->spawner = ctx ? ctx->actor->addr : KRT_ADDR_NONE;
    a->flags = flags;
    a->restarts = restarts;
    s_mb_init(a);
    atomic_store_explicit(&a->sched, 1, memory_order_relaxed);
    init->kind = KRT_NK_INIT;
    init->msg.body = arg;
    if (arg_free) {
        init->flags |= KRT_NF_PTR;
        memcpy(init->data, &arg_free, sizeof arg_free);
    }
    atomic_store_explicit(&a->pushed, 1, memory_order_relaxed);
    s_mb_push(a, &init->link);
    init = NULL;
    if (ctx && opts && opts->link) {
        if (krt__rel_add(a, KRT_REL_LINK, ctx->actor->addr, 0) ||
            krt__rel_add(ctx->actor, KRT_REL_LINK, a->addr, 0))
            goto fail_slot;
    }
    if (ctx && opts && opts->monitor) {
        uint64_t ref = krt__new_ref(ctx);
        if (krt__rel_add(a, KRT_REL_MON_IN, ctx->actor->addr, ref) ||
            krt__rel_add(ctx->actor, KRT_REL_MON_OUT, a->addr, ref))
            goto fail_slot;
        if (opts->monitor_ref)
            *opts->monitor_ref = ref;
    }
    if (opts && opts->register_name) {
        if (!opts->name) {
            rc = KRT_EINVAL;
            goto fail_slot;
        }
        if ((rc = krt_reg_insert(sys, opts->name, a->addr, a)) != 0)
            goto fail_slot;
    }
    pthread_mutex_lock(&sys->tree_lock);
    if (atomic_load(&sys->stopping)) {
        pthread_mutex_unlock(&sys->tree_lock);
        if (atomic_load(&a->aflags) & KRT_AAF_REGISTERED)
            krt__reg_release(sys, a->addr);
        rc = KRT_ESHUTDOWN;
        goto fail_slot;
    }
    s_tree_insert(ctx ? ctx->actor : sys->root, a);
    atomic_store_explicit(&slot->actor, a, memory_order_relaxed);
    atomic_store_explicit(&slot->word, (gen << 32) | KRT_SLOT_ALIVE, memory_order_release);
    pthread_mutex_unlock(&sys->tree_lock);
    if (s) {
        atomic_store_explicit(&s->spawned,
                              atomic_load_explicit(&s->spawned, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        atomic_store_explicit(&s->bytes,
                              atomic_load_explicit(&s->bytes, memory_order_relaxed) +
                                  (int64_t)s_actor_size(b),
                              memory_order_relaxed);
    } else {
        atomic_fetch_add(&sys->ext_spawned, 1);
        atomic_fetch_add(&sys->ext_bytes, (int64_t)s_actor_size(b));
    }
    krt_addr_t addr = a->addr;
    s_schedule_x(sys, a, true); /* a may run (and even stop) from here on */
    if (out)
        *out = addr;
    return 0;

fail_slot:
    if (ctx && a->addr) {
        krt__rel_del(ctx->actor, KRT_REL_LINK, a->addr, 0, NULL);
        if (opts && opts->monitor && a->ext && a->ext->n_rels)
            krt__rel_del(ctx->actor, KRT_REL_MON_OUT, 0, a->ext->rels[a->ext->n_rels - 1].ref,
                         NULL);
    }
    {
        krt_mlink_t *l; /* the init node: frees arg through arg_free */
        while ((l = s_mb_pop(a)))
            krt__node_free(s, (krt_node_t *)l);
    }
    arg_free = NULL;
    atomic_store(&slot->word, gen << 32); /* s_slot_free bumps it */
    s_slot_free(sys, s, idx);
fail:
    if (init)
        krt__node_free(s, init);
    if (arg_free)
        arg_free(arg); /* the init node was never queued */
    if (a) {
        a->b = b;
        s_actor_free(s, a);
    }
    return rc;
}

int krt_spawn(krt_ctx_t *ctx, const krt_behaviour_t *b, void *arg, const krt_spawn_opts_t *opts,
              krt_addr_t *out)
{
    return krt__spawn(ctx->sys, ctx, b, arg, NULL, opts, 0, 0, out);
}

int krt_system_spawn(krt_system_t *sys, const krt_behaviour_t *b, void *arg,
                     const krt_spawn_opts_t *opts, krt_addr_t *out)
{
    krt_spawn_opts_t o = {0};
    if (opts) {
        o = *opts;
        o.link = o.monitor = false;
    }
    return krt__spawn(sys, NULL, b, arg, NULL, &o, 0, 0, out);
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
    krt_msg_t tm;
    switch (n->kind) {
    case KRT_NK_REPLY:
        if (krt__request_reply(ctx, n))
            s_handle(ctx, a, n, &n->msg);
        break;
    case KRT_NK_REQUEST:
        ctx->replied = false;
        s_handle(ctx, a, n, &n->msg);
        if (!ctx->replied && n->msg.from != KRT_ADDR_NONE &&
            krt_addr_node(n->msg.from) == s->sys->node_id)
            krt__rel_add(a, KRT_REL_REQ_IN, n->msg.from, n->msg.ref);
        break;
    case KRT_NK_USER:
        if (n->msg.type == KRT_MSG_STOP) {
            s_handle(ctx, a, n, &n->msg);
            if (!(a->flags & (KRT_AF_EXITING | KRT_AF_SUPERVISOR)))
                krt_exit(ctx, KRT_EXIT_SHUTDOWN);
        } else {
            s_handle(ctx, a, n, &n->msg);
        }
        break;
    case KRT_NK_INIT: {
        int rc = a->b->init ? a->b->init(ctx, a->state, (void *)n->msg.body) : 0;
        if (rc)
            krt_exit(ctx, rc);
        else
            a->flags |= KRT_AF_INITED;
        break;
    }
    case KRT_NK_TIMER:
        if (krt__timer_deliver(ctx, n, &tm))
            s_handle(ctx, a, n, &tm);
        break;
    case KRT_NK_LINK:
        krt__rel_add(a, KRT_REL_LINK, n->msg.from, 0);
        break;
    case KRT_NK_UNLINK:
        krt__rel_del(a, KRT_REL_LINK, n->msg.from, 0, NULL);
        break;
    case KRT_NK_MONITOR:
        krt__rel_add(a, KRT_REL_MON_IN, n->msg.from, n->msg.ref);
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
    pthread_mutex_lock(&sys->tree_lock);
    if (!a->n_children) {
        krt_exit(&s->ctx, KRT_EXIT_SHUTDOWN);
    } else if (a->flags & KRT_AF_SUPERVISOR) {
        s_signal(sys, a->first_child, KRT_SIG_SHUTDOWN); /* newest first, one at a time */
    } else if (sig & KRT_SIG_SHUTDOWN) {
        for (krt_actor_t *c = a->first_child; c; c = c->next_sib)
            s_signal(sys, c, KRT_SIG_SHUTDOWN);
    }
    pthread_mutex_unlock(&sys->tree_lock);
}

static void s_cleanup(krt_system_t *sys, krt_sched_t *s, krt_actor_t *a);

static void s_reap(krt_sched_t *s, krt_actor_t *a)
{
    krt_ctx_t *ctx = &s->ctx;
    ctx->node = NULL;
    s_slot_kill(s->sys, a); /* no new messages or pins; then terminate sees a quiet actor */
    if (a->b->terminate && (a->flags & KRT_AF_INITED))
        a->b->terminate(ctx, a->state, a->exit_reason);
    s_cleanup(s->sys, s, a);
}

static void s_run(krt_sched_t *s, krt_actor_t *a)
{
    krt_system_t *sys = s->sys;
    s->ctx.actor = a;
    s->ctx.node = NULL;
    s->turn_sends = 0;
    uint32_t n = 0;
    while (n < sys->budget) {
        if (atomic_load_explicit(&a->sig, memory_order_relaxed)) {
            s_signals(s, a);
            if (a->flags & KRT_AF_EXITING)
                break;
        }
        krt_mlink_t *l = s_mb_pop(a);
        if (!l)
            break;
        atomic_store_explicit(&a->popped,
                              atomic_load_explicit(&a->popped, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        n++;
        s_dispatch(s, a, (krt_node_t *)l);
        if (a->flags & KRT_AF_EXITING)
            break;
    }
    if (n) {
        atomic_store_explicit(&a->handled,
                              atomic_load_explicit(&a->handled, memory_order_relaxed) + n,
                              memory_order_relaxed);
        atomic_store_explicit(&s->handled,
                              atomic_load_explicit(&s->handled, memory_order_relaxed) + n,
                              memory_order_relaxed);
    }
    if (a->flags & KRT_AF_EXITING) {
        s_reap(s, a);
        return;
    }
    if (s_mb_tail_busy(a) || atomic_load(&a->sig) || n == sys->budget) {
        s_rq_push(s, a);
        return;
    }
    /* Going idle. Once sched is 0 another scheduler may run a, stop it and free it: our
     * hazard pointer makes that reaper wait while we re-check for late messages. */
    atomic_store(&s->hazard, a);
    atomic_store(&a->sched, 0);
    if ((s_mb_head_busy(a) || atomic_load(&a->sig)) && atomic_exchange(&a->sched, 1) == 0)
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
    if ((s_mb_head_busy(a) || atomic_load(&a->sig)) && atomic_exchange(&a->sched, 1) == 0)
        s_schedule(sys, a);
    return true;
}

static void s_timers(krt_sched_t *s)
{
    if (!__atomic_load_n(&s->wheel.count, __ATOMIC_RELAXED))
        return;
    uint64_t now = krt_now_ms();
    if (now > __atomic_load_n(&s->wheel.now, __ATOMIC_RELAXED))
        krt__timers_fire(s, now);
}

static void *s_sched_main(void *arg)
{
    krt_sched_t *s = arg;
    krt_system_t *sys = s->sys;
    s_tls = s;
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
            continue;
        }
        s_timers(s);
        bool work = s->next != NULL;
        for (int i = 0; i < 1000 && !work; i++) {
            s_relax();
            work = s_any_work(sys);
        }
        if (!work)
            s_park(s);
    }
    s_tls = NULL;
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Stopping actors                                                                            */

typedef struct krt_waiter {
    struct krt_waiter *next;
    krt_addr_t who;
    int reason;
    bool done;
} krt_waiter_t;

static void s_drain(krt_system_t *sys, krt_sched_t *s, krt_actor_t *a)
{
    krt_mlink_t *l;
    while ((l = s_mb_pop(a))) {
        krt_node_t *n = (krt_node_t *)l;
        if (n->kind == KRT_NK_LINK) {
            krt__send_sys(sys, n->msg.from, a->addr, KRT_NK_LINKEXIT, 0, KRT_EXIT_NOPROC, NULL, 0);
        } else if (n->kind == KRT_NK_MONITOR) {
            krt_down_t d = {a->addr, n->msg.ref, KRT_EXIT_NOPROC};
            krt__send_sys(sys, n->msg.from, KRT_ADDR_NONE, KRT_NK_DOWN, n->msg.ref, 0, &d,
                          sizeof d);
        } else if ((n->kind == KRT_NK_USER || n->kind == KRT_NK_REQUEST) &&
                   n->msg.from == KRT_ADDR_NONE && (n->msg.ref & KRT_CALL_REF_BIT)) {
            krt__call_fail(sys, n->msg.ref, KRT_ENOACTOR);
        } else if (n->kind == KRT_NK_REQUEST) {
            krt__request_orphan(sys, a->addr, n->msg.from, n->msg.ref);
        }
        krt__node_free(s, n);
    }
}

/* Everything after terminate: the actor is already marked dead in its slot. */
static void s_cleanup(krt_system_t *sys, krt_sched_t *s, krt_actor_t *a)
{
    int reason = a->exit_reason;
    krt__timers_cancel_all(sys, a);
    krt__requests_drop(sys, a);
    if (atomic_load(&a->aflags) & KRT_AAF_REGISTERED)
        krt__reg_release(sys, a->addr);
    for (uint32_t i = 0; a->ext && i < a->ext->n_rels; i++) {
        krt_rel_t *r = &a->ext->rels[i];
        if (r->kind == KRT_REL_LINK) {
            krt__send_sys(sys, r->peer, a->addr, KRT_NK_LINKEXIT, 0, (uint32_t)reason, NULL, 0);
        } else if (r->kind == KRT_REL_MON_IN) {
            krt_down_t d = {a->addr, r->ref, reason};
            krt__send_sys(sys, r->peer, KRT_ADDR_NONE, KRT_NK_DOWN, r->ref, 0, &d, sizeof d);
        } else if (r->kind == KRT_REL_REQ_IN) {
            krt__request_orphan(sys, a->addr, r->peer, r->ref);
        } else {
            krt__send_sys(sys, r->peer, a->addr, KRT_NK_DEMONITOR, r->ref, 0, NULL, 0);
        }
    }
    pthread_mutex_lock(&sys->tree_lock);
    krt_actor_t *p = a->parent;
    if (p) {
        s_tree_remove(a);
        if (p != sys->root && (atomic_load(&p->aflags) & KRT_AAF_SHUTDOWN))
            s_signal(sys, p, KRT_SIG_POKE);
    }
    while (a->first_child) {
        krt_actor_t *c = a->first_child;
        s_tree_remove(c);
        s_tree_insert(sys->root, c);
        if (atomic_load(&sys->stopping))
            s_signal(sys, c, KRT_SIG_SHUTDOWN);
    }
    pthread_mutex_unlock(&sys->tree_lock);
    s_drain(sys, s, a);
    if (atomic_load(&sys->n_waiters)) {
        pthread_mutex_lock(&sys->wait_lock);
        bool woke = false;
        for (krt_waiter_t *w = sys->waiters; w; w = w->next) {
            if (w->who == a->addr) {
                w->reason = reason;
                w->done = true;
                woke = true;
            }
        }
        if (woke)
            pthread_cond_broadcast(&sys->wait_cond);
        pthread_mutex_unlock(&sys->wait_lock);
    }
    if (s)
        atomic_store_explicit(&s->exited,
                              atomic_load_explicit(&s->exited, memory_order_relaxed) + 1,
                              memory_order_release);
    for (int i = 0; i < sys->n_sched; i++) /* a scheduler still re-checking a idle a */
        while (atomic_load_explicit(&sys->scheds[i].hazard, memory_order_acquire) == a)
            s_relax();
    s_slot_free(sys, s, (uint32_t)(a->addr & KRT_SLOT_MASK));
    if (s)
        atomic_store_explicit(&s->bytes,
                              atomic_load_explicit(&s->bytes, memory_order_relaxed) -
                                  (int64_t)s_actor_size(a->b),
                              memory_order_relaxed);
    else
        atomic_fetch_sub(&sys->ext_bytes, (int64_t)s_actor_size(a->b));
    s_actor_free(s, a);
    if (!s)
        atomic_fetch_add(&sys->ext_exited, 1);
}

int krt_system_wait(krt_system_t *sys, krt_addr_t who, int timeout_ms)
{
    krt_waiter_t w = {NULL, who, 0, false};
    if (krt__self_sched(sys))
        return KRT_EINVAL; /* would block a scheduler: monitor instead */
    pthread_mutex_lock(&sys->wait_lock);
    atomic_fetch_add(&sys->n_waiters, 1);
    krt_actor_t *a = krt__acquire(sys, who);
    if (!a) {
        atomic_fetch_sub(&sys->n_waiters, 1);
        pthread_mutex_unlock(&sys->wait_lock);
        return KRT_ENOACTOR;
    }
    w.next = sys->waiters;
    sys->waiters = &w;
    krt__release(sys, who);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    while (!w.done) {
        if (timeout_ms < 0)
            pthread_cond_wait(&sys->wait_cond, &sys->wait_lock);
        else if (pthread_cond_timedwait(&sys->wait_cond, &sys->wait_lock, &dl) != 0)
            break;
    }
    for (krt_waiter_t **pp = &sys->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == &w) {
            *pp = w.next;
            break;
        }
    }
    atomic_fetch_sub(&sys->n_waiters, 1);
    pthread_mutex_unlock(&sys->wait_lock);
    return w.done ? w.reason : KRT_ETIMEDOUT;
}

/* ---------------------------------------------------------------------------------------- */
/* System lifecycle                                                                           */

/* Live actors: spawned minus stopped, summed over schedulers (transiently off by in-flight). */
static int64_t s_live(krt_system_t *sys)
{
    int64_t n = (int64_t)atomic_load(&sys->ext_spawned) - (int64_t)atomic_load(&sys->ext_exited);
    for (int i = 0; i < sys->n_sched; i++) {
        n += (int64_t)atomic_load_explicit(&sys->scheds[i].spawned, memory_order_acquire);
        n -= (int64_t)atomic_load_explicit(&sys->scheds[i].exited, memory_order_acquire);
    }
    return n;
}

krt_system_t *krt_system_new(const krt_config_t *cfg)
{
    krt_config_t c = cfg ? *cfg : (krt_config_t){0};
    krt_system_t *sys = calloc(1, sizeof *sys);
    if (!sys)
        return NULL;
    sys->node_id = c.node_id ? c.node_id : 1;
    int n = c.schedulers > 0 ? c.schedulers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    sys->n_sched = n < 1 ? 1 : n > 64 ? 64 : n;
    sys->n_jobs = c.job_threads > 0 ? c.job_threads : 2;
    sys->budget = c.turn_budget > 0 ? (uint32_t)c.turn_budget : 64;
    /* Grow malloc heaps in big steps: millions of small actor blocks otherwise cost one
     * mprotect/brk per few KiB (process-wide setting, harmless for other code). */
    mallopt(M_TOP_PAD, 64 << 20);
    if (c.name) {
        sys->name = strdup(c.name);
    } else {
        char buf[32];
        snprintf(buf, sizeof buf, "node-%u", sys->node_id);
        sys->name = strdup(buf);
    }
    atomic_init(&sys->next_slot, 1);
    pthread_mutex_init(&sys->slot_lock, NULL);
    pthread_mutex_init(&sys->tree_lock, NULL);
    pthread_mutex_init(&sys->pool_lock, NULL);
    pthread_mutex_init(&sys->transport_lock, NULL);
    pthread_mutex_init(&sys->wait_lock, NULL);
    pthread_cond_init(&sys->wait_cond, NULL);
    sys->root = calloc(1, sizeof(krt_actor_t));
    sys->scheds = calloc((size_t)sys->n_sched, sizeof(krt_sched_t));
    if (!sys->name || !sys->root || !sys->scheds) {
        krt_system_destroy(&sys);
        return NULL;
    }
    sys->root->flags = KRT_AF_ROOT;
    uint64_t now = krt_now_ms();
    for (int i = 0; i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        s->sys = sys;
        s->idx = i;
        pthread_mutex_init(&s->rq_lock, NULL);
        krt__wheel_init(&s->wheel, now);
        s->ctx.sys = sys;
        s->ctx.sched = s;
    }
    if (!(sys->io = krt__io_new(sys)) || !(sys->reg = krt__reg_new())) {
        krt_system_destroy(&sys);
        return NULL;
    }
    return sys;
}

int krt_system_start(krt_system_t *sys)
{
    if (atomic_exchange(&sys->started, 1))
        return 0;
    for (int i = 0; i < sys->n_sched; i++) {
        if (pthread_create(&sys->scheds[i].thread, NULL, s_sched_main, &sys->scheds[i]) != 0) {
            sys->n_sched = i; /* run with what started */
            if (!i)
                return KRT_ENOMEM;
            break;
        }
    }
    return krt__io_start(sys->io);
}

/* Frees actors that never stopped (system not started, or stuck past the stop deadline). */
static void s_force_cleanup(krt_system_t *sys)
{
    for (;;) {
        pthread_mutex_lock(&sys->tree_lock);
        krt_actor_t *a = sys->root->first_child;
        while (a && a->first_child)
            a = a->first_child;
        pthread_mutex_unlock(&sys->tree_lock);
        if (!a)
            break;
        if (a->exit_reason == 0)
            a->exit_reason = KRT_EXIT_SHUTDOWN;
        s_slot_kill(sys, a);
        s_cleanup(sys, NULL, a);
    }
}

void krt_system_stop(krt_system_t *sys)
{
    if (!sys || krt__self_sched(sys)) /* from inside an actor it would wait for itself */
        return;
    if (atomic_exchange(&sys->stopped, 1))
        return;
    pthread_mutex_lock(&sys->tree_lock);
    atomic_store(&sys->stopping, 1);
    for (krt_actor_t *c = sys->root->first_child; c; c = c->next_sib)
        s_signal(sys, c, KRT_SIG_SHUTDOWN);
    pthread_mutex_unlock(&sys->tree_lock);
    if (atomic_load(&sys->started)) {
        uint64_t deadline = krt_now_ms() + KRT_STOP_WAIT_MS;
        while (s_live(sys) > 0 && krt_now_ms() < deadline) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
        if (s_live(sys) > 0)
            krt_log(KRT_LOG_WARN, sys->name, "stop_timeout", "live=%lld", (long long)s_live(sys));
        atomic_store(&sys->quit, 1);
        for (int i = 0; i < sys->n_sched; i++) {
            atomic_store(&sys->scheds[i].wake, 1);
            s_futex_wake(&sys->scheds[i].wake);
        }
        for (int i = 0; i < sys->n_sched; i++)
            pthread_join(sys->scheds[i].thread, NULL);
    }
    krt__io_stop(sys->io);
    s_force_cleanup(sys);
}

void krt_system_destroy(krt_system_t **sys_p)
{
    if (!sys_p || !*sys_p)
        return;
    krt_system_t *sys = *sys_p;
    *sys_p = NULL;
    if (sys->scheds && sys->root)
        krt_system_stop(sys);
    krt__io_destroy(&sys->io);
    krt__reg_destroy(&sys->reg);
    for (int i = 0; sys->scheds && i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        krt__wheel_free_heap(&s->wheel);
        krt__wheel_fini(&s->wheel);
        s_free_chain(s->pool, NULL);
        for (int c = 0; c < KRT_ACACHE_CLASSES; c++) {
            while (s->acache[c]) {
                void *blk = s->acache[c];
                memcpy(&s->acache[c], blk, sizeof(void *));
                free(blk);
            }
        }
        free(s->free_slots);
        pthread_mutex_destroy(&s->rq_lock);
    }
    for (uint32_t i = 0; i < sys->n_batches; i++)
        s_free_chain(sys->batches[i].head, NULL);
    free(sys->batches);
    while (sys->slabs) {
        krt_slab_t *slab = sys->slabs;
        sys->slabs = slab->next;
        free(slab);
    }
    for (uint32_t i = 0; i < KRT_NCHUNKS; i++)
        free(atomic_load(&sys->chunks[i]));
    free(sys->gfree);
    free(sys->scheds);
    free(sys->root);
    free(sys->name);
    pthread_mutex_destroy(&sys->slot_lock);
    pthread_mutex_destroy(&sys->tree_lock);
    pthread_mutex_destroy(&sys->pool_lock);
    pthread_mutex_destroy(&sys->transport_lock);
    pthread_mutex_destroy(&sys->wait_lock);
    pthread_cond_destroy(&sys->wait_cond);
    free(sys);
}

void krt_system_stats(krt_system_t *sys, krt_stats_t *out)
{
    memset(out, 0, sizeof *out);
    uint64_t spawned = atomic_load(&sys->ext_spawned);
    for (int i = 0; i < sys->n_sched; i++) {
        krt_sched_t *s = &sys->scheds[i];
        spawned += atomic_load_explicit(&s->spawned, memory_order_relaxed);
        out->messages += atomic_load_explicit(&s->handled, memory_order_relaxed);
        out->timers_armed += __atomic_load_n(&s->wheel.count, __ATOMIC_RELAXED);
    }
    int64_t live = s_live(sys);
    out->actors_live = live > 0 ? (uint64_t)live : 0;
    out->actors_spawned = spawned;
    int64_t bytes = atomic_load(&sys->ext_bytes);
    for (int i = 0; i < sys->n_sched; i++)
        bytes += atomic_load_explicit(&sys->scheds[i].bytes, memory_order_relaxed);
    bytes += (int64_t)out->actors_live * (int64_t)sizeof(krt_slot_t);
    out->bytes_live = bytes > 0 ? (uint64_t)bytes : 0;
}

void krt_log_actor(krt_ctx_t *ctx, krt_log_level_t level, const char *event, const char *fmt, ...)
{
    if (!krt_log_enabled(level))
        return;
    char path[256];
    krt_actor_t *a = ctx->actor;
    snprintf(path, sizeof path, "%s/%s-%llx", ctx->sys->name, a->name ? a->name : a->b->kind,
             (unsigned long long)(a->addr & KRT_LOCAL_MASK));
    va_list ap;
    va_start(ap, fmt);
    krt_vlog(level, path, event, fmt, ap);
    va_end(ap);
}
