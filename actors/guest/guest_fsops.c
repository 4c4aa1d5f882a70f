/* guest_fsops: workspace-confined list, stat, remove, mkdir and move (see guest_fsops.h). */
#include "guest_fsops.h"
#include "guest_files.h"
#include "guest_proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_RESOLVE (RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)

const char *ka_gfs_strerror(int err)
{
    switch (err) {
    case -EEXIST:
        return "file exists";
    case -ENOTEMPTY:
        return "directory not empty";
    case -ENOTDIR:
        return "not a directory";
    case -EPERM:
        return "permission denied";
    case -ENAMETOOLONG:
        return "a name is longer than 255 bytes";
    case -EINVAL:
        return "invalid path (or the workspace root, which cannot be used here)";
    case -ENOENT:
        return "no such file or directory";
    default:
        return ka_gf_strerror(err);
    }
}

/* The kernel's own refusal of an access is EPERM here: EACCES means an escape. */
static int s_err(void)
{
    return errno == EACCES ? -EPERM : -errno;
}

/* A path resolved to its parent directory and last name. */
typedef struct {
    int pfd;    /* O_PATH fd of the parent (-1 for the root) */
    char *last; /* the last component (owned; NULL for the root) */
} s_loc_t;

static void s_loc_free(s_loc_t *l)
{
    if (l->pfd >= 0)
        close(l->pfd);
    free(l->last);
    l->pfd = -1;
    l->last = NULL;
}

static bool s_is_root_abs(const char *p, size_t n)
{
    static const char ws[] = KA_GP_WORKSPACE;
    size_t w = sizeof ws - 1;
    if (n < w || memcmp(p, ws, w) != 0)
        return false;
    for (size_t i = w; i < n; i++)
        if (p[i] != '/')
            return false;
    return true;
}

/* Resolves path: 0 (l set; l->last NULL for the root) or a negative errno. */
static int s_locate(int ws, const char *path, size_t n, s_loc_t *l)
{
    l->pfd = -1;
    l->last = NULL;
    if (memchr(path, 0, n))
        return -EINVAL;
    if (n == 0 || s_is_root_abs(path, n))
        return 0;
    int rc;
    char *rel = ka_gf_rel(path, n, &rc);
    if (!rel)
        return rc;
    size_t len = strlen(rel);
    while (len > 0 && rel[len - 1] == '/')
        rel[--len] = 0;
    if (len == 0 && path[0] == '/') { /* "/" alone was refused by ka_gf_rel */
        free(rel);
        return -EACCES;
    }
    if (len == 0 || strcmp(rel, ".") == 0) {
        free(rel);
        return len == 0 ? -EINVAL : 0;
    }
    char *slash = strrchr(rel, '/');
    const char *last = slash ? slash + 1 : rel;
    if (strcmp(last, ".") == 0 || strcmp(last, "..") == 0) {
        rc = strcmp(last, "..") == 0 ? -EACCES : -EINVAL;
        free(rel);
        return rc;
    }
    if (strlen(last) > KA_GP_NAME_MAX) {
        free(rel);
        return -ENAMETOOLONG;
    }
    l->last = strdup(last);
    if (slash)
        *slash = 0;
    const char *dir = slash ? (rel[0] ? rel : "/") : ".";
    l->pfd = l->last && dir[0] != '/' ? ka_gf_openat2(ws, dir, O_PATH | O_DIRECTORY, 0, S_RESOLVE)
                                      : -EACCES;
    free(rel);
    if (!l->last)
        l->pfd = -ENOMEM;
    if (l->pfd < 0) {
        rc = l->pfd;
        l->pfd = -1;
        s_loc_free(l);
        return rc;
    }
    return 0;
}

static uint32_t s_type(mode_t m)
{
    if (S_ISREG(m))
        return KA_GP_FT_FILE;
    if (S_ISDIR(m))
        return KA_GP_FT_DIR;
    if (S_ISLNK(m))
        return KA_GP_FT_SYMLINK;
    return KA_GP_FT_OTHER;
}

static void s_fill(ka_gfs_entry_t *e, const char *name, const struct stat *st)
{
    snprintf(e->name, sizeof e->name, "%s", name);
    e->type = s_type(st->st_mode);
    e->size = (uint64_t)st->st_size;
    e->mode = (uint32_t)(st->st_mode & 07777);
    e->mtime_ms = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
}

int ka_gfs_stat(int ws, const char *path, size_t n, ka_gfs_entry_t *out)
{
    s_loc_t l;
    int rc = s_locate(ws, path, n, &l);
    if (rc)
        return rc;
    struct stat st;
    if (l.last ? fstatat(l.pfd, l.last, &st, AT_SYMLINK_NOFOLLOW) : fstat(ws, &st))
        rc = s_err();
    else
        s_fill(out, l.last ? l.last : ".", &st);
    s_loc_free(&l);
    return rc;
}

int ka_gfs_open_dir(int ws, const char *path, size_t n)
{
    s_loc_t l;
    int rc;
    if (n > 0 && path[n - 1] == '/' && !s_is_root_abs(path, n) && !memchr(path, 0, n)) {
        /* "dir/": the last component is followed, confined like every other */
        char *rel = ka_gf_rel(path, n, &rc);
        int fd = rel ? ka_gf_openat2(ws, rel, O_RDONLY | O_DIRECTORY, 0, S_RESOLVE) : rc;
        free(rel);
        return fd;
    }
    rc = s_locate(ws, path, n, &l);
    if (rc)
        return rc;
    int fd;
    if (!l.last) {
        fd = openat(ws, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } else {
        struct stat st;
        if (fstatat(l.pfd, l.last, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = s_err();
        } else if (!S_ISDIR(st.st_mode)) {
            rc = -ENOTDIR;
        }
        fd = rc ? -1 : openat(l.pfd, l.last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (!rc && fd < 0) /* swapped for a symlink or a file since the stat */
        rc = errno == ELOOP ? -EACCES : s_err();
    s_loc_free(&l);
    return rc ? rc : fd;
}

static int s_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names of dir (its fd consumed) after `after`, sorted: *names (each and the array
 * owned), *count. */
static int s_names(int dfd, const char *after, char ***names, size_t *count)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -errno;
    }
    char **v = NULL;
    size_t k = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || strcmp(de->d_name, after) <= 0)
            continue;
        if (k == cap) {
            cap = cap ? cap * 2 : 64;
            char **g = realloc(v, cap * sizeof *v);
            if (!g) {
                rc = -ENOMEM;
                break;
            }
            v = g;
        }
        if (!(v[k] = strdup(de->d_name)))
            rc = -ENOMEM;
        else
            k++;
    }
    closedir(d);
    if (k)
        qsort(v, k, sizeof *v, s_cmp);
    *names = v;
    *count = k;
    return rc;
}

int ka_gfs_list(int ws, const char *path, size_t n, const char *after, size_t an, size_t limit,
                ka_gfs_list_t *out)
{
    memset(out, 0, sizeof *out);
    if (an > KA_GP_NAME_MAX || (an && (memchr(after, 0, an) || memchr(after, '/', an))))
        return -EINVAL;
    char from[KA_GP_NAME_MAX + 1];
    memcpy(from, after, an);
    from[an] = 0;
    limit = limit == 0 ? KA_GP_PAGE_DEF : limit > KA_GP_PAGE_MAX ? KA_GP_PAGE_MAX : limit;
    int dfd = ka_gfs_open_dir(ws, path, n);
    if (dfd < 0)
        return dfd;
    int sfd = dup(dfd); /* for fstatat: the DIR owns dfd */
    char **names = NULL;
    size_t count = 0;
    int rc = sfd < 0 ? -errno : s_names(dfd, from, &names, &count);
    if (sfd < 0)
        close(dfd);
    size_t take = count < limit ? count : limit;
    if (rc == 0 && take && !(out->entries = calloc(take, sizeof *out->entries)))
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < take; i++) {
        struct stat st;
        if (fstatat(sfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* removed meanwhile */
        s_fill(&out->entries[out->n++], names[i], &st);
    }
    out->more = rc == 0 && count > take;
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    if (sfd >= 0)
        close(sfd);
    if (rc)
        ka_gfs_list_free(out);
    return rc;
}

void ka_gfs_list_free(ka_gfs_list_t *l)
{
    free(l->entries);
    memset(l, 0, sizeof *l);
}

/* Removes everything inside directory dfd (consumed), never following a link. */
static int s_empty_dir(int dfd, int depth)
{
    if (depth > KA_GFS_DEPTH_MAX) {
        close(dfd);
        return -ENAMETOOLONG;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -errno;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, ".."))
            continue;
        if (unlinkat(dirfd(d), nm, 0) == 0 || errno == ENOENT)
            continue;
        if (errno != EISDIR && errno != EPERM) {
            rc = s_err();
            break;
        }
        int sub = openat(dirfd(d), nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
            rc = errno == ELOOP || errno == ENOTDIR ? -EACCES : s_err();
            break;
        }
        rc = s_empty_dir(sub, depth + 1);
        if (rc == 0 && unlinkat(dirfd(d), nm, AT_REMOVEDIR) < 0 && errno != ENOENT)
            rc = s_err();
        if (rc == 0)
            rewinddir(d); /* entries may have moved while we were below */
    }
    closedir(d);
    return rc;
}

int ka_gfs_remove(int ws, const char *path, size_t n, bool recursive)
{
    s_loc_t l;
    int rc = s_locate(ws, path, n, &l);
    if (rc)
        return rc;
    if (!l.last)
        return -EINVAL;
    struct stat st;
    if (fstatat(l.pfd, l.last, &st, AT_SYMLINK_NOFOLLOW) < 0)
        rc = s_err();
    else if (!S_ISDIR(st.st_mode))
        rc = unlinkat(l.pfd, l.last, 0) < 0 ? s_err() : 0;
    else if (unlinkat(l.pfd, l.last, AT_REMOVEDIR) == 0)
        rc = 0;
    else if ((errno != ENOTEMPTY && errno != EEXIST) || !recursive)
        rc = errno == EEXIST ? -ENOTEMPTY : s_err();
    else {
        int dfd = openat(l.pfd, l.last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        rc = dfd < 0 ? (errno == ELOOP || errno == ENOTDIR ? -EACCES : s_err())
                     : s_empty_dir(dfd, 1);
        if (rc == 0 && unlinkat(l.pfd, l.last, AT_REMOVEDIR) < 0)
            rc = s_err();
    }
    s_loc_free(&l);
    return rc;
}

int ka_gfs_mkdir(int ws, const char *path, size_t n, bool parents, unsigned mode)
{
    s_loc_t l;
    int rc = s_locate(ws, path, n, &l);
    if (rc == -ENOENT && parents) {
        char *rel = ka_gf_rel(path, n, &rc);
        rc = rel ? ka_gf_mkparents(ws, rel) : rc;
        free(rel);
        rc = rc ? rc : s_locate(ws, path, n, &l);
    }
    if (rc)
        return rc;
    if (!l.last)
        return parents ? 0 : -EEXIST;
    mode = mode ? mode & 07777 : 0755;
    if (mkdirat(l.pfd, l.last, mode) == 0) {
        /* the umask is not ours to apply: set what was asked */
        int dfd = openat(l.pfd, l.last, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd >= 0) {
            if (fchmod(dfd, mode) < 0)
                rc = s_err();
            close(dfd);
        }
    } else if (errno == EEXIST && parents) {
        struct stat st;
        rc = fstatat(l.pfd, l.last, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) ? 0
                                                                                          : -EEXIST;
    } else {
        rc = s_err();
    }
    s_loc_free(&l);
    return rc;
}

int ka_gfs_move(int ws, const char *src, size_t sn, const char *dst, size_t dn, bool overwrite)
{
    s_loc_t a, b;
    int rc = s_locate(ws, src, sn, &a);
    if (rc)
        return rc;
    rc = s_locate(ws, dst, dn, &b);
    if (rc) {
        s_loc_free(&a);
        return rc;
    }
    if (!a.last || !b.last)
        rc = -EINVAL;
    else if (renameat2(a.pfd, a.last, b.pfd, b.last, overwrite ? 0 : RENAME_NOREPLACE) < 0)
        rc = s_err();
    s_loc_free(&a);
    s_loc_free(&b);
    return rc;
}

void ka_gfs_pack_entry(msgpack_packer *pk, const ka_gfs_entry_t *e)
{
    msgpack_pack_array(pk, 5);
    ka_gp_pack_cstr(pk, e->name);
    msgpack_pack_uint32(pk, e->type);
    msgpack_pack_uint64(pk, e->size);
    msgpack_pack_uint32(pk, e->mode);
    msgpack_pack_int64(pk, e->mtime_ms);
}
