/*
 * ka_yaml: a YAML document as a small read-only tree with line numbers, for the node config
 * and SandboxTemplate documents (libyaml underneath).
 *
 * The tree is plain data (public struct, like libyaml's own nodes): read it, never modify it.
 * Anchors/aliases are refused (a config never needs them, and they enable billion-laughs).
 */
#ifndef KA_YAML_H
#define KA_YAML_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { KA_YAML_SCALAR, KA_YAML_MAP, KA_YAML_SEQ } ka_yaml_kind_t;

typedef struct ka_yaml_node ka_yaml_node_t;
struct ka_yaml_node {
    ka_yaml_kind_t kind;
    int line;              /* 1-based line of the value */
    int key_line;          /* 1-based line of its key when inside a map, else = line */
    const char *key;       /* key when inside a map, else NULL */
    const char *value;     /* scalar text (never NULL for scalars), NULL otherwise */
    bool quoted;           /* scalar was quoted: never null/bool/number by implication */
    ka_yaml_node_t *child; /* first child of a map or sequence */
    ka_yaml_node_t *next;  /* next sibling */
    size_t n_children;
};

#define KA_YAML_ERR_CAP   256
#define KA_YAML_MAX_DEPTH 64
#define KA_YAML_MAX_BYTES (4u << 20)

/* Parses exactly one document. On success *root owns the tree (free with ka_yaml_free) and 0 is
 * returned; an empty document gives an empty map. On failure returns -EINVAL and writes
 * "line N: what" to err. */
int ka_yaml_parse(const char *buf, size_t len, ka_yaml_node_t **root, char *err, size_t errcap);
/* Frees a tree; idempotent, NULLs *root. */
void ka_yaml_free(ka_yaml_node_t **root);
/* The value under key in a map, or NULL (borrowed). */
const ka_yaml_node_t *ka_yaml_get(const ka_yaml_node_t *map, const char *key);
/* A human name of a node kind: "scalar", "map", "list". */
const char *ka_yaml_kind_name(ka_yaml_kind_t kind);
/* True for a plain (unquoted) scalar of null, ~ or empty text. */
bool ka_yaml_is_null(const ka_yaml_node_t *n);

#endif
