/*
 * ka_volume: one disk volume per sandbox, with a hard size and a hard inode count.
 *
 * A volume is a sparse image file formatted ext4 (no reserved blocks, no resize inode), attached
 * to a loop device (autoclear) and mounted nosuid,nodev,noatime,discard in the host's mount
 * namespace at <dir>/<n>; its image is <dir>/<n>.img. The sandbox's /data and the upper layer of
 * its root both live on it, so together they can never take more than the volume's size of the
 * host's disk (a write past it gets ENOSPC inside; `discard` hands freed blocks back to the host)
 * and `df /data` inside shows the volume, not the host's disk. Kernels without quota formats
 * (this host has neither QFMT_V2 nor XFS_QUOTA) rule out project quotas on one shared
 * filesystem; a volume per sandbox needs only loop and ext4.
 *
 * A node formats one image at start (mkfs.ext4 through a loop device, unnamed: O_TMPFILE) and
 * every new volume is a sparse copy of it (its ~200 KB of metadata, ~0.2 ms of CPU instead of a
 * mkfs process); if that image cannot be made, each volume is formatted on its own.
 * Making a volume, mounting it (~2-5 ms) and unmounting it (5-100 ms here: the file
 * system's shutdown and the loop device's teardown) are kept off the start and stop paths: a
 * thread keeps `spare` volumes formatted and mounted ahead, so a claim is a list pop and a
 * rename. A released volume (its sandbox gone) is emptied by that thread and becomes a spare
 * again while there are fewer than twice `spare` (freed blocks were discarded: nothing of the
 * last sandbox's stays readable, or in the image), else unmounted and deleted. New volumes are
 * formatted only below `spare`, so a steady start-stop rhythm formats and unmounts nothing.
 * When the spares run out, a claim formats one itself.
 *
 * Loop devices: an attach takes a free one (LOOP_CTL_GET_FREE adds one when none is free) and
 * the kernel keeps every device it ever added, ~70 KB of host memory each here, so a peak of
 * 10,000 sandboxes would pin ~700 MB until reboot. Once volumes were unmade and the filler has
 * been idle for reap_ms, it removes the devices this node attached that nothing binds now; the
 * next burst's attaches add them back (~0.2 ms each).
 *
 * Thread-safe: claim and release may run on any thread.
 */
#ifndef KA_VOLUME_H
#define KA_VOLUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ka_volumes ka_volumes_t;

typedef struct ka_volume_opts {
    const char *dir;  /* required, absolute: the volumes' home (created if missing) */
    uint64_t bytes;   /* size of each volume; at least 16 MiB */
    uint64_t inodes;  /* inodes of each volume; 0: one per 16 KiB */
    unsigned spare;   /* volumes kept ready ahead of claims; 0: every claim formats */
    unsigned reap_ms; /* quiet time before unbound loop devices go; 0: the default */
    /* NULL, or an absolute directory whose tree of directories (modes kept, owned by root)
     * every volume starts with: written by mkfs.ext4 (-d) into the template, so a claim finds
     * it without allocating a block, and made again in an emptied volume */
    const char *skeleton;
} ka_volume_opts_t;

/* Bytes and inodes a volume gets by default. */
#define KA_VOLUME_DEFAULT_BYTES   (10ULL << 30)
#define KA_VOLUME_BYTES_PER_INODE 16384u
#define KA_VOLUME_DEFAULT_REAP_MS 10000u

/*
 * Checks the options and the tools (mkfs.ext4, /dev/loop-control), releases the volumes in dir
 * that no sandbox claimed (an earlier run's spares) and starts filling the spares. Claimed
 * volumes stay until ka_volume_release. NULL on failure (*err set if err: -EINVAL bad options,
 * -ENOENT no mkfs.ext4 or no loop support).
 */
ka_volumes_t *ka_volumes_new(const ka_volume_opts_t *opts, int *err);

/* Stops the filler, finishes the releases and deletes the spare volumes; claimed ones stay.
 * NULLs *self_p. */
void ka_volumes_destroy(ka_volumes_t **self_p);

/*
 * Claims a fresh, empty volume, records the claim as a symlink at link (to the volume's mount
 * path) and writes that mount path (absolute, under dir) to path: 0, or -ENAMETOOLONG, or the
 * error of formatting, mounting or linking (then nothing is claimed). A crash leaves either an
 * unclaimed volume (the next ka_volumes_new releases it) or the link (release what it names).
 */
int ka_volume_claim(ka_volumes_t *v, const char *link, char *path, size_t cap);

/*
 * Releases the volume mounted at path (one that a claim returned, possibly an earlier node's):
 * marks it unclaimed at once (a crash from here on leaves it to the next ka_volumes_new), then
 * the filler thread empties it into a spare (only if reuse: the caller saw every process and
 * mount of its sandbox end), or detaches the mount (its loop device goes with its last mount)
 * and deletes the image, so its blocks return to the host. 0, -EINVAL if path is not a volume
 * of v's dir, or a negative errno.
 */
int ka_volume_release(ka_volumes_t *v, const char *path, bool reuse);

/*
 * A claimed volume that outlives its sandbox (its /data is kept for a later start of the same
 * sandbox): unmount detaches its mount and keeps its image claimed; mount mounts that image
 * again at path if it is not mounted (after an unmount, or a reboot), through the loop device
 * that still backs it if one does: a file system can outlive its mounts here (in a crashed
 * node's sandbox namespace being torn down), and an image never gets a second one. 0, -EINVAL
 * if path is not a volume of v's dir, -ENOENT if it is not claimed, or a negative errno.
 */
int ka_volume_unmount(ka_volumes_t *v, const char *path);
int ka_volume_mount(ka_volumes_t *v, const char *path);

/*
 * Mounts at dir (created if missing; a leftover mount there is replaced) a tmpfs holding a copy
 * of the regular file src as dir/name, mode 0555 (bind it read-only): a bind of that copy names
 * no host path in the sandbox's /proc/self/mountinfo. 0 or a negative errno (nothing left).
 */
int ka_volume_file(const char *dir, const char *src, const char *name);

/* Unmounts what ka_volume_file mounted at dir and removes dir. */
void ka_volume_file_remove(const char *dir);

#endif
