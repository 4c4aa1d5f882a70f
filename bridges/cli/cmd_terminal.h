/* Interactive sessions of `sandbox exec` and `sandbox wait` (cmd_terminal.c). */
#ifndef KB_CMD_TERMINAL_H
#define KB_CMD_TERMINAL_H

#include "cli_int.h"
#include "ateenv/v1alpha/guest.pb-c.h"

typedef struct kb_terminal_opts {
    const char *sandbox_id;
    Ateenv__V1alpha__StartProcessRequest *process; /* start this (borrowed), or (NULL) attach: */
    const char *process_id;
    int64_t stdout_offset, stderr_offset;
    bool stdin_open;    /* -i: forward standard input (never read otherwise) */
    bool tty;           /* -t: a remote terminal, the local one raw */
    bool timeout_given; /* --timeout was given (else the session has no deadline) */
} kb_terminal_opts_t;

/* Runs the session to the process's end; returns its exit code (as exec does) or
 * KB_EXIT_ERROR after printing why. */
int kb_terminal_run(kb_cli_t *cli, const kb_terminal_opts_t *o);

#endif
