/*
 * ka_phases: how long each lifecycle phase of a sandbox took, for its status, the log
 * (`sandbox_phase` lines) and kagent_sandbox_phase_seconds. Any thread may report: the store
 * actor (the create's intent), the sandbox actor (intents of later mutations), its job thread
 * (compute start, snapshot copies) and the driver (waiting for the guest).
 *
 * A sandbox runs at most one phase at a time: ka_phase_next ends the running one (if any) and
 * starts the next, ka_phase_end ends it. The last duration of each phase is kept per sandbox in
 * a bounded table (KA_PHASES_SLOTS, direct-mapped by id: a sandbox whose slot another one took
 * has no timings any more; the histograms keep everything).
 */
#ifndef KA_PHASES_H
#define KA_PHASES_H

#include <stdbool.h>

#define KA_PHASES_SLOTS 4096

typedef enum {
    KA_PHASE_STORE_INTENT,    /* the intent (create: the record) written to the store */
    KA_PHASE_COMPUTE_START,   /* the driver starts the sandbox until its guest runs */
    KA_PHASE_GUEST_READY,     /* the guest runs until it says ready */
    KA_PHASE_SUSPEND_UPLOAD,  /* /data saved to the snapshot location */
    KA_PHASE_RESUME_DOWNLOAD, /* /data restored from the snapshot location */
    KA_PHASE_N_
} ka_phase_t;

/* The last measured timings of one sandbox; a negative value: not measured. */
typedef struct {
    double seconds[KA_PHASE_N_];
    double create_seconds; /* the create call until its READY answer */
} ka_phase_times_t;

/* "store_intent", "compute_start", ... (the label and JSON key of a phase). */
const char *ka_phase_name(ka_phase_t p);

/* Ends the running phase of sandbox id (if any) and starts p. */
void ka_phase_next(const char *id, ka_phase_t p);
/* Ends the running phase of sandbox id; nothing if none runs. */
void ka_phase_end(const char *id);
/* Records a phase measured by the caller. */
void ka_phase_record(const char *id, ka_phase_t p, double seconds);
/* The create of id answered READY after seconds: recorded and observed once per sandbox (an
 * idempotent replay answering READY again changes nothing). */
void ka_phase_created(const char *id, double seconds);

/* The timings of id: 0, or -ENOENT when none are known. */
int ka_phase_get(const char *id, ka_phase_times_t *out);

#endif
