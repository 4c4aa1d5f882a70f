/* kagent.api.v1.SandboxTemplateService: apply, list, get, delete templates. */
#include "api_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"
#include "template_doc.h"

/* One SandboxTemplate message and what it owns. */
typedef struct {
    Kagent__Api__V1__SandboxTemplate t;
    Kagent__Api__V1__ResourceReference ref;
    Kagent__Api__V1__StructuredObject res;
    ProtobufCMessage *value; /* google.protobuf.Struct, owned */
    Kagent__Api__V1__Condition cond;
    Kagent__Api__V1__Condition *conds[1];
    json_t *status; /* owned: condition strings point into it */
    char *image;    /* owned */
} s_pb_template_t;

static void s_pb_free(s_pb_template_t *p)
{
    if (p->value)
        protobuf_c_message_free_unpacked(p->value, NULL);
    json_decref(p->status);
    free(p->image);
}

/* The whole object as the original serves it: apiVersion, kind, metadata, spec, status. */
static json_t *s_object(const ka_store_template_t *t, json_t *spec, json_t *status)
{
    char created[48];
    kb_pbjson_format_timestamp(t->created_ms / 1000, 0, created, sizeof created);
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:s, s:I, s:s}, s:O, s:O}", "apiVersion",
                     KA_TEMPLATE_API_VERSION, "kind", KA_TEMPLATE_KIND, "metadata", "name", t->name,
                     "namespace", t->namespace_, "uid", t->uid, "generation",
                     (json_int_t)t->generation, "creationTimestamp", created, "spec", spec,
                     "status", status);
}

static void s_fill(s_pb_template_t *p, const ka_store_template_t *t)
{
    memset(p, 0, sizeof *p);
    kagent__api__v1__sandbox_template__init(&p->t);
    kagent__api__v1__resource_reference__init(&p->ref);
    kagent__api__v1__structured_object__init(&p->res);
    p->ref.namespace_ = (char *)t->namespace_;
    p->ref.name = (char *)t->name;
    p->t.ref = &p->ref;
    json_t *spec = json_loads(ka_store_template_spec(t), 0, NULL);
    p->status = json_loads(ka_store_template_status(t), 0, NULL);
    if (!p->status)
        p->status = json_object();
    const char *image = NULL;
    json_unpack(spec, "{s:{s:s}}", "workload", "image", &image);
    p->image = strdup(image ? image : "");
    p->t.workload_image = p->image;
    p->t.generation = t->generation;
    p->t.observed_generation = t->observed_generation;
    p->t.prepared_revision = (char *)t->latest_revision;
    json_t *c = json_array_get(json_object_get(p->status, "conditions"), 0);
    if (c) {
        kagent__api__v1__condition__init(&p->cond);
        p->cond.type = (char *)(json_string_value(json_object_get(c, "type")) ?: "Ready");
        p->cond.status = (char *)(json_string_value(json_object_get(c, "status")) ?: "Unknown");
        p->cond.reason = (char *)(json_string_value(json_object_get(c, "reason")) ?: "");
        p->cond.message = (char *)(json_string_value(json_object_get(c, "message")) ?: "");
        p->cond.observed_generation = json_integer_value(json_object_get(c, "observedGeneration"));
        p->conds[0] = &p->cond;
        p->t.n_conditions = 1;
        p->t.conditions = p->conds;
    }
    json_t *obj = s_object(t, spec ? spec : json_object(), p->status);
    char err[128];
    if (obj && kb_pbjson_from_json(&google__protobuf__struct__descriptor, obj, 0, &p->value, err,
                                   sizeof err) == 0) {
        p->res.api_version = KA_TEMPLATE_API_VERSION;
        p->res.kind = KA_TEMPLATE_KIND;
        p->res.value = (Google__Protobuf__Struct *)p->value;
        p->t.resource = &p->res;
    }
    json_decref(obj);
    json_decref(spec);
}

typedef struct {
    kb_grpc_call_t *call;
    uint32_t type;
} s_ctx_t;

/* Replies from the templates actor: a status and the store's template records. */
static void s_on_templates(void *user, const ka_svc_status_t *st, const ka_svc_templates_t *t)
{
    s_ctx_t *c = user;
    if (st->err) {
        kb_api_fail_err(c->call, st);
        free(c);
        return;
    }
    const ka_store_blob_t *blob = t->blob;
    size_t blen = t->blob_len;
    size_t n = blob->count;
    s_pb_template_t *pbs = calloc(n ? n : 1, sizeof *pbs);
    Kagent__Api__V1__SandboxTemplate **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    size_t i = 0;
    for (const ka_store_template_t *r = ka_store_blob_next(blob, blen, NULL);
         r && pbs && ptrs && i < n; r = ka_store_blob_next(blob, blen, r), i++) {
        s_fill(&pbs[i], r);
        ptrs[i] = &pbs[i].t;
    }
    if (!pbs || !ptrs) {
        kb_grpc_fail(c->call, KB_GRPC_INTERNAL, "out of memory");
    } else if (c->type == KA_TPL_LIST) {
        Kagent__Api__V1__ListSandboxTemplatesResponse resp =
            KAGENT__API__V1__LIST_SANDBOX_TEMPLATES_RESPONSE__INIT;
        resp.n_sandbox_templates = i;
        resp.sandbox_templates = ptrs;
        kb_grpc_reply(c->call, &resp.base);
    } else if (c->type == KA_TPL_DELETE) {
        Kagent__Api__V1__DeleteSandboxTemplateResponse resp =
            KAGENT__API__V1__DELETE_SANDBOX_TEMPLATE_RESPONSE__INIT;
        kb_grpc_reply(c->call, &resp.base);
    } else if (i == 0) {
        kb_grpc_fail(c->call, KB_GRPC_NOT_FOUND, "sandbox template not found");
    } else if (c->type == KA_TPL_GET) {
        Kagent__Api__V1__GetSandboxTemplateResponse resp =
            KAGENT__API__V1__GET_SANDBOX_TEMPLATE_RESPONSE__INIT;
        resp.sandbox_template = ptrs[0];
        kb_grpc_reply(c->call, &resp.base);
    } else {
        Kagent__Api__V1__CreateSandboxTemplateResponse resp =
            KAGENT__API__V1__CREATE_SANDBOX_TEMPLATE_RESPONSE__INIT;
        resp.sandbox_template = ptrs[0];
        kb_grpc_reply(c->call, &resp.base);
    }
    for (size_t k = 0; pbs && k < i; k++)
        s_pb_free(&pbs[k]);
    free(pbs);
    free(ptrs);
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
static void s_started(kb_grpc_call_t *call, ka_svc_status_t st, s_ctx_t *c)
{
    if (st.err) {
        kb_api_fail_err(call, &st);
        free(c);
    }
}

static void s_list(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__ListSandboxTemplatesRequest *req = (const void *)m;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    s_ctx_t *c = s_ctx(call, KA_TPL_LIST);
    if (c)
        s_started(call,
                  ka_svc_template_list(((kb_api_t *)user)->o.svc, &who, req->namespace_,
                                       s_on_templates, c),
                  c);
}

static void s_get_or_delete(kb_grpc_call_t *call, const Kagent__Api__V1__ResourceReference *ref,
                            void *user, uint32_t type)
{
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    ka_svc_tpl_ref_t r = {ref ? ref->namespace_ : NULL, ref ? ref->name : ""};
    ka_service_t *svc = ((kb_api_t *)user)->o.svc;
    s_ctx_t *c = s_ctx(call, type);
    if (c)
        s_started(call,
                  type == KA_TPL_GET ? ka_svc_template_get(svc, &who, &r, s_on_templates, c)
                                     : ka_svc_template_delete(svc, &who, &r, s_on_templates, c),
                  c);
}

static void s_get(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_get_or_delete(call, ((const Kagent__Api__V1__GetSandboxTemplateRequest *)m)->ref, user,
                    KA_TPL_GET);
}

static void s_delete(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    s_get_or_delete(call, ((const Kagent__Api__V1__DeleteSandboxTemplateRequest *)m)->ref, user,
                    KA_TPL_DELETE);
}

/* The document to apply: the request's YAML, or its StructuredObject as JSON (JSON is YAML).
 * Caller frees; NULL after answering. */
static char *s_document(kb_grpc_call_t *call,
                        const Kagent__Api__V1__CreateSandboxTemplateRequest *req)
{
    if (req->yaml[0])
        return strdup(req->yaml);
    if (!req->resource || !req->resource->value) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     "a SandboxTemplate is required (yaml or resource)");
        return NULL;
    }
    json_t *obj = kb_pbjson_to_json(&req->resource->value->base, 0);
    const char *api = json_string_value(json_object_get(obj, "apiVersion"));
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    if (strcmp(req->resource->api_version, KA_TEMPLATE_API_VERSION) ||
        strcmp(req->resource->kind, KA_TEMPLATE_KIND)) {
        json_decref(obj);
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     "sandbox_template.resource_type: the resource must be a SandboxTemplate "
                     "of " KA_TEMPLATE_API_VERSION);
        return NULL;
    }
    if ((api && strcmp(api, req->resource->api_version)) ||
        (kind && strcmp(kind, req->resource->kind))) {
        json_decref(obj);
        kb_grpc_fail(
            call, KB_GRPC_INVALID_ARGUMENT,
            "sandbox_template.type_metadata_matches: apiVersion and kind must match the envelope");
        return NULL;
    }
    json_object_set_new(obj, "apiVersion", json_string(KA_TEMPLATE_API_VERSION));
    json_object_set_new(obj, "kind", json_string(KA_TEMPLATE_KIND));
    char *text = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    return text;
}

static void s_apply(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Api__V1__CreateSandboxTemplateRequest *req = (const void *)m;
    char caller[KB_AUTH_ID_MAX + 1];
    if (kb_api_caller(user, call, caller, sizeof caller))
        return;
    char *doc = s_document(call, req);
    if (!doc)
        return;
    ka_svc_caller_t who = {caller, kb_api_timeout(call)};
    ka_svc_tpl_ref_t r = {req->ref ? req->ref->namespace_ : NULL, req->ref ? req->ref->name : ""};
    s_ctx_t *c = s_ctx(call, KA_TPL_APPLY);
    if (c)
        s_started(call,
                  ka_svc_template_apply(((kb_api_t *)user)->o.svc, &who, &r, doc, strlen(doc),
                                        s_on_templates, c),
                  c);
    free(doc);
}

#define SVC "/kagent.api.v1.SandboxTemplateService/"
const kb_grpc_method_t kb_api_template_methods[] = {
    {SVC "ListSandboxTemplates", KB_GRPC_UNARY,
     &kagent__api__v1__list_sandbox_templates_request__descriptor, s_list, NULL, NULL, NULL},
    {SVC "CreateSandboxTemplate", KB_GRPC_UNARY,
     &kagent__api__v1__create_sandbox_template_request__descriptor, s_apply, NULL, NULL, NULL},
    {SVC "GetSandboxTemplate", KB_GRPC_UNARY,
     &kagent__api__v1__get_sandbox_template_request__descriptor, s_get, NULL, NULL, NULL},
    {SVC "DeleteSandboxTemplate", KB_GRPC_UNARY,
     &kagent__api__v1__delete_sandbox_template_request__descriptor, s_delete, NULL, NULL, NULL},
};
const size_t kb_api_template_n = sizeof kb_api_template_methods / sizeof kb_api_template_methods[0];
