/*
 * store_writer: a test driver for the store's PostgreSQL engine (actors/store/pgconn.c) with
 * the store's own statements, run against the database in the PG* environment.
 *
 *   store_writer burst CREATOR FIRST COUNT CONCURRENCY
 *       Creates sandboxes with request ids req-FIRST .. req-(FIRST+COUNT-1), CONCURRENCY
 *       outstanding at a time. Each request is one transaction of three statements: insert
 *       (or find the receipt of) the sandbox, read it back, and mark it READY on node
 *       "writer". Prints "ACK <request_id> <sandbox_id> <created 0|1>" for every committed
 *       request (flushed at once), so a kill -9 leaves a list of acknowledged writes.
 *   store_writer load SECONDS CONCURRENCY
 *       Keeps CONCURRENCY creates in flight for SECONDS while the server may be restarted by
 *       someone else. Exits 0 only if requests succeeded before an outage, failed with
 *       UNAVAILABLE during it, succeeded again after it, nothing else failed, and no request
 *       took longer than 5 s (nothing hangs).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "schema.h"
#include "store_sql.h"

#define MARK_SQL                                                                                   \
    "UPDATE ka_sandboxes SET state = 'RUNTIME_STATE_READY', operation = 'RUNTIME_OPERATION_NONE'," \
    " node = 'writer' WHERE creator = $1 AND request_id = $2"

typedef struct slot {
    bool busy;
    long req;
    uint64_t started;
} slot_t;

static ka_pgconn_t *s_eng;
static const char *s_creator = "writer";
static long s_ok, s_unavail, s_other, s_ok_after_outage;
static uint64_t s_max_latency;
static bool s_load;

static void s_drive_once(int max_wait_ms)
{
    int fd;
    uint32_t ev;
    int64_t delay;
    ka_pgconn_interest(s_eng, &fd, &ev, &delay);
    struct pollfd p = {
        .fd = fd,
        .events = (short)(((ev & KA_PG_READ) ? POLLIN : 0) | ((ev & KA_PG_WRITE) ? POLLOUT : 0))};
    int wait = max_wait_ms;
    if (delay >= 0 && delay < wait)
        wait = (int)delay;
    poll(&p, fd >= 0 ? 1 : 0, wait);
    if (p.revents)
        ka_pgconn_on_io(s_eng, KA_PG_READ | ((p.revents & POLLOUT) ? KA_PG_WRITE : 0));
    ka_pgconn_on_timer(s_eng);
}

static void s_done(void *user, const ka_pg_outcome_t *out)
{
    slot_t *s = user;
    uint64_t lat = ka_pg_now_ms() - s->started;
    if (lat > s_max_latency)
        s_max_latency = lat;
    s->busy = false;
    if (out->err == 0) {
        s_ok++;
        if (s_unavail > 0)
            s_ok_after_outage++;
        if (!s_load) {
            const PGresult *ins = out->results[0], *rd = out->results[1];
            printf("ACK req-%ld %s %d\n", s->req, PQgetvalue(rd, 0, 0), PQntuples(ins) == 1);
            fflush(stdout);
        }
    } else if (out->err == KA_PG_EUNAVAIL) {
        s_unavail++;
    } else {
        s_other++;
        fprintf(stderr, "request req-%ld failed: err=%d sqlstate=%s %s\n", s->req, out->err,
                out->sqlstate, out->message);
    }
}

static int s_submit(slot_t *s, long req)
{
    char rid[32];
    snprintf(rid, sizeof(rid), "req-%ld", req);
    const char *p[8] = {s_creator, rid, "", "default", "python", "", "", "3600000"};
    ka_pg_stmt_t st[3] = {{"sb_ins", 8, p}, {"sb_receipt", 2, p}, {"mark", 2, p}};
    s->busy = true;
    s->req = req;
    s->started = ka_pg_now_ms();
    int rc = ka_pgconn_submit(s_eng, st, 3, 0, s_done, s);
    if (rc)
        s->busy = false;
    return rc;
}

static int s_open(void)
{
    char err[512] = "";
    int rc = ka_schema_migrate_url("", NULL, NULL, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "migrate: %s\n", err);
        return rc;
    }
    s_eng =
        ka_pgconn_new("", &(ka_pgconn_opts_t){.backoff_min_ms = 20, .backoff_max_ms = 200}, NULL);
    if (!s_eng || ka_store_sql_register(s_eng) || ka_pgconn_prepare(s_eng, "mark", MARK_SQL, 2) ||
        ka_pgconn_start(s_eng))
        return -1;
    return 0;
}

static int s_burst(long first, long count, int conc)
{
    slot_t *slots = calloc((size_t)conc, sizeof(*slots));
    long next = first, end = first + count;
    while (next < end || s_ok + s_other < count) {
        for (int i = 0; i < conc && next < end; i++) {
            if (slots[i].busy)
                continue;
            int rc = s_submit(&slots[i], next);
            if (rc == 0)
                next++;
            else if (rc != KA_PG_EUNAVAIL)
                return 2;
        }
        s_drive_once(50);
        if (s_unavail > 0) {
            fprintf(stderr, "burst: database unavailable\n");
            return 3;
        }
    }
    free(slots);
    return s_other ? 1 : 0;
}

static int s_load_run(int seconds, int conc)
{
    s_load = true;
    slot_t *slots = calloc((size_t)conc, sizeof(*slots));
    uint64_t end = ka_pg_now_ms() + (uint64_t)seconds * 1000u;
    long next = 0;
    long ok_before = 0;
    while (ka_pg_now_ms() < end) {
        for (int i = 0; i < conc; i++) {
            if (slots[i].busy)
                continue;
            if (s_submit(&slots[i], next) == 0)
                next++;
        }
        if (s_unavail == 0)
            ok_before = s_ok;
        s_drive_once(10);
        for (int i = 0; i < conc; i++)
            if (slots[i].busy && ka_pg_now_ms() - slots[i].started > 5000) {
                fprintf(stderr, "load: request req-%ld hangs\n", slots[i].req);
                return 4;
            }
    }
    /* drain what is in flight */
    uint64_t drain_end = ka_pg_now_ms() + 6000;
    for (;;) {
        bool busy = false;
        for (int i = 0; i < conc; i++)
            busy |= slots[i].busy;
        if (!busy || ka_pg_now_ms() > drain_end)
            break;
        s_drive_once(10);
    }
    free(slots);
    ka_pgconn_stats_t st;
    ka_pgconn_stats(s_eng, &st);
    printf("load: ok=%ld ok_before_outage=%ld unavailable=%ld ok_after_outage=%ld other=%ld "
           "max_latency_ms=%llu connects=%llu losses=%llu\n",
           s_ok, ok_before, s_unavail, s_ok_after_outage, s_other,
           (unsigned long long)s_max_latency, (unsigned long long)st.connects,
           (unsigned long long)st.losses);
    if (ok_before == 0 || s_unavail == 0 || s_ok_after_outage == 0 || s_other != 0 ||
        s_max_latency > 5000 || st.connects < 2)
        return 1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "burst") == 0) {
        s_creator = argv[2];
        if (s_open())
            return 2;
        int rc = s_burst(atol(argv[3]), atol(argv[4]), atoi(argv[5]));
        ka_pgconn_destroy(&s_eng);
        return rc;
    }
    if (argc == 4 && strcmp(argv[1], "load") == 0) {
        if (s_open())
            return 2;
        int rc = s_load_run(atoi(argv[2]), atoi(argv[3]));
        ka_pgconn_destroy(&s_eng);
        return rc;
    }
    fprintf(stderr, "usage: %s burst CREATOR FIRST COUNT CONCURRENCY | load SECONDS CONC\n",
            argv[0]);
    return 2;
}
