/* Unit tests for bridges/pbjson: every field kind both ways, the well-known types, default
 * omission, snake_case output, round trips through the wire format, and hostile JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"
#include "pbjson.h"
#include "pbjson_test.pb-c.h"

static char s_err[KB_PBJSON_ERR_CAP];

/* JSON text of msg with sorted keys, compact (caller frees). */
static char *s_dump(const ProtobufCMessage *msg, unsigned flags)
{
    char *s = kb_pbjson_dumps(msg, flags, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(s);
    return s;
}

static void s_expect_json(const ProtobufCMessage *msg, unsigned flags, const char *want)
{
    char *got = s_dump(msg, flags);
    if (strcmp(got, want) != 0)
        fail_msg("got  %s\nwant %s", got, want);
    free(got);
}

/* Parses text as desc, expecting success. */
static ProtobufCMessage *s_load(const ProtobufCMessageDescriptor *desc, const char *text)
{
    ProtobufCMessage *m = NULL;
    int rc = kb_pbjson_loads(desc, text, strlen(text), 0, &m, s_err, sizeof s_err);
    if (rc != 0)
        fail_msg("parse failed (%d): %s\nfor %s", rc, s_err, text);
    return m;
}

static void s_expect_reject(const ProtobufCMessageDescriptor *desc, const char *text,
                            const char *want_err)
{
    ProtobufCMessage *m = (void *)1;
    int rc = kb_pbjson_loads(desc, text, strlen(text), 0, &m, s_err, sizeof s_err);
    if (rc != -EINVAL || m != NULL || !strstr(s_err, want_err))
        fail_msg("rc=%d err \"%s\" (want \"%s\") for %s", rc, s_err, want_err, text);
}

/* ------------------------------------------------------------------------------------------ */

static void test_sandbox_camel_case_and_wkt(void **state)
{
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = "kagent";
    ref.name = "scratch";
    Google__Protobuf__Timestamp exp = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    exp.seconds = 1790872200; /* 2026-10-01T16:30:00Z */
    Kagent__Api__V1__GuestCapabilities g = KAGENT__API__V1__GUEST_CAPABILITIES__INIT;
    g.process_execution = 1;
    Kagent__Api__V1__Sandbox sb = KAGENT__API__V1__SANDBOX__INIT;
    sb.id = "0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04";
    sb.sandbox_template = &ref;
    sb.state = KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_READY;
    sb.expires_at = &exp;
    sb.guest = &g;
    sb.node = "node-1";
    s_expect_json(&sb.base, 0,
                  "{\"expiresAt\":\"2026-10-01T16:30:00Z\",\"guest\":{\"processExecution\":true},"
                  "\"id\":\"0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04\",\"node\":\"node-1\","
                  "\"sandboxTemplate\":{\"name\":\"scratch\",\"namespace\":\"kagent\"},"
                  "\"state\":\"RUNTIME_STATE_READY\"}");
    /* snake_case for MCP */
    s_expect_json(&sb.base, KB_PBJSON_SNAKE_CASE,
                  "{\"expires_at\":\"2026-10-01T16:30:00Z\",\"guest\":{\"process_execution\":true},"
                  "\"id\":\"0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04\",\"node\":\"node-1\","
                  "\"sandbox_template\":{\"name\":\"scratch\",\"namespace\":\"kagent\"},"
                  "\"state\":\"RUNTIME_STATE_READY\"}");
    /* Defaults printed on request: operation NONE, empty strings, null messages. */
    sb.node = ""; /* none (a deleted sandbox's may be kept) */
    char *none = s_dump(&sb.base, 0);
    assert_null(strstr(none, "\"node\""));
    free(none);
    char *all = s_dump(&sb.base, KB_PBJSON_EMIT_DEFAULTS);
    assert_non_null(strstr(all, "\"operation\":\"RUNTIME_OPERATION_NONE\""));
    assert_non_null(strstr(all, "\"creator\":\"\""));
    assert_non_null(strstr(all, "\"node\":\"\""));
    assert_non_null(strstr(all, "\"failure\":null"));
    assert_non_null(strstr(all, "\"fileAccess\":false"));
    free(all);
}

/* A message with every field kind set to a non-default value. */
static const char s_full[] = "{\"child\":{\"fInt32\":-1},"
                             "\"dur\":\"-1.500s\","
                             "\"fBool\":true,"
                             "\"fBytes\":\"AP8Q\","
                             "\"fDouble\":2.5,"
                             "\"fEnum\":\"COLOR_BLUE\","
                             "\"fFixed32\":4000000000,"
                             "\"fFixed64\":\"18446744073709551615\","
                             "\"fFloat\":0.25,"
                             "\"fInt32\":-2147483648,"
                             "\"fInt64\":\"-9223372036854775808\","
                             "\"fMsg\":{\"label\":\"in\",\"n\":7},"
                             "\"fSfixed32\":-5,"
                             "\"fSfixed64\":\"-6\","
                             "\"fSint32\":-7,"
                             "\"fSint64\":\"-8\","
                             "\"fString\":\"h\xc3\xa9llo \\\"q\\\"\","
                             "\"fUint32\":4294967295,"
                             "\"fUint64\":\"18446744073709551615\","
                             "\"lst\":[1,\"two\",null],"
                             "\"mBool\":{\"true\":\"9\"},"
                             "\"mInt\":{\"-3\":{\"label\":\"neg\"}},"
                             "\"mStr\":{\"A\":\"1\"},"
                             "\"oMsg\":{\"n\":1},"
                             "\"rBytes\":[\"\",\"YQ==\"],"
                             "\"rEnum\":[\"COLOR_RED\",\"COLOR_UNSPECIFIED\"],"
                             "\"rInt64\":[\"1\",\"-2\"],"
                             "\"rMsg\":[{},{\"label\":\"x\"}],"
                             "\"rString\":[\"a\",\"\"],"
                             "\"st\":{\"a\":{\"b\":[true,false,{}]},\"n\":1.5,\"z\":null},"
                             "\"ts\":\"1969-12-31T23:59:59.123456789Z\","
                             "\"val\":\"text\"}";

static void test_every_field_kind_round_trip(void **state)
{
    ProtobufCMessage *m = s_load(&pbjsontest__all__descriptor, s_full);
    Pbjsontest__All *a = (Pbjsontest__All *)m;
    assert_int_equal(a->f_int32, INT32_MIN);
    assert_true(a->f_int64 == INT64_MIN);
    assert_true(a->f_uint64 == UINT64_MAX);
    assert_int_equal(a->f_enum, PBJSONTEST__COLOR__COLOR_BLUE);
    assert_int_equal(a->f_bytes.len, 3);
    assert_memory_equal(a->f_bytes.data, "\x00\xff\x10", 3);
    assert_string_equal(a->f_string, "h\xc3\xa9llo \"q\"");
    assert_int_equal(a->choice_case, PBJSONTEST__ALL__CHOICE_O_MSG);
    assert_int_equal(a->ts->seconds, -1);
    assert_int_equal(a->ts->nanos, 123456789);
    assert_int_equal(a->dur->seconds, -1);
    assert_int_equal(a->dur->nanos, -500000000);
    assert_int_equal(a->n_m_int, 1);
    assert_int_equal(a->m_int[0]->key, -3);
    assert_true(a->n_m_bool == 1 && a->m_bool[0]->key && a->m_bool[0]->value == 9);
    /* Back to JSON: identical text (sorted keys). */
    s_expect_json(m, 0, s_full);
    /* Through the wire format and back: still identical. */
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n);
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *m2 = protobuf_c_message_unpack(&pbjsontest__all__descriptor, NULL, n, buf);
    assert_non_null(m2);
    s_expect_json(m2, 0, s_full);
    protobuf_c_message_free_unpacked(m2, NULL);
    free(buf);
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_defaults_omitted_and_oneof_zero_kept(void **state)
{
    Pbjsontest__All a = PBJSONTEST__ALL__INIT;
    s_expect_json(&a.base, 0, "{}");
    a.choice_case = PBJSONTEST__ALL__CHOICE_O_INT;
    a.o_int = 0; /* a set oneof member prints even at its default */
    s_expect_json(&a.base, 0, "{\"oInt\":0}");
    /* An empty parsed object gives a message equal to INIT; "null" fields are defaults. */
    ProtobufCMessage *m =
        s_load(&pbjsontest__all__descriptor, "{\"fInt32\":null,\"f_string\":null,\"fMsg\":null}");
    s_expect_json(m, 0, "{}");
    protobuf_c_message_free_unpacked(m, NULL);
    /* Both spellings accepted on input; proto names and numbers in strings. */
    m = s_load(&pbjsontest__all__descriptor,
               "{\"f_int32\":\"12\",\"fUint32\":3.0,\"f_enum\":2,\"f_float\":\"NaN\","
               "\"f_double\":\"-Infinity\",\"oString\":\"\"}");
    s_expect_json(m, 0,
                  "{\"fDouble\":\"-Infinity\",\"fEnum\":\"COLOR_BLUE\",\"fFloat\":\"NaN\","
                  "\"fInt32\":12,\"fUint32\":3,\"oString\":\"\"}");
    protobuf_c_message_free_unpacked(m, NULL);
    /* An unknown enum number survives as a number. */
    m = s_load(&pbjsontest__all__descriptor, "{\"fEnum\":42}");
    s_expect_json(m, 0, "{\"fEnum\":42}");
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_real_messages(void **state)
{
    /* StartProcessRequest: map, repeated, Duration; ProcessOutput: oneof bytes. */
    const char *spr = "{\"command\":[\"python\",\"--version\"],\"cwd\":\"/data/workspace\","
                      "\"env\":{\"A\":\"1\",\"B\":\"x=y\"},\"timeout\":\"30s\"}";
    ProtobufCMessage *m = s_load(&ateenv__v1alpha__start_process_request__descriptor, spr);
    Ateenv__V1alpha__StartProcessRequest *r = (Ateenv__V1alpha__StartProcessRequest *)m;
    assert_int_equal(r->n_command, 2);
    assert_int_equal(r->n_env, 2);
    assert_int_equal(r->timeout->seconds, 30);
    s_expect_json(m, 0, spr);
    protobuf_c_message_free_unpacked(m, NULL);

    Ateenv__V1alpha__ProcessOutput o;
    ateenv__v1alpha__process_output__init(&o); /* the INIT macro trips -Wmissing-braces */
    o.output_case = ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDOUT;
    o.stdout.data = (uint8_t *)"hi\n";
    o.stdout.len = 3;
    s_expect_json(&o.base, 0, "{\"stdout\":\"aGkK\"}");
    /* Empty bytes in a oneof still print. */
    o.stdout.len = 0;
    s_expect_json(&o.base, 0, "{\"stdout\":\"\"}");
}

static void test_timestamps_and_durations(void **state)
{
    char buf[64];
    struct {
        int64_t s;
        int32_t n;
        const char *want;
    } ts[] = {
        {0, 0, "1970-01-01T00:00:00Z"},
        {1790872200, 0, "2026-10-01T16:30:00Z"},
        {1790872200, 500000000, "2026-10-01T16:30:00.500Z"},
        {1790872200, 1000, "2026-10-01T16:30:00.000001Z"},
        {1790872200, 1, "2026-10-01T16:30:00.000000001Z"},
        {-62135596800LL, 0, "0001-01-01T00:00:00Z"},
        {253402300799LL, 999999999, "9999-12-31T23:59:59.999999999Z"},
        {951782400, 0, "2000-02-29T00:00:00Z"},
    };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        assert_int_equal(kb_pbjson_format_timestamp(ts[i].s, ts[i].n, buf, sizeof buf), 0);
        assert_string_equal(buf, ts[i].want);
        int64_t s;
        int32_t n;
        assert_int_equal(kb_pbjson_parse_timestamp(ts[i].want, &s, &n), 0);
        assert_true(s == ts[i].s && n == ts[i].n);
    }
    assert_int_equal(kb_pbjson_format_timestamp(253402300800LL, 0, buf, sizeof buf), -EINVAL);
    assert_int_equal(kb_pbjson_format_timestamp(0, -1, buf, sizeof buf), -EINVAL);
    int64_t s;
    int32_t n;
    assert_int_equal(kb_pbjson_parse_timestamp("2026-10-01T18:30:00+02:00", &s, &n), 0);
    assert_true(s == 1790872200);
    const char *bad_ts[] = {"2026-10-01 16:30:00Z",
                            "2026-13-01T00:00:00Z",
                            "2026-02-30T00:00:00Z",
                            "2025-02-29T00:00:00Z",
                            "2026-10-01T16:30:00",
                            "2026-10-01T16:30:00.Z",
                            "2026-10-01T16:30:00.1234567890Z",
                            "2026-10-01T24:00:00Z",
                            "0000-01-01T00:00:00Z",
                            "2026-10-01T16:30:00Zjunk",
                            ""};
    for (size_t i = 0; i < sizeof bad_ts / sizeof bad_ts[0]; i++)
        if (kb_pbjson_parse_timestamp(bad_ts[i], &s, &n) != -EINVAL)
            fail_msg("accepted timestamp \"%s\"", bad_ts[i]);

    struct {
        int64_t s;
        int32_t n;
        const char *want;
    } du[] = {{1, 500000000, "1.500s"},
              {0, 0, "0s"},
              {-1, -500000000, "-1.500s"},
              {0, -1000, "-0.000001s"},
              {86400, 0, "86400s"}};
    for (size_t i = 0; i < sizeof du / sizeof du[0]; i++) {
        assert_int_equal(kb_pbjson_format_duration(du[i].s, du[i].n, buf, sizeof buf), 0);
        assert_string_equal(buf, du[i].want);
        assert_int_equal(kb_pbjson_parse_duration(du[i].want, &s, &n), 0);
        assert_true(s == du[i].s && n == du[i].n);
    }
    assert_int_equal(kb_pbjson_parse_duration("1.5s", &s, &n), 0);
    assert_true(s == 1 && n == 500000000);
    assert_int_equal(kb_pbjson_format_duration(1, -1, buf, sizeof buf), -EINVAL);
    const char *bad_du[] = {"1.5", "s", "1m", "--1s", "1.s", "999999999999999s", "1s ", ""};
    for (size_t i = 0; i < sizeof bad_du / sizeof bad_du[0]; i++)
        if (kb_pbjson_parse_duration(bad_du[i], &s, &n) != -EINVAL)
            fail_msg("accepted duration \"%s\"", bad_du[i]);
}

static void test_base64(void **state)
{
    const uint8_t data[] = {0, 1, 2, 0xfb, 0xff, 0xfe, 'x', 'y', 'z', 0x80};
    for (size_t len = 0; len <= sizeof data; len++) {
        char *enc = kb_pbjson_base64_encode(data, len);
        assert_non_null(enc);
        assert_int_equal(strlen(enc), 4 * ((len + 2) / 3));
        uint8_t *dec;
        size_t dlen;
        assert_int_equal(kb_pbjson_base64_decode(enc, &dec, &dlen), 0);
        assert_int_equal(dlen, len);
        if (len)
            assert_memory_equal(dec, data, len);
        free(dec);
        free(enc);
    }
    uint8_t *dec;
    size_t dlen;
    assert_int_equal(kb_pbjson_base64_decode("-_8", &dec, &dlen), 0); /* URL-safe, no padding */
    assert_int_equal(dlen, 2);
    assert_int_equal(dec[0], 0xfb);
    assert_int_equal(dec[1], 0xff);
    free(dec);
    assert_int_equal(kb_pbjson_base64_decode("a", &dec, &dlen), -EINVAL);
    assert_int_equal(kb_pbjson_base64_decode("ab!c", &dec, &dlen), -EINVAL);
    assert_int_equal(kb_pbjson_base64_decode("ab===", &dec, &dlen), -EINVAL);
}

static void test_hostile_json(void **state)
{
    const ProtobufCMessageDescriptor *d = &pbjsontest__all__descriptor;
    s_expect_reject(d, "[]", "expected an object");
    s_expect_reject(d, "\"x\"", "expected an object");
    s_expect_reject(d, "{\"nope\":1}", "unknown field \"nope\"");
    s_expect_reject(d, "{\"fInt32\":2147483648}", "fInt32: integer out of range");
    s_expect_reject(d, "{\"fInt32\":1.5}", "not an integer");
    s_expect_reject(d, "{\"fInt32\":\"12abc\"}", "invalid integer");
    s_expect_reject(d, "{\"fInt32\":\" 12\"}", "invalid integer");
    s_expect_reject(d, "{\"fInt32\":true}", "expected an integer");
    s_expect_reject(d, "{\"fUint32\":-1}", "integer out of range");
    s_expect_reject(d, "{\"fUint64\":\"-1\"}", "invalid unsigned integer");
    s_expect_reject(d, "{\"fUint64\":\"18446744073709551616\"}", "invalid unsigned integer");
    s_expect_reject(d, "{\"fInt64\":\"9223372036854775808\"}", "invalid integer");
    s_expect_reject(d, "{\"fFloat\":1e39}", "float out of range");
    s_expect_reject(d, "{\"fDouble\":\"fast\"}", "invalid number");
    s_expect_reject(d, "{\"fBool\":1}", "expected true or false");
    s_expect_reject(d, "{\"fString\":5}", "expected a string");
    s_expect_reject(d, "{\"fString\":\"a\\u0000b\"}", "is not allowed"); /* by jansson */
    json_t *nul = json_pack("{s:s%}", "fString", "a\0b", (size_t)3);     /* built, not parsed */
    ProtobufCMessage *nm = (void *)1;
    assert_int_equal(kb_pbjson_from_json(d, nul, 0, &nm, s_err, sizeof s_err), -EINVAL);
    assert_null(nm);
    assert_non_null(strstr(s_err, "fString: string contains NUL"));
    json_decref(nul);
    s_expect_reject(d, "{\"fBytes\":\"!!!!\"}", "invalid base64");
    s_expect_reject(d, "{\"fEnum\":\"COLOR_GREEN\"}", "unknown Color value \"COLOR_GREEN\"");
    s_expect_reject(d, "{\"fMsg\":[1]}", "fMsg: expected an object");
    s_expect_reject(d, "{\"fMsg\":{\"label\":{}}}", "fMsg.label: expected a string");
    s_expect_reject(d, "{\"rInt64\":{}}", "expected an array");
    s_expect_reject(d, "{\"rString\":[\"a\",null]}", "must not be null");
    s_expect_reject(d, "{\"rMsg\":[{},{\"n\":\"x\"}]}", "invalid integer");
    s_expect_reject(d, "{\"mInt\":{\"x\":{}}}", "invalid integer");
    s_expect_reject(d, "{\"mStr\":{\"a\":1}}", "expected a string");
    s_expect_reject(d, "{\"mStr\":[]}", "expected an object (map)");
    s_expect_reject(d, "{\"oString\":\"a\",\"oInt\":1}", "more than one member of a oneof");
    s_expect_reject(d, "{\"fString\":\"a\",\"f_string\":\"b\"}", "field given twice");
    s_expect_reject(d, "{\"ts\":\"yesterday\"}", "invalid RFC 3339 timestamp");
    s_expect_reject(d, "{\"ts\":0}", "expected a RFC 3339 timestamp string");
    s_expect_reject(d, "{\"dur\":\"5m\"}", "invalid duration");
    s_expect_reject(d, "{\"st\":[]}", "expected an object");
    s_expect_reject(d, "{\"lst\":{}}", "expected an array");
    s_expect_reject(d, "{\"fInt32\":1", "invalid JSON");
    s_expect_reject(d, "{\"a\":1,\"a\":2}", "invalid JSON"); /* duplicate keys */

    /* Deep nesting: messages and Struct values past the limit are refused, not recursed. */
    size_t depth = 3 * KB_PBJSON_MAX_DEPTH;
    char *deep = malloc(depth * 12 + 16);
    char *p = deep;
    for (size_t i = 0; i < depth; i++)
        p += sprintf(p, "{\"child\":");
    p += sprintf(p, "{}");
    for (size_t i = 0; i < depth; i++)
        *p++ = '}';
    *p = '\0';
    s_expect_reject(d, deep, "nesting deeper than");
    p = deep;
    p += sprintf(p, "{\"lst\":");
    for (size_t i = 0; i < depth; i++)
        *p++ = '[';
    for (size_t i = 0; i < depth; i++)
        *p++ = ']';
    *p++ = '}';
    *p = '\0';
    s_expect_reject(d, deep, "nesting deeper than");
    free(deep);

    /* A failure after allocations (late error in a nested map) leaks nothing (ASan checks). */
    s_expect_reject(
        d,
        "{\"fString\":\"s\",\"rMsg\":[{\"label\":\"a\"}],\"mInt\":{\"1\":{\"label\":"
        "\"b\"}},\"st\":{\"k\":[\"v\",{\"x\":1}]},\"oString\":\"o\",\"fBytes\":\"AA==\","
        "\"rString\":[\"x\",7]}",
        "expected a string");

    /* Unknown fields can be ignored on request. */
    ProtobufCMessage *m = NULL;
    const char *t = "{\"nope\":1,\"fInt32\":3}";
    assert_int_equal(
        kb_pbjson_loads(d, t, strlen(t), KB_PBJSON_IGNORE_UNKNOWN, &m, s_err, sizeof s_err), 0);
    s_expect_json(m, 0, "{\"fInt32\":3}");
    protobuf_c_message_free_unpacked(m, NULL);
}

static void test_to_json_depth_limit(void **state)
{
    /* A message chain deeper than the limit cannot be printed (NULL, not a stack overflow). */
    size_t depth = KB_PBJSON_MAX_DEPTH + 5;
    Pbjsontest__All *nodes = calloc(depth, sizeof *nodes);
    for (size_t i = 0; i < depth; i++) {
        pbjsontest__all__init(&nodes[i]);
        if (i + 1 < depth)
            nodes[i].child = &nodes[i + 1];
    }
    assert_null(kb_pbjson_to_json(&nodes[0].base, 0));
    json_t *j = kb_pbjson_to_json(&nodes[10].base, 0);
    assert_non_null(j);
    json_decref(j);
    free(nodes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sandbox_camel_case_and_wkt),
        cmocka_unit_test(test_every_field_kind_round_trip),
        cmocka_unit_test(test_defaults_omitted_and_oneof_zero_kept),
        cmocka_unit_test(test_real_messages),
        cmocka_unit_test(test_timestamps_and_durations),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_hostile_json),
        cmocka_unit_test(test_to_json_depth_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
