/*
 * Registry: names -> addresses, one mutex, two chained hash tables over the same entries: by
 * name (lookups) and by address (an actor's names). A local actor's names are released when it
 * stops (the actor carries KRT_AAF_REGISTERED so only those actors touch the registry), in
 * O(names of that actor): the address table's bucket holds them. Remote addresses may be
 * registered too; they are never released automatically.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct krt_reg_ent {
    struct krt_reg_ent *next;  /* chain of its name's bucket */
    struct krt_reg_ent *anext; /* chain of its address's bucket */
    krt_addr_t who;
    char name[];
} krt_reg_ent_t;

struct krt_reg {
    pthread_mutex_t lock;
    krt_reg_ent_t **tab;  /* by name */
    krt_reg_ent_t **atab; /* by address */
    size_t cap, n;        /* both tables have cap buckets (a power of two) */
};

static size_t s_hash(const char *s)
{
    size_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Addresses differ mostly in their low (slot) and middle (generation) bits: mix them all. */
static size_t s_ahash(krt_addr_t who)
{
    uint64_t h = who * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29));
}

krt_reg_t *krt__reg_new(void)
{
    krt_reg_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->cap = 64;
    r->tab = calloc(r->cap, sizeof *r->tab);
    r->atab = calloc(r->cap, sizeof *r->atab);
    if (!r->tab || !r->atab) {
        free(r->tab);
        free(r->atab);
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
    free(r->atab);
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

/* The link to e in its address's chain (e must be registered). */
static krt_reg_ent_t **s_find_addr(krt_reg_t *r, const krt_reg_ent_t *e)
{
    krt_reg_ent_t **pp = &r->atab[s_ahash(e->who) & (r->cap - 1)];
    while (*pp != e)
        pp = &(*pp)->anext;
    return pp;
}

/* Doubles both tables; on allocation failure they stay as they are (longer chains). */
static void s_grow(krt_reg_t *r)
{
    size_t cap = r->cap * 2;
    krt_reg_ent_t **tab = calloc(cap, sizeof *tab), **atab = calloc(cap, sizeof *atab);
    if (!tab || !atab) {
        free(tab);
        free(atab);
        return;
    }
    for (size_t i = 0; i < r->cap; i++) {
        while (r->tab[i]) {
            krt_reg_ent_t *e = r->tab[i];
            r->tab[i] = e->next;
            size_t h = s_hash(e->name) & (cap - 1), a = s_ahash(e->who) & (cap - 1);
            e->next = tab[h];
            tab[h] = e;
            e->anext = atab[a];
            atab[a] = e;
        }
    }
    free(r->tab);
    free(r->atab);
    r->tab = tab;
    r->atab = atab;
    r->cap = cap;
}

/* Unlinks e from both tables (pp: its link in its name's chain) and frees it. */
static void s_remove(krt_reg_t *r, krt_reg_ent_t **pp)
{
    krt_reg_ent_t *e = *pp;
    *pp = e->next;
    krt_reg_ent_t **ap = s_find_addr(r, e);
    *ap = e->anext;
    r->n--;
    free(e);
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
    krt_reg_ent_t **ap = &r->atab[s_ahash(who) & (r->cap - 1)];
    e->anext = *ap;
    *ap = e;
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
    krt_reg_ent_t **pp = s_find(r, name);
    bool found = *pp != NULL;
    if (found)
        s_remove(r, pp);
    pthread_mutex_unlock(&r->lock);
    return found ? 0 : KRT_ENOACTOR;
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

size_t krt__reg_release(krt_system_t *sys, krt_addr_t who)
{
    krt_reg_t *r = sys->reg;
    size_t seen = 0;
    pthread_mutex_lock(&r->lock);
    krt_reg_ent_t **ap = &r->atab[s_ahash(who) & (r->cap - 1)];
    while (*ap) {
        krt_reg_ent_t *e = *ap;
        seen++;
        if (e->who != who) {
            ap = &e->anext;
            continue;
        }
        *ap = e->anext;
        krt_reg_ent_t **pp = s_find(r, e->name);
        *pp = e->next;
        r->n--;
        free(e);
    }
    pthread_mutex_unlock(&r->lock);
    return seen;
}
