/*
 * Unit tests for actors/guest (kagent-sandbox-guest) through the node-side client
 * (actors/substrate/guestconn): the guest runs as a plain child of the test (not in a
 * sandbox) over a socketpair, as root, so user processes drop to 65532 as they do in a
 * sandbox. Covers exec, exit codes, signals to the process group, timeouts, stdin, output
 * offsets and follow, spool cap, env/cwd, the 10-process limit, and the file API (seek_offset,
 * mode, escapes refused, 64 MiB cap).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sbx_fixture.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <sys/wait.h>
#include <dirent.h>

static char s_tmp[128], s_ws[600], s_logs[160] __attribute__((unused));
static const char *s_ws_in = s_ws; /* the workspace as the user's processes see it */

typedef struct guest {
    pid_t pid;
    ka_guestconn_t *gc;
    ka_driver_t *d;
    ka_sandbox_t *sb;
} guest_t;

#ifdef SBX_IN_SANDBOX
/* The same tests through a real sandbox: the guest is PID 1 of a `namespaces` sandbox. */
static void s_spawn(guest_t *g, const char *extra)
{
    char state[200], rootfs[200];
    snprintf(state, sizeof(state), "%s/state", s_tmp);
    snprintf(rootfs, sizeof(rootfs), "%s/rootfs", s_tmp);
    const char *args[] = {extra, NULL};
    char cg[64];
    snprintf(cg, sizeof(cg), "kagent-guest-it-%d", (int)getpid());
    ka_ns_opts_t o = {.uid_base = 120000000, /* this test's own host uids (tests/lib/uids.sh) */
                      .state_dir = state,
                      .guest_path = SBX_GUEST_PATH,
                      .mem_bytes = 512u << 20,
                      .pids_max = 128,
                      .cgroup_name = cg,
                      .guest_args = extra ? args : NULL};
    memset(g, 0, sizeof(*g));
    g->d = ka_namespaces_new(&o, NULL);
    assert_non_null(g->d);
    const char *lower[] = {rootfs};
    ka_sandbox_spec_t spec = {.id = "guest-it", .lowerdirs = lower, .n_lower = 1};
    assert_int_equal(ka_driver_start(g->d, &spec, &g->sb), 0);
    g->gc = ka_guestconn_new(ka_driver_channel(g->d, g->sb), false);
    assert_non_null(g->gc);
    snprintf(s_ws, sizeof(s_ws), "%s/data/workspace", ka_namespaces_dir(g->sb));
    s_ws_in = KA_GP_WORKSPACE;
}

static void s_stop(guest_t *g)
{
    ka_guestconn_destroy(&g->gc);
    assert_int_equal(ka_driver_stop(g->d, &g->sb), 0);
    ka_driver_destroy(&g->d);
}

static bool s_pid_gone(guest_t *g, pid_t pid)
{
    char script[200];
    snprintf(script, sizeof(script),
             "test -e /proc/%d || exit 0; grep -q '^State:.*Z' /proc/%d/status", (int)pid,
             (int)pid);
    sbx_out_t o;
    int rc = sbx_sh(g->gc, script, &o);
    sbx_out_free(&o);
    return rc == 0;
}

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof(s_tmp), "/tmp/ka-guest-it-XXXXXX");
    if (!mkdtemp(s_tmp) || chmod(s_tmp, 0755) < 0)
        return -1;
    char rootfs[200];
    snprintf(rootfs, sizeof(rootfs), "%s/rootfs", s_tmp);
    return sbx_make_rootfs(rootfs);
}
#else
static void s_spawn(guest_t *g, const char *extra)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    g->pid = fork();
    assert_true(g->pid >= 0);
    if (g->pid == 0) {
        dup2(sv[1], 3);
        char *argv[] = {"kagent-sandbox-guest", "--workspace", s_ws, "--log-dir", s_logs,
                        (char *)extra,          NULL};
        execv(SBX_GUEST_PATH, argv);
        _exit(127);
    }
    close(sv[1]);
    g->gc = ka_guestconn_new(sv[0], true);
    assert_non_null(g->gc);
    ka_gp_frame_t *f = NULL;
    assert_int_equal(ka_guestconn_wait(g->gc, 5000, &f), 0);
    const char *ev;
    size_t n;
    assert_true(ka_gp_get_bytes(ka_gp_frame_map(f), "ev", &ev, &n));
    assert_int_equal(n, 5);
    assert_memory_equal(ev, "ready", 5);
    ka_gp_frame_free(&f);
}

/* Closing the channel stops the guest; it must exit promptly and cleanly. */
static void s_stop(guest_t *g)
{
    ka_guestconn_destroy(&g->gc);
    int st = 0;
    assert_int_equal(waitpid(g->pid, &st, 0), g->pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static bool s_pid_gone(guest_t *g, pid_t pid)
{
    (void)g;
    char path[64], st[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *sf = fopen(path, "r");
    if (!sf)
        return true;
    bool zombie = fgets(st, sizeof(st), sf) && strstr(st, ") Z ");
    fclose(sf);
    return zombie;
}

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof(s_tmp), "/tmp/ka-guest-test-XXXXXX");
    if (!mkdtemp(s_tmp) || chmod(s_tmp, 0755) < 0)
        return -1;
    snprintf(s_ws, sizeof(s_ws), "%s/workspace", s_tmp);
    snprintf(s_logs, sizeof(s_logs), "%s/logs", s_tmp);
    if (mkdir(s_ws, 0755) < 0 || chown(s_ws, 65532, 65532) < 0)
        return -1;
    return 0;
}

#endif

static int s_teardown(void **unused)
{
    (void)unused;
#ifdef SBX_IN_SANDBOX
    /* whatever a failed test left running: a driver over the state dir cleans it */
    char state[200], cg[64];
    snprintf(state, sizeof(state), "%s/state", s_tmp);
    snprintf(cg, sizeof(cg), "kagent-guest-it-%d", (int)getpid());
    ka_ns_opts_t o = {.uid_base = 120000000, /* this test's own host uids (tests/lib/uids.sh) */
                      .state_dir = state,
                      .guest_path = SBX_GUEST_PATH,
                      .cgroup_name = cg};
    ka_driver_t *d = ka_namespaces_new(&o, NULL);
    ka_driver_destroy(&d);
#endif
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* Starts argv; returns the proc id (asserts success). */
static uint64_t s_start(guest_t *g, const ka_gp_start_t *st)
{
    uint64_t id;
    ka_gp_frame_t *f = NULL;
    ka_gp_process_t p;
    assert_int_equal(ka_guestconn_start(g->gc, st, &id), 0);
    assert_int_equal(ka_guestconn_call(g->gc, id, 5000, NULL, NULL, &f), 0);
    assert_int_equal(ka_gp_frame_process(f, &p), 0);
    assert_int_equal(p.state, KA_GP_STATE_RUNNING);
    assert_true(p.pid > 0);
    ka_gp_frame_free(&f);
    return p.proc;
}

/* Follows proc's output from the offsets to its exit; returns the exit code. */
static int s_follow(guest_t *g, uint64_t proc, uint64_t oo, uint64_t eo, sbx_out_t *o)
{
    uint64_t id;
    ka_gp_frame_t *f = NULL;
    ka_gp_process_t p;
    memset(o, 0, sizeof(*o));
    assert_int_equal(ka_guestconn_output(g->gc, proc, oo, eo, true, &id), 0);
    assert_int_equal(ka_guestconn_call(g->gc, id, 20000, sbx_out_cb, o, &f), 0);
    assert_int_equal(ka_gp_frame_process(f, &p), 0);
    assert_int_equal(p.state, KA_GP_STATE_EXITED);
    assert_true(p.finished_ms >= p.started_ms);
    ka_gp_frame_free(&f);
    return (int)p.exit_code;
}

static void test_exec_echo_and_exit_codes(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    sbx_out_t o;
    const char *echo[] = {"/bin/echo", "hello", "world", NULL};
    assert_int_equal(sbx_run(g.gc, echo, &o, 0), 0);
    assert_string_equal(o.out, "hello world\n");
    sbx_out_free(&o);
    assert_int_equal(sbx_sh(g.gc, "echo out; echo err >&2; exit 3", &o), 3);
    assert_string_equal(o.out, "out\n");
    assert_string_equal(o.err, "err\n");
    sbx_out_free(&o);
    /* user processes run as 65532 with the workspace as cwd and HOME */
    assert_int_equal(sbx_sh(g.gc, "id -u; id -g; pwd; echo $HOME", &o), 0);
    char want[1400];
    snprintf(want, sizeof(want), "65532\n65532\n%s\n%s\n", s_ws_in, s_ws_in);
    assert_string_equal(o.out, want);
    sbx_out_free(&o);
    /* a missing program is an error, not a process */
    const char *missing[] = {"/no/such/program", NULL};
    assert_int_equal(sbx_run(g.gc, missing, &o, 0), -ENOENT);
    /* unknown process and unknown op */
    uint64_t id;
    assert_int_equal(ka_guestconn_get(g.gc, 9999, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -ENOENT);
    assert_int_equal(ka_guestconn_ping(g.gc, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    s_stop(&g);
}

static void test_env_cwd(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    char sub[700];
    snprintf(sub, sizeof(sub), "%s/sub", s_ws);
    assert_int_equal(mkdir(sub, 0755), 0);
    const char *argv[] = {"/bin/sh", "-c", "echo $FOO:$BAR; pwd", NULL};
    const char *env[] = {"FOO=one", "BAR=two=2", NULL};
    ka_gp_start_t st = {.argv = argv, .env = env, .cwd = "sub"};
    uint64_t proc = s_start(&g, &st);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 0);
    char want[1400];
    snprintf(want, sizeof(want), "one:two=2\n%s/sub\n", s_ws_in);
    assert_string_equal(o.out, want);
    sbx_out_free(&o);
    rmdir(sub);
    s_stop(&g);
}

static void test_signal_to_group(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    /* the shell and its background child are one group: both must die */
    const char *argv[] = {"/bin/sh", "-c", "sleep 100 & echo $!; wait", NULL};
    ka_gp_start_t st = {.argv = argv};
    uint64_t proc = s_start(&g, &st);
    /* wait until the child's pid is printed */
    char *out = NULL;
    for (int i = 0; i < 200 && !out; i++) {
        sbx_out_t o = {0};
        uint64_t id;
        assert_int_equal(ka_guestconn_output(g.gc, proc, 0, 0, false, &id), 0);
        assert_int_equal(ka_guestconn_call(g.gc, id, 5000, sbx_out_cb, &o, NULL), 0);
        if (o.out && strchr(o.out, '\n'))
            out = o.out;
        else
            sbx_out_free(&o), usleep(10000);
    }
    assert_non_null(out);
    pid_t bg = (pid_t)atoi(out);
    free(out);
    assert_true(bg > 0);
    uint64_t id;
    ka_gp_frame_t *f = NULL;
    ka_gp_process_t p;
    assert_int_equal(ka_guestconn_signal(g.gc, proc, SIGTERM, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, &f), 0);
    assert_int_equal(ka_gp_frame_process(f, &p), 0);
    ka_gp_frame_free(&f);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 128 + SIGTERM);
    sbx_out_free(&o);
    /* the background sleep got the signal too (it may linger as a zombie for a moment) */
    int gone = 0;
    for (int i = 0; i < 200 && !gone; i++) {
        gone = s_pid_gone(&g, bg);
        if (!gone)
            usleep(10000);
    }
    assert_true(gone);
    /* bad signal numbers are refused */
    assert_int_equal(ka_guestconn_signal(g.gc, proc, 99, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -EINVAL);
    s_stop(&g);
}

static void test_timeout_kills_group(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *argv[] = {"/bin/sh", "-c", "sleep 30; echo not-reached", NULL};
    ka_gp_start_t st = {.argv = argv, .timeout_ms = 200};
    uint64_t proc = s_start(&g, &st);
    sbx_out_t o;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 128 + SIGKILL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_null(o.out);
    sbx_out_free(&o);
    double el = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(el < 10.0);
    s_stop(&g);
}

static void test_stdin(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *argv[] = {"/bin/cat", NULL};
    ka_gp_start_t st = {.argv = argv, .stdin_open = true};
    uint64_t proc = s_start(&g, &st);
    uint64_t id;
    ka_gp_frame_t *f = NULL;
    uint64_t written = 0;
    assert_int_equal(ka_guestconn_input(g.gc, proc, "abc", 3, false, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, &f), 0);
    assert_true(ka_gp_get_u64(ka_gp_frame_map(f), "written", &written));
    assert_int_equal(written, 3);
    ka_gp_frame_free(&f);
    assert_int_equal(ka_guestconn_input(g.gc, proc, "def\n", 4, true, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 0);
    assert_string_equal(o.out, "abcdef\n");
    sbx_out_free(&o);
    /* once closed, input is refused */
    assert_int_equal(ka_guestconn_input(g.gc, proc, "x", 1, false, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -EPIPE);
    /* without stdin, input is refused and stdin reads as empty */
    const char *argv2[] = {"/bin/sh", "-c", "cat; echo done", NULL};
    ka_gp_start_t st2 = {.argv = argv2};
    proc = s_start(&g, &st2);
    assert_int_equal(ka_guestconn_input(g.gc, proc, "x", 1, false, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -EPIPE);
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 0);
    assert_string_equal(o.out, "done\n");
    sbx_out_free(&o);
    s_stop(&g);
}

static int64_t s_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Stdin is answered once the process has taken it; a second input meanwhile is refused. */
static void test_stdin_acked_when_taken(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *argv[] = {"/bin/sh", "-c", "sleep 1; wc -c", NULL};
    ka_gp_start_t st = {.argv = argv, .stdin_open = true};
    uint64_t proc = s_start(&g, &st);
    enum { BIG = 300 << 10 }; /* more than a pipe holds */
    char *big = calloc(1, BIG);
    assert_non_null(big);
    uint64_t a, b, written = 0;
    ka_gp_frame_t *f = NULL;
    int64_t t0 = s_ms();
    assert_int_equal(ka_guestconn_input(g.gc, proc, big, BIG, false, &a), 0);
    assert_int_equal(ka_guestconn_input(g.gc, proc, "x", 1, false, &b), 0);
    assert_int_equal(ka_guestconn_call(g.gc, b, 5000, NULL, NULL, NULL), -EBUSY);
    assert_int_equal(ka_guestconn_call(g.gc, a, 5000, NULL, NULL, &f), 0);
    assert_true(s_ms() - t0 >= 700); /* not before `sleep 1` was over and wc read it */
    assert_true(ka_gp_get_u64(ka_gp_frame_map(f), "written", &written));
    assert_int_equal(written, BIG);
    ka_gp_frame_free(&f);
    assert_int_equal(ka_guestconn_input(g.gc, proc, NULL, 0, true, &a), 0);
    assert_int_equal(ka_guestconn_call(g.gc, a, 5000, NULL, NULL, NULL), 0);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 0);
    assert_int_equal(atoi(o.out), BIG);
    sbx_out_free(&o);
    free(big);
    s_stop(&g);
}

/* A process on a pseudo terminal: stdin/stdout are the terminal, its size is the start's and
 * follows a resize, input echoes, close sends the EOF character; resize needs a tty. */
static void test_tty(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *argv[] = {"/bin/sh", "-c",
                          "test -t 0 && test -t 1 && echo on-tty; stty size; read x; "
                          "echo got:$x; stty size; read y || echo eof; exit 5",
                          NULL};
    ka_gp_start_t st = {.argv = argv, .tty = true, .rows = 33, .cols = 77};
    uint64_t proc = s_start(&g, &st);
    uint64_t id;
    assert_int_equal(ka_guestconn_resize(g.gc, proc, 50, 132, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(ka_guestconn_input(g.gc, proc, "hi\n", 3, false, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(ka_guestconn_input(g.gc, proc, NULL, 0, true, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 5);
    assert_non_null(strstr(o.out, "on-tty\r\n"));
    /* the first size is the start's unless the resize came first; the second is the resize's */
    assert_true(strstr(o.out, "33 77\r\n") || strstr(o.out, "50 132\r\n"));
    assert_non_null(strstr(o.out, "hi\r\n")); /* the terminal's echo */
    assert_non_null(strstr(o.out, "got:hi\r\n50 132\r\neof\r\n"));
    assert_int_equal(o.err_len, 0);
    sbx_out_free(&o);
    /* bad window sizes, and a resize of a process without a terminal */
    assert_int_equal(ka_guestconn_resize(g.gc, proc, 0, 80, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -EINVAL);
    const char *cat[] = {"/bin/cat", NULL};
    ka_gp_start_t st2 = {.argv = cat, .stdin_open = true};
    proc = s_start(&g, &st2);
    assert_int_equal(ka_guestconn_resize(g.gc, proc, 24, 80, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -ENOTTY);
    assert_int_equal(ka_guestconn_input(g.gc, proc, NULL, 0, true, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 0);
    sbx_out_free(&o);
    s_stop(&g);
}

static void test_output_offsets(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *argv[] = {"/bin/sh", "-c", "printf 0123456789; printf abcdef >&2", NULL};
    ka_gp_start_t st = {.argv = argv};
    uint64_t proc = s_start(&g, &st);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, proc, 4, 2, &o), 0);
    assert_string_equal(o.out, "456789");
    assert_string_equal(o.err, "cdef");
    sbx_out_free(&o);
    /* replay from 0, not following: everything, then the end (with exit) */
    uint64_t id;
    ka_gp_frame_t *f = NULL;
    ka_gp_process_t p;
    memset(&o, 0, sizeof(o));
    assert_int_equal(ka_guestconn_output(g.gc, proc, 0, 0, false, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, sbx_out_cb, &o, &f), 0);
    assert_string_equal(o.out, "0123456789");
    assert_int_equal(ka_gp_frame_process(f, &p), 0);
    assert_int_equal(p.exit_code, 0);
    ka_gp_frame_free(&f);
    sbx_out_free(&o);
    /* offsets past the end: no bytes, only the exit (how to wait for exit) */
    assert_int_equal(s_follow(&g, proc, 1000, 1000, &o), 0);
    assert_null(o.out);
    assert_null(o.err);
    /* not following a running process returns what is spooled so far and ends */
    const char *argv2[] = {"/bin/sh", "-c", "echo first; sleep 30", NULL};
    ka_gp_start_t st2 = {.argv = argv2};
    proc = s_start(&g, &st2);
    char *got = NULL;
    for (int i = 0; i < 300 && !got; i++) {
        memset(&o, 0, sizeof(o));
        assert_int_equal(ka_guestconn_output(g.gc, proc, 0, 0, false, &id), 0);
        assert_int_equal(ka_guestconn_call(g.gc, id, 5000, sbx_out_cb, &o, &f), 0);
        assert_int_equal(ka_gp_frame_process(f, &p), -ENOENT); /* still running: no exit */
        ka_gp_frame_free(&f);
        if (o.out)
            got = o.out;
        else
            usleep(10000);
    }
    assert_non_null(got);
    assert_string_equal(got, "first\n");
    free(got);
    /* a follow stream can be cancelled */
    uint64_t sid, cid;
    assert_int_equal(ka_guestconn_output(g.gc, proc, 6, 0, true, &sid), 0);
    assert_int_equal(ka_guestconn_cancel(g.gc, sid, &cid), 0);
    assert_int_equal(ka_guestconn_call(g.gc, sid, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(ka_guestconn_call(g.gc, cid, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(ka_guestconn_signal(g.gc, proc, SIGKILL, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(s_follow(&g, proc, 0, 0, &o), 128 + SIGKILL);
    sbx_out_free(&o);
    s_stop(&g);
}

static void test_spool_cap(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, "--spool-cap=1000");
    sbx_out_t o;
    assert_int_equal(sbx_sh(g.gc, "yes | head -c 50000; echo done >&2", &o), 0);
    assert_int_equal(o.out_len, 1000);
    assert_string_equal(o.err, "done\n");
    sbx_out_free(&o);
    s_stop(&g);
}

static void test_process_limit(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *argv[] = {"/bin/sleep", "30", NULL};
    ka_gp_start_t st = {.argv = argv};
    uint64_t procs[KA_GP_MAX_PROCS];
    for (int i = 0; i < KA_GP_MAX_PROCS; i++)
        procs[i] = s_start(&g, &st);
    uint64_t id;
    assert_int_equal(ka_guestconn_start(g.gc, &st, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), -EAGAIN);
    /* one exits: a slot frees up */
    sbx_out_t o;
    assert_int_equal(ka_guestconn_signal(g.gc, procs[0], SIGKILL, &id), 0);
    assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
    assert_int_equal(s_follow(&g, procs[0], 0, 0, &o), 137);
    procs[0] = s_start(&g, &st);
    for (int i = 0; i < KA_GP_MAX_PROCS; i++) {
        assert_int_equal(ka_guestconn_signal(g.gc, procs[i], SIGKILL, &id), 0);
        assert_int_equal(ka_guestconn_call(g.gc, id, 5000, NULL, NULL, NULL), 0);
        assert_int_equal(s_follow(&g, procs[i], 0, 0, &o), 137);
    }
    s_stop(&g);
}

/* The guest's open descriptors (-1 inside a sandbox, where the test cannot see them). */
static int s_guest_fds(const guest_t *g)
{
#ifdef SBX_IN_SANDBOX
    (void)g;
    return -1;
#else
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)g->pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
#endif
}

/* 600 processes one after another, more than a sandbox's 1,024 descriptors would allow if each
 * exited process kept its two spools open: every one runs, the guest holds no more descriptors
 * than before, and the first one's output can still be read. */
static void test_many_processes(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    const char *first[] = {"/bin/echo", "first", NULL};
    ka_gp_start_t st = {.argv = first};
    uint64_t p1 = s_start(&g, &st);
    sbx_out_t o;
    assert_int_equal(s_follow(&g, p1, 0, 0, &o), 0);
    sbx_out_free(&o);
    int before = s_guest_fds(&g);
    for (int i = 0; i < 600; i++) {
        char script[64], want[32];
        snprintf(script, sizeof script, "echo %d; echo e%d >&2", i, i);
        snprintf(want, sizeof want, "%d\n", i);
        assert_int_equal(sbx_sh(g.gc, script, &o), 0);
        assert_string_equal(o.out, want);
        sbx_out_free(&o);
    }
    assert_true(s_guest_fds(&g) <= before + 2);
    assert_int_equal(s_follow(&g, p1, 0, 0, &o), 0);
    assert_string_equal(o.out, "first\n");
    sbx_out_free(&o);
    assert_int_equal(s_follow(&g, p1, 3, 0, &o), 0); /* from an offset, reopened again */
    assert_string_equal(o.out, "st\n");
    sbx_out_free(&o);
    assert_true(s_guest_fds(&g) <= before + 2);
    s_stop(&g);
}

/* Reads path through the guest; returns the error or 0 with the content in *o. */
static int s_read(guest_t *g, const char *path, uint32_t mode, sbx_out_t *o)
{
    uint64_t id;
    memset(o, 0, sizeof(*o));
    assert_int_equal(ka_guestconn_read(g->gc, path, mode, &id), 0);
    return ka_guestconn_call(g->gc, id, 90000, sbx_out_cb, o, NULL);
}

static int s_write(guest_t *g, const char *path, uint32_t mode, uint64_t seek, const char *data,
                   size_t len)
{
    uint64_t id;
    int rc = ka_guestconn_write(g->gc, path, mode, seek, data, len, &id);
    if (rc < 0)
        return rc;
    return ka_guestconn_call(g->gc, id, 90000, NULL, NULL, NULL);
}

static void test_files(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    sbx_out_t o;
    assert_int_equal(s_write(&g, "dir/a/file.txt", 0, 0, "hello world", 11), 0);
    assert_int_equal(s_read(&g, "dir/a/file.txt", 0, &o), 0);
    assert_string_equal(o.out, "hello world");
    sbx_out_free(&o);
    /* seek_offset keeps the rest; past the end pads with zeros; 0 truncates */
    assert_int_equal(s_write(&g, "dir/a/file.txt", 0, 6, "WORLD", 5), 0);
    assert_int_equal(s_read(&g, "dir/a/file.txt", 0, &o), 0);
    assert_string_equal(o.out, "hello WORLD");
    sbx_out_free(&o);
    assert_int_equal(s_write(&g, "dir/a/file.txt", 0, 2, "LL", 2), 0);
    assert_int_equal(s_read(&g, "dir/a/file.txt", 0, &o), 0);
    assert_string_equal(o.out, "heLLo WORLD");
    sbx_out_free(&o);
    assert_int_equal(s_write(&g, "dir/a/file.txt", 0, 13, "!", 1), 0);
    assert_int_equal(s_read(&g, "dir/a/file.txt", 0, &o), 0);
    assert_int_equal(o.out_len, 14);
    assert_memory_equal(o.out, "heLLo WORLD\0\0!", 14);
    sbx_out_free(&o);
    assert_int_equal(s_write(&g, "/data/workspace/../x", 0, 0, "x", 1), -EACCES);
    assert_int_equal(s_write(&g, "dir/a/file.txt", 0, 0, "new", 3), 0);
    assert_int_equal(s_read(&g, "dir/a/file.txt", 0, &o), 0);
    assert_string_equal(o.out, "new");
    sbx_out_free(&o);
    /* the file is the user's, with the mode asked for */
    assert_int_equal(s_write(&g, "script.sh", 0750, 0, "#!/bin/sh\necho ran\n", 19), 0);
    char p[700];
    struct stat st;
    snprintf(p, sizeof(p), "%s/script.sh", s_ws);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0750);
#ifdef SBX_IN_SANDBOX
    assert_int_equal(st.st_uid, ka_driver_owner(g.d, g.sb)); /* the sandbox's own host uid */
    assert_true(st.st_uid >= 1000000);
#else
    assert_int_equal(st.st_uid, 65532);
#endif
    assert_int_equal(sbx_sh(g.gc, "./script.sh", &o), 0);
    assert_string_equal(o.out, "ran\n");
    sbx_out_free(&o);
    /* missing: NOT_FOUND with mode 0, created empty (with parents) with a mode */
    assert_int_equal(s_read(&g, "nope/missing.txt", 0, &o), -ENOENT);
    assert_int_equal(s_read(&g, "made/by/read.txt", 0600, &o), 0);
    assert_null(o.out);
    snprintf(p, sizeof(p), "%s/made/by/read.txt", s_ws);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* a directory is not a file */
    assert_int_equal(s_read(&g, "dir", 0, &o), -EISDIR);
    s_stop(&g);
}

static void test_path_escapes(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    sbx_out_t o;
    /* links made by the user inside the workspace */
    assert_int_equal(sbx_sh(g.gc,
                            "ln -s / rootlink; ln -s /etc/passwd pw; ln -s .. up; "
                            "mkdir -p d; ln -s ../../ d/up2; ln -s sub/f inlink; "
                            "mkdir sub; echo inside > sub/f",
                            &o),
                     0);
    sbx_out_free(&o);
    const char *bad[] = {"../x",
                         "../../etc/passwd",
                         "/etc/passwd",
                         "rootlink/etc/passwd",
                         "pw",
                         "up/x",
                         "d/up2/x",
                         "sub/../../x",
                         "/data/workspace/../../etc/passwd"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int r = s_read(&g, bad[i], 0, &o);
        if (r != -EACCES)
            fprintf(stderr, "read %s -> %d\n", bad[i], r);
        assert_int_equal(r, -EACCES);
        sbx_out_free(&o);
        r = s_write(&g, bad[i], 0, 0, "pwned", 5);
        if (r != -EACCES)
            fprintf(stderr, "write %s -> %d\n", bad[i], r);
        assert_int_equal(r, -EACCES);
    }
    /* writes through a symlinked parent are refused even when creating parents */
    assert_int_equal(s_write(&g, "rootlink/tmp/newdir/x", 0, 0, "pwned", 5), -EACCES);
    assert_int_equal(access("/tmp/newdir", F_OK), -1);
    /* a link that stays inside is fine */
    assert_int_equal(s_read(&g, "inlink", 0, &o), 0);
    assert_string_equal(o.out, "inside\n");
    sbx_out_free(&o);
    assert_int_equal(s_read(&g, "/data/workspace/sub/f", 0, &o), 0);
    assert_string_equal(o.out, "inside\n");
    sbx_out_free(&o);
    s_stop(&g);
}

static void test_file_cap(void **unused)
{
    (void)unused;
    guest_t g;
    s_spawn(&g, NULL);
    size_t n = KA_GP_FILE_CAP;
    char *big = malloc(n + 1);
    assert_non_null(big);
    for (size_t i = 0; i <= n; i++)
        big[i] = (char)('a' + i % 26);
    /* exactly 64 MiB round-trips */
    assert_int_equal(s_write(&g, "big.bin", 0, 0, big, n), 0);
    sbx_out_t o;
    assert_int_equal(s_read(&g, "big.bin", 0, &o), 0);
    assert_int_equal(o.out_len, n);
    assert_memory_equal(o.out, big, n);
    sbx_out_free(&o);
    /* one byte more is refused, on both paths */
    assert_int_equal(s_write(&g, "big.bin", 0, 0, big, n + 1), -EFBIG);
    assert_int_equal(sbx_sh(g.gc, "printf x >> big.bin", &o), 0);
    sbx_out_free(&o);
    assert_int_equal(s_read(&g, "big.bin", 0, &o), -EFBIG);
    free(big);
    s_stop(&g);
}

#ifndef SBX_IN_SANDBOX
/* --socket PATH: the guest connects to a unix socket (one bind-mounted into a sandbox). */
static void test_socket_mode(void **unused)
{
    (void)unused;
    char path[200];
    snprintf(path, sizeof(path), "%s/node.sock", s_tmp);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l, 1), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[] = {"kagent-sandbox-guest",
                        "--socket",
                        path,
                        "--workspace",
                        s_ws,
                        "--log-dir",
                        s_logs,
                        NULL};
        execv(SBX_GUEST_PATH, argv);
        _exit(127);
    }
    int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    assert_true(c >= 0);
    close(l);
    unlink(path);
    guest_t g = {.pid = pid, .gc = ka_guestconn_new(c, true)};
    ka_gp_frame_t *f = NULL;
    assert_int_equal(ka_guestconn_wait(g.gc, 5000, &f), 0);
    const char *ev;
    size_t n;
    assert_true(ka_gp_get_bytes(ka_gp_frame_map(f), "ev", &ev, &n));
    assert_int_equal(n, 5);
    ka_gp_frame_free(&f);
    sbx_out_t o;
    assert_int_equal(sbx_sh(g.gc, "echo over-socket", &o), 0);
    assert_string_equal(o.out, "over-socket\n");
    sbx_out_free(&o);
    s_stop(&g);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_echo_and_exit_codes),
        cmocka_unit_test(test_env_cwd),
        cmocka_unit_test(test_signal_to_group),
        cmocka_unit_test(test_timeout_kills_group),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_stdin_acked_when_taken),
        cmocka_unit_test(test_tty),
        cmocka_unit_test(test_output_offsets),
        cmocka_unit_test(test_spool_cap),
        cmocka_unit_test(test_process_limit),
        cmocka_unit_test(test_many_processes),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_path_escapes),
        cmocka_unit_test(test_file_cap),
#ifndef SBX_IN_SANDBOX
        cmocka_unit_test(test_socket_mode),
#endif
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
