/* guest_proto: framing and msgpack map helpers shared by the guest and the node side. */
#include "guest_proto.h"

#include <errno.h>
#include <string.h>

size_t ka_gp_frame_begin(msgpack_sbuffer *sb)
{
    size_t off = sb->size;
    static const char zero[4] = {0, 0, 0, 0};
    msgpack_sbuffer_write(sb, zero, 4);
    return off;
}

void ka_gp_frame_end(msgpack_sbuffer *sb, size_t off)
{
    uint32_t n = (uint32_t)(sb->size - off - 4);
    uint8_t *p = (uint8_t *)sb->data + off;
    p[0] = (uint8_t)(n >> 24);
    p[1] = (uint8_t)(n >> 16);
    p[2] = (uint8_t)(n >> 8);
    p[3] = (uint8_t)n;
}

long ka_gp_frame_next(const uint8_t *buf, size_t len, size_t max, const uint8_t **body,
                      size_t *blen)
{
    if (len < 4)
        return 0;
    uint32_t n = ((uint32_t)buf[0] << 24) | ((uint32_t)buf[1] << 16) | ((uint32_t)buf[2] << 8) |
                 (uint32_t)buf[3];
    if (n > max)
        return -EMSGSIZE;
    if (len - 4 < n)
        return 0;
    *body = buf + 4;
    *blen = n;
    return (long)n + 4;
}

const msgpack_object *ka_gp_get(const msgpack_object *m, const char *key)
{
    if (!m || m->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl &&
            memcmp(k->via.str.ptr, key, kl) == 0)
            return &m->via.map.ptr[i].val;
    }
    return NULL;
}

bool ka_gp_get_u64(const msgpack_object *m, const char *key, uint64_t *out)
{
    const msgpack_object *v = ka_gp_get(m, key);
    if (!v || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *out = v->via.u64;
    return true;
}

bool ka_gp_get_i64(const msgpack_object *m, const char *key, int64_t *out)
{
    const msgpack_object *v = ka_gp_get(m, key);
    if (!v)
        return false;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX) {
        *out = (int64_t)v->via.u64;
        return true;
    }
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = v->via.i64;
        return true;
    }
    return false;
}

bool ka_gp_get_bool(const msgpack_object *m, const char *key, bool *out)
{
    const msgpack_object *v = ka_gp_get(m, key);
    if (!v || v->type != MSGPACK_OBJECT_BOOLEAN)
        return false;
    *out = v->via.boolean;
    return true;
}

bool ka_gp_get_bytes(const msgpack_object *m, const char *key, const char **p, size_t *n)
{
    const msgpack_object *v = ka_gp_get(m, key);
    if (!v)
        return false;
    if (v->type == MSGPACK_OBJECT_STR) {
        *p = v->via.str.ptr;
        *n = v->via.str.size;
        return true;
    }
    if (v->type == MSGPACK_OBJECT_BIN) {
        *p = v->via.bin.ptr;
        *n = v->via.bin.size;
        return true;
    }
    return false;
}

int ka_gp_process_decode(const msgpack_object *m, ka_gp_process_t *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t st = 0;
    if (!ka_gp_get_u64(m, "proc", &out->proc) || !ka_gp_get_u64(m, "state", &st))
        return -EBADMSG;
    out->state = (uint32_t)st;
    ka_gp_get_i64(m, "pid", &out->pid);
    ka_gp_get_i64(m, "exit_code", &out->exit_code);
    ka_gp_get_u64(m, "started_ms", &out->started_ms);
    ka_gp_get_u64(m, "finished_ms", &out->finished_ms);
    return 0;
}

void ka_gp_pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void ka_gp_pack_bytes(msgpack_packer *pk, const void *p, size_t n, bool bin)
{
    if (bin) {
        msgpack_pack_bin(pk, n);
        msgpack_pack_bin_body(pk, p, n);
    } else {
        msgpack_pack_str(pk, n);
        msgpack_pack_str_body(pk, p, n);
    }
}

/* Big-endian unsigned of n bytes at p. */
static uint64_t s_be(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Sizes of one msgpack item's header: *hdr bytes of header (type byte included), *skip bytes
 * of payload, *items nested values (arrays: n, maps: 2n). 0 or -EBADMSG. */
static int s_item(const uint8_t *p, size_t left, size_t *hdr, uint64_t *skip, uint64_t *items)
{
    uint8_t t = p[0];
    *hdr = 1;
    *skip = 0;
    *items = 0;
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3)
        return 0;
    if (t >= 0x80 && t <= 0x8f) {
        *items = 2u * (t & 0x0f);
        return 0;
    }
    if (t >= 0x90 && t <= 0x9f) {
        *items = t & 0x0f;
        return 0;
    }
    if (t >= 0xa0 && t <= 0xbf) {
        *skip = t & 0x1f;
        return 0;
    }
    static const struct {
        uint8_t lo, hi;
        uint8_t len_bytes; /* of a length field; 0: fixed payload */
        uint8_t fixed;     /* payload bytes (plus the ext type byte) */
        uint8_t kind;      /* 0 bytes, 1 array, 2 map */
    } tab[] = {
        {0xc4, 0xc4, 1, 0, 0},  {0xc5, 0xc5, 2, 0, 0}, {0xc6, 0xc6, 4, 0, 0}, {0xc7, 0xc7, 1, 1, 0},
        {0xc8, 0xc8, 2, 1, 0},  {0xc9, 0xc9, 4, 1, 0}, {0xca, 0xca, 0, 4, 0}, {0xcb, 0xcb, 0, 8, 0},
        {0xcc, 0xcc, 0, 1, 0},  {0xcd, 0xcd, 0, 2, 0}, {0xce, 0xce, 0, 4, 0}, {0xcf, 0xcf, 0, 8, 0},
        {0xd0, 0xd0, 0, 1, 0},  {0xd1, 0xd1, 0, 2, 0}, {0xd2, 0xd2, 0, 4, 0}, {0xd3, 0xd3, 0, 8, 0},
        {0xd4, 0xd4, 0, 2, 0},  {0xd5, 0xd5, 0, 3, 0}, {0xd6, 0xd6, 0, 5, 0}, {0xd7, 0xd7, 0, 9, 0},
        {0xd8, 0xd8, 0, 17, 0}, {0xd9, 0xd9, 1, 0, 0}, {0xda, 0xda, 2, 0, 0}, {0xdb, 0xdb, 4, 0, 0},
        {0xdc, 0xdc, 2, 0, 1},  {0xdd, 0xdd, 4, 0, 1}, {0xde, 0xde, 2, 0, 2}, {0xdf, 0xdf, 4, 0, 2},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (t < tab[i].lo || t > tab[i].hi)
            continue;
        size_t lb = tab[i].len_bytes;
        if (left < 1 + lb)
            return -EBADMSG;
        uint64_t n = lb ? s_be(p + 1, lb) : 0;
        *hdr = 1 + lb;
        if (tab[i].kind == 1)
            *items = n;
        else if (tab[i].kind == 2)
            *items = 2 * n;
        else
            *skip = n + tab[i].fixed;
        return 0;
    }
    return -EBADMSG; /* 0xc1: never used */
}

int ka_gp_check(const uint8_t *buf, size_t len, int max_depth)
{
    uint64_t stack[KA_GP_MAX_DEPTH + 2];
    if (max_depth < 0 || max_depth > KA_GP_MAX_DEPTH)
        max_depth = KA_GP_MAX_DEPTH;
    int depth = 0;
    stack[0] = 1; /* values still expected at each level */
    size_t pos = 0;
    while (depth >= 0) {
        if (stack[depth] == 0) {
            depth--;
            continue;
        }
        if (pos >= len)
            return -EBADMSG;
        stack[depth]--;
        size_t hdr;
        uint64_t skip, items;
        if (s_item(buf + pos, len - pos, &hdr, &skip, &items))
            return -EBADMSG;
        pos += hdr;
        if (skip > len - pos)
            return -EBADMSG;
        pos += (size_t)skip;
        if (items == 0)
            continue;
        if (items > len - pos || depth + 1 > max_depth) /* every value takes at least a byte */
            return -EBADMSG;
        stack[++depth] = items;
    }
    return pos == len ? 0 : -EBADMSG;
}
