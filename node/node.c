/* ka_node: one node, wired from its configuration. */
#include "node.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "auth.h"
#include "db_watch.h"
#include "embedded.h"
#include "grpc_reflection.h"
#include "grpc_server.h"
#include "http.h"
#include "identity.h"
#include "images_actor.h"
#include "ka_guestcalls.h"
#include "ka_namespaces.h"
#include "ka_uidrange.h"
#include "ka_objstore.h"
#include "ka_tree.h"
#include "krt.h"
#include "krt_mesh.h"
#include "listener.h"
#include "mcp.h"
#include "membership.h"
#include "metrics.h"
#include "sandboxes.h"
#include "service.h"
#include "store.h"
#include "templates_actor.h"
#include "ui.h"
#include "node_err.h"

#define STORE_READY_MS 60000
#define IMAGE_CALL_MS  (15 * 60 * 1000)
/* The root supervisor gives up (and the node stops serving: /readyz fails) after more than
 * SUP_INTENSITY restarts within SUP_PERIOD_MS: a crash loop, not a one-off crash. */
#define SUP_INTENSITY 5
#define SUP_PERIOD_MS 30000
/* The largest message between nodes: a 64 MiB file write relayed to the sandbox's node, and
 * its request's envelope. */
#define MESH_MAX_MSG ((64u << 20) + (64u << 10))
/* The mesh: a heartbeat every MESH_HEARTBEAT_MS, a peer silent for MESH_PEER_TIMEOUT_MS is down
 * (node-down to monitors) well within the 5 s failure detection the cluster promises. */
#define MESH_HEARTBEAT_MS    500
#define MESH_PEER_TIMEOUT_MS 2000
#define MEMBER_READY_MS      30000 /* the first registration, at start */
#define LEAVE_MS             3000  /* ending the lease at a clean stop */

struct ka_node {
    ka_config_t cfg;
    char path[KA_CFG_NAME_MAX]; /* log path: the node name */
    char *conninfo;
    bool embedded_db;
    krt_system_t *sys;
    ka_identity_t ident; /* node id and mesh keys (stateDir/cluster) */
    krt_mesh_t *mesh;    /* NULL without mesh.bind */
    ka_membership_args_t member_args;
    ka_membership_status_t member; /* lease held, incarnation, fencings */
    ka_store_args_t store_args;
    ka_images_actor_args_t images_args;
    char *mirrors[KA_CFG_MAX_REGS];
    ka_templates_args_t templates_args;
    ka_sandboxes_args_t sandboxes_args;
    krt_addr_t sup; /* root supervisor of store, images, templates, sandboxes (by name) */
    ka_driver_t *driver;
    ka_uidrange_t uids; /* this node's claim on its host uid range */
    ka_service_t *svc;
    kb_auth_t *auth;
    kb_api_pool_t pools[KA_CFG_MAX_POOLS];
    char endpoint[KA_CFG_NAME_MAX + 16];
    kb_api_t *api;
    kb_grpc_reflection_t *reflection;
    kb_grpc_server_t *grpc;
    kb_http_t *http;
    kb_mcp_t *mcp;
    const char *mcp_hosts[KA_CFG_MAX_HOSTS + 1];
    kb_ui_t *ui;
    const char *operators[KA_CFG_MAX_OPERATORS];
    kb_tls_t *tls;           /* NULL: cleartext port */
    kb_conn_ids_t *conn_ids; /* TLS client identities, for kb_auth */
    kb_listener_t *listener;
    ka_db_watch_t *db_watch; /* restarts the embedded database; store health for /readyz */
    bool ready;
};

/* ---- database and store ------------------------------------------------------------------- */

static int s_database(ka_node_t *n, char *err, size_t cap)
{
    if (n->cfg.database_url[0]) {
        n->conninfo = strdup(n->cfg.database_url);
        return n->conninfo ? 0 : ka_node_fail(err, cap, "out of memory");
    }
    krt_log(KRT_LOG_INFO, n->path, "database_starting", "embedded=%s/postgres", n->cfg.state_dir);
    if (ka_pg_embedded_start(n->cfg.state_dir, &n->conninfo))
        return ka_node_fail(err, cap, "the embedded PostgreSQL did not start: %s",
                            ka_pg_embedded_error());
    n->embedded_db = true;
    return 0;
}

/* The long-lived actors run under one one_for_one supervisor, each registered under its name:
 * peers look each other up by name at every send, so a restarted actor (new address) is found.
 * arg must outlive the node: it is given to init again at each restart. */
static int s_supervisor(ka_node_t *n, char *err, size_t cap)
{
    krt_sup_spec_t spec = {KRT_ONE_FOR_ONE, SUP_INTENSITY, SUP_PERIOD_MS, NULL, 0};
    krt_spawn_opts_t o = {.name = "supervisor"};
    int rc = krt_supervisor_spawn(n->sys, NULL, &spec, &o, &n->sup);
    return rc ? ka_node_fail(err, cap, "cannot start the supervisor: %s", krt_strerror(rc)) : 0;
}

static int s_spawn(ka_node_t *n, const krt_behaviour_t *b, void *arg, const char *name, char *err,
                   size_t cap)
{
    krt_child_spec_t c = {
        .name = name, .behaviour = b, .arg = arg, .restart = KRT_PERMANENT, .register_name = true};
    int rc = krt_supervisor_start_child(n->sys, n->sup, &c, NULL);
    return rc ? ka_node_fail(err, cap, "cannot start the %s actor: %s", name, krt_strerror(rc)) : 0;
}

static krt_addr_t s_actor(ka_node_t *n, const char *name)
{
    return krt_whereis(n->sys, name);
}

/* The node id (configured, kept, or allocated from the database) and the mesh keys. */
static int s_identity(ka_node_t *n, char *err, size_t cap)
{
    if (ka_identity_load(n->cfg.state_dir, (int)n->cfg.node_id, n->conninfo, n->cfg.node_name,
                         &n->ident, err, cap))
        return -1;
    n->cfg.node_id = n->ident.node_id;
    return 0;
}

/* Waits until the store serves requests (migrations applied), or fails clearly. */
static int s_wait_store(ka_node_t *n, char *err, size_t cap)
{
    for (int waited = 0; waited < STORE_READY_MS; waited += 100) {
        krt_reply_t r;
        if (krt_call(n->sys, s_actor(n, KA_STORE_NAME), KA_STORE_INFO, NULL, 0, 5000, &r) == 0) {
            const ka_store_info_t *info = r.body;
            bool ready = r.len == sizeof *info && info->conn_state == KA_PG_READY &&
                         info->schema_version > 0;
            krt_reply_free(&r);
            if (ready)
                return 0;
        } else if (krt_system_wait(n->sys, n->sup, 0) != KRT_ETIMEDOUT) { /* restarts failed */
            return ka_node_fail(err, cap,
                                "the store stopped at start (is the database schema newer "
                                "than this kagentd? see the log above)");
        }
        usleep(100 * 1000);
    }
    return ka_node_fail(err, cap, "the database did not become ready within %d s (%s)",
                        STORE_READY_MS / 1000,
                        n->cfg.database_url[0] ? "database.url" : "embedded");
}

/* ---- images and the driver ---------------------------------------------------------------- */

/* Before anything is started: no other live node on this machine runs sandboxes under any of
 * this node's host uids. */
static int s_uids(ka_node_t *n, char *err, size_t cap)
{
    char why[512];
    uint32_t base = (uint32_t)n->cfg.uid_base, count = (uint32_t)n->cfg.uid_count;
    int e = ka_uidrange_claim(&n->uids, NULL, base, count, n->cfg.state_dir, why, sizeof why);
    if (e == -EADDRINUSE)
        return ka_node_fail(err, cap,
                            "sandbox.uidBase %u + uidCount %u: %s; give each node on a machine a "
                            "range of its own",
                            base, count, why);
    if (e < 0)
        return ka_node_fail(err, cap, "cannot claim host uids under %s: %s", KA_UIDRANGE_DIR,
                            strerror(-e));
    return 0;
}

static int s_images(ka_node_t *n, char *err, size_t cap)
{
    for (size_t i = 0; i < n->cfg.n_registries; i++) {
        if (asprintf(&n->mirrors[i], "%s=%s", n->cfg.registries[i].host,
                     n->cfg.registries[i].endpoint) < 0)
            return ka_node_fail(err, cap, "out of memory");
    }
    n->images_args.state_dir = n->cfg.state_dir;
    n->images_args.mirrors = (const char *const *)n->mirrors;
    n->images_args.n_mirrors = n->cfg.n_registries;
    return s_spawn(n, &ka_images_behaviour, &n->images_args, KA_IMAGES_NAME, err, cap);
}

/* The guest binary comes from the guest image the policy pins: it must be in the store. */
static int s_driver(ka_node_t *n, char *err, size_t cap)
{
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    snprintf(req.arg, sizeof req.arg, "%s", n->cfg.guest_image_digest);
    krt_reply_t r;
    int rc = krt_call(n->sys, s_actor(n, KA_IMAGES_NAME), KA_IMAGES_PREPARE, &req, sizeof req,
                      IMAGE_CALL_MS, &r);
    if (rc)
        return ka_node_fail(err, cap, "the image service did not answer: %s", krt_strerror(rc));
    ka_images_reply_t rep;
    bool sized = r.len == sizeof rep;
    memcpy(&rep, r.body, sized ? sizeof rep : 0);
    krt_reply_free(&r);
    if (!sized || rep.err)
        return ka_node_fail(
            err, cap,
            "guest image %s is not usable: %s (build it with deploy/build-guest-image.sh "
            "BUILD_DIR %s and put the digest in sandbox.guestImage.digest)",
            n->cfg.guest_image_digest, sized ? rep.message : "bad reply", n->cfg.state_dir);
    char guest[PATH_MAX], state[PATH_MAX];
    snprintf(guest, sizeof guest, "%.3900s/run/kagent/guest", rep.path);
    snprintf(state, sizeof state, "%.3900s/sandboxes", n->cfg.state_dir);
    if (access(guest, X_OK))
        return ka_node_fail(err, cap, "guest image %s holds no executable /run/kagent/guest",
                            n->cfg.guest_image_digest);
    ka_ns_opts_t o = {.state_dir = state,
                      .guest_path = guest,
                      .cpu_millis = (uint32_t)n->cfg.cpu_millis,
                      .mem_bytes = (uint64_t)n->cfg.memory_bytes,
                      .pids_max = (uint64_t)n->cfg.pids_max,
                      .disk_bytes = (uint64_t)n->cfg.disk_bytes,
                      .disk_inodes = (uint64_t)n->cfg.disk_inodes,
                      .nofile = (uint32_t)n->cfg.max_open_files,
                      .uid_base = (uint32_t)n->cfg.uid_base,
                      .uid_count = (uint32_t)n->cfg.uid_count};
    int e = 0;
    n->driver = ka_namespaces_new(&o, &e);
    if (!n->driver)
        return ka_node_fail(err, cap,
                            "the namespaces sandbox driver cannot start: %s (kagentd must "
                            "run as root on Linux with user namespaces and overlayfs)",
                            strerror(e < 0 ? -e : EINVAL));
    return 0;
}

/* ---- control plane ------------------------------------------------------------------------ */

static int s_control(ka_node_t *n, char *err, size_t cap)
{
    ka_templates_args_t *t = &n->templates_args;
    if (ka_objstore_set_credentials_file(n->cfg.snapshot_credentials_file))
        return ka_node_fail(err, cap, "snapshots.credentialsFile: path too long");
    t->store = KA_STORE_NAME;
    t->images = KA_IMAGES_NAME;
    snprintf(t->policy.guest_image_digest, sizeof t->policy.guest_image_digest, "%.79s",
             n->cfg.guest_image_digest);
    t->policy.cpu_millis = n->cfg.cpu_millis;
    t->policy.memory_bytes = n->cfg.memory_bytes;
    t->policy.default_ttl_ms = n->cfg.default_ttl_ms;
    t->policy.max_ttl_ms = n->cfg.max_ttl_ms;
    for (size_t i = 0; i < n->cfg.n_pools && i < KA_POLICY_MAX_POOLS; i++) {
        snprintf(t->policy.pools[i].name, sizeof t->policy.pools[i].name, "%s",
                 n->cfg.pools[i].name);
        snprintf(t->policy.pools[i].klass, sizeof t->policy.pools[i].klass, "%s",
                 n->cfg.pools[i].klass);
        t->policy.n_pools++;
    }
    if (s_spawn(n, &ka_templates_behaviour, t, KA_TEMPLATES_NAME, err, cap))
        return -1;
    ka_sandboxes_args_t *s = &n->sandboxes_args;
    s->store = KA_STORE_NAME;
    s->templates = KA_TEMPLATES_NAME;
    s->driver = n->driver;
    snprintf(s->node, sizeof s->node, "%s", n->cfg.node_name);
    s->default_ttl_ms = n->cfg.default_ttl_ms;
    s->max_ttl_ms = n->cfg.max_ttl_ms;
    for (size_t i = 0; i < n->cfg.n_pools && i < KA_POOL_MAX_POOLS; i++, s->n_warm++)
        s->warm[i] = (ka_warm_cfg_t){.warm = (int32_t)n->cfg.pools[i].warm,
                                     .capacity = n->cfg.pools[i].capacity};
    for (size_t i = 0; i < s->n_warm; i++)
        snprintf(s->warm[i].name, sizeof s->warm[i].name, "%s", n->cfg.pools[i].name);
    snprintf(s->warm_dir, sizeof s->warm_dir, "%.480s/sandboxes/.warm", n->cfg.state_dir);
    s->member = n->cfg.mesh_bind[0] ? &n->member : NULL; /* no mesh: a node alone */
    if (s_spawn(n, &ka_sandboxes_behaviour, s, KA_SANDBOXES_NAME, err, cap))
        return -1;
    n->svc = ka_service_new(n->sys, KA_TEMPLATES_NAME, KA_SANDBOXES_NAME);
    return n->svc ? 0 : ka_node_fail(err, cap, "out of memory");
}

/* ---- cluster ------------------------------------------------------------------------------ */

/* The mesh (mesh.bind): CURVE with this node's keys; peers come from the node table. */
static int s_mesh(ka_node_t *n, char *err, size_t cap)
{
    if (!n->cfg.mesh_bind[0])
        return 0;
    krt_mesh_config_t mc = {.bind = n->cfg.mesh_bind,
                            .curve_public = n->ident.public_key,
                            .curve_secret = n->ident.secret_key,
                            .heartbeat_ms = MESH_HEARTBEAT_MS,
                            .peer_timeout_ms = MESH_PEER_TIMEOUT_MS,
                            .max_msg = MESH_MAX_MSG};
    n->mesh = krt_mesh_new(n->sys, &mc);
    if (!n->mesh)
        return ka_node_fail(err, cap, "mesh.bind %s: the mesh cannot be set up", n->cfg.mesh_bind);
    int rc = krt_mesh_start(n->mesh);
    if (rc)
        return ka_node_fail(err, cap, "mesh.bind %s: %s", n->cfg.mesh_bind,
                            rc == -EADDRINUSE ? "the address is in use" : krt_strerror(rc));
    const char *ep = n->cfg.mesh_advertise[0] ? n->cfg.mesh_advertise : krt_mesh_endpoint(n->mesh);
    if (strstr(ep, "://0.0.0.0:") || strstr(ep, "://*:") || strstr(ep, "://[::]:"))
        return ka_node_fail(
            err, cap,
            "mesh.bind %s is a wildcard address: set mesh.advertise to the endpoint "
            "other nodes reach this one at",
            n->cfg.mesh_bind);
    if (strlen(ep) >= sizeof n->member_args.self.mesh_endpoint)
        return ka_node_fail(err, cap, "mesh endpoint %.64s...: too long", ep);
    memcpy(n->member_args.self.mesh_endpoint, ep, strlen(ep) + 1);
    snprintf(n->member_args.self.public_key, sizeof n->member_args.self.public_key, "%s",
             n->ident.public_key);
    n->member_args.mesh = n->mesh;
    return 0;
}

/* Membership: registers this node (its first lease) before the node says it started. */
static int s_cluster(ka_node_t *n, char *err, size_t cap)
{
    ka_store_node_t *self = &n->member_args.self;
    snprintf(self->id, sizeof self->id, "%u", (unsigned)n->ident.node_id);
    snprintf(self->name, sizeof self->name, "%s", n->cfg.node_name);
    snprintf(self->endpoint, sizeof self->endpoint, "%s", n->endpoint);
    int64_t capacity = 0;
    for (size_t i = 0; i < n->cfg.n_pools; i++) {
        size_t l = strlen(self->pools);
        snprintf(self->pools + l, sizeof self->pools - l, "%s%s", i ? "," : "",
                 n->cfg.pools[i].name);
        capacity += n->cfg.pools[i].capacity;
    }
    self->capacity = (int32_t)(capacity < INT32_MAX ? capacity : INT32_MAX);
    n->member_args.store = KA_STORE_NAME;
    n->member_args.status = &n->member;
    n->member_args.lease_ms = (int)n->cfg.lease_ms;
    n->member_args.renew_ms = (int)n->cfg.renew_ms;
    n->member_args.forget_ms = n->cfg.forget_ms;
    if (s_spawn(n, &ka_membership_behaviour, &n->member_args, KA_CLUSTER_NAME, err, cap))
        return -1;
    for (int waited = 0; waited < MEMBER_READY_MS; waited += 20) {
        if (ka_membership_member(&n->member))
            return 0;
        usleep(20 * 1000);
    }
    return ka_node_fail(err, cap, "the node did not register in the node table within %d s",
                        MEMBER_READY_MS / 1000);
}

/* ---- bridges ------------------------------------------------------------------------------ */

static bool s_ready(void *arg)
{
    const ka_node_t *n = arg;
    return n->ready && ka_db_watch_ok(n->db_watch) && ka_membership_member(&n->member);
}

/* What hostile or broken guests sent (ka_guestcalls). */
static int s_guest_metrics(kb_http_buf_t *b)
{
    ka_gc_stats_t g;
    ka_gc_stats(&g);
    return kb_http_buf_printf(
        b,
        "# HELP kagent_guest_frames_total Frames from sandbox guests checked.\n"
        "# TYPE kagent_guest_frames_total counter\nkagent_guest_frames_total %llu\n"
        "# HELP kagent_guest_frames_forged_total Guest frames with ids the node never issued "
        "(dropped).\n"
        "# TYPE kagent_guest_frames_forged_total counter\nkagent_guest_frames_forged_total %llu\n"
        "# HELP kagent_guest_frames_stale_total Guest frames for calls already ended (dropped).\n"
        "# TYPE kagent_guest_frames_stale_total counter\nkagent_guest_frames_stale_total %llu\n"
        "# HELP kagent_guest_protocol_violations_total Guests killed for breaking the protocol.\n"
        "# TYPE kagent_guest_protocol_violations_total counter\n"
        "kagent_guest_protocol_violations_total %llu\n",
        (unsigned long long)g.frames, (unsigned long long)g.forged, (unsigned long long)g.stale,
        (unsigned long long)g.violations);
}

/* A pool's used count in the manager's count (0: no count, or the pool not in it). */
static unsigned long long s_pool_used(const ka_sbx_count_t *c, const char *pool)
{
    for (uint32_t i = 0; c && i < c->n_pools && i < KA_SBX_POOLS_MAX; i++)
        if (strcmp(c->pools[i].pool, pool) == 0)
            return (unsigned long long)c->pools[i].used;
    return 0;
}

/* Pools (capacity, in use) and this node, as gauges. A pool's in-use count is the one its
 * capacity check uses (the manager's, creates and forks admitted included), so the two gauges
 * say how much room a create has. */
static int s_pool_metrics(ka_node_t *n, kb_http_buf_t *b, const ka_sbx_count_t *c, uint64_t live)
{
    int rc = kb_http_buf_printf(
        b, "# HELP kagent_pool_capacity_sandboxes Sandboxes a pool may hold on this node.\n"
           "# TYPE kagent_pool_capacity_sandboxes gauge\n");
    for (size_t i = 0; !rc && i < n->cfg.n_pools; i++)
        rc = kb_http_buf_printf(
            b, "kagent_pool_capacity_sandboxes{pool=\"%s\",class=\"%s\"} %lld\n", n->pools[i].name,
            n->pools[i].klass, (long long)n->pools[i].capacity);
    if (!rc)
        rc = kb_http_buf_printf(
            b, "# HELP kagent_pool_in_use_sandboxes Sandboxes a pool holds on this node, as its "
               "capacity counts them.\n# TYPE kagent_pool_in_use_sandboxes gauge\n");
    for (size_t i = 0; !rc && i < n->cfg.n_pools; i++)
        rc = kb_http_buf_printf(b, "kagent_pool_in_use_sandboxes{pool=\"%s\"} %llu\n",
                                n->pools[i].name, s_pool_used(c, n->pools[i].name));
    if (!rc)
        rc = kb_http_buf_printf(
            b,
            "# HELP kagent_node_info This node (always 1).\n# TYPE kagent_node_info gauge\n"
            "kagent_node_info{node=\"%s\",id=\"%lld\",version=\"%s\"} 1\n"
            "# HELP kagent_node_sandboxes Sandboxes with an actor on a node.\n"
            "# TYPE kagent_node_sandboxes gauge\nkagent_node_sandboxes{node=\"%s\"} %llu\n",
            n->cfg.node_name, (long long)n->cfg.node_id, KAGENT_VERSION, n->cfg.node_name,
            (unsigned long long)live);
    return rc;
}

/* Membership: the lease, its incarnation, fencings and mesh peers. */
static int s_cluster_metrics(ka_node_t *n, kb_http_buf_t *b)
{
    const ka_membership_status_t *m = &n->member;
    return kb_http_buf_printf(
        b,
        "# HELP kagent_cluster_member 1 while this node holds its lease in the node table.\n"
        "# TYPE kagent_cluster_member gauge\nkagent_cluster_member %d\n"
        "# HELP kagent_cluster_incarnation This node's incarnation (the fencing counter).\n"
        "# TYPE kagent_cluster_incarnation gauge\nkagent_cluster_incarnation %lld\n"
        "# HELP kagent_cluster_fenced_total Times this node lost its lease (fenced).\n"
        "# TYPE kagent_cluster_fenced_total counter\nkagent_cluster_fenced_total %llu\n"
        "# HELP kagent_cluster_peers Mesh peers connected (nodes whose lease holds).\n"
        "# TYPE kagent_cluster_peers gauge\nkagent_cluster_peers %u\n",
        ka_membership_member(m) ? 1 : 0, (long long)atomic_load(&m->incarnation),
        (unsigned long long)atomic_load(&m->fenced_total), atomic_load(&m->peers_connected));
}

/* The warm pools: depth per template revision, hits, misses, their ratio and refills. */
static int s_warm_metrics(kb_http_buf_t *b, const ka_sbx_count_t *c)
{
    uint64_t tries = c->warm_hits + c->warm_misses;
    int rc = kb_http_buf_printf(
        b, "# HELP kagent_warm_pool_depth Warm sandboxes ready to be claimed, per template.\n"
           "# TYPE kagent_warm_pool_depth gauge\n");
    for (uint32_t i = 0; !rc && i < c->n_warm && i < KA_SBX_WARM_MAX; i++)
        rc = kb_http_buf_printf(
            b, "kagent_warm_pool_depth{pool=\"%s\",template=\"%s/%s\",revision=\"%.16s\"} %u\n",
            c->warm[i].pool, c->warm[i].template_namespace, c->warm[i].template_name,
            c->warm[i].revision, c->warm[i].ready);
    if (!rc)
        rc = kb_http_buf_printf(
            b,
            "# HELP kagent_warm_pool_hits_total Creates served by a warm sandbox.\n"
            "# TYPE kagent_warm_pool_hits_total counter\nkagent_warm_pool_hits_total %llu\n"
            "# HELP kagent_warm_pool_misses_total Creates of a warm-pooled revision that started "
            "cold (pool empty).\n"
            "# TYPE kagent_warm_pool_misses_total counter\nkagent_warm_pool_misses_total %llu\n"
            "# HELP kagent_warm_pool_hit_ratio Hits over hits and misses since start.\n"
            "# TYPE kagent_warm_pool_hit_ratio gauge\nkagent_warm_pool_hit_ratio %g\n"
            "# HELP kagent_warm_pool_refills_total Warm sandboxes booted.\n"
            "# TYPE kagent_warm_pool_refills_total counter\nkagent_warm_pool_refills_total %llu\n",
            (unsigned long long)c->warm_hits, (unsigned long long)c->warm_misses,
            tries ? (double)c->warm_hits / (double)tries : 0.0,
            (unsigned long long)c->warm_refills);
    return rc;
}

/* The histograms (ka_metrics) and the process_* metrics. */
static int s_process_metrics(kb_http_buf_t *b)
{
    char *hist = ka_metrics_text(), *proc = ka_metrics_process_text();
    int rc = hist && proc ? kb_http_buf_printf(b, "%s%s", hist, proc) : -ENOMEM;
    free(hist);
    free(proc);
    return rc;
}

static int s_metrics(kb_http_buf_t *b, void *arg)
{
    ka_node_t *n = arg;
    krt_stats_t st;
    krt_system_stats(n->sys, &st);
    kb_grpc_stats_t gs;
    kb_grpc_server_stats(n->grpc, &gs);
    krt_reply_t r;
    uint64_t live = 0;
    ka_sbx_count_t *count = NULL; /* the reply's body, with the warm pools */
    if (ka_svc_call_sync(n->svc, KA_SBX_COUNT, NULL, 0, 2000, &r) == KA_OK &&
        r.len == sizeof *count) {
        count = (ka_sbx_count_t *)r.body;
        live = count->live;
    }
    int rc = kb_http_buf_printf(
        b,
        "# HELP kagent_sandboxes_live Sandboxes with an actor on this node.\n"
        "# TYPE kagent_sandboxes_live gauge\nkagent_sandboxes_live %llu\n"
        "# HELP kagent_actors_live Live actors in the runtime.\n"
        "# TYPE kagent_actors_live gauge\nkagent_actors_live %llu\n"
        "# HELP kagent_actors_spawned_total Actors spawned since start.\n"
        "# TYPE kagent_actors_spawned_total counter\nkagent_actors_spawned_total %llu\n"
        "# HELP kagent_messages_total Messages delivered since start.\n"
        "# TYPE kagent_messages_total counter\nkagent_messages_total %llu\n"
        "# HELP kagent_timers_armed Armed runtime timers (TTLs and timeouts).\n"
        "# TYPE kagent_timers_armed gauge\nkagent_timers_armed %llu\n"
        "# HELP kagent_grpc_calls_total gRPC calls received.\n"
        "# TYPE kagent_grpc_calls_total counter\nkagent_grpc_calls_total %llu\n"
        "# HELP kagent_grpc_calls_live gRPC calls in flight.\n"
        "# TYPE kagent_grpc_calls_live gauge\nkagent_grpc_calls_live %llu\n",
        (unsigned long long)live, (unsigned long long)st.actors_live,
        (unsigned long long)st.actors_spawned, (unsigned long long)st.messages,
        (unsigned long long)st.timers_armed, (unsigned long long)gs.calls_started,
        (unsigned long long)gs.calls_live);
    if (!rc)
        rc = s_guest_metrics(b);
    if (!rc)
        rc = s_pool_metrics(n, b, count, live);
    if (!rc)
        rc = s_cluster_metrics(n, b);
    if (!rc && count)
        rc = s_warm_metrics(b, count);
    krt_reply_free(&r);
    return rc ? rc : s_process_metrics(b);
}

static void s_on_grpc(int fd, const struct sockaddr *peer, socklen_t len, void *arg)
{
    kb_grpc_server_add_fd(((ka_node_t *)arg)->grpc, fd);
}

static void s_on_http(int fd, const struct sockaddr *peer, socklen_t len, void *arg)
{
    kb_http_add_connection(((ka_node_t *)arg)->http, fd, peer, len);
}

static int s_conn_identity(int fd, char *out, size_t cap, void *arg)
{
    return kb_conn_ids_get(arg, fd, out, cap);
}

/* The port's TLS context from listen.tls (none when certFile is empty). */
static int s_tls(ka_node_t *n, char *err, size_t cap)
{
    if (!ka_config_tls(&n->cfg))
        return 0;
    kb_tls_files_t f = {.cert_file = n->cfg.tls_cert_file,
                        .key_file = n->cfg.tls_key_file,
                        .client_ca_file = n->cfg.tls_client_ca_file,
                        .require_client_cert = n->cfg.tls_require_client_cert};
    char why[KB_TLS_ERR_CAP];
    n->tls = kb_tls_new(&f, why, sizeof why);
    if (!n->tls)
        return ka_node_fail(err, cap, "listen.tls: %s", why);
    n->conn_ids = kb_conn_ids_new();
    return n->conn_ids ? 0 : ka_node_fail(err, cap, "out of memory");
}

static int s_bridges(ka_node_t *n, char *err, size_t cap)
{
    char why[256] = "";
    int e = 0;
    n->auth = kb_auth_new(n->cfg.auth_mode == KA_AUTH_TOKENS ? KB_AUTH_TOKENS : KB_AUTH_USER_HEADER,
                          n->cfg.tokens_file, &e, why, sizeof why);
    if (!n->auth)
        return ka_node_fail(err, cap, "auth: %s", why[0] ? why : strerror(-e));
    if (n->conn_ids)
        kb_auth_set_conn_lookup(n->auth, s_conn_identity, n->conn_ids);
    for (size_t i = 0; i < n->cfg.n_operators; i++)
        n->operators[i] = n->cfg.operators[i];
    if (kb_auth_set_operators(n->auth, n->operators, n->cfg.n_operators))
        return ka_node_fail(err, cap, "out of memory");
    for (size_t i = 0; i < n->cfg.n_pools; i++)
        n->pools[i] =
            (kb_api_pool_t){n->cfg.pools[i].name, n->cfg.pools[i].klass, n->cfg.pools[i].capacity};
    snprintf(n->endpoint, sizeof n->endpoint, "%s:%lld", n->cfg.listen_address,
             (long long)n->cfg.listen_port);
    kb_api_options_t ao = {.svc = n->svc,
                           .auth = n->auth,
                           .images = KA_IMAGES_NAME,
                           .state_dir = n->cfg.state_dir,
                           .pools = n->pools,
                           .n_pools = n->cfg.n_pools};
    n->api = kb_api_new(&ao);
    n->grpc = kb_grpc_server_new(NULL);
    n->reflection = kb_grpc_reflection_new();
    if (!n->api || !n->grpc || !n->reflection || kb_api_register(n->api, n->grpc) ||
        kb_grpc_reflection_add_set(n->reflection, kb_grpc_protoset, kb_grpc_protoset_len) ||
        kb_grpc_reflection_register(n->reflection, n->grpc) || kb_grpc_server_start(n->grpc))
        return ka_node_fail(err, cap, "the gRPC server cannot start");
    kb_http_options_t ho = {.ready = s_ready, .metrics = s_metrics, .arg = n};
    n->http = kb_http_new(&ho);
    if (!n->http)
        return ka_node_fail(err, cap, "the HTTP server cannot start");
    for (size_t i = 0; i < n->cfg.n_allowed_hosts; i++)
        n->mcp_hosts[i] = n->cfg.allowed_hosts[i];
    kb_mcp_options_t mo = {.allowed_hosts = n->cfg.n_allowed_hosts ? n->mcp_hosts : NULL,
                           .server_version = KAGENT_VERSION};
    n->mcp = kb_mcp_new(n->http, n->svc, n->auth, &mo);
    if (!n->mcp)
        return ka_node_fail(err, cap, "the MCP bridge cannot start");
    kb_ui_options_t uo = {.svc = n->svc,
                          .auth = n->auth,
                          .driver = n->driver,
                          .node_name = n->cfg.node_name,
                          .node_id = (int)n->cfg.node_id,
                          .endpoint = n->endpoint,
                          .version = KAGENT_VERSION,
                          .pools = n->pools,
                          .n_pools = n->cfg.n_pools,
                          .allowed_hosts = n->cfg.n_allowed_hosts ? n->mcp_hosts : NULL,
                          .tls = n->tls != NULL};
    if (!(n->ui = kb_ui_new(n->http, &uo)))
        return ka_node_fail(err, cap, "the /ui page cannot start");
    kb_listener_options_t lo = {.host = n->cfg.listen_address,
                                .port = (int)n->cfg.listen_port,
                                .on_grpc = s_on_grpc,
                                .on_http = s_on_http,
                                .arg = n,
                                .tls = n->tls,
                                .ids = n->conn_ids};
    n->listener = kb_listener_new(&lo, &e);
    if (!n->listener)
        return ka_node_fail(err, cap, "cannot listen on %s:%lld: %s", n->cfg.listen_address,
                            (long long)n->cfg.listen_port,
                            e == -EADDRINUSE ? "the port is in use (another kagentd?)"
                                             : strerror(-e));
    if (!n->cfg.listen_port) /* an ephemeral port: its number, before anyone can know it */
        snprintf(n->endpoint, sizeof n->endpoint, "%s:%d", n->cfg.listen_address,
                 kb_listener_port(n->listener));
    return 0;
}

/* ---- start / stop ------------------------------------------------------------------------- */

ka_node_t *ka_node_start(const ka_config_t *cfg, char *err, size_t cap)
{
    ka_node_t *n = calloc(1, sizeof *n);
    if (!n) {
        ka_node_fail(err, cap, "out of memory");
        return NULL;
    }
    n->cfg = *cfg;
    n->uids.fd = -1;
    snprintf(n->path, sizeof n->path, "%s", cfg->node_name);
    int rc = s_tls(n, err, cap); /* first: a bad certificate fails before anything starts */
    if (!rc && (rc = ka_mkdirs(cfg->state_dir, 0755)) != 0)
        ka_node_fail(err, cap, "cannot create node.stateDir %s: %s", cfg->state_dir, strerror(-rc));
    if (!rc)
        rc = s_uids(n, err, cap);
    if (!rc)
        rc = s_database(n, err, cap);
    if (!rc)
        rc = s_identity(n, err, cap);
    if (!rc) {
        krt_config_t rcfg = {.node_id = (uint16_t)n->cfg.node_id,
                             .schedulers = (int)cfg->schedulers,
                             .job_threads = (int)cfg->job_threads,
                             .name = cfg->node_name};
        n->sys = krt_system_new(&rcfg);
        rc = !n->sys || krt_system_start(n->sys)
                 ? ka_node_fail(err, cap, "the actor runtime cannot start")
                 : 0;
    }
    n->store_args.conninfo = n->conninfo;
    if (!rc)
        rc = s_supervisor(n, err, cap);
    if (!rc)
        rc = s_spawn(n, &ka_store_behaviour, &n->store_args, KA_STORE_NAME, err, cap);
    if (!rc)
        rc = s_wait_store(n, err, cap);
    if (!rc)
        rc = s_images(n, err, cap);
    if (!rc)
        rc = s_driver(n, err, cap);
    if (!rc)
        rc = s_control(n, err, cap);
    if (!rc)
        rc = s_bridges(n, err, cap);
    if (!rc)
        rc = s_mesh(n, err, cap);
    if (!rc)
        rc = s_cluster(n, err, cap);
    if (!rc && !(n->db_watch = ka_db_watch_start(
                     n->sys, KA_STORE_NAME, n->embedded_db ? n->cfg.state_dir : NULL, n->path)))
        rc = ka_node_fail(err, cap, "cannot start the database watch: out of memory");
    if (rc) {
        ka_node_stop(&n);
        return NULL;
    }
    n->ready = true;
    return n;
}

int ka_node_reload_tls(ka_node_t *n, char *err, size_t cap)
{
    if (!n->tls)
        return ka_node_fail(err, cap, "listen.tls is not configured: nothing to reload");
    char why[KB_TLS_ERR_CAP];
    if (kb_tls_reload(n->tls, why, sizeof why))
        return ka_node_fail(err, cap, "listen.tls: %s (the previous certificate stays in use)",
                            why);
    return 0;
}

int ka_node_port(const ka_node_t *node)
{
    return node->listener ? kb_listener_port(node->listener) : 0;
}

int ka_node_id(const ka_node_t *node)
{
    return (int)node->cfg.node_id;
}

void ka_node_stop(ka_node_t **node_p)
{
    ka_node_t *n = node_p ? *node_p : NULL;
    if (!n)
        return;
    n->ready = false;
    ka_db_watch_stop(&n->db_watch);    /* before the database stops: no restart of it */
    kb_listener_destroy(&n->listener); /* no new connections */
    kb_grpc_server_destroy(&n->grpc);  /* in-flight calls cancelled and completed */
    kb_http_destroy(&n->http);
    kb_mcp_destroy(&n->mcp); /* after the HTTP server: a route cannot be removed */
    kb_ui_destroy(&n->ui);
    kb_grpc_reflection_destroy(&n->reflection);
    krt_reply_t r; /* leave the cluster: the lease ends now, peers see this node gone */
    if (n->sys && krt_call(n->sys, krt_whereis(n->sys, KA_CLUSTER_NAME), KA_CLUSTER_LEAVE, NULL, 0,
                           LEAVE_MS, &r) == 0)
        krt_reply_free(&r);
    if (n->sys)
        krt_system_stop(n->sys); /* actors stop: sandboxes release their compute, peers dropped */
    if (n->mesh)
        krt_mesh_stop(n->mesh); /* goodbye: peers see this node down at once */
    krt_system_destroy(&n->sys);
    krt_mesh_destroy(&n->mesh);
    kb_api_destroy(&n->api);
    ka_service_destroy(&n->svc);
    kb_auth_destroy(&n->auth);
    kb_conn_ids_destroy(&n->conn_ids); /* after the servers: their calls look identities up */
    kb_tls_destroy(&n->tls);
    ka_driver_destroy(&n->driver);
    ka_uidrange_release(&n->uids);
    if (n->embedded_db && ka_pg_embedded_stop(n->cfg.state_dir))
        krt_log(KRT_LOG_WARN, n->path, "database_stop_failed", "error=\"%s\"",
                ka_pg_embedded_error());
    for (size_t i = 0; i < KA_CFG_MAX_REGS; i++)
        free(n->mirrors[i]);
    free(n->conninfo);
    free(n);
    *node_p = NULL;
}
