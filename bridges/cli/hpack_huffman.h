/*
 * kb_huff: decoding of HPACK's static Huffman code (RFC 7541 5.2, Appendix B), for the CLI's
 * HTTP/2 client. The tables are derived once per decoder by kb_huff_init (no global state).
 */
#ifndef KB_HPACK_HUFFMAN_H
#define KB_HPACK_HUFFMAN_H

#include <stddef.h>
#include <stdint.h>

#define KB_HUFF_SYMBOLS  257 /* 256 octets and EOS */
#define KB_HUFF_MAX_BITS 30

/* Canonical decoding tables: per code length, its first code, how many codes and where its
 * symbols start in sym (ordered by length, then value). */
typedef struct kb_huff {
    uint32_t first[KB_HUFF_MAX_BITS + 1];
    uint16_t count[KB_HUFF_MAX_BITS + 1];
    uint16_t offset[KB_HUFF_MAX_BITS + 1];
    uint16_t sym[KB_HUFF_SYMBOLS];
} kb_huff_t;

void kb_huff_init(kb_huff_t *h);
/* Decodes n bytes into out (at most cap bytes; n * 8 / 5 always suffices). 0 with *out_len set,
 * or -EBADMSG for EOS inside the string, bad padding or output longer than cap. */
int kb_huff_decode(const kb_huff_t *h, const uint8_t *in, size_t n, char *out, size_t cap,
                   size_t *out_len);

#endif
