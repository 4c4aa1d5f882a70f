/*
 * Private interface of the MCP bridge: the tools and prompts half (mcp_tools.c) that the
 * transport half (mcp.c) dispatches to, and the pure helpers the unit tests reach.
 */
#ifndef KB_MCP_INT_H
#define KB_MCP_INT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mcp.h"
#include "service.h"
#include "svc_frames.h"

#define KB_MCP_FILE_CAP      ((size_t)1 << 20) /* MCP transfers: 1 MiB of decoded data */
#define KB_MCP_OUTPUT_CAP    ((size_t)1 << 20) /* read_sandbox_outputs: stdout+stderr per call */
#define KB_MCP_TEXT_BUDGET   (32u << 10)       /* read_sandbox_file: text bytes per call */
#define KB_MCP_LINE_MAX      2000              /* bytes kept of one line */
#define KB_MCP_LINES_DEF     2000              /* default `limit` of read_sandbox_file */
#define KB_MCP_SNIFF_LEN     512               /* bytes that decide a file's type */
#define KB_MCP_GUEST_WAIT_MS 120000            /* a guest call's overall bound */

/* JSON-RPC and MCP error codes. */
enum {
    KB_RPC_PARSE = -32700,
    KB_RPC_INVALID = -32600,
    KB_RPC_METHOD = -32601,
    KB_RPC_PARAMS = -32602, /* also resource-not-found from 2026-07-28 on */
    KB_RPC_INTERNAL = -32603,
    KB_RPC_SERVER = -32000,
    KB_RPC_SESSION = -32001,
    KB_RPC_HEADER_MISMATCH = -32020,    /* 2026-07-28 */
    KB_RPC_MISSING_CAPABILITY = -32021, /* 2026-07-28 */
    KB_RPC_UNSUPPORTED_VERSION = -32022 /* 2026-07-28 */
};

/* ---- protocol revisions (mcp_era.c) ---- */

#define KB_MCP_MODERN_VERSION "2026-07-28" /* stateless: per-request _meta, no initialize */
#define KB_MCP_LEGACY_LATEST  "2025-11-25" /* newest initialize-based revision */
#define KB_MCP_META_VERSION   "io.modelcontextprotocol/protocolVersion"
#define KB_MCP_META_CAPS      "io.modelcontextprotocol/clientCapabilities"
#define KB_MCP_META_CLIENT    "io.modelcontextprotocol/clientInfo"
#define KB_MCP_META_LOG_LEVEL "io.modelcontextprotocol/logLevel"
#define KB_MCP_META_SERVER    "io.modelcontextprotocol/serverInfo"
#define KB_MCP_LIST_TTL_MS    300000 /* ttlMs of tools/list, prompts/list, server/discover */
#define KB_MCP_N_LEVELS       8

/* Every revision served, newest first, NULL-terminated. */
extern const char *const kb_mcp_versions[];
/* True for a stateless (2026-07-28) revision. */
bool kb_mcp_version_modern(const char *v);
/* kb_mcp_versions as a JSON array (new reference). */
json_t *kb_mcp_versions_json(void);
/* Index of a syslog level name ("debug" 0 ... "emergency" 7), or -1. */
int kb_mcp_log_level(const char *name);

/* Why a request is refused before dispatch: HTTP status (0 = accepted), JSON-RPC code and
 * message, optional error data (owned; the caller steals or frees it). */
typedef struct {
    unsigned status;
    int code;
    char msg[300];
    json_t *data;
} kb_mcp_verdict_t;

/* The revision a request speaks: params._meta's protocolVersion, else the MCP-Protocol-Version
 * header (both present: they must agree). *version is one of kb_mcp_versions, or NULL when
 * neither says. 0, or -1 with a 400 verdict: -32020 (the two disagree), -32022 (a revision we
 * do not serve; data {supported, requested}), -32602 (not a string). */
int kb_mcp_era(const char *header, const json_t *params, const char **version, kb_mcp_verdict_t *v);
/* The 2026-07-28 request rules: _meta carries protocolVersion and clientCapabilities (an
 * object), clientInfo is an object when present; MCP-Protocol-Version, Mcp-Method and, for
 * tools/call, prompts/get and resources/read, Mcp-Name headers are present and match the body
 * (whitespace trimmed, =?base64?..?= decoded); a logLevel is a known level (*log_level its
 * index, else -1). 0, or -1 with a 400 verdict (-32602 or -32020). */
int kb_mcp_modern_check(const char *protocol, const char *mcp_method, const char *mcp_name,
                        const char *method, const json_t *params, int *log_level,
                        kb_mcp_verdict_t *v);

/* One tool call's context: who calls, and a tick run every tick_ms while it waits on the
 * service (progress notifications). tick may be NULL. */
typedef struct kb_mcp_call {
    ka_service_t *svc;
    const char *caller;
    bool structured; /* add structuredContent (protocol >= 2025-06-18) */
    int tick_ms;
    void (*tick)(void *arg);
    void *tick_arg;
} kb_mcp_call_t;

/* One tool: its name, annotations, input schema (JSON text) and handler. */
typedef json_t *(*kb_mcp_tool_fn)(kb_mcp_call_t *c, json_t *args);
typedef struct {
    const char *name, *title, *description, *schema;
    kb_mcp_tool_fn fn;
    bool read_only, destructive, idempotent;
} kb_mcp_tool_t;

/* The Files API tools (mcp_files.c), listed after the others. */
#define KB_MCP_FILE_TOOLS_N 5
extern const kb_mcp_tool_t kb_mcp_file_tools[KB_MCP_FILE_TOOLS_N];

/* Helpers of mcp_tools.c for the tools of other files: an isError result "<CODE>: message";
 * the result of a failed call's end; a success result of obj (stolen); a guest request for args'
 * sandbox_id (NULL with *err, a result, set); a guest call (q consumed) returning the final
 * status code, its header in *fin, its outcome in *end and a copy of its tail in *tail
 * (malloc'd, may be NULL). */
json_t *kb_mcp_error(int code, const char *message);
json_t *kb_mcp_status_error(const ka_frame_end_t *end);
json_t *kb_mcp_ok(kb_mcp_call_t *c, json_t *obj);
ka_guest_req_t *kb_mcp_guest_req(kb_mcp_call_t *c, json_t *args, int op, size_t tail, json_t **err);
int kb_mcp_guest_call(kb_mcp_call_t *c, ka_guest_req_t *q, ka_guest_reply_t *fin,
                      ka_frame_end_t *end, void **tail);

/* The tools/list array (new reference). */
json_t *kb_mcp_tools_list(void);
/* True when a tool of that name exists. */
bool kb_mcp_tool_exists(const char *name);
/* Runs a tool: a CallToolResult (new reference); service and argument errors are results with
 * isError: true. args may be NULL (no arguments). NULL only when out of memory. */
json_t *kb_mcp_tool_call(kb_mcp_call_t *c, const char *name, json_t *args);

/* The prompts/list array (new reference). */
json_t *kb_mcp_prompts_list(void);
/* A GetPromptResult (new reference), or NULL with a JSON-RPC code (-32602) and message. */
json_t *kb_mcp_prompt_get(const char *name, json_t *args, int *code, char *msg, size_t cap);
/* The server instructions of the initialize result. */
const char *kb_mcp_instructions(void);

/* One POST /mcp without HTTP (what the kb_http handler does, for the fuzz target): the headers
 * that matter (NULL = absent; Host is localhost, Content-Type application/json; Mcp-Method and
 * Mcp-Name taken from the body, as a conforming client sends them) and the body.
 * A tools/call answered as a progress stream runs to its end here, its events discarded.
 * Returns the HTTP status; *body (may be NULL) receives the answer (malloc'd, caller frees). */
unsigned kb_mcp_post(kb_mcp_t *m, const char *accept, const char *user_id, const char *session,
                     const char *protocol, const char *body, size_t len, char **answer,
                     size_t *answer_len);

/* ---- helpers (exposed for unit tests) ---- */

/* Checks args against one of our input schemas (object, properties of type string, integer,
 * boolean, array of strings, object of strings; required; additionalProperties false;
 * minLength/maxLength, minimum/maximum). 0, or -1 with a readable message. */
int kb_mcp_check_args(const json_t *schema, const json_t *args, char *msg, size_t cap);
/* Standard base64 with padding. Encode: malloc'd NUL-terminated text. Decode: 0 and a malloc'd
 * buffer (*out, *out_len), or -1 and msg "illegal base64 data at input byte N". */
char *kb_mcp_b64_encode(const void *data, size_t len);
int kb_mcp_b64_decode(const char *text, size_t len, unsigned char **out, size_t *out_len, char *msg,
                      size_t cap);
/* MIME type of a file from its first bytes: image/png, image/jpeg, image/gif, image/webp,
 * application/pdf, application/zip, application/x-gzip, text/plain; charset=utf-8 or
 * application/octet-stream. */
const char *kb_mcp_sniff(const unsigned char *p, size_t len);
/* Image size from its header; 0 or -1 when unknown. */
int kb_mcp_image_size(const unsigned char *p, size_t len, unsigned *w, unsigned *h);
/* Go's RFC3339Nano for a unix time in ms (UTC, trailing zeros of the fraction dropped). */
void kb_mcp_rfc3339(int64_t ms, char *out, size_t cap);

/* ---- images for the model (mcp_image.c) ---- */

#define KB_MCP_IMAGE_CAP        ((size_t)16 << 20) /* images read as image content up to this */
#define KB_MCP_IMAGE_MAX_SIDE   2000u              /* long side shown at most */
#define KB_MCP_IMAGE_MAX_BYTES  500000u            /* encoded bytes shown at most */
#define KB_MCP_IMAGE_MAX_PIXELS 50000000ull        /* refused above */

enum { KB_MCP_IMAGE_TOO_LARGE = -1, KB_MCP_IMAGE_CORRUPT = -2 };

typedef struct {
    unsigned char *data; /* re-encoded bytes (malloc'd); NULL: show the original */
    size_t len;
    const char *mime;          /* of what is shown (static) */
    unsigned w, h;             /* the original's size (0 when unknown) */
    unsigned shown_w, shown_h; /* re-encoded: the size shown */
    bool reencoded;
} kb_mcp_image_t;

/* Prepares image bytes p (type mime, one of kb_mcp_sniff's image/...) for a model: as they are
 * when the long side is <= 2000 px and they are <= 500,000 bytes, else decoded and re-encoded
 * as JPEG at quality 85, 70, 55, 40, shrinking by 0.75 until both hold. 0, or
 * KB_MCP_IMAGE_TOO_LARGE (over 50 M pixels) / KB_MCP_IMAGE_CORRUPT (cannot decode) with msg. */
int kb_mcp_image_prepare(const unsigned char *p, size_t len, const char *mime, kb_mcp_image_t *out,
                         char *msg, size_t cap);
void kb_mcp_image_free(kb_mcp_image_t *img);

/* Line pager of read_sandbox_file: feed bytes, then finish. */
typedef struct kb_mcp_pager kb_mcp_pager_t;
kb_mcp_pager_t *kb_mcp_pager_new(uint64_t offset, uint64_t limit);
/* Feeds bytes; returns true once the page is complete (more bytes are not needed). */
bool kb_mcp_pager_feed(kb_mcp_pager_t *p, const char *data, size_t len);
/* The page text (malloc'd): numbered lines and the continuation note. Frees the pager. */
char *kb_mcp_pager_finish(kb_mcp_pager_t *p);

/* Output collector of read_sandbox_outputs: takes a data frame within the combined cap. */
typedef struct {
    uint64_t off[2]; /* next offset per stream (stdout, stderr) */
    char *buf[2];    /* returned bytes per stream */
    size_t len[2], cap;
    bool truncated;
} kb_mcp_outputs_t;
/* Appends the part of (stream, offset, data) not yet seen; false once the cap is reached
 * (truncated set). stream is KA_STREAM_STDOUT or KA_STREAM_STDERR. */
bool kb_mcp_outputs_add(kb_mcp_outputs_t *o, int stream, uint64_t offset, const char *data,
                        size_t len);
void kb_mcp_outputs_free(kb_mcp_outputs_t *o);

/* "PROCESS_STATUS_RUNNING", _COMPLETED (exit 0), _FAILED, _TERMINATED (128+signal). */
const char *kb_mcp_process_status(int state, int exit_code);

#endif
