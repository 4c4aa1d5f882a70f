/* kb_tls: the port's TLS server context (OpenSSL), reloadable while connections use it.
 *
 * Certificate chain and key from PEM files; TLS 1.2 or newer; ALPN offers "h2" (gRPC) then
 * "http/1.1". With a client CA file, client certificates are requested and verified against it
 * (a certificate that does not verify fails the handshake); with require_client_cert a client
 * without one fails it too. kb_tls_reload re-reads the same files: new handshakes use the new
 * context, established connections keep theirs; a failed reload changes nothing.
 */
#ifndef KB_TLS_H
#define KB_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <openssl/ssl.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KB_TLS_ERR_CAP 512

typedef struct {
    const char *cert_file;      /* PEM certificate chain, leaf first (required) */
    const char *key_file;       /* PEM private key of the leaf (required) */
    const char *client_ca_file; /* PEM CAs for client certificates; NULL or "" = none asked */
    bool require_client_cert;   /* with client_ca_file: refuse clients without a certificate */
} kb_tls_files_t;

typedef struct kb_tls kb_tls_t;

/* Loads the files (paths are copied). NULL on failure with err naming the file and the cause,
 * e.g. "key file /etc/k/key.pem: No such file or directory". */
kb_tls_t *kb_tls_new(const kb_tls_files_t *files, char *err, size_t errcap);
/* Re-reads the files; 0, or -EINVAL with err set (the old context stays). Thread-safe. */
int kb_tls_reload(kb_tls_t *t, char *err, size_t errcap);
/* How many times the context was (re)loaded successfully, the first load included. */
unsigned kb_tls_generation(kb_tls_t *t);
/* A new server-side SSL on the current context; NULL when out of memory. Thread-safe. */
SSL *kb_tls_ssl_new(kb_tls_t *t);
/* The identity a verified client certificate carries (its subject CN), copied into out. 0, or
 * -ENOENT (no client certificate), -EINVAL (no CN, or not 1..cap-1 visible characters). */
int kb_tls_peer_identity(SSL *ssl, char *out, size_t cap);
/* Idempotent; NULLs *t_p. SSLs already made keep their context alive. */
void kb_tls_destroy(kb_tls_t **t_p);

#ifdef __cplusplus
}
#endif
#endif
