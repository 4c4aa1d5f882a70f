/*
 * kb_cli: command tree, flag parsing (pflag-like: --name value, --name=value, -n value, -nvalue,
 * flags anywhere before "--"), help, dispatch and the helpers shared by the command files.
 */
#include "cli_int.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "google/protobuf/timestamp.pb-c.h"
#include "pbjson.h"

/* ------------------------------------------------------------------------------------------ */
/* The command tree                                                                           */

static const kb_flag_t s_global_flags[] = {
    {"api-url", 0, KB_F_STRING, "http://localhost:8083",
     "control-plane API URL (gRPC and /mcp share this port); https://HOST:PORT for TLS", "string"},
    {"gateway-url", 0, KB_F_STRING, "http://localhost:8083", "A2A and MCP gateway URL", "string"},
    {"ca-file", 0, KB_F_STRING, NULL,
     "CA certificate (PEM) that signed the server's, for https:// (default: system roots)",
     "string"},
    {"server-name", 0, KB_F_STRING, NULL,
     "TLS server name override: the name the server certificate must carry", "string"},
    {"cert-file", 0, KB_F_STRING, NULL, "client certificate (PEM) for mutual TLS", "string"},
    {"key-file", 0, KB_F_STRING, NULL, "private key (PEM) of --cert-file", "string"},
    {"namespace", 'n', KB_F_STRING, "kagent", "namespace", "string"},
    {"output-format", 'o', KB_F_STRING, "table",
     "output format: table, json, yaml or jsonpath=TEMPLATE (kubectl's JSONPath)", "string"},
    {"timeout", 0, KB_F_DURATION, "5m0s", "bounds the whole command", "duration"},
    {"user-id", 0, KB_F_STRING, "admin@kagent.dev",
     "Caller identity used to select the server-side data partition", "string"},
    {"token", 0, KB_F_STRING, NULL, "bearer token (sent as authorization: Bearer TOKEN)", "string"},
    {"verbose", 'v', KB_F_BOOL, NULL, "verbose output (one line per gRPC call on stderr)", NULL},
    {"help", 'h', KB_F_BOOL, NULL, "help for this command", NULL},
    {0},
};

static const kb_cmd_t *const s_sandbox_subs[] = {&kb_cmd_sandbox_templates,
                                                 &kb_cmd_sandbox_create,
                                                 &kb_cmd_sandbox_list,
                                                 &kb_cmd_sandbox_get,
                                                 &kb_cmd_sandbox_suspend,
                                                 &kb_cmd_sandbox_resume,
                                                 &kb_cmd_sandbox_pause,
                                                 &kb_cmd_sandbox_unpause,
                                                 &kb_cmd_sandbox_delete,
                                                 &kb_cmd_sandbox_exec,
                                                 &kb_cmd_sandbox_wait,
                                                 &kb_cmd_sandbox_process,
                                                 &kb_cmd_sandbox_kill,
                                                 &kb_cmd_sandbox_upload,
                                                 &kb_cmd_sandbox_download,
                                                 &kb_cmd_sandbox_fork,
                                                 &kb_cmd_sandbox_ls,
                                                 &kb_cmd_sandbox_stat,
                                                 &kb_cmd_sandbox_rm,
                                                 &kb_cmd_sandbox_mkdir,
                                                 &kb_cmd_sandbox_mv,
                                                 &kb_cmd_sandbox_watch,
                                                 NULL};

static const kb_cmd_t s_cmd_sandbox = {
    .name = "sandbox",
    .use = "sandbox [command]",
    .short_help = "Run commands and transfer files in standalone sandboxes",
    .subs = s_sandbox_subs,
};

static int s_run_version(kb_cli_t *cli, const kb_args_t *a)
{
    fprintf(cli->out, "kagent %s\n", KAGENT_VERSION);
    return KB_EXIT_OK;
}

static const kb_cmd_t s_cmd_version = {
    .name = "version",
    .use = "version",
    .short_help = "Print the client version",
    .run = s_run_version,
    .max_args = 0,
};

static int s_run_completion(kb_cli_t *cli, const kb_args_t *a);

static const kb_cmd_t s_cmd_completion_bash = {
    .name = "bash",
    .use = "bash",
    .short_help = "Print the bash completion script (source <(kagent completion bash))",
    .run = s_run_completion,
    .max_args = 0,
};
static const kb_cmd_t *const s_completion_subs[] = {&s_cmd_completion_bash, NULL};
static const kb_cmd_t s_cmd_completion = {
    .name = "completion",
    .use = "completion [shell]",
    .short_help = "Shell completion scripts",
    .subs = s_completion_subs,
};

static const kb_cmd_t *const s_root_subs[] = {&s_cmd_sandbox, &kb_cmd_apply,     &kb_cmd_get,
                                              &kb_cmd_delete, &kb_cmd_image,     &kb_cmd_runtime,
                                              &s_cmd_version, &s_cmd_completion, NULL};

static const kb_cmd_t s_cmd_root = {
    .name = "kagent",
    .use = "kagent [command]",
    .short_help = "kagent sandboxes: templates, sandboxes, processes, files, images",
    .subs = s_root_subs,
};

static int s_run_completion(kb_cli_t *cli, const kb_args_t *a)
{
    return kb_completion_bash(cli->out, &s_cmd_root, s_global_flags) ? KB_EXIT_ERROR : KB_EXIT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Durations                                                                                  */

int kb_parse_duration(const char *s, int64_t *ns)
{
    static const struct {
        const char *unit;
        double ns;
    } units[] = {{"ns", 1},  {"us", 1e3}, {"\xc2\xb5s", 1e3}, {"ms", 1e6},
                 {"s", 1e9}, {"m", 60e9}, {"h", 3600e9}};
    const char *p = s;
    bool neg = false;
    if (*p == '-' || *p == '+')
        neg = *p++ == '-';
    if (strcmp(p, "0") == 0) {
        *ns = 0;
        return 0;
    }
    if (!*p)
        return -EINVAL;
    double total = 0;
    while (*p) {
        char *end;
        if (!((*p >= '0' && *p <= '9') || *p == '.'))
            return -EINVAL;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno)
            return -EINVAL;
        p = end;
        size_t best = 0, best_len = 0;
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
            size_t l = strlen(units[i].unit);
            if (strncmp(p, units[i].unit, l) == 0 && l > best_len) {
                best = i;
                best_len = l;
            }
        }
        if (!best_len)
            return -EINVAL; /* Go: missing unit */
        total += v * units[best].ns;
        p += best_len;
    }
    if (total > 9.2e18)
        return -EINVAL;
    *ns = (int64_t)(neg ? -total : total);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Arguments                                                                                  */

static int s_flag_index(const kb_args_t *a, const char *name)
{
    for (int i = 0; i < a->nflags; i++)
        if (strcmp(a->flags[i]->name, name) == 0)
            return i;
    return -1;
}

const char *kb_args_str(const kb_args_t *a, const char *name)
{
    int i = s_flag_index(a, name);
    return i >= 0 && a->val[i] ? a->val[i] : "";
}

bool kb_args_given(const kb_args_t *a, const char *name)
{
    int i = s_flag_index(a, name);
    return i >= 0 && a->set[i];
}

static int s_parse_bool(const char *s, bool *out)
{
    static const char *const t[] = {"1", "t", "T", "true", "TRUE", "True"};
    static const char *const f[] = {"0", "f", "F", "false", "FALSE", "False"};
    for (size_t i = 0; i < 6; i++) {
        if (strcmp(s, t[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(s, f[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

bool kb_args_bool(const kb_args_t *a, const char *name)
{
    bool b = false;
    s_parse_bool(kb_args_str(a, name), &b);
    return b;
}

static int s_parse_int(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (!*s || *end || errno)
        return -EINVAL;
    *out = v;
    return 0;
}

int64_t kb_args_int(const kb_args_t *a, const char *name)
{
    int64_t v = 0;
    const char *s = kb_args_str(a, name);
    if (*s)
        s_parse_int(s, &v);
    return v;
}

int64_t kb_args_duration(const kb_args_t *a, const char *name)
{
    int64_t v = 0;
    const char *s = kb_args_str(a, name);
    if (*s)
        kb_parse_duration(s, &v);
    return v;
}

/* Checks a flag value for its kind; writes why into why. */
static int s_check_value(const kb_flag_t *f, const char *v, char *why, size_t cap)
{
    int64_t i;
    bool b;
    switch (f->kind) {
    case KB_F_BOOL:
        if (s_parse_bool(v, &b) != 0) {
            snprintf(why, cap, "strconv.ParseBool: parsing \"%s\": invalid syntax", v);
            return -EINVAL;
        }
        return 0;
    case KB_F_INT:
        if (s_parse_int(v, &i) != 0 || i < INT32_MIN || i > INT32_MAX) {
            snprintf(why, cap, "strconv.ParseInt: parsing \"%s\": invalid syntax", v);
            return -EINVAL;
        }
        return 0;
    case KB_F_UINT32:
        if (s_parse_int(v, &i) != 0 || i < 0 || i > UINT32_MAX || v[0] == '-') {
            snprintf(why, cap, "strconv.ParseUint: parsing \"%s\": invalid syntax", v);
            return -EINVAL;
        }
        return 0;
    case KB_F_DURATION:
        if (kb_parse_duration(v, &i) != 0) {
            snprintf(why, cap, "time: invalid duration \"%s\"", v);
            return -EINVAL;
        }
        return 0;
    case KB_F_STRMAP:
    case KB_F_STRING:
        return 0;
    }
    return 0;
}

static void s_args_free(kb_args_t *a)
{
    for (int i = 0; i < a->nowned; i++)
        free(a->owned[i]);
    a->nowned = 0;
}

/* Records KEY=VALUE items of a STRMAP flag value (comma-separated allowed). */
static int s_add_map_items(kb_args_t *a, const char *v, char *why, size_t cap)
{
    if (a->nowned >= KB_MAX_LIST) {
        snprintf(why, cap, "too many values");
        return -EINVAL;
    }
    char *copy = strdup(v);
    if (!copy)
        return -ENOMEM;
    a->owned[a->nowned++] = copy;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strchr(tok, '=')) {
            snprintf(why, cap, "%s must be formatted as key=value", tok);
            return -EINVAL;
        }
        if (a->nlist >= KB_MAX_LIST) {
            snprintf(why, cap, "too many values");
            return -EINVAL;
        }
        a->list[a->nlist++] = tok;
    }
    return 0;
}

/* "-it": every letter of w a boolean shorthand, each set. 0 or KB_EXIT_USAGE. */
static int s_bool_group(kb_cli_t *cli, kb_args_t *a, const char *w)
{
    for (const char *c = w + 1; *c; c++) {
        int idx = -1;
        for (int k = 0; k < a->nflags; k++)
            if (a->flags[k]->shorthand == *c && a->flags[k]->kind == KB_F_BOOL)
                idx = k;
        if (idx < 0)
            return kb_cli_usage(cli, "unknown shorthand flag: '%c' in %.60s", *c, w);
        a->val[idx] = "true";
        a->set[idx] = true;
    }
    return 0;
}

/* Parses argv (the words after the command path) into a. Returns 0, or KB_EXIT_USAGE after
 * printing the error. */
static int s_parse(kb_cli_t *cli, const kb_cmd_t *cmd, int argc, char **argv, kb_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->dash_at = -1;
    const kb_flag_t *sets[2] = {cmd->flags, s_global_flags};
    for (int s = 0; s < 2; s++)
        for (const kb_flag_t *f = sets[s]; f && f->name; f++) {
            if (a->nflags >= KB_MAX_FLAGS)
                break;
            a->flags[a->nflags] = f;
            a->val[a->nflags] = f->def;
            a->nflags++;
        }
    bool dash = false;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (dash || w[0] != '-' || w[1] == '\0') {
            if (a->npos >= KB_MAX_ARGS)
                return kb_cli_usage(cli, "too many arguments");
            a->pos[a->npos++] = w;
            continue;
        }
        if (strcmp(w, "--") == 0) {
            dash = true;
            a->dash_at = a->npos;
            continue;
        }
        int idx = -1;
        const char *val = NULL;
        char shown[96];
        if (w[1] == '-') {
            const char *name = w + 2;
            const char *eq = strchr(name, '=');
            size_t nl = eq ? (size_t)(eq - name) : strlen(name);
            for (int k = 0; k < a->nflags; k++)
                if (strlen(a->flags[k]->name) == nl && strncmp(a->flags[k]->name, name, nl) == 0)
                    idx = k;
            snprintf(shown, sizeof shown, "--%.*s", (int)(nl > 60 ? 60 : nl), name);
            if (idx < 0)
                return kb_cli_usage(cli, "unknown flag: %s", shown);
            if (eq)
                val = eq + 1;
        } else {
            for (int k = 0; k < a->nflags; k++)
                if (a->flags[k]->shorthand == w[1])
                    idx = k;
            snprintf(shown, sizeof shown, "-%c", w[1]);
            if (idx < 0)
                return kb_cli_usage(cli, "unknown shorthand flag: '%c' in %.60s", w[1], w);
            if (w[2] && w[2] != '=' && a->flags[idx]->kind == KB_F_BOOL) {
                int rc = s_bool_group(cli, a, w);
                if (rc) {
                    s_args_free(a);
                    return rc;
                }
                continue;
            }
            if (w[2])
                val = w[2] == '=' ? w + 3 : w + 2;
        }
        const kb_flag_t *f = a->flags[idx];
        if (!val) {
            if (f->kind == KB_F_BOOL) {
                val = "true";
            } else {
                if (i + 1 >= argc)
                    return kb_cli_usage(cli, "flag needs an argument: %s", shown);
                val = argv[++i];
            }
        }
        char why[160];
        int rc = s_check_value(f, val, why, sizeof why);
        if (rc == 0 && f->kind == KB_F_STRMAP)
            rc = s_add_map_items(a, val, why, sizeof why);
        if (rc != 0) {
            char fname[80];
            if (f->shorthand)
                snprintf(fname, sizeof fname, "-%c, --%s", f->shorthand, f->name);
            else
                snprintf(fname, sizeof fname, "--%s", f->name);
            s_args_free(a);
            return kb_cli_usage(cli, "invalid argument \"%s\" for \"%s\" flag: %s", val, fname,
                                why);
        }
        a->val[idx] = val;
        a->set[idx] = true;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Help                                                                                       */

static void s_print_flags(FILE *out, const kb_flag_t *flags)
{
    for (const kb_flag_t *f = flags; f && f->name; f++) {
        char left[96];
        if (f->shorthand)
            snprintf(left, sizeof left, "  -%c, --%s%s%s", f->shorthand, f->name,
                     f->vtype ? " " : "", f->vtype ? f->vtype : "");
        else
            snprintf(left, sizeof left, "      --%s%s%s", f->name, f->vtype ? " " : "",
                     f->vtype ? f->vtype : "");
        fprintf(out, "%-36s %s", left, f->usage);
        if (f->def && f->def[0] && f->kind != KB_F_BOOL) {
            if (f->kind == KB_F_STRING)
                fprintf(out, " (default \"%s\")", f->def);
            else
                fprintf(out, " (default %s)", f->def);
        } else if (f->def && f->kind == KB_F_BOOL && strcmp(f->def, "true") == 0) {
            fprintf(out, " (default true)");
        }
        fputc('\n', out);
    }
}

static void s_help(kb_cli_t *cli, const kb_cmd_t *cmd, const char *parent)
{
    FILE *o = cli->out;
    fprintf(o, "%s\n\n", cmd->long_help ? cmd->long_help : cmd->short_help);
    fprintf(o, "Usage:\n");
    if (cmd->run)
        fprintf(o, "  %s%s%s [flags]\n", parent, parent[0] ? " " : "", cmd->use);
    if (cmd->subs)
        fprintf(o, "  %s%s%s [command]\n", parent, parent[0] ? " " : "", cmd->name);
    if (cmd->subs) {
        fprintf(o, "\nAvailable Commands:\n");
        int w = 12; /* Cobra pads names to the longest, at least 11 */
        for (const kb_cmd_t *const *s = cmd->subs; *s; s++)
            if ((int)strlen((*s)->name) + 1 > w)
                w = (int)strlen((*s)->name) + 1;
        for (const kb_cmd_t *const *s = cmd->subs; *s; s++)
            fprintf(o, "  %-*s %s\n", w, (*s)->name, (*s)->short_help);
    }
    if (cmd->flags && cmd->flags[0].name) {
        fprintf(o, "\nFlags:\n");
        s_print_flags(o, cmd->flags);
    }
    fprintf(o, "\nGlobal Flags:\n");
    s_print_flags(o, s_global_flags);
    if (cmd->subs)
        fprintf(o, "\nUse \"%s [command] --help\" for more information about a command.\n",
                cli->path);
}

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                             */

int kb_cli_fail(kb_cli_t *cli, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("Error: ", cli->err);
    vfprintf(cli->err, fmt, ap);
    fputc('\n', cli->err);
    va_end(ap);
    return KB_EXIT_ERROR;
}

int kb_cli_usage(kb_cli_t *cli, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("Error: ", cli->err);
    vfprintf(cli->err, fmt, ap);
    fputc('\n', cli->err);
    va_end(ap);
    fprintf(cli->err, "Run '%s --help' for usage.\n", cli->path[0] ? cli->path : "kagent");
    return KB_EXIT_USAGE;
}

kb_rpc_t *kb_cli_rpc(kb_cli_t *cli)
{
    if (cli->rpc)
        return cli->rpc;
    char err[256];
    kb_rpc_opts_t o = {
        .api_url = cli->api_url,
        .user_id = cli->user_id,
        .token = cli->token,
        .ca_file = cli->ca_file,
        .server_name = cli->server_name,
        .cert_file = cli->cert_file,
        .key_file = cli->key_file,
        .timeout_ms = cli->timeout_ns > 0 ? (cli->timeout_ns + 999999) / 1000000 : 0,
        .trace = cli->verbose ? cli->err : NULL,
    };
    cli->rpc = kb_rpc_new(&o, err, sizeof err);
    if (!cli->rpc)
        kb_cli_fail(cli, "%s", err);
    return cli->rpc;
}

void kb_cli_cause(const kb_rpc_status_t *st, char *buf, size_t cap)
{
    kb_rpc_format_error(st, buf, cap);
}

int kb_cli_print_json(kb_cli_t *cli, const json_t *doc)
{
    int rc = cli->output == KB_OUT_YAML       ? kb_out_yaml(cli->out, doc)
             : cli->output == KB_OUT_JSONPATH ? kb_jsonpath_print(cli->jsonpath, doc, cli->out)
                                              : kb_out_json(cli->out, doc);
    return rc ? kb_cli_fail(cli, "cannot render the output: out of memory") : KB_EXIT_OK;
}

int kb_cli_print(kb_cli_t *cli, const ProtobufCMessage *msg)
{
    json_t *j = kb_pbjson_to_json(msg, 0);
    int rc = j ? kb_cli_print_json(cli, j) : kb_cli_fail(cli, "cannot render the output");
    json_decref(j);
    return rc;
}

void kb_cli_progress(kb_cli_t *cli, const char *label, uint64_t done, uint64_t total, bool end)
{
    if (!isatty(fileno(cli->err)))
        return;
    enum { W = 30 };
    if (total) {
        int fill = (int)(done * W / total);
        char bar[W + 1];
        for (int i = 0; i < W; i++)
            bar[i] = i < fill ? '#' : '-';
        bar[W] = '\0';
        fprintf(cli->err, "\r%s [%s] %3d%% %llu/%llu bytes", label, bar, (int)(done * 100 / total),
                (unsigned long long)done, (unsigned long long)total);
    } else {
        fprintf(cli->err, "\r%s %llu bytes", label, (unsigned long long)done);
    }
    if (end)
        fputc('\n', cli->err);
    fflush(cli->err);
}

void kb_fmt_time(const ProtobufCMessage *ts, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (!ts)
        return;
    const Google__Protobuf__Timestamp *t = (const Google__Protobuf__Timestamp *)ts;
    /* Tables show seconds only, like Go's time.RFC3339. */
    if (kb_pbjson_format_timestamp(t->seconds, 0, buf, cap) != 0)
        snprintf(buf, cap, "invalid");
}

/* ------------------------------------------------------------------------------------------ */
/* Dispatch                                                                                   */

static void s_on_signal(int sig)
{
    (void)sig;
    kb_rpc_interrupt();
}

void kb_cli_install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static const kb_cmd_t *s_find_sub(const kb_cmd_t *cmd, const char *name)
{
    for (const kb_cmd_t *const *s = cmd->subs; s && *s; s++)
        if (strcmp((*s)->name, name) == 0)
            return *s;
    return NULL;
}

/* True if word is a flag that consumes the next word as its value. */
static bool s_flag_takes_next(const kb_cmd_t *cmd, const char *w)
{
    if (w[0] != '-' || strchr(w, '='))
        return false;
    const kb_flag_t *sets[2] = {cmd->flags, s_global_flags};
    for (int s = 0; s < 2; s++)
        for (const kb_flag_t *f = sets[s]; f && f->name; f++) {
            bool match =
                w[1] == '-' ? strcmp(w + 2, f->name) == 0 : (w[1] == f->shorthand && w[2] == '\0');
            if (match)
                return f->kind != KB_F_BOOL;
        }
    return false;
}

/* -o table|json|yaml|jsonpath=TEMPLATE (also jsonpath='TEMPLATE', as shells leave it). */
static int s_output_format(kb_cli_t *cli, const char *of)
{
    static const struct {
        const char *name;
        kb_output_t out;
    } plain[] = {{"table", KB_OUT_TABLE}, {"json", KB_OUT_JSON}, {"yaml", KB_OUT_YAML}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcmp(of, plain[i].name) == 0) {
            cli->output = plain[i].out;
            cli->json = cli->output != KB_OUT_TABLE;
            return 0;
        }
    if (strncmp(of, "jsonpath=", 9) != 0)
        return kb_cli_usage(cli,
                            "invalid output format \"%s\": want table, json, yaml or "
                            "jsonpath=TEMPLATE",
                            of);
    const char *t = of + 9;
    size_t n = strlen(t);
    char *tmpl = n >= 2 && t[0] == '\'' && t[n - 1] == '\'' ? strndup(t + 1, n - 2) : strdup(t);
    char err[KB_JSONPATH_ERR_CAP];
    cli->jsonpath = tmpl ? kb_jsonpath_parse(tmpl, err, sizeof err) : NULL;
    free(tmpl);
    if (!cli->jsonpath)
        return kb_cli_usage(cli, "%s", tmpl ? err : "out of memory");
    cli->output = KB_OUT_JSONPATH;
    cli->json = true;
    return 0;
}

static int s_apply_globals(kb_cli_t *cli, const kb_args_t *a)
{
    cli->api_url = kb_args_str(a, "api-url");
    cli->namespace_ = kb_args_str(a, "namespace");
    cli->user_id = kb_args_str(a, "user-id");
    cli->token = kb_args_str(a, "token");
    cli->ca_file = kb_args_str(a, "ca-file");
    cli->server_name = kb_args_str(a, "server-name");
    cli->cert_file = kb_args_str(a, "cert-file");
    cli->key_file = kb_args_str(a, "key-file");
    cli->verbose = kb_args_bool(a, "verbose");
    cli->timeout_ns = kb_args_duration(a, "timeout");
    return s_output_format(cli, kb_args_str(a, "output-format"));
}

/* Cobra-style argument-count messages. */
static int s_check_nargs(kb_cli_t *cli, const kb_cmd_t *cmd, int n)
{
    if (cmd->max_args >= 0 && cmd->min_args == cmd->max_args && n != cmd->min_args)
        return kb_cli_usage(cli, "accepts %d arg(s), received %d", cmd->min_args, n);
    if (n < cmd->min_args)
        return kb_cli_usage(cli, "requires at least %d arg(s), only received %d", cmd->min_args, n);
    if (cmd->max_args >= 0 && n > cmd->max_args)
        return kb_cli_usage(cli, "accepts at most %d arg(s), received %d", cmd->max_args, n);
    return 0;
}

static int s_run(kb_cli_t *cli, int argc, char **argv)
{
    /* Find the command: leading words that name subcommands, skipping flags (and their values)
     * wherever they are. The remaining words are the command's own arguments. */
    const kb_cmd_t *cmd = &s_cmd_root;
    char parent[128] = "";
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return kb_cli_fail(cli, "out of memory");
    int nrest = 0;
    bool descending = true, help_word = false;
    snprintf(cli->path, sizeof cli->path, "kagent");
    for (int i = 1; i < argc; i++) {
        const char *w = argv[i];
        if (strcmp(w, "--") == 0) {
            descending = false;
            rest[nrest++] = argv[i];
            continue;
        }
        if (w[0] == '-' && w[1]) {
            rest[nrest++] = argv[i];
            if (descending && s_flag_takes_next(cmd, w) && i + 1 < argc)
                rest[nrest++] = argv[++i];
            continue;
        }
        if (descending && cmd == &s_cmd_root && !help_word && strcmp(w, "help") == 0) {
            help_word = true;
            continue;
        }
        const kb_cmd_t *sub = descending && cmd->subs ? s_find_sub(cmd, w) : NULL;
        if (sub) {
            snprintf(parent, sizeof parent, "%s", cli->path);
            cmd = sub;
            size_t l = strlen(cli->path);
            snprintf(cli->path + l, sizeof cli->path - l, " %s", sub->name);
            continue;
        }
        if (descending && cmd->subs && !cmd->run) {
            free(rest);
            return kb_cli_usage(cli, "unknown command \"%s\" for \"%s\"", w, cli->path);
        }
        descending = false;
        rest[nrest++] = argv[i];
    }
    kb_args_t a;
    int rc = s_parse(cli, cmd, nrest, rest, &a);
    free(rest);
    if (rc) {
        s_args_free(&a);
        return rc;
    }
    if (help_word || kb_args_bool(&a, "help") || (!cmd->run && a.npos == 0)) {
        s_help(cli, cmd, parent);
        s_args_free(&a);
        return KB_EXIT_OK;
    }
    if (!cmd->run) { /* a group given arguments after "--" */
        rc = kb_cli_usage(cli, "unknown command \"%s\" for \"%s\"", a.pos[0], cli->path);
        s_args_free(&a);
        return rc;
    }
    if ((rc = s_apply_globals(cli, &a)) == 0 && (rc = s_check_nargs(cli, cmd, a.npos)) == 0)
        rc = cmd->run(cli, &a);
    s_args_free(&a);
    return rc;
}

int kb_cli_main(int argc, char **argv, FILE *out, FILE *err)
{
    kb_cli_t cli = {.out = out, .err = err};
    int rc = s_run(&cli, argc, argv);
    kb_rpc_destroy(&cli.rpc);
    kb_jsonpath_free(&cli.jsonpath);
    fflush(out);
    fflush(err);
    return rc;
}
