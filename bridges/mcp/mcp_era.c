/*
 * Which MCP revision a request speaks, and the request rules of the stateless revision
 * 2026-07-28 (mcp_int.h). Pure functions of (headers, body): the transport half applies the
 * verdict.
 *
 * Choosing the revision follows the 2026-07-28 versioning page (back-compat section): a request
 * carrying io.modelcontextprotocol/protocolVersion in params._meta, or an MCP-Protocol-Version
 * header naming a modern revision, is served statelessly by that revision; anything else (an
 * initialize, a session, a legacy header or none) keeps the initialize-based semantics of the
 * revision it negotiated or names (2025-03-26 when nothing says).
 */
#include "mcp_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const kb_mcp_versions[] = {KB_MCP_MODERN_VERSION, "2025-11-25", "2025-06-18",
                                       "2025-03-26",          "2024-11-05", NULL};

/* The syslog levels, lowest first. */
static const char *const s_levels[KB_MCP_N_LEVELS] = {"debug", "info",     "notice", "warning",
                                                      "error", "critical", "alert",  "emergency"};

static const char *s_known(const char *v)
{
    for (size_t i = 0; v && kb_mcp_versions[i]; i++)
        if (strcmp(v, kb_mcp_versions[i]) == 0)
            return kb_mcp_versions[i];
    return NULL;
}

bool kb_mcp_version_modern(const char *v)
{
    return v && strcmp(v, KB_MCP_MODERN_VERSION) == 0;
}

json_t *kb_mcp_versions_json(void)
{
    json_t *a = json_array();
    for (size_t i = 0; a && kb_mcp_versions[i]; i++)
        json_array_append_new(a, json_string(kb_mcp_versions[i]));
    return a;
}

int kb_mcp_log_level(const char *name)
{
    for (int i = 0; name && i < KB_MCP_N_LEVELS; i++)
        if (strcmp(name, s_levels[i]) == 0)
            return i;
    return -1;
}

/* Fills a 400 verdict (steals data); returns -1. */
static int s_reject(kb_mcp_verdict_t *v, int code, json_t *data, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int s_reject(kb_mcp_verdict_t *v, int code, json_t *data, const char *fmt, ...)
{
    v->status = 400;
    v->code = code;
    v->data = data;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int kb_mcp_era(const char *header, const json_t *params, const char **version, kb_mcp_verdict_t *v)
{
    memset(v, 0, sizeof *v);
    *version = NULL;
    const json_t *meta = json_object_get(params, "_meta");
    const json_t *pv = json_object_get(meta, KB_MCP_META_VERSION);
    if (pv && !json_is_string(pv))
        return s_reject(v, KB_RPC_PARAMS, NULL,
                        "Invalid params: _meta[\"" KB_MCP_META_VERSION "\"] must be a string");
    const char *want = pv ? json_string_value(pv) : header;
    if (pv && header && strcmp(header, want) != 0)
        return s_reject(v, KB_RPC_HEADER_MISMATCH, NULL,
                        "Header mismatch: MCP-Protocol-Version header '%.60s' does not match "
                        "_meta protocolVersion '%.60s'",
                        header, want);
    if (want && !s_known(want)) {
        json_t *data =
            json_pack("{s:o,s:s}", "supported", kb_mcp_versions_json(), "requested", want);
        return s_reject(v, KB_RPC_UNSUPPORTED_VERSION, data, "Unsupported protocol version: %.60s",
                        want);
    }
    *version = s_known(want);
    return 0;
}

/* A header value as the client meant it: optional whitespace trimmed, the =?base64?...?=
 * sentinel decoded. malloc'd; NULL when the value is malformed. */
static char *s_header_value(const char *h)
{
    while (*h == ' ' || *h == '\t')
        h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    static const char pre[] = "=?base64?", suf[] = "?=";
    const size_t pl = sizeof pre - 1, sl = sizeof suf - 1;
    if (n < pl + sl || memcmp(h, pre, pl) != 0 || memcmp(h + n - sl, suf, sl) != 0)
        return strndup(h, n);
    unsigned char *raw;
    size_t raw_len;
    char msg[80];
    if (kb_mcp_b64_decode(h + pl, n - pl - sl, &raw, &raw_len, msg, sizeof msg))
        return NULL;
    char *s = malloc(raw_len + 1);
    if (s) {
        memcpy(s, raw, raw_len);
        s[raw_len] = '\0';
        if (strlen(s) != raw_len) { /* an embedded NUL matches no body value */
            free(s);
            s = NULL;
        }
    }
    free(raw);
    return s;
}

/* The header named `what` must be present and, decoded, equal `body` (when body is set). */
static int s_header_matches(const char *what, const char *header, const char *body,
                            kb_mcp_verdict_t *v)
{
    if (!header)
        return s_reject(v, KB_RPC_HEADER_MISMATCH, NULL,
                        "Header mismatch: the %s header is required", what);
    char *got = s_header_value(header);
    bool ok = got && body && strcmp(got, body) == 0;
    free(got);
    if (!ok)
        return s_reject(v, KB_RPC_HEADER_MISMATCH, NULL,
                        "Header mismatch: %s header does not match the request body (%.100s)", what,
                        body ? body : "no value in the body");
    return 0;
}

static bool s_named(const char *method)
{
    return strcmp(method, "tools/call") == 0 || strcmp(method, "prompts/get") == 0 ||
           strcmp(method, "resources/read") == 0;
}

int kb_mcp_modern_check(const char *protocol, const char *mcp_method, const char *mcp_name,
                        const char *method, const json_t *params, int *log_level,
                        kb_mcp_verdict_t *v)
{
    memset(v, 0, sizeof *v);
    *log_level = -1;
    const json_t *meta = json_object_get(params, "_meta");
    if (!json_is_object(meta) || !json_object_get(meta, KB_MCP_META_VERSION))
        return s_reject(v, KB_RPC_PARAMS, NULL,
                        "Invalid params: params._meta[\"" KB_MCP_META_VERSION "\"] is required");
    if (!json_is_object(json_object_get(meta, KB_MCP_META_CAPS)))
        return s_reject(v, KB_RPC_PARAMS, NULL,
                        "Invalid params: params._meta[\"" KB_MCP_META_CAPS
                        "\"] is required (an object)");
    const json_t *info = json_object_get(meta, KB_MCP_META_CLIENT);
    if (info && !json_is_object(info))
        return s_reject(v, KB_RPC_PARAMS, NULL,
                        "Invalid params: params._meta[\"" KB_MCP_META_CLIENT
                        "\"] must be an object");
    if (s_header_matches("MCP-Protocol-Version", protocol,
                         json_string_value(json_object_get(meta, KB_MCP_META_VERSION)), v) ||
        s_header_matches("Mcp-Method", mcp_method, method, v))
        return -1;
    if (s_named(method)) {
        const char *key = strcmp(method, "resources/read") == 0 ? "uri" : "name";
        if (s_header_matches("Mcp-Name", mcp_name, json_string_value(json_object_get(params, key)),
                             v))
            return -1;
    }
    const json_t *lv = json_object_get(meta, KB_MCP_META_LOG_LEVEL);
    if (lv && (*log_level = kb_mcp_log_level(json_string_value(lv))) < 0)
        return s_reject(v, KB_RPC_PARAMS, NULL,
                        "Invalid params: _meta[\"" KB_MCP_META_LOG_LEVEL
                        "\"] must be one of debug, info, notice, warning, error, critical, "
                        "alert, emergency");
    return 0;
}
