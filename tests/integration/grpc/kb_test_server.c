/* kb_test_server: the shared-port stack as kagentd will run it (listener + gRPC server with
 * reflection + HTTP side) serving kbtest.TestService, for the integration tests and benchmark.
 *
 *   kb_test_server [--host H] [--port N] [--protoset FILE] [--not-ready] [--grpc-addr H:P]
 *
 * --grpc-addr also binds gRPC core's own listener there (no shared port), for comparisons.
 * --tls-cert FILE --tls-key FILE serve the shared port over TLS (the listener's relay).
 * Prints "PORT <n>" on stdout once serving; SIGTERM/SIGINT shut down cleanly (exit 0).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grpc_reflection.h"
#include "grpc_server.h"
#include "http.h"
#include "krt.h"
#include "listener.h"
#include "test_service.h"

typedef struct {
    kb_grpc_server_t *grpc;
    kb_http_t *http;
    kb_listener_t *listener;
    kb_tls_t *tls; /* --tls-cert/--tls-key; NULL = cleartext */
    bool ready;
} s_app_t;

static void s_to_grpc(int fd, const struct sockaddr *peer, socklen_t len, void *arg)
{
    s_app_t *app = arg;
    kb_grpc_server_add_fd(app->grpc, fd);
}

static void s_to_http(int fd, const struct sockaddr *peer, socklen_t len, void *arg)
{
    s_app_t *app = arg;
    kb_http_add_connection(app->http, fd, peer, len);
}

static bool s_ready(void *arg)
{
    s_app_t *app = arg;
    return app->ready;
}

static int s_metrics(kb_http_buf_t *b, void *arg)
{
    s_app_t *app = arg;
    kb_grpc_stats_t g;
    kb_grpc_server_stats(app->grpc, &g);
    kb_listener_stats_t l = {0};
    if (app->listener)
        kb_listener_stats(app->listener, &l);
    int rc = 0;
    rc |= kb_http_buf_printf(b,
                             "# HELP kagent_grpc_calls_started_total gRPC calls received.\n"
                             "# TYPE kagent_grpc_calls_started_total counter\n"
                             "kagent_grpc_calls_started_total %llu\n",
                             (unsigned long long)g.calls_started);
    rc |= kb_http_buf_printf(b,
                             "# HELP kagent_grpc_calls_cancelled_total gRPC calls cancelled.\n"
                             "# TYPE kagent_grpc_calls_cancelled_total counter\n"
                             "kagent_grpc_calls_cancelled_total %llu\n",
                             (unsigned long long)g.calls_cancelled);
    rc |= kb_http_buf_printf(b,
                             "# HELP kagent_grpc_calls_live gRPC calls in flight.\n"
                             "# TYPE kagent_grpc_calls_live gauge\n"
                             "kagent_grpc_calls_live %llu\n",
                             (unsigned long long)g.calls_live);
    rc |= kb_http_buf_printf(b,
                             "# HELP kagent_listener_connections_total Connections by protocol.\n"
                             "# TYPE kagent_listener_connections_total counter\n"
                             "kagent_listener_connections_total{protocol=\"grpc\"} %llu\n"
                             "kagent_listener_connections_total{protocol=\"http\"} %llu\n",
                             (unsigned long long)l.to_grpc, (unsigned long long)l.to_http);
    return rc ? -ENOMEM : 0;
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *protoset = NULL, *grpc_addr = NULL;
    kb_tls_files_t tls_files = {0};
    int port = 0;
    bool not_ready = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--host") == 0 && i + 1 < argc)
            host = argv[++i];
        else if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
            port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--protoset") == 0 && i + 1 < argc)
            protoset = argv[++i];
        else if (strcmp(argv[i], "--grpc-addr") == 0 && i + 1 < argc)
            grpc_addr = argv[++i];
        else if (strcmp(argv[i], "--tls-cert") == 0 && i + 1 < argc)
            tls_files.cert_file = argv[++i];
        else if (strcmp(argv[i], "--tls-key") == 0 && i + 1 < argc)
            tls_files.key_file = argv[++i];
        else if (strcmp(argv[i], "--not-ready") == 0)
            not_ready = true;
        else {
            fprintf(stderr,
                    "usage: %s [--host H] [--port N] [--protoset FILE] [--not-ready] "
                    "[--grpc-addr H:P] [--tls-cert FILE --tls-key FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    /* signals go to sigwait below, not to the library threads */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int status = 1;
    s_app_t app = {0};
    kbt_service_t *svc = kbt_service_new();
    kb_grpc_reflection_t *refl = kb_grpc_reflection_new();
    if (!svc || !refl)
        goto out;
    if (kb_grpc_reflection_add_set(refl, kb_grpc_protoset, kb_grpc_protoset_len) < 0) {
        fprintf(stderr, "kb_test_server: embedded descriptor set unreadable\n");
        goto out;
    }
    if (protoset && kb_grpc_reflection_add_file(refl, protoset) < 0) {
        fprintf(stderr, "kb_test_server: cannot read descriptor set %s\n", protoset);
        goto out;
    }
    kb_grpc_options_t gopts = {.listen_addr = grpc_addr};
    app.grpc = kb_grpc_server_new(&gopts);
    if (!app.grpc || kbt_service_register(svc, app.grpc) < 0 ||
        kb_grpc_reflection_register(refl, app.grpc) < 0 || kb_grpc_server_start(app.grpc) < 0)
        goto out;
    kb_http_options_t hopts = {.ready = s_ready, .metrics = s_metrics, .arg = &app};
    app.http = kb_http_new(&hopts);
    if (!app.http)
        goto out;
    char tls_err[KB_TLS_ERR_CAP];
    if (tls_files.cert_file && !(app.tls = kb_tls_new(&tls_files, tls_err, sizeof tls_err))) {
        fprintf(stderr, "kb_test_server: %s\n", tls_err);
        goto out;
    }
    kb_listener_options_t lopts = {.host = host,
                                   .port = port,
                                   .peek_timeout_ms = 2000,
                                   .on_grpc = s_to_grpc,
                                   .on_http = s_to_http,
                                   .arg = &app,
                                   .tls = app.tls};
    int err = 0;
    app.listener = kb_listener_new(&lopts, &err);
    if (!app.listener) {
        fprintf(stderr, "kb_test_server: cannot listen on %s:%d: %s\n", host, port, strerror(-err));
        status = 3;
        goto out;
    }
    app.ready = !not_ready;
    printf("PORT %d\n", kb_listener_port(app.listener));
    if (grpc_addr)
        printf("GRPC_PORT %d\n", kb_grpc_server_port(app.grpc));
    fflush(stdout);
    int sig = 0;
    sigwait(&sigs, &sig);
    status = 0;
out:
    /* order: stop new connections, then calls, then the HTTP side, then the handlers' worker */
    kb_listener_destroy(&app.listener);
    kb_grpc_server_destroy(&app.grpc);
    kb_http_destroy(&app.http);
    kbt_service_destroy(&svc);
    kb_grpc_reflection_destroy(&refl);
    kb_tls_destroy(&app.tls);
    return status;
}
