/*
 * krt: the kagent actor runtime.
 *
 * The only header other layers include. It knows nothing of sandboxes: it is a general
 * actor library (actors, mailboxes, M:N schedulers, timers, supervision, registry,
 * request/reply, blocking-work threads, fd readiness, introspection, a transport hook for
 * remote nodes, structured logging).
 *
 * Conventions (see STYLE.md): functions return 0 or a negative errno-style code
 * (krt_strerror names it); `_new` returns NULL on failure; `_destroy(T **)` is idempotent and
 * NULLs the caller's pointer. Everything that takes a krt_ctx_t must be called from inside
 * that actor's handler (the context is only valid for the turn).
 */
#ifndef KRT_H
#define KRT_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                     */

#define KRT_OK        0
#define KRT_ENOACTOR  (-ESRCH)     /* no such actor: never existed or already stopped */
#define KRT_ETIMEDOUT (-ETIMEDOUT) /* a call's reply did not arrive in time */
#define KRT_ENOMEM    (-ENOMEM)    /* allocation failed */
#define KRT_ESHUTDOWN (-ESHUTDOWN) /* the system is stopping */
#define KRT_EINVAL    (-EINVAL)    /* bad argument */
#define KRT_EEXIST    (-EEXIST)    /* name already registered */
#define KRT_EREMOTE   (-EREMOTE)   /* destination is on a node no transport reaches */
#define KRT_EMSGSIZE  (-EMSGSIZE)  /* body too large, or a pointer body sent off-node */
#define KRT_ENOCONN   (-ENOTCONN)  /* the target's node went down (or is down) */

/* Returns a static description of a krt error code (or of any negative errno). */
const char *krt_strerror(int err);

/* ------------------------------------------------------------------------------------------ */
/* Addresses                                                                                  */

/*
 * An actor address: node id in the top 16 bits, node-local id in the low 48 bits. Local ids
 * are never reused while the system lives, so a stale address can never reach a new actor.
 * 0 is "no actor".
 */
typedef uint64_t krt_addr_t;

#define KRT_ADDR_NONE ((krt_addr_t)0)

static inline uint16_t krt_addr_node(krt_addr_t a)
{
    return (uint16_t)(a >> 48);
}

/* ------------------------------------------------------------------------------------------ */
/* Systems, actors, messages                                                                  */

typedef struct krt_system krt_system_t; /* one runtime instance: a node */
typedef struct krt_ctx krt_ctx_t;       /* an actor's view of the runtime during one turn */

/* Message types below KRT_MSG_USER are the runtime's own. */
enum {
    KRT_MSG_EXIT = 1,        /* a linked actor stopped (only if trapping exits); body krt_exit_t */
    KRT_MSG_DOWN,            /* a monitored actor stopped; body krt_down_t */
    KRT_MSG_FD_READY,        /* a watched fd is ready; body krt_fd_event_t */
    KRT_MSG_JOB_DONE,        /* a krt_job_submit job returned; body krt_job_done_t */
    KRT_MSG_STOP,            /* polite stop request (supervisor shutdown): the handler sees it, then
                                the actor exits with KRT_EXIT_SHUTDOWN unless it called krt_exit */
    KRT_MSG_SUP_START_CHILD, /* request to a supervisor: body krt_child_spec_t; the reply (same
                                type) carries a krt_sup_started_t */
    KRT_MSG_ERROR,           /* an error reply (krt_reply_error): status in msg->status, body the
                                NUL-terminated message */
    KRT_MSG_WHEREIS,         /* request to a node's service address (krt_node_addr): body a name;
                                the reply (same type) is the 8-byte little-endian address, or an
                                error reply KRT_ENOACTOR if nothing is registered under it */
    KRT_MSG_RELAY,           /* to a node's service address: a message for a name there, its
                                sender, ref and kind kept (krt_relay); never seen by actors */
    KRT_MSG_USER = 256
};

/* Exit reasons. Anything other than NORMAL and SHUTDOWN is abnormal (restarts transients). */
enum {
    KRT_EXIT_NORMAL = 0,   /* finished its work */
    KRT_EXIT_SHUTDOWN = 1, /* stopped by its supervisor or by system shutdown */
    KRT_EXIT_KILLED = 2,   /* killed (krt_kill), cannot be trapped */
    KRT_EXIT_NOPROC = 3,   /* link/monitor target was already dead */
    KRT_EXIT_NOCONN = 4,   /* the target's node is unreachable */
    KRT_EXIT_ERROR = 5     /* crashed: first application-defined error reason */
};

/* What a message is to the request machinery (the envelope's kind; it crosses nodes). */
enum {
    KRT_KIND_PLAIN = 0,   /* krt_send and runtime messages */
    KRT_KIND_REQUEST = 1, /* krt_request / krt_call: answer with krt_reply or krt_reply_error */
    KRT_KIND_REPLY = 2    /* an answer to a request (status 0) or an error reply (status < 0) */
};

/* A received message. Everything is borrowed for the duration of the handler call. The
 * envelope (type, from, ref, status, kind) travels unchanged to another node. */
typedef struct krt_msg {
    uint32_t type;    /* KRT_MSG_* or an application type >= KRT_MSG_USER */
    uint32_t len;     /* body length in bytes (0 for pointer bodies) */
    krt_addr_t from;  /* sender, KRT_ADDR_NONE for runtime-generated messages */
    uint64_t ref;     /* correlation id: set on requests and their replies, else 0 */
    const void *body; /* body bytes, or the pointer passed to krt_send_ptr */
    int32_t status;   /* replies: 0, or a negative errno-style code (an error reply) */
    uint8_t kind;     /* KRT_KIND_* */
} krt_msg_t;

typedef struct krt_exit {
    krt_addr_t who; /* the actor that stopped */
    int reason;     /* KRT_EXIT_* */
} krt_exit_t;

typedef struct krt_down {
    krt_addr_t who; /* the actor that stopped */
    uint64_t ref;   /* what krt_monitor returned */
    int reason;     /* KRT_EXIT_* */
} krt_down_t;

/*
 * What an actor is. Behaviours are static const tables; the state is allocated together with
 * the actor (state_size bytes, zeroed) and freed after terminate.
 */
typedef struct krt_behaviour {
    const char *kind;  /* short kind for introspection and logs: "sandbox", "store" */
    size_t state_size; /* bytes of per-actor state, allocated with the actor */
    /* Optional. Runs first, inside the actor. Non-zero return: the actor stops with that
     * reason before handling anything (a supervisor counts it as a failed start). */
    int (*init)(krt_ctx_t *ctx, void *state, void *arg);
    /* Required. One message; may send, spawn, arm timers, call krt_exit. */
    void (*handle)(krt_ctx_t *ctx, void *state, const krt_msg_t *msg);
    /* Optional. Runs once when the actor stops, whatever the reason; release resources. */
    void (*terminate)(krt_ctx_t *ctx, void *state, int reason);
    /* Optional. Appends a short JSON object describing the state to out (introspection). */
    void (*describe)(const void *state, char *out, size_t cap);
} krt_behaviour_t;

typedef struct krt_spawn_opts {
    const char *name; /* optional: local name (copied) for the tree view and registry */
    bool link;        /* link the new actor to the spawner */
    bool monitor;     /* monitor it; the DOWN ref is returned through *monitor_ref */
    uint64_t *monitor_ref;
    bool register_name; /* also register name in the system registry (fails if taken) */
} krt_spawn_opts_t;

typedef struct krt_config {
    uint16_t node_id; /* this node's id in addresses (1..65535), 1 by default */
    int schedulers;   /* scheduler threads; 0 = one per online CPU */
    int job_threads;  /* threads for blocking jobs; 0 = 2 */
    int turn_budget;  /* messages per actor per turn; 0 = 64 */
    const char *name; /* node name used as the root of actor paths ("node-1") */
} krt_config_t;

/* Creates a system (threads not started). NULL on failure. */
krt_system_t *krt_system_new(const krt_config_t *cfg);
/* Starts scheduler, timer and job threads. */
int krt_system_start(krt_system_t *sys);
/* Stops every actor (terminate runs, children before parents), joins threads. Idempotent.
 * Call it from outside the actors (from a handler it does nothing). */
void krt_system_stop(krt_system_t *sys);
/* Stops if needed and frees everything. Idempotent; NULLs *sys_p. */
void krt_system_destroy(krt_system_t **sys_p);
/* Blocks the calling (non-scheduler) thread until the actor stops or timeout_ms passes
 * (-1 = forever). Returns its exit reason (>= 0), KRT_ETIMEDOUT, KRT_ENOACTOR if it is already
 * gone, or KRT_EINVAL on a scheduler thread. */
int krt_system_wait(krt_system_t *sys, krt_addr_t who, int timeout_ms);

/* Spawns a top-level actor from outside any actor (parent = the system root). */
int krt_system_spawn(krt_system_t *sys, const krt_behaviour_t *b, void *arg,
                     const krt_spawn_opts_t *opts, krt_addr_t *out);
/* Sends from outside any actor (from = KRT_ADDR_NONE). Body copied. */
int krt_system_send(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len);

/* Reply from a krt_call / krt_call_async. body owned by the runtime until krt_reply_free. */
typedef struct krt_reply {
    uint32_t type;
    uint32_t len;
    void *body;
    int32_t status; /* 0, or the status of an error reply (type KRT_MSG_ERROR, body its
                       NUL-terminated message) */
} krt_reply_t;

/* Blocking request/reply from a non-actor thread (bridges). The target replies with
 * krt_reply() / krt_reply_error() (or later with krt_reply_to / krt_reply_error_to). Returns 0
 * and fills *reply when a reply arrived (reply->status < 0 for an error reply), or
 * KRT_ETIMEDOUT, KRT_ENOACTOR (target gone, or it stopped with the request unhandled),
 * KRT_EINVAL when called on a scheduler thread (inside an actor: use krt_request), and for a
 * target on another node KRT_EREMOTE (no transport reaches it) or KRT_ENOCONN (its node is or
 * goes down). */
int krt_call(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len,
             int timeout_ms, krt_reply_t *reply);
/* Callback form: cb runs exactly once on a runtime thread, with err 0 and the reply, with an
 * error reply's status and that reply, or with an error and reply NULL. It must not block. */
typedef void (*krt_call_cb)(void *user, int err, const krt_msg_t *reply);
int krt_call_async(krt_system_t *sys, krt_addr_t to, uint32_t type, const void *body, size_t len,
                   int timeout_ms, krt_call_cb cb, void *user);
void krt_reply_free(krt_reply_t *reply);

/* ------------------------------------------------------------------------------------------ */
/* Inside an actor                                                                            */

krt_addr_t krt_self(krt_ctx_t *ctx);
krt_addr_t krt_parent(krt_ctx_t *ctx);
krt_system_t *krt_ctx_system(krt_ctx_t *ctx);

int krt_spawn(krt_ctx_t *ctx, const krt_behaviour_t *b, void *arg, const krt_spawn_opts_t *opts,
              krt_addr_t *out);

/* Sends a copy of body (len bytes). Works for local and remote addresses alike. Messages from
 * one actor to another arrive in the order sent. A handler's second and later sends in a row to
 * one local actor may be held and pushed together (every 64 messages, and before its next send
 * elsewhere, its krt_spawn, a reply that completes a krt_call, a job, or when it returns):
 * effects the handler has on other threads by other means (its own pipes, sockets, locks) may be
 * seen before those. The actor such a run of sends goes to is not handed to an idle scheduler
 * meanwhile: unless it already runs elsewhere, it handles them after the turn, on this core. */
int krt_send(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, const void *body, size_t len);
/* Sends a pointer without copying (local addresses only). Ownership moves to the message:
 * if the receiver does not krt_msg_take() it, free_fn(ptr) runs after its handler (or when the
 * message is dropped because the receiver is gone). ptr is consumed even when this fails. */
int krt_send_ptr(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, void *ptr, void (*free_fn)(void *));
/* Takes ownership of a pointer body during the handler; the runtime will not free it. */
void *krt_msg_take(krt_ctx_t *ctx, const krt_msg_t *msg);

/*
 * Requests with callbacks. fn runs exactly once, inside the caller's own turn (ctx and state
 * are the caller's: it may touch its state, send, spawn, request again), with
 *   err 0 and the reply (reply->status 0);
 *   err < 0 and an error reply (type KRT_MSG_ERROR, reply->status == err, body its
 *         NUL-terminated message): the target's krt_reply_error, or the runtime's own:
 *         KRT_ENOACTOR when the target does not exist or stops before answering (a local
 *         target is watched; a remote one is answered for by its node if it is gone or still
 *         has the request queued), KRT_EREMOTE / KRT_EMSGSIZE when `to` is on a node no
 *         transport reaches or the body cannot go there;
 *   err KRT_ETIMEDOUT and reply NULL: timeout_ms > 0 passed without a reply (a later reply is
 *         dropped). timeout_ms <= 0: no timeout.
 * The same holds whether `to` is on this node or another (the envelope carries kind, ref and
 * status over the mesh). The runtime keeps the pending request (the caller keeps no list).
 * If the caller stops first, its pending requests are freed and fn is NOT called: memory that
 * user points to must be owned by the caller's state (or released in terminate).
 * Returns 0 (fn will run), or KRT_EINVAL / KRT_ENOMEM (nothing was sent; fn will not run).
 */
typedef void (*krt_reply_fn)(krt_ctx_t *ctx, void *state, void *user, int err,
                             const krt_msg_t *reply);
int krt_request(krt_ctx_t *ctx, krt_addr_t to, uint32_t type, const void *body, size_t len,
                int timeout_ms, krt_reply_fn fn, void *user);
/* Replies to msg (a request, or a krt_call) with a copy of body (status 0). */
int krt_reply(krt_ctx_t *ctx, const krt_msg_t *msg, uint32_t type, const void *body, size_t len);
/* Deferred reply: answers a request after its handler returned, given the request's msg->from
 * and msg->ref (saved by the replier). Works for krt_call requests too (from = KRT_ADDR_NONE). */
int krt_reply_to(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, uint32_t type, const void *body,
                 size_t len);
/* Error replies: the status (a negative errno-style code: -EINVAL, -ENOENT, -EPERM, -EEXIST,
 * -EAGAIN, -EBUSY, -ETIMEDOUT, -EIO, ...) travels in the envelope, message (may be NULL) as
 * the body. KRT_EINVAL if status >= 0. */
int krt_reply_error(krt_ctx_t *ctx, const krt_msg_t *req, int status, const char *message);
int krt_reply_error_to(krt_ctx_t *ctx, krt_addr_t to, uint64_t ref, int status,
                       const char *message);

/* Links are bidirectional: when one side stops abnormally, the other is killed with the same
 * reason unless it traps exits (then it receives KRT_MSG_EXIT). Linking to a dead actor
 * behaves as if it just exited with KRT_EXIT_NOPROC. */
int krt_link(krt_ctx_t *ctx, krt_addr_t other);
int krt_unlink(krt_ctx_t *ctx, krt_addr_t other);
void krt_trap_exit(krt_ctx_t *ctx, bool on);
/* Monitors are one-way: a KRT_MSG_DOWN arrives when target stops (at once with
 * KRT_EXIT_NOPROC if it is already dead). Returns the monitor ref (never 0). */
uint64_t krt_monitor(krt_ctx_t *ctx, krt_addr_t target);
void krt_demonitor(krt_ctx_t *ctx, uint64_t ref);

/* Stops this actor with reason once the current handler returns. */
void krt_exit(krt_ctx_t *ctx, int reason);
/* Asks another actor to stop with reason (KRT_EXIT_KILLED cannot be trapped). An actor that
 * traps exits receives other reasons as KRT_MSG_EXIT; one that does not stops, even with
 * KRT_EXIT_NORMAL. */
int krt_kill(krt_ctx_t *ctx, krt_addr_t who, int reason);
/* The same from outside any actor (the EXIT message's who is KRT_ADDR_NONE). */
int krt_system_kill(krt_system_t *sys, krt_addr_t who, int reason);

/* ------------------------------------------------------------------------------------------ */
/* Timers: a hierarchical timing wheel per scheduler, 1 ms tick. Timer entries live inside the
 * actor's state, so arming never allocates. A timer may only be armed/cancelled by the actor
 * that owns the state it is embedded in. A stopped actor's timers are cancelled by terminate
 * (the runtime does it for armed timers it knows of).                                          */

typedef struct krt_timer {
    uint64_t opaque_[8]; /* runtime-private; zero-initialised (state is zeroed) = idle */
} krt_timer_t;

/* Clocks in milliseconds: CLOCK_MONOTONIC for deadlines and durations, CLOCK_REALTIME for
 * timestamps. */
int64_t krt_mono_ms(void);
int64_t krt_wall_ms(void);

/* (Re)arms t: after delay_ms the owning actor receives a message of `type` (body empty, ref =
 * `ref`). Re-arming an armed timer moves it. The delay counts from the clock reading the
 * runtime takes once per message handled (at its first timer), so the timers one handler arms
 * share a start. */
int krt_timer_arm(krt_ctx_t *ctx, krt_timer_t *t, uint64_t delay_ms, uint32_t type, uint64_t ref);
/* Cancels t; true if it was armed and will not fire. Safe on an idle timer. */
bool krt_timer_cancel(krt_ctx_t *ctx, krt_timer_t *t);
bool krt_timer_armed(const krt_timer_t *t);
/* Sends a copy of body to `to` after delay_ms (allocates; not cancellable). */
int krt_send_after(krt_ctx_t *ctx, krt_addr_t to, uint64_t delay_ms, uint32_t type,
                   const void *body, size_t len);
/* Milliseconds on the runtime's monotonic clock. */
uint64_t krt_now_ms(void);
/* *dl = now on clock + timeout_ms (>= 0; a negative timeout leaves now), for timed waits
 * (pthread_cond_timedwait on a condition variable using that clock). */
void krt_deadline(clockid_t clock, int timeout_ms, struct timespec *dl);

/* ------------------------------------------------------------------------------------------ */
/* Blocking work and file descriptors: nothing blocks a scheduler thread.                     */

typedef struct krt_job_done {
    void *arg;  /* the arg given to krt_job_submit */
    int result; /* what fn returned */
} krt_job_done_t;

/* Runs fn(arg) on a job thread; then the actor receives KRT_MSG_JOB_DONE (ref = *ref). */
int krt_job_submit(krt_ctx_t *ctx, int (*fn)(void *arg), void *arg, uint64_t *ref);

enum { KRT_FD_READ = 1, KRT_FD_WRITE = 2 };
typedef struct krt_fd_event {
    int fd;
    uint32_t events; /* KRT_FD_* that are ready */
    uint64_t tag;    /* what was given to krt_fd_watch */
} krt_fd_event_t;
/* One-shot readiness notification: when fd becomes ready for any of events, the actor
 * receives KRT_MSG_FD_READY; watch again to get the next one. */
int krt_fd_watch(krt_ctx_t *ctx, int fd, uint32_t events, uint64_t tag);
int krt_fd_unwatch(krt_ctx_t *ctx, int fd);

/* ------------------------------------------------------------------------------------------ */
/* Supervision (OTP semantics)                                                                */

typedef enum { KRT_ONE_FOR_ONE, KRT_ONE_FOR_ALL, KRT_REST_FOR_ONE } krt_strategy_t;
typedef enum {
    KRT_PERMANENT, /* always restarted */
    KRT_TRANSIENT, /* restarted only after an abnormal exit */
    KRT_TEMPORARY  /* never restarted */
} krt_restart_t;

typedef struct krt_child_spec {
    const char *name; /* unique among the supervisor's children */
    const krt_behaviour_t *behaviour;
    void *arg; /* passed to init at every (re)start */
    krt_restart_t restart;
    bool register_name; /* register name in the system registry at every (re)start, so peers
                           find the current address with krt_whereis */
} krt_child_spec_t;

typedef struct krt_sup_spec {
    krt_strategy_t strategy;
    int intensity;                    /* at most this many restarts ... */
    int period_ms;                    /* ... within this window, else the supervisor itself exits */
    const krt_child_spec_t *children; /* spawned in order (their inits run asynchronously,
                                         each before any message to that child), stopped in
                                         reverse */
    size_t n_children;
} krt_sup_spec_t;

/* The supervisor behaviour, for nesting: a child spec {behaviour = &krt_supervisor_behaviour,
 * arg = (const krt_sup_spec_t *)...} (that spec must outlive the child; it is copied at each
 * start). A supervisor traps exits; KRT_MSG_STOP or an exit signal from a non-child stops its
 * children in reverse order, then itself. After too many restarts it stops its children and
 * exits with KRT_EXIT_ERROR. */
extern const krt_behaviour_t krt_supervisor_behaviour;

/* Spawns a supervisor (spec copied). From an actor (ctx) or from outside (ctx NULL, sys). */
int krt_supervisor_spawn(krt_system_t *sys, krt_ctx_t *ctx, const krt_sup_spec_t *spec,
                         const krt_spawn_opts_t *opts, krt_addr_t *out);
/* Adds a child to a running supervisor (from outside or inside an actor, via a message);
 * *out receives the child's address. Blocking form for non-actor threads only. */
int krt_supervisor_start_child(krt_system_t *sys, krt_addr_t sup, const krt_child_spec_t *spec,
                               krt_addr_t *out);
typedef struct krt_sup_started {
    int err;         /* 0 or a krt error */
    krt_addr_t addr; /* the new child */
} krt_sup_started_t;

/* Current address of a supervisor's child by name (changes after restarts); KRT_ADDR_NONE if
 * it is not running. Safe from any thread. */
krt_addr_t krt_supervisor_child(krt_system_t *sys, krt_addr_t sup, const char *name);

/* ------------------------------------------------------------------------------------------ */
/* Registry: names -> addresses. A name is released when its actor stops.                     */

int krt_register(krt_system_t *sys, const char *name, krt_addr_t who);
int krt_unregister(krt_system_t *sys, const char *name);
krt_addr_t krt_whereis(krt_system_t *sys, const char *name);

/* ------------------------------------------------------------------------------------------ */
/* Remote nodes. The mesh implements a transport; the runtime calls send() for every message to
 * an address whose node is not this one. Inbound messages are handed to krt_system_deliver. */

typedef struct krt_transport {
    /* Called on any runtime thread; must not block. msg->body is len bytes (copied mode).
     * Returns 0 or a negative code (the send fails with it). */
    int (*send)(void *self, krt_addr_t to, const krt_msg_t *msg);
    void *self;
    /* Optional: the sends of this thread since the last flush may go now. The runtime calls
     * it at the end of every scheduler turn that sent remotely, and right after each send made
     * off the schedulers, so a transport may batch a turn's sends into one write. */
    void (*flush)(void *self);
} krt_transport_t;

void krt_system_set_transport(krt_system_t *sys, const krt_transport_t *t);
/* Delivers a message that arrived from another node to a local actor, envelope kept: a reply
 * completes its pending request (or is dropped if that timed out); a request whose target is
 * gone is answered with an error reply (KRT_ENOACTOR) through the transport. Returns 0,
 * KRT_ENOACTOR or KRT_EREMOTE (to is not on this node). */
int krt_system_deliver(krt_system_t *sys, krt_addr_t to, const krt_msg_t *msg);
uint16_t krt_system_node_id(const krt_system_t *sys);

/*
 * Location transparency. Links, monitors, krt_kill, krt_request and krt_call work for actors
 * on other nodes (runtime signals travel as PLAIN envelopes of reserved types below
 * KRT_MSG_USER). When the transport declares a node down (heartbeats lost, its goodbye, a
 * disconnect, a restart under a new incarnation) it calls krt_system_node_down: every local
 * link to an actor there delivers its exit with KRT_EXIT_NOCONN, every monitor a DOWN with
 * KRT_EXIT_NOCONN, every pending krt_request / krt_call to it fails at once with KRT_ENOCONN.
 * Safe from any thread.
 */
void krt_system_node_down(krt_system_t *sys, uint16_t node);

/* The service address of a node: requests to it are answered by that node's runtime
 * (KRT_MSG_WHEREIS). */
static inline krt_addr_t krt_node_addr(uint16_t node)
{
    return (krt_addr_t)node << 48;
}

/* Resolves "name" (this node's registry) or "name@N" / "name@node-N" (node N's registry,
 * over the transport) from a non-actor thread. 0 and *out, KRT_ENOACTOR (not registered),
 * KRT_EINVAL (bad form, or on a scheduler thread), or the call's error (KRT_ENOCONN,
 * KRT_EREMOTE, KRT_ETIMEDOUT). */
int krt_whereis_at(krt_system_t *sys, const char *name, int timeout_ms, krt_addr_t *out);
/* Forwards a message to the actor registered as `name` on node `node` (this one or another),
 * its sender, ref and kind kept from msg (Erlang's {Name, Node} ! Msg, sender unchanged): a
 * request relayed this way is answered by that actor straight to the original caller, and the
 * caller's timeout and node-down rules are as for any request. body/len is what is sent (msg's
 * own, or a rewritten copy); the type is msg's. A relay of a krt_call (from none) to another
 * node carries this node's service address, so the reply comes back through the transport.
 * Only this node's callers can be relayed to another node (a node speaks only for its own
 * actors). 0; KRT_ENOACTOR when nothing is registered under name here (the caller is not
 * answered: the relayer decides); on another node an unknown name answers a request with an
 * error reply KRT_ENOACTOR; KRT_EINVAL for a name too long or a reply; or the send's error. */
int krt_relay(krt_ctx_t *ctx, uint16_t node, const char *name, const krt_msg_t *msg,
              const void *body, size_t len);
/* krt_request to the actor registered as `name` on node `node` (this one or another), in one
 * message (no lookup first): the pending request is with that node, so its going down fails
 * the request at once (KRT_ENOCONN); a name it does not know answers KRT_ENOACTOR. type must be
 * an application type (>= KRT_MSG_USER). Returns as krt_request. */
int krt_request_name(krt_ctx_t *ctx, uint16_t node, const char *name, uint32_t type,
                     const void *body, size_t len, int timeout_ms, krt_reply_fn fn, void *user);
/* krt_call to a name as krt_whereis_at resolves it (timeout_ms covers both steps). */
int krt_call_name(krt_system_t *sys, const char *name, uint32_t type, const void *body, size_t len,
                  int timeout_ms, krt_reply_t *reply);

/* ------------------------------------------------------------------------------------------ */
/* Introspection                                                                              */

/* Writes a JSON dump of the actor tree rooted at root (KRT_ADDR_NONE = whole system):
 * [{"addr","kind","name","path","state","mailbox","handled","restarts","bytes","children":[..]}].
 * Returns a malloc'd string the caller frees, or NULL. Safe from any thread. */
char *krt_tree_json(krt_system_t *sys, krt_addr_t root);

typedef struct krt_stats {
    uint64_t actors_live;
    uint64_t actors_spawned;
    uint64_t messages;
    uint64_t timers_armed;
    uint64_t bytes_live;  /* actor structs + state + queued messages */
    uint64_t bytes_spare; /* freed actor blocks the schedulers keep for reuse (bounded) */
} krt_stats_t;
void krt_system_stats(krt_system_t *sys, krt_stats_t *out);

/* ------------------------------------------------------------------------------------------ */
/* Structured logging: one line per event, key=value (text) or one JSON object (json).       */

typedef enum { KRT_LOG_DEBUG, KRT_LOG_INFO, KRT_LOG_WARN, KRT_LOG_ERROR } krt_log_level_t;

/* Process-wide settings; defaults: info, text, stderr. */
void krt_log_configure(krt_log_level_t level, bool json, FILE *out);
/* Parses "debug|info|warn|error"; -1 if unknown. */
int krt_log_level_parse(const char *s);
bool krt_log_enabled(krt_log_level_t level);
/* path: actor path or component ("node-1/store"); event: a short snake_case word;
 * fmt: printf-style "key=value key2=%d" pairs (values with spaces are the caller's to quote). */
void krt_log(krt_log_level_t level, const char *path, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void krt_vlog(krt_log_level_t level, const char *path, const char *event, const char *fmt,
              va_list ap);
/* Logs with the actor's path. */
void krt_log_actor(krt_ctx_t *ctx, krt_log_level_t level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#include "krt_codec.h"
#include "krt_mesh.h"

#ifdef __cplusplus
}
#endif
#endif /* KRT_H */
