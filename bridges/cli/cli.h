/*
 * kb_cli: the `kagent` command-line client (gRPC). The binary's main() is a thin wrapper around
 * kb_cli_main so the tests can run commands in-process.
 *
 * Exit codes: 0 success; 1 an error (message on stderr as "Error: ..."); 2 a usage error
 * (bad flag, argument count or flag value; followed by a "Run '... --help' for usage." hint);
 * `sandbox exec` / `sandbox wait` exit with the remote exit code when it is 1..255.
 */
#ifndef KB_CLI_H
#define KB_CLI_H

#include <stdio.h>

#define KB_EXIT_OK    0
#define KB_EXIT_ERROR 1
#define KB_EXIT_USAGE 2

/* Runs one command line (argv[0] is the program name). Normal output goes to out, notes and
 * errors to err; both are flushed before returning. Returns the process exit code. */
int kb_cli_main(int argc, char **argv, FILE *out, FILE *err);

/* Installs SIGINT/SIGTERM handlers that interrupt the call in flight (the command then
 * reports the interruption) and ignores SIGPIPE. For the binary, not for tests. */
void kb_cli_install_signals(void);

#endif
