/*
 * images: the node's OCI content store, layer cache and prepared root file systems.
 *
 * Layout under <state_dir>/images (mode 0700: caches keep images' setuid files; itself a valid
 * OCI image layout, readable by skopeo as oci:<state_dir>/images:NAME):
 *   oci-layout, index.json       the image index: one descriptor per (name, manifest digest),
 *                                the name in annotation org.opencontainers.image.ref.name
 *   blobs/sha256/<hex>           manifests, configs and layers, content-addressed
 *   layers/<hex>/rootfs          a layer unpacked once (whiteout files kept), keyed by layer digest
 *   rootfs/<manifest hex>        layers applied in order (hard links into layers/), for images
 *                                with more than one layer or with whiteouts
 *   tmp/                         temp files; nothing reaches blobs/ or index.json half-written
 *   lock                         flock: exclusive for changes, shared for preparation
 *
 * Image references: "NAME@sha256:<hex>" (the digest decides), "sha256:<hex>", or a NAME that
 * is in the index. A registry pull takes "HOST[:PORT]/REPO@sha256:<hex>" (tags are refused).
 * A digest may name an image index (multi-platform): it is kept as pinned, and its
 * linux/<this arch> manifest (the only one fetched) is what is verified and prepared.
 *
 * Every function returns 0 or a negative errno-style code; on failure ka_images_last_error()
 * gives a one-line message for the calling thread. The functions block (disk, network): in an
 * actor call them from a krt job. One ka_images_t may be used from several threads at once,
 * and several processes may share a store.
 */
#ifndef KA_IMAGES_H
#define KA_IMAGES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ka_images ka_images_t;

typedef struct ka_images_opts {
    const char *state_dir;      /* required: the store lives in <state_dir>/images */
    const char *const *mirrors; /* "REGISTRY=URL" entries, e.g. "docker.io=http://127.0.0.1:5000";
                                 * a registry not listed is reached at https://REGISTRY (http for
                                 * localhost and 127.0.0.1) */
    size_t n_mirrors;
} ka_images_opts_t;

/* One stored image (ka_images_list). */
typedef struct ka_image_info {
    char *name;      /* name in the index, "" if imported without one */
    char digest[72]; /* manifest digest "sha256:<hex>" */
    uint64_t size;   /* manifest + config + layer bytes */
    int layers;      /* number of layers */
} ka_image_info_t;

/* Opens (creating if needed) the store. NULL on failure (see ka_images_last_error). */
ka_images_t *ka_images_new(const ka_images_opts_t *opts);
/* Frees the handle (the store stays on disk). Idempotent; NULLs *self_p. */
void ka_images_destroy(ka_images_t **self_p);

/* The calling thread's message for the last failure (borrowed, thread-local). */
const char *ka_images_last_error(void);

/*
 * Imports an OCI image layout (directory or tarball) or a `docker save` tarball (or its
 * extracted directory). Every blob is checked against its digest (docker-archive layers against
 * the config's diff_ids), every layer read through and refused if it is truncated or unsafe.
 * All images in the input are stored; name (may be NULL) overrides their names. *ref_out
 * (may be NULL; malloc'd) receives "NAME@sha256:<hex>" of the first image. On failure the
 * store is unchanged.
 */
int ka_images_import(ka_images_t *self, const char *path, const char *name, char **ref_out);

/*
 * Builds a single-layer image from a directory: a deterministic uncompressed tar (sorted
 * entries, mtime 0, owners and modes kept, device nodes left out). name NULL means
 * "local/<basename of dir>". *ref_out (malloc'd) receives "NAME@sha256:<manifest hex>".
 */
int ka_images_build(ka_images_t *self, const char *rootfs_dir, const char *name, char **ref_out);

/* Pulls HOST[:PORT]/REPO@sha256:<hex> through the mirror map, verifying every digest; stores it
 * under the name HOST[:PORT]/REPO. *ref_out as for import. */
int ka_images_pull(ka_images_t *self, const char *ref, char **ref_out);

/* Lists stored images (one per index entry). Free with ka_images_list_free. */
int ka_images_list(ka_images_t *self, ka_image_info_t **out, size_t *n_out);
void ka_images_list_free(ka_image_info_t *list, size_t n);

/* Resolves ref to the manifest digest of a stored image; -ENOENT if absent. */
int ka_images_resolve(ka_images_t *self, const char *ref, char digest_out[72]);

/* Re-hashes the manifest, config and layers of a stored image: -EBADMSG if any blob no longer
 * matches its digest (the store was tampered with). */
int ka_images_verify(ka_images_t *self, const char *ref);

/*
 * Removes ref from the index (a NAME@digest or NAME removes that name, a bare digest every
 * name of it), then the blobs, layer caches and prepared rootfs no other image uses. Refused
 * with -EBUSY, changing nothing, while a layer cache or rootfs it would delete is mounted in
 * any mount namespace of the host (an overlay lowerdir or a bind mount from it).
 */
int ka_images_rm(ka_images_t *self, const char *ref);

/*
 * Prepares the image's root file system (each layer unpacked once into the layer cache, then
 * applied in order) and returns its directory in *lowerdir_out (malloc'd): read-only by
 * contract, usable as the lowerdir of an overlayfs mount, valid until the image is removed.
 * A prepared image returns at once.
 */
int ka_images_rootfs(ka_images_t *self, const char *ref_or_digest, char **lowerdir_out);

/* The store root, <state_dir>/images (borrowed). */
const char *ka_images_root(const ka_images_t *self);

#ifdef __cplusplus
}
#endif
#endif /* KA_IMAGES_H */
