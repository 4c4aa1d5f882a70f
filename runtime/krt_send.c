/*
 * Sending: copies and pointer bodies, the envelope of a message, remote addresses through the
 * transport, inbound messages from other nodes.
 */
#include "krt_int.h"

#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Sending                                                                                    */

/* Hands the message to the transport; a scheduler flushes at the end of its turn, any other
 * thread at once. */
static int s_transport_send(krt_system_t *sys, krt_sched_t *me, krt_addr_t to, const krt_node_t *n)
{
    pthread_mutex_lock(&sys->transport_lock);
    krt_transport_t t = sys->transport;
    pthread_mutex_unlock(&sys->transport_lock);
    if (!t.send)
        return KRT_EREMOTE;
    krt_msg_t tmp;
    unsigned char wire[12];
    int rc = t.send(t.self, to, krt__remote_wire(n, &tmp, wire));
    if (!t.flush)
        return rc;
    if (!me) {
        t.flush(t.self);
    } else if (!me->remote_dirty || me->rt.self != t.self) {
        if (me->remote_dirty && me->rt.flush)
            me->rt.flush(me->rt.self);
        me->remote_dirty = true;
        me->rt = t;
    }
    return rc;
}

int krt__send_remote(krt_system_t *sys, krt_addr_t to, krt_node_t *n)
{
    int rc;
    krt_sched_t *me = krt__self_sched(sys);
    if (n->flags & KRT_NF_PTR)
        rc = KRT_EMSGSIZE;
    else if (!atomic_load(&sys->has_transport))
        rc = KRT_EREMOTE;
    else
        rc = s_transport_send(sys, me, to, n);
    krt__node_free(me, n);
    return rc;
}

void krt__out_flush(krt_sched_t *s)
{
    if (!s->out_n)
        return;
    krt__push_chain(s->sys, s->out_a, s->out_head, s->out_tail, s->out_n);
    krt__release(s->sys, s->out_to);
    s->out_n = 0;
}

/* Links n at the end of the batch (which holds something) and flushes a full one. */
static inline void s_out_append(krt_sched_t *s, krt_node_t *n)
{
    atomic_store_explicit(&s->out_tail->next, &n->link, memory_order_relaxed);
    s->out_tail = &n->link;
    if (++s->out_n == KRT_OUT_BATCH)
        krt__out_flush(s);
}

/* The node KRT_CHAIN_AHEAD pops down the magazine m will likely carry this batch's (or the next
 * one's) message that many links on: the consumer prefetches it from n. */
static inline void s_chain_ahead(krt_node_t *n, const krt_mag_t *m)
{
    n->ahead = m && m->n >= KRT_CHAIN_AHEAD ? m->v[m->n - KRT_CHAIN_AHEAD] : NULL;
}

/* Adds n to the handler's outgoing batch to `to`, starting one if it holds nothing. The target
 * stays pinned while the batch holds messages for it, so a send either fails with KRT_ENOACTOR
 * here or lands before the target's final drain, as an unbatched one; a reaper of the target
 * waits at most until the handler returns or KRT_OUT_BATCH more sends. */
static int s_out_add(krt_sched_t *s, krt_addr_t to, krt_node_t *n)
{
    s_chain_ahead(n, s->mag[krt__node_class(n)]);
    if (s->out_n) {
        s_out_append(s, n);
        return 0;
    }
    krt_actor_t *a = krt__acquire(s->sys, to);
    if (!a) {
        krt__node_free(s, n);
        return KRT_ENOACTOR;
    }
    s->out_a = a;
    s->out_to = to;
    s->out_head = s->out_tail = &n->link;
    s->out_n = 1;
    return 0;
}

/* Whether a handler's send to `to` joins the outgoing batch: it does from its second send in a
 * row to one actor on, so a handler that sends an actor one message pushes it at once. */
static bool s_out_joins(krt_sched_t *s, krt_addr_t to)
{
    if (s->out_n && s->out_to == to)
        return true;
    krt__out_flush(s);
    if (s->out_last == to)
        return true;
    s->out_last = to;
    return false;
}

int krt__send_node(krt_system_t *sys, krt_addr_t to, krt_node_t *n)
{
    krt_sched_t *me = krt__self_sched(sys);
    if (to == KRT_ADDR_NONE) {
        krt__node_free(me, n);
        return KRT_ENOACTOR;
    }
    if (krt_addr_node(to) != sys->node_id) {
        krt__out_sync(sys);
        return krt__send_remote(sys, to, n);
    }
    if (me && me->out_on && s_out_joins(me, to))
        return s_out_add(me, to, n);
    krt_actor_t *a = krt__acquire(sys, to);
    if (!a) {
        krt__node_free(me, n);
        return KRT_ENOACTOR;
    }
    krt__push(sys, a, n);
    krt__release(sys, to);
    return 0;
}

/* The envelope kind of a node kind. */
static inline uint8_t s_env_kind(uint16_t kind)
{
    return kind == KRT_NK_REQUEST ? KRT_KIND_REQUEST
           : kind == KRT_NK_REPLY ? KRT_KIND_REPLY
                                  : KRT_KIND_PLAIN;
}

int krt__send_copy(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint32_t type, uint64_t ref,
                   uint16_t kind, const void *body, size_t len)
{
    return krt__send_env(sys, to, from, type, ref, kind, 0, body, len);
}

int krt__send_env(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint32_t type, uint64_t ref,
                  uint16_t kind, int32_t status, const void *body, size_t len)
{
    if (len && !body)
        return KRT_EINVAL;
    krt_sched_t *me = krt__self_sched(sys);
    if (me && (++me->turn_sends & 63) == 0)
        krt__share_work(sys, me);
    krt_node_t *n = krt__node_new(me, len);
    if (!n)
        return KRT_ENOMEM;
    n->kind = kind;
    n->msg.type = type;
    n->msg.len = (uint32_t)len;
    n->msg.from = from;
    n->msg.ref = ref;
    n->msg.status = status;
    n->msg.kind = s_env_kind(kind);
    n->msg.body = n->data;
    if (len)
        memcpy(n->data, body, len);
    return krt__send_node(sys, to, n);
}

/* A runtime-internal message node with a copy of body (NULL: out of memory). */
static krt_node_t *s_sys_node(krt_sched_t *s, krt_addr_t from, uint16_t kind, uint64_t ref,
                              uint32_t aux, const void *body, size_t len)
{
    krt_node_t *n = krt__node_new(s, len);
    if (!n)
        return NULL;
    n->kind = kind;
    n->aux = aux;
    n->msg.from = from;
    n->msg.ref = ref;
    n->msg.len = (uint32_t)len;
    n->msg.body = n->data;
    if (len)
        memcpy(n->data, body, len);
    return n;
}

void krt__send_sys(krt_system_t *sys, krt_addr_t to, krt_addr_t from, uint16_t kind, uint64_t ref,
                   uint32_t aux, const void *body, size_t len)
{
    krt_node_t *n = s_sys_node(krt__self_sched(sys), from, kind, ref, aux, body, len);
    if (n)
        krt__send_node(sys, to, n);
}

void krt__push_self(krt_ctx_t *ctx, krt_addr_t from, uint16_t kind, uint64_t ref, uint32_t aux,
                    const void *body, size_t len)
{
    krt_node_t *n = s_sys_node(ctx->sched, from, kind, ref, aux, body, len);
    if (!n)
        return;
    krt__out_flush(ctx->sched); /* after what this handler sent to itself so far */
    krt__push(ctx->sys, ctx->actor, n);
}

/* A stream's next message: the handler's batch already holds messages to `to` (local and
 * pinned) and the loaded magazine of the body's class has a node, so what krt__send_env and
 * krt__send_node would look up and decide is known. Returns the node, its header written and
 * *mag its magazine; NULL: take the general path. */
static inline krt_node_t *s_stream_node(krt_ctx_t *ctx, krt_addr_t to, uint32_t type,
                                        const void *body, size_t len, krt_mag_t **mag)
{
    krt_sched_t *s = ctx->sched;
    if (!s || !s->out_n || s->out_to != to || len > KRT_INLINE_CAP || (len && !body))
        return NULL;
    krt_mag_t *m = s->mag[krt__len_class(len)];
    if (!m || !m->n || ((s->turn_sends + 1) & 63) == 0) /* every 64th: krt__share_work */
        return NULL;
    s->turn_sends++;
    krt_node_t *n = krt__mag_pop(m);
    n->kind = KRT_NK_USER;
    n->aux = 0;
    n->msg = (krt_msg_t){.type = type,
                         .len = (uint32_t)len,
                         .from = ctx->actor->addr,
                         .body = n->data,
                         .kind = KRT_KIND_PLAIN};
    *mag = m;
    return n;
}

/* Appends the stream's node n, popped from m, to the batch. */
static inline int s_stream_add(krt_sched_t *s, const krt_mag_t *m, krt_node_t *n)
{
    s_chain_ahead(n, m);
    s_out_append(s, n);
    return 0;
}

__attribute__((noinline)) static int s_send(krt_ctx_t *ctx, krt_addr_t to, uint32_t type,
                                            const void *body, size_t len)
{
    return krt__send_copy(ctx->sys, to, ctx->actor->addr, type, 0, KRT_NK_USER, body, len);
}

/* A send with a body, out of line: krt_send's body-less case then checks no length and calls
 * nothing (no registers saved) unless its batch is full. */
__attribute__((noinline)) static int s_send_body(krt_ctx_t *ctx, krt_addr_t to, uint32_t type,
                                                 const void *body, size_t len)
{
    krt_mag_t *m;
    krt_node_t *n = s_stream_node(ctx, to, type, body, len, &m);
    if (!n)
        return s_send(ctx, to, type, body, len);
    memcpy(n->data, body, len);
    return s_stream_add(ctx->sched, m, n);
}

int krt_send(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, const void *body, size_t len)
{
    if (len)
        return s_send_body(ctx, to, type, body, len);
    krt_mag_t *m;
    krt_node_t *n = s_stream_node(ctx, to, type, NULL, 0, &m);
    if (!n)
        return s_send(ctx, to, type, NULL, 0);
    return s_stream_add(ctx->sched, m, n);
}

int krt_send_ptr(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, void *ptr, void (*free_fn)(void *))
{
    krt_node_t *n = krt__node_new(ctx->sched, sizeof(krt_free_fn));
    if (!n) {
        if (free_fn)
            free_fn(ptr);
        return KRT_ENOMEM;
    }
    n->flags |= KRT_NF_PTR;
    memcpy(n->data, &free_fn, sizeof(krt_free_fn));
    n->msg.type = type;
    n->msg.from = ctx->actor->addr;
    n->msg.body = ptr;
    return krt__send_node(ctx->sys, to, n);
}

void *krt_msg_take(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    krt_node_t *n = ctx->node;
    if (!n || &n->msg != msg || !(n->flags & KRT_NF_PTR))
        return NULL;
    n->flags |= KRT_NF_TAKEN;
    return (void *)msg->body;
}

int krt_system_send(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len)
{
    return krt__send_copy(sys, to, KRT_ADDR_NONE, type, 0, KRT_NK_USER, body, len);
}

int krt_system_deliver(krt_system_t *sys, krt_addr_t to, const krt_msg_t *msg)
{
    if (krt_addr_node(to) != sys->node_id)
        return KRT_EREMOTE;
    int rc;
    if (krt__remote_deliver(sys, to, msg, &rc))
        return rc;
    uint16_t kind = msg->kind == KRT_KIND_REQUEST ? KRT_NK_REQUEST
                    : msg->kind == KRT_KIND_REPLY ? KRT_NK_REPLY
                                                  : KRT_NK_USER;
    rc = krt__send_env(sys, to, msg->from, msg->type, msg->ref, kind, msg->status, msg->body,
                       msg->len);
    if (rc == KRT_ENOACTOR && kind == KRT_NK_REQUEST && msg->from != KRT_ADDR_NONE)
        krt__request_orphan(sys, to, msg->from, msg->ref);
    return rc;
}

void krt_system_set_transport(krt_system_t *sys, const krt_transport_t *t)
{
    pthread_mutex_lock(&sys->transport_lock);
    if (t)
        sys->transport = *t;
    else
        memset(&sys->transport, 0, sizeof sys->transport);
    atomic_store(&sys->has_transport, t && t->send);
    pthread_mutex_unlock(&sys->transport_lock);
}

uint16_t krt_system_node_id(const krt_system_t *sys)
{
    return sys->node_id;
}
