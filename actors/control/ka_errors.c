/* ka_errors: negative errno <-> gRPC status code and name, one table (ka_errors.h). */
#include "ka_errors.h"

#include <errno.h>
#include <stddef.h>

typedef struct {
    int err;  /* negative errno */
    int code; /* ka_code_t of control_msgs.h (gRPC's numbers; svc_ops.c asserts they agree) */
} s_row_t;

/* The first row of a code is its canonical errno; later rows are aliases (errno -> code). */
static const s_row_t s_rows[] = {
    {0, 0 /* OK */},
    {-ECANCELED, 1 /* CANCELLED */},
    {-EPROTO, 2 /* UNKNOWN */},
    {-EINVAL, 3 /* INVALID_ARGUMENT */},
    {-ETIMEDOUT, 4 /* DEADLINE_EXCEEDED */},
    {-ENOENT, 5 /* NOT_FOUND */},
    {-EEXIST, 6 /* ALREADY_EXISTS */},
    {-EPERM, 7 /* PERMISSION_DENIED */},
    {-ENOSPC, 8 /* RESOURCE_EXHAUSTED */},
    {-EBUSY, 9 /* FAILED_PRECONDITION */},
    {-ESTALE, 10 /* ABORTED */},
    {-ERANGE, 11 /* OUT_OF_RANGE */},
    {-ENOSYS, 12 /* UNIMPLEMENTED */},
    {-EIO, 13 /* INTERNAL */},
    {-ENOTCONN, 14 /* UNAVAILABLE */},
    {-EUCLEAN, 15 /* DATA_LOSS */},
    {-EACCES, 16 /* UNAUTHENTICATED */},
    /* aliases */
    {-ETIME, 4 /* DEADLINE_EXCEEDED */},  /* a control actor's (not the runtime's timeout) */
    {-EAGAIN, 10 /* ABORTED */},          /* the store's persisting serialization conflict */
    {-EBADMSG, 3 /* INVALID_ARGUMENT */}, /* a malformed message or image */
    {-ESRCH, 14 /* UNAVAILABLE */},       /* no such actor: the service is (re)starting */
    {-ESHUTDOWN, 14 /* UNAVAILABLE */},
    {-ECONNREFUSED, 14 /* UNAVAILABLE */}, /* a control actor's (KA_EUNAVAIL, control_msgs.h) */
    {-EREMOTE, 14 /* UNAVAILABLE */},
    {-EFBIG, 8 /* RESOURCE_EXHAUSTED */},
    {-ENOMEM, 8 /* RESOURCE_EXHAUSTED */},
    {-EMSGSIZE, 3 /* INVALID_ARGUMENT */},
    {-E2BIG, 3 /* INVALID_ARGUMENT */},
    {-ENAMETOOLONG, 3 /* INVALID_ARGUMENT */},
};

/* A guest operation's errnos (ka_err_of_guest): the file and process calls in the sandbox. */
static const s_row_t s_guest_rows[] = {
    {-ENOENT, 5 /* NOT_FOUND */},
    {-EAGAIN, 8 /* RESOURCE_EXHAUSTED */},
    {-EFBIG, 8 /* RESOURCE_EXHAUSTED */},
    {-ENOSPC, 8 /* RESOURCE_EXHAUSTED */},
    {-EMFILE, 8 /* RESOURCE_EXHAUSTED */},
    {-EINVAL, 3 /* INVALID_ARGUMENT */},
    {-ENAMETOOLONG, 3 /* INVALID_ARGUMENT */},
    {-EISDIR, 3 /* INVALID_ARGUMENT */},
    {-EEXIST, 6 /* ALREADY_EXISTS */},
    {-ENOTDIR, 9 /* FAILED_PRECONDITION */},
    {-ENOTEMPTY, 9 /* FAILED_PRECONDITION */},
    {-EPIPE, 9 /* FAILED_PRECONDITION */},  /* the process closed its stdin */
    {-ENOTTY, 9 /* FAILED_PRECONDITION */}, /* a resize of a process without a terminal */
    {-EACCES, 7 /* PERMISSION_DENIED */},
    {-EPERM, 7 /* PERMISSION_DENIED */},
    {-EBUSY, 10 /* ABORTED */},
    {-ETIMEDOUT, 4 /* DEADLINE_EXCEEDED */},
};

static const char *const s_names[] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

#define S_N_ROWS       (sizeof s_rows / sizeof s_rows[0])
#define S_N_GUEST_ROWS (sizeof s_guest_rows / sizeof s_guest_rows[0])

static int s_code_in(const s_row_t *rows, size_t n, int err)
{
    for (size_t i = 0; i < n; i++)
        if (rows[i].err == err)
            return rows[i].code;
    return 13; /* INTERNAL */
}

int ka_err_code(int err)
{
    return s_code_in(s_rows, S_N_ROWS, err);
}

int ka_err_of_code(int code)
{
    for (size_t i = 0; i < S_N_ROWS; i++)
        if (s_rows[i].code == code)
            return s_rows[i].err;
    return -EPROTO;
}

const char *ka_code_name(int code)
{
    return code >= 0 && code < (int)(sizeof s_names / sizeof s_names[0]) ? s_names[code]
                                                                         : "UNKNOWN";
}

const char *ka_err_name(int err)
{
    return ka_code_name(ka_err_code(err));
}

int ka_err_canonical(int err)
{
    return ka_err_of_code(ka_err_code(err));
}

int ka_err_of_guest(int err)
{
    return ka_err_of_code(s_code_in(s_guest_rows, S_N_GUEST_ROWS, err));
}
