/*
 * bench_mesh: envelopes encoded + decoded per second (codec), and messages per second between
 * two krt systems in one process joined by the mesh over ipc:// (one round trip in flight:
 * latency-bound ping-pong; and a one-way stream with many in flight).
 * Prints a table and one BENCH line per figure.
 */
#include "krt.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { T_PING = KRT_MSG_USER + 1, T_PONG, T_STREAM, T_DONE };

#define CODEC_N    5000000
#define PINGPONG_N 20000
#define STREAM_N   500000

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void s_die(const char *what, int rc)
{
    fprintf(stderr, "bench_mesh: %s failed: %s\n", what, krt_strerror(rc));
    exit(1);
}

/* Encode + decode CODEC_N envelopes with a body of `len` bytes; returns envelopes/s. */
static double s_codec(size_t len)
{
    uint8_t body[256];
    memset(body, 0xab, sizeof body);
    uint8_t buf[256 + KRT_ENVELOPE_OVERHEAD];
    krt_msg_t m = {
        .type = KRT_MSG_USER + 7, .len = (uint32_t)len, .from = (1ull << 48) | 12345, .body = body};
    uint64_t check = 0;
    double t0 = s_now();
    for (uint64_t i = 0; i < CODEC_N; i++) {
        size_t n;
        m.ref = i;
        int rc = krt_envelope_encode_buf(buf, sizeof buf, (2ull << 48) | i, &m, &n);
        krt_addr_t to;
        krt_msg_t got;
        rc |= krt_envelope_decode(buf, n, &to, &got);
        if (rc)
            s_die("envelope", rc);
        check += got.ref + to;
    }
    double dt = s_now() - t0;
    if (check == 0)
        s_die("envelope check", KRT_EINVAL);
    return CODEC_N / dt;
}

/* Node 2: echoes pings, counts the stream and reports when complete. */
typedef struct echo {
    uint64_t streamed;
} echo_t;

static void echo_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    echo_t *st = state;
    if (msg->type == T_PING)
        krt_send(ctx, msg->from, T_PONG, msg->body, msg->len);
    else if (msg->type == T_STREAM && ++st->streamed == STREAM_N)
        krt_send(ctx, msg->from, T_DONE, NULL, 0);
}

static const krt_behaviour_t s_echo = {
    .kind = "echo", .state_size = sizeof(echo_t), .handle = echo_handle};

typedef struct run {
    krt_addr_t target;
    double t_pp0, t_pp1, t_st1;
} run_t;

typedef struct driver {
    run_t *r;
    uint64_t n;
} driver_t;

static int drv_init(krt_ctx_t *ctx, void *state, void *arg)
{
    driver_t *st = state;
    st->r = arg;
    st->r->t_pp0 = s_now();
    return krt_send(ctx, st->r->target, T_PING, &st->n, sizeof st->n) ? KRT_EXIT_ERROR : 0;
}

static void drv_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    driver_t *st = state;
    if (msg->type == T_PONG) {
        if (++st->n < PINGPONG_N) {
            krt_send(ctx, st->r->target, T_PING, &st->n, sizeof st->n);
            return;
        }
        st->r->t_pp1 = s_now();
        uint64_t payload[4] = {0};
        for (uint64_t i = 0; i < STREAM_N; i++) {
            payload[0] = i;
            krt_send(ctx, st->r->target, T_STREAM, payload, sizeof payload);
        }
    } else if (msg->type == T_DONE) {
        st->r->t_st1 = s_now();
        krt_exit(ctx, KRT_EXIT_NORMAL);
    }
}

static const krt_behaviour_t s_driver = {
    .kind = "driver", .state_size = sizeof(driver_t), .init = drv_init, .handle = drv_handle};

int main(void)
{
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    double codec16 = s_codec(16);
    double codec256 = s_codec(256);

    char dir[] = "/tmp/krt-bench-mesh-XXXXXX";
    if (!mkdtemp(dir))
        s_die("mkdtemp", -errno);
    char ep[2][96];
    krt_system_t *sys[2];
    krt_mesh_t *mesh[2];
    for (int i = 0; i < 2; i++) {
        krt_config_t cfg = {.node_id = (uint16_t)(i + 1), .schedulers = 1, .job_threads = 1};
        sys[i] = krt_system_new(&cfg);
        if (!sys[i])
            s_die("krt_system_new", KRT_ENOMEM);
        int rc = krt_system_start(sys[i]);
        if (rc)
            s_die("krt_system_start", rc);
        snprintf(ep[i], sizeof ep[i], "ipc://%s/n%d", dir, i + 1);
        krt_mesh_config_t mc = {.bind = ep[i], .queue_limit = 2 * STREAM_N};
        mesh[i] = krt_mesh_new(sys[i], &mc);
        if (!mesh[i])
            s_die("krt_mesh_new", KRT_EINVAL);
        if ((rc = krt_mesh_start(mesh[i])) != 0)
            s_die("krt_mesh_start", rc);
    }
    for (int i = 0; i < 2; i++) {
        int rc = krt_mesh_connect(mesh[i], (uint16_t)(2 - i), ep[1 - i], NULL);
        if (rc)
            s_die("krt_mesh_connect", rc);
    }
    run_t r = {0};
    int rc = krt_system_spawn(sys[1], &s_echo, NULL, NULL, &r.target);
    krt_addr_t d;
    rc = rc ? rc : krt_system_spawn(sys[0], &s_driver, &r, NULL, &d);
    if (rc)
        s_die("spawn", rc);
    if (krt_system_wait(sys[0], d, 120000) != KRT_EXIT_NORMAL)
        s_die("wait", KRT_ETIMEDOUT);
    krt_mesh_stats_t st;
    krt_mesh_stats(mesh[0], &st);
    for (int i = 0; i < 2; i++)
        krt_mesh_stop(mesh[i]);
    for (int i = 0; i < 2; i++) {
        krt_system_destroy(&sys[i]);
        krt_mesh_destroy(&mesh[i]);
    }
    rmdir(dir);
    if (st.dropped)
        s_die("stream (messages dropped)", KRT_ENOMEM);

    double pp = 2.0 * PINGPONG_N / (r.t_pp1 - r.t_pp0);
    double rtt_us = (r.t_pp1 - r.t_pp0) / PINGPONG_N * 1e6;
    double stream = STREAM_N / (r.t_st1 - r.t_pp1);
    printf("| figure | value |\n|---|---|\n");
    printf("| codec envelope encode+decode, 16 B body | %.0f envelopes/s |\n", codec16);
    printf("| codec envelope encode+decode, 256 B body | %.0f envelopes/s |\n", codec256);
    printf("| remote ping-pong over ipc (1 in flight) | %.0f msgs/s (%.1f us round trip) |\n", pp,
           rtt_us);
    printf("| remote one-way stream over ipc, 32 B body | %.0f msgs/s |\n", stream);
    printf("BENCH name=mesh_codec_envelope_16b value=%.0f unit=envelopes/s\n", codec16);
    printf("BENCH name=mesh_codec_envelope_256b value=%.0f unit=envelopes/s\n", codec256);
    printf("BENCH name=mesh_pingpong_ipc value=%.0f unit=msgs/s\n", pp);
    printf("BENCH name=mesh_stream_ipc value=%.0f unit=msgs/s\n", stream);
    return 0;
}
