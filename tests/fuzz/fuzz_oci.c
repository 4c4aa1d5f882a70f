/*
 * fuzz_oci: an image archive as `kagentd image import FILE` and the ImportImage RPC receive it:
 * the bytes are written to a file and imported with ka_images_import into a fresh store. That
 * runs the safe tar unpacker on the archive (path checks, links, device nodes, compression),
 * then an OCI layout's index.json/manifests/configs or a docker-archive's manifest.json and
 * config, and the layer check (paths, links, diff_id) of each layer; an accepted image is
 * then prepared (ka_images_rootfs: each layer unpacked and applied, whiteouts included). A
 * refused archive must say why and leave the store's index as it was.
 *
 * The store lives under $FUZZ_TMPDIR, else /dev/shm (fsync is free there), else /tmp.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "images.h"
#include "images_int.h"
#include "krt.h"

static char s_base[256];

static void s_cleanup(void)
{
    if (s_base[0])
        ka_fs_rmtree(s_base);
}

static const char *s_workdir(void)
{
    if (s_base[0])
        return s_base;
    krt_log_configure(KRT_LOG_ERROR, false, stderr);
    const char *parent = getenv("FUZZ_TMPDIR");
    struct stat st;
    if (!parent)
        parent = stat("/dev/shm", &st) == 0 && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(s_base, sizeof s_base, "%s/kagent-fuzz-oci-XXXXXX", parent);
    if (!mkdtemp(s_base))
        abort();
    atexit(s_cleanup);
    return s_base;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *base = s_workdir();
    char archive[300], state[300];
    snprintf(archive, sizeof archive, "%s/input.tar", base);
    snprintf(state, sizeof state, "%s/state", base);
    FILE *f = fopen(archive, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    ka_images_opts_t o = {.state_dir = state};
    ka_images_t *img = ka_images_new(&o);
    if (!img)
        abort();
    char *ref = NULL;
    int rc = ka_images_import(img, archive, "fuzz", &ref);
    if (rc < 0 && (ref || !ka_images_last_error()[0]))
        abort(); /* a refusal says why and returns nothing */
    char *lower = NULL;
    if (rc == 0 && ka_images_rootfs(img, ref, &lower) == 0 && access(lower, F_OK) != 0)
        abort(); /* an accepted image also unpacks (each layer into the cache, then applied) */
    free(lower);
    ka_image_info_t *list = NULL;
    size_t n = 0;
    if (ka_images_list(img, &list, &n) < 0 || (rc < 0 && n != 0))
        abort(); /* a refused archive leaves nothing behind in the index */
    ka_images_list_free(list, n);
    free(ref);
    ka_images_destroy(&img);
    if (ka_fs_rmtree(state) < 0 || unlink(archive) < 0)
        abort();
    return 0;
}
