/* gRPC bridge benchmark client (gRPC C core, the same client path the kagent CLI uses).
 *
 *   bench_grpc PORT [SEQ_CALLS] [CONC_CALLS] [IN_FLIGHT] [SUFFIX]
 *
 * Against kb_test_server on the shared port (listener -> kb_grpc): unary
 * /kbtest.TestService/Ping with an empty request, first SEQ_CALLS one after another (latency
 * p50/p99 and round trips/s), then CONC_CALLS with IN_FLIGHT outstanding (round trips/s).
 * Prints a table and BENCH lines (no peer); SUFFIX is appended to the BENCH names. With
 * BENCH_GRPC_CA=FILE (PEM) the channel is TLS, verifying the server against that CA for the
 * name "localhost". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

static double s_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

typedef struct {
    grpc_call *call;
    grpc_metadata_array init_md, trail_md;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice details;
} s_call_t;

/* Starts one Ping call whose completion posts tag to cq. */
static int s_start(grpc_channel *ch, grpc_completion_queue *cq, s_call_t *c, void *tag)
{
    memset(c, 0, sizeof *c);
    c->call = grpc_channel_create_call(
        ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
        grpc_slice_from_static_string("/kbtest.TestService/Ping"), NULL,
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(30, GPR_TIMESPAN)), NULL);
    grpc_metadata_array_init(&c->init_md);
    grpc_metadata_array_init(&c->trail_md);
    grpc_slice empty = grpc_empty_slice();
    c->send = grpc_raw_byte_buffer_create(&empty, 1);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->trail_md;
    ops[5].data.recv_status_on_client.status = &c->status;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    return grpc_call_start_batch(c->call, ops, 6, tag, NULL) == GRPC_CALL_OK ? 0 : -1;
}

/* Releases a finished call; returns its status. */
static int s_finish(s_call_t *c)
{
    int st = c->status;
    grpc_byte_buffer_destroy(c->send);
    if (c->recv)
        grpc_byte_buffer_destroy(c->recv);
    grpc_slice_unref(c->details);
    grpc_metadata_array_destroy(&c->init_md);
    grpc_metadata_array_destroy(&c->trail_md);
    grpc_call_unref(c->call);
    return st;
}

/* Insecure, or TLS with the roots in $BENCH_GRPC_CA. NULL if that file cannot be read. */
static grpc_channel_credentials *s_creds(void)
{
    const char *ca = getenv("BENCH_GRPC_CA");
    if (!ca)
        return grpc_insecure_credentials_create();
    FILE *f = fopen(ca, "r");
    static char roots[64 * 1024];
    size_t n = f ? fread(roots, 1, sizeof roots - 1, f) : 0;
    if (f)
        fclose(f);
    if (!n) {
        fprintf(stderr, "bench_grpc: cannot read BENCH_GRPC_CA %s\n", ca);
        return NULL;
    }
    roots[n] = '\0';
    return grpc_ssl_credentials_create(roots, NULL, NULL, NULL);
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT [SEQ_CALLS] [CONC_CALLS] [IN_FLIGHT]\n", argv[0]);
        return 2;
    }
    int seq_n = argc > 2 ? atoi(argv[2]) : 5000;
    int conc_n = argc > 3 ? atoi(argv[3]) : 20000;
    int inflight = argc > 4 ? atoi(argv[4]) : 16;
    const char *sfx = argc > 5 ? argv[5] : "";
    const char *where = strstr(sfx, "direct") ? "gRPC core's own port"
                        : strstr(sfx, "tls")  ? "shared port over TLS"
                                              : "shared port";
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%s", argv[1]);
    grpc_init();
    grpc_channel_credentials *cc = s_creds();
    if (!cc)
        return 1;
    grpc_arg name = {.type = GRPC_ARG_STRING,
                     .key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
                     .value.string = (char *)"localhost"};
    grpc_channel_args args = {.num_args = getenv("BENCH_GRPC_CA") ? 1 : 0, .args = &name};
    grpc_channel *ch = grpc_channel_create(target, cc, &args);
    grpc_channel_credentials_release(cc);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    gpr_timespec forever = gpr_inf_future(GPR_CLOCK_REALTIME);
    int failures = 0;

    /* warm-up: connection set up, code paths hot */
    for (int i = 0; i < 200; i++) {
        s_call_t c;
        if (s_start(ch, cq, &c, &c) < 0)
            return 1;
        grpc_completion_queue_next(cq, forever, NULL);
        failures += s_finish(&c) != GRPC_STATUS_OK;
    }

    double *lat = calloc((size_t)seq_n, sizeof *lat);
    double t0 = s_now_us();
    for (int i = 0; i < seq_n; i++) {
        s_call_t c;
        double a = s_now_us();
        if (s_start(ch, cq, &c, &c) < 0)
            return 1;
        grpc_completion_queue_next(cq, forever, NULL);
        lat[i] = s_now_us() - a;
        failures += s_finish(&c) != GRPC_STATUS_OK;
    }
    double seq_s = (s_now_us() - t0) / 1e6;
    qsort(lat, (size_t)seq_n, sizeof *lat, s_cmp);
    double p50 = lat[seq_n / 2], p99 = lat[(size_t)(seq_n * 0.99)];

    s_call_t *calls = calloc((size_t)inflight, sizeof *calls);
    int started = 0, done = 0;
    t0 = s_now_us();
    for (; started < inflight && started < conc_n; started++)
        s_start(ch, cq, &calls[started], &calls[started]);
    while (done < conc_n) {
        grpc_event ev = grpc_completion_queue_next(cq, forever, NULL);
        s_call_t *c = ev.tag;
        failures += s_finish(c) != GRPC_STATUS_OK;
        done++;
        if (started < conc_n) {
            s_start(ch, cq, c, c);
            started++;
        }
    }
    double conc_s = (s_now_us() - t0) / 1e6;

    printf("| figure (C-core client, unary Ping, empty request, %s) | value |\n", where);
    printf("|---|---|\n");
    printf("| sequential round trips/s (%d calls) | %.0f |\n", seq_n, seq_n / seq_s);
    printf("| sequential latency p50 | %.1f us |\n", p50);
    printf("| sequential latency p99 | %.1f us |\n", p99);
    printf("| round trips/s with %d in flight (%d calls) | %.0f |\n", inflight, conc_n,
           conc_n / conc_s);
    printf("| failed calls | %d |\n", failures);
    printf("BENCH name=grpc_unary_seq_rps%s value=%.0f unit=calls/s\n", sfx, seq_n / seq_s);
    printf("BENCH name=grpc_unary_p50%s value=%.1f unit=us\n", sfx, p50);
    printf("BENCH name=grpc_unary_p99%s value=%.1f unit=us\n", sfx, p99);
    printf("BENCH name=grpc_unary_concurrent_rps%s value=%.0f unit=calls/s\n", sfx,
           conc_n / conc_s);

    free(lat);
    free(calls);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, forever, NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
    return failures ? 1 : 0;
}
