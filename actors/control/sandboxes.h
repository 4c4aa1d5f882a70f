/*
 * ka_sandboxes: the sandboxes manager (registered KA_SANDBOXES_NAME) and one actor per live
 * sandbox on this node.
 *
 * The manager validates creates, resolves the template's prepared revision, persists the
 * record idempotently on (creator, request_id), and spawns the sandbox's actor, which boots its
 * compute and answers. Each sandbox actor is registered under its name (ka_sandbox_name:
 * "sandbox/<id>"), and the service layer sends the calls for one sandbox (get, lifecycle, guest)
 * straight there. The manager gets them only when no actor holds the name: it forwards them to
 * an actor it knows (one just spawned), or answers from the store (deleted, unknown), or hands
 * them to the node serving the sandbox (sandboxes_cluster.c); lists read the store. At start
 * (in a cluster: once the node holds its lease) the manager recovers every live record of this
 * node:
 * expired ones are deleted, suspended ones get their TTL re-armed, and live ones, whose compute is
 * gone, come back SUSPENDED with reason ComputeLost and their /data kept where it was (a resume
 * boots them on it; one still being created is FAILED): a node crash loses no /data.
 *
 * A sandbox actor owns: the record, one TTL timer (expiry deletes through the normal path,
 * suspended sandboxes too), the compute (a ka_driver sandbox) and the guest connection. Its
 * lifecycle is one state machine (sandbox.c: a transition table for every request and event):
 * it refuses guest calls unless READY and unexpired, answers another creator NOT_FOUND, refuses
 * a conflicting mutation while one runs (ABORTED), and lets delete supersede anything.
 *
 * A fork (KA_SBX_FORK) is a create of `count` sandboxes of the source's revision, recorded
 * idempotently on (caller, a request id derived from the caller's and the fork's index), then
 * copied by the source's actor (frozen meanwhile) and booted on their copies; the caller gets
 * the forks' records once each is READY or FAILED. A replay gets the same records.
 */
#ifndef KA_SANDBOXES_H
#define KA_SANDBOXES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control_msgs.h"
#include "ka_driver.h"
#include "krt.h"
#include "membership.h"
#include "pool.h"

/* Spawn argument of the manager: must stay valid until its init ran (init runs after the spawn
 * call returns) and is copied there; the driver is borrowed and must outlive the actor. */
typedef struct ka_sandboxes_args {
    const char *store;     /* registered names of the peers (static strings), resolved at */
    const char *templates; /* each send: KA_STORE_NAME, KA_TEMPLATES_NAME in a node */
    ka_driver_t *driver;
    char node[KA_STORE_NODE_LEN]; /* this node's name, recorded on its sandboxes */
    int64_t default_ttl_ms;
    int64_t max_ttl_ms;
    uint32_t guest_idle_ms; /* a guest call with no frame for this long fails; 0: 120 s */
    ka_warm_cfg_t warm[KA_POOL_MAX_POOLS]; /* the WorkerPools' warm pools (pool.h) */
    size_t n_warm;
    char warm_dir[KA_POOL_DIR_MAX]; /* markers of warm sandbox ids; "" none */
    uint32_t warm_quiet_ms;         /* 0: KA_POOL_QUIET_MS */
    ka_membership_status_t *member; /* the node's membership (NULL: a node alone, no cluster):
                                       placement, calls for other nodes' sandboxes, takeover of
                                       lapsed nodes' sandboxes, fencing */
} ka_sandboxes_args_t;

extern const krt_behaviour_t ka_sandboxes_behaviour;

/* How a sandbox actor starts. */
typedef enum {
    KA_SBX_BOOT,  /* a fresh create: start compute, then answer the creator */
    KA_SBX_ADOPT, /* a record recovered at node start: no compute; re-arm the TTL */
    KA_SBX_WARM,  /* a warm sandbox claimed (pool.h): compute runs, the record is READY */
} ka_sbx_mode_t;

/* Spawn argument of a sandbox actor: malloc'd by the spawner, taken (copied and freed) by init. */
typedef struct ka_sandbox_args {
    ka_sbx_mode_t mode;
    ka_store_sandbox_t record;
    ka_tpl_resolved_t runtime; /* BOOT: the pinned revision's runtime */
    const char *store;         /* registered names, as in ka_sandboxes_args_t */
    const char *templates;
    ka_driver_t *driver;
    krt_addr_t reply_to; /* BOOT: the creator's request, answered when READY or FAILED */
    uint64_t reply_ref;
    uint32_t guest_idle_ms; /* see ka_sandboxes_args_t */
    ka_sandbox_t *compute;  /* WARM: its running compute, taken by the actor */
    bool fork; /* BOOT on the /data and root changes its source's fork copy kept for it */
    ka_membership_status_t *member; /* as in ka_sandboxes_args_t: no write unless a member */
} ka_sandbox_args_t;

extern const krt_behaviour_t ka_sandbox_behaviour;

/* Failure reasons recorded on sandboxes. */
#define KA_FAIL_START        "StartFailed"
#define KA_FAIL_COMPUTE_LOST "ComputeLost"
#define KA_FAIL_GUEST_EXITED "GuestExited"
#define KA_FAIL_GUEST_PROTO  "GuestProtocolViolation"
#define KA_FAIL_RESUME       "ResumeFailed"
#define KA_FAIL_SUSPEND      "SuspendFailed"
#define KA_FAIL_NODE_LOST    "NodeLost"

/* 0 if s is a canonical lowercase/uppercase hex UUID (8-4-4-4-12). */
int ka_check_uuid(const char *s);

/* The sandbox id of a call for one sandbox (KA_SBX_GUEST: a ka_guest_req_t; KA_SBX_GET,
 * _SUSPEND, _RESUME, _PAUSE, _UNPAUSE, _DELETE, _GUEST_CANCEL: a ka_sbx_key_t) and *caller, both
 * borrowed from body; NULL if the body is malformed. Neither is checked further. */
const char *ka_sbx_target(uint32_t type, const void *body, size_t len, const char **caller);

/* Answers a get (to, ref, type) from the store's reply to KA_STORE_SANDBOX_GET or _DELETE
 * (err: the request failed; then msg may be NULL): the record (paused when `paused` and it is
 * READY), or the store's error (NOT_FOUND with KA_MSG_NOT_FOUND). The manager and a sandbox's
 * actor answer alike. */
void ka_sbx_answer_read(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int err,
                        const krt_msg_t *msg, bool paused);

#endif
