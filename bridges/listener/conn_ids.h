/* kb_conn_ids: identities of connections, keyed by the socket a bridge holds for each.
 *
 * The TLS relay records a verified client certificate's identity for the plaintext socket it
 * hands to gRPC core or libmicrohttpd, and forgets it when the connection ends; the bridges look
 * it up with the socket they serve a request on (kb_auth_identify_conn). It outlives both sides:
 * create it before the listener, destroy it after the servers. Thread-safe.
 */
#ifndef KB_CONN_IDS_H
#define KB_CONN_IDS_H

#include <stddef.h>

typedef struct kb_conn_ids kb_conn_ids_t;

kb_conn_ids_t *kb_conn_ids_new(void);
/* Records (id non-NULL, copied) or forgets fd's identity. 0, or -ENOMEM (nothing recorded: the
 * connection then has no identity of its own), -EINVAL (fd < 0). */
int kb_conn_ids_set(kb_conn_ids_t *t, int fd, const char *id);
/* Copies fd's identity into out: 0, or -ENOENT (none, or longer than cap - 1). */
int kb_conn_ids_get(kb_conn_ids_t *t, int fd, char *out, size_t cap);
/* Idempotent; NULLs *t_p. */
void kb_conn_ids_destroy(kb_conn_ids_t **t_p);

#endif
