/*
 * The sandboxes manager's insides, shared by sandboxes.c (creates, reads, forks, recovery) and
 * sandboxes_cluster.c (placement, calls for other nodes' sandboxes, takeover, fencing).
 */
#ifndef KA_SANDBOXES_INT_H
#define KA_SANDBOXES_INT_H

#include <czmq.h>

#include "sandboxes.h"

#define STORE_TIMEOUT_MS   30000
#define RESOLVE_TIMEOUT_MS (15 * 60 * 1000) /* a create may prepare its template's image */

/* A live sandbox: its actor. Owned by s_mgr_t live; by_addr holds the same pointer. */
typedef struct {
    krt_addr_t addr;
    uint32_t *count;          /* the pool counter it is in (s_mgr_t held[] or unsure); NULL: none */
    char id[KA_STORE_ID_LEN]; /* its key in live */
    zhashx_t *by_addr;        /* the manager's address index, which it leaves as it goes */
} s_slot_t;

/* A caller's request in flight: each step is a krt_request whose callback is the next step. */
typedef struct s_op s_op_t;
struct s_op {
    s_op_t *prev, *next; /* the manager's ops in flight, answered if it stops first */
    krt_addr_t from;
    uint64_t from_ref;
    uint32_t type;      /* the caller's request type */
    ka_sbx_create_t cr; /* creates */
    ka_tpl_resolved_t res;
    void *body; /* a copy of the caller's body (not-live calls) */
    size_t len;
    int32_t expired; /* recovery: which list */
    int32_t offset;
    int warm;                     /* creates: ka_pool_take's answer */
    int slot;                     /* creates, forks: a.warm index + 1 of the pool room reserved */
    uint32_t n_slots;             /* ... how many sandboxes' room (0: none reserved) */
    ka_pool_claim_t claim;        /* ... its warm sandbox (warm 1) until bound or released */
    struct s_fork *fork;          /* forks */
    uint8_t kind;                 /* the caller's envelope kind (relays keep it) */
    ka_store_takeover_t takeover; /* takeovers */
    ka_store_sandbox_t rec;       /* calls relayed to another node: the record read before */
    bool cached;                  /* ... relayed where the last read said, without a read */
    struct {                      /* creates this node placed (sandboxes_cluster.c) */
        char pool[KA_STORE_TNAME_LEN];   /* the template's pool; "" not placed by this node */
        char node[KA_STORE_NODE_LEN];    /* the node it went to last */
        char refused[KA_STORE_NODE_LEN]; /* the node that refused it for room; "" none yet */
    } place;
};

typedef struct {
    ka_sandboxes_args_t a;
    zhashx_t *live;    /* id -> s_slot_t* of the sandbox's actor, owned */
    zhashx_t *by_addr; /* the actor's address -> the same s_slot_t* (ka_mgr_slot_of) */
    s_op_t *ops;       /* in flight, owned */
    ka_pool_t *pool;   /* the warm pools */
    zhashx_t *where;   /* sandbox id -> s_where_t*: another node's sandbox as last read (cluster) */
    /* capacity (sandboxes_cap.c), per pool of a.warm[] */
    uint32_t held[KA_POOL_MAX_POOLS];     /* sandbox actors of the pool in live */
    uint32_t reserved[KA_POOL_MAX_POOLS]; /* creates admitted, not finished */
    uint32_t unsure;                      /* actors in live whose pool is not known yet */
    /* the cluster (sandboxes_cluster.c) */
    krt_timer_t tick;
    bool member;         /* a member at the last tick */
    int64_t incarnation; /* of this node at the last tick */
    bool taking;         /* a takeover in flight */
    struct {
        char id[KA_STORE_NODE_LEN];
        int64_t incarnation;
    } taken[64]; /* lapsed nodes' incarnations whose sandboxes were all taken over (a ring) */
    uint32_t n_taken;
} s_mgr_t;

void ka_mgr_copy(char *dst, size_t cap, const char *src);
/* A new op answering msg (NULL: nobody to answer) later, owned by self. */
s_op_t *ka_mgr_op_new(s_mgr_t *self, const krt_msg_t *msg);
void ka_mgr_op_free(s_mgr_t *self, s_op_t *op);
/* Answers op's caller with the failure err (a negative errno) and message; frees op. */
void ka_mgr_fail_op(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, int err, const char *message);
/* Sends a request for op; its reply (or failure) runs `next` with op as user. */
void ka_mgr_ask(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, krt_reply_fn next, krt_addr_t to,
                uint32_t type, const void *body, size_t len, int timeout_ms);
/* Asks the store for the receipt of creator's request_id (its sandbox, even deleted; next gets
 * KA_STORE_ENOTFOUND if there is none). */
void ka_mgr_ask_receipt(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, krt_reply_fn next,
                        const char *creator, const char *request_id);
/* Spawns the actor of a record with no compute here (recovered, taken over), logging event. */
void ka_mgr_adopt(krt_ctx_t *ctx, s_mgr_t *self, const ka_store_sandbox_t *sb, const char *event);
/* Recovers this node's live records (expired ones first), a page at a time from offset. */
void ka_mgr_recover(krt_ctx_t *ctx, s_mgr_t *self, int32_t expired, int32_t offset);
/* Resolves a create's template and records it here (the create path after placement). */
void ka_mgr_create_here(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op);

/* The reply to a create's receipt read (KA_STORE_SANDBOX_RECEIPT) that found one, or failed: a
 * replay answered as the insert would (its sandbox, even deleted), or the store's error. */
void ka_mgr_on_receipt(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg);
/* Reads op's sandbox record (owner check) and routes op by it (ka_mgr_relay_owner, or this
 * node's answer). */
void ka_mgr_route_read(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const char *id,
                       const char *caller);

/* sandboxes_cap.c: the pools' capacity on this node (the rule is there) */
/* What this node holds for pool (ka_pool_opts_t.used). */
size_t ka_mgr_pool_used(void *self, const char *pool);
/* Each pool's used count, as the capacity check counts it (KA_SBX_COUNT). */
void ka_mgr_pool_report(const s_mgr_t *self, ka_sbx_count_t *out);
/* Admits op (a create: n 1; a fork: n its count) into its pool's room (op->res.pool), reserved
 * until ka_mgr_unreserve: 0, or -ENOSPC with why when the pool has room for fewer than n (nothing
 * reserved then). A pool this node does not serve is not bounded here. */
int ka_mgr_reserve(s_mgr_t *self, s_op_t *op, uint32_t n, char *why, size_t cap);
/* Ends op's reservation, if any (ka_mgr_op_free does; a fork's once its actors are spawned). */
void ka_mgr_unreserve(s_mgr_t *self, s_op_t *op);
/* The live sandbox actors' slots, in two indexes kept in step: live (by sandbox id) owns them,
 * by_addr (by actor address) finds one in O(1) on a DOWN, retire, release or exit. Whatever
 * removes a slot from live (ka_mgr_slot_drop, a replacement, a fencing's purge, the manager's
 * end) takes it out of by_addr and of its pool's count too. */
/* Creates both indexes, empty: 0 or KRT_ENOMEM (nothing kept). */
int ka_mgr_slots_init(s_mgr_t *self);
/* Destroys both indexes and their slots (counts follow). */
void ka_mgr_slots_free(s_mgr_t *self);
/* Adds a slot for the actor addr of sandbox id of pool ("": not known), counted in it, in place
 * of any slot id had (dropped: its actor's DOWN then finds nothing). 0, or KRT_ENOMEM with
 * nothing added. */
int ka_mgr_slot_add(s_mgr_t *self, const char *id, krt_addr_t addr, const char *pool);
/* The slot of sandbox actor who (borrowed: valid until dropped), or NULL. */
s_slot_t *ka_mgr_slot_of(s_mgr_t *self, krt_addr_t who);
/* Removes slot from both indexes and frees it; it leaves its pool's count. */
void ka_mgr_slot_drop(s_mgr_t *self, s_slot_t *slot);
/* Sandbox actor who is FAILED with no compute: out of its pool's count. */
void ka_mgr_released(krt_ctx_t *ctx, s_mgr_t *self, krt_addr_t who);
/* An adopted sandbox counted in no pool yet (a node with several): asks the templates actor
 * which pool its revision is of. */
void ka_mgr_learn_pool(krt_ctx_t *ctx, s_mgr_t *self, const ka_store_sandbox_t *sb);

/* sandboxes_cluster.c */
/* Relays op (a call for sandbox id, no actor here) to the node a previous read found serving
 * it, if that node still holds its lease under the same incarnation (a sandbox only moves from
 * a lapsed node, which comes back under another): true if relayed. A relay that fails reads
 * the record and routes again. */
bool ka_mgr_relay_known(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const char *id);
/* Reads the record of every sandbox whose /data the driver keeps and discards what is kept of one
 * gone, deleted or another node's: after a crash, a fencing, a takeover meanwhile. */
void ka_mgr_sweep_kept(krt_ctx_t *ctx, s_mgr_t *self);
/* Frees what the cluster part keeps (locations). */
void ka_mgr_cluster_free(s_mgr_t *self);
/* Starts the cluster's tick (a node with a membership). */
int ka_mgr_cluster_start(krt_ctx_t *ctx, s_mgr_t *self);
/* The tick: fencing (stop every sandbox actor when this node lost its lease; recover again once
 * it registers anew) and takeover of lapsed nodes' sandboxes. */
void ka_mgr_cluster_tick(krt_ctx_t *ctx, s_mgr_t *self);
/* A create checked: placed on a node of its template's pool (here, or relayed to that node's
 * manager). */
void ka_mgr_place(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op);
/* Placed create op was refused for room (-ENOSPC, why) by the node it was placed on: tried once
 * more on another node of its pool, or failed naming the pool when none is left or this was the
 * second refusal. False (op untouched): op is not a create this node placed. */
bool ka_mgr_place_again(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const char *why);
/* A call for sb (read from the store) that no actor here holds: relayed to the node serving it
 * when that is another node; true if op was handled (relayed or failed). */
bool ka_mgr_relay_owner(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const ka_store_sandbox_t *sb);

#endif
