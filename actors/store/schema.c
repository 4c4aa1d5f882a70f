/* ka_schema: see schema.h. */
#include "schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Serializes migrations of concurrent nodes ("kagent" in ASCII, as a lock key). */
#define S_LOCK_KEY "1801545070"

static const char s_v1[] =
    "CREATE TABLE ka_templates ("
    "  namespace text NOT NULL,"
    "  name text NOT NULL,"
    "  uid uuid NOT NULL DEFAULT gen_random_uuid(),"
    "  generation bigint NOT NULL DEFAULT 1,"
    "  spec jsonb NOT NULL,"
    "  status jsonb NOT NULL DEFAULT '{}'::jsonb,"
    "  observed_generation bigint NOT NULL DEFAULT 0,"
    "  desired_revision text NOT NULL DEFAULT '',"
    "  latest_revision text NOT NULL DEFAULT '',"
    "  deleted boolean NOT NULL DEFAULT false,"
    "  created_at timestamptz NOT NULL DEFAULT now(),"
    "  updated_at timestamptz NOT NULL DEFAULT now(),"
    "  PRIMARY KEY (namespace, name));"
    "CREATE TABLE ka_template_revisions ("
    "  hash text PRIMARY KEY,"
    "  namespace text NOT NULL,"
    "  name text NOT NULL,"
    "  generation bigint NOT NULL,"
    "  spec jsonb NOT NULL,"
    "  state text NOT NULL DEFAULT 'PREPARING'"
    "    CHECK (state IN ('PREPARING', 'PREPARED', 'FAILED', 'RETIRED')),"
    "  reason text NOT NULL DEFAULT '',"
    "  message text NOT NULL DEFAULT '',"
    "  created_at timestamptz NOT NULL DEFAULT now(),"
    "  updated_at timestamptz NOT NULL DEFAULT now());"
    "CREATE INDEX ka_template_revisions_template ON ka_template_revisions (namespace, name);"
    "CREATE TABLE ka_sandboxes ("
    "  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),"
    "  creator text NOT NULL,"
    "  request_id text NOT NULL,"
    "  name text NOT NULL DEFAULT '',"
    "  template_namespace text NOT NULL,"
    "  template_name text NOT NULL,"
    "  revision text NOT NULL DEFAULT '',"
    "  state text NOT NULL DEFAULT 'RUNTIME_STATE_CREATING',"
    "  operation text NOT NULL DEFAULT 'RUNTIME_OPERATION_CREATE',"
    "  failure_reason text NOT NULL DEFAULT '',"
    "  failure_message text NOT NULL DEFAULT '',"
    "  node text NOT NULL DEFAULT '',"
    "  created_at timestamptz NOT NULL DEFAULT now(),"
    "  updated_at timestamptz NOT NULL DEFAULT now(),"
    "  expires_at timestamptz NOT NULL,"
    "  deleted_at timestamptz,"
    "  CONSTRAINT ka_sandboxes_receipt UNIQUE (creator, request_id));"
    "CREATE INDEX ka_sandboxes_creator ON ka_sandboxes (creator, created_at, id);"
    "CREATE INDEX ka_sandboxes_live_expiry ON ka_sandboxes (expires_at) WHERE deleted_at IS NULL;"
    "CREATE TABLE ka_tombstones ("
    "  sandbox_id uuid PRIMARY KEY REFERENCES ka_sandboxes (id),"
    "  creator text NOT NULL,"
    "  request_id text NOT NULL,"
    "  deleted_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE ka_pools ("
    "  name text PRIMARY KEY,"
    "  sandbox_class text NOT NULL DEFAULT 'namespaces',"
    "  capacity integer NOT NULL DEFAULT 0,"
    "  spec jsonb NOT NULL DEFAULT '{}'::jsonb,"
    "  created_at timestamptz NOT NULL DEFAULT now(),"
    "  updated_at timestamptz NOT NULL DEFAULT now());"
    "INSERT INTO ka_pools (name) VALUES ('kagent-default');"
    "CREATE TABLE ka_nodes ("
    "  id text PRIMARY KEY,"
    "  name text NOT NULL,"
    "  endpoint text NOT NULL DEFAULT '',"
    "  pools text NOT NULL DEFAULT '',"
    "  capacity integer NOT NULL DEFAULT 0,"
    "  started_at timestamptz NOT NULL DEFAULT now(),"
    "  heartbeat_at timestamptz NOT NULL DEFAULT now(),"
    "  lease_expires_at timestamptz NOT NULL);"
    "CREATE FUNCTION ka_sandbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN"
    "  PERFORM pg_notify('ka_sandbox', NEW.id::text || ' ' || NEW.state || ' ' || NEW.operation);"
    "  RETURN NULL;"
    " END $$;"
    "CREATE TRIGGER ka_sandboxes_changed AFTER UPDATE OF state, operation ON ka_sandboxes"
    "  FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state"
    "                     OR OLD.operation IS DISTINCT FROM NEW.operation)"
    "  EXECUTE FUNCTION ka_sandbox_notify();"
    "CREATE FUNCTION ka_template_notify() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN"
    "  PERFORM pg_notify('ka_template', NEW.namespace || '/' || NEW.name || ' '"
    "                    || NEW.generation::text);"
    "  RETURN NULL;"
    " END $$;"
    "CREATE TRIGGER ka_templates_changed AFTER INSERT OR UPDATE ON ka_templates"
    "  FOR EACH ROW EXECUTE FUNCTION ka_template_notify();";

/* Sandbox ids are UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, version 7, then random, so
 * ids sort by creation time as in the original's examples. */
static const char s_v2[] =
    "CREATE FUNCTION ka_uuidv7() RETURNS uuid LANGUAGE sql VOLATILE AS $$"
    " SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING"
    "  substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)"
    "  FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid $$;"
    "ALTER TABLE ka_sandboxes ALTER COLUMN id SET DEFAULT ka_uuidv7();";

/* The cluster (issue 14): node ids for actor addresses come from a sequence (1..65535, never
 * reused); a node's row carries its mesh endpoint, its CURVE public key and its incarnation
 * (bumped at every registration: the fencing counter). Sandboxes by node, for the node list. */
static const char s_v3[] =
    "CREATE SEQUENCE ka_node_ids MINVALUE 1 MAXVALUE 65535;"
    "ALTER TABLE ka_nodes ADD COLUMN mesh_endpoint text NOT NULL DEFAULT '',"
    "  ADD COLUMN public_key text NOT NULL DEFAULT '',"
    "  ADD COLUMN incarnation bigint NOT NULL DEFAULT 0;"
    "CREATE INDEX ka_sandboxes_node ON ka_sandboxes (node) WHERE deleted_at IS NULL;";

/* Drain (issue 14): a draining node takes no new placements. */
static const char s_v4[] =
    "ALTER TABLE ka_nodes ADD COLUMN draining boolean NOT NULL DEFAULT false;";

/* Node names are unique (sandboxes name their node by it): where two rows shared one, all but
 * the one heard from last are renamed "<name>~<id>". Incarnations come from one sequence, so a
 * node whose row was forgotten (mesh.forget) registers again under a greater one. */
static const char s_v5[] =
    "UPDATE ka_nodes n SET name = n.name || '~' || n.id WHERE EXISTS (SELECT FROM ka_nodes o"
    "  WHERE o.name = n.name AND (o.heartbeat_at, o.id) > (n.heartbeat_at, n.id));"
    "CREATE UNIQUE INDEX ka_nodes_name ON ka_nodes (name);"
    "CREATE SEQUENCE ka_node_incarnations;"
    "SELECT setval('ka_node_incarnations', (SELECT coalesce(max(incarnation), 0) + 1"
    "  FROM ka_nodes), false);";

typedef struct s_migration {
    int version;
    const char *sql;
} s_migration_t;

static const s_migration_t s_migrations[] = {
    {1, s_v1}, {2, s_v2}, {3, s_v3}, {4, s_v4}, {5, s_v5},
};

_Static_assert(sizeof(s_migrations) / sizeof(s_migrations[0]) == KA_SCHEMA_VERSION,
               "one migration per schema version");

static void s_err(char *err, size_t cap, const char *what, const PGconn *conn, const PGresult *r)
{
    if (!err || cap == 0)
        return;
    const char *m = r ? PQresultErrorMessage(r) : PQerrorMessage(conn);
    snprintf(err, cap, "%s: %s", what, m && *m ? m : "unknown error");
    size_t len = strlen(err);
    while (len > 0 && err[len - 1] == '\n')
        err[--len] = '\0';
}

/* Runs sql; 0 if it returned status ok (tuples or command), else a negative code. */
static int s_exec(PGconn *conn, const char *sql, const char *what, char *err, size_t cap,
                  PGresult **out)
{
    PGresult *r = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
        if (out)
            *out = r;
        else
            PQclear(r);
        return 0;
    }
    s_err(err, cap, what, conn, r);
    PQclear(r);
    return PQstatus(conn) == CONNECTION_BAD ? -ENOTCONN : -EIO;
}

int ka_schema_version(PGconn *conn)
{
    PGresult *r = NULL;
    int rc = s_exec(conn,
                    "SELECT CASE WHEN to_regclass('ka_schema_version') IS NULL THEN 0 ELSE "
                    "(SELECT coalesce(max(version), 0) FROM ka_schema_version) END",
                    "read schema version", NULL, 0, &r);
    if (rc)
        return rc;
    int v = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

int ka_schema_migrate(PGconn *conn, int *from, int *to, char *err, size_t errcap)
{
    if (!conn || PQstatus(conn) != CONNECTION_OK) {
        if (err && errcap)
            snprintf(err, errcap, "migrate: not connected");
        return -ENOTCONN;
    }
    PGresult *r = NULL;
    int rc = s_exec(conn, "BEGIN", "begin", err, errcap, NULL);
    if (rc)
        return rc;
    /* no "already exists, skipping" notices on re-runs */
    rc = s_exec(conn, "SET LOCAL client_min_messages = warning", "set", err, errcap, NULL);
    if (rc)
        goto rollback;
    rc = s_exec(conn, "SELECT pg_advisory_xact_lock(" S_LOCK_KEY ")", "lock", err, errcap, NULL);
    if (rc)
        goto rollback;
    rc = s_exec(conn,
                "CREATE TABLE IF NOT EXISTS ka_schema_version ("
                " version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now(),"
                " binary_version text NOT NULL DEFAULT '')",
                "create ka_schema_version", err, errcap, NULL);
    if (rc)
        goto rollback;
    rc = s_exec(conn, "SELECT coalesce(max(version), 0) FROM ka_schema_version",
                "read schema version", err, errcap, &r);
    if (rc)
        goto rollback;
    int cur = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (from)
        *from = cur;
    if (cur > KA_SCHEMA_VERSION) {
        if (err && errcap)
            snprintf(err, errcap,
                     "database schema version %d is newer than this binary knows (%d): "
                     "refusing to run; upgrade kagentd",
                     cur, KA_SCHEMA_VERSION);
        rc = KA_SCHEMA_ENEWER;
        goto rollback;
    }
    for (size_t i = 0; i < sizeof(s_migrations) / sizeof(s_migrations[0]); i++) {
        const s_migration_t *m = &s_migrations[i];
        if (m->version <= cur)
            continue;
        char what[64], ins[160];
        snprintf(what, sizeof(what), "migration %d", m->version);
        rc = s_exec(conn, m->sql, what, err, errcap, NULL);
        if (rc)
            goto rollback;
        snprintf(ins, sizeof(ins),
                 "INSERT INTO ka_schema_version (version, binary_version) VALUES (%d, '%s')",
                 m->version, KAGENT_VERSION);
        rc = s_exec(conn, ins, what, err, errcap, NULL);
        if (rc)
            goto rollback;
        cur = m->version;
    }
    rc = s_exec(conn, "COMMIT", "commit", err, errcap, NULL);
    if (rc)
        return rc;
    if (to)
        *to = cur;
    return 0;
rollback:
    PQclear(PQexec(conn, "ROLLBACK"));
    return rc;
}

int ka_schema_migrate_url(const char *conninfo, int *from, int *to, char *err, size_t errcap)
{
    PGconn *conn = PQconnectdb(conninfo ? conninfo : "");
    if (!conn)
        return -ENOMEM;
    int rc;
    if (PQstatus(conn) != CONNECTION_OK) {
        s_err(err, errcap, "connect", conn, NULL);
        rc = -ENOTCONN;
    } else {
        rc = ka_schema_migrate(conn, from, to, err, errcap);
    }
    PQfinish(conn);
    return rc;
}
