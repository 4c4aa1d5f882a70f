/* ka_volume: one ext4 loop volume per sandbox (see ka_volume.h). */
#include "ka_volume.h"

#include "ka_tree.h"
#include "krt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <linux/loop.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define S_DIR       400 /* the volumes' dir */
#define S_PATH      448 /* a volume's mount path or image */
#define S_MAX_SPARE 64
#define S_MKFS_ENV  "PATH=/usr/sbin:/sbin:/usr/bin:/bin"

extern char **environ;

struct ka_volumes {
    char dir[S_DIR];
    char skeleton[S_DIR]; /* "": none */
    char mkfs[64];
    int tmpl; /* a formatted, never mounted image that new volumes copy; -1: each runs mkfs */
    uint64_t bytes, inodes;
    unsigned spare;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t filler;
    bool filler_started, stopping;
    uint64_t next;                   /* the next volume number */
    uint64_t ready[2 * S_MAX_SPARE]; /* numbers of the spare volumes, a stack */
    unsigned n_ready;
    struct s_gone *gone; /* released volumes the filler still has to unmount and delete */
    uint64_t *loops;     /* a bit per loop device index this node attached and not removed */
    size_t loop_words;
    unsigned reap_ms; /* quiet time before unbound loop devices are removed */
    bool reap_due;    /* a volume was unmade since the last removal pass */
};

typedef struct s_gone {
    struct s_gone *next;
    uint64_t n;
    bool reuse;
} s_gone_t;

/* ---- one volume ----------------------------------------------------------------------------- */

static void s_paths(const ka_volumes_t *v, uint64_t n, char *mnt, char *img)
{
    snprintf(mnt, S_PATH, "%s/%" PRIu64, v->dir, n);
    snprintf(img, S_PATH + 8, "%s/%" PRIu64 ".img", v->dir, n);
}

/* Runs mkfs.ext4 on dev, the volume's loop device: 0 or -EIO. On a block device that nobody
 * holds mke2fs knows it unmounted from one O_EXCL open; on an image file it would check every
 * mount in the table instead (a stat, an open and an ioctl per loop-mounted file system: O(N)
 * per volume with N volumes mounted, 40 ms of system time at 2,300 here). */
static int s_mkfs(const ka_volumes_t *v, const char *dev)
{
    char inodes[24];
    snprintf(inodes, sizeof(inodes), "%" PRIu64, v->inodes);
    char *argv[] = {(char *)v->mkfs,
                    "-q",
                    "-F",
                    "-b",
                    "4096",
                    "-m",
                    "0",
                    "-N",
                    inodes,
                    "-O",
                    "^resize_inode",
                    "-E",
                    "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                    (char *)dev,
                    NULL,
                    NULL,
                    NULL};
    if (v->skeleton[0]) { /* -d DIR before the device */
        argv[13] = "-d";
        argv[14] = (char *)v->skeleton;
        argv[15] = (char *)dev;
    }
    char *envp[] = {S_MKFS_ENV, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, v->mkfs, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -rc;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

/* Attaches img_fd to a free loop device (autoclear); returns the device's fd (its index in
 * *index) or -errno. A device another attach, or the reaper, took first is tried again. */
static int s_loop_attach(int img_fd, char *dev, size_t cap, int *index)
{
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return -errno;
    int rc = -EBUSY;
    for (int tries = 0; tries < 32 && rc == -EBUSY; tries++) { /* another attach won the race */
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0) {
            rc = -errno;
            break;
        }
        snprintf(dev, cap, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            rc = errno == ENOENT || errno == ENXIO ? -EBUSY : -errno;
            continue;
        }
        struct loop_config lc;
        memset(&lc, 0, sizeof(lc));
        lc.fd = (uint32_t)img_fd;
        lc.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        if (ioctl(fd, LOOP_CONFIGURE, &lc) == 0) {
            rc = fd;
            *index = n;
        } else {
            rc = -errno;
            close(fd);
        }
    }
    close(ctl);
    return rc;
}

/* Mounts the formatted loop device dev at mnt (created): 0 or -errno (mnt not left behind). */
static int s_mount_dev(const char *dev, const char *mnt)
{
    int rc = mkdir(mnt, 0700) < 0 && errno != EEXIST ? -errno : 0;
    if (rc == 0 &&
        mount(dev, mnt, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "noinit_itable,discard") < 0) {
        rc = -errno;
        rmdir(mnt);
    }
    return rc;
}

/* Marks loop device index as one of v's (grows the set; a failed growth forgets it: the
 * device is then never removed, as before there was a reaper). */
static void s_loop_mark(ka_volumes_t *v, int index)
{
    size_t word = (size_t)index / 64;
    pthread_mutex_lock(&v->lock);
    if (word >= v->loop_words) {
        size_t n = word + 64;
        uint64_t *grown = realloc(v->loops, n * sizeof(*grown));
        if (grown) {
            memset(grown + v->loop_words, 0, (n - v->loop_words) * sizeof(*grown));
            v->loops = grown;
            v->loop_words = n;
        }
    }
    if (word < v->loop_words)
        v->loops[word] |= 1ull << (index % 64);
    pthread_mutex_unlock(&v->lock);
}

/* ---- the loop device of an image ------------------------------------------------------------ */

/* Each image records the index of the loop device last attached to it (an extended attribute;
 * where the file system has none, nothing is found): a file system on that device can outlive
 * every mount of it here (a crashed node's sandbox namespace still being torn down), and a
 * second device on the same image would be a second file system over the same blocks, the
 * new one missing what the old one had not written back yet, each writing over the other. */
#define S_LOOP_XATTR "trusted.kagent.loop"

static void s_loop_note(int img_fd, int index)
{
    char b[16];
    int n = snprintf(b, sizeof(b), "%d", index);
    (void)fsetxattr(img_fd, S_LOOP_XATTR, b, (size_t)n, 0);
}

/* /dev/loop<index> opened if it is bound to the image img (it stays bound while held), its
 * path in dev; -ENOENT if it is not. */
static int s_loop_open_if(int index, const struct stat *img, char *dev, size_t cap)
{
    snprintf(dev, cap, "/dev/loop%d", index);
    int fd = open(dev, O_RDWR | O_CLOEXEC);
    struct loop_info64 li;
    if (fd >= 0 && ioctl(fd, LOOP_GET_STATUS64, &li) == 0 && li.lo_inode == img->st_ino &&
        li.lo_device == img->st_dev)
        return fd;
    if (fd >= 0)
        close(fd);
    return -ENOENT;
}

/* The loop device that still backs image img_fd, opened (its index in *index); -ENOENT. */
static int s_loop_find(int img_fd, char *dev, size_t cap, int *index)
{
    struct stat img;
    char b[16];
    if (fstat(img_fd, &img) < 0)
        return -ENOENT;
    ssize_t n = fgetxattr(img_fd, S_LOOP_XATTR, b, sizeof(b) - 1);
    if (n <= 0)
        return -ENOENT;
    b[n] = 0;
    *index = atoi(b);
    return *index >= 0 ? s_loop_open_if(*index, &img, dev, cap) : -ENOENT;
}

/* Mounts the formatted image img at mnt (created): 0 or -errno (nothing left behind). Through
 * the loop device that still backs it if one does (reuse), sharing its file system. */
static int s_mount(ka_volumes_t *v, const char *img, const char *mnt, bool reuse)
{
    char dev[32];
    int fd = open(img, O_RDWR | O_CLOEXEC), index = -1;
    if (fd < 0)
        return -errno;
    int loop = reuse ? s_loop_find(fd, dev, sizeof(dev), &index) : -ENOENT;
    if (loop < 0 && (loop = s_loop_attach(fd, dev, sizeof(dev), &index)) >= 0)
        s_loop_note(fd, index);
    close(fd);
    if (loop < 0)
        return loop;
    s_loop_mark(v, index);
    int rc = s_mount_dev(dev, mnt);
    close(loop); /* from here the mount holds the device; it goes with the last mount */
    return rc;
}

/* Copies the template's data extents into out, sized as the template: 0 or -errno. A
 * formatted, unused volume holds ~200 KB of metadata in 10 GiB: copying them takes ~0.2 ms of
 * CPU where mkfs.ext4 takes ~2 ms and a process. */
static int s_copy_sparse(int in, int out, uint64_t bytes)
{
    if (ftruncate(out, (off_t)bytes) < 0)
        return -errno;
    off_t pos = 0;
    for (;;) {
        off_t from = lseek(in, pos, SEEK_DATA);
        if (from < 0)
            return errno == ENXIO ? 0 : -errno; /* ENXIO: no data past pos */
        off_t end = lseek(in, from, SEEK_HOLE), to = from;
        if (end < 0)
            return -errno;
        while (from < end) {
            ssize_t n = copy_file_range(in, &from, out, &to, (size_t)(end - from), 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return n < 0 ? -errno : -EIO;
        }
        pos = end;
    }
}

/* Formats the image open at fd, sized v->bytes, through a loop device: 0 or -errno. */
static int s_format(const ka_volumes_t *v, int fd)
{
    char dev[32];
    if (ftruncate(fd, (off_t)v->bytes) < 0)
        return -errno;
    int index;
    int loop = s_loop_attach(fd, dev, sizeof(dev), &index);
    if (loop < 0)
        return loop;
    int rc = s_mkfs(v, dev);
    close(loop); /* autoclear: nothing holds the device, it goes */
    return rc;
}

/* Makes the template: an unnamed image in dir (O_TMPFILE: nothing to clean up after a crash),
 * formatted once per node start with the node's size and inode count. Without it (-errno),
 * every new volume is formatted on its own. */
static int s_template(ka_volumes_t *v)
{
    int fd = open(v->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int rc = s_format(v, fd);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    v->tmpl = fd;
    return 0;
}

/* Makes and mounts volume n, a copy of the template (or formatted on its own): 0 or -errno
 * (nothing left behind on failure). All volumes of a node share the template's file system
 * UUID, which ext4 allows; nothing here identifies a volume by it. */
static int s_make(ka_volumes_t *v, uint64_t n)
{
    char mnt[S_PATH], img[S_PATH + 8];
    s_paths(v, n, mnt, img);
    int fd = open(img, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int rc = v->tmpl >= 0 ? s_copy_sparse(v->tmpl, fd, v->bytes) : s_format(v, fd);
    close(fd);
    if (rc == 0)
        rc = s_mount(v, img, mnt, false);
    if (rc < 0)
        unlink(img);
    return rc;
}

/* The number of the volume at path if it is one of dir's, else 0. */
static uint64_t s_number(const char *dir, const char *path)
{
    size_t n = strlen(dir), digits = strspn(path + n + 1, "0123456789");
    if (strncmp(path, dir, n) != 0 || path[n] != '/' || digits == 0 || digits > 19 ||
        path[n + 1 + digits] != 0)
        return 0;
    return strtoull(path + n + 1, NULL, 10);
}

/* Unmounts volume n (its loop device goes with its last mount) and deletes its image. */
static int s_unmake(const ka_volumes_t *v, uint64_t n)
{
    char path[S_PATH], img[S_PATH + 8];
    s_paths(v, n, path, img);
    int rc = 0;
    if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT)
        rc = -errno;
    if (rmdir(path) < 0 && errno != ENOENT && rc == 0)
        rc = -errno;
    static const char *const ext[] = {".img", ".used"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(img, sizeof(img), "%s%s", path, ext[i]);
        if (unlink(img) < 0 && errno != ENOENT && rc == 0)
            rc = -errno;
    }
    return rc;
}

/* ---- a read-only file ------------------------------------------------------------------------ */

static int s_copy_fd(int from, int to)
{
    char buf[65536];
    ssize_t n;
    while ((n = read(from, buf, sizeof(buf))) > 0)
        if (write(to, buf, (size_t)n) != n)
            return -EIO;
    return n < 0 ? -errno : 0;
}

void ka_volume_file_remove(const char *dir)
{
    while (umount2(dir, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
        ;
    rmdir(dir);
}

int ka_volume_file(const char *dir, const char *src, const char *name)
{
    char opts[64], dst[S_PATH + 64];
    struct stat st;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    int rc = fstat(in, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
    ka_volume_file_remove(dir);
    snprintf(opts, sizeof(opts), "mode=755,size=%llu", (unsigned long long)st.st_size + 65536);
    snprintf(dst, sizeof(dst), "%s/%s", dir, name);
    if (rc == 0 && ((mkdir(dir, 0755) < 0 && errno != EEXIST) ||
                    mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0))
        rc = -errno;
    int out = rc < 0 ? -1 : open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0555);
    if (rc == 0 && out < 0)
        rc = -errno;
    if (rc == 0)
        rc = s_copy_fd(in, out);
    if (out >= 0 && close(out) < 0 && rc == 0)
        rc = -errno;
    close(in);
    if (rc < 0)
        ka_volume_file_remove(dir);
    return rc;
}

/* ---- the spares ----------------------------------------------------------------------------- */

int ka_volume_release(ka_volumes_t *v, const char *path, bool reuse)
{
    uint64_t n = s_number(v->dir, path);
    if (n == 0)
        return -EINVAL;
    char mnt[S_PATH], img[S_PATH + 8], used[S_PATH + 8];
    s_paths(v, n, mnt, img);
    snprintf(used, sizeof(used), "%s.used", mnt);
    if (rename(used, img) < 0 && errno != ENOENT) /* unclaimed: a crash now leaves a spare */
        return -errno;
    s_gone_t *g = v->filler_started ? malloc(sizeof(*g)) : NULL;
    if (!g)
        return s_unmake(v, n);
    g->n = n;
    g->reuse = reuse;
    pthread_mutex_lock(&v->lock);
    g->next = v->gone;
    v->gone = g;
    pthread_cond_signal(&v->wake);
    pthread_mutex_unlock(&v->lock);
    return 0;
}

/* True if path is a mount point (its device differs from its parent's). */
static bool s_mounted(const char *path)
{
    char parent[S_PATH + 4];
    struct stat a, b;
    snprintf(parent, sizeof(parent), "%s/..", path);
    return stat(path, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

int ka_volume_unmount(ka_volumes_t *v, const char *path)
{
    if (s_number(v->dir, path) == 0)
        return -EINVAL;
    if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT)
        return -errno;
    return 0;
}

int ka_volume_mount(ka_volumes_t *v, const char *path)
{
    uint64_t n = s_number(v->dir, path);
    if (n == 0)
        return -EINVAL;
    if (s_mounted(path))
        return 0;
    char mnt[S_PATH], img[S_PATH + 8], used[S_PATH + 8];
    s_paths(v, n, mnt, img);
    snprintf(used, sizeof(used), "%s.used", mnt);
    if (access(used, F_OK) != 0)
        return -ENOENT; /* not claimed: nothing of a sandbox is on it */
    return s_mount(v, used, mnt, true);
}

static int s_rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP || flag == FTW_D)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

/* Makes the directories of the tree at from (a skeleton: directories only, a few levels)
 * under to, with their modes: 0 or -errno. */
static int s_skel_copy(const char *from, const char *to, int depth)
{
    DIR *dir = opendir(from);
    if (!dir)
        return -errno;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        char a[S_PATH + 64], b[S_PATH + 64];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if ((size_t)snprintf(a, sizeof(a), "%s/%s", from, e->d_name) >= sizeof(a) ||
            (size_t)snprintf(b, sizeof(b), "%s/%s", to, e->d_name) >= sizeof(b))
            rc = -ENAMETOOLONG;
        else if (lstat(a, &st) < 0)
            rc = -errno;
        else if (!S_ISDIR(st.st_mode))
            continue;
        else if ((mkdir(b, 0700) < 0 && errno != EEXIST) || chmod(b, st.st_mode & 07777) < 0)
            rc = -errno;
        else if (depth < 8)
            rc = s_skel_copy(a, b, depth + 1);
    }
    closedir(dir);
    return rc;
}

/* Empties volume n (its sandbox is gone) and makes the skeleton again: 0 if only lost+found
 * and the skeleton are there, else -ENOTEMPTY (or the skeleton's error). */
static int s_wipe(const ka_volumes_t *v, uint64_t n)
{
    char mnt[S_PATH], img[S_PATH + 8], p[S_PATH + 260];
    s_paths(v, n, mnt, img);
    DIR *dir = opendir(mnt);
    if (!dir)
        return -errno;
    int left = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            strcmp(e->d_name, "lost+found") == 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", mnt, e->d_name);
        nftw(p, s_rm_cb, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
        left += access(p, F_OK) == 0 || errno != ENOENT;
    }
    closedir(dir);
    return left ? -ENOTEMPTY : v->skeleton[0] ? s_skel_copy(v->skeleton, mnt, 0) : 0;
}

/* Recycles the released volumes: emptied into spares while there are fewer than twice `spare`
 * (new ones are formatted only below `spare`, so a steady start-stop rhythm formats and
 * unmounts nothing), else unmade (also when emptying fails, e.g. a tree too deep to walk).
 * Called and returns with v->lock held. */
static void s_recycle_gone(ka_volumes_t *v)
{
    while (v->gone) {
        s_gone_t *g = v->gone;
        v->gone = g->next;
        bool keep = g->reuse && !v->stopping && v->n_ready < 2 * v->spare;
        pthread_mutex_unlock(&v->lock);
        if (!keep || s_wipe(v, g->n) < 0) {
            s_unmake(v, g->n);
            keep = false;
        }
        pthread_mutex_lock(&v->lock);
        bool spare = keep && v->n_ready < 2 * v->spare;
        if (spare)
            v->ready[v->n_ready++] = g->n;
        else if (keep) {
            pthread_mutex_unlock(&v->lock);
            s_unmake(v, g->n);
            pthread_mutex_lock(&v->lock);
        }
        v->reap_due = v->reap_due || !spare; /* unmade: its loop device is free */
        free(g);
    }
}

/* True while the filler has something to do: stop, release, or make a spare. */
static bool s_busy(const ka_volumes_t *v)
{
    return v->stopping || v->gone || v->n_ready < v->spare;
}

/* Removes the loop devices v attached that nothing binds now (their volumes unmade), highest
 * index first, one at a time, until the filler has work again. Each LOOP_CTL_REMOVE takes ~50
 * ms of wall time here (the disk's teardown) and ~0.3 ms of CPU; a bound or open device answers
 * EBUSY and is kept. An attach of v's own that got a device from LOOP_CTL_GET_FREE just before
 * it went takes another (s_loop_attach). Called and returns with v->lock held. */
static void s_reap(ka_volumes_t *v)
{
    v->reap_due = false;
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0)
        return;
    for (size_t w = v->loop_words; w-- > 0 && !v->reap_due;)
        for (int b = 63; b >= 0; b--) {
            if (!(v->loops[w] & (1ull << b)))
                continue;
            if (s_busy(v)) {
                v->reap_due = true; /* the rest after the work, at the next quiet spell */
                break;
            }
            pthread_mutex_unlock(&v->lock);
            int rc = ioctl(ctl, LOOP_CTL_REMOVE, (int)(w * 64 + (size_t)b)) < 0 ? errno : 0;
            pthread_mutex_lock(&v->lock);
            if (rc != EBUSY) /* removed, or gone already */
                v->loops[w] &= ~(1ull << b);
        }
    close(ctl);
}

/* Waits for work; once a volume was unmade, a quiet spell of reap_ms removes the loop devices
 * left unbound. Called and returns with v->lock held. */
static void s_idle(ka_volumes_t *v)
{
    while (!s_busy(v)) {
        if (!v->reap_due) {
            pthread_cond_wait(&v->wake, &v->lock);
            continue;
        }
        struct timespec until;
        krt_deadline(CLOCK_MONOTONIC, (int)v->reap_ms, &until);
        if (pthread_cond_timedwait(&v->wake, &v->lock, &until) == ETIMEDOUT && !s_busy(v))
            s_reap(v);
    }
}

static void *s_filler(void *arg)
{
    ka_volumes_t *v = arg;
    pthread_mutex_lock(&v->lock);
    for (;;) {
        s_idle(v);
        s_recycle_gone(v);
        if (v->stopping)
            break;
        if (v->n_ready >= v->spare)
            continue;
        uint64_t n = v->next++;
        pthread_mutex_unlock(&v->lock);
        int rc = s_make(v, n);
        pthread_mutex_lock(&v->lock);
        if (rc < 0) { /* claims format their own and report the error; wait for the next one */
            pthread_cond_wait(&v->wake, &v->lock);
            continue;
        }
        v->ready[v->n_ready++] = n;
    }
    pthread_mutex_unlock(&v->lock);
    return NULL;
}

int ka_volume_claim(ka_volumes_t *v, const char *link, char *path, size_t cap)
{
    pthread_mutex_lock(&v->lock);
    bool spare = v->n_ready > 0;
    uint64_t n = spare ? v->ready[--v->n_ready] : v->next++;
    pthread_cond_signal(&v->wake);
    pthread_mutex_unlock(&v->lock);
    char mnt[S_PATH], img[S_PATH + 8], used[S_PATH + 8];
    s_paths(v, n, mnt, img);
    snprintf(used, sizeof(used), "%s.used", mnt);
    int rc = strlen(mnt) >= cap ? -ENAMETOOLONG : spare ? 0 : s_make(v, n);
    if (rc == 0 && (symlink(mnt, link) < 0 || rename(img, used) < 0))
        rc = -errno;
    if (rc < 0) {
        s_unmake(v, n);
        return rc;
    }
    snprintf(path, cap, "%s", mnt);
    return 0;
}

/* Releases every volume in v->dir that no sandbox claimed (spares of an earlier run, or one
 * whose claim a crash cut short); numbers new ones past every one still there. */
static void s_release_spares(ka_volumes_t *v)
{
    DIR *dir = opendir(v->dir);
    if (!dir)
        return;
    struct dirent *e;
    char p[S_PATH], used[S_PATH + 8];
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name), digits = strspn(e->d_name, "0123456789");
        if (digits == 0 || digits > 19 ||
            (digits != len && strcmp(e->d_name + digits, ".img") != 0 &&
             strcmp(e->d_name + digits, ".used") != 0))
            continue;
        uint64_t n = strtoull(e->d_name, NULL, 10);
        if (n >= v->next)
            v->next = n + 1;
        snprintf(p, sizeof(p), "%s/%.*s", v->dir, (int)digits, e->d_name);
        snprintf(used, sizeof(used), "%s.used", p);
        if (access(used, F_OK) != 0)
            s_unmake(v, n);
    }
    closedir(dir);
}

static int s_find_mkfs(ka_volumes_t *v)
{
    static const char *const where[] = {"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"};
    for (size_t i = 0; i < sizeof(where) / sizeof(where[0]); i++)
        if (access(where[i], X_OK) == 0) {
            snprintf(v->mkfs, sizeof(v->mkfs), "%s", where[i]);
            return 0;
        }
    return -ENOENT;
}

ka_volumes_t *ka_volumes_new(const ka_volume_opts_t *opts, int *err)
{
    int rc = -EINVAL;
    ka_volumes_t *v = NULL;
    if (!opts || !opts->dir || opts->dir[0] != '/' || strlen(opts->dir) >= S_DIR ||
        (opts->skeleton && (opts->skeleton[0] != '/' || strlen(opts->skeleton) >= S_DIR)) ||
        opts->bytes < (16ULL << 20) || opts->spare > S_MAX_SPARE)
        goto fail;
    uint64_t inodes = opts->inodes ? opts->inodes : opts->bytes / KA_VOLUME_BYTES_PER_INODE;
    if (inodes < 16 || inodes > opts->bytes / 4096 || inodes > UINT32_MAX)
        goto fail;
    rc = -ENOMEM;
    if (!(v = calloc(1, sizeof(*v))))
        goto fail;
    snprintf(v->dir, sizeof(v->dir), "%s", opts->dir);
    snprintf(v->skeleton, sizeof(v->skeleton), "%s", opts->skeleton ? opts->skeleton : "");
    v->bytes = opts->bytes;
    v->inodes = inodes;
    v->spare = opts->spare;
    v->next = 1;
    v->tmpl = -1;
    v->reap_ms = opts->reap_ms ? opts->reap_ms : KA_VOLUME_DEFAULT_REAP_MS;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&v->lock, NULL);
    pthread_cond_init(&v->wake, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = s_find_mkfs(v)) < 0 || (access("/dev/loop-control", R_OK | W_OK) < 0 &&
                                      (rc = errno == ENOENT ? -ENOENT : -errno) < 0))
        goto fail;
    if (mkdir(v->dir, 0700) < 0 && errno != EEXIST) {
        rc = -errno;
        goto fail;
    }
    (void)ka_dir_spread(v->dir);  /* the volumes' mount points: a hint (ka_tree.h) */
    if ((rc = s_template(v)) < 0) /* formats each volume on its own, as before the template */
        krt_log(KRT_LOG_WARN, "volumes", "volume_template_unavailable",
                "errno=%d (each new volume runs mkfs.ext4)", -rc);
    s_release_spares(v);
    if (v->spare > 0) { /* the filler takes no signal: they stay the caller's threads' */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = -pthread_create(&v->filler, NULL, s_filler, v);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc < 0)
            goto fail;
        v->filler_started = true;
    }
    return v;
fail:
    ka_volumes_destroy(&v);
    if (err)
        *err = rc;
    return NULL;
}

void ka_volumes_destroy(ka_volumes_t **self_p)
{
    ka_volumes_t *v = *self_p;
    if (!v)
        return;
    *self_p = NULL;
    pthread_mutex_lock(&v->lock);
    v->stopping = true;
    pthread_cond_broadcast(&v->wake);
    pthread_mutex_unlock(&v->lock);
    if (v->filler_started)
        pthread_join(v->filler, NULL);
    pthread_mutex_lock(&v->lock);
    s_recycle_gone(v);
    pthread_mutex_unlock(&v->lock);
    for (unsigned i = 0; i < v->n_ready; i++)
        s_unmake(v, v->ready[i]);
    if (v->tmpl >= 0)
        close(v->tmpl);
    pthread_cond_destroy(&v->wake);
    pthread_mutex_destroy(&v->lock);
    free(v->loops);
    free(v);
}
