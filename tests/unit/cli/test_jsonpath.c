/* Unit tests for kb_jsonpath: kubectl's template subset, on documents shaped like the
 * SandboxTemplate objects the CLI prints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonpath.h"

static const char *s_doc_text =
    "{\"apiVersion\":\"api.kagent.dev/v1alpha3\",\"kind\":\"SandboxTemplate\","
    "\"metadata\":{\"name\":\"scratch\",\"namespace\":\"kagent\",\"generation\":2,"
    "\"labels\":{\"app.kubernetes.io/name\":\"x\",\"tier\":\"dev\"}},"
    "\"spec\":{\"env\":[{\"name\":\"LANG\",\"value\":\"C.UTF-8\"},{\"name\":\"TZ\",\"value\":"
    "\"UTC\"},"
    "{\"name\":\"N\",\"value\":\"3\"}],\"replicas\":3,\"ok\":true},"
    "\"status\":{\"observedGeneration\":2,\"conditions\":["
    "{\"type\":\"Other\",\"status\":\"False\",\"reason\":\"X\",\"message\":\"no\"},"
    "{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"Prepared\","
    "\"message\":\"Sandbox runtime is prepared\",\"observedGeneration\":2}]},"
    "\"items\":[{\"n\":1,\"name\":\"a\"},{\"n\":5,\"name\":\"b\"},{\"n\":10,\"name\":\"c\"}]}";

static json_t *s_doc;

static int s_setup(void **state)
{
    s_doc = json_loads(s_doc_text, 0, NULL);
    return s_doc ? 0 : -1;
}

static int s_teardown(void **state)
{
    json_decref(s_doc);
    return 0;
}

/* The template's output on s_doc (caller frees), or NULL with err filled on a parse error. */
static char *s_eval(const char *tmpl, char *err, size_t cap)
{
    kb_jsonpath_t *p = kb_jsonpath_parse(tmpl, err, cap);
    if (!p)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(kb_jsonpath_print(p, s_doc, f), 0);
    fclose(f);
    kb_jsonpath_free(&p);
    assert_null(p);
    return buf;
}

static void s_expect(const char *tmpl, const char *want)
{
    char err[KB_JSONPATH_ERR_CAP] = "";
    char *got = s_eval(tmpl, err, sizeof err);
    if (!got)
        fail_msg("%s: %s", tmpl, err);
    if (strcmp(got, want) != 0)
        fail_msg("%s: got \"%s\", want \"%s\"", tmpl, got, want);
    free(got);
}

static void s_expect_error(const char *tmpl, const char *fragment)
{
    char err[KB_JSONPATH_ERR_CAP] = "";
    char *got = s_eval(tmpl, err, sizeof err);
    if (got)
        fail_msg("%s: parsed, printed \"%s\"", tmpl, got);
    if (!strstr(err, fragment))
        fail_msg("%s: error \"%s\" lacks \"%s\"", tmpl, err, fragment);
}

static void t_seed(void **state)
{
    /* the seed's command, verbatim */
    s_expect("{range .status.conditions[?(@.type==\"Ready\")]}{.status} {.reason} {.message}{end}",
             "True Prepared Sandbox runtime is prepared");
}

static void t_fields(void **state)
{
    s_expect("{.metadata.name}", "scratch");
    s_expect("{$.metadata.name}", "scratch");
    s_expect("{metadata.namespace}", "kagent");
    s_expect("name={.metadata.name} ns={.metadata.namespace}\n", "name=scratch ns=kagent\n");
    s_expect("{.metadata['name']}", "scratch");
    s_expect("{.metadata[\"namespace\"]}", "kagent");
    s_expect("{.metadata['name','namespace']}", "scratch kagent");
    s_expect("{.metadata.labels.app\\.kubernetes\\.io/name}", "x");
    s_expect("{.metadata.generation}", "2");
    s_expect("{.spec.ok}", "true");
    s_expect("{.metadata.labels}", "{\"app.kubernetes.io/name\":\"x\",\"tier\":\"dev\"}");
    s_expect("{.status.conditions[0].type}", "Other");
    /* missing keys and indexes print nothing, as kubectl get -o jsonpath does */
    s_expect("[{.metadata.nope}][{.nope.deeper}][{.items[7]}]", "[][][]");
}

static void t_arrays(void **state)
{
    s_expect("{.items[*].name}", "a b c");
    s_expect("{.items[-1].name}", "c");
    s_expect("{.items[0:2].name}", "a b");
    s_expect("{.items[1:].name}", "b c");
    s_expect("{.items[:-1].name}", "a b");
    s_expect("{.items[::2].name}", "a c");
    s_expect("{.items[::-1].name}", "c b a");
    s_expect("{.metadata.labels.*}", "x dev");
    s_expect("{.spec.env[*].name}", "LANG TZ N");
}

static void t_filters(void **state)
{
    s_expect("{.items[?(@.n>1)].name}", "b c");
    s_expect("{.items[?(@.n>=5)].name}", "b c");
    s_expect("{.items[?(@.n<5)].name}", "a");
    s_expect("{.items[?(@.n<=5)].name}", "a b");
    s_expect("{.items[?(@.n!=5)].name}", "a c");
    s_expect("{.items[?(@.name=='b')].n}", "5");
    s_expect("{.spec.env[?(@.name==\"TZ\")].value}", "UTC");
    s_expect("{.status.conditions[?(@.observedGeneration)].type}", "Ready");
    s_expect("{.items[?(@.n==$.spec.replicas)].name}", "");
    s_expect("{.items[?(@.n>$.spec.replicas)].name}", "b c");
    s_expect("{.status.conditions[?(@.type==\"Missing\")].status}", "");
}

static void t_range_and_literals(void **state)
{
    s_expect("{range .items[*]}{.name}={.n}{\"\\n\"}{end}", "a=1\nb=5\nc=10\n");
    s_expect("{range .items[*]}[{.name}]{end}", "[a][b][c]");
    s_expect("{range .spec.env[*]}{.name}{'\\t'}{$.metadata.name}{\"\\n\"}{end}",
             "LANG\tscratch\nTZ\tscratch\nN\tscratch\n");
    s_expect("{range .items[?(@.n>1)]}{range .*}<{@}>{end}{end}", "<5><b><10><c>");
    s_expect("{'literal'} {\"x\\\"y\"}", "literal x\"y");
}

static void t_descent(void **state)
{
    s_expect("{..observedGeneration}", "2 2");
    s_expect("{.spec..name}", "LANG TZ N");
}

static void t_errors(void **state)
{
    s_expect_error("{.metadata.name", "unclosed {");
    s_expect_error("{range .items[*]}{.name}", "{range} without {end}");
    s_expect_error("{.name}{end}", "{end} without {range}");
    s_expect_error("{.items[}", "expected an index");
    s_expect_error("{.items[0}", "expected ]");
    s_expect_error("{.items[?(@.n>)]}", "expected @, $, a string");
    s_expect_error("{.items[?(@.n>1]}", "expected ) to end the filter");
    s_expect_error("{.items[::0]}", "a slice step cannot be 0");
    s_expect_error("{'open}", "unterminated quoted string");
    s_expect_error("{.a b}", "unexpected character 'b' at column 5");
    s_expect_error("{.}", "expected a field name");
    kb_jsonpath_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_seed),
        cmocka_unit_test(t_fields),
        cmocka_unit_test(t_arrays),
        cmocka_unit_test(t_filters),
        cmocka_unit_test(t_range_and_literals),
        cmocka_unit_test(t_descent),
        cmocka_unit_test(t_errors),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
