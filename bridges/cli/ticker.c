/* kb_ticker: one progress line for a long unary call (cli_int.h). */
#include "cli_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define S_TICK_MS 200

struct kb_ticker {
    FILE *err;
    char label[160];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    struct timespec t0;
};

static double s_elapsed(const kb_ticker_t *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->t0.tv_sec) + (double)(now.tv_nsec - t->t0.tv_nsec) / 1e9;
}

static void *s_run(void *arg)
{
    kb_ticker_t *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        fprintf(t->err, "\r%s ... %.1fs", t->label, s_elapsed(t));
        fflush(t->err);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += S_TICK_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&t->cond, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

kb_ticker_t *kb_ticker_start(kb_cli_t *cli, const char *label)
{
    if (!isatty(fileno(cli->err)))
        return NULL;
    kb_ticker_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->err = cli->err;
    snprintf(t->label, sizeof t->label, "%s", label);
    clock_gettime(CLOCK_MONOTONIC, &t->t0);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cond, NULL);
    if (pthread_create(&t->thread, NULL, s_run, t) != 0) {
        pthread_mutex_destroy(&t->mu);
        pthread_cond_destroy(&t->cond);
        free(t);
        return NULL;
    }
    return t;
}

void kb_ticker_stop(kb_ticker_t **t_p, bool ok)
{
    kb_ticker_t *t = *t_p;
    if (!t)
        return;
    *t_p = NULL;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    fprintf(t->err, "\r%s ... %s in %.1fs\n", t->label, ok ? "done" : "failed", s_elapsed(t));
    fflush(t->err);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cond);
    free(t);
}
