/*
 * Template commands (SandboxTemplateService): `sandbox templates`, `apply -f FILE|-`,
 * `get template NAME`, `get sandboxtemplate|sandboxtemplates|st [NAME]` (kubectl's shape),
 * `delete template NAME`.
 */
#include "cli_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ka_yaml.h"
#include "kagent/api/v1/sandbox_templates.pb-c.h"
#include "pbjson.h"

#define S_APPLY_MAX (4u << 20) /* same cap as the YAML parser */
#define S_KIND      "sandboxtemplate.api.kagent.dev"

static void s_cause(const kb_rpc_status_t *st, char *buf, size_t cap)
{
    kb_cli_cause(st, buf, cap);
}

/* ------------------------------------------------------------------------------------------ */

static int s_run_templates(kb_cli_t *cli, const kb_args_t *a)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__ListSandboxTemplatesRequest req =
        KAGENT__API__V1__LIST_SANDBOX_TEMPLATES_REQUEST__INIT;
    req.namespace_ = (char *)cli->namespace_;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    char cause[KB_RPC_MSG_CAP + 64];
    if (kb_rpc_unary(rpc, "/kagent.api.v1.SandboxTemplateService/ListSandboxTemplates", NULL,
                     &req.base, &kagent__api__v1__list_sandbox_templates_response__descriptor,
                     &resp, &st) != 0) {
        s_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "list sandbox templates: %s", cause);
    }
    int rc = KB_EXIT_OK;
    if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        Kagent__Api__V1__ListSandboxTemplatesResponse *r =
            (Kagent__Api__V1__ListSandboxTemplatesResponse *)resp;
        kb_table_t *t = kb_table_new(3);
        const char *hdr[] = {"NAMESPACE", "NAME", "IMAGE"};
        if (t)
            kb_table_add(t, hdr);
        for (size_t i = 0; t && i < r->n_sandbox_templates; i++) {
            const Kagent__Api__V1__SandboxTemplate *tp = r->sandbox_templates[i];
            const char *row[] = {tp->ref ? tp->ref->namespace_ : "", tp->ref ? tp->ref->name : "",
                                 tp->workload_image};
            kb_table_add(t, row);
        }
        if (t)
            kb_table_print(t, cli->out);
        kb_table_destroy(&t);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

const kb_cmd_t kb_cmd_sandbox_templates = {
    .name = "templates",
    .use = "templates",
    .short_help = "List SandboxTemplates in the selected namespace",
    .min_args = 0,
    .max_args = 0,
    .run = s_run_templates,
};

/* ------------------------------------------------------------------------------------------ */

/* Reads path ("-" = stdin) up to S_APPLY_MAX bytes. Returns a malloc'd NUL-terminated buffer or
 * NULL with errno set (EFBIG when too large). */
static char *s_slurp(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = (size_t)64 << 10, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (cap >= S_APPLY_MAX) {
                free(buf);
                buf = NULL;
                errno = EFBIG;
                break;
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                free(buf);
                buf = NULL;
                errno = EIO;
            }
            break;
        }
    }
    if (f != stdin)
        fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

static const char *s_scalar(const ka_yaml_node_t *map, const char *key)
{
    const ka_yaml_node_t *n = map ? ka_yaml_get(map, key) : NULL;
    return n && n->kind == KA_YAML_SCALAR && !ka_yaml_is_null(n) ? n->value : NULL;
}

static const Kagent__Api__V1__Condition *s_ready(const Kagent__Api__V1__SandboxTemplate *tp)
{
    const Kagent__Api__V1__Condition *ready = NULL;
    for (size_t i = 0; i < tp->n_conditions; i++)
        if (strcmp(tp->conditions[i]->type, "Ready") == 0)
            ready = tp->conditions[i];
    return ready;
}

/* Prints templates as a table: NAMESPACE NAME READY REASON IMAGE MESSAGE. */
static int s_template_table(kb_cli_t *cli, Kagent__Api__V1__SandboxTemplate *const *tps, size_t n)
{
    kb_table_t *t = kb_table_new(6);
    if (!t)
        return kb_cli_fail(cli, "out of memory");
    const char *hdr[] = {"NAMESPACE", "NAME", "READY", "REASON", "IMAGE", "MESSAGE"};
    kb_table_add(t, hdr);
    for (size_t i = 0; i < n; i++) {
        const Kagent__Api__V1__Condition *ready = s_ready(tps[i]);
        const char *row[] = {tps[i]->ref ? tps[i]->ref->namespace_ : "",
                             tps[i]->ref ? tps[i]->ref->name : "",
                             ready ? ready->status : "Unknown",
                             ready ? ready->reason : "",
                             tps[i]->workload_image,
                             ready ? ready->message : ""};
        kb_table_add(t, row);
    }
    kb_table_print(t, cli->out);
    kb_table_destroy(&t);
    return KB_EXIT_OK;
}

/* Prints a template: JSON of the SandboxTemplate, or a one-row table with its Ready condition. */
static int s_print_template(kb_cli_t *cli, Kagent__Api__V1__SandboxTemplate *tp)
{
    return cli->json ? kb_cli_print(cli, &tp->base) : s_template_table(cli, &tp, 1);
}

static int s_run_apply(kb_cli_t *cli, const kb_args_t *a)
{
    const char *file = kb_args_str(a, "filename");
    if (!*file)
        return kb_cli_usage(cli, "must specify -f FILE (or -f - for stdin)");
    size_t len = 0;
    char *text = s_slurp(file, &len);
    if (!text)
        return kb_cli_fail(cli, "read %s: %s", file,
                           errno == EFBIG ? "file larger than 4 MiB" : strerror(errno));
    ka_yaml_node_t *root = NULL;
    char err[KA_YAML_ERR_CAP];
    if (ka_yaml_parse(text, len, &root, err, sizeof err) != 0) {
        free(text);
        return kb_cli_fail(cli, "%s: %s", strcmp(file, "-") == 0 ? "stdin" : file, err);
    }
    const ka_yaml_node_t *meta = root->kind == KA_YAML_MAP ? ka_yaml_get(root, "metadata") : NULL;
    const char *name = s_scalar(meta, "name");
    const char *ns = s_scalar(meta, "namespace");
    int rc;
    if (!name) {
        rc = kb_cli_fail(cli, "%s: metadata.name: Required value",
                         strcmp(file, "-") == 0 ? "stdin" : file);
        goto out;
    }
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc) {
        rc = KB_EXIT_ERROR;
        goto out;
    }
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = (char *)(ns ? ns : cli->namespace_);
    ref.name = (char *)name;
    Kagent__Api__V1__CreateSandboxTemplateRequest req =
        KAGENT__API__V1__CREATE_SANDBOX_TEMPLATE_REQUEST__INIT;
    req.ref = &ref;
    req.yaml = text;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/kagent.api.v1.SandboxTemplateService/CreateSandboxTemplate", NULL,
                     &req.base, &kagent__api__v1__create_sandbox_template_response__descriptor,
                     &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        s_cause(&st, cause, sizeof cause);
        rc = kb_cli_fail(cli, "apply %s/%s: %s", ref.namespace_, name, cause);
        goto out;
    }
    Kagent__Api__V1__CreateSandboxTemplateResponse *r =
        (Kagent__Api__V1__CreateSandboxTemplateResponse *)resp;
    if (cli->json && r->sandbox_template)
        rc = kb_cli_print(cli, &r->sandbox_template->base);
    else if (cli->json)
        rc = kb_cli_print(cli, resp);
    else {
        fprintf(cli->out, S_KIND "/%s applied\n", name);
        rc = KB_EXIT_OK;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
out:
    ka_yaml_free(&root);
    free(text);
    return rc;
}

static const kb_flag_t s_apply_flags[] = {
    {"filename", 'f', KB_F_STRING, NULL, "SandboxTemplate YAML (or JSON) file, - for stdin",
     "string"},
    {0},
};

const kb_cmd_t kb_cmd_apply = {
    .name = "apply",
    .use = "apply -f FILE|-",
    .short_help = "Create or update a SandboxTemplate from a YAML document",
    .flags = s_apply_flags,
    .min_args = 0,
    .max_args = 0,
    .run = s_run_apply,
};

/* ------------------------------------------------------------------------------------------ */

static int s_run_get_template(kb_cli_t *cli, const kb_args_t *a)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = (char *)cli->namespace_;
    ref.name = (char *)a->pos[0];
    Kagent__Api__V1__GetSandboxTemplateRequest req =
        KAGENT__API__V1__GET_SANDBOX_TEMPLATE_REQUEST__INIT;
    req.ref = &ref;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/kagent.api.v1.SandboxTemplateService/GetSandboxTemplate", NULL,
                     &req.base, &kagent__api__v1__get_sandbox_template_response__descriptor, &resp,
                     &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        s_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "get template %s/%s: %s", ref.namespace_, ref.name, cause);
    }
    Kagent__Api__V1__GetSandboxTemplateResponse *r =
        (Kagent__Api__V1__GetSandboxTemplateResponse *)resp;
    int rc = r->sandbox_template ? s_print_template(cli, r->sandbox_template)
                                 : kb_cli_fail(cli, "server returned no template");
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static int s_run_delete_template(kb_cli_t *cli, const kb_args_t *a)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = (char *)cli->namespace_;
    ref.name = (char *)a->pos[0];
    Kagent__Api__V1__DeleteSandboxTemplateRequest req =
        KAGENT__API__V1__DELETE_SANDBOX_TEMPLATE_REQUEST__INIT;
    req.ref = &ref;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/kagent.api.v1.SandboxTemplateService/DeleteSandboxTemplate", NULL,
                     &req.base, &kagent__api__v1__delete_sandbox_template_response__descriptor,
                     &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        s_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "delete template %s/%s: %s", ref.namespace_, ref.name, cause);
    }
    int rc = KB_EXIT_OK;
    if (cli->json)
        rc = kb_cli_print(cli, resp);
    else
        fprintf(cli->out, S_KIND "/%s deleted\n", ref.name);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* ---- get sandboxtemplate|sandboxtemplates|st [NAME]: kubectl's shape ------------------------ */

/* The Kubernetes object of a template (apiVersion, kind, metadata, spec, status), as kubectl get
 * prints it; a new reference or NULL. */
static json_t *s_object(const Kagent__Api__V1__SandboxTemplate *tp)
{
    if (!tp->resource || !tp->resource->value)
        return json_object();
    return kb_pbjson_to_json(&tp->resource->value->base, 0);
}

static int s_print_objects(kb_cli_t *cli, Kagent__Api__V1__SandboxTemplate *const *tps, size_t n,
                           bool list)
{
    if (!cli->json)
        return s_template_table(cli, tps, n);
    json_t *items = json_array();
    for (size_t i = 0; items && i < n; i++) {
        if (json_array_append_new(items, s_object(tps[i]))) {
            json_decref(items);
            items = NULL;
        }
    }
    json_t *doc = !items ? NULL
                  : list ? json_pack("{s:s,s:s,s:o,s:{s:s}}", "apiVersion", "v1", "kind", "List",
                                     "items", items, "metadata", "resourceVersion", "")
                         : json_incref(json_array_get(items, 0));
    if (!list)
        json_decref(items);
    int rc = doc ? kb_cli_print_json(cli, doc) : kb_cli_fail(cli, "out of memory");
    json_decref(doc);
    return rc;
}

static int s_run_get_st(kb_cli_t *cli, const kb_args_t *a)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = (char *)cli->namespace_;
    ref.name = a->npos ? (char *)a->pos[0] : "";
    Kagent__Api__V1__GetSandboxTemplateRequest get =
        KAGENT__API__V1__GET_SANDBOX_TEMPLATE_REQUEST__INIT;
    get.ref = &ref;
    Kagent__Api__V1__ListSandboxTemplatesRequest list =
        KAGENT__API__V1__LIST_SANDBOX_TEMPLATES_REQUEST__INIT;
    list.namespace_ = (char *)cli->namespace_;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    int fail =
        a->npos
            ? kb_rpc_unary(rpc, "/kagent.api.v1.SandboxTemplateService/GetSandboxTemplate", NULL,
                           &get.base, &kagent__api__v1__get_sandbox_template_response__descriptor,
                           &resp, &st)
            : kb_rpc_unary(rpc, "/kagent.api.v1.SandboxTemplateService/ListSandboxTemplates", NULL,
                           &list.base,
                           &kagent__api__v1__list_sandbox_templates_response__descriptor, &resp,
                           &st);
    if (fail) {
        char cause[KB_RPC_MSG_CAP + 64];
        s_cause(&st, cause, sizeof cause);
        return a->npos ? kb_cli_fail(cli, "get sandboxtemplate %s/%s: %s", ref.namespace_, ref.name,
                                     cause)
                       : kb_cli_fail(cli, "list sandboxtemplates: %s", cause);
    }
    int rc;
    if (a->npos) {
        Kagent__Api__V1__GetSandboxTemplateResponse *r = (void *)resp;
        rc = r->sandbox_template ? s_print_objects(cli, &r->sandbox_template, 1, false)
                                 : kb_cli_fail(cli, "server returned no template");
    } else {
        Kagent__Api__V1__ListSandboxTemplatesResponse *r = (void *)resp;
        rc = s_print_objects(cli, r->sandbox_templates, r->n_sandbox_templates, true);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

static const char s_st_long[] =
    "Shows one SandboxTemplate (NAME given) or lists those of the namespace, with READY, as\n"
    "kubectl get sandboxtemplate does: -o json and -o yaml print the Kubernetes object\n"
    "(apiVersion, kind, metadata, spec, status; a List without NAME), and\n"
    "-o jsonpath=TEMPLATE evaluates kubectl's JSONPath on it, e.g.\n"
    "  kagent get st scratch -o jsonpath='{range .status.conditions[?(@.type==\"Ready\")]}"
    "{.status} {.reason} {.message}{end}'";

#define S_ST_CMD(NAME, SHORT)                                                                      \
    {                                                                                              \
        .name = NAME, .use = NAME " [NAME]", .short_help = SHORT, .long_help = s_st_long,          \
        .min_args = 0, .max_args = 1, .run = s_run_get_st,                                         \
    }
static const kb_cmd_t s_cmd_get_st[] = {
    S_ST_CMD("sandboxtemplate", "Show SandboxTemplates as kubectl does (-o json|yaml|jsonpath=)"),
    S_ST_CMD("sandboxtemplates", "Alias of sandboxtemplate"),
    S_ST_CMD("st", "Alias of sandboxtemplate"),
};

static const kb_cmd_t s_cmd_get_template = {
    .name = "template",
    .use = "template NAME",
    .short_help = "Show a SandboxTemplate and its Ready condition",
    .min_args = 1,
    .max_args = 1,
    .run = s_run_get_template,
};

static const kb_cmd_t s_cmd_delete_template = {
    .name = "template",
    .use = "template NAME",
    .short_help = "Delete a SandboxTemplate",
    .min_args = 1,
    .max_args = 1,
    .run = s_run_delete_template,
};

static const kb_cmd_t *const s_get_subs[] = {&s_cmd_get_template, &s_cmd_get_st[0],
                                             &s_cmd_get_st[1], &s_cmd_get_st[2], NULL};
static const kb_cmd_t *const s_delete_subs[] = {&s_cmd_delete_template, NULL};

const kb_cmd_t kb_cmd_get = {
    .name = "get",
    .use = "get [command]",
    .short_help = "Show a resource",
    .subs = s_get_subs,
};
const kb_cmd_t kb_cmd_delete = {
    .name = "delete",
    .use = "delete [command]",
    .short_help = "Delete a resource",
    .subs = s_delete_subs,
};
