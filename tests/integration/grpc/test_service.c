/* kbt_service: kbtest.TestService for the gRPC bridge tests. See test_service.h. */
#include "test_service.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kbtest.pb-c.h"

typedef void (*s_job_fn)(void *arg, bool discard);

typedef struct s_job {
    struct s_job *next;
    int64_t due_ms;
    s_job_fn fn;
    void *arg;
} s_job_t;

struct kbt_service {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    s_job_t *jobs; /* sorted by due_ms */
    bool stop;
    uint64_t handler_cancels;
    kb_grpc_server_t *srv;
};

static int64_t s_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs fn(arg) on the worker thread after delay_ms. */
static void s_later(kbt_service_t *svc, int delay_ms, s_job_fn fn, void *arg)
{
    s_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        fn(arg, false);
        return;
    }
    j->due_ms = s_now_ms() + delay_ms;
    j->fn = fn;
    j->arg = arg;
    pthread_mutex_lock(&svc->mu);
    s_job_t **pp = &svc->jobs;
    while (*pp && (*pp)->due_ms <= j->due_ms)
        pp = &(*pp)->next;
    j->next = *pp;
    *pp = j;
    pthread_cond_signal(&svc->cv);
    pthread_mutex_unlock(&svc->mu);
}

static void *s_worker(void *arg)
{
    kbt_service_t *svc = arg;
    pthread_mutex_lock(&svc->mu);
    while (!svc->stop) {
        if (!svc->jobs) {
            pthread_cond_wait(&svc->cv, &svc->mu);
            continue;
        }
        int64_t wait = svc->jobs->due_ms - s_now_ms();
        if (wait > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += wait / 1000;
            ts.tv_nsec += (wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&svc->cv, &svc->mu, &ts);
            continue;
        }
        s_job_t *j = svc->jobs;
        svc->jobs = j->next;
        pthread_mutex_unlock(&svc->mu);
        j->fn(j->arg, false);
        free(j);
        pthread_mutex_lock(&svc->mu);
    }
    pthread_mutex_unlock(&svc->mu);
    return NULL;
}

static void s_count_cancel(kbt_service_t *svc)
{
    pthread_mutex_lock(&svc->mu);
    svc->handler_cancels++;
    pthread_mutex_unlock(&svc->mu);
}

/* ---------- Echo ---------- */

typedef struct {
    kb_grpc_call_t *call;
    char *text;
} s_echo_t;

static void s_echo_job(void *arg, bool discard)
{
    s_echo_t *e = arg;
    Kbtest__EchoReply r = KBTEST__ECHO_REPLY__INIT;
    r.text = e->text;
    kb_grpc_reply(e->call, &r.base);
    free(e->text);
    free(e);
}

static void s_echo(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Kbtest__EchoRequest *req = (const Kbtest__EchoRequest *)msg;
    if (req->delay_ms == 0 && !req->from_thread) {
        Kbtest__EchoReply r = KBTEST__ECHO_REPLY__INIT;
        r.text = req->text;
        kb_grpc_reply(call, &r.base);
        return;
    }
    s_echo_t *e = calloc(1, sizeof *e);
    if (!e || !(e->text = strdup(req->text))) {
        free(e);
        kb_grpc_fail(call, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    e->call = call;
    s_later(user, req->delay_ms, s_echo_job, e);
}

/* ---------- Meta ---------- */

static void s_meta(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Kbtest__MetaRequest *req = (const Kbtest__MetaRequest *)msg;
    size_t n = kb_grpc_call_metadata_count(call, req->key);
    char **vals = calloc(n ? n : 1, sizeof *vals);
    for (size_t i = 0; vals && i < n; i++) {
        const char *v;
        size_t len;
        kb_grpc_call_metadata_at(call, req->key, i, &v, &len);
        vals[i] = strndup(v, len);
    }
    Kbtest__MetaReply r = KBTEST__META_REPLY__INIT;
    r.n_values = vals ? n : 0;
    r.values = vals;
    r.timeout_ms = kb_grpc_call_timeout_ms(call);
    char *one = NULL;
    r.one_error = kb_grpc_call_metadata_one(call, req->key, &one);
    r.one = one ? one : "";
    kb_grpc_reply(call, &r.base);
    for (size_t i = 0; vals && i < n; i++)
        free(vals[i]);
    free(vals);
    free(one);
}

/* ---------- Count (server streaming, every send from the worker thread) ---------- */

typedef struct {
    kbt_service_t *svc;
    kb_grpc_call_t *call;
    int n, next;
    uint8_t *pad;
    size_t pad_len;
} s_count_t;

static void s_count_job(void *arg, bool discard);

static void s_count_sent(kb_grpc_call_t *call, int status, void *arg)
{
    s_count_t *c = arg;
    if (status < 0) {
        s_count_cancel(c->svc);
        kb_grpc_finish(c->call, KB_GRPC_CANCELLED, "client went away");
        free(c->pad);
        free(c);
        return;
    }
    s_later(c->svc, 0, s_count_job, c);
}

static void s_count_job(void *arg, bool discard)
{
    s_count_t *c = arg;
    int rc = -ECANCELED;
    if (c->next < c->n) {
        Kbtest__CountReply r = KBTEST__COUNT_REPLY__INIT;
        r.seq = c->next++;
        r.pad.data = c->pad;
        r.pad.len = c->pad_len;
        rc = kb_grpc_stream_send(c->call, &r.base, s_count_sent, c);
        if (rc == 0)
            return;
        s_count_cancel(c->svc);
        kb_grpc_finish(c->call, KB_GRPC_CANCELLED, "client went away");
    } else {
        kb_grpc_finish(c->call, KB_GRPC_OK, NULL);
    }
    free(c->pad);
    free(c);
}

static void s_count(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Kbtest__CountRequest *req = (const Kbtest__CountRequest *)msg;
    if (req->n < 0 || req->pad_bytes < 0 || req->pad_bytes > (1 << 20)) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, "n and pad_bytes must be in range");
        return;
    }
    s_count_t *c = calloc(1, sizeof *c);
    if (c)
        c->pad = calloc(1, (size_t)req->pad_bytes + 1);
    if (!c || !c->pad) {
        free(c);
        kb_grpc_fail(call, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    memset(c->pad, 'x', (size_t)req->pad_bytes);
    c->svc = user;
    c->call = call;
    c->n = req->n;
    c->pad_len = (size_t)req->pad_bytes;
    s_later(user, 0, s_count_job, c);
}

/* ---------- Upload (client streaming) ---------- */

typedef struct {
    kbt_service_t *svc;
    kb_grpc_call_t *call;
    uint64_t total;
    uint32_t chunks;
    uint32_t crc;
} s_upload_t;

/* CRC-32 (IEEE 802.3, reflected), the same as zlib's crc32(). */
static uint32_t s_crc_table[256];

static void s_crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        s_crc_table[i] = c;
    }
}

static void s_upload_start(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    s_upload_t *u = calloc(1, sizeof *u);
    if (!u) {
        kb_grpc_fail(call, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    u->svc = user;
    u->call = call;
    u->crc = 0xFFFFFFFFu;
    kb_grpc_call_set_data(call, u);
}

static void s_upload_msg(kb_grpc_call_t *call, ProtobufCMessage *msg, void *user)
{
    s_upload_t *u = kb_grpc_call_data(call);
    const Kbtest__Chunk *ch = (const Kbtest__Chunk *)msg;
    if (u) {
        uint32_t c = u->crc;
        for (size_t i = 0; i < ch->data.len; i++)
            c = s_crc_table[(c ^ ch->data.data[i]) & 0xff] ^ (c >> 8);
        u->crc = c;
        u->total += ch->data.len;
        u->chunks++;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
}

static void s_upload_job(void *arg, bool discard)
{
    s_upload_t *u = arg;
    Kbtest__UploadReply r = KBTEST__UPLOAD_REPLY__INIT;
    r.total_bytes = u->total;
    r.chunks = u->chunks;
    r.crc32 = u->crc ^ 0xFFFFFFFFu;
    kb_grpc_reply(u->call, &r.base);
    free(u);
}

static void s_upload_end(kb_grpc_call_t *call, int status, void *user)
{
    s_upload_t *u = kb_grpc_call_data(call);
    if (!u)
        return;
    if (status < 0) {
        if (status == -ECANCELED)
            s_count_cancel(u->svc);
        kb_grpc_fail(call, KB_GRPC_CANCELLED, "upload interrupted");
        free(u);
        return;
    }
    s_later(u->svc, 0, s_upload_job, u); /* reply from the worker thread */
}

/* ---------- Sleep (cancellable) ---------- */

typedef struct {
    kbt_service_t *svc;
    kb_grpc_call_t *call;
    pthread_mutex_t mu;
    int refs;
    bool done;
} s_sleep_t;

static void s_sleep_unref(s_sleep_t *s)
{
    pthread_mutex_lock(&s->mu);
    int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left == 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
}

/* Completes once: the first of timer and cancellation wins. */
static bool s_sleep_claim(s_sleep_t *s)
{
    pthread_mutex_lock(&s->mu);
    bool first = !s->done;
    s->done = true;
    pthread_mutex_unlock(&s->mu);
    return first;
}

static void s_sleep_job(void *arg, bool discard)
{
    s_sleep_t *s = arg;
    if (s_sleep_claim(s)) {
        Kbtest__Empty r = KBTEST__EMPTY__INIT;
        kb_grpc_reply(s->call, &r.base);
    }
    s_sleep_unref(s);
}

static void s_sleep_cancel(kb_grpc_call_t *call, void *arg)
{
    s_sleep_t *s = arg;
    s_count_cancel(s->svc);
    if (s_sleep_claim(s))
        kb_grpc_fail(call, KB_GRPC_CANCELLED, "sleep cancelled");
    s_sleep_unref(s);
}

static void s_sleep(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    const Kbtest__SleepRequest *req = (const Kbtest__SleepRequest *)msg;
    s_sleep_t *s = calloc(1, sizeof *s);
    if (!s) {
        kb_grpc_fail(call, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->svc = user;
    s->call = call;
    s->refs = 2;
    if (kb_grpc_call_on_cancel(call, s_sleep_cancel, s) < 0) {
        s_sleep_cancel(call, s); /* already cancelled */
    }
    s_later(user, req->ms, s_sleep_job, s);
}

/* ---------- Stats, Ping ---------- */

static void s_stats(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    kbt_service_t *svc = user;
    kb_grpc_stats_t st;
    kb_grpc_server_stats(svc->srv, &st);
    Kbtest__StatsReply r = KBTEST__STATS_REPLY__INIT;
    r.server_cancelled = st.calls_cancelled;
    r.handler_cancels = kbt_service_handler_cancels(svc);
    r.live = st.calls_live;
    r.unimplemented = st.unimplemented;
    r.bad_requests = st.bad_requests;
    kb_grpc_reply(call, &r.base);
}

static void s_ping(kb_grpc_call_t *call, const ProtobufCMessage *msg, void *user)
{
    Kbtest__Empty r = KBTEST__EMPTY__INIT;
    kb_grpc_reply(call, &r.base);
}

/* ---------- service ---------- */

kbt_service_t *kbt_service_new(void)
{
    kbt_service_t *svc = calloc(1, sizeof *svc);
    if (!svc)
        return NULL;
    s_crc_init();
    pthread_mutex_init(&svc->mu, NULL);
    pthread_cond_init(&svc->cv, NULL);
    if (pthread_create(&svc->thread, NULL, s_worker, svc) != 0) {
        pthread_cond_destroy(&svc->cv);
        pthread_mutex_destroy(&svc->mu);
        free(svc);
        return NULL;
    }
    return svc;
}

int kbt_service_register(kbt_service_t *svc, kb_grpc_server_t *srv)
{
    svc->srv = srv;
    const kb_grpc_method_t m[] = {
        {"/kbtest.TestService/Echo", KB_GRPC_UNARY, &kbtest__echo_request__descriptor, s_echo, NULL,
         NULL, svc},
        {"/kbtest.TestService/Meta", KB_GRPC_UNARY, &kbtest__meta_request__descriptor, s_meta, NULL,
         NULL, svc},
        {"/kbtest.TestService/Count", KB_GRPC_SERVER_STREAM, &kbtest__count_request__descriptor,
         s_count, NULL, NULL, svc},
        {"/kbtest.TestService/Upload", KB_GRPC_CLIENT_STREAM, &kbtest__chunk__descriptor,
         s_upload_start, s_upload_msg, s_upload_end, svc},
        {"/kbtest.TestService/Sleep", KB_GRPC_UNARY, &kbtest__sleep_request__descriptor, s_sleep,
         NULL, NULL, svc},
        {"/kbtest.TestService/Stats", KB_GRPC_UNARY, &kbtest__empty__descriptor, s_stats, NULL,
         NULL, svc},
        {"/kbtest.TestService/Ping", KB_GRPC_UNARY, &kbtest__empty__descriptor, s_ping, NULL, NULL,
         svc},
    };
    return kb_grpc_server_add_methods(srv, m, sizeof m / sizeof m[0]);
}

uint64_t kbt_service_handler_cancels(kbt_service_t *svc)
{
    pthread_mutex_lock(&svc->mu);
    uint64_t n = svc->handler_cancels;
    pthread_mutex_unlock(&svc->mu);
    return n;
}

void kbt_service_destroy(kbt_service_t **svc_p)
{
    kbt_service_t *svc = svc_p ? *svc_p : NULL;
    if (!svc)
        return;
    *svc_p = NULL;
    pthread_mutex_lock(&svc->mu);
    svc->stop = true;
    pthread_cond_signal(&svc->cv);
    pthread_mutex_unlock(&svc->mu);
    pthread_join(svc->thread, NULL);
    /* jobs left are timers of calls that already completed: they only release memory */
    while (svc->jobs) {
        s_job_t *j = svc->jobs;
        svc->jobs = j->next;
        j->fn(j->arg, true);
        free(j);
    }
    pthread_cond_destroy(&svc->cv);
    pthread_mutex_destroy(&svc->mu);
    free(svc);
}
