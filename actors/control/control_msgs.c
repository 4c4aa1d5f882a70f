/* control_msgs: the control actors' error replies, sent and read in one place. */
#include "control_msgs.h"

#include <stdarg.h>

#include "svc_frames.h"

bool ka_reply_unanswered(int err)
{
    return err == KRT_ENOACTOR || err == KRT_ENOCONN || err == KRT_EREMOTE ||
           err == KRT_ESHUTDOWN || err == KRT_ETIMEDOUT;
}

int ka_err_unanswered(int err)
{
    return err == KRT_ETIMEDOUT ? KA_ETIMEOUT : KA_EUNAVAIL;
}

int ka_reply_fail(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int err, const char *message)
{
    if (err >= 0 || ka_reply_unanswered(err))
        err = ka_err_unanswered(err);
    return krt_reply_error_to(ctx, to, ref, err, message ? message : "");
}

int ka_guest_fail(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int err, const char *message)
{
    ka_frame_fail_t f;
    size_t len = ka_frame_final(&f, err, message);
    return ref ? krt_reply_to(ctx, to, ref, KA_SBX_GUEST, &f, len)
               : krt_send(ctx, to, KA_SBX_GUEST_FRAME, &f, len);
}

void ka_fail(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int err, const char *fmt,
             ...)
{
    char why[KA_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (type == KA_SBX_GUEST)
        ka_guest_fail(ctx, to, ref, err, why);
    else
        ka_reply_fail(ctx, to, ref, err, why);
}

int ka_reply_outcome(int err, const krt_msg_t *msg, size_t size, const char **why)
{
    const char *text = NULL;
    if (err && !ka_reply_unanswered(err)) { /* the actor's error reply */
        text = "";
        if (msg && msg->type == KRT_MSG_ERROR && msg->len &&
            ((const char *)msg->body)[msg->len - 1] == '\0')
            text = msg->body;
    } else if (!err && (!msg || msg->len < size)) {
        err = -EIO;
        text = "the control plane sent a short reply";
    }
    if (why)
        *why = text;
    return err;
}
