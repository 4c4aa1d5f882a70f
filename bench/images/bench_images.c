/*
 * bench_images: times the image store on a source tree.
 *
 *   bench_images WORK_DIR SOURCE_ROOTFS [CACHED_ITERATIONS]
 *
 * Builds an image of SOURCE_ROOTFS in WORK_DIR/a, imports that store (an OCI layout) into
 * WORK_DIR/b, unpacks its layer with ka_layer_unpack and with `tar -x` in the same run, then
 * prepares its rootfs (first: unpack into the cache; then cached). Prints a table and BENCH
 * lines. WORK_DIR is left for the caller to remove.
 */
#include "images.h"
#include "images_int.h"
#include "krt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static ka_images_t *s_open(const char *dir)
{
    ka_images_opts_t o = {.state_dir = dir};
    ka_images_t *img = ka_images_new(&o);
    if (!img) {
        fprintf(stderr, "bench_images: %s\n", ka_images_last_error());
        exit(1);
    }
    return img;
}

static void s_check(int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "bench_images: %s: %s\n", what, ka_images_last_error());
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_images WORK_DIR SOURCE_ROOTFS [CACHED_ITERATIONS]\n");
        return 2;
    }
    const char *work = argv[1], *src = argv[2];
    int iters = argc > 3 ? atoi(argv[3]) : 1000;
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    char *sa = ka_strfmt("%s/a", work), *sb = ka_strfmt("%s/b", work);
    ka_images_t *a = s_open(sa), *b = s_open(sb);

    char *ref = NULL;
    double t0 = s_now();
    s_check(ka_images_build(a, src, "bench/src", &ref), "build");
    double t_build = s_now() - t0;

    char digest[72];
    s_check(ka_images_resolve(a, ref, digest), "resolve");
    char *layout = ka_strfmt("%s/images", sa);
    char *ref_b = NULL;
    t0 = s_now();
    s_check(ka_images_import(b, layout, NULL, &ref_b), "import");
    double t_import = s_now() - t0;

    /* the single layer's blob: the only blob bigger than a manifest or config */
    ka_image_info_t *info = NULL;
    size_t n = 0;
    s_check(ka_images_list(b, &info, &n), "list");
    double mb = (double)info[0].size / 1e6;
    ka_images_list_free(info, n);
    char *blob = NULL;
    {
        char *cmd = ka_strfmt("ls -S %s/images/blobs/sha256 | head -1", sb);
        FILE *p = popen(cmd, "r");
        char line[128] = "";
        if (!p || !fgets(line, sizeof line, p)) {
            fprintf(stderr, "bench_images: cannot find the layer blob\n");
            return 1;
        }
        pclose(p);
        line[strcspn(line, "\n")] = '\0';
        blob = ka_strfmt("%s/images/blobs/sha256/%s", sb, line);
        free(cmd);
    }

    /* unpack: ours vs tar -x, same layer, same run, both without fsync */
    char *d1 = ka_strfmt("%s/unpack-ours", work), *d2 = ka_strfmt("%s/unpack-tar", work);
    t0 = s_now();
    s_check(ka_layer_unpack(blob, d1, NULL), "unpack");
    double t_ours = s_now() - t0;
    mkdir(d2, 0755);
    char *cmd = ka_strfmt("tar --numeric-owner -xpf %s -C %s", blob, d2);
    t0 = s_now();
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_images: tar -x failed\n");
        return 1;
    }
    double t_tar = s_now() - t0;

    /* rootfs: first preparation (unpack into the cache, synced), then cached */
    char *root = NULL;
    t0 = s_now();
    s_check(ka_images_rootfs(b, ref_b, &root), "rootfs");
    double t_first = s_now() - t0;
    t0 = s_now();
    for (int i = 0; i < iters; i++) {
        char *r = NULL;
        s_check(ka_images_rootfs(b, ref_b, &r), "rootfs cached");
        free(r);
    }
    double t_cached = (s_now() - t0) / iters;

    printf("%-34s %12s\n", "figure", "value");
    printf("%-34s %9.1f MB\n", "layer size", mb);
    printf("%-34s %9.1f MB/s\n", "build (tar + sha256 + store)", mb / t_build);
    printf("%-34s %9.1f MB/s\n", "import (copy + verify + check)", mb / t_import);
    printf("%-34s %9.1f MB/s\n", "unpack (ka_layer_unpack)", mb / t_ours);
    printf("%-34s %9.1f MB/s\n", "unpack (tar -x, same layer)", mb / t_tar);
    printf("%-34s %9.2f ms\n", "rootfs, first (unpack + syncfs)", t_first * 1e3);
    printf("%-34s %9.4f ms\n", "rootfs, cached", t_cached * 1e3);
    printf("BENCH name=images_build_mbps value=%.1f unit=MB/s\n", mb / t_build);
    printf("BENCH name=images_import_mbps value=%.1f unit=MB/s\n", mb / t_import);
    printf("BENCH name=images_unpack_mbps value=%.1f unit=MB/s peer=tar_x peer_value=%.1f "
           "ratio=%.2f\n",
           mb / t_ours, mb / t_tar, t_tar / t_ours);
    printf("BENCH name=images_rootfs_first_ms value=%.2f unit=ms\n", t_first * 1e3);
    printf("BENCH name=images_rootfs_cached_ms value=%.4f unit=ms\n", t_cached * 1e3);

    ka_images_destroy(&a);
    ka_images_destroy(&b);
    free(sa), free(sb), free(ref), free(ref_b), free(layout), free(blob), free(d1), free(d2);
    free(cmd), free(root);
    return 0;
}
