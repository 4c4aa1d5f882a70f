/*
 * kb_hpack: HPACK header compression (RFC 7541). See hpack.h.
 */
#include "hpack.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define S_STATIC_N 61
#define S_INT_MAX  (1u << 28) /* no honest integer in a header block comes near it */

/* Appendix A. */
static const struct {
    const char *name;
    const char *value;
} s_static[S_STATIC_N] = {
    {":authority", ""},
    {":method", "GET"},
    {":method", "POST"},
    {":path", "/"},
    {":path", "/index.html"},
    {":scheme", "http"},
    {":scheme", "https"},
    {":status", "200"},
    {":status", "204"},
    {":status", "206"},
    {":status", "304"},
    {":status", "400"},
    {":status", "404"},
    {":status", "500"},
    {"accept-charset", ""},
    {"accept-encoding", "gzip, deflate"},
    {"accept-language", ""},
    {"accept-ranges", ""},
    {"accept", ""},
    {"access-control-allow-origin", ""},
    {"age", ""},
    {"allow", ""},
    {"authorization", ""},
    {"cache-control", ""},
    {"content-disposition", ""},
    {"content-encoding", ""},
    {"content-language", ""},
    {"content-length", ""},
    {"content-location", ""},
    {"content-range", ""},
    {"content-type", ""},
    {"cookie", ""},
    {"date", ""},
    {"etag", ""},
    {"expect", ""},
    {"expires", ""},
    {"from", ""},
    {"host", ""},
    {"if-match", ""},
    {"if-modified-since", ""},
    {"if-none-match", ""},
    {"if-range", ""},
    {"if-unmodified-since", ""},
    {"last-modified", ""},
    {"link", ""},
    {"location", ""},
    {"max-forwards", ""},
    {"proxy-authenticate", ""},
    {"proxy-authorization", ""},
    {"range", ""},
    {"referer", ""},
    {"refresh", ""},
    {"retry-after", ""},
    {"server", ""},
    {"set-cookie", ""},
    {"strict-transport-security", ""},
    {"transfer-encoding", ""},
    {"user-agent", ""},
    {"vary", ""},
    {"via", ""},
    {"www-authenticate", ""},
};

/* A field as found in a table: borrowed pointers. */
typedef struct {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} s_field_t;

void kb_hpack_dec_init(kb_hpack_dec_t *d)
{
    memset(d, 0, sizeof *d);
    d->max_size = KB_HPACK_TABLE_SIZE;
    kb_huff_init(&d->huff);
}

void kb_hpack_dec_fini(kb_hpack_dec_t *d)
{
    for (size_t i = 0; i < d->count; i++)
        free(d->ring[(d->head + i) % KB_HPACK_MAX_ENTRIES].data);
    free(d->scratch);
    d->count = d->size = 0;
    d->scratch = NULL;
    d->scratch_cap = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Dynamic table (2.3.2, 4)                                                                   */

static size_t s_entry_size(const struct kb_hpack_entry *e)
{
    return (size_t)e->name_len + e->value_len + KB_HPACK_ENTRY_EXTRA;
}

static void s_evict_to(kb_hpack_dec_t *d, size_t limit)
{
    while (d->count && d->size > limit) {
        struct kb_hpack_entry *e = &d->ring[(d->head + d->count - 1) % KB_HPACK_MAX_ENTRIES];
        d->size -= s_entry_size(e);
        free(e->data);
        e->data = NULL;
        d->count--;
    }
}

/* Adds name/value (copied) as the newest entry, evicting as 4.4 says. */
static int s_insert(kb_hpack_dec_t *d, const char *name, size_t nlen, const char *value,
                    size_t vlen)
{
    size_t esz = nlen + vlen + KB_HPACK_ENTRY_EXTRA;
    if (esz > d->max_size) {
        s_evict_to(d, 0); /* not an error: the table just ends up empty */
        return 0;
    }
    char *data = malloc(nlen + vlen + 1);
    if (!data)
        return -ENOMEM;
    memcpy(data, name, nlen);
    memcpy(data + nlen, value, vlen);
    s_evict_to(d, d->max_size - esz);
    d->head = (d->head + KB_HPACK_MAX_ENTRIES - 1) % KB_HPACK_MAX_ENTRIES;
    d->ring[d->head] = (struct kb_hpack_entry){data, (uint32_t)nlen, (uint32_t)vlen};
    d->count++;
    d->size += esz;
    return 0;
}

/* The field at a 1-based index of the combined index space (2.3.3). */
static int s_lookup(const kb_hpack_dec_t *d, uint32_t index, s_field_t *f)
{
    if (index >= 1 && index <= S_STATIC_N) {
        f->name = s_static[index - 1].name;
        f->name_len = strlen(f->name);
        f->value = s_static[index - 1].value;
        f->value_len = strlen(f->value);
        return 0;
    }
    if (index <= S_STATIC_N || index - S_STATIC_N > d->count)
        return -EBADMSG;
    const struct kb_hpack_entry *e =
        &d->ring[(d->head + index - S_STATIC_N - 1) % KB_HPACK_MAX_ENTRIES];
    *f = (s_field_t){e->data, e->name_len, e->data + e->name_len, e->value_len};
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Primitives (5.1, 5.2)                                                                      */

/* An integer with an N-bit prefix; *p points at its first octet, which exists. */
static int s_int(const uint8_t **p, const uint8_t *end, int prefix, uint32_t *out)
{
    uint32_t max = (1u << prefix) - 1;
    uint32_t v = *(*p)++ & max;
    if (v == max) {
        for (int shift = 0;; shift += 7) {
            if (*p == end || shift > 21)
                return -EBADMSG;
            uint8_t b = *(*p)++;
            v += (uint32_t)(b & 0x7f) << shift;
            if (!(b & 0x80))
                break;
        }
    }
    if (v >= S_INT_MAX)
        return -EBADMSG;
    *out = v;
    return 0;
}

static int s_reserve(kb_hpack_dec_t *d, size_t need)
{
    if (need <= d->scratch_cap && d->scratch)
        return 0;
    size_t cap = need < 256 ? 256 : need * 2;
    char *nb = realloc(d->scratch, cap);
    if (!nb)
        return -ENOMEM;
    d->scratch = nb;
    d->scratch_cap = cap;
    return 0;
}

/* A string literal, decoded into scratch at offset at; *len is its decoded length. */
static int s_str(kb_hpack_dec_t *d, const uint8_t **p, const uint8_t *end, size_t at, size_t *len)
{
    if (*p == end)
        return -EBADMSG;
    bool huff = **p & 0x80;
    uint32_t n;
    int rc = s_int(p, end, 7, &n);
    if (rc)
        return rc;
    if (n > (size_t)(end - *p))
        return -EBADMSG;
    size_t room = huff ? (size_t)n * 8 / 5 + 1 : n;
    if ((rc = s_reserve(d, at + room)) != 0)
        return rc;
    if (huff)
        rc = kb_huff_decode(&d->huff, *p, n, d->scratch + at, room, len);
    else {
        memcpy(d->scratch + at, *p, n);
        *len = n;
    }
    *p += n;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Field representations (6)                                                                  */

/* A literal field (6.2): name by index (prefix bits) or as a string, then the value string. */
static int s_literal(kb_hpack_dec_t *d, const uint8_t **p, const uint8_t *end, int prefix,
                     bool index_it, kb_hpack_field_fn fn, void *user)
{
    uint32_t ni;
    int rc = s_int(p, end, prefix, &ni);
    if (rc)
        return rc;
    size_t nlen = 0, vlen = 0;
    if (ni) {
        s_field_t f;
        if ((rc = s_lookup(d, ni, &f)) != 0 || (rc = s_reserve(d, f.name_len)) != 0)
            return rc;
        memcpy(d->scratch, f.name, f.name_len);
        nlen = f.name_len;
    } else if ((rc = s_str(d, p, end, 0, &nlen)) != 0) {
        return rc;
    }
    if ((rc = s_str(d, p, end, nlen, &vlen)) != 0)
        return rc;
    if (index_it && (rc = s_insert(d, d->scratch, nlen, d->scratch + nlen, vlen)) != 0)
        return rc;
    return fn(user, d->scratch, nlen, d->scratch + nlen, vlen);
}

static int s_size_update(kb_hpack_dec_t *d, const uint8_t **p, const uint8_t *end)
{
    uint32_t size;
    int rc = s_int(p, end, 5, &size);
    if (rc)
        return rc;
    if (size > KB_HPACK_TABLE_SIZE)
        return -EBADMSG;
    d->max_size = size;
    s_evict_to(d, size);
    return 0;
}

int kb_hpack_decode(kb_hpack_dec_t *d, const uint8_t *block, size_t len, kb_hpack_field_fn fn,
                    void *user)
{
    if (len == 0)
        return 0; /* an empty block (block may then be NULL) */
    const uint8_t *p = block, *end = block + len;
    bool fields = false; /* a size update may only open a block (4.2) */
    while (p < end) {
        uint8_t b = *p;
        int rc;
        if (b & 0x80) {
            uint32_t index;
            s_field_t f;
            if ((rc = s_int(&p, end, 7, &index)) == 0 && (rc = s_lookup(d, index, &f)) == 0)
                rc = fn(user, f.name, f.name_len, f.value, f.value_len);
        } else if ((b & 0xc0) == 0x40) {
            rc = s_literal(d, &p, end, 6, true, fn, user);
        } else if ((b & 0xe0) == 0x20) {
            rc = fields ? -EBADMSG : s_size_update(d, &p, end);
        } else {
            rc = s_literal(d, &p, end, 4, false, fn, user); /* 0000 without, 0001 never indexed */
        }
        if (rc)
            return rc;
        fields = fields || (b & 0xe0) != 0x20;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Encoder                                                                                    */

static int s_put_int(uint8_t *out, size_t cap, size_t *at, uint8_t flags, int prefix, size_t v)
{
    size_t max = ((size_t)1 << prefix) - 1, i = *at;
    if (i == cap)
        return -ENOSPC;
    if (v < max) {
        out[i++] = (uint8_t)(flags | v);
    } else {
        out[i++] = (uint8_t)(flags | max);
        for (v -= max; v >= 0x80; v >>= 7) {
            if (i == cap)
                return -ENOSPC;
            out[i++] = (uint8_t)(0x80 | (v & 0x7f));
        }
        if (i == cap)
            return -ENOSPC;
        out[i++] = (uint8_t)v;
    }
    *at = i;
    return 0;
}

static int s_put_str(uint8_t *out, size_t cap, size_t *at, const char *s)
{
    size_t n = strlen(s), i = *at;
    if (s_put_int(out, cap, &i, 0, 7, n) != 0 || cap - i < n)
        return -ENOSPC;
    memcpy(out + i, s, n);
    *at = i + n;
    return 0;
}

int kb_hpack_encode(uint8_t *out, size_t cap, size_t *at, const char *name, const char *value)
{
    size_t i = *at;
    if (s_put_int(out, cap, &i, 0x00, 4, 0) != 0 || s_put_str(out, cap, &i, name) != 0 ||
        s_put_str(out, cap, &i, value) != 0)
        return -ENOSPC;
    *at = i;
    return 0;
}
