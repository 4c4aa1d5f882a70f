/*
 * images: the content store, its index, import, build, pull, removal and prepared root file
 * systems. Contracts in images.h; internals in images_int.h.
 */
#include "images.h"
#include "images_int.h"

#include "krt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define S_REF_NAME        "org.opencontainers.image.ref.name"
#define S_MT_OCI_MAN      "application/vnd.oci.image.manifest.v1+json"
#define S_MT_OCI_INDEX    "application/vnd.oci.image.index.v1+json"
#define S_MT_OCI_CONFIG   "application/vnd.oci.image.config.v1+json"
#define S_MT_OCI_TAR      "application/vnd.oci.image.layer.v1.tar"
#define S_MT_DOCKER_MAN   "application/vnd.docker.distribution.manifest.v2+json"
#define S_MT_DOCKER_LIST  "application/vnd.docker.distribution.manifest.list.v2+json"
#define S_ACCEPT          S_MT_OCI_MAN ", " S_MT_DOCKER_MAN ", " S_MT_OCI_INDEX ", " S_MT_DOCKER_LIST
#define S_MAX_LAYER_BYTES (64ull << 30)
#define S_LOG             "images"

struct ka_images {
    char *root;        /* <state_dir>/images */
    char **mirror_reg; /* registry names of the mirror map */
    char **mirror_url; /* their endpoints */
    size_t n_mirrors;
};

const char *ka_images_last_error(void)
{
    return ka_img_last_error();
}

const char *ka_images_root(const ka_images_t *self)
{
    return self->root;
}

/* ---- handle ------------------------------------------------------------------------------ */

ka_images_t *ka_images_new(const ka_images_opts_t *opts)
{
    ka_img_clear_error();
    if (!opts || !opts->state_dir || !opts->state_dir[0]) {
        ka_img_fail(-EINVAL, "images: a state directory is required");
        return NULL;
    }
    ka_images_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->root = ka_strfmt("%s/images", opts->state_dir);
    self->mirror_reg = calloc(opts->n_mirrors + 1, sizeof(char *));
    self->mirror_url = calloc(opts->n_mirrors + 1, sizeof(char *));
    if (!self->root || !self->mirror_reg || !self->mirror_url)
        goto fail;
    for (size_t i = 0; i < opts->n_mirrors; i++) {
        const char *m = opts->mirrors[i];
        const char *eq = m ? strchr(m, '=') : NULL;
        if (!eq || eq == m || !eq[1]) {
            ka_img_fail(-EINVAL, "bad mirror '%s': expected REGISTRY=URL", m ? m : "(null)");
            goto fail;
        }
        self->mirror_reg[i] = strndup(m, (size_t)(eq - m));
        self->mirror_url[i] = strdup(eq + 1);
        self->n_mirrors++;
        if (!self->mirror_reg[i] || !self->mirror_url[i])
            goto fail;
    }
    static const char *const subdirs[] = {"blobs/sha256", "layers", "rootfs", "tmp"};
    for (size_t i = 0; i < sizeof subdirs / sizeof *subdirs; i++) {
        char *p = ka_strfmt("%s/%s", self->root, subdirs[i]);
        int rc = p ? ka_fs_mkdir_p(p) : -ENOMEM;
        free(p);
        if (rc < 0)
            goto fail;
    }
    /* Layer caches hold images' setuid files and devices-to-be: only the node may reach them
     * (an overlay mount made by the node reads its lower layers with the mounter's rights). */
    if (chmod(self->root, 0700) < 0) {
        ka_img_fail(-errno, "chmod %s: %s", self->root, strerror(errno));
        goto fail;
    }
    char *layout = ka_strfmt("%s/oci-layout", self->root);
    struct stat st;
    int rc = 0;
    if (layout && stat(layout, &st) < 0) {
        static const char body[] = "{\"imageLayoutVersion\":\"1.0.0\"}";
        rc = ka_fs_write_atomic(layout, body, sizeof body - 1);
    }
    free(layout);
    if (rc < 0)
        goto fail;
    return self;
fail:
    ka_images_destroy(&self);
    return NULL;
}

void ka_images_destroy(ka_images_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ka_images_t *self = *self_p;
    for (size_t i = 0; i < self->n_mirrors; i++) {
        free(self->mirror_reg[i]);
        free(self->mirror_url[i]);
    }
    free(self->mirror_reg);
    free(self->mirror_url);
    free(self->root);
    free(self);
    *self_p = NULL;
}

/* ---- lock and index ---------------------------------------------------------------------- */

/* Takes the store lock (LOCK_SH or LOCK_EX); returns the fd to pass to s_unlock. */
static int s_lock(ka_images_t *self, int op)
{
    char *p = ka_strfmt("%s/lock", self->root);
    if (!p)
        return -ENOMEM;
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    free(p);
    if (fd < 0)
        return ka_img_fail(-errno, "cannot open the store lock: %s", strerror(errno));
    while (flock(fd, op) < 0) {
        if (errno != EINTR) {
            int rc = ka_img_fail(-errno, "cannot lock the store: %s", strerror(errno));
            close(fd);
            return rc;
        }
    }
    return fd;
}

static void s_unlock(int fd)
{
    if (fd >= 0)
        close(fd);
}

/* Loads index.json (an empty index if absent). */
static int s_index_load(ka_images_t *self, json_t **out)
{
    char *p = ka_strfmt("%s/index.json", self->root);
    if (!p)
        return -ENOMEM;
    struct stat st;
    json_t *idx = NULL;
    if (stat(p, &st) < 0 && errno == ENOENT) {
        idx = json_pack("{s:i, s:s, s:[]}", "schemaVersion", 2, "mediaType", S_MT_OCI_INDEX,
                        "manifests");
    } else {
        json_error_t je;
        idx = json_load_file(p, 0, &je);
        if (!idx)
            ka_img_fail(-EIO, "cannot read %s: %s", p, je.text);
    }
    free(p);
    if (!idx)
        return -EIO;
    if (!json_is_array(json_object_get(idx, "manifests"))) {
        json_decref(idx);
        return ka_img_fail(-EIO, "the store index has no manifests array");
    }
    *out = idx;
    return 0;
}

static int s_index_save(ka_images_t *self, json_t *idx)
{
    char *body = json_dumps(idx, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    char *p = ka_strfmt("%s/index.json", self->root);
    int rc = (body && p) ? ka_fs_write_atomic(p, body, strlen(body)) : -ENOMEM;
    free(body);
    free(p);
    return rc;
}

static const char *s_entry_name(json_t *entry)
{
    const char *n =
        json_string_value(json_object_get(json_object_get(entry, "annotations"), S_REF_NAME));
    return n ? n : "";
}

static const char *s_entry_digest(json_t *entry)
{
    const char *d = json_string_value(json_object_get(entry, "digest"));
    return d ? d : "";
}

/* One image to add to the index. */
typedef struct s_result {
    char *name; /* "" for none */
    char digest[KA_DIGEST_LEN];
    int64_t size;
    char media[96];
} s_result_t;

/* Adds r to the index: a name moves to the new digest; an unnamed digest is added once. */
static int s_index_add(json_t *idx, const s_result_t *r)
{
    json_t *arr = json_object_get(idx, "manifests");
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        bool same_digest = !strcmp(s_entry_digest(e), r->digest);
        if (r->name[0] && !strcmp(s_entry_name(e), r->name)) {
            json_array_remove(arr, i);
            break;
        }
        if (!r->name[0] && same_digest)
            return 0;
    }
    json_t *d = json_pack("{s:s, s:s, s:I}", "mediaType", r->media, "digest", r->digest, "size",
                          (json_int_t)r->size);
    if (!d)
        return -ENOMEM;
    if (r->name[0])
        json_object_set_new(d, "annotations", json_pack("{s:s}", S_REF_NAME, r->name));
    return json_array_append_new(arr, d) == 0 ? 0 : -ENOMEM;
}

/* Finds the manifest digest for ref in idx; -ENOENT if absent. */
static int s_index_find(json_t *idx, const char *ref, char digest[KA_DIGEST_LEN])
{
    const char *want_digest = NULL;
    const char *at = strrchr(ref, '@');
    if (at)
        want_digest = at + 1;
    else if (!strncmp(ref, KA_DIGEST_PREFIX, 7))
        want_digest = ref;
    if (want_digest && !ka_digest_valid(want_digest))
        return ka_img_fail(-EINVAL, "'%s' is not a valid sha256 digest", want_digest);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(idx, "manifests"), i, e)
    {
        if (want_digest ? !strcmp(s_entry_digest(e), want_digest) : !strcmp(s_entry_name(e), ref)) {
            snprintf(digest, KA_DIGEST_LEN, "%s", s_entry_digest(e));
            return 0;
        }
    }
    return ka_img_fail(-ENOENT, "image %s is not in the store", ref);
}

/* ---- manifests --------------------------------------------------------------------------- */

typedef struct s_desc {
    char digest[KA_DIGEST_LEN];
    int64_t size;
    char media[128];
} s_desc_t;

typedef struct s_manifest {
    char digest[KA_DIGEST_LEN]; /* the manifest itself (the platform one, if loaded via an index) */
    char media[96];
    s_desc_t config;
    s_desc_t *layers;
    size_t n_layers;
} s_manifest_t;

static void s_manifest_free(s_manifest_t *m)
{
    free(m->layers);
    memset(m, 0, sizeof *m);
}

static int s_desc_parse(json_t *j, s_desc_t *d, const char *what)
{
    const char *digest = json_string_value(json_object_get(j, "digest"));
    json_t *size = json_object_get(j, "size");
    const char *media = json_string_value(json_object_get(j, "mediaType"));
    if (!digest || !json_is_integer(size) || json_integer_value(size) < 0)
        return ka_img_fail(-EBADMSG, "%s descriptor lacks a digest or size", what);
    if (strncmp(digest, KA_DIGEST_PREFIX, 7) != 0)
        return ka_img_fail(-EBADMSG, "%s digest %s: only sha256 is supported", what, digest);
    if (!ka_digest_valid(digest))
        return ka_img_fail(-EBADMSG, "%s digest '%s' is malformed", what, digest);
    snprintf(d->digest, sizeof d->digest, "%s", digest);
    d->size = (int64_t)json_integer_value(size);
    snprintf(d->media, sizeof d->media, "%s", media ? media : "");
    return 0;
}

/* Reads a stored or pending JSON blob. */
static int s_load_json(ka_blob_txn_t *t, const char *digest, json_t **out)
{
    char *p = ka_blob_txn_path(t, digest);
    if (!p)
        return ka_img_fail(-ENOENT, "blob %s is missing", digest);
    char *buf = NULL;
    size_t len = 0;
    int rc = ka_fs_read_file(p, KA_MAX_JSON_BYTES, &buf, &len);
    free(p);
    if (rc < 0)
        return rc;
    json_error_t je;
    *out = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!*out || !json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return ka_img_fail(-EBADMSG, "blob %s is not a JSON object: %s", digest, je.text);
    }
    return 0;
}

/* Picks the linux/<this arch> manifest (or the only one) from an image index. */
static int s_pick_platform(json_t *index, s_desc_t *out)
{
    json_t *arr = json_object_get(index, "manifests");
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return ka_img_fail(-EBADMSG, "image index lists no manifests");
    struct utsname u;
    uname(&u);
    const char *arch = !strcmp(u.machine, "aarch64") ? "arm64" : "amd64";
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        json_t *pl = json_object_get(e, "platform");
        const char *os = json_string_value(json_object_get(pl, "os"));
        const char *ar = json_string_value(json_object_get(pl, "architecture"));
        if (json_array_size(arr) == 1 || (os && ar && !strcmp(os, "linux") && !strcmp(ar, arch)))
            return s_desc_parse(e, out, "manifest");
    }
    return ka_img_fail(-ENOENT, "image index has no linux/%s manifest", arch);
}

static int s_manifest_parse(json_t *j, s_manifest_t *m)
{
    memset(m, 0, sizeof *m);
    const char *media = json_string_value(json_object_get(j, "mediaType"));
    snprintf(m->media, sizeof m->media, "%s", media ? media : S_MT_OCI_MAN);
    json_t *layers = json_object_get(j, "layers");
    if (!json_is_object(json_object_get(j, "config")) || !json_is_array(layers))
        return ka_img_fail(-EBADMSG, "manifest lacks config or layers");
    int rc = s_desc_parse(json_object_get(j, "config"), &m->config, "config");
    if (rc < 0)
        return rc;
    m->n_layers = json_array_size(layers);
    m->layers = calloc(m->n_layers + 1, sizeof *m->layers);
    if (!m->layers)
        return -ENOMEM;
    for (size_t i = 0; i < m->n_layers; i++) {
        rc = s_desc_parse(json_array_get(layers, i), &m->layers[i], "layer");
        if (rc < 0) {
            s_manifest_free(m);
            return rc;
        }
    }
    return 0;
}

/* Parses the stored manifest of digest; an image index is followed to its platform manifest
 * (m->digest says which). */
static int s_manifest_load(ka_blob_txn_t *t, const char *digest, s_manifest_t *m)
{
    char cur[KA_DIGEST_LEN];
    snprintf(cur, sizeof cur, "%s", digest);
    for (int depth = 0;; depth++) {
        json_t *j = NULL;
        int rc = s_load_json(t, cur, &j);
        if (rc < 0)
            return rc;
        if (!json_object_get(j, "manifests")) {
            rc = s_manifest_parse(j, m);
            json_decref(j);
            if (rc == 0)
                memcpy(m->digest, cur, KA_DIGEST_LEN);
            return rc;
        }
        s_desc_t sub;
        rc = depth > 1 ? ka_img_fail(-EBADMSG, "image indexes nested too deep")
                       : s_pick_platform(j, &sub);
        json_decref(j);
        if (rc < 0)
            return rc;
        memcpy(cur, sub.digest, KA_DIGEST_LEN);
    }
}

/* ---- staging images into a transaction ---------------------------------------------------- */

/* Where blobs come from: an image layout directory or a registry. */
typedef struct s_source {
    const char *dir;      /* layout directory, or NULL */
    const char *endpoint; /* registry endpoint, or NULL */
    const char *repo;     /* registry repository */
} s_source_t;

/* Puts the verified blob of d into t (unless stored or pending already). */
static int s_get(s_source_t *src, ka_blob_txn_t *t, const s_desc_t *d, bool manifest)
{
    char *have = ka_blob_txn_path(t, d->digest);
    free(have);
    if (have)
        return 0;
    if (src->dir) {
        char *p = ka_strfmt("%s/blobs/sha256/%s", src->dir, ka_digest_hex(d->digest));
        int rc = p ? ka_blob_txn_add_file(t, p, d->digest, d->size, NULL) : -ENOMEM;
        free(p);
        return rc;
    }
    return ka_registry_fetch(t, src->endpoint, src->repo, manifest ? "manifests" : "blobs",
                             d->digest, manifest ? S_ACCEPT : NULL,
                             manifest ? KA_MAX_JSON_BYTES : S_MAX_LAYER_BYTES);
}

/* Checks a freshly staged layer's content. diff_id may be NULL. */
static int s_check_layer(ka_blob_txn_t *t, const char *digest, const char *diff_id)
{
    if (ka_blob_txn_stored(t, digest))
        return 0; /* checked when it was stored */
    char *p = ka_blob_txn_path(t, digest);
    if (!p)
        return ka_img_fail(-ENOENT, "layer %s is missing", digest);
    int rc = ka_layer_check(p, diff_id && strcmp(diff_id, digest) ? diff_id : NULL, NULL);
    free(p);
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ka_img_last_error());
        return ka_img_fail(rc, "layer %s refused: %s", digest, msg);
    }
    return 0;
}

/*
 * Stages the image whose manifest (or index) descriptor is d: manifest, config and layers, all
 * verified. res->digest receives d's digest: an index is kept as it was pinned, with its
 * platform manifest (the only one staged) behind it.
 */
static int s_stage(s_source_t *src, ka_blob_txn_t *t, const s_desc_t *d, int depth, s_result_t *res)
{
    int rc = s_get(src, t, d, true);
    if (rc < 0)
        return rc;
    json_t *j = NULL;
    rc = s_load_json(t, d->digest, &j);
    if (rc < 0)
        return rc;
    if (json_object_get(j, "manifests")) {
        s_desc_t sub;
        rc = depth > 1 ? ka_img_fail(-EBADMSG, "image indexes nested too deep")
                       : s_pick_platform(j, &sub);
        const char *media = json_string_value(json_object_get(j, "mediaType"));
        char imedia[96];
        snprintf(imedia, sizeof imedia, "%s", media ? media : S_MT_OCI_INDEX);
        json_decref(j);
        if (rc == 0)
            rc = s_stage(src, t, &sub, depth + 1, res);
        if (rc == 0) {
            memcpy(res->digest, d->digest, KA_DIGEST_LEN);
            res->size = d->size;
            snprintf(res->media, sizeof res->media, "%s", imedia);
        }
        return rc;
    }
    s_manifest_t m;
    rc = s_manifest_parse(j, &m);
    json_decref(j);
    if (rc < 0)
        return rc;
    json_t *cfg = NULL;
    rc = s_get(src, t, &m.config, false);
    if (rc == 0)
        rc = s_load_json(t, m.config.digest, &cfg);
    json_t *diff_ids = json_object_get(json_object_get(cfg, "rootfs"), "diff_ids");
    if (rc == 0 && json_array_size(diff_ids) != m.n_layers)
        rc = ka_img_fail(-EBADMSG, "config lists %zu diff_ids for %zu layers",
                         json_array_size(diff_ids), m.n_layers);
    for (size_t i = 0; rc == 0 && i < m.n_layers; i++) {
        rc = s_get(src, t, &m.layers[i], false);
        if (rc == 0)
            rc = s_check_layer(t, m.layers[i].digest,
                               json_string_value(json_array_get(diff_ids, i)));
    }
    json_decref(cfg);
    if (rc == 0) {
        memcpy(res->digest, d->digest, KA_DIGEST_LEN);
        res->size = d->size;
        snprintf(res->media, sizeof res->media, "%s", m.media);
    }
    s_manifest_free(&m);
    return rc;
}

/* ---- import ------------------------------------------------------------------------------ */

typedef struct s_results {
    s_result_t *v;
    size_t n;
} s_results_t;

static void s_results_free(s_results_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->v[i].name);
    free(r->v);
    memset(r, 0, sizeof *r);
}

static s_result_t *s_results_push(s_results_t *r, const char *name)
{
    s_result_t *nv = realloc(r->v, (r->n + 1) * sizeof *nv);
    if (!nv)
        return NULL;
    r->v = nv;
    s_result_t *x = &r->v[r->n];
    memset(x, 0, sizeof *x);
    x->name = strdup(name ? name : "");
    if (!x->name)
        return NULL;
    r->n++;
    return x;
}

/* Parses an input's JSON file (index.json, manifest.json), refusing oversized ones. NULL on
 * failure (message recorded). */
static json_t *s_input_json(const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    if (ka_fs_read_file(path, KA_MAX_JSON_BYTES, &buf, &len) < 0)
        return NULL;
    json_error_t je;
    json_t *j = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!j)
        ka_img_fail(-EBADMSG, "%s is not valid JSON: %s", path, je.text);
    return j;
}

static int s_import_layout(const char *dir, ka_blob_txn_t *t, s_results_t *out)
{
    char *p = ka_strfmt("%s/index.json", dir);
    if (!p)
        return -ENOMEM;
    json_t *idx = s_input_json(p);
    free(p);
    json_t *arr = json_object_get(idx, "manifests");
    int rc = 0;
    if (!idx)
        rc = -EBADMSG;
    else if (!json_is_array(arr) || json_array_size(arr) == 0)
        rc = ka_img_fail(-EBADMSG, "%s: index.json lists no manifests", dir);
    s_source_t src = {.dir = dir};
    size_t i;
    json_t *e;
    json_array_foreach(rc == 0 ? arr : NULL, i, e)
    {
        s_desc_t d;
        rc = s_desc_parse(e, &d, "manifest");
        s_result_t *r = rc == 0 ? s_results_push(out, s_entry_name(e)) : NULL;
        if (rc == 0 && !r)
            rc = -ENOMEM;
        if (rc == 0)
            rc = s_stage(&src, t, &d, 0, r);
        if (rc < 0)
            break;
    }
    json_decref(idx);
    return rc;
}

/* Media type of a layer file from its magic bytes. */
static const char *s_layer_media(const char *path)
{
    unsigned char m[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, m, sizeof m) < 0)
            m[0] = 0;
        close(fd);
    }
    if (m[0] == 0x1f && m[1] == 0x8b)
        return S_MT_OCI_TAR "+gzip";
    if (m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd)
        return S_MT_OCI_TAR "+zstd";
    return S_MT_OCI_TAR;
}

/* Relative file named by a docker-archive manifest, resolved: refused unless it stays in dir
 * (a symlink in an archive must not make us read a host file). */
static char *s_archive_path(const char *dir, const char *rel)
{
    if (!rel || !rel[0] || rel[0] == '/') {
        ka_img_fail(-EBADMSG, "docker archive names an unsafe path '%s'", rel ? rel : "");
        return NULL;
    }
    char *joined = ka_strfmt("%s/%s", dir, rel);
    char *real = joined ? realpath(joined, NULL) : NULL;
    char *rdir = realpath(dir, NULL);
    size_t n = rdir ? strlen(rdir) : 0;
    bool inside = real && rdir && !strncmp(real, rdir, n) && real[n] == '/';
    if (!inside) {
        ka_img_fail(-EBADMSG, "docker archive names '%s', which is missing or outside the archive",
                    rel);
        free(real);
        real = NULL;
    }
    free(joined);
    free(rdir);
    return real;
}

/* One image of a docker-archive manifest.json: builds an OCI manifest for it. */
static int s_import_docker_one(const char *dir, json_t *item, ka_blob_txn_t *t, s_result_t *r)
{
    const char *cfg_rel = json_string_value(json_object_get(item, "Config"));
    json_t *layers = json_object_get(item, "Layers");
    if (!cfg_rel || !json_is_array(layers))
        return ka_img_fail(-EBADMSG, "docker archive manifest lacks Config or Layers");
    char *cfg_path = s_archive_path(dir, cfg_rel);
    if (!cfg_path)
        return -EBADMSG;
    char cfg_digest[KA_DIGEST_LEN];
    int rc = ka_blob_txn_add_file(t, cfg_path, NULL, -1, cfg_digest);
    free(cfg_path);
    if (rc < 0)
        return rc;
    /* The config's file name is its digest ("<hex>.json" or "blobs/sha256/<hex>"). */
    const char *base = strrchr(cfg_rel, '/');
    base = base ? base + 1 : cfg_rel;
    if (strlen(base) >= 64 && strspn(base, "0123456789abcdef") == 64 &&
        strncmp(base, ka_digest_hex(cfg_digest), 64) != 0)
        return ka_img_fail(-EBADMSG, "docker archive config %s hashes to %s", cfg_rel, cfg_digest);
    json_t *cfg = NULL;
    rc = s_load_json(t, cfg_digest, &cfg);
    if (rc < 0)
        return rc;
    json_t *diff_ids = json_object_get(json_object_get(cfg, "rootfs"), "diff_ids");
    json_t *man = json_pack("{s:i, s:s, s:{s:s, s:s, s:I}, s:[]}", "schemaVersion", 2, "mediaType",
                            S_MT_OCI_MAN, "config", "mediaType", S_MT_OCI_CONFIG, "digest",
                            cfg_digest, "size", (json_int_t)0, "layers");
    if (!man)
        rc = -ENOMEM;
    if (rc == 0 && json_array_size(diff_ids) != json_array_size(layers))
        rc = ka_img_fail(-EBADMSG, "docker archive config lists %zu diff_ids for %zu layers",
                         json_array_size(diff_ids), json_array_size(layers));
    uint64_t cfg_size = 0;
    if (rc == 0) {
        char *p = ka_blob_txn_path(t, cfg_digest);
        char dummy[KA_DIGEST_LEN];
        rc = p ? ka_sha256_file(p, dummy, &cfg_size) : -ENOENT;
        free(p);
        json_object_set_new(json_object_get(man, "config"), "size",
                            json_integer((json_int_t)cfg_size));
    }
    for (size_t i = 0; rc == 0 && i < json_array_size(layers); i++) {
        const char *diff_id = json_string_value(json_array_get(diff_ids, i));
        char *lp = s_archive_path(dir, json_string_value(json_array_get(layers, i)));
        char ld[KA_DIGEST_LEN];
        if (!lp || !diff_id || !ka_digest_valid(diff_id)) {
            free(lp);
            rc = ka_img_fail(-EBADMSG, "docker archive layer %zu is unnamed or has a bad diff_id",
                             i);
            break;
        }
        rc = ka_blob_txn_add_file(t, lp, NULL, -1, ld);
        const char *media = s_layer_media(lp);
        free(lp);
        if (rc == 0)
            rc = s_check_layer(t, ld, diff_id);
        uint64_t size = 0;
        if (rc == 0) {
            char *bp = ka_blob_txn_path(t, ld);
            struct stat st;
            if (bp && stat(bp, &st) == 0)
                size = (uint64_t)st.st_size;
            free(bp);
            json_array_append_new(json_object_get(man, "layers"),
                                  json_pack("{s:s, s:s, s:I}", "mediaType", media, "digest", ld,
                                            "size", (json_int_t)size));
        }
    }
    json_decref(cfg);
    if (rc == 0) {
        char *body = json_dumps(man, JSON_COMPACT | JSON_PRESERVE_ORDER);
        rc = body ? ka_blob_txn_add_buf(t, body, strlen(body), NULL, r->digest) : -ENOMEM;
        r->size = body ? (int64_t)strlen(body) : 0;
        snprintf(r->media, sizeof r->media, "%s", S_MT_OCI_MAN);
        free(body);
    }
    json_decref(man);
    return rc;
}

static int s_import_docker(const char *dir, ka_blob_txn_t *t, s_results_t *out)
{
    char *p = ka_strfmt("%s/manifest.json", dir);
    if (!p)
        return -ENOMEM;
    json_t *arr = s_input_json(p);
    free(p);
    int rc = 0;
    if (!arr)
        rc = -EBADMSG;
    else if (!json_is_array(arr) || json_array_size(arr) == 0)
        rc = ka_img_fail(-EBADMSG, "%s: manifest.json lists no images", dir);
    size_t i;
    json_t *item;
    json_array_foreach(rc == 0 ? arr : NULL, i, item)
    {
        const char *tag = json_string_value(json_array_get(json_object_get(item, "RepoTags"), 0));
        s_result_t *r = s_results_push(out, tag);
        rc = r ? s_import_docker_one(dir, item, t, r) : -ENOMEM;
        if (rc < 0)
            break;
    }
    json_decref(arr);
    return rc;
}

static bool s_exists(const char *dir, const char *file)
{
    char *p = ka_strfmt("%s/%s", dir, file);
    struct stat st;
    bool ok = p && stat(p, &st) == 0;
    free(p);
    return ok;
}

/* Commits t and adds res to the index, under the exclusive lock. */
static int s_commit(ka_images_t *self, ka_blob_txn_t *t, s_results_t *res, const char *name,
                    char **ref_out)
{
    int lk = s_lock(self, LOCK_EX);
    if (lk < 0)
        return lk;
    json_t *idx = NULL;
    int rc = s_index_load(self, &idx);
    if (rc == 0)
        rc = ka_blob_txn_commit(t);
    for (size_t i = 0; rc == 0 && i < res->n; i++) {
        if (name) {
            free(res->v[i].name);
            res->v[i].name = strdup(name);
            if (!res->v[i].name)
                rc = -ENOMEM;
        }
        if (rc == 0)
            rc = s_index_add(idx, &res->v[i]);
    }
    if (rc == 0)
        rc = s_index_save(self, idx);
    json_decref(idx);
    s_unlock(lk);
    if (rc == 0 && ref_out && res->n) {
        s_result_t *r = &res->v[0];
        *ref_out = r->name[0] ? ka_strfmt("%s@%s", r->name, r->digest) : strdup(r->digest);
        if (!*ref_out)
            rc = -ENOMEM;
    }
    return rc;
}

int ka_images_import(ka_images_t *self, const char *path, const char *name, char **ref_out)
{
    ka_img_clear_error();
    int64_t t0 = krt_mono_ms();
    struct stat st;
    if (stat(path, &st) < 0)
        return ka_img_fail(-errno, "cannot import %s: %s", path, strerror(errno));
    char *tmp_root = ka_strfmt("%s/tmp", self->root);
    char *work = NULL, *dir = NULL;
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    s_results_t res = {0};
    int rc = (tmp_root && t) ? 0 : -ENOMEM;
    if (rc == 0 && S_ISREG(st.st_mode)) {
        /* a tarball: unpack it privately (the same safe unpacker as layers) */
        rc = ka_fs_mkdtemp(tmp_root, "import", &work);
        dir = rc == 0 ? ka_strfmt("%s/in", work) : NULL;
        if (rc == 0 && !dir)
            rc = -ENOMEM;
        if (rc == 0) {
            rc = ka_layer_unpack(path, dir, NULL);
            if (rc < 0) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", ka_img_last_error());
                ka_img_fail(rc, "cannot read %s: %s", path, msg);
            }
        }
    } else if (rc == 0 && S_ISDIR(st.st_mode)) {
        dir = strdup(path);
        rc = dir ? 0 : -ENOMEM;
    } else if (rc == 0) {
        rc = ka_img_fail(-EINVAL, "%s is neither a file nor a directory", path);
    }
    if (rc == 0) {
        if (s_exists(dir, "oci-layout") && s_exists(dir, "index.json"))
            rc = s_import_layout(dir, t, &res);
        else if (s_exists(dir, "manifest.json"))
            rc = s_import_docker(dir, t, &res);
        else
            rc = ka_img_fail(
                -EINVAL, "%s is neither an OCI image layout nor a docker-archive tarball", path);
    }
    if (rc == 0)
        rc = s_commit(self, t, &res, name, ref_out);
    if (rc == 0)
        krt_log(KRT_LOG_INFO, S_LOG, "imported", "path=%s images=%zu first=%s ms=%llu", path, res.n,
                res.v[0].digest, (unsigned long long)(krt_mono_ms() - t0));
    ka_blob_txn_destroy(&t);
    if (work)
        ka_fs_rmtree(work);
    free(work);
    free(dir);
    free(tmp_root);
    s_results_free(&res);
    return rc;
}

/* ---- build ------------------------------------------------------------------------------- */

static const char *s_arch(void)
{
    struct utsname u;
    uname(&u);
    return !strcmp(u.machine, "aarch64") ? "arm64" : "amd64";
}

int ka_images_build(ka_images_t *self, const char *rootfs_dir, const char *name, char **ref_out)
{
    ka_img_clear_error();
    struct stat st;
    if (stat(rootfs_dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return ka_img_fail(-ENOTDIR, "%s is not a directory", rootfs_dir);
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    ka_blob_writer_t *w = t ? ka_blob_txn_writer(t) : NULL;
    json_t *cfg = NULL, *man = NULL;
    char *cfg_body = NULL, *man_body = NULL, *defname = NULL;
    s_results_t res = {0};
    int rc = w ? 0 : -EIO;
    ka_layer_stats_t ls;
    char layer[KA_DIGEST_LEN], cfgd[KA_DIGEST_LEN];
    uint64_t layer_size = 0;
    if (rc == 0)
        rc = ka_tar_dir(rootfs_dir, w, &ls);
    if (rc == 0) {
        layer_size = ka_blob_writer_size(w);
        rc = ka_blob_txn_add_writer(t, &w, NULL, -1, layer);
    }
    if (rc == 0) {
        cfg = json_pack("{s:s, s:s, s:{}, s:{s:s, s:[s]}}", "architecture", s_arch(), "os", "linux",
                        "config", "rootfs", "type", "layers", "diff_ids", layer);
        cfg_body = cfg ? json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        rc = cfg_body ? ka_blob_txn_add_buf(t, cfg_body, strlen(cfg_body), NULL, cfgd) : -ENOMEM;
    }
    if (rc == 0) {
        man = json_pack("{s:i, s:s, s:{s:s, s:s, s:I}, s:[{s:s, s:s, s:I}]}", "schemaVersion", 2,
                        "mediaType", S_MT_OCI_MAN, "config", "mediaType", S_MT_OCI_CONFIG, "digest",
                        cfgd, "size", (json_int_t)strlen(cfg_body), "layers", "mediaType",
                        S_MT_OCI_TAR, "digest", layer, "size", (json_int_t)layer_size);
        man_body = man ? json_dumps(man, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!man_body)
            rc = -ENOMEM;
    }
    if (rc == 0 && !name) {
        const char *base = strrchr(rootfs_dir, '/');
        base = base && base[1] ? base + 1 : rootfs_dir;
        defname = ka_strfmt("local/%s", base);
        name = defname;
    }
    s_result_t *r = rc == 0 ? s_results_push(&res, name) : NULL;
    if (rc == 0 && !r)
        rc = -ENOMEM;
    if (rc == 0) {
        rc = ka_blob_txn_add_buf(t, man_body, strlen(man_body), NULL, r->digest);
        r->size = (int64_t)strlen(man_body);
        snprintf(r->media, sizeof r->media, "%s", S_MT_OCI_MAN);
    }
    if (rc == 0)
        rc = s_commit(self, t, &res, NULL, ref_out);
    if (rc == 0)
        krt_log(KRT_LOG_INFO, S_LOG, "built",
                "rootfs=%s name=%s digest=%s entries=%llu bytes=%llu skipped=%llu", rootfs_dir,
                name, r->digest, (unsigned long long)ls.entries, (unsigned long long)ls.bytes,
                (unsigned long long)ls.skipped);
    ka_blob_writer_destroy(&w);
    ka_blob_txn_destroy(&t);
    json_decref(cfg);
    json_decref(man);
    free(cfg_body);
    free(man_body);
    free(defname);
    s_results_free(&res);
    return rc;
}

/* ---- pull -------------------------------------------------------------------------------- */

/* Splits HOST[:PORT]/REPO[:TAG]@sha256:HEX. Outputs are malloc'd. */
static int s_parse_pull_ref(const char *ref, char **reg, char **repo, char *digest)
{
    const char *at = strrchr(ref, '@');
    if (!at || !ka_digest_valid(at + 1))
        return ka_img_fail(-EINVAL,
                           "pull needs a reference pinned by digest "
                           "(HOST/REPO@sha256:<64 hex>), got '%s'",
                           ref);
    snprintf(digest, KA_DIGEST_LEN, "%s", at + 1);
    char *left = strndup(ref, (size_t)(at - ref));
    if (!left)
        return -ENOMEM;
    char *slash = strchr(left, '/');
    bool has_host =
        slash && (memchr(left, '.', (size_t)(slash - left)) ||
                  memchr(left, ':', (size_t)(slash - left)) || !strncmp(left, "localhost/", 10));
    const char *r = has_host ? slash + 1 : left;
    *reg = has_host ? strndup(left, (size_t)(slash - left)) : strdup("docker.io");
    char *rp = slash || has_host ? strdup(r) : ka_strfmt("library/%s", r);
    if (rp) {
        char *colon = strrchr(rp, ':'); /* a tag beside the digest is ignored */
        if (colon && !strchr(colon, '/'))
            *colon = '\0';
    }
    *repo = rp;
    free(left);
    if (!*reg || !*repo || !**repo) {
        free(*reg);
        free(*repo);
        return ka_img_fail(-EINVAL, "bad image reference '%s'", ref);
    }
    return 0;
}

static char *s_endpoint(ka_images_t *self, const char *reg)
{
    for (size_t i = 0; i < self->n_mirrors; i++)
        if (!strcmp(self->mirror_reg[i], reg))
            return strdup(self->mirror_url[i]);
    if (!strcmp(reg, "docker.io"))
        return strdup("https://registry-1.docker.io");
    bool local =
        !strncmp(reg, "localhost", 9) || !strncmp(reg, "127.", 4) || !strncmp(reg, "[::1]", 5);
    return ka_strfmt("%s://%s", local ? "http" : "https", reg);
}

int ka_images_pull(ka_images_t *self, const char *ref, char **ref_out)
{
    ka_img_clear_error();
    int64_t t0 = krt_mono_ms();
    char *reg = NULL, *repo = NULL, *endpoint = NULL, *name = NULL;
    s_desc_t d = {.size = -1};
    int rc = s_parse_pull_ref(ref, &reg, &repo, d.digest);
    if (rc < 0)
        return rc;
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    s_results_t res = {0};
    endpoint = s_endpoint(self, reg);
    name = ka_strfmt("%s/%s", reg, repo);
    s_result_t *r = name ? s_results_push(&res, name) : NULL;
    rc = (t && endpoint && r) ? 0 : -ENOMEM;
    if (rc == 0) {
        s_source_t src = {.endpoint = endpoint, .repo = repo};
        rc = s_stage(&src, t, &d, 0, r);
    }
    if (rc == 0) {
        /* the index names the digest that was asked for (an image index, or a manifest) */
        char *p = ka_blob_txn_path(t, r->digest);
        uint64_t sz = 0;
        char dd[KA_DIGEST_LEN];
        rc = p ? ka_sha256_file(p, dd, &sz) : -ENOENT;
        r->size = (int64_t)sz;
        free(p);
    }
    if (rc == 0)
        rc = s_commit(self, t, &res, NULL, ref_out);
    if (rc == 0)
        krt_log(KRT_LOG_INFO, S_LOG, "pulled", "ref=%s endpoint=%s ms=%llu", ref, endpoint,
                (unsigned long long)(krt_mono_ms() - t0));
    ka_blob_txn_destroy(&t);
    s_results_free(&res);
    free(reg);
    free(repo);
    free(endpoint);
    free(name);
    return rc;
}

/* ---- list, resolve, verify --------------------------------------------------------------- */

int ka_images_list(ka_images_t *self, ka_image_info_t **out, size_t *n_out)
{
    ka_img_clear_error();
    json_t *idx = NULL;
    int rc = s_index_load(self, &idx);
    if (rc < 0)
        return rc;
    json_t *arr = json_object_get(idx, "manifests");
    size_t n = json_array_size(arr);
    ka_image_info_t *v = calloc(n + 1, sizeof *v);
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    if (!v || !t)
        rc = -ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *e = json_array_get(arr, i);
        v[i].name = strdup(s_entry_name(e));
        snprintf(v[i].digest, sizeof v[i].digest, "%s", s_entry_digest(e));
        v[i].size = (uint64_t)json_integer_value(json_object_get(e, "size"));
        s_manifest_t m;
        if (ka_digest_valid(v[i].digest) && s_manifest_load(t, v[i].digest, &m) == 0) {
            v[i].size += (uint64_t)m.config.size;
            for (size_t k = 0; k < m.n_layers; k++)
                v[i].size += (uint64_t)m.layers[k].size;
            v[i].layers = (int)m.n_layers;
            s_manifest_free(&m);
        }
        if (!v[i].name)
            rc = -ENOMEM;
    }
    ka_blob_txn_destroy(&t);
    json_decref(idx);
    if (rc < 0) {
        ka_images_list_free(v, n);
        return rc;
    }
    *out = v;
    *n_out = n;
    return 0;
}

void ka_images_list_free(ka_image_info_t *list, size_t n)
{
    if (!list)
        return;
    for (size_t i = 0; i < n; i++)
        free(list[i].name);
    free(list);
}

int ka_images_resolve(ka_images_t *self, const char *ref, char digest_out[72])
{
    ka_img_clear_error();
    json_t *idx = NULL;
    int rc = s_index_load(self, &idx);
    if (rc == 0)
        rc = s_index_find(idx, ref, digest_out);
    json_decref(idx);
    return rc;
}

static int s_verify_blob(ka_blob_txn_t *t, const char *digest)
{
    char *p = ka_blob_txn_path(t, digest);
    if (!p)
        return ka_img_fail(-EBADMSG, "blob %s is missing from the store", digest);
    char got[KA_DIGEST_LEN];
    int rc = ka_sha256_file(p, got, NULL);
    free(p);
    if (rc == 0 && strcmp(got, digest) != 0)
        rc = ka_img_fail(-EBADMSG, "stored blob %s now hashes to %s", digest, got);
    return rc;
}

int ka_images_verify(ka_images_t *self, const char *ref)
{
    char digest[KA_DIGEST_LEN];
    int rc = ka_images_resolve(self, ref, digest);
    if (rc < 0)
        return rc;
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    if (!t)
        return -ENOMEM;
    s_manifest_t m = {0};
    rc = s_verify_blob(t, digest);
    if (rc == 0)
        rc = s_manifest_load(t, digest, &m);
    if (rc == 0 && strcmp(m.digest, digest) != 0)
        rc = s_verify_blob(t, m.digest); /* the platform manifest behind an index */
    if (rc == 0)
        rc = s_verify_blob(t, m.config.digest);
    for (size_t i = 0; rc == 0 && i < m.n_layers; i++)
        rc = s_verify_blob(t, m.layers[i].digest);
    s_manifest_free(&m);
    ka_blob_txn_destroy(&t);
    return rc;
}

/* ---- rm and garbage collection ----------------------------------------------------------- */

/* Removes entries of dir (a directory of <hex> names) whose digest is not in keep. */
static void s_sweep(const char *dir, json_t *keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char key[sizeof de->d_name + 8];
        snprintf(key, sizeof key, KA_DIGEST_PREFIX "%s", de->d_name);
        if (!json_object_get(keep, key))
            ka_fs_rmtree_at(dirfd(d), de->d_name);
    }
    closedir(d);
}

/* Removes temp files and directories a crashed process left in tmp/ (older than a day: a
 * live import or preparation never takes that long). */
static void s_sweep_stale_tmp(ka_images_t *self)
{
    char *p = ka_strfmt("%s/tmp", self->root);
    DIR *d = p ? opendir(p) : NULL;
    free(p);
    if (!d)
        return;
    time_t cutoff = time(NULL) - 24 * 3600;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (de->d_name[0] != '.' && fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            st.st_mtime < cutoff)
            ka_fs_rmtree_at(dirfd(d), de->d_name);
    }
    closedir(d);
}

/* The digests (manifests, configs, layers) the index entries reach; NULL on failure. */
static json_t *s_keep_set(ka_images_t *self, json_t *idx)
{
    json_t *keep = json_object();
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    if (!keep || !t) {
        json_decref(keep);
        ka_blob_txn_destroy(&t);
        return NULL;
    }
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(idx, "manifests"), i, e)
    {
        const char *d = s_entry_digest(e);
        s_manifest_t m;
        json_object_set_new(keep, d, json_true());
        if (ka_digest_valid(d) && s_manifest_load(t, d, &m) == 0) {
            json_object_set_new(keep, m.digest, json_true());
            json_object_set_new(keep, m.config.digest, json_true());
            for (size_t k = 0; k < m.n_layers; k++)
                json_object_set_new(keep, m.layers[k].digest, json_true());
            s_manifest_free(&m);
        }
    }
    ka_blob_txn_destroy(&t);
    return keep;
}

/* Appends the mount tables of every mount namespace on the host (one read per namespace) to
 * out: sandboxes mount their overlays in their own namespaces. */
static void s_all_mounts(FILE *out)
{
    DIR *d = opendir("/proc");
    if (!d)
        return;
    char seen[256][64];
    size_t n_seen = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char path[64], ns[64] = "";
        snprintf(path, sizeof path, "/proc/%.20s/ns/mnt", de->d_name);
        ssize_t n = readlink(path, ns, sizeof ns - 1);
        if (n <= 0)
            continue;
        ns[n] = '\0';
        bool dup = false;
        for (size_t i = 0; i < n_seen && !dup; i++)
            dup = !strcmp(seen[i], ns);
        if (dup)
            continue;
        if (n_seen < 256)
            memcpy(seen[n_seen++], ns, sizeof ns);
        snprintf(path, sizeof path, "/proc/%.20s/mountinfo", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char buf[8192];
        size_t got;
        while ((got = fread(buf, 1, sizeof buf, f)) > 0)
            fwrite(buf, 1, got, out);
        fclose(f);
    }
    closedir(d);
}

/*
 * -EBUSY if a layer cache or prepared rootfs that keep does not hold is mounted anywhere (an
 * overlay lowerdir, or a bind mount of a file in it such as the guest binary).
 */
static int s_check_unused(ka_images_t *self, json_t *keep)
{
    char *mounts = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&mounts, &len);
    if (!mf)
        return -ENOMEM;
    s_all_mounts(mf);
    fclose(mf);
    int rc = 0;
    static const char *const dirs[] = {"layers", "rootfs"};
    for (size_t k = 0; rc == 0 && k < 2; k++) {
        char *p = ka_strfmt("%s/%s", self->root, dirs[k]);
        DIR *d = p ? opendir(p) : NULL;
        free(p);
        struct dirent *de;
        while (rc == 0 && d && (de = readdir(d)) != NULL) {
            char key[sizeof de->d_name + 8], needle[sizeof de->d_name + 16];
            snprintf(key, sizeof key, KA_DIGEST_PREFIX "%s", de->d_name);
            if (de->d_name[0] == '.' || json_object_get(keep, key))
                continue;
            snprintf(needle, sizeof needle, "/%s/%s/", dirs[k], de->d_name);
            if (mounts && strstr(mounts, needle))
                rc = ka_img_fail(-EBUSY, "image is in use: %s/%s is mounted (a running sandbox?)",
                                 dirs[k], de->d_name);
        }
        if (d)
            closedir(d);
    }
    free(mounts);
    return rc;
}

/* Deletes blobs, layer caches and prepared rootfs keep does not hold, and old temp leftovers.
 * Caller holds LOCK_EX. */
static void s_gc(ka_images_t *self, json_t *keep)
{
    static const char *const dirs[] = {"blobs/sha256", "layers", "rootfs"};
    for (size_t k = 0; k < sizeof dirs / sizeof *dirs; k++) {
        char *p = ka_strfmt("%s/%s", self->root, dirs[k]);
        if (p)
            s_sweep(p, keep);
        free(p);
    }
    s_sweep_stale_tmp(self);
}

int ka_images_rm(ka_images_t *self, const char *ref)
{
    ka_img_clear_error();
    int lk = s_lock(self, LOCK_EX);
    if (lk < 0)
        return lk;
    json_t *idx = NULL;
    int rc = s_index_load(self, &idx);
    char digest[KA_DIGEST_LEN];
    if (rc == 0)
        rc = s_index_find(idx, ref, digest);
    if (rc == 0) {
        bool by_digest = !strncmp(ref, KA_DIGEST_PREFIX, 7);
        const char *at = strrchr(ref, '@');
        size_t namelen = at ? (size_t)(at - ref) : strlen(ref);
        json_t *arr = json_object_get(idx, "manifests");
        for (size_t i = json_array_size(arr); i-- > 0;) {
            json_t *e = json_array_get(arr, i);
            const char *n = s_entry_name(e);
            bool match = !strcmp(s_entry_digest(e), digest) &&
                         (by_digest || (strlen(n) == namelen && !strncmp(n, ref, namelen)));
            if (match)
                json_array_remove(arr, i);
        }
    }
    json_t *keep = rc == 0 ? s_keep_set(self, idx) : NULL;
    if (rc == 0 && !keep)
        rc = -ENOMEM;
    if (rc == 0)
        rc = s_check_unused(self, keep); /* nothing changes if a sandbox still uses it */
    if (rc == 0)
        rc = s_index_save(self, idx);
    if (rc == 0)
        s_gc(self, keep);
    json_decref(keep);
    json_decref(idx);
    s_unlock(lk);
    if (rc == 0)
        krt_log(KRT_LOG_INFO, S_LOG, "removed", "ref=%s digest=%s", ref, digest);
    return rc;
}

/* ---- prepared root file systems ---------------------------------------------------------- */

/* Unpacks layer digest into layers/<hex> once. *whiteouts tells if it holds whiteout files. */
static int s_ensure_layer(ka_images_t *self, ka_blob_txn_t *t, const char *digest, bool *whiteouts)
{
    const char *hex = ka_digest_hex(digest);
    char *final = ka_strfmt("%s/layers/%s", self->root, hex);
    char *marker = ka_strfmt("%s/layers/%s/whiteouts", self->root, hex);
    char *tmp_root = ka_strfmt("%s/tmp", self->root);
    char *work = NULL, *dest = NULL, *blob = NULL;
    struct stat st;
    int rc = (final && marker && tmp_root) ? 0 : -ENOMEM;
    if (rc == 0 && stat(final, &st) == 0)
        goto done;
    int64_t t0 = krt_mono_ms();
    blob = ka_blob_txn_path(t, digest);
    if (rc == 0 && !blob)
        rc = ka_img_fail(-ENOENT, "layer blob %s is missing from the store", digest);
    if (rc == 0)
        rc = ka_fs_mkdtemp(tmp_root, "layer", &work);
    if (rc == 0 && !(dest = ka_strfmt("%s/rootfs", work)))
        rc = -ENOMEM;
    ka_layer_stats_t ls;
    if (rc == 0)
        rc = ka_layer_unpack(blob, dest, &ls);
    if (rc == 0 && ls.has_whiteouts) {
        char *m = ka_strfmt("%s/whiteouts", work);
        rc = m ? ka_fs_write_atomic(m, "", 0) : -ENOMEM;
        free(m);
    }
    if (rc == 0) {
        int fd = open(work, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
            syncfs(fd);
            close(fd);
        }
        if (rename(work, final) < 0 && errno != EEXIST && errno != ENOTEMPTY)
            rc = ka_img_fail(-errno, "cannot store layer %s: %s", final, strerror(errno));
        krt_log(KRT_LOG_INFO, S_LOG, "layer_unpacked",
                "digest=%s entries=%llu bytes=%llu skipped=%llu ms=%llu", digest,
                (unsigned long long)ls.entries, (unsigned long long)ls.bytes,
                (unsigned long long)ls.skipped, (unsigned long long)(krt_mono_ms() - t0));
    }
done:
    if (rc == 0)
        *whiteouts = stat(marker, &st) == 0;
    if (work)
        ka_fs_rmtree(work); /* gone already after a successful rename */
    free(work);
    free(dest);
    free(blob);
    free(final);
    free(marker);
    free(tmp_root);
    return rc;
}

static int s_prepare(ka_images_t *self, ka_blob_txn_t *t, const char *digest, char **out)
{
    s_manifest_t m;
    int rc = s_manifest_load(t, digest, &m);
    if (rc < 0)
        return rc;
    bool any_wh = false;
    for (size_t i = 0; rc == 0 && i < m.n_layers; i++) {
        bool wh = false;
        rc = s_ensure_layer(self, t, m.layers[i].digest, &wh);
        any_wh = any_wh || wh;
    }
    if (rc == 0 && m.n_layers == 1 && !any_wh) {
        *out = ka_strfmt("%s/layers/%s/rootfs", self->root, ka_digest_hex(m.layers[0].digest));
        rc = *out ? 0 : -ENOMEM;
        s_manifest_free(&m);
        return rc;
    }
    char *final = ka_strfmt("%s/rootfs/%s", self->root, ka_digest_hex(digest));
    char *tmp_root = ka_strfmt("%s/tmp", self->root);
    char *work = NULL;
    struct stat st;
    if (rc == 0 && (!final || !tmp_root))
        rc = -ENOMEM;
    if (rc == 0 && stat(final, &st) < 0) {
        int64_t t0 = krt_mono_ms();
        rc = ka_fs_mkdtemp(tmp_root, "rootfs", &work);
        if (rc == 0)
            chmod(work, 0755);
        for (size_t i = 0; rc == 0 && i < m.n_layers; i++) {
            char *ld =
                ka_strfmt("%s/layers/%s/rootfs", self->root, ka_digest_hex(m.layers[i].digest));
            rc = ld ? ka_layer_apply(ld, work) : -ENOMEM;
            free(ld);
        }
        if (rc == 0) {
            int fd = open(work, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (fd >= 0) {
                syncfs(fd);
                close(fd);
            }
            if (rename(work, final) < 0 && errno != EEXIST && errno != ENOTEMPTY)
                rc = ka_img_fail(-errno, "cannot store rootfs %s: %s", final, strerror(errno));
        }
        if (rc == 0)
            krt_log(KRT_LOG_INFO, S_LOG, "rootfs_prepared", "digest=%s layers=%zu ms=%llu", digest,
                    m.n_layers, (unsigned long long)(krt_mono_ms() - t0));
        if (work)
            ka_fs_rmtree(work);
    }
    if (rc == 0) {
        *out = final;
        final = NULL;
    }
    free(final);
    free(tmp_root);
    free(work);
    s_manifest_free(&m);
    return rc;
}

int ka_images_rootfs(ka_images_t *self, const char *ref_or_digest, char **lowerdir_out)
{
    ka_img_clear_error();
    int lk = s_lock(self, LOCK_SH);
    if (lk < 0)
        return lk;
    char digest[KA_DIGEST_LEN];
    json_t *idx = NULL;
    ka_blob_txn_t *t = ka_blob_txn_new(self->root);
    int rc = t ? s_index_load(self, &idx) : -ENOMEM;
    if (rc == 0)
        rc = s_index_find(idx, ref_or_digest, digest);
    if (rc == 0)
        rc = s_prepare(self, t, digest, lowerdir_out);
    json_decref(idx);
    ka_blob_txn_destroy(&t);
    s_unlock(lk);
    return rc;
}
