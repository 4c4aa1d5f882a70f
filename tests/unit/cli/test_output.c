/* Unit tests for kb_out_yaml: block style, quoting only what YAML would read otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "output.h"

static void s_expect(const char *json, const char *want)
{
    json_error_t e;
    json_t *j = json_loads(json, JSON_DECODE_ANY, &e);
    if (!j)
        fail_msg("bad test JSON %s: %s", json, e.text);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(kb_out_yaml(f, j), 0);
    fclose(f);
    json_decref(j);
    if (strcmp(buf, want) != 0)
        fail_msg("%s:\n--- got\n%s--- want\n%s", json, buf, want);
    free(buf);
}

static void t_nesting(void **state)
{
    s_expect("{\"kind\":\"List\",\"items\":[{\"a\":1,\"b\":{\"c\":[1,2]}},{\"d\":true}]}",
             "kind: List\n"
             "items:\n"
             "  - a: 1\n"
             "    b:\n"
             "      c:\n"
             "        - 1\n"
             "        - 2\n"
             "  - d: true\n");
    s_expect("[[1,[]],{}]", "-\n  - 1\n  - []\n- {}\n");
    s_expect("{\"e\":{},\"f\":[],\"g\":null,\"h\":1.5}", "e: {}\nf: []\ng: null\nh: 1.5\n");
    s_expect("{}", "{}\n");
    s_expect("[]", "[]\n");
    s_expect("\"top\"", "top\n");
}

static void t_quoting(void **state)
{
    s_expect("{\"plain\":\"C.UTF-8\",\"image\":\"test/tools@sha256:ab\",\"msg\":\"Sandbox runtime "
             "is prepared\",\"url\":\"file:///tmp/x/\"}",
             "plain: C.UTF-8\nimage: test/tools@sha256:ab\nmsg: Sandbox runtime is prepared\n"
             "url: file:///tmp/x/\n");
    /* what a YAML reader would take for something else keeps its quotes */
    s_expect("[\"True\",\"no\",\"null\",\"~\",\"3\",\"1.5\",\"2026-12-01T13:52:34Z\",\"\","
             "\" lead\",\"trail \",\"- dash\",\"a: b\",\"x #c\",\"*ref\",\"multi\\nline\","
             "\"q\\\"uote\",\"tab\\there\",\"key:\"]",
             "- \"True\"\n- \"no\"\n- \"null\"\n- \"~\"\n- \"3\"\n- \"1.5\"\n"
             "- \"2026-12-01T13:52:34Z\"\n- \"\"\n- \" lead\"\n- \"trail \"\n- \"- dash\"\n"
             "- \"a: b\"\n- \"x #c\"\n- \"*ref\"\n- \"multi\\nline\"\n- q\"uote\n"
             "- \"tab\\there\"\n- \"key:\"\n");
    /* keys follow the same rule */
    s_expect("{\"yes\":1,\"app.kubernetes.io/name\":\"x\"}",
             "\"yes\": 1\napp.kubernetes.io/name: x\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_nesting),
        cmocka_unit_test(t_quoting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
