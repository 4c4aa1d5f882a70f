/*
 * Mesh frames (private to runtime/, and the fuzz target): one ZeroMQ message from one node to
 * another carrying a batch of envelopes (krt_codec.h), so a scheduler turn's sends to a peer
 * cost one write.
 *
 *   [magic 'K' 'F'][version 1][flags 0][source incarnation u64 BE][destination incarnation
 *   u64 BE] then, repeated to the end: [envelope length u32 BE][envelope]
 *
 * The source incarnation tells a restarted peer from its previous life; the destination one
 * (0: not known yet) lets a restarted receiver drop frames meant for its previous life.
 */
#ifndef KRT_MESH_FRAME_H
#define KRT_MESH_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define KRT_MFRAME_HEADER  20
#define KRT_MFRAME_VERSION 1
#define KRT_MFRAME_LEN     4 /* the length before each envelope */

/* Writes the header into d (KRT_MFRAME_HEADER bytes). */
void krt_mframe_header(uint8_t *d, uint64_t src_inc, uint64_t dst_inc);
/* Writes one envelope's length prefix. */
void krt_mframe_len(uint8_t *d, uint32_t len);

typedef struct krt_mframe {
    const uint8_t *p, *end;
    uint64_t src_inc, dst_inc;
} krt_mframe_t;

/* Starts reading a frame: 0, or KRT_CODEC_EBADMSG (short, wrong magic or version). */
int krt_mframe_open(krt_mframe_t *f, const void *data, size_t len);
/* The next envelope: 1 and *env / *len (borrowed from the frame), 0 at the end, or
 * KRT_CODEC_ETRUNC when a length runs past the end (the rest is unusable). An empty envelope
 * (length 0) is returned as such: the envelope decoder refuses it. */
int krt_mframe_next(krt_mframe_t *f, const uint8_t **env, size_t *len);

#endif /* KRT_MESH_FRAME_H */
