/*
 * ka_membership: this node's membership in the cluster, kept in PostgreSQL (ka_nodes), and the
 * mesh kept in step with it.
 *
 * One actor (registered as KA_CLUSTER_NAME). Every renew_ms it renews the node's lease through
 * the store actor (asynchronous requests: nothing blocks a scheduler) and reads the node table:
 *   - registration: the node's row is written with its API and mesh endpoints, CURVE public key,
 *     pools and capacity, and gets a new incarnation (the fencing counter);
 *   - renewal extends only the lease, and only for the incarnation that holds it and before it
 *     lapsed (the database's clock judges);
 *   - fencing: a node that could not renew before its own lease ended (measured on its
 *     monotonic clock from the moment it sent the last successful renewal, so never later than
 *     the database sees it end), or whose renewal was refused, is fenced: it logs
 *     `node_fenced`, stops being a member (ka_membership_member false: /readyz fails, and the
 *     control plane checks it before acting), drops its mesh peers, waits one lease (peers see
 *     it gone) and registers again under a new incarnation;
 *   - peers: every other node whose lease holds and that has a mesh endpoint and key is
 *     connected over the mesh (krt_mesh_connect); one whose lease lapsed, whose row is gone or
 *     that came back under a new incarnation is disconnected (krt_mesh_disconnect: the runtime
 *     delivers node-down, DOWN `noconnection`, to monitors), then connected again if alive;
 *   - forgetting: a row whose lease lapsed at least forget_ms ago and that no live sandbox names
 *     any more (a takeover moved them) is removed, one per round (`node_forgotten`); that node,
 *     back with its state directory, registers anew under a greater incarnation.
 *
 * Requests it serves (krt_request / krt_call, also from other nodes: `cluster@N`):
 *   KA_CLUSTER_NODES  empty -> ka_cluster_nodes_t: the node table as last read (at most
 *                     renew_ms old), each row with this node's view of the mesh
 *   KA_CLUSTER_TREE   NUL-terminated root name ("" = the whole node) -> krt_tree_json text of
 *                     this node (NUL-terminated); an error reply if the name is unknown
 *   KA_CLUSTER_DRAIN  NUL-terminated node id -> ka_cluster_node_t: that node's row, marked
 *                     draining (no placements on it until it registers again); an error reply
 *                     -ENOENT if there is no such node, KA_STORE_EUNAVAIL if the store failed
 *   KA_CLUSTER_LEAVE  empty -> empty, once the lease has ended in the table (or the store did
 *                     not answer): the node stops being a member, drops its peers and renews
 *                     nothing more (a clean stop: peers see it gone at their next read)
 */
#ifndef KA_MEMBERSHIP_H
#define KA_MEMBERSHIP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "krt.h"
#include "krt_mesh.h"
#include "store.h"

#define KA_CLUSTER_NAME      "cluster"
#define KA_CLUSTER_RENEW_MS  1000    /* default renewal period */
#define KA_CLUSTER_LEASE_MS  5000    /* default lease */
#define KA_CLUSTER_MAX       256     /* nodes tracked */
#define KA_CLUSTER_FORGET_MS 3600000 /* default: a dead node's row is kept for an hour */

enum {
    KA_CLUSTER_MSG_BASE = 0x4c00,
    KA_CLUSTER_TICK, /* internal: the renewal timer */
    KA_CLUSTER_NODES,
    KA_CLUSTER_TREE,
    KA_CLUSTER_LEAVE,
    KA_CLUSTER_DRAIN,
};

/* One node as this node sees it. */
typedef struct ka_cluster_node {
    ka_store_node_t row; /* the table's row (alive: its lease holds) */
    int32_t self;        /* 1 for this node */
    int32_t connected;   /* a mesh peer of this node */
    int32_t mesh_up;     /* heard from over the mesh lately (krt_mesh_node_up) */
} ka_cluster_node_t;

typedef struct ka_cluster_nodes {
    int32_t member; /* this node holds its lease */
    uint32_t count;
    ka_cluster_node_t items[];
} ka_cluster_nodes_t;

/* Shared with the node's other threads (readiness, metrics); written by the actor only. */
typedef struct ka_membership_status {
    atomic_bool member;              /* registered (false before the first registration) */
    atomic_llong lease_deadline;     /* krt_mono_ms before which the lease surely holds */
    atomic_llong incarnation;        /* of the current (or last) registration */
    atomic_ullong fenced_total;      /* times this node found itself fenced */
    atomic_uint peers_connected;     /* mesh peers */
    char self_id[KA_STORE_NODE_LEN]; /* this node's id (set by the actor's init) */
    atomic_flag dir_lock;            /* guards dir (zeroed: clear) */
    ka_store_node_list_t *dir;       /* the node table as last read, for ka_membership_* readers */
} ka_membership_status_t;

/* Spawn argument; must outlive the actor (supervisor restarts reuse it). */
typedef struct ka_membership_args {
    const char *store;    /* the store actor's registered name */
    krt_mesh_t *mesh;     /* NULL: no mesh (the table is kept, no peer is connected) */
    ka_store_node_t self; /* id, name, endpoint, mesh_endpoint, public_key, pools, capacity */
    int renew_ms;         /* 0 = KA_CLUSTER_RENEW_MS */
    int lease_ms;         /* 0 = KA_CLUSTER_LEASE_MS */
    int64_t forget_ms;    /* another node's row goes once its lease lapsed this long ago and
                             no live sandbox names it; 0 = KA_CLUSTER_FORGET_MS */
    ka_membership_status_t *status; /* required */
} ka_membership_args_t;

extern const krt_behaviour_t ka_membership_behaviour;

/* True while the node holds its lease: the flag to check before acting as a member. Exact
 * from any thread: a node that was stopped (SIGSTOP, a long pause) past its lease is not a
 * member from the moment it runs again, before its actor has noticed. */
static inline bool ka_membership_member(const ka_membership_status_t *st)
{
    return st && atomic_load(&st->member) && krt_mono_ms() < atomic_load(&st->lease_deadline);
}

/* A row's node id as an address's node (1..65535), 0 if the id is not one. */
uint16_t ka_membership_node_id(const ka_store_node_t *row);

/* Publishes the table the membership actor read (taken), returning the previous one for it to
 * free (the actor's alone). */
ka_store_node_list_t *ka_membership_publish(ka_membership_status_t *st, ka_store_node_list_t *l);

/* Node `name`'s row in the table as this node last read it: 0, or -ENOENT (no such row, or
 * no table yet). Any thread. */
int ka_membership_find(ka_membership_status_t *st, const char *name, ka_store_node_t *out);

/* Placement (power of two choices): of the nodes whose lease holds, that serve `pool` (their
 * pools list names it) and have room (capacity 0: no limit; else fewer live sandboxes than
 * that), not draining, and are not named `exclude` (NULL: none; a node that just refused the
 * create for room), two are drawn with seed; the one with the lower load (live sandboxes over
 * capacity) wins, this node on a tie. 0 and *out, or -ENOENT when no node qualifies. Any
 * thread. */
int ka_membership_place(ka_membership_status_t *st, const char *pool, const char *exclude,
                        uint64_t seed, ka_store_node_t *out);

/* Copies up to cap rows of other nodes whose lease lapsed (their sandboxes are for a live node
 * to take over); returns how many. Any thread. */
size_t ka_membership_lapsed(ka_membership_status_t *st, ka_store_node_t *out, size_t cap);

/* Whether another node's lease holds in the table as last read (placement and routing have
 * nothing to do on a node alone). */
bool ka_membership_others(ka_membership_status_t *st);

#endif
