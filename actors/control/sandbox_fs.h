/*
 * sandbox_fs: the Files API's guest calls (KA_GUEST_LIST ... KA_GUEST_WATCH) on a sandbox
 * actor's guest channel: the requests, what their frames may be, and their final frames.
 * Frames are checked by ka_guestcalls (ka_fsframes.h) before anything here reads them.
 */
#ifndef KA_SANDBOX_FS_H
#define KA_SANDBOX_FS_H

#include <stdbool.h>
#include <stddef.h>

#include "control_msgs.h"
#include "guestconn.h"
#include "ka_guestcalls.h"

/* What the guest's frames for op may be. */
ka_gc_kind_t ka_sbx_fs_kind(int op);
/* Queues q's request on gc; *gid its id. 0, or -EINVAL (a tail string that is not one
 * NUL-terminated string) / -ENOMEM. */
int ka_sbx_fs_send(ka_guestconn_t *gc, const ka_guest_req_t *q, uint64_t *gid);
/* Records on call what its frames are checked against (a listing's page token and size).
 * 0 or -ENOMEM. */
int ka_sbx_fs_track(ka_gc_call_t *call, const ka_guest_req_t *q);
/* The final reply of a successful LIST or STAT end frame f: tail a ka_fs_page_t (malloc'd,
 * caller frees; *len its size), NULL if out of memory. */
ka_guest_reply_t *ka_sbx_fs_final(const ka_gp_frame_t *f, size_t *len);

#endif
