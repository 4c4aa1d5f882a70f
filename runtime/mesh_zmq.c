/*
 * krt_mesh over ZeroMQ (see krt_mesh.h).
 *
 * Threads: runtime threads call s_transport_send, which encodes the envelope into a queue
 * item and pushes it onto an intrusive lock-free MPSC queue (Vyukov). The queue, the sockets
 * and the peer table belong to whoever holds `work`: the mesh's I/O thread except while it
 * sleeps in zmq_poll on the ROUTER socket and an eventfd, or a thread flushing its sends that
 * finds `work` free, which then writes the queued frames out itself up to the first control
 * item (peers, monitors, disconnects stay on the I/O thread: their work calls back into the
 * runtime); a ZeroMQ socket may change threads across a full barrier, which the mutex gives.
 * That saves a round trip a thread wake-up each way. A producer that finds `work` taken writes the
 * eventfd only when the I/O thread has announced it is about to sleep (`armed`), so a busy mesh
 * costs no syscall per message on the send side.
 *
 * Batching: a runtime thread's sends to one peer accumulate in a thread-local open frame
 * (krt_mesh_frame.h) until the runtime flushes (the end of a scheduler turn, or at once off the
 * schedulers), so a turn's messages to a peer are one queue item and one ZeroMQ message.
 *
 * Wire: DEALER (routing id "K" + node id, big-endian) -> peer ROUTER; one mesh frame (a batch
 * of envelopes with both sides' incarnations) per ZeroMQ message. Envelopes addressed to
 * KRT_ADDR_NONE are mesh control messages (heartbeat, goodbye, sever).
 *
 * Node down: a peer silent past peer_timeout_ms, its goodbye (BYE, sent by krt_mesh_stop),
 * krt_mesh_disconnect, or a frame from a new incarnation of it: node monitors fire,
 * krt_system_node_down breaks every relation with it, and sends to it fail with KRT_ENOCONN
 * until it is heard from again. A peer declared down for silence is told so (SEVER), so when
 * it wakes up it breaks its relations with us too.
 *
 * CURVE: a mesh with keys has its own ZeroMQ context and answers ZAP requests in its I/O
 * thread: a connection is accepted only if its routing id names a node added with
 * krt_mesh_connect and its CURVE public key is the one given for that node.
 */
#include "krt_mesh.h"
#include "krt_codec.h"
#include "krt_mesh_frame.h"

#include <czmq.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define S_MAX_MSG_DEF     (16u << 20)
#define S_QUEUE_LIMIT_DEF 100000
#define S_ZERO_COPY_MIN   4096 /* envelopes at least this big are handed to ZeroMQ uncopied */
#define S_DRAIN_BATCH     4096 /* queue items per loop turn */
#define S_RECV_BATCH      1024 /* inbound frames per loop turn */
#define S_CTL_HEARTBEAT   1    /* control envelope types (to == KRT_ADDR_NONE) */
#define S_CTL_BYE         2    /* the sender stops */
#define S_CTL_SEVER       3    /* the sender declared us down: drop relations with it */
#define S_FRAME_MAX       (256u << 10) /* an open frame grows up to this, then is queued */
#define S_FRAME_MIN       1024
#define S_OPEN_MAX        8  /* open frames (peers) per thread */
#define S_BYE_LINGER_MS   50 /* how long a closing dealer may take to deliver its goodbye */
#define S_NODE_WORDS      (65536 / 64)

/* ------------------------------------------------------------------------------------------ */
/* The process-wide ZeroMQ context, shared so that inproc:// endpoints reach each other.      */

static pthread_mutex_t s_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static void *s_ctx;
static int s_ctx_refs;

static void *s_ctx_acquire(void)
{
    pthread_mutex_lock(&s_ctx_lock);
    if (!s_ctx)
        s_ctx = zmq_ctx_new();
    if (s_ctx)
        s_ctx_refs++;
    void *ctx = s_ctx;
    pthread_mutex_unlock(&s_ctx_lock);
    return ctx;
}

/* Drops a reference; the last one terminates the context (joining ZeroMQ's threads). */
static void s_ctx_release(void)
{
    pthread_mutex_lock(&s_ctx_lock);
    if (--s_ctx_refs == 0) {
        zmq_ctx_term(s_ctx);
        s_ctx = NULL;
    }
    pthread_mutex_unlock(&s_ctx_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* Queue items and the MPSC queue                                                              */

typedef enum { S_IT_SEND, S_IT_PEER, S_IT_MONITOR, S_IT_DEMONITOR, S_IT_DISCONNECT } s_kind_t;

typedef struct s_item {
    struct s_item *_Atomic next;
    s_kind_t kind;
    uint16_t node;      /* SEND: destination node; PEER, MONITOR: the node */
    void *sock;         /* PEER: the connected DEALER, handed to the I/O thread */
    krt_addr_t watcher; /* MONITOR */
    uint8_t key[32];    /* PEER: the node's CURVE public key (CURVE meshes) */
    uint64_t ref;       /* MONITOR, DEMONITOR */
    size_t len;         /* SEND: frame bytes in data */
    size_t cap;         /* SEND: room in data */
    uint32_t count;     /* SEND: envelopes in the frame */
    uint8_t data[];     /* SEND: the mesh frame */
} s_item_t;

typedef struct s_queue {
    s_item_t *_Atomic head; /* producers swap themselves in here */
    s_item_t *tail;         /* consumer only */
    s_item_t stub;
} s_queue_t;

static void s_queue_init(s_queue_t *q)
{
    atomic_store(&q->stub.next, NULL);
    atomic_store(&q->head, &q->stub);
    q->tail = &q->stub;
}

static void s_queue_push(s_queue_t *q, s_item_t *it)
{
    atomic_store_explicit(&it->next, NULL, memory_order_relaxed);
    s_item_t *prev = atomic_exchange(&q->head, it);
    atomic_store_explicit(&prev->next, it, memory_order_release);
}

/* Consumer only. NULL if empty or if a producer is between its two steps (retry later). */
static s_item_t *s_queue_pop(s_queue_t *q)
{
    s_item_t *tail = q->tail;
    s_item_t *next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (tail == &q->stub) {
        if (!next)
            return NULL;
        q->tail = next;
        tail = next;
        next = atomic_load_explicit(&tail->next, memory_order_acquire);
    }
    if (next) {
        q->tail = next;
        return tail;
    }
    if (tail != atomic_load(&q->head))
        return NULL;
    s_queue_push(q, &q->stub);
    next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (next) {
        q->tail = next;
        return tail;
    }
    return NULL;
}

/* Consumer only: false only if the queue is certainly empty. */
static bool s_queue_busy(s_queue_t *q)
{
    return !(q->tail == &q->stub && atomic_load(&q->head) == &q->stub);
}

/* ------------------------------------------------------------------------------------------ */
/* The mesh                                                                                    */

typedef enum { S_PEER_UNKNOWN, S_PEER_UP, S_PEER_DOWN } s_peer_state_t;

/* A node we send to (dealer) and/or hear from. Holder of `work` only. */
typedef struct s_peer {
    uint16_t node;
    void *dealer; /* owned; NULL if we only hear from this node */
    s_peer_state_t state;
    uint64_t last_rx; /* ms, monotonic */
    bool has_key;     /* key is set: the node may connect to us (CURVE meshes) */
    uint8_t key[32];  /* its CURVE public key */
    uint64_t inc;     /* its incarnation, 0 until heard from */
    bool cut;         /* disconnected: its frames are dropped until connected again */
} s_peer_t;

/* A CURVE handshake whose client key no peer has yet: answered once a peer with that key is
 * added (nodes learn each other at different moments) or refused at its deadline. */
#define S_ZAP_WAIT_MS  2000
#define S_ZAP_WAIT_MAX 16
typedef struct s_zap_wait {
    zmq_msg_t id, req; /* the ZAP client's routing id, the request id */
    uint8_t key[32];
    uint64_t deadline; /* ms, monotonic */
} s_zap_wait_t;

/* A node monitor. Holder of `work` only. */
typedef struct s_mon {
    uint64_t ref;
    uint16_t node;
    krt_addr_t watcher;
} s_mon_t;

struct krt_mesh {
    krt_system_t *sys;
    uint16_t node_id;
    char path[32]; /* log path: node-N/mesh */
    char *bind;
    int heartbeat_ms;
    int peer_timeout_ms;
    uint32_t max_msg;
    int queue_limit;
    bool curve;
    char curve_public[41];
    char curve_secret[41];

    void *ctx;    /* shared context (one reference), or our own with CURVE */
    void *router; /* I/O thread after start */
    void *zap;    /* CURVE: ZAP handler (ROUTER: answers may wait), I/O thread after start */
    pthread_mutex_t work; /* the queue's consumer side, the dealers and what follows */
    char endpoint[256];
    int efd; /* wakes the I/O thread */
    pthread_t thread;
    bool started;
    bool stopped;
    pthread_mutex_t lock; /* start/stop/connect against each other */

    _Atomic bool running; /* sends and connects accepted */
    _Atomic bool io_run;  /* the I/O thread keeps looping */
    _Atomic int senders;  /* threads inside s_transport_send */
    _Atomic bool armed;   /* the I/O thread is about to sleep: producers must wake it */
    _Atomic uint64_t known[S_NODE_WORDS]; /* nodes with a peer */
    _Atomic uint64_t up[S_NODE_WORDS];    /* nodes currently up */
    _Atomic uint64_t down[S_NODE_WORDS];  /* nodes declared down and not heard from since */
    uint64_t incarnation;                 /* this mesh's life, random */
    uint64_t id;                          /* process-unique, for thread-local open frames */
    _Atomic uint64_t next_ref;
    s_queue_t q;
    s_item_t *held; /* holder of `work`: an item a flushing thread popped but left to the I/O
                       thread (not a send); it goes before the queue */
    krt_transport_t transport;

    _Atomic uint64_t st_sent, st_received, st_dropped, st_undeliverable, st_malformed,
        st_heartbeats, st_frames, st_stale, st_io_wakeups, st_signals;

    /* holder of `work` only */
    s_peer_t *peers;
    size_t n_peers, cap_peers;
    s_mon_t *mons;
    size_t n_mons, cap_mons;
    uint64_t next_hb;
    s_zap_wait_t zap_wait[S_ZAP_WAIT_MAX];
    size_t n_zap_wait;
};

static bool s_bit(const _Atomic uint64_t *set, uint16_t node)
{
    return (atomic_load_explicit(&set[node / 64], memory_order_acquire) >> (node % 64)) & 1;
}

static void s_bit_set(_Atomic uint64_t *set, uint16_t node, bool on)
{
    uint64_t mask = (uint64_t)1 << (node % 64);
    if (on)
        atomic_fetch_or(&set[node / 64], mask);
    else
        atomic_fetch_and(&set[node / 64], ~mask);
}

/* Wakes the I/O thread if it is (about to be) asleep. */
static void s_wake(krt_mesh_t *m)
{
    if (atomic_exchange(&m->armed, false)) {
        atomic_fetch_add_explicit(&m->st_signals, 1, memory_order_relaxed);
        uint64_t one = 1;
        ssize_t w = write(m->efd, &one, sizeof one);
        (void)w; /* only fails if the counter is saturated: it is awake anyway */
    }
}

static void s_enqueue(krt_mesh_t *m, s_item_t *it)
{
    s_queue_push(&m->q, it);
    s_wake(m);
}

static void s_write_out(krt_mesh_t *m);

/* ------------------------------------------------------------------------------------------ */
/* Send path (runtime threads)                                                                 */

/* This thread's open frames (one per peer) of mesh `mesh`. */
typedef struct s_open {
    uint16_t node;
    s_item_t *it;
} s_open_t;
static __thread struct {
    uint64_t mesh;
    int n;
    s_open_t o[S_OPEN_MAX];
} s_tl;
static _Atomic uint64_t s_mesh_ids;

static s_item_t *s_frame_new(uint16_t node, size_t need)
{
    size_t cap = KRT_MFRAME_HEADER + need;
    if (cap < S_FRAME_MIN)
        cap = S_FRAME_MIN;
    s_item_t *it = malloc(sizeof *it + cap);
    if (!it)
        return NULL;
    it->kind = S_IT_SEND;
    it->node = node;
    it->len = KRT_MFRAME_HEADER; /* the I/O thread writes the header */
    it->cap = cap;
    it->count = 0;
    return it;
}

/* Queues this thread's open frames of m (drops them if it no longer runs). */
static void s_flush_open(krt_mesh_t *m)
{
    if (s_tl.mesh != m->id || !s_tl.n)
        return;
    bool run = atomic_load(&m->running);
    for (int i = 0; i < s_tl.n; i++) {
        if (run) {
            s_queue_push(&m->q, s_tl.o[i].it);
        } else {
            atomic_fetch_add(&m->st_dropped, s_tl.o[i].it->count);
            free(s_tl.o[i].it);
        }
    }
    s_tl.n = 0;
    if (run)
        s_write_out(m);
}

/* The open frame for node with room for need more bytes; NULL if out of memory. */
static s_item_t **s_open_frame(krt_mesh_t *m, uint16_t node, size_t need)
{
    if (s_tl.mesh != m->id) { /* only ever flushed leftovers: none in practice */
        for (int i = 0; i < s_tl.n; i++)
            free(s_tl.o[i].it);
        s_tl.n = 0;
        s_tl.mesh = m->id;
    }
    s_open_t *o = NULL;
    for (int i = 0; i < s_tl.n && !o; i++)
        if (s_tl.o[i].node == node)
            o = &s_tl.o[i];
    if (o && o->it->len + need > o->it->cap) {
        if (o->it->len + need > S_FRAME_MAX) {
            s_enqueue(m, o->it);
            o->it = s_frame_new(node, need);
            if (!o->it) {
                *o = s_tl.o[--s_tl.n];
                return NULL;
            }
        } else {
            size_t cap = o->it->cap * 2 < o->it->len + need ? o->it->len + need : o->it->cap * 2;
            s_item_t *it = realloc(o->it, sizeof *it + cap);
            if (!it)
                return NULL;
            it->cap = cap;
            o->it = it;
        }
    } else if (!o) {
        if (s_tl.n == S_OPEN_MAX)
            s_flush_open(m);
        o = &s_tl.o[s_tl.n];
        o->node = node;
        o->it = s_frame_new(node, need);
        if (!o->it)
            return NULL;
        s_tl.n++;
    }
    return &o->it;
}

static int s_send(krt_mesh_t *m, krt_addr_t to, const krt_msg_t *msg)
{
    uint16_t node = krt_addr_node(to);
    if (!atomic_load(&m->running))
        return KRT_EREMOTE;
    if (!s_bit(m->known, node))
        return KRT_EREMOTE;
    if (s_bit(m->down, node))
        return KRT_ENOCONN;
    if (msg->len && !msg->body)
        return KRT_EINVAL;
    if ((size_t)msg->len > m->max_msg)
        return KRT_EMSGSIZE;
    size_t need = KRT_MFRAME_LEN + (size_t)msg->len + KRT_ENVELOPE_OVERHEAD;
    s_item_t **itp = s_open_frame(m, node, need);
    if (!itp)
        return KRT_ENOMEM;
    s_item_t *it = *itp;
    size_t elen;
    int rc = krt_envelope_encode_buf(it->data + it->len + KRT_MFRAME_LEN,
                                     it->cap - it->len - KRT_MFRAME_LEN, to, msg, &elen);
    if (rc)
        return rc;
    krt_mframe_len(it->data + it->len, (uint32_t)elen);
    it->len += KRT_MFRAME_LEN + elen;
    it->count++;
    return 0;
}

static int s_transport_send(void *self, krt_addr_t to, const krt_msg_t *msg)
{
    krt_mesh_t *m = self;
    atomic_fetch_add(&m->senders, 1);
    int rc = s_send(m, to, msg);
    atomic_fetch_sub(&m->senders, 1);
    return rc;
}

static void s_transport_flush(void *self)
{
    krt_mesh_t *m = self;
    atomic_fetch_add(&m->senders, 1);
    s_flush_open(m);
    atomic_fetch_sub(&m->senders, 1);
}

/* Installed when the mesh stops: it references nothing, so it is safe forever. */
static int s_transport_gone(void *self, krt_addr_t to, const krt_msg_t *msg)
{
    (void)self;
    (void)to;
    (void)msg;
    return KRT_EREMOTE;
}

/* ------------------------------------------------------------------------------------------ */
/* I/O thread                                                                                  */

static s_peer_t *s_peer_find(krt_mesh_t *m, uint16_t node)
{
    for (size_t i = 0; i < m->n_peers; i++)
        if (m->peers[i].node == node)
            return &m->peers[i];
    return NULL;
}

static s_peer_t *s_peer_get(krt_mesh_t *m, uint16_t node)
{
    s_peer_t *p = s_peer_find(m, node);
    if (p)
        return p;
    if (m->n_peers == m->cap_peers) {
        size_t cap = m->cap_peers ? m->cap_peers * 2 : 8;
        s_peer_t *np = realloc(m->peers, cap * sizeof *np);
        if (!np)
            return NULL;
        m->peers = np;
        m->cap_peers = cap;
    }
    p = &m->peers[m->n_peers++];
    memset(p, 0, sizeof *p);
    p->node = node;
    p->state = S_PEER_UNKNOWN;
    return p;
}

/* Delivers a node-down to one watcher. */
static void s_mon_fire(krt_mesh_t *m, const s_mon_t *mon)
{
    krt_down_t d = {.who = (krt_addr_t)mon->node << 48, .ref = mon->ref, .reason = KRT_EXIT_NOCONN};
    krt_msg_t msg = {.type = KRT_MSG_DOWN, .len = sizeof d, .body = &d};
    int rc = krt_system_deliver(m->sys, mon->watcher, &msg);
    if (rc)
        krt_log(KRT_LOG_DEBUG, m->path, "node_down_undeliverable", "watcher=%#llx err=%d",
                (unsigned long long)mon->watcher, rc);
}

/* One control envelope in its own frame, straight to the peer's dealer. */
static void s_ctl_send(krt_mesh_t *m, s_peer_t *p, uint32_t type)
{
    if (!p->dealer)
        return;
    uint8_t buf[KRT_MFRAME_HEADER + KRT_MFRAME_LEN + KRT_ENVELOPE_OVERHEAD];
    size_t len;
    krt_msg_t c = {.type = type, .from = krt_node_addr(m->node_id)};
    krt_mframe_header(buf, m->incarnation, p->inc);
    krt_envelope_encode_buf(buf + KRT_MFRAME_HEADER + KRT_MFRAME_LEN,
                            sizeof buf - KRT_MFRAME_HEADER - KRT_MFRAME_LEN, KRT_ADDR_NONE, &c,
                            &len);
    krt_mframe_len(buf + KRT_MFRAME_HEADER, (uint32_t)len);
    zmq_send(p->dealer, buf, KRT_MFRAME_HEADER + KRT_MFRAME_LEN + len, ZMQ_DONTWAIT);
}

/* The node is down (why: timeout, bye, sever, disconnect, restart): its monitors fire, the
 * runtime breaks every relation with it; a peer that timed out is told (sever). */
static void s_peer_down(krt_mesh_t *m, s_peer_t *p, const char *why)
{
    bool was_down = p->state == S_PEER_DOWN, was_up = p->state == S_PEER_UP;
    p->state = S_PEER_DOWN;
    s_bit_set(m->up, p->node, false);
    s_bit_set(m->down, p->node, true); /* before the runtime looks: later sends fail at once */
    if (was_down)
        return;
    krt_log(KRT_LOG_WARN, m->path, "node_down", "node=%u reason=%s silent_ms=%llu", p->node, why,
            (unsigned long long)((uint64_t)krt_mono_ms() - p->last_rx));
    size_t keep = 0;
    for (size_t i = 0; i < m->n_mons; i++) {
        if (m->mons[i].node == p->node)
            s_mon_fire(m, &m->mons[i]);
        else
            m->mons[keep++] = m->mons[i];
    }
    m->n_mons = keep;
    krt_system_node_down(m->sys, p->node);
    if (was_up && strcmp(why, "timeout") == 0) /* it may still hold relations with us */
        s_ctl_send(m, p, S_CTL_SEVER);
}

static void s_peer_heard(krt_mesh_t *m, uint16_t node, uint64_t now)
{
    s_peer_t *p = s_peer_get(m, node);
    if (!p)
        return;
    p->last_rx = now;
    if (p->state != S_PEER_UP) {
        p->state = S_PEER_UP;
        s_bit_set(m->down, node, false);
        s_bit_set(m->up, node, true);
        krt_log(KRT_LOG_INFO, m->path, "node_up", "node=%u", node);
    }
}

static void s_free_hint(void *data, void *hint)
{
    (void)data; /* inside hint, the queue item */
    free(hint);
}

static void s_do_send(krt_mesh_t *m, s_item_t *it)
{
    s_peer_t *p = s_peer_find(m, it->node);
    if (!p || !p->dealer) {
        atomic_fetch_add(&m->st_dropped, it->count);
        free(it);
        return;
    }
    int rc, err = 0;
    uint32_t count = it->count;
    krt_mframe_header(it->data, m->incarnation, p->inc);
    atomic_fetch_add(&m->st_sent, count); /* before the send, as for st_received */
    atomic_fetch_add_explicit(&m->st_frames, 1, memory_order_relaxed);
    if (it->len >= S_ZERO_COPY_MIN) {
        /* ZeroMQ owns it from here: s_free_hint frees it once sent (or at once on failure). */
        zmq_msg_t zm;
        zmq_msg_init_data(&zm, it->data, it->len, s_free_hint, it);
        rc = zmq_msg_send(&zm, p->dealer, ZMQ_DONTWAIT);
        if (rc < 0) {
            err = zmq_errno();
            zmq_msg_close(&zm);
        }
    } else {
        rc = zmq_send(p->dealer, it->data, it->len, ZMQ_DONTWAIT);
        if (rc < 0)
            err = zmq_errno();
        free(it);
    }
    if (rc < 0) {
        atomic_fetch_sub(&m->st_sent, count);
        uint64_t n = atomic_fetch_add(&m->st_dropped, count);
        if (n % 10000 < count)
            krt_log(KRT_LOG_WARN, m->path, "send_dropped", "node=%u err=%d dropped=%llu", p->node,
                    -err, (unsigned long long)n + 1);
    }
}

static void s_do_peer(krt_mesh_t *m, s_item_t *it)
{
    s_peer_t *p = s_peer_get(m, it->node);
    if (!p || p->dealer) { /* out of memory, or a duplicate (connect prevents it) */
        zmq_close(it->sock);
    } else {
        p->dealer = it->sock;
        if (p->state != S_PEER_UP) { /* silence is counted from the connect */
            p->state = S_PEER_UNKNOWN;
            p->last_rx = (uint64_t)krt_mono_ms();
        }
        p->cut = false;
        p->has_key = m->curve;
        memcpy(p->key, it->key, sizeof p->key);
        s_ctl_send(m, p, S_CTL_HEARTBEAT); /* our incarnation, first on the stream */
    }
    free(it);
}

static void s_do_monitor(krt_mesh_t *m, s_item_t *it)
{
    s_mon_t mon = {.ref = it->ref, .node = it->node, .watcher = it->watcher};
    free(it);
    s_peer_t *p = s_peer_find(m, mon.node);
    if (p && p->state == S_PEER_DOWN) {
        s_mon_fire(m, &mon);
        return;
    }
    if (m->n_mons == m->cap_mons) {
        size_t cap = m->cap_mons ? m->cap_mons * 2 : 8;
        s_mon_t *nm = realloc(m->mons, cap * sizeof *nm);
        if (!nm) {
            krt_log(KRT_LOG_ERROR, m->path, "monitor_lost", "node=%u err=%d", mon.node, KRT_ENOMEM);
            return;
        }
        m->mons = nm;
        m->cap_mons = cap;
    }
    m->mons[m->n_mons++] = mon;
}

static void s_do_demonitor(krt_mesh_t *m, s_item_t *it)
{
    for (size_t i = 0; i < m->n_mons; i++) {
        if (m->mons[i].ref == it->ref) {
            m->mons[i] = m->mons[--m->n_mons];
            break;
        }
    }
    free(it);
}

/* Says goodbye, closes the dealer (its goodbye may take S_BYE_LINGER_MS). */
static void s_dealer_close(krt_mesh_t *m, s_peer_t *p)
{
    int linger = S_BYE_LINGER_MS;
    s_ctl_send(m, p, S_CTL_BYE);
    zmq_setsockopt(p->dealer, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(p->dealer);
    p->dealer = NULL;
}

static void s_do_disconnect(krt_mesh_t *m, s_item_t *it)
{
    s_peer_t *p = s_peer_find(m, it->node);
    free(it);
    if (!p)
        return;
    if (p->dealer)
        s_dealer_close(m, p);
    p->cut = true;
    s_peer_down(m, p, "disconnect");
}

static void s_do_item(krt_mesh_t *m, s_item_t *it)
{
    switch (it->kind) {
    case S_IT_SEND:
        s_do_send(m, it);
        break;
    case S_IT_PEER:
        s_do_peer(m, it);
        break;
    case S_IT_MONITOR:
        s_do_monitor(m, it);
        break;
    case S_IT_DEMONITOR:
        s_do_demonitor(m, it);
        break;
    case S_IT_DISCONNECT:
        s_do_disconnect(m, it);
        break;
    }
}

/* The next item to work on (I/O thread): the one a flushing thread held back, then the queue's. */
static s_item_t *s_next(krt_mesh_t *m)
{
    s_item_t *it = m->held;
    if (!it)
        return s_queue_pop(&m->q);
    m->held = NULL;
    return it;
}

static void s_drain(krt_mesh_t *m)
{
    for (int i = 0; i < S_DRAIN_BATCH; i++) {
        s_item_t *it = s_next(m);
        if (!it)
            return;
        s_do_item(m, it);
    }
}

/* A flushing thread writes the queued frames out up to the first item that is not a send
 * (peers, monitors, disconnects: their work calls back into the runtime, so they stay on the
 * I/O thread), which it holds for the I/O thread. */
static void s_drain_sends(krt_mesh_t *m)
{
    for (int i = 0; i < S_DRAIN_BATCH && !m->held; i++) {
        s_item_t *it = s_queue_pop(&m->q);
        if (!it)
            return;
        if (it->kind == S_IT_SEND)
            s_do_send(m, it);
        else
            m->held = it;
    }
}

/* Writes the queued frames out on this thread if the I/O thread is not at work (it sleeps in
 * zmq_poll), else leaves them to the I/O thread, woken if it sleeps. */
static void s_write_out(krt_mesh_t *m)
{
    if (pthread_mutex_trylock(&m->work) != 0) {
        s_wake(m);
        return;
    }
    s_drain_sends(m);
    bool more = m->held || s_queue_busy(&m->q);
    pthread_mutex_unlock(&m->work);
    if (more)
        s_wake(m);
}

/* ZAP (RFC 27) over a ROUTER, so an answer can wait: frames are the client's routing id, an
 * empty delimiter, then version, request id, domain, address, identity, mechanism, client
 * public key. */
static bool s_zap_valid(zmq_msg_t *f, int n)
{
    return n == 9 && zmq_msg_size(&f[1]) == 0 && zmq_msg_size(&f[2]) == 3 &&
           memcmp(zmq_msg_data(&f[2]), "1.0", 3) == 0 && zmq_msg_size(&f[7]) == 5 &&
           memcmp(zmq_msg_data(&f[7]), "CURVE", 5) == 0 && zmq_msg_size(&f[8]) == 32;
}

/* The node whose key it is (ZeroMQ then tags that connection's messages with it as User-Id),
 * or 0. */
static uint16_t s_zap_node(const krt_mesh_t *m, const uint8_t key[32])
{
    for (size_t i = 0; i < m->n_peers; i++)
        if (m->peers[i].has_key && memcmp(m->peers[i].key, key, 32) == 0)
            return m->peers[i].node;
    return 0;
}

/* Reply: routing id, delimiter, version, request id, status code, status text, user id,
 * metadata. node 0 refuses. */
static void s_zap_reply(krt_mesh_t *m, zmq_msg_t *id, zmq_msg_t *req, uint16_t node)
{
    char uid[8];
    int ulen = snprintf(uid, sizeof uid, "%u", node);
    if (!node)
        krt_log(KRT_LOG_WARN, m->path, "peer_refused", "reason=unknown_curve_key");
    zmq_send(m->zap, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
    zmq_send(m->zap, "", 0, ZMQ_SNDMORE);
    zmq_send(m->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(m->zap, zmq_msg_data(req), zmq_msg_size(req), ZMQ_SNDMORE);
    zmq_send(m->zap, node ? "200" : "400", 3, ZMQ_SNDMORE);
    zmq_send(m->zap, node ? "OK" : "unknown key", node ? 2 : 11, ZMQ_SNDMORE);
    zmq_send(m->zap, uid, node ? (size_t)ulen : 0, ZMQ_SNDMORE);
    zmq_send(m->zap, "", 0, 0);
}

static void s_zap_handle(krt_mesh_t *m, uint64_t now)
{
    zmq_msg_t f[10];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, m->zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&part);
            break;
        }
        more = zmq_msg_more(&part);
        if (n < 10)
            f[n++] = part; /* moved: closed below */
        else
            zmq_msg_close(&part);
    }
    bool valid = s_zap_valid(f, n);
    uint16_t node = valid ? s_zap_node(m, zmq_msg_data(&f[8])) : 0;
    if (valid && !node && m->n_zap_wait < S_ZAP_WAIT_MAX) {
        s_zap_wait_t *w = &m->zap_wait[m->n_zap_wait++];
        zmq_msg_init(&w->id);
        zmq_msg_init(&w->req);
        zmq_msg_move(&w->id, &f[0]);
        zmq_msg_move(&w->req, &f[3]);
        memcpy(w->key, zmq_msg_data(&f[8]), 32);
        w->deadline = now + S_ZAP_WAIT_MS;
    } else if (n >= 4) {
        s_zap_reply(m, &f[0], &f[3], node);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

/* Answers the waiting handshakes whose key a new peer brought, refuses the expired ones.
 * Returns the ms until the next deadline (-1: none waits). */
static long s_zap_waiting(krt_mesh_t *m, uint64_t now)
{
    long next = -1;
    for (size_t i = 0; i < m->n_zap_wait;) {
        s_zap_wait_t *w = &m->zap_wait[i];
        uint16_t node = s_zap_node(m, w->key);
        if (node || now >= w->deadline) {
            s_zap_reply(m, &w->id, &w->req, node);
            zmq_msg_close(&w->id);
            zmq_msg_close(&w->req);
            *w = m->zap_wait[--m->n_zap_wait];
            continue;
        }
        long left = (long)(w->deadline - now);
        if (next < 0 || left < next)
            next = left;
        i++;
    }
    return next;
}

/* CURVE: true if the message came over a connection authenticated as `node`. */
static bool s_authentic(krt_mesh_t *m, zmq_msg_t *body, uint16_t node)
{
    if (!m->curve)
        return true;
    const char *uid = zmq_msg_gets(body, "User-Id");
    return uid && strtoul(uid, NULL, 10) == node;
}

/* Parses a DEALER routing id ("K" + node id); 0 if it is not one of ours. */
static uint16_t s_id_node(zmq_msg_t *id)
{
    const uint8_t *d = zmq_msg_data(id);
    if (zmq_msg_size(id) != 3 || d[0] != 'K')
        return 0;
    return (uint16_t)((d[1] << 8) | d[2]);
}

static void s_bad(krt_mesh_t *m, uint16_t node, size_t len, int err)
{
    uint64_t n = atomic_fetch_add(&m->st_malformed, 1);
    if (n % 1000 == 0)
        krt_log(KRT_LOG_WARN, m->path, "bad_frame", "node=%u len=%zu err=%d", node, len, err);
}

/* A control envelope (to KRT_ADDR_NONE); false if it is none we know. */
static bool s_on_control(krt_mesh_t *m, uint16_t node, const krt_msg_t *msg, uint64_t now)
{
    if (msg->type == S_CTL_HEARTBEAT) {
        s_peer_heard(m, node, now);
        atomic_fetch_add_explicit(&m->st_heartbeats, 1, memory_order_relaxed);
        return true;
    }
    if (msg->type != S_CTL_BYE && msg->type != S_CTL_SEVER)
        return false;
    s_peer_t *p = s_peer_get(m, node);
    if (p)
        s_peer_down(m, p, msg->type == S_CTL_BYE ? "bye" : "sever");
    return true;
}

static void s_on_envelope(krt_mesh_t *m, uint16_t node, const void *data, size_t len, uint64_t now)
{
    krt_addr_t to;
    krt_msg_t msg;
    int rc = krt_envelope_decode(data, len, &to, &msg);
    if (rc == 0 && to == KRT_ADDR_NONE && s_on_control(m, node, &msg, now))
        return;
    if (!rc && msg.from != KRT_ADDR_NONE && krt_addr_node(msg.from) != node)
        rc = KRT_EINVAL; /* a node speaks only for its own actors */
    if (rc || krt_addr_node(to) != m->node_id) {
        s_bad(m, node, len, rc ? rc : KRT_EREMOTE);
        return;
    }
    s_peer_heard(m, node, now);
    /* Counted before delivery, so whoever sees the message's effects also sees the count. */
    atomic_fetch_add(&m->st_received, 1);
    rc = krt_system_deliver(m->sys, to, &msg);
    if (rc) {
        atomic_fetch_sub(&m->st_received, 1);
        atomic_fetch_add(&m->st_undeliverable, 1);
    }
}

/* One inbound mesh frame from node: checked as a whole (incarnations), then envelope by
 * envelope; a length running past the end drops the rest. */
static void s_on_frame(krt_mesh_t *m, uint16_t node, const void *data, size_t len, uint64_t now)
{
    krt_mframe_t f;
    int rc = krt_mframe_open(&f, data, len);
    s_peer_t *p = rc ? NULL : s_peer_get(m, node);
    if (!p) {
        s_bad(m, node, len, rc ? rc : KRT_ENOMEM);
        return;
    }
    if (p->cut || (f.dst_inc && f.dst_inc != m->incarnation) || !f.src_inc) {
        atomic_fetch_add_explicit(&m->st_stale, 1, memory_order_relaxed);
        return;
    }
    if (p->inc != f.src_inc) {
        if (p->inc)
            s_peer_down(m, p, "restart"); /* relations were with its previous life */
        p->inc = f.src_inc;
    }
    const uint8_t *env;
    size_t elen;
    while ((rc = krt_mframe_next(&f, &env, &elen)) > 0)
        s_on_envelope(m, node, env, elen, now);
    if (rc < 0)
        s_bad(m, node, len, rc);
}

/* Reads up to S_RECV_BATCH inbound messages ([routing id][envelope]). */
static void s_recv_batch(krt_mesh_t *m, uint64_t now)
{
    for (int i = 0; i < S_RECV_BATCH; i++) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, m->router, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return;
        }
        if (!zmq_msg_more(&id)) { /* cannot happen with a ROUTER; be safe */
            zmq_msg_close(&id);
            continue;
        }
        zmq_msg_init(&body);
        zmq_msg_recv(&body, m->router, 0); /* parts arrive together */
        uint16_t node = s_id_node(&id);
        if (zmq_msg_more(&body) || node == 0 || !s_authentic(m, &body, node)) {
            atomic_fetch_add(&m->st_malformed, 1);
            while (zmq_msg_more(&body)) /* discard the rest of a multipart message */
                zmq_msg_recv(&body, m->router, 0);
        } else {
            s_on_frame(m, node, zmq_msg_data(&body), zmq_msg_size(&body), now);
        }
        zmq_msg_close(&body);
        zmq_msg_close(&id);
    }
}

/* Sends heartbeats when due and marks silent peers down. */
static void s_heartbeat(krt_mesh_t *m, uint64_t now)
{
    if (m->heartbeat_ms <= 0 || now < m->next_hb)
        return;
    m->next_hb = now + (uint64_t)m->heartbeat_ms;
    for (size_t i = 0; i < m->n_peers; i++) {
        s_peer_t *p = &m->peers[i];
        s_ctl_send(m, p, S_CTL_HEARTBEAT);
        /* Up and then silent, or connected to but never heard from: down. */
        bool watched = p->state == S_PEER_UP || (p->state == S_PEER_UNKNOWN && p->dealer);
        if (watched && now - p->last_rx > (uint64_t)m->peer_timeout_ms)
            s_peer_down(m, p, "timeout");
    }
}

static void s_io_cleanup(krt_mesh_t *m)
{
    s_item_t *it;
    /* Producers are gone (stop waited for them), so the queue is consistent: what was sent
     * before stop goes out, then every peer hears our goodbye. */
    while ((it = s_next(m)) != NULL) {
        if (it->kind == S_IT_SEND) {
            s_do_send(m, it);
            continue;
        }
        if (it->kind == S_IT_PEER)
            zmq_close(it->sock);
        free(it);
    }
    bool bye = false;
    for (size_t i = 0; i < m->n_peers; i++) {
        if (m->peers[i].dealer) {
            s_dealer_close(m, &m->peers[i]);
            bye = true;
        }
    }
    /* The goodbyes' connections close before stop returns: a mesh started again at once is
     * not refused by a peer's ROUTER still holding the old connection under our id. */
    if (bye)
        usleep(2 * S_BYE_LINGER_MS * 1000);
    free(m->peers);
    m->peers = NULL;
    m->n_peers = m->cap_peers = 0;
    free(m->mons);
    m->mons = NULL;
    m->n_mons = m->cap_mons = 0;
    zmq_close(m->router);
    m->router = NULL;
    for (size_t i = 0; i < m->n_zap_wait; i++) {
        zmq_msg_close(&m->zap_wait[i].id);
        zmq_msg_close(&m->zap_wait[i].req);
    }
    m->n_zap_wait = 0;
    if (m->zap)
        zmq_close(m->zap);
    m->zap = NULL;
    /* ZeroMQ leaves the socket file of an ipc:// endpoint behind: remove what we created. */
    if (strncmp(m->endpoint, "ipc://", 6) == 0 && m->endpoint[6] != '@')
        unlink(m->endpoint + 6);
}

static void *s_io_main(void *arg)
{
    krt_mesh_t *m = arg;
    zmq_pollitem_t items[3] = {
        {m->router, 0, ZMQ_POLLIN, 0}, {NULL, m->efd, ZMQ_POLLIN, 0}, {m->zap, 0, ZMQ_POLLIN, 0}};
    int n_items = m->zap ? 3 : 2;
    m->next_hb = (uint64_t)krt_mono_ms();
    pthread_mutex_lock(&m->work);
    while (atomic_load(&m->io_run)) {
        long timeout = -1;
        uint64_t now = (uint64_t)krt_mono_ms();
        if (m->heartbeat_ms > 0)
            timeout = m->next_hb > now ? (long)(m->next_hb - now) : 0;
        long zap = s_zap_waiting(m, now);
        if (zap >= 0 && (timeout < 0 || zap < timeout))
            timeout = zap;
        atomic_store(&m->armed, true);
        if (m->held || s_queue_busy(&m->q))
            timeout = 0;
        pthread_mutex_unlock(&m->work);
        int rc = zmq_poll(items, n_items, timeout);
        pthread_mutex_lock(&m->work);
        atomic_store(&m->armed, false);
        if (rc > 0 && timeout != 0)
            atomic_fetch_add_explicit(&m->st_io_wakeups, 1, memory_order_relaxed);
        if (rc < 0 && zmq_errno() != EINTR) {
            krt_log(KRT_LOG_ERROR, m->path, "poll_failed", "err=%d", -zmq_errno());
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t r = read(m->efd, &v, sizeof v);
            (void)r; /* nonblocking: EAGAIN just means a racing read already reset it */
        }
        s_drain(m); /* first: peers (and their keys) added before a handshake are known */
        now = (uint64_t)krt_mono_ms();
        if (n_items == 3 && (items[2].revents & ZMQ_POLLIN))
            s_zap_handle(m, now);
        s_zap_waiting(m, now);
        if (items[0].revents & ZMQ_POLLIN)
            s_recv_batch(m, now);
        s_heartbeat(m, now);
    }
    s_io_cleanup(m);
    pthread_mutex_unlock(&m->work);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                  */

static int s_load_keys(krt_mesh_t *m, const krt_mesh_config_t *cfg)
{
    if (cfg->curve_cert) {
        zcert_t *cert = zcert_load(cfg->curve_cert);
        if (!cert)
            return KRT_EINVAL;
        (void)snprintf(m->curve_public, sizeof m->curve_public, "%s", zcert_public_txt(cert));
        (void)snprintf(m->curve_secret, sizeof m->curve_secret, "%s", zcert_secret_txt(cert));
        zcert_destroy(&cert);
    } else if (cfg->curve_public || cfg->curve_secret) {
        if (!cfg->curve_public || !cfg->curve_secret || strlen(cfg->curve_public) != 40 ||
            strlen(cfg->curve_secret) != 40)
            return KRT_EINVAL;
        memcpy(m->curve_public, cfg->curve_public, 41);
        memcpy(m->curve_secret, cfg->curve_secret, 41);
    } else {
        return 0;
    }
    /* A zcert without its secret part loads with an all-zero secret key. */
    static const char zero_z85[] = "0000000000000000000000000000000000000000";
    if (strlen(m->curve_secret) != 40 || strcmp(m->curve_secret, zero_z85) == 0)
        return KRT_EINVAL;
    m->curve = true;
    return 0;
}

krt_mesh_t *krt_mesh_new(krt_system_t *sys, const krt_mesh_config_t *cfg)
{
    if (!sys || !cfg || !cfg->bind || cfg->heartbeat_ms < 0 || cfg->peer_timeout_ms < 0 ||
        cfg->queue_limit < 0)
        return NULL;
    krt_mesh_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->efd = -1;
    m->sys = sys;
    m->node_id = krt_system_node_id(sys);
    (void)snprintf(m->path, sizeof m->path, "node-%u/mesh", m->node_id);
    m->heartbeat_ms = cfg->heartbeat_ms;
    m->peer_timeout_ms = cfg->peer_timeout_ms ? cfg->peer_timeout_ms : 3 * cfg->heartbeat_ms;
    m->max_msg = cfg->max_msg ? cfg->max_msg : S_MAX_MSG_DEF;
    m->queue_limit = cfg->queue_limit ? cfg->queue_limit : S_QUEUE_LIMIT_DEF;
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->work, NULL);
    s_queue_init(&m->q);
    atomic_store(&m->next_ref, 1);
    m->transport.send = s_transport_send;
    m->transport.flush = s_transport_flush;
    m->transport.self = m;
    m->id = atomic_fetch_add(&s_mesh_ids, 1) + 1;
    if (getrandom(&m->incarnation, sizeof m->incarnation, 0) != sizeof m->incarnation)
        m->incarnation = (uint64_t)krt_wall_ms() ^ ((uint64_t)getpid() << 40);
    m->incarnation |= 1; /* never 0: 0 means "not known" on the wire */
    m->bind = strdup(cfg->bind);
    if (!m->bind || s_load_keys(m, cfg) != 0)
        goto fail;
    m->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->efd < 0)
        goto fail;
    m->ctx = m->curve ? zmq_ctx_new() : s_ctx_acquire();
    if (!m->ctx)
        goto fail;
    return m;
fail:
    if (m->efd >= 0)
        close(m->efd);
    free(m->bind);
    pthread_mutex_destroy(&m->lock);
    pthread_mutex_destroy(&m->work);
    free(m);
    return NULL;
}

/* Options every mesh socket gets. */
static int s_sock_common(krt_mesh_t *m, void *s)
{
    int zero = 0;
    int64_t maxmsg = (int64_t)m->max_msg + KRT_ENVELOPE_OVERHEAD;
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg))
        return -zmq_errno();
    return 0;
}

/* CURVE: the ZAP handler of our own context, bound before any CURVE socket exists. */
static int s_zap_open(krt_mesh_t *m)
{
    int zero = 0;
    m->zap = zmq_socket(m->ctx, ZMQ_ROUTER);
    if (!m->zap)
        return -zmq_errno();
    if (zmq_setsockopt(m->zap, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(m->zap, "inproc://zeromq.zap.01")) {
        int rc = -zmq_errno();
        zmq_close(m->zap);
        m->zap = NULL;
        return rc;
    }
    return 0;
}

static int s_router_open(krt_mesh_t *m)
{
    if (m->curve) {
        int rc = s_zap_open(m);
        if (rc)
            return rc;
    }
    m->router = zmq_socket(m->ctx, ZMQ_ROUTER);
    if (!m->router)
        return -zmq_errno();
    int one = 1, hwm = 0;
    /* No ZMQ_ROUTER_HANDOVER: a second connection claiming a connected node's routing id is
     * refused rather than allowed to silently cut the live one. A restarted node's old
     * connection closes with its process, so its reconnection is accepted. */
    int rc = s_sock_common(m, m->router);
    if (!rc && zmq_setsockopt(m->router, ZMQ_RCVHWM, &hwm, sizeof hwm))
        rc = -zmq_errno();
    if (!rc && m->curve &&
        (zmq_setsockopt(m->router, ZMQ_CURVE_SERVER, &one, sizeof one) ||
         zmq_setsockopt(m->router, ZMQ_CURVE_SECRETKEY, m->curve_secret, 40) ||
         zmq_setsockopt(m->router, ZMQ_ZAP_DOMAIN, "kagent-mesh", 11)))
        rc = -zmq_errno();
    if (!rc && zmq_bind(m->router, m->bind))
        rc = -zmq_errno();
    size_t len = sizeof m->endpoint;
    if (!rc && zmq_getsockopt(m->router, ZMQ_LAST_ENDPOINT, m->endpoint, &len))
        rc = -zmq_errno();
    if (rc) {
        zmq_close(m->router);
        m->router = NULL;
        if (m->zap)
            zmq_close(m->zap);
        m->zap = NULL;
    }
    return rc;
}

int krt_mesh_start(krt_mesh_t *m)
{
    pthread_mutex_lock(&m->lock);
    int rc = KRT_EINVAL;
    if (m->started)
        goto out;
    rc = s_router_open(m);
    if (rc) {
        krt_log(KRT_LOG_ERROR, m->path, "bind_failed", "endpoint=%s err=%d", m->bind, rc);
        goto out;
    }
    atomic_store(&m->io_run, true);
    rc = -pthread_create(&m->thread, NULL, s_io_main, m);
    if (rc) {
        zmq_close(m->router);
        m->router = NULL;
        if (m->zap)
            zmq_close(m->zap);
        m->zap = NULL;
        goto out;
    }
    m->started = true;
    atomic_store(&m->running, true);
    krt_system_set_transport(m->sys, &m->transport);
    krt_log(KRT_LOG_INFO, m->path, "listening", "endpoint=%s curve=%s", m->endpoint,
            m->curve ? "on" : "off");
out:
    pthread_mutex_unlock(&m->lock);
    return rc;
}

const char *krt_mesh_endpoint(const krt_mesh_t *m)
{
    return m->started ? m->endpoint : NULL;
}

static void *s_dealer_open(krt_mesh_t *m, const char *endpoint, const char *server_key, int *err)
{
    void *s = zmq_socket(m->ctx, ZMQ_DEALER);
    if (!s) {
        *err = -zmq_errno();
        return NULL;
    }
    uint8_t id[3] = {'K', (uint8_t)(m->node_id >> 8), (uint8_t)m->node_id};
    int ivl = 100;
    int rc = s_sock_common(m, s);
    if (!rc && (zmq_setsockopt(s, ZMQ_ROUTING_ID, id, sizeof id) ||
                zmq_setsockopt(s, ZMQ_SNDHWM, &m->queue_limit, sizeof m->queue_limit) ||
                zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl)))
        rc = -zmq_errno();
    if (!rc && m->curve &&
        (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key, 40) ||
         zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, m->curve_public, 40) ||
         zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, m->curve_secret, 40)))
        rc = -zmq_errno();
    if (!rc && zmq_connect(s, endpoint))
        rc = -zmq_errno();
    if (rc) {
        zmq_close(s);
        *err = rc;
        return NULL;
    }
    return s;
}

int krt_mesh_connect(krt_mesh_t *m, uint16_t node, const char *endpoint, const char *server_key)
{
    if (node == 0 || node == m->node_id || !endpoint ||
        (m->curve && (!server_key || strlen(server_key) != 40)))
        return KRT_EINVAL;
    pthread_mutex_lock(&m->lock);
    int rc = KRT_ESHUTDOWN;
    if (!atomic_load(&m->running))
        goto out;
    rc = KRT_EEXIST;
    if (s_bit(m->known, node))
        goto out;
    s_item_t *it = calloc(1, sizeof *it);
    rc = KRT_ENOMEM;
    if (!it)
        goto out;
    it->sock = s_dealer_open(m, endpoint, server_key, &rc);
    if (!it->sock) {
        free(it);
        goto out;
    }
    it->kind = S_IT_PEER;
    it->node = node;
    if (m->curve && !zmq_z85_decode(it->key, server_key)) {
        zmq_close(it->sock);
        free(it);
        rc = KRT_EINVAL;
        goto out;
    }
    /* The peer item is queued before the node becomes known, so every send that sees the
     * node known is queued behind it. */
    s_enqueue(m, it);
    s_bit_set(m->down, node, false);
    s_bit_set(m->known, node, true);
    krt_log(KRT_LOG_INFO, m->path, "peer_added", "node=%u endpoint=%s", node, endpoint);
    rc = 0;
out:
    pthread_mutex_unlock(&m->lock);
    return rc;
}

bool krt_mesh_has_peer(const krt_mesh_t *m, uint16_t node)
{
    return s_bit(m->known, node);
}

bool krt_mesh_node_up(const krt_mesh_t *m, uint16_t node)
{
    return s_bit(m->up, node);
}

/* Queues a control item if the mesh runs (the lock keeps stop from racing the push). */
static int s_control(krt_mesh_t *m, s_item_t *it)
{
    pthread_mutex_lock(&m->lock);
    bool ok = atomic_load(&m->running);
    if (ok)
        s_enqueue(m, it);
    pthread_mutex_unlock(&m->lock);
    if (!ok) {
        free(it);
        return KRT_ESHUTDOWN;
    }
    return 0;
}

int krt_mesh_monitor_node(krt_mesh_t *m, uint16_t node, krt_addr_t watcher, uint64_t *ref)
{
    if (node == 0 || watcher == KRT_ADDR_NONE)
        return KRT_EINVAL;
    s_item_t *it = calloc(1, sizeof *it);
    if (!it)
        return KRT_ENOMEM;
    it->kind = S_IT_MONITOR;
    it->node = node;
    it->watcher = watcher;
    it->ref = atomic_fetch_add(&m->next_ref, 1);
    uint64_t r = it->ref;
    int rc = s_control(m, it);
    if (!rc && ref)
        *ref = r;
    return rc;
}

int krt_mesh_disconnect(krt_mesh_t *m, uint16_t node)
{
    s_item_t *it = calloc(1, sizeof *it);
    if (!it)
        return KRT_ENOMEM;
    it->kind = S_IT_DISCONNECT;
    it->node = node;
    pthread_mutex_lock(&m->lock);
    int rc = !atomic_load(&m->running)             ? KRT_ESHUTDOWN
             : node == 0 || !s_bit(m->known, node) ? KRT_EINVAL
                                                   : 0;
    if (!rc) {
        s_bit_set(m->known, node, false); /* sends fail at once from here */
        s_enqueue(m, it);
    }
    pthread_mutex_unlock(&m->lock);
    if (rc)
        free(it);
    return rc;
}

int krt_mesh_demonitor_node(krt_mesh_t *m, uint64_t ref)
{
    s_item_t *it = calloc(1, sizeof *it);
    if (!it)
        return KRT_ENOMEM;
    it->kind = S_IT_DEMONITOR;
    it->ref = ref;
    return s_control(m, it);
}

void krt_mesh_stats(const krt_mesh_t *m, krt_mesh_stats_t *out)
{
    out->sent = atomic_load(&m->st_sent);
    out->received = atomic_load(&m->st_received);
    out->dropped = atomic_load(&m->st_dropped);
    out->undeliverable = atomic_load(&m->st_undeliverable);
    out->malformed = atomic_load(&m->st_malformed);
    out->heartbeats = atomic_load(&m->st_heartbeats);
    out->frames = atomic_load(&m->st_frames);
    out->stale = atomic_load(&m->st_stale);
    out->io_wakeups = atomic_load(&m->st_io_wakeups);
    out->signals = atomic_load(&m->st_signals);
}

void krt_mesh_stop(krt_mesh_t *m)
{
    pthread_mutex_lock(&m->lock);
    if (!m->started || m->stopped) {
        m->stopped = true;
        pthread_mutex_unlock(&m->lock);
        return;
    }
    m->stopped = true;
    static const krt_transport_t gone = {s_transport_gone, NULL, NULL};
    krt_system_set_transport(m->sys, &gone);
    atomic_store(&m->running, false);
    while (atomic_load(&m->senders) > 0) /* a send that passed the running check */
        sched_yield();
    atomic_store(&m->io_run, false);
    uint64_t one = 1;
    ssize_t w = write(m->efd, &one, sizeof one);
    (void)w;
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
    krt_log(KRT_LOG_INFO, m->path, "stopped", "endpoint=%s", m->endpoint);
}

void krt_mesh_destroy(krt_mesh_t **m_p)
{
    if (!m_p || !*m_p)
        return;
    krt_mesh_t *m = *m_p;
    krt_mesh_stop(m);
    close(m->efd);
    if (m->curve)
        zmq_ctx_term(m->ctx);
    else
        s_ctx_release();
    free(m->bind);
    pthread_mutex_destroy(&m->lock);
    pthread_mutex_destroy(&m->work);
    free(m);
    *m_p = NULL;
}
