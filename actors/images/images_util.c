/*
 * images_util: errors, sha256 digests, file-system helpers, blob writers and blob transactions
 * for the images module. See images_int.h for the contracts.
 */
#include "images_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

/* ---- errors ------------------------------------------------------------------------------ */

static __thread char s_err[512];

int ka_img_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_err, sizeof s_err, fmt, ap);
    va_end(ap);
    return code;
}

const char *ka_img_last_error(void)
{
    return s_err;
}

void ka_img_clear_error(void)
{
    s_err[0] = '\0';
}

char *ka_strfmt(const char *fmt, ...)
{
    va_list ap;
    char *out = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&out, fmt, ap);
    va_end(ap);
    return n < 0 ? NULL : out;
}

/* ---- digests ----------------------------------------------------------------------------- */

bool ka_digest_valid(const char *d)
{
    if (!d || strncmp(d, KA_DIGEST_PREFIX, 7) != 0)
        return false;
    const char *h = d + 7;
    for (int i = 0; i < 64; i++) {
        char c = h[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return h[64] == '\0';
}

const char *ka_digest_hex(const char *d)
{
    return d + 7;
}

void ka_digest_from_md(const unsigned char md[32], char out[KA_DIGEST_LEN])
{
    static const char hex[] = "0123456789abcdef";
    memcpy(out, KA_DIGEST_PREFIX, 7);
    for (int i = 0; i < 32; i++) {
        out[7 + 2 * i] = hex[md[i] >> 4];
        out[8 + 2 * i] = hex[md[i] & 15];
    }
    out[71] = '\0';
}

void ka_sha256_buf(const void *buf, size_t len, char out[KA_DIGEST_LEN])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL);
    ka_digest_from_md(md, out);
}

int ka_sha256_file(const char *path, char out[KA_DIGEST_LEN], uint64_t *size_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ka_img_fail(-errno, "cannot open %s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) {
        close(fd);
        return ka_img_fail(-ENOMEM, "out of memory");
    }
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    static __thread unsigned char buf[1 << 16];
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = ka_img_fail(-errno, "read %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        EVP_DigestUpdate(ctx, buf, (size_t)n);
        total += (uint64_t)n;
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    EVP_MD_CTX_free(ctx);
    close(fd);
    if (rc == 0) {
        ka_digest_from_md(md, out);
        if (size_out)
            *size_out = total;
    }
    return rc;
}

/* ---- file system ------------------------------------------------------------------------- */

int ka_fs_rmtree_at(int dfd, const char *name)
{
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        int r = ka_fs_rmtree_at(dirfd(d), de->d_name);
        if (r < 0 && rc == 0)
            rc = r;
    }
    closedir(d);
    if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && rc == 0)
        rc = -errno;
    return rc;
}

int ka_fs_rmtree(const char *path)
{
    return ka_fs_rmtree_at(AT_FDCWD, path);
}

int ka_fs_mkdir_p(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                rc = ka_img_fail(-errno, "mkdir %s: %s", p, strerror(errno));
                break;
            }
            *s = c;
            if (c == '\0')
                break;
        }
    }
    free(p);
    return rc;
}

/* fsync a directory (after renames into it). */
static int s_fs_fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

int ka_fs_read_file(const char *path, size_t max, char **out, size_t *len_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ka_img_fail(-errno, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ka_img_fail(-EINVAL, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ka_img_fail(-EFBIG, "%s is too large (%lld bytes, limit %zu)", path,
                           (long long)st.st_size, max);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return ka_img_fail(-ENOMEM, "out of memory");
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    if (len_out)
        *len_out = got;
    return 0;
}

static int s_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int ka_fs_write_atomic(const char *path, const void *data, size_t len)
{
    char *tmp = ka_strfmt("%s.tmp.XXXXXX", path);
    if (!tmp)
        return -ENOMEM;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int rc = ka_img_fail(-errno, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    int rc = s_write_all(fd, data, len);
    if (rc == 0 && fchmod(fd, 0644) < 0)
        rc = -errno;
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    close(fd);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0) {
        unlink(tmp);
        free(tmp);
        return ka_img_fail(rc, "cannot write %s: %s", path, strerror(-rc));
    }
    free(tmp);
    char *dir = strdup(path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = '\0';
            s_fs_fsync_dir(dir);
        }
        free(dir);
    }
    return 0;
}

int ka_fs_mkdtemp(const char *parent, const char *prefix, char **out)
{
    char *p = ka_strfmt("%s/%s.XXXXXX", parent, prefix);
    if (!p)
        return -ENOMEM;
    if (!mkdtemp(p)) {
        int rc =
            ka_img_fail(-errno, "cannot create a directory in %s: %s", parent, strerror(errno));
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* ---- blob writer ------------------------------------------------------------------------- */

struct ka_blob_writer {
    int fd;         /* -1 once finished */
    char *path;     /* temp file; NULL once handed to a transaction */
    EVP_MD_CTX *md; /* running sha256 */
    uint64_t size;  /* bytes written */
    bool finished;  /* s_blob_writer_finish ran */
    char digest[KA_DIGEST_LEN];
};

/* Opens a new temp file in tmp_dir. NULL on failure (message recorded). */
static ka_blob_writer_t *s_blob_writer_new(const char *tmp_dir)
{
    ka_blob_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->fd = -1;
    w->path = ka_strfmt("%s/blob.XXXXXX", tmp_dir);
    w->md = EVP_MD_CTX_new();
    if (!w->path || !w->md)
        goto fail;
    w->fd = mkostemp(w->path, O_CLOEXEC);
    if (w->fd < 0) {
        ka_img_fail(-errno, "cannot create a temp file in %s: %s", tmp_dir, strerror(errno));
        free(w->path);
        w->path = NULL;
        goto fail;
    }
    EVP_DigestInit_ex(w->md, EVP_sha256(), NULL);
    return w;
fail:
    ka_blob_writer_destroy(&w);
    return NULL;
}

int ka_blob_writer_write(ka_blob_writer_t *w, const void *buf, size_t len)
{
    if (w->finished)
        return -EINVAL;
    int rc = s_write_all(w->fd, buf, len);
    if (rc < 0)
        return ka_img_fail(rc, "write %s: %s", w->path, strerror(-rc));
    EVP_DigestUpdate(w->md, buf, len);
    w->size += len;
    return 0;
}

uint64_t ka_blob_writer_size(const ka_blob_writer_t *w)
{
    return w->size;
}

/* Flushes, fsyncs and closes the file; fills the digest. No more writes after this. */
static int s_blob_writer_finish(ka_blob_writer_t *w, char digest[KA_DIGEST_LEN])
{
    if (!w->finished) {
        unsigned char md[32];
        unsigned int mdlen = 0;
        EVP_DigestFinal_ex(w->md, md, &mdlen);
        ka_digest_from_md(md, w->digest);
        int rc = 0;
        if (fchmod(w->fd, 0644) < 0 || fsync(w->fd) < 0)
            rc = -errno;
        close(w->fd);
        w->fd = -1;
        w->finished = true;
        if (rc < 0)
            return ka_img_fail(rc, "fsync %s: %s", w->path, strerror(-rc));
    }
    if (digest)
        memcpy(digest, w->digest, KA_DIGEST_LEN);
    return 0;
}

void ka_blob_writer_destroy(ka_blob_writer_t **w_p)
{
    if (!w_p || !*w_p)
        return;
    ka_blob_writer_t *w = *w_p;
    if (w->fd >= 0)
        close(w->fd);
    if (w->path) {
        unlink(w->path);
        free(w->path);
    }
    EVP_MD_CTX_free(w->md);
    free(w);
    *w_p = NULL;
}

/* ---- blob transaction -------------------------------------------------------------------- */

typedef struct s_pending {
    char digest[KA_DIGEST_LEN];
    char *tmp; /* temp file holding the verified content */
} s_pending_t;

struct ka_blob_txn {
    char *root;     /* store root */
    char *tmp_dir;  /* <root>/tmp */
    char *blob_dir; /* <root>/blobs/sha256 */
    s_pending_t *items;
    size_t n, cap;
};

ka_blob_txn_t *ka_blob_txn_new(const char *root)
{
    ka_blob_txn_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->root = strdup(root);
    t->tmp_dir = ka_strfmt("%s/tmp", root);
    t->blob_dir = ka_strfmt("%s/blobs/sha256", root);
    if (!t->root || !t->tmp_dir || !t->blob_dir) {
        ka_blob_txn_destroy(&t);
        return NULL;
    }
    return t;
}

static s_pending_t *s_find(ka_blob_txn_t *t, const char *digest)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->items[i].digest, digest))
            return &t->items[i];
    return NULL;
}

int ka_blob_txn_add_writer(ka_blob_txn_t *t, ka_blob_writer_t **w_p, const char *expect,
                           int64_t expect_size, char *digest_out)
{
    ka_blob_writer_t *w = *w_p;
    char d[KA_DIGEST_LEN];
    int rc = s_blob_writer_finish(w, d);
    if (rc < 0)
        goto out;
    if (expect && strcmp(expect, d) != 0) {
        rc = ka_img_fail(-EBADMSG, "digest mismatch: expected %s, content hashes to %s", expect, d);
        goto out;
    }
    if (expect_size >= 0 && (uint64_t)expect_size != w->size) {
        rc = ka_img_fail(-EBADMSG, "size mismatch for %s: expected %lld bytes, got %llu", d,
                         (long long)expect_size, (unsigned long long)w->size);
        goto out;
    }
    if (digest_out)
        memcpy(digest_out, d, KA_DIGEST_LEN);
    if (s_find(t, d))
        goto out; /* already pending: drop this copy */
    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 8;
        s_pending_t *n = realloc(t->items, ncap * sizeof *n);
        if (!n) {
            rc = ka_img_fail(-ENOMEM, "out of memory");
            goto out;
        }
        t->items = n;
        t->cap = ncap;
    }
    memcpy(t->items[t->n].digest, d, KA_DIGEST_LEN);
    t->items[t->n].tmp = w->path;
    t->n++;
    w->path = NULL; /* the transaction owns the temp file now */
out:
    ka_blob_writer_destroy(w_p);
    return rc;
}

int ka_blob_txn_add_file(ka_blob_txn_t *t, const char *src, const char *expect, int64_t expect_size,
                         char *digest_out)
{
    int fd = open(src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC); /* no symlinked blobs */
    if (fd < 0)
        return ka_img_fail(-errno, "cannot open %s: %s", src, strerror(errno));
    ka_blob_writer_t *w = ka_blob_txn_writer(t);
    if (!w) {
        close(fd);
        return -EIO;
    }
    static __thread char buf[1 << 16];
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = ka_img_fail(-errno, "read %s: %s", src, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        rc = ka_blob_writer_write(w, buf, (size_t)n);
        if (rc < 0)
            break;
        if (expect_size >= 0 && w->size > (uint64_t)expect_size) {
            rc = ka_img_fail(-EBADMSG, "%s is larger than its descriptor says (%lld bytes)", src,
                             (long long)expect_size);
            break;
        }
    }
    close(fd);
    if (rc < 0) {
        ka_blob_writer_destroy(&w);
        return rc;
    }
    rc = ka_blob_txn_add_writer(t, &w, expect, expect_size, digest_out);
    if (rc == -EBADMSG) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ka_img_last_error());
        ka_img_fail(rc, "%s: %s", src, msg);
    }
    return rc;
}

int ka_blob_txn_add_buf(ka_blob_txn_t *t, const void *buf, size_t len, const char *expect,
                        char *digest_out)
{
    ka_blob_writer_t *w = ka_blob_txn_writer(t);
    if (!w)
        return -EIO;
    int rc = ka_blob_writer_write(w, buf, len);
    if (rc < 0) {
        ka_blob_writer_destroy(&w);
        return rc;
    }
    return ka_blob_txn_add_writer(t, &w, expect, -1, digest_out);
}

ka_blob_writer_t *ka_blob_txn_writer(ka_blob_txn_t *t)
{
    if (ka_fs_mkdir_p(t->tmp_dir) < 0)
        return NULL;
    return s_blob_writer_new(t->tmp_dir);
}

bool ka_blob_txn_stored(ka_blob_txn_t *t, const char *digest)
{
    char *p = ka_strfmt("%s/%s", t->blob_dir, ka_digest_hex(digest));
    struct stat st;
    bool ok = p && lstat(p, &st) == 0 && S_ISREG(st.st_mode);
    free(p);
    return ok;
}

char *ka_blob_txn_path(ka_blob_txn_t *t, const char *digest)
{
    s_pending_t *p = s_find(t, digest);
    if (p)
        return strdup(p->tmp);
    if (ka_blob_txn_stored(t, digest))
        return ka_strfmt("%s/%s", t->blob_dir, ka_digest_hex(digest));
    return NULL;
}

int ka_blob_txn_commit(ka_blob_txn_t *t)
{
    int rc = ka_fs_mkdir_p(t->blob_dir);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < t->n; i++) {
        char *dst = ka_strfmt("%s/%s", t->blob_dir, ka_digest_hex(t->items[i].digest));
        if (!dst)
            return -ENOMEM;
        if (rename(t->items[i].tmp, dst) < 0) {
            rc = ka_img_fail(-errno, "cannot store %s: %s", dst, strerror(errno));
            free(dst);
            return rc;
        }
        free(dst);
        free(t->items[i].tmp);
        t->items[i].tmp = NULL;
    }
    t->n = 0;
    return s_fs_fsync_dir(t->blob_dir);
}

void ka_blob_txn_destroy(ka_blob_txn_t **t_p)
{
    if (!t_p || !*t_p)
        return;
    ka_blob_txn_t *t = *t_p;
    for (size_t i = 0; i < t->n; i++) {
        if (t->items[i].tmp) {
            unlink(t->items[i].tmp);
            free(t->items[i].tmp);
        }
    }
    free(t->items);
    free(t->root);
    free(t->tmp_dir);
    free(t->blob_dir);
    free(t);
    *t_p = NULL;
}
