/*
 * kb_api: the gRPC services of the public API, on the kb_grpc server: kagent.api.v1
 * SandboxService and SandboxTemplateService, ateenv.v1alpha ProcessService and
 * FileSystemService, kagent.runtime.v1 RuntimeService.
 *
 * A translation layer only: each handler identifies the caller (kb_auth), turns the protobuf
 * request into a control-plane request (actors/control/service.h), and the reply back into
 * protobuf with the control plane's status code and message. Guest calls are authorized and
 * routed by exactly one `kagent-sandbox-id` metadata value before anything else happens.
 */
#ifndef KB_API_H
#define KB_API_H

#include <jansson.h>

#include "auth.h"
#include "grpc_server.h"
#include "krt.h"
#include "service.h"

typedef struct kb_api kb_api_t;

typedef struct kb_api_pool {
    const char *name;
    const char *klass;
    int64_t capacity;
} kb_api_pool_t;

typedef struct kb_api_options {
    ka_service_t *svc;     /* required */
    const kb_auth_t *auth; /* required */
    const char *images;    /* the images actor's registered name (import, rm) */
    const char *state_dir; /* the node's state dir (image listing, import spool) */
    const kb_api_pool_t *pools;
    size_t n_pools;
} kb_api_options_t;

/* NULL on failure. Everything in opts is borrowed and must outlive the api. */
kb_api_t *kb_api_new(const kb_api_options_t *opts);
/* Adds every method to srv (before kb_grpc_server_start). 0 or a negative errno. */
int kb_api_register(kb_api_t *api, kb_grpc_server_t *srv);
/* After the server is destroyed. Idempotent; NULLs *api_p. */
void kb_api_destroy(kb_api_t **api_p);

/* The actor tree from root (KRT_ADDR_NONE: the whole node) as caller may see it: an operator
 * (kb_auth_is_operator) all of it, anyone else without the sandbox actors (and their children)
 * of other identities. A new reference (krt_tree_json's array), or NULL if it cannot be read. */
json_t *kb_api_visible_tree(krt_system_t *sys, krt_addr_t root, const kb_auth_t *auth,
                            const char *caller);

/* Maps a control-plane code to gRPC's (the same numbers, checked). */
kb_grpc_code_t kb_api_code(int ka_code);

#endif
