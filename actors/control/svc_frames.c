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

size_t ka_frame_set_failure(ka_guest_reply_t *f, int err, const char *message)
{
    const char *text = message ? message : "";
    size_t n = strnlen(text, KA_MSG_LEN - 1);
    f->err = ka_err_canonical(err);
    memcpy(f->tail, text, n);
    f->tail[n] = '\0';
    f->tail_len = (uint32_t)(n + 1);
    return sizeof *f + f->tail_len;
}

size_t ka_frame_final(ka_frame_fail_t *f, int err, const char *message)
{
    memset(f, 0, sizeof *f);
    f->frame.final = 1;
    return ka_frame_set_failure(&f->frame, err, message);
}

const char *ka_frame_message(const ka_guest_reply_t *f, size_t len)
{
    bool text =
        f->err && f->tail_len && len >= sizeof *f + f->tail_len && f->tail[f->tail_len - 1] == '\0';
    return text ? f->tail : "";
}

void ka_frame_end(ka_frame_end_t *end, const ka_guest_reply_t *f, size_t len)
{
    end->err = f->err;
    snprintf(end->message, sizeof end->message, "%s", ka_frame_message(f, len));
}
