/*
 * fuzz_template: a SandboxTemplate document as `kagent apply -f` and CreateSandboxTemplate send
 * it: YAML bytes through ka_yaml and ka_template_parse (parse and validation). A refusal must
 * say why; an accepted document must hold only valid names and a pinned image, and give its
 * canonical spec JSON (the revision hash input).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "template_doc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KA_TEMPLATE_ERR_CAP];
    ka_template_doc_t *doc = NULL;
    if (ka_template_parse((const char *)data, size, "default", &doc, err, sizeof err) != 0) {
        if (!memchr(err, '\0', sizeof err) || !err[0])
            abort();
        return 0;
    }
    if (ka_check_dns_label(doc->namespace_) || ka_check_dns_subdomain(doc->name) ||
        ka_check_pinned_image(doc->image) || doc->n_env > KA_TEMPLATE_MAX_ENV)
        abort();
    for (size_t i = 1; i < doc->n_env; i++)
        if (strcmp(doc->env[i - 1].name, doc->env[i].name) >= 0)
            abort(); /* sorted by name, no duplicates */
    char *spec = ka_template_spec_json(doc);
    if (!spec)
        abort();
    free(spec);
    ka_template_free(&doc);
    return 0;
}
