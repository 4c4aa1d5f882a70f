/*
 * kb_pbjson: protobuf-c <-> JSON by descriptor. See pbjson.h for the mapping.
 */
#include "pbjson.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define S_MEMBER(type, msg, off) (*(type *)((uint8_t *)(msg) + (off)))
#define S_MEMBER_PTR(msg, off)   ((void *)((uint8_t *)(msg) + (off)))

/* Seconds bounds of Timestamp (0001-01-01 .. 9999-12-31) and Duration (+-10000 years). */
#define S_TS_MIN  (-62135596800LL)
#define S_TS_MAX  (253402300799LL)
#define S_DUR_MAX (315576000000LL)

/* ------------------------------------------------------------------------------------------ */
/* Names                                                                                      */

/* lowerCamelCase json_name of a proto field name, as protoc computes it. */
static void s_camel(const char *name, char *out, size_t cap)
{
    size_t o = 0;
    bool up = false;
    for (const char *p = name; *p && o + 1 < cap; p++) {
        if (*p == '_') {
            up = true;
            continue;
        }
        char c = *p;
        if (up && c >= 'a' && c <= 'z')
            c = (char)(c - 'a' + 'A');
        up = false;
        out[o++] = c;
    }
    out[o] = '\0';
}

static bool s_is(const ProtobufCMessageDescriptor *d, const char *full)
{
    return d && strcmp(d->name, full) == 0;
}

static bool s_is_enum(const ProtobufCEnumDescriptor *d, const char *full)
{
    return d && strcmp(d->name, full) == 0;
}

/* True if f is a message field of the named type. */
static bool s_field_is(const ProtobufCFieldDescriptor *f, const char *full)
{
    return f->type == PROTOBUF_C_TYPE_MESSAGE && s_is(f->descriptor, full);
}

/* A map entry is a repeated message field whose type is the generated <Field>Entry with
 * fields key=1 and value=2 (protobuf-c keeps no map_entry option). */
static bool s_is_map(const ProtobufCFieldDescriptor *f)
{
    if (f->label != PROTOBUF_C_LABEL_REPEATED || f->type != PROTOBUF_C_TYPE_MESSAGE)
        return false;
    const ProtobufCMessageDescriptor *d = f->descriptor;
    if (d->n_fields != 2 || strcmp(d->fields[0].name, "key") != 0 || d->fields[0].id != 1 ||
        strcmp(d->fields[1].name, "value") != 0 || d->fields[1].id != 2)
        return false;
    size_t n = strlen(d->short_name);
    return n > 5 && strcmp(d->short_name + n - 5, "Entry") == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Base64                                                                                     */

static const char s_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *kb_pbjson_base64_encode(const uint8_t *data, size_t len)
{
    size_t out_len = 4 * ((len + 2) / 3);
    char *out = malloc(out_len + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16;
        if (i + 1 < len)
            v |= (uint32_t)data[i + 1] << 8;
        if (i + 2 < len)
            v |= data[i + 2];
        out[o++] = s_b64[(v >> 18) & 63];
        out[o++] = s_b64[(v >> 12) & 63];
        out[o++] = i + 1 < len ? s_b64[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? s_b64[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int s_b64_val(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

int kb_pbjson_base64_decode(const char *s, uint8_t **data, size_t *len)
{
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '=')
        n--;
    if (strlen(s) - n > 2 || n % 4 == 1)
        return -EINVAL;
    *data = NULL;
    *len = 0;
    if (n == 0)
        return 0;
    uint8_t *out = malloc(n * 3 / 4 + 3);
    if (!out)
        return -ENOMEM;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = s_b64_val(s[i]);
        if (v < 0) {
            free(out);
            return -EINVAL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    *data = out;
    *len = o;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Timestamp and Duration                                                                     */

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm). */
static int64_t s_days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void s_civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

/* Fraction digits as protoc prints them: none, 3, 6 or 9. */
static void s_frac(int32_t nanos, char *buf, size_t cap)
{
    if (nanos == 0)
        buf[0] = '\0';
    else if (nanos % 1000000 == 0)
        snprintf(buf, cap, ".%03d", nanos / 1000000);
    else if (nanos % 1000 == 0)
        snprintf(buf, cap, ".%06d", nanos / 1000);
    else
        snprintf(buf, cap, ".%09d", nanos);
}

int kb_pbjson_format_timestamp(int64_t seconds, int32_t nanos, char *buf, size_t cap)
{
    if (seconds < S_TS_MIN || seconds > S_TS_MAX || nanos < 0 || nanos > 999999999)
        return -EINVAL;
    int64_t days = seconds >= 0 ? seconds / 86400 : -((-seconds + 86399) / 86400);
    int64_t rem = seconds - days * 86400;
    int64_t y;
    unsigned m, d;
    s_civil_from_days(days, &y, &m, &d);
    char frac[16];
    s_frac(nanos, frac, sizeof frac);
    snprintf(buf, cap, "%04" PRId64 "-%02u-%02uT%02d:%02d:%02d%sZ", y, m, d, (int)(rem / 3600),
             (int)(rem / 60 % 60), (int)(rem % 60), frac);
    return 0;
}

/* Reads exactly n digits. */
static bool s_digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if ((*p)[i] < '0' || (*p)[i] > '9')
            return false;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    *out = v;
    return true;
}

/* Reads ".d{1,9}" if present into nanos. */
static bool s_parse_frac(const char **p, int32_t *nanos)
{
    *nanos = 0;
    if (**p != '.')
        return true;
    (*p)++;
    int n = 0;
    int32_t v = 0;
    while (**p >= '0' && **p <= '9') {
        if (n == 9)
            return false;
        v = v * 10 + (**p - '0');
        (*p)++;
        n++;
    }
    if (n == 0)
        return false;
    for (; n < 9; n++)
        v *= 10;
    *nanos = v;
    return true;
}

int kb_pbjson_parse_timestamp(const char *s, int64_t *seconds, int32_t *nanos)
{
    const char *p = s;
    int y, mo, d, h, mi, se;
    if (!s_digits(&p, 4, &y) || *p++ != '-' || !s_digits(&p, 2, &mo) || *p++ != '-' ||
        !s_digits(&p, 2, &d) || (*p != 'T' && *p != 't'))
        return -EINVAL;
    p++;
    if (!s_digits(&p, 2, &h) || *p++ != ':' || !s_digits(&p, 2, &mi) || *p++ != ':' ||
        !s_digits(&p, 2, &se))
        return -EINVAL;
    static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 || se > 59)
        return -EINVAL;
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (mo == 2 && d == 29 && !leap)
        return -EINVAL;
    int32_t ns;
    if (!s_parse_frac(&p, &ns))
        return -EINVAL;
    int64_t off = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p == '-' ? -1 : 1;
        int oh, om;
        p++;
        if (!s_digits(&p, 2, &oh) || *p++ != ':' || !s_digits(&p, 2, &om) || oh > 23 || om > 59)
            return -EINVAL;
        off = sign * ((int64_t)oh * 3600 + (int64_t)om * 60);
    } else {
        return -EINVAL;
    }
    if (*p)
        return -EINVAL;
    int64_t secs = s_days_from_civil(y, (unsigned)mo, (unsigned)d) * 86400 + (int64_t)h * 3600 +
                   (int64_t)mi * 60 + se - off;
    if (secs < S_TS_MIN || secs > S_TS_MAX)
        return -EINVAL;
    *seconds = secs;
    *nanos = ns;
    return 0;
}

int kb_pbjson_format_duration(int64_t seconds, int32_t nanos, char *buf, size_t cap)
{
    if (seconds < -S_DUR_MAX || seconds > S_DUR_MAX || nanos <= -1000000000 ||
        nanos >= 1000000000 || (seconds > 0 && nanos < 0) || (seconds < 0 && nanos > 0))
        return -EINVAL;
    bool neg = seconds < 0 || nanos < 0;
    char frac[16];
    s_frac(nanos < 0 ? -nanos : nanos, frac, sizeof frac);
    snprintf(buf, cap, "%s%" PRId64 "%ss", neg ? "-" : "", seconds < 0 ? -seconds : seconds, frac);
    return 0;
}

int kb_pbjson_parse_duration(const char *s, int64_t *seconds, int32_t *nanos)
{
    const char *p = s;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    if (*p < '0' || *p > '9')
        return -EINVAL;
    int64_t secs = 0;
    while (*p >= '0' && *p <= '9') {
        secs = secs * 10 + (*p - '0');
        if (secs > S_DUR_MAX)
            return -EINVAL;
        p++;
    }
    int32_t ns;
    if (!s_parse_frac(&p, &ns) || *p++ != 's' || *p)
        return -EINVAL;
    *seconds = neg ? -secs : secs;
    *nanos = neg ? -ns : ns;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Message -> JSON                                                                            */

static json_t *s_msg_to_json(const ProtobufCMessage *msg, unsigned flags, int depth);

static json_t *s_value_to_json(const ProtobufCMessage *v, int depth);

static json_t *s_struct_to_json(const ProtobufCMessage *msg, int depth)
{
    /* Struct { map<string, Value> fields = 1; } */
    const ProtobufCFieldDescriptor *f = &msg->descriptor->fields[0];
    size_t n = S_MEMBER(size_t, msg, f->quantifier_offset);
    ProtobufCMessage **ents = S_MEMBER(ProtobufCMessage **, msg, f->offset);
    json_t *obj = json_object();
    if (!obj)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const ProtobufCMessageDescriptor *ed = ents[i]->descriptor;
        const char *key = S_MEMBER(const char *, ents[i], ed->fields[0].offset);
        const ProtobufCMessage *val =
            S_MEMBER(const ProtobufCMessage *, ents[i], ed->fields[1].offset);
        json_t *j = val ? s_value_to_json(val, depth + 1) : json_null();
        if (!j || json_object_set_new(obj, key ? key : "", j) != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

static json_t *s_list_to_json(const ProtobufCMessage *msg, int depth)
{
    const ProtobufCFieldDescriptor *f = &msg->descriptor->fields[0];
    size_t n = S_MEMBER(size_t, msg, f->quantifier_offset);
    ProtobufCMessage **vals = S_MEMBER(ProtobufCMessage **, msg, f->offset);
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *j = s_value_to_json(vals[i], depth + 1);
        if (!j || json_array_append_new(arr, j) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

/* google.protobuf.Value: oneof kind { null_value=1, number_value=2, string_value=3,
 * bool_value=4, struct_value=5, list_value=6 }. */
static json_t *s_value_to_json(const ProtobufCMessage *v, int depth)
{
    if (depth > KB_PBJSON_MAX_DEPTH)
        return NULL;
    const ProtobufCMessageDescriptor *d = v->descriptor;
    uint32_t kase = S_MEMBER(uint32_t, v, d->fields[0].quantifier_offset);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->id != kase)
            continue;
        switch (f->id) {
        case 1:
            return json_null();
        case 2: {
            double x = S_MEMBER(double, v, f->offset);
            if (isnan(x))
                return json_string("NaN");
            if (isinf(x))
                return json_string(x > 0 ? "Infinity" : "-Infinity");
            if (x == floor(x) && fabs(x) < 9007199254740992.0)
                return json_integer((json_int_t)x);
            return json_real(x);
        }
        case 3: {
            const char *s = S_MEMBER(const char *, v, f->offset);
            return json_string(s ? s : "");
        }
        case 4:
            return json_boolean(S_MEMBER(protobuf_c_boolean, v, f->offset));
        case 5: {
            const ProtobufCMessage *m = S_MEMBER(const ProtobufCMessage *, v, f->offset);
            return m ? s_struct_to_json(m, depth + 1) : json_object();
        }
        case 6: {
            const ProtobufCMessage *m = S_MEMBER(const ProtobufCMessage *, v, f->offset);
            return m ? s_list_to_json(m, depth + 1) : json_array();
        }
        default:
            break;
        }
    }
    return json_null();
}

/* A well-known type as its special JSON form, or NULL with *handled false. */
static json_t *s_wkt_to_json(const ProtobufCMessage *msg, int depth, bool *handled)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    char buf[64];
    *handled = true;
    if (s_is(d, "google.protobuf.Timestamp") || s_is(d, "google.protobuf.Duration")) {
        int64_t secs = S_MEMBER(int64_t, msg, d->fields[0].offset);
        int32_t nanos = S_MEMBER(int32_t, msg, d->fields[1].offset);
        int rc = s_is(d, "google.protobuf.Timestamp")
                     ? kb_pbjson_format_timestamp(secs, nanos, buf, sizeof buf)
                     : kb_pbjson_format_duration(secs, nanos, buf, sizeof buf);
        return rc == 0 ? json_string(buf) : NULL;
    }
    if (s_is(d, "google.protobuf.Struct"))
        return s_struct_to_json(msg, depth);
    if (s_is(d, "google.protobuf.Value"))
        return s_value_to_json(msg, depth);
    if (s_is(d, "google.protobuf.ListValue"))
        return s_list_to_json(msg, depth);
    *handled = false;
    return NULL;
}

/* One scalar/enum/message element at p (a pointer into the message or a repeated array). */
static json_t *s_elem_to_json(const ProtobufCFieldDescriptor *f, const void *p, unsigned flags,
                              int depth)
{
    char buf[32];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(buf, sizeof buf, "%" PRId64, *(const int64_t *)p);
        return json_string(buf);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(buf, sizeof buf, "%" PRIu64, *(const uint64_t *)p);
        return json_string(buf);
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        double x =
            f->type == PROTOBUF_C_TYPE_FLOAT ? (double)*(const float *)p : *(const double *)p;
        if (isnan(x))
            return json_string("NaN");
        if (isinf(x))
            return json_string(x > 0 ? "Infinity" : "-Infinity");
        return json_real(x);
    }
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        int v = *(const int *)p;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        if (s_is_enum(f->descriptor, "google.protobuf.NullValue"))
            return json_null();
        return ev ? json_string(ev->name) : json_integer(v);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(const char *const *)p;
        return json_stringn(s ? s : "", s ? strlen(s) : 0);
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        char *enc = kb_pbjson_base64_encode(b->data, b->len);
        if (!enc)
            return NULL;
        json_t *j = json_string(enc);
        free(enc);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(const ProtobufCMessage *const *)p;
        if (!m)
            return json_null();
        return s_msg_to_json(m, flags, depth + 1);
    }
    }
    return NULL;
}

static size_t s_elem_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

/* True if the singular element at p holds its proto3 default. */
static bool s_is_default(const ProtobufCFieldDescriptor *f, const void *p)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(const char *const *)p;
        return !s || !*s;
    }
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)p)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE:
        return *(const void *const *)p == NULL;
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const float *)p == 0 && !signbit(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const double *)p == 0 && !signbit(*(const double *)p);
    default:
        break;
    }
    return s_elem_size(f) == 4 ? *(const uint32_t *)p == 0 : *(const uint64_t *)p == 0;
}

static json_t *s_map_to_json(const ProtobufCFieldDescriptor *f, const ProtobufCMessage *msg,
                             unsigned flags, int depth)
{
    size_t n = S_MEMBER(size_t, msg, f->quantifier_offset);
    ProtobufCMessage **ents = S_MEMBER(ProtobufCMessage **, msg, f->offset);
    const ProtobufCMessageDescriptor *ed = f->descriptor;
    json_t *obj = json_object();
    if (!obj)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *k = s_elem_to_json(&ed->fields[0], S_MEMBER_PTR(ents[i], ed->fields[0].offset),
                                   flags, depth);
        json_t *v = s_elem_to_json(&ed->fields[1], S_MEMBER_PTR(ents[i], ed->fields[1].offset),
                                   flags, depth);
        char kb[32];
        const char *key = kb;
        if (k && json_is_string(k))
            key = json_string_value(k);
        else if (k && json_is_integer(k))
            snprintf(kb, sizeof kb, "%" JSON_INTEGER_FORMAT, json_integer_value(k));
        else if (k && json_is_boolean(k))
            snprintf(kb, sizeof kb, "%s", json_is_true(k) ? "true" : "false");
        else
            kb[0] = '\0';
        int rc = k && v ? json_object_set_new(obj, key, v) : -1; /* set_new consumes v */
        if (!(k && v))
            json_decref(v);
        json_decref(k);
        if (rc != 0) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

static json_t *s_msg_to_json(const ProtobufCMessage *msg, unsigned flags, int depth)
{
    if (depth > KB_PBJSON_MAX_DEPTH)
        return NULL;
    bool handled;
    json_t *w = s_wkt_to_json(msg, depth, &handled);
    if (handled)
        return w;
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    json_t *obj = json_object();
    if (!obj)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        json_t *j = NULL;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = S_MEMBER(size_t, msg, f->quantifier_offset);
            if (n == 0 && !(flags & KB_PBJSON_EMIT_DEFAULTS))
                continue;
            if (s_is_map(f)) {
                j = s_map_to_json(f, msg, flags, depth);
            } else {
                const uint8_t *arr = S_MEMBER(const uint8_t *, msg, f->offset);
                size_t sz = s_elem_size(f);
                j = json_array();
                for (size_t k = 0; j && k < n; k++) {
                    json_t *e = s_elem_to_json(f, arr + k * sz, flags, depth);
                    if (!e || json_array_append_new(j, e) != 0) {
                        json_decref(j);
                        j = NULL;
                    }
                }
            }
        } else {
            const void *p = S_MEMBER_PTR(msg, f->offset);
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                if (S_MEMBER(uint32_t, msg, f->quantifier_offset) != f->id)
                    continue;
            } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
                       f->type != PROTOBUF_C_TYPE_MESSAGE) {
                if (!S_MEMBER(protobuf_c_boolean, msg, f->quantifier_offset) &&
                    !(flags & KB_PBJSON_EMIT_DEFAULTS))
                    continue;
            } else if (s_is_default(f, p) && !(flags & KB_PBJSON_EMIT_DEFAULTS)) {
                continue;
            }
            j = s_elem_to_json(f, p, flags, depth);
        }
        if (!j)
            goto fail;
        char name[128];
        if (flags & KB_PBJSON_SNAKE_CASE)
            snprintf(name, sizeof name, "%s", f->name);
        else
            s_camel(f->name, name, sizeof name);
        if (json_object_set_new(obj, name, j) != 0)
            goto fail;
    }
    return obj;
fail:
    json_decref(obj);
    return NULL;
}

json_t *kb_pbjson_to_json(const ProtobufCMessage *msg, unsigned flags)
{
    if (!msg)
        return NULL;
    return s_msg_to_json(msg, flags, 0);
}

char *kb_pbjson_dumps(const ProtobufCMessage *msg, unsigned flags, size_t json_flags)
{
    json_t *j = kb_pbjson_to_json(msg, flags);
    if (!j)
        return NULL;
    char *s = json_dumps(j, json_flags | JSON_ENCODE_ANY);
    json_decref(j);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON -> message                                                                            */

typedef struct {
    char *err;
    size_t cap;
    unsigned flags;
    char path[256]; /* dotted JSON path of the current field, for messages */
} s_parse_t;

static int s_fail(s_parse_t *ps, const char *fmt, ...)
{
    char what[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* Deep paths keep their tail so the reason always fits. */
    size_t plen = strlen(ps->path);
    const char *path = plen > 80 ? ps->path + plen - 80 : ps->path;
    if (ps->err && ps->cap)
        snprintf(ps->err, ps->cap, "%s%s%s%s", plen > 80 ? "..." : "", path,
                 ps->path[0] ? ": " : "", what);
    return -EINVAL;
}

static int s_msg_from_json(s_parse_t *ps, ProtobufCMessage *msg, const json_t *j, int depth);

static ProtobufCMessage *s_msg_alloc(const ProtobufCMessageDescriptor *d)
{
    ProtobufCMessage *m = malloc(d->sizeof_message);
    if (m)
        d->message_init(m);
    return m;
}

/* Parses a JSON integer, integral real or decimal string into [lo, hi]. */
static int s_int_from_json(s_parse_t *ps, const json_t *j, int64_t lo, int64_t hi, int64_t *out)
{
    if (json_is_integer(j)) {
        json_int_t v = json_integer_value(j);
        if (v < lo || v > hi)
            return s_fail(ps, "integer out of range");
        *out = v;
        return 0;
    }
    if (json_is_real(j)) {
        double x = json_real_value(j);
        if (x != floor(x) || x < (double)lo || x > (double)hi || fabs(x) > 9007199254740992.0)
            return s_fail(ps, "not an integer in range");
        *out = (int64_t)x;
        return 0;
    }
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (!*s || *end || errno || v < lo || v > hi || s[0] == ' ' || s[0] == '+')
            return s_fail(ps, "invalid integer \"%.40s\"", s);
        *out = v;
        return 0;
    }
    return s_fail(ps, "expected an integer");
}

static int s_uint64_from_json(s_parse_t *ps, const json_t *j, uint64_t *out)
{
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        char *end;
        errno = 0;
        if (!*s || *s == '-' || *s == ' ' || *s == '+')
            return s_fail(ps, "invalid unsigned integer \"%.40s\"", s);
        unsigned long long v = strtoull(s, &end, 10);
        if (*end || errno)
            return s_fail(ps, "invalid unsigned integer \"%.40s\"", s);
        *out = v;
        return 0;
    }
    int64_t v = 0;
    int rc = s_int_from_json(ps, j, 0, INT64_MAX, &v);
    if (rc == 0)
        *out = (uint64_t)v;
    return rc;
}

static int s_double_from_json(s_parse_t *ps, const json_t *j, double *out)
{
    if (json_is_number(j)) {
        *out = json_number_value(j);
        return 0;
    }
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        if (strcmp(s, "NaN") == 0)
            *out = NAN;
        else if (strcmp(s, "Infinity") == 0)
            *out = INFINITY;
        else if (strcmp(s, "-Infinity") == 0)
            *out = -INFINITY;
        else {
            char *end;
            errno = 0;
            *out = strtod(s, &end);
            if (!*s || *end || errno || isspace((unsigned char)*s))
                return s_fail(ps, "invalid number \"%.40s\"", s);
        }
        return 0;
    }
    return s_fail(ps, "expected a number");
}

static int s_value_from_json(s_parse_t *ps, ProtobufCMessage *v, const json_t *j, int depth);

static int s_struct_from_json(s_parse_t *ps, ProtobufCMessage *msg, const json_t *j, int depth)
{
    if (!json_is_object(j))
        return s_fail(ps, "expected an object");
    const ProtobufCFieldDescriptor *f = &msg->descriptor->fields[0];
    const ProtobufCMessageDescriptor *ed = f->descriptor;
    size_t n = json_object_size(j);
    if (n == 0)
        return 0;
    ProtobufCMessage **ents = calloc(n, sizeof *ents);
    if (!ents)
        return -ENOMEM;
    S_MEMBER(ProtobufCMessage **, msg, f->offset) = ents;
    const char *key;
    json_t *val;
    size_t i = 0;
    json_object_foreach((json_t *)j, key, val)
    {
        ProtobufCMessage *e = s_msg_alloc(ed);
        if (!e)
            return -ENOMEM;
        ents[i++] = e;
        S_MEMBER(size_t, msg, f->quantifier_offset) = i;
        char *k = strdup(key);
        if (!k)
            return -ENOMEM;
        S_MEMBER(char *, e, ed->fields[0].offset) = k;
        ProtobufCMessage *v = s_msg_alloc(ed->fields[1].descriptor);
        if (!v)
            return -ENOMEM;
        S_MEMBER(ProtobufCMessage *, e, ed->fields[1].offset) = v;
        int rc = s_value_from_json(ps, v, val, depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

static int s_list_from_json(s_parse_t *ps, ProtobufCMessage *msg, const json_t *j, int depth)
{
    if (!json_is_array(j))
        return s_fail(ps, "expected an array");
    const ProtobufCFieldDescriptor *f = &msg->descriptor->fields[0];
    size_t n = json_array_size(j);
    if (n == 0)
        return 0;
    ProtobufCMessage **vals = calloc(n, sizeof *vals);
    if (!vals)
        return -ENOMEM;
    S_MEMBER(ProtobufCMessage **, msg, f->offset) = vals;
    for (size_t i = 0; i < n; i++) {
        ProtobufCMessage *v = s_msg_alloc(f->descriptor);
        if (!v)
            return -ENOMEM;
        vals[i] = v;
        S_MEMBER(size_t, msg, f->quantifier_offset) = i + 1;
        int rc = s_value_from_json(ps, v, json_array_get(j, i), depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

static int s_value_from_json(s_parse_t *ps, ProtobufCMessage *v, const json_t *j, int depth)
{
    if (depth > KB_PBJSON_MAX_DEPTH)
        return s_fail(ps, "nesting deeper than %d", KB_PBJSON_MAX_DEPTH);
    const ProtobufCMessageDescriptor *d = v->descriptor;
    uint32_t *kase = (uint32_t *)S_MEMBER_PTR(v, d->fields[0].quantifier_offset);
    const ProtobufCFieldDescriptor *f = NULL;
    uint32_t want;
    if (json_is_null(j))
        want = 1;
    else if (json_is_number(j))
        want = 2;
    else if (json_is_string(j))
        want = 3;
    else if (json_is_boolean(j))
        want = 4;
    else if (json_is_object(j))
        want = 5;
    else
        want = 6;
    for (unsigned i = 0; i < d->n_fields; i++)
        if (d->fields[i].id == want)
            f = &d->fields[i];
    if (!f)
        return s_fail(ps, "bad google.protobuf.Value descriptor");
    *kase = want;
    switch (want) {
    case 1:
        S_MEMBER(int, v, f->offset) = 0;
        return 0;
    case 2:
        S_MEMBER(double, v, f->offset) = json_number_value(j);
        return 0;
    case 3: {
        char *s = strndup(json_string_value(j), json_string_length(j));
        if (!s) {
            *kase = 0;
            return -ENOMEM;
        }
        S_MEMBER(char *, v, f->offset) = s;
        return 0;
    }
    case 4:
        S_MEMBER(protobuf_c_boolean, v, f->offset) = json_is_true(j);
        return 0;
    default: {
        ProtobufCMessage *m = s_msg_alloc(f->descriptor);
        if (!m) {
            *kase = 0;
            return -ENOMEM;
        }
        S_MEMBER(ProtobufCMessage *, v, f->offset) = m;
        return want == 5 ? s_struct_from_json(ps, m, j, depth + 1)
                         : s_list_from_json(ps, m, j, depth + 1);
    }
    }
}

/* A well-known type from its JSON form. Returns 1 if d is not a WKT handled here. */
static int s_wkt_from_json(s_parse_t *ps, ProtobufCMessage *msg, const json_t *j, int depth)
{
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    bool ts = s_is(d, "google.protobuf.Timestamp");
    if (ts || s_is(d, "google.protobuf.Duration")) {
        if (!json_is_string(j))
            return s_fail(ps, "expected a %s string", ts ? "RFC 3339 timestamp" : "duration");
        int64_t secs;
        int32_t nanos;
        const char *s = json_string_value(j);
        int rc = ts ? kb_pbjson_parse_timestamp(s, &secs, &nanos)
                    : kb_pbjson_parse_duration(s, &secs, &nanos);
        if (rc)
            return s_fail(ps, "invalid %s \"%.40s\"", ts ? "RFC 3339 timestamp" : "duration", s);
        S_MEMBER(int64_t, msg, d->fields[0].offset) = secs;
        S_MEMBER(int32_t, msg, d->fields[1].offset) = nanos;
        return 0;
    }
    if (s_is(d, "google.protobuf.Struct"))
        return s_struct_from_json(ps, msg, j, depth);
    if (s_is(d, "google.protobuf.Value"))
        return s_value_from_json(ps, msg, j, depth);
    if (s_is(d, "google.protobuf.ListValue"))
        return s_list_from_json(ps, msg, j, depth);
    return 1;
}

/* Parses one element of field f into p (zeroed or default storage). */
static int s_elem_from_json(s_parse_t *ps, const ProtobufCFieldDescriptor *f, void *p,
                            const json_t *j, int depth)
{
    int64_t v;
    int rc;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if ((rc = s_int_from_json(ps, j, INT32_MIN, INT32_MAX, &v)))
            return rc;
        *(int32_t *)p = (int32_t)v;
        return 0;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if ((rc = s_int_from_json(ps, j, 0, UINT32_MAX, &v)))
            return rc;
        *(uint32_t *)p = (uint32_t)v;
        return 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if ((rc = s_int_from_json(ps, j, INT64_MIN, INT64_MAX, &v)))
            return rc;
        *(int64_t *)p = v;
        return 0;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return s_uint64_from_json(ps, j, (uint64_t *)p);
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        double x = 0;
        if ((rc = s_double_from_json(ps, j, &x)))
            return rc;
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            if (isfinite(x) && fabs(x) > 3.4028234663852886e38)
                return s_fail(ps, "float out of range");
            *(float *)p = (float)x;
        } else {
            *(double *)p = x;
        }
        return 0;
    }
    case PROTOBUF_C_TYPE_BOOL:
        if (!json_is_boolean(j))
            return s_fail(ps, "expected true or false");
        *(protobuf_c_boolean *)p = json_is_true(j);
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        if (json_is_string(j)) {
            const ProtobufCEnumValue *ev =
                protobuf_c_enum_descriptor_get_value_by_name(ed, json_string_value(j));
            if (!ev)
                return s_fail(ps, "unknown %s value \"%.60s\"", ed->short_name,
                              json_string_value(j));
            *(int *)p = ev->value;
            return 0;
        }
        if (json_is_null(j) && s_is_enum(f->descriptor, "google.protobuf.NullValue")) {
            *(int *)p = 0;
            return 0;
        }
        if ((rc = s_int_from_json(ps, j, INT32_MIN, INT32_MAX, &v)))
            return rc;
        *(int *)p = (int)v;
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(j))
            return s_fail(ps, "expected a string");
        if (memchr(json_string_value(j), '\0', json_string_length(j)))
            return s_fail(ps, "string contains NUL");
        char *s = strndup(json_string_value(j), json_string_length(j));
        if (!s)
            return -ENOMEM;
        *(char **)p = s;
        return 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        if (!json_is_string(j))
            return s_fail(ps, "expected a base64 string");
        ProtobufCBinaryData *b = p;
        rc = kb_pbjson_base64_decode(json_string_value(j), &b->data, &b->len);
        if (rc == -EINVAL)
            return s_fail(ps, "invalid base64");
        return rc;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        ProtobufCMessage *m = s_msg_alloc(f->descriptor);
        if (!m)
            return -ENOMEM;
        *(ProtobufCMessage **)p = m;
        return s_msg_from_json(ps, m, j, depth + 1);
    }
    }
    return s_fail(ps, "unsupported field type");
}

static int s_map_from_json(s_parse_t *ps, const ProtobufCFieldDescriptor *f, ProtobufCMessage *msg,
                           const json_t *j, int depth)
{
    if (!json_is_object(j))
        return s_fail(ps, "expected an object (map)");
    const ProtobufCMessageDescriptor *ed = f->descriptor;
    size_t n = json_object_size(j);
    if (n == 0)
        return 0;
    ProtobufCMessage **ents = calloc(n, sizeof *ents);
    if (!ents)
        return -ENOMEM;
    S_MEMBER(ProtobufCMessage **, msg, f->offset) = ents;
    const char *key;
    json_t *val;
    size_t i = 0;
    json_object_foreach((json_t *)j, key, val)
    {
        ProtobufCMessage *e = s_msg_alloc(ed);
        if (!e)
            return -ENOMEM;
        ents[i++] = e;
        S_MEMBER(size_t, msg, f->quantifier_offset) = i;
        const ProtobufCFieldDescriptor *kf = &ed->fields[0];
        /* Keys are JSON strings; bool keys become JSON booleans, numbers parse from text. */
        json_t *kj = json_string(key);
        if (kj && kf->type == PROTOBUF_C_TYPE_BOOL &&
            (strcmp(key, "true") == 0 || strcmp(key, "false") == 0)) {
            json_decref(kj);
            kj = json_boolean(strcmp(key, "true") == 0);
        }
        if (!kj)
            return -ENOMEM;
        int rc = s_elem_from_json(ps, kf, S_MEMBER_PTR(e, kf->offset), kj, depth);
        json_decref(kj);
        if (rc)
            return rc;
        if (json_is_null(val))
            return s_fail(ps, "map value must not be null");
        rc =
            s_elem_from_json(ps, &ed->fields[1], S_MEMBER_PTR(e, ed->fields[1].offset), val, depth);
        if (rc)
            return rc;
    }
    return 0;
}

static const ProtobufCFieldDescriptor *s_find_field(const ProtobufCMessageDescriptor *d,
                                                    const char *key)
{
    char camel[128];
    for (unsigned i = 0; i < d->n_fields; i++) {
        if (strcmp(d->fields[i].name, key) == 0)
            return &d->fields[i];
        s_camel(d->fields[i].name, camel, sizeof camel);
        if (strcmp(camel, key) == 0)
            return &d->fields[i];
    }
    return NULL;
}

static int s_field_from_json(s_parse_t *ps, ProtobufCMessage *msg,
                             const ProtobufCFieldDescriptor *f, const json_t *val, int depth)
{
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        if (S_MEMBER(size_t, msg, f->quantifier_offset) != 0)
            return s_fail(ps, "field given twice");
        if (s_is_map(f))
            return s_map_from_json(ps, f, msg, val, depth);
        if (!json_is_array(val))
            return s_fail(ps, "expected an array");
        size_t n = json_array_size(val), sz = s_elem_size(f);
        if (n == 0)
            return 0;
        uint8_t *arr = calloc(n, sz);
        if (!arr)
            return -ENOMEM;
        S_MEMBER(uint8_t *, msg, f->offset) = arr;
        for (size_t k = 0; k < n; k++) {
            const json_t *e = json_array_get(val, k);
            if (json_is_null(e))
                return s_fail(ps, "repeated element must not be null");
            /* Count the element before parsing so a failure frees what it allocated. */
            S_MEMBER(size_t, msg, f->quantifier_offset) = k + 1;
            int rc = s_elem_from_json(ps, f, arr + k * sz, e, depth);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        uint32_t *kase = (uint32_t *)S_MEMBER_PTR(msg, f->quantifier_offset);
        if (*kase != 0)
            return s_fail(ps, "more than one member of a oneof is set");
        if (f->type == PROTOBUF_C_TYPE_STRING)
            S_MEMBER(char *, msg, f->offset) = NULL;
        *kase = f->id;
    } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
               f->type != PROTOBUF_C_TYPE_MESSAGE) {
        S_MEMBER(protobuf_c_boolean, msg, f->quantifier_offset) = 1;
    }
    if (f->type == PROTOBUF_C_TYPE_STRING) {
        /* Replace the default (static) string: only owned strings may be stored. */
        char *old = S_MEMBER(char *, msg, f->offset);
        if (old && old != f->default_value)
            return s_fail(ps, "field given twice");
        S_MEMBER(char *, msg, f->offset) = NULL;
        int rc = s_elem_from_json(ps, f, S_MEMBER_PTR(msg, f->offset), val, depth);
        if (rc && !S_MEMBER(char *, msg, f->offset))
            S_MEMBER(char *, msg, f->offset) = (char *)f->default_value;
        if (rc && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            S_MEMBER(uint32_t, msg, f->quantifier_offset) = 0;
        return rc;
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && S_MEMBER(void *, msg, f->offset))
        return s_fail(ps, "field given twice");
    return s_elem_from_json(ps, f, S_MEMBER_PTR(msg, f->offset), val, depth);
}

static int s_msg_from_json(s_parse_t *ps, ProtobufCMessage *msg, const json_t *j, int depth)
{
    if (depth > KB_PBJSON_MAX_DEPTH)
        return s_fail(ps, "nesting deeper than %d", KB_PBJSON_MAX_DEPTH);
    int rc = s_wkt_from_json(ps, msg, j, depth);
    if (rc <= 0)
        return rc;
    if (!json_is_object(j))
        return s_fail(ps, "expected an object for %s", msg->descriptor->name);
    const ProtobufCMessageDescriptor *d = msg->descriptor;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key, val)
    {
        const ProtobufCFieldDescriptor *f = s_find_field(d, key);
        size_t plen = strlen(ps->path);
        if (!f) {
            if (ps->flags & KB_PBJSON_IGNORE_UNKNOWN)
                continue;
            return s_fail(ps, "unknown field \"%.60s\" in %s", key, d->name);
        }
        snprintf(ps->path + plen, sizeof ps->path - plen, "%s%s", plen ? "." : "", key);
        if (json_is_null(val) && !s_field_is(f, "google.protobuf.Value")) {
            ps->path[plen] = '\0';
            continue; /* null means default */
        }
        rc = s_field_from_json(ps, msg, f, val, depth);
        if (rc)
            return rc;
        ps->path[plen] = '\0';
    }
    return 0;
}

int kb_pbjson_from_json(const ProtobufCMessageDescriptor *desc, const json_t *json,
                        unsigned parse_flags, ProtobufCMessage **out, char *err, size_t errcap)
{
    s_parse_t ps = {.err = err, .cap = errcap, .flags = parse_flags};
    *out = NULL;
    if (err && errcap)
        err[0] = '\0';
    ProtobufCMessage *msg = s_msg_alloc(desc);
    if (!msg)
        return -ENOMEM;
    int rc = s_msg_from_json(&ps, msg, json, 0);
    if (rc) {
        if (rc == -ENOMEM && err && errcap)
            snprintf(err, errcap, "out of memory");
        protobuf_c_message_free_unpacked(msg, NULL);
        return rc;
    }
    *out = msg;
    return 0;
}

int kb_pbjson_loads(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                    unsigned parse_flags, ProtobufCMessage **out, char *err, size_t errcap)
{
    json_error_t jerr;
    *out = NULL;
    json_t *j = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!j) {
        if (err && errcap)
            snprintf(err, errcap, "invalid JSON at line %d: %s", jerr.line, jerr.text);
        return -EINVAL;
    }
    int rc = kb_pbjson_from_json(desc, j, parse_flags, out, err, errcap);
    json_decref(j);
    return rc;
}
