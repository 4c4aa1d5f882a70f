/* Unit tests for kb_listener: protocol detection by peeking, slow clients, bind errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "listener.h"

#define PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

/* What the callbacks saw. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fds[16];
    char kind[16]; /* 'g' or 'h' */
    int n;
} seen_t;

static void s_record(seen_t *s, int fd, char kind)
{
    pthread_mutex_lock(&s->mu);
    if (s->n < 16) {
        s->fds[s->n] = fd;
        s->kind[s->n] = kind;
        s->n++;
    } else {
        close(fd);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void s_on_grpc(int fd, const struct sockaddr *peer, socklen_t len, void *arg)
{
    s_record(arg, fd, 'g');
}

static void s_on_http(int fd, const struct sockaddr *peer, socklen_t len, void *arg)
{
    s_record(arg, fd, 'h');
}

/* Waits until at least n connections were handed over (or 3 s). Returns the count. */
static int s_wait_n(seen_t *s, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 3;
    pthread_mutex_lock(&s->mu);
    while (s->n < n && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
        ;
    int got = s->n;
    pthread_mutex_unlock(&s->mu);
    return got;
}

static int s_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

typedef struct {
    seen_t seen;
    kb_listener_t *l;
} fx_t;

static int s_setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->seen.mu, NULL);
    pthread_cond_init(&f->seen.cv, NULL);
    kb_listener_options_t o = {.port = 0,
                               .peek_timeout_ms = 300,
                               .on_grpc = s_on_grpc,
                               .on_http = s_on_http,
                               .arg = &f->seen};
    int err = 1;
    f->l = kb_listener_new(&o, &err);
    assert_non_null(f->l);
    assert_int_equal(err, 0);
    assert_true(kb_listener_port(f->l) > 0);
    *state = f;
    return 0;
}

static int s_teardown(void **state)
{
    fx_t *f = *state;
    kb_listener_destroy(&f->l);
    kb_listener_destroy(&f->l);
    for (int i = 0; i < f->seen.n; i++)
        close(f->seen.fds[i]);
    pthread_cond_destroy(&f->seen.cv);
    pthread_mutex_destroy(&f->seen.mu);
    free(f);
    return 0;
}

static void test_classify(void **state)
{
    assert_int_equal(kb_listener_classify(PREFACE, strlen(PREFACE)), 1);
    assert_int_equal(kb_listener_classify(PREFACE "extra", strlen(PREFACE) + 5), 1);
    assert_int_equal(kb_listener_classify("PRI * HT", 8), -EAGAIN);
    assert_int_equal(kb_listener_classify("", 0), -EAGAIN);
    assert_int_equal(kb_listener_classify("GET / HTTP/1.1\r\n", 16), 0);
    assert_int_equal(kb_listener_classify("PRX", 3), 0);
    assert_int_equal(kb_listener_classify("POST /mcp HTTP/1.1", 18), 0);
}

static void test_dispatch_keeps_bytes(void **state)
{
    fx_t *f = *state;
    int port = kb_listener_port(f->l);
    int h = s_connect(port);
    const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(h, req, strlen(req)), (ssize_t)strlen(req));
    assert_int_equal(s_wait_n(&f->seen, 1), 1);
    assert_int_equal(f->seen.kind[0], 'h');
    int g = s_connect(port);
    assert_int_equal(write(g, PREFACE, strlen(PREFACE)), (ssize_t)strlen(PREFACE));
    assert_int_equal(s_wait_n(&f->seen, 2), 2);
    assert_int_equal(f->seen.kind[1], 'g');
    /* nothing was consumed: the receiver reads the request from its first byte */
    char buf[128] = {0};
    struct pollfd p = {.fd = f->seen.fds[0], .events = POLLIN};
    assert_int_equal(poll(&p, 1, 1000), 1);
    assert_int_equal(read(f->seen.fds[0], buf, sizeof buf - 1), (ssize_t)strlen(req));
    assert_string_equal(buf, req);
    memset(buf, 0, sizeof buf);
    assert_int_equal(read(f->seen.fds[1], buf, sizeof buf - 1), (ssize_t)strlen(PREFACE));
    assert_string_equal(buf, PREFACE);
    kb_listener_stats_t st;
    kb_listener_stats(f->l, &st);
    assert_int_equal(st.accepted, 2);
    assert_int_equal(st.to_http, 1);
    assert_int_equal(st.to_grpc, 1);
    close(h);
    close(g);
}

static void test_preface_in_pieces(void **state)
{
    fx_t *f = *state;
    int g = s_connect(kb_listener_port(f->l));
    assert_int_equal(write(g, "PRI * HT", 8), 8);
    usleep(100000);
    assert_int_equal(s_wait_n(&f->seen, 0), 0); /* still undecided */
    const char *rest = PREFACE + 8;
    assert_int_equal(write(g, rest, strlen(rest)), (ssize_t)strlen(rest));
    assert_int_equal(s_wait_n(&f->seen, 1), 1);
    assert_int_equal(f->seen.kind[0], 'g');
    close(g);
}

static void test_slow_clients_do_not_block(void **state)
{
    fx_t *f = *state;
    int port = kb_listener_port(f->l);
    int silent = s_connect(port);
    int half = s_connect(port);
    assert_int_equal(write(half, "PRI", 3), 3);
    int early = s_connect(port);
    close(early); /* gone before saying anything */
    /* a prompt client is served at once while the others wait */
    int h = s_connect(port);
    assert_int_equal(write(h, "DELETE /mcp HTTP/1.1\r\n\r\n", 24), 24);
    assert_int_equal(s_wait_n(&f->seen, 1), 1);
    assert_int_equal(f->seen.kind[0], 'h');
    /* the silent ones are closed after the peek timeout (300 ms) */
    char c;
    struct pollfd p = {.fd = silent, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 3000), 1);
    assert_int_equal(read(silent, &c, 1), 0);
    p.fd = half;
    assert_int_equal(poll(&p, 1, 3000), 1);
    assert_true(read(half, &c, 1) <= 0);
    kb_listener_stats_t st;
    kb_listener_stats(f->l, &st);
    assert_int_equal(st.timed_out, 2);
    assert_int_equal(st.closed_early, 1);
    assert_int_equal(s_wait_n(&f->seen, 1), 1);
    close(silent);
    close(half);
    close(h);
}

static void test_bind_errors(void **state)
{
    fx_t *f = *state;
    kb_listener_options_t o = {.port = kb_listener_port(f->l),
                               .on_grpc = s_on_grpc,
                               .on_http = s_on_http,
                               .arg = &f->seen};
    int err = 0;
    assert_null(kb_listener_new(&o, &err));
    assert_int_equal(err, -EADDRINUSE);
    o.port = 0;
    o.host = "not-an-address";
    assert_null(kb_listener_new(&o, &err));
    assert_int_equal(err, -EINVAL);
    o.host = NULL;
    o.on_http = NULL;
    assert_null(kb_listener_new(&o, &err));
    assert_int_equal(err, -EINVAL);
    o.on_http = s_on_http;
    o.port = 70000;
    assert_null(kb_listener_new(&o, &err));
    assert_int_equal(err, -EINVAL);
}

static void test_destroy_closes_undecided(void **state)
{
    fx_t *f = *state;
    int silent = s_connect(kb_listener_port(f->l));
    usleep(50000);
    kb_listener_destroy(&f->l);
    char c;
    struct pollfd p = {.fd = silent, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 1000), 1);
    assert_int_equal(read(silent, &c, 1), 0);
    close(silent);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify),
        cmocka_unit_test_setup_teardown(test_dispatch_keeps_bytes, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_preface_in_pieces, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_slow_clients_do_not_block, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bind_errors, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_destroy_closes_undecided, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
