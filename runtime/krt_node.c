/*
 * Message nodes: per-scheduler free lists carved from slabs, batches exchanged through the
 * system (see krt_int.h).
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Message nodes: per-scheduler free lists, batches exchanged through the system.
 * Scheduler threads carve small nodes from slabs (KRT_NF_SLAB: never freed one by one; the
 * slabs go with the system). Other threads malloc them; a scheduler frees such a node when its
 * own free list already holds a batch, and the system frees those in batches past
 * KRT_POOL_MAX_BATCHES spares. */

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

krt_node_t *krt__node_new_slow(krt_sched_t *s, size_t len)
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
    n->flags &= KRT_NF_SLAB;
    if (!s) {
        if (!(n->flags & KRT_NF_SLAB))
            free(n);
        return; /* a slab node freed off-scheduler stays unused until its slab goes */
    }
    if (!(n->flags & KRT_NF_SLAB) && s->pool_n >= KRT_POOL_BATCH) {
        free(n); /* made off the schedulers: keep it only while the free list is short */
        return;
    }
    atomic_store_explicit(&n->link.next, s->pool, memory_order_relaxed);
    s->pool = &n->link;
    if (++s->pool_n >= 2 * KRT_POOL_BATCH)
        s_pool_spill(s);
}

void krt__nodes_fini(krt_system_t *sys)
{
    for (int i = 0; sys->scheds && i < sys->n_sched; i++) {
        s_free_chain(sys->scheds[i].pool, NULL);
        sys->scheds[i].pool = NULL;
    }
    for (uint32_t i = 0; i < sys->n_batches; i++)
        s_free_chain(sys->batches[i].head, NULL);
    free(sys->batches);
    sys->batches = NULL;
    sys->n_batches = 0;
    while (sys->slabs) {
        krt_slab_t *slab = sys->slabs;
        sys->slabs = slab->next;
        free(slab);
    }
}
