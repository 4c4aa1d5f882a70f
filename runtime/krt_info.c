/*
 * Introspection: the actor tree as JSON (krt_tree_json). The walk holds the tree lock, so no
 * actor in the tree can be freed under it; an actor's describe() runs only while the actor is
 * idle and owned by the walker (krt__describe), else "state" is null.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

#define KRT_DESCRIBE_CAP 1024

static void s_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

size_t krt__actor_bytes(const krt_actor_t *a)
{
    size_t bytes = sizeof *a + ((a->b->state_size + 15) & ~(size_t)15) + sizeof(krt_slot_t);
    if (a->ext)
        bytes += sizeof *a->ext + a->ext->cap_rels * sizeof(krt_rel_t);
    if (a->name)
        bytes += strlen(a->name) + 1;
    uint32_t pushed = atomic_load_explicit(&a->pushed, memory_order_relaxed);
    uint32_t popped = atomic_load_explicit(&a->popped, memory_order_relaxed);
    uint32_t depth = (int32_t)(pushed - popped) > 0 ? pushed - popped : 0;
    return bytes + (size_t)depth * KRT_NODE_SIZE;
}

static void s_segment(const krt_actor_t *a, char *buf, size_t cap)
{
    if (a->name)
        snprintf(buf, cap, "%s", a->name);
    else
        snprintf(buf, cap, "%s-%llx", a->b->kind ? a->b->kind : "actor",
                 (unsigned long long)(a->addr & KRT_LOCAL_MASK));
}

static void s_dump(krt_system_t *sys, FILE *f, krt_actor_t *a, const char *parent_path)
{
    char seg[128], state[KRT_DESCRIBE_CAP];
    s_segment(a, seg, sizeof seg);
    size_t plen = strlen(parent_path) + strlen(seg) + 2;
    char *path = malloc(plen);
    if (!path)
        return;
    snprintf(path, plen, "%s/%s", parent_path, seg);
    uint32_t pushed = atomic_load_explicit(&a->pushed, memory_order_relaxed);
    uint32_t popped = atomic_load_explicit(&a->popped, memory_order_relaxed);
    uint32_t depth = (int32_t)(pushed - popped) > 0 ? pushed - popped : 0; /* approximate */
    fprintf(f, "{\"addr\":\"%llu\",\"kind\":", (unsigned long long)a->addr);
    s_json_str(f, a->b->kind ? a->b->kind : "actor");
    fputs(",\"name\":", f);
    if (a->name)
        s_json_str(f, a->name);
    else
        fputs("null", f);
    fputs(",\"path\":", f);
    s_json_str(f, path);
    fputs(",\"state\":", f);
    if (krt__describe(sys, a, state, sizeof state) && state[0])
        fputs(state, f);
    else
        fputs("null", f);
    fprintf(f, ",\"mailbox\":%u,\"handled\":%llu,\"restarts\":%u,\"bytes\":%zu,\"children\":[",
            depth, (unsigned long long)atomic_load_explicit(&a->popped, memory_order_relaxed),
            a->restarts, krt__actor_bytes(a));
    /* children are newest first: print oldest first */
    krt_actor_t *c = a->first_child;
    while (c && c->next_sib)
        c = c->next_sib;
    for (bool first = true; c; c = c->prev_sib, first = false) {
        if (!first)
            fputc(',', f);
        s_dump(sys, f, c, path);
    }
    fputs("]}", f);
    free(path);
}

/* Path of a's parent ("node-1/sup/..."), built under the tree lock. */
static void s_parent_path(krt_system_t *sys, krt_actor_t *a, char *buf, size_t cap)
{
    krt_actor_t *chain[64];
    int n = 0;
    for (krt_actor_t *p = a->parent; p && p != sys->root && n < 64; p = p->parent)
        chain[n++] = p;
    size_t len = (size_t)snprintf(buf, cap, "%s", sys->name);
    for (int i = n - 1; i >= 0 && len < cap; i--) {
        char seg[128];
        s_segment(chain[i], seg, sizeof seg);
        len += (size_t)snprintf(buf + len, cap - len, "/%s", seg);
    }
}

char *krt_tree_json(krt_system_t *sys, krt_addr_t root)
{
    if (!sys)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fputc('[', f);
    krt__lock(&sys->tree_lock);
    if (root == KRT_ADDR_NONE) {
        krt_actor_t *c = sys->root->first_child;
        while (c && c->next_sib)
            c = c->next_sib;
        for (bool first = true; c; c = c->prev_sib, first = false) {
            if (!first)
                fputc(',', f);
            s_dump(sys, f, c, sys->name);
        }
    } else {
        krt_actor_t *a = krt__acquire(sys, root);
        if (a) {
            char pp[1024];
            s_parent_path(sys, a, pp, sizeof pp);
            krt__release(sys, root);
            if (a->parent) /* still in the tree: the lock keeps it there */
                s_dump(sys, f, a, pp);
        }
    }
    krt__unlock(&sys->tree_lock);
    fputc(']', f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
