/* kb_ui: routes, identities (headers, TLS client certificates or the login cookie), the page. */
#include "ui_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORM_MAX  2048
#define LOG_PATH  "bridges/ui"
#define JSON_TYPE "application/json"
#define TEXT_TYPE "text/plain; charset=utf-8"
/* The page runs its own inline script and style and talks only to this origin. */
#define PAGE_CSP                                                                                   \
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "                  \
    "connect-src 'self'; img-src data:; form-action 'self'; frame-ancestors 'none'; "              \
    "base-uri 'none'"

static const char *const s_default_hosts[] = {"localhost", "127.0.0.1", "[::1]", NULL};

static void s_plain(kb_http_req_t *req, unsigned status, const char *msg)
{
    kb_http_respond(req, status, TEXT_TYPE, msg, strlen(msg));
}

static void s_json(kb_http_req_t *req, unsigned status, json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) {
        s_plain(req, 500, "out of memory\n");
        return;
    }
    kb_http_req_add_header(req, "Cache-Control", "no-store");
    kb_http_respond(req, status, JSON_TYPE, text, strlen(text));
    free(text);
}

/* Host check first: false (and answered 403) when the request came through a foreign name. */
static bool s_host_ok(kb_ui_t *ui, kb_http_req_t *req)
{
    const char *const *hosts = ui->o.allowed_hosts ? ui->o.allowed_hosts : s_default_hosts;
    if (kb_http_host_allowed(hosts, kb_http_req_header(req, "Host")))
        return true;
    s_plain(req, 403, "Forbidden: Host header not allowed\n");
    return false;
}

/* The caller from the request's headers, its connection, or the login cookie: 0 and the
 * identity in out, or -EACCES with out holding why. */
static int s_identify(kb_ui_t *ui, kb_http_req_t *req, char *out, size_t cap)
{
    const char *authz = kb_http_req_header(req, "Authorization");
    const char *user = kb_http_req_header(req, "x-user-id");
    char cookie[KB_AUTH_ID_MAX + 1], bearer[KB_AUTH_ID_MAX + 8];
    if (!authz && !user &&
        kb_http_cookie(kb_http_req_header(req, "Cookie"), KB_UI_COOKIE, cookie, sizeof cookie) ==
            0) {
        if (kb_auth_mode(ui->o.auth) == KB_AUTH_TOKENS) {
            snprintf(bearer, sizeof bearer, "Bearer %s", cookie);
            authz = bearer;
        } else {
            user = cookie;
        }
    }
    return kb_auth_identify_conn(ui->o.auth, kb_http_req_conn_fd(req), authz, user, out, cap);
}

static void s_page(kb_http_req_t *req, void *arg)
{
    if (!s_host_ok(arg, req))
        return;
    kb_http_req_add_header(req, "Content-Security-Policy", PAGE_CSP);
    kb_http_req_add_header(req, "X-Content-Type-Options", "nosniff");
    kb_http_req_add_header(req, "Referrer-Policy", "no-referrer");
    kb_http_respond(req, 200, "text/html; charset=utf-8", kb_ui_html, kb_ui_html_len);
}

static void s_state(kb_http_req_t *req, void *arg)
{
    kb_ui_t *ui = arg;
    if (!s_host_ok(ui, req))
        return;
    char caller[KB_AUTH_ID_MAX + 1];
    if (s_identify(ui, req, caller, sizeof caller)) {
        const char *mode = kb_auth_mode(ui->o.auth) == KB_AUTH_TOKENS ? "tokens" : "user-header";
        s_json(req, 401, json_pack("{s:s,s:s}", "error", caller, "mode", mode));
        return;
    }
    s_json(req, 200, kb_ui_state(ui, caller, kb_auth_is_operator(ui->o.auth, caller)));
}

/* ---- login -------------------------------------------------------------------------------- */

static int s_unhex(char c)
{
    return isdigit((unsigned char)c) ? c - '0' : (tolower((unsigned char)c) - 'a' + 10);
}

/* The url-decoded value of `name` in an application/x-www-form-urlencoded body: 0, or
 * -ENOENT / -EINVAL (bad escape, NUL, longer than cap - 1). */
static int s_form_value(const char *body, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = body; *p;) {
        size_t len = strcspn(p, "&");
        if (len >= nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            size_t o = 0;
            for (const char *v = p + nl + 1; v < p + len; v++) {
                char c = *v;
                if (c == '+')
                    c = ' ';
                else if (c == '%') {
                    if (p + len - v < 3 || !isxdigit((unsigned char)v[1]) ||
                        !isxdigit((unsigned char)v[2]))
                        return -EINVAL;
                    c = (char)(s_unhex(v[1]) * 16 + s_unhex(v[2]));
                    v += 2;
                }
                if (c == '\0' || o + 1 >= cap)
                    return -EINVAL;
                out[o++] = c;
            }
            out[o] = '\0';
            return 0;
        }
        p += len + (p[len] == '&');
    }
    return -ENOENT;
}

/* A value we can put in a cookie as is (RFC 6265 cookie-octet). */
static bool s_cookie_safe(const char *v)
{
    if (!*v)
        return false;
    for (; *v; v++)
        if ((unsigned char)*v <= 0x20 || (unsigned char)*v >= 0x7f || strchr("\";,\\", *v))
            return false;
    return true;
}

static void s_redirect(kb_http_req_t *req, const char *to)
{
    kb_http_req_add_header(req, "Location", to);
    kb_http_req_add_header(req, "Cache-Control", "no-store");
    s_plain(req, 303, "see /ui\n");
}

static void s_login(kb_http_req_t *req, void *arg)
{
    kb_ui_t *ui = arg;
    if (!s_host_ok(ui, req))
        return;
    size_t len = 0;
    const char *body = kb_http_req_body(req, &len);
    bool tokens = kb_auth_mode(ui->o.auth) == KB_AUTH_TOKENS;
    char value[KB_AUTH_ID_MAX + 1], who[KB_AUTH_ID_MAX + 1], bearer[KB_AUTH_ID_MAX + 8];
    if (len > FORM_MAX || strlen(body) != len ||
        s_form_value(body, tokens ? "token" : "user", value, sizeof value) ||
        !s_cookie_safe(value)) {
        s_redirect(req, "/ui?login=invalid");
        return;
    }
    snprintf(bearer, sizeof bearer, "Bearer %s", value);
    if (kb_auth_identify(ui->o.auth, tokens ? bearer : NULL, tokens ? NULL : value, who,
                         sizeof who)) {
        krt_log(KRT_LOG_INFO, LOG_PATH, "login_refused", "why=\"%s\"", who);
        s_redirect(req, "/ui?login=refused");
        return;
    }
    char cookie[KB_AUTH_ID_MAX + 128];
    snprintf(cookie, sizeof cookie, "%s=%s; Path=/ui; HttpOnly; SameSite=Strict%s", KB_UI_COOKIE,
             value, ui->o.tls ? "; Secure" : "");
    kb_http_req_add_header(req, "Set-Cookie", cookie);
    krt_log(KRT_LOG_INFO, LOG_PATH, "login", "identity=%s", who);
    s_redirect(req, "/ui");
}

static void s_slash(kb_http_req_t *req, void *arg)
{
    s_redirect(req, "/ui");
}

static void s_logout(kb_http_req_t *req, void *arg)
{
    kb_ui_t *ui = arg;
    if (!s_host_ok(ui, req))
        return;
    kb_http_req_add_header(req, "Set-Cookie",
                           ui->o.tls ? KB_UI_COOKIE "=; Path=/ui; HttpOnly; SameSite=Strict; "
                                                    "Max-Age=0; Secure"
                                     : KB_UI_COOKIE "=; Path=/ui; HttpOnly; SameSite=Strict; "
                                                    "Max-Age=0");
    s_redirect(req, "/ui");
}

kb_ui_t *kb_ui_new(kb_http_t *http, const kb_ui_options_t *opts)
{
    if (!http || !opts || !opts->svc || !opts->auth)
        return NULL;
    kb_ui_t *ui = calloc(1, sizeof *ui);
    if (!ui)
        return NULL;
    ui->o = *opts;
    if (kb_http_route(http, "/ui", KB_HTTP_GET | KB_HTTP_HEAD, s_page, ui) ||
        kb_http_route(http, "/ui/", KB_HTTP_GET | KB_HTTP_HEAD, s_slash, ui) ||
        kb_http_route(http, "/ui/api/state", KB_HTTP_GET, s_state, ui) ||
        kb_http_route(http, "/ui/login", KB_HTTP_POST, s_login, ui) ||
        kb_http_route(http, "/ui/logout", KB_HTTP_POST, s_logout, ui)) {
        free(ui); /* routes cannot be removed: the node fails to start and frees the server */
        return NULL;
    }
    return ui;
}

void kb_ui_destroy(kb_ui_t **ui_p)
{
    if (ui_p && *ui_p) {
        free(*ui_p);
        *ui_p = NULL;
    }
}
