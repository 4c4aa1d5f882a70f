/*
 * ka_db_watch: the node's watch over its database. A thread that, once a second, asks the store
 * whether it is connected (so /readyz says 503 while the database is away instead of 200) and,
 * only when it is not, starts the embedded PostgreSQL again if its postmaster died (the node
 * owns that cluster, as a supervisor owns a child).
 */
#ifndef KA_DB_WATCH_H
#define KA_DB_WATCH_H

#include "krt.h"

#include <stdbool.h>

typedef struct ka_db_watch ka_db_watch_t;

/* store: the store actor's registered name (static), looked up at each check. state_dir: the
 * embedded cluster's node state dir, or NULL for an external database (only watched). path:
 * the actor path to log under. NULL if the thread cannot start. */
ka_db_watch_t *ka_db_watch_start(krt_system_t *sys, const char *store, const char *state_dir,
                                 const char *path);
/* true while the store's last answer said it is connected */
bool ka_db_watch_ok(const ka_db_watch_t *w);
/* Stops and joins the thread; NULLs *w. */
void ka_db_watch_stop(ka_db_watch_t **w);

#endif
