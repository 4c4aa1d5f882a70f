/*
 * krt_codec: msgpack for message bodies that cross a process boundary (the mesh between
 * nodes, the node <-> sandbox guest protocol).
 *
 * - krt_pack_t: a writer appending msgpack objects to a growable buffer (always the shortest
 *   encoding). Errors are sticky: after the first failure every call returns it and the
 *   buffer no longer grows, so a sequence of writes can be checked once at the end.
 * - krt_unpack_t: a reader over a borrowed byte span. Every read is bounds-checked; malformed,
 *   truncated or hostile input (huge lengths, huge counts, reserved bytes) yields an error,
 *   never a read outside the span. Errors are sticky too: the first one is kept and every
 *   later read returns it. Strings and bins are returned as borrowed pointers into the span.
 * - Envelopes: a krt_msg_t plus its destination as one msgpack frame
 *   [2, to, from, type, ref, kind, err, bin body].
 * - Stream framing: 4-byte big-endian length, then that many bytes (a msgpack body), with a
 *   maximum frame size, for stream sockets (the guest protocol over a unix socket).
 *
 * Error codes (negative, errno-style; krt_codec_strerror names them):
 *   KRT_CODEC_ETRUNC  the input ends inside an object (truncated frame)
 *   KRT_CODEC_EBADMSG malformed: reserved byte 0xc1, a count larger than the input could hold,
 *                     trailing bytes, a bad envelope
 *   KRT_CODEC_ETYPE   the next object is not of the type asked for
 *   KRT_CODEC_ERANGE  an integer does not fit the requested C type
 *   KRT_CODEC_ENOENT  a map has no such key
 *   KRT_ENOMEM, KRT_EMSGSIZE (writer, framing)
 */
#ifndef KRT_CODEC_H
#define KRT_CODEC_H

#include "krt.h"

#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRT_CODEC_ETRUNC  (-ENODATA)
#define KRT_CODEC_EBADMSG (-EBADMSG)
#define KRT_CODEC_ETYPE   (-EPROTOTYPE)
#define KRT_CODEC_ERANGE  (-ERANGE)
#define KRT_CODEC_ENOENT  (-ENOENT)

/* Describes a codec error (or any negative errno). Static string. */
const char *krt_codec_strerror(int err);

/* Kinds of msgpack objects, as krt_unpack_peek reports them. */
typedef enum {
    KRT_MP_NIL = 1,
    KRT_MP_BOOL,
    KRT_MP_UINT,  /* a non-negative integer (any encoding) */
    KRT_MP_INT,   /* a negative integer */
    KRT_MP_FLOAT, /* float32 or float64 */
    KRT_MP_STR,
    KRT_MP_BIN,
    KRT_MP_ARRAY,
    KRT_MP_MAP,
    KRT_MP_EXT
} krt_mp_type_t;

/* ------------------------------------------------------------------------------------------ */
/* Writer                                                                                     */

typedef struct krt_pack krt_pack_t;

/* A writer with room for cap_hint bytes (0 = a small default). NULL on failure. */
krt_pack_t *krt_pack_new(size_t cap_hint);
/* Frees the writer and its buffer. Idempotent; NULLs *p_p. */
void krt_pack_destroy(krt_pack_t **p_p);
/* Empties the buffer (keeps its memory) and clears the sticky error. */
void krt_pack_reset(krt_pack_t *p);
/* The first error since new/reset, or 0. */
int krt_pack_error(const krt_pack_t *p);
/* The encoded bytes so far: borrowed, valid until the next write, reset or destroy. */
const uint8_t *krt_pack_data(const krt_pack_t *p);
size_t krt_pack_len(const krt_pack_t *p);
/* Hands the buffer to the caller (free() it); the writer is left empty and usable. NULL if
 * the writer is in error. */
uint8_t *krt_pack_take(krt_pack_t *p, size_t *len);

/* Each appends one object; 0 or the sticky error (KRT_ENOMEM, KRT_EMSGSIZE). */
int krt_pack_nil(krt_pack_t *p);
int krt_pack_bool(krt_pack_t *p, bool v);
int krt_pack_int(krt_pack_t *p, int64_t v);   /* shortest encoding; >= 0 encodes as uint */
int krt_pack_uint(krt_pack_t *p, uint64_t v); /* shortest encoding */
int krt_pack_double(krt_pack_t *p, double v); /* always float64 */
int krt_pack_str(krt_pack_t *p, const char *s, size_t len); /* len <= UINT32_MAX */
int krt_pack_cstr(krt_pack_t *p, const char *s);            /* NUL-terminated; NULL packs nil */
int krt_pack_bin(krt_pack_t *p, const void *data, size_t len);
int krt_pack_ext(krt_pack_t *p, int8_t type, const void *data, size_t len);
/* Container headers: the next n objects (array) or n key/value pairs (map) belong to it. */
int krt_pack_array(krt_pack_t *p, uint32_t n);
int krt_pack_map(krt_pack_t *p, uint32_t n);

/* ------------------------------------------------------------------------------------------ */
/* Reader                                                                                     */

/*
 * A reader: a plain struct so it can live on the stack and be copied (a copy is an
 * independent cursor over the same span). Fields are private; use the functions.
 */
typedef struct krt_unpack {
    const uint8_t *start_; /* first byte of the span */
    const uint8_t *p_;     /* next unread byte */
    const uint8_t *end_;   /* one past the last byte */
    int err_;              /* sticky error, 0 if none */
} krt_unpack_t;

/* Starts reading len bytes at data (borrowed: must outlive the reader and what it returns). */
void krt_unpack_init(krt_unpack_t *u, const void *data, size_t len);
/* The sticky error, or 0. */
int krt_unpack_error(const krt_unpack_t *u);
/* The offset of the next byte (where an error happened). */
size_t krt_unpack_offset(const krt_unpack_t *u);
/* 0 if no error and every byte was read, else the error (KRT_CODEC_EBADMSG for leftovers). */
int krt_unpack_finish(krt_unpack_t *u);

/* The kind of the next object without consuming it (> 0), or a negative error. */
int krt_unpack_peek(krt_unpack_t *u);

/* Typed reads: each consumes one object and returns 0, or fails (sticky) and consumes
 * nothing. Out-pointers are written only on success. */
int krt_unpack_nil(krt_unpack_t *u);
int krt_unpack_bool(krt_unpack_t *u, bool *v);
int krt_unpack_int(krt_unpack_t *u, int64_t *v);   /* any integer that fits int64_t */
int krt_unpack_uint(krt_unpack_t *u, uint64_t *v); /* any non-negative integer */
int krt_unpack_double(krt_unpack_t *u, double *v); /* float32 or float64 */
/* *s points into the span and is NOT NUL-terminated. */
int krt_unpack_str(krt_unpack_t *u, const char **s, uint32_t *len);
int krt_unpack_bin(krt_unpack_t *u, const void **data, uint32_t *len);
int krt_unpack_ext(krt_unpack_t *u, int8_t *type, const void **data, uint32_t *len);
/* Container headers. *n is checked against the bytes left (each element needs at least one
 * byte), so a caller may allocate n elements without trusting the input further. */
int krt_unpack_array(krt_unpack_t *u, uint32_t *n);
int krt_unpack_map(krt_unpack_t *u, uint32_t *n);
/* Skips one whole object, nested containers included (iterative, any depth). */
int krt_unpack_skip(krt_unpack_t *u);
/* Copies a string into buf as a C string (cap includes the NUL). KRT_EMSGSIZE if too long. */
int krt_unpack_cstr(krt_unpack_t *u, char *buf, size_t cap);

/*
 * Map lookup by key name. u must be positioned at a map; it is not moved (the map is scanned
 * on a copy). On success *val is a reader positioned at the value of the first entry whose
 * key is the string `key`. Returns 0, KRT_CODEC_ENOENT, or a decoding error (also stored
 * in u, except ENOENT).
 */
int krt_unpack_map_find(krt_unpack_t *u, const char *key, krt_unpack_t *val);
/* Shorthands: find key, then read its value as the type. */
int krt_unpack_map_uint(krt_unpack_t *u, const char *key, uint64_t *v);
int krt_unpack_map_int(krt_unpack_t *u, const char *key, int64_t *v);
int krt_unpack_map_bool(krt_unpack_t *u, const char *key, bool *v);
int krt_unpack_map_double(krt_unpack_t *u, const char *key, double *v);
int krt_unpack_map_str(krt_unpack_t *u, const char *key, const char **s, uint32_t *len);
int krt_unpack_map_bin(krt_unpack_t *u, const char *key, const void **data, uint32_t *len);

/* ------------------------------------------------------------------------------------------ */
/* Envelopes: one message bound for `to`, as [2, to, from, type, ref, kind, err, bin body]. */

#define KRT_ENVELOPE_VERSION 2
/* err is the negated status of a reply (0 = success); only replies carry one. Larger values
 * than this are refused as malformed. */
#define KRT_ENVELOPE_MAX_ERR 4095
/* The most bytes an envelope adds around its body. */
#define KRT_ENVELOPE_OVERHEAD 48

/* Appends the envelope of msg (msg->len body bytes) to p. */
int krt_envelope_encode(krt_pack_t *p, krt_addr_t to, const krt_msg_t *msg);
/* Writes it into buf (cap >= msg->len + KRT_ENVELOPE_OVERHEAD always suffices); *out_len
 * receives the size. KRT_EMSGSIZE if cap is too small. */
int krt_envelope_encode_buf(void *buf, size_t cap, krt_addr_t to, const krt_msg_t *msg,
                            size_t *out_len);
/* Decodes exactly one envelope spanning all len bytes. msg->body points into data (NULL if
 * the body is empty). Errors: KRT_CODEC_ETRUNC, KRT_CODEC_EBADMSG, KRT_CODEC_ETYPE, ... */
int krt_envelope_decode(const void *data, size_t len, krt_addr_t *to, krt_msg_t *msg);

/* ------------------------------------------------------------------------------------------ */
/* Stream framing: [4-byte big-endian length][length bytes].                                  */

#define KRT_FRAME_HEADER  4
#define KRT_FRAME_MAX_DEF (16u << 20) /* default maximum frame body: 16 MiB */

/* Starts a frame in p: reserves the header and stores its offset in *mark. */
int krt_pack_frame_begin(krt_pack_t *p, size_t *mark);
/* Ends the frame started at mark: writes the body length into its header. KRT_EMSGSIZE if
 * the body exceeds max (0 = KRT_FRAME_MAX_DEF). */
int krt_pack_frame_end(krt_pack_t *p, size_t mark, uint32_t max);

/* Writes one frame (header + body) to a blocking fd, retrying short writes and EINTR.
 * 0, KRT_EMSGSIZE (len > max, 0 = default), or -errno. */
int krt_frame_write(int fd, const void *body, size_t len, uint32_t max);

/* Reassembles frames from a byte stream. */
typedef struct krt_framer krt_framer_t;

/* A framer accepting bodies up to max bytes (0 = KRT_FRAME_MAX_DEF). NULL on failure. */
krt_framer_t *krt_framer_new(uint32_t max);
void krt_framer_destroy(krt_framer_t **f_p);
/* Appends received bytes (copied). 0 or KRT_ENOMEM. */
int krt_framer_feed(krt_framer_t *f, const void *data, size_t len);
/* One read(2) from fd into the framer: bytes read (> 0), 0 at end of stream, or -errno
 * (-EAGAIN on a non-blocking fd with nothing to read). */
ssize_t krt_framer_read_fd(krt_framer_t *f, int fd);
/* Next complete frame: 1 and *body, *len (borrowed until the next framer call), 0 if more
 * bytes are needed, KRT_EMSGSIZE if the announced length exceeds max (the stream is then
 * unusable: close it). */
int krt_framer_next(krt_framer_t *f, const uint8_t **body, size_t *len);
/* Bytes buffered but not yet returned as frames. */
size_t krt_framer_pending(const krt_framer_t *f);

#ifdef __cplusplus
}
#endif
#endif /* KRT_CODEC_H */
