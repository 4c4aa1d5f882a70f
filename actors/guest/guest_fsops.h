/*
 * guest_fsops: the guest's directory and metadata operations (list, stat, remove, mkdir,
 * move), confined to the workspace exactly as guest_files.h reads and writes are.
 *
 * The parent of a path is resolved with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from
 * the workspace fd; the last component is never followed: it is acted on relative to the
 * parent fd (fstatat AT_SYMLINK_NOFOLLOW, unlinkat, renameat2, mkdirat, O_NOFOLLOW opens). A
 * recursive remove walks by directory fds opened with O_NOFOLLOW, so a directory swapped for a
 * symlink mid-walk is refused, never followed. "", "." and the workspace itself name the root,
 * which can be listed and stat'ed but never removed or moved (-EINVAL). A listing or watch of
 * "link/" follows link (confined): the trailing slash asks for the directory.
 *
 * Errors (negative errno): -ENOENT, -EEXIST, -ENOTDIR, -ENOTEMPTY, -EINVAL (bad path),
 * -ENAMETOOLONG, -EACCES (escapes the workspace), -EPERM (the kernel refused), -ENOMEM.
 */
#ifndef KA_GUEST_FSOPS_H
#define KA_GUEST_FSOPS_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guest_proto.h"

#define KA_GFS_DEPTH_MAX 256 /* directory depth a recursive remove descends */

/* One directory entry or stat result. */
typedef struct ka_gfs_entry {
    char name[KA_GP_NAME_MAX + 1]; /* "." for the root */
    uint32_t type;                 /* KA_GP_FT_* */
    uint64_t size;
    uint32_t mode; /* permission bits */
    int64_t mtime_ms;
} ka_gfs_entry_t;

/* A page of a listing (entries owned, free with ka_gfs_list_free). */
typedef struct ka_gfs_list {
    ka_gfs_entry_t *entries;
    size_t n;
    bool more; /* names after the last entry exist */
} ka_gfs_list_t;

/* The entries of directory path whose names sort (bytewise) after `after` (n 0: from the
 * first), at most limit (0: KA_GP_PAGE_DEF; capped at KA_GP_PAGE_MAX), in name order. */
int ka_gfs_list(int ws, const char *path, size_t n, const char *after, size_t an, size_t limit,
                ka_gfs_list_t *out);
void ka_gfs_list_free(ka_gfs_list_t *l);
int ka_gfs_stat(int ws, const char *path, size_t n, ka_gfs_entry_t *out);
/* A file, a symlink or an empty directory; a non-empty directory only if recursive. */
int ka_gfs_remove(int ws, const char *path, size_t n, bool recursive);
/* mode 0: 0755. parents: create missing parents, and an existing directory is no error. */
int ka_gfs_mkdir(int ws, const char *path, size_t n, bool parents, unsigned mode);
/* Renames src to dst; an existing dst is replaced only if overwrite (-EEXIST otherwise). */
int ka_gfs_move(int ws, const char *src, size_t sn, const char *dst, size_t dn, bool overwrite);
/* Opens directory path for reading (O_NOFOLLOW on its last component, unless the path ends
 * with '/': then a symlink is followed, confined); the root is reopened from ws. The fd
 * (caller closes), or a negative errno. */
int ka_gfs_open_dir(int ws, const char *path, size_t n);

/* Packs e as the wire entry [name, type, size, mode, mtime_ms] (guest_proto.h). */
void ka_gfs_pack_entry(msgpack_packer *pk, const ka_gfs_entry_t *e);
/* A short static message for an error of these operations. */
const char *ka_gfs_strerror(int err);

#endif
