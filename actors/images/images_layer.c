/*
 * images_layer: checking, unpacking and applying OCI layers, and writing deterministic layers
 * from a directory. See images_int.h for the contracts.
 *
 * Safety rules for untrusted layers: names are normalised and refused if absolute or if they
 * hold a ".." component; every directory on the way to an entry is opened with O_NOFOLLOW, so
 * nothing is ever written through a symlink; device nodes and sockets are never created.
 */
#include "images_int.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/evp.h>

#define S_BLOCK     (1 << 16)
#define S_WH_PREFIX ".wh."
#define S_WH_OPAQUE ".wh..wh..opq"

/* ---- path normalisation ------------------------------------------------------------------ */

/* Normalises a tar name into out: drops leading "./", repeated and trailing '/', "." parts.
 * "" means the root. -EBADMSG for absolute names and ".." components. */
static int s_norm(const char *in, char *out, size_t cap)
{
    if (!in)
        return ka_img_fail(-EBADMSG, "layer entry without a name");
    if (in[0] == '/')
        return ka_img_fail(-EBADMSG, "layer entry has an absolute path: %s", in);
    size_t o = 0;
    const char *p = in;
    while (*p) {
        while (*p == '/')
            p++;
        const char *e = p;
        while (*e && *e != '/')
            e++;
        size_t n = (size_t)(e - p);
        if (n == 0)
            break;
        if (n == 1 && p[0] == '.') {
            p = e;
            continue;
        }
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return ka_img_fail(-EBADMSG, "layer entry escapes the root with '..': %s", in);
        if (o + n + 2 > cap)
            return ka_img_fail(-EBADMSG, "layer entry name too long: %.64s...", in);
        if (o)
            out[o++] = '/';
        memcpy(out + o, p, n);
        o += n;
        p = e;
    }
    out[o] = '\0';
    return 0;
}

/* Splits a normalised name into parent ("" for the root) and leaf, in place. */
static const char *s_split(char *name)
{
    char *slash = strrchr(name, '/');
    if (!slash) {
        memmove(name + 1, name, strlen(name) + 1);
        name[0] = '\0';
        return name + 1;
    }
    *slash = '\0';
    return slash + 1;
}

/* ---- a small string set (symlinks seen in a layer) ----------------------------------------- */

typedef struct s_set {
    char **slots;
    size_t cap, n;
} s_set_t;

static uint64_t s_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static char s_tomb[1];

/* Finds the slot of s[0..n) or the empty slot it would go to. */
static char **s_set_slot(s_set_t *set, const char *s, size_t n)
{
    size_t i = s_hash(s, n) & (set->cap - 1);
    char **tomb = NULL;
    for (;;) {
        char *v = set->slots[i];
        if (!v)
            return tomb ? tomb : &set->slots[i];
        if (v == s_tomb) {
            if (!tomb)
                tomb = &set->slots[i];
        } else if (strlen(v) == n && !memcmp(v, s, n)) {
            return &set->slots[i];
        }
        i = (i + 1) & (set->cap - 1);
    }
}

static bool s_set_has(s_set_t *set, const char *s, size_t n)
{
    if (!set->n)
        return false;
    char **slot = s_set_slot(set, s, n);
    return *slot && *slot != s_tomb;
}

static int s_set_add(s_set_t *set, const char *s)
{
    if ((set->n + 1) * 2 > set->cap) {
        size_t ncap = set->cap ? set->cap * 2 : 64;
        s_set_t grown = {calloc(ncap, sizeof(char *)), ncap, 0};
        if (!grown.slots)
            return -ENOMEM;
        for (size_t i = 0; i < set->cap; i++) {
            char *v = set->slots[i];
            if (v && v != s_tomb) {
                *s_set_slot(&grown, v, strlen(v)) = v;
                grown.n++;
            }
        }
        free(set->slots);
        *set = grown;
    }
    char **slot = s_set_slot(set, s, strlen(s));
    if (*slot && *slot != s_tomb)
        return 0;
    *slot = strdup(s);
    if (!*slot)
        return -ENOMEM;
    set->n++;
    return 0;
}

static void s_set_del(s_set_t *set, const char *s)
{
    if (!set->n)
        return;
    char **slot = s_set_slot(set, s, strlen(s));
    if (*slot && *slot != s_tomb) {
        free(*slot);
        *slot = s_tomb;
        set->n--;
    }
}

static void s_set_free(s_set_t *set)
{
    for (size_t i = 0; i < set->cap; i++)
        if (set->slots[i] && set->slots[i] != s_tomb)
            free(set->slots[i]);
    free(set->slots);
    memset(set, 0, sizeof *set);
}

/* -EBADMSG if some proper prefix of the normalised name is a symlink in set. */
static int s_through_symlink(s_set_t *set, const char *name, const char *orig)
{
    for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/'))
        if (s_set_has(set, name, (size_t)(p - name)))
            return ka_img_fail(-EBADMSG, "layer entry %s goes through the symlink %.*s", orig,
                               (int)(p - name), name);
    return 0;
}

/* ---- reading ----------------------------------------------------------------------------- */

static struct archive *s_open_read(const char *blob, bool raw)
{
    struct archive *a = archive_read_new();
    if (!a)
        return NULL;
    archive_read_support_filter_all(a);
    if (raw)
        archive_read_support_format_raw(a);
    else
        archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, blob, S_BLOCK) != ARCHIVE_OK) {
        ka_img_fail(-EBADMSG, "cannot read layer %s: %s", blob, archive_error_string(a));
        archive_read_free(a);
        return NULL;
    }
    return a;
}

/* Hashes the uncompressed stream of blob into out. */
static int s_uncompressed_digest(const char *blob, char out[KA_DIGEST_LEN])
{
    struct archive *a = s_open_read(blob, true);
    if (!a)
        return -EBADMSG;
    struct archive_entry *e;
    int rc = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md) {
        archive_read_free(a);
        return -ENOMEM;
    }
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    if (archive_read_next_header(a, &e) != ARCHIVE_OK) {
        rc = ka_img_fail(-EBADMSG, "cannot decompress layer %s: %s", blob, archive_error_string(a));
    } else {
        static __thread char buf[S_BLOCK];
        for (;;) {
            la_ssize_t n = archive_read_data(a, buf, sizeof buf);
            if (n < 0) {
                rc = ka_img_fail(-EBADMSG, "cannot decompress layer %s: %s", blob,
                                 archive_error_string(a));
                break;
            }
            if (n == 0)
                break;
            EVP_DigestUpdate(md, buf, (size_t)n);
        }
    }
    unsigned char d[32];
    unsigned int dl = 0;
    EVP_DigestFinal_ex(md, d, &dl);
    EVP_MD_CTX_free(md);
    archive_read_free(a);
    if (rc == 0)
        ka_digest_from_md(d, out);
    return rc;
}

/* What ka_layer_check remembers about the entries seen so far. */
typedef struct s_seen {
    s_set_t links; /* symlinks: nothing may go through them */
    s_set_t objs;  /* non-directories that unpack creates: what a hard link may name */
} s_seen_t;

/* Checks one entry's names; keeps the sets current. */
static int s_check_entry(s_seen_t *seen, struct archive_entry *e, char *name, size_t cap,
                         ka_layer_stats_t *st)
{
    const char *orig = archive_entry_pathname(e);
    int rc = s_norm(orig, name, cap);
    if (rc < 0)
        return rc;
    rc = s_through_symlink(&seen->links, name, orig);
    if (rc < 0)
        return rc;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (!strncmp(base, S_WH_PREFIX, 4))
        st->has_whiteouts = true;
    const char *hl = archive_entry_hardlink(e);
    mode_t type = archive_entry_filetype(e);
    if (hl) {
        char *t = malloc(cap);
        if (!t)
            return -ENOMEM;
        rc = s_norm(hl, t, cap);
        if (rc == 0)
            rc = s_through_symlink(&seen->links, t, hl);
        if (rc == 0 && !s_set_has(&seen->objs, t, strlen(t)))
            rc = ka_img_fail(-EBADMSG,
                             "layer entry %s hard-links %s, which is not an earlier "
                             "file of the layer",
                             orig, hl);
        free(t);
        if (rc < 0)
            return rc;
    }
    if (name[0] == '\0') {
        if (hl || type != AE_IFDIR)
            return ka_img_fail(-EBADMSG, "layer replaces its root with a non-directory");
        return 0;
    }
    if (hl || type == AE_IFLNK || type == AE_IFREG || type == AE_IFIFO)
        rc = s_set_add(&seen->objs, name);
    else
        s_set_del(&seen->objs, name);
    if (rc < 0)
        return rc;
    if (!hl && type == AE_IFLNK)
        return s_set_add(&seen->links, name);
    s_set_del(&seen->links, name);
    return 0;
}

int ka_layer_check(const char *blob, const char *diff_id, ka_layer_stats_t *st)
{
    ka_layer_stats_t local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    struct archive *a = s_open_read(blob, false);
    if (!a)
        return -EBADMSG;
    s_seen_t seen = {{0}, {0}};
    char name[4096];
    struct archive_entry *e;
    int rc = 0;
    for (;;) {
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
            rc = ka_img_fail(-EBADMSG, "layer %s is corrupt or truncated: %s", blob,
                             archive_error_string(a));
            break;
        }
        st->entries++;
        rc = s_check_entry(&seen, e, name, sizeof name, st);
        if (rc < 0)
            break;
        if (archive_entry_size(e) > 0)
            st->bytes += (uint64_t)archive_entry_size(e);
        if (archive_read_data_skip(a) != ARCHIVE_OK) {
            rc = ka_img_fail(-EBADMSG, "layer %s is corrupt or truncated: %s", blob,
                             archive_error_string(a));
            break;
        }
    }
    s_set_free(&seen.links);
    s_set_free(&seen.objs);
    archive_read_free(a);
    if (rc == 0 && diff_id) {
        char d[KA_DIGEST_LEN];
        rc = s_uncompressed_digest(blob, d);
        if (rc == 0 && strcmp(d, diff_id) != 0)
            rc =
                ka_img_fail(-EBADMSG, "layer %s: uncompressed content hashes to %s, config says %s",
                            blob, d, diff_id);
    }
    return rc;
}

/* ---- unpacking --------------------------------------------------------------------------- */

typedef struct s_unpack {
    int root;       /* destination root fd */
    char *cached;   /* parent path of the cached fd */
    int cached_fd;  /* fd of the parent dir last used, or -1 */
    bool can_chown; /* false once chown failed with EPERM (rootless) */
} s_unpack_t;

/* Opens the directory rel (normalised, "" = root) below root, never following symlinks;
 * creates missing directories if create. Returns an owned fd or a negative code. */
static int s_walk(int root, const char *rel, bool create)
{
    char *copy = strdup(rel);
    if (!copy)
        return -ENOMEM;
    int fd = dup(root);
    int rc = fd < 0 ? -errno : 0;
    for (char *p = copy, *next; rc == 0 && *p; p = next) {
        char *slash = strchr(p, '/');
        next = slash ? slash + 1 : p + strlen(p);
        if (slash)
            *slash = '\0';
        int nfd = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, p, 0755) < 0 && errno != EEXIST)
                rc = ka_img_fail(-errno, "mkdir %s: %s", rel, strerror(errno));
            else
                nfd = openat(fd, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (rc == 0 && nfd < 0) {
            if (errno == ELOOP || errno == ENOTDIR)
                rc = ka_img_fail(-EBADMSG, "layer writes through a symlink or file at %s", rel);
            else
                rc = ka_img_fail(errno == ENOENT ? -EBADMSG : -errno, "open %s: %s", rel,
                                 strerror(errno));
        }
        close(fd);
        fd = nfd;
    }
    free(copy);
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    return fd;
}

/* s_walk with creation, caching the last directory (tar entries come grouped by directory).
 * Returns a borrowed fd. */
static int s_dir(s_unpack_t *u, const char *rel)
{
    if (u->cached && !strcmp(u->cached, rel))
        return u->cached_fd;
    char *key = strdup(rel);
    if (!key)
        return -ENOMEM;
    int fd = s_walk(u->root, rel, true);
    if (fd < 0) {
        free(key);
        return fd;
    }
    if (u->cached_fd >= 0)
        close(u->cached_fd);
    free(u->cached);
    u->cached = key;
    u->cached_fd = fd;
    return fd;
}

static void s_uncache(s_unpack_t *u)
{
    if (u->cached_fd >= 0)
        close(u->cached_fd);
    u->cached_fd = -1;
    free(u->cached);
    u->cached = NULL;
}

static void s_owner(s_unpack_t *u, int fd, const char *leaf, struct archive_entry *e, int flags)
{
    if (!u->can_chown)
        return;
    int r =
        leaf ? fchownat(fd, leaf, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e), flags)
             : fchown(fd, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e));
    if (r < 0 && errno == EPERM)
        u->can_chown = false;
}

static int s_write_data(struct archive *a, int fd, const char *name)
{
    const void *buf;
    size_t len;
    la_int64_t off;
    for (;;) {
        int r = archive_read_data_block(a, &buf, &len, &off);
        if (r == ARCHIVE_EOF)
            return 0;
        if (r != ARCHIVE_OK)
            return ka_img_fail(-EBADMSG, "layer is corrupt or truncated at %s: %s", name,
                               archive_error_string(a));
        const char *p = buf;
        while (len > 0) {
            ssize_t n = pwrite(fd, p, len, off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return ka_img_fail(-errno, "write %s: %s", name, strerror(errno));
            p += n;
            len -= (size_t)n;
            off += n;
        }
    }
}

/* Creates one entry. name is normalised and is split in place. */
static int s_unpack_entry(s_unpack_t *u, struct archive *a, struct archive_entry *e, char *name,
                          ka_layer_stats_t *st)
{
    mode_t type = archive_entry_filetype(e);
    const char *hl = archive_entry_hardlink(e);
    mode_t perm = archive_entry_perm(e) & 07777;
    if (name[0] == '\0') { /* the root itself */
        if (type == AE_IFDIR) {
            s_owner(u, u->root, NULL, e, 0);
            fchmod(u->root, perm);
        }
        return 0;
    }
    if (!hl && (type == AE_IFCHR || type == AE_IFBLK || type == AE_IFSOCK)) {
        st->skipped++;
        return 0;
    }
    const char *leaf = s_split(name);
    int pfd = s_dir(u, name);
    if (pfd < 0)
        return pfd;
    if (!strncmp(leaf, S_WH_PREFIX, 4))
        st->has_whiteouts = true;
    struct stat old;
    if (fstatat(pfd, leaf, &old, AT_SYMLINK_NOFOLLOW) == 0 &&
        !(type == AE_IFDIR && !hl && S_ISDIR(old.st_mode))) {
        /* a later entry replaces an earlier one; the cache (= name) stays valid */
        int rc = ka_fs_rmtree_at(pfd, leaf);
        if (rc < 0)
            return ka_img_fail(rc, "cannot replace %s/%s", name, leaf);
    }
    struct timespec ts[2] = {{archive_entry_mtime(e), 0}, {archive_entry_mtime(e), 0}};
    if (hl) {
        char tname[4096];
        int rc = s_norm(hl, tname, sizeof tname);
        if (rc < 0)
            return rc;
        const char *tleaf = s_split(tname);
        if (!*tleaf)
            return ka_img_fail(-EBADMSG, "layer hard-links the root");
        int tfd = s_walk(u->root, tname, false);
        if (tfd < 0)
            return ka_img_fail(-EBADMSG, "hard link target %s is missing or unsafe", hl);
        if (linkat(tfd, tleaf, pfd, leaf, 0) < 0)
            rc = ka_img_fail(errno == ENOENT ? -EBADMSG : -errno, "cannot hard-link %s to %s: %s",
                             leaf, hl, strerror(errno));
        close(tfd);
        return rc;
    }
    switch (type) {
    case AE_IFDIR: {
        if (mkdirat(pfd, leaf, 0700) < 0 && errno != EEXIST)
            return ka_img_fail(-errno, "mkdir %s/%s: %s", name, leaf, strerror(errno));
        int fd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return ka_img_fail(-errno, "open %s/%s: %s", name, leaf, strerror(errno));
        s_owner(u, fd, NULL, e, 0);
        fchmod(fd, perm);
        close(fd);
        return 0;
    }
    case AE_IFREG: {
        int fd = openat(pfd, leaf, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
            return ka_img_fail(-errno, "create %s/%s: %s", name, leaf, strerror(errno));
        int rc = s_write_data(a, fd, leaf);
        if (rc == 0 && ftruncate(fd, archive_entry_size(e)) < 0)
            rc = -errno;
        if (rc == 0) {
            s_owner(u, fd, NULL, e, 0);
            fchmod(fd, perm);
            futimens(fd, ts);
            st->bytes += (uint64_t)archive_entry_size(e);
        }
        close(fd);
        return rc;
    }
    case AE_IFLNK: {
        const char *target = archive_entry_symlink(e);
        if (!target || symlinkat(target, pfd, leaf) < 0)
            return ka_img_fail(-EBADMSG, "cannot create symlink %s/%s", name, leaf);
        s_owner(u, pfd, leaf, e, AT_SYMLINK_NOFOLLOW);
        utimensat(pfd, leaf, ts, AT_SYMLINK_NOFOLLOW);
        return 0;
    }
    case AE_IFIFO:
        if (mkfifoat(pfd, leaf, perm) < 0)
            return ka_img_fail(-errno, "mkfifo %s/%s: %s", name, leaf, strerror(errno));
        s_owner(u, pfd, leaf, e, AT_SYMLINK_NOFOLLOW);
        return 0;
    default:
        st->skipped++;
        return 0;
    }
}

int ka_layer_unpack(const char *blob, const char *dest, ka_layer_stats_t *st)
{
    ka_layer_stats_t local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (mkdir(dest, 0755) < 0)
        return ka_img_fail(-errno, "mkdir %s: %s", dest, strerror(errno));
    s_unpack_t u = {.root = -1, .cached_fd = -1, .can_chown = true};
    struct archive *a = NULL;
    int rc = 0;
    u.root = open(dest, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (u.root < 0) {
        rc = ka_img_fail(-errno, "open %s: %s", dest, strerror(errno));
        goto out;
    }
    a = s_open_read(blob, false);
    if (!a) {
        rc = -EBADMSG;
        goto out;
    }
    char name[4096];
    struct archive_entry *e;
    for (;;) {
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
            rc = ka_img_fail(-EBADMSG, "layer %s is corrupt or truncated: %s", blob,
                             archive_error_string(a));
            break;
        }
        st->entries++;
        rc = s_norm(archive_entry_pathname(e), name, sizeof name);
        if (rc == 0)
            rc = s_unpack_entry(&u, a, e, name, st);
        if (rc < 0)
            break;
    }
out:
    s_uncache(&u);
    if (a)
        archive_read_free(a);
    if (u.root >= 0)
        close(u.root);
    if (rc < 0)
        ka_fs_rmtree(dest);
    return rc;
}

/* ---- applying layers onto a rootfs ------------------------------------------------------- */

static int s_apply_dir(int lfd, int rfd, const char *where);

/* Empties directory rfd (an opaque whiteout below). */
static int s_empty_dir(int rfd)
{
    int fd = openat(rfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* own offset */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return -errno;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            rc = ka_fs_rmtree_at(rfd, de->d_name);
    }
    closedir(d);
    return rc;
}

/* One pass over a layer directory: whiteouts (whiteouts = true) or content. */
static int s_apply_pass(int lfd, int rfd, const char *where, bool whiteouts)
{
    int fd = openat(lfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* own offset */
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return ka_img_fail(-errno, "opendir %s: %s", where, strerror(errno));
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, S_WH_OPAQUE))
            continue;
        bool wh = !strncmp(n, S_WH_PREFIX, 4);
        if (wh != whiteouts)
            continue;
        if (wh) {
            const char *victim = n + 4;
            if (*victim && strcmp(victim, ".") && strcmp(victim, ".."))
                rc = ka_fs_rmtree_at(rfd, victim);
            continue;
        }
        struct stat ls, rs;
        if (fstatat(lfd, n, &ls, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = ka_img_fail(-errno, "stat %s/%s: %s", where, n, strerror(errno));
            break;
        }
        bool exists = fstatat(rfd, n, &rs, AT_SYMLINK_NOFOLLOW) == 0;
        if (S_ISDIR(ls.st_mode)) {
            if (exists && !S_ISDIR(rs.st_mode)) {
                rc = ka_fs_rmtree_at(rfd, n);
                exists = false;
            }
            if (rc == 0 && !exists && mkdirat(rfd, n, 0700) < 0)
                rc = ka_img_fail(-errno, "mkdir %s/%s: %s", where, n, strerror(errno));
            if (rc < 0)
                break;
            int l2 = openat(lfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int r2 = openat(rfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (l2 < 0 || r2 < 0) {
                rc = ka_img_fail(-EIO, "open %s/%s: %s", where, n, strerror(errno));
            } else {
                if (fchown(r2, ls.st_uid, ls.st_gid) < 0 && errno != EPERM)
                    rc = -errno;
                fchmod(r2, ls.st_mode & 07777);
                char *sub = ka_strfmt("%s/%s", where, n);
                if (rc == 0)
                    rc = sub ? s_apply_dir(l2, r2, sub) : -ENOMEM;
                free(sub);
            }
            if (l2 >= 0)
                close(l2);
            if (r2 >= 0)
                close(r2);
        } else {
            if (exists)
                rc = ka_fs_rmtree_at(rfd, n);
            if (rc == 0 && linkat(lfd, n, rfd, n, 0) < 0)
                rc = ka_img_fail(-errno, "link %s/%s: %s", where, n, strerror(errno));
        }
    }
    closedir(d);
    return rc;
}

static int s_apply_dir(int lfd, int rfd, const char *where)
{
    struct stat st;
    if (fstatat(lfd, S_WH_OPAQUE, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        int rc = s_empty_dir(rfd);
        if (rc < 0)
            return ka_img_fail(rc, "cannot empty opaque directory %s", where);
    }
    int rc = s_apply_pass(lfd, rfd, where, true);
    return rc < 0 ? rc : s_apply_pass(lfd, rfd, where, false);
}

int ka_layer_apply(const char *layer_dir, const char *rootfs)
{
    int lfd = open(layer_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lfd < 0)
        return ka_img_fail(-errno, "open %s: %s", layer_dir, strerror(errno));
    int rfd = open(rootfs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) {
        int rc = ka_img_fail(-errno, "open %s: %s", rootfs, strerror(errno));
        close(lfd);
        return rc;
    }
    struct stat ls;
    if (fstat(lfd, &ls) == 0) {
        fchmod(rfd, ls.st_mode & 07777);
        if (fchown(rfd, ls.st_uid, ls.st_gid) < 0) {
            /* rootless: keep our own ownership */
        }
    }
    int rc = s_apply_dir(lfd, rfd, "");
    close(lfd);
    close(rfd);
    return rc;
}

/* ---- deterministic tar of a directory ------------------------------------------------------ */

typedef struct s_paths {
    char **v;
    size_t n, cap;
} s_paths_t;

static int s_paths_add(s_paths_t *p, char *s)
{
    if (!s)
        return -ENOMEM;
    if (p->n == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 256;
        char **nv = realloc(p->v, ncap * sizeof *nv);
        if (!nv) {
            free(s);
            return -ENOMEM;
        }
        p->v = nv;
        p->cap = ncap;
    }
    p->v[p->n++] = s;
    return 0;
}

/* Collects every path below root/rel (relative names, no leading "./"). */
static int s_collect(const char *root, const char *rel, s_paths_t *out)
{
    char *full = rel[0] ? ka_strfmt("%s/%s", root, rel) : strdup(root);
    if (!full)
        return -ENOMEM;
    DIR *d = opendir(full);
    if (!d) {
        int rc = ka_img_fail(-errno, "opendir %s: %s", full, strerror(errno));
        free(full);
        return rc;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char *child = rel[0] ? ka_strfmt("%s/%s", rel, de->d_name) : strdup(de->d_name);
        if (!child) {
            rc = -ENOMEM;
            break;
        }
        struct stat st;
        char *cf = ka_strfmt("%s/%s", full, de->d_name);
        bool isdir = cf && lstat(cf, &st) == 0 && S_ISDIR(st.st_mode);
        free(cf);
        rc = s_paths_add(out, child);
        if (rc == 0 && isdir)
            rc = s_collect(root, child, out);
    }
    closedir(d);
    free(full);
    return rc;
}

static int s_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static la_ssize_t s_tar_write(struct archive *a, void *user, const void *buf, size_t len)
{
    if (ka_blob_writer_write(user, buf, len) < 0) {
        archive_set_error(a, EIO, "%s", ka_img_last_error());
        return -1;
    }
    return (la_ssize_t)len;
}

typedef struct s_link {
    dev_t dev;
    ino_t ino;
    char *path; /* first name of the inode in the tar (borrowed from the path list) */
} s_link_t;

/* Copies size bytes of full into the archive (exactly what the header announced). */
static int s_tar_file(struct archive *a, const char *full, uint64_t size, ka_layer_stats_t *st)
{
    int fd = open(full, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return ka_img_fail(-errno, "open %s: %s", full, strerror(errno));
    static __thread char buf[S_BLOCK];
    int rc = 0;
    for (uint64_t left = size; left > 0;) {
        ssize_t n = read(fd, buf, left < sizeof buf ? (size_t)left : sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = ka_img_fail(-errno, "read %s: %s", full, strerror(errno));
            break;
        }
        if (n == 0) {
            rc = ka_img_fail(-EIO, "%s shrank while it was being read", full);
            break;
        }
        left -= (uint64_t)n;
        if (archive_write_data(a, buf, (size_t)n) != n) {
            rc = ka_img_fail(-EIO, "tar write %s: %s", full, archive_error_string(a));
            break;
        }
        st->bytes += (uint64_t)n;
    }
    close(fd);
    return rc;
}

int ka_tar_dir(const char *dir, ka_blob_writer_t *w, ka_layer_stats_t *st)
{
    ka_layer_stats_t local = {0};
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    s_paths_t paths = {0};
    s_link_t *links = NULL;
    size_t nlinks = 0;
    struct archive_entry *e = archive_entry_new();
    struct archive *a = archive_write_new();
    int rc = (!e || !a) ? -ENOMEM : s_collect(dir, "", &paths);
    if (rc < 0)
        goto out;
    if (paths.n)
        qsort(paths.v, paths.n, sizeof *paths.v, s_cmp);
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_none(a);
    if (archive_write_open(a, w, NULL, s_tar_write, NULL) != ARCHIVE_OK) {
        rc = ka_img_fail(-EIO, "tar: %s", archive_error_string(a));
        goto out;
    }
    for (size_t i = 0; rc == 0 && i < paths.n; i++) {
        char *full = ka_strfmt("%s/%s", dir, paths.v[i]);
        struct stat sb;
        if (!full) {
            rc = -ENOMEM;
            break;
        }
        if (lstat(full, &sb) < 0) {
            rc = ka_img_fail(-errno, "lstat %s: %s", full, strerror(errno));
            free(full);
            break;
        }
        archive_entry_clear(e);
        archive_entry_set_pathname(e, paths.v[i]);
        archive_entry_set_uid(e, sb.st_uid);
        archive_entry_set_gid(e, sb.st_gid);
        archive_entry_set_perm(e, sb.st_mode & 07777);
        archive_entry_set_mtime(e, 0, 0);
        bool data = false;
        if (S_ISDIR(sb.st_mode)) {
            archive_entry_set_filetype(e, AE_IFDIR);
        } else if (S_ISLNK(sb.st_mode)) {
            char target[4096];
            ssize_t n = readlink(full, target, sizeof target - 1);
            if (n < 0) {
                rc = ka_img_fail(-errno, "readlink %s: %s", full, strerror(errno));
                free(full);
                break;
            }
            target[n] = '\0';
            archive_entry_set_filetype(e, AE_IFLNK);
            archive_entry_set_symlink(e, target);
        } else if (S_ISREG(sb.st_mode)) {
            archive_entry_set_filetype(e, AE_IFREG);
            const char *first = NULL;
            if (sb.st_nlink > 1) {
                for (size_t k = 0; k < nlinks && !first; k++)
                    if (links[k].dev == sb.st_dev && links[k].ino == sb.st_ino)
                        first = links[k].path;
                if (!first) {
                    s_link_t *nl = realloc(links, (nlinks + 1) * sizeof *nl);
                    if (!nl) {
                        rc = -ENOMEM;
                        free(full);
                        break;
                    }
                    links = nl;
                    links[nlinks++] = (s_link_t){sb.st_dev, sb.st_ino, paths.v[i]};
                }
            }
            if (first) {
                archive_entry_set_hardlink(e, first);
                archive_entry_set_size(e, 0);
            } else {
                archive_entry_set_size(e, sb.st_size);
                data = true;
            }
        } else {
            st->skipped++; /* devices, fifos, sockets: not part of an image */
            free(full);
            continue;
        }
        st->entries++;
        if (archive_write_header(a, e) != ARCHIVE_OK)
            rc = ka_img_fail(-EIO, "tar header %s: %s", full, archive_error_string(a));
        else if (data)
            rc = s_tar_file(a, full, (uint64_t)sb.st_size, st);
        free(full);
    }
    if (rc == 0 && archive_write_close(a) != ARCHIVE_OK)
        rc = ka_img_fail(-EIO, "tar: %s", archive_error_string(a));
out:
    if (a)
        archive_write_free(a);
    if (e)
        archive_entry_free(e);
    for (size_t i = 0; i < paths.n; i++)
        free(paths.v[i]);
    free(paths.v);
    free(links);
    return rc;
}
