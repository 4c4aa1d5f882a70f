/*
 * kb_rpc: the CLI's gRPC calls on its own HTTP/2 client (h2.c, hpack.c) over a plain or TLS
 * (tls_client.c) socket. See rpc.h.
 *
 * No gRPC library: the kagent process links none, so it starts in about a millisecond. One
 * connection per client, opened by the first call (and again by the next call after it broke);
 * calls run one at a time, each on its own stream. Waiting is poll(2) in slices of S_POLL_MS
 * that look at the interrupt flag and the command's deadline.
 */
#include "rpc.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "h2.h"
#include "tls_client.h"

#define S_MAX_RECV   (80 << 20) /* above the 64 MiB transfer cap; tree JSON can be big */
#define S_POLL_MS    100        /* how often a blocked call looks at the interrupt flag */
#define S_TARGET_CAP 512
#define S_READ_CHUNK ((size_t)256 << 10)
#define S_OUT_HIGH   ((size_t)1 << 20) /* queued output above which a sender waits for the socket */
#define S_MSG_HEAD   5                 /* gRPC message prefix: compressed flag, 32-bit length */

/* gRPC status codes. */
enum {
    S_OK = 0,
    S_CANCELLED = 1,
    S_UNKNOWN = 2,
    S_DEADLINE_EXCEEDED = 4,
    S_PERMISSION_DENIED = 7,
    S_RESOURCE_EXHAUSTED = 8,
    S_UNIMPLEMENTED = KB_RPC_UNIMPLEMENTED,
    S_INTERNAL = 13,
    S_UNAVAILABLE = 14,
    S_DATA_LOSS = 15,
    S_UNAUTHENTICATED = 16,
};

static volatile sig_atomic_t s_interrupted;

struct kb_rpc {
    char *target; /* host:port, as given (IPv6 in brackets): :authority and messages */
    char *host;   /* without brackets */
    char *port;
    bool tls;
    char *ca_file;
    char *cert_file;
    char *key_file;
    char *tls_name; /* the name the certificate must match */
    char *user_id;
    char *auth;          /* "Bearer <token>" or NULL */
    int64_t deadline_ns; /* CLOCK_MONOTONIC; 0 = none */
    FILE *trace;         /* borrowed; NULL = no tracing */
    /* The connection: fd -1 until the first call. */
    int fd;
    kb_tls_t *ssl;
    kb_h2_t *h2;
    int dead_code; /* non-zero: the connection broke; the status a call on it gets */
    char dead[KB_RPC_MSG_CAP];
    uint8_t *rbuf;
};

struct kb_rpc_call {
    kb_rpc_t *rpc;
    kb_h2_t *h2;  /* the connection the call runs on */
    uint32_t sid; /* its stream; 0 if it never started */
    bool done;    /* st holds the outcome */
    bool half_closed;
    kb_rpc_status_t st;
    char method[128]; /* for tracing */
    int64_t started;
};

/* ------------------------------------------------------------------------------------------ */

void kb_rpc_interrupt(void)
{
    s_interrupted = 1;
}

void kb_rpc_reset_interrupt(void)
{
    s_interrupted = 0;
}

/* The Go-style name of a status code ("NotFound", "DeadlineExceeded"). */
static const char *s_rpc_code_name(int code)
{
    static const char *const names[] = {
        "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
        "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
        "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
        "DataLoss", "Unauthenticated"};
    if (code >= 0 && code < (int)(sizeof names / sizeof names[0]))
        return names[code];
    return "Unknown";
}

void kb_rpc_format_error(const kb_rpc_status_t *st, char *buf, size_t cap)
{
    snprintf(buf, cap, "rpc error: code = %s desc = %s", s_rpc_code_name(st->code), st->message);
}

bool kb_rpc_outcome_unknown(const kb_rpc_status_t *st)
{
    if (st->unsent)
        return false;
    switch (st->code) {
    case S_UNAVAILABLE:
    case S_DEADLINE_EXCEEDED:
    case S_CANCELLED:
    case S_UNKNOWN:
    case S_INTERNAL:
    case S_DATA_LOSS:
        return true;
    default:
        return false;
    }
}

static void s_status(kb_rpc_status_t *st, int code, const char *msg)
{
    if (!st)
        return;
    st->code = code;
    st->unsent = false;
    size_t n = strlen(msg);
    if (n >= sizeof st->message)
        n = sizeof st->message - 1; /* longer texts are cut */
    memcpy(st->message, msg, n);
    st->message[n] = '\0';
}

static int64_t s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------------ */
/* Client                                                                                     */

/* Splits "http[s]://host:port[/...]" into target "host:port" (default port 80/443). */
static int s_parse_url(const char *url, char *target, size_t cap, bool *tls)
{
    const char *rest;
    if (strncmp(url, "http://", 7) == 0) {
        rest = url + 7;
        *tls = false;
    } else if (strncmp(url, "https://", 8) == 0) {
        rest = url + 8;
        *tls = true;
    } else {
        return -EINVAL;
    }
    size_t n = strcspn(rest, "/?#");
    if (n == 0 || n >= cap - 8)
        return -EINVAL;
    memcpy(target, rest, n);
    target[n] = '\0';
    /* A port is present unless the authority ends in a host (or a bracketed IPv6 host). */
    const char *colon = strrchr(target, ':');
    const char *bracket = strrchr(target, ']');
    if (!colon || (bracket && bracket > colon))
        snprintf(target + n, cap - n, ":%d", *tls ? 443 : 80);
    return 0;
}

/* target "host:port" or "[v6]:port" into host (no brackets) and port; -EINVAL if malformed. */
static int s_split_target(kb_rpc_t *self, const char *target)
{
    const char *colon = strrchr(target, ':');
    size_t hl = (size_t)(colon - target);
    const char *h = target;
    if (target[0] == '[') {
        if (hl < 2 || target[hl - 1] != ']')
            return -EINVAL;
        h++;
        hl -= 2;
    }
    if (hl == 0 || !colon[1])
        return -EINVAL;
    self->host = strndup(h, hl);
    self->port = strdup(colon + 1);
    return self->host && self->port ? 0 : -ENOMEM;
}

static bool s_set(const char *s)
{
    return s && *s;
}

/* A readable file named by a flag: 0, or -1 with err set. */
static int s_check_file(const char *flag, const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        return 0;
    }
    snprintf(err, cap, "read --%s %s: %s", flag, path, strerror(errno));
    return -1;
}

/* The TLS flags: only with https://, a certificate with its key, every file readable, and
 * OpenSSL loadable. 0, or -1 with err set. */
static int s_check_tls(const kb_rpc_opts_t *o, bool tls, char *err, size_t cap)
{
    bool pair = s_set(o->cert_file) || s_set(o->key_file);
    if (!tls && (pair || s_set(o->ca_file))) {
        snprintf(err, cap, "--ca-file, --cert-file and --key-file need an https:// --api-url");
        return -1;
    }
    if (!tls)
        return 0;
    if (pair && !(s_set(o->cert_file) && s_set(o->key_file))) {
        snprintf(err, cap, "--cert-file and --key-file go together");
        return -1;
    }
    if ((s_set(o->ca_file) && s_check_file("ca-file", o->ca_file, err, cap)) ||
        (pair && (s_check_file("cert-file", o->cert_file, err, cap) ||
                  s_check_file("key-file", o->key_file, err, cap))))
        return -1;
    return kb_tls_load(err, cap) == 0 ? 0 : -1;
}

static char *s_dup(const char *s)
{
    return strdup(s ? s : "");
}

kb_rpc_t *kb_rpc_new(const kb_rpc_opts_t *o, char *err, size_t errcap)
{
    char target[S_TARGET_CAP];
    bool tls = false;
    if (!o->api_url || s_parse_url(o->api_url, target, sizeof target, &tls) != 0) {
        snprintf(err, errcap,
                 "invalid --api-url \"%s\": want http://HOST:PORT or https://HOST:PORT",
                 o->api_url ? o->api_url : "");
        return NULL;
    }
    if (s_check_tls(o, tls, err, errcap) != 0)
        return NULL;
    kb_rpc_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errcap, "out of memory");
        return NULL;
    }
    self->fd = -1;
    self->tls = tls;
    self->target = strdup(target);
    self->user_id = s_dup(o->user_id);
    self->ca_file = s_dup(o->ca_file);
    self->cert_file = s_dup(o->cert_file);
    self->key_file = s_dup(o->key_file);
    self->rbuf = malloc(S_READ_CHUNK);
    if (o->token && *o->token && asprintf(&self->auth, "Bearer %s", o->token) < 0)
        self->auth = NULL;
    self->trace = o->trace;
    if (o->timeout_ms > 0)
        self->deadline_ns = s_now() + o->timeout_ms * 1000000;
    int rc = self->target ? s_split_target(self, target) : -ENOMEM;
    if (rc == 0)
        self->tls_name = s_dup(s_set(o->server_name) ? o->server_name : self->host);
    if (rc || !self->user_id || !self->ca_file || !self->cert_file || !self->key_file ||
        !self->rbuf || !self->tls_name) {
        snprintf(err, errcap,
                 rc == -EINVAL ? "invalid --api-url \"%s\": want http://HOST:PORT or "
                                 "https://HOST:PORT"
                               : "out of memory (%s)",
                 o->api_url);
        kb_rpc_destroy(&self);
        return NULL;
    }
    return self;
}

static void s_disconnect(kb_rpc_t *r)
{
    kb_tls_destroy(&r->ssl);
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    kb_h2_destroy(&r->h2);
    r->dead_code = 0;
    r->dead[0] = '\0';
}

void kb_rpc_destroy(kb_rpc_t **p)
{
    kb_rpc_t *self = *p;
    if (!self)
        return;
    s_disconnect(self);
    free(self->target);
    free(self->host);
    free(self->port);
    free(self->ca_file);
    free(self->cert_file);
    free(self->key_file);
    free(self->tls_name);
    free(self->user_id);
    free(self->auth);
    free(self->rbuf);
    free(self);
    *p = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Connection                                                                                 */

/* Waits up to one slice for events on the socket: the revents (0 when the slice passed),
 * -ECANCELED once interrupted, -ETIMEDOUT past the deadline, or -errno. */
/* -ECANCELED once interrupted, -ETIMEDOUT past the deadline, else 0; *ms is cut to what is
 * left of the deadline. */
static int s_expired(const kb_rpc_t *r, int *ms)
{
    if (s_interrupted)
        return -ECANCELED;
    if (r->deadline_ns) {
        int64_t left = r->deadline_ns - s_now();
        if (left <= 0)
            return -ETIMEDOUT;
        if (left / 1000000 + 1 < *ms)
            *ms = (int)(left / 1000000 + 1);
    }
    return 0;
}

static int s_poll(kb_rpc_t *r, short events, int ms)
{
    int rc = s_expired(r, &ms);
    if (rc)
        return rc;
    struct pollfd pfd = {.fd = r->fd, .events = events};
    int n = poll(&pfd, 1, ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    return n ? pfd.revents : 0;
}

/* Waits until the socket is ready for events (a whole wait, in slices). */
static int s_wait_ready(kb_rpc_t *r, short events)
{
    int rc;
    while ((rc = s_poll(r, events, S_POLL_MS)) == 0)
        ;
    return rc < 0 ? rc : 0;
}

static int s_connect_addr(kb_rpc_t *r, const struct addrinfo *ai)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    r->fd = fd;
    int rc = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        rc = errno == EINPROGRESS ? s_wait_ready(r, POLLOUT) : -errno;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr)
            rc = -soerr;
    }
    if (rc) {
        close(fd);
        r->fd = -1;
    }
    return rc;
}

/* A status for a wait that ended with rc (-ECANCELED, -ETIMEDOUT or another -errno). */
static void s_wait_status(kb_rpc_status_t *st, int rc, const char *what, const char *target)
{
    char msg[KB_RPC_MSG_CAP];
    if (rc == -ECANCELED)
        s_status(st, S_CANCELLED, "interrupted");
    else if (rc == -ETIMEDOUT)
        s_status(st, S_DEADLINE_EXCEEDED, "context deadline exceeded");
    else {
        snprintf(msg, sizeof msg, "%s %s: %s", what, target, strerror(-rc));
        s_status(st, S_UNAVAILABLE, msg);
    }
}

static int s_handshake(kb_rpc_t *r, kb_rpc_status_t *st)
{
    char err[KB_RPC_MSG_CAP] = "", msg[KB_RPC_MSG_CAP + 64];
    kb_tls_opts_t o = {.ca_file = r->ca_file,
                       .cert_file = r->cert_file,
                       .key_file = r->key_file,
                       .name = r->tls_name};
    r->ssl = kb_tls_new(&o, r->fd, err, sizeof err);
    int rc = r->ssl ? -EAGAIN : -EPROTO;
    while (rc == -EAGAIN && (rc = kb_tls_handshake(r->ssl, err, sizeof err)) == -EAGAIN) {
        int w = s_wait_ready(r, kb_tls_want(r->ssl));
        if (w) {
            s_wait_status(st, w, "TLS handshake with", r->target);
            return w;
        }
    }
    if (rc) {
        snprintf(msg, sizeof msg, "%s: %s", r->target, err);
        s_status(st, S_UNAVAILABLE, msg);
    }
    return rc;
}

/* Connects (TCP, then TLS) and queues the HTTP/2 preface. 0, or -1 with st set. */
static int s_connect(kb_rpc_t *r, kb_rpc_status_t *st)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int g = getaddrinfo(r->host, r->port, &hints, &res);
    if (g != 0) {
        char msg[KB_RPC_MSG_CAP];
        snprintf(msg, sizeof msg, "resolve %s: %s", r->host, gai_strerror(g));
        s_status(st, S_UNAVAILABLE, msg);
        return -1;
    }
    int rc = -ENOENT;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = s_connect_addr(r, ai);
        if (rc == 0 || rc == -ECANCELED || rc == -ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (rc) {
        s_wait_status(st, rc, "connect to", r->target);
        return -1;
    }
    if (r->tls && s_handshake(r, st) != 0) {
        s_disconnect(r);
        return -1;
    }
    if (!(r->h2 = kb_h2_new())) {
        s_status(st, S_RESOURCE_EXHAUSTED, "out of memory");
        s_disconnect(r);
        return -1;
    }
    return 0;
}

/* Marks the connection broken by rc (from the socket or the session). */
static void s_break(kb_rpc_t *r, int rc)
{
    if (r->dead_code)
        return;
    r->dead_code = S_UNAVAILABLE;
    if (rc == -EPROTONOSUPPORT)
        snprintf(r->dead, sizeof r->dead, "%s does not speak HTTP/2: %s", r->target,
                 kb_h2_error(r->h2));
    else if (rc == -EPROTO) {
        r->dead_code = S_INTERNAL;
        snprintf(r->dead, sizeof r->dead, "bad HTTP/2 from %s: %s", r->target, kb_h2_error(r->h2));
    } else if (rc == -ENOTCONN)
        snprintf(r->dead, sizeof r->dead, "connection to %s closed by the server", r->target);
    else
        snprintf(r->dead, sizeof r->dead, "connection to %s: %s", r->target, strerror(-rc));
}

/* Writes what the session queued, as far as the socket takes it. 0 or -errno. */
static int s_flush(kb_rpc_t *r)
{
    for (;;) {
        size_t n;
        const uint8_t *p = kb_h2_out(r->h2, &n);
        if (!n)
            return 0;
        ssize_t w = r->ssl ? kb_tls_write(r->ssl, p, n) : send(r->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && !r->ssl)
            w = errno == EAGAIN ? -EAGAIN : errno == EINTR ? 0 : -errno;
        if (w == -EAGAIN)
            return 0;
        if (w < 0)
            return (int)w;
        kb_h2_sent(r->h2, (size_t)w);
    }
}

/* Reads what has arrived and feeds it to the session. 0, -ENOTCONN at the end of the stream,
 * the session's error, or -errno. */
static int s_fill(kb_rpc_t *r)
{
    for (;;) {
        ssize_t n = r->ssl ? kb_tls_read(r->ssl, r->rbuf, S_READ_CHUNK)
                           : recv(r->fd, r->rbuf, S_READ_CHUNK, 0);
        if (n < 0 && !r->ssl)
            n = errno == EAGAIN || errno == EINTR ? -EAGAIN : -errno;
        if (n == -EAGAIN)
            return 0;
        if (n <= 0)
            return n ? (int)n : -ENOTCONN;
        int rc = kb_h2_feed(r->h2, r->rbuf, (size_t)n);
        if (rc)
            return rc;
        if ((size_t)n < S_READ_CHUNK && !(r->ssl && kb_tls_pending(r->ssl)))
            return 0;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Calls                                                                                      */

/* The call's stream, or NULL once it is gone (reset by us, or the connection replaced). */
static kb_h2_stream_t *s_stream(kb_rpc_call_t *c)
{
    kb_rpc_t *r = c->rpc;
    if (!c->sid || r->h2 != c->h2)
        return NULL;
    kb_h2_stream_t *st = kb_h2_stream(r->h2);
    return st->id == c->sid ? st : NULL;
}

static bool s_over(const kb_h2_stream_t *st)
{
    return st->reset || st->remote_closed;
}

/* Ends the call with a status of ours, resetting its stream (CANCEL) if still open. */
static void s_abort(kb_rpc_call_t *c, int code, const char *msg)
{
    s_status(&c->st, code, msg);
    c->done = true;
    if (s_stream(c)) {
        kb_h2_close_stream(c->rpc->h2, KB_H2_CANCEL);
        s_flush(c->rpc);
    }
}

/* One round of waiting on the call's connection: flush, wait up to ms, read. 0, or -1 when the
 * call has ended with a status (interrupted, past the deadline, connection broken while the
 * stream was open). */
static int s_step_in(kb_rpc_call_t *c, int ms)
{
    kb_rpc_t *r = c->rpc;
    kb_h2_stream_t *st = s_stream(c);
    if (!st || r->dead_code) {
        if (st && s_over(st))
            return 0;
        s_abort(c, r->dead_code ? r->dead_code : S_INTERNAL,
                r->dead_code ? r->dead : "the call lost its stream");
        return -1;
    }
    int rc = s_flush(r);
    if (rc == 0) {
        size_t out;
        kb_h2_out(r->h2, &out);
        short ev = POLLIN;
        if (out || (r->ssl && kb_tls_want(r->ssl) == POLLOUT))
            ev |= POLLOUT;
        int pr, none = 0;
        if (r->ssl && kb_tls_pending(r->ssl)) { /* decrypted bytes wait: read them */
            pr = s_expired(r, &none);
            pr = pr ? pr : POLLIN;
        } else {
            pr = s_poll(r, ev, ms);
        }
        if (pr == -ECANCELED || pr == -ETIMEDOUT) {
            kb_rpc_status_t ws;
            s_wait_status(&ws, pr, "", "");
            s_abort(c, ws.code, ws.message);
            return -1;
        }
        rc = pr < 0 ? pr : pr & (POLLIN | POLLHUP | POLLERR) ? s_fill(r) : 0;
    }
    if (rc) {
        s_break(r, rc);
        s_flush(r); /* a GOAWAY the session queued, if the socket still takes it */
        return s_step_in(c, ms);
    }
    return 0;
}

/* A slice of waiting. */
static int s_step(kb_rpc_call_t *c)
{
    return s_step_in(c, S_POLL_MS);
}

/* The gRPC status for HTTP status without grpc-status (gRPC's http-grpc-status-mapping). */
static int s_http_code(int http)
{
    switch (http) {
    case 400:
        return S_INTERNAL;
    case 401:
        return S_UNAUTHENTICATED;
    case 403:
        return S_PERMISSION_DENIED;
    case 404:
        return S_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
        return S_UNAVAILABLE;
    default:
        return S_UNKNOWN;
    }
}

static int s_reset_code(uint32_t h2_code)
{
    switch (h2_code) {
    case KB_H2_REFUSED_STREAM:
        return S_UNAVAILABLE;
    case KB_H2_CANCEL:
        return S_CANCELLED;
    case KB_H2_ENHANCE_YOUR_CALM:
        return S_RESOURCE_EXHAUSTED;
    case KB_H2_INADEQUATE_SECURITY:
        return S_PERMISSION_DENIED;
    default:
        return S_INTERNAL;
    }
}

/* The outcome of a stream that is over. */
static void s_final(const kb_h2_stream_t *st, kb_rpc_status_t *out)
{
    char msg[KB_RPC_MSG_CAP];
    if (st->got_trailers && st->grpc_status >= 0) {
        s_status(out, st->grpc_status, st->grpc_message);
    } else if (st->reset) {
        snprintf(msg, sizeof msg, "stream reset by the server (HTTP/2 error code %u)",
                 st->reset_code);
        s_status(out, s_reset_code(st->reset_code), st->error[0] ? st->error : msg);
        /* REFUSED_STREAM (or a GOAWAY below it) means no processing began (RFC 9113 8.7) */
        out->unsent = st->reset_code == KB_H2_REFUSED_STREAM;
    } else if (st->http_status != 200) {
        snprintf(msg, sizeof msg, "HTTP status %d from the server", st->http_status);
        s_status(out, s_http_code(st->http_status), msg);
    } else if (!st->grpc_content_type) {
        s_status(out, S_UNKNOWN, "the server's answer is not gRPC (content-type)");
    } else {
        s_status(out, st->got_trailers ? S_UNKNOWN : S_INTERNAL,
                 st->got_trailers ? "the server sent no grpc-status"
                                  : "the stream ended without trailers");
    }
}

/* Takes the next whole message off the stream: 1 with *msg, 0 when none is complete yet, -1
 * when the call ended (a bad or oversized message). */
static int s_next_msg(kb_rpc_call_t *c, kb_h2_stream_t *st, const ProtobufCMessageDescriptor *desc,
                      ProtobufCMessage **msg)
{
    if (st->data_len < S_MSG_HEAD)
        return 0;
    const uint8_t *d = st->data;
    uint32_t len = (uint32_t)d[1] << 24 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 8 | d[4];
    char text[KB_RPC_MSG_CAP];
    if (d[0] != 0) {
        s_abort(c, S_INTERNAL, "compressed message although none was offered");
        return -1;
    }
    if (len > S_MAX_RECV) {
        snprintf(text, sizeof text, "received message larger than max (%u vs. %d)", len,
                 S_MAX_RECV);
        s_abort(c, S_RESOURCE_EXHAUSTED, text);
        return -1;
    }
    if (st->data_len - S_MSG_HEAD < len)
        return 0;
    *msg = protobuf_c_message_unpack(desc, NULL, len, d + S_MSG_HEAD);
    kb_h2_take(c->rpc->h2, S_MSG_HEAD + len);
    if (!*msg) {
        s_abort(c, S_INTERNAL, "cannot parse a response message");
        return -1;
    }
    return 1;
}

/* Sends n bytes as DATA (end: and closes our side), waiting for flow-control credit and for
 * the socket when much is queued. 0, or -EPIPE when the call or its stream is over. */
static int s_send(kb_rpc_call_t *c, const uint8_t *p, size_t n, bool end)
{
    kb_rpc_t *r = c->rpc;
    size_t at = 0;
    do {
        kb_h2_stream_t *st = c->done ? NULL : s_stream(c);
        if (!st || s_over(st))
            return -EPIPE;
        size_t room = kb_h2_send_room(r->h2), out;
        if (room == 0 && n > at) {
            if (s_step(c) != 0)
                return -EPIPE;
            continue;
        }
        size_t chunk = n - at < room ? n - at : room;
        if (kb_h2_data(r->h2, p + at, chunk, end && at + chunk == n) != 0)
            return -EPIPE;
        at += chunk;
        while (kb_h2_out(r->h2, &out) && out > S_OUT_HIGH)
            if (s_step(c) != 0)
                return -EPIPE;
    } while (at < n);
    return 0;
}

/* A message with its gRPC prefix (caller frees), or NULL. */
static uint8_t *s_pack(const ProtobufCMessage *msg, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *b = malloc(S_MSG_HEAD + n);
    if (!b)
        return NULL;
    b[0] = 0;
    b[1] = (uint8_t)(n >> 24);
    b[2] = (uint8_t)(n >> 16);
    b[3] = (uint8_t)(n >> 8);
    b[4] = (uint8_t)n;
    protobuf_c_message_pack(msg, b + S_MSG_HEAD);
    *len = S_MSG_HEAD + n;
    return b;
}

static int s_send_msg(kb_rpc_call_t *c, const ProtobufCMessage *msg, bool end)
{
    size_t n;
    uint8_t *b = s_pack(msg, &n);
    if (!b) {
        s_abort(c, S_RESOURCE_EXHAUSTED, "out of memory");
        return -EPIPE;
    }
    int rc = s_send(c, b, n, end);
    free(b);
    return rc;
}

/* grpc-timeout for what is left of the deadline ("<n>m", or seconds when large). */
static void s_timeout_header(const kb_rpc_t *r, char *buf, size_t cap)
{
    int64_t ms = (r->deadline_ns - s_now()) / 1000000;
    if (ms < 1)
        ms = 1;
    if (ms < 100000000)
        snprintf(buf, cap, "%lldm", (long long)ms);
    else
        snprintf(buf, cap, "%lldS", (long long)(ms / 1000 < 99999999 ? ms / 1000 : 99999999));
}

/* Opens the call's stream with its headers on a working connection. */
static int s_open_stream(kb_rpc_call_t *c, const char *method, const char *sandbox_id)
{
    kb_rpc_t *r = c->rpc;
    char timeout[32];
    kb_h2_header_t h[12] = {
        {":method", "POST"},
        {":scheme", r->tls ? "https" : "http"},
        {":path", method},
        {":authority", r->target},
        {"te", "trailers"},
        {"content-type", "application/grpc"},
        {"user-agent", "kagent-cli"},
    };
    size_t n = 7;
    if (r->deadline_ns) {
        s_timeout_header(r, timeout, sizeof timeout);
        h[n++] = (kb_h2_header_t){"grpc-timeout", timeout};
    }
    if (r->user_id[0])
        h[n++] = (kb_h2_header_t){"x-user-id", r->user_id};
    if (r->auth)
        h[n++] = (kb_h2_header_t){"authorization", r->auth};
    if (sandbox_id)
        h[n++] = (kb_h2_header_t){"kagent-sandbox-id", sandbox_id};
    int rc = kb_h2_open(r->h2, h, n, false);
    if (rc) {
        s_abort(c, rc == -E2BIG ? S_INTERNAL : S_UNAVAILABLE,
                rc == -E2BIG ? "request headers too large" : "cannot open a stream");
        return -1;
    }
    c->h2 = r->h2;
    c->sid = kb_h2_stream(r->h2)->id;
    return 0;
}

/* Starts a call: connects if needed, opens the stream and sends req (and half-closes) when
 * non-NULL. A call that could not start comes back done, with its status, like one that failed
 * later. NULL only without memory (st set). */
static kb_rpc_call_t *s_start(kb_rpc_t *r, const char *method, const char *sandbox_id,
                              const ProtobufCMessage *req, kb_rpc_status_t *st)
{
    kb_rpc_call_t *c = calloc(1, sizeof *c);
    if (!c) {
        s_status(st, S_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->rpc = r;
    c->started = s_now();
    snprintf(c->method, sizeof c->method, "%s", method);
    uint32_t last, code;
    if (r->h2 && (r->dead_code || kb_h2_goaway(r->h2, &last, &code)))
        s_disconnect(r);
    if (s_interrupted)
        s_abort(c, S_CANCELLED, "interrupted");
    else if (r->deadline_ns && s_now() >= r->deadline_ns)
        s_abort(c, S_DEADLINE_EXCEEDED, "context deadline exceeded");
    else if (!r->h2 && s_connect(r, &c->st) != 0)
        c->done = true;
    else if (s_open_stream(c, method, sandbox_id) == 0 && req) {
        c->half_closed = true;
        s_send_msg(c, req, true);
    }
    if (!c->sid)
        c->st.unsent = true; /* ended before its stream opened: nothing was sent */
    return c;
}

kb_rpc_call_t *kb_rpc_server_stream(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                                    const ProtobufCMessage *req, kb_rpc_status_t *st)
{
    return s_start(rpc, method, sandbox_id, req, st);
}

kb_rpc_call_t *kb_rpc_client_stream(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                                    kb_rpc_status_t *st)
{
    return s_start(rpc, method, sandbox_id, NULL, st);
}

/* Waits for the next message: 1 with *msg, 0 at a clean end of the stream, -1 if the call
 * ended otherwise (c->done then, or the stream reset: see s_final). */
static int s_read(kb_rpc_call_t *c, const ProtobufCMessageDescriptor *desc, ProtobufCMessage **msg)
{
    for (;;) {
        kb_h2_stream_t *st = c->done ? NULL : s_stream(c);
        if (!st)
            return -1;
        int rc = s_next_msg(c, st, desc, msg);
        if (rc)
            return rc;
        /* trailers end the stream even if RST_STREAM(NO_ERROR) followed them */
        if (st->got_trailers || (st->remote_closed && !st->reset)) {
            if (st->data_len == 0)
                return 0;
            s_abort(c, S_INTERNAL, "the stream ended inside a message");
            return -1;
        }
        if (st->reset)
            return -1;
        if (s_step(c) != 0)
            return -1;
    }
}

int kb_rpc_call_read(kb_rpc_call_t *c, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **msg)
{
    *msg = NULL;
    int rc = s_read(c, desc, msg);
    return rc >= 0 ? rc : -EIO;
}

int kb_rpc_call_fd(const kb_rpc_call_t *c)
{
    return c->rpc->fd;
}

short kb_rpc_call_events(const kb_rpc_call_t *c)
{
    kb_rpc_t *r = c->rpc;
    size_t out = 0;
    if (r->h2)
        kb_h2_out(r->h2, &out);
    bool w = out || (r->ssl && kb_tls_want(r->ssl) == POLLOUT);
    return (short)(POLLIN | (w ? POLLOUT : 0));
}

int kb_rpc_call_poll(kb_rpc_call_t *c, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **msg)
{
    *msg = NULL;
    for (int round = 0; round < 2; round++) {
        kb_h2_stream_t *st = c->done ? NULL : s_stream(c);
        if (!st)
            return -EIO;
        int rc = s_next_msg(c, st, desc, msg);
        if (rc)
            return rc > 0 ? 1 : -EIO;
        if (st->got_trailers || (st->remote_closed && !st->reset)) {
            if (st->data_len == 0)
                return -ENODATA;
            s_abort(c, S_INTERNAL, "the stream ended inside a message");
            return -EIO;
        }
        if (st->reset)
            return -EIO;
        if (round == 0 && s_step_in(c, 0) != 0) /* flush what is queued, read what came */
            return -EIO;
    }
    return 0;
}

int kb_rpc_call_write(kb_rpc_call_t *c, const ProtobufCMessage *msg)
{
    if (c->done || c->half_closed)
        return -EPIPE;
    return s_send_msg(c, msg, false);
}

static void s_trace(const kb_rpc_call_t *c)
{
    kb_rpc_t *r = c->rpc;
    if (r->trace)
        fprintf(r->trace, "grpc %s %s -> %s (%.1f ms)\n", r->target, c->method,
                s_rpc_code_name(c->st.code), (double)(s_now() - c->started) / 1e6);
}

int kb_rpc_call_finish(kb_rpc_call_t *c, const ProtobufCMessageDescriptor *resp_desc,
                       ProtobufCMessage **resp, kb_rpc_status_t *st)
{
    ProtobufCMessage *m = NULL;
    if (resp)
        *resp = NULL;
    if (!c->done && !c->half_closed) {
        c->half_closed = true;
        s_send(c, NULL, 0, true); /* -EPIPE: the stream is over already; its status says why */
    }
    if (!c->done && resp_desc)
        s_read(c, resp_desc, &m);
    kb_h2_stream_t *hs;
    while (!c->done && (hs = s_stream(c)) && !s_over(hs))
        s_step(c);
    if (!c->done) {
        hs = s_stream(c);
        if (hs)
            s_final(hs, &c->st);
        else
            s_status(&c->st, S_INTERNAL, "the call lost its stream");
        c->done = true;
    }
    if (c->st.code == S_OK && resp_desc && !m)
        s_status(&c->st, S_INTERNAL, "server sent no response message");
    s_trace(c);
    if (st)
        *st = c->st;
    if (c->st.code != S_OK) {
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
        return -EIO;
    }
    if (resp)
        *resp = m;
    else if (m)
        protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

void kb_rpc_call_destroy(kb_rpc_call_t **p)
{
    kb_rpc_call_t *c = *p;
    if (!c)
        return;
    if (s_stream(c)) {
        kb_h2_close_stream(c->rpc->h2, KB_H2_CANCEL); /* RST_STREAM only if still open */
        if (!c->rpc->dead_code)
            s_flush(c->rpc);
    }
    free(c);
    *p = NULL;
}

int kb_rpc_unary(kb_rpc_t *rpc, const char *method, const char *sandbox_id,
                 const ProtobufCMessage *req, const ProtobufCMessageDescriptor *resp_desc,
                 ProtobufCMessage **resp, kb_rpc_status_t *st)
{
    *resp = NULL;
    kb_rpc_call_t *c = s_start(rpc, method, sandbox_id, req, st);
    if (!c)
        return -EIO;
    int rc = kb_rpc_call_finish(c, resp_desc, resp, st);
    kb_rpc_call_destroy(&c);
    return rc;
}
