/*
 * ka_frames: guest reply frames between the service layer and a bridge. One FIFO of frame
 * copies (the reader drains it at its own pace: a gRPC send in flight, an MCP call reading
 * on), the one way to make a failing frame, and the one way to read a frame's failure. The queue
 * has no lock of its own: its owner guards it with the lock that guards the rest of its call.
 */
#ifndef KA_SVC_FRAMES_H
#define KA_SVC_FRAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "control_msgs.h"

typedef struct ka_frame ka_frame_t;
struct ka_frame {
    ka_frame_t *next;
    size_t len;                         /* bytes of frame, its tail included */
    _Alignas(8) ka_guest_reply_t frame; /* followed by its tail */
};

typedef struct {
    ka_frame_t *head, *tail;
} ka_frames_t;

/* Appends a copy of f (len bytes). 0 or -ENOMEM. */
int ka_frames_push(ka_frames_t *q, const ka_guest_reply_t *f, size_t len);
/* The oldest frame (owned by the caller: free()), or NULL when empty. */
ka_frame_t *ka_frames_pop(ka_frames_t *q);
bool ka_frames_empty(const ka_frames_t *q);
/* Frees every frame. */
void ka_frames_clear(ka_frames_t *q);

/* Room for a final frame that fails a call: the frame and its message (the tail). */
typedef union ka_frame_fail {
    ka_guest_reply_t frame;
    char bytes[sizeof(ka_guest_reply_t) + KA_MSG_LEN];
} ka_frame_fail_t;

/* Fills f as a final frame of the failure err (a negative errno; stored canonical) and message
 * (NULL: "", cut to KA_MSG_LEN - 1 bytes). Returns the frame's length to send. */
size_t ka_frame_final(ka_frame_fail_t *f, int err, const char *message);
/* Makes f (with room for KA_MSG_LEN tail bytes) a failing frame: err as above, message as its
 * tail. Returns the frame's length. */
size_t ka_frame_set_failure(ka_guest_reply_t *f, int err, const char *message);
/* The message of failing frame f (len bytes, its tail included): borrowed from f; "" when f did
 * not fail or its tail is not a string. */
const char *ka_frame_message(const ka_guest_reply_t *f, size_t len);

/* A final frame's outcome as a reader keeps it once the frame is gone. */
typedef struct ka_frame_end {
    int err;                  /* 0 or the frame's negative errno */
    char message[KA_MSG_LEN]; /* "" when err is 0 */
} ka_frame_end_t;

/* Fills end from frame f (len bytes). */
void ka_frame_end(ka_frame_end_t *end, const ka_guest_reply_t *f, size_t len);

#endif
