/* ka_cgroup: cgroup v1/v2 limits for sandboxes (see ka_cgroup.h). */
#include "ka_cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S_ROOT "/sys/fs/cgroup"

enum { S_MEM, S_CPU, S_PIDS, S_ACCT, S_FRZ, S_NCTRL };
static const char *const s_ctrl[S_NCTRL] = {"memory", "cpu", "pids", "cpuacct", "freezer"};

/* Host layout, detected once. */
static struct {
    pthread_once_t once;
    int err;
    bool v2;
    char base[S_NCTRL][512]; /* v1: <mount>/<self>, "" if absent; v2: base[0] only */
} S = {.once = PTHREAD_ONCE_INIT};

struct ka_cgroup {
    size_t n;
    char *dir[KA_CGROUP_MAX_DIRS];
    int ctrl[KA_CGROUP_MAX_DIRS]; /* S_* for v1; -1 for the one v2 dir */
};

static int s_write(const char *dir, const char *file, const char *val)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, val, strlen(val));
    int rc = n < 0 ? -errno : 0;
    close(fd);
    return rc;
}

static int s_read(const char *dir, const char *file, char *buf, size_t cap)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = 0;
    return (int)n;
}

static uint64_t s_read_u64(const char *dir, const char *file)
{
    char buf[64];
    if (s_read(dir, file, buf, sizeof(buf)) <= 0)
        return 0;
    return strtoull(buf, NULL, 10);
}

/* Value of "key N" in a flat keyed file. */
static uint64_t s_read_key(const char *dir, const char *file, const char *key)
{
    char buf[4096];
    if (s_read(dir, file, buf, sizeof(buf)) <= 0)
        return 0;
    size_t kl = strlen(key);
    for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, key, kl) == 0 && l[kl] == ' ')
            return strtoull(l + kl + 1, NULL, 10);
    return 0;
}

static void s_detect(void)
{
    struct stat st;
    S.v2 = stat(S_ROOT "/cgroup.controllers", &st) == 0;
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) {
        S.err = -errno;
        return;
    }
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        const char *ctrls = c1 + 1, *path = c2 + 1;
        if (strcmp(path, "/") == 0)
            path = "";
        if (S.v2) {
            if (strcmp(line, "0") == 0)
                snprintf(S.base[0], sizeof(S.base[0]), S_ROOT "%s", path);
            continue;
        }
        for (int i = 0; i < S_NCTRL; i++) {
            char list[256];
            snprintf(list, sizeof(list), ",%s,", ctrls);
            char want[32];
            snprintf(want, sizeof(want), ",%s,", s_ctrl[i]);
            char mnt[300];
            snprintf(mnt, sizeof(mnt), S_ROOT "/%s", s_ctrl[i]);
            if (strstr(list, want) && stat(mnt, &st) == 0)
                snprintf(S.base[i], sizeof(S.base[i]), "%s%s", mnt, path);
        }
    }
    fclose(f);
    if (S.v2 ? !S.base[0][0] : (!S.base[S_MEM][0] || !S.base[S_CPU][0] || !S.base[S_PIDS][0]))
        S.err = -ENOTSUP;
}

bool ka_cgroup_is_v2(void)
{
    pthread_once(&S.once, s_detect);
    return S.v2;
}

static int s_mkdir(const char *dir)
{
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int s_add(ka_cgroup_t *cg, const char *base, const char *parent, const char *id, int ctrl)
{
    char p[700];
    snprintf(p, sizeof(p), "%s/%s", base, parent);
    int rc = s_mkdir(p);
    if (rc < 0)
        return rc;
    char *d = NULL;
    if (asprintf(&d, "%s/%s", p, id) < 0)
        return -ENOMEM;
    if (mkdir(d, 0755) < 0) {
        rc = -errno;
        free(d);
        return rc;
    }
    cg->dir[cg->n] = d;
    cg->ctrl[cg->n] = ctrl;
    cg->n++;
    return 0;
}

static int s_limits_v1(ka_cgroup_t *cg, const ka_cgroup_limits_t *lim)
{
    char v[64];
    for (size_t i = 0; i < cg->n; i++) {
        int rc = 0;
        switch (cg->ctrl[i]) {
        case S_MEM:
            if (!lim->mem_bytes)
                break;
            snprintf(v, sizeof(v), "%llu", (unsigned long long)lim->mem_bytes);
            rc = s_write(cg->dir[i], "memory.limit_in_bytes", v);
            /* with swap accounting, also cap memory+swap so the bomb cannot swap out */
            if (rc == 0)
                (void)s_write(cg->dir[i], "memory.memsw.limit_in_bytes", v);
            break;
        case S_CPU:
            if (!lim->cpu_millis)
                break;
            rc = s_write(cg->dir[i], "cpu.cfs_period_us", "100000");
            snprintf(v, sizeof(v), "%llu", (unsigned long long)lim->cpu_millis * 100u);
            if (rc == 0)
                rc = s_write(cg->dir[i], "cpu.cfs_quota_us", v);
            break;
        case S_PIDS:
            if (!lim->pids_max)
                break;
            snprintf(v, sizeof(v), "%llu", (unsigned long long)lim->pids_max);
            rc = s_write(cg->dir[i], "pids.max", v);
            break;
        default:
            break;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int s_limits_v2(ka_cgroup_t *cg, const ka_cgroup_limits_t *lim)
{
    char v[64];
    int rc = 0;
    if (lim->mem_bytes) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)lim->mem_bytes);
        rc = s_write(cg->dir[0], "memory.max", v);
        if (rc == 0)
            (void)s_write(cg->dir[0], "memory.swap.max", "0");
    }
    if (rc == 0 && lim->cpu_millis) {
        snprintf(v, sizeof(v), "%llu 100000", (unsigned long long)lim->cpu_millis * 100u);
        rc = s_write(cg->dir[0], "cpu.max", v);
    }
    if (rc == 0 && lim->pids_max) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)lim->pids_max);
        rc = s_write(cg->dir[0], "pids.max", v);
    }
    return rc;
}

ka_cgroup_t *ka_cgroup_new(const char *parent, const char *id, const ka_cgroup_limits_t *lim,
                           int *err)
{
    pthread_once(&S.once, s_detect);
    int rc = S.err;
    ka_cgroup_t *cg = NULL;
    if (rc < 0)
        goto fail;
    cg = calloc(1, sizeof(*cg));
    rc = -ENOMEM;
    if (!cg)
        goto fail;
    rc = 0;
    if (S.v2) {
        char p[700];
        snprintf(p, sizeof(p), "%s/%s", S.base[0], parent);
        rc = s_mkdir(p);
        /* controllers must be enabled on the way down; the host's own cgroup must allow it */
        if (rc == 0)
            (void)s_write(S.base[0], "cgroup.subtree_control", "+cpu +memory +pids");
        if (rc == 0)
            rc = s_write(p, "cgroup.subtree_control", "+cpu +memory +pids");
        if (rc == 0)
            rc = s_add(cg, S.base[0], parent, id, -1);
        if (rc == 0)
            rc = s_limits_v2(cg, lim);
    } else {
        for (int i = 0; i < S_NCTRL && rc == 0; i++)
            if (S.base[i][0])
                rc = s_add(cg, S.base[i], parent, id, i);
        if (rc == 0)
            rc = s_limits_v1(cg, lim);
    }
    if (rc < 0)
        goto fail;
    return cg;
fail:
    if (cg)
        ka_cgroup_remove(&cg);
    if (err)
        *err = rc;
    return NULL;
}

int ka_cgroup_procs_fds(const ka_cgroup_t *cg, int fds[KA_CGROUP_MAX_DIRS])
{
    for (size_t i = 0; i < cg->n; i++) {
        char p[700];
        snprintf(p, sizeof(p), "%s/cgroup.procs", cg->dir[i]);
        fds[i] = open(p, O_WRONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            int rc = -errno;
            while (i-- > 0)
                close(fds[i]);
            return rc;
        }
    }
    return (int)cg->n;
}

int ka_cgroup_stats(const ka_cgroup_t *cg, ka_sandbox_stats_t *out)
{
    for (size_t i = 0; i < cg->n; i++) {
        const char *d = cg->dir[i];
        switch (cg->ctrl[i]) {
        case -1:
            out->mem_bytes = s_read_u64(d, "memory.current");
            out->mem_limit = s_read_u64(d, "memory.max");
            out->cpu_ns = s_read_key(d, "cpu.stat", "usage_usec") * 1000u;
            out->pids = s_read_u64(d, "pids.current");
            out->pids_limit = s_read_u64(d, "pids.max");
            out->oom_kills = s_read_key(d, "memory.events", "oom_kill");
            break;
        case S_MEM:
            out->mem_bytes = s_read_u64(d, "memory.usage_in_bytes");
            out->mem_limit = s_read_u64(d, "memory.limit_in_bytes");
            out->oom_kills = s_read_key(d, "memory.oom_control", "oom_kill");
            break;
        case S_PIDS:
            out->pids = s_read_u64(d, "pids.current");
            out->pids_limit = s_read_u64(d, "pids.max");
            break;
        case S_ACCT:
            out->cpu_ns = s_read_u64(d, "cpuacct.usage");
            break;
        default:
            break;
        }
    }
    return 0;
}

/* Whether dir's cgroup.events has "frozen <want>" (fd: the open events file). */
static bool s_frozen_is(int fd, bool want)
{
    char buf[512];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return false;
    buf[n] = 0;
    const char *f = strstr(buf, "frozen ");
    return f && (f[7] == '1') == want;
}

/* Waits (poll on cgroup.events, which the kernel signals on change) until frozen == want. */
static int s_freeze_wait(const char *dir, bool want, int timeout_ms)
{
    char path[700];
    snprintf(path, sizeof path, "%s/cgroup.events", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = 0;
    while (!s_frozen_is(fd, want)) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long spent = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (spent >= timeout_ms) {
            rc = -ETIMEDOUT;
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLPRI};
        if (poll(&p, 1, (int)(timeout_ms - spent)) < 0 && errno != EINTR) {
            rc = -errno;
            break;
        }
    }
    close(fd);
    return rc;
}

/* v1: freezer.state goes FREEZING -> FROZEN (no notification: polled every 100 us). */
static int s_freeze_v1(const char *dir, bool frozen, int timeout_ms)
{
    int rc = s_write(dir, "freezer.state", frozen ? "FROZEN" : "THAWED");
    struct timespec step = {0, 100000};
    for (int waited_us = 0; !rc; waited_us += 100) {
        char st[32];
        if ((rc = s_read(dir, "freezer.state", st, sizeof st)) < 0)
            break;
        rc = 0;
        if (strncmp(st, frozen ? "FROZEN" : "THAWED", 6) == 0)
            break;
        if (waited_us >= timeout_ms * 1000) {
            rc = -ETIMEDOUT;
            break;
        }
        nanosleep(&step, NULL);
    }
    return rc;
}

int ka_cgroup_freeze(const ka_cgroup_t *cg, bool frozen, int timeout_ms)
{
    if (!cg)
        return -EINVAL;
    const char *dir = NULL;
    for (size_t i = 0; i < cg->n; i++)
        if (cg->ctrl[i] == -1 || cg->ctrl[i] == S_FRZ)
            dir = cg->dir[i];
    if (!dir)
        return -ENOTSUP; /* v1 without a freezer hierarchy */
    int rc;
    if (cg->ctrl[0] == -1) {
        rc = s_write(dir, "cgroup.freeze", frozen ? "1" : "0");
        if (!rc)
            rc = s_freeze_wait(dir, frozen, timeout_ms);
    } else {
        rc = s_freeze_v1(dir, frozen, timeout_ms);
    }
    if (rc == -ETIMEDOUT && frozen)
        ka_cgroup_freeze(cg, false, timeout_ms);
    return rc == -ENOENT ? -ENOTSUP : rc;
}

/* SIGKILLs every task listed in dir/cgroup.procs; returns how many were listed. */
static int s_kill_all(const char *dir)
{
    char buf[8192];
    int n = s_read(dir, "cgroup.procs", buf, sizeof(buf));
    if (n <= 0)
        return n;
    int count = 0;
    for (char *p = buf; *p;) {
        char *end;
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (pid > 0) {
            kill((pid_t)pid, SIGKILL);
            count++;
        }
        p = end;
        while (*p == '\n')
            p++;
    }
    return count;
}

/* Crash cleanup: kills the tasks in one cgroup dir and removes it (0 if already gone). */
static int s_cgroup_remove_dir(const char *dir)
{
    struct timespec ms = {0, 1000000};
    (void)s_write(dir, "freezer.state", "THAWED"); /* v1: a frozen task cannot even die */
    for (int tries = 0; tries < 5000; tries++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return 0;
        if (errno != EBUSY)
            return -errno;
        s_kill_all(dir);
        nanosleep(&ms, NULL);
    }
    return -EBUSY;
}

int ka_cgroup_remove(ka_cgroup_t **cg_p)
{
    if (!cg_p || !*cg_p)
        return 0;
    ka_cgroup_t *cg = *cg_p;
    int rc = 0;
    for (size_t i = cg->n; i-- > 0;) {
        int r = s_cgroup_remove_dir(cg->dir[i]);
        if (r < 0 && rc == 0)
            rc = r;
        free(cg->dir[i]);
    }
    free(cg);
    *cg_p = NULL;
    return rc;
}

int ka_cgroup_remove_id(const char *parent, const char *id)
{
    pthread_once(&S.once, s_detect);
    int rc = S.err;
    for (int i = 0; i < S_NCTRL && rc == 0; i++) {
        if (!S.base[i][0])
            continue;
        char p[700];
        snprintf(p, sizeof(p), "%s/%s/%s", S.base[i], parent, id);
        rc = s_cgroup_remove_dir(p);
    }
    return rc;
}

void ka_cgroup_remove_parent(const char *parent)
{
    pthread_once(&S.once, s_detect);
    for (int i = 0; i < S_NCTRL; i++) {
        if (!S.base[i][0])
            continue;
        char p[700];
        snprintf(p, sizeof(p), "%s/%s", S.base[i], parent);
        (void)rmdir(p);
    }
}
