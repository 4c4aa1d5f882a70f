/* Unit tests for the CLI's HTTP/2 client pieces (bridges/cli): the HPACK decoder against every
 * example of RFC 7541 Appendix C (with and without Huffman, dynamic table and evictions), its
 * refusals of malformed blocks, the encoder, and the kb_h2 session: settings, pings, a whole
 * gRPC exchange fed in any split, flow control both ways, and a connection or stream error for
 * each bad frame a server could send. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h2.h"
#include "hpack.h"
#include "hpack_huffman.h"

/* ------------------------------------------------------------------------------------------ */
/* HPACK                                                                                      */

#define MAX_FIELDS 16

typedef struct {
    int n;
    char text[MAX_FIELDS][160]; /* "name: value" */
    size_t value_len[MAX_FIELDS];
} fields_t;

static int s_collect(void *user, const char *name, size_t nl, const char *value, size_t vl)
{
    fields_t *f = user;
    assert_true(f->n < MAX_FIELDS);
    f->value_len[f->n] = vl;
    snprintf(f->text[f->n++], sizeof f->text[0], "%.*s: %.*s", (int)nl, name, (int)vl, value);
    return 0;
}

static size_t s_unhex(const char *hex, uint8_t *out)
{
    size_t n = 0;
    for (; hex[0] && hex[1]; hex += 2) {
        unsigned b;
        sscanf(hex, "%2x", &b);
        out[n++] = (uint8_t)b;
    }
    return n;
}

/* Decodes one hex block and checks the fields (NULL-terminated list) and the table size. */
static void s_expect_block(kb_hpack_dec_t *d, const char *hex, size_t table_size, ...)
{
    uint8_t block[512];
    size_t n = s_unhex(hex, block);
    fields_t f = {0};
    assert_int_equal(kb_hpack_decode(d, block, n, s_collect, &f), 0);
    va_list ap;
    va_start(ap, table_size);
    int i = 0;
    for (const char *want; (want = va_arg(ap, const char *)); i++) {
        assert_true(i < f.n);
        assert_string_equal(f.text[i], want);
    }
    va_end(ap);
    assert_int_equal(f.n, i);
    assert_int_equal(d->size, table_size);
}

static int s_decode_hex(const char *hex)
{
    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    uint8_t block[512];
    size_t n = s_unhex(hex, block);
    fields_t f = {0};
    int rc = kb_hpack_decode(&d, block, n, s_collect, &f);
    kb_hpack_dec_fini(&d);
    return rc;
}

static void test_hpack_c2_single_fields(void **state)
{
    (void)state;
    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    s_expect_block(&d, "400a637573746f6d2d6b65790d637573746f6d2d686561646572", 55,
                   "custom-key: custom-header", NULL); /* C.2.1 */
    kb_hpack_dec_fini(&d);
    kb_hpack_dec_init(&d);
    s_expect_block(&d, "040c2f73616d706c652f70617468", 0, ":path: /sample/path", NULL); /* C.2.2 */
    s_expect_block(&d, "100870617373776f726406736563726574", 0, "password: secret",
                   NULL);                              /* C.2.3 */
    s_expect_block(&d, "82", 0, ":method: GET", NULL); /* C.2.4 */
    kb_hpack_dec_fini(&d);
}

/* C.3 (plain) and C.4 (Huffman): three requests on one connection. */
static void s_requests(const char *const blocks[3])
{
    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    s_expect_block(&d, blocks[0], 57, ":method: GET", ":scheme: http", ":path: /",
                   ":authority: www.example.com", NULL);
    s_expect_block(&d, blocks[1], 110, ":method: GET", ":scheme: http", ":path: /",
                   ":authority: www.example.com", "cache-control: no-cache", NULL);
    s_expect_block(&d, blocks[2], 164, ":method: GET", ":scheme: https", ":path: /index.html",
                   ":authority: www.example.com", "custom-key: custom-value", NULL);
    assert_int_equal(d.count, 3);
    kb_hpack_dec_fini(&d);
}

static void test_hpack_c3_c4_requests(void **state)
{
    (void)state;
    static const char *const plain[3] = {
        "828684410f7777772e6578616d706c652e636f6d", "828684be58086e6f2d6361636865",
        "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565"};
    static const char *const huff[3] = {"828684418cf1e3c2e5f23a6ba0ab90f4ff",
                                        "828684be5886a8eb10649cbf",
                                        "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"};
    s_requests(plain);
    s_requests(huff);
}

/* C.5 (plain) and C.6 (Huffman): three responses with a 256-byte table, evicting. The RFC's
 * decoder has SETTINGS_HEADER_TABLE_SIZE 256; ours is 4096, so the first block opens with a
 * size update to 256 (3fe101), which exercises that too. */
static void s_responses(const char *const blocks[3])
{
    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    char first[512];
    snprintf(first, sizeof first, "3fe101%s", blocks[0]);
    s_expect_block(&d, first, 222, ":status: 302", "cache-control: private",
                   "date: Mon, 21 Oct 2013 20:13:21 GMT", "location: https://www.example.com",
                   NULL);
    assert_int_equal(d.count, 4);
    s_expect_block(&d, blocks[1], 222, ":status: 307", "cache-control: private",
                   "date: Mon, 21 Oct 2013 20:13:21 GMT", "location: https://www.example.com",
                   NULL);
    assert_int_equal(d.count, 4); /* ":status: 302" was evicted */
    s_expect_block(&d, blocks[2], 215, ":status: 200", "cache-control: private",
                   "date: Mon, 21 Oct 2013 20:13:22 GMT", "location: https://www.example.com",
                   "content-encoding: gzip",
                   "set-cookie: foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1", NULL);
    assert_int_equal(d.count, 3);
    kb_hpack_dec_fini(&d);
}

static void test_hpack_c5_c6_responses(void **state)
{
    (void)state;
    static const char *const plain[3] = {
        "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a3231"
        "20474d546e1768747470733a2f2f7777772e6578616d706c652e636f6d",
        "4803333037c1c0bf",
        "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738"
        "666f6f3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d33"
        "3630303b2076657273696f6e3d31"};
    static const char *const huff[3] = {
        "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad17"
        "1863c78f0b97c8e9ae82ae43d3",
        "4883640effc1c0bf",
        "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7"
        "b335dfdfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007"};
    s_responses(plain);
    s_responses(huff);
}

static void test_hpack_refuses_malformed(void **state)
{
    (void)state;
    assert_int_equal(s_decode_hex("80"), -EBADMSG);           /* index 0 */
    assert_int_equal(s_decode_hex("be"), -EBADMSG);           /* index 62, table empty */
    assert_int_equal(s_decode_hex("ff"), -EBADMSG);           /* integer cut off */
    assert_int_equal(s_decode_hex("ffffffffff0f"), -EBADMSG); /* integer too large */
    assert_int_equal(s_decode_hex("400a6375"), -EBADMSG);     /* string past the block */
    assert_int_equal(s_decode_hex("40"), -EBADMSG);           /* no name */
    assert_int_equal(s_decode_hex("8220"), -EBADMSG);         /* size update after a field */
    assert_int_equal(s_decode_hex("3fe21f"), -EBADMSG);       /* size update above 4096 */
    assert_int_equal(s_decode_hex("3fe11f"), 0);              /* 4096 itself is fine */
    /* h2spec: a Huffman string holding EOS */
    assert_int_equal(s_decode_hex("0085f2b24a84ff874951fffffffa7f"), -EBADMSG);
    assert_int_equal(s_decode_hex("0081180161"), -EBADMSG);   /* padding of zeros */
    assert_int_equal(s_decode_hex("00821fff0161"), -EBADMSG); /* padding of 8+ bits */
    assert_int_equal(s_decode_hex("00811f0161"), 0);          /* "a": 00011 + 111 */
}

static void test_huffman_lengths(void **state)
{
    (void)state;
    kb_huff_t h;
    kb_huff_init(&h);
    /* 5-bit codes 0..9 are '0' '1' '2' 'a' 'c' 'e' 'i' 'o' 's' 't' (Appendix B) */
    assert_int_equal(h.count[5], 10);
    assert_int_equal(h.sym[h.offset[5] + 3], 'a');
    assert_int_equal(h.count[30], 4); /* 10, 13, 22 and EOS */
    char out[32];
    size_t n;
    uint8_t www[] = {0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff};
    assert_int_equal(kb_huff_decode(&h, www, sizeof www, out, sizeof out, &n), 0);
    assert_int_equal(n, 15);
    assert_memory_equal(out, "www.example.com", 15);
    assert_int_equal(kb_huff_decode(&h, www, sizeof www, out, 14, &n), -EBADMSG);
}

static void test_hpack_encoder_round_trip(void **state)
{
    (void)state;
    char long_value[300];
    memset(long_value, 'v', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    uint8_t block[1024];
    size_t at = 0;
    assert_int_equal(kb_hpack_encode(block, sizeof block, &at, ":path", "/a.B/C"), 0);
    assert_int_equal(kb_hpack_encode(block, sizeof block, &at, "x-long", long_value), 0);
    assert_int_equal(kb_hpack_encode(block, sizeof block, &at, "empty", ""), 0);
    uint8_t tiny[100];
    size_t small = 0;
    assert_int_equal(kb_hpack_encode(tiny, sizeof tiny, &small, "x-long", long_value), -ENOSPC);
    assert_int_equal(small, 0);
    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    fields_t f = {0};
    assert_int_equal(kb_hpack_decode(&d, block, at, s_collect, &f), 0);
    assert_int_equal(f.n, 3);
    assert_string_equal(f.text[0], ":path: /a.B/C");
    assert_int_equal(f.value_len[1], 299); /* a length of two integer octets */
    assert_int_equal(strncmp(f.text[1], "x-long: vvvv", 12), 0);
    assert_string_equal(f.text[2], "empty: ");
    assert_int_equal(d.count, 0); /* literals without indexing leave the table alone */
    kb_hpack_dec_fini(&d);
}

/* ------------------------------------------------------------------------------------------ */
/* kb_h2                                                                                      */

enum { DATA, HEADERS, PRIORITY, RST, SETTINGS, PUSH, PING, GOAWAY, WINDOW, CONT };

typedef struct {
    uint8_t b[70000];
    size_t n;
} wire_t;

static void s_put(wire_t *w, uint8_t type, uint8_t flags, uint32_t sid, const void *p, size_t n)
{
    uint8_t hd[9] = {
        (uint8_t)(n >> 16),   (uint8_t)(n >> 8),    (uint8_t)n,          type,        flags,
        (uint8_t)(sid >> 24), (uint8_t)(sid >> 16), (uint8_t)(sid >> 8), (uint8_t)sid};
    memcpy(w->b + w->n, hd, 9);
    if (n)
        memcpy(w->b + w->n + 9, p, n);
    w->n += 9 + n;
}

static void s_put_u32(wire_t *w, uint8_t type, uint32_t sid, uint32_t v)
{
    uint8_t p[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    s_put(w, type, 0, sid, p, 4);
}

/* A header block of name/value pairs (NULL-terminated). */
static size_t s_block(uint8_t *out, size_t cap, ...)
{
    va_list ap;
    va_start(ap, cap);
    size_t at = 0;
    for (const char *name; (name = va_arg(ap, const char *));)
        assert_int_equal(kb_hpack_encode(out, cap, &at, name, va_arg(ap, const char *)), 0);
    va_end(ap);
    return at;
}

/* The frames the session queued (after the preface, if not yet consumed), then consumed. */
typedef struct {
    int n;
    uint8_t type[32];
    uint8_t flags[32];
    uint32_t sid[32];
    uint8_t payload[32][16];
    size_t len[32];
} sent_t;

static sent_t s_sent(kb_h2_t *h)
{
    sent_t s = {0};
    size_t n;
    const uint8_t *p = kb_h2_out(h, &n);
    size_t at = 0;
    if (n >= 24 && memcmp(p, "PRI * HTTP/2.0", 14) == 0)
        at = 24;
    while (at + 9 <= n && s.n < 32) {
        size_t len = (size_t)p[at] << 16 | (size_t)p[at + 1] << 8 | p[at + 2];
        s.type[s.n] = p[at + 3];
        s.flags[s.n] = p[at + 4];
        s.sid[s.n] = (uint32_t)p[at + 5] << 24 | (uint32_t)p[at + 6] << 16 |
                     (uint32_t)p[at + 7] << 8 | p[at + 8];
        memcpy(s.payload[s.n], p + at + 9, len < 16 ? len : 16);
        s.len[s.n++] = len;
        at += 9 + len;
    }
    assert_int_equal(at, n);
    kb_h2_sent(h, n);
    return s;
}

static int s_find(const sent_t *s, uint8_t type)
{
    for (int i = s->n - 1; i >= 0; i--)
        if (s->type[i] == type)
            return i;
    return -1;
}

static uint32_t s_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A session past the handshake with one stream open (id 1). */
static kb_h2_t *s_session(uint32_t server_window)
{
    kb_h2_t *h = kb_h2_new();
    assert_non_null(h);
    sent_t s = s_sent(h);
    assert_int_equal(s.type[0], SETTINGS);
    assert_int_equal(s.type[1], WINDOW);
    wire_t w = {.n = 0};
    uint8_t set[6] = {0,
                      4,
                      (uint8_t)(server_window >> 24),
                      (uint8_t)(server_window >> 16),
                      (uint8_t)(server_window >> 8),
                      (uint8_t)server_window};
    s_put(&w, SETTINGS, 0, 0, set, sizeof set);
    assert_int_equal(kb_h2_feed(h, w.b, w.n), 0);
    s = s_sent(h);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.type[0], SETTINGS);
    assert_int_equal(s.flags[0], 1); /* ACK */
    kb_h2_header_t hd[] = {{":method", "POST"}, {":path", "/x.Y/Z"}};
    assert_int_equal(kb_h2_open(h, hd, 2, false), 0);
    assert_int_equal(kb_h2_open(h, hd, 2, false), -EBUSY);
    s = s_sent(h);
    assert_int_equal(s.type[0], HEADERS);
    assert_int_equal(s.flags[0], 4); /* END_HEADERS */
    assert_int_equal(s.sid[0], 1);
    return h;
}

static void test_h2_grpc_exchange_any_split(void **state)
{
    (void)state;
    wire_t w = {.n = 0};
    uint8_t hb[256];
    size_t n = s_block(hb, sizeof hb, ":status", "200", "content-type", "application/grpc", NULL);
    s_put(&w, HEADERS, 4, 1, hb, n);
    uint8_t msg[] = {0, 0, 0, 0, 3, 'a', 'b', 'c'};
    s_put(&w, DATA, 0, 1, msg, sizeof msg);
    uint8_t ping[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    s_put(&w, PING, 0, 0, ping, 8);
    /* trailers split over HEADERS + CONTINUATION */
    n = s_block(hb, sizeof hb, "grpc-status", "5", "grpc-message", "no%20such%zzthing%", NULL);
    s_put(&w, HEADERS, 1, 1, hb, 4);
    s_put(&w, CONT, 4, 1, hb + 4, n - 4);
    for (size_t split = 1; split <= w.n; split += 7) {
        kb_h2_t *h = s_session(65535);
        for (size_t at = 0; at < w.n; at += split)
            assert_int_equal(kb_h2_feed(h, w.b + at, at + split < w.n ? split : w.n - at), 0);
        kb_h2_stream_t *st = kb_h2_stream(h);
        assert_true(st->got_headers && st->got_trailers && st->remote_closed && !st->reset);
        assert_int_equal(st->http_status, 200);
        assert_true(st->grpc_content_type);
        assert_int_equal(st->grpc_status, 5);
        assert_string_equal(st->grpc_message, "no such%zzthing%");
        assert_int_equal(st->data_len, sizeof msg);
        assert_memory_equal(st->data, msg, sizeof msg);
        kb_h2_take(h, 5);
        assert_int_equal(st->data_len, 3);
        sent_t s = s_sent(h);
        int i = s_find(&s, PING);
        assert_true(i >= 0);
        assert_int_equal(s.flags[i], 1);
        assert_memory_equal(s.payload[i], ping, 8);
        kb_h2_close_stream(h, KB_H2_CANCEL);
        s = s_sent(h); /* our side was still open: RST_STREAM */
        assert_int_equal(s.n, 1);
        assert_int_equal(s.type[0], RST);
        kb_h2_destroy(&h);
        assert_null(h);
    }
}

static void test_h2_flow_control(void **state)
{
    (void)state;
    kb_h2_t *h = s_session(10);
    assert_int_equal(kb_h2_send_room(h), 10);
    uint8_t big[40000] = {0};
    assert_int_equal(kb_h2_data(h, big, 11, false), -EPIPE);
    assert_int_equal(kb_h2_data(h, big, 10, false), 0);
    assert_int_equal(kb_h2_send_room(h), 0);
    wire_t w = {.n = 0};
    s_put_u32(&w, WINDOW, 1, 40000);
    s_put_u32(&w, WINDOW, 0, 100000);
    assert_int_equal(kb_h2_feed(h, w.b, w.n), 0);
    assert_int_equal(kb_h2_send_room(h), 40000); /* the stream's window is the lower */
    s_sent(h);
    assert_int_equal(kb_h2_data(h, big, 40000, true), 0); /* split at 16384 */
    sent_t s = s_sent(h);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.len[0], 16384);
    assert_int_equal(s.len[2], 40000 - 2 * 16384);
    assert_int_equal(s.flags[0], 0);
    assert_int_equal(s.flags[2], 1); /* END_STREAM on the last */
    assert_int_equal(kb_h2_data(h, big, 0, true), -EPIPE);
    /* receiving: past a quarter of our window, credit goes back */
    wire_t r = {.n = 0};
    uint8_t hb[64];
    size_t n = s_block(hb, sizeof hb, ":status", "200", NULL);
    s_put(&r, HEADERS, 4, 1, hb, n);
    assert_int_equal(kb_h2_feed(h, r.b, r.n), 0);
    static uint8_t chunk[16384 + 9];
    size_t got = 0;
    int updates = 0;
    while (got < KB_H2_WINDOW / 2) {
        r.n = 0;
        s_put(&r, DATA, 0, 1, chunk, 16384);
        assert_int_equal(kb_h2_feed(h, r.b, r.n), 0);
        got += 16384;
        kb_h2_take(h, kb_h2_stream(h)->data_len);
        s = s_sent(h);
        updates += s.n;
    }
    assert_int_equal(updates, 4); /* stream and connection, twice */
    kb_h2_destroy(&h);
}

/* Feeds one frame to a fresh session with a stream open; returns kb_h2_feed's result and the
 * code of the GOAWAY (or RST_STREAM) it queued in *code (-1 if none). */
static int s_bad(const wire_t *w, int *goaway, int *rst)
{
    kb_h2_t *h = s_session(65535);
    int rc = kb_h2_feed(h, w->b, w->n);
    sent_t s = s_sent(h);
    int g = s_find(&s, GOAWAY), r = s_find(&s, RST);
    *goaway = g >= 0 ? (int)s_u32(s.payload[g] + 4) : -1;
    *rst = r >= 0 ? (int)s_u32(s.payload[r]) : -1;
    if (rc)
        assert_true(kb_h2_error(h)[0] != '\0');
    kb_h2_destroy(&h);
    return rc;
}

static void test_h2_bad_frames(void **state)
{
    (void)state;
    uint8_t hb[64], z[16] = {0};
    size_t hn = s_block(hb, sizeof hb, ":status", "200", NULL);
    struct {
        const char *what;
        int type, flags;
        uint32_t sid;
        const uint8_t *p;
        size_t n;
        int rc, goaway, rst;
    } cases[] = {
        {"DATA on stream 0", DATA, 0, 0, z, 4, -EPROTO, 1, -1},
        {"DATA on an idle stream", DATA, 0, 3, z, 4, -EPROTO, 1, -1},
        {"DATA before headers", DATA, 0, 1, z, 4, 0, -1, 1},
        {"DATA padding too long", DATA, 8, 1, (const uint8_t *)"\x05xx", 3, -EPROTO, 1, -1},
        {"HEADERS on stream 0", HEADERS, 4, 0, hb, hn, -EPROTO, 1, -1},
        {"HEADERS on an even stream", HEADERS, 4, 2, hb, hn, -EPROTO, 1, -1},
        {"HPACK garbage", HEADERS, 4, 1, (const uint8_t *)"\x80", 1, -EPROTO, 9, -1},
        {"CONTINUATION alone", CONT, 4, 1, hb, hn, -EPROTO, 1, -1},
        {"PUSH_PROMISE", PUSH, 4, 1, z, 8, -EPROTO, 1, -1},
        {"PING of 7 bytes", PING, 0, 0, z, 7, -EPROTO, 6, -1},
        {"PING on a stream", PING, 0, 1, z, 8, -EPROTO, 1, -1},
        {"SETTINGS of 5 bytes", SETTINGS, 0, 0, z, 5, -EPROTO, 6, -1},
        {"SETTINGS ACK with payload", SETTINGS, 1, 0, z, 6, -EPROTO, 6, -1},
        {"SETTINGS on a stream", SETTINGS, 0, 1, z, 6, -EPROTO, 1, -1},
        {"push enabled", SETTINGS, 0, 0, (const uint8_t *)"\0\x02\0\0\0\x01", 6, -EPROTO, 1, -1},
        {"window too large", SETTINGS, 0, 0, (const uint8_t *)"\0\x04\x80\0\0\0", 6, -EPROTO, 3,
         -1},
        {"frame size too small", SETTINGS, 0, 0, (const uint8_t *)"\0\x05\0\0\x10\0", 6, -EPROTO, 1,
         -1},
        {"WINDOW_UPDATE of 0", WINDOW, 0, 0, z, 4, -EPROTO, 1, -1},
        {"WINDOW_UPDATE of 0 on the stream", WINDOW, 0, 1, z, 4, 0, -1, 1},
        {"connection window overflow", WINDOW, 0, 0, (const uint8_t *)"\x7f\xff\xff\xff", 4,
         -EPROTO, 3, -1},
        {"stream window overflow", WINDOW, 0, 1, (const uint8_t *)"\x7f\xff\xff\xff", 4, 0, -1, 3},
        {"WINDOW_UPDATE of 3 bytes", WINDOW, 0, 0, z, 3, -EPROTO, 6, -1},
        {"RST_STREAM on stream 0", RST, 0, 0, z, 4, -EPROTO, 1, -1},
        {"RST_STREAM of 5 bytes", RST, 0, 1, z, 5, -EPROTO, 6, -1},
        {"GOAWAY of 4 bytes", GOAWAY, 0, 0, z, 4, -EPROTO, 6, -1},
        {"PRIORITY of 4 bytes", PRIORITY, 0, 1, z, 4, -EPROTO, 6, -1},
        {"unknown type is ignored", 0x42, 0, 1, z, 4, 0, -1, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        wire_t w = {.n = 0};
        s_put(&w, (uint8_t)cases[i].type, (uint8_t)cases[i].flags, cases[i].sid, cases[i].p,
              cases[i].n);
        int goaway, rst;
        int rc = s_bad(&w, &goaway, &rst);
        if (rc != cases[i].rc || goaway != cases[i].goaway || rst != cases[i].rst)
            fail_msg("%s: rc %d goaway %d rst %d", cases[i].what, rc, goaway, rst);
    }
    /* a frame above our SETTINGS_MAX_FRAME_SIZE */
    static wire_t w;
    w.n = 0;
    static uint8_t big[16385];
    s_put(&w, DATA, 0, 1, big, sizeof big);
    int goaway, rst;
    assert_int_equal(s_bad(&w, &goaway, &rst), -EPROTO);
    assert_int_equal(goaway, 6);
    /* a header block interrupted by another frame */
    w.n = 0;
    s_put(&w, HEADERS, 0, 1, hb, hn);
    s_put(&w, PING, 0, 0, z, 8);
    assert_int_equal(s_bad(&w, &goaway, &rst), -EPROTO);
    /* trailers without END_STREAM: a stream error */
    w.n = 0;
    s_put(&w, HEADERS, 4, 1, hb, hn);
    s_put(&w, HEADERS, 4, 1, hb, hn);
    assert_int_equal(s_bad(&w, &goaway, &rst), 0);
    assert_int_equal(rst, 1);
    /* response headers without :status */
    w.n = 0;
    size_t n2 = s_block(big, sizeof big, "content-type", "application/grpc", NULL);
    s_put(&w, HEADERS, 5, 1, big, n2);
    assert_int_equal(s_bad(&w, &goaway, &rst), 0);
    assert_int_equal(rst, 1);
}

static void test_h2_not_http2_and_goaway(void **state)
{
    (void)state;
    /* a TLS alert (what a TLS port answers to cleartext) is not a SETTINGS frame */
    kb_h2_t *h = kb_h2_new();
    s_sent(h);
    const uint8_t alert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32, 0, 0};
    assert_int_equal(kb_h2_feed(h, alert, sizeof alert), -EPROTONOSUPPORT);
    assert_int_equal(kb_h2_feed(h, alert, sizeof alert), -EPROTO); /* nothing more accepted */
    kb_h2_header_t hd[] = {{":method", "POST"}};
    assert_int_equal(kb_h2_open(h, hd, 1, true), -EPIPE);
    kb_h2_destroy(&h);

    /* GOAWAY naming an earlier stream: ours was not processed */
    h = s_session(65535);
    wire_t w = {.n = 0};
    uint8_t ga[] = {0, 0, 0, 0, 0, 0, 0, 0, 'b', 'y', 'e'};
    s_put(&w, GOAWAY, 0, 0, ga, sizeof ga);
    assert_int_equal(kb_h2_feed(h, w.b, w.n), 0);
    uint32_t last, code;
    assert_true(kb_h2_goaway(h, &last, &code));
    assert_int_equal(last, 0);
    kb_h2_stream_t *st = kb_h2_stream(h);
    assert_true(st->reset);
    assert_int_equal(st->reset_code, KB_H2_REFUSED_STREAM);
    assert_non_null(strstr(st->error, "going away"));
    kb_h2_close_stream(h, KB_H2_CANCEL);
    assert_int_equal(kb_h2_open(h, hd, 1, true), -EPIPE);
    kb_h2_destroy(&h);

    /* RST_STREAM from the server ends the stream with its code; later frames on it are
     * dropped (but counted against the connection window) */
    h = s_session(65535);
    w.n = 0;
    s_put_u32(&w, RST, 1, KB_H2_CANCEL);
    uint8_t z[4] = {0};
    s_put(&w, DATA, 0, 1, z, 4);
    assert_int_equal(kb_h2_feed(h, w.b, w.n), 0);
    assert_true(kb_h2_stream(h)->reset);
    assert_int_equal(kb_h2_stream(h)->reset_code, KB_H2_CANCEL);
    assert_int_equal(kb_h2_stream(h)->data_len, 0);
    kb_h2_close_stream(h, KB_H2_CANCEL);
    assert_int_equal(s_sent(h).n, 0); /* already reset: nothing to send */
    kb_h2_destroy(&h);
}

static void test_h2_cancel_sends_rst(void **state)
{
    (void)state;
    kb_h2_t *h = s_session(65535);
    kb_h2_close_stream(h, KB_H2_CANCEL);
    sent_t s = s_sent(h);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.type[0], RST);
    assert_int_equal(s_u32(s.payload[0]), KB_H2_CANCEL);
    /* the next stream is 3; frames for 1 are now ignored, HEADERS still decoded */
    kb_h2_header_t hd[] = {{":method", "POST"}};
    assert_int_equal(kb_h2_open(h, hd, 1, true), 0);
    assert_int_equal(kb_h2_stream(h)->id, 3);
    wire_t w = {.n = 0};
    uint8_t hb[64];
    size_t n = s_block(hb, sizeof hb, ":status", "200", NULL);
    s_put(&w, HEADERS, 5, 1, hb, n);
    assert_int_equal(kb_h2_feed(h, w.b, w.n), 0);
    assert_false(kb_h2_stream(h)->got_headers);
    kb_h2_destroy(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hpack_c2_single_fields),
        cmocka_unit_test(test_hpack_c3_c4_requests),
        cmocka_unit_test(test_hpack_c5_c6_responses),
        cmocka_unit_test(test_hpack_refuses_malformed),
        cmocka_unit_test(test_huffman_lengths),
        cmocka_unit_test(test_hpack_encoder_round_trip),
        cmocka_unit_test(test_h2_grpc_exchange_any_split),
        cmocka_unit_test(test_h2_flow_control),
        cmocka_unit_test(test_h2_bad_frames),
        cmocka_unit_test(test_h2_not_http2_and_goaway),
        cmocka_unit_test(test_h2_cancel_sends_rst),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
