/*
 * replay_main: runs a fuzz target's LLVMFuzzerTestOneInput once on every file of the
 * directories given (the target's corpus, then its crash reproducers), so `make test` guards
 * what the fuzzers found without clang or libFuzzer. The first directory must hold at least one
 * input; a later one may be missing (no reproducers yet).
 *
 *   replay_<name> CORPUS_DIR [CRASHES_DIR...]
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int s_read(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b)
                free(buf);
            buf = b;
        }
    }
    int rc = ferror(f) ? -EIO : buf ? 0 : -ENOMEM;
    fclose(f);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int s_name_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Replays every regular file of dir; returns how many, or -1 on an unreadable one. */
static long s_replay_dir(const char *dir, bool required)
{
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, s_name_cmp);
    if (n < 0) {
        if (required || errno != ENOENT) {
            fprintf(stderr, "replay: cannot read %s: %s\n", dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    long done = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        uint8_t *buf = NULL;
        size_t len = 0;
        if (ents[i]->d_name[0] == '.' || done < 0) {
            free(ents[i]);
            continue;
        }
        snprintf(path, sizeof path, "%s/%s", dir, ents[i]->d_name);
        free(ents[i]);
        int rc = s_read(path, &buf, &len);
        if (rc) {
            fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(-rc));
            done = -1;
            continue;
        }
        LLVMFuzzerTestOneInput(buf, len);
        free(buf);
        done++;
    }
    free(ents);
    return done;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR [CRASHES_DIR...]\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        long n = s_replay_dir(argv[i], i == 1);
        if (n < 0 || (i == 1 && n == 0)) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], n < 0 ? "failed" : "holds no inputs");
            return 1;
        }
        printf("replay: %ld inputs of %s passed\n", n, argv[i]);
    }
    return 0;
}
