/*
 * kb_jsonpath: kubectl's JSONPath templates (`-o jsonpath=TEMPLATE`) over a jansson document,
 * the subset kubectl documents (kubernetes.io/docs/reference/kubectl/jsonpath):
 *
 *   text outside braces is printed as is; {"\n"} and {'text'} print literals
 *   {.a.b} {$.a} {@.a} {a.b}     fields (the leading $ is optional); ['a'] ["a"] ['a','b']
 *   {.a[*]} {.a.*}               every element or member
 *   {.a[0]} {.a[-1]} {.a[1:3]} {.a[::2]}   indexes and slices (negative counts from the end)
 *   {..name} {..*}               recursive descent
 *   {.a[?(@.k=="v")]}            filters: == != < <= > >= against strings, numbers, booleans
 *                                or other paths; {.a[?(@.k)]} keeps elements that have k
 *   {range .items[*]}...{end}    repeats its body for each result, @ and . being that result
 *
 * As `kubectl get -o jsonpath` does: a missing key or index yields nothing (no error); the
 * results of one expression are separated by a space; strings print raw, other values as
 * compact JSON.
 */
#ifndef KB_JSONPATH_H
#define KB_JSONPATH_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#define KB_JSONPATH_ERR_CAP 256

typedef struct kb_jsonpath kb_jsonpath_t;

/* Parses a template. NULL on a syntax error (err says where and what) or out of memory. */
kb_jsonpath_t *kb_jsonpath_parse(const char *tmpl, char *err, size_t cap);
/* Prints the template evaluated on doc to out. 0 or -ENOMEM. */
int kb_jsonpath_print(const kb_jsonpath_t *p, const json_t *doc, FILE *out);
/* Idempotent; NULLs *p_p. */
void kb_jsonpath_free(kb_jsonpath_t **p_p);

#endif
