/* ka_pgconn: see pgconn.h for the contract. */
#include "pgconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrics.h"

#define S_MAX_STMTS    64
#define S_MAX_SEGMENTS 16

/* A request and its copied parameters (one allocation). */
typedef struct s_req {
    struct s_req *next;
    ka_pg_done_fn cb;
    void *user;
    unsigned flags;
    int n;               /* statements */
    int retries;         /* times re-sent */
    ka_pg_stmt_t *stmts; /* n entries, names point into the engine's registry */
    PGresult **results;  /* n entries, filled while in flight */
    int cur;             /* statement whose results are being read */
    bool failed;         /* a statement failed (sqlstate/msg set) */
    bool aborted;        /* skipped because an earlier statement of the segment failed */
    char sqlstate[6];
    char *errmsg;     /* malloc'd, or NULL */
    int final_err;    /* outcome once finished */
    double submitted; /* ka_metric_now() at submit: kagent_store_query_seconds */
} s_req_t;

/* A sync segment in flight: nreq requests (at the head of inflight) or an internal setup
 * batch of `internal` single-result queries, then a PGRES_PIPELINE_SYNC. */
typedef struct s_seg {
    bool setup; /* the connection's setup batch */
    int nreq;
    int internal;
    bool failed;
    bool commit_failed;
    char sqlstate[6];
    char *errmsg;
    uint64_t sent_at;
} s_seg_t;

typedef struct s_prep {
    char *name;
    char *sql;
    int nparams;
} s_prep_t;

typedef struct s_queue {
    s_req_t *head;
    s_req_t *tail;
    uint32_t count;
} s_queue_t;

struct ka_pgconn {
    char *conninfo;
    ka_pgconn_opts_t opts;
    ka_pgconn_hooks_t hooks;
    PGconn *conn;
    ka_pgconn_state_t state;
    uint32_t poll_want; /* while CONNECTING */
    bool want_write;    /* output not yet flushed */
    uint64_t deadline;  /* BACKOFF: reconnect; CONNECTING: give up */
    int backoff_ms;
    s_prep_t *preps;
    int nprep;
    char **listens;
    int nlisten;
    s_queue_t pending;
    s_queue_t inflight;
    s_queue_t finished;           /* completed, callbacks not yet run */
    s_req_t *rcur;                /* request of the head segment being read (NULL: its first) */
    int rdone;                    /* requests of the head segment fully read */
    s_seg_t segs[S_MAX_SEGMENTS]; /* ring */
    int seg_head;
    int nseg;
    int depth; /* > 0 while inside an entry point (defer sending) */
    ka_pgconn_stats_t stats;
};

uint64_t ka_pg_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *ka_pgconn_state_name(ka_pgconn_state_t st)
{
    switch (st) {
    case KA_PG_IDLE:
        return "idle";
    case KA_PG_CONNECTING:
        return "connecting";
    case KA_PG_SETUP:
        return "setup";
    case KA_PG_READY:
        return "ready";
    case KA_PG_BACKOFF:
        return "backoff";
    case KA_PG_STOPPED:
        return "stopped";
    }
    return "?";
}

/* ---------------------------------------------------------------------------------------- */
/* Queues and requests                                                                      */

static void s_push_back(s_queue_t *q, s_req_t *r)
{
    r->next = NULL;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->count++;
}

static s_req_t *s_pop(s_queue_t *q)
{
    s_req_t *r = q->head;
    if (!r)
        return NULL;
    q->head = r->next;
    if (!q->head)
        q->tail = NULL;
    q->count--;
    r->next = NULL;
    return r;
}

static void s_req_reset(s_req_t *r)
{
    for (int i = 0; i < r->n; i++) {
        PQclear(r->results[i]);
        r->results[i] = NULL;
    }
    r->cur = 0;
    r->failed = false;
    r->aborted = false;
    r->sqlstate[0] = '\0';
    free(r->errmsg);
    r->errmsg = NULL;
}

static void s_req_free(s_req_t *r)
{
    s_req_reset(r);
    free(r);
}

/* Records r's outcome and queues it for its callback (run by s_leave). */
static void s_finish(ka_pgconn_t *self, s_req_t *r, int err, const char *sqlstate, const char *msg)
{
    r->final_err = err;
    if (err) {
        for (int i = 0; i < r->n; i++) {
            PQclear(r->results[i]);
            r->results[i] = NULL;
        }
        if (sqlstate != r->sqlstate)
            snprintf(r->sqlstate, sizeof(r->sqlstate), "%s", sqlstate ? sqlstate : "");
        if (msg != r->errmsg) {
            free(r->errmsg);
            r->errmsg = strdup(msg ? msg : "");
        }
        self->stats.failed++;
    } else {
        self->stats.requests++;
    }
    s_push_back(&self->finished, r);
}

static void s_run_finished(ka_pgconn_t *self)
{
    s_req_t *r;
    while ((r = s_pop(&self->finished)) != NULL) {
        ka_pg_outcome_t out = {.err = r->final_err,
                               .sqlstate = r->final_err ? r->sqlstate : "",
                               .message = r->final_err && r->errmsg ? r->errmsg : "",
                               .results = r->final_err ? NULL : r->results,
                               .nresults = r->final_err ? 0 : r->n};
        ka_metric_observe(KA_METRIC_STORE, r->stmts[0].name, r->final_err ? "error" : "ok",
                          ka_metric_now() - r->submitted);
        r->cb(r->user, &out);
        s_req_free(r);
    }
}

static void s_set_error(char sqlstate[6], char **msg, const PGresult *res, const char *fallback)
{
    const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *m = res ? PQresultErrorMessage(res) : NULL;
    snprintf(sqlstate, 6, "%s", st ? st : "");
    free(*msg);
    *msg = strdup(m && *m ? m : fallback);
    if (*msg) {
        size_t len = strlen(*msg);
        while (len > 0 && ((*msg)[len - 1] == '\n' || (*msg)[len - 1] == ' '))
            (*msg)[--len] = '\0';
    }
}

static bool s_retryable(const char *sqlstate)
{
    return strcmp(sqlstate, "40001") == 0 || strcmp(sqlstate, "40P01") == 0;
}

/* Errors that mean the session is gone rather than that a statement is wrong. */
static bool s_session_error(const PGresult *res, const PGconn *conn)
{
    const char *st = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (PQstatus(conn) == CONNECTION_BAD || !st)
        return true;
    return strncmp(st, "08", 2) == 0 || strncmp(st, "57", 2) == 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Connection life                                                                          */

static void s_set_state(ka_pgconn_t *self, ka_pgconn_state_t st, const char *msg)
{
    if (self->state == st)
        return;
    self->state = st;
    if (self->hooks.state)
        self->hooks.state(self->hooks.user, st, msg ? msg : "");
}

static void s_close(ka_pgconn_t *self)
{
    if (!self->conn)
        return;
    int fd = PQsocket(self->conn);
    if (fd >= 0 && self->hooks.fd_closing)
        self->hooks.fd_closing(self->hooks.user, fd);
    PQfinish(self->conn);
    self->conn = NULL;
    self->want_write = false;
}

static void s_segs_clear(ka_pgconn_t *self)
{
    for (int i = 0; i < self->nseg; i++) {
        s_seg_t *s = &self->segs[(self->seg_head + i) % S_MAX_SEGMENTS];
        free(s->errmsg);
        memset(s, 0, sizeof(*s));
    }
    self->nseg = 0;
    self->seg_head = 0;
    self->rcur = NULL;
    self->rdone = 0;
}

/* Fails every request (in flight first, in order) with KA_PG_EUNAVAIL. */
static void s_fail_all(ka_pgconn_t *self, const char *why)
{
    s_queue_t doomed = self->inflight;
    memset(&self->inflight, 0, sizeof(self->inflight));
    s_req_t *r;
    while ((r = s_pop(&self->pending)) != NULL)
        s_push_back(&doomed, r);
    s_segs_clear(self);
    while ((r = s_pop(&doomed)) != NULL)
        s_finish(self, r, KA_PG_EUNAVAIL, "", why);
}

/* The connection failed or was lost: close, fail everything, wait to reconnect. */
static void s_lost(ka_pgconn_t *self, const char *why)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "database unavailable: %s", why && *why ? why : "connection lost");
    size_t len = strlen(msg);
    while (len > 0 && msg[len - 1] == '\n')
        msg[--len] = '\0';
    s_close(self);
    self->stats.losses++;
    self->deadline = ka_pg_now_ms() + (uint64_t)self->backoff_ms;
    self->backoff_ms *= 2;
    if (self->backoff_ms > self->opts.backoff_max_ms)
        self->backoff_ms = self->opts.backoff_max_ms;
    s_set_state(self, KA_PG_BACKOFF, msg);
    s_fail_all(self, msg);
}

static void s_connect(ka_pgconn_t *self)
{
    self->conn = PQconnectStart(self->conninfo);
    if (!self->conn) {
        s_lost(self, "out of memory");
        return;
    }
    s_set_state(self, KA_PG_CONNECTING, "");
    if (PQstatus(self->conn) == CONNECTION_BAD) {
        char why[400];
        snprintf(why, sizeof(why), "%s", PQerrorMessage(self->conn));
        s_lost(self, why);
        return;
    }
    self->poll_want = KA_PG_WRITE;
    self->deadline = ka_pg_now_ms() + (uint64_t)self->opts.connect_timeout_ms;
    s_set_state(self, KA_PG_CONNECTING, "");
}

static s_seg_t *s_seg_new(ka_pgconn_t *self)
{
    s_seg_t *s = &self->segs[(self->seg_head + self->nseg) % S_MAX_SEGMENTS];
    memset(s, 0, sizeof(*s));
    s->sent_at = ka_pg_now_ms();
    self->nseg++;
    return s;
}

static void s_flush(ka_pgconn_t *self)
{
    int rc = PQflush(self->conn);
    if (rc < 0) {
        char why[400];
        snprintf(why, sizeof(why), "%s", PQerrorMessage(self->conn));
        s_lost(self, why);
        return;
    }
    self->want_write = rc == 1;
}

/* Connected: enter pipeline mode, prepare statements, LISTEN, sync. */
static void s_setup(ka_pgconn_t *self)
{
    if (PQsetnonblocking(self->conn, 1) != 0 || PQenterPipelineMode(self->conn) != 1) {
        s_lost(self, PQerrorMessage(self->conn));
        return;
    }
    s_seg_t *seg = s_seg_new(self);
    seg->setup = true;
    for (int i = 0; i < self->nprep; i++) {
        const s_prep_t *p = &self->preps[i];
        if (!PQsendPrepare(self->conn, p->name, p->sql, p->nparams, NULL)) {
            s_lost(self, PQerrorMessage(self->conn));
            return;
        }
        seg->internal++;
    }
    for (int i = 0; i < self->nlisten; i++) {
        char sql[128];
        snprintf(sql, sizeof(sql), "LISTEN %s", self->listens[i]);
        if (!PQsendQueryParams(self->conn, sql, 0, NULL, NULL, NULL, NULL, 0)) {
            s_lost(self, PQerrorMessage(self->conn));
            return;
        }
        seg->internal++;
    }
    if (!PQpipelineSync(self->conn)) {
        s_lost(self, PQerrorMessage(self->conn));
        return;
    }
    s_set_state(self, KA_PG_SETUP, "");
    s_flush(self);
}

static void s_poll_connect(ka_pgconn_t *self)
{
    switch (PQconnectPoll(self->conn)) {
    case PGRES_POLLING_READING:
        self->poll_want = KA_PG_READ;
        break;
    case PGRES_POLLING_WRITING:
        self->poll_want = KA_PG_WRITE;
        break;
    case PGRES_POLLING_OK:
        s_setup(self);
        break;
    default: {
        char why[400];
        snprintf(why, sizeof(why), "%s", PQerrorMessage(self->conn));
        s_lost(self, why);
        break;
    }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Sending                                                                                  */

static bool s_send_req(ka_pgconn_t *self, s_req_t *r)
{
    for (int i = 0; i < r->n; i++) {
        const ka_pg_stmt_t *st = &r->stmts[i];
        if (!PQsendQueryPrepared(self->conn, st->name, st->nparams, st->params, NULL, NULL, 0))
            return false;
    }
    return true;
}

/* Sends pending requests as segments while the window allows. */
static void s_pump(ka_pgconn_t *self)
{
    while (self->state == KA_PG_READY && self->pending.head &&
           self->nseg < self->opts.max_segments) {
        s_seg_t *seg = s_seg_new(self);
        while (self->pending.head && seg->nreq < self->opts.max_batch) {
            s_req_t *r = self->pending.head;
            if (seg->nreq > 0 && (r->flags & KA_PG_ALONE))
                break;
            s_pop(&self->pending);
            s_push_back(&self->inflight, r);
            seg->nreq++;
            if (!s_send_req(self, r)) {
                s_lost(self, PQerrorMessage(self->conn));
                return;
            }
            if (r->flags & KA_PG_ALONE)
                break;
        }
        if (!PQpipelineSync(self->conn)) {
            s_lost(self, PQerrorMessage(self->conn));
            return;
        }
    }
    if (self->state == KA_PG_READY || self->state == KA_PG_SETUP)
        s_flush(self);
}

/* ---------------------------------------------------------------------------------------- */
/* Receiving                                                                                */

/* The head segment's sync arrived: complete or requeue its requests. Completed requests are
 * moved to done (callbacks run by the caller once the engine is consistent). */
static void s_seg_done(ka_pgconn_t *self, s_queue_t *done, s_queue_t *retry)
{
    s_seg_t *seg = &self->segs[self->seg_head];
    self->rcur = NULL;
    self->rdone = 0;
    if (seg->setup) {
        /* setup batch */
        bool failed = seg->failed || seg->commit_failed;
        char why[400];
        snprintf(why, sizeof(why), "setup failed: %s", seg->errmsg ? seg->errmsg : "");
        free(seg->errmsg);
        seg->errmsg = NULL;
        self->seg_head = (self->seg_head + 1) % S_MAX_SEGMENTS;
        self->nseg--;
        if (failed && self->state == KA_PG_SETUP) {
            s_lost(self, why);
            return;
        }
        if (self->state == KA_PG_SETUP) {
            self->backoff_ms = self->opts.backoff_min_ms;
            self->stats.connects++;
            s_set_state(self, KA_PG_READY, "");
        }
        return;
    }
    bool seg_failed = seg->failed || seg->commit_failed;
    for (int i = 0; i < seg->nreq; i++) {
        s_req_t *r = s_pop(&self->inflight);
        if (seg->commit_failed) {
            r->failed = true;
            memcpy(r->sqlstate, seg->sqlstate, sizeof(r->sqlstate));
            free(r->errmsg);
            r->errmsg = strdup(seg->errmsg ? seg->errmsg : "commit failed");
        }
        if (r->failed && !s_retryable(r->sqlstate)) {
            s_push_back(done, r); /* completes with its error */
        } else if (r->failed || seg_failed) {
            if (r->retries >= self->opts.max_retries) {
                if (!r->failed) {
                    r->failed = true;
                    snprintf(r->sqlstate, sizeof(r->sqlstate), "40001");
                }
                s_push_back(done, r);
            } else {
                r->retries++;
                self->stats.retries++;
                s_req_reset(r);
                s_push_back(retry, r);
            }
        } else {
            s_push_back(done, r);
        }
    }
    free(seg->errmsg);
    self->seg_head = (self->seg_head + 1) % S_MAX_SEGMENTS;
    self->nseg--;
    self->stats.segments++;
}

/* Handles one PQgetResult value. Returns false if the connection was dropped. */
static bool s_on_result(ka_pgconn_t *self, PGresult *res, s_queue_t *done, s_queue_t *retry)
{
    s_seg_t *seg = &self->segs[self->seg_head];
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_EMPTY_QUERY;
    if (res && st == PGRES_FATAL_ERROR && s_session_error(res, self->conn)) {
        char why[400];
        snprintf(why, sizeof(why), "%s", PQresultErrorMessage(res));
        PQclear(res);
        s_lost(self, why);
        return false;
    }
    /* Which query is being read: the internal ones, a request's statement, or the sync. */
    if (seg->internal > 0) {
        if (!res) {
            seg->internal--;
        } else if (st == PGRES_FATAL_ERROR || st == PGRES_PIPELINE_ABORTED) {
            seg->failed = true;
            if (!seg->errmsg)
                s_set_error(seg->sqlstate, &seg->errmsg, res, "setup statement failed");
        }
        PQclear(res);
        return true;
    }
    if (self->rdone < seg->nreq) {
        s_req_t *r = self->rcur ? self->rcur : self->inflight.head;
        self->rcur = r;
        if (!res) {
            if (++r->cur >= r->n) {
                self->rdone++;
                self->rcur = r->next;
            }
            return true;
        }
        if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
            PQclear(r->results[r->cur]);
            r->results[r->cur] = res;
            return true;
        }
        if (st == PGRES_PIPELINE_ABORTED) {
            r->aborted = true;
        } else if (!r->failed) {
            r->failed = true;
            seg->failed = true;
            s_set_error(r->sqlstate, &r->errmsg, res, "statement failed");
        }
        PQclear(res);
        return true;
    }
    /* Every query of the segment was read: what follows is its sync (or a commit error). */
    if (!res)
        return true;
    if (st == PGRES_PIPELINE_SYNC) {
        PQclear(res);
        s_seg_done(self, done, retry);
        return self->conn != NULL;
    }
    if (st == PGRES_FATAL_ERROR) {
        seg->commit_failed = true;
        if (!seg->errmsg)
            s_set_error(seg->sqlstate, &seg->errmsg, res, "commit failed");
    }
    PQclear(res);
    return true;
}

static void s_drain_notifies(ka_pgconn_t *self)
{
    PGnotify *n;
    while (self->conn && (n = PQnotifies(self->conn)) != NULL) {
        if (self->hooks.notify)
            self->hooks.notify(self->hooks.user, n->relname, n->extra ? n->extra : "");
        PQfreemem(n);
    }
}

/* Reads what arrived; completes finished segments. */
static void s_read(ka_pgconn_t *self)
{
    if (!PQconsumeInput(self->conn)) {
        char why[400];
        snprintf(why, sizeof(why), "%s", PQerrorMessage(self->conn));
        s_lost(self, why);
        return;
    }
    s_queue_t done = {0}, retry = {0};
    while (self->conn && self->nseg > 0 && !PQisBusy(self->conn)) {
        PGresult *res = PQgetResult(self->conn);
        if (!s_on_result(self, res, &done, &retry))
            break;
    }
    if (self->conn)
        s_drain_notifies(self);
    if (self->conn && PQstatus(self->conn) == CONNECTION_BAD)
        s_lost(self, PQerrorMessage(self->conn));
    /* Retried requests go back to the front of the queue, in order. */
    s_req_t *r;
    if (self->state == KA_PG_READY || self->state == KA_PG_SETUP) {
        while ((r = s_pop(&self->pending)) != NULL)
            s_push_back(&retry, r);
        self->pending = retry;
    } else {
        while ((r = s_pop(&retry)) != NULL)
            s_finish(self, r, KA_PG_EUNAVAIL, "", "database unavailable: connection lost");
    }
    while ((r = s_pop(&done)) != NULL) {
        if (!r->failed)
            s_finish(self, r, 0, NULL, NULL);
        else if (s_retryable(r->sqlstate))
            s_finish(self, r, KA_PG_ECONFLICT, r->sqlstate,
                     r->errmsg ? r->errmsg : "transaction conflicts kept failing");
        else
            s_finish(self, r, KA_PG_ESQL, r->sqlstate, r->errmsg ? r->errmsg : "statement failed");
    }
}

/* Entry/exit of every public entry point: sending and callbacks happen only at the outermost
 * exit, so callbacks never run inside ka_pgconn_submit and may submit themselves. */
static void s_enter(ka_pgconn_t *self)
{
    self->depth++;
}

static void s_leave(ka_pgconn_t *self, bool run_callbacks)
{
    if (--self->depth > 0)
        return;
    for (;;) {
        s_pump(self);
        if (!run_callbacks || !self->finished.head)
            break;
        self->depth++;
        s_run_finished(self);
        self->depth--;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Public API                                                                               */

ka_pgconn_t *ka_pgconn_new(const char *conninfo, const ka_pgconn_opts_t *opts,
                           const ka_pgconn_hooks_t *hooks)
{
    ka_pgconn_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->conninfo = strdup(conninfo ? conninfo : "");
    if (!self->conninfo) {
        free(self);
        return NULL;
    }
    if (opts)
        self->opts = *opts;
    if (hooks)
        self->hooks = *hooks;
    ka_pgconn_opts_t *o = &self->opts;
    o->backoff_min_ms = o->backoff_min_ms > 0 ? o->backoff_min_ms : 50;
    o->backoff_max_ms = o->backoff_max_ms > 0 ? o->backoff_max_ms : 2000;
    if (o->backoff_max_ms < o->backoff_min_ms)
        o->backoff_max_ms = o->backoff_min_ms;
    o->connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 10000;
    o->query_timeout_ms = o->query_timeout_ms > 0 ? o->query_timeout_ms : 30000;
    o->max_batch = o->max_batch > 0 ? o->max_batch : 256;
    o->max_segments = o->max_segments > 0 ? o->max_segments : 2;
    if (o->max_segments > S_MAX_SEGMENTS - 1)
        o->max_segments = S_MAX_SEGMENTS - 1;
    o->max_retries = o->max_retries > 0 ? o->max_retries : 8;
    self->backoff_ms = o->backoff_min_ms;
    self->state = KA_PG_IDLE;
    return self;
}

void ka_pgconn_destroy(ka_pgconn_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    ka_pgconn_t *self = *self_p;
    *self_p = NULL;
    self->depth++;
    s_close(self);
    self->state = KA_PG_STOPPED; /* callbacks below see submits refused */
    s_fail_all(self, "database unavailable: store closing");
    s_run_finished(self);
    for (int i = 0; i < self->nprep; i++) {
        free(self->preps[i].name);
        free(self->preps[i].sql);
    }
    free(self->preps);
    for (int i = 0; i < self->nlisten; i++)
        free(self->listens[i]);
    free(self->listens);
    free(self->conninfo);
    free(self);
}

static const s_prep_t *s_find_prep(const ka_pgconn_t *self, const char *name)
{
    for (int i = 0; i < self->nprep; i++)
        if (strcmp(self->preps[i].name, name) == 0)
            return &self->preps[i];
    return NULL;
}

int ka_pgconn_prepare(ka_pgconn_t *self, const char *name, const char *sql, int nparams)
{
    if (!self || !name || !*name || !sql || nparams < 0 || self->state != KA_PG_IDLE)
        return -EINVAL;
    if (s_find_prep(self, name))
        return -EEXIST;
    s_prep_t *np = realloc(self->preps, sizeof(*np) * (size_t)(self->nprep + 1));
    if (!np)
        return -ENOMEM;
    self->preps = np;
    s_prep_t *p = &np[self->nprep];
    p->name = strdup(name);
    p->sql = strdup(sql);
    p->nparams = nparams;
    if (!p->name || !p->sql) {
        free(p->name);
        free(p->sql);
        return -ENOMEM;
    }
    self->nprep++;
    return 0;
}

int ka_pgconn_listen(ka_pgconn_t *self, const char *channel)
{
    if (!self || !channel || !*channel || strlen(channel) > 63 || self->state != KA_PG_IDLE)
        return -EINVAL;
    for (const char *c = channel; *c; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || *c == '_' || (c != channel && *c >= '0' && *c <= '9');
        if (!ok)
            return -EINVAL;
    }
    char **nl = realloc(self->listens, sizeof(*nl) * (size_t)(self->nlisten + 1));
    if (!nl)
        return -ENOMEM;
    self->listens = nl;
    nl[self->nlisten] = strdup(channel);
    if (!nl[self->nlisten])
        return -ENOMEM;
    self->nlisten++;
    return 0;
}

int ka_pgconn_start(ka_pgconn_t *self)
{
    if (!self || self->state != KA_PG_IDLE)
        return -EINVAL;
    s_enter(self);
    s_connect(self);
    s_leave(self, true);
    return 0;
}

void ka_pgconn_stop(ka_pgconn_t *self)
{
    if (!self || self->state == KA_PG_STOPPED)
        return;
    s_enter(self);
    s_close(self);
    s_set_state(self, KA_PG_STOPPED, "stopped");
    s_fail_all(self, "database unavailable: store stopped");
    s_leave(self, true);
}

int ka_pgconn_submit(ka_pgconn_t *self, const ka_pg_stmt_t *stmts, int n, unsigned flags,
                     ka_pg_done_fn cb, void *user)
{
    if (!self || !stmts || n < 1 || n > S_MAX_STMTS || !cb)
        return -EINVAL;
    const char *names[S_MAX_STMTS];
    size_t nptr = 0, strbytes = 0;
    for (int i = 0; i < n; i++) {
        const s_prep_t *p = stmts[i].name ? s_find_prep(self, stmts[i].name) : NULL;
        if (!p || p->nparams != stmts[i].nparams || (stmts[i].nparams > 0 && !stmts[i].params))
            return -EINVAL;
        names[i] = p->name;
        nptr += (size_t)stmts[i].nparams;
        for (int j = 0; j < stmts[i].nparams; j++)
            if (stmts[i].params[j])
                strbytes += strlen(stmts[i].params[j]) + 1;
    }
    if (self->state == KA_PG_BACKOFF || self->state == KA_PG_STOPPED || self->state == KA_PG_IDLE)
        return KA_PG_EUNAVAIL;
    size_t size = sizeof(s_req_t) + sizeof(ka_pg_stmt_t) * (size_t)n +
                  sizeof(PGresult *) * (size_t)n + sizeof(char *) * nptr + strbytes;
    s_req_t *r = calloc(1, size);
    if (!r)
        return -ENOMEM;
    r->cb = cb;
    r->user = user;
    r->flags = flags;
    r->submitted = ka_metric_now();
    r->n = n;
    r->stmts = (ka_pg_stmt_t *)(r + 1);
    r->results = (PGresult **)(r->stmts + n);
    const char **pv = (const char **)(r->results + n);
    char *sp = (char *)(pv + nptr);
    for (int i = 0; i < n; i++) {
        r->stmts[i].name = names[i];
        r->stmts[i].nparams = stmts[i].nparams;
        r->stmts[i].params = pv;
        for (int j = 0; j < stmts[i].nparams; j++) {
            const char *v = stmts[i].params[j];
            if (v) {
                size_t len = strlen(v) + 1;
                memcpy(sp, v, len);
                pv[j] = sp;
                sp += len;
            } else {
                pv[j] = NULL;
            }
        }
        pv += stmts[i].nparams;
    }
    s_enter(self);
    s_push_back(&self->pending, r);
    s_leave(self, false);
    return 0;
}

void ka_pgconn_on_io(ka_pgconn_t *self, uint32_t events)
{
    if (!self)
        return;
    s_enter(self);
    if (!self->conn) {
        /* nothing to read: a stale event */
    } else if (self->state == KA_PG_CONNECTING) {
        s_poll_connect(self);
    } else if (self->state == KA_PG_SETUP || self->state == KA_PG_READY) {
        if (self->want_write)
            s_flush(self);
        if (self->conn)
            s_read(self);
    }
    s_leave(self, true);
}

void ka_pgconn_on_timer(ka_pgconn_t *self)
{
    if (!self)
        return;
    uint64_t now = ka_pg_now_ms();
    s_enter(self);
    if (self->state == KA_PG_BACKOFF && now >= self->deadline) {
        s_connect(self);
    } else if (self->state == KA_PG_CONNECTING && now >= self->deadline) {
        s_lost(self, "connect timed out");
    } else if ((self->state == KA_PG_SETUP || self->state == KA_PG_READY) && self->nseg > 0 &&
               now >= self->segs[self->seg_head].sent_at + (uint64_t)self->opts.query_timeout_ms) {
        s_lost(self, "no answer within the query timeout");
    }
    s_leave(self, true);
}

void ka_pgconn_interest(const ka_pgconn_t *self, int *fd, uint32_t *events, int64_t *delay_ms)
{
    int f = -1;
    uint32_t ev = 0;
    int64_t delay = -1;
    uint64_t deadline = 0;
    if (self && self->conn) {
        f = PQsocket(self->conn);
        if (self->state == KA_PG_CONNECTING)
            ev = self->poll_want;
        else
            ev = KA_PG_READ | (self->want_write ? KA_PG_WRITE : 0);
    }
    if (self && (self->state == KA_PG_BACKOFF || self->state == KA_PG_CONNECTING))
        deadline = self->deadline;
    else if (self && self->nseg > 0)
        deadline = self->segs[self->seg_head].sent_at + (uint64_t)self->opts.query_timeout_ms;
    if (self && self->finished.head)
        delay = 0; /* callbacks to run: call ka_pgconn_on_timer at once */
    else if (deadline) {
        uint64_t now = ka_pg_now_ms();
        delay = deadline > now ? (int64_t)(deadline - now) : 0;
    }
    if (fd)
        *fd = f;
    if (events)
        *events = f >= 0 ? ev : 0;
    if (delay_ms)
        *delay_ms = delay;
}

ka_pgconn_state_t ka_pgconn_state(const ka_pgconn_t *self)
{
    return self ? self->state : KA_PG_STOPPED;
}

void ka_pgconn_stats(const ka_pgconn_t *self, ka_pgconn_stats_t *out)
{
    if (!self || !out)
        return;
    *out = self->stats;
    out->pending = self->pending.count;
    out->inflight = self->inflight.count;
}
