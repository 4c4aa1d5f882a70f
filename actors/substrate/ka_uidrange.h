/*
 * ka_uidrange: a node's claim on its range of host uids, so that two kagentd nodes on one
 * machine never run sandboxes under the same host uids (the kernel's per-user pools, such as
 * RLIMIT_NPROC counts and inotify instances, would be shared between their tenants).
 *
 * A claim is a file under a runtime directory, named by the range and the node's state dir, and
 * held with flock for as long as the node lives: a dead node's claim is stale and taken back.
 */
#ifndef KA_UIDRANGE_H
#define KA_UIDRANGE_H

#include <stddef.h>
#include <stdint.h>

#define KA_UIDRANGE_DIR "/run/kagent/uid-ranges"

typedef struct ka_uidrange {
    int fd;               /* the held claim, -1 when none */
    char path[4096 + 64]; /* the claim's file */
} ka_uidrange_t;

/* Claims uids [base, base + count) for the node whose state dir is state_dir, in dir (NULL:
 * KA_UIDRANGE_DIR). Nodes of the same state dir may share a range (a restart, a forked test).
 * 0, or -EADDRINUSE with the live holder's range, pid and state dir described in why, or another
 * negative errno. */
int ka_uidrange_claim(ka_uidrange_t *c, const char *dir, uint32_t base, uint32_t count,
                      const char *state_dir, char *why, size_t cap);
/* Gives the claim up (idempotent). */
void ka_uidrange_release(ka_uidrange_t *c);

#endif
