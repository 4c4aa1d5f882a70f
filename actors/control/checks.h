/*
 * ka_checks: the request rules both bridges apply, with the reference's limits and one wording.
 * gRPC and MCP decode their own formats, then ask these; a refusal's message is the same
 * whichever way the request came (tests/integration/api/test_validation.py sends every invalid
 * input through both). Each returns NULL when the value is valid, else the message.
 */
#ifndef KA_CHECKS_H
#define KA_CHECKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* ---- the service layer's other rules (svc_ops.c), one message each ---- */

#define KA_PATH_MAX   1023
#define KA_MODE_MAX   07777
#define KA_PAGE_MAX   100
#define KA_SIGNAL_MAX 31

/* process_id as a process start returned it (decimal, > 0) into *out. */
const char *ka_check_process_id(const char *s, uint64_t *out);
/* A guest path: 1-1023 bytes. */
const char *ka_check_path(const char *path);
const char *ka_check_signal(int signal);
const char *ka_check_offsets(int64_t stdout_offset, int64_t stderr_offset);
const char *ka_check_seek(int64_t seek_offset);
const char *ka_check_mode(int64_t mode);
/* ttl_ms: 0 = the default, else positive. */
const char *ka_check_ttl(int64_t ttl_ms);
/* limit 0-100, offset >= 0. */
const char *ka_check_page(int64_t limit, int64_t offset);
/* A page token (a decimal offset) into *offset. */
const char *ka_check_page_token(const char *token, int64_t *offset);
/* A sandbox's template reference: namespace a DNS label, name a DNS subdomain (required). */
const char *ka_check_sandbox_template(const char *namespace_, const char *name);
/* A template reference of the template calls: namespace a DNS label; name (when need_name) a
 * DNS subdomain. */
const char *ka_check_template_ref(const char *namespace_, const char *name, bool need_name);
/* The Files API (checks_fs.c). path: optional ("" = the workspace root) for list, stat and
 * watch, required otherwise; page_token: a name as next_page_token returned it. */
const char *ka_check_fs_path(const char *path, int required);
const char *ka_check_page_size(long long page_size);
const char *ka_check_fs_page_token(const char *token);
const char *ka_check_fs_mode(long long mode);

#endif
