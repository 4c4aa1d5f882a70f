/*
 * Unit tests for runtime/codec.c: round trips of every msgpack type at every encoding
 * boundary, agreement with msgpack-c in both directions, map lookups, envelopes, stream
 * framing, and hostile input (every truncation, random and mutated bytes, huge lengths and
 * counts, deep nesting) that must yield errors and never a bad read (run under ASan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "krt_codec.h"

/* Deterministic PRNG so failures reproduce (xorshift64*). */
static uint64_t s_rng = 0x9e3779b97f4a7c15ull;
static uint64_t s_rand(void)
{
    s_rng ^= s_rng >> 12;
    s_rng ^= s_rng << 25;
    s_rng ^= s_rng >> 27;
    return s_rng * 2685821657736338717ull;
}

/* Packs v alone and returns the encoded length; checks it decodes back. */
static size_t s_uint_roundtrip(uint64_t v)
{
    krt_pack_t *p = krt_pack_new(0);
    assert_non_null(p);
    assert_int_equal(krt_pack_uint(p, v), 0);
    size_t len = krt_pack_len(p);
    krt_unpack_t u;
    krt_unpack_init(&u, krt_pack_data(p), len);
    assert_int_equal(krt_unpack_peek(&u), KRT_MP_UINT);
    uint64_t got = 0;
    assert_int_equal(krt_unpack_uint(&u, &got), 0);
    assert_true(got == v);
    assert_int_equal(krt_unpack_finish(&u), 0);
    krt_pack_destroy(&p);
    assert_null(p);
    return len;
}

static size_t s_int_roundtrip(int64_t v)
{
    krt_pack_t *p = krt_pack_new(1);
    assert_int_equal(krt_pack_int(p, v), 0);
    size_t len = krt_pack_len(p);
    krt_unpack_t u;
    krt_unpack_init(&u, krt_pack_data(p), len);
    int64_t got = 0;
    assert_int_equal(krt_unpack_int(&u, &got), 0);
    assert_true(got == v);
    assert_int_equal(krt_unpack_finish(&u), 0);
    krt_pack_destroy(&p);
    return len;
}

static void test_integers_shortest_form(void **unused)
{
    assert_int_equal(s_uint_roundtrip(0), 1);
    assert_int_equal(s_uint_roundtrip(127), 1);
    assert_int_equal(s_uint_roundtrip(128), 2);
    assert_int_equal(s_uint_roundtrip(255), 2);
    assert_int_equal(s_uint_roundtrip(256), 3);
    assert_int_equal(s_uint_roundtrip(65535), 3);
    assert_int_equal(s_uint_roundtrip(65536), 5);
    assert_int_equal(s_uint_roundtrip(UINT32_MAX), 5);
    assert_int_equal(s_uint_roundtrip((uint64_t)UINT32_MAX + 1), 9);
    assert_int_equal(s_uint_roundtrip(UINT64_MAX), 9);
    assert_int_equal(s_int_roundtrip(5), 1);
    assert_int_equal(s_int_roundtrip(-1), 1);
    assert_int_equal(s_int_roundtrip(-32), 1);
    assert_int_equal(s_int_roundtrip(-33), 2);
    assert_int_equal(s_int_roundtrip(-128), 2);
    assert_int_equal(s_int_roundtrip(-129), 3);
    assert_int_equal(s_int_roundtrip(INT16_MIN), 3);
    assert_int_equal(s_int_roundtrip(INT16_MIN - 1), 5);
    assert_int_equal(s_int_roundtrip(INT32_MIN), 5);
    assert_int_equal(s_int_roundtrip((int64_t)INT32_MIN - 1), 9);
    assert_int_equal(s_int_roundtrip(INT64_MIN), 9);
    assert_int_equal(s_int_roundtrip(INT64_MAX), 9);
    for (int i = 0; i < 10000; i++) {
        uint64_t r = s_rand() >> (s_rand() % 64);
        s_uint_roundtrip(r);
        s_int_roundtrip((int64_t)r * ((s_rand() & 1) ? -1 : 1));
    }
}

static void test_integer_range_and_type_errors(void **unused)
{
    krt_pack_t *p = krt_pack_new(0);
    krt_pack_int(p, -5);
    krt_pack_uint(p, UINT64_MAX);
    krt_pack_cstr(p, "x");
    const uint8_t *d = krt_pack_data(p);
    krt_unpack_t u;
    uint64_t uv;
    int64_t iv;

    krt_unpack_init(&u, d, krt_pack_len(p));
    assert_int_equal(krt_unpack_uint(&u, &uv), KRT_CODEC_ERANGE); /* negative into uint */
    assert_int_equal(krt_unpack_offset(&u), 0);                   /* nothing consumed */
    assert_int_equal(krt_unpack_int(&u, &iv), KRT_CODEC_ERANGE);  /* sticky */
    assert_int_equal(krt_unpack_error(&u), KRT_CODEC_ERANGE);

    krt_unpack_init(&u, d, krt_pack_len(p));
    assert_int_equal(krt_unpack_int(&u, &iv), 0);
    assert_int_equal(iv, -5);
    assert_int_equal(krt_unpack_int(&u, &iv), KRT_CODEC_ERANGE); /* > INT64_MAX */

    krt_unpack_init(&u, d, krt_pack_len(p));
    assert_int_equal(krt_unpack_skip(&u), 0);
    assert_int_equal(krt_unpack_skip(&u), 0);
    bool b;
    assert_int_equal(krt_unpack_bool(&u, &b), KRT_CODEC_ETYPE);
    assert_int_equal(krt_unpack_peek(&u), KRT_CODEC_ETYPE); /* sticky even for peek */
    krt_pack_destroy(&p);

    /* Signed encodings of non-negative values are legal and read as unsigned. */
    const uint8_t int8_pos[] = {0xd0, 0x05};
    krt_unpack_init(&u, int8_pos, sizeof int8_pos);
    assert_int_equal(krt_unpack_uint(&u, &uv), 0);
    assert_int_equal(uv, 5);
    assert_string_equal(krt_codec_strerror(KRT_CODEC_ERANGE), "msgpack: integer out of range");
    assert_string_equal(krt_codec_strerror(KRT_CODEC_ETRUNC), "msgpack: input truncated");
}

/* Packs a str/bin of len bytes, checks header size and content. */
static void s_blob_roundtrip(bool str, size_t len, size_t hdr)
{
    char *src = malloc(len + 1);
    assert_non_null(src);
    for (size_t i = 0; i < len; i++)
        src[i] = (char)('a' + i % 26);
    krt_pack_t *p = krt_pack_new(0);
    assert_int_equal(str ? krt_pack_str(p, src, len) : krt_pack_bin(p, src, len), 0);
    assert_int_equal(krt_pack_len(p), hdr + len);
    krt_unpack_t u;
    krt_unpack_init(&u, krt_pack_data(p), krt_pack_len(p));
    assert_int_equal(krt_unpack_peek(&u), str ? KRT_MP_STR : KRT_MP_BIN);
    uint32_t got;
    if (str) {
        const char *s;
        assert_int_equal(krt_unpack_str(&u, &s, &got), 0);
        assert_int_equal(got, len);
        if (len)
            assert_memory_equal(s, src, len);
    } else {
        const void *b;
        assert_int_equal(krt_unpack_bin(&u, &b, &got), 0);
        assert_int_equal(got, len);
        if (len)
            assert_memory_equal(b, src, len);
    }
    assert_int_equal(krt_unpack_finish(&u), 0);
    krt_pack_destroy(&p);
    free(src);
}

static void test_str_bin_boundaries(void **unused)
{
    s_blob_roundtrip(true, 0, 1);
    s_blob_roundtrip(true, 31, 1);
    s_blob_roundtrip(true, 32, 2);
    s_blob_roundtrip(true, 255, 2);
    s_blob_roundtrip(true, 256, 3);
    s_blob_roundtrip(true, 65535, 3);
    s_blob_roundtrip(true, 65536, 5);
    s_blob_roundtrip(false, 0, 2);
    s_blob_roundtrip(false, 255, 2);
    s_blob_roundtrip(false, 256, 3);
    s_blob_roundtrip(false, 65535, 3);
    s_blob_roundtrip(false, 65536, 5);

    char buf[8];
    krt_pack_t *p = krt_pack_new(0);
    krt_pack_cstr(p, "hello");
    krt_pack_cstr(p, "longer than eight");
    krt_pack_cstr(p, NULL);
    krt_unpack_t u;
    krt_unpack_init(&u, krt_pack_data(p), krt_pack_len(p));
    assert_int_equal(krt_unpack_cstr(&u, buf, sizeof buf), 0);
    assert_string_equal(buf, "hello");
    assert_int_equal(krt_unpack_cstr(&u, buf, sizeof buf), KRT_EMSGSIZE);
    krt_unpack_init(&u, krt_pack_data(p), krt_pack_len(p));
    krt_unpack_skip(&u);
    krt_unpack_skip(&u);
    assert_int_equal(krt_unpack_nil(&u), 0);
    assert_int_equal(krt_unpack_finish(&u), 0);
    krt_pack_destroy(&p);
}

static void test_containers_and_scalars(void **unused)
{
    static const uint32_t counts[] = {0, 15, 16, 65535, 65536};
    static const size_t hdrs[] = {1, 1, 3, 3, 5};
    for (size_t i = 0; i < 5; i++) {
        for (int map = 0; map < 2; map++) {
            krt_pack_t *p = krt_pack_new(0);
            assert_int_equal(map ? krt_pack_map(p, counts[i]) : krt_pack_array(p, counts[i]), 0);
            assert_int_equal(krt_pack_len(p), hdrs[i]);
            for (uint32_t k = 0; k < counts[i] * (map ? 2u : 1u); k++)
                krt_pack_nil(p);
            krt_unpack_t u;
            krt_unpack_init(&u, krt_pack_data(p), krt_pack_len(p));
            assert_int_equal(krt_unpack_peek(&u), map ? KRT_MP_MAP : KRT_MP_ARRAY);
            uint32_t n;
            krt_unpack_t copy = u;
            assert_int_equal(map ? krt_unpack_map(&u, &n) : krt_unpack_array(&u, &n), 0);
            assert_int_equal(n, counts[i]);
            assert_int_equal(krt_unpack_skip(&copy), 0);
            assert_int_equal(krt_unpack_finish(&copy), 0);
            krt_pack_destroy(&p);
        }
    }

    krt_pack_t *p = krt_pack_new(0);
    krt_pack_array(p, 9);
    krt_pack_nil(p);
    krt_pack_bool(p, true);
    krt_pack_bool(p, false);
    krt_pack_double(p, 3.25);
    krt_pack_double(p, -0.0);
    krt_pack_double(p, INFINITY);
    static const uint8_t e16[16] = {1, 2, 3};
    krt_pack_ext(p, 7, e16, 1);
    krt_pack_ext(p, -3, e16, 16);
    krt_pack_ext(p, 100, e16, 3);
    assert_int_equal(krt_pack_error(p), 0);

    krt_unpack_t u;
    krt_unpack_init(&u, krt_pack_data(p), krt_pack_len(p));
    uint32_t n;
    bool b;
    double d;
    int8_t et;
    const void *ed;
    uint32_t el;
    assert_int_equal(krt_unpack_array(&u, &n), 0);
    assert_int_equal(n, 9);
    assert_int_equal(krt_unpack_peek(&u), KRT_MP_NIL);
    assert_int_equal(krt_unpack_nil(&u), 0);
    assert_int_equal(krt_unpack_bool(&u, &b), 0);
    assert_true(b);
    assert_int_equal(krt_unpack_bool(&u, &b), 0);
    assert_false(b);
    assert_int_equal(krt_unpack_peek(&u), KRT_MP_FLOAT);
    assert_int_equal(krt_unpack_double(&u, &d), 0);
    assert_true(d == 3.25);
    assert_int_equal(krt_unpack_double(&u, &d), 0);
    assert_true(d == 0.0 && signbit(d));
    assert_int_equal(krt_unpack_double(&u, &d), 0);
    assert_true(isinf(d));
    assert_int_equal(krt_unpack_peek(&u), KRT_MP_EXT);
    assert_int_equal(krt_unpack_ext(&u, &et, &ed, &el), 0);
    assert_int_equal(et, 7);
    assert_int_equal(el, 1);
    assert_int_equal(krt_unpack_ext(&u, &et, &ed, &el), 0);
    assert_int_equal(et, -3);
    assert_int_equal(el, 16);
    assert_memory_equal(ed, e16, 16);
    assert_int_equal(krt_unpack_ext(&u, &et, &ed, &el), 0);
    assert_int_equal(et, 100);
    assert_int_equal(el, 3);
    assert_int_equal(krt_unpack_finish(&u), 0);

    /* float32 from another encoder */
    const uint8_t f32[] = {0xca, 0x3f, 0xc0, 0x00, 0x00}; /* 1.5f */
    krt_unpack_init(&u, f32, sizeof f32);
    assert_int_equal(krt_unpack_double(&u, &d), 0);
    assert_true(d == 1.5);

    /* take hands over the buffer and leaves the writer usable */
    size_t len;
    size_t before = krt_pack_len(p);
    uint8_t *owned = krt_pack_take(p, &len);
    assert_non_null(owned);
    assert_int_equal(len, before);
    assert_int_equal(krt_pack_len(p), 0);
    assert_int_equal(krt_pack_uint(p, 1), 0);
    free(owned);
    krt_pack_reset(p);
    assert_int_equal(krt_pack_len(p), 0);
    krt_pack_destroy(&p);
    krt_pack_destroy(&p); /* idempotent */
}

static void test_writer_sticky_error(void **unused)
{
    krt_pack_t *p = krt_pack_new(0);
    static const char one = 'x';
    /* A length over UINT32_MAX is refused before anything is read from the pointer. */
    assert_int_equal(krt_pack_str(p, &one, (size_t)UINT32_MAX + 1), KRT_EMSGSIZE);
    assert_int_equal(krt_pack_nil(p), KRT_EMSGSIZE);
    assert_int_equal(krt_pack_len(p), 0);
    size_t len;
    assert_null(krt_pack_take(p, &len));
    krt_pack_reset(p);
    assert_int_equal(krt_pack_nil(p), 0);
    krt_pack_destroy(&p);
}

/* ------------------------------------------------------------------------------------------ */
/* Agreement with msgpack-c                                                                   */

static void test_msgpack_c_reads_ours(void **unused)
{
    krt_pack_t *p = krt_pack_new(0);
    krt_pack_map(p, 3);
    krt_pack_cstr(p, "id");
    krt_pack_uint(p, 0x123456789ull);
    krt_pack_cstr(p, "neg");
    krt_pack_int(p, -100000);
    krt_pack_cstr(p, "list");
    krt_pack_array(p, 3);
    krt_pack_double(p, 2.5);
    krt_pack_bin(p, "\x00\x01", 2);
    krt_pack_bool(p, true);

    msgpack_unpacked m;
    msgpack_unpacked_init(&m);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&m, (const char *)krt_pack_data(p), krt_pack_len(p), &off),
                     MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, krt_pack_len(p));
    msgpack_object o = m.data;
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o.via.map.size, 3);
    assert_int_equal(o.via.map.ptr[0].val.type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    assert_true(o.via.map.ptr[0].val.via.u64 == 0x123456789ull);
    assert_int_equal(o.via.map.ptr[1].val.type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
    assert_int_equal(o.via.map.ptr[1].val.via.i64, -100000);
    msgpack_object list = o.via.map.ptr[2].val;
    assert_int_equal(list.type, MSGPACK_OBJECT_ARRAY);
    assert_true(list.via.array.ptr[0].via.f64 == 2.5);
    assert_int_equal(list.via.array.ptr[1].type, MSGPACK_OBJECT_BIN);
    assert_int_equal(list.via.array.ptr[1].via.bin.size, 2);
    assert_int_equal(list.via.array.ptr[2].type, MSGPACK_OBJECT_BOOLEAN);
    msgpack_unpacked_destroy(&m);
    krt_pack_destroy(&p);
}

static void test_we_read_msgpack_c(void **unused)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "name", 4);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "box", 3);
    msgpack_pack_str(&pk, 3);
    msgpack_pack_str_body(&pk, "mem", 3);
    msgpack_pack_uint64(&pk, 1ull << 40);
    msgpack_pack_str(&pk, 1);
    msgpack_pack_str_body(&pk, "f", 1);
    msgpack_pack_float(&pk, 0.5f);
    msgpack_pack_int(&pk, 42); /* a non-string key */
    msgpack_pack_int64(&pk, -7);

    krt_unpack_t u;
    krt_unpack_init(&u, sb.data, sb.size);
    const char *s;
    uint32_t len;
    uint64_t mem;
    double f;
    assert_int_equal(krt_unpack_map_str(&u, "name", &s, &len), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(s, "box", 3);
    assert_int_equal(krt_unpack_map_uint(&u, "mem", &mem), 0);
    assert_true(mem == 1ull << 40);
    assert_int_equal(krt_unpack_map_double(&u, "f", &f), 0);
    assert_true(f == 0.5);
    assert_int_equal(krt_unpack_skip(&u), 0);
    assert_int_equal(krt_unpack_finish(&u), 0);

    /* Every integer encoding msgpack-c can produce reads back. */
    msgpack_sbuffer_clear(&sb);
    static const int64_t vals[] = {0,  1,   127, 128,  255,  256,       65535,     65536,
                                   -1, -32, -33, -128, -129, INT32_MIN, INT64_MIN, INT64_MAX};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        msgpack_pack_int64(&pk, vals[i]);
        msgpack_pack_int8(&pk, (int8_t)vals[i]);
        msgpack_pack_uint16(&pk, (uint16_t)vals[i]);
    }
    krt_unpack_init(&u, sb.data, sb.size);
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        int64_t v;
        uint64_t w;
        assert_int_equal(krt_unpack_int(&u, &v), 0);
        assert_true(v == vals[i]);
        assert_int_equal(krt_unpack_int(&u, &v), 0);
        assert_true(v == (int8_t)vals[i]);
        assert_int_equal(krt_unpack_uint(&u, &w), 0);
        assert_true(w == (uint16_t)vals[i]);
    }
    assert_int_equal(krt_unpack_finish(&u), 0);
    msgpack_sbuffer_destroy(&sb);
}

/* ------------------------------------------------------------------------------------------ */
/* Map helpers                                                                                */

static void test_map_find(void **unused)
{
    krt_pack_t *p = krt_pack_new(0);
    krt_pack_map(p, 5);
    krt_pack_uint(p, 1); /* non-string key: skipped */
    krt_pack_cstr(p, "a");
    krt_pack_cstr(p, "nested"); /* value is a container: skipped as a whole */
    krt_pack_map(p, 1);
    krt_pack_cstr(p, "b");
    krt_pack_array(p, 2);
    krt_pack_cstr(p, "b");
    krt_pack_cstr(p, "c");
    krt_pack_cstr(p, "b");
    krt_pack_bool(p, true);
    krt_pack_cstr(p, "neg");
    krt_pack_int(p, -9);
    krt_pack_cstr(p, "blob");
    krt_pack_bin(p, "xyz", 3);

    krt_unpack_t u, v;
    krt_unpack_init(&u, krt_pack_data(p), krt_pack_len(p));
    bool b = false;
    int64_t i;
    const void *bin;
    uint32_t len;
    uint64_t uv;
    assert_int_equal(krt_unpack_map_bool(&u, "b", &b), 0);
    assert_true(b);
    assert_int_equal(krt_unpack_map_int(&u, "neg", &i), 0);
    assert_int_equal(i, -9);
    assert_int_equal(krt_unpack_map_bin(&u, "blob", &bin, &len), 0);
    assert_int_equal(len, 3);
    assert_memory_equal(bin, "xyz", 3);
    assert_int_equal(krt_unpack_map_find(&u, "nested", &v), 0);
    assert_int_equal(krt_unpack_map_bool(&v, "b", &b), KRT_CODEC_ETYPE);
    assert_int_equal(krt_unpack_map_find(&u, "missing", &v), KRT_CODEC_ENOENT);
    assert_int_equal(krt_unpack_map_find(&u, "bl", &v), KRT_CODEC_ENOENT); /* prefix only */
    assert_int_equal(krt_unpack_map_uint(&u, "neg", &uv), KRT_CODEC_ERANGE);
    /* Lookups never move u nor poison it (ENOENT and errors in *val stay there). */
    assert_int_equal(krt_unpack_error(&u), 0);
    assert_int_equal(krt_unpack_offset(&u), 0);
    assert_int_equal(krt_unpack_skip(&u), 0);
    assert_int_equal(krt_unpack_finish(&u), 0);

    /* Not a map. */
    krt_unpack_init(&u, krt_pack_data(p) + 1, krt_pack_len(p) - 1);
    assert_int_equal(krt_unpack_map_find(&u, "a", &v), KRT_CODEC_ETYPE);
    assert_int_equal(krt_unpack_error(&u), KRT_CODEC_ETYPE);

    /* Every truncation of the map fails any lookup of the last key. */
    for (size_t cut = 0; cut < krt_pack_len(p); cut++) {
        krt_unpack_init(&u, krt_pack_data(p), cut);
        int rc = krt_unpack_map_bin(&u, "blob", &bin, &len);
        assert_true(rc == KRT_CODEC_ETRUNC || rc == KRT_CODEC_EBADMSG);
    }
    krt_pack_destroy(&p);
}

/* ------------------------------------------------------------------------------------------ */
/* Envelopes                                                                                  */

static void s_envelope_roundtrip(krt_addr_t to, uint32_t type, krt_addr_t from, uint64_t ref,
                                 size_t len, uint8_t kind, int32_t status)
{
    uint8_t *body = malloc(len ? len : 1);
    for (size_t i = 0; i < len; i++)
        body[i] = (uint8_t)s_rand();
    krt_msg_t m = {.type = type,
                   .len = (uint32_t)len,
                   .from = from,
                   .ref = ref,
                   .body = body,
                   .status = status,
                   .kind = kind};
    krt_pack_t *p = krt_pack_new(0);
    assert_int_equal(krt_envelope_encode(p, to, &m), 0);
    assert_true(krt_pack_len(p) <= len + KRT_ENVELOPE_OVERHEAD);

    krt_addr_t got_to;
    krt_msg_t got;
    assert_int_equal(krt_envelope_decode(krt_pack_data(p), krt_pack_len(p), &got_to, &got), 0);
    assert_true(got_to == to);
    assert_int_equal(got.type, type);
    assert_true(got.from == from);
    assert_true(got.ref == ref);
    assert_int_equal(got.kind, kind);
    assert_int_equal(got.status, status);
    assert_int_equal(got.len, len);
    if (len)
        assert_memory_equal(got.body, body, len);
    else
        assert_null(got.body);

    /* encode_buf: same bytes; an exactly sized buffer works, one byte less does not. */
    size_t n = krt_pack_len(p);
    uint8_t *buf = malloc(n + KRT_ENVELOPE_OVERHEAD);
    size_t out;
    assert_int_equal(krt_envelope_encode_buf(buf, n + KRT_ENVELOPE_OVERHEAD, to, &m, &out), 0);
    assert_int_equal(out, n);
    assert_memory_equal(buf, krt_pack_data(p), n);
    assert_int_equal(krt_envelope_encode_buf(buf, n, to, &m, &out), 0);
    assert_int_equal(out, n);
    assert_int_equal(krt_envelope_encode_buf(buf, n - 1, to, &m, &out), KRT_EMSGSIZE);

    /* Every truncation and one trailing byte are errors. */
    for (size_t cut = 0; cut < n; cut++) {
        int rc = krt_envelope_decode(krt_pack_data(p), cut, &got_to, &got);
        assert_true(rc == KRT_CODEC_ETRUNC || rc == KRT_CODEC_EBADMSG);
    }
    memcpy(buf, krt_pack_data(p), n);
    buf[n] = 0xc0;
    assert_int_equal(krt_envelope_decode(buf, n + 1, &got_to, &got), KRT_CODEC_EBADMSG);
    free(buf);
    krt_pack_destroy(&p);
    free(body);
}

static void test_envelope(void **unused)
{
    s_envelope_roundtrip(((krt_addr_t)2 << 48) | 77, KRT_MSG_USER, ((krt_addr_t)1 << 48) | 5, 0, 0,
                         KRT_KIND_PLAIN, 0);
    s_envelope_roundtrip(((krt_addr_t)65535 << 48) | 0xffffffffffffull, UINT32_MAX, 1, UINT64_MAX,
                         13, KRT_KIND_REQUEST, 0);
    s_envelope_roundtrip(1, KRT_MSG_DOWN, 0, 1, 255, KRT_KIND_PLAIN, 0);
    s_envelope_roundtrip(1, 300, 2, 3, 256, KRT_KIND_REPLY, 0);
    s_envelope_roundtrip(1, 300, 2, 3, 65536, KRT_KIND_REQUEST, 0);
    /* error replies: the status travels in the envelope */
    s_envelope_roundtrip(1, KRT_MSG_ERROR, 2, 3, 12, KRT_KIND_REPLY, -EPERM);
    s_envelope_roundtrip(1, KRT_MSG_ERROR, 2, UINT64_MAX, 0, KRT_KIND_REPLY, -KRT_ENVELOPE_MAX_ERR);

    /* Well-formed msgpack that is not an envelope. */
    krt_addr_t to;
    krt_msg_t m;
    const uint8_t wrong_version[] = {0x98, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x00, 0xc4, 0x00};
    const uint8_t wrong_arity[] = {0x96, 0x02, 0x01, 0x01, 0x01, 0x01, 0xc4, 0x00};
    const uint8_t body_is_str[] = {0x98, 0x02, 0x01, 0x01, 0x01, 0x01, 0x00, 0x00, 0xa0};
    const uint8_t type_too_big[] = {0x98, 0x02, 0x01, 0x01, 0xcf, 0, 0,    0,    1,
                                    0,    0,    0,    0,    0x01, 0, 0x00, 0xc4, 0x00};
    const uint8_t bad_kind[] = {0x98, 0x02, 0x01, 0x01, 0x01, 0x01, 0x03, 0x00, 0xc4, 0x00};
    const uint8_t status_on_request[] = {0x98, 0x02, 0x01, 0x01, 0x01,
                                         0x01, 0x01, 0x05, 0xc4, 0x00};
    const uint8_t status_too_big[] = {0x98, 0x02, 0x01, 0x01, 0x01, 0x01,
                                      0x02, 0xcd, 0x10, 0x00, 0xc4, 0x00};
    assert_int_equal(krt_envelope_decode(bad_kind, sizeof bad_kind, &to, &m), KRT_CODEC_EBADMSG);
    assert_int_equal(krt_envelope_decode(status_on_request, sizeof status_on_request, &to, &m),
                     KRT_CODEC_EBADMSG);
    assert_int_equal(krt_envelope_decode(status_too_big, sizeof status_too_big, &to, &m),
                     KRT_CODEC_EBADMSG);
    assert_int_equal(krt_envelope_decode(wrong_version, sizeof wrong_version, &to, &m),
                     KRT_CODEC_EBADMSG);
    assert_int_equal(krt_envelope_decode(wrong_arity, sizeof wrong_arity, &to, &m),
                     KRT_CODEC_EBADMSG);
    assert_int_equal(krt_envelope_decode(body_is_str, sizeof body_is_str, &to, &m),
                     KRT_CODEC_ETYPE);
    assert_int_equal(krt_envelope_decode(type_too_big, sizeof type_too_big, &to, &m),
                     KRT_CODEC_ERANGE);
    assert_int_equal(krt_envelope_decode(NULL, 0, &to, &m), KRT_CODEC_ETRUNC);
}

/* ------------------------------------------------------------------------------------------ */
/* Hostile input                                                                              */

static void test_huge_lengths_and_counts(void **unused)
{
    krt_unpack_t u;
    const char *s;
    const void *b;
    uint32_t n;
    const uint8_t str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a', 'b'};
    krt_unpack_init(&u, str32, sizeof str32);
    assert_int_equal(krt_unpack_str(&u, &s, &n), KRT_CODEC_ETRUNC);
    const uint8_t bin32[] = {0xc6, 0x80, 0x00, 0x00, 0x00, 1};
    krt_unpack_init(&u, bin32, sizeof bin32);
    assert_int_equal(krt_unpack_bin(&u, &b, &n), KRT_CODEC_ETRUNC);
    const uint8_t ext32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
    krt_unpack_init(&u, ext32, sizeof ext32);
    assert_int_equal(krt_unpack_skip(&u), KRT_CODEC_ETRUNC);
    /* A count that the rest of the input cannot hold is malformed, not a huge loop. */
    const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0, 0xc0};
    krt_unpack_init(&u, arr32, sizeof arr32);
    assert_int_equal(krt_unpack_array(&u, &n), KRT_CODEC_EBADMSG);
    krt_unpack_init(&u, arr32, sizeof arr32);
    assert_int_equal(krt_unpack_skip(&u), KRT_CODEC_EBADMSG);
    const uint8_t map16[] = {0xde, 0x00, 0x02, 0xc0, 0xc0, 0xc0}; /* needs 4 objects */
    krt_unpack_init(&u, map16, sizeof map16);
    assert_int_equal(krt_unpack_map(&u, &n), KRT_CODEC_EBADMSG);
    const uint8_t reserved[] = {0xc1};
    krt_unpack_init(&u, reserved, 1);
    assert_int_equal(krt_unpack_peek(&u), KRT_CODEC_EBADMSG);
    const uint8_t short_hdr[] = {0xcf, 1, 2, 3};
    krt_unpack_init(&u, short_hdr, sizeof short_hdr);
    assert_int_equal(krt_unpack_skip(&u), KRT_CODEC_ETRUNC);
    assert_int_equal(krt_unpack_offset(&u), 0);

    /* Deep nesting: 200,000 one-element arrays around a nil skip without recursion. */
    size_t depth = 200000;
    uint8_t *deep = malloc(depth + 1);
    memset(deep, 0x91, depth);
    deep[depth] = 0xc0;
    krt_unpack_init(&u, deep, depth + 1);
    assert_int_equal(krt_unpack_skip(&u), 0);
    assert_int_equal(krt_unpack_finish(&u), 0);
    krt_unpack_init(&u, deep, depth);
    assert_int_equal(krt_unpack_skip(&u), KRT_CODEC_ETRUNC);
    free(deep);
}

/* A small valid document with every kind of object, for truncation and mutation. */
static krt_pack_t *s_sample_doc(void)
{
    krt_pack_t *p = krt_pack_new(0);
    krt_pack_map(p, 4);
    krt_pack_cstr(p, "id");
    krt_pack_uint(p, 70000);
    krt_pack_cstr(p, "argv");
    krt_pack_array(p, 3);
    krt_pack_cstr(p, "/bin/sh");
    krt_pack_cstr(p, "-c");
    krt_pack_str(p, "echo a long enough argument to need str8 encoding here", 55);
    krt_pack_cstr(p, "env");
    krt_pack_map(p, 2);
    krt_pack_cstr(p, "PATH");
    krt_pack_bin(p, "/usr/bin", 8);
    krt_pack_int(p, -40000);
    krt_pack_double(p, 1e300);
    krt_pack_cstr(p, "ext");
    krt_pack_ext(p, 5, "abcd", 4);
    return p;
}

/* Reads everything it can through the public API; returns 0 if the doc read cleanly. */
static int s_walk(const uint8_t *d, size_t len)
{
    krt_unpack_t u;
    krt_unpack_init(&u, d, len);
    krt_unpack_t v;
    uint64_t id;
    const char *s;
    uint32_t n, slen;
    (void)krt_unpack_map_uint(&u, "id", &id);
    if (krt_unpack_map_find(&u, "argv", &v) == 0 && krt_unpack_array(&v, &n) == 0)
        for (uint32_t i = 0; i < n && !krt_unpack_error(&v); i++)
            (void)krt_unpack_str(&v, &s, &slen);
    (void)krt_unpack_map_find(&u, "env", &v);
    krt_unpack_t w = u;
    (void)krt_unpack_peek(&w);
    (void)krt_unpack_skip(&u);
    return krt_unpack_finish(&u);
}

static void test_every_truncation(void **unused)
{
    krt_pack_t *p = s_sample_doc();
    const uint8_t *d = krt_pack_data(p);
    size_t len = krt_pack_len(p);
    assert_int_equal(s_walk(d, len), 0);
    for (size_t cut = 0; cut < len; cut++) {
        /* Copy so ASan sees the exact end of the span. */
        uint8_t *c = malloc(cut ? cut : 1);
        memcpy(c, d, cut);
        int rc = s_walk(c, cut);
        assert_true(rc == KRT_CODEC_ETRUNC || rc == KRT_CODEC_EBADMSG);
        free(c);
    }
    krt_pack_destroy(&p);
}

/* Our skip must agree with msgpack-c on where one object ends (or that it does not). Inputs
 * avoid 16/32-bit container headers, which make msgpack-c allocate count-sized arrays. */
static void s_diff_msgpack_c(const uint8_t *d, size_t len)
{
    krt_unpack_t u;
    krt_unpack_init(&u, d, len);
    int rc = krt_unpack_skip(&u);
    msgpack_unpacked m;
    msgpack_unpacked_init(&m);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&m, (const char *)d, len, &off);
    if (r == MSGPACK_UNPACK_SUCCESS) {
        assert_int_equal(rc, 0);
        assert_int_equal(krt_unpack_offset(&u), off);
    } else {
        assert_int_not_equal(rc, 0);
    }
    msgpack_unpacked_destroy(&m);
}

static void test_random_and_mutated_input(void **unused)
{
    krt_pack_t *p = s_sample_doc();
    size_t len = krt_pack_len(p);
    uint8_t *buf = malloc(len);
    int clean = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, krt_pack_data(p), len);
        int flips = 1 + (int)(s_rand() % 4);
        for (int f = 0; f < flips; f++)
            buf[s_rand() % len] = (uint8_t)s_rand();
        size_t n = len - s_rand() % 8;
        if (s_walk(buf, n) == 0)
            clean++;
        krt_addr_t to;
        krt_msg_t m;
        (void)krt_envelope_decode(buf, n, &to, &m);
        for (size_t i = 0; i < n; i++)
            if (buf[i] >= 0xdc && buf[i] <= 0xdf)
                buf[i] = 0xc0;
        s_diff_msgpack_c(buf, n);
    }
    free(buf);
    /* Purely random bytes. */
    uint8_t rnd[64] = {0};
    for (int iter = 0; iter < 50000; iter++) {
        size_t n = s_rand() % sizeof rnd;
        for (size_t i = 0; i < n; i++)
            rnd[i] = (uint8_t)s_rand();
        uint8_t *c = malloc(n ? n : 1);
        memcpy(c, rnd, n);
        s_walk(c, n);
        krt_addr_t to;
        krt_msg_t m;
        (void)krt_envelope_decode(c, n, &to, &m);
        for (size_t i = 0; i < n; i++)
            if (c[i] >= 0xdc && c[i] <= 0xdf)
                c[i] = 0x90;
        s_diff_msgpack_c(c, n);
        free(c);
    }
    /* Some mutations (e.g. inside string bytes) stay valid: the walk must have accepted them. */
    assert_true(clean > 0);
    krt_pack_destroy(&p);
}

/* ------------------------------------------------------------------------------------------ */
/* Stream framing                                                                             */

static void test_framer_byte_by_byte(void **unused)
{
    krt_pack_t *p = krt_pack_new(0);
    size_t marks[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(krt_pack_frame_begin(p, &marks[i]), 0);
        krt_pack_array(p, 2);
        krt_pack_uint(p, (uint64_t)i);
        krt_pack_str(p, "payload", (size_t)(i * 3));
        assert_int_equal(krt_pack_frame_end(p, marks[i], 0), 0);
    }
    krt_framer_t *f = krt_framer_new(0);
    assert_non_null(f);
    const uint8_t *d = krt_pack_data(p);
    int seen = 0;
    for (size_t i = 0; i < krt_pack_len(p); i++) {
        assert_int_equal(krt_framer_feed(f, d + i, 1), 0);
        const uint8_t *body;
        size_t len;
        int rc;
        while ((rc = krt_framer_next(f, &body, &len)) == 1) {
            krt_unpack_t u;
            uint32_t n;
            uint64_t idx;
            krt_unpack_init(&u, body, len);
            krt_unpack_array(&u, &n);
            krt_unpack_uint(&u, &idx);
            assert_int_equal(krt_unpack_skip(&u), 0);
            assert_int_equal(krt_unpack_finish(&u), 0);
            assert_int_equal(idx, seen);
            seen++;
        }
        assert_int_equal(rc, 0);
    }
    assert_int_equal(seen, 3);
    assert_int_equal(krt_framer_pending(f), 0);
    krt_framer_destroy(&f);
    krt_framer_destroy(&f);

    /* An announced length over the maximum poisons the stream. */
    f = krt_framer_new(16);
    const uint8_t big[] = {0, 0, 0, 17, 1, 2};
    krt_framer_feed(f, big, sizeof big);
    const uint8_t *body;
    size_t len;
    assert_int_equal(krt_framer_next(f, &body, &len), KRT_EMSGSIZE);
    assert_int_equal(krt_framer_next(f, &body, &len), KRT_EMSGSIZE);
    krt_framer_destroy(&f);
    f = krt_framer_new(0);
    const uint8_t huge[] = {0xff, 0xff, 0xff, 0xff};
    krt_framer_feed(f, huge, sizeof huge);
    assert_int_equal(krt_framer_next(f, &body, &len), KRT_EMSGSIZE);
    krt_framer_destroy(&f);

    /* frame_end refuses a body over the maximum. */
    krt_pack_reset(p);
    size_t mark;
    krt_pack_frame_begin(p, &mark);
    krt_pack_str(p, "0123456789", 10);
    assert_int_equal(krt_pack_frame_end(p, mark, 8), KRT_EMSGSIZE);
    krt_pack_destroy(&p);
}

static void test_frame_socket(void **unused)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    krt_pack_t *p = krt_pack_new(0);
    krt_msg_t m = {.type = 300, .len = 5, .from = 9, .ref = 4, .body = "hello"};
    krt_envelope_encode(p, 7, &m);
    assert_int_equal(krt_frame_write(sv[0], krt_pack_data(p), krt_pack_len(p), 0), 0);
    assert_int_equal(krt_frame_write(sv[0], NULL, 0, 0), 0);
    assert_int_equal(krt_frame_write(sv[0], krt_pack_data(p), 100, 10), KRT_EMSGSIZE);
    close(sv[0]);

    krt_framer_t *f = krt_framer_new(0);
    ssize_t r;
    while ((r = krt_framer_read_fd(f, sv[1])) > 0)
        ;
    assert_int_equal(r, 0);
    const uint8_t *body;
    size_t len;
    assert_int_equal(krt_framer_next(f, &body, &len), 1);
    krt_addr_t to;
    krt_msg_t got;
    assert_int_equal(krt_envelope_decode(body, len, &to, &got), 0);
    assert_true(to == 7);
    assert_int_equal(got.len, 5);
    assert_memory_equal(got.body, "hello", 5);
    assert_int_equal(krt_framer_next(f, &body, &len), 1);
    assert_int_equal(len, 0);
    assert_int_equal(krt_framer_next(f, &body, &len), 0);
    krt_framer_destroy(&f);
    krt_pack_destroy(&p);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integers_shortest_form),
        cmocka_unit_test(test_integer_range_and_type_errors),
        cmocka_unit_test(test_str_bin_boundaries),
        cmocka_unit_test(test_containers_and_scalars),
        cmocka_unit_test(test_writer_sticky_error),
        cmocka_unit_test(test_msgpack_c_reads_ours),
        cmocka_unit_test(test_we_read_msgpack_c),
        cmocka_unit_test(test_map_find),
        cmocka_unit_test(test_envelope),
        cmocka_unit_test(test_huge_lengths_and_counts),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_random_and_mutated_input),
        cmocka_unit_test(test_framer_byte_by_byte),
        cmocka_unit_test(test_frame_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
