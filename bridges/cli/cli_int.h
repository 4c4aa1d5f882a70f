/*
 * kb_cli internals shared by the command files (cmd_*.c): the command table types, parsed
 * arguments, the per-run context and helpers for errors, RPCs and output.
 */
#ifndef KB_CLI_INT_H
#define KB_CLI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

#include "cli.h"
#include "jsonpath.h"
#include "output.h"
#include "rpc.h"

#define KB_MAX_FLAGS    48
#define KB_MAX_ARGS     256
#define KB_MAX_LIST     128
#define KB_TRANSFER_CAP ((size_t)64 << 20) /* upload/download cap, as the server's */
#define KB_CHUNK        ((size_t)1 << 20)  /* streamed transfer chunk */
#define KB_NS_PER_SEC   1000000000LL

typedef enum {
    KB_F_STRING,
    KB_F_BOOL,
    KB_F_INT,      /* base 0 (0x.., 0..), like Go's strconv.ParseInt(s, 0, 64) */
    KB_F_UINT32,   /* base 0: "0644" is octal */
    KB_F_DURATION, /* Go syntax: "5m0s", "1.5h", "300ms" */
    KB_F_STRMAP,   /* repeatable KEY=VALUE, also comma-separated */
} kb_flag_kind_t;

/* One flag of a command (or a global flag). */
typedef struct kb_flag {
    const char *name; /* long name without dashes */
    char shorthand;   /* 0 = none */
    kb_flag_kind_t kind;
    const char *def;   /* default value text (NULL = empty / false / 0) */
    const char *usage; /* help text */
    const char *vtype; /* value type shown in help ("string", "int32"...) */
} kb_flag_t;

/* Parsed command line of one command. Strings borrow from argv or the flag defaults. */
typedef struct kb_args {
    const char *pos[KB_MAX_ARGS]; /* positional arguments */
    int npos;
    int dash_at; /* positional count before "--", -1 if no "--" */
    const kb_flag_t *flags[KB_MAX_FLAGS];
    const char *val[KB_MAX_FLAGS]; /* last value given (or the default) */
    bool set[KB_MAX_FLAGS];        /* given on the command line */
    int nflags;
    const char *list[KB_MAX_LIST]; /* every KEY=VALUE item of STRMAP flags, in order */
    int nlist;
    char *owned[KB_MAX_LIST]; /* splits of comma-separated STRMAP values */
    int nowned;
} kb_args_t;

typedef struct kb_cli kb_cli_t;

/* -o: how results print. */
typedef enum { KB_OUT_TABLE, KB_OUT_JSON, KB_OUT_YAML, KB_OUT_JSONPATH } kb_output_t;

/* A command or a group of subcommands. */
typedef struct kb_cmd {
    const char *name;
    const char *use; /* usage after the parent path, e.g. "create TEMPLATE --request-id ID" */
    const char *short_help; /* one line */
    const char *long_help;  /* paragraph or NULL */
    const kb_flag_t *flags; /* own flags, terminated by {0}; NULL = none */
    int min_args;
    int max_args; /* -1 = unbounded */
    int (*run)(kb_cli_t *cli, const kb_args_t *a);
    const struct kb_cmd *const *subs; /* NULL-terminated; non-NULL for groups */
} kb_cmd_t;

/* The context of one kb_cli_main run. */
struct kb_cli {
    FILE *out;
    FILE *err;
    const char *api_url;
    const char *namespace_;
    const char *user_id;
    const char *token;
    const char *ca_file;
    const char *server_name;
    const char *cert_file; /* mutual TLS: client certificate and key */
    const char *key_file;
    bool json; /* structured output (-o json, yaml or jsonpath=): render with kb_cli_print* */
    kb_output_t output;
    kb_jsonpath_t *jsonpath; /* -o jsonpath=TEMPLATE, parsed (freed by kb_cli_main) */
    bool verbose;
    int64_t timeout_ns;
    kb_rpc_t *rpc;  /* opened by kb_cli_rpc */
    char path[128]; /* "kagent sandbox exec", for hints */
};

/* Command groups (one file each). */
extern const kb_cmd_t kb_cmd_sandbox_create, kb_cmd_sandbox_list, kb_cmd_sandbox_get,
    kb_cmd_sandbox_suspend, kb_cmd_sandbox_resume, kb_cmd_sandbox_delete, kb_cmd_sandbox_pause,
    kb_cmd_sandbox_unpause, kb_cmd_sandbox_fork; /* cmd_sandbox.c */
extern const kb_cmd_t kb_cmd_sandbox_exec, kb_cmd_sandbox_wait, kb_cmd_sandbox_process,
    kb_cmd_sandbox_kill;                                              /* cmd_process.c */
extern const kb_cmd_t kb_cmd_sandbox_upload, kb_cmd_sandbox_download; /* cmd_files.c */
extern const kb_cmd_t kb_cmd_sandbox_ls, kb_cmd_sandbox_stat, kb_cmd_sandbox_rm,
    kb_cmd_sandbox_mkdir, kb_cmd_sandbox_mv, kb_cmd_sandbox_watch; /* cmd_fs.c */
extern const kb_cmd_t kb_cmd_sandbox_templates, kb_cmd_apply, kb_cmd_get,
    kb_cmd_delete;                                  /* cmd_templates.c */
extern const kb_cmd_t kb_cmd_image, kb_cmd_runtime; /* cmd_runtime.c */
/* Writes the bash completion script for the tree under root (cmd_completion.c). 0 or -1. */
int kb_completion_bash(FILE *out, const kb_cmd_t *root, const kb_flag_t *globals);

/* Argument access. */
const char *kb_args_str(const kb_args_t *a, const char *name);
bool kb_args_bool(const kb_args_t *a, const char *name);
int64_t kb_args_int(const kb_args_t *a, const char *name);
int64_t kb_args_duration(const kb_args_t *a, const char *name); /* nanoseconds */
bool kb_args_given(const kb_args_t *a, const char *name);

/* Go-style durations. 0 or -EINVAL. */
int kb_parse_duration(const char *s, int64_t *ns);

/* Prints "Error: <msg>" to err; returns KB_EXIT_ERROR. */
int kb_cli_fail(kb_cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "Error: <msg>" and the --help hint; returns KB_EXIT_USAGE. */
int kb_cli_usage(kb_cli_t *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The gRPC client of this run (opened on first use); NULL after printing an error. */
kb_rpc_t *kb_cli_rpc(kb_cli_t *cli);
/* Formats a failed status as grpc-go does ("rpc error: code = X desc = Y"). */
void kb_cli_cause(const kb_rpc_status_t *st, char *buf, size_t cap);

/* Prints msg as -o asks: indented camelCase JSON, YAML, or the JSONPath template's text. */
int kb_cli_print(kb_cli_t *cli, const ProtobufCMessage *msg);
/* The same for a JSON document (borrowed). */
int kb_cli_print_json(kb_cli_t *cli, const json_t *doc);

/* Progress on err when it is a terminal (a no-op otherwise): done of total bytes (total 0 =
 * unknown); end finishes the line. */
void kb_cli_progress(kb_cli_t *cli, const char *label, uint64_t done, uint64_t total, bool end);

/* One line on err while a long unary call runs (suspend, resume, fork): the label and the time
 * so far, updated in place, then "done"/"failed" and the total at stop. Only when err is a
 * terminal (NULL otherwise: stop does nothing), so pipes and CI never see it (ticker.c). */
typedef struct kb_ticker kb_ticker_t;
kb_ticker_t *kb_ticker_start(kb_cli_t *cli, const char *label);
/* Idempotent; NULLs *t_p. */
void kb_ticker_stop(kb_ticker_t **t_p, bool ok);

/* Shared renderers (also used by the tests). */
struct Kagent__Api__V1__Sandbox;
struct Ateenv__V1alpha__Process;
void kb_print_sandboxes(FILE *out, struct Kagent__Api__V1__Sandbox *const *sbs, size_t n);
void kb_print_process(FILE *out, const struct Ateenv__V1alpha__Process *p);
/* The exit code of a finished process: 0 on success, the remote code if 1..255, else 1. */
int kb_process_exit_code(const struct Ateenv__V1alpha__Process *p);
/* Formats a Timestamp message (may be NULL -> "") as RFC 3339. */
void kb_fmt_time(const ProtobufCMessage *ts, char *buf, size_t cap);

#endif
