/* Fakes for the control actors' unit test (see fakes.h). */
#include "fakes.h"

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "guest_proto.h"
#include "ka_tree.h"
#include "store.h"

f_state_t F = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

#define MSG_RELEASE (KRT_MSG_USER + 0x7001)

void f_reset(const char *dir)
{
    pthread_mutex_lock(&F.lock);
    F.n_records = F.n_writes = F.receipts = 0;
    F.fail_writes = F.fail_start = F.fail_halt = F.guest_dies = 0;
    F.fail_op = -1;
    F.fail_tombstone = false;
    F.hold_op = -1;
    F.gate_start = false;
    F.starts = F.stops = F.guest_requests = F.guest_starts = F.n_kept = 0;
    F.fail_freeze = F.freezes = F.thaws = F.frozen = F.stopped_frozen = 0;
    F.revision[0] = '\0';
    F.fail_fork = F.in_fork = F.forks = F.forks_frozen = 0;
    F.gate_fork = false;
    snprintf(F.dir, sizeof F.dir, "%s", dir);
    pthread_mutex_unlock(&F.lock);
}

static void s_signal(void)
{
    pthread_cond_broadcast(&F.cond);
}

bool f_wait(bool (*cond)(void *), void *arg, int ms)
{
    struct timespec until;
    krt_deadline(CLOCK_REALTIME, ms, &until);
    pthread_mutex_lock(&F.lock);
    bool ok;
    while (!(ok = cond(arg)) && pthread_cond_timedwait(&F.cond, &F.lock, &until) == 0)
        ;
    ok = ok || cond(arg);
    pthread_mutex_unlock(&F.lock);
    return ok;
}

/* ---- the store ------------------------------------------------------------------------------ */

static ka_store_sandbox_t *s_find(const char *id)
{
    for (int i = 0; i < F.n_records; i++)
        if (strcmp(F.records[i].id, id) == 0)
            return &F.records[i];
    return NULL;
}

bool f_record(const char *id, ka_store_sandbox_t *out)
{
    pthread_mutex_lock(&F.lock);
    ka_store_sandbox_t *r = s_find(id);
    if (r)
        *out = *r;
    pthread_mutex_unlock(&F.lock);
    return r != NULL;
}

void f_put_record(const ka_store_sandbox_t *r)
{
    pthread_mutex_lock(&F.lock);
    F.records[F.n_records++] = *r;
    pthread_mutex_unlock(&F.lock);
}

void f_history(const char *id, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    pthread_mutex_lock(&F.lock);
    for (int i = 0; i < F.n_writes && n < cap; i++) {
        const f_write_t *w = &F.writes[i];
        if (strcmp(w->id, id) != 0)
            continue;
        n += (size_t)snprintf(out + n, cap - n, "%s%s/%s%s%s", n ? " " : "",
                              ka_state_name(w->state) + strlen("RUNTIME_STATE_"),
                              ka_op_name(w->operation) + strlen("RUNTIME_OPERATION_"),
                              w->reason[0] ? "/" : "", w->reason);
    }
    pthread_mutex_unlock(&F.lock);
}

static void s_log_write(const char *id, int state, int op, const char *reason)
{
    if (F.n_writes == F_MAX_WRITES)
        return;
    f_write_t *w = &F.writes[F.n_writes++];
    memcpy(w->id, id, sizeof w->id);
    w->id[sizeof w->id - 1] = '\0';
    w->state = state;
    w->operation = op;
    snprintf(w->reason, sizeof w->reason, "%s", reason ? reason : "");
}

static void s_reply_record(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, int err,
                           const ka_store_sandbox_t *r, int created)
{
    if (err) { /* as the store answers a failure: an error reply */
        krt_reply_error_to(ctx, to, ref, err, "fake store: refused");
        return;
    }
    ka_store_sandbox_reply_t out;
    memset(&out, 0, sizeof out);
    out.created = created;
    if (r)
        out.sandbox = *r;
    krt_reply_to(ctx, to, ref, type, &out, sizeof out);
}

static void s_create(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const ka_store_sandbox_create_t *c = msg->body;
    for (int i = 0; i < F.n_records; i++) {
        ka_store_sandbox_t *r = &F.records[i];
        if (!strcmp(r->creator, c->creator) && !strcmp(r->request_id, c->request_id)) {
            s_reply_record(ctx, msg->from, msg->ref, msg->type, 0, r, 0);
            return;
        }
    }
    ka_store_sandbox_t *r = &F.records[F.n_records];
    memset(r, 0, sizeof *r);
    if (c->id[0]) /* a warm sandbox's id */
        snprintf(r->id, sizeof r->id, "%s", c->id);
    else
        snprintf(r->id, sizeof r->id, "0198f000-0000-7000-8000-%012d", F.n_records + 1);
    F.n_records++;
    snprintf(r->creator, sizeof r->creator, "%s", c->creator);
    snprintf(r->request_id, sizeof r->request_id, "%s", c->request_id);
    snprintf(r->template_namespace, sizeof r->template_namespace, "%s", c->template_namespace);
    snprintf(r->template_name, sizeof r->template_name, "%s", c->template_name);
    snprintf(r->revision, sizeof r->revision, "%s", c->revision);
    snprintf(r->node, sizeof r->node, "%s", c->node);
    r->state = c->ready ? KA_STATE_READY : KA_STATE_CREATING;
    r->operation = c->ready ? KA_OP_NONE : KA_OP_CREATE;
    r->created_ms = r->updated_ms = krt_wall_ms();
    r->expires_ms = r->created_ms + c->ttl_ms;
    s_log_write(r->id, r->state, r->operation, NULL);
    s_reply_record(ctx, msg->from, msg->ref, msg->type, 0, r, 1);
}

/* The receipt of (creator, request_id): its record (created 0), or NOT_FOUND. */
static void s_receipt(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const ka_store_receipt_key_t *k = msg->body;
    F.receipts++;
    for (int i = 0; i < F.n_records; i++) {
        ka_store_sandbox_t *r = &F.records[i];
        if (!strcmp(r->creator, k->creator) && !strcmp(r->request_id, k->request_id)) {
            s_reply_record(ctx, msg->from, msg->ref, msg->type, 0, r, 0);
            return;
        }
    }
    krt_reply_error_to(ctx, msg->from, msg->ref, KA_STORE_ENOTFOUND, "sandbox not found");
}

/* True (and counted) if this write is to fail. */
static bool s_fails(int op, bool tombstone)
{
    if (!F.fail_writes || (F.fail_tombstone && !tombstone) ||
        (!F.fail_tombstone && F.fail_op >= 0 && F.fail_op != op))
        return false;
    F.fail_writes--;
    return true;
}

static void s_update(krt_ctx_t *ctx, krt_addr_t from, uint64_t ref, uint32_t type,
                     const ka_store_sandbox_update_t *u)
{
    ka_store_sandbox_t *r = s_find(u->id);
    if (!r) {
        s_reply_record(ctx, from, ref, type, KA_STORE_ENOTFOUND, NULL, 0);
        return;
    }
    if (s_fails(u->operation, false)) {
        s_reply_record(ctx, from, ref, type, KA_STORE_EUNAVAIL, NULL, 0);
        return;
    }
    if (u->set & KA_SB_SET_STATE)
        r->state = u->state;
    if (u->set & KA_SB_SET_OPERATION)
        r->operation = u->operation;
    if (u->set & KA_SB_SET_FAILURE) {
        snprintf(r->failure_reason, sizeof r->failure_reason, "%s", u->failure_reason);
        snprintf(r->failure_message, sizeof r->failure_message, "%s", u->failure_message);
    }
    r->updated_ms = krt_wall_ms();
    s_log_write(r->id, r->state, r->operation,
                (u->set & KA_SB_SET_FAILURE) ? u->failure_reason : NULL);
    s_reply_record(ctx, from, ref, type, 0, r, 0);
}

static void s_tombstone(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const ka_store_sandbox_key_t *k = msg->body;
    ka_store_sandbox_t *r = s_find(k->id);
    if (r && s_fails(-1, true)) {
        s_reply_record(ctx, msg->from, msg->ref, msg->type, KA_STORE_EUNAVAIL, NULL, 0);
        return;
    }
    if (r) {
        r->state = KA_STATE_DELETED;
        r->operation = KA_OP_NONE;
        r->deleted_ms = krt_wall_ms();
        s_log_write(r->id, r->state, r->operation, NULL);
    }
    s_reply_record(ctx, msg->from, msg->ref, msg->type, r ? 0 : KA_STORE_ENOTFOUND, r, 0);
}

static void s_get(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const ka_store_sandbox_key_t *k = msg->body;
    ka_store_sandbox_t *r = s_find(k->id);
    if (r && k->creator[0] && strcmp(k->creator, r->creator) != 0)
        r = NULL;
    s_reply_record(ctx, msg->from, msg->ref, msg->type, r ? 0 : KA_STORE_ENOTFOUND, r, 0);
}

static void s_expiry(krt_ctx_t *ctx, const krt_msg_t *msg)
{
    const ka_store_expiry_query_t *q = msg->body;
    size_t len = sizeof(ka_store_sandbox_list_t) + F_MAX_RECORDS * sizeof(ka_store_sandbox_t);
    ka_store_sandbox_list_t *l = calloc(1, len);
    int64_t now = krt_wall_ms();
    for (int i = 0; i < F.n_records; i++) {
        const ka_store_sandbox_t *r = &F.records[i];
        if (!r->deleted_ms && (r->expires_ms <= now) == (q->expired != 0))
            l->items[l->count++] = *r;
    }
    krt_reply_to(ctx, msg->from, msg->ref, msg->type, l, sizeof *l + l->count * sizeof l->items[0]);
    free(l);
}

/* Updates held for f_release. */
typedef struct {
    krt_addr_t from;
    uint64_t ref;
    uint32_t type;
    ka_store_sandbox_update_t u;
} s_held_t;

typedef struct {
    s_held_t held[16];
    int n;
} s_store_t;

static void s_store_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    s_store_t *self = state;
    pthread_mutex_lock(&F.lock);
    switch (msg->type) {
    case KA_STORE_SANDBOX_CREATE:
        s_create(ctx, msg);
        break;
    case KA_STORE_SANDBOX_GET:
        s_get(ctx, msg);
        break;
    case KA_STORE_SANDBOX_RECEIPT:
        s_receipt(ctx, msg);
        break;
    case KA_STORE_SANDBOX_UPDATE: {
        const ka_store_sandbox_update_t *u = msg->body;
        if (F.hold_op >= 0 && u->operation == F.hold_op && self->n < 16) {
            self->held[self->n++] = (s_held_t){msg->from, msg->ref, msg->type, *u};
            F.held++;
            break;
        }
        s_update(ctx, msg->from, msg->ref, msg->type, u);
        break;
    }
    case KA_STORE_SANDBOX_DELETE:
        s_tombstone(ctx, msg);
        break;
    case KA_STORE_SANDBOX_EXPIRY:
        s_expiry(ctx, msg);
        break;
    case MSG_RELEASE:
        F.hold_op = -1;
        for (int i = 0; i < self->n; i++)
            s_update(ctx, self->held[i].from, self->held[i].ref, self->held[i].type,
                     &self->held[i].u);
        self->n = 0;
        F.held = 0;
        break;
    default:
        break;
    }
    s_signal();
    pthread_mutex_unlock(&F.lock);
}

const krt_behaviour_t f_store_behaviour = {
    .kind = "fake-store", .state_size = sizeof(s_store_t), .handle = s_store_handle};

void f_release(krt_system_t *sys, krt_addr_t store)
{
    krt_system_send(sys, store, MSG_RELEASE, NULL, 0);
}

/* ---- templates ------------------------------------------------------------------------------ */

static void s_tpl_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    if (msg->type != KA_TPL_RESOLVE && msg->type != KA_TPL_RUNTIME)
        return;
    ka_tpl_resolved_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.rootfs, sizeof r.rootfs, "/fake/rootfs");
    snprintf(r.pool, sizeof r.pool, "kagent-default");
    snprintf(r.env, sizeof r.env, "LANG=C.UTF-8");
    r.n_env = 1;
    pthread_mutex_lock(&F.lock);
    snprintf(r.revision, sizeof r.revision, "%s", F.revision[0] ? F.revision : "rev-1");
    snprintf(r.snapshot_location, sizeof r.snapshot_location, "file://%s/snapshots", F.dir);
    pthread_mutex_unlock(&F.lock);
    krt_reply(ctx, msg, msg->type, &r, sizeof r);
}

const krt_behaviour_t f_templates_behaviour = {
    .kind = "fake-templates", .state_size = 1, .handle = s_tpl_handle};

/* ---- the guest ------------------------------------------------------------------------------ */

struct ka_sandbox {
    int chan;  /* the node's end */
    int guest; /* the fake guest's end */
    pthread_t thread;
    char data[PATH_MAX];
    uint64_t next_proc;
    bool frozen; /* under F.lock */
};

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t off;
} s_frame_t;

static void s_frame_begin(s_frame_t *f, uint64_t id, size_t n_keys)
{
    msgpack_sbuffer_init(&f->sb);
    msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
    f->off = ka_gp_frame_begin(&f->sb);
    msgpack_pack_map(&f->pk, n_keys + 1);
    ka_gp_pack_cstr(&f->pk, "id");
    msgpack_pack_uint64(&f->pk, id);
}

static void s_frame_send(ka_sandbox_t *sb, s_frame_t *f)
{
    ka_gp_frame_end(&f->sb, f->off);
    size_t done = 0;
    while (done < f->sb.size) {
        ssize_t n = write(sb->guest, f->sb.data + done, f->sb.size - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    msgpack_sbuffer_destroy(&f->sb);
}

static void s_key(s_frame_t *f, const char *k)
{
    ka_gp_pack_cstr(&f->pk, k);
}

static void s_end_true(s_frame_t *f)
{
    s_key(f, "end");
    msgpack_pack_true(&f->pk);
}

static void s_pack_process(s_frame_t *f, uint64_t proc, bool exited)
{
    msgpack_pack_map(&f->pk, 5);
    s_key(f, "proc");
    msgpack_pack_uint64(&f->pk, proc);
    s_key(f, "pid");
    msgpack_pack_int64(&f->pk, 100 + (int64_t)proc);
    s_key(f, "state");
    msgpack_pack_uint64(&f->pk, exited ? KA_GP_STATE_EXITED : KA_GP_STATE_RUNNING);
    s_key(f, "exit_code");
    msgpack_pack_int64(&f->pk, 0);
    s_key(f, "argv");
    msgpack_pack_array(&f->pk, 0);
}

static void s_error(ka_sandbox_t *sb, uint64_t id, int err, const char *msg)
{
    s_frame_t f;
    s_frame_begin(&f, id, 3);
    s_key(&f, "err");
    msgpack_pack_int64(&f.pk, err);
    s_key(&f, "msg");
    ka_gp_pack_cstr(&f.pk, msg);
    s_end_true(&f);
    s_frame_send(sb, &f);
}

/* "start": argv[0] says what the process does: "echo" prints its other arguments, "hang" never
 * ends, "die" kills the guest (its channel closes) once it runs; "deny" (EACCES) and "huge"
 * (EFBIG) are refused by the guest. Returns false to exit. */
static bool s_start(ka_sandbox_t *sb, uint64_t id, const msgpack_object *m)
{
    const msgpack_object *argv = ka_gp_get(m, "argv");
    bool follow = false;
    ka_gp_get_bool(m, "follow", &follow);
    if (!argv || argv->type != MSGPACK_OBJECT_ARRAY || argv->via.array.size == 0) {
        s_error(sb, id, -EINVAL, "bad argv");
        return true;
    }
    const msgpack_object_str *a0 = &argv->via.array.ptr[0].via.str;
    char prog[32];
    snprintf(prog, sizeof prog, "%.*s", (int)(a0->size < 31 ? a0->size : 31), a0->ptr);
    if (!strcmp(prog, "deny") || !strcmp(prog, "huge")) {
        bool deny = !strcmp(prog, "deny");
        s_error(sb, id, deny ? -EACCES : -EFBIG,
                deny ? "permission denied by the guest" : "the guest's own words");
        return true;
    }
    uint64_t proc = ++sb->next_proc;
    s_frame_t f;
    s_frame_begin(&f, id, follow ? 1 : 2);
    s_key(&f, "process");
    s_pack_process(&f, proc, false);
    if (!follow)
        s_end_true(&f);
    s_frame_send(sb, &f);
    if (!follow)
        return strcmp(prog, "die") != 0;
    if (!strcmp(prog, "die"))
        return false;
    if (!strcmp(prog, "hang"))
        return true;
    char out[256] = "";
    size_t n = 0;
    const msgpack_object *env = ka_gp_get(m, "env");
    if (!strcmp(prog, "env") && env && env->type == MSGPACK_OBJECT_MAP) /* prints its env */
        for (uint32_t i = 0; i < env->via.map.size && n < sizeof out - 1; i++) {
            const msgpack_object_kv *kv = &env->via.map.ptr[i];
            n += (size_t)snprintf(out + n, sizeof out - n, "%s%.*s=%.*s", i ? " " : "",
                                  (int)kv->key.via.str.size, kv->key.via.str.ptr,
                                  (int)kv->val.via.str.size, kv->val.via.str.ptr);
        }
    for (uint32_t i = 1; i < argv->via.array.size && n < sizeof out - 1; i++) {
        const msgpack_object_str *s = &argv->via.array.ptr[i].via.str;
        n += (size_t)snprintf(out + n, sizeof out - n, "%s%.*s", i > 1 ? " " : "", (int)s->size,
                              s->ptr);
    }
    n += (size_t)snprintf(out + n, sizeof out - n, "\n");
    s_frame_begin(&f, id, 2);
    s_key(&f, "stdout");
    ka_gp_pack_bytes(&f.pk, out, n, true);
    s_key(&f, "offset");
    msgpack_pack_uint64(&f.pk, 0);
    s_frame_send(sb, &f);
    s_frame_begin(&f, id, 2);
    s_key(&f, "exit");
    s_pack_process(&f, proc, true);
    s_end_true(&f);
    s_frame_send(sb, &f);
    return true;
}

static void s_path(const ka_sandbox_t *sb, const msgpack_object *m, char *out, size_t cap)
{
    const char *p = "";
    size_t n = 0;
    ka_gp_get_bytes(m, "path", &p, &n);
    snprintf(out, cap, "%s/workspace/%.*s", sb->data, (int)n, p);
}

static void s_read(ka_sandbox_t *sb, uint64_t id, const msgpack_object *m)
{
    char path[PATH_MAX + 300], buf[4096];
    s_path(sb, m, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        s_error(sb, id, -errno, "cannot open");
        return;
    }
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    s_frame_t f;
    if (n > 0) {
        s_frame_begin(&f, id, 1);
        s_key(&f, "chunk");
        ka_gp_pack_bytes(&f.pk, buf, (size_t)n, true);
        s_frame_send(sb, &f);
    }
    s_frame_begin(&f, id, 2);
    s_key(&f, "size");
    msgpack_pack_uint64(&f.pk, n > 0 ? (uint64_t)n : 0);
    s_end_true(&f);
    s_frame_send(sb, &f);
}

static void s_write(ka_sandbox_t *sb, uint64_t id, const msgpack_object *m)
{
    char path[PATH_MAX + 300];
    const char *data = "";
    size_t len = 0;
    s_path(sb, m, path, sizeof path);
    ka_gp_get_bytes(m, "data", &data, &len);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, data, len) != (ssize_t)len) {
        if (fd >= 0)
            close(fd);
        s_error(sb, id, -EIO, "cannot write");
        return;
    }
    close(fd);
    s_frame_t f;
    s_frame_begin(&f, id, 2);
    s_key(&f, "written");
    msgpack_pack_uint64(&f.pk, len);
    s_end_true(&f);
    s_frame_send(sb, &f);
}

/* One request; false when the guest is to exit. */
static bool s_request(ka_sandbox_t *sb, const uint8_t *body, size_t len)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    bool alive = true;
    if (msgpack_unpack_next(&u, (const char *)body, len, NULL) == MSGPACK_UNPACK_SUCCESS) {
        const msgpack_object *m = &u.data;
        const char *op = "";
        size_t n = 0;
        uint64_t id = 0, target = 0;
        ka_gp_get_bytes(m, "op", &op, &n);
        ka_gp_get_u64(m, "id", &id);
        pthread_mutex_lock(&F.lock);
        F.guest_requests++;
        F.guest_starts += n == 5 && !memcmp(op, "start", 5);
        s_signal();
        pthread_mutex_unlock(&F.lock);
        if (n == 5 && !memcmp(op, "start", 5)) {
            alive = s_start(sb, id, m);
        } else if (n == 4 && !memcmp(op, "read", 4)) {
            s_read(sb, id, m);
        } else if (n == 5 && !memcmp(op, "write", 5)) {
            s_write(sb, id, m);
        } else if (n == 6 && !memcmp(op, "cancel", 6) && ka_gp_get_u64(m, "target", &target)) {
            s_frame_t f;
            s_frame_begin(&f, target, 1);
            s_end_true(&f);
            s_frame_send(sb, &f);
            s_frame_begin(&f, id, 1);
            s_end_true(&f);
            s_frame_send(sb, &f);
        } else if (!(n == 6 && !memcmp(op, "credit", 6))) {
            s_error(sb, id, -ENOSYS, "not faked");
        }
    }
    msgpack_unpacked_destroy(&u);
    return alive;
}

static void *s_guest_main(void *arg)
{
    ka_sandbox_t *sb = arg;
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    pthread_mutex_lock(&F.lock);
    bool alive = buf != NULL && !(F.guest_dies > 0 && F.guest_dies--);
    pthread_mutex_unlock(&F.lock);
    while (alive) {
        ssize_t n = read(sb->guest, buf + len, cap - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        const uint8_t *body;
        size_t blen;
        long k;
        while (alive && (k = ka_gp_frame_next(buf, len, KA_GP_MAX_FRAME, &body, &blen)) > 0) {
            alive = s_request(sb, body, blen);
            memmove(buf, buf + k, len - (size_t)k);
            len -= (size_t)k;
        }
    }
    free(buf);
    shutdown(sb->guest, SHUT_RDWR); /* the node sees the guest exit */
    return NULL;
}

/* ---- the driver ----------------------------------------------------------------------------- */

/* The kept /data of id into data (true); unlisted if take. */
static bool s_kept_get(const char *id, char *data, size_t cap, bool take)
{
    pthread_mutex_lock(&F.lock);
    bool found = false;
    for (int i = 0; i < F.n_kept && !found; i++)
        if (!strcmp(F.kept[i].id, id)) {
            snprintf(data, cap, "%s", F.kept[i].data);
            if (take)
                F.kept[i] = F.kept[--F.n_kept];
            found = true;
        }
    pthread_mutex_unlock(&F.lock);
    return found;
}

static int f_start(ka_driver_t *d, const ka_sandbox_spec_t *spec, ka_sandbox_t **out)
{
    pthread_mutex_lock(&F.lock);
    F.starts++;
    F.in_start++;
    s_signal();
    while (F.gate_start)
        pthread_cond_wait(&F.cond, &F.lock);
    F.in_start--;
    bool fail = F.fail_start > 0 && F.fail_start--;
    char dir[sizeof F.dir];
    snprintf(dir, sizeof dir, "%s", F.dir);
    pthread_mutex_unlock(&F.lock);
    if (fail)
        return -EIO;
    ka_sandbox_t *sb = calloc(1, sizeof *sb);
    int sv[2];
    if (!sb || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        free(sb);
        return -ENOMEM;
    }
    sb->chan = sv[0];
    sb->guest = sv[1];
    snprintf(sb->data, sizeof sb->data, "%s/data-%s-%d", dir, spec->id, rand());
    bool reused = spec->reuse_data && s_kept_get(spec->id, sb->data, sizeof sb->data, true);
    char ws[PATH_MAX + 16];
    snprintf(ws, sizeof ws, "%s/workspace", sb->data);
    if ((!reused && (mkdir(sb->data, 0755) < 0 || mkdir(ws, 0755) < 0)) ||
        pthread_create(&sb->thread, NULL, s_guest_main, sb) != 0) {
        close(sv[0]);
        close(sv[1]);
        free(sb);
        return -EIO;
    }
    pthread_mutex_lock(&F.lock);
    F.live++;
    pthread_mutex_unlock(&F.lock);
    *out = sb;
    return 0;
}

static void s_end(ka_sandbox_t *sb, bool keep, const char *id)
{
    shutdown(sb->chan, SHUT_RDWR);
    pthread_join(sb->thread, NULL);
    close(sb->chan);
    close(sb->guest);
    if (keep) {
        pthread_mutex_lock(&F.lock);
        snprintf(F.kept[F.n_kept].id, sizeof F.kept[0].id, "%s", id);
        snprintf(F.kept[F.n_kept].data, sizeof F.kept[0].data, "%s", sb->data);
        F.n_kept++;
        pthread_mutex_unlock(&F.lock);
    } else {
        ka_tree_opts_t o = {.owner = -1};
        ka_tree_remove(sb->data, &o);
    }
    free(sb);
}

/* The fake's id is in its data dir's name: data-<id>-<n>. */
static void s_id_of(const ka_sandbox_t *sb, char *id, size_t cap)
{
    const char *p = strstr(sb->data, "/data-");
    snprintf(id, cap, "%.36s", p ? p + 6 : "");
}

/* Counts a stop (or park) of a sandbox left frozen. */
static void s_note_frozen_stop(ka_sandbox_t *sb)
{
    pthread_mutex_lock(&F.lock);
    if (sb->frozen) {
        F.stopped_frozen++;
        F.frozen--;
    }
    pthread_mutex_unlock(&F.lock);
}

static int f_park(ka_driver_t *d, ka_sandbox_t **sbp)
{
    char id[KA_STORE_ID_LEN];
    s_id_of(*sbp, id, sizeof id);
    s_note_frozen_stop(*sbp);
    s_end(*sbp, true, id);
    *sbp = NULL;
    pthread_mutex_lock(&F.lock);
    F.stops++;
    F.live--;
    s_signal();
    pthread_mutex_unlock(&F.lock);
    return 0;
}

static bool f_kept(ka_driver_t *d, const char *id)
{
    pthread_mutex_lock(&F.lock);
    bool found = false;
    for (int i = 0; i < F.n_kept; i++)
        found = found || !strcmp(F.kept[i].id, id);
    pthread_mutex_unlock(&F.lock);
    return found;
}

static size_t f_kept_ids(ka_driver_t *d, char (*ids)[KA_DRIVER_ID_LEN], size_t cap)
{
    pthread_mutex_lock(&F.lock);
    size_t n = (size_t)F.n_kept;
    for (size_t i = 0; i < n && i < cap; i++)
        snprintf(ids[i], KA_DRIVER_ID_LEN, "%s", F.kept[i].id);
    pthread_mutex_unlock(&F.lock);
    return n;
}

/* As the real driver's: the kept /data is gone when this returns, and only then unlisted (a
 * test that sees the list empty finds the directory gone). */
static int f_discard(ka_driver_t *d, const char *id)
{
    char data[PATH_MAX];
    if (s_kept_get(id, data, sizeof data, false)) {
        ka_tree_opts_t o = {.owner = -1};
        ka_tree_remove(data, &o);
        s_kept_get(id, data, sizeof data, true);
    }
    return 0;
}

static int f_stop(ka_driver_t *d, ka_sandbox_t **sbp)
{
    s_note_frozen_stop(*sbp);
    s_end(*sbp, false, NULL);
    *sbp = NULL;
    pthread_mutex_lock(&F.lock);
    F.stops++;
    F.live--;
    s_signal();
    pthread_mutex_unlock(&F.lock);
    return 0;
}

static int f_halt(ka_driver_t *d, ka_sandbox_t *sb)
{
    pthread_mutex_lock(&F.lock);
    bool fail = F.fail_halt > 0 && F.fail_halt--;
    pthread_mutex_unlock(&F.lock);
    return fail ? -EIO : 0;
}

static int f_freeze(ka_driver_t *d, ka_sandbox_t *sb, bool frozen)
{
    pthread_mutex_lock(&F.lock);
    bool fail = frozen && F.fail_freeze > 0 && F.fail_freeze--;
    if (!fail && sb->frozen != frozen) {
        sb->frozen = frozen;
        F.frozen += frozen ? 1 : -1;
        *(frozen ? &F.freezes : &F.thaws) += 1;
    }
    pthread_mutex_unlock(&F.lock);
    return fail ? -EBUSY : 0;
}

static int f_stats(ka_driver_t *d, ka_sandbox_t *sb, ka_sandbox_stats_t *out)
{
    memset(out, 0, sizeof *out);
    return 0;
}

static const char *f_data_dir(ka_driver_t *d, ka_sandbox_t *sb)
{
    return sb->data;
}

static uint32_t f_owner(ka_driver_t *d, ka_sandbox_t *sb)
{
    return (uint32_t)getuid();
}

static int f_channel(ka_driver_t *d, ka_sandbox_t *sb)
{
    return sb->chan;
}

static int f_kill(ka_driver_t *d, ka_sandbox_t *sb)
{
    shutdown(sb->guest, SHUT_RDWR);
    return 0;
}

/* A copy of sb's /data kept for id, as park keeps one. */
static int f_fork(ka_driver_t *d, ka_sandbox_t *sb, const char *id, uint64_t *bytes)
{
    pthread_mutex_lock(&F.lock);
    F.in_fork++;
    s_signal();
    while (F.gate_fork)
        pthread_cond_wait(&F.cond, &F.lock);
    F.in_fork--;
    bool fail = F.fail_fork > 0 && F.fail_fork--;
    bool frozen = sb->frozen;
    char data[PATH_MAX];
    snprintf(data, sizeof data, "%s/data-%s-%d", F.dir, id, rand());
    pthread_mutex_unlock(&F.lock);
    if (fail)
        return -EDQUOT;
    ka_tree_opts_t o = {.owner = -1};
    ka_tree_stats_t st;
    int rc = ka_tree_copy(sb->data, data, &o, &st);
    if (rc)
        return rc;
    *bytes = st.bytes;
    pthread_mutex_lock(&F.lock);
    snprintf(F.kept[F.n_kept].id, sizeof F.kept[0].id, "%s", id);
    snprintf(F.kept[F.n_kept].data, sizeof F.kept[0].data, "%s", data);
    F.n_kept++;
    F.forks++;
    F.forks_frozen += frozen;
    s_signal();
    pthread_mutex_unlock(&F.lock);
    return 0;
}

static void f_destroy(ka_driver_t *d)
{
    free(d);
}

static const ka_driver_ops_t s_ops = {.name = "fake",
                                      .start = f_start,
                                      .stop = f_stop,
                                      .halt = f_halt,
                                      .stats = f_stats,
                                      .data_dir = f_data_dir,
                                      .owner = f_owner,
                                      .channel = f_channel,
                                      .kill = f_kill,
                                      .freeze = f_freeze,
                                      .park = f_park,
                                      .kept = f_kept,
                                      .discard = f_discard,
                                      .kept_ids = f_kept_ids,
                                      .destroy = f_destroy,
                                      .fork = f_fork};

ka_driver_t *f_driver_new(void)
{
    ka_driver_t *d = calloc(1, sizeof *d);
    if (d)
        d->ops = &s_ops;
    return d;
}

void f_open_gate(void)
{
    pthread_mutex_lock(&F.lock);
    F.gate_start = false;
    F.gate_fork = false;
    s_signal();
    pthread_mutex_unlock(&F.lock);
}
