/*
 * guest_proto: the wire protocol between a node and its sandbox guest (kagent-sandbox-guest).
 *
 * Shared by the guest (linked statically) and the node side (actors/substrate/guestconn).
 *
 * Transport: a unix stream socket. The node hands the guest one end at start (inherited as fd
 * KA_GP_CHANNEL_FD); the guest can also connect to a socket path bind-mounted into the sandbox
 * (--socket). Never the network.
 *
 * Framing: 4-byte big-endian length, then that many bytes holding one msgpack map. Frames
 * larger than KA_GP_MAX_FRAME (node -> guest) or KA_GP_MAX_REPLY (guest -> node) are a
 * protocol error (the connection is dropped). The node checks every guest frame with
 * ka_gp_frame_check before decoding it: every declared length and count must fit in it.
 *
 * Flow control (credits): a streaming request ("read", "output", "start" with follow) may
 * carry "window" (uint, bytes). The guest then sends at most that many data bytes ("chunk",
 * "stdout", "stderr" payloads) on the stream before the node returns credit with
 * {"op": "credit", "target": stream id, "bytes": n} (no reply). Without "window" the stream
 * is not credit-bound. A guest that sends past its credit breaks the protocol (the node kills
 * it). A stream that has sent nothing for KA_GP_KEEPALIVE_MS sends a keepalive frame {"id"}
 * (no data, no "end"), so the node can tell a quiet stream from a dead guest.
 *
 * Requests (node -> guest) are maps with "op" (str) and "id" (uint, chosen by the node, echoed
 * in every reply frame). Replies (guest -> node) are maps with "id" and:
 *   - "err" (negative errno-style int) and "msg" (str) on failure, with "end": true;
 *   - otherwise op-specific keys; the last frame of a reply carries "end": true.
 * Frame with "id" 0 and "ev": "ready" is the guest's first frame (keys "version", "pid").
 *
 * Ops and their keys:
 *   "ping"   -> {"end"}
 *   "start"  argv [str], cwd str?, env {str:str}?, stdin bool?, timeout_ms uint?, follow bool?,
 *            tty bool?, rows uint?, cols uint? (tty: a pseudo terminal is stdin, stdout and
 *            stderr and the controlling terminal of a new session; its output is "stdout")
 *            -> {"process": P, "end"}   errors: -EAGAIN (10 running), -ENOENT (no program),
 *               -EINVAL (bad argv/cwd)
 *            with follow: {"process": P}, then the frames of "output" with follow from
 *            offset 0, ending with {"exit": P, "end"} (one round trip for run-and-wait)
 *   "get"    proc uint -> {"process": P, "end"}          -ENOENT: no such process
 *   "signal" proc uint, signal int -> {"process": P, "end"}   (to the process group)
 *   "input"  proc uint, data bin?, close bool? -> {"written": uint, "end"}
 *            answered once the process has taken every byte (written = the bytes of data);
 *            close on a tty writes its EOF character (VEOF) instead of closing.
 *            -EPIPE if the process was started without stdin or its stdin is closed
 *            -EBUSY while an earlier input of the process is unanswered
 *   "resize" proc uint, rows uint, cols uint -> {"process": P, "end"}   -ENOTTY: no tty
 *   "output" proc uint, stdout_offset uint?, stderr_offset uint?, follow bool?
 *            -> frames {"stdout"|"stderr": bin, "offset": uint} ..., then
 *               {"exit": P?, "end"}; with follow the stream ends only once the process has
 *               exited (and carries "exit"); without it, when what is spooled has been sent.
 *   "read"   path str, mode uint? -> frames {"chunk": bin} ..., then {"size": uint, "end"}
 *            -ENOENT (missing and mode 0), -EFBIG (> 64 MiB), -EACCES (escape)
 *   "write"  path str, mode uint?, seek_offset uint?, data bin -> {"written": uint, "end"}
 *            seek_offset 0 truncates; > 0 writes at the offset and keeps the rest.
 *   "cancel" target uint (id of an "output" or "read" stream) -> {"end"} (the cancelled
 *            stream gets its own {"end"} first)
 *   "credit" target uint, bytes uint -> no reply (see flow control)
 *   "list"   path str?, after str?, limit uint? -> {"entries": [E], "more": bool, "end"}
 *            the entries named after `after` (bytewise), at most limit (guest_fsops.h)
 *   "stat"   path str? -> {"entry": E, "end"}
 *   "remove" path str, recursive bool? -> {"end"}
 *   "mkdir"  path str, parents bool?, mode uint? -> {"end"}
 *   "move"   path str, to str, overwrite bool? -> {"end"}
 *            errors of these: -ENOENT, -EEXIST, -ENOTDIR, -ENOTEMPTY, -EINVAL, -EACCES, -EPERM
 *   "watch"  path str?, window uint? -> frames {"event": bin} ... until cancelled (credit
 *            counts event bytes); the payload is guest_watch.h's. -EMFILE past KA_GP_MAX_WATCHES.
 *
 * E, a directory entry: [name str, type uint (1 file, 2 dir, 3 symlink, 4 other), size uint,
 *                        mode uint (07777 bits), mtime_ms int].
 *
 * P, a process: {"proc": uint, "argv": [str], "pid": int, "state": uint (KA_GP_STATE_*),
 *                "exit_code": int, "started_ms": uint, "finished_ms": uint} (unix ms; 0 = not
 *                yet). exit_code is 128+signal for a signal death.
 *
 * A process is its process group: signals and the timeout go to the group, and when the
 * process itself exits, whatever it left running in its group is killed.
 */
#ifndef KA_GUEST_PROTO_H
#define KA_GUEST_PROTO_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KA_GP_VERSION    1
#define KA_GP_CHANNEL_FD 3             /* the inherited channel in the guest */
#define KA_GP_MAX_FRAME  ((65u << 20)) /* node -> guest: 64 MiB file + headroom */
#define KA_GP_MAX_REPLY                                                                            \
    ((2u << 20) + (64u << 10))               /* guest -> node: a chunk, or a process + argv        \
                                              */
#define KA_GP_WINDOW       (2u << 20)        /* data bytes in flight per stream (credit) */
#define KA_GP_KEEPALIVE_MS 15000             /* a quiet stream's keepalive period */
#define KA_GP_FILE_CAP     (64u << 20)       /* file read/write transfer cap */
#define KA_GP_CHUNK        (512u << 10)      /* bytes per output / read chunk frame */
#define KA_GP_MAX_PROCS    10                /* concurrent running processes (default) */
#define KA_GP_TIMEOUT_MS   (3600u * 1000u)   /* default process timeout */
#define KA_GP_SPOOL_CAP    (10u << 20)       /* bytes spooled per stream (default) */
#define KA_GP_UID          65532             /* uid/gid user processes run as */
#define KA_GP_WORKSPACE    "/data/workspace" /* default cwd, root of the file API */
#define KA_GP_LOG_DIR      "/data/guest-logs"
#define KA_GP_GUEST_PATH   "/run/kagent/guest"

enum { KA_GP_STATE_RUNNING = 1, KA_GP_STATE_EXITED = 2 };

/* The Files API ops ("list" ... "watch"): entry types, event kinds and limits. */
enum { KA_GP_FT_FILE = 1, KA_GP_FT_DIR = 2, KA_GP_FT_SYMLINK = 3, KA_GP_FT_OTHER = 4 };
enum {
    KA_GP_EV_CREATE = 1,
    KA_GP_EV_MODIFY = 2,
    KA_GP_EV_DELETE = 3,
    KA_GP_EV_MOVE = 4,
    KA_GP_EV_OVERFLOW = 5 /* events were lost; the watch goes on */
};
#define KA_GP_EV_ISDIR     0x80        /* or'ed into an event's kind byte */
#define KA_GP_NAME_MAX     255         /* bytes of one name */
#define KA_GP_PATH_MAX     4095        /* bytes of an event's path */
#define KA_GP_PAGE_DEF     500         /* "list" entries by default */
#define KA_GP_PAGE_MAX     1000        /* and at most */
#define KA_GP_MAX_WATCHES  8           /* watches per sandbox */
#define KA_GP_WATCH_WINDOW (64u << 10) /* event bytes in flight per watch (credit) */

/* A decoded process record (strings borrowed from the frame it came from). */
typedef struct ka_gp_process {
    uint64_t proc;
    int64_t pid;
    uint32_t state; /* KA_GP_STATE_* */
    int64_t exit_code;
    uint64_t started_ms;
    uint64_t finished_ms;
} ka_gp_process_t;

/* --- framing ------------------------------------------------------------------------------ */

/* Starts a frame in sb (appends a 4-byte length placeholder); returns the frame's offset. */
size_t ka_gp_frame_begin(msgpack_sbuffer *sb);
/* Patches the length of the frame started at off. */
void ka_gp_frame_end(msgpack_sbuffer *sb, size_t off);
/*
 * Looks for one complete frame at buf[0..len). Returns the bytes it spans (header included)
 * and sets *body and *blen, 0 if more bytes are needed, or -EMSGSIZE if it announces more than
 * max bytes.
 */
long ka_gp_frame_next(const uint8_t *buf, size_t len, size_t max, const uint8_t **body,
                      size_t *blen);

/*
 * Checks that body[0..len) starts with one msgpack object whose every declared length and count
 * fits in the bytes there (each element takes at least one byte), before msgpack_unpack_next
 * sizes its allocations from those counts: a 5-byte map header announcing 2^32 entries would
 * make it allocate 100 GB. 0 or -EBADMSG.
 */
int ka_gp_frame_check(const uint8_t *body, size_t len);

/* --- reading maps ------------------------------------------------------------------------- */

/* The value under key in map m, or NULL (also if m is not a map). Borrowed. */
const msgpack_object *ka_gp_get(const msgpack_object *m, const char *key);
/* Typed getters: true and *out set if key exists with a compatible type. */
bool ka_gp_get_u64(const msgpack_object *m, const char *key, uint64_t *out);
bool ka_gp_get_i64(const msgpack_object *m, const char *key, int64_t *out);
bool ka_gp_get_bool(const msgpack_object *m, const char *key, bool *out);
/* str or bin; *p borrowed from the frame. */
bool ka_gp_get_bytes(const msgpack_object *m, const char *key, const char **p, size_t *n);
/* Decodes a process map P. 0 or -EBADMSG. */
int ka_gp_process_decode(const msgpack_object *m, ka_gp_process_t *out);

/* --- writing maps ------------------------------------------------------------------------- */

void ka_gp_pack_cstr(msgpack_packer *pk, const char *s);
void ka_gp_pack_bytes(msgpack_packer *pk, const void *p, size_t n, bool bin);

#endif /* KA_GUEST_PROTO_H */
