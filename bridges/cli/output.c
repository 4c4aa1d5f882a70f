/*
 * kb_out: tables and JSON output for the CLI. See output.h.
 */
#include "output.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pbjson.h"

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

int kb_out_json_msg(FILE *out, const ProtobufCMessage *msg)
{
    json_t *j = kb_pbjson_to_json(msg, 0);
    if (!j)
        return -ENOMEM;
    int rc = kb_out_json(out, j);
    json_decref(j);
    return rc;
}
