/*
 * Sandbox lifecycle commands: create, list, get, suspend, resume, delete (SandboxService), and
 * pause, unpause (RuntimeService), fork (SandboxService): beyond the reference.
 */
#include "cli_int.h"

#include <stdlib.h>
#include <string.h>

#include "google/protobuf/duration.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"
#include "kagent/runtime/v1/runtime.pb-c.h"
#include "pbjson.h"

#define S_TTL_MIN_NS (1LL * KB_NS_PER_SEC)
#define S_TTL_MAX_NS (24LL * 3600 * KB_NS_PER_SEC)

static const char s_lifecycle_long[] =
    "Mutations make a single lifecycle attempt: on a transient error, retry the same mutation.\n"
    "get only observes. suspend can interrupt running work. delete removes the sandbox's files.";

void kb_print_sandboxes(FILE *out, Kagent__Api__V1__Sandbox *const *sbs, size_t n)
{
    kb_table_t *t = kb_table_new(7);
    if (!t)
        return;
    const char *hdr[] = {"ID", "TEMPLATE", "STATE", "OPERATION", "NODE", "EXPIRES", "FAILURE"};
    kb_table_add(t, hdr);
    for (size_t i = 0; i < n; i++) {
        const Kagent__Api__V1__Sandbox *s = sbs[i];
        char tmpl[320] = "", expires[48];
        if (s->sandbox_template)
            snprintf(tmpl, sizeof tmpl, "%s/%s", s->sandbox_template->namespace_,
                     s->sandbox_template->name);
        kb_fmt_time((const ProtobufCMessage *)s->expires_at, expires, sizeof expires);
        const ProtobufCEnumValue *st = protobuf_c_enum_descriptor_get_value(
            &kagent__api__v1__runtime_state__descriptor, (int)s->state);
        const ProtobufCEnumValue *op = protobuf_c_enum_descriptor_get_value(
            &kagent__api__v1__runtime_operation__descriptor, (int)s->operation);
        char stn[24], opn[24];
        snprintf(stn, sizeof stn, "%d", (int)s->state);
        snprintf(opn, sizeof opn, "%d", (int)s->operation);
        const char *row[] = {s->id,
                             tmpl,
                             st ? st->name : stn,
                             op ? op->name : opn,
                             s->node,
                             expires,
                             s->failure ? s->failure->message : ""};
        kb_table_add(t, row);
    }
    kb_table_print(t, out);
    kb_table_destroy(&t);
}

/* Prints one sandbox (table row or JSON of the Sandbox itself, so `jq .id` works). */
static int s_print_one(kb_cli_t *cli, Kagent__Api__V1__Sandbox *sb)
{
    if (cli->json)
        return kb_cli_print(cli, &sb->base);
    kb_print_sandboxes(cli->out, &sb, 1);
    return KB_EXIT_OK;
}

/* ------------------------------------------------------------------------------------------ */

/* --ttl as a Duration: 0, or -1 when it is outside 1s..24h. */
static int s_ttl(const kb_args_t *a, Google__Protobuf__Duration *ttl)
{
    int64_t ns = kb_args_duration(a, "ttl");
    if (ns < S_TTL_MIN_NS || ns > S_TTL_MAX_NS)
        return -1;
    ttl->seconds = ns / KB_NS_PER_SEC;
    ttl->nanos = (int32_t)(ns % KB_NS_PER_SEC);
    return 0;
}

static int s_run_create(kb_cli_t *cli, const kb_args_t *a)
{
    const char *request_id = kb_args_str(a, "request-id");
    if (!*request_id)
        return kb_cli_usage(cli, "request-id must not be empty");
    Google__Protobuf__Duration ttl = GOOGLE__PROTOBUF__DURATION__INIT;
    bool has_ttl = kb_args_given(a, "ttl");
    if (has_ttl && s_ttl(a, &ttl))
        return kb_cli_usage(cli, "ttl must be between 1s and 24h");
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = (char *)cli->namespace_;
    ref.name = (char *)a->pos[0];
    Kagent__Api__V1__CreateSandboxRequest req = KAGENT__API__V1__CREATE_SANDBOX_REQUEST__INIT;
    req.sandbox_template = &ref;
    req.request_id = (char *)request_id;
    req.name = (char *)kb_args_str(a, "name");
    req.ttl = has_ttl ? &ttl : NULL;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/kagent.api.v1.SandboxService/CreateSandbox", NULL, &req.base,
                     &kagent__api__v1__create_sandbox_response__descriptor, &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli,
                           "create sandbox (retry with request-id \"%s\" and identical inputs): %s",
                           request_id, cause);
    }
    Kagent__Api__V1__CreateSandboxResponse *r = (Kagent__Api__V1__CreateSandboxResponse *)resp;
    int rc = r->sandbox ? s_print_one(cli, r->sandbox)
                        : kb_cli_fail(cli,
                                      "create sandbox (retry with request-id \"%s\" and identical "
                                      "inputs): server returned no sandbox",
                                      request_id);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static const kb_flag_t s_create_flags[] = {
    {"request-id", 0, KB_F_STRING, NULL,
     "stable idempotency key; reuse it with identical inputs when retrying (required)", "string"},
    {"name", 0, KB_F_STRING, NULL, "display name", "string"},
    {"ttl", 0, KB_F_DURATION, NULL, "lifetime (1s..24h); the operator policy applies if omitted",
     "duration"},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_create = {
    .name = "create",
    .use = "create TEMPLATE --request-id ID",
    .short_help = "Create a sandbox from a prepared template",
    .long_help = "Create a sandbox from a prepared template.\n\nEach call makes one lifecycle "
                 "attempt; retry with the same --request-id and identical inputs.\nActivity does "
                 "not extend the TTL.",
    .flags = s_create_flags,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_create,
};

/* ------------------------------------------------------------------------------------------ */

static int s_run_list(kb_cli_t *cli, const kb_args_t *a)
{
    int64_t size = kb_args_int(a, "page-size");
    if (size < 0 || size > 100)
        return kb_cli_usage(cli, "page-size must be between 0 and 100");
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__PageRequest page = KAGENT__API__V1__PAGE_REQUEST__INIT;
    page.limit = (int32_t)size;
    page.page_token = (char *)kb_args_str(a, "page-token");
    Kagent__Api__V1__ListSandboxesRequest req = KAGENT__API__V1__LIST_SANDBOXES_REQUEST__INIT;
    req.page = &page;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/kagent.api.v1.SandboxService/ListSandboxes", NULL, &req.base,
                     &kagent__api__v1__list_sandboxes_response__descriptor, &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "list sandboxes: %s", cause);
    }
    Kagent__Api__V1__ListSandboxesResponse *r = (Kagent__Api__V1__ListSandboxesResponse *)resp;
    int rc = KB_EXIT_OK;
    if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        kb_print_sandboxes(cli->out, r->sandboxes, r->n_sandboxes);
        if (r->page && r->page->next_page_token[0])
            fprintf(cli->err, "Next page: --page-token %s\n", r->page->next_page_token);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static const kb_flag_t s_list_flags[] = {
    {"page-size", 0, KB_F_INT, "0", "maximum number of sandboxes (0 = server default)", "int32"},
    {"page-token", 0, KB_F_STRING, NULL, "continuation token", "string"},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_list = {
    .name = "list",
    .use = "list",
    .short_help = "List your sandboxes",
    .flags = s_list_flags,
    .min_args = 0,
    .max_args = 0,
    .run = s_run_list,
};

/* Structured output of get: the Sandbox with its phase timings under "phaseTimings" (from
 * RuntimeService.GetSandboxTimings; left out when the server cannot say, e.g. an older one). */
static int s_print_timed(kb_cli_t *cli, Kagent__Api__V1__Sandbox *sb)
{
    json_t *doc = kb_pbjson_to_json(&sb->base, 0);
    if (!doc)
        return kb_cli_fail(cli, "cannot render the output");
    Kagent__Runtime__V1__GetSandboxTimingsRequest req =
        KAGENT__RUNTIME__V1__GET_SANDBOX_TIMINGS_REQUEST__INIT;
    req.sandbox_id = sb->id;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(cli->rpc, "/kagent.runtime.v1.RuntimeService/GetSandboxTimings", NULL,
                     &req.base, &kagent__runtime__v1__get_sandbox_timings_response__descriptor,
                     &resp, &st) == 0) {
        Kagent__Runtime__V1__GetSandboxTimingsResponse *r = (void *)resp;
        if (r->timings)
            json_object_set_new(doc, "phaseTimings", kb_pbjson_to_json(&r->timings->base, 0));
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    int rc = kb_cli_print_json(cli, doc);
    json_decref(doc);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* get / suspend / resume / delete / pause / unpause: { sandbox_id } -> { sandbox [, paused] } */

typedef struct {
    const char *action;
    const char *method;
    const ProtobufCMessageDescriptor *req_desc;
    const ProtobufCMessageDescriptor *resp_desc;
} s_simple_t;

static const s_simple_t s_simple[] = {
    {"get", "/kagent.api.v1.SandboxService/GetSandbox",
     &kagent__api__v1__get_sandbox_request__descriptor,
     &kagent__api__v1__get_sandbox_response__descriptor},
    {"suspend", "/kagent.api.v1.SandboxService/SuspendSandbox",
     &kagent__api__v1__suspend_sandbox_request__descriptor,
     &kagent__api__v1__suspend_sandbox_response__descriptor},
    {"resume", "/kagent.api.v1.SandboxService/ResumeSandbox",
     &kagent__api__v1__resume_sandbox_request__descriptor,
     &kagent__api__v1__resume_sandbox_response__descriptor},
    {"delete", "/kagent.api.v1.SandboxService/DeleteSandbox",
     &kagent__api__v1__delete_sandbox_request__descriptor,
     &kagent__api__v1__delete_sandbox_response__descriptor},
    {"pause", "/kagent.runtime.v1.RuntimeService/PauseSandbox",
     &kagent__runtime__v1__pause_sandbox_request__descriptor,
     &kagent__runtime__v1__pause_sandbox_response__descriptor},
    {"unpause", "/kagent.runtime.v1.RuntimeService/UnpauseSandbox",
     &kagent__runtime__v1__unpause_sandbox_request__descriptor,
     &kagent__runtime__v1__unpause_sandbox_response__descriptor},
};

/* All these requests are { string sandbox_id = 1; } and responses { Sandbox sandbox = 1; }
 * (pause's add `bool paused = 2;`), so one generic path builds and reads them through their
 * descriptors. */
static int s_run_simple(kb_cli_t *cli, const kb_args_t *a, const s_simple_t *op)
{
    const char *id = a->pos[0];
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    /* Every request type is a struct { base; char *sandbox_id; }. */
    Kagent__Api__V1__GetSandboxRequest req = KAGENT__API__V1__GET_SANDBOX_REQUEST__INIT;
    req.base.descriptor = op->req_desc;
    req.sandbox_id = (char *)id;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    char label[96];
    snprintf(label, sizeof label, "%s %s", op->action, id);
    bool slow = op == &s_simple[1] || op == &s_simple[2]; /* the snapshot transfers */
    kb_ticker_t *tick = slow ? kb_ticker_start(cli, label) : NULL;
    int urc = kb_rpc_unary(rpc, op->method, NULL, &req.base, op->resp_desc, &resp, &st);
    kb_ticker_stop(&tick, urc == 0);
    if (urc != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "%s sandbox %s: %s", op->action, id, cause);
    }
    Kagent__Api__V1__Sandbox *sb = ((Kagent__Api__V1__GetSandboxResponse *)resp)->sandbox;
    bool pause = op >= &s_simple[4];
    int rc = !sb                               ? kb_cli_fail(cli, "server returned no sandbox")
             : cli->json && op == &s_simple[0] ? s_print_timed(cli, sb)
             : cli->json && pause              ? kb_cli_print(cli, resp)
                                               : s_print_one(cli, sb);
    if (sb && pause && !cli->json)
        fprintf(cli->out, "paused: %s\n",
                ((Kagent__Runtime__V1__PauseSandboxResponse *)resp)->paused ? "yes" : "no");
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_get(kb_cli_t *cli, const kb_args_t *a)
{
    return s_run_simple(cli, a, &s_simple[0]);
}

static int s_run_suspend(kb_cli_t *cli, const kb_args_t *a)
{
    return s_run_simple(cli, a, &s_simple[1]);
}

static int s_run_resume(kb_cli_t *cli, const kb_args_t *a)
{
    return s_run_simple(cli, a, &s_simple[2]);
}

static int s_run_delete(kb_cli_t *cli, const kb_args_t *a)
{
    return s_run_simple(cli, a, &s_simple[3]);
}

static int s_run_pause(kb_cli_t *cli, const kb_args_t *a)
{
    return s_run_simple(cli, a, &s_simple[4]);
}

static int s_run_unpause(kb_cli_t *cli, const kb_args_t *a)
{
    return s_run_simple(cli, a, &s_simple[5]);
}

const kb_cmd_t kb_cmd_sandbox_get = {
    .name = "get",
    .use = "get ID",
    .short_help = "get a sandbox",
    .long_help = s_lifecycle_long,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_get,
};
const kb_cmd_t kb_cmd_sandbox_suspend = {
    .name = "suspend",
    .use = "suspend ID",
    .short_help = "suspend a sandbox",
    .long_help = s_lifecycle_long,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_suspend,
};
const kb_cmd_t kb_cmd_sandbox_resume = {
    .name = "resume",
    .use = "resume ID",
    .short_help = "resume a sandbox",
    .long_help = s_lifecycle_long,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_resume,
};
const kb_cmd_t kb_cmd_sandbox_delete = {
    .name = "delete",
    .use = "delete ID",
    .short_help = "delete a sandbox",
    .long_help = s_lifecycle_long,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_delete,
};
const kb_cmd_t kb_cmd_sandbox_pause = {
    .name = "pause",
    .use = "pause ID",
    .short_help = "freeze a sandbox's processes (memory kept, no CPU; the TTL runs on)",
    .long_help = s_lifecycle_long,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_pause,
};
const kb_cmd_t kb_cmd_sandbox_unpause = {
    .name = "unpause",
    .use = "unpause ID",
    .short_help = "thaw a paused sandbox",
    .long_help = s_lifecycle_long,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_unpause,
};

/* ------------------------------------------------------------------------------------------ */

static int s_run_fork(kb_cli_t *cli, const kb_args_t *a)
{
    const char *id = a->pos[0], *request_id = kb_args_str(a, "request-id");
    if (!*request_id)
        return kb_cli_usage(cli, "request-id must not be empty");
    int64_t count = kb_args_given(a, "count") ? kb_args_int(a, "count") : 1;
    if (count < 1 || count > 16)
        return kb_cli_usage(cli, "count must be between 1 and 16");
    Google__Protobuf__Duration ttl = GOOGLE__PROTOBUF__DURATION__INIT;
    bool has_ttl = kb_args_given(a, "ttl");
    if (has_ttl && s_ttl(a, &ttl))
        return kb_cli_usage(cli, "ttl must be between 1s and 24h");
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__ForkSandboxRequest req = KAGENT__API__V1__FORK_SANDBOX_REQUEST__INIT;
    req.sandbox_id = (char *)id;
    req.request_id = (char *)request_id;
    req.count = (int32_t)count;
    req.ttl = has_ttl ? &ttl : NULL;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    char label[96];
    snprintf(label, sizeof label, "fork %s", id);
    kb_ticker_t *tick = kb_ticker_start(cli, label);
    int urc = kb_rpc_unary(rpc, "/kagent.api.v1.SandboxService/ForkSandbox", NULL, &req.base,
                           &kagent__api__v1__fork_sandbox_response__descriptor, &resp, &st);
    kb_ticker_stop(&tick, urc == 0);
    if (urc != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "fork sandbox %s (retry with request-id \"%s\"): %s", id,
                           request_id, cause);
    }
    Kagent__Api__V1__ForkSandboxResponse *r = (Kagent__Api__V1__ForkSandboxResponse *)resp;
    int rc = KB_EXIT_OK;
    if (cli->json)
        rc = kb_cli_print(cli, resp);
    else
        kb_print_sandboxes(cli->out, r->sandboxes, r->n_sandboxes);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static const kb_flag_t s_fork_flags[] = {
    {"request-id", 0, KB_F_STRING, NULL,
     "stable idempotency key; a retry with it returns the same forks (required)", "string"},
    {"count", 0, KB_F_INT, NULL, "forks to make (1..16, default 1)", "int"},
    {"ttl", 0, KB_F_DURATION, NULL,
     "each fork's lifetime (1s..24h); the operator policy applies "
     "if omitted",
     "duration"},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_fork = {
    .name = "fork",
    .use = "fork ID --request-id R [--count N] [--ttl D]",
    .short_help = "copy a running sandbox (its /data and root changes) into new sandboxes",
    .long_help = "New sandboxes of the source's revision whose /data and root changes are a copy "
                 "of the source's at the call; the source is frozen while it is copied and goes "
                 "on after. Each fork is yours, with its own TTL. Retry with the same "
                 "--request-id: it returns the same forks.",
    .flags = s_fork_flags,
    .min_args = 1,
    .max_args = 1,
    .run = s_run_fork,
};
