/*
 * ka_checks: the request rules both bridges apply, with the reference's limits and one wording.
 * gRPC and MCP decode their own formats, then ask these; a refusal's message is the same
 * whichever way the request came (tests/integration/api/test_validation.py sends every invalid
 * input through both). Each returns NULL when the value is valid, else the message.
 */
#ifndef KA_CHECKS_H
#define KA_CHECKS_H

#include <stddef.h>

#define KA_REQUEST_ID_MAX   128
#define KA_SANDBOX_NAME_MAX 200
#define KA_CWD_MAX          1023
#define KA_START_TAIL_MAX   ((size_t)1 << 20) /* argv and env of a process together */

const char *ka_check_request_id(const char *request_id);
const char *ka_check_sandbox_name(const char *name);
/* argv0: the first argument (NULL when there is none) */
const char *ka_check_command(size_t argc, const char *argv0);
const char *ka_check_env_key(const char *key);
const char *ka_check_cwd(const char *cwd);
/* tail: bytes of argv and env as NUL-terminated strings ("k=v" for env) */
const char *ka_check_start_size(size_t tail);

/* The Files API (checks_fs.c). path: optional ("" = the workspace root) for list, stat and
 * watch, required otherwise; page_token: a name as next_page_token returned it. */
const char *ka_check_fs_path(const char *path, int required);
const char *ka_check_page_size(long long page_size);
const char *ka_check_page_token(const char *token);
const char *ka_check_fs_mode(long long mode);

#endif
