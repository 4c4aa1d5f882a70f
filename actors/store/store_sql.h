/*
 * ka_store_sql: the store's prepared statements (name, parameter count, SQL), shared by the
 * store actor and by tools and tests that drive a ka_pgconn engine directly.
 *
 * Parameters are text. Sandbox rows come back as the columns of ka_store_sandbox_t in order
 * (id, creator, request_id, name, template_namespace, template_name, revision, state,
 * operation, failure_reason, failure_message, node, created, updated, expires, deleted; times
 * in epoch ms, deleted 0 when live). The create pair is "sb_ins" (insert or nothing on the
 * (creator, request_id) receipt) then "sb_receipt" (read the winner): sent together in one
 * request they make creation idempotent even under concurrent duplicates.
 */
#ifndef KA_STORE_SQL_H
#define KA_STORE_SQL_H

#include <stddef.h>

#include "pgconn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ka_store_sql {
    const char *name;
    int nparams;
    const char *sql;
} ka_store_sql_t;

/* The statement table (static); *n receives its length. */
const ka_store_sql_t *ka_store_sql(size_t *n);

/* Registers every statement with an idle engine (ka_pgconn_prepare). 0 or its error. */
int ka_store_sql_register(ka_pgconn_t *eng);

#ifdef __cplusplus
}
#endif
#endif /* KA_STORE_SQL_H */
