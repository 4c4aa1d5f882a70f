/* ka_basens: the mount namespace a sandbox's own is copied from (see ka_basens.h). */
#include "ka_basens.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#define S_MAX_DETACH 64   /* mounts detached per pass (a pass repeats until none is left) */
#define S_MP_LEN     4096 /* PATH_MAX */

typedef char s_mp_t[S_MP_LEN];

/* Undoes mountinfo's octal escapes (space, tab, newline, backslash) in place. */
static void s_unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; o++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *o = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 4;
        } else {
            *o = *p++;
        }
    }
    *o = 0;
}

/* Whether mount point mp lies under dir (dir itself, if a mount, is kept). */
static bool s_under(const char *mp, const char *dir)
{
    size_t n = strlen(dir);
    return strncmp(mp, dir, n) == 0 && mp[n] == '/';
}

/* The mount points under dir in this thread's namespace, the last mounted first, up to
 * max of them into out; returns how many there are in all, or -errno. */
static int s_scan(const char *dir, s_mp_t *out, int max)
{
    FILE *f = fopen("/proc/thread-self/mountinfo", "re");
    if (!f)
        return -errno;
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        char *save = NULL, *mp = strtok_r(line, " ", &save);
        for (int i = 0; i < 4 && mp; i++)
            mp = strtok_r(NULL, " ", &save);
        if (!mp)
            continue;
        s_unescape(mp);
        if (!s_under(mp, dir))
            continue;
        if (n < max) { /* newest first: children before the mounts they sit on */
            memmove(out + 1, out, (size_t)n * sizeof(*out));
            snprintf(out[0], sizeof(out[0]), "%s", mp);
        }
        n++;
    }
    free(line);
    fclose(f);
    return n;
}

typedef struct {
    const char *dir;
    int ns; /* open: the namespace made; count: the one to look into */
    int rc;
} s_job_t;

/* Detaches every mount under dir from this thread's (private) namespace. */
static int s_detach_all(const char *dir)
{
    s_mp_t *mps = malloc(S_MAX_DETACH * sizeof(*mps));
    if (!mps)
        return -ENOMEM;
    int n;
    while ((n = s_scan(dir, mps, S_MAX_DETACH)) > 0) {
        int gone = 0;
        for (int i = 0; i < n && i < S_MAX_DETACH; i++)
            gone += umount2(mps[i], MNT_DETACH | UMOUNT_NOFOLLOW) == 0;
        if (gone == 0) {
            n = -EBUSY; /* nothing moves: never loop */
            break;
        }
    }
    free(mps);
    return n;
}

/* In a thread of its own: a namespace of its own (its own fs_struct too, which setns and
 * unshare of a mount namespace require of a thread), private so nothing done in it reaches the
 * node's, without the volumes. The thread's end leaves the namespace to the descriptor. */
static void *s_open_main(void *arg)
{
    s_job_t *j = arg;
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        j->rc = -errno;
        return NULL;
    }
    j->rc = s_detach_all(j->dir);
    if (j->rc < 0)
        return NULL;
    j->ns = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC);
    j->rc = j->ns < 0 ? -errno : 0;
    return NULL;
}

static void *s_count_main(void *arg)
{
    s_job_t *j = arg;
    if (unshare(CLONE_FS) < 0 || setns(j->ns, CLONE_NEWNS) < 0) {
        j->rc = -errno;
        return NULL;
    }
    j->rc = s_scan(j->dir, NULL, 0);
    return NULL;
}

static int s_in_thread(void *(*fn)(void *), s_job_t *j)
{
    pthread_t t;
    int err = pthread_create(&t, NULL, fn, j);
    if (err)
        return -err;
    pthread_join(t, NULL);
    return j->rc;
}

int ka_basens_open(const char *volume_dir)
{
    s_job_t j = {.dir = volume_dir, .ns = -1, .rc = -EINVAL};
    int rc = s_in_thread(s_open_main, &j);
    if (rc < 0 && j.ns >= 0)
        close(j.ns);
    return rc < 0 ? rc : j.ns;
}

int ka_basens_count(int ns, const char *dir)
{
    s_job_t j = {.dir = dir, .ns = ns, .rc = -EINVAL};
    return s_in_thread(s_count_main, &j);
}
