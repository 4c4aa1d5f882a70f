/*
 * Requests and replies: the pending requests an actor waits for (a small hash by ref in its
 * ext), their timeouts, callbacks and error replies.
 *
 * A request (KRT_NK_REQUEST) travels with kind REQUEST; its answer (KRT_NK_REPLY) with kind
 * REPLY and a status, locally or through the transport alike. Completion happens in the
 * caller's turn, exactly once: a reply takes the entry from the table, a timeout's timer takes
 * it, whichever comes first; the other finds nothing and is dropped.
 *
 * Target gone: a local target that takes a request and does not answer it in the same turn
 * keeps a REQ_IN relation to the caller; when it stops, the runtime answers every request it
 * holds (REQ_IN, or still queued in its mailbox) with KRT_ENOACTOR. A request answered by an
 * actor other than its target (a relay) tells the target to forget it (DEMONITOR).
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

#define KRT_PEND_MIN_BITS 3
#define KRT_PEND_SPARE    256 /* spare entries kept per scheduler */

/* ---------------------------------------------------------------------------------------- */
/* Entries: from the scheduler's spares, else calloc                                          */

static krt_pending_t *s_entry_new(krt_sched_t *s)
{
    krt_pending_t *p = s ? s->pend_free : NULL;
    if (!p)
        return calloc(1, sizeof *p);
    s->pend_free = p->next;
    s->n_pend_free--;
    memset(p, 0, sizeof *p);
    return p;
}

static void s_entry_free(krt_sched_t *s, krt_pending_t *p)
{
    if (!s || s->n_pend_free >= KRT_PEND_SPARE) {
        free(p);
        return;
    }
    p->next = s->pend_free;
    s->pend_free = p;
    s->n_pend_free++;
}

void krt__requests_fini(krt_sched_t *s)
{
    while (s->pend_free) {
        krt_pending_t *p = s->pend_free;
        s->pend_free = p->next;
        free(p);
    }
    s->n_pend_free = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The pending table                                                                          */

static krt_pending_t **s_bucket(krt_ext_t *e, uint64_t ref)
{
    return &e->pend[(ref * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - e->pend_bits)];
}

static krt_pending_t *s_take(krt_actor_t *a, uint64_t ref)
{
    krt_ext_t *e = a->ext;
    if (!e || !e->n_pend)
        return NULL;
    for (krt_pending_t **pp = s_bucket(e, ref); *pp; pp = &(*pp)->next) {
        krt_pending_t *p = *pp;
        if (p->timer.ref == ref) {
            *pp = p->next;
            e->n_pend--;
            return p;
        }
    }
    return NULL;
}

/* Doubles the buckets (or makes the first ones); false if out of memory. */
static bool s_grow(krt_ext_t *e)
{
    uint32_t bits = e->pend ? e->pend_bits + 1 : KRT_PEND_MIN_BITS;
    krt_pending_t **nb = calloc((size_t)1 << bits, sizeof *nb);
    if (!nb)
        return false;
    krt_pending_t **old = e->pend;
    uint32_t old_n = old ? 1u << e->pend_bits : 0;
    e->pend = nb;
    e->pend_bits = bits;
    for (uint32_t i = 0; i < old_n; i++) {
        while (old[i]) {
            krt_pending_t *p = old[i];
            old[i] = p->next;
            krt_pending_t **b = s_bucket(e, p->timer.ref);
            p->next = *b;
            *b = p;
        }
    }
    free(old);
    return true;
}

static int s_put(krt_ext_t *e, krt_pending_t *p)
{
    if ((!e->pend || e->n_pend >= (1u << e->pend_bits)) && !s_grow(e) && !e->pend)
        return KRT_ENOMEM; /* a failed grow of a live table only makes chains longer */
    krt_pending_t **b = s_bucket(e, p->timer.ref);
    p->next = *b;
    *b = p;
    e->n_pend++;
    return 0;
}

static bool s_queue_error(krt_ctx_t *ctx, const krt_pending_t *p, int err);

static bool s_local(krt_system_t *sys, krt_addr_t a)
{
    return a != KRT_ADDR_NONE && krt_addr_node(a) == sys->node_id;
}

/* The request left the target's hands without the target answering it: let it forget. */
static void s_forget(krt_system_t *sys, krt_actor_t *a, const krt_pending_t *p)
{
    if (s_local(sys, p->to))
        krt__send_sys(sys, p->to, a->addr, KRT_NK_DEMONITOR, p->timer.ref, 0, NULL, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Completion (in the caller's turn)                                                          */

bool krt__request_reply(krt_ctx_t *ctx, krt_node_t *n)
{
    krt_actor_t *a = ctx->actor;
    if (!n->msg.ref)
        return true;
    krt_pending_t *p = s_take(a, n->msg.ref);
    if (!p)
        return false; /* late: the request timed out, or the caller gave up */
    krt__tmr_cancel(ctx->sys, a, &p->timer);
    if (n->msg.from != p->to)
        s_forget(ctx->sys, a, p); /* answered by someone else: the target may still hold it */
    krt_reply_fn fn = p->fn;
    void *user = p->user;
    s_entry_free(ctx->sched, p);
    ctx->node = n;
    fn(ctx, a->state, user, n->msg.status, &n->msg);
    ctx->node = NULL;
    return false;
}

void krt__request_expired(krt_ctx_t *ctx, uint64_t ref)
{
    krt_actor_t *a = ctx->actor;
    krt_pending_t *p = s_take(a, ref);
    if (!p)
        return; /* answered after its timer fired, before this message was handled */
    krt__tmr_cancel(ctx->sys, a, &p->timer); /* FIRED -> idle, off the actor's timer list */
    s_forget(ctx->sys, a, p);
    krt_reply_fn fn = p->fn;
    void *user = p->user;
    s_entry_free(ctx->sched, p);
    fn(ctx, a->state, user, KRT_ETIMEDOUT, NULL);
}

void krt__requests_drop(krt_system_t *sys, krt_actor_t *a)
{
    krt_ext_t *e = a->ext;
    if (!e || !e->pend)
        return;
    for (uint32_t i = 0; i < (1u << e->pend_bits); i++) {
        while (e->pend[i]) {
            krt_pending_t *p = e->pend[i];
            e->pend[i] = p->next;
            s_forget(sys, a, p);
            s_entry_free(krt__self_sched(sys), p);
        }
    }
    free(e->pend);
    e->pend = NULL;
    e->n_pend = 0;
}

void krt__requests_fail_node(krt_ctx_t *ctx, uint16_t node)
{
    krt_ext_t *e = ctx->actor->ext;
    for (uint32_t i = 0; e && e->pend && i < (1u << e->pend_bits); i++)
        for (krt_pending_t *p = e->pend[i]; p; p = p->next)
            if (krt_addr_node(p->to) == node)
                s_queue_error(ctx, p, KRT_ENOCONN);
}

void krt__request_orphan(krt_system_t *sys, krt_addr_t self, krt_addr_t from, uint64_t ref)
{
    const char *why = krt_strerror(KRT_ENOACTOR);
    krt__send_env(sys, from, self, KRT_MSG_ERROR, ref, KRT_NK_REPLY, KRT_ENOACTOR, why,
                  strlen(why) + 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Starting requests                                                                          */

/* Registers a pending request and returns it (NULL: out of memory). */
static krt_pending_t *s_pending_new(krt_ctx_t *ctx, krt_addr_t to, int timeout_ms, krt_reply_fn fn,
                                    void *user)
{
    krt_actor_t *a = ctx->actor;
    krt_ext_t *e = krt__ext(a);
    krt_pending_t *p = e ? s_entry_new(ctx->sched) : NULL;
    if (!p)
        return NULL;
    p->timer.ref = krt__new_ref(ctx);
    p->timer.state = KRT_TF_REQ;
    p->timer.owner = a;
    p->fn = fn;
    p->user = user;
    p->to = to;
    if (s_put(e, p)) {
        s_entry_free(ctx->sched, p);
        return NULL;
    }
    if (timeout_ms > 0)
        krt__tmr_arm(ctx->sched, a, &p->timer, (uint64_t)timeout_ms);
    return p;
}

/* Queues an error reply from p's target to the running actor; false if out of memory. */
static bool s_queue_error(krt_ctx_t *ctx, const krt_pending_t *p, int err)
{
    const char *why = krt_strerror(err);
    size_t len = strlen(why) + 1;
    krt_node_t *n = krt__node_new(ctx->sched, len);
    if (!n)
        return false;
    n->kind = KRT_NK_REPLY;
    n->msg = (krt_msg_t){KRT_MSG_ERROR, (uint32_t)len, p->to,         p->timer.ref,
                         n->data,       err,           KRT_KIND_REPLY};
    memcpy(n->data, why, len);
    krt__out_flush(ctx->sched); /* after what this handler sent to itself so far */
    krt__push(ctx->sys, ctx->actor, n);
    return true;
}

static void s_pending_undo(krt_ctx_t *ctx, krt_pending_t *p)
{
    s_take(ctx->actor, p->timer.ref);
    krt__tmr_cancel(ctx->sys, ctx->actor, &p->timer);
    s_entry_free(ctx->sched, p);
}

/* Fails a started request in the caller's next turn (as a reply from its target would).
 * KRT_ENOMEM (request withdrawn) if even that cannot be queued. */
static int s_fail_later(krt_ctx_t *ctx, krt_pending_t *p, int err)
{
    if (s_queue_error(ctx, p, err))
        return 0;
    s_pending_undo(ctx, p);
    return KRT_ENOMEM;
}

int krt_request(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, const void *body, size_t len,
                int timeout_ms, krt_reply_fn fn, void *user)
{
    if (!fn || (len && !body) || len > UINT32_MAX)
        return KRT_EINVAL;
    krt_node_t *n = krt__node_new(ctx->sched, len);
    if (!n)
        return KRT_ENOMEM;
    krt_pending_t *p = s_pending_new(ctx, to, timeout_ms, fn, user);
    if (!p) {
        krt__node_free(ctx->sched, n);
        return KRT_ENOMEM;
    }
    if (!s_local(ctx->sys, to) && to != KRT_ADDR_NONE)
        krt__remote_interest(ctx->sys, ctx->actor);
    n->kind = KRT_NK_REQUEST;
    n->msg = (krt_msg_t){type, (uint32_t)len,   ctx->actor->addr, p->timer.ref, n->data,
                         0,    KRT_KIND_REQUEST};
    if (len)
        memcpy(n->data, body, len);
    int rc = krt__send_node(ctx->sys, to, n);
    return rc ? s_fail_later(ctx, p, rc) : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Answering                                                                                  */

/* The running actor answers (to, ref): it no longer holds that request. */
static void s_answered(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref)
{
    krt_node_t *cur = ctx->node;
    if (cur && cur->kind == KRT_NK_REQUEST && cur->msg.ref == ref && cur->msg.from == to)
        ctx->replied = true;
    else if (ctx->actor->ext && ctx->actor->ext->n_rels)
        krt__rel_del(ctx->actor, KRT_REL_REQ_IN, to, ref, NULL);
}

static int s_answer(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int32_t status,
                    const void *body, size_t len)
{
    if (len && !body)
        return KRT_EINVAL;
    if (to == KRT_ADDR_NONE) {
        if (!(ref & KRT_CALL_REF_BIT))
            return KRT_ENOACTOR;
        krt__call_complete(ctx->sys, ref, ctx->actor->addr, type, status, body, len);
        return 0;
    }
    s_answered(ctx, to, ref);
    return krt__send_env(ctx->sys, to, ctx->actor->addr, type, ref, KRT_NK_REPLY, status, body,
                         len);
}

int krt_reply_to(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, const void *body,
                 size_t len)
{
    return s_answer(ctx, to, ref, type, 0, body, len);
}

int krt_reply(krt_ctx_t *ctx, const krt_msg_t *msg, uint32_t type, const void *body, size_t len)
{
    return s_answer(ctx, msg->from, msg->ref, type, 0, body, len);
}

int krt_reply_error_to(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int status, const char *message)
{
    if (status >= 0)
        return KRT_EINVAL;
    if (!message)
        message = krt_strerror(status);
    return s_answer(ctx, to, ref, KRT_MSG_ERROR, status, message, strlen(message) + 1);
}

int krt_reply_error(krt_ctx_t *ctx, const krt_msg_t *req, int status, const char *message)
{
    return krt_reply_error_to(ctx, req->from, req->ref, status, message);
}
