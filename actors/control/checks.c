/* ka_checks: one set of request rules and messages for both bridges (checks.h). */
#include "checks.h"

#include <stdint.h>
#include <string.h>

#include "template_doc.h"

const char *ka_check_request_id(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n >= 1 && n <= KA_REQUEST_ID_MAX ? NULL
                                            : "request_id must be between 1 and 128 characters";
}

const char *ka_check_sandbox_name(const char *s)
{
    return !s || strlen(s) <= KA_SANDBOX_NAME_MAX ? NULL : "name must be at most 200 characters";
}

const char *ka_check_command(size_t argc, const char *argv0)
{
    return argc > 0 && argv0 && argv0[0] ? NULL : "command must not be empty";
}

const char *ka_check_env_key(const char *key)
{
    return key && key[0] && !strchr(key, '=')
               ? NULL
               : "env keys must be non-empty and must not contain '='";
}

const char *ka_check_cwd(const char *cwd)
{
    return !cwd || strlen(cwd) <= KA_CWD_MAX ? NULL : "cwd must be at most 1023 bytes";
}

const char *ka_check_start_size(size_t tail)
{
    return tail <= KA_START_TAIL_MAX ? NULL : "command and env are too large (1 MiB at most)";
}

const char *ka_check_process_id(const char *s, uint64_t *out)
{
    const char *why = "process_id must be the decimal id a process start returned";
    if (!s || !*s || strlen(s) > 20)
        return why;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - d) / 10)
            return why;
        v = v * 10 + d;
    }
    *out = v;
    return v ? NULL : why;
}

const char *ka_check_path(const char *path)
{
    size_t n = path ? strlen(path) : 0;
    return n >= 1 && n <= KA_PATH_MAX ? NULL : "path must be 1-1023 bytes";
}

const char *ka_check_signal(int signal)
{
    return signal >= 1 && signal <= KA_SIGNAL_MAX
               ? NULL
               : "signal must be one of SIGNAL_HUP ... SIGNAL_SYS";
}

const char *ka_check_offsets(int64_t out, int64_t err)
{
    return out >= 0 && err >= 0 ? NULL : "output offsets must be nonnegative";
}

const char *ka_check_seek(int64_t seek)
{
    return seek >= 0 ? NULL : "seek_offset must be nonnegative";
}

const char *ka_check_mode(int64_t mode)
{
    return mode >= 0 && mode <= KA_MODE_MAX ? NULL : "mode must be between 0 and 4095 (07777)";
}

const char *ka_check_ttl(int64_t ttl_ms)
{
    return ttl_ms >= 0 ? NULL : "ttl must be positive";
}

const char *ka_check_page(int64_t limit, int64_t offset)
{
    return limit >= 0 && limit <= KA_PAGE_MAX && offset >= 0 && offset <= INT32_MAX
               ? NULL
               : "page size must be between 0 and 100 and the offset nonnegative";
}

const char *ka_check_page_token(const char *token, int64_t *offset)
{
    uint64_t v = 0;
    if (ka_check_process_id(token, &v) && strcmp(token, "0") != 0)
        return "page_token is not valid";
    if (v > INT32_MAX)
        return "page_token is not valid";
    *offset = (int64_t)v;
    return NULL;
}

const char *ka_check_sandbox_template(const char *ns, const char *name)
{
    if (!name || !name[0])
        return "sandbox_template is required";
    if (ns && ns[0] && ka_check_dns_label(ns))
        return "sandbox_template.namespace: must be a DNS label of 1-63 characters";
    if (ka_check_dns_subdomain(name))
        return "sandbox_template.name: must be a DNS subdomain of 1-253 characters";
    return NULL;
}

const char *ka_check_template_ref(const char *ns, const char *name, bool need_name)
{
    if (ns && ns[0] && ka_check_dns_label(ns))
        return "namespace must be a DNS label (1-63 characters)";
    if (need_name && (!name || ka_check_dns_subdomain(name)))
        return "name must be a DNS subdomain (1-253 characters)";
    return NULL;
}
