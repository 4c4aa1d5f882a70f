/*
 * The MCP bridge's tools and prompts (reference section 2): argument schemas and checks,
 * translation to the service layer (ka_service), results as MCP CallToolResults. Service errors
 * become results with isError: true and the service's message, so an agent can correct itself.
 * Waiting on the service happens here, on the caller's thread, with a periodic tick (progress).
 */
#include "mcp_int.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control_msgs.h"
#include "ka_errors.h"
#include "sandboxes.h"
#include "store.h"
#include "svc_frames.h"
#include "svc_ops.h"

/* ---- small helpers -------------------------------------------------------------------------- */

/* A tool error result: "<CODE>: <message>" (the code's name from ka_errors' table). */
static json_t *s_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *s_error(int code, const char *fmt, ...)
{
    char msg[1024], text[1100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(text, sizeof text, "%s: %s", ka_code_name(code), msg);
    return json_pack("{s:[{s:s,s:s}],s:b,s:{s:s}}", "content", "type", "text", "text", text,
                     "isError", 1, "_meta", "kagent.dev/error-code", ka_code_name(code));
}

/* A service status (negative errno) as a tool error result. */
static json_t *s_svc_error(int err, const char *message)
{
    return s_error(err ? ka_err_code(err) : KA_INTERNAL, "%s",
                   message && message[0] ? message : "the call failed");
}

/* A success result: the object as JSON text (and structuredContent). Steals obj. */
static json_t *s_ok(kb_mcp_call_t *c, json_t *obj)
{
    if (!obj)
        return NULL;
    char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_t *r = text ? json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text,
                                 "isError", 0)
                     : NULL;
    free(text);
    if (r && c->structured)
        json_object_set(r, "structuredContent", obj);
    json_decref(obj);
    return r;
}

static const char *s_str(const json_t *args, const char *key, const char *def)
{
    const char *v = json_string_value(json_object_get(args, key));
    return v ? v : def;
}

static int64_t s_int(const json_t *args, const char *key, int64_t def)
{
    const json_t *v = json_object_get(args, key);
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_real(v))
        return (int64_t)json_real_value(v);
    return def;
}

/* ---- waiting on the service (this thread is a tools/call worker, never an HTTP thread) ----- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int err;
    char msg[KA_MSG_LEN];
    ka_store_sandbox_t sb; /* sandbox ops */
    bool paused;
    void *body; /* list: items; templates: the blob (malloc'd) */
    size_t n, len;
    bool more;
    int64_t next;
    ka_process_info_t proc; /* process ops */
    uint64_t written;       /* input, write */
    ka_frames_t frames;     /* streams */
} s_wait_t;

static void s_wait_init(s_wait_t *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
}

static void s_wait_fini(s_wait_t *w)
{
    ka_frames_clear(&w->frames);
    free(w->body);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* Records the end (lock held). */
static void s_wait_end(s_wait_t *w, const ka_svc_status_t *st)
{
    w->err = st->err;
    snprintf(w->msg, sizeof w->msg, "%s", st->message ? st->message : "");
    w->done = true;
    pthread_cond_signal(&w->cv);
}

/* Waits (lock held) until signalled or the tick interval passes; runs the tick unlocked. */
static void s_wait_step(kb_mcp_call_t *c, s_wait_t *w)
{
    int ms = c->tick && c->tick_ms > 0 ? c->tick_ms : 1000;
    struct timespec until;
    krt_deadline(CLOCK_MONOTONIC, ms, &until);
    if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT && c->tick) {
        pthread_mutex_unlock(&w->mu);
        c->tick(c->tick_arg);
        pthread_mutex_lock(&w->mu);
    }
}

/* Waits for a started op's end (the service answers exactly once, within its timeout), or
 * takes its refusal. Returns w->err. */
static int s_wait(kb_mcp_call_t *c, s_wait_t *w, ka_svc_status_t started)
{
    pthread_mutex_lock(&w->mu);
    if (started.err)
        s_wait_end(w, &started);
    while (!w->done)
        s_wait_step(c, w);
    pthread_mutex_unlock(&w->mu);
    return w->err;
}

static void s_on_sandbox(void *user, const ka_svc_status_t *st, const ka_svc_sandbox_t *r)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    if (r) {
        w->sb = *r->sandbox;
        w->paused = r->paused;
    }
    s_wait_end(w, st);
    pthread_mutex_unlock(&w->mu);
}

static void s_on_list(void *user, const ka_svc_status_t *st, const ka_svc_list_t *l)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    ka_svc_status_t oom = {-ENOMEM, "out of memory"};
    if (l && l->count && !(w->body = malloc(l->count * sizeof l->items[0])))
        st = &oom;
    else if (l) {
        if (l->count)
            memcpy(w->body, l->items, l->count * sizeof l->items[0]);
        w->n = l->count;
        w->more = l->more;
        w->next = l->next_offset;
    }
    s_wait_end(w, st);
    pthread_mutex_unlock(&w->mu);
}

static void s_on_templates(void *user, const ka_svc_status_t *st, const ka_svc_templates_t *t)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    ka_svc_status_t oom = {-ENOMEM, "out of memory"};
    if (t && !(w->body = malloc(t->blob_len)))
        st = &oom;
    else if (t) {
        memcpy(w->body, t->blob, t->blob_len);
        w->len = t->blob_len;
    }
    s_wait_end(w, st);
    pthread_mutex_unlock(&w->mu);
}

static void s_on_process(void *user, const ka_svc_status_t *st, const ka_svc_process_t *p)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    if (p)
        w->proc = p->info;
    s_wait_end(w, st);
    pthread_mutex_unlock(&w->mu);
}

static void s_on_written(void *user, const ka_svc_status_t *st, uint64_t written)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    w->written = written;
    s_wait_end(w, st);
    pthread_mutex_unlock(&w->mu);
}

static void s_on_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_wait_t *w = user;
    pthread_mutex_lock(&w->mu);
    if (ka_frames_push(&w->frames, f, len) && f->final) { /* out of memory: still end */
        ka_svc_status_t st = ka_svc_status_of(f, len);
        s_wait_end(w, &st);
    }
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Takes data frames; returns false when it needs no more (the stream is then cancelled). */
typedef bool (*s_data_fn)(void *u, const ka_guest_reply_t *f);

/* A call that ended without a final frame from the sandbox: *fin and *end as if one failing
 * with err and message had come. */
static void s_no_final(ka_guest_reply_t *fin, ka_frame_end_t *end, int err, const char *message)
{
    ka_frame_fail_t f;
    size_t len = ka_frame_final(&f, err, message);
    ka_frame_end(end, &f.frame, len);
    *fin = f.frame;
    fin->tail_len = 0;
}

/* Drains a started stream: data frames go to on_data; *fin receives the final frame's header,
 * *end its outcome, and *tail (when not NULL) a copy of its tail (malloc'd, fin->tail_len
 * bytes; NULL if none). Returns the final status code (ka_code_t). */
static int s_drain(kb_mcp_call_t *c, s_wait_t *w, ka_svc_status_t started, krt_addr_t stream,
                   s_data_fn on_data, void *u, ka_guest_reply_t *fin, ka_frame_end_t *end,
                   void **tail)
{
    if (tail)
        *tail = NULL;
    if (started.err) {
        s_no_final(fin, end, started.err, started.message);
        return ka_err_code(end->err);
    }
    int64_t deadline = krt_mono_ms() + KB_MCP_GUEST_WAIT_MS;
    bool cancelled = false, have_final = false;
    pthread_mutex_lock(&w->mu);
    while (!have_final && !w->done) {
        if (ka_frames_empty(&w->frames)) {
            if (!cancelled && krt_mono_ms() > deadline) {
                cancelled = true;
                ka_svc_stream_cancel(c->svc, stream);
            }
            s_wait_step(c, w);
            continue;
        }
        ka_frame_t *fr = ka_frames_pop(&w->frames);
        pthread_mutex_unlock(&w->mu);
        const ka_guest_reply_t *f = &fr->frame;
        if (f->final) {
            *fin = *f;
            fin->tail_len = 0;
            ka_frame_end(end, f, fr->len);
            have_final = true;
            if (tail && f->tail_len && fr->len >= sizeof *f + f->tail_len &&
                (*tail = malloc(f->tail_len))) {
                memcpy(*tail, f->tail, f->tail_len);
                fin->tail_len = f->tail_len;
            }
        } else if (!cancelled && on_data && fr->len >= sizeof *f + f->tail_len && !on_data(u, f)) {
            cancelled = true;
            ka_svc_stream_cancel(c->svc, stream);
        } else {
            ka_svc_stream_ack(c->svc, stream, f->tail_len); /* taken: the guest may send more */
        }
        free(fr);
        pthread_mutex_lock(&w->mu);
    }
    if (!have_final)
        s_no_final(fin, end, w->err, w->msg);
    pthread_mutex_unlock(&w->mu);
    return ka_err_code(end->err);
}

/* ---- results shared by tools ---------------------------------------------------------------- */

void kb_mcp_rfc3339(int64_t ms, char *out, size_t cap)
{
    time_t sec = (time_t)(ms / 1000);
    int frac = (int)(ms % 1000);
    if (frac < 0) {
        frac += 1000;
        sec--;
    }
    struct tm tm;
    gmtime_r(&sec, &tm);
    char base[64];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!frac) {
        snprintf(out, cap, "%sZ", base);
        return;
    }
    char f[8];
    snprintf(f, sizeof f, "%03d", frac);
    for (int i = 2; i > 0 && f[i] == '0'; i--)
        f[i] = '\0';
    snprintf(out, cap, "%s.%sZ", base, f);
}

/* The reference's sandbox summary. */
static json_t *s_summary(const ka_store_sandbox_t *sb)
{
    char exp[64];
    kb_mcp_rfc3339(sb->expires_ms, exp, sizeof exp);
    const char *state = ka_state_name(sb->state), *op = ka_op_name(sb->operation);
    json_t *o = json_pack("{s:s,s:{s:s,s:s}}", "id", sb->id, "sandbox_template", "namespace",
                          sb->template_namespace, "name", sb->template_name);
    if (!o)
        return NULL;
    if (sb->name[0])
        json_object_set_new(o, "name", json_string(sb->name));
    json_object_set_new(o, "state", json_string(state ? state : "RUNTIME_STATE_UNSPECIFIED"));
    json_object_set_new(o, "operation", json_string(op ? op : "RUNTIME_OPERATION_NONE"));
    if (sb->node[0])
        json_object_set_new(o, "node", json_string(sb->node));
    json_object_set_new(o, "expires_at", json_string(exp));
    if (sb->failure_reason[0] || sb->failure_message[0])
        json_object_set_new(
            o, "failure",
            json_pack("{s:s,s:s}", "reason", sb->failure_reason, "message", sb->failure_message));
    return o;
}

/* A sandbox op's result: the summary, with "paused" after a pause or unpause and whenever it
 * is paused. */
static json_t *s_reply_summary(kb_mcp_call_t *c, bool pause_op, const s_wait_t *w)
{
    json_t *o = s_summary(&w->sb);
    if (pause_op || w->paused)
        json_object_set_new(o, "paused", json_boolean(w->paused));
    return s_ok(c, o);
}

const char *kb_mcp_process_status(int state, int exit_code)
{
    if (state != 2)
        return "PROCESS_STATUS_RUNNING";
    if (exit_code == 0)
        return "PROCESS_STATUS_COMPLETED";
    if (exit_code > 128 && exit_code <= 128 + 64)
        return "PROCESS_STATUS_TERMINATED";
    return "PROCESS_STATUS_FAILED";
}

static json_t *s_process_id(uint64_t proc)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRIu64, proc);
    return json_string(b);
}

/* ---- lifecycle tools --------------------------------------------------------------------------
 */

static ka_svc_caller_t s_who(const kb_mcp_call_t *c)
{
    return (ka_svc_caller_t){c->caller, 0};
}

static json_t *t_list_templates(kb_mcp_call_t *c, json_t *args)
{
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    json_t *r;
    if (s_wait(
            c, &w,
            ka_svc_template_list(c->svc, &who, s_str(args, "namespace", ""), s_on_templates, &w))) {
        r = s_svc_error(w.err, w.msg);
    } else {
        json_t *list = json_array();
        const ka_store_blob_t *blob = w.body;
        for (const ka_store_template_t *t = ka_store_blob_next(blob, w.len, NULL); t;
             t = ka_store_blob_next(blob, w.len, t))
            if (!t->deleted)
                json_array_append_new(
                    list, json_pack("{s:s,s:s}", "namespace", t->namespace_, "name", t->name));
        r = s_ok(c, json_pack("{s:o}", "templates", list));
    }
    s_wait_fini(&w);
    return r;
}

static json_t *t_create(kb_mcp_call_t *c, json_t *args)
{
    ka_svc_create_args_t a = {.request_id = s_str(args, "request_id", ""),
                              .name = s_str(args, "name", ""),
                              .template_namespace = s_str(args, "namespace", ""),
                              .template_name = s_str(args, "template", ""),
                              .ttl_ms = s_int(args, "ttl_seconds", 0) * 1000};
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    json_t *r = s_wait(c, &w, ka_svc_create(c->svc, &who, &a, s_on_sandbox, &w))
                    ? s_svc_error(w.err, w.msg)
                    : s_reply_summary(c, false, &w);
    s_wait_fini(&w);
    return r;
}

static json_t *t_list_sandboxes(kb_mcp_call_t *c, json_t *args)
{
    ka_svc_list_args_t a = {.limit = s_int(args, "page_size", 0),
                            .page_token = s_str(args, "page_token", "")};
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    json_t *r;
    if (s_wait(c, &w, ka_svc_list(c->svc, &who, &a, s_on_list, &w))) {
        r = s_svc_error(w.err, w.msg);
    } else {
        json_t *items = json_array();
        const ka_store_sandbox_t *sb = w.body;
        for (size_t i = 0; i < w.n; i++)
            json_array_append_new(items, s_summary(&sb[i]));
        json_t *o = json_pack("{s:o}", "sandboxes", items);
        if (w.more) {
            char next[32];
            snprintf(next, sizeof next, "%" PRId64, w.next);
            json_object_set_new(o, "next_page_token", json_string(next));
        }
        r = s_ok(c, o);
    }
    s_wait_fini(&w);
    return r;
}

typedef ka_svc_status_t (*s_by_id_fn)(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                                      ka_svc_sandbox_cb cb, void *user);

static json_t *s_lifecycle(kb_mcp_call_t *c, json_t *args, s_by_id_fn op, bool pause_op)
{
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    json_t *r = s_wait(c, &w, op(c->svc, &who, s_str(args, "sandbox_id", ""), s_on_sandbox, &w))
                    ? s_svc_error(w.err, w.msg)
                    : s_reply_summary(c, pause_op, &w);
    s_wait_fini(&w);
    return r;
}

static json_t *t_get(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, ka_svc_sandbox, false);
}
static json_t *t_suspend(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, ka_svc_suspend, false);
}
static json_t *t_resume(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, ka_svc_resume, false);
}
static json_t *t_pause(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, ka_svc_pause, true);
}
static json_t *t_unpause(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, ka_svc_unpause, true);
}
static json_t *t_delete(kb_mcp_call_t *c, json_t *a)
{
    return s_lifecycle(c, a, ka_svc_delete, false);
}

/* fork_sandbox: {sandbox_id, request_id, count, ttl_seconds} -> {sandboxes: [summary]} */
static json_t *t_fork(kb_mcp_call_t *c, json_t *args)
{
    int64_t ttl = s_int(args, "ttl_seconds", 0);
    ka_svc_fork_args_t a = {s_str(args, "sandbox_id", ""), s_str(args, "request_id", ""),
                            s_int(args, "count", 1), ttl > INT64_MAX / 1000 ? -1 : ttl * 1000};
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    json_t *r;
    if (s_wait(c, &w, ka_svc_fork(c->svc, &who, &a, s_on_list, &w))) {
        r = s_svc_error(w.err, w.msg);
    } else {
        json_t *items = json_array();
        const ka_store_sandbox_t *sb = w.body;
        for (size_t i = 0; i < w.n; i++)
            json_array_append_new(items, s_summary(&sb[i]));
        r = s_ok(c, json_pack("{s:o}", "sandboxes", items));
    }
    s_wait_fini(&w);
    return r;
}

/* ---- process tools ----------------------------------------------------------------------------
 */

static json_t *t_start(kb_mcp_call_t *c, json_t *args)
{
    json_t *cmd = json_object_get(args, "command"), *env = json_object_get(args, "env");
    size_t argc = json_array_size(cmd), n_env = json_object_size(env), i = 0;
    const char **argv = calloc(argc ? argc : 1, sizeof *argv);
    ka_svc_env_t *ev = calloc(n_env ? n_env : 1, sizeof *ev);
    json_t *r = NULL, *v;
    const char *key;
    if (!argv || !ev) {
        r = s_error(KA_INTERNAL, "out of memory");
        goto out;
    }
    json_array_foreach(cmd, i, v) argv[i] = json_string_value(v);
    i = 0;
    json_object_foreach(env, key, v) ev[i++] = (ka_svc_env_t){key, json_string_value(v)};
    ka_svc_exec_args_t a = {.sandbox_id = s_str(args, "sandbox_id", ""),
                            .argv = argv,
                            .argc = argc,
                            .env = ev,
                            .n_env = n_env,
                            .cwd = s_str(args, "cwd", "")};
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    r = s_wait(c, &w, ka_svc_exec(c->svc, &who, &a, s_on_process, &w))
            ? s_svc_error(w.err, w.msg)
            : s_ok(c, json_pack("{s:o}", "process_id", s_process_id(w.proc.proc)));
    s_wait_fini(&w);
out:
    free(argv);
    free(ev);
    return r;
}

static json_t *s_process_json(const ka_process_info_t *p, bool with_status)
{
    json_t *o = json_pack("{s:o}", "process_id", s_process_id(p->proc));
    if (with_status)
        json_object_set_new(o, "status",
                            json_string(kb_mcp_process_status(p->state, p->exit_code)));
    json_object_set_new(o, "exit_code", json_integer(p->exit_code));
    return o;
}

/* Gets (signal 0) or signals a process; 0 or the error result in *err. */
static int s_proc_call(kb_mcp_call_t *c, json_t *args, int signal, ka_process_info_t *p,
                       json_t **err)
{
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    const char *id = s_str(args, "sandbox_id", ""), *proc = s_str(args, "process_id", "");
    ka_svc_status_t st = signal ? ka_svc_signal(c->svc, &who, id, proc, signal, s_on_process, &w)
                                : ka_svc_process(c->svc, &who, id, proc, s_on_process, &w);
    int rc = s_wait(c, &w, st);
    if (rc)
        *err = s_svc_error(w.err, w.msg);
    else
        *p = w.proc;
    s_wait_fini(&w);
    return rc;
}

static json_t *t_get_process(kb_mcp_call_t *c, json_t *args)
{
    ka_process_info_t p;
    json_t *err = NULL;
    if (s_proc_call(c, args, 0, &p, &err))
        return err;
    return s_ok(c, s_process_json(&p, true));
}

static json_t *t_kill_process(kb_mcp_call_t *c, json_t *args)
{
    ka_process_info_t p;
    json_t *err = NULL;
    if (s_proc_call(c, args, SIGKILL, &p, &err))
        return err;
    /* the kill is asynchronous: wait (bounded) for the exit to report its code */
    for (int i = 0; i < 100 && p.state != 2; i++) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        if (s_proc_call(c, args, 0, &p, &err))
            return err;
    }
    return s_ok(c, s_process_json(&p, p.state != 2));
}

bool kb_mcp_outputs_add(kb_mcp_outputs_t *o, int stream, uint64_t offset, const char *data,
                        size_t len)
{
    int i = stream == KA_STREAM_STDERR ? 1 : 0;
    if (o->truncated)
        return false;
    if (offset + len <= o->off[i])
        return true; /* already returned */
    if (offset < o->off[i]) {
        size_t skip = (size_t)(o->off[i] - offset);
        data += skip;
        len -= skip;
        offset = o->off[i];
    }
    if (offset > o->off[i]) /* the spool dropped bytes: continue after the gap */
        o->off[i] = offset;
    size_t used = o->len[0] + o->len[1];
    size_t room = o->cap > used ? o->cap - used : 0;
    size_t take = len < room ? len : room;
    if (take) {
        char *nb = realloc(o->buf[i], o->len[i] + take);
        if (!nb) {
            o->truncated = true;
            return false;
        }
        memcpy(nb + o->len[i], data, take);
        o->buf[i] = nb;
        o->len[i] += take;
        o->off[i] += take;
    }
    if (take < len) {
        o->truncated = true;
        return false;
    }
    return true;
}

void kb_mcp_outputs_free(kb_mcp_outputs_t *o)
{
    free(o->buf[0]);
    free(o->buf[1]);
    o->buf[0] = o->buf[1] = NULL;
}

static bool s_outputs_data(void *u, const ka_guest_reply_t *f)
{
    if (f->stream != KA_STREAM_STDOUT && f->stream != KA_STREAM_STDERR)
        return true;
    return kb_mcp_outputs_add(u, f->stream, f->offset, f->tail, f->tail_len);
}

static json_t *t_read_outputs(kb_mcp_call_t *c, json_t *args)
{
    ka_svc_output_args_t a = {s_str(args, "sandbox_id", ""), s_str(args, "process_id", ""),
                              s_int(args, "stdout_offset", 0), s_int(args, "stderr_offset", 0),
                              false};
    kb_mcp_outputs_t o;
    memset(&o, 0, sizeof o);
    o.cap = KB_MCP_OUTPUT_CAP;
    o.off[0] = (uint64_t)a.stdout_offset;
    o.off[1] = (uint64_t)a.stderr_offset;
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    krt_addr_t stream = KRT_ADDR_NONE;
    ka_svc_status_t st = ka_svc_output(c->svc, &who, &a, s_on_frame, &w, &stream);
    ka_guest_reply_t fin;
    ka_frame_end_t end;
    int code = s_drain(c, &w, st, stream, s_outputs_data, &o, &fin, &end, NULL);
    s_wait_fini(&w);
    if (code != KA_OK && !(code == KA_CANCELLED && o.truncated)) {
        kb_mcp_outputs_free(&o);
        return kb_mcp_status_error(&end);
    }
    char *b0 = kb_mcp_b64_encode(o.buf[0], o.len[0]), *b1 = kb_mcp_b64_encode(o.buf[1], o.len[1]);
    bool exited = code == KA_OK && fin.has_process && fin.process.state == 2;
    json_t *r =
        json_pack("{s:s,s:s,s:I,s:I,s:b,s:b}", "stdout_base64", b0 ? b0 : "", "stderr_base64",
                  b1 ? b1 : "", "stdout_offset", (json_int_t)o.off[0], "stderr_offset",
                  (json_int_t)o.off[1], "truncated", o.truncated, "exited", exited);
    if (r && exited)
        json_object_set_new(r, "exit_code", json_integer(fin.process.exit_code));
    free(b0);
    free(b1);
    kb_mcp_outputs_free(&o);
    return s_ok(c, r);
}

/* ---- file tools -------------------------------------------------------------------------------
 */

static json_t *t_write_file(kb_mcp_call_t *c, json_t *args)
{
    const char *path = s_str(args, "path", ""), *b64 = s_str(args, "data_base64", "");
    size_t blen = strlen(b64);
    if (blen > (KB_MCP_FILE_CAP + 2) / 3 * 4)
        return s_error(KA_INVALID_ARGUMENT, "file exceeds MCP 1 MiB limit");
    unsigned char *data = NULL;
    size_t len = 0;
    char msg[128];
    if (kb_mcp_b64_decode(b64, blen, &data, &len, msg, sizeof msg))
        return s_error(KA_INVALID_ARGUMENT, "invalid base64: %s", msg);
    if (len > KB_MCP_FILE_CAP) {
        free(data);
        return s_error(KA_INVALID_ARGUMENT, "file exceeds MCP 1 MiB limit");
    }
    /* always the whole file: seek 0 truncates */
    ka_svc_write_args_t a = {
        s_str(args, "sandbox_id", ""), path, s_int(args, "mode", 0), 0, data, len};
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    json_t *r = s_wait(c, &w, ka_svc_file_write(c->svc, &who, &a, s_on_written, &w))
                    ? s_svc_error(w.err, w.msg)
                    : s_ok(c, json_pack("{s:I}", "bytes_written", (json_int_t)w.written));
    s_wait_fini(&w);
    free(data);
    return r;
}

enum { S_KIND_UNDECIDED, S_KIND_TEXT, S_KIND_IMAGE, S_KIND_BINARY };

typedef struct {
    uint64_t byte_offset;
    unsigned char head[KB_MCP_SNIFF_LEN];
    size_t head_len;
    int kind;
    const char *mime;
    kb_mcp_pager_t *pager;
    bool page_done;
    unsigned char *win; /* bytes [byte_offset, byte_offset + win_len) */
    size_t win_len;
    uint64_t pos; /* bytes seen */
    bool oom;
} s_read_t;

static bool s_is_image(const char *mime)
{
    return strncmp(mime, "image/", 6) == 0;
}

/* Routes bytes at file position r->pos to the chosen kind; false when done. */
static bool s_read_route(s_read_t *r, const unsigned char *p, size_t n)
{
    if (r->kind == S_KIND_TEXT) {
        r->pos += n;
        if (!r->page_done)
            r->page_done = kb_mcp_pager_feed(r->pager, (const char *)p, n);
        return !r->page_done;
    }
    /* image or binary: keep the window (a whole image up to its cap), count the rest */
    uint64_t start = r->pos, end = r->pos + n;
    bool whole = r->kind == S_KIND_IMAGE && r->byte_offset == 0;
    uint64_t ws = r->byte_offset,
             we = r->byte_offset + (whole ? KB_MCP_IMAGE_CAP : KB_MCP_FILE_CAP);
    uint64_t a = start > ws ? start : ws, b = end < we ? end : we;
    if (a < b) {
        unsigned char *nw = realloc(r->win, r->win_len + (size_t)(b - a));
        if (!nw) {
            r->oom = true;
            return false;
        }
        memcpy(nw + r->win_len, p + (a - start), (size_t)(b - a));
        r->win = nw;
        r->win_len += (size_t)(b - a);
    }
    r->pos = end;
    return true; /* read on: the final frame tells the size */
}

static void s_read_decide(s_read_t *r, uint64_t offset, uint64_t limit)
{
    r->mime = kb_mcp_sniff(r->head, r->head_len);
    if (strncmp(r->mime, "text/", 5) == 0) {
        r->kind = S_KIND_TEXT;
        r->pager = kb_mcp_pager_new(offset, limit);
    } else {
        r->kind = s_is_image(r->mime) ? S_KIND_IMAGE : S_KIND_BINARY;
    }
}

typedef struct {
    s_read_t *r;
    uint64_t offset, limit;
} s_read_ctx_t;

static bool s_read_data(void *u, const ka_guest_reply_t *f)
{
    s_read_ctx_t *x = u;
    s_read_t *r = x->r;
    const unsigned char *p = (const unsigned char *)f->tail;
    size_t n = f->tail_len;
    if (r->kind == S_KIND_UNDECIDED) {
        size_t take = KB_MCP_SNIFF_LEN - r->head_len;
        if (take > n)
            take = n;
        memcpy(r->head + r->head_len, p, take);
        r->head_len += take;
        p += take;
        n -= take;
        if (r->head_len < KB_MCP_SNIFF_LEN)
            return true;
        s_read_decide(r, x->offset, x->limit);
        if (!s_read_route(r, r->head, r->head_len))
            return false;
    }
    return n ? s_read_route(r, p, n) : true;
}

/* An image as the model sees it: re-encoded when large (mcp_image.c), captioned with its
 * sizes. NULL when it cannot be decoded (then it is read as a binary file). */
static json_t *s_read_image(s_read_t *r)
{
    kb_mcp_image_t img;
    char msg[256], cap[256];
    int rc = kb_mcp_image_prepare(r->win, r->win_len, r->mime, &img, msg, sizeof msg);
    if (rc == KB_MCP_IMAGE_TOO_LARGE)
        return s_error(KA_INVALID_ARGUMENT, "%s", msg);
    if (rc)
        return NULL;
    int n = img.w ? snprintf(cap, sizeof cap, "%s, %u\xc3\x97%u px", r->mime, img.w, img.h)
                  : snprintf(cap, sizeof cap, "%s", r->mime);
    if (img.reencoded)
        snprintf(cap + n, sizeof cap - (size_t)n, ", shown at %u\xc3\x97%u (%s, %zu bytes)",
                 img.shown_w, img.shown_h, img.mime, img.len);
    char *b = img.reencoded ? kb_mcp_b64_encode(img.data, img.len)
                            : kb_mcp_b64_encode(r->win, r->win_len);
    json_t *res = json_pack("{s:[{s:s,s:s},{s:s,s:s,s:s,s:{s:s}}],s:b}", "content", "type", "text",
                            "text", cap, "type", "image", "data", b ? b : "", "mimeType", img.mime,
                            "_meta", "codex/imageDetail", "original", "isError", 0);
    free(b);
    kb_mcp_image_free(&img);
    return res;
}

static json_t *s_read_binary(kb_mcp_call_t *c, s_read_t *r, uint64_t size)
{
    if (r->kind == S_KIND_IMAGE && r->byte_offset == 0 && size <= KB_MCP_IMAGE_CAP &&
        r->win_len == size) {
        json_t *res = s_read_image(r);
        if (res)
            return res;
    }
    if (r->win_len > KB_MCP_FILE_CAP) /* an image kept whole, shown as a binary file */
        r->win_len = KB_MCP_FILE_CAP;
    char *b = kb_mcp_b64_encode(r->win, r->win_len);
    json_t *o = json_pack("{s:s,s:I,s:I,s:s}", "mime_type", r->mime, "size", (json_int_t)size,
                          "byte_offset", (json_int_t)r->byte_offset, "data_base64", b ? b : "");
    free(b);
    uint64_t next = r->byte_offset + r->win_len;
    if (next < size)
        json_object_set_new(o, "next_byte_offset", json_integer((json_int_t)next));
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    char desc[160];
    if (next < size)
        snprintf(desc, sizeof desc,
                 "binary file, %s (%" PRIu64 " bytes; continue with byte_offset=%" PRIu64 ")",
                 r->mime, size, next);
    else
        snprintf(desc, sizeof desc, "binary file, %s (%" PRIu64 " bytes)", r->mime, size);
    json_t *res = json_pack("{s:[{s:s,s:s},{s:s,s:s}],s:b}", "content", "type", "text", "text",
                            desc, "type", "text", "text", text ? text : "{}", "isError", 0);
    free(text);
    if (res && c->structured)
        json_object_set(res, "structuredContent", o);
    json_decref(o);
    return res;
}

static json_t *t_read_file(kb_mcp_call_t *c, json_t *args)
{
    ka_svc_read_args_t a = {s_str(args, "sandbox_id", ""), s_str(args, "path", ""), 0};
    s_read_t r;
    memset(&r, 0, sizeof r);
    r.byte_offset = (uint64_t)s_int(args, "byte_offset", 0);
    s_read_ctx_t x = {&r, (uint64_t)s_int(args, "offset", 1),
                      (uint64_t)s_int(args, "limit", KB_MCP_LINES_DEF)};
    s_wait_t w;
    s_wait_init(&w);
    ka_svc_caller_t who = s_who(c);
    krt_addr_t stream = KRT_ADDR_NONE;
    ka_svc_status_t st = ka_svc_file_read(c->svc, &who, &a, s_on_frame, &w, &stream);
    ka_guest_reply_t fin;
    ka_frame_end_t end;
    int code = s_drain(c, &w, st, stream, s_read_data, &x, &fin, &end, NULL);
    s_wait_fini(&w);
    json_t *res;
    if (code != KA_OK && !(code == KA_CANCELLED && r.page_done)) {
        res = kb_mcp_status_error(&end);
    } else if (r.oom) {
        res = s_error(KA_INTERNAL, "out of memory");
    } else {
        if (r.kind == S_KIND_UNDECIDED) { /* a file shorter than the sniff length */
            s_read_decide(&r, x.offset, x.limit);
            s_read_route(&r, r.head, r.head_len);
        }
        if (r.kind == S_KIND_TEXT) {
            char *text = kb_mcp_pager_finish(r.pager);
            r.pager = NULL;
            res = text ? json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text,
                                   "isError", 0)
                       : s_error(KA_INTERNAL, "out of memory");
            free(text);
        } else {
            res = s_read_binary(c, &r, code == KA_OK ? fin.written : r.pos);
        }
    }
    if (r.pager)
        free(kb_mcp_pager_finish(r.pager));
    free(r.win);
    return res;
}

/* ---- the tool table ---------------------------------------------------------------------------
 */

#define S_ID_PROP                                                                                  \
    "\"sandbox_id\":{\"type\":\"string\",\"description\":\"The sandbox's id (a UUID) as "          \
    "create_sandbox or list_sandboxes returned it.\"}"
#define S_PROC_PROP                                                                                \
    "\"process_id\":{\"type\":\"string\",\"description\":\"The id start_sandbox_process "          \
    "returned.\"}"

typedef kb_mcp_tool_t s_tool_t;

static const s_tool_t s_tools[] = {
    {"list_sandbox_templates", "List sandbox templates",
     "Lists the SandboxTemplates a sandbox can be created from, as {templates: [{namespace, "
     "name}]}. It says nothing about readiness or installed programs.",
     "{\"type\":\"object\",\"properties\":{\"namespace\":{\"type\":\"string\",\"description\":"
     "\"Only templates of this namespace.\",\"maxLength\":63}},\"additionalProperties\":false}",
     t_list_templates, true, false, true},
    {"create_sandbox", "Create a sandbox",
     "Creates a sandbox from a template and returns its summary {id, sandbox_template, name, "
     "state, operation, node, expires_at, failure}. Idempotent on request_id: a retry with the "
     "same request_id returns the same sandbox (also after it was deleted), so keep the "
     "request_id and reuse it for retries. The lifetime (ttl_seconds, 1-86400; 0 or omitted = "
     "the operator default) is never extended.",
     "{\"type\":\"object\",\"properties\":{"
     "\"namespace\":{\"type\":\"string\",\"description\":\"The template's namespace.\","
     "\"minLength\":1,\"maxLength\":63},"
     "\"template\":{\"type\":\"string\",\"description\":\"The template's name.\",\"minLength\":1,"
     "\"maxLength\":253},"
     "\"request_id\":{\"type\":\"string\",\"description\":\"Your idempotency key (1-128 "
     "characters); reuse it when retrying.\",\"minLength\":1,\"maxLength\":128},"
     "\"name\":{\"type\":\"string\",\"description\":\"An optional display name.\",\"maxLength\":"
     "200},"
     "\"ttl_seconds\":{\"type\":\"integer\",\"description\":\"Lifetime in seconds (1-86400); 0 "
     "or omitted = the operator default.\",\"minimum\":0,\"maximum\":86400}},"
     "\"required\":[\"namespace\",\"template\",\"request_id\"],\"additionalProperties\":false}",
     t_create, false, false, true},
    {"list_sandboxes", "List sandboxes",
     "Lists your sandboxes as {sandboxes: [summary], next_page_token}. Observes only; never "
     "advances pending work.",
     "{\"type\":\"object\",\"properties\":{"
     "\"page_size\":{\"type\":\"integer\",\"description\":\"At most this many (0-100; 0 = "
     "100).\",\"minimum\":0,\"maximum\":100},"
     "\"page_token\":{\"type\":\"string\",\"description\":\"next_page_token of the previous "
     "page.\"}},\"additionalProperties\":false}",
     t_list_sandboxes, true, false, true},
    {"get_sandbox", "Get a sandbox",
     "Returns a sandbox's summary. Observes only; never advances pending work.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_get, true, false, true},
    {"suspend_sandbox", "Suspend a sandbox",
     "Suspends a sandbox: its compute is released and /data is kept. Running commands and "
     "transfers may be interrupted; process handles do not survive.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_suspend, false, true, true},
    {"resume_sandbox", "Resume a sandbox",
     "Resumes a suspended sandbox with its /data. Earlier process handles become invalid.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_resume, false, false, true},
    {"delete_sandbox", "Delete a sandbox",
     "Deletes a sandbox with its workspace and files. Collect artifacts first.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_delete, false, true, true},
    {"start_sandbox_process", "Start a process",
     "Starts a command in a sandbox and returns {process_id} before it completes. command is "
     "an argv array; shell syntax needs an explicit [\"sh\",\"-c\",\"...\"]. cwd defaults to "
     "/data/workspace. Never blindly retry a start: check get_sandbox_process first.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"command\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,"
     "\"description\":\"argv: the program and its arguments.\"},"
     "\"cwd\":{\"type\":\"string\",\"description\":\"Working directory (default "
     "/data/workspace).\"},"
     "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},"
     "\"description\":\"Extra environment variables.\"}},"
     "\"required\":[\"sandbox_id\",\"command\"],\"additionalProperties\":false}",
     t_start, false, false, false},
    {"get_sandbox_process", "Get a process",
     "Returns {process_id, status, exit_code}. status is PROCESS_STATUS_RUNNING or one of the "
     "terminal PROCESS_STATUS_COMPLETED, _FAILED, _TERMINATED; exit_code means nothing while "
     "RUNNING.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP "," S_PROC_PROP
     "},\"required\":[\"sandbox_id\",\"process_id\"],\"additionalProperties\":false}",
     t_get_process, true, false, true},
    {"kill_sandbox_process", "Kill a process",
     "Kills a process (SIGKILL to its process group) and returns {process_id, exit_code}.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP "," S_PROC_PROP
     "},\"required\":[\"sandbox_id\",\"process_id\"],\"additionalProperties\":false}",
     t_kill_process, false, true, true},
    {"read_sandbox_outputs", "Read process output",
     "Returns the output available now, from the given offsets: {stdout_base64, stderr_base64, "
     "stdout_offset, stderr_offset, truncated, exited, exit_code}. At most 1 MiB of stdout and "
     "stderr combined; truncated is true when more is waiting. Pass both returned offsets back "
     "to continue. Empty output does not mean the process finished: it has when exited is true "
     "(then exit_code is set) and truncated is false.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP "," S_PROC_PROP ","
     "\"stdout_offset\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Bytes of stdout "
     "already read.\"},"
     "\"stderr_offset\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Bytes of stderr "
     "already read.\"}},"
     "\"required\":[\"sandbox_id\",\"process_id\"],\"additionalProperties\":false}",
     t_read_outputs, true, false, true},
    {"write_sandbox_file", "Write a file",
     "Writes a whole file (replacing it) from standard base64 data of at most 1 MiB decoded; "
     "relative paths are under /data/workspace, parents are created. Returns {bytes_written}. "
     "An interrupted write can leave a partial file.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":\"File path (relative to "
     "/data/workspace, or absolute inside it).\"},"
     "\"data_base64\":{\"type\":\"string\",\"description\":\"The content, standard base64 "
     "(at most 1 MiB decoded).\"},"
     "\"mode\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":4095,\"description\":\"Unix "
     "permission bits in decimal, e.g. 420 = 0644.\"}},"
     "\"required\":[\"sandbox_id\",\"path\",\"data_base64\"],\"additionalProperties\":false}",
     t_write_file, false, true, true},
    {"read_sandbox_file", "Read a file",
     "Reads a file. Text comes back as numbered lines \"<n>: <line>\" from offset (first line, "
     "from 1), at most limit lines (default 2000) and 32 KiB; long lines are cut; when there is "
     "more the text ends with (lines A-B; continue with offset=N). Images (PNG, JPEG, GIF, WebP) "
     "up to 16 MiB come back as image content, re-encoded as JPEG when over 2000 px or 500,000 "
     "bytes; over 50 M pixels they are refused. Other binary files come back as data_base64 of at "
     "most 1 MiB from byte_offset, with next_byte_offset when there is more.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"path\":{\"type\":\"string\",\"minLength\":1,\"description\":\"File path (relative to "
     "/data/workspace, or absolute inside it).\"},"
     "\"offset\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"Text: the first line "
     "to return, from 1.\"},"
     "\"limit\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"Text: at most this many "
     "lines (default 2000).\"},"
     "\"byte_offset\":{\"type\":\"integer\",\"minimum\":0,\"description\":\"Binary files: the "
     "first byte to return.\"}},"
     "\"required\":[\"sandbox_id\",\"path\"],\"additionalProperties\":false}",
     t_read_file, true, false, true},
    /* beyond the reference: after its tools, in the same shape */
    {"pause_sandbox", "Pause a sandbox",
     "Freezes every process of a READY sandbox: memory and processes stay, no CPU is used, the "
     "TTL keeps running. Commands and file calls are refused until unpause_sandbox.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_pause, false, false, true},
    {"unpause_sandbox", "Unpause a sandbox",
     "Thaws a paused sandbox: its processes go on where they stopped.",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP
     "},\"required\":[\"sandbox_id\"],\"additionalProperties\":false}",
     t_unpause, false, false, true},
    {"fork_sandbox", "Fork a sandbox",
     "Makes count (1-16) new sandboxes of a READY sandbox's revision whose /data and root "
     "changes are a copy of its own at the call (it is frozen while copied, then goes on). "
     "Returns {sandboxes: [summary]}. Idempotent on request_id: a retry returns the same forks. "
     "Each fork has its own lifetime (ttl_seconds, 1-86400; 0 or omitted = the operator "
     "default).",
     "{\"type\":\"object\",\"properties\":{" S_ID_PROP ","
     "\"request_id\":{\"type\":\"string\",\"description\":\"Your idempotency key (1-128 "
     "characters); reuse it when retrying.\",\"minLength\":1,\"maxLength\":128},"
     "\"count\":{\"type\":\"integer\",\"description\":\"How many forks (default 1).\","
     "\"minimum\":1,\"maximum\":16},"
     "\"ttl_seconds\":{\"type\":\"integer\",\"description\":\"Each fork's lifetime in seconds "
     "(1-86400); 0 or omitted = the operator default.\",\"minimum\":0,\"maximum\":86400}},"
     "\"required\":[\"sandbox_id\",\"request_id\"],\"additionalProperties\":false}",
     t_fork, false, false, true},
};

#define S_N_OWN   (sizeof s_tools / sizeof s_tools[0])
#define S_N_TOOLS (S_N_OWN + KB_MCP_FILE_TOOLS_N)

/* Tool i: ours, then the Files API's (mcp_files.c). */
static const s_tool_t *s_tool_at(size_t i)
{
    return i < S_N_OWN ? &s_tools[i] : &kb_mcp_file_tools[i - S_N_OWN];
}

static json_t *s_schemas[S_N_TOOLS];
static pthread_once_t s_schemas_once = PTHREAD_ONCE_INIT;

static void s_schemas_load(void)
{
    for (size_t i = 0; i < S_N_TOOLS; i++) {
        json_error_t e;
        s_schemas[i] = json_loads(s_tool_at(i)->schema, JSON_PRESERVE_ORDER, &e);
        if (!s_schemas[i]) {
            fprintf(stderr, "mcp: schema of %s: %s at %d\n", s_tool_at(i)->name, e.text,
                    e.position);
            abort(); /* a bug in the table above */
        }
    }
}

static const s_tool_t *s_find(const char *name, size_t *idx)
{
    for (size_t i = 0; name && i < S_N_TOOLS; i++)
        if (strcmp(s_tool_at(i)->name, name) == 0) {
            if (idx)
                *idx = i;
            return s_tool_at(i);
        }
    return NULL;
}

json_t *kb_mcp_tools_list(void)
{
    pthread_once(&s_schemas_once, s_schemas_load);
    json_t *a = json_array();
    for (size_t i = 0; a && i < S_N_TOOLS; i++) {
        const s_tool_t *t = s_tool_at(i);
        json_array_append_new(a, json_pack("{s:s,s:s,s:s,s:O,s:{s:s,s:b,s:b,s:b,s:b}}", "name",
                                           t->name, "title", t->title, "description",
                                           t->description, "inputSchema", s_schemas[i],
                                           "annotations", "title", t->title, "readOnlyHint",
                                           t->read_only, "destructiveHint", t->destructive,
                                           "idempotentHint", t->idempotent, "openWorldHint", 0));
    }
    return a;
}

bool kb_mcp_tool_exists(const char *name)
{
    return s_find(name, NULL) != NULL;
}

json_t *kb_mcp_tool_call(kb_mcp_call_t *c, const char *name, json_t *args)
{
    pthread_once(&s_schemas_once, s_schemas_load);
    size_t i;
    const s_tool_t *t = s_find(name, &i);
    if (!t)
        return s_error(KA_INVALID_ARGUMENT, "unknown tool \"%s\"", name ? name : "");
    char msg[512];
    json_t *empty = NULL;
    if (!args)
        args = empty = json_object();
    json_t *r;
    if (kb_mcp_check_args(s_schemas[i], args, msg, sizeof msg))
        r = s_error(KA_INVALID_ARGUMENT, "%s", msg);
    else
        r = t->fn(c, args);
    json_decref(empty);
    return r;
}

/* ---- prompts and instructions ---------------------------------------------------------------- */

static const char s_instructions[] =
    "kagent sandboxes: isolated Linux workspaces for running commands and handling files.\n"
    "- Sandboxes live independently of Sessions, and they have no network egress (loopback "
    "only).\n"
    "- Upload inputs with write_sandbox_file and work in /data/workspace (the default cwd and "
    "the root of relative paths).\n"
    "- create_sandbox is idempotent on request_id: keep the request_id and retry with the same "
    "one; lifecycle retries must use the same request_id. Check state, operation and "
    "expires_at in every summary.\n"
    "- Never blindly retry start_sandbox_process: check get_sandbox_process first.\n"
    "- Continue read_sandbox_outputs with both returned offsets. Empty output does not mean "
    "completion; the process has finished when exited is true and truncated is false.\n"
    "- MCP transfers are limited to 1 MiB per call (base64 payloads).\n"
    "- Collect artifacts before deleting a sandbox.\n"
    "- Suspend can interrupt work. Files under /data survive a resume; process handles do not.\n"
    "- get_sandbox and list_sandboxes never advance pending work.\n"
    "- Every tool result may be an error: check isError even when the call completed.";

const char *kb_mcp_instructions(void)
{
    return s_instructions;
}

static const char s_task_guidance[] =
    "Carry out the task below in a kagent sandbox, using the sandbox tools of this server.\n"
    "1. Find a template with list_sandbox_templates, unless one is given.\n"
    "2. create_sandbox with the namespace, the template and a new request_id. Keep the "
    "request_id: if the call fails or times out, retry with the same request_id (a retry never "
    "creates a second sandbox). Go on once state is RUNTIME_STATE_READY and operation is "
    "RUNTIME_OPERATION_NONE; note expires_at.\n"
    "3. Upload inputs with write_sandbox_file (standard base64, at most 1 MiB per call). Work "
    "in /data/workspace.\n"
    "4. Run commands with start_sandbox_process. command is an argv array: use "
    "[\"sh\",\"-c\",\"...\"] for shell syntax. Never blindly retry a start: check "
    "get_sandbox_process first.\n"
    "5. Read output with read_sandbox_outputs and pass both returned offsets back. Empty output "
    "does not mean the process finished: it has when exited is true and truncated is false (or "
    "get_sandbox_process says so).\n"
    "6. Read results with read_sandbox_file (numbered lines; continue with the offset it "
    "names).\n"
    "7. Collect every artifact you need, then delete_sandbox.\n"
    "Check isError on every tool result and fix the cause before retrying.";

static const char s_recovery_guidance[] =
    "Recover the kagent sandbox named below.\n"
    "1. get_sandbox: read state, operation, expires_at and failure. get_sandbox never advances "
    "pending work.\n"
    "2. If operation is not RUNTIME_OPERATION_NONE, a lifecycle operation is in progress: wait "
    "and get_sandbox again; retry an interrupted create with the same request_id.\n"
    "3. RUNTIME_STATE_SUSPENDED: resume_sandbox. Files under /data survive, earlier process "
    "handles do not: start the work again where it is not done.\n"
    "4. RUNTIME_STATE_READY: for a process whose result you do not know, call "
    "get_sandbox_process and read_sandbox_outputs from your last offsets; do not restart it "
    "blindly.\n"
    "5. RUNTIME_STATE_FAILED, RUNTIME_STATE_DELETED, or expires_at in the past: the sandbox "
    "cannot be used again. Create a new one with a new request_id and upload the inputs "
    "again.\n"
    "6. A NOT_FOUND error means the sandbox is not yours or does not exist.";

json_t *kb_mcp_prompts_list(void)
{
    return json_pack(
        "[{s:s,s:s,s:s,s:[{s:s,s:s,s:b},{s:s,s:s,s:b},{s:s,s:s,s:b}]},"
        "{s:s,s:s,s:s,s:[{s:s,s:s,s:b}]}]",
        "name", "sandbox-task", "title", "Do a task in a sandbox", "description",
        "Guidance for carrying out a task in a kagent sandbox with the sandbox tools.", "arguments",
        "name", "task", "description", "What to do.", "required", 1, "name", "namespace",
        "description", "The template's namespace.", "required", 0, "name", "template",
        "description", "The template to use (requires namespace).", "required", 0, "name",
        "sandbox-recovery", "title", "Recover a sandbox", "description",
        "Guidance for recovering a sandbox after an error, a timeout or a suspend.", "arguments",
        "name", "sandbox_id", "description", "The sandbox's id (a UUID).", "required", 1);
}

static json_t *s_user_text(const char *text)
{
    return json_pack("{s:s,s:{s:s,s:s}}", "role", "user", "content", "type", "text", "text", text);
}

json_t *kb_mcp_prompt_get(const char *name, json_t *args, int *code, char *msg, size_t cap)
{
    *code = -32602;
    static const char *const task_args[] = {"task", "namespace", "template", NULL};
    static const char *const rec_args[] = {"sandbox_id", NULL};
    const char *const *known;
    if (name && strcmp(name, "sandbox-task") == 0)
        known = task_args;
    else if (name && strcmp(name, "sandbox-recovery") == 0)
        known = rec_args;
    else
        return snprintf(msg, cap, "unknown prompt \"%s\"", name ? name : ""), NULL;
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v)
    {
        bool ok = false;
        for (const char *const *a = known; *a; a++)
            ok |= strcmp(*a, k) == 0;
        if (!ok)
            return snprintf(msg, cap, "unknown prompt argument \"%s\"", k), NULL;
        if (!json_is_string(v))
            return snprintf(msg, cap, "%s must be a string", k), NULL;
    }
    if (known == task_args) {
        const char *task = s_str(args, "task", ""), *ns = s_str(args, "namespace", "");
        const char *tpl = s_str(args, "template", "");
        if (!*task)
            return snprintf(msg, cap, "task is required"), NULL;
        if (*tpl && !*ns)
            return snprintf(msg, cap, "namespace is required when template is supplied"), NULL;
        json_t *params = json_pack("{s:s}", "task", task);
        if (*ns)
            json_object_set_new(params, "namespace", json_string(ns));
        if (*tpl)
            json_object_set_new(params, "template", json_string(tpl));
        char *pj = json_dumps(params, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(params);
        char *second = NULL;
        if (!pj || asprintf(&second, "Task parameters:\n%s", pj) < 0)
            second = NULL;
        free(pj);
        json_t *r = second
                        ? json_pack("{s:s,s:[o,o]}", "description", "Do a task in a sandbox",
                                    "messages", s_user_text(s_task_guidance), s_user_text(second))
                        : NULL;
        free(second);
        return r;
    }
    const char *id = s_str(args, "sandbox_id", "");
    if (!*id)
        return snprintf(msg, cap, "sandbox_id is required"), NULL;
    if (ka_check_uuid(id))
        return snprintf(msg, cap, "sandbox_id must be a UUID"), NULL;
    char *second = NULL;
    if (asprintf(&second, "Sandbox to recover: %s", id) < 0)
        return snprintf(msg, cap, "out of memory"), *code = -32603, NULL;
    json_t *r = json_pack("{s:s,s:[o,o]}", "description", "Recover a sandbox", "messages",
                          s_user_text(s_recovery_guidance), s_user_text(second));
    free(second);
    return r;
}

/* ---- for the Files API tools (mcp_files.c) ----------------------------------------------------
 */

json_t *kb_mcp_error(int code, const char *message)
{
    return s_error(code, "%s", message);
}

json_t *kb_mcp_status_error(const ka_frame_end_t *end)
{
    int code = ka_err_code(end->err);
    return s_error(code ? code : KA_INTERNAL, "%s",
                   end->message[0] ? end->message : "the call failed");
}

json_t *kb_mcp_ok(kb_mcp_call_t *c, json_t *obj)
{
    return s_ok(c, obj);
}

ka_guest_req_t *kb_mcp_guest_req(kb_mcp_call_t *c, json_t *args, int op, size_t tail, json_t **err)
{
    const char *id = s_str(args, "sandbox_id", "");
    if (ka_check_uuid(id) || strlen(id) >= KA_STORE_ID_LEN) {
        *err = s_error(KA_INVALID_ARGUMENT, "%s", KA_MSG_NOT_UUID);
        return NULL;
    }
    ka_guest_req_t *q = ka_guest_req_new(c->caller, id, op, tail);
    if (!q)
        *err = s_error(KA_INTERNAL, "out of memory");
    return q;
}

int kb_mcp_guest_call(kb_mcp_call_t *c, ka_guest_req_t *q, ka_guest_reply_t *fin,
                      ka_frame_end_t *end, void **tail)
{
    s_wait_t w;
    s_wait_init(&w);
    krt_addr_t stream = KRT_ADDR_NONE;
    ka_svc_status_t st = ka_svc_guest_send(c->svc, q, s_on_frame, &w, &stream);
    int code = s_drain(c, &w, st, stream, NULL, NULL, fin, end, tail);
    s_wait_fini(&w);
    return code;
}
