/* guest_files: workspace-confined file reads and writes (see guest_files.h). */
#include "guest_files.h"
#include "guest_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

const char *ka_gf_strerror(int err)
{
    switch (err) {
    case -ENOENT:
        return "no such file";
    case -EACCES:
        return "path escapes the workspace";
    case -EFBIG:
        return "File exceeds 64 MiB transfer limit";
    case -EISDIR:
        return "is a directory";
    case -EINVAL:
        return "invalid path or not a regular file";
    case -ENOTDIR:
        return "a parent is not a directory";
    case -ENOSPC:
        return "no space left";
    default:
        return "file operation failed";
    }
}

char *ka_gf_rel(const char *path, size_t n, int *err)
{
    static const char pre[] = KA_GP_WORKSPACE "/";
    *err = -EINVAL;
    if (n == 0 || memchr(path, 0, n))
        return NULL;
    if (path[0] == '/') {
        if (n <= sizeof(pre) - 1 || memcmp(path, pre, sizeof(pre) - 1) != 0) {
            *err = -EACCES;
            return NULL;
        }
        path += sizeof(pre) - 1;
        n -= sizeof(pre) - 1;
    }
    char *r = strndup(path, n);
    if (!r)
        *err = -ENOMEM;
    return r;
}

int ka_gf_openat2(int dir, const char *rel, int flags, unsigned mode, uint64_t resolve)
{
    struct open_how how = {
        .flags = (uint64_t)(flags | O_CLOEXEC | ((flags & O_PATH) ? 0 : O_NOCTTY)),
        .mode = (flags & O_CREAT) ? (mode & 07777) : 0,
        .resolve = resolve,
    };
    long fd = syscall(SYS_openat2, dir, rel, &how, sizeof(how));
    if (fd < 0)
        return (errno == EXDEV || errno == ELOOP) ? -EACCES : -errno;
    return (int)fd;
}

static int s_open(int ws, const char *rel, int flags, unsigned mode)
{
    return ka_gf_openat2(ws, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
}

int ka_gf_mkparents(int ws, const char *rel)
{
    char *copy = strdup(rel);
    if (!copy)
        return -ENOMEM;
    int cur = ws, rc = 0;
    char *comp = copy;
    for (char *slash; (slash = strchr(comp, '/')) != NULL; comp = slash + 1) {
        *slash = 0;
        if (comp[0] == 0 || strcmp(comp, ".") == 0)
            continue;
        if (strcmp(comp, "..") == 0) {
            rc = -EACCES;
            break;
        }
        if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) {
            rc = -errno;
            break;
        }
        int next = ka_gf_openat2(cur, comp, O_PATH | O_DIRECTORY, 0,
                                 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
        if (next < 0) {
            rc = next;
            break;
        }
        if (cur != ws)
            close(cur);
        cur = next;
    }
    if (cur != ws)
        close(cur);
    free(copy);
    return rc;
}

static int s_check_regular(int fd, size_t cap, size_t *size)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (S_ISDIR(st.st_mode))
        return -EISDIR;
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    if ((uint64_t)st.st_size > cap)
        return -EFBIG;
    *size = (size_t)st.st_size;
    return 0;
}

int ka_gf_open_read(int ws_fd, const char *path, size_t pathlen, unsigned mode, size_t cap,
                    int *fd_out, size_t *size)
{
    int rc;
    char *rel = ka_gf_rel(path, pathlen, &rc);
    *fd_out = -1;
    *size = 0;
    if (!rel)
        return rc;
    int fd = s_open(ws_fd, rel, O_RDONLY | O_NONBLOCK, 0);
    if (fd == -ENOENT && mode != 0) {
        rc = ka_gf_mkparents(ws_fd, rel);
        if (rc == 0) {
            fd = s_open(ws_fd, rel, O_WRONLY | O_CREAT, mode);
            if (fd >= 0 && fchmod(fd, mode & 07777) < 0)
                rc = -errno;
            if (fd >= 0)
                close(fd);
            else
                rc = fd;
        }
        free(rel);
        return rc;
    }
    free(rel);
    if (fd < 0)
        return fd;
    rc = s_check_regular(fd, cap, size);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

int ka_gf_write(int ws_fd, const char *path, size_t pathlen, unsigned mode, uint64_t seek,
                const void *data, size_t len)
{
    int rc;
    char *rel = ka_gf_rel(path, pathlen, &rc);
    if (!rel)
        return rc;
    unsigned cmode = mode ? mode : 0644;
    int flags = O_WRONLY | O_CREAT | O_NONBLOCK | (seek == 0 ? O_TRUNC : 0);
    int fd = s_open(ws_fd, rel, flags, cmode);
    if (fd == -ENOENT) {
        rc = ka_gf_mkparents(ws_fd, rel);
        fd = rc < 0 ? rc : s_open(ws_fd, rel, flags, cmode);
    }
    free(rel);
    if (fd < 0)
        return fd;
    size_t size;
    rc = s_check_regular(fd, SIZE_MAX, &size);
    if (rc == 0 && mode && fchmod(fd, mode & 07777) < 0)
        rc = -errno;
    size_t done = 0;
    while (rc == 0 && done < len) {
        ssize_t n = pwrite(fd, (const char *)data + done, len - done, (off_t)(seek + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = -errno;
        else
            done += (size_t)n;
    }
    close(fd);
    return rc;
}
