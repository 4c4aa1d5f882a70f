/*
 * Unit tests for actors/substrate: the `namespaces` driver (start, stats, stop, crash
 * cleanup, resource accounting over 100 cycles) with a busybox rootfs and the real guest.
 * Runs as root; uses real namespaces and cgroups.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sbx_fixture.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

static char s_tmp[256];
static char s_rootfs[300];
static char s_state[300];
static char s_cgname[64];

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof(s_tmp), "/tmp/ka-substrate-test-XXXXXX");
    if (!mkdtemp(s_tmp))
        return -1;
    snprintf(s_rootfs, sizeof(s_rootfs), "%s/rootfs", s_tmp);
    snprintf(s_state, sizeof(s_state), "%s/state", s_tmp);
    snprintf(s_cgname, sizeof(s_cgname), "kagent-test-%d", (int)getpid());
    return sbx_make_rootfs(s_rootfs);
}

static int s_teardown(void **unused)
{
    (void)unused;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static ka_driver_t *s_driver(void)
{
    ka_ns_opts_t o = {.state_dir = s_state,
                      .guest_path = SBX_GUEST_PATH,
                      .cpu_millis = 1000,
                      .mem_bytes = 128u << 20,
                      .pids_max = 64,
                      .cgroup_name = s_cgname};
    int err = 0;
    ka_driver_t *d = ka_namespaces_new(&o, &err);
    if (!d)
        fprintf(stderr, "ka_namespaces_new: %s\n", strerror(-err));
    assert_non_null(d);
    assert_string_equal(ka_driver_name(d), "namespaces");
    return d;
}

static ka_sandbox_t *s_start(ka_driver_t *d, const char *id)
{
    const char *lower[] = {s_rootfs};
    ka_sandbox_spec_t spec = {.id = id, .lowerdirs = lower, .n_lower = 1};
    ka_sandbox_t *sb = NULL;
    int rc = ka_driver_start(d, &spec, &sb);
    if (rc < 0) {
        char cmd[600];
        fprintf(stderr, "start %s: %s\n", id, strerror(-rc));
        snprintf(cmd, sizeof(cmd), "cat %s/%s/guest.log 2>/dev/null", s_state, id);
        (void)!system(cmd);
    }
    assert_int_equal(rc, 0);
    assert_non_null(sb);
    return sb;
}

static void test_start_exec_stop(void **unused)
{
    (void)unused;
    ka_driver_t *d = s_driver();
    ka_sandbox_t *sb = s_start(d, "sbx-basic");
    char dir[600];
    snprintf(dir, sizeof(dir), "%s", ka_namespaces_dir(sb));
    ka_guestconn_t *gc = ka_guestconn_new(ka_driver_channel(d, sb), false);
    assert_non_null(gc);
    sbx_out_t o;
    const char *argv[] = {"echo", "hello", NULL};
    assert_int_equal(sbx_run(gc, argv, &o, 0), 0);
    assert_string_equal(o.out, "hello\n");
    sbx_out_free(&o);
    /* identity and environment inside */
    assert_int_equal(
        sbx_sh(gc, "id -u; id -g; hostname; pwd; cat /proc/1/cmdline | tr '\\0' ' '", &o), 0);
    assert_string_equal(o.out, "65532\n65532\nsandbox\n/data/workspace\nkagent-sandbox-guest ");
    sbx_out_free(&o);
    /* network: loopback only, up */
    assert_int_equal(sbx_sh(gc,
                            "ip -o link | wc -l; ip -o link | grep -c 'lo: <LOOPBACK,UP'; "
                            "ping -c1 -W1 127.0.0.1 >/dev/null 2>&1; nc -l -p 7777 -e true & "
                            "sleep 0.2; echo x | nc 127.0.0.1 7777 && echo loopback-ok",
                            &o),
                     0);
    assert_string_equal(o.out, "1\n1\nloopback-ok\n");
    sbx_out_free(&o);
    /* stats from the cgroups */
    ka_sandbox_stats_t st;
    assert_int_equal(ka_driver_stats(d, sb, &st), 0);
    assert_int_equal(st.mem_limit, 128u << 20);
    assert_int_equal(st.pids_limit, 64);
    assert_true(st.pids >= 1);
    assert_true(st.mem_bytes > 0);
    assert_true(st.guest_pid > 1);
    assert_int_equal(kill(st.guest_pid, 0), 0);
    ka_guestconn_destroy(&gc);
    assert_int_equal(ka_driver_stop(d, &sb), 0);
    assert_null(sb);
    assert_int_equal(access(dir, F_OK), -1);
    assert_int_equal(kill(st.guest_pid, 0), -1);
    ka_driver_destroy(&d);
    assert_null(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_exec_stop),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
