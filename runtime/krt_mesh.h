/*
 * krt_mesh: the transport between nodes, over ZeroMQ.
 *
 * Each node binds one ROUTER endpoint (tcp://, ipc:// or inproc://) for inbound traffic and
 * opens one DEALER per peer (krt_mesh_connect) for outbound traffic, so each direction of a
 * pair is its own ordered stream: messages from one sender to one receiver on another node
 * arrive in the order they were sent (while the connection lives). For two nodes to talk both
 * ways, each connects to the other.
 *
 * Messages travel as codec envelopes (krt_codec.h), one per ZeroMQ frame; the envelope keeps
 * a message's kind (plain, request, reply), ref and status, so a krt_request to a remote actor
 * is answered, fails or times out exactly as a local one. A mesh installs
 * itself as its system's transport (krt_system_set_transport); the runtime then hands it
 * every message for another node. The send path only encodes and pushes onto a lock-free
 * queue; a flush (the end of a scheduler turn) then writes the queue to ZeroMQ itself if the
 * mesh's I/O thread is asleep, or leaves it to that thread: it never blocks a runtime thread.
 * One I/O thread per mesh reads every inbound message and hands it to krt_system_deliver.
 *
 * Optional: CURVE (this node's keys from a zcert file or z85 strings; each peer's public key
 * given to krt_mesh_connect): traffic is encrypted and peers are authenticated: an inbound
 * connection is accepted only if its key is one given to krt_mesh_connect, and its messages
 * only if its routing id is the node that key was given for. So for two CURVE nodes to talk,
 * each must krt_mesh_connect the other. A CURVE mesh has its own ZeroMQ context (tcp:// or
 * ipc:// only). Also optional: heartbeats with node-down notification (krt_mesh_monitor_node).
 *
 * Lifecycle: new -> start -> connect... -> stop -> destroy. Stop the mesh before destroying
 * its system (the I/O thread delivers into it), and destroy the mesh only once its system has
 * stopped (a runtime thread may still be inside a send). Every mesh without CURVE in a process
 * shares one ZeroMQ context (so inproc:// endpoints reach each other); the context and its
 * threads go away with the last mesh.
 */
#ifndef KRT_MESH_H
#define KRT_MESH_H

#include "krt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct krt_mesh krt_mesh_t;

typedef struct krt_mesh_config {
    const char *bind;         /* required: endpoint to bind, e.g. tcp://0.0.0.0:7100,
                                 ipc:///run/kagent/mesh, inproc://node-1; a tcp port of
                                 "*" picks a free one (see krt_mesh_endpoint) */
    const char *curve_cert;   /* optional: zcert secret-key file of this node: enables CURVE */
    const char *curve_public; /* optional instead of curve_cert: z85 public key (40 chars) */
    const char *curve_secret; /* ... and z85 secret key (40 chars) */
    int heartbeat_ms;         /* send a heartbeat to every peer this often; 0 = never */
    int peer_timeout_ms;      /* silence after which a peer is down; 0 = 3 * heartbeat_ms */
    uint32_t max_msg;         /* largest envelope in bytes either way; 0 = 16 MiB */
    int queue_limit;          /* messages queued per peer before sends are dropped; 0 = 100000 */
} krt_mesh_config_t;

typedef struct krt_mesh_stats {
    uint64_t sent;          /* envelopes handed to ZeroMQ */
    uint64_t received;      /* envelopes delivered to local actors */
    uint64_t dropped;       /* outbound envelopes dropped (peer queue full) */
    uint64_t undeliverable; /* inbound envelopes krt_system_deliver refused (no such actor) */
    uint64_t malformed;     /* inbound frames that failed to decode or were misaddressed */
    uint64_t heartbeats;    /* heartbeats received */
    uint64_t frames;        /* ZeroMQ messages sent (each a batch of envelopes) */
    uint64_t stale;         /* inbound frames dropped: meant for another incarnation of this node,
                               or from a disconnected peer */
    uint64_t io_wakeups;    /* times the I/O thread woke from a blocking wait for traffic */
    uint64_t signals;       /* eventfd writes by senders to wake the I/O thread */
} krt_mesh_stats_t;

/* A mesh for sys (not started; cfg copied). NULL on failure (bad config, CURVE keys that do
 * not load, out of memory). */
krt_mesh_t *krt_mesh_new(krt_system_t *sys, const krt_mesh_config_t *cfg);
/* Binds, starts the I/O thread and installs the mesh as sys's transport. 0, or -errno from
 * ZeroMQ (e.g. -EADDRINUSE), KRT_EINVAL if already started. */
int krt_mesh_start(krt_mesh_t *m);
/* The bound endpoint (with a tcp port resolved); borrowed, valid until destroy. NULL before
 * start. */
const char *krt_mesh_endpoint(const krt_mesh_t *m);

/*
 * Adds a peer: messages for addresses on `node` go to `endpoint` (that node's bind endpoint).
 * server_key is the peer's z85 public key, required when CURVE is on, ignored otherwise.
 * Safe from any thread after start, including actor handlers (it does not wait for the
 * connection: messages queue until it is up). KRT_EEXIST if node already has a peer,
 * KRT_EINVAL for node 0, this node, a bad endpoint or a missing key; KRT_ESHUTDOWN if the mesh
 * is not running.
 */
int krt_mesh_connect(krt_mesh_t *m, uint16_t node, const char *endpoint, const char *server_key);
/*
 * Drops the peer: says goodbye to it, closes the connection, and declares the node down (node
 * monitors fire, krt_system_node_down). Later sends to it fail with KRT_EREMOTE and its
 * frames are dropped, until krt_mesh_connect adds it again. KRT_EINVAL if node has no peer.
 */
int krt_mesh_disconnect(krt_mesh_t *m, uint16_t node);
/* True if a peer for node was added. */
bool krt_mesh_has_peer(const krt_mesh_t *m, uint16_t node);

/*
 * Node monitoring (needs heartbeat_ms > 0 on both nodes): when `node` stays silent longer
 * than peer_timeout_ms (after it was last heard from, or after krt_mesh_connect if it never
 * was), `watcher` receives one KRT_MSG_DOWN (body
 * krt_down_t: who = the node's address prefix (node << 48), ref = *ref, reason =
 * KRT_EXIT_NOCONN); the monitor is then gone. If the node is down when the monitor is added,
 * the DOWN arrives at once. Safe from any thread after start.
 */
int krt_mesh_monitor_node(krt_mesh_t *m, uint16_t node, krt_addr_t watcher, uint64_t *ref);
/* Removes a monitor that has not fired. */
int krt_mesh_demonitor_node(krt_mesh_t *m, uint64_t ref);
/* True while node is considered up (heard from within peer_timeout_ms). */
bool krt_mesh_node_up(const krt_mesh_t *m, uint16_t node);

void krt_mesh_stats(const krt_mesh_t *m, krt_mesh_stats_t *out);

/* Uninstalls the transport (later remote sends fail with KRT_EREMOTE), waits for sends in
 * progress, stops and joins the I/O thread, writes what was queued, says goodbye to every
 * peer (they see this node down at once, not after a heartbeat timeout) and closes the
 * sockets. Idempotent. */
void krt_mesh_stop(krt_mesh_t *m);
/* Stops if needed and frees everything. Idempotent; NULLs *m_p. */
void krt_mesh_destroy(krt_mesh_t **m_p);

#ifdef __cplusplus
}
#endif
#endif /* KRT_MESH_H */
