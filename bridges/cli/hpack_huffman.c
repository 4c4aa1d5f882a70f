/*
 * kb_huff: the HPACK Huffman code (RFC 7541 Appendix B) decoder. See hpack_huffman.h.
 *
 * The code is canonical (codes of one length are consecutive and ordered by symbol, each length
 * continuing where the shorter one ended), so the table below (the RFC's "len in bits" column)
 * is all it takes: kb_huff_init derives, per length, the first code and the symbols in order.
 */
#include "hpack_huffman.h"

#include <errno.h>

#define S_EOS 256

static const uint8_t s_len[KB_HUFF_SYMBOLS] = {
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6,  10, 10, 12, 13, 6,  8,  11, 10, 10, 8,  11, 8,  6,  6,  6,
    5,  5,  5,  6,  6,  6,  6,  6,  6,  6,  7,  8,  15, 6,  12, 10, 13, 6,  7,  7,  7,  7,  7,  7,
    7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  7,  8,  7,  8,  13, 19, 13, 14, 6,
    15, 5,  6,  5,  6,  5,  6,  6,  6,  5,  7,  7,  6,  6,  6,  5,  6,  7,  6,  5,  5,  6,  7,  7,
    7,  7,  7,  15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20, 22, 22, 23, 23, 21,
    23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24,
    21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
};

void kb_huff_init(kb_huff_t *h)
{
    uint16_t count[KB_HUFF_MAX_BITS + 1] = {0};
    for (int s = 0; s < KB_HUFF_SYMBOLS; s++)
        count[s_len[s]]++;
    uint32_t code = 0;
    uint16_t at = 0;
    for (int l = 1; l <= KB_HUFF_MAX_BITS; l++) {
        h->first[l] = code;
        h->count[l] = count[l];
        h->offset[l] = at;
        for (int s = 0; s < KB_HUFF_SYMBOLS; s++)
            if (s_len[s] == l)
                h->sym[at++] = (uint16_t)s;
        code = (code + count[l]) << 1;
    }
}

int kb_huff_decode(const kb_huff_t *h, const uint8_t *in, size_t n, char *out, size_t cap,
                   size_t *out_len)
{
    uint32_t code = 0;
    int len = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        for (int b = 7; b >= 0; b--) {
            code = (code << 1) | ((in[i] >> b) & 1u);
            len++;
            if (code - h->first[len] < h->count[len]) {
                uint16_t s = h->sym[h->offset[len] + (code - h->first[len])];
                if (s == S_EOS || o == cap)
                    return -EBADMSG; /* EOS inside a string is an error (5.2) */
                out[o++] = (char)s;
                code = 0;
                len = 0;
            } else if (len == KB_HUFF_MAX_BITS) {
                return -EBADMSG;
            }
        }
    }
    /* Padding: fewer than 8 bits, all ones (the most significant bits of EOS). */
    if (len > 7 || code != (1u << len) - 1)
        return -EBADMSG;
    *out_len = o;
    return 0;
}
