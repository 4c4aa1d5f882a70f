/* Unit tests for the generated protocol buffers: round trips, enums by name, hostile bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"

static void test_sandbox_round_trip(void **unused)
{
    Kagent__Api__V1__ResourceReference ref = KAGENT__API__V1__RESOURCE_REFERENCE__INIT;
    ref.namespace_ = "kagent";
    ref.name = "scratch";
    Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    ts.seconds = 1790000000;
    Kagent__Api__V1__Sandbox sb = KAGENT__API__V1__SANDBOX__INIT;
    sb.id = "0198c3f1-2a44-7c90-b5e1-9d8f3a7b2c04";
    sb.sandbox_template = &ref;
    sb.state = KAGENT__API__V1__RUNTIME_STATE__RUNTIME_STATE_READY;
    sb.expires_at = &ts;
    sb.node = "node-1";
    size_t n = kagent__api__v1__sandbox__get_packed_size(&sb);
    uint8_t *buf = malloc(n);
    assert_int_equal(kagent__api__v1__sandbox__pack(&sb, buf), n);
    Kagent__Api__V1__Sandbox *back = kagent__api__v1__sandbox__unpack(NULL, n, buf);
    assert_non_null(back);
    assert_string_equal(back->id, sb.id);
    assert_string_equal(back->sandbox_template->name, "scratch");
    assert_int_equal(back->expires_at->seconds, 1790000000);
    assert_string_equal(back->node, "node-1");
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(
        &kagent__api__v1__sandbox__descriptor, "node");
    assert_int_equal(f->id, 13); /* field numbers are the wire contract */
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
        &kagent__api__v1__runtime_state__descriptor, back->state);
    assert_string_equal(v->name, "RUNTIME_STATE_READY");
    kagent__api__v1__sandbox__free_unpacked(back, NULL);
    /* every truncation of a valid message is refused or decodes without crashing */
    for (size_t cut = 0; cut < n; cut++) {
        Kagent__Api__V1__Sandbox *p = kagent__api__v1__sandbox__unpack(NULL, cut, buf);
        if (p)
            kagent__api__v1__sandbox__free_unpacked(p, NULL);
    }
    free(buf);
}

static void test_hostile_bytes_refused(void **unused)
{
    /* field 1 (string) claiming a 2^31 byte length */
    static const uint8_t bad[] = {0x0a, 0x80, 0x80, 0x80, 0x80, 0x08, 'x'};
    assert_null(ateenv__v1alpha__start_process_request__unpack(NULL, sizeof bad, bad));
}

static void test_descriptor_set_built(void **unused)
{
    FILE *f = fopen(KAGENT_PROTOSET, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    assert_true(ftell(f) > 1000);
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sandbox_round_trip),
        cmocka_unit_test(test_hostile_bytes_refused),
        cmocka_unit_test(test_descriptor_set_built),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
