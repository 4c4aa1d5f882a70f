/* kb_listener's TLS loop: accept, non-blocking handshake, then relay between the TLS socket and
 * a socketpair whose other end gRPC core or libmicrohttpd adopted. One epoll loop on the
 * listener thread; every connection has two fixed buffers (net -> app "down", app -> net "up")
 * and a side is read only when its buffer is empty, so a peer that does not drain stops the
 * other side (TCP flow control does the rest). See listener.h. */
#include "listener_int.h"

#include <errno.h>
#include <signal.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <openssl/err.h>

#include "krt.h"

#define LOG_PATH     KB_LISTENER_LOG_PATH
#define S_BUF        KB_LISTENER_TLS_BUF
#define S_EVENTS     64
#define S_APP_SNDBUF (64 * 1024) /* kernel buffer of each socketpair end */

typedef struct s_conn s_conn_t;

/* What an epoll event points at. */
typedef enum { S_TAG_WAKE, S_TAG_ACCEPT, S_TAG_NET, S_TAG_APP } s_tag_kind_t;
typedef struct {
    s_tag_kind_t kind;
    s_conn_t *c;
} s_tag_t;

struct s_conn {
    s_tag_t net_tag, app_tag;
    int net;    /* the TLS socket */
    int app;    /* our end of the socketpair; -1 until handed over */
    int handed; /* the end given to gRPC/MHD (the identity key); -1 until handed over */
    SSL *ssl;
    int64_t deadline_ms;     /* while handshaking or closing; 0 = none */
    s_conn_t *prev, *next;   /* the timed list (handshaking or closing) or the live list */
    bool timed, relaying;    /* which list; handshake done */
    bool dead;               /* closed in this batch of events; freed after it */
    bool want_in, want_out;  /* what the last TLS operation waits for on net */
    bool net_eof, app_eof;   /* no more bytes will come from that side */
    bool app_shut, tls_shut; /* EOF passed on to the app / close_notify sent */
    bool app_gone;           /* the app closed its end completely */
    uint32_t net_ev, app_ev; /* registered interest */
    struct sockaddr_storage peer;
    socklen_t peer_len;
    size_t down_off, down_len, up_off, up_len;
    unsigned char down[S_BUF], up[S_BUF];
};

typedef struct {
    s_conn_t *head, *tail;
} s_list_t;

typedef struct {
    kb_listener_t *l;
    int ep;
    s_tag_t wake_tag, accept_tag;
    s_list_t timed; /* FIFO: every deadline is now + the same timeout, so the head expires first */
    s_list_t live;
    s_conn_t *dead; /* closed in this batch, linked through next */
    int n;          /* connections (timed + live) */
} s_loop_t;

/* ---- lists -------------------------------------------------------------------------------- */

static void s_unlink(s_list_t *ls, s_conn_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        ls->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        ls->tail = c->prev;
    c->prev = c->next = NULL;
}

static void s_append(s_list_t *ls, s_conn_t *c)
{
    c->prev = ls->tail;
    c->next = NULL;
    if (ls->tail)
        ls->tail->next = c;
    else
        ls->head = c;
    ls->tail = c;
}

static s_list_t *s_list_of(s_loop_t *lp, s_conn_t *c)
{
    return c->timed ? &lp->timed : &lp->live;
}

/* Moves c to the timed list with a fresh deadline (handshake, or closing). */
static void s_time(s_loop_t *lp, s_conn_t *c)
{
    s_unlink(s_list_of(lp, c), c);
    c->timed = true;
    c->deadline_ms = kb_listener_now_ms() + lp->l->opts.peek_timeout_ms;
    s_append(&lp->timed, c);
}

/* ---- life --------------------------------------------------------------------------------- */

/* Closes c now (its handed-over end stays with its new owner); freed after the batch. */
static void s_close(s_loop_t *lp, s_conn_t *c)
{
    if (c->dead)
        return;
    c->dead = true;
    s_unlink(s_list_of(lp, c), c);
    /* counted before the peer can see the close (a test reads the stats right after it) */
    kb_listener_count(lp->l, &lp->l->stats.tls_live, -1);
    /* removed explicitly: a fork elsewhere in the process can hold the sockets open for a while,
     * and epoll would keep reporting them for a freed connection */
    epoll_ctl(lp->ep, EPOLL_CTL_DEL, c->net, NULL);
    close(c->net);
    if (c->app >= 0) {
        epoll_ctl(lp->ep, EPOLL_CTL_DEL, c->app, NULL);
        close(c->app);
    }
    if (c->handed >= 0 && lp->l->opts.ids)
        kb_conn_ids_set(lp->l->opts.ids, c->handed, NULL);
    lp->n--;
    c->next = lp->dead;
    lp->dead = c;
}

static void s_reap(s_loop_t *lp)
{
    while (lp->dead) {
        s_conn_t *c = lp->dead;
        lp->dead = c->next;
        SSL_free(c->ssl);
        free(c);
    }
}

static void s_fail_handshake(s_loop_t *lp, s_conn_t *c, const char *why)
{
    kb_listener_count(lp->l, &lp->l->stats.tls_failed, 1);
    krt_log(KRT_LOG_DEBUG, LOG_PATH, "tls_handshake_failed", "reason=\"%s\"", why);
    s_close(lp, c);
}

static int s_epoll(s_loop_t *lp, int op, int fd, uint32_t ev, s_tag_t *tag)
{
    struct epoll_event e = {.events = ev, .data.ptr = tag};
    return epoll_ctl(lp->ep, op, fd, &e);
}

static void s_accept_one(s_loop_t *lp, int fd, const struct sockaddr_storage *peer,
                         socklen_t peer_len)
{
    kb_listener_t *l = lp->l;
    s_conn_t *c = lp->n < l->opts.max_tls ? calloc(1, sizeof *c) : NULL;
    SSL *ssl = c ? kb_tls_ssl_new(l->opts.tls) : NULL;
    if (!ssl || !SSL_set_fd(ssl, fd)) {
        krt_log(KRT_LOG_WARN, LOG_PATH, "tls_refused", "live=%d max=%d", lp->n, l->opts.max_tls);
        kb_listener_count(l, &l->stats.refused, 1);
        SSL_free(ssl);
        free(c);
        close(fd);
        return;
    }
    SSL_set_accept_state(ssl);
    *c = (s_conn_t){.net = fd,
                    .app = -1,
                    .handed = -1,
                    .ssl = ssl,
                    .peer = *peer,
                    .peer_len = peer_len,
                    .want_in = true,
                    .net_ev = EPOLLIN};
    c->net_tag = (s_tag_t){S_TAG_NET, c};
    c->app_tag = (s_tag_t){S_TAG_APP, c};
    c->timed = true;
    c->deadline_ms = kb_listener_now_ms() + l->opts.peek_timeout_ms;
    s_append(&lp->timed, c);
    lp->n++;
    kb_listener_count(l, &l->stats.tls_live, 1);
    if (s_epoll(lp, EPOLL_CTL_ADD, fd, EPOLLIN, &c->net_tag))
        s_fail_handshake(lp, c, "epoll");
}

static void s_accept_all(s_loop_t *lp)
{
    kb_listener_t *l = lp->l;
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof peer;
        int fd = accept4(l->lfd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                krt_log(KRT_LOG_WARN, LOG_PATH, "accept_failed", "errno=%d", errno);
            return;
        }
        kb_listener_count(l, &l->stats.accepted, 1);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s_accept_one(lp, fd, &peer, peer_len);
    }
}

/* ---- the TLS side ------------------------------------------------------------------------- */

/* Interprets a TLS operation's result r <= 0: 0 if it must wait (want_in/want_out set), 1 if
 * the peer ended its side, -1 if the connection is broken. */
static int s_tls_wait(s_conn_t *c, int r)
{
    switch (SSL_get_error(c->ssl, r)) {
    case SSL_ERROR_WANT_READ:
        c->want_in = true;
        return 0;
    case SSL_ERROR_WANT_WRITE:
        c->want_out = true;
        return 0;
    case SSL_ERROR_ZERO_RETURN: /* close_notify */
        return 1;
    case SSL_ERROR_SSL: /* a TCP close without close_notify is an end of stream here too */
        return ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING ? 1 : -1;
    default:
        return -1;
    }
}

static void s_handover(s_loop_t *lp, s_conn_t *c)
{
    kb_listener_t *l = lp->l;
    char id[256];
    int idrc = kb_tls_peer_identity(c->ssl, id, sizeof id);
    if (idrc == -EINVAL) {
        krt_log(KRT_LOG_WARN, LOG_PATH, "tls_client_refused",
                "reason=\"the client certificate has no usable subject CN\"");
        kb_listener_count(l, &l->stats.tls_failed, 1);
        s_close(lp, c);
        return;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) {
        krt_log(KRT_LOG_WARN, LOG_PATH, "socketpair_failed", "errno=%d", errno);
        s_close(lp, c);
        return;
    }
    int sz = S_APP_SNDBUF;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    c->app = sv[0];
    c->handed = sv[1];
    c->relaying = true;
    s_unlink(&lp->timed, c);
    c->timed = false;
    c->deadline_ms = 0;
    s_append(&lp->live, c);
    if (s_epoll(lp, EPOLL_CTL_ADD, c->app, 0, &c->app_tag)) {
        close(c->handed);
        c->handed = -1;
        s_close(lp, c);
        return;
    }
    if (l->opts.ids && kb_conn_ids_set(l->opts.ids, c->handed, idrc == 0 ? id : NULL))
        idrc = -ENOMEM;
    if (idrc == 0)
        krt_log(KRT_LOG_DEBUG, LOG_PATH, "tls_client", "identity=\"%s\"", id);
    const unsigned char *alpn = NULL;
    unsigned alen = 0;
    SSL_get0_alpn_selected(c->ssl, &alpn, &alen);
    bool h2 = alen == 2 && memcmp(alpn, "h2", 2) == 0;
    kb_listener_count(l, h2 ? &l->stats.to_grpc : &l->stats.to_http, 1);
    (h2 ? l->opts.on_grpc : l->opts.on_http)(c->handed, (struct sockaddr *)&c->peer, c->peer_len,
                                             l->opts.arg);
}

static void s_handshake(s_loop_t *lp, s_conn_t *c)
{
    c->want_in = c->want_out = false;
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    if (r == 1) {
        s_handover(lp, c);
        return;
    }
    if (s_tls_wait(c, r) != 0) {
        char why[200] = "connection closed";
        unsigned long e = ERR_peek_last_error();
        if (e)
            ERR_error_string_n(e, why, sizeof why);
        ERR_clear_error();
        s_fail_handshake(lp, c, why);
    }
}

/* ---- the relay ---------------------------------------------------------------------------- */

/* One round of every transfer that can make progress: 1 if something moved, 0 if all wait,
 * -1 if the connection is over (closed). */
static int s_round(s_loop_t *lp, s_conn_t *c)
{
    int moved = 0;
    c->want_in = c->want_out = false;
    if (c->down_len) { /* decrypted bytes -> app */
        ssize_t w = send(c->app, c->down + c->down_off, c->down_len, MSG_NOSIGNAL);
        if (w > 0) {
            c->down_off += (size_t)w;
            c->down_len -= (size_t)w;
            moved = 1;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return -1; /* the app is gone: nothing more can be delivered */
        }
    }
    if (!c->down_len && !c->net_eof) { /* net -> down, only into an empty buffer */
        ERR_clear_error();
        int r = SSL_read(c->ssl, c->down, S_BUF);
        if (r > 0) {
            c->down_off = 0;
            c->down_len = (size_t)r;
            moved = 1;
        } else {
            int w = s_tls_wait(c, r);
            if (w < 0)
                return -1;
            c->net_eof = w == 1;
            moved |= w;
        }
    }
    if (c->up_len) { /* app bytes -> TLS records */
        ERR_clear_error();
        int r = SSL_write(c->ssl, c->up + c->up_off, (int)c->up_len);
        if (r > 0) {
            c->up_off += (size_t)r;
            c->up_len -= (size_t)r;
            moved = 1;
        } else if (s_tls_wait(c, r) != 0) {
            return -1;
        }
    }
    if (!c->up_len && !c->app_eof) { /* app -> up, only into an empty buffer */
        ssize_t n = recv(c->app, c->up, S_BUF, 0);
        if (n > 0) {
            c->up_off = 0;
            c->up_len = (size_t)n;
            moved = 1;
        } else if (n == 0) {
            c->app_eof = true;
            moved = 1;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            return -1;
        }
    }
    return moved;
}

/* Passes each side's end on to the other; 1 when the connection is finished. */
static int s_ends(s_loop_t *lp, s_conn_t *c)
{
    if (c->net_eof && !c->down_len && !c->app_shut) {
        shutdown(c->app, SHUT_WR);
        c->app_shut = true;
    }
    if (c->app_eof && !c->up_len && !c->tls_shut) {
        ERR_clear_error();
        SSL_shutdown(c->ssl); /* close_notify; the peer's answer is not awaited */
        ERR_clear_error();
        c->tls_shut = true;
    }
    if (c->tls_shut && (c->net_eof || c->app_gone))
        return 1;
    if ((c->app_eof || c->net_eof) && !c->timed)
        s_time(lp, c); /* half closed: the other side gets the timeout to finish */
    return 0;
}

static void s_interest(s_loop_t *lp, s_conn_t *c)
{
    uint32_t net = (c->want_in ? EPOLLIN : 0) | (c->want_out ? EPOLLOUT : 0);
    uint32_t app = (!c->up_len && !c->app_eof ? EPOLLIN : 0) | (c->down_len ? EPOLLOUT : 0);
    if (net != c->net_ev && !s_epoll(lp, EPOLL_CTL_MOD, c->net, net, &c->net_tag))
        c->net_ev = net;
    if (!c->relaying)
        return;
    if (c->app_gone && c->app_ev != UINT32_MAX) { /* a gone app reports EPOLLHUP for ever */
        epoll_ctl(lp->ep, EPOLL_CTL_DEL, c->app, NULL);
        c->app_ev = UINT32_MAX;
    } else if (!c->app_gone && app != c->app_ev &&
               !s_epoll(lp, EPOLL_CTL_MOD, c->app, app, &c->app_tag)) {
        c->app_ev = app;
    }
}

static void s_pump(s_loop_t *lp, s_conn_t *c)
{
    int r;
    while ((r = s_round(lp, c)) > 0)
        ;
    if (r < 0 || s_ends(lp, c))
        s_close(lp, c);
}

static void s_event(s_loop_t *lp, const s_tag_t *tag, uint32_t ev)
{
    s_conn_t *c = tag->c;
    if (c->dead)
        return;
    if (tag->kind == S_TAG_NET && (ev & (EPOLLHUP | EPOLLERR))) {
        if (!c->relaying)
            s_fail_handshake(lp, c, "connection reset");
        else
            s_close(lp, c); /* reset, or shut both ways: the peer can receive nothing more */
        return;
    }
    if (tag->kind == S_TAG_APP && (ev & (EPOLLHUP | EPOLLERR)))
        c->app_gone = true;
    if (!c->relaying)
        s_handshake(lp, c);
    if (!c->dead && c->relaying) /* right after the handshake too: TLS may hold early data */
        s_pump(lp, c);
    if (!c->dead)
        s_interest(lp, c);
}

/* Closes connections past their deadline; the milliseconds until the next one (or -1). */
static int s_expire(s_loop_t *lp)
{
    int64_t now = kb_listener_now_ms();
    while (lp->timed.head && lp->timed.head->deadline_ms <= now) {
        s_conn_t *c = lp->timed.head;
        if (!c->relaying) {
            kb_listener_count(lp->l, &lp->l->stats.timed_out, 1);
            s_fail_handshake(lp, c, "handshake timed out");
        } else {
            s_close(lp, c);
        }
    }
    s_reap(lp);
    return lp->timed.head ? (int)(lp->timed.head->deadline_ms - now) + 1 : -1;
}

static void s_close_all(s_loop_t *lp, s_list_t *ls)
{
    while (ls->head)
        s_close(lp, ls->head);
}

void kb_listener_tls_loop(kb_listener_t *l)
{
    /* OpenSSL writes with write(2): a peer gone must be EPIPE here, not a process-wide SIGPIPE */
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, NULL);
    s_loop_t lp = {.l = l, .ep = epoll_create1(EPOLL_CLOEXEC)};
    lp.wake_tag.kind = S_TAG_WAKE;
    lp.accept_tag.kind = S_TAG_ACCEPT;
    if (lp.ep < 0 || s_epoll(&lp, EPOLL_CTL_ADD, l->wake[0], EPOLLIN, &lp.wake_tag) ||
        s_epoll(&lp, EPOLL_CTL_ADD, l->lfd, EPOLLIN, &lp.accept_tag)) {
        krt_log(KRT_LOG_ERROR, LOG_PATH, "epoll_failed", "errno=%d", errno);
        if (lp.ep >= 0)
            close(lp.ep);
        return;
    }
    struct epoll_event evs[S_EVENTS];
    for (bool stop = false; !stop;) {
        int n = epoll_wait(lp.ep, evs, S_EVENTS, s_expire(&lp));
        if (n < 0 && errno != EINTR) {
            krt_log(KRT_LOG_ERROR, LOG_PATH, "epoll_failed", "errno=%d", errno);
            break;
        }
        for (int i = 0; i < n && !stop; i++) {
            const s_tag_t *tag = evs[i].data.ptr;
            if (tag->kind == S_TAG_WAKE)
                stop = true;
            else if (tag->kind == S_TAG_ACCEPT)
                s_accept_all(&lp);
            else
                s_event(&lp, tag, evs[i].events);
        }
        s_reap(&lp);
    }
    s_close_all(&lp, &lp.timed);
    s_close_all(&lp, &lp.live);
    s_reap(&lp);
    close(lp.ep);
}
