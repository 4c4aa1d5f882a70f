/*
 * ka_guestlink: one krt actor per sandbox that owns the node end of the guest channel and
 * multiplexes it: other actors (process actors, file operations) hand it requests, it encodes
 * them (guestconn), and routes every reply frame back to the actor that asked, tagged.
 *
 * Messages it accepts:
 *   KA_GL_SEND   pointer body ka_gl_req_t (made with ka_gl_req_*; ownership moves in)
 *   KA_GL_FORGET body ka_gl_forget_t: drops an owner's routes (a process actor that stops);
 *                its open output streams are cancelled in the guest
 * Messages it sends to owners:
 *   KA_GL_FRAME  pointer body ka_gl_frame_t {tag, frame}; freed after the handler unless
 *                taken with krt_msg_take (then free with ka_gl_frame_free)
 *   KA_GL_CLOSED body ka_gl_closed_t {tag}: the guest is gone; no more frames for that tag
 * The link exits (normal) when the channel closes, after telling every owner.
 * The channel fd is borrowed: it must stay open until the link has stopped.
 */
#ifndef KA_GUESTLINK_H
#define KA_GUESTLINK_H

#include "guestconn.h"
#include "krt.h"

enum {
    KA_GL_SEND = KRT_MSG_USER + 0x600,
    KA_GL_FORGET,
    KA_GL_FRAME,
    KA_GL_CLOSED,
};

typedef struct ka_gl_req ka_gl_req_t;

typedef struct ka_gl_frame {
    uint64_t tag;         /* the tag of the request this frame answers */
    ka_gp_frame_t *frame; /* owned */
} ka_gl_frame_t;

typedef struct ka_gl_closed {
    uint64_t tag;
} ka_gl_closed_t;

typedef struct ka_gl_forget {
    krt_addr_t owner;
} ka_gl_forget_t;

/* The behaviour; spawn it with the channel fd as arg: (void *)(intptr_t)fd. */
extern const krt_behaviour_t ka_guestlink_behaviour;

/* Requests (NULL on allocation failure). owner receives the frames, tagged with tag. */
ka_gl_req_t *ka_gl_req_start(krt_addr_t owner, uint64_t tag, const ka_gp_start_t *st);
ka_gl_req_t *ka_gl_req_signal(krt_addr_t owner, uint64_t tag, uint64_t proc, int sig);
ka_gl_req_t *ka_gl_req_output(krt_addr_t owner, uint64_t tag, uint64_t proc, uint64_t out_off,
                              uint64_t err_off, bool follow);
ka_gl_req_t *ka_gl_req_get(krt_addr_t owner, uint64_t tag, uint64_t proc);
/* data is copied. */
ka_gl_req_t *ka_gl_req_input(krt_addr_t owner, uint64_t tag, uint64_t proc, const void *data,
                             size_t len, bool close_after);
/* The reply frames: {"chunk"}... then {"size","end"} (guest_proto.h "read"). */
ka_gl_req_t *ka_gl_req_read(krt_addr_t owner, uint64_t tag, const char *path, uint32_t mode);
/* data (at most KA_GP_FILE_CAP bytes, else NULL) is copied. */
ka_gl_req_t *ka_gl_req_write(krt_addr_t owner, uint64_t tag, const char *path, uint32_t mode,
                             uint64_t seek, const void *data, size_t len);
void ka_gl_req_free(void *req);
/* Sets who receives the frames (for requests built before the owner exists). */
void ka_gl_req_set_owner(ka_gl_req_t *req, krt_addr_t owner);
/* Sends req to the link (ownership moves, even on failure). From inside an actor. */
int ka_gl_send(krt_ctx_t *ctx, krt_addr_t link, ka_gl_req_t *req);
void ka_gl_frame_free(void *f);

#endif
