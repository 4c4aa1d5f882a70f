/* Unit tests for kb_listener's TLS side (relay.c, tls.c, conn_ids.c): ALPN routing, plaintext
 * refused, handshake timeout, backpressure without loss, client certificates, reload. The
 * certificates come from deploy/gen-test-certs.sh (openssl) at test time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "conn_ids.h"
#include "listener.h"
#include "tls.h"

static char s_dir[64]; /* certificates: ca, server, server2, alice; other/ca, other/mallory */

static void s_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", s_dir, name);
}

static int s_gen_all(void **state)
{
    strcpy(s_dir, "/tmp/kb-tls-unit.XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "set -e; g=%s; d=%s; $g ca $d; $g server $d server; $g server $d server2; "
             "$g client $d alice alice@example.com; $g ca $d/other; "
             "$g client $d/other mallory alice@example.com",
             KB_GEN_CERTS, s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int s_rm_all(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- fixture: a TLS listener whose callbacks record the handed-over sockets --------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fds[16];
    char kind[16]; /* 'g' or 'h' */
    int n;
    kb_tls_t *tls;
    kb_conn_ids_t *ids;
    kb_listener_t *l;
    char cert[128], key[128], ca[128];
} fx_t;

static void s_record(fx_t *f, int fd, char kind)
{
    pthread_mutex_lock(&f->mu);
    if (f->n < 16) {
        f->fds[f->n] = fd;
        f->kind[f->n++] = kind;
    } else {
        close(fd);
    }
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void s_on_grpc(int fd, const struct sockaddr *p, socklen_t n, void *arg)
{
    s_record(arg, fd, 'g');
}

static void s_on_http(int fd, const struct sockaddr *p, socklen_t n, void *arg)
{
    s_record(arg, fd, 'h');
}

static int s_wait_n(fx_t *f, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 3;
    pthread_mutex_lock(&f->mu);
    while (f->n < n && pthread_cond_timedwait(&f->cv, &f->mu, &ts) == 0)
        ;
    int got = f->n;
    pthread_mutex_unlock(&f->mu);
    return got;
}

static fx_t *s_fx(bool client_ca)
{
    fx_t *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    s_path(f->cert, sizeof f->cert, "server.pem");
    s_path(f->key, sizeof f->key, "server.key");
    s_path(f->ca, sizeof f->ca, "ca.pem");
    char err[KB_TLS_ERR_CAP];
    kb_tls_files_t files = {f->cert, f->key, client_ca ? f->ca : NULL, false};
    f->tls = kb_tls_new(&files, err, sizeof err);
    assert_non_null(f->tls);
    f->ids = kb_conn_ids_new();
    kb_listener_options_t o = {.port = 0,
                               .peek_timeout_ms = 400,
                               .on_grpc = s_on_grpc,
                               .on_http = s_on_http,
                               .arg = f,
                               .tls = f->tls,
                               .ids = f->ids};
    int e = 0;
    f->l = kb_listener_new(&o, &e);
    assert_non_null(f->l);
    return f;
}

static int s_setup(void **state)
{
    *state = s_fx(false);
    return 0;
}

static int s_setup_mtls(void **state)
{
    *state = s_fx(true);
    return 0;
}

static int s_teardown(void **state)
{
    fx_t *f = *state;
    kb_listener_destroy(&f->l);
    for (int i = 0; i < f->n; i++)
        close(f->fds[i]);
    kb_conn_ids_destroy(&f->ids);
    kb_tls_destroy(&f->tls);
    free(f);
    return 0;
}

/* ---- a blocking TLS client ---------------------------------------------------------------- */

typedef struct {
    int fd;
    SSL_CTX *ctx;
    SSL *ssl;
} cli_t;

static int s_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Connects and handshakes: 1 on success, 0 if the handshake failed. alpn in wire format or
 * NULL; client names a cert/key pair under s_dir ("alice", "other/mallory") or NULL. */
static int s_tls_connect(cli_t *c, int port, const char *alpn, const char *client)
{
    char path[160], key[160];
    c->ctx = SSL_CTX_new(TLS_client_method());
    s_path(path, sizeof path, "ca.pem");
    assert_int_equal(SSL_CTX_load_verify_locations(c->ctx, path, NULL), 1);
    SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
    if (client) {
        snprintf(path, sizeof path, "%s/%s.pem", s_dir, client);
        snprintf(key, sizeof key, "%s/%s.key", s_dir, client);
        assert_int_equal(SSL_CTX_use_certificate_file(c->ctx, path, SSL_FILETYPE_PEM), 1);
        assert_int_equal(SSL_CTX_use_PrivateKey_file(c->ctx, key, SSL_FILETYPE_PEM), 1);
    }
    c->fd = s_connect(port);
    c->ssl = SSL_new(c->ctx);
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_tlsext_host_name(c->ssl, "localhost");
    if (alpn)
        SSL_set_alpn_protos(c->ssl, (const unsigned char *)alpn, (unsigned)strlen(alpn));
    int ok = SSL_connect(c->ssl) == 1;
    /* TLS 1.3: a refused client certificate shows at the first read */
    if (ok && client) {
        struct timeval tv = {.tv_usec = 300000};
        setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char b;
        ok = !(SSL_read(c->ssl, &b, 1) <= 0 && SSL_get_error(c->ssl, -1) != SSL_ERROR_WANT_READ &&
               errno != EAGAIN);
        tv.tv_usec = 0;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    ERR_clear_error();
    return ok;
}

static void s_tls_close(cli_t *c)
{
    SSL_free(c->ssl);
    SSL_CTX_free(c->ctx);
    close(c->fd);
}

static ssize_t s_read_timeout(int fd, void *buf, size_t n, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) != 1)
        return -ETIMEDOUT;
    return read(fd, buf, n);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_alpn_routes_and_relays(void **state)
{
    fx_t *f = *state;
    int port = kb_listener_port(f->l);
    const char *alpns[] = {"\x02h2", "\x08http/1.1", NULL, "\x02h2\x08http/1.1"};
    const char want[] = {'g', 'h', 'h', 'g'};
    for (int i = 0; i < 4; i++) {
        cli_t c;
        assert_int_equal(s_tls_connect(&c, port, alpns[i], NULL), 1);
        assert_int_equal(SSL_write(c.ssl, "hello", 5), 5);
        assert_int_equal(s_wait_n(f, i + 1), i + 1);
        assert_int_equal(f->kind[i], want[i]);
        char buf[16];
        assert_int_equal(s_read_timeout(f->fds[i], buf, sizeof buf, 2000), 5);
        assert_memory_equal(buf, "hello", 5);
        assert_int_equal(write(f->fds[i], "world!", 6), 6);
        assert_int_equal(SSL_read(c.ssl, buf, sizeof buf), 6);
        assert_memory_equal(buf, "world!", 6);
        /* the client's end reaches the app as EOF */
        SSL_shutdown(c.ssl);
        assert_int_equal(s_read_timeout(f->fds[i], buf, sizeof buf, 2000), 0);
        s_tls_close(&c);
    }
}

static void test_plaintext_refused(void **state)
{
    fx_t *f = *state;
    int fd = s_connect(kb_listener_port(f->l));
    const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
    char buf[256];
    ssize_t n = s_read_timeout(fd, buf, sizeof buf - 1, 2000);
    if (n < 0) /* closed with our request unread: a reset */
        assert_int_equal(errno, ECONNRESET);
    buf[n > 0 ? n : 0] = '\0'; /* closed, at most an alert */
    assert_null(strstr(buf, "HTTP/"));
    close(fd);
    assert_int_equal(s_wait_n(f, 1), 0);
    kb_listener_stats_t st;
    kb_listener_stats(f->l, &st);
    assert_int_equal(st.tls_failed, 1);
}

static void test_silent_client_times_out(void **state)
{
    fx_t *f = *state;
    int fd = s_connect(kb_listener_port(f->l));
    char b;
    assert_int_equal(s_read_timeout(fd, &b, 1, 3000), 0); /* closed after peek_timeout_ms */
    close(fd);
    kb_listener_stats_t st;
    kb_listener_stats(f->l, &st);
    assert_int_equal(st.timed_out, 1);
    assert_int_equal(st.tls_live, 0);
}

/* An app that does not read stops the relay reading the client: the client's writes block
 * after a bounded amount (kernel buffers plus two relay buffers); nothing is lost. */
static void test_backpressure(void **state)
{
    fx_t *f = *state;
    cli_t c;
    assert_int_equal(s_tls_connect(&c, kb_listener_port(f->l), "\x08http/1.1", NULL), 1);
    static char chunk[16384];
    memset(chunk, 'x', sizeof chunk);
    fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) | O_NONBLOCK);
    size_t sent = 0;
    for (int idle = 0; idle < 20 && sent < (256u << 20);) {
        int w = SSL_write(c.ssl, chunk, sizeof chunk);
        if (w > 0) {
            sent += (size_t)w;
            idle = 0;
        } else {
            assert_int_equal(SSL_get_error(c.ssl, w), SSL_ERROR_WANT_WRITE);
            struct pollfd p = {.fd = c.fd, .events = POLLOUT};
            idle += poll(&p, 1, 50) == 0;
        }
    }
    print_message("client wrote %zu KiB before blocking\n", sent >> 10);
    assert_true(sent < (64u << 20));
    assert_int_equal(s_wait_n(f, 1), 1);
    /* drain: the blocked write completes, everything arrives, nothing else does */
    int app = f->fds[0];
    size_t got = 0;
    char buf[65536];
    for (int w = -1; w <= 0;) {
        ssize_t n = s_read_timeout(app, buf, sizeof buf, 10);
        got += n > 0 ? (size_t)n : 0;
        w = SSL_write(c.ssl, chunk, sizeof chunk); /* the same buffer, as OpenSSL requires */
        if (w > 0)
            sent += (size_t)w;
        else
            assert_int_equal(SSL_get_error(c.ssl, w), SSL_ERROR_WANT_WRITE);
    }
    while (got < sent) {
        ssize_t n = s_read_timeout(app, buf, sizeof buf, 2000);
        assert_true(n > 0);
        size_t same = 0;
        while (same < (size_t)n && buf[same] == 'x')
            same++;
        assert_int_equal(same, (size_t)n);
        got += (size_t)n;
    }
    assert_int_equal(got, sent);
    fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) & ~O_NONBLOCK);
    assert_int_equal(SSL_write(c.ssl, "y", 1), 1);
    assert_int_equal(s_read_timeout(app, buf, 1, 2000), 1);
    assert_int_equal(buf[0], 'y');
    s_tls_close(&c);
}

static void test_client_certificates(void **state)
{
    fx_t *f = *state;
    int port = kb_listener_port(f->l);
    char id[256];
    cli_t c;
    assert_int_equal(s_tls_connect(&c, port, "\x02h2", "alice"), 1);
    assert_int_equal(s_wait_n(f, 1), 1);
    assert_int_equal(kb_conn_ids_get(f->ids, f->fds[0], id, sizeof id), 0);
    assert_string_equal(id, "alice@example.com");
    assert_int_equal(kb_conn_ids_get(f->ids, f->fds[0], id, 5), -ENOENT); /* too small */
    s_tls_close(&c);
    /* the identity is forgotten when the connection ends */
    for (int i = 0; i < 100 && kb_conn_ids_get(f->ids, f->fds[0], id, sizeof id) == 0; i++)
        usleep(20000);
    assert_int_equal(kb_conn_ids_get(f->ids, f->fds[0], id, sizeof id), -ENOENT);

    cli_t anon; /* no certificate: allowed (requireClientCert off), no identity */
    assert_int_equal(s_tls_connect(&anon, port, "\x02h2", NULL), 1);
    assert_int_equal(s_wait_n(f, 2), 2);
    assert_int_equal(kb_conn_ids_get(f->ids, f->fds[1], id, sizeof id), -ENOENT);
    s_tls_close(&anon);

    cli_t bad; /* a certificate from another CA, same CN: refused at the handshake */
    assert_int_equal(s_tls_connect(&bad, port, "\x02h2", "other/mallory"), 0);
    s_tls_close(&bad);
    assert_int_equal(s_wait_n(f, 3), 2);
    kb_listener_stats_t st;
    kb_listener_stats(f->l, &st);
    assert_int_equal(st.tls_failed, 1);
}

static char *s_served_serial(int port)
{
    cli_t c;
    assert_int_equal(s_tls_connect(&c, port, NULL, NULL), 1);
    X509 *cert = SSL_get1_peer_certificate(c.ssl);
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), NULL);
    char *hex = BN_bn2hex(bn);
    char *out = strdup(hex);
    OPENSSL_free(hex);
    BN_free(bn);
    X509_free(cert);
    s_tls_close(&c);
    return out;
}

static void test_reload(void **state)
{
    fx_t *f = *state;
    int port = kb_listener_port(f->l);
    char *before = s_served_serial(port);
    char cert[160], key[160], cmd[1024];
    assert_int_equal(kb_tls_generation(f->tls), 1);
    /* a broken file: refused, nothing changes */
    snprintf(cmd, sizeof cmd, "cp %s %s.orig && cp %s %s.orig && echo junk > %s", f->cert, f->cert,
             f->key, f->key, f->cert);
    assert_int_equal(system(cmd), 0);
    char err[KB_TLS_ERR_CAP];
    assert_int_equal(kb_tls_reload(f->tls, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, f->cert));
    assert_int_equal(kb_tls_generation(f->tls), 1);
    char *same = s_served_serial(port);
    assert_string_equal(before, same);
    /* the second certificate in place: new connections get it */
    s_path(cert, sizeof cert, "server2.pem");
    s_path(key, sizeof key, "server2.key");
    snprintf(cmd, sizeof cmd, "cp %s %s && cp %s %s", cert, f->cert, key, f->key);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(kb_tls_reload(f->tls, err, sizeof err), 0);
    assert_int_equal(kb_tls_generation(f->tls), 2);
    char *after = s_served_serial(port);
    assert_string_not_equal(before, after);
    free(before);
    free(same);
    free(after);
    /* restore for the other tests */
    snprintf(cmd, sizeof cmd, "cp %s.orig %s && cp %s.orig %s", f->cert, f->cert, f->key, f->key);
    assert_int_equal(system(cmd), 0);
}

static void test_bad_files(void **state)
{
    char err[KB_TLS_ERR_CAP], cert[160], key[160], other[160];
    s_path(cert, sizeof cert, "server.pem");
    s_path(key, sizeof key, "server.key");
    s_path(other, sizeof other, "alice.key");
    kb_tls_files_t f = {cert, "/nonexistent/key.pem", NULL, false};
    assert_null(kb_tls_new(&f, err, sizeof err));
    assert_string_equal(err, "key file /nonexistent/key.pem: No such file or directory");
    f.key_file = other;
    assert_null(kb_tls_new(&f, err, sizeof err));
    assert_non_null(strstr(err, "does not match certificate file"));
    f = (kb_tls_files_t){cert, key, "/nonexistent/ca.pem", false};
    assert_null(kb_tls_new(&f, err, sizeof err));
    assert_string_equal(err, "client CA file /nonexistent/ca.pem: No such file or directory");
    f = (kb_tls_files_t){key, key, NULL, false};
    assert_null(kb_tls_new(&f, err, sizeof err));
    assert_non_null(strstr(err, "certificate file"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test_setup_teardown(test_alpn_routes_and_relays, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_plaintext_refused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_silent_client_times_out, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_backpressure, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_client_certificates, s_setup_mtls, s_teardown),
        cmocka_unit_test_setup_teardown(test_reload, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, s_gen_all, s_rm_all);
}
