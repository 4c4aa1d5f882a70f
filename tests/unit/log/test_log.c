/* Unit tests for runtime/log.c: level filtering, text and JSON line shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "krt.h"

static char *s_capture(bool json, krt_log_level_t min, krt_log_level_t level, const char *fmt,
                       const char *arg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    krt_log_configure(min, json, f);
    krt_log(level, "node-1/store", "connected", fmt, arg);
    krt_log_configure(KRT_LOG_INFO, false, NULL);
    fclose(f);
    return buf;
}

static void test_text_line(void **unused)
{
    char *line = s_capture(false, KRT_LOG_INFO, KRT_LOG_WARN, "host=%s", "db1");
    assert_non_null(strstr(line, " level=warn path=node-1/store event=connected host=db1\n"));
    assert_memory_equal(line, "ts=", 3);
    free(line);
}

static void test_json_line_escapes(void **unused)
{
    char *line = s_capture(true, KRT_LOG_DEBUG, KRT_LOG_ERROR, "why=%s", "a \"b\"\n");
    assert_non_null(strstr(line, "\"level\":\"error\""));
    assert_non_null(strstr(line, "\"msg\":\"why=a \\\"b\\\"\\n\"}"));
    free(line);
}

static void test_level_filter(void **unused)
{
    char *line = s_capture(false, KRT_LOG_WARN, KRT_LOG_INFO, "x=%s", "1");
    assert_string_equal(line, "");
    free(line);
    assert_int_equal(krt_log_level_parse("debug"), KRT_LOG_DEBUG);
    assert_int_equal(krt_log_level_parse("error"), KRT_LOG_ERROR);
    assert_int_equal(krt_log_level_parse("loud"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_line),
        cmocka_unit_test(test_json_line_escapes),
        cmocka_unit_test(test_level_filter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
