/*
 * kb_out: tables, JSON and YAML output for the CLI. See output.h.
 */
#include "output.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define S_PAD 2

struct kb_table {
    size_t ncols;
    size_t nrows;
    size_t cap;
    char **cells; /* nrows * ncols, row-major, owned */
};

kb_table_t *kb_table_new(size_t ncols)
{
    kb_table_t *t = calloc(1, sizeof *t);
    if (t)
        t->ncols = ncols;
    return t;
}

int kb_table_add(kb_table_t *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        char **nc = realloc(t->cells, cap * t->ncols * sizeof *nc);
        if (!nc)
            return -ENOMEM;
        t->cells = nc;
        t->cap = cap;
    }
    char **row = t->cells + t->nrows * t->ncols;
    for (size_t c = 0; c < t->ncols; c++) {
        row[c] = strdup(cells[c] ? cells[c] : "");
        if (!row[c]) {
            while (c-- > 0)
                free(row[c]);
            return -ENOMEM;
        }
    }
    t->nrows++;
    return 0;
}

void kb_table_print(const kb_table_t *t, FILE *out)
{
    size_t width[t->ncols ? t->ncols : 1];
    memset(width, 0, sizeof width);
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++) {
            size_t w = strlen(t->cells[r * t->ncols + c]);
            if (w > width[c])
                width[c] = w;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        char *const *row = t->cells + r * t->ncols;
        /* The last non-empty cell ends the line: no trailing padding. */
        size_t last = t->ncols;
        while (last > 0 && row[last - 1][0] == '\0')
            last--;
        for (size_t c = 0; c < last; c++) {
            if (c + 1 < last)
                fprintf(out, "%-*s", (int)(width[c] + S_PAD), row[c]);
            else
                fputs(row[c], out);
        }
        fputc('\n', out);
    }
}

void kb_table_destroy(kb_table_t **p)
{
    kb_table_t *t = *p;
    if (!t)
        return;
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
    *p = NULL;
}

static int s_dump(FILE *out, const json_t *j, size_t flags)
{
    char *s = json_dumps(j, flags | JSON_ENCODE_ANY);
    if (!s)
        return -ENOMEM;
    fputs(s, out);
    fputc('\n', out);
    free(s);
    return 0;
}

int kb_out_json(FILE *out, const json_t *j)
{
    return s_dump(out, j, JSON_INDENT(2));
}

int kb_out_json_line(FILE *out, const json_t *j)
{
    return s_dump(out, j, JSON_COMPACT);
}

/* ---- YAML ----------------------------------------------------------------------------------- */

/* True when a plain scalar would read back as this string (not a number, bool, null, or
 * something YAML gives a meaning). */
static bool s_plain_ok(const char *s, size_t n)
{
    static const char *const words[] = {"true", "false", "yes", "no",   "on",    "off",  "null",
                                        "~",    "y",     "n",   "True", "False", "Null", "NULL",
                                        "TRUE", "FALSE", "Yes", "No",   "YES",   "NO"};
    if (n == 0 || strlen(s) != n || isspace((unsigned char)s[0]) ||
        isspace((unsigned char)s[n - 1]) || strchr("-?:,[]{}#&*!|>'\"%@`", s[0]))
        return false;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcmp(s, words[i]) == 0)
            return false;
    if (isdigit((unsigned char)s[0]) || s[0] == '.' || s[0] == '+')
        return false; /* a number, a date or a timestamp to a YAML 1.1 reader */
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || (p[0] == ':' && (p[1] == ' ' || !p[1])) ||
            (p[0] == ' ' && p[1] == '#'))
            return false;
    return true;
}

static int s_yaml_scalar(FILE *out, const json_t *j)
{
    if (json_is_string(j)) {
        const char *s = json_string_value(j);
        if (s_plain_ok(s, json_string_length(j))) {
            fputs(s, out);
            return 0;
        }
    }
    char *t = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY); /* JSON scalars are YAML too */
    if (!t)
        return -ENOMEM;
    fputs(t, out);
    free(t);
    return 0;
}

static bool s_empty_container(const json_t *j)
{
    return (json_is_object(j) && json_object_size(j) == 0) ||
           (json_is_array(j) && json_array_size(j) == 0);
}

static int s_yaml(FILE *out, const json_t *j, int indent, bool inline_first);

/* The value after "key:" or "- ": a scalar or empty container on the same line, else the
 * block on the next lines. */
static int s_yaml_value(FILE *out, const json_t *v, int indent)
{
    if (s_empty_container(v) || (!json_is_object(v) && !json_is_array(v))) {
        fputc(' ', out);
        int rc = s_empty_container(v) ? (fputs(json_is_object(v) ? "{}" : "[]", out), 0)
                                      : s_yaml_scalar(out, v);
        fputc('\n', out);
        return rc;
    }
    fputc('\n', out);
    return s_yaml(out, v, indent, false);
}

static int s_yaml(FILE *out, const json_t *j, int indent, bool inline_first)
{
    int rc = 0;
    bool first = true;
    if (json_is_object(j)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            fprintf(out, "%*s", inline_first && first ? 0 : indent, "");
            json_t *key = json_string(k);
            rc = key ? s_yaml_scalar(out, key) : -ENOMEM;
            json_decref(key);
            fputc(':', out);
            if (!rc)
                rc = s_yaml_value(out, v, indent + 2);
            if (rc)
                return rc;
            first = false;
        }
        return 0;
    }
    if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v)
        {
            fprintf(out, "%*s-", inline_first && first ? 0 : indent, "");
            if (json_is_object(v) && !s_empty_container(v)) {
                fputc(' ', out);
                rc = s_yaml(out, v, indent + 2, true); /* "- key: v" then aligned keys */
            } else {
                rc = s_yaml_value(out, v, indent + 2);
            }
            if (rc)
                return rc;
            first = false;
        }
        return 0;
    }
    rc = s_yaml_scalar(out, j);
    fputc('\n', out);
    return rc;
}

int kb_out_yaml(FILE *out, const json_t *j)
{
    if (s_empty_container(j)) {
        fputs(json_is_object(j) ? "{}\n" : "[]\n", out);
        return 0;
    }
    return s_yaml(out, j, 0, false);
}
