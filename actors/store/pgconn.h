/*
 * ka_pgconn: a non-blocking PostgreSQL connection engine on libpq's pipeline mode.
 *
 * It knows nothing of the actor runtime. A driver (the store actor, or a plain poll() loop in
 * tests) feeds it two kinds of events, "the socket is ready" (ka_pgconn_on_io) and "the
 * deadline passed" (ka_pgconn_on_timer), and after every call into the engine asks what to
 * wait for next (ka_pgconn_interest). Nothing in here ever blocks.
 *
 * Work is submitted as requests: one or more prepared statements that must succeed or fail
 * together. Pending requests are grouped into segments; a segment is sent in one go followed
 * by a pipeline sync, so PostgreSQL runs it as one implicit transaction and commits it with
 * one WAL flush (group commit). A request's callback runs only once its segment's commit is
 * confirmed, so an acknowledged write is durable (as durable as the server's settings make
 * it). If a statement fails, only its request fails; the other requests of the segment were
 * rolled back by the server and are retried transparently. Serialization failures and
 * deadlocks (SQLSTATE 40001, 40P01) are retried a bounded number of times.
 *
 * Connection loss: every request sent or queued completes with KA_PG_EUNAVAIL (its outcome
 * may be unknown if it was sent: callers retry idempotent work), then the engine reconnects
 * with exponential backoff. While it waits to reconnect, new requests fail at once with
 * KA_PG_EUNAVAIL; while it is connecting they are queued.
 *
 * Threading: an engine is used by one thread at a time. Callbacks run inside the engine's
 * entry points; they may submit new requests but must not destroy the engine.
 */
#ifndef KA_PGCONN_H
#define KA_PGCONN_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <libpq-fe.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors (negative errno-style) reported to request callbacks and returned by functions. */
#define KA_PG_EUNAVAIL  (-ENOTCONN) /* no connection, or it was lost: UNAVAILABLE */
#define KA_PG_ESQL      (-EIO)      /* the server rejected a statement; see sqlstate/message */
#define KA_PG_ECONFLICT (-EAGAIN)   /* serialization failure/deadlock still failing after retries */

/* Readiness bits for ka_pgconn_interest / ka_pgconn_on_io. */
enum { KA_PG_READ = 1, KA_PG_WRITE = 2 };

/* Connection states, reported through ka_pgconn_hooks_t.state. */
typedef enum {
    KA_PG_IDLE,       /* not started */
    KA_PG_CONNECTING, /* PQconnectPoll in progress */
    KA_PG_SETUP,      /* connected; preparing statements and LISTENs */
    KA_PG_READY,      /* serving requests */
    KA_PG_BACKOFF,    /* lost or failed; waiting to reconnect */
    KA_PG_STOPPED     /* ka_pgconn_stop was called */
} ka_pgconn_state_t;

typedef struct ka_pgconn ka_pgconn_t;

/* Options; zero values pick the defaults in brackets. */
typedef struct ka_pgconn_opts {
    int backoff_min_ms;     /* first reconnect delay [50] */
    int backoff_max_ms;     /* cap of the doubling delay [2000] */
    int connect_timeout_ms; /* a connect attempt longer than this fails [10000] */
    int query_timeout_ms;   /* a segment unanswered this long drops the connection (then
                               KA_PG_EUNAVAIL) [30000] */
    int max_batch;          /* requests per segment (one commit) [256] */
    int max_segments;       /* segments in flight at once [2] */
    int max_retries;        /* retries of a request after serialization failures/aborts [8] */
} ka_pgconn_opts_t;

/* Hooks from the engine to its driver; all optional. */
typedef struct ka_pgconn_hooks {
    void *user;
    /* The engine is about to close fd: stop watching it now. */
    void (*fd_closing)(void *user, int fd);
    /* The connection state changed; message says why (connection errors), may be "". */
    void (*state)(void *user, ka_pgconn_state_t st, const char *message);
    /* A NOTIFY arrived on a channel registered with ka_pgconn_listen. Strings borrowed. */
    void (*notify)(void *user, const char *channel, const char *payload);
} ka_pgconn_hooks_t;

/* What a request's callback gets. Everything is borrowed for the duration of the callback. */
typedef struct ka_pg_outcome {
    int err;                  /* 0, KA_PG_EUNAVAIL, KA_PG_ESQL, KA_PG_ECONFLICT */
    const char *sqlstate;     /* five characters when err == KA_PG_ESQL, else "" */
    const char *message;      /* human-readable error, "" on success */
    PGresult *const *results; /* one per statement (err == 0 only), else NULL */
    int nresults;
} ka_pg_outcome_t;

/* Runs exactly once per accepted request (never if ka_pgconn_submit returned an error). */
typedef void (*ka_pg_done_fn)(void *user, const ka_pg_outcome_t *out);

/* One statement of a request: a prepared statement (by name) and its text parameters. */
typedef struct ka_pg_stmt {
    const char *name;          /* registered with ka_pgconn_prepare */
    int nparams;               /* must equal the count it was prepared with */
    const char *const *params; /* NULL entries are SQL NULL; copied at submit */
} ka_pg_stmt_t;

/* Creates an idle engine for conninfo (libpq syntax; "" uses the PG* environment). Copies
 * conninfo, opts and hooks. NULL on allocation failure. */
ka_pgconn_t *ka_pgconn_new(const char *conninfo, const ka_pgconn_opts_t *opts,
                           const ka_pgconn_hooks_t *hooks);
/* Closes the connection (fd_closing runs), fails every request with KA_PG_EUNAVAIL, frees.
 * Idempotent; NULLs *self_p. */
void ka_pgconn_destroy(ka_pgconn_t **self_p);

/* Registers a statement prepared on every (re)connection, before any request runs. Only
 * before ka_pgconn_start. 0, -EINVAL (bad args), -EEXIST (name taken), -ENOMEM. */
int ka_pgconn_prepare(ka_pgconn_t *self, const char *name, const char *sql, int nparams);
/* Registers a channel LISTENed on every (re)connection. Only before ka_pgconn_start. The
 * channel must be a plain identifier ([a-z_][a-z0-9_]*). */
int ka_pgconn_listen(ka_pgconn_t *self, const char *channel);

/* Starts connecting. 0 or a negative code (then the engine stays idle). */
int ka_pgconn_start(ka_pgconn_t *self);
/* Closes the connection and fails everything with KA_PG_EUNAVAIL; no reconnect follows. */
void ka_pgconn_stop(ka_pgconn_t *self);

/* Queues a request of n statements (1..64) run atomically. flags: KA_PG_ALONE keeps it in a
 * segment of its own (no group commit with others). Returns 0 (cb will run), KA_PG_EUNAVAIL
 * (backing off or stopped), -EINVAL, -ENOMEM; cb does not run on error. */
enum { KA_PG_ALONE = 1 };
int ka_pgconn_submit(ka_pgconn_t *self, const ka_pg_stmt_t *stmts, int n, unsigned flags,
                     ka_pg_done_fn cb, void *user);

/* The socket is ready for events (KA_PG_READ|KA_PG_WRITE; passing both is always safe). */
void ka_pgconn_on_io(ka_pgconn_t *self, uint32_t events);
/* A deadline announced through ka_pgconn_interest passed (calling early is harmless). */
void ka_pgconn_on_timer(ka_pgconn_t *self);

/* What the driver should wait for now: *fd (-1 = none) ready for *events, and/or *delay_ms
 * (-1 = no deadline) from now, after which it calls ka_pgconn_on_timer. */
void ka_pgconn_interest(const ka_pgconn_t *self, int *fd, uint32_t *events, int64_t *delay_ms);

ka_pgconn_state_t ka_pgconn_state(const ka_pgconn_t *self);
const char *ka_pgconn_state_name(ka_pgconn_state_t st);

/* Counters for introspection and tests. */
typedef struct ka_pgconn_stats {
    uint64_t connects; /* successful connections (reaching READY) */
    uint64_t losses;   /* connections lost or failed attempts */
    uint64_t segments; /* segments committed (pipeline syncs) */
    uint64_t requests; /* requests completed successfully */
    uint64_t retries;  /* requests re-sent (aborted by a neighbour or serialization) */
    uint64_t failed;   /* requests completed with an error */
    uint32_t pending;  /* queued, not sent */
    uint32_t inflight; /* sent, awaiting their sync */
} ka_pgconn_stats_t;
void ka_pgconn_stats(const ka_pgconn_t *self, ka_pgconn_stats_t *out);

/* Monotonic milliseconds (the engine's clock). */
uint64_t ka_pg_now_ms(void);

#ifdef __cplusplus
}
#endif
#endif /* KA_PGCONN_H */
