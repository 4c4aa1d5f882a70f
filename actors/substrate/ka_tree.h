/*
 * ka_tree: host-side copies and removals of directory trees that a sandbox controls.
 *
 * A sandbox's /data is a host directory its (hostile) processes write to. Whatever the node
 * does to it as root must never leave it: every step is relative to an open directory
 * descriptor, every open uses O_NOFOLLOW (a directory swapped for a symlink fails, it is never
 * followed), only regular files are opened for reading (O_NONBLOCK, then checked with fstat, so
 * a fifo or device swapped in is never read), symlinks are recreated as symlinks and never
 * resolved, mount points are not crossed, setuid/setgid bits are dropped, and the whole walk has
 * a deadline and size bounds. Safe against a tree that changes during the walk.
 */
#ifndef KA_TREE_H
#define KA_TREE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define KA_TREE_MAX_DEPTH 256

typedef struct ka_tree_opts {
    int64_t deadline_ms;  /* CLOCK_MONOTONIC ms (krt_mono_ms) after which the walk stops; 0: none */
    uint64_t max_bytes;   /* file bytes to copy at most; 0: no bound */
    uint64_t max_entries; /* entries to visit at most; 0: no bound */
    int64_t owner;        /* copy: uid=gid every created entry gets; -1: the caller's */
    /* copy: an overlay upper layer: whiteouts (char devices 0/0) are recreated and the
     * trusted.overlay.opaque mark of directories kept; other devices are still skipped */
    bool overlay;
    /* copy with owner >= 0: only entries owned by uid remap_from get owner, the others keep
     * theirs (a sandbox's uid moves to another's, the image's root stays root) */
    bool remap;
    uint32_t remap_from;
} ka_tree_opts_t;

typedef struct ka_tree_stats {
    uint64_t files, dirs, symlinks, bytes;
    uint64_t whiteouts; /* overlay: whiteouts recreated */
    uint64_t cloned;    /* files whose bytes were shared (FICLONE), not copied */
    uint64_t skipped;   /* fifos, sockets, devices, entries that changed type under the walk */
} ka_tree_stats_t;

/*
 * Copies the contents of directory src into directory dst (created with its parents if
 * missing; entries already in dst are replaced). A file's bytes are shared where the file
 * system can (FICLONE), else copied in the kernel (copy_file_range, then sendfile). 0, or a
 * negative errno: -ETIMEDOUT past the deadline, -EFBIG past max_bytes or max_entries, -ELOOP deeper
 * than KA_TREE_MAX_DEPTH. stats may be NULL.
 */
int ka_tree_copy(const char *src, const char *dst, const ka_tree_opts_t *o, ka_tree_stats_t *stats);

/* Removes path and everything under it ("" or a missing path: 0). Never follows a symlink
 * and never crosses a mount point (-EBUSY). */
int ka_tree_remove(const char *path, const ka_tree_opts_t *o);

/* mkdir -p with mode for every directory it creates; 0 or -errno. */
int ka_mkdirs(const char *path, mode_t mode);

/* Marks dir as the top of a hierarchy for ext4's Orlov allocator (FS_TOPDIR_FL, `chattr +T`):
 * its subdirectories go to block groups spread by name, not next to dir. Without a journal,
 * ext4 gives a new inode none deleted in the last 60 s (360 s while its inode table block is
 * unwritten) and reads each such inode of the group to skip it: sandboxes created and deleted
 * in one group make every later create of the group walk past all of them. 0 or -errno (-ENOTTY,
 * -EOPNOTSUPP where the file system has no such flag: a hint, nothing depends on it). */
int ka_dir_spread(const char *dir);

#endif
