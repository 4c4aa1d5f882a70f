/*
 * The sandboxes manager's pool capacity (sandboxes_int.h): what this node holds for each of its
 * WorkerPools, the room a create needs, and the room the warm pools fill (pool.h, ka_pool_room:
 * one rule for both).
 *
 * What counts against a pool's capacity on this node ("used"):
 *  - every sandbox actor of the pool this manager runs (self->live) that runs compute here or
 *    may run it here again without a create: CREATING, READY, PAUSED, FORKING, SUSPENDING,
 *    SUSPENDED and RESUMING (its /data stays here and a resume boots it here, so a resume
 *    needs no room of its own), DELETING, and FAILED while it still holds its compute (a guest
 *    that exited: the compute is kept until delete). A FAILED one with no compute never runs
 *    again (a failed boot, resume or suspend; a record recovered FAILED): it leaves the count
 *    when it says so (KA_SBX_RELEASED_). A delete takes it out once its tombstone is written
 *    (KA_SBX_RETIRE_), an actor that stops takes itself out (DOWN), a fenced node drops them
 *    all. Each actor's slot points at the counter it is in, and its destructor takes
 *    it out: the counts follow the live map, whatever removes an entry.
 *  - every create admitted into the pool and not finished yet (s_op_t.slot): reserved in the
 *    manager's turn before its record is written, so concurrent creates never overshoot; the
 *    reservation ends when the op ends (ka_mgr_op_free), in the same turn that spawns its actor
 *    on success.
 *  - the sandboxes a fork admitted will create (s_op_t.n_slots, all of its count at once: a fork
 *    that does not fit records nothing), reserved the same way; the reservation ends in the turn
 *    that spawns the forks' actors, or when the op ends (a replay, a failure).
 *  - an actor whose pool is not known yet (recovered or taken over on a node with several
 *    pools, until the templates actor names its revision's pool) counts against every pool.
 * Warm sandboxes (pool.c) are not used: a create never fails for them (ka_pool_room).
 * A sandbox of a pool this node does not serve is counted nowhere and bounded by nothing here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"
#include "sandboxes_int.h"

/* The index of pool in self->a.warm (this node's pools), or -1. */
static int s_index(const s_mgr_t *self, const char *pool)
{
    for (size_t i = 0; i < self->a.n_warm && i < KA_POOL_MAX_POOLS; i++)
        if (strcmp(self->a.warm[i].name, pool) == 0)
            return (int)i;
    return -1;
}

static size_t s_used(const s_mgr_t *self, int i)
{
    return (size_t)self->held[i] + self->reserved[i] + self->unsure;
}

size_t ka_mgr_pool_used(void *arg, const char *pool)
{
    const s_mgr_t *self = arg;
    int i = s_index(self, pool);
    return i < 0 ? self->unsure : s_used(self, i);
}

/* Why op cannot have n more sandboxes of pool c (used of them held): a create's pool is full,
 * a fork's has less room than it needs (all or nothing: it says how much there is). */
static void s_refusal(const s_mgr_t *self, const s_op_t *op, const ka_warm_cfg_t *c, size_t used,
                      uint32_t n, char *why, size_t cap)
{
    if (!op->fork) {
        snprintf(why, cap,
                 "pool %s on node %s is full (%zu of %lld sandboxes); delete one or retry later",
                 c->name, self->a.node, used, (long long)c->capacity);
        return;
    }
    size_t room = used < (size_t)c->capacity ? (size_t)c->capacity - used : 0;
    snprintf(why, cap,
             "pool %s on node %s has room for %zu more sandbox%s, the fork needs %u; delete some "
             "or retry later",
             c->name, self->a.node, room, room == 1 ? "" : "es", n);
}

_Static_assert(KA_SBX_POOLS_MAX == KA_POOL_MAX_POOLS, "a count reports every pool");

void ka_mgr_pool_report(const s_mgr_t *self, ka_sbx_count_t *out)
{
    out->n_pools = 0;
    for (size_t i = 0; i < self->a.n_warm && i < KA_POOL_MAX_POOLS; i++, out->n_pools++) {
        ka_sbx_pool_use_t *u = &out->pools[i];
        ka_mgr_copy(u->pool, sizeof u->pool, self->a.warm[i].name);
        u->used = s_used(self, (int)i);
    }
}

int ka_mgr_reserve(s_mgr_t *self, s_op_t *op, uint32_t n, char *why, size_t cap)
{
    int i = s_index(self, op->res.pool);
    if (i < 0 || op->slot || n == 0)
        return 0;
    const ka_warm_cfg_t *c = &self->a.warm[i];
    size_t used = s_used(self, i);
    if (!ka_pool_room(c->capacity, used, n - 1)) { /* used + n <= capacity */
        s_refusal(self, op, c, used, n, why, cap);
        return -ENOSPC;
    }
    self->reserved[i] += n;
    op->slot = i + 1;
    op->n_slots = n;
    return 0;
}

void ka_mgr_unreserve(s_mgr_t *self, s_op_t *op)
{
    if (!op->slot)
        return;
    self->reserved[op->slot - 1] -= op->n_slots;
    op->slot = 0;
    op->n_slots = 0;
}

/* The counter of an actor of pool ("" unknown: an adopted record's): one pool's, the unsure
 * one's, or NULL (a pool this node does not serve). */
static uint32_t *s_counter(s_mgr_t *self, const char *pool)
{
    if (!pool[0])
        return self->a.n_warm == 1 ? &self->held[0] : self->a.n_warm ? &self->unsure : NULL;
    int i = s_index(self, pool);
    return i < 0 ? NULL : &self->held[i];
}

/* ---- the slots (sandboxes_int.h) ------------------------------------------------------------ */

/* by_addr's keys are its slots' own addr fields, neither copied nor freed: a slot leaves
 * by_addr before it is freed (s_slot_destroy), so no key outlives its slot. */
static size_t s_addr_hash(const void *key)
{
    uint64_t h = *(const krt_addr_t *)key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29));
}

static int s_addr_cmp(const void *a, const void *b)
{
    return *(const krt_addr_t *)a != *(const krt_addr_t *)b;
}

/* zhashx destructor of self->live's slots: out of the address index and its counter, whatever
 * removed it from live. */
static void s_slot_destroy(void **item)
{
    s_slot_t *s = *item;
    if (!s)
        return;
    if (zhashx_lookup(s->by_addr, &s->addr) == s)
        zhashx_delete(s->by_addr, &s->addr);
    if (s->count && *s->count)
        (*s->count)--;
    free(s);
    *item = NULL;
}

int ka_mgr_slots_init(s_mgr_t *self)
{
    self->live = zhashx_new();
    self->by_addr = zhashx_new();
    if (!self->live || !self->by_addr) {
        ka_mgr_slots_free(self);
        return KRT_ENOMEM;
    }
    zhashx_set_destructor(self->live, s_slot_destroy);
    zhashx_set_key_hasher(self->by_addr, s_addr_hash);
    zhashx_set_key_comparator(self->by_addr, s_addr_cmp);
    zhashx_set_key_duplicator(self->by_addr, NULL);
    zhashx_set_key_destructor(self->by_addr, NULL);
    return 0;
}

void ka_mgr_slots_free(s_mgr_t *self)
{
    zhashx_destroy(&self->live); /* first: its slots leave by_addr as they go */
    zhashx_destroy(&self->by_addr);
}

int ka_mgr_slot_add(s_mgr_t *self, const char *id, krt_addr_t addr, const char *pool)
{
    s_slot_t *s = malloc(sizeof *s);
    if (!s)
        return KRT_ENOMEM;
    *s = (s_slot_t){.addr = addr, .count = s_counter(self, pool), .by_addr = self->by_addr};
    ka_mgr_copy(s->id, sizeof s->id, id);
    if (zhashx_insert(self->by_addr, &s->addr, s)) {
        free(s);
        return KRT_ENOMEM;
    }
    if (s->count)
        (*s->count)++;
    zhashx_delete(self->live, s->id); /* a previous actor of the id's: its DOWN finds nothing */
    if (zhashx_insert(self->live, s->id, s)) {
        void *item = s;
        s_slot_destroy(&item);
        return KRT_ENOMEM;
    }
    return 0;
}

s_slot_t *ka_mgr_slot_of(s_mgr_t *self, krt_addr_t who)
{
    return zhashx_lookup(self->by_addr, &who);
}

void ka_mgr_slot_drop(s_mgr_t *self, s_slot_t *slot)
{
    zhashx_delete(self->live, slot->id); /* s_slot_destroy: out of by_addr and its counter */
}

/* The templates actor named the pool of an adopted sandbox's revision: its slot (if still
 * there, and still unsure) moves to that pool's counter. */
static void s_on_pool_learned(krt_ctx_t *ctx, void *state, void *user, int err,
                              const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const ka_tpl_resolved_t *res = msg ? msg->body : NULL;
    s_slot_t *s = zhashx_lookup(self->live, op->rec.id);
    if (!ka_reply_outcome(err, msg, sizeof *res, NULL) && s && s->count == &self->unsure) {
        self->unsure--;
        if ((s->count = s_counter(self, res->pool)) != NULL)
            (*s->count)++;
    } else if (s && s->count == &self->unsure) {
        krt_log_actor(ctx, KRT_LOG_WARN, "sandbox_pool_unknown",
                      "sandbox=%s: counted against every pool until deleted", op->rec.id);
    }
    ka_mgr_op_free(self, op);
}

void ka_mgr_released(krt_ctx_t *ctx, s_mgr_t *self, krt_addr_t who)
{
    s_slot_t *s = ka_mgr_slot_of(self, who);
    if (!s)
        return;
    if (s->count && *s->count)
        (*s->count)--;
    s->count = NULL;
    ka_pool_freed(ctx, self->pool);
}

void ka_mgr_learn_pool(krt_ctx_t *ctx, s_mgr_t *self, const ka_store_sandbox_t *sb)
{
    s_slot_t *s = zhashx_lookup(self->live, sb->id);
    if (!s || s->count != &self->unsure || !sb->revision[0])
        return;
    s_op_t *op = ka_mgr_op_new(self, NULL); /* nobody to answer */
    if (!op)
        return;
    ka_mgr_copy(op->rec.id, sizeof op->rec.id, sb->id);
    ka_tpl_runtime_req_t rr;
    memset(&rr, 0, sizeof rr);
    ka_mgr_copy(rr.revision, sizeof rr.revision, sb->revision);
    if (krt_request(ctx, ka_peer(ctx, self->a.templates), KA_TPL_RUNTIME, &rr, sizeof rr,
                    RESOLVE_TIMEOUT_MS, s_on_pool_learned, op))
        ka_mgr_op_free(self, op);
}
