/*
 * The Files API as MCP tools: list_sandbox_files, stat_sandbox_file, remove_sandbox_file,
 * make_sandbox_directory, move_sandbox_file. The same service calls and the same argument
 * checks (checks.h) as kagent.files.v1 over gRPC; watching stays gRPC and CLI only (a tool
 * call is one request and one result).
 */
#include "checks.h"
#include "ka_fsframes.h"
#include "mcp_int.h"

#include <stdlib.h>
#include <string.h>

#include "control_msgs.h"

static const char *f_str(const json_t *args, const char *key)
{
    const char *v = json_string_value(json_object_get(args, key));
    return v ? v : "";
}

static long long f_int(const json_t *args, const char *key)
{
    return (long long)json_integer_value(json_object_get(args, key));
}

static bool f_bool(const json_t *args, const char *key)
{
    return json_is_true(json_object_get(args, key));
}

static const char *f_type_name(uint32_t t)
{
    static const char *const names[] = {"other", "file", "directory", "symlink", "other"};
    return t < sizeof names / sizeof names[0] ? names[t] : "other";
}

static json_t *f_entry(const ka_fs_entry_t *e)
{
    char ts[64];
    kb_mcp_rfc3339(e->mtime_ms, ts, sizeof ts);
    return json_pack("{s:s,s:s,s:I,s:i,s:s}", "name", e->name, "type", f_type_name(e->type), "size",
                     (json_int_t)e->size, "mode", (int)e->mode, "modified_at", ts);
}

/* A guest request of op for path (and a tail string), after the shared checks; NULL with
 * *err (a result) set. */
static ka_guest_req_t *f_req(kb_mcp_call_t *c, json_t *args, int op, const char *path,
                             const char *tail, const char *why, json_t **err)
{
    if (why) {
        *err = kb_mcp_error(KA_INVALID_ARGUMENT, why);
        return NULL;
    }
    size_t tn = tail[0] ? strlen(tail) + 1 : 0;
    ka_guest_req_t *q = kb_mcp_guest_req(c, args, op, tn, err);
    if (q) {
        snprintf(q->path, sizeof q->path, "%s", path);
        memcpy(q->tail, tail, tn);
    }
    return q;
}

/* Runs a call whose success carries a page; NULL with *res (a result) set on failure. */
static ka_fs_page_t *f_paged(kb_mcp_call_t *c, ka_guest_req_t *q, json_t **res)
{
    ka_guest_reply_t fin;
    ka_frame_end_t end;
    void *tail = NULL;
    if (kb_mcp_guest_call(c, q, &fin, &end, &tail) != KA_OK) {
        free(tail);
        *res = kb_mcp_status_error(&end);
        return NULL;
    }
    ka_fs_page_t *pg = tail;
    if (!pg || fin.tail_len < sizeof *pg ||
        fin.tail_len != sizeof *pg + (size_t)pg->count * sizeof pg->entries[0]) {
        free(tail);
        *res = kb_mcp_error(KA_INTERNAL, "a malformed reply from the sandbox");
        return NULL;
    }
    return pg;
}

static json_t *t_files_list(kb_mcp_call_t *c, json_t *args)
{
    const char *path = f_str(args, "path"), *token = f_str(args, "page_token");
    const char *why = ka_check_fs_path(path, 0);
    why = why ? why : ka_check_page_size(f_int(args, "page_size"));
    why = why ? why : ka_check_fs_page_token(token);
    json_t *res = NULL;
    ka_guest_req_t *q = f_req(c, args, KA_GUEST_LIST, path, token, why, &res);
    if (!q)
        return res;
    q->page_size = (uint32_t)f_int(args, "page_size");
    ka_fs_page_t *pg = f_paged(c, q, &res);
    if (!pg)
        return res;
    json_t *entries = json_array();
    for (uint32_t i = 0; entries && i < pg->count; i++)
        json_array_append_new(entries, f_entry(&pg->entries[i]));
    const char *next = pg->more && pg->count ? pg->entries[pg->count - 1].name : "";
    res = kb_mcp_ok(c, json_pack("{s:o,s:s}", "entries", entries, "next_page_token", next));
    free(pg);
    return res;
}

static json_t *t_files_stat(kb_mcp_call_t *c, json_t *args)
{
    const char *path = f_str(args, "path");
    json_t *res = NULL;
    ka_guest_req_t *q = f_req(c, args, KA_GUEST_STAT, path, "", ka_check_fs_path(path, 0), &res);
    ka_fs_page_t *pg = q ? f_paged(c, q, &res) : NULL;
    if (!pg)
        return res;
    res = pg->count == 1 ? kb_mcp_ok(c, f_entry(&pg->entries[0]))
                         : kb_mcp_error(KA_INTERNAL, "a malformed reply from the sandbox");
    free(pg);
    return res;
}

/* A call whose success carries nothing: the result is obj (stolen). */
static json_t *f_change(kb_mcp_call_t *c, ka_guest_req_t *q, json_t *obj)
{
    ka_guest_reply_t fin;
    ka_frame_end_t end;
    if (kb_mcp_guest_call(c, q, &fin, &end, NULL) != KA_OK) {
        json_decref(obj);
        return kb_mcp_status_error(&end);
    }
    return kb_mcp_ok(c, obj);
}

static json_t *t_files_remove(kb_mcp_call_t *c, json_t *args)
{
    const char *path = f_str(args, "path");
    json_t *res = NULL;
    ka_guest_req_t *q = f_req(c, args, KA_GUEST_REMOVE, path, "", ka_check_fs_path(path, 1), &res);
    if (!q)
        return res;
    q->fs_flag = f_bool(args, "recursive");
    return f_change(c, q, json_pack("{s:s}", "removed", path));
}

static json_t *t_files_mkdir(kb_mcp_call_t *c, json_t *args)
{
    const char *path = f_str(args, "path");
    const char *why = ka_check_fs_path(path, 1);
    why = why ? why : ka_check_fs_mode(f_int(args, "mode"));
    json_t *res = NULL;
    ka_guest_req_t *q = f_req(c, args, KA_GUEST_MKDIR, path, "", why, &res);
    if (!q)
        return res;
    q->fs_flag = f_bool(args, "parents");
    q->mode = (uint32_t)f_int(args, "mode");
    return f_change(c, q, json_pack("{s:s}", "created", path));
}

static json_t *t_files_move(kb_mcp_call_t *c, json_t *args)
{
    const char *src = f_str(args, "source"), *dst = f_str(args, "destination");
    const char *why = ka_check_fs_path(src, 1);
    why = why ? why : ka_check_fs_path(dst, 1);
    json_t *res = NULL;
    ka_guest_req_t *q = f_req(c, args, KA_GUEST_MOVE, src, dst, why, &res);
    if (!q)
        return res;
    q->fs_flag = f_bool(args, "overwrite");
    return f_change(c, q, json_pack("{s:s,s:s}", "source", src, "destination", dst));
}

#define F_ID                                                                                       \
    "\"sandbox_id\":{\"type\":\"string\",\"description\":\"The sandbox's id (a UUID) as "          \
    "create_sandbox or list_sandboxes returned it.\"}"
#define F_PATH(what)                                                                               \
    "\"path\":{\"type\":\"string\",\"description\":\"" what " (relative to /data/workspace, or "   \
    "absolute inside it).\"}"

const kb_mcp_tool_t kb_mcp_file_tools[KB_MCP_FILE_TOOLS_N] = {
    {"list_sandbox_files", "List a directory",
     "Lists a directory as {entries: [{name, type, size, mode, modified_at}], next_page_token}, "
     "in name order; type is file, directory, symlink or other; mode is the permission bits in "
     "decimal. At most page_size entries (default 500, at most 1000); pass next_page_token back "
     "as page_token for the next page (empty on the last).",
     "{\"type\":\"object\",\"properties\":{" F_ID
     "," F_PATH("The directory; empty or omitted = "
                "/data/workspace") ",\"page_size\":{\"type\":\"integer\",\"description\":\"Entries "
                                   "per page (0-1000; 0 = "
                                   "500).\"},"
                                   "\"page_token\":{\"type\":\"string\",\"description\":\"next_"
                                   "page_token of the previous "
                                   "page.\"}},\"required\":[\"sandbox_id\"],"
                                   "\"additionalProperties\":false}",
     t_files_list, true, false, true},
    {"stat_sandbox_file", "Stat a file",
     "Returns {name, type, size, mode, modified_at} of a path. A symbolic link is described "
     "itself, not its target.",
     "{\"type\":\"object\",\"properties\":{" F_ID
     "," F_PATH("The path; empty = /data/workspace") "},\"required\":[\"sandbox_id\",\"path\"],"
                                                     "\"additionalProperties\":false}",
     t_files_stat, true, false, true},
    {"remove_sandbox_file", "Remove a file",
     "Removes a file, a symbolic link (never its target) or an empty directory; a non-empty "
     "directory only with recursive: true. The workspace itself cannot be removed. Returns "
     "{removed}.",
     "{\"type\":\"object\",\"properties\":{" F_ID
     "," F_PATH("The path") ",\"recursive\":{\"type\":\"boolean\",\"description\":\"Remove a "
                            "directory with "
                            "everything in it.\"}},\"required\":[\"sandbox_id\",\"path\"],"
                            "\"additionalProperties\":false}",
     t_files_remove, false, true, false},
    {"make_sandbox_directory", "Make a directory",
     "Creates a directory (mode default 0755) and returns {created}. With parents: true, "
     "missing parents are created and an existing directory is no error.",
     "{\"type\":\"object\",\"properties\":{" F_ID "," F_PATH(
         "The directory") ",\"parents\":{\"type\":\"boolean\",\"description\":\"Create missing "
                          "parents too.\"},"
                          "\"mode\":{\"type\":\"integer\",\"description\":\"Unix permission bits "
                          "in decimal, e.g. "
                          "493 = 0755 (at most 4095).\"}},\"required\":[\"sandbox_id\",\"path\"],"
                          "\"additionalProperties\":false}",
     t_files_mkdir, false, false, true},
    {"move_sandbox_file", "Move a file",
     "Renames source to destination (within the sandbox) and returns {source, destination}. An "
     "existing destination is replaced only with overwrite: true.",
     "{\"type\":\"object\",\"properties\":{" F_ID ","
     "\"source\":{\"type\":\"string\",\"description\":\"The path to move.\"},"
     "\"destination\":{\"type\":\"string\",\"description\":\"Its new path.\"},"
     "\"overwrite\":{\"type\":\"boolean\",\"description\":\"Replace an existing "
     "destination.\"}},\"required\":[\"sandbox_id\",\"source\",\"destination\"],"
     "\"additionalProperties\":false}",
     t_files_move, false, true, false},
};
