/*
 * ka_identity: who this node is in the cluster, kept in its state directory.
 *
 *   <stateDir>/cluster/node-id   the node id (1..65535, the top 16 bits of its actor addresses):
 *                                node.id when configured, else allocated once from the
 *                                database (sequence ka_node_ids, a row in ka_nodes reserving
 *                                it) and kept here, so a restart keeps its id
 *   <stateDir>/cluster/mesh.key  its CURVE keypair (z85 public then secret, one per line),
 *                                generated on first start, mode 0600
 *
 * Blocking (files, a short libpq connection when the id is allocated): node start only.
 */
#ifndef KA_IDENTITY_H
#define KA_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#define KA_IDENTITY_KEY_LEN 41 /* z85 key and NUL */

typedef struct ka_identity {
    uint16_t node_id;
    char public_key[KA_IDENTITY_KEY_LEN];
    char secret_key[KA_IDENTITY_KEY_LEN];
} ka_identity_t;

/* Loads (or creates) the identity. configured_id: node.id (0 = from the file or the database);
 * conninfo: the database (migrated here first, so the sequence exists); name: the node's name,
 * written in the reserved row. 0, or -1 with err set. */
int ka_identity_load(const char *state_dir, int configured_id, const char *conninfo,
                     const char *name, ka_identity_t *out, char *err, size_t errcap);

#endif
