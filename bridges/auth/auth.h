/*
 * kb_auth: who is calling. One identity model for both bridges (gRPC metadata and MCP HTTP
 * headers): the caller's identity is what every ownership check in the control plane uses.
 *
 *   user-header  trusts the `x-user-id` value (the CLI's --user-id, admin@kagent.dev by
 *                default); a request without one is refused; the node refuses this mode unless
 *                it listens on loopback only.
 *   tokens       `authorization: Bearer <token>`; the tokens file maps the SHA-256 (hex) of each
 *                token to an identity, one "<sha256-hex> <identity>" per line ('#' comments), so
 *                the file never holds a usable secret. Anything else is UNAUTHENTICATED.
 *
 * A connection can carry its own identity (a verified TLS client certificate, see
 * kb_listener_conn_identity): kb_auth_identify_conn asks the lookup set with
 * kb_auth_set_conn_lookup, and that identity replaces the headers' in either mode.
 *
 * Some identities are operators (kb_auth_set_operators, the node's auth.operators).
 */
#ifndef KB_AUTH_H
#define KB_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#define KB_AUTH_ID_MAX 255

typedef enum { KB_AUTH_USER_HEADER, KB_AUTH_TOKENS } kb_auth_mode_t;

typedef struct kb_auth kb_auth_t;

/* tokens_file is read once (tokens mode only). NULL on failure with *err a negative errno and
 * why (if not NULL) a readable reason naming the file and line. */
kb_auth_t *kb_auth_new(kb_auth_mode_t mode, const char *tokens_file, int *err, char *why,
                       size_t why_cap);
void kb_auth_destroy(kb_auth_t **a_p);
kb_auth_mode_t kb_auth_mode(const kb_auth_t *a);

/* Resolves the caller from the two header values (either may be NULL). 0 and the identity in
 * out, or -EACCES with out holding the message for an UNAUTHENTICATED answer. Thread-safe. */
int kb_auth_identify(const kb_auth_t *a, const char *authorization, const char *user_id, char *out,
                     size_t cap);

/* Resolves the identity of the connection whose socket the bridge holds as fd: 0 and the
 * identity in out, or -ENOENT. Must be thread-safe. */
typedef int (*kb_auth_conn_fn)(int fd, char *out, size_t cap, void *arg);
/* Sets (fn non-NULL) or clears the lookup. Before the bridges serve. */
void kb_auth_set_conn_lookup(kb_auth_t *a, kb_auth_conn_fn fn, void *arg);
/* kb_auth_identify for a request on connection fd (-1 = unknown): the connection's own
 * identity when it has one, else the headers'. */
int kb_auth_identify_conn(const kb_auth_t *a, int fd, const char *authorization,
                          const char *user_id, char *out, size_t cap);

/* Operators: identities that see every identity's sandboxes where operators look (the actor
 * tree, /ui). Copies ids; replaces an earlier list. Before the bridges serve. 0 or -ENOMEM
 * (the list is then empty). */
int kb_auth_set_operators(kb_auth_t *a, const char *const *ids, size_t n);
/* True if id is one of the operators. Thread-safe. */
bool kb_auth_is_operator(const kb_auth_t *a, const char *id);

#endif
