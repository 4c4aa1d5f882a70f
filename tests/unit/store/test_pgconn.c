/*
 * Tests for actors/store/pgconn.c and schema.c against a real PostgreSQL (run through
 * tests/with-pg, which exports PGHOST/PGPORT/PGUSER/PGDATABASE). The engine is driven by a
 * plain poll() loop, no actor runtime involved.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "schema.h"
#include "store_sql.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */

static PGconn *s_admin(void)
{
    PGconn *c = PQconnectdb("");
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("cannot connect to the test database (PG* env from tests/with-pg): %s",
                 PQerrorMessage(c));
    return c;
}

static void s_sql(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    PQclear(r);
}

static long s_count(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    long v = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* Drives engines with poll() until *done reaches target or timeout_ms passes. */
static void s_drive(ka_pgconn_t **cs, int n, const int *done, int target, int timeout_ms)
{
    uint64_t end = ka_pg_now_ms() + (uint64_t)timeout_ms;
    while (*done < target) {
        uint64_t now = ka_pg_now_ms();
        if (now >= end)
            fail_msg("timed out: %d of %d completions", *done, target);
        struct pollfd pfd[8];
        int64_t wait = (int64_t)(end - now);
        for (int i = 0; i < n; i++) {
            int fd;
            uint32_t ev;
            int64_t delay;
            ka_pgconn_interest(cs[i], &fd, &ev, &delay);
            pfd[i].fd = fd;
            pfd[i].events =
                (short)(((ev & KA_PG_READ) ? POLLIN : 0) | ((ev & KA_PG_WRITE) ? POLLOUT : 0));
            pfd[i].revents = 0;
            if (delay >= 0 && delay < wait)
                wait = delay;
        }
        int rc = poll(pfd, (nfds_t)n, (int)(wait > 50 ? 50 : wait));
        assert_true(rc >= 0);
        for (int i = 0; i < n; i++) {
            uint32_t ev = 0;
            if (pfd[i].revents & (POLLIN | POLLERR | POLLHUP))
                ev |= KA_PG_READ;
            if (pfd[i].revents & POLLOUT)
                ev |= KA_PG_WRITE;
            if (ev)
                ka_pgconn_on_io(cs[i], ev);
            ka_pgconn_on_timer(cs[i]);
        }
    }
}

static void s_drive1(ka_pgconn_t *c, const int *done, int target, int timeout_ms)
{
    s_drive(&c, 1, done, target, timeout_ms);
}

/* A request's outcome, copied out of the callback. */
typedef struct rec {
    int *done;
    int err;
    char sqlstate[6];
    char value[64];  /* first column of the first row of the first statement */
    char value2[64]; /* same, second statement */
} rec_t;

static void s_on_done(void *user, const ka_pg_outcome_t *out)
{
    rec_t *r = user;
    r->err = out->err;
    snprintf(r->sqlstate, sizeof(r->sqlstate), "%s", out->sqlstate);
    if (out->err == 0) {
        for (int i = 0; i < out->nresults && i < 2; i++) {
            char *dst = i == 0 ? r->value : r->value2;
            if (PQntuples(out->results[i]) > 0)
                snprintf(dst, 64, "%s", PQgetvalue(out->results[i], 0, 0));
        }
    }
    (*r->done)++;
}

/* The create statement pair used by the store: insert or, on the receipt conflict, read. */
#define SQL_INS                                                                                    \
    "INSERT INTO ka_sandboxes (creator, request_id, template_namespace, template_name,"            \
    " expires_at) VALUES ($1, $2, 'default', 'python', now() + interval '1 hour')"                 \
    " ON CONFLICT ON CONSTRAINT ka_sandboxes_receipt DO NOTHING RETURNING id"
#define SQL_GET "SELECT id FROM ka_sandboxes WHERE creator = $1 AND request_id = $2"

static ka_pgconn_t *s_engine(const ka_pgconn_opts_t *opts, const ka_pgconn_hooks_t *hooks)
{
    ka_pgconn_t *c = ka_pgconn_new("", opts, hooks);
    assert_non_null(c);
    assert_int_equal(ka_pgconn_prepare(c, "ins", SQL_INS, 2), 0);
    assert_int_equal(ka_pgconn_prepare(c, "get", SQL_GET, 2), 0);
    assert_int_equal(ka_pgconn_prepare(c, "sleep", "SELECT pg_sleep($1::float8)", 1), 0);
    assert_int_equal(ka_pgconn_prepare(c, "bad", "SELECT 1 / $1::int", 1), 0);
    assert_int_equal(ka_pgconn_prepare(c, "flaky", "SELECT ka_test_flaky()", 0), 0);
    assert_int_equal(ka_pgconn_prepare(c, "setstate",
                                       "UPDATE ka_sandboxes SET state = $2 WHERE id = $1::uuid", 2),
                     0);
    assert_int_equal(ka_pgconn_prepare(c, "ins", SQL_INS, 2), -EEXIST);
    return c;
}

static void s_wait_ready(ka_pgconn_t *c)
{
    uint64_t end = ka_pg_now_ms() + 10000;
    while (ka_pgconn_state(c) != KA_PG_READY) {
        if (ka_pg_now_ms() > end)
            fail_msg("engine not ready: %s", ka_pgconn_state_name(ka_pgconn_state(c)));
        int fd;
        uint32_t ev;
        int64_t delay;
        ka_pgconn_interest(c, &fd, &ev, &delay);
        struct pollfd p = {.fd = fd,
                           .events = (short)(((ev & KA_PG_READ) ? POLLIN : 0) |
                                             ((ev & KA_PG_WRITE) ? POLLOUT : 0))};
        poll(&p, fd >= 0 ? 1 : 0, 20);
        if (p.revents)
            ka_pgconn_on_io(c, (p.revents & POLLOUT ? KA_PG_WRITE : 0) | KA_PG_READ);
        ka_pgconn_on_timer(c);
    }
}

static int s_submit(ka_pgconn_t *c, const char *name, int nparams, const char *const *params,
                    rec_t *rec)
{
    ka_pg_stmt_t st = {.name = name, .nparams = nparams, .params = params};
    return ka_pgconn_submit(c, &st, 1, 0, s_on_done, rec);
}

static int s_submit_create(ka_pgconn_t *c, const char *creator, const char *req, rec_t *rec)
{
    const char *p[2] = {creator, req};
    ka_pg_stmt_t st[2] = {{.name = "ins", .nparams = 2, .params = p},
                          {.name = "get", .nparams = 2, .params = p}};
    return ka_pgconn_submit(c, st, 2, 0, s_on_done, rec);
}

static int s_setup(void **state)
{
    PGconn *a = s_admin();
    char err[512] = "";
    int from = -1, to = -1;
    int rc = ka_schema_migrate(a, &from, &to, err, sizeof(err));
    if (rc)
        fail_msg("migrate: %s", err);
    s_sql(a, "CREATE SEQUENCE IF NOT EXISTS ka_test_seq");
    s_sql(a, "CREATE OR REPLACE FUNCTION ka_test_flaky() RETURNS int LANGUAGE plpgsql AS $$"
             " BEGIN IF nextval('ka_test_seq') % 3 <> 0 THEN"
             "  RAISE EXCEPTION 'simulated conflict' USING ERRCODE = 'serialization_failure';"
             " END IF; RETURN 7; END $$");
    PQfinish(a);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Schema                                                                                   */

static void test_migrate_rerun_and_refuse_newer(void **unused)
{
    PGconn *a = s_admin();
    char err[512] = "";
    int from = -1, to = -1;
    /* s_setup migrated from empty; running again changes nothing */
    assert_int_equal(ka_schema_migrate(a, &from, &to, err, sizeof(err)), 0);
    assert_int_equal(from, KA_SCHEMA_VERSION);
    assert_int_equal(to, KA_SCHEMA_VERSION);
    assert_int_equal(ka_schema_version(a), KA_SCHEMA_VERSION);
    assert_int_equal(s_count(a, "SELECT count(*) FROM ka_schema_version"), KA_SCHEMA_VERSION);
    assert_int_equal(s_count(a, "SELECT count(*) FROM ka_pools WHERE name = 'kagent-default'"), 1);
    /* a newer binary migrated this database: refuse, and change nothing */
    s_sql(a, "INSERT INTO ka_schema_version (version) VALUES (99)");
    err[0] = '\0';
    assert_int_equal(ka_schema_migrate(a, &from, &to, err, sizeof(err)), KA_SCHEMA_ENEWER);
    assert_int_equal(from, 99);
    assert_non_null(strstr(err, "newer"));
    assert_int_equal(PQtransactionStatus(a), PQTRANS_IDLE);
    s_sql(a, "DELETE FROM ka_schema_version WHERE version = 99");
    assert_int_equal(ka_schema_migrate_url("", &from, &to, err, sizeof(err)), 0);
    assert_int_equal(to, KA_SCHEMA_VERSION);
    /* a bad URL is a connection error, not a crash */
    assert_int_equal(
        ka_schema_migrate_url("host=/nonexistent-kagent port=1", NULL, NULL, err, sizeof(err)),
        -ENOTCONN);
    PQfinish(a);
}

static void test_migrate_from_empty_in_fresh_db(void **unused)
{
    PGconn *a = s_admin();
    s_sql(a, "DROP DATABASE IF EXISTS ka_test_fresh");
    s_sql(a, "CREATE DATABASE ka_test_fresh");
    char err[512] = "";
    int from = -1, to = -1;
    assert_int_equal(ka_schema_migrate_url("dbname=ka_test_fresh", &from, &to, err, sizeof(err)),
                     0);
    assert_int_equal(from, 0);
    assert_int_equal(to, KA_SCHEMA_VERSION);
    assert_int_equal(ka_schema_migrate_url("dbname=ka_test_fresh", &from, &to, err, sizeof(err)),
                     0);
    assert_int_equal(from, KA_SCHEMA_VERSION);
    s_sql(a, "DROP DATABASE ka_test_fresh");
    PQfinish(a);
}

/* ---------------------------------------------------------------------------------------- */
/* Engine                                                                                   */

static void test_basic_request_and_errors(void **unused)
{
    ka_pgconn_t *c = s_engine(NULL, NULL);
    int done = 0;
    rec_t r = {.done = &done};
    /* not started: refused */
    assert_int_equal(s_submit(c, "sleep", 1, (const char *[]){"0"}, &r), KA_PG_EUNAVAIL);
    assert_int_equal(ka_pgconn_start(c), 0);
    /* unknown statement, wrong parameter count */
    assert_int_equal(s_submit(c, "nope", 0, NULL, &r), -EINVAL);
    assert_int_equal(s_submit(c, "sleep", 0, NULL, &r), -EINVAL);
    /* queued while connecting */
    assert_int_equal(s_submit_create(c, "alice", "basic-1", &r), 0);
    s_drive1(c, &done, 1, 10000);
    assert_int_equal(r.err, 0);
    assert_int_equal(strlen(r.value), 36); /* inserted: id returned */
    assert_string_equal(r.value, r.value2);
    /* an SQL error: division by zero */
    rec_t bad = {.done = &done};
    assert_int_equal(s_submit(c, "bad", 1, (const char *[]){"0"}, &bad), 0);
    s_drive1(c, &done, 2, 10000);
    assert_int_equal(bad.err, KA_PG_ESQL);
    assert_string_equal(bad.sqlstate, "22012");
    ka_pgconn_stats_t st;
    ka_pgconn_stats(c, &st);
    assert_int_equal(st.connects, 1);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.failed, 1);
    ka_pgconn_destroy(&c);
    ka_pgconn_destroy(&c);
    assert_null(c);
}

/* One failing request in a group-committed segment fails alone; its neighbours commit. */
static void test_group_commit_isolates_failures(void **unused)
{
    ka_pgconn_t *c = s_engine(&(ka_pgconn_opts_t){.max_segments = 1}, NULL);
    assert_int_equal(ka_pgconn_start(c), 0);
    s_wait_ready(c);
    int done = 0;
    enum { N = 50 };
    static rec_t recs[N];
    char reqid[N][32];
    for (int i = 0; i < N; i++) {
        recs[i] = (rec_t){.done = &done};
        if (i == 20) {
            assert_int_equal(s_submit(c, "bad", 1, (const char *[]){"0"}, &recs[i]), 0);
            continue;
        }
        snprintf(reqid[i], sizeof(reqid[i]), "group-%d", i);
        assert_int_equal(s_submit_create(c, "bob", reqid[i], &recs[i]), 0);
    }
    s_drive1(c, &done, N, 20000);
    for (int i = 0; i < N; i++)
        assert_int_equal(recs[i].err, i == 20 ? KA_PG_ESQL : 0);
    ka_pgconn_stats_t st;
    ka_pgconn_stats(c, &st);
    assert_true(st.retries >= 1);     /* the neighbours of the failure were re-sent */
    assert_true(st.segments < N / 2); /* and most requests shared commits */
    PGconn *a = s_admin();
    assert_int_equal(s_count(a, "SELECT count(*) FROM ka_sandboxes WHERE creator = 'bob'"), N - 1);
    PQfinish(a);
    ka_pgconn_destroy(&c);
}

/* 100 concurrent duplicates of one create, spread over 4 connections: one row, one id. */
static void test_idempotent_create_100_duplicates(void **unused)
{
    enum { NC = 4, N = 100 };
    ka_pgconn_t *cs[NC];
    for (int i = 0; i < NC; i++) {
        cs[i] = s_engine(&(ka_pgconn_opts_t){.max_batch = 8}, NULL);
        assert_int_equal(ka_pgconn_start(cs[i]), 0);
        s_wait_ready(cs[i]);
    }
    int done = 0;
    static rec_t recs[N];
    for (int i = 0; i < N; i++) {
        recs[i] = (rec_t){.done = &done};
        assert_int_equal(s_submit_create(cs[i % NC], "carol", "dup-1", &recs[i]), 0);
    }
    s_drive(cs, NC, &done, N, 20000);
    int inserted = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(recs[i].err, 0);
        assert_string_equal(recs[i].value2, recs[0].value2); /* everyone reads the winner */
        if (recs[i].value[0])
            inserted++;
    }
    assert_int_equal(inserted, 1);
    PGconn *a = s_admin();
    assert_int_equal(s_count(a, "SELECT count(*) FROM ka_sandboxes WHERE creator = 'carol' AND "
                                "request_id = 'dup-1'"),
                     1);
    PQfinish(a);
    for (int i = 0; i < NC; i++)
        ka_pgconn_destroy(&cs[i]);
}

static void test_serialization_failures_are_retried(void **unused)
{
    ka_pgconn_t *c = s_engine(NULL, NULL);
    assert_int_equal(ka_pgconn_start(c), 0);
    int done = 0;
    rec_t r = {.done = &done};
    ka_pg_stmt_t st = {.name = "flaky"};
    assert_int_equal(ka_pgconn_submit(c, &st, 1, KA_PG_ALONE, s_on_done, &r), 0);
    s_drive1(c, &done, 1, 10000);
    assert_int_equal(r.err, 0);
    assert_string_equal(r.value, "7");
    ka_pgconn_stats_t s;
    ka_pgconn_stats(c, &s);
    assert_true(s.retries >= 1 && s.retries <= 2);
    ka_pgconn_destroy(&c);
    /* with no retries left the conflict is reported as such */
    c = s_engine(&(ka_pgconn_opts_t){.max_retries = 1}, NULL);
    assert_int_equal(ka_pgconn_start(c), 0);
    PGconn *a = s_admin();
    s_sql(a, "SELECT setval('ka_test_seq', 1002)"); /* next two calls fail: 1003, 1004 */
    PQfinish(a);
    assert_int_equal(ka_pgconn_submit(c, &st, 1, 0, s_on_done, &r), 0);
    s_drive1(c, &done, 2, 10000);
    assert_int_equal(r.err, KA_PG_ECONFLICT);
    assert_string_equal(r.sqlstate, "40001");
    ka_pgconn_destroy(&c);
}

typedef struct notes {
    int count;
    char payload[128];
} notes_t;

static void s_on_notify(void *user, const char *channel, const char *payload)
{
    notes_t *n = user;
    if (strcmp(channel, "ka_sandbox") == 0) {
        n->count++;
        snprintf(n->payload, sizeof(n->payload), "%s", payload);
    }
}

static void test_listen_notify(void **unused)
{
    notes_t notes = {0};
    ka_pgconn_t *c = s_engine(NULL, &(ka_pgconn_hooks_t){.user = &notes, .notify = s_on_notify});
    assert_int_equal(ka_pgconn_listen(c, "ka_sandbox"), 0);
    assert_int_equal(ka_pgconn_listen(c, "Bad-Name"), -EINVAL);
    assert_int_equal(ka_pgconn_start(c), 0);
    int done = 0;
    rec_t r = {.done = &done};
    assert_int_equal(s_submit_create(c, "dave", "notify-1", &r), 0);
    s_drive1(c, &done, 1, 10000);
    assert_int_equal(r.err, 0);
    const char *p[2] = {r.value2, "RUNTIME_STATE_READY"};
    assert_int_equal(s_submit(c, "setstate", 2, p, &r), 0);
    s_drive1(c, &done, 2, 10000);
    assert_int_equal(r.err, 0);
    /* the notification follows the commit; drive until it is seen */
    s_drive1(c, &notes.count, 1, 5000);
    char want[128];
    snprintf(want, sizeof(want), "%s RUNTIME_STATE_READY RUNTIME_OPERATION_CREATE", r.value2);
    assert_string_equal(notes.payload, want);
    ka_pgconn_destroy(&c);
}

typedef struct states {
    int backoffs;
    int readies;
    int closing;
} states_t;

static void s_on_state(void *user, ka_pgconn_state_t st, const char *msg)
{
    states_t *s = user;
    if (st == KA_PG_BACKOFF)
        s->backoffs++;
    if (st == KA_PG_READY)
        s->readies++;
}

static void s_on_closing(void *user, int fd)
{
    ((states_t *)user)->closing++;
}

/* The server kills our session with requests in flight: every one of them completes with
 * KA_PG_EUNAVAIL (none hangs), then the engine reconnects by itself and serves again. */
static void test_connection_loss_fails_inflight_then_recovers(void **unused)
{
    states_t sts = {0};
    ka_pgconn_t *c = s_engine(
        &(ka_pgconn_opts_t){.backoff_min_ms = 20, .backoff_max_ms = 100},
        &(ka_pgconn_hooks_t){.user = &sts, .state = s_on_state, .fd_closing = s_on_closing});
    assert_int_equal(ka_pgconn_start(c), 0);
    s_wait_ready(c);
    int done = 0;
    enum { N = 10 };
    static rec_t recs[N];
    for (int i = 0; i < N; i++) {
        recs[i] = (rec_t){.done = &done};
        assert_int_equal(s_submit(c, "sleep", 1, (const char *[]){"5"}, &recs[i]), 0);
    }
    /* let them reach the server, then terminate the backend from outside */
    uint64_t t0 = ka_pg_now_ms();
    PGconn *a = s_admin();
    for (int tries = 0; tries < 100; tries++) {
        int fd;
        uint32_t ev;
        int64_t d;
        ka_pgconn_interest(c, &fd, &ev, &d);
        struct pollfd p = {.fd = fd, .events = POLLIN | ((ev & KA_PG_WRITE) ? POLLOUT : 0)};
        poll(&p, 1, 10);
        if (p.revents)
            ka_pgconn_on_io(c, KA_PG_READ | KA_PG_WRITE);
        if (s_count(a, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep($1%' "
                       "AND state = 'active' AND pid <> pg_backend_pid()") > 0)
            break;
    }
    s_sql(a, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE "
             "'%pg_sleep($1%' AND pid <> pg_backend_pid()");
    s_drive1(c, &done, N, 4000);
    assert_true(ka_pg_now_ms() - t0 < 4500); /* well before the 5 s sleep would end */
    for (int i = 0; i < N; i++)
        assert_int_equal(recs[i].err, KA_PG_EUNAVAIL);
    assert_int_equal(sts.backoffs, 1);
    assert_int_equal(sts.closing, 1);
    /* while backing off, new work is refused at once rather than queued */
    rec_t late = {.done = &done};
    if (ka_pgconn_state(c) == KA_PG_BACKOFF)
        assert_int_equal(s_submit_create(c, "erin", "after-loss", &late), KA_PG_EUNAVAIL);
    s_wait_ready(c);
    assert_int_equal(sts.readies, 2);
    assert_int_equal(s_submit_create(c, "erin", "after-loss", &late), 0);
    s_drive1(c, &done, N + 1, 10000);
    assert_int_equal(late.err, 0);
    PQfinish(a);
    ka_pgconn_destroy(&c);
}

/* A server that is not there: connect fails, backs off, retries; requests are refused. */
static void test_unreachable_server(void **unused)
{
    states_t sts = {0};
    ka_pgconn_t *c = ka_pgconn_new("host=/nonexistent-kagent port=1 connect_timeout=2",
                                   &(ka_pgconn_opts_t){.backoff_min_ms = 10, .backoff_max_ms = 20},
                                   &(ka_pgconn_hooks_t){.user = &sts, .state = s_on_state});
    assert_non_null(c);
    assert_int_equal(ka_pgconn_start(c), 0);
    int done = 0;
    rec_t r = {.done = &done};
    /* either queued then failed, or refused at once: never a hang */
    int rc = s_submit(c, "x", 0, NULL, &r);
    assert_int_equal(rc, -EINVAL); /* nothing prepared under that name */
    uint64_t end = ka_pg_now_ms() + 500;
    while (ka_pg_now_ms() < end) {
        ka_pgconn_on_timer(c);
        ka_pgconn_on_io(c, KA_PG_READ | KA_PG_WRITE);
        poll(NULL, 0, 5);
    }
    assert_true(sts.backoffs >= 3);
    assert_int_equal(sts.readies, 0);
    ka_pgconn_stop(c);
    assert_int_equal(ka_pgconn_state(c), KA_PG_STOPPED);
    ka_pgconn_destroy(&c);
}

/* Every statement of the store prepares against the migrated schema (setup would fail and
 * back off otherwise), and the create/delete/replay sequence keeps the receipt. */
static void test_store_statements_and_tombstone(void **unused)
{
    states_t sts = {0};
    ka_pgconn_t *c =
        ka_pgconn_new("", NULL, &(ka_pgconn_hooks_t){.user = &sts, .state = s_on_state});
    assert_non_null(c);
    size_t n = 0;
    assert_non_null(ka_store_sql(&n));
    assert_true(n >= 20);
    assert_int_equal(ka_store_sql_register(c), 0);
    assert_int_equal(ka_pgconn_start(c), 0);
    s_wait_ready(c);
    assert_int_equal(sts.backoffs, 0);
    int done = 0;
    rec_t r = {.done = &done};
    const char *cp[8] = {"frank", "tomb-1", "box", "default", "python", "", "node-1", "60000"};
    ka_pg_stmt_t create[2] = {{"sb_ins", 8, cp}, {"sb_receipt", 2, cp}};
    assert_int_equal(ka_pgconn_submit(c, create, 2, 0, s_on_done, &r), 0);
    s_drive1(c, &done, 1, 10000);
    assert_int_equal(r.err, 0);
    char id[64];
    snprintf(id, sizeof(id), "%s", r.value);
    assert_int_equal(strlen(id), 36);
    const char *dp[5] = {id, "frank", "", "", "0"};
    ka_pg_stmt_t del[2] = {{"sb_delete", 5, dp}, {"sb_tombstone", 1, dp}};
    assert_int_equal(ka_pgconn_submit(c, del, 2, 0, s_on_done, &r), 0);
    s_drive1(c, &done, 2, 10000);
    assert_int_equal(r.err, 0);
    /* replay after delete: nothing inserted, the receipt returns the tombstoned sandbox */
    memset(r.value, 0, sizeof(r.value));
    assert_int_equal(ka_pgconn_submit(c, create, 2, 0, s_on_done, &r), 0);
    s_drive1(c, &done, 3, 10000);
    assert_int_equal(r.err, 0);
    assert_string_equal(r.value, "");
    assert_string_equal(r.value2, id);
    PGconn *a = s_admin();
    char q[256];
    snprintf(
        q, sizeof(q),
        "SELECT count(*) FROM ka_sandboxes s JOIN ka_tombstones t ON t.sandbox_id = s.id"
        " WHERE s.id = '%s' AND s.state = 'RUNTIME_STATE_DELETED' AND s.deleted_at IS NOT NULL",
        id);
    assert_int_equal(s_count(a, q), 1);
    PQfinish(a);
    ka_pgconn_destroy(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_migrate_rerun_and_refuse_newer),
        cmocka_unit_test(test_migrate_from_empty_in_fresh_db),
        cmocka_unit_test(test_basic_request_and_errors),
        cmocka_unit_test(test_group_commit_isolates_failures),
        cmocka_unit_test(test_idempotent_create_100_duplicates),
        cmocka_unit_test(test_serialization_failures_are_retried),
        cmocka_unit_test(test_listen_notify),
        cmocka_unit_test(test_store_statements_and_tombstone),
        cmocka_unit_test(test_connection_loss_fails_inflight_then_recovers),
        cmocka_unit_test(test_unreachable_server),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}
