/*
 * ka_snapshot: /data as a tar+zstd stream and back. A round trip keeps contents, modes (minus
 * setuid/setgid), symlinks as symlinks, empty directories and times; a hostile tree (fifos,
 * sockets, symlinks to host paths, a huge sparse file) is archived without following or
 * blocking on anything and within its bounds; a crafted archive (traversal names, absolute
 * names, links to walk through, hard links, devices) is refused on restore and writes nothing
 * outside the target.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "ka_snapshot.h"
#include "krt.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static char s_tmp[64], s_src[96], s_dst[96], s_arc[96], s_out[96];

static void s_path(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void s_write(const char *dir, const char *name, const void *buf, size_t n, mode_t mode)
{
    char p[512];
    s_path(p, sizeof p, dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    close(fd);
    assert_int_equal(chmod(p, mode), 0);
}

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof s_tmp, "/tmp/ka-snap-XXXXXX");
    if (!mkdtemp(s_tmp))
        return -1;
    s_path(s_src, sizeof s_src, s_tmp, "src");
    s_path(s_dst, sizeof s_dst, s_tmp, "dst");
    s_path(s_arc, sizeof s_arc, s_tmp, "snap.tar.zst");
    s_path(s_out, sizeof s_out, s_tmp, "outside");
    return mkdir(s_src, 0755) || mkdir(s_out, 0755);
}

static int s_teardown(void **unused)
{
    (void)unused;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static ka_tree_opts_t s_opts(void)
{
    return (ka_tree_opts_t){.deadline_ms = krt_mono_ms() + 60000, .owner = -1};
}

/* Archives s_src into s_arc. */
static int s_save(const ka_tree_opts_t *o, ka_snapshot_info_t *info, char *err, size_t cap)
{
    int fd = open(s_arc, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    int rc = ka_snapshot_write(s_src, o, ka_snapshot_fd_sink, &fd, info, err, cap);
    close(fd);
    return rc;
}

/* Restores s_arc into s_dst. */
static int s_restore(const ka_tree_opts_t *o, ka_snapshot_info_t *info, char *err, size_t cap)
{
    int fd = open(s_arc, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    int rc = ka_snapshot_read(s_dst, fd, o, info, err, cap);
    close(fd);
    return rc;
}

static void test_round_trip(void **unused)
{
    (void)unused;
    size_t n = 3u << 20;
    unsigned char *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (unsigned char)(i * 2654435761u >> 13);
    char p[512];
    s_write(s_src, "big.bin", big, n, 0640);
    s_write(s_src, "empty", "", 0, 0600);
    s_write(s_src, "suid", "x", 1, 04755);
    s_path(p, sizeof p, s_src, "dir");
    assert_int_equal(mkdir(p, 0750), 0);
    s_path(p, sizeof p, s_src, "dir/emptydir");
    assert_int_equal(mkdir(p, 0700), 0);
    s_path(p, sizeof p, s_src, "dir");
    s_write(p, "name with spaces & ünïcode", "hello", 5, 0444);
    s_path(p, sizeof p, s_src, "rel-link");
    assert_int_equal(symlink("dir/name with spaces & ünïcode", p), 0);
    s_path(p, sizeof p, s_src, "host-link");
    assert_int_equal(symlink("/etc/passwd", p), 0);
    struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
    s_path(p, sizeof p, s_src, "empty");
    utimensat(AT_FDCWD, p, old, 0);

    ka_tree_opts_t o = s_opts();
    ka_snapshot_info_t w, r;
    char err[KA_SNAPSHOT_ERR_CAP];
    int rc = s_save(&o, &w, err, sizeof err);
    if (rc)
        fail_msg("save: %d %s", rc, err);
    assert_int_equal(w.tree.files, 4);
    assert_int_equal(w.tree.dirs, 2);
    assert_int_equal(w.tree.symlinks, 2);
    assert_true(w.archive_bytes > 0 && w.archive_bytes < n + 65536);
    assert_int_equal(strlen(w.sha256), 64);
    o.owner = 12345;
    assert_int_equal(s_restore(&o, &r, err, sizeof err), 0);
    assert_string_equal(r.sha256, w.sha256);
    assert_int_equal(r.archive_bytes, w.archive_bytes);
    assert_int_equal(r.tree.files, 4);

    char cmd[512];
    snprintf(cmd, sizeof cmd, "diff -r --no-dereference '%s' '%s'", s_src, s_dst);
    assert_int_equal(system(cmd), 0);
    struct stat st;
    s_path(p, sizeof p, s_dst, "suid");
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0755); /* setuid dropped */
    assert_int_equal(st.st_uid, 12345);
    s_path(p, sizeof p, s_dst, "big.bin");
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(st.st_size, (off_t)n);
    s_path(p, sizeof p, s_dst, "empty");
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mtim.tv_sec, 1000000000);
    s_path(p, sizeof p, s_dst, "dir/emptydir");
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    s_path(p, sizeof p, s_dst, "host-link");
    char target[64] = "";
    assert_int_equal(readlink(p, target, sizeof target - 1), 11);
    assert_string_equal(target, "/etc/passwd");
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(st.st_uid, 12345);
    free(big);
}

/* Fifos and sockets are left out without being opened (a read of a fifo would block), a
 * symlink to a host directory stays a symlink (its contents are not archived). */
static void test_hostile_tree(void **unused)
{
    (void)unused;
    char p[512];
    s_path(p, sizeof p, s_src, "fifo");
    assert_int_equal(mkfifo(p, 0666), 0);
    s_path(p, sizeof p, s_src, "etc");
    assert_int_equal(symlink("/etc", p), 0);
    int sk = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    s_path(a.sun_path, sizeof a.sun_path, s_src, "sock");
    assert_int_equal(bind(sk, (struct sockaddr *)&a, sizeof a), 0);
    s_write(s_src, "ok", "ok", 2, 0644);

    ka_tree_opts_t o = s_opts();
    ka_snapshot_info_t w;
    char err[KA_SNAPSHOT_ERR_CAP];
    assert_int_equal(s_save(&o, &w, err, sizeof err), 0);
    close(sk);
    assert_int_equal(w.tree.files, 1);
    assert_int_equal(w.tree.symlinks, 1);
    assert_int_equal(w.tree.skipped, 2);
    assert_int_equal(s_restore(&o, NULL, err, sizeof err), 0);
    struct stat st;
    s_path(p, sizeof p, s_dst, "etc");
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    s_path(p, sizeof p, s_dst, "fifo");
    assert_int_equal(lstat(p, &st), -1);
    s_path(p, sizeof p, s_dst, "sock");
    assert_int_equal(lstat(p, &st), -1);
}

/* A 1 TiB sparse file costs nothing on disk; past max_bytes the save ends at once, unread. */
static void test_sparse_giant_bounded(void **unused)
{
    (void)unused;
    char p[512];
    s_path(p, sizeof p, s_src, "sparse");
    int fd = open(p, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 1LL << 40), 0);
    close(fd);
    ka_tree_opts_t o = s_opts();
    o.max_bytes = 64u << 20;
    char err[KA_SNAPSHOT_ERR_CAP];
    int64_t t0 = krt_mono_ms();
    assert_int_equal(s_save(&o, NULL, err, sizeof err), -EFBIG);
    assert_true(krt_mono_ms() - t0 < 5000);
    assert_non_null(strstr(err, "bytes"));

    /* and the same bound on restore: a sparse file in an archive is expanded only so far */
    o.max_bytes = 0;
    assert_int_equal(truncate(p, 80u << 20), 0);
    assert_int_equal(s_save(&o, NULL, err, sizeof err), 0);
    o.max_bytes = 64u << 20;
    assert_int_equal(s_restore(&o, NULL, err, sizeof err), -EFBIG);
}

static void test_entry_bound(void **unused)
{
    (void)unused;
    for (int i = 0; i < 20; i++) {
        char n[16];
        snprintf(n, sizeof n, "f%d", i);
        s_write(s_src, n, "x", 1, 0644);
    }
    ka_tree_opts_t o = s_opts();
    o.max_entries = 10;
    char err[KA_SNAPSHOT_ERR_CAP];
    assert_int_equal(s_save(&o, NULL, err, sizeof err), -EFBIG);
}

/* ---- crafted archives ---------------------------------------------------------------------- */

typedef struct s_entry {
    const char *name;
    mode_t type;
    const char *data_or_link; /* regular: contents; symlink: target; hardlink (type 0): target */
} s_entry_t;

static void s_craft(const s_entry_t *e, size_t n)
{
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_zstd(a);
    assert_int_equal(archive_write_open_filename(a, s_arc), ARCHIVE_OK);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *x = archive_entry_new();
        archive_entry_set_pathname(x, e[i].name);
        archive_entry_set_perm(x, 0644);
        if (e[i].type == 0) {
            archive_entry_set_filetype(x, AE_IFREG);
            archive_entry_set_hardlink(x, e[i].data_or_link);
        } else {
            archive_entry_set_filetype(x, e[i].type);
        }
        if (e[i].type == AE_IFLNK)
            archive_entry_set_symlink(x, e[i].data_or_link);
        size_t len = e[i].type == AE_IFREG ? strlen(e[i].data_or_link) : 0;
        archive_entry_set_size(x, (la_int64_t)len);
        assert_int_equal(archive_write_header(a, x), ARCHIVE_OK);
        if (len)
            assert_int_equal(archive_write_data(a, e[i].data_or_link, len), (la_ssize_t)len);
        archive_entry_free(x);
    }
    archive_write_close(a);
    archive_write_free(a);
}

static bool s_empty(const char *dir)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "[ -z \"$(ls -A '%s')\" ]", dir);
    return system(cmd) == 0;
}

static void s_refused(const s_entry_t *e, size_t n, const char *why)
{
    s_craft(e, n);
    ka_tree_opts_t o = s_opts();
    char err[KA_SNAPSHOT_ERR_CAP];
    assert_int_equal(s_restore(&o, NULL, err, sizeof err), -EINVAL);
    if (!strstr(err, why))
        fail_msg("error \"%s\" does not say \"%s\"", err, why);
    assert_true(s_empty(s_out)); /* nothing written outside */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dst);
    assert_int_equal(system(cmd), 0);
}

static void test_crafted_archives_refused(void **unused)
{
    (void)unused;
    char out_abs[256], out_rel[64], via[256];
    s_path(out_abs, sizeof out_abs, s_out, "pwned");
    snprintf(out_rel, sizeof out_rel, "../outside/pwned");
    snprintf(via, sizeof via, "%s", s_out);
    s_entry_t dotdot[] = {{out_rel, AE_IFREG, "x"}};
    s_refused(dotdot, 1, "unsafe name");
    s_entry_t inner[] = {{"a/../../outside/pwned", AE_IFREG, "x"}};
    s_refused(inner, 1, "unsafe name");
    s_entry_t absolute[] = {{out_abs, AE_IFREG, "x"}};
    s_refused(absolute, 1, "unsafe name");
    s_entry_t dot[] = {{"a/./b", AE_IFREG, "x"}};
    s_refused(dot, 1, "unsafe name");
    s_entry_t through_link[] = {{"l", AE_IFLNK, via}, {"l/pwned", AE_IFREG, "x"}};
    s_refused(through_link, 2, "non-directory");
    s_entry_t hard[] = {{"h", 0, "/etc/shadow"}};
    s_refused(hard, 1, "not a file");
    s_entry_t dev[] = {{"d", AE_IFCHR, ""}};
    s_refused(dev, 1, "not a file");
    s_entry_t fifo[] = {{"p", AE_IFIFO, ""}};
    s_refused(fifo, 1, "not a file");
}

/* A file where the archive wants a directory (or the reverse) is refused, never followed. */
static void test_truncated_archive_fails(void **unused)
{
    (void)unused;
    unsigned char *buf = malloc(1u << 20);
    for (size_t i = 0; i < (1u << 20); i++)
        buf[i] = (unsigned char)(i * 7919u >> 5 ^ i);
    s_write(s_src, "f", buf, 1u << 20, 0644);
    free(buf);
    ka_tree_opts_t o = s_opts();
    char err[KA_SNAPSHOT_ERR_CAP];
    ka_snapshot_info_t w;
    assert_int_equal(s_save(&o, &w, err, sizeof err), 0);
    assert_int_equal(truncate(s_arc, (off_t)(w.archive_bytes / 2)), 0);
    assert_true(s_restore(&o, NULL, err, sizeof err) < 0);
    assert_true(err[0] != '\0');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_hostile_tree, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_sparse_giant_bounded, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_entry_bound, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_crafted_archives_refused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_truncated_archive_fails, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
