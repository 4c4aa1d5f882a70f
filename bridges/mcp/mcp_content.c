/* MCP content helpers: base64, file-type sniffing, image dimensions (mcp_int.h). */
#include "mcp_int.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- base64, sniffing, images --------------------------------------------------------------- */

static const char s_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *kb_mcp_b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    size_t i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = s_b64[v >> 18];
        *o++ = s_b64[(v >> 12) & 63];
        *o++ = s_b64[(v >> 6) & 63];
        *o++ = s_b64[v & 63];
    }
    if (i < len) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0);
        *o++ = s_b64[v >> 18];
        *o++ = s_b64[(v >> 12) & 63];
        *o++ = i + 1 < len ? s_b64[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

static int s_b64_val(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+')
        return 62;
    if (ch == '/')
        return 63;
    return -1;
}

int kb_mcp_b64_decode(const char *text, size_t len, unsigned char **out, size_t *out_len, char *msg,
                      size_t cap)
{
    *out = NULL;
    *out_len = 0;
    unsigned char *buf = malloc(len / 4 * 3 + 3);
    if (!buf)
        return snprintf(msg, cap, "out of memory"), -1;
    size_t n = 0, i = 0;
    while (i < len) {
        int q[4];
        size_t pad = 0;
        for (int k = 0; k < 4; k++, i++) {
            if (i >= len) {
                free(buf);
                return snprintf(msg, cap, "illegal base64 data at input byte %zu", len), -1;
            }
            unsigned char ch = (unsigned char)text[i];
            if (ch == '=' && k >= 2) {
                q[k] = 0;
                pad++;
                continue;
            }
            q[k] = pad ? -1 : s_b64_val(ch);
            if (q[k] < 0) {
                free(buf);
                return snprintf(msg, cap, "illegal base64 data at input byte %zu", i), -1;
            }
        }
        if (pad && i < len) { /* padding only at the very end */
            free(buf);
            return snprintf(msg, cap, "illegal base64 data at input byte %zu", i), -1;
        }
        uint32_t v =
            (uint32_t)q[0] << 18 | (uint32_t)q[1] << 12 | (uint32_t)q[2] << 6 | (uint32_t)q[3];
        buf[n++] = (unsigned char)(v >> 16);
        if (pad < 2)
            buf[n++] = (unsigned char)(v >> 8);
        if (pad < 1)
            buf[n++] = (unsigned char)v;
    }
    *out = buf;
    *out_len = n;
    return 0;
}

const char *kb_mcp_sniff(const unsigned char *p, size_t len)
{
    if (len >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0)
        return "image/png";
    if (len >= 3 && memcmp(p, "\xff\xd8\xff", 3) == 0)
        return "image/jpeg";
    if (len >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0))
        return "image/gif";
    if (len >= 14 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBPVP", 6) == 0)
        return "image/webp";
    if (len >= 5 && memcmp(p, "%PDF-", 5) == 0)
        return "application/pdf";
    if (len >= 3 && memcmp(p, "\x1f\x8b\x08", 3) == 0)
        return "application/x-gzip";
    if (len >= 4 && memcmp(p, "PK\x03\x04", 4) == 0)
        return "application/zip";
    for (size_t i = 0; i < len; i++) {
        unsigned char b = p[i];
        if (b <= 0x08 || b == 0x0B || (b >= 0x0E && b <= 0x1A) || (b >= 0x1C && b <= 0x1F))
            return "application/octet-stream";
    }
    return "text/plain; charset=utf-8";
}

static unsigned s_be16(const unsigned char *p)
{
    return (unsigned)p[0] << 8 | p[1];
}
static unsigned s_le16(const unsigned char *p)
{
    return (unsigned)p[1] << 8 | p[0];
}
static unsigned s_be32(const unsigned char *p)
{
    return (unsigned)p[0] << 24 | (unsigned)p[1] << 16 | (unsigned)p[2] << 8 | p[3];
}
static unsigned s_le24(const unsigned char *p)
{
    return (unsigned)p[2] << 16 | (unsigned)p[1] << 8 | p[0];
}

int kb_mcp_image_size(const unsigned char *p, size_t len, unsigned *w, unsigned *h)
{
    const char *mime = kb_mcp_sniff(p, len);
    if (strcmp(mime, "image/png") == 0 && len >= 24) {
        *w = s_be32(p + 16);
        *h = s_be32(p + 20);
        return 0;
    }
    if (strcmp(mime, "image/gif") == 0 && len >= 10) {
        *w = s_le16(p + 6);
        *h = s_le16(p + 8);
        return 0;
    }
    if (strcmp(mime, "image/jpeg") == 0) {
        size_t i = 2;
        while (i + 9 < len) {
            if (p[i] != 0xFF) {
                i++;
                continue;
            }
            unsigned m = p[i + 1];
            if (m == 0xFF) {
                i++;
                continue;
            }
            if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
                *h = s_be16(p + i + 5);
                *w = s_be16(p + i + 7);
                return 0;
            }
            if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
                i += 2;
                continue;
            }
            i += 2 + s_be16(p + i + 2);
        }
        return -1;
    }
    if (strcmp(mime, "image/webp") == 0 && len >= 30) {
        if (memcmp(p + 12, "VP8 ", 4) == 0) {
            *w = s_le16(p + 26) & 0x3FFF;
            *h = s_le16(p + 28) & 0x3FFF;
            return 0;
        }
        if (memcmp(p + 12, "VP8L", 4) == 0 && len >= 25) {
            uint32_t b = (uint32_t)p[21] | (uint32_t)p[22] << 8 | (uint32_t)p[23] << 16 |
                         (uint32_t)p[24] << 24;
            *w = (b & 0x3FFF) + 1;
            *h = ((b >> 14) & 0x3FFF) + 1;
            return 0;
        }
        if (memcmp(p + 12, "VP8X", 4) == 0) {
            *w = s_le24(p + 24) + 1;
            *h = s_le24(p + 27) + 1;
            return 0;
        }
    }
    return -1;
}
