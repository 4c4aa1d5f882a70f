/*
 * Registry: names -> addresses, one mutex, chained hash table. A local actor's names are
 * released when it stops (the actor carries KRT_AAF_REGISTERED so only those actors pay for the
 * scan). Remote addresses may be registered too; they are never released automatically.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct krt_reg_ent {
    struct krt_reg_ent *next;
    krt_addr_t who;
    char name[];
} krt_reg_ent_t;

struct krt_reg {
    pthread_mutex_t lock;
    krt_reg_ent_t **tab;
    size_t cap, n;
};

static size_t s_hash(const char *s)
{
    size_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

krt_reg_t *krt__reg_new(void)
{
    krt_reg_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->cap = 64;
    r->tab = calloc(r->cap, sizeof *r->tab);
    if (!r->tab) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

void krt__reg_destroy(krt_reg_t **reg_p)
{
    if (!reg_p || !*reg_p)
        return;
    krt_reg_t *r = *reg_p;
    *reg_p = NULL;
    for (size_t i = 0; i < r->cap; i++) {
        while (r->tab[i]) {
            krt_reg_ent_t *e = r->tab[i];
            r->tab[i] = e->next;
            free(e);
        }
    }
    free(r->tab);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static krt_reg_ent_t **s_find(krt_reg_t *r, const char *name)
{
    krt_reg_ent_t **pp = &r->tab[s_hash(name) & (r->cap - 1)];
    while (*pp && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    return pp;
}

static void s_grow(krt_reg_t *r)
{
    size_t cap = r->cap * 2;
    krt_reg_ent_t **tab = calloc(cap, sizeof *tab);
    if (!tab)
        return;
    for (size_t i = 0; i < r->cap; i++) {
        while (r->tab[i]) {
            krt_reg_ent_t *e = r->tab[i];
            r->tab[i] = e->next;
            size_t h = s_hash(e->name) & (cap - 1);
            e->next = tab[h];
            tab[h] = e;
        }
    }
    free(r->tab);
    r->tab = tab;
    r->cap = cap;
}

/* Inserts with the lock held; a (may be NULL) is marked as having names. */
static int s_insert(krt_reg_t *r, const char *name, krt_addr_t who, krt_actor_t *a)
{
    krt_reg_ent_t **pp = s_find(r, name);
    if (*pp)
        return KRT_EEXIST;
    size_t len = strlen(name);
    krt_reg_ent_t *e = malloc(sizeof *e + len + 1);
    if (!e)
        return KRT_ENOMEM;
    memcpy(e->name, name, len + 1);
    e->who = who;
    e->next = NULL;
    *pp = e;
    if (a)
        atomic_fetch_or(&a->aflags, KRT_AAF_REGISTERED);
    if (++r->n > r->cap)
        s_grow(r);
    return 0;
}

int krt_reg_insert(krt_system_t *sys, const char *name, krt_addr_t who, krt_actor_t *a)
{
    pthread_mutex_lock(&sys->reg->lock);
    int rc = s_insert(sys->reg, name, who, a);
    pthread_mutex_unlock(&sys->reg->lock);
    return rc;
}

int krt_register(krt_system_t *sys, const char *name, krt_addr_t who)
{
    if (!sys || !name || !*name || who == KRT_ADDR_NONE)
        return KRT_EINVAL;
    krt_reg_t *r = sys->reg;
    int rc;
    pthread_mutex_lock(&r->lock);
    if (krt_addr_node(who) != sys->node_id) {
        rc = s_insert(r, name, who, NULL);
    } else {
        krt_actor_t *a = krt__acquire(sys, who);
        if (!a) {
            rc = KRT_ENOACTOR;
        } else {
            rc = s_insert(r, name, who, a);
            krt__release(sys, who);
        }
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int krt_unregister(krt_system_t *sys, const char *name)
{
    if (!sys || !name)
        return KRT_EINVAL;
    krt_reg_t *r = sys->reg;
    pthread_mutex_lock(&r->lock);
    krt_reg_ent_t **pp = s_find(r, name), *e = *pp;
    if (e) {
        *pp = e->next;
        r->n--;
    }
    pthread_mutex_unlock(&r->lock);
    free(e);
    return e ? 0 : KRT_ENOACTOR;
}

krt_addr_t krt_whereis(krt_system_t *sys, const char *name)
{
    if (!sys || !name)
        return KRT_ADDR_NONE;
    krt_reg_t *r = sys->reg;
    pthread_mutex_lock(&r->lock);
    krt_reg_ent_t *e = *s_find(r, name);
    krt_addr_t who = e ? e->who : KRT_ADDR_NONE;
    pthread_mutex_unlock(&r->lock);
    return who;
}

void krt__reg_release(krt_system_t *sys, krt_addr_t who)
{
    krt_reg_t *r = sys->reg;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->cap; i++) {
        krt_reg_ent_t **pp = &r->tab[i];
        while (*pp) {
            krt_reg_ent_t *e = *pp;
            if (e->who == who) {
                *pp = e->next;
                r->n--;
                free(e);
            } else {
                pp = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&r->lock);
}
