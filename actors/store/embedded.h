/*
 * ka_pg_embedded: the embedded default database. With no database URL configured, kagentd
 * runs a private PostgreSQL cluster of its own under <state_dir>/postgres:
 *   <state_dir>/postgres/data        the cluster (initdb on first start, reused afterwards)
 *   <state_dir>/postgres/.s.PGSQL.*  its unix socket (no TCP port is opened)
 *   <state_dir>/postgres/server.log  the server's log; ctl.log the tools' output
 * As root the cluster belongs to the `postgres` system user (initdb refuses root): the
 * directory is chowned to it and <state_dir> is made traversable (o+x) for it. Local
 * connections are trusted; the socket directory is mode 0700, so only root and `postgres`
 * reach it. Durability settings are PostgreSQL's defaults (fsync and synchronous_commit on).
 *
 * These calls block (initdb takes about half a second, a start or stop a fraction of one): call
 * them at node start/stop, before the schedulers matter, or from a job thread. Server binaries
 * come from $KAGENT_PG_BINDIR, else the newest /usr/lib/postgresql/<v>/bin.
 */
#ifndef KA_PG_EMBEDDED_H
#define KA_PG_EMBEDDED_H

#ifdef __cplusplus
extern "C" {
#endif

/* Creates (first time), starts (unless already running, e.g. after a crash of kagentd) and
 * checks the cluster, and makes sure database "kagent" exists. *conninfo_out receives a
 * malloc'd libpq conninfo string the caller frees. 0 or a negative errno-style code;
 * ka_pg_embedded_error() then describes it. */
int ka_pg_embedded_start(const char *state_dir, char **conninfo_out);

/* Stops the cluster (fast shutdown: sessions are closed, committed data is kept). Stopping a
 * cluster that is not running is not an error. */
int ka_pg_embedded_stop(const char *state_dir);

/* True if the cluster under state_dir is running. */
int ka_pg_embedded_running(const char *state_dir);

/* The last failure's description on this thread ("" if none). */
const char *ka_pg_embedded_error(void);

#ifdef __cplusplus
}
#endif
#endif /* KA_PG_EMBEDDED_H */
