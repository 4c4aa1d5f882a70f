/*
 * guest_fsops and guest_watch against hostile trees, in a temporary workspace with an
 * "outside" directory beside it holding a canary: symlinks to /, /etc, the outside and "..",
 * symlink loops, absolute paths, a last component that is a link (acted on, never followed),
 * and a thread swapping a directory for a symlink to the outside while list, stat, mkdir,
 * move, recursive remove (and watches) run against it 2,000 times. Nothing outside the
 * workspace may be read, created, moved or removed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "guest_fsops.h"
#include "guest_watch.h"

static char s_root[256], s_ws[300], s_out[300];
static int s_wsfd = -1;

static void s_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

static bool s_exists(const char *fmt, ...)
{
    char p[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    struct stat st;
    return lstat(p, &st) == 0;
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_root, sizeof s_root, "/tmp/kagent-fsops.XXXXXX");
    assert_non_null(mkdtemp(s_root));
    snprintf(s_ws, sizeof s_ws, "%s/ws", s_root);
    snprintf(s_out, sizeof s_out, "%s/outside", s_root);
    s_sh("mkdir -p %s/d/sub %s && echo canary > %s/canary && mkdir %s/secret && "
         "echo s > %s/secret/f",
         s_ws, s_out, s_out, s_out, s_out);
    s_sh("cd %s && echo hi > d/a && ln -s / root && ln -s /etc etc && ln -s %s out && "
         "ln -s .. up && ln -s ../outside rel_out && ln -s l1 l2 && ln -s l2 l1 && "
         "ln -s d/a alink && ln -s sub d/sublink",
         s_ws, s_out);
    s_wsfd = open(s_ws, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(s_wsfd >= 0);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    close(s_wsfd);
    s_sh("rm -rf %s", s_root);
    return 0;
}

static void s_outside_intact(void)
{
    assert_true(s_exists("%s/canary", s_out));
    assert_true(s_exists("%s/secret/f", s_out));
    assert_false(s_exists("%s/x", s_out));
    assert_false(s_exists("%s/new", s_out));
    assert_false(s_exists("%s/moved", s_out));
}

#define P(s) (s), strlen(s)

static void test_basic(void **state)
{
    (void)state;
    ka_gfs_list_t l;
    assert_int_equal(ka_gfs_list(s_wsfd, P("d"), "", 0, 0, &l), 0);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.entries[0].name, "a");
    assert_int_equal(l.entries[0].type, KA_GP_FT_FILE);
    assert_int_equal(l.entries[0].size, 3);
    assert_string_equal(l.entries[2].name, "sublink");
    assert_int_equal(l.entries[2].type, KA_GP_FT_SYMLINK);
    assert_false(l.more);
    ka_gfs_list_free(&l);
    /* paging: after a name, a limit */
    assert_int_equal(ka_gfs_list(s_wsfd, P("d"), "a", 1, 1, &l), 0);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.entries[0].name, "sub");
    assert_true(l.more);
    ka_gfs_list_free(&l);
    ka_gfs_entry_t e;
    assert_int_equal(ka_gfs_stat(s_wsfd, P(""), &e), 0);
    assert_string_equal(e.name, ".");
    assert_int_equal(ka_gfs_stat(s_wsfd, P("/data/workspace/"), &e), 0);
    assert_int_equal(e.type, KA_GP_FT_DIR);
    assert_int_equal(ka_gfs_stat(s_wsfd, P("alink"), &e), 0);
    assert_int_equal(e.type, KA_GP_FT_SYMLINK); /* not followed */
    assert_int_equal(ka_gfs_stat(s_wsfd, P("nothing"), &e), -ENOENT);
    assert_int_equal(ka_gfs_mkdir(s_wsfd, P("m/n/o"), false, 0), -ENOENT);
    assert_int_equal(ka_gfs_mkdir(s_wsfd, P("m/n/o"), true, 0700), 0);
    assert_int_equal(ka_gfs_stat(s_wsfd, P("m/n/o"), &e), 0);
    assert_int_equal(e.mode, 0700);
    assert_int_equal(ka_gfs_mkdir(s_wsfd, P("m/n/o"), false, 0), -EEXIST);
    assert_int_equal(ka_gfs_mkdir(s_wsfd, P("m/n/o"), true, 0), 0);
    assert_int_equal(ka_gfs_mkdir(s_wsfd, P("d/a/x"), false, 0), -ENOTDIR);
    assert_int_equal(ka_gfs_remove(s_wsfd, P("m"), false), -ENOTEMPTY);
    assert_int_equal(ka_gfs_remove(s_wsfd, P("m"), true), 0);
    assert_int_equal(ka_gfs_move(s_wsfd, P("d/a"), P("d/b"), false), 0);
    assert_int_equal(ka_gfs_mkdir(s_wsfd, P("d/a"), false, 0), 0);
    assert_int_equal(ka_gfs_move(s_wsfd, P("d/b"), P("d/a"), false), -EEXIST);
    assert_int_equal(ka_gfs_move(s_wsfd, P("d/a"), P("d/b"), true), -ENOTDIR);
    assert_int_equal(ka_gfs_remove(s_wsfd, P("d/a"), false), 0);
    assert_int_equal(ka_gfs_move(s_wsfd, P("d/b"), P("d/a"), false), 0);
    /* the root is never removed or moved; bad paths */
    const char *roots[] = {"", ".", "/data/workspace", "/data/workspace//", "d/.."};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        assert_int_not_equal(ka_gfs_remove(s_wsfd, P(roots[i]), true), 0);
        assert_int_not_equal(ka_gfs_move(s_wsfd, P(roots[i]), P("zz"), false), 0);
    }
    assert_int_equal(ka_gfs_remove(s_wsfd, "a\0b", 3, false), -EINVAL);
    char longname[300];
    memset(longname, 'n', 256);
    longname[256] = 0;
    assert_int_equal(ka_gfs_stat(s_wsfd, P(longname), &e), -ENAMETOOLONG);
    assert_true(s_exists("%s/d/a", s_ws));
}

static void test_escapes(void **state)
{
    (void)state;
    const char *escapes[] = {
        "root/etc/passwd",   "etc/passwd",  "out/canary", "up/outside/canary", "rel_out/canary",
        "../outside/canary", "/etc/passwd", "l1/x",       "/data/x",           "out/secret/f"};
    ka_gfs_entry_t e;
    ka_gfs_list_t l;
    for (size_t i = 0; i < sizeof escapes / sizeof escapes[0]; i++) {
        const char *p = escapes[i];
        assert_int_equal(ka_gfs_stat(s_wsfd, P(p), &e), -EACCES);
        assert_int_equal(ka_gfs_remove(s_wsfd, P(p), true), -EACCES);
        assert_int_equal(ka_gfs_mkdir(s_wsfd, P(p), true, 0), -EACCES);
        assert_int_equal(ka_gfs_move(s_wsfd, P("d/a"), P(p), true), -EACCES);
        assert_int_equal(ka_gfs_move(s_wsfd, P(p), P("stolen"), true), -EACCES);
    }
    const char *dirs[] = {"root/", "etc/",       "out/", "up/", "rel_out/",
                          "..",    "../outside", "/etc", "l1/", "out/secret"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        assert_int_equal(ka_gfs_list(s_wsfd, P(dirs[i]), "", 0, 0, &l), -EACCES);
        int err = 0;
        assert_null(ka_gw_new(s_wsfd, P(dirs[i]), &err));
        assert_int_equal(err, -EACCES);
    }
    /* a link as the last component is the link: listing it is not a directory, removing or
     * moving it leaves its target alone */
    assert_int_equal(ka_gfs_list(s_wsfd, P("out"), "", 0, 0, &l), -ENOTDIR);
    assert_int_equal(ka_gfs_list(s_wsfd, P("d/sublink/"), "", 0, 0, &l), 0);
    ka_gfs_list_free(&l);
    assert_int_equal(ka_gfs_move(s_wsfd, P("out"), P("out2"), false), 0);
    assert_int_equal(ka_gfs_remove(s_wsfd, P("out2"), true), 0);
    assert_int_equal(ka_gfs_remove(s_wsfd, P("root"), true), 0);
    assert_int_equal(ka_gfs_remove(s_wsfd, P("up"), true), 0);
    s_outside_intact();
    assert_true(s_exists("/etc/passwd"));
    s_sh("cd %s && ln -s %s out && ln -s / root && ln -s .. up", s_ws, s_out);
}

/* ---- the swap race ---------------------------------------------------------------------- */

static atomic_bool s_stop;

/* Swaps ws/victim between a directory (with a file) and a symlink to the outside. */
static void *s_swapper(void *arg)
{
    (void)arg;
    char victim[400], tmpdir[400], tmplink[400];
    snprintf(victim, sizeof victim, "%s/victim", s_ws);
    snprintf(tmpdir, sizeof tmpdir, "%s/victim.d", s_ws);
    snprintf(tmplink, sizeof tmplink, "%s/victim.l", s_ws);
    while (!atomic_load(&s_stop)) {
        mkdir(tmpdir, 0755);
        char f[450];
        snprintf(f, sizeof f, "%s/f", tmpdir);
        close(open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
        rename(tmpdir, victim); /* fails while victim is a non-empty dir: fine */
        symlink(s_out, tmplink);
        rename(tmplink, victim); /* fails over a directory: fine */
        unlink(tmplink);
    }
    return NULL;
}

static void test_swap_race(void **state)
{
    (void)state;
    atomic_store(&s_stop, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_swapper, NULL), 0);
    ka_gfs_entry_t e;
    ka_gfs_list_t l;
    int removed = 0;
    for (int i = 0; i < 2000; i++) {
        if (ka_gfs_list(s_wsfd, P("victim"), "", 0, 0, &l) == 0) {
            for (size_t k = 0; k < l.n; k++) /* only ever the victim's own file */
                assert_string_equal(l.entries[k].name, "f");
            ka_gfs_list_free(&l);
        }
        if (ka_gfs_stat(s_wsfd, P("victim/canary"), &e) == 0)
            fail_msg("stat reached the outside canary at iteration %d", i);
        ka_gfs_mkdir(s_wsfd, P("victim/new"), true, 0);
        ka_gfs_move(s_wsfd, P("victim/f"), P("moved"), true);
        ka_gfs_move(s_wsfd, P("moved"), P("victim/moved"), true);
        removed += ka_gfs_remove(s_wsfd, P("victim"), true) == 0;
        int err;
        ka_gw_t *w = i % 8 ? NULL : ka_gw_new(s_wsfd, P("victim"), &err);
        ka_gw_destroy(&w);
        s_outside_intact();
    }
    atomic_store(&s_stop, true);
    pthread_join(t, NULL);
    assert_true(removed > 0); /* the race did run both ways */
    s_outside_intact();
    assert_false(s_exists("%s/f", s_out));
}

/* ---- the watch ---------------------------------------------------------------------------- */

/* Collects events until one of kind with path arrives (or 5 s pass); true if it did. */
static bool s_wait_event(ka_gw_t *w, int kind, const char *path, bool *overflow)
{
    for (int round = 0; round < 500; round++) {
        struct pollfd p = {.fd = ka_gw_fd(w), .events = POLLIN};
        poll(&p, 1, 10);
        ka_gw_read(w);
        const uint8_t *ev;
        size_t n;
        while ((ev = ka_gw_peek(w, &n)) != NULL) {
            int k = ev[0] & ~KA_GP_EV_ISDIR;
            bool hit = k == kind && strcmp((const char *)ev + 1, path) == 0;
            if (k == KA_GP_EV_OVERFLOW && overflow)
                *overflow = true;
            ka_gw_pop(w);
            if (hit)
                return true;
        }
    }
    return false;
}

static void test_watch(void **state)
{
    (void)state;
    s_sh("mkdir -p %s/w", s_ws);
    int err = 0;
    ka_gw_t *w = ka_gw_new(s_wsfd, P("w"), &err);
    assert_non_null(w);
    s_sh("mkdir -p %s/w/later/deep && echo x > %s/w/later/deep/f", s_ws, s_ws);
    assert_true(s_wait_event(w, KA_GP_EV_CREATE, "later/deep/f", NULL));
    s_sh("echo y > %s/w/later/deep/g", s_ws); /* a directory created later is watched */
    assert_true(s_wait_event(w, KA_GP_EV_CREATE, "later/deep/g", NULL));
    s_sh("mv %s/w/later %s/w/renamed && echo z > %s/w/renamed/deep/h", s_ws, s_ws, s_ws);
    assert_true(s_wait_event(w, KA_GP_EV_MOVE, "renamed", NULL));
    assert_true(s_wait_event(w, KA_GP_EV_CREATE, "renamed/deep/h", NULL));
    /* a queue that is not drained overflows: one OVERFLOW after what fit, then it goes on */
    s_sh("cd %s/w && i=0; while [ $i -lt 3000 ]; do : > n$i; i=$((i+1)); done", s_ws);
    ka_gw_read(w);
    size_t count = 0, n;
    const uint8_t *ev;
    bool overflow = false;
    while ((ev = ka_gw_peek(w, &n)) != NULL) {
        count++;
        overflow = overflow || (ev[0] & ~KA_GP_EV_ISDIR) == KA_GP_EV_OVERFLOW;
        ka_gw_pop(w);
    }
    assert_true(overflow);
    assert_true(count <= KA_GW_QUEUE);
    s_sh("echo q > %s/w/after", s_ws);
    assert_true(s_wait_event(w, KA_GP_EV_CREATE, "after", NULL));
    ka_gw_destroy(&w);
    assert_null(w);
    ka_gw_destroy(&w); /* idempotent */
}

/* A rename inside the tree is one MOVE even when the reader comes between the kernel's
 * MOVED_FROM and MOVED_TO (a thread renames back and forth while the watch reads). */
#define RENAMES 3000
static void *s_renamer(void *arg)
{
    (void)arg;
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/m/a", s_ws);
    snprintf(b, sizeof b, "%s/m/b", s_ws);
    for (int i = 0; i < RENAMES; i++)
        if (rename(i % 2 ? b : a, i % 2 ? a : b) != 0)
            return (void *)1;
    return NULL;
}

static void test_watch_rename_pairs(void **state)
{
    (void)state;
    s_sh("mkdir -p %s/m && echo x > %s/m/a", s_ws, s_ws);
    int err = 0;
    ka_gw_t *w = ka_gw_new(s_wsfd, P("m"), &err);
    assert_non_null(w);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_renamer, NULL), 0);
    int moves = 0, split = 0;
    bool overflow = false;
    for (int idle = 0; moves + split < RENAMES && idle < 500;) {
        struct pollfd p = {.fd = ka_gw_fd(w), .events = POLLIN};
        idle = poll(&p, 1, 10) == 1 ? 0 : idle + 1;
        ka_gw_read(w);
        const uint8_t *ev;
        size_t n;
        while ((ev = ka_gw_peek(w, &n)) != NULL) {
            int k = ev[0] & ~KA_GP_EV_ISDIR;
            moves += k == KA_GP_EV_MOVE;
            split += k == KA_GP_EV_CREATE || k == KA_GP_EV_DELETE;
            overflow = overflow || k == KA_GP_EV_OVERFLOW;
            ka_gw_pop(w);
        }
    }
    void *rc;
    pthread_join(t, &rc);
    assert_null(rc);
    ka_gw_destroy(&w);
    assert_int_equal(split, 0); /* no rename came out as a delete and a create */
    assert_true(moves > 0);
    if (!overflow) /* a reader slower than the renamer (a sanitizer build) may fill the queue */
        assert_int_equal(moves, RENAMES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_swap_race),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_watch_rename_pairs),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
