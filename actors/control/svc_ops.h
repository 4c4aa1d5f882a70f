/*
 * ka_svc ops: the typed service layer both bridges call (gRPC handlers in bridges/api, MCP tools
 * in bridges/mcp). One function per operation: it validates its arguments once, with the rules
 * and messages of checks.c, builds the control plane's request and decodes its reply. Bridges
 * only convert formats: protobuf/JSON -> args struct -> ka_svc_* -> typed reply -> protobuf/JSON.
 *
 * Errors are negative errnos (ka_errors.h maps them to status codes at the edge). Every op
 * returns a status: err 0 when it started (then cb runs exactly once, on a runtime thread, and
 * must not block), else a refusal (cb never runs) with a static message. Args are borrowed for
 * the duration of the call only. Replies passed to callbacks are borrowed for the callback.
 */
#ifndef KA_SVC_OPS_H
#define KA_SVC_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "service.h"

/* Who calls and how long the call may take. */
typedef struct ka_svc_caller {
    const char *id; /* the authenticated identity */
    int timeout_ms; /* 0 = KA_SVC_TIMEOUT_MS (unary control-plane calls) */
} ka_svc_caller_t;

/* ---- sandboxes ---------------------------------------------------------------------------- */

typedef struct {
    const char *request_id;         /* 1-128 characters */
    const char *name;               /* NULL or at most 200 characters */
    const char *template_namespace; /* NULL or "" = "default" */
    const char *template_name;      /* required */
    int64_t ttl_ms;                 /* 0 = the policy default; negative is refused */
} ka_svc_create_args_t;

typedef struct {
    const ka_store_sandbox_t *sandbox;
    bool paused; /* READY with its processes frozen */
} ka_svc_sandbox_t;

typedef void (*ka_svc_sandbox_cb)(void *user, const ka_svc_status_t *st, const ka_svc_sandbox_t *r);

ka_svc_status_t ka_svc_create(ka_service_t *svc, const ka_svc_caller_t *who,
                              const ka_svc_create_args_t *a, ka_svc_sandbox_cb cb, void *user);
/* Get, delete, suspend, resume, pause, unpause one sandbox by id (a UUID). */
ka_svc_status_t ka_svc_sandbox(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                               ka_svc_sandbox_cb cb, void *user);
ka_svc_status_t ka_svc_delete(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                              ka_svc_sandbox_cb cb, void *user);
ka_svc_status_t ka_svc_suspend(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                               ka_svc_sandbox_cb cb, void *user);
ka_svc_status_t ka_svc_resume(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                              ka_svc_sandbox_cb cb, void *user);
ka_svc_status_t ka_svc_pause(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                             ka_svc_sandbox_cb cb, void *user);
ka_svc_status_t ka_svc_unpause(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                               ka_svc_sandbox_cb cb, void *user);

typedef struct {
    const char *template_namespace; /* NULL or "" = any */
    const char *template_name;
    int64_t limit;          /* 0-100, 0 = 100 */
    int64_t offset;         /* >= 0; ignored when page_token is set */
    const char *page_token; /* NULL or "", else next_page_token of the previous page */
} ka_svc_list_args_t;

typedef struct {
    const ka_store_sandbox_t *items;
    uint32_t count;
    bool more;
    int64_t next_offset; /* the next page's offset (its page token in decimal) */
} ka_svc_list_t;

typedef void (*ka_svc_list_cb)(void *user, const ka_svc_status_t *st, const ka_svc_list_t *l);
ka_svc_status_t ka_svc_list(ka_service_t *svc, const ka_svc_caller_t *who,
                            const ka_svc_list_args_t *a, ka_svc_list_cb cb, void *user);

/* Fork: count (1..KA_FORK_MAX, 0 = 1) copies of a running sandbox, idempotent on request_id. The
 * reply is the forks' records in order (a list without more pages). */
typedef struct {
    const char *sandbox_id; /* a UUID the caller owns */
    const char *request_id; /* 1-128 characters */
    int64_t count;
    int64_t ttl_ms; /* 0 = the policy default; negative is refused */
} ka_svc_fork_args_t;

ka_svc_status_t ka_svc_fork(ka_service_t *svc, const ka_svc_caller_t *who,
                            const ka_svc_fork_args_t *a, ka_svc_list_cb cb, void *user);

/* ---- templates ---------------------------------------------------------------------------- */

#define KA_SVC_TPL_NS_DEFAULT "kagent" /* the template calls' namespace when none is named */

typedef struct {
    const char *namespace_; /* NULL or "" = KA_SVC_TPL_NS_DEFAULT (list: any) */
    const char *name;       /* get, delete: required; apply: NULL or "" = the document's */
} ka_svc_tpl_ref_t;

/* The store's template records (iterate with ka_store_blob_next over blob, blob_len bytes). */
typedef struct {
    const ka_store_blob_t *blob;
    size_t blob_len;
} ka_svc_templates_t;

typedef void (*ka_svc_templates_cb)(void *user, const ka_svc_status_t *st,
                                    const ka_svc_templates_t *t);
ka_svc_status_t ka_svc_template_list(ka_service_t *svc, const ka_svc_caller_t *who,
                                     const char *namespace_, ka_svc_templates_cb cb, void *user);
ka_svc_status_t ka_svc_template_get(ka_service_t *svc, const ka_svc_caller_t *who,
                                    const ka_svc_tpl_ref_t *ref, ka_svc_templates_cb cb,
                                    void *user);
ka_svc_status_t ka_svc_template_delete(ka_service_t *svc, const ka_svc_caller_t *who,
                                       const ka_svc_tpl_ref_t *ref, ka_svc_templates_cb cb,
                                       void *user);
/* doc: a SandboxTemplate as YAML (or JSON), len bytes; its metadata must match ref. */
ka_svc_status_t ka_svc_template_apply(ka_service_t *svc, const ka_svc_caller_t *who,
                                      const ka_svc_tpl_ref_t *ref, const char *doc, size_t len,
                                      ka_svc_templates_cb cb, void *user);

/* ---- processes ---------------------------------------------------------------------------- */

typedef struct {
    const char *key, *value;
} ka_svc_env_t;

typedef struct {
    const char *sandbox_id;
    const char *const *argv; /* argc strings, argv[0] non-empty */
    size_t argc;
    const ka_svc_env_t *env; /* keys non-empty without '='; argv + env at most 1 MiB */
    size_t n_env;
    const char *cwd; /* NULL or "" = the workspace; at most 1023 bytes */
    bool stdin_open;
    uint64_t timeout_ms; /* 0 = the guest's default */
} ka_svc_exec_args_t;

typedef struct {
    ka_process_info_t info;
    const char *argv; /* argv_len bytes of NUL-terminated strings (may be empty) */
    size_t argv_len;
} ka_svc_process_t;

typedef void (*ka_svc_process_cb)(void *user, const ka_svc_status_t *st, const ka_svc_process_t *p);

/* The guest request that starts a's process (argv and env in its tail), checked by
 * ka_svc_exec's rules; the caller may set more (tty, window size) and sends it with
 * ka_svc_guest_send. NULL with *st set: a refusal (-EINVAL and its message) or -ENOMEM.
 * Free with free(). */
ka_guest_req_t *ka_svc_exec_req(const ka_svc_caller_t *who, const ka_svc_exec_args_t *a,
                                ka_svc_status_t *st);
/* Starts a process; cb gets it running. */
ka_svc_status_t ka_svc_exec(ka_service_t *svc, const ka_svc_caller_t *who,
                            const ka_svc_exec_args_t *a, ka_svc_process_cb cb, void *user);
/* Starts a process and streams it to its exit in one guest round trip (the guest's start with
 * follow), with ka_svc_exec's rules and messages: a frame with has_process (not final, no
 * tail: the process runs), then data frames as ka_svc_output's, then a final frame (with the
 * exit process when the process exited). A start that fails sends only the final frame.
 * *stream (may be NULL) for ka_svc_stream_ack / _cancel; a cancelled stream leaves the process
 * running, as a cancelled output stream does. */
ka_svc_status_t ka_svc_exec_follow(ka_service_t *svc, const ka_svc_caller_t *who,
                                   const ka_svc_exec_args_t *a, ka_svc_frame_cb cb, void *user,
                                   krt_addr_t *stream);
/* Gets a process (process_id as ka_svc_exec returned it, in decimal). */
ka_svc_status_t ka_svc_process(ka_service_t *svc, const ka_svc_caller_t *who,
                               const char *sandbox_id, const char *process_id, ka_svc_process_cb cb,
                               void *user);
/* Sends signal (1-31) to a process's group. */
ka_svc_status_t ka_svc_signal(ka_service_t *svc, const ka_svc_caller_t *who, const char *sandbox_id,
                              const char *process_id, int signal, ka_svc_process_cb cb, void *user);

typedef struct {
    const char *sandbox_id, *process_id;
    int64_t stdout_offset, stderr_offset; /* >= 0 */
    bool follow;                          /* to the exit */
} ka_svc_output_args_t;

/* Streams output: frames as ka_svc_stream's (data frames, then a final frame with the exit
 * when the process exited). *stream (may be NULL) for ka_svc_stream_ack / _cancel. */
ka_svc_status_t ka_svc_output(ka_service_t *svc, const ka_svc_caller_t *who,
                              const ka_svc_output_args_t *a, ka_svc_frame_cb cb, void *user,
                              krt_addr_t *stream);

typedef void (*ka_svc_written_cb)(void *user, const ka_svc_status_t *st, uint64_t written);

typedef struct {
    const char *sandbox_id, *process_id;
    const void *data;
    size_t len;
    bool close; /* close stdin after data */
} ka_svc_input_args_t;

/* Writes a chunk to a process's stdin; cb gets the bytes written. */
ka_svc_status_t ka_svc_input(ka_service_t *svc, const ka_svc_caller_t *who,
                             const ka_svc_input_args_t *a, ka_svc_written_cb cb, void *user);
/* Sends a guest request the caller built and checked (q consumed; its caller and sandbox id
 * set), as a stream: frames as ka_svc_stream's. For the Files API, whose rules are checks_fs.c. */
ka_svc_status_t ka_svc_guest_send(ka_service_t *svc, ka_guest_req_t *q, ka_svc_frame_cb cb,
                                  void *user, krt_addr_t *stream);

/* The rules of ka_svc_input without sending (a client stream's first message). */
ka_svc_status_t ka_svc_input_check(const ka_svc_input_args_t *a);

/* ---- files -------------------------------------------------------------------------------- */

typedef struct {
    const char *sandbox_id, *path; /* path 1-1023 bytes */
    uint32_t mode;
} ka_svc_read_args_t;

/* Streams a file: data frames (stream KA_STREAM_FILE), then a final frame (written = size). */
ka_svc_status_t ka_svc_file_read(ka_service_t *svc, const ka_svc_caller_t *who,
                                 const ka_svc_read_args_t *a, ka_svc_frame_cb cb, void *user,
                                 krt_addr_t *stream);

typedef struct {
    const char *sandbox_id, *path; /* path 1-1023 bytes */
    int64_t mode;                  /* 0-07777; 0 = the guest's default */
    int64_t seek_offset;           /* >= 0; 0 truncates (the first chunk of a whole file) */
    const void *data;
    size_t len;
} ka_svc_write_args_t;

/* Writes a chunk of a file at seek_offset; cb gets the bytes written. */
ka_svc_status_t ka_svc_file_write(ka_service_t *svc, const ka_svc_caller_t *who,
                                  const ka_svc_write_args_t *a, ka_svc_written_cb cb, void *user);
/* The rules of ka_svc_file_write without sending (a client stream's first message). */
ka_svc_status_t ka_svc_file_write_check(const ka_svc_write_args_t *a);

/* Guest frame f's (len bytes) outcome as a service status (message borrowed from f). */
ka_svc_status_t ka_svc_status_of(const ka_guest_reply_t *f, size_t len);

#endif
