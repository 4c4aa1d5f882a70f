/* ka_checks for the Files API: one set of rules and messages for gRPC and MCP (checks.h). */
#include "checks.h"
#include "guest_proto.h"

#include <string.h>

const char *ka_check_fs_path(const char *path, int required)
{
    size_t n = path ? strlen(path) : 0;
    if (required && n == 0)
        return "path must be 1-1023 bytes";
    return n <= KA_CWD_MAX ? NULL : "path must be at most 1023 bytes";
}

const char *ka_check_page_size(long long page_size)
{
    return page_size >= 0 && page_size <= KA_GP_PAGE_MAX ? NULL
                                                         : "page_size must be between 0 and 1000";
}

const char *ka_check_fs_page_token(const char *token)
{
    size_t n = token ? strlen(token) : 0;
    return n <= KA_GP_NAME_MAX && !(token && strchr(token, '/'))
               ? NULL
               : "page_token must be a next_page_token of an earlier page";
}

const char *ka_check_fs_mode(long long mode)
{
    return mode >= 0 && mode <= 07777 ? NULL : "mode must be permission bits (at most 07777)";
}
