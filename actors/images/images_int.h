/*
 * images: private interfaces shared by the images module's sources (and its unit test).
 *
 * Errors follow the project rule (0 or a negative errno-style code); every failing function
 * also records a one-line message for the calling thread (ka_img_fail), which the public API
 * exposes through ka_images_last_error().
 */
#ifndef KA_IMAGES_INT_H
#define KA_IMAGES_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* "sha256:" + 64 lower-case hex + NUL */
#define KA_DIGEST_LEN    72
#define KA_DIGEST_PREFIX "sha256:"
#define KA_MAX_JSON_BYTES                                                                          \
    (4u << 20) /* manifests, configs and indexes larger than this are refused */

/* ---- errors ------------------------------------------------------------------------------ */

/* Records a formatted message for this thread and returns code (a negative errno). */
int ka_img_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last recorded message ("" if none). Borrowed, thread-local. */
const char *ka_img_last_error(void);
/* Clears the calling thread's message. */
void ka_img_clear_error(void);

/* ---- digests ----------------------------------------------------------------------------- */

/* True if d is exactly "sha256:" followed by 64 lower-case hex digits. */
bool ka_digest_valid(const char *d);
/* The hex part of a valid digest (borrowed pointer into d). */
const char *ka_digest_hex(const char *d);
/* Formats a raw 32-byte sha256 as "sha256:<hex>". */
void ka_digest_from_md(const unsigned char md[32], char out[KA_DIGEST_LEN]);
/* Writes "sha256:<hex>" of buf into out. */
void ka_sha256_buf(const void *buf, size_t len, char out[KA_DIGEST_LEN]);
/* Hashes a whole file. 0 or negative errno. */
int ka_sha256_file(const char *path, char out[KA_DIGEST_LEN], uint64_t *size_out);

/* ---- file system helpers ----------------------------------------------------------------- */

/* Removes path (file, symlink or whole tree) without following symlinks. Missing is fine. */
int ka_fs_rmtree(const char *path);
/* Same, relative to a directory fd. */
int ka_fs_rmtree_at(int dirfd, const char *name);
/* mkdir -p with mode 0755. */
int ka_fs_mkdir_p(const char *path);
/* Reads a whole small file (at most max bytes) into a NUL-terminated malloc'd buffer. */
int ka_fs_read_file(const char *path, size_t max, char **out, size_t *len_out);
/* Writes data to path atomically: temp file in the same dir, fsync, rename, fsync dir. */
int ka_fs_write_atomic(const char *path, const void *data, size_t len);
/* Creates a fresh private directory under parent from a prefix; *out is malloc'd. */
int ka_fs_mkdtemp(const char *parent, const char *prefix, char **out);
/* asprintf that returns NULL on failure. */
char *ka_strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- blob writer: a temp file plus a running sha256 --------------------------------------- */

typedef struct ka_blob_writer ka_blob_writer_t;

int ka_blob_writer_write(ka_blob_writer_t *w, const void *buf, size_t len);
/* Bytes written so far. */
uint64_t ka_blob_writer_size(const ka_blob_writer_t *w);
/* Closes and unlinks the temp file unless it was handed to a transaction. Idempotent. */
void ka_blob_writer_destroy(ka_blob_writer_t **w_p);

/* ---- blob transaction: verified temp blobs, renamed into the store all at once ------------ */

typedef struct ka_blob_txn ka_blob_txn_t;

/* root is the store root (<state>/images), which holds blobs/sha256 and tmp. */
ka_blob_txn_t *ka_blob_txn_new(const char *root);
/* Copies src (not a symlink) into a temp blob, hashing it. expect (may be NULL) must match the
 * digest and expect_size (-1 = any) the size, else -EBADMSG. digest_out (may be NULL) receives it.
 */
int ka_blob_txn_add_file(ka_blob_txn_t *t, const char *src, const char *expect, int64_t expect_size,
                         char *digest_out);
/* Same for a buffer. */
int ka_blob_txn_add_buf(ka_blob_txn_t *t, const void *buf, size_t len, const char *expect,
                        char *digest_out);
/* A new writer in the transaction's temp directory (NULL on failure). */
ka_blob_writer_t *ka_blob_txn_writer(ka_blob_txn_t *t);
/* Adopts a finished writer (consumes *w_p) after checking it against expect/expect_size. */
int ka_blob_txn_add_writer(ka_blob_txn_t *t, ka_blob_writer_t **w_p, const char *expect,
                           int64_t expect_size, char *digest_out);
/* Path holding the verified content of digest: the pending temp blob, or the stored blob.
 * malloc'd, NULL if neither exists. */
char *ka_blob_txn_path(ka_blob_txn_t *t, const char *digest);
/* True if the store already holds digest (its content was verified when stored). */
bool ka_blob_txn_stored(ka_blob_txn_t *t, const char *digest);
/* Renames every pending blob into blobs/sha256 and fsyncs the directory. */
int ka_blob_txn_commit(ka_blob_txn_t *t);
/* Removes uncommitted temp blobs and frees. Idempotent. */
void ka_blob_txn_destroy(ka_blob_txn_t **t_p);

/* ---- layers ------------------------------------------------------------------------------ */

typedef struct ka_layer_stats {
    uint64_t entries;   /* tar entries seen */
    uint64_t bytes;     /* file content bytes */
    uint64_t skipped;   /* device nodes, sockets: neutralised (not created) */
    bool has_whiteouts; /* a .wh.* entry is present */
} ka_layer_stats_t;

/*
 * Reads a whole layer blob (tar; gzip, zstd, xz, bzip2 decompressed automatically) and refuses
 * it (-EBADMSG) if it is unreadable or truncated, or an entry has an absolute path, a ".."
 * component, goes through a symlink of the same layer, or hard-links outside the layer. If
 * diff_id is given, the uncompressed stream must hash to it. Nothing is written.
 */
int ka_layer_check(const char *blob, const char *diff_id, ka_layer_stats_t *st);
/*
 * Unpacks a layer blob into dest (created; must not exist). Never writes through a symlink,
 * never creates device nodes; whiteout files are kept as plain files for ka_layer_apply.
 * Ownership, modes and mtimes are kept. On failure dest is removed.
 */
int ka_layer_unpack(const char *blob, const char *dest, ka_layer_stats_t *st);
/*
 * Applies an unpacked layer directory onto rootfs (OCI semantics): ".wh.NAME" removes NAME
 * below, ".wh..wh..opq" empties the directory below, other entries replace what is there.
 * Files are hard-linked from the layer (same file system), directories created.
 */
int ka_layer_apply(const char *layer_dir, const char *rootfs);
/*
 * Writes a deterministic uncompressed tar of dir (entries sorted by path, mtime 0, owner,
 * group and mode kept, hard links kept, device nodes/sockets skipped) into w.
 */
int ka_tar_dir(const char *dir, ka_blob_writer_t *w, ka_layer_stats_t *st);

/* ---- registry ---------------------------------------------------------------------------- */

/*
 * GETs <endpoint>/v2/<repo>/<kind>/<digest> (kind "manifests" or "blobs") into a temp blob of
 * t, verifying the digest. accept is the Accept header (NULL for none). Redirects followed.
 */
int ka_registry_fetch(ka_blob_txn_t *t, const char *endpoint, const char *repo, const char *kind,
                      const char *digest, const char *accept, uint64_t max_bytes);

#endif /* KA_IMAGES_INT_H */
