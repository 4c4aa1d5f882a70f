/*
 * kb_hpack: HPACK (RFC 7541) for the CLI's HTTP/2 client. The decoder is complete (static and
 * dynamic table, table size updates, Huffman strings): the server is gRPC core and uses all of
 * it. The encoder writes literal fields without indexing and without Huffman coding, which
 * every decoder accepts and which leaves the server's table for us untouched.
 */
#ifndef KB_HPACK_H
#define KB_HPACK_H

#include <stddef.h>
#include <stdint.h>

#include "hpack_huffman.h"

#define KB_HPACK_TABLE_SIZE  4096 /* our SETTINGS_HEADER_TABLE_SIZE (the protocol default) */
#define KB_HPACK_ENTRY_EXTRA 32   /* per-entry overhead counted by the protocol (4.1) */
#define KB_HPACK_MAX_ENTRIES (KB_HPACK_TABLE_SIZE / KB_HPACK_ENTRY_EXTRA)

/* Called once per decoded field, in order; name and value are not NUL-terminated and valid
 * only during the call. A non-zero return stops decoding and is returned by kb_hpack_decode. */
typedef int (*kb_hpack_field_fn)(void *user, const char *name, size_t name_len, const char *value,
                                 size_t value_len);

/* One connection's decoding context: the dynamic table lives as long as the connection. */
typedef struct kb_hpack_dec {
    struct kb_hpack_entry {
        char *data; /* name then value, one allocation */
        uint32_t name_len;
        uint32_t value_len;
    } ring[KB_HPACK_MAX_ENTRIES]; /* newest at head, older following (mod the ring size) */
    size_t head;
    size_t count;
    size_t size;     /* sum of entry sizes (4.1) */
    size_t max_size; /* the limit the encoder set with a size update, <= KB_HPACK_TABLE_SIZE */
    char *scratch;   /* decoded strings of the current field */
    size_t scratch_cap;
    kb_huff_t huff;
} kb_hpack_dec_t;

void kb_hpack_dec_init(kb_hpack_dec_t *d);
/* Frees the dynamic table and scratch; the context may be initialised again. */
void kb_hpack_dec_fini(kb_hpack_dec_t *d);
/* Decodes one complete header block. 0; -EBADMSG for a malformed block (bad index, integer or
 * string, Huffman error, size update too large or not at the start); -ENOMEM; or the callback's
 * non-zero value. After an error other than the callback's the context is unusable (a
 * connection error: COMPRESSION_ERROR). */
int kb_hpack_decode(kb_hpack_dec_t *d, const uint8_t *block, size_t len, kb_hpack_field_fn fn,
                    void *user);

/* Appends one field as a literal without indexing (new name, no Huffman) at out[*at..cap).
 * 0, or -ENOSPC (nothing written past *at). */
int kb_hpack_encode(uint8_t *out, size_t cap, size_t *at, const char *name, const char *value);

#endif
