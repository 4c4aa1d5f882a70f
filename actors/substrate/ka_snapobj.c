/* ka_snapobj: snapshots in object storage, referenced by a manifest (ka_snapobj.h). */
#include "ka_snapobj.h"
#include "ka_objstore.h"
#include "ka_snapshot.h"
#include "krt.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define S_MANIFEST     "manifest.json"
#define S_MANIFEST_CAP (16u << 10)
#define S_KEY_CAP      256

typedef struct s_manifest {
    char object[S_KEY_CAP]; /* relative to the location's prefix */
    char sha256[65];
    json_int_t archive_bytes;
} s_manifest_t;

static void s_msg(char *err, size_t cap, const char *what, const char *detail)
{
    if (err && cap)
        snprintf(err, cap, "%s: %s", what, detail);
}

static ka_objstore_t *s_open(const char *location, const ka_tree_opts_t *o, char *err, size_t cap)
{
    ka_objstore_opts_t oo = {.deadline_ms = o->deadline_ms};
    return ka_objstore_new(location, &oo, err, cap);
}

/* Reads and checks the manifest of sandbox id: 0, -ENOENT (none), or an error. */
static int s_read_manifest(ka_objstore_t *os, const char *id, s_manifest_t *m, char *err,
                           size_t cap)
{
    char key[S_KEY_CAP], *text = malloc(S_MANIFEST_CAP);
    if (!text)
        return -ENOMEM;
    snprintf(key, sizeof key, "%s/%s", id, S_MANIFEST);
    int rc = ka_objstore_get_small(os, key, text, S_MANIFEST_CAP);
    if (rc) {
        if (rc != -ENOENT)
            s_msg(err, cap, "reading the snapshot manifest failed", ka_objstore_error(os));
        free(text);
        return rc;
    }
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    free(text);
    const char *fmt = NULL, *sbx = NULL, *obj = NULL, *sha = NULL;
    json_int_t n = -1;
    char own[S_KEY_CAP];
    snprintf(own, sizeof own, "%s/", id);
    if (!j ||
        json_unpack(j, "{s:s, s:s, s:s, s:s, s:I}", "format", &fmt, "sandbox", &sbx, "object", &obj,
                    "sha256", &sha, "archiveBytes", &n) ||
        strcmp(fmt, KA_SNAPOBJ_FORMAT) != 0 || strcmp(sbx, id) != 0 ||
        strncmp(obj, own, strlen(own)) != 0 || strchr(obj + strlen(own), '/') ||
        strlen(obj) >= sizeof m->object || strlen(sha) != 64 || n < 0) {
        s_msg(err, cap, "the snapshot manifest is malformed or names another sandbox", key);
        json_decref(j);
        return -EBADMSG;
    }
    snprintf(m->object, sizeof m->object, "%s", obj);
    snprintf(m->sha256, sizeof m->sha256, "%s", sha);
    m->archive_bytes = n;
    json_decref(j);
    return 0;
}

static int s_write_manifest(ka_objstore_t *os, const char *id, const char *revision,
                            const char *object, const ka_snapshot_info_t *in)
{
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I, s:I, s:I}", "format", KA_SNAPOBJ_FORMAT,
        "sandbox", id, "revision", revision ? revision : "", "object", object, "archiveBytes",
        (json_int_t)in->archive_bytes, "sha256", in->sha256, "files", (json_int_t)in->tree.files,
        "dirs", (json_int_t)in->tree.dirs, "symlinks", (json_int_t)in->tree.symlinks, "bytes",
        (json_int_t)in->tree.bytes, "createdMs", (json_int_t)krt_wall_ms());
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text)
        return -ENOMEM;
    char key[S_KEY_CAP];
    snprintf(key, sizeof key, "%s/%s", id, S_MANIFEST);
    int rc = ka_objstore_put(os, key, text, strlen(text));
    free(text);
    return rc;
}

typedef struct s_up {
    ka_os_upload_t *u;
    int rc; /* the upload's failure, if it is what stopped the archive */
} s_up_t;

static int s_upload_sink(void *user, const void *buf, size_t n)
{
    s_up_t *up = user;
    return up->rc = ka_os_upload_write(up->u, buf, n);
}

int ka_snapobj_save(const char *location, const char *id, const char *revision, const char *dir,
                    const ka_tree_opts_t *o, ka_tree_stats_t *st, char *err, size_t cap)
{
    if (st)
        *st = (ka_tree_stats_t){0};
    ka_objstore_t *os = s_open(location, o, err, cap);
    if (!os)
        return -EINVAL;
    s_manifest_t old = {0};
    int rc = s_read_manifest(os, id, &old, err, cap), had = rc == 0;
    if (rc == -ENOENT || rc == -EBADMSG) /* nothing usable to replace */
        rc = 0;
    uint32_t rnd = 0;
    if (!rc && getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rc = -errno;
    char object[S_KEY_CAP];
    snprintf(object, sizeof object, "%s/%lld-%08x.tar.zst", id, (long long)krt_wall_ms(), rnd);
    s_up_t up = {rc ? NULL : ka_os_upload_new(os, object), 0};
    ka_snapshot_info_t info = {0};
    char why[KA_SNAPSHOT_ERR_CAP] = "";
    if (!rc && !up.u)
        rc = -ENOMEM;
    if (!rc && (rc = ka_snapshot_write(dir, o, s_upload_sink, &up, &info, why, sizeof why))) {
        if (up.rc)
            s_msg(err, cap, "uploading the snapshot failed", ka_objstore_error(os));
        else
            s_msg(err, cap, "archiving /data failed", why);
        ka_os_upload_abort(&up.u);
    }
    if (!rc && (rc = ka_os_upload_finish(&up.u)))
        s_msg(err, cap, "uploading the snapshot failed", ka_objstore_error(os));
    if (!rc && (rc = s_write_manifest(os, id, revision, object, &info))) {
        s_msg(err, cap, "writing the snapshot manifest failed", ka_objstore_error(os));
        ka_objstore_delete(os, object); /* unreferenced: best effort */
    }
    if (!rc && had && strcmp(old.object, object) != 0 && ka_objstore_delete(os, old.object))
        krt_log(KRT_LOG_WARN, "snapshots", "snapshot_old_object_kept", "sandbox=%s object=%s %s",
                id, old.object, ka_objstore_error(os));
    if (!rc)
        krt_log(KRT_LOG_INFO, "snapshots", "snapshot_saved",
                "sandbox=%s object=%s bytes=%llu archive_bytes=%llu", id, object,
                (unsigned long long)info.tree.bytes, (unsigned long long)info.archive_bytes);
    if (st)
        *st = info.tree;
    ka_objstore_destroy(&os);
    return rc;
}

/* ---- restore: the download runs on its own thread into a ring the archive reader reads ---- */

/* Bytes between the download and the unpack: enough to carry the download through the unpack's
 * pauses (a file's writes), small enough to stay in the caches. The reader waits for S_TAKE_MIN
 * of them (or the end), so it wakes once per that many, not per network read. */
#define S_RING     (1u << 20)
#define S_TAKE_MIN (S_RING / 4)

/* The download's thread copies what arrives into the ring; the reader unpacks from the ring
 * itself (no copy, no system call while neither waits). Under lock: head, len, lent, done,
 * closed, rc; the bytes of [head, head + len) belong to the reader, the rest to the writer. */
typedef struct s_fetch {
    ka_objstore_t *os;
    const char *key;
    pthread_mutex_t lock;
    pthread_cond_t moved; /* bytes were added or taken, or a side ended */
    char *ring;           /* S_RING bytes */
    size_t head, len;     /* the unread bytes: len of them from head (wrapping) */
    size_t lent;          /* of those, what the reader holds since its last take */
    bool done;            /* the download ended, with rc */
    bool closed;          /* the reader stopped: the download ends with -EPIPE */
    int rc;
    uint64_t bytes;
} s_fetch_t;

static int s_ring_init(s_fetch_t *f)
{
    if (!(f->ring = malloc(S_RING)))
        return -ENOMEM;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->moved, NULL);
    return 0;
}

static void s_ring_free(s_fetch_t *f)
{
    pthread_cond_destroy(&f->moved);
    pthread_mutex_destroy(&f->lock);
    free(f->ring);
    f->ring = NULL;
}

/* The download's sink: waits for room while the ring is full. */
static int s_ring_put(void *user, const void *buf, size_t n)
{
    s_fetch_t *f = user;
    const char *p = buf;
    pthread_mutex_lock(&f->lock);
    while (n) {
        while (f->len == S_RING && !f->closed)
            pthread_cond_wait(&f->moved, &f->lock);
        if (f->closed)
            break;
        size_t tail = (f->head + f->len) % S_RING, room = S_RING - f->len;
        size_t k = n < room ? n : room;
        k = k < S_RING - tail ? k : S_RING - tail; /* up to the ring's end, then from its start */
        pthread_mutex_unlock(&f->lock); /* the writer's bytes: nobody else touches them */
        memcpy(f->ring + tail, p, k);
        pthread_mutex_lock(&f->lock);
        bool wake = f->len < S_TAKE_MIN && f->len + k >= S_TAKE_MIN; /* the reader may wait */
        f->len += k;
        p += k;
        n -= k;
        if (wake)
            pthread_cond_signal(&f->moved);
    }
    bool closed = f->closed;
    pthread_mutex_unlock(&f->lock);
    return closed ? -EPIPE : 0;
}

/* The reader's source: gives back what the last take lent, then lends the next contiguous
 * bytes, waiting for S_TAKE_MIN of them or the end; 0 once the download ended and all was
 * read (its failure, if any, is the result). */
static ssize_t s_ring_take(void *user, const void **buf)
{
    s_fetch_t *f = user;
    pthread_mutex_lock(&f->lock);
    bool was_full = f->len == S_RING;
    f->head = (f->head + f->lent) % S_RING;
    f->len -= f->lent;
    f->lent = 0;
    if (was_full && f->len < S_RING)
        pthread_cond_signal(&f->moved);
    while (f->len < S_TAKE_MIN && !f->done)
        pthread_cond_wait(&f->moved, &f->lock);
    ssize_t n = f->len == 0 ? f->rc : 0;
    if (f->len) {
        size_t k = f->len < S_RING - f->head ? f->len : S_RING - f->head;
        f->lent = k;
        *buf = f->ring + f->head;
        n = (ssize_t)k;
    }
    pthread_mutex_unlock(&f->lock);
    return n;
}

/* The download ended with rc: the reader takes what is left, then rc. */
static void s_ring_end(s_fetch_t *f, int rc)
{
    pthread_mutex_lock(&f->lock);
    f->rc = rc;
    f->done = true;
    pthread_cond_signal(&f->moved);
    pthread_mutex_unlock(&f->lock);
}

static void *s_fetch_run(void *arg)
{
    s_fetch_t *f = arg;
    s_ring_end(f, ka_objstore_get(f->os, f->key, s_ring_put, f, &f->bytes));
    return NULL;
}

/* The reader is done (it stopped or read the end): a download still running ends on EPIPE. */
static void s_ring_close(s_fetch_t *f)
{
    pthread_mutex_lock(&f->lock);
    f->closed = true;
    pthread_cond_signal(&f->moved);
    pthread_mutex_unlock(&f->lock);
}

static int s_stream_restore(ka_objstore_t *os, const s_manifest_t *m, const char *dir,
                            const ka_tree_opts_t *o, ka_tree_stats_t *st, char *err, size_t cap)
{
    s_fetch_t f = {.os = os, .key = m->object};
    if (s_ring_init(&f))
        return -ENOMEM;
    pthread_t t;
    int rc = -pthread_create(&t, NULL, s_fetch_run, &f);
    ka_snapshot_info_t info = {0};
    char why[KA_SNAPSHOT_ERR_CAP] = "";
    if (!rc) {
        rc = ka_snapshot_read_from(dir, s_ring_take, &f, o, &info, why, sizeof why);
        s_ring_close(&f);
        pthread_join(t, NULL);
    }
    s_ring_free(&f);
    if (st)
        *st = info.tree;
    if (f.rc && f.rc != -EPIPE) { /* the storage's failure explains the reader's */
        s_msg(err, cap, "downloading the snapshot failed", ka_objstore_error(os));
        return f.rc;
    }
    if (rc) {
        s_msg(err, cap, "restoring the snapshot archive failed", why[0] ? why : strerror(-rc));
        return rc;
    }
    if (info.archive_bytes != (uint64_t)m->archive_bytes || strcmp(info.sha256, m->sha256) != 0) {
        s_msg(err, cap, "the downloaded snapshot does not match its manifest's size and sha256",
              m->object);
        return -EBADMSG;
    }
    return 0;
}

int ka_snapobj_restore(const char *location, const char *id, const char *dir,
                       const ka_tree_opts_t *o, ka_tree_stats_t *st, char *err, size_t cap)
{
    if (st)
        *st = (ka_tree_stats_t){0};
    ka_objstore_t *os = s_open(location, o, err, cap);
    if (!os)
        return -EINVAL;
    s_manifest_t m;
    int rc = s_read_manifest(os, id, &m, err, cap);
    if (rc == -ENOENT)
        s_msg(err, cap, "no snapshot of this sandbox in object storage", location);
    if (!rc)
        rc = s_stream_restore(os, &m, dir, o, st, err, cap);
    ka_objstore_destroy(&os);
    return rc;
}

/* ---- remove ------------------------------------------------------------------------------ */

typedef struct s_keys {
    char **v;
    size_t n;
} s_keys_t;

static int s_collect(void *user, const char *key)
{
    s_keys_t *k = user;
    char **v = realloc(k->v, (k->n + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    k->v = v;
    return (v[k->n] = strdup(key)) ? (k->n++, 0) : -ENOMEM;
}

int ka_snapobj_remove(const char *location, const char *id, const ka_tree_opts_t *o, char *err,
                      size_t cap)
{
    ka_objstore_t *os = s_open(location, o, err, cap);
    if (!os)
        return -EINVAL;
    char prefix[S_KEY_CAP];
    snprintf(prefix, sizeof prefix, "%s/", id);
    s_keys_t k = {0};
    char manifest[S_KEY_CAP];
    snprintf(manifest, sizeof manifest, "%.100s%s", prefix, S_MANIFEST);
    int rc = ka_objstore_list(os, prefix, s_collect, &k);
    if (!rc) /* the reference first: what remains a moment is never named */
        rc = ka_objstore_delete(os, manifest);
    for (size_t i = 0; !rc && i < k.n; i++)
        if (strcmp(k.v[i], manifest) != 0)
            rc = ka_objstore_delete(os, k.v[i]);
    if (rc)
        s_msg(err, cap, "removing the snapshot objects failed", ka_objstore_error(os));
    for (size_t i = 0; i < k.n; i++)
        free(k.v[i]);
    free(k.v);
    ka_objstore_destroy(&os);
    return rc;
}
