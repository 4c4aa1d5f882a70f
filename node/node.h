/*
 * ka_node: the composition root. Starts one node from its configuration (the database,
 * the actor runtime, the store, images, the isolation driver, templates, sandboxes, the
 * service layer, and the gRPC/HTTP/MCP bridges on one port) and stops it in reverse order.
 *
 * This is the only place that knows every module; each module only gets its own options.
 */
#ifndef KA_NODE_H
#define KA_NODE_H

#include <stddef.h>

#include "config.h"

typedef struct ka_node ka_node_t;

#define KA_NODE_ERR_CAP 512

/* Starts everything (blocking: a few hundred ms, more on the first start when the embedded
 * database is created). NULL on failure with err set; nothing is left running. */
ka_node_t *ka_node_start(const ka_config_t *cfg, char *err, size_t errcap);
/* Re-reads listen.tls's certificate, key and client CA (SIGHUP): new connections use them.
 * 0, or -1 with err set; on failure the previous ones stay in use. */
int ka_node_reload_tls(ka_node_t *node, char *err, size_t errcap);
/* The port the node serves (useful with listen.port 0). */
int ka_node_port(const ka_node_t *node);
/* The node id (node.id, or the one allocated from the database). */
int ka_node_id(const ka_node_t *node);
/* Stops everything in reverse order: no sandbox, mount or database process is left behind.
 * Idempotent; NULLs *node_p. */
void ka_node_stop(ka_node_t **node_p);

#endif
