/*
 * ka_snapshot: a sandbox's /data as one compressed archive stream (tar, pax, zstd), and back.
 *
 * Writing walks the tree with ka_tree's rules (ka_tree.h): descriptor-relative, O_NOFOLLOW on
 * every open, only regular files read (O_NONBLOCK, checked with fstat), symlinks stored as
 * symlinks and never resolved, no mount point crossed, no setuid/setgid bit kept, fifos,
 * sockets and devices left out, bounded by a deadline, bytes and entries. Nothing is buffered
 * beyond libarchive's blocks: the archive goes to a sink as it is made.
 *
 * Reading treats the archive as hostile: every name must be relative, without "." or ".."
 * components or empty ones, at most KA_TREE_MAX_DEPTH deep; only directories, regular files and
 * symlinks are accepted (hard links, devices, fifos are refused); every component of every
 * path is opened with O_NOFOLLOW from the target's descriptor, so an archived symlink can never
 * lead a later entry out of the target. A violation stops the restore with -EINVAL and a reason.
 * The same bounds apply (a sparse or huge file past max_bytes is -EFBIG).
 */
#ifndef KA_SNAPSHOT_H
#define KA_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ka_tree.h"

#define KA_SNAPSHOT_ERR_CAP 512

/* Receives archive bytes in order: 0, or a negative errno to stop. */
typedef int (*ka_snap_sink_fn)(void *user, const void *buf, size_t n);

/* Gives the archive's next bytes in order: their count with *buf at them (the source's memory,
 * valid until the next call), 0 at the end, or a negative errno to stop. */
typedef ssize_t (*ka_snap_source_fn)(void *user, const void **buf);

typedef struct ka_snapshot_info {
    ka_tree_stats_t tree;   /* entries and file bytes */
    uint64_t archive_bytes; /* compressed stream size */
    char sha256[65];        /* of the compressed stream, lower-case hex */
} ka_snapshot_info_t;

/*
 * Archives the contents of directory dir into sink. 0, or a negative errno (-ETIMEDOUT past
 * the deadline, -EFBIG past a bound, the sink's error) with a reason in err. info may be NULL.
 */
int ka_snapshot_write(const char *dir, const ka_tree_opts_t *o, ka_snap_sink_fn sink, void *user,
                      ka_snapshot_info_t *info, char *err, size_t cap);

/*
 * Restores the archive read from fd (to its end) into directory dir (created if missing;
 * expected empty). Entries get owner o->owner (uid = gid; -1: the caller's). 0 or a negative
 * errno with a reason in err; info (may be NULL) has what was read, its sha256 included, also
 * on failure.
 */
int ka_snapshot_read(const char *dir, int fd, const ka_tree_opts_t *o, ka_snapshot_info_t *info,
                     char *err, size_t cap);

/* ka_snapshot_read with the archive taken from source (to its end) instead of a descriptor;
 * a source's error stops the restore and is its result. */
int ka_snapshot_read_from(const char *dir, ka_snap_source_fn source, void *user,
                          const ka_tree_opts_t *o, ka_snapshot_info_t *info, char *err, size_t cap);

/* A sink that writes to the file descriptor in user (an int *). */
int ka_snapshot_fd_sink(void *user, const void *buf, size_t n);

#endif
