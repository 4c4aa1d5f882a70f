/*
 * Claims are files "<base>-<count>-<state hash>" holding "pid state_dir". A live node holds its
 * claim with a shared flock; whoever can take an exclusive lock on a claim knows its node is
 * gone and removes it. A claim appears under its name only once locked (it is written under a
 * temporary name, locked, then renamed), so no newcomer can mistake it for a stale one.
 */
#include "ka_uidrange.h"
#include "ka_tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t s_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Whether another node's claim name overlaps [base, base + count) for a different state. */
static int s_conflicts(const char *name, uint32_t base, uint32_t count, uint64_t hash)
{
    uint32_t b, n;
    uint64_t h;
    char end;
    if (sscanf(name, "%" SCNu32 "-%" SCNu32 "-%" SCNx64 "%c", &b, &n, &h, &end) != 3)
        return 0;
    return h != hash && (uint64_t)b < (uint64_t)base + count && (uint64_t)base < (uint64_t)b + n;
}

/* A live holder of dir/name: 1 (its pid and state dir in why), 0 if it was stale (removed). */
static int s_live(int dfd, const char *name, char *why, size_t cap)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        unlinkat(dfd, name, 0);
        close(fd);
        return 0;
    }
    char who[4200] = "";
    ssize_t r = read(fd, who, sizeof who - 1);
    who[r > 0 ? r : 0] = 0;
    who[strcspn(who, "\n")] = 0;
    close(fd);
    snprintf(why, cap, "host uids of claim %s are held by another kagentd (pid and state: %s)",
             name, who);
    return 1;
}

static int s_scan(const char *dir, uint32_t base, uint32_t count, uint64_t hash, char *why,
                  size_t cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)))
        if (s_conflicts(e->d_name, base, count, hash) && s_live(dirfd(d), e->d_name, why, cap))
            rc = -EADDRINUSE;
    closedir(d);
    return rc;
}

/* Holds c->path: the claim a node of the same state dir left (live or not), else a new one. */
static int s_hold(ka_uidrange_t *c, const char *tmp, const char *state)
{
    c->fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (c->fd >= 0)
        return flock(c->fd, LOCK_SH) < 0 ? -errno : 0;
    unlink(tmp);
    c->fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (c->fd < 0)
        return -errno;
    char line[4200];
    int n = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), state);
    int rc = flock(c->fd, LOCK_SH) < 0 || write(c->fd, line, (size_t)n) != n ? -errno : 0;
    if (!rc && rename(tmp, c->path) < 0)
        rc = -errno;
    return rc;
}

int ka_uidrange_claim(ka_uidrange_t *c, const char *dir, uint32_t base, uint32_t count,
                      const char *state_dir, char *why, size_t cap)
{
    c->fd = -1;
    c->path[0] = 0;
    if (why && cap)
        why[0] = 0;
    if (!dir)
        dir = KA_UIDRANGE_DIR;
    if (!count || (uint64_t)base + count > UINT32_MAX || !state_dir)
        return -EINVAL;
    uint64_t hash = s_hash(state_dir);
    char tmp[sizeof c->path];
    snprintf(c->path, sizeof c->path, "%s/%" PRIu32 "-%" PRIu32 "-%016" PRIx64, dir, base, count,
             hash);
    snprintf(tmp, sizeof tmp, "%s/.new-%ld", dir, (long)getpid());
    int rc = ka_mkdirs(dir, 0700);
    if (!rc)
        rc = s_hold(c, tmp, state_dir);
    if (!rc)
        rc = s_scan(dir, base, count, hash, why, cap);
    if (rc) {
        unlink(tmp);
        if (c->fd >= 0 && rc == -EADDRINUSE) {
            /* ours was renamed into place: take it out again unless a sibling shares it */
            if (flock(c->fd, LOCK_EX | LOCK_NB) == 0)
                unlink(c->path);
        }
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
    }
    return rc;
}

void ka_uidrange_release(ka_uidrange_t *c)
{
    if (c->fd < 0)
        return;
    if (flock(c->fd, LOCK_EX | LOCK_NB) == 0) /* the last holder of this claim */
        unlink(c->path);
    close(c->fd);
    c->fd = -1;
}
