/*
 * What a terminal session shares with ProcessService: the Process message from a guest frame,
 * a process id, and a StartProcessRequest as exec arguments and as its guest start request
 * (checked by the service layer, ka_svc_exec_req).
 */
#include "api_int.h"
#include "checks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kb_api_process(kb_api_process_t *out, const ka_svc_process_t *sp)
{
    memset(out, 0, sizeof *out);
    ateenv__v1alpha__process__init(&out->p);
    const ka_process_info_t *i = &sp->info;
    snprintf(out->id, sizeof out->id, "%llu", (unsigned long long)i->proc);
    out->p.process_id = out->id;
    out->p.pid = i->pid;
    out->p.state = i->state == 2 ? ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_EXITED
                                 : ATEENV__V1ALPHA__PROCESS_STATE__PROCESS_STATE_RUNNING;
    out->p.exit_code = i->exit_code;
    if (i->started_ms) {
        kb_api_ts(&out->started, i->started_ms);
        out->p.started_at = &out->started;
    }
    if (i->finished_ms) {
        kb_api_ts(&out->finished, i->finished_ms);
        out->p.finished_at = &out->finished;
    }
    size_t n = 0;
    for (size_t k = 0; k < sp->argv_len; k++)
        n += sp->argv[k] == '\0';
    out->argv = n ? calloc(n, sizeof *out->argv) : NULL;
    const char *s = sp->argv;
    for (size_t k = 0; out->argv && k < n; k++) {
        out->argv[k] = (char *)s;
        s += strlen(s) + 1;
    }
    out->p.n_command = out->argv ? n : 0;
    out->p.command = out->argv;
}

int kb_api_proc_id(const char *s, uint64_t *out)
{
    return ka_check_process_id(s, out) || *out == 0 ? -1 : 0;
}

ka_svc_status_t kb_api_exec_args(const Ateenv__V1alpha__StartProcessRequest *req,
                                 const char *sandbox, ka_svc_exec_args_t *a, ka_svc_env_t **env)
{
    *env = req->n_env ? calloc(req->n_env, sizeof **env) : NULL;
    if (req->n_env && !*env)
        return (ka_svc_status_t){-ENOMEM, "out of memory"};
    for (size_t i = 0; i < req->n_env; i++)
        (*env)[i] = (ka_svc_env_t){req->env[i]->key, req->env[i]->value};
    *a = (ka_svc_exec_args_t){.sandbox_id = sandbox,
                              .argv = (const char *const *)req->command,
                              .argc = req->n_command,
                              .env = *env,
                              .n_env = req->n_env,
                              .cwd = req->cwd,
                              .stdin_open = req->stdin};
    if (req->timeout)
        a->timeout_ms = (uint64_t)(req->timeout->seconds * 1000 + req->timeout->nanos / 1000000);
    return (ka_svc_status_t){0, NULL};
}

ka_guest_req_t *kb_api_start_req(const Ateenv__V1alpha__StartProcessRequest *req,
                                 const char *caller, const char *sandbox, const char **why)
{
    ka_svc_exec_args_t a;
    ka_svc_env_t *env;
    ka_svc_status_t st = kb_api_exec_args(req, sandbox, &a, &env);
    ka_svc_caller_t who = {caller, 0};
    ka_guest_req_t *q = st.err ? NULL : ka_svc_exec_req(&who, &a, &st);
    free(env);
    *why = st.err == -EINVAL ? st.message : NULL;
    return q;
}
