/*
 * Tests for actors/store/embedded.c: the embedded default database starts in a fresh state
 * directory, keeps its data across a stop/start (a node restart), is reused when found
 * running (after a crash of the node), and stops. Real initdb/pg_ctl; everything it creates
 * is removed at the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "embedded.h"

static char s_dir[64];

static int s_setup(void **state)
{
    snprintf(s_dir, sizeof(s_dir), "/tmp/ka-emb-XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    return 0;
}

static int s_teardown(void **state)
{
    ka_pg_embedded_stop(s_dir);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_exec(PGconn *c, const char *sql, const char *want)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    if (want)
        assert_string_equal(PQgetvalue(r, 0, 0), want);
    PQclear(r);
}

static PGconn *s_connect(const char *ci)
{
    PGconn *c = PQconnectdb(ci);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("connect %s: %s", ci, PQerrorMessage(c));
    return c;
}

static void test_start_restart_reuse_stop(void **unused)
{
    char *ci = NULL;
    int rc = ka_pg_embedded_start(s_dir, &ci);
    if (rc)
        fail_msg("embedded start: %s", ka_pg_embedded_error());
    assert_non_null(ci);
    assert_non_null(strstr(ci, "dbname=kagent"));
    assert_true(ka_pg_embedded_running(s_dir));
    PGconn *c = s_connect(ci);
    /* durable by default, no TCP listener */
    s_exec(c, "SHOW synchronous_commit", "on");
    s_exec(c, "SHOW fsync", "on");
    s_exec(c, "SHOW listen_addresses", "");
    s_exec(c, "CREATE TABLE kept (v text)", NULL);
    s_exec(c, "INSERT INTO kept VALUES ('survives')", NULL);
    PQfinish(c);

    /* node stops: the cluster stops with it */
    assert_int_equal(ka_pg_embedded_stop(s_dir), 0);
    assert_false(ka_pg_embedded_running(s_dir));
    c = PQconnectdb(ci);
    assert_int_not_equal(PQstatus(c), CONNECTION_OK);
    PQfinish(c);
    assert_int_equal(ka_pg_embedded_stop(s_dir), 0); /* stopping twice is fine */

    /* node restarts: same cluster, same data, same conninfo */
    char *ci2 = NULL;
    rc = ka_pg_embedded_start(s_dir, &ci2);
    if (rc)
        fail_msg("embedded restart: %s", ka_pg_embedded_error());
    assert_string_equal(ci, ci2);
    c = s_connect(ci2);
    s_exec(c, "SELECT v FROM kept", "survives");
    PQfinish(c);

    /* node crashed and starts again while the cluster still runs: reused as is */
    char *ci3 = NULL;
    rc = ka_pg_embedded_start(s_dir, &ci3);
    if (rc)
        fail_msg("embedded start while running: %s", ka_pg_embedded_error());
    c = s_connect(ci3);
    s_exec(c, "SELECT count(*) FROM kept", "1");
    PQfinish(c);

    assert_int_equal(ka_pg_embedded_stop(s_dir), 0);
    assert_false(ka_pg_embedded_running(s_dir));
    /* the cluster lives where documented */
    char p[128];
    snprintf(p, sizeof(p), "%s/postgres/data/PG_VERSION", s_dir);
    assert_int_equal(access(p, F_OK), 0);
    free(ci);
    free(ci2);
    free(ci3);
}

static void test_bad_arguments(void **unused)
{
    char *ci = (char *)"x";
    assert_int_equal(ka_pg_embedded_start("", &ci), -EINVAL);
    assert_null(ci);
    assert_true(strlen(ka_pg_embedded_error()) > 0);
    assert_int_equal(ka_pg_embedded_start(s_dir, NULL), -EINVAL);
    char longdir[200];
    memset(longdir, 'a', sizeof(longdir) - 1);
    longdir[0] = '/';
    longdir[sizeof(longdir) - 1] = '\0';
    assert_int_equal(ka_pg_embedded_start(longdir, &ci), -ENAMETOOLONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_start_restart_reuse_stop),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
