/* kb_api: registration and the helpers every service uses (identity, routing, statuses). */
#include "api_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sandboxes.h"

kb_grpc_code_t kb_api_code(int ka_code)
{
    _Static_assert(KA_UNAUTHENTICATED == (int)KB_GRPC_UNAUTHENTICATED, "codes differ");
    _Static_assert(KA_FAILED_PRECONDITION == (int)KB_GRPC_FAILED_PRECONDITION, "codes differ");
    return ka_code >= 0 && ka_code <= KA_UNAUTHENTICATED ? (kb_grpc_code_t)ka_code
                                                         : KB_GRPC_UNKNOWN;
}

void kb_api_fail_err(kb_grpc_call_t *call, const ka_svc_status_t *st)
{
    kb_grpc_fail(call, kb_api_code(ka_err_code(st->err)),
                 st->message ? st->message : "the call failed");
}

int kb_api_timeout(kb_grpc_call_t *call)
{
    int64_t left = kb_grpc_call_timeout_ms(call);
    return left < 0 || left > KA_SVC_TIMEOUT_MS ? KA_SVC_TIMEOUT_MS : left > 0 ? (int)left : 1;
}

void kb_api_ts(Google__Protobuf__Timestamp *ts, int64_t ms)
{
    google__protobuf__timestamp__init(ts);
    ts->seconds = ms / 1000;
    ts->nanos = (int32_t)(ms % 1000) * 1000000;
}

/* A header value as a NUL-terminated copy: exactly one, or NULL. */
static char *s_meta(kb_grpc_call_t *call, const char *key)
{
    char *v = NULL;
    return kb_grpc_call_metadata_one(call, key, &v) == 0 ? v : NULL;
}

/* The socket gRPC core adopted for the call's connection: its peer reads "fd:N"; -1 otherwise.
 * The call holds its connection open, so N cannot name another connection meanwhile. */
static int s_conn_fd(kb_grpc_call_t *call)
{
    char *peer = kb_grpc_call_peer(call);
    int fd = -1, end = 0;
    if (peer && sscanf(peer, "fd:%d%n", &fd, &end) == 1 && peer[end] == '\0' && fd >= 0) {
        free(peer);
        return fd;
    }
    free(peer);
    return -1;
}

int kb_api_caller(kb_api_t *api, kb_grpc_call_t *call, char *out, size_t cap)
{
    char *authz = s_meta(call, "authorization");
    char *user = s_meta(call, "x-user-id");
    int rc = kb_auth_identify_conn(api->o.auth, s_conn_fd(call), authz, user, out, cap);
    free(authz);
    free(user);
    if (rc) {
        kb_grpc_fail(call, KB_GRPC_UNAUTHENTICATED, out);
        return -1;
    }
    return 0;
}

int kb_api_guest_target(kb_api_t *api, kb_grpc_call_t *call, char *caller, size_t ccap, char *id,
                        size_t icap)
{
    if (kb_api_caller(api, call, caller, ccap))
        return -1;
    char *sid = NULL;
    if (kb_grpc_call_metadata_one(call, KB_API_SANDBOX_ID_KEY, &sid) != 0) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT,
                     "exactly one kagent-sandbox-id metadata value is required");
        return -1;
    }
    int bad = ka_check_uuid(sid);
    snprintf(id, icap, "%s", sid);
    free(sid);
    if (bad) {
        kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, KA_MSG_NOT_UUID);
        return -1;
    }
    return 0;
}

kb_api_t *kb_api_new(const kb_api_options_t *opts)
{
    if (!opts || !opts->svc || !opts->auth)
        return NULL;
    kb_api_t *api = calloc(1, sizeof *api);
    if (!api)
        return NULL;
    api->o = *opts;
    if (opts->state_dir) {
        ka_images_opts_t io = {.state_dir = opts->state_dir};
        api->images_ro = ka_images_new(&io);
    }
    return api;
}

static int s_add(kb_api_t *api, kb_grpc_server_t *srv, const kb_grpc_method_t *table, size_t n)
{
    kb_grpc_method_t *copy = calloc(n, sizeof *copy);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, table, n * sizeof *copy);
    for (size_t i = 0; i < n; i++)
        copy[i].user = api;
    int rc = kb_grpc_server_add_methods(srv, copy, n);
    free(copy);
    return rc;
}

int kb_api_register(kb_api_t *api, kb_grpc_server_t *srv)
{
    int rc = s_add(api, srv, kb_api_sandbox_methods, kb_api_sandbox_n);
    if (!rc)
        rc = s_add(api, srv, kb_api_template_methods, kb_api_template_n);
    if (!rc)
        rc = s_add(api, srv, kb_api_guest_methods, kb_api_guest_n);
    if (!rc)
        rc = s_add(api, srv, kb_api_runtime_methods, kb_api_runtime_n);
    if (!rc)
        rc = s_add(api, srv, kb_api_terminal_methods, kb_api_terminal_n);
    if (!rc)
        rc = s_add(api, srv, kb_api_files_methods, kb_api_files_n);
    return rc;
}

void kb_api_destroy(kb_api_t **api_p)
{
    if (api_p && *api_p) {
        ka_images_destroy(&(*api_p)->images_ro);
        free(*api_p);
        *api_p = NULL;
    }
}
