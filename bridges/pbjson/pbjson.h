/*
 * kb_pbjson: any protobuf-c message <-> JSON (jansson), driven by the protobuf-c descriptors,
 * following the proto3 JSON mapping as protoc's JSON printer/parser do:
 *
 *   - names: lowerCamelCase of the field name (json_name); KB_PBJSON_SNAKE_CASE prints the
 *     proto field names instead (MCP uses snake_case). The parser accepts both spellings.
 *   - enums by value name (an unknown number prints as a number); int64/uint64 as strings;
 *     bytes as standard base64; float/double NaN/Infinity as strings.
 *   - google.protobuf.Timestamp as RFC 3339 ("2026-10-01T16:30:00Z"), Duration as "1.5s",
 *     Struct / Value / ListValue as plain JSON.
 *   - maps as JSON objects (keys are strings), repeated as arrays, oneofs by their set member.
 *   - default values (0, false, "", empty bytes, enum 0, empty repeated/map, unset message) are
 *     omitted unless KB_PBJSON_EMIT_DEFAULTS; a set oneof member is always printed.
 *
 * Messages built by kb_pbjson_from_json are malloc-allocated throughout, so they are freed with
 * protobuf_c_message_free_unpacked(msg, NULL).
 */
#ifndef KB_PBJSON_H
#define KB_PBJSON_H

#include <stddef.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

/* Output options (bit flags). */
#define KB_PBJSON_SNAKE_CASE    (1u << 0) /* proto field names instead of lowerCamelCase */
#define KB_PBJSON_EMIT_DEFAULTS (1u << 1) /* print fields that hold their default value */

/* Parser options (bit flags). */
#define KB_PBJSON_IGNORE_UNKNOWN (1u << 0) /* skip unknown object keys instead of failing */

#define KB_PBJSON_MAX_DEPTH 100 /* nesting limit for both directions, like protobuf's */
#define KB_PBJSON_ERR_CAP   256

/* Converts msg to a new JSON value (caller owns the reference), or NULL on allocation failure
 * or on nesting deeper than KB_PBJSON_MAX_DEPTH. */
json_t *kb_pbjson_to_json(const ProtobufCMessage *msg, unsigned flags);

/* Converts msg to a JSON text (caller frees with free()). json_flags are jansson dump flags
 * (e.g. JSON_INDENT(2) | JSON_COMPACT); 0 gives jansson's default. NULL on failure. */
char *kb_pbjson_dumps(const ProtobufCMessage *msg, unsigned flags, size_t json_flags);

/* Builds a new message of type desc from json. On success *out owns the message (free with
 * protobuf_c_message_free_unpacked(*out, NULL)) and 0 is returned. On failure returns -EINVAL
 * (the JSON does not fit the message; err says where and why, e.g.
 * `sandbox.expiresAt: invalid RFC 3339 timestamp`) or -ENOMEM, and *out is NULL. */
int kb_pbjson_from_json(const ProtobufCMessageDescriptor *desc, const json_t *json,
                        unsigned parse_flags, ProtobufCMessage **out, char *err, size_t errcap);

/* Same, from JSON text of len bytes. */
int kb_pbjson_loads(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                    unsigned parse_flags, ProtobufCMessage **out, char *err, size_t errcap);

/* Formats a Timestamp (seconds, nanos) as RFC 3339 UTC into buf (>= 40 bytes). Returns 0, or
 * -EINVAL when out of the 0001..9999 range or nanos invalid. */
int kb_pbjson_format_timestamp(int64_t seconds, int32_t nanos, char *buf, size_t cap);
/* Parses an RFC 3339 timestamp (any offset, optional fraction up to 9 digits). 0 or -EINVAL. */
int kb_pbjson_parse_timestamp(const char *s, int64_t *seconds, int32_t *nanos);
/* Formats a Duration as "<s>[.fff]s" into buf (>= 32 bytes). 0 or -EINVAL. */
int kb_pbjson_format_duration(int64_t seconds, int32_t nanos, char *buf, size_t cap);
/* Parses "<s>[.f]s" (optional sign). 0 or -EINVAL. */
int kb_pbjson_parse_duration(const char *s, int64_t *seconds, int32_t *nanos);

/* Standard base64 with padding; returns a malloc'd NUL-terminated string or NULL. */
char *kb_pbjson_base64_encode(const uint8_t *data, size_t len);
/* Decodes standard or URL-safe base64, padding optional. Returns 0 and a malloc'd buffer
 * (caller frees; may be NULL when *len is 0), or -EINVAL / -ENOMEM. */
int kb_pbjson_base64_decode(const char *s, uint8_t **data, size_t *len);

#endif
