/*
 * kb_out: the CLI's output helpers: tables with aligned columns (cells padded to the widest
 * cell of their column plus two spaces, like Go's tabwriter with padding 2, trailing blanks
 * trimmed), JSON documents and YAML.
 */
#ifndef KB_OUTPUT_H
#define KB_OUTPUT_H

#include <stdio.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

typedef struct kb_table kb_table_t;

/* A table of ncols columns; NULL on allocation failure. */
kb_table_t *kb_table_new(size_t ncols);
/* Appends a row of ncols cells (copied; NULL cells print as empty). 0 or -ENOMEM. */
int kb_table_add(kb_table_t *t, const char *const *cells);
/* Writes the rows with aligned columns. */
void kb_table_print(const kb_table_t *t, FILE *out);
/* Frees; idempotent, NULLs *t. */
void kb_table_destroy(kb_table_t **t);

/* Writes j (borrowed) as indented JSON and a newline. 0 or -ENOMEM. */
int kb_out_json(FILE *out, const json_t *j);
/* Writes j (borrowed) as a YAML document (block style, two-space indent; strings quoted
 * only where YAML would read them otherwise). 0 or -ENOMEM. */
int kb_out_yaml(FILE *out, const json_t *j);
/* Writes j (borrowed) on one line (newline-delimited JSON records). 0 or -ENOMEM. */
int kb_out_json_line(FILE *out, const json_t *j);

#endif
