/*
 * sbx_probe: a static helper copied into the escape-test rootfs. Each argument names one
 * forbidden action; it tries it and prints "<name> ok" if the action SUCCEEDED (an escape) or
 * "<name> denied <errno>" if the kernel refused it. Exit status 0 when every action was
 * denied, 1 otherwise.
 *
 * Three commands instead of actions:
 *   hold-pools   takes the kernel's per-user pools to their limits (inotify instances, POSIX
 *                message-queue bytes, pending real-time signals), prints "held ..." and holds
 *                them until killed;
 *   pools-free   takes one of each; exit 0 if all three were granted;
 *   signal-pid1  asks the kernel to signal the guest (PID 1) on its behalf: SIGTERM through
 *                F_SETOWN + F_SETSIG on a pipe, and a sigqueue forging sender pid 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <mqueue.h>
#include <sys/inotify.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static long s_try(const char *name)
{
    if (!strcmp(name, "keyctl"))
        return syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1);
    if (!strcmp(name, "add_key"))
        return syscall(SYS_add_key, "user", "escape", "x", 1, KEY_SPEC_PROCESS_KEYRING);
    if (!strcmp(name, "raw_socket"))
        return socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
    if (!strcmp(name, "raw_socket6"))
        return socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6);
    if (!strcmp(name, "packet_socket"))
        return socket(AF_PACKET, SOCK_RAW, 0);
    if (!strcmp(name, "netlink_audit"))
        return socket(AF_NETLINK, SOCK_RAW, 9 /* NETLINK_AUDIT */);
    if (!strcmp(name, "ptrace_pid1"))
        return ptrace(PTRACE_ATTACH, 1, 0, 0);
    if (!strcmp(name, "unshare_user"))
        return unshare(CLONE_NEWUSER);
    if (!strcmp(name, "unshare_mount"))
        return unshare(CLONE_NEWNS);
    if (!strcmp(name, "clone_newuser")) {
        long pid = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
        if (pid == 0)
            _exit(0);
        return pid;
    }
    if (!strcmp(name, "mount_tmpfs"))
        return mount("none", "/tmp", "tmpfs", 0, NULL);
    if (!strcmp(name, "remount_guest_rw"))
        return mount(NULL, "/run/kagent/guest", NULL, MS_REMOUNT | MS_BIND, NULL);
    if (!strcmp(name, "umount_data"))
        return umount2("/data", MNT_DETACH);
    if (!strcmp(name, "open_guest_rw"))
        return open("/run/kagent/guest", O_WRONLY);
    if (!strcmp(name, "bpf")) {
        union bpf_attr a;
        memset(&a, 0, sizeof(a));
        return syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof(a));
    }
    if (!strcmp(name, "perf_event_open")) {
        struct perf_event_attr a;
        memset(&a, 0, sizeof(a));
        a.size = sizeof(a);
        a.type = PERF_TYPE_SOFTWARE;
        a.config = PERF_COUNT_SW_CPU_CLOCK;
        return syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    }
    if (!strcmp(name, "setuid_root"))
        return setuid(0);
    if (!strcmp(name, "euid_root"))
        return geteuid() == 0 ? 0 : (errno = EPERM, -1);
    if (!strcmp(name, "chroot"))
        return chroot("/tmp");
    if (!strcmp(name, "sethostname"))
        return sethostname("pwned", 5);
    if (!strcmp(name, "io_uring"))
        return syscall(425 /* io_uring_setup */, 1, calloc(1, 256));
    if (!strcmp(name, "mem_pid1"))
        return open("/proc/1/mem", O_RDONLY);
    if (!strcmp(name, "kmsg"))
        return open("/dev/kmsg", O_RDONLY);
    if (!strcmp(name, "mknod"))
        return syscall(SYS_mknod, "/tmp/sda", 060600, 0x800);
    errno = EINVAL;
    fprintf(stderr, "unknown probe %s\n", name);
    exit(2);
}

static int s_mq(int i)
{
    char name[32];
    struct mq_attr a = {.mq_maxmsg = 10, .mq_msgsize = 8192};
    snprintf(name, sizeof(name), "/probe-%d-%d", (int)getpid(), i);
    return mq_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600, &a);
}

static int s_sig(void)
{
    union sigval v = {0};
    return sigqueue(getpid(), SIGRTMIN, v);
}

static void s_block_rt(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGRTMIN);
    sigprocmask(SIG_BLOCK, &set, NULL);
}

static int s_hold_pools(void)
{
    int ino = 0, mq = 0, sig = 0;
    s_block_rt();
    while (inotify_init1(IN_CLOEXEC) >= 0)
        ino++;
    int ino_errno = errno;
    while (s_mq(mq) >= 0)
        mq++;
    int mq_errno = errno;
    while (s_sig() == 0)
        sig++;
    printf("held inotify=%d (%d) mq=%d (%d) sig=%d (%d)\n", ino, ino_errno, mq, mq_errno, sig,
           errno);
    fflush(stdout);
    while (pause() < 0 && errno == EINTR)
        ;
    return 0;
}

static int s_pools_free(void)
{
    s_block_rt();
    int ino = inotify_init1(IN_CLOEXEC), mq = s_mq(0), sig = s_sig();
    printf("inotify %s mq %s sig %s\n", ino >= 0 ? "ok" : "refused", mq >= 0 ? "ok" : "refused",
           sig == 0 ? "ok" : "refused");
    return ino >= 0 && mq >= 0 && sig == 0 ? 0 : 1;
}

static int s_signal_pid1(void)
{
    int p[2];
    if (pipe(p) < 0 || fcntl(p[0], F_SETOWN, 1) < 0 || fcntl(p[0], F_SETSIG, SIGTERM) < 0 ||
        fcntl(p[0], F_SETFL, O_ASYNC | O_NONBLOCK) < 0 || write(p[1], "x", 1) != 1)
        return 2;
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    si.si_signo = SIGTERM;
    si.si_code = SI_QUEUE;
    si.si_pid = 0; /* pretend to be the node */
    si.si_uid = 0;
    long rc = syscall(SYS_rt_sigqueueinfo, 1, SIGTERM, &si);
    printf("sigio sent, sigqueue %s\n", rc == 0 ? "sent" : "refused");
    usleep(200000);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "hold-pools"))
        return s_hold_pools();
    if (argc == 2 && !strcmp(argv[1], "pools-free"))
        return s_pools_free();
    if (argc == 2 && !strcmp(argv[1], "signal-pid1"))
        return s_signal_pid1();
    int escaped = 0;
    for (int i = 1; i < argc; i++) {
        errno = 0;
        long rc = s_try(argv[i]);
        if (rc >= 0) {
            printf("%s ok\n", argv[i]);
            escaped = 1;
        } else {
            printf("%s denied %d\n", argv[i], errno);
        }
    }
    return escaped;
}
