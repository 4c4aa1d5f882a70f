/*
 * ka_uidrange: two nodes of different state dirs never hold overlapping host uid ranges; the
 * same state dir may share one; a dead node's claim is taken back; bad ranges are refused.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ka_tree.h"
#include "ka_uidrange.h"

static char s_dir[64];

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_dir, sizeof s_dir, "/tmp/kagent-uidrange.XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **unused)
{
    (void)unused;
    return ka_tree_remove(s_dir, NULL);
}

static int s_claims(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ls %s | grep -vc '^\\.new' || :", s_dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p && fscanf(p, "%d", &n) != 1)
        n = -1;
    if (p)
        pclose(p);
    return n;
}

static void test_overlap_refused(void **unused)
{
    (void)unused;
    ka_uidrange_t a, b, c;
    char why[512];
    assert_int_equal(ka_uidrange_claim(&a, s_dir, 1000000, 65536, "/var/a", why, sizeof why), 0);
    assert_int_equal(ka_uidrange_claim(&b, s_dir, 1065535, 10, "/var/b", why, sizeof why),
                     -EADDRINUSE);
    assert_non_null(strstr(why, "/var/a"));
    char pid[32];
    snprintf(pid, sizeof pid, "%ld ", (long)getpid());
    assert_non_null(strstr(why, pid));
    assert_int_equal(b.fd, -1);
    assert_int_equal(s_claims(), 1); /* the refused claim left nothing */
    /* right after the range: its own */
    assert_int_equal(ka_uidrange_claim(&c, s_dir, 1065536, 65536, "/var/c", why, sizeof why), 0);
    assert_int_equal(s_claims(), 2);
    ka_uidrange_release(&c);
    ka_uidrange_release(&a);
    ka_uidrange_release(&a); /* idempotent */
    assert_int_equal(s_claims(), 0);
    /* released: the range is free again */
    assert_int_equal(ka_uidrange_claim(&b, s_dir, 1065535, 10, "/var/b", why, sizeof why), 0);
    ka_uidrange_release(&b);
}

static void test_same_state_shares(void **unused)
{
    (void)unused;
    ka_uidrange_t a, b;
    char why[512];
    assert_int_equal(ka_uidrange_claim(&a, s_dir, 2000000, 100, "/var/x", why, sizeof why), 0);
    assert_int_equal(ka_uidrange_claim(&b, s_dir, 2000000, 100, "/var/x", why, sizeof why), 0);
    ka_uidrange_release(&a);
    assert_int_equal(s_claims(), 1); /* b still holds it */
    ka_uidrange_release(&b);
    assert_int_equal(s_claims(), 0);
}

/* A node in another process: refused while it lives, its claim taken back once it died. */
static void test_dead_holder(void **unused)
{
    (void)unused;
    int go[2], ready[2];
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        ka_uidrange_t h;
        char c = ka_uidrange_claim(&h, s_dir, 3000000, 1000, "/var/dead", NULL, 0) == 0 ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
            _exit(2);
        _exit(0); /* dies holding its claim: the kernel drops the lock, the file stays */
    }
    char c = 0;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    ka_uidrange_t me;
    char why[512];
    assert_int_equal(ka_uidrange_claim(&me, s_dir, 3000500, 1000, "/var/me", why, sizeof why),
                     -EADDRINUSE);
    assert_non_null(strstr(why, "/var/dead"));
    assert_int_equal(write(go[1], "x", 1), 1);
    int st = 0;
    assert_int_equal(waitpid(child, &st, 0), child);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(s_claims(), 1); /* the dead node's claim */
    assert_int_equal(ka_uidrange_claim(&me, s_dir, 3000500, 1000, "/var/me", why, sizeof why), 0);
    assert_int_equal(s_claims(), 1); /* the stale one removed, ours in place */
    ka_uidrange_release(&me);
    for (int i = 0; i < 2; i++) {
        close(go[i]);
        close(ready[i]);
    }
}

static void test_bad_ranges(void **unused)
{
    (void)unused;
    ka_uidrange_t a;
    assert_int_equal(ka_uidrange_claim(&a, s_dir, 1000, 0, "/s", NULL, 0), -EINVAL);
    assert_int_equal(ka_uidrange_claim(&a, s_dir, UINT32_MAX - 5, 10, "/s", NULL, 0), -EINVAL);
    assert_int_equal(ka_uidrange_claim(&a, s_dir, 1000, 10, NULL, NULL, 0), -EINVAL);
    assert_int_equal(a.fd, -1);
    assert_int_equal(s_claims(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_refused),
        cmocka_unit_test(test_same_state_shares),
        cmocka_unit_test(test_dead_holder),
        cmocka_unit_test(test_bad_ranges),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
