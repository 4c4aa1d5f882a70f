/* kb_api_stream: a guest stream forwarded to a gRPC server stream (see api_stream.h). */
#include "api_stream.h"
#include "svc_frames.h"

#include <pthread.h>
#include <stdlib.h>

struct kb_api_stream {
    pthread_mutex_t lock;
    ka_service_t *svc;
    kb_grpc_call_t *call;
    const kb_api_stream_ops_t *ops;
    krt_addr_t stream; /* KRT_ADDR_NONE until the start returned */
    ka_frames_t queue;
    bool sending;
    uint64_t in_flight; /* data bytes of the send in flight (credit once it is done) */
    bool gone;          /* the client went away: drop frames, wait for the final frame */
    bool cancel_wanted;
    bool final_seen;
    ka_frame_end_t final;
    bool answered; /* the end was decided (the call was or is being finished) */
};

/* kb_grpc_call_on_free: the call's last callback has returned. */
static void s_free(void *arg)
{
    kb_api_stream_t *s = arg;
    ka_frames_clear(&s->queue);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Releases s->lock; then finishes the call if end (decided under it). */
static void s_unlock(kb_api_stream_t *s, bool end)
{
    kb_grpc_call_t *call = s->call;
    ka_frame_end_t e = {0};
    if (end)
        e = s->final;
    pthread_mutex_unlock(&s->lock);
    if (end)
        kb_grpc_finish(call, kb_api_code(ka_err_code(e.err)), e.message);
}

static void s_on_sent(kb_grpc_call_t *call, int status, void *arg);

/* Sends the next queued frame; asks the guest to stop once the client is gone. Called with
 * s->lock held; returns true when the call's end is decided (s_unlock sends it). */
static bool s_pump(kb_api_stream_t *s)
{
    while (!s->sending && !s->gone && !ka_frames_empty(&s->queue)) {
        ka_frame_t *i = ka_frames_pop(&s->queue);
        s->sending = true;
        s->in_flight = i->frame.final ? 0 : i->frame.tail_len;
        if (s->ops->send(s->call, &i->frame, s_on_sent, s)) {
            s->sending = false;
            s->gone = true;
        }
        free(i);
    }
    if (s->gone && !s->final_seen && !s->cancel_wanted) {
        s->cancel_wanted = true;
        if (s->stream)
            ka_svc_stream_cancel(s->svc, s->stream);
    }
    if (s->answered || s->sending || !s->final_seen || (!s->gone && !ka_frames_empty(&s->queue)))
        return false;
    s->answered = true;
    return true;
}

static void s_on_sent(kb_grpc_call_t *call, int status, void *arg)
{
    kb_api_stream_t *s = arg;
    pthread_mutex_lock(&s->lock);
    s->sending = false;
    if (status)
        s->gone = true;
    else if (s->in_flight && s->stream)
        ka_svc_stream_ack(s->svc, s->stream, s->in_flight);
    s->in_flight = 0;
    s_unlock(s, s_pump(s));
}

static void s_on_cancel(kb_grpc_call_t *call, void *arg)
{
    kb_api_stream_t *s = arg;
    pthread_mutex_lock(&s->lock);
    s->gone = true;
    s_unlock(s, s_pump(s));
}

void kb_api_stream_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    kb_api_stream_t *s = user;
    pthread_mutex_lock(&s->lock);
    if (!s->gone && s->ops->keep(f) && ka_frames_push(&s->queue, f, len))
        s->gone = true;
    if (f->final) {
        s->final_seen = true;
        ka_frame_end(&s->final, f, len);
        if (s->gone && !s->final.err)
            s->final.err = -ECANCELED;
    }
    s_unlock(s, s_pump(s));
}

void kb_api_stream_open(kb_api_t *api, kb_grpc_call_t *call, const kb_api_stream_ops_t *ops,
                        kb_api_stream_start_fn start, void *arg)
{
    kb_api_stream_t *s = calloc(1, sizeof *s);
    if (!s) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->svc = api->o.svc;
    s->call = call;
    s->ops = ops;
    kb_grpc_call_on_free(call, s_free, s);
    kb_grpc_call_on_cancel(call, s_on_cancel, s);
    /* frames wait on the lock until the stream's address is recorded */
    pthread_mutex_lock(&s->lock);
    krt_addr_t stream = KRT_ADDR_NONE;
    ka_svc_status_t st = start(s, arg, &stream);
    if (st.err) {
        s->answered = true;
        pthread_mutex_unlock(&s->lock);
        kb_api_fail_err(call, &st);
        return;
    }
    s->stream = stream;
    bool cancel = s->cancel_wanted && !s->final_seen;
    pthread_mutex_unlock(&s->lock); /* s may be freed from here on (the call may be finished) */
    if (cancel)
        ka_svc_stream_cancel(api->o.svc, stream);
}
