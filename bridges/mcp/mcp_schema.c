/* The MCP tools' argument checks: a JSON Schema subset (types, required, enums, lengths,
 * ranges, no unknown properties) with messages an agent can act on (mcp_int.h). */
#include "mcp_int.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- argument checks --------------------------------------------------------------------------
 */

static size_t s_utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* A real that is a whole number within json_int_t's range (the cast is defined). */
static bool s_whole(double d)
{
    return d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == (double)(json_int_t)d;
}

static int s_check_value(const char *name, const json_t *prop, const json_t *v, char *msg,
                         size_t cap)
{
    const char *type = json_string_value(json_object_get(prop, "type"));
    if (!type)
        return 0;
    if (strcmp(type, "string") == 0) {
        if (!json_is_string(v))
            return snprintf(msg, cap, "%s must be a string", name), -1;
        size_t n = s_utf8_chars(json_string_value(v));
        const json_t *mn = json_object_get(prop, "minLength"),
                     *mx = json_object_get(prop, "maxLength");
        bool lo = mn && (json_int_t)n < json_integer_value(mn);
        bool hi = mx && (json_int_t)n > json_integer_value(mx);
        if ((lo || hi) && mn && mx && json_integer_value(mn) > 0)
            return snprintf(msg, cap,
                            "%s must be between %" JSON_INTEGER_FORMAT " and %" JSON_INTEGER_FORMAT
                            " characters", /* the wording of actors/control/checks.c */
                            name, json_integer_value(mn), json_integer_value(mx)),
                   -1;
        if (lo)
            return snprintf(msg, cap, "%s must not be empty", name), -1;
        if (hi)
            return snprintf(msg, cap, "%s must be at most %" JSON_INTEGER_FORMAT " characters",
                            name, json_integer_value(mx)),
                   -1;
        return 0;
    }
    if (strcmp(type, "integer") == 0) {
        json_int_t iv;
        if (json_is_integer(v))
            iv = json_integer_value(v);
        else if (json_is_real(v) && s_whole(json_real_value(v)))
            iv = (json_int_t)json_real_value(v);
        else
            return snprintf(msg, cap, "%s must be an integer", name), -1;
        const json_t *mn = json_object_get(prop, "minimum"), *mx = json_object_get(prop, "maximum");
        if ((mn && iv < json_integer_value(mn)) || (mx && iv > json_integer_value(mx))) {
            if (mn && mx)
                return snprintf(msg, cap,
                                "%s must be between %" JSON_INTEGER_FORMAT
                                " and %" JSON_INTEGER_FORMAT,
                                name, json_integer_value(mn), json_integer_value(mx)),
                       -1;
            return snprintf(msg, cap, "%s must be at least %" JSON_INTEGER_FORMAT, name,
                            json_integer_value(mn)),
                   -1;
        }
        return 0;
    }
    if (strcmp(type, "boolean") == 0)
        return json_is_boolean(v) ? 0 : (snprintf(msg, cap, "%s must be a boolean", name), -1);
    if (strcmp(type, "array") == 0) {
        size_t i;
        const json_t *e;
        if (!json_is_array(v))
            return snprintf(msg, cap, "%s must be an array of strings", name), -1;
        json_array_foreach(v, i, e) if (!json_is_string(e)) return snprintf(
            msg, cap, "%s must be an array of strings", name),
            -1;
        const json_t *mn = json_object_get(prop, "minItems");
        if (mn && (json_int_t)json_array_size(v) < json_integer_value(mn))
            return snprintf(msg, cap, "%s must not be empty", name), -1;
        return 0;
    }
    if (strcmp(type, "object") == 0) {
        const char *k;
        const json_t *e;
        if (!json_is_object(v))
            return snprintf(msg, cap, "%s must be an object of strings", name), -1;
        json_object_foreach((json_t *)v, k, e) if (!json_is_string(e)) return snprintf(
            msg, cap, "%s.%s must be a string", name, k),
            -1;
        return 0;
    }
    return 0;
}

int kb_mcp_check_args(const json_t *schema, const json_t *args, char *msg, size_t cap)
{
    if (!json_is_object(args))
        return snprintf(msg, cap, "arguments must be an object"), -1;
    const json_t *props = json_object_get(schema, "properties");
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(schema, "required"), i, r)
    {
        const json_t *v = json_object_get(args, json_string_value(r));
        if (!v || json_is_null(v))
            return snprintf(msg, cap, "%s is required", json_string_value(r)), -1;
    }
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)args, k, v)
    {
        const json_t *prop = json_object_get(props, k);
        if (!prop)
            return snprintf(msg, cap, "unknown argument \"%s\"", k), -1;
        if (json_is_null(v)) /* an explicit null is an omitted optional argument */
            continue;
        if (s_check_value(k, prop, v, msg, cap))
            return -1;
    }
    return 0;
}
