/* The line pager of read_sandbox_file: offset/limit over lines, UTF-8 safe cuts (mcp_int.h). */
#include "mcp_int.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the line pager -------------------------------------------------------------------------- */

struct kb_mcp_pager {
    uint64_t offset, limit;
    uint64_t line; /* number of the line being read (from 1) */
    bool partial;  /* bytes of the current line seen */
    char cur[KB_MCP_LINE_MAX];
    size_t cur_len;
    bool cut;
    char *out;
    size_t out_len, out_cap;
    uint64_t emitted, last;
    bool full;
};

kb_mcp_pager_t *kb_mcp_pager_new(uint64_t offset, uint64_t limit)
{
    kb_mcp_pager_t *p = calloc(1, sizeof *p);
    if (p) {
        p->offset = offset ? offset : 1;
        p->limit = limit ? limit : KB_MCP_LINES_DEF;
        p->line = 1;
    }
    return p;
}

static void s_out(kb_mcp_pager_t *p, const char *s, size_t n)
{
    if (p->out_len + n + 1 > p->out_cap) {
        size_t cap = (p->out_len + n + 1) * 2;
        char *b = realloc(p->out, cap);
        if (!b)
            return;
        p->out = b;
        p->out_cap = cap;
    }
    memcpy(p->out + p->out_len, s, n);
    p->out_len += n;
    p->out[p->out_len] = '\0';
}

/* Length of a valid UTF-8 sequence at s (n bytes available), or 0. */
static size_t s_utf8_seq(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t k = s[0] >= 0xF0 && s[0] <= 0xF4  ? 4
               : s[0] >= 0xE0                ? 3
               : s[0] >= 0xC2 && s[0] < 0xE0 ? 2
                                             : 0;
    if (!k || k > n)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    uint32_t cp = k == 2   ? (s[0] & 0x1Fu) << 6 | (s[1] & 0x3Fu)
                  : k == 3 ? (s[0] & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu)
                           : (s[0] & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 |
                                 (s[3] & 0x3Fu);
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return k;
}

/* Formats the current line ("<n>: <text>\n") if it fits the page; sets full otherwise. */
static void s_emit(kb_mcp_pager_t *p)
{
    if (p->emitted >= p->limit) {
        p->full = true;
        return;
    }
    size_t n = p->cur_len;
    if (n && p->cur[n - 1] == '\r' && !p->cut)
        n--;
    if (p->cut) /* do not end inside a character */
        while (n && ((unsigned char)p->cur[n - 1] & 0xC0) == 0x80)
            n--, (void)0;
    char text[KB_MCP_LINE_MAX * 3 + 64];
    int t = snprintf(text, sizeof text, "%" PRIu64 ": ", p->line);
    size_t tl = (size_t)t;
    const unsigned char *s = (const unsigned char *)p->cur;
    for (size_t i = 0; i < n;) {
        size_t k = s_utf8_seq(s + i, n - i);
        if (k) {
            memcpy(text + tl, s + i, k);
            tl += k;
            i += k;
        } else if (p->cut && n - i < 4 && s[i] >= 0xC0) {
            break; /* a character cut by the line limit */
        } else {
            memcpy(text + tl, "\xef\xbf\xbd", 3);
            tl += 3;
            i++;
        }
    }
    if (p->cut) {
        memcpy(text + tl, " [line cut]", 11);
        tl += 11;
    }
    text[tl++] = '\n';
    if (p->emitted > 0 && p->out_len + tl > KB_MCP_TEXT_BUDGET) {
        p->full = true;
        return;
    }
    s_out(p, text, tl);
    p->emitted++;
    p->last = p->line;
}

bool kb_mcp_pager_feed(kb_mcp_pager_t *p, const char *data, size_t len)
{
    for (size_t i = 0; i < len && !p->full; i++) {
        char ch = data[i];
        if (p->line < p->offset) { /* skipping to the first line */
            if (ch == '\n')
                p->line++;
            p->partial = ch != '\n';
            continue;
        }
        if (p->emitted >= p->limit) { /* a byte of a line past the page */
            p->full = true;
            break;
        }
        if (ch == '\n') {
            s_emit(p);
            if (p->full)
                break;
            p->line++;
            p->cur_len = 0;
            p->cut = false;
            p->partial = false;
            continue;
        }
        p->partial = true;
        if (p->cur_len < KB_MCP_LINE_MAX)
            p->cur[p->cur_len++] = ch;
        else
            p->cut = true;
    }
    return p->full;
}

char *kb_mcp_pager_finish(kb_mcp_pager_t *p)
{
    if (!p)
        return NULL;
    if (!p->full && p->partial && p->line >= p->offset)
        s_emit(p); /* a last line without a newline */
    uint64_t total = p->line - 1 + (p->partial ? 1 : 0);
    char note[160];
    if (p->full) {
        snprintf(note, sizeof note,
                 "(lines %" PRIu64 "\xe2\x80\x93%" PRIu64 "; continue with offset=%" PRIu64 ")",
                 p->offset, p->last, p->last + 1);
        s_out(p, note, strlen(note));
    } else if (p->emitted == 0) {
        snprintf(note, sizeof note, "(the file has %" PRIu64 " lines)", total);
        s_out(p, note, strlen(note));
    }
    char *out = p->out ? p->out : strdup("");
    free(p);
    return out;
}
