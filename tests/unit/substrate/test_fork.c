/*
 * The namespaces driver's fork: a running (frozen) sandbox's /data and root changes copied to
 * a kept volume for a new id, booted with reuse_data + reuse_root. The copy keeps overlay
 * whiteouts (a deleted image file stays deleted), opaque directories (an image directory
 * replaced whole stays replaced), modes, symlinks and empty directories, gives the source's
 * uid to the fork's, and a copy that does not fit the fork's volume fails -EDQUOT leaving
 * nothing for the id. Needs root (loop volumes, mknod, trusted xattrs), like test_substrate.
 */
#include "sbx_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "ka_driver.h"

static char s_tmp[256], s_rootfs[300], s_state[300], s_cgname[64];

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof(s_tmp), "/tmp/ka-fork-test-XXXXXX");
    if (!mkdtemp(s_tmp))
        return -1;
    snprintf(s_rootfs, sizeof(s_rootfs), "%s/rootfs", s_tmp);
    snprintf(s_state, sizeof(s_state), "%s/state", s_tmp);
    snprintf(s_cgname, sizeof(s_cgname), "kagent-fork-test-%d", (int)getpid());
    if (sbx_make_rootfs(s_rootfs))
        return -1;
    char cmd[700]; /* an image directory the source replaces whole */
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s/usr/lib-image' && echo lower > '%s/usr/lib-image/x'",
             s_rootfs, s_rootfs);
    return system(cmd) == 0 ? 0 : -1;
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
                      .cgroup_name = s_cgname,
                      .disk_bytes = 32u << 20,
                      .disk_spare = 1};
    int err = 0;
    ka_driver_t *d = ka_namespaces_new(&o, &err);
    if (!d)
        fprintf(stderr, "ka_namespaces_new: %s\n", strerror(-err));
    assert_non_null(d);
    return d;
}

static ka_sandbox_t *s_start(ka_driver_t *d, const char *id, bool fork)
{
    const char *lower[] = {s_rootfs};
    ka_sandbox_spec_t spec = {
        .id = id, .lowerdirs = lower, .n_lower = 1, .reuse_data = fork, .reuse_root = fork};
    ka_sandbox_t *sb = NULL;
    assert_int_equal(ka_driver_start(d, &spec, &sb), 0);
    return sb;
}

static void s_sh_is(ka_driver_t *d, ka_sandbox_t *sb, const char *script, const char *want)
{
    ka_guestconn_t *gc = ka_guestconn_new(ka_driver_channel(d, sb), false);
    assert_non_null(gc);
    sbx_out_t o;
    int rc = sbx_sh(gc, script, &o);
    if (rc || strcmp(o.out ? o.out : "", want) || getenv("FORK_DEBUG"))
        fprintf(stderr, "script: %s\nout: %s\nerr: %s\n", script, o.out ? o.out : "",
                o.err ? o.err : "");
    assert_int_equal(rc, 0);
    assert_string_equal(o.out ? o.out : "", want);
    sbx_out_free(&o);
    ka_guestconn_destroy(&gc);
}

/* The source's root changes made on the host, as overlayfs writes them: a whiteout for a
 * deleted image file, an opaque directory replacing an image directory. */
static void s_root_changes(ka_sandbox_t *sb)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/vol/upper/u/etc", ka_namespaces_dir(sb));
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/vol/upper/u/etc/layer-file", ka_namespaces_dir(sb));
    assert_int_equal(mknod(p, S_IFCHR | 0, makedev(0, 0)), 0);
    snprintf(p, sizeof(p), "%s/vol/upper/u/usr", ka_namespaces_dir(sb));
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/vol/upper/u/usr/lib-image", ka_namespaces_dir(sb));
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(setxattr(p, "trusted.overlay.opaque", "y", 1, 0), 0);
    snprintf(p, sizeof(p), "%s/vol/upper/u/usr/lib-image/only-upper", ka_namespaces_dir(sb));
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("upper\n", f);
    fclose(f);
}

static void test_fork_copies_data_and_root(void **unused)
{
    (void)unused;
    ka_driver_t *d = s_driver();
    ka_sandbox_t *a = s_start(d, "fork-src", false);
    s_sh_is(d, a,
            "cd /data/workspace && mkdir -p d/e empty && echo hi > d/e/f && chmod 0640 d/e/f && "
            "ln -s d/e/f link && echo ok",
            "ok\n");
    s_root_changes(a);
    assert_int_equal(ka_driver_freeze(d, a, true), 0);
    uint64_t bytes = 0;
    assert_int_equal(ka_driver_fork(d, a, "fork-new", &bytes), 0);
    assert_true(bytes >= 3 + 6);
    assert_int_equal(ka_driver_fork(d, a, "fork-new", &bytes), -EEXIST);
    assert_int_equal(ka_driver_freeze(d, a, false), 0);
    assert_true(ka_driver_kept(d, "fork-new"));
    ka_sandbox_t *b = s_start(d, "fork-new", true);
    assert_int_not_equal(ka_driver_owner(d, a), ka_driver_owner(d, b));
    s_sh_is(d, b,
            "cd /data/workspace; cat d/e/f; stat -c '%a %u' d/e/f; readlink link; "
            "test -d empty && echo empty-dir; test -e /etc/layer-file || echo whiteout-kept; "
            "ls /usr/lib-image; echo new > d/e/f",
            "hi\n640 65532\nd/e/f\nempty-dir\nwhiteout-kept\nonly-upper\n");
    s_sh_is(d, a, "cat /data/workspace/d/e/f", "hi\n"); /* the fork's writes stay its own */
    assert_int_equal(ka_driver_stop(d, &b), 0);
    assert_int_equal(ka_driver_stop(d, &a), 0);
    ka_driver_destroy(&d);
}

/* A source whose copy takes more than the fork's volume holds (a sparse file: the copy writes
 * its zeros): -EDQUOT, nothing kept for the id, no directory, the source unchanged. */
static void test_fork_past_quota(void **unused)
{
    (void)unused;
    ka_driver_t *d = s_driver();
    ka_sandbox_t *a = s_start(d, "fork-full", false);
    s_sh_is(d, a, "truncate -s 64M /data/workspace/sparse && echo filled", "filled\n");
    uint64_t bytes = 0;
    assert_int_equal(ka_driver_fork(d, a, "fork-toobig", &bytes), -EDQUOT);
    assert_false(ka_driver_kept(d, "fork-toobig"));
    char p[400];
    snprintf(p, sizeof(p), "%s/fork-toobig", s_state);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(ka_driver_fork(d, a, "../escape", &bytes), -EINVAL);
    s_sh_is(d, a, "stat -c %s /data/workspace/sparse", "67108864\n");
    assert_int_equal(ka_driver_stop(d, &a), 0);
    ka_driver_destroy(&d);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_fork needs root (loop volumes, namespaces)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_copies_data_and_root),
        cmocka_unit_test(test_fork_past_quota),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
