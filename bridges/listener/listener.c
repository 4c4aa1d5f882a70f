/* kb_listener: accept, peek, dispatch. See listener.h. */
#include "listener_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "krt.h"

#define LOG_PATH KB_LISTENER_LOG_PATH

static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define PREFACE_LEN (sizeof PREFACE - 1)

int kb_listener_classify(const void *bytes, size_t len)
{
    size_t n = len < PREFACE_LEN ? len : PREFACE_LEN;
    if (memcmp(bytes, PREFACE, n) != 0)
        return 0;
    return len >= PREFACE_LEN ? 1 : -EAGAIN;
}

int64_t kb_listener_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kb_listener_count(kb_listener_t *l, uint64_t *counter, int64_t delta)
{
    pthread_mutex_lock(&l->mu);
    *counter += (uint64_t)delta;
    pthread_mutex_unlock(&l->mu);
}

static void s_bump(kb_listener_t *l, uint64_t *counter)
{
    kb_listener_count(l, counter, 1);
}

static void s_drop(kb_listener_t *l, int i)
{
    l->pending[i] = l->pending[--l->n_pending];
}

static void s_accept_all(kb_listener_t *l)
{
    for (;;) {
        kb_pending_t p;
        p.peer_len = sizeof p.peer;
        p.fd =
            accept4(l->lfd, (struct sockaddr *)&p.peer, &p.peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (p.fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                krt_log(KRT_LOG_WARN, LOG_PATH, "accept_failed", "errno=%d", errno);
            return;
        }
        s_bump(l, &l->stats.accepted);
        if (l->n_pending >= l->opts.max_peeking) {
            krt_log(KRT_LOG_WARN, LOG_PATH, "too_many_undecided", "max=%d", l->opts.max_peeking);
            s_bump(l, &l->stats.refused);
            close(p.fd);
            continue;
        }
        int one = 1;
        setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        p.deadline_ms = kb_listener_now_ms() + l->opts.peek_timeout_ms;
        l->pending[l->n_pending++] = p;
    }
}

/* Looks at pending[i]; hands it over or drops it when decided. Returns true if removed. */
static bool s_peek(kb_listener_t *l, int i)
{
    kb_pending_t *p = &l->pending[i];
    char buf[PREFACE_LEN];
    ssize_t n = recv(p->fd, buf, sizeof buf, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return false;
    if (n <= 0) { /* closed or reset before saying anything */
        s_bump(l, &l->stats.closed_early);
        close(p->fd);
        s_drop(l, i);
        return true;
    }
    int kind = kb_listener_classify(buf, (size_t)n);
    if (kind == -EAGAIN)
        return false;
    kb_pending_t done = *p;
    s_drop(l, i);
    if (kind == 1) {
        s_bump(l, &l->stats.to_grpc);
        l->opts.on_grpc(done.fd, (struct sockaddr *)&done.peer, done.peer_len, l->opts.arg);
    } else {
        s_bump(l, &l->stats.to_http);
        l->opts.on_http(done.fd, (struct sockaddr *)&done.peer, done.peer_len, l->opts.arg);
    }
    return true;
}

static void *s_thread(void *arg)
{
    kb_listener_t *l = arg;
    if (l->opts.tls) {
        kb_listener_tls_loop(l);
        return NULL;
    }
    struct pollfd *pfd = calloc((size_t)l->opts.max_peeking + 2, sizeof *pfd);
    if (!pfd) {
        krt_log(KRT_LOG_ERROR, LOG_PATH, "out_of_memory", "where=poll_set");
        return NULL;
    }
    for (;;) {
        int64_t now = kb_listener_now_ms();
        /* expire slow clients */
        for (int i = 0; i < l->n_pending;) {
            if (l->pending[i].deadline_ms <= now) {
                s_bump(l, &l->stats.timed_out); /* counted before the peer can see it */
                close(l->pending[i].fd);
                s_drop(l, i);
            } else {
                i++;
            }
        }
        int64_t next = now + 60000;
        for (int i = 0; i < l->n_pending; i++)
            if (l->pending[i].deadline_ms < next)
                next = l->pending[i].deadline_ms;
        pfd[0] = (struct pollfd){.fd = l->wake[0], .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = l->lfd, .events = POLLIN};
        for (int i = 0; i < l->n_pending; i++)
            pfd[2 + i] = (struct pollfd){.fd = l->pending[i].fd, .events = POLLIN};
        int np = l->n_pending;
        int timeout = (int)(next - now) + 1;
        int r = poll(pfd, (nfds_t)np + 2, timeout);
        if (r < 0 && errno != EINTR) {
            krt_log(KRT_LOG_ERROR, LOG_PATH, "poll_failed", "errno=%d", errno);
            break;
        }
        if (r <= 0)
            continue;
        if (pfd[0].revents)
            break;
        /* peek in reverse so removals (swap with last) do not disturb unvisited entries */
        for (int i = np - 1; i >= 0; i--)
            if (pfd[2 + i].revents)
                s_peek(l, i);
        if (pfd[1].revents)
            s_accept_all(l);
    }
    free(pfd);
    return NULL;
}

kb_listener_t *kb_listener_new(const kb_listener_options_t *opts, int *err)
{
    int dummy;
    if (!err)
        err = &dummy;
    *err = -EINVAL;
    if (!opts || !opts->on_grpc || !opts->on_http || opts->port < 0 || opts->port > 65535)
        return NULL;
    kb_listener_t *l = calloc(1, sizeof *l);
    if (!l) {
        *err = -ENOMEM;
        return NULL;
    }
    l->opts = *opts;
    if (!l->opts.host)
        l->opts.host = "127.0.0.1";
    if (l->opts.peek_timeout_ms <= 0)
        l->opts.peek_timeout_ms = KB_LISTENER_DEFAULT_PEEK_MS;
    if (l->opts.max_peeking <= 0)
        l->opts.max_peeking = KB_LISTENER_DEFAULT_MAX_PEEKING;
    if (l->opts.max_tls <= 0)
        l->opts.max_tls = KB_LISTENER_DEFAULT_MAX_TLS;
    l->lfd = l->wake[0] = l->wake[1] = -1;
    pthread_mutex_init(&l->mu, NULL);

    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%d", opts->port);
    if (getaddrinfo(l->opts.host, port, &hints, &ai) != 0 || !ai) {
        krt_log(KRT_LOG_ERROR, LOG_PATH, "bad_address", "host=%s", l->opts.host);
        goto fail;
    }
    l->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->lfd < 0) {
        *err = -errno;
        goto fail;
    }
    int one = 1;
    /* SO_REUSEADDR only (TIME_WAIT); never SO_REUSEPORT, so a second server fails loudly */
    setsockopt(l->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l->lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(l->lfd, 512) < 0) {
        *err = -errno;
        krt_log(KRT_LOG_ERROR, LOG_PATH, "bind_failed", "addr=%s:%d error=\"%s\"", l->opts.host,
                opts->port, strerror(errno));
        goto fail;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl = sizeof ss;
    if (getsockname(l->lfd, (struct sockaddr *)&ss, &sl) < 0) {
        *err = -errno;
        goto fail;
    }
    l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    freeaddrinfo(ai);
    ai = NULL;
    l->pending = calloc((size_t)l->opts.max_peeking, sizeof *l->pending);
    if (!l->pending) {
        *err = -ENOMEM;
        goto fail;
    }
    if (pipe2(l->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        *err = -errno;
        goto fail;
    }
    if (pthread_create(&l->thread, NULL, s_thread, l) != 0) {
        *err = -EAGAIN;
        goto fail;
    }
    krt_log(KRT_LOG_INFO, LOG_PATH, "listening", "addr=%s port=%d tls=%s", l->opts.host, l->port,
            l->opts.tls ? "on" : "off");
    *err = 0;
    return l;
fail:
    if (ai)
        freeaddrinfo(ai);
    if (l->lfd >= 0)
        close(l->lfd);
    if (l->wake[0] >= 0) {
        close(l->wake[0]);
        close(l->wake[1]);
    }
    free(l->pending);
    pthread_mutex_destroy(&l->mu);
    free(l);
    return NULL;
}

int kb_listener_port(const kb_listener_t *l)
{
    return l->port;
}

void kb_listener_stats(kb_listener_t *l, kb_listener_stats_t *out)
{
    pthread_mutex_lock(&l->mu);
    *out = l->stats;
    pthread_mutex_unlock(&l->mu);
}

void kb_listener_destroy(kb_listener_t **l_p)
{
    kb_listener_t *l = l_p ? *l_p : NULL;
    if (!l)
        return;
    *l_p = NULL;
    ssize_t w;
    do {
        w = write(l->wake[1], "x", 1);
    } while (w < 0 && errno == EINTR);
    pthread_join(l->thread, NULL);
    for (int i = 0; i < l->n_pending; i++)
        close(l->pending[i].fd);
    close(l->lfd);
    close(l->wake[0]);
    close(l->wake[1]);
    free(l->pending);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
