/*
 * ka_template_doc: a SandboxTemplate document (api.kagent.dev/v1alpha3), parsed from YAML and
 * validated with the messages the Kubernetes API server gives for the same CRD, so
 * `kagent apply -f` accepts exactly what `kubectl apply -f` accepts for the original.
 *
 * The document is immutable after parsing; the revision hash is computed from its canonical
 * JSON (ka_template_spec_json), so equal specs give equal revisions whatever the YAML layout.
 */
#ifndef KA_TEMPLATE_DOC_H
#define KA_TEMPLATE_DOC_H

#include <stddef.h>

#include "ka_yaml.h"

#define KA_TEMPLATE_API_VERSION "api.kagent.dev/v1alpha3"
#define KA_TEMPLATE_KIND        "SandboxTemplate"
#define KA_TEMPLATE_MAX_ENV     100
#define KA_NAMESPACE_MAX        63  /* DNS label */
#define KA_NAME_MAX             253 /* DNS subdomain */
#define KA_TEMPLATE_ERR_CAP     512

typedef struct ka_env_var {
    char *name;  /* owned */
    char *value; /* owned, may be "" */
} ka_env_var_t;

typedef struct ka_template_doc {
    char namespace_[KA_NAMESPACE_MAX + 1];
    char name[KA_NAME_MAX + 1];
    char *image;       /* repo@sha256:<64 hex> */
    ka_env_var_t *env; /* sorted by name (a map keyed by name) */
    size_t n_env;
    char *pool;              /* spec.substrate.workerPoolRef.name */
    char *snapshot_location; /* spec.substrate.snapshotPolicy.location */
} ka_template_doc_t;

/* Parses and validates one SandboxTemplate. default_ns is used when metadata.namespace is
 * absent. On failure returns -EINVAL and err holds one API-server style message, e.g.
 * `SandboxTemplate "scratch" is invalid: spec.workload.image: Invalid value: "tools:1": ...`. */
int ka_template_parse(const char *yaml, size_t len, const char *default_ns, ka_template_doc_t **out,
                      char *err, size_t errcap);
void ka_template_free(ka_template_doc_t **doc);

/* Canonical JSON of the spec (keys in fixed order, env sorted by name). Caller frees. */
char *ka_template_spec_json(const ka_template_doc_t *doc);

/* Name checks shared with the API layer. */
int ka_check_dns_label(const char *s);     /* 0 if a valid RFC 1123 label (<= 63) */
int ka_check_dns_subdomain(const char *s); /* 0 if a valid RFC 1123 subdomain (<= 253) */
int ka_check_pinned_image(const char *s);  /* 0 if ^[^[:space:]@]+@sha256:[a-f0-9]{64}$ */

#endif
