/*
 * ka_schema: the store's PostgreSQL schema and its versioned migrations.
 *
 * Migrations are SQL compiled into the binary, numbered 1..KA_SCHEMA_VERSION. Applying them
 * is one transaction under an advisory lock (so nodes starting together take turns): it reads
 * ka_schema_version, refuses a database whose version is newer than this binary knows, and
 * applies the missing steps in order. Running it again is a no-op.
 *
 * Tables (see schema.c for columns):
 *   ka_schema_version      one row per applied migration
 *   ka_templates           SandboxTemplates: namespace/name, generation, spec, status,
 *                          observed generation, desired/latest revision, deleted flag
 *   ka_template_revisions  immutable revisions by content hash: spec, preparation state,
 *                          reason/message
 *   ka_sandboxes           sandboxes; UNIQUE (creator, request_id) is the creation receipt
 *   ka_tombstones          one row per deleted sandbox (the sandbox row stays, in state
 *                          RUNTIME_STATE_DELETED, so a replayed create returns it)
 *   ka_pools, ka_nodes     worker pools; nodes (id from sequence ka_node_ids) with API and
 *                          mesh endpoints, CURVE public key, pools, lease and incarnation
 * Change events: triggers NOTIFY channel ka_sandbox ("<id> <state> <operation>") and
 * ka_template ("<namespace>/<name> <generation>").
 *
 * Blocking (libpq synchronous API): call at node start or from a job thread.
 */
#ifndef KA_SCHEMA_H
#define KA_SCHEMA_H

#include <errno.h>
#include <stddef.h>

#include <libpq-fe.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The newest schema this binary knows. */
#define KA_SCHEMA_VERSION 5

/* The database's schema is newer than KA_SCHEMA_VERSION: refuse to run. */
#define KA_SCHEMA_ENEWER (-EPROTO)

/* Applies missing migrations on an open connection. from and to (optional) receive the version
 * found and the version left. Returns 0, KA_SCHEMA_ENEWER, -ENOTCONN (connection trouble) or
 * -EIO (a statement failed); err (optional) receives a message. Nothing is half-applied. */
int ka_schema_migrate(PGconn *conn, int *from, int *to, char *err, size_t errcap);

/* Same, opening (and closing) a connection with conninfo ("" = PG* environment). */
int ka_schema_migrate_url(const char *conninfo, int *from, int *to, char *err, size_t errcap);

/* The version recorded in the database (0 if none), or a negative code. */
int ka_schema_version(PGconn *conn);

#ifdef __cplusplus
}
#endif
#endif /* KA_SCHEMA_H */
