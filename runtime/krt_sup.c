/*
 * Supervisors (OTP semantics) as an ordinary actor built on the public API: children are
 * spawned linked, the supervisor traps exits and reacts to KRT_MSG_EXIT.
 *
 * Stopping children (for a restart or a shutdown) is a sequence: send KRT_MSG_STOP to one
 * child, wait for its EXIT (or kill it after KRT_SUP_SHUTDOWN_MS), then the next, in reverse
 * start order. Exits of children outside the sequence that arrive meanwhile are remembered and
 * handled once the sequence completes.
 */
#include "krt_int.h"

#include <stdlib.h>
#include <string.h>

#define KRT_SUP_SHUTDOWN_MS 5000
#define KRT_SUP_KILL_TYPE   200 /* internal timer message (below KRT_MSG_USER) */

enum { S_RUN, S_RESTART, S_SHUTDOWN };

typedef struct s_child {
    char *name;
    const krt_behaviour_t *b;
    void *arg;
    krt_restart_t restart;
    bool register_name;
    krt_addr_t addr; /* KRT_ADDR_NONE when not running */
    uint32_t restarts;
    bool restart_me; /* start again when the current stop sequence completes */
    bool removed;    /* a temporary child that stopped: dropped at the next compaction */
    bool pending;    /* exited during a stop sequence; handled afterwards */
    int pending_reason;
} s_child_t;

typedef struct krt_sup {
    pthread_mutex_t lock; /* children names and addresses, for krt_supervisor_child */
    krt_strategy_t strategy;
    int intensity, period_ms;
    s_child_t *ch;
    size_t n, cap;
    uint64_t *rt; /* ring of the last intensity+1 restart times */
    size_t rt_n, rt_head;
    int mode;
    size_t *stop;
    size_t n_stop, i_stop;
    int exit_reason;
    krt_timer_t kill_timer;
} krt_sup_t;

/* ---------------------------------------------------------------------------------------- */

static int s_add(krt_sup_t *sup, const krt_child_spec_t *cs)
{
    if (!cs || !cs->name || !cs->behaviour)
        return KRT_EINVAL;
    for (size_t i = 0; i < sup->n; i++)
        if (!sup->ch[i].removed && strcmp(sup->ch[i].name, cs->name) == 0)
            return KRT_EEXIST;
    s_child_t c = {0};
    if (!(c.name = strdup(cs->name)))
        return KRT_ENOMEM;
    c.b = cs->behaviour;
    c.arg = cs->arg;
    c.restart = cs->restart;
    c.register_name = cs->register_name;
    int rc = 0;
    pthread_mutex_lock(&sup->lock); /* krt_supervisor_child reads ch from other threads */
    if (sup->n == sup->cap) {
        size_t cap = sup->cap ? sup->cap * 2 : 4;
        s_child_t *ch = realloc(sup->ch, cap * sizeof *ch);
        size_t *st = realloc(sup->stop, cap * sizeof *st);
        if (ch)
            sup->ch = ch;
        if (st)
            sup->stop = st;
        if (ch && st)
            sup->cap = cap;
        else
            rc = KRT_ENOMEM;
    }
    if (rc == 0)
        sup->ch[sup->n++] = c;
    pthread_mutex_unlock(&sup->lock);
    if (rc)
        free(c.name);
    return rc;
}

static void s_set_addr(krt_sup_t *sup, s_child_t *c, krt_addr_t addr)
{
    pthread_mutex_lock(&sup->lock);
    c->addr = addr;
    pthread_mutex_unlock(&sup->lock);
}

static int s_start(krt_ctx_t *ctx, krt_sup_t *sup, size_t i)
{
    s_child_t *c = &sup->ch[i];
    krt_spawn_opts_t o = {.name = c->name, .link = true, .register_name = c->register_name};
    krt_addr_t addr = KRT_ADDR_NONE;
    int rc = krt__spawn(ctx->sys, ctx, c->b, c->arg, NULL, &o, c->restarts, 0, &addr);
    if (rc == 0)
        s_set_addr(sup, c, addr);
    return rc;
}

/* Drops removed children (only while no stop sequence refers to indices). */
static void s_compact(krt_sup_t *sup)
{
    pthread_mutex_lock(&sup->lock);
    size_t j = 0;
    for (size_t i = 0; i < sup->n; i++) {
        if (sup->ch[i].removed)
            free(sup->ch[i].name);
        else
            sup->ch[j++] = sup->ch[i];
    }
    sup->n = j;
    pthread_mutex_unlock(&sup->lock);
}

/* Records a restart; true if that makes more than intensity within period_ms. */
static bool s_too_many(krt_sup_t *sup)
{
    size_t cap = (size_t)sup->intensity + 1;
    uint64_t now = krt_now_ms();
    sup->rt[(sup->rt_head + sup->rt_n) % cap] = now;
    if (sup->rt_n < cap)
        sup->rt_n++;
    else
        sup->rt_head = (sup->rt_head + 1) % cap;
    if (sup->rt_n < cap)
        return false;
    return now - sup->rt[sup->rt_head] <= (uint64_t)sup->period_ms;
}

static void s_child_died(krt_ctx_t *ctx, krt_sup_t *sup, size_t i, int reason);

static void s_stop_next(krt_ctx_t *ctx, krt_sup_t *sup)
{
    while (sup->i_stop < sup->n_stop) {
        s_child_t *c = &sup->ch[sup->stop[sup->i_stop]];
        if (c->addr == KRT_ADDR_NONE) {
            sup->i_stop++;
            continue;
        }
        krt_send(ctx, c->addr, KRT_MSG_STOP, NULL, 0); /* its EXIT comes either way */
        krt_timer_arm(ctx, &sup->kill_timer, KRT_SUP_SHUTDOWN_MS, KRT_SUP_KILL_TYPE, 0);
        return;
    }
    krt_timer_cancel(ctx, &sup->kill_timer);
    sup->n_stop = sup->i_stop = 0;
    if (sup->mode == S_SHUTDOWN) {
        krt_exit(ctx, sup->exit_reason);
        return;
    }
    sup->mode = S_RUN;
    for (size_t i = 0; i < sup->n; i++) {
        s_child_t *c = &sup->ch[i];
        if (c->restart == KRT_TEMPORARY && c->restart_me)
            c->removed = true;
        if (!c->restart_me || c->removed)
            continue;
        c->restart_me = false;
        c->restarts++;
        if (s_start(ctx, sup, i) != 0 && !krt__stopping(ctx)) {
            sup->mode = S_SHUTDOWN;
            sup->exit_reason = KRT_EXIT_ERROR;
            break;
        }
    }
    if (sup->mode == S_SHUTDOWN) {
        s_child_died(ctx, sup, SIZE_MAX, 0); /* re-enters the shutdown path */
        return;
    }
    for (size_t i = 0; i < sup->n && sup->mode == S_RUN; i++) {
        if (sup->ch[i].pending) {
            sup->ch[i].pending = false;
            s_child_died(ctx, sup, i, sup->ch[i].pending_reason);
        }
    }
    if (sup->mode == S_RUN)
        s_compact(sup);
}

/* Stops every running child, newest first, then exits with reason. */
static void s_shutdown(krt_ctx_t *ctx, krt_sup_t *sup, int reason)
{
    if (sup->mode == S_SHUTDOWN)
        return;
    sup->mode = S_SHUTDOWN;
    sup->exit_reason = reason;
    sup->n_stop = sup->i_stop = 0;
    for (size_t i = sup->n; i-- > 0;)
        if (sup->ch[i].addr != KRT_ADDR_NONE)
            sup->stop[sup->n_stop++] = i;
    s_stop_next(ctx, sup);
}

/* Stops children after (rest_for_one) or other than (one_for_all) i, then restarts them. */
static void s_restart_group(krt_ctx_t *ctx, krt_sup_t *sup, size_t i, bool all)
{
    sup->mode = S_RESTART;
    sup->n_stop = sup->i_stop = 0;
    sup->ch[i].restart_me = true;
    for (size_t k = sup->n; k-- > 0;) {
        s_child_t *c = &sup->ch[k];
        if (k == i || (!all && k < i) || c->removed || c->addr == KRT_ADDR_NONE)
            continue;
        c->restart_me = true;
        sup->stop[sup->n_stop++] = k;
    }
    s_stop_next(ctx, sup);
}

static void s_child_died(krt_ctx_t *ctx, krt_sup_t *sup, size_t i, int reason)
{
    if (i == SIZE_MAX) {
        int r = sup->exit_reason;
        sup->mode = S_RUN;
        s_shutdown(ctx, sup, r);
        return;
    }
    s_child_t *c = &sup->ch[i];
    if (krt__stopping(ctx))
        return;
    bool abnormal = reason != KRT_EXIT_NORMAL && reason != KRT_EXIT_SHUTDOWN;
    if (c->restart == KRT_TEMPORARY) {
        c->removed = true;
        return;
    }
    if (c->restart == KRT_TRANSIENT && !abnormal)
        return;
    if (s_too_many(sup)) {
        krt_log_actor(ctx, KRT_LOG_WARN, "restart_intensity", "child=%s reason=%d", c->name,
                      reason);
        s_shutdown(ctx, sup, KRT_EXIT_ERROR);
        return;
    }
    switch (sup->strategy) {
    case KRT_ONE_FOR_ONE:
        c->restarts++;
        if (s_start(ctx, sup, i) != 0)
            s_shutdown(ctx, sup, KRT_EXIT_ERROR);
        break;
    case KRT_ONE_FOR_ALL:
        s_restart_group(ctx, sup, i, true);
        break;
    case KRT_REST_FOR_ONE:
        s_restart_group(ctx, sup, i, false);
        break;
    }
}

static void s_on_exit(krt_ctx_t *ctx, krt_sup_t *sup, const krt_exit_t *e)
{
    size_t i = 0;
    while (i < sup->n && (sup->ch[i].addr != e->who || sup->ch[i].removed))
        i++;
    if (i == sup->n) { /* parent or someone else: stop everything */
        if (e->reason != KRT_EXIT_NORMAL || e->who == krt_parent(ctx))
            s_shutdown(ctx, sup, e->reason == KRT_EXIT_NORMAL ? KRT_EXIT_SHUTDOWN : e->reason);
        return;
    }
    s_child_t *c = &sup->ch[i];
    s_set_addr(sup, c, KRT_ADDR_NONE);
    if (sup->mode == S_RUN) {
        s_child_died(ctx, sup, i, e->reason);
        if (sup->mode == S_RUN)
            s_compact(sup);
        return;
    }
    if (sup->i_stop < sup->n_stop && sup->stop[sup->i_stop] == i) {
        sup->i_stop++;
        s_stop_next(ctx, sup);
        return;
    }
    for (size_t k = sup->i_stop; k < sup->n_stop; k++)
        if (sup->stop[k] == i)
            return; /* it will be skipped when its turn comes */
    if (sup->mode == S_RESTART && !c->restart_me) {
        c->pending = true;
        c->pending_reason = e->reason;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Behaviour                                                                                  */

static void s_free(krt_sup_t *sup)
{
    for (size_t i = 0; i < sup->n; i++)
        free(sup->ch[i].name);
    free(sup->ch);
    free(sup->stop);
    free(sup->rt);
    pthread_mutex_destroy(&sup->lock);
}

static int s_init(krt_ctx_t *ctx, void *state, void *arg)
{
    krt_sup_t *sup = state;
    const krt_sup_spec_t *spec = arg;
    if (!spec)
        return KRT_EXIT_ERROR;
    pthread_mutex_init(&sup->lock, NULL);
    ctx->actor->flags |= KRT_AF_SUPERVISOR;
    krt_trap_exit(ctx, true);
    sup->strategy = spec->strategy;
    sup->intensity = spec->intensity < 0 ? 0 : spec->intensity;
    sup->period_ms = spec->period_ms < 0 ? 0 : spec->period_ms;
    sup->rt = calloc((size_t)sup->intensity + 1, sizeof *sup->rt);
    bool ok = sup->rt != NULL;
    for (size_t i = 0; ok && i < spec->n_children; i++)
        ok = s_add(sup, &spec->children[i]) == 0;
    for (size_t i = 0; ok && i < sup->n; i++)
        ok = s_start(ctx, sup, i) == 0;
    if (!ok) {
        s_free(sup); /* started children are linked: they go down with us */
        return KRT_EXIT_ERROR;
    }
    return 0;
}

static void s_handle(krt_ctx_t *ctx, void *state, const krt_msg_t *msg)
{
    krt_sup_t *sup = state;
    switch (msg->type) {
    case KRT_MSG_EXIT:
        s_on_exit(ctx, sup, msg->body);
        break;
    case KRT_MSG_STOP:
        s_shutdown(ctx, sup, KRT_EXIT_SHUTDOWN);
        break;
    case KRT_SUP_KILL_TYPE:
        if (sup->mode != S_RUN && sup->i_stop < sup->n_stop) {
            krt_addr_t who = sup->ch[sup->stop[sup->i_stop]].addr;
            if (who != KRT_ADDR_NONE)
                krt_kill(ctx, who, KRT_EXIT_KILLED);
        }
        break;
    case KRT_MSG_SUP_START_CHILD: {
        krt_sup_started_t r = {KRT_EINVAL, KRT_ADDR_NONE};
        if (msg->len == sizeof(krt_child_spec_t)) {
            if (sup->mode != S_RUN || krt__stopping(ctx))
                r.err = KRT_ESHUTDOWN;
            else if ((r.err = s_add(sup, msg->body)) == 0) {
                if ((r.err = s_start(ctx, sup, sup->n - 1)) == 0)
                    r.addr = sup->ch[sup->n - 1].addr;
                else
                    sup->ch[sup->n - 1].removed = true;
            }
        }
        krt_reply(ctx, msg, KRT_MSG_SUP_START_CHILD, &r, sizeof r);
        if (sup->mode == S_RUN)
            s_compact(sup);
        break;
    }
    default:
        break;
    }
}

static void s_terminate(krt_ctx_t *ctx, void *state, int reason)
{
    s_free(state);
}

static void s_describe(const void *state, char *out, size_t cap)
{
    const krt_sup_t *sup = state;
    static const char *const strat[] = {"one_for_one", "one_for_all", "rest_for_one"};
    snprintf(out, cap, "{\"strategy\":\"%s\",\"children\":%zu,\"intensity\":%d,\"period_ms\":%d}",
             strat[sup->strategy], sup->n, sup->intensity, sup->period_ms);
}

const krt_behaviour_t krt_supervisor_behaviour = {
    .kind = "supervisor",
    .state_size = sizeof(krt_sup_t),
    .init = s_init,
    .handle = s_handle,
    .terminate = s_terminate,
    .describe = s_describe,
};

/* ---------------------------------------------------------------------------------------- */
/* API                                                                                        */

static void s_spec_free(void *p)
{
    free(p);
}

/* One block: the spec, its children, their names. */
static krt_sup_spec_t *s_spec_copy(const krt_sup_spec_t *spec)
{
    size_t names = 0;
    for (size_t i = 0; i < spec->n_children; i++)
        names += (spec->children[i].name ? strlen(spec->children[i].name) : 0) + 1;
    size_t sz = sizeof(krt_sup_spec_t) + spec->n_children * sizeof(krt_child_spec_t) + names;
    krt_sup_spec_t *c = malloc(sz);
    if (!c)
        return NULL;
    *c = *spec;
    krt_child_spec_t *ch = (krt_child_spec_t *)(c + 1);
    char *p = (char *)(ch + spec->n_children);
    for (size_t i = 0; i < spec->n_children; i++) {
        ch[i] = spec->children[i];
        const char *n = spec->children[i].name ? spec->children[i].name : "";
        size_t len = strlen(n) + 1;
        memcpy(p, n, len);
        ch[i].name = p;
        p += len;
    }
    c->children = ch;
    return c;
}

int krt_supervisor_spawn(krt_system_t *sys, krt_ctx_t *ctx, const krt_sup_spec_t *spec,
                         const krt_spawn_opts_t *opts, krt_addr_t *out)
{
    if (ctx)
        sys = ctx->sys;
    if (!sys || !spec || (spec->n_children && !spec->children))
        return KRT_EINVAL;
    krt_sup_spec_t *copy = s_spec_copy(spec);
    if (!copy)
        return KRT_ENOMEM;
    krt_spawn_opts_t o = {0};
    if (opts)
        o = *opts;
    if (!ctx)
        o.link = o.monitor = false;
    return krt__spawn(sys, ctx, &krt_supervisor_behaviour, copy, s_spec_free, &o, 0,
                      KRT_AF_SUPERVISOR, out);
}

int krt_supervisor_start_child(krt_system_t *sys, krt_addr_t sup, const krt_child_spec_t *spec,
                               krt_addr_t *out)
{
    if (!sys || !spec)
        return KRT_EINVAL;
    krt_reply_t reply;
    int rc = krt_call(sys, sup, KRT_MSG_SUP_START_CHILD, spec, sizeof *spec, 10000, &reply);
    if (rc)
        return rc;
    krt_sup_started_t r = {KRT_EINVAL, KRT_ADDR_NONE};
    if (reply.len == sizeof r)
        memcpy(&r, reply.body, sizeof r);
    krt_reply_free(&reply);
    if (r.err == 0 && out)
        *out = r.addr;
    return r.err;
}

krt_addr_t krt_supervisor_child(krt_system_t *sys, krt_addr_t sup_addr, const char *name)
{
    if (!sys || !name)
        return KRT_ADDR_NONE;
    krt_actor_t *a = krt__acquire(sys, sup_addr);
    if (!a)
        return KRT_ADDR_NONE;
    krt_addr_t who = KRT_ADDR_NONE;
    if (a->b == &krt_supervisor_behaviour) { /* zeroed state: a valid, empty table */
        krt_sup_t *sup = (krt_sup_t *)a->state;
        pthread_mutex_lock(&sup->lock);
        for (size_t i = 0; i < sup->n; i++)
            if (!sup->ch[i].removed && strcmp(sup->ch[i].name, name) == 0)
                who = sup->ch[i].addr;
        pthread_mutex_unlock(&sup->lock);
    }
    krt__release(sys, sup_addr);
    return who;
}
