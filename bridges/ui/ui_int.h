/* kb_ui internals: the state document builder shared by the routes (ui.c) and the tests. */
#ifndef KB_UI_INT_H
#define KB_UI_INT_H

#include <jansson.h>
#include <stdbool.h>

#include "ui.h"

struct kb_ui {
    kb_ui_options_t o;
};

/* The page's data for caller (operator: every sandbox, with owners): identity, node, tree,
 * sandboxes, templates, nodes, pools, stats. A new reference, or NULL (out of memory). */
json_t *kb_ui_state(kb_ui_t *ui, const char *caller, bool operator_);

/* The page (embedded at build time from ui.html). */
extern const unsigned char kb_ui_html[];
extern const size_t kb_ui_html_len;

#endif
