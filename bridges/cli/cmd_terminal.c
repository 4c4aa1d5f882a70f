/*
 * Interactive sessions: `sandbox exec -i/-t` and `sandbox wait -i/-t` on one
 * kagent.api.v1.TerminalService/Session stream.
 *
 * One poll loop over the connection, standard input (with -i only: without it stdin is never
 * read) and a self-pipe the signal handlers write to. -t puts the local terminal in raw mode
 * (restored on every way out: the end of the session, a failure, SIGINT/SIGTERM/SIGHUP, exit)
 * and sends the window size at the start and on each SIGWINCH. SIGINT and SIGQUIT are passed
 * to the remote process group; SIGTERM and SIGHUP end the session, which hangs up a started
 * process. The remote exit code becomes ours.
 */
#include "cli_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/api/v1/terminal.pb-c.h"
#include "cmd_terminal.h"

#define S_METHOD   "/kagent.api.v1.TerminalService/Session"
#define S_IN_CHUNK ((size_t)64 << 10) /* stdin bytes per message */

static int s_sigfd[2] = {-1, -1};
static struct termios s_saved;
static bool s_raw;

static void s_on_signal(int sig)
{
    int e = errno;
    unsigned char b = (unsigned char)sig;
    (void)!write(s_sigfd[1], &b, 1);
    errno = e;
}

static void s_restore(void)
{
    if (s_raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &s_saved);
    s_raw = false;
}

/* Raw mode on the local terminal (stdin), if it is one. */
static void s_make_raw(void)
{
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &s_saved) != 0)
        return;
    struct termios t = s_saved;
    cfmakeraw(&t);
    if (tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0) {
        s_raw = true;
        atexit(s_restore);
    }
}

static void s_window(uint32_t *rows, uint32_t *cols)
{
    struct winsize ws;
    *rows = *cols = 0;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 || ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

static int s_install(struct sigaction old[], const int *sigs, size_t n)
{
    if (pipe2(s_sigfd, O_CLOEXEC | O_NONBLOCK) != 0)
        return -errno;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < n; i++)
        sigaction(sigs[i], &sa, &old[i]);
    return 0;
}

static void s_uninstall(struct sigaction old[], const int *sigs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sigaction(sigs[i], &old[i], NULL);
    close(s_sigfd[0]);
    close(s_sigfd[1]);
    s_sigfd[0] = s_sigfd[1] = -1;
}

/* ------------------------------------------------------------------------------------------ */

typedef struct {
    kb_cli_t *cli;
    kb_rpc_call_t *call;
    bool tty;
    bool in_open; /* stdin is read and forwarded */
    bool end;     /* leave the loop */
    bool hang_up; /* leave without waiting for the exit */
    int code;     /* from the exit message */
    bool exited;
} s_sess_t;

static int s_write(s_sess_t *s, Kagent__Api__V1__TerminalRequest *m)
{
    return kb_rpc_call_write(s->call, &m->base);
}

static void s_resize(s_sess_t *s)
{
    Kagent__Api__V1__TerminalResize rz = KAGENT__API__V1__TERMINAL_RESIZE__INIT;
    s_window(&rz.rows, &rz.cols);
    if (!rz.rows || !rz.cols)
        return;
    Kagent__Api__V1__TerminalRequest m = KAGENT__API__V1__TERMINAL_REQUEST__INIT;
    m.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_RESIZE;
    m.resize = &rz;
    s_write(s, &m);
}

static void s_on_sig(s_sess_t *s)
{
    unsigned char b;
    while (read(s_sigfd[0], &b, 1) == 1) {
        int sig = b;
        if (sig == SIGWINCH) {
            if (s->tty)
                s_resize(s);
        } else if (sig == SIGINT || sig == SIGQUIT) {
            Kagent__Api__V1__TerminalRequest m = KAGENT__API__V1__TERMINAL_REQUEST__INIT;
            m.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_SIGNAL;
            m.signal = sig == SIGINT ? ATEENV__V1ALPHA__SIGNAL__SIGNAL_INT
                                     : ATEENV__V1ALPHA__SIGNAL__SIGNAL_QUIT;
            s_write(s, &m);
        } else { /* SIGTERM, SIGHUP: the session ends here (the server hangs up) */
            s->end = s->hang_up = true;
        }
    }
}

static void s_on_stdin(s_sess_t *s)
{
    static uint8_t buf[S_IN_CHUNK];
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    Kagent__Api__V1__TerminalRequest m = KAGENT__API__V1__TERMINAL_REQUEST__INIT;
    if (n > 0) {
        m.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_STDIN;
        m.stdin.data = buf;
        m.stdin.len = (size_t)n;
    } else { /* end of input (or an unreadable stdin): the remote side gets its EOF */
        m.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_STDIN_EOF;
        m.stdin_eof = true;
        s->in_open = false;
    }
    s_write(s, &m);
}

static void s_out(FILE *f, const ProtobufCBinaryData *b)
{
    fwrite(b->data, 1, b->len, f);
    fflush(f);
}

/* Takes every message that has arrived. */
static void s_on_net(s_sess_t *s)
{
    ProtobufCMessage *msg;
    int rc;
    while ((rc = kb_rpc_call_poll(s->call, &kagent__api__v1__terminal_response__descriptor,
                                  &msg)) == 1) {
        Kagent__Api__V1__TerminalResponse *r = (Kagent__Api__V1__TerminalResponse *)msg;
        switch (r->msg_case) {
        case KAGENT__API__V1__TERMINAL_RESPONSE__MSG_STDOUT:
            s_out(s->cli->out, &r->stdout);
            break;
        case KAGENT__API__V1__TERMINAL_RESPONSE__MSG_STDERR:
            s_out(s->cli->err, &r->stderr);
            break;
        case KAGENT__API__V1__TERMINAL_RESPONSE__MSG_EXIT:
            if (r->exit) {
                s->exited = true;
                s->code = kb_process_exit_code(r->exit);
            }
            break;
        default: /* started */
            break;
        }
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    if (rc < 0)
        s->end = true;
}

static void s_loop(s_sess_t *s)
{
    while (!s->end) {
        s_on_net(s); /* writes out what is queued, takes what came */
        if (s->end)
            break;
        struct pollfd p[3] = {
            {.fd = kb_rpc_call_fd(s->call), .events = kb_rpc_call_events(s->call)},
            {.fd = s_sigfd[0], .events = POLLIN},
            {.fd = STDIN_FILENO, .events = POLLIN}};
        int n = poll(p, s->in_open ? 3 : 2, -1);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (p[1].revents)
            s_on_sig(s);
        if (!s->end && s->in_open && p[2].revents)
            s_on_stdin(s);
    }
}

int kb_terminal_run(kb_cli_t *cli, const kb_terminal_opts_t *o)
{
    static const int sigs[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGWINCH};
    enum { NSIG_ = sizeof sigs / sizeof sigs[0] };
    struct sigaction old[NSIG_];
    if (!o->timeout_given)
        cli->timeout_ns = 0; /* a session lasts as long as its process, unless --timeout */
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    bool have_stdin = fcntl(STDIN_FILENO, F_GETFD) >= 0; /* (before fd 0 can be reused) */
    if (s_install(old, sigs, NSIG_) != 0)
        return kb_cli_fail(cli, "cannot set up signal handling: %s", strerror(errno));
    kb_rpc_status_t st;
    s_sess_t s = {
        .cli = cli, .tty = o->tty, .in_open = o->stdin_open && have_stdin, .code = KB_EXIT_ERROR};
    s.call = kb_rpc_client_stream(rpc, S_METHOD, o->sandbox_id, &st);
    Kagent__Api__V1__TerminalRequest m = KAGENT__API__V1__TERMINAL_REQUEST__INIT;
    Kagent__Api__V1__TerminalStart start = KAGENT__API__V1__TERMINAL_START__INIT;
    Kagent__Api__V1__TerminalAttach at = KAGENT__API__V1__TERMINAL_ATTACH__INIT;
    if (o->process) {
        start.process = o->process;
        start.tty = o->tty;
        if (o->tty)
            s_window(&start.rows, &start.cols);
        m.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_START;
        m.start = &start;
    } else {
        at.process_id = (char *)o->process_id;
        at.stdout_offset = o->stdout_offset;
        at.stderr_offset = o->stderr_offset;
        m.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_ATTACH;
        m.attach = &at;
    }
    if (s.call && s_write(&s, &m) == 0) {
        if (o->stdin_open && !have_stdin) { /* -i with stdin closed: an empty input */
            Kagent__Api__V1__TerminalRequest eof = KAGENT__API__V1__TERMINAL_REQUEST__INIT;
            eof.msg_case = KAGENT__API__V1__TERMINAL_REQUEST__MSG_STDIN_EOF;
            eof.stdin_eof = true;
            s_write(&s, &eof);
        }
        if (o->tty)
            s_make_raw();
        s_loop(&s);
    }
    s_restore();
    int rc = s.code;
    if (s.hang_up) {
        kb_rpc_call_destroy(&s.call); /* the reset hangs the process up */
        rc = kb_cli_fail(cli, "session ended by a signal; the process was hung up");
    } else if (s.call && kb_rpc_call_finish(s.call, NULL, NULL, &st) == 0 && s.exited) {
        rc = s.code;
    } else {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        rc = kb_cli_fail(cli, "session in sandbox %s: %s", o->sandbox_id,
                         s.call && st.code == 0 ? "the stream ended before the process exited"
                                                : cause);
    }
    kb_rpc_call_destroy(&s.call);
    s_uninstall(old, sigs, NSIG_);
    return rc;
}
