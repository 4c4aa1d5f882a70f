/*
 * Unit tests for actors/substrate: the `namespaces` driver (start, stats, stop, crash
 * cleanup, resource accounting over 100 cycles) with a busybox rootfs and the real guest.
 * Runs as root; uses real namespaces and cgroups.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ka_basens.h"
#include "ka_cgroup.h"
#include "ka_volume.h"
#include "sbx_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/ioctl.h>
#include <sys/sysmacros.h>
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

static ka_driver_t *s_driver(void);

static int s_teardown(void **unused)
{
    (void)unused;
    /* a driver over the same state dir cleans what a failed test left; destroy drops the
     * parent cgroups */
    ka_driver_t *d = s_driver();
    ka_driver_destroy(&d);
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static ka_driver_t *s_driver(void)
{
    ka_ns_opts_t o = {.uid_base = 110000000, /* this test's own host uids (tests/lib/uids.sh) */
                      .state_dir = s_state,
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

static void test_bad_specs(void **unused)
{
    (void)unused;
    ka_driver_t *d = s_driver();
    const char *lower[] = {s_rootfs};
    const char *ids[] = {"", "../x", "a/b", ".hidden", "x y"};
    ka_sandbox_t *sb = NULL;
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        ka_sandbox_spec_t spec = {.id = ids[i], .lowerdirs = lower, .n_lower = 1};
        assert_int_equal(ka_driver_start(d, &spec, &sb), -EINVAL);
        assert_null(sb);
    }
    ka_sandbox_spec_t none = {.id = "nolayers", .lowerdirs = lower, .n_lower = 0};
    assert_int_equal(ka_driver_start(d, &none, &sb), -EINVAL);
    /* a layer that does not exist: the start fails and leaves nothing */
    const char *bad[] = {"/nonexistent/layer"};
    ka_sandbox_spec_t missing = {.id = "badlayer", .lowerdirs = bad, .n_lower = 1};
    assert_true(ka_driver_start(d, &missing, &sb) < 0);
    assert_null(sb);
    char p[400];
    snprintf(p, sizeof(p), "%s/badlayer", s_state);
    assert_int_equal(access(p, F_OK), -1);
    /* the same id twice: the second start is refused and does not harm the first */
    ka_sandbox_t *first = s_start(d, "twice");
    ka_sandbox_spec_t again = {.id = "twice", .lowerdirs = lower, .n_lower = 1};
    assert_int_equal(ka_driver_start(d, &again, &sb), -EEXIST);
    ka_guestconn_t *gc = ka_guestconn_new(ka_driver_channel(d, first), false);
    sbx_out_t o;
    assert_int_equal(sbx_sh(gc, "echo still-here", &o), 0);
    assert_string_equal(o.out, "still-here\n");
    sbx_out_free(&o);
    ka_guestconn_destroy(&gc);
    assert_int_equal(ka_driver_stop(d, &first), 0);
    /* destroying the driver stops what is still running */
    ka_sandbox_t *left = s_start(d, "left-running");
    snprintf(p, sizeof(p), "%s/left-running", s_state);
    ka_sandbox_stats_t st;
    assert_int_equal(ka_driver_stats(d, left, &st), 0);
    assert_int_equal(access(p, F_OK), 0);
    ka_driver_destroy(&d);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(kill(st.guest_pid, 0), -1);
}

static bool s_cgroup_exists(const char *id)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd),
             "find /sys/fs/cgroup -maxdepth 5 -type d -path '*/%s/%s' | grep -q .", s_cgname, id);
    return system(cmd) == 0;
}

/* A node that dies with a sandbox running: the next start kills what is left and removes its
 * cgroups, keeps its /data (a crash loses none) for a start of the same id with reuse_data,
 * and discard removes it. */
static void test_crash_cleanup(void **unused)
{
    (void)unused;
    char p[400], f[450];
    snprintf(p, sizeof(p), "%s/crashed", s_state);
    snprintf(f, sizeof(f), "%s/data/workspace/acked", p);
    /* a "node" that starts a sandbox, writes to its /data and dies without stopping it */
    pid_t node = fork();
    assert_true(node >= 0);
    if (node == 0) {
        ka_ns_opts_t o = {.uid_base = 110000000, /* this test's own host uids (tests/lib/uids.sh) */
                          .state_dir = s_state,
                          .guest_path = SBX_GUEST_PATH,
                          .pids_max = 64,
                          .cgroup_name = s_cgname};
        ka_driver_t *d = ka_namespaces_new(&o, NULL);
        const char *lower[] = {s_rootfs};
        ka_sandbox_spec_t spec = {.id = "crashed", .lowerdirs = lower, .n_lower = 1};
        ka_sandbox_t *sb = NULL;
        if (!d || ka_driver_start(d, &spec, &sb) < 0)
            _exit(1);
        FILE *w = fopen(f, "w");
        if (!w || fputs("kept\n", w) < 0 || fclose(w) != 0)
            _exit(1);
        raise(SIGKILL);
    }
    int st = 0;
    assert_int_equal(waitpid(node, &st, 0), node);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(access(p, F_OK), 0); /* left behind */
    assert_true(s_cgroup_exists("crashed"));
    /* the next node start cleans what ran, keeps the data */
    ka_driver_t *d = s_driver();
    assert_false(s_cgroup_exists("crashed"));
    assert_true(ka_driver_kept(d, "crashed")); /* its volume unmounted until a start reuses it */
    const char *lower[] = {s_rootfs};
    ka_sandbox_spec_t spec = {
        .id = "crashed", .lowerdirs = lower, .n_lower = 1, .reuse_data = true};
    ka_sandbox_t *sb = NULL;
    assert_int_equal(ka_driver_start(d, &spec, &sb), 0);
    assert_false(ka_driver_kept(d, "crashed"));
    assert_int_equal(access(f, F_OK), 0); /* booted on it */
    assert_int_equal(ka_driver_park(d, &sb), 0);
    assert_true(ka_driver_kept(d, "crashed"));
    assert_int_equal(ka_driver_discard(d, "crashed"), 0);
    assert_false(ka_driver_kept(d, "crashed"));
    assert_int_equal(access(p, F_OK), -1);
    ka_driver_destroy(&d);
}

/* --- resource accounting ------------------------------------------------------------------ */

static long s_count_cmd(const char *cmd)
{
    FILE *f = popen(cmd, "r");
    long n = -1;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1)
            n = -1;
        pclose(f);
    }
    return n;
}

/* Processes whose parent is this test (sandbox guests are; zombies count too). */
static long s_children(void)
{
    DIR *d = opendir("/proc");
    long n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char p[300], buf[512];
        snprintf(p, sizeof(p), "/proc/%s/stat", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = 0;
        char *rp = strrchr(buf, ')');
        int ppid = -1;
        char state;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == (int)getpid())
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

typedef struct counts {
    long mounts, cgroups, children, dirs, fds, volumes, loops;
} counts_t;

static void s_counts(counts_t *c)
{
    char cmd[400];
    /* only what this driver could leave: other tests and builds on the machine mount and
     * unmount elsewhere, and their cgroups come and go (find's complaints are theirs); the
     * spare volumes (and the guest's copy) come and go with the driver's filler thread, so
     * they are counted apart: the claimed volumes, and the loop devices behind any of them */
    snprintf(cmd, sizeof(cmd),
             "grep -F '%s' /proc/self/mountinfo | grep -v -e '/\\.volumes/' -e '/\\.guest ' | "
             "wc -l",
             s_tmp);
    c->mounts = s_count_cmd(cmd);
    snprintf(cmd, sizeof(cmd), "ls '%s/.volumes' 2>/dev/null | grep -c '\\.used$'", s_state);
    c->volumes = s_count_cmd(cmd);
    snprintf(cmd, sizeof(cmd),
             "cat /sys/block/loop*/loop/backing_file 2>/dev/null | grep -c '^%s/'", s_state);
    c->loops = s_count_cmd(cmd);
    snprintf(cmd, sizeof(cmd),
             "find /sys/fs/cgroup -maxdepth 6 -type d -path '*%s*' 2>/dev/null | wc -l", s_cgname);
    c->cgroups = s_count_cmd(cmd);
    c->children = s_children();
    snprintf(cmd, sizeof(cmd), "find '%s' -path '*/.volumes' -prune -o -print | wc -l", s_state);
    c->dirs = s_count_cmd(cmd);
    c->fds = s_count_cmd("ls /proc/self/fd | wc -l"); /* the shell's: inherited from us */
    assert_true(c->mounts >= 0 && c->cgroups >= 0 && c->children >= 0 && c->dirs > 0);
}

static void test_accounting_100_cycles(void **unused)
{
    (void)unused;
    counts_t before, mid, after;
    s_counts(&before);
    ka_driver_t *d = s_driver();
    const char *lower[] = {s_rootfs};
    /* one warm-up cycle creates the driver's parent cgroups, which live as long as it does */
    ka_sandbox_spec_t warm = {.id = "warm", .lowerdirs = lower, .n_lower = 1};
    ka_sandbox_t *wsb = NULL;
    assert_int_equal(ka_driver_start(d, &warm, &wsb), 0);
    assert_int_equal(ka_driver_stop(d, &wsb), 0);
    s_counts(&mid);
    /* the parents: memory, cpu, pids, cpuacct, freezer on v1; one dir on v2 */
    assert_int_equal(mid.cgroups, before.cgroups + (ka_cgroup_is_v2() ? 1 : 5));
    for (int i = 0; i < 100; i++) {
        char id[32];
        snprintf(id, sizeof(id), "cycle-%d", i);
        ka_sandbox_spec_t spec = {.id = id, .lowerdirs = lower, .n_lower = 1};
        ka_sandbox_t *sb = NULL;
        assert_int_equal(ka_driver_start(d, &spec, &sb), 0);
        if (i % 10 == 0) { /* sometimes with a process running at stop */
            ka_guestconn_t *gc = ka_guestconn_new(ka_driver_channel(d, sb), false);
            const char *argv[] = {"/bin/sleep", "60", NULL};
            ka_gp_start_t st = {.argv = argv};
            uint64_t rid;
            assert_int_equal(ka_guestconn_start(gc, &st, &rid), 0);
            assert_int_equal(ka_guestconn_call(gc, rid, 5000, NULL, NULL, NULL), 0);
            ka_guestconn_destroy(&gc);
        }
        assert_int_equal(ka_driver_stop(d, &sb), 0);
    }
    counts_t end;
    s_counts(&end);
    assert_int_equal(end.mounts, mid.mounts);
    assert_int_equal(end.cgroups, mid.cgroups);
    assert_int_equal(end.children, mid.children);
    assert_int_equal(end.dirs, mid.dirs);
    assert_int_equal(end.fds, mid.fds);
    assert_int_equal(end.volumes, 0);
    ka_driver_destroy(&d);
    s_counts(&after);
    assert_int_equal(after.mounts, before.mounts);
    assert_int_equal(after.cgroups, before.cgroups);
    assert_int_equal(after.children, before.children);
    assert_int_equal(after.dirs, before.dirs);
    assert_int_equal(after.fds, before.fds);
    assert_int_equal(after.loops, 0);
}

/* True if dir carries FS_TOPDIR_FL (ka_dir_spread). */
static bool s_topdir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), flags = 0;
    assert_true(fd >= 0);
    assert_int_equal(ioctl(fd, FS_IOC_GETFLAGS, &flags), 0);
    close(fd);
    return flags & FS_TOPDIR_FL;
}

/* The namespace sandboxes are copied from (ka_basens.h) holds no volume while the node's holds
 * a running sandbox's; a sandbox started after has its own volume as /data, the same files the
 * node sees at the volume's path, and no other sandbox's. */
static void test_base_namespace(void **unused)
{
    (void)unused;
    ka_driver_t *d = s_driver();
    ka_sandbox_t *a = s_start(d, "sbx-base-a");
    char vols[400], path[700];
    snprintf(vols, sizeof(vols), "%s/.volumes", s_state);
    /* sandboxes' and volumes' directories spread over ext4's block groups (ka_tree.h) */
    assert_true(s_topdir(s_state));
    assert_true(s_topdir(vols));
    int self = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    assert_true(self >= 0);
    assert_true(ka_basens_count(self, vols) >= 1);
    int base = ka_basens_open(vols);
    assert_true(base >= 0);
    assert_int_equal(ka_basens_count(base, vols), 0);
    assert_true(ka_basens_count(self, vols) >= 1); /* nothing detached in the node's */
    close(base);
    close(self);

    ka_guestconn_t *ga = ka_guestconn_new(ka_driver_channel(d, a), false);
    sbx_out_t o;
    assert_int_equal(sbx_sh(ga, "echo from-a > /data/workspace/mine", &o), 0);
    sbx_out_free(&o);
    ka_sandbox_t *b = s_start(d, "sbx-base-b");
    ka_guestconn_t *gb = ka_guestconn_new(ka_driver_channel(d, b), false);
    assert_non_null(gb);
    assert_int_equal(sbx_sh(gb,
                            "echo from-b > /data/workspace/mine; cat /data/workspace/mine; "
                            "grep -c ' /data ' /proc/self/mountinfo",
                            &o),
                     0);
    assert_string_equal(o.out, "from-b\n1\n");
    sbx_out_free(&o);
    snprintf(path, sizeof(path), "%s/data/workspace/mine", ka_namespaces_dir(b));
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[32] = "";
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    assert_string_equal(line, "from-b\n");
    ka_guestconn_destroy(&ga);
    ka_guestconn_destroy(&gb);
    assert_int_equal(ka_driver_stop(d, &a), 0);
    assert_int_equal(ka_driver_stop(d, &b), 0);
    ka_driver_destroy(&d);
}

/* The index of the loop device holding the file system mounted at path, or -1. */
static int s_loop_of(const char *path)
{
    struct stat st;
    char sys[64], link[256];
    if (stat(path, &st) < 0)
        return -1;
    snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
    ssize_t n = readlink(sys, link, sizeof(link) - 1);
    if (n <= 0)
        return -1;
    link[n] = 0;
    const char *name = strrchr(link, '/');
    return name && strncmp(name, "/loop", 5) == 0 ? atoi(name + 5) : -1;
}

/* 1 if loop device index exists and nothing binds it, 0 if it is bound, -1 if it is gone. */
static int s_loop_unbound(int index)
{
    char p[64];
    snprintf(p, sizeof(p), "/sys/block/loop%d/size", index);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    long long sectors = -1;
    int ok = fscanf(f, "%lld", &sectors);
    fclose(f);
    return ok == 1 && sectors == 0;
}

/* 1 if loop device index is bound to a file outside dir (another test on the host took it). */
static int s_loop_elsewhere(int index, const char *dir)
{
    char p[64], file[4096];
    snprintf(p, sizeof(p), "/sys/block/loop%d/loop/backing_file", index);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    bool named = fgets(file, sizeof(file), f) != NULL;
    fclose(f);
    return named && strncmp(file, dir, strlen(dir)) != 0;
}

/* Volumes unmade (more released than the spares keep) leave their loop devices unbound; after
 * the filler's quiet spell (disk_reap_ms) the driver removes them (ka_volume.h), and a start
 * after that still gets a device. Other tests on the host may take one of these devices
 * meanwhile (an attach takes the lowest free index, and the reaper leaves a bound device alone),
 * and may add it back once it went: what is checked is that none is left unbound and that some
 * went or were taken by another. */
static void test_loop_devices_reaped(void **unused)
{
    (void)unused;
    ka_ns_opts_t o = {.uid_base = 110000000,
                      .state_dir = s_state,
                      .guest_path = SBX_GUEST_PATH,
                      .cpu_millis = 1000,
                      .mem_bytes = 128u << 20,
                      .pids_max = 64,
                      .cgroup_name = s_cgname,
                      .disk_spare = 1,
                      .disk_reap_ms = 200};
    int err = 0;
    ka_driver_t *d = ka_namespaces_new(&o, &err);
    assert_non_null(d);
    enum { N = 5 };
    ka_sandbox_t *sb[N];
    int loops[N];
    for (int i = 0; i < N; i++) {
        char id[32], vol[600];
        snprintf(id, sizeof(id), "sbx-reap-%d", i);
        sb[i] = s_start(d, id);
        snprintf(vol, sizeof(vol), "%s/vol/", ka_namespaces_dir(sb[i]));
        loops[i] = s_loop_of(vol);
        assert_true(loops[i] >= 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(ka_driver_stop(d, &sb[i]), 0);
    /* two stay as spares (twice disk_spare), bound; the others' devices must go */
    bool unbound = true, went = false;
    for (int t = 0; t < 500 && (unbound || !went); t++) {
        unbound = false;
        for (int i = 0; i < N; i++) {
            int u = s_loop_unbound(loops[i]);
            unbound = unbound || u == 1;
            went = went || u == -1 || s_loop_elsewhere(loops[i], s_state);
        }
        usleep(20000);
    }
    assert_false(unbound);
    assert_true(went);
    ka_sandbox_t *again = s_start(d, "sbx-reap-again");
    assert_int_equal(ka_driver_stop(d, &again), 0);
    ka_driver_destroy(&d);
}

/* A volume detached while its file system lives on elsewhere (here an open file; after a node's
 * crash, a sandbox's namespace still being torn down) is mounted again through the same loop
 * device: one file system, so what it had not written back yet is there. A second device on the
 * image used to show the file empty, or not at all. */
static void test_volume_remount_shares_live_fs(void **unused)
{
    (void)unused;
    char dir[400], link[450], path[600], file[700], buf[16] = "";
    snprintf(dir, sizeof(dir), "%s/remount-volumes", s_tmp);
    snprintf(link, sizeof(link), "%s/remount-claim", s_tmp);
    ka_volume_opts_t o = {.dir = dir, .bytes = 64u << 20};
    int err = 0;
    ka_volumes_t *v = ka_volumes_new(&o, &err);
    assert_non_null(v);
    assert_int_equal(ka_volume_claim(v, link, path, sizeof(path)), 0);
    snprintf(file, sizeof(file), "%s/acked", path);
    int w = open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(w >= 0);
    assert_int_equal(write(w, "acked\n", 6), 6); /* in the page cache only */
    struct stat before, after;
    assert_int_equal(fstat(w, &before), 0);
    assert_int_equal(ka_volume_unmount(v, path), 0);
    assert_int_equal(ka_volume_mount(v, path), 0);
    int r = open(file, O_RDONLY | O_CLOEXEC);
    assert_true(r >= 0);
    assert_int_equal(read(r, buf, sizeof(buf) - 1), 6);
    assert_string_equal(buf, "acked\n");
    assert_int_equal(fstat(r, &after), 0);
    assert_true(after.st_dev == before.st_dev);
    close(r);
    close(w);
    assert_int_equal(ka_volume_release(v, path, false), 0);
    unlink(link);
    ka_volumes_destroy(&v);
}

/* The skeleton's directories, with their modes, are in a volume made from the template and in a
 * released one that the filler emptied; what a sandbox wrote is not. */
static void s_check_skeleton(const char *vol)
{
    static const struct {
        const char *name;
        mode_t mode;
    } want[] = {{"data", 0755}, {"data/ws", 0750}, {"upper", 0711}, {"upper/w", 0700}};
    char p[700];
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", vol, want[i].name);
        assert_int_equal(lstat(p, &st), 0);
        assert_true(S_ISDIR(st.st_mode));
        assert_int_equal(st.st_mode & 07777, want[i].mode);
        assert_int_equal(st.st_uid, 0);
    }
    snprintf(p, sizeof(p), "%s/data/junk", vol);
    assert_int_equal(access(p, F_OK), -1);
}

static void test_volume_skeleton(void **unused)
{
    (void)unused;
    char dir[400], skel[400], link[450], path[600], again[600], p[700];
    snprintf(dir, sizeof(dir), "%s/skel-volumes", s_tmp);
    snprintf(skel, sizeof(skel), "%s/skel", s_tmp);
    snprintf(link, sizeof(link), "%s/skel-claim", s_tmp);
    static const struct {
        const char *name;
        mode_t mode;
    } tree[] = {{"", 0755}, {"data", 0755}, {"data/ws", 0750}, {"upper", 0711}, {"upper/w", 0700}};
    for (size_t i = 0; i < sizeof(tree) / sizeof(tree[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", skel, tree[i].name);
        assert_true(mkdir(p, 0700) == 0 || errno == EEXIST);
        assert_int_equal(chmod(p, tree[i].mode), 0);
    }
    ka_volume_opts_t o = {.dir = dir, .bytes = 64u << 20, .spare = 1, .skeleton = skel};
    int err = 0;
    ka_volumes_t *v = ka_volumes_new(&o, &err);
    assert_non_null(v);
    assert_int_equal(ka_volume_claim(v, link, path, sizeof(path)), 0);
    s_check_skeleton(path);
    /* a sandbox's changes: a file, a directory gone, a mode changed */
    snprintf(p, sizeof(p), "%s/data/junk", path);
    int fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(p, sizeof(p), "%s/upper/w", path);
    assert_int_equal(rmdir(p), 0);
    snprintf(p, sizeof(p), "%s/data", path);
    assert_int_equal(chmod(p, 0777), 0);
    unlink(link);
    assert_int_equal(ka_volume_release(v, path, true), 0);
    /* the filler empties it and makes the skeleton again; the next claim takes it (the spares
     * are a stack) */
    snprintf(p, sizeof(p), "%s/upper/w", path);
    for (int i = 0; i < 500 && access(p, F_OK) != 0; i++)
        usleep(10000);
    assert_int_equal(ka_volume_claim(v, link, again, sizeof(again)), 0);
    assert_string_equal(again, path);
    s_check_skeleton(again);
    unlink(link);
    assert_int_equal(ka_volume_release(v, again, false), 0);
    ka_volumes_destroy(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_exec_stop),
        cmocka_unit_test(test_bad_specs),
        cmocka_unit_test(test_crash_cleanup),
        cmocka_unit_test(test_base_namespace),
        cmocka_unit_test(test_accounting_100_cycles),
        cmocka_unit_test(test_loop_devices_reaped),
        cmocka_unit_test(test_volume_remount_shares_live_fs),
        cmocka_unit_test(test_volume_skeleton),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
