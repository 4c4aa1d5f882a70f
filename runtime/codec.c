/*
 * krt_codec: a hand-written msgpack writer and a bounds-checked reader (see krt_codec.h).
 *
 * Hand-written rather than msgpack-c: the writer appends straight into one buffer with no
 * per-object call overhead, and the reader returns borrowed views with no zone allocation.
 * The unit test checks both directions against msgpack-c so the wire format stays standard.
 */
#include "krt_codec.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

const char *krt_codec_strerror(int err)
{
    switch (err) {
    case KRT_CODEC_ETRUNC:
        return "msgpack: input truncated";
    case KRT_CODEC_EBADMSG:
        return "msgpack: malformed input";
    case KRT_CODEC_ETYPE:
        return "msgpack: unexpected object type";
    case KRT_CODEC_ERANGE:
        return "msgpack: integer out of range";
    case KRT_CODEC_ENOENT:
        return "msgpack: no such map key";
    case KRT_ENOMEM:
        return "out of memory";
    case KRT_EMSGSIZE:
        return "message too large";
    case KRT_EINVAL:
        return "invalid argument";
    default:
        return err < 0 ? strerror(-err) : "success";
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Big-endian stores and loads                                                                */

static inline void s_be16(uint8_t *d, uint16_t v)
{
    d[0] = (uint8_t)(v >> 8);
    d[1] = (uint8_t)v;
}

static inline void s_be32(uint8_t *d, uint32_t v)
{
    v = __builtin_bswap32(v);
    memcpy(d, &v, 4);
}

static inline void s_be64(uint8_t *d, uint64_t v)
{
    v = __builtin_bswap64(v);
    memcpy(d, &v, 8);
}

static inline uint16_t s_ld16(const uint8_t *s)
{
    return (uint16_t)((s[0] << 8) | s[1]);
}

static inline uint32_t s_ld32(const uint8_t *s)
{
    uint32_t v;
    memcpy(&v, s, 4);
    return __builtin_bswap32(v);
}

static inline uint64_t s_ld64(const uint8_t *s)
{
    uint64_t v;
    memcpy(&v, s, 8);
    return __builtin_bswap64(v);
}

/* ------------------------------------------------------------------------------------------ */
/* Encoders into a buffer known to be large enough. Each returns the bytes written.           */

static inline size_t s_enc_uint(uint8_t *d, uint64_t v)
{
    if (v < 0x80) {
        d[0] = (uint8_t)v;
        return 1;
    }
    if (v <= UINT8_MAX) {
        d[0] = 0xcc;
        d[1] = (uint8_t)v;
        return 2;
    }
    if (v <= UINT16_MAX) {
        d[0] = 0xcd;
        s_be16(d + 1, (uint16_t)v);
        return 3;
    }
    if (v <= UINT32_MAX) {
        d[0] = 0xce;
        s_be32(d + 1, (uint32_t)v);
        return 5;
    }
    d[0] = 0xcf;
    s_be64(d + 1, v);
    return 9;
}

static inline size_t s_enc_int(uint8_t *d, int64_t v)
{
    if (v >= 0)
        return s_enc_uint(d, (uint64_t)v);
    if (v >= -32) {
        d[0] = (uint8_t)(int8_t)v;
        return 1;
    }
    if (v >= INT8_MIN) {
        d[0] = 0xd0;
        d[1] = (uint8_t)(int8_t)v;
        return 2;
    }
    if (v >= INT16_MIN) {
        d[0] = 0xd1;
        s_be16(d + 1, (uint16_t)(int16_t)v);
        return 3;
    }
    if (v >= INT32_MIN) {
        d[0] = 0xd2;
        s_be32(d + 1, (uint32_t)(int32_t)v);
        return 5;
    }
    d[0] = 0xd3;
    s_be64(d + 1, (uint64_t)v);
    return 9;
}

/* A header with a length: fix form (fixbase, if fixmax > 0 and n <= fixmax), else 8/16/32-bit
 * forms (op8 == 0 means there is no 8-bit form). */
static inline size_t s_enc_len(uint8_t *d, uint32_t n, uint8_t fixbase, uint32_t fixmax,
                               uint8_t op8, uint8_t op16, uint8_t op32)
{
    if (fixmax && n <= fixmax) {
        d[0] = (uint8_t)(fixbase | n);
        return 1;
    }
    if (op8 && n <= UINT8_MAX) {
        d[0] = op8;
        d[1] = (uint8_t)n;
        return 2;
    }
    if (n <= UINT16_MAX) {
        d[0] = op16;
        s_be16(d + 1, (uint16_t)n);
        return 3;
    }
    d[0] = op32;
    s_be32(d + 1, n);
    return 5;
}

static inline size_t s_enc_str_hdr(uint8_t *d, uint32_t n)
{
    return s_enc_len(d, n, 0xa0, 31, 0xd9, 0xda, 0xdb);
}

static inline size_t s_enc_bin_hdr(uint8_t *d, uint32_t n)
{
    return s_enc_len(d, n, 0, 0, 0xc4, 0xc5, 0xc6);
}

static inline size_t s_enc_array_hdr(uint8_t *d, uint32_t n)
{
    return s_enc_len(d, n, 0x90, 15, 0, 0xdc, 0xdd);
}

static inline size_t s_enc_map_hdr(uint8_t *d, uint32_t n)
{
    return s_enc_len(d, n, 0x80, 15, 0, 0xde, 0xdf);
}

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

struct krt_pack {
    uint8_t *buf; /* owned */
    size_t len;   /* bytes written */
    size_t cap;   /* bytes allocated */
    int err;      /* sticky error */
};

#define S_PACK_MIN_CAP 256

krt_pack_t *krt_pack_new(size_t cap_hint)
{
    krt_pack_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->cap = cap_hint ? cap_hint : S_PACK_MIN_CAP;
    p->buf = malloc(p->cap);
    if (!p->buf) {
        free(p);
        return NULL;
    }
    return p;
}

void krt_pack_destroy(krt_pack_t **p_p)
{
    if (!p_p || !*p_p)
        return;
    free((*p_p)->buf);
    free(*p_p);
    *p_p = NULL;
}

void krt_pack_reset(krt_pack_t *p)
{
    p->len = 0;
    p->err = 0;
}

int krt_pack_error(const krt_pack_t *p)
{
    return p->err;
}

const uint8_t *krt_pack_data(const krt_pack_t *p)
{
    return p->buf;
}

size_t krt_pack_len(const krt_pack_t *p)
{
    return p->len;
}

uint8_t *krt_pack_take(krt_pack_t *p, size_t *len)
{
    if (p->err)
        return NULL;
    uint8_t *fresh = malloc(S_PACK_MIN_CAP);
    if (!fresh)
        return NULL;
    uint8_t *out = p->buf;
    *len = p->len;
    p->buf = fresh;
    p->cap = S_PACK_MIN_CAP;
    p->len = 0;
    return out;
}

/* Makes room for n more bytes; returns where they go, or NULL (error recorded). */
static uint8_t *s_reserve(krt_pack_t *p, size_t n)
{
    if (p->err)
        return NULL;
    if (p->cap - p->len >= n)
        return p->buf + p->len;
    if (n > SIZE_MAX / 2 - p->len) {
        p->err = KRT_EMSGSIZE;
        return NULL;
    }
    size_t cap = p->cap * 2;
    if (cap < p->len + n)
        cap = p->len + n;
    uint8_t *b = realloc(p->buf, cap);
    if (!b) {
        p->err = KRT_ENOMEM;
        return NULL;
    }
    p->buf = b;
    p->cap = cap;
    return p->buf + p->len;
}

int krt_pack_nil(krt_pack_t *p)
{
    uint8_t *d = s_reserve(p, 1);
    if (!d)
        return p->err;
    d[0] = 0xc0;
    p->len += 1;
    return 0;
}

int krt_pack_bool(krt_pack_t *p, bool v)
{
    uint8_t *d = s_reserve(p, 1);
    if (!d)
        return p->err;
    d[0] = v ? 0xc3 : 0xc2;
    p->len += 1;
    return 0;
}

int krt_pack_int(krt_pack_t *p, int64_t v)
{
    uint8_t *d = s_reserve(p, 9);
    if (!d)
        return p->err;
    p->len += s_enc_int(d, v);
    return 0;
}

int krt_pack_uint(krt_pack_t *p, uint64_t v)
{
    uint8_t *d = s_reserve(p, 9);
    if (!d)
        return p->err;
    p->len += s_enc_uint(d, v);
    return 0;
}

int krt_pack_double(krt_pack_t *p, double v)
{
    uint8_t *d = s_reserve(p, 9);
    if (!d)
        return p->err;
    uint64_t bits;
    memcpy(&bits, &v, 8);
    d[0] = 0xcb;
    s_be64(d + 1, bits);
    p->len += 9;
    return 0;
}

/* Appends a length header (written by hdr) and len payload bytes. */
static int s_pack_blob(krt_pack_t *p, size_t (*hdr)(uint8_t *, uint32_t), const void *data,
                       size_t len)
{
    if (p->err)
        return p->err;
    if (len > UINT32_MAX)
        return p->err = KRT_EMSGSIZE;
    uint8_t *d = s_reserve(p, 5 + len);
    if (!d)
        return p->err;
    size_t h = hdr(d, (uint32_t)len);
    if (len)
        memcpy(d + h, data, len);
    p->len += h + len;
    return 0;
}

int krt_pack_str(krt_pack_t *p, const char *s, size_t len)
{
    return s_pack_blob(p, s_enc_str_hdr, s, len);
}

int krt_pack_cstr(krt_pack_t *p, const char *s)
{
    return s ? krt_pack_str(p, s, strlen(s)) : krt_pack_nil(p);
}

int krt_pack_bin(krt_pack_t *p, const void *data, size_t len)
{
    return s_pack_blob(p, s_enc_bin_hdr, data, len);
}

int krt_pack_ext(krt_pack_t *p, int8_t type, const void *data, size_t len)
{
    if (p->err)
        return p->err;
    if (len > UINT32_MAX)
        return p->err = KRT_EMSGSIZE;
    uint8_t *d = s_reserve(p, 6 + len);
    if (!d)
        return p->err;
    size_t h;
    static const uint8_t fixext[17] = {[1] = 0xd4, [2] = 0xd5, [4] = 0xd6, [8] = 0xd7, [16] = 0xd8};
    if (len <= 16 && fixext[len]) {
        d[0] = fixext[len];
        h = 1;
    } else {
        h = s_enc_len(d, (uint32_t)len, 0, 0, 0xc7, 0xc8, 0xc9);
    }
    d[h++] = (uint8_t)type;
    if (len)
        memcpy(d + h, data, len);
    p->len += h + len;
    return 0;
}

int krt_pack_array(krt_pack_t *p, uint32_t n)
{
    uint8_t *d = s_reserve(p, 5);
    if (!d)
        return p->err;
    p->len += s_enc_array_hdr(d, n);
    return 0;
}

int krt_pack_map(krt_pack_t *p, uint32_t n)
{
    uint8_t *d = s_reserve(p, 5);
    if (!d)
        return p->err;
    p->len += s_enc_map_hdr(d, n);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */

/*
 * One decoded object header: its kind, the header size, and
 *  - for str/bin/ext: payload length (n) and ext type;
 *  - for array/map: the element count (n);
 *  - for scalars: the value (u / i / d / b).
 */
typedef struct s_obj {
    krt_mp_type_t type;
    size_t hdr; /* header bytes (scalars: the whole object) */
    uint32_t n; /* payload bytes or element count */
    int8_t ext; /* ext type */
    bool b;     /* bool value */
    uint64_t u; /* KRT_MP_UINT value */
    int64_t i;  /* KRT_MP_INT value */
    double d;   /* KRT_MP_FLOAT value */
} s_obj_t;

void krt_unpack_init(krt_unpack_t *u, const void *data, size_t len)
{
    u->start_ = data;
    u->p_ = data;
    u->end_ = u->p_ + (data ? len : 0);
    u->err_ = 0;
}

int krt_unpack_error(const krt_unpack_t *u)
{
    return u->err_;
}

size_t krt_unpack_offset(const krt_unpack_t *u)
{
    return (size_t)(u->p_ - u->start_);
}

int krt_unpack_finish(krt_unpack_t *u)
{
    if (!u->err_ && u->p_ != u->end_)
        u->err_ = KRT_CODEC_EBADMSG;
    return u->err_;
}

static inline int s_fail(krt_unpack_t *u, int err)
{
    if (!u->err_)
        u->err_ = err;
    return u->err_;
}

/*
 * Decodes the header of the object at u->p_ into *o without consuming it. Checks that the
 * header, and for str/bin/ext the payload, lie inside the span; for containers, that the
 * count is not larger than the bytes left could hold. Returns 0 or an error (not recorded).
 */
static int s_head(const krt_unpack_t *u, s_obj_t *o)
{
    const uint8_t *p = u->p_;
    size_t left = (size_t)(u->end_ - p);
    if (left == 0)
        return KRT_CODEC_ETRUNC;
    uint8_t c = p[0];
    size_t need; /* header size */
    o->hdr = 1;
    o->n = 0;

    if (c <= 0x7f) {
        o->type = KRT_MP_UINT;
        o->u = c;
        return 0;
    }
    if (c >= 0xe0) {
        o->type = KRT_MP_INT;
        o->i = (int64_t)c - 0x100; /* negative fixint: -32..-1 */
        return 0;
    }
    if (c <= 0x8f || (c >= 0x90 && c <= 0x9f)) {
        o->type = c <= 0x8f ? KRT_MP_MAP : KRT_MP_ARRAY;
        o->n = c & 0x0f;
        goto container;
    }
    if (c <= 0xbf) { /* fixstr */
        o->type = KRT_MP_STR;
        o->n = c & 0x1f;
        goto payload;
    }

    static const uint8_t sizes[32] = {/* c0 nil */ 1,
                                      /* c1 */ 0,
                                      /* c2 */ 1,
                                      /* c3 */ 1,
                                      /* c4-c6 bin */ 2,
                                      3,
                                      5,
                                      /* c7-c9 ext */ 3,
                                      4,
                                      6,
                                      /* ca cb float */ 5,
                                      9,
                                      /* cc-cf uint */ 2,
                                      3,
                                      5,
                                      9,
                                      /* d0-d3 int */ 2,
                                      3,
                                      5,
                                      9,
                                      /* d4-d8 fixext (header incl. type byte) */ 2,
                                      2,
                                      2,
                                      2,
                                      2,
                                      /* d9-db str */ 2,
                                      3,
                                      5,
                                      /* dc dd array */ 3,
                                      5,
                                      /* de df map */ 3,
                                      5};
    need = sizes[c - 0xc0];
    if (need == 0)
        return KRT_CODEC_EBADMSG; /* 0xc1: never used */
    if (left < need)
        return KRT_CODEC_ETRUNC;
    o->hdr = need;

    switch (c) {
    case 0xc0:
        o->type = KRT_MP_NIL;
        return 0;
    case 0xc2:
    case 0xc3:
        o->type = KRT_MP_BOOL;
        o->b = c == 0xc3;
        return 0;
    case 0xc4:
    case 0xc5:
    case 0xc6:
    case 0xd9:
    case 0xda:
    case 0xdb:
        o->type = c <= 0xc6 ? KRT_MP_BIN : KRT_MP_STR;
        o->n = need == 2 ? p[1] : need == 3 ? s_ld16(p + 1) : s_ld32(p + 1);
        goto payload;
    case 0xc7:
    case 0xc8:
    case 0xc9:
        o->type = KRT_MP_EXT;
        o->n = need == 3 ? p[1] : need == 4 ? s_ld16(p + 1) : s_ld32(p + 1);
        o->ext = (int8_t)p[need - 1];
        goto payload;
    case 0xca: {
        uint32_t bits = s_ld32(p + 1);
        float f;
        memcpy(&f, &bits, 4);
        o->type = KRT_MP_FLOAT;
        o->d = f;
        return 0;
    }
    case 0xcb: {
        uint64_t bits = s_ld64(p + 1);
        memcpy(&o->d, &bits, 8);
        o->type = KRT_MP_FLOAT;
        return 0;
    }
    case 0xcc:
        o->type = KRT_MP_UINT;
        o->u = p[1];
        return 0;
    case 0xcd:
        o->type = KRT_MP_UINT;
        o->u = s_ld16(p + 1);
        return 0;
    case 0xce:
        o->type = KRT_MP_UINT;
        o->u = s_ld32(p + 1);
        return 0;
    case 0xcf:
        o->type = KRT_MP_UINT;
        o->u = s_ld64(p + 1);
        return 0;
    case 0xd0:
        o->i = (int64_t)p[1] - (p[1] & 0x80 ? 0x100 : 0);
        goto signed_int;
    case 0xd1:
        o->i = (int16_t)s_ld16(p + 1);
        goto signed_int;
    case 0xd2:
        o->i = (int32_t)s_ld32(p + 1);
        goto signed_int;
    case 0xd3:
        o->i = (int64_t)s_ld64(p + 1);
        goto signed_int;
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        o->type = KRT_MP_EXT;
        o->n = 1u << (c - 0xd4);
        o->ext = (int8_t)p[1];
        goto payload;
    case 0xdc:
    case 0xde:
        o->type = c == 0xdc ? KRT_MP_ARRAY : KRT_MP_MAP;
        o->n = s_ld16(p + 1);
        goto container;
    default: /* 0xdd, 0xdf */
        o->type = c == 0xdd ? KRT_MP_ARRAY : KRT_MP_MAP;
        o->n = s_ld32(p + 1);
        goto container;
    }

signed_int:
    /* Signed encodings of non-negative values are legal msgpack: report them as UINT. */
    if (o->i >= 0) {
        o->type = KRT_MP_UINT;
        o->u = (uint64_t)o->i;
    } else {
        o->type = KRT_MP_INT;
    }
    return 0;
payload:
    if (left - o->hdr < o->n)
        return KRT_CODEC_ETRUNC;
    return 0;
container : {
    uint64_t min_bytes = (uint64_t)o->n * (o->type == KRT_MP_MAP ? 2 : 1);
    if (left - o->hdr < min_bytes)
        return left - o->hdr == 0 ? KRT_CODEC_ETRUNC : KRT_CODEC_EBADMSG;
    return 0;
}
}

/* Reads the next header expecting type t; on success consumes the whole object for scalars,
 * str, bin and ext, and the header only for containers. */
static int s_take(krt_unpack_t *u, krt_mp_type_t t, s_obj_t *o)
{
    if (u->err_)
        return u->err_;
    int rc = s_head(u, o);
    if (rc)
        return s_fail(u, rc);
    if (o->type != t)
        return s_fail(u, KRT_CODEC_ETYPE);
    u->p_ += o->hdr;
    if (t == KRT_MP_STR || t == KRT_MP_BIN || t == KRT_MP_EXT)
        u->p_ += o->n;
    return 0;
}

int krt_unpack_peek(krt_unpack_t *u)
{
    if (u->err_)
        return u->err_;
    s_obj_t o;
    int rc = s_head(u, &o);
    return rc ? s_fail(u, rc) : (int)o.type;
}

int krt_unpack_nil(krt_unpack_t *u)
{
    s_obj_t o;
    return s_take(u, KRT_MP_NIL, &o);
}

int krt_unpack_bool(krt_unpack_t *u, bool *v)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_BOOL, &o);
    if (!rc)
        *v = o.b;
    return rc;
}

int krt_unpack_uint(krt_unpack_t *u, uint64_t *v)
{
    s_obj_t o;
    if (u->err_)
        return u->err_;
    int rc = s_head(u, &o);
    if (rc)
        return s_fail(u, rc);
    if (o.type == KRT_MP_INT)
        return s_fail(u, KRT_CODEC_ERANGE);
    if (o.type != KRT_MP_UINT)
        return s_fail(u, KRT_CODEC_ETYPE);
    u->p_ += o.hdr;
    *v = o.u;
    return 0;
}

int krt_unpack_int(krt_unpack_t *u, int64_t *v)
{
    s_obj_t o;
    if (u->err_)
        return u->err_;
    int rc = s_head(u, &o);
    if (rc)
        return s_fail(u, rc);
    if (o.type == KRT_MP_UINT) {
        if (o.u > INT64_MAX)
            return s_fail(u, KRT_CODEC_ERANGE);
        o.i = (int64_t)o.u;
    } else if (o.type != KRT_MP_INT) {
        return s_fail(u, KRT_CODEC_ETYPE);
    }
    u->p_ += o.hdr;
    *v = o.i;
    return 0;
}

int krt_unpack_double(krt_unpack_t *u, double *v)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_FLOAT, &o);
    if (!rc)
        *v = o.d;
    return rc;
}

int krt_unpack_str(krt_unpack_t *u, const char **s, uint32_t *len)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_STR, &o);
    if (!rc) {
        *s = (const char *)(u->p_ - o.n);
        *len = o.n;
    }
    return rc;
}

int krt_unpack_bin(krt_unpack_t *u, const void **data, uint32_t *len)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_BIN, &o);
    if (!rc) {
        *data = u->p_ - o.n;
        *len = o.n;
    }
    return rc;
}

int krt_unpack_ext(krt_unpack_t *u, int8_t *type, const void **data, uint32_t *len)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_EXT, &o);
    if (!rc) {
        *type = o.ext;
        *data = u->p_ - o.n;
        *len = o.n;
    }
    return rc;
}

int krt_unpack_array(krt_unpack_t *u, uint32_t *n)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_ARRAY, &o);
    if (!rc)
        *n = o.n;
    return rc;
}

int krt_unpack_map(krt_unpack_t *u, uint32_t *n)
{
    s_obj_t o;
    int rc = s_take(u, KRT_MP_MAP, &o);
    if (!rc)
        *n = o.n;
    return rc;
}

int krt_unpack_skip(krt_unpack_t *u)
{
    if (u->err_)
        return u->err_;
    /* Objects still to skip. Every object takes at least one byte, so the loop runs at most
     * once per input byte and `todo` cannot exceed what s_head allowed (<= bytes left). */
    const uint8_t *save = u->p_;
    uint64_t todo = 1;
    while (todo) {
        s_obj_t o;
        int rc = s_head(u, &o);
        if (rc) {
            u->p_ = save;
            return s_fail(u, rc);
        }
        todo--;
        u->p_ += o.hdr;
        if (o.type == KRT_MP_STR || o.type == KRT_MP_BIN || o.type == KRT_MP_EXT)
            u->p_ += o.n;
        else if (o.type == KRT_MP_ARRAY)
            todo += o.n;
        else if (o.type == KRT_MP_MAP)
            todo += (uint64_t)o.n * 2;
    }
    return 0;
}

int krt_unpack_cstr(krt_unpack_t *u, char *buf, size_t cap)
{
    krt_unpack_t peek = *u;
    const char *s;
    uint32_t len;
    int rc = krt_unpack_str(&peek, &s, &len);
    if (rc)
        return s_fail(u, rc);
    if ((size_t)len >= cap)
        return s_fail(u, KRT_EMSGSIZE);
    memcpy(buf, s, len);
    buf[len] = '\0';
    *u = peek;
    return 0;
}

int krt_unpack_map_find(krt_unpack_t *u, const char *key, krt_unpack_t *val)
{
    krt_unpack_t it = *u;
    uint32_t n;
    size_t klen = strlen(key);
    int rc = krt_unpack_map(&it, &n);
    for (uint32_t i = 0; !rc && i < n; i++) {
        const char *s;
        uint32_t len;
        if (krt_unpack_peek(&it) == KRT_MP_STR) {
            rc = krt_unpack_str(&it, &s, &len);
            if (!rc && len == klen && memcmp(s, key, klen) == 0) {
                /* The value must be a whole object; validate before handing it out. */
                krt_unpack_t v = it;
                rc = krt_unpack_skip(&it);
                if (!rc) {
                    *val = v;
                    return 0;
                }
                break;
            }
        } else {
            rc = krt_unpack_skip(&it);
        }
        if (!rc)
            rc = krt_unpack_skip(&it);
    }
    if (!rc)
        rc = it.err_;
    if (rc)
        return s_fail(u, rc);
    return KRT_CODEC_ENOENT;
}

int krt_unpack_map_uint(krt_unpack_t *u, const char *key, uint64_t *v)
{
    krt_unpack_t val;
    int rc = krt_unpack_map_find(u, key, &val);
    return rc ? rc : krt_unpack_uint(&val, v);
}

int krt_unpack_map_int(krt_unpack_t *u, const char *key, int64_t *v)
{
    krt_unpack_t val;
    int rc = krt_unpack_map_find(u, key, &val);
    return rc ? rc : krt_unpack_int(&val, v);
}

int krt_unpack_map_bool(krt_unpack_t *u, const char *key, bool *v)
{
    krt_unpack_t val;
    int rc = krt_unpack_map_find(u, key, &val);
    return rc ? rc : krt_unpack_bool(&val, v);
}

int krt_unpack_map_double(krt_unpack_t *u, const char *key, double *v)
{
    krt_unpack_t val;
    int rc = krt_unpack_map_find(u, key, &val);
    return rc ? rc : krt_unpack_double(&val, v);
}

int krt_unpack_map_str(krt_unpack_t *u, const char *key, const char **s, uint32_t *len)
{
    krt_unpack_t val;
    int rc = krt_unpack_map_find(u, key, &val);
    return rc ? rc : krt_unpack_str(&val, s, len);
}

int krt_unpack_map_bin(krt_unpack_t *u, const char *key, const void **data, uint32_t *len)
{
    krt_unpack_t val;
    int rc = krt_unpack_map_find(u, key, &val);
    return rc ? rc : krt_unpack_bin(&val, data, len);
}

/* ------------------------------------------------------------------------------------------ */
/* Envelopes                                                                                  */

/* The status as the envelope carries it: the positive error number (0 for success). */
static uint32_t s_env_err(const krt_msg_t *msg)
{
    return msg->status < 0 ? (uint32_t) - (int64_t)msg->status : 0;
}

/* Writes the envelope into d, which has room for msg->len + KRT_ENVELOPE_OVERHEAD bytes. */
static size_t s_envelope_write(uint8_t *d, krt_addr_t to, const krt_msg_t *msg)
{
    size_t n = 0;
    d[n++] = 0x98; /* fixarray of 8 */
    d[n++] = KRT_ENVELOPE_VERSION;
    n += s_enc_uint(d + n, to);
    n += s_enc_uint(d + n, msg->from);
    n += s_enc_uint(d + n, msg->type);
    n += s_enc_uint(d + n, msg->ref);
    n += s_enc_uint(d + n, msg->kind);
    n += s_enc_uint(d + n, s_env_err(msg));
    n += s_enc_bin_hdr(d + n, msg->len);
    if (msg->len)
        memcpy(d + n, msg->body, msg->len);
    return n + msg->len;
}

int krt_envelope_encode(krt_pack_t *p, krt_addr_t to, const krt_msg_t *msg)
{
    if (msg->len && !msg->body)
        return KRT_EINVAL;
    uint8_t *d = s_reserve(p, (size_t)msg->len + KRT_ENVELOPE_OVERHEAD);
    if (!d)
        return p->err;
    p->len += s_envelope_write(d, to, msg);
    return 0;
}

static size_t s_uint_size(uint64_t v)
{
    return v < 0x80 ? 1 : v <= UINT8_MAX ? 2 : v <= UINT16_MAX ? 3 : v <= UINT32_MAX ? 5 : 9;
}

/* The exact encoded size of an envelope. */
static size_t s_envelope_size(krt_addr_t to, const krt_msg_t *msg)
{
    size_t bin_hdr = msg->len <= UINT8_MAX ? 2 : msg->len <= UINT16_MAX ? 3 : 5;
    return 2 + s_uint_size(to) + s_uint_size(msg->from) + s_uint_size(msg->type) +
           s_uint_size(msg->ref) + s_uint_size(msg->kind) + s_uint_size(s_env_err(msg)) + bin_hdr +
           msg->len;
}

int krt_envelope_encode_buf(void *buf, size_t cap, krt_addr_t to, const krt_msg_t *msg,
                            size_t *out_len)
{
    if (msg->len && !msg->body)
        return KRT_EINVAL;
    if (cap < (size_t)msg->len + KRT_ENVELOPE_OVERHEAD && cap < s_envelope_size(to, msg))
        return KRT_EMSGSIZE;
    *out_len = s_envelope_write(buf, to, msg);
    return 0;
}

int krt_envelope_decode(const void *data, size_t len, krt_addr_t *to, krt_msg_t *msg)
{
    krt_unpack_t u;
    uint32_t n = 0, blen = 0;
    uint64_t ver = 0, dst = 0, from = 0, type = 0, ref = 0, kind = 0, err = 0;
    const void *body = NULL;
    krt_unpack_init(&u, data, len);
    krt_unpack_array(&u, &n);
    if (!u.err_ && n != 8)
        return KRT_CODEC_EBADMSG;
    krt_unpack_uint(&u, &ver);
    if (!u.err_ && ver != KRT_ENVELOPE_VERSION)
        return KRT_CODEC_EBADMSG;
    krt_unpack_uint(&u, &dst);
    krt_unpack_uint(&u, &from);
    krt_unpack_uint(&u, &type);
    if (!u.err_ && type > UINT32_MAX)
        return KRT_CODEC_ERANGE;
    krt_unpack_uint(&u, &ref);
    krt_unpack_uint(&u, &kind);
    krt_unpack_uint(&u, &err);
    if (!u.err_ &&
        (kind > KRT_KIND_REPLY || err > KRT_ENVELOPE_MAX_ERR || (err && kind != KRT_KIND_REPLY)))
        return KRT_CODEC_EBADMSG;
    krt_unpack_bin(&u, &body, &blen);
    int rc = krt_unpack_finish(&u);
    if (rc)
        return rc;
    *to = dst;
    msg->type = (uint32_t)type;
    msg->len = blen;
    msg->from = from;
    msg->ref = ref;
    msg->body = blen ? body : NULL;
    msg->kind = (uint8_t)kind;
    msg->status = -(int32_t)err;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Stream framing                                                                             */

static uint32_t s_frame_max(uint32_t max)
{
    return max ? max : KRT_FRAME_MAX_DEF;
}

int krt_pack_frame_begin(krt_pack_t *p, size_t *mark)
{
    uint8_t *d = s_reserve(p, KRT_FRAME_HEADER);
    if (!d)
        return p->err;
    *mark = p->len;
    memset(d, 0, KRT_FRAME_HEADER);
    p->len += KRT_FRAME_HEADER;
    return 0;
}

int krt_pack_frame_end(krt_pack_t *p, size_t mark, uint32_t max)
{
    if (p->err)
        return p->err;
    if (mark > p->len || p->len - mark < KRT_FRAME_HEADER)
        return KRT_EINVAL;
    size_t body = p->len - mark - KRT_FRAME_HEADER;
    if (body > s_frame_max(max))
        return p->err = KRT_EMSGSIZE;
    s_be32(p->buf + mark, (uint32_t)body);
    return 0;
}

int krt_frame_write(int fd, const void *body, size_t len, uint32_t max)
{
    if (len > s_frame_max(max))
        return KRT_EMSGSIZE;
    uint8_t hdr[KRT_FRAME_HEADER];
    s_be32(hdr, (uint32_t)len);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)body, len}};
    int iovcnt = len ? 2 : 1;
    struct iovec *v = iov;
    while (iovcnt > 0) {
        ssize_t w = writev(fd, v, iovcnt);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        size_t done = (size_t)w;
        while (iovcnt > 0 && done >= v->iov_len) {
            done -= v->iov_len;
            v++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            v->iov_base = (uint8_t *)v->iov_base + done;
            v->iov_len -= done;
        }
    }
    return 0;
}

struct krt_framer {
    uint8_t *buf;  /* owned; bytes [head, tail) are pending */
    size_t head;   /* first pending byte */
    size_t tail;   /* one past the last pending byte */
    size_t cap;    /* bytes allocated */
    uint32_t max;  /* largest accepted frame body */
    bool poisoned; /* an oversized header was seen */
};

#define S_FRAMER_READ 65536

krt_framer_t *krt_framer_new(uint32_t max)
{
    krt_framer_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->max = s_frame_max(max);
    return f;
}

void krt_framer_destroy(krt_framer_t **f_p)
{
    if (!f_p || !*f_p)
        return;
    free((*f_p)->buf);
    free(*f_p);
    *f_p = NULL;
}

/* Makes room for n bytes after tail (compacting first). */
static int s_framer_room(krt_framer_t *f, size_t n)
{
    if (f->head == f->tail)
        f->head = f->tail = 0;
    if (f->cap - f->tail >= n)
        return 0;
    if (f->head > 0) {
        memmove(f->buf, f->buf + f->head, f->tail - f->head);
        f->tail -= f->head;
        f->head = 0;
        if (f->cap - f->tail >= n)
            return 0;
    }
    if (n > SIZE_MAX / 2 - f->tail)
        return KRT_ENOMEM;
    size_t cap = f->cap ? f->cap * 2 : 4096;
    while (cap < f->tail + n)
        cap *= 2;
    uint8_t *b = realloc(f->buf, cap);
    if (!b)
        return KRT_ENOMEM;
    f->buf = b;
    f->cap = cap;
    return 0;
}

int krt_framer_feed(krt_framer_t *f, const void *data, size_t len)
{
    if (!len)
        return 0;
    int rc = s_framer_room(f, len);
    if (rc)
        return rc;
    memcpy(f->buf + f->tail, data, len);
    f->tail += len;
    return 0;
}

ssize_t krt_framer_read_fd(krt_framer_t *f, int fd)
{
    int rc = s_framer_room(f, S_FRAMER_READ);
    if (rc)
        return rc;
    for (;;) {
        ssize_t r = read(fd, f->buf + f->tail, f->cap - f->tail);
        if (r >= 0) {
            f->tail += (size_t)r;
            return r;
        }
        if (errno != EINTR)
            return -errno;
    }
}

int krt_framer_next(krt_framer_t *f, const uint8_t **body, size_t *len)
{
    if (f->poisoned)
        return KRT_EMSGSIZE;
    size_t have = f->tail - f->head;
    if (have < KRT_FRAME_HEADER)
        return 0;
    uint32_t n = s_ld32(f->buf + f->head);
    if (n > f->max) {
        f->poisoned = true;
        return KRT_EMSGSIZE;
    }
    if (have - KRT_FRAME_HEADER < n)
        return 0;
    *body = f->buf + f->head + KRT_FRAME_HEADER;
    *len = n;
    f->head += KRT_FRAME_HEADER + n;
    return 1;
}

size_t krt_framer_pending(const krt_framer_t *f)
{
    return f->tail - f->head;
}
