/*
 * sbx_fixture: shared helpers for the substrate, guest and escape tests: a tiny busybox
 * rootfs built from /bin/busybox, a driver over a private state dir, and blocking exec/file
 * helpers over guestconn. Header-only so each test program stays one file.
 */
#ifndef SBX_FIXTURE_H
#define SBX_FIXTURE_H

#include "guestconn.h"
#include "ka_namespaces.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SBX_GUEST_PATH
#error "SBX_GUEST_PATH must point at the built kagent-sandbox-guest"
#endif

/* Builds a rootfs at root from /bin/busybox (a symlink per applet, via /usr/bin/busybox as the
 * host's --install makes them). 0 or -1 (message printed). */
static inline int sbx_make_rootfs(const char *root)
{
    if (strlen(root) > 256)
        return -1;
    static char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "set -e; test -x /bin/busybox; mkdir -p '%s/bin' '%s/etc' '%s/usr/bin' '%s/sbin' "
             "'%s/dev' '%s/proc' '%s/tmp'; "
             "cp /bin/busybox '%s/bin/busybox'; cd '%s/bin'; "
             "/bin/busybox --install -s '%s/bin'; ln -sf /bin/busybox '%s/usr/bin/busybox'; echo "
             "'root:x:0:0:root:/root:/bin/sh' > '%s/etc/passwd'; "
             "echo 'sandbox:x:65532:65532::/data/workspace:/bin/sh' >> '%s/etc/passwd'; "
             "echo 'image-layer-secret' > '%s/etc/layer-file'",
             root, root, root, root, root, root, root, root, root, root, root, root, root, root);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot build the busybox rootfs in %s (is busybox-static installed?)\n",
                root);
        return -1;
    }
    return 0;
}

typedef struct sbx_out {
    char *out, *err;
    size_t out_len, err_len;
    size_t out_cap, err_cap;
} sbx_out_t;

static inline void sbx_out_cb(void *user, const char *key, const char *data, size_t len,
                              uint64_t offset)
{
    (void)offset;
    sbx_out_t *o = user;
    bool is_err = key[3] == 'e'; /* "stderr" vs "stdout"/"chunk" */
    char **buf = is_err ? &o->err : &o->out;
    size_t *n = is_err ? &o->err_len : &o->out_len;
    size_t *cap = is_err ? &o->err_cap : &o->out_cap;
    if (*n + len + 1 > *cap) { /* grow geometrically: 64 MiB arrive in 256 KiB chunks */
        size_t c = *cap ? *cap : 4096;
        while (c < *n + len + 1)
            c *= 2;
        *buf = realloc(*buf, c);
        *cap = c;
    }
    memcpy(*buf + *n, data, len);
    *n += len;
    (*buf)[*n] = 0;
}

static inline void sbx_out_free(sbx_out_t *o)
{
    free(o->out);
    free(o->err);
    memset(o, 0, sizeof(*o));
}

/* Starts argv and follows its output to the end in one request (start with follow).
 * Returns the exit code, or a negative error. */
static inline int sbx_run(ka_guestconn_t *gc, const char *const *argv, sbx_out_t *o,
                          uint64_t timeout_ms)
{
    ka_gp_start_t st = {.argv = argv, .timeout_ms = timeout_ms, .follow = true};
    uint64_t id;
    ka_gp_frame_t *f = NULL;
    ka_gp_process_t p;
    memset(o, 0, sizeof(*o));
    if (ka_guestconn_start(gc, &st, &id) < 0)
        return -ENOMEM;
    int rc = ka_guestconn_call(gc, id, 60000, sbx_out_cb, o, &f);
    if (rc < 0) {
        ka_gp_frame_free(&f);
        return rc;
    }
    rc = ka_gp_frame_process(f, &p);
    ka_gp_frame_free(&f);
    if (rc == 0 && p.state != KA_GP_STATE_EXITED)
        rc = -EPROTO;
    return rc < 0 ? rc : (int)p.exit_code;
}

/* sh -c script; returns exit code; output in o. */
static inline int sbx_sh(ka_guestconn_t *gc, const char *script, sbx_out_t *o)
{
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    int rc = sbx_run(gc, argv, o, 0);
    if (getenv("SBX_VERBOSE"))
        fprintf(stderr, "--- sh: %s\n--- rc=%d\n--- out:\n%s--- err:\n%s---\n", script, rc,
                o->out ? o->out : "", o->err ? o->err : "");
    return rc;
}

#endif
