/*
 * Unit tests for actors/images: build/import/verify/unpack round trips with images made here,
 * whiteouts and opaque directories, and refusals (tampered blob, wrong digest, path traversal,
 * symlink escape, truncated tar) that must leave the store unchanged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "images.h"
#include "images_actor.h"
#include "images_cli.h"
#include "images_int.h"
#include "krt.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* Every temp dir made, removed by the group teardown even when a test failed half-way. */
static char *s_made[32];
static size_t s_n_made;

static char *s_mktemp(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *p = ka_strfmt("%s/ka-images-test.XXXXXX", base);
    assert_non_null(p);
    assert_non_null(mkdtemp(p));
    assert_true(s_n_made < sizeof s_made / sizeof *s_made);
    s_made[s_n_made++] = strdup(p);
    return p;
}

static int s_teardown(void **unused)
{
    for (size_t i = 0; i < s_n_made; i++) {
        ka_fs_rmtree(s_made[i]);
        free(s_made[i]);
    }
    s_n_made = 0;
    return 0;
}

static ka_images_t *s_store(const char *state)
{
    ka_images_opts_t o = {.state_dir = state};
    ka_images_t *img = ka_images_new(&o);
    assert_non_null(img);
    return img;
}

static void s_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static char *s_read(const char *path, size_t *len)
{
    char *buf = NULL;
    assert_int_equal(ka_fs_read_file(path, 64u << 20, &buf, len), 0);
    return buf;
}

/* A tar entry: 'f' file (data), 'd' dir, 'l' symlink (data = target), 'h' hard link (data =
 * target), 'c' character device. */
typedef struct tent {
    char type;
    const char *name;
    const char *data;
    int mode;
} tent_t;

typedef struct layer {
    const char *filter; /* NULL, "gzip" or "zstd" */
    const tent_t *e;
    size_t n;
} layer_t;

/* Writes the tar of l (with or without its filter) into a malloc'd buffer. */
static char *s_tar(const layer_t *l, bool filtered, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    assert_non_null(f);
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    if (filtered && l->filter && !strcmp(l->filter, "gzip"))
        assert_int_equal(archive_write_add_filter_gzip(a), ARCHIVE_OK);
    else if (filtered && l->filter && !strcmp(l->filter, "zstd"))
        assert_int_equal(archive_write_add_filter_zstd(a), ARCHIVE_OK);
    archive_write_set_bytes_in_last_block(a, 1); /* no zero padding after the stream */
    assert_int_equal(archive_write_open_FILE(a, f), ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    for (size_t i = 0; i < l->n; i++) {
        const tent_t *t = &l->e[i];
        archive_entry_clear(e);
        archive_entry_set_pathname(e, t->name);
        archive_entry_set_mtime(e, 1000, 0);
        archive_entry_set_perm(e, t->mode ? (mode_t)t->mode : 0644);
        size_t dl = 0;
        switch (t->type) {
        case 'f':
            archive_entry_set_filetype(e, AE_IFREG);
            dl = strlen(t->data);
            archive_entry_set_size(e, (la_int64_t)dl);
            break;
        case 'd':
            archive_entry_set_filetype(e, AE_IFDIR);
            archive_entry_set_perm(e, t->mode ? (mode_t)t->mode : 0755);
            break;
        case 'l':
            archive_entry_set_filetype(e, AE_IFLNK);
            archive_entry_set_symlink(e, t->data);
            break;
        case 'h':
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_hardlink(e, t->data);
            break;
        case 'c':
            archive_entry_set_filetype(e, AE_IFCHR);
            archive_entry_set_rdev(e, makedev(1, 3));
            break;
        default:
            fail();
        }
        assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
        if (dl)
            assert_int_equal(archive_write_data(a, t->data, dl), (la_ssize_t)dl);
    }
    archive_entry_free(e);
    assert_int_equal(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    fclose(f);
    return buf;
}

/* Writes a blob into dir/blobs/sha256 and returns its digest in d. */
static void s_put_blob(const char *dir, const void *data, size_t len, char d[KA_DIGEST_LEN])
{
    ka_sha256_buf(data, len, d);
    char *p = ka_strfmt("%s/blobs/sha256/%s", dir, ka_digest_hex(d));
    s_write(p, data, len);
    free(p);
}

typedef struct layout_opts {
    size_t truncate_last; /* cut this many bytes off the last layer before hashing it */
    size_t keep_last;     /* or keep only this many bytes of it */
    bool bad_diff_id;     /* the config lies about the last layer's diff_id */
} layout_opts_t;

/* Makes an OCI image layout in dir (created) holding one image named name. */
static void s_layout(const char *dir, const char *name, const layer_t *layers, size_t n,
                     const layout_opts_t *o, char mdigest[KA_DIGEST_LEN])
{
    char *b = ka_strfmt("%s/blobs/sha256", dir);
    assert_int_equal(ka_fs_mkdir_p(b), 0);
    free(b);
    char diff[8][KA_DIGEST_LEN], dig[8][KA_DIGEST_LEN];
    size_t sizes[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        size_t rawlen = 0, len = 0;
        char *raw = s_tar(&layers[i], false, &rawlen);
        char *blob = s_tar(&layers[i], true, &len);
        if (o && i == n - 1 && (o->truncate_last || o->keep_last)) {
            assert_true(len > o->truncate_last && len > o->keep_last);
            len = o->keep_last ? o->keep_last : len - o->truncate_last;
            if (!layers[i].filter)
                rawlen = len;
        }
        ka_sha256_buf(raw, rawlen, diff[i]);
        if (o && o->bad_diff_id && i == n - 1)
            ka_sha256_buf("lie", 3, diff[i]);
        s_put_blob(dir, blob, len, dig[i]);
        sizes[i] = len;
        free(raw);
        free(blob);
    }
    char cfg[4096], man[4096], idx[1024];
    int off = snprintf(cfg, sizeof cfg,
                       "{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{\"type\":"
                       "\"layers\",\"diff_ids\":[");
    for (size_t i = 0; i < n; i++)
        off += snprintf(cfg + off, sizeof cfg - (size_t)off, "%s\"%s\"", i ? "," : "", diff[i]);
    snprintf(cfg + off, sizeof cfg - (size_t)off, "]}}");
    char cd[KA_DIGEST_LEN];
    s_put_blob(dir, cfg, strlen(cfg), cd);
    off = snprintf(man, sizeof man,
                   "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+"
                   "json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\","
                   "\"digest\":\"%s\",\"size\":%zu},\"layers\":[",
                   cd, strlen(cfg));
    for (size_t i = 0; i < n; i++)
        off += snprintf(man + off, sizeof man - (size_t)off,
                        "%s{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar%s\","
                        "\"digest\":\"%s\",\"size\":%zu}",
                        i ? "," : "",
                        layers[i].filter ? (!strcmp(layers[i].filter, "gzip") ? "+gzip" : "+zstd")
                                         : "",
                        dig[i], sizes[i]);
    snprintf(man + off, sizeof man - (size_t)off, "]}");
    s_put_blob(dir, man, strlen(man), mdigest);
    snprintf(idx, sizeof idx,
             "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image."
             "manifest.v1+json\",\"digest\":\"%s\",\"size\":%zu,\"annotations\":{\"org."
             "opencontainers.image.ref.name\":\"%s\"}}]}",
             mdigest, strlen(man), name);
    char *p = ka_strfmt("%s/index.json", dir);
    s_write(p, idx, strlen(idx));
    free(p);
    p = ka_strfmt("%s/oci-layout", dir);
    s_write(p, "{\"imageLayoutVersion\":\"1.0.0\"}", 30);
    free(p);
}

/* A listing of every file below dir with sizes, plus index.json's content: equal snapshots
 * mean an unchanged store. */
static void s_snap_walk(const char *dir, const char *rel, FILE *out)
{
    char *full = rel[0] ? ka_strfmt("%s/%s", dir, rel) : strdup(dir);
    DIR *d = opendir(full);
    assert_non_null(d);
    struct dirent *de;
    char *names[4096];
    size_t n = 0;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && n < 4096)
            names[n++] = strdup(de->d_name);
    closedir(d);
    for (size_t i = 0; i < n; i++)
        for (size_t k = i + 1; k < n; k++)
            if (strcmp(names[i], names[k]) > 0) {
                char *t = names[i];
                names[i] = names[k];
                names[k] = t;
            }
    for (size_t i = 0; i < n; i++) {
        char *r = rel[0] ? ka_strfmt("%s/%s", rel, names[i]) : strdup(names[i]);
        char *p = ka_strfmt("%s/%s", dir, r);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        fprintf(out, "%s %o %lld\n", r, st.st_mode,
                S_ISDIR(st.st_mode) ? 0LL : (long long)st.st_size);
        if (S_ISDIR(st.st_mode))
            s_snap_walk(dir, r, out);
        free(r);
        free(p);
        free(names[i]);
    }
    free(full);
}

static char *s_snapshot(const char *state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char *root = ka_strfmt("%s/images", state);
    s_snap_walk(root, "", f);
    char *ip = ka_strfmt("%s/index.json", root);
    struct stat st;
    if (stat(ip, &st) == 0) {
        size_t n = 0;
        char *idx = s_read(ip, &n);
        fputs(idx, f);
        free(idx);
    }
    free(ip);
    free(root);
    fclose(f);
    return buf;
}

static bool s_exists(const char *dir, const char *rel)
{
    char *p = ka_strfmt("%s/%s", dir, rel);
    struct stat st;
    bool ok = lstat(p, &st) == 0;
    free(p);
    return ok;
}

static char *s_file(const char *dir, const char *rel)
{
    char *p = ka_strfmt("%s/%s", dir, rel);
    size_t n = 0;
    char *b = s_read(p, &n);
    free(p);
    return b;
}

/* A busybox root file system (busybox-static must be installed: the test fails without it). */
static char *s_busybox_rootfs(const char *base)
{
    char *root = ka_strfmt("%s/bbroot", base);
    char *bin = ka_strfmt("%s/bin", root);
    assert_int_equal(ka_fs_mkdir_p(bin), 0);
    size_t n = 0;
    char *bb = s_read("/bin/busybox", &n);
    assert_true(n > 100000);
    char *p = ka_strfmt("%s/busybox", bin);
    s_write(p, bb, n);
    assert_int_equal(chmod(p, 0755), 0);
    free(p);
    free(bb);
    p = ka_strfmt("%s/sh", bin);
    assert_int_equal(symlink("busybox", p), 0);
    free(p);
    p = ka_strfmt("%s/ls", bin);
    assert_int_equal(symlink("/bin/busybox", p), 0);
    free(p);
    p = ka_strfmt("%s/etc", root);
    assert_int_equal(mkdir(p, 0755), 0);
    free(p);
    p = ka_strfmt("%s/etc/passwd", root);
    s_write(p, "root:x:0:0::/:/bin/sh\n", 22);
    char *p2 = ka_strfmt("%s/etc/passwd-link", root);
    assert_int_equal(link(p, p2), 0);
    free(p2);
    free(p);
    p = ka_strfmt("%s/home", root);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(chown(p, 1234, 5678), 0);
    free(p);
    p = ka_strfmt("%s/null", root);
    assert_int_equal(mknod(p, S_IFCHR | 0666, makedev(1, 3)), 0); /* left out of the image */
    free(p);
    free(bin);
    return root;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_build_and_rootfs(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    char *src = s_busybox_rootfs(tmp);
    ka_images_t *img = s_store(state);

    char *ref1 = NULL, *ref2 = NULL;
    assert_int_equal(ka_images_build(img, src, "test/busybox", &ref1), 0);
    assert_int_equal(ka_images_build(img, src, "test/busybox", &ref2), 0);
    assert_string_equal(ref1, ref2); /* deterministic */
    assert_memory_equal(ref1, "test/busybox@sha256:", 20);
    assert_true(ka_digest_valid(strchr(ref1, '@') + 1));

    struct stat rst;
    char *store_root = ka_strfmt("%s/images", state);
    assert_int_equal(stat(store_root, &rst), 0);
    assert_int_equal(rst.st_mode & 0777, 0700); /* host users cannot reach setuid files */
    free(store_root);
    char digest[72];
    assert_int_equal(ka_images_resolve(img, "test/busybox", digest), 0);
    assert_string_equal(digest, strchr(ref1, '@') + 1);
    assert_int_equal(ka_images_resolve(img, digest, digest), 0);
    assert_int_equal(ka_images_resolve(img, "nope", digest), -ENOENT);
    assert_int_equal(ka_images_verify(img, ref1), 0);

    char *root = NULL, *again = NULL;
    assert_int_equal(ka_images_rootfs(img, ref1, &root), 0);
    assert_int_equal(ka_images_rootfs(img, "test/busybox", &again), 0);
    assert_string_equal(root, again);

    /* content, symlinks, hard links, owners and modes survive; the device node does not */
    size_t n1 = 0, n2 = 0;
    char *a = s_read("/bin/busybox", &n1);
    char *bp = ka_strfmt("%s/bin/busybox", root);
    char *b = s_read(bp, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    struct stat st, st2;
    assert_int_equal(stat(bp, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0755);
    char lt[64] = "";
    char *lp = ka_strfmt("%s/bin/ls", root);
    assert_true(readlink(lp, lt, sizeof lt - 1) > 0);
    assert_string_equal(lt, "/bin/busybox");
    char *hp1 = ka_strfmt("%s/etc/passwd", root), *hp2 = ka_strfmt("%s/etc/passwd-link", root);
    assert_int_equal(stat(hp1, &st), 0);
    assert_int_equal(stat(hp2, &st2), 0);
    assert_int_equal(st.st_ino, st2.st_ino);
    char *home = ka_strfmt("%s/home", root);
    assert_int_equal(stat(home, &st), 0);
    assert_int_equal(st.st_uid, 1234);
    assert_int_equal(st.st_gid, 5678);
    assert_int_equal(st.st_mode & 07777, 0700);
    assert_false(s_exists(root, "null"));

    /* the list shows it once with one layer */
    ka_image_info_t *v = NULL;
    size_t n = 0;
    assert_int_equal(ka_images_list(img, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].name, "test/busybox");
    assert_int_equal(v[0].layers, 1);
    assert_true(v[0].size > n1);
    ka_images_list_free(v, n);

    /* the store is an OCI layout: it imports into another store with the same digest */
    char *state2 = ka_strfmt("%s/state2", tmp);
    ka_images_t *img2 = s_store(state2);
    char *ref3 = NULL;
    char *layout = ka_strfmt("%s/images", state);
    assert_int_equal(ka_images_import(img2, layout, NULL, &ref3), 0);
    assert_string_equal(ref3, ref1);

    /* rm removes the image and everything only it used */
    assert_int_equal(ka_images_rm(img, "test/busybox"), 0);
    assert_int_equal(ka_images_resolve(img, "test/busybox", digest), -ENOENT);
    char *blobs = ka_strfmt("%s/images/blobs/sha256", state);
    DIR *d = opendir(blobs);
    int left = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        left += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(left, 0);
    assert_false(s_exists(root, ""));
    assert_int_equal(ka_images_rm(img, "test/busybox"), -ENOENT);

    ka_images_destroy(&img);
    ka_images_destroy(&img);
    ka_images_destroy(&img2);
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(a), free(b), free(bp), free(lp), free(hp1), free(hp2), free(home), free(blobs);
    free(ref1), free(ref2), free(ref3), free(root), free(again), free(layout), free(state2);
    free(src), free(state), free(tmp);
}

static void test_layers_whiteouts(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    char *dir = ka_strfmt("%s/layout", tmp);
    const tent_t l1[] = {
        {'d', "a/", NULL, 0},          {'f', "a/x", "x1", 0},       {'f', "a/y", "y1", 0},
        {'d', "b", NULL, 0},           {'f', "b/z", "z1", 0},       {'d', "./c/", NULL, 0},
        {'f', "./c/1", "c1", 0},       {'f', "d", "d1", 0},         {'l', "lnk", "/etc", 0},
        {'f', "hl-src", "same", 0600}, {'h', "hl-dst", "hl-src", 0}};
    const tent_t l2[] = {
        {'f', "a/.wh.x", "", 0}, {'f', ".wh.b", "", 0},       {'f', "c/.wh..wh..opq", "", 0},
        {'f', "c/2", "c2", 0},   {'f', "d", "d2", 0},         {'c', "dev-null", NULL, 0},
        {'d', "lnk", NULL, 0},   {'f', "lnk/inside", "ok", 0}};
    const layer_t layers[] = {{"gzip", l1, sizeof l1 / sizeof *l1},
                              {"zstd", l2, sizeof l2 / sizeof *l2}};
    char md[KA_DIGEST_LEN];
    s_layout(dir, "multi:1", layers, 2, NULL, md);

    ka_images_t *img = s_store(state);
    char *ref = NULL, *root = NULL;
    assert_int_equal(ka_images_import(img, dir, NULL, &ref), 0);
    char *want = ka_strfmt("multi:1@%s", md);
    assert_string_equal(ref, want);
    assert_int_equal(ka_images_rootfs(img, md, &root), 0);
    assert_non_null(strstr(root, "/images/rootfs/"));
    assert_true(s_exists(root, "a/y"));
    assert_false(s_exists(root, "a/x"));
    assert_false(s_exists(root, "a/.wh.x"));
    assert_false(s_exists(root, "b"));
    assert_false(s_exists(root, ".wh.b"));
    assert_false(s_exists(root, "c/1"));
    assert_true(s_exists(root, "c/2"));
    assert_false(s_exists(root, "c/.wh..wh..opq"));
    assert_false(s_exists(root, "dev-null"));
    char *d = s_file(root, "d");
    assert_string_equal(d, "d2");
    char *in = s_file(root, "lnk/inside"); /* the directory replaced the symlink */
    assert_string_equal(in, "ok");
    struct stat st1, st2;
    char *h1 = ka_strfmt("%s/hl-src", root), *h2 = ka_strfmt("%s/hl-dst", root);
    assert_int_equal(stat(h1, &st1), 0);
    assert_int_equal(stat(h2, &st2), 0);
    assert_int_equal(st1.st_ino, st2.st_ino);
    assert_int_equal(st1.st_mode & 07777, 0600);
    assert_false(s_exists("/etc", "inside"));

    /* a second preparation is a cache hit */
    char *again = NULL;
    assert_int_equal(ka_images_rootfs(img, "multi:1", &again), 0);
    assert_string_equal(root, again);
    assert_int_equal(ka_images_verify(img, "multi:1"), 0);

    ka_images_destroy(&img);
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(d), free(in), free(h1), free(h2), free(again), free(want);
    free(ref), free(root), free(dir), free(state), free(tmp);
}

/* Imports a layout that must be refused with code and message fragment, store unchanged. */
static void s_refused(const char *state, const char *path, int code, const char *fragment)
{
    char *before = s_snapshot(state);
    ka_images_t *img = s_store(state);
    char *ref = NULL;
    int rc = ka_images_import(img, path, NULL, &ref);
    if (rc != code || !strstr(ka_images_last_error(), fragment))
        fail_msg("import %s: rc=%d (want %d) msg='%s' (want '%s')", path, rc, code,
                 ka_images_last_error(), fragment);
    assert_null(ref);
    ka_images_destroy(&img);
    char *after = s_snapshot(state);
    assert_string_equal(before, after);
    free(before);
    free(after);
}

static void test_refusals(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    /* a valid image first, so "unchanged" compares a non-empty store */
    const tent_t ok[] = {{'d', "etc", NULL, 0}, {'f', "etc/hostname", "sandbox\n", 0}};
    const layer_t okl = {NULL, ok, 2};
    char md[KA_DIGEST_LEN];
    char *good = ka_strfmt("%s/good", tmp);
    s_layout(good, "good", &okl, 1, NULL, md);
    ka_images_t *img = s_store(state);
    assert_int_equal(ka_images_import(img, good, NULL, NULL), 0);
    ka_images_destroy(&img);

    /* tampered blob: one byte of the layer changed after the manifest was written */
    char *tampered = ka_strfmt("%s/tampered", tmp);
    const layer_t gz = {"gzip", ok, 2};
    s_layout(tampered, "tampered", &gz, 1, NULL, md);
    {
        char *bdir = ka_strfmt("%s/blobs/sha256", tampered);
        DIR *d = opendir(bdir);
        struct dirent *de;
        bool done = false;
        while (!done && (de = readdir(d)) != NULL) {
            char *p = ka_strfmt("%s/%s", bdir, de->d_name);
            struct stat st;
            if (de->d_name[0] != '.' && stat(p, &st) == 0 && st.st_size > 60) {
                size_t n = 0;
                char *b = s_read(p, &n);
                if ((unsigned char)b[0] == 0x1f) { /* the gzip layer */
                    b[n - 10] ^= 0x55;
                    s_write(p, b, n);
                    done = true;
                }
                free(b);
            }
            free(p);
        }
        closedir(d);
        free(bdir);
        assert_true(done);
    }
    s_refused(state, tampered, -EBADMSG, "digest mismatch");

    /* wrong digest: the config's diff_id does not match the uncompressed layer */
    char *baddiff = ka_strfmt("%s/baddiff", tmp);
    layout_opts_t lie = {.bad_diff_id = true};
    s_layout(baddiff, "baddiff", &gz, 1, &lie, md);
    s_refused(state, baddiff, -EBADMSG, "config says");

    /* path traversal */
    const tent_t trav[] = {{'f', "etc/../../evil", "x", 0}};
    const layer_t travl = {NULL, trav, 1};
    char *travd = ka_strfmt("%s/trav", tmp);
    s_layout(travd, "trav", &travl, 1, NULL, md);
    s_refused(state, travd, -EBADMSG, "'..'");

    const tent_t abs[] = {{'f', "/etc/evil", "x", 0}};
    const layer_t absl = {"zstd", abs, 1};
    char *absd = ka_strfmt("%s/abs", tmp);
    s_layout(absd, "abs", &absl, 1, NULL, md);
    s_refused(state, absd, -EBADMSG, "absolute");

    /* symlink escape: a symlink to / and a file written through it */
    const tent_t esc[] = {{'l', "escape", "/", 0}, {'f', "escape/tmp/evil", "x", 0}};
    const layer_t escl = {NULL, esc, 2};
    char *escd = ka_strfmt("%s/esc", tmp);
    s_layout(escd, "esc", &escl, 1, NULL, md);
    s_refused(state, escd, -EBADMSG, "symlink");

    /* hard link out of the layer */
    const tent_t hl[] = {{'h', "passwd", "../../etc/passwd", 0}};
    const layer_t hll = {NULL, hl, 1};
    char *hld = ka_strfmt("%s/hl", tmp);
    s_layout(hld, "hl", &hll, 1, NULL, md);
    s_refused(state, hld, -EBADMSG, "'..'");

    /* hard link to something the layer does not hold */
    const tent_t hl2[] = {{'d', "etc", NULL, 0}, {'h', "passwd", "etc/shadow", 0}};
    const layer_t hl2l = {"gzip", hl2, 2};
    char *hl2d = ka_strfmt("%s/hl2", tmp);
    s_layout(hl2d, "hl2", &hl2l, 1, NULL, md);
    s_refused(state, hl2d, -EBADMSG, "not an earlier file");
    free(hl2d);

    /* truncated tar (digests recomputed over the truncated bytes, so only the content check
     * can catch it), uncompressed and gzip */
    const tent_t big[] = {{'f', "data",
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef"
                           "0123456789abcdef0123456789abcdef0123456789abcdef",
                           0},
                          {'f', "more", "tail", 0}};
    const layer_t bigl = {NULL, big, 2};
    char *trunc = ka_strfmt("%s/trunc", tmp);
    layout_opts_t cut = {.keep_last = 512 + 300}; /* mid-way through "data" */
    s_layout(trunc, "trunc", &bigl, 1, &cut, md);
    s_refused(state, trunc, -EBADMSG, "truncated");
    const layer_t bigz = {"gzip", big, 2};
    char *truncz = ka_strfmt("%s/truncz", tmp);
    layout_opts_t cutz = {.truncate_last = 20};
    s_layout(truncz, "truncz", &bigz, 1, &cutz, md);
    s_refused(state, truncz, -EBADMSG, "");

    /* a truncated tarball of a good layout, and things that are not images */
    char *tarball = ka_strfmt("%s/good.tar", tmp);
    {
        char *cmd = ka_strfmt("tar -C %s -cf %s . && truncate -s -3000 %s", good, tarball, tarball);
        assert_int_equal(system(cmd), 0);
        free(cmd);
    }
    s_refused(state, tarball, -EBADMSG, "truncated");
    s_refused(state, tmp, -EINVAL, "neither");
    char *missing = ka_strfmt("%s/missing", tmp);
    s_refused(state, missing, -ENOENT, "missing");

    /* after all that, the good image is intact and alone */
    img = s_store(state);
    ka_image_info_t *v = NULL;
    size_t n = 0;
    assert_int_equal(ka_images_list(img, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].name, "good");
    assert_int_equal(ka_images_verify(img, "good"), 0);
    ka_images_list_free(v, n);

    /* verify notices a blob changed inside the store */
    char digest[72];
    assert_int_equal(ka_images_resolve(img, "good", digest), 0);
    char *mp = ka_strfmt("%s/images/blobs/sha256/%s", state, ka_digest_hex(digest));
    size_t ml = 0;
    char *m = s_read(mp, &ml);
    s_write(mp, m, ml - 1);
    assert_int_equal(ka_images_verify(img, "good"), -EBADMSG);
    s_write(mp, m, ml);
    assert_int_equal(ka_images_verify(img, "good"), 0);
    ka_images_destroy(&img);

    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(m), free(mp), free(missing);
    free(tarball), free(trunc), free(truncz), free(hld), free(escd), free(absd), free(travd);
    free(baddiff), free(tampered), free(good), free(state), free(tmp);
}

/* The unpacker itself (not only the import check) never writes through a symlink. */
static void test_unpack_never_follows_symlinks(void **unused)
{
    char *tmp = s_mktemp();
    char *outside = ka_strfmt("%s/outside", tmp);
    assert_int_equal(mkdir(outside, 0755), 0);
    const tent_t esc[] = {{'l', "x", outside, 0}, {'f', "x/evil", "boom", 0}};
    const layer_t l = {NULL, esc, 2};
    size_t len = 0;
    char *tar = s_tar(&l, true, &len);
    char *tp = ka_strfmt("%s/l.tar", tmp);
    s_write(tp, tar, len);
    char *dest = ka_strfmt("%s/dest", tmp);
    assert_int_equal(ka_layer_unpack(tp, dest, NULL), -EBADMSG);
    assert_false(s_exists(outside, "evil"));
    assert_false(s_exists(dest, "")); /* removed on failure */
    assert_int_equal(ka_layer_check(tp, NULL, NULL), -EBADMSG);

    /* device nodes are neutralised, not refused */
    const tent_t dev[] = {{'c', "dev/null", NULL, 0}, {'f', "ok", "1", 0}};
    const layer_t dl = {"gzip", dev, 2};
    free(tar);
    tar = s_tar(&dl, true, &len);
    s_write(tp, tar, len);
    ka_layer_stats_t st;
    assert_int_equal(ka_layer_check(tp, NULL, &st), 0);
    assert_int_equal(ka_layer_unpack(tp, dest, &st), 0);
    assert_int_equal(st.skipped, 1);
    assert_false(s_exists(dest, "dev/null"));
    assert_true(s_exists(dest, "ok"));

    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(tar), free(tp), free(dest), free(outside), free(tmp);
}

/* Two images sharing a layer: removing one keeps what the other needs. */
static void test_rm_keeps_shared(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    const tent_t base[] = {{'f', "base", "b", 0}};
    const tent_t top1[] = {{'f', "one", "1", 0}};
    const tent_t top2[] = {{'f', "two", "2", 0}};
    const layer_t i1[] = {{NULL, base, 1}, {NULL, top1, 1}};
    const layer_t i2[] = {{NULL, base, 1}, {"gzip", top2, 1}};
    char *d1 = ka_strfmt("%s/l1", tmp), *d2 = ka_strfmt("%s/l2", tmp);
    char m1[KA_DIGEST_LEN], m2[KA_DIGEST_LEN];
    s_layout(d1, "one", i1, 2, NULL, m1);
    s_layout(d2, "two", i2, 2, NULL, m2);
    ka_images_t *img = s_store(state);
    assert_int_equal(ka_images_import(img, d1, NULL, NULL), 0);
    assert_int_equal(ka_images_import(img, d2, "renamed/two", NULL), 0);
    char *r1 = NULL, *r2 = NULL;
    assert_int_equal(ka_images_rootfs(img, "one", &r1), 0);
    assert_int_equal(ka_images_rootfs(img, "renamed/two", &r2), 0);
    assert_true(s_exists(r1, "one") && s_exists(r1, "base") && !s_exists(r1, "two"));
    assert_true(s_exists(r2, "two") && s_exists(r2, "base") && !s_exists(r2, "one"));
    /* leftovers of a crashed import: a day-old one is swept by rm, a fresh one is kept */
    char *stale = ka_strfmt("%s/images/tmp/blob.stale", state);
    char *fresh = ka_strfmt("%s/images/tmp/blob.fresh", state);
    s_write(stale, "x", 1);
    s_write(fresh, "y", 1);
    struct timespec old[2] = {{time(NULL) - 2 * 86400, 0}, {time(NULL) - 2 * 86400, 0}};
    assert_int_equal(utimensat(AT_FDCWD, stale, old, 0), 0);
    char *ref = ka_strfmt("one@%s", m1);
    assert_int_equal(ka_images_rm(img, ref), 0);
    assert_int_equal(access(stale, F_OK), -1);
    assert_int_equal(access(fresh, F_OK), 0);
    assert_int_equal(unlink(fresh), 0);
    free(stale), free(fresh);
    assert_false(s_exists(r1, ""));
    assert_true(s_exists(r2, "base"));
    assert_int_equal(ka_images_verify(img, "renamed/two"), 0);
    char *again = NULL;
    assert_int_equal(ka_images_rootfs(img, m2, &again), 0);
    assert_string_equal(again, r2);
    assert_int_equal(ka_images_rm(img, m2), 0);
    char *layers = ka_strfmt("%s/images/layers", state);
    DIR *d = opendir(layers);
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d)) != NULL)
        left += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(left, 0);
    ka_images_destroy(&img);
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(layers), free(again), free(ref), free(r1), free(r2), free(d1), free(d2), free(state);
    free(tmp);
}

typedef struct race {
    ka_images_t *img;
    const char *ref;
    char *out;
    int rc;
} race_t;

static void *s_racer(void *arg)
{
    race_t *r = arg;
    r->rc = ka_images_rootfs(r->img, r->ref, &r->out);
    return NULL;
}

/* Concurrent first preparations of one image agree on one directory. */
static void test_concurrent_rootfs(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    const tent_t a[] = {{'f', "a", "1", 0}};
    const tent_t b[] = {{'f', "b", "2", 0}, {'f', ".wh.a", "", 0}};
    const layer_t ls[] = {{"zstd", a, 1}, {"gzip", b, 2}};
    char *dir = ka_strfmt("%s/l", tmp);
    char md[KA_DIGEST_LEN];
    s_layout(dir, "race", ls, 2, NULL, md);
    ka_images_t *img = s_store(state);
    assert_int_equal(ka_images_import(img, dir, NULL, NULL), 0);
    race_t r[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (race_t){img, "race", NULL, 1};
        assert_int_equal(pthread_create(&th[i], NULL, s_racer, &r[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(r[i].rc, 0);
        assert_string_equal(r[i].out, r[0].out);
    }
    assert_true(s_exists(r[0].out, "b"));
    assert_false(s_exists(r[0].out, "a"));
    char *tmpd = ka_strfmt("%s/images/tmp", state);
    DIR *d = opendir(tmpd);
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d)) != NULL)
        left += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(left, 0); /* losers cleaned up */
    for (int i = 0; i < 4; i++)
        free(r[i].out);
    ka_images_destroy(&img);
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(tmpd), free(dir), free(state), free(tmp);
}

static void test_cli_exit_codes(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    char *a0[] = {"image", NULL};
    assert_int_equal(ka_images_cli(state, 1, a0), 2);
    char *a1[] = {"image", "frobnicate", NULL};
    assert_int_equal(ka_images_cli(state, 2, a1), 2);
    char *a2[] = {"image", "build", NULL};
    assert_int_equal(ka_images_cli(state, 2, a2), 2);
    char *a3[] = {"image", "rm", NULL};
    assert_int_equal(ka_images_cli(state, 2, a3), 2);
    char *a4[] = {"image", "list", "--bogus", NULL};
    assert_int_equal(ka_images_cli(state, 3, a4), 2);
    char *a5[] = {"image", "list", NULL};
    assert_int_equal(ka_images_cli(state, 2, a5), 0);
    char *a6[] = {"image", "rm", "nothing-here", NULL};
    assert_int_equal(ka_images_cli(state, 3, a6), 1);
    char *a7[] = {"image", "pull", "example.com/x:latest", NULL};
    assert_int_equal(ka_images_cli(state, 3, a7), 1);
    char *a8[] = {"image", "import", "--help", NULL};
    assert_int_equal(ka_images_cli(state, 3, a8), 0);
    char *empty = ka_strfmt("%s/empty", tmp);
    assert_int_equal(mkdir(empty, 0755), 0);
    char *a9[] = {"image", "build", "--rootfs", empty, "--name", "cli/empty", NULL};
    assert_int_equal(ka_images_cli(state, 6, a9), 0);
    char *a10[] = {"image", "rootfs", "cli/empty", NULL};
    assert_int_equal(ka_images_cli(state, 3, a10), 0);
    char *a11[] = {"image", "verify", "cli/empty", NULL};
    assert_int_equal(ka_images_cli(state, 3, a11), 0);
    char *a12[] = {"image", "rm", "cli/empty", NULL};
    assert_int_equal(ka_images_cli(state, 3, a12), 0);
    fclose(stdout);
    stdout = saved;
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(empty), free(state), free(tmp);
}

/* This machine's OCI architecture name. */
static const char *s_arch(void)
{
    struct utsname u;
    assert_int_equal(uname(&u), 0);
    return !strcmp(u.machine, "aarch64") ? "arm64" : "amd64";
}

/* An image index (multi-platform) is kept under its own digest; its platform manifest is what
 * gets prepared, verified and collected. */
static void test_image_index(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    char *dir = ka_strfmt("%s/layout", tmp);
    const tent_t f[] = {{'f', "hello", "world", 0}};
    const layer_t l = {"gzip", f, 1};
    char md[KA_DIGEST_LEN], xd[KA_DIGEST_LEN];
    s_layout(dir, "ignored", &l, 1, NULL, md);
    char *mp = ka_strfmt("%s/blobs/sha256/%s", dir, ka_digest_hex(md));
    struct stat st;
    assert_int_equal(stat(mp, &st), 0);
    char idx[1024];
    snprintf(idx, sizeof idx,
             "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\","
             "\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
             "\"digest\":\"%s\",\"size\":%lld,\"platform\":{\"architecture\":\"s390x\","
             "\"os\":\"linux\"}},{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
             "\"digest\":\"%s\",\"size\":%lld,\"platform\":{\"architecture\":\"%s\","
             "\"os\":\"linux\"}}]}",
             "sha256:1111111111111111111111111111111111111111111111111111111111111111",
             (long long)st.st_size, md, (long long)st.st_size, s_arch());
    s_put_blob(dir, idx, strlen(idx), xd);
    char top[1024];
    snprintf(top, sizeof top,
             "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image."
             "index.v1+json\",\"digest\":\"%s\",\"size\":%zu,\"annotations\":{\"org."
             "opencontainers.image.ref.name\":\"multiarch\"}}]}",
             xd, strlen(idx));
    char *ip = ka_strfmt("%s/index.json", dir);
    s_write(ip, top, strlen(top));

    ka_images_t *img = s_store(state);
    char *ref = NULL, *root = NULL;
    assert_int_equal(ka_images_import(img, dir, NULL, &ref), 0);
    char *want = ka_strfmt("multiarch@%s", xd);
    assert_string_equal(ref, want); /* pinned as the index */
    char digest[72];
    assert_int_equal(ka_images_resolve(img, xd, digest), 0);
    assert_string_equal(digest, xd);
    assert_int_equal(ka_images_rootfs(img, want, &root), 0);
    char *hello = s_file(root, "hello");
    assert_string_equal(hello, "world");
    assert_int_equal(ka_images_verify(img, "multiarch"), 0);
    ka_image_info_t *v = NULL;
    size_t n = 0;
    assert_int_equal(ka_images_list(img, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].layers, 1);
    ka_images_list_free(v, n);
    /* the platform manifest survives garbage collection while the index is held */
    assert_int_equal(ka_images_rm(img, "nothing-else"), -ENOENT);
    char *kept = ka_strfmt("%s/images/blobs/sha256/%s", state, ka_digest_hex(md));
    assert_int_equal(access(kept, F_OK), 0);
    assert_int_equal(ka_images_rm(img, xd), 0);
    assert_int_equal(access(kept, F_OK), -1);
    ka_images_destroy(&img);
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(kept), free(hello), free(want), free(ref), free(root), free(ip), free(mp), free(dir);
    free(state), free(tmp);
}

static ka_images_reply_t s_call(krt_system_t *sys, krt_addr_t a, uint32_t type, const char *arg,
                                const char *name)
{
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    snprintf(req.arg, sizeof req.arg, "%s", arg);
    snprintf(req.name, sizeof req.name, "%s", name ? name : "");
    krt_reply_t r;
    assert_int_equal(krt_call(sys, a, type, &req, sizeof req, 30000, &r), 0);
    assert_int_equal(r.type, type);
    assert_int_equal(r.len, sizeof(ka_images_reply_t));
    ka_images_reply_t out;
    memcpy(&out, r.body, sizeof out);
    krt_reply_free(&r);
    return out;
}

/* The actor serves the library through jobs: build, resolve, prepare, verify, rm, errors. */
static void test_actor(void **unused)
{
    char *tmp = s_mktemp();
    char *state = ka_strfmt("%s/state", tmp);
    char *src = s_busybox_rootfs(tmp);
    char *np = ka_strfmt("%s/null", src);
    assert_int_equal(unlink(np), 0);
    free(np);
    krt_config_t cfg = {.schedulers = 2, .job_threads = 2, .name = "node-test"};
    krt_system_t *sys = krt_system_new(&cfg);
    assert_non_null(sys);
    assert_int_equal(krt_system_start(sys), 0);
    ka_images_actor_args_t args = {.state_dir = state};
    krt_spawn_opts_t so = {.name = KA_IMAGES_NAME, .register_name = true};
    krt_addr_t a = KRT_ADDR_NONE;
    assert_int_equal(krt_system_spawn(sys, &ka_images_behaviour, &args, &so, &a), 0);
    assert_int_equal(krt_whereis(sys, KA_IMAGES_NAME), a);

    ka_images_reply_t r = s_call(sys, a, KA_IMAGES_BUILD, src, "actor/bb");
    assert_int_equal(r.err, 0);
    assert_memory_equal(r.ref, "actor/bb@sha256:", 16);
    assert_string_equal(r.digest, strchr(r.ref, '@') + 1);
    char digest[72];
    memcpy(digest, r.digest, sizeof digest);

    r = s_call(sys, a, KA_IMAGES_RESOLVE, "actor/bb", NULL);
    assert_int_equal(r.err, 0);
    assert_string_equal(r.digest, digest);
    r = s_call(sys, a, KA_IMAGES_PREPARE, digest, NULL);
    assert_int_equal(r.err, 0);
    assert_true(s_exists(r.path, "bin/busybox"));
    r = s_call(sys, a, KA_IMAGES_VERIFY, "actor/bb", NULL);
    assert_int_equal(r.err, 0);
    r = s_call(sys, a, KA_IMAGES_PREPARE, "missing/image", NULL);
    assert_int_equal(r.err, -ENOENT);
    assert_non_null(strstr(r.message, "not in the store"));
    r = s_call(sys, a, KA_IMAGES_PULL, "example.com/x:latest", NULL);
    assert_int_equal(r.err, -EINVAL);
    r = s_call(sys, a, KA_IMAGES_RM, "actor/bb", NULL);
    assert_int_equal(r.err, 0);
    r = s_call(sys, a, KA_IMAGES_RESOLVE, digest, NULL);
    assert_int_equal(r.err, -ENOENT);

    /* malformed bodies are refused without a job */
    krt_reply_t raw;
    assert_int_equal(krt_call(sys, a, KA_IMAGES_RESOLVE, "x", 1, 5000, &raw), 0);
    assert_int_equal(((ka_images_reply_t *)raw.body)->err, -EINVAL);
    krt_reply_free(&raw);

    /* stopping with a job in flight leaks nothing (ASan checks) */
    ka_images_req_t req;
    memset(&req, 0, sizeof req);
    snprintf(req.arg, sizeof req.arg, "%s", src);
    assert_int_equal(krt_system_send(sys, a, KA_IMAGES_BUILD, &req, sizeof req), 0);
    krt_system_stop(sys);
    krt_system_destroy(&sys);
    assert_int_equal(ka_fs_rmtree(tmp), 0);
    free(src), free(state), free(tmp);
}

int main(void)
{
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_and_rootfs),
        cmocka_unit_test(test_layers_whiteouts),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_unpack_never_follows_symlinks),
        cmocka_unit_test(test_rm_keeps_shared),
        cmocka_unit_test(test_concurrent_rootfs),
        cmocka_unit_test(test_image_index),
        cmocka_unit_test(test_cli_exit_codes),
        cmocka_unit_test(test_actor),
    };
    return cmocka_run_group_tests(tests, NULL, s_teardown);
}
