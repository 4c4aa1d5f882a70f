/* kb_auth: identities from headers; tokens compared by their SHA-256, never stored in clear. */
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    unsigned char hash[32];
    char id[KB_AUTH_ID_MAX + 1];
} s_token_t;

struct kb_auth {
    kb_auth_mode_t mode;
    s_token_t *tokens;
    size_t n;
    kb_auth_conn_fn conn_fn; /* per-connection identities (TLS client certificates) */
    void *conn_arg;
    char **operators;
    size_t n_operators;
};

static int s_unhex(const char *hex, unsigned char out[32])
{
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (!isxdigit((unsigned char)hex[2 * i]) || !isxdigit((unsigned char)hex[2 * i + 1]) ||
            sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -EINVAL;
        out[i] = (unsigned char)v;
    }
    return isspace((unsigned char)hex[64]) || hex[64] == '\0' ? 0 : -EINVAL;
}

/* Parses one "<sha256-hex> <identity>" line into t; 1 if it held a token, 0 if blank or a
 * comment, -EINVAL if malformed. */
static int s_parse_line(char *line, s_token_t *t)
{
    char *p = line + strspn(line, " \t");
    p[strcspn(p, "\r\n")] = '\0';
    if (*p == '\0' || *p == '#')
        return 0;
    if (strlen(p) < 66 || s_unhex(p, t->hash))
        return -EINVAL;
    char *id = p + 64 + strspn(p + 64, " \t");
    size_t n = strcspn(id, " \t");
    if (n == 0 || n > KB_AUTH_ID_MAX || id[n + strspn(id + n, " \t")] != '\0')
        return -EINVAL;
    memcpy(t->id, id, n);
    t->id[n] = '\0';
    return 1;
}

static int s_load(kb_auth_t *a, const char *path, char *why, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        snprintf(why, cap, "%s: %s", path, strerror(e));
        return -e;
    }
    char line[1024];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        s_token_t t;
        memset(&t, 0, sizeof t);
        int got = s_parse_line(line, &t);
        if (got < 0) {
            snprintf(why, cap, "%s:%d: expected \"<sha256 hex of the token> <identity>\"", path,
                     lineno);
            rc = -EINVAL;
            break;
        }
        if (!got)
            continue;
        s_token_t *grown = realloc(a->tokens, (a->n + 1) * sizeof *grown);
        if (!grown) {
            rc = -ENOMEM;
            break;
        }
        a->tokens = grown;
        a->tokens[a->n++] = t;
    }
    fclose(f);
    return rc;
}

kb_auth_t *kb_auth_new(kb_auth_mode_t mode, const char *tokens_file, int *err, char *why,
                       size_t why_cap)
{
    char dummy[8];
    if (!why) {
        why = dummy;
        why_cap = sizeof dummy;
    }
    why[0] = '\0';
    kb_auth_t *a = calloc(1, sizeof *a);
    int rc = a ? 0 : -ENOMEM;
    if (a) {
        a->mode = mode;
        if (mode == KB_AUTH_TOKENS)
            rc = tokens_file && *tokens_file ? s_load(a, tokens_file, why, why_cap) : -EINVAL;
    }
    if (rc) {
        if (err)
            *err = rc;
        kb_auth_destroy(&a);
    }
    return a;
}

static void s_free_operators(kb_auth_t *a)
{
    for (size_t i = 0; i < a->n_operators; i++)
        free(a->operators[i]);
    free(a->operators);
    a->operators = NULL;
    a->n_operators = 0;
}

int kb_auth_set_operators(kb_auth_t *a, const char *const *ids, size_t n)
{
    s_free_operators(a);
    if (!n)
        return 0;
    if (!(a->operators = calloc(n, sizeof *a->operators)))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!(a->operators[i] = strdup(ids[i]))) {
            s_free_operators(a);
            return -ENOMEM;
        }
        a->n_operators++;
    }
    return 0;
}

bool kb_auth_is_operator(const kb_auth_t *a, const char *id)
{
    for (size_t i = 0; id && i < a->n_operators; i++)
        if (strcmp(a->operators[i], id) == 0)
            return true;
    return false;
}

void kb_auth_destroy(kb_auth_t **a_p)
{
    if (a_p && *a_p) {
        s_free_operators(*a_p);
        free((*a_p)->tokens);
        free(*a_p);
        *a_p = NULL;
    }
}

kb_auth_mode_t kb_auth_mode(const kb_auth_t *a)
{
    return a->mode;
}

static bool s_valid_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > KB_AUTH_ID_MAX)
        return false;
    for (; *s; s++)
        if ((unsigned char)*s < 0x21 || (unsigned char)*s == 0x7f)
            return false;
    return true;
}

int kb_auth_identify(const kb_auth_t *a, const char *authorization, const char *user_id, char *out,
                     size_t cap)
{
    if (a->mode == KB_AUTH_USER_HEADER) {
        const char *id = user_id ? user_id : "";
        if (!*id) { /* no identity is no one's: the CLI sends its default explicitly */
            snprintf(out, cap, "identity required: send the x-user-id header");
            return -EACCES;
        }
        if (!s_valid_id(id)) {
            snprintf(out, cap, "x-user-id must be 1-%d visible characters", KB_AUTH_ID_MAX);
            return -EACCES;
        }
        snprintf(out, cap, "%s", id);
        return 0;
    }
    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0 || !authorization[7]) {
        snprintf(out, cap, "authentication required: send \"authorization: Bearer <token>\"");
        return -EACCES;
    }
    const char *tok = authorization + 7;
    unsigned char md[32];
    unsigned int n = 0;
    if (!EVP_Digest(tok, strlen(tok), md, &n, EVP_sha256(), NULL) || n != 32) {
        snprintf(out, cap, "authentication failed");
        return -EACCES;
    }
    for (size_t i = 0; i < a->n; i++)
        if (CRYPTO_memcmp(md, a->tokens[i].hash, 32) == 0) {
            snprintf(out, cap, "%s", a->tokens[i].id);
            return 0;
        }
    snprintf(out, cap, "invalid bearer token");
    return -EACCES;
}

void kb_auth_set_conn_lookup(kb_auth_t *a, kb_auth_conn_fn fn, void *arg)
{
    a->conn_fn = fn;
    a->conn_arg = arg;
}

int kb_auth_identify_conn(const kb_auth_t *a, int fd, const char *authorization,
                          const char *user_id, char *out, size_t cap)
{
    if (fd >= 0 && a->conn_fn && a->conn_fn(fd, out, cap, a->conn_arg) == 0)
        return 0;
    return kb_auth_identify(a, authorization, user_id, out, cap);
}
