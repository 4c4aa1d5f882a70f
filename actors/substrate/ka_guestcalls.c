/* ka_guestcalls: requests in flight on a guest channel, and the check of every reply frame. */
#include "ka_guestcalls.h"
#include "ka_fsframes.h"

#include <stdatomic.h>
#include <stdlib.h>

static _Atomic uint64_t s_frames, s_forged, s_stale, s_violations;

bool ka_gc_kind_streams(ka_gc_kind_t kind)
{
    return kind == KA_GC_READ || kind == KA_GC_OUTPUT || kind == KA_GC_FOLLOW ||
           kind == KA_GC_WATCH;
}

ka_gc_call_t *ka_gc_add(ka_gc_table_t *t, uint64_t id, ka_gc_kind_t kind, uint64_t proc,
                        const uint64_t off[2], uint64_t window, uint64_t now_ms, void *user)
{
    ka_gc_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->id = id;
    c->kind = kind;
    c->proc = proc;
    if (off) {
        c->off[0] = off[0];
        c->off[1] = off[1];
    }
    c->credit = window ? window : UINT64_MAX;
    c->last_ms = now_ms;
    c->user = user;
    c->next = t->head;
    t->head = c;
    t->n++;
    t->n_streams += ka_gc_kind_streams(kind);
    return c;
}

static ka_gc_call_t *s_gc_find(ka_gc_table_t *t, uint64_t id)
{
    for (ka_gc_call_t *c = t->head; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

size_t ka_gc_count(const ka_gc_table_t *t, ka_gc_kind_t kind)
{
    size_t n = 0;
    for (const ka_gc_call_t *c = t->head; c; c = c->next)
        n += c->kind == kind;
    return n;
}

void ka_gc_remove(ka_gc_table_t *t, ka_gc_call_t *call)
{
    for (ka_gc_call_t **pp = &t->head; *pp; pp = &(*pp)->next)
        if (*pp == call) {
            *pp = call->next;
            t->n--;
            t->n_streams -= ka_gc_kind_streams(call->kind);
            free(call->after);
            free(call);
            return;
        }
}

/* The one data payload of m, if any: 0 none, 1 found (*k: 0 stdout, 1 stderr, 2 chunk,
 * 3 event), -1 malformed (two payloads, or one that is not bytes). */
static int s_data(const msgpack_object *m, int *k, size_t *n)
{
    static const char *const keys[] = {"stdout", "stderr", "chunk", "event"};
    int found = 0;
    for (int i = 0; i < 4; i++) {
        const msgpack_object *v = ka_gp_get(m, keys[i]);
        if (!v)
            continue;
        if (found || (v->type != MSGPACK_OBJECT_BIN && v->type != MSGPACK_OBJECT_STR))
            return -1;
        found = 1;
        *k = i;
        *n = v->type == MSGPACK_OBJECT_BIN ? v->via.bin.size : v->via.str.size;
    }
    return found;
}

/* Checks a data frame against its request; NULL if it fits (and accounts it), else why. */
static const char *s_check_data(ka_gc_call_t *c, const msgpack_object *m, int k, size_t n)
{
    bool output = c->kind == KA_GC_OUTPUT || (c->kind == KA_GC_FOLLOW && c->begun);
    bool event = c->kind == KA_GC_WATCH;
    if (c->kind == KA_GC_READ ? k != 2 : event ? k != 3 : !output || k >= 2)
        return "data that this request does not stream";
    if (n > c->credit)
        return "data past the credit the node granted";
    if (event) {
        const msgpack_object *v = ka_gp_get(m, "event");
        const char *why = v->type == MSGPACK_OBJECT_BIN ? ka_fsf_check_event(v->via.bin.ptr, n)
                                                        : "a watch event that is not bin";
        if (why)
            return why;
    }
    if (output) {
        uint64_t off;
        if (!ka_gp_get_u64(m, "offset", &off) || off != c->off[k])
            return "output at an offset the stream is not at";
        c->off[k] += n;
    }
    if (c->credit != UINT64_MAX)
        c->credit -= n;
    c->unacked += n;
    c->total += n;
    return NULL;
}

/* The process an end frame carries under key: its proc id, or false if absent / malformed. */
static bool s_proc_of(const msgpack_object *m, const char *key, uint64_t *proc)
{
    ka_gp_process_t p;
    const msgpack_object *o = ka_gp_get(m, key);
    if (!o || ka_gp_process_decode(o, &p))
        return false;
    *proc = p.proc;
    return true;
}

/* Checks an end frame without an error against its request; NULL if it fits, else why. */
static const char *s_check_end(const ka_gc_call_t *c, const msgpack_object *m)
{
    uint64_t proc = 0, size = 0;
    switch (c->kind) {
    case KA_GC_START:
        return s_proc_of(m, "process", &proc) ? NULL : "a start reply without its process";
    case KA_GC_PROC:
        return s_proc_of(m, "process", &proc) && proc == c->proc ? NULL
                                                                 : "a reply for another process";
    case KA_GC_FOLLOW:
    case KA_GC_OUTPUT:
        if (c->kind == KA_GC_FOLLOW && (!c->begun || !ka_gp_get(m, "exit")))
            return "a followed start that ends without its exit";
        if (ka_gp_get(m, "exit") && (!s_proc_of(m, "exit", &proc) || proc != c->proc))
            return "an exit for another process";
        return NULL;
    case KA_GC_INPUT:
        return ka_gp_get_u64(m, "written", &size) && size == c->sent
                   ? NULL
                   : "an input reply that does not match the bytes sent";
    case KA_GC_READ:
        return ka_gp_get_u64(m, "size", &size) && size == c->total
                   ? NULL
                   : "a read whose size does not match its chunks";
    case KA_GC_LIST:
        return ka_fsf_check_list(m, c->after ? c->after : "", c->limit);
    case KA_GC_STAT:
        return ka_fsf_check_stat(m);
    case KA_GC_WATCH:
        return "a watch that ends without an error";
    default:
        return NULL;
    }
}

/* A frame that neither ends nor carries data (and is no keepalive): only a followed start's
 * first frame, its process. */
static const char *s_check_other(ka_gc_call_t *c, const msgpack_object *m)
{
    uint64_t proc;
    if (c->kind != KA_GC_FOLLOW || c->begun || !ka_gp_get(m, "process"))
        return "a frame this request cannot get";
    if (!s_proc_of(m, "process", &proc))
        return "a malformed process record";
    c->proc = proc;
    c->begun = true;
    return NULL;
}

ka_gc_verdict_t ka_gc_check(ka_gc_table_t *t, uint64_t last_id, const ka_gp_frame_t *f,
                            uint64_t now_ms, ka_gc_call_t **call, const char **why)
{
    const msgpack_object *m = ka_gp_frame_map(f);
    uint64_t id = 0;
    *call = NULL;
    *why = NULL;
    atomic_fetch_add(&s_frames, 1);
    if (!ka_gp_get_u64(m, "id", &id)) {
        *why = "a frame without an id";
        return KA_GC_FATAL;
    }
    if (id == 0 || id > last_id) {
        atomic_fetch_add(&s_forged, 1);
        *why = "an id the node never issued";
        return KA_GC_DROP;
    }
    ka_gc_call_t *c = s_gc_find(t, id);
    if (!c) {
        atomic_fetch_add(&s_stale, 1);
        *why = "a request that is no longer open";
        return KA_GC_DROP;
    }
    c->last_ms = now_ms;
    bool end = false;
    const msgpack_object *endv = ka_gp_get(m, "end");
    if (endv && !ka_gp_get_bool(m, "end", &end)) {
        *why = "a malformed end flag";
        return KA_GC_FATAL;
    }
    int64_t err = 0;
    bool has_err = ka_gp_get(m, "err") != NULL;
    if (has_err && (!ka_gp_get_i64(m, "err", &err) || err >= 0 || err < -4095 || !end)) {
        *why = "a malformed error reply";
        return KA_GC_FATAL;
    }
    int k = 0;
    size_t n = 0;
    int data = s_data(m, &k, &n);
    if (data < 0)
        *why = "a malformed data frame";
    else if (data && end)
        *why = "data in an end frame";
    else if (data)
        *why = s_check_data(c, m, k, n);
    else if (end && !has_err)
        *why = s_check_end(c, m);
    else if (!end && ka_gc_kind_streams(c->kind) && m->via.map.size == 1)
        return KA_GC_DROP; /* {"id"}: a keepalive, nothing to deliver */
    else if (!end)
        *why = s_check_other(c, m);
    if (*why)
        return KA_GC_FATAL;
    *call = c;
    return KA_GC_DELIVER;
}

uint64_t ka_gc_credit(ka_gc_call_t *call, uint64_t bytes)
{
    if (bytes > call->unacked)
        bytes = call->unacked;
    call->unacked -= bytes;
    if (call->credit != UINT64_MAX)
        call->credit += bytes;
    return bytes;
}

void ka_gc_count_violation(void)
{
    atomic_fetch_add(&s_violations, 1);
}

void ka_gc_stats(ka_gc_stats_t *out)
{
    out->frames = atomic_load(&s_frames);
    out->forged = atomic_load(&s_forged);
    out->stale = atomic_load(&s_stale);
    out->violations = atomic_load(&s_violations);
}
