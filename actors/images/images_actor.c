/*
 * ka_images actor: requests become jobs on krt job threads; JOB_DONE sends the deferred reply.
 * A job is shared by the job thread and the actor (two references): whichever lets go last
 * frees it, so an actor stopped with jobs in flight leaks nothing.
 */
#include "images_actor.h"
#include "images.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The store, shared by the actor and its running jobs; the last to let go destroys it. */
typedef struct s_holder {
    atomic_int refs;
    ka_images_t *store;
} s_holder_t;

static void s_holder_unref(s_holder_t *h)
{
    if (h && atomic_fetch_sub(&h->refs, 1) == 1) {
        ka_images_destroy(&h->store);
        free(h);
    }
}

typedef struct s_job {
    struct s_job *next;      /* in-flight list (actor side) */
    atomic_int refs;         /* job thread + actor */
    s_holder_t *holder;      /* one reference, dropped when the job is freed */
    ka_images_t *store;      /* holder->store */
    uint32_t type;           /* request type */
    krt_addr_t from;         /* requester */
    uint64_t ref;            /* request ref */
    ka_images_req_t req;     /* copy of the request */
    ka_images_reply_t reply; /* filled by the job */
} s_job_t;

typedef struct s_state {
    s_holder_t *holder; /* one reference */
    ka_images_t *store; /* holder->store */
    s_job_t *inflight;  /* jobs submitted, JOB_DONE not yet handled */
    uint64_t served;    /* replies sent */
    int n_inflight;
} s_state_t;

static void s_job_unref(s_job_t *j)
{
    if (atomic_fetch_sub(&j->refs, 1) == 1) {
        s_holder_unref(j->holder);
        free(j);
    }
}

static void s_fill_error(ka_images_reply_t *r, int rc)
{
    r->err = rc;
    const char *m = ka_images_last_error();
    snprintf(r->message, sizeof r->message, "%s", m && m[0] ? m : krt_strerror(rc));
}

/* Copies a malloc'd string into a reply field (and frees it). */
static void s_take(char *dst, size_t cap, char *s)
{
    if (s)
        snprintf(dst, cap, "%s", s);
    free(s);
}

/* Runs on a job thread. */
static int s_job_run(void *arg)
{
    s_job_t *j = arg;
    ka_images_reply_t *r = &j->reply;
    const char *a = j->req.arg;
    const char *name = j->req.name[0] ? j->req.name : NULL;
    char *out = NULL;
    int rc = 0;
    switch (j->type) {
    case KA_IMAGES_PREPARE:
        rc = ka_images_resolve(j->store, a, r->digest);
        if (rc == 0)
            rc = ka_images_rootfs(j->store, r->digest, &out);
        s_take(r->path, sizeof r->path, out);
        break;
    case KA_IMAGES_RESOLVE:
        rc = ka_images_resolve(j->store, a, r->digest);
        break;
    case KA_IMAGES_VERIFY:
        rc = ka_images_verify(j->store, a);
        break;
    case KA_IMAGES_IMPORT:
        rc = ka_images_import(j->store, a, name, &out);
        break;
    case KA_IMAGES_PULL:
        rc = ka_images_pull(j->store, a, &out);
        break;
    case KA_IMAGES_BUILD:
        rc = ka_images_build(j->store, a, name, &out);
        break;
    case KA_IMAGES_RM:
        rc = ka_images_rm(j->store, a);
        break;
    default:
        rc = -EINVAL;
    }
    if (rc == 0 && out && j->type != KA_IMAGES_PREPARE) {
        const char *at = strrchr(out, '@');
        snprintf(r->digest, sizeof r->digest, "%s", at ? at + 1 : out);
        s_take(r->ref, sizeof r->ref, out);
    }
    if (rc < 0)
        s_fill_error(r, rc);
    s_job_unref(j);
    return rc;
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_state_t *s = state;
    const ka_images_actor_args_t *a = arg;
    if (!a || !a->state_dir)
        return -EINVAL;
    ka_images_opts_t o = {
        .state_dir = a->state_dir, .mirrors = a->mirrors, .n_mirrors = a->n_mirrors};
    s->holder = calloc(1, sizeof *s->holder);
    s->store = s->holder ? ka_images_new(&o) : NULL;
    if (!s->store) {
        free(s->holder);
        s->holder = NULL;
        krt_log_actor(ctx, KRT_LOG_ERROR, "store_open_failed", "state_dir=%s why=\"%s\"",
                      a->state_dir, ka_images_last_error());
        return -EIO;
    }
    atomic_init(&s->holder->refs, 1);
    s->holder->store = s->store;
    krt_log_actor(ctx, KRT_LOG_INFO, "started", "root=%s", ka_images_root(s->store));
    return 0;
}

static bool s_terminated(const char *s, size_t cap)
{
    return memchr(s, '\0', cap) != NULL;
}

static void s_reject(krt_ctx_t *ctx, const krt_msg_t *msg, int err, const char *why)
{
    ka_images_reply_t r;
    memset(&r, 0, sizeof r);
    r.err = err;
    snprintf(r.message, sizeof r.message, "%s", why);
    krt_reply(ctx, msg, msg->type, &r, sizeof r);
}

static void s_request(krt_ctx_t *ctx, s_state_t *s, const krt_msg_t *msg)
{
    const ka_images_req_t *req = msg->body;
    if (msg->len != sizeof *req || !s_terminated(req->arg, sizeof req->arg) ||
        !s_terminated(req->name, sizeof req->name) || !req->arg[0]) {
        s_reject(ctx, msg, -EINVAL, "malformed images request");
        return;
    }
    s_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        s_reject(ctx, msg, -ENOMEM, "out of memory");
        return;
    }
    atomic_init(&j->refs, 2);
    atomic_fetch_add(&s->holder->refs, 1);
    j->holder = s->holder;
    j->store = s->store;
    j->type = msg->type;
    j->from = msg->from;
    j->ref = msg->ref;
    j->req = *req;
    int rc = krt_job_submit(ctx, s_job_run, j, NULL);
    if (rc < 0) {
        s_holder_unref(j->holder);
        free(j);
        s_reject(ctx, msg, rc, "cannot start the job");
        return;
    }
    j->next = s->inflight;
    s->inflight = j;
    s->n_inflight++;
}

static void s_done(krt_ctx_t *ctx, s_state_t *s, const krt_msg_t *msg)
{
    const krt_job_done_t *d = msg->body;
    s_job_t *j = d->arg;
    for (s_job_t **p = &s->inflight; *p; p = &(*p)->next) {
        if (*p == j) {
            *p = j->next;
            s->n_inflight--;
            krt_reply_to(ctx, j->from, j->ref, j->type, &j->reply, sizeof j->reply);
            s->served++;
            s_job_unref(j);
            return;
        }
    }
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_state_t *s = state;
    if (msg->type == KRT_MSG_JOB_DONE)
        s_done(ctx, s, msg);
    else if (msg->type > KA_IMAGES_MSG_BASE && msg->type < KA_IMAGES_MSG_LAST_)
        s_request(ctx, s, msg);
    else if (msg->ref)
        s_reject(ctx, msg, -ENOTSUP, "unknown images request");
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_state_t *s = state;
    if (s->inflight)
        krt_log_actor(ctx, KRT_LOG_WARN, "stopped_busy", "inflight=%d", s->n_inflight);
    /* running jobs keep their own references to themselves and to the store */
    while (s->inflight) {
        s_job_t *j = s->inflight;
        s->inflight = j->next;
        s_job_unref(j);
    }
    s_holder_unref(s->holder);
    s->holder = NULL;
    s->store = NULL;
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_state_t *s = state;
    snprintf(out, cap, "{\"root\":\"%s\",\"inflight\":%d,\"served\":%llu}",
             s->store ? ka_images_root(s->store) : "", s->n_inflight,
             (unsigned long long)s->served);
}

const krt_behaviour_t ka_images_behaviour = {
    .kind = "images",
    .state_size = sizeof(s_state_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
