/* ka_metrics: labelled histograms and process metrics. See metrics.h. */
#include "metrics.h"

#include "ka_errors.h"

#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char v[2][KA_METRIC_LABEL_MAX];
    uint64_t buckets[KA_METRIC_N_BOUNDS]; /* per bucket (not cumulative) */
    uint64_t count;
    double sum;
} s_series_t;

typedef struct {
    const char *name;
    const char *help;
    const char *labels[2]; /* NULL: unused */
    pthread_mutex_t mu;
    size_t n;
    s_series_t series[KA_METRIC_MAX_SERIES];
} s_family_t;

/* Upper bounds in seconds, from half a millisecond to a minute; the last is +Inf. */
static const double s_bounds[KA_METRIC_N_BOUNDS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 0};

static s_family_t s_families[KA_METRIC_N_] = {
    [KA_METRIC_SANDBOX_CREATE] = {"kagent_sandbox_create_seconds",
                                  "Time from a sandbox create call to its READY answer.",
                                  {NULL, NULL},
                                  PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_SANDBOX_PHASE] = {"kagent_sandbox_phase_seconds",
                                 "Duration of one lifecycle phase of a sandbox (store_intent, "
                                 "compute_start, guest_ready, suspend_upload, resume_download).",
                                 {"phase", NULL},
                                 PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_GUEST_CALL] = {"kagent_guest_call_seconds",
                              "Round trip of a call into a sandbox's guest (op start is exec).",
                              {"op", "code"},
                              PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_GRPC] = {"kagent_grpc_request_seconds",
                        "gRPC calls served, by full method and status code.",
                        {"method", "code"},
                        PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_MCP] = {"kagent_mcp_request_seconds",
                       "MCP JSON-RPC requests served, by method (tools/call: the tool) and result.",
                       {"method", "code"},
                       PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_STORE] = {"kagent_store_query_seconds",
                         "PostgreSQL store requests, by request kind and result.",
                         {"query", "result"},
                         PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_WARM_REFILL] = {"kagent_warm_pool_refill_seconds",
                               "Time to boot one warm sandbox for a pool (refill latency).",
                               {"pool", NULL},
                               PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_SNAPSHOT] = {"kagent_snapshot_seconds",
                            "Snapshot copies of a sandbox's /data: suspend saves, resume "
                            "restores, by result.",
                            {"op", "result"},
                            PTHREAD_MUTEX_INITIALIZER},
    [KA_METRIC_FORK] = {"kagent_sandbox_fork_seconds",
                        "Copies of a frozen sandbox for the forks of one fork call, by result.",
                        {"result", NULL},
                        PTHREAD_MUTEX_INITIALIZER},
};

/* Bytes the snapshot and fork copies moved (counters): suspend, resume, fork. */
static const char *const s_job_ops[] = {"suspend", "resume", "fork"};
static _Atomic uint64_t s_job_bytes[3];

const char *ka_metric_code_name(int code)
{
    return ka_code_name(code); /* the one table: ka_errors.c */
}

double ka_metric_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t s_bucket_of(double seconds)
{
    for (size_t i = 0; i + 1 < KA_METRIC_N_BOUNDS; i++)
        if (seconds <= s_bounds[i])
            return i;
    return KA_METRIC_N_BOUNDS - 1;
}

static void s_set_label(char *dst, const char *src)
{
    snprintf(dst, KA_METRIC_LABEL_MAX, "%s", src ? src : "");
}

static s_series_t *s_find(s_family_t *f, const char *v1, const char *v2)
{
    for (size_t i = 0; i < f->n; i++)
        if (strncmp(f->series[i].v[0], v1, KA_METRIC_LABEL_MAX - 1) == 0 &&
            strncmp(f->series[i].v[1], v2, KA_METRIC_LABEL_MAX - 1) == 0)
            return &f->series[i];
    return NULL;
}

/* The series for (v1, v2), created if there is room; past that the "other" series, which
 * takes the last slot. Under f->mu. */
static s_series_t *s_series(s_family_t *f, const char *v1, const char *v2)
{
    const char *v[2] = {f->labels[0] && v1 ? v1 : "", f->labels[1] && v2 ? v2 : ""};
    s_series_t *s = s_find(f, v[0], v[1]);
    if (s)
        return s;
    if (f->n >= KA_METRIC_MAX_SERIES - 1) {
        v[0] = f->labels[0] ? "other" : "";
        v[1] = f->labels[1] ? "other" : "";
        if ((s = s_find(f, v[0], v[1])))
            return s;
    }
    s = &f->series[f->n++];
    memset(s, 0, sizeof *s);
    s_set_label(s->v[0], v[0]);
    s_set_label(s->v[1], v[1]);
    return s;
}

void ka_metric_observe(ka_metric_t m, const char *v1, const char *v2, double seconds)
{
    if ((unsigned)m >= KA_METRIC_N_)
        return;
    if (!(seconds >= 0)) /* NaN or a clock step: nothing to learn */
        seconds = 0;
    s_family_t *f = &s_families[m];
    pthread_mutex_lock(&f->mu);
    s_series_t *s = s_series(f, v1, v2);
    s->buckets[s_bucket_of(seconds)]++;
    s->count++;
    s->sum += seconds;
    pthread_mutex_unlock(&f->mu);
}

void ka_metric_job(const char *op, bool ok, double seconds, uint64_t bytes)
{
    for (size_t i = 0; op && i < 3; i++) {
        if (strcmp(op, s_job_ops[i]) != 0)
            continue;
        const char *result = ok ? "ok" : "error";
        if (i == 2)
            ka_metric_observe(KA_METRIC_FORK, result, NULL, seconds);
        else
            ka_metric_observe(KA_METRIC_SNAPSHOT, op, result, seconds);
        s_job_bytes[i] += bytes;
    }
}

void ka_metric_snapshot(ka_metric_t m, const char *v1, ka_metric_snapshot_t *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->bounds, s_bounds, sizeof s_bounds);
    if ((unsigned)m >= KA_METRIC_N_)
        return;
    s_family_t *f = &s_families[m];
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n; i++) {
        const s_series_t *s = &f->series[i];
        if (v1 && strcmp(s->v[0], v1) != 0)
            continue;
        uint64_t cum = 0;
        for (size_t b = 0; b < KA_METRIC_N_BOUNDS; b++) {
            cum += s->buckets[b];
            out->buckets[b] += cum;
        }
        out->count += s->count;
        out->sum += s->sum;
    }
    pthread_mutex_unlock(&f->mu);
}

void ka_metrics_reset(void)
{
    for (size_t m = 0; m < KA_METRIC_N_; m++) {
        pthread_mutex_lock(&s_families[m].mu);
        s_families[m].n = 0;
        pthread_mutex_unlock(&s_families[m].mu);
    }
    for (size_t i = 0; i < 3; i++)
        s_job_bytes[i] = 0;
}

/* ---- exposition --------------------------------------------------------------------------- */

/* A label value escaped as the text format wants (backslash, quote, newline). */
static void s_put_value(FILE *o, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(o, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", o);
        else
            fputc(*v, o);
    }
}

static void s_put_labels(FILE *o, const s_family_t *f, const s_series_t *s, const char *le)
{
    bool any = false;
    for (int i = 0; i < 2; i++) {
        if (!f->labels[i])
            continue;
        fprintf(o, "%s%s=\"", any ? "," : "{", f->labels[i]);
        s_put_value(o, s->v[i]);
        fputc('"', o);
        any = true;
    }
    if (le)
        fprintf(o, "%sle=\"%s\"", any ? "," : "{", le);
    if (any || le)
        fputc('}', o);
}

static void s_put_series(FILE *o, const s_family_t *f, const s_series_t *s)
{
    uint64_t cum = 0;
    for (size_t b = 0; b < KA_METRIC_N_BOUNDS; b++) {
        char le[32];
        if (b + 1 < KA_METRIC_N_BOUNDS)
            snprintf(le, sizeof le, "%g", s_bounds[b]);
        else
            snprintf(le, sizeof le, "+Inf");
        cum += s->buckets[b];
        fprintf(o, "%s_bucket", f->name);
        s_put_labels(o, f, s, le);
        fprintf(o, " %llu\n", (unsigned long long)cum);
    }
    fprintf(o, "%s_sum", f->name);
    s_put_labels(o, f, s, NULL);
    fprintf(o, " %.9g\n%s_count", s->sum, f->name);
    s_put_labels(o, f, s, NULL);
    fprintf(o, " %llu\n", (unsigned long long)s->count);
}

static void s_put_family(FILE *o, s_family_t *f)
{
    fprintf(o, "# HELP %s %s\n# TYPE %s histogram\n", f->name, f->help, f->name);
    pthread_mutex_lock(&f->mu);
    if (f->n == 0 && !f->labels[0]) { /* an unlabelled family always has its one series */
        s_series_t zero;
        memset(&zero, 0, sizeof zero);
        s_put_series(o, f, &zero);
    }
    for (size_t i = 0; i < f->n; i++)
        s_put_series(o, f, &f->series[i]);
    pthread_mutex_unlock(&f->mu);
}

static void s_put_job_bytes(FILE *o)
{
    fputs("# HELP kagent_snapshot_bytes_total File bytes snapshot copies moved (suspend saves, "
          "resume restores; file:// and object storage).\n"
          "# TYPE kagent_snapshot_bytes_total counter\n",
          o);
    for (size_t i = 0; i < 2; i++)
        fprintf(o, "kagent_snapshot_bytes_total{op=\"%s\"} %llu\n", s_job_ops[i],
                (unsigned long long)s_job_bytes[i]);
    fprintf(o,
            "# HELP kagent_sandbox_fork_bytes_total File bytes fork copies moved (or shared).\n"
            "# TYPE kagent_sandbox_fork_bytes_total counter\nkagent_sandbox_fork_bytes_total "
            "%llu\n",
            (unsigned long long)s_job_bytes[2]);
}

char *ka_metrics_text(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&text, &len);
    if (!o)
        return NULL;
    for (size_t m = 0; m < KA_METRIC_N_; m++)
        s_put_family(o, &s_families[m]);
    s_put_job_bytes(o);
    if (fclose(o) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* ---- process metrics ---------------------------------------------------------------------- */

typedef struct {
    double cpu_seconds;
    double start_time;
    uint64_t vsize, rss;
} s_proc_stat_t;

static int s_proc_stat(s_proc_stat_t *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    char line[2048];
    char *got = fgets(line, sizeof line, f);
    fclose(f);
    char *p = got ? strrchr(line, ')') : NULL; /* the command name may hold spaces */
    unsigned long long utime, stime, start, vsize;
    long long rss;
    if (!p || sscanf(p + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d "
                     "%*d %llu %llu %lld",
                     &utime, &stime, &start, &vsize, &rss) != 5)
        return -1;
    double tick = (double)sysconf(_SC_CLK_TCK);
    out->cpu_seconds = (double)(utime + stime) / tick;
    out->vsize = vsize;
    out->rss = (uint64_t)(rss > 0 ? rss : 0) * (uint64_t)sysconf(_SC_PAGESIZE);
    unsigned long long btime = 0;
    FILE *s = fopen("/proc/stat", "r");
    while (s && fgets(line, sizeof line, s))
        if (sscanf(line, "btime %llu", &btime) == 1)
            break;
    if (s)
        fclose(s);
    out->start_time = (double)btime + (double)start / tick;
    return 0;
}

static long s_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    long n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0; /* the directory's own descriptor */
}

uint64_t ka_metrics_rss_bytes(void)
{
    s_proc_stat_t st;
    return s_proc_stat(&st) == 0 ? st.rss : 0;
}

char *ka_metrics_process_text(void)
{
    s_proc_stat_t st;
    s_proc_stat(&st);
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    char *text = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&text, &len);
    if (!o)
        return NULL;
    fprintf(o,
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
            "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n"
            "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n"
            "# HELP process_open_fds Number of open file descriptors.\n"
            "# TYPE process_open_fds gauge\nprocess_open_fds %ld\n"
            "# HELP process_max_fds Maximum number of open file descriptors.\n"
            "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n"
            "# HELP process_start_time_seconds Start time of the process since unix epoch in "
            "seconds.\n"
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n",
            st.cpu_seconds, (unsigned long long)st.rss, (unsigned long long)st.vsize, s_open_fds(),
            (unsigned long long)rl.rlim_cur, st.start_time);
    if (fclose(o) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
