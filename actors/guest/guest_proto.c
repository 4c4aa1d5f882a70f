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

/* Big-endian unsigned of n (1, 2 or 4) bytes. */
static uint32_t s_be(const uint8_t *p, size_t n)
{
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* One msgpack token at p[0..n): its header size, payload bytes and the elements it opens.
 * False for the never-used byte 0xc1 or a header cut short. */
static bool s_token(const uint8_t *p, size_t n, size_t *head, uint64_t *payload, uint64_t *opens)
{
    uint8_t b = p[0];
    size_t w = 0; /* width of a length/count field after the type byte */
    *head = 1;
    *payload = 0;
    *opens = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return true;
    if (b <= 0x9f) { /* fixmap 0x80-0x8f, fixarray 0x90-0x9f */
        *opens = (uint64_t)(b & 0x0f) * (b <= 0x8f ? 2 : 1);
        return true;
    }
    if (b <= 0xbf) {
        *payload = b & 0x1f;
        return true;
    }
    static const uint8_t fixed[] = {[0xca - 0xc0] = 4, [0xcb - 0xc0] = 8, [0xcc - 0xc0] = 1,
                                    [0xcd - 0xc0] = 2, [0xce - 0xc0] = 4, [0xcf - 0xc0] = 8,
                                    [0xd0 - 0xc0] = 1, [0xd1 - 0xc0] = 2, [0xd2 - 0xc0] = 4,
                                    [0xd3 - 0xc0] = 8, [0xd4 - 0xc0] = 2, [0xd5 - 0xc0] = 3,
                                    [0xd6 - 0xc0] = 5, [0xd7 - 0xc0] = 9, [0xd8 - 0xc0] = 17};
    if (b >= 0xca && b <= 0xd8) {
        *payload = fixed[b - 0xc0];
        return true;
    }
    switch (b) {
    case 0xc4:
    case 0xc7:
    case 0xd9:
        w = 1;
        break;
    case 0xc5:
    case 0xc8:
    case 0xda:
    case 0xdc:
    case 0xde:
        w = 2;
        break;
    case 0xc6:
    case 0xc9:
    case 0xdb:
    case 0xdd:
    case 0xdf:
        w = 4;
        break;
    default:
        return false; /* 0xc1 */
    }
    if (n < 1 + w)
        return false;
    uint64_t v = s_be(p + 1, w);
    *head = 1 + w;
    if (b == 0xdc || b == 0xdd)
        *opens = v;
    else if (b == 0xde || b == 0xdf)
        *opens = 2 * v;
    else
        *payload = v + (b >= 0xc7 && b <= 0xc9 ? 1 : 0); /* ext: a type byte, then the data */
    return true;
}

int ka_gp_frame_check(const uint8_t *body, size_t len)
{
    uint64_t pending = 1; /* objects still to read */
    size_t off = 0;
    while (pending > 0) {
        if (off >= len || pending > len - off)
            return -EBADMSG; /* each pending object needs at least one more byte */
        size_t head;
        uint64_t payload, opens;
        if (!s_token(body + off, len - off, &head, &payload, &opens) || payload > len - off - head)
            return -EBADMSG;
        off += head + (size_t)payload;
        pending += opens - 1;
    }
    return 0; /* bytes after the object are left alone, as msgpack_unpack_next does */
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
