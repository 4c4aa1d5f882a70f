/*
 * fuzz_h2: what a server (or anything on the CLI's --api-url) sends the kagent CLI: bytes fed
 * to its HTTP/2 session (bridges/cli/h2.c, and through it the HPACK decoder with Huffman and
 * the dynamic table), with a stream open the way a gRPC call has one, then the same bytes as
 * one HPACK header block to a fresh decoder.
 *
 * Input: byte 0 picks where the bytes are cut: the first part is fed on stream 1 (in pieces of
 * byte 1 + 1 bytes), then stream 1 is closed and stream 3 opened for the rest, so frames for
 * closed streams are reached too. The session's state must stay sane: data never beyond what
 * was fed, the send room never negative.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "h2.h"
#include "hpack.h"

static int s_field(void *user, const char *name, size_t nl, const char *value, size_t vl)
{
    size_t *total = user;
    if ((nl && !name) || (vl && !value))
        abort();
    *total += nl + vl;
    return 0;
}

static void s_feed(kb_h2_t *h, const uint8_t *p, size_t n, size_t piece, size_t total)
{
    for (size_t at = 0; at < n; at += piece) {
        if (kb_h2_feed(h, p + at, n - at < piece ? n - at : piece) != 0)
            return;
        kb_h2_stream_t *st = kb_h2_stream(h);
        if (st->data_len > total)
            abort();
        if (st->data_len)
            kb_h2_take(h, st->data_len / 2 + 1);
        size_t out;
        kb_h2_out(h, &out);
        kb_h2_sent(h, out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t cut = 2 + (size - 2) * data[0] / 255, piece = (size_t)data[1] + 1;
    kb_h2_t *h = kb_h2_new();
    if (!h)
        return 0;
    static const kb_h2_header_t hd[] = {{":method", "POST"}, {":path", "/p.S/M"}};
    if (kb_h2_open(h, hd, 2, false) == 0) {
        static const uint8_t msg[100];
        size_t room = kb_h2_send_room(h);
        kb_h2_data(h, msg, room < sizeof msg ? room : sizeof msg, false);
    }
    s_feed(h, data + 2, cut - 2, piece, size);
    kb_h2_close_stream(h, KB_H2_CANCEL);
    if (kb_h2_open(h, hd, 2, true) == 0)
        s_feed(h, data + cut, size - cut, piece, size);
    kb_h2_destroy(&h);

    kb_hpack_dec_t d;
    kb_hpack_dec_init(&d);
    size_t total = 0;
    kb_hpack_decode(&d, data, size, s_field, &total);
    if (d.size > d.max_size || d.count > KB_HPACK_MAX_ENTRIES)
        abort();
    kb_hpack_dec_fini(&d);
    return 0;
}
