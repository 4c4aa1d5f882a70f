/* ka_namespaces: the `namespaces` sandbox class (see ka_namespaces.h). */
#include "ka_namespaces.h"
#include "guest_proto.h"
#include "ka_cgroup.h"
#include "ka_tree.h"
#include "ka_volume.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "phases.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef SECBIT_NOROOT
#define SECBIT_NOROOT                 (1 << 0)
#define SECBIT_NOROOT_LOCKED          (1 << 1)
#define SECBIT_NO_SETUID_FIXUP_LOCKED (1 << 3)
#define SECBIT_KEEP_CAPS_LOCKED       (1 << 5)
#endif

#define S_PATH        512 /* mount points in the child */
#define S_SDIR        400 /* the state dir */
#define S_DIR         470 /* a sandbox's dir */
#define S_CDIR        480 /* the child's root and data */
#define S_SANDBOX_UID KA_GP_UID
#define S_MAX_LOWER   128 /* image layers */
#define S_UID_BASE    1000000u
#define S_UID_COUNT   65536u
#define S_NOFILE      1024u
#define S_KEEP_MAX    (3 + KA_CGROUP_MAX_DIRS + S_MAX_LOWER)
#define S_CHANNEL_BUF (2 << 20) /* bytes each end of the guest channel may queue */

typedef struct s_driver {
    ka_driver_t base;
    char state_dir[S_SDIR];
    char guest_path[S_PATH];
    char cgroup_name[64];
    ka_cgroup_limits_t lim;
    uint32_t uid_base, uid_count, nofile;
    uint64_t tmp_bytes;
    char guest_dir[S_SDIR + 8];   /* <state>/.guest: the guest's read-only copy */
    char volume_dir[S_SDIR + 16]; /* <state>/.volumes */
    ka_volumes_t *volumes;
    char **guest_args;
    struct sock_fprog filter; /* exported once; the child only installs it */
    pthread_mutex_t lock;     /* guards the list of live sandboxes and the uid slots */
    struct ka_sandbox *live;
    struct s_kept *kept; /* sandboxes whose /data outlived them (park, or a crashed node) */
    uint64_t *slots;     /* one bit per uid of the range: taken */
    uint32_t next_slot;
} s_driver_t;

/* A sandbox gone but its /data kept: its directory holds only the links to its volume, which
 * stays claimed, and its host uid stays taken (its files are that uid's). */
typedef struct s_kept {
    struct s_kept *next;
    char id[65];
    char vol[S_PATH];
    int slot;
} s_kept_t;

struct ka_sandbox {
    struct ka_sandbox *prev, *next; /* the driver's live list */
    char id[65];
    char dir[S_DIR];
    pid_t pid;   /* the guest, in the host's PID namespace; 0: none (not started or reaped).
                  * A child only s_kill_wait reaps, so the pid names the guest until then: no
                  * pidfd (one descriptor per sandbox fewer; RLIMIT_NOFILE bounds the count) */
    int channel; /* node end of the guest channel */
    ka_cgroup_t *cg;
    char vol[S_PATH];      /* mount path of the sandbox's volume; "" before it has one */
    char data[S_PATH + 8]; /* its data dir, on the volume */
    int slot;              /* in the driver's uid range; -1: none */
    uint32_t uid;          /* host uid = gid of everything in the sandbox */
};

/* Everything the child needs, prepared by the parent: the child only makes syscalls. */
typedef struct s_child {
    const s_driver_t *d;
    int sync_fd, channel_fd, log_fd;
    int cg_fds[KA_CGROUP_MAX_DIRS];
    int n_cg;
    int keep[S_KEEP_MAX]; /* the descriptors the child keeps, ascending */
    int n_keep;
    uint32_t uid;
    const char *hostname;
    const char *const *lowerdirs; /* the image layers, named /proc/self/fd/N in the overlay */
    int lower_fds[S_MAX_LOWER];   /* the N: the parent's open layers, reopened by the child */
    size_t n_lower;
    char root[S_CDIR], data[S_PATH + 8], overlay_opts[4096], tmp_opts[64];
    char vol[S_PATH], guest[S_PATH]; /* the volume (cwd for the overlay) and the guest copy */
    char mp_data[S_PATH], mp_run[S_PATH], mp_kagent[S_PATH], mp_guest[S_PATH];
    char mp_proc[S_PATH], mp_dev[S_PATH], mp_tmp[S_PATH];
    char *argv[32];
} s_child_t;

/* Steps the child reports on failure (for the log). */
enum {
    S_STEP_CGROUP = 1,
    S_STEP_CGROUPNS,
    S_STEP_PRIVATE,
    S_STEP_OVERLAY,
    S_STEP_MKDIR,
    S_STEP_DATA,
    S_STEP_GUEST,
    S_STEP_PROC,
    S_STEP_DEV,
    S_STEP_TMP,
    S_STEP_UTS,
    S_STEP_NET,
    S_STEP_PIVOT,
    S_STEP_USERNS,
    S_STEP_CREDS,
    S_STEP_FDS,
    S_STEP_SECCOMP,
    S_STEP_EXEC
};

typedef struct s_report {
    char tag; /* 'U': map my ids, 'E': failed */
    int step;
    int err;
} s_report_t;

/* ------------------------------------------------------------------------------------------ */
/* Child side (runs in the clone: syscalls only, no allocation)                               */

__attribute__((noreturn)) static void s_fail(const s_child_t *c, int step)
{
    s_report_t r = {.tag = 'E', .step = step, .err = errno};
    (void)!write(c->sync_fd, &r, sizeof(r));
    _exit(127);
}

static int s_mknod_dev(const char *dev, const char *name, unsigned maj, unsigned min)
{
    char p[S_PATH + 16];
    size_t n = strlen(dev);
    memcpy(p, dev, n);
    p[n] = '/';
    strcpy(p + n + 1, name);
    return mknod(p, S_IFCHR | 0666, makedev(maj, min));
}

static int s_at(const char *dir, const char *name, char *out)
{
    size_t n = strlen(dir), m = strlen(name);
    if (n + m + 2 > S_PATH + 16)
        return -1;
    memcpy(out, dir, n);
    out[n] = '/';
    memcpy(out + n + 1, name, m + 1);
    return 0;
}

static void s_child_dev(const s_child_t *c)
{
    const char *dev = c->mp_dev;
    char p[S_PATH + 16];
    if (mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536") < 0)
        s_fail(c, S_STEP_DEV);
    static const struct {
        const char *name;
        unsigned maj, min;
    } nodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                 {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
    for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++)
        if (s_mknod_dev(dev, nodes[i].name, nodes[i].maj, nodes[i].min) < 0)
            s_fail(c, S_STEP_DEV);
    s_at(dev, "pts", p);
    if (mkdir(p, 0755) < 0 || mount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC,
                                    "newinstance,ptmxmode=0666,mode=620") < 0)
        s_fail(c, S_STEP_DEV);
    s_at(dev, "shm", p);
    if (mkdir(p, 01777) < 0 ||
        mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, c->tmp_opts) < 0)
        s_fail(c, S_STEP_DEV);
    static const char *const links[][2] = {{"ptmx", "pts/ptmx"},
                                           {"fd", "/proc/self/fd"},
                                           {"stdin", "/proc/self/fd/0"},
                                           {"stdout", "/proc/self/fd/1"},
                                           {"stderr", "/proc/self/fd/2"}};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        s_at(dev, links[i][0], p);
        if (symlink(links[i][1], p) < 0)
            s_fail(c, S_STEP_DEV);
    }
}

static void s_child_lo_up(const s_child_t *c)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strcpy(ifr.ifr_name, "lo");
    if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
        s_fail(c, S_STEP_NET);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
        s_fail(c, S_STEP_NET);
    close(fd);
}

/* Mount namespace: overlay root, /data, guest, /proc, /dev, /tmp; then pivot into it. */
static void s_child_mounts(const s_child_t *c)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        s_fail(c, S_STEP_PRIVATE);
    /* upper and work dirs on the sandbox's volume, named relative to it and the layers by fd:
     * the overlay's options in /proc/self/mountinfo name no host path */
    for (size_t i = 0; i < c->n_lower; i++) { /* the layers as mounts of this namespace */
        int fd = open(c->lowerdirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || dup3(fd, c->lower_fds[i], O_CLOEXEC) < 0)
            s_fail(c, S_STEP_OVERLAY);
        close(fd);
    }
    if (chdir(c->vol) < 0 ||
        mount("overlay", c->root, "overlay", MS_NOSUID | MS_NODEV, c->overlay_opts) < 0)
        s_fail(c, S_STEP_OVERLAY);
    const char *dirs[] = {c->mp_data, c->mp_run, c->mp_kagent, c->mp_proc, c->mp_dev, c->mp_tmp};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        if (mkdir(dirs[i], 0755) < 0 && errno != EEXIST)
            s_fail(c, S_STEP_MKDIR);
    int fd = open(c->mp_guest, O_WRONLY | O_CREAT | O_CLOEXEC, 0555);
    if (fd < 0)
        s_fail(c, S_STEP_MKDIR);
    close(fd);
    if (mount(c->data, c->mp_data, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, c->mp_data, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL) < 0)
        s_fail(c, S_STEP_DATA);
    if (mount(c->guest, c->mp_guest, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, c->mp_guest, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
              NULL) < 0)
        s_fail(c, S_STEP_GUEST);
    if (mount("proc", c->mp_proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        s_fail(c, S_STEP_PROC);
    s_child_dev(c);
    if (mount("tmpfs", c->mp_tmp, "tmpfs", MS_NOSUID | MS_NODEV, c->tmp_opts) < 0)
        s_fail(c, S_STEP_TMP);
    if (chdir(c->root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
        umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        s_fail(c, S_STEP_PIVOT);
}

/* Becomes uid = gid `id` with no supplementary groups. Raw syscalls: the glibc wrappers
 * broadcast the change to every thread glibc knows of (__nptl_setxid), and after a raw clone3
 * those are the parent's threads: it can hang. A credential change clears the parent-death
 * signal, so it is armed again. */
static void s_child_setid(const s_child_t *c, uint32_t id)
{
    if (syscall(SYS_setresgid, id, id, id) < 0 || syscall(SYS_setresuid, id, id, id) < 0 ||
        prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        s_fail(c, S_STEP_CREDS);
}

/* User namespace owned by the sandbox's own host uid, identity 65532 inside, no capabilities. */
static void s_child_creds(const s_child_t *c)
{
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        s_fail(c, S_STEP_CREDS);
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { /* the guest survives a memory bomb; the guest resets its children to 0 */
        (void)!write(fd, "-999", 4);
        close(fd);
    }
    /* the last privileged steps: limits that hold for everything the sandbox starts */
    struct rlimit nofile = {c->d->nofile, c->d->nofile};
    struct rlimit nproc = {c->d->lim.pids_max, c->d->lim.pids_max};
    if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 ||
        (c->d->lim.pids_max && setrlimit(RLIMIT_NPROC, &nproc) < 0))
        s_fail(c, S_STEP_CREDS);
    /* the namespace's owner is the sandbox's host uid: the kernel charges its per-user pools
     * there, never to host root */
    s_child_setid(c, c->uid);
    if (unshare(CLONE_NEWUSER) < 0)
        s_fail(c, S_STEP_USERNS);
    s_report_t r = {.tag = 'U'};
    char ack;
    if (write(c->sync_fd, &r, sizeof(r)) != (ssize_t)sizeof(r) || read(c->sync_fd, &ack, 1) != 1)
        _exit(126);
    for (int cap = 0; cap <= 63; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            s_fail(c, S_STEP_CREDS);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED |
                                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED) < 0)
        s_fail(c, S_STEP_CREDS);
    s_child_setid(c, S_SANDBOX_UID);
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capset, &h, data) < 0)
        s_fail(c, S_STEP_CREDS);
}

/* First thing in the clone: die with the node, and hold none of its descriptors (listening
 * socket, client connections, the parent's end of the sync socket). The parent may already be
 * gone: then the sync socket has hung up. */
static void s_child_detach(const s_child_t *c)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        _exit(125);
    unsigned lo = 3;
    for (int i = 0; i < c->n_keep; i++) {
        if ((unsigned)c->keep[i] > lo)
            syscall(SYS_close_range, lo, (unsigned)c->keep[i] - 1, 0);
        lo = (unsigned)c->keep[i] + 1;
    }
    syscall(SYS_close_range, lo, ~0U, 0);
    struct pollfd p = {.fd = c->sync_fd, .events = 0};
    if (poll(&p, 1, 0) != 0)
        _exit(125); /* POLLHUP: the node died before the signal was armed */
}

__attribute__((noreturn)) static void s_child_main(const s_child_t *c)
{
    s_child_detach(c);
    umask(0);
    for (int i = 0; i < c->n_cg; i++) /* join the sandbox's cgroups, before the cgroup ns */
        if (write(c->cg_fds[i], "0", 1) != 1)
            s_fail(c, S_STEP_CGROUP);
    if (unshare(CLONE_NEWCGROUP) < 0)
        s_fail(c, S_STEP_CGROUPNS);
    s_child_mounts(c);
    const char *hn = c->hostname ? c->hostname : "sandbox";
    if (sethostname(hn, strlen(hn)) < 0)
        s_fail(c, S_STEP_UTS);
    s_child_lo_up(c);
    s_child_creds(c);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(c->log_fd, 2) < 0 ||
        dup2(c->channel_fd, KA_GP_CHANNEL_FD) < 0)
        s_fail(c, S_STEP_FDS);
    /* nothing of the node's may leak into the sandbox: every other fd closes at exec */
    if (syscall(SYS_close_range, KA_GP_CHANNEL_FD + 1, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        s_fail(c, S_STEP_FDS);
    char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME=" KA_GP_WORKSPACE, "LANG=C.UTF-8", NULL};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &c->d->filter) < 0)
        s_fail(c, S_STEP_SECCOMP);
    execve(KA_GP_GUEST_PATH, c->argv, envp);
    s_fail(c, S_STEP_EXEC);
}

/* ------------------------------------------------------------------------------------------ */
/* Parent side                                                                                */

/* Removes a sandbox's directory: its /data was the sandbox's to shape, so never by path. */
static int s_rm_rf(const char *dir)
{
    ka_tree_opts_t o = {.owner = -1};
    return ka_tree_remove(dir, &o);
}

/* Takes a free uid of the range (under d->lock); -1 if all are taken. */
static int s_slot_take(s_driver_t *d)
{
    for (uint32_t i = 0; i < d->uid_count; i++) {
        uint32_t k = (d->next_slot + i) % d->uid_count;
        if (!(d->slots[k / 64] & (1ull << (k % 64)))) {
            d->slots[k / 64] |= 1ull << (k % 64);
            d->next_slot = k + 1; /* round robin: a uid rests as long as possible */
            return (int)k;
        }
    }
    return -1;
}

/* Gives the sandbox its own host uid; released only once nothing of it runs. */
static int s_uid_take(s_driver_t *d, ka_sandbox_t *sb)
{
    pthread_mutex_lock(&d->lock);
    sb->slot = s_slot_take(d);
    pthread_mutex_unlock(&d->lock);
    sb->uid = d->uid_base + (uint32_t)sb->slot;
    return sb->slot < 0 ? -EAGAIN : 0;
}

static void s_uid_release(s_driver_t *d, ka_sandbox_t *sb)
{
    if (sb->slot < 0)
        return;
    pthread_mutex_lock(&d->lock);
    d->slots[sb->slot / 64] &= ~(1ull << (sb->slot % 64));
    pthread_mutex_unlock(&d->lock);
    sb->slot = -1;
}

static int s_write_file(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, s, strlen(s));
    int rc = n == (ssize_t)strlen(s) ? 0 : (n < 0 ? -errno : -EIO);
    close(fd);
    return rc;
}

static int s_maps(const ka_sandbox_t *sb, pid_t pid)
{
    char path[64], map[64];
    snprintf(map, sizeof(map), "%d %u 1\n", S_SANDBOX_UID, sb->uid);
    snprintf(path, sizeof(path), "/proc/%d/uid_map", pid);
    int rc = s_write_file(path, map);
    snprintf(path, sizeof(path), "/proc/%d/setgroups", pid);
    if (rc == 0)
        rc = s_write_file(path, "deny");
    snprintf(path, sizeof(path), "/proc/%d/gid_map", pid);
    if (rc == 0)
        rc = s_write_file(path, map);
    return rc;
}

static bool s_valid_id(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > 64 || id[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = id[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_' || ch == '.'))
            return false;
    }
    return true;
}

/* <dir>/root, and on a fresh volume (linked as <dir>/vol) data and the overlay's upper/{u,w};
 * <dir>/data links to vol/data for the host's copies. */
static int s_mkdirs(const s_driver_t *d, ka_sandbox_t *sb)
{
    static const struct {
        const char *name;
        mode_t mode;
        bool owned; /* by the sandbox's uid */
    } sub[] = {{"data", 0755, false},           {"data/workspace", 0755, true},
               {"data/guest-logs", 0750, true}, {"upper", 0755, false},
               {"upper/u", 0755, false},        {"upper/w", 0700, false}};
    char p[S_PATH + 32];
    if (mkdir(sb->dir, 0700) < 0)
        return -errno;
    snprintf(p, sizeof(p), "%s/root", sb->dir);
    if (mkdir(p, 0755) < 0)
        return -errno;
    snprintf(p, sizeof(p), "%s/vol", sb->dir);
    int rc = ka_volume_claim(d->volumes, p, sb->vol, sizeof(sb->vol));
    if (rc < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/data", sb->dir);
    if (symlink("vol/data", p) < 0)
        return -errno;
    for (size_t i = 0; i < sizeof(sub) / sizeof(sub[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", sb->vol, sub[i].name);
        if (mkdir(p, sub[i].mode) < 0 || (sub[i].owned && chown(p, sb->uid, sb->uid) < 0))
            return -errno;
    }
    return 0;
}

/* Gives the sandbox's volume back once the sandbox is gone (its processes and its mounts): it
 * is emptied for the next sandbox, or unmounted and deleted. */
static int s_release_volume(const s_driver_t *d, ka_sandbox_t *sb)
{
    int rc = sb->vol[0] ? ka_volume_release(d->volumes, sb->vol, true) : 0;
    sb->vol[0] = 0;
    return rc;
}

static int s_prepare_child(s_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t *sb,
                           s_child_t *c)
{
    c->d = d;
    c->hostname = spec->hostname;
    snprintf(c->root, sizeof(c->root), "%s/root", sb->dir);
    snprintf(c->data, sizeof(c->data), "%s/data", sb->vol);
    snprintf(c->vol, sizeof(c->vol), "%s", sb->vol);
    snprintf(c->guest, sizeof(c->guest), "%s/guest", d->guest_dir);
    snprintf(c->mp_data, S_PATH, "%s/data", c->root);
    snprintf(c->mp_run, S_PATH, "%s/run", c->root);
    snprintf(c->mp_kagent, S_PATH, "%s/run/kagent", c->root);
    snprintf(c->mp_guest, S_PATH, "%s/run/kagent/guest", c->root);
    snprintf(c->mp_proc, S_PATH, "%s/proc", c->root);
    snprintf(c->mp_dev, S_PATH, "%s/dev", c->root);
    snprintf(c->mp_tmp, S_PATH, "%s/tmp", c->root);
    snprintf(c->tmp_opts, sizeof(c->tmp_opts), "mode=1777,size=%llu",
             (unsigned long long)d->tmp_bytes);
    if (spec->n_lower > S_MAX_LOWER)
        return -E2BIG;
    size_t o = (size_t)snprintf(c->overlay_opts, sizeof(c->overlay_opts), "lowerdir=");
    c->lowerdirs = spec->lowerdirs;
    for (; c->n_lower < spec->n_lower; c->n_lower++) {
        int fd = open(spec->lowerdirs[c->n_lower], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            return -errno;
        c->lower_fds[c->n_lower] = fd;
        o += (size_t)snprintf(c->overlay_opts + o, sizeof(c->overlay_opts) - o,
                              "%s/proc/self/fd/%d", c->n_lower ? ":" : "", fd);
    }
    /* upper and work are relative to the volume, the child's cwd when it mounts the overlay */
    o += (size_t)snprintf(c->overlay_opts + o, sizeof(c->overlay_opts) - o,
                          ",upperdir=upper/u,workdir=upper/w,volatile");
    if (o >= sizeof(c->overlay_opts))
        return -E2BIG;
    size_t a = 0;
    c->argv[a++] = "kagent-sandbox-guest";
    for (size_t i = 0; d->guest_args && d->guest_args[i] && a < 30; i++)
        c->argv[a++] = d->guest_args[i];
    c->argv[a] = NULL;
    return 0;
}

/* Each end of the guest channel may queue S_CHANNEL_BUF bytes, so an upload chunk (1 MiB) or a
 * read frame goes in one write instead of one per default buffer (~208 KiB), each a wake-up of
 * the node's poller and actor and of the guest. SO_SNDBUFFORCE passes net.core.wmem_max where
 * the node may (CAP_NET_ADMIN); else SO_SNDBUF up to it. Best effort: the default works,
 * slower. Only what is queued uses memory. */
static void s_channel_buffers(const int ch[2])
{
    int bytes = S_CHANNEL_BUF;
    for (int i = 0; i < 2; i++)
        if (setsockopt(ch[i], SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) < 0)
            (void)setsockopt(ch[i], SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

static void s_close_layers(s_child_t *c)
{
    for (size_t i = 0; i < c->n_lower; i++)
        close(c->lower_fds[i]);
    c->n_lower = 0;
}

/* The descriptors the child keeps, ascending: everything else of the node's it closes. */
static void s_keep_list(s_child_t *c)
{
    int n = 0;
    c->keep[n++] = c->sync_fd;
    c->keep[n++] = c->channel_fd;
    c->keep[n++] = c->log_fd;
    for (int i = 0; i < c->n_cg; i++)
        c->keep[n++] = c->cg_fds[i];
    for (size_t i = 0; i < c->n_lower; i++) /* reserved for the layers, reopened in the child */
        c->keep[n++] = c->lower_fds[i];
    for (int i = 1; i < n; i++) /* insertion sort: a handful */
        for (int j = i; j > 0 && c->keep[j - 1] > c->keep[j]; j--) {
            int t = c->keep[j];
            c->keep[j] = c->keep[j - 1];
            c->keep[j - 1] = t;
        }
    c->n_keep = n;
}

/* Waits up to ms for one frame on fd and checks it is the guest's ready event. */
static int s_wait_ready(int fd, int ms)
{
    uint8_t buf[512];
    size_t len = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        const uint8_t *body;
        size_t blen;
        long used = ka_gp_frame_next(buf, len, sizeof(buf) - 4, &body, &blen);
        if (used < 0)
            return -EPROTO;
        if (used > 0) {
            msgpack_unpacked up;
            msgpack_unpacked_init(&up);
            size_t off = 0;
            const char *ev;
            size_t evn;
            int rc = -EPROTO;
            if (msgpack_unpack_next(&up, (const char *)body, blen, &off) ==
                    MSGPACK_UNPACK_SUCCESS &&
                ka_gp_get_bytes(&up.data, "ev", &ev, &evn) && evn == 5 &&
                memcmp(ev, "ready", 5) == 0)
                rc = 0;
            msgpack_unpacked_destroy(&up);
            return rc;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long el = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (el >= ms)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(ms - el));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        /* read only up to the end of the first frame: what follows belongs to the client */
        size_t want = len < 4 ? 4 - len : 0;
        if (len >= 4) {
            size_t n =
                ((size_t)buf[0] << 24) | ((size_t)buf[1] << 16) | ((size_t)buf[2] << 8) | buf[3];
            if (n > sizeof(buf) - 4)
                return -EPROTO;
            want = n + 4 - len;
        }
        ssize_t n = read(fd, buf + len, want);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            return -ECONNRESET;
        len += (size_t)n;
    }
}

static void s_sandbox_free(ka_sandbox_t *sb)
{
    if (sb->channel >= 0)
        close(sb->channel);
    free(sb);
}

/* Kills the guest (and with it the PID namespace) and waits for it. */
/* Bounded: a sandbox's tasks freeze in well under this; past it the freeze is undone. */
#define FREEZE_TIMEOUT_MS 200

static void s_kill_wait(ka_sandbox_t *sb)
{
    if (sb->pid <= 0)
        return;
    kill(sb->pid, SIGKILL);
    if (sb->cg) /* a paused sandbox: on cgroup v1 a frozen task cannot die until thawed */
        ka_cgroup_freeze(sb->cg, false, FREEZE_TIMEOUT_MS);
    siginfo_t si;
    while (waitid(P_PID, (id_t)sb->pid, &si, WEXITED) < 0 && errno == EINTR)
        ;
    sb->pid = 0; /* reaped: the number may name another process from now on */
}

static int s_teardown(s_driver_t *d, ka_sandbox_t *sb)
{
    s_kill_wait(sb);
    int rc = ka_cgroup_remove(&sb->cg);
    int r2 = s_rm_rf(sb->dir);
    s_uid_release(d, sb); /* nothing of the sandbox runs or owns files any more */
    return rc < 0 ? rc : r2;
}

/* ---- kept /data ---------------------------------------------------------------------------- */

/* Unlinks and returns the kept entry of id (NULL if none). */
static s_kept_t *s_kept_take(s_driver_t *d, const char *id)
{
    pthread_mutex_lock(&d->lock);
    s_kept_t **pp = &d->kept;
    while (*pp && strcmp((*pp)->id, id) != 0)
        pp = &(*pp)->next;
    s_kept_t *k = *pp;
    if (k)
        *pp = k->next;
    pthread_mutex_unlock(&d->lock);
    return k;
}

static void s_kept_put(s_driver_t *d, const char *id, const char *vol, int slot)
{
    s_kept_t *k = calloc(1, sizeof(*k));
    if (!k)
        return; /* the next node start finds it on disk */
    snprintf(k->id, sizeof(k->id), "%s", id);
    snprintf(k->vol, sizeof(k->vol), "%s", vol);
    k->slot = slot;
    pthread_mutex_lock(&d->lock);
    k->next = d->kept;
    d->kept = k;
    pthread_mutex_unlock(&d->lock);
}

/* Leaves in a gone sandbox's directory only the links to its volume (vol, data). */
static void s_strip_dir(const char *dir)
{
    char p[S_PATH + 320];
    snprintf(p, sizeof(p), "%s/root", dir);
    rmdir(p); /* its mounts were in the sandbox's own namespace: gone with its processes */
    snprintf(p, sizeof(p), "%s/guest.log", dir);
    unlink(p);
}

/* Ends sandbox sb keeping its /data: nothing of it runs, its volume and uid stay for id. */
static int s_park_sb(s_driver_t *d, ka_sandbox_t *sb)
{
    s_kill_wait(sb);
    int rc = ka_cgroup_remove(&sb->cg);
    s_strip_dir(sb->dir);
    s_kept_put(d, sb->id, sb->vol, sb->slot);
    sb->slot = -1;
    sb->vol[0] = 0;
    return rc;
}

/* A kept sandbox's directories for a new start on its /data: its volume mounted, the changes
 * to its root (on the volume too) dropped, as a resume from a snapshot would, unless root
 * (a fork boots on the root changes copied with its /data). */
static int s_reuse_dirs(const s_driver_t *d, ka_sandbox_t *sb, bool root)
{
    static const char *const sub[] = {"upper", "upper/u", "upper/w"};
    char p[S_PATH + 32];
    int rc = ka_volume_mount(d->volumes, sb->vol);
    if (rc < 0)
        return rc;
    snprintf(p, sizeof(p), "%s/root", sb->dir);
    if (mkdir(p, 0755) < 0 && errno != EEXIST)
        return -errno;
    snprintf(p, sizeof(p), "%s/%s", sb->vol, root ? "upper/w" : "upper"); /* root: only work */
    if ((rc = s_rm_rf(p)) < 0)
        return rc;
    for (size_t i = root ? 2 : 0; i < sizeof(sub) / sizeof(sub[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", sb->vol, sub[i]);
        if (mkdir(p, i == 2 ? 0700 : 0755) < 0)
            return -errno;
    }
    return 0;
}

/* The kept entry of spec's id, if it asks for reuse, set up as sb's volume and uid. */
static int s_take_kept(s_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t *sb, bool *reused)
{
    s_kept_t *k = spec->reuse_data ? s_kept_take(d, spec->id) : NULL;
    *reused = k != NULL;
    if (!k)
        return 0;
    sb->slot = k->slot;
    sb->uid = d->uid_base + (uint32_t)k->slot;
    snprintf(sb->vol, sizeof(sb->vol), "%s", k->vol);
    free(k);
    return s_reuse_dirs(d, sb, spec->reuse_root);
}

static int s_start(ka_driver_t *base, const ka_sandbox_spec_t *spec, ka_sandbox_t **out)
{
    s_driver_t *d = (s_driver_t *)base;
    if (!s_valid_id(spec->id) || spec->n_lower == 0 || !spec->lowerdirs)
        return -EINVAL;
    ka_sandbox_t *sb = calloc(1, sizeof(*sb));
    s_child_t *c = calloc(1, sizeof(*c));
    int rc = -ENOMEM, ch[2] = {-1, -1}, sy[2] = {-1, -1};
    if (!sb || !c)
        goto fail_free;
    sb->channel = -1;
    sb->slot = -1;
    c->log_fd = -1;
    snprintf(sb->id, sizeof(sb->id), "%s", spec->id);
    snprintf(sb->dir, sizeof(sb->dir), "%s/%s", d->state_dir, spec->id);
    bool reused = false;
    rc = s_take_kept(d, spec, sb, &reused);
    if (rc < 0)
        goto fail;
    if (!reused) {
        rc = s_uid_take(d, sb);
        if (rc < 0)
            goto fail_free;
        rc = s_mkdirs(d, sb);
        if (rc == -EEXIST)
            goto fail_free; /* someone else's sandbox: do not touch it */
        if (rc < 0)
            goto fail;
    }
    sb->cg = ka_cgroup_new(d->cgroup_name, sb->id, &d->lim, &rc);
    if (!sb->cg)
        goto fail;
    rc = s_prepare_child(d, spec, sb, c);
    if (rc < 0)
        goto fail;
    char logp[S_PATH + 16];
    snprintf(logp, sizeof(logp), "%s/guest.log", sb->dir);
    c->log_fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (c->log_fd < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch) < 0 ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sy) < 0) {
        rc = -errno;
        goto fail;
    }
    s_channel_buffers(ch);
    c->channel_fd = ch[1];
    c->sync_fd = sy[1];
    rc = ka_cgroup_procs_fds(sb->cg, c->cg_fds);
    if (rc < 0)
        goto fail;
    c->n_cg = rc;
    c->uid = sb->uid;
    s_keep_list(c);

    struct clone_args ca;
    memset(&ca, 0, sizeof(ca));
    ca.flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC;
    ca.exit_signal = SIGCHLD;
    long pid = syscall(SYS_clone3, &ca, sizeof(ca));
    if (pid == 0)
        s_child_main(c);
    int clone_errno = errno;
    s_close_layers(c);
    for (int i = 0; i < c->n_cg; i++)
        close(c->cg_fds[i]);
    close(ch[1]);
    close(sy[1]);
    ch[1] = sy[1] = -1;
    if (pid < 0) {
        rc = -clone_errno;
        goto fail;
    }
    sb->pid = (pid_t)pid;

    /* The child asks for its id maps once in its user namespace, then execs the guest: EOF on
     * the sync socket (CLOEXEC) means the exec happened. */
    s_report_t r;
    ssize_t n = read(sy[0], &r, sizeof(r));
    if (n == (ssize_t)sizeof(r) && r.tag == 'U') {
        rc = s_maps(sb, sb->pid);
        if (rc < 0)
            goto fail;
        if (write(sy[0], "G", 1) != 1) {
            rc = -EPIPE;
            goto fail;
        }
        n = read(sy[0], &r, sizeof(r));
    }
    if (n != 0) {
        rc = n == (ssize_t)sizeof(r) && r.tag == 'E' ? -r.err : -EPROTO;
        if (rc == 0)
            rc = -EPROTO;
        dprintf(c->log_fd, "{\"event\":\"sandbox_setup_failed\",\"step\":%d,\"errno\":%d}\n",
                n == (ssize_t)sizeof(r) ? r.step : -1, n == (ssize_t)sizeof(r) ? r.err : 0);
        goto fail;
    }
    sb->channel = ch[0];
    ch[0] = -1;
    ka_phase_next(spec->id, KA_PHASE_GUEST_READY);
    rc = s_wait_ready(sb->channel, spec->ready_timeout_ms > 0 ? spec->ready_timeout_ms : 5000);
    ka_phase_end(spec->id);
    if (rc < 0)
        goto fail;
    close(sy[0]);
    close(c->log_fd);
    free(c);
    pthread_mutex_lock(&d->lock);
    sb->next = d->live;
    if (d->live)
        d->live->prev = sb;
    d->live = sb;
    pthread_mutex_unlock(&d->lock);
    *out = sb;
    return 0;

fail:
    if (reused) { /* its /data stays kept */
        s_park_sb(d, sb);
    } else {
        s_teardown(d, sb);
        s_release_volume(d, sb);
    }
fail_free:
    if (c)
        s_close_layers(c);
    if (sb)
        s_uid_release(d, sb);
    for (int i = 0; i < 2; i++) {
        if (ch[i] >= 0)
            close(ch[i]);
        if (sy[i] >= 0)
            close(sy[i]);
    }
    if (c && c->log_fd >= 0)
        close(c->log_fd);
    free(c);
    if (sb)
        s_sandbox_free(sb);
    return rc;
}

static void s_unlist(s_driver_t *d, ka_sandbox_t *sb)
{
    pthread_mutex_lock(&d->lock);
    if (sb->prev)
        sb->prev->next = sb->next;
    else
        d->live = sb->next;
    if (sb->next)
        sb->next->prev = sb->prev;
    pthread_mutex_unlock(&d->lock);
}

static int s_park(ka_driver_t *base, ka_sandbox_t **sb_p)
{
    s_driver_t *d = (s_driver_t *)base;
    ka_sandbox_t *sb = *sb_p;
    *sb_p = NULL;
    s_unlist(d, sb);
    int rc = s_park_sb(d, sb);
    s_sandbox_free(sb);
    return rc;
}

static bool s_kept(ka_driver_t *base, const char *id)
{
    s_driver_t *d = (s_driver_t *)base;
    pthread_mutex_lock(&d->lock);
    const s_kept_t *k = d->kept;
    while (k && strcmp(k->id, id) != 0)
        k = k->next;
    pthread_mutex_unlock(&d->lock);
    return k != NULL;
}

static size_t s_kept_ids(ka_driver_t *base, char (*ids)[KA_DRIVER_ID_LEN], size_t cap)
{
    s_driver_t *d = (s_driver_t *)base;
    size_t n = 0;
    pthread_mutex_lock(&d->lock);
    for (const s_kept_t *k = d->kept; k; k = k->next, n++)
        if (n < cap)
            snprintf(ids[n], KA_DRIVER_ID_LEN, "%s", k->id);
    pthread_mutex_unlock(&d->lock);
    return n;
}

static int s_discard(ka_driver_t *base, const char *id)
{
    s_driver_t *d = (s_driver_t *)base;
    s_kept_t *k = s_valid_id(id) ? s_kept_take(d, id) : NULL;
    if (!k)
        return 0;
    char dir[S_DIR];
    snprintf(dir, sizeof(dir), "%s/%s", d->state_dir, id);
    int rc = s_rm_rf(dir);
    int r2 = ka_volume_release(d->volumes, k->vol, false);
    ka_sandbox_t gone = {.slot = k->slot};
    s_uid_release(d, &gone);
    free(k);
    return rc < 0 ? rc : r2;
}

static int s_stop(ka_driver_t *base, ka_sandbox_t **sb_p)
{
    s_driver_t *d = (s_driver_t *)base;
    ka_sandbox_t *sb = *sb_p;
    *sb_p = NULL;
    s_unlist(d, sb);
    int rc = s_teardown(d, sb);
    int r2 = s_release_volume(d, sb);
    s_sandbox_free(sb);
    return rc < 0 ? rc : r2;
}

static int s_halt(ka_driver_t *base, ka_sandbox_t *sb)
{
    (void)base;
    s_kill_wait(sb);
    return 0;
}

static const char *s_data_dir(ka_driver_t *base, ka_sandbox_t *sb)
{
    (void)base;
    snprintf(sb->data, sizeof sb->data, "%s/data", sb->vol);
    return sb->data;
}

static uint32_t s_owner(ka_driver_t *base, ka_sandbox_t *sb)
{
    (void)base;
    return sb->uid;
}

static int s_stats(ka_driver_t *base, ka_sandbox_t *sb, ka_sandbox_stats_t *out)
{
    (void)base;
    memset(out, 0, sizeof(*out));
    out->guest_pid = sb->pid;
    return ka_cgroup_stats(sb->cg, out);
}

static int s_stats_id(ka_driver_t *base, const char *id, ka_sandbox_stats_t *out)
{
    s_driver_t *d = (s_driver_t *)base;
    int rc = -ENOENT;
    pthread_mutex_lock(&d->lock); /* stop unlinks under it before the sandbox goes */
    for (ka_sandbox_t *sb = d->live; sb && rc == -ENOENT; sb = sb->next)
        if (strcmp(sb->id, id) == 0)
            rc = s_stats(base, sb, out);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int s_channel(ka_driver_t *base, ka_sandbox_t *sb)
{
    (void)base;
    return sb->channel;
}

static int s_kill(ka_driver_t *base, ka_sandbox_t *sb)
{
    (void)base;
    if (sb->pid <= 0)
        return -ESRCH;
    return kill(sb->pid, SIGKILL) < 0 ? -errno : 0;
}

static int s_freeze(ka_driver_t *base, ka_sandbox_t *sb, bool frozen)
{
    (void)base;
    return ka_cgroup_freeze(sb->cg, frozen, FREEZE_TIMEOUT_MS);
}

static void s_destroy(ka_driver_t *base)
{
    s_driver_t *d = (s_driver_t *)base;
    while (d->live) { /* what the caller did not stop */
        ka_sandbox_t *sb = d->live;
        s_stop(base, &sb);
    }
    while (d->kept) { /* kept on disk, nothing mounted: the next start finds them */
        s_kept_t *k = d->kept;
        d->kept = k->next;
        ka_volume_unmount(d->volumes, k->vol);
        free(k);
    }
    pthread_mutex_destroy(&d->lock);
    free(d->slots);
    ka_volumes_destroy(&d->volumes);
    if (d->guest_dir[0])
        ka_volume_file_remove(d->guest_dir);
    ka_cgroup_remove_parent(d->cgroup_name);
    free(d->filter.filter);
    if (d->guest_args) {
        for (size_t i = 0; d->guest_args[i]; i++)
            free(d->guest_args[i]);
        free(d->guest_args);
    }
    free(d);
}

/* ---- fork ---------------------------------------------------------------------------------- */

/* Whether src's volume (its /data and root changes) fits the free space of dst's. */
static int s_fork_fits(const ka_sandbox_t *src, const ka_sandbox_t *dst)
{
    struct statvfs a, b;
    if (statvfs(src->vol, &a) < 0 || statvfs(dst->vol, &b) < 0)
        return -errno;
    uint64_t used = (uint64_t)(a.f_blocks - a.f_bfree) * a.f_frsize;
    uint64_t inodes = (uint64_t)(a.f_files - a.f_ffree);
    return used > (uint64_t)b.f_bavail * b.f_frsize || inodes > (uint64_t)b.f_favail ? -EDQUOT : 0;
}

/* Copies src's /data and its root's upper layer onto dst's fresh volume, everything of src's
 * uid given to dst's. A volume that fills up is the quota: -EDQUOT. */
static int s_fork_copy(const ka_sandbox_t *src, const ka_sandbox_t *dst, uint64_t *bytes)
{
    static const char *const sub[] = {"data", "upper/u"};
    int rc = s_fork_fits(src, dst);
    for (size_t i = 0; rc == 0 && i < sizeof(sub) / sizeof(sub[0]); i++) {
        char from[S_PATH + 16], to[S_PATH + 16];
        snprintf(from, sizeof(from), "%s/%s", src->vol, sub[i]);
        snprintf(to, sizeof(to), "%s/%s", dst->vol, sub[i]);
        ka_tree_opts_t o = {
            .owner = dst->uid, .overlay = i == 1, .remap = true, .remap_from = src->uid};
        ka_tree_stats_t st;
        rc = ka_tree_copy(from, to, &o, &st);
        *bytes += st.bytes;
    }
    return rc == -ENOSPC ? -EDQUOT : rc;
}

static int s_fork(ka_driver_t *base, ka_sandbox_t *src, const char *id, uint64_t *bytes)
{
    s_driver_t *d = (s_driver_t *)base;
    if (!s_valid_id(id) || !src->vol[0])
        return -EINVAL;
    if (s_kept(base, id))
        return -EEXIST;
    ka_sandbox_t *sb = calloc(1, sizeof(*sb));
    if (!sb)
        return -ENOMEM;
    sb->channel = -1;
    snprintf(sb->id, sizeof(sb->id), "%s", id);
    snprintf(sb->dir, sizeof(sb->dir), "%s/%s", d->state_dir, id);
    int rc = s_uid_take(d, sb);
    if (rc == 0 && (rc = s_mkdirs(d, sb)) == -EEXIST) {
        s_uid_release(d, sb); /* someone else's sandbox: do not touch it */
        s_sandbox_free(sb);
        return rc;
    }
    if (rc == 0)
        rc = s_fork_copy(src, sb, bytes);
    if (rc == 0) {
        s_strip_dir(sb->dir);
        s_kept_put(d, sb->id, sb->vol, sb->slot);
    } else {
        s_rm_rf(sb->dir);
        s_release_volume(d, sb);
        s_uid_release(d, sb);
    }
    s_sandbox_free(sb);
    return rc;
}

static const ka_driver_ops_t s_ops = {
    .name = "namespaces",
    .start = s_start,
    .stop = s_stop,
    .halt = s_halt,
    .stats = s_stats,
    .stats_id = s_stats_id,
    .data_dir = s_data_dir,
    .owner = s_owner,
    .channel = s_channel,
    .kill = s_kill,
    .freeze = s_freeze,
    .park = s_park,
    .kept = s_kept,
    .discard = s_discard,
    .kept_ids = s_kept_ids,
    .destroy = s_destroy,
    .fork = s_fork,
};

const char *ka_namespaces_dir(const ka_sandbox_t *sb)
{
    return sb->dir;
}

/* ------------------------------------------------------------------------------------------ */
/* Seccomp: deny what a sandbox never needs (Docker's default profile in spirit)              */

static int s_filter_build(struct sock_fprog *out)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return -ENOMEM;
    static const char *const deny[] = {"mount",
                                       "umount2",
                                       "pivot_root",
                                       "chroot",
                                       "swapon",
                                       "swapoff",
                                       "reboot",
                                       "kexec_load",
                                       "kexec_file_load",
                                       "init_module",
                                       "finit_module",
                                       "delete_module",
                                       "bpf",
                                       "perf_event_open",
                                       "keyctl",
                                       "add_key",
                                       "request_key",
                                       "setns",
                                       "acct",
                                       "settimeofday",
                                       "clock_settime",
                                       "clock_adjtime",
                                       "adjtimex",
                                       "iopl",
                                       "ioperm",
                                       "open_by_handle_at",
                                       "name_to_handle_at",
                                       "userfaultfd",
                                       "lookup_dcookie",
                                       "quotactl",
                                       "quotactl_fd",
                                       "syslog",
                                       "uselib",
                                       "vhangup",
                                       "fsopen",
                                       "fsconfig",
                                       "fsmount",
                                       "fspick",
                                       "move_mount",
                                       "open_tree",
                                       "mount_setattr",
                                       "io_uring_setup",
                                       "io_uring_enter",
                                       "io_uring_register",
                                       "fanotify_init",
                                       "move_pages",
                                       "nfsservctl",
                                       "get_kernel_syms",
                                       "query_module",
                                       "create_module",
                                       "sysfs",
                                       "_sysctl",
                                       "ustat",
                                       "kcmp",
                                       "process_madvise"};
    int rc = 0;
    const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
    for (size_t i = 0; i < sizeof(deny) / sizeof(deny[0]) && rc == 0; i++) {
        int nr = seccomp_syscall_resolve_name(deny[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not on this architecture */
        rc = seccomp_rule_add(ctx, eperm, nr, 0);
    }
    /* new namespaces: unshare and clone with any CLONE_NEW* flag; clone3 hides its flags in
     * memory, so it reports ENOSYS and libc falls back to clone */
    static const uint64_t ns_flags[] = {CLONE_NEWNS,  CLONE_NEWCGROUP, CLONE_NEWUTS,
                                        CLONE_NEWIPC, CLONE_NEWUSER,   CLONE_NEWPID,
                                        CLONE_NEWNET, 0x00000080ULL /* CLONE_NEWTIME */};
    for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]) && rc == 0; i++) {
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(unshare), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
        if (rc == 0 && ns_flags[i] != 0x80)
            rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                                  SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    }
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    /* sockets: unix, inet, inet6 and netlink route only; no raw or packet sockets */
    for (int fam = 0; fam <= 16 && rc == 0; fam++) {
        if (fam == AF_UNIX || fam == AF_INET || fam == AF_INET6 || fam == AF_NETLINK)
            continue;
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_EQ, fam));
    }
    if (rc == 0)
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_GT, 16));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 2, SCMP_A0(SCMP_CMP_EQ, AF_NETLINK),
                              SCMP_A2(SCMP_CMP_NE, 0 /* NETLINK_ROUTE */));
    static const int inet[] = {AF_INET, AF_INET6};
    for (size_t i = 0; i < 2 && rc == 0; i++) {
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 2, SCMP_A0(SCMP_CMP_EQ, inet[i]),
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, SOCK_RAW));
        if (rc == 0)
            rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 2, SCMP_A0(SCMP_CMP_EQ, inet[i]),
                                  SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, SOCK_PACKET));
    }
    /* terminal injection */
    if (rc == 0)
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX));
    /* export once: the sandbox child installs the raw program without allocating */
    int mfd = -1;
    if (rc == 0) {
        mfd = memfd_create("kagent-seccomp", MFD_CLOEXEC);
        rc = mfd < 0 ? -errno : seccomp_export_bpf(ctx, mfd);
    }
    if (rc == 0) {
        off_t size = lseek(mfd, 0, SEEK_END);
        out->filter = malloc((size_t)size);
        out->len = (unsigned short)((size_t)size / sizeof(struct sock_filter));
        if (!out->filter || pread(mfd, out->filter, (size_t)size, 0) != size)
            rc = -EIO;
    }
    if (mfd >= 0)
        close(mfd);
    seccomp_release(ctx);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation and crash cleanup                                                                 */

/* Keeps the /data of crashed sandbox id on volume vol (unmounted) if its host uid (the owner
 * of its workspace) is still one of the range and free: true if kept. */
static bool s_keep_leftover(s_driver_t *d, const char *id, const char *vol)
{
    char ws[S_PATH + 32];
    struct stat st;
    snprintf(ws, sizeof(ws), "%s/data/workspace", vol);
    if (!s_valid_id(id) || ka_volume_mount(d->volumes, vol) < 0 || lstat(ws, &st) < 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid < d->uid_base || st.st_uid - d->uid_base >= d->uid_count)
        return false;
    uint32_t k = st.st_uid - d->uid_base;
    if (d->slots[k / 64] & (1ull << (k % 64)))
        return false;
    d->slots[k / 64] |= 1ull << (k % 64);
    s_kept_put(d, id, vol, (int)k);
    ka_volume_unmount(d->volumes, vol); /* holds no loop device until a start reuses it */
    return true;
}

static void s_cleanup_leftovers(s_driver_t *d)
{
    DIR *dir = opendir(d->state_dir);
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        /* the directory exists before its cgroups: a crash at any point leaves it to name them */
        ka_cgroup_remove_id(d->cgroup_name, e->d_name);
        char p[S_PATH + 300];
        char vol[S_PATH];
        snprintf(p, sizeof(p), "%s/%s/vol", d->state_dir, e->d_name);
        ssize_t n = readlink(p, vol, sizeof(vol) - 1);
        if (n > 0)
            vol[n] = 0;
        snprintf(p, sizeof(p), "%s/%s", d->state_dir, e->d_name);
        if (n > 0 && s_keep_leftover(d, e->d_name, vol)) {
            s_strip_dir(p); /* a crash loses no /data: kept until a start reuses it, or discard */
            continue;
        }
        if (n > 0)
            ka_volume_release(d->volumes, vol, false); /* its processes: not seen to end */
        s_rm_rf(p);
    }
    closedir(dir);
}

ka_driver_t *ka_namespaces_new(const ka_ns_opts_t *opts, int *err)
{
    int rc = -EINVAL;
    s_driver_t *d = NULL;
    struct stat st;
    if (!opts || !opts->state_dir || !opts->guest_path || opts->state_dir[0] != '/' ||
        opts->guest_path[0] != '/' || strlen(opts->state_dir) >= S_SDIR ||
        strlen(opts->guest_path) >= S_PATH)
        goto fail;
    if (geteuid() != 0) {
        rc = -EPERM;
        goto fail;
    }
    if (stat(opts->guest_path, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = -ENOENT;
        goto fail;
    }
    d = calloc(1, sizeof(*d));
    rc = -ENOMEM;
    if (!d)
        goto fail;
    d->base.ops = &s_ops;
    pthread_mutex_init(&d->lock, NULL);
    snprintf(d->state_dir, sizeof(d->state_dir), "%s", opts->state_dir);
    snprintf(d->guest_path, sizeof(d->guest_path), "%s", opts->guest_path);
    snprintf(d->cgroup_name, sizeof(d->cgroup_name), "%s",
             opts->cgroup_name ? opts->cgroup_name : "kagent");
    d->lim.mem_bytes = opts->mem_bytes;
    d->lim.cpu_millis = opts->cpu_millis;
    d->lim.pids_max = opts->pids_max;
    d->uid_base = opts->uid_base ? opts->uid_base : S_UID_BASE;
    d->uid_count = opts->uid_count ? opts->uid_count : S_UID_COUNT;
    d->nofile = opts->nofile ? opts->nofile : S_NOFILE;
    rc = -EINVAL;
    if ((uint64_t)d->uid_base + d->uid_count > UINT32_MAX || d->uid_base <= S_SANDBOX_UID)
        goto fail;
    rc = -ENOMEM;
    if (!(d->slots = calloc((d->uid_count + 63) / 64, sizeof(uint64_t))))
        goto fail;
    d->tmp_bytes = opts->tmp_bytes ? opts->tmp_bytes : (64u << 20);
    size_t na = 0;
    while (opts->guest_args && opts->guest_args[na])
        na++;
    if (na > 28) {
        rc = -E2BIG;
        goto fail;
    }
    d->guest_args = calloc(na + 1, sizeof(char *));
    if (!d->guest_args)
        goto fail;
    for (size_t i = 0; i < na; i++)
        if (!(d->guest_args[i] = strdup(opts->guest_args[i])))
            goto fail;
    if (mkdir(d->state_dir, 0700) < 0 && errno != EEXIST) {
        rc = -errno;
        goto fail;
    }
    rc = s_filter_build(&d->filter);
    if (rc < 0)
        goto fail;
    snprintf(d->volume_dir, sizeof(d->volume_dir), "%s/.volumes", d->state_dir);
    ka_volume_opts_t vo = {.dir = d->volume_dir,
                           .bytes = opts->disk_bytes ? opts->disk_bytes : KA_VOLUME_DEFAULT_BYTES,
                           .inodes = opts->disk_inodes,
                           .spare = opts->disk_spare ? opts->disk_spare : 4};
    if (!(d->volumes = ka_volumes_new(&vo, &rc)))
        goto fail;
    s_cleanup_leftovers(d);
    snprintf(d->guest_dir, sizeof(d->guest_dir), "%s/.guest", d->state_dir);
    if ((rc = ka_volume_file(d->guest_dir, d->guest_path, "guest")) < 0) {
        d->guest_dir[0] = 0;
        goto fail;
    }
    return &d->base;
fail:
    if (d)
        s_destroy(&d->base);
    if (err)
        *err = rc;
    return NULL;
}
