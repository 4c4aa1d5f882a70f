/*
 * ka_driver: the isolation driver interface. A sandbox class (today `namespaces`, later
 * perhaps `microvm`) is a driver behind this vtable; the substrate actor only sees this.
 *
 * A driver starts sandboxes (a rootfs from read-only image layers, a durable /data, the guest
 * as PID 1 with a channel to the node), stops them leaving nothing behind, reports their
 * resource use, and hands out the exec channel: a connected unix stream socket that speaks
 * guest_proto.h.
 *
 * Calls are blocking (a start is a few ms of syscalls); from an actor, run them as a krt job.
 * One driver may be used from several threads for different sandboxes; one sandbox from one
 * thread at a time.
 */
#ifndef KA_DRIVER_H
#define KA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KA_DRIVER_ID_LEN 65 /* a sandbox id and its NUL */

typedef struct ka_driver ka_driver_t;
typedef struct ka_sandbox ka_sandbox_t; /* defined by each driver class */

/* What to start. Everything is borrowed for the duration of the start call. */
typedef struct ka_sandbox_spec {
    const char *id;               /* unique per state dir: [A-Za-z0-9._-], <= 64 chars */
    const char *const *lowerdirs; /* read-only image layers, top first (overlay lowerdir order) */
    size_t n_lower;
    const char *hostname; /* NULL: "sandbox" */
    int ready_timeout_ms; /* how long to wait for the guest's ready frame; 0: 5000 */
    bool reuse_data;      /* boot on the /data kept for this id (see park); none: a fresh one */
    bool reuse_root;      /* with reuse_data: keep the root's changes kept with it (a fork's) */
} ka_sandbox_spec_t;

typedef struct ka_sandbox_stats {
    uint64_t mem_bytes;  /* memory charged now */
    uint64_t mem_limit;  /* memory limit */
    uint64_t cpu_ns;     /* cpu time used (0 when the host cannot say) */
    uint64_t pids;       /* tasks in the sandbox now */
    uint64_t pids_limit; /* pids limit */
    uint64_t oom_kills;  /* processes killed by the memory limit (0 when unknown) */
    int guest_pid;       /* the guest (sandbox PID 1) as the host sees it */
} ka_sandbox_stats_t;

typedef struct ka_driver_ops {
    const char *name; /* class name: "namespaces" */
    /* Starts a sandbox and waits for its guest to say ready. 0 and *out, or a negative errno;
     * on failure nothing is left behind. */
    int (*start)(ka_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t **out);
    /* Kills everything in the sandbox and removes its mounts, cgroups and directories.
     * Frees the sandbox and NULLs *sb (even on error). */
    int (*stop)(ka_driver_t *d, ka_sandbox_t **sb);
    /* Kills every process in the sandbox and waits until none is left; its files stay until
     * stop, so the host can read /data without anything inside racing it. */
    int (*halt)(ka_driver_t *d, ka_sandbox_t *sb);
    int (*stats)(ka_driver_t *d, ka_sandbox_t *sb, ka_sandbox_stats_t *out);
    /* stats of the running sandbox with this id, from any thread (an operator's view):
     * 0, -ENOENT (none runs). NULL: the class cannot look sandboxes up by id. */
    int (*stats_id)(ka_driver_t *d, const char *id, ka_sandbox_stats_t *out);
    /* The host directory behind the sandbox's /data (borrowed, valid until stop), and the
     * host uid (= gid) that owns what the sandbox writes there. */
    const char *(*data_dir)(ka_driver_t *d, ka_sandbox_t *sb);
    uint32_t (*owner)(ka_driver_t *d, ka_sandbox_t *sb);
    /* The exec channel (borrowed fd, valid until stop). */
    int (*channel)(ka_driver_t *d, ka_sandbox_t *sb);
    /* Kills the guest (SIGKILL) without waiting or cleaning up: never blocks, so an actor may
     * call it (a guest that broke the protocol). stop still has to follow. */
    int (*kill)(ka_driver_t *d, ka_sandbox_t *sb);
    /* Freezes (frozen true) every process in the sandbox, keeping their memory, or thaws
     * them, and waits until done (bounded: a few ms, -ETIMEDOUT past the bound, nothing
     * changed). A frozen sandbox can still be stopped. Optional (-ENOTSUP). */
    int (*freeze)(ka_driver_t *d, ka_sandbox_t *sb, bool frozen);
    /* Like stop, but the sandbox's /data stays, kept under its id, for a later start of the
     * same id with reuse_data (a node that crashed leaves the same behind for every sandbox
     * it ran). Frees the sandbox and NULLs *sb (even on error). Optional. */
    int (*park)(ka_driver_t *d, ka_sandbox_t **sb);
    /* Whether /data is kept for id, and removing it (0 when nothing is kept). Optional. */
    bool (*kept)(ka_driver_t *d, const char *id);
    int (*discard)(ka_driver_t *d, const char *id);
    /* The ids of what is kept: up to cap into ids; returns how many are kept. Optional. */
    size_t (*kept_ids)(ka_driver_t *d, char (*ids)[KA_DRIVER_ID_LEN], size_t cap);
    /* Frees the driver (sandboxes still running are stopped first; kept data stays). */
    void (*destroy)(ka_driver_t *d);
    /* Keeps for id (as park would, root changes included) a copy of src's /data and root
     * changes; src must be frozen or halted (nothing in it writes). *bytes: the bytes copied.
     * 0, -EEXIST (id is taken), -EDQUOT (the copy does not fit id's disk quota), or another
     * negative errno; on failure nothing is left for id. Optional (-ENOTSUP). */
    int (*fork)(ka_driver_t *d, ka_sandbox_t *src, const char *id, uint64_t *bytes);
} ka_driver_ops_t;

/* Every driver struct starts with this header. */
struct ka_driver {
    const ka_driver_ops_t *ops;
};

static inline const char *ka_driver_name(const ka_driver_t *d)
{
    return d->ops->name;
}
int ka_driver_start(ka_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t **out);
int ka_driver_stop(ka_driver_t *d, ka_sandbox_t **sb);
int ka_driver_halt(ka_driver_t *d, ka_sandbox_t *sb);
int ka_driver_stats(ka_driver_t *d, ka_sandbox_t *sb, ka_sandbox_stats_t *out);
/* -ENOTSUP when the class has no stats_id. */
int ka_driver_stats_id(ka_driver_t *d, const char *id, ka_sandbox_stats_t *out);
const char *ka_driver_data_dir(ka_driver_t *d, ka_sandbox_t *sb);
uint32_t ka_driver_owner(ka_driver_t *d, ka_sandbox_t *sb);
int ka_driver_channel(ka_driver_t *d, ka_sandbox_t *sb);
int ka_driver_kill(ka_driver_t *d, ka_sandbox_t *sb);
int ka_driver_freeze(ka_driver_t *d, ka_sandbox_t *sb, bool frozen);
/* Without park (a driver that keeps nothing): stop. */
int ka_driver_park(ka_driver_t *d, ka_sandbox_t **sb);
bool ka_driver_kept(ka_driver_t *d, const char *id);
int ka_driver_discard(ka_driver_t *d, const char *id);
/* Without kept_ids: 0. */
size_t ka_driver_kept_ids(ka_driver_t *d, char (*ids)[KA_DRIVER_ID_LEN], size_t cap);
int ka_driver_fork(ka_driver_t *d, ka_sandbox_t *src, const char *id, uint64_t *bytes);
/* Idempotent; NULLs *d_p. */
void ka_driver_destroy(ka_driver_t **d_p);

#endif
