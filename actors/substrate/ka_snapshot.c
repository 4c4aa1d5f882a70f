/* ka_snapshot: /data as a tar+zstd stream and back, safely (ka_snapshot.h). */
#include "ka_snapshot.h"
#include "krt.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_DIRFLAG  (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
#define S_BUF      (256u << 10)
#define S_ZSTD_LVL "3"

typedef struct s_ctx {
    const ka_tree_opts_t *o;
    ka_snapshot_info_t info;
    uint64_t entries;
    dev_t dev;
    struct archive *a;
    EVP_MD_CTX *md;
    ka_snap_sink_fn sink;
    void *user;
    int io_err;               /* the sink's or the source's error */
    ka_snap_source_fn source; /* read: where the archive comes from */
    void *src_user;
    char *buf;
    char path[PATH_MAX];
    char *err;
    size_t cap;
} s_ctx_t;

static int s_fail(s_ctx_t *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int s_fail(s_ctx_t *c, int rc, const char *fmt, ...)
{
    if (!c->err || !c->cap || c->err[0]) /* the first reason stands */
        return rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->cap, fmt, ap);
    va_end(ap);
    return rc;
}

static int s_late(s_ctx_t *c)
{
    if (c->o->deadline_ms && krt_mono_ms() > c->o->deadline_ms)
        return s_fail(c, -ETIMEDOUT, "the snapshot took longer than its deadline");
    return 0;
}

static int s_tick(s_ctx_t *c)
{
    if (s_late(c))
        return -ETIMEDOUT;
    if (c->o->max_entries && ++c->entries > c->o->max_entries)
        return s_fail(c, -EFBIG, "more than %llu entries", (unsigned long long)c->o->max_entries);
    return 0;
}

static int s_add_bytes(s_ctx_t *c, uint64_t n)
{
    c->info.tree.bytes += n;
    if (c->o->max_bytes && c->info.tree.bytes > c->o->max_bytes)
        return s_fail(c, -EFBIG, "more than %llu bytes of files (at %s)",
                      (unsigned long long)c->o->max_bytes, c->path);
    return 0;
}

static void s_digest_end(s_ctx_t *c)
{
    unsigned char md[32];
    unsigned int len = 0;
    if (!c->md)
        return;
    EVP_DigestFinal_ex(c->md, md, &len);
    for (unsigned i = 0; i < len && i < 32; i++)
        snprintf(c->info.sha256 + (size_t)2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(c->md);
    c->md = NULL;
}

static int s_archive_err(s_ctx_t *c, int rc)
{
    if (c->io_err)
        return c->io_err;
    return s_fail(c, rc, "archive: %s",
                  archive_error_string(c->a) ? archive_error_string(c->a) : "error");
}

/* ---- writing ------------------------------------------------------------------------------ */

static la_ssize_t s_write_cb(struct archive *a, void *arg, const void *buf, size_t n)
{
    (void)a;
    s_ctx_t *c = arg;
    int rc = c->sink(c->user, buf, n);
    if (rc) {
        c->io_err = rc;
        return -1;
    }
    EVP_DigestUpdate(c->md, buf, n);
    c->info.archive_bytes += n;
    return (la_ssize_t)n;
}

int ka_snapshot_fd_sink(void *user, const void *buf, size_t n)
{
    int fd = *(int *)user;
    for (const char *p = buf; n;) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int s_header(s_ctx_t *c, const struct stat *st, const char *link)
{
    struct archive_entry *e = archive_entry_new();
    if (!e)
        return -ENOMEM;
    archive_entry_set_pathname(e, c->path);
    archive_entry_set_filetype(e, st->st_mode & S_IFMT);
    archive_entry_set_perm(e, st->st_mode & 01777); /* never setuid or setgid */
    archive_entry_set_mtime(e, st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
    archive_entry_set_size(e, S_ISREG(st->st_mode) ? st->st_size : 0);
    if (link)
        archive_entry_set_symlink(e, link);
    int rc = archive_write_header(c->a, e);
    archive_entry_free(e);
    return rc == ARCHIVE_OK ? 0 : s_archive_err(c, -EIO);
}

static int s_put_file(s_ctx_t *c, int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_dev != c->dev) {
        if (fd >= 0)
            close(fd);
        c->info.tree.skipped++; /* changed under the walk: not ours to follow */
        return 0;
    }
    int rc = s_add_bytes(c, (uint64_t)st.st_size); /* a sparse giant fails here, unread */
    if (!rc)
        rc = s_header(c, &st, NULL);
    for (off_t left = st.st_size; !rc && left > 0;) {
        ssize_t n = read(fd, c->buf, left < S_BUF ? (size_t)left : S_BUF);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) /* shrank (it cannot: the sandbox is halted): the header's size is padded */
            break;
        if (archive_write_data(c->a, c->buf, (size_t)n) != n)
            rc = s_archive_err(c, -EIO);
        left -= n;
        if (!rc)
            rc = s_late(c);
    }
    close(fd);
    if (!rc)
        c->info.tree.files++;
    return rc;
}

static int s_put_symlink(s_ctx_t *c, int dfd, const char *name, const struct stat *st)
{
    char target[PATH_MAX];
    ssize_t n = readlinkat(dfd, name, target, sizeof target - 1);
    if (n < 0) {
        c->info.tree.skipped++;
        return 0;
    }
    target[n] = '\0';
    int rc = s_header(c, st, target);
    if (!rc)
        c->info.tree.symlinks++;
    return rc;
}

static int s_put_dir(s_ctx_t *c, int fd, int depth);

static int s_put_subdir(s_ctx_t *c, int dfd, const char *name, int depth)
{
    if (depth >= KA_TREE_MAX_DEPTH)
        return s_fail(c, -ELOOP, "deeper than %d directories at %s", KA_TREE_MAX_DEPTH, c->path);
    int fd = openat(dfd, name, S_DIRFLAG);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || st.st_dev != c->dev) {
        if (fd >= 0)
            close(fd);
        c->info.tree.skipped++; /* swapped for a link, or a mount point: never entered */
        return 0;
    }
    int rc = s_header(c, &st, NULL);
    if (!rc)
        rc = s_put_dir(c, fd, depth + 1);
    if (!rc)
        c->info.tree.dirs++;
    close(fd);
    return rc;
}

static int s_put_entry(s_ctx_t *c, int dfd, const char *name, int depth)
{
    size_t base = strlen(c->path);
    int n = snprintf(c->path + base, sizeof c->path - base, "%s%s", base ? "/" : "", name);
    if (n < 0 || (size_t)n >= sizeof c->path - base)
        return s_fail(c, -ENAMETOOLONG, "a path longer than %d bytes", PATH_MAX);
    struct stat st;
    int rc = 0;
    mode_t type = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? st.st_mode & S_IFMT : 0;
    if (type == S_IFDIR)
        rc = s_put_subdir(c, dfd, name, depth);
    else if (type == S_IFREG)
        rc = s_put_file(c, dfd, name);
    else if (type == S_IFLNK)
        rc = s_put_symlink(c, dfd, name, &st);
    else /* gone, or fifos, sockets, devices: never opened, never archived */
        c->info.tree.skipped++;
    c->path[base] = '\0';
    return rc;
}

static bool s_dot(const char *n)
{
    return n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0'));
}

static int s_put_dir(s_ctx_t *c, int fd, int depth)
{
    int d0 = dup(fd);
    DIR *d = d0 < 0 ? NULL : fdopendir(d0);
    if (!d) {
        if (d0 >= 0)
            close(d0);
        return s_fail(c, -errno, "cannot read directory %s: %s", c->path, strerror(errno));
    }
    rewinddir(d);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL)
        if (!s_dot(e->d_name) && (rc = s_tick(c)) == 0)
            rc = s_put_entry(c, fd, e->d_name, depth);
    if (rc == 0 && errno)
        rc = -errno;
    closedir(d);
    return rc;
}

static int s_open_write(s_ctx_t *c)
{
    if (!(c->a = archive_write_new()) || !(c->md = EVP_MD_CTX_new()) || !(c->buf = malloc(S_BUF)) ||
        !EVP_DigestInit_ex(c->md, EVP_sha256(), NULL))
        return s_fail(c, -ENOMEM, "out of memory");
    if (archive_write_set_format_pax_restricted(c->a) != ARCHIVE_OK ||
        /* names are bytes (a sandbox's need not be UTF-8): stored as they are, no locale */
        archive_write_set_format_option(c->a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK ||
        archive_write_add_filter_zstd(c->a) != ARCHIVE_OK ||
        archive_write_set_filter_option(c->a, "zstd", "compression-level", S_ZSTD_LVL) !=
            ARCHIVE_OK ||
        archive_write_set_bytes_in_last_block(c->a, 1) != ARCHIVE_OK ||
        archive_write_open(c->a, c, NULL, s_write_cb, NULL) != ARCHIVE_OK)
        return s_archive_err(c, -EIO);
    return 0;
}

static void s_end(s_ctx_t *c, ka_snapshot_info_t *info)
{
    s_digest_end(c);
    free(c->buf);
    if (info)
        *info = c->info;
}

int ka_snapshot_write(const char *dir, const ka_tree_opts_t *o, ka_snap_sink_fn sink, void *user,
                      ka_snapshot_info_t *info, char *err, size_t cap)
{
    s_ctx_t c = {.o = o, .sink = sink, .user = user, .err = err, .cap = cap};
    if (err && cap)
        err[0] = '\0';
    int fd = open(dir, S_DIRFLAG), rc = 0;
    struct stat st = {0};
    if (fd < 0 || fstat(fd, &st) < 0)
        rc = s_fail(&c, errno ? -errno : -EIO, "cannot open %s: %s", dir, strerror(errno));
    if (!rc && !(rc = s_open_write(&c))) {
        c.dev = st.st_dev;
        rc = s_put_dir(&c, fd, 0);
        if (archive_write_close(c.a) != ARCHIVE_OK && !rc)
            rc = s_archive_err(&c, -EIO);
    }
    if (c.a)
        archive_write_free(c.a);
    if (fd >= 0)
        close(fd);
    s_end(&c, info);
    return rc;
}

/* ---- reading ------------------------------------------------------------------------------ */

static la_ssize_t s_read_cb(struct archive *a, void *arg, const void **out)
{
    (void)a;
    s_ctx_t *c = arg;
    ssize_t n = c->source(c->src_user, out);
    if (n < 0) {
        c->io_err = (int)n;
        return -1;
    }
    EVP_DigestUpdate(c->md, *out, (size_t)n);
    c->info.archive_bytes += (uint64_t)n;
    return n;
}

typedef struct s_fd_source {
    int fd;
    char *buf; /* S_BUF bytes */
} s_fd_source_t;

static ssize_t s_fd_read(void *user, const void **buf)
{
    s_fd_source_t *s = user;
    ssize_t n;
    while ((n = read(s->fd, s->buf, S_BUF)) < 0 && errno == EINTR) {
    }
    *buf = s->buf;
    return n < 0 ? -errno : n;
}

/* A name an entry may have: relative, no "", "." or ".." component, bounded depth. */
static bool s_name_ok(const char *p)
{
    if (!p || !p[0] || p[0] == '/' || strlen(p) >= PATH_MAX)
        return false;
    int depth = 0;
    for (const char *s = p;; depth++) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
            return false;
        if (!e)
            break;
        s = e + 1;
        if (!*s) /* a trailing slash: a directory's name as tar writes it */
            break;
    }
    return depth < KA_TREE_MAX_DEPTH;
}

/* The directory that holds the entry's last component: every component opened O_NOFOLLOW
 * from root (missing ones made 0700); the last component goes to *leaf (inside c->path). */
static int s_parent(s_ctx_t *c, int root, char **leaf)
{
    int fd = dup(root);
    char *s = c->path;
    for (char *e; fd >= 0 && (e = strchr(s, '/')) != NULL && e[1]; s = e + 1) {
        *e = '\0';
        if (mkdirat(fd, s, 0700) < 0 && errno != EEXIST) {
            close(fd);
            return -errno;
        }
        int sub = openat(fd, s, S_DIRFLAG);
        *e = '/';
        close(fd);
        struct stat st;
        if (sub < 0 || fstat(sub, &st) < 0 || st.st_dev != c->dev) {
            if (sub >= 0)
                close(sub);
            return s_fail(c, -EINVAL,
                          "refused snapshot entry %.200s: it goes through a "
                          "non-directory",
                          c->path);
        }
        fd = sub;
    }
    size_t n = strlen(s);
    if (n && s[n - 1] == '/')
        s[n - 1] = '\0';
    *leaf = s;
    return fd < 0 ? -errno : fd;
}

static void s_attrs(s_ctx_t *c, int fd, struct archive_entry *e)
{
    struct timespec ts[2] = {{archive_entry_mtime(e), archive_entry_mtime_nsec(e)},
                             {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
    if (c->o->owner >= 0)
        (void)!fchown(fd, (uid_t)c->o->owner, (gid_t)c->o->owner);
    (void)!fchmod(fd, archive_entry_perm(e) & 01777);
    futimens(fd, ts);
}

static int s_get_file(s_ctx_t *c, int pfd, const char *name, struct archive_entry *e)
{
    int fd = -1;
    for (int i = 0; i < 2 && fd < 0; i++) {
        fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && (errno != EEXIST || unlinkat(pfd, name, 0) < 0))
            return s_fail(c, -errno, "cannot create %s: %s", c->path, strerror(errno));
    }
    if (fd < 0)
        return -EEXIST;
    la_int64_t size = archive_entry_size(e);
    int rc = size < 0 ? s_fail(c, -EINVAL, "snapshot entry %.200s has a negative size", c->path)
                      : s_add_bytes(c, (uint64_t)size); /* its apparent size, as when saved */
    const void *buf;
    size_t n;
    la_int64_t off;
    while (!rc) {
        int r = archive_read_data_block(c->a, &buf, &n, &off);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK) {
            rc = s_archive_err(c, -EINVAL);
            break;
        }
        if ((rc = s_late(c)))
            break;
        if (off < 0 || (uint64_t)off + n > (uint64_t)size) { /* a sparse map past the size */
            rc = s_fail(c, -EINVAL, "snapshot entry %.200s has data past its size", c->path);
            break;
        }
        if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n) {
            rc = s_fail(c, errno ? -errno : -EIO, "cannot write %s: %s", c->path, strerror(errno));
            break;
        }
    }
    if (!rc && ftruncate(fd, size) < 0) /* a sparse tail */
        rc = -errno;
    if (!rc) {
        s_attrs(c, fd, e);
        c->info.tree.files++;
    }
    close(fd);
    return rc;
}

static int s_get_dir(s_ctx_t *c, int pfd, const char *name, struct archive_entry *e)
{
    if (mkdirat(pfd, name, 0700) < 0 && errno != EEXIST)
        return s_fail(c, -errno, "cannot create %s: %s", c->path, strerror(errno));
    int fd = openat(pfd, name, S_DIRFLAG);
    if (fd < 0)
        return s_fail(c, -EINVAL, "snapshot entry %s is not a directory here", c->path);
    s_attrs(c, fd, e);
    close(fd);
    c->info.tree.dirs++;
    return 0;
}

static int s_get_symlink(s_ctx_t *c, int pfd, const char *name, struct archive_entry *e)
{
    const char *target = archive_entry_symlink(e);
    if (!target || !target[0])
        return s_fail(c, -EINVAL, "snapshot symlink %s has no target", c->path);
    if (symlinkat(target, pfd, name) < 0 &&
        (errno != EEXIST || unlinkat(pfd, name, 0) < 0 || symlinkat(target, pfd, name) < 0))
        return s_fail(c, -errno, "cannot create symlink %s: %s", c->path, strerror(errno));
    struct timespec ts[2] = {{archive_entry_mtime(e), 0}, {archive_entry_mtime(e), 0}};
    if (c->o->owner >= 0)
        (void)!fchownat(pfd, name, (uid_t)c->o->owner, (gid_t)c->o->owner, AT_SYMLINK_NOFOLLOW);
    utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW);
    c->info.tree.symlinks++;
    return 0;
}

static int s_get_entry(s_ctx_t *c, int root, struct archive_entry *e)
{
    const char *name = archive_entry_pathname(e);
    if (!s_name_ok(name))
        return s_fail(c, -EINVAL, "refused snapshot entry with an unsafe name \"%.200s\"",
                      name ? name : "");
    snprintf(c->path, sizeof c->path, "%s", name);
    mode_t type = archive_entry_filetype(e);
    if (archive_entry_hardlink(e) || (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK))
        return s_fail(c, -EINVAL, "refused snapshot entry %.200s: not a file, directory or symlink",
                      name);
    char *leaf = NULL;
    int pfd = s_parent(c, root, &leaf);
    if (pfd < 0 || !leaf)
        return pfd < 0 ? pfd : -EINVAL;
    int rc = type == AE_IFREG   ? s_get_file(c, pfd, leaf, e)
             : type == AE_IFDIR ? s_get_dir(c, pfd, leaf, e)
                                : s_get_symlink(c, pfd, leaf, e);
    close(pfd);
    return rc;
}

static int s_open_read(s_ctx_t *c)
{
    if (!(c->a = archive_read_new()) || !(c->md = EVP_MD_CTX_new()) ||
        !EVP_DigestInit_ex(c->md, EVP_sha256(), NULL))
        return s_fail(c, -ENOMEM, "out of memory");
    if (archive_read_support_filter_zstd(c->a) != ARCHIVE_OK ||
        archive_read_support_format_tar(c->a) != ARCHIVE_OK ||
        archive_read_open(c->a, c, NULL, s_read_cb, NULL) != ARCHIVE_OK)
        return s_archive_err(c, -EINVAL);
    return 0;
}

/* Reads what is left of the source, so the digest covers the whole stream. */
static void s_drain(s_ctx_t *c)
{
    const void *p;
    while (!c->io_err && s_read_cb(c->a, c, &p) > 0) {
    }
}

int ka_snapshot_read(const char *dir, int fd, const ka_tree_opts_t *o, ka_snapshot_info_t *info,
                     char *err, size_t cap)
{
    s_fd_source_t src = {fd, malloc(S_BUF)};
    if (!src.buf) {
        if (info)
            *info = (ka_snapshot_info_t){0};
        if (err && cap)
            snprintf(err, cap, "out of memory");
        return -ENOMEM;
    }
    int rc = ka_snapshot_read_from(dir, s_fd_read, &src, o, info, err, cap);
    free(src.buf);
    return rc;
}

int ka_snapshot_read_from(const char *dir, ka_snap_source_fn source, void *user,
                          const ka_tree_opts_t *o, ka_snapshot_info_t *info, char *err, size_t cap)
{
    s_ctx_t c = {.o = o, .source = source, .src_user = user, .err = err, .cap = cap};
    if (err && cap)
        err[0] = '\0';
    int rc = ka_mkdirs(dir, 0700), root = -1;
    struct stat st = {0};
    if (rc || (root = open(dir, S_DIRFLAG)) < 0 || fstat(root, &st) < 0)
        rc = s_fail(&c, rc ? rc : errno ? -errno : -EIO, "cannot open %s", dir);
    if (!rc && !(rc = s_open_read(&c))) {
        c.dev = st.st_dev;
        struct archive_entry *e;
        int r;
        while (!rc && (r = archive_read_next_header(c.a, &e)) == ARCHIVE_OK)
            if (!(rc = s_tick(&c)))
                rc = s_get_entry(&c, root, e);
        if (!rc && r != ARCHIVE_EOF)
            rc = s_archive_err(&c, -EINVAL);
        if (!rc)
            s_drain(&c);
        if (!rc && c.io_err)
            rc = s_fail(&c, c.io_err, "reading the snapshot failed: %s", strerror(-c.io_err));
    }
    if (c.a)
        archive_read_free(c.a);
    if (root >= 0)
        close(root);
    s_end(&c, info);
    return rc;
}
