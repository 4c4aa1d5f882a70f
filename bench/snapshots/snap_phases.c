/*
 * snap_phases: where a resume from object storage spends its time, one phase at a time.
 *
 *   snap_phases LOCATION SRC WORK RUNS
 *
 * Saves SRC as sandbox "phases"' snapshot under LOCATION (ka_snapobj_save), then RUNS times, the
 * phases in turn: the archive's download alone into a sink that drops it; its sha256 alone (in
 * memory); the unpack alone (ka_snapshot_read from a local copy: zstd, tar, sha256 and the
 * writes, no network); a syncfs of WORK after it (what an fsync of the tree would add: the
 * restore does none); and ka_snapobj_restore itself (the download streamed into the unpack,
 * overlapped). Prints, per phase, the median wall ms, then the
 * medians of this process's CPU ms and, when S3RVER_PID names the storage's process, of its CPU
 * ms (the storage shares this host's cores), and BENCH lines. AWS_* in the environment as for
 * kagentd. WORK should be a file system like a sandbox's /data (ext4); its copies are removed.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "ka_objstore.h"
#include "ka_snapobj.h"
#include "ka_snapshot.h"

#define MAX_RUNS 64

typedef struct s_env {
    const char *loc, *work;
    char key[512];
    uint64_t size;
} s_env_t;

typedef struct s_phase {
    const char *name;
    void (*fn)(const s_env_t *e, int arg);
    int arg;
    double wall[MAX_RUNS], cpu[MAX_RUNS], server[MAX_RUNS];
} s_phase_t;

static double s_wall0, s_cpu0, s_server0; /* the phase being timed */
static double s_wall, s_cpu_ms, s_server_ms;

static double s_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static double s_cpu(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

/* The storage process's CPU ms (S3RVER_PID), 0 without one. */
static double s_server_cpu(void)
{
    const char *pid = getenv("S3RVER_PID");
    char path[64], buf[1024];
    unsigned long ut = 0, st = 0;
    if (!pid)
        return 0;
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    FILE *f = fopen(path, "re");
    char *p = f && fgets(buf, sizeof buf, f) ? strrchr(buf, ')') : NULL;
    if (f)
        fclose(f);
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) * 1e3 / (double)sysconf(_SC_CLK_TCK);
}

static void s_start(void)
{
    s_wall0 = s_now();
    s_cpu0 = s_cpu();
    s_server0 = s_server_cpu();
}

static void s_stop(void)
{
    s_wall = s_now() - s_wall0;
    s_cpu_ms = s_cpu() - s_cpu0;
    s_server_ms = s_server_cpu() - s_server0;
}

static void s_die(const char *what, const char *why)
{
    fprintf(stderr, "snap_phases: %s: %s\n", what, why);
    exit(1);
}

static ka_objstore_t *s_client(const char *loc)
{
    char err[KA_OBJSTORE_ERR_CAP];
    ka_objstore_t *s = ka_objstore_new(loc, NULL, err, sizeof err);
    if (!s)
        s_die("client", err);
    return s;
}

static void s_rm(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd))
        s_die("rm", dir);
}

/* ---- the phases ------------------------------------------------------------------------- */

static int s_drop(void *user, const void *buf, size_t n)
{
    (void)buf;
    *(uint64_t *)user += n;
    return 0;
}

/* The download alone. */
static void s_get(const s_env_t *e, int unused)
{
    (void)unused;
    ka_objstore_t *s = s_client(e->loc);
    uint64_t got = 0;
    s_start();
    int rc = ka_objstore_get(s, e->key, s_drop, &got, NULL);
    s_stop();
    if (rc || got != e->size)
        s_die("download", ka_objstore_error(s));
    ka_objstore_destroy(&s);
}

/* A local copy of the archive in WORK (not timed); its descriptor. */
static int s_copy(const s_env_t *e, char *file, size_t cap)
{
    snprintf(file, cap, "%s/archive", e->work);
    int fd = open(file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ka_objstore_t *s = s_client(e->loc);
    if (fd < 0 || ka_objstore_get(s, e->key, ka_snapshot_fd_sink, &fd, NULL))
        s_die("archive copy", ka_objstore_error(s));
    ka_objstore_destroy(&s);
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static void s_sha(const s_env_t *e, int unused)
{
    (void)unused;
    char file[4096];
    int fd = s_copy(e, file, sizeof file);
    void *p = mmap(NULL, e->size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    unsigned char md[32];
    if (p == MAP_FAILED)
        s_die("mmap", strerror(errno));
    s_start();
    EVP_Digest(p, e->size, md, NULL, EVP_sha256(), NULL);
    s_stop();
    munmap(p, e->size);
    close(fd);
    unlink(file);
}

/* The unpack from a local copy; sync: the syncfs after it instead. */
static void s_unpack(const s_env_t *e, int sync)
{
    char file[4096], dir[4096], why[KA_SNAPSHOT_ERR_CAP];
    int fd = s_copy(e, file, sizeof file);
    snprintf(dir, sizeof dir, "%s/unpacked", e->work);
    ka_tree_opts_t o = {.owner = -1};
    ka_snapshot_info_t info;
    s_start();
    if (ka_snapshot_read(dir, fd, &o, &info, why, sizeof why))
        s_die("unpack", why);
    s_stop();
    if (sync) {
        s_start();
        syncfs(fd);
        s_stop();
    }
    close(fd);
    unlink(file);
    s_rm(dir);
}

static void s_restore(const s_env_t *e, int unused)
{
    (void)unused;
    char dir[4096], err[1024];
    snprintf(dir, sizeof dir, "%s/restored", e->work);
    ka_tree_opts_t o = {.owner = -1};
    s_start();
    if (ka_snapobj_restore(e->loc, "phases", dir, &o, NULL, err, sizeof err))
        s_die("restore", err);
    s_stop();
    s_rm(dir);
}

static s_phase_t s_phases[] = {
    {.name = "download", .fn = s_get, .arg = 0},
    {.name = "sha256", .fn = s_sha, .arg = 0},
    {.name = "unpack_local", .fn = s_unpack, .arg = 0},
    {.name = "syncfs_after_unpack", .fn = s_unpack, .arg = 1},
    {.name = "snapobj_restore", .fn = s_restore, .arg = 0},
};
#define N_PHASES (sizeof s_phases / sizeof s_phases[0])

/* ---- main -------------------------------------------------------------------------------- */

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double s_median(const double *v, int n)
{
    double sorted[MAX_RUNS];
    memcpy(sorted, v, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof sorted[0], s_cmp);
    return sorted[(n - 1) / 2];
}

/* The manifest's object key and size. */
static void s_manifest(s_env_t *e)
{
    ka_objstore_t *s = s_client(e->loc);
    char text[16384];
    if (ka_objstore_get_small(s, "phases/manifest.json", text, sizeof text))
        s_die("manifest", ka_objstore_error(s));
    json_t *j = json_loads(text, 0, NULL);
    const char *obj = NULL;
    json_int_t n = 0;
    if (!j || json_unpack(j, "{s:s, s:I}", "object", &obj, "archiveBytes", &n))
        s_die("manifest", text);
    snprintf(e->key, sizeof e->key, "%s", obj);
    e->size = (uint64_t)n;
    json_decref(j);
    ka_objstore_destroy(&s);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: snap_phases LOCATION SRC WORK RUNS\n");
        return 2;
    }
    s_env_t e = {.loc = argv[1], .work = argv[3]};
    int runs = atoi(argv[4]);
    runs = runs < 1 ? 1 : runs > MAX_RUNS ? MAX_RUNS : runs;
    char err[1024];
    ka_tree_opts_t o = {.owner = -1};
    if (ka_snapobj_save(e.loc, "phases", "r", argv[2], &o, NULL, err, sizeof err))
        s_die("save", err);
    s_manifest(&e);
    for (int r = 0; r < runs; r++)
        for (size_t i = 0; i < N_PHASES; i++) {
            s_phases[i].fn(&e, s_phases[i].arg);
            s_phases[i].wall[r] = s_wall;
            s_phases[i].cpu[r] = s_cpu_ms;
            s_phases[i].server[r] = s_server_ms;
        }
    printf("archive %llu bytes, %d runs; medians: wall ms, this process's CPU ms, the storage's "
           "CPU ms\n",
           (unsigned long long)e.size, runs);
    for (size_t i = 0; i < N_PHASES; i++) {
        s_phase_t *p = &s_phases[i];
        double w = s_median(p->wall, runs);
        printf("%-20s %8.1f %8.1f %8.1f\n", p->name, w, s_median(p->cpu, runs),
               s_median(p->server, runs));
        printf("BENCH name=snapshot_phase_%s value=%.1f unit=ms\n", p->name, w);
    }
    if (ka_snapobj_remove(e.loc, "phases", &o, err, sizeof err))
        s_die("remove", err);
    return 0;
}
