/*
 * bench_mesh_remote: two krt systems (nodes 1 and 2, one scheduler each) in one process joined
 * by the mesh over tcp://127.0.0.1, once without CURVE and once with it (as kagentd runs its
 * mesh); the ZeroMQ peers likewise, plain and with CURVE:
 *   - mesh_request_rtt_us: krt_request from an actor on node 1 to an echo actor on node 2, one
 *     in flight, p50 of RTT_N round trips; beside it plain ZeroMQ REQ/REP over tcp loopback
 *     (a thread answering, the main thread asking), p50 too. Also the mesh I/O threads'
 *     wake-ups (blocking waits ended) and eventfd signals per round trip, both nodes together.
 *   - mesh_remote_msgs_per_s: an actor on node 1 streams STREAM_N 16-byte messages to a
 *     counter on node 2 (BURST per turn: one mesh frame each); beside it ZeroMQ PUSH/PULL with
 *     STREAM_N 16-byte messages.
 *   - zmq_spin_rtt_us: ZeroMQ REQ/REP again, both threads busy-polling (ZMQ_DONTWAIT) instead of
 *     blocking: no wake-up of either application thread is left, only ZeroMQ's I/O threads'.
 *     The lowest round trip of any design that keeps ZeroMQ as the transport on this host.
 *   - tcp_loopback_rtt_us: the floor under both: two threads echoing 8 bytes over one blocking
 *     TCP socket pair on loopback (TCP_NODELAY), p50 of RTT_N round trips.
 * ratio = times better than the peer (peer/value for latency, value/peer for throughput).
 * BENCH names without a suffix are the plain runs, `_curve` the CURVE ones.
 * SPEC.md's peer for both figures, Erlang distribution (two BEAM nodes over tcp loopback, the
 * same two workloads: erl_dist_peer.erl), is run by run.sh after this program; it prints
 * `_vs_erlang` BENCH lines from our plain figures (distribution without TLS is plain TCP).
 */
#include "krt.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

enum { T_PING = KRT_MSG_USER + 1, T_PONG, T_STREAM, T_MORE };

#define RTT_N    20000
#define STREAM_N 2000000
#define BURST    256

static uint64_t s_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void s_die(const char *what, int rc)
{
    fprintf(stderr, "bench_mesh_remote: %s failed: %s\n", what, krt_strerror(rc));
    exit(1);
}

static int s_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double s_p50_us(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, s_cmp);
    return (double)v[n / 2] / 1000.0;
}

/* ------------------------------------------------------------------------------------------ */
/* Actors                                                                                     */

static _Atomic uint64_t s_count;
/* Posted when a run is done: the main thread sleeps on it (a polling main thread took CPU from
 * the threads being measured on this 2-core machine). */
static sem_t s_done;

static void echo_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == T_PING)
        krt_reply(ctx, msg, T_PONG, msg->body, msg->len);
    else if (msg->type == T_STREAM &&
             atomic_fetch_add_explicit(&s_count, 1, memory_order_relaxed) + 1 == STREAM_N)
        sem_post(&s_done);
}

static const krt_behaviour_t s_echo = {.kind = "echo", .handle = echo_handle};

typedef struct pinger {
    krt_addr_t to;
    uint64_t t0;
    size_t i;
    uint64_t *rtt;
} pinger_t;

static void ping_next(krt_ctx_t *ctx, pinger_t *p);

static void ping_done(krt_ctx_t *ctx, void *state, void *user, int err, const krt_msg_t *reply)
{
    pinger_t *p = state;
    if (err)
        s_die("remote request", err);
    p->rtt[p->i++] = s_ns() - p->t0;
    if (p->i == RTT_N) {
        sem_post(&s_done);
        return;
    }
    ping_next(ctx, p);
}

static void ping_next(krt_ctx_t *ctx, pinger_t *p)
{
    p->t0 = s_ns();
    int rc = krt_request(ctx, p->to, T_PING, &p->i, sizeof p->i, 10000, ping_done, NULL);
    if (rc)
        s_die("krt_request", rc);
}

static int ping_init(krt_ctx_t *ctx, void *state, void *arg)
{
    pinger_t *p = state;
    *p = *(pinger_t *)arg;
    ping_next(ctx, p);
    return 0;
}

static void ping_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
}

static const krt_behaviour_t s_pinger = {
    .kind = "pinger", .state_size = sizeof(pinger_t), .init = ping_init, .handle = ping_handle};

typedef struct streamer {
    krt_addr_t to;
    uint64_t sent;
} streamer_t;

/* BURST messages per turn, then a note to itself to go on (other actors get their turn). */
static void stream_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    streamer_t *s = state;
    uint8_t body[16] = {0};
    for (int i = 0; i < BURST && s->sent < STREAM_N; i++, s->sent++) {
        memcpy(body, &s->sent, sizeof s->sent);
        int rc = krt_send(ctx, s->to, T_STREAM, body, sizeof body);
        if (rc)
            s_die("krt_send", rc);
    }
    if (s->sent < STREAM_N)
        krt_send(ctx, krt_self(ctx), T_MORE, NULL, 0);
}

static int stream_init(krt_ctx_t *ctx, void *state, void *arg)
{
    streamer_t *s = state;
    s->to = *(krt_addr_t *)arg;
    return krt_send(ctx, krt_self(ctx), T_MORE, NULL, 0);
}

static const krt_behaviour_t s_streamer = {.kind = "streamer",
                                           .state_size = sizeof(streamer_t),
                                           .init = stream_init,
                                           .handle = stream_handle};

/* ------------------------------------------------------------------------------------------ */
/* The mesh pair                                                                              */

/* CURVE key pairs (z85): [0] node 1 / the ZeroMQ server, [1] node 2 / the ZeroMQ client. */
static char s_pub[2][41], s_sec[2][41];

typedef struct node {
    krt_system_t *sys;
    krt_mesh_t *mesh;
} node_t;

static void node_up(node_t *n, uint16_t id, bool curve)
{
    krt_config_t cfg = {.node_id = id, .schedulers = 1, .job_threads = 1};
    krt_mesh_config_t mc = {.bind = "tcp://127.0.0.1:*"};
    if (curve) {
        mc.curve_public = s_pub[id - 1];
        mc.curve_secret = s_sec[id - 1];
    }
    n->sys = krt_system_new(&cfg);
    if (!n->sys || krt_system_start(n->sys))
        s_die("system", KRT_ENOMEM);
    n->mesh = krt_mesh_new(n->sys, &mc);
    int rc = n->mesh ? krt_mesh_start(n->mesh) : KRT_ENOMEM;
    if (rc)
        s_die("mesh", rc);
}

static void node_down(node_t *n)
{
    krt_mesh_stop(n->mesh);
    krt_system_stop(n->sys);
    krt_mesh_destroy(&n->mesh);
    krt_system_destroy(&n->sys);
}

static void s_wait_done(void)
{
    while (sem_wait(&s_done) != 0)
        ;
}

static uint64_t s_wakes(node_t *n)
{
    uint64_t w = 0;
    for (int i = 0; i < 2; i++) {
        krt_mesh_stats_t st;
        krt_mesh_stats(n[i].mesh, &st);
        w += st.io_wakeups + st.signals;
    }
    return w;
}

/* ------------------------------------------------------------------------------------------ */
/* Plain ZeroMQ                                                                               */

/* zmq_recv, blocking or (spin) busy-polling. */
static int s_zrecv(void *sock, char *buf, size_t cap, bool spin)
{
    int n;
    while ((n = zmq_recv(sock, buf, cap, spin ? ZMQ_DONTWAIT : 0)) < 0 && zmq_errno() == EAGAIN)
        ;
    return n;
}

typedef struct {
    void *sock;
    bool spin;
} zrep_t;

static void *zmq_rep_main(void *arg)
{
    const zrep_t *z = arg;
    void *sock = z->sock;
    char buf[64];
    for (int i = 0; i < RTT_N + 1; i++) {
        int n = s_zrecv(sock, buf, sizeof buf, z->spin);
        if (n < 0 || zmq_send(sock, buf, (size_t)n, 0) < 0)
            break;
    }
    return NULL;
}

static void *zmq_pull_main(void *sock)
{
    char buf[64];
    for (int i = 0; i < STREAM_N; i++)
        if (zmq_recv(sock, buf, sizeof buf, 0) < 0)
            break;
    return NULL;
}

/* CURVE on a server and a client socket. */
static int zmq_curve(void *srv, void *cli)
{
    int one = 1;
    return zmq_setsockopt(srv, ZMQ_CURVE_SERVER, &one, sizeof one) ||
           zmq_setsockopt(srv, ZMQ_CURVE_SECRETKEY, s_sec[0], 40) ||
           zmq_setsockopt(cli, ZMQ_CURVE_SERVERKEY, s_pub[0], 40) ||
           zmq_setsockopt(cli, ZMQ_CURVE_PUBLICKEY, s_pub[1], 40) ||
           zmq_setsockopt(cli, ZMQ_CURVE_SECRETKEY, s_sec[1], 40);
}

/* Two connected sockets of the given types over tcp loopback. */
static void zmq_pair(void *ctx, int srv_type, int cli_type, bool curve, void **srv, void **cli)
{
    char ep[64];
    size_t len = sizeof ep;
    *srv = zmq_socket(ctx, srv_type);
    *cli = zmq_socket(ctx, cli_type);
    if ((curve && zmq_curve(*srv, *cli)) || zmq_bind(*srv, "tcp://127.0.0.1:*") ||
        zmq_getsockopt(*srv, ZMQ_LAST_ENDPOINT, ep, &len) || zmq_connect(*cli, ep))
        s_die("zmq socket", -zmq_errno());
}

static double zmq_rtt_p50(void *ctx, bool curve, bool spin, uint64_t *rtt)
{
    void *rep, *req;
    zmq_pair(ctx, ZMQ_REP, ZMQ_REQ, curve, &rep, &req);
    pthread_t t;
    zrep_t z = {rep, spin};
    pthread_create(&t, NULL, zmq_rep_main, &z);
    char buf[64];
    zmq_send(req, "warm", 4, 0); /* the connection is up */
    zmq_recv(req, buf, sizeof buf, 0);
    for (size_t i = 0; i < RTT_N; i++) {
        uint64_t t0 = s_ns();
        if (zmq_send(req, &i, sizeof i, 0) < 0 || s_zrecv(req, buf, sizeof buf, spin) < 0)
            s_die("zmq req", -zmq_errno());
        rtt[i] = s_ns() - t0;
    }
    pthread_join(t, NULL);
    zmq_close(req);
    zmq_close(rep);
    return s_p50_us(rtt, RTT_N);
}

static double zmq_push_rate(void *ctx, bool curve)
{
    void *pull, *push;
    zmq_pair(ctx, ZMQ_PULL, ZMQ_PUSH, curve, &pull, &push);
    int hwm = 0;
    zmq_setsockopt(push, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(pull, ZMQ_RCVHWM, &hwm, sizeof hwm);
    pthread_t t;
    pthread_create(&t, NULL, zmq_pull_main, pull);
    uint8_t body[16] = {0};
    uint64_t t0 = s_ns();
    for (uint64_t i = 0; i < STREAM_N; i++) {
        memcpy(body, &i, sizeof i);
        if (zmq_send(push, body, sizeof body, 0) < 0)
            s_die("zmq push", -zmq_errno());
    }
    pthread_join(t, NULL);
    double rate = STREAM_N / ((double)(s_ns() - t0) / 1e9);
    zmq_close(push);
    zmq_close(pull);
    return rate;
}

/* The floor under any transport here: two threads, one blocking TCP socket each over loopback
 * (TCP_NODELAY), 8 bytes each way; no library, no queue, one wake-up per direction. */
static void *tcp_echo_main(void *arg)
{
    int fd = *(int *)arg;
    uint64_t v;
    while (read(fd, &v, sizeof v) == (ssize_t)sizeof v && write(fd, &v, sizeof v) == sizeof v)
        ;
    return NULL;
}

static double tcp_rtt_p50(uint64_t *rtt)
{
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0), cli = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (lfd < 0 || cli < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) ||
        connect(cli, (struct sockaddr *)&a, sizeof a))
        s_die("tcp socket", KRT_EINVAL);
    int srv = accept(lfd, NULL, NULL);
    if (srv < 0)
        s_die("tcp accept", KRT_EINVAL);
    setsockopt(cli, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(srv, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t t;
    pthread_create(&t, NULL, tcp_echo_main, &srv);
    for (uint64_t i = 0; i < RTT_N; i++) {
        uint64_t t0 = s_ns(), v = i;
        if (write(cli, &v, sizeof v) != sizeof v || read(cli, &v, sizeof v) != (ssize_t)sizeof v)
            s_die("tcp ping", KRT_EINVAL);
        rtt[i] = s_ns() - t0;
    }
    shutdown(cli, SHUT_RDWR);
    pthread_join(t, NULL);
    close(cli);
    close(srv);
    close(lfd);
    return s_p50_us(rtt, RTT_N);
}

/* ------------------------------------------------------------------------------------------ */

typedef struct figures {
    double rtt, rate;      /* p50 round trip (us), one-way msgs/s */
    double wakes, per_env; /* mesh: I/O wake-ups per round trip, envelopes per frame */
    double zmq_rtt, zmq_rate, zmq_spin_rtt;
} figures_t;

static void mesh_run(bool curve, uint64_t *rtt, figures_t *f)
{
    node_t n[2];
    node_up(&n[0], 1, curve);
    node_up(&n[1], 2, curve);
    if (krt_mesh_connect(n[0].mesh, 2, krt_mesh_endpoint(n[1].mesh), curve ? s_pub[1] : NULL) ||
        krt_mesh_connect(n[1].mesh, 1, krt_mesh_endpoint(n[0].mesh), curve ? s_pub[0] : NULL))
        s_die("connect", KRT_EINVAL);
    krt_addr_t echo;
    if (krt_system_spawn(n[1].sys, &s_echo, NULL, NULL, &echo))
        s_die("spawn", KRT_ENOMEM);
    krt_reply_t r; /* warm: connections up */
    int rc = krt_call(n[0].sys, echo, T_PING, "w", 1, 10000, &r);
    if (rc)
        s_die("warm-up call", rc);
    krt_reply_free(&r);

    uint64_t w0 = s_wakes(n);
    pinger_t p = {.to = echo, .rtt = rtt};
    krt_addr_t a;
    if (krt_system_spawn(n[0].sys, &s_pinger, &p, NULL, &a))
        s_die("spawn", KRT_ENOMEM);
    s_wait_done();
    f->wakes = (double)(s_wakes(n) - w0) / RTT_N;
    f->rtt = s_p50_us(rtt, RTT_N);

    atomic_store(&s_count, 0);
    uint64_t t0 = s_ns();
    if (krt_system_spawn(n[0].sys, &s_streamer, &echo, NULL, &a))
        s_die("spawn", KRT_ENOMEM);
    s_wait_done();
    f->rate = STREAM_N / ((double)(s_ns() - t0) / 1e9);
    krt_mesh_stats_t st;
    krt_mesh_stats(n[0].mesh, &st);
    f->per_env = st.frames ? (double)st.sent / (double)st.frames : 0;
    node_down(&n[0]);
    node_down(&n[1]);
}

static void zmq_run(bool curve, uint64_t *rtt, figures_t *f)
{
    void *ctx = zmq_ctx_new();
    f->zmq_rtt = zmq_rtt_p50(ctx, curve, false, rtt);
    f->zmq_spin_rtt = zmq_rtt_p50(ctx, curve, true, rtt);
    f->zmq_rate = zmq_push_rate(ctx, curve);
    zmq_ctx_term(ctx);
}

static void s_print(const char *name, const char *unit, const char *peer, double v, double pv,
                    bool low)
{
    printf("BENCH name=%s value=%.1f unit=%s peer=%s peer_value=%.1f ratio=%.2f\n", name, v, unit,
           peer, pv, low ? pv / v : v / pv);
}

int main(void)
{
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    sem_init(&s_done, 0, 0);
    for (int i = 0; i < 2; i++)
        if (zmq_curve_keypair(s_pub[i], s_sec[i]))
            s_die("zmq_curve_keypair", -zmq_errno());
    uint64_t *rtt = malloc(RTT_N * sizeof *rtt);
    figures_t f[2]; /* [0] plain, [1] CURVE */
    for (int c = 0; c < 2; c++) {
        mesh_run(c, rtt, &f[c]);
        zmq_run(c, rtt, &f[c]);
    }
    double floor_us = tcp_rtt_p50(rtt);
    free(rtt);

    printf("%-28s %6s %12s %12s %8s\n", "benchmark", "curve", "krt mesh", "zeromq", "ratio");
    for (int c = 0; c < 2; c++)
        printf("%-28s %6s %12.1f %12.1f %7.2fx\n", "request rtt p50 (us)", c ? "on" : "off",
               f[c].rtt, f[c].zmq_rtt, f[c].zmq_rtt / f[c].rtt);
    for (int c = 0; c < 2; c++)
        printf("%-28s %6s %12s %12.1f\n", "busy-polling rtt p50 (us)", c ? "on" : "off", "",
               f[c].zmq_spin_rtt);
    printf("%-28s %6s %12s %12.1f\n", "raw tcp rtt p50 (us)", "off", "", floor_us);
    for (int c = 0; c < 2; c++)
        printf("%-28s %6s %12.0f %12.0f %7.2fx\n", "one-way msgs/s", c ? "on" : "off", f[c].rate,
               f[c].zmq_rate, f[c].rate / f[c].zmq_rate);
    for (int c = 0; c < 2; c++)
        printf("%-28s %6s %12.1f\n", "I/O wake-ups per round trip", c ? "on" : "off", f[c].wakes);
    for (int c = 0; c < 2; c++)
        printf("%-28s %6s %12.1f\n", "envelopes per frame", c ? "on" : "off", f[c].per_env);
    s_print("mesh_request_rtt_us", "us", "zmq_req_rep", f[0].rtt, f[0].zmq_rtt, true);
    s_print("mesh_request_rtt_us_curve", "us", "zmq_req_rep_curve", f[1].rtt, f[1].zmq_rtt, true);
    s_print("mesh_remote_msgs_per_s", "msgs/s", "zmq_push_pull", f[0].rate, f[0].zmq_rate, false);
    s_print("mesh_remote_msgs_per_s_curve", "msgs/s", "zmq_push_pull_curve", f[1].rate,
            f[1].zmq_rate, false);
    printf("BENCH name=zmq_spin_rtt_us value=%.1f unit=us\n", f[0].zmq_spin_rtt);
    printf("BENCH name=zmq_spin_rtt_us_curve value=%.1f unit=us\n", f[1].zmq_spin_rtt);
    printf("BENCH name=tcp_loopback_rtt_us value=%.1f unit=us\n", floor_us);
    printf("BENCH name=mesh_rtt_io_wakeups value=%.1f unit=wakeups/roundtrip\n", f[0].wakes);
    printf("BENCH name=mesh_rtt_io_wakeups_curve value=%.1f unit=wakeups/roundtrip\n", f[1].wakes);
    return 0;
}
