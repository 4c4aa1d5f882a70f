/*
 * sbx_bench: substrate benchmarks for the `namespaces` driver.
 *   start    sandbox start -> guest ready (p50/p99 ms), start+stop cycle, creates per second
 *   exec     round trip of `true` through the guest: start request -> exit seen (p50 ms)
 *   idle     host memory per idle sandbox (MemAvailable delta / count)
 *   peer     bwrap --unshare-all on the same rootfs running /bin/true (p50 ms)
 * Usage: sbx_bench GUEST_PATH [cycles] [idle_count]. Prints a table and BENCH lines.
 */
#include "sbx_fixture.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

static double s_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof(double), s_cmp);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static double s_cpu_ms(void)
{
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    getrusage(RUSAGE_CHILDREN, &b);
    return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec + b.ru_stime.tv_sec) *
               1e3 +
           (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec +
                    b.ru_stime.tv_usec) /
               1e3;
}

static long s_mem_available_kb(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

static void s_drop_caches(void)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)!write(fd, "3", 1);
        close(fd);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sbx_bench GUEST_PATH [cycles] [idle_count]\n");
        return 2;
    }
    int cycles = argc > 2 ? atoi(argv[2]) : 200;
    int idle_n = argc > 3 ? atoi(argv[3]) : 200;
    char tmp[] = "/tmp/ka-sbx-bench-XXXXXX";
    if (!mkdtemp(tmp))
        return 1;
    char rootfs[300], state[300], cmd[1200];
    snprintf(rootfs, sizeof(rootfs), "%s/rootfs", tmp);
    snprintf(state, sizeof(state), "%s/state", tmp);
    if (sbx_make_rootfs(rootfs) < 0)
        return 1;
    ka_ns_opts_t o = {.state_dir = state,
                      .guest_path = argv[1],
                      .cpu_millis = 1000,
                      .mem_bytes = 256u << 20,
                      .pids_max = 256,
                      .cgroup_name = "kagent-bench"};
    int err = 0, status = 0;
    ka_driver_t *d = ka_namespaces_new(&o, &err);
    if (!d) {
        fprintf(stderr, "driver: %s\n", strerror(-err));
        return 1;
    }
    const char *lower[] = {rootfs};
    double *start = calloc((size_t)cycles, sizeof(double));
    double *cycle = calloc((size_t)cycles, sizeof(double));
    double *rtt = calloc((size_t)cycles, sizeof(double));
    double *peer = calloc((size_t)cycles, sizeof(double));
    char id[64];
    /* warm-up */
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "warm-%d", i);
        ka_sandbox_spec_t spec = {.id = id, .lowerdirs = lower, .n_lower = 1};
        ka_sandbox_t *sb = NULL;
        if (ka_driver_start(d, &spec, &sb) < 0) {
            fprintf(stderr, "start failed\n");
            return 1;
        }
        ka_driver_stop(d, &sb);
    }
    double cpu0 = s_cpu_ms();
    double t_all0 = s_ms();
    for (int i = 0; i < cycles; i++) {
        snprintf(id, sizeof(id), "b-%d", i);
        ka_sandbox_spec_t spec = {.id = id, .lowerdirs = lower, .n_lower = 1};
        ka_sandbox_t *sb = NULL;
        double t0 = s_ms();
        int rc = ka_driver_start(d, &spec, &sb);
        double t1 = s_ms();
        if (rc < 0) {
            fprintf(stderr, "start: %s\n", strerror(-rc));
            return 1;
        }
        ka_driver_stop(d, &sb);
        double t2 = s_ms();
        start[i] = t1 - t0;
        cycle[i] = t2 - t0;
    }
    double t_all = s_ms() - t_all0;
    /* CPU spent per start+stop by the node and the sandboxes (reaped children), whatever the
     * load on the machine: the cost, where wall time also measures the wait for a CPU */
    double cpu_cycle = (s_cpu_ms() - cpu0) / cycles;
    /* exec round trip */
    {
        ka_sandbox_spec_t spec = {.id = "exec", .lowerdirs = lower, .n_lower = 1};
        ka_sandbox_t *sb = NULL;
        if (ka_driver_start(d, &spec, &sb) < 0)
            return 1;
        ka_guestconn_t *gc = ka_guestconn_new(ka_driver_channel(d, sb), false);
        const char *targv[] = {"/bin/true", NULL};
        for (int i = 0; i < cycles; i++) {
            sbx_out_t out;
            double t0 = s_ms();
            int rc = sbx_run(gc, targv, &out, 0);
            rtt[i] = s_ms() - t0;
            sbx_out_free(&out);
            if (rc != 0) {
                fprintf(stderr, "exec true: %d\n", rc);
                status = 1;
                break;
            }
        }
        ka_guestconn_destroy(&gc);
        ka_driver_stop(d, &sb);
    }
    /* idle sandboxes */
    ka_sandbox_t **idle = calloc((size_t)idle_n, sizeof(*idle));
    s_drop_caches();
    long before = s_mem_available_kb();
    int started = 0;
    for (; started < idle_n; started++) {
        snprintf(id, sizeof(id), "idle-%d", started);
        ka_sandbox_spec_t spec = {.id = id, .lowerdirs = lower, .n_lower = 1};
        if (ka_driver_start(d, &spec, &idle[started]) < 0)
            break;
    }
    usleep(200000);
    s_drop_caches();
    long after = s_mem_available_kb();
    for (int i = 0; i < started; i++)
        ka_driver_stop(d, &idle[i]);
    double idle_bytes = started ? (double)(before - after) * 1024.0 / started : 0;
    /* peer: bubblewrap on the same rootfs */
    int have_bwrap = access("/usr/bin/bwrap", X_OK) == 0;
    for (int i = 0; have_bwrap && i < cycles; i++) {
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/bwrap --ro-bind %s / --dev /dev --proc /proc --tmpfs /tmp "
                 "--unshare-all --die-with-parent --new-session --hostname sbx --uid 65532 "
                 "--gid 65532 /bin/true",
                 rootfs);
        double t0 = s_ms();
        int rc = system(cmd);
        peer[i] = s_ms() - t0;
        if (rc != 0) {
            fprintf(stderr, "bwrap failed: %d\n", rc);
            have_bwrap = 0;
        }
    }
    /* the baseline cost of system() itself, so the peer is not charged for our shell */
    double *base = calloc((size_t)cycles, sizeof(double));
    for (int i = 0; have_bwrap && i < cycles; i++) {
        double t0 = s_ms();
        (void)!system("/bin/true");
        base[i] = s_ms() - t0;
    }
    double s50 = s_pct(start, (size_t)cycles, 0.5), s99 = s_pct(start, (size_t)cycles, 0.99);
    double c50 = s_pct(cycle, (size_t)cycles, 0.5), c99 = s_pct(cycle, (size_t)cycles, 0.99);
    double r50 = s_pct(rtt, (size_t)cycles, 0.5);
    double b50 = have_bwrap ? s_pct(base, (size_t)cycles, 0.5) : 0;
    double p50 = have_bwrap ? s_pct(peer, (size_t)cycles, 0.5) - b50 : 0;
    double cps = cycles / (t_all / 1000.0);
    printf("| figure | value |\n|---|---|\n");
    printf("| sandbox start -> guest ready p50 | %.2f ms |\n", s50);
    printf("| sandbox start -> guest ready p99 | %.2f ms |\n", s99);
    printf("| start+stop cycle p50 / p99 | %.2f / %.2f ms |\n", c50, c99);
    printf("| sequential create+delete per second | %.0f /s |\n", cps);
    printf("| CPU per start+stop (node + sandbox) | %.2f ms |\n", cpu_cycle);
    printf("| exec round trip `true` p50 | %.3f ms |\n", r50);
    printf("| idle sandbox host memory (%d sandboxes) | %.0f bytes |\n", started, idle_bytes);
    if (have_bwrap)
        printf("| bwrap --unshare-all /bin/true p50 (shell baseline %.2f ms removed) | %.2f ms |\n",
               b50, p50);
    if (have_bwrap)
        printf("BENCH name=sandbox_start_p50_ms value=%.2f unit=ms peer=bwrap peer_value=%.2f "
               "ratio=%.2f\n",
               s50, p50, p50 / s50);
    else
        printf("BENCH name=sandbox_start_p50_ms value=%.2f unit=ms\n", s50);
    printf("BENCH name=sandbox_start_p99_ms value=%.2f unit=ms\n", s99);
    printf("BENCH name=sandbox_cycle_p50_ms value=%.2f unit=ms\n", c50);
    printf("BENCH name=sandbox_cycle_p99_ms value=%.2f unit=ms\n", c99);
    printf("BENCH name=sandbox_creates_per_s value=%.0f unit=1/s\n", cps);
    printf("BENCH name=sandbox_cycle_cpu_ms value=%.2f unit=ms\n", cpu_cycle);
    printf("BENCH name=exec_rtt_p50_ms value=%.3f unit=ms\n", r50);
    printf("BENCH name=idle_sandbox_bytes value=%.0f unit=B\n", idle_bytes);
    if (started < idle_n) {
        fprintf(stderr, "only %d of %d idle sandboxes started\n", started, idle_n);
        status = 1;
    }
    ka_driver_destroy(&d);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    (void)!system(cmd);
    return status;
}
