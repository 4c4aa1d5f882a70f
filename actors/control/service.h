/*
 * ka_service: the one service layer both bridges (gRPC and MCP) call. It turns a request
 * into a message to the right control-plane actor and hands the reply back through a callback,
 * so bridges never duplicate behaviour: validation, ownership, states and messages all live in
 * the actors. Request and reply bodies are the structs of control_msgs.h.
 *
 * Callbacks run on runtime threads, exactly once per call (for streams: once per frame, the
 * last frame with final = 1); they must not block.
 */
#ifndef KA_SERVICE_H
#define KA_SERVICE_H

#include <stddef.h>

#include "control_msgs.h"
#include "krt.h"

typedef struct ka_service ka_service_t;

/* Default time a unary call may take before it fails with DEADLINE_EXCEEDED. */
#define KA_SVC_TIMEOUT_MS 120000

/* NULL on failure. templates and sandboxes are the registered names of those actors (static
 * strings: KA_TEMPLATES_NAME, KA_SANDBOXES_NAME in a node), looked up at each request so a
 * restarted actor is found; while one is down its requests fail UNAVAILABLE. */
ka_service_t *ka_service_new(krt_system_t *sys, const char *templates, const char *sandboxes);
/* Idempotent; NULLs *svc_p. Streams still open are cancelled. */
void ka_service_destroy(ka_service_t **svc_p);
krt_system_t *ka_service_system(ka_service_t *svc);

/* A call's outcome: err 0, or a negative errno (ka_errors.h maps it to a status code) and
 * its message. */
typedef struct ka_svc_status {
    int err;             /* 0 or a negative errno */
    const char *message; /* NULL when err is 0; borrowed (static for refusals) */
} ka_svc_status_t;

/* A unary reply: st its outcome (an actor's error reply, or the runtime's failure as
 * UNAVAILABLE or DEADLINE_EXCEEDED); body/len the success reply (NULL/0 on failure). */
typedef void (*ka_svc_cb)(void *user, const ka_svc_status_t *st, const void *body, size_t len);

/* Sends a KA_TPL_* or KA_SBX_* request (not KA_SBX_GUEST streams). 0, or a negative code and
 * the callback never runs. timeout_ms 0 = KA_SVC_TIMEOUT_MS. */
int ka_svc_call(ka_service_t *svc, uint32_t type, const void *body, size_t len, int timeout_ms,
                ka_svc_cb cb, void *user);
/* Blocking form for threads that may block (libmicrohttpd connection threads, tests).
 * *reply receives the reply (free with krt_reply_free): the success struct, or an actor's
 * error reply (its message the body); returns the status code (ka_code_t): KA_OK, the error
 * reply's, or KA_UNAVAILABLE / KA_DEADLINE_EXCEEDED with *reply empty when no actor answered. */
int ka_svc_call_sync(ka_service_t *svc, uint32_t type, const void *body, size_t len, int timeout_ms,
                     krt_reply_t *reply);

/* How long a guest call may wait for the sandbox's actor to take it. */
#define KA_SVC_BIND_MS 15000

/* A guest call whose reply is frames (OUTPUT, READ), or any guest call. on_frame gets each
 * frame; the last has final = 1 and carries the status.
 *
 * Flow control: a stream's data frames stop once KA_GP_WINDOW bytes of their tails are
 * outstanding; the reader returns each frame's tail_len with ka_svc_stream_ack once it has
 * passed the bytes on (sent them to its client), and the guest sends that much more. A reader
 * that never acks holds at most one window. Every call ends: with its final frame, or
 * UNAVAILABLE when the sandbox's actor goes away or never takes the call, or
 * DEADLINE_EXCEEDED when the guest stops answering (see actors/substrate/README.md). */
typedef void (*ka_svc_frame_cb)(void *user, const ka_guest_reply_t *frame, size_t len);
/* Consumes *req_p (NULLs it, also on failure): the stream holds the request itself, no copy. */
int ka_svc_stream(ka_service_t *svc, ka_guest_req_t **req_p, ka_svc_frame_cb cb, void *user,
                  krt_addr_t *stream);
/* Ends a stream early: the callback gets one final CANCELLED frame unless the final frame was
 * already delivered. Safe to call at any time, also after the end (then it does nothing). */
void ka_svc_stream_cancel(ka_service_t *svc, krt_addr_t stream);
/* The reader consumed `bytes` of data (tail_len of data frames) of stream. Any thread. */
void ka_svc_stream_ack(ka_service_t *svc, krt_addr_t stream, uint64_t bytes);

/* Builds a guest request with a tail of `tail_len` bytes (zeroed). Free with free(). */
ka_guest_req_t *ka_guest_req_new(const char *caller, const char *sandbox_id, int op,
                                 size_t tail_len);
/* Drops one reference of a ka_guest_req_ref_t (void *: a krt_send_ptr free function); the
 * last frees the request and the reference. */
void ka_guest_req_unref(void *ref);

#endif
