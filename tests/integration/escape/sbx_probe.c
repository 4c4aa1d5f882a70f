/*
 * sbx_probe: a static helper copied into the escape-test rootfs. Each argument names one
 * forbidden action; it tries it and prints "<name> ok" if the action SUCCEEDED (an escape) or
 * "<name> denied <errno>" if the kernel refused it. Exit status 0 when every action was
 * denied, 1 otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
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

int main(int argc, char **argv)
{
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
