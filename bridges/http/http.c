/* kb_http: HTTP/1.1 routes on libmicrohttpd. See http.h.
 *
 * libmicrohttpd runs thread-per-connection with no listening socket. A streaming response is a
 * refcounted buffer: the producer writes from any thread; the connection thread's content
 * reader waits on a condition variable for bytes. kb_http_destroy marks every live stream gone
 * (readers end) before stopping the daemon, so the stop never waits on a producer.
 */
#include "http.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "krt.h"

#define LOG_PATH "bridges/http"

struct kb_http_buf {
    char *data;
    size_t len, cap;
};

typedef struct {
    char *path;
    unsigned methods;
    kb_http_handler_fn fn;
    void *arg;
} s_route_t;

typedef struct s_header {
    struct s_header *next;
    char *name, *value;
} s_header_t;

struct kb_http_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kb_http_buf_t buf; /* bytes not yet taken by the connection */
    size_t off;        /* consumed prefix of buf */
    bool closed;       /* the producer ended the body */
    bool gone;         /* client gone or server stopping: writes fail */
    bool ended;        /* the response was freed (on_gone ran or will never run) */
    kb_http_gone_fn on_gone;
    void *gone_arg;
    int fd;           /* the connection's socket, polled for a hang-up while idle (-1: unknown) */
    int refs;         /* producer + response */
    kb_http_t *owner; /* the server (valid while the response lives) */
    bool listed;      /* in owner->streams (guarded by owner->mu) */
    kb_http_stream_t *next, *prev;
};

struct kb_http_req {
    kb_http_t *h;
    struct MHD_Connection *conn;
    const char *method;
    char *path;
    const s_route_t *route;
    kb_http_buf_t body;
    bool too_large;
    bool responded;
    s_header_t *headers;
};

struct kb_http {
    kb_http_options_t opts;
    struct MHD_Daemon *d;
    s_route_t *routes;
    size_t n_routes;
    pthread_mutex_t mu; /* guards streams, requests */
    kb_http_stream_t *streams;
    uint64_t requests;
};

/* ---------- buffers ---------- */

/* Appends raw bytes. 0 or -ENOMEM. */
static int s_http_buf_append(kb_http_buf_t *b, const void *data, size_t len)
{
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *t = realloc(b->data, cap);
        if (!t)
            return -ENOMEM;
        b->data = t;
        b->cap = cap;
    }
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

int kb_http_buf_printf(kb_http_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    if ((size_t)n < sizeof small)
        return s_http_buf_append(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return -ENOMEM;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = s_http_buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

/* ---------- header helpers ---------- */

size_t kb_http_host_part(const char *h)
{
    if (*h == '[') {
        const char *e = strchr(h, ']');
        return e ? (size_t)(e - h + 1) : strlen(h);
    }
    const char *c = strchr(h, ':');
    return c ? (size_t)(c - h) : strlen(h);
}

bool kb_http_host_allowed(const char *const *allowed, const char *value)
{
    for (size_t i = 0; value && allowed && allowed[i]; i++) {
        const char *a = allowed[i];
        if (strcmp(a, "*") == 0 || strcasecmp(a, value) == 0)
            return true;
        size_t al = strlen(a);
        if (kb_http_host_part(a) == al && kb_http_host_part(value) == al &&
            strncasecmp(a, value, al) == 0)
            return true;
    }
    return false;
}

int kb_http_cookie(const char *header, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = header; p && *p;) {
        p += strspn(p, " \t;");
        size_t len = strcspn(p, ";");
        if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            size_t vl = len - nl - 1;
            while (vl && (p[nl + 1 + vl - 1] == ' ' || p[nl + 1 + vl - 1] == '\t'))
                vl--;
            if (vl >= cap)
                return -ENOENT;
            memcpy(out, p + nl + 1, vl);
            out[vl] = '\0';
            return 0;
        }
        p += len;
    }
    return -ENOENT;
}

/* ---------- requests ---------- */

const char *kb_http_req_method(const kb_http_req_t *req)
{
    return req->method;
}

const char *kb_http_req_path(const kb_http_req_t *req)
{
    return req->path;
}

const char *kb_http_req_header(const kb_http_req_t *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

int kb_http_req_conn_fd(const kb_http_req_t *req)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

const char *kb_http_req_body(const kb_http_req_t *req, size_t *len)
{
    if (len)
        *len = req->body.len;
    return req->body.data ? req->body.data : "";
}

int kb_http_req_add_header(kb_http_req_t *req, const char *name, const char *value)
{
    s_header_t *hd = calloc(1, sizeof *hd);
    if (!hd)
        return -ENOMEM;
    hd->name = strdup(name);
    hd->value = strdup(value);
    if (!hd->name || !hd->value) {
        free(hd->name);
        free(hd->value);
        free(hd);
        return -ENOMEM;
    }
    hd->next = req->headers;
    req->headers = hd;
    return 0;
}

static void s_free_headers(kb_http_req_t *req)
{
    while (req->headers) {
        s_header_t *hd = req->headers;
        req->headers = hd->next;
        free(hd->name);
        free(hd->value);
        free(hd);
    }
}

static int s_queue(kb_http_req_t *req, unsigned status, const char *content_type,
                   struct MHD_Response *r)
{
    if (!r)
        return -ENOMEM;
    if (content_type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    for (s_header_t *hd = req->headers; hd; hd = hd->next)
        MHD_add_response_header(r, hd->name, hd->value);
    enum MHD_Result ok = MHD_queue_response(req->conn, status, r);
    MHD_destroy_response(r);
    req->responded = true;
    pthread_mutex_lock(&req->h->mu);
    req->h->requests++;
    pthread_mutex_unlock(&req->h->mu);
    return ok == MHD_YES ? 0 : -EIO;
}

int kb_http_respond(kb_http_req_t *req, unsigned status, const char *content_type, const void *body,
                    size_t len)
{
    if (req->responded)
        return -EALREADY;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    return s_queue(req, status, content_type, r);
}

/* ---------- streams ---------- */

static void s_stream_unref(kb_http_stream_t *s)
{
    pthread_mutex_lock(&s->mu);
    int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left)
        return;
    free(s->buf.data);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static ssize_t s_stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    kb_http_stream_t *s = cls;
    pthread_mutex_lock(&s->mu);
    while (s->buf.len == s->off && !s->closed && !s->gone) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&s->mu);
            /* libmicrohttpd only notices a hang-up when it writes: look ourselves */
            struct pollfd p = {.fd = s->fd, .events = POLLRDHUP};
            if (s->fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            return 0; /* nothing yet; libmicrohttpd calls again */
        }
    }
    ssize_t n;
    if (s->gone) {
        n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (s->buf.len > s->off) {
        size_t avail = s->buf.len - s->off;
        size_t k = avail < max ? avail : max;
        memcpy(out, s->buf.data + s->off, k);
        s->off += k;
        if (s->off == s->buf.len)
            s->off = s->buf.len = 0;
        n = (ssize_t)k;
    } else {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* The response is gone (body sent, client gone or daemon stopping). */
static void s_stream_response_freed(void *cls)
{
    kb_http_stream_t *s = cls;
    pthread_mutex_lock(&s->mu);
    s->gone = true;
    s->ended = true;
    kb_http_gone_fn fn = s->on_gone;
    void *arg = s->gone_arg;
    s->on_gone = NULL;
    pthread_mutex_unlock(&s->mu);
    if (fn)
        fn(s, arg);
    kb_http_t *h = s->owner;
    pthread_mutex_lock(&h->mu);
    if (s->listed) {
        if (s->prev)
            s->prev->next = s->next;
        else
            h->streams = s->next;
        if (s->next)
            s->next->prev = s->prev;
        s->listed = false;
    }
    pthread_mutex_unlock(&h->mu);
    s_stream_unref(s);
}

int kb_http_respond_stream(kb_http_req_t *req, unsigned status, const char *content_type,
                           kb_http_stream_t **out)
{
    *out = NULL;
    if (req->responded)
        return -EALREADY;
    kb_http_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->refs = 2;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    s->fd = ci ? ci->connect_fd : -1;
    struct MHD_Response *r = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, s_stream_read, s, s_stream_response_freed);
    if (!r) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return -ENOMEM;
    }
    kb_http_t *h = req->h;
    s->owner = h;
    pthread_mutex_lock(&h->mu);
    s->listed = true;
    s->next = h->streams;
    if (h->streams)
        h->streams->prev = s;
    h->streams = s;
    pthread_mutex_unlock(&h->mu);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    int rc = s_queue(req, status, content_type, r); /* on failure the free callback ran */
    if (rc < 0) {
        kb_http_stream_close(&s);
        return rc;
    }
    *out = s;
    return 0;
}

int kb_http_stream_write(kb_http_stream_t *s, const void *data, size_t len)
{
    pthread_mutex_lock(&s->mu);
    int rc = -EPIPE;
    if (!s->gone && !s->closed)
        rc = s_http_buf_append(&s->buf, data, len);
    if (rc == 0)
        pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool kb_http_stream_closed(kb_http_stream_t *s)
{
    pthread_mutex_lock(&s->mu);
    bool r = s->gone;
    pthread_mutex_unlock(&s->mu);
    return r;
}

int kb_http_stream_on_gone(kb_http_stream_t *s, kb_http_gone_fn fn, void *arg)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->ended) {
        rc = -EPIPE;
    } else {
        s->on_gone = fn;
        s->gone_arg = arg;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void kb_http_stream_close(kb_http_stream_t **s_p)
{
    kb_http_stream_t *s = s_p ? *s_p : NULL;
    if (!s)
        return;
    *s_p = NULL;
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    s_stream_unref(s);
}

/* ---------- built-in routes ---------- */

static void s_healthz(kb_http_req_t *req, void *arg)
{
    kb_http_respond(req, 200, "text/plain; charset=utf-8", "ok\n", 3);
}

static void s_readyz(kb_http_req_t *req, void *arg)
{
    kb_http_t *h = arg;
    bool ready = h->opts.ready ? h->opts.ready(h->opts.arg) : true;
    if (ready)
        kb_http_respond(req, 200, "text/plain; charset=utf-8", "ready\n", 6);
    else
        kb_http_respond(req, 503, "text/plain; charset=utf-8", "not ready\n", 10);
}

static void s_metrics(kb_http_req_t *req, void *arg)
{
    kb_http_t *h = arg;
    kb_http_buf_t b = {0};
    int rc = h->opts.metrics ? h->opts.metrics(&b, h->opts.arg) : 0;
    if (rc < 0)
        kb_http_respond(req, 500, "text/plain; charset=utf-8", "metrics unavailable\n", 20);
    else
        kb_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", b.data ? b.data : "",
                        b.len);
    free(b.data);
}

/* ---------- libmicrohttpd glue ---------- */

static unsigned s_method_bit(const char *m)
{
    static const struct {
        const char *name;
        unsigned bit;
    } map[] = {{"GET", KB_HTTP_GET},
               {"POST", KB_HTTP_POST},
               {"DELETE", KB_HTTP_DELETE},
               {"PUT", KB_HTTP_PUT},
               {"HEAD", KB_HTTP_HEAD}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(m, map[i].name) == 0)
            return map[i].bit;
    return 0;
}

static void s_allow(unsigned mask, char *out, size_t n)
{
    static const char *names[] = {"GET", "POST", "DELETE", "PUT", "HEAD"};
    out[0] = '\0';
    for (unsigned i = 0; i < 5; i++) {
        if (!(mask & (1u << i)))
            continue;
        if (out[0])
            strncat(out, ", ", n - strlen(out) - 1);
        strncat(out, names[i], n - strlen(out) - 1);
    }
}

static const s_route_t *s_find_route(kb_http_t *h, const char *path)
{
    for (size_t i = 0; i < h->n_routes; i++)
        if (strcmp(h->routes[i].path, path) == 0)
            return &h->routes[i];
    return NULL;
}

static enum MHD_Result s_access(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_size, void **con_cls)
{
    kb_http_t *h = cls;
    kb_http_req_t *req = *con_cls;
    if (!req) {
        req = calloc(1, sizeof *req);
        if (!req)
            return MHD_NO;
        req->h = h;
        req->conn = conn;
        req->method = method;
        req->path = strdup(url);
        if (!req->path) {
            free(req);
            return MHD_NO;
        }
        req->route = s_find_route(h, url);
        *con_cls = req;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!req->too_large && (req->body.len + *upload_size > h->opts.max_body ||
                                s_http_buf_append(&req->body, upload, *upload_size) < 0))
            req->too_large = true;
        *upload_size = 0;
        return MHD_YES;
    }
    if (req->responded)
        return MHD_YES;
    if (!req->route) {
        kb_http_respond(req, 404, "text/plain; charset=utf-8", "not found\n", 10);
        return MHD_YES;
    }
    if (!(req->route->methods & s_method_bit(method))) {
        char allow[64];
        s_allow(req->route->methods, allow, sizeof allow);
        kb_http_req_add_header(req, MHD_HTTP_HEADER_ALLOW, allow);
        kb_http_respond(req, 405, "text/plain; charset=utf-8", "method not allowed\n", 19);
        return MHD_YES;
    }
    if (req->too_large) {
        kb_http_respond(req, 413, "text/plain; charset=utf-8", "request body too large\n", 23);
        return MHD_YES;
    }
    req->route->fn(req, req->route->arg);
    if (!req->responded) {
        krt_log(KRT_LOG_ERROR, LOG_PATH, "handler_no_response", "path=%s", req->path);
        s_free_headers(req);
        kb_http_respond(req, 500, "text/plain; charset=utf-8", "no response\n", 12);
    }
    return MHD_YES;
}

static void s_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    kb_http_req_t *req = *con_cls;
    if (!req)
        return;
    *con_cls = NULL;
    s_free_headers(req);
    free(req->body.data);
    free(req->path);
    free(req);
}

int kb_http_route(kb_http_t *h, const char *path, unsigned methods, kb_http_handler_fn fn,
                  void *arg)
{
    if (!path || path[0] != '/' || !methods || !fn)
        return -EINVAL;
    if (s_find_route(h, path))
        return -EEXIST;
    s_route_t *t = realloc(h->routes, (h->n_routes + 1) * sizeof *t);
    if (!t)
        return -ENOMEM;
    h->routes = t;
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    h->routes[h->n_routes++] = (s_route_t){p, methods, fn, arg};
    return 0;
}

kb_http_t *kb_http_new(const kb_http_options_t *opts)
{
    kb_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    if (opts)
        h->opts = *opts;
    if (!h->opts.max_body)
        h->opts.max_body = KB_HTTP_DEFAULT_MAX_BODY;
    if (h->opts.connection_timeout_s <= 0)
        h->opts.connection_timeout_s = 60;
    pthread_mutex_init(&h->mu, NULL);
    if (kb_http_route(h, "/healthz", KB_HTTP_GET | KB_HTTP_HEAD, s_healthz, h) < 0 ||
        kb_http_route(h, "/readyz", KB_HTTP_GET | KB_HTTP_HEAD, s_readyz, h) < 0 ||
        kb_http_route(h, "/metrics", KB_HTTP_GET | KB_HTTP_HEAD, s_metrics, h) < 0)
        goto fail;
    /* poll(), not select(): a node with hundreds of sandboxes holds descriptors past FD_SETSIZE
     * (select() would refuse them). Not epoll: libmicrohttpd has no epoll with a thread per
     * connection, which the streamed responses need (their reader blocks, s_stream_read). */
    h->d = MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET | MHD_USE_THREAD_PER_CONNECTION |
                                MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC,
                            0, NULL, NULL, s_access, h, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned int)h->opts.connection_timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                            s_completed, h, MHD_OPTION_END);
    if (!h->d) {
        krt_log(KRT_LOG_ERROR, LOG_PATH, "start_failed", "lib=libmicrohttpd");
        goto fail;
    }
    return h;
fail:
    for (size_t i = 0; i < h->n_routes; i++)
        free(h->routes[i].path);
    free(h->routes);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return NULL;
}

int kb_http_add_connection(kb_http_t *h, int fd, const struct sockaddr *peer, socklen_t len)
{
    if (MHD_add_connection(h->d, fd, peer, len) != MHD_YES) {
        krt_log(KRT_LOG_WARN, LOG_PATH, "add_connection_failed", "errno=%d", errno);
        return -EIO;
    }
    return 0;
}

uint64_t kb_http_requests(kb_http_t *h)
{
    pthread_mutex_lock(&h->mu);
    uint64_t n = h->requests;
    pthread_mutex_unlock(&h->mu);
    return n;
}

void kb_http_destroy(kb_http_t **h_p)
{
    kb_http_t *h = h_p ? *h_p : NULL;
    if (!h)
        return;
    *h_p = NULL;
    pthread_mutex_lock(&h->mu);
    for (kb_http_stream_t *s = h->streams; s; s = s->next) {
        pthread_mutex_lock(&s->mu);
        s->gone = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&h->mu);
    MHD_stop_daemon(h->d);
    for (size_t i = 0; i < h->n_routes; i++)
        free(h->routes[i].path);
    free(h->routes);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
