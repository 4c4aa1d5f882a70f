/*
 * guest_files: the guest's file API, confined to a workspace directory.
 *
 * Paths are relative to the workspace (an absolute path is accepted only if it starts with
 * KA_GP_WORKSPACE "/"). Resolution uses openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from
 * the workspace fd, so "..", absolute symlinks and symlinks that lead out are refused
 * (-EACCES) whatever the path looks like. Parents are created component by component, never
 * following a symlink.
 */
#ifndef KA_GUEST_FILES_H
#define KA_GUEST_FILES_H

#include <stddef.h>
#include <stdint.h>

/*
 * Opens path for reading: *fd (caller closes) and its *size now, so the caller can stream it
 * in chunks (nothing holds the whole file). A missing file with mode != 0 is created empty
 * (with its parents) and reads as empty: 0 with *fd = -1 and *size = 0.
 * Errors: -ENOENT, -EACCES (escape), -EISDIR / -EINVAL (not a regular file), -EFBIG (> cap).
 */
int ka_gf_open_read(int ws_fd, const char *path, size_t pathlen, unsigned mode, size_t cap, int *fd,
                    size_t *size);
/*
 * Writes len bytes at seek (0 = truncate first), creating the file (mode, default 0644) and
 * its parents. A non-zero mode is applied to an existing file too.
 */
int ka_gf_write(int ws_fd, const char *path, size_t pathlen, unsigned mode, uint64_t seek,
                const void *data, size_t len);
/* A NUL-terminated workspace-relative copy of path (caller frees), or NULL with *err:
 * -EINVAL (empty, NUL inside), -EACCES (absolute outside the workspace), -ENOMEM. */
char *ka_gf_rel(const char *path, size_t n, int *err);
/* openat2(dir, rel) with flags | O_CLOEXEC and resolve; an escape (EXDEV, ELOOP) is -EACCES. */
int ka_gf_openat2(int dir, const char *rel, int flags, unsigned mode, uint64_t resolve);
/* Creates the parent directories of rel (0755), one component at a time, following no
 * symlink. 0 or -errno. */
int ka_gf_mkparents(int ws, const char *rel);
/* A short static message for a ka_gf_* error. */
const char *ka_gf_strerror(int err);

#endif
