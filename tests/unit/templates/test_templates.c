/* Unit tests for actors/templates/template_doc: every validation rule and its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template_doc.h"

#define HEX64 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define IMAGE "registry.example.com/tools@sha256:" HEX64

/* The seed's template, with %s slots: extra metadata, image, env block, substrate block. */
__attribute__((noinline)) static char *s_doc(const char *meta, const char *image, const char *env,
                                             const char *substrate)
{
    char *out = NULL;
    int n = asprintf(&out,
                     "apiVersion: api.kagent.dev/v1alpha3\n"
                     "kind: SandboxTemplate\n"
                     "metadata:\n  name: scratch\n%s"
                     "spec:\n  workload:\n    image: %s\n%s%s",
                     meta, image, env, substrate);
    assert_true(n > 0);
    return out;
}

#define ENV_OK "  env:\n    - name: LANG\n      value: C.UTF-8\n"
#define SUB_OK                                                                                     \
    "  substrate:\n    workerPoolRef:\n      name: kagent-default\n"                               \
    "    snapshotPolicy:\n      location: s3://ate-snapshots/kagent/\n"
#define META_NS "  namespace: kagent\n"

static char s_err[KA_TEMPLATE_ERR_CAP];

static int s_parse(const char *yaml, ka_template_doc_t **doc)
{
    s_err[0] = '\0';
    return ka_template_parse(yaml, strlen(yaml), "default", doc, s_err, sizeof s_err);
}

static void s_expect_error(char *yaml, const char *want)
{
    ka_template_doc_t *doc = (void *)1;
    int rc = s_parse(yaml, &doc);
    if (rc == 0 || !strstr(s_err, want))
        fail_msg("rc=%d error \"%s\" lacks \"%s\" for:\n%s", rc, s_err, want, yaml);
    assert_null(doc);
    free(yaml);
}

static void test_seed_template_parses(void **unused)
{
    char *yaml = s_doc(META_NS, IMAGE, ENV_OK, SUB_OK);
    ka_template_doc_t *doc;
    assert_int_equal(s_parse(yaml, &doc), 0);
    assert_string_equal(doc->name, "scratch");
    assert_string_equal(doc->namespace_, "kagent");
    assert_string_equal(doc->image, IMAGE);
    assert_int_equal(doc->n_env, 1);
    assert_string_equal(doc->env[0].name, "LANG");
    assert_string_equal(doc->env[0].value, "C.UTF-8");
    assert_string_equal(doc->pool, "kagent-default");
    assert_string_equal(doc->snapshot_location, "s3://ate-snapshots/kagent/");
    char *json = ka_template_spec_json(doc);
    assert_string_equal(json, "{\"env\":[{\"name\":\"LANG\",\"value\":\"C.UTF-8\"}],\"substrate\":"
                              "{\"snapshotPolicy\":{\"location\":\"s3://ate-snapshots/kagent/\"},"
                              "\"workerPoolRef\":{\"name\":\"kagent-default\"}},\"workload\":"
                              "{\"image\":\"" IMAGE "\"}}");
    free(json);
    ka_template_free(&doc);
    assert_null(doc);
    free(yaml);
}

static void test_default_namespace_and_canonical_env(void **unused)
{
    char *a = s_doc(
        "", IMAGE, "  env:\n    - {name: B, value: \"2\"}\n    - {name: A, value: \"\"}\n", SUB_OK);
    char *b =
        s_doc("", IMAGE, "  env: [{value: \"\", name: A}, {name: B, value: \"2\"}]\n", SUB_OK);
    ka_template_doc_t *da, *db;
    assert_int_equal(s_parse(a, &da), 0);
    assert_int_equal(s_parse(b, &db), 0);
    assert_string_equal(da->namespace_, "default");
    assert_string_equal(da->env[0].name, "A"); /* sorted: env is a map keyed by name */
    assert_string_equal(da->env[0].value, "");
    char *ja = ka_template_spec_json(da), *jb = ka_template_spec_json(db);
    assert_string_equal(ja, jb);
    free(ja);
    free(jb);
    ka_template_free(&da);
    ka_template_free(&db);
    free(a);
    free(b);
}

static void test_image_must_be_pinned(void **unused)
{
    s_expect_error(s_doc("", "registry.example.com/tools:1.0", "", SUB_OK),
                   "SandboxTemplate \"scratch\" is invalid: spec.workload.image: Invalid value: "
                   "\"registry.example.com/tools:1.0\": spec.workload.image in body should match");
    s_expect_error(s_doc("", "tools@sha256:" HEX64 "0", "", SUB_OK), "should match");
    s_expect_error(
        s_doc("", "tools@sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
              "", SUB_OK),
        "should match");
    s_expect_error(s_doc("", "\"to ols@sha256:" HEX64 "\"", "", SUB_OK), "should match");
    s_expect_error(s_doc("", "\"@sha256:" HEX64 "\"", "", SUB_OK), "should match");
    s_expect_error(s_doc("", "", "", SUB_OK), "spec.workload.image: Required value");
}

static void test_env_rules(void **unused)
{
    s_expect_error(
        s_doc("", IMAGE, "  env:\n    - name: X\n      credentialRef: {name: s}\n", SUB_OK),
        "strict decoding error: unknown field \"spec.env[0].credentialRef\"");
    s_expect_error(s_doc("", IMAGE, "  env:\n    - name: KAGENT_TOKEN\n      value: x\n", SUB_OK),
                   "sandbox environment \"KAGENT_TOKEN\" is reserved");
    s_expect_error(s_doc("", IMAGE, "  env:\n    - name: ATE_X\n      value: x\n", SUB_OK),
                   "sandbox environment \"ATE_X\" is reserved");
    s_expect_error(s_doc("", IMAGE, "  env:\n    - name: X\n", SUB_OK),
                   "spec.env[0].value: Required value");
    s_expect_error(s_doc("", IMAGE, "  env:\n    - name: \"\"\n      value: x\n", SUB_OK),
                   "spec.env[0].name: Invalid value: \"\": spec.env[0].name in body should be at "
                   "least 1 chars long");
    s_expect_error(s_doc("", IMAGE, "  env:\n    - name: X\n      value: 1\n", SUB_OK),
                   "spec.env[0].value in body must be of type string: \"integer\"");
    s_expect_error(
        s_doc("", IMAGE, "  env:\n    - {name: X, value: a}\n    - {name: X, value: b}\n", SUB_OK),
        "spec.env[1]: Duplicate value");
    s_expect_error(s_doc("", IMAGE, "  env: LANG=C\n", SUB_OK),
                   "spec.env in body must be of type array");
    char env[101 * 40] = "  env:\n";
    for (int i = 0; i < 101; i++)
        snprintf(env + strlen(env), sizeof env - strlen(env), "    - {name: V%d, value: x}\n", i);
    s_expect_error(s_doc("", IMAGE, env, SUB_OK),
                   "spec.env: Too many: 101: must have at most 100 items");
    env[strlen(env) - strlen("    - {name: V100, value: x}\n")] = '\0';
    char *ok = s_doc("", IMAGE, env, SUB_OK);
    ka_template_doc_t *doc;
    assert_int_equal(s_parse(ok, &doc), 0);
    assert_int_equal(doc->n_env, 100);
    ka_template_free(&doc);
    free(ok);
}

static void test_substrate_rules(void **unused)
{
    s_expect_error(s_doc("", IMAGE, "", ""), "spec.substrate: Required value");
    s_expect_error(s_doc("", IMAGE, "", "  substrate:\n    snapshotPolicy: {location: s3://x/}\n"),
                   "spec.substrate.workerPoolRef: Required value");
    s_expect_error(s_doc("", IMAGE, "",
                         "  substrate:\n    workerPoolRef: {name: \"\"}\n"
                         "    snapshotPolicy: {location: s3://x/}\n"),
                   "workerPoolRef name must not be empty");
    s_expect_error(s_doc("", IMAGE, "", "  substrate:\n    workerPoolRef: {name: p}\n"),
                   "spec.substrate.snapshotPolicy: Required value");
    s_expect_error(s_doc("", IMAGE, "",
                         "  substrate:\n    workerPoolRef: {name: p}\n"
                         "    snapshotPolicy: {location: \"s3://a b/\"}\n"),
                   "spec.substrate.snapshotPolicy.location in body should match '^\\S+$'");
    s_expect_error(s_doc("", IMAGE, "",
                         "  substrate:\n    workerPoolRef: {name: p, namespace: x}\n"
                         "    snapshotPolicy: {location: s3://x/}\n"),
                   "unknown field \"spec.substrate.workerPoolRef.namespace\"");
}

static void test_type_and_metadata(void **unused)
{
    char *yaml = s_doc("", IMAGE, "", SUB_OK);
    char *p = strstr(yaml, "SandboxTemplate");
    memcpy(p, "SandboxTemplatX", 15);
    s_expect_error(
        yaml, "no matches for kind \"SandboxTemplatX\" in version \"api.kagent.dev/v1alpha3\"");
    yaml = s_doc("", IMAGE, "", SUB_OK);
    p = strstr(yaml, "v1alpha3");
    memcpy(p, "v1alpha1", 8);
    s_expect_error(
        yaml, "no matches for kind \"SandboxTemplate\" in version \"api.kagent.dev/v1alpha1\"");
    s_expect_error(s_doc("  namespace: Bad_NS\n", IMAGE, "", SUB_OK),
                   "metadata.namespace: Invalid value: \"Bad_NS\"");
    char *bad_name = s_doc("", IMAGE, "", SUB_OK);
    p = strstr(bad_name, "scratch");
    memcpy(p, "Scratch", 7);
    s_expect_error(bad_name,
                   "metadata.name: Invalid value: \"Scratch\": a lowercase RFC 1123 subdomain");
    s_expect_error(s_doc("  owner: me\n", IMAGE, "", SUB_OK), "unknown field \"metadata.owner\"");
    s_expect_error(s_doc("", IMAGE, "  command: [sh]\n", SUB_OK), "unknown field \"spec.command\"");
    /* the operator's policy (cpu, memory, pids, disk) is not the template's to raise */
    s_expect_error(s_doc("", IMAGE, "  resources: {disk: 100Gi}\n", SUB_OK),
                   "unknown field \"spec.resources\"");
    s_expect_error(s_doc("", IMAGE, "  egressPolicyRefs: [web]\n", SUB_OK),
                   "spec.egressPolicyRefs: Unsupported value");
    s_expect_error(strdup("- a\n- b\n"), "the document must be a YAML map");
    s_expect_error(strdup("apiVersion: [\n"), "error parsing SandboxTemplate: line");
}

static void test_name_checks(void **unused)
{
    assert_int_equal(ka_check_dns_label("kagent"), 0);
    assert_int_equal(ka_check_dns_label("a-1"), 0);
    assert_int_not_equal(ka_check_dns_label("-a"), 0);
    assert_int_not_equal(ka_check_dns_label("a.b"), 0);
    assert_int_not_equal(ka_check_dns_label(""), 0);
    char long_label[70];
    memset(long_label, 'a', 64);
    long_label[64] = '\0';
    assert_int_not_equal(ka_check_dns_label(long_label), 0);
    assert_int_equal(ka_check_dns_subdomain("a.b-c.d"), 0);
    assert_int_not_equal(ka_check_dns_subdomain("a..b"), 0);
    assert_int_not_equal(ka_check_dns_subdomain("a."), 0);
    assert_int_equal(ka_check_pinned_image(IMAGE), 0);
    assert_int_not_equal(ka_check_pinned_image("a@b@sha256:" HEX64), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_template_parses),
        cmocka_unit_test(test_default_namespace_and_canonical_env),
        cmocka_unit_test(test_image_must_be_pinned),
        cmocka_unit_test(test_env_rules),
        cmocka_unit_test(test_substrate_rules),
        cmocka_unit_test(test_type_and_metadata),
        cmocka_unit_test(test_name_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
