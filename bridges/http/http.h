/* kb_http: the HTTP/1.1 side of the shared port, on libmicrohttpd without a listening socket
 * (connections arrive from kb_listener through kb_http_add_connection).
 *
 * Built-in routes: GET /healthz -> 200 "ok"; GET /readyz -> 200 or 503 from a readiness
 * callback; GET /metrics -> Prometheus text exposition filled by a callback. Other routes are
 * registered with kb_http_route (e.g. POST/GET/DELETE /mcp with SSE streaming responses).
 * Unknown paths answer 404, a known path with a wrong method 405 with an Allow header.
 *
 * Threading: libmicrohttpd runs one thread per connection; route handlers run there and may
 * block briefly. A streaming response (kb_http_respond_stream) is fed from ANY thread; a client
 * hanging up on an idle stream is noticed within about a second (kb_http_stream_on_gone).
 */
#ifndef KB_HTTP_H
#define KB_HTTP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KB_HTTP_DEFAULT_MAX_BODY ((size_t)4 << 20)

/* Method bits for kb_http_route. */
enum {
    KB_HTTP_GET = 1 << 0,
    KB_HTTP_POST = 1 << 1,
    KB_HTTP_DELETE = 1 << 2,
    KB_HTTP_PUT = 1 << 3,
    KB_HTTP_HEAD = 1 << 4,
};

typedef struct kb_http kb_http_t;
typedef struct kb_http_req kb_http_req_t;
typedef struct kb_http_stream kb_http_stream_t;
typedef struct kb_http_buf kb_http_buf_t;

/* Appends printf-formatted text to a metrics buffer. 0 or -ENOMEM. */
int kb_http_buf_printf(kb_http_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The host part of "host[:port]" (IPv6 in brackets): its length. */
size_t kb_http_host_part(const char *h);

/* A Host header value ("host[:port]", IPv6 in brackets) matches an entry of allowed
 * (NULL-terminated): "*", "host" (any port) or "host:port", case-insensitive. */
bool kb_http_host_allowed(const char *const *allowed, const char *value);

/* The value of cookie `name` in a Cookie header (may be NULL) copied to out: 0, or -ENOENT
 * (absent or longer than cap - 1). */
int kb_http_cookie(const char *header, const char *name, char *out, size_t cap);

/* Readiness: true when the node can take work. */
typedef bool (*kb_http_ready_fn)(void *arg);
/* Metrics: appends Prometheus text exposition to buf. A negative return answers 500. */
typedef int (*kb_http_metrics_fn)(kb_http_buf_t *buf, void *arg);
/* A route handler, called once the whole request body arrived. It must answer with exactly one
 * of kb_http_respond or kb_http_respond_stream before returning (otherwise: 500). */
typedef void (*kb_http_handler_fn)(kb_http_req_t *req, void *arg);

typedef struct {
    kb_http_ready_fn ready;     /* NULL: always ready */
    kb_http_metrics_fn metrics; /* NULL: an empty exposition */
    void *arg;                  /* passed to ready and metrics */
    size_t max_body;            /* request body cap; 0 = KB_HTTP_DEFAULT_MAX_BODY (413 above) */
    int connection_timeout_s;   /* idle connection timeout; 0 = 60 */
} kb_http_options_t;

/* Starts the daemon (no listening socket). NULL on failure. */
kb_http_t *kb_http_new(const kb_http_options_t *opts);
/* Registers path (exact match) for the methods in mask. Before connections arrive.
 * 0, -EEXIST (path registered), -EINVAL, -ENOMEM. */
int kb_http_route(kb_http_t *h, const char *path, unsigned methods, kb_http_handler_fn fn,
                  void *arg);
/* Hands a connected socket to the server (ownership passes, also on failure). 0 or -EIO. */
int kb_http_add_connection(kb_http_t *h, int fd, const struct sockaddr *peer, socklen_t len);
/* Ends every stream, stops the daemon and its connection threads, frees everything. Streams
 * still held by producers stay valid (writes fail with -EPIPE) until kb_http_stream_close.
 * Idempotent. */
void kb_http_destroy(kb_http_t **h_p);
/* Requests answered so far. */
uint64_t kb_http_requests(kb_http_t *h);

/* --- inside a handler (req is valid until the handler returns) --- */

const char *kb_http_req_method(const kb_http_req_t *req);
const char *kb_http_req_path(const kb_http_req_t *req);
/* A request header (case-insensitive name) or NULL. Borrowed. */
const char *kb_http_req_header(const kb_http_req_t *req, const char *name);
/* The socket of the request's connection (the one kb_http_add_connection got), or -1. */
int kb_http_req_conn_fd(const kb_http_req_t *req);
/* The request body (borrowed, NUL-terminated for convenience) and its length. */
const char *kb_http_req_body(const kb_http_req_t *req, size_t *len);
/* Adds a response header for the coming respond call. 0 or -ENOMEM. */
int kb_http_req_add_header(kb_http_req_t *req, const char *name, const char *value);
/* Answers with a complete body (copied). content_type may be NULL. 0, -EALREADY, -ENOMEM. */
int kb_http_respond(kb_http_req_t *req, unsigned status, const char *content_type, const void *body,
                    size_t len);
/* Answers with a body streamed by chunked encoding. *out is the producer's handle: write with
 * kb_http_stream_write from any thread, end with kb_http_stream_close. 0, -EALREADY, -ENOMEM. */
int kb_http_respond_stream(kb_http_req_t *req, unsigned status, const char *content_type,
                           kb_http_stream_t **out);

/* Queues bytes (copied). 0, -EPIPE (client gone or server stopping), -ENOMEM. */
int kb_http_stream_write(kb_http_stream_t *s, const void *data, size_t len);
/* True once the client went away or the server is stopping. */
bool kb_http_stream_closed(kb_http_stream_t *s);
/* Called once when the response ends for any reason (body done, client gone, server
 * stopping), on a libmicrohttpd thread; must not block and must not close the stream.
 * 0, or -EPIPE when that already happened (fn is then not registered and never runs). */
typedef void (*kb_http_gone_fn)(kb_http_stream_t *s, void *arg);
int kb_http_stream_on_gone(kb_http_stream_t *s, kb_http_gone_fn fn, void *arg);
/* Ends the body after the queued bytes and releases the producer's handle. Idempotent. */
void kb_http_stream_close(kb_http_stream_t **s_p);

#ifdef __cplusplus
}
#endif
#endif
