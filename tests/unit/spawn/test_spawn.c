/*
 * kagent-spawn: a message it cannot trust is refused before anything is done with it. Each case
 * sends the real program one malformed ka_spawn_msg_t on a SOCK_SEQPACKET pair, as the node
 * does, and expects the 'E' report of step KA_SPAWN_STEP_MSG (EPROTO) and exit status 127,
 * never a namespace, a mount or a child. (Starting real sandboxes through it is what
 * test_substrate, test_fork and escape_suite do.)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/filter.h>

#include "ka_spawn.h"

/* A message every check accepts: one layer, no arguments, a one-instruction filter. */
typedef struct {
    ka_spawn_msg_t m;
    unsigned char tail[64];
} s_msg_t;

static void s_valid(s_msg_t *x, int sync_fd)
{
    memset(x, 0, sizeof(*x));
    x->m.version = KA_SPAWN_VERSION;
    x->m.sync_fd = sync_fd;
    x->m.keep[0] = sync_fd;
    x->m.n_keep = 1;
    x->m.n_lower = 1;
    x->m.n_filter = 1;
    strcpy(x->m.hostname, "sandbox");
    memcpy(x->tail, "/l\0\0\0\0\0\0", 8); /* "/l", padded to 8 */
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, 0x7fff0000u);
    memcpy(x->tail + 8, &allow, sizeof(allow));
    x->m.tail_len = 8 + sizeof(allow);
}

typedef struct {
    ka_spawn_report_t r;
    ssize_t got;
    int status;
} s_outcome_t;

/* Runs kagent-spawn with argv[1] (NULL: the sync socket's number), sends len bytes of msg
 * (none if msg is NULL), and collects its report and exit status; never waits past 10 s. */
static s_outcome_t s_run(const void *msg, size_t len, const char *arg)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", sv[1]);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], sv[1]);
    char *argv[] = {"kagent-spawn", (char *)(arg ? arg : fd), NULL}, *envp[] = {NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, SPAWN_PATH, &fa, NULL, argv, envp), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    if (msg)
        assert_int_equal(send(sv[0], msg, len, MSG_NOSIGNAL), (ssize_t)len);
    else
        shutdown(sv[0], SHUT_WR);
    s_outcome_t o = {.got = 0};
    struct pollfd p = {.fd = sv[0], .events = POLLIN};
    if (poll(&p, 1, 10000) == 1)
        o.got = read(sv[0], &o.r, sizeof(o.r));
    else
        kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &o.status, 0), pid);
    close(sv[0]);
    return o;
}

static void m_none(s_msg_t *x)
{
    (void)x;
}
static void m_version(s_msg_t *x)
{
    x->m.version = KA_SPAWN_VERSION + 1;
}
static void m_hostname(s_msg_t *x)
{
    memset(x->m.hostname, 'a', sizeof(x->m.hostname)); /* no NUL in its field */
}
static void m_overlay(s_msg_t *x)
{
    memset(x->m.overlay_opts, 'o', sizeof(x->m.overlay_opts));
}
static void m_no_layer(s_msg_t *x)
{
    x->m.n_lower = 0;
}
static void m_layers_past_tail(s_msg_t *x)
{
    x->m.n_lower = 2; /* the second path would run into the filter */
}
static void m_filter_count(s_msg_t *x)
{
    x->m.n_filter = 2;
}
static void m_keep_order(s_msg_t *x)
{
    x->m.keep[1] = x->m.keep[0];
    x->m.n_keep = 2;
}
static void m_keep_count(s_msg_t *x)
{
    x->m.n_keep = KA_SPAWN_KEEP_MAX + 1;
}
static void m_cg_count(s_msg_t *x)
{
    x->m.n_cg = -1;
}
static void m_args(s_msg_t *x)
{
    x->m.n_args = KA_SPAWN_MAX_ARGS + 1;
}
static void m_tail_len(s_msg_t *x)
{
    x->m.tail_len += 8; /* says more than is sent */
}
static void m_sync_fd(s_msg_t *x)
{
    x->m.sync_fd = 1000; /* not the socket it came on */
}

/* The sync socket's number in the child is the same as in this process: sv[1] of s_run, which
 * is the second-lowest free descriptor here; the valid message must name it. */
static int s_sync_number(void)
{
    int a[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, a), 0);
    close(a[0]);
    close(a[1]);
    return a[1];
}

/* The valid message less its last cut bytes, as mutate leaves it, is refused with the MSG step. */
static void s_refused(void (*mutate)(s_msg_t *), size_t cut)
{
    s_msg_t x;
    s_valid(&x, s_sync_number());
    size_t len = sizeof(x.m) + x.m.tail_len - cut;
    mutate(&x);
    s_outcome_t o = s_run(&x, len, NULL);
    assert_int_equal(o.got, sizeof(o.r));
    assert_int_equal(o.r.tag, 'E');
    assert_int_equal(o.r.step, KA_SPAWN_STEP_MSG);
    assert_int_equal(o.r.err, EPROTO);
    assert_true(WIFEXITED(o.status));
    assert_int_equal(WEXITSTATUS(o.status), 127);
}

static void test_truncated(void **state)
{
    (void)state;
    s_refused(m_none, sizeof(ka_spawn_msg_t) / 2 + 8 + sizeof(struct sock_filter));
}

static void test_each_bad_field(void **state)
{
    (void)state;
    void (*cases[])(s_msg_t *) = {m_version,          m_hostname,     m_overlay,    m_no_layer,
                                  m_layers_past_tail, m_filter_count, m_keep_order, m_keep_count,
                                  m_cg_count,         m_args,         m_tail_len,   m_sync_fd};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        s_refused(cases[i], 0);
}

/* The node went away before sending anything: refused, nothing started. */
static void test_no_message(void **state)
{
    (void)state;
    s_outcome_t o = s_run(NULL, 0, NULL);
    assert_true(WIFEXITED(o.status));
    assert_int_equal(WEXITSTATUS(o.status), 127);
}

/* Not started as the node starts it: it exits at once without reading anything. */
static void test_bad_argument(void **state)
{
    (void)state;
    s_outcome_t o = s_run(NULL, 0, "3x");
    assert_int_equal(o.got, 0);
    assert_true(WIFEXITED(o.status));
    assert_int_equal(WEXITSTATUS(o.status), 125);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_each_bad_field),
        cmocka_unit_test(test_no_message),
        cmocka_unit_test(test_bad_argument),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
