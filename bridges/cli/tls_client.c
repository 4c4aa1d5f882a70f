/*
 * kb_tls: TLS client on a dlopen'ed OpenSSL. See tls_client.h.
 */
#include "tls_client.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define S_LIBSSL "libssl.so.3"

/* The OpenSSL functions used, typed from OpenSSL's own headers. */
#define S_FUNCS(X)                                                                                 \
    X(TLS_client_method)                                                                           \
    X(SSL_CTX_new)                                                                                 \
    X(SSL_CTX_free)                                                                                \
    X(SSL_CTX_ctrl)                                                                                \
    X(SSL_CTX_set_verify)                                                                          \
    X(SSL_CTX_set_default_verify_paths)                                                            \
    X(SSL_CTX_load_verify_locations)                                                               \
    X(SSL_CTX_use_certificate_chain_file)                                                          \
    X(SSL_CTX_use_PrivateKey_file)                                                                 \
    X(SSL_CTX_check_private_key)                                                                   \
    X(SSL_CTX_set_alpn_protos)                                                                     \
    X(SSL_new)                                                                                     \
    X(SSL_free)                                                                                    \
    X(SSL_set_fd)                                                                                  \
    X(SSL_ctrl)                                                                                    \
    X(SSL_set1_host)                                                                               \
    X(SSL_get0_param)                                                                              \
    X(X509_VERIFY_PARAM_set1_ip_asc)                                                               \
    X(SSL_connect)                                                                                 \
    X(SSL_read)                                                                                    \
    X(SSL_write)                                                                                   \
    X(SSL_pending)                                                                                 \
    X(SSL_get_error)                                                                               \
    X(SSL_get_verify_result)                                                                       \
    X(SSL_get0_alpn_selected)                                                                      \
    X(X509_verify_cert_error_string)                                                               \
    X(X509_get_default_cert_dir)                                                                   \
    X(X509_get_default_cert_dir_env)                                                               \
    X(X509_get_default_cert_file_env)                                                              \
    X(ERR_get_error)                                                                               \
    X(ERR_error_string_n)                                                                          \
    X(ERR_clear_error)

static struct {
#define S_PTR(f) __typeof__(f) *f; /* NOLINT(bugprone-macro-parentheses): a declarator */
    S_FUNCS(S_PTR)
#undef S_PTR
} s_ssl;
static bool s_loaded;

struct kb_tls {
    SSL_CTX *ctx;
    SSL *ssl;
    short want;
};

/* Binds every function once (the CLI is single-threaded). */
int kb_tls_load(char *err, size_t cap)
{
    if (s_loaded)
        return 0;
    void *lib = dlopen(S_LIBSSL, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(err, cap, "TLS needs OpenSSL: %s", dlerror());
        return -ENOENT;
    }
#define S_BIND(f)                                                                                  \
    if (!(*(void **)&s_ssl.f = dlsym(lib, #f))) {                                                  \
        snprintf(err, cap, "TLS needs OpenSSL: %s lacks %s", S_LIBSSL, #f);                        \
        return -ENOENT;                                                                            \
    }
    S_FUNCS(S_BIND)
#undef S_BIND
    s_loaded = true;
    return 0;
}

/* The newest OpenSSL error as text, after what. */
static void s_ssl_err(const char *what, char *err, size_t cap)
{
    unsigned long e = s_ssl.ERR_get_error();
    char buf[256] = "";
    if (e)
        s_ssl.ERR_error_string_n(e, buf, sizeof buf);
    snprintf(err, cap, "%s%s%s", what, e ? ": " : "", buf);
    s_ssl.ERR_clear_error();
}

static bool s_set(const char *s)
{
    return s && *s;
}

/* The system's roots, looked up by subject hash in the certificate directory as a handshake
 * needs them: loading the whole bundle file (what SSL_CTX_set_default_verify_paths does) parses
 * ~140 certificates, ~100 ms here. SSL_CERT_FILE or SSL_CERT_DIR set: OpenSSL's defaults. */
static int s_system_roots(SSL_CTX *ctx)
{
    if (getenv(s_ssl.X509_get_default_cert_file_env()) ||
        getenv(s_ssl.X509_get_default_cert_dir_env()))
        return s_ssl.SSL_CTX_set_default_verify_paths(ctx);
    if (s_ssl.SSL_CTX_load_verify_locations(ctx, NULL, s_ssl.X509_get_default_cert_dir()) == 1)
        return 1;
    s_ssl.ERR_clear_error();
    return s_ssl.SSL_CTX_set_default_verify_paths(ctx);
}

static int s_configure(kb_tls_t *t, const kb_tls_opts_t *o, char *err, size_t cap)
{
    static const unsigned char alpn[] = "\x02h2";
    SSL_CTX *ctx = t->ctx;
    s_ssl.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
    s_ssl.SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* the session's output buffer may move and grow between retries of one write */
    s_ssl.SSL_CTX_ctrl(ctx, SSL_CTRL_MODE,
                       SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER, NULL);
    if (s_set(o->ca_file) ? s_ssl.SSL_CTX_load_verify_locations(ctx, o->ca_file, NULL) != 1
                          : s_system_roots(ctx) != 1) {
        s_ssl_err(s_set(o->ca_file) ? "load --ca-file" : "load the system's CA roots", err, cap);
        return -EINVAL;
    }
    if (s_set(o->cert_file) &&
        (s_ssl.SSL_CTX_use_certificate_chain_file(ctx, o->cert_file) != 1 ||
         s_ssl.SSL_CTX_use_PrivateKey_file(ctx, o->key_file, SSL_FILETYPE_PEM) != 1 ||
         s_ssl.SSL_CTX_check_private_key(ctx) != 1)) {
        s_ssl_err("load --cert-file/--key-file", err, cap);
        return -EINVAL;
    }
    if (s_ssl.SSL_CTX_set_alpn_protos(ctx, alpn, sizeof alpn - 1) != 0 ||
        !(t->ssl = s_ssl.SSL_new(ctx))) {
        s_ssl_err("TLS setup", err, cap);
        return -ENOMEM;
    }
    unsigned char ip[16];
    bool is_ip = inet_pton(AF_INET, o->name, ip) == 1 || inet_pton(AF_INET6, o->name, ip) == 1;
    int ok = is_ip ? s_ssl.X509_VERIFY_PARAM_set1_ip_asc(s_ssl.SSL_get0_param(t->ssl), o->name)
                   : s_ssl.SSL_set1_host(t->ssl, o->name) &&
                         s_ssl.SSL_ctrl(t->ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME,
                                        TLSEXT_NAMETYPE_host_name, (void *)o->name);
    if (ok != 1) {
        s_ssl_err("TLS server name", err, cap);
        return -EINVAL;
    }
    return 0;
}

kb_tls_t *kb_tls_new(const kb_tls_opts_t *o, int fd, char *err, size_t cap)
{
    if (kb_tls_load(err, cap) != 0)
        return NULL;
    kb_tls_t *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    t->ctx = s_ssl.SSL_CTX_new(s_ssl.TLS_client_method());
    if (!t->ctx) {
        s_ssl_err("TLS setup", err, cap);
        kb_tls_destroy(&t);
        return NULL;
    }
    if (s_configure(t, o, err, cap) != 0 || s_ssl.SSL_set_fd(t->ssl, fd) != 1) {
        if (!err[0])
            s_ssl_err("TLS setup", err, cap);
        kb_tls_destroy(&t);
        return NULL;
    }
    return t;
}

void kb_tls_destroy(kb_tls_t **p)
{
    kb_tls_t *t = *p;
    if (!t)
        return;
    if (t->ssl)
        s_ssl.SSL_free(t->ssl);
    if (t->ctx)
        s_ssl.SSL_CTX_free(t->ctx);
    free(t);
    *p = NULL;
}

/* Maps the outcome of an SSL call: -EAGAIN (want set), 0 for a clean close, else -EIO. */
static int s_result(kb_tls_t *t, int rc)
{
    switch (s_ssl.SSL_get_error(t->ssl, rc)) {
    case SSL_ERROR_WANT_READ:
        t->want = POLLIN;
        return -EAGAIN;
    case SSL_ERROR_WANT_WRITE:
        t->want = POLLOUT;
        return -EAGAIN;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL:
        s_ssl.ERR_clear_error();
        return rc == 0 ? 0 : errno == ECONNRESET ? -ECONNRESET : -EIO;
    default:
        s_ssl.ERR_clear_error();
        return -EIO;
    }
}

int kb_tls_handshake(kb_tls_t *t, char *err, size_t cap)
{
    int rc = s_ssl.SSL_connect(t->ssl);
    if (rc == 1) {
        const unsigned char *proto = NULL;
        unsigned len = 0;
        s_ssl.SSL_get0_alpn_selected(t->ssl, &proto, &len);
        if (len == 2 && memcmp(proto, "h2", 2) == 0)
            return 0;
        snprintf(err, cap, "the server did not agree to HTTP/2 (ALPN h2)");
        return -EPROTO;
    }
    int e = s_ssl.SSL_get_error(t->ssl, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        t->want = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return -EAGAIN;
    }
    long v = s_ssl.SSL_get_verify_result(t->ssl);
    if (v != X509_V_OK) {
        snprintf(err, cap, "TLS handshake failed: certificate verify failed: %s",
                 s_ssl.X509_verify_cert_error_string(v));
        s_ssl.ERR_clear_error();
    } else if (e == SSL_ERROR_SYSCALL && s_ssl.ERR_get_error() == 0) {
        snprintf(err, cap, "TLS handshake failed: %s",
                 rc == 0 || errno == 0 ? "connection closed" : strerror(errno));
    } else {
        s_ssl_err("TLS handshake failed", err, cap);
    }
    return -EPROTO;
}

ssize_t kb_tls_read(kb_tls_t *t, void *buf, size_t n)
{
    int len = n > INT32_MAX ? INT32_MAX : (int)n;
    int rc = s_ssl.SSL_read(t->ssl, buf, len);
    return rc > 0 ? rc : s_result(t, rc);
}

ssize_t kb_tls_write(kb_tls_t *t, const void *buf, size_t n)
{
    int len = n > INT32_MAX ? INT32_MAX : (int)n;
    int rc = s_ssl.SSL_write(t->ssl, buf, len);
    if (rc > 0)
        return rc;
    rc = s_result(t, rc);
    return rc == 0 ? -EIO : rc;
}

short kb_tls_want(const kb_tls_t *t)
{
    return t->want;
}

size_t kb_tls_pending(const kb_tls_t *t)
{
    int n = s_ssl.SSL_pending(t->ssl);
    return n > 0 ? (size_t)n : 0;
}
