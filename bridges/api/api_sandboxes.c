/* kagent.api.v1.SandboxService: the sandbox lifecycle. */
#include "api_int.h"

#include <stdlib.h>
#include <string.h>

/* A Sandbox message and everything it points at, filled from a reply (strings borrowed). */
typedef struct {
    Kagent__Api__V1__Sandbox sb;
    Kagent__Api__V1__ResourceReference ref;
    Kagent__Api__V1__Failure failure;
    Kagent__Api__V1__GuestCapabilities guest;
    Google__Protobuf__Timestamp created, updated, expires;
} s_pb_sandbox_t;

static void s_fill(s_pb_sandbox_t *p, ka_store_sandbox_t *r, bool paused)
{
    kagent__api__v1__sandbox__init(&p->sb);
    kagent__api__v1__resource_reference__init(&p->ref);
    kagent__api__v1__guest_capabilities__init(&p->guest);
    p->sb.id = r->id;
    p->sb.creator = r->creator;
    p->ref.namespace_ = r->template_namespace;
    p->ref.name = r->template_name;
    p->sb.sandbox_template = &p->ref;
    p->sb.prepared_revision = r->revision;
    p->sb.state = (Kagent__Api__V1__RuntimeState)r->state;
    p->sb.operation = (Kagent__Api__V1__RuntimeOperation)r->operation;
    if (r->failure_reason[0] || r->failure_message[0]) {
        kagent__api__v1__failure__init(&p->failure);
        p->failure.reason = r->failure_reason;
        p->failure.message = r->failure_message;
        p->sb.failure = &p->failure;
    }
    p->sb.name = r->name;
    p->sb.node = r->node;
    kb_api_ts(&p->created, r->created_ms);
    kb_api_ts(&p->updated, r->updated_ms);
    kb_api_ts(&p->expires, r->expires_ms);
    p->sb.created_at = &p->created;
    p->sb.updated_at = &p->updated;
    p->sb.expires_at = &p->expires;
    bool live = r->state == KA_STATE_READY && !paused;
    p->guest.process_execution = live;
    p->guest.file_access = live;
    p->sb.guest = &p->guest;
}

/* Every lifecycle response is `{ Sandbox sandbox = 1; }` (pause's add `bool paused = 2;`):
 * one shape, many descriptors. */
typedef struct {
    ProtobufCMessage base;
    Kagent__Api__V1__Sandbox *sandbox;
    protobuf_c_boolean paused;
} s_sandbox_response_t;

static const ProtobufCMessageDescriptor *s_response_desc(uint32_t type)
{
    switch (type) {
    case KA_SBX_CREATE:
        return &kagent__api__v1__create_sandbox_response__descriptor;
    case KA_SBX_GET:
        return &kagent__api__v1__get_sandbox_response__descriptor;
    case KA_SBX_SUSPEND:
        return &kagent__api__v1__suspend_sandbox_response__descriptor;
    case KA_SBX_RESUME:
        return &kagent__api__v1__resume_sandbox_response__descriptor;
    case KA_SBX_PAUSE:
        return &kagent__runtime__v1__pause_sandbox_response__descriptor;
    case KA_SBX_UNPAUSE:
        return &kagent__runtime__v1__unpause_sandbox_response__descriptor;
    default:
        return &kagent__api__v1__delete_sandbox_response__descriptor;
    }
}

typedef struct {
    kb_grpc_call_t *call;
    uint32_t type;
} s_ctx_t;

static void s_on_sandbox(void *user, const ka_svc_status_t *st, const ka_svc_sandbox_t *r)
{
    s_ctx_t *c = user;
    if (st->err) {
        kb_api_fail_err(c->call, st);
    } else {
        ka_store_sandbox_t rec = *r->sandbox; /* s_fill borrows mutable strings */
        s_pb_sandbox_t p;
        s_fill(&p, &rec, r->paused);
        s_sandbox_response_t resp = {PROTOBUF_C_MESSAGE_INIT(s_response_desc(c->type)), &p.sb,
                                     r->paused};
        kb_grpc_reply(c->call, &resp.base);
    }
    free(c);
}

static s_ctx_t *s_ctx(kb_grpc_call_t *call, uint32_t type)
{
    s_ctx_t *c = malloc(sizeof *c);
    if (c)
        *c = (s_ctx_t){call, type};
    else
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
    return c;
}

/* Answers a refused start (the callback will not run) and frees c. */
static void s_started(kb_grpc_call_t *call, ka_svc_status_t st, void *c)
{
    if (st.err) {
        kb_api_fail_err(call, &st);
        free(c);
    }
}

static void s_create(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__CreateSandboxRequest *req = (const void *)m;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    const Kagent__Api__V1__ResourceReference *ref = req->sandbox_template;
    ka_svc_create_args_t a = {.request_id = req->request_id,
                              .name = req->name,
                              .template_namespace = ref ? ref->namespace_ : NULL,
                              .template_name = ref ? ref->name : NULL};
    if (req->ttl) { /* a Duration: negative or zero is not a lifetime */
        int64_t ms = req->ttl->seconds * 1000 + req->ttl->nanos / 1000000;
        bool bad = req->ttl->seconds < 0 || req->ttl->nanos < 0 ||
                   (req->ttl->seconds == 0 && req->ttl->nanos == 0);
        a.ttl_ms = bad ? -1 : ms > 0 ? ms : 1; /* sub-millisecond: the range check refuses it */
    }
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    s_ctx_t *c = s_ctx(call, KA_SBX_CREATE);
    if (c)
        s_started(call, ka_svc_create(((kb_api_t *)user)->o.svc, &who, &a, s_on_sandbox, c), c);
}

/* Get, Suspend, Resume, Delete: `{ string sandbox_id = 1; }` requests. */
typedef struct {
    ProtobufCMessage base;
    char *sandbox_id;
} s_id_request_t;

typedef ka_svc_status_t (*s_by_id_fn)(ka_service_t *svc, const ka_svc_caller_t *who, const char *id,
                                      ka_svc_sandbox_cb cb, void *user);

static void s_by_id(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user, uint32_t type,
                    s_by_id_fn op)
{
    const s_id_request_t *req = (const void *)m;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    s_ctx_t *c = s_ctx(call, type);
    if (c)
        s_started(call, op(((kb_api_t *)user)->o.svc, &who, req->sandbox_id, s_on_sandbox, c), c);
}

static void s_get(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_GET, ka_svc_sandbox);
}
static void s_suspend(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_SUSPEND, ka_svc_suspend);
}
static void s_resume(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_RESUME, ka_svc_resume);
}
static void s_pause(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_PAUSE, ka_svc_pause);
}
static void s_unpause(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_UNPAUSE, ka_svc_unpause);
}
static void s_delete(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_DELETE, ka_svc_delete);
}

static void s_on_list(void *user, const ka_svc_status_t *st, const ka_svc_list_t *l)
{
    kb_grpc_call_t *call = user;
    if (st->err) {
        kb_api_fail_err(call, st);
        return;
    }
    ka_store_sandbox_t *copy = malloc((l->count ? l->count : 1) * sizeof *copy);
    s_pb_sandbox_t *pbs = calloc(l->count ? l->count : 1, sizeof *pbs);
    Kagent__Api__V1__Sandbox **ptrs = calloc(l->count ? l->count : 1, sizeof *ptrs);
    if (!copy || !pbs || !ptrs) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
    } else {
        memcpy(copy, l->items, l->count * sizeof *copy); /* s_fill borrows mutable strings */
        for (uint32_t i = 0; i < l->count; i++) {
            s_fill(&pbs[i], &copy[i], false);
            ptrs[i] = &pbs[i].sb;
        }
        Kagent__Api__V1__ListSandboxesResponse resp =
            KAGENT__API__V1__LIST_SANDBOXES_RESPONSE__INIT;
        Kagent__Api__V1__PageResponse page = KAGENT__API__V1__PAGE_RESPONSE__INIT;
        char token[24];
        resp.n_sandboxes = l->count;
        resp.sandboxes = ptrs;
        if (l->more) {
            snprintf(token, sizeof token, "%lld", (long long)l->next_offset);
            page.next_page_token = token;
        }
        resp.page = &page;
        kb_grpc_reply(call, &resp.base);
    }
    free(copy);
    free(pbs);
    free(ptrs);
}

static void s_list(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__ListSandboxesRequest *req = (const void *)m;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    ka_svc_list_args_t a = {0};
    if (req->page) {
        a.limit = req->page->limit;
        a.offset = req->page->offset;
        a.page_token = req->page->page_token;
    }
    if (req->sandbox_template) {
        a.template_namespace = req->sandbox_template->namespace_;
        a.template_name = req->sandbox_template->name;
    }
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    ka_svc_status_t st = ka_svc_list(((kb_api_t *)user)->o.svc, &who, &a, s_on_list, call);
    if (st.err)
        kb_api_fail_err(call, &st);
}

/* ForkSandbox: the forks' records as { repeated Sandbox sandboxes = 1; }. */
static void s_on_fork(void *user, const ka_svc_status_t *st, const ka_svc_list_t *l)
{
    kb_grpc_call_t *call = user;
    if (st->err) {
        kb_api_fail_err(call, st);
        return;
    }
    if (l->count > KA_FORK_MAX) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "the control plane sent too many forks");
        return;
    }
    ka_store_sandbox_t copy[KA_FORK_MAX]; /* s_fill borrows mutable strings */
    s_pb_sandbox_t pbs[KA_FORK_MAX];
    Kagent__Api__V1__Sandbox *ptrs[KA_FORK_MAX];
    memcpy(copy, l->items, l->count * sizeof copy[0]);
    for (uint32_t i = 0; i < l->count; i++) {
        s_fill(&pbs[i], &copy[i], false);
        ptrs[i] = &pbs[i].sb;
    }
    Kagent__Api__V1__ForkSandboxResponse resp = KAGENT__API__V1__FORK_SANDBOX_RESPONSE__INIT;
    resp.n_sandboxes = l->count;
    resp.sandboxes = ptrs;
    kb_grpc_reply(call, &resp.base);
}

static void s_fork(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__ForkSandboxRequest *req = (const void *)m;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    ka_svc_fork_args_t a = {req->sandbox_id, req->request_id, req->count, 0};
    if (req->ttl) { /* present: it must be positive (an explicit 0 is refused) */
        int64_t ms = req->ttl->seconds * 1000 + req->ttl->nanos / 1000000;
        a.ttl_ms = ms > 0 ? ms : req->ttl->seconds > 0 || req->ttl->nanos > 0 ? 1 : -1;
    }
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    ka_svc_status_t st = ka_svc_fork(((kb_api_t *)user)->o.svc, &who, &a, s_on_fork, call);
    if (st.err)
        kb_api_fail_err(call, &st);
}

#define SVC "/kagent.api.v1.SandboxService/"
const kb_grpc_method_t kb_api_sandbox_methods[] = {
    {SVC "CreateSandbox", KB_GRPC_UNARY, &kagent__api__v1__create_sandbox_request__descriptor,
     s_create, NULL, NULL, NULL},
    {SVC "GetSandbox", KB_GRPC_UNARY, &kagent__api__v1__get_sandbox_request__descriptor, s_get,
     NULL, NULL, NULL},
    {SVC "ListSandboxes", KB_GRPC_UNARY, &kagent__api__v1__list_sandboxes_request__descriptor,
     s_list, NULL, NULL, NULL},
    {SVC "SuspendSandbox", KB_GRPC_UNARY, &kagent__api__v1__suspend_sandbox_request__descriptor,
     s_suspend, NULL, NULL, NULL},
    {SVC "ResumeSandbox", KB_GRPC_UNARY, &kagent__api__v1__resume_sandbox_request__descriptor,
     s_resume, NULL, NULL, NULL},
    {SVC "DeleteSandbox", KB_GRPC_UNARY, &kagent__api__v1__delete_sandbox_request__descriptor,
     s_delete, NULL, NULL, NULL},
    /* beyond the reference: our own package */
    {"/kagent.runtime.v1.RuntimeService/PauseSandbox", KB_GRPC_UNARY,
     &kagent__runtime__v1__pause_sandbox_request__descriptor, s_pause, NULL, NULL, NULL},
    {"/kagent.runtime.v1.RuntimeService/UnpauseSandbox", KB_GRPC_UNARY,
     &kagent__runtime__v1__unpause_sandbox_request__descriptor, s_unpause, NULL, NULL, NULL},
    {SVC "ForkSandbox", KB_GRPC_UNARY, &kagent__api__v1__fork_sandbox_request__descriptor, s_fork,
     NULL, NULL, NULL},
};
const size_t kb_api_sandbox_n = sizeof kb_api_sandbox_methods / sizeof kb_api_sandbox_methods[0];
