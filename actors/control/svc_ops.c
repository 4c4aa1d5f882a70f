/* ka_svc ops: validate once, build the control plane's request, decode its reply (svc_ops.h). */
#include "svc_ops.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "ka_errors.h"
#include "sandboxes.h"
#include "svc_frames.h"
#include "template_doc.h"

_Static_assert(KA_INVALID_ARGUMENT == 3 && KA_UNAVAILABLE == 14 && KA_UNAUTHENTICATED == 16,
               "ka_errors.c numbers the codes as control_msgs.h does");

static const char S_NOT_RUNNING[] = "the control plane is not running";

static ka_svc_status_t s_ok(void)
{
    return (ka_svc_status_t){0, NULL};
}

static ka_svc_status_t s_refuse(const char *why)
{
    return (ka_svc_status_t){-EINVAL, why};
}

static ka_svc_status_t s_unavailable(void)
{
    return (ka_svc_status_t){-ENOTCONN, S_NOT_RUNNING};
}

ka_svc_status_t ka_svc_status_of(const ka_guest_reply_t *f, size_t len)
{
    return (ka_svc_status_t){f->err, f->err ? ka_frame_message(f, len) : NULL};
}

static int s_timeout(const ka_svc_caller_t *who)
{
    return who->timeout_ms > 0 ? who->timeout_ms : KA_SVC_TIMEOUT_MS;
}

/* Copies s into a fixed field; false when it does not fit. */
static bool s_put(char *dst, size_t cap, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= cap)
        return false;
    memcpy(dst, s ? s : "", n + 1);
    return true;
}

/* ---- unary control-plane calls ------------------------------------------------------------ */

typedef void (*s_decode_fn)(void *cb, void *user, const ka_svc_status_t *st, const void *body,
                            size_t len, int64_t arg);

typedef struct {
    s_decode_fn decode;
    void *cb, *user;
    int64_t arg; /* the list's offset */
} s_unary_t;

static void s_on_unary(void *user, const ka_svc_status_t *st, const void *body, size_t len)
{
    s_unary_t *u = user;
    u->decode(u->cb, u->user, st, body, len, u->arg);
    free(u);
}

static ka_svc_status_t s_call(ka_service_t *svc, const ka_svc_caller_t *who, uint32_t type,
                              const void *body, size_t len, s_decode_fn decode, void *cb,
                              void *user, int64_t arg)
{
    s_unary_t *u = malloc(sizeof *u);
    if (!u)
        return (ka_svc_status_t){-ENOMEM, "out of memory"};
    *u = (s_unary_t){decode, cb, user, arg};
    if (ka_svc_call(svc, type, body, len, s_timeout(who), s_on_unary, u)) {
        free(u);
        return s_unavailable();
    }
    return s_ok();
}

static const ka_svc_status_t s_short = {-EIO, "the control plane sent a short reply"};

static void s_decode_sandbox(void *cb, void *user, const ka_svc_status_t *st, const void *body,
                             size_t len, int64_t arg)
{
    ka_svc_sandbox_cb fn = (ka_svc_sandbox_cb)cb;
    (void)arg;
    if (st->err || !body) {
        fn(user, st, NULL);
        return;
    }
    if (len != sizeof(ka_sbx_reply_t)) {
        fn(user, &s_short, NULL);
        return;
    }
    ka_sbx_reply_t r;
    memcpy(&r, body, sizeof r);
    ka_svc_sandbox_t out = {&r.sandbox, r.paused != 0};
    fn(user, st, &out);
}

ka_svc_status_t ka_svc_create(ka_service_t *svc, const ka_svc_caller_t *who,
                              const ka_svc_create_args_t *a, ka_svc_sandbox_cb cb, void *user)
{
    const char *why = ka_check_sandbox_template(a->template_namespace, a->template_name);
    if (!why && !(why = ka_check_request_id(a->request_id)) &&
        !(why = ka_check_sandbox_name(a->name)))
        why = ka_check_ttl(a->ttl_ms);
    if (why)
        return s_refuse(why);
    ka_sbx_create_t c;
    memset(&c, 0, sizeof c);
    const char *ns =
        a->template_namespace && a->template_namespace[0] ? a->template_namespace : "default";
    if (!s_put(c.caller, sizeof c.caller, who->id) ||
        !s_put(c.request_id, sizeof c.request_id, a->request_id) ||
        !s_put(c.name, sizeof c.name, a->name) ||
        !s_put(c.template_namespace, sizeof c.template_namespace, ns) ||
        !s_put(c.template_name, sizeof c.template_name, a->template_name))
        return s_refuse("sandbox_template namespace or name is too long");
    c.ttl_ms = a->ttl_ms;
    return s_call(svc, who, KA_SBX_CREATE, &c, sizeof c, s_decode_sandbox, (void *)cb, user, 0);
}

static ka_svc_status_t s_by_id(ka_service_t *svc, const ka_svc_caller_t *who, uint32_t type,
                               const char *id, ka_svc_sandbox_cb cb, void *user)
{
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    if (!id || ka_check_uuid(id) || !s_put(k.id, sizeof k.id, id))
        return s_refuse(KA_MSG_NOT_UUID);
    if (!s_put(k.caller, sizeof k.caller, who->id))
        return (ka_svc_status_t){-EACCES, "the caller's identity is too long"};
    return s_call(svc, who, type, &k, sizeof k, s_decode_sandbox, (void *)cb, user, 0);
}

ka_svc_status_t ka_svc_sandbox(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                               ka_svc_sandbox_cb cb, void *user)
{
    return s_by_id(svc, who, KA_SBX_GET, id, cb, user);
}

ka_svc_status_t ka_svc_delete(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                              ka_svc_sandbox_cb cb, void *user)
{
    return s_by_id(svc, who, KA_SBX_DELETE, id, cb, user);
}

ka_svc_status_t ka_svc_suspend(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                               ka_svc_sandbox_cb cb, void *user)
{
    return s_by_id(svc, who, KA_SBX_SUSPEND, id, cb, user);
}

ka_svc_status_t ka_svc_resume(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                              ka_svc_sandbox_cb cb, void *user)
{
    return s_by_id(svc, who, KA_SBX_RESUME, id, cb, user);
}

ka_svc_status_t ka_svc_pause(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                             ka_svc_sandbox_cb cb, void *user)
{
    return s_by_id(svc, who, KA_SBX_PAUSE, id, cb, user);
}

ka_svc_status_t ka_svc_unpause(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                               ka_svc_sandbox_cb cb, void *user)
{
    return s_by_id(svc, who, KA_SBX_UNPAUSE, id, cb, user);
}

static void s_decode_list(void *cb, void *user, const ka_svc_status_t *st, const void *body,
                          size_t len, int64_t offset)
{
    ka_svc_list_cb fn = (ka_svc_list_cb)cb;
    if (st->err || !body) {
        fn(user, st, NULL);
        return;
    }
    const ka_sbx_list_t *l = body;
    if (len < sizeof *l || l->count > (len - sizeof *l) / sizeof l->items[0]) {
        fn(user, &s_short, NULL);
        return;
    }
    ka_svc_list_t out = {l->items, l->count, l->more != 0, offset + l->count};
    fn(user, st, &out);
}

ka_svc_status_t ka_svc_list(ka_service_t *svc, const ka_svc_caller_t *who,
                            const ka_svc_list_args_t *a, ka_svc_list_cb cb, void *user)
{
    int64_t offset = a->offset;
    const char *why = NULL;
    if (a->page_token && a->page_token[0])
        why = ka_check_page_token(a->page_token, &offset);
    if (!why)
        why = ka_check_page(a->limit, offset);
    if (why)
        return s_refuse(why);
    ka_sbx_list_req_t q;
    memset(&q, 0, sizeof q);
    if (!s_put(q.caller, sizeof q.caller, who->id) ||
        !s_put(q.template_namespace, sizeof q.template_namespace, a->template_namespace) ||
        !s_put(q.template_name, sizeof q.template_name, a->template_name))
        return s_refuse("sandbox_template namespace or name is too long");
    q.limit = (int32_t)a->limit;
    q.offset = (int32_t)offset;
    return s_call(svc, who, KA_SBX_LIST, &q, sizeof q, s_decode_list, (void *)cb, user, offset);
}

ka_svc_status_t ka_svc_fork(ka_service_t *svc, const ka_svc_caller_t *who,
                            const ka_svc_fork_args_t *a, ka_svc_list_cb cb, void *user)
{
    ka_sbx_fork_t f;
    memset(&f, 0, sizeof f);
    if (!a->sandbox_id || ka_check_uuid(a->sandbox_id) || !s_put(f.id, sizeof f.id, a->sandbox_id))
        return s_refuse(KA_MSG_NOT_UUID);
    const char *why = ka_check_request_id(a->request_id);
    if (!why && (a->count < 0 || a->count > KA_FORK_MAX))
        why = "count must be between 1 and 16";
    if (!why)
        why = ka_check_ttl(a->ttl_ms);
    if (why)
        return s_refuse(why);
    if (!s_put(f.caller, sizeof f.caller, who->id))
        return (ka_svc_status_t){-EACCES, "the caller's identity is too long"};
    s_put(f.request_id, sizeof f.request_id, a->request_id);
    f.count = a->count ? (int32_t)a->count : 1;
    f.ttl_ms = a->ttl_ms;
    return s_call(svc, who, KA_SBX_FORK, &f, sizeof f, s_decode_list, (void *)cb, user, 0);
}

/* ---- templates ---------------------------------------------------------------------------- */

static void s_decode_templates(void *cb, void *user, const ka_svc_status_t *st, const void *body,
                               size_t len, int64_t arg)
{
    ka_svc_templates_cb fn = (ka_svc_templates_cb)cb;
    (void)arg;
    if (st->err || !body) {
        fn(user, st, NULL);
        return;
    }
    if (len < sizeof(ka_tpl_reply_t)) {
        fn(user, &s_short, NULL);
        return;
    }
    const ka_tpl_reply_t *r = body;
    ka_svc_templates_t out = {&r->blob, len - offsetof(ka_tpl_reply_t, blob)};
    fn(user, st, &out);
}

static ka_svc_status_t s_tpl_key(const ka_svc_tpl_ref_t *ref, bool need_name, bool def_ns,
                                 ka_tpl_key_t *k)
{
    const char *ns = ref->namespace_ && ref->namespace_[0] ? ref->namespace_
                     : def_ns                              ? KA_SVC_TPL_NS_DEFAULT
                                                           : "";
    const char *why = ka_check_template_ref(ns, ref->name, need_name);
    if (why)
        return s_refuse(why);
    memset(k, 0, sizeof *k);
    s_put(k->namespace_, sizeof k->namespace_, ns);
    s_put(k->name, sizeof k->name, ref->name);
    return s_ok();
}

ka_svc_status_t ka_svc_template_list(ka_service_t *svc, const ka_svc_caller_t *who,
                                     const char *namespace_, ka_svc_templates_cb cb, void *user)
{
    ka_tpl_key_t k;
    ka_svc_tpl_ref_t ref = {namespace_, NULL};
    ka_svc_status_t st = s_tpl_key(&ref, false, false, &k);
    return st.err ? st
                  : s_call(svc, who, KA_TPL_LIST, &k, sizeof k, s_decode_templates, (void *)cb,
                           user, 0);
}

ka_svc_status_t ka_svc_template_get(ka_service_t *svc, const ka_svc_caller_t *who,
                                    const ka_svc_tpl_ref_t *ref, ka_svc_templates_cb cb, void *user)
{
    ka_tpl_key_t k;
    ka_svc_status_t st = s_tpl_key(ref, true, true, &k);
    return st.err ? st
                  : s_call(svc, who, KA_TPL_GET, &k, sizeof k, s_decode_templates, (void *)cb, user,
                           0);
}

ka_svc_status_t ka_svc_template_delete(ka_service_t *svc, const ka_svc_caller_t *who,
                                       const ka_svc_tpl_ref_t *ref, ka_svc_templates_cb cb,
                                       void *user)
{
    ka_tpl_key_t k;
    ka_svc_status_t st = s_tpl_key(ref, true, true, &k);
    return st.err ? st
                  : s_call(svc, who, KA_TPL_DELETE, &k, sizeof k, s_decode_templates, (void *)cb,
                           user, 0);
}

/* The document's metadata must equal the reference (sandbox_template.metadata_matches_ref); a
 * parse error is the templates actor's to report. */
static const char *s_doc_matches(const char *doc, size_t len, const ka_svc_tpl_ref_t *ref,
                                 const char *ns)
{
    ka_template_doc_t *parsed = NULL;
    char err[KA_TEMPLATE_ERR_CAP];
    const char *why = NULL;
    if (ka_template_parse(doc, len, ns, &parsed, err, sizeof err) == 0 &&
        ((ref->name && ref->name[0] && strcmp(ref->name, parsed->name)) ||
         strcmp(ns, parsed->namespace_)))
        why = "sandbox_template.metadata_matches_ref: metadata name and namespace must equal ref";
    ka_template_free(&parsed);
    return why;
}

ka_svc_status_t ka_svc_template_apply(ka_service_t *svc, const ka_svc_caller_t *who,
                                      const ka_svc_tpl_ref_t *ref, const char *doc, size_t len,
                                      ka_svc_templates_cb cb, void *user)
{
    ka_tpl_key_t k;
    ka_svc_status_t st = s_tpl_key(ref, false, true, &k);
    if (st.err)
        return st;
    if (!doc || !len)
        return s_refuse("a SandboxTemplate is required (yaml or resource)");
    const char *why = s_doc_matches(doc, len, ref, k.namespace_);
    if (why)
        return s_refuse(why);
    ka_tpl_apply_t *a = calloc(1, sizeof *a + len + 1);
    if (!a)
        return (ka_svc_status_t){-ENOMEM, "out of memory"};
    s_put(a->default_namespace, sizeof a->default_namespace, k.namespace_);
    a->yaml_len = (uint32_t)len;
    memcpy(a->yaml, doc, len);
    st = s_call(svc, who, KA_TPL_APPLY, a, sizeof *a + len + 1, s_decode_templates, (void *)cb,
                user, 0);
    free(a);
    return st;
}

/* ---- guest calls -------------------------------------------------------------------------- */

static bool s_bad_sandbox(const char *id)
{
    return !id || ka_check_uuid(id) || strlen(id) >= KA_STORE_ID_LEN;
}

/* A guest request for sandbox_id (a UUID); NULL with *st set. */
static ka_guest_req_t *s_guest_req(const ka_svc_caller_t *who, const char *sandbox_id, int op,
                                   size_t tail, ka_svc_status_t *st)
{
    if (s_bad_sandbox(sandbox_id)) {
        *st = s_refuse(KA_MSG_NOT_UUID);
        return NULL;
    }
    ka_guest_req_t *q = ka_guest_req_new(who->id, sandbox_id, op, tail);
    if (!q)
        *st = (ka_svc_status_t){-ENOMEM, "out of memory"};
    return q;
}

/* Sends q (consumed) as a stream. */
static ka_svc_status_t s_stream(ka_service_t *svc, ka_guest_req_t *q, ka_svc_frame_cb cb,
                                void *user, krt_addr_t *stream)
{
    int rc = ka_svc_stream(svc, &q, cb, user, stream);
    return rc ? s_unavailable() : s_ok();
}

ka_svc_status_t ka_svc_guest_send(ka_service_t *svc, ka_guest_req_t *q, ka_svc_frame_cb cb,
                                  void *user, krt_addr_t *stream)
{
    if (s_bad_sandbox(q->sandbox_id)) {
        free(q);
        return s_refuse(KA_MSG_NOT_UUID);
    }
    return s_stream(svc, q, cb, user, stream);
}

typedef struct {
    ka_svc_process_cb process;
    ka_svc_written_cb written;
    void *user;
} s_guest_t;

/* A unary guest call: only its final frame matters. */
static void s_on_guest_final(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_guest_t *g = user;
    if (!f->final)
        return;
    ka_svc_status_t st = ka_svc_status_of(f, len);
    bool ok = !st.err && len >= sizeof *f + f->tail_len;
    if (!st.err && !ok)
        st = s_short;
    if (g->written) {
        g->written(g->user, &st, ok ? f->written : 0);
    } else {
        ka_svc_process_t p = {f->process, f->tail, f->tail_len};
        g->process(g->user, &st, ok ? &p : NULL);
    }
    free(g);
}

static ka_svc_status_t s_guest_unary(ka_service_t *svc, ka_guest_req_t *q, ka_svc_process_cb pcb,
                                     ka_svc_written_cb wcb, void *user)
{
    s_guest_t *g = malloc(sizeof *g);
    if (!g) {
        free(q);
        return (ka_svc_status_t){-ENOMEM, "out of memory"};
    }
    *g = (s_guest_t){pcb, wcb, user};
    ka_svc_status_t st = s_stream(svc, q, s_on_guest_final, g, NULL);
    if (st.err)
        free(g);
    return st;
}

/* The exec rules; *tail the bytes of argv and env as strings. */
static const char *s_exec_check(const ka_svc_exec_args_t *a, size_t *tail)
{
    const char *why = ka_check_command(a->argc, a->argc ? a->argv[0] : NULL);
    if (!why)
        why = ka_check_cwd(a->cwd);
    *tail = 0;
    for (size_t i = 0; !why && i < a->argc; i++)
        *tail += strlen(a->argv[i]) + 1;
    for (size_t i = 0; !why && i < a->n_env; i++) {
        why = ka_check_env_key(a->env[i].key);
        if (!why)
            *tail += strlen(a->env[i].key) + strlen(a->env[i].value) + 2;
    }
    return why ? why : ka_check_start_size(*tail);
}

ka_guest_req_t *ka_svc_exec_req(const ka_svc_caller_t *who, const ka_svc_exec_args_t *a,
                                ka_svc_status_t *st)
{
    size_t tail;
    const char *why = s_bad_sandbox(a->sandbox_id) ? KA_MSG_NOT_UUID : s_exec_check(a, &tail);
    if (why) {
        *st = s_refuse(why);
        return NULL;
    }
    ka_guest_req_t *q = s_guest_req(who, a->sandbox_id, KA_GUEST_START, tail, st);
    if (!q)
        return NULL;
    char *p = q->tail;
    for (size_t i = 0; i < a->argc; i++)
        p = stpcpy(p, a->argv[i]) + 1;
    for (size_t i = 0; i < a->n_env; i++) {
        p = stpcpy(p, a->env[i].key);
        *p++ = '=';
        p = stpcpy(p, a->env[i].value) + 1;
    }
    q->n_argv = (uint32_t)a->argc;
    q->n_env = (uint32_t)a->n_env;
    s_put(q->cwd, sizeof q->cwd, a->cwd);
    q->stdin_open = a->stdin_open;
    q->timeout_ms = a->timeout_ms;
    return q;
}

ka_svc_status_t ka_svc_exec(ka_service_t *svc, const ka_svc_caller_t *who,
                            const ka_svc_exec_args_t *a, ka_svc_process_cb cb, void *user)
{
    ka_svc_status_t st;
    ka_guest_req_t *q = ka_svc_exec_req(who, a, &st);
    return q ? s_guest_unary(svc, q, cb, NULL, user) : st;
}

ka_svc_status_t ka_svc_exec_follow(ka_service_t *svc, const ka_svc_caller_t *who,
                                   const ka_svc_exec_args_t *a, ka_svc_frame_cb cb, void *user,
                                   krt_addr_t *stream)
{
    ka_svc_status_t st;
    ka_guest_req_t *q = ka_svc_exec_req(who, a, &st);
    if (!q)
        return st;
    q->follow = 1;
    return s_stream(svc, q, cb, user, stream);
}

/* A request naming a process; NULL with *st set. */
static ka_guest_req_t *s_proc_req(const ka_svc_caller_t *who, const char *sandbox_id,
                                  const char *process_id, int op, size_t tail, ka_svc_status_t *st)
{
    uint64_t proc = 0;
    const char *why =
        s_bad_sandbox(sandbox_id) ? KA_MSG_NOT_UUID : ka_check_process_id(process_id, &proc);
    if (why) {
        *st = s_refuse(why);
        return NULL;
    }
    ka_guest_req_t *q = s_guest_req(who, sandbox_id, op, tail, st);
    if (q)
        q->proc = proc;
    return q;
}

ka_svc_status_t ka_svc_process(ka_service_t *svc, const ka_svc_caller_t *who,
                               const char *sandbox_id, const char *process_id, ka_svc_process_cb cb,
                               void *user)
{
    ka_svc_status_t st;
    ka_guest_req_t *q = s_proc_req(who, sandbox_id, process_id, KA_GUEST_GET, 0, &st);
    return q ? s_guest_unary(svc, q, cb, NULL, user) : st;
}

ka_svc_status_t ka_svc_signal(ka_service_t *svc, const ka_svc_caller_t *who, const char *sandbox_id,
                              const char *process_id, int signal, ka_svc_process_cb cb, void *user)
{
    const char *why = s_bad_sandbox(sandbox_id) ? KA_MSG_NOT_UUID : ka_check_signal(signal);
    if (why)
        return s_refuse(why);
    ka_svc_status_t st;
    ka_guest_req_t *q = s_proc_req(who, sandbox_id, process_id, KA_GUEST_SIGNAL, 0, &st);
    if (!q)
        return st;
    q->signal = signal;
    return s_guest_unary(svc, q, cb, NULL, user);
}

ka_svc_status_t ka_svc_output(ka_service_t *svc, const ka_svc_caller_t *who,
                              const ka_svc_output_args_t *a, ka_svc_frame_cb cb, void *user,
                              krt_addr_t *stream)
{
    ka_svc_status_t st;
    ka_guest_req_t *q = s_proc_req(who, a->sandbox_id, a->process_id, KA_GUEST_OUTPUT, 0, &st);
    if (!q)
        return st;
    const char *why = ka_check_offsets(a->stdout_offset, a->stderr_offset);
    if (why) {
        free(q);
        return s_refuse(why);
    }
    q->stdout_offset = (uint64_t)a->stdout_offset;
    q->stderr_offset = (uint64_t)a->stderr_offset;
    q->follow = a->follow;
    return s_stream(svc, q, cb, user, stream);
}

ka_svc_status_t ka_svc_input_check(const ka_svc_input_args_t *a)
{
    uint64_t proc;
    const char *why =
        s_bad_sandbox(a->sandbox_id) ? KA_MSG_NOT_UUID : ka_check_process_id(a->process_id, &proc);
    return why ? s_refuse(why) : s_ok();
}

ka_svc_status_t ka_svc_input(ka_service_t *svc, const ka_svc_caller_t *who,
                             const ka_svc_input_args_t *a, ka_svc_written_cb cb, void *user)
{
    ka_svc_status_t st;
    ka_guest_req_t *q = s_proc_req(who, a->sandbox_id, a->process_id, KA_GUEST_INPUT, a->len, &st);
    if (!q)
        return st;
    if (a->len)
        memcpy(q->tail, a->data, a->len);
    q->close = a->close;
    return s_guest_unary(svc, q, NULL, cb, user);
}

ka_svc_status_t ka_svc_file_read(ka_service_t *svc, const ka_svc_caller_t *who,
                                 const ka_svc_read_args_t *a, ka_svc_frame_cb cb, void *user,
                                 krt_addr_t *stream)
{
    const char *why = s_bad_sandbox(a->sandbox_id) ? KA_MSG_NOT_UUID : ka_check_path(a->path);
    if (why)
        return s_refuse(why);
    ka_svc_status_t st;
    ka_guest_req_t *q = s_guest_req(who, a->sandbox_id, KA_GUEST_READ, 0, &st);
    if (!q)
        return st;
    s_put(q->path, sizeof q->path, a->path);
    q->mode = a->mode;
    return s_stream(svc, q, cb, user, stream);
}

ka_svc_status_t ka_svc_file_write_check(const ka_svc_write_args_t *a)
{
    const char *why = s_bad_sandbox(a->sandbox_id) ? KA_MSG_NOT_UUID : ka_check_path(a->path);
    if (!why)
        why = ka_check_seek(a->seek_offset);
    if (!why)
        why = ka_check_mode(a->mode);
    return why ? s_refuse(why) : s_ok();
}

ka_svc_status_t ka_svc_file_write(ka_service_t *svc, const ka_svc_caller_t *who,
                                  const ka_svc_write_args_t *a, ka_svc_written_cb cb, void *user)
{
    ka_svc_status_t st = ka_svc_file_write_check(a);
    if (st.err)
        return st;
    ka_guest_req_t *q = s_guest_req(who, a->sandbox_id, KA_GUEST_WRITE, a->len, &st);
    if (!q)
        return st;
    if (a->len)
        memcpy(q->tail, a->data, a->len);
    s_put(q->path, sizeof q->path, a->path);
    q->mode = (uint32_t)a->mode;
    q->seek_offset = (uint64_t)a->seek_offset;
    return s_guest_unary(svc, q, NULL, cb, user);
}
