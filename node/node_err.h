/*
 * ka_node_fail: how the node's start-up steps report a failure: the message formatted into the
 * caller's buffer (err, cap bytes), and -1 returned.
 */
#ifndef KA_NODE_ERR_H
#define KA_NODE_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline int ka_node_fail(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int ka_node_fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

#endif
