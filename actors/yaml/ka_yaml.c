/* ka_yaml: libyaml events folded into a tree with line numbers. */
#include "ka_yaml.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef struct {
    yaml_parser_t parser;
    char *err;
    size_t errcap;
    int depth;
} s_reader_t;

static int s_fail(s_reader_t *r, int line, const char *what)
{
    snprintf(r->err, r->errcap, "line %d: %s", line, what);
    return -EINVAL;
}

static int s_next(s_reader_t *r, yaml_event_t *ev)
{
    if (yaml_parser_parse(&r->parser, ev))
        return 0;
    char what[200];
    snprintf(what, sizeof what, "invalid YAML: %s%s%s",
             r->parser.problem ? r->parser.problem : "syntax error", r->parser.context ? " " : "",
             r->parser.context ? r->parser.context : "");
    return s_fail(r, (int)r->parser.problem_mark.line + 1, what);
}

static ka_yaml_node_t *s_node(ka_yaml_kind_t kind, const yaml_event_t *ev)
{
    ka_yaml_node_t *n = calloc(1, sizeof *n);
    if (n) {
        n->kind = kind;
        n->line = (int)ev->start_mark.line + 1;
        n->key_line = n->line;
    }
    return n;
}

static int s_parse_node(s_reader_t *r, yaml_event_t *ev, ka_yaml_node_t **out);

/* Reads children until the closing event of a map or sequence. ev is the start event. */
static int s_parse_children(s_reader_t *r, ka_yaml_node_t *parent, yaml_event_type_t end)
{
    ka_yaml_node_t **tail = &parent->child;
    for (;;) {
        yaml_event_t ev;
        int rc = s_next(r, &ev);
        if (rc)
            return rc;
        if (ev.type == end) {
            yaml_event_delete(&ev);
            return 0;
        }
        char *key = NULL;
        int key_line = 0;
        if (parent->kind == KA_YAML_MAP) {
            key_line = (int)ev.start_mark.line + 1;
            if (ev.type != YAML_SCALAR_EVENT) {
                yaml_event_delete(&ev);
                return s_fail(r, key_line, "map keys must be plain scalars");
            }
            key = strdup((const char *)ev.data.scalar.value);
            yaml_event_delete(&ev);
            if (!key)
                return s_fail(r, key_line, "out of memory");
            for (ka_yaml_node_t *c = parent->child; c; c = c->next)
                if (strcmp(c->key, key) == 0) {
                    char what[160];
                    snprintf(what, sizeof what, "duplicate key \"%.100s\"", key);
                    free(key);
                    return s_fail(r, key_line, what);
                }
            rc = s_next(r, &ev);
            if (rc) {
                free(key);
                return rc;
            }
        }
        ka_yaml_node_t *child = NULL;
        rc = s_parse_node(r, &ev, &child);
        if (rc) {
            free(key);
            return rc;
        }
        child->key = key;
        if (key)
            child->key_line = key_line;
        *tail = child;
        tail = &child->next;
        parent->n_children++;
    }
}

/* Builds a node from ev (consumed) and, for collections, everything up to its end. */
static int s_parse_node(s_reader_t *r, yaml_event_t *ev, ka_yaml_node_t **out)
{
    int line = (int)ev->start_mark.line + 1;
    ka_yaml_node_t *n = NULL;
    int rc = 0;
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        n = s_node(KA_YAML_SCALAR, ev);
        if (n) {
            n->value = strdup((const char *)ev->data.scalar.value);
            n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
        }
        yaml_event_delete(ev);
        if (!n || !n->value) {
            ka_yaml_free(&n);
            return s_fail(r, line, "out of memory");
        }
        *out = n;
        return 0;
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT: {
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        n = s_node(map ? KA_YAML_MAP : KA_YAML_SEQ, ev);
        yaml_event_delete(ev);
        if (!n)
            return s_fail(r, line, "out of memory");
        if (++r->depth > KA_YAML_MAX_DEPTH)
            rc = s_fail(r, line, "document nested too deeply");
        else
            rc = s_parse_children(r, n, map ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT);
        r->depth--;
        break;
    }
    case YAML_ALIAS_EVENT:
        yaml_event_delete(ev);
        return s_fail(r, line, "anchors and aliases are not supported");
    default:
        yaml_event_delete(ev);
        return s_fail(r, line, "unexpected YAML structure");
    }
    if (rc) {
        ka_yaml_free(&n);
        return rc;
    }
    *out = n;
    return 0;
}

/* Skips events until the type wanted; anything else is a structural error. */
static int s_expect(s_reader_t *r, yaml_event_type_t want, yaml_event_t *ev)
{
    int rc = s_next(r, ev);
    if (rc)
        return rc;
    if (ev->type != want) {
        int line = (int)ev->start_mark.line + 1;
        yaml_event_delete(ev);
        return s_fail(r, line, "unexpected YAML structure");
    }
    return 0;
}

static int s_parse_document(s_reader_t *r, ka_yaml_node_t **root)
{
    yaml_event_t ev;
    int rc = s_expect(r, YAML_STREAM_START_EVENT, &ev);
    if (rc)
        return rc;
    yaml_event_delete(&ev);
    if ((rc = s_next(r, &ev)))
        return rc;
    if (ev.type == YAML_STREAM_END_EVENT) { /* empty input: an empty map */
        *root = s_node(KA_YAML_MAP, &ev);
        yaml_event_delete(&ev);
        return *root ? 0 : -ENOMEM;
    }
    yaml_event_delete(&ev); /* document start */
    if ((rc = s_next(r, &ev)))
        return rc;
    if ((rc = s_parse_node(r, &ev, root)))
        return rc;
    if ((rc = s_expect(r, YAML_DOCUMENT_END_EVENT, &ev)))
        goto fail_tree;
    yaml_event_delete(&ev);
    if ((rc = s_next(r, &ev)))
        goto fail_tree;
    if (ev.type != YAML_STREAM_END_EVENT) {
        rc = s_fail(r, (int)ev.start_mark.line + 1, "expected one YAML document, found several");
        yaml_event_delete(&ev);
        goto fail_tree;
    }
    yaml_event_delete(&ev);
    if ((*root)->kind == KA_YAML_SCALAR && ka_yaml_is_null(*root)) { /* "---" alone */
        (*root)->kind = KA_YAML_MAP;
        free((char *)(*root)->value);
        (*root)->value = NULL;
    }
    return 0;
fail_tree:
    ka_yaml_free(root);
    return rc;
}

int ka_yaml_parse(const char *buf, size_t len, ka_yaml_node_t **root, char *err, size_t errcap)
{
    s_reader_t r = {.err = err, .errcap = errcap};
    *root = NULL;
    if (len > KA_YAML_MAX_BYTES) {
        snprintf(err, errcap, "document too large (%zu bytes, limit %u)", len, KA_YAML_MAX_BYTES);
        return -EFBIG;
    }
    if (!yaml_parser_initialize(&r.parser)) {
        snprintf(err, errcap, "out of memory");
        return -ENOMEM;
    }
    yaml_parser_set_input_string(&r.parser, (const unsigned char *)buf, len);
    int rc = s_parse_document(&r, root);
    yaml_parser_delete(&r.parser);
    return rc;
}

void ka_yaml_free(ka_yaml_node_t **root)
{
    ka_yaml_node_t *n = root ? *root : NULL;
    while (n) {
        ka_yaml_node_t *next = n->next;
        ka_yaml_free(&n->child);
        free((char *)n->key);
        free((char *)n->value);
        free(n);
        n = next;
    }
    if (root)
        *root = NULL;
}

const ka_yaml_node_t *ka_yaml_get(const ka_yaml_node_t *map, const char *key)
{
    if (!map || map->kind != KA_YAML_MAP)
        return NULL;
    for (const ka_yaml_node_t *c = map->child; c; c = c->next)
        if (strcmp(c->key, key) == 0)
            return c;
    return NULL;
}

const char *ka_yaml_kind_name(ka_yaml_kind_t kind)
{
    switch (kind) {
    case KA_YAML_SCALAR:
        return "scalar";
    case KA_YAML_MAP:
        return "map";
    default:
        return "list";
    }
}

bool ka_yaml_is_null(const ka_yaml_node_t *n)
{
    if (!n || n->kind != KA_YAML_SCALAR || n->quoted)
        return false;
    return n->value[0] == '\0' || strcmp(n->value, "~") == 0 || strcmp(n->value, "null") == 0 ||
           strcmp(n->value, "Null") == 0 || strcmp(n->value, "NULL") == 0;
}
