/* ka_membership: lease, fencing and mesh peers from the node table (membership.h). */
#include "membership.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_CALL_MS 2000 /* a store request that takes longer counts as failed */

typedef struct s_peer {
    uint16_t id;
    int64_t incarnation;
} s_peer_t;

typedef struct s_member {
    ka_membership_args_t a;
    char path[160];
    krt_timer_t tick;
    bool registered;       /* holds a lease (mirrors status->member) */
    bool busy;             /* a renewal round (register or renew, then list) in flight */
    bool leaving;          /* KA_CLUSTER_LEAVE received: no more rounds */
    bool forgetting;       /* a row's removal in flight */
    uint32_t forget_next;  /* the table row to look at first next time (rows it kept go round) */
    krt_addr_t leave_from; /* ... and whom to answer */
    uint64_t leave_ref;
    int64_t lease_deadline; /* monotonic ms: the lease ends no earlier than this */
    int64_t fenced_at;      /* monotonic ms of the last fencing; 0 = never */
    int64_t sent_at;        /* monotonic ms the round's register/renew was sent */
    s_peer_t peers[KA_CLUSTER_MAX];
    size_t n_peers;
    ka_store_node_list_t *table; /* the node table as last read (NULL before) */
} s_member_t;

static krt_addr_t s_store(krt_ctx_t *ctx, const s_member_t *m)
{
    return krt_whereis(krt_ctx_system(ctx), m->a.store);
}

/* ---- peers ---------------------------------------------------------------------------------- */

static s_peer_t *s_peer(s_member_t *m, uint16_t id)
{
    for (size_t i = 0; i < m->n_peers; i++)
        if (m->peers[i].id == id)
            return &m->peers[i];
    return NULL;
}

static void s_drop(s_member_t *m, size_t i, const char *why)
{
    krt_mesh_disconnect(m->a.mesh, m->peers[i].id);
    krt_log(KRT_LOG_INFO, m->path, "peer_disconnected", "node=%u incarnation=%lld reason=%s",
            (unsigned)m->peers[i].id, (long long)m->peers[i].incarnation, why);
    m->peers[i] = m->peers[--m->n_peers];
    atomic_store(&m->a.status->peers_connected, (unsigned)m->n_peers);
}

static void s_drop_all(s_member_t *m, const char *why)
{
    while (m->n_peers)
        s_drop(m, m->n_peers - 1, why);
}

static void s_connect(s_member_t *m, uint16_t id, const ka_store_node_t *row)
{
    if (m->n_peers == KA_CLUSTER_MAX)
        return;
    int rc = krt_mesh_connect(m->a.mesh, id, row->mesh_endpoint, row->public_key);
    if (rc) {
        krt_log(KRT_LOG_WARN, m->path, "peer_connect_failed", "node=%u endpoint=%s error=%s",
                (unsigned)id, row->mesh_endpoint, krt_strerror(rc));
        return;
    }
    m->peers[m->n_peers++] = (s_peer_t){id, row->incarnation};
    atomic_store(&m->a.status->peers_connected, (unsigned)m->n_peers);
    krt_log(KRT_LOG_INFO, m->path, "peer_connected", "node=%u name=%s endpoint=%s incarnation=%lld",
            (unsigned)id, row->name, row->mesh_endpoint, (long long)row->incarnation);
}

uint16_t ka_membership_node_id(const ka_store_node_t *row)
{
    long v = strtol(row->id, NULL, 10);
    return v > 0 && v <= 65535 ? (uint16_t)v : 0;
}

static const ka_store_node_t *s_row(const ka_store_node_list_t *l, uint16_t id)
{
    for (uint32_t i = 0; l && i < l->count; i++)
        if (ka_membership_node_id(&l->items[i]) == id)
            return &l->items[i];
    return NULL;
}

/* Peers follow the table: gone, lapsed or reincarnated ones are dropped, live ones added. */
static void s_sync_peers(s_member_t *m)
{
    if (!m->a.mesh)
        return;
    for (size_t i = m->n_peers; i-- > 0;) {
        const ka_store_node_t *row = s_row(m->table, m->peers[i].id);
        if (!row)
            s_drop(m, i, "row_gone");
        else if (!row->alive)
            s_drop(m, i, "lease_lapsed");
        else if (row->incarnation != m->peers[i].incarnation)
            s_drop(m, i, "new_incarnation");
    }
    uint16_t self = ka_membership_node_id(&m->a.self);
    for (uint32_t i = 0; m->table && i < m->table->count; i++) {
        const ka_store_node_t *row = &m->table->items[i];
        uint16_t id = ka_membership_node_id(row);
        if (id && id != self && row->alive && row->mesh_endpoint[0] && !s_peer(m, id))
            s_connect(m, id, row);
    }
}

/* ---- lease ---------------------------------------------------------------------------------- */

static void s_lease_until(s_member_t *m, int64_t deadline)
{
    m->lease_deadline = deadline;
    atomic_store(&m->a.status->lease_deadline, deadline);
}

static void s_fence(s_member_t *m, const char *why)
{
    if (!m->registered)
        return;
    m->registered = false;
    m->fenced_at = krt_mono_ms();
    atomic_fetch_add(&m->a.status->fenced_total, 1); /* first: whoever sees the flag, counts it */
    atomic_store(&m->a.status->member, false);
    krt_log(KRT_LOG_WARN, m->path, "node_fenced",
            "incarnation=%lld reason=%s: not a member until it registers again",
            (long long)atomic_load(&m->a.status->incarnation), why);
    s_drop_all(m, "fenced");
}

/* Keeps a copy of a node list as the table (on allocation failure the old one stays). */
static void s_keep_table(s_member_t *m, const ka_store_node_list_t *l, size_t len)
{
    ka_store_node_list_t *copy = malloc(len);
    if (!copy)
        return;
    memcpy(copy, l, len);
    m->table = copy;
    free(ka_membership_publish(m->a.status, copy));
}

static void s_on_forgot(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_member_t *m = state;
    m->forgetting = false;
    const ka_store_node_list_t *l = reply ? reply->body : NULL;
    const char *why = NULL;
    if (ka_store_outcome(err, reply, sizeof *l, &why))
        krt_log(KRT_LOG_WARN, m->path, "node_forget_failed", "error=%s", why ? why : "-");
    else if (l->count == 1 && reply->len == sizeof *l + sizeof l->items[0])
        krt_log(KRT_LOG_INFO, m->path, "node_forgotten",
                "node=%s name=%s incarnation=%lld: its lease lapsed over %lld ms ago",
                l->items[0].id, l->items[0].name, (long long)l->items[0].incarnation,
                (long long)m->a.forget_ms);
}

/* Removes one row of another node long dead and with no live sandbox (the store re-checks
 * both by the database's clock, so this clock only chooses when to ask). */
static void s_forget_dead(krt_ctx_t *ctx, s_member_t *m)
{
    if (m->forgetting)
        return;
    int64_t now = krt_wall_ms();
    uint16_t self = ka_membership_node_id(&m->a.self);
    uint32_t n = m->table ? m->table->count : 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (m->forget_next + k) % n;
        const ka_store_node_t *row = &m->table->items[i];
        if (row->alive || row->sandboxes || ka_membership_node_id(row) == self ||
            row->lease_expires_ms + m->a.forget_ms > now)
            continue;
        ka_store_node_heartbeat_t f = {.lease_ms = m->a.forget_ms, .incarnation = row->incarnation};
        snprintf(f.id, sizeof f.id, "%s", row->id);
        m->forget_next = i + 1;
        m->forgetting = krt_request(ctx, s_store(ctx, m), KA_STORE_NODE_FORGET, &f, sizeof f,
                                    S_CALL_MS, s_on_forgot, NULL) == 0;
        return;
    }
}

static void s_on_list(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_member_t *m = state;
    m->busy = false;
    const ka_store_node_list_t *l = reply ? reply->body : NULL;
    if (ka_store_outcome(err, reply, sizeof *l, NULL) ||
        reply->len != sizeof *l + l->count * sizeof l->items[0])
        return;
    s_keep_table(m, l, reply->len);
    if (m->registered) {
        s_sync_peers(m);
        s_forget_dead(ctx, m);
    }
}

static void s_list(krt_ctx_t *ctx, s_member_t *m)
{
    if (krt_request(ctx, s_store(ctx, m), KA_STORE_NODE_LIST, NULL, 0, S_CALL_MS, s_on_list, NULL))
        m->busy = false;
}

/* The registration's or the renewal's answer: the row, or why not. */
static const ka_store_node_t *s_row_reply(int err, const krt_msg_t *reply, int *status)
{
    const ka_store_node_list_t *l = reply ? reply->body : NULL;
    if ((*status = ka_store_outcome(err, reply, sizeof *l, NULL)) != 0)
        return NULL;
    if (reply->len < sizeof *l + sizeof l->items[0] || l->count != 1) {
        *status = KA_STORE_EINVAL;
        return NULL;
    }
    return &l->items[0];
}

static void s_on_register(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_member_t *m = state;
    int status;
    const ka_store_node_t *row = s_row_reply(err, reply, &status);
    if (!row) {
        m->busy = false;
        krt_log(KRT_LOG_WARN, m->path, "register_failed", "error=%s", krt_strerror(status));
        return;
    }
    if (!m->table) /* until the first read of the table: this node's own row */
        s_keep_table(m, (const ka_store_node_list_t *)reply->body,
                     sizeof(ka_store_node_list_t) + sizeof *row);
    m->registered = true;
    s_lease_until(m, m->sent_at + m->a.lease_ms);
    atomic_store(&m->a.status->incarnation, row->incarnation);
    atomic_store(&m->a.status->member, true);
    krt_log(KRT_LOG_INFO, m->path, "node_registered",
            "node=%s name=%s incarnation=%lld mesh=%s lease_ms=%d", row->id, row->name,
            (long long)row->incarnation, row->mesh_endpoint[0] ? row->mesh_endpoint : "none",
            m->a.lease_ms);
    s_list(ctx, m);
}

static void s_on_renew(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_member_t *m = state;
    int status;
    const ka_store_node_t *row = s_row_reply(err, reply, &status);
    if (row) {
        if (m->registered) /* else it fenced itself meanwhile: it registers anew */
            s_lease_until(m, m->sent_at + m->a.lease_ms);
    } else if (status == KA_STORE_ENOTFOUND) {
        s_fence(m, "renewal_refused");
    } else {
        krt_log(KRT_LOG_WARN, m->path, "renew_failed", "error=%s", krt_strerror(status));
    }
    s_list(ctx, m);
}

static void s_round(krt_ctx_t *ctx, s_member_t *m)
{
    int64_t now = krt_mono_ms();
    if (m->registered && now >= m->lease_deadline)
        s_fence(m, "lease_lapsed");
    if (m->busy)
        return;
    if (!m->registered && m->fenced_at && now < m->fenced_at + m->a.lease_ms)
        return; /* fenced: stay out for one lease, so every peer sees this node gone */
    m->busy = true;
    m->sent_at = now;
    int rc;
    if (m->registered) {
        ka_store_node_heartbeat_t hb = {.lease_ms = m->a.lease_ms,
                                        .incarnation = atomic_load(&m->a.status->incarnation)};
        snprintf(hb.id, sizeof hb.id, "%s", m->a.self.id);
        rc = krt_request(ctx, s_store(ctx, m), KA_STORE_NODE_HEARTBEAT, &hb, sizeof hb, S_CALL_MS,
                         s_on_renew, NULL);
    } else {
        rc = krt_request(ctx, s_store(ctx, m), KA_STORE_NODE_PUT, &m->a.self, sizeof m->a.self,
                         S_CALL_MS, s_on_register, NULL);
    }
    if (rc)
        m->busy = false;
}

/* ---- requests ------------------------------------------------------------------------------- */

static void s_on_left(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_member_t *m = state;
    int status;
    const ka_store_node_t *row = s_row_reply(err, reply, &status);
    krt_log(row ? KRT_LOG_INFO : KRT_LOG_WARN, m->path, "node_left", "incarnation=%lld lease=%s",
            (long long)atomic_load(&m->a.status->incarnation),
            row ? "ended" : krt_strerror(status));
    krt_reply_to(ctx, m->leave_from, m->leave_ref, KA_CLUSTER_LEAVE, NULL, 0);
}

/* A clean stop: the lease ends now (lease_ms 0) instead of lapsing a lease later. */
static void s_leave(krt_ctx_t *ctx, s_member_t *m, const krt_msg_t *msg)
{
    bool held = m->registered;
    m->leaving = true;
    m->registered = false;
    atomic_store(&m->a.status->member, false);
    krt_timer_cancel(ctx, &m->tick);
    s_drop_all(m, "leaving");
    m->leave_from = msg->from;
    m->leave_ref = msg->ref;
    ka_store_node_heartbeat_t hb = {.lease_ms = 0,
                                    .incarnation = atomic_load(&m->a.status->incarnation)};
    snprintf(hb.id, sizeof hb.id, "%s", m->a.self.id);
    if (!held || krt_request(ctx, s_store(ctx, m), KA_STORE_NODE_HEARTBEAT, &hb, sizeof hb,
                             S_CALL_MS, s_on_left, NULL))
        krt_reply(ctx, msg, KA_CLUSTER_LEAVE, NULL, 0);
}

/* A row as this node sees it: itself, a mesh peer, heard from lately. */
static void s_view(s_member_t *m, const ka_store_node_t *row, ka_cluster_node_t *out)
{
    uint16_t id = ka_membership_node_id(row);
    out->row = *row;
    out->self = id == ka_membership_node_id(&m->a.self);
    out->connected = !out->self && s_peer(m, id) != NULL;
    out->mesh_up = out->connected && krt_mesh_node_up(m->a.mesh, id);
}

static void s_on_drained(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_member_t *m = state;
    krt_msg_t *req = user;
    int status;
    const char *why = NULL;
    const ka_store_node_t *row = s_row_reply(err, reply, &status);
    if (!row) {
        ka_store_outcome(err, reply, sizeof(ka_store_node_list_t), &why);
        krt_reply_error_to(ctx, req->from, req->ref,
                           status == KA_STORE_ENOTFOUND ? -ENOENT : KA_STORE_EUNAVAIL, why);
    } else {
        ka_cluster_node_t out;
        s_view(m, row, &out);
        krt_reply_to(ctx, req->from, req->ref, KA_CLUSTER_DRAIN, &out, sizeof out);
        krt_log(KRT_LOG_INFO, m->path, "node_drained", "node=%s name=%s", row->id, row->name);
        if (!m->busy) { /* placement here sees it at once */
            m->busy = true;
            s_list(ctx, m);
        }
    }
    free(req);
}

/* Marks a node draining in the table (any node may drain any node). */
static void s_drain(krt_ctx_t *ctx, s_member_t *m, const krt_msg_t *msg)
{
    ka_store_node_heartbeat_t d;
    memset(&d, 0, sizeof d);
    if (msg->len == 0 || msg->len > sizeof d.id || ((const char *)msg->body)[msg->len - 1]) {
        krt_reply_error(ctx, msg, KRT_EINVAL, "the node id must be a NUL-terminated string");
        return;
    }
    memcpy(d.id, msg->body, msg->len);
    krt_msg_t *req = malloc(sizeof *req); /* who to answer */
    if (!req) {
        krt_reply_error(ctx, msg, KRT_ENOMEM, "out of memory");
        return;
    }
    *req = (krt_msg_t){.from = msg->from, .ref = msg->ref};
    if (krt_request(ctx, s_store(ctx, m), KA_STORE_NODE_DRAIN, &d, sizeof d, S_CALL_MS,
                    s_on_drained, req)) {
        free(req);
        krt_reply_error(ctx, msg, KRT_ENOMEM, "out of memory");
    }
}

static void s_nodes(krt_ctx_t *ctx, s_member_t *m, const krt_msg_t *msg)
{
    uint32_t n = m->table ? m->table->count : 0;
    size_t len = sizeof(ka_cluster_nodes_t) + n * sizeof(ka_cluster_node_t);
    ka_cluster_nodes_t *out = calloc(1, len);
    if (!out) {
        krt_reply_error(ctx, msg, KRT_ENOMEM, "out of memory");
        return;
    }
    out->member = m->registered;
    out->count = n;
    for (uint32_t i = 0; i < n; i++)
        s_view(m, &m->table->items[i], &out->items[i]);
    krt_reply(ctx, msg, KA_CLUSTER_NODES, out, len);
    free(out);
}

static void s_tree(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const char *root = msg->body;
    if (msg->len == 0 || root[msg->len - 1] != '\0') {
        krt_reply_error(ctx, msg, KRT_EINVAL, "the root name must be a NUL-terminated string");
        return;
    }
    krt_system_t *sys = krt_ctx_system(ctx);
    krt_addr_t addr = KRT_ADDR_NONE;
    if (root[0] && !(addr = krt_whereis(sys, root))) {
        krt_reply_error(ctx, msg, KRT_ENOACTOR, "no actor is registered under that name");
        return;
    }
    char *json = krt_tree_json(sys, addr);
    if (!json) {
        krt_reply_error(ctx, msg, KRT_ENOMEM, "cannot dump the actor tree");
        return;
    }
    krt_reply(ctx, msg, KA_CLUSTER_TREE, json, strlen(json) + 1);
    free(json);
}

/* ---- behaviour ------------------------------------------------------------------------------ */

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    s_member_t *m = state;
    const ka_membership_args_t *a = arg;
    if (!a || !a->store || !a->status || !ka_membership_node_id(&a->self))
        return KRT_EXIT_ERROR;
    m->a = *a;
    if (m->a.renew_ms <= 0)
        m->a.renew_ms = KA_CLUSTER_RENEW_MS;
    if (m->a.lease_ms <= 0)
        m->a.lease_ms = KA_CLUSTER_LEASE_MS;
    if (m->a.forget_ms <= 0)
        m->a.forget_ms = KA_CLUSTER_FORGET_MS;
    m->a.self.lease_ms = m->a.lease_ms;
    snprintf(m->path, sizeof m->path, "%s/%s", a->self.name, KA_CLUSTER_NAME);
    snprintf(m->a.status->self_id, sizeof m->a.status->self_id, "%s", a->self.id);
    atomic_store(&m->a.status->member, false);
    s_round(ctx, m);
    return krt_timer_arm(ctx, &m->tick, (uint64_t)m->a.renew_ms, KA_CLUSTER_TICK, 0);
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_member_t *m = state;
    switch (msg->type) {
    case KA_CLUSTER_TICK:
        if (m->leaving)
            break;
        krt_timer_arm(ctx, &m->tick, (uint64_t)m->a.renew_ms, KA_CLUSTER_TICK, 0);
        s_round(ctx, m);
        break;
    case KA_CLUSTER_NODES:
        s_nodes(ctx, m, msg);
        break;
    case KA_CLUSTER_TREE:
        s_tree(ctx, msg);
        break;
    case KA_CLUSTER_LEAVE:
        s_leave(ctx, m, msg);
        break;
    case KA_CLUSTER_DRAIN:
        s_drain(ctx, m, msg);
        break;
    default:
        if (msg->kind == KRT_KIND_REQUEST)
            krt_reply_error(ctx, msg, KRT_EINVAL, "unknown request");
        break;
    }
}

/* A restart (or the node's stop) leaves no peer behind: the next instance connects afresh. */
static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_member_t *m = state;
    atomic_store(&m->a.status->member, false);
    s_drop_all(m, "stopping");
    free(ka_membership_publish(m->a.status, NULL));
    m->table = NULL;
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const s_member_t *m = state;
    snprintf(out, cap, "{\"member\":%s,\"incarnation\":%lld,\"peers\":%zu}",
             m->registered ? "true" : "false", (long long)atomic_load(&m->a.status->incarnation),
             m->n_peers);
}

const krt_behaviour_t ka_membership_behaviour = {
    .kind = "cluster",
    .state_size = sizeof(s_member_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};
