/* ka_checks: one set of request rules and messages for both bridges (checks.h). */
#include "checks.h"

#include <string.h>

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
