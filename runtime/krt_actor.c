/*
 * Actor lifecycle: blocks (per-scheduler caches by size class), the tree, spawning, and what
 * happens after terminate (relations told, mailbox drained, waiters woken, block freed).
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

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
        s->acache_bytes -= size;
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
    size_t size = s_actor_size(a->b), c = size / 16;
    if (s && c < KRT_ACACHE_CLASSES && s->acache_n[c] < KRT_ACACHE_MAX &&
        s->acache_bytes + size <= KRT_ACACHE_BYTES) {
        memcpy((void *)a, &s->acache[c], sizeof(void *));
        s->acache[c] = a;
        s->acache_n[c]++;
        s->acache_bytes += size;
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
    krt__out_sync(sys); /* the child may send to the actors its spawner sent to */
    krt_actor_t *a = s_actor_alloc(s, s_actor_size(b));
    krt_node_t *init = krt__node_new(s, sizeof(krt_free_fn));
    uint32_t idx = 0;
    int rc = KRT_ENOMEM;
    if (!a || !init)
        goto fail;
    if (opts && opts->name && !(a->name = strdup(opts->name)))
        goto fail;
    if ((rc = krt__slot_alloc(sys, s, &idx)) != 0)
        goto fail;
    krt_slot_t *slot = krt__slot(sys, idx);
    uint64_t gen = atomic_load(&slot->word) >> 32;
    if (!gen)
        gen = sys->gen_base;
    a->addr = ((uint64_t)sys->node_id << 48) | (gen << KRT_SLOT_BITS) | idx;
    a->b = b;
    a->spawner = ctx ? ctx->actor->addr : KRT_ADDR_NONE;
    a->flags = (uint16_t)flags;
    a->restarts = restarts > UINT16_MAX ? UINT16_MAX : (uint16_t)restarts;
    krt__mb_init(a);
    atomic_store_explicit(&a->sched, 1, memory_order_relaxed);
    init->kind = KRT_NK_INIT;
    init->msg.body = arg;
    if (arg_free) {
        init->flags |= KRT_NF_PTR;
        memcpy(init->data, &arg_free, sizeof arg_free);
    }
    atomic_store_explicit(&a->pushed, 1, memory_order_relaxed);
    krt__mb_push(a, &init->link);
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
    krt__lock(&sys->tree_lock);
    if (atomic_load(&sys->stopping)) {
        krt__unlock(&sys->tree_lock);
        if (atomic_load(&a->aflags) & KRT_AAF_REGISTERED)
            krt__reg_release(sys, a->addr);
        rc = KRT_ESHUTDOWN;
        goto fail_slot;
    }
    s_tree_insert(ctx ? ctx->actor : sys->root, a);
    atomic_store_explicit(&slot->actor, a, memory_order_relaxed);
    atomic_store_explicit(&slot->word, (gen << 32) | KRT_SLOT_ALIVE, memory_order_release);
    krt__unlock(&sys->tree_lock);
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
    krt__schedule(sys, a, true); /* a may run (and even stop) from here on */
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
        while ((l = krt__mb_pop(a)))
            krt__node_free(s, (krt_node_t *)l);
    }
    arg_free = NULL;
    atomic_store(&slot->word, gen << 32); /* s_slot_free bumps it */
    krt__slot_free(sys, s, idx);
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
    while ((l = krt__mb_pop(a))) {
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
void krt__cleanup(krt_system_t *sys, krt_sched_t *s, krt_actor_t *a)
{
    int reason = a->exit_reason;
    if (a->ext) { /* timers, requests, remote relations: most actors never had any */
        krt__timers_cancel_all(sys, a);
        krt__requests_drop(sys, a);
        krt__remote_forget(sys, a);
    }
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
    krt__lock(&sys->tree_lock);
    krt_actor_t *p = a->parent;
    if (p) {
        s_tree_remove(a);
        if (p != sys->root && (atomic_load(&p->aflags) & KRT_AAF_SHUTDOWN))
            krt__signal(sys, p, KRT_SIG_POKE);
    }
    while (a->first_child) {
        krt_actor_t *c = a->first_child;
        s_tree_remove(c);
        s_tree_insert(sys->root, c);
        if (atomic_load(&sys->stopping))
            krt__signal(sys, c, KRT_SIG_SHUTDOWN);
    }
    krt__unlock(&sys->tree_lock);
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
            krt__relax();
    krt__slot_free(sys, s, (uint32_t)(a->addr & KRT_SLOT_MASK));
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
    krt_deadline(CLOCK_REALTIME, timeout_ms, &dl);
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
