/*
 * kb_rpc: the CLI's small gRPC client: unary calls, server-stream readers and client-stream
 * writers of protobuf-c messages, with the CLI's metadata (x-user-id, bearer token,
 * kagent-sandbox-id) and one absolute deadline for the whole command (--timeout). It speaks
 * HTTP/2 itself (h2.h) over TCP or TLS (tls_client.h): no gRPC library is linked, so the
 * process starts fast.
 *
 * Calls are synchronous, one at a time on one connection, and meant for one thread.
 * kb_rpc_interrupt() (async-signal-safe) cancels whatever call is in flight and every later
 * one, which then fail with CANCELLED "interrupted".
 */
#ifndef KB_RPC_H
#define KB_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

#define KB_RPC_MSG_CAP 512

typedef struct kb_rpc kb_rpc_t;
typedef struct kb_rpc_call kb_rpc_call_t;

/* Connection settings; strings are copied by kb_rpc_new. */
typedef struct kb_rpc_opts {
    const char *api_url;     /* http://host:port (plaintext) or https://host:port (TLS) */
    const char *user_id;     /* sent as x-user-id when non-empty */
    const char *token;       /* sent as "authorization: Bearer <token>" when non-empty */
    const char *ca_file;     /* PEM roots for https; "" = system roots */
    const char *server_name; /* TLS server name override; "" = from the URL */
    const char *cert_file;   /* PEM client certificate for mutual TLS; "" = none */
    const char *key_file;    /* PEM key of cert_file; set together with it */
    int64_t timeout_ms;      /* whole-command budget from now; <= 0 = none */
    FILE *trace;             /* non-NULL: one line per finished call (method, status, ms) */
} kb_rpc_opts_t;

/* The status of a call to a method the server does not have (it reached no handler). */
#define KB_RPC_UNIMPLEMENTED 12

/* The outcome of a call: a gRPC status code (0 = OK) and its message. */
typedef struct kb_rpc_status {
    int code;
    char message[KB_RPC_MSG_CAP];
    bool unsent; /* the request certainly reached no handler (no connection, stream refused) */
} kb_rpc_status_t;

/* A client (connected by its first call). NULL on a bad URL, an unreadable CA, certificate or
 * key file, TLS files with an http:// URL, a certificate without its key, or https:// without
 * a loadable OpenSSL, with err set. */
kb_rpc_t *kb_rpc_new(const kb_rpc_opts_t *opts, char *err, size_t errcap);
/* Closes the connection; idempotent, NULLs *self. No call may be open. */
void kb_rpc_destroy(kb_rpc_t **self);

/* One request, one response. method is the full path ("/pkg.Service/Method"); sandbox_id, when
 * non-NULL, is sent as the single kagent-sandbox-id value. Returns 0 with *resp owned by the
 * caller (protobuf_c_message_free_unpacked), or -EIO with st holding the failure. */
int kb_rpc_unary(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 ProtobufCMessage **resp, kb_rpc_status_t *st);

/* Starts a server-streaming call with its one request. NULL on failure (st set). */
kb_rpc_call_t *kb_rpc_server_stream(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                                    const ProtobufCMessage *req, kb_rpc_status_t *st);
/* Reads the next message: 1 with *msg owned by the caller, 0 at the end of the stream (then
 * kb_rpc_call_finish gives the status), -EIO if the call failed. */
int kb_rpc_call_read(kb_rpc_call_t *call, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **msg);

/* Starts a client-streaming call. NULL on failure (st set). */
kb_rpc_call_t *kb_rpc_client_stream(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                                    kb_rpc_status_t *st);
/* Sends one message; 0, or -EPIPE when the call already failed (finish gives why). A client
 * stream may also read (bidirectional methods) with kb_rpc_call_read or kb_rpc_call_poll. */
int kb_rpc_call_write(kb_rpc_call_t *call, const ProtobufCMessage *msg);
/* The socket of the call's connection and the poll(2) events to wait for on it (POLLIN, and
 * POLLOUT while bytes are queued), to wait beside other fds; then kb_rpc_call_poll. */
int kb_rpc_call_fd(const kb_rpc_call_t *call);
short kb_rpc_call_events(const kb_rpc_call_t *call);
/* Reads without waiting (writes out what is queued, takes what has arrived): 1 with *msg
 * owned by the caller, 0 when no whole message is there yet, -ENODATA at the end of the
 * stream (kb_rpc_call_finish gives the status), -EIO if the call failed. */
int kb_rpc_call_poll(kb_rpc_call_t *call, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **msg);

/* Ends a call and reports its status. For a client stream it half-closes and, when resp_desc
 * is non-NULL, receives the response into *resp. Returns 0 if the status is OK (and, for a
 * client stream, a response arrived), else -EIO. */
int kb_rpc_call_finish(kb_rpc_call_t *call, const ProtobufCMessageDescriptor *resp_desc,
                       ProtobufCMessage **resp, kb_rpc_status_t *st);
/* Cancels the call if it is still open and frees it; idempotent, NULLs *call. */
void kb_rpc_call_destroy(kb_rpc_call_t **call);

/* Cancels the call in flight and all later calls. Safe inside a signal handler. */
void kb_rpc_interrupt(void);
/* Clears a previous kb_rpc_interrupt (tests run several commands in one process). */
void kb_rpc_reset_interrupt(void);

/* "rpc error: code = NotFound desc = <message>", as grpc-go formats a status error. */
void kb_rpc_format_error(const kb_rpc_status_t *st, char *buf, size_t cap);
/* True when a failed call may still have taken effect on the server: it was cut off (UNAVAILABLE,
 * DEADLINE_EXCEEDED, CANCELLED, a broken stream: UNKNOWN, INTERNAL, DATA_LOSS) after its request
 * may have reached the server. False for a refusal (INVALID_ARGUMENT, NOT_FOUND,
 * PERMISSION_DENIED, ...) and for a request never delivered (st->unsent), which changed
 * nothing. */
bool kb_rpc_outcome_unknown(const kb_rpc_status_t *st);

#endif
