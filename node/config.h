/*
 * ka_config: the node configuration (kagentd --config FILE), parsed from YAML and validated.
 *
 * Every key is documented in deploy/kagentd.example.yaml. Unknown keys and wrong types are
 * refused with the key's dotted path and line. Modules never read this struct directly: the
 * node's main maps it onto each module's own options.
 */
#ifndef KA_CONFIG_H
#define KA_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KA_CFG_ERR_CAP       512
#define KA_CFG_NAME_MAX      64
#define KA_CFG_PATH_MAX      512
#define KA_CFG_URL_MAX       1024
#define KA_CFG_MAX_POOLS     16
#define KA_CFG_MAX_REGS      16
#define KA_CFG_MAX_HOSTS     16
#define KA_CFG_MAX_OPERATORS 32
#define KA_CFG_ID_MAX        256 /* an identity and its NUL (kb_auth: 255) */
#define KA_DEFAULT_POOL      "kagent-default"
#define KA_DEFAULT_PORT      8083
#define KA_DEFAULT_WARM      2 /* pools[].warm */

typedef enum { KA_AUTH_USER_HEADER, KA_AUTH_TOKENS } ka_auth_mode_t;

typedef struct ka_pool_cfg {
    char name[KA_CFG_NAME_MAX];  /* WorkerPool name */
    char klass[KA_CFG_NAME_MAX]; /* sandbox class: "namespaces" */
    int64_t capacity;            /* sandboxes this node serves for the pool */
    int64_t warm;                /* pre-started sandboxes per template revision; 0: none */
} ka_pool_cfg_t;

typedef struct ka_registry_cfg {
    char host[KA_CFG_NAME_MAX * 2]; /* registry host as written in image references */
    char endpoint[KA_CFG_URL_MAX];  /* where to fetch it from (mirror), http(s)://host:port */
    bool insecure;                  /* allow plain http / unverified TLS */
} ka_registry_cfg_t;

typedef struct ka_config {
    /* node */
    char node_name[KA_CFG_NAME_MAX];
    int64_t node_id;
    char state_dir[KA_CFG_PATH_MAX];
    /* listen */
    char listen_address[KA_CFG_NAME_MAX];
    int64_t listen_port;
    char tls_cert_file[KA_CFG_PATH_MAX];      /* PEM chain; "" = cleartext port */
    char tls_key_file[KA_CFG_PATH_MAX];       /* PEM key of the certificate */
    char tls_client_ca_file[KA_CFG_PATH_MAX]; /* "" = no client certificates (mTLS off) */
    bool tls_require_client_cert;             /* with a client CA: refuse clients without one */
    /* log */
    int log_level; /* krt_log_level_t */
    bool log_json;
    /* runtime */
    int64_t schedulers;
    int64_t job_threads;
    /* database */
    char database_url[KA_CFG_URL_MAX]; /* empty: the embedded default cluster */
    /* auth */
    ka_auth_mode_t auth_mode;
    char tokens_file[KA_CFG_PATH_MAX];
    /* identities that see every sandbox on /ui (others see only their own) */
    char operators[KA_CFG_MAX_OPERATORS][KA_CFG_ID_MAX];
    size_t n_operators;
    /* sandbox: operator policy (templates cannot override it) */
    char sandbox_class[KA_CFG_NAME_MAX];
    char guest_image_digest[KA_CFG_NAME_MAX * 2]; /* sha256:<64 hex>, required */
    int64_t cpu_millis;
    int64_t memory_bytes;
    int64_t default_ttl_ms;
    int64_t max_ttl_ms;
    int64_t max_processes;
    int64_t process_timeout_ms;
    int64_t spool_bytes;
    int64_t pids_max;
    int64_t disk_bytes;     /* /data and changes to the root together */
    int64_t disk_inodes;    /* files on that disk; 0: one per 16 KiB of disk_bytes */
    int64_t max_open_files; /* RLIMIT_NOFILE of every process in a sandbox */
    int64_t uid_base;       /* sandbox i runs as host uid = gid uid_base + i */
    int64_t uid_count;
    /* pools */
    ka_pool_cfg_t pools[KA_CFG_MAX_POOLS];
    size_t n_pools;
    /* images */
    ka_registry_cfg_t registries[KA_CFG_MAX_REGS];
    size_t n_registries;
    /* mcp */
    char allowed_hosts[KA_CFG_MAX_HOSTS][KA_CFG_NAME_MAX * 2];
    size_t n_allowed_hosts;
    /* mesh */
    char mesh_bind[KA_CFG_URL_MAX];
    char mesh_advertise[KA_CFG_URL_MAX]; /* the endpoint peers connect to ("" = the bound one) */
    int64_t lease_ms;                    /* the node's lease in the node table */
    int64_t renew_ms;                    /* ... renewed this often */
    int64_t forget_ms;                   /* a dead node's row goes this long after its lease */
    /* snapshots: object storage credentials overriding kagentd's AWS_* environment */
    char snapshot_credentials_file[KA_CFG_PATH_MAX];
} ka_config_t;

/* Fills cfg with the defaults every key documents. */
void ka_config_defaults(ka_config_t *cfg);
/* Defaults, then the YAML text on top, then validation. 0, or -EINVAL with err set to
 * "<file>:<line>: <key.path>: <what>". `origin` names the source in errors. */
int ka_config_load_buffer(ka_config_t *cfg, const char *origin, const char *yaml, size_t len,
                          char *err, size_t errcap);
int ka_config_load_file(ka_config_t *cfg, const char *path, char *err, size_t errcap);
/* Checks cross-key rules (ttl ordering, digest format, ranges). 0 or -EINVAL with err. */
int ka_config_validate(const ka_config_t *cfg, char *err, size_t errcap);
/* True if the node serves TLS (listen.tls.certFile set). */
bool ka_config_tls(const ka_config_t *cfg);
/* True if address is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z) or "localhost". */
bool ka_config_loopback(const char *address);
/* Writes the effective configuration as YAML (for --print-config). */
void ka_config_print(const ka_config_t *cfg, FILE *out);

/* Value parsers shared with other YAML readers. 0 or -EINVAL. */
int ka_parse_duration_ms(const char *s, int64_t *out); /* "90s", "1h", "500ms", "1h30m" */
int ka_parse_bytes(const char *s, int64_t *out);       /* "1Gi", "512Mi", "10M", "4096" */
int ka_parse_cpu_millis(const char *s, int64_t *out);  /* "1", "0.5", "500m" */

#endif
