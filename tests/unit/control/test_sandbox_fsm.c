/*
 * The sandbox actor's state machine and the sandboxes manager, with a fake driver (a fake guest
 * speaking the real guest protocol over a socketpair, a real /data directory), a fake store and
 * a fake templates actor (fakes.h): every interleaving the transition table allows, in
 * milliseconds and without root.
 *
 * Each test asserts that every caller gets exactly one answer, that the store saw exactly the
 * writes the table implies, that no event or transition the table forbids happened
 * (ka_sandbox_fsm_violations), and that no fake sandbox outlives the node.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fakes.h"
#include "sandbox_int.h"
#include "sandboxes.h"
#include "service.h"
#include "store.h"
#include "svc_frames.h"

#define ALICE   "alice@example.com"
#define BOB     "bob@example.com"
#define WAIT_MS 5000
#define IDLE_MS 300 /* the guest call deadline in these tests */

static struct {
    char dir[PATH_MAX];
    krt_system_t *sys;
    krt_addr_t store, templates, sandboxes;
    ka_driver_t *driver;
    ka_service_t *svc;
    ka_sandboxes_args_t args;
} T;

/* ---- answers ------------------------------------------------------------------------------- */

/* A call's outcome as the tests read it: its code and message ("" on success). */
typedef struct {
    int code;
    char message[KA_MSG_LEN];
} t_status_t;

/* A sandbox call's answer as the tests read it: its status, then the success reply's fields
 * (zero for a failure). */
typedef struct {
    t_status_t status;
    ka_store_sandbox_t sandbox;
    uint8_t paused;
} t_reply_t;

/* A unary call's answers: exactly one is expected. */
typedef struct {
    int n;
    int code;
    t_reply_t r;
} s_answer_t;

static void s_on_answer(void *user, const ka_svc_status_t *st, const void *body, size_t len)
{
    s_answer_t *a = user;
    pthread_mutex_lock(&F.lock);
    a->n++;
    a->code = ka_err_code(st->err);
    memset(&a->r, 0, sizeof a->r);
    a->r.status.code = a->code;
    snprintf(a->r.status.message, sizeof a->r.status.message, "%s", st->message ? st->message : "");
    if (body && len == sizeof(ka_sbx_reply_t)) {
        const ka_sbx_reply_t *r = body;
        a->r.sandbox = r->sandbox;
        a->r.paused = r->paused;
    }
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

static bool s_answered(void *arg)
{
    return ((s_answer_t *)arg)->n > 0;
}

static void s_send(uint32_t type, const void *body, size_t len, s_answer_t *a)
{
    memset(a, 0, sizeof *a);
    assert_int_equal(ka_svc_call(T.svc, type, body, len, WAIT_MS, s_on_answer, a), 0);
}

/* Waits for a's one answer (and a moment for a second, which must not come). */
static int s_wait_answer(s_answer_t *a)
{
    assert_true(f_wait(s_answered, a, WAIT_MS));
    usleep(20 * 1000);
    pthread_mutex_lock(&F.lock);
    int n = a->n;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(n, 1);
    return a->code;
}

static ka_sbx_create_t s_create_req(const char *caller, const char *request_id, int64_t ttl_ms)
{
    ka_sbx_create_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.caller, sizeof c.caller, "%s", caller);
    snprintf(c.request_id, sizeof c.request_id, "%s", request_id);
    snprintf(c.template_namespace, sizeof c.template_namespace, "kagent");
    snprintf(c.template_name, sizeof c.template_name, "scratch");
    c.ttl_ms = ttl_ms;
    return c;
}

static ka_sbx_key_t s_key(const char *caller, const char *id)
{
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    snprintf(k.caller, sizeof k.caller, "%s", caller);
    snprintf(k.id, sizeof k.id, "%s", id);
    return k;
}

/* A lifecycle call, waited for; returns its code, *out the reply. */
static int s_life(uint32_t type, const char *caller, const char *id, t_reply_t *out)
{
    ka_sbx_key_t k = s_key(caller, id);
    s_answer_t a;
    s_send(type, &k, sizeof k, &a);
    int code = s_wait_answer(&a);
    if (out)
        *out = a.r;
    return code;
}

static void s_create(const char *request_id, int64_t ttl_ms, t_reply_t *out)
{
    ka_sbx_create_t c = s_create_req(ALICE, request_id, ttl_ms);
    s_answer_t a;
    s_send(KA_SBX_CREATE, &c, sizeof c, &a);
    assert_int_equal(s_wait_answer(&a), KA_OK);
    assert_int_equal(a.r.sandbox.state, KA_STATE_READY);
    *out = a.r;
}

/* A guest stream's frames. */
typedef struct {
    int finals;
    int frames;
    bool had_process;       /* a non-final frame carried the process */
    ka_guest_reply_t final; /* its header */
    size_t final_len;       /* its bytes, the tail included */
    ka_frame_end_t end;     /* its outcome */
    char out[512];
    size_t out_len;
} s_stream_t;

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_stream_t *s = user;
    pthread_mutex_lock(&F.lock);
    s->frames++;
    if (f->final) {
        s->finals++;
        s->final = *f;
        s->final_len = len;
        ka_frame_end(&s->end, f, len);
    } else if (f->has_process) {
        s->had_process = true;
    } else if (f->tail_len && s->out_len + f->tail_len < sizeof s->out) {
        memcpy(s->out + s->out_len, f->tail, f->tail_len);
        s->out_len += f->tail_len;
    }
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

static bool s_stream_done(void *arg)
{
    return ((s_stream_t *)arg)->finals > 0;
}

static void s_stream_start(ka_guest_req_t *q, s_stream_t *s)
{
    memset(s, 0, sizeof *s);
    assert_int_equal(ka_svc_stream(T.svc, &q, s_on_frame, s, NULL), 0);
}

static int s_stream_wait(s_stream_t *s, int ms)
{
    assert_true(f_wait(s_stream_done, s, ms));
    usleep(20 * 1000);
    pthread_mutex_lock(&F.lock);
    int finals = s->finals;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(finals, 1);
    return ka_err_code(s->end.err);
}

/* Stream s ended with a failing final frame of code and message: its canonical errno, the
 * message as its whole tail, nothing padded. */
static void s_assert_frame_failure(const s_stream_t *s, int code, const char *message)
{
    assert_true(s->final.final);
    assert_int_equal(s->final.err, ka_err_of_code(code));
    assert_int_equal(s->final.tail_len, strlen(message) + 1);
    assert_int_equal(s->final_len, sizeof s->final + s->final.tail_len);
    assert_string_equal(s->end.message, message);
}

/* START with follow: the process, its output and its exit in one guest round trip. */
static ka_guest_req_t *s_exec_req(const char *id, const char *const *argv)
{
    size_t tail = 0, n = 0;
    for (; argv[n]; n++)
        tail += strlen(argv[n]) + 1;
    ka_guest_req_t *q = ka_guest_req_new(ALICE, id, KA_GUEST_START, tail);
    char *p = q->tail;
    for (size_t i = 0; i < n; i++)
        p = stpcpy(p, argv[i]) + 1;
    q->n_argv = (uint32_t)n;
    q->follow = 1;
    return q;
}

static int s_exec(const char *id, const char *const *argv, s_stream_t *s)
{
    s_stream_start(s_exec_req(id, argv), s);
    return s_stream_wait(s, WAIT_MS);
}

static int s_file(const char *id, int op, const char *path, const char *data, s_stream_t *s)
{
    size_t len = data ? strlen(data) : 0;
    ka_guest_req_t *q = ka_guest_req_new(ALICE, id, op, len);
    snprintf(q->path, sizeof q->path, "%s", path);
    if (len)
        memcpy(q->tail, data, len);
    s_stream_start(q, s);
    return s_stream_wait(s, WAIT_MS);
}

/* ---- conditions ---------------------------------------------------------------------------- */

typedef struct {
    const char *id;
    int state;
} s_want_t;

static bool s_record_is(void *arg)
{
    const s_want_t *w = arg;
    for (int i = 0; i < F.n_records; i++)
        if (!strcmp(F.records[i].id, w->id))
            return F.records[i].state == w->state && F.records[i].operation == KA_OP_NONE;
    return false;
}

static void s_wait_state(const char *id, int state)
{
    s_want_t w = {id, state};
    assert_true(f_wait(s_record_is, &w, WAIT_MS));
}

static bool s_in_start(void *arg)
{
    return F.in_start > 0;
}

static bool s_held(void *arg)
{
    return F.held > 0;
}

static void s_assert_history(const char *id, const char *want)
{
    char got[2048];
    f_history(id, got, sizeof got);
    assert_string_equal(got, want);
}

/* ---- fixture ------------------------------------------------------------------------------- */

static void s_spawn_manager(void)
{
    krt_spawn_opts_t o = {.name = KA_SANDBOXES_NAME, .register_name = true};
    assert_int_equal(krt_system_spawn(T.sys, &ka_sandboxes_behaviour, &T.args, &o, &T.sandboxes),
                     0);
    ka_service_destroy(&T.svc);
    T.svc = ka_service_new(T.sys, KA_TEMPLATES_NAME, KA_SANDBOXES_NAME);
}

/* The node without its sandboxes manager (spawned by each test, after any records it plants). */
static int s_setup(void **state)
{
    snprintf(T.dir, sizeof T.dir, "/tmp/kagent-fsm.XXXXXX");
    assert_non_null(mkdtemp(T.dir));
    f_reset(T.dir);
    krt_config_t cfg = {.node_id = 1, .name = "node-fsm", .schedulers = 2};
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
                                   .guest_idle_ms = IDLE_MS};
    snprintf(T.args.node, sizeof T.args.node, "node-fsm");
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
    assert_int_equal(live, 0);                        /* nothing outlives the node */
    assert_int_equal(ka_sandbox_fsm_violations(), 0); /* nothing the table forbids */
    return 0;
}

/* ---- tests --------------------------------------------------------------------------------- */

/* Create, an exec in one guest round trip, files, suspend and resume keeping /data, delete. */
static void test_lifecycle_and_one_round_trip_exec(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("life", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    const char *echo[] = {"echo", "hello", NULL};
    pthread_mutex_lock(&F.lock);
    int before = F.guest_requests;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_exec(id, echo, &s), KA_OK);
    assert_int_equal(F.guest_requests - before, 1); /* start with follow: one request */
    assert_true(s.had_process);
    assert_true(s.final.has_process);
    assert_int_equal(s.final.process.state, KA_GP_STATE_EXITED);
    assert_int_equal(s.out_len, 6);
    assert_memory_equal(s.out, "hello\n", 6);
    assert_int_equal(s_file(id, KA_GUEST_WRITE, "kept.txt", "kept", &s), KA_OK);
    assert_int_equal(s.final.written, 4);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    assert_int_equal(s_file(id, KA_GUEST_READ, "kept.txt", NULL, &s), KA_FAILED_PRECONDITION);
    s_assert_frame_failure(&s, KA_FAILED_PRECONDITION, KA_MSG_NOT_READY);
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_file(id, KA_GUEST_READ, "kept.txt", NULL, &s), KA_OK);
    assert_int_equal(s.out_len, 4);
    assert_memory_equal(s.out, "kept", 4);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK); /* the tombstone again */
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    s_assert_history(id, "CREATING/CREATE READY/NONE READY/SUSPEND SUSPENDED/NONE "
                         "SUSPENDED/RESUME READY/NONE DELETING/DELETE DELETED/NONE");
}

/* What the table refuses, with the reference's codes and messages; nothing changes. */
static void test_refusals(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("refuse", 0, &r);
    const char *id = r.sandbox.id;
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_string_equal(o.status.message, "cannot resume a sandbox in state RUNTIME_STATE_READY");
    assert_int_equal(s_life(KA_SBX_SUSPEND, BOB, id, &o), KA_NOT_FOUND);
    assert_string_equal(o.status.message, KA_MSG_NOT_FOUND);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_string_equal(o.status.message,
                        "cannot suspend a sandbox in state RUNTIME_STATE_SUSPENDED");
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    s_assert_history(id, "CREATING/CREATE READY/NONE READY/SUSPEND SUSPENDED/NONE "
                         "DELETING/DELETE DELETED/NONE");
}

/* A call sent straight to `to` (not through the service): its reply is an error reply whose
 * status maps to code and whose body is only the message. */
static void s_assert_error_reply(krt_addr_t to, uint32_t type, const void *body, size_t len,
                                 int code, const char *message)
{
    krt_reply_t r;
    assert_int_equal(krt_call(T.sys, to, type, body, len, WAIT_MS, &r), 0);
    assert_int_equal(r.type, KRT_MSG_ERROR);
    assert_true(r.status < 0);
    assert_int_equal(ka_err_code(r.status), code);
    assert_int_equal(r.len, strlen(message) + 1);
    assert_string_equal(r.body, message);
    krt_reply_free(&r);
}

/* Failures are error replies, from the sandbox's actor and from the manager: the status in the
 * envelope, the body only the message (no success struct padded around it); a success is the
 * reply struct alone. */
static void test_failures_are_error_replies(void **unused)
{
    s_spawn_manager();
    t_reply_t r;
    s_create("errors", 0, &r);
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, r.sandbox.id);
    krt_addr_t actor = krt_whereis(T.sys, name);
    assert_true(actor != KRT_ADDR_NONE);
    ka_sbx_key_t k = s_key(ALICE, r.sandbox.id);
    s_assert_error_reply(actor, KA_SBX_RESUME, &k, sizeof k, KA_FAILED_PRECONDITION,
                         "cannot resume a sandbox in state RUNTIME_STATE_READY");
    s_assert_error_reply(actor, KA_SBX_UNPAUSE, &k, sizeof k, KA_FAILED_PRECONDITION,
                         "the sandbox is not paused");
    ka_sbx_key_t bob = s_key(BOB, r.sandbox.id);
    s_assert_error_reply(actor, KA_SBX_SUSPEND, &bob, sizeof bob, KA_NOT_FOUND, KA_MSG_NOT_FOUND);
    ka_sbx_key_t anon = s_key("", r.sandbox.id);
    s_assert_error_reply(T.sandboxes, KA_SBX_SUSPEND, &anon, sizeof anon, KA_UNAUTHENTICATED,
                         "authentication required");
    ka_sbx_key_t bad = s_key(ALICE, "not-a-uuid");
    s_assert_error_reply(T.sandboxes, KA_SBX_GET, &bad, sizeof bad, KA_INVALID_ARGUMENT,
                         KA_MSG_NOT_UUID);
    ka_sbx_key_t gone = s_key(ALICE, "0198f000-0000-7000-8000-0000000000ff");
    s_assert_error_reply(T.sandboxes, KA_SBX_GET, &gone, sizeof gone, KA_NOT_FOUND,
                         KA_MSG_NOT_FOUND);
    s_assert_error_reply(T.sandboxes, KA_SBX_LIST, &k, sizeof k, KA_INVALID_ARGUMENT,
                         "malformed list request");
    krt_reply_t ok;
    assert_int_equal(krt_call(T.sys, actor, KA_SBX_GET, &k, sizeof k, WAIT_MS, &ok), 0);
    assert_int_equal(ok.type, KA_SBX_GET);
    assert_int_equal(ok.status, 0);
    assert_int_equal(ok.len, sizeof(ka_sbx_reply_t));
    assert_string_equal(((const ka_sbx_reply_t *)ok.body)->sandbox.id, r.sandbox.id);
    krt_reply_free(&ok);
}

/* A guest's failure reaches its caller as a failing final frame: the guest's errno through the
 * guest's rows of the one table (EACCES is PERMISSION_DENIED there, not UNAUTHENTICATED), its
 * message the frame's tail, nothing padded; a success's final frame carries no failure. */
static void test_guest_failures_are_failing_frames(void **unused)
{
    s_spawn_manager();
    t_reply_t r;
    s_create("guest-errors", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    const char *deny[] = {"deny", NULL};
    assert_int_equal(s_exec(id, deny, &s), KA_PERMISSION_DENIED);
    s_assert_frame_failure(&s, KA_PERMISSION_DENIED, "permission denied by the guest");
    assert_false(s.had_process);
    const char *huge[] = {"huge", NULL};
    assert_int_equal(s_exec(id, huge, &s), KA_RESOURCE_EXHAUSTED);
    s_assert_frame_failure(&s, KA_RESOURCE_EXHAUSTED, KA_MSG_FILE_TOO_LARGE);
    assert_int_equal(s_file(id, KA_GUEST_READ, "missing.txt", NULL, &s), KA_NOT_FOUND);
    s_assert_frame_failure(&s, KA_NOT_FOUND, "cannot open");
    const char *echo[] = {"echo", "on", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_OK); /* the sandbox serves on */
    assert_int_equal(s.final.err, 0);
    assert_string_equal(s.end.message, "");
    assert_true(s.final.has_process);
    assert_int_equal(s.final_len, sizeof s.final + s.final.tail_len); /* its argv, if any */
}

/* A delete (and its duplicate, a suspend, a guest call, a replayed create) while the create
 * runs: the create is answered READY, the delete then supersedes it. */
static void test_delete_during_create(void **unused)
{
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.gate_start = true;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_create_t c = s_create_req(ALICE, "racing", 0);
    s_answer_t create, replay, del, dup, susp;
    s_send(KA_SBX_CREATE, &c, sizeof c, &create);
    assert_true(f_wait(s_in_start, NULL, WAIT_MS));
    char id[KA_STORE_ID_LEN];
    snprintf(id, sizeof id, "%s", F.records[0].id);
    s_send(KA_SBX_CREATE, &c, sizeof c, &replay);
    ka_sbx_key_t k = s_key(ALICE, id);
    s_send(KA_SBX_DELETE, &k, sizeof k, &del);
    usleep(50 * 1000); /* the delete is queued before its duplicate */
    s_send(KA_SBX_DELETE, &k, sizeof k, &dup);
    s_send(KA_SBX_SUSPEND, &k, sizeof k, &susp);
    assert_int_equal(s_wait_answer(&dup), KA_ABORTED);
    assert_string_equal(dup.r.status.message, "a delete of this sandbox is running");
    assert_int_equal(s_wait_answer(&susp), KA_ABORTED);
    s_stream_t g;
    const char *echo[] = {"echo", "x", NULL};
    assert_int_equal(s_exec(id, echo, &g), KA_FAILED_PRECONDITION);
    f_open_gate();
    assert_int_equal(s_wait_answer(&create), KA_OK);
    assert_int_equal(create.r.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_wait_answer(&replay), KA_OK);
    assert_string_equal(replay.r.sandbox.id, id);
    assert_int_equal(s_wait_answer(&del), KA_OK);
    assert_int_equal(del.r.sandbox.state, KA_STATE_DELETED);
    s_assert_history(id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
    assert_int_equal(F.starts, 1);
    assert_int_equal(F.stops, 1);
}

/* The TTL ends while the create runs: the creator gets READY, then the expiry deletes it. */
static void test_ttl_during_create(void **unused)
{
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.gate_start = true;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_create_t c = s_create_req(ALICE, "ttl-create", 1000);
    s_answer_t create;
    s_send(KA_SBX_CREATE, &c, sizeof c, &create);
    assert_true(f_wait(s_in_start, NULL, WAIT_MS));
    usleep(1200 * 1000);
    f_open_gate();
    assert_int_equal(s_wait_answer(&create), KA_OK);
    assert_int_equal(create.r.sandbox.state, KA_STATE_READY);
    s_wait_state(create.r.sandbox.id, KA_STATE_DELETED);
    s_assert_history(create.r.sandbox.id,
                     "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
}

/* The guest exits while the create's READY is being written: the creator gets READY, then
 * the sandbox is FAILED (GuestExited). */
static void test_guest_exit_during_create(void **unused)
{
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.guest_dies = 1;
    F.hold_op = KA_OP_NONE; /* the READY write */
    pthread_mutex_unlock(&F.lock);
    ka_sbx_create_t c = s_create_req(ALICE, "dies-early", 0);
    s_answer_t create;
    s_send(KA_SBX_CREATE, &c, sizeof c, &create);
    assert_true(f_wait(s_held, NULL, WAIT_MS));
    usleep(100 * 1000); /* the guest's exit reaches the actor while it writes */
    f_release(T.sys, T.store);
    assert_int_equal(s_wait_answer(&create), KA_OK);
    const char *id = create.r.sandbox.id;
    s_wait_state(id, KA_STATE_FAILED);
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    s_assert_history(id, "CREATING/CREATE READY/NONE FAILED/NONE/GuestExited DELETING/DELETE "
                         "DELETED/NONE");
}

/* A delete while a suspend runs, and one while a resume runs: each waits for the operation,
 * which is answered, then supersedes it. */
static void test_delete_during_suspend_and_resume(void **unused)
{
    s_spawn_manager();
    t_reply_t a, b, o;
    s_create("del-susp", 0, &a);
    s_create("del-res", 0, &b);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, b.sandbox.id, &o), KA_OK);
    const int ops[2] = {KA_OP_SUSPEND, KA_OP_RESUME};
    const char *ids[2] = {a.sandbox.id, b.sandbox.id};
    const uint32_t types[2] = {KA_SBX_SUSPEND, KA_SBX_RESUME};
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&F.lock);
        F.hold_op = ops[i];
        pthread_mutex_unlock(&F.lock);
        ka_sbx_key_t k = s_key(ALICE, ids[i]);
        s_answer_t op, del;
        s_send(types[i], &k, sizeof k, &op);
        assert_true(f_wait(s_held, NULL, WAIT_MS));
        s_send(KA_SBX_DELETE, &k, sizeof k, &del);
        usleep(50 * 1000);
        f_release(T.sys, T.store);
        assert_int_equal(s_wait_answer(&op), KA_OK);
        assert_int_equal(op.r.sandbox.state, i ? KA_STATE_READY : KA_STATE_SUSPENDED);
        assert_int_equal(s_wait_answer(&del), KA_OK);
        assert_int_equal(del.r.sandbox.state, KA_STATE_DELETED);
    }
    s_assert_history(a.sandbox.id, "CREATING/CREATE READY/NONE READY/SUSPEND SUSPENDED/NONE "
                                   "DELETING/DELETE DELETED/NONE");
    s_assert_history(b.sandbox.id, "CREATING/CREATE READY/NONE READY/SUSPEND SUSPENDED/NONE "
                                   "SUSPENDED/RESUME READY/NONE DELETING/DELETE DELETED/NONE");
}

/* The driver fails the start: the creator gets the FAILED record (StartFailed), a delete
 * removes it. */
static void test_driver_failure_during_start(void **unused)
{
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.fail_start = 1;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_create_t c = s_create_req(ALICE, "nostart", 0);
    s_answer_t a;
    s_send(KA_SBX_CREATE, &c, sizeof c, &a);
    assert_int_equal(s_wait_answer(&a), KA_OK);
    assert_int_equal(a.r.sandbox.state, KA_STATE_FAILED);
    assert_string_equal(a.r.sandbox.failure_reason, KA_FAIL_START);
    const char *id = a.r.sandbox.id;
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    s_assert_history(id, "CREATING/CREATE FAILED/NONE/StartFailed DELETING/DELETE DELETED/NONE");
}

/* The TTL ends while a suspend's intent is being written: the suspend finishes and is
 * answered, then the expiry deletes the sandbox. */
static void test_ttl_during_suspend(void **unused)
{
    s_spawn_manager();
    t_reply_t r;
    s_create("short", 1000, &r);
    const char *id = r.sandbox.id;
    pthread_mutex_lock(&F.lock);
    F.hold_op = KA_OP_SUSPEND;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_key_t k = s_key(ALICE, id);
    s_answer_t susp;
    s_send(KA_SBX_SUSPEND, &k, sizeof k, &susp);
    assert_true(f_wait(s_held, NULL, WAIT_MS));
    usleep(1200 * 1000); /* past the TTL */
    f_release(T.sys, T.store);
    assert_int_equal(s_wait_answer(&susp), KA_OK);
    assert_int_equal(susp.r.sandbox.state, KA_STATE_SUSPENDED);
    s_wait_state(id, KA_STATE_DELETED);
    s_assert_history(id, "CREATING/CREATE READY/NONE READY/SUSPEND SUSPENDED/NONE "
                         "DELETING/DELETE DELETED/NONE");
}

/* The guest exits while an exec streams: the caller is told at once, the sandbox is FAILED
 * (GuestExited) and only a delete moves it on. */
static void test_guest_exit_during_exec(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("dies", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    const char *die[] = {"die", NULL};
    assert_int_equal(s_exec(id, die, &s), KA_UNAVAILABLE);
    s_wait_state(id, KA_STATE_FAILED);
    ka_store_sandbox_t rec;
    assert_true(f_record(id, &rec));
    assert_string_equal(rec.failure_reason, KA_FAIL_GUEST_EXITED);
    const char *echo[] = {"echo", "x", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_FAILED_PRECONDITION);
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    s_assert_history(id, "CREATING/CREATE READY/NONE FAILED/NONE/GuestExited DELETING/DELETE "
                         "DELETED/NONE");
}

/* The store fails a delete's intent: the caller is told to retry and the sandbox is usable as
 * it was; a tombstone the store fails is written again, and the caller waits for it. */
static void test_store_error_during_delete(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("storefail", 0, &r);
    const char *id = r.sandbox.id;
    pthread_mutex_lock(&F.lock);
    F.fail_writes = 1;
    F.fail_op = KA_OP_DELETE;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_UNAVAILABLE);
    assert_string_equal(o.status.message, "the sandbox store is unavailable; retry");
    s_stream_t s;
    const char *echo[] = {"echo", "still", "here", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_OK);
    pthread_mutex_lock(&F.lock);
    F.fail_writes = 2;
    F.fail_tombstone = true;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(F.fail_writes, 0);
    s_assert_history(id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
}

/* An expiry whose intent the store fails is tried again until the sandbox is deleted; a
 * caller's delete that failed leaves the TTL as it was. */
static void test_expiry_retries_when_store_fails(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("expire-retry", 1000, &r);
    s_create("delete-fails", 0, &o);
    pthread_mutex_lock(&F.lock);
    F.fail_writes = 1;
    F.fail_op = KA_OP_DELETE;
    pthread_mutex_unlock(&F.lock);
    s_wait_state(r.sandbox.id, KA_STATE_DELETED);
    s_assert_history(r.sandbox.id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
    pthread_mutex_lock(&F.lock);
    F.fail_writes = 1;
    pthread_mutex_unlock(&F.lock);
    t_reply_t refused;
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, o.sandbox.id, &refused), KA_UNAVAILABLE);
    usleep(1500 * 1000); /* no expiry retry for a caller's delete */
    ka_store_sandbox_t rec;
    assert_true(f_record(o.sandbox.id, &rec));
    assert_int_equal(rec.state, KA_STATE_READY);
}

/* A suspend whose result write fails: written again until it lands; a suspend whose halt fails:
 * FAILED (SuspendFailed), compute released, its unsaved /data kept until the delete. */
static void test_suspend_failures(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("susp-retry", 0, &r);
    pthread_mutex_lock(&F.lock);
    F.fail_writes = 2;
    F.fail_op = KA_OP_NONE;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, r.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    s_create("susp-halt", 0, &r);
    pthread_mutex_lock(&F.lock);
    F.fail_halt = 1;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, r.sandbox.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_FAILED);
    assert_string_equal(o.sandbox.failure_reason, KA_FAIL_SUSPEND);
    assert_int_equal(F.live, 0);
    assert_int_equal(F.n_kept, 1); /* its /data was not saved: kept until the delete */
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, r.sandbox.id, &o), KA_OK);
    assert_int_equal(F.n_kept, 0);
}

/* Every open stream ends: when its guest stops answering (deadline), and when the sandbox's
 * actor goes away (monitor). */
static void test_streams_never_wait_forever(void **unused)
{
    s_spawn_manager();
    t_reply_t r;
    s_create("hangs", 0, &r);
    s_stream_t s;
    const char *hang[] = {"hang", NULL};
    s_stream_start(s_exec_req(r.sandbox.id, hang), &s);
    assert_int_equal(s_stream_wait(&s, IDLE_MS * 10), KA_DEADLINE_EXCEEDED);
    assert_true(s.had_process);
    s_stream_start(s_exec_req(r.sandbox.id, hang), &s);
    usleep(50 * 1000);
    krt_system_kill(T.sys, T.sandboxes, KRT_EXIT_KILLED); /* its sandbox actors with it */
    assert_int_equal(s_stream_wait(&s, WAIT_MS), KA_UNAVAILABLE);
}

/* Concurrent duplicates: replayed creates join the running one; a second suspend while one
 * runs is ABORTED. */
static void test_duplicate_requests(void **unused)
{
    s_spawn_manager();
    ka_sbx_create_t c = s_create_req(ALICE, "dup", 0);
    s_answer_t a[4];
    for (int i = 0; i < 4; i++)
        s_send(KA_SBX_CREATE, &c, sizeof c, &a[i]);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s_wait_answer(&a[i]), KA_OK);
        assert_string_equal(a[i].r.sandbox.id, a[0].r.sandbox.id);
    }
    assert_int_equal(F.starts, 1);
    const char *id = a[0].r.sandbox.id;
    pthread_mutex_lock(&F.lock);
    F.hold_op = KA_OP_SUSPEND;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_key_t k = s_key(ALICE, id);
    s_answer_t s1, s2, res;
    s_send(KA_SBX_SUSPEND, &k, sizeof k, &s1);
    assert_true(f_wait(s_held, NULL, WAIT_MS));
    s_send(KA_SBX_SUSPEND, &k, sizeof k, &s2);
    s_send(KA_SBX_RESUME, &k, sizeof k, &res);
    assert_int_equal(s_wait_answer(&s2), KA_ABORTED);
    assert_int_equal(s_wait_answer(&res), KA_ABORTED);
    f_release(T.sys, T.store);
    assert_int_equal(s_wait_answer(&s1), KA_OK);
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* A record of ALICE's on node-fsm, rev-1, an hour to live. */
static ka_store_sandbox_t s_rec(const char *id, const char *request_id, int state)
{
    ka_store_sandbox_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.id, sizeof r.id, "%s", id);
    snprintf(r.creator, sizeof r.creator, ALICE);
    snprintf(r.request_id, sizeof r.request_id, "%s", request_id);
    snprintf(r.revision, sizeof r.revision, "rev-1");
    snprintf(r.node, sizeof r.node, "node-fsm");
    r.state = state;
    r.expires_ms = krt_wall_ms() + 3600000;
    return r;
}

/* A record that was READY when its node died comes back SUSPENDED with reason ComputeLost, its
 * TTL unchanged; a resume boots it again; one that was being created is FAILED. */
static void test_recovery_compute_lost(void **unused)
{
    ka_store_sandbox_t live =
        s_rec("0198f000-0000-7000-8000-00000000abcd", "was-live", KA_STATE_READY);
    f_put_record(&live);
    ka_store_sandbox_t creating = live;
    snprintf(creating.id, sizeof creating.id, "0198f000-0000-7000-8000-00000000abce");
    snprintf(creating.request_id, sizeof creating.request_id, "was-creating");
    creating.state = KA_STATE_CREATING;
    creating.operation = KA_OP_CREATE;
    f_put_record(&creating);
    s_spawn_manager();
    s_wait_state(live.id, KA_STATE_SUSPENDED);
    s_wait_state(creating.id, KA_STATE_FAILED);
    ka_store_sandbox_t rec;
    assert_true(f_record(live.id, &rec));
    assert_string_equal(rec.failure_reason, KA_FAIL_COMPUTE_LOST);
    assert_int_equal(rec.expires_ms, live.expires_ms);
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, live.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_string_equal(o.sandbox.failure_reason, "");
    assert_int_equal(o.sandbox.expires_ms, live.expires_ms);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, live.id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, creating.id, &o), KA_OK);
    s_assert_history(live.id, "SUSPENDED/NONE/ComputeLost SUSPENDED/RESUME READY/NONE "
                              "DELETING/DELETE DELETED/NONE");
    s_assert_history(creating.id, "FAILED/NONE/ComputeLost DELETING/DELETE DELETED/NONE");
}

static int s_counter(const int *p)
{
    pthread_mutex_lock(&F.lock);
    int v = *p;
    pthread_mutex_unlock(&F.lock);
    return v;
}

/* Keeps /data for id as a crashed run would have left it (a directory of its own). */
static void s_keep(const char *id)
{
    pthread_mutex_lock(&F.lock);
    int i = F.n_kept++;
    snprintf(F.kept[i].id, sizeof F.kept[i].id, "%s", id);
    snprintf(F.kept[i].data, sizeof F.kept[i].data, "%.3000s/data-%s-0", T.dir, id);
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(mkdir(F.kept[i].data, 0755), 0);
}

static bool s_one_kept(void *arg)
{
    return F.n_kept == 1;
}

/* A manager starting reads the record of every /data the driver kept and discards what is no
 * longer its own: deleted, another node's (taken over meanwhile), or with no record; its own
 * stays for the ComputeLost resume. */
static void test_start_discards_what_is_not_its_own(void **unused)
{
    ka_store_sandbox_t mine = s_rec("0198f000-0000-7000-8000-0000000000a1", "mine", KA_STATE_READY);
    f_put_record(&mine);
    ka_store_sandbox_t taken =
        s_rec("0198f000-0000-7000-8000-0000000000a2", "taken", KA_STATE_FAILED);
    snprintf(taken.node, sizeof taken.node, "node-other");
    f_put_record(&taken);
    ka_store_sandbox_t deleted =
        s_rec("0198f000-0000-7000-8000-0000000000a3", "deleted", KA_STATE_DELETED);
    deleted.deleted_ms = krt_wall_ms();
    f_put_record(&deleted);
    const char *unknown = "0198f000-0000-7000-8000-0000000000a4";
    s_keep(mine.id);
    s_keep(taken.id);
    s_keep(deleted.id);
    s_keep(unknown);
    s_spawn_manager();
    assert_true(f_wait(s_one_kept, NULL, WAIT_MS));
    char data[PATH_MAX];
    pthread_mutex_lock(&F.lock);
    assert_string_equal(F.kept[0].id, mine.id);
    snprintf(data, sizeof data, "%s", F.kept[0].data);
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(access(data, F_OK), 0);
    const char *gone[] = {taken.id, deleted.id, unknown};
    for (size_t i = 0; i < 3; i++) {
        snprintf(data, sizeof data, "%.3000s/data-%s-0", T.dir, gone[i]);
        assert_int_not_equal(access(data, F_OK), 0);
    }
    s_wait_state(mine.id, KA_STATE_SUSPENDED);
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, mine.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, mine.id, &o), KA_OK);
    assert_int_equal(s_counter(&F.n_kept), 0);
}

/* The sandboxes manager goes away with a READY sandbox (its actor parks the compute): the next
 * manager finds it SUSPENDED (ComputeLost) and a resume boots it on the same /data. */
static void test_manager_restart_keeps_data(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("keep", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    assert_int_equal(s_file(id, KA_GUEST_WRITE, "acked.txt", "acked", &s), KA_OK);
    krt_system_kill(T.sys, T.sandboxes, KRT_EXIT_KILLED);
    assert_int_not_equal(krt_system_wait(T.sys, T.sandboxes, WAIT_MS), KRT_ETIMEDOUT);
    usleep(50 * 1000); /* its sandbox actor's terminate parks the compute */
    s_spawn_manager();
    s_wait_state(id, KA_STATE_SUSPENDED);
    ka_store_sandbox_t rec;
    assert_true(f_record(id, &rec));
    assert_string_equal(rec.failure_reason, KA_FAIL_COMPUTE_LOST);
    assert_int_equal(rec.expires_ms, r.sandbox.expires_ms);
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_file(id, KA_GUEST_READ, "acked.txt", NULL, &s), KA_OK);
    assert_int_equal(s.out_len, 5);
    assert_memory_equal(s.out, "acked", 5);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(F.n_kept, 0); /* delete removes the data */
}

/* ---- pause --------------------------------------------------------------------------------- */

/* Pause freezes (the record stays READY, the reply says paused), refuses guest calls, suspend,
 * resume and a second unpause clearly; unpause thaws and guest calls work again. Nothing of it
 * is written to the store. */
static void test_pause_unpause(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("pause", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    const char *echo[] = {"echo", "hi", NULL};
    assert_int_equal(s_life(KA_SBX_UNPAUSE, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_string_equal(o.status.message, "the sandbox is not paused");
    assert_int_equal(s_life(KA_SBX_PAUSE, BOB, id, &o), KA_NOT_FOUND);
    assert_int_equal(s_counter(&F.freezes), 0);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK);
    assert_true(o.paused);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_counter(&F.frozen), 1);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK); /* already paused: as it is */
    assert_true(o.paused);
    assert_int_equal(s_counter(&F.freezes), 1);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, id, &o), KA_OK); /* a get shows it */
    assert_true(o.paused);
    assert_int_equal(o.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_exec(id, echo, &s), KA_FAILED_PRECONDITION);
    assert_string_equal(s.end.message, "sandbox is paused; unpause it first");
    assert_int_equal(s_file(id, KA_GUEST_READ, "x", NULL, &s), KA_FAILED_PRECONDITION);
    assert_string_equal(s.end.message, "sandbox is paused; unpause it first");
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_string_equal(o.status.message, "sandbox is paused; unpause it first");
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_int_equal(s_life(KA_SBX_UNPAUSE, ALICE, id, &o), KA_OK);
    assert_false(o.paused);
    assert_int_equal(s_counter(&F.frozen), 0);
    assert_int_equal(s_counter(&F.thaws), 1);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, id, &o), KA_OK);
    assert_false(o.paused);
    assert_int_equal(s_exec(id, echo, &s), KA_OK);
    assert_int_equal(s.out_len, 3);
    assert_memory_equal(s.out, "hi\n", 3);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    s_assert_history(id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
}

/* A freeze the driver refuses: the caller gets UNAVAILABLE with the reason, the sandbox stays
 * READY and serves guest calls. */
static void test_pause_fails(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("pause-fails", 0, &r);
    const char *id = r.sandbox.id;
    pthread_mutex_lock(&F.lock);
    F.fail_freeze = 1;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_UNAVAILABLE);
    assert_non_null(strstr(o.status.message, "pausing the sandbox failed"));
    s_stream_t s;
    const char *echo[] = {"echo", "hi", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_OK);
    assert_int_equal(s_life(KA_SBX_UNPAUSE, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* Delete of a paused sandbox thaws it, then stops it as from READY. */
static void test_delete_while_paused(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("pause-del", 0, &r);
    const char *id = r.sandbox.id;
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    assert_false(o.paused);
    assert_int_equal(s_counter(&F.thaws), 1);
    assert_int_equal(s_counter(&F.stopped_frozen), 0);
    assert_int_equal(s_counter(&F.stops), 1);
    s_assert_history(id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
}

/* The TTL keeps running while paused: the expiry thaws and deletes it. */
static void test_ttl_while_paused(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("pause-ttl", 1000, &r);
    const char *id = r.sandbox.id;
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK);
    s_wait_state(id, KA_STATE_DELETED);
    assert_int_equal(s_counter(&F.thaws), 1);
    assert_int_equal(s_counter(&F.stopped_frozen), 0);
    s_assert_history(id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
}

/* Pause and unpause while the create runs are refused (ABORTED: retry later) and change
 * nothing; the create ends READY, not paused. */
static void test_pause_during_create(void **unused)
{
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.gate_start = true;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_create_t c = s_create_req(ALICE, "pause-create", 0);
    s_answer_t create, pause, unpause;
    s_send(KA_SBX_CREATE, &c, sizeof c, &create);
    assert_true(f_wait(s_in_start, NULL, WAIT_MS));
    char id[KA_STORE_ID_LEN];
    snprintf(id, sizeof id, "%s", F.records[0].id);
    ka_sbx_key_t k = s_key(ALICE, id);
    s_send(KA_SBX_PAUSE, &k, sizeof k, &pause);
    assert_int_equal(s_wait_answer(&pause), KA_ABORTED);
    s_send(KA_SBX_UNPAUSE, &k, sizeof k, &unpause);
    assert_int_equal(s_wait_answer(&unpause), KA_ABORTED);
    f_open_gate();
    assert_int_equal(s_wait_answer(&create), KA_OK);
    assert_false(create.r.paused);
    assert_int_equal(s_counter(&F.freezes), 0);
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* A guest call open when the sandbox is paused waits (its idle deadline stops), and its idle
 * time starts again at unpause. */
static void test_open_call_waits_while_paused(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("pause-open", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    const char *hang[] = {"hang", NULL};
    s_stream_start(s_exec_req(id, hang), &s);
    usleep(50 * 1000);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK);
    usleep(IDLE_MS * 3 * 1000);
    assert_int_equal(s_counter(&s.finals), 0); /* not failed while paused */
    assert_int_equal(s_life(KA_SBX_UNPAUSE, ALICE, id, &o), KA_OK);
    usleep(IDLE_MS / 2 * 1000);
    assert_int_equal(s_counter(&s.finals), 0); /* its idle time started again */
    assert_int_equal(s_stream_wait(&s, IDLE_MS * 10), KA_DEADLINE_EXCEEDED);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* A suspended sandbox cannot be paused: it has no processes. */
static void test_pause_suspended(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("pause-susp", 0, &r);
    const char *id = r.sandbox.id;
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_FAILED_PRECONDITION);
    assert_string_equal(o.status.message,
                        "cannot pause a sandbox in state RUNTIME_STATE_SUSPENDED");
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* ---- warm pools ---------------------------------------------------------------------------- */

#define WARM_QUIET_MS 50

/* The manager keeps `warm` sandboxes per revision of WorkerPool kagent-default. */
static void s_warm_args(int warm, int64_t capacity)
{
    T.args.n_warm = 1;
    T.args.warm[0] = (ka_warm_cfg_t){.name = "kagent-default", .warm = warm, .capacity = capacity};
    snprintf(T.args.warm_dir, sizeof T.args.warm_dir, "%.500s/warm", T.dir);
    T.args.warm_quiet_ms = WARM_QUIET_MS;
}

static void s_count(ka_sbx_count_t *out)
{
    krt_reply_t r;
    assert_int_equal(ka_svc_call_sync(T.svc, KA_SBX_COUNT, NULL, 0, WAIT_MS, &r), KA_OK);
    assert_int_equal(r.len, sizeof *out);
    memcpy(out, r.body, sizeof *out);
    krt_reply_free(&r);
}

/* Waits until kagent/scratch has `ready` warm sandboxes of revision rev and none booting. */
static void s_wait_depth(const char *rev, uint32_t ready)
{
    int64_t until = krt_mono_ms() + WAIT_MS;
    ka_sbx_count_t c;
    for (;;) {
        s_count(&c);
        if (c.n_warm == 1 && c.warm[0].ready == ready && c.warm[0].booting == 0 &&
            !strcmp(c.warm[0].revision, rev) && !strcmp(c.warm[0].template_name, "scratch"))
            return;
        if (krt_mono_ms() > until)
            fail_msg("warm pools: n=%u ready=%u booting=%u revision=%s; want %u of %s", c.n_warm,
                     c.n_warm ? c.warm[0].ready : 0, c.n_warm ? c.warm[0].booting : 0,
                     c.n_warm ? c.warm[0].revision : "", ready, rev);
        usleep(2000);
    }
}

/* The store says kagent/scratch changed (as a NOTIFY would). */
static void s_template_event(void)
{
    ka_store_event_t ev;
    memset(&ev, 0, sizeof ev);
    snprintf(ev.channel, sizeof ev.channel, "ka_template");
    snprintf(ev.payload, sizeof ev.payload, "kagent/scratch 1");
    assert_int_equal(krt_system_send(T.sys, T.sandboxes, KA_STORE_EVENT, &ev, sizeof ev), 0);
}

/* Marker files of warm ids. */
static int s_markers(void)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "ls %s/warm | wc -l", T.dir);
    FILE *f = popen(cmd, "r");
    int n = -1;
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%d", &n), 1);
    pclose(f);
    return n;
}

static bool s_stops_at_least(void *arg)
{
    return F.stops >= *(int *)arg;
}

/* A create of a revision with warm sandboxes claims one: one READY commit under its id, the
 * caller's owner and TTL, the template env in each process; a replay gets the same sandbox and
 * puts nothing back; the pool refills after the quiet period; the first create (the template
 * not yet known) was a miss and booted cold. */
static void test_warm_claim_and_refill(void **unused)
{
    s_warm_args(2, 0);
    s_spawn_manager();
    t_reply_t cold, w, again, o;
    s_create("cold", 0, &cold);
    s_assert_history(cold.sandbox.id, "CREATING/CREATE READY/NONE");
    s_wait_depth("rev-1", 2);
    assert_int_equal(s_markers(), 2);
    assert_int_equal(s_counter(&F.live), 3);
    s_create("warm", 600000, &w);
    const char *id = w.sandbox.id;
    s_assert_history(id, "READY/NONE"); /* one commit */
    assert_int_equal(ka_check_uuid(id), 0);
    assert_string_equal(w.sandbox.creator, ALICE);
    assert_string_equal(w.sandbox.request_id, "warm");
    assert_string_equal(w.sandbox.revision, "rev-1");
    assert_int_equal(w.sandbox.expires_ms - w.sandbox.created_ms, 600000);
    s_stream_t s;
    const char *env[] = {"env", NULL};
    assert_int_equal(s_exec(id, env, &s), KA_OK);
    assert_int_equal(s.out_len, strlen("LANG=C.UTF-8\n"));
    assert_memory_equal(s.out, "LANG=C.UTF-8\n", s.out_len);
    s_create("warm", 600000, &again); /* replay: the same sandbox */
    assert_string_equal(again.sandbox.id, id);
    s_assert_history(id, "READY/NONE");
    s_wait_depth("rev-1", 2);
    ka_sbx_count_t c;
    s_count(&c);
    assert_int_equal(c.warm_hits, 1);
    assert_int_equal(c.warm_misses, 1);
    assert_int_equal(c.warm_refills, 3); /* 2, then 1 for the claim; the replay's went back */
    assert_int_equal(c.live, 2);
    assert_int_equal(s_markers(), 2); /* the claimed one's went: it is nobody's warm sandbox */
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, cold.sandbox.id, &o), KA_OK);
}

/* A warm guest that died is stopped and replaced, never handed out. */
static void test_warm_dead_guest_not_handed_out(void **unused)
{
    s_warm_args(1, 0);
    pthread_mutex_lock(&F.lock);
    F.guest_dies = 1; /* the first warm boot's guest exits at once */
    pthread_mutex_unlock(&F.lock);
    s_spawn_manager();
    s_template_event();
    int one = 1;
    assert_true(f_wait(s_stops_at_least, &one, WAIT_MS));
    s_wait_depth("rev-1", 1);
    assert_int_equal(s_counter(&F.starts), 2);
    t_reply_t w, o;
    s_create("after-death", 0, &w);
    s_assert_history(w.sandbox.id, "READY/NONE");
    s_stream_t s;
    const char *echo[] = {"echo", "alive", NULL};
    assert_int_equal(s_exec(w.sandbox.id, echo, &s), KA_OK);
    assert_memory_equal(s.out, "alive\n", 6);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, w.sandbox.id, &o), KA_OK);
}

/* A new revision of the template rebuilds its pool: the old warm sandboxes are stopped. */
static void test_warm_rebuilt_for_new_revision(void **unused)
{
    s_warm_args(2, 0);
    s_spawn_manager();
    s_template_event();
    s_wait_depth("rev-1", 2);
    pthread_mutex_lock(&F.lock);
    snprintf(F.revision, sizeof F.revision, "rev-2");
    pthread_mutex_unlock(&F.lock);
    s_template_event();
    s_wait_depth("rev-2", 2);
    int two = 2;
    assert_true(f_wait(s_stops_at_least, &two, WAIT_MS));
    assert_int_equal(s_counter(&F.live), 2);
    t_reply_t w, o;
    s_create("new-rev", 0, &w);
    s_assert_history(w.sandbox.id, "READY/NONE");
    assert_string_equal(w.sandbox.revision, "rev-2");
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, w.sandbox.id, &o), KA_OK);
}

/* warm 0: every create boots cold, nothing is kept booted. */
static void test_warm_zero_disables(void **unused)
{
    s_warm_args(0, 0);
    s_spawn_manager();
    s_template_event();
    t_reply_t a, b, o;
    s_create("cold-a", 0, &a);
    s_create("cold-b", 0, &b);
    s_assert_history(b.sandbox.id, "CREATING/CREATE READY/NONE");
    usleep(4 * WARM_QUIET_MS * 1000); /* past the quiet period: no refill may start */
    assert_int_equal(s_counter(&F.starts), 2);
    ka_sbx_count_t c;
    s_count(&c);
    assert_int_equal(c.n_warm, 0);
    assert_int_equal(c.warm_hits + c.warm_misses + c.warm_refills, 0);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, a.sandbox.id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, b.sandbox.id, &o), KA_OK);
}

/* Live and warm sandboxes together stay within the pool's capacity; a delete makes room, and
 * the pool fills it with no create after it. */
static void test_warm_within_capacity(void **unused)
{
    s_warm_args(2, 2);
    s_spawn_manager();
    t_reply_t a, o;
    s_create("cap", 0, &a);
    s_wait_depth("rev-1", 1); /* 1 live + 1 warm */
    usleep(4 * WARM_QUIET_MS * 1000);
    s_wait_depth("rev-1", 1);
    assert_int_equal(s_counter(&F.live), 2);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, a.sandbox.id, &o), KA_OK);
    s_wait_depth("rev-1", 2);
}

/* ---- pool capacity ------------------------------------------------------------------------- */

#define FULL_2                                                                                     \
    "pool kagent-default on node node-fsm is full (2 of 2 sandboxes); delete one or retry later"

/* A create by ALICE, waited for: its code; *out its reply. */
static int s_try_create(const char *request_id, t_reply_t *out)
{
    ka_sbx_create_t c = s_create_req(ALICE, request_id, 0);
    s_answer_t a;
    s_send(KA_SBX_CREATE, &c, sizeof c, &a);
    int code = s_wait_answer(&a);
    if (out)
        *out = a.r;
    return code;
}

/* Capacity 2: two creates go, the third is refused RESOURCE_EXHAUSTED and leaves nothing (no
 * record, no compute, its request id unused); a replay of a created one is still answered, a
 * deleted one's too; a suspended sandbox keeps its room (it resumes here); a delete makes room,
 * and the refused request id then creates. */
static void test_capacity_refuses_past_full(void **unused)
{
    s_warm_args(0, 2);
    s_spawn_manager();
    t_reply_t a, b, c, r, o;
    s_create("cap-a", 0, &a);
    s_create("cap-b", 0, &b);
    assert_int_equal(s_try_create("cap-c", &r), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(r.status.message, FULL_2);
    assert_int_equal(s_counter(&F.n_records), 2);
    assert_int_equal(s_counter(&F.starts), 2);
    assert_int_equal(s_counter(&F.receipts), 1);
    assert_int_equal(s_try_create("cap-a", &r), KA_OK); /* a replay: its sandbox */
    assert_string_equal(r.sandbox.id, a.sandbox.id);
    assert_int_equal(r.sandbox.state, KA_STATE_READY);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, b.sandbox.id, &o), KA_OK);
    assert_int_equal(s_try_create("cap-c", &r), KA_RESOURCE_EXHAUSTED);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, a.sandbox.id, &o), KA_OK);
    s_create("cap-c", 0, &c); /* the refused request id, now with room */
    assert_int_equal(s_counter(&F.n_records), 3);
    assert_int_equal(s_try_create("cap-a", &r), KA_OK); /* full: the tombstone's replay */
    assert_string_equal(r.sandbox.id, a.sandbox.id);
    assert_int_equal(r.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(s_try_create("cap-d", &r), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(r.status.message, FULL_2);
    assert_int_equal(s_counter(&F.n_records), 3);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, b.sandbox.id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, c.sandbox.id, &o), KA_OK);
}

typedef struct {
    s_answer_t *a;
    int n, want;
} s_some_t;

static bool s_some_answered(void *arg)
{
    const s_some_t *w = arg;
    int got = 0;
    for (int i = 0; i < w->n; i++)
        got += w->a[i].n > 0;
    return got >= w->want;
}

static bool s_three_records(void *arg)
{
    return F.n_records == 3;
}

/* Creates arriving together never overshoot: each is admitted in the manager's turn, so with
 * capacity 3 and 8 at once, 3 boot and 5 are refused while those 3 are still CREATING. */
static void test_capacity_concurrent_creates(void **unused)
{
    enum { N = 8 };
    s_warm_args(0, 3);
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.gate_start = true;
    pthread_mutex_unlock(&F.lock);
    s_answer_t a[N];
    for (int i = 0; i < N; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "burst-%d", i);
        ka_sbx_create_t c = s_create_req(ALICE, rid, 0);
        s_send(KA_SBX_CREATE, &c, sizeof c, &a[i]);
    }
    s_some_t refused = {a, N, N - 3};
    assert_true(f_wait(s_some_answered, &refused, WAIT_MS));
    assert_true(f_wait(s_three_records, NULL, WAIT_MS));
    usleep(50 * 1000);
    s_some_t more = {a, N, N - 2}; /* the 3 admitted wait at the gate: nobody else answered */
    pthread_mutex_lock(&F.lock);
    bool answered = s_some_answered(&more);
    int records = F.n_records;
    pthread_mutex_unlock(&F.lock);
    assert_false(answered);
    assert_int_equal(records, 3);
    f_open_gate();
    int ok = 0, full = 0;
    for (int i = 0; i < N; i++) {
        int code = s_wait_answer(&a[i]);
        ok += code == KA_OK;
        full += code == KA_RESOURCE_EXHAUSTED;
    }
    assert_int_equal(ok, 3);
    assert_int_equal(full, N - 3);
    assert_int_equal(s_counter(&F.starts), 3);
    t_reply_t o;
    for (int i = 0; i < N; i++)
        if (a[i].code == KA_OK)
            assert_int_equal(s_life(KA_SBX_DELETE, ALICE, a[i].r.sandbox.id, &o), KA_OK);
}

/* A sandbox whose boot failed holds nothing (FAILED, no compute): it takes no room. */
static void test_capacity_failed_boot_takes_no_room(void **unused)
{
    s_warm_args(0, 1);
    s_spawn_manager();
    pthread_mutex_lock(&F.lock);
    F.fail_start = 1;
    pthread_mutex_unlock(&F.lock);
    t_reply_t f, a, r, o;
    assert_int_equal(s_try_create("fails", &f), KA_OK);
    assert_int_equal(f.sandbox.state, KA_STATE_FAILED);
    s_create("after-fail", 0, &a);
    assert_int_equal(s_try_create("over", &r), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(r.status.message, "pool kagent-default on node node-fsm is full (1 of 1 "
                                          "sandboxes); delete one or retry later");
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, f.sandbox.id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, a.sandbox.id, &o), KA_OK);
}

/* Warm sandboxes never take a create's room: a claim keeps the total (live + warm) where it
 * was, a full pool keeps none warm, and the room a delete leaves is warm until a create claims
 * it. */
static void test_capacity_with_warm_pool(void **unused)
{
    s_warm_args(1, 2);
    s_spawn_manager();
    t_reply_t a, b, c, r, o;
    s_create("w-a", 0, &a);   /* cold: the template was not known yet */
    s_wait_depth("rev-1", 1); /* 1 live + 1 warm: the capacity */
    s_create("w-b", 0, &b);   /* claims the warm one */
    s_assert_history(b.sandbox.id, "READY/NONE");
    assert_int_equal(s_try_create("w-c", &r), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(r.status.message, FULL_2);
    usleep(4 * WARM_QUIET_MS * 1000);
    s_wait_depth("rev-1", 0); /* no room for a warm one either */
    assert_int_equal(s_counter(&F.live), 2);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, a.sandbox.id, &o), KA_OK);
    s_wait_depth("rev-1", 1);
    s_create("w-c", 0, &c); /* the refused request id claims the room's warm sandbox */
    s_assert_history(c.sandbox.id, "READY/NONE");
    assert_int_equal(s_try_create("w-d", &r), KA_RESOURCE_EXHAUSTED);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, b.sandbox.id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, c.sandbox.id, &o), KA_OK);
}

static bool s_none_live(void *arg)
{
    return F.live == 0;
}

static bool s_nothing_kept(void *arg)
{
    return F.n_kept == 0;
}

/* A manager that stops stops its warm sandboxes (no record, no marker left); one that starts
 * discards the /data a crashed run's warm sandboxes left kept, named by their markers. */
static void test_warm_restart_leaves_nothing(void **unused)
{
    const char *leftover = "0198aaaa-0000-4000-8000-000000000001";
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/warm", T.dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/warm/%s", T.dir, leftover);
    FILE *m = fopen(path, "w");
    assert_non_null(m);
    fclose(m);
    pthread_mutex_lock(&F.lock);
    snprintf(F.kept[0].id, sizeof F.kept[0].id, "%s", leftover);
    snprintf(F.kept[0].data, sizeof F.kept[0].data, "%.3000s/data-%s-0", T.dir, leftover);
    F.n_kept = 1;
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(mkdir(F.kept[0].data, 0755), 0);
    s_warm_args(2, 0);
    s_spawn_manager();
    assert_true(f_wait(s_nothing_kept, NULL, WAIT_MS));
    assert_int_not_equal(access(F.kept[0].data, F_OK), 0);
    s_template_event();
    s_wait_depth("rev-1", 2);
    assert_int_equal(access(path, F_OK), -1); /* the leftover's marker went with it */
    krt_system_kill(T.sys, T.sandboxes, KRT_EXIT_KILLED);
    assert_int_not_equal(krt_system_wait(T.sys, T.sandboxes, WAIT_MS), KRT_ETIMEDOUT);
    assert_true(f_wait(s_none_live, NULL, WAIT_MS)); /* its terminate stopped them */
    for (int64_t until = krt_mono_ms() + WAIT_MS; s_markers() && krt_mono_ms() < until;)
        usleep(2000); /* ... then removed their markers */
    assert_int_equal(s_markers(), 0);
    assert_int_equal(s_counter(&F.n_records), 0); /* warm sandboxes are nobody's records */
    assert_int_equal(s_counter(&F.n_kept), 0);
    s_spawn_manager(); /* recovery finds nothing of them */
    s_template_event();
    s_wait_depth("rev-1", 2);
    assert_int_equal(s_counter(&F.n_records), 0);
}

/* ---- fork ---------------------------------------------------------------------------------- */

static ka_sbx_fork_t s_fork_req(const char *caller, const char *id, const char *rid, int count)
{
    ka_sbx_fork_t q;
    memset(&q, 0, sizeof q);
    snprintf(q.caller, sizeof q.caller, "%s", caller);
    snprintf(q.id, sizeof q.id, "%s", id);
    snprintf(q.request_id, sizeof q.request_id, "%s", rid);
    q.count = count;
    return q;
}

/* A fork call, waited for: its code, the forks' ids into ids (count of them), the message. */
static int s_fork(const char *caller, const char *id, const char *rid, int count,
                  char ids[][KA_STORE_ID_LEN], char *message, size_t cap)
{
    ka_sbx_fork_t q = s_fork_req(caller, id, rid, count);
    krt_reply_t rep;
    int code = ka_svc_call_sync(T.svc, KA_SBX_FORK, &q, sizeof q, WAIT_MS, &rep);
    const ka_sbx_list_t *l = rep.body;
    if (message)
        snprintf(message, cap, "%s", code == KA_OK ? "" : (const char *)rep.body);
    if (code == KA_OK) {
        assert_int_equal(rep.len, sizeof *l + (size_t)count * sizeof l->items[0]);
        assert_int_equal(l->count, count);
        for (int i = 0; i < count; i++) {
            assert_int_equal(l->items[i].state, KA_STATE_READY);
            assert_string_equal(l->items[i].creator, caller);
            snprintf(ids[i], KA_STORE_ID_LEN, "%s", l->items[i].id);
        }
    }
    krt_reply_free(&rep);
    return code;
}

/* Fork: the source is frozen while each fork's copy is made and thawed after; the forks are
 * READY, owned by the caller, boot on their own copy of /data (later writes stay on their
 * side); a replay answers the same forks without copying again; another identity, a bad count
 * and a bad id are refused and change nothing. */
static void test_fork(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("fork-src", 0, &r);
    const char *id = r.sandbox.id;
    s_stream_t s;
    assert_int_equal(s_file(id, KA_GUEST_WRITE, "a.txt", "before", &s), KA_OK);
    char ids[3][KA_STORE_ID_LEN], again[3][KA_STORE_ID_LEN], msg[KA_MSG_LEN];
    assert_int_equal(s_fork(ALICE, id, "f1", 3, ids, msg, sizeof msg), KA_OK);
    assert_int_equal(s_counter(&F.forks), 3);
    assert_int_equal(s_counter(&F.forks_frozen), 3);
    assert_int_equal(s_counter(&F.freezes), 1);
    assert_int_equal(s_counter(&F.thaws), 1);
    assert_int_equal(s_counter(&F.frozen), 0);
    assert_string_not_equal(ids[0], ids[1]);
    assert_string_not_equal(ids[1], ids[2]);
    assert_int_equal(s_file(id, KA_GUEST_WRITE, "a.txt", "after", &s), KA_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(s_file(ids[i], KA_GUEST_READ, "a.txt", NULL, &s), KA_OK);
        assert_int_equal(s.out_len, 6);
        assert_memory_equal(s.out, "before", 6);
        s_assert_history(ids[i], "CREATING/CREATE READY/NONE");
    }
    assert_int_equal(s_file(ids[0], KA_GUEST_WRITE, "mine", "x", &s), KA_OK);
    assert_int_equal(s_file(ids[1], KA_GUEST_READ, "mine", NULL, &s), KA_NOT_FOUND);
    assert_int_equal(s_fork(ALICE, id, "f1", 3, again, NULL, 0), KA_OK); /* a replay */
    for (int i = 0; i < 3; i++)
        assert_string_equal(again[i], ids[i]);
    assert_int_equal(s_counter(&F.forks), 3);
    assert_int_equal(s_fork(BOB, id, "f2", 1, again, msg, sizeof msg), KA_NOT_FOUND);
    assert_string_equal(msg, KA_MSG_NOT_FOUND);
    assert_int_equal(s_fork(ALICE, id, "f3", 17, again, msg, sizeof msg), KA_INVALID_ARGUMENT);
    assert_string_equal(msg, "count must be between 1 and 16");
    assert_int_equal(s_fork(ALICE, id, "f3", 0, again, msg, sizeof msg), KA_INVALID_ARGUMENT);
    assert_int_equal(s_fork(ALICE, "not-a-uuid", "f3", 1, again, msg, sizeof msg),
                     KA_INVALID_ARGUMENT);
    assert_string_equal(msg, KA_MSG_NOT_UUID);
    assert_int_equal(s_counter(&F.forks), 3);
    s_assert_history(id, "CREATING/CREATE READY/NONE"); /* the source's fork is not persisted */
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_fork(ALICE, id, "f1", 3, again, NULL, 0), KA_OK); /* replay: as create's */
    for (int i = 0; i < 3; i++)
        assert_string_equal(again[i], ids[i]);
    assert_int_equal(s_fork(ALICE, id, "f4", 1, again, msg, sizeof msg), KA_NOT_FOUND);
    assert_string_equal(msg, KA_MSG_NOT_FOUND);
    for (int i = 0; i < 3; i++)
        assert_int_equal(s_life(KA_SBX_DELETE, ALICE, ids[i], &o), KA_OK);
}

/* A copy that does not fit (the driver's -EDQUOT): RESOURCE_EXHAUSTED with the reason, the
 * source thawed and serving, the forks' records tombstoned, nothing kept for them. */
static void test_fork_fails(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("fork-fail-src", 0, &r);
    const char *id = r.sandbox.id;
    pthread_mutex_lock(&F.lock);
    F.fail_fork = 1;
    pthread_mutex_unlock(&F.lock);
    char ids[2][KA_STORE_ID_LEN], msg[KA_MSG_LEN];
    assert_int_equal(s_fork(ALICE, id, "ff", 2, ids, msg, sizeof msg), KA_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "do not fit a fork's disk quota"));
    assert_int_equal(s_counter(&F.frozen), 0);
    assert_int_equal(s_counter(&F.thaws), 1);
    assert_int_equal(s_counter(&F.n_kept), 0);
    s_wait_state("0198f000-0000-7000-8000-000000000002", KA_STATE_DELETED);
    s_wait_state("0198f000-0000-7000-8000-000000000003", KA_STATE_DELETED);
    s_stream_t s;
    const char *echo[] = {"echo", "hi", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* Fork of a paused, a suspended and a creating sandbox: refused with the table's messages. */
static void test_fork_refusals(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("fork-ref", 0, &r);
    const char *id = r.sandbox.id;
    char ids[1][KA_STORE_ID_LEN], msg[KA_MSG_LEN];
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_fork(ALICE, id, "fr1", 1, ids, msg, sizeof msg), KA_FAILED_PRECONDITION);
    assert_string_equal(msg, "sandbox is paused; unpause it first");
    assert_int_equal(s_life(KA_SBX_UNPAUSE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    assert_int_equal(s_fork(ALICE, id, "fr2", 1, ids, msg, sizeof msg), KA_FAILED_PRECONDITION);
    assert_string_equal(msg, "cannot fork a sandbox in state RUNTIME_STATE_SUSPENDED");
    assert_int_equal(s_counter(&F.forks), 0);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

static bool s_in_fork(void *arg)
{
    return F.in_fork > 0;
}

/* While the copy runs (FORKING): guest calls and lifecycle calls are refused ABORTED, a delete
 * waits for the copy and then deletes the source (thawed first); the forks still come up. */
static void test_delete_during_fork(void **unused)
{
    s_spawn_manager();
    t_reply_t r;
    s_create("fork-del", 0, &r);
    char id[KA_STORE_ID_LEN];
    snprintf(id, sizeof id, "%s", r.sandbox.id);
    pthread_mutex_lock(&F.lock);
    F.gate_fork = true;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_fork_t q = s_fork_req(ALICE, id, "fd", 1);
    s_answer_t fork, del, sus;
    s_send(KA_SBX_FORK, &q, sizeof q, &fork);
    assert_true(f_wait(s_in_fork, NULL, WAIT_MS));
    s_stream_t s;
    const char *echo[] = {"echo", "hi", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_ABORTED);
    ka_sbx_key_t k = s_key(ALICE, id);
    s_send(KA_SBX_SUSPEND, &k, sizeof k, &sus);
    assert_int_equal(s_wait_answer(&sus), KA_ABORTED);
    s_send(KA_SBX_DELETE, &k, sizeof k, &del);
    usleep(50 * 1000);
    assert_int_equal(del.n, 0); /* waits for the copy */
    f_open_gate();
    assert_int_equal(s_wait_answer(&fork), KA_OK);
    assert_int_equal(s_wait_answer(&del), KA_OK);
    assert_int_equal(del.r.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(s_counter(&F.stopped_frozen), 0);
    assert_int_equal(s_counter(&F.forks_frozen), 1);
    s_assert_history(id, "CREATING/CREATE READY/NONE DELETING/DELETE DELETED/NONE");
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, "0198f000-0000-7000-8000-000000000002", &o),
                     KA_OK);
}

/* A fork takes room for all of its forks at once: capacity 3 with the source live, a fork of 3
 * is refused RESOURCE_EXHAUSTED with the room there is and records nothing (no record, no copy,
 * its request id unused); a fork of 2 fills the pool; its replay, full, is still answered with
 * the same forks (from the receipt), a new fork of 1 is refused; a delete makes room for it. */
static void test_fork_capacity(void **unused)
{
    s_warm_args(0, 3);
    s_spawn_manager();
    t_reply_t r, o;
    s_create("fcap-src", 0, &r);
    const char *id = r.sandbox.id;
    char ids[3][KA_STORE_ID_LEN], again[3][KA_STORE_ID_LEN], msg[KA_MSG_LEN];
    assert_int_equal(s_fork(ALICE, id, "fc3", 3, ids, msg, sizeof msg), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(msg, "pool kagent-default on node node-fsm has room for 2 more sandboxes, "
                             "the fork needs 3; delete some or retry later");
    assert_int_equal(s_counter(&F.n_records), 1);
    assert_int_equal(s_counter(&F.forks), 0);
    assert_int_equal(s_counter(&F.freezes), 0);
    assert_int_equal(s_fork(ALICE, id, "fc2", 2, ids, msg, sizeof msg), KA_OK);
    assert_int_equal(s_counter(&F.n_records), 3);
    assert_int_equal(s_counter(&F.forks), 2);
    ka_sbx_count_t c; /* the count /metrics reports: the capacity check's */
    s_count(&c);
    assert_int_equal(c.n_pools, 1);
    assert_string_equal(c.pools[0].pool, "kagent-default");
    assert_int_equal(c.pools[0].used, 3);
    assert_int_equal(s_fork(ALICE, id, "fc2", 2, again, msg, sizeof msg), KA_OK); /* a replay */
    for (int i = 0; i < 2; i++)
        assert_string_equal(again[i], ids[i]);
    assert_int_equal(s_counter(&F.forks), 2);
    assert_int_equal(s_fork(ALICE, id, "fc1", 1, again, msg, sizeof msg), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(msg, "pool kagent-default on node node-fsm has room for 0 more sandboxes, "
                             "the fork needs 1; delete some or retry later");
    assert_int_equal(s_try_create("fcap-c", &o), KA_RESOURCE_EXHAUSTED); /* creates see them */
    assert_int_equal(s_counter(&F.n_records), 3);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, ids[0], &o), KA_OK);
    assert_int_equal(s_fork(ALICE, id, "fc1", 1, again, msg, sizeof msg), KA_OK);
    assert_int_equal(s_counter(&F.n_records), 4);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, again[0], &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, ids[1], &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
}

/* Creates and forks arriving together never overshoot: capacity 3 with the source live, two
 * creates, a fork of 2 and a fork of 1 at once: whatever is admitted fits in the 2 left, and
 * what is refused records nothing. */
static void test_fork_and_creates_concurrent(void **unused)
{
    s_warm_args(0, 3);
    s_spawn_manager();
    t_reply_t r, o;
    s_create("fcc-src", 0, &r);
    const char *id = r.sandbox.id;
    s_answer_t a[4];
    ka_sbx_create_t c0 = s_create_req(ALICE, "fcc-0", 0), c1 = s_create_req(ALICE, "fcc-1", 0);
    ka_sbx_fork_t f2 = s_fork_req(ALICE, id, "fcc-f2", 2), f1 = s_fork_req(ALICE, id, "fcc-f1", 1);
    s_send(KA_SBX_FORK, &f2, sizeof f2, &a[0]);
    s_send(KA_SBX_CREATE, &c0, sizeof c0, &a[1]);
    s_send(KA_SBX_FORK, &f1, sizeof f1, &a[2]);
    s_send(KA_SBX_CREATE, &c1, sizeof c1, &a[3]);
    static const int size[4] = {2, 1, 1, 1};
    int admitted = 0;
    for (int i = 0; i < 4; i++) {
        int code = s_wait_answer(&a[i]);
        assert_true(code == KA_OK || code == KA_RESOURCE_EXHAUSTED);
        admitted += code == KA_OK ? size[i] : 0;
    }
    assert_true(admitted >= 1 && admitted <= 2);
    assert_int_equal(s_counter(&F.n_records), 1 + admitted);
    for (int i = 0; i < s_counter(&F.n_records); i++) { /* the records in order: ids 1.. */
        char rid[KA_STORE_ID_LEN];
        snprintf(rid, sizeof rid, "0198f000-0000-7000-8000-%012d", i + 1);
        assert_int_equal(s_life(KA_SBX_DELETE, ALICE, rid, &o), KA_OK);
    }
}

/* ---- the manager's index of its sandbox actors by address ---------------------------------- */

/* The manager's live count and pool kagent-default's used count (KA_SBX_COUNT), and its two
 * indexes' sizes as it describes them (the actor tree's "state"): all as given. The live count
 * is waited for: an actor waited for (krt_system_wait) is gone before its DOWN is sent. Counts
 * only fall, so a count below live never comes back up to pass. */
static void s_assert_use(uint64_t live, uint64_t used)
{
    ka_sbx_count_t c;
    int64_t until = krt_mono_ms() + WAIT_MS;
    for (s_count(&c); c.live != live && krt_mono_ms() < until; s_count(&c))
        usleep(1000);
    assert_int_equal(c.live, live);
    assert_int_equal(c.n_pools, 1);
    assert_int_equal(c.pools[0].used, used);
    until = krt_mono_ms() + WAIT_MS; /* described only while idle */
    size_t n_live = SIZE_MAX, n_addr = SIZE_MAX;
    while (n_live == SIZE_MAX && krt_mono_ms() < until) {
        char *json = krt_tree_json(T.sys, T.sandboxes);
        const char *st = json ? strstr(json, "{\"live\":") : NULL;
        if (!st || sscanf(st, "{\"live\":%zu,\"by_addr\":%zu}", &n_live, &n_addr) != 2)
            usleep(1000);
        free(json);
    }
    assert_int_equal(n_live, live);
    assert_int_equal(n_addr, live); /* no address left behind by a slot gone */
}

/* The actor of sandbox id, by its name. */
static krt_addr_t s_actor_of(const char *id)
{
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, id);
    return krt_whereis(T.sys, name);
}

/* A DOWN of who as the runtime delivers one: here a late or repeated one. */
static void s_send_down(krt_addr_t who)
{
    krt_down_t d = {.who = who, .ref = 0, .reason = KRT_EXIT_KILLED};
    assert_int_equal(krt_system_send(T.sys, T.sandboxes, KRT_MSG_DOWN, &d, sizeof d), 0);
}

/* A sandbox of ALICE's, READY (or FAILED: fails), waited for: *out its reply, *actor its actor. */
static void s_create_actor(const char *request_id, int64_t ttl_ms, bool fails, t_reply_t *out,
                           krt_addr_t *actor)
{
    pthread_mutex_lock(&F.lock);
    F.fail_start = fails;
    pthread_mutex_unlock(&F.lock);
    ka_sbx_create_t c = s_create_req(ALICE, request_id, ttl_ms);
    s_answer_t a;
    s_send(KA_SBX_CREATE, &c, sizeof c, &a);
    assert_int_equal(s_wait_answer(&a), KA_OK);
    assert_int_equal(a.r.sandbox.state, fails ? KA_STATE_FAILED : KA_STATE_READY);
    *out = a.r;
    *actor = s_actor_of(out->sandbox.id);
    assert_int_not_equal(*actor, KRT_ADDR_NONE);
}

/* Deletes sandbox id and waits until its actor is gone (the manager took its retire; its DOWN
 * may still be on the way). */
static void s_delete_gone(const char *id, krt_addr_t actor)
{
    t_reply_t o;
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_not_equal(krt_system_wait(T.sys, actor, WAIT_MS), KRT_ETIMEDOUT);
}

/* The manager finds a sandbox's slot by its actor's address (DOWN, retire, release, a child's
 * exit) in an index kept in step with its live map. Sandboxes leave in mixed order and ways
 * (deleted, killed, a failed boot released then deleted, TTL) while others arrive; after each
 * the counts are the survivors' and the index holds exactly the live ones. A DOWN of an actor
 * gone (twice), or of one never a sandbox, changes nothing. The room left is what the pool says
 * (filled to capacity, then full), and deleting the rest in another order ends at zero. */
static void test_address_index_in_step(void **unused)
{
    enum { CAP = 24, N = CAP - 3, FAILS = 5, TTL = 3 };
    s_warm_args(0, CAP);
    s_spawn_manager();
    t_reply_t r[CAP];
    krt_addr_t actor[CAP];
    bool alive[CAP];
    char rid[32];
    for (int i = 0; i < N; i++) {
        snprintf(rid, sizeof rid, "addr-%d", i);
        s_create_actor(rid, 0, i == FAILS, &r[i], &actor[i]);
        alive[i] = true;
    }
    int live = N, used = N - 1; /* the failed boot holds no room */
    s_assert_use(live, used);
    /* d: delete (retire, then DOWN), k: kill (DOWN only; the actor parks its compute) */
    const struct {
        int i;
        char how;
    } gone[] = {{20, 'd'}, {4, 'k'},  {FAILS, 'd'}, {3, 'd'}, {19, 'k'},
                {17, 'd'}, {11, 'k'}, {10, 'd'},    {0, 'd'}};
    for (size_t g = 0; g < sizeof gone / sizeof gone[0]; g++) {
        int i = gone[g].i;
        if (gone[g].how == 'd') {
            s_delete_gone(r[i].sandbox.id, actor[i]);
        } else {
            krt_system_kill(T.sys, actor[i], KRT_EXIT_KILLED);
            assert_int_not_equal(krt_system_wait(T.sys, actor[i], WAIT_MS), KRT_ETIMEDOUT);
        }
        alive[i] = false;
        live--;
        used -= i != FAILS;
        s_assert_use(live, used);
    }
    for (int i = N; i < N + TTL; i++) { /* new addresses among the gaps; they expire */
        snprintf(rid, sizeof rid, "addr-ttl-%d", i);
        s_create_actor(rid, 1000, false, &r[i], &actor[i]);
    }
    for (int i = N; i < N + TTL; i++) {
        s_wait_state(r[i].sandbox.id, KA_STATE_DELETED);
        assert_int_not_equal(krt_system_wait(T.sys, actor[i], WAIT_MS), KRT_ETIMEDOUT);
        alive[i] = false;
    }
    s_assert_use(live, used);
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < N + TTL; i++)
            if (!alive[i])
                s_send_down(actor[i]);
    s_send_down(T.store);
    s_assert_use(live, used);
    /* the room the count leaves is real: filled exactly, then full */
    t_reply_t more[CAP], f;
    krt_addr_t more_actor[CAP];
    int n_more = CAP - used;
    for (int j = 0; j < n_more; j++) {
        snprintf(rid, sizeof rid, "addr-more-%d", j);
        s_create_actor(rid, 0, false, &more[j], &more_actor[j]);
    }
    live += n_more;
    used += n_more;
    s_assert_use(live, CAP);
    char full[KA_MSG_LEN];
    snprintf(full, sizeof full,
             "pool kagent-default on node node-fsm is full (%d of %d sandboxes); delete one or "
             "retry later",
             CAP, CAP);
    assert_int_equal(s_try_create("addr-over", &f), KA_RESOURCE_EXHAUSTED);
    assert_string_equal(f.status.message, full);
    /* the rest: the new ones newest and oldest alternately, then the first ones backwards */
    for (int j = 0; j < n_more; j++) {
        int k = j % 2 ? j / 2 : n_more - 1 - j / 2;
        s_delete_gone(more[k].sandbox.id, more_actor[k]);
        s_assert_use(--live, --used);
    }
    for (int i = N - 1; i >= 0; i--)
        if (alive[i]) {
            s_delete_gone(r[i].sandbox.id, actor[i]);
            s_assert_use(--live, --used);
        }
    s_assert_use(0, 0);
}

/* ---- how calls reach a sandbox --------------------------------------------------------------- */

#define T_HOLD (KA_CTL_MSG_LAST_ + 100) /* the dying stand-in waits, then stops */

static int s_standin_got; /* messages the stand-ins received (under F.lock) */
static struct {
    bool in, release; /* the dying stand-in is holding; it may stop (under F.lock) */
} s_hold;

static void s_standin_count(void)
{
    pthread_mutex_lock(&F.lock);
    s_standin_got++;
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

/* Holds the manager's name: counts what reaches it and refuses every call. */
static void s_standin_mgr_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_standin_count();
    if (msg->type == KA_SBX_GUEST && !msg->ref) {
        ka_frame_fail_t f;
        size_t len = ka_frame_final(&f, -ENOTCONN, "");
        krt_send(ctx, msg->from, KA_SBX_GUEST_FRAME, &f, len);
    } else if (msg->ref) {
        krt_reply_error(ctx, msg, KA_EUNAVAIL, "stand-in");
    }
}

static const krt_behaviour_t s_standin_mgr = {.kind = "standin-mgr",
                                              .handle = s_standin_mgr_handle};

/* Holds a sandbox's name and stops with the calls sent to it still queued: an actor that ends
 * between the service's lookup and taking the call. Its first message (T_HOLD) keeps its turn
 * until the test lets it stop (at most WAIT_MS: a test that fails never hangs). */
static void s_standin_dying_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type != T_HOLD) {
        s_standin_count(); /* a call taken: the test fails on the count */
        return;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&F.lock);
    s_hold.in = true;
    pthread_cond_broadcast(&F.cond);
    while (!s_hold.release && pthread_cond_timedwait(&F.cond, &F.lock, &until) == 0)
        ;
    pthread_mutex_unlock(&F.lock);
    krt_exit(ctx, KRT_EXIT_NORMAL);
}

static bool s_holding(void *arg)
{
    return s_hold.in;
}

/* Messages queued for who (its tree entry's mailbox depth). */
static int s_mailbox(krt_addr_t who)
{
    char *json = krt_tree_json(T.sys, who);
    const char *m = json ? strstr(json, "\"mailbox\":") : NULL;
    int n = m ? atoi(m + strlen("\"mailbox\":")) : -1;
    free(json);
    return n;
}

static const krt_behaviour_t s_standin_dying = {.kind = "standin-dying",
                                                .handle = s_standin_dying_handle};

/* Points name at who instead of its holder. */
static void s_repoint(const char *name, krt_addr_t who)
{
    krt_unregister(T.sys, name);
    assert_int_equal(krt_register(T.sys, name, who), 0);
}

/* The calls for a live sandbox (exec, files, get, pause, unpause, suspend, resume, delete) go to
 * its actor by name: they all complete while the manager's name points at a stand-in that
 * refuses everything, and the stand-in sees none of them. Calls that need the manager (an
 * unknown id, an empty caller, a malformed id) reach the stand-in. */
static void test_calls_skip_the_manager(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("direct", 0, &r);
    const char *id = r.sandbox.id;
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, id);
    assert_string_equal(name + strlen(KA_SANDBOX_NAME_PREFIX), id);
    krt_addr_t actor = krt_whereis(T.sys, name);
    assert_int_not_equal(actor, KRT_ADDR_NONE);
    krt_addr_t standin;
    s_standin_got = 0;
    assert_int_equal(krt_system_spawn(T.sys, &s_standin_mgr, NULL, NULL, &standin), 0);
    s_repoint(KA_SANDBOXES_NAME, standin);
    s_stream_t s;
    const char *echo[] = {"echo", "direct", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_OK);
    assert_memory_equal(s.out, "direct\n", 7);
    assert_int_equal(s_file(id, KA_GUEST_WRITE, "d.txt", "d", &s), KA_OK);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK);
    assert_true(o.paused);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, id, &o), KA_OK);
    assert_true(o.paused);
    assert_int_equal(s_life(KA_SBX_GET, BOB, id, &o), KA_NOT_FOUND); /* the owner check */
    assert_string_equal(o.status.message, KA_MSG_NOT_FOUND);
    assert_int_equal(s_life(KA_SBX_UNPAUSE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_SUSPEND, ALICE, id, &o), KA_OK);
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, id, &o), KA_OK);
    assert_int_equal(s_counter(&s_standin_got), 0);
    /* what only the manager answers */
    assert_int_equal(s_life(KA_SBX_GET, ALICE, "0198f000-0000-7000-8000-0000000000ff", &o),
                     KA_UNAVAILABLE);
    assert_int_equal(s_life(KA_SBX_SUSPEND, "", id, &o), KA_UNAVAILABLE);
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, "not-a-uuid", &o), KA_UNAVAILABLE);
    assert_string_equal(o.status.message, "stand-in");
    assert_int_equal(s_counter(&s_standin_got), 3);
    /* the real manager again: the same calls get its answers, as before */
    s_repoint(KA_SANDBOXES_NAME, T.sandboxes);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, "0198f000-0000-7000-8000-0000000000ff", &o),
                     KA_NOT_FOUND);
    assert_string_equal(o.status.message, KA_MSG_NOT_FOUND);
    assert_int_equal(s_life(KA_SBX_SUSPEND, "", id, &o), KA_UNAUTHENTICATED);
    assert_string_equal(o.status.message, "authentication required");
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, "not-a-uuid", &o), KA_INVALID_ARGUMENT);
    assert_string_equal(o.status.message, KA_MSG_NOT_UUID);
    s_answer_t a;
    s_send(KA_SBX_GET, "short", 5, &a);
    assert_int_equal(s_wait_answer(&a), KA_INVALID_ARGUMENT);
    assert_string_equal(a.r.status.message, "malformed request");
    ka_guest_req_t *q = s_exec_req(id, echo);
    q->caller[0] = '\0';
    s_stream_start(q, &s);
    assert_int_equal(s_stream_wait(&s, WAIT_MS), KA_UNAUTHENTICATED);
    /* the delete: the actor answers, retires, and its name goes with it */
    s_repoint(KA_SANDBOXES_NAME, standin);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(s_counter(&s_standin_got), 3);
    s_repoint(KA_SANDBOXES_NAME, T.sandboxes);
    assert_int_not_equal(krt_system_wait(T.sys, actor, WAIT_MS), KRT_ETIMEDOUT);
    assert_int_equal(krt_whereis(T.sys, name), KRT_ADDR_NONE);
    s_assert_history(id, "CREATING/CREATE READY/NONE READY/SUSPEND SUSPENDED/NONE "
                         "SUSPENDED/RESUME READY/NONE DELETING/DELETE DELETED/NONE");
}

/* A sandbox with no actor is answered by the manager from its record: the tombstone of a
 * deleted one (get, delete again, a guest call refused), a suspended record of another node
 * (get as it is, delete writes the tombstone), an unknown id NOT_FOUND. */
static void test_not_live_answered_by_the_manager(void **unused)
{
    ka_store_sandbox_t far;
    memset(&far, 0, sizeof far);
    snprintf(far.id, sizeof far.id, "0198f000-0000-7000-8000-00000000f00d");
    snprintf(far.creator, sizeof far.creator, ALICE);
    snprintf(far.request_id, sizeof far.request_id, "elsewhere");
    snprintf(far.node, sizeof far.node, "node-other"); /* not recovered here: no actor */
    far.state = KA_STATE_SUSPENDED;
    far.expires_ms = krt_wall_ms() + 3600000;
    f_put_record(&far);
    s_spawn_manager();
    t_reply_t r, o;
    s_create("gone", 0, &r);
    const char *id = r.sandbox.id;
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, id);
    krt_addr_t actor = krt_whereis(T.sys, name);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_not_equal(krt_system_wait(T.sys, actor, WAIT_MS), KRT_ETIMEDOUT);
    assert_int_equal(krt_whereis(T.sys, name), KRT_ADDR_NONE);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    assert_false(o.paused);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK); /* the tombstone again */
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED);
    assert_int_equal(s_life(KA_SBX_GET, BOB, id, &o), KA_NOT_FOUND);
    assert_string_equal(o.status.message, KA_MSG_NOT_FOUND);
    s_stream_t s;
    const char *echo[] = {"echo", "x", NULL};
    assert_int_equal(s_exec(id, echo, &s), KA_FAILED_PRECONDITION);
    assert_string_equal(s.end.message, KA_MSG_NOT_READY);
    ka_sandbox_name(name, far.id);
    assert_int_equal(krt_whereis(T.sys, name), KRT_ADDR_NONE);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, far.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_SUSPENDED);
    assert_int_equal(s_life(KA_SBX_RESUME, ALICE, far.id, &o), KA_FAILED_PRECONDITION);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, far.id, &o), KA_OK);
    assert_int_equal(o.sandbox.state, KA_STATE_DELETED); /* a record, as every delete answers */
    assert_string_equal(o.sandbox.id, far.id);
    assert_int_equal(s_life(KA_SBX_GET, ALICE, "0198f000-0000-7000-8000-0000000000ff", &o),
                     KA_NOT_FOUND);
    assert_string_equal(o.status.message, KA_MSG_NOT_FOUND);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, "0198f000-0000-7000-8000-0000000000ff", &o),
                     KA_NOT_FOUND);
}

/* The actor found by name ends before it takes the calls (between the service's lookup and its
 * turn): the unary calls (ENOACTOR) and the stream (its DOWN before BOUND) go to the manager,
 * once, which forwards them to the sandbox's actor it knows; each is answered exactly once, by
 * the real actor. */
static void test_actor_gone_after_lookup(void **unused)
{
    s_spawn_manager();
    t_reply_t r, o;
    s_create("gone-after-lookup", 0, &r);
    const char *id = r.sandbox.id;
    char name[KA_SANDBOX_NAME_LEN];
    ka_sandbox_name(name, id);
    krt_addr_t dying;
    s_standin_got = 0;
    memset(&s_hold, 0, sizeof s_hold);
    assert_int_equal(krt_system_spawn(T.sys, &s_standin_dying, NULL, NULL, &dying), 0);
    assert_int_equal(krt_system_send(T.sys, dying, T_HOLD, NULL, 0), 0);
    assert_true(f_wait(s_holding, NULL, WAIT_MS));
    s_repoint(name, dying);
    s_stream_t s;
    const char *echo[] = {"echo", "once", NULL};
    s_stream_start(s_exec_req(id, echo), &s);
    int64_t until = krt_mono_ms() + WAIT_MS; /* the sink's monitor and call are queued */
    while (s_mailbox(dying) < 2 && krt_mono_ms() < until)
        usleep(1000);
    assert_int_equal(s_mailbox(dying), 2);
    ka_sbx_key_t k = s_key(ALICE, id);
    s_answer_t unpause, get; /* answers that do not depend on the order the three arrive in */
    s_send(KA_SBX_UNPAUSE, &k, sizeof k, &unpause); /* queued when the send returns */
    s_send(KA_SBX_GET, &k, sizeof k, &get);
    assert_int_equal(s_mailbox(dying), 4);
    assert_int_equal(s_counter(&unpause.n) + s_counter(&get.n) + s_counter(&s.finals), 0);
    pthread_mutex_lock(&F.lock);
    s_hold.release = true;
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
    assert_int_equal(s_stream_wait(&s, WAIT_MS), KA_OK);
    assert_memory_equal(s.out, "once\n", 5);
    assert_int_equal(s_wait_answer(&unpause), KA_FAILED_PRECONDITION); /* the actor's answer */
    assert_string_equal(unpause.r.status.message, "the sandbox is not paused");
    assert_int_equal(s_wait_answer(&get), KA_OK);
    assert_int_equal(get.r.sandbox.state, KA_STATE_READY);
    assert_int_equal(krt_whereis(T.sys, name), KRT_ADDR_NONE);    /* released with the stand-in */
    assert_int_equal(s_life(KA_SBX_PAUSE, ALICE, id, &o), KA_OK); /* by the manager's way */
    assert_int_equal(s_life(KA_SBX_GET, ALICE, id, &o), KA_OK);
    assert_true(o.paused);
    assert_int_equal(s_life(KA_SBX_DELETE, ALICE, id, &o), KA_OK);
    assert_int_equal(s_counter(&s_standin_got), 0); /* it took none of them */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lifecycle_and_one_round_trip_exec, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_refusals, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_failures_are_error_replies, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_guest_failures_are_failing_frames, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_delete_during_create, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_ttl_during_create, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_guest_exit_during_create, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_delete_during_suspend_and_resume, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_driver_failure_during_start, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_ttl_during_suspend, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_guest_exit_during_exec, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_store_error_during_delete, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_expiry_retries_when_store_fails, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_suspend_failures, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_streams_never_wait_forever, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_requests, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_recovery_compute_lost, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_start_discards_what_is_not_its_own, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_manager_restart_keeps_data, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_pause_unpause, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_pause_fails, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_delete_while_paused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_ttl_while_paused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_pause_during_create, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_pause_suspended, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_open_call_waits_while_paused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_warm_claim_and_refill, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_warm_dead_guest_not_handed_out, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_warm_rebuilt_for_new_revision, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_warm_zero_disables, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_warm_within_capacity, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_warm_restart_leaves_nothing, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_refuses_past_full, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_concurrent_creates, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_failed_boot_takes_no_room, s_setup,
                                        s_teardown),
        cmocka_unit_test_setup_teardown(test_capacity_with_warm_pool, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_address_index_in_step, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_fork, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_fork_fails, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_fork_refusals, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_delete_during_fork, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_fork_capacity, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_fork_and_creates_concurrent, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_calls_skip_the_manager, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_not_live_answered_by_the_manager, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_actor_gone_after_lookup, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
