/* ka_fsframes: Files API guest frames, checked as hostile input (see ka_fsframes.h). */
#include "ka_fsframes.h"
#include "guest_proto.h"

#include <stdlib.h>
#include <string.h>

/* A name: 1-255 bytes, no '/' or NUL, not "." or ".." (dot: "." is allowed). */
static bool s_name_ok(const char *p, size_t n, bool dot)
{
    if (n == 0 || n > KA_GP_NAME_MAX || memchr(p, '/', n) || memchr(p, 0, n))
        return false;
    if (n == 1 && p[0] == '.')
        return dot;
    return !(n == 2 && p[0] == '.' && p[1] == '.');
}

/* Decodes and checks entry o; NULL or why. */
static const char *s_entry(const msgpack_object *o, bool dot, ka_fs_entry_t *e)
{
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 5)
        return "an entry that is not [name, type, size, mode, mtime]";
    const msgpack_object *a = o->via.array.ptr;
    if (a[0].type != MSGPACK_OBJECT_STR || !s_name_ok(a[0].via.str.ptr, a[0].via.str.size, dot))
        return "an entry with a malformed name";
    if (a[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[1].via.u64 < KA_GP_FT_FILE ||
        a[1].via.u64 > KA_GP_FT_OTHER)
        return "an entry of an unknown type";
    if (a[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[2].via.u64 > INT64_MAX)
        return "an entry with a malformed size";
    if (a[3].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[3].via.u64 > 07777)
        return "an entry with a malformed mode";
    if (a[4].type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
        a[4].type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return "an entry with a malformed mtime";
    if (e) {
        memcpy(e->name, a[0].via.str.ptr, a[0].via.str.size);
        e->name[a[0].via.str.size] = 0;
        e->type = (uint32_t)a[1].via.u64;
        e->size = a[2].via.u64;
        e->mode = (uint32_t)a[3].via.u64;
        e->mtime_ms = a[4].via.i64;
    }
    return NULL;
}

/* Compares a name (p, n) with a NUL-terminated one, bytewise (as strcmp). */
static int s_cmp(const char *p, size_t n, const char *s)
{
    size_t sn = strlen(s);
    int c = memcmp(p, s, n < sn ? n : sn);
    return c ? c : (n > sn) - (n < sn);
}

const char *ka_fsf_check_list(const msgpack_object *m, const char *after, uint32_t limit)
{
    const msgpack_object *es = ka_gp_get(m, "entries");
    bool more;
    if (!es || es->type != MSGPACK_OBJECT_ARRAY || !ka_gp_get_bool(m, "more", &more))
        return "a listing without entries and more";
    if (es->via.array.size > limit || es->via.array.size > KA_GP_PAGE_MAX)
        return "a listing with more entries than asked for";
    const msgpack_object *prev = NULL;
    for (uint32_t i = 0; i < es->via.array.size; i++) {
        const msgpack_object *e = &es->via.array.ptr[i];
        const char *why = s_entry(e, false, NULL);
        if (why)
            return why;
        const msgpack_object *nm = &e->via.array.ptr[0];
        if (after[0] && s_cmp(nm->via.str.ptr, nm->via.str.size, after) <= 0)
            return "a listing entry that is not after the page token";
        if (prev) {
            const msgpack_object *pn = &prev->via.array.ptr[0];
            size_t k = pn->via.str.size < nm->via.str.size ? pn->via.str.size : nm->via.str.size;
            int c = memcmp(pn->via.str.ptr, nm->via.str.ptr, k);
            if (c > 0 || (c == 0 && pn->via.str.size >= nm->via.str.size))
                return "a listing out of name order";
        }
        prev = e;
    }
    return NULL;
}

const char *ka_fsf_check_stat(const msgpack_object *m)
{
    return s_entry(ka_gp_get(m, "entry"), true, NULL);
}

/* A relative path: 1-4095 bytes, components non-empty and neither "." nor "..". */
static bool s_path_ok(const char *p, size_t n)
{
    if (n == 0 || n > KA_GP_PATH_MAX)
        return false;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] != '/')
            continue;
        if (!s_name_ok(p + start, i - start, false))
            return false;
        start = i + 1;
    }
    return true;
}

const char *ka_fsf_check_event(const char *p, size_t n)
{
    if (n < 3 || p[n - 1] != 0)
        return "a watch event that is not kind, path, NUL, from, NUL";
    int kind = (unsigned char)p[0] & ~KA_GP_EV_ISDIR;
    const char *nul = memchr(p + 1, 0, n - 1);
    size_t pn = (size_t)(nul - (p + 1)), fn = n - 3 - pn;
    if (nul + 1 + fn != p + n - 1 || memchr(nul + 1, 0, fn))
        return "a watch event that is not kind, path, NUL, from, NUL";
    if (kind < KA_GP_EV_CREATE || kind > KA_GP_EV_OVERFLOW)
        return "a watch event of an unknown kind";
    if (kind == KA_GP_EV_OVERFLOW)
        return pn == 0 && fn == 0 && p[0] == KA_GP_EV_OVERFLOW ? NULL
                                                               : "an overflow event with a path";
    if (!s_path_ok(p + 1, pn))
        return "a watch event with a path that is not relative and clean";
    if (kind == KA_GP_EV_MOVE ? !s_path_ok(nul + 1, fn) : fn != 0)
        return "a watch event whose from path does not fit its kind";
    return NULL;
}

void ka_fsf_event(const char *p, int *kind, bool *dir, const char **path, const char **from)
{
    *kind = (unsigned char)p[0] & ~KA_GP_EV_ISDIR;
    *dir = ((unsigned char)p[0] & KA_GP_EV_ISDIR) != 0;
    *path = p + 1;
    *from = p + 2 + strlen(p + 1);
}

ka_fs_page_t *ka_fsf_page(const msgpack_object *m, size_t *len)
{
    const msgpack_object *es = ka_gp_get(m, "entries");
    const msgpack_object *one = es ? NULL : ka_gp_get(m, "entry");
    bool more = false;
    if (es && (es->type != MSGPACK_OBJECT_ARRAY || es->via.array.size > KA_GP_PAGE_MAX))
        return NULL;
    if (!es && !one)
        return NULL;
    uint32_t n = es ? es->via.array.size : 1;
    if (es)
        ka_gp_get_bool(m, "more", &more);
    *len = sizeof(ka_fs_page_t) + (size_t)n * sizeof(ka_fs_entry_t);
    ka_fs_page_t *pg = calloc(1, *len);
    if (!pg)
        return NULL;
    pg->count = n;
    pg->more = more;
    for (uint32_t i = 0; i < n; i++) {
        if (s_entry(es ? &es->via.array.ptr[i] : one, !es, &pg->entries[i])) {
            free(pg);
            return NULL;
        }
    }
    return pg;
}
