/* kagent.api.v1.SandboxService: the sandbox lifecycle. */
#include "checks.h"
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

static void s_on_sandbox(void *user, const ka_status_t *st, const void *body, size_t len)
{
    s_ctx_t *c = user;
    if (st->code != KA_OK || len != sizeof(ka_sbx_reply_t)) {
        kb_api_fail(c->call, st);
    } else {
        ka_sbx_reply_t r;
        memcpy(&r, body, sizeof r);
        s_pb_sandbox_t p;
        s_fill(&p, &r.sandbox, r.paused != 0);
        s_sandbox_response_t resp = {PROTOBUF_C_MESSAGE_INIT(s_response_desc(c->type)), &p.sb,
                                     r.paused != 0};
        kb_grpc_reply(c->call, &resp.base);
    }
    free(c);
}

static int s_timeout(kb_grpc_call_t *call)
{
    int64_t left = kb_grpc_call_timeout_ms(call);
    return left < 0 || left > KA_SVC_TIMEOUT_MS ? KA_SVC_TIMEOUT_MS : left > 0 ? (int)left : 1;
}

static void s_send(kb_api_t *api, kb_grpc_call_t *call, uint32_t type, const void *body, size_t len,
                   ka_svc_cb cb)
{
    s_ctx_t *c = malloc(sizeof *c);
    if (!c) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    c->call = call;
    c->type = type;
    if (ka_svc_call(api->o.svc, type, body, len, s_timeout(call), cb, c)) {
        free(c);
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the control plane is not running");
    }
}

static void s_create(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__CreateSandboxRequest *req = (const void *)m;
    ka_sbx_create_t c;
    memset(&c, 0, sizeof c);
    if (kb_api_caller(user, call, c.caller, sizeof c.caller))
        return;
    const char *why = NULL;
    if (!req->sandbox_template || !req->sandbox_template->name[0])
        why = "sandbox_template is required";
    else if ((why = ka_check_request_id(req->request_id)) ||
             (why = ka_check_sandbox_name(req->name)))
        ;
    else if (strlen(req->sandbox_template->namespace_) >= sizeof c.template_namespace ||
             strlen(req->sandbox_template->name) >= sizeof c.template_name)
        why = "sandbox_template namespace or name is too long";
    else if (req->ttl && (req->ttl->seconds < 0 || req->ttl->nanos < 0 ||
                          (req->ttl->seconds == 0 && req->ttl->nanos == 0)))
        why = "ttl must be positive";
    if (why) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, why);
        return;
    }
    snprintf(c.request_id, sizeof c.request_id, "%s", req->request_id);
    snprintf(c.name, sizeof c.name, "%s", req->name);
    snprintf(c.template_namespace, sizeof c.template_namespace, "%s",
             req->sandbox_template->namespace_[0] ? req->sandbox_template->namespace_ : "default");
    snprintf(c.template_name, sizeof c.template_name, "%s", req->sandbox_template->name);
    if (req->ttl) {
        int64_t ms = req->ttl->seconds * 1000 + req->ttl->nanos / 1000000;
        c.ttl_ms = ms > 0 ? ms : 1; /* sub-millisecond: let the range check refuse it */
    }
    s_send(user, call, KA_SBX_CREATE, &c, sizeof c, s_on_sandbox);
}

/* Get, Suspend, Resume, Delete: `{ string sandbox_id = 1; }` requests. */
typedef struct {
    ProtobufCMessage base;
    char *sandbox_id;
} s_id_request_t;

static void s_by_id(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user, uint32_t type)
{
    const s_id_request_t *req = (const void *)m;
    ka_sbx_key_t k;
    memset(&k, 0, sizeof k);
    if (kb_api_caller(user, call, k.caller, sizeof k.caller))
        return;
    if (strlen(req->sandbox_id) >= sizeof k.id || ka_check_uuid(req->sandbox_id)) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, KA_MSG_NOT_UUID);
        return;
    }
    snprintf(k.id, sizeof k.id, "%s", req->sandbox_id);
    s_send(user, call, type, &k, sizeof k, s_on_sandbox);
}

static void s_get(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_GET);
}
static void s_suspend(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_SUSPEND);
}
static void s_resume(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_RESUME);
}
static void s_pause(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_PAUSE);
}
static void s_unpause(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_UNPAUSE);
}
static void s_delete(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_by_id(call, m, user, KA_SBX_DELETE);
}

typedef struct {
    kb_grpc_call_t *call;
    uint32_t type;
    int32_t offset;
} s_list_ctx_t;

static void s_on_list(void *user, const ka_status_t *st, const void *body, size_t len)
{
    s_list_ctx_t *c = user;
    const ka_sbx_list_t *l = body;
    if (st->code != KA_OK || len < sizeof *l || len < sizeof *l + l->count * sizeof l->items[0]) {
        kb_api_fail(c->call, st);
        free(c);
        return;
    }
    ka_sbx_list_t *copy = malloc(len); /* s_fill borrows mutable strings */
    s_pb_sandbox_t *pbs = calloc(l->count ? l->count : 1, sizeof *pbs);
    Kagent__Api__V1__Sandbox **ptrs = calloc(l->count ? l->count : 1, sizeof *ptrs);
    if (!copy || !pbs || !ptrs) {
        kb_grpc_fail(c->call, KB_GRPC_INTERNAL, "out of memory");
    } else {
        memcpy(copy, body, len);
        for (uint32_t i = 0; i < copy->count; i++) {
            s_fill(&pbs[i], &copy->items[i], false);
            ptrs[i] = &pbs[i].sb;
        }
        Kagent__Api__V1__ListSandboxesResponse resp =
            KAGENT__API__V1__LIST_SANDBOXES_RESPONSE__INIT;
        Kagent__Api__V1__PageResponse page = KAGENT__API__V1__PAGE_RESPONSE__INIT;
        char token[16];
        resp.n_sandboxes = copy->count;
        resp.sandboxes = ptrs;
        if (copy->more) {
            snprintf(token, sizeof token, "%d", c->offset + (int32_t)copy->count);
            page.next_page_token = token;
        }
        resp.page = &page;
        kb_grpc_reply(c->call, &resp.base);
    }
    free(copy);
    free(pbs);
    free(ptrs);
    free(c);
}

static void s_list(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__ListSandboxesRequest *req = (const void *)m;
    ka_sbx_list_req_t q;
    memset(&q, 0, sizeof q);
    if (kb_api_caller(user, call, q.caller, sizeof q.caller))
        return;
    if (req->page) {
        q.limit = req->page->limit;
        q.offset = req->page->offset;
        if (req->page->page_token[0]) {
            char *end;
            long v = strtol(req->page->page_token, &end, 10);
            if (*end || v < 0 || v > 1000000000) {
                kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, "page_token is not valid");
                return;
            }
            q.offset = (int32_t)v;
        }
    }
    if (q.limit < 0 || q.limit > 100 || q.offset < 0) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     "page.limit must be between 0 and 100 and page.offset non-negative");
        return;
    }
    if (req->sandbox_template) {
        snprintf(q.template_namespace, sizeof q.template_namespace, "%s",
                 req->sandbox_template->namespace_);
        snprintf(q.template_name, sizeof q.template_name, "%s", req->sandbox_template->name);
    }
    s_list_ctx_t *c = malloc(sizeof *c);
    if (!c) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    *c = (s_list_ctx_t){call, KA_SBX_LIST, q.offset};
    if (ka_svc_call(((kb_api_t *)user)->o.svc, KA_SBX_LIST, &q, sizeof q, 0, s_on_list, c)) {
        free(c);
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the control plane is not running");
    }
}

/* ForkSandbox: the forks' records (a ka_sbx_list_t) as { repeated Sandbox sandboxes = 1; }. */
static void s_on_fork(void *user, const ka_status_t *st, const void *body, size_t len)
{
    kb_grpc_call_t *call = user;
    const ka_sbx_list_t *l = body;
    if (st->code != KA_OK || len < sizeof *l || l->count > KA_FORK_MAX ||
        len != sizeof *l + l->count * sizeof l->items[0]) {
        kb_api_fail(call, st);
        return;
    }
    ka_sbx_list_t *copy = malloc(len); /* s_fill borrows mutable strings */
    s_pb_sandbox_t pbs[KA_FORK_MAX];
    Kagent__Api__V1__Sandbox *ptrs[KA_FORK_MAX];
    if (!copy) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    memcpy(copy, body, len);
    for (uint32_t i = 0; i < copy->count; i++) {
        s_fill(&pbs[i], &copy->items[i], false);
        ptrs[i] = &pbs[i].sb;
    }
    Kagent__Api__V1__ForkSandboxResponse resp = KAGENT__API__V1__FORK_SANDBOX_RESPONSE__INIT;
    resp.n_sandboxes = copy->count;
    resp.sandboxes = ptrs;
    kb_grpc_reply(call, &resp.base);
    free(copy);
}

static void s_fork(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__ForkSandboxRequest *req = (const void *)m;
    ka_sbx_fork_t f;
    memset(&f, 0, sizeof f);
    if (kb_api_caller(user, call, f.caller, sizeof f.caller))
        return;
    const char *why = NULL;
    if (strlen(req->sandbox_id) >= sizeof f.id || ka_check_uuid(req->sandbox_id))
        why = KA_MSG_NOT_UUID;
    else if ((why = ka_check_request_id(req->request_id)))
        ;
    else if (req->count < 0 || req->count > KA_FORK_MAX)
        why = "count must be between 1 and 16";
    else if (req->ttl && (req->ttl->seconds < 0 || req->ttl->nanos < 0 ||
                          (req->ttl->seconds == 0 && req->ttl->nanos == 0)))
        why = "ttl must be positive";
    if (why) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, why);
        return;
    }
    snprintf(f.id, sizeof f.id, "%s", req->sandbox_id);
    snprintf(f.request_id, sizeof f.request_id, "%s", req->request_id);
    f.count = req->count ? req->count : 1;
    if (req->ttl) {
        int64_t ms = req->ttl->seconds * 1000 + req->ttl->nanos / 1000000;
        f.ttl_ms = ms > 0 ? ms : 1;
    }
    if (ka_svc_call(((kb_api_t *)user)->o.svc, KA_SBX_FORK, &f, sizeof f, s_timeout(call),
                    s_on_fork, call))
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the control plane is not running");
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
