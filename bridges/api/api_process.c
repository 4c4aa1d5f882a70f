/*
 * What a terminal session shares with ProcessService: the Process message from a guest frame,
 * a process id, and the guest start request of a StartProcessRequest (checked with the service
 * layer's rules, actors/control/checks.c).
 */
#include "api_int.h"
#include "checks.h"

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

ka_guest_req_t *kb_api_start_req(const Ateenv__V1alpha__StartProcessRequest *req,
                                 const char *caller, const char *sandbox, const char **why)
{
    size_t tail = 0;
    *why = ka_check_command(req->n_command, req->n_command ? req->command[0] : NULL);
    if (!*why)
        *why = ka_check_cwd(req->cwd);
    for (size_t i = 0; !*why && i < req->n_command; i++)
        tail += strlen(req->command[i]) + 1;
    for (size_t i = 0; !*why && i < req->n_env; i++) {
        *why = ka_check_env_key(req->env[i]->key);
        tail += strlen(req->env[i]->key) + strlen(req->env[i]->value) + 2;
    }
    if (!*why)
        *why = ka_check_start_size(tail);
    if (*why)
        return NULL;
    ka_guest_req_t *q = ka_guest_req_new(caller, sandbox, KA_GUEST_START, tail);
    if (!q)
        return NULL;
    char *p = q->tail;
    for (size_t i = 0; i < req->n_command; i++)
        p = stpcpy(p, req->command[i]) + 1;
    for (size_t i = 0; i < req->n_env; i++)
        p += sprintf(p, "%s=%s", req->env[i]->key, req->env[i]->value) + 1;
    q->n_argv = (uint32_t)req->n_command;
    q->n_env = (uint32_t)req->n_env;
    snprintf(q->cwd, sizeof q->cwd, "%s", req->cwd);
    q->stdin_open = req->stdin;
    if (req->timeout)
        q->timeout_ms = (uint64_t)(req->timeout->seconds * 1000 + req->timeout->nanos / 1000000);
    return q;
}
