/*
 * The typed service layer (svc_ops.h) over the real control actors with the fake driver, fake
 * guest and fake store of the fsm tests (fakes.h): every op's validation (one message, the
 * callback never runs, nothing reaches an actor) and its typed reply; the one error table
 * (ka_errors.h); the frame queue (svc_frames.h).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "fakes.h"
#include "ka_errors.h"
#include "sandboxes.h"
#include "store.h"
#include "svc_frames.h"
#include "guest_proto.h"
#include "svc_ops.h"

#define ALICE   "alice@example.com"
#define BOB     "bob@example.com"
#define WAIT_MS 5000
#define SBX     "0198c0de-0000-7000-8000-000000000001"

static struct {
    char dir[PATH_MAX];
    krt_system_t *sys;
    krt_addr_t store, templates, sandboxes;
    ka_driver_t *driver;
    ka_service_t *svc;
    ka_sandboxes_args_t args;
} T;

static const ka_svc_caller_t WHO = {ALICE, 0};

/* ---- one op's answer ----------------------------------------------------------------------- */

typedef struct {
    int n; /* callbacks run */
    int err;
    char msg[KA_MSG_LEN];
    ka_store_sandbox_t sb;
    bool paused;
    ka_process_info_t proc;
    uint64_t written;
    char data[256];
    size_t data_len;
    bool final;
} s_got_t;

static void s_end(s_got_t *g, const ka_svc_status_t *st)
{
    g->err = st->err;
    snprintf(g->msg, sizeof g->msg, "%s", st->message ? st->message : "");
    g->n++;
}

static void s_on_sandbox(void *user, const ka_svc_status_t *st, const ka_svc_sandbox_t *r)
{
    s_got_t *g = user;
    pthread_mutex_lock(&F.lock);
    if (r) {
        g->sb = *r->sandbox;
        g->paused = r->paused;
    }
    s_end(g, st);
    pthread_mutex_unlock(&F.lock);
}

static void s_on_list(void *user, const ka_svc_status_t *st, const ka_svc_list_t *l)
{
    pthread_mutex_lock(&F.lock);
    s_end(user, st);
    pthread_mutex_unlock(&F.lock);
}

static void s_on_templates(void *user, const ka_svc_status_t *st, const ka_svc_templates_t *t)
{
    pthread_mutex_lock(&F.lock);
    s_end(user, st);
    pthread_mutex_unlock(&F.lock);
}

static void s_on_process(void *user, const ka_svc_status_t *st, const ka_svc_process_t *p)
{
    s_got_t *g = user;
    pthread_mutex_lock(&F.lock);
    if (p)
        g->proc = p->info;
    s_end(g, st);
    pthread_mutex_unlock(&F.lock);
}

static void s_on_written(void *user, const ka_svc_status_t *st, uint64_t written)
{
    s_got_t *g = user;
    pthread_mutex_lock(&F.lock);
    g->written = written;
    s_end(g, st);
    pthread_mutex_unlock(&F.lock);
}

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_got_t *g = user;
    pthread_mutex_lock(&F.lock);
    if (!f->final && f->tail_len && g->data_len + f->tail_len <= sizeof g->data) {
        memcpy(g->data + g->data_len, f->tail, f->tail_len);
        g->data_len += f->tail_len;
    }
    if (f->final) {
        ka_svc_status_t st = ka_svc_status_of(f, len);
        if (f->has_process)
            g->proc = f->process;
        g->written = f->written;
        g->final = true;
        s_end(g, &st);
    }
    pthread_mutex_unlock(&F.lock);
}

static bool s_done(void *arg)
{
    return ((s_got_t *)arg)->n > 0;
}

/* Waits for the started op's one answer; returns its errno. */
static int s_wait(ka_svc_status_t started, s_got_t *g)
{
    if (started.err)
        fail_msg("refused: %s", started.message);
    assert_true(f_wait(s_done, g, WAIT_MS));
    usleep(20000); /* a second answer would be a bug: give it a chance to show */
    pthread_mutex_lock(&F.lock);
    int n = g->n;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(n, 1);
    if (g->err)
        print_message("answer: %d %s\n", g->err, g->msg);
    return g->err;
}

/* ---- fixture ------------------------------------------------------------------------------- */

static int s_setup(void **state)
{
    snprintf(T.dir, sizeof T.dir, "/tmp/kagent-svc.XXXXXX");
    assert_non_null(mkdtemp(T.dir));
    f_reset(T.dir);
    krt_config_t cfg = {.node_id = 1, .name = "node-svc", .schedulers = 2};
    T.sys = krt_system_new(&cfg);
    assert_non_null(T.sys);
    assert_int_equal(krt_system_start(T.sys), 0);
    krt_spawn_opts_t so = {.name = KA_STORE_NAME, .register_name = true};
    krt_spawn_opts_t to = {.name = KA_TEMPLATES_NAME, .register_name = true};
    assert_int_equal(krt_system_spawn(T.sys, &f_store_behaviour, NULL, &so, &T.store), 0);
    assert_int_equal(krt_system_spawn(T.sys, &f_templates_behaviour, NULL, &to, &T.templates), 0);
    T.driver = f_driver_new();
    T.args = (ka_sandboxes_args_t){.store = KA_STORE_NAME,
                                   .templates = KA_TEMPLATES_NAME,
                                   .driver = T.driver,
                                   .default_ttl_ms = 3600000,
                                   .max_ttl_ms = 86400000,
                                   .guest_idle_ms = 2000};
    snprintf(T.args.node, sizeof T.args.node, "node-svc");
    krt_spawn_opts_t mo = {.name = KA_SANDBOXES_NAME, .register_name = true};
    assert_int_equal(krt_system_spawn(T.sys, &ka_sandboxes_behaviour, &T.args, &mo, &T.sandboxes),
                     0);
    T.svc = ka_service_new(T.sys, KA_TEMPLATES_NAME, KA_SANDBOXES_NAME);
    assert_non_null(T.svc);
    return 0;
}

static int s_teardown(void **state)
{
    ka_service_destroy(&T.svc);
    f_open_gate();
    krt_system_destroy(&T.sys);
    ka_driver_destroy(&T.driver);
    pthread_mutex_lock(&F.lock);
    int live = F.live;
    pthread_mutex_unlock(&F.lock);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", T.dir);
    if (system(cmd) != 0)
        return -1;
    assert_int_equal(live, 0);
    return 0;
}

/* ---- validation: one message per rule, the callback never runs, no actor sees it ---------- */

static void s_refused(ka_svc_status_t st, s_got_t *g, const char *want)
{
    assert_int_equal(st.err, -EINVAL);
    assert_non_null(st.message);
    assert_string_equal(st.message, want);
    usleep(1000);
    assert_int_equal(g->n, 0);
}

static void test_validation(void **unused)
{
    s_got_t g = {0};
    char big[130], path[1100], longname[210];
    memset(big, 'r', 129);
    big[129] = '\0';
    memset(path, 'p', 1024);
    path[1024] = '\0';
    memset(longname, 'n', 201);
    longname[201] = '\0';
    const char *req_msg = "request_id must be between 1 and 128 characters";
    ka_svc_create_args_t c = {.request_id = "", .template_name = "python"};
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g, req_msg);
    c.request_id = big;
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g, req_msg);
    c.request_id = "r";
    c.name = longname;
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g,
              "name must be at most 200 characters");
    c.name = NULL;
    c.ttl_ms = -1;
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g, "ttl must be positive");
    c.ttl_ms = 0;
    c.template_name = "";
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g, "sandbox_template is required");
    c.template_name = "Bad_Name";
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g,
              "sandbox_template.name: must be a DNS subdomain of 1-253 characters");
    c.template_name = "python";
    c.template_namespace = "NS!";
    s_refused(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g,
              "sandbox_template.namespace: must be a DNS label of 1-63 characters");

    s_refused(ka_svc_sandbox(T.svc, &WHO, "nope", s_on_sandbox, &g), &g, KA_MSG_NOT_UUID);
    s_refused(ka_svc_delete(T.svc, &WHO, NULL, s_on_sandbox, &g), &g, KA_MSG_NOT_UUID);
    s_refused(ka_svc_suspend(T.svc, &WHO, "", s_on_sandbox, &g), &g, KA_MSG_NOT_UUID);
    s_refused(ka_svc_resume(T.svc, &WHO, "x", s_on_sandbox, &g), &g, KA_MSG_NOT_UUID);
    s_refused(ka_svc_pause(T.svc, &WHO, "x", s_on_sandbox, &g), &g, KA_MSG_NOT_UUID);
    s_refused(ka_svc_unpause(T.svc, &WHO, "x", s_on_sandbox, &g), &g, KA_MSG_NOT_UUID);

    ka_svc_list_args_t l = {.limit = 101};
    const char *page = "page size must be between 0 and 100 and the offset nonnegative";
    s_refused(ka_svc_list(T.svc, &WHO, &l, s_on_list, &g), &g, page);
    l = (ka_svc_list_args_t){.offset = -1};
    s_refused(ka_svc_list(T.svc, &WHO, &l, s_on_list, &g), &g, page);
    l = (ka_svc_list_args_t){.page_token = "abc"};
    s_refused(ka_svc_list(T.svc, &WHO, &l, s_on_list, &g), &g, "page_token is not valid");

    s_refused(ka_svc_template_list(T.svc, &WHO, "NS!", s_on_templates, &g), &g,
              "namespace must be a DNS label (1-63 characters)");
    ka_svc_tpl_ref_t ref = {"kagent", ""};
    s_refused(ka_svc_template_get(T.svc, &WHO, &ref, s_on_templates, &g), &g,
              "name must be a DNS subdomain (1-253 characters)");
    s_refused(ka_svc_template_delete(T.svc, &WHO, &ref, s_on_templates, &g), &g,
              "name must be a DNS subdomain (1-253 characters)");
    ref.name = "t";
    s_refused(ka_svc_template_apply(T.svc, &WHO, &ref, "", 0, s_on_templates, &g), &g,
              "a SandboxTemplate is required (yaml or resource)");

    const char *empty[] = {""}, *ls[] = {"ls"};
    ka_svc_env_t bad_env[] = {{"A=B", "1"}};
    ka_svc_exec_args_t e = {.sandbox_id = SBX, .argv = empty, .argc = 1};
    s_refused(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g, "command must not be empty");
    e.argc = 0;
    s_refused(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g, "command must not be empty");
    e = (ka_svc_exec_args_t){.sandbox_id = SBX, .argv = ls, .argc = 1, .env = bad_env, .n_env = 1};
    s_refused(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g,
              "env keys must be non-empty and must not contain '='");
    e = (ka_svc_exec_args_t){.sandbox_id = SBX, .argv = ls, .argc = 1, .cwd = path};
    s_refused(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g, "cwd must be at most 1023 bytes");
    char *huge = malloc(KA_START_TAIL_MAX + 1);
    memset(huge, 'x', KA_START_TAIL_MAX);
    huge[KA_START_TAIL_MAX] = '\0';
    const char *hv[] = {"echo", huge};
    e = (ka_svc_exec_args_t){.sandbox_id = SBX, .argv = hv, .argc = 2};
    s_refused(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g,
              "command and env are too large (1 MiB at most)");
    free(huge);
    e = (ka_svc_exec_args_t){.sandbox_id = "nope", .argv = ls, .argc = 1};
    s_refused(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g, KA_MSG_NOT_UUID);

    const char *pid = "process_id must be the decimal id a process start returned";
    s_refused(ka_svc_process(T.svc, &WHO, SBX, "x1", s_on_process, &g), &g, pid);
    s_refused(ka_svc_process(T.svc, &WHO, SBX, "0", s_on_process, &g), &g, pid);
    s_refused(ka_svc_process(T.svc, &WHO, SBX, "99999999999999999999999", s_on_process, &g), &g,
              pid);
    s_refused(ka_svc_signal(T.svc, &WHO, SBX, "1", 0, s_on_process, &g), &g,
              "signal must be one of SIGNAL_HUP ... SIGNAL_SYS");
    s_refused(ka_svc_signal(T.svc, &WHO, SBX, "1", 32, s_on_process, &g), &g,
              "signal must be one of SIGNAL_HUP ... SIGNAL_SYS");
    ka_svc_output_args_t o = {SBX, "1", -1, 0, false};
    s_refused(ka_svc_output(T.svc, &WHO, &o, s_on_frame, &g, NULL), &g,
              "output offsets must be nonnegative");
    o.stdout_offset = 0;
    o.process_id = "";
    s_refused(ka_svc_output(T.svc, &WHO, &o, s_on_frame, &g, NULL), &g, pid);
    ka_svc_input_args_t in = {SBX, "-3", "x", 1, false};
    s_refused(ka_svc_input(T.svc, &WHO, &in, s_on_written, &g), &g, pid);
    assert_int_equal(ka_svc_input_check(&in).err, -EINVAL);

    ka_svc_read_args_t r = {SBX, "", 0};
    s_refused(ka_svc_file_read(T.svc, &WHO, &r, s_on_frame, &g, NULL), &g,
              "path must be 1-1023 bytes");
    r.path = path;
    s_refused(ka_svc_file_read(T.svc, &WHO, &r, s_on_frame, &g, NULL), &g,
              "path must be 1-1023 bytes");
    ka_svc_write_args_t w = {SBX, "a", 0, -1, "x", 1};
    s_refused(ka_svc_file_write(T.svc, &WHO, &w, s_on_written, &g), &g,
              "seek_offset must be nonnegative");
    w = (ka_svc_write_args_t){SBX, "a", 010000, 0, "x", 1};
    s_refused(ka_svc_file_write(T.svc, &WHO, &w, s_on_written, &g), &g,
              "mode must be between 0 and 4095 (07777)");
    w = (ka_svc_write_args_t){"nope", "", 0, 0, "x", 1};
    s_refused(ka_svc_file_write(T.svc, &WHO, &w, s_on_written, &g), &g, KA_MSG_NOT_UUID);
    pthread_mutex_lock(&F.lock);
    int seen = F.guest_requests + F.n_records;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(seen, 0); /* nothing reached an actor */
}

/* ---- typed replies ------------------------------------------------------------------------- */

static void test_sandbox_ops(void **unused)
{
    s_got_t g = {0};
    ka_svc_create_args_t c = {.request_id = "svc-1", .name = "one", .template_name = "python"};
    assert_int_equal(s_wait(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g), 0);
    assert_int_equal(g.sb.state, KA_STATE_READY);
    assert_string_equal(g.sb.template_namespace, "default");
    char id[KA_STORE_ID_LEN];
    snprintf(id, sizeof id, "%s", g.sb.id);

    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_sandbox(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
    assert_string_equal(g.sb.id, id);
    assert_false(g.paused);

    memset(&g, 0, sizeof g);
    ka_svc_caller_t bob = {BOB, 0};
    assert_int_equal(s_wait(ka_svc_sandbox(T.svc, &bob, id, s_on_sandbox, &g), &g), -ENOENT);
    assert_string_equal(g.msg, KA_MSG_NOT_FOUND);
    assert_string_equal(ka_err_name(g.err), "NOT_FOUND");

    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_pause(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
    assert_true(g.paused);
    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_unpause(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
    assert_false(g.paused);

    memset(&g, 0, sizeof g);
    ka_svc_write_args_t w = {id, "kept.txt", 0644, 0, "kept", 4};
    assert_int_equal(s_wait(ka_svc_file_write(T.svc, &WHO, &w, s_on_written, &g), &g), 0);
    assert_int_equal(g.written, 4);

    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_suspend(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
    assert_int_equal(g.sb.state, KA_STATE_SUSPENDED);
    memset(&g, 0, sizeof g);
    ka_svc_read_args_t r = {id, "kept.txt", 0};
    assert_int_equal(s_wait(ka_svc_file_read(T.svc, &WHO, &r, s_on_frame, &g, NULL), &g),
                     -EBUSY); /* FAILED_PRECONDITION */
    assert_string_equal(g.msg, KA_MSG_NOT_READY);
    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_resume(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
    assert_int_equal(g.sb.state, KA_STATE_READY);

    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_file_read(T.svc, &WHO, &r, s_on_frame, &g, NULL), &g), 0);
    assert_int_equal(g.data_len, 4);
    assert_memory_equal(g.data, "kept", 4);

    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_delete(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
    assert_int_equal(g.sb.state, KA_STATE_DELETED);
}

static void test_process_ops(void **unused)
{
    s_got_t g = {0};
    ka_svc_create_args_t c = {.request_id = "svc-2", .template_name = "python"};
    assert_int_equal(s_wait(ka_svc_create(T.svc, &WHO, &c, s_on_sandbox, &g), &g), 0);
    char id[KA_STORE_ID_LEN];
    snprintf(id, sizeof id, "%s", g.sb.id);

    memset(&g, 0, sizeof g);
    const char *echo[] = {"echo", "hello"};
    ka_svc_exec_args_t e = {.sandbox_id = id, .argv = echo, .argc = 2};
    assert_int_equal(s_wait(ka_svc_exec(T.svc, &WHO, &e, s_on_process, &g), &g), 0);
    assert_true(g.proc.proc > 0);
    char pid[24];
    snprintf(pid, sizeof pid, "%llu", (unsigned long long)g.proc.proc);

    /* the fake guest answers what it does not fake with -ENOSYS: the typed path still ends
     * with one answer carrying the guest's status */
    memset(&g, 0, sizeof g);
    assert_int_not_equal(s_wait(ka_svc_process(T.svc, &WHO, id, pid, s_on_process, &g), &g), 0);
    assert_string_equal(g.msg, "not faked");

    memset(&g, 0, sizeof g);
    assert_int_equal(s_wait(ka_svc_delete(T.svc, &WHO, id, s_on_sandbox, &g), &g), 0);
}

/* ---- the error table and the frame queue --------------------------------------------------- */

static void test_error_table(void **unused)
{
    for (int code = KA_OK; code <= KA_UNAUTHENTICATED; code++)
        assert_int_equal(ka_err_code(ka_err_of_code(code)), code); /* exact both ways */
    assert_int_equal(ka_err_code(-EINVAL), KA_INVALID_ARGUMENT);
    assert_int_equal(ka_err_code(KA_STORE_EUNAVAIL), KA_UNAVAILABLE);
    assert_int_equal(ka_err_code(KA_STORE_ECONFLICT), KA_ABORTED);
    assert_int_equal(ka_err_code(KA_STORE_EDB), KA_INTERNAL);
    assert_int_equal(ka_err_code(KRT_ETIMEDOUT), KA_DEADLINE_EXCEEDED);
    assert_int_equal(ka_err_code(-12345), KA_INTERNAL);
    assert_string_equal(ka_code_name(KA_FAILED_PRECONDITION), "FAILED_PRECONDITION");
    assert_string_equal(ka_code_name(99), "UNKNOWN");
    assert_string_equal(ka_err_name(-ENOENT), "NOT_FOUND");
    assert_int_equal(ka_err_code(KA_STORE_ENOTFOUND), KA_NOT_FOUND);
    assert_int_equal(ka_err_code(KA_EUNAVAIL), KA_UNAVAILABLE); /* a control actor's */
    assert_int_equal(ka_err_code(KA_ETIMEOUT), KA_DEADLINE_EXCEEDED);
    for (int code = 0; code <= KA_UNAUTHENTICATED; code++)
        assert_int_equal(ka_err_canonical(ka_err_of_code(code)), ka_err_of_code(code));
    assert_int_equal(ka_err_canonical(KRT_ETIMEDOUT), ka_err_of_code(KA_DEADLINE_EXCEEDED));
    assert_int_equal(ka_err_canonical(KA_STORE_ECONFLICT), ka_err_of_code(KA_ABORTED));
}

/* A guest's errnos are its system calls': where they mean another thing than the node's own,
 * the guest's rows win (EACCES is a denied permission, not a missing identity). */
static void test_guest_errors(void **unused)
{
    static const struct {
        int err, code;
    } rows[] = {
        {-EACCES, KA_PERMISSION_DENIED},
        {-EPERM, KA_PERMISSION_DENIED},
        {-EBUSY, KA_ABORTED},
        {-EAGAIN, KA_RESOURCE_EXHAUSTED},
        {-EMFILE, KA_RESOURCE_EXHAUSTED},
        {-EFBIG, KA_RESOURCE_EXHAUSTED},
        {-ENOSPC, KA_RESOURCE_EXHAUSTED},
        {-EISDIR, KA_INVALID_ARGUMENT},
        {-ENAMETOOLONG, KA_INVALID_ARGUMENT},
        {-EINVAL, KA_INVALID_ARGUMENT},
        {-ENOTDIR, KA_FAILED_PRECONDITION},
        {-ENOTEMPTY, KA_FAILED_PRECONDITION},
        {-EPIPE, KA_FAILED_PRECONDITION},
        {-ENOTTY, KA_FAILED_PRECONDITION},
        {-ENOENT, KA_NOT_FOUND},
        {-EEXIST, KA_ALREADY_EXISTS},
        {-ETIMEDOUT, KA_DEADLINE_EXCEEDED},
        {-ENOMEM, KA_INTERNAL}, /* not a guest row */
        {-EPROTO, KA_INTERNAL},
        {-12345, KA_INTERNAL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int err = ka_err_of_guest(rows[i].err);
        assert_int_equal(err, ka_err_of_code(rows[i].code)); /* canonical */
        assert_int_equal(ka_err_code(err), rows[i].code);
    }
}

static void test_frames(void **unused)
{
    ka_frames_t q = {0};
    assert_true(ka_frames_empty(&q));
    char buf[sizeof(ka_guest_reply_t) + 3];
    ka_guest_reply_t *f = (ka_guest_reply_t *)buf;
    memset(buf, 0, sizeof buf);
    f->tail_len = 3;
    memcpy(f->tail, "abc", 3);
    assert_int_equal(ka_frames_push(&q, f, sizeof buf), 0);
    assert_string_equal(ka_frame_message(f, sizeof buf), ""); /* a data frame: no failure */
    ka_frame_fail_t fail;
    size_t len = ka_frame_final(&fail, KRT_ETIMEDOUT, "gone");
    assert_int_equal(len, sizeof(ka_guest_reply_t) + sizeof "gone"); /* nothing padded */
    assert_int_equal(ka_frames_push(&q, &fail.frame, len), 0);
    ka_frame_t *a = ka_frames_pop(&q);
    assert_int_equal(a->len, sizeof buf);
    assert_memory_equal(a->frame.tail, "abc", 3);
    ka_frame_t *b = ka_frames_pop(&q);
    assert_true(b->frame.final);
    assert_int_equal(b->frame.err, ka_err_of_code(KA_DEADLINE_EXCEEDED)); /* canonical */
    assert_int_equal(b->frame.tail_len, sizeof "gone");
    assert_string_equal(ka_frame_message(&b->frame, b->len), "gone");
    assert_string_equal(ka_frame_message(&b->frame, b->len - 1), ""); /* short: not read */
    ka_frame_end_t end;
    ka_frame_end(&end, &b->frame, b->len);
    assert_int_equal(end.err, b->frame.err);
    assert_string_equal(end.message, "gone");
    ka_svc_status_t st = ka_svc_status_of(&b->frame, b->len);
    assert_int_equal(st.err, b->frame.err);
    assert_string_equal(st.message, "gone");
    assert_null(ka_frames_pop(&q));
    free(a);
    free(b);
    char long_msg[KA_MSG_LEN + 100];
    memset(long_msg, 'x', sizeof long_msg - 1);
    long_msg[sizeof long_msg - 1] = '\0';
    len = ka_frame_final(&fail, -EINVAL, long_msg); /* cut to its room */
    assert_int_equal(len, sizeof fail);
    assert_int_equal(strlen(ka_frame_message(&fail.frame, len)), KA_MSG_LEN - 1);
    assert_int_equal(ka_frame_final(&fail, -EINVAL, NULL), sizeof(ka_guest_reply_t) + 1);
    assert_string_equal(ka_frame_message(&fail.frame, sizeof fail), "");
    assert_int_equal(ka_frames_push(&q, &fail.frame, len), 0);
    ka_frames_clear(&q);
    assert_true(ka_frames_empty(&q));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_validation, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sandbox_ops, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_process_ops, s_setup, s_teardown),
        cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_guest_errors),
        cmocka_unit_test(test_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
