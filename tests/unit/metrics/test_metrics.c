/* Unit tests for ka_metrics (histograms, exposition, bounded series, process metrics) and
 * ka_phases (one running phase per sandbox, durations, create-to-READY once). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrics.h"
#include "phases.h"

static int s_reset(void **state)
{
    ka_metrics_reset();
    return 0;
}

static bool s_has(const char *text, const char *line)
{
    return strstr(text, line) != NULL;
}

static void t_histogram_exposition(void **state)
{
    ka_metric_observe(KA_METRIC_GRPC, "/kagent.api.v1.SandboxService/GetSandbox", "OK", 0.003);
    ka_metric_observe(KA_METRIC_GRPC, "/kagent.api.v1.SandboxService/GetSandbox", "OK", 0.2);
    ka_metric_observe(KA_METRIC_GRPC, "/kagent.api.v1.SandboxService/GetSandbox", "NOT_FOUND", 100);
    char *t = ka_metrics_text();
    assert_non_null(t);
    assert_true(s_has(t, "# TYPE kagent_grpc_request_seconds histogram\n"));
    const char *ok = "kagent_grpc_request_seconds_bucket{method=\"/kagent.api.v1.SandboxService/"
                     "GetSandbox\",code=\"OK\",";
    char line[512];
    snprintf(line, sizeof line, "%sle=\"0.0025\"} 0\n", ok);
    assert_true(s_has(t, line));
    snprintf(line, sizeof line, "%sle=\"0.005\"} 1\n", ok); /* cumulative */
    assert_true(s_has(t, line));
    snprintf(line, sizeof line, "%sle=\"0.25\"} 2\n", ok);
    assert_true(s_has(t, line));
    snprintf(line, sizeof line, "%sle=\"+Inf\"} 2\n", ok);
    assert_true(s_has(t, line));
    assert_true(s_has(t, "kagent_grpc_request_seconds_count{method=\"/kagent.api.v1."
                         "SandboxService/GetSandbox\",code=\"OK\"} 2\n"));
    assert_true(s_has(t, "kagent_grpc_request_seconds_sum{method=\"/kagent.api.v1."
                         "SandboxService/GetSandbox\",code=\"OK\"} 0.203\n"));
    assert_true(s_has(t, "code=\"NOT_FOUND\",le=\"60\"} 0\n"));
    assert_true(s_has(t, "code=\"NOT_FOUND\",le=\"+Inf\"} 1\n"));
    /* an unlabelled family shows its one series even before any observation */
    assert_true(s_has(t, "kagent_sandbox_create_seconds_bucket{le=\"+Inf\"} 0\n"));
    assert_true(s_has(t, "kagent_sandbox_create_seconds_count 0\n"));
    free(t);
}

static void t_label_escaping(void **state)
{
    ka_metric_observe(KA_METRIC_MCP, "we\"ird\\name\nx", "200", 0.001);
    char *t = ka_metrics_text();
    assert_true(s_has(t, "method=\"we\\\"ird\\\\name\\nx\""));
    free(t);
}

static void t_series_bounded(void **state)
{
    char v[32];
    for (int i = 0; i < KA_METRIC_MAX_SERIES + 50; i++) {
        snprintf(v, sizeof v, "q%d", i);
        ka_metric_observe(KA_METRIC_STORE, v, "ok", 0.001);
    }
    char *t = ka_metrics_text();
    size_t n = 0;
    for (const char *p = t; (p = strstr(p, "kagent_store_query_seconds_count{")); p++)
        n++;
    assert_int_equal(n, KA_METRIC_MAX_SERIES);
    /* the first 127 keep their names, the rest are "other" */
    assert_true(s_has(t, "kagent_store_query_seconds_count{query=\"q126\",result=\"ok\"} 1\n"));
    assert_false(s_has(t, "query=\"q127\""));
    char want[128];
    snprintf(want, sizeof want,
             "kagent_store_query_seconds_count{query=\"other\",result=\"other\"} %d\n",
             KA_METRIC_MAX_SERIES + 50 - (KA_METRIC_MAX_SERIES - 1));
    assert_true(s_has(t, want));
    free(t);
}

static void t_snapshot(void **state)
{
    ka_metric_observe(KA_METRIC_GUEST_CALL, "start", "OK", 0.004);
    ka_metric_observe(KA_METRIC_GUEST_CALL, "start", "NOT_FOUND", 0.02);
    ka_metric_observe(KA_METRIC_GUEST_CALL, "read", "OK", 3);
    ka_metric_snapshot_t s;
    ka_metric_snapshot(KA_METRIC_GUEST_CALL, "start", &s);
    assert_int_equal(s.count, 2);
    assert_int_equal(s.buckets[KA_METRIC_N_BOUNDS - 1], 2);
    assert_int_equal(s.buckets[3], 1); /* <= 0.005 */
    assert_true(s.bounds[3] == 0.005);
    ka_metric_snapshot(KA_METRIC_GUEST_CALL, NULL, &s);
    assert_int_equal(s.count, 3);
    assert_true(s.sum > 3.02 && s.sum < 3.03);
}

static void t_code_names(void **state)
{
    assert_string_equal(ka_metric_code_name(0), "OK");
    assert_string_equal(ka_metric_code_name(9), "FAILED_PRECONDITION");
    assert_string_equal(ka_metric_code_name(16), "UNAUTHENTICATED");
    assert_string_equal(ka_metric_code_name(17), "UNKNOWN");
    assert_string_equal(ka_metric_code_name(-1), "UNKNOWN");
}

static void t_process(void **state)
{
    char *t = ka_metrics_process_text();
    assert_non_null(t);
    assert_true(s_has(t, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total "));
    assert_true(s_has(t, "\nprocess_max_fds "));
    unsigned long long rss = 0;
    const char *p = strstr(t, "\nprocess_resident_memory_bytes ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "\nprocess_resident_memory_bytes %llu", &rss), 1);
    assert_true(rss > 100000);
    double start = 0;
    p = strstr(t, "\nprocess_start_time_seconds ");
    assert_int_equal(sscanf(p, "\nprocess_start_time_seconds %lf", &start), 1);
    double now = (double)time(NULL);
    assert_true(start > now - 600 && start <= now + 1);
    assert_true(ka_metrics_rss_bytes() > 100000);
    free(t);
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void t_phases(void **state)
{
    const char *id = "0198aaaa-0000-7000-8000-000000000001";
    ka_phase_times_t t;
    assert_int_equal(ka_phase_get(id, &t), -ENOENT);
    ka_phase_record(id, KA_PHASE_STORE_INTENT, 0.002);
    ka_phase_next(id, KA_PHASE_COMPUTE_START);
    s_sleep_ms(20);
    ka_phase_next(id, KA_PHASE_GUEST_READY); /* ends compute_start */
    s_sleep_ms(10);
    ka_phase_end(id);
    ka_phase_end(id); /* nothing runs: no change */
    assert_int_equal(ka_phase_get(id, &t), 0);
    assert_true(t.seconds[KA_PHASE_STORE_INTENT] == 0.002);
    assert_true(t.seconds[KA_PHASE_COMPUTE_START] >= 0.019 &&
                t.seconds[KA_PHASE_COMPUTE_START] < 0.5);
    assert_true(t.seconds[KA_PHASE_GUEST_READY] >= 0.009 && t.seconds[KA_PHASE_GUEST_READY] < 0.5);
    assert_true(t.seconds[KA_PHASE_SUSPEND_UPLOAD] < 0);
    assert_true(t.create_seconds < 0);
    ka_phase_created(id, 0.05);
    ka_phase_created(id, 9); /* a replay answering READY again */
    assert_int_equal(ka_phase_get(id, &t), 0);
    assert_true(t.create_seconds == 0.05);
    ka_metric_snapshot_t s;
    ka_metric_snapshot(KA_METRIC_SANDBOX_CREATE, NULL, &s);
    assert_int_equal(s.count, 1);
    ka_metric_snapshot(KA_METRIC_SANDBOX_PHASE, "compute_start", &s);
    assert_int_equal(s.count, 1);
    ka_metric_snapshot(KA_METRIC_SANDBOX_PHASE, NULL, &s);
    assert_int_equal(s.count, 3);
    assert_string_equal(ka_phase_name(KA_PHASE_RESUME_DOWNLOAD), "resume_download");
    /* bad input changes nothing */
    ka_phase_next(NULL, KA_PHASE_STORE_INTENT);
    ka_phase_next("", KA_PHASE_STORE_INTENT);
    ka_phase_next(id, KA_PHASE_N_);
    ka_phase_end("0198aaaa-0000-7000-8000-00000000dead");
    char long_id[100];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    ka_phase_record(long_id, KA_PHASE_STORE_INTENT, 1);
    assert_int_equal(ka_phase_get(long_id, &t), -ENOENT);
    ka_metric_snapshot(KA_METRIC_SANDBOX_PHASE, NULL, &s);
    assert_int_equal(s.count, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(t_histogram_exposition, s_reset),
        cmocka_unit_test_setup(t_label_escaping, s_reset),
        cmocka_unit_test_setup(t_series_bounded, s_reset),
        cmocka_unit_test_setup(t_snapshot, s_reset),
        cmocka_unit_test(t_code_names),
        cmocka_unit_test(t_process),
        cmocka_unit_test_setup(t_phases, s_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
