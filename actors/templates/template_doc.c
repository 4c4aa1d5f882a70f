/* ka_template_doc: SandboxTemplate YAML -> validated struct, with API-server style errors. */
#include "template_doc.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IMAGE_PATTERN "^[^[:space:]@]+@sha256:[a-f0-9]{64}$"

typedef struct {
    const char *name; /* metadata.name, for the message prefix */
    char *err;
    size_t cap;
} s_ctx_t;

static int s_fail(s_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_fail(s_ctx_t *c, const char *fmt, ...)
{
    char what[KA_TEMPLATE_ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (c->name && *c->name)
        snprintf(c->err, c->cap, "SandboxTemplate \"%.100s\" is invalid: %s", c->name, what);
    else
        snprintf(c->err, c->cap, "SandboxTemplate is invalid: %s", what);
    return -EINVAL;
}

/* ---- name and value checks ---------------------------------------------------------------- */

static bool s_is_lower_alnum(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
}

int ka_check_dns_label(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > KA_NAMESPACE_MAX || !s_is_lower_alnum(s[0]) || !s_is_lower_alnum(s[n - 1]))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!s_is_lower_alnum(s[i]) && s[i] != '-')
            return -EINVAL;
    return 0;
}

int ka_check_dns_subdomain(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > KA_NAME_MAX)
        return -EINVAL;
    for (const char *label = s; label;) {
        const char *dot = strchr(label, '.');
        size_t len = dot ? (size_t)(dot - label) : strlen(label);
        if (len == 0 || !s_is_lower_alnum(label[0]) || !s_is_lower_alnum(label[len - 1]))
            return -EINVAL;
        for (size_t i = 0; i < len; i++)
            if (!s_is_lower_alnum(label[i]) && label[i] != '-')
                return -EINVAL;
        label = dot ? dot + 1 : NULL;
    }
    return 0;
}

int ka_check_pinned_image(const char *s)
{
    const char *at = strchr(s, '@');
    if (!at || at == s || strchr(at + 1, '@'))
        return -EINVAL;
    for (const char *p = s; p < at; p++)
        if (isspace((unsigned char)*p))
            return -EINVAL;
    if (strncmp(at + 1, "sha256:", 7) != 0 || strlen(at + 8) != 64)
        return -EINVAL;
    for (const char *p = at + 8; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return -EINVAL;
    return 0;
}

/* The JSON type a plain YAML scalar would decode to, as the API server names it. */
static const char *s_scalar_type(const ka_yaml_node_t *n)
{
    if (n->kind == KA_YAML_MAP)
        return "object";
    if (n->kind == KA_YAML_SEQ)
        return "array";
    if (n->quoted)
        return "string";
    if (ka_yaml_is_null(n))
        return "null";
    const char *v = n->value;
    if (!strcmp(v, "true") || !strcmp(v, "false") || !strcmp(v, "True") || !strcmp(v, "False"))
        return "boolean";
    char *end;
    errno = 0;
    (void)strtoll(v, &end, 0);
    if (*v && !*end)
        return "integer";
    (void)strtod(v, &end);
    if (*v && !*end && !isalpha((unsigned char)v[0]))
        return "number";
    return "string";
}

/* ---- field access ------------------------------------------------------------------------- */

/* Refuses keys not in `allowed` (NULL-terminated), naming the full path like kubectl's strict
 * decoding does. */
static int s_only_keys(s_ctx_t *c, const ka_yaml_node_t *map, const char *path,
                       const char *const *allowed)
{
    for (const ka_yaml_node_t *k = map->child; k; k = k->next) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, k->key) == 0;
        if (!ok)
            return s_fail(c, "strict decoding error: unknown field \"%s%s%s\" (line %d)", path,
                          *path ? "." : "", k->key, k->key_line);
    }
    return 0;
}

static int s_want_map(s_ctx_t *c, const ka_yaml_node_t *n, const char *path)
{
    if (n && n->kind != KA_YAML_MAP)
        return s_fail(c, "%s: Invalid value: \"%s\": %s in body must be of type object: \"%s\"",
                      path, s_scalar_type(n), path, s_scalar_type(n));
    return 0;
}

/* A required string field; *out borrowed from the tree. */
static int s_string(s_ctx_t *c, const ka_yaml_node_t *map, const char *key, const char *path,
                    bool required, const char **out)
{
    const ka_yaml_node_t *n = ka_yaml_get(map, key);
    *out = NULL;
    if (!n || ka_yaml_is_null(n))
        return required ? s_fail(c, "%s: Required value", path) : 0;
    const char *type = s_scalar_type(n);
    if (strcmp(type, "string") != 0)
        return s_fail(c, "%s: Invalid value: \"%s\": %s in body must be of type string: \"%s\"",
                      path, type, path, type);
    *out = n->value;
    return 0;
}

/* ---- sections ----------------------------------------------------------------------------- */

static int s_metadata(s_ctx_t *c, const ka_yaml_node_t *root, const char *default_ns,
                      ka_template_doc_t *doc)
{
    static const char *const keys[] = {"name", "namespace",       "labels",     "annotations",
                                       "uid",  "resourceVersion", "generation", "creationTimestamp",
                                       NULL};
    const ka_yaml_node_t *md = ka_yaml_get(root, "metadata");
    const char *name, *ns;
    int rc;
    if (!md)
        return s_fail(c, "metadata.name: Required value: name is required");
    if ((rc = s_want_map(c, md, "metadata")) || (rc = s_only_keys(c, md, "metadata", keys)) ||
        (rc = s_string(c, md, "name", "metadata.name", true, &name)) ||
        (rc = s_string(c, md, "namespace", "metadata.namespace", false, &ns)))
        return rc;
    c->name = NULL;
    if (ka_check_dns_subdomain(name))
        return s_fail(c,
                      "metadata.name: Invalid value: \"%.253s\": a lowercase RFC 1123 subdomain "
                      "must consist of lower case alphanumeric characters, '-' or '.', and must "
                      "start and end with an alphanumeric character",
                      name);
    snprintf(doc->name, sizeof doc->name, "%s", name);
    c->name = doc->name;
    ns = ns ? ns : default_ns;
    if (!ns || ka_check_dns_label(ns))
        return s_fail(c,
                      "metadata.namespace: Invalid value: \"%.63s\": a lowercase RFC 1123 label "
                      "must consist of lower case alphanumeric characters or '-', and must "
                      "start and end with an alphanumeric character (at most 63 characters)",
                      ns ? ns : "");
    snprintf(doc->namespace_, sizeof doc->namespace_, "%s", ns);
    return 0;
}

static int s_env_entry(s_ctx_t *c, const ka_yaml_node_t *e, size_t i, ka_env_var_t *out)
{
    static const char *const keys[] = {"name", "value", NULL};
    char path[48];
    snprintf(path, sizeof path, "spec.env[%zu]", i);
    const char *name, *value;
    int rc;
    if ((rc = s_want_map(c, e, path)) || (rc = s_only_keys(c, e, path, keys)))
        return rc;
    char npath[64], vpath[64];
    snprintf(npath, sizeof npath, "%s.name", path);
    snprintf(vpath, sizeof vpath, "%s.value", path);
    if ((rc = s_string(c, e, "name", npath, true, &name)) ||
        (rc = s_string(c, e, "value", vpath, false, &value)))
        return rc;
    if (!ka_yaml_get(e, "value"))
        return s_fail(c, "%s: Required value", vpath);
    if (!*name)
        return s_fail(c, "%s: Invalid value: \"\": %s in body should be at least 1 chars long",
                      npath, npath);
    if (!strncmp(name, "KAGENT_", 7) || !strncmp(name, "ATE_", 4))
        return s_fail(c,
                      "%s: Invalid value: \"%.100s\": sandbox environment \"%.100s\" is reserved",
                      npath, name, name);
    out->name = strdup(name);
    out->value = strdup(value ? value : "");
    return out->name && out->value ? 0 : -ENOMEM;
}

static int s_env_cmp(const void *a, const void *b)
{
    return strcmp(((const ka_env_var_t *)a)->name, ((const ka_env_var_t *)b)->name);
}

static int s_env(s_ctx_t *c, const ka_yaml_node_t *spec, ka_template_doc_t *doc)
{
    const ka_yaml_node_t *env = ka_yaml_get(spec, "env");
    if (!env || ka_yaml_is_null(env))
        return 0;
    if (env->kind != KA_YAML_SEQ)
        return s_fail(c,
                      "spec.env: Invalid value: \"%s\": spec.env in body must be of type "
                      "array: \"%s\"",
                      s_scalar_type(env), s_scalar_type(env));
    if (env->n_children > KA_TEMPLATE_MAX_ENV)
        return s_fail(c, "spec.env: Too many: %zu: must have at most %d items", env->n_children,
                      KA_TEMPLATE_MAX_ENV);
    doc->env = calloc(env->n_children ? env->n_children : 1, sizeof *doc->env);
    if (!doc->env)
        return -ENOMEM;
    size_t i = 0;
    for (const ka_yaml_node_t *e = env->child; e; e = e->next, i++) {
        int rc = s_env_entry(c, e, i, &doc->env[i]);
        doc->n_env = i + 1;
        if (rc)
            return rc;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(doc->env[j].name, doc->env[i].name))
                return s_fail(c,
                              "spec.env[%zu]: Duplicate value: map[string]interface {}{\"name\":"
                              "\"%.100s\"}",
                              i, doc->env[i].name);
    }
    qsort(doc->env, doc->n_env, sizeof *doc->env, s_env_cmp);
    return 0;
}

static int s_substrate(s_ctx_t *c, const ka_yaml_node_t *spec, ka_template_doc_t *doc)
{
    static const char *const keys[] = {"workerPoolRef", "snapshotPolicy", NULL};
    static const char *const pool_keys[] = {"name", NULL};
    static const char *const snap_keys[] = {"location", NULL};
    const ka_yaml_node_t *sub = ka_yaml_get(spec, "substrate");
    const char *pool, *loc;
    int rc;
    if (!sub)
        return s_fail(c, "spec.substrate: Required value");
    if ((rc = s_want_map(c, sub, "spec.substrate")) ||
        (rc = s_only_keys(c, sub, "spec.substrate", keys)))
        return rc;
    const ka_yaml_node_t *pr = ka_yaml_get(sub, "workerPoolRef");
    const ka_yaml_node_t *sp = ka_yaml_get(sub, "snapshotPolicy");
    if (!pr)
        return s_fail(c, "spec.substrate.workerPoolRef: Required value");
    if (!sp)
        return s_fail(c, "spec.substrate.snapshotPolicy: Required value");
    if ((rc = s_want_map(c, pr, "spec.substrate.workerPoolRef")) ||
        (rc = s_only_keys(c, pr, "spec.substrate.workerPoolRef", pool_keys)) ||
        (rc = s_string(c, pr, "name", "spec.substrate.workerPoolRef.name", true, &pool)) ||
        (rc = s_want_map(c, sp, "spec.substrate.snapshotPolicy")) ||
        (rc = s_only_keys(c, sp, "spec.substrate.snapshotPolicy", snap_keys)) ||
        (rc = s_string(c, sp, "location", "spec.substrate.snapshotPolicy.location", true, &loc)))
        return rc;
    if (!*pool)
        return s_fail(c, "spec.substrate.workerPoolRef: Invalid value: \"object\": workerPoolRef "
                         "name must not be empty");
    if (!*loc || strpbrk(loc, " \t\r\n\f\v"))
        return s_fail(c,
                      "spec.substrate.snapshotPolicy.location: Invalid value: \"%.200s\": "
                      "spec.substrate.snapshotPolicy.location in body should match '^\\S+$'",
                      loc);
    doc->pool = strdup(pool);
    doc->snapshot_location = strdup(loc);
    return doc->pool && doc->snapshot_location ? 0 : -ENOMEM;
}

static int s_spec(s_ctx_t *c, const ka_yaml_node_t *root, ka_template_doc_t *doc)
{
    static const char *const keys[] = {"workload", "env", "substrate", "egressPolicyRefs", NULL};
    static const char *const wl_keys[] = {"image", NULL};
    const ka_yaml_node_t *spec = ka_yaml_get(root, "spec");
    const char *image;
    int rc;
    if (!spec)
        return s_fail(c, "spec: Required value");
    if ((rc = s_want_map(c, spec, "spec")) || (rc = s_only_keys(c, spec, "spec", keys)))
        return rc;
    const ka_yaml_node_t *refs = ka_yaml_get(spec, "egressPolicyRefs");
    if (refs && !(refs->kind == KA_YAML_SEQ && refs->n_children == 0) && !ka_yaml_is_null(refs))
        return s_fail(c, "spec.egressPolicyRefs: Unsupported value: this server does not support "
                         "EgressPolicy yet; sandboxes have no egress");
    const ka_yaml_node_t *wl = ka_yaml_get(spec, "workload");
    if (!wl)
        return s_fail(c, "spec.workload: Required value");
    if ((rc = s_want_map(c, wl, "spec.workload")) ||
        (rc = s_only_keys(c, wl, "spec.workload", wl_keys)) ||
        (rc = s_string(c, wl, "image", "spec.workload.image", true, &image)))
        return rc;
    if (ka_check_pinned_image(image))
        return s_fail(c,
                      "spec.workload.image: Invalid value: \"%.300s\": spec.workload.image in "
                      "body should match '" IMAGE_PATTERN "' (pin the image by sha256 digest; "
                      "a tag alone is rejected)",
                      image);
    if (!(doc->image = strdup(image)))
        return -ENOMEM;
    if ((rc = s_env(c, spec, doc)))
        return rc;
    return s_substrate(c, spec, doc);
}

static int s_type_meta(s_ctx_t *c, const ka_yaml_node_t *root)
{
    static const char *const keys[] = {"apiVersion", "kind", "metadata", "spec", "status", NULL};
    const char *api, *kind;
    int rc;
    if (root->kind != KA_YAML_MAP)
        return s_fail(c, "the document must be a YAML map (a SandboxTemplate object)");
    if ((rc = s_string(c, root, "apiVersion", "apiVersion", true, &api)) ||
        (rc = s_string(c, root, "kind", "kind", true, &kind)))
        return rc;
    if (strcmp(kind, KA_TEMPLATE_KIND) || strcmp(api, KA_TEMPLATE_API_VERSION)) {
        snprintf(c->err, c->cap,
                 "no matches for kind \"%.60s\" in version \"%.60s\": this server accepts kind "
                 "\"" KA_TEMPLATE_KIND "\" in version \"" KA_TEMPLATE_API_VERSION "\"",
                 kind, api);
        return -EINVAL;
    }
    return s_only_keys(c, root, "", keys);
}

static int s_template_from_tree(const ka_yaml_node_t *root, const char *default_ns,
                                ka_template_doc_t **out, char *err, size_t errcap)
{
    s_ctx_t c = {NULL, err, errcap};
    ka_template_doc_t *doc = calloc(1, sizeof *doc);
    *out = NULL;
    if (!doc)
        return -ENOMEM;
    int rc = s_type_meta(&c, root);
    if (!rc)
        rc = s_metadata(&c, root, default_ns, doc);
    if (!rc)
        rc = s_spec(&c, root, doc);
    if (rc == -ENOMEM)
        snprintf(err, errcap, "out of memory");
    if (rc) {
        ka_template_free(&doc);
        return rc;
    }
    *out = doc;
    return 0;
}

int ka_template_parse(const char *yaml, size_t len, const char *default_ns, ka_template_doc_t **out,
                      char *err, size_t errcap)
{
    ka_yaml_node_t *root = NULL;
    char yerr[KA_YAML_ERR_CAP];
    *out = NULL;
    if (ka_yaml_parse(yaml, len, &root, yerr, sizeof yerr)) {
        snprintf(err, errcap, "error parsing SandboxTemplate: %s", yerr);
        return -EINVAL;
    }
    int rc = s_template_from_tree(root, default_ns, out, err, errcap);
    ka_yaml_free(&root);
    return rc;
}

void ka_template_free(ka_template_doc_t **doc_p)
{
    ka_template_doc_t *doc = doc_p ? *doc_p : NULL;
    if (!doc)
        return;
    for (size_t i = 0; i < doc->n_env; i++) {
        free(doc->env[i].name);
        free(doc->env[i].value);
    }
    free(doc->env);
    free(doc->image);
    free(doc->pool);
    free(doc->snapshot_location);
    free(doc);
    *doc_p = NULL;
}

char *ka_template_spec_json(const ka_template_doc_t *doc)
{
    json_t *env = json_array();
    for (size_t i = 0; env && i < doc->n_env; i++)
        json_array_append_new(
            env, json_pack("{s:s, s:s}", "name", doc->env[i].name, "value", doc->env[i].value));
    json_t *spec = json_pack("{s:{s:s}, s:o, s:{s:{s:s}, s:{s:s}}}", "workload", "image",
                             doc->image, "env", env, "substrate", "workerPoolRef", "name",
                             doc->pool, "snapshotPolicy", "location", doc->snapshot_location);
    if (!spec)
        return NULL;
    char *s = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(spec);
    return s;
}
