/* kagent-spawn: makes a fresh process in a sandbox's new namespaces into its guest (see
 * ka_spawn.h). Static, small and single-threaded: it runs as root on the host until it drops
 * into the sandbox, so it only makes syscalls, allocates nothing, and trusts nothing it reads
 * without checking its bounds. */
#include "guest_proto.h"
#include "ka_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef SECBIT_NOROOT
#define SECBIT_NOROOT                 (1 << 0)
#define SECBIT_NOROOT_LOCKED          (1 << 1)
#define SECBIT_NO_SETUID_FIXUP_LOCKED (1 << 3)
#define SECBIT_KEEP_CAPS_LOCKED       (1 << 5)
#endif

/* The message and what its tail unpacks to. */
static struct {
    union {
        ka_spawn_msg_t msg;
        unsigned char bytes[sizeof(ka_spawn_msg_t) + KA_SPAWN_TAIL_MAX];
        uint64_t align;
    } in;
    const char *lowerdirs[KA_SPAWN_MAX_LOWER];
    char *argv[KA_SPAWN_MAX_ARGS + 2];
    struct sock_fprog filter;
} G;

__attribute__((noreturn)) static void s_fail(const ka_spawn_msg_t *c, int step)
{
    ka_spawn_report_t r = {.tag = 'E', .step = step, .err = errno};
    (void)!send(c->sync_fd, &r, sizeof(r), MSG_NOSIGNAL);
    _exit(127);
}

static int s_mknod_dev(const char *dev, const char *name, unsigned maj, unsigned min)
{
    char p[KA_SPAWN_PATH + 16];
    size_t n = strlen(dev);
    memcpy(p, dev, n);
    p[n] = '/';
    strcpy(p + n + 1, name);
    return mknod(p, S_IFCHR | 0666, makedev(maj, min));
}

static int s_at(const char *dir, const char *name, char *out)
{
    size_t n = strlen(dir), m = strlen(name);
    if (n + m + 2 > KA_SPAWN_PATH + 16)
        return -1;
    memcpy(out, dir, n);
    out[n] = '/';
    memcpy(out + n + 1, name, m + 1);
    return 0;
}

/* Binds directory dir of the tmpfs mounted at stage onto mp with flags (besides MS_NOSUID). */
static int s_bind_dir(const char *stage, const char *dir, const char *mp, unsigned long flags)
{
    char p[KA_SPAWN_PATH + 16];
    if (s_at(stage, dir, p) < 0 || mount(p, mp, NULL, MS_BIND, NULL) < 0)
        return -1;
    return mount(NULL, mp, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | flags, NULL);
}

/* /dev and /tmp are one tmpfs (sized as /tmp): every file system a sandbox mounts registers a
 * memory-cgroup-aware shrinker, and since Linux 6.7 every memory cgroup keeps 1 KiB per 64 of
 * them, so the host's memory grows with the square of the sandbox count (the README's Density
 * section). It is mounted at /run for a moment, its directories dev (0755 root: no exec) and
 * tmp (sticky: no devices) are bound at /dev and /tmp, and /run is left empty again. */
static void s_child_dev_tmp(const ka_spawn_msg_t *c)
{
    const char *stage = c->mp_run;
    char p[KA_SPAWN_PATH + 16];
    if (mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, c->tmp_opts) < 0 ||
        s_at(stage, "tmp", p) < 0 || mkdir(p, 0700) < 0 || chmod(p, 01777) < 0 ||
        s_bind_dir(stage, "tmp", c->mp_tmp, MS_NODEV) < 0)
        s_fail(c, KA_SPAWN_STEP_TMP);
    if (s_at(stage, "dev", p) < 0 || mkdir(p, 0700) < 0 || chmod(p, 0755) < 0 ||
        s_bind_dir(stage, "dev", c->mp_dev, MS_NOEXEC) < 0 || umount2(stage, 0) < 0)
        s_fail(c, KA_SPAWN_STEP_DEV);
}

/* /dev: the device nodes, devpts, and /dev/shm, a sticky directory (writable only there). */
static void s_child_dev(const ka_spawn_msg_t *c)
{
    const char *dev = c->mp_dev;
    char p[KA_SPAWN_PATH + 16];
    s_child_dev_tmp(c);
    static const struct {
        const char *name;
        unsigned maj, min;
    } nodes[] = {{"null", 1, 3},   {"zero", 1, 5},    {"full", 1, 7},
                 {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
    for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++)
        if (s_mknod_dev(dev, nodes[i].name, nodes[i].maj, nodes[i].min) < 0)
            s_fail(c, KA_SPAWN_STEP_DEV);
    s_at(dev, "pts", p);
    if (mkdir(p, 0755) < 0 || mount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC,
                                    "newinstance,ptmxmode=0666,mode=620") < 0)
        s_fail(c, KA_SPAWN_STEP_DEV);
    s_at(dev, "shm", p);
    if (mkdir(p, 0755) < 0 || chmod(p, 01777) < 0) /* chmod: mkdir's mode passes the umask */
        s_fail(c, KA_SPAWN_STEP_DEV);
    static const char *const links[][2] = {{"ptmx", "pts/ptmx"},
                                           {"fd", "/proc/self/fd"},
                                           {"stdin", "/proc/self/fd/0"},
                                           {"stdout", "/proc/self/fd/1"},
                                           {"stderr", "/proc/self/fd/2"}};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        s_at(dev, links[i][0], p);
        if (symlink(links[i][1], p) < 0)
            s_fail(c, KA_SPAWN_STEP_DEV);
    }
}

static void s_child_lo_up(const ka_spawn_msg_t *c)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strcpy(ifr.ifr_name, "lo");
    if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
        s_fail(c, KA_SPAWN_STEP_NET);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
        s_fail(c, KA_SPAWN_STEP_NET);
    close(fd);
}

/* Mount namespace: overlay root, /data, guest, /proc, /dev, /tmp; then pivot into it. */
static void s_child_mounts(const ka_spawn_msg_t *c)
{
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        s_fail(c, KA_SPAWN_STEP_PRIVATE);
    /* upper and work dirs on the sandbox's volume, named relative to it and the layers by fd:
     * the overlay's options in /proc/self/mountinfo name no host path */
    for (size_t i = 0; i < c->n_lower; i++) { /* the layers as mounts of this namespace */
        int fd = open(G.lowerdirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || dup3(fd, c->lower_fds[i], O_CLOEXEC) < 0)
            s_fail(c, KA_SPAWN_STEP_OVERLAY);
        close(fd);
    }
    if (chdir(c->vol) < 0 ||
        mount("overlay", c->root, "overlay", MS_NOSUID | MS_NODEV, c->overlay_opts) < 0)
        s_fail(c, KA_SPAWN_STEP_OVERLAY);
    const char *dirs[] = {c->mp_data, c->mp_run, c->mp_kagent, c->mp_proc, c->mp_dev, c->mp_tmp};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        if (mkdir(dirs[i], 0755) < 0 && errno != EEXIST)
            s_fail(c, KA_SPAWN_STEP_MKDIR);
    int fd = open(c->mp_guest, O_WRONLY | O_CREAT | O_CLOEXEC, 0555);
    if (fd < 0)
        s_fail(c, KA_SPAWN_STEP_MKDIR);
    close(fd);
    if (mount(c->data, c->mp_data, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, c->mp_data, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL) < 0)
        s_fail(c, KA_SPAWN_STEP_DATA);
    if (mount(c->guest, c->mp_guest, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, c->mp_guest, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
              NULL) < 0)
        s_fail(c, KA_SPAWN_STEP_GUEST);
    if (mount("proc", c->mp_proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        s_fail(c, KA_SPAWN_STEP_PROC);
    s_child_dev(c);
    if (chdir(c->root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
        umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        s_fail(c, KA_SPAWN_STEP_PIVOT);
}

/* Becomes uid = gid `id` with no supplementary groups. Raw syscalls: the glibc wrappers
 * broadcast the change to every thread glibc knows of (__nptl_setxid), and after a raw clone3
 * those are the parent's threads: it can hang. A credential change clears the parent-death
 * signal, so it is armed again. */
static void s_child_setid(const ka_spawn_msg_t *c, uint32_t id)
{
    if (syscall(SYS_setresgid, id, id, id) < 0 || syscall(SYS_setresuid, id, id, id) < 0 ||
        prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        s_fail(c, KA_SPAWN_STEP_CREDS);
}

/* User namespace owned by the sandbox's own host uid, identity 65532 inside, no capabilities. */
static void s_child_creds(const ka_spawn_msg_t *c)
{
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        s_fail(c, KA_SPAWN_STEP_CREDS);
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { /* the guest survives a memory bomb; the guest resets its children to 0 */
        (void)!write(fd, "-999", 4);
        close(fd);
    }
    /* the last privileged steps: limits that hold for everything the sandbox starts */
    struct rlimit nofile = {c->nofile, c->nofile};
    struct rlimit nproc = {c->pids_max, c->pids_max};
    if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 ||
        (c->pids_max && setrlimit(RLIMIT_NPROC, &nproc) < 0))
        s_fail(c, KA_SPAWN_STEP_CREDS);
    /* the namespace's owner is the sandbox's host uid: the kernel charges its per-user pools
     * there, never to host root */
    s_child_setid(c, c->uid);
    if (unshare(CLONE_NEWUSER) < 0)
        s_fail(c, KA_SPAWN_STEP_USERNS);
    ka_spawn_report_t r = {.tag = 'U'};
    char ack;
    if (write(c->sync_fd, &r, sizeof(r)) != (ssize_t)sizeof(r) || read(c->sync_fd, &ack, 1) != 1)
        _exit(126);
    for (int cap = 0; cap <= 63; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            s_fail(c, KA_SPAWN_STEP_CREDS);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED |
                                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED) < 0)
        s_fail(c, KA_SPAWN_STEP_CREDS);
    s_child_setid(c, KA_GP_UID);
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capset, &h, data) < 0)
        s_fail(c, KA_SPAWN_STEP_CREDS);
}

/* First thing in the clone: die with the node, and hold none of its descriptors (listening
 * socket, client connections, the parent's end of the sync socket). The parent may already be
 * gone: then the sync socket has hung up. */
static void s_child_detach(const ka_spawn_msg_t *c)
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

__attribute__((noreturn)) static void s_child_main(const ka_spawn_msg_t *c)
{
    s_child_detach(c);
    umask(0);
    for (int i = 0; i < c->n_cg; i++) /* join the sandbox's cgroups, before the cgroup ns */
        if (write(c->cg_fds[i], "0", 1) != 1)
            s_fail(c, KA_SPAWN_STEP_CGROUP);
    if (unshare(CLONE_NEWCGROUP) < 0)
        s_fail(c, KA_SPAWN_STEP_CGROUPNS);
    s_child_mounts(c);
    if (sethostname(c->hostname, strlen(c->hostname)) < 0)
        s_fail(c, KA_SPAWN_STEP_UTS);
    s_child_lo_up(c);
    s_child_creds(c);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(c->log_fd, 2) < 0 ||
        dup2(c->channel_fd, KA_GP_CHANNEL_FD) < 0)
        s_fail(c, KA_SPAWN_STEP_FDS);
    /* nothing of the node's may leak into the sandbox: every other fd closes at exec */
    if (syscall(SYS_close_range, KA_GP_CHANNEL_FD + 1, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        s_fail(c, KA_SPAWN_STEP_FDS);
    char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "HOME=" KA_GP_WORKSPACE, "LANG=C.UTF-8", NULL};
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &c->sigmask, NULL, sizeof(c->sigmask)) < 0)
        s_fail(c, KA_SPAWN_STEP_EXEC);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &G.filter) < 0)
        s_fail(c, KA_SPAWN_STEP_SECCOMP);
    execve(KA_GP_GUEST_PATH, G.argv, envp);
    s_fail(c, KA_SPAWN_STEP_EXEC);
}

/* ------------------------------------------------------------------------------------------ */
/* The message                                                                                */

/* The next NUL-terminated string of the tail at *off, or NULL past its end. */
static const char *s_tail_str(const unsigned char *tail, uint32_t len, uint32_t *off)
{
    const unsigned char *nul = *off < len ? memchr(tail + *off, 0, len - *off) : NULL;
    if (!nul)
        return NULL;
    const char *str = (const char *)tail + *off;
    *off = (uint32_t)(nul - tail) + 1;
    return str;
}

/* Every string ends inside its field, every count and descriptor is in range. */
static bool s_fields_valid(const ka_spawn_msg_t *m)
{
    if (m->version != KA_SPAWN_VERSION || m->n_cg < 0 || m->n_cg > KA_SPAWN_MAX_CG ||
        m->n_keep < 0 || m->n_keep > KA_SPAWN_KEEP_MAX || m->n_lower == 0 ||
        m->n_lower > KA_SPAWN_MAX_LOWER || m->n_args > KA_SPAWN_MAX_ARGS || m->n_filter == 0 ||
        m->n_filter > BPF_MAXINSNS || m->tail_len > KA_SPAWN_TAIL_MAX)
        return false;
#define S_ENDS(f) (memchr(m->f, 0, sizeof(m->f)) != NULL)
    if (!(S_ENDS(hostname) && S_ENDS(root) && S_ENDS(data) && S_ENDS(vol) && S_ENDS(guest) &&
          S_ENDS(tmp_opts) && S_ENDS(overlay_opts) && S_ENDS(mp_data) && S_ENDS(mp_run) &&
          S_ENDS(mp_kagent) && S_ENDS(mp_guest) && S_ENDS(mp_proc) && S_ENDS(mp_dev) &&
          S_ENDS(mp_tmp)))
        return false;
#undef S_ENDS
    for (int i = 0; i < m->n_keep; i++)
        if (m->keep[i] < 0 || (i > 0 && m->keep[i] <= m->keep[i - 1]))
            return false;
    return true;
}

/* Points G's layers, arguments and filter into the tail. */
static bool s_unpack(const ka_spawn_msg_t *m, const unsigned char *tail)
{
    uint32_t off = 0;
    for (uint32_t i = 0; i < m->n_lower; i++) /* absolute paths, as the node sends them */
        if (!(G.lowerdirs[i] = s_tail_str(tail, m->tail_len, &off)) || G.lowerdirs[i][0] != '/')
            return false;
    G.argv[0] = "kagent-sandbox-guest";
    for (uint32_t i = 0; i < m->n_args; i++)
        if (!(G.argv[i + 1] = (char *)s_tail_str(tail, m->tail_len, &off)))
            return false;
    G.argv[m->n_args + 1] = NULL;
    off = (off + 7u) & ~7u;
    if (off > m->tail_len || m->tail_len - off != m->n_filter * sizeof(struct sock_filter))
        return false;
    G.filter.len = (unsigned short)m->n_filter;
    G.filter.filter = (struct sock_filter *)(tail + off);
    return true;
}

/* With a base namespace (ka_basens.h): a detached clone of the sandbox's volume mount, taken
 * here in the node's namespace, then this process moved into the base one, whose copy the
 * unshare makes; the clone is attached there at the volume's path, so every path the steps use
 * names the same files. Without one: -1, and the node's namespace is the one copied. */
static int s_enter_base(const ka_spawn_msg_t *c)
{
    if (c->base_ns_fd < 0)
        return -1;
    int vol = (int)syscall(SYS_open_tree, AT_FDCWD, c->vol, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (vol < 0 || setns(c->base_ns_fd, CLONE_NEWNS) < 0 || close(c->base_ns_fd) < 0)
        s_fail(c, KA_SPAWN_STEP_BASENS);
    return vol;
}

/* The guest's process: this one's child in new namespaces, the node's child by CLONE_PARENT
 * (PID namespaces refuse CLONE_PARENT at the clone that makes them, not after an unshare). It
 * waits until its pid is reported ('P', before its own reports on the same socket). */
__attribute__((noreturn)) static void s_start_guest(const ka_spawn_msg_t *c)
{
    int gate[2], vol = s_enter_base(c);
    if (unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC) < 0)
        s_fail(c, KA_SPAWN_STEP_UNSHARE);
    if (vol >= 0 &&
        (syscall(SYS_move_mount, vol, "", AT_FDCWD, c->vol, MOVE_MOUNT_F_EMPTY_PATH) < 0 ||
         close(vol) < 0))
        s_fail(c, KA_SPAWN_STEP_BASENS);
    if (pipe2(gate, O_CLOEXEC) < 0)
        s_fail(c, KA_SPAWN_STEP_CLONE);
    long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, NULL, NULL, 0);
    if (pid < 0)
        s_fail(c, KA_SPAWN_STEP_CLONE);
    if (pid == 0) {
        char b;
        close(gate[1]);
        if (read(gate[0], &b, 1) != 0)
            _exit(125);
        close(gate[0]);
        s_child_main(c);
    }
    ka_spawn_report_t r = {.tag = 'P', .pid = (int)pid};
    (void)!send(c->sync_fd, &r, sizeof(r), MSG_NOSIGNAL);
    _exit(0); /* closes the gate */
}

/* argv[1]: the sync socket. Anything unexpected ends the process: the node sees its report or
 * the socket's EOF without the guest's ready frame, and fails the start. */
int main(int argc, char **argv)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || argc != 2)
        _exit(125);
    char *end;
    long fd = strtol(argv[1], &end, 10);
    if (*end || fd < 0 || fd > 65535)
        _exit(125);
    ssize_t n = recv((int)fd, G.in.bytes, sizeof(G.in.bytes), MSG_TRUNC);
    const ka_spawn_msg_t *m = &G.in.msg;
    bool ok = n >= (ssize_t)sizeof(*m) && (size_t)n <= sizeof(G.in.bytes) && s_fields_valid(m) &&
              (size_t)n == sizeof(*m) + m->tail_len && m->sync_fd == (int)fd &&
              s_unpack(m, G.in.bytes + sizeof(*m));
    if (!ok) {
        ka_spawn_report_t r = {.tag = 'E', .step = KA_SPAWN_STEP_MSG, .err = EPROTO};
        (void)!send((int)fd, &r, sizeof(r), MSG_NOSIGNAL);
        _exit(127);
    }
    s_start_guest(m);
}
