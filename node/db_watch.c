/* ka_db_watch: restart of the embedded database and store health for /readyz (db_watch.h). */
#include "db_watch.h"
#include "embedded.h"
#include "store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define S_PERIOD_MS 1000
#define S_CALL_MS   1000

struct ka_db_watch {
    krt_system_t *sys;
    const char *store; /* registered name */
    char *state_dir;   /* NULL: an external database */
    char path[64];
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    atomic_bool ok;
};

static bool s_store_connected(ka_db_watch_t *w)
{
    krt_reply_t r;
    if (krt_call(w->sys, krt_whereis(w->sys, w->store), KA_STORE_INFO, NULL, 0, S_CALL_MS, &r) != 0)
        return false;
    const ka_store_info_t *info = r.body;
    bool ok = r.len == sizeof *info && info->conn_state == KA_PG_READY;
    krt_reply_free(&r);
    return ok;
}

/* The postmaster died: start it again (the store reconnects by itself). */
static void s_restart_embedded(ka_db_watch_t *w)
{
    if (!w->state_dir || ka_pg_embedded_running(w->state_dir))
        return;
    krt_log(KRT_LOG_WARN, w->path, "database_down", "embedded=%s/postgres: starting it again",
            w->state_dir);
    char *conninfo = NULL;
    if (ka_pg_embedded_start(w->state_dir, &conninfo) == 0)
        krt_log(KRT_LOG_INFO, w->path, "database_restarted", "embedded=%s/postgres", w->state_dir);
    else
        krt_log(KRT_LOG_ERROR, w->path, "database_restart_failed", "%s", ka_pg_embedded_error());
    free(conninfo);
}

/* Waits one period; false once asked to stop. */
static bool s_wait(ka_db_watch_t *w)
{
    struct timespec until;
    krt_deadline(CLOCK_REALTIME, S_PERIOD_MS, &until);
    pthread_mutex_lock(&w->lock);
    while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock, &until) == 0)
        ;
    bool go = !w->stop;
    pthread_mutex_unlock(&w->lock);
    return go;
}

static void *s_main(void *arg)
{
    ka_db_watch_t *w = arg;
    do {
        bool ok = s_store_connected(w);
        if (!ok) /* a connected store has a database: look (pg_ctl status) only when it has not */
            s_restart_embedded(w);
        if (ok != atomic_load(&w->ok))
            krt_log(ok ? KRT_LOG_INFO : KRT_LOG_WARN, w->path, ok ? "ready" : "not_ready",
                    "database %s", ok ? "connected" : "unreachable");
        atomic_store(&w->ok, ok);
    } while (s_wait(w));
    return NULL;
}

ka_db_watch_t *ka_db_watch_start(krt_system_t *sys, const char *store, const char *state_dir,
                                 const char *path)
{
    ka_db_watch_t *w = calloc(1, sizeof *w);
    if (!w || (state_dir && !(w->state_dir = strdup(state_dir)))) {
        free(w);
        return NULL;
    }
    w->sys = sys;
    w->store = store;
    snprintf(w->path, sizeof w->path, "%s", path);
    atomic_init(&w->ok, true); /* the node starts only once the store served */
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    if (pthread_create(&w->thread, NULL, s_main, w) != 0) {
        free(w->state_dir);
        free(w);
        return NULL;
    }
    return w;
}

bool ka_db_watch_ok(const ka_db_watch_t *w)
{
    return !w || atomic_load(&w->ok);
}

void ka_db_watch_stop(ka_db_watch_t **w_p)
{
    ka_db_watch_t *w = w_p ? *w_p : NULL;
    if (!w)
        return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w->state_dir);
    free(w);
    *w_p = NULL;
}
