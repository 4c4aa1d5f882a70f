/*
 * The sandboxes manager in a cluster (sandboxes_int.h): placement of creates, calls for
 * sandboxes another node serves, takeover of a lapsed node's sandboxes, and fencing.
 *
 * Placement: a create on any node reads its template's pool and picks a node of that pool with
 * room (power of two choices on the node table, ka_membership_place); another node's manager
 * gets the create as this manager's request (krt_request_name), marked placed so it records the
 * sandbox there, its node in the same insert as the record; its answer is passed on. The table's
 * loads are up to one renewal old, so the node picked may be full by now: its refusal
 * (RESOURCE_EXHAUSTED, -ENOSPC) records nothing (the request id stays unused in the store), so
 * the create, under the same request id, is placed once more on another node of the pool. Any
 * other answer is final: a create that node recorded is never tried elsewhere (and were it tried,
 * the store's insert, idempotent on the request id, would answer it as a replay).
 *
 * Takeover: every TICK_MS a member looks for nodes whose lease lapsed; for each (node,
 * incarnation) it asks the store to move that node's live sandboxes to itself (a
 * compare-and-set on the incarnation: FAILED with reason NodeLost), and adopts them: their TTLs
 * run here, so expiry still happens. A node that registers again recovers only what still
 * names it.
 *
 * Fencing: when this node stops holding its lease (ka_membership_member), every sandbox actor
 * here stops at once (parking its compute, writing nothing); once the node registers again
 * under a new incarnation, it recovers its records as after a restart, and discards the /data
 * it kept of those another node took over meanwhile (or deleted): ka_mgr_sweep_kept, as a
 * node starting after a crash does with what it kept. A node starting recovers
 * only once registered: a lapsed node's sandboxes are either taken over before (they name the
 * taker then) or not at all (the takeover's compare-and-set sees the new incarnation), never
 * both. Every sandbox write carries the node's incarnation (ka_store_fence_t).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"
#include "sandboxes_int.h"

#define WHERE_MAX     10000 /* sandbox locations kept; past it the map starts again */
#define TICK_MS       250   /* a lapsed node is taken over within a quarter second of being seen */
#define TAKEOVER_PAGE 100
#define LAPSED_MAX    8 /* lapsed nodes looked at per tick */

/* ---- where other nodes' sandboxes are, and relays ----------------------------------------- */

typedef struct {
    char node[KA_STORE_NODE_LEN];
    int64_t incarnation;
} s_where_t;

static void s_where_put(s_mgr_t *self, const char *id, const ka_store_node_t *n)
{
    if (!self->where && !(self->where = zhashx_new()))
        return;
    zhashx_set_destructor(self->where, (zhashx_destructor_fn *)zstr_free);
    if (zhashx_size(self->where) >= WHERE_MAX)
        zhashx_purge(self->where);
    s_where_t *w = malloc(sizeof *w);
    if (!w)
        return;
    ka_mgr_copy(w->node, sizeof w->node, n->name);
    w->incarnation = n->incarnation;
    zhashx_update(self->where, id, w);
}

void ka_mgr_cluster_free(s_mgr_t *self)
{
    zhashx_destroy(&self->where);
}

static void s_relay(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const ka_store_node_t *n,
                    const void *body, size_t len, int timeout_ms);

bool ka_mgr_relay_known(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const char *id)
{
    const s_where_t *w = self->where ? zhashx_lookup(self->where, id) : NULL;
    ka_store_node_t n;
    if (!w || ka_membership_find(self->a.member, w->node, &n) || !n.alive ||
        n.incarnation != w->incarnation) {
        if (w)
            zhashx_delete(self->where, id);
        return false;
    }
    if (op->kind == KRT_KIND_REQUEST) {
        op->cached = true;
        s_relay(ctx, self, op, &n, op->body, op->len, RESOLVE_TIMEOUT_MS);
        return true;
    }
    krt_msg_t m = {.type = op->type, .from = op->from, .ref = op->from_ref, .kind = op->kind};
    bool ours = !op->from || krt_addr_node(op->from) == krt_addr_node(krt_self(ctx));
    if (!ours ||
        krt_relay(ctx, ka_membership_node_id(&n), KA_SANDBOXES_NAME, &m, op->body, op->len)) {
        zhashx_delete(self->where, id);
        return false;
    }
    ka_mgr_op_free(self, op);
    return true;
}

/* The answer of a call relayed to another node's manager, for op's caller; when that node went
 * down or did not answer, a call relayed without a read (a location remembered) that nobody took,
 * or a get, reads the record and routes again; a get is answered from the record read before;
 * anything else fails UNAVAILABLE. */
static void s_on_relayed(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    if (err == -ENOSPC) { /* a placed create's node is full: another of its pool may have room */
        const char *full;
        ka_reply_outcome(err, reply, 0, &full);
        if (ka_mgr_place_again(ctx, self, op, full))
            return;
    }
    const char *caller = NULL;
    /* nobody there took it, or a get that can be answered from the record instead */
    bool untaken = err == KRT_ENOACTOR || err == KRT_EREMOTE ||
                   (err && ka_reply_unanswered(err) && op->type == KA_SBX_GET);
    const char *id =
        untaken && op->cached ? ka_sbx_target(op->type, op->body, op->len, &caller) : NULL;
    if (id) {
        zhashx_delete(self->where, id);
        op->cached = false;
        ka_mgr_route_read(ctx, self, op, id, caller);
    } else if (!err) {
        krt_reply_to(ctx, op->from, op->from_ref, reply->type, reply->body, reply->len);
        ka_mgr_op_free(self, op);
    } else if (!ka_reply_unanswered(err)) { /* that node's error reply, as it sent it */
        const char *why;
        ka_reply_outcome(err, reply, 0, &why);
        ka_mgr_fail_op(ctx, self, op, err, why);
    } else if (op->type == KA_SBX_GET && op->rec.id[0]) {
        ka_sbx_reply_t out;
        memset(&out, 0, sizeof out);
        out.sandbox = op->rec;
        krt_reply_to(ctx, op->from, op->from_ref, op->type, &out, sizeof out);
        ka_mgr_op_free(self, op);
    } else {
        char why[KA_MSG_LEN];
        snprintf(why, sizeof why,
                 "the sandbox's node did not answer (%s); the call may have had effects; retry",
                 krt_strerror(err));
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, why);
    }
}

/* Hands op's call (body) to node n's manager. A request is relayed as this manager's own
 * (krt_request_name: that node going down fails it at once) and its answer passed on; a plain
 * message (a guest stream's request: its reader has its own deadline) keeps its sender, the
 * reader, which the sandbox's actor answers directly. Only this node's callers travel on (a
 * node speaks only for its own actors). Consumes op. */
static void s_relay(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const ka_store_node_t *n,
                    const void *body, size_t len, int timeout_ms)
{
    uint16_t id = ka_membership_node_id(n);
    int rc = KRT_EREMOTE;
    if (id && op->kind == KRT_KIND_REQUEST) {
        rc = krt_request_name(ctx, id, KA_SANDBOXES_NAME, op->type, body, len, timeout_ms,
                              s_on_relayed, op);
        if (!rc)
            return; /* s_on_relayed answers and frees op */
    } else if (id && (!op->from || krt_addr_node(op->from) == krt_addr_node(krt_self(ctx)))) {
        krt_msg_t m = {.type = op->type, .from = op->from, .ref = op->from_ref, .kind = op->kind};
        rc = krt_relay(ctx, id, KA_SANDBOXES_NAME, &m, body, len);
    }
    if (rc) {
        char why[KA_MSG_LEN];
        snprintf(why, sizeof why, "cannot reach node %s (%s); retry", n->name, krt_strerror(rc));
        ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, why);
        return;
    }
    ka_mgr_op_free(self, op);
}

bool ka_mgr_relay_owner(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const ka_store_sandbox_t *sb)
{
    if (!self->a.member || sb->deleted_ms || !sb->node[0] || strcmp(sb->node, self->a.node) == 0)
        return false;
    ka_store_node_t n;
    if (ka_membership_find(self->a.member, sb->node, &n) == 0 && n.alive) {
        if (op->type != KA_SBX_FORK)
            s_where_put(self, sb->id, &n);
        op->rec = *sb; /* a fork or a long guest call may take minutes: the caller's own
                          deadline bounds it, that node going down ends it at once */
        s_relay(ctx, self, op, &n, op->body, op->len, RESOLVE_TIMEOUT_MS);
        return true;
    }
    if (op->type == KA_SBX_GET)
        return false; /* the record is the answer */
    char why[KA_MSG_LEN];
    snprintf(why, sizeof why,
             "the sandbox's node %s is not reachable; a live node takes its sandboxes over once "
             "its lease lapses; retry",
             sb->node);
    ka_mgr_fail_op(ctx, self, op, KA_EUNAVAIL, why);
    return true;
}

/* ---- placement ------------------------------------------------------------------------------- */

/* spec.substrate.workerPoolRef.name of a template's spec JSON into pool ("" if absent). */
static void s_pool_of(const char *spec_json, char *pool, size_t cap)
{
    json_t *spec = json_loads(spec_json, 0, NULL);
    json_t *name = json_object_get(
        json_object_get(json_object_get(spec, "substrate"), "workerPoolRef"), "name");
    snprintf(pool, cap, "%s", json_is_string(name) ? json_string_value(name) : "");
    json_decref(spec);
}

static uint64_t s_random(void)
{
    static _Thread_local uint64_t x;
    if (!x)
        x = (uint64_t)krt_mono_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)&x;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

/* Create op found no node of its pool with room: RESOURCE_EXHAUSTED naming the pool, and why. */
static void s_no_room(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    const char *pool = op->place.pool, *refused = op->place.refused, *last = op->place.node;
    char why[KA_MSG_LEN]; /* names of 127 at most, the pool's cut: it fits */
    if (!refused[0])
        snprintf(why, sizeof why,
                 "no live node of pool %.100s has room for another sandbox (all full, draining "
                 "or down); retry later",
                 pool);
    else if (strcmp(refused, last) == 0) /* no other node to try */
        snprintf(why, sizeof why,
                 "no node of pool %.100s has room for another sandbox (node %s is full, no other "
                 "live node of the pool has room); delete some or retry later",
                 pool, refused);
    else
        snprintf(why, sizeof why,
                 "no node of pool %.100s has room for another sandbox (nodes %s and %s are "
                 "full); delete some or retry later",
                 pool, refused, last);
    ka_mgr_fail_op(ctx, self, op, -ENOSPC, why);
}

/* No node had room at the first placement: a replay (the store has the create's receipt) is
 * still answered, as a full node answers it; anything else is refused. */
static void s_on_no_room_receipt(krt_ctx_t *ctx, void *state, void *user, int err,
                                 const krt_msg_t *msg)
{
    if (ka_store_outcome(err, msg, sizeof(ka_store_sandbox_reply_t), NULL) == KA_STORE_ENOTFOUND)
        s_no_room(ctx, state, user);
    else
        ka_mgr_on_receipt(ctx, state, user, err, msg);
}

/* Places create op on a node of op->place.pool other than the one that refused it (if any):
 * here, or relayed to that node's manager. After a refusal the receipt was just read (the full
 * node reads it before refusing): none left fails at once. */
static void s_place(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    const char *refused = op->place.refused[0] ? op->place.refused : NULL;
    ka_store_node_t n;
    if (ka_membership_place(self->a.member, op->place.pool, refused, s_random(), &n)) {
        if (refused) {
            s_no_room(ctx, self, op);
            return;
        }
        ka_mgr_ask_receipt(ctx, self, op, s_on_no_room_receipt, op->cr.caller, op->cr.request_id);
        return;
    }
    ka_mgr_copy(op->place.node, sizeof op->place.node, n.name);
    if (strcmp(n.name, self->a.node) == 0) {
        ka_mgr_create_here(ctx, self, op);
        return;
    }
    op->cr.placed = 1;
    s_relay(ctx, self, op, &n, &op->cr, sizeof op->cr, RESOLVE_TIMEOUT_MS);
}

bool ka_mgr_place_again(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op, const char *why)
{
    if (op->type != KA_SBX_CREATE || !op->place.pool[0])
        return false;
    if (op->place.refused[0]) { /* the second node is full too */
        s_no_room(ctx, self, op);
        return true;
    }
    krt_log_actor(ctx, KRT_LOG_INFO, "create_placed_again",
                  "creator=%s request_id=%s pool=%s refused_by=%s msg=\"%s\"", op->cr.caller,
                  op->cr.request_id, op->place.pool, op->place.node, why ? why : "");
    ka_mgr_copy(op->place.refused, sizeof op->place.refused, op->place.node);
    s_place(ctx, self, op);
    return true;
}

static void s_on_template(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    const ka_store_template_t *t = NULL;
    if (!ka_store_outcome(err, msg, sizeof(ka_store_blob_t), NULL))
        t = ka_store_blob_next(msg->body, msg->len, NULL);
    if (t)
        s_pool_of(ka_store_template_spec(t), op->place.pool, sizeof op->place.pool);
    if (!op->place.pool[0]) {
        /* no such template (or unreadable): the create path says what is wrong */
        ka_mgr_create_here(ctx, self, op);
        return;
    }
    s_place(ctx, self, op);
}

void ka_mgr_place(krt_ctx_t *ctx, s_mgr_t *self, s_op_t *op)
{
    ka_store_template_key_t k;
    memset(&k, 0, sizeof k);
    ka_mgr_copy(k.namespace_, sizeof k.namespace_, op->cr.template_namespace);
    ka_mgr_copy(k.name, sizeof k.name, op->cr.template_name);
    ka_mgr_ask(ctx, self, op, s_on_template, ka_peer(ctx, self->a.store), KA_STORE_TEMPLATE_GET, &k,
               sizeof k, STORE_TIMEOUT_MS);
}

/* ---- takeover -------------------------------------------------------------------------------- */

static bool s_taken(const s_mgr_t *self, const ka_store_node_t *n)
{
    uint32_t kept = self->n_taken < 64 ? self->n_taken : 64;
    for (uint32_t i = 0; i < kept; i++)
        if (self->taken[i].incarnation == n->incarnation && strcmp(self->taken[i].id, n->id) == 0)
            return true;
    return false;
}

static void s_mark_taken(s_mgr_t *self, const ka_store_takeover_t *t)
{
    uint32_t i = self->n_taken++ % 64;
    ka_mgr_copy(self->taken[i].id, sizeof self->taken[i].id, t->node_id);
    self->taken[i].incarnation = t->incarnation;
}

static void s_on_takeover(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *msg)
{
    s_mgr_t *self = state;
    s_op_t *op = user;
    self->taking = false;
    const char *why;
    const ka_store_sandbox_list_t *l = msg ? msg->body : NULL;
    int serr = ka_store_outcome(err, msg, sizeof *l, &why);
    if (!serr && msg->len < sizeof *l + l->count * sizeof l->items[0])
        serr = KA_STORE_EINVAL, why = "short reply";
    if (serr) { /* tried again at the next tick */
        krt_log_actor(ctx, KRT_LOG_WARN, "takeover_failed", "node=%s error=%s",
                      op->takeover.node_id, why);
        ka_mgr_op_free(self, op);
        return;
    }
    for (uint32_t i = 0; i < l->count; i++)
        ka_mgr_adopt(ctx, self, &l->items[i], "sandbox_taken_over");
    krt_log_actor(ctx, KRT_LOG_INFO, "node_taken_over", "node=%s incarnation=%lld sandboxes=%u",
                  op->takeover.node_id, (long long)op->takeover.incarnation, l->count);
    if (l->count < TAKEOVER_PAGE)
        s_mark_taken(self, &op->takeover);
    ka_mgr_op_free(self, op);
}

static void s_takeover(krt_ctx_t *ctx, s_mgr_t *self, const ka_store_node_t *n)
{
    s_op_t *op = ka_mgr_op_new(self, NULL);
    if (!op)
        return;
    ka_store_takeover_t *t = &op->takeover;
    ka_mgr_copy(t->node_id, sizeof t->node_id, n->id);
    t->incarnation = n->incarnation;
    ka_mgr_copy(t->taker_id, sizeof t->taker_id, self->a.member->self_id);
    ka_mgr_copy(t->taker, sizeof t->taker, self->a.node);
    t->taker_incarnation = atomic_load(&self->a.member->incarnation);
    ka_mgr_copy(t->reason, sizeof t->reason, KA_FAIL_NODE_LOST);
    snprintf(t->message, sizeof t->message,
             "node %s (%s) stopped renewing its lease: the sandbox's compute and local data "
             "went with it; delete it and create a new one",
             n->name, n->id);
    t->limit = TAKEOVER_PAGE;
    self->taking = true;
    if (krt_request(ctx, ka_peer(ctx, self->a.store), KA_STORE_NODE_TAKEOVER, t, sizeof *t,
                    STORE_TIMEOUT_MS, s_on_takeover, op)) {
        self->taking = false;
        ka_mgr_op_free(self, op);
    }
}

/* ---- fencing and the tick -------------------------------------------------------------------- */

/* This node lost its lease: nothing here may act for its sandboxes any more. Their /data is
 * kept (each actor's terminate parks its compute): what another node takes over meanwhile is
 * discarded once this node is back (ka_mgr_sweep_kept). */
static void s_fence(krt_ctx_t *ctx, s_mgr_t *self)
{
    size_t n = zhashx_size(self->live);
    for (s_slot_t *a = zhashx_first(self->live); a; a = zhashx_next(self->live)) {
        krt_unlink(ctx, a->addr);
        krt_kill(ctx, a->addr, KRT_EXIT_SHUTDOWN);
    }
    zhashx_purge(self->live);
    krt_log_actor(ctx, KRT_LOG_WARN, "sandboxes_fenced",
                  "stopped=%zu: this node lost its lease; its sandboxes are recovered once it "
                  "registers again (those another node took over stay there)",
                  n);
}

void ka_mgr_cluster_tick(krt_ctx_t *ctx, s_mgr_t *self)
{
    krt_timer_arm(ctx, &self->tick, TICK_MS, KA_SBX_CLUSTER_, 0);
    bool member = ka_membership_member(self->a.member);
    int64_t inc = atomic_load(&self->a.member->incarnation);
    if (self->member && !member)
        s_fence(ctx, self);
    if (member && !self->member && inc != self->incarnation) {
        ka_mgr_recover(ctx, self, 1, 0); /* registered (again): what still names this node */
        ka_mgr_recover(ctx, self, 0, 0);
        ka_mgr_sweep_kept(ctx, self);
    }
    self->member = member;
    if (member)
        self->incarnation = inc;
    if (!member || self->taking)
        return;
    ka_store_node_t lapsed[LAPSED_MAX];
    size_t n = ka_membership_lapsed(self->a.member, lapsed, LAPSED_MAX);
    for (size_t i = 0; i < n; i++)
        if (!s_taken(self, &lapsed[i])) {
            s_takeover(ctx, self, &lapsed[i]);
            return;
        }
}

int ka_mgr_cluster_start(krt_ctx_t *ctx, s_mgr_t *self)
{
    return krt_timer_arm(ctx, &self->tick, TICK_MS, KA_SBX_CLUSTER_, 0);
}
