/*
 * Message nodes: two classes carved from slabs, magazines per scheduler, a depot per system
 * (see krt_int.h).
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Message nodes: magazines per scheduler, a depot per system (see KRT_MAG_SIZE).
 * Scheduler threads carve nodes of both classes from slabs (KRT_NF_SLAB: never freed one by
 * one; the slabs go with the system). Other threads malloc large ones; a scheduler frees such
 * a node unless its loaded magazine is empty, and a magazine handed to a depot already holding
 * KRT_DEPOT_LOOSE_MAX full ones keeps only its slab nodes. */

typedef struct krt_slab {
    struct krt_slab *next;
    _Alignas(64) unsigned char nodes[];
} krt_slab_t;

static const size_t s_class_size[KRT_NCLASSES] = {KRT_NODE_SMALL, KRT_NODE_SIZE};
static const uint16_t s_class_flags[KRT_NCLASSES] = {KRT_NF_SLAB | KRT_NF_SMALL, KRT_NF_SLAB};

/* Frees the malloc'd nodes of m and packs the slab ones to the front. */
static void s_free_loose(krt_mag_t *m)
{
    if (!m->loose)
        return;
    m->loose = false;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->v[i]->flags & KRT_NF_SLAB)
            m->v[kept++] = m->v[i];
        else
            free(m->v[i]);
    }
    m->n = kept;
}

/* ---- the depot (pool_lock held) -------------------------------------------------------- */

static void s_depot_put(krt_depot_t *d, krt_mag_t *m)
{
    if (m->n && d->n_full >= KRT_DEPOT_LOOSE_MAX)
        s_free_loose(m);
    krt_mag_t **list = m->n ? &d->full : &d->empty;
    m->next = *list;
    *list = m;
    d->n_full += m->n != 0;
}

/* A non-empty magazine, or NULL. */
static krt_mag_t *s_depot_full(krt_depot_t *d)
{
    krt_mag_t *m = d->full;
    if (m) {
        d->full = m->next;
        d->n_full--;
    }
    return m;
}

/* An empty magazine from the depot, or a new one (NULL: out of memory). */
static krt_mag_t *s_empty_mag(krt_system_t *sys, int c)
{
    pthread_mutex_lock(&sys->pool_lock);
    krt_mag_t *m = sys->depot[c].empty;
    if (m)
        sys->depot[c].empty = m->next;
    pthread_mutex_unlock(&sys->pool_lock);
    if (!m && (m = malloc(sizeof *m)))
        m->n = 0;
    if (m)
        m->loose = false;
    return m;
}

/* ---- a scheduler's magazines ------------------------------------------------------------- */

/* A new slab's nodes into the empty magazine m, the lowest address on top. */
static bool s_carve(krt_system_t *sys, krt_mag_t *m, int c)
{
    /* cache-line aligned: a node's header and its first body bytes share one line */
    krt_slab_t *slab = aligned_alloc(64, sizeof *slab + KRT_MAG_SIZE * s_class_size[c]);
    if (!slab)
        return false;
    for (uint32_t i = 0; i < KRT_MAG_SIZE; i++) {
        krt_node_t *n = (krt_node_t *)(slab->nodes + i * s_class_size[c]);
        n->flags = s_class_flags[c];
        m->v[KRT_MAG_SIZE - 1 - i] = n;
    }
    m->n = KRT_MAG_SIZE;
    m->loose = false;
    pthread_mutex_lock(&sys->pool_lock);
    slab->next = sys->slabs;
    sys->slabs = slab;
    pthread_mutex_unlock(&sys->pool_lock);
    return true;
}

/* s's loaded magazine of class c is missing or empty: the previous one if it holds nodes, else
 * one from the depot for the empty one, else a new slab. false: out of memory. */
static bool s_mag_reload(krt_sched_t *s, int c)
{
    krt_system_t *sys = s->sys;
    krt_mag_t *m = s->mag[c], *p = s->prev[c];
    if (p && p->n) {
        s->mag[c] = p;
        s->prev[c] = m;
        return true;
    }
    if (!m && !(m = s->mag[c] = s_empty_mag(sys, c)))
        return false;
    pthread_mutex_lock(&sys->pool_lock);
    krt_mag_t *f = s_depot_full(&sys->depot[c]);
    if (f)
        s_depot_put(&sys->depot[c], m);
    pthread_mutex_unlock(&sys->pool_lock);
    if (f) {
        s->mag[c] = f;
        return true;
    }
    return s_carve(sys, m, c);
}

/* s's loaded magazine of class c is missing or full: the previous one if it is empty, else the
 * full previous one goes to the depot and an empty one is loaded. false: out of memory. */
static bool s_mag_unload(krt_sched_t *s, int c)
{
    krt_system_t *sys = s->sys;
    krt_mag_t *m = s->mag[c], *p = s->prev[c];
    if (m && p && !p->n) {
        s->mag[c] = p;
        s->prev[c] = m;
        return true;
    }
    krt_mag_t *e = s_empty_mag(sys, c);
    if (!e)
        return false;
    if (p) {
        pthread_mutex_lock(&sys->pool_lock);
        s_depot_put(&sys->depot[c], p);
        pthread_mutex_unlock(&sys->pool_lock);
    }
    s->prev[c] = m;
    s->mag[c] = e;
    return true;
}

krt_node_t *krt__node_new_slow(krt_sched_t *s, size_t len)
{
    if (len <= KRT_INLINE_CAP) {
        int c = krt__len_class(len);
        if (s && ((s->mag[c] && s->mag[c]->n) || s_mag_reload(s, c))) {
            krt_node_t *n = krt__mag_pop(s->mag[c]);
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
    krt_mag_t *m = s->mag[c];
    if (!(n->flags & KRT_NF_SLAB) && m && m->n > 0) {
        /* Made off the schedulers: kept only by an empty magazine. On top of it it would carry
         * every message of a one-at-a-time exchange (ping-pong reuses the top node over and
         * over), each free through this slow path, and its header, not line-aligned like a
         * slab node's, may straddle two cache lines that then both cross cores. */
        free(n);
        return;
    }
    if (!m || m->n == KRT_MAG_SIZE) {
        if (!s_mag_unload(s, c)) {
            if (!(n->flags & KRT_NF_SLAB))
                free(n);
            return; /* out of memory for a magazine: a slab node waits for its slab */
        }
        m = s->mag[c];
    }
    m->loose |= !(n->flags & KRT_NF_SLAB);
    m->v[m->n++] = n;
}

static void s_mag_free(krt_mag_t *m)
{
    if (m) {
        s_free_loose(m);
        free(m);
    }
}

static void s_mag_list_free(krt_mag_t *m)
{
    while (m) {
        krt_mag_t *next = m->next;
        s_mag_free(m);
        m = next;
    }
}

void krt__nodes_fini(krt_system_t *sys)
{
    for (int c = 0; c < KRT_NCLASSES; c++) {
        for (int i = 0; sys->scheds && i < sys->n_sched; i++) {
            s_mag_free(sys->scheds[i].mag[c]);
            s_mag_free(sys->scheds[i].prev[c]);
            sys->scheds[i].mag[c] = sys->scheds[i].prev[c] = NULL;
        }
        s_mag_list_free(sys->depot[c].full);
        s_mag_list_free(sys->depot[c].empty);
        sys->depot[c] = (krt_depot_t){0};
    }
    while (sys->slabs) {
        krt_slab_t *slab = sys->slabs;
        sys->slabs = slab->next;
        free(slab);
    }
}
