/*
 * ka_namespaces: the `namespaces` sandbox class (SPEC.md "Isolation").
 *
 * Each sandbox is a process tree in new mount, PID, network (loopback only, up), UTS, IPC,
 * cgroup and user namespaces. Its root is an overlayfs of the caller's read-only image layers
 * and a per-sandbox upper dir; /data (workspace and guest-logs owned by the sandbox's host uid)
 * and that upper dir share the sandbox's own disk volume (ka_volume.h: disk_bytes and disk_inodes
 * bound them together, `df /data` shows the volume); the guest binary is bind-mounted read-only
 * at /run/kagent/guest from a node-wide tmpfs copy; no mount inside names a host path
 * (/proc/self/mountinfo shows the layers as /proc/self/fd/N); /dev is minimal (null zero full
 * random urandom tty pts/ptmx shm), /proc is fresh, /tmp a tmpfs. All mounts but the volumes are
 * made by the host in the sandbox's own mount namespace before it enters its user namespace, so
 * nothing in the sandbox can undo them. The only uid inside is 65532, mapped to a host uid
 * (= gid) of its own from the node's range: the user namespace is created by that unprivileged uid,
 * so the kernel's per-user pools (inotify instances, POSIX message-queue bytes, pending signals,
 * processes) are charged to the sandbox and not to host root or a neighbour. No capabilities,
 * no_new_privs, RLIMIT_NOFILE bounded, and a seccomp filter in the spirit of Docker's default
 * profile. The guest runs as PID 1 and talks to the node over an inherited unix socket (fd 3).
 *
 * State: <state_dir>/<id>/{root,vol,data,guest.log} (vol: a link to the sandbox's volume,
 * mounted under <state_dir>/.volumes; data: a link to vol/data), <state_dir>/.guest (the guest
 * copy). A node that crashed leaves these behind; ka_namespaces_new() kills what the cgroups
 * named by each <id> still hold and removes them, the volumes and the directories. A stop
 * leaves no mount, cgroup, process, directory or volume.
 *
 * Must run as root (host uid 0). Limits use cgroup v1 or v2, detected at start.
 */
#ifndef KA_NAMESPACES_H
#define KA_NAMESPACES_H

#include "ka_driver.h"

#include <stdint.h>

typedef struct ka_ns_opts {
    const char *state_dir;   /* required: one subdir per sandbox (created if missing) */
    const char *guest_path;  /* required: the static kagent-sandbox-guest binary */
    uint32_t cpu_millis;     /* cpu limit per sandbox, 1000 = one core; 0 = none */
    uint64_t mem_bytes;      /* memory limit per sandbox; 0 = none */
    uint64_t pids_max;       /* tasks per sandbox; 0 = none */
    const char *cgroup_name; /* parent cgroup name for this node's sandboxes; NULL: "kagent" */
    uint32_t uid_base;       /* first host uid (= gid) of this node's sandboxes; 0: 1000000 */
    uint32_t uid_count;      /* uids in the range = most live sandboxes; 0: 65536 */
    uint32_t nofile;         /* RLIMIT_NOFILE of every process inside; 0: 1024 */
    uint64_t tmp_bytes;      /* size of the tmpfs of /tmp and /dev (/dev/shm); 0: 64 MiB */
    uint64_t disk_bytes;     /* /data and changes to the root together; 0: 10 GiB */
    uint64_t disk_inodes;    /* files on that disk; 0: one per 16 KiB of disk_bytes */
    uint32_t disk_spare;     /* volumes formatted ahead of starts; 0: 4 */
    uint32_t disk_reap_ms;   /* quiet time before unused loop devices go (ka_volume.h); 0: 10 s */
    const char *const *guest_args; /* extra guest arguments, NULL-terminated; may be NULL */
} ka_ns_opts_t;

/*
 * Creates the driver: checks the options, builds the seccomp filter, creates the state dir
 * and cleans the leftovers of a crashed node in it. NULL on failure (*err set if err).
 */
ka_driver_t *ka_namespaces_new(const ka_ns_opts_t *opts, int *err);

/* The sandbox's host directory <state_dir>/<id> (borrowed; for tests and diagnostics). */
const char *ka_namespaces_dir(const ka_sandbox_t *sb);

#endif
