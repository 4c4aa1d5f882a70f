/*
 * ka_store: the store actor, the control plane's only door to PostgreSQL.
 *
 * One actor owns one ka_pgconn engine. It watches the engine's socket with krt_fd_watch,
 * drives its deadlines with a krt timer, and serves the typed requests below (krt_request
 * from actors, krt_call from other threads). Concurrent requests are pipelined and group
 * committed: many creates share one round trip and one WAL flush. A reply is sent only once
 * the change is committed. Nothing blocks a scheduler: migrations run on a job thread.
 *
 * A success reply has the request's message type and its reply struct alone as the body
 * (KA_STORE_SUBSCRIBE: empty). A failure is an error reply (krt_reply_error: the code in the
 * envelope, the message as the body, nothing padded to the success shape); read either with
 * ka_store_outcome. The codes:
 *   KA_STORE_EUNAVAIL   the database is unreachable or the connection was lost while the
 *                       request was in flight (the outcome of a write may be unknown; every
 *                       write here is safe to retry: creates are idempotent on
 *                       (creator, request_id))
 *   KA_STORE_ENOTFOUND  no such record (or it belongs to another creator)
 *   KA_STORE_ESTALE     an update's expected state did not match (compare-and-set)
 *   KA_STORE_EINVAL     malformed request body or field
 *   KA_STORE_ECONFLICT  serialization conflicts persisted after retries
 *   KA_STORE_EDB        any other database error (message says which)
 * and the message is a human-readable explanation.
 *
 * Strings in bodies are NUL-terminated inside fixed arrays; a request with an unterminated
 * field is refused with KA_STORE_EINVAL. Times are Unix epoch milliseconds.
 *
 * Change events: an actor that sends KA_STORE_SUBSCRIBE receives KA_STORE_EVENT messages for
 * NOTIFYs on channels ka_sandbox ("<id> <state> <operation>") and ka_template
 * ("<namespace>/<name> <generation>"), from every node sharing the database.
 */
#ifndef KA_STORE_H
#define KA_STORE_H

#include <stdint.h>

#include "krt.h"
#include "pgconn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KA_STORE_EUNAVAIL  (-ENOTCONN)
#define KA_STORE_ENOTFOUND (-ENOENT)
#define KA_STORE_ESTALE    (-ESTALE)
#define KA_STORE_EINVAL    (-EINVAL)
#define KA_STORE_ECONFLICT (-EAGAIN)
#define KA_STORE_EDB       (-EIO)

/* Field sizes (bytes including the NUL). */
#define KA_STORE_ID_LEN       37 /* UUID text */
#define KA_STORE_CREATOR_LEN  256
#define KA_STORE_REQID_LEN    129 /* request ids are 1..128 chars */
#define KA_STORE_NAME_LEN     201 /* sandbox display names <= 200 */
#define KA_STORE_NS_LEN       64  /* DNS label <= 63 */
#define KA_STORE_TNAME_LEN    254 /* DNS subdomain <= 253 */
#define KA_STORE_REV_LEN      72  /* revision content hash (sha256 hex) */
#define KA_STORE_REASON_LEN   128
#define KA_STORE_MESSAGE_LEN  512
#define KA_STORE_NODE_LEN     128
#define KA_STORE_ENDPOINT_LEN 256
#define KA_STORE_POOLS_LEN    512 /* comma-separated pool names */
#define KA_STORE_KEY_LEN      41  /* z85 CURVE key */
#define KA_STORE_LIST_MAX     100 /* items per list page */

/* Registered name of the node's store actor (by convention of its spawner). */
#define KA_STORE_NAME "store"

/* Message types. Request body -> reply body. */
enum {
    KA_STORE_MSG_BASE = 0x5300,
    KA_STORE_SANDBOX_CREATE,  /* ka_store_sandbox_create_t -> ka_store_sandbox_reply_t */
    KA_STORE_SANDBOX_GET,     /* ka_store_sandbox_key_t -> ka_store_sandbox_reply_t */
    KA_STORE_SANDBOX_LIST,    /* ka_store_sandbox_query_t -> ka_store_sandbox_list_t */
    KA_STORE_SANDBOX_UPDATE,  /* ka_store_sandbox_update_t -> ka_store_sandbox_reply_t */
    KA_STORE_SANDBOX_DELETE,  /* ka_store_sandbox_key_t -> ka_store_sandbox_reply_t */
    KA_STORE_SANDBOX_EXPIRY,  /* ka_store_expiry_query_t -> ka_store_sandbox_list_t */
    KA_STORE_TEMPLATE_PUT,    /* ka_store_template_put_t -> ka_store_blob_t of templates */
    KA_STORE_TEMPLATE_STATUS, /* ka_store_template_status_t -> ka_store_blob_t of templates */
    KA_STORE_TEMPLATE_GET,    /* ka_store_template_key_t -> ka_store_blob_t of templates */
    KA_STORE_TEMPLATE_LIST,   /* ka_store_template_key_t (namespace filter) -> blob */
    KA_STORE_TEMPLATE_DELETE, /* ka_store_template_key_t -> ka_store_blob_t of templates */
    KA_STORE_REVISION_PUT,    /* ka_store_revision_put_t -> ka_store_blob_t of revisions */
    KA_STORE_REVISION_STATE,  /* ka_store_revision_state_t -> ka_store_blob_t of revisions */
    KA_STORE_REVISION_GET,    /* ka_store_revision_key_t -> ka_store_blob_t of revisions */
    KA_STORE_POOL_PUT,        /* ka_store_pool_t -> ka_store_pool_list_t (one item) */
    KA_STORE_POOL_LIST,       /* empty -> ka_store_pool_list_t */
    KA_STORE_NODE_PUT,        /* ka_store_node_t -> ka_store_node_list_t (one item) */
    KA_STORE_NODE_HEARTBEAT,  /* ka_store_node_heartbeat_t -> ka_store_node_list_t */
    KA_STORE_NODE_LIST,       /* empty -> ka_store_node_list_t */
    KA_STORE_SUBSCRIBE,       /* ka_store_subscribe_t -> empty */
    KA_STORE_EVENT,           /* sent to subscribers: ka_store_event_t (no reply) */
    KA_STORE_INFO,            /* empty -> ka_store_info_t */
    KA_STORE_NODE_TAKEOVER,   /* ka_store_takeover_t -> ka_store_sandbox_list_t (moved) */
    KA_STORE_NODE_DRAIN,      /* ka_store_node_heartbeat_t (id) -> ka_store_node_list_t */
    KA_STORE_NODE_FORGET,     /* ka_store_node_heartbeat_t -> ka_store_node_list_t (0 or 1) */
    KA_STORE_SANDBOX_RECEIPT, /* ka_store_receipt_key_t -> ka_store_sandbox_reply_t */
    KA_STORE_MSG_LAST_
};

/* Sandbox runtime states and operations; their names are what the database stores. */
typedef enum {
    KA_STATE_UNSPECIFIED = 0,
    KA_STATE_CREATING,
    KA_STATE_READY,
    KA_STATE_SUSPENDED,
    KA_STATE_FAILED,
    KA_STATE_DELETING,
    KA_STATE_DELETED
} ka_runtime_state_t;

typedef enum {
    KA_OP_NONE = 0,
    KA_OP_CREATE,
    KA_OP_SUSPEND,
    KA_OP_RESUME,
    KA_OP_DELETE
} ka_runtime_op_t;

/* "RUNTIME_STATE_READY" etc.; NULL when out of range. Parse returns -1 when unknown. */
const char *ka_state_name(int state);
int ka_state_parse(const char *name);
const char *ka_op_name(int op);
int ka_op_parse(const char *name);

typedef enum {
    KA_REV_PREPARING = 0,
    KA_REV_PREPARED,
    KA_REV_FAILED,
    KA_REV_RETIRED
} ka_rev_state_t;
const char *ka_rev_state_name(int st); /* "PREPARING" ... */

/* A store request's outcome as its krt_request callback (err, msg) or krt_call sees it: 0 when
 * msg is the store's success reply of at least `size` bytes; else a KA_STORE_E* code (or
 * -ENOMEM): the store's error reply, KA_STORE_EUNAVAIL when the store did not answer (stopped,
 * timed out, its node unreachable), KA_STORE_EINVAL for a reply shorter than size. *why (if not
 * NULL) gets the message, borrowed from msg or static. */
int ka_store_outcome(int err, const krt_msg_t *msg, size_t size, const char **why);

/* ---------------------------------------------------------------------------------------- */
/* Sandboxes                                                                                */

typedef struct ka_store_sandbox {
    char id[KA_STORE_ID_LEN];
    char creator[KA_STORE_CREATOR_LEN];
    char request_id[KA_STORE_REQID_LEN];
    char name[KA_STORE_NAME_LEN];
    char template_namespace[KA_STORE_NS_LEN];
    char template_name[KA_STORE_TNAME_LEN];
    char revision[KA_STORE_REV_LEN]; /* pinned revision ("" if the template had none) */
    int32_t state;                   /* ka_runtime_state_t */
    int32_t operation;               /* ka_runtime_op_t */
    char failure_reason[KA_STORE_REASON_LEN];
    char failure_message[KA_STORE_MESSAGE_LEN];
    char node[KA_STORE_NODE_LEN]; /* node serving it, "" if none */
    int64_t created_ms;
    int64_t updated_ms;
    int64_t expires_ms;
    int64_t deleted_ms; /* 0 while live; set with the tombstone */
} ka_store_sandbox_t;

/* Create idempotently on (creator, request_id): a duplicate, even of a deleted sandbox,
 * returns the existing record with created = 0 and changes nothing. */
typedef struct ka_store_sandbox_create {
    char creator[KA_STORE_CREATOR_LEN];  /* required */
    char request_id[KA_STORE_REQID_LEN]; /* required */
    char name[KA_STORE_NAME_LEN];
    char template_namespace[KA_STORE_NS_LEN]; /* required */
    char template_name[KA_STORE_TNAME_LEN];   /* required */
    char revision[KA_STORE_REV_LEN];          /* "" pins the template's latest prepared revision */
    char node[KA_STORE_NODE_LEN];
    int64_t ttl_ms; /* > 0: expires_ms = created + ttl_ms (the caller applies policy bounds) */
    char id[KA_STORE_ID_LEN]; /* "" = a new random id; else this UUID (a warm sandbox's) */
    int32_t ready;            /* 1: written READY (operation NONE), its compute already runs */
} ka_store_sandbox_create_t;

/* The receipt of a create (KA_STORE_SANDBOX_RECEIPT): the record created under (creator,
 * request_id), deleted ones too, with created = 0; NOT_FOUND if there is none. Reads only: a
 * create that may not go ahead learns whether it is a replay without recording anything. */
typedef struct ka_store_receipt_key {
    char creator[KA_STORE_CREATOR_LEN];
    char request_id[KA_STORE_REQID_LEN];
} ka_store_receipt_key_t;

typedef struct ka_store_sandbox_reply {
    int32_t created; /* create: 1 if this call inserted it */
    ka_store_sandbox_t sandbox;
} ka_store_sandbox_reply_t;

/* A write's fence: node_id "" = none; else the write applies only while that node holds its
 * lease under this incarnation (the fencing counter), by the database's clock; otherwise
 * KA_STORE_ESTALE. A node fenced, or registered again since, writes nothing. */
typedef struct ka_store_fence {
    char node_id[KA_STORE_NODE_LEN];
    int64_t incarnation;
} ka_store_fence_t;

/* Get / delete by id. creator "" matches any creator; otherwise a different creator's
 * sandbox is KA_STORE_ENOTFOUND. Delete sets DELETED/NONE, deleted_ms, and a tombstone;
 * deleting again returns the tombstoned record. */
typedef struct ka_store_sandbox_key {
    char id[KA_STORE_ID_LEN];
    char creator[KA_STORE_CREATOR_LEN];
    char node[KA_STORE_NODE_LEN]; /* delete: "" any; else only while this node serves it (the
                                     fence: a node another one took over from deletes nothing) */
    ka_store_fence_t fence;       /* delete: see ka_store_fence_t */
} ka_store_sandbox_key_t;

/* List, oldest first. Filters "" match anything (node: the sandboxes a node serves, for
 * reconciliation after its restart). */
typedef struct ka_store_sandbox_query {
    char creator[KA_STORE_CREATOR_LEN];
    char template_namespace[KA_STORE_NS_LEN];
    char template_name[KA_STORE_TNAME_LEN];
    char node[KA_STORE_NODE_LEN];
    int32_t include_deleted;
    int32_t limit;  /* 1..KA_STORE_LIST_MAX; 0 = KA_STORE_LIST_MAX */
    int32_t offset; /* >= 0 */
} ka_store_sandbox_query_t;

/* Live sandboxes by expiry: expired = 1 lists those with expires <= now (to delete at start),
 * 0 those still running (to re-arm their TTL timers). Ordered by expiry. */
typedef struct ka_store_expiry_query {
    int32_t expired;
    int32_t limit;
    int32_t offset;
} ka_store_expiry_query_t;

typedef struct ka_store_sandbox_list {
    uint32_t count; /* items that follow */
    int32_t more;   /* 1 if another page exists */
    ka_store_sandbox_t items[];
} ka_store_sandbox_list_t;

/* Which fields an update sets. */
enum { KA_SB_SET_STATE = 1, KA_SB_SET_OPERATION = 2, KA_SB_SET_FAILURE = 4, KA_SB_SET_NODE = 8 };

/* Update a live sandbox (deleted ones are KA_STORE_ESTALE). If expect_state >= 0 the update
 * applies only when the current state equals it, else KA_STORE_ESTALE. */
typedef struct ka_store_sandbox_update {
    char id[KA_STORE_ID_LEN];
    uint32_t set; /* KA_SB_SET_* */
    int32_t expect_state;
    int32_t state;
    int32_t operation;
    char failure_reason[KA_STORE_REASON_LEN];
    char failure_message[KA_STORE_MESSAGE_LEN];
    char node[KA_STORE_NODE_LEN];
    char expect_node[KA_STORE_NODE_LEN]; /* "" any; else applies only while this node serves
                                            it, else KA_STORE_ESTALE */
    ka_store_fence_t fence;
} ka_store_sandbox_update_t;

/* ---------------------------------------------------------------------------------------- */
/* Templates and revisions: variable-size records in a blob                                 */

/* A reply carrying zero or more variable-size records, each 8-byte aligned. Iterate with
 * ka_store_blob_next. */
typedef struct ka_store_blob {
    uint32_t count;                   /* records */
    uint32_t bytes;                   /* bytes of data */
    int32_t more;                     /* lists: another page exists */
    _Alignas(8) unsigned char data[]; /* records, each starting 8-byte aligned */
} ka_store_blob_t;

/* Returns the record after prev (NULL: the first), or NULL at the end. len is the reply's
 * length, so a truncated reply is never overrun. */
const void *ka_store_blob_next(const ka_store_blob_t *b, size_t len, const void *prev);

typedef struct ka_store_template {
    uint32_t size; /* bytes of this record including text, 8-aligned */
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    char uid[KA_STORE_ID_LEN]; /* changes when a deleted template is created again */
    int32_t deleted;
    int64_t generation; /* bumped when the spec changes */
    int64_t observed_generation;
    char desired_revision[KA_STORE_REV_LEN];
    char latest_revision[KA_STORE_REV_LEN]; /* last PREPARED revision: what creates pin */
    int64_t created_ms;
    int64_t updated_ms;
    uint32_t spec_len;   /* text[0 .. spec_len) then NUL: the spec JSON */
    uint32_t status_len; /* then the status JSON (conditions) and NUL */
    char text[];
} ka_store_template_t;

/* Borrowed pointers into a template record. */
const char *ka_store_template_spec(const ka_store_template_t *t);
const char *ka_store_template_status(const ka_store_template_t *t);

/* Create or update (and undelete) a template; the spec must be JSON. The generation bumps
 * when the spec changes or the template was deleted. Body length: sizeof + spec_len + 1. */
typedef struct ka_store_template_put {
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    uint32_t spec_len;
    char spec[]; /* spec_len bytes then NUL */
} ka_store_template_put_t;

/* Record preparation status: status JSON (the conditions), observed generation, the desired
 * revision, and (if not "") the latest prepared revision. */
typedef struct ka_store_template_status {
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    int64_t observed_generation;
    char desired_revision[KA_STORE_REV_LEN];
    char latest_revision[KA_STORE_REV_LEN];
    uint32_t status_len;
    char status[]; /* status_len bytes then NUL */
} ka_store_template_status_t;

/* Get/delete: namespace and name. List: namespace ("" = all), name ignored. Deleted
 * templates are returned only with include_deleted (get and list). Delete marks deleted. */
typedef struct ka_store_template_key {
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    int32_t include_deleted;
    int32_t limit; /* list: 1..KA_STORE_LIST_MAX; 0 = KA_STORE_LIST_MAX */
    int32_t offset;
} ka_store_template_key_t;

typedef struct ka_store_revision {
    uint32_t size; /* bytes of this record including text, 8-aligned */
    char hash[KA_STORE_REV_LEN];
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    int64_t generation;
    int32_t state; /* ka_rev_state_t */
    char reason[KA_STORE_REASON_LEN];
    char message[KA_STORE_MESSAGE_LEN];
    int64_t created_ms;
    int64_t updated_ms;
    uint32_t spec_len;
    char spec[]; /* spec JSON then NUL */
} ka_store_revision_t;

/* Insert a revision if its hash is new (revisions are immutable: an existing one is returned
 * unchanged). state/reason/message are the initial values. */
typedef struct ka_store_revision_put {
    char hash[KA_STORE_REV_LEN];
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
    int64_t generation;
    int32_t state;
    char reason[KA_STORE_REASON_LEN];
    char message[KA_STORE_MESSAGE_LEN];
    uint32_t spec_len;
    char spec[]; /* spec_len bytes then NUL */
} ka_store_revision_put_t;

/* Builders for the variable-size request bodies: malloc'd (caller frees), text copied with
 * its NUL, fixed strings truncated to their fields; *len receives the body length to send.
 * NULL on allocation failure or NULL arguments. */
ka_store_template_put_t *ka_store_template_put_new(const char *ns, const char *name,
                                                   const char *spec, size_t *len);
ka_store_template_status_t *ka_store_template_status_new(const char *ns, const char *name,
                                                         const char *status, size_t *len);
ka_store_revision_put_t *ka_store_revision_put_new(const char *hash, const char *ns,
                                                   const char *name, const char *spec, size_t *len);

/* Set a revision's preparation state. PREPARED also makes it its template's latest revision,
 * in the same transaction. */
typedef struct ka_store_revision_state {
    char hash[KA_STORE_REV_LEN];
    int32_t state;
    char reason[KA_STORE_REASON_LEN];
    char message[KA_STORE_MESSAGE_LEN];
} ka_store_revision_state_t;

typedef struct ka_store_revision_key {
    char hash[KA_STORE_REV_LEN];
} ka_store_revision_key_t;

/* ---------------------------------------------------------------------------------------- */
/* Pools and nodes                                                                          */

typedef struct ka_store_pool {
    char name[KA_STORE_TNAME_LEN];
    char sandbox_class[64]; /* "namespaces" */
    int32_t capacity;
    int64_t updated_ms; /* reply only */
} ka_store_pool_t;

typedef struct ka_store_pool_list {
    uint32_t count;
    ka_store_pool_t items[];
} ka_store_pool_list_t;

/* A node of the cluster. Put registers it (inserted, or updated with a new incarnation: the
 * fencing counter, bumped at every registration); the reply is the row. */
typedef struct ka_store_node {
    char id[KA_STORE_NODE_LEN]; /* the node id (decimal, 1..65535: its actor addresses') */
    char name[KA_STORE_NODE_LEN];
    char endpoint[KA_STORE_ENDPOINT_LEN];      /* the API (host:port) */
    char mesh_endpoint[KA_STORE_ENDPOINT_LEN]; /* the mesh (tcp://host:port), "" if none */
    char public_key[KA_STORE_KEY_LEN];         /* CURVE public key (z85), "" if none */
    char pools[KA_STORE_POOLS_LEN];
    int32_t capacity;
    int64_t lease_ms;         /* put: lease length granted from now */
    int64_t started_ms;       /* reply only */
    int64_t heartbeat_ms;     /* reply only */
    int64_t lease_expires_ms; /* reply only */
    int64_t incarnation;      /* reply only */
    int32_t alive;            /* reply only: 1 while the lease holds (the database's clock) */
    int32_t sandboxes;        /* reply only: its sandboxes neither FAILED nor deleted */
    int32_t draining;         /* reply only: 1 once drained (no placements) until it registers */
} ka_store_node_t;

/* Renew a lease: only the incarnation that holds it and only before it lapsed; otherwise
 * KA_STORE_ENOTFOUND (the node must register again, under a new incarnation). lease_ms 0 ends
 * the lease now: the node leaves. */
typedef struct ka_store_node_heartbeat {
    char id[KA_STORE_NODE_LEN];
    int64_t lease_ms;    /* the lease ends at now + lease_ms */
    int64_t incarnation; /* the one the registration returned */
} ka_store_node_heartbeat_t;

/* Forget a node (KA_STORE_NODE_FORGET, same body): its row goes if its lease lapsed under
 * `incarnation` at least lease_ms ago and no live sandbox names it; the reply lists the row
 * removed (count 0: nothing was). */

typedef struct ka_store_node_list {
    uint32_t count;
    ka_store_node_t items[];
} ka_store_node_list_t;

/* Take over a lapsed node's sandboxes (see node_takeover in store_sql.c): up to limit live
 * sandboxes of node_id, if its lease lapsed under `incarnation`, move to the taker (its name
 * recorded on them; its lease must hold under taker_incarnation), FAILED with reason and message
 * unless FAILED or DELETING already. The reply lists the moved records; fewer than limit: none
 * is left. */
typedef struct ka_store_takeover {
    char node_id[KA_STORE_NODE_LEN];
    int64_t incarnation;
    char taker_id[KA_STORE_NODE_LEN];
    char taker[KA_STORE_NODE_LEN]; /* the taker's name */
    int64_t taker_incarnation;
    char reason[KA_STORE_REASON_LEN];
    char message[KA_STORE_MESSAGE_LEN];
    int32_t limit; /* 1..KA_STORE_LIST_MAX; 0 = KA_STORE_LIST_MAX */
} ka_store_takeover_t;

/* ---------------------------------------------------------------------------------------- */
/* Events and introspection                                                                 */

typedef struct ka_store_subscribe {
    krt_addr_t who; /* KRT_ADDR_NONE = the sender */
} ka_store_subscribe_t;

typedef struct ka_store_event {
    char channel[32]; /* "ka_sandbox" or "ka_template" */
    char payload[512];
} ka_store_event_t;

typedef struct ka_store_info {
    int32_t conn_state; /* ka_pgconn_state_t */
    int32_t schema_version;
    ka_pgconn_stats_t stats;
} ka_store_info_t;

/* ---------------------------------------------------------------------------------------- */
/* The actor                                                                                */

/* Spawn argument; must outlive the actor (supervisor restarts reuse it). Copied in init. */
typedef struct ka_store_args {
    const char *conninfo;  /* libpq conninfo; "" = PG* environment */
    ka_pgconn_opts_t opts; /* engine options (zero = defaults) */
    bool skip_migrate;     /* true: do not apply migrations at start (tests, read replicas) */
} ka_store_args_t;

/* The behaviour. init returns non-zero only on bad arguments or allocation failure; an
 * unreachable database is not a start failure (requests get KA_STORE_EUNAVAIL while it
 * retries), but a database with a newer schema makes the actor exit with
 * KA_STORE_EXIT_SCHEMA_NEWER. */
extern const krt_behaviour_t ka_store_behaviour;

#define KA_STORE_EXIT_SCHEMA_NEWER (KRT_EXIT_ERROR + 40)

#ifdef __cplusplus
}
#endif
#endif /* KA_STORE_H */
