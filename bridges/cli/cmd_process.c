/*
 * Process commands: exec, wait, process, kill (ateenv.v1alpha.ProcessService, and
 * kagent.api.v1.ProcessService/Exec).
 *
 * exec is one call, Exec: the process, its output and its exit in one stream (one guest round
 * trip); a server without Exec (UNIMPLEMENTED, nothing started) gets StartProcess and then
 * the follow below. wait follows StreamProcessOutput(follow=true) instead of polling. Either
 * way stdout/stderr chunks become `output` events, the exit the `finished` event. Anything
 * that ends the wait early (timeout, Ctrl-C, RPC failure, a stream that ends without exit) is
 * an `interrupted` event and the "wait interrupted; ..." error with the offsets to resume from;
 * the remote process is never killed by it. A start that fails says "command may have
 * started; do not blindly retry" only when its outcome is unknown (kb_rpc_outcome_unknown).
 */
#include "cli_int.h"
#include "cmd_terminal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/api/v1/process.pb-c.h"
#include "pbjson.h"

#define S_DEFAULT_CWD "/data/workspace"

void kb_print_process(FILE *out, const Ateenv__V1alpha__Process *p)
{
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
        &ateenv__v1alpha__process_state__descriptor, (int)p->state);
    char num[24], code[32] = "";
    snprintf(num, sizeof num, "%d", (int)p->state);
    if (p->state != ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING)
        snprintf(code, sizeof code, "exit_code=%d", (int)p->exit_code);
    kb_table_t *t = kb_table_new(3);
    if (!t)
        return;
    const char *row[] = {p->process_id, ev ? ev->name : num, code};
    kb_table_add(t, row);
    kb_table_print(t, out);
    kb_table_destroy(&t);
}

static const char *s_state_name(int state)
{
    const ProtobufCEnumValue *ev =
        protobuf_c_enum_descriptor_get_value(&ateenv__v1alpha__process_state__descriptor, state);
    return ev ? ev->name : "PROCESS_STATE_UNSPECIFIED";
}

/* ------------------------------------------------------------------------------------------ */
/* Events                                                                                     */

typedef struct {
    kb_cli_t *cli;
    const char *sandbox_id;
    const char *process_id;
    int64_t out_off; /* bytes of each stream already emitted */
    int64_t err_off;
} s_wait_t;

/* One event: a JSON record on stdout in JSON mode; in table mode the lifecycle notes go to
 * stderr and output bytes pass through raw. */
static void s_event(s_wait_t *w, const char *event, const Ateenv__V1alpha__Process *p,
                    const char *source, const ProtobufCBinaryData *data)
{
    kb_cli_t *cli = w->cli;
    if (!cli->json) {
        if (data) {
            FILE *f = strcmp(source, "stdout") == 0 ? cli->out : cli->err;
            fwrite(data->data, 1, data->len, f);
            fflush(f);
        } else if (strcmp(event, "started") == 0) {
            fprintf(cli->err,
                    "Process %s in sandbox %s: started (stdout offset %lld, stderr offset "
                    "%lld)\n",
                    w->process_id, w->sandbox_id, (long long)w->out_off, (long long)w->err_off);
        } else if (strcmp(event, "finished") == 0) {
            fprintf(cli->err, "Process %s: %s, exit_code=%d\n", w->process_id,
                    s_state_name((int)p->state), (int)p->exit_code);
        }
        fflush(cli->err);
        return;
    }
    json_t *j = json_object();
    if (!j)
        return;
    json_object_set_new(j, "event", json_string(event));
    json_object_set_new(j, "sandbox_id", json_string(w->sandbox_id));
    json_object_set_new(j, "process_id", json_string(w->process_id));
    if (p) {
        json_object_set_new(j, "status", json_string(s_state_name((int)p->state)));
        json_object_set_new(j, "exit_code", json_integer(p->exit_code));
    }
    if (source)
        json_object_set_new(j, "source", json_string(source));
    if (data) {
        char *b64 = kb_pbjson_base64_encode(data->data, data->len);
        json_object_set_new(j, "data", b64 ? json_string(b64) : json_null());
        free(b64);
    }
    json_object_set_new(j, "stdout_offset", json_integer(w->out_off));
    json_object_set_new(j, "stderr_offset", json_integer(w->err_off));
    kb_out_json_line(cli->out, j);
    fflush(cli->out);
    json_decref(j);
}

/* Emits `interrupted` and the resumable error; returns KB_EXIT_ERROR. */
static int s_interrupted(s_wait_t *w, const char *cause)
{
    s_event(w, "interrupted", NULL, NULL, NULL);
    return kb_cli_fail(w->cli,
                       "wait interrupted; sandbox %s process %s (stdout offset %lld, stderr "
                       "offset %lld); use sandbox wait to continue: %s",
                       w->sandbox_id, w->process_id, (long long)w->out_off, (long long)w->err_off,
                       cause);
}

int kb_process_exit_code(const Ateenv__V1alpha__Process *p)
{
    if (p->state != ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED)
        return KB_EXIT_ERROR;
    if (p->exit_code == 0)
        return KB_EXIT_OK;
    return p->exit_code >= 1 && p->exit_code <= 255 ? p->exit_code : KB_EXIT_ERROR;
}

/* An output chunk: counted in its stream's offset, then emitted. */
static void s_output(s_wait_t *w, bool stderr_, const ProtobufCBinaryData *data)
{
    *(stderr_ ? &w->err_off : &w->out_off) += (int64_t)data->len;
    s_event(w, "output", NULL, stderr_ ? "stderr" : "stdout", data);
}

/* The wait's end when p (may be NULL) is an exit: the `finished` event, and the CLI's exit
 * code in *code. False for anything else (a running process). */
static bool s_finished(s_wait_t *w, const Ateenv__V1alpha__Process *p, int *code)
{
    if (!p || p->state == ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING)
        return false;
    s_event(w, "finished", p, NULL, NULL);
    *code = kb_process_exit_code(p);
    return true;
}

/* The interruption of a stream that ended (read result rc) without the exit. */
static int s_stream_ended(s_wait_t *w, kb_rpc_call_t **call, int rc)
{
    kb_rpc_status_t st;
    char cause[KB_RPC_MSG_CAP + 64];
    int frc = kb_rpc_call_finish(*call, NULL, NULL, &st);
    kb_rpc_call_destroy(call);
    if (rc == 0 && frc == 0)
        snprintf(cause, sizeof cause, "output stream ended before the process exited");
    else
        kb_cli_cause(&st, cause, sizeof cause);
    return s_interrupted(w, cause);
}

/* Follows the process output from the current offsets until it exits. */
static int s_follow(s_wait_t *w, kb_rpc_t *rpc)
{
    Ateenv__V1alpha__StreamProcessOutputRequest req =
        ATEENV__V1ALPHA__STREAM_PROCESS_OUTPUT_REQUEST__INIT;
    req.process_id = (char *)w->process_id;
    req.stdout_offset = w->out_off;
    req.stderr_offset = w->err_off;
    req.follow = true;
    kb_rpc_status_t st;
    char cause[KB_RPC_MSG_CAP + 64];
    kb_rpc_call_t *call = kb_rpc_server_stream(
        rpc, "/ateenv.v1alpha.ProcessService/StreamProcessOutput", w->sandbox_id, &req.base, &st);
    if (!call) {
        kb_cli_cause(&st, cause, sizeof cause);
        return s_interrupted(w, cause);
    }
    ProtobufCMessage *m = NULL;
    int rc;
    while ((rc = kb_rpc_call_read(call, &ateenv__v1alpha__process_output__descriptor, &m)) == 1) {
        Ateenv__V1alpha__ProcessOutput *o = (Ateenv__V1alpha__ProcessOutput *)m;
        int code;
        if (o->output_case == ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDOUT ||
            o->output_case == ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDERR) {
            bool err = o->output_case == ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_STDERR;
            s_output(w, err, err ? &o->stderr : &o->stdout);
        } else if (o->output_case == ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_EXIT &&
                   s_finished(w, o->exit, &code)) {
            protobuf_c_message_free_unpacked(m, NULL);
            kb_rpc_call_destroy(&call);
            return code;
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    /* Ended without an exit message: either the call failed or the server closed early. */
    return s_stream_ended(w, &call, rc);
}

/* A start that failed with st: the error, and the hint when it may have started anyway. */
static int s_start_failed(kb_cli_t *cli, const char *sandbox_id, const kb_rpc_status_t *st)
{
    char cause[KB_RPC_MSG_CAP + 64];
    kb_cli_cause(st, cause, sizeof cause);
    return kb_cli_fail(
        cli, "start process in sandbox %s: %s%s", sandbox_id,
        kb_rpc_outcome_unknown(st) ? "command may have started; do not blindly retry: " : "",
        cause);
}

#define S_NO_PROCESS_ID "start returned no process ID; command may have started"
#define S_EXEC_METHOD   "/kagent.api.v1.ProcessService/Exec"

/* exec in one call (Exec): started, output, exit. Returns the CLI's exit code; sets *fallback
 * (and prints nothing) when the server has no Exec, which started nothing. */
static int s_exec_stream(kb_cli_t *cli, kb_rpc_t *rpc, const char *sandbox_id,
                         const Ateenv__V1alpha__StartProcessRequest *req, bool *fallback)
{
    kb_rpc_status_t st;
    s_wait_t w = {.cli = cli, .sandbox_id = sandbox_id};
    ProtobufCMessage *started = NULL; /* kept: w.process_id points into it */
    kb_rpc_call_t *call = kb_rpc_server_stream(rpc, S_EXEC_METHOD, sandbox_id, &req->base, &st);
    ProtobufCMessage *m = NULL;
    int rc = -EIO, code = -1;
    while (code < 0 && call &&
           (rc = kb_rpc_call_read(call, &kagent__api__v1__exec_response__descriptor, &m)) == 1) {
        Kagent__Api__V1__ExecResponse *r = (Kagent__Api__V1__ExecResponse *)m;
        if (!started) { /* nothing comes before the process but its start */
            if (r->msg_case == KAGENT__API__V1__EXEC_RESPONSE__MSG_STARTED && r->started &&
                r->started->process_id[0]) {
                started = m;
                m = NULL;
                w.process_id = r->started->process_id;
                s_event(&w, "started", NULL, NULL, NULL);
            }
        } else if (r->msg_case == KAGENT__API__V1__EXEC_RESPONSE__MSG_STDOUT ||
                   r->msg_case == KAGENT__API__V1__EXEC_RESPONSE__MSG_STDERR) {
            bool err = r->msg_case == KAGENT__API__V1__EXEC_RESPONSE__MSG_STDERR;
            s_output(&w, err, err ? &r->stderr : &r->stdout);
        } else if (r->msg_case == KAGENT__API__V1__EXEC_RESPONSE__MSG_EXIT &&
                   s_finished(&w, r->exit, &code)) {
            kb_rpc_call_destroy(&call);
        }
        if (m)
            protobuf_c_message_free_unpacked(m, NULL);
    }
    if (code < 0 && started) {
        code = s_stream_ended(&w, &call, rc);
    } else if (code < 0) {
        int frc = call ? kb_rpc_call_finish(call, NULL, NULL, &st) : -EIO;
        kb_rpc_call_destroy(&call);
        *fallback = frc != 0 && st.code == KB_RPC_UNIMPLEMENTED;
        code = frc == 0    ? kb_cli_fail(cli, S_NO_PROCESS_ID)
               : *fallback ? KB_EXIT_OK
                           : s_start_failed(cli, sandbox_id, &st);
    }
    if (started)
        protobuf_c_message_free_unpacked(started, NULL);
    return code;
}

/* ------------------------------------------------------------------------------------------ */

static int s_run_exec(kb_cli_t *cli, const kb_args_t *a)
{
    if (a->dash_at != 1 || a->npos < 2)
        return kb_cli_usage(cli, "separate the sandbox ID and command with --");
    const char *sandbox_id = a->pos[0];
    Ateenv__V1alpha__StartProcessRequest req = ATEENV__V1ALPHA__START_PROCESS_REQUEST__INIT;
    req.n_command = (size_t)(a->npos - 1);
    req.command = (char **)&a->pos[1];
    req.cwd = (char *)kb_args_str(a, "cwd");
    Ateenv__V1alpha__StartProcessRequest__EnvEntry ents[KB_MAX_LIST];
    Ateenv__V1alpha__StartProcessRequest__EnvEntry *entp[KB_MAX_LIST];
    char *keys[KB_MAX_LIST];
    size_t n_env = 0;
    for (int i = 0; i < a->nlist; i++) {
        const char *kv = a->list[i];
        const char *eq = strchr(kv, '=');
        keys[n_env] = strndup(kv, (size_t)(eq - kv));
        ateenv__v1alpha__start_process_request__env_entry__init(&ents[n_env]);
        ents[n_env].key = keys[n_env];
        ents[n_env].value = (char *)(eq + 1);
        entp[n_env] = &ents[n_env];
        n_env++;
    }
    req.n_env = n_env;
    req.env = entp;
    bool wait = kb_args_bool(a, "wait");
    int rc;
    if (kb_args_bool(a, "stdin") || kb_args_bool(a, "tty")) {
        kb_terminal_opts_t o = {.sandbox_id = sandbox_id,
                                .process = &req,
                                .stdin_open = kb_args_bool(a, "stdin"),
                                .tty = kb_args_bool(a, "tty"),
                                .timeout_given = kb_args_given(a, "timeout")};
        rc = kb_terminal_run(cli, &o);
        goto out;
    }
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc) {
        rc = KB_EXIT_ERROR;
        goto out;
    }
    bool fallback = false;
    if (wait) {
        rc = s_exec_stream(cli, rpc, sandbox_id, &req, &fallback);
        if (!fallback)
            goto out;
    }
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/ateenv.v1alpha.ProcessService/StartProcess", sandbox_id, &req.base,
                     &ateenv__v1alpha__start_process_response__descriptor, &resp, &st) != 0) {
        rc = s_start_failed(cli, sandbox_id, &st);
        goto out;
    }
    Ateenv__V1alpha__StartProcessResponse *r = (Ateenv__V1alpha__StartProcessResponse *)resp;
    if (!r->process || !r->process->process_id[0]) {
        protobuf_c_message_free_unpacked(resp, NULL);
        rc = kb_cli_fail(cli, S_NO_PROCESS_ID);
        goto out;
    }
    s_wait_t w = {.cli = cli, .sandbox_id = sandbox_id, .process_id = r->process->process_id};
    s_event(&w, "started", NULL, NULL, NULL);
    rc = wait ? s_follow(&w, rpc) : KB_EXIT_OK;
    protobuf_c_message_free_unpacked(resp, NULL);
out:
    for (size_t i = 0; i < n_env; i++)
        free(keys[i]);
    return rc;
}

static const kb_flag_t s_exec_flags[] = {
    {"cwd", 0, KB_F_STRING, S_DEFAULT_CWD, "working directory", "string"},
    {"env", 0, KB_F_STRMAP, NULL, "environment KEY=VALUE (repeatable or comma-separated)",
     "stringToString"},
    {"wait", 0, KB_F_BOOL, "true", "wait for completion and return the process exit code", NULL},
    {"stdin", 'i', KB_F_BOOL, NULL, "pass standard input to the process (EOF too)", NULL},
    {"tty", 't', KB_F_BOOL, NULL, "run on a terminal: the local one raw, resized with it", NULL},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_exec = {
    .name = "exec",
    .use = "exec ID -- COMMAND [ARG...]",
    .short_help = "Start a command once and wait for its result",
    .long_help = "Start a command once and wait for its result.\n\nThe command is started "
                 "exactly once and never retried. --timeout only stops the waiting: the remote "
                 "process keeps running; continue with `kagent sandbox wait`.",
    .flags = s_exec_flags,
    .min_args = 0, /* checked by the run function for the separator message */
    .max_args = -1,
    .run = s_run_exec,
};

/* ------------------------------------------------------------------------------------------ */

static int s_run_wait(kb_cli_t *cli, const kb_args_t *a)
{
    int64_t so = kb_args_int(a, "stdout-offset"), eo = kb_args_int(a, "stderr-offset");
    if (so < 0 || eo < 0)
        return kb_cli_usage(cli, "output offsets must be nonnegative");
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    if (kb_args_bool(a, "stdin") || kb_args_bool(a, "tty")) {
        kb_terminal_opts_t o = {.sandbox_id = a->pos[0],
                                .process_id = a->pos[1],
                                .stdout_offset = so,
                                .stderr_offset = eo,
                                .stdin_open = kb_args_bool(a, "stdin"),
                                .tty = kb_args_bool(a, "tty"),
                                .timeout_given = kb_args_given(a, "timeout")};
        return kb_terminal_run(cli, &o);
    }
    s_wait_t w = {
        .cli = cli, .sandbox_id = a->pos[0], .process_id = a->pos[1], .out_off = so, .err_off = eo};
    return s_follow(&w, rpc);
}

static const kb_flag_t s_wait_flags[] = {
    {"stdout-offset", 0, KB_F_INT, "0", "stdout byte offset to resume from", "int"},
    {"stderr-offset", 0, KB_F_INT, "0", "stderr byte offset to resume from", "int"},
    {"stdin", 'i', KB_F_BOOL, NULL, "attach: pass standard input to the process", NULL},
    {"tty", 't', KB_F_BOOL, NULL, "attach to a terminal process: the local terminal raw", NULL},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_wait = {
    .name = "wait",
    .use = "wait ID PROCESS_ID",
    .short_help = "Collect output and wait for an existing process without restarting it",
    .flags = s_wait_flags,
    .min_args = 2,
    .max_args = 2,
    .run = s_run_wait,
};

/* ------------------------------------------------------------------------------------------ */

static int s_run_process(kb_cli_t *cli, const kb_args_t *a)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Ateenv__V1alpha__GetProcessRequest req = ATEENV__V1ALPHA__GET_PROCESS_REQUEST__INIT;
    req.process_id = (char *)a->pos[1];
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/ateenv.v1alpha.ProcessService/GetProcess", a->pos[0], &req.base,
                     &ateenv__v1alpha__get_process_response__descriptor, &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "get process %s in sandbox %s: %s", a->pos[1], a->pos[0], cause);
    }
    Ateenv__V1alpha__Process *p = ((Ateenv__V1alpha__GetProcessResponse *)resp)->process;
    int rc = KB_EXIT_OK;
    if (!p)
        rc = kb_cli_fail(cli, "server returned no process");
    else if (cli->json)
        rc = kb_cli_print(cli, &p->base);
    else
        kb_print_process(cli->out, p);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

const kb_cmd_t kb_cmd_sandbox_process = {
    .name = "process",
    .use = "process ID PROCESS_ID",
    .short_help = "Inspect process status without waiting",
    .min_args = 2,
    .max_args = 2,
    .run = s_run_process,
};

/* ------------------------------------------------------------------------------------------ */

/* Waits for the killed process's exit (a follow stream from past the end delivers only the
 * exit message). Returns the exited Process (caller frees the returned message), or NULL. */
static ProtobufCMessage *s_await_exit(kb_rpc_t *rpc, const char *sandbox_id, const char *pid,
                                      Ateenv__V1alpha__Process **exited)
{
    Ateenv__V1alpha__StreamProcessOutputRequest req =
        ATEENV__V1ALPHA__STREAM_PROCESS_OUTPUT_REQUEST__INIT;
    req.process_id = (char *)pid;
    req.stdout_offset = INT64_MAX;
    req.stderr_offset = INT64_MAX;
    req.follow = true;
    kb_rpc_status_t st;
    kb_rpc_call_t *call = kb_rpc_server_stream(
        rpc, "/ateenv.v1alpha.ProcessService/StreamProcessOutput", sandbox_id, &req.base, &st);
    ProtobufCMessage *m = NULL;
    while (call && kb_rpc_call_read(call, &ateenv__v1alpha__process_output__descriptor, &m) == 1) {
        Ateenv__V1alpha__ProcessOutput *o = (Ateenv__V1alpha__ProcessOutput *)m;
        if (o->output_case == ATEENV__V1ALPHA__PROCESS_OUTPUT__OUTPUT_EXIT && o->exit &&
            o->exit->state == ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED) {
            *exited = o->exit;
            kb_rpc_call_destroy(&call);
            return m;
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    kb_rpc_call_destroy(&call);
    return NULL;
}

static int s_run_kill(kb_cli_t *cli, const kb_args_t *a)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Ateenv__V1alpha__SignalProcessRequest req = ATEENV__V1ALPHA__SIGNAL_PROCESS_REQUEST__INIT;
    req.process_id = (char *)a->pos[1];
    req.signal = ATEENV__V1ALPHA__SIGNAL__SIGNAL_KILL;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, "/ateenv.v1alpha.ProcessService/SignalProcess", a->pos[0], &req.base,
                     &ateenv__v1alpha__signal_process_response__descriptor, &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "kill process %s in sandbox %s: %s", a->pos[1], a->pos[0], cause);
    }
    Ateenv__V1alpha__SignalProcessResponse *r = (Ateenv__V1alpha__SignalProcessResponse *)resp;
    if (!r->process) {
        protobuf_c_message_free_unpacked(resp, NULL);
        return kb_cli_fail(cli, "server returned no process");
    }
    /* The signal is delivered; the exit code exists once the group is reaped. */
    ProtobufCMessage *exit_msg = NULL;
    Ateenv__V1alpha__Process *orig = r->process, *final = r->process, *exited = NULL;
    if (final->state == ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING) {
        exit_msg = s_await_exit(rpc, a->pos[0], a->pos[1], &exited);
        if (exited) {
            r->process = exited; /* print the final state; orig is restored below */
            final = exited;
        }
    }
    int rc = KB_EXIT_OK;
    if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        kb_table_t *t = kb_table_new(2);
        char code[32];
        if (final->state == ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED)
            snprintf(code, sizeof code, "exit_code=%d", (int) final->exit_code);
        else
            snprintf(code, sizeof code, "%s", s_state_name((int) final->state));
        const char *row[] = {final->process_id, code};
        if (t) {
            kb_table_add(t, row);
            kb_table_print(t, cli->out);
            kb_table_destroy(&t);
        }
    }
    r->process = orig; /* exited stays owned by exit_msg */
    if (exit_msg)
        protobuf_c_message_free_unpacked(exit_msg, NULL);
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

const kb_cmd_t kb_cmd_sandbox_kill = {
    .name = "kill",
    .use = "kill ID PROCESS_ID",
    .short_help = "Terminate a process and its children",
    .min_args = 2,
    .max_args = 2,
    .run = s_run_kill,
};
