/* ka_namespaces: the `namespaces` sandbox class (see ka_namespaces.h). */
#include "ka_namespaces.h"
#include "guest_proto.h"
#include "ka_basens.h"
#include "ka_cgroup.h"
#include "ka_spawn.h"
#include "ka_tree.h"
#include "ka_volume.h"
#include "krt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <poll.h>
#include <pthread.h>
#include <seccomp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "phases.h"

#define S_PATH        512 /* mount points in the child */
#define S_SDIR        400 /* the state dir */
#define S_DIR         470 /* a sandbox's dir */
#define S_SANDBOX_UID KA_GP_UID
#define S_UID_BASE    1000000u
#define S_UID_COUNT   65536u
#define S_NOFILE      1024u
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
    char spawn_dir[S_SDIR + 8];   /* <state>/.spawn: kagent-spawn, written from the node */
    char spawn_path[S_SDIR + 32]; /* <state>/.spawn/kagent-spawn */
    char volume_dir[S_SDIR + 16]; /* <state>/.volumes */
    int base_ns;                  /* the namespace sandboxes copy (ka_basens.h), or -1 */
    ka_volumes_t *volumes;
    char **guest_args;
    struct sock_fprog filter; /* exported once; kagent-spawn installs it */
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

/* A start's message to kagent-spawn (ka_spawn.h): the header and its tail. */
typedef struct s_child {
    ka_spawn_msg_t m;
    unsigned char tail[KA_SPAWN_TAIL_MAX];
} s_child_t;

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

/* What a sandbox's volume holds before its sandbox starts: /data (its workspace and the
 * guest's logs, owned by the sandbox's uid) and the overlay's upper/{u,w}. Every volume starts
 * with these directories (ka_volume_opts_t.skeleton, built from this table at the driver's
 * start); a start makes any that are missing. */
static const struct {
    const char *name;
    mode_t mode;
    bool owned; /* by the sandbox's uid */
} s_vol_dirs[] = {{"data", 0755, false},           {"data/workspace", 0755, true},
                  {"data/guest-logs", 0750, true}, {"upper", 0755, false},
                  {"upper/u", 0755, false},        {"upper/w", 0700, false}};

/* Makes dir/<name> for each of s_vol_dirs with its mode (as before the skeleton: through the
 * node's umask), or finds it made (a directory, not a link); chowns the owned ones to uid
 * (uid 0: none). 0 or -errno. */
static int s_vol_dirs_make(const char *dir, uint32_t uid)
{
    char p[S_PATH + 32];
    for (size_t i = 0; i < sizeof(s_vol_dirs) / sizeof(s_vol_dirs[0]); i++) {
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, s_vol_dirs[i].name);
        if (mkdir(p, s_vol_dirs[i].mode) < 0 &&
            (errno != EEXIST || lstat(p, &st) < 0 || !S_ISDIR(st.st_mode)))
            return errno == EEXIST ? -ENOTDIR : -errno;
        if (uid && s_vol_dirs[i].owned && lchown(p, uid, uid) < 0)
            return -errno;
    }
    return 0;
}

/* <dir>/root, the volume (linked as <dir>/vol, its directories owned), and <dir>/data linking
 * to vol/data for the host's copies. */
static int s_mkdirs(const s_driver_t *d, ka_sandbox_t *sb)
{
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
    return s_vol_dirs_make(sb->vol, sb->uid);
}

/* Gives the sandbox's volume back once the sandbox is gone (its processes and its mounts): it
 * is emptied for the next sandbox, or unmounted and deleted. */
static int s_release_volume(const s_driver_t *d, ka_sandbox_t *sb)
{
    int rc = sb->vol[0] ? ka_volume_release(d->volumes, sb->vol, true) : 0;
    sb->vol[0] = 0;
    return rc;
}

/* Appends n bytes to the message's tail. */
static int s_tail_put(s_child_t *c, const void *p, size_t n)
{
    if (n > KA_SPAWN_TAIL_MAX - c->m.tail_len)
        return -E2BIG;
    memcpy(c->tail + c->m.tail_len, p, n);
    c->m.tail_len += (uint32_t)n;
    return 0;
}

/* The image layers: each opened here (its number reserved for kagent-spawn, which reopens the
 * path in the sandbox's mount namespace onto it) and named by that number in the overlay. */
static int s_prepare_layers(s_child_t *c, const ka_sandbox_spec_t *spec)
{
    ka_spawn_msg_t *m = &c->m;
    if (spec->n_lower > KA_SPAWN_MAX_LOWER)
        return -E2BIG;
    size_t o = (size_t)snprintf(m->overlay_opts, sizeof(m->overlay_opts), "lowerdir=");
    for (; m->n_lower < spec->n_lower; m->n_lower++) {
        const char *dir = spec->lowerdirs[m->n_lower];
        int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            return -errno;
        m->lower_fds[m->n_lower] = fd;
        o += (size_t)snprintf(m->overlay_opts + o, sizeof(m->overlay_opts) - o,
                              "%s/proc/self/fd/%d", m->n_lower ? ":" : "", fd);
        int rc = s_tail_put(c, dir, strlen(dir) + 1);
        if (rc < 0)
            return rc;
    }
    /* upper and work are relative to the volume, kagent-spawn's cwd when it mounts the overlay */
    o += (size_t)snprintf(m->overlay_opts + o, sizeof(m->overlay_opts) - o,
                          ",upperdir=upper/u,workdir=upper/w,volatile");
    return o < sizeof(m->overlay_opts) ? 0 : -E2BIG;
}

/* The guest's arguments, then the seccomp program (8-aligned), into the tail. */
static int s_prepare_tail(s_driver_t *d, s_child_t *c)
{
    int rc = 0;
    for (size_t i = 0; d->guest_args && d->guest_args[i] && rc == 0; i++, c->m.n_args++)
        rc = c->m.n_args < KA_SPAWN_MAX_ARGS
                 ? s_tail_put(c, d->guest_args[i], strlen(d->guest_args[i]) + 1)
                 : -E2BIG;
    static const unsigned char pad[8];
    if (rc == 0)
        rc = s_tail_put(c, pad, (8u - c->m.tail_len % 8u) % 8u);
    c->m.n_filter = d->filter.len;
    return rc < 0 ? rc : s_tail_put(c, d->filter.filter, d->filter.len * sizeof(*d->filter.filter));
}

static int s_prepare_child(s_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t *sb,
                           s_child_t *c)
{
    ka_spawn_msg_t *m = &c->m;
    m->version = KA_SPAWN_VERSION;
    const char *hn = spec->hostname ? spec->hostname : "sandbox";
    if (strlen(hn) >= sizeof(m->hostname))
        return -EINVAL;
    strcpy(m->hostname, hn);
    m->nofile = d->nofile;
    m->pids_max = d->lim.pids_max;
    m->base_ns_fd = d->base_ns;
    snprintf(m->root, sizeof(m->root), "%s/root", sb->dir);
    snprintf(m->data, sizeof(m->data), "%s/data", sb->vol);
    snprintf(m->vol, sizeof(m->vol), "%s", sb->vol);
    snprintf(m->guest, sizeof(m->guest), "%s/guest", d->guest_dir);
    snprintf(m->mp_data, sizeof(m->mp_data), "%s/data", m->root);
    snprintf(m->mp_run, sizeof(m->mp_run), "%s/run", m->root);
    snprintf(m->mp_kagent, sizeof(m->mp_kagent), "%s/run/kagent", m->root);
    snprintf(m->mp_guest, sizeof(m->mp_guest), "%s/run/kagent/guest", m->root);
    snprintf(m->mp_proc, sizeof(m->mp_proc), "%s/proc", m->root);
    snprintf(m->mp_dev, sizeof(m->mp_dev), "%s/dev", m->root);
    snprintf(m->mp_tmp, sizeof(m->mp_tmp), "%s/tmp", m->root);
    snprintf(m->tmp_opts, sizeof(m->tmp_opts), "mode=700,size=%llu",
             (unsigned long long)d->tmp_bytes);
    int rc = s_prepare_layers(c, spec);
    return rc < 0 ? rc : s_prepare_tail(d, c);
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
    for (size_t i = 0; i < c->m.n_lower; i++)
        close(c->m.lower_fds[i]);
    c->m.n_lower = 0;
}

/* The descriptors kagent-spawn keeps, ascending: everything else of the node's it closes. */
static void s_keep_list(ka_spawn_msg_t *m)
{
    int n = 0;
    m->keep[n++] = m->sync_fd;
    m->keep[n++] = m->channel_fd;
    m->keep[n++] = m->log_fd;
    if (m->base_ns_fd >= 0)
        m->keep[n++] = m->base_ns_fd;
    for (int i = 0; i < m->n_cg; i++)
        m->keep[n++] = m->cg_fds[i];
    for (size_t i = 0; i < m->n_lower; i++) /* reserved for the layers */
        m->keep[n++] = m->lower_fds[i];
    for (int i = 1; i < n; i++) /* insertion sort: a handful */
        for (int j = i; j > 0 && m->keep[j - 1] > m->keep[j]; j--) {
            int t = m->keep[j];
            m->keep[j] = m->keep[j - 1];
            m->keep[j - 1] = t;
        }
    m->n_keep = n;
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

/* The error of a report read as n bytes: its errno if it is a failed step's, else -EPROTO (and
 * *r then names no step). */
static int s_report_err(ssize_t n, ka_spawn_report_t *r)
{
    if (n == (ssize_t)sizeof(*r) && r->tag == 'E' && r->err > 0)
        return -r->err;
    *r = (ka_spawn_report_t){.tag = 'E', .step = -1, .err = EPROTO};
    return -EPROTO;
}

/* Starts kagent-spawn with posix_spawn (a vfork: nothing of the node's memory is copied, so a
 * start costs the same whatever the node's size), its kept descriptors open across the exec and
 * every signal blocked until it execs the guest with this thread's mask, then sends it the
 * message on sync. It answers with the guest's pid ('P') or a failed step ('E') and exits; it
 * is reaped here. The guest's pid, or a negative errno (*r says the step, if one failed).
 * The guest becomes a child of the calling thread (CLONE_PARENT) and its parent-death signal
 * fires when that thread ends, not the node: starts run on threads that live as long as the
 * node (the runtime's job threads), never on a short-lived one. */
static int s_spawn(const s_driver_t *d, s_child_t *c, int sync, ka_spawn_report_t *r)
{
    ka_spawn_msg_t *m = &c->m;
    sigset_t all, mine;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, NULL, &mine);
    memcpy(&m->sigmask, &mine, sizeof(m->sigmask));
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    int err = 0;
    for (int i = 0; i < m->n_keep && !err; i++) /* dup2 onto itself: clears close-on-exec */
        err = posix_spawn_file_actions_adddup2(&fa, m->keep[i], m->keep[i]);
    if (!err)
        err = posix_spawnattr_setsigmask(&at, &all);
    if (!err)
        err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK);
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", m->sync_fd);
    char *argv[] = {"kagent-spawn", fd, NULL}, *envp[] = {NULL};
    pid_t helper = -1;
    if (!err)
        err = posix_spawn(&helper, d->spawn_path, &fa, &at, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (err) {
        *r = (ka_spawn_report_t){.tag = 'E', .step = KA_SPAWN_STEP_SPAWN, .err = err};
        return -err;
    }
    struct iovec iov[2] = {{m, sizeof(*m)}, {c->tail, m->tail_len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    ssize_t n = -1;
    if (sendmsg(sync, &mh, MSG_NOSIGNAL) == (ssize_t)(sizeof(*m) + m->tail_len))
        n = read(sync, r, sizeof(*r));
    else
        kill(helper, SIGKILL);
    while (waitpid(helper, NULL, 0) < 0 && errno == EINTR)
        ;
    if (n == (ssize_t)sizeof(*r) && r->tag == 'P' && r->pid > 0)
        return r->pid;
    return s_report_err(n, r);
}

/* The guest's setup asks for its id maps once in its user namespace, then execs the guest: EOF
 * on the sync socket (close-on-exec) means the exec happened. 0 or a negative errno (*r says
 * the step, if one failed). */
static int s_handshake(const ka_sandbox_t *sb, int sync, ka_spawn_report_t *r)
{
    ssize_t n = read(sync, r, sizeof(*r));
    if (n == (ssize_t)sizeof(*r) && r->tag == 'U') {
        int rc = s_maps(sb, sb->pid);
        if (rc < 0) {
            *r = (ka_spawn_report_t){.tag = 'E', .step = -1};
            return rc;
        }
        if (write(sync, "G", 1) != 1) {
            *r = (ka_spawn_report_t){.tag = 'E', .step = -1};
            return -EPIPE;
        }
        n = read(sync, r, sizeof(*r));
    }
    return n == 0 ? 0 : s_report_err(n, r);
}

static void s_setup_failed(const s_child_t *c, const ka_spawn_report_t *r)
{
    dprintf(c->m.log_fd, "{\"event\":\"sandbox_setup_failed\",\"step\":%d,\"errno\":%d}\n", r->step,
            r->err);
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
    c->m.log_fd = -1;
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
    c->m.log_fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (c->m.log_fd < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch) < 0 ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sy) < 0) {
        rc = -errno;
        goto fail;
    }
    s_channel_buffers(ch);
    c->m.channel_fd = ch[1];
    c->m.sync_fd = sy[1];
    rc = ka_cgroup_procs_fds(sb->cg, c->m.cg_fds);
    if (rc < 0)
        goto fail;
    c->m.n_cg = rc;
    c->m.uid = sb->uid;
    s_keep_list(&c->m);

    ka_spawn_report_t r = {0};
    rc = s_spawn(d, c, sy[0], &r);
    s_close_layers(c);
    for (int i = 0; i < c->m.n_cg; i++)
        close(c->m.cg_fds[i]);
    close(ch[1]);
    close(sy[1]);
    ch[1] = sy[1] = -1;
    if (rc < 0) {
        s_setup_failed(c, &r);
        goto fail;
    }
    sb->pid = (pid_t)rc;
    rc = s_handshake(sb, sy[0], &r);
    if (rc < 0) {
        s_setup_failed(c, &r);
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
    close(c->m.log_fd);
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
    if (c && c->m.log_fd >= 0)
        close(c->m.log_fd);
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
    if (d->base_ns >= 0)
        close(d->base_ns);
    ka_volumes_destroy(&d->volumes);
    if (d->guest_dir[0])
        ka_volume_file_remove(d->guest_dir);
    if (d->spawn_dir[0])
        ka_volume_file_remove(d->spawn_dir);
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

/* Writes kagent-spawn from the node's own image (ka_spawn.h) to <state>/.spawn, a tmpfs of its
 * own, read-only to everyone but root. */
static int s_spawn_install(s_driver_t *d)
{
    int fd = memfd_create("kagent-spawn", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t len = (size_t)(ka_spawn_image_end - ka_spawn_image);
    int rc = write(fd, ka_spawn_image, len) == (ssize_t)len ? 0 : -EIO; /* a memfd takes it all */
    char src[64];
    snprintf(src, sizeof(src), "/proc/self/fd/%d", fd);
    snprintf(d->spawn_dir, sizeof(d->spawn_dir), "%s/.spawn", d->state_dir);
    if (rc == 0)
        rc = ka_volume_file(d->spawn_dir, src, "kagent-spawn");
    close(fd);
    if (rc < 0)
        d->spawn_dir[0] = 0;
    snprintf(d->spawn_path, sizeof(d->spawn_path), "%s/kagent-spawn", d->spawn_dir);
    return rc;
}

/* The namespace sandboxes copy: taken once the node's own mounts (guest, kagent-spawn) are in
 * place, without the volumes. Without it starts still work, each copying the node's mounts. */
static void s_base_ns_open(s_driver_t *d)
{
    d->base_ns = ka_basens_open(d->volume_dir);
    if (d->base_ns < 0)
        krt_log(KRT_LOG_WARN, "driver", "base_namespace_unavailable",
                "errno=%d (each start copies the node's mount table)", -d->base_ns);
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
    d->base_ns = -1;
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
    (void)ka_dir_spread(d->state_dir); /* the sandboxes' directories: a hint (ka_tree.h) */
    rc = s_filter_build(&d->filter);
    if (rc < 0)
        goto fail;
    snprintf(d->volume_dir, sizeof(d->volume_dir), "%s/.volumes", d->state_dir);
    char skeleton[S_SDIR + 16];
    snprintf(skeleton, sizeof(skeleton), "%s/.skeleton", d->state_dir);
    if ((mkdir(skeleton, 0755) < 0 && errno != EEXIST) || chmod(skeleton, 0755) < 0 ||
        (rc = s_vol_dirs_make(skeleton, 0)) < 0) {
        rc = rc < 0 ? rc : -errno;
        goto fail;
    }
    ka_volume_opts_t vo = {.dir = d->volume_dir,
                           .skeleton = skeleton,
                           .bytes = opts->disk_bytes ? opts->disk_bytes : KA_VOLUME_DEFAULT_BYTES,
                           .inodes = opts->disk_inodes,
                           .spare = opts->disk_spare ? opts->disk_spare : 4,
                           .reap_ms = opts->disk_reap_ms};
    if (!(d->volumes = ka_volumes_new(&vo, &rc)))
        goto fail;
    s_cleanup_leftovers(d);
    snprintf(d->guest_dir, sizeof(d->guest_dir), "%s/.guest", d->state_dir);
    if ((rc = ka_volume_file(d->guest_dir, d->guest_path, "guest")) < 0) {
        d->guest_dir[0] = 0;
        goto fail;
    }
    if ((rc = s_spawn_install(d)) < 0)
        goto fail;
    s_base_ns_open(d);
    return &d->base;
fail:
    if (d)
        s_destroy(&d->base);
    if (err)
        *err = rc;
    return NULL;
}
