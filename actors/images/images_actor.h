/*
 * ka_images actor: the node's image service. Wraps one ka_images_t store; every request runs
 * on a krt job thread (disk and network never block a scheduler) and is answered when done.
 *
 * Requests come as krt_request (from actors) or krt_call (from other threads) with a
 * ka_images_req_t body; the reply has the request's type and a ka_images_reply_t body:
 *   KA_IMAGES_PREPARE   ref -> digest, path (the image's rootfs, an overlayfs lowerdir)
 *   KA_IMAGES_RESOLVE   ref -> digest (-ENOENT if the node does not hold it)
 *   KA_IMAGES_VERIFY    ref -> status (-EBADMSG if a stored blob no longer matches)
 *   KA_IMAGES_IMPORT    arg = file or dir, name (optional) -> ref, digest
 *   KA_IMAGES_PULL      arg = HOST/REPO@sha256:... -> ref, digest
 *   KA_IMAGES_BUILD     arg = rootfs dir, name (optional) -> ref, digest
 *   KA_IMAGES_RM        arg = ref -> status
 * err is 0 or a negative errno-style code, message says why ("" on success). A request with a
 * wrong body size or an unterminated string gets -EINVAL.
 */
#ifndef KA_IMAGES_ACTOR_H
#define KA_IMAGES_ACTOR_H

#include <stddef.h>
#include <stdint.h>

#include "krt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registered name of the node's images actor (by convention of its spawner). */
#define KA_IMAGES_NAME "images"

#define KA_IMAGES_ARG_LEN     1024 /* refs and paths */
#define KA_IMAGES_IMGNAME_LEN 256
#define KA_IMAGES_MESSAGE_LEN 512

enum {
    KA_IMAGES_MSG_BASE = 0x4900,
    KA_IMAGES_PREPARE,
    KA_IMAGES_RESOLVE,
    KA_IMAGES_VERIFY,
    KA_IMAGES_IMPORT,
    KA_IMAGES_PULL,
    KA_IMAGES_BUILD,
    KA_IMAGES_RM,
    KA_IMAGES_MSG_LAST_
};

/* Request body (every type). */
typedef struct ka_images_req {
    char arg[KA_IMAGES_ARG_LEN];      /* ref, path or rootfs dir (see above) */
    char name[KA_IMAGES_IMGNAME_LEN]; /* IMPORT/BUILD: image name, "" = default */
} ka_images_req_t;

/* Reply body (every type). */
typedef struct ka_images_reply {
    int32_t err;                         /* 0 or a negative errno-style code */
    char message[KA_IMAGES_MESSAGE_LEN]; /* "" on success */
    char digest[72];                     /* manifest digest, when known */
    char ref[KA_IMAGES_ARG_LEN];         /* IMPORT/PULL/BUILD: NAME@sha256:... */
    char path[KA_IMAGES_ARG_LEN];        /* PREPARE: the rootfs directory */
} ka_images_reply_t;

/* Spawn argument; borrowed only during init. */
typedef struct ka_images_actor_args {
    const char *state_dir;      /* the store lives in <state_dir>/images */
    const char *const *mirrors; /* "REGISTRY=URL" entries */
    size_t n_mirrors;
} ka_images_actor_args_t;

/* The behaviour: spawn with a ka_images_actor_args_t (init fails with -EINVAL without one, or
 * with the store's error if it cannot be opened). */
extern const krt_behaviour_t ka_images_behaviour;

#ifdef __cplusplus
}
#endif
#endif /* KA_IMAGES_ACTOR_H */
