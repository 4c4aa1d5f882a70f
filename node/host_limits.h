/*
 * ka_host_limits: the host limits a node's capacity needs, computed from the configuration and
 * raised at start.
 *
 * Every sandbox a node holds costs kagentd descriptors (its guest channel and its pidfd) and
 * the host tasks (its guest, and its volume's jbd2 journal thread and ext4 rescuer thread, both
 * kernel threads). A node configured for 10,000 sandboxes therefore needs more than the usual
 * RLIMIT_NOFILE (often 1,024 or 20,000) and than the default kernel.pid_max (32,768, shared by
 * every task on the host). ka_host_limits_plan() says what the pools' capacity needs;
 * ka_host_limits_raise() raises what is lower (never lowers anything) and reports what it did.
 */
#ifndef KA_HOST_LIMITS_H
#define KA_HOST_LIMITS_H

#include <stdint.h>

#include "config.h"

/* Per sandbox, measured 2 fds and 3 tasks idle (guest, jbd2, ext4-rsv-conversion); the rest is
 * headroom for streams and calls in flight. The bases are the node's own descriptors (listener,
 * clients, database, runtime) and the rest of the host's tasks: with them the default config
 * (capacity 1000) needs no more than the kernel's default pid_max of 32,768. */
#define KA_HOST_FDS_PER_SANDBOX   4
#define KA_HOST_FDS_BASE          4096
#define KA_HOST_TASKS_PER_SANDBOX 4
#define KA_HOST_TASKS_BASE        16384
#define KA_HOST_PID_MAX_LIMIT     4194304 /* the kernel's PID_MAX_LIMIT on 64-bit */

typedef struct ka_host_limits {
    uint64_t nofile;  /* RLIMIT_NOFILE kagentd needs */
    uint64_t pid_max; /* kernel.pid_max the host needs */
} ka_host_limits_t;

/* Sandboxes the node may hold: the sum of its pools' capacity. */
int64_t ka_host_capacity(const ka_config_t *cfg);

/* What cfg's capacity needs, capped by nr_open (fs.nr_open) for nofile and by
 * KA_HOST_PID_MAX_LIMIT for pid_max. */
ka_host_limits_t ka_host_limits_plan(const ka_config_t *cfg, uint64_t nr_open);

/*
 * Raises kagentd's RLIMIT_NOFILE (soft, and hard if needed) and kernel.pid_max to cfg's plan
 * where they are lower. Without CAP_SYS_RESOURCE the hard limit stays and the soft one goes up
 * to it. What changed goes to note as key=value words ("nofile=1024->44136 pid_max=32768->56424",
 * plus "nofile_wanted=N" / "pid_max_wanted=N" for what could not be had; "" if nothing needed
 * raising). 0, or the first -errno (the rest is still tried: the node runs, and holds as many
 * sandboxes as the limits allow).
 */
int ka_host_limits_raise(const ka_config_t *cfg, char *note, size_t cap);

#endif
