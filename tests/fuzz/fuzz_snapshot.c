/*
 * fuzz_snapshot: a snapshot archive as a resume receives it from object storage (anyone with
 * write access to the bucket can put bytes there): ka_snapshot_read restores it into a fresh
 * directory. A refusal says why; whatever the bytes, nothing appears outside the target (a
 * sibling directory stays empty) and every entry stays within the bounds given.
 *
 * The directories live under $FUZZ_TMPDIR, else /dev/shm, else /tmp.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ka_snapshot.h"
#include "krt.h"

static char s_base[256];

static void s_cleanup(void)
{
    ka_tree_opts_t o = {0};
    if (s_base[0])
        ka_tree_remove(s_base, &o);
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
    snprintf(s_base, sizeof s_base, "%s/kagent-fuzz-snapshot-XXXXXX", parent);
    if (!mkdtemp(s_base))
        abort();
    atexit(s_cleanup);
    return s_base;
}

static int s_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        abort();
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *base = s_workdir();
    char archive[300], target[300], outside[300];
    snprintf(archive, sizeof archive, "%s/in.tar.zst", base);
    snprintf(target, sizeof target, "%s/data", base);
    snprintf(outside, sizeof outside, "%s/outside", base);
    if (mkdir(outside, 0755) < 0 && s_entries(outside) != 0)
        abort();
    int fd = open(archive, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size || lseek(fd, 0, SEEK_SET) != 0)
        abort();
    ka_tree_opts_t o = {.deadline_ms = krt_mono_ms() + 5000,
                        .max_bytes = 8u << 20,
                        .max_entries = 2000,
                        .owner = -1};
    char err[KA_SNAPSHOT_ERR_CAP];
    ka_snapshot_info_t info;
    int rc = ka_snapshot_read(target, fd, &o, &info, err, sizeof err);
    close(fd);
    if (rc < 0 && !err[0])
        abort(); /* a refusal says why */
    if ((rc == 0 && info.tree.bytes > o.max_bytes) || s_entries(outside) != 0 ||
        s_entries(base) != 3)
        abort(); /* bounded, and nothing beside the target */
    ka_tree_opts_t ro = {0};
    if (ka_tree_remove(target, &ro) < 0 || unlink(archive) < 0)
        abort();
    return 0;
}
