/* kb_grpc_reflection: server reflection from descriptor sets. See grpc_reflection.h.
 *
 * The index keeps each file's serialized FileDescriptorProto as it appeared in the set and a
 * sorted symbol table (fully qualified name -> file). Reflection streams run entirely on the
 * gRPC server thread (all their callbacks do), so a stream's queue needs no lock.
 */
#include "grpc_reflection.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "krt.h"

#define LOG_PATH "bridges/grpc/reflection"

typedef Grpc__Reflection__V1alpha__ServerReflectionRequest s_req_t;
typedef Grpc__Reflection__V1alpha__ServerReflectionResponse s_rsp_t;

typedef struct {
    char *name;
    uint8_t *bytes; /* serialized FileDescriptorProto */
    size_t len;
    char **deps;
    size_t n_deps;
} s_file_t;

typedef struct {
    char *name; /* fully qualified, no leading dot */
    size_t file;
} s_sym_t;

struct kb_grpc_reflection {
    s_file_t *files;
    size_t n_files;
    s_sym_t *syms;
    size_t n_syms, cap_syms;
    char **services;
    size_t n_services;
    bool sorted;
};

/* ---------- index ---------- */

kb_grpc_reflection_t *kb_grpc_reflection_new(void)
{
    return calloc(1, sizeof(kb_grpc_reflection_t));
}

static int s_add_sym(kb_grpc_reflection_t *r, const char *scope, const char *name, size_t file)
{
    if (r->n_syms == r->cap_syms) {
        size_t cap = r->cap_syms ? r->cap_syms * 2 : 64;
        s_sym_t *t = realloc(r->syms, cap * sizeof *t);
        if (!t)
            return -ENOMEM;
        r->syms = t;
        r->cap_syms = cap;
    }
    size_t n = strlen(scope) + strlen(name) + 2;
    char *full = malloc(n);
    if (!full)
        return -ENOMEM;
    if (scope[0])
        snprintf(full, n, "%s.%s", scope, name);
    else
        snprintf(full, n, "%s", name);
    r->syms[r->n_syms++] = (s_sym_t){full, file};
    r->sorted = false;
    return 0;
}

static int s_add_enum(kb_grpc_reflection_t *r, const char *scope,
                      const Google__Protobuf__EnumDescriptorProto *e, size_t file)
{
    int rc = s_add_sym(r, scope, e->name, file);
    for (size_t i = 0; rc == 0 && i < e->n_value; i++)
        rc = s_add_sym(r, scope, e->value[i]->name, file); /* values live beside the enum */
    return rc;
}

static int s_add_message(kb_grpc_reflection_t *r, const char *scope,
                         const Google__Protobuf__DescriptorProto *m, size_t file)
{
    int rc = s_add_sym(r, scope, m->name, file);
    if (rc < 0)
        return rc;
    char *self = r->syms[r->n_syms - 1].name;
    for (size_t i = 0; rc == 0 && i < m->n_field; i++)
        rc = s_add_sym(r, self, m->field[i]->name, file);
    for (size_t i = 0; rc == 0 && i < m->n_nested_type; i++)
        rc = s_add_message(r, self, m->nested_type[i], file);
    for (size_t i = 0; rc == 0 && i < m->n_enum_type; i++)
        rc = s_add_enum(r, self, m->enum_type[i], file);
    return rc;
}

static int s_add_service_name(kb_grpc_reflection_t *r, const char *full)
{
    char **t = realloc(r->services, (r->n_services + 1) * sizeof *t);
    if (!t)
        return -ENOMEM;
    r->services = t;
    r->services[r->n_services] = strdup(full);
    if (!r->services[r->n_services])
        return -ENOMEM;
    r->n_services++;
    return 0;
}

static bool s_have_file(const kb_grpc_reflection_t *r, const char *name, size_t *idx)
{
    for (size_t i = 0; i < r->n_files; i++) {
        if (strcmp(r->files[i].name, name) == 0) {
            if (idx)
                *idx = i;
            return true;
        }
    }
    return false;
}

/* Indexes one serialized FileDescriptorProto. */
static int s_add_file(kb_grpc_reflection_t *r, const uint8_t *data, size_t len)
{
    Google__Protobuf__FileDescriptorProto *fd =
        google__protobuf__file_descriptor_proto__unpack(NULL, len, data);
    if (!fd || !fd->name) {
        if (fd)
            google__protobuf__file_descriptor_proto__free_unpacked(fd, NULL);
        return -EBADMSG;
    }
    int rc = 0;
    if (s_have_file(r, fd->name, NULL))
        goto out;
    s_file_t *t = realloc(r->files, (r->n_files + 1) * sizeof *t);
    if (!t) {
        rc = -ENOMEM;
        goto out;
    }
    r->files = t;
    size_t fi = r->n_files;
    s_file_t *f = &r->files[fi];
    memset(f, 0, sizeof *f);
    f->name = strdup(fd->name);
    f->bytes = malloc(len ? len : 1);
    f->deps = calloc(fd->n_dependency ? fd->n_dependency : 1, sizeof(char *));
    if (!f->name || !f->bytes || !f->deps) {
        free(f->name);
        free(f->bytes);
        free(f->deps);
        rc = -ENOMEM;
        goto out;
    }
    memcpy(f->bytes, data, len);
    f->len = len;
    r->n_files++;
    for (size_t i = 0; i < fd->n_dependency; i++) {
        f->deps[i] = strdup(fd->dependency[i]);
        if (!f->deps[i]) {
            rc = -ENOMEM;
            goto out;
        }
        f->n_deps++;
    }
    const char *pkg = fd->package ? fd->package : "";
    for (size_t i = 0; rc == 0 && i < fd->n_message_type; i++)
        rc = s_add_message(r, pkg, fd->message_type[i], fi);
    for (size_t i = 0; rc == 0 && i < fd->n_enum_type; i++)
        rc = s_add_enum(r, pkg, fd->enum_type[i], fi);
    for (size_t i = 0; rc == 0 && i < fd->n_service; i++) {
        const Google__Protobuf__ServiceDescriptorProto *s = fd->service[i];
        rc = s_add_sym(r, pkg, s->name, fi);
        if (rc < 0)
            break;
        char *svc = r->syms[r->n_syms - 1].name;
        rc = s_add_service_name(r, svc);
        for (size_t j = 0; rc == 0 && j < s->n_method; j++)
            rc = s_add_sym(r, svc, s->method[j]->name, fi);
    }
out:
    google__protobuf__file_descriptor_proto__free_unpacked(fd, NULL);
    return rc;
}

/* Reads a varint; 0 or -EBADMSG. */
static int s_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p >= end)
            return -EBADMSG;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -EBADMSG;
}

int kb_grpc_reflection_add_set(kb_grpc_reflection_t *r, const void *data, size_t len)
{
    /* FileDescriptorSet { repeated FileDescriptorProto file = 1; }: walk it raw so each file's
     * bytes are kept exactly as protoc wrote them. */
    const uint8_t *p = data, *end = p + len;
    int files = 0;
    while (p < end) {
        uint64_t key, n;
        if (s_varint(&p, end, &key) < 0 || key != ((1 << 3) | 2) || s_varint(&p, end, &n) < 0 ||
            n > (uint64_t)(end - p))
            return -EBADMSG;
        int rc = s_add_file(r, p, (size_t)n);
        if (rc < 0)
            return rc;
        p += n;
        files++;
    }
    return files > 0 ? 0 : -EBADMSG;
}

int kb_grpc_reflection_add_file(kb_grpc_reflection_t *r, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            uint8_t *t = realloc(buf, cap);
            if (!t) {
                rc = -ENOMEM;
                break;
            }
            buf = t;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                rc = -EIO;
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        rc = kb_grpc_reflection_add_set(r, buf, len);
    free(buf);
    return rc;
}

size_t kb_grpc_reflection_service_count(const kb_grpc_reflection_t *r)
{
    return r->n_services;
}

static int s_sym_cmp(const void *a, const void *b)
{
    return strcmp(((const s_sym_t *)a)->name, ((const s_sym_t *)b)->name);
}

static bool s_find_symbol(const kb_grpc_reflection_t *r, const char *name, size_t *file)
{
    if (name[0] == '.')
        name++;
    s_sym_t key = {(char *)name, 0};
    s_sym_t *hit = bsearch(&key, r->syms, r->n_syms, sizeof key, s_sym_cmp);
    if (hit)
        *file = hit->file;
    return hit != NULL;
}

void kb_grpc_reflection_destroy(kb_grpc_reflection_t **r_p)
{
    kb_grpc_reflection_t *r = r_p ? *r_p : NULL;
    if (!r)
        return;
    *r_p = NULL;
    for (size_t i = 0; i < r->n_files; i++) {
        free(r->files[i].name);
        free(r->files[i].bytes);
        for (size_t j = 0; j < r->files[i].n_deps; j++)
            free(r->files[i].deps[j]);
        free(r->files[i].deps);
    }
    for (size_t i = 0; i < r->n_syms; i++)
        free(r->syms[i].name);
    for (size_t i = 0; i < r->n_services; i++)
        free(r->services[i]);
    free(r->files);
    free(r->syms);
    free(r->services);
    free(r);
}

/* ---------- the stream ---------- */

/* One queued response with the storage it points into. */
typedef struct s_item {
    struct s_item *next;
    s_rsp_t rsp;
    Grpc__Reflection__V1alpha__FileDescriptorResponse fdr;
    Grpc__Reflection__V1alpha__ListServiceResponse lsr;
    Grpc__Reflection__V1alpha__ErrorResponse err;
    ProtobufCBinaryData *files;
    Grpc__Reflection__V1alpha__ServiceResponse *svcs;
    Grpc__Reflection__V1alpha__ServiceResponse **svc_ptrs;
    s_req_t *req; /* the original request, owned */
    char errmsg[300];
} s_item_t;

typedef struct {
    kb_grpc_reflection_t *r;
    kb_grpc_call_t *call;
    s_item_t *head, *tail;
    bool sending;
    bool ended;
    int end_status;
} s_stream_t;

static void s_item_free(s_item_t *it)
{
    free(it->files);
    free(it->svcs);
    free(it->svc_ptrs);
    if (it->req)
        protobuf_c_message_free_unpacked(&it->req->base, NULL);
    free(it);
}

static void s_set_error(s_item_t *it, int code, const char *fmt, const char *arg)
{
    snprintf(it->errmsg, sizeof it->errmsg, fmt, arg);
    it->err.error_code = code;
    it->err.error_message = it->errmsg;
    it->rsp.message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
    it->rsp.error_response = &it->err;
}

/* Fills a file answer: file fi and its transitive dependencies, each once. */
static int s_answer_file(const kb_grpc_reflection_t *r, s_item_t *it, size_t fi)
{
    bool *seen = calloc(r->n_files, sizeof *seen);
    size_t *order = calloc(r->n_files, sizeof *order);
    it->files = calloc(r->n_files, sizeof *it->files);
    if (!seen || !order || !it->files) {
        free(seen);
        free(order);
        return -ENOMEM;
    }
    size_t n = 0;
    order[n++] = fi;
    seen[fi] = true;
    for (size_t k = 0; k < n; k++) {
        const s_file_t *f = &r->files[order[k]];
        for (size_t d = 0; d < f->n_deps; d++) {
            size_t di;
            if (s_have_file(r, f->deps[d], &di) && !seen[di]) {
                seen[di] = true;
                order[n++] = di;
            }
        }
    }
    for (size_t k = 0; k < n; k++)
        it->files[k] = (ProtobufCBinaryData){r->files[order[k]].len, r->files[order[k]].bytes};
    it->fdr.n_file_descriptor_proto = n;
    it->fdr.file_descriptor_proto = it->files;
    it->rsp.message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
    it->rsp.file_descriptor_response = &it->fdr;
    free(seen);
    free(order);
    return 0;
}

static int s_answer_services(const kb_grpc_reflection_t *r, s_item_t *it)
{
    size_t n = r->n_services;
    it->svcs = calloc(n ? n : 1, sizeof *it->svcs);
    it->svc_ptrs = calloc(n ? n : 1, sizeof *it->svc_ptrs);
    if (!it->svcs || !it->svc_ptrs)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        grpc__reflection__v1alpha__service_response__init(&it->svcs[i]);
        it->svcs[i].name = r->services[i];
        it->svc_ptrs[i] = &it->svcs[i];
    }
    it->lsr.n_service = n;
    it->lsr.service = it->svc_ptrs;
    it->rsp.message_response_case =
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
    it->rsp.list_services_response = &it->lsr;
    return 0;
}

/* Builds the answer to one request (takes ownership of req). NULL on memory failure. */
static s_item_t *s_answer(const kb_grpc_reflection_t *r, s_req_t *req)
{
    s_item_t *it = calloc(1, sizeof *it);
    if (!it) {
        protobuf_c_message_free_unpacked(&req->base, NULL);
        return NULL;
    }
    grpc__reflection__v1alpha__server_reflection_response__init(&it->rsp);
    grpc__reflection__v1alpha__file_descriptor_response__init(&it->fdr);
    grpc__reflection__v1alpha__list_service_response__init(&it->lsr);
    grpc__reflection__v1alpha__error_response__init(&it->err);
    it->req = req;
    it->rsp.valid_host = req->host;
    it->rsp.original_request = req;
    int rc = 0;
    size_t fi;
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        rc = s_answer_services(r, it);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        if (s_have_file(r, req->file_by_filename, &fi))
            rc = s_answer_file(r, it, fi);
        else
            s_set_error(it, KB_GRPC_NOT_FOUND, "file not found: %.256s", req->file_by_filename);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        if (s_find_symbol(r, req->file_containing_symbol, &fi))
            rc = s_answer_file(r, it, fi);
        else
            s_set_error(it, KB_GRPC_NOT_FOUND, "symbol not found: %.256s",
                        req->file_containing_symbol);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        s_set_error(it, KB_GRPC_NOT_FOUND, "%s", "extensions are not supported");
        break;
    default:
        s_set_error(it, KB_GRPC_INVALID_ARGUMENT, "%s", "empty reflection request");
        break;
    }
    if (rc < 0) {
        s_item_free(it);
        return NULL;
    }
    return it;
}

static void s_stream_free(s_stream_t *st)
{
    while (st->head) {
        s_item_t *it = st->head;
        st->head = it->next;
        s_item_free(it);
    }
    free(st);
}

/* Ends the call once the stream is over and nothing is being sent. */
static void s_maybe_finish(s_stream_t *st)
{
    if (!st->ended || st->sending)
        return;
    kb_grpc_call_t *call = st->call;
    kb_grpc_code_t code = st->end_status == 0 ? KB_GRPC_OK : KB_GRPC_CANCELLED;
    s_stream_free(st);
    kb_grpc_finish(call, code, NULL);
}

static void s_sent(kb_grpc_call_t *call, int status, void *arg);

static void s_pump(s_stream_t *st)
{
    while (!st->sending && st->head) {
        int rc = kb_grpc_stream_send(st->call, &st->head->rsp.base, s_sent, st);
        if (rc == 0) {
            st->sending = true;
            return;
        }
        /* the client is gone (or the answer cannot be sent): drop it */
        krt_log(KRT_LOG_DEBUG, LOG_PATH, "send_failed", "rc=%d", rc);
        s_item_t *it = st->head;
        st->head = it->next;
        s_item_free(it);
    }
    if (!st->head)
        st->tail = NULL;
}

static void s_sent(kb_grpc_call_t *call, int status, void *arg)
{
    s_stream_t *st = arg;
    st->sending = false;
    s_item_t *it = st->head;
    st->head = it->next;
    if (!st->head)
        st->tail = NULL;
    s_item_free(it);
    if (status < 0) {
        while (st->head) {
            it = st->head;
            st->head = it->next;
            s_item_free(it);
        }
        st->tail = NULL;
    }
    s_pump(st);
    s_maybe_finish(st);
}

static void s_on_start(kb_grpc_call_t *call, const ProtobufCMessage *req, void *user)
{
    s_stream_t *st = calloc(1, sizeof *st);
    if (!st) {
        kb_grpc_fail(call, KB_GRPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    st->r = user;
    st->call = call;
    kb_grpc_call_set_data(call, st);
}

static void s_on_message(kb_grpc_call_t *call, ProtobufCMessage *msg, void *user)
{
    s_stream_t *st = kb_grpc_call_data(call);
    if (!st) { /* start failed; the call is already answered */
        protobuf_c_message_free_unpacked(msg, NULL);
        return;
    }
    s_item_t *it = s_answer(st->r, (s_req_t *)msg);
    if (!it)
        return;
    if (st->tail)
        st->tail->next = it;
    else
        st->head = it;
    st->tail = it;
    s_pump(st);
}

static void s_on_end(kb_grpc_call_t *call, int status, void *user)
{
    s_stream_t *st = kb_grpc_call_data(call);
    if (!st)
        return;
    st->ended = true;
    st->end_status = status;
    s_maybe_finish(st);
}

int kb_grpc_reflection_register(kb_grpc_reflection_t *r, kb_grpc_server_t *srv)
{
    qsort(r->syms, r->n_syms, sizeof *r->syms, s_sym_cmp);
    r->sorted = true;
    const ProtobufCMessageDescriptor *req =
        &grpc__reflection__v1alpha__server_reflection_request__descriptor;
    /* v1 and v1alpha messages are identical on the wire: one implementation serves both. */
    kb_grpc_method_t m[2] = {
        {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", KB_GRPC_BIDI_STREAM, req,
         s_on_start, s_on_message, s_on_end, r},
        {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", KB_GRPC_BIDI_STREAM, req,
         s_on_start, s_on_message, s_on_end, r},
    };
    return kb_grpc_server_add_methods(srv, m, 2);
}
