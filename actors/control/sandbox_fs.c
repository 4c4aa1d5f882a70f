/* sandbox_fs: the Files API's guest calls (see sandbox_fs.h). */
#include "sandbox_fs.h"
#include "ka_fsframes.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* True for KA_GUEST_LIST ... KA_GUEST_WATCH. */
static bool s_fs_op(int op)
{
    return op >= KA_GUEST_LIST && op <= KA_GUEST_WATCH;
}

ka_gc_kind_t ka_sbx_fs_kind(int op)
{
    switch (op) {
    case KA_GUEST_LIST:
        return KA_GC_LIST;
    case KA_GUEST_STAT:
        return KA_GC_STAT;
    case KA_GUEST_WATCH:
        return KA_GC_WATCH;
    default:
        return KA_GC_UNARY;
    }
}

/* q's tail as one string: "" when empty, NULL when it is not one NUL-terminated string. */
static const char *s_tail_str(const ka_guest_req_t *q)
{
    if (q->tail_len == 0)
        return "";
    return memchr(q->tail, 0, q->tail_len) == q->tail + q->tail_len - 1 ? q->tail : NULL;
}

int ka_sbx_fs_send(ka_guestconn_t *gc, const ka_guest_req_t *q, uint64_t *gid)
{
    static const char *const ops[] = {"list", "stat", "remove", "mkdir", "move", "watch"};
    const char *tail = s_tail_str(q);
    if (!s_fs_op(q->op) || !tail)
        return -EINVAL;
    ka_gp_fs_t r = {
        .op = ops[q->op - KA_GUEST_LIST],
        .path = q->path,
        .to = tail,
        .after = tail,
        .limit = q->page_size ? q->page_size : KA_GP_PAGE_DEF,
        .flag = q->fs_flag != 0,
        .mode = q->mode,
        .window = KA_GP_WATCH_WINDOW,
    };
    return ka_guestconn_fs(gc, &r, gid);
}

int ka_sbx_fs_track(ka_gc_call_t *call, const ka_guest_req_t *q)
{
    if (q->op != KA_GUEST_LIST)
        return 0;
    call->limit = q->page_size ? q->page_size : KA_GP_PAGE_DEF;
    const char *tail = s_tail_str(q);
    if (tail && tail[0] && !(call->after = strdup(tail)))
        return -ENOMEM;
    return 0;
}

ka_guest_reply_t *ka_sbx_fs_final(const ka_gp_frame_t *f, size_t *len)
{
    size_t plen = 0;
    ka_fs_page_t *pg = ka_fsf_page(ka_gp_frame_map(f), &plen);
    ka_guest_reply_t *r = pg ? calloc(1, sizeof *r + plen) : NULL;
    if (r) {
        r->final = 1;
        r->tail_len = (uint32_t)plen;
        memcpy(r->tail, pg, plen);
        *len = sizeof *r + plen;
    }
    free(pg);
    return r;
}
