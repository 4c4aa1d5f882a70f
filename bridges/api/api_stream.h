/*
 * kb_api_stream: a guest stream forwarded to a gRPC server stream (ReadFile,
 * StreamProcessOutput and Exec in api_guest.c, WatchFiles in api_files.c).
 *
 * Frames go out one send at a time; a queue absorbs what arrives while a send is in flight,
 * and each data frame's bytes go back as credit once gRPC core has taken them
 * (ka_svc_stream_ack), so the queue never holds more than the stream's window: a client that
 * does not read stalls its own stream, end to end. A failed send or a cancel asks the guest to
 * stop; the final frame's status ends the call once every kept frame before it went out.
 *
 * The state belongs to its gRPC call (kb_grpc_call_on_free frees it once every callback of the
 * call has returned), so a cancel racing the final frame finds it alive and answered. The end
 * is decided under the state's lock and sent once it is released: completing a call may
 * release it at once.
 */
#ifndef KB_API_STREAM_H
#define KB_API_STREAM_H

#include "api_int.h"

typedef struct kb_api_stream kb_api_stream_t;

/* What one kind of stream sends. */
typedef struct {
    /* Whether frame f is sent (a final frame is sent only if keep says so; the others are
     * dropped). */
    bool (*keep)(const ka_guest_reply_t *f);
    /* Sends f as the call's next message: kb_grpc_stream_send(call, msg, sent, arg)'s result. */
    int (*send)(kb_grpc_call_t *call, const ka_guest_reply_t *f, kb_grpc_sent_fn sent, void *arg);
} kb_api_stream_ops_t;

/* Starts the guest stream with kb_api_stream_frame and s as its frame callback, storing its
 * address in *stream; a refusal's status otherwise (the callback will not run). arg is
 * kb_api_stream_open's. */
typedef ka_svc_status_t (*kb_api_stream_start_fn)(kb_api_stream_t *s, void *arg,
                                                  krt_addr_t *stream);

/* Forwards the stream that start opens to the server-stream call. Every failure answers the
 * call (a refused start with its status). */
void kb_api_stream_open(kb_api_t *api, kb_grpc_call_t *call, const kb_api_stream_ops_t *ops,
                        kb_api_stream_start_fn start, void *arg);

/* The frame callback of the guest stream (ka_svc_frame_cb; user: the kb_api_stream_t). */
void kb_api_stream_frame(void *user, const ka_guest_reply_t *f, size_t len);

#endif
