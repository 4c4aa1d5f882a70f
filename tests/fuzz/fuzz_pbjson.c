/*
 * fuzz_pbjson: JSON text through kb_pbjson_loads into a message of the public API (proto3 JSON
 * mapping: names, enums, 64-bit strings, base64 bytes, Timestamp, Duration, Struct, maps,
 * oneofs), then back with kb_pbjson_dumps. What was accepted must print, and the printed JSON
 * must load again and print the same.
 *
 * Input: the first byte picks the message type (low bit: response, else request; the rest: the
 * method), the rest is the JSON text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_messages.h"
#include "pbjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const ProtobufCMessageDescriptor *desc = fuzz_message(data[0] >> 1, data[0] & 1);
    char err[KB_PBJSON_ERR_CAP];
    ProtobufCMessage *msg = NULL;
    if (kb_pbjson_loads(desc, (const char *)data + 1, size - 1, 0, &msg, err, sizeof err) != 0) {
        if (msg || !memchr(err, '\0', sizeof err))
            abort();
        return 0;
    }
    char *text = kb_pbjson_dumps(msg, 0, JSON_COMPACT);
    if (!text)
        abort();
    ProtobufCMessage *again = NULL;
    if (kb_pbjson_loads(desc, text, strlen(text), 0, &again, err, sizeof err) != 0) {
        fprintf(stderr, "%s: printed JSON refused: %s\n%s\n", desc->name, err, text);
        abort();
    }
    char *text2 = kb_pbjson_dumps(again, 0, JSON_COMPACT);
    if (!text2 || strcmp(text, text2) != 0) {
        fprintf(stderr, "%s: printed JSON changed:\n%s\n%s\n", desc->name, text,
                text2 ? text2 : "(null)");
        abort();
    }
    free(text2);
    free(text);
    protobuf_c_message_free_unpacked(again, NULL);
    protobuf_c_message_free_unpacked(msg, NULL);
    return 0;
}
