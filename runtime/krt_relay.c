/*
 * Relays: a message for a name on a node, its envelope kept (krt_relay).
 *
 * To another node it travels to that node's service address as KRT_MSG_RELAY, with the
 * envelope's sender, ref and kind unchanged and a body of: the message's type (u32 LE), the
 * name's length (u8), the name, then the message's body. The node resolves the name and
 * delivers the message as if it had been sent to that actor; a request for a name it does not
 * know is answered KRT_ENOACTOR by the node.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

#define S_HEAD 5u /* type u32 + name length u8 */

static uint16_t s_nk(uint8_t kind)
{
    return kind == KRT_KIND_REQUEST ? KRT_NK_REQUEST : KRT_NK_USER;
}

/* Delivers to the actor registered as name here, envelope kept. */
static int s_deliver(krt_system_t *sys, const char *name, krt_addr_t from, uint64_t ref,
                     uint8_t kind, uint32_t type, const void *body, size_t len)
{
    krt_addr_t who = krt_whereis(sys, name);
    if (who == KRT_ADDR_NONE)
        return KRT_ENOACTOR;
    return krt__send_env(sys, who, from, type, ref, s_nk(kind), 0, body, len);
}

int krt_relay(krt_ctx_t *ctx, uint16_t node, const char *name, const krt_msg_t *msg,
              const void *body, size_t len)
{
    size_t nl = name ? strlen(name) : 0;
    if (!ctx || !msg || nl == 0 || nl > UINT8_MAX || msg->kind == KRT_KIND_REPLY || (len && !body))
        return KRT_EINVAL;
    krt_system_t *sys = ctx->sys;
    if (node == sys->node_id)
        return s_deliver(sys, name, msg->from, msg->ref, msg->kind, msg->type, body, len);
    krt_addr_t from = msg->from;
    if (from == KRT_ADDR_NONE) /* a krt_call of this node: its reply comes back here */
        from = krt_node_addr(sys->node_id);
    krt_node_t *n = krt__node_new(krt__self_sched(sys), S_HEAD + nl + len);
    if (!n)
        return KRT_ENOMEM;
    unsigned char *d = n->data;
    for (int i = 0; i < 4; i++)
        d[i] = (unsigned char)(msg->type >> (8 * i));
    d[4] = (unsigned char)nl;
    memcpy(d + S_HEAD, name, nl);
    if (len)
        memcpy(d + S_HEAD + nl, body, len);
    n->kind = s_nk(msg->kind);
    n->msg = (krt_msg_t){.type = KRT_MSG_RELAY,
                         .len = (uint32_t)(S_HEAD + nl + len),
                         .from = from,
                         .ref = msg->ref,
                         .body = n->data,
                         .kind = msg->kind};
    return krt__send_node(sys, krt_node_addr(node), n);
}

int krt_request_name(krt_ctx_t *ctx, uint16_t node, const char *name, uint32_t type,
                     const void *body, size_t len, int timeout_ms, krt_reply_fn fn, void *user)
{
    size_t nl = name ? strlen(name) : 0;
    if (!ctx || nl == 0 || nl > UINT8_MAX || type < KRT_MSG_USER || (len && !body))
        return KRT_EINVAL;
    if (node == ctx->sys->node_id)
        return krt_request(ctx, krt_whereis(ctx->sys, name), type, body, len, timeout_ms, fn, user);
    unsigned char *d = malloc(S_HEAD + nl + len);
    if (!d)
        return KRT_ENOMEM;
    for (int i = 0; i < 4; i++)
        d[i] = (unsigned char)(type >> (8 * i));
    d[4] = (unsigned char)nl;
    memcpy(d + S_HEAD, name, nl);
    if (len)
        memcpy(d + S_HEAD + nl, body, len);
    int rc = krt_request(ctx, krt_node_addr(node), KRT_MSG_RELAY, d, S_HEAD + nl + len, timeout_ms,
                         fn, user);
    free(d);
    return rc;
}

int krt__relay_in(krt_system_t *sys, const krt_msg_t *msg)
{
    const unsigned char *d = msg->body;
    if (msg->len < S_HEAD || msg->kind == KRT_KIND_REPLY)
        return KRT_EINVAL;
    size_t nl = d[4];
    if (nl == 0 || msg->len < S_HEAD + nl || memchr(d + S_HEAD, 0, nl))
        return KRT_EINVAL;
    char name[UINT8_MAX + 1];
    memcpy(name, d + S_HEAD, nl);
    name[nl] = 0;
    uint32_t type =
        (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
    if (type < KRT_MSG_USER)
        return KRT_EINVAL; /* runtime messages never travel as relays */
    int rc = s_deliver(sys, name, msg->from, msg->ref, msg->kind, type, d + S_HEAD + nl,
                       msg->len - S_HEAD - nl);
    if (rc == KRT_ENOACTOR && msg->kind == KRT_KIND_REQUEST && msg->from != KRT_ADDR_NONE)
        krt__request_orphan(sys, krt_node_addr(sys->node_id), msg->from, msg->ref);
    return rc;
}
