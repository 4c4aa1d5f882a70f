/* kb_conn_ids: a table indexed by file descriptor, grown on demand. See conn_ids.h. */
#include "conn_ids.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct kb_conn_ids {
    pthread_mutex_t mu;
    char **ids; /* by fd; NULL = none */
    int n;      /* slots */
};

kb_conn_ids_t *kb_conn_ids_new(void)
{
    kb_conn_ids_t *t = calloc(1, sizeof *t);
    if (t)
        pthread_mutex_init(&t->mu, NULL);
    return t;
}

/* Makes slot fd exist; under the lock. */
static int s_grow(kb_conn_ids_t *t, int fd)
{
    if (fd < t->n)
        return 0;
    int n = fd + 64;
    char **grown = realloc(t->ids, (size_t)n * sizeof *grown);
    if (!grown)
        return -ENOMEM;
    memset(grown + t->n, 0, (size_t)(n - t->n) * sizeof *grown);
    t->ids = grown;
    t->n = n;
    return 0;
}

int kb_conn_ids_set(kb_conn_ids_t *t, int fd, const char *id)
{
    if (fd < 0)
        return -EINVAL;
    char *copy = id ? strdup(id) : NULL;
    if (id && !copy)
        return -ENOMEM;
    pthread_mutex_lock(&t->mu);
    int rc = copy ? s_grow(t, fd) : 0;
    if (!rc && fd < t->n) {
        free(t->ids[fd]);
        t->ids[fd] = copy;
        copy = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    free(copy);
    return rc;
}

int kb_conn_ids_get(kb_conn_ids_t *t, int fd, char *out, size_t cap)
{
    int rc = -ENOENT;
    pthread_mutex_lock(&t->mu);
    if (fd >= 0 && fd < t->n && t->ids[fd] && strlen(t->ids[fd]) < cap) {
        strcpy(out, t->ids[fd]);
        rc = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void kb_conn_ids_destroy(kb_conn_ids_t **t_p)
{
    kb_conn_ids_t *t = t_p ? *t_p : NULL;
    if (!t)
        return;
    for (int i = 0; i < t->n; i++)
        free(t->ids[i]);
    free(t->ids);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *t_p = NULL;
}
