/* guest_watch: an inotify watch of a directory tree with a bounded event queue. */
#include "guest_watch.h"
#include "guest_fsops.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define S_MOVE_PAIR_MS 50 /* how long a MOVED_FROM last in the queue waits for its MOVED_TO */
#define S_MASK                                                                                     \
    (IN_CREATE | IN_DELETE | IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF |            \
     IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

typedef struct {
    int wd;
    char *rel; /* relative to the watched directory ("" for it) */
} s_dir_t;

typedef struct {
    uint8_t *p;
    size_t n;
} s_ev_t;

struct ka_gw {
    int ws;
    int ifd;
    char *root; /* the watched directory as given (workspace-relative or absolute) */
    s_dir_t *dirs;
    size_t ndirs;
    s_ev_t q[KA_GW_QUEUE];
    size_t head, count;
    bool last_overflow; /* the newest queued event is an OVERFLOW */
    /* a MOVED_FROM waiting for its MOVED_TO */
    uint32_t cookie;
    char *from;
    bool from_dir;
};

/* ---- the queue ------------------------------------------------------------------------------ */

static void s_push_raw(ka_gw_t *w, uint8_t kind, const char *path, const char *from)
{
    size_t pn = strlen(path), fn = from ? strlen(from) : 0;
    uint8_t *p = malloc(pn + fn + 3);
    if (!p)
        return;
    p[0] = kind;
    memcpy(p + 1, path, pn + 1);
    if (fn)
        memcpy(p + 2 + pn, from, fn);
    p[2 + pn + fn] = 0;
    w->q[(w->head + w->count) % KA_GW_QUEUE] = (s_ev_t){p, pn + fn + 3};
    w->count++;
    w->last_overflow = (kind & ~KA_GP_EV_ISDIR) == KA_GP_EV_OVERFLOW;
}

static void s_overflow(ka_gw_t *w)
{
    if (!w->last_overflow && w->count < KA_GW_QUEUE)
        s_push_raw(w, KA_GP_EV_OVERFLOW, "", NULL);
}

/* Queues an event; the last slot is kept for an OVERFLOW. */
static void s_push(ka_gw_t *w, int kind, bool dir, const char *path, const char *from)
{
    if (strlen(path) > KA_GW_PATH || (from && strlen(from) > KA_GW_PATH))
        return;
    if (w->count >= KA_GW_QUEUE - 1 || w->last_overflow) {
        s_overflow(w);
        return;
    }
    s_push_raw(w, (uint8_t)(kind | (dir ? KA_GP_EV_ISDIR : 0)), path, from);
}

const uint8_t *ka_gw_peek(const ka_gw_t *w, size_t *len)
{
    if (!w->count)
        return NULL;
    *len = w->q[w->head].n;
    return w->q[w->head].p;
}

void ka_gw_pop(ka_gw_t *w)
{
    if (!w->count)
        return;
    free(w->q[w->head].p);
    w->head = (w->head + 1) % KA_GW_QUEUE;
    if (--w->count == 0)
        w->last_overflow = false;
}

/* ---- the watched directories ---------------------------------------------------------------- */

static char *s_join(const char *a, const char *b)
{
    char *r = NULL;
    if (asprintf(&r, "%s%s%s", a, a[0] && b[0] ? "/" : "", b) < 0)
        return NULL;
    return r;
}

static s_dir_t *s_dir_of(ka_gw_t *w, int wd)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd)
            return &w->dirs[i];
    return NULL;
}

static void s_dir_drop(ka_gw_t *w, size_t i)
{
    free(w->dirs[i].rel);
    w->dirs[i] = w->dirs[--w->ndirs];
}

static bool s_under(const char *rel, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(rel, prefix, n) == 0 && (rel[n] == 0 || rel[n] == '/');
}

/* Forgets the watches of directory rel and everything below it. */
static void s_unwatch_tree(ka_gw_t *w, const char *rel)
{
    for (size_t i = w->ndirs; i-- > 0;) {
        if (!s_under(w->dirs[i].rel, rel))
            continue;
        inotify_rm_watch(w->ifd, w->dirs[i].wd);
        s_dir_drop(w, i);
    }
}

/* Directory from (and below) is now named to. */
static void s_rename_tree(ka_gw_t *w, const char *from, const char *to)
{
    size_t fn = strlen(from);
    for (size_t i = 0; i < w->ndirs; i++) {
        if (!s_under(w->dirs[i].rel, from))
            continue;
        char *r = NULL;
        if (asprintf(&r, "%s%s", to, w->dirs[i].rel + fn) >= 0) {
            free(w->dirs[i].rel);
            w->dirs[i].rel = r;
        }
    }
}

/* Watches directory rel, then its subdirectories; announce: queue a create for each entry
 * found (a directory created after the watch began may have filled before it was watched). */
static int s_add_tree(ka_gw_t *w, const char *rel, bool announce, int depth)
{
    if (w->ndirs >= KA_GW_DIRS || depth > KA_GFS_DEPTH_MAX) {
        s_overflow(w);
        return 0;
    }
    char *full = s_join(w->root, rel);
    if (!full)
        return -ENOMEM;
    int dfd = ka_gfs_open_dir(w->ws, full, strlen(full));
    free(full);
    if (dfd < 0)
        return dfd;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
    int wd = inotify_add_watch(w->ifd, proc, S_MASK & ~IN_DONT_FOLLOW);
    char *copy = strdup(rel);
    s_dir_t *grown = realloc(w->dirs, (w->ndirs + 1) * sizeof *w->dirs);
    if (wd < 0 || !copy || !grown) {
        int rc = wd < 0 ? -errno : -ENOMEM;
        free(copy);
        if (grown)
            w->dirs = grown;
        close(dfd);
        return rc;
    }
    w->dirs = grown;
    s_dir_t *known = s_dir_of(w, wd); /* the same directory again (moved back): one entry */
    if (known) {
        free(known->rel);
        known->rel = copy;
    } else {
        w->dirs[w->ndirs++] = (s_dir_t){wd, copy};
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        bool dir = de->d_type == DT_DIR;
        char *sub = s_join(rel, de->d_name);
        if (!sub)
            break;
        if (announce)
            s_push(w, KA_GP_EV_CREATE, dir, sub, NULL);
        if (dir)
            s_add_tree(w, sub, announce, depth + 1);
        free(sub);
    }
    closedir(d);
    return 0;
}

/* ---- events --------------------------------------------------------------------------------- */

/* A MOVED_FROM without its MOVED_TO left the tree: a delete. */
static void s_flush_from(ka_gw_t *w)
{
    if (!w->from)
        return;
    s_push(w, KA_GP_EV_DELETE, w->from_dir, w->from, NULL);
    if (w->from_dir)
        s_unwatch_tree(w, w->from);
    free(w->from);
    w->from = NULL;
}

static void s_event(ka_gw_t *w, const struct inotify_event *ev)
{
    if (ev->mask & IN_Q_OVERFLOW) {
        s_overflow(w);
        return;
    }
    s_dir_t *d = s_dir_of(w, ev->wd);
    if (!d)
        return;
    if (ev->mask & IN_IGNORED) {
        s_dir_drop(w, (size_t)(d - w->dirs));
        return;
    }
    if (!ev->len)
        return; /* events on the directory itself: its parent reports them */
    bool dir = (ev->mask & IN_ISDIR) != 0;
    char *path = s_join(d->rel, ev->name);
    if (!path)
        return;
    if (!(ev->mask & IN_MOVED_TO) && w->from)
        s_flush_from(w);
    if (ev->mask & IN_CREATE) {
        s_push(w, KA_GP_EV_CREATE, dir, path, NULL);
        if (dir)
            s_add_tree(w, path, true, 1);
    } else if (ev->mask & IN_MODIFY) {
        s_push(w, KA_GP_EV_MODIFY, dir, path, NULL);
    } else if (ev->mask & IN_DELETE) {
        s_push(w, KA_GP_EV_DELETE, dir, path, NULL);
    } else if (ev->mask & IN_MOVED_FROM) {
        w->from = path;
        w->from_dir = dir;
        w->cookie = ev->cookie;
        return;
    } else if (ev->mask & IN_MOVED_TO) {
        if (w->from && w->cookie == ev->cookie) {
            s_push(w, KA_GP_EV_MOVE, dir, path, w->from);
            if (dir)
                s_rename_tree(w, w->from, path);
            free(w->from);
            w->from = NULL;
        } else {
            s_flush_from(w);
            s_push(w, KA_GP_EV_CREATE, dir, path, NULL);
            if (dir)
                s_add_tree(w, path, true, 1);
        }
    }
    free(path);
}

/* Whether fd becomes readable within ms. */
static bool s_readable_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, ms) == 1;
}

void ka_gw_read(ka_gw_t *w)
{
    _Alignas(struct inotify_event) char buf[65536];
    for (;;) {
        ssize_t n = read(w->ifd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        /* A rename queues MOVED_FROM, then MOVED_TO: a read can come between the two. A
         * MOVED_FROM last in the queue waits a moment for its pair before it is a delete. */
        if (n <= 0 && w->from && s_readable_within(w->ifd, S_MOVE_PAIR_MS))
            continue;
        if (n <= 0)
            break;
        for (ssize_t off = 0; off + (ssize_t)sizeof(struct inotify_event) <= n;) {
            const struct inotify_event *ev = (const void *)(buf + off);
            s_event(w, ev);
            off += (ssize_t)(sizeof *ev + ev->len);
        }
    }
    s_flush_from(w);
}

/* ---- lifetime ------------------------------------------------------------------------------- */

ka_gw_t *ka_gw_new(int ws, const char *path, size_t n, int *err)
{
    ka_gw_t *w = calloc(1, sizeof *w);
    if (!w || !(w->root = strndup(path, n))) {
        free(w);
        *err = -ENOMEM;
        return NULL;
    }
    w->ws = ws;
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    *err = w->ifd < 0 ? -errno : s_add_tree(w, "", false, 0);
    if (*err) {
        ka_gw_destroy(&w);
        return NULL;
    }
    return w;
}

void ka_gw_destroy(ka_gw_t **w_p)
{
    if (!w_p || !*w_p)
        return;
    ka_gw_t *w = *w_p;
    if (w->ifd >= 0)
        close(w->ifd);
    while (w->count)
        ka_gw_pop(w);
    for (size_t i = 0; i < w->ndirs; i++)
        free(w->dirs[i].rel);
    free(w->dirs);
    free(w->from);
    free(w->root);
    free(w);
    *w_p = NULL;
}

int ka_gw_fd(const ka_gw_t *w)
{
    return w->ifd;
}
