/*
 * store_bench: persisted sandbox-record creates per second through the store actor.
 *
 *   store_bench CLIENTS SECONDS
 *
 * Spawns the store actor on a runtime (database from the PG* environment) and runs CLIENTS
 * independent clients (krt_call_async, as a bridge would call it): each has one create
 * outstanding at a time, with a fresh (creator, request_id), and issues the next one as soon
 * as the reply arrives, for SECONDS after a short warm-up. Prints
 *   creates=N seconds=S rate=R errors=E commits=C per_commit=P
 * A create counts once its reply arrives, i.e. once its commit is confirmed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "krt.h"
#include "store.h"

static krt_system_t *s_sys;
static krt_addr_t s_store;
static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s_cond = PTHREAD_COND_INITIALIZER;
static int s_active; /* clients with a request outstanding */
static _Atomic long s_ok, s_err, s_seq;
static _Atomic int s_counting;
static _Atomic uint64_t s_end; /* clients stop issuing at this krt_now_ms */
static char s_creator[64];

static int s_issue(void);

/* A client: each reply immediately issues the client's next create (as independent callers
 * would), until the deadline. Runs on a runtime thread; never blocks. */
static void s_done(void *user, int err, const krt_msg_t *reply)
{
    const ka_store_sandbox_reply_t *r = reply ? reply->body : NULL;
    bool ok = !err && r && reply->len == sizeof(*r) && r->created;
    if (atomic_load(&s_counting))
        atomic_fetch_add(ok ? &s_ok : &s_err, 1);
    if (krt_now_ms() < atomic_load(&s_end) && s_issue() == 0)
        return;
    pthread_mutex_lock(&s_lock);
    s_active--;
    pthread_cond_signal(&s_cond);
    pthread_mutex_unlock(&s_lock);
}

static int s_issue(void)
{
    ka_store_sandbox_create_t c;
    memset(&c, 0, sizeof(c));
    snprintf(c.creator, sizeof(c.creator), "%s", s_creator);
    snprintf(c.template_namespace, sizeof(c.template_namespace), "default");
    snprintf(c.template_name, sizeof(c.template_name), "python");
    snprintf(c.name, sizeof(c.name), "bench");
    snprintf(c.request_id, sizeof(c.request_id), "r-%ld", atomic_fetch_add(&s_seq, 1));
    c.ttl_ms = 3600000;
    int rc =
        krt_call_async(s_sys, s_store, KA_STORE_SANDBOX_CREATE, &c, sizeof(c), 30000, s_done, NULL);
    if (rc)
        atomic_fetch_add(&s_err, 1);
    return rc;
}

static int s_info(ka_store_info_t *out)
{
    krt_reply_t rep;
    int rc = krt_call(s_sys, s_store, KA_STORE_INFO, NULL, 0, 5000, &rep);
    if (rc)
        return rc;
    memcpy(out, rep.body, sizeof(*out));
    krt_reply_free(&rep);
    return 0;
}

/* Starts `clients` clients that run until end, and waits for all of them to finish. */
static void s_run(int clients, uint64_t end)
{
    atomic_store(&s_end, end);
    for (int i = 0; i < clients; i++) {
        pthread_mutex_lock(&s_lock);
        s_active++;
        pthread_mutex_unlock(&s_lock);
        if (s_issue() != 0) {
            pthread_mutex_lock(&s_lock);
            s_active--;
            pthread_mutex_unlock(&s_lock);
        }
    }
    pthread_mutex_lock(&s_lock);
    while (s_active > 0)
        pthread_cond_wait(&s_cond, &s_lock);
    pthread_mutex_unlock(&s_lock);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s CLIENTS SECONDS\n", argv[0]);
        return 2;
    }
    int clients = atoi(argv[1]);
    int seconds = atoi(argv[2]);
    if (clients < 1 || seconds < 1)
        return 2;
    krt_log_configure(KRT_LOG_WARN, false, NULL);
    s_sys = krt_system_new(&(krt_config_t){.name = "bench"});
    static ka_store_args_t args = {.conninfo = ""};
    const char *segs = getenv("STORE_BENCH_SEGMENTS"); /* engine max_segments (tuning runs) */
    if (segs)
        args.opts.max_segments = atoi(segs);
    if (!s_sys || krt_system_start(s_sys) ||
        krt_system_spawn(s_sys, &ka_store_behaviour, &args, NULL, &s_store)) {
        fprintf(stderr, "store_bench: cannot start the runtime and store\n");
        return 1;
    }
    ka_store_info_t info;
    for (int i = 0;; i++) {
        if (s_info(&info) == 0 && info.conn_state == KA_PG_READY)
            break;
        if (i > 300) {
            fprintf(stderr, "store_bench: store not ready (database unreachable?)\n");
            return 1;
        }
        usleep(20000);
    }
    snprintf(s_creator, sizeof(s_creator), "bench-%d", (int)getpid());
    s_run(clients, krt_now_ms() + 500); /* warm-up */
    ka_store_info_t before;
    s_info(&before);
    atomic_store(&s_counting, 1);
    uint64_t t0 = krt_now_ms();
    s_run(clients, t0 + (uint64_t)seconds * 1000u);
    double secs = (double)(krt_now_ms() - t0) / 1000.0;
    ka_store_info_t after;
    s_info(&after);
    unsigned long long commits = after.stats.segments - before.stats.segments;
    long ok = atomic_load(&s_ok);
    printf("creates=%ld seconds=%.2f rate=%.0f errors=%ld commits=%llu per_commit=%.1f\n", ok, secs,
           (double)ok / secs, atomic_load(&s_err), commits,
           commits ? (double)ok / (double)commits : 0.0);
    krt_system_destroy(&s_sys);
    return atomic_load(&s_err) ? 1 : 0;
}
