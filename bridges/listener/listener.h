/* kb_listener: one TCP port for gRPC (HTTP/2) and HTTP/1.1.
 *
 * A thread accepts connections and peeks (MSG_PEEK, nothing is consumed) at the first bytes of
 * each: the HTTP/2 client preface "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" hands the socket to
 * on_grpc, anything else to on_http. Slow clients never block the accept loop: undecided
 * connections wait in a poll set and are closed when they send nothing decisive within
 * peek_timeout_ms. The listener knows neither gRPC nor libmicrohttpd; the caller wires them in
 * (kb_grpc_server_add_fd, kb_http_add_connection).
 *
 * Wiring, as tests/integration/grpc/kb_test_server.c does it:
 *     static void to_grpc(int fd, const struct sockaddr *p, socklen_t n, void *app)
 *     { kb_grpc_server_add_fd(((app_t *)app)->grpc, fd); }
 *     static void to_http(int fd, const struct sockaddr *p, socklen_t n, void *app)
 *     { kb_http_add_connection(((app_t *)app)->http, fd, p, n); }
 *     grpc: kb_grpc_server_new(NULL) (no listen_addr), add methods, kb_grpc_server_start;
 *     http: kb_http_new(&opts), kb_http_route(...);
 *     then kb_listener_new(&(kb_listener_options_t){.port = 8083, .on_grpc = to_grpc,
 *                                                   .on_http = to_http, .arg = app}, &err).
 * Shutdown order: kb_listener_destroy, kb_grpc_server_destroy, kb_http_destroy, then whatever
 * the handlers use.
 *
 * TLS (options.tls set): every connection must open with a TLS handshake (anything else is
 * closed when the handshake fails or times out). The listener's thread terminates TLS with
 * non-blocking OpenSSL in one epoll loop and relays the plaintext over a socketpair, whose other
 * end is what on_grpc (ALPN "h2") or on_http (ALPN "http/1.1", or none) receive. Each relayed
 * connection holds two fixed KB_LISTENER_TLS_BUF buffers; a side whose peer does not drain is
 * not read (backpressure), and at most max_tls connections exist at once. A verified client
 * certificate's identity (its subject CN) is recorded in options.ids for the handed-over socket
 * and forgotten when the connection ends.
 */
#ifndef KB_LISTENER_H
#define KB_LISTENER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "conn_ids.h"
#include "tls.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KB_LISTENER_DEFAULT_PEEK_MS     5000
#define KB_LISTENER_DEFAULT_MAX_PEEKING 1024
#define KB_LISTENER_DEFAULT_MAX_TLS     1024
#define KB_LISTENER_TLS_BUF             16384 /* bytes per direction per TLS connection */

/* Takes ownership of fd (a connected, non-blocking socket whose bytes are all still unread).
 * Runs on the listener thread: must not block. */
typedef void (*kb_listener_fd_fn)(int fd, const struct sockaddr *peer, socklen_t peer_len,
                                  void *arg);

typedef struct {
    const char *host;          /* address to bind; NULL = "127.0.0.1" */
    int port;                  /* 0 = an ephemeral port (see kb_listener_port) */
    int peek_timeout_ms;       /* 0 = KB_LISTENER_DEFAULT_PEEK_MS */
    int max_peeking;           /* undecided connections kept at once; 0 = default */
    kb_tls_t *tls;             /* borrowed, outlives the listener; NULL = cleartext */
    int max_tls;               /* TLS connections (handshaking or relayed); 0 = default */
    kb_conn_ids_t *ids;        /* borrowed: client identities; NULL = not recorded */
    kb_listener_fd_fn on_grpc; /* HTTP/2 preface seen */
    kb_listener_fd_fn on_http; /* anything else */
    void *arg;                 /* passed to both */
} kb_listener_options_t;

/* Counters since start. */
typedef struct {
    uint64_t accepted, to_grpc, to_http, timed_out, closed_early, refused;
    uint64_t tls_failed; /* handshakes that failed (plaintext, bad client certificate, ...) */
    uint64_t tls_live;   /* TLS connections open now */
} kb_listener_stats_t;

typedef struct kb_listener kb_listener_t;

/* Binds, listens and starts the accept thread. NULL on failure with *err set: -EADDRINUSE
 * (port taken; logged with the address), -EINVAL (bad host or options), -errno otherwise. */
kb_listener_t *kb_listener_new(const kb_listener_options_t *opts, int *err);
/* The bound port. */
int kb_listener_port(const kb_listener_t *l);
/* Snapshot of the counters. */
void kb_listener_stats(kb_listener_t *l, kb_listener_stats_t *out);
/* Stops the thread, closes the listening socket and every undecided connection. Connections
 * already handed over are not touched. Idempotent. */
void kb_listener_destroy(kb_listener_t **l_p);

/* Classifies the first bytes of a connection: 1 = HTTP/2 preface, 0 = something else,
 * -EAGAIN = a prefix of the preface (need more bytes). */
int kb_listener_classify(const void *bytes, size_t len);

#ifdef __cplusplus
}
#endif
#endif
