/* kb_tls: OpenSSL server context, built from files and swapped under a lock. See tls.h. */
#include "tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509.h>

struct kb_tls {
    char *cert_file, *key_file, *client_ca_file;
    bool require_client_cert;
    pthread_mutex_t mu;
    SSL_CTX *ctx; /* current; an SSL made from it holds its own reference */
    unsigned generation;
};

/* ALPN protocols in the server's order of preference (wire format). */
static const unsigned char S_ALPN[] = "\x02h2\x08http/1.1";

static int s_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                         const unsigned char *in, unsigned int inlen, void *arg)
{
    unsigned char *sel = NULL;
    if (SSL_select_next_proto(&sel, outlen, S_ALPN, sizeof S_ALPN - 1, in, inlen) !=
        OPENSSL_NPN_NEGOTIATED)
        return SSL_TLSEXT_ERR_NOACK; /* no common protocol: go on without ALPN (HTTP/1.1) */
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

/* "<what> <path>: <cause>", the cause from errno (fopen) or from OpenSSL's error queue. */
static int s_file_err(char *err, size_t cap, const char *what, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, cap, "%s %s: %s", what, path, strerror(errno));
    } else {
        fclose(f);
        unsigned long e = ERR_peek_error(); /* the first error is the cause */
        const char *why = e ? ERR_reason_error_string(e) : NULL;
        snprintf(err, cap, "%s %s: cannot be used (%s)", what, path, why ? why : "not valid PEM");
    }
    ERR_clear_error();
    return -EINVAL;
}

static int s_mismatch(const kb_tls_t *t, char *err, size_t cap)
{
    snprintf(err, cap, "key file %s: does not match certificate file %s", t->key_file,
             t->cert_file);
    return -EINVAL;
}

static int s_client_ca(const kb_tls_t *t, SSL_CTX *ctx, char *err, size_t cap)
{
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(t->client_ca_file);
    if (!names || !SSL_CTX_load_verify_locations(ctx, t->client_ca_file, NULL)) {
        sk_X509_NAME_pop_free(names, X509_NAME_free);
        return s_file_err(err, cap, "client CA file", t->client_ca_file);
    }
    SSL_CTX_set_client_CA_list(ctx, names);
    int mode = SSL_VERIFY_PEER | (t->require_client_cert ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0);
    SSL_CTX_set_verify(ctx, mode, NULL);
    static const unsigned char sid[] = "kagent";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof sid - 1);
    return 0;
}

static SSL_CTX *s_build(const kb_tls_t *t, char *err, size_t cap)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, cap, "cannot create a TLS context (out of memory?)");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_alpn_select_cb(ctx, s_alpn_select, NULL);
    int rc = 0;
    if (SSL_CTX_use_certificate_chain_file(ctx, t->cert_file) != 1)
        rc = s_file_err(err, cap, "certificate file", t->cert_file);
    else if (SSL_CTX_use_PrivateKey_file(ctx, t->key_file, SSL_FILETYPE_PEM) != 1)
        rc = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH
                 ? s_mismatch(t, err, cap)
                 : s_file_err(err, cap, "key file", t->key_file);
    else if (SSL_CTX_check_private_key(ctx) != 1)
        rc = s_mismatch(t, err, cap);
    else if (t->client_ca_file)
        rc = s_client_ca(t, ctx, err, cap);
    ERR_clear_error();
    if (rc) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

kb_tls_t *kb_tls_new(const kb_tls_files_t *files, char *err, size_t errcap)
{
    if (!files || !files->cert_file || !*files->cert_file || !files->key_file ||
        !*files->key_file) {
        snprintf(err, errcap, "a certificate file and a key file are both required");
        return NULL;
    }
    kb_tls_t *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->cert_file = strdup(files->cert_file);
    t->key_file = strdup(files->key_file);
    bool ca = files->client_ca_file && *files->client_ca_file;
    t->client_ca_file = ca ? strdup(files->client_ca_file) : NULL;
    t->require_client_cert = ca && files->require_client_cert;
    if (!t->cert_file || !t->key_file || (ca && !t->client_ca_file)) {
        snprintf(err, errcap, "out of memory");
        kb_tls_destroy(&t);
        return NULL;
    }
    if (kb_tls_reload(t, err, errcap))
        kb_tls_destroy(&t);
    return t;
}

int kb_tls_reload(kb_tls_t *t, char *err, size_t errcap)
{
    SSL_CTX *ctx = s_build(t, err, errcap);
    if (!ctx)
        return -EINVAL;
    pthread_mutex_lock(&t->mu);
    SSL_CTX *old = t->ctx;
    t->ctx = ctx;
    t->generation++;
    pthread_mutex_unlock(&t->mu);
    SSL_CTX_free(old);
    return 0;
}

unsigned kb_tls_generation(kb_tls_t *t)
{
    pthread_mutex_lock(&t->mu);
    unsigned g = t->generation;
    pthread_mutex_unlock(&t->mu);
    return g;
}

SSL *kb_tls_ssl_new(kb_tls_t *t)
{
    pthread_mutex_lock(&t->mu);
    SSL *ssl = SSL_new(t->ctx);
    pthread_mutex_unlock(&t->mu);
    return ssl;
}

int kb_tls_peer_identity(SSL *ssl, char *out, size_t cap)
{
    X509 *cert = SSL_get0_peer_certificate(ssl);
    if (!cert || SSL_get_verify_result(ssl) != X509_V_OK)
        return -ENOENT;
    X509_NAME *name = X509_get_subject_name(cert);
    int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
    if (i < 0)
        return -EINVAL;
    unsigned char *cn = NULL;
    int n = ASN1_STRING_to_UTF8(&cn, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i)));
    int rc = n > 0 && (size_t)n < cap ? 0 : -EINVAL;
    for (int k = 0; !rc && k < n; k++)
        if (cn[k] < 0x21 || cn[k] == 0x7f)
            rc = -EINVAL;
    if (!rc) {
        memcpy(out, cn, (size_t)n);
        out[n] = '\0';
    }
    OPENSSL_free(cn);
    return rc;
}

void kb_tls_destroy(kb_tls_t **t_p)
{
    kb_tls_t *t = t_p ? *t_p : NULL;
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    pthread_mutex_destroy(&t->mu);
    free(t->cert_file);
    free(t->key_file);
    free(t->client_ca_file);
    free(t);
    *t_p = NULL;
}
