/*
 * ka_tree: the host-side copy and removal of sandbox-controlled trees. Each attack is what a
 * process in the sandbox can do to its /data while the node copies or removes it: swap a
 * directory for a symlink to a host directory, a file for a fifo or a link, as fast as it can.
 * Nothing outside the source may ever be read, written or removed, and every walk ends.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ka_tree.h"
#include "krt.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/un.h>
#include <unistd.h>

#define SECRET "top-secret-host-data"

static char s_tmp[64], s_src[128], s_dst[128], s_host[128];

static void s_write(const char *dir, const char *name, const char *text, mode_t mode)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, mode);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    chmod(p, mode);
}

static void s_path(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

/* true if any regular file under dir holds the secret (a shell walk that follows nothing) */
static bool s_leaked(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "grep -rqs '%s' '%s'", SECRET, dir);
    return system(cmd) == 0;
}

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof s_tmp, "/tmp/ka-tree-XXXXXX");
    if (!mkdtemp(s_tmp))
        return -1;
    s_path(s_src, sizeof s_src, s_tmp, "src");
    s_path(s_dst, sizeof s_dst, s_tmp, "dst");
    s_path(s_host, sizeof s_host, s_tmp, "host");
    if (mkdir(s_src, 0755) < 0 || mkdir(s_host, 0700) < 0)
        return -1;
    s_write(s_host, "secret", SECRET "\n", 0600);
    return 0;
}

static int s_teardown(void **unused)
{
    (void)unused;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_reset(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' && mkdir '%s'", s_src, s_dst, s_src);
    assert_int_equal(system(cmd), 0);
}

static ka_tree_opts_t s_opts(int64_t owner)
{
    return (ka_tree_opts_t){.deadline_ms = krt_mono_ms() + 20000, .owner = owner};
}

static void test_copy_keeps_shape_never_follows(void **unused)
{
    (void)unused;
    s_reset();
    char p[512], q[512];
    s_path(p, sizeof p, s_src, "dir");
    assert_int_equal(mkdir(p, 0750), 0);
    s_write(p, "file.txt", "hello\n", 0640);
    s_write(s_src, "suid", "#!/bin/sh\n", 06755);
    s_path(p, sizeof p, s_src, "to-host");
    assert_int_equal(symlink(s_host, p), 0);
    s_path(p, sizeof p, s_src, "to-secret");
    s_path(q, sizeof q, s_host, "secret");
    assert_int_equal(symlink(q, p), 0);
    s_path(p, sizeof p, s_src, "fifo"); /* never opened: a copy that opened it would block */
    assert_int_equal(mkfifo(p, 0644), 0);
    int so = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(s_src) + 6 < sizeof a.sun_path);
    memcpy(a.sun_path, s_src, strlen(s_src));
    memcpy(a.sun_path + strlen(s_src), "/sock", 6);
    assert_int_equal(bind(so, (struct sockaddr *)&a, sizeof a), 0);

    ka_tree_opts_t o = s_opts(4242);
    ka_tree_stats_t st;
    assert_int_equal(ka_tree_copy(s_src, s_dst, &o, &st), 0);
    close(so);
    assert_int_equal(st.files, 2);
    assert_int_equal(st.dirs, 1);
    assert_int_equal(st.symlinks, 2);
    assert_int_equal(st.skipped, 2);
    struct stat sb;
    s_path(p, sizeof p, s_dst, "dir/file.txt");
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0640);
    assert_int_equal(sb.st_uid, 4242);
    assert_int_equal(sb.st_gid, 4242);
    s_path(p, sizeof p, s_dst, "suid");
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0755); /* setuid and setgid dropped */
    s_path(p, sizeof p, s_dst, "to-secret");
    assert_int_equal(lstat(p, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode)); /* a link stays a link: its target was never read */
    s_path(p, sizeof p, s_dst, "fifo");
    assert_int_equal(lstat(p, &sb), -1);
    assert_false(s_leaked(s_dst));
}

typedef struct {
    atomic_bool stop;
    unsigned long swaps;
} s_attacker_t;

/* Swaps src/d between a directory and a symlink to the host dir, and src/f between a file, a
 * fifo and a symlink to the host's secret, as fast as it can. */
static void *s_attack(void *arg)
{
    s_attacker_t *at = arg;
    char d[512], dx[512], f[512], secret[512];
    s_path(d, sizeof d, s_src, "d");
    s_path(dx, sizeof dx, s_src, "d.x");
    s_path(f, sizeof f, s_src, "d.x/f");
    s_path(secret, sizeof secret, s_host, "secret");
    while (!atomic_load(&at->stop)) {
        mkdir(dx, 0755);
        int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644); /* no asserts off the test thread */
        if (fd >= 0)
            close(fd);
        rename(dx, d); /* d is a real directory */
        rename(d, dx);
        symlink(s_host, d); /* d points at the host */
        unlink(f);
        mkfifo(f, 0644);
        unlink(d);
        rename(dx, d);
        unlink(d);
        rename(d, dx);
        unlink(f);
        symlink(secret, f);
        rename(dx, d);
        at->swaps++;
        rename(d, dx);
        unlink(f);
        rmdir(dx);
    }
    return NULL;
}

static void test_copy_under_attack(void **unused)
{
    (void)unused;
    s_reset();
    s_attacker_t at = {0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_attack, &at), 0);
    for (int i = 0; i < 400; i++) {
        ka_tree_opts_t o = s_opts(-1);
        int64_t t0 = krt_mono_ms();
        int rc = ka_tree_copy(s_src, s_dst, &o, NULL);
        if (rc != 0 && rc != -ENOENT && rc != -EEXIST && rc != -EISDIR)
            fail_msg("copy %d under attack: %s", i, strerror(-rc));
        assert_true(krt_mono_ms() - t0 < 5000); /* a fifo never holds it */
        assert_false(s_leaked(s_dst));
        char dx[512];
        s_path(dx, sizeof dx, s_dst, "d");
        struct stat st;
        if (lstat(dx, &st) == 0 && S_ISDIR(st.st_mode)) { /* a copied dir holds no host file */
            s_path(dx, sizeof dx, s_dst, "d/secret");
            assert_int_equal(lstat(dx, &st), -1);
        }
        ka_tree_opts_t r = s_opts(-1);
        assert_int_equal(ka_tree_remove(s_dst, &r), 0);
    }
    atomic_store(&at.stop, true);
    pthread_join(t, NULL);
    fprintf(stderr, "attacker swapped %lu times during 400 copies\n", at.swaps);
    assert_true(at.swaps > 0);
    char secret[512];
    s_path(secret, sizeof secret, s_host, "secret");
    assert_int_equal(access(secret, F_OK), 0);
}

static void test_remove_under_attack_spares_host(void **unused)
{
    (void)unused;
    s_attacker_t at = {0};
    pthread_t t;
    char secret[512];
    s_path(secret, sizeof secret, s_host, "secret");
    for (int i = 0; i < 200; i++) {
        s_reset();
        char p[512];
        s_path(p, sizeof p, s_src, "link-to-host");
        assert_int_equal(symlink(s_host, p), 0);
        atomic_store(&at.stop, false);
        assert_int_equal(pthread_create(&t, NULL, s_attack, &at), 0);
        usleep(200);
        ka_tree_opts_t o = s_opts(-1);
        int rc = ka_tree_remove(s_src, &o);
        atomic_store(&at.stop, true);
        pthread_join(t, NULL);
        /* the attacker may recreate entries after the walk; the host dir is never touched */
        if (rc != 0 && rc != -ENOTEMPTY)
            fail_msg("round %d: remove under attack: %s", i, strerror(-rc));
        assert_int_equal(access(secret, F_OK), 0);
    }
}

static void test_bounds(void **unused)
{
    (void)unused;
    s_reset();
    s_write(s_src, "big", "0123456789abcdef", 0644);
    ka_tree_opts_t o = s_opts(-1);
    o.max_bytes = 8;
    assert_int_equal(ka_tree_copy(s_src, s_dst, &o, NULL), -EFBIG);
    o = s_opts(-1);
    o.deadline_ms = krt_mono_ms() - 1;
    assert_int_equal(ka_tree_copy(s_src, s_dst, &o, NULL), -ETIMEDOUT);
    o = s_opts(-1);
    o.max_entries = 0;
    char p[4096];
    size_t n = (size_t)snprintf(p, sizeof p, "%s", s_src);
    for (int i = 0; i < KA_TREE_MAX_DEPTH + 2 && n + 3 < sizeof p; i++) {
        n += (size_t)snprintf(p + n, sizeof p - n, "/d");
        if (mkdir(p, 0755) < 0)
            break;
    }
    assert_int_equal(ka_tree_copy(s_src, s_dst, &o, NULL), n + 3 < sizeof p ? -ELOOP : 0);
    ka_tree_opts_t r = s_opts(-1);
    assert_int_equal(ka_tree_remove(s_dst, &r), 0);
    assert_int_equal(ka_tree_remove("", &r), 0);
    assert_int_equal(ka_tree_remove("/nonexistent/ka-tree", &r), 0);
}

static int s_flags(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY), flags = -1;
    assert_true(fd >= 0);
    assert_int_equal(ioctl(fd, FS_IOC_GETFLAGS, &flags), 0);
    close(fd);
    return flags;
}

/* ka_dir_spread sets FS_TOPDIR_FL on ext4 (the host file system these tests run on: a state
 * dir elsewhere is not what the node is measured on), keeps the other flags, and is idempotent;
 * on tmpfs, which has no such flag, it says so and changes nothing. */
static void test_dir_spread(void **unused)
{
    (void)unused;
    struct statfs fs;
    assert_int_equal(statfs(s_tmp, &fs), 0);
    if (fs.f_type != EXT4_SUPER_MAGIC)
        fail_msg("%s is not on ext4 (f_type 0x%lx): this test needs the host's ext4", s_tmp,
                 (unsigned long)fs.f_type);
    char d[160];
    s_path(d, sizeof d, s_tmp, "spread");
    assert_int_equal(mkdir(d, 0700), 0);
    int before = s_flags(d);
    assert_false(before & FS_TOPDIR_FL);
    assert_int_equal(ka_dir_spread(d), 0);
    assert_int_equal(s_flags(d), before | FS_TOPDIR_FL);
    assert_int_equal(ka_dir_spread(d), 0);
    assert_int_equal(s_flags(d), before | FS_TOPDIR_FL);
    assert_int_equal(ka_dir_spread("/nonexistent/ka-tree"), -ENOENT);
    char shm[] = "/dev/shm/ka-tree-XXXXXX";
    assert_non_null(mkdtemp(shm));
    int rc = ka_dir_spread(shm);
    rmdir(shm);
    assert_true(rc == -ENOTTY || rc == -EOPNOTSUPP || rc == -EINVAL);
    rmdir(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_keeps_shape_never_follows),
        cmocka_unit_test(test_copy_under_attack),
        cmocka_unit_test(test_remove_under_attack_spares_host),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_dir_spread),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
