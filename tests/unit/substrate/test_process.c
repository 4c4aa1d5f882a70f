/*
 * Unit tests for the process actor (ka_process) and the guest link actor (ka_guestlink) on
 * the krt runtime, against a real guest run as a plain child over a socketpair: exit codes
 * and output offsets, waiters, signals, a refused start, and the guest going away.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ka_guestlink.h"
#include "ka_process.h"
#include "sbx_fixture.h"

#include <signal.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

static char s_tmp[128], s_ws[200], s_logs[200];

typedef struct env {
    pid_t guest;
    int fd;
    krt_system_t *sys;
    krt_addr_t link;
} env_t;

static void s_env_up(env_t *e)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    e->guest = fork();
    assert_true(e->guest >= 0);
    if (e->guest == 0) {
        dup2(sv[1], 3);
        char *argv[] = {"kagent-sandbox-guest", "--workspace", s_ws, "--log-dir", s_logs, NULL};
        execv(SBX_GUEST_PATH, argv);
        _exit(127);
    }
    close(sv[1]);
    e->fd = sv[0];
    krt_config_t cfg = {.schedulers = 2, .name = "test-process"};
    e->sys = krt_system_new(&cfg);
    assert_non_null(e->sys);
    assert_int_equal(krt_system_start(e->sys), 0);
    assert_int_equal(
        krt_system_spawn(e->sys, &ka_guestlink_behaviour, (void *)(intptr_t)e->fd, NULL, &e->link),
        0);
}

static void s_env_down(env_t *e)
{
    krt_system_destroy(&e->sys);
    close(e->fd); /* the guest sees EOF and stops */
    int st = 0;
    assert_int_equal(waitpid(e->guest, &st, 0), e->guest);
}

static krt_addr_t s_spawn_proc(env_t *e, const char *const *argv)
{
    ka_gp_start_t st = {.argv = argv};
    ka_process_args_t *a = ka_process_args_new(e->link, &st);
    assert_non_null(a);
    krt_addr_t p = KRT_ADDR_NONE;
    assert_int_equal(krt_system_spawn(e->sys, &ka_process_behaviour, a, NULL, &p), 0);
    return p;
}

static ka_process_info_t s_req(env_t *e, krt_addr_t p, uint32_t type, const void *body, size_t len)
{
    krt_reply_t r;
    assert_int_equal(krt_call(e->sys, p, type, body, len, 20000, &r), 0);
    assert_int_equal(r.type, KA_PROC_INFO);
    assert_int_equal(r.len, sizeof(ka_process_info_t));
    ka_process_info_t info;
    memcpy(&info, r.body, sizeof(info));
    krt_reply_free(&r);
    return info;
}

/* Counts WAIT answers that report the SIGTERM exit. */
static void s_wait_cb(void *user, int err, const krt_msg_t *reply)
{
    ka_process_info_t i;
    if (err == 0 && reply && reply->len == sizeof(i)) {
        memcpy(&i, reply->body, sizeof(i));
        if (i.state == KA_PROC_EXITED && i.exit_code == 128 + SIGTERM)
            atomic_fetch_add((atomic_int *)user, 1);
    }
}

static int s_setup(void **unused)
{
    (void)unused;
    /* orphans of a killed guest come back to us, so the tests can end them by pid */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    snprintf(s_tmp, sizeof(s_tmp), "/tmp/ka-process-test-XXXXXX");
    if (!mkdtemp(s_tmp) || chmod(s_tmp, 0755) < 0)
        return -1;
    snprintf(s_ws, sizeof(s_ws), "%s/workspace", s_tmp);
    snprintf(s_logs, sizeof(s_logs), "%s/logs", s_tmp);
    if (mkdir(s_ws, 0755) < 0 || chown(s_ws, 65532, 65532) < 0)
        return -1;
    return 0;
}

static int s_teardown(void **unused)
{
    (void)unused;
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_exit_and_offsets(void **unused)
{
    (void)unused;
    env_t e;
    s_env_up(&e);
    const char *argv[] = {"/bin/sh", "-c", "echo hello; printf err >&2; exit 7", NULL};
    krt_addr_t p = s_spawn_proc(&e, argv);
    ka_process_info_t i = s_req(&e, p, KA_PROC_WAIT, NULL, 0);
    assert_int_equal(i.state, KA_PROC_EXITED);
    assert_int_equal(i.exit_code, 7);
    assert_int_equal(i.stdout_bytes, 6);
    assert_int_equal(i.stderr_bytes, 3);
    assert_true(i.proc > 0 && i.pid > 0);
    assert_true(i.finished_ms >= i.started_ms && i.started_ms > 0);
    /* get after the exit says the same; a second wait answers at once */
    ka_process_info_t g = s_req(&e, p, KA_PROC_GET, NULL, 0);
    assert_memory_equal(&g, &i, sizeof(g));
    g = s_req(&e, p, KA_PROC_WAIT, NULL, 0);
    assert_int_equal(g.exit_code, 7);
    s_env_down(&e);
}

static void test_signal_and_waiters(void **unused)
{
    (void)unused;
    env_t e;
    s_env_up(&e);
    const char *argv[] = {"/bin/sleep", "30", NULL};
    krt_addr_t p = s_spawn_proc(&e, argv);
    ka_process_info_t i;
    for (int n = 0; n < 500; n++) { /* until the guest has started it */
        i = s_req(&e, p, KA_PROC_GET, NULL, 0);
        if (i.state != KA_PROC_STARTING)
            break;
        usleep(2000);
    }
    assert_int_equal(i.state, KA_PROC_RUNNING);
    /* three waiters, answered together by the exit */
    atomic_int woken = 0;
    for (int w = 0; w < 3; w++)
        assert_int_equal(krt_call_async(e.sys, p, KA_PROC_WAIT, NULL, 0, 20000, s_wait_cb, &woken),
                         0);
    usleep(50000);
    assert_int_equal(atomic_load(&woken), 0); /* still running: nobody answered yet */
    int sig = SIGTERM;
    i = s_req(&e, p, KA_PROC_SIGNAL, &sig, sizeof(sig));
    i = s_req(&e, p, KA_PROC_WAIT, NULL, 0);
    assert_int_equal(i.state, KA_PROC_EXITED);
    assert_int_equal(i.exit_code, 128 + SIGTERM);
    for (int n = 0; n < 500 && atomic_load(&woken) < 3; n++)
        usleep(2000);
    assert_int_equal(atomic_load(&woken), 3);
    s_env_down(&e);
}

static void test_input(void **unused)
{
    (void)unused;
    env_t e;
    s_env_up(&e);
    const char *argv[] = {"/bin/sh", "-c", "read -r a; [ \"$a\" = 'hello world' ] && echo ok",
                          NULL};
    ka_gp_start_t st = {.argv = argv, .stdin_open = true};
    ka_process_args_t *a = ka_process_args_new(e.link, &st);
    assert_non_null(a);
    krt_addr_t p;
    assert_int_equal(krt_system_spawn(e.sys, &ka_process_behaviour, a, NULL, &p), 0);
    ka_process_info_t i;
    for (int n = 0; n < 500; n++) {
        i = s_req(&e, p, KA_PROC_GET, NULL, 0);
        if (i.state != KA_PROC_STARTING)
            break;
        usleep(2000);
    }
    assert_int_equal(i.state, KA_PROC_RUNNING);
    const char first[] = "\0hello ";
    const char last[] = "\1world";
    s_req(&e, p, KA_PROC_INPUT, first, sizeof(first) - 1);
    s_req(&e, p, KA_PROC_INPUT, last, sizeof(last) - 1);
    i = s_req(&e, p, KA_PROC_WAIT, NULL, 0);
    assert_int_equal(i.state, KA_PROC_EXITED);
    assert_int_equal(i.exit_code, 0);
    assert_int_equal(i.stdout_bytes, 3); /* "ok\n": both pieces arrived, in order */
    s_env_down(&e);
}

static void test_refused_start(void **unused)
{
    (void)unused;
    env_t e;
    s_env_up(&e);
    const char *argv[] = {"/no/such/program", NULL};
    krt_addr_t p = s_spawn_proc(&e, argv);
    ka_process_info_t i = s_req(&e, p, KA_PROC_WAIT, NULL, 0);
    assert_int_equal(i.state, KA_PROC_FAILED);
    assert_int_equal(i.err, -ENOENT);
    s_env_down(&e);
}

static void test_guest_gone(void **unused)
{
    (void)unused;
    env_t e;
    s_env_up(&e);
    const char *argv[] = {"/bin/sleep", "30", NULL};
    krt_addr_t p = s_spawn_proc(&e, argv);
    ka_process_info_t i;
    for (int n = 0; n < 500; n++) {
        i = s_req(&e, p, KA_PROC_GET, NULL, 0);
        if (i.state != KA_PROC_STARTING)
            break;
        usleep(2000);
    }
    assert_int_equal(i.state, KA_PROC_RUNNING);
    kill(e.guest, SIGKILL);
    i = s_req(&e, p, KA_PROC_WAIT, NULL, 0);
    assert_int_equal(i.state, KA_PROC_FAILED);
    assert_int_equal(i.err, -ECONNRESET);
    /* the link stops by itself once the channel is gone */
    int rc = krt_system_wait(e.sys, e.link, 5000); /* or already gone */
    assert_true(rc == KRT_EXIT_NORMAL || rc == KRT_ENOACTOR);
    s_env_down(&e);
    /* the sleep was the guest's child: a plain (not PID 1) guest killed with SIGKILL cannot
     * take it along; it is ours now (subreaper): end its group by pid and reap it */
    assert_int_equal(kill(-(pid_t)i.pid, SIGKILL), 0);
    assert_int_equal(waitpid((pid_t)i.pid, NULL, 0), (pid_t)i.pid);
}

/* A client actor for the link's file and input requests: write, read back, report. */
typedef struct files_result {
    krt_addr_t link;
    atomic_int done;
    int write_err, read_err;
    char data[64];
    size_t len;
} files_result_t;

typedef struct files_client {
    files_result_t *r;
} files_client_t;

static int s_files_init(krt_ctx_t *ctx, void *state, void *arg)
{
    files_client_t *c = state;
    c->r = arg;
    return ka_gl_send(ctx, c->r->link,
                      ka_gl_req_write(krt_self(ctx), 1, "sub/f.txt", 0640, 0, "via link", 8));
}

static void s_files_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    files_client_t *c = state;
    if (msg->type == KA_GL_CLOSED) {
        c->r->read_err = -ECONNRESET;
        atomic_store(&c->r->done, 1);
        return;
    }
    if (msg->type != KA_GL_FRAME)
        return;
    const ka_gl_frame_t *w = msg->body;
    const char *d;
    size_t n;
    if (w->tag == 1 && ka_gp_frame_is_end(w->frame)) {
        c->r->write_err = ka_gp_frame_err(w->frame);
        ka_gl_send(ctx, c->r->link, ka_gl_req_read(krt_self(ctx), 2, "sub/f.txt", 0));
    } else if (w->tag == 2) {
        if (ka_gp_get_bytes(ka_gp_frame_map(w->frame), "chunk", &d, &n) &&
            c->r->len + n < sizeof(c->r->data)) {
            memcpy(c->r->data + c->r->len, d, n);
            c->r->len += n;
        }
        if (ka_gp_frame_is_end(w->frame)) {
            c->r->read_err = ka_gp_frame_err(w->frame);
            atomic_store(&c->r->done, 1);
        }
    }
}

static const krt_behaviour_t s_files_behaviour = {
    .kind = "files-client",
    .state_size = sizeof(files_client_t),
    .init = s_files_init,
    .handle = s_files_handle,
};

static void test_link_files(void **unused)
{
    (void)unused;
    env_t e;
    s_env_up(&e);
    files_result_t r = {.link = e.link};
    krt_addr_t c;
    assert_int_equal(krt_system_spawn(e.sys, &s_files_behaviour, &r, NULL, &c), 0);
    for (int n = 0; n < 2500 && !atomic_load(&r.done); n++)
        usleep(2000);
    assert_int_equal(atomic_load(&r.done), 1);
    assert_int_equal(r.write_err, 0);
    assert_int_equal(r.read_err, 0);
    assert_int_equal(r.len, 8);
    assert_memory_equal(r.data, "via link", 8);
    s_env_down(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_and_offsets),
        cmocka_unit_test(test_signal_and_waiters),
        cmocka_unit_test(test_input),
        cmocka_unit_test(test_refused_start),
        cmocka_unit_test(test_guest_gone),
        cmocka_unit_test(test_link_files),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
