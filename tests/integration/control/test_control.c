/*
 * The control plane end to end, through the service layer the bridges call, on real parts:
 * a private PostgreSQL (tests/with-pg), the store, images, the namespaces driver with the real
 * static guest, the templates and sandboxes actors.
 *
 * Covers: template validation and Ready/Prepared, WorkerPoolNotFound, create idempotency (also
 * under concurrent duplicates and after delete), exec with output, files, ownership probes for
 * every operation, TTL expiry, suspend/resume keeping /data, recovery after a restart of
 * the sandboxes actor (a READY sandbox comes back SUSPENDED with its /data kept), and
 * supervision: the long-lived actors run under a one_for_one supervisor as in node/node.c,
 * found by registered name; a killed store, images or templates actor is restarted and the
 * control plane serves again with every record kept.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "images_actor.h"
#include "ka_namespaces.h"
#include "sandboxes.h"
#include "service.h"
#include "store.h"
#include "svc_frames.h"
#include "templates_actor.h"

#define NS      "kagent"
#define ALICE   "alice@example.com"
#define BOB     "bob@example.com"
#define TIMEOUT 60000

static struct {
    char dir[PATH_MAX];
    char tools_ref[1024];
    char guest_digest[80];
    krt_system_t *sys;
    krt_addr_t sup; /* the root supervisor of store, images, templates, sandboxes */
    ka_driver_t *driver;
    ka_service_t *svc;
    ka_templates_args_t targs;
    ka_sandboxes_args_t sargs;
} T;

/* ---- helpers ------------------------------------------------------------------------------ */

static void s_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void s_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static void s_images(int type, const char *arg, const char *name, ka_images_reply_t *out)
{
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    snprintf(req.arg, sizeof req.arg, "%s", arg);
    snprintf(req.name, sizeof req.name, "%s", name ? name : "");
    krt_reply_t r;
    assert_int_equal(
        krt_call(T.sys, krt_whereis(T.sys, KA_IMAGES_NAME), type, &req, sizeof req, TIMEOUT, &r),
        0);
    assert_int_equal(r.len, sizeof *out);
    memcpy(out, r.body, sizeof *out);
    krt_reply_free(&r);
    if (out->err)
        fail_msg("images request %d %s: %s", type, arg, out->message);
}

/* A call's outcome as the tests read it: its code and message ("" on success). */
typedef struct {
    int code;
    char message[KA_MSG_LEN];
} t_status_t;

/* A sandbox call's answer as the tests read it: its status, then the success reply's fields
 * (zero for a failure, which is an error reply: its message only). */
typedef struct {
    t_status_t status;
    ka_store_sandbox_t sandbox;
    uint8_t paused;
} t_reply_t;

/* Unary call; returns the code; copies a success reply (up to cap) into out, and the message
 * of an error reply into *st (may be NULL). */
static int s_call_st(uint32_t type, const void *body, size_t len, void *out, size_t cap,
                     t_status_t *st)
{
    krt_reply_t r;
    int code = ka_svc_call_sync(T.svc, type, body, len, TIMEOUT, &r);
    if (st) {
        memset(st, 0, sizeof *st);
        st->code = code;
        if (code != KA_OK && r.body) {
            assert_int_equal(r.type, KRT_MSG_ERROR); /* an error reply: the message only */
            assert_int_equal(ka_err_code(r.status), code);
            assert_int_equal(r.len, strlen(r.body) + 1);
            snprintf(st->message, sizeof st->message, "%s", (const char *)r.body);
        }
    }
    if (code == KA_OK && r.body && out)
        memcpy(out, r.body, r.len < cap ? r.len : cap);
    krt_reply_free(&r);
    return code;
}

static int s_call(uint32_t type, const void *body, size_t len, void *out, size_t cap)
{
    return s_call_st(type, body, len, out, cap, NULL);
}

/* A call answered with a sandbox (ka_sbx_reply_t), into *out. */
static int s_call_sandbox(uint32_t type, const void *body, size_t len, t_reply_t *out)
{
    ka_sbx_reply_t r;
    memset(&r, 0, sizeof r);
    memset(out, 0, sizeof *out);
    int code = s_call_st(type, body, len, &r, sizeof r, &out->status);
    out->sandbox = r.sandbox;
    out->paused = r.paused;
    return code;
}

/* Waits until the control plane serves a list again (a restarted or reconnecting store
 * answers UNAVAILABLE until its connection is up). */
static void s_wait_serving(void)
{
    ka_sbx_list_req_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.caller, sizeof q.caller, ALICE);
    ka_sbx_list_t l;
    int code = KA_UNAVAILABLE;
    for (int i = 0; i < 300 && code == KA_UNAVAILABLE; i++) {
        code = s_call(KA_SBX_LIST, &q, sizeof q, &l, sizeof l);
        if (code == KA_UNAVAILABLE)
            usleep(100 * 1000);
    }
    assert_int_equal(code, KA_OK);
}

static char *s_template_yaml(const char *name, const char *image, const char *pool)
{
    char *y = NULL;
    int n = asprintf(&y,
                     "apiVersion: api.kagent.dev/v1alpha3\nkind: SandboxTemplate\n"
                     "metadata:\n  name: %s\n  namespace: " NS "\n"
                     "spec:\n  workload:\n    image: %s\n"
                     "  env:\n    - name: GREETING\n      value: hello-from-template\n"
                     "  substrate:\n    workerPoolRef:\n      name: %s\n"
                     "    snapshotPolicy:\n      location: file://%s/snapshots/\n",
                     name, image, pool, T.dir);
    assert_true(n > 0);
    return y;
}

static int s_apply(const char *yaml, t_status_t *st)
{
    size_t yl = strlen(yaml);
    ka_tpl_apply_t *a = calloc(1, sizeof *a + yl + 1);
    snprintf(a->default_namespace, sizeof a->default_namespace, "default");
    a->yaml_len = (uint32_t)yl;
    memcpy(a->yaml, yaml, yl + 1);
    int code = s_call_st(KA_TPL_APPLY, a, sizeof *a + yl + 1, NULL, 0, st);
    free(a);
    return code;
}

/* The template's status JSON (caller frees), or NULL. */
static char *s_template_status(const char *name)
{
    ka_tpl_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.namespace_, sizeof k.namespace_, NS);
    snprintf(k.name, sizeof k.name, "%s", name);
    krt_reply_t r;
    if (ka_svc_call_sync(T.svc, KA_TPL_GET, &k, sizeof k, TIMEOUT, &r) != KA_OK) {
        krt_reply_free(&r);
        return NULL;
    }
    const ka_tpl_reply_t *tr = r.body;
    const ka_store_template_t *t =
        ka_store_blob_next(&tr->blob, r.len - offsetof(ka_tpl_reply_t, blob), NULL);
    char *s = t ? strdup(ka_store_template_status(t)) : NULL;
    krt_reply_free(&r);
    return s;
}

/* The Ready condition's field (reason, status, message) of a status JSON, or "". */
static const char *s_ready(const char *status_json, const char *field, char *out, size_t cap)
{
    json_t *st = status_json ? json_loads(status_json, 0, NULL) : NULL;
    json_t *c = json_array_get(json_object_get(st, "conditions"), 0);
    snprintf(out, cap, "%s", json_string_value(json_object_get(c, field)) ?: "");
    json_decref(st);
    return out;
}

static void s_wait_reason(const char *name, const char *reason)
{
    char got[256];
    for (int i = 0; i < 600; i++) {
        char *st = s_template_status(name);
        bool ok = strcmp(s_ready(st, "reason", got, sizeof got), reason) == 0;
        free(st);
        if (ok)
            return;
        usleep(50 * 1000);
    }
    char *st = s_template_status(name);
    fail_msg("template %s never reached %s: %s", name, reason, st ? st : "(none)");
}

static int s_create(const char *caller, const char *req_id, const char *tmpl, int64_t ttl_ms,
                    t_reply_t *out)
{
    ka_sbx_create_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.caller, sizeof c.caller, "%s", caller);
    snprintf(c.request_id, sizeof c.request_id, "%s", req_id);
    snprintf(c.template_namespace, sizeof c.template_namespace, NS);
    snprintf(c.template_name, sizeof c.template_name, "%s", tmpl);
    c.ttl_ms = ttl_ms;
    return s_call_sandbox(KA_SBX_CREATE, &c, sizeof c, out);
}

static int s_lifecycle(uint32_t type, const char *caller, const char *id, t_reply_t *out)
{
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.caller, sizeof k.caller, "%s", caller);
    snprintf(k.id, sizeof k.id, "%s", id);
    return s_call_sandbox(type, &k, sizeof k, out);
}

/* A collected guest stream. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    ka_guest_reply_t final; /* its header */
    ka_frame_end_t end;     /* its outcome */
    char out[65536];
    size_t out_len;
    char err[4096];
    size_t err_len;
} s_frames_t;

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_frames_t *c = user;
    pthread_mutex_lock(&c->lock);
    if (f->final) {
        c->final = *f;
        ka_frame_end(&c->end, f, len);
        c->done = true;
        pthread_cond_signal(&c->cond);
    } else if (f->stream == KA_STREAM_STDERR) {
        size_t n = f->tail_len < sizeof c->err - c->err_len ? f->tail_len : 0;
        memcpy(c->err + c->err_len, f->tail, n);
        c->err_len += n;
    } else {
        size_t n = f->tail_len < sizeof c->out - c->out_len ? f->tail_len : 0;
        memcpy(c->out + c->out_len, f->tail, n);
        c->out_len += n;
    }
    pthread_mutex_unlock(&c->lock);
}

/* Runs one guest call to its final frame; returns the final status code. */
static int s_guest(ka_guest_req_t *q, s_frames_t *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    krt_addr_t stream;
    int op = q->op;
    assert_int_equal(ka_svc_stream(T.svc, &q, s_on_frame, c, &stream), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&c->lock);
    while (!c->done)
        if (pthread_cond_timedwait(&c->cond, &c->lock, &until)) {
            /* for the post-mortem: who holds what (mailboxes, guest calls in flight) */
            char *tree = krt_tree_json(T.sys, KRT_ADDR_NONE);
            fprintf(stderr, "actor tree at the timeout: %s\n", tree ? tree : "(none)");
            free(tree);
            fail_msg("guest call (op %d) timed out", op);
        }
    pthread_mutex_unlock(&c->lock);
    return ka_err_code(c->end.err);
}

/* Starts argv (NULL-terminated) in sandbox id as caller; returns the code, proc in *proc. */
static int s_start(const char *caller, const char *id, const char *const *argv, uint64_t *proc)
{
    size_t tail = 0, n = 0;
    for (; argv[n]; n++)
        tail += strlen(argv[n]) + 1;
    ka_guest_req_t *q = ka_guest_req_new(caller, id, KA_GUEST_START, tail);
    q->n_argv = (uint32_t)n;
    char *p = q->tail;
    for (size_t i = 0; i < n; i++)
        p = stpcpy(p, argv[i]) + 1;
    s_frames_t c;
    int code = s_guest(q, &c);
    if (proc)
        *proc = c.final.process.proc;
    return code;
}

/* Follows the output of proc to its exit; returns its exit code (or -1000 - status code). */
static int s_follow(const char *caller, const char *id, uint64_t proc, s_frames_t *c)
{
    ka_guest_req_t *q = ka_guest_req_new(caller, id, KA_GUEST_OUTPUT, 0);
    q->proc = proc;
    q->follow = 1;
    int code = s_guest(q, c);
    if (code)
        return -1000 - code;
    assert_true(c->final.has_process);
    return c->final.process.exit_code;
}

/* Runs argv to its exit in one guest round trip (START with follow: the process, its output,
 * its exit); returns its exit code (or -1000 - status code). */
static int s_exec(const char *id, const char *const *argv, s_frames_t *c)
{
    size_t tail = 0, n = 0;
    for (; argv[n]; n++)
        tail += strlen(argv[n]) + 1;
    ka_guest_req_t *q = ka_guest_req_new(ALICE, id, KA_GUEST_START, tail);
    q->n_argv = (uint32_t)n;
    q->follow = 1;
    char *p = q->tail;
    for (size_t i = 0; i < n; i++)
        p = stpcpy(p, argv[i]) + 1;
    int code = s_guest(q, c);
    if (code)
        return -1000 - code;
    assert_true(c->final.has_process);
    assert_int_equal(c->final.process.state, 2); /* exited */
    return c->final.process.exit_code;
}

/* ---- setup -------------------------------------------------------------------------------- */

static void s_build_images(void)
{
    char rootfs[PATH_MAX + 16], guestfs[PATH_MAX + 16];
    snprintf(rootfs, sizeof rootfs, "%s/tools-rootfs", T.dir);
    snprintf(guestfs, sizeof guestfs, "%s/guest-rootfs", T.dir);
    s_sh("mkdir -p %s/bin %s/etc %s/data %s/run/kagent && cp /bin/busybox %s/bin/busybox && "
         "%s/bin/busybox --install -s %s/bin && ln -sf busybox %s/bin/sh",
         rootfs, rootfs, rootfs, guestfs, rootfs, rootfs, rootfs, rootfs);
    s_sh("for b in %s/bin/*; do [ -L \"$b\" ] && ln -sf busybox \"$b\"; done", rootfs);
    const char *build = getenv("KAGENT_BUILD_DIR");
    assert_non_null(build);
    s_sh("cp %s/actors/guest/kagent-sandbox-guest %s/run/kagent/guest", build, guestfs);
    ka_images_reply_t r;
    s_images(KA_IMAGES_BUILD, rootfs, "test/tools", &r);
    snprintf(T.tools_ref, sizeof T.tools_ref, "%s", r.ref);
    s_images(KA_IMAGES_BUILD, guestfs, "test/guest", &r);
    snprintf(T.guest_digest, sizeof T.guest_digest, "%s", r.digest);
}

static void s_start_driver(void)
{
    ka_images_reply_t r;
    s_images(KA_IMAGES_PREPARE, T.guest_digest, NULL, &r);
    char guest[PATH_MAX + 32], state[PATH_MAX + 16];
    snprintf(guest, sizeof guest, "%s/run/kagent/guest", r.path);
    snprintf(state, sizeof state, "%s/sandboxes", T.dir);
    ka_ns_opts_t o = {.uid_base = 100000000, /* this test's own host uids (tests/lib/uids.sh) */
                      .state_dir = state,
                      .guest_path = guest,
                      .cpu_millis = 1000,
                      .mem_bytes = 256u << 20,
                      .pids_max = 128,
                      .cgroup_name = "kagent-test-control"};
    int err = 0;
    T.driver = ka_namespaces_new(&o, &err);
    if (!T.driver)
        fail_msg("namespaces driver: %s", strerror(-err));
}

/* Starts a supervised child registered under name, as node/node.c does. */
static void s_child(const char *name, const krt_behaviour_t *b, void *arg)
{
    krt_child_spec_t c = {name, b, arg, KRT_PERMANENT, true};
    assert_int_equal(krt_supervisor_start_child(T.sys, T.sup, &c, NULL), 0);
}

/* Kills the actor registered as name and waits for its restart (a new address, same name). */
static void s_kill_and_wait_restart(const char *name)
{
    krt_addr_t old = krt_whereis(T.sys, name);
    assert_int_not_equal(old, KRT_ADDR_NONE);
    assert_int_equal(krt_system_kill(T.sys, old, KRT_EXIT_KILLED), 0);
    assert_int_not_equal(krt_system_wait(T.sys, old, 10000), KRT_ETIMEDOUT);
    krt_addr_t now = KRT_ADDR_NONE;
    for (int i = 0; i < 1000 && (now == KRT_ADDR_NONE || now == old); i++, usleep(1000))
        now = krt_whereis(T.sys, name);
    assert_true(now != KRT_ADDR_NONE && now != old);
}

static int s_setup(void **state)
{
    snprintf(T.dir, sizeof T.dir, "/tmp/kagent-control.XXXXXX");
    assert_non_null(mkdtemp(T.dir));
    chmod(T.dir, 0755);
    krt_config_t cfg = {.node_id = 1, .name = "node-test"};
    T.sys = krt_system_new(&cfg);
    assert_non_null(T.sys);
    assert_int_equal(krt_system_start(T.sys), 0);
    krt_sup_spec_t spec = {KRT_ONE_FOR_ONE, 5, 30000, NULL, 0}; /* as node/node.c */
    assert_int_equal(krt_supervisor_spawn(T.sys, NULL, &spec, NULL, &T.sup), 0);
    static ka_store_args_t store_args = {.conninfo = ""};
    s_child(KA_STORE_NAME, &ka_store_behaviour, &store_args);
    static ka_images_actor_args_t ia; /* given to init again at each restart */
    ia.state_dir = T.dir;
    s_child(KA_IMAGES_NAME, &ka_images_behaviour, &ia);
    s_build_images();
    s_start_driver();
    T.targs.store = KA_STORE_NAME;
    T.targs.images = KA_IMAGES_NAME;
    ka_policy_t *p = &T.targs.policy;
    snprintf(p->guest_image_digest, sizeof p->guest_image_digest, "%s", T.guest_digest);
    p->cpu_millis = 1000;
    p->memory_bytes = 256 << 20;
    p->default_ttl_ms = 3600000;
    p->max_ttl_ms = 86400000;
    snprintf(p->pools[0].name, sizeof p->pools[0].name, "kagent-default");
    snprintf(p->pools[0].klass, sizeof p->pools[0].klass, "namespaces");
    p->n_pools = 1;
    s_child(KA_TEMPLATES_NAME, &ka_templates_behaviour, &T.targs);
    T.sargs = (ka_sandboxes_args_t){.store = KA_STORE_NAME,
                                    .templates = KA_TEMPLATES_NAME,
                                    .driver = T.driver,
                                    .node = "node-test",
                                    .default_ttl_ms = 3600000,
                                    .max_ttl_ms = 86400000};
    s_child(KA_SANDBOXES_NAME, &ka_sandboxes_behaviour, &T.sargs);
    T.svc = ka_service_new(T.sys, KA_TEMPLATES_NAME, KA_SANDBOXES_NAME);
    return 0;
}

static int s_teardown(void **state)
{
    ka_service_destroy(&T.svc);
    krt_system_destroy(&T.sys);
    ka_driver_destroy(&T.driver);
    s_sh("rm -rf %s", T.dir);
    return 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_template_validation_and_ready(void **unused)
{
    t_status_t st;
    char *bad = s_template_yaml("tagged", "registry.example.com/tools:1.0", "kagent-default");
    assert_int_equal(s_apply(bad, &st), KA_INVALID_ARGUMENT);
    assert_non_null(strstr(st.message, "spec.workload.image: Invalid value"));
    free(bad);
    char *nopool = s_template_yaml("nopool", T.tools_ref, "no-such-pool");
    assert_int_equal(s_apply(nopool, &st), KA_OK);
    s_wait_reason("nopool", "WorkerPoolNotFound");
    free(nopool);
    char *good = s_template_yaml("scratch", T.tools_ref, "kagent-default");
    assert_int_equal(s_apply(good, &st), KA_OK);
    s_wait_reason("scratch", "Prepared");
    char *status = s_template_status("scratch");
    char v[256];
    assert_string_equal(s_ready(status, "status", v, sizeof v), "True");
    assert_string_equal(s_ready(status, "message", v, sizeof v), KA_READY_PREPARED_MSG);
    free(status);
    /* applying the same document again keeps it Ready (same revision) */
    assert_int_equal(s_apply(good, &st), KA_OK);
    s_wait_reason("scratch", "Prepared");
    free(good);
    /* a template whose image cannot be prepared fails, with the reference's message */
    char *missing = s_template_yaml(
        "missing",
        "registry.example.com/"
        "none@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        "kagent-default");
    assert_int_equal(s_apply(missing, &st), KA_OK);
    s_wait_reason("missing", "PreparationFailed");
    free(missing);
    t_reply_t r;
    assert_int_equal(s_create(ALICE, "on-missing", "missing", 0, &r), KA_UNAVAILABLE);
    assert_string_equal(r.status.message, KA_MSG_NO_RUNTIME);
    assert_int_equal(s_create(ALICE, "on-absent", "absent", 0, &r), KA_NOT_FOUND);
}

static void test_create_exec_files_delete(void **unused)
{
    t_reply_t r, again;
    assert_int_equal(s_create(ALICE, "req-exec", "scratch", 0, &r), KA_OK);
    assert_int_equal(r.sandbox.state, KA_STATE_READY);
    assert_int_equal(r.sandbox.operation, KA_OP_NONE);
    assert_int_equal(ka_check_uuid(r.sandbox.id), 0);
    assert_string_equal(r.sandbox.creator, ALICE);
    int64_t ttl = r.sandbox.expires_ms - r.sandbox.created_ms;
    assert_true(ttl == 3600000);
    /* idempotent: same request id, same sandbox, lifetime not extended */
    assert_int_equal(s_create(ALICE, "req-exec", "scratch", 0, &again), KA_OK);
    assert_string_equal(again.sandbox.id, r.sandbox.id);
    assert_int_equal(again.sandbox.expires_ms, r.sandbox.expires_ms);
    const char *id = r.sandbox.id;

    s_frames_t c;
    const char *echo[] = {"sh", "-c", "echo \"$GREETING\"; echo oops >&2; pwd; id -u; exit 3",
                          NULL};
    assert_int_equal(s_exec(id, echo, &c), 3);
    c.out[c.out_len] = '\0';
    assert_string_equal(c.out, "hello-from-template\n/data/workspace\n65532\n");
    assert_int_equal(c.err_len, 5);
    /* the same in two round trips: START, then OUTPUT with follow */
    uint64_t proc = 0;
    assert_int_equal(s_start(ALICE, id, echo, &proc), KA_OK);
    assert_int_equal(s_follow(ALICE, id, proc, &c), 3);
    c.out[c.out_len] = '\0';
    assert_string_equal(c.out, "hello-from-template\n/data/workspace\n65532\n");

    ka_guest_req_t *w = ka_guest_req_new(ALICE, id, KA_GUEST_WRITE, 6);
    snprintf(w->path, sizeof w->path, "notes/a.txt");
    w->mode = 0644;
    memcpy(w->tail, "abcdef", 6);
    assert_int_equal(s_guest(w, &c), KA_OK);
    assert_int_equal(c.final.written, 6);
    ka_guest_req_t *rd = ka_guest_req_new(ALICE, id, KA_GUEST_READ, 0);
    snprintf(rd->path, sizeof rd->path, "notes/a.txt");
    assert_int_equal(s_guest(rd, &c), KA_OK);
    assert_int_equal(c.out_len, 6);
    assert_memory_equal(c.out, "abcdef", 6);
    rd = ka_guest_req_new(ALICE, id, KA_GUEST_READ, 0);
    snprintf(rd->path, sizeof rd->path, "missing.txt");
    assert_int_equal(s_guest(rd, &c), KA_NOT_FOUND);

    t_reply_t del;
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &del), KA_OK);
    assert_int_equal(del.sandbox.state, KA_STATE_DELETED);
    /* guest calls now refused; delete again is the tombstone; replaying the create does not
     * recreate it */
    const char *t[] = {"true", NULL};
    assert_int_equal(s_start(ALICE, id, t, NULL), KA_FAILED_PRECONDITION);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &del), KA_OK);
    assert_int_equal(del.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(s_create(ALICE, "req-exec", "scratch", 0, &again), KA_OK);
    assert_string_equal(again.sandbox.id, id);
    assert_int_equal(again.sandbox.state, KA_STATE_DELETED);
}

static void test_ownership_probes(void **unused)
{
    t_reply_t r, o;
    assert_int_equal(s_create(ALICE, "req-own", "scratch", 0, &r), KA_OK);
    const char *id = r.sandbox.id;
    assert_int_equal(s_lifecycle(KA_SBX_GET, BOB, id, &o), KA_NOT_FOUND);
    assert_int_equal(s_lifecycle(KA_SBX_SUSPEND, BOB, id, &o), KA_NOT_FOUND);
    assert_int_equal(s_lifecycle(KA_SBX_RESUME, BOB, id, &o), KA_NOT_FOUND);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, BOB, id, &o), KA_NOT_FOUND);
    assert_string_equal(o.status.message, KA_MSG_NOT_FOUND);
    const char *t[] = {"true", NULL};
    assert_int_equal(s_start(BOB, id, t, NULL), KA_NOT_FOUND);
    s_frames_t c;
    ka_guest_req_t *rd = ka_guest_req_new(BOB, id, KA_GUEST_READ, 0);
    snprintf(rd->path, sizeof rd->path, "x");
    assert_int_equal(s_guest(rd, &c), KA_NOT_FOUND);
    /* the same request id from another identity is another sandbox */
    assert_int_equal(s_create(BOB, "req-own", "scratch", 0, &o), KA_OK);
    assert_string_not_equal(o.sandbox.id, id);
    ka_sbx_list_req_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.caller, sizeof q.caller, BOB);
    struct {
        ka_sbx_list_t l;
        ka_store_sandbox_t items[KA_STORE_LIST_MAX];
    } list;
    assert_int_equal(s_call(KA_SBX_LIST, &q, sizeof q, &list, sizeof list), KA_OK);
    for (uint32_t i = 0; i < list.l.count; i++)
        assert_string_equal(list.l.items[i].creator, BOB);
    assert_int_equal(s_lifecycle(KA_SBX_GET, ALICE, "not-a-uuid", &o), KA_INVALID_ARGUMENT);
    assert_string_equal(o.status.message, KA_MSG_NOT_UUID);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

typedef struct {
    int code;
    int state;
    char id[KA_STORE_ID_LEN];
} s_dup_t;

static void *s_dup_create(void *arg)
{
    s_dup_t *d = arg;
    t_reply_t r;
    d->code = s_create(ALICE, "req-dup", "scratch", 0, &r);
    d->state = r.sandbox.state;
    snprintf(d->id, sizeof d->id, "%s", r.sandbox.id);
    return NULL;
}

static void test_concurrent_duplicates_one_sandbox(void **unused)
{
    enum { N = 100 };
    pthread_t th[N];
    s_dup_t d[N];
    for (int i = 0; i < N; i++)
        pthread_create(&th[i], NULL, s_dup_create, &d[i]);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) { /* the duplicates get the create's own answer: READY */
        assert_int_equal(d[i].code, KA_OK);
        assert_string_equal(d[i].id, d[0].id);
        assert_int_equal(d[i].state, KA_STATE_READY);
    }
    t_reply_t o;
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, d[0].id, &o), KA_OK);
}

/* Guest calls sent back to back while their sandbox is deleted: each one is answered, by the
 * guest (the sandbox was still live) or refused as not ready (deleting or deleted), never lost
 * or answered UNAVAILABLE when it reaches the sandbox's actor as it retires. */
enum { RACE_MAX = 3000 };

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char id[KA_STORE_ID_LEN];
    bool stop;
    int sent, answered;
    int codes[RACE_MAX];
} s_race_t;

typedef struct {
    s_race_t *race;
    int i;
} s_race_call_t;

static void s_race_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_race_call_t *c = user;
    if (!f->final)
        return;
    pthread_mutex_lock(&c->race->lock);
    c->race->codes[c->i] = ka_err_code(f->err);
    c->race->answered++;
    pthread_cond_broadcast(&c->race->cond);
    pthread_mutex_unlock(&c->race->lock);
}

static void *s_race_sender(void *arg)
{
    s_race_t *r = arg;
    s_race_call_t *calls = calloc(RACE_MAX, sizeof *calls);
    for (int i = 0; i < RACE_MAX; i++) {
        pthread_mutex_lock(&r->lock);
        bool stop = r->stop;
        pthread_mutex_unlock(&r->lock);
        if (stop)
            break;
        ka_guest_req_t *q = ka_guest_req_new(ALICE, r->id, KA_GUEST_GET, 0);
        q->proc = 999999; /* no such process: the guest answers NOT_FOUND */
        calls[i] = (s_race_call_t){r, i};
        r->codes[i] = -1;
        assert_int_equal(ka_svc_stream(T.svc, &q, s_race_frame, &calls[i], NULL), 0);
        pthread_mutex_lock(&r->lock);
        r->sent++;
        pthread_mutex_unlock(&r->lock);
        if (i % 8 == 7)
            usleep(200);
    }
    return calls;
}

static void test_guest_calls_racing_delete_are_answered(void **unused)
{
    for (int round = 0; round < 10; round++) {
        t_reply_t r, o;
        char req[64];
        snprintf(req, sizeof req, "req-race-%d", round);
        assert_int_equal(s_create(ALICE, req, "scratch", 0, &r), KA_OK);
        s_race_t *race = calloc(1, sizeof *race);
        pthread_mutex_init(&race->lock, NULL);
        pthread_cond_init(&race->cond, NULL);
        snprintf(race->id, sizeof race->id, "%s", r.sandbox.id);
        pthread_t th;
        pthread_create(&th, NULL, s_race_sender, race);
        usleep(20 * 1000);
        assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, race->id, &o), KA_OK);
        usleep(30 * 1000);
        pthread_mutex_lock(&race->lock);
        race->stop = true;
        pthread_mutex_unlock(&race->lock);
        void *calls;
        pthread_join(th, &calls);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 30;
        pthread_mutex_lock(&race->lock);
        while (race->answered < race->sent)
            if (pthread_cond_timedwait(&race->cond, &race->lock, &until))
                break;
        int sent = race->sent, answered = race->answered;
        pthread_mutex_unlock(&race->lock);
        int live = 0, refused = 0;
        for (int i = 0; i < sent; i++) {
            if (race->codes[i] == KA_NOT_FOUND)
                live++;
            else if (race->codes[i] == KA_FAILED_PRECONDITION ||
                     race->codes[i] == KA_RESOURCE_EXHAUSTED) /* more in flight than allowed */
                refused++;
            else
                fail_msg("round %d: guest call %d of %d racing the delete: code %d (answered "
                         "%d)",
                         round, i, sent, race->codes[i], answered);
        }
        fprintf(stderr, "race round %d: %d calls, %d answered by the guest, %d refused\n", round,
                sent, live, refused);
        assert_int_equal(answered, sent);
        assert_true(refused > 0); /* the race was run: some calls came after the delete */
        assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, race->id, &o), KA_OK);
        assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
        free(calls);
        free(race);
    }
}

/* psql against the test's PostgreSQL (tests/with-pg exports PGHOST, PGPORT, PGUSER...). */
static void s_psql(const char *sql)
{
    s_sh("psql -v ON_ERROR_STOP=1 -Atqc \"%s\" >/dev/null", sql);
}

static void *s_pg_restart_later(void *arg)
{
    usleep(1000 * 1000); /* the held write is in its trigger's sleep by now */
    const char *base = getenv("PG_BASE");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s\"$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/pg_ctl\" -D '%s/data'"
             " restart -m immediate -w -t 30 >/dev/null",
             geteuid() == 0 ? "runuser -u postgres -- " : "", base);
    *(int *)arg = system(cmd);
    return NULL;
}

/* The first update of a sandbox row matching `when` (SQL over OLD and NEW) sleeps 3 s in the
 * database, and 1 s in PostgreSQL restarts (immediate: a crash), cutting that write off as a
 * restart would. Returns the restarting thread, for s_pg_unhold. */
static pthread_t s_pg_hold_and_restart(const char *when, int *restarted)
{
    if (!getenv("PG_BASE"))
        fail_msg("PG_BASE not set: run under tests/with-pg");
    char sql[2048];
    snprintf(sql, sizeof sql,
             "CREATE SEQUENCE ka_test_hold;"
             "CREATE FUNCTION ka_test_hold() RETURNS trigger LANGUAGE plpgsql AS \\$\\$ BEGIN"
             " IF %s THEN IF nextval('ka_test_hold') = 1 THEN PERFORM pg_sleep(3); END IF;"
             " END IF; RETURN NEW; END \\$\\$;"
             "CREATE TRIGGER ka_test_hold BEFORE UPDATE ON ka_sandboxes FOR EACH ROW"
             " EXECUTE FUNCTION ka_test_hold();",
             when);
    s_psql(sql);
    *restarted = -1;
    pthread_t th;
    pthread_create(&th, NULL, s_pg_restart_later, restarted);
    return th;
}

static void s_pg_unhold(pthread_t th, const int *restarted)
{
    pthread_join(th, NULL);
    assert_int_equal(*restarted, 0);
    s_psql("DROP TRIGGER ka_test_hold ON ka_sandboxes; DROP FUNCTION ka_test_hold();"
           "DROP SEQUENCE ka_test_hold;");
    s_wait_serving(); /* the store reconnects by itself (backing off up to 2 s) */
}

/* PostgreSQL restarts while a create's READY write is in flight (the record committed, the
 * guest runs): the create still ends READY, in its answer and in the store, and a replay of
 * its request id says READY too, never CREATING for good. */
static void test_create_survives_pg_restart_at_ready(void **unused)
{
    int restarted;
    pthread_t th = s_pg_hold_and_restart(
        "NEW.state = 'RUNTIME_STATE_READY' AND OLD.state <> NEW.state", &restarted);
    t_reply_t r, o;
    int code = s_create(ALICE, "req-pg-restart", "scratch", 0, &r);
    s_pg_unhold(th, &restarted);
    assert_int_equal(code, KA_OK);
    assert_int_equal(r.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_lifecycle(KA_SBX_GET, ALICE, r.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_create(ALICE, "req-pg-restart", "scratch", 0, &o), KA_OK);
    assert_string_equal(o.sandbox.id, r.sandbox.id);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    s_frames_t c;
    const char *t[] = {"true", NULL};
    assert_int_equal(s_exec(r.sandbox.id, t, &c), 0);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, r.sandbox.id, &o), KA_OK);
}

/* PostgreSQL restarts while a suspend's intent is written: the suspend is refused as
 * retryable, and the sandbox stays READY and usable (guest calls, a later suspend). */
static void test_lost_suspend_intent_keeps_sandbox_usable(void **unused)
{
    t_reply_t r, o;
    assert_int_equal(s_create(ALICE, "req-pg-intent", "scratch", 0, &r), KA_OK);
    int restarted;
    pthread_t th = s_pg_hold_and_restart("NEW.operation = 'RUNTIME_OPERATION_SUSPEND'", &restarted);
    int code = s_lifecycle(KA_SBX_SUSPEND, ALICE, r.sandbox.id, &o);
    s_pg_unhold(th, &restarted);
    assert_int_equal(code, KA_UNAVAILABLE);
    assert_non_null(strstr(o.status.message, "retry"));
    s_frames_t c;
    const char *t[] = {"true", NULL};
    assert_int_equal(s_exec(r.sandbox.id, t, &c), 0);
    assert_int_equal(s_lifecycle(KA_SBX_SUSPEND, ALICE, r.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, r.sandbox.id, &o), KA_OK);
}

static void test_ttl_expiry_deletes(void **unused)
{
    t_reply_t r, o;
    assert_int_equal(s_create(ALICE, "req-ttl", "scratch", 0, &r), KA_OK);
    assert_int_equal(s_create(ALICE, "req-ttl-short", "scratch", 999, &o), KA_INVALID_ARGUMENT);
    assert_int_equal(s_create(ALICE, "req-ttl-1s", "scratch", 1000, &r), KA_OK);
    assert_int_equal(r.sandbox.expires_ms - r.sandbox.created_ms, 1000);
    for (int i = 0; i < 100; i++) {
        s_lifecycle(KA_SBX_GET, ALICE, r.sandbox.id, &o);
        if (o.sandbox.state == KA_STATE_DELETED)
            break;
        usleep(50 * 1000);
    }
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    int64_t late = o.sandbox.deleted_ms - o.sandbox.expires_ms;
    assert_true(late >= 0 && late < 2000);
}

static void test_suspend_resume_keeps_data(void **unused)
{
    t_reply_t r, o;
    assert_int_equal(s_create(ALICE, "req-suspend", "scratch", 0, &r), KA_OK);
    const char *id = r.sandbox.id;
    s_frames_t c;
    const char *mk[] = {"sh", "-c", "echo kept > /data/workspace/k.txt; echo lost > /tmp/l.txt",
                        NULL};
    assert_int_equal(s_exec(id, mk, &c), 0);
    assert_int_equal(s_lifecycle(KA_SBX_RESUME, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_int_equal(s_lifecycle(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    const char *t[] = {"true", NULL};
    assert_int_equal(s_start(ALICE, id, t, NULL), KA_FAILED_PRECONDITION);
    assert_int_equal(s_lifecycle(KA_SBX_RESUME, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(o.sandbox.expires_ms, r.sandbox.expires_ms); /* resume never extends */
    const char *cat[] = {
        "sh", "-c", "cat /data/workspace/k.txt; cat /tmp/l.txt 2>/dev/null || echo gone", NULL};
    assert_int_equal(s_exec(id, cat, &c), 0);
    c.out[c.out_len] = '\0';
    assert_string_equal(c.out, "kept\ngone\n");
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* A swapper in the sandbox turns /data/workspace/d into a symlink to a host directory and back,
 * and files into fifos, as fast as it can. */
static const char S_SWAPPER[] =
    "cd /data/workspace && (setsid sh -c 'while :; do mkdir -p d.x; echo plain > d.x/f; "
    "mv d.x d; mv d d.x; ln -s %s d; rm -f d.x/f; mkfifo d.x/f; mkfifo p.$$; rm -f d; "
    "mv p.$$ q 2>/dev/null; done' </dev/null >/dev/null 2>&1 &); sleep 0.3; echo started";

static void s_start_swapper(const char *id, const char *host_dir)
{
    char script[1024];
    snprintf(script, sizeof script, S_SWAPPER, host_dir);
    const char *sh[] = {"sh", "-c", script, NULL};
    s_frames_t c;
    assert_int_equal(s_exec(id, sh, &c), 0);
    c.out[c.out_len] = '\0';
    assert_string_equal(c.out, "started\n");
}

/* Suspend and delete of a sandbox that races its /data against the copy: nothing from outside
 * its /data ever appears in it, nothing of the host is touched, and every job ends. */
static void test_suspend_delete_under_attack(void **unused)
{
    char host_dir[PATH_MAX + 16];
    snprintf(host_dir, sizeof host_dir, "%s/host-secret-dir", T.dir);
    s_sh("mkdir -p %s && echo top-secret-host-data > %s/secret.txt && chmod 600 %s/secret.txt",
         host_dir, host_dir, host_dir);
    t_reply_t r, o;
    assert_int_equal(s_create(ALICE, "req-attack", "scratch", 0, &r), KA_OK);
    const char *id = r.sandbox.id;
    for (int round = 0; round < 5; round++) {
        s_start_swapper(id, host_dir);
        int64_t t0 = krt_mono_ms();
        assert_int_equal(s_lifecycle(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
        assert_true(krt_mono_ms() - t0 < 10000); /* a fifo never holds the job */
        assert_int_equal(s_lifecycle(KA_SBX_RESUME, ALICE, id, &o), KA_OK);
        const char *grep[] = {"sh", "-c",
                              "grep -rqs top-secret /data && echo LEAK; ls /data/workspace | wc -l",
                              NULL};
        s_frames_t c;
        assert_int_equal(s_exec(id, grep, &c), 0);
        c.out[c.out_len] = '\0';
        assert_null(strstr(c.out, "LEAK"));
        assert_true(atoi(c.out) >= 1); /* the swapper's entries came back (links as links) */
    }
    s_start_swapper(id, host_dir);
    int64_t t0 = krt_mono_ms();
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_true(krt_mono_ms() - t0 < 10000);
    char secret[PATH_MAX + 32];
    snprintf(secret, sizeof secret, "%s/secret.txt", host_dir);
    assert_int_equal(access(secret, F_OK), 0); /* the host's file survived the delete */
}

/* A guest call in flight when its sandbox is suspended ends (its process stops with the
 * compute): the follower is told, it does not wait forever. */
static void test_suspend_ends_open_guest_calls(void **unused)
{
    t_reply_t r, o;
    assert_int_equal(s_create(ALICE, "req-suspend-open", "scratch", 0, &r), KA_OK);
    const char *id = r.sandbox.id;
    const char *sleeper[] = {"sleep", "60", NULL};
    uint64_t proc = 0;
    assert_int_equal(s_start(ALICE, id, sleeper, &proc), KA_OK);
    ka_guest_req_t *q = ka_guest_req_new(ALICE, id, KA_GUEST_OUTPUT, 0);
    q->proc = proc;
    q->follow = 1;
    s_frames_t *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    assert_int_equal(ka_svc_stream(T.svc, &q, s_on_frame, c, NULL), 0);
    usleep(200 * 1000); /* the follow is with the guest */
    assert_int_equal(s_lifecycle(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&c->lock);
    while (!c->done && pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
        ;
    bool done = c->done;
    pthread_mutex_unlock(&c->lock);
    assert_true(done);
    assert_int_equal(ka_err_code(c->end.err), KA_FAILED_PRECONDITION);
    free(c);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* The sandboxes actor is killed (its sandboxes' actors with it, parking their compute) and its
 * supervisor starts a new one, which recovers the records: the READY sandbox comes back SUSPENDED
 * (ComputeLost) with its /data kept where it was and its TTL unchanged, and a resume boots it again
 * on that /data. */
static void test_restart_recovers_records(void **unused)
{
    t_reply_t ready, susp, o;
    assert_int_equal(s_create(ALICE, "req-rec-ready", "scratch", 0, &ready), KA_OK);
    assert_int_equal(s_create(ALICE, "req-rec-susp", "scratch", 0, &susp), KA_OK);
    s_frames_t c;
    const char *mk[] = {"sh", "-c", "echo acked > /data/workspace/a.txt", NULL};
    assert_int_equal(s_exec(ready.sandbox.id, mk, &c), 0);
    assert_int_equal(s_lifecycle(KA_SBX_SUSPEND, ALICE, susp.sandbox.id, &o), KA_OK);
    s_kill_and_wait_restart(KA_SANDBOXES_NAME);
    usleep(200 * 1000); /* the old sandbox actors' terminate parks their compute */
    for (int i = 0; i < 100; i++) {
        s_lifecycle(KA_SBX_GET, ALICE, ready.sandbox.id, &o);
        if (o.sandbox.state == KA_STATE_SUSPENDED && o.sandbox.operation == KA_OP_NONE)
            break;
        usleep(50 * 1000);
    }
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    assert_string_equal(o.sandbox.failure_reason, KA_FAIL_COMPUTE_LOST);
    assert_int_equal(o.sandbox.expires_ms, ready.sandbox.expires_ms);
    assert_int_equal(s_lifecycle(KA_SBX_RESUME, ALICE, ready.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_string_equal(o.sandbox.failure_reason, "");
    const char *cat[] = {"cat", "/data/workspace/a.txt", NULL};
    assert_int_equal(s_exec(ready.sandbox.id, cat, &c), 0);
    c.out[c.out_len] = '\0';
    assert_string_equal(c.out, "acked\n");
    assert_int_equal(s_lifecycle(KA_SBX_GET, ALICE, susp.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    assert_int_equal(s_lifecycle(KA_SBX_RESUME, ALICE, susp.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, susp.sandbox.id, &o), KA_OK);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, ready.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
}

/* Requests in flight while a supervised actor is killed: each is answered (OK, or UNAVAILABLE
 * when it reached the dead instance), none hangs. */
#define FLIGHT 32
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done, ok, unavailable, other;
    char message[KA_MSG_LEN + 16]; /* the last UNAVAILABLE or other answer's */
} s_flight_t;

static void s_on_flight(void *user, const ka_svc_status_t *st, const void *body, size_t len)
{
    s_flight_t *f = user;
    int code = ka_err_code(st->err);
    pthread_mutex_lock(&f->lock);
    if (code == KA_OK)
        f->ok++;
    else if (code == KA_UNAVAILABLE)
        f->unavailable++;
    else
        f->other++;
    if (code != KA_OK)
        snprintf(f->message, sizeof f->message, "%d %s", code, st->message);
    f->done++;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

static void s_kill_in_flight(const char *name, uint32_t type, const void *body, size_t len)
{
    static s_flight_t f; /* callbacks may outlive a failed test: never on the stack */
    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.lock, NULL);
    pthread_cond_init(&f.cond, NULL);
    for (int i = 0; i < FLIGHT; i++)
        assert_int_equal(ka_svc_call(T.svc, type, body, len, TIMEOUT, s_on_flight, &f), 0);
    s_kill_and_wait_restart(name);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30; /* well under TIMEOUT: an answer, not the deadline */
    pthread_mutex_lock(&f.lock);
    while (f.done < FLIGHT && pthread_cond_timedwait(&f.cond, &f.lock, &until) == 0)
        ;
    int done = f.done, ok = f.ok, unavailable = f.unavailable, other = f.other;
    pthread_mutex_unlock(&f.lock);
    print_message("kill %s with %d requests in flight: %d OK, %d UNAVAILABLE (%s)\n", name, FLIGHT,
                  ok, unavailable, f.message);
    assert_int_equal(done, FLIGHT);
    assert_int_equal(other, 0);
}

/* A fresh sandbox: create, exec, get, delete through the service layer. */
static void s_serves(const char *req_id)
{
    t_reply_t o;
    assert_int_equal(s_create(ALICE, req_id, "scratch", 0, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    char id[KA_STORE_ID_LEN];
    snprintf(id, sizeof id, "%s", o.sandbox.id);
    s_frames_t c;
    const char *echo[] = {"echo", "still-serving", NULL};
    assert_int_equal(s_exec(id, echo, &c), 0);
    c.out[c.out_len] = '\0';
    assert_string_equal(c.out, "still-serving\n");
    assert_int_equal(s_lifecycle(KA_SBX_GET, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
}

/* The record made before the kills is still there, by id and in the list. */
static void s_kept(const char *id)
{
    t_reply_t o;
    assert_int_equal(s_lifecycle(KA_SBX_GET, ALICE, id, &o), KA_OK);
    assert_string_equal(o.sandbox.id, id);
    ka_sbx_list_req_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.caller, sizeof q.caller, ALICE);
    struct {
        ka_sbx_list_t l;
        ka_store_sandbox_t items[KA_STORE_LIST_MAX];
    } list;
    assert_int_equal(s_call(KA_SBX_LIST, &q, sizeof q, &list, sizeof list), KA_OK);
    bool found = false;
    for (uint32_t i = 0; i < list.l.count; i++)
        found = found || strcmp(list.l.items[i].id, id) == 0;
    assert_true(found);
}

/* Each of store, images, templates and the sandboxes manager is killed with requests in
 * flight: the supervisor restarts it under its name, the in-flight requests are answered, and
 * a create/exec/get/delete works again while the sandbox created before is kept (running its
 * guest through the first three kills; SUSPENDED, ComputeLost, after the manager's, and it
 * resumes). */
static void test_supervised_actor_kills(void **unused)
{
    t_reply_t before, o;
    assert_int_equal(s_create(ALICE, "req-sup-before", "scratch", 0, &before), KA_OK);
    ka_sbx_list_req_t lq;
    memset(&lq, 0, sizeof lq);
    snprintf(lq.caller, sizeof lq.caller, ALICE);
    ka_tpl_key_t tk;
    memset(&tk, 0, sizeof tk);
    snprintf(tk.namespace_, sizeof tk.namespace_, NS);
    snprintf(tk.name, sizeof tk.name, "scratch");
    static const struct {
        const char *name;
        uint32_t type; /* a request in flight meanwhile (it goes through the killed actor, but
                          for images: the service sends nothing to it directly) */
    } kills[] = {{KA_STORE_NAME, KA_SBX_LIST},
                 {KA_IMAGES_NAME, KA_TPL_GET},
                 {KA_TEMPLATES_NAME, KA_TPL_GET},
                 {KA_SANDBOXES_NAME, KA_SBX_LIST}};
    for (size_t k = 0; k < sizeof kills / sizeof kills[0]; k++) {
        if (kills[k].type == KA_SBX_LIST)
            s_kill_in_flight(kills[k].name, kills[k].type, &lq, sizeof lq);
        else
            s_kill_in_flight(kills[k].name, kills[k].type, &tk, sizeof tk);
        s_wait_serving();
        s_kept(before.sandbox.id);
        char req[64];
        snprintf(req, sizeof req, "req-sup-after-%s", kills[k].name);
        s_serves(req);
        s_frames_t c;
        const char *t[] = {"true", NULL};
        if (strcmp(kills[k].name, KA_SANDBOXES_NAME) != 0) /* its guest still runs */
            assert_int_equal(s_exec(before.sandbox.id, t, &c), 0);
    }
    usleep(200 * 1000);             /* the old sandbox actors' terminate parks their compute */
    for (int i = 0; i < 100; i++) { /* the new manager recovers records asynchronously */
        assert_int_equal(s_lifecycle(KA_SBX_GET, ALICE, before.sandbox.id, &o), KA_OK);
        if (o.sandbox.state == KA_STATE_SUSPENDED && o.sandbox.operation == KA_OP_NONE)
            break;
        usleep(50 * 1000);
    }
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    assert_string_equal(o.sandbox.failure_reason, KA_FAIL_COMPUTE_LOST);
    assert_int_equal(s_lifecycle(KA_SBX_RESUME, ALICE, before.sandbox.id, &o), KA_OK);
    s_frames_t c;
    const char *t[] = {"true", NULL};
    assert_int_equal(s_exec(before.sandbox.id, t, &c), 0);
    assert_int_equal(s_lifecycle(KA_SBX_DELETE, ALICE, before.sandbox.id, &o), KA_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_validation_and_ready),
        cmocka_unit_test(test_create_exec_files_delete),
        cmocka_unit_test(test_ownership_probes),
        cmocka_unit_test(test_concurrent_duplicates_one_sandbox),
        cmocka_unit_test(test_guest_calls_racing_delete_are_answered),
        cmocka_unit_test(test_create_survives_pg_restart_at_ready),
        cmocka_unit_test(test_lost_suspend_intent_keeps_sandbox_usable),
        cmocka_unit_test(test_ttl_expiry_deletes),
        cmocka_unit_test(test_suspend_resume_keeps_data),
        cmocka_unit_test(test_suspend_delete_under_attack),
        cmocka_unit_test(test_suspend_ends_open_guest_calls),
        cmocka_unit_test(test_restart_recovers_records),
        cmocka_unit_test(test_supervised_actor_kills),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
