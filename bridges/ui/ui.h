/*
 * kb_ui: the operators' page at /ui on the node's port: the actor tree (live, collapsible,
 * searchable), sandboxes, templates and their revisions with Ready, nodes and pools, and small
 * live charts (creates/s, create->READY and exec latency percentiles, live sandboxes, memory).
 * One self-contained HTML document embedded in the binary (no CDN, no fonts from outside), which
 * polls GET /ui/api/state (JSON) every second.
 *
 * Who may read it: the same identities as the API (kb_auth). A request carries its identity as
 * the API's do (authorization: Bearer, x-user-id, or a TLS client certificate), or in the
 * HttpOnly cookie that the login form (POST /ui/login) sets: the token in tokens mode, the user
 * id in user-header mode (loopback only). An operator (kb_auth_is_operator) sees every sandbox
 * of the node with its owner; anyone else sees only their own sandboxes, and the actor tree without
 * other identities' sandbox actors. The Host header must be one of allowed_hosts (DNS rebinding:
 * a page from elsewhere must not read it through a name it controls).
 *
 * Routes: GET /ui (page; /ui/ redirects there), GET /ui/api/state, POST /ui/login (form: token= or
 * user=; 303 to /ui), POST /ui/logout (clears the cookie).
 */
#ifndef KB_UI_H
#define KB_UI_H

#include <stdbool.h>
#include <stddef.h>

#include "api.h"
#include "auth.h"
#include "http.h"
#include "ka_driver.h"
#include "service.h"

#define KB_UI_COOKIE "kagent_ui"

typedef struct kb_ui kb_ui_t;

typedef struct {
    ka_service_t *svc;     /* required */
    const kb_auth_t *auth; /* required */
    ka_driver_t *driver;   /* sandboxes' cpu and memory; NULL: not shown */
    const char *node_name; /* this node */
    int node_id;
    const char *endpoint; /* host:port */
    const char *version;
    const kb_api_pool_t *pools;
    size_t n_pools;
    const char *const *allowed_hosts; /* NULL-terminated Host values; NULL: localhost, 127.0.0.1 */
    bool tls;                         /* the port speaks TLS: the cookie is Secure */
} kb_ui_options_t;

/* Registers the routes on http (before connections arrive). Everything in opts is borrowed and
 * must outlive the ui. NULL on failure. */
kb_ui_t *kb_ui_new(kb_http_t *http, const kb_ui_options_t *opts);
/* After the HTTP server is destroyed. Idempotent; NULLs *ui_p. */
void kb_ui_destroy(kb_ui_t **ui_p);

#endif
