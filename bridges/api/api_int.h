/* kb_api internals shared by the service files (one per proto service). */
#ifndef KB_API_INT_H
#define KB_API_INT_H

#include "api.h"
#include "images.h"
#include "sandboxes.h"
#include "svc_ops.h"
#include "kagent/api/v1/sandbox_templates.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"
#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/runtime/v1/runtime.pb-c.h"
#include "kagent/api/v1/terminal.pb-c.h"
#include "kagent/api/v1/process.pb-c.h"

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
/* Answers a call with a service status (its errno through ka_errors' table). */
void kb_api_fail_err(kb_grpc_call_t *call, const ka_svc_status_t *st);
/* The call's deadline as a service timeout (ms, at most KA_SVC_TIMEOUT_MS). */
int kb_api_timeout(kb_grpc_call_t *call);

/* req as exec arguments for sandbox (borrowing req's strings); *env is owned (free it, also
 * after a failure, which is only -ENOMEM). */
ka_svc_status_t kb_api_exec_args(const Ateenv__V1alpha__StartProcessRequest *req,
                                 const char *sandbox, ka_svc_exec_args_t *a, ka_svc_env_t **env);
/* The guest request that starts req's process (ka_svc_exec_req: StartProcess's checks). NULL
 * with *why set for an invalid request (INVALID_ARGUMENT), or with *why NULL when out of
 * memory. Free with free(). */
ka_guest_req_t *kb_api_start_req(const Ateenv__V1alpha__StartProcessRequest *req,
                                 const char *caller, const char *sandbox, const char **why);
/* A Process message built from a process (a frame's: {f->process, f->tail, f->tail_len}); its
 * argv array is owned (free it), the strings point into sp->argv. */
typedef struct kb_api_process {
    Ateenv__V1alpha__Process p;
    Google__Protobuf__Timestamp started, finished;
    char id[24];
    char **argv;
} kb_api_process_t;
void kb_api_process(kb_api_process_t *out, const ka_svc_process_t *sp);
/* A process id as StartProcess returns it (decimal, > 0): 0, or -1 when s is not one. */
int kb_api_proc_id(const char *s, uint64_t *out);
/* The message for an invalid process id. */
#define KB_API_MSG_PROC_ID "process_id must be the decimal id a process start returned"

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
extern const kb_grpc_method_t kb_api_terminal_methods[];
extern const size_t kb_api_terminal_n;
extern const kb_grpc_method_t kb_api_files_methods[];
extern const size_t kb_api_files_n;

#endif
