/* kagent.runtime.v1.RuntimeService: for operators. Actor tree, node, pools, stats, images. */
#include "api_int.h"

#include <fcntl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "images_actor.h"
#include "membership.h"
#include "phases.h"

#define IMPORT_MAX (16ull << 30) /* an image import may be large, but not unbounded */

static bool s_ok(kb_grpc_call_t *call, void *user)
{
    char caller[KB_AUTH_ID_MAX + 1];
    return kb_api_caller(user, call, caller, sizeof caller) == 0;
}

/* A sandbox actor whose described creator is not caller (unknown: not caller's either). */
static bool s_foreign_sandbox(const json_t *node, const char *caller)
{
    const char *kind = json_string_value(json_object_get(node, "kind"));
    const char *creator =
        json_string_value(json_object_get(json_object_get(node, "state"), "creator"));
    return kind && strcmp(kind, "sandbox") == 0 && (!creator || strcmp(creator, caller) != 0);
}

static void s_prune(json_t *tree, const char *caller)
{
    for (size_t i = 0; i < json_array_size(tree);) {
        json_t *node = json_array_get(tree, i);
        if (s_foreign_sandbox(node, caller)) {
            json_array_remove(tree, i);
            continue;
        }
        s_prune(json_object_get(node, "children"), caller);
        i++;
    }
}

/* A tree dump's text as caller may see it (a new reference), or NULL. */
static json_t *s_visible(const char *text, const kb_auth_t *auth, const char *caller)
{
    json_t *tree = text ? json_loads(text, 0, NULL) : NULL;
    if (tree && !kb_auth_is_operator(auth, caller))
        s_prune(tree, caller);
    return tree;
}

json_t *kb_api_visible_tree(krt_system_t *sys, krt_addr_t root, const kb_auth_t *auth,
                            const char *caller)
{
    char *text = krt_tree_json(sys, root);
    json_t *tree = s_visible(text, auth, caller);
    free(text);
    return tree;
}

#define S_REMOTE_MS 5000

/* Another node's tree, from its cluster actor over the mesh (`cluster@N`): the tree, or NULL with
 * why (msg) and the gRPC code. */
static json_t *s_fetch_tree(krt_system_t *sys, int node, const char *root, const kb_auth_t *auth,
                            const char *caller, char *msg, size_t cap, int *code)
{
    char name[64];
    snprintf(name, sizeof name, "%s@%d", KA_CLUSTER_NAME, node);
    krt_reply_t r;
    int rc = krt_call_name(sys, name, KA_CLUSTER_TREE, root, strlen(root) + 1, S_REMOTE_MS, &r);
    if (rc || r.status) {
        snprintf(msg, cap, "node %d did not answer: %s", node,
                 rc ? krt_strerror(rc) : (const char *)r.body);
        *code = !rc && r.status == KRT_ENOACTOR ? KB_GRPC_NOT_FOUND : KB_GRPC_UNAVAILABLE;
        if (!rc)
            krt_reply_free(&r);
        return NULL;
    }
    json_t *tree =
        r.len && ((const char *)r.body)[r.len - 1] == '\0' ? s_visible(r.body, auth, caller) : NULL;
    krt_reply_free(&r);
    if (!tree) {
        snprintf(msg, cap, "cannot read node %d's actor tree", node);
        *code = KB_GRPC_INTERNAL;
    }
    return tree;
}

static json_t *s_remote_tree(kb_grpc_call_t *call, krt_system_t *sys, int node, const char *root,
                             const kb_auth_t *auth, const char *caller)
{
    char msg[256];
    int code;
    json_t *tree = s_fetch_tree(sys, node, root, auth, caller, msg, sizeof msg, &code);
    if (!tree)
        kb_grpc_fail(call, code, msg);
    return tree;
}

/* Appends every other live node's tree to tree (an array); one that does not answer is a root
 * of state "unreachable: ...". */
static void s_cluster_trees(krt_system_t *sys, json_t *tree, const kb_auth_t *auth,
                            const char *caller)
{
    krt_reply_t r;
    if (krt_call(sys, krt_whereis(sys, KA_CLUSTER_NAME), KA_CLUSTER_NODES, NULL, 0, S_REMOTE_MS,
                 &r))
        return;
    const ka_cluster_nodes_t *l = r.body;
    for (uint32_t i = 0; !r.status && r.len >= sizeof *l &&
                         r.len == sizeof *l + l->count * sizeof l->items[0] && i < l->count;
         i++) {
        const ka_cluster_node_t *c = &l->items[i];
        if (c->self || !c->row.alive)
            continue;
        char msg[256], state[300];
        int code;
        int id = ka_membership_node_id(&c->row);
        json_t *t = s_fetch_tree(sys, id, "", auth, caller, msg, sizeof msg, &code);
        if (t) {
            json_array_extend(tree, t);
            json_decref(t);
            continue;
        }
        snprintf(state, sizeof state, "unreachable: %s", msg);
        json_array_append_new(tree, json_pack("{s:s, s:s, s:s, s:s, s:[]}", "kind", "node", "name",
                                              c->row.name, "path", c->row.name, "state", state,
                                              "children"));
    }
    krt_reply_free(&r);
}

static void s_tree(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(api, call, caller, sizeof caller))
        return;
    const Kagent__Runtime__V1__GetActorTreeRequest *req = (const void *)m;
    krt_system_t *sys = ka_service_system(api->o.svc);
    json_t *tree;
    if (req->node_id && req->node_id != (int32_t)krt_system_node_id(sys)) {
        if (!(tree = s_remote_tree(call, sys, req->node_id, req->root, api->o.auth, caller)))
            return;
    } else {
        krt_addr_t root = KRT_ADDR_NONE;
        if (req->root[0] && !(root = krt_whereis(sys, req->root))) {
            kb_grpc_fail(call, KB_GRPC_NOT_FOUND, "no actor is registered under that name");
            return;
        }
        tree = kb_api_visible_tree(sys, root, api->o.auth, caller);
        if (tree && req->cluster && !req->root[0])
            s_cluster_trees(sys, tree, api->o.auth, caller);
    }
    char *json = tree ? json_dumps(tree, JSON_COMPACT) : NULL;
    json_decref(tree);
    if (!json) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "cannot dump the actor tree");
        return;
    }
    Kagent__Runtime__V1__GetActorTreeResponse r =
        KAGENT__RUNTIME__V1__GET_ACTOR_TREE_RESPONSE__INIT;
    r.json = json;
    kb_grpc_reply(call, &r.base);
    free(json);
}

static uint64_t s_live_sandboxes(kb_api_t *api)
{
    krt_reply_t r;
    int code = ka_svc_call_sync(api->o.svc, KA_SBX_COUNT, NULL, 0, 5000, &r);
    uint64_t n = code == KA_OK && r.len == sizeof(ka_sbx_count_t)
                     ? ((const ka_sbx_count_t *)r.body)->live
                     : 0;
    krt_reply_free(&r);
    return n;
}

static void s_stats(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    if (!s_ok(call, user))
        return;
    krt_stats_t st;
    krt_system_stats(ka_service_system(api->o.svc), &st);
    Kagent__Runtime__V1__GetStatsResponse r = KAGENT__RUNTIME__V1__GET_STATS_RESPONSE__INIT;
    r.actors_live = st.actors_live;
    r.actors_spawned = st.actors_spawned;
    r.messages = st.messages;
    r.timers_armed = st.timers_armed;
    r.bytes_live = st.bytes_live;
    r.sandboxes_live = s_live_sandboxes(api);
    kb_grpc_reply(call, &r.base);
}

/* Timings: the sandbox must be the caller's (the control plane says so), then ka_phases. */
static void s_on_timed(void *user, const ka_svc_status_t *st, const void *body, size_t len)
{
    kb_grpc_call_t *call = user;
    static const ka_svc_status_t short_reply = {-EIO, "the control plane sent a short reply"};
    if (st->err || len != sizeof(ka_sbx_reply_t)) {
        kb_api_fail_err(call, st->err ? st : &short_reply);
        return;
    }
    ka_phase_times_t t;
    Kagent__Runtime__V1__SandboxTimings tm = KAGENT__RUNTIME__V1__SANDBOX_TIMINGS__INIT;
    if (ka_phase_get(((const ka_sbx_reply_t *)body)->sandbox.id, &t) == 0) {
        double *out[KA_PHASE_N_] = {
            [KA_PHASE_STORE_INTENT] = &tm.store_intent,
            [KA_PHASE_COMPUTE_START] = &tm.compute_start,
            [KA_PHASE_GUEST_READY] = &tm.guest_ready,
            [KA_PHASE_SUSPEND_UPLOAD] = &tm.suspend_upload,
            [KA_PHASE_RESUME_DOWNLOAD] = &tm.resume_download,
        };
        for (int p = 0; p < KA_PHASE_N_; p++)
            *out[p] = t.seconds[p] > 0 ? t.seconds[p] : 0;
        tm.create_to_ready = t.create_seconds > 0 ? t.create_seconds : 0;
    }
    Kagent__Runtime__V1__GetSandboxTimingsResponse r =
        KAGENT__RUNTIME__V1__GET_SANDBOX_TIMINGS_RESPONSE__INIT;
    r.timings = &tm;
    kb_grpc_reply(call, &r.base);
}

static void s_timings(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    const Kagent__Runtime__V1__GetSandboxTimingsRequest *req = (const void *)m;
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    if (kb_api_caller(api, call, k.caller, sizeof k.caller))
        return;
    if (strlen(req->sandbox_id) >= sizeof k.id || ka_check_uuid(req->sandbox_id)) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, KA_MSG_NOT_UUID);
        return;
    }
    snprintf(k.id, sizeof k.id, "%s", req->sandbox_id);
    if (ka_svc_call(api->o.svc, KA_SBX_GET, &k, sizeof k, 0, s_on_timed, call))
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the sandbox service is not running");
}

static void s_pools(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    if (!s_ok(call, user))
        return;
    size_t n = api->o.n_pools;
    Kagent__Runtime__V1__Pool *pools = calloc(n ? n : 1, sizeof *pools);
    Kagent__Runtime__V1__Pool **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (!pools || !ptrs) {
        free(pools);
        free(ptrs);
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    uint64_t live = s_live_sandboxes(api);
    for (size_t i = 0; i < n; i++) {
        kagent__runtime__v1__pool__init(&pools[i]);
        pools[i].name = (char *)api->o.pools[i].name;
        pools[i].sandbox_class = (char *)api->o.pools[i].klass;
        pools[i].capacity = api->o.pools[i].capacity;
        pools[i].in_use = i == 0 ? (int64_t)live : 0; /* one pool class per node today */
        ptrs[i] = &pools[i];
    }
    Kagent__Runtime__V1__ListPoolsResponse r = KAGENT__RUNTIME__V1__LIST_POOLS_RESPONSE__INIT;
    r.n_pools = n;
    r.pools = ptrs;
    kb_grpc_reply(call, &r.base);
    free(pools);
    free(ptrs);
}

/* One node of ka_cluster_nodes_t into its message; pools point into pools_buf (split in place). */
static void s_node_msg(const ka_cluster_node_t *c, bool member, Kagent__Runtime__V1__Node *out,
                       Google__Protobuf__Timestamp ts[2], char *pools_buf, char **pools,
                       size_t max_pools)
{
    const ka_store_node_t *row = &c->row;
    kagent__runtime__v1__node__init(out);
    out->id = ka_membership_node_id(row);
    out->name = (char *)row->name;
    out->endpoint = (char *)row->endpoint;
    out->mesh_endpoint = (char *)row->mesh_endpoint;
    out->incarnation = row->incarnation;
    out->capacity = row->capacity;
    out->sandboxes = row->sandboxes;
    out->self = c->self;
    out->connected = c->connected;
    out->lease_held = row->alive;
    out->alive = row->alive && (c->self ? member : !row->mesh_endpoint[0] || c->mesh_up);
    out->draining = row->draining;
    kb_api_ts(&ts[0], row->heartbeat_ms);
    kb_api_ts(&ts[1], row->lease_expires_ms);
    out->last_heartbeat = &ts[0];
    out->lease_expires = &ts[1];
    snprintf(pools_buf, KA_STORE_POOLS_LEN, "%s", row->pools);
    out->pools = pools;
    for (char *save = NULL, *p = strtok_r(pools_buf, ",", &save); p && out->n_pools < max_pools;
         p = strtok_r(NULL, ",", &save))
        pools[out->n_pools++] = p;
}

/* Every node of the cluster, from the node table as this node's membership last read it. */
static void s_nodes(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    if (!s_ok(call, user))
        return;
    krt_system_t *sys = ka_service_system(api->o.svc);
    krt_reply_t r;
    if (krt_call(sys, krt_whereis(sys, KA_CLUSTER_NAME), KA_CLUSTER_NODES, NULL, 0, S_REMOTE_MS,
                 &r)) {
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the cluster membership is not running");
        return;
    }
    const ka_cluster_nodes_t *l = r.body;
    if (r.status || r.len < sizeof *l || r.len != sizeof *l + l->count * sizeof l->items[0]) {
        krt_reply_free(&r);
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "bad answer from the cluster membership");
        return;
    }
    enum { MAX_POOLS = 16 };
    size_t n = l->count ? l->count : 1;
    Kagent__Runtime__V1__Node *nodes = calloc(n, sizeof *nodes);
    Kagent__Runtime__V1__Node **ptrs = calloc(n, sizeof *ptrs);
    Google__Protobuf__Timestamp(*ts)[2] = calloc(n, sizeof *ts);
    char(*bufs)[KA_STORE_POOLS_LEN] = calloc(n, sizeof *bufs);
    char *(*pools)[MAX_POOLS] = calloc(n, sizeof *pools);
    if (nodes && ptrs && ts && bufs && pools) {
        for (uint32_t i = 0; i < l->count; i++) {
            s_node_msg(&l->items[i], l->member, &nodes[i], ts[i], bufs[i], pools[i], MAX_POOLS);
            ptrs[i] = &nodes[i];
        }
        Kagent__Runtime__V1__ListNodesResponse resp =
            KAGENT__RUNTIME__V1__LIST_NODES_RESPONSE__INIT;
        resp.n_nodes = l->count;
        resp.nodes = ptrs;
        kb_grpc_reply(call, &resp.base);
    } else {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
    }
    free(nodes);
    free(ptrs);
    free(ts);
    free(bufs);
    free(pools);
    krt_reply_free(&r);
}

/* Drains a node: the membership marks it in the node table (no placements on it). */
static void s_drain(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    if (!s_ok(call, user))
        return;
    const Kagent__Runtime__V1__DrainNodeRequest *req = (const void *)m;
    if (req->node_id <= 0 || req->node_id > 65535) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, "node_id must be between 1 and 65535");
        return;
    }
    krt_system_t *sys = ka_service_system(api->o.svc);
    char id[16];
    snprintf(id, sizeof id, "%d", (int)req->node_id);
    krt_reply_t r;
    int rc = krt_call(sys, krt_whereis(sys, KA_CLUSTER_NAME), KA_CLUSTER_DRAIN, id, strlen(id) + 1,
                      S_REMOTE_MS, &r);
    if (rc || r.status == KA_STORE_EUNAVAIL) {
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE,
                     "the cluster membership or its store did not answer");
    } else if (r.status == -ENOENT) {
        kb_grpc_fail(call, KB_GRPC_NOT_FOUND, "no such node");
    } else if (r.status || r.len != sizeof(ka_cluster_node_t)) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "bad answer from the cluster membership");
    } else {
        enum { MAX_POOLS = 16 };
        Kagent__Runtime__V1__Node node;
        Google__Protobuf__Timestamp ts[2];
        char buf[KA_STORE_POOLS_LEN], *pools[MAX_POOLS];
        const ka_cluster_node_t *c = r.body;
        s_node_msg(c, c->self, &node, ts, buf, pools, MAX_POOLS);
        Kagent__Runtime__V1__DrainNodeResponse resp =
            KAGENT__RUNTIME__V1__DRAIN_NODE_RESPONSE__INIT;
        resp.node = &node;
        kb_grpc_reply(call, &resp.base);
    }
    if (!rc)
        krt_reply_free(&r);
}

static void s_images(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    if (!s_ok(call, user))
        return;
    ka_image_info_t *list = NULL;
    size_t n = 0;
    if (!api->images_ro || ka_images_list(api->images_ro, &list, &n)) {
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the image store cannot be read");
        return;
    }
    Kagent__Runtime__V1__Image *imgs = calloc(n ? n : 1, sizeof *imgs);
    Kagent__Runtime__V1__Image **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    char(*refs)[1100] = calloc(n ? n : 1, sizeof *refs);
    for (size_t i = 0; imgs && ptrs && refs && i < n; i++) {
        kagent__runtime__v1__image__init(&imgs[i]);
        snprintf(refs[i], sizeof refs[i], "%s%s%s", list[i].name, list[i].name[0] ? "@" : "",
                 list[i].digest);
        imgs[i].reference = refs[i];
        imgs[i].digest = list[i].digest;
        imgs[i].size = (int64_t)list[i].size;
        ptrs[i] = &imgs[i];
    }
    Kagent__Runtime__V1__ListImagesResponse r = KAGENT__RUNTIME__V1__LIST_IMAGES_RESPONSE__INIT;
    if (imgs && ptrs && refs) {
        r.n_images = n;
        r.images = ptrs;
        kb_grpc_reply(call, &r.base);
    } else {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
    }
    free(imgs);
    free(ptrs);
    free(refs);
    ka_images_list_free(list, n);
}

/* ---- images actor requests (import, rm) ----------------------------------------------------- */

typedef struct {
    kb_grpc_call_t *call;
    uint32_t type;
    char path[512]; /* import spool file, removed when done */
    char name[KA_IMAGES_IMGNAME_LEN];
    int fd;
    uint64_t size;
} s_img_t;

static void s_on_images(void *user, int err, const krt_msg_t *reply)
{
    s_img_t *c = user;
    const ka_images_reply_t *r = reply ? reply->body : NULL;
    if (err || !r || reply->len != sizeof *r) {
        kb_grpc_fail(c->call, KB_GRPC_UNAVAILABLE, "the image service did not answer");
    } else if (r->err) {
        ka_svc_status_t st = {r->err, r->message};
        kb_api_fail_err(c->call, &st);
    } else if (c->type == KA_IMAGES_RM) {
        Kagent__Runtime__V1__RemoveImageResponse resp =
            KAGENT__RUNTIME__V1__REMOVE_IMAGE_RESPONSE__INIT;
        kb_grpc_reply(c->call, &resp.base);
    } else {
        Kagent__Runtime__V1__Image img = KAGENT__RUNTIME__V1__IMAGE__INIT;
        img.reference = (char *)r->ref;
        img.digest = (char *)r->digest;
        img.size = (int64_t)c->size;
        Kagent__Runtime__V1__ImportImageResponse resp =
            KAGENT__RUNTIME__V1__IMPORT_IMAGE_RESPONSE__INIT;
        resp.image = &img;
        kb_grpc_reply(c->call, &resp.base);
    }
    if (c->path[0])
        unlink(c->path);
    free(c);
}

static void s_images_call(kb_api_t *api, s_img_t *c, const char *arg)
{
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    snprintf(req.arg, sizeof req.arg, "%s", arg);
    snprintf(req.name, sizeof req.name, "%s", c->name);
    krt_system_t *sys = ka_service_system(api->o.svc);
    if (krt_call_async(sys, krt_whereis(sys, api->o.images), c->type, &req, sizeof req,
                       15 * 60 * 1000, s_on_images, c)) {
        kb_grpc_fail(c->call, KB_GRPC_UNAVAILABLE, "the image service is not running");
        if (c->path[0])
            unlink(c->path);
        free(c);
    }
}

static void s_rm(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    if (!s_ok(call, user))
        return;
    const Kagent__Runtime__V1__RemoveImageRequest *req = (const void *)m;
    s_img_t *c = calloc(1, sizeof *c);
    if (!c || !req->reference[0] || strlen(req->reference) >= KA_IMAGES_ARG_LEN) {
        free(c);
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, "reference must name an image");
        return;
    }
    c->call = call;
    c->type = KA_IMAGES_RM;
    s_images_call(user, c, req->reference);
}

static void s_import_start(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    kb_api_t *api = user;
    if (!s_ok(call, user))
        return;
    s_img_t *c = calloc(1, sizeof *c);
    if (!c) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    c->call = call;
    c->type = KA_IMAGES_IMPORT;
    snprintf(c->path, sizeof c->path, "%s/images-import.XXXXXX",
             api->o.state_dir ? api->o.state_dir : "/tmp");
    c->fd = mkstemp(c->path);
    if (c->fd < 0) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "cannot create the import spool file");
        free(c);
        return;
    }
    kb_grpc_call_set_data(call, c);
}

static void s_import_abort(kb_grpc_call_t *call, s_img_t *c, kb_grpc_code_t code, const char *why)
{
    kb_grpc_call_set_data(call, NULL);
    kb_grpc_fail(call, code, why);
    close(c->fd);
    unlink(c->path);
    free(c);
}

static void s_import_message(kb_grpc_call_t *call, ProtobufCMessage *m, void *user)
{
    s_img_t *c = kb_grpc_call_data(call);
    const Kagent__Runtime__V1__ImportImageRequest *req = (const void *)m;
    if (c) {
        if (c->size == 0 && req->name[0])
            snprintf(c->name, sizeof c->name, "%s", req->name);
        const uint8_t *p = req->chunk.data;
        size_t n = req->chunk.len;
        if (c->size + n > IMPORT_MAX) {
            s_import_abort(call, c, KB_GRPC_RESOURCE_EXHAUSTED, "image import exceeds 16 GiB");
        } else {
            while (n > 0) {
                ssize_t w = write(c->fd, p, n);
                if (w <= 0) {
                    s_import_abort(call, c, KB_GRPC_INTERNAL, "cannot spool the image");
                    break;
                }
                p += w;
                n -= (size_t)w;
                c->size += (uint64_t)w;
            }
        }
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

static void s_import_end(kb_grpc_call_t *call, int status, void *user)
{
    s_img_t *c = kb_grpc_call_data(call);
    if (!c)
        return;
    if (status || c->size == 0) {
        s_import_abort(call, c, status ? KB_GRPC_CANCELLED : KB_GRPC_INVALID_ARGUMENT,
                       status ? "the import stream ended abnormally" : "the image is empty");
        return;
    }
    kb_grpc_call_set_data(call, NULL);
    close(c->fd);
    s_images_call(user, c, c->path);
}

#define SVC "/kagent.runtime.v1.RuntimeService/"
const kb_grpc_method_t kb_api_runtime_methods[] = {
    {SVC "GetActorTree", KB_GRPC_UNARY, &kagent__runtime__v1__get_actor_tree_request__descriptor,
     s_tree, NULL, NULL, NULL},
    {SVC "ListNodes", KB_GRPC_UNARY, &kagent__runtime__v1__list_nodes_request__descriptor, s_nodes,
     NULL, NULL, NULL},
    {SVC "DrainNode", KB_GRPC_UNARY, &kagent__runtime__v1__drain_node_request__descriptor, s_drain,
     NULL, NULL, NULL},
    {SVC "ListPools", KB_GRPC_UNARY, &kagent__runtime__v1__list_pools_request__descriptor, s_pools,
     NULL, NULL, NULL},
    {SVC "GetStats", KB_GRPC_UNARY, &kagent__runtime__v1__get_stats_request__descriptor, s_stats,
     NULL, NULL, NULL},
    {SVC "GetSandboxTimings", KB_GRPC_UNARY,
     &kagent__runtime__v1__get_sandbox_timings_request__descriptor, s_timings, NULL, NULL, NULL},
    {SVC "ImportImage", KB_GRPC_CLIENT_STREAM,
     &kagent__runtime__v1__import_image_request__descriptor, s_import_start, s_import_message,
     s_import_end, NULL},
    {SVC "ListImages", KB_GRPC_UNARY, &kagent__runtime__v1__list_images_request__descriptor,
     s_images, NULL, NULL, NULL},
    {SVC "RemoveImage", KB_GRPC_UNARY, &kagent__runtime__v1__remove_image_request__descriptor, s_rm,
     NULL, NULL, NULL},
};
const size_t kb_api_runtime_n = sizeof kb_api_runtime_methods / sizeof kb_api_runtime_methods[0];
