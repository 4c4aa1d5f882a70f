/*
 * guestconn: the node side of the guest protocol (actors/guest/guest_proto.h).
 *
 * A connection wraps the exec channel fd (non-blocking). Request functions encode one frame
 * into the send queue and return its id; ka_guestconn_flush() writes what the socket takes.
 * ka_guestconn_recv() returns the next complete reply frame without blocking, so a process
 * actor can drive it from fd-readiness messages (krt_fd_watch). ka_guestconn_wait() and
 * ka_guestconn_call() are blocking helpers for threads that may block (tests, benchmarks,
 * krt jobs).
 *
 * Not thread-safe: one user at a time.
 */
#ifndef KA_GUESTCONN_H
#define KA_GUESTCONN_H

#include "guest_proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ka_guestconn ka_guestconn_t;
typedef struct ka_gp_frame ka_gp_frame_t;

/* What to start (borrowed for the call). env entries are "KEY=VALUE". */
typedef struct ka_gp_start {
    const char *const *argv; /* NULL-terminated, non-empty */
    const char *cwd;         /* NULL: the workspace */
    const char *const *env;  /* NULL-terminated overlay; may be NULL */
    bool stdin_open;         /* false: stdin reads /dev/null, input is refused */
    uint64_t timeout_ms;     /* 0: the guest default (1 h) */
    bool follow; /* also stream the output from 0 and end with the exit (one round trip) */
    bool tty;    /* on a pseudo terminal of rows x cols (0: 24 x 80) */
    uint32_t rows, cols;
} ka_gp_start_t;

/* Wraps fd (made non-blocking). own_fd: close it on destroy. NULL on failure. */
ka_guestconn_t *ka_guestconn_new(int fd, bool own_fd);
/* Idempotent; NULLs *gc_p. */
void ka_guestconn_destroy(ka_guestconn_t **gc_p);
int ka_guestconn_fd(const ka_guestconn_t *gc);
/* Stream requests made from now on carry a credit window of bytes (guest_proto.h flow
 * control); the caller returns credit with ka_guestconn_credit as it consumes data. 0: off. */
void ka_guestconn_set_window(ka_guestconn_t *gc, uint64_t bytes);
/* The highest request id issued so far (ids are 1, 2, ...): a reply id above it is forged. */
uint64_t ka_guestconn_last_id(const ka_guestconn_t *gc);

/* Requests: each queues one frame; *id (may be NULL) gets its id. 0 or -ENOMEM/-EINVAL. */
int ka_guestconn_ping(ka_guestconn_t *gc, uint64_t *id);
int ka_guestconn_start(ka_guestconn_t *gc, const ka_gp_start_t *req, uint64_t *id);
int ka_guestconn_get(ka_guestconn_t *gc, uint64_t proc, uint64_t *id);
int ka_guestconn_signal(ka_guestconn_t *gc, uint64_t proc, int sig, uint64_t *id);
int ka_guestconn_input(ka_guestconn_t *gc, uint64_t proc, const void *data, size_t len,
                       bool close_after, uint64_t *id);
int ka_guestconn_output(ka_guestconn_t *gc, uint64_t proc, uint64_t stdout_off, uint64_t stderr_off,
                        bool follow, uint64_t *id);
int ka_guestconn_read(ka_guestconn_t *gc, const char *path, uint32_t mode, uint64_t *id);
int ka_guestconn_write(ka_guestconn_t *gc, const char *path, uint32_t mode, uint64_t seek,
                       const void *data, size_t len, uint64_t *id);
int ka_guestconn_cancel(ka_guestconn_t *gc, uint64_t target, uint64_t *id);
int ka_guestconn_resize(ka_guestconn_t *gc, uint64_t proc, uint32_t rows, uint32_t cols,
                        uint64_t *id);
/* A Files API request (guest_proto.h "list" ... "watch"; borrowed for the call). */
typedef struct ka_gp_fs {
    const char *op;    /* "list", "stat", "remove", "mkdir", "move" or "watch" */
    const char *path;  /* "" = the workspace */
    const char *to;    /* move: the destination */
    const char *after; /* list: the page token (NULL or "" = from the first) */
    uint32_t limit;    /* list: the page size */
    bool flag;         /* remove: recursive; mkdir: parents; move: overwrite */
    uint32_t mode;     /* mkdir */
    uint64_t window;   /* watch: credit in event bytes */
} ka_gp_fs_t;
int ka_guestconn_fs(ka_guestconn_t *gc, const ka_gp_fs_t *req, uint64_t *id);
/* Returns bytes of credit to stream target (no reply). */
int ka_guestconn_credit(ka_guestconn_t *gc, uint64_t target, uint64_t bytes);

/* Writes queued bytes: 0 when all are sent, -EAGAIN if some remain, else -errno. */
int ka_guestconn_flush(ka_guestconn_t *gc);
bool ka_guestconn_pending(const ka_guestconn_t *gc);
/* Next reply frame (caller frees): 0, -EAGAIN (none yet), -ECONNRESET (guest gone), or a
 * protocol error: -EMSGSIZE (a frame over KA_GP_MAX_REPLY), -EBADMSG (not one bounded msgpack
 * map, see ka_gp_frame_check). After a protocol error the connection is unusable. */
int ka_guestconn_recv(ka_guestconn_t *gc, ka_gp_frame_t **out);
/* Blocking: flushes and waits up to timeout_ms (-1 forever) for the next frame. */
int ka_guestconn_wait(ka_guestconn_t *gc, int timeout_ms, ka_gp_frame_t **out);

/* Called for each data frame of a call: key is "stdout", "stderr" or "chunk". */
typedef void (*ka_gp_data_cb)(void *user, const char *key, const char *data, size_t len,
                              uint64_t offset);
/*
 * Blocking: waits for the frames of request id until its end frame, which it returns in
 * *final (caller frees; may be NULL to discard). Data frames go to cb. Frames of other
 * requests are dropped. Returns 0, the request's error (negative errno from the guest), or a
 * transport error (-ETIMEDOUT, -ECONNRESET, -EPROTO).
 */
int ka_guestconn_call(ka_guestconn_t *gc, uint64_t id, int timeout_ms, ka_gp_data_cb cb, void *user,
                      ka_gp_frame_t **final);

/* Frame accessors. The map and anything taken from it live as long as the frame. */
uint64_t ka_gp_frame_id(const ka_gp_frame_t *f);
bool ka_gp_frame_is_end(const ka_gp_frame_t *f);
int ka_gp_frame_err(const ka_gp_frame_t *f);         /* 0 or the guest's negative errno */
const char *ka_gp_frame_msg(const ka_gp_frame_t *f); /* error message or "" (NUL-terminated) */
const msgpack_object *ka_gp_frame_map(const ka_gp_frame_t *f);
/* Decodes the "process" (or "exit") process record. 0 or -ENOENT. */
int ka_gp_frame_process(const ka_gp_frame_t *f, ka_gp_process_t *out);
void ka_gp_frame_free(ka_gp_frame_t **f_p);

#endif
