/*
 * images_cli: argument parsing and printing for `image ...`; the work is in images.c.
 */
#include "images_cli.h"
#include "images.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_MAX_MIRRORS 32

static const char s_usage[] =
    "usage: image COMMAND [ARGS]\n"
    "  import FILE|DIR [--name NAME]      import an OCI layout (dir or tar) or a docker-archive\n"
    "  build --rootfs DIR [--name NAME]   make a single-layer image; prints NAME@sha256:...\n"
    "  list                               list stored images\n"
    "  rm REF                             remove an image (NAME, NAME@sha256:..., sha256:...)\n"
    "  pull HOST/REPO@sha256:HEX [--mirror REGISTRY=URL]...\n"
    "                                     pull by digest from a registry\n"
    "  rootfs REF                         prepare the image's root file system; prints its dir\n"
    "  verify REF                         re-hash every blob of an image\n";

static int s_usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "image: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", s_usage);
    return 2;
}

static int s_fail(const char *what, int rc)
{
    const char *msg = ka_images_last_error();
    fprintf(stderr, "image %s: %s\n", what, msg && msg[0] ? msg : strerror(-rc));
    return 1;
}

/* Parsed options shared by the subcommands. */
typedef struct s_args {
    const char *pos;    /* the one positional argument, or NULL */
    const char *name;   /* --name */
    const char *rootfs; /* --rootfs */
    const char *mirrors[S_MAX_MIRRORS];
    size_t n_mirrors;
    int npos; /* positional arguments seen */
} s_args_t;

/* Returns 0, or 2 after printing a usage error. */
static int s_parse(int argc, char **argv, s_args_t *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        const char **slot = NULL;
        if (!strcmp(arg, "--name"))
            slot = &a->name;
        else if (!strcmp(arg, "--rootfs"))
            slot = &a->rootfs;
        else if (!strcmp(arg, "--mirror")) {
            if (a->n_mirrors == S_MAX_MIRRORS)
                return s_usage_error("too many --mirror options%s", "");
            slot = &a->mirrors[a->n_mirrors++];
        } else if (arg[0] == '-' && arg[1] == '-')
            return s_usage_error("unknown option %s", arg);
        if (slot) {
            if (i + 1 >= argc)
                return s_usage_error("%s needs a value", arg);
            *slot = argv[++i];
            continue;
        }
        if (a->npos++ == 0)
            a->pos = arg;
    }
    return 0;
}

static int s_list(ka_images_t *img)
{
    ka_image_info_t *v = NULL;
    size_t n = 0;
    int rc = ka_images_list(img, &v, &n);
    if (rc < 0)
        return rc;
    printf("%-40s %-71s %6s %12s\n", "NAME", "DIGEST", "LAYERS", "SIZE");
    for (size_t i = 0; i < n; i++)
        printf("%-40s %-71s %6d %12llu\n", v[i].name[0] ? v[i].name : "<none>", v[i].digest,
               v[i].layers, (unsigned long long)v[i].size);
    ka_images_list_free(v, n);
    return 0;
}

int ka_images_cli(const char *state_dir, int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        fputs(s_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    static const char *const cmds[] = {"import", "build", "list", "rm", "pull", "rootfs", "verify"};
    bool known = false;
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++)
        known = known || !strcmp(cmd, cmds[i]);
    if (!known)
        return s_usage_error("unknown command '%s'", cmd);
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(s_usage, stdout);
            return 0;
        }
    s_args_t a;
    if (s_parse(argc, argv, &a) != 0)
        return 2;
    bool wants_pos = strcmp(cmd, "list") && strcmp(cmd, "build");
    if (wants_pos && a.npos != 1)
        return s_usage_error("%s takes exactly one argument", cmd);
    if (!wants_pos && a.npos != 0)
        return s_usage_error("%s takes no positional argument", cmd);
    if (!strcmp(cmd, "build") && !a.rootfs)
        return s_usage_error("build needs --rootfs DIR%s", "");
    if (a.rootfs && strcmp(cmd, "build"))
        return s_usage_error("--rootfs only applies to build%s", "");
    if (a.name && strcmp(cmd, "build") && strcmp(cmd, "import"))
        return s_usage_error("--name only applies to build and import%s", "");
    if (a.n_mirrors && strcmp(cmd, "pull"))
        return s_usage_error("--mirror only applies to pull%s", "");
    if (!state_dir || !state_dir[0]) {
        fprintf(stderr, "image: no state directory configured\n");
        return 1;
    }
    ka_images_opts_t o = {.state_dir = state_dir, .mirrors = a.mirrors, .n_mirrors = a.n_mirrors};
    ka_images_t *img = ka_images_new(&o);
    if (!img)
        return s_fail("store", -EIO);
    int rc = 0, code = 0;
    char *out = NULL;
    if (!strcmp(cmd, "import"))
        rc = ka_images_import(img, a.pos, a.name, &out);
    else if (!strcmp(cmd, "build"))
        rc = ka_images_build(img, a.rootfs, a.name, &out);
    else if (!strcmp(cmd, "pull"))
        rc = ka_images_pull(img, a.pos, &out);
    else if (!strcmp(cmd, "rootfs"))
        rc = ka_images_rootfs(img, a.pos, &out);
    else if (!strcmp(cmd, "rm"))
        rc = ka_images_rm(img, a.pos);
    else if (!strcmp(cmd, "verify"))
        rc = ka_images_verify(img, a.pos);
    else if (!strcmp(cmd, "list"))
        rc = s_list(img);
    if (rc < 0)
        code = s_fail(cmd, rc);
    else if (out)
        printf("%s\n", out);
    else if (!strcmp(cmd, "verify"))
        printf("ok\n");
    free(out);
    ka_images_destroy(&img);
    return code;
}
