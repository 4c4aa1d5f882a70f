/* Unit tests for node/host_limits (ka_host_limits): what a capacity needs, and the raise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <linux/capability.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "host_limits.h"

static void s_pools(ka_config_t *cfg, int64_t a, int64_t b)
{
    ka_config_defaults(cfg);
    cfg->pools[1] = cfg->pools[0];
    cfg->pools[0].capacity = a;
    cfg->pools[1].capacity = b;
    cfg->n_pools = 2;
}

static void test_plan(void **unused)
{
    ka_config_t cfg;
    ka_config_defaults(&cfg);
    assert_int_equal(ka_host_capacity(&cfg), 1000);
    ka_host_limits_t l = ka_host_limits_plan(&cfg, 1048576);
    assert_int_equal(l.nofile, 4096 + 4 * 1000);
    assert_true(l.pid_max <= 32768); /* the default config leaves the kernel default alone */

    s_pools(&cfg, 10000, 10); /* the density bench's node: every pool counts */
    assert_int_equal(ka_host_capacity(&cfg), 10010);
    l = ka_host_limits_plan(&cfg, 1048576);
    assert_int_equal(l.nofile, 4096 + 4 * 10010);
    assert_int_equal(l.pid_max, 16384 + 4 * 10010);
    assert_true(l.nofile > 20000); /* this machine's inherited limit, which stopped 10,000 */
    assert_true(l.pid_max > 32768);

    l = ka_host_limits_plan(&cfg, 30000); /* fs.nr_open caps what setrlimit may ask */
    assert_int_equal(l.nofile, 30000);
    s_pools(&cfg, 1000000, 1000000);
    l = ka_host_limits_plan(&cfg, 1048576);
    assert_int_equal(l.nofile, 1048576);
    assert_int_equal(l.pid_max, KA_HOST_PID_MAX_LIMIT);
}

/* In a child: a low soft RLIMIT_NOFILE goes up to the plan, and the note says so; a second raise
 * changes nothing and says nothing. pid_max needs no raise at capacity 1 (asserted first, so the
 * test never writes the host's sysctl). */
static void test_raise_nofile(void **unused)
{
    ka_config_t cfg;
    s_pools(&cfg, 1, 0);
    uint64_t pid_max = 0;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%" SCNu64, &pid_max), 1);
    fclose(f);
    assert_true(pid_max >= ka_host_limits_plan(&cfg, 1048576).pid_max);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 64;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            _exit(10);
        char note[128];
        if (ka_host_limits_raise(&cfg, note, sizeof note) != 0)
            _exit(11);
        if (strcmp(note, "nofile=64->4100") != 0)
            _exit(12);
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur != 4100 || rl.rlim_max < 4100)
            _exit(13);
        if (ka_host_limits_raise(&cfg, note, sizeof note) != 0 || note[0])
            _exit(14);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Without CAP_SYS_RESOURCE the hard limit cannot go up: the soft one goes to it, the note says
 * what was wanted, and the result is -EPERM. */
static void test_raise_nofile_to_hard(void **unused)
{
    ka_config_t cfg;
    s_pools(&cfg, 1, 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {.rlim_cur = 64, .rlim_max = 200};
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            _exit(10);
        struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
        struct __user_cap_data_struct d[2];
        if (syscall(SYS_capget, &h, d) < 0)
            _exit(11);
        d[CAP_SYS_RESOURCE / 32].effective &= ~(1u << (CAP_SYS_RESOURCE % 32));
        d[CAP_SYS_RESOURCE / 32].permitted &= ~(1u << (CAP_SYS_RESOURCE % 32));
        if (syscall(SYS_capset, &h, d) < 0)
            _exit(12);
        char note[128];
        if (ka_host_limits_raise(&cfg, note, sizeof note) != -EPERM)
            _exit(13);
        if (strcmp(note, "nofile=64->200 nofile_wanted=4100") != 0)
            _exit(14);
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur != 200 || rl.rlim_max != 200)
            _exit(15);
        if (ka_host_limits_raise(&cfg, note, sizeof note) != -EPERM || /* at the hard already */
            strcmp(note, "nofile_wanted=4100") != 0)
            _exit(16);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_raise_nofile),
        cmocka_unit_test(test_raise_nofile_to_hard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
