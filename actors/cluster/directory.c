/* The node table as this node last read it, for the control plane: lookups and placement
 * (membership.h). The membership actor publishes each table it reads; readers take the lock
 * for the time of a scan. */
#include <errno.h>
#include <string.h>

#include "membership.h"

static void s_lock(ka_membership_status_t *st)
{
    while (atomic_flag_test_and_set_explicit(&st->dir_lock, memory_order_acquire))
        ;
}

static void s_unlock(ka_membership_status_t *st)
{
    atomic_flag_clear_explicit(&st->dir_lock, memory_order_release);
}

ka_store_node_list_t *ka_membership_publish(ka_membership_status_t *st, ka_store_node_list_t *l)
{
    s_lock(st);
    ka_store_node_list_t *old = st->dir;
    st->dir = l;
    s_unlock(st);
    return old;
}

int ka_membership_find(ka_membership_status_t *st, const char *name, ka_store_node_t *out)
{
    int rc = -ENOENT;
    s_lock(st);
    for (uint32_t i = 0; st->dir && i < st->dir->count && rc; i++)
        if (strcmp(st->dir->items[i].name, name) == 0) {
            *out = st->dir->items[i];
            rc = 0;
        }
    s_unlock(st);
    return rc;
}

/* pools: "a,b,c" */
static bool s_serves(const char *pools, const char *pool)
{
    size_t n = strlen(pool);
    for (const char *p = pools; n && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, pool, n) == 0)
            return true;
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

static bool s_candidate(const ka_store_node_t *r, const char *pool, const char *exclude)
{
    return r->alive && !r->draining && s_serves(r->pools, pool) &&
           (r->capacity == 0 || r->sandboxes < r->capacity) &&
           (!exclude || strcmp(r->name, exclude) != 0);
}

static double s_load(const ka_store_node_t *r)
{
    return r->capacity > 0 ? (double)r->sandboxes / r->capacity : (double)r->sandboxes / 1e6;
}

/* The n-th candidate (0-based) of the table. */
static const ka_store_node_t *s_nth(const ka_store_node_list_t *l, const char *pool,
                                    const char *exclude, uint64_t n)
{
    for (uint32_t i = 0; i < l->count; i++)
        if (s_candidate(&l->items[i], pool, exclude) && n-- == 0)
            return &l->items[i];
    return NULL;
}

int ka_membership_place(ka_membership_status_t *st, const char *pool, const char *exclude,
                        uint64_t seed, ka_store_node_t *out)
{
    int rc = -ENOENT;
    s_lock(st);
    const ka_store_node_list_t *l = st->dir;
    uint64_t n = 0;
    for (uint32_t i = 0; l && i < l->count; i++)
        n += s_candidate(&l->items[i], pool, exclude);
    if (n) {
        const ka_store_node_t *a = s_nth(l, pool, exclude, seed % n);
        const ka_store_node_t *b = s_nth(l, pool, exclude, (seed / n) % n);
        double la = s_load(a), lb = s_load(b);
        bool self_b = strcmp(b->id, st->self_id) == 0;
        *out = (lb < la || (lb == la && self_b)) ? *b : *a;
        rc = 0;
    }
    s_unlock(st);
    return rc;
}

bool ka_membership_others(ka_membership_status_t *st)
{
    bool others = false;
    s_lock(st);
    for (uint32_t i = 0; st->dir && i < st->dir->count && !others; i++)
        others = st->dir->items[i].alive && strcmp(st->dir->items[i].id, st->self_id) != 0;
    s_unlock(st);
    return others;
}

size_t ka_membership_lapsed(ka_membership_status_t *st, ka_store_node_t *out, size_t cap)
{
    size_t n = 0;
    s_lock(st);
    for (uint32_t i = 0; st->dir && i < st->dir->count && n < cap; i++)
        if (!st->dir->items[i].alive && strcmp(st->dir->items[i].id, st->self_id) != 0)
            out[n++] = st->dir->items[i];
    s_unlock(st);
    return n;
}
