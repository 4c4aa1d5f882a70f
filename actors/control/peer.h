/*
 * ka_peer: the current address of a long-lived node actor, by its registered name. The node's
 * supervisor restarts a crashed store, images, templates or sandboxes actor under the same name
 * and a new address, so an actor resolves its peers at the point of sending, never at init.
 * KRT_ADDR_NONE while the peer is down: a send or request to it fails with KRT_ENOACTOR.
 */
#ifndef KA_PEER_H
#define KA_PEER_H

#include "krt.h"

static inline krt_addr_t ka_peer(krt_ctx_t *ctx, const char *name)
{
    return krt_whereis(krt_ctx_system(ctx), name);
}

#endif
