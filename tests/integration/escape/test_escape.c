/*
 * Escape suite for the `namespaces` sandbox class: each test is one attempt to get out, and
 * each must be contained. Two sandboxes (A, the attacker, and B, a neighbour) from a busybox
 * rootfs that also holds a static probe (sbx_probe) and setuid-root copies of busybox and the
 * probe. Runs as root with real namespaces and cgroups; leaves nothing behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "sbx_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <mqueue.h>
#include <sys/inotify.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#define S_PIDS_MAX 64
#define S_MEM      (64u << 20)
#define S_DISK     (64u << 20) /* /data and the root's upper together */
#define S_INODES   2048
#define S_MIB      (1u << 20)

static char s_tmp[128], s_rootfs[200], s_state[200], s_secret[200], s_cg[64];
static ka_driver_t *s_d;
static ka_sandbox_t *s_a, *s_b;
static ka_guestconn_t *s_ga, *s_gb;

static int s_sys(const char *fmt, const char *a, const char *b)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), fmt, a, b);
    return system(cmd);
}

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof(s_tmp), "/tmp/ka-escape-XXXXXX");
    if (!mkdtemp(s_tmp) || chmod(s_tmp, 0755) < 0)
        return -1;
    snprintf(s_rootfs, sizeof(s_rootfs), "%s/rootfs", s_tmp);
    snprintf(s_state, sizeof(s_state), "%s/state", s_tmp);
    snprintf(s_secret, sizeof(s_secret), "%s/host-secret", s_tmp);
    snprintf(s_cg, sizeof(s_cg), "kagent-escape-%d", (int)getpid());
    if (sbx_make_rootfs(s_rootfs) < 0)
        return -1;
    if (s_sys("cp '%s' '%s/bin/probe'", SBX_PROBE_PATH, s_rootfs) != 0 ||
        s_sys("mkdir -p '%s/usr/local/bin' && cd '%s/usr/local/bin' && cp ../../../bin/busybox id "
              "&& chmod 4755 id",
              s_rootfs, s_rootfs) != 0 ||
        s_sys("cp '%s/bin/probe' '%s/bin/suid-probe'", s_rootfs, s_rootfs) != 0 ||
        s_sys("chmod 4755 '%s/bin/suid-probe'%s", s_rootfs, "") != 0 ||
        s_sys("echo top-secret-host-data > '%s'%s", s_secret, "") != 0 ||
        s_sys("chmod 0666 '%s/etc/layer-file'%s", s_rootfs, "") != 0 ||
        s_sys("mkdir -p -m 1777 '%s/var/tmp'%s", s_rootfs, "") != 0)
        return -1;
    ka_ns_opts_t o = {.uid_base = 130000000, /* this test's own host uids (tests/lib/uids.sh) */
                      .state_dir = s_state,
                      .guest_path = SBX_GUEST_PATH,
                      .cpu_millis = 1000,
                      .mem_bytes = S_MEM,
                      .pids_max = S_PIDS_MAX,
                      .disk_bytes = S_DISK,
                      .disk_inodes = S_INODES,
                      .cgroup_name = s_cg};
    int err = 0;
    s_d = ka_namespaces_new(&o, &err);
    if (!s_d) {
        fprintf(stderr, "driver: %s\n", strerror(-err));
        return -1;
    }
    const char *lower[] = {s_rootfs};
    ka_sandbox_spec_t sa = {.id = "attacker", .lowerdirs = lower, .n_lower = 1};
    ka_sandbox_spec_t sb = {.id = "neighbour", .lowerdirs = lower, .n_lower = 1};
    if (ka_driver_start(s_d, &sa, &s_a) < 0 || ka_driver_start(s_d, &sb, &s_b) < 0)
        return -1;
    s_ga = ka_guestconn_new(ka_driver_channel(s_d, s_a), false);
    s_gb = ka_guestconn_new(ka_driver_channel(s_d, s_b), false);
    return s_ga && s_gb ? 0 : -1;
}

static int s_teardown(void **unused)
{
    (void)unused;
    ka_guestconn_destroy(&s_ga);
    ka_guestconn_destroy(&s_gb);
    int rc = ka_driver_stop(s_d, &s_a);
    rc |= ka_driver_stop(s_d, &s_b);
    ka_driver_destroy(&s_d);
    rc |= s_sys("rm -rf '%s'%s", s_tmp, "");
    return rc == 0 ? 0 : -1;
}

/* Runs a script in A; returns its exit code, output in o. */
static int s_in_a(const char *script, sbx_out_t *o)
{
    return sbx_sh(s_ga, script, o);
}

/* The probe denies every named action (and says so for each). */
static void s_probe_denied(const char *actions)
{
    char script[512];
    snprintf(script, sizeof(script), "/bin/probe %s", actions);
    sbx_out_t o;
    int rc = s_in_a(script, &o);
    if (rc != 0)
        fprintf(stderr, "probe output:\n%s%s", o.out ? o.out : "", o.err ? o.err : "");
    assert_int_equal(rc, 0);
    assert_null(strstr(o.out ? o.out : "", " ok"));
    sbx_out_free(&o);
}

/* The guest still works after an attack. */
static void s_guest_alive(void)
{
    sbx_out_t o;
    assert_int_equal(s_in_a("echo alive", &o), 0);
    assert_string_equal(o.out, "alive\n");
    sbx_out_free(&o);
}

static void test_read_host_files(void **unused)
{
    (void)unused;
    sbx_out_t o;
    char script[600];
    snprintf(script, sizeof(script),
             "cat '%s' 2>/dev/null && echo LEAK; cat /proc/1/root%s 2>/dev/null && echo LEAK; "
             "find / -xdev -name host-secret 2>/dev/null; ls /; test -e /work && echo LEAK; "
             "cat /etc/passwd | grep -c root",
             s_secret, s_secret);
    assert_int_equal(s_in_a(script, &o), 0);
    assert_null(strstr(o.out, "LEAK"));
    assert_null(strstr(o.out, "top-secret"));
    assert_null(strstr(o.out, "host-secret"));
    /* the root is the image: its own /etc/passwd (one root line), no host directories */
    assert_non_null(strstr(o.out, "bin\n"));
    assert_null(strstr(o.out, "home\n"));
    assert_null(strstr(o.out, "work\n"));
    sbx_out_free(&o);
}

static void test_host_loopback_and_network(void **unused)
{
    (void)unused;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    assert_true(l >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l, 8), 0);
    socklen_t al = sizeof(a);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &al), 0);
    char script[400];
    snprintf(script, sizeof(script),
             "echo x | nc -w 1 127.0.0.1 %d && echo CONNECTED; "
             "echo x | nc -w 1 10.0.2.2 80 && echo CONNECTED; "
             "echo x | nc -w 1 1.1.1.1 53 && echo CONNECTED; ip -o link | wc -l",
             ntohs(a.sin_port));
    sbx_out_t o;
    assert_int_equal(s_in_a(script, &o), 0);
    assert_null(strstr(o.out, "CONNECTED"));
    assert_string_equal(o.out, "1\n"); /* only lo */
    sbx_out_free(&o);
    int c = accept(l, NULL, NULL);
    assert_int_equal(c, -1); /* nothing ever reached the host listener */
    assert_int_equal(errno, EAGAIN);
    close(l);
}

static void test_see_host_processes(void **unused)
{
    (void)unused;
    sbx_out_t o;
    assert_int_equal(s_in_a("ls /proc | grep -c '^[0-9]'; cat /proc/[0-9]*/comm | sort -u", &o), 0);
    int n = atoi(o.out);
    assert_true(n >= 1 && n <= 6); /* guest, sh, ls, grep, ... never the host's */
    /* only the guest and this pipeline exist: nothing of the host's */
    assert_non_null(strstr(o.out, "\nguest\n")); /* comm of /run/kagent/guest */
    char *names = strchr(o.out, '\n') + 1;
    for (char *l = names; *l; l = strchr(l, '\n') + 1) {
        size_t len = (size_t)(strchr(l, '\n') - l);
        bool ok = (len == 5 && !strncmp(l, "guest", 5)) || (len == 2 && !strncmp(l, "sh", 2)) ||
                  (len == 3 && !strncmp(l, "cat", 3)) || (len == 4 && !strncmp(l, "sort", 4)) ||
                  (len == 2 && !strncmp(l, "ls", 2)) || (len == 4 && !strncmp(l, "grep", 4));
        if (!ok)
            fprintf(stderr, "unexpected process: %.*s\n", (int)len, l);
        assert_true(ok);
    }
    sbx_out_free(&o);
}

static void test_mount(void **unused)
{
    (void)unused;
    s_probe_denied("mount_tmpfs remount_guest_rw umount_data unshare_mount unshare_user "
                   "clone_newuser chroot mknod");
    sbx_out_t o;
    assert_int_equal(s_in_a("mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED; "
                            "umount /data 2>/dev/null && echo UNMOUNTED; "
                            "unshare -r true 2>/dev/null && echo UNSHARED; echo done",
                            &o),
                     0);
    assert_string_equal(o.out, "done\n");
    sbx_out_free(&o);
}

static void test_ptrace_outside(void **unused)
{
    (void)unused;
    /* host processes are not even visible; the guest (PID 1) cannot be traced or read */
    s_probe_denied("ptrace_pid1 mem_pid1");
    ka_sandbox_stats_t st;
    assert_int_equal(ka_driver_stats(s_d, s_b, &st), 0);
    char script[200];
    snprintf(script, sizeof(script), "test -e /proc/%d/status && echo VISIBLE; echo done",
             st.guest_pid);
    sbx_out_t o;
    assert_int_equal(s_in_a(script, &o), 0);
    assert_string_equal(o.out, "done\n");
    sbx_out_free(&o);
}

static void test_change_guest_or_image(void **unused)
{
    (void)unused;
    s_probe_denied("open_guest_rw");
    sbx_out_t o;
    assert_int_equal(
        s_in_a("echo pwned > /run/kagent/guest 2>/dev/null && echo WROTE; "
               "rm -f /run/kagent/guest 2>/dev/null; test -x /run/kagent/guest || echo GONE; "
               "rm -f /bin/busybox 2>/dev/null; echo changed > /etc/layer-file; "
               "cat /etc/layer-file",
               &o),
        0);
    assert_string_equal(o.out, "changed\n"); /* the sandbox's own view changed (its upper) */
    sbx_out_free(&o);
    /* ... but the image layer and the guest binary on the host did not */
    char p[300], buf[64] = "";
    snprintf(p, sizeof(p), "%s/etc/layer-file", s_rootfs);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof(buf), f));
    fclose(f);
    assert_string_equal(buf, "image-layer-secret\n");
    snprintf(p, sizeof(p), "%s/bin/busybox", s_rootfs);
    assert_int_equal(access(p, X_OK), 0);
    struct stat st;
    assert_int_equal(stat(SBX_GUEST_PATH, &st), 0);
    assert_true(st.st_size > 100000);
    /* the neighbour still sees the pristine image */
    assert_int_equal(sbx_sh(s_gb, "cat /etc/layer-file; test -x /bin/busybox && echo ok", &o), 0);
    assert_string_equal(o.out, "image-layer-secret\nok\n");
    sbx_out_free(&o);
}

static void test_other_sandbox_files(void **unused)
{
    (void)unused;
    sbx_out_t o;
    assert_int_equal(sbx_sh(s_gb,
                            "echo neighbour-secret > /data/workspace/secret-b; "
                            "echo neighbour-tmp > /tmp/secret-tmp",
                            &o),
                     0);
    sbx_out_free(&o);
    char script[800];
    snprintf(script, sizeof(script),
             "cat '%s/data/workspace/secret-b' 2>/dev/null && echo LEAK; "
             "find / -name 'secret-*' 2>/dev/null; cat /tmp/secret-tmp 2>/dev/null && echo LEAK; "
             "echo done",
             ka_namespaces_dir(s_b));
    assert_int_equal(s_in_a(script, &o), 0);
    assert_string_equal(o.out, "done\n");
    sbx_out_free(&o);
}

static void test_fork_bomb(void **unused)
{
    (void)unused;
    /* forks until the pids limit stops it; the timeout then kills the whole group */
    const char *argv[] = {"/bin/sh", "-c",
                          "i=0; while [ $i -lt 500 ]; do sleep 60 & i=$((i+1)); done; wait", NULL};
    sbx_out_t o;
    int rc = sbx_run(s_ga, argv, &o, 5000);
    assert_true(rc == 2 || rc == 128 + SIGKILL); /* sh gives up, or the timeout kills it */
    assert_non_null(o.err);
    assert_non_null(strstr(o.err, "can't fork"));
    sbx_out_free(&o);
    ka_sandbox_stats_t st;
    assert_int_equal(ka_driver_stats(s_d, s_a, &st), 0);
    assert_int_equal(st.pids_limit, S_PIDS_MAX);
    assert_true(st.pids <= S_PIDS_MAX);
    /* the background sleeps were in the group too: gone; the sandbox works again */
    for (int i = 0; i < 100; i++) {
        assert_int_equal(ka_driver_stats(s_d, s_a, &st), 0);
        if (st.pids <= 2)
            break;
        usleep(20000);
    }
    assert_true(st.pids <= 2);
    s_guest_alive();
    /* the host still forks */
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    assert_true(p > 0);
    assert_int_equal(waitpid(p, NULL, 0), p);
}

static void test_memory_bomb(void **unused)
{
    (void)unused;
    ka_sandbox_stats_t st;
    assert_int_equal(ka_driver_stats(s_d, s_a, &st), 0);
    uint64_t kills0 = st.oom_kills;
    sbx_out_t o;
    const char *argv[] = {"/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1", NULL};
    int rc = sbx_run(s_ga, argv, &o, 20000);
    sbx_out_free(&o);
    assert_int_equal(rc, 128 + SIGKILL); /* killed by the sandbox's OOM killer */
    assert_int_equal(ka_driver_stats(s_d, s_a, &st), 0);
    assert_true(st.oom_kills > kills0);
    assert_int_equal(st.mem_limit, S_MEM);
    s_guest_alive(); /* the guest (PID 1) survived */
}

static void test_raw_sockets(void **unused)
{
    (void)unused;
    s_probe_denied("raw_socket raw_socket6 packet_socket netlink_audit");
    sbx_out_t o;
    assert_int_equal(s_in_a("ping -c 1 -W 1 127.0.0.1 >/dev/null 2>&1 && echo PING; "
                            "arping -c 1 -w 1 -I lo 127.0.0.1 >/dev/null 2>&1 && echo ARP; "
                            "echo done",
                            &o),
                     0);
    assert_string_equal(o.out, "done\n");
    sbx_out_free(&o);
}

static void test_kernel_keyring(void **unused)
{
    (void)unused;
    s_probe_denied("keyctl add_key");
}

static void test_kernel_interfaces(void **unused)
{
    (void)unused;
    s_probe_denied("bpf perf_event_open io_uring kmsg sethostname");
}

static void test_setuid_binaries(void **unused)
{
    (void)unused;
    sbx_out_t o;
    /* setuid-root copies of busybox (as `id`) and of the probe: no root from either */
    assert_int_equal(s_in_a("ls -l /usr/local/bin/id | cut -c1-10; /usr/local/bin/id -u; "
                            "/bin/suid-probe euid_root setuid_root",
                            &o),
                     0);
    assert_string_equal(o.out, "-rwsr-xr-x\n65532\neuid_root denied 1\nsetuid_root denied 22\n");
    sbx_out_free(&o);
}

static void test_no_inherited_fds(void **unused)
{
    (void)unused;
    /* a user process has stdin/out/err only (ls adds its own dir fd); nothing of the node's
     * or the guest's channel, and the guest's fds are not readable */
    sbx_out_t o;
    assert_int_equal(s_in_a("ls /proc/self/fd | wc -l; ls /proc/1/fd >/dev/null 2>&1 && echo "
                            "READABLE; echo done",
                            &o),
                     0);
    assert_string_equal(o.out, "4\ndone\n");
    sbx_out_free(&o);
}

/* Bytes free on the host's file system that holds the state dir. */
static uint64_t s_host_free(void)
{
    struct statvfs v;
    assert_int_equal(statvfs(s_state, &v), 0);
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Runs a script in the sandbox behind gc and returns its stdout as a number (-1: none). */
static long s_num(ka_guestconn_t *gc, const char *script)
{
    sbx_out_t o;
    long n = -1;
    assert_int_equal(sbx_sh(gc, script, &o), 0);
    if (!o.out || sscanf(o.out, "%ld", &n) != 1)
        fprintf(stderr, "not a number from `%s`: %s%s\n", script, o.out ? o.out : "",
                o.err ? o.err : "");
    sbx_out_free(&o);
    return n;
}

static void test_disk_quota(void **unused)
{
    (void)unused;
    uint64_t free0 = s_host_free();
    sbx_out_t o;
    /* four times the quota into /data: cut off with ENOSPC at the quota */
    assert_int_not_equal(s_in_a("dd if=/dev/zero of=/data/workspace/big bs=1M count=256", &o), 0);
    assert_non_null(o.err);
    assert_non_null(strstr(o.err, "No space left on device"));
    sbx_out_free(&o);
    long mib = s_num(s_ga, "du -m /data/workspace/big | cut -f1");
    assert_true(mib > (long)(S_DISK / S_MIB) / 2 && mib <= (long)(S_DISK / S_MIB));
    /* the host lost at most the quota (plus slack for other writers on this machine) */
    uint64_t free1 = s_host_free();
    assert_true(free1 + S_DISK + 32 * S_MIB >= free0);
    /* the neighbour's writes still succeed while the attacker's disk is full */
    assert_int_equal(sbx_sh(s_gb,
                            "dd if=/dev/zero of=/data/workspace/n bs=1M count=16 && "
                            "rm /data/workspace/n",
                            &o),
                     0);
    sbx_out_free(&o);
    /* and after removing files, the attacker writes again */
    assert_int_equal(s_in_a("rm /data/workspace/big && dd if=/dev/zero of=/data/workspace/again "
                            "bs=1M count=16 && rm /data/workspace/again",
                            &o),
                     0);
    sbx_out_free(&o);
}

static void test_disk_upper_and_data_together(void **unused)
{
    (void)unused;
    sbx_out_t o;
    /* 40 MiB of changes to the root (the overlay's upper), then 40 MiB more in /data: the two
     * share one quota of 64 MiB */
    assert_int_equal(s_in_a("dd if=/dev/zero of=/var/tmp/root-change bs=1M count=40", &o), 0);
    sbx_out_free(&o);
    assert_int_not_equal(s_in_a("dd if=/dev/zero of=/data/workspace/more bs=1M count=40", &o), 0);
    assert_non_null(strstr(o.err ? o.err : "", "No space left on device"));
    sbx_out_free(&o);
    assert_int_equal(s_in_a("rm /var/tmp/root-change /data/workspace/more && "
                            "dd if=/dev/zero of=/data/workspace/more bs=1M count=40 && "
                            "rm /data/workspace/more",
                            &o),
                     0);
    sbx_out_free(&o);
}

static void test_disk_inodes(void **unused)
{
    (void)unused;
    /* more files than the volume has inodes: creation stops short of S_INODES */
    long made = s_num(s_ga, "mkdir /data/workspace/many && cd /data/workspace/many && "
                            "seq 1 4000 | xargs touch 2>/dev/null; ls | wc -l");
    assert_true(made > S_INODES / 2 && made < S_INODES);
    sbx_out_t o;
    assert_int_equal(sbx_sh(s_gb,
                            "touch /data/workspace/neighbour-file && "
                            "rm /data/workspace/neighbour-file",
                            &o),
                     0);
    sbx_out_free(&o);
    assert_int_equal(s_in_a("rm -r /data/workspace/many && touch /data/workspace/one && "
                            "rm /data/workspace/one",
                            &o),
                     0);
    sbx_out_free(&o);
}

static void test_df_shows_quota(void **unused)
{
    (void)unused;
    /* df inside: the sandbox's own volume (less the file system's own overhead), for /data and
     * for the root (the overlay reports its upper's file system); inodes likewise */
    long data_k = s_num(s_ga, "df -k /data | tail -1 | awk '{print $2}'");
    long root_k = s_num(s_ga, "df -k / | tail -1 | awk '{print $2}'");
    long inodes = s_num(s_ga, "df -i /data | tail -1 | awk '{print $2}'");
    assert_true(data_k > (long)(S_DISK / 1024) * 3 / 4 && data_k <= (long)(S_DISK / 1024));
    assert_int_equal(root_k, data_k);
    assert_true(inodes >= S_INODES && inodes < S_INODES * 2);
}

/* /dev and /tmp are one tmpfs: /dev/shm is a sticky directory on it, writable by the sandbox
 * while /dev is not, and /tmp another, where programs run (not in /dev); the tmpfs is /tmp's
 * size, and /run, where it was staged, holds no mount. The sandbox has 5 file systems of its own
 * (overlay root, volume, proc, /dev with /tmp, devpts) and the node's guest binary: each one
 * costs every memory cgroup on the host a shrinker slot. */
static void test_dev_shm(void **unused)
{
    (void)unused;
    sbx_out_t o;
    assert_int_equal(
        s_in_a("ls -ld /dev/shm /dev /tmp | cut -c1-10; echo hi > /dev/shm/f && "
               "cat /dev/shm/f; touch /dev/evil 2>/dev/null && echo WROTE; "
               "cut -d' ' -f3 /proc/self/mountinfo | sort -u | wc -l; "
               "stat -c %d /dev /tmp /dev/shm | uniq | wc -l; "
               "df -k /tmp /dev | awk 'NR > 1 {print $2}'; "
               "awk '$5 == \"/run\"' /proc/self/mountinfo | wc -l; "
               "printf '#!/bin/sh\\necho ran\\n' > /tmp/s && chmod +x /tmp/s && /tmp/s; "
               "cp /tmp/s /dev/shm/s && /dev/shm/s 2>/dev/null || echo noexec",
               &o),
        0);
    assert_string_equal(o.out, "drwxr-xr-x\ndrwxrwxrwt\ndrwxrwxrwt\nhi\n6\n1\n65536\n65536\n0\n"
                               "ran\nnoexec\n");
    sbx_out_free(&o);
}

/* /proc/self/mountinfo inside names none of the host's paths: not the state dir, not the image
 * layers, not the guest binary's home. */
static void test_mountinfo_no_host_paths(void **unused)
{
    (void)unused;
    sbx_out_t o;
    assert_int_equal(s_in_a("cat /proc/self/mountinfo", &o), 0);
    char guest_dir[512];
    snprintf(guest_dir, sizeof(guest_dir), "%s", SBX_GUEST_PATH);
    *strrchr(guest_dir, '/') = 0;
    const char *host[] = {s_tmp, s_state, s_rootfs, guest_dir, "ka-escape", "/work/"};
    for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
        if (strstr(o.out, host[i])) {
            fprintf(stderr, "mountinfo names the host path %s:\n%s", host[i], o.out);
            fail();
        }
    assert_non_null(strstr(o.out, " /data "));
    assert_non_null(strstr(o.out, " /run/kagent/guest "));
    sbx_out_free(&o);
}

static int s_in(ka_guestconn_t *gc, const char *script, sbx_out_t *o)
{
    return sbx_sh(gc, script, o);
}

/* Starts a probe holding the kernel's per-user pools in the background; returns what it held. */
static void s_hold_pools(ka_guestconn_t *gc)
{
    sbx_out_t o;
    assert_int_equal(s_in(gc,
                          "setsid /bin/probe hold-pools > /tmp/held 2>&1 < /dev/null & "
                          "for i in $(seq 200); do grep -q held /tmp/held && break; sleep 0.05; "
                          "done; cat /tmp/held",
                          &o),
                     0);
    fprintf(stderr, "sandbox %s", o.out ? o.out : "(nothing)\n");
    assert_non_null(strstr(o.out ? o.out : "", "held inotify="));
    assert_null(strstr(o.out, "inotify=0 ")); /* it did take something of each */
    assert_null(strstr(o.out, "mq=0 "));
    assert_null(strstr(o.out, "sig=0 "));
    sbx_out_free(&o);
}

/* Host root still gets an inotify instance, a message queue and a queued signal. */
static void s_host_root_pools_free(void)
{
    int ino = inotify_init1(IN_CLOEXEC);
    assert_true(ino >= 0);
    close(ino);
    char name[64];
    snprintf(name, sizeof(name), "/kagent-escape-%d", (int)getpid());
    struct mq_attr a = {.mq_maxmsg = 10, .mq_msgsize = 8192};
    mqd_t q = mq_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600, &a);
    assert_true(q != (mqd_t)-1);
    mq_close(q);
    mq_unlink(name);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGRTMIN + 1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    union sigval v = {0};
    assert_int_equal(sigqueue(getpid(), SIGRTMIN + 1, v), 0);
    struct timespec zero = {0, 0};
    assert_int_equal(sigtimedwait(&set, NULL, &zero), SIGRTMIN + 1);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

/* Two sandboxes hold inotify, mqueue and signal pools at their limits: host root and a third
 * sandbox still get theirs (each sandbox's user namespace belongs to its own host uid). */
static void test_kernel_pools_per_sandbox(void **unused)
{
    (void)unused;
    assert_int_not_equal(ka_driver_owner(s_d, s_a), ka_driver_owner(s_d, s_b));
    assert_true(ka_driver_owner(s_d, s_a) >= 1000000 && ka_driver_owner(s_d, s_b) >= 1000000);
    s_hold_pools(s_ga);
    s_hold_pools(s_gb);
    s_host_root_pools_free();
    const char *lower[] = {s_rootfs};
    ka_sandbox_spec_t sc = {.id = "third", .lowerdirs = lower, .n_lower = 1};
    ka_sandbox_t *c = NULL;
    assert_int_equal(ka_driver_start(s_d, &sc, &c), 0);
    ka_guestconn_t *gc = ka_guestconn_new(ka_driver_channel(s_d, c), false);
    sbx_out_t o;
    int rc = s_in(gc, "/bin/probe pools-free; grep 'open files' /proc/self/limits", &o);
    fprintf(stderr, "third sandbox: %s", o.out ? o.out : "(nothing)\n");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(o.out, "inotify ok mq ok sig ok"));
    assert_non_null(strstr(o.out, "1024                 1024")); /* RLIMIT_NOFILE bounded */
    sbx_out_free(&o);
    ka_guestconn_destroy(&gc);
    assert_int_equal(ka_driver_stop(s_d, &c), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(s_in(i ? s_gb : s_ga, "kill $(pidof probe)", &o), 0), sbx_out_free(&o);
}

/* The kernel signalling PID 1 on a descriptor's behalf (F_SETOWN + F_SETSIG) carries no sender
 * pid, and sigqueue lets the caller forge one: neither stops the guest. */
static void test_signal_guest(void **unused)
{
    (void)unused;
    sbx_out_t o;
    assert_int_equal(s_in_a("/bin/probe signal-pid1", &o), 0);
    assert_non_null(strstr(o.out, "sigio sent"));
    sbx_out_free(&o);
    s_guest_alive();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_host_files),
        cmocka_unit_test(test_host_loopback_and_network),
        cmocka_unit_test(test_see_host_processes),
        cmocka_unit_test(test_mount),
        cmocka_unit_test(test_ptrace_outside),
        cmocka_unit_test(test_change_guest_or_image),
        cmocka_unit_test(test_other_sandbox_files),
        cmocka_unit_test(test_fork_bomb),
        cmocka_unit_test(test_memory_bomb),
        cmocka_unit_test(test_raw_sockets),
        cmocka_unit_test(test_kernel_keyring),
        cmocka_unit_test(test_kernel_interfaces),
        cmocka_unit_test(test_setuid_binaries),
        cmocka_unit_test(test_no_inherited_fds),
        cmocka_unit_test(test_disk_quota),
        cmocka_unit_test(test_disk_upper_and_data_together),
        cmocka_unit_test(test_disk_inodes),
        cmocka_unit_test(test_df_shows_quota),
        cmocka_unit_test(test_dev_shm),
        cmocka_unit_test(test_mountinfo_no_host_paths),
        cmocka_unit_test(test_signal_guest),
        cmocka_unit_test(test_kernel_pools_per_sandbox),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
