/* kb_api internals shared by the service files (one per proto service). */
#ifndef KB_API_INT_H
#define KB_API_INT_H

#include "api.h"
#include "images.h"
#include "sandboxes.h"
#include "kagent/api/v1/sandbox_templates.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"
#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/runtime/v1/runtime.pb-c.h"

struct kb_api {
    kb_api_options_t o;
    ka_images_t *images_ro; /* listing only; the images actor does every change */
};

#define KB_API_SANDBOX_ID_KEY "kagent-sandbox-id"
#define KB_API_MAX_FILE       (64u << 20)

/* Identifies the caller into out; on failure answers UNAUTHENTICATED and returns -1. */
int kb_api_caller(kb_api_t *api, kb_grpc_call_t *call, char *out, size_t cap);
/* Identity, then exactly one kagent-sandbox-id holding a UUID; on failure answers and
 * returns -1. */
int kb_api_guest_target(kb_api_t *api, kb_grpc_call_t *call, char *caller, size_t ccap, char *id,
                        size_t icap);
/* Answers a call with a control-plane status. */
void kb_api_fail(kb_grpc_call_t *call, const ka_status_t *st);

/* Timestamps from Unix milliseconds. */
void kb_api_ts(Google__Protobuf__Timestamp *ts, int64_t ms);

/* The method tables of each service file. */
extern const kb_grpc_method_t kb_api_sandbox_methods[];
extern const size_t kb_api_sandbox_n;
extern const kb_grpc_method_t kb_api_template_methods[];
extern const size_t kb_api_template_n;
extern const kb_grpc_method_t kb_api_guest_methods[];
extern const size_t kb_api_guest_n;
extern const kb_grpc_method_t kb_api_runtime_methods[];
extern const size_t kb_api_runtime_n;
extern const kb_grpc_method_t kb_api_files_methods[];
extern const size_t kb_api_files_n;

#endif
