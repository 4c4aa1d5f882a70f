/*
 * bench_control: control-plane benchmarks on real parts, in one process: a PostgreSQL (PG*
 * env, started by run.sh), the store, images, the namespaces driver with the real static
 * guest, the templates and sandboxes actors, the service layer, and a kb_grpc server with
 * kb_api on a loopback port for the gRPC figure.
 *
 *   create   KA_SBX_CREATE through ka_svc_call_sync until the reply says READY (p50/p99 ms);
 *            each sandbox is deleted after, untimed. Peer: bwrap --unshare-all /bin/true on
 *            the same busybox rootfs (fork+exec+wait, no shell), same run.
 *   exec     START of `true` with follow until the final frame via ka_svc_stream (one round trip)
 *            (p50 ms); the same via gRPC with the CLI's C-core client (kb_rpc).
 *   route    a lifecycle call the sandbox's actor answers at once (unpause of a READY sandbox,
 *            refused, nothing changes) through ka_svc_call_sync: the service layer's way to the
 *            actor and back (p50 us), 10 per exec run.
 *   rate     N concurrent creator threads, M creates in total: READY creates per second.
 *   idle     K idle sandboxes: host memory per sandbox, from the drop in MemAvailable, the
 *            node cgroup's memory usage and this process's RSS growth.
 *
 * Usage: bench_control GUEST_PATH [creates] [execs] [rate_total] [rate_threads] [idle]
 *        [grpc_execs]   (grpc_execs 0 = no gRPC figure: see run.sh for why it is opt-in)
 * Prints a table and BENCH lines; exit 1 when any step fails. Cleans up what it created.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "ateenv/v1alpha/guest.pb-c.h"
#include "auth.h"
#include "grpc_server.h"
#include "images_actor.h"
#include "ka_namespaces.h"
#include "rpc.h"
#include "sandboxes.h"
#include "service.h"
#include "store.h"
#include "templates_actor.h"

#define NS      "kagent"
#define CALLER  "bench@example.com"
#define TPL     "bench"
#define CGROUP  "kagent-bench-control"
#define TIMEOUT 60000
/* The whole gRPC phase's budget (kb_rpc deadline). */
#define GRPC_BUDGET_MS 120000

extern char **environ;

static struct {
    char dir[PATH_MAX];
    const char *guest_bin;
    char tools_rootfs[PATH_MAX + 16];
    char tools_ref[1024];
    char guest_digest[80];
    krt_system_t *sys;
    krt_addr_t store, images, templates, sandboxes;
    ka_driver_t *driver;
    ka_service_t *svc;
    ka_templates_args_t targs;
    ka_sandboxes_args_t sargs;
    unsigned long seq; /* request ids */
} B;

/* ---- small helpers ------------------------------------------------------------------------ */

static double s_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-quantile (nearest rank) of v[0..n); sorts v. */
static double s_pct(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(double), s_cmp);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static int s_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int s_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "bench_control: command failed (%d): %s\n", rc, cmd);
    return rc == 0 ? 0 : -1;
}

static long s_meminfo_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "re");
    char line[256];
    long kb = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            kb = strtol(line + kl + 1, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    return kb;
}

/* The node cgroup's memory usage in bytes, or -1: v1 memory.usage_in_bytes or v2
 * memory.current of CGROUP below this process's own cgroup (where the driver puts it). The
 * parent's figure covers every sandbox's cgroup below it. */
static long long s_cgroup_mem(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    char line[1024], path[1400] = "";
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *rel = strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1;
        if (strstr(c1 + 1, "memory") && strcmp(c1 + 1, ":memory") != 0) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/" CGROUP "/memory.usage_in_bytes",
                     rel);
            break;
        }
        if (c1[1] == '\0' && !path[0])
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/" CGROUP "/memory.current", rel);
    }
    if (f)
        fclose(f);
    long long v = -1;
    FILE *m = path[0] ? fopen(path, "re") : NULL;
    if (m && fscanf(m, "%lld", &v) != 1)
        v = -1;
    if (m)
        fclose(m);
    return v;
}

static void s_drop_caches(void)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "we");
    if (f) {
        fputs("3", f);
        fclose(f);
    }
}

/* ---- control plane set-up (as tests/integration/control does it) -------------------------- */

static int s_images(int type, const char *arg, const char *name, ka_images_reply_t *out)
{
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    snprintf(req.arg, sizeof req.arg, "%s", arg);
    snprintf(req.name, sizeof req.name, "%s", name ? name : "");
    krt_reply_t r;
    if (krt_call(B.sys, B.images, type, &req, sizeof req, TIMEOUT, &r) != 0)
        return -1;
    int ok = r.len == sizeof *out;
    if (ok)
        memcpy(out, r.body, sizeof *out);
    krt_reply_free(&r);
    if (!ok || out->err) {
        fprintf(stderr, "images request %d %s: %s\n", type, arg, ok ? out->message : "bad reply");
        return -1;
    }
    return 0;
}

static int s_build_images(void)
{
    char guestfs[PATH_MAX + 16];
    const char *r = B.tools_rootfs;
    snprintf(guestfs, sizeof guestfs, "%s/guest-rootfs", B.dir);
    if (s_sh("mkdir -p %s/bin %s/etc %s/data %s/run/kagent && cp /bin/busybox %s/bin/busybox && "
             "%s/bin/busybox --install -s %s/bin && ln -sf busybox %s/bin/sh",
             r, r, r, guestfs, r, r, r, r) ||
        s_sh("for b in %s/bin/*; do [ -L \"$b\" ] && ln -sf busybox \"$b\"; done; true", r) ||
        s_sh("cp %s %s/run/kagent/guest", B.guest_bin, guestfs))
        return -1;
    ka_images_reply_t ir;
    if (s_images(KA_IMAGES_BUILD, r, "bench/tools", &ir))
        return -1;
    snprintf(B.tools_ref, sizeof B.tools_ref, "%s", ir.ref);
    if (s_images(KA_IMAGES_BUILD, guestfs, "bench/guest", &ir))
        return -1;
    snprintf(B.guest_digest, sizeof B.guest_digest, "%s", ir.digest);
    /* mount points for the bwrap peer, after the image was built (the image is unchanged) */
    return s_sh("mkdir -p %s/dev %s/proc %s/tmp", r, r, r);
}

static int s_start_driver(void)
{
    ka_images_reply_t r;
    if (s_images(KA_IMAGES_PREPARE, B.guest_digest, NULL, &r))
        return -1;
    char guest[PATH_MAX + 32], state[PATH_MAX + 16];
    snprintf(guest, sizeof guest, "%s/run/kagent/guest", r.path);
    snprintf(state, sizeof state, "%s/sandboxes", B.dir);
    ka_ns_opts_t o = {.state_dir = state,
                      .guest_path = guest,
                      .cpu_millis = 1000,
                      .mem_bytes = 256u << 20,
                      .pids_max = 128,
                      .cgroup_name = CGROUP};
    int err = 0;
    B.driver = ka_namespaces_new(&o, &err);
    if (!B.driver)
        fprintf(stderr, "namespaces driver: %s\n", strerror(-err));
    return B.driver ? 0 : -1;
}

static _Thread_local char s_why[KA_MSG_LEN]; /* the last failed s_call's message */

/* A call: its status code; a success reply copied to out (cap bytes at most), an error's
 * message to s_why. */
static int s_call(uint32_t type, const void *body, size_t len, void *out, size_t cap)
{
    krt_reply_t r;
    int code = ka_svc_call_sync(B.svc, type, body, len, TIMEOUT, &r);
    s_why[0] = '\0';
    if (code != KA_OK)
        snprintf(s_why, sizeof s_why, "%.*s", (int)r.len, r.body ? (const char *)r.body : "");
    else if (r.body && out)
        memcpy(out, r.body, r.len < cap ? r.len : cap);
    krt_reply_free(&r);
    return code;
}

/* Applies the benchmark template and waits until it is Prepared. */
static int s_template(void)
{
    char *y = NULL;
    if (asprintf(&y,
                 "apiVersion: api.kagent.dev/v1alpha3\nkind: SandboxTemplate\n"
                 "metadata:\n  name: " TPL "\n  namespace: " NS "\n"
                 "spec:\n  workload:\n    image: %s\n"
                 "  substrate:\n    workerPoolRef:\n      name: kagent-default\n"
                 "    snapshotPolicy:\n      location: file://%s/snapshots/\n",
                 B.tools_ref, B.dir) < 0)
        return -1;
    size_t yl = strlen(y);
    ka_tpl_apply_t *a = calloc(1, sizeof *a + yl + 1);
    snprintf(a->default_namespace, sizeof a->default_namespace, "default");
    a->yaml_len = (uint32_t)yl;
    memcpy(a->yaml, y, yl + 1);
    int code = s_call(KA_TPL_APPLY, a, sizeof *a + yl + 1, NULL, 0);
    free(a);
    free(y);
    if (code != KA_OK) {
        fprintf(stderr, "template apply: %d %s\n", code, s_why);
        return -1;
    }
    /* Prepared = a create resolves; probe with creates until one succeeds. */
    for (int i = 0; i < 600; i++) {
        ka_tpl_key_t k;
        memset(&k, 0, sizeof k);
        snprintf(k.namespace_, sizeof k.namespace_, NS);
        snprintf(k.name, sizeof k.name, TPL);
        krt_reply_t r;
        int c = ka_svc_call_sync(B.svc, KA_TPL_GET, &k, sizeof k, TIMEOUT, &r);
        bool ready = false;
        if (c == KA_OK) {
            const ka_tpl_reply_t *tr = r.body;
            const ka_store_template_t *t =
                ka_store_blob_next(&tr->blob, r.len - offsetof(ka_tpl_reply_t, blob), NULL);
            ready = t && strstr(ka_store_template_status(t), "\"Prepared\"");
        }
        krt_reply_free(&r);
        if (ready)
            return 0;
        usleep(50 * 1000);
    }
    fprintf(stderr, "template never Prepared\n");
    return -1;
}

static int s_setup(void)
{
    snprintf(B.dir, sizeof B.dir, "/tmp/kagent-ctlbench.XXXXXX");
    if (!mkdtemp(B.dir))
        return -1;
    chmod(B.dir, 0755);
    snprintf(B.tools_rootfs, sizeof B.tools_rootfs, "%s/tools-rootfs", B.dir);
    krt_config_t cfg = {.node_id = 1, .name = "node-bench"};
    B.sys = krt_system_new(&cfg);
    if (!B.sys || krt_system_start(B.sys))
        return -1;
    static ka_store_args_t store_args = {.conninfo = ""};
    krt_spawn_opts_t so = {.name = KA_STORE_NAME, .register_name = true};
    if (krt_system_spawn(B.sys, &ka_store_behaviour, &store_args, &so, &B.store))
        return -1;
    static ka_images_actor_args_t ia;
    ia.state_dir = B.dir;
    krt_spawn_opts_t io = {.name = KA_IMAGES_NAME, .register_name = true};
    if (krt_system_spawn(B.sys, &ka_images_behaviour, &ia, &io, &B.images))
        return -1;
    if (s_build_images() || s_start_driver())
        return -1;
    B.targs.store = KA_STORE_NAME;
    B.targs.images = KA_IMAGES_NAME;
    ka_policy_t *p = &B.targs.policy;
    snprintf(p->guest_image_digest, sizeof p->guest_image_digest, "%s", B.guest_digest);
    p->cpu_millis = 1000;
    p->memory_bytes = 256 << 20;
    p->default_ttl_ms = 3600000;
    p->max_ttl_ms = 86400000;
    snprintf(p->pools[0].name, sizeof p->pools[0].name, "kagent-default");
    snprintf(p->pools[0].klass, sizeof p->pools[0].klass, "namespaces");
    p->n_pools = 1;
    krt_spawn_opts_t to = {.name = KA_TEMPLATES_NAME, .register_name = true};
    if (krt_system_spawn(B.sys, &ka_templates_behaviour, &B.targs, &to, &B.templates))
        return -1;
    B.sargs = (ka_sandboxes_args_t){.store = KA_STORE_NAME,
                                    .templates = KA_TEMPLATES_NAME,
                                    .driver = B.driver,
                                    .node = "node-bench",
                                    .default_ttl_ms = 3600000,
                                    .max_ttl_ms = 86400000};
    krt_spawn_opts_t xo = {.name = KA_SANDBOXES_NAME, .register_name = true};
    if (krt_system_spawn(B.sys, &ka_sandboxes_behaviour, &B.sargs, &xo, &B.sandboxes))
        return -1;
    B.svc = ka_service_new(B.sys, KA_TEMPLATES_NAME, KA_SANDBOXES_NAME);
    return B.svc ? s_template() : -1;
}

static void s_teardown(void)
{
    ka_service_destroy(&B.svc);
    krt_system_destroy(&B.sys);
    ka_driver_destroy(&B.driver);
    if (B.dir[0])
        s_sh("rm -rf %s", B.dir);
}

/* ---- sandbox operations ------------------------------------------------------------------- */

/* One create; 0 with the id when the reply is OK and READY. */
static int s_create(char id[KA_STORE_ID_LEN])
{
    ka_sbx_create_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.caller, sizeof c.caller, CALLER);
    snprintf(c.request_id, sizeof c.request_id, "bench-%d-%lu", (int)getpid(),
             __atomic_add_fetch(&B.seq, 1, __ATOMIC_RELAXED));
    snprintf(c.template_namespace, sizeof c.template_namespace, NS);
    snprintf(c.template_name, sizeof c.template_name, TPL);
    ka_sbx_reply_t r;
    memset(&r, 0, sizeof r);
    int code = s_call(KA_SBX_CREATE, &c, sizeof c, &r, sizeof r);
    if (code != KA_OK || r.sandbox.state != KA_STATE_READY) {
        fprintf(stderr, "create: code %d state %d: %s\n", code, r.sandbox.state, s_why);
        return -1;
    }
    snprintf(id, KA_STORE_ID_LEN, "%s", r.sandbox.id);
    return 0;
}

static int s_delete(const char *id)
{
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.caller, sizeof k.caller, CALLER);
    snprintf(k.id, sizeof k.id, "%s", id);
    ka_sbx_reply_t r;
    memset(&r, 0, sizeof r);
    int code = s_call(KA_SBX_DELETE, &k, sizeof k, &r, sizeof r);
    if (code != KA_OK || r.sandbox.state != KA_STATE_DELETED) {
        fprintf(stderr, "delete %s: code %d state %d\n", id, code, r.sandbox.state);
        return -1;
    }
    return 0;
}

/* Unpause of the READY sandbox id, n times: the actor refuses each at once. The time of each
 * (ms) into out; 0, or -1 when one is answered otherwise. */
static int s_route_rtt(const char *id, int n, double *out)
{
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.caller, sizeof k.caller, CALLER);
    snprintf(k.id, sizeof k.id, "%s", id);
    for (int i = 0; i < n; i++) {
        double t0 = s_ms();
        int code = s_call(KA_SBX_UNPAUSE, &k, sizeof k, NULL, 0);
        out[i] = s_ms() - t0;
        if (code != KA_FAILED_PRECONDITION) {
            fprintf(stderr, "unpause of a READY sandbox: code %d\n", code);
            return -1;
        }
    }
    return 0;
}

/* A guest stream waited on to its final frame. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    ka_guest_reply_t final;
} s_wait_t;

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_wait_t *w = user;
    if (!f->final)
        return;
    pthread_mutex_lock(&w->lock);
    w->final = *f;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Runs one guest call (frees q); the final status code, or -1 on a local failure. */
static int s_guest(ka_guest_req_t *q, ka_guest_reply_t *final)
{
    s_wait_t w = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    krt_addr_t stream;
    int rc = ka_svc_stream(B.svc, &q, s_on_frame, &w, &stream);
    if (rc)
        return -1;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&w.lock);
    while (!w.done && rc == 0)
        rc = pthread_cond_timedwait(&w.cond, &w.lock, &until);
    pthread_mutex_unlock(&w.lock);
    if (!w.done) {
        ka_svc_stream_cancel(B.svc, stream);
        return -1;
    }
    *final = w.final;
    return ka_err_code(w.final.err);
}

/* `true` through the service layer in one guest round trip: START with follow (the process,
 * its output, its exit). */
static int s_exec_true(const char *id)
{
    ka_guest_req_t *q = ka_guest_req_new(CALLER, id, KA_GUEST_START, sizeof "true");
    q->n_argv = 1;
    q->follow = 1;
    memcpy(q->tail, "true", sizeof "true");
    ka_guest_reply_t f;
    if (s_guest(q, &f) != KA_OK || !f.has_process || f.process.exit_code != 0)
        return -1;
    return 0;
}

/* ---- gRPC path ---------------------------------------------------------------------------- */

typedef struct {
    kb_auth_t *auth;
    kb_api_t *api;
    kb_grpc_server_t *srv;
    kb_rpc_t *rpc;
} s_grpc_t;

/* stuck: a server handler never returned (see the report); the server and api are left
 * alone, since destroying the server waits for every handler. */
static void s_grpc_stop(s_grpc_t *g, bool stuck)
{
    kb_rpc_destroy(&g->rpc);
    if (stuck)
        return;
    kb_grpc_server_destroy(&g->srv);
    kb_api_destroy(&g->api);
    kb_auth_destroy(&g->auth);
}

static int s_grpc_start(s_grpc_t *g)
{
    int e = 0;
    char why[256] = "", url[64], err[256] = "";
    g->auth = kb_auth_new(KB_AUTH_USER_HEADER, NULL, &e, why, sizeof why);
    kb_api_options_t ao = {
        .svc = B.svc, .auth = g->auth, .images = KA_IMAGES_NAME, .state_dir = B.dir};
    g->api = g->auth ? kb_api_new(&ao) : NULL;
    kb_grpc_options_t go = {.listen_addr = "127.0.0.1:0"};
    g->srv = kb_grpc_server_new(&go);
    if (!g->api || !g->srv || kb_api_register(g->api, g->srv) || kb_grpc_server_start(g->srv))
        return -1;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", kb_grpc_server_port(g->srv));
    /* one deadline for the whole phase: a call that never ends fails instead of hanging */
    kb_rpc_opts_t ro = {.api_url = url, .user_id = CALLER, .timeout_ms = GRPC_BUDGET_MS};
    g->rpc = kb_rpc_new(&ro, err, sizeof err);
    if (!g->rpc)
        fprintf(stderr, "grpc client: %s\n", err);
    return g->rpc ? 0 : -1;
}

/* `true` via gRPC: StartProcess, then StreamProcessOutput(follow) until the exit message. */
static int s_grpc_exec_true(s_grpc_t *g, const char *id)
{
    char *argv[] = {"true"};
    Ateenv__V1alpha__StartProcessRequest req = ATEENV__V1ALPHA__START_PROCESS_REQUEST__INIT;
    req.n_command = 1;
    req.command = argv;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(g->rpc, "/ateenv.v1alpha.ProcessService/StartProcess", id, &req.base,
                     &ateenv__v1alpha__start_process_response__descriptor, &resp, &st)) {
        fprintf(stderr, "grpc start: %d %s\n", st.code, st.message);
        return -1;
    }
    Ateenv__V1alpha__StartProcessResponse *r = (Ateenv__V1alpha__StartProcessResponse *)resp;
    Ateenv__V1alpha__StreamProcessOutputRequest oq =
        ATEENV__V1ALPHA__STREAM_PROCESS_OUTPUT_REQUEST__INIT;
    oq.process_id = r->process ? r->process->process_id : "";
    oq.follow = true;
    kb_rpc_call_t *call = kb_rpc_server_stream(
        g->rpc, "/ateenv.v1alpha.ProcessService/StreamProcessOutput", id, &oq.base, &st);
    protobuf_c_message_free_unpacked(resp, NULL);
    int rc = -1;
    ProtobufCMessage *m = NULL;
    while (call && rc != 0 &&
           kb_rpc_call_read(call, &ateenv__v1alpha__process_output__descriptor, &m) == 1) {
        Ateenv__V1alpha__ProcessOutput *o = (Ateenv__V1alpha__ProcessOutput *)m;
        if (o->output_case == ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_EXIT && o->exit &&
            o->exit->state == ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED &&
            o->exit->exit_code == 0)
            rc = 0;
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (rc)
        fprintf(stderr, "grpc output: no exit frame\n");
    kb_rpc_call_destroy(&call);
    return rc;
}

/* ---- peer --------------------------------------------------------------------------------- */

/* One bwrap --unshare-all run of /bin/true on the tools rootfs (fork+exec+wait), ms or -1. */
static double s_bwrap_once(void)
{
    char *argv[] = {"/usr/bin/bwrap",
                    "--ro-bind",
                    B.tools_rootfs,
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                    "--unshare-all",
                    "--die-with-parent",
                    "--new-session",
                    "--uid",
                    "65532",
                    "--gid",
                    "65532",
                    "/bin/true",
                    NULL};
    pid_t pid;
    int status = 0;
    double t0 = s_ms();
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0)
        return -1;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    return s_ms() - t0;
}

/* ---- concurrent creators ------------------------------------------------------------------ */

typedef struct {
    int n;                        /* creates this thread makes */
    char (*ids)[KA_STORE_ID_LEN]; /* its slice of the id table */
    int ok;
} s_creator_t;

static void *s_creator(void *arg)
{
    s_creator_t *c = arg;
    for (int i = 0; i < c->n; i++)
        if (s_create(c->ids[i]) == 0)
            c->ok++;
        else
            c->ids[i][0] = '\0';
    return NULL;
}

/* ---- main --------------------------------------------------------------------------------- */

static int s_arg(int argc, char **argv, int i, int dflt)
{
    return argc > i && atoi(argv[i]) > 0 ? atoi(argv[i]) : dflt;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_control GUEST_PATH [creates] [execs] [rate_total] "
                        "[rate_threads] [idle]\n");
        return 2;
    }
    B.guest_bin = argv[1];
    int n_create = s_arg(argc, argv, 2, 200), n_exec = s_arg(argc, argv, 3, 500);
    int n_rate = s_arg(argc, argv, 4, 300), n_threads = s_arg(argc, argv, 5, 8);
    int n_idle = s_arg(argc, argv, 6, 200), n_gexec = argc > 7 ? atoi(argv[7]) : 0;
    int status = 0;
    if (s_setup()) {
        fprintf(stderr, "bench_control: set-up failed\n");
        s_teardown();
        return 1;
    }
    char id[KA_STORE_ID_LEN];
    /* warm-up: the template's rootfs, the store's connections, the guest's page cache */
    for (int i = 0; i < 5 && status == 0; i++)
        if (s_create(id) || s_delete(id))
            status = 1;

    /* 1. create -> READY, sequential */
    double *create = calloc((size_t)n_create, sizeof(double));
    int created = 0;
    for (; status == 0 && created < n_create; created++) {
        double t0 = s_ms();
        if (s_create(id)) {
            status = 1;
            break;
        }
        create[created] = s_ms() - t0;
        if (s_delete(id))
            status = 1;
    }
    /* peer: bwrap, same rootfs, same run */
    double *peer = calloc((size_t)n_create, sizeof(double));
    int have_bwrap = access("/usr/bin/bwrap", X_OK) == 0, n_peer = 0;
    for (; have_bwrap && n_peer < n_create; n_peer++)
        if ((peer[n_peer] = s_bwrap_once()) < 0) {
            fprintf(stderr, "bwrap run failed: no peer figure\n");
            have_bwrap = 0;
        }

    /* 2. exec round trip of `true` in one sandbox: service layer, then gRPC */
    double *rtt = calloc((size_t)n_exec, sizeof(double));
    double *grtt = calloc((size_t)(n_gexec > 0 ? n_gexec : 1), sizeof(double));
    int n_rtt = 0, n_grtt = 0, n_route = 10 * n_exec;
    double *route = calloc((size_t)n_route, sizeof(double));
    if (status == 0 && s_create(id) == 0) {
        if (s_route_rtt(id, n_route, route))
            status = 1;
        for (int i = 0; i < 5; i++)
            (void)s_exec_true(id);
        for (; n_rtt < n_exec; n_rtt++) {
            double t0 = s_ms();
            if (s_exec_true(id)) {
                fprintf(stderr, "exec true failed (service layer)\n");
                status = 1;
                break;
            }
            rtt[n_rtt] = s_ms() - t0;
        }
        s_grpc_t g = {0};
        bool stuck = false;
        if (n_gexec <= 0) {
            /* not asked for */
        } else if (s_grpc_start(&g)) {
            fprintf(stderr, "gRPC server/client could not start\n");
            status = 1;
        } else {
            for (int i = 0; i < 5 && !stuck; i++)
                stuck = s_grpc_exec_true(&g, id) != 0;
            if (stuck) {
                fprintf(stderr, "gRPC exec failed during warm-up\n");
                status = 1;
            }
            for (; !stuck && n_grtt < n_gexec; n_grtt++) {
                double t0 = s_ms();
                if (s_grpc_exec_true(&g, id)) {
                    fprintf(stderr, "gRPC exec failed after %d runs\n", n_grtt);
                    stuck = true;
                    status = 1;
                    break;
                }
                grtt[n_grtt] = s_ms() - t0;
            }
        }
        s_grpc_stop(&g, stuck);
        if (s_delete(id))
            status = 1;
    } else {
        status = 1;
    }

    /* 3. concurrent creators */
    char(*rids)[KA_STORE_ID_LEN] = calloc((size_t)n_rate, KA_STORE_ID_LEN);
    s_creator_t *cr = calloc((size_t)n_threads, sizeof *cr);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    int rate_ok = 0;
    double rate_s = 0;
    if (status == 0) {
        double t0 = s_ms();
        for (int i = 0, off = 0; i < n_threads; i++) {
            cr[i].n = n_rate / n_threads + (i < n_rate % n_threads);
            cr[i].ids = rids + off;
            off += cr[i].n;
            pthread_create(&th[i], NULL, s_creator, &cr[i]);
        }
        for (int i = 0; i < n_threads; i++) {
            pthread_join(th[i], NULL);
            rate_ok += cr[i].ok;
        }
        rate_s = (s_ms() - t0) / 1000.0;
        for (int i = 0; i < n_rate; i++)
            if (rids[i][0] && s_delete(rids[i]))
                status = 1;
        if (rate_ok < n_rate) {
            fprintf(stderr, "only %d of %d concurrent creates reached READY\n", rate_ok, n_rate);
            status = 1;
        }
    }

    /* 4. idle sandboxes */
    char(*iids)[KA_STORE_ID_LEN] = calloc((size_t)n_idle, KA_STORE_ID_LEN);
    int idle_up = 0;
    double idle_avail = 0, idle_cg = 0, idle_rss = 0, idle_s = 0;
    if (status == 0) {
        s_drop_caches();
        long avail0 = s_meminfo_kb("/proc/meminfo", "MemAvailable");
        long rss0 = s_meminfo_kb("/proc/self/status", "VmRSS");
        long long cg0 = s_cgroup_mem();
        double t0 = s_ms();
        for (; idle_up < n_idle; idle_up++)
            if (s_create(iids[idle_up]))
                break;
        idle_s = (s_ms() - t0) / 1000.0;
        sleep(1);
        s_drop_caches();
        long avail1 = s_meminfo_kb("/proc/meminfo", "MemAvailable");
        long rss1 = s_meminfo_kb("/proc/self/status", "VmRSS");
        long long cg1 = s_cgroup_mem();
        if (idle_up > 0) {
            idle_avail = (double)(avail0 - avail1) * 1024.0 / idle_up;
            idle_rss = (double)(rss1 - rss0) * 1024.0 / idle_up;
            idle_cg = cg0 >= 0 && cg1 >= 0 ? (double)(cg1 - cg0) / idle_up : -1;
        }
        for (int i = 0; i < idle_up; i++)
            if (s_delete(iids[i]))
                status = 1;
        if (idle_up < n_idle) {
            fprintf(stderr, "only %d of %d idle sandboxes reached READY\n", idle_up, n_idle);
            status = 1;
        }
    }

    /* report */
    double c50 = s_pct(create, (size_t)created, 0.5), c99 = s_pct(create, (size_t)created, 0.99);
    double p50 = s_pct(peer, (size_t)n_peer, 0.5), p99 = s_pct(peer, (size_t)n_peer, 0.99);
    double r50 = s_pct(rtt, (size_t)n_rtt, 0.5), r99 = s_pct(rtt, (size_t)n_rtt, 0.99);
    double g50 = s_pct(grtt, (size_t)n_grtt, 0.5), g99 = s_pct(grtt, (size_t)n_grtt, 0.99);
    double u50 = s_pct(route, (size_t)n_route, 0.5) * 1000.0;
    double u99 = s_pct(route, (size_t)n_route, 0.99) * 1000.0;
    double cps = rate_s > 0 ? rate_ok / rate_s : 0;
    printf("| figure | value | peer |\n|---|---|---|\n");
    printf("| create -> READY p50 (service layer, %d creates) | %.2f ms | bwrap %.2f ms |\n",
           created, c50, p50);
    printf("| create -> READY p99 | %.2f ms | bwrap %.2f ms |\n", c99, p99);
    printf("| exec `true` round trip p50 / p99 (service layer, %d runs) | %.3f / %.3f ms | |\n",
           n_rtt, r50, r99);
    printf("| lifecycle call to a sandbox's actor p50 / p99 (unpause refused, %d calls) | %.1f / "
           "%.1f us | |\n",
           n_route, u50, u99);
    if (n_gexec > 0)
        printf("| exec `true` round trip p50 / p99 (gRPC loopback, C core client, %d runs) | %.3f "
               "/ %.3f ms | |\n",
               n_grtt, g50, g99);
    printf("| concurrent creates (%d threads, %d READY in %.2f s) | %.1f /s | |\n", n_threads,
           rate_ok, rate_s, cps);
    printf("| idle sandboxes created (sequential, %.2f s) | %d | |\n", idle_s, idle_up);
    printf("| idle host memory per sandbox: MemAvailable drop | %.0f B | |\n", idle_avail);
    printf("| idle host memory per sandbox: node cgroup usage | %.0f B | |\n", idle_cg);
    printf("| idle host memory per sandbox: this process's RSS growth | %.0f B | |\n", idle_rss);
    if (have_bwrap && created && n_peer) {
        printf("BENCH name=sandbox_create_ready_p50 value=%.2f unit=ms peer=bwrap "
               "peer_value=%.2f ratio=%.2f\n",
               c50, p50, p50 / c50);
        printf("BENCH name=sandbox_create_ready_p99 value=%.2f unit=ms peer=bwrap "
               "peer_value=%.2f ratio=%.2f\n",
               c99, p99, p99 / c99);
    } else {
        printf("BENCH name=sandbox_create_ready_p50 value=%.2f unit=ms\n", c50);
        printf("BENCH name=sandbox_create_ready_p99 value=%.2f unit=ms\n", c99);
    }
    printf("BENCH name=exec_roundtrip_p50 value=%.3f unit=ms\n", r50);
    printf("BENCH name=sandbox_call_p50 value=%.1f unit=us\n", u50);
    if (n_gexec > 0 && n_grtt == n_gexec)
        printf("BENCH name=exec_roundtrip_grpc_p50 value=%.3f unit=ms\n", g50);
    printf("BENCH name=sandbox_creates_per_s value=%.1f unit=1/s\n", cps);
    /* the headline memory figure: MemAvailable drop (sandboxes' processes, page tables,
     * overlay/tmpfs, kernel objects and the node's own growth together) */
    printf("BENCH name=idle_sandbox_host_bytes value=%.0f unit=B\n", idle_avail);
    printf("BENCH name=idle_sandbox_cgroup_bytes value=%.0f unit=B\n", idle_cg);
    printf("BENCH name=idle_sandbox_node_rss_bytes value=%.0f unit=B\n", idle_rss);
    free(create);
    free(peer);
    free(rtt);
    free(grtt);
    free(route);
    free(rids);
    free(cr);
    free(th);
    free(iids);
    s_teardown();
    return status;
}
