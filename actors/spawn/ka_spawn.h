/*
 * ka_spawn: what the node hands kagent-spawn, the small static program that makes a sandbox's
 * first process.
 *
 * The node used to clone itself into the sandbox's namespaces. That copies its address space:
 * tens of MB of page tables, write-protected and then faulted back one page at a time, with a
 * TLB shootdown on every node thread, about a third of the node's CPU per cold start, growing
 * with the node. Now it posix_spawns kagent-spawn (a vfork: nothing copied) and sends it one
 * ka_spawn_msg_t on the sync socket (a SOCK_SEQPACKET pair; kagent-spawn's end is argv[1]).
 * kagent-spawn unshares the mount, PID, network, UTS and IPC namespaces, clones the guest's
 * process as the node's child (CLONE_PARENT: the node waits for and kills it by pid, as before),
 * reports its pid ('P') and exits. The guest's process then does the steps the node's clone did
 * (cgroups, mounts, pivot, credentials, seccomp) and execs the guest; on the sync socket 'U'
 * asks for the id maps (the node writes them and answers 'G'), 'E' reports a failed step, and
 * EOF (close-on-exec) means the guest runs.
 */
#ifndef KA_SPAWN_H
#define KA_SPAWN_H

#include <stdint.h>

#define KA_SPAWN_VERSION   2u
#define KA_SPAWN_PATH      512 /* mount points and paths */
#define KA_SPAWN_MAX_LOWER 128 /* image layers */
#define KA_SPAWN_MAX_CG    5   /* cgroup.procs descriptors (KA_CGROUP_MAX_DIRS) */
#define KA_SPAWN_MAX_ARGS  31  /* the guest's argv */
#define KA_SPAWN_KEEP_MAX  (4 + KA_SPAWN_MAX_CG + KA_SPAWN_MAX_LOWER)
#define KA_SPAWN_TAIL_MAX  (96u << 10) /* layer paths, arguments, the seccomp program */

/* One message. The tail holds n_lower layer paths, then n_args guest arguments (each
 * NUL-terminated), then zero padding to 8 bytes, then n_filter struct sock_filter. */
typedef struct ka_spawn_msg {
    uint32_t version;
    int sync_fd, channel_fd, log_fd;
    int base_ns_fd; /* the mount namespace to copy (ka_basens.h), or -1: kagent-spawn's own */
    int cg_fds[KA_SPAWN_MAX_CG];
    int n_cg;
    int keep[KA_SPAWN_KEEP_MAX]; /* the descriptors kept open, ascending */
    int n_keep;
    int lower_fds[KA_SPAWN_MAX_LOWER]; /* each layer reopened onto this number (overlay opts) */
    uint32_t n_lower;
    uint32_t uid;      /* host uid = gid: the user namespace's owner and its one mapping */
    uint32_t nofile;   /* RLIMIT_NOFILE */
    uint64_t pids_max; /* RLIMIT_NPROC; 0: unchanged */
    uint64_t sigmask;  /* the guest's signal mask: bit n-1 is signal n */
    char hostname[65];
    char root[KA_SPAWN_PATH - 32], data[KA_SPAWN_PATH + 8], vol[KA_SPAWN_PATH];
    char guest[KA_SPAWN_PATH], overlay_opts[4096], tmp_opts[64];
    char mp_data[KA_SPAWN_PATH], mp_run[KA_SPAWN_PATH], mp_kagent[KA_SPAWN_PATH];
    char mp_guest[KA_SPAWN_PATH], mp_proc[KA_SPAWN_PATH], mp_dev[KA_SPAWN_PATH];
    char mp_tmp[KA_SPAWN_PATH];
    uint32_t n_args;
    uint32_t n_filter;
    uint32_t tail_len;
} ka_spawn_msg_t;

/* What kagent-spawn reports on the sync socket. */
typedef struct ka_spawn_report {
    char tag; /* 'P': the guest's pid, 'U': map my ids, 'E': failed */
    int step;
    int err;
    int pid;
} ka_spawn_report_t;

/* The steps it reports on failure (for the sandbox's guest.log). */
enum {
    KA_SPAWN_STEP_CGROUP = 1,
    KA_SPAWN_STEP_CGROUPNS,
    KA_SPAWN_STEP_PRIVATE,
    KA_SPAWN_STEP_OVERLAY,
    KA_SPAWN_STEP_MKDIR,
    KA_SPAWN_STEP_DATA,
    KA_SPAWN_STEP_GUEST,
    KA_SPAWN_STEP_PROC,
    KA_SPAWN_STEP_DEV,
    KA_SPAWN_STEP_TMP,
    KA_SPAWN_STEP_UTS,
    KA_SPAWN_STEP_NET,
    KA_SPAWN_STEP_PIVOT,
    KA_SPAWN_STEP_USERNS,
    KA_SPAWN_STEP_CREDS,
    KA_SPAWN_STEP_FDS,
    KA_SPAWN_STEP_SECCOMP,
    KA_SPAWN_STEP_EXEC,
    KA_SPAWN_STEP_MSG,     /* the message was not readable or not valid */
    KA_SPAWN_STEP_SPAWN,   /* the node could not start kagent-spawn */
    KA_SPAWN_STEP_UNSHARE, /* the new namespaces */
    KA_SPAWN_STEP_CLONE,   /* the guest's process */
    KA_SPAWN_STEP_BASENS   /* entering the base namespace, attaching the volume there */
};

/* kagent-spawn's executable image, linked into the node (ka_spawn_image.S). */
extern const unsigned char ka_spawn_image[];
extern const unsigned char ka_spawn_image_end[];

#endif
