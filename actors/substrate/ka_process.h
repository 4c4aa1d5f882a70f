/*
 * ka_process: one krt actor per exec process in a sandbox. It starts the process through the
 * sandbox's guest link (ka_guestlink) with output following, and keeps its state: the guest's
 * process id and pid, how many stdout/stderr bytes exist so far (the offsets a client resumes
 * from; the bytes themselves stay spooled in the guest), the exit, and the actors waiting for
 * it. The actor stays alive after the process exits (its owner stops it).
 *
 * Requests (krt_request / krt_call), each answered with KA_PROC_INFO (body ka_process_info_t):
 *   KA_PROC_GET     now
 *   KA_PROC_WAIT    once the process has exited or failed (at once if it already has); at
 *                   most KA_PROC_MAX_WAITERS wait, more are answered at once with err -EBUSY
 *   KA_PROC_SIGNAL  body int: the signal goes to the process group; answered at once
 *   KA_PROC_INPUT   body: one flags byte (KA_PROC_INPUT_CLOSE) then the bytes for stdin
 *                   (the process must have been started with stdin_open); answered at once,
 *                   delivery is in order with other input
 */
#ifndef KA_PROCESS_H
#define KA_PROCESS_H

#include "guestconn.h"
#include "krt.h"

#define KA_PROC_MAX_WAITERS 32

enum {
    KA_PROC_GET = KRT_MSG_USER + 0x610,
    KA_PROC_WAIT,
    KA_PROC_SIGNAL,
    KA_PROC_INFO, /* the reply */
    KA_PROC_INPUT,
};

#define KA_PROC_INPUT_CLOSE 1 /* close stdin after these bytes */

typedef enum {
    KA_PROC_STARTING = 0, /* asked the guest, no answer yet */
    KA_PROC_RUNNING,
    KA_PROC_EXITED,
    KA_PROC_FAILED /* never started (err says why) or the guest went away */
} ka_proc_state_t;

typedef struct ka_process_info {
    int state;     /* ka_proc_state_t */
    int err;       /* FAILED: negative errno from the guest (-ENOENT, -EAGAIN...) or -ECONNRESET;
                      -EBUSY on a WAIT refused for too many waiters */
    uint64_t proc; /* the guest's process id (0 until RUNNING) */
    int64_t pid;   /* in the sandbox's PID namespace */
    int exit_code; /* EXITED: status, or 128+signal */
    uint64_t stdout_bytes; /* output produced so far (= the offset to resume from) */
    uint64_t stderr_bytes;
    uint64_t started_ms, finished_ms; /* unix ms from the guest; 0 = not yet */
} ka_process_info_t;

typedef struct ka_process_args ka_process_args_t;

/* What to spawn: the link actor's address and the start request (copied). NULL on failure. */
ka_process_args_t *ka_process_args_new(krt_addr_t link, const ka_gp_start_t *st);
void ka_process_args_free(ka_process_args_t *a);

/* The behaviour; arg is a ka_process_args_t that the actor takes over (if the spawn call
 * fails, the caller still owns it). */
extern const krt_behaviour_t ka_process_behaviour;

#endif
