/*
 * guest_watch: one inotify watch of a directory tree in the workspace, with a bounded queue of
 * event payloads for the guest to send as credit allows.
 *
 * Each watch has its own inotify instance (instances are counted per host uid: close it when
 * the watch ends). Every directory of the tree is watched, also those created later (their
 * contents at the time the watch is added are announced as creates). Directories are opened
 * as guest_fsops opens them (confined, the last component not followed) and watched through
 * their fd, so a symlink swapped in is never watched through.
 *
 * Event payload (guest_proto.h "event"): byte 0 is the kind (KA_GP_EV_*), | KA_GP_EV_ISDIR for a
 * directory; then the path relative to the watched directory, NUL, the old path of a MOVE
 * (else nothing), NUL. A full queue (or the kernel's queue overflowing) queues one OVERFLOW
 * event after what was queued; events are dropped until there is room again.
 */
#ifndef KA_GUEST_WATCH_H
#define KA_GUEST_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "guest_proto.h"

#define KA_GW_QUEUE 1024           /* events queued per watch */
#define KA_GW_DIRS  4096           /* directories watched per watch (more: OVERFLOW) */
#define KA_GW_PATH  KA_GP_PATH_MAX /* longest path reported (longer: skipped) */

typedef struct ka_gw ka_gw_t;

/* Watches directory path (guest_fsops path rules; "" = the workspace). NULL with *err:
 * -ENOENT, -ENOTDIR, -EACCES, -EMFILE (inotify instances), -ENOMEM. */
ka_gw_t *ka_gw_new(int ws, const char *path, size_t n, int *err);
/* Idempotent; closes the inotify instance; NULLs *w_p. */
void ka_gw_destroy(ka_gw_t **w_p);
/* The inotify fd to poll for reading. */
int ka_gw_fd(const ka_gw_t *w);
/* Takes what the kernel has queued (non-blocking) into the queue. */
void ka_gw_read(ka_gw_t *w);
/* The oldest queued payload (borrowed until ka_gw_pop), or NULL when the queue is empty. */
const uint8_t *ka_gw_peek(const ka_gw_t *w, size_t *len);
void ka_gw_pop(ka_gw_t *w);

#endif
