/*
 * Files API commands (kagent.files.v1.FilesService): ls, stat, rm, mkdir, mv and watch. ls reads
 * every page; watch prints one event per line until Ctrl-C (or --timeout).
 */
#include "cli_int.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kagent/files/v1/files.pb-c.h"
#include "pbjson.h"

#define S_SVC       "/kagent.files.v1.FilesService/"
#define S_CANCELLED 1 /* gRPC status code */

/* A unary call; on failure prints "<what> <path>: <cause>" and returns NULL. */
static ProtobufCMessage *s_call(kb_cli_t *cli, const char *method, const char *sandbox_id,
                                const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                                const char *what, const char *path)
{
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return NULL;
    ProtobufCMessage *resp = NULL;
    kb_rpc_status_t st;
    if (kb_rpc_unary(rpc, method, sandbox_id, req, desc, &resp, &st) != 0) {
        char cause[KB_RPC_MSG_CAP + 64];
        kb_cli_cause(&st, cause, sizeof cause);
        kb_cli_fail(cli, "%s %s: %s", what, path, cause);
        return NULL;
    }
    return resp;
}

static const char *s_type(Kagent__Files__V1__FileType t)
{
    switch (t) {
    case KAGENT__FILES__V1__FILE_TYPE__FILE_TYPE_FILE:
        return "file";
    case KAGENT__FILES__V1__FILE_TYPE__FILE_TYPE_DIRECTORY:
        return "dir";
    case KAGENT__FILES__V1__FILE_TYPE__FILE_TYPE_SYMLINK:
        return "symlink";
    default:
        return "other";
    }
}

/* ---- ls ------------------------------------------------------------------------------------ */

/* Prints a page of entries: names, or with long a row each. */
static void s_print_entries(kb_cli_t *cli, Kagent__Files__V1__FileInfo *const *e, size_t n,
                            bool long_)
{
    for (size_t i = 0; i < n; i++) {
        if (!long_) {
            fprintf(cli->out, "%s%s\n", e[i]->name,
                    e[i]->type == KAGENT__FILES__V1__FILE_TYPE__FILE_TYPE_DIRECTORY ? "/" : "");
            continue;
        }
        char when[64];
        kb_fmt_time(e[i]->modified_at ? &e[i]->modified_at->base : NULL, when, sizeof when);
        fprintf(cli->out, "%-7s %04o %12lld %-24s %s\n", s_type(e[i]->type), e[i]->mode,
                (long long)e[i]->size, when, e[i]->name);
    }
}

static int s_run_ls(kb_cli_t *cli, const kb_args_t *a)
{
    const char *id = a->pos[0], *path = a->npos > 1 ? a->pos[1] : "";
    bool long_ = kb_args_bool(a, "long");
    json_t *all = cli->json ? json_array() : NULL;
    char *token = strdup("");
    int rc = KB_EXIT_OK;
    while (token) {
        Kagent__Files__V1__ListFilesRequest req = KAGENT__FILES__V1__LIST_FILES_REQUEST__INIT;
        req.path = (char *)path;
        req.page_size = 1000;
        req.page_token = token;
        ProtobufCMessage *resp =
            s_call(cli, S_SVC "ListFiles", id, &req.base,
                   &kagent__files__v1__list_files_response__descriptor, "ls", path[0] ? path : ".");
        free(token);
        token = NULL;
        if (!resp) {
            rc = KB_EXIT_ERROR;
            break;
        }
        Kagent__Files__V1__ListFilesResponse *r = (void *)resp;
        for (size_t i = 0; all && i < r->n_entries; i++)
            json_array_append_new(all, kb_pbjson_to_json(&r->entries[i]->base, 0));
        if (!all)
            s_print_entries(cli, r->entries, r->n_entries, long_);
        if (r->next_page_token[0])
            token = strdup(r->next_page_token);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    if (all && rc == KB_EXIT_OK) {
        json_t *doc = json_pack("{s:O}", "entries", all);
        rc = doc ? kb_cli_print_json(cli, doc) : kb_cli_fail(cli, "out of memory");
        json_decref(doc);
    }
    json_decref(all);
    return rc;
}

static const kb_flag_t s_ls_flags[] = {
    {"long", 'l', KB_F_BOOL, NULL, "one row per entry: type, mode, size, modified, name", NULL},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_ls = {
    .name = "ls",
    .use = "ls ID [PATH]",
    .short_help = "List a directory in a sandbox (default /data/workspace)",
    .long_help = "List a directory in a sandbox, in name order (every page). PATH is absolute "
                 "inside /data/workspace or relative to it; a symlink is listed as itself "
                 "unless PATH ends with '/'.",
    .flags = s_ls_flags,
    .min_args = 1,
    .max_args = 2,
    .run = s_run_ls,
};

/* ---- stat ---------------------------------------------------------------------------------- */

static int s_run_stat(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Files__V1__StatFileRequest req = KAGENT__FILES__V1__STAT_FILE_REQUEST__INIT;
    req.path = (char *)a->pos[1];
    ProtobufCMessage *resp =
        s_call(cli, S_SVC "StatFile", a->pos[0], &req.base,
               &kagent__files__v1__stat_file_response__descriptor, "stat", a->pos[1]);
    if (!resp)
        return KB_EXIT_ERROR;
    Kagent__Files__V1__FileInfo *fi = ((Kagent__Files__V1__StatFileResponse *)resp)->info;
    int rc = KB_EXIT_OK;
    if (!fi) {
        rc = kb_cli_fail(cli, "stat %s: the server sent no file info", a->pos[1]);
    } else if (cli->json) {
        rc = kb_cli_print(cli, &fi->base);
    } else {
        char when[64];
        kb_fmt_time(fi->modified_at ? &fi->modified_at->base : NULL, when, sizeof when);
        fprintf(cli->out,
                "Name:     %s\nType:     %s\nSize:     %lld\nMode:     %04o\n"
                "Modified: %s\n",
                fi->name, s_type(fi->type), (long long)fi->size, fi->mode, when);
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

const kb_cmd_t kb_cmd_sandbox_stat = {
    .name = "stat",
    .use = "stat ID PATH",
    .short_help = "Show a file's type, size, mode and modification time (links not followed)",
    .min_args = 2,
    .max_args = 2,
    .run = s_run_stat,
};

/* ---- rm, mkdir, mv: nothing to print but -o's confirmation ---------------------------------- */

/* Runs a call with an empty response; -o prints doc (stolen). */
static int s_change(kb_cli_t *cli, const char *method, const char *id, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *desc, const char *what, const char *path,
                    json_t *doc)
{
    ProtobufCMessage *resp = s_call(cli, method, id, req, desc, what, path);
    int rc = resp ? KB_EXIT_OK : KB_EXIT_ERROR;
    if (resp && cli->json)
        rc = doc ? kb_cli_print_json(cli, doc) : kb_cli_fail(cli, "out of memory");
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    json_decref(doc);
    return rc;
}

static int s_run_rm(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Files__V1__RemoveFileRequest req = KAGENT__FILES__V1__REMOVE_FILE_REQUEST__INIT;
    req.path = (char *)a->pos[1];
    req.recursive = kb_args_bool(a, "recursive");
    return s_change(cli, S_SVC "RemoveFile", a->pos[0], &req.base,
                    &kagent__files__v1__remove_file_response__descriptor, "rm", a->pos[1],
                    json_pack("{s:s}", "removed", a->pos[1]));
}

static const kb_flag_t s_rm_flags[] = {
    {"recursive", 'r', KB_F_BOOL, NULL, "remove a directory and everything in it", NULL},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_rm = {
    .name = "rm",
    .use = "rm ID PATH",
    .short_help = "Remove a file, a symlink or an empty directory (-r: any directory)",
    .long_help = "Remove a file, a symlink (never its target) or an empty directory; -r removes a "
                 "directory with everything in it. The workspace itself cannot be removed.",
    .flags = s_rm_flags,
    .min_args = 2,
    .max_args = 2,
    .run = s_run_rm,
};

static int s_run_mkdir(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Files__V1__MakeDirectoryRequest req = KAGENT__FILES__V1__MAKE_DIRECTORY_REQUEST__INIT;
    req.path = (char *)a->pos[1];
    req.parents = kb_args_bool(a, "parents");
    req.mode = (uint32_t)kb_args_int(a, "mode");
    return s_change(cli, S_SVC "MakeDirectory", a->pos[0], &req.base,
                    &kagent__files__v1__make_directory_response__descriptor, "mkdir", a->pos[1],
                    json_pack("{s:s}", "created", a->pos[1]));
}

static const kb_flag_t s_mkdir_flags[] = {
    {"parents", 'p', KB_F_BOOL, NULL, "create missing parents; an existing directory is no error",
     NULL},
    {"mode", 0, KB_F_UINT32, NULL, "Unix mode, e.g. 0700 (default 0755)", "uint32"},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_mkdir = {
    .name = "mkdir",
    .use = "mkdir ID PATH",
    .short_help = "Make a directory in a sandbox",
    .flags = s_mkdir_flags,
    .min_args = 2,
    .max_args = 2,
    .run = s_run_mkdir,
};

static int s_run_mv(kb_cli_t *cli, const kb_args_t *a)
{
    Kagent__Files__V1__MoveFileRequest req = KAGENT__FILES__V1__MOVE_FILE_REQUEST__INIT;
    req.source = (char *)a->pos[1];
    req.destination = (char *)a->pos[2];
    req.overwrite = kb_args_bool(a, "force");
    return s_change(cli, S_SVC "MoveFile", a->pos[0], &req.base,
                    &kagent__files__v1__move_file_response__descriptor, "mv", a->pos[1],
                    json_pack("{s:s,s:s}", "source", a->pos[1], "destination", a->pos[2]));
}

static const kb_flag_t s_mv_flags[] = {
    {"force", 'f', KB_F_BOOL, NULL, "replace an existing destination", NULL},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_mv = {
    .name = "mv",
    .use = "mv ID SRC DST",
    .short_help = "Rename a file or directory in a sandbox (-f: replace DST)",
    .flags = s_mv_flags,
    .min_args = 3,
    .max_args = 3,
    .run = s_run_mv,
};

/* ---- watch --------------------------------------------------------------------------------- */

static void s_print_event(kb_cli_t *cli, const Kagent__Files__V1__FileEvent *e)
{
    static const char *const names[] = {"UNKNOWN", "CREATE", "MODIFY",
                                        "DELETE",  "MOVE",   "OVERFLOW"};
    if (cli->json) {
        json_t *j = kb_pbjson_to_json(&e->base, 0);
        if (j)
            kb_out_json_line(cli->out, j);
        json_decref(j);
    } else {
        size_t t = (size_t)e->type < sizeof names / sizeof names[0] ? (size_t)e->type : 0;
        const char *slash = e->is_directory ? "/" : "";
        if (e->type == KAGENT__FILES__V1__FILE_EVENT_TYPE__FILE_EVENT_TYPE_MOVE)
            fprintf(cli->out, "%s %s%s -> %s%s\n", names[t], e->from_path, slash, e->path, slash);
        else if (e->type == KAGENT__FILES__V1__FILE_EVENT_TYPE__FILE_EVENT_TYPE_OVERFLOW)
            fprintf(cli->out, "%s events were lost\n", names[t]);
        else
            fprintf(cli->out, "%s %s%s\n", names[t], e->path, slash);
    }
    fflush(cli->out);
}

static int s_run_watch(kb_cli_t *cli, const kb_args_t *a)
{
    const char *path = a->npos > 1 ? a->pos[1] : "";
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    Kagent__Files__V1__WatchFilesRequest req = KAGENT__FILES__V1__WATCH_FILES_REQUEST__INIT;
    req.path = (char *)path;
    kb_rpc_status_t st;
    kb_rpc_call_t *call = kb_rpc_server_stream(rpc, S_SVC "WatchFiles", a->pos[0], &req.base, &st);
    ProtobufCMessage *m = NULL;
    while (call && kb_rpc_call_read(call, &kagent__files__v1__file_event__descriptor, &m) == 1) {
        s_print_event(cli, (Kagent__Files__V1__FileEvent *)m);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    if (call) {
        kb_rpc_call_finish(call, NULL, NULL, &st);
        kb_rpc_call_destroy(&call);
    }
    if (st.code == 0 || st.code == S_CANCELLED) /* Ctrl-C ends a watch */
        return KB_EXIT_OK;
    char cause[KB_RPC_MSG_CAP + 64];
    kb_cli_cause(&st, cause, sizeof cause);
    return kb_cli_fail(cli, "watch %s: %s", path[0] ? path : ".", cause);
}

const kb_cmd_t kb_cmd_sandbox_watch = {
    .name = "watch",
    .use = "watch ID [PATH]",
    .short_help = "Print file events under a directory, one per line, until Ctrl-C",
    .long_help = "Print create, modify, delete and move events under a directory (default "
                 "/data/workspace), one per line, until Ctrl-C or --timeout. Directories created "
                 "later are watched too. OVERFLOW means events were lost (the watch goes on). At "
                 "most 8 watches per sandbox.",
    .min_args = 1,
    .max_args = 2,
    .run = s_run_watch,
};
