/*
 * ka_cgroup: per-sandbox cpu, memory and pids limits on cgroup v1 or v2, whichever the host
 * has (detected once: pure v2 has /sys/fs/cgroup/cgroup.controllers; otherwise the v1
 * hierarchies memory, cpu, pids (+ cpuacct for stats, freezer for pause) are used, as on hybrid
 * hosts where the cgroup2 mount has no usable controllers).
 *
 * Cgroups are created under this process's own cgroup in each hierarchy:
 *   <mount>/<self path>/<parent>/<id>
 * A sandbox's processes join by writing "0" to the cgroup.procs fds from ka_cgroup_procs_fds()
 * (the sandbox's first process does it itself, before it enters its namespaces).
 */
#ifndef KA_CGROUP_H
#define KA_CGROUP_H

#include "ka_driver.h"

#include <stdbool.h>
#include <stdint.h>

#define KA_CGROUP_MAX_DIRS 5

typedef struct ka_cgroup ka_cgroup_t;

typedef struct ka_cgroup_limits {
    uint64_t mem_bytes;  /* 0 = no limit */
    uint32_t cpu_millis; /* 1000 = one core; 0 = no limit */
    uint64_t pids_max;   /* 0 = no limit */
} ka_cgroup_limits_t;

/* true if the host uses the unified (v2) hierarchy for controllers. */
bool ka_cgroup_is_v2(void);

/* Creates the cgroups for id and applies limits. NULL on failure (*err set, nothing left). */
ka_cgroup_t *ka_cgroup_new(const char *parent, const char *id, const ka_cgroup_limits_t *lim,
                           int *err);
/* Opens each dir's cgroup.procs for writing (O_CLOEXEC); returns the count or -errno. */
int ka_cgroup_procs_fds(const ka_cgroup_t *cg, int fds[KA_CGROUP_MAX_DIRS]);
int ka_cgroup_stats(const ka_cgroup_t *cg, ka_sandbox_stats_t *out);
/* Freezes (frozen true) or thaws every task in cg and waits until it is done, at most
 * timeout_ms: v2 cgroup.freeze (cgroup.events says frozen), v1 the freezer hierarchy's
 * freezer.state. 0, -ETIMEDOUT (a freeze not reached is undone), -ENOTSUP (no freezer). */
int ka_cgroup_freeze(const ka_cgroup_t *cg, bool frozen, int timeout_ms);
/* Kills whatever is still inside and removes the directories. Frees cg. Idempotent. */
int ka_cgroup_remove(ka_cgroup_t **cg_p);
/* Crash cleanup of sandbox id's cgroups under parent, in every hierarchy (0 if none). */
int ka_cgroup_remove_id(const char *parent, const char *id);
/* Removes <self>/<parent> in every hierarchy if it is empty (errors ignored). */
void ka_cgroup_remove_parent(const char *parent);

#endif
