/* Unit tests for kb_http: built-in routes, 404/405/413, custom routes, streamed responses,
 * connections handed over as kb_listener does (a connected TCP socket). */
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"

typedef struct {
    kb_http_t *h;
    bool ready;
    bool metrics_fail;
    kb_http_stream_t *stream; /* handed to a producer thread */
    pthread_t producer;
    bool have_producer;
} fx_t;

/* Hands the server end of a loopback TCP pair to h; returns the client end. */
static int s_connect(kb_http_t *h)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(c, (struct sockaddr *)&a, sizeof a), 0);
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    int s = accept(l, (struct sockaddr *)&peer, &plen);
    assert_true(s >= 0);
    close(l);
    assert_int_equal(kb_http_add_connection(h, s, (struct sockaddr *)&peer, plen), 0);
    return c;
}

/* Sends a request and reads the whole response (the request says Connection: close). */
static char *s_request(kb_http_t *h, const char *method, const char *path, const char *body)
{
    int c = s_connect(h);
    char req[8192];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Test: yes\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, blen);
    assert_int_equal(write(c, req, (size_t)n), n);
    size_t off = 0;
    while (off < blen) {
        ssize_t w = write(c, body + off, blen - off);
        if (w <= 0)
            break; /* the server may answer (413) and close before the body is in */
        off += (size_t)w;
    }
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    for (;;) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        assert_int_equal(poll(&p, 1, 5000), 1);
        if (len + 1024 > cap)
            out = realloc(out, cap *= 2);
        ssize_t r = read(c, out + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    out[len] = '\0';
    close(c);
    return out;
}

static int s_status(const char *rsp)
{
    int code = 0;
    sscanf(rsp, "HTTP/1.1 %d", &code);
    return code;
}

static const char *s_body(const char *rsp)
{
    const char *b = strstr(rsp, "\r\n\r\n");
    return b ? b + 4 : "";
}

/* Reads from fd until needle was seen (or 5 s). True if seen. */
static bool s_read_until(int fd, const char *needle)
{
    char buf[4096];
    size_t len = 0;
    while (len < sizeof buf - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1)
            return false;
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n <= 0)
            return false;
        len += (size_t)n;
        buf[len] = '\0';
        if (strstr(buf, needle))
            return true;
    }
    return false;
}

static bool s_ready(void *arg)
{
    return ((fx_t *)arg)->ready;
}

static int s_metrics(kb_http_buf_t *b, void *arg)
{
    fx_t *f = arg;
    if (f->metrics_fail)
        return -EIO;
    kb_http_buf_printf(b, "# TYPE kagent_test_total counter\nkagent_test_total %d\n", 42);
    return 0;
}

static void s_echo_route(kb_http_req_t *req, void *arg)
{
    size_t len;
    const char *body = kb_http_req_body(req, &len);
    char out[256];
    int n = snprintf(out, sizeof out, "%s %s x-test=%s body=%.*s", kb_http_req_method(req),
                     kb_http_req_path(req), kb_http_req_header(req, "x-test"), (int)len, body);
    kb_http_req_add_header(req, "Mcp-Session-Id", "abc");
    kb_http_respond(req, 200, "text/plain", out, (size_t)n);
    assert_int_equal(kb_http_respond(req, 200, NULL, "", 0), -EALREADY);
}

static void s_silent_route(kb_http_req_t *req, void *arg)
{
}

static void *s_produce(void *arg)
{
    fx_t *f = arg;
    for (int i = 0; i < 3; i++) {
        char ev[64];
        int n = snprintf(ev, sizeof ev, "event: message\ndata: {\"n\":%d}\n\n", i);
        assert_int_equal(kb_http_stream_write(f->stream, ev, (size_t)n), 0);
        usleep(20000);
    }
    kb_http_stream_close(&f->stream);
    return NULL;
}

static void s_sse_route(kb_http_req_t *req, void *arg)
{
    fx_t *f = arg;
    assert_int_equal(kb_http_respond_stream(req, 200, "text/event-stream", &f->stream), 0);
    assert_int_equal(pthread_create(&f->producer, NULL, s_produce, f), 0);
    f->have_producer = true;
}

/* Hands the stream out without a producer: the test drives it. */
static void s_hold_route(kb_http_req_t *req, void *arg)
{
    fx_t *f = arg;
    assert_int_equal(kb_http_respond_stream(req, 200, "text/event-stream", &f->stream), 0);
    assert_int_equal(kb_http_stream_write(f->stream, "data: hi\n\n", 10), 0);
}

static int s_setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    f->ready = true;
    kb_http_options_t o = {.ready = s_ready, .metrics = s_metrics, .arg = f, .max_body = 1024};
    f->h = kb_http_new(&o);
    assert_non_null(f->h);
    assert_int_equal(kb_http_route(f->h, "/mcp", KB_HTTP_POST | KB_HTTP_DELETE, s_echo_route, f),
                     0);
    assert_int_equal(kb_http_route(f->h, "/silent", KB_HTTP_GET, s_silent_route, f), 0);
    assert_int_equal(kb_http_route(f->h, "/sse", KB_HTTP_GET, s_sse_route, f), 0);
    assert_int_equal(kb_http_route(f->h, "/hold", KB_HTTP_GET, s_hold_route, f), 0);
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    fx_t *f = *state;
    if (f->have_producer)
        pthread_join(f->producer, NULL);
    kb_http_destroy(&f->h);
    kb_http_destroy(&f->h);
    kb_http_stream_close(&f->stream);
    free(f);
    return 0;
}

static void test_builtin_routes(void **state)
{
    fx_t *f = *state;
    char *r = s_request(f->h, "GET", "/healthz", NULL);
    assert_int_equal(s_status(r), 200);
    assert_string_equal(s_body(r), "ok\n");
    free(r);
    r = s_request(f->h, "GET", "/readyz", NULL);
    assert_int_equal(s_status(r), 200);
    free(r);
    f->ready = false;
    r = s_request(f->h, "GET", "/readyz", NULL);
    assert_int_equal(s_status(r), 503);
    free(r);
    r = s_request(f->h, "GET", "/metrics", NULL);
    assert_int_equal(s_status(r), 200);
    assert_non_null(strstr(r, "text/plain; version=0.0.4"));
    assert_non_null(strstr(s_body(r), "kagent_test_total 42\n"));
    free(r);
    f->metrics_fail = true;
    r = s_request(f->h, "GET", "/metrics", NULL);
    assert_int_equal(s_status(r), 500);
    free(r);
    assert_true(kb_http_requests(f->h) >= 5);
}

/* A node with ~500 sandboxes holds >1024 descriptors: a connection numbered past FD_SETSIZE is
 * still served (a select()-based server would reset it). */
static void test_high_descriptor_numbers(void **state)
{
    fx_t *f = *state;
    enum { N = 1100 };
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < N + 64) {
        rl.rlim_cur = N + 64 < rl.rlim_max ? N + 64 : rl.rlim_max;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    assert_true(rl.rlim_cur >= N + 64); /* else this test proves nothing: fail loudly */
    int fds[N];
    for (int i = 0; i < N; i++)
        assert_true((fds[i] = dup(2)) >= 0);
    for (int i = 0; i < 3; i++) {
        char *r = s_request(f->h, "GET", "/healthz", NULL);
        assert_int_equal(s_status(r), 200);
        assert_string_equal(s_body(r), "ok\n");
        free(r);
    }
    for (int i = 0; i < N; i++)
        close(fds[i]);
}

static void test_errors(void **state)
{
    fx_t *f = *state;
    char *r = s_request(f->h, "GET", "/nope", NULL);
    assert_int_equal(s_status(r), 404);
    free(r);
    r = s_request(f->h, "POST", "/healthz", "x");
    assert_int_equal(s_status(r), 405);
    assert_non_null(strstr(r, "Allow: GET, HEAD\r\n"));
    free(r);
    r = s_request(f->h, "GET", "/mcp", NULL);
    assert_int_equal(s_status(r), 405);
    assert_non_null(strstr(r, "Allow: POST, DELETE\r\n"));
    free(r);
    char big[2048];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    r = s_request(f->h, "POST", "/mcp", big);
    assert_int_equal(s_status(r), 413);
    free(r);
    r = s_request(f->h, "GET", "/silent", NULL);
    assert_int_equal(s_status(r), 500);
    free(r);
    assert_int_equal(kb_http_route(f->h, "/mcp", KB_HTTP_GET, s_echo_route, f), -EEXIST);
    assert_int_equal(kb_http_route(f->h, "relative", KB_HTTP_GET, s_echo_route, f), -EINVAL);
    assert_int_equal(kb_http_route(f->h, "/x", 0, s_echo_route, f), -EINVAL);
}

static void test_custom_route(void **state)
{
    fx_t *f = *state;
    char *r = s_request(f->h, "POST", "/mcp", "{\"jsonrpc\":\"2.0\"}");
    assert_int_equal(s_status(r), 200);
    assert_non_null(strstr(r, "Mcp-Session-Id: abc\r\n"));
    assert_string_equal(s_body(r), "POST /mcp x-test=yes body={\"jsonrpc\":\"2.0\"}");
    free(r);
    r = s_request(f->h, "DELETE", "/mcp", NULL);
    assert_int_equal(s_status(r), 200);
    assert_string_equal(s_body(r), "DELETE /mcp x-test=yes body=");
    free(r);
}

static void test_streaming(void **state)
{
    fx_t *f = *state;
    char *r = s_request(f->h, "GET", "/sse", NULL);
    assert_int_equal(s_status(r), 200);
    assert_non_null(strstr(r, "Transfer-Encoding: chunked"));
    assert_non_null(strstr(r, "text/event-stream"));
    const char *b = s_body(r);
    const char *e0 = strstr(b, "data: {\"n\":0}");
    const char *e2 = strstr(b, "data: {\"n\":2}");
    assert_non_null(e0);
    assert_non_null(e2);
    assert_true(e0 < e2);
    assert_non_null(strstr(b, "\r\n0\r\n\r\n")); /* the chunked body ended */
    free(r);
}

static void s_gone(kb_http_stream_t *s, void *arg)
{
    int *n = arg;
    __atomic_add_fetch(n, 1, __ATOMIC_SEQ_CST);
}

static void test_stream_client_gone(void **state)
{
    fx_t *f = *state;
    static int gone;
    gone = 0;
    int c = s_connect(f->h);
    const char req[] = "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(c, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(s_read_until(c, "data: hi"));
    assert_int_equal(kb_http_stream_on_gone(f->stream, s_gone, &gone), 0);
    close(c);
    /* the producer learns that nobody listens any more */
    int rc = 0;
    for (int i = 0; i < 300 && rc == 0; i++) {
        rc = kb_http_stream_write(f->stream, "data: more\n\n", 12);
        usleep(10000);
    }
    assert_int_equal(rc, -EPIPE);
    assert_true(kb_http_stream_closed(f->stream));
    for (int i = 0; i < 300 && !__atomic_load_n(&gone, __ATOMIC_SEQ_CST); i++)
        usleep(10000);
    assert_int_equal(__atomic_load_n(&gone, __ATOMIC_SEQ_CST), 1);
    assert_int_equal(kb_http_stream_on_gone(f->stream, s_gone, &gone), -EPIPE);
    kb_http_stream_close(&f->stream);
    assert_null(f->stream);
}

/* A client that hangs up on an idle stream is noticed without the producer writing. */
static void test_stream_gone_while_idle(void **state)
{
    fx_t *f = *state;
    static int gone;
    gone = 0;
    int c = s_connect(f->h);
    const char req[] = "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(c, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(s_read_until(c, "data: hi"));
    assert_int_equal(kb_http_stream_on_gone(f->stream, s_gone, &gone), 0);
    close(c);
    int i = 0;
    for (; i < 500 && !__atomic_load_n(&gone, __ATOMIC_SEQ_CST); i++)
        usleep(10000);
    print_message("idle hang-up noticed after ~%d ms\n", i * 10);
    assert_int_equal(__atomic_load_n(&gone, __ATOMIC_SEQ_CST), 1);
    assert_true(kb_http_stream_closed(f->stream));
    assert_int_equal(kb_http_stream_write(f->stream, "x", 1), -EPIPE);
    kb_http_stream_close(&f->stream);
}

/* A stream idle for longer than the reader's wait still delivers the next event promptly. */
static void test_stream_idle_gap(void **state)
{
    fx_t *f = *state;
    int c = s_connect(f->h);
    const char req[] = "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(c, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(s_read_until(c, "data: hi"));
    usleep(2500000); /* longer than the content reader's 1 s wait */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(kb_http_stream_write(f->stream, "data: late\n\n", 12), 0);
    assert_true(s_read_until(c, "data: late"));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    print_message("late event arrived after %.1f ms\n", ms);
    assert_true(ms < 1500);
    kb_http_stream_close(&f->stream);
    close(c);
}

static void test_destroy_with_open_stream(void **state)
{
    fx_t *f = *state;
    int c = s_connect(f->h);
    const char req[] = "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n";
    assert_int_equal(write(c, req, strlen(req)), (ssize_t)strlen(req));
    assert_true(s_read_until(c, "data: hi"));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    kb_http_destroy(&f->h);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 3);
    assert_int_equal(kb_http_stream_write(f->stream, "x", 1), -EPIPE);
    kb_http_stream_close(&f->stream);
    close(c);
}

static void test_host_allowed(void **state)
{
    const char *const hosts[] = {"localhost", "127.0.0.1:8083", "[::1]", NULL};
    assert_true(kb_http_host_allowed(hosts, "localhost"));
    assert_true(kb_http_host_allowed(hosts, "LocalHost:1234")); /* a bare host: any port */
    assert_true(kb_http_host_allowed(hosts, "127.0.0.1:8083"));
    assert_false(kb_http_host_allowed(hosts, "127.0.0.1:8084")); /* host:port: that port only */
    assert_false(kb_http_host_allowed(hosts, "127.0.0.1"));
    assert_true(kb_http_host_allowed(hosts, "[::1]:9"));
    assert_false(kb_http_host_allowed(hosts, "localhost.evil.example"));
    assert_false(kb_http_host_allowed(hosts, "evil.example"));
    assert_false(kb_http_host_allowed(hosts, NULL));
    const char *const any[] = {"*", NULL};
    assert_true(kb_http_host_allowed(any, "whatever:1"));
    assert_false(kb_http_host_allowed(NULL, "localhost"));
}

static void test_cookie(void **state)
{
    char v[16];
    assert_int_equal(kb_http_cookie("a=1; kagent_ui=tok-123; b=2", "kagent_ui", v, sizeof v), 0);
    assert_string_equal(v, "tok-123");
    assert_int_equal(kb_http_cookie("kagent_ui=x", "kagent_ui", v, sizeof v), 0);
    assert_string_equal(v, "x");
    assert_int_equal(kb_http_cookie("kagent_ui=", "kagent_ui", v, sizeof v), 0);
    assert_string_equal(v, "");
    assert_int_equal(kb_http_cookie("xkagent_ui=1; kagent_uix=2", "kagent_ui", v, sizeof v),
                     -ENOENT);
    assert_int_equal(kb_http_cookie("kagent_ui=0123456789abcdefXYZ", "kagent_ui", v, sizeof v),
                     -ENOENT); /* longer than the buffer: refused, not cut */
    assert_int_equal(kb_http_cookie(NULL, "kagent_ui", v, sizeof v), -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_allowed),
        cmocka_unit_test(test_cookie),
        cmocka_unit_test_setup_teardown(test_builtin_routes, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_high_descriptor_numbers, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_errors, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_custom_route, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_streaming, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_stream_client_gone, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_stream_idle_gap, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_stream_gone_while_idle, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_destroy_with_open_stream, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
