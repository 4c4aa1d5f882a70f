/*
 * kagentd: one node of the sandbox service.
 *
 *   kagentd [--config FILE] [--check-config | --print-config]
 *   kagentd --version | --help
 *
 * Loads and validates the configuration, starts the actor runtime and the node's actors, and
 * runs until SIGINT or SIGTERM, then stops everything in reverse order and exits 0. SIGHUP
 * re-reads the TLS certificate, key and client CA (listen.tls).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "host_limits.h"
#include "images_cli.h"
#include "krt.h"
#include "node.h"

static const char *s_usage =
    "Usage: kagentd [--config FILE] [--check-config | --print-config]\n"
    "       kagentd [--config FILE] image import|build|list|rm|pull ... (the node's image store)\n"
    "       kagentd --version | --help\n"
    "\n"
    "One node of the kagent sandbox service: the actor runtime, the control plane, the\n"
    "sandbox substrate and the gRPC/MCP bridges on one port.\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE   node configuration (YAML); every key is documented in\n"
    "                      deploy/kagentd.example.yaml. Without it, built-in defaults.\n"
    "      --check-config  validate the configuration and exit (0 valid, 1 invalid)\n"
    "      --print-config  print the effective configuration as YAML and exit\n"
    "  -V, --version       print the version and exit\n"
    "  -h, --help          print this help and exit\n"
    "\n"
    "Signals: SIGINT or SIGTERM stop the node cleanly; SIGHUP re-reads the TLS certificate,\n"
    "key and client CA files (listen.tls) for new connections.\n";

typedef struct {
    const char *config_path;
    bool check_only;
    bool print_only;
} s_args_t;

/* Returns -1 to continue, or an exit status. */
static int s_parse_args(int argc, char **argv, s_args_t *args)
{
    enum { OPT_CHECK = 256, OPT_PRINT };
    static const struct option opts[] = {{"config", required_argument, NULL, 'c'},
                                         {"check-config", no_argument, NULL, OPT_CHECK},
                                         {"print-config", no_argument, NULL, OPT_PRINT},
                                         {"version", no_argument, NULL, 'V'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "+c:Vh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            args->config_path = optarg;
            break;
        case OPT_CHECK:
            args->check_only = true;
            break;
        case OPT_PRINT:
            args->print_only = true;
            break;
        case 'V':
            printf("kagentd %s\n", KAGENT_VERSION);
            return 0;
        case 'h':
            fputs(s_usage, stdout);
            return 0;
        default:
            fputs("Try 'kagentd --help'.\n", stderr);
            return 2;
        }
    }
    if (optind < argc && strcmp(argv[optind], "image") != 0) {
        fprintf(stderr, "kagentd: unexpected argument '%s'\nTry 'kagentd --help'.\n", argv[optind]);
        return 2;
    }
    return -1;
}

static int s_load_config(const s_args_t *args, ka_config_t *cfg)
{
    char err[KA_CFG_ERR_CAP];
    int rc;
    if (args->config_path) {
        rc = ka_config_load_file(cfg, args->config_path, err, sizeof err);
    } else {
        ka_config_defaults(cfg);
        rc = ka_config_validate(cfg, err, sizeof err);
    }
    if (rc)
        fprintf(stderr, "kagentd: invalid configuration: %s\n", err);
    return rc;
}

/* Blocks the node's signals in every thread; the main thread takes them with sigwait. */
static void s_block_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* SIGHUP: the TLS files again; a failure is logged and changes nothing. */
static void s_reload(ka_node_t *node, const ka_config_t *cfg)
{
    char err[KA_NODE_ERR_CAP];
    if (ka_node_reload_tls(node, err, sizeof err))
        krt_log(KRT_LOG_ERROR, cfg->node_name, "reload_failed", "error=\"%s\"", err);
    else
        krt_log(KRT_LOG_INFO, cfg->node_name, "reloaded", "what=tls cert=%s", cfg->tls_cert_file);
}

/* The descriptors and host tasks the pools' capacity needs; short of them the node still runs
 * (a create past them fails with the errno), so a failure to raise is a warning. */
static void s_raise_limits(const ka_config_t *cfg)
{
    char note[256];
    int rc = ka_host_limits_raise(cfg, note, sizeof note);
    if (rc < 0)
        krt_log(KRT_LOG_WARN, cfg->node_name, "limits_short", "capacity=%lld %s error=\"%s\"",
                (long long)ka_host_capacity(cfg), note, strerror(-rc));
    else if (note[0])
        krt_log(KRT_LOG_INFO, cfg->node_name, "limits_raised", "capacity=%lld %s",
                (long long)ka_host_capacity(cfg), note);
}

static int s_run(const ka_config_t *cfg)
{
    sigset_t signals;
    s_block_signals(&signals);
    s_raise_limits(cfg);
    char err[KA_NODE_ERR_CAP];
    ka_node_t *node = ka_node_start(cfg, err, sizeof err);
    if (!node) {
        krt_log(KRT_LOG_ERROR, cfg->node_name, "start_failed", "error=\"%s\"", err);
        fprintf(stderr, "kagentd: %s\n", err);
        return 1;
    }
    krt_log(KRT_LOG_INFO, cfg->node_name, "started",
            "version=%s pid=%d listen=%s:%d state_dir=%s database=%s tls=%s node_id=%d",
            KAGENT_VERSION, (int)getpid(), cfg->listen_address, ka_node_port(node), cfg->state_dir,
            cfg->database_url[0] ? "external" : "embedded", ka_config_tls(cfg) ? "on" : "off",
            ka_node_id(node));
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGHUP)
        s_reload(node, cfg);
    krt_log(KRT_LOG_INFO, cfg->node_name, "stopping", "signal=%s", strsignal(sig));
    ka_node_stop(&node);
    krt_log(KRT_LOG_INFO, cfg->node_name, "stopped", NULL);
    return 0;
}

/* `kagentd [--config FILE] image ...`: the node's image store, offline. */
static int s_image_cli(const s_args_t *args, int argc, char **argv)
{
    ka_config_t *cfg = malloc(sizeof *cfg);
    char err[KA_CFG_ERR_CAP];
    int rc = 1;
    if (!cfg)
        return 1;
    ka_config_defaults(cfg);
    if (args->config_path && ka_config_load_file(cfg, args->config_path, err, sizeof err)) {
        /* an image command must work before the guest digest exists: retry without checks */
        fprintf(stderr, "kagentd: invalid configuration: %s\n", err);
    } else {
        rc = ka_images_cli(cfg->state_dir, argc, argv);
    }
    free(cfg);
    return rc;
}

int main(int argc, char **argv)
{
    s_args_t args = {0};
    int rc = s_parse_args(argc, argv, &args);
    if (rc >= 0)
        return rc;
    if (optind < argc) /* "image": the subcommand takes the rest */
        return s_image_cli(&args, argc - optind, argv + optind);
    ka_config_t *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        fputs("kagentd: out of memory\n", stderr);
        return 1;
    }
    if (s_load_config(&args, cfg)) {
        free(cfg);
        return 1;
    }
    krt_log_configure((krt_log_level_t)cfg->log_level, cfg->log_json, NULL);
    if (args.print_only)
        ka_config_print(cfg, stdout);
    else if (args.check_only)
        printf("kagentd: configuration is valid\n");
    else
        rc = s_run(cfg);
    free(cfg);
    return rc < 0 ? 0 : rc;
}
