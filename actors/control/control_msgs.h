/*
 * control_msgs: the messages between the control plane's actors (templates, sandboxes, one
 * actor per sandbox) and the service layer that the bridges call.
 *
 * A success reply is the struct its request names, nothing before it. A failure is an error
 * reply (ka_reply_fail): a negative errno in the envelope (ka_errors.h maps it to the gRPC
 * code at the edge) and the message the bridges pass to callers unchanged as the body; read
 * both with ka_reply_outcome. A guest call answers with frames (ka_guest_reply_t): a failing one
 * carries the negative errno and, as its tail, the message (svc_frames.h reads both).
 * Request bodies carry the caller's identity; ownership is checked by the actor that owns the
 * record, never by a bridge.
 */
#ifndef KA_CONTROL_MSGS_H
#define KA_CONTROL_MSGS_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ka_errors.h"
#include "krt.h"
#include "store.h"

/* gRPC status codes: both bridges map them directly (MCP turns non-OK into isError). */
typedef enum {
    KA_OK = 0,
    KA_CANCELLED = 1,
    KA_UNKNOWN = 2,
    KA_INVALID_ARGUMENT = 3,
    KA_DEADLINE_EXCEEDED = 4,
    KA_NOT_FOUND = 5,
    KA_ALREADY_EXISTS = 6,
    KA_PERMISSION_DENIED = 7,
    KA_RESOURCE_EXHAUSTED = 8,
    KA_FAILED_PRECONDITION = 9,
    KA_ABORTED = 10,
    KA_OUT_OF_RANGE = 11,
    KA_UNIMPLEMENTED = 12,
    KA_INTERNAL = 13,
    KA_UNAVAILABLE = 14,
    KA_DATA_LOSS = 15,
    KA_UNAUTHENTICATED = 16
} ka_code_t;

/* Bytes of a failure's message, its NUL included. */
#define KA_MSG_LEN 512

/* A control actor's UNAVAILABLE. The runtime's own failures (KRT_ENOACTOR, KRT_ENOCONN,
 * KRT_EREMOTE, KRT_ESHUTDOWN, KRT_ETIMEDOUT) mean that no actor answered; an actor never
 * answers with them (ka_reply_fail maps them to KA_EUNAVAIL and KA_ETIMEOUT), so a reader tells
 * an actor's answer from the runtime's. */
#define KA_EUNAVAIL (-ECONNREFUSED)
#define KA_ETIMEOUT (-ETIME) /* a control actor's DEADLINE_EXCEEDED */

/* Answers the request (to, ref) with the failure err (a negative errno) and message (NULL:
 * ""): an error reply, the runtime's own codes mapped as above. 0 or the send's error. */
int ka_reply_fail(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int err, const char *message);
/* Ends a guest call (to, ref; ref 0: a stream reader) with a final frame of the failure err (a
 * negative errno) and message (NULL: ""). 0 or the send's error. */
int ka_guest_fail(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int err, const char *message);
/* Answers request (to, ref) of `type` with the failure err (a negative errno) and a printf
 * message: a guest call (KA_SBX_GUEST) with a final frame, anything else with an error reply. */
void ka_fail(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int err, const char *fmt,
             ...) __attribute__((format(printf, 6, 7)));
/* True when err is one of the runtime's own failures: no actor answered. */
bool ka_reply_unanswered(int err);
/* A control actor's errno for the runtime's failure err: KA_ETIMEOUT for KRT_ETIMEDOUT, else
 * KA_EUNAVAIL. */
int ka_err_unanswered(int err);
/* The outcome of a control actor's reply as a krt_reply_fn or krt_call_cb gets it (err, msg):
 * 0 when msg is a success reply of at least size bytes; the runtime's err (*why NULL) when no
 * actor answered; the actor's error and *why its message (borrowed from msg) for an error
 * reply; -EIO and a static *why for a short reply. why may be NULL. */
int ka_reply_outcome(int err, const krt_msg_t *msg, size_t size, const char **why);

/* Registered names. */
#define KA_TEMPLATES_NAME "templates"
#define KA_SANDBOXES_NAME "sandboxes"
/* Each sandbox's actor is registered as KA_SANDBOX_NAME_PREFIX + its id ("sandbox/<uuid>"):
 * the service layer sends a sandbox's calls there, and to the manager only when no actor holds
 * the name. */
#define KA_SANDBOX_NAME_PREFIX "sandbox/"
#define KA_SANDBOX_NAME_LEN    (sizeof KA_SANDBOX_NAME_PREFIX + KA_STORE_ID_LEN)

/* The registered name of sandbox id's actor into out (KA_SANDBOX_NAME_LEN bytes). */
static inline void ka_sandbox_name(char out[KA_SANDBOX_NAME_LEN], const char *id)
{
    snprintf(out, KA_SANDBOX_NAME_LEN, KA_SANDBOX_NAME_PREFIX "%.*s", KA_STORE_ID_LEN - 1, id);
}

/* Messages the reference names verbatim (reference section 3.6). */
#define KA_MSG_NOT_READY      "Sandbox is not ready or has expired"
#define KA_MSG_NOT_UUID       "Sandbox ID must be a UUID"
#define KA_MSG_NO_RUNTIME     "Cannot resolve sandbox runtime"
#define KA_MSG_FILE_TOO_LARGE "File exceeds 64 MiB transfer limit"
#define KA_MSG_NOT_FOUND      "sandbox not found"

enum {
    KA_CTL_MSG_BASE = 0x4300,
    /* templates actor */
    KA_TPL_APPLY,   /* ka_tpl_apply_t (+ yaml) -> ka_tpl_reply_t (+ records) */
    KA_TPL_GET,     /* ka_tpl_key_t -> ka_tpl_reply_t */
    KA_TPL_LIST,    /* ka_tpl_key_t (namespace filter) -> ka_tpl_reply_t */
    KA_TPL_DELETE,  /* ka_tpl_key_t -> ka_tpl_reply_t */
    KA_TPL_RESOLVE, /* ka_tpl_key_t -> ka_tpl_resolved_t: what a new sandbox pins */
    KA_TPL_RUNTIME, /* ka_tpl_runtime_req_t -> ka_tpl_resolved_t: a pinned revision's rootfs */
    /* sandboxes manager: creates and lists; the calls for one sandbox go to its actor
     * (KA_SANDBOX_NAME_PREFIX), or to the manager, which forwards them to an actor it knows or
     * answers from the store, when none is registered */
    KA_SBX_CREATE,       /* ka_sbx_create_t -> ka_sbx_reply_t */
    KA_SBX_GET,          /* ka_sbx_key_t -> ka_sbx_reply_t */
    KA_SBX_LIST,         /* ka_sbx_list_req_t -> ka_sbx_list_t */
    KA_SBX_SUSPEND,      /* ka_sbx_key_t -> ka_sbx_reply_t */
    KA_SBX_RESUME,       /* ka_sbx_key_t -> ka_sbx_reply_t */
    KA_SBX_DELETE,       /* ka_sbx_key_t -> ka_sbx_reply_t */
    KA_SBX_GUEST,        /* ka_guest_req_t (+ tail) -> frames: ka_guest_reply_t (+ tail) ... */
    KA_SBX_COUNT,        /* empty -> ka_sbx_count_t (live sandboxes on this node) */
    KA_SBX_GUEST_FRAME,  /* sandbox actor -> stream sink: ka_guest_reply_t (+ tail) */
    KA_SBX_GUEST_CANCEL, /* stream sink -> sandbox: ka_sbx_key_t; ends the sink's streams */
    KA_SBX_GUEST_BOUND,  /* sandbox actor -> stream sink, empty: the call is open (monitor me) */
    KA_SBX_GUEST_CREDIT, /* stream sink -> sandbox actor: ka_sbx_credit_t, data consumed */
    /* sandbox actor -> stream sink on the same node: a KA_SBX_GUEST_FRAME as a pointer
     * (krt_send_ptr) to a malloc'ed ka_guest_reply_t (+ tail), not a copy */
    KA_SBX_GUEST_FRAME_PTR,
    /* stream sink -> sandbox actor on the same node: a KA_SBX_GUEST as a pointer
     * (krt_send_ptr) to a ka_guest_req_ref_t, not a copy of the request */
    KA_SBX_GUEST_PTR,
    /* the sandbox's actor, as above (beyond the reference) */
    KA_SBX_PAUSE,   /* ka_sbx_key_t -> ka_sbx_reply_t (paused true): processes frozen */
    KA_SBX_UNPAUSE, /* ka_sbx_key_t -> ka_sbx_reply_t (paused false): thawed */
    /* internal */
    KA_SBX_FORWARD_, /* manager -> sandbox actor: ka_sbx_forward_t (+ original body) */
    KA_SBX_RECOVER_, /* manager -> itself: ka_sbx_recover_t, retry a recovery page */
    KA_SBX_RETIRE_,  /* sandbox actor -> manager: empty; deleted, route nothing more to me */
    KA_SBX_STOP_,    /* manager -> retired sandbox actor: empty; calls still queued behind it
                      * end KRT_ENOACTOR and their senders ask the manager (the tombstone) */
    /* sandboxes manager (beyond the reference) */
    KA_SBX_FORK,       /* ka_sbx_fork_t -> ka_sbx_list_t: the forks' records, in order */
    KA_SBX_FORK_COPY_, /* manager -> the source's actor: ka_sbx_fork_copy_t -> ka_sbx_reply_t */
    KA_SBX_CLUSTER_,   /* manager -> itself, every second in a cluster: fencing and takeover */
    KA_SBX_RELEASED_,  /* sandbox actor -> manager: empty; FAILED with no compute left: it no
                        * longer counts against its pool's capacity (sandboxes_cap.c) */
    KA_CTL_MSG_LAST_
};

/* ---- templates ---------------------------------------------------------------------------- */

typedef struct ka_tpl_apply {
    char default_namespace[KA_STORE_NS_LEN];
    uint32_t yaml_len;
    char yaml[]; /* yaml_len bytes then NUL */
} ka_tpl_apply_t;

typedef struct ka_tpl_key {
    char namespace_[KA_STORE_NS_LEN];
    char name[KA_STORE_TNAME_LEN];
} ka_tpl_key_t;

/* Reply: count template records exactly as the store returns them
 * (ka_store_template_t, iterate with ka_store_blob_next over `blob`). */
typedef struct ka_tpl_reply {
    ka_store_blob_t blob; /* must be last: its data follows */
} ka_tpl_reply_t;

typedef struct ka_tpl_runtime_req {
    char revision[KA_STORE_REV_LEN];
} ka_tpl_runtime_req_t;

typedef struct ka_tpl_resolved {
    char revision[KA_STORE_REV_LEN]; /* pinned revision hash */
    char rootfs[1024];               /* the tools image rootfs: overlay lowerdir */
    char snapshot_location[1024];    /* the template's spec.substrate.snapshotPolicy.location */
    uint32_t n_env;                  /* env of the spec, "K=V\0" x n in env */
    char env[8192];
    char pool[64]; /* the template's spec.substrate.workerPoolRef.name */
} ka_tpl_resolved_t;

/* ---- sandboxes ---------------------------------------------------------------------------- */

typedef struct ka_sbx_create {
    char caller[KA_STORE_CREATOR_LEN];
    char request_id[KA_STORE_REQID_LEN];
    char name[KA_STORE_NAME_LEN];
    char template_namespace[KA_STORE_NS_LEN];
    char template_name[KA_STORE_TNAME_LEN];
    int64_t ttl_ms; /* 0 = policy default */
    int32_t placed; /* set by the manager that placed it on another node: create it here */
} ka_sbx_create_t;

typedef struct ka_sbx_key {
    char caller[KA_STORE_CREATOR_LEN];
    char id[KA_STORE_ID_LEN];
} ka_sbx_key_t;

typedef struct ka_sbx_reply {
    ka_store_sandbox_t sandbox;
    uint8_t paused; /* 1: READY with its processes frozen (KA_SBX_PAUSE): guest calls refused */
} ka_sbx_reply_t;

/* Forks of a sandbox: at most this many in one call. */
#define KA_FORK_MAX 16

typedef struct ka_sbx_fork {
    char caller[KA_STORE_CREATOR_LEN];
    char id[KA_STORE_ID_LEN]; /* the source */
    char request_id[KA_STORE_REQID_LEN];
    int32_t count;  /* 1..KA_FORK_MAX */
    int64_t ttl_ms; /* each fork's; 0 = policy default */
} ka_sbx_fork_t;

/* The manager asks the source's actor to copy itself for the forks it recorded. */
typedef struct ka_sbx_fork_copy {
    char caller[KA_STORE_CREATOR_LEN];
    uint32_t count;
    char ids[KA_FORK_MAX][KA_STORE_ID_LEN];
} ka_sbx_fork_copy_t;

typedef struct ka_sbx_list_req {
    char caller[KA_STORE_CREATOR_LEN];
    char template_namespace[KA_STORE_NS_LEN]; /* "" = any */
    char template_name[KA_STORE_TNAME_LEN];
    int32_t limit;  /* 0..100, 0 = 100 */
    int32_t offset; /* from the page token */
} ka_sbx_list_req_t;

typedef struct ka_sbx_list {
    uint32_t count;
    int32_t more;
    ka_store_sandbox_t items[];
} ka_sbx_list_t;

/* One template revision's warm pool, as KA_SBX_COUNT reports it. */
typedef struct ka_sbx_warm_depth {
    char pool[64];
    char template_namespace[KA_STORE_NS_LEN];
    char template_name[KA_STORE_TNAME_LEN];
    char revision[KA_STORE_REV_LEN];
    uint32_t ready;   /* booted, waiting to be claimed */
    uint32_t booting; /* being started */
} ka_sbx_warm_depth_t;

#define KA_SBX_WARM_MAX 32 /* templates a count reports the depth of */

#define KA_SBX_POOLS_MAX 16 /* pools a count reports (KA_POOL_MAX_POOLS) */

/* One WorkerPool's use on this node, as KA_SBX_COUNT reports it. */
typedef struct ka_sbx_pool_use {
    char pool[64];
    uint64_t used; /* what its capacity check counts (actors/control/sandboxes_cap.c) */
} ka_sbx_pool_use_t;

typedef struct ka_sbx_count {
    uint64_t live;
    uint32_t n_pools; /* this node's pools, in its config's order */
    ka_sbx_pool_use_t pools[KA_SBX_POOLS_MAX];
    /* the warm pools (actors/control/pool.h) */
    uint64_t warm_hits;    /* creates served by a warm sandbox */
    uint64_t warm_misses;  /* creates of a revision with a warm pool that booted cold */
    uint64_t warm_refills; /* warm sandboxes booted */
    uint32_t n_warm;
    ka_sbx_warm_depth_t warm[KA_SBX_WARM_MAX];
} ka_sbx_count_t;

/* ---- guest calls -------------------------------------------------------------------------- */

enum {
    KA_GUEST_START = 1, /* tail: argv strings, then env "K=V" strings (NUL-separated) */
    KA_GUEST_GET,
    KA_GUEST_SIGNAL,
    KA_GUEST_INPUT,  /* tail: data */
    KA_GUEST_OUTPUT, /* streams: frames with data, then a final frame */
    KA_GUEST_READ,   /* streams: frames with data, then a final frame */
    KA_GUEST_WRITE,  /* tail: data */
    KA_GUEST_RESIZE, /* proc, rows, cols: a tty process's window size */
    /* the Files API (final frames: tail a ka_fs_page_t for LIST and STAT, else none) */
    KA_GUEST_LIST,   /* path, page_size; tail: the page token, NUL-terminated (or no tail) */
    KA_GUEST_STAT,   /* path */
    KA_GUEST_REMOVE, /* path, fs_flag: recursive */
    KA_GUEST_MKDIR,  /* path, mode, fs_flag: parents */
    KA_GUEST_MOVE,   /* path, fs_flag: overwrite; tail: the destination, NUL-terminated */
    KA_GUEST_WATCH   /* path; streams KA_STREAM_EVENT frames until cancelled */
};

typedef struct ka_guest_req {
    char caller[KA_STORE_CREATOR_LEN];
    char sandbox_id[KA_STORE_ID_LEN];
    int32_t op;             /* KA_GUEST_* */
    uint64_t proc;          /* GET SIGNAL INPUT OUTPUT */
    int32_t signal;         /* SIGNAL */
    int32_t stdin_open;     /* START */
    int32_t close;          /* INPUT: close stdin after data */
    int32_t follow;         /* OUTPUT; START: stream the output to the exit (one round trip) */
    uint64_t timeout_ms;    /* START: 0 = guest default */
    uint64_t stdout_offset; /* OUTPUT */
    uint64_t stderr_offset; /* OUTPUT */
    uint64_t seek_offset;   /* WRITE */
    uint32_t mode;          /* READ WRITE MKDIR */
    char cwd[1024];         /* START: "" = workspace */
    char path[1024];        /* READ WRITE and the Files API */
    int32_t tty;            /* START: on a pseudo terminal */
    uint32_t rows, cols;    /* START (tty), RESIZE: window size */
    uint32_t n_argv, n_env; /* START: string counts in tail */
    int32_t fs_flag;        /* REMOVE: recursive; MKDIR: parents; MOVE: overwrite */
    uint32_t page_size;     /* LIST: 0 = the guest default */
    uint32_t tail_len;
    char tail[];
} ka_guest_req_t;

/* A guest request shared by its stream sink (which may still have to send it to the manager)
 * and a KA_SBX_GUEST_PTR message (valid through the receiver's turn): the last to let go
 * (ka_guest_req_unref) frees it. */
typedef struct ka_guest_req_ref {
    atomic_uint refs;
    ka_guest_req_t *req;
} ka_guest_req_ref_t;

/* Flow control: the reader of a stream consumed `bytes` of its data frames' tails. */
typedef struct ka_sbx_credit {
    uint64_t bytes;
} ka_sbx_credit_t;

/* A process as the guest reports it. */
typedef struct ka_process_info {
    uint64_t proc;
    int64_t pid;
    int32_t state; /* 1 running, 2 exited */
    int32_t exit_code;
    int64_t started_ms;
    int64_t finished_ms;
} ka_process_info_t;

/* KA_STREAM_EVENT: a watch event, its tail the checked payload (ka_fsframes.h). */
enum { KA_STREAM_STDOUT = 1, KA_STREAM_STDERR = 2, KA_STREAM_FILE = 3, KA_STREAM_EVENT = 4 };

/* One reply frame. Unary ops send one final frame; OUTPUT and READ send data frames
 * (final = 0, stream and offset set, data in tail) and then one final frame (with the exit
 * process for OUTPUT if it has exited). START with follow sends a frame with has_process (not
 * final, stream 0, no tail: the process runs), then the frames of OUTPUT with follow, ending
 * with its exit. A final frame with has_process carries the process's argv in tail as
 * NUL-terminated strings. A failing frame (err) carries its message as the tail instead, at
 * most KA_MSG_LEN bytes with the NUL (ka_frame_message reads it). */
typedef struct ka_guest_reply {
    int32_t err; /* 0, or the failure: the canonical errno of its code (ka_err_canonical) */
    int32_t final;
    int32_t stream;  /* KA_STREAM_* for data frames */
    uint64_t offset; /* byte offset of this data in its stream */
    int32_t has_process;
    ka_process_info_t process;
    uint64_t written; /* INPUT WRITE: bytes written; READ final: file size */
    uint32_t tail_len;
    char tail[];
} ka_guest_reply_t;

/* ---- internal ----------------------------------------------------------------------------- */

/* The manager hands a request to a sandbox actor with the original requester, so the sandbox
 * actor answers it directly (krt_reply_to). */
typedef struct ka_sbx_forward {
    krt_addr_t from;
    uint64_t ref;
    uint32_t type; /* the original message type */
    uint32_t len;
    char body[];
} ka_sbx_forward_t;

typedef struct ka_sbx_recover {
    int32_t expired;
    int32_t offset;
} ka_sbx_recover_t;

#endif
