/*
 * ka_guestcalls: the node's table of the guest requests in flight on one channel, and the
 * check every reply frame from the guest passes before anything acts on it.
 *
 * The guest is hostile (its sandbox's code may have replaced it): a frame is delivered only if
 * it answers a request this node issued and is still open, and only if it is what that
 * request can get (data of the right kind, in order, within the credit the node granted; an
 * end frame with the process the request named). Frames with ids the node never issued are
 * forged, frames for requests already finished are stale: both are dropped and counted.
 * Anything else that does not fit is a protocol violation: the caller kills the guest.
 *
 * Not thread-safe: one owner (the sandbox actor). The counters are global and atomic.
 */
#ifndef KA_GUESTCALLS_H
#define KA_GUESTCALLS_H

#include "guestconn.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KA_GC_UNARY,  /* one end frame, nothing checked but its shape (input, write, ping) */
    KA_GC_START,  /* one end frame with the new process (or an error) */
    KA_GC_PROC,   /* get, signal: one end frame with the process asked about */
    KA_GC_READ,   /* "chunk" frames, then an end frame whose "size" is their total */
    KA_GC_OUTPUT, /* stdout/stderr frames at the asked offsets, then an end (exit: that proc) */
    KA_GC_FOLLOW, /* start with follow: a process frame, then as OUTPUT for that process */
    KA_GC_INPUT,  /* input: one end frame whose "written" is exactly the bytes sent */
    KA_GC_LIST,   /* one end frame: a listing page (ka_fsframes.h), after `after`, <= limit */
    KA_GC_STAT,   /* one end frame: one entry */
    KA_GC_WATCH,  /* "event" frames (ka_fsframes.h), never an end but an error or a cancel */
} ka_gc_kind_t;

typedef struct ka_gc_call ka_gc_call_t;
struct ka_gc_call {
    ka_gc_call_t *next;
    uint64_t id;
    ka_gc_kind_t kind;
    uint64_t proc;    /* PROC, OUTPUT: asked about; FOLLOW: from its first frame */
    uint64_t off[2];  /* OUTPUT, FOLLOW: the next stdout / stderr offset expected */
    uint64_t credit;  /* data bytes the guest may still send (UINT64_MAX: not bound) */
    uint64_t unacked; /* data delivered and not yet returned as credit */
    uint64_t total;   /* data bytes received */
    bool begun;       /* FOLLOW: the process frame came */
    uint64_t last_ms; /* when its last frame came (or when it was issued) */
    uint64_t sent;    /* INPUT: data bytes the request carried (set by the owner) */
    void *user;       /* the owner's; freed by the owner */
    char *after;      /* LIST: the page token (owned; NULL = from the first) */
    uint32_t limit;   /* LIST: the page size asked for */
};

typedef struct ka_gc_table {
    ka_gc_call_t *head;
    size_t n, n_streams;
} ka_gc_table_t;

typedef enum {
    KA_GC_DELIVER, /* act on it: *call is its request */
    KA_GC_DROP,    /* forged, stale or a keepalive: nothing to do (counted) */
    KA_GC_FATAL,   /* protocol violation: *why says which; kill the guest */
} ka_gc_verdict_t;

typedef struct ka_gc_stats {
    uint64_t frames;     /* frames checked */
    uint64_t forged;     /* ids never issued */
    uint64_t stale;      /* ids of requests already finished or cancelled */
    uint64_t violations; /* frames that broke the protocol */
} ka_gc_stats_t;

bool ka_gc_kind_streams(ka_gc_kind_t kind);
/* Adds request id (from the guestconn) of kind. proc: the process for PROC/OUTPUT; off: the
 * asked output offsets (OUTPUT); window: credit (0: not bound). NULL on allocation failure. */
ka_gc_call_t *ka_gc_add(ka_gc_table_t *t, uint64_t id, ka_gc_kind_t kind, uint64_t proc,
                        const uint64_t off[2], uint64_t window, uint64_t now_ms, void *user);
/* How many open calls are of kind. */
size_t ka_gc_count(const ka_gc_table_t *t, ka_gc_kind_t kind);
/* Unlinks and frees call (and its after; not its user). */
void ka_gc_remove(ka_gc_table_t *t, ka_gc_call_t *call);
/*
 * Checks frame f, which came on the channel whose last issued id is last_id. DELIVER: *call is
 * its request (an end frame finishes it: the caller removes it). Updates the request's credit,
 * offsets and last_ms. *why: a static reason for DROP and FATAL.
 */
ka_gc_verdict_t ka_gc_check(ka_gc_table_t *t, uint64_t last_id, const ka_gp_frame_t *f,
                            uint64_t now_ms, ka_gc_call_t **call, const char **why);
/* The owner's reader consumed bytes: returns how much credit to give back to the guest
 * (at most what was delivered and not yet returned) and adds it to the call's credit. */
uint64_t ka_gc_credit(ka_gc_call_t *call, uint64_t bytes);
/* Counts one violation (a FATAL verdict, or a frame guestconn refused: oversize, bad msgpack). */
void ka_gc_count_violation(void);
void ka_gc_stats(ka_gc_stats_t *out);

#endif
