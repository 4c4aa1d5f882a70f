/* kb_jsonpath: kubectl's JSONPath templates. See jsonpath.h.
 *
 * A template parses into a list of nodes (text, expression, range with its body); an
 * expression into steps. Evaluation maps a list of values (borrowed from the document) through
 * the steps, so a result list never owns anything but its array.
 */
#include "jsonpath.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32 /* nested ranges and filters */

typedef struct s_path s_path_t;

typedef enum { OP_EXISTS, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE } s_op_t;

/* A filter operand: a path from @ or $, or a literal (owned JSON). */
typedef struct {
    s_path_t *path;
    json_t *lit;
} s_operand_t;

typedef struct {
    s_operand_t lhs, rhs;
    s_op_t op;
} s_filter_t;

typedef enum { ST_FIELDS, ST_ALL, ST_DESCEND, ST_SLICE, ST_FILTER } s_kind_t;

typedef struct {
    s_kind_t kind;
    char **names; /* ST_FIELDS: one or a union; ST_DESCEND: one name, or none for ..* */
    size_t n_names;
    bool index; /* ST_SLICE from a single index: [i] */
    bool has[3];
    long v[3]; /* start, end, step */
    s_filter_t *filter;
} s_step_t;

struct s_path {
    bool from_root; /* $ (else the current value: @ or the range's element) */
    s_step_t *steps;
    size_t n;
};

typedef enum { N_TEXT, N_EXPR, N_RANGE } s_ntype_t;

typedef struct s_node s_node_t;
struct s_node {
    s_ntype_t type;
    char *text;     /* N_TEXT */
    s_path_t *path; /* N_EXPR, N_RANGE */
    s_node_t *body; /* N_RANGE */
    size_t n_body;
};

struct kb_jsonpath {
    s_node_t *nodes;
    size_t n;
};

/* ---- results ------------------------------------------------------------------------------ */

typedef struct {
    const json_t **v;
    size_t n, cap;
    bool oom;
} s_list_t;

static void s_add(s_list_t *l, const json_t *v)
{
    if (!v || l->oom)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        const json_t **t = realloc(l->v, cap * sizeof(const json_t *));
        if (!t) {
            l->oom = true;
            return;
        }
        l->v = t;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

/* ---- freeing ------------------------------------------------------------------------------ */

static void s_path_free(s_path_t *p);

static void s_operand_free(s_operand_t *o)
{
    s_path_free(o->path);
    json_decref(o->lit);
}

static void s_step_clear(s_step_t *s)
{
    for (size_t k = 0; k < s->n_names; k++)
        free(s->names[k]);
    free(s->names);
    if (s->filter) {
        s_operand_free(&s->filter->lhs);
        s_operand_free(&s->filter->rhs);
        free(s->filter);
    }
}

static void s_path_free(s_path_t *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        s_step_clear(&p->steps[i]);
    free(p->steps);
    free(p);
}

static void s_nodes_free(s_node_t *nodes, size_t n);

static void s_node_clear(s_node_t *nd)
{
    free(nd->text);
    s_path_free(nd->path);
    s_nodes_free(nd->body, nd->n_body);
}

static void s_nodes_free(s_node_t *nodes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s_node_clear(&nodes[i]);
    free(nodes);
}

void kb_jsonpath_free(kb_jsonpath_t **p_p)
{
    if (p_p && *p_p) {
        s_nodes_free((*p_p)->nodes, (*p_p)->n);
        free(*p_p);
        *p_p = NULL;
    }
}

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct {
    const char *s; /* the whole template */
    const char *p; /* cursor */
    const char *end;
    char *err;
    size_t cap;
    bool failed;
    int depth;
} s_parser_t;

static bool s_fail(s_parser_t *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool s_fail(s_parser_t *ps, const char *fmt, ...)
{
    if (ps->failed)
        return false;
    ps->failed = true;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->cap, "jsonpath: %s at column %ld", what, (long)(ps->p - ps->s) + 1);
    return false;
}

static void s_ws(s_parser_t *ps)
{
    while (ps->p < ps->end && isspace((unsigned char)*ps->p))
        ps->p++;
}

static bool s_eat(s_parser_t *ps, char c)
{
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return true;
    }
    return false;
}

static bool s_push_name(s_step_t *st, char *name)
{
    char **t = name ? realloc(st->names, (st->n_names + 1) * sizeof *t) : NULL;
    if (!t) {
        free(name);
        return false;
    }
    st->names = t;
    st->names[st->n_names++] = name;
    return true;
}

static bool s_push_step(s_path_t *p, const s_step_t *st)
{
    s_step_t *t = realloc(p->steps, (p->n + 1) * sizeof *t);
    if (!t)
        return false;
    p->steps = t;
    p->steps[p->n++] = *st;
    return true;
}

/* A quoted string ('..' or ".."), escapes \n \t \r \\ \' \" decoded. NULL on error. */
static char *s_quoted(s_parser_t *ps)
{
    char q = *ps->p++;
    char *out = malloc((size_t)(ps->end - ps->p) + 1);
    size_t n = 0;
    if (!out) {
        s_fail(ps, "out of memory");
        return NULL;
    }
    while (ps->p < ps->end && *ps->p != q) {
        char c = *ps->p++;
        if (c == '\\' && ps->p < ps->end) {
            char e = *ps->p++;
            c = (char)(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
        }
        out[n++] = c;
    }
    if (!s_eat(ps, q)) {
        free(out);
        s_fail(ps, "unterminated quoted string");
        return NULL;
    }
    out[n] = '\0';
    return out;
}

static bool s_name_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '/' || c == '\\' ||
           (unsigned char)c >= 0x80;
}

/* A bare field name after '.' ("\." keeps a dot in the name). NULL on error. */
static char *s_bare(s_parser_t *ps)
{
    const char *b = ps->p;
    while (ps->p < ps->end &&
           (s_name_char(*ps->p) || (ps->p[0] == '.' && ps->p > b && ps->p[-1] == '\\')))
        ps->p++;
    if (ps->p == b) {
        s_fail(ps, "expected a field name");
        return NULL;
    }
    char *out = malloc((size_t)(ps->p - b) + 1);
    size_t n = 0;
    for (const char *c = b; out && c < ps->p; c++)
        if (!(c[0] == '\\' && c + 1 < ps->p && c[1] == '.'))
            out[n++] = *c;
    if (out)
        out[n] = '\0';
    else
        s_fail(ps, "out of memory");
    return out;
}

static s_path_t *s_path(s_parser_t *ps, bool in_filter);

static bool s_number(s_parser_t *ps, long *out)
{
    char *e;
    errno = 0;
    long v = strtol(ps->p, &e, 10);
    if (e == ps->p || errno || e > ps->end)
        return false;
    ps->p = e;
    *out = v;
    return true;
}

static bool s_operand(s_parser_t *ps, s_operand_t *o)
{
    s_ws(ps);
    if (ps->p >= ps->end)
        return s_fail(ps, "expected an operand");
    char c = *ps->p;
    if (c == '@' || c == '$') {
        o->path = s_path(ps, true);
        return o->path != NULL;
    }
    if (c == '\'' || c == '"') {
        char *s = s_quoted(ps);
        o->lit = s ? json_string(s) : NULL;
        free(s);
        return o->lit || s_fail(ps, "bad string");
    }
    if (isdigit((unsigned char)c) || c == '-' || c == '.') {
        char *e;
        double d = strtod(ps->p, &e);
        if (e == ps->p)
            return s_fail(ps, "bad number");
        ps->p = e;
        o->lit = json_real(d);
        return true;
    }
    if (ps->end - ps->p >= 4 && strncmp(ps->p, "true", 4) == 0) {
        ps->p += 4;
        o->lit = json_true();
        return true;
    }
    if (ps->end - ps->p >= 5 && strncmp(ps->p, "false", 5) == 0) {
        ps->p += 5;
        o->lit = json_false();
        return true;
    }
    return s_fail(ps, "expected @, $, a string, a number or a boolean");
}

static bool s_filter(s_parser_t *ps, s_step_t *st)
{
    if (++ps->depth > MAX_DEPTH)
        return s_fail(ps, "filters nested too deeply");
    s_filter_t *f = calloc(1, sizeof *f);
    if (!f)
        return s_fail(ps, "out of memory");
    st->kind = ST_FILTER;
    st->filter = f;
    if (!s_operand(ps, &f->lhs))
        return false;
    s_ws(ps);
    static const struct {
        const char *tok;
        s_op_t op;
    } ops[] = {{"==", OP_EQ}, {"!=", OP_NE}, {"<=", OP_LE}, {">=", OP_GE},
               {"<", OP_LT},  {">", OP_GT},  {"=", OP_EQ}};
    f->op = OP_EXISTS;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        size_t l = strlen(ops[i].tok);
        if ((size_t)(ps->end - ps->p) >= l && strncmp(ps->p, ops[i].tok, l) == 0) {
            ps->p += l;
            f->op = ops[i].op;
            break;
        }
    }
    if (f->op != OP_EXISTS && !s_operand(ps, &f->rhs))
        return false;
    s_ws(ps);
    ps->depth--;
    if (!s_eat(ps, ')'))
        return s_fail(ps, "expected ) to end the filter");
    return true;
}

/* [ ... ] after the '[': names, indexes, slices, *, or a filter. */
static bool s_bracket(s_parser_t *ps, s_path_t *p)
{
    s_step_t st;
    memset(&st, 0, sizeof st);
    s_ws(ps);
    bool ok;
    if (s_eat(ps, '*')) {
        st.kind = ST_ALL;
        ok = true;
    } else if (s_eat(ps, '?')) {
        ok = s_eat(ps, '(') ? s_filter(ps, &st) : s_fail(ps, "expected ( after ?");
    } else if (ps->p < ps->end && (*ps->p == '\'' || *ps->p == '"')) {
        st.kind = ST_FIELDS;
        do {
            s_ws(ps);
            char *name = ps->p < ps->end && (*ps->p == '\'' || *ps->p == '"') ? s_quoted(ps) : NULL;
            ok = name && s_push_name(&st, name);
            if (!ok)
                s_fail(ps, "expected a quoted name");
            s_ws(ps);
        } while (ok && s_eat(ps, ','));
    } else {
        st.kind = ST_SLICE;
        ok = true;
        int part = 0;
        for (;;) {
            s_ws(ps);
            if (part < 3 && s_number(ps, &st.v[part]))
                st.has[part] = true;
            s_ws(ps);
            if (part < 2 && s_eat(ps, ':')) {
                part++;
                continue;
            }
            break;
        }
        st.index = part == 0;
        if (part == 0 && !st.has[0])
            ok = s_fail(ps, "expected an index, a slice, *, a quoted name or ?(filter)");
        if (st.has[2] && st.v[2] == 0)
            ok = s_fail(ps, "a slice step cannot be 0");
    }
    s_ws(ps);
    if (ok && !s_eat(ps, ']'))
        ok = s_fail(ps, "expected ]");
    if (ok && s_push_step(p, &st))
        return true;
    s_step_clear(&st);
    return ok ? s_fail(ps, "out of memory") : false;
}

static bool s_dot(s_parser_t *ps, s_path_t *p)
{
    s_step_t st;
    memset(&st, 0, sizeof st);
    bool descend = s_eat(ps, '.');
    if (s_eat(ps, '*')) {
        st.kind = descend ? ST_DESCEND : ST_ALL;
    } else if (descend && ps->p < ps->end && *ps->p == '[') {
        st.kind = ST_DESCEND; /* ..[...]: every level, then the bracket */
        return s_push_step(p, &st) || s_fail(ps, "out of memory");
    } else {
        char *name = s_bare(ps);
        if (!name)
            return false;
        st.kind = descend ? ST_DESCEND : ST_FIELDS;
        if (!s_push_name(&st, name))
            return s_fail(ps, "out of memory");
    }
    if (!s_push_step(p, &st)) {
        s_step_clear(&st);
        return s_fail(ps, "out of memory");
    }
    return true;
}

/* A path up to '}' (or, in a filter, to an operator or ')'). */
static s_path_t *s_path(s_parser_t *ps, bool in_filter)
{
    s_path_t *p = calloc(1, sizeof *p);
    if (!p) {
        s_fail(ps, "out of memory");
        return NULL;
    }
    if (s_eat(ps, '$'))
        p->from_root = true;
    else if (!s_eat(ps, '@') && ps->p < ps->end && s_name_char(*ps->p) && !in_filter) {
        if (!s_dot(ps, p)) /* "{a.b}": a leading field without its dot */
            goto fail;
    }
    while (ps->p < ps->end) {
        char c = *ps->p;
        bool ok;
        if (c == '.') {
            ps->p++;
            ok = s_dot(ps, p);
        } else if (c == '[') {
            ps->p++;
            ok = s_bracket(ps, p);
        } else {
            break;
        }
        if (!ok)
            goto fail;
    }
    return p;
fail:
    s_path_free(p);
    return NULL;
}

static bool s_push_node(s_node_t **nodes, size_t *n, const s_node_t *node)
{
    s_node_t *t = realloc(*nodes, (*n + 1) * sizeof *t);
    if (!t)
        return false;
    *nodes = t;
    (*nodes)[(*n)++] = *node;
    return true;
}

static bool s_word(s_parser_t *ps, const char *w)
{
    size_t l = strlen(w);
    if ((size_t)(ps->end - ps->p) < l || strncmp(ps->p, w, l) != 0)
        return false;
    const char *after = ps->p + l;
    if (after < ps->end && !isspace((unsigned char)*after) && *after != '}')
        return false;
    ps->p = after;
    return true;
}

/* Nodes until the end of the template (top level) or a {end} (in a range). */
static bool s_nodes(s_parser_t *ps, bool in_range, s_node_t **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    while (ps->p < ps->end) {
        s_node_t node;
        memset(&node, 0, sizeof node);
        if (*ps->p != '{') {
            const char *b = ps->p;
            while (ps->p < ps->end && *ps->p != '{')
                ps->p++;
            node.type = N_TEXT;
            node.text = strndup(b, (size_t)(ps->p - b));
            if (!node.text || !s_push_node(out, n_out, &node)) {
                free(node.text);
                return s_fail(ps, "out of memory");
            }
            continue;
        }
        ps->p++;
        s_ws(ps);
        if (s_word(ps, "end")) {
            s_ws(ps);
            if (!s_eat(ps, '}'))
                return s_fail(ps, "expected } after end");
            return in_range ? true : s_fail(ps, "{end} without {range}");
        }
        if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\'')) {
            node.type = N_TEXT;
            node.text = s_quoted(ps);
            if (!node.text)
                return false;
        } else if (s_word(ps, "range")) {
            s_ws(ps);
            node.type = N_RANGE;
            node.path = s_path(ps, false);
        } else {
            node.type = N_EXPR;
            node.path = s_path(ps, false);
        }
        s_ws(ps);
        if (!ps->failed && ps->p >= ps->end)
            s_fail(ps, "unclosed {");
        else if (!ps->failed && !s_eat(ps, '}'))
            s_fail(ps, "unexpected character '%c'", *ps->p);
        if (!ps->failed && node.type == N_RANGE) {
            if (++ps->depth > MAX_DEPTH)
                s_fail(ps, "ranges nested too deeply");
            else if (s_nodes(ps, true, &node.body, &node.n_body))
                ps->depth--;
        }
        if (ps->failed || !s_push_node(out, n_out, &node)) {
            s_node_clear(&node);
            return s_fail(ps, "out of memory");
        }
    }
    return in_range ? s_fail(ps, "{range} without {end}") : true;
}

kb_jsonpath_t *kb_jsonpath_parse(const char *tmpl, char *err, size_t cap)
{
    char dummy[8];
    s_parser_t ps = {
        .s = tmpl ? tmpl : "", .err = err ? err : dummy, .cap = err ? cap : sizeof dummy};
    ps.p = ps.s;
    ps.end = ps.s + strlen(ps.s);
    kb_jsonpath_t *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(ps.err, ps.cap, "jsonpath: out of memory");
        return NULL;
    }
    if (!s_nodes(&ps, false, &p->nodes, &p->n)) {
        kb_jsonpath_free(&p);
        return NULL;
    }
    return p;
}

/* ---- evaluation --------------------------------------------------------------------------- */

static void s_eval_path(const s_path_t *p, const json_t *root, const json_t *cur, s_list_t *out);

static void s_descend(const json_t *v, const s_step_t *st, s_list_t *out)
{
    if (st->n_names) {
        const json_t *hit = json_is_object(v) ? json_object_get(v, st->names[0]) : NULL;
        s_add(out, hit);
    } else if (!st->n_names && v) {
        s_add(out, v); /* ..* and ..[...]: every value, this one included */
    }
    const char *k;
    json_t *c;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, c) s_descend(c, st, out);
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, c) s_descend(c, st, out);
    }
}

static void s_slice(const json_t *v, const s_step_t *st, s_list_t *out)
{
    if (!json_is_array(v))
        return;
    long n = (long)json_array_size(v), step = st->has[2] ? st->v[2] : 1;
    if (st->index) {
        long i = st->v[0] < 0 ? st->v[0] + n : st->v[0];
        if (i >= 0 && i < n)
            s_add(out, json_array_get(v, (size_t)i));
        return;
    }
    long lo = step > 0 ? 0 : n - 1, hi = step > 0 ? n : -1;
    long a = st->has[0] ? st->v[0] : lo, b = st->has[1] ? st->v[1] : hi;
    if (st->has[0] && a < 0)
        a += n;
    if (st->has[1] && b < 0)
        b += n;
    if (step > 0) {
        a = a < 0 ? 0 : a > n ? n : a;
        b = b < 0 ? 0 : b > n ? n : b;
        for (long i = a; i < b; i += step)
            s_add(out, json_array_get(v, (size_t)i));
    } else {
        a = a >= n ? n - 1 : a;
        for (long i = a; i > b && i >= 0; i += step)
            s_add(out, json_array_get(v, (size_t)i));
    }
}

/* The first value of an operand for element cur, or NULL. */
static const json_t *s_operand_value(const s_operand_t *o, const json_t *root, const json_t *cur)
{
    if (o->lit)
        return o->lit;
    s_list_t l = {0};
    s_eval_path(o->path, root, cur, &l);
    const json_t *v = l.n ? l.v[0] : NULL;
    free(l.v);
    return v;
}

static int s_cmp(const json_t *a, const json_t *b, bool *ok)
{
    *ok = true;
    if (json_is_number(a) && json_is_number(b)) {
        double x = json_number_value(a), y = json_number_value(b);
        return x < y ? -1 : x > y;
    }
    if (json_is_string(a) && json_is_string(b))
        return strcmp(json_string_value(a), json_string_value(b));
    *ok = json_equal((json_t *)a, (json_t *)b);
    return *ok ? 0 : 1;
}

static bool s_keep(const s_filter_t *f, const json_t *root, const json_t *cur)
{
    const json_t *l = s_operand_value(&f->lhs, root, cur);
    if (f->op == OP_EXISTS)
        return l != NULL && !json_is_false(l) && !json_is_null(l);
    const json_t *r = s_operand_value(&f->rhs, root, cur);
    if (!l || !r)
        return f->op == OP_NE && (l || r);
    bool comparable;
    int c = s_cmp(l, r, &comparable);
    switch (f->op) {
    case OP_EQ:
        return c == 0;
    case OP_NE:
        return c != 0;
    case OP_LT:
        return comparable && c < 0 && (json_is_number(l) || json_is_string(l));
    case OP_LE:
        return comparable && c <= 0 && (json_is_number(l) || json_is_string(l));
    case OP_GT:
        return comparable && c > 0 && (json_is_number(l) || json_is_string(l));
    case OP_GE:
        return comparable && c >= 0 && (json_is_number(l) || json_is_string(l));
    default:
        return false;
    }
}

static void s_step(const s_step_t *st, const json_t *root, const json_t *v, s_list_t *out)
{
    const char *k;
    json_t *c;
    size_t i;
    switch (st->kind) {
    case ST_FIELDS:
        for (size_t n = 0; json_is_object(v) && n < st->n_names; n++)
            s_add(out, json_object_get(v, st->names[n]));
        break;
    case ST_ALL:
        if (json_is_object(v))
            json_object_foreach((json_t *)v, k, c) s_add(out, c);
        else if (json_is_array(v))
            json_array_foreach(v, i, c) s_add(out, c);
        break;
    case ST_DESCEND:
        s_descend(v, st, out);
        break;
    case ST_SLICE:
        s_slice(v, st, out);
        break;
    case ST_FILTER:
        if (json_is_array(v)) {
            json_array_foreach(v, i, c) if (s_keep(st->filter, root, c)) s_add(out, c);
        } else if (json_is_object(v)) {
            json_object_foreach((json_t *)v, k, c) if (s_keep(st->filter, root, c)) s_add(out, c);
        }
        break;
    }
}

static void s_eval_path(const s_path_t *p, const json_t *root, const json_t *cur, s_list_t *out)
{
    s_list_t a = {0};
    s_add(&a, p->from_root ? root : cur);
    for (size_t i = 0; i < p->n && !a.oom; i++) {
        s_list_t b = {0};
        for (size_t k = 0; k < a.n; k++)
            s_step(&p->steps[i], root, a.v[k], &b);
        b.oom |= a.oom;
        free(a.v);
        a = b;
    }
    for (size_t k = 0; k < a.n; k++)
        s_add(out, a.v[k]);
    out->oom |= a.oom;
    free(a.v);
}

static int s_print_value(const json_t *v, FILE *out)
{
    if (json_is_string(v)) {
        fwrite(json_string_value(v), 1, json_string_length(v), out);
        return 0;
    }
    if (json_is_real(v)) { /* 2.0 prints as 2, as Go's %v does */
        double d = json_real_value(v);
        if (d == (double)(long long)d && d < 1e15 && d > -1e15)
            fprintf(out, "%lld", (long long)d);
        else
            fprintf(out, "%.17g", d);
        return 0;
    }
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return -ENOMEM;
    fputs(s, out);
    free(s);
    return 0;
}

static int s_run(const s_node_t *nodes, size_t n, const json_t *root, const json_t *cur, FILE *out)
{
    for (size_t i = 0; i < n; i++) {
        const s_node_t *nd = &nodes[i];
        if (nd->type == N_TEXT) {
            fputs(nd->text, out);
            continue;
        }
        s_list_t l = {0};
        s_eval_path(nd->path, root, cur, &l);
        int rc = l.oom ? -ENOMEM : 0;
        for (size_t k = 0; !rc && k < l.n; k++) {
            if (nd->type == N_RANGE) {
                rc = s_run(nd->body, nd->n_body, root, l.v[k], out);
            } else {
                if (k)
                    fputc(' ', out);
                rc = s_print_value(l.v[k], out);
            }
        }
        free(l.v);
        if (rc)
            return rc;
    }
    return 0;
}

int kb_jsonpath_print(const kb_jsonpath_t *p, const json_t *doc, FILE *out)
{
    return s_run(p->nodes, p->n, doc, doc, out);
}
