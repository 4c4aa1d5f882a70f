/* ka_store_sql: see store_sql.h. */
#include "store_sql.h"

#define S_MS(col) "(extract(epoch FROM " col ") * 1000)::int8"

/* Sandbox columns in ka_store_sandbox_t order (s_row_sandbox). */
#define S_SB_COLS                                                                                  \
    "id::text, creator, request_id, name, template_namespace, template_name, revision, state,"     \
    " operation, failure_reason, failure_message, node, " S_MS("created_at") ", " S_MS(            \
        "updated_at") ", " S_MS("expires_at") ", coalesce(" S_MS("deleted_at") ", 0)"

#define S_TP_COLS                                                                                  \
    "namespace, name, uid::text, deleted, generation, observed_generation, desired_revision,"      \
    " latest_revision, " S_MS("created_at") ", " S_MS("updated_at") ", spec::text, status::text"

#define S_RV_COLS                                                                                  \
    "hash, namespace, name, generation, state, reason, message, " S_MS("created_at") ", " S_MS(    \
        "updated_at") ", spec::text"

/* Node columns in s_row_node order; alive and sandboxes are judged by the database's clock. */
#define S_NODE_COLS                                                                                \
    "id, name, endpoint, pools, capacity, " S_MS("started_at") ", " S_MS(                          \
        "heartbeat_at") ", " S_MS("lease_expires_at") ", mesh_endpoint, public_key, incarnation,"  \
                                                      " lease_expires_at > now(), (SELECT "        \
                                                      "count(*) FROM ka_sandboxes s"               \
                                                      " WHERE s.node = n.name AND s.deleted_at "   \
                                                      "IS NULL AND s.state NOT IN"                 \
                                                      " ('RUNTIME_STATE_FAILED', "                 \
                                                      "'RUNTIME_STATE_DELETED')), draining"

/* The fence of a node's write: node id `id` ('' = no fence) holds its lease under incarnation
 * `inc` (the fencing counter), by the database's clock. */
#define S_FENCE(id, inc)                                                                           \
    "(" id " = '' OR EXISTS (SELECT FROM ka_nodes WHERE id = " id " AND incarnation = " inc        \
    "::int8 AND lease_expires_at > now()))"

static const ka_store_sql_t s_statements[] = {
    {"sb_ins", 8,
     "INSERT INTO ka_sandboxes (creator, request_id, name, template_namespace, template_name,"
     " revision, node, expires_at) VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 = '' THEN coalesce("
     "(SELECT latest_revision FROM ka_templates WHERE namespace = $4 AND name = $5), '')"
     " ELSE $6 END, $7, now() + $8::int8 * interval '1 millisecond')"
     " ON CONFLICT ON CONSTRAINT ka_sandboxes_receipt DO NOTHING RETURNING " S_SB_COLS},
    /* One statement: insert, or return the receipt's row (created = false). A duplicate
     * committed concurrently by another connection is not visible to this statement's
     * snapshot: then no row comes back and the caller reads "sb_receipt" next. */
    {"sb_create", 10,
     "WITH ins AS (INSERT INTO ka_sandboxes (id, creator, request_id, name, template_namespace,"
     " template_name, revision, node, expires_at, state, operation) VALUES ("
     "coalesce(nullif($9, '')::uuid, ka_uuidv7()), $1, $2, $3, $4, $5, CASE WHEN $6 = ''"
     " THEN coalesce((SELECT latest_revision FROM ka_templates WHERE namespace = $4 AND"
     " name = $5), '') ELSE $6 END, $7, now() + $8::int8 * interval '1 millisecond',"
     " CASE WHEN $10::bool THEN 'RUNTIME_STATE_READY' ELSE 'RUNTIME_STATE_CREATING' END,"
     " CASE WHEN $10::bool THEN 'RUNTIME_OPERATION_NONE' ELSE 'RUNTIME_OPERATION_CREATE' END)"
     " ON CONFLICT ON CONSTRAINT ka_sandboxes_receipt DO NOTHING RETURNING *)"
     " SELECT " S_SB_COLS ", true FROM ins UNION ALL SELECT " S_SB_COLS ", false"
     " FROM ka_sandboxes WHERE creator = $1 AND request_id = $2 AND NOT EXISTS (SELECT FROM ins)"},
    {"sb_receipt", 2,
     "SELECT " S_SB_COLS " FROM ka_sandboxes WHERE creator = $1 AND request_id = $2"},
    {"sb_get", 2,
     "SELECT " S_SB_COLS " FROM ka_sandboxes WHERE id = $1::uuid AND ($2 = '' OR creator = $2)"},
    {"sb_list", 7,
     "SELECT " S_SB_COLS " FROM ka_sandboxes WHERE ($1 = '' OR creator = $1)"
     " AND ($2 = '' OR template_namespace = $2) AND ($3 = '' OR template_name = $3)"
     " AND ($7 = '' OR node = $7)"
     " AND ($4::bool OR deleted_at IS NULL) ORDER BY created_at, id LIMIT $5::int OFFSET $6::int"},
    {"sb_update", 10,
     "UPDATE ka_sandboxes SET state = coalesce($2, state), operation = coalesce($3, operation),"
     " failure_reason = coalesce($4, failure_reason),"
     " failure_message = coalesce($5, failure_message), node = coalesce($6, node),"
     " updated_at = now() WHERE id = $1::uuid AND deleted_at IS NULL"
     " AND ($7::text IS NULL OR state = $7) AND ($8 = '' OR node = $8) AND " S_FENCE(
         "$9", "$10") " RETURNING " S_SB_COLS},
    {"sb_delete", 5,
     "UPDATE ka_sandboxes SET state = 'RUNTIME_STATE_DELETED', operation = "
     "'RUNTIME_OPERATION_NONE',"
     " deleted_at = coalesce(deleted_at, now()), updated_at = now()"
     " WHERE id = $1::uuid AND ($2 = '' OR creator = $2) AND ($3 = '' OR node = $3) AND " S_FENCE(
         "$4", "$5") " RETURNING " S_SB_COLS},
    {"sb_tombstone", 1,
     "INSERT INTO ka_tombstones (sandbox_id, creator, request_id, deleted_at)"
     " SELECT id, creator, request_id, deleted_at FROM ka_sandboxes"
     " WHERE id = $1::uuid AND deleted_at IS NOT NULL ON CONFLICT DO NOTHING"},
    {"sb_expiry", 3,
     "SELECT " S_SB_COLS " FROM ka_sandboxes WHERE deleted_at IS NULL AND"
     " (CASE WHEN $1::bool THEN expires_at <= now() ELSE expires_at > now() END)"
     " ORDER BY expires_at, id LIMIT $2::int OFFSET $3::int"},
    {"tp_put", 3,
     "INSERT INTO ka_templates AS t (namespace, name, spec) VALUES ($1, $2, $3::jsonb)"
     " ON CONFLICT (namespace, name) DO UPDATE SET spec = EXCLUDED.spec,"
     " generation = CASE WHEN t.deleted OR t.spec <> EXCLUDED.spec THEN t.generation + 1"
     " ELSE t.generation END,"
     " uid = CASE WHEN t.deleted THEN gen_random_uuid() ELSE t.uid END,"
     " deleted = false, updated_at = now() RETURNING " S_TP_COLS},
    {"tp_status", 6,
     "UPDATE ka_templates SET status = $3::jsonb, observed_generation = $4::int8,"
     " desired_revision = $5, latest_revision = CASE WHEN $6 = '' THEN latest_revision ELSE $6 END,"
     " updated_at = now() WHERE namespace = $1 AND name = $2 RETURNING " S_TP_COLS},
    {"tp_get", 3,
     "SELECT " S_TP_COLS " FROM ka_templates WHERE namespace = $1 AND name = $2"
     " AND ($3::bool OR NOT deleted)"},
    {"tp_list", 4,
     "SELECT " S_TP_COLS " FROM ka_templates WHERE ($1 = '' OR namespace = $1)"
     " AND ($2::bool OR NOT deleted) ORDER BY namespace, name LIMIT $3::int OFFSET $4::int"},
    {"tp_delete", 2,
     "UPDATE ka_templates SET deleted = true, updated_at = now()"
     " WHERE namespace = $1 AND name = $2 RETURNING " S_TP_COLS},
    {"rv_ins", 8,
     "INSERT INTO ka_template_revisions (hash, namespace, name, generation, state, reason,"
     " message, spec) VALUES ($1, $2, $3, $4::int8, $5, $6, $7, $8::jsonb)"
     " ON CONFLICT (hash) DO NOTHING"},
    {"rv_get", 1, "SELECT " S_RV_COLS " FROM ka_template_revisions WHERE hash = $1"},
    {"rv_state", 4,
     "UPDATE ka_template_revisions SET state = $2, reason = $3, message = $4, updated_at = now()"
     " WHERE hash = $1"},
    {"rv_latest", 1,
     "UPDATE ka_templates t SET latest_revision = r.hash, updated_at = now()"
     " FROM ka_template_revisions r WHERE r.hash = $1 AND r.state = 'PREPARED'"
     " AND t.namespace = r.namespace AND t.name = r.name"},
    {"pool_put", 3,
     "INSERT INTO ka_pools AS p (name, sandbox_class, capacity) VALUES ($1, $2, $3::int)"
     " ON CONFLICT (name) DO UPDATE SET sandbox_class = EXCLUDED.sandbox_class,"
     " capacity = EXCLUDED.capacity, updated_at = now()"
     " RETURNING name, sandbox_class, capacity, " S_MS("updated_at")},
    {"pool_list", 0,
     "SELECT name, sandbox_class, capacity, " S_MS("updated_at") " FROM ka_pools ORDER BY name"},
    /* register: every registration is a new incarnation (the fencing counter, from one
     * sequence: greater than any before, also for a node whose row was forgotten) */
    {"node_put", 8,
     "INSERT INTO ka_nodes AS n (id, name, endpoint, mesh_endpoint, public_key, pools, capacity,"
     " incarnation, lease_expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7::int,"
     " nextval('ka_node_incarnations'),"
     " now() + $8::int8 * interval '1 millisecond')"
     " ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, endpoint = EXCLUDED.endpoint,"
     " mesh_endpoint = EXCLUDED.mesh_endpoint, public_key = EXCLUDED.public_key,"
     " pools = EXCLUDED.pools, capacity = EXCLUDED.capacity, incarnation = EXCLUDED.incarnation,"
     " started_at = now(), heartbeat_at = now(), lease_expires_at = EXCLUDED.lease_expires_at,"
     " draining = false"
     " RETURNING " S_NODE_COLS},
    /* renew: only the incarnation that holds the lease, and only before it lapsed */
    {"node_hb", 3,
     "UPDATE ka_nodes AS n SET heartbeat_at = now(),"
     " lease_expires_at = now() + $2::int8 * interval '1 millisecond'"
     " WHERE id = $1 AND incarnation = $3::int8 AND lease_expires_at > now()"
     " RETURNING " S_NODE_COLS},
    {"node_list", 0, "SELECT " S_NODE_COLS " FROM ka_nodes n ORDER BY length(id), id"},
    /* drain: no placement on the node from now on (until it registers again) */
    {"node_drain", 1,
     "UPDATE ka_nodes AS n SET draining = true WHERE id = $1 RETURNING " S_NODE_COLS},
    /* forget: the row of a node whose lease lapsed under incarnation $2 at least $3 ms ago and
     * that names no sandbox any more (a takeover moved them, or they were deleted) */
    {"node_forget", 3,
     "DELETE FROM ka_nodes n WHERE id = $1 AND incarnation = $2::int8"
     " AND lease_expires_at <= now() - $3::int8 * interval '1 millisecond'"
     " AND NOT EXISTS (SELECT FROM ka_sandboxes s WHERE s.node = n.name AND s.deleted_at IS NULL)"
     " RETURNING " S_NODE_COLS},
    /* takeover: a live node (the taker, its lease held by that incarnation) moves up to $8
     * live sandboxes of a node whose lease lapsed under the incarnation the taker saw (the
     * compare-and-set: a node that registered again since is not taken over), locking that
     * node's row so it cannot register meanwhile. Their compute was lost with the node: FAILED
     * with the reason, unless FAILED already, being deleted (the taker finishes the delete), or
     * suspended into object storage (s3://, gs://: resumable on the taker; not one whose /data
     * stayed on the lost node's disk, ComputeLost). */
    {"node_takeover", 8,
     "WITH dead AS (SELECT name FROM ka_nodes WHERE id = $1 AND incarnation = $2::int8"
     " AND lease_expires_at <= now() FOR UPDATE),"
     " taker AS (SELECT FROM ka_nodes WHERE id = $4 AND incarnation = $5::int8"
     " AND lease_expires_at > now()),"
     " moved AS (SELECT s.id AS mid, (s.state IN ('RUNTIME_STATE_FAILED', 'RUNTIME_STATE_DELETING')"
     " OR (s.state = 'RUNTIME_STATE_SUSPENDED' AND s.failure_reason <> 'ComputeLost'"
     " AND coalesce((SELECT r.spec #>> '{substrate,snapshotPolicy,location}'"
     " FROM ka_template_revisions r WHERE r.hash = s.revision), '') ~ '^(s3|gs)://')) AS keep"
     " FROM ka_sandboxes s JOIN dead ON s.node = dead.name"
     " WHERE s.deleted_at IS NULL AND EXISTS (SELECT FROM taker) ORDER BY s.id"
     " LIMIT $8::int FOR UPDATE OF s)"
     " UPDATE ka_sandboxes s SET node = $3, updated_at = now(),"
     " state = CASE WHEN moved.keep THEN s.state ELSE 'RUNTIME_STATE_FAILED' END,"
     " operation = CASE WHEN moved.keep THEN s.operation ELSE 'RUNTIME_OPERATION_NONE' END,"
     " failure_reason = CASE WHEN moved.keep THEN s.failure_reason ELSE $6 END,"
     " failure_message = CASE WHEN moved.keep THEN s.failure_message ELSE $7 END"
     " FROM moved WHERE s.id = moved.mid RETURNING " S_SB_COLS},
};

const ka_store_sql_t *ka_store_sql(size_t *n)
{
    if (n)
        *n = sizeof(s_statements) / sizeof(s_statements[0]);
    return s_statements;
}

int ka_store_sql_register(ka_pgconn_t *eng)
{
    for (size_t i = 0; i < sizeof(s_statements) / sizeof(s_statements[0]); i++) {
        const ka_store_sql_t *s = &s_statements[i];
        int rc = ka_pgconn_prepare(eng, s->name, s->sql, s->nparams);
        if (rc)
            return rc;
    }
    return 0;
}
