/* kb_grpc: a gRPC server on gRPC C core with protobuf-c messages and a method table dispatched
 * by path ("/kagent.api.v1.SandboxService/CreateSandbox").
 *
 * Threading: one completion-queue thread runs every callback in this header (handlers,
 * on_message, on_end, send-done and cancel callbacks). Callbacks must not block. The completion
 * functions (kb_grpc_reply, kb_grpc_fail, kb_grpc_stream_send, kb_grpc_finish) may be called
 * from ANY thread, including from inside a callback.
 *
 * Call ownership: a handler that is given a call owns one hold on it and must release it by
 * completing the call EXACTLY ONCE with kb_grpc_reply, kb_grpc_fail or kb_grpc_finish, even
 * after the call was cancelled (the answer then goes nowhere). The call handle stays valid
 * until then; after it, only a send-done callback of a send already in flight may still see it.
 * kb_grpc_server_destroy cancels every call and waits until every handler has completed its
 * calls, so handlers must react to cancellation (on_cancel, on_end with an error, a failed send).
 */
#ifndef KB_GRPC_SERVER_H
#define KB_GRPC_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Default per-message receive cap: 4 MiB of payload plus 64 KiB of framing and fields. */
#define KB_GRPC_DEFAULT_MAX_RECV ((size_t)(4u << 20) + (64u << 10))
/* Default per-message send cap. */
#define KB_GRPC_DEFAULT_MAX_SEND ((size_t)(4u << 20) + (64u << 10))

/* gRPC status codes (same numbers as grpc_status_code). */
typedef enum {
    KB_GRPC_OK = 0,
    KB_GRPC_CANCELLED = 1,
    KB_GRPC_UNKNOWN = 2,
    KB_GRPC_INVALID_ARGUMENT = 3,
    KB_GRPC_DEADLINE_EXCEEDED = 4,
    KB_GRPC_NOT_FOUND = 5,
    KB_GRPC_ALREADY_EXISTS = 6,
    KB_GRPC_PERMISSION_DENIED = 7,
    KB_GRPC_RESOURCE_EXHAUSTED = 8,
    KB_GRPC_FAILED_PRECONDITION = 9,
    KB_GRPC_ABORTED = 10,
    KB_GRPC_OUT_OF_RANGE = 11,
    KB_GRPC_UNIMPLEMENTED = 12,
    KB_GRPC_INTERNAL = 13,
    KB_GRPC_UNAVAILABLE = 14,
    KB_GRPC_DATA_LOSS = 15,
    KB_GRPC_UNAUTHENTICATED = 16,
} kb_grpc_code_t;

/* Method shapes. BIDI behaves like CLIENT_STREAM on the receive side and may also stream
 * responses with kb_grpc_stream_send (used by server reflection). */
typedef enum {
    KB_GRPC_UNARY,
    KB_GRPC_SERVER_STREAM,
    KB_GRPC_CLIENT_STREAM,
    KB_GRPC_BIDI_STREAM,
} kb_grpc_kind_t;

typedef struct kb_grpc_server kb_grpc_server_t;
typedef struct kb_grpc_call kb_grpc_call_t;

/* Unary and server-streaming: called once with the decoded request (borrowed; valid until the
 * call is completed). Client-streaming and bidi: called once at call start with req == NULL;
 * the messages then arrive through on_message. */
typedef void (*kb_grpc_handler_fn)(kb_grpc_call_t *call, const ProtobufCMessage *req, void *user);
/* Client-streaming: one decoded message; the callee owns msg (protobuf_c_message_free_unpacked).
 * The next message is read after this returns. */
typedef void (*kb_grpc_message_fn)(kb_grpc_call_t *call, ProtobufCMessage *msg, void *user);
/* Client-streaming: the stream ended. status 0: the client half-closed normally;
 * -ECANCELED: the client went away or the deadline passed; -EBADMSG: a message could not be
 * decoded (the server already answered INVALID_ARGUMENT). Called at most once, never after
 * the handler completed the call. The handler must still complete the call. A client's
 * cancellation looks like a clean end of stream to gRPC core until its close arrives; the end
 * is held back ~30 ms to tell them apart, and a cancellation later than that still fires the
 * on_cancel callback. */
typedef void (*kb_grpc_end_fn)(kb_grpc_call_t *call, int status, void *user);
/* A stream send finished: status 0 when the message was handed to the transport, -ECANCELED
 * when the client went away. */
typedef void (*kb_grpc_sent_fn)(kb_grpc_call_t *call, int status, void *arg);
/* The call was cancelled (client cancel, deadline, server shutdown). Fires at most once. */
typedef void (*kb_grpc_cancel_fn)(kb_grpc_call_t *call, void *arg);

/* One entry of the method table. The strings and descriptors must outlive the server. */
typedef struct {
    const char *path;                          /* "/pkg.Service/Method" */
    kb_grpc_kind_t kind;                       /* shape of the method */
    const ProtobufCMessageDescriptor *request; /* how requests are decoded */
    kb_grpc_handler_fn handler;                /* required */
    kb_grpc_message_fn on_message;             /* client-streaming and bidi only */
    kb_grpc_end_fn on_end;                     /* client-streaming and bidi only */
    void *user;                                /* passed to the three callbacks */
} kb_grpc_method_t;

typedef struct {
    const char
        *listen_addr;      /* "host:port" to bind, or NULL (fds come from kb_grpc_server_add_fd) */
    size_t max_recv_bytes; /* per received message; 0 = KB_GRPC_DEFAULT_MAX_RECV */
    size_t max_send_bytes; /* per sent message; 0 = KB_GRPC_DEFAULT_MAX_SEND */
} kb_grpc_options_t;

/* Counters since start (monotonic, read without stopping the server). */
typedef struct {
    uint64_t calls_started;   /* calls received, any method */
    uint64_t calls_completed; /* calls whose resources were released */
    uint64_t calls_cancelled; /* calls the client cancelled or that hit their deadline */
    uint64_t unimplemented;   /* calls to unknown methods */
    uint64_t bad_requests;    /* undecodable messages */
    uint64_t calls_live;      /* started - completed */
} kb_grpc_stats_t;

/* Creates a server (not yet serving). opts may be NULL. NULL on failure. */
kb_grpc_server_t *kb_grpc_server_new(const kb_grpc_options_t *opts);
/* Adds methods (the table is copied; the strings are not). Before kb_grpc_server_start only.
 * 0, -EEXIST for a duplicate path, -EINVAL for a bad entry, -EBUSY once started. */
int kb_grpc_server_add_methods(kb_grpc_server_t *srv, const kb_grpc_method_t *methods, size_t n);
/* Binds listen_addr (if any) and starts the completion-queue thread. 0, -EADDRINUSE when the
 * address cannot be bound (SO_REUSEPORT is off), -EALREADY, -ENOMEM. */
int kb_grpc_server_start(kb_grpc_server_t *srv);
/* The port bound for listen_addr (useful with ":0"), or 0. */
int kb_grpc_server_port(const kb_grpc_server_t *srv);
/* Hands a connected socket speaking HTTP/2 to the server, which takes ownership of fd (also on
 * failure). After start only. 0 or -EINVAL. */
int kb_grpc_server_add_fd(kb_grpc_server_t *srv, int fd);
/* Snapshot of the counters. */
void kb_grpc_server_stats(kb_grpc_server_t *srv, kb_grpc_stats_t *out);
/* Stops accepting, cancels every in-flight call, waits until every handler has completed its
 * calls, frees everything. Must not be called from a server callback. Idempotent. */
void kb_grpc_server_destroy(kb_grpc_server_t **srv_p);

/* --- call accessors (valid while the caller holds the call) --- */

/* The method path (borrowed). */
const char *kb_grpc_call_method(const kb_grpc_call_t *call);
/* Number of request-metadata entries with this key (keys are lower case). */
size_t kb_grpc_call_metadata_count(const kb_grpc_call_t *call, const char *key);
/* The i-th value of key (borrowed, not NUL-terminated). 0 or -ENOENT. */
int kb_grpc_call_metadata_at(const kb_grpc_call_t *call, const char *key, size_t i,
                             const char **value, size_t *len);
/* Exactly one value of key as a NUL-terminated copy the caller frees. 0, -ENOENT (absent),
 * -EMLINK (given more than once), -EINVAL (contains a NUL byte), -ENOMEM. */
int kb_grpc_call_metadata_one(const kb_grpc_call_t *call, const char *key, char **out);
/* Milliseconds left before the client's deadline (0 when passed), or -1 if there is none. */
int64_t kb_grpc_call_timeout_ms(const kb_grpc_call_t *call);
/* The client's address as "ipv4:127.0.0.1:4242" (caller frees), or NULL. */
char *kb_grpc_call_peer(const kb_grpc_call_t *call);
/* One pointer of handler state. */
void kb_grpc_call_set_data(kb_grpc_call_t *call, void *data);
void *kb_grpc_call_data(const kb_grpc_call_t *call);
/* Runs fn(arg) once, on whichever thread releases the call last: after the handler completed
 * it and every callback of the call (on_message, on_end, send-done, cancel) has returned, so
 * state that those callbacks use may be freed there. Replaces an earlier one. */
void kb_grpc_call_on_free(kb_grpc_call_t *call, void (*fn)(void *arg), void *arg);
/* An extra reference: the call (and so the on_free state) stays valid until the matching
 * unref, even if another thread completes it meanwhile. Take it only while the call is surely
 * valid (in one of its callbacks, or before the handler completes it); the unref may run the
 * on_free function, so the caller must not hold a lock that function takes. */
void kb_grpc_call_ref(kb_grpc_call_t *call);
void kb_grpc_call_unref(kb_grpc_call_t *call);
/* Registers the cancellation callback (replacing an earlier one). 0, or -ECANCELED when the
 * call is already cancelled (fn is then not registered and never runs). */
int kb_grpc_call_on_cancel(kb_grpc_call_t *call, kb_grpc_cancel_fn fn, void *arg);
/* Client-streaming flow control: called from on_message, the next message is not read (the
 * HTTP/2 window then stops the client) until kb_grpc_call_resume_recv, which may be called
 * from any thread (also before on_message returned). If the stream broke meanwhile, resume
 * delivers on_end(-ECANCELED) on the calling thread. */
void kb_grpc_call_pause_recv(kb_grpc_call_t *call);
void kb_grpc_call_resume_recv(kb_grpc_call_t *call);
/* True once the call was cancelled or a send to the client failed. */
bool kb_grpc_call_is_cancelled(kb_grpc_call_t *call);

/* --- completion (any thread) --- */

/* Unary or client-streaming: sends msg and status OK; completes the call. 0, -ECANCELED (the
 * call was already cancelled or answered), -EMSGSIZE (msg over max_send_bytes: INTERNAL sent
 * instead), -EINVAL (msg NULL or wrong method kind: INTERNAL sent). Completes in every case. */
int kb_grpc_reply(kb_grpc_call_t *call, const ProtobufCMessage *msg);
/* Any kind: sends status code with message (NULL = ""); completes the call. 0 or -ECANCELED. */
int kb_grpc_fail(kb_grpc_call_t *call, kb_grpc_code_t code, const char *message);
/* Server-streaming or bidi: sends one message. One send may be in flight at a time; done_cb
 * (may be NULL) runs on the server thread when it finished. msg is encoded before this
 * returns. 0, -EBUSY (a send is in flight), -ECANCELED (call cancelled: done_cb never runs),
 * -EMSGSIZE, -EINVAL (wrong kind or call already finished). */
int kb_grpc_stream_send(kb_grpc_call_t *call, const ProtobufCMessage *msg, kb_grpc_sent_fn done_cb,
                        void *arg);
/* Ends a streaming call with a status; a send in flight completes first. Same as kb_grpc_fail. */
int kb_grpc_finish(kb_grpc_call_t *call, kb_grpc_code_t code, const char *message);

/* Name of a status code ("UNIMPLEMENTED"). */
const char *kb_grpc_code_name(kb_grpc_code_t code);

#ifdef __cplusplus
}
#endif
#endif
