/*
 * fuzz_proto: a gRPC request body as the server core receives it: protobuf bytes unpacked with
 * protobuf-c into the method's request type (grpc_server.c does exactly this), then what the
 * api bridge does with a request's free-form parts: kb_pbjson_to_json (a template's
 * StructuredObject goes through it on CreateSandboxTemplate). A message that unpacked must pack
 * to exactly its packed size. (Re-encoding is not compared: protobuf-c keeps unknown fields
 * as read, e.g. an over-long tag 0, and writes them canonically.)
 *
 * Input: the first byte picks the method (requests of every public service), the rest is the
 * message.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_messages.h"
#include "pbjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const ProtobufCMessageDescriptor *desc = fuzz_message(data[0], false);
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, size - 1, data + 1);
    if (!msg)
        return 0;
    if (!protobuf_c_message_check(msg))
        abort();
    size_t n = protobuf_c_message_get_packed_size(msg); /* as a reply would be packed */
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || protobuf_c_message_pack(msg, buf) != n)
        abort();
    char *json = kb_pbjson_dumps(msg, 0, JSON_COMPACT);
    free(json); /* NULL is allowed: nesting deeper than KB_PBJSON_MAX_DEPTH */
    free(buf);
    protobuf_c_message_free_unpacked(msg, NULL);
    return 0;
}
