/*
 * kagent-sandbox-guest: the agent that runs as PID 1 inside a sandbox.
 *
 * One thread, one poll loop over: the channel to the node (guest_proto.h framing), a signalfd
 * (SIGCHLD for reaping, SIGTERM/SIGINT to stop, others forwarded to the process groups), the
 * stdout/stderr pipes of running processes and their stdin pipes when input is pending.
 * Process output is spooled to files under the log dir (capped per stream) and streamed from
 * any offset. Files are read and written relative to the workspace; paths that resolve
 * outside it (.., absolute symlinks, magic links) are refused with openat2(RESOLVE_BENEATH).
 *
 * Statically linked, no NSS calls (no getpwnam etc.): uids are numbers.
 */
#include "guest_files.h"
#include "guest_fsops.h"
#include "guest_proto.h"
#include "guest_tty.h"
#include "guest_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Channel buffers are bounded and given back: streams stop pumping above S_OUTBUF_HIGH queued
 * bytes (the queue peaks near S_OUTBUF_HIGH + KA_GP_CHUNK however many streams are open); the
 * input buffer grows to the frame being received and no further; after S_TRIM_MS without
 * channel traffic both shrink back (to S_IN_BASE; the queue, above S_OUT_BASE, to nothing). */
#define S_OUTBUF_HIGH (1u << 20)
#define S_IN_BASE     (128u << 10)
#define S_OUT_BASE    (64u << 10)
#define S_TRIM_MS     500

typedef struct s_proc {
    uint64_t id;
    pid_t pid;
    int state; /* KA_GP_STATE_* */
    int exit_code;
    char **argv; /* NULL-terminated, owned */
    uint64_t started_ms, finished_ms;
    uint64_t deadline; /* monotonic ms; 0 = none (or already fired) */
    int pipe_fd[2];    /* read ends of stdout/stderr, -1 once closed */
    int spool_fd[2];   /* written while it runs; closed at its exit unless spool_mem */
    bool spool_mem[2]; /* an anonymous spool (full disk): it has no path, so it stays open */
    uint64_t spooled[2];
    int in_fd; /* stdin write end (a tty: the master), -1 if none or closed */
    char *in_pend;
    size_t in_len;
    bool in_close;   /* close stdin once in_pend is written */
    bool tty;        /* runs on a pseudo terminal: pipe_fd[0] and in_fd are its master */
    uint64_t in_req; /* the "input" request answered once in_pend is written; 0 = none */
    uint64_t in_ack; /* bytes that request brought */
    struct s_proc *next;
} s_proc_t;

/* An open reply stream: a process's output, a file being read, or a watch. */
typedef struct s_stream {
    uint64_t req;
    s_proc_t *p; /* output streams */
    uint64_t off[2];
    bool follow;
    int fd;       /* read streams: the file (-1 when none) */
    int spool[2]; /* output streams of exited processes: the spools reopened (-1 when not) */
    uint64_t roff, rsize;
    ka_gw_t *w;       /* watch streams */
    uint64_t credit;  /* data bytes it may still send (UINT64_MAX: not credit-bound) */
    uint64_t last_ms; /* monotonic ms of its last frame (keepalives) */
    struct s_stream *next;
} s_stream_t;

static struct {
    int ch;      /* channel to the node */
    uint8_t *in; /* bytes received, not yet a full frame */
    size_t in_len, in_cap;
    msgpack_sbuffer out; /* frames queued for the node */
    size_t out_off;      /* first unsent byte of out */
    msgpack_packer pk;   /* packs into out */
    int sfd;             /* signalfd */
    s_proc_t *procs;
    s_stream_t *streams;
    uint64_t next_id;
    int running;
    int max_procs;
    uint64_t timeout_ms;
    uint64_t spool_cap;
    const char *workspace, *logdir;
    int ws_fd;
    bool drop; /* we are root: children switch to uid */
    uid_t uid;
    bool pid1;
    int watches; /* open watch streams (at most KA_GP_MAX_WATCHES) */
} G;

/* --- small utilities ------------------------------------------------------------------------ */

static uint64_t s_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t s_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* One JSON line on stderr. msg must not need escaping beyond what we do here. */
static void s_log(const char *level, const char *event, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    for (char *c = msg; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = '\'';
    fprintf(stderr, "{\"ts\":%llu,\"level\":\"%s\",\"event\":\"%s\",\"msg\":\"%s\"}\n",
            (unsigned long long)s_wall_ms(), level, event, msg);
}

static void s_key(const char *k)
{
    ka_gp_pack_cstr(&G.pk, k);
}

static size_t s_begin(uint64_t id, uint32_t nkeys)
{
    size_t off = ka_gp_frame_begin(&G.out);
    msgpack_pack_map(&G.pk, nkeys + 1);
    s_key("id");
    msgpack_pack_uint64(&G.pk, id);
    return off;
}

static void s_end(size_t off)
{
    ka_gp_frame_end(&G.out, off);
}

static void s_reply_err(uint64_t id, int err, const char *msg)
{
    size_t off = s_begin(id, 3);
    s_key("err");
    msgpack_pack_int64(&G.pk, err);
    s_key("msg");
    ka_gp_pack_cstr(&G.pk, msg);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
}

static void s_reply_end(uint64_t id)
{
    size_t off = s_begin(id, 1);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
}

static void s_pack_process(const s_proc_t *p)
{
    msgpack_pack_map(&G.pk, 7);
    s_key("proc");
    msgpack_pack_uint64(&G.pk, p->id);
    s_key("argv");
    size_t n = 0;
    while (p->argv[n])
        n++;
    msgpack_pack_array(&G.pk, n);
    for (size_t i = 0; i < n; i++)
        ka_gp_pack_cstr(&G.pk, p->argv[i]);
    s_key("pid");
    msgpack_pack_int64(&G.pk, p->pid);
    s_key("state");
    msgpack_pack_uint32(&G.pk, (uint32_t)p->state);
    s_key("exit_code");
    msgpack_pack_int64(&G.pk, p->exit_code);
    s_key("started_ms");
    msgpack_pack_uint64(&G.pk, p->started_ms);
    s_key("finished_ms");
    msgpack_pack_uint64(&G.pk, p->finished_ms);
}

static void s_reply_process(uint64_t id, const s_proc_t *p)
{
    size_t off = s_begin(id, 2);
    s_key("process");
    s_pack_process(p);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
}

static s_proc_t *s_find(const msgpack_object *req)
{
    uint64_t id;
    if (!ka_gp_get_u64(req, "proc", &id))
        return NULL;
    for (s_proc_t *p = G.procs; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

static size_t s_queued(void)
{
    return G.out.size - G.out_off;
}

/* --- output streams ------------------------------------------------------------------------- */

static bool s_proc_done(const s_proc_t *p)
{
    return p->state == KA_GP_STATE_EXITED && p->pipe_fd[0] < 0 && p->pipe_fd[1] < 0;
}

/* How many bytes s may send now (at most a chunk), 0 when it must wait. */
static size_t s_allowance(const s_stream_t *s, uint64_t avail)
{
    uint64_t n = avail < KA_GP_CHUNK ? avail : KA_GP_CHUNK;
    if (n > s->credit)
        n = s->credit;
    return s_queued() > S_OUTBUF_HIGH ? 0 : (size_t)n;
}

/* Room for need more bytes at the end of the out queue. 0 or -ENOMEM. */
static int s_out_reserve(size_t need)
{
    msgpack_sbuffer *sb = &G.out;
    if (sb->alloc - sb->size >= need)
        return 0;
    size_t cap = sb->alloc ? sb->alloc : 65536;
    while (cap - sb->size < need)
        cap *= 2;
    char *p = realloc(sb->data, cap);
    if (!p)
        return -ENOMEM;
    sb->data = p;
    sb->alloc = cap;
    return 0;
}

/* Queues one data frame of stream s under key with up to want bytes of fd at off, read straight
 * into the queue (a bin 32 whose length is patched to what pread gave). The bytes queued; 0 at
 * the end of the file or on an error (nothing queued). */
static size_t s_data_frame(s_stream_t *s, const char *key, int fd, size_t want, uint64_t off,
                           bool with_offset)
{
    size_t fo = s_begin(s->req, with_offset ? 2 : 1);
    s_key(key);
    ssize_t n = -1;
    if (s_out_reserve(5 + want) == 0) {
        uint8_t *h = (uint8_t *)G.out.data + G.out.size;
        do
            n = pread(fd, h + 5, want, (off_t)off);
        while (n < 0 && errno == EINTR);
        h[0] = 0xc6; /* bin 32 */
        h[1] = (uint8_t)((size_t)n >> 24);
        h[2] = (uint8_t)((size_t)n >> 16);
        h[3] = (uint8_t)((size_t)n >> 8);
        h[4] = (uint8_t)n;
    }
    if (n <= 0) {
        G.out.size = fo; /* the frame goes */
        return 0;
    }
    G.out.size += 5 + (size_t)n;
    if (with_offset) {
        s_key("offset");
        msgpack_pack_uint64(&G.pk, off);
    }
    s_end(fo);
    if (s->credit != UINT64_MAX)
        s->credit -= (uint64_t)n;
    s->last_ms = s_mono_ms();
    return (size_t)n;
}

static void s_spool_path(uint64_t id, int k, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%llu.%s", G.logdir, (unsigned long long)id, k ? "stderr" : "stdout");
}

/* The descriptor to read spool k of s's process from: the process's own while it has one, else
 * the stream's, opened by path once (an exited process keeps no descriptor, so a sandbox can
 * run any number of processes one after another within its descriptor limit). */
static int s_spool_reader(s_stream_t *s, int k)
{
    if (s->p->spool_fd[k] >= 0)
        return s->p->spool_fd[k];
    if (s->spool[k] < 0) {
        char path[512];
        s_spool_path(s->p->id, k, path, sizeof path);
        s->spool[k] = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    return s->spool[k];
}

/* Sends what an output stream can send now; true when it is finished (end frame queued). */
static bool s_output_pump(s_stream_t *s)
{
    static const char *names[2] = {"stdout", "stderr"};
    s_proc_t *p = s->p;
    for (int k = 0; k < 2; k++) {
        while (s->off[k] < p->spooled[k]) {
            size_t want = s_allowance(s, p->spooled[k] - s->off[k]);
            if (want == 0)
                return false; /* resumed when the channel drains or credit returns */
            int fd = s_spool_reader(s, k);
            if (fd < 0)
                break;
            size_t n = s_data_frame(s, names[k], fd, want, s->off[k], true);
            if (n == 0)
                break;
            s->off[k] += n;
        }
    }
    bool done = s_proc_done(p);
    if (s->follow && !done)
        return false;
    size_t off = s_begin(s->req, done ? 2 : 1);
    if (done) {
        s_key("exit");
        s_pack_process(p);
    }
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
    return true;
}

/* Sends what a read stream can send now (the file, a chunk at a time); true when finished. */
static bool s_read_pump(s_stream_t *s)
{
    while (s->fd >= 0 && s->roff < s->rsize) {
        size_t want = s_allowance(s, s->rsize - s->roff);
        if (want == 0)
            return false;
        size_t n = s_data_frame(s, "chunk", s->fd, want, s->roff, false);
        if (n == 0) { /* the file shrank: what was read is what there is */
            s->rsize = s->roff;
            break;
        }
        s->roff += n;
    }
    size_t fo = s_begin(s->req, 2);
    s_key("size");
    msgpack_pack_uint64(&G.pk, s->roff);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(fo);
    return true;
}

/* Queues one data frame of stream s under key with n bytes from memory (watch events). */
static void s_bytes_frame(s_stream_t *s, const char *key, const void *data, size_t n)
{
    size_t fo = s_begin(s->req, 1);
    s_key(key);
    ka_gp_pack_bytes(&G.pk, data, n, true);
    s_end(fo);
    if (s->credit != UINT64_MAX)
        s->credit -= (uint64_t)n;
    s->last_ms = s_mono_ms();
}

/* Sends the queued events of a watch as credit allows; a watch never finishes by itself. */
static bool s_watch_pump(s_stream_t *s)
{
    const uint8_t *p;
    size_t n;
    while ((p = ka_gw_peek(s->w, &n)) != NULL && n <= s->credit && s_queued() <= S_OUTBUF_HIGH) {
        s_bytes_frame(s, "event", p, n);
        ka_gw_pop(s->w);
    }
    return false;
}

static bool s_stream_pump(s_stream_t *s)
{
    return s->p ? s_output_pump(s) : s->w ? s_watch_pump(s) : s_read_pump(s);
}

static void s_stream_free(s_stream_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    for (int k = 0; k < 2; k++)
        if (s->spool[k] >= 0)
            close(s->spool[k]);
    if (s->w)
        G.watches--;
    ka_gw_destroy(&s->w);
    free(s);
}

/* A new stream for request id: credit from the request's "window" (none: not bound). */
static s_stream_t *s_stream_new(uint64_t id, const msgpack_object *req)
{
    s_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->req = id;
    s->fd = s->spool[0] = s->spool[1] = -1;
    s->credit = UINT64_MAX;
    ka_gp_get_u64(req, "window", &s->credit);
    s->last_ms = s_mono_ms();
    return s;
}

static void s_stream_add(s_stream_t *s)
{
    s->next = G.streams;
    G.streams = s;
}

/* Keepalives for streams that have been quiet for KA_GP_KEEPALIVE_MS. */
static void s_keepalive(void)
{
    uint64_t now = s_mono_ms();
    for (s_stream_t *s = G.streams; s; s = s->next) {
        if (now - s->last_ms < KA_GP_KEEPALIVE_MS)
            continue;
        s_end(s_begin(s->req, 0));
        s->last_ms = now;
    }
}

static void s_pump_all(void)
{
    s_stream_t **pp = &G.streams;
    while (*pp) {
        s_stream_t *s = *pp;
        if (s_stream_pump(s)) {
            *pp = s->next;
            s_stream_free(s);
        } else {
            pp = &s->next;
        }
    }
}

/* --- processes ------------------------------------------------------------------------------ */

/* Reads what a stdout/stderr pipe has; spools up to the cap, discards the rest. */
static void s_pipe_read(s_proc_t *p, int k)
{
    char buf[65536];
    while (p->pipe_fd[k] >= 0) {
        ssize_t n = read(p->pipe_fd[k], buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            close(p->pipe_fd[k]);
            p->pipe_fd[k] = -1;
            return;
        }
        size_t keep = (size_t)n;
        if (p->spooled[k] + keep > G.spool_cap)
            keep = G.spool_cap > p->spooled[k] ? (size_t)(G.spool_cap - p->spooled[k]) : 0;
        if (keep > 0) {
            ssize_t w = pwrite(p->spool_fd[k], buf, keep, (off_t)p->spooled[k]);
            if (w > 0)
                p->spooled[k] += (uint64_t)w;
        }
    }
}

static void s_reply_written(uint64_t id, uint64_t n)
{
    size_t off = s_begin(id, 2);
    s_key("written");
    msgpack_pack_uint64(&G.pk, n);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
}

/* Stdin is acknowledged once the process has taken it (the pipe or terminal accepted every
 * byte), so the node holds at most one input per process. */
static void s_stdin_ack(s_proc_t *p, int err)
{
    uint64_t id = p->in_req;
    if (!id || (!err && p->in_len > 0))
        return;
    p->in_req = 0;
    if (err)
        s_reply_err(id, err, "stdin closed before the process took the input");
    else
        s_reply_written(id, p->in_ack);
}

static void s_stdin_close(s_proc_t *p)
{
    if (p->in_fd >= 0)
        close(p->in_fd);
    p->in_fd = -1;
    s_stdin_ack(p, p->in_len > 0 ? -EPIPE : 0);
    free(p->in_pend);
    p->in_pend = NULL;
    p->in_len = 0;
}

static void s_stdin_flush(s_proc_t *p)
{
    while (p->in_fd >= 0 && p->in_len > 0) {
        ssize_t n = write(p->in_fd, p->in_pend, p->in_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0) { /* EPIPE: the reader is gone */
            s_stdin_close(p);
            return;
        }
        memmove(p->in_pend, p->in_pend + n, p->in_len - (size_t)n);
        p->in_len -= (size_t)n;
    }
    if (p->in_fd >= 0 && p->in_len == 0 && p->in_close)
        s_stdin_close(p);
    else if (p->in_fd >= 0)
        s_stdin_ack(p, 0);
}

static void s_proc_exited(s_proc_t *p, int status)
{
    p->exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    p->state = KA_GP_STATE_EXITED;
    p->finished_ms = s_wall_ms();
    p->deadline = 0;
    G.running--;
    /* The process is its whole group: what it left running in the background goes with it, so
     * the process limit and timeouts cannot be dodged with `&`. (The group id cannot have been
     * reused: members keep it alive.) */
    kill(-p->pid, SIGKILL);
    /* What the process wrote before it exited is in the pipes: take it, then close them so a
     * background grandchild holding them open cannot keep the stream alive. */
    for (int k = 0; k < 2; k++) {
        s_pipe_read(p, k);
        if (p->pipe_fd[k] >= 0)
            close(p->pipe_fd[k]);
        p->pipe_fd[k] = -1;
        if (!p->spool_mem[k] && p->spool_fd[k] >= 0) /* readers reopen it by path */
            close(p->spool_fd[k]);
        if (!p->spool_mem[k])
            p->spool_fd[k] = -1;
    }
    s_stdin_close(p);
}

static void s_reap(void)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (s_proc_t *p = G.procs; p; p = p->next) {
            if (p->pid == pid && p->state == KA_GP_STATE_RUNNING) {
                s_proc_exited(p, status);
                break;
            }
        }
    }
}

static void s_signal_all(int sig)
{
    for (s_proc_t *p = G.procs; p; p = p->next)
        if (p->state == KA_GP_STATE_RUNNING)
            kill(-p->pid, sig);
}

/* Builds the child's environment: ours, overlaid with the request's map. */
static char **s_build_env(const msgpack_object *env)
{
    size_t n = 0, extra = 0;
    while (environ[n])
        n++;
    if (env && env->type == MSGPACK_OBJECT_MAP)
        extra = env->via.map.size;
    char **out = calloc(n + extra + 1, sizeof(char *));
    if (!out)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        out[m++] = strdup(environ[i]);
    for (size_t i = 0; i < extra; i++) {
        const msgpack_object *k = &env->via.map.ptr[i].key, *v = &env->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR || v->type != MSGPACK_OBJECT_STR || !k->via.str.size ||
            memchr(k->via.str.ptr, '=', k->via.str.size))
            continue;
        char *kv = NULL;
        if (asprintf(&kv, "%.*s=%.*s", (int)k->via.str.size, k->via.str.ptr, (int)v->via.str.size,
                     v->via.str.ptr) < 0)
            continue;
        size_t kl = k->via.str.size + 1;
        size_t j = 0;
        for (; j < m; j++)
            if (out[j] && strncmp(out[j], kv, kl) == 0)
                break;
        if (j < m) {
            free(out[j]);
            out[j] = kv;
        } else {
            out[m++] = kv;
        }
    }
    return out;
}

static void s_strv_free(char **v)
{
    if (!v)
        return;
    for (size_t i = 0; v[i]; i++)
        free(v[i]);
    free(v);
}

static char **s_argv_copy(const msgpack_object *a)
{
    if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size == 0)
        return NULL;
    char **v = calloc(a->via.array.size + 1, sizeof(char *));
    if (!v)
        return NULL;
    for (uint32_t i = 0; i < a->via.array.size; i++) {
        const msgpack_object *s = &a->via.array.ptr[i];
        if (s->type != MSGPACK_OBJECT_STR || memchr(s->via.str.ptr, 0, s->via.str.size)) {
            s_strv_free(v);
            return NULL;
        }
        v[i] = strndup(s->via.str.ptr, s->via.str.size);
    }
    return v;
}

/* In the forked child: set up fds, identity and cwd, then exec. Reports errno on errfd.
 * tty_fd >= 0: a terminal's slave, which becomes fds 0-2 and the controlling terminal of a new
 * session (whose id is the process group's). */
static void s_child(char **argv, char **envp, const char *cwd, int in_fd, int out_fd, int err_fd,
                    int tty_fd, int errfd)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    if (tty_fd < 0)
        setpgid(0, 0);
    if (G.drop) { /* back to root's file identity until the real switch below */
        setfsuid(0);
        setfsgid(0);
    }
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) { /* the guest is protected from the OOM killer; its children are not */
        (void)!write(fd, "0", 1);
        close(fd);
    }
    if (tty_fd >= 0 ? ka_gt_child(tty_fd) < 0
                    : dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
        goto fail;
    if (G.drop) {
        if (setgroups(0, NULL) < 0 && errno != EPERM)
            goto fail;
        if (setresgid(G.uid, G.uid, G.uid) < 0 || setresuid(G.uid, G.uid, G.uid) < 0)
            goto fail;
    }
    if (chdir(cwd) < 0)
        goto fail;
    environ = envp;
    execvp(argv[0], argv);
fail:;
    int e = errno;
    (void)!write(errfd, &e, sizeof(e));
    _exit(127);
}

/* A spool file in the log dir; on a full disk (no blocks or no inodes left on the sandbox's
 * volume) an anonymous one in memory, so the sandbox can still run the `rm` that frees it. */
static int s_spool_open(s_proc_t *p, int k)
{
    char path[512];
    s_spool_path(p->id, k, path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0 && (errno == ENOSPC || errno == EDQUOT)) {
        fd = memfd_create(path, MFD_CLOEXEC);
        p->spool_mem[k] = fd >= 0;
    }
    return fd;
}

static void s_proc_free(s_proc_t *p)
{
    for (int k = 0; k < 2; k++) {
        if (p->pipe_fd[k] >= 0)
            close(p->pipe_fd[k]);
        if (p->spool_fd[k] >= 0)
            close(p->spool_fd[k]);
    }
    s_stdin_close(p);
    s_strv_free(p->argv);
    free(p);
}

/* A process start under way: the request's settings and the descriptors made for the child
 * ([0] the read end, [1] the write end; -1 when not made or already handed over). */
typedef struct {
    char *cwd;
    char **envp;
    bool want_in, tty;
    uint64_t tmo, rows, cols;
    int out[2], err[2], in[2];
    int ep[2];       /* the child's exec failure (its errno), closed on a successful exec */
    const char *why; /* the failure's message */
} s_start_t;

/* The request's argv (into p), cwd (relative: to the workspace), env, stdin, tty and timeout.
 * 0 or a negative errno (st->why set). */
static int s_start_parse(s_start_t *st, s_proc_t *p, const msgpack_object *req)
{
    p->argv = s_argv_copy(ka_gp_get(req, "argv"));
    if (!p->argv) {
        st->why = "argv must be a non-empty array of strings";
        return -EINVAL;
    }
    const char *c;
    size_t cn;
    if (ka_gp_get_bytes(req, "cwd", &c, &cn) && cn > 0) {
        if (c[0] == '/')
            st->cwd = strndup(c, cn);
        else if (asprintf(&st->cwd, "%s/%.*s", G.workspace, (int)cn, c) < 0)
            st->cwd = NULL;
    } else {
        st->cwd = strdup(G.workspace);
    }
    st->envp = s_build_env(ka_gp_get(req, "env"));
    ka_gp_get_bool(req, "stdin", &st->want_in);
    ka_gp_get_u64(req, "timeout_ms", &st->tmo);
    if (st->tmo == 0)
        st->tmo = G.timeout_ms;
    ka_gp_get_bool(req, "tty", &st->tty);
    ka_gp_get_u64(req, "rows", &st->rows);
    ka_gp_get_u64(req, "cols", &st->cols);
    st->why = "out of memory";
    return st->cwd && st->envp ? 0 : -ENOMEM;
}

/* The child's stdio: a terminal (its master is our output and input), or pipes (stdin: a
 * pipe when wanted, else /dev/null); then the spool files. 0 or a negative errno. */
static int s_start_fds(s_start_t *st, s_proc_t *p)
{
    st->why = "cannot create pipes or spool files";
    if (pipe2(st->ep, O_CLOEXEC) < 0)
        return -errno;
    if (st->tty) {
        st->why = "cannot open a pseudo terminal";
        uint32_t rows = (uint32_t)(st->rows > UINT32_MAX ? UINT32_MAX : st->rows);
        uint32_t cols = (uint32_t)(st->cols > UINT32_MAX ? UINT32_MAX : st->cols);
        int rc = ka_gt_open(rows, cols, &st->out[0], &st->out[1]);
        if (rc < 0)
            return rc;
        st->in[1] = fcntl(st->out[0], F_DUPFD_CLOEXEC, 0);
        if (st->in[1] < 0)
            return -errno;
        st->why = "cannot create spool files";
        st->want_in = true;
    } else {
        if (pipe2(st->out, O_CLOEXEC) < 0 || pipe2(st->err, O_CLOEXEC) < 0)
            return -errno;
        if (st->want_in && pipe2(st->in, O_CLOEXEC) < 0)
            return -errno;
        if (!st->want_in && (st->in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
            return -errno;
    }
    p->spool_fd[0] = s_spool_open(p, 0);
    p->spool_fd[1] = s_spool_open(p, 1);
    return p->spool_fd[0] < 0 || p->spool_fd[1] < 0 ? -errno : 0;
}

/* Forks the child and waits for its exec: 0 once it runs (p->pid set), or a negative errno. */
static int s_start_exec(s_start_t *st, s_proc_t *p)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        s_child(p->argv, st->envp, st->cwd, st->in[0], st->out[1], st->err[1],
                st->tty ? st->out[1] : -1, st->ep[1]);
    close(st->ep[1]);
    st->ep[1] = -1;
    int e = 0;
    ssize_t n;
    do
        n = read(st->ep[0], &e, sizeof(e));
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(e)) { /* exec failed: the child exits 127 */
        waitpid(pid, NULL, 0);
        st->why = e == ENOENT ? "no such program" : "cannot start the program";
        return -e;
    }
    p->pid = pid;
    return 0;
}

/* The running process keeps our ends (non-blocking); the child's ends are closed. */
static void s_start_adopt(s_start_t *st, s_proc_t *p)
{
    p->state = KA_GP_STATE_RUNNING;
    p->started_ms = s_wall_ms();
    p->deadline = s_mono_ms() + st->tmo;
    p->tty = st->tty;
    int ours[] = {st->out[0], st->err[0], st->want_in ? st->in[1] : -1};
    p->pipe_fd[0] = ours[0];
    p->pipe_fd[1] = ours[1];
    p->in_fd = ours[2];
    for (size_t i = 0; i < 3; i++)
        if (ours[i] >= 0)
            fcntl(ours[i], F_SETFL, O_NONBLOCK);
    st->out[0] = st->err[0] = -1;
    if (st->want_in)
        st->in[1] = -1;
}

/* Closes every descriptor st still holds, and frees its cwd and env. */
static void s_start_done(s_start_t *st)
{
    int *fds[] = {st->out, st->err, st->in, st->ep};
    for (size_t i = 0; i < 4; i++)
        for (int k = 0; k < 2; k++)
            if (fds[i][k] >= 0)
                close(fds[i][k]);
    s_strv_free(st->envp);
    free(st->cwd);
}

/* Replies with the process, or (follow: start and output in one request) the process frame
 * and then its output stream. */
static void s_start_reply(uint64_t id, const msgpack_object *req, s_proc_t *p)
{
    bool follow = false;
    ka_gp_get_bool(req, "follow", &follow);
    s_stream_t *s = follow ? s_stream_new(id, req) : NULL;
    if (!s) {
        s_reply_process(id, p);
        return;
    }
    size_t off = s_begin(id, 1);
    s_key("process");
    s_pack_process(p);
    s_end(off);
    s->p = p;
    s->follow = true;
    s_stream_add(s);
}

static void s_op_start(uint64_t id, const msgpack_object *req)
{
    if (G.running >= G.max_procs) {
        s_reply_err(id, -EAGAIN, "too many running processes");
        return;
    }
    s_start_t st = {
        .out = {-1, -1}, .err = {-1, -1}, .in = {-1, -1}, .ep = {-1, -1}, .why = "out of memory"};
    s_proc_t *p = calloc(1, sizeof(*p));
    int rc = -ENOMEM;
    if (p) {
        p->pipe_fd[0] = p->pipe_fd[1] = p->spool_fd[0] = p->spool_fd[1] = p->in_fd = -1;
        rc = s_start_parse(&st, p, req);
    }
    if (rc == 0) {
        p->id = ++G.next_id;
        rc = s_start_fds(&st, p);
    }
    if (rc == 0)
        rc = s_start_exec(&st, p);
    if (rc == 0)
        s_start_adopt(&st, p);
    s_start_done(&st);
    if (rc < 0) {
        if (p)
            s_proc_free(p);
        s_reply_err(id, rc, st.why);
        return;
    }
    p->next = G.procs;
    G.procs = p;
    G.running++;
    s_start_reply(id, req, p);
}

static void s_op_get(uint64_t id, const msgpack_object *req)
{
    s_proc_t *p = s_find(req);
    if (!p)
        s_reply_err(id, -ENOENT, "no such process");
    else
        s_reply_process(id, p);
}

static void s_op_signal(uint64_t id, const msgpack_object *req)
{
    s_proc_t *p = s_find(req);
    int64_t sig = 0;
    if (!p) {
        s_reply_err(id, -ENOENT, "no such process");
        return;
    }
    if (!ka_gp_get_i64(req, "signal", &sig) || sig < 1 || sig > 64) {
        s_reply_err(id, -EINVAL, "bad signal");
        return;
    }
    if (p->state == KA_GP_STATE_RUNNING)
        kill(-p->pid, (int)sig);
    s_reply_process(id, p);
}

static void s_op_input(uint64_t id, const msgpack_object *req)
{
    s_proc_t *p = s_find(req);
    const char *d = NULL;
    size_t n = 0;
    bool cl = false;
    if (!p) {
        s_reply_err(id, -ENOENT, "no such process");
        return;
    }
    if (p->in_fd < 0 || p->in_close) {
        s_reply_err(id, -EPIPE, "stdin is not open");
        return;
    }
    if (p->in_req) {
        s_reply_err(id, -EBUSY, "the process has not taken the previous input yet");
        return;
    }
    ka_gp_get_bytes(req, "data", &d, &n);
    ka_gp_get_bool(req, "close", &cl);
    /* a terminal's end of input is its EOF character; a pipe closes */
    size_t add = n + (p->tty && cl);
    if (add > 0) {
        char *nb = realloc(p->in_pend, p->in_len + add);
        if (!nb) {
            s_reply_err(id, -ENOMEM, "out of memory");
            return;
        }
        memcpy(nb + p->in_len, d, n);
        if (p->tty && cl)
            nb[p->in_len + n] = ka_gt_eof_char(p->in_fd);
        p->in_pend = nb;
        p->in_len += add;
    }
    p->in_close = cl && !p->tty;
    p->in_req = id;
    p->in_ack = n;
    s_stdin_flush(p); /* answers now if the process took it all, else once it has */
}

/* Sets a terminal's window size (tty processes only). */
static void s_op_resize(uint64_t id, const msgpack_object *req)
{
    s_proc_t *p = s_find(req);
    uint64_t rows = 0, cols = 0;
    if (!p) {
        s_reply_err(id, -ENOENT, "no such process");
        return;
    }
    if (!p->tty) {
        s_reply_err(id, -ENOTTY, "the process has no terminal");
        return;
    }
    if (!ka_gp_get_u64(req, "rows", &rows) || !ka_gp_get_u64(req, "cols", &cols) || rows == 0 ||
        cols == 0 || rows > 0xffff || cols > 0xffff) {
        s_reply_err(id, -EINVAL, "rows and cols must be 1-65535");
        return;
    }
    int fd = p->in_fd >= 0 ? p->in_fd : p->pipe_fd[0];
    if (p->state == KA_GP_STATE_RUNNING && fd >= 0)
        ka_gt_resize(fd, (uint32_t)rows, (uint32_t)cols);
    s_reply_process(id, p);
}

static void s_op_output(uint64_t id, const msgpack_object *req)
{
    s_proc_t *p = s_find(req);
    if (!p) {
        s_reply_err(id, -ENOENT, "no such process");
        return;
    }
    s_stream_t *s = s_stream_new(id, req);
    if (!s) {
        s_reply_err(id, -ENOMEM, "out of memory");
        return;
    }
    s->p = p;
    ka_gp_get_u64(req, "stdout_offset", &s->off[0]);
    ka_gp_get_u64(req, "stderr_offset", &s->off[1]);
    ka_gp_get_bool(req, "follow", &s->follow);
    if (s_stream_pump(s)) {
        s_stream_free(s);
        return;
    }
    s_stream_add(s);
}

static void s_op_cancel(uint64_t id, const msgpack_object *req)
{
    uint64_t target = 0;
    ka_gp_get_u64(req, "target", &target);
    for (s_stream_t **pp = &G.streams; *pp; pp = &(*pp)->next) {
        if ((*pp)->req == target) {
            s_stream_t *s = *pp;
            *pp = s->next;
            s_reply_end(s->req);
            s_stream_free(s);
            break;
        }
    }
    s_reply_end(id);
}

/* Credit returned by the node for one stream (no reply). */
static void s_op_credit(uint64_t id, const msgpack_object *req)
{
    uint64_t target = 0, bytes = 0;
    (void)id;
    ka_gp_get_u64(req, "target", &target);
    ka_gp_get_u64(req, "bytes", &bytes);
    for (s_stream_t *s = G.streams; s; s = s->next)
        if (s->req == target && s->credit != UINT64_MAX)
            s->credit = UINT64_MAX - s->credit > bytes ? s->credit + bytes : UINT64_MAX - 1;
}

static void s_op_read(uint64_t id, const msgpack_object *req)
{
    const char *path;
    size_t pn;
    uint64_t mode = 0;
    if (!ka_gp_get_bytes(req, "path", &path, &pn)) {
        s_reply_err(id, -EINVAL, "path is required");
        return;
    }
    ka_gp_get_u64(req, "mode", &mode);
    int fd = -1;
    size_t size = 0;
    int rc = ka_gf_open_read(G.ws_fd, path, pn, (unsigned)mode, KA_GP_FILE_CAP, &fd, &size);
    s_stream_t *s = rc < 0 ? NULL : s_stream_new(id, req);
    if (!s) {
        if (fd >= 0)
            close(fd);
        rc = rc < 0 ? rc : -ENOMEM;
        s_reply_err(id, rc, rc == -ENOMEM ? "out of memory" : ka_gf_strerror(rc));
        return;
    }
    s->fd = fd;
    s->rsize = size;
    if (s_stream_pump(s))
        s_stream_free(s);
    else
        s_stream_add(s);
}

static void s_op_write(uint64_t id, const msgpack_object *req)
{
    const char *path, *data = "";
    size_t pn, dn = 0;
    uint64_t mode = 0, seek = 0;
    if (!ka_gp_get_bytes(req, "path", &path, &pn)) {
        s_reply_err(id, -EINVAL, "path is required");
        return;
    }
    ka_gp_get_bytes(req, "data", &data, &dn);
    ka_gp_get_u64(req, "mode", &mode);
    ka_gp_get_u64(req, "seek_offset", &seek);
    if (dn > KA_GP_FILE_CAP) {
        s_reply_err(id, -EFBIG, ka_gf_strerror(-EFBIG));
        return;
    }
    int rc = ka_gf_write(G.ws_fd, path, pn, (unsigned)mode, seek, data, dn);
    if (rc < 0) {
        s_reply_err(id, rc, ka_gf_strerror(rc));
        return;
    }
    size_t off = s_begin(id, 2);
    s_key("written");
    msgpack_pack_uint64(&G.pk, dn);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
}

/* --- directory and metadata ops (guest_fsops.h), watches (guest_watch.h) ------------------- */

static void s_path_of(const msgpack_object *req, const char *key, const char **p, size_t *n)
{
    if (!ka_gp_get_bytes(req, key, p, n)) {
        *p = "";
        *n = 0;
    }
}

static void s_op_list(uint64_t id, const msgpack_object *req)
{
    const char *path, *after;
    size_t pn, an;
    uint64_t limit = 0;
    s_path_of(req, "path", &path, &pn);
    s_path_of(req, "after", &after, &an);
    ka_gp_get_u64(req, "limit", &limit);
    ka_gfs_list_t l;
    int rc = ka_gfs_list(G.ws_fd, path, pn, after, an, (size_t)limit, &l);
    if (rc < 0) {
        s_reply_err(id, rc, ka_gfs_strerror(rc));
        return;
    }
    size_t off = s_begin(id, 3);
    s_key("entries");
    msgpack_pack_array(&G.pk, l.n);
    for (size_t i = 0; i < l.n; i++)
        ka_gfs_pack_entry(&G.pk, &l.entries[i]);
    s_key("more");
    if (l.more)
        msgpack_pack_true(&G.pk);
    else
        msgpack_pack_false(&G.pk);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
    ka_gfs_list_free(&l);
}

static void s_op_stat(uint64_t id, const msgpack_object *req)
{
    const char *path;
    size_t pn;
    s_path_of(req, "path", &path, &pn);
    ka_gfs_entry_t e;
    int rc = ka_gfs_stat(G.ws_fd, path, pn, &e);
    if (rc < 0) {
        s_reply_err(id, rc, ka_gfs_strerror(rc));
        return;
    }
    size_t off = s_begin(id, 2);
    s_key("entry");
    ka_gfs_pack_entry(&G.pk, &e);
    s_key("end");
    msgpack_pack_true(&G.pk);
    s_end(off);
}

/* remove, mkdir, move: one {"end"} or an error. */
static void s_op_change(uint64_t id, const msgpack_object *req)
{
    const char *op, *path, *to;
    size_t on, pn, tn;
    bool flag = false;
    uint64_t mode = 0;
    ka_gp_get_bytes(req, "op", &op, &on);
    s_path_of(req, "path", &path, &pn);
    s_path_of(req, "to", &to, &tn);
    ka_gp_get_u64(req, "mode", &mode);
    int rc;
    if (on == 6 && memcmp(op, "remove", 6) == 0) {
        ka_gp_get_bool(req, "recursive", &flag);
        rc = ka_gfs_remove(G.ws_fd, path, pn, flag);
    } else if (on == 5 && memcmp(op, "mkdir", 5) == 0) {
        ka_gp_get_bool(req, "parents", &flag);
        rc = ka_gfs_mkdir(G.ws_fd, path, pn, flag, (unsigned)mode);
    } else {
        ka_gp_get_bool(req, "overwrite", &flag);
        rc = ka_gfs_move(G.ws_fd, path, pn, to, tn, flag);
    }
    if (rc < 0)
        s_reply_err(id, rc, ka_gfs_strerror(rc));
    else
        s_reply_end(id);
}

static void s_op_watch(uint64_t id, const msgpack_object *req)
{
    const char *path;
    size_t pn;
    s_path_of(req, "path", &path, &pn);
    if (G.watches >= KA_GP_MAX_WATCHES) {
        s_reply_err(id, -EMFILE, "too many watches in this sandbox");
        return;
    }
    int rc = -ENOMEM;
    s_stream_t *s = s_stream_new(id, req);
    if (s && (s->w = ka_gw_new(G.ws_fd, path, pn, &rc)) != NULL) {
        G.watches++;
        s_stream_add(s);
        return;
    }
    free(s);
    s_reply_err(id, rc, ka_gfs_strerror(rc));
}

/* A watch's inotify fd is readable: take its events, send what credit allows. */
static void s_watch_ready(int fd)
{
    for (s_stream_t *s = G.streams; s; s = s->next)
        if (s->w && ka_gw_fd(s->w) == fd)
            ka_gw_read(s->w);
}

static void s_dispatch(const uint8_t *body, size_t len)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    if (msgpack_unpack_next(&up, (const char *)body, len, &off) != MSGPACK_UNPACK_SUCCESS ||
        up.data.type != MSGPACK_OBJECT_MAP) {
        s_log("warn", "bad_frame", "len=%zu", len);
        msgpack_unpacked_destroy(&up);
        return;
    }
    const msgpack_object *req = &up.data;
    uint64_t id = 0;
    const char *op;
    size_t on;
    ka_gp_get_u64(req, "id", &id);
    if (!ka_gp_get_bytes(req, "op", &op, &on)) {
        s_reply_err(id, -EINVAL, "op is required");
    } else {
        static const struct {
            const char *name;
            void (*fn)(uint64_t, const msgpack_object *);
        } ops[] = {{"start", s_op_start},   {"get", s_op_get},       {"signal", s_op_signal},
                   {"input", s_op_input},   {"output", s_op_output}, {"read", s_op_read},
                   {"write", s_op_write},   {"cancel", s_op_cancel}, {"credit", s_op_credit},
                   {"resize", s_op_resize}, {"list", s_op_list},     {"stat", s_op_stat},
                   {"remove", s_op_change}, {"mkdir", s_op_change},  {"move", s_op_change},
                   {"watch", s_op_watch}};
        bool found = false;
        if (on == 4 && memcmp(op, "ping", 4) == 0) {
            s_reply_end(id);
            found = true;
        }
        for (size_t i = 0; !found && i < sizeof(ops) / sizeof(ops[0]); i++) {
            if (strlen(ops[i].name) == on && memcmp(ops[i].name, op, on) == 0) {
                ops[i].fn(id, req);
                found = true;
            }
        }
        if (!found)
            s_reply_err(id, -EOPNOTSUPP, "unknown op");
    }
    msgpack_unpacked_destroy(&up);
}

/* --- channel -------------------------------------------------------------------------------- */

/* Sizes the input buffer for what is being received: S_IN_BASE, or the whole of the first
 * (partial) frame plus 64 KiB to read ahead. -1 when memory runs out. */
static int s_in_reserve(void)
{
    size_t need = S_IN_BASE;
    if (G.in_len >= 4) {
        const uint8_t *b = G.in;
        size_t n = ((size_t)b[0] << 24) | ((size_t)b[1] << 16) | ((size_t)b[2] << 8) | b[3];
        if (n > KA_GP_MAX_FRAME)
            return 0; /* ka_gp_frame_next refuses it */
        if (4 + n + 65536 > need)
            need = 4 + n + 65536;
    }
    if (G.in_cap >= need && G.in_cap - G.in_len >= 65536)
        return 0;
    if (G.in_len + 65536 > need)
        need = G.in_len + 65536;
    uint8_t *n = realloc(G.in, need);
    if (!n)
        return -1;
    G.in = n;
    G.in_cap = need;
    return 0;
}

/* After S_TRIM_MS without traffic: the buffers a big transfer grew are given back. */
static bool s_oversized(void)
{
    return G.in_cap > S_IN_BASE || G.out.alloc > S_OUT_BASE;
}

static void s_trim(void)
{
    if (s_queued() == 0 && G.out.alloc > S_OUT_BASE) {
        msgpack_sbuffer_destroy(&G.out);
        msgpack_sbuffer_init(&G.out);
        G.out_off = 0;
    }
    if (G.in_cap > S_IN_BASE && G.in_len <= S_IN_BASE) {
        uint8_t *n = realloc(G.in, S_IN_BASE);
        if (n) {
            G.in = n;
            G.in_cap = S_IN_BASE;
        }
    }
}

/* Reads from the channel and dispatches complete frames. -1 when the node is gone. */
static int s_channel_read(void)
{
    if (s_in_reserve() < 0)
        return -1;
    ssize_t n = read(G.ch, G.in + G.in_len, G.in_cap - G.in_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (n <= 0)
        return -1;
    G.in_len += (size_t)n;
    size_t pos = 0;
    for (;;) {
        const uint8_t *body;
        size_t blen;
        long used = ka_gp_frame_next(G.in + pos, G.in_len - pos, KA_GP_MAX_FRAME, &body, &blen);
        if (used < 0)
            return -1;
        if (used == 0)
            break;
        s_dispatch(body, blen);
        pos += (size_t)used;
    }
    memmove(G.in, G.in + pos, G.in_len - pos);
    G.in_len -= pos;
    return 0;
}

static int s_channel_flush(void)
{
    while (G.out_off < G.out.size) {
        ssize_t n = write(G.ch, G.out.data + G.out_off, G.out.size - G.out_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n < 0)
            return -1;
        G.out_off += (size_t)n;
    }
    if (G.out_off == G.out.size) {
        G.out.size = 0;
        G.out_off = 0;
    } else if (G.out_off >= S_OUTBUF_HIGH) { /* a queue that never drains stays bounded */
        memmove(G.out.data, G.out.data + G.out_off, G.out.size - G.out_off);
        G.out.size -= G.out_off;
        G.out_off = 0;
    }
    return 0;
}

/* --- main loop ------------------------------------------------------------------------------ */

static void s_shutdown(int code)
{
    s_signal_all(SIGTERM);
    uint64_t until = s_mono_ms() + 2000;
    while (G.running > 0 && s_mono_ms() < until) {
        usleep(10000);
        s_reap();
    }
    s_signal_all(SIGKILL);
    s_log("info", "guest_stop", "code=%d", code);
    exit(code);
}

/* As PID 1, only kill(2)/tgkill(2) from outside the sandbox count (the kernel fills their
 * sender: pid 0 is a sender outside our PID namespace). Processes in the sandbox cannot stop
 * the guest: their own kills carry their pid, a signal the kernel raises for a descriptor
 * (F_SETOWN + F_SETSIG, SIGIO, SI_KERNEL) carries pid 0 but another code, and sigqueue's
 * sender fields are the caller's to forge (SI_QUEUE). */
static bool s_from_node(const struct signalfd_siginfo *si)
{
    int code = si->ssi_code;
    return si->ssi_pid == 0 && (code == SI_USER || code == SI_TKILL);
}

static void s_on_signal(void)
{
    struct signalfd_siginfo si;
    while (read(G.sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD)
            continue;
        if (G.pid1 && !s_from_node(&si))
            continue;
        if (sig == SIGTERM || sig == SIGINT)
            s_shutdown(0);
        s_signal_all(sig);
    }
    s_reap();
}

static int s_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (fd < 0 || strlen(path) >= sizeof(a.sun_path))
        return -1;
    strcpy(a.sun_path, path);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void s_usage(void)
{
    fprintf(stderr, "usage: kagent-sandbox-guest [--fd N | --socket PATH] [--workspace DIR]\n"
                    "  [--log-dir DIR] [--max-procs N] [--timeout-ms N] [--spool-cap BYTES]\n"
                    "  [--uid N]\n");
}

static int s_parse(int argc, char **argv)
{
    static const struct option opts[] = {
        {"fd", required_argument, 0, 'f'},        {"socket", required_argument, 0, 's'},
        {"workspace", required_argument, 0, 'w'}, {"log-dir", required_argument, 0, 'l'},
        {"max-procs", required_argument, 0, 'm'}, {"timeout-ms", required_argument, 0, 't'},
        {"spool-cap", required_argument, 0, 'c'}, {"uid", required_argument, 0, 'u'},
        {"version", no_argument, 0, 'v'},         {0, 0, 0, 0}};
    G.ch = KA_GP_CHANNEL_FD;
    G.workspace = KA_GP_WORKSPACE;
    G.logdir = KA_GP_LOG_DIR;
    G.max_procs = KA_GP_MAX_PROCS;
    G.timeout_ms = KA_GP_TIMEOUT_MS;
    G.spool_cap = KA_GP_SPOOL_CAP;
    G.uid = KA_GP_UID;
    const char *sock = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            G.ch = atoi(optarg);
            break;
        case 's':
            sock = optarg;
            break;
        case 'w':
            G.workspace = optarg;
            break;
        case 'l':
            G.logdir = optarg;
            break;
        case 'm':
            G.max_procs = atoi(optarg);
            break;
        case 't':
            G.timeout_ms = strtoull(optarg, NULL, 10);
            break;
        case 'c':
            G.spool_cap = strtoull(optarg, NULL, 10);
            break;
        case 'u':
            G.uid = (uid_t)strtoul(optarg, NULL, 10);
            break;
        case 'v':
            printf("kagent-sandbox-guest protocol %d\n", KA_GP_VERSION);
            exit(0);
        default:
            s_usage();
            return -1;
        }
    }
    if (sock && (G.ch = s_connect(sock)) < 0) {
        s_log("error", "connect_failed", "socket=%s errno=%d", sock, errno);
        return -1;
    }
    return 0;
}

static int s_setup(void)
{
    G.pid1 = getpid() == 1;
    G.drop = geteuid() == 0;
    prctl(PR_SET_DUMPABLE, 0); /* processes of the same uid cannot ptrace the guest */
    if (!G.pid1)
        prctl(PR_SET_CHILD_SUBREAPER, 1);
    signal(SIGPIPE, SIG_IGN);
    if (!getenv("PATH"))
        setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    setenv("HOME", G.workspace, 1); /* the user's home is the workspace */
    mkdir(G.workspace, 0755);
    mkdir(G.logdir, 0750);
    if (G.drop) {
        /* file operations and spools act as the user, like the processes do */
        if (chown(G.logdir, G.uid, G.uid) < 0)
            s_log("warn", "chown_log_dir", "errno=%d", errno);
        setfsgid(G.uid);
        setfsuid(G.uid);
    }
    G.ws_fd = open(G.workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (G.ws_fd < 0) {
        s_log("error", "workspace", "path=%s errno=%d", G.workspace, errno);
        return -1;
    }
    sigset_t set;
    sigemptyset(&set);
    int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&set, sigs[i]);
    sigprocmask(SIG_BLOCK, &set, NULL);
    G.sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (G.sfd < 0)
        return -1;
    fcntl(G.ch, F_SETFD, FD_CLOEXEC);
    fcntl(G.ch, F_SETFL, fcntl(G.ch, F_GETFL) | O_NONBLOCK);
    msgpack_sbuffer_init(&G.out);
    msgpack_packer_init(&G.pk, &G.out, msgpack_sbuffer_write);
    /* A fixed threshold (glibc's moves up to what was last freed): the channel buffers are
     * mapped and unmapped on their own, so what s_trim frees leaves the process. */
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
    return 0;
}

static void s_ready(void)
{
    size_t off = s_begin(0, 3);
    s_key("ev");
    ka_gp_pack_cstr(&G.pk, "ready");
    s_key("version");
    msgpack_pack_uint32(&G.pk, KA_GP_VERSION);
    s_key("pid");
    msgpack_pack_int64(&G.pk, getpid());
    s_end(off);
}

static int s_poll_timeout(void)
{
    uint64_t now = s_mono_ms(), next = 0;
    for (s_proc_t *p = G.procs; p; p = p->next) {
        if (p->state != KA_GP_STATE_RUNNING || !p->deadline)
            continue;
        if (p->deadline <= now) { /* timeout: the whole process group goes */
            kill(-p->pid, SIGKILL);
            p->deadline = 0;
            continue;
        }
        if (!next || p->deadline < next)
            next = p->deadline;
    }
    for (s_stream_t *s = G.streams; s; s = s->next) {
        uint64_t due = s->last_ms + KA_GP_KEEPALIVE_MS;
        if (!next || due < next)
            next = due;
    }
    if (s_oversized() && (!next || now + S_TRIM_MS < next))
        next = now + S_TRIM_MS; /* a quiet S_TRIM_MS then trims (see main) */
    if (!next)
        return -1;
    return next > now ? (int)(next - now) : 0;
}

int main(int argc, char **argv)
{
    if (s_parse(argc, argv) < 0 || s_setup() < 0)
        return 2;
    s_ready();
    s_log("info", "guest_ready", "pid=%d pid1=%d workspace=%s", getpid(), G.pid1, G.workspace);
    struct pollfd *pfd = NULL;
    s_proc_t **owner = NULL;
    int *kind = NULL;
    size_t cap = 0;
    for (;;) {
        size_t need = 2 + (size_t)G.max_procs * 3 + 16;
        for (s_proc_t *p = G.procs; p; p = p->next)
            need += 3;
        need += (size_t)G.watches;
        if (need > cap) {
            cap = need * 2;
            pfd = realloc(pfd, cap * sizeof(*pfd));
            owner = realloc(owner, cap * sizeof(*owner));
            kind = realloc(kind, cap * sizeof(*kind));
            if (!pfd || !owner || !kind)
                return 3;
        }
        size_t n = 0;
        pfd[n] = (struct pollfd){.fd = G.ch, .events = POLLIN};
        if (s_queued() > 0)
            pfd[n].events |= POLLOUT;
        n++;
        pfd[n++] = (struct pollfd){.fd = G.sfd, .events = POLLIN};
        for (s_proc_t *p = G.procs; p; p = p->next) {
            for (int k = 0; k < 2; k++) {
                if (p->pipe_fd[k] >= 0) {
                    owner[n] = p;
                    kind[n] = k;
                    pfd[n++] = (struct pollfd){.fd = p->pipe_fd[k], .events = POLLIN};
                }
            }
            if (p->in_fd >= 0 && p->in_len > 0) {
                owner[n] = p;
                kind[n] = 2;
                pfd[n++] = (struct pollfd){.fd = p->in_fd, .events = POLLOUT};
            }
        }
        for (s_stream_t *s = G.streams; s; s = s->next) {
            if (s->w) {
                owner[n] = NULL;
                kind[n] = 3;
                pfd[n++] = (struct pollfd){.fd = ka_gw_fd(s->w), .events = POLLIN};
            }
        }
        int rc = poll(pfd, n, s_poll_timeout());
        if (rc < 0 && errno != EINTR)
            return 4;
        s_keepalive();
        if (rc <= 0) {
            if (s_channel_flush() < 0)
                s_shutdown(0);
            if (rc == 0)
                s_trim();
            continue;
        }
        if (pfd[1].revents)
            s_on_signal();
        for (size_t i = 2; i < n; i++) {
            if (!pfd[i].revents)
                continue;
            s_proc_t *p = owner[i];
            if (kind[i] == 3)
                s_watch_ready(pfd[i].fd);
            else if (kind[i] == 2)
                s_stdin_flush(p);
            else if (p->pipe_fd[kind[i]] == pfd[i].fd)
                s_pipe_read(p, kind[i]);
        }
        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (s_channel_read() < 0) {
                s_log("info", "node_gone", "stopping");
                s_shutdown(0);
            }
        }
        s_pump_all();
        if (s_channel_flush() < 0)
            s_shutdown(0);
        if (s_queued() < S_OUTBUF_HIGH / 2)
            s_pump_all();
    }
}
