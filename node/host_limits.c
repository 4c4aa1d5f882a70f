/* ka_host_limits: the host limits a node's capacity needs (see host_limits.h). */
#include "host_limits.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#define S_NR_OPEN "/proc/sys/fs/nr_open"
#define S_PID_MAX "/proc/sys/kernel/pid_max"

int64_t ka_host_capacity(const ka_config_t *cfg)
{
    int64_t n = 0;
    for (size_t i = 0; i < cfg->n_pools; i++)
        n += cfg->pools[i].capacity > 0 ? cfg->pools[i].capacity : 0;
    return n;
}

ka_host_limits_t ka_host_limits_plan(const ka_config_t *cfg, uint64_t nr_open)
{
    uint64_t n = (uint64_t)ka_host_capacity(cfg);
    ka_host_limits_t l = {.nofile = KA_HOST_FDS_BASE + n * KA_HOST_FDS_PER_SANDBOX,
                          .pid_max = KA_HOST_TASKS_BASE + n * KA_HOST_TASKS_PER_SANDBOX};
    if (l.nofile > nr_open)
        l.nofile = nr_open;
    if (l.pid_max > KA_HOST_PID_MAX_LIMIT)
        l.pid_max = KA_HOST_PID_MAX_LIMIT;
    return l;
}

/* The number in a /proc/sys file: 0 or -errno. */
static int s_read_sysctl(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    int rc = fscanf(f, "%" SCNu64, out) == 1 ? 0 : -EIO;
    fclose(f);
    return rc;
}

static int s_write_sysctl(const char *path, uint64_t v)
{
    FILE *f = fopen(path, "we");
    if (!f)
        return -errno;
    int rc = fprintf(f, "%" PRIu64 "\n", v) < 0 ? -EIO : 0;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* Appends "what" to note. */
static void s_note(char *note, size_t cap, const char *what)
{
    size_t len = strlen(note);
    if (len + 1 < cap)
        snprintf(note + len, cap - len, "%s%s", len ? " " : "", what);
}

int ka_host_limits_raise(const ka_config_t *cfg, char *note, size_t cap)
{
    char buf[160];
    uint64_t nr_open = 1048576, pid_max = 0; /* the kernel's default nr_open if unreadable */
    (void)s_read_sysctl(S_NR_OPEN, &nr_open);
    ka_host_limits_t want = ka_host_limits_plan(cfg, nr_open);
    int rc = 0;
    if (cap)
        note[0] = '\0';

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        rc = -errno;
    } else if (rl.rlim_cur < want.nofile) {
        struct rlimit up = {.rlim_cur = want.nofile,
                            .rlim_max = rl.rlim_max < want.nofile ? want.nofile : rl.rlim_max};
        rc = setrlimit(RLIMIT_NOFILE, &up) < 0 ? -errno : 0;
        uint64_t got = rc == 0 ? want.nofile : (uint64_t)rl.rlim_cur;
        if (rc == -EPERM && rl.rlim_cur < rl.rlim_max) { /* no CAP_SYS_RESOURCE: to the hard */
            up = (struct rlimit){.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &up) == 0)
                got = (uint64_t)rl.rlim_max;
        }
        if (got != (uint64_t)rl.rlim_cur) {
            snprintf(buf, sizeof buf, "nofile=%" PRIu64 "->%" PRIu64, (uint64_t)rl.rlim_cur, got);
            s_note(note, cap, buf);
        }
        if (rc < 0) {
            snprintf(buf, sizeof buf, "nofile_wanted=%" PRIu64, want.nofile);
            s_note(note, cap, buf);
        }
    }

    int e = s_read_sysctl(S_PID_MAX, &pid_max);
    if (e == 0 && pid_max < want.pid_max) {
        e = s_write_sysctl(S_PID_MAX, want.pid_max);
        snprintf(buf, sizeof buf, "pid_max=%" PRIu64 "->%" PRIu64, pid_max,
                 e ? pid_max : want.pid_max);
        s_note(note, cap, buf);
        if (e < 0) {
            snprintf(buf, sizeof buf, "pid_max_wanted=%" PRIu64, want.pid_max);
            s_note(note, cap, buf);
        }
    }
    return rc ? rc : e;
}
