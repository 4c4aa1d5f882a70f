/*
 * kb_mcp: the MCP bridge for agents. MCP Streamable HTTP at /mcp on the shared port (through
 * kb_http), JSON-RPC 2.0 with jansson, the 13 sandbox tools and 2 prompts of the reference
 * (section 2), translated to the service layer (ka_service) that the gRPC bridge calls too.
 *
 * Two eras on the one endpoint, chosen per request (the 2026-07-28 versioning page):
 *   2026-07-28   stateless: a request carrying io.modelcontextprotocol/protocolVersion in
 *                params._meta (or a 2026-07-28 MCP-Protocol-Version header) is served alone:
 *                no initialize and no session; server/discover; every result has resultType
 *                (lists and discover: ttlMs, cacheScope) and the server's identity in _meta;
 *                MCP-Protocol-Version, Mcp-Method and Mcp-Name must match the body (400
 *                -32020), _meta needs protocolVersion and clientCapabilities (400 -32602), an
 *                unserved revision is 400 -32022, a removed or unknown method 404 -32601; log
 *                notifications only with _meta logLevel.
 *   2024-11-05 .. 2025-11-25   initialize-based: initialize issues an Mcp-Session-Id, checked
 *                when sent; without it the request is stateless (identity alone decides).
 *
 *   POST /mcp    one JSON-RPC request or notification (batches are refused); the answer is JSON
 *                when the client accepts it, else one SSE event; a tools/call carrying
 *                _meta.progressToken from a client accepting text/event-stream is answered as
 *                an SSE stream of notifications/progress events, then the result.
 *   GET /mcp     405 with Allow: POST, DELETE (no standalone server stream).
 *   DELETE /mcp  ends the session named by Mcp-Session-Id (200; unknown -> 404).
 *
 * Every request is authenticated with kb_auth_identify (Authorization / X-User-Id); a session
 * belongs to the identity that initialized it. Host and Origin headers are checked against the
 * allowed lists (DNS-rebinding protection) before anything else; a refused one answers 403.
 */
#ifndef KB_MCP_H
#define KB_MCP_H

#include <stddef.h>

#include "auth.h"
#include "http.h"
#include "service.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KB_MCP_PATH           "/mcp"
#define KB_MCP_MAX_BODY       ((size_t)2 << 20) /* 1 MiB of base64 data + JSON framing */
#define KB_MCP_MAX_SESSIONS   4096
#define KB_MCP_SESSION_IDLE_S 3600 /* sessions idle longer than this are forgotten */

typedef struct {
    /* Host header values accepted, NULL-terminated; an entry without a port accepts any port
     * ("localhost" accepts "localhost:8083"); "*" accepts any host (for nodes reached by many
     * names, with bearer tokens). NULL = the loopback names: localhost, 127.0.0.1, [::1]. A
     * request without a Host header is refused. */
    const char *const *allowed_hosts;
    /* Origin header values accepted when the header is present, NULL-terminated; an entry
     * without a port accepts any port ("http://localhost"); "*" accepts any. NULL = http:// and
     * https:// with each allowed host. Requests without Origin (non-browser clients) pass. */
    const char *const *allowed_origins;
    const char *server_name;    /* serverInfo.name; NULL = "kagent" */
    const char *server_version; /* serverInfo.version; NULL = "0.1.0" */
    size_t max_body;            /* request body cap (413 above); 0 = KB_MCP_MAX_BODY */
    int max_sessions;           /* 0 = KB_MCP_MAX_SESSIONS; the oldest idle one is dropped */
    int progress_interval_ms;   /* progress notifications on long calls; 0 = 1000 */
} kb_mcp_options_t;

typedef struct kb_mcp kb_mcp_t;

/* Registers /mcp (GET, POST, DELETE) on http and serves it with svc and auth (both borrowed,
 * they must outlive the bridge). opts may be NULL (defaults); its strings are copied. NULL on
 * failure (e.g. /mcp already registered). */
kb_mcp_t *kb_mcp_new(kb_http_t *http, ka_service_t *svc, const kb_auth_t *auth,
                     const kb_mcp_options_t *opts);
/* Frees the bridge. kb_http has no way to remove a route, so call this only after
 * kb_http_destroy (no handler may still be running). Idempotent; NULLs *m_p. */
void kb_mcp_destroy(kb_mcp_t **m_p);

/* Counters since start (for /metrics). */
typedef struct {
    unsigned long requests;    /* JSON-RPC messages handled */
    unsigned long tool_calls;  /* tools/call */
    unsigned long tool_errors; /* tools/call answered with isError: true */
    unsigned long sessions;    /* live sessions */
} kb_mcp_stats_t;
void kb_mcp_stats(kb_mcp_t *m, kb_mcp_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
