/*
 * ka_frames: guest reply frames between the service layer and a bridge. One FIFO of frame
 * copies (the reader drains it at its own pace: a gRPC send in flight, an MCP call reading
 * on) and the one way to make a final frame from a status. The queue has no lock of its own:
 * its owner guards it with the lock that guards the rest of its call.
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

/* Fills f as a final frame carrying code (ka_code_t) and message (may be NULL). */
void ka_frame_final(ka_guest_reply_t *f, int code, const char *message);

#endif
