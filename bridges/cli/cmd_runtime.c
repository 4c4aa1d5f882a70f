/*
 * Operator commands (kagent.runtime.v1.RuntimeService): `image import|list|rm` and
 * `runtime tree|nodes|drain|pools|stats`.
 */
#include "cli_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kagent/runtime/v1/runtime.pb-c.h"

#define S_SVC         "/kagent.runtime.v1.RuntimeService/"
#define S_CANCELLED   1 /* gRPC status codes */
#define S_UNAVAILABLE 14

/* One unary call; on failure prints "<what>: <cause>" and returns NULL. */
static ProtobufCMessage *s_call(kb_cli_t *cli, const char *method, const ProtobufCMessage *req,
                                const ProtobufCMessageDescriptor *rd, const char *what)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return NULL;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, method, NULL, req, rd, &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        kb_cli_fail(cli, "%s: %s", what, cause);
        return NULL;
    }
    return resp;
}

static void s_print_images(kb_cli_t *cli, Kagent__Runtime__V1__Image *const *imgs, size_t n)
{
    kb_table_t *t = kb_table_new(4);
    if (!t)
        return;
    const char *hdr[] = {"REFERENCE", "DIGEST", "SIZE", "CREATED"};
    kb_table_add(t, hdr);
    for (size_t i = 0; i < n; i++) {
        char size[32], created[48];
        snprintf(size, sizeof size, "%lld", (long long)imgs[i]->size);
        kb_fmt_time((const ProtobufCMessage *)imgs[i]->created_at, created, sizeof created);
        const char *row[] = {imgs[i]->reference, imgs[i]->digest, size, created};
        kb_table_add(t, row);
    }
    kb_table_print(t, cli->out);
    kb_table_destroy(&t);
}

/* ------------------------------------------------------------------------------------------ */
/* image import: streams the tarball in KB_CHUNK chunks (images are not held to 64 MiB). */

static int s_run_image_import(kb_cli_t *cli, const kb_args_t *a)
{
    const char *path = a->pos[0];
    int fd = strcmp(path, "-") == 0 ? dup(STDIN_FILENO) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kb_cli_fail(cli, "open %s: %s", path, strerror(errno));
    struct stat sb;
    uint64_t total = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0;
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    uint8_t *buf = malloc(KB_CHUNK);
    if (!rpc || !buf) {
        free(buf);
        close(fd);
        return rpc ? kb_cli_fail(cli, "out of memory") : KB_EXIT_ERROR;
    }
    kb_rpc_status_t st;
    char cause[KB_RPC_MSG_CAP + 64] = "";
    kb_rpc_call_t *call = kb_rpc_client_stream(rpc, S_SVC "ImportImage", NULL, &st);
    bool first = true, failed = call == NULL;
    uint64_t sent = 0;
    while (!failed) {
        ssize_t n = read(fd, buf, KB_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(cause, sizeof cause, "read %s: %s", path, strerror(errno));
            failed = true;
            break;
        }
        if (n == 0 && !first)
            break;
        Kagent__Runtime__V1__ImportImageRequest req =
            KAGENT__RUNTIME__V1__IMPORT_IMAGE_REQUEST__INIT;
        if (first) {
            req.name = (char *)kb_args_str(a, "name");
            req.format = (char *)kb_args_str(a, "format");
        }
        req.chunk.data = buf;
        req.chunk.len = (size_t)n;
        if (kb_rpc_call_write(call, &req.base) != 0) {
            failed = true;
            break;
        }
        first = false;
        sent += (uint64_t)n;
        kb_cli_progress(cli, "import", sent, total, false);
        if (n == 0)
            break;
    }
    kb_cli_progress(cli, "import", sent, total, true);
    ProtobufCMessage *resp = NULL;
    if (call && !cause[0] &&
        kb_rpc_call_finish(call, &kagent__runtime__v1__import_image_response__descriptor, &resp,
                           &st) != 0)
        failed = true;
    kb_rpc_call_destroy(&call);
    free(buf);
    close(fd);
    if (failed) {
        if (!cause[0])
            kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "import image %s: %s", path, cause);
    }
    int rc = KB_EXIT_OK;
    Kagent__Runtime__V1__ImportImageResponse *r = (Kagent__Runtime__V1__ImportImageResponse *)resp;
    if (cli->json)
        rc = kb_cli_print(cli, resp);
    else if (r->image)
        s_print_images(cli, &r->image, 1);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_image_list(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Runtime__V1__ListImagesRequest req = KAGENT__RUNTIME__V1__LIST_IMAGES_REQUEST__INIT;
    ProtobufCMessage *resp =
        s_call(cli, S_SVC "ListImages", &req.base,
               &kagent__runtime__v1__list_images_response__descriptor, "list images");
    if (!resp)
        return KB_EXIT_ERROR;
    int rc = KB_EXIT_OK;
    Kagent__Runtime__V1__ListImagesResponse *r = (Kagent__Runtime__V1__ListImagesResponse *)resp;
    if (cli->json)
        rc = kb_cli_print(cli, resp);
    else
        s_print_images(cli, r->images, r->n_images);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_image_rm(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Runtime__V1__RemoveImageRequest req = KAGENT__RUNTIME__V1__REMOVE_IMAGE_REQUEST__INIT;
    req.reference = (char *)a->pos[0];
    char what[300];
    snprintf(what, sizeof what, "remove image %s", a->pos[0]);
    ProtobufCMessage *resp = s_call(cli, S_SVC "RemoveImage", &req.base,
                                    &kagent__runtime__v1__remove_image_response__descriptor, what);
    if (!resp)
        return KB_EXIT_ERROR;
    int rc = KB_EXIT_OK;
    if (cli->json)
        rc = kb_cli_print(cli, resp);
    else
        fprintf(cli->out, "Removed %s\n", a->pos[0]);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static const kb_flag_t s_import_flags[] = {
    {"name", 0, KB_F_STRING, NULL, "name to give the image", "string"},
    {"format", 0, KB_F_STRING, NULL, "oci-archive or docker-archive (default: detect)", "string"},
    {0},
};

static const kb_cmd_t s_cmd_image_import = {
    .name = "import",
    .use = "import FILE|-",
    .short_help = "Import an image tarball to the node",
    .flags = s_import_flags,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_image_import,
};
static const kb_cmd_t s_cmd_image_list = {
    .name = "list",
    .use = "list",
    .short_help = "List the node's images",
    .min_args = 0,
    .max_args = 0,
    .run = s_run_image_list,
};
static const kb_cmd_t s_cmd_image_rm = {
    .name = "rm",
    .use = "rm REFERENCE",
    .short_help = "Remove an image",
    .min_args = 1,
    .max_args = 1,
    .run = s_run_image_rm,
};
static const kb_cmd_t *const s_image_subs[] = {&s_cmd_image_import, &s_cmd_image_list,
                                               &s_cmd_image_rm, NULL};

const kb_cmd_t kb_cmd_image = {
    .name = "image",
    .use = "image [command]",
    .short_help = "Manage the node's image store",
    .subs = s_image_subs,
};

/* ------------------------------------------------------------------------------------------ */

/* ---- runtime tree: drawn (default) or JSON, once or --watch ------------------------------------
 */

/* "k=v k=v" of an actor's described state (an object), or its JSON. Caller frees. */
static char *s_state_text(const json_t *st)
{
    if (!st || json_is_null(st))
        return strdup("");
    if (!json_is_object(st))
        return json_dumps(st, JSON_COMPACT | JSON_ENCODE_ANY);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    const char *k;
    json_t *v;
    bool first = true;
    json_object_foreach((json_t *)st, k, v)
    {
        char *t = json_is_string(v) ? strdup(json_string_value(v))
                                    : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        fprintf(f, "%s%s=%s", first ? "" : " ", k, t ? t : "?");
        free(t);
        first = false;
    }
    fclose(f);
    return buf;
}

static void s_draw(FILE *out, const json_t *nodes, const char *prefix)
{
    size_t n = json_array_size(nodes);
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(nodes, i);
        bool last = i + 1 == n;
        const char *path = json_string_value(json_object_get(a, "path"));
        const char *seg = path && strrchr(path, '/') ? strrchr(path, '/') + 1 : path ? path : "?";
        char *state = s_state_text(json_object_get(a, "state"));
        fprintf(out, "%s%s%s [%s] mailbox=%lld handled=%lld restarts=%lld bytes=%lld%s%s\n", prefix,
                last ? "└── " : "├── ", seg,
                json_string_value(json_object_get(a, "kind")) ?: "actor",
                (long long)json_integer_value(json_object_get(a, "mailbox")),
                (long long)json_integer_value(json_object_get(a, "handled")),
                (long long)json_integer_value(json_object_get(a, "restarts")),
                (long long)json_integer_value(json_object_get(a, "bytes")),
                state && *state ? "  " : "", state ? state : "");
        free(state);
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s", prefix, last ? "    " : "│   ");
        s_draw(out, json_object_get(a, "children"), sub);
    }
}

/* The node's name: the first segment of the first actor's path. */
/* The node a root belongs to: its path up to the first '/' (len in *n). */
static const char *s_node_of(const json_t *root, int *n)
{
    const char *path = json_string_value(json_object_get(root, "path"));
    *n = path ? (int)strcspn(path, "/") : 0;
    return path ? path : "";
}

/* Each node's roots under a heading with its name (a cluster's tree holds several nodes'). */
static void s_draw_tree(FILE *out, const json_t *tree)
{
    size_t n = json_array_size(tree);
    for (size_t i = 0; i < n || i == 0;) {
        int len;
        const char *node = s_node_of(json_array_get(tree, i), &len);
        json_t *group = json_array();
        for (; i < n; i++) {
            int l;
            const char *p = s_node_of(json_array_get(tree, i), &l);
            if (l != len || strncmp(p, node, (size_t)len) != 0)
                break;
            json_array_append(group, json_array_get(tree, i));
        }
        fprintf(out, "%.*s\n", len, node);
        s_draw(out, group, "");
        json_decref(group);
        if (n == 0)
            break;
    }
}

/* One fetch and print. 0, or the failed call's status code (after printing why unless it was
 * an interrupted --watch). */
static int s_tree_once(kb_cli_t *cli, const kb_args_t *a, bool watching)
{
    Kagent__Runtime__V1__GetActorTreeRequest req =
        KAGENT__RUNTIME__V1__GET_ACTOR_TREE_REQUEST__INIT;
    req.root = (char *)kb_args_str(a, "root");
    req.node_id = (int32_t)kb_args_int(a, "node");
    req.cluster = !req.node_id && (!req.root || !req.root[0]); /* unless one node is asked */
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return S_UNAVAILABLE;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, S_SVC "GetActorTree", NULL, &req.base,
                     &kagent__runtime__v1__get_actor_tree_response__descriptor, &resp, &st)) {
        if (!(watching && st.code == S_CANCELLED)) {
            char cause[KB_RPC_MSG_CAP + 64];
            kb_cli_cause(&st, cause, sizeof cause);
            kb_cli_fail(cli, "get actor tree: %s", cause);
        }
        return st.code ? st.code : S_UNAVAILABLE;
    }
    const char *text = ((Kagent__Runtime__V1__GetActorTreeResponse *)resp)->json;
    json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
    if (watching && isatty(fileno(cli->out)))
        fputs("\033[H\033[2J", cli->out); /* redraw in place */
    if (!j)
        fprintf(cli->out, "%s\n", text);
    else if (cli->json)
        kb_cli_print_json(cli, j);
    else
        s_draw_tree(cli->out, j);
    if (watching)
        fputc('\n', cli->out);
    fflush(cli->out);
    json_decref(j);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static int s_run_tree(kb_cli_t *cli, const kb_args_t *a)
{
    bool watch = kb_args_bool(a, "watch");
    int64_t every = kb_args_duration(a, "interval");
    if (watch && every < KB_NS_PER_SEC / 10)
        return kb_cli_usage(cli, "--interval must be at least 100ms");
    int code = s_tree_once(cli, a, watch);
    while (watch && !code) { /* until interrupted (Ctrl-C) or the node goes away */
        struct timespec ts = {.tv_sec = every / KB_NS_PER_SEC, .tv_nsec = every % KB_NS_PER_SEC};
        nanosleep(&ts, NULL);
        code = s_tree_once(cli, a, true);
    }
    return !code || (watch && code == S_CANCELLED) ? KB_EXIT_OK : KB_EXIT_ERROR;
}

/* "held 4.2s" / "lapsed 12.0s ago", from the lease's end and the local clock. */
static void s_lease(const Kagent__Runtime__V1__Node *nd, char *out, size_t cap)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double end =
        nd->lease_expires ? (double)nd->lease_expires->seconds + nd->lease_expires->nanos / 1e9 : 0;
    double left = end - ((double)now.tv_sec + now.tv_nsec / 1e9);
    if (nd->lease_held)
        snprintf(out, cap, "held %.1fs", left > 0 ? left : 0);
    else
        snprintf(out, cap, "lapsed %.1fs ago", left < 0 ? -left : 0);
}

static void s_node_row(kb_table_t *t, const Kagent__Runtime__V1__Node *nd)
{
    char id[16], lease[48], inc[24], cap[16], sbx[16], pools[512] = "", mesh[300];
    snprintf(id, sizeof id, "%d%s", (int)nd->id, nd->self ? "*" : "");
    s_lease(nd, lease, sizeof lease);
    snprintf(inc, sizeof inc, "%lld", (long long)nd->incarnation);
    snprintf(cap, sizeof cap, "%d", (int)nd->capacity);
    snprintf(sbx, sizeof sbx, "%d", (int)nd->sandboxes);
    for (size_t k = 0; k < nd->n_pools; k++) {
        size_t l = strlen(pools);
        snprintf(pools + l, sizeof pools - l, "%s%s", k ? "," : "", nd->pools[k]);
    }
    snprintf(mesh, sizeof mesh, "%s%s", nd->mesh_endpoint[0] ? nd->mesh_endpoint : "-",
             nd->self || !nd->mesh_endpoint[0] ? ""
             : nd->connected                   ? " (peer)"
                                               : " (not peer)");
    const char *alive = nd->alive ? (nd->draining ? "true (draining)" : "true") : "false";
    const char *row[] = {id, nd->name, nd->endpoint, mesh, alive, lease, inc, pools, cap, sbx};
    kb_table_add(t, row);
}

static int s_run_nodes(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Runtime__V1__ListNodesRequest req = KAGENT__RUNTIME__V1__LIST_NODES_REQUEST__INIT;
    ProtobufCMessage *resp =
        s_call(cli, S_SVC "ListNodes", &req.base,
               &kagent__runtime__v1__list_nodes_response__descriptor, "list nodes");
    if (!resp)
        return KB_EXIT_ERROR;
    int rc = KB_EXIT_OK;
    if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        Kagent__Runtime__V1__ListNodesResponse *r = (Kagent__Runtime__V1__ListNodesResponse *)resp;
        kb_table_t *t = kb_table_new(10);
        const char *hdr[] = {"ID",    "NAME",        "ENDPOINT", "MESH",     "ALIVE",
                             "LEASE", "INCARNATION", "POOLS",    "CAPACITY", "SANDBOXES"};
        if (t)
            kb_table_add(t, hdr);
        for (size_t i = 0; t && i < r->n_nodes; i++)
            s_node_row(t, r->nodes[i]);
        if (t)
            kb_table_print(t, cli->out);
        kb_table_destroy(&t);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_drain(kb_cli_t *cli, const kb_args_t *a)
{
    char *end;
    long id = strtol(a->pos[0], &end, 10);
    if (!a->pos[0][0] || *end || id <= 0 || id > 65535)
        return kb_cli_usage(cli, "NODE must be a node id between 1 and 65535 (see `kagent "
                                 "runtime nodes`)");
    Kagent__Runtime__V1__DrainNodeRequest req = KAGENT__RUNTIME__V1__DRAIN_NODE_REQUEST__INIT;
    req.node_id = (int32_t)id;
    ProtobufCMessage *resp =
        s_call(cli, S_SVC "DrainNode", &req.base,
               &kagent__runtime__v1__drain_node_response__descriptor, "drain node");
    if (!resp)
        return KB_EXIT_ERROR;
    int rc = KB_EXIT_OK;
    const Kagent__Runtime__V1__DrainNodeResponse *r = (const void *)resp;
    if (cli->json)
        rc = kb_cli_print(cli, resp);
    else if (r->node)
        fprintf(cli->out,
                "node %d (%s) drained: no new sandboxes are placed on it; its %d sandboxes keep "
                "running; stop it to make it leave\n",
                (int)r->node->id, r->node->name, (int)r->node->sandboxes);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_pools(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Runtime__V1__ListPoolsRequest req = KAGENT__RUNTIME__V1__LIST_POOLS_REQUEST__INIT;
    ProtobufCMessage *resp =
        s_call(cli, S_SVC "ListPools", &req.base,
               &kagent__runtime__v1__list_pools_response__descriptor, "list pools");
    if (!resp)
        return KB_EXIT_ERROR;
    int rc = KB_EXIT_OK;
    if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        Kagent__Runtime__V1__ListPoolsResponse *r = (Kagent__Runtime__V1__ListPoolsResponse *)resp;
        kb_table_t *t = kb_table_new(4);
        const char *hdr[] = {"NAME", "CLASS", "CAPACITY", "IN USE"};
        if (t)
            kb_table_add(t, hdr);
        for (size_t i = 0; t && i < r->n_pools; i++) {
            char cap[24], use[24];
            snprintf(cap, sizeof cap, "%lld", (long long)r->pools[i]->capacity);
            snprintf(use, sizeof use, "%lld", (long long)r->pools[i]->in_use);
            const char *row[] = {r->pools[i]->name, r->pools[i]->sandbox_class, cap, use};
            kb_table_add(t, row);
        }
        if (t)
            kb_table_print(t, cli->out);
        kb_table_destroy(&t);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_stats(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Runtime__V1__GetStatsRequest req = KAGENT__RUNTIME__V1__GET_STATS_REQUEST__INIT;
    ProtobufCMessage *resp =
        s_call(cli, S_SVC "GetStats", &req.base,
               &kagent__runtime__v1__get_stats_response__descriptor, "get stats");
    if (!resp)
        return KB_EXIT_ERROR;
    int rc = KB_EXIT_OK;
    if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        /* One line per counter, in declaration order, zeros included. */
        const ProtobufCMessageDescriptor *d = resp->descriptor;
        kb_table_t *t = kb_table_new(2);
        for (unsigned i = 0; t && i < d->n_fields; i++) {
            char v[32];
            snprintf(v, sizeof v, "%llu",
                     (unsigned long long)*(const uint64_t *)((const uint8_t *)resp +
                                                             d->fields[i].offset));
            const char *row[] = {d->fields[i].name, v};
            kb_table_add(t, row);
        }
        if (t)
            kb_table_print(t, cli->out);
        kb_table_destroy(&t);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static const kb_flag_t s_tree_flags[] = {
    {"root", 0, KB_F_STRING, NULL, "actor path or name to start from (default: the whole node)",
     "string"},
    {"node", 0, KB_F_INT, "0", "only this node's tree (0: every live node's)", "int32"},
    {"watch", 'w', KB_F_BOOL, NULL, "redraw every --interval until interrupted", NULL},
    {"interval", 0, KB_F_DURATION, "2s", "how often --watch redraws", "duration"},
    {0},
};

static const kb_cmd_t s_cmd_tree = {
    .name = "tree",
    .use = "tree [--watch]",
    .short_help = "Draw the actor tree of every live node (--node N: one; -o json: as JSON)",
    .flags = s_tree_flags,
    .min_args = 0,
    .max_args = 0,
    .run = s_run_tree,
};
static const kb_cmd_t s_cmd_nodes = {
    .name = "nodes",
    .use = "nodes",
    .short_help = "List the nodes of the cluster (* marks the node answering)",
    .min_args = 0,
    .max_args = 0,
    .run = s_run_nodes,
};
static const kb_cmd_t s_cmd_drain = {
    .name = "drain",
    .use = "drain NODE",
    .short_help = "Stop placing new sandboxes on a node (its own keep running; stop it to leave)",
    .min_args = 1,
    .max_args = 1,
    .run = s_run_drain,
};
static const kb_cmd_t s_cmd_pools = {
    .name = "pools",
    .use = "pools",
    .short_help = "List the worker pools",
    .min_args = 0,
    .max_args = 0,
    .run = s_run_pools,
};
static const kb_cmd_t s_cmd_stats = {
    .name = "stats",
    .use = "stats",
    .short_help = "Show runtime statistics",
    .min_args = 0,
    .max_args = 0,
    .run = s_run_stats,
};
static const kb_cmd_t *const s_runtime_subs[] = {&s_cmd_tree,  &s_cmd_nodes, &s_cmd_drain,
                                                 &s_cmd_pools, &s_cmd_stats, NULL};

const kb_cmd_t kb_cmd_runtime = {
    .name = "runtime",
    .use = "runtime [command]",
    .short_help = "Inspect the runtime: actor tree, nodes, pools, statistics",
    .subs = s_runtime_subs,
};
