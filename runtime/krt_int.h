/*
 * krt private header: the structures shared by the runtime's source files. Nothing outside
 * runtime/ includes it (tests may, to reach internals).
 *
 * Memory model in one paragraph: an actor is one malloc block (struct + state). Its address
 * names a slot (index + generation); senders pin the slot with a reference count while they push
 * into the mailbox, so an actor is freed only once it is marked dead and no sender holds it.
 * Mailboxes are Vyukov intrusive MPSC queues; `sched` (0 idle, 1 queued or running) decides who
 * enqueues an actor on a run queue. Only the scheduler running an actor touches its
 * non-atomic fields, except the tree links, which are guarded by the system's tree lock.
 */
#ifndef KRT_INT_H
#define KRT_INT_H

#include "krt.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------------------- */
/* Addresses and slots                                                                        */

#define KRT_LOCAL_MASK ((UINT64_C(1) << 48) - 1)
#define KRT_SLOT_BITS  24
#define KRT_SLOT_MASK  ((UINT64_C(1) << KRT_SLOT_BITS) - 1)
#define KRT_GEN_MAX    ((UINT64_C(1) << 24) - 1)
#define KRT_CHUNK_BITS 16
#define KRT_CHUNK_SIZE (1u << KRT_CHUNK_BITS)
#define KRT_NCHUNKS    (1u << (KRT_SLOT_BITS - KRT_CHUNK_BITS))
#define KRT_SLOT_ALIVE (UINT64_C(1) << 31)
#define KRT_SLOT_REFS  (KRT_SLOT_ALIVE - 1)

typedef struct krt_actor krt_actor_t;
typedef struct krt_sched krt_sched_t;

/* word: generation << 32 | ALIVE | sender references. */
typedef struct krt_slot {
    _Atomic uint64_t word;
    krt_actor_t *_Atomic actor;
} krt_slot_t;

/* ---------------------------------------------------------------------------------------- */
/* Message nodes                                                                              */

enum {
    KRT_NK_USER,        /* an application message */
    KRT_NK_REQUEST,     /* a krt_request / krt_call request: answered on the target's stop */
    KRT_NK_REPLY,       /* a reply to a request: completes it, dropped if it timed out */
    KRT_NK_INIT,        /* first message: runs init; msg.body is the spawn arg */
    KRT_NK_TIMER,       /* an embedded timer fired; msg.body is the krt_tmr_t, aux its seq */
    KRT_NK_REQ_TIMEOUT, /* a pending request's timer fired; msg.ref is the request's (by ref,
                           not pointer: a reply handled first frees the entry) */
    KRT_NK_LINK,        /* from wants a link */
    KRT_NK_UNLINK,      /* from drops its link */
    KRT_NK_MONITOR,     /* from monitors us with msg.ref */
    KRT_NK_DEMONITOR,   /* from drops monitor msg.ref */
    KRT_NK_EXIT,        /* krt_kill from `from`, reason aux */
    KRT_NK_LINKEXIT,    /* linked actor `from` stopped with reason aux */
    KRT_NK_DOWN,        /* a monitored actor stopped; body krt_down_t */
    KRT_NK_NODEDOWN     /* node aux went down: break relations with it (krt_remote.c) */
};
enum { KRT_NF_BIG = 1, KRT_NF_PTR = 2, KRT_NF_TAKEN = 4, KRT_NF_SLAB = 8, KRT_NF_SMALL = 16 };

typedef struct krt_mlink {
    struct krt_mlink *_Atomic next;
} krt_mlink_t;

typedef struct krt_node {
    krt_mlink_t link; /* must stay first */
    /* A node that will likely be KRT_CHAIN_AHEAD links further down the same mailbox chain,
     * or NULL: the consumer prefetches it, never dereferences it (it may be stale). */
    struct krt_node *ahead;
    krt_msg_t msg;
    uint16_t kind;
    uint16_t flags;
    uint32_t aux;
    _Alignas(8) unsigned char data[]; /* body; a KRT_NF_PTR node keeps its free_fn here */
} krt_node_t;

typedef void (*krt_free_fn)(void *);

/* Two classes of slab nodes: a message without a body (a signal, a tick, an increment) takes
 * a header-only node, one cache line; any other of up to KRT_INLINE_CAP bytes a node of two.
 * A long queue of body-less messages then costs half the memory and memory traffic. */
enum { KRT_NC_SMALL, KRT_NC_LARGE, KRT_NCLASSES };
#define KRT_NODE_SMALL 64
#define KRT_NODE_SIZE  128
#define KRT_INLINE_CAP (KRT_NODE_SIZE - sizeof(krt_node_t))
_Static_assert(sizeof(krt_node_t) == KRT_NODE_SMALL, "a body-less node is one cache line");
/* Free nodes are kept in magazines (Bonwick): a stack of up to KRT_MAG_SIZE pointers to free
 * nodes of one class. Freeing a node never writes to it, so the core that sent it finds the
 * line unmodified when it reuses the node. A scheduler holds a loaded and a previous magazine
 * per class and trades whole magazines, full for empty, with the system's depot: a node's
 * pointer is written once when it is freed and read once when it is reused, however far the
 * node travels. */
#define KRT_MAG_SIZE 256
typedef struct krt_mag {
    struct krt_mag *next; /* in the depot */
    uint32_t n;
    bool loose; /* may hold malloc'd nodes (only slab nodes when false) */
    krt_node_t *v[KRT_MAG_SIZE];
} krt_mag_t;
/* A new node is taken from the top of the loaded magazine; the one this many below it is
 * fetched for writing meanwhile (a node freed on another core costs a cache miss to reuse). */
#define KRT_POOL_PREFETCH 8
#define KRT_OUT_BATCH     64 /* a handler's messages to one actor pushed at once, at most */
/* How far down a batched chain the consumer prefetches (krt_node_t.ahead). The mailbox is a
 * linked list: on its own the consumer knows one node ahead, so the nodes a producer on
 * another core just wrote cost it one cross-core miss after another (a line moved between the
 * development VM's two cores in 30-500 ns, varying by the minute), or one DRAM miss after
 * another when a long queue has left the caches. */
#define KRT_CHAIN_AHEAD 16

/* Call refs (krt_call from outside any actor) have the top bit set. */
#define KRT_CALL_REF_BIT (UINT64_C(1) << 63)

/* ---------------------------------------------------------------------------------------- */
/* Spin locks                                                                                 */

/* A test-and-set lock for critical sections of a few stores (run queues, timer wheels): an
 * atomic exchange takes it and a release store gives it back, where an uncontended pthread
 * mutex costs two locked instructions and ~50 others. A waiter spins briefly, then yields the
 * CPU (the holder may be preempted). Unlike a mutex's unlock, the release store is no full
 * barrier: a run queue push is seen by a parking scheduler through rq_len, updated seq_cst
 * under the lock (the pair of s_park's seq_cst store to parked and load of rq_len). */
typedef struct krt_spin {
    _Atomic bool held;
} krt_spin_t;

/* The slow path of krt__spin_lock: spins, then yields, until it holds the lock. */
void krt__spin_wait(krt_spin_t *l);

static inline void krt__spin_lock(krt_spin_t *l)
{
    if (atomic_exchange_explicit(&l->held, true, memory_order_acquire))
        krt__spin_wait(l);
}

static inline bool krt__spin_trylock(krt_spin_t *l)
{
    return !atomic_load_explicit(&l->held, memory_order_relaxed) &&
           !atomic_exchange_explicit(&l->held, true, memory_order_acquire);
}

static inline void krt__spin_unlock(krt_spin_t *l)
{
    atomic_store_explicit(&l->held, false, memory_order_release);
}

/* A mutex for the actor tree, which every spawn and every stop takes once (~60 instructions a
 * lock and unlock in glibc): Drepper's futex mutex ("Futexes Are Tricky", mutex 3) inline, one
 * compare-exchange to take it and one exchange to give it back. A waiter spins briefly, then
 * sleeps on the futex (a tree dump holds the lock for a whole walk). state: 0 free, 1 held,
 * 2 held and maybe waited for. */
typedef struct krt_lock {
    _Atomic uint32_t state;
} krt_lock_t;

/* The slow path of krt__lock: spins, then sleeps, until it holds the lock. */
void krt__lock_wait(krt_lock_t *l);
void krt__futex_wake(_Atomic uint32_t *w);

static inline void krt__lock(krt_lock_t *l)
{
    uint32_t unheld = 0;
    if (!atomic_compare_exchange_strong_explicit(&l->state, &unheld, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        krt__lock_wait(l);
}

static inline void krt__unlock(krt_lock_t *l)
{
    if (atomic_exchange_explicit(&l->state, 0, memory_order_release) == 2)
        krt__futex_wake(&l->state);
}

/* ---------------------------------------------------------------------------------------- */
/* Timers                                                                                     */

typedef struct krt_tlist {
    struct krt_tlist *next, *prev;
} krt_tlist_t;

enum { KRT_TS_IDLE = 0, KRT_TS_ARMED = 1, KRT_TS_FIRED = 2, KRT_TS_MASK = 3 };
enum { KRT_TF_REQ = 4, KRT_TF_HEAP = 8, KRT_TF_CALL = 16 };

/* The runtime's view of a krt_timer_t. */
typedef struct krt_tmr {
    krt_tlist_t link; /* wheel bucket; must stay first */
    uint64_t expires; /* absolute ms */
    krt_actor_t *owner;
    uint64_t ref;
    uint32_t type;
    uint16_t seq;  /* bumped on every arm/cancel: a fired message with an old seq is stale */
    uint8_t state; /* KRT_TS_* | KRT_TF_* */
    uint8_t wheel; /* scheduler index whose wheel holds it */
    struct krt_tmr *anext, *aprev; /* owner's list of timers not idle */
} krt_tmr_t;

_Static_assert(sizeof(krt_tmr_t) <= sizeof(krt_timer_t), "krt_timer_t too small");

#define KRT_WHEEL_BITS   6
#define KRT_WHEEL_SLOTS  (1u << KRT_WHEEL_BITS)
#define KRT_WHEEL_LEVELS 6

/* A wheel's lock is a spin lock: arm and cancel hold it for a few stores (an uncontended
 * pthread mutex cost as much as the arm itself), firing holds it while it pushes the due
 * timers' messages. */
typedef struct krt_wheel {
    krt_spin_t lock;
    uint64_t now;   /* last processed tick */
    uint64_t count; /* timers in the wheel */
    krt_tlist_t slots[KRT_WHEEL_LEVELS][KRT_WHEEL_SLOTS];
} krt_wheel_t;

typedef void (*krt_fire_fn)(void *user, krt_tmr_t *t);

void krt__wheel_init(krt_wheel_t *w, uint64_t now);

static inline void krt__wheel_lock(krt_wheel_t *w)
{
    krt__spin_lock(&w->lock);
}

static inline void krt__wheel_unlock(krt_wheel_t *w)
{
    krt__spin_unlock(&w->lock);
}

/* The four below need the wheel's lock held. */
void krt__wheel_add(krt_wheel_t *w, krt_tmr_t *t);
/* Adds t to expire delay_ms after now (a clock reading in ms); an empty wheel's tick catches
 * up with now first (it is only advanced while it holds timers). */
void krt__wheel_add_in(krt_wheel_t *w, krt_tmr_t *t, uint64_t now, uint64_t delay_ms);
void krt__wheel_del(krt_wheel_t *w, krt_tmr_t *t);
/* Processes every tick up to now; each expired timer is unlinked, then passed to fire. */
void krt__wheel_advance(krt_wheel_t *w, uint64_t now, krt_fire_fn fire, void *user);
/* The first tick after w->now at which a timer fires or moves down a level (so never later than
 * the next expiry), or UINT64_MAX when the wheel is empty. */
uint64_t krt__wheel_next(const krt_wheel_t *w);
/* How long a thread whose work waits on w may sleep: -1 (no timer, until woken), else the ms to
 * krt__wheel_next from now, at least 1. Takes w->lock; under it, stores in *until (if not NULL)
 * when the sleep ends (UINT64_MAX: never), so that whoever adds a timer under the same lock
 * sees whether the sleeper will be late for it. */
int krt__wheel_wait_ms(krt_wheel_t *w, uint64_t now, _Atomic uint64_t *until);

/* ---------------------------------------------------------------------------------------- */
/* Actors                                                                                     */

enum {
    KRT_AF_TRAP = 1,
    KRT_AF_EXITING = 2,
    KRT_AF_INITED = 4,
    KRT_AF_SUPERVISOR = 8,
    KRT_AF_ROOT = 16,
    KRT_AF_STOPMSG = 32 /* handling KRT_MSG_STOP: exit afterwards */
};
enum { KRT_AAF_SHUTDOWN = 1, KRT_AAF_REGISTERED = 2 };
enum { KRT_SIG_KILL = 1, KRT_SIG_SHUTDOWN = 2, KRT_SIG_POKE = 4 };
/* REQ_IN: a local actor's krt_request that this actor took and has not answered yet; if it
 * stops, the runtime answers it with KRT_ENOACTOR. */
enum { KRT_REL_LINK = 1, KRT_REL_MON_OUT, KRT_REL_MON_IN, KRT_REL_REQ_IN };

typedef struct krt_rel {
    krt_addr_t peer;
    uint64_t ref;
    int kind;
} krt_rel_t;

/* A request this actor made and waits for (krt_request.c). */
typedef struct krt_pending {
    struct krt_pending *next; /* hash bucket chain */
    krt_tmr_t timer;          /* ref = the request's ref; armed only with a timeout */
    krt_reply_fn fn;          /* NULL: the ref form (the reply is delivered as a message) */
    void *user;
    krt_addr_t to; /* the target */
} krt_pending_t;

/* Rarely used per-actor data, allocated on first use. */
typedef struct krt_ext {
    krt_rel_t *rels;
    uint32_t n_rels, cap_rels;
    krt_pending_t **pend; /* pending requests by ref: 1 << pend_bits buckets */
    uint32_t n_pend;
    uint32_t pend_bits;
    krt_tmr_t *timers; /* timers not idle */
    bool remote;       /* in the system's set of actors with remote relations */
} krt_ext_t;

struct krt_actor {
    krt_mlink_t *_Atomic mb_head; /* producers */
    _Atomic uint32_t sched;       /* 0 idle, 1 queued/running/dead, 2 inspected */
    _Atomic uint32_t pushed;      /* messages pushed (for mailbox depth) */
    krt_mlink_t *mb_tail;         /* consumer */
    krt_mlink_t mb_stub;
    _Atomic uint32_t sig;    /* KRT_SIG_* out-of-band signals */
    _Atomic int sig_reason;  /* reason for KRT_SIG_KILL */
    _Atomic uint32_t aflags; /* KRT_AAF_* */
    _Atomic uint32_t popped; /* messages taken, each before its handler (owner writes; wraps) */
    uint16_t flags;          /* KRT_AF_*, owner only */
    uint16_t restarts;       /* by its supervisor (introspection; saturates) */
    int exit_reason;
    krt_actor_t *run_next; /* run queue link */
    krt_addr_t addr;
    krt_addr_t spawner; /* krt_parent: who spawned it (NONE from outside) */
    const krt_behaviour_t *b;
    krt_actor_t *parent, *first_child, *next_sib, *prev_sib; /* tree_lock */
    krt_ext_t *ext;
    char *name;
    _Alignas(16) unsigned char state[];
};

/* The header stays at 144 bytes: with 16 bytes of state an idle actor is one 176-byte malloc
 * chunk plus its 16-byte slot (bench idle_actor_bytes). */
_Static_assert(sizeof(krt_actor_t) == 144, "krt_actor_t grew: idle actors cost more");

/* ---------------------------------------------------------------------------------------- */
/* Schedulers and the system                                                                  */

#define KRT_ACACHE_CLASSES 64 /* actor blocks up to 1 KiB are cached per scheduler */
#define KRT_ACACHE_MAX     2048
/* ... and at most this many bytes of them per scheduler: blocks freed by a scheduler that
 * other threads allocated (bridges spawn a stream sink per call) would otherwise fill every
 * class to KRT_ACACHE_MAX, megabytes that look like growth per request. */
#define KRT_ACACHE_BYTES    (512 * 1024)
#define KRT_DEPOT_LOOSE_MAX 64 /* depot magazines that may keep malloc'd message nodes */
/* Actors spawned on a scheduler and not yet run wait on its young stack, newest on top: a
 * spawning tree runs depth-first (skynet: ~70 actors wait at once instead of a million, so
 * blocks and nodes are reused while hot), thieves take the oldest (the largest subtrees). Past
 * the cap the oldest moves to the FIFO queue. */
#define KRT_YOUNG_CAP 256
/* A thief takes at most this many actors of a victim's FIFO queue (it walks them under the
 * victim's run queue lock, a spin lock). */
#define KRT_STEAL_MAX 64
/* Every KRT_YOUNG_AGE-th pop takes the young stack's oldest instead, so an actor under a stack
 * that keeps growing and shrinking above it still runs (within (its place from the bottom + 1)
 * times this many pops). Rare, as each such pop starts another subtree on top while the older
 * ones wait half done: every 64th or 1024th pop pushed skynet past the cap into the FIFO queue,
 * breadth-first again (190-330 ns/actor, not ~110); every 16384th, one scheduler's skynet kept
 * thousands of actors alive and malloc'd 1.4 M of its 3.3 M blocks (150-196 ns/actor, against
 * ~110 ns and 700 mallocs at 65536). */
#define KRT_YOUNG_AGE 65536
/* An idle scheduler polls the run queues between these many times (~25 µs at the most here)
 * before it parks; the count adapts to how soon work comes back (krt_sched.c): a park shorter
 * than KRT_PARK_SHORT_NS counts as work a longer spin would have found. */
#define KRT_SPIN_MIN      16
#define KRT_SPIN_MAX      1000
#define KRT_PARK_SHORT_NS 50000

struct krt_ctx {
    krt_system_t *sys;
    krt_sched_t *sched;
    krt_actor_t *actor;
    krt_node_t *node; /* message being handled, NULL in init/terminate */
    bool replied;     /* the request being handled was answered in this turn */
};

struct krt_sched {
    krt_system_t *sys;
    int idx;
    pthread_t thread;
    krt_spin_t rq_lock;
    krt_actor_t *rq_head, *rq_tail; /* FIFO queue (rq_lock) */
    _Atomic uint32_t rq_len;        /* actors in the FIFO queue and the young stack */
    uint32_t young_lo, young_hi;    /* young[lo % CAP] oldest .. young[(hi - 1) % CAP] newest */
    uint32_t pops;                  /* queue pops, owner only (fairness between the two) */
    krt_actor_t *next;              /* LIFO slot, owner only */
    krt_actor_t *_Atomic hazard;    /* actor being re-checked after going idle */
    uint32_t next_streak;
    uint32_t spin; /* idle polls before parking, KRT_SPIN_MIN..KRT_SPIN_MAX */
    _Atomic uint32_t parked;
    _Atomic uint32_t wake; /* futex word */
    krt_wheel_t wheel;
    krt_ctx_t ctx;
    uint64_t next_ref;
    uint64_t clock_ms; /* krt_now_ms() for the timers the current message arms; 0 until read */
    uint32_t *free_slots;
    uint32_t n_free_slots, cap_free_slots;
    uint32_t fresh_next, fresh_end;
    void *acache[KRT_ACACHE_CLASSES]; /* free actor blocks by size class (16-byte steps) */
    uint32_t acache_n[KRT_ACACHE_CLASSES];
    size_t acache_bytes;           /* held in acache */
    struct krt_pending *pend_free; /* spare pending-request entries (krt_request.c) */
    uint32_t n_pend_free;
    uint32_t turn_sends; /* sends during the current turn (wake policy) */
    /* The handler's outgoing batch (krt_send.c): its second and later sends in a row to one
     * local actor, which is pinned, are chained here and pushed with one exchange when the
     * target changes, the batch is full, the handler returns, or before krt__out_sync. */
    uint32_t out_n;      /* nodes in the batch (0: none, nothing pinned) */
    bool out_on;         /* in a turn: local sends are batched */
    krt_addr_t out_last; /* the handler's last local target (NONE at its start) */
    krt_addr_t out_to;   /* the batch's target */
    krt_actor_t *out_a;  /* ... pinned */
    krt_mlink_t *out_head, *out_tail;
    _Atomic uint64_t wakeups; /* times this scheduler left a park (tests count idle wake-ups) */
    _Atomic bool idle;        /* polling for work or parked (owner writes) */
    bool remote_dirty;        /* sent remotely since the last transport flush */
    krt_transport_t rt;       /* ... through this transport */
    _Atomic uint64_t handled, spawned, exited;
    _Atomic int64_t bytes; /* actor blocks spawned here minus those freed here */
    krt_mag_t *mag[KRT_NCLASSES], *prev[KRT_NCLASSES]; /* free message nodes, by class */
    krt_actor_t *young[KRT_YOUNG_CAP];                 /* rq_lock */
    char pad_[64];
};

/* The system's magazines of one class: non-empty ones (full but for malloc'd nodes freed past
 * KRT_DEPOT_LOOSE_MAX) and empty ones. */
typedef struct krt_depot {
    krt_mag_t *full, *empty;
    uint32_t n_full;
} krt_depot_t;

typedef struct krt_io krt_io_t; /* jobs, poller, call table (krt_io.c) */
typedef struct krt_reg krt_reg_t;

struct krt_system {
    uint16_t node_id;
    char *name;
    int n_sched;
    int n_jobs;
    uint32_t budget;
    krt_sched_t *scheds;
    krt_slot_t *_Atomic chunks[KRT_NCHUNKS];
    _Atomic uint32_t next_slot;
    /* A fresh slot's first generation, random per system: addresses handed out by an earlier
     * life of this node (a restart) name other generations and reach nobody. */
    uint32_t gen_base;
    pthread_mutex_t slot_lock; /* gfree */
    uint32_t *gfree;
    uint32_t n_gfree, cap_gfree;
    krt_lock_t tree_lock;
    krt_actor_t *root;
    _Atomic int started, stopping, quit, stopped;
    _Atomic uint32_t n_parked;
    _Atomic uint32_t rr;
    _Atomic uint64_t ext_spawned, ext_exited;
    _Atomic int64_t ext_bytes;
    _Atomic int n_waiters;
    pthread_mutex_t pool_lock;
    krt_depot_t depot[KRT_NCLASSES]; /* magazines of free message nodes (pool_lock) */
    struct krt_slab *slabs;          /* node slabs, freed with the system */
    pthread_mutex_t transport_lock;
    krt_transport_t transport;
    _Atomic int has_transport;
    pthread_mutex_t wait_lock;
    pthread_cond_t wait_cond;
    struct krt_waiter *waiters;
    krt_io_t *io;
    krt_reg_t *reg;
    struct krt_remote *remote; /* actors with remote relations (krt_remote.c) */
};

/* The scheduler the calling thread runs (krt_sched.c), NULL on other threads. */
extern __thread krt_sched_t *krt__tls;

/* Thread-local: the scheduler this thread runs for sys, or NULL. */
static inline krt_sched_t *krt__self_sched(krt_system_t *sys)
{
    krt_sched_t *s = krt__tls;
    return (s && s->sys == sys) ? s : NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Internals shared by the runtime's files                                                    */

static inline void krt__relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---------------------------------------------------------------------------------------- */
/* Mailbox: Vyukov's intrusive MPSC queue                                                     */

static inline void krt__mb_init(krt_actor_t *a)
{
    atomic_store_explicit(&a->mb_stub.next, NULL, memory_order_relaxed);
    atomic_store_explicit(&a->mb_head, &a->mb_stub, memory_order_relaxed);
    a->mb_tail = &a->mb_stub;
}

/* Appends the chain first..last (linked through next, last->next unset) in one exchange. The
 * links inside the chain were stored before the exchange, which is a release: the consumer
 * reaches them only through prev->next (acquire), so it sees them. */
static inline void krt__mb_push_chain(krt_actor_t *a, krt_mlink_t *first, krt_mlink_t *last)
{
    atomic_store_explicit(&last->next, NULL, memory_order_relaxed);
    krt_mlink_t *prev = atomic_exchange_explicit(&a->mb_head, last, memory_order_seq_cst);
    atomic_store_explicit(&prev->next, first, memory_order_release);
}

static inline void krt__mb_push(krt_actor_t *a, krt_mlink_t *n)
{
    krt__mb_push_chain(a, n, n);
}

/* NULL when empty, or when a producer is between its two steps (the caller retries later). */
static inline krt_mlink_t *krt__mb_pop(krt_actor_t *a)
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
        __builtin_prefetch(next); /* the next pop reads it: fetch it while tail is handled */
        krt_node_t *ahead = ((krt_node_t *)tail)->ahead; /* tail is a node, not the stub */
        if (ahead)
            __builtin_prefetch(ahead);
        return tail;
    }
    if (tail != atomic_load_explicit(&a->mb_head, memory_order_acquire))
        return NULL;
    krt__mb_push(a, &a->mb_stub);
    next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (next) {
        a->mb_tail = next;
        return tail;
    }
    return NULL;
}

/* Consumer-side part of "has messages": true if the consumer end holds something. */
static inline bool krt__mb_tail_busy(krt_actor_t *a)
{
    return a->mb_tail != &a->mb_stub ||
           atomic_load_explicit(&a->mb_stub.next, memory_order_acquire) != NULL;
}

/* Producer-side part: valid only after s_mb_tail_busy was false. */
static inline bool krt__mb_head_busy(krt_actor_t *a)
{
    return atomic_load_explicit(&a->mb_head, memory_order_seq_cst) != &a->mb_stub;
}

/* Message nodes (krt_node.c). The common cases (a small node from this scheduler's free list,
 * back onto it) are inline; the rest goes to the _slow functions. */
krt_node_t *krt__node_new_slow(krt_sched_t *s, size_t len);
void krt__node_free_slow(krt_sched_t *s, krt_node_t *n);

/* Clears n's header for a new message (kind USER) with the given flags. */
static inline krt_node_t *krt__node_reset(krt_node_t *n, uint16_t flags)
{
    n->ahead = NULL;
    memset(&n->msg, 0, sizeof n->msg);
    n->kind = KRT_NK_USER;
    n->flags = flags;
    n->aux = 0;
    return n;
}

/* The class of a node for a body of len bytes (len <= KRT_INLINE_CAP). */
static inline int krt__len_class(size_t len)
{
    return len ? KRT_NC_LARGE : KRT_NC_SMALL;
}

/* The class of node n (a free one, or one carrying a message). */
static inline int krt__node_class(const krt_node_t *n)
{
    return n->flags & KRT_NF_SMALL ? KRT_NC_SMALL : KRT_NC_LARGE;
}

/* The top of magazine m (m->n > 0). */
static inline krt_node_t *krt__mag_pop(krt_mag_t *m)
{
    uint32_t k = --m->n;
    if (k >= KRT_POOL_PREFETCH)
        __builtin_prefetch(m->v[k - KRT_POOL_PREFETCH], 1);
    return m->v[k];
}

/* A node with room for len body bytes, header zeroed (kind USER); NULL if out of memory. */
static inline krt_node_t *krt__node_new(krt_sched_t *s, size_t len)
{
    int c = krt__len_class(len);
    krt_mag_t *m = s ? s->mag[c] : NULL;
    if (len > KRT_INLINE_CAP || !m || !m->n)
        return krt__node_new_slow(s, len);
    krt_node_t *n = krt__mag_pop(m);
    return krt__node_reset(n, n->flags); /* a free node's flags are SLAB, SMALL or 0 */
}

/* Frees n (running a pointer body's free_fn unless it was taken). */
static inline void krt__node_free(krt_sched_t *s, krt_node_t *n)
{
    krt_mag_t *m = s ? s->mag[krt__node_class(n)] : NULL;
    if (!m || (n->flags & ~KRT_NF_SMALL) != KRT_NF_SLAB || m->n == KRT_MAG_SIZE) {
        krt__node_free_slow(s, n);
        return;
    }
    m->v[m->n++] = n;
}
/* Frees every node the system and its schedulers keep (system destroy). */
void krt__nodes_fini(krt_system_t *sys);

/* Slots (krt_slot.c; lookups and pins inline). */
static inline krt_slot_t *krt__slot(krt_system_t *sys, uint32_t idx)
{
    krt_slot_t *c = atomic_load_explicit(&sys->chunks[idx >> KRT_CHUNK_BITS], memory_order_acquire);
    return c ? &c[idx & (KRT_CHUNK_SIZE - 1)] : NULL;
}

/* Pins the actor at addr (NULL if gone); release with krt__release. */
static inline krt_actor_t *krt__acquire(krt_system_t *sys, krt_addr_t addr)
{
    uint64_t local = addr & KRT_LOCAL_MASK;
    uint32_t idx = (uint32_t)(local & KRT_SLOT_MASK);
    uint64_t gen = local >> KRT_SLOT_BITS;
    if (!idx || !gen || krt_addr_node(addr) != sys->node_id)
        return NULL;
    krt_slot_t *slot = krt__slot(sys, idx);
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

static inline void krt__release(krt_system_t *sys, krt_addr_t addr)
{
    krt_slot_t *slot = krt__slot(sys, (uint32_t)(addr & KRT_SLOT_MASK));
    atomic_fetch_sub_explicit(&slot->word, 1, memory_order_release);
}
int krt__slot_alloc(krt_system_t *sys, krt_sched_t *s, uint32_t *out);
void krt__slot_free(krt_system_t *sys, krt_sched_t *s, uint32_t idx);
/* Marks the actor dead and waits until no sender holds it. */
void krt__slot_kill(krt_system_t *sys, krt_actor_t *a);

/* Schedulers (krt_sched.c). */
/* Puts a (whose sched flag the caller just set to 1) on a run queue. spawned: a new actor
 * (on a scheduler, it goes to the young stack). */
void krt__schedule(krt_system_t *sys, krt_actor_t *a, bool spawned);
/* A long turn that keeps producing work: let an idle scheduler take our queued actors (not the
 * one the turn keeps sending to). */
void krt__share_work(krt_system_t *sys, krt_sched_t *me);
/* Sets signal bits on a (kept alive by the caller) and makes sure it runs. */
void krt__signal(krt_system_t *sys, krt_actor_t *a, uint32_t bits);
/* A scheduler thread's body (arg: its krt_sched_t). */
void *krt__sched_main(void *arg);

/* Pushes the count messages first..last to an actor known to be alive (pinned, or a timer fire
 * under the wheel lock), and makes sure it runs. */
static inline void krt__push_chain(krt_system_t *sys, krt_actor_t *a, krt_mlink_t *first,
                                   krt_mlink_t *last, uint32_t count)
{
    /* approximate under concurrent producers (introspection only): no locked instruction */
    atomic_store_explicit(&a->pushed,
                          atomic_load_explicit(&a->pushed, memory_order_relaxed) + count,
                          memory_order_relaxed);
    krt__mb_push_chain(a, first, last);
    if (atomic_load(&a->sched) == 0 && atomic_exchange(&a->sched, 1) == 0)
        krt__schedule(sys, a, false);
}

static inline void krt__push(krt_system_t *sys, krt_actor_t *a, krt_node_t *n)
{
    krt__push_chain(sys, a, &n->link, &n->link, 1);
}

/* Actors (krt_actor.c). */
/* Everything after terminate: the actor is already marked dead in its slot. s NULL off the
 * schedulers. */
void krt__cleanup(krt_system_t *sys, krt_sched_t *s, krt_actor_t *a);

/* Sending (krt_send.c). */
/* A runtime message to the running actor itself. */
void krt__push_self(krt_ctx_t *ctx, krt_addr_t from, uint16_t kind, uint64_t ref, uint32_t aux,
                    const void *body, size_t len);
/* Pushes n to the actor at `to` (local or remote); consumes n in every case. In a turn a local
 * n may wait in the scheduler's outgoing batch until krt__out_flush. */
int krt__send_node(krt_system_t *sys, krt_addr_t to, krt_node_t *n);
/* Pushes the scheduler's outgoing batch and releases its target. */
void krt__out_flush(krt_sched_t *s);
/* The handler returned: its batch is pushed, its next sends start afresh. */
static inline void krt__out_end(krt_sched_t *s)
{
    if (s->out_n)
        krt__out_flush(s);
    s->out_last = KRT_ADDR_NONE;
}

/* Before the running handler hands something to another thread or actor by another way than a
 * local message (a krt_call's reply, a spawn, a job, a remote send): what it sent so far is
 * pushed first. */
static inline void krt__out_sync(krt_system_t *sys)
{
    krt_sched_t *s = krt__self_sched(sys);
    if (s && s->out_n)
        krt__out_flush(s);
}
int krt__send_copy(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint32_t type, uint64_t ref,
                   uint16_t kind, const void *body, size_t len);
/* A message with its whole envelope (kind from the node kind; status for replies). */
int krt__send_env(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint32_t type, uint64_t ref,
                  uint16_t kind, int32_t status, const void *body, size_t len);
/* A runtime message (LINK, DOWN...) with aux; failures are dropped. */
void krt__send_sys(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint16_t kind, uint64_t ref,
                   uint32_t aux, const void *body, size_t len);
/* Sends a node to a remote address through the transport; consumes n. */
int krt__send_remote(krt_system_t *sys, krt_addr_t to, krt_node_t *n);
krt_ext_t *krt__ext(krt_actor_t *a);
uint64_t krt__new_ref(krt_ctx_t *ctx);
/* arg_free (optional) releases arg after init ran, or if the actor never ran it. */
int krt__spawn(krt_system_t *sys, krt_ctx_t *ctx, const krt_behaviour_t *b, void *arg,
               void (*arg_free)(void *), const krt_spawn_opts_t *opts, uint32_t restarts,
               uint32_t flags, krt_addr_t *out);
bool krt__stopping(krt_ctx_t *ctx);

/* Timers (krt_timer.c). */
void krt__timers_fire(krt_sched_t *s, uint64_t now);
void krt__timers_cancel_all(krt_system_t *sys, krt_actor_t *a);
/* Handles a KRT_NK_TIMER node; returns true and fills out if it must be delivered. */
bool krt__timer_deliver(krt_ctx_t *ctx, krt_node_t *n, krt_msg_t *out);
void krt__tmr_arm(krt_sched_t *s, krt_actor_t *owner, krt_tmr_t *t, uint64_t delay_ms);
bool krt__tmr_cancel(krt_system_t *sys, krt_actor_t *owner, krt_tmr_t *t);
/* Requests (krt_request.c). */
/* A KRT_NK_REQ_TIMEOUT for ref: completes the request (KRT_ETIMEDOUT) if it is still pending. */
void krt__request_expired(krt_ctx_t *ctx, uint64_t ref);
/* A KRT_NK_REPLY for the running actor: completes its request; true if it must be handled as
 * an ordinary message (a reply that matches no request: ref 0). */
bool krt__request_reply(krt_ctx_t *ctx, krt_node_t *n);
/* The actor stops: frees its pending requests (no callback) and tells local targets. */
void krt__requests_drop(krt_system_t *sys, krt_actor_t *a);
/* Frees the scheduler's spare pending entries (system destroy). */
void krt__requests_fini(krt_sched_t *s);
/* Answers a request the stopping actor held (drain or REQ_IN) with KRT_ENOACTOR. */
void krt__request_orphan(krt_system_t *sys, krt_addr_t self, krt_addr_t from, uint64_t ref);
/* Relations (krt_link.c). */
int krt__rel_add(krt_actor_t *a, int kind, krt_addr_t peer, uint64_t ref);
bool krt__rel_del(krt_actor_t *a, int kind, krt_addr_t peer, uint64_t ref, krt_rel_t *out);
bool krt__describe(krt_system_t *sys, krt_actor_t *a, char *buf, size_t cap);
int krt_reg_insert(krt_system_t *sys, const char *name, krt_addr_t who, krt_actor_t *a);
void krt__wheel_free_heap(krt_wheel_t *w);

/* I/O (krt_io.c). */
krt_io_t *krt__io_new(krt_system_t *sys);
int krt__io_start(krt_io_t *io);
void krt__io_stop(krt_io_t *io);
void krt__io_destroy(krt_io_t **io_p);
/* Completes a krt_call / krt_call_async with a reply; false if it is gone (timed out). */
bool krt__call_complete(krt_system_t *sys, uint64_t ref, krt_addr_t from, uint32_t type,
                        int32_t status, const void *body, size_t len);
/* Fails a call whose request was dropped (target gone). */
void krt__call_fail(krt_system_t *sys, uint64_t ref, int err);

/* Registry (krt_reg.c). */
krt_reg_t *krt__reg_new(void);
void krt__reg_destroy(krt_reg_t **reg_p);
/* Removes every name of who, in O(its names + one address bucket's chain); returns the entries
 * looked at (the unit test checks that it stays small with many other names registered). */
size_t krt__reg_release(krt_system_t *sys, krt_addr_t who);

/* Remote relations (krt_remote.c). */
struct krt_remote *krt__remote_new(void);
void krt__remote_destroy(struct krt_remote **r_p);
/* The actor has (or is about to have) a relation with an actor on another node: node-down
 * must reach it. Owner only. */
void krt__remote_interest(krt_system_t *sys, krt_actor_t *a);
/* The stopping actor leaves the set. */
void krt__remote_forget(krt_system_t *sys, krt_actor_t *a);
/* A KRT_NK_NODEDOWN for the running actor. */
void krt__remote_nodedown(krt_ctx_t *ctx, uint16_t node);
/* The message the transport carries for n (runtime signals become reserved PLAIN types);
 * wire is scratch for the body. */
const krt_msg_t *krt__remote_wire(const krt_node_t *n, krt_msg_t *tmp, unsigned char wire[12]);
/* Inbound messages the runtime handles itself (signals, the node service, call replies):
 * true if handled, *rc its result. */
bool krt__remote_deliver(krt_system_t *sys, krt_addr_t to, const krt_msg_t *msg, int *rc);
/* A KRT_MSG_RELAY that arrived at this node's service address (krt_relay.c). */
int krt__relay_in(krt_system_t *sys, const krt_msg_t *msg);
/* krt_kill's core: from may be KRT_ADDR_NONE; who local or remote. */
int krt__kill(krt_system_t *sys, krt_addr_t from, krt_addr_t who, int reason);
/* Pending requests of the running actor to node fail with KRT_ENOCONN (queued replies). */
void krt__requests_fail_node(krt_ctx_t *ctx, uint16_t node);
/* Pending krt_call / krt_call_async to node fail with KRT_ENOCONN. */
void krt__calls_fail_node(krt_system_t *sys, uint16_t node);

/* Introspection helpers (krt_info.c). */
size_t krt__actor_bytes(const krt_actor_t *a);

#endif /* KRT_INT_H */
