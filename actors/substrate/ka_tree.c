/* ka_tree: descriptor-relative copies and removals of sandbox-controlled trees (ka_tree.h). */
#include "ka_tree.h"
#include "krt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S_CHUNK   (8u << 20) /* bytes copied between deadline checks */
#define S_DIRFLAG (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define S_OPAQUE  "trusted.overlay.opaque"

typedef struct s_walk {
    const ka_tree_opts_t *o;
    ka_tree_stats_t st;
    dev_t dev; /* the tree's filesystem: never cross into another */
    uint64_t entries;
} s_walk_t;

int ka_mkdirs(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    if (!path || !path[0] || strlen(path) >= sizeof tmp)
        return -EINVAL;
    memcpy(tmp, path, strlen(path) + 1);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, mode) < 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    return mkdir(tmp, mode) < 0 && errno != EEXIST ? -errno : 0;
}

int ka_dir_spread(const char *dir)
{
    int fd = open(dir, S_DIRFLAG), flags = 0, rc = 0;
    if (fd < 0)
        return -errno;
    if (ioctl(fd, FS_IOC_GETFLAGS, &flags) < 0)
        rc = -errno;
    else if (!(flags & FS_TOPDIR_FL)) {
        flags |= FS_TOPDIR_FL;
        rc = ioctl(fd, FS_IOC_SETFLAGS, &flags) < 0 ? -errno : 0;
    }
    close(fd);
    return rc;
}

/* The walk's budget: time and entries. */
static int s_tick(s_walk_t *w)
{
    if (w->o->deadline_ms && krt_mono_ms() > w->o->deadline_ms)
        return -ETIMEDOUT;
    if (w->o->max_entries && ++w->entries > w->o->max_entries)
        return -EFBIG;
    return 0;
}

/* Mode, owner and times of a created entry (fd open on it, or -1 for dfd/name). */
static void s_attrs(const s_walk_t *w, int fd, int dfd, const char *name, const struct stat *st)
{
    struct timespec ts[2] = {st->st_atim, st->st_mtim};
    bool mine = w->o->owner >= 0 && (!w->o->remap || st->st_uid == w->o->remap_from);
    uid_t uid = mine ? (uid_t)w->o->owner : st->st_uid;
    gid_t gid = mine ? (gid_t)w->o->owner : st->st_gid;
    bool chown_it = w->o->owner >= 0;
    if (fd < 0) { /* a symlink or a whiteout: owner and times only */
        if (chown_it)
            (void)!fchownat(dfd, name, uid, gid, AT_SYMLINK_NOFOLLOW);
        utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW);
        return;
    }
    if (chown_it)
        (void)!fchown(fd, uid, gid);
    (void)!fchmod(fd, st->st_mode & 01777); /* never setuid or setgid */
    futimens(fd, ts);
}

/* Opens name in dfd for writing as a new regular file, replacing a non-directory there. */
static int s_create(int dfd, const char *name)
{
    for (int i = 0; i < 2; i++) {
        int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd >= 0 ? fd : -errno;
        if (unlinkat(dfd, name, 0) < 0)
            return -errno;
    }
    return -EEXIST;
}

/* The file's bytes: shared with FICLONE where the file system can (the same volume), else
 * copied in the kernel, in chunks between deadline checks. */
static int s_copy_bytes(s_walk_t *w, int in, int out, off_t size)
{
    if (size > 0 && ioctl(out, FICLONE, in) == 0) {
        w->st.bytes += (uint64_t)size;
        w->st.cloned++;
        return w->o->max_bytes && w->st.bytes > w->o->max_bytes ? -EFBIG : 0;
    }
    for (;;) {
        if (w->o->deadline_ms && krt_mono_ms() > w->o->deadline_ms)
            return -ETIMEDOUT;
        ssize_t n = copy_file_range(in, NULL, out, NULL, S_CHUNK, 0);
        if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
            n = sendfile(out, in, NULL, S_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        w->st.bytes += (uint64_t)n;
        if (w->o->max_bytes && w->st.bytes > w->o->max_bytes)
            return -EFBIG;
    }
}

static int s_copy_file(s_walk_t *w, int sfd, int dfd, const char *name)
{
    int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode) || st.st_dev != w->dev) {
        if (in >= 0)
            close(in);
        w->st.skipped++; /* changed under the walk (or vanished): not ours to follow */
        return 0;
    }
    int out = s_create(dfd, name);
    int rc = out < 0 ? out : s_copy_bytes(w, in, out, st.st_size);
    if (rc == 0) {
        s_attrs(w, out, dfd, name, &st);
        w->st.files++;
    }
    if (out >= 0)
        close(out);
    close(in);
    return rc;
}

static int s_copy_symlink(s_walk_t *w, int sfd, int dfd, const char *name, const struct stat *st)
{
    char target[PATH_MAX];
    ssize_t n = readlinkat(sfd, name, target, sizeof target - 1);
    if (n < 0) {
        w->st.skipped++;
        return 0;
    }
    target[n] = '\0';
    if (symlinkat(target, dfd, name) < 0) {
        if (errno != EEXIST || unlinkat(dfd, name, 0) < 0 || symlinkat(target, dfd, name) < 0)
            return -errno;
    }
    s_attrs(w, -1, dfd, name, st);
    w->st.symlinks++;
    return 0;
}

static int s_copy_dir(s_walk_t *w, int sfd, int dfd, int depth);

/* An overlay directory's opaque mark ("y": the lower layers' entries are hidden). */
static int s_copy_opaque(int in, int out)
{
    char v[8];
    ssize_t n = fgetxattr(in, S_OPAQUE, v, sizeof v);
    if (n < 0)
        return errno == ENODATA || errno == ENOTSUP ? 0 : -errno;
    return fsetxattr(out, S_OPAQUE, v, (size_t)n, 0) < 0 ? -errno : 0;
}

/* An overlay whiteout (a char device 0/0: the lower layers' entry is deleted), made again. */
static int s_copy_whiteout(s_walk_t *w, int dfd, const char *name, const struct stat *st)
{
    if (mknodat(dfd, name, S_IFCHR | 0, makedev(0, 0)) < 0) {
        if (errno != EEXIST || unlinkat(dfd, name, 0) < 0 ||
            mknodat(dfd, name, S_IFCHR | 0, makedev(0, 0)) < 0)
            return -errno;
    }
    s_attrs(w, -1, dfd, name, st);
    w->st.whiteouts++;
    return 0;
}

static int s_copy_subdir(s_walk_t *w, int sfd, int dfd, const char *name, int depth)
{
    if (depth >= KA_TREE_MAX_DEPTH)
        return -ELOOP;
    int in = openat(sfd, name, S_DIRFLAG), out = -1, rc = 0;
    struct stat st;
    if (in < 0 || fstat(in, &st) < 0 || st.st_dev != w->dev) {
        w->st.skipped++; /* swapped for a link, or a mount point: never entered */
        goto done;
    }
    if (mkdirat(dfd, name, 0700) < 0 && errno != EEXIST) {
        rc = -errno;
        goto done;
    }
    out = openat(dfd, name, S_DIRFLAG);
    if (out < 0) {
        rc = -errno;
        goto done;
    }
    rc = s_copy_dir(w, in, out, depth + 1);
    if (rc == 0 && w->o->overlay)
        rc = s_copy_opaque(in, out);
    if (rc == 0) {
        s_attrs(w, out, dfd, name, &st);
        w->st.dirs++;
    }
done:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

static int s_copy_entry(s_walk_t *w, int sfd, int dfd, const char *name, int depth)
{
    struct stat st;
    if (fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        w->st.skipped++;
        return 0;
    }
    switch (st.st_mode & S_IFMT) {
    case S_IFDIR:
        return s_copy_subdir(w, sfd, dfd, name, depth);
    case S_IFREG:
        return s_copy_file(w, sfd, dfd, name);
    case S_IFLNK:
        return s_copy_symlink(w, sfd, dfd, name, &st);
    case S_IFCHR:
        if (w->o->overlay && st.st_rdev == makedev(0, 0))
            return s_copy_whiteout(w, dfd, name, &st);
        w->st.skipped++;
        return 0;
    default: /* fifos, sockets, devices: never opened, never copied */
        w->st.skipped++;
        return 0;
    }
}

static bool s_dot(const char *n)
{
    return n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0'));
}

/* A descriptor for readdir that shares nothing of its position with earlier passes. */
static int s_dup_rewound(int fd)
{
    int d = dup(fd);
    if (d >= 0)
        lseek(d, 0, SEEK_SET);
    return d;
}

static int s_copy_dir(s_walk_t *w, int sfd, int dfd, int depth)
{
    int fd = s_dup_rewound(sfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -errno;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL)
        if (!s_dot(e->d_name) && (rc = s_tick(w)) == 0)
            rc = s_copy_entry(w, sfd, dfd, e->d_name, depth);
    if (rc == 0 && errno)
        rc = -errno;
    closedir(d);
    return rc;
}

int ka_tree_copy(const char *src, const char *dst, const ka_tree_opts_t *o, ka_tree_stats_t *stats)
{
    s_walk_t w = {.o = o};
    struct stat st;
    int rc = ka_mkdirs(dst, 0700);
    if (rc < 0)
        return rc;
    int sfd = open(src, S_DIRFLAG), dfd = open(dst, S_DIRFLAG);
    if (sfd < 0 || dfd < 0 || fstat(sfd, &st) < 0)
        rc = -errno;
    else {
        w.dev = st.st_dev;
        rc = s_copy_dir(&w, sfd, dfd, 0);
    }
    if (sfd >= 0)
        close(sfd);
    if (dfd >= 0)
        close(dfd);
    if (stats)
        *stats = w.st;
    return rc;
}

/* ---- removal ------------------------------------------------------------------------------ */

#define S_REMOVE_PASSES 16 /* rereads of a directory that keeps filling (something races us) */

static int s_remove_dir(s_walk_t *w, int dfd, int depth);

/* An entry that changed under the walk: it is taken again on the next pass. */
static bool s_raced(int e)
{
    return e == ENOENT || e == ENOTDIR || e == ELOOP || e == ENOTEMPTY || e == EISDIR ||
           e == EEXIST;
}

static int s_remove_entry(s_walk_t *w, int dfd, const char *name, int depth)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    if (depth >= KA_TREE_MAX_DEPTH)
        return -ELOOP;
    int sub = openat(dfd, name, S_DIRFLAG);
    if (sub < 0)
        return s_raced(errno) ? 0 : -errno;
    struct stat st;
    int rc = fstat(sub, &st) < 0 ? -errno : st.st_dev != w->dev ? -EBUSY : 0;
    if (rc == 0)
        rc = s_remove_dir(w, sub, depth + 1);
    close(sub);
    if (rc == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0 && !s_raced(errno))
        rc = -errno;
    return rc;
}

/* Empties the directory open on dfd; entries that appear meanwhile are taken on the next pass,
 * and a directory still refilling after S_REMOVE_PASSES is -ENOTEMPTY. */
static int s_remove_dir(s_walk_t *w, int dfd, int depth)
{
    for (int pass = 0; pass < S_REMOVE_PASSES; pass++) {
        int fd = s_dup_rewound(dfd);
        DIR *d = fd < 0 ? NULL : fdopendir(fd);
        if (!d) {
            if (fd >= 0)
                close(fd);
            return -errno;
        }
        int rc = 0, seen = 0;
        struct dirent *e;
        while (rc == 0 && (e = readdir(d)) != NULL)
            if (!s_dot(e->d_name) && (rc = s_tick(w)) == 0) {
                seen++;
                rc = s_remove_entry(w, dfd, e->d_name, depth);
            }
        closedir(d);
        if (rc || seen == 0)
            return rc;
    }
    return -ENOTEMPTY;
}

int ka_tree_remove(const char *path, const ka_tree_opts_t *o)
{
    if (!path || !path[0])
        return 0;
    s_walk_t w = {.o = o};
    int fd = open(path, S_DIRFLAG);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        return errno == ENOTDIR || errno == ELOOP ? (unlink(path) < 0 ? -errno : 0) : -errno;
    }
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : 0;
    if (rc == 0) {
        w.dev = st.st_dev;
        rc = s_remove_dir(&w, fd, 0);
    }
    close(fd);
    if (rc == 0 && rmdir(path) < 0 && errno != ENOENT)
        rc = -errno;
    return rc;
}
