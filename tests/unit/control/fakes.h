/*
 * Fakes for the control actors' unit test: a driver whose sandboxes are a thread speaking the
 * real guest protocol over a socketpair (the fake guest) with a real /data directory, a store
 * actor holding records in memory, and a templates actor. No root, no PostgreSQL.
 *
 * Every knob is set by the test thread under F.lock; the actors read it under the same lock.
 */
#ifndef TEST_CONTROL_FAKES_H
#define TEST_CONTROL_FAKES_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "control_msgs.h"
#include "ka_driver.h"
#include "krt.h"

#define F_MAX_RECORDS 64
#define F_MAX_WRITES  512

/* One store write as the fake store saw it. */
typedef struct f_write {
    char id[KA_STORE_ID_LEN];
    int state; /* KA_STATE_DELETED for a tombstone */
    int operation;
    char reason[KA_STORE_REASON_LEN];
} f_write_t;

typedef struct f_state {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char dir[256]; /* the test's scratch directory */
    /* store */
    ka_store_sandbox_t records[F_MAX_RECORDS];
    int n_records;
    int receipts; /* KA_STORE_SANDBOX_RECEIPT reads */
    f_write_t writes[F_MAX_WRITES];
    int n_writes;
    int fail_writes;     /* the next n updates/tombstones answer KA_STORE_EUNAVAIL */
    int fail_op;         /* ... only those setting this operation (-1: any) */
    bool fail_tombstone; /* only tombstones */
    int hold_op;         /* updates setting this operation wait for f_release (-1: none) */
    int held;            /* how many are held now */
    /* driver */
    bool gate_start;    /* starts wait for f_open_gate */
    int in_start;       /* starts waiting at the gate */
    int fail_start;     /* the next n starts fail -EIO */
    int fail_halt;      /* the next n halts fail -EIO */
    int guest_dies;     /* the next n fake guests exit as soon as they run */
    int fail_freeze;    /* the next n freezes fail -EBUSY */
    int freezes, thaws; /* counts */
    int frozen;         /* fake sandboxes frozen now */
    int stopped_frozen; /* stops (or parks) of a sandbox still frozen */
    int starts, stops;  /* counts */
    int fail_fork;      /* the next n fork copies fail -EDQUOT */
    bool gate_fork;     /* fork copies wait for f_open_gate */
    int in_fork;        /* fork copies waiting at the gate */
    int forks;          /* fork copies made */
    int forks_frozen;   /* ... of which while the source was frozen */
    int live;           /* fake sandboxes running now */
    struct {
        char id[KA_STORE_ID_LEN];
        char data[PATH_MAX];
    } kept[F_MAX_RECORDS]; /* /data parked for a later start of the same id */
    int n_kept;
    /* templates */
    char revision[KA_STORE_REV_LEN]; /* what resolves pin ("" = "rev-1"), WorkerPool kagent-default
                                      */
    /* guest */
    int guest_requests; /* requests the fake guests received */
    int guest_starts;   /* of which "start" */
} f_state_t;

extern f_state_t F;

extern const krt_behaviour_t f_store_behaviour;
extern const krt_behaviour_t f_templates_behaviour;

void f_reset(const char *dir);
ka_driver_t *f_driver_new(void);
/* Releases the held store updates. */
void f_release(krt_system_t *sys, krt_addr_t store);
void f_open_gate(void);
/* Waits (up to ms) until cond(arg) holds under F.lock; false on timeout. */
bool f_wait(bool (*cond)(void *), void *arg, int ms);
/* A copy of the record with id (false if none). */
bool f_record(const char *id, ka_store_sandbox_t *out);
/* Adds a record as if an earlier node had written it. */
void f_put_record(const ka_store_sandbox_t *r);
/* The writes for id in order, as "STATE/OP[/reason]" joined by spaces, into out. */
void f_history(const char *id, char *out, size_t cap);

#endif
