/* Unit tests for bridges/cli/rpc.c (the CLI's gRPC client) against RAW_SERVER, a loopback
 * listener inside this test that answers with scripted bytes: a valid exchange written with
 * the static table, gRPC errors in trailers, HTTP errors, every way a server can refuse or
 * break a call (GOAWAY, RST_STREAM, a bad frame, a close, no HTTP/2 at all, silence past the
 * deadline), each with the status the CLI reports and whether the outcome is unknown. The
 * request the client wrote is decoded and its headers checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hpack.h"
#include "kagent/runtime/v1/runtime.pb-c.h"
#include "rpc.h"

#define METHOD "/kagent.runtime.v1.RuntimeService/GetStats"

/* ========================================================================================== */
/* RAW_SERVER: accepts one connection per call, records what the client wrote first, answers  */
/* with the script, then reads until the client closes (ending its side at once: close_after). */

static struct {
    int lfd;
    char url[64];
    pthread_t thread;
    uint8_t script[4096];
    size_t script_len;
    bool close_after;
    uint8_t got[8192]; /* the client's first bytes */
    size_t got_len;
    bool stop;
} s_srv;

static void *s_serve(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(s_srv.lfd, NULL, NULL);
        if (fd < 0 || s_srv.stop) {
            if (fd >= 0)
                close(fd);
            return NULL;
        }
        s_srv.got_len = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        while (poll(&p, 1, s_srv.got_len ? 30 : 2000) > 0) { /* until the client pauses */
            ssize_t n = read(fd, s_srv.got + s_srv.got_len, sizeof s_srv.got - s_srv.got_len);
            if (n <= 0)
                break;
            s_srv.got_len += (size_t)n;
        }
        if (write(fd, s_srv.script, s_srv.script_len) < 0)
            perror("raw server write");
        /* close_after: our side ends at once (FIN), and what the client still sends is read, so
         * the kernel never answers it with a reset: the client sees the close, not ECONNRESET */
        if (s_srv.close_after)
            shutdown(fd, SHUT_WR);
        char buf[4096];
        while (read(fd, buf, sizeof buf) > 0)
            ;
        close(fd);
    }
}

static int s_setup_all(void **state)
{
    (void)state;
    s_srv.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(s_srv.lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s_srv.lfd, 4), 0);
    getsockname(s_srv.lfd, (struct sockaddr *)&a, &al);
    snprintf(s_srv.url, sizeof s_srv.url, "http://127.0.0.1:%d", ntohs(a.sin_port));
    return pthread_create(&s_srv.thread, NULL, s_serve, NULL);
}

static int s_teardown_all(void **state)
{
    (void)state;
    s_srv.stop = true;
    shutdown(s_srv.lfd, SHUT_RDWR);
    pthread_join(s_srv.thread, NULL);
    close(s_srv.lfd);
    return 0;
}

/* ---- script building ---------------------------------------------------------------------- */

static void s_reset(void)
{
    s_srv.script_len = 0;
    s_srv.close_after = false;
}

static void s_frame(uint8_t type, uint8_t flags, uint32_t sid, const void *p, size_t n)
{
    uint8_t *o = s_srv.script + s_srv.script_len;
    uint8_t hd[9] = {
        (uint8_t)(n >> 16),   (uint8_t)(n >> 8),    (uint8_t)n,          type,        flags,
        (uint8_t)(sid >> 24), (uint8_t)(sid >> 16), (uint8_t)(sid >> 8), (uint8_t)sid};
    memcpy(o, hd, 9);
    memcpy(o + 9, p, n);
    s_srv.script_len += 9 + n;
}

static void s_settings(void)
{
    s_frame(4, 0, 0, "", 0);
}

/* HEADERS on stream 1: ":status: 200" as static index 8 (0x88), then literals. */
static void s_headers(int flags, int status_200, ...)
{
    uint8_t b[512];
    size_t at = 0;
    if (status_200)
        b[at++] = 0x88;
    va_list ap;
    va_start(ap, status_200);
    for (const char *name; (name = va_arg(ap, const char *));)
        assert_int_equal(kb_hpack_encode(b, sizeof b, &at, name, va_arg(ap, const char *)), 0);
    va_end(ap);
    s_frame(1, (uint8_t)(flags | 4), 1, b, at);
}

static void s_stats_message(uint64_t actors)
{
    Kagent__Runtime__V1__GetStatsResponse r = KAGENT__RUNTIME__V1__GET_STATS_RESPONSE__INIT;
    r.actors_live = actors;
    uint8_t b[256];
    size_t n = kagent__runtime__v1__get_stats_response__pack(&r, b + 5);
    b[0] = 0;
    b[1] = b[2] = b[3] = 0;
    b[4] = (uint8_t)n;
    s_frame(0, 0, 1, b, n + 5);
}

/* ---- the call ----------------------------------------------------------------------------- */

typedef struct {
    int rc;
    kb_rpc_status_t st;
    uint64_t actors;
} result_t;

static result_t s_call(int64_t timeout_ms)
{
    char err[256];
    kb_rpc_opts_t o = {.api_url = s_srv.url, .user_id = "alice", .timeout_ms = timeout_ms};
    kb_rpc_t *rpc = kb_rpc_new(&o, err, sizeof err);
    assert_non_null(rpc);
    Kagent__Runtime__V1__GetStatsRequest req = KAGENT__RUNTIME__V1__GET_STATS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    result_t r = {0};
    r.rc = kb_rpc_unary(rpc, METHOD, "sb-1", &req.base,
                        &kagent__runtime__v1__get_stats_response__descriptor, &resp, &r.st);
    if (resp) {
        r.actors = ((Kagent__Runtime__V1__GetStatsResponse *)resp)->actors_live;
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    kb_rpc_destroy(&rpc);
    return r;
}

static void s_expect(const result_t *r, int code, const char *msg_part, bool unknown)
{
    if (r->st.code != code || !strstr(r->st.message, msg_part) ||
        kb_rpc_outcome_unknown(&r->st) != unknown)
        fail_msg("got code %d \"%s\" unknown=%d; want %d \"%s\" unknown=%d", r->st.code,
                 r->st.message, kb_rpc_outcome_unknown(&r->st), code, msg_part, unknown);
    assert_int_equal(r->rc, code == 0 ? 0 : -EIO);
}

/* ========================================================================================== */

typedef struct {
    int n;
    char text[24][300];
} hdrs_t;

static int s_collect(void *user, const char *name, size_t nl, const char *value, size_t vl)
{
    hdrs_t *h = user;
    if (h->n < 24)
        snprintf(h->text[h->n++], sizeof h->text[0], "%.*s: %.*s", (int)nl, name, (int)vl, value);
    return 0;
}

static bool s_has(const hdrs_t *h, const char *want)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->text[i], want) == 0)
            return true;
    return false;
}

static void test_valid_exchange_and_request_headers(void **state)
{
    (void)state;
    s_reset();
    s_settings();
    s_headers(0, true, "content-type", "application/grpc", NULL);
    uint8_t ping[8] = {9};
    s_frame(6, 0, 0, ping, 8);
    s_stats_message(12);
    s_headers(1, false, "grpc-status", "0", NULL);
    result_t r = s_call(30000);
    s_expect(&r, 0, "", false);
    assert_int_equal(r.actors, 12);

    /* what the client wrote: the preface, SETTINGS, then our HEADERS and the DATA */
    assert_true(s_srv.got_len > 24);
    assert_memory_equal(s_srv.got, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
    size_t at = 24;
    hdrs_t h = {0};
    bool data_end = false;
    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    while (at + 9 <= s_srv.got_len) {
        const uint8_t *f = s_srv.got + at;
        size_t len = (size_t)f[0] << 16 | (size_t)f[1] << 8 | f[2];
        if (f[3] == 1)
            assert_int_equal(kb_hpack_decode(&d, f + 9, len, s_collect, &h), 0);
        if (f[3] == 0 && (f[4] & 1))
            data_end = true;
        at += 9 + len;
    }
    kb_hpack_dec_fini(&d);
    assert_true(data_end); /* a unary request half-closes with its message */
    assert_string_equal(h.text[0], ":method: POST");
    assert_true(s_has(&h, ":path: " METHOD));
    assert_true(s_has(&h, ":scheme: http"));
    assert_true(s_has(&h, "te: trailers"));
    assert_true(s_has(&h, "content-type: application/grpc"));
    assert_true(s_has(&h, "x-user-id: alice"));
    assert_true(s_has(&h, "kagent-sandbox-id: sb-1"));
    bool timeout = false;
    for (int i = 0; i < h.n; i++)
        timeout = timeout || strncmp(h.text[i], "grpc-timeout: ", 14) == 0;
    assert_true(timeout);
}

static void test_grpc_and_http_errors(void **state)
{
    (void)state;
    /* trailers-only error, message percent-encoded */
    s_reset();
    s_settings();
    s_headers(1, true, "content-type", "application/grpc", "grpc-status", "3", "grpc-message",
              "bad%20name%3A x", NULL);
    result_t r = s_call(0);
    s_expect(&r, 3, "bad name: x", false);
    /* OK status but no message for a unary call */
    s_reset();
    s_settings();
    s_headers(1, true, "content-type", "application/grpc", "grpc-status", "0", NULL);
    r = s_call(0);
    s_expect(&r, 13, "server sent no response message", true);
    /* an HTTP 404 without grpc-status: Unimplemented */
    s_reset();
    s_settings();
    uint8_t b[] = {0x8d}; /* :status: 404 (static index 13) */
    s_frame(1, 5, 1, b, 1);
    r = s_call(0);
    s_expect(&r, 12, "HTTP status 404", false);
    /* a reply that is not gRPC */
    s_reset();
    s_settings();
    s_headers(1, true, "content-type", "text/html", NULL);
    r = s_call(0);
    s_expect(&r, 2, "not gRPC", true);
    /* a message that is not the response type */
    s_reset();
    s_settings();
    s_headers(0, true, "content-type", "application/grpc", NULL);
    uint8_t junk[] = {0, 0, 0, 0, 3, 0xff, 0xff, 0xff};
    s_frame(0, 0, 1, junk, sizeof junk);
    s_headers(1, false, "grpc-status", "0", NULL);
    r = s_call(0);
    s_expect(&r, 13, "cannot parse a response message", true);
}

static void test_refusals_are_known_not_run(void **state)
{
    (void)state;
    s_reset();
    s_settings();
    uint8_t ga[] = {0, 0, 0, 0, 0, 0, 0, 0, 'd', 'r', 'a', 'i', 'n'};
    s_frame(7, 0, 0, ga, sizeof ga);
    result_t r = s_call(0);
    s_expect(&r, 14, "going away", false);
    s_reset();
    s_settings();
    uint8_t refused[] = {0, 0, 0, 7};
    s_frame(3, 0, 1, refused, 4);
    r = s_call(0);
    s_expect(&r, 14, "HTTP/2 error code 7", false);
    /* but a stream the server cancels may have run */
    s_reset();
    s_settings();
    uint8_t cancel[] = {0, 0, 0, 8};
    s_frame(3, 0, 1, cancel, 4);
    r = s_call(0);
    s_expect(&r, 1, "HTTP/2 error code 8", true);
}

static void test_broken_servers(void **state)
{
    (void)state;
    /* a bad frame: a clear error naming it; the request was sent, so the outcome is unknown */
    s_reset();
    s_settings();
    s_frame(0, 0, 0, "x", 1);
    result_t r = s_call(0);
    s_expect(&r, 13, "bad HTTP/2 from 127.0.0.1:", true);
    s_expect(&r, 13, "DATA on stream 0", true);
    /* HTTP/1.1 on the port */
    s_reset();
    static const char h1[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    memcpy(s_srv.script, h1, sizeof h1 - 1);
    s_srv.script_len = sizeof h1 - 1;
    r = s_call(0);
    s_expect(&r, 14, "does not speak HTTP/2", true);
    /* closed in the middle */
    s_reset();
    s_settings();
    s_headers(0, true, "content-type", "application/grpc", NULL);
    s_srv.close_after = true;
    r = s_call(0);
    s_expect(&r, 14, "closed by the server", true);
    /* the stream ends inside a message */
    s_reset();
    s_settings();
    s_headers(0, true, "content-type", "application/grpc", NULL);
    uint8_t part[] = {0, 0, 0, 0, 9, 1, 2};
    s_frame(0, 1, 1, part, sizeof part);
    r = s_call(0);
    s_expect(&r, 13, "inside a message", true);
    /* silence past the deadline */
    s_reset();
    s_settings();
    r = s_call(300);
    s_expect(&r, 4, "context deadline exceeded", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_exchange_and_request_headers),
        cmocka_unit_test(test_grpc_and_http_errors),
        cmocka_unit_test(test_refusals_are_known_not_run),
        cmocka_unit_test(test_broken_servers),
    };
    return cmocka_run_group_tests(tests, s_setup_all, s_teardown_all);
}
