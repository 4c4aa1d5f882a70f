/* ka_frames: a FIFO of guest frame copies and final frames (svc_frames.h). */
#include "svc_frames.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ka_frames_push(ka_frames_t *q, const ka_guest_reply_t *f, size_t len)
{
    ka_frame_t *i = malloc(offsetof(ka_frame_t, frame) + len);
    if (!i)
        return -ENOMEM;
    i->next = NULL;
    i->len = len;
    memcpy(&i->frame, f, len);
    if (q->tail)
        q->tail->next = i;
    else
        q->head = i;
    q->tail = i;
    return 0;
}

ka_frame_t *ka_frames_pop(ka_frames_t *q)
{
    ka_frame_t *i = q->head;
    if (i) {
        q->head = i->next;
        if (!q->head)
            q->tail = NULL;
        i->next = NULL;
    }
    return i;
}

bool ka_frames_empty(const ka_frames_t *q)
{
    return q->head == NULL;
}

void ka_frames_clear(ka_frames_t *q)
{
    ka_frame_t *i;
    while ((i = ka_frames_pop(q)))
        free(i);
}

void ka_frame_final(ka_guest_reply_t *f, int code, const char *message)
{
    memset(f, 0, sizeof *f);
    f->final = 1;
    f->status.code = code;
    snprintf(f->status.message, sizeof f->status.message, "%s", message ? message : "");
}
