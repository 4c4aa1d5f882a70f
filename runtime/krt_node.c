/*
 * Message nodes: per-scheduler free stacks carved from slabs, batches exchanged through the
 * system (see krt_int.h).
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Message nodes: per-scheduler free stacks, batches exchanged through the system.
 * Scheduler threads carve nodes of both classes from slabs (KRT_NF_SLAB: never freed one by
 * one; the slabs go with the system). Other threads malloc large ones; a scheduler frees such
 * a node unless its own free stack is empty, and the system frees those past
 * KRT_POOL_MAX_BATCHES batches of spares. A node's memory is written only by whoever fills it
 * for a message: the free stacks and the spares are arrays of pointers. */

typedef struct krt_slab {
    struct krt_slab *next;
    _Alignas(64) unsigned char nodes[];
} krt_slab_t;

static const size_t s_class_size[KRT_NCLASSES] = {KRT_NODE_SMALL, KRT_NODE_SIZE};
static const uint16_t s_class_flags[KRT_NCLASSES] = {KRT_NF_SLAB | KRT_NF_SMALL, KRT_NF_SLAB};

/* Frees the malloc'd nodes among v[0..n) and packs the slab ones to the front; their count. */
static uint32_t s_free_loose(krt_node_t **v, uint32_t n)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (v[i]->flags & KRT_NF_SLAB)
            v[kept++] = v[i];
        else
            free(v[i]);
    }
    return kept;
}

/* Adds v[0..n) to spares sp (pool_lock held); false if out of memory. */
static bool s_spare_put(krt_spares_t *sp, krt_node_t **v, uint32_t n)
{
    if (sp->n + n > sp->cap) {
        uint32_t cap = sp->cap ? sp->cap : 16 * KRT_POOL_BATCH;
        while (cap < sp->n + n)
            cap *= 2;
        krt_node_t **ns = realloc(sp->v, cap * sizeof(krt_node_t *));
        if (!ns)
            return false;
        sp->v = ns;
        sp->cap = cap;
    }
    memcpy(sp->v + sp->n, v, n * sizeof(krt_node_t *));
    sp->n += n;
    return true;
}

/* A new slab's nodes of class c onto s's (empty) free stack, the lowest address on top. */
static bool s_pool_carve(krt_sched_t *s, int c)
{
    krt_system_t *sys = s->sys;
    /* cache-line aligned: a node's header and its first body bytes share one line */
    krt_slab_t *slab = aligned_alloc(64, sizeof *slab + KRT_POOL_BATCH * s_class_size[c]);
    if (!slab)
        return false;
    for (uint32_t i = 0; i < KRT_POOL_BATCH; i++) {
        krt_node_t *n = (krt_node_t *)(slab->nodes + i * s_class_size[c]);
        n->flags = s_class_flags[c];
        s->pool[c][KRT_POOL_BATCH - 1 - i] = n;
    }
    s->pool_n[c] = KRT_POOL_BATCH;
    pthread_mutex_lock(&sys->pool_lock);
    slab->next = sys->slabs;
    sys->slabs = slab;
    pthread_mutex_unlock(&sys->pool_lock);
    return true;
}

/* Refills s's empty free stack of class c with a batch of spares, or a new slab. */
static bool s_pool_refill(krt_sched_t *s, int c)
{
    krt_system_t *sys = s->sys;
    krt_spares_t *sp = &sys->spare[c];
    pthread_mutex_lock(&sys->pool_lock);
    uint32_t n = sp->n < KRT_POOL_BATCH ? sp->n : KRT_POOL_BATCH;
    sp->n -= n;
    if (n)
        memcpy(s->pool[c], sp->v + sp->n, n * sizeof(krt_node_t *));
    pthread_mutex_unlock(&sys->pool_lock);
    s->pool_n[c] = n;
    return n || s_pool_carve(s, c);
}

/* s's free stack of class c is full: its top batch goes to the system's spares. */
static void s_pool_spill(krt_sched_t *s, int c)
{
    krt_system_t *sys = s->sys;
    krt_spares_t *sp = &sys->spare[c];
    krt_node_t **batch = s->pool[c] + s->pool_n[c] - KRT_POOL_BATCH;
    uint32_t n = KRT_POOL_BATCH;
    s->pool_n[c] -= KRT_POOL_BATCH;
    pthread_mutex_lock(&sys->pool_lock);
    if (sp->n >= KRT_POOL_MAX_BATCHES * KRT_POOL_BATCH) {
        pthread_mutex_unlock(&sys->pool_lock);
        n = s_free_loose(batch, n);
        if (!n)
            return;
        pthread_mutex_lock(&sys->pool_lock);
    }
    bool kept = s_spare_put(sp, batch, n);
    pthread_mutex_unlock(&sys->pool_lock);
    if (!kept)
        s_free_loose(batch, n); /* slab nodes stay with their slab */
}

krt_node_t *krt__node_new_slow(krt_sched_t *s, size_t len)
{
    if (len <= KRT_INLINE_CAP) {
        int c = krt__len_class(len);
        if (s && (s->pool_n[c] || s_pool_refill(s, c))) {
            krt_node_t *n = krt__pool_pop(s, c);
            return krt__node_reset(n, n->flags);
        }
        krt_node_t *n = malloc(KRT_NODE_SIZE); /* off the schedulers: always large */
        return n ? krt__node_reset(n, 0) : NULL;
    }
    if (len > UINT32_MAX)
        return NULL;
    krt_node_t *n = malloc(sizeof(krt_node_t) + len);
    return n ? krt__node_reset(n, KRT_NF_BIG) : NULL;
}

void krt__node_free_slow(krt_sched_t *s, krt_node_t *n)
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
    n->flags &= KRT_NF_SLAB | KRT_NF_SMALL;
    if (!s) {
        if (!(n->flags & KRT_NF_SLAB))
            free(n);
        return; /* a slab node freed off-scheduler stays unused until its slab goes */
    }
    int c = krt__node_class(n);
    if (!(n->flags & KRT_NF_SLAB) && s->pool_n[c] > 0) {
        /* Made off the schedulers: kept only by an empty free stack. On top of the stack it
         * would carry every message of a one-at-a-time exchange (ping-pong reuses the top node
         * over and over), each free through this slow path, and its header, not line-aligned
         * like a slab node's, may straddle two cache lines that then both cross cores. */
        free(n);
        return;
    }
    if (s->pool_n[c] == KRT_POOL_CAP)
        s_pool_spill(s, c);
    s->pool[c][s->pool_n[c]++] = n;
}

void krt__nodes_fini(krt_system_t *sys)
{
    for (int c = 0; c < KRT_NCLASSES; c++) {
        for (int i = 0; sys->scheds && i < sys->n_sched; i++) {
            s_free_loose(sys->scheds[i].pool[c], sys->scheds[i].pool_n[c]);
            sys->scheds[i].pool_n[c] = 0;
        }
        krt_spares_t *sp = &sys->spare[c];
        s_free_loose(sp->v, sp->n);
        free(sp->v);
        *sp = (krt_spares_t){0};
    }
    while (sys->slabs) {
        krt_slab_t *slab = sys->slabs;
        sys->slabs = slab->next;
        free(slab);
    }
}
