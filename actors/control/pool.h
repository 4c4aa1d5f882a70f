/*
 * ka_pool: the warm pools of the sandboxes manager. Per template revision whose WorkerPool has
 * `warm: N`, N sandboxes are booted ahead (namespaces, overlay, cgroup, seccomp, the guest up
 * and idle) under fresh ids. They belong to nobody: no record, no actor, in no list. A create
 * of that revision claims one (ka_pool_take), writes its record READY under the sandbox's id
 * in one store commit, and hands the compute to a sandbox actor (KA_SBX_WARM): the owner, TTL
 * and request id are the create's, the template env reaches each process the guest starts
 * (never PID 1's environment, which was fixed before anyone owned the sandbox).
 *
 * Refills wait until no create came for a quiet period (KA_POOL_QUIET_MS), then boot one
 * sandbox at a time (KA_POOL_PARALLEL), so a burst of creates is not slowed by them. A claimed
 * sandbox never comes back (only one whose create turned out to be a replay does: nothing ran in
 * it). A new revision of a template rebuilds its pool (the old warm sandboxes are stopped); a
 * deleted template drops it. A warm guest that died (its channel readable or hung up) is stopped
 * and replaced, never handed out. Used + warm sandboxes of a pool stay within its capacity
 * (ka_pool_room).
 *
 * The pool learns templates from the store's change events (it subscribes), from the template
 * list at start, and from each create's resolved revision. Nothing of it is persisted as a
 * sandbox: each warm id has a marker file in `dir` from before its boot until its record is
 * committed; at start the markers a previous run left (a crash) name /data the driver kept for
 * nobody, which is discarded. A clean stop stops every warm sandbox.
 *
 * The pool is part of the manager's state: every function runs in the manager's turn.
 */
#ifndef KA_POOL_H
#define KA_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control_msgs.h"
#include "ka_driver.h"
#include "krt.h"

#define KA_POOL_MAX_POOLS 16
#define KA_POOL_QUIET_MS  250  /* refills start this long after the last create */
#define KA_POOL_PARALLEL  1    /* warm boots at a time */
#define KA_POOL_RETRY_MS  1000 /* after a failed boot */
#define KA_POOL_DIR_MAX   512

/* The manager's timer message for the pool. */
#define KA_POOL_MSG_PUMP (KA_CTL_MSG_LAST_ + 32)

/* One WorkerPool's warm setting (node config pools[]). */
typedef struct ka_warm_cfg {
    char name[64];
    int32_t warm;     /* sandboxes kept booted per template revision; 0: none */
    int64_t capacity; /* live + warm sandboxes this node holds for the pool; 0: no bound */
} ka_warm_cfg_t;

/* A pool's room, the one rule both creates and warm boots follow. `used` is what the node holds
 * for the pool's owners (the manager's count: ka_mgr_pool_used); `more` what would come on top.
 * A create asks with more = 0: warm sandboxes never take a create's room (one claimed turns
 * warm into used, the total stays; a cold create pushes the total over by one, and the pool
 * gives a ready warm sandbox up at once, ka_pool_take trimming). A warm boot asks with more =
 * the pool's warm sandboxes (ready and booting), so warm ones only fill what creates leave. */
static inline bool ka_pool_room(int64_t capacity, size_t used, size_t more)
{
    return capacity <= 0 || used + more < (size_t)capacity;
}

typedef struct ka_pool_opts {
    ka_driver_t *driver; /* borrowed, outlives the pool */
    const char *store;   /* registered names (static strings) */
    const char *templates;
    const ka_warm_cfg_t *pools; /* copied */
    size_t n_pools;
    const char *dir;   /* marker directory (created); NULL or "": no markers */
    uint32_t quiet_ms; /* 0: KA_POOL_QUIET_MS */
    size_t (*used)(void *arg, const char *pool); /* the manager's count for a pool's room */
    void *used_arg;
} ka_pool_opts_t;

typedef struct ka_pool ka_pool_t;

/* A claimed warm sandbox, the claimer's until ka_pool_bound or ka_pool_release. */
typedef struct ka_pool_claim {
    char id[KA_STORE_ID_LEN];
    ka_sandbox_t *sb;
    char key[KA_STORE_NS_LEN + KA_STORE_TNAME_LEN + 2]; /* "ns/name" */
    char revision[KA_STORE_REV_LEN];
} ka_pool_claim_t;

/* A pool (NULL: out of memory; no pool has warm > 0 also gives one, holding nothing). Starts
 * the discard of what a previous run left, subscribes to template changes and lists them. */
ka_pool_t *ka_pool_new(krt_ctx_t *ctx, const ka_pool_opts_t *opts);
/* Stops every warm sandbox (blocking, a few ms each) and boots in flight stop their own; its
 * timer is cancelled in ctx (the manager's turn) before its memory goes. Idempotent; NULLs *p. */
void ka_pool_destroy(krt_ctx_t *ctx, ka_pool_t **p);

/* A create of template ns/name resolved to res: 1 and *out if a live warm sandbox of that
 * revision was claimed, 0 if its pool is empty (a cold start: call ka_pool_missed once the
 * record exists), -1 if its WorkerPool keeps none (or p is NULL). Learns the template. */
int ka_pool_take(krt_ctx_t *ctx, ka_pool_t *p, const char *ns, const char *name,
                 const ka_tpl_resolved_t *res, ka_pool_claim_t *out);
/* The claim's record is committed READY: its marker goes, a hit is counted. c->sb stays the
 * caller's (its sandbox actor takes it). */
void ka_pool_bound(ka_pool_t *p, const ka_pool_claim_t *c);
/* The claim is not used: back into its pool if reuse (the create was a replay; nothing ran in
 * it) and its revision is still pooled, else stopped. NULLs c->sb. */
void ka_pool_release(krt_ctx_t *ctx, ka_pool_t *p, ka_pool_claim_t *c, bool reuse);
/* Stops the claim now, on this thread (the manager is stopping). NULLs c->sb. */
void ka_pool_drop(ka_pool_t *p, ka_pool_claim_t *c);
/* A cold create of a revision whose pool was empty. */
void ka_pool_missed(ka_pool_t *p);
/* A live sandbox went away: a pool held back by its capacity may boot again. */
void ka_pool_freed(krt_ctx_t *ctx, ka_pool_t *p);

/* Handles msg if it is the pool's (its jobs, fd watches, timer, store events): true then. */
bool ka_pool_handle(krt_ctx_t *ctx, ka_pool_t *p, const krt_msg_t *msg);
/* Fills the warm_* fields of a count. */
void ka_pool_report(const ka_pool_t *p, ka_sbx_count_t *out);

#endif
