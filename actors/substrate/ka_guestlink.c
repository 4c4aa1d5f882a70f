/* ka_guestlink: the per-sandbox guest channel actor (see ka_guestlink.h). */
#include "ka_guestlink.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { S_START = 1, S_SIGNAL, S_OUTPUT, S_GET, S_INPUT, S_READ, S_WRITE };

struct ka_gl_req {
    krt_addr_t owner;
    uint64_t tag;
    int kind;
    char **argv, **env; /* NULL-terminated copies (start) */
    char *cwd;
    ka_gp_start_t st;
    uint64_t proc, out_off, err_off;
    int sig;
    bool follow;
    char *path;    /* read, write */
    uint32_t mode; /* read, write */
    void *data;    /* input, write: owned copy */
    size_t len;
    bool close_after; /* input */
};

typedef struct s_route {
    uint64_t id; /* guest request id */
    krt_addr_t owner;
    uint64_t tag;
    bool stream; /* an output stream: cancel it when the owner is forgotten */
} s_route_t;

typedef struct s_link {
    int fd;
    ka_guestconn_t *gc;
    s_route_t *routes;
    size_t n, cap;
    bool closed;
} s_link_t;

/* --- requests ------------------------------------------------------------------------------- */

static char **s_strv_dup(const char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    char **out = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; out && i < n; i++) {
        if (!(out[i] = strdup(v[i]))) {
            for (size_t j = 0; j < i; j++)
                free(out[j]);
            free(out);
            return NULL;
        }
    }
    return out;
}

static void s_strv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

void ka_gl_req_free(void *p)
{
    ka_gl_req_t *r = p;
    if (!r)
        return;
    s_strv_free(r->argv);
    s_strv_free(r->env);
    free(r->cwd);
    free(r->path);
    free(r->data);
    free(r);
}

static ka_gl_req_t *s_req(krt_addr_t owner, uint64_t tag, int kind)
{
    ka_gl_req_t *r = calloc(1, sizeof(*r));
    if (r) {
        r->owner = owner;
        r->tag = tag;
        r->kind = kind;
    }
    return r;
}

ka_gl_req_t *ka_gl_req_start(krt_addr_t owner, uint64_t tag, const ka_gp_start_t *st)
{
    if (!st || !st->argv || !st->argv[0])
        return NULL;
    ka_gl_req_t *r = s_req(owner, tag, S_START);
    if (!r)
        return NULL;
    r->st = *st;
    r->argv = s_strv_dup(st->argv);
    r->env = st->env ? s_strv_dup(st->env) : NULL;
    r->cwd = st->cwd ? strdup(st->cwd) : NULL;
    if (!r->argv || (st->env && !r->env) || (st->cwd && !r->cwd)) {
        ka_gl_req_free(r);
        return NULL;
    }
    r->st.argv = (const char *const *)r->argv;
    r->st.env = (const char *const *)r->env;
    r->st.cwd = r->cwd;
    return r;
}

ka_gl_req_t *ka_gl_req_signal(krt_addr_t owner, uint64_t tag, uint64_t proc, int sig)
{
    ka_gl_req_t *r = s_req(owner, tag, S_SIGNAL);
    if (r) {
        r->proc = proc;
        r->sig = sig;
    }
    return r;
}

ka_gl_req_t *ka_gl_req_output(krt_addr_t owner, uint64_t tag, uint64_t proc, uint64_t out_off,
                              uint64_t err_off, bool follow)
{
    ka_gl_req_t *r = s_req(owner, tag, S_OUTPUT);
    if (r) {
        r->proc = proc;
        r->out_off = out_off;
        r->err_off = err_off;
        r->follow = follow;
    }
    return r;
}

ka_gl_req_t *ka_gl_req_get(krt_addr_t owner, uint64_t tag, uint64_t proc)
{
    ka_gl_req_t *r = s_req(owner, tag, S_GET);
    if (r)
        r->proc = proc;
    return r;
}

/* Copies len bytes of data into r (NULL r on failure: r is freed). */
static ka_gl_req_t *s_req_data(ka_gl_req_t *r, const void *data, size_t len)
{
    if (r && len > 0) {
        r->data = malloc(len);
        if (!r->data) {
            ka_gl_req_free(r);
            return NULL;
        }
        memcpy(r->data, data, len);
        r->len = len;
    }
    return r;
}

ka_gl_req_t *ka_gl_req_input(krt_addr_t owner, uint64_t tag, uint64_t proc, const void *data,
                             size_t len, bool close_after)
{
    ka_gl_req_t *r = s_req(owner, tag, S_INPUT);
    if (r) {
        r->proc = proc;
        r->close_after = close_after;
    }
    return s_req_data(r, data, len);
}

ka_gl_req_t *ka_gl_req_read(krt_addr_t owner, uint64_t tag, const char *path, uint32_t mode)
{
    ka_gl_req_t *r = path ? s_req(owner, tag, S_READ) : NULL;
    if (r) {
        r->mode = mode;
        if (!(r->path = strdup(path))) {
            ka_gl_req_free(r);
            return NULL;
        }
    }
    return r;
}

ka_gl_req_t *ka_gl_req_write(krt_addr_t owner, uint64_t tag, const char *path, uint32_t mode,
                             uint64_t seek, const void *data, size_t len)
{
    if (!path || len > KA_GP_FILE_CAP)
        return NULL;
    ka_gl_req_t *r = s_req(owner, tag, S_WRITE);
    if (r) {
        r->mode = mode;
        r->out_off = seek;
        if (!(r->path = strdup(path))) {
            ka_gl_req_free(r);
            return NULL;
        }
    }
    return s_req_data(r, data, len);
}

void ka_gl_req_set_owner(ka_gl_req_t *req, krt_addr_t owner)
{
    req->owner = owner;
}

int ka_gl_send(krt_ctx_t *ctx, krt_addr_t link, ka_gl_req_t *req)
{
    if (!req)
        return KRT_ENOMEM;
    return krt_send_ptr(ctx, link, KA_GL_SEND, req, ka_gl_req_free);
}

void ka_gl_frame_free(void *p)
{
    ka_gl_frame_t *f = p;
    if (!f)
        return;
    ka_gp_frame_free(&f->frame);
    free(f);
}

/* --- the actor ------------------------------------------------------------------------------ */

static void s_watch(krt_ctx_t *ctx, s_link_t *l)
{
    if (l->closed)
        return;
    uint32_t ev = KRT_FD_READ | (ka_guestconn_pending(l->gc) ? KRT_FD_WRITE : 0);
    krt_fd_watch(ctx, l->fd, ev, 0);
}

static int s_route_add(s_link_t *l, uint64_t id, const ka_gl_req_t *r)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        s_route_t *n = realloc(l->routes, cap * sizeof(*n));
        if (!n)
            return KRT_ENOMEM;
        l->routes = n;
        l->cap = cap;
    }
    l->routes[l->n++] =
        (s_route_t){.id = id,
                    .owner = r->owner,
                    .tag = r->tag,
                    .stream = r->kind == S_OUTPUT || (r->kind == S_START && r->st.follow)};
    return 0;
}

static void s_on_send(krt_ctx_t *ctx, s_link_t *l, const krt_msg_t *msg)
{
    ka_gl_req_t *r = krt_msg_take(ctx, msg);
    if (!r)
        return;
    uint64_t id = 0;
    int rc = KRT_EINVAL;
    if (l->closed) {
        rc = -ECONNRESET;
    } else if (r->kind == S_START) {
        rc = ka_guestconn_start(l->gc, &r->st, &id);
    } else if (r->kind == S_SIGNAL) {
        rc = ka_guestconn_signal(l->gc, r->proc, r->sig, &id);
    } else if (r->kind == S_OUTPUT) {
        rc = ka_guestconn_output(l->gc, r->proc, r->out_off, r->err_off, r->follow, &id);
    } else if (r->kind == S_GET) {
        rc = ka_guestconn_get(l->gc, r->proc, &id);
    } else if (r->kind == S_INPUT) {
        rc = ka_guestconn_input(l->gc, r->proc, r->data, r->len, r->close_after, &id);
    } else if (r->kind == S_READ) {
        rc = ka_guestconn_read(l->gc, r->path, r->mode, &id);
    } else if (r->kind == S_WRITE) {
        rc = ka_guestconn_write(l->gc, r->path, r->mode, r->out_off, r->data, r->len, &id);
    }
    if (rc == 0)
        rc = s_route_add(l, id, r);
    if (rc < 0) { /* the owner learns through CLOSED for its tag */
        ka_gl_closed_t c = {.tag = r->tag};
        krt_send(ctx, r->owner, KA_GL_CLOSED, &c, sizeof(c));
    }
    ka_gl_req_free(r);
    int frc = ka_guestconn_flush(l->gc);
    if (frc < 0 && frc != -EAGAIN)
        krt_log_actor(ctx, KRT_LOG_WARN, "guest_write_failed", "err=%d", frc);
    s_watch(ctx, l);
}

static void s_close_all(krt_ctx_t *ctx, s_link_t *l)
{
    l->closed = true;
    krt_fd_unwatch(ctx, l->fd);
    for (size_t i = 0; i < l->n; i++) {
        ka_gl_closed_t c = {.tag = l->routes[i].tag};
        krt_send(ctx, l->routes[i].owner, KA_GL_CLOSED, &c, sizeof(c));
    }
    l->n = 0;
    krt_exit(ctx, KRT_EXIT_NORMAL);
}

static void s_on_ready(krt_ctx_t *ctx, s_link_t *l)
{
    int frc = ka_guestconn_flush(l->gc);
    for (;;) {
        ka_gp_frame_t *f = NULL;
        int rc = ka_guestconn_recv(l->gc, &f);
        if (rc == -EAGAIN)
            break;
        if (rc < 0) {
            krt_log_actor(ctx, KRT_LOG_INFO, "guest_channel_closed", "err=%d", rc);
            s_close_all(ctx, l);
            return;
        }
        uint64_t id = ka_gp_frame_id(f);
        bool end = ka_gp_frame_is_end(f);
        size_t i = 0;
        while (i < l->n && l->routes[i].id != id)
            i++;
        if (i == l->n) { /* a forgotten owner's, or the ready event */
            ka_gp_frame_free(&f);
            continue;
        }
        ka_gl_frame_t *w = malloc(sizeof(*w));
        if (w) {
            w->tag = l->routes[i].tag;
            w->frame = f;
            krt_send_ptr(ctx, l->routes[i].owner, KA_GL_FRAME, w, ka_gl_frame_free);
        } else {
            ka_gp_frame_free(&f);
        }
        if (end)
            l->routes[i] = l->routes[--l->n];
    }
    if (frc < 0 && frc != -EAGAIN) {
        s_close_all(ctx, l);
        return;
    }
    s_watch(ctx, l);
}

static void s_on_forget(krt_ctx_t *ctx, s_link_t *l, const krt_msg_t *msg)
{
    if (msg->len != sizeof(ka_gl_forget_t))
        return;
    const ka_gl_forget_t *fg = msg->body;
    for (size_t i = 0; i < l->n;) {
        if (l->routes[i].owner != fg->owner) {
            i++;
            continue;
        }
        if (l->routes[i].stream && !l->closed)
            ka_guestconn_cancel(l->gc, l->routes[i].id, NULL);
        l->routes[i] = l->routes[--l->n];
    }
    if (!l->closed) {
        ka_guestconn_flush(l->gc);
        s_watch(ctx, l);
    }
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_link_t *l = state;
    l->fd = (int)(intptr_t)arg;
    l->gc = ka_guestconn_new(l->fd, false);
    if (!l->gc)
        return KRT_EXIT_ERROR;
    return krt_fd_watch(ctx, l->fd, KRT_FD_READ, 0) == 0 ? 0 : KRT_EXIT_ERROR;
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_link_t *l = state;
    switch (msg->type) {
    case KA_GL_SEND:
        s_on_send(ctx, l, msg);
        break;
    case KA_GL_FORGET:
        s_on_forget(ctx, l, msg);
        break;
    case KRT_MSG_FD_READY:
        if (!l->closed)
            s_on_ready(ctx, l);
        break;
    case KRT_MSG_STOP:
        krt_exit(ctx, KRT_EXIT_SHUTDOWN);
        break;
    default:
        break;
    }
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    (void)reason;
    s_link_t *l = state;
    if (!l->closed && l->gc)
        krt_fd_unwatch(ctx, l->fd);
    ka_guestconn_destroy(&l->gc);
    free(l->routes);
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_link_t *l = state;
    snprintf(out, cap, "{\"fd\":%d,\"routes\":%zu,\"closed\":%s}", l->fd, l->n,
             l->closed ? "true" : "false");
}

const krt_behaviour_t ka_guestlink_behaviour = {
    .kind = "guestlink",
    .state_size = sizeof(s_link_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
