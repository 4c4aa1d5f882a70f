/*
 * ka_fsframes: the check of the Files API's guest frames (guest_proto.h "list", "stat",
 * "watch"), and their decoding into the fixed records the node passes on.
 *
 * The guest is hostile: a listing must hold at most the entries asked for, each a well-formed
 * entry (a name of 1-255 bytes without '/' or NUL, and not "." or ".."; a known type; the
 * mode's permission bits only), in strictly increasing byte order and all after the page
 * token; a stat carries one entry (its name may be "." for the root); a watch event is one
 * known kind with paths that stay relative (no leading '/', no "." or ".." component, no
 * empty component). Anything else is a protocol violation (the caller kills the guest).
 * Each check returns NULL when the frame fits, else a static reason.
 */
#ifndef KA_FSFRAMES_H
#define KA_FSFRAMES_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guest_proto.h"

/* One entry as the node passes it on. */
typedef struct ka_fs_entry {
    char name[KA_GP_NAME_MAX + 1];
    uint32_t type; /* KA_GP_FT_* */
    uint32_t mode; /* permission bits */
    uint64_t size;
    int64_t mtime_ms;
} ka_fs_entry_t;

/* A listing page (or a stat: count 1). */
typedef struct ka_fs_page {
    uint32_t count;
    uint32_t more; /* 1: entries after the last one exist */
    ka_fs_entry_t entries[];
} ka_fs_page_t;

/* A listing's end frame m for a request with page token after and page size limit. */
const char *ka_fsf_check_list(const msgpack_object *m, const char *after, uint32_t limit);
/* A stat's end frame m. */
const char *ka_fsf_check_stat(const msgpack_object *m);
/* A watch event payload p[0..n). */
const char *ka_fsf_check_event(const char *p, size_t n);
/* Decodes a checked listing ("entries") or stat ("entry") end frame: a page (malloc'd, caller
 * frees) and its size in *len; NULL if out of memory or the frame does not check. */
ka_fs_page_t *ka_fsf_page(const msgpack_object *m, size_t *len);
/* The parts of a checked event payload: kind (without KA_GP_EV_ISDIR), dir flag, paths
 * (borrowed from p; from is "" unless MOVE). */
void ka_fsf_event(const char *p, int *kind, bool *dir, const char **path, const char **from);

#endif
