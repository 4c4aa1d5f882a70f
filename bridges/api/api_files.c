/*
 * kagent.files.v1 FilesService: directories and metadata in one sandbox's guest.
 *
 * Every call is a guest call of the service layer. Unary methods answer from the final frame.
 * WatchFiles is a kb_api_stream (api_stream.h): a client that does not read stalls its watch,
 * the guest's bounded queue overflows, and the client sees an OVERFLOW event once it reads
 * again.
 */
#include "api_int.h"
#include "api_stream.h"
#include "checks.h"
#include "ka_fsframes.h"
#include "kagent/files/v1/files.pb-c.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- unary methods --------------------------------------------------------------------------- */

typedef struct {
    kb_grpc_call_t *call;
    int op; /* KA_GUEST_* */
} s_unary_t;

/* A page from a final frame's tail, copied to aligned memory (caller frees); NULL if short. */
static ka_fs_page_t *s_page(const ka_guest_reply_t *f)
{
    ka_fs_page_t head;
    if (f->tail_len < sizeof head)
        return NULL;
    memcpy(&head, f->tail, sizeof head);
    if (f->tail_len != sizeof head + (size_t)head.count * sizeof(ka_fs_entry_t))
        return NULL;
    ka_fs_page_t *pg = malloc(f->tail_len);
    if (pg)
        memcpy(pg, f->tail, f->tail_len);
    return pg;
}

static void s_info(const ka_fs_entry_t *e, Kagent__Files__V1__FileInfo *fi,
                   Google__Protobuf__Timestamp *ts)
{
    kagent__files__v1__file_info__init(fi);
    fi->name = (char *)e->name;
    fi->type = (Kagent__Files__V1__FileType)e->type;
    fi->size = (int64_t)e->size;
    fi->mode = e->mode;
    kb_api_ts(ts, e->mtime_ms);
    fi->modified_at = ts;
}

static void s_answer_list(kb_grpc_call_t *call, const ka_fs_page_t *pg)
{
    Kagent__Files__V1__ListFilesResponse r = KAGENT__FILES__V1__LIST_FILES_RESPONSE__INIT;
    Kagent__Files__V1__FileInfo *fi = calloc(pg->count + 1, sizeof *fi);
    Kagent__Files__V1__FileInfo **pp = calloc(pg->count + 1, sizeof *pp);
    Google__Protobuf__Timestamp *ts = calloc(pg->count + 1, sizeof *ts);
    if (!fi || !pp || !ts) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
    } else {
        for (uint32_t i = 0; i < pg->count; i++) {
            s_info(&pg->entries[i], &fi[i], &ts[i]);
            pp[i] = &fi[i];
        }
        r.n_entries = pg->count;
        r.entries = pp;
        r.next_page_token =
            pg->more && pg->count ? (char *)pg->entries[pg->count - 1].name : (char *)"";
        kb_grpc_reply(call, &r.base);
    }
    free(fi);
    free(pp);
    free(ts);
}

static void s_answer(s_unary_t *u, const ka_guest_reply_t *f)
{
    if (u->op != KA_GUEST_LIST && u->op != KA_GUEST_STAT) {
        /* the empty responses all encode alike */
        Kagent__Files__V1__RemoveFileResponse r = KAGENT__FILES__V1__REMOVE_FILE_RESPONSE__INIT;
        kb_grpc_reply(u->call, &r.base);
        return;
    }
    ka_fs_page_t *pg = s_page(f);
    if (!pg || (u->op == KA_GUEST_STAT && pg->count != 1)) {
        kb_grpc_fail(u->call, KB_GRPC_INTERNAL, "a malformed reply from the sandbox");
    } else if (u->op == KA_GUEST_LIST) {
        s_answer_list(u->call, pg);
    } else {
        Kagent__Files__V1__StatFileResponse r = KAGENT__FILES__V1__STAT_FILE_RESPONSE__INIT;
        Kagent__Files__V1__FileInfo fi;
        Google__Protobuf__Timestamp ts;
        s_info(&pg->entries[0], &fi, &ts);
        r.info = &fi;
        kb_grpc_reply(u->call, &r.base);
    }
    free(pg);
}

static void s_unary_frame(void *user, const ka_guest_reply_t *f, size_t len)
{
    s_unary_t *u = user;
    if (!f->final)
        return;
    ka_svc_status_t st = ka_svc_status_of(f, len);
    if (st.err)
        kb_api_fail_err(u->call, &st);
    else
        s_answer(u, f);
    free(u);
}

/* Answers INVALID_ARGUMENT with the first refusal among why[0..n); true if there was one. */
static bool s_refused(kb_grpc_call_t *call, const char *const *why, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (why[i]) {
            kb_grpc_fail(call, KB_GRPC_INVALID_ARGUMENT, why[i]);
            return true;
        }
    }
    return false;
}

/* A request for the call's sandbox (tail: one string, or NULL) once the caller is identified
 * and the argument checks why[0..n) passed; NULL after answering. */
static ka_guest_req_t *s_req(kb_api_t *api, kb_grpc_call_t *call, int op, const char *path,
                             const char *tail, const char *const *why, size_t n)
{
    char caller[KB_AUTH_ID_MAX + 1], sandbox[KA_STORE_ID_LEN];
    if (kb_api_guest_target(api, call, caller, sizeof caller, sandbox, sizeof sandbox) ||
        s_refused(call, why, n))
        return NULL;
    size_t tn = tail && tail[0] ? strlen(tail) + 1 : 0;
    ka_guest_req_t *q = ka_guest_req_new(caller, sandbox, op, tn);
    if (!q) {
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return NULL;
    }
    snprintf(q->path, sizeof q->path, "%s", path);
    if (tn)
        memcpy(q->tail, tail, tn);
    return q;
}

/* Sends q (consumed) as a unary guest call of op. */
static void s_unary(kb_api_t *api, kb_grpc_call_t *call, ka_guest_req_t *q)
{
    s_unary_t *u = calloc(1, sizeof *u);
    if (!u) {
        free(q);
        kb_grpc_fail(call, KB_GRPC_INTERNAL, "out of memory");
        return;
    }
    u->call = call;
    u->op = q->op;
    int rc = ka_svc_stream(api->o.svc, &q, s_unary_frame, u, NULL);
    if (rc) {
        free(u);
        kb_grpc_fail(call, KB_GRPC_UNAVAILABLE, "the control plane is not running");
    }
}

static void s_list(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Files__V1__ListFilesRequest *r = (const void *)m;
    const char *why[] = {ka_check_fs_path(r->path, 0), ka_check_page_size(r->page_size),
                         ka_check_fs_page_token(r->page_token)};
    ka_guest_req_t *q = s_req(user, call, KA_GUEST_LIST, r->path, r->page_token, why, 3);
    if (q) {
        q->page_size = (uint32_t)r->page_size;
        s_unary(user, call, q);
    }
}

static void s_stat(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Files__V1__StatFileRequest *r = (const void *)m;
    const char *why[] = {ka_check_fs_path(r->path, 0)};
    ka_guest_req_t *q = s_req(user, call, KA_GUEST_STAT, r->path, NULL, why, 1);
    if (q)
        s_unary(user, call, q);
}

static void s_remove(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Files__V1__RemoveFileRequest *r = (const void *)m;
    const char *why[] = {ka_check_fs_path(r->path, 1)};
    ka_guest_req_t *q = s_req(user, call, KA_GUEST_REMOVE, r->path, NULL, why, 1);
    if (q) {
        q->fs_flag = r->recursive;
        s_unary(user, call, q);
    }
}

static void s_mkdir(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Files__V1__MakeDirectoryRequest *r = (const void *)m;
    const char *why[] = {ka_check_fs_path(r->path, 1), ka_check_fs_mode(r->mode)};
    ka_guest_req_t *q = s_req(user, call, KA_GUEST_MKDIR, r->path, NULL, why, 2);
    if (q) {
        q->fs_flag = r->parents;
        q->mode = r->mode;
        s_unary(user, call, q);
    }
}

static void s_move(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Files__V1__MoveFileRequest *r = (const void *)m;
    const char *why[] = {ka_check_fs_path(r->source, 1), ka_check_fs_path(r->destination, 1)};
    ka_guest_req_t *q = s_req(user, call, KA_GUEST_MOVE, r->source, r->destination, why, 2);
    if (q) {
        q->fs_flag = r->overwrite;
        s_unary(user, call, q);
    }
}

/* ---- WatchFiles ------------------------------------------------------------------------------ */

static bool s_keep_event(const ka_guest_reply_t *f)
{
    return !f->final && f->stream == KA_STREAM_EVENT;
}

/* An event frame (its tail a checked payload, ka_fsframes.h) as a FileEvent. */
static int s_send_event(kb_grpc_call_t *call, const ka_guest_reply_t *f, kb_grpc_sent_fn sent,
                        void *arg)
{
    Kagent__Files__V1__FileEvent fe = KAGENT__FILES__V1__FILE_EVENT__INIT;
    int kind;
    bool dir;
    const char *path, *from;
    ka_fsf_event(f->tail, &kind, &dir, &path, &from);
    fe.type = (Kagent__Files__V1__FileEventType)kind;
    fe.path = (char *)path;
    fe.from_path = (char *)from;
    fe.is_directory = dir;
    return kb_grpc_stream_send(call, &fe.base, sent, arg);
}

static const kb_api_stream_ops_t s_watch_ops = {s_keep_event, s_send_event};

typedef struct {
    kb_api_t *api;
    ka_guest_req_t *q; /* NULL once the stream took it */
} s_watch_t;

static ka_svc_status_t s_watch_start(kb_api_stream_t *s, void *arg, krt_addr_t *stream)
{
    s_watch_t *w = arg;
    if (ka_svc_stream(w->api->o.svc, &w->q, kb_api_stream_frame, s, stream))
        return (ka_svc_status_t){-ESHUTDOWN, "the control plane is not running"};
    return (ka_svc_status_t){0, NULL};
}

static void s_watch(kb_grpc_call_t *call, const ProtobufCMessage *m, void *user)
{
    const Kagent__Files__V1__WatchFilesRequest *r = (const void *)m;
    const char *why[] = {ka_check_fs_path(r->path, 0)};
    s_watch_t w = {user, s_req(user, call, KA_GUEST_WATCH, r->path, NULL, why, 1)};
    if (w.q)
        kb_api_stream_open(user, call, &s_watch_ops, s_watch_start, &w);
    free(w.q);
}

#define FILES "/kagent.files.v1.FilesService/"
const kb_grpc_method_t kb_api_files_methods[] = {
    {FILES "ListFiles", KB_GRPC_UNARY, &kagent__files__v1__list_files_request__descriptor, s_list,
     NULL, NULL, NULL},
    {FILES "StatFile", KB_GRPC_UNARY, &kagent__files__v1__stat_file_request__descriptor, s_stat,
     NULL, NULL, NULL},
    {FILES "RemoveFile", KB_GRPC_UNARY, &kagent__files__v1__remove_file_request__descriptor,
     s_remove, NULL, NULL, NULL},
    {FILES "MakeDirectory", KB_GRPC_UNARY, &kagent__files__v1__make_directory_request__descriptor,
     s_mkdir, NULL, NULL, NULL},
    {FILES "MoveFile", KB_GRPC_UNARY, &kagent__files__v1__move_file_request__descriptor, s_move,
     NULL, NULL, NULL},
    {FILES "WatchFiles", KB_GRPC_SERVER_STREAM, &kagent__files__v1__watch_files_request__descriptor,
     s_watch, NULL, NULL, NULL},
};
const size_t kb_api_files_n = sizeof kb_api_files_methods / sizeof kb_api_files_methods[0];
