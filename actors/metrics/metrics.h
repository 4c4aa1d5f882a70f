/*
 * ka_metrics: the node's Prometheus histograms, process-wide. Each family has a fixed name,
 * help, bucket bounds (seconds) and up to two label names; a series is one set of label values.
 * Observing is thread-safe (one mutex per family, a few hundred nanoseconds) and allocates
 * nothing. A family holds at most KA_METRIC_MAX_SERIES series; values past that are counted
 * under the label values "other" so the exposition stays bounded whatever callers send.
 *
 * Exposition follows the text format 0.0.4 (`_bucket{le=...}`, `_sum`, `_count`), checked by
 * `promtool check metrics` in tests/integration/node/metrics_promtool.sh.
 */
#ifndef KA_METRICS_H
#define KA_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KA_METRIC_MAX_SERIES 128
#define KA_METRIC_LABEL_MAX  96 /* one label value, longer ones are cut */
#define KA_METRIC_N_BOUNDS   17

typedef enum {
    KA_METRIC_SANDBOX_CREATE, /* kagent_sandbox_create_seconds: create call until READY */
    KA_METRIC_SANDBOX_PHASE,  /* kagent_sandbox_phase_seconds{phase} (ka_phases) */
    KA_METRIC_GUEST_CALL,     /* kagent_guest_call_seconds{op,code}: exec round trip is op=start */
    KA_METRIC_GRPC,           /* kagent_grpc_request_seconds{method,code} */
    KA_METRIC_MCP,            /* kagent_mcp_request_seconds{method,code} */
    KA_METRIC_STORE,          /* kagent_store_query_seconds{query,result} */
    KA_METRIC_WARM_REFILL,    /* kagent_warm_pool_refill_seconds{pool}: one warm boot */
    KA_METRIC_SNAPSHOT,       /* kagent_snapshot_seconds{op,result}: op suspend or resume */
    KA_METRIC_FORK,           /* kagent_sandbox_fork_seconds{result}: a fork call's copy */
    KA_METRIC_N_
} ka_metric_t;

/* Adds one observation. v1/v2 are the family's label values (NULL = ""; ignored past the
 * family's label count). */
void ka_metric_observe(ka_metric_t m, const char *v1, const char *v2, double seconds);

/* A snapshot save (op "suspend"), restore ("resume") or fork copy ("fork") ended, ok or not:
 * its duration into kagent_snapshot_seconds{op,result} (kagent_sandbox_fork_seconds{result}
 * for a fork) and its bytes into the counter kagent_snapshot_bytes_total{op}
 * (kagent_sandbox_fork_bytes_total). Other ops are ignored. */
void ka_metric_job(const char *op, bool ok, double seconds, uint64_t bytes);

/* The canonical gRPC name of a status code ("OK", "NOT_FOUND", ...; "UNKNOWN" past them): the
 * code label of every family. */
const char *ka_metric_code_name(int code);

/* Monotonic seconds, for durations given to ka_metric_observe. */
double ka_metric_now(void);

/* A family summed over its series whose first label value is v1 (NULL: all series):
 * cumulative counts per bound (KA_METRIC_N_BOUNDS, the last is +Inf), sum and count.
 * bounds (may be NULL) receives the upper bounds. */
typedef struct {
    double bounds[KA_METRIC_N_BOUNDS];
    uint64_t buckets[KA_METRIC_N_BOUNDS];
    uint64_t count;
    double sum;
} ka_metric_snapshot_t;
void ka_metric_snapshot(ka_metric_t m, const char *v1, ka_metric_snapshot_t *out);

/* The text exposition of every family, or NULL on allocation failure. Free with free(). */
char *ka_metrics_text(void);

/* The standard process_* metrics (cpu, resident and virtual memory, open and max fds, start
 * time) of the calling process, from /proc/self. NULL on allocation failure. Free with free(). */
char *ka_metrics_process_text(void);

/* Resident memory of this process in bytes (0 if /proc cannot be read). */
uint64_t ka_metrics_rss_bytes(void);

/* Forgets every observation (tests). */
void ka_metrics_reset(void);

#endif
