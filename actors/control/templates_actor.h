/*
 * ka_templates: the templates actor (registered KA_TEMPLATES_NAME).
 *
 * Applies SandboxTemplate documents: validates them (template_doc), stores the template, makes
 * the immutable revision (SHA-256 of the canonical spec + pool class + operator policy),
 * prepares it (tools image present, verified and unpacked; guest image present) and publishes
 * the Ready condition with the reference's reasons and messages. A failed preparation keeps the
 * last good revision; deleting a template retires its preparation and never touches sandboxes.
 * Also resolves what a new sandbox pins (KA_TPL_RESOLVE) and a pinned revision's runtime
 * (KA_TPL_RUNTIME). Message bodies: control_msgs.h.
 */
#ifndef KA_TEMPLATES_ACTOR_H
#define KA_TEMPLATES_ACTOR_H

#include <stdint.h>

#include "krt.h"

#define KA_POLICY_MAX_POOLS 16

/* Operator policy: part of every revision's identity. */
typedef struct ka_policy {
    char guest_image_digest[80]; /* sha256:<64 hex> */
    int64_t cpu_millis;
    int64_t memory_bytes;
    int64_t default_ttl_ms;
    int64_t max_ttl_ms;
    struct {
        char name[64];
        char klass[64];
    } pools[KA_POLICY_MAX_POOLS];
    size_t n_pools;
} ka_policy_t;

/* Spawn argument: must stay valid until init ran (after the spawn call returns); copied there. */
typedef struct ka_templates_args {
    const char *store;  /* registered names of the peers (static strings), resolved at each */
    const char *images; /* send: KA_STORE_NAME, KA_IMAGES_NAME in a node */
    ka_policy_t policy;
} ka_templates_args_t;

extern const krt_behaviour_t ka_templates_behaviour;

/* The Ready condition's reasons and messages (reference section 4.1). */
#define KA_READY_PREPARING     "Preparing"
#define KA_READY_PREPARING_MSG "Waiting for the prepared sandbox snapshot"
#define KA_READY_PREPARED      "Prepared"
#define KA_READY_PREPARED_MSG  "Sandbox runtime is prepared"
#define KA_READY_FAILED        "PreparationFailed"
#define KA_READY_FAILED_MSG                                                                        \
    "Sandbox preparation failed; inspect controller logs and template configuration"
#define KA_READY_NO_POOL     "WorkerPoolNotFound"
#define KA_READY_NO_POOL_MSG "The referenced sandbox WorkerPool does not exist"

#endif
