/*
 * sandbox_int: what the sandbox actor's two halves share. sandbox.c is its lifecycle (the
 * state machine, store writes, jobs); sandbox_guest.c its guest channel (calls multiplexed by
 * id, every reply frame checked, routed to its caller, with monitors and deadlines).
 */
#ifndef KA_SANDBOX_INT_H
#define KA_SANDBOX_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "guestconn.h"
#include "ka_guestcalls.h"
#include "sandboxes.h"

/* The states of a sandbox actor (sandbox.c has the transition table). */
typedef enum {
    KA_SBX_CREATING,   /* compute booting, then READY being written; replays wait */
    KA_SBX_READY,      /* guest calls served */
    KA_SBX_SUSPENDING, /* intent, then /data saved and compute stopped, then SUSPENDED written */
    KA_SBX_SUSPENDED,  /* no compute; /data saved (snapshot, or kept where it was) */
    KA_SBX_RESUMING,   /* runtime, intent, compute booted on /data, READY written */
    KA_SBX_DELETING,   /* intent, compute and data removed, tombstone written */
    KA_SBX_DELETED,    /* tombstone: answers from the record until the manager stops it */
    KA_SBX_FAILED,     /* compute unusable (kept until delete); only delete or expiry move on */
    KA_SBX_PAUSED,     /* READY with every process frozen (cgroup freezer): memory kept, no CPU;
                        * not persisted (the record stays READY), guest calls refused */
    KA_SBX_FORKING,    /* READY, frozen while a job copies it for forks the manager recorded;
                        * not persisted (the forks' records are the intent) */
    KA_SBX_N_STATES
} ka_sbx_state_t;

/* What a lifecycle operation waits for: its phase. */
typedef enum {
    KA_PH_IDLE,    /* nothing runs */
    KA_PH_RUNTIME, /* resume: the pinned revision's runtime from the templates actor */
    KA_PH_INTENT,  /* the store persists the intent */
    KA_PH_JOB,     /* the blocking part runs on a job thread */
    KA_PH_RESULT   /* the store persists the result (sent again while the store is away) */
} ka_sbx_phase_t;

/* Someone waiting for an answer: ref != 0 a request (krt_reply_to). */
typedef struct ka_sbx_caller {
    krt_addr_t to;
    uint64_t ref;
    uint32_t type; /* KA_SBX_*: the reply's shape */
} ka_sbx_caller_t;

typedef struct ka_sbx_joiner ka_sbx_joiner_t;
struct ka_sbx_joiner {
    ka_sbx_joiner_t *next;
    ka_sbx_caller_t c;
};

typedef struct ka_sbx_job ka_sbx_job_t;

/* The running operation (at most one). */
typedef struct ka_sbx_op {
    ka_sbx_phase_t phase;
    bool answer;                     /* caller waits (an expiry or a mark has none) */
    ka_sbx_caller_t caller;          /* who gets the result */
    ka_sbx_joiner_t *joiners;        /* create: replays waiting for its answer */
    bool delete_queued;              /* a delete (or expiry) waits for this operation to end */
    bool delete_answer;              /* ... and someone waits for it */
    ka_sbx_caller_t deleter;         /* ... who */
    int before;                      /* ka_sbx_state_t to go back to if the intent is lost */
    int before_op;                   /* the record's operation then */
    int target;                      /* ka_sbx_state_t entered once the result is written */
    uint64_t ref;                    /* the job in flight */
    bool asking;                     /* a store / templates request in flight */
    ka_sbx_job_t *job;               /* in flight on a job thread */
    ka_store_sandbox_update_t write; /* the result write, kept to be sent again */
    int code;                        /* what the caller gets once it is written (0: the */
    char message[512];               /* record; else this negative errno, e.g. storage away) */
} ka_sbx_op_t;

typedef struct ka_sbx {
    ka_sandbox_args_t a; /* a.record is the live record */
    ka_sbx_state_t state;
    ka_sbx_op_t op;
    ka_sbx_joiner_t *reads; /* gets waiting for the store's record (answered if it stops) */
    ka_sandbox_t *compute;
    krt_timer_t ttl;
    krt_timer_t retry; /* a result write sent again */
    /* the guest channel (sandbox_guest.c) */
    ka_guestconn_t *gc;
    bool watching;
    bool released;       /* KA_SBX_RELEASED_ sent: FAILED, holding no compute */
    uint32_t watch_ev;   /* what the armed watch waits for */
    ka_gc_table_t calls; /* guest calls in flight, each checked frame by frame */
    krt_timer_t sweep;   /* their deadlines */
    uint64_t dropped;    /* guest frames dropped (forged or stale) */
    /* the guest went away while an operation ran: applied when it ends */
    char lost_reason[KA_STORE_REASON_LEN];
    char lost_message[KA_STORE_MESSAGE_LEN];
} ka_sbx_t;

/* Timer and internal message types of the sandbox actor. */
#define KA_SBX_MSG_TTL        (KA_CTL_MSG_LAST_ + 1)
#define KA_SBX_MSG_RETRY      (KA_CTL_MSG_LAST_ + 2)
#define KA_SBX_MSG_SWEEP      (KA_CTL_MSG_LAST_ + 3)
#define KA_SBX_MSG_GUEST_MORE (KA_CTL_MSG_LAST_ + 4)

/* ---- sandbox_guest.c ---------------------------------------------------------------------- */

/* Takes the compute's guest channel (calls of an earlier guest end UNAVAILABLE). */
void ka_sbx_guest_attach(krt_ctx_t *ctx, ka_sbx_t *self);
/* Stops watching and closes the channel (the compute keeps running). */
void ka_sbx_guest_detach(krt_ctx_t *ctx, ka_sbx_t *self);
/* Ends every open guest call with err (a negative errno) and message. */
void ka_sbx_guest_fail_all(krt_ctx_t *ctx, ka_sbx_t *self, int err, const char *message);
/* A guest call the state machine let through (body checked, caller owns the sandbox). */
void ka_sbx_guest_call(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t from, uint64_t ref,
                       const ka_guest_req_t *q);
/* True if body (len bytes) is a well-formed ka_guest_req_t. */
bool ka_sbx_guest_req_ok(const void *body, size_t len);
void ka_sbx_guest_cancel(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t from);
void ka_sbx_guest_credit(krt_ctx_t *ctx, ka_sbx_t *self, krt_addr_t from, const void *body,
                         size_t len);
/* Reads and routes what the guest sent (from_fd: the one-shot watch fired). */
void ka_sbx_guest_io(krt_ctx_t *ctx, ka_sbx_t *self, bool from_fd);
void ka_sbx_guest_sweep(krt_ctx_t *ctx, ka_sbx_t *self);
/* The open calls' idle time starts again (the sandbox was unpaused: it was not the guest's). */
void ka_sbx_guest_touch(ka_sbx_t *self);

/* ---- sandbox.c ---------------------------------------------------------------------------- */

/* The guest went away (exited, or broke the protocol and was killed): an event for the state
 * machine. The channel is already closed and its calls ended. */
void ka_sbx_on_guest_exit(krt_ctx_t *ctx, ka_sbx_t *self, const char *reason, const char *message);
/* Events or transitions the table forbids that happened in this process (0 unless a bug). */
uint64_t ka_sandbox_fsm_violations(void);

#endif
