/*
 * Links, monitors and exits: relations kept by both sides in their ext (each side touches only
 * its own), krt_link / krt_monitor / krt_kill, and the small actor API (self, parent, refs).
 */
#include "krt_int.h"

#include <stdlib.h>

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
        ctx->actor->flags &= (uint16_t)~KRT_AF_TRAP;
}

int krt__kill(krt_system_t *sys, krt_addr_t from, krt_addr_t who, int reason)
{
    if (reason != KRT_EXIT_KILLED || krt_addr_node(who) != sys->node_id) {
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
    krt__signal(sys, a, KRT_SIG_KILL);
    krt__release(sys, who);
    return 0;
}

int krt_kill(krt_ctx_t *ctx, krt_addr_t who, int reason)
{
    if (who == ctx->actor->addr) {
        krt_exit(ctx, reason);
        return 0;
    }
    return krt__kill(ctx->sys, ctx->actor->addr, who, reason);
}

int krt_system_kill(krt_system_t *sys, krt_addr_t who, int reason)
{
    return krt__kill(sys, KRT_ADDR_NONE, who, reason);
}

int krt_link(krt_ctx_t *ctx, krt_addr_t other)
{
    krt_actor_t *a = ctx->actor;
    if (other == a->addr || s_rel_find(a, KRT_REL_LINK, other, 0))
        return 0;
    bool remote = krt_addr_node(other) != ctx->sys->node_id;
    if (remote)
        krt__remote_interest(ctx->sys, a);
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
    rc = krt__send_node(ctx->sys, other, n);
    if (rc) /* gone, or its node unreachable */
        krt__push_self(ctx, other, KRT_NK_LINKEXIT, 0,
                       rc == KRT_ENOACTOR ? KRT_EXIT_NOPROC : KRT_EXIT_NOCONN, NULL, 0);
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
    if (krt_addr_node(target) != ctx->sys->node_id)
        krt__remote_interest(ctx->sys, ctx->actor);
    krt_node_t *n = krt__node_new(ctx->sched, 0);
    if (!n)
        return ref;
    n->kind = KRT_NK_MONITOR;
    n->msg.from = ctx->actor->addr;
    n->msg.ref = ref;
    int rc = krt__send_node(ctx->sys, target, n);
    if (rc) {
        d.reason = rc == KRT_ENOACTOR ? KRT_EXIT_NOPROC : KRT_EXIT_NOCONN;
        krt__push_self(ctx, KRT_ADDR_NONE, KRT_NK_DOWN, ref, 0, &d, sizeof d);
    }
    return ref;
}

void krt_demonitor(krt_ctx_t *ctx, uint64_t ref)
{
    krt_rel_t r;
    if (krt__rel_del(ctx->actor, KRT_REL_MON_OUT, 0, ref, &r))
        krt__send_sys(ctx->sys, r.peer, ctx->actor->addr, KRT_NK_DEMONITOR, ref, 0, NULL, 0);
}
