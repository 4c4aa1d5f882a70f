/*
 * Location transparency: runtime signals (link, monitor, exit, down) on the wire, the set of
 * actors with remote relations and what a node going down does to them, the node service
 * (requests to krt_node_addr: WHEREIS, relays) and replies to krt_call from other nodes.
 *
 * Wire signals: a PLAIN envelope of type KRT_WIRE_BASE + node kind, body 12 bytes
 * (reason u32 LE, who u64 LE: the stopped actor of a DOWN), ref in the envelope.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

#define KRT_WIRE_BASE 64u
#define KRT_WIRE_LEN  12u
#define S_NAME_MAX    255

/* The set: open addressing on local addresses, linear probing, backward-shift deletion. */
struct krt_remote {
    pthread_mutex_t lock;
    krt_addr_t *tab;
    size_t cap, n; /* cap: 0 or a power of two */
};

struct krt_remote *krt__remote_new(void)
{
    struct krt_remote *r = calloc(1, sizeof *r);
    if (r)
        pthread_mutex_init(&r->lock, NULL);
    return r;
}

void krt__remote_destroy(struct krt_remote **r_p)
{
    if (!r_p || !*r_p)
        return;
    pthread_mutex_destroy(&(*r_p)->lock);
    free((*r_p)->tab);
    free(*r_p);
    *r_p = NULL;
}

static size_t s_home(const struct krt_remote *r, krt_addr_t a)
{
    return (size_t)((a * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (r->cap - 1);
}

static void s_put(struct krt_remote *r, krt_addr_t a)
{
    size_t i = s_home(r, a);
    while (r->tab[i] && r->tab[i] != a)
        i = (i + 1) & (r->cap - 1);
    if (!r->tab[i])
        r->n++;
    r->tab[i] = a;
}

static bool s_grow(struct krt_remote *r)
{
    size_t cap = r->cap ? r->cap * 2 : 64;
    krt_addr_t *old = r->tab, *nt = calloc(cap, sizeof *nt);
    if (!nt)
        return false;
    size_t old_cap = r->cap;
    r->tab = nt;
    r->cap = cap;
    r->n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            s_put(r, old[i]);
    free(old);
    return true;
}

void krt__remote_interest(krt_system_t *sys, krt_actor_t *a)
{
    if (a->ext && a->ext->remote)
        return;
    krt_ext_t *e = krt__ext(a);
    if (!e)
        return;
    struct krt_remote *r = sys->remote;
    pthread_mutex_lock(&r->lock);
    if ((r->n + 1) * 2 <= r->cap || s_grow(r)) {
        s_put(r, a->addr);
        e->remote = true;
    }
    pthread_mutex_unlock(&r->lock);
}

void krt__remote_forget(krt_system_t *sys, krt_actor_t *a)
{
    if (!a->ext || !a->ext->remote)
        return;
    struct krt_remote *r = sys->remote;
    pthread_mutex_lock(&r->lock);
    size_t i = s_home(r, a->addr);
    while (r->tab[i] && r->tab[i] != a->addr)
        i = (i + 1) & (r->cap - 1);
    if (r->tab[i]) {
        r->tab[i] = KRT_ADDR_NONE;
        r->n--;
        for (size_t j = (i + 1) & (r->cap - 1); r->tab[j]; j = (j + 1) & (r->cap - 1)) {
            krt_addr_t k = r->tab[j];
            r->tab[j] = KRT_ADDR_NONE;
            r->n--;
            s_put(r, k);
        }
    }
    pthread_mutex_unlock(&r->lock);
    a->ext->remote = false;
}

void krt_system_node_down(krt_system_t *sys, uint16_t node)
{
    if (!sys || node == 0 || node == sys->node_id)
        return;
    struct krt_remote *r = sys->remote;
    pthread_mutex_lock(&r->lock);
    size_t n = 0;
    krt_addr_t *who = r->n ? malloc(r->n * sizeof *who) : NULL;
    for (size_t i = 0; who && i < r->cap; i++)
        if (r->tab[i])
            who[n++] = r->tab[i];
    pthread_mutex_unlock(&r->lock);
    if (r->n && !who)
        krt_log(KRT_LOG_ERROR, sys->name, "node_down_lost", "node=%u err=%d", node, KRT_ENOMEM);
    for (size_t i = 0; i < n; i++)
        krt__send_sys(sys, who[i], KRT_ADDR_NONE, KRT_NK_NODEDOWN, 0, node, NULL, 0);
    free(who);
    krt__calls_fail_node(sys, node);
}

void krt__remote_nodedown(krt_ctx_t *ctx, uint16_t node)
{
    krt_actor_t *a = ctx->actor;
    krt_ext_t *e = a->ext;
    for (uint32_t i = e ? e->n_rels : 0; i-- > 0;) {
        krt_rel_t r = e->rels[i];
        if (krt_addr_node(r.peer) != node)
            continue;
        if (r.kind == KRT_REL_LINK) {
            krt__push_self(ctx, r.peer, KRT_NK_LINKEXIT, 0, KRT_EXIT_NOCONN, NULL, 0);
        } else if (r.kind == KRT_REL_MON_OUT) {
            krt_down_t d = {r.peer, r.ref, KRT_EXIT_NOCONN};
            krt__push_self(ctx, KRT_ADDR_NONE, KRT_NK_DOWN, r.ref, 0, &d, sizeof d);
        } else { /* a watcher or a caller there: nothing to tell it any more */
            e->rels[i] = e->rels[--e->n_rels];
        }
    }
    krt__requests_fail_node(ctx, node);
}

/* ---------------------------------------------------------------------------------------- */
/* Signals on the wire                                                                        */

static bool s_wire_kind(uint32_t k)
{
    return k >= KRT_NK_LINK && k <= KRT_NK_DOWN;
}

static void s_le(unsigned char *d, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        d[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t s_get_le(const unsigned char *d, int n)
{
    uint64_t v = 0;
    for (int i = n; i-- > 0;)
        v = (v << 8) | d[i];
    return v;
}

const krt_msg_t *krt__remote_wire(const krt_node_t *n, krt_msg_t *tmp, unsigned char wire[12])
{
    if (!s_wire_kind(n->kind))
        return &n->msg;
    uint32_t reason = n->aux;
    krt_addr_t who = KRT_ADDR_NONE;
    if (n->kind == KRT_NK_DOWN && n->msg.len == sizeof(krt_down_t)) {
        krt_down_t d;
        memcpy(&d, n->msg.body, sizeof d);
        reason = (uint32_t)d.reason;
        who = d.who;
    }
    s_le(wire, reason, 4);
    s_le(wire + 4, who, 8);
    *tmp = (krt_msg_t){.type = KRT_WIRE_BASE + n->kind,
                       .len = KRT_WIRE_LEN,
                       .from = n->msg.from,
                       .ref = n->msg.ref,
                       .body = wire,
                       .kind = KRT_KIND_PLAIN};
    return tmp;
}

/* What a sender learns when its LINK or MONITOR found nobody. */
static void s_noproc(krt_system_t *sys, krt_addr_t to, uint32_t nk, const krt_msg_t *msg)
{
    if (nk == KRT_NK_LINK) {
        krt__send_sys(sys, msg->from, to, KRT_NK_LINKEXIT, 0, KRT_EXIT_NOPROC, NULL, 0);
    } else if (nk == KRT_NK_MONITOR) {
        krt_down_t d = {to, msg->ref, KRT_EXIT_NOPROC};
        krt__send_sys(sys, msg->from, KRT_ADDR_NONE, KRT_NK_DOWN, msg->ref, 0, &d, sizeof d);
    }
}

static int s_signal_in(krt_system_t *sys, krt_addr_t to, const krt_msg_t *msg)
{
    uint32_t nk = msg->type - KRT_WIRE_BASE;
    if (msg->len != KRT_WIRE_LEN || krt_addr_node(msg->from) == sys->node_id)
        return KRT_EINVAL; /* forged: signals from another node name an actor there */
    const unsigned char *b = msg->body;
    uint32_t reason = (uint32_t)s_get_le(b, 4);
    if (nk == KRT_NK_EXIT && reason == KRT_EXIT_KILLED)
        return krt__kill(sys, msg->from, to, KRT_EXIT_KILLED);
    krt_down_t d = {s_get_le(b + 4, 8), msg->ref, (int)reason};
    bool down = nk == KRT_NK_DOWN;
    krt_node_t *n = krt__node_new(krt__self_sched(sys), down ? sizeof d : 0);
    if (!n)
        return KRT_ENOMEM;
    n->kind = (uint16_t)nk;
    n->aux = down ? 0 : reason;
    n->msg.from = down ? KRT_ADDR_NONE : msg->from;
    n->msg.ref = msg->ref;
    n->msg.body = n->data;
    if (down) {
        n->msg.len = sizeof d;
        memcpy(n->data, &d, sizeof d);
    }
    int rc = krt__send_node(sys, to, n);
    if (rc == KRT_ENOACTOR)
        s_noproc(sys, to, nk, msg);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The node service and call replies                                                          */

static int s_whereis_in(krt_system_t *sys, const krt_msg_t *msg)
{
    char name[S_NAME_MAX + 1];
    if (msg->len == 0 || msg->len > S_NAME_MAX || memchr(msg->body, 0, msg->len))
        return KRT_EINVAL;
    memcpy(name, msg->body, msg->len);
    name[msg->len] = 0;
    krt_addr_t who = krt_whereis(sys, name);
    krt_addr_t self = krt_node_addr(sys->node_id);
    if (who == KRT_ADDR_NONE) {
        krt__request_orphan(sys, self, msg->from, msg->ref);
        return 0;
    }
    unsigned char b[8];
    s_le(b, who, 8);
    return krt__send_env(sys, msg->from, self, KRT_MSG_WHEREIS, msg->ref, KRT_NK_REPLY, 0, b,
                         sizeof b);
}

static int s_service_in(krt_system_t *sys, const krt_msg_t *msg)
{
    if (msg->kind == KRT_KIND_REPLY && (msg->ref & KRT_CALL_REF_BIT)) {
        if (msg->type == KRT_MSG_ERROR && msg->status == KRT_ENOACTOR)
            krt__call_fail(sys, msg->ref, KRT_ENOACTOR); /* the target's node answers for it */
        else
            krt__call_complete(sys, msg->ref, msg->from, msg->type, msg->status, msg->body,
                               msg->len);
        return 0;
    }
    if (msg->type == KRT_MSG_RELAY)
        return krt__relay_in(sys, msg);
    if (msg->kind != KRT_KIND_REQUEST || msg->from == KRT_ADDR_NONE)
        return KRT_EINVAL;
    if (msg->type == KRT_MSG_WHEREIS)
        return s_whereis_in(sys, msg);
    krt__request_orphan(sys, krt_node_addr(sys->node_id), msg->from, msg->ref);
    return KRT_ENOACTOR;
}

bool krt__remote_deliver(krt_system_t *sys, krt_addr_t to, const krt_msg_t *msg, int *rc)
{
    if (msg->kind == KRT_KIND_PLAIN && msg->type >= KRT_WIRE_BASE &&
        s_wire_kind(msg->type - KRT_WIRE_BASE)) {
        *rc = s_signal_in(sys, to, msg);
        return true;
    }
    if ((to & KRT_LOCAL_MASK) == 0) {
        *rc = s_service_in(sys, msg);
        return true;
    }
    return false;
}

/* ---------------------------------------------------------------------------------------- */
/* Names across nodes                                                                         */

/* Splits "name@N" / "name@node-N": the node (this one if there is no '@'), 0 if malformed. */
static uint16_t s_split(krt_system_t *sys, const char *s, char *name, size_t cap)
{
    const char *at = strrchr(s, '@');
    size_t len = at ? (size_t)(at - s) : strlen(s);
    if (len == 0 || len >= cap)
        return 0;
    memcpy(name, s, len);
    name[len] = 0;
    if (!at)
        return sys->node_id;
    const char *n = at + 1;
    if (strncmp(n, "node-", 5) == 0)
        n += 5;
    char *end;
    unsigned long id = strtoul(n, &end, 10);
    if (*n < '0' || *n > '9' || *end || id == 0 || id > UINT16_MAX)
        return 0;
    return (uint16_t)id;
}

int krt_whereis_at(krt_system_t *sys, const char *name, int timeout_ms, krt_addr_t *out)
{
    char nm[S_NAME_MAX + 1];
    uint16_t node = sys && name && out ? s_split(sys, name, nm, sizeof nm) : 0;
    if (!node || krt__self_sched(sys))
        return KRT_EINVAL;
    if (node == sys->node_id) {
        *out = krt_whereis(sys, nm);
        return *out ? 0 : KRT_ENOACTOR;
    }
    krt_reply_t r;
    int rc = krt_call(sys, krt_node_addr(node), KRT_MSG_WHEREIS, nm, strlen(nm), timeout_ms, &r);
    if (rc)
        return rc;
    rc = r.status ? r.status : r.len == 8 ? 0 : KRT_EINVAL;
    if (!rc)
        *out = s_get_le(r.body, 8);
    krt_reply_free(&r);
    return rc;
}

int krt_call_name(krt_system_t *sys, const char *name, uint32_t type, const void *body, size_t len,
                  int timeout_ms, krt_reply_t *reply)
{
    if (reply)
        memset(reply, 0, sizeof *reply);
    int64_t t0 = krt_mono_ms();
    krt_addr_t to;
    int rc = krt_whereis_at(sys, name, timeout_ms, &to);
    if (rc)
        return rc;
    int left = timeout_ms;
    if (timeout_ms > 0) {
        left = timeout_ms - (int)(krt_mono_ms() - t0);
        if (left <= 0)
            return KRT_ETIMEDOUT;
    }
    return krt_call(sys, to, type, body, len, left, reply);
}
