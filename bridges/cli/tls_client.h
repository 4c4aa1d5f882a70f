/*
 * kb_tls: the CLI's TLS client on OpenSSL, loaded with dlopen only when an https:// URL is
 * used, so that a plaintext command pays nothing for it (libssl and libcrypto cost ~2 ms of
 * start-up here). TLS 1.2 or later, ALPN "h2", the server's certificate checked against the
 * roots and the host name (or IP address), optionally a client certificate.
 *
 * The socket is non-blocking; every operation that would block returns -EAGAIN and
 * kb_tls_want() says whether it waits to read (POLLIN) or to write (POLLOUT).
 */
#ifndef KB_TLS_CLIENT_H
#define KB_TLS_CLIENT_H

#include <stddef.h>
#include <sys/types.h>

typedef struct kb_tls kb_tls_t;

typedef struct kb_tls_opts {
    const char *ca_file;   /* PEM roots; "" or NULL = the system's */
    const char *cert_file; /* client certificate chain (PEM); "" or NULL = none */
    const char *key_file;  /* its key */
    const char *name;      /* host name or IP address the certificate must match (and SNI) */
} kb_tls_opts_t;

/* Loads OpenSSL (once): 0, or -ENOENT with err set. */
int kb_tls_load(char *err, size_t cap);
/* Loads OpenSSL and prepares a client for fd. NULL with err set (library missing, unreadable
 * or bad certificate or key). */
kb_tls_t *kb_tls_new(const kb_tls_opts_t *o, int fd, char *err, size_t cap);
void kb_tls_destroy(kb_tls_t **self);
/* Advances the handshake: 0 when done (and "h2" was agreed), -EAGAIN, or -EPROTO with err set
 * (certificate refused, no h2, ...). */
int kb_tls_handshake(kb_tls_t *t, char *err, size_t cap);
/* Like read(2)/write(2): bytes moved, 0 at the end of the stream (read), -EAGAIN, or -EIO /
 * -ECONNRESET. */
ssize_t kb_tls_read(kb_tls_t *t, void *buf, size_t n);
ssize_t kb_tls_write(kb_tls_t *t, const void *buf, size_t n);
/* POLLIN or POLLOUT: what the last -EAGAIN waits for. */
short kb_tls_want(const kb_tls_t *t);
/* Decrypted bytes ready without reading the socket. */
size_t kb_tls_pending(const kb_tls_t *t);

#endif
