/*
 * fuzz_mcp: one POST /mcp body (a JSON-RPC message) through the MCP bridge as its HTTP handler
 * runs it (kb_mcp_post): parsing, JSON-RPC checks, sessions, dispatch, tool argument schemas
 * and the building of service requests. The control plane is a stand-in actor that answers
 * every request "not found", so each tool goes all the way to the service and back.
 *
 * Input: the first byte picks the Accept and Mcp-Protocol-Version headers; the rest is the body.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "control_msgs.h"
#include "krt.h"
#include "mcp_int.h"

static void s_answer_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type == KA_SBX_GUEST) {
        ka_frame_fail_t f;
        size_t len = ka_frame_final(&f, -ENOENT, KA_MSG_NOT_FOUND);
        krt_send(ctx, msg->from, KA_SBX_GUEST_FRAME, &f, len);
    } else if (msg->ref) {
        krt_reply_error(ctx, msg, -ENOENT, KA_MSG_NOT_FOUND);
    }
}

static const krt_behaviour_t s_answer = {.kind = "fuzz-control-plane", .handle = s_answer_handle};

static kb_mcp_t *s_bridge(void)
{
    static kb_mcp_t *m;
    if (m)
        return m;
    krt_log_configure(KRT_LOG_ERROR, false, stderr);
    krt_config_t cfg = {.node_id = 1, .schedulers = 1, .job_threads = 1, .name = "node-fuzz"};
    krt_system_t *sys = krt_system_new(&cfg);
    krt_addr_t cp = KRT_ADDR_NONE;
    krt_spawn_opts_t ao = {.name = "answer", .register_name = true};
    if (!sys || krt_system_start(sys) || krt_system_spawn(sys, &s_answer, NULL, &ao, &cp))
        abort();
    ka_service_t *svc = ka_service_new(sys, "answer", "answer");
    int err = 0;
    kb_auth_t *auth = kb_auth_new(KB_AUTH_USER_HEADER, NULL, &err, NULL, 0);
    kb_mcp_options_t o = {.max_sessions = 8, .progress_interval_ms = 1000};
    m = svc && auth ? kb_mcp_new(NULL, svc, auth, &o) : NULL;
    if (!m)
        abort();
    return m; /* lives as long as the process */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const accepts[] = {"application/json, text/event-stream", "application/json",
                                          "text/event-stream", NULL};
    static const char *const protocols[] = {NULL, "2025-06-18", "2026-07-28", "1999-01-01"};
    kb_mcp_t *m = s_bridge();
    uint8_t sel = size ? data[0] : 0;
    const char *body = size ? (const char *)data + 1 : "";
    size_t len = size ? size - 1 : 0;
    char *answer = NULL;
    size_t alen = 0;
    unsigned status = kb_mcp_post(m, accepts[sel & 3], "fuzz@kagent.dev", NULL,
                                  protocols[(sel >> 2) & 3], body, len, &answer, &alen);
    if (status < 200 || status > 599 || (answer && strlen(answer) != alen))
        abort();
    if (answer && status != 202) { /* every answer is one JSON-RPC message (or SSE events) */
        const char *j = strncmp(answer, "event:", 6) == 0 ? strstr(answer, "data: ") : answer;
        if (!j || !(j = j == answer ? j : j + 6))
            abort();
        json_error_t e;
        json_t *msg = json_loadb(j, strcspn(j, "\n"), 0, &e);
        const char *v = json_string_value(json_object_get(msg, "jsonrpc"));
        if (!v || strcmp(v, "2.0") != 0)
            abort();
        json_decref(msg);
    }
    free(answer);
    return 0;
}
