/*
 * kb_h2: the client side of one HTTP/2 connection, without I/O. See h2.h.
 */
#include "h2.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_PREFACE     "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define S_HEAD        9
#define S_WINDOW_MAX  0x7fffffff
#define S_DEFAULT_WIN 65535
#define S_HBUF        8192 /* our request header block */

enum {
    S_DATA,
    S_HEADERS,
    S_PRIORITY,
    S_RST_STREAM,
    S_SETTINGS,
    S_PUSH_PROMISE,
    S_PING,
    S_GOAWAY,
    S_WINDOW_UPDATE,
    S_CONTINUATION
};
enum { S_END_STREAM = 0x1, S_ACK = 0x1, S_END_HEADERS = 0x4, S_PADDED = 0x8, S_PRIO = 0x20 };
enum { S_SET_TABLE = 1, S_SET_PUSH, S_SET_STREAMS, S_SET_WINDOW, S_SET_FRAME, S_SET_LIST };

typedef struct {
    uint8_t *p;
    size_t len;
    size_t cap;
} s_buf_t;

struct kb_h2 {
    kb_hpack_dec_t hpack;
    s_buf_t out; /* queued for the server; out_off of it already written */
    size_t out_off;
    s_buf_t in; /* a partial frame */
    bool got_settings;
    bool failed;
    char error[KB_H2_MAX_MSG_TEXT];
    uint32_t peer_max_frame;
    uint32_t peer_window; /* the server's SETTINGS_INITIAL_WINDOW_SIZE */
    int64_t conn_send_window;
    int64_t conn_recv_window;
    uint32_t conn_unacked; /* received, not yet given back by WINDOW_UPDATE */
    int64_t st_recv_window;
    uint32_t st_unacked;
    uint32_t next_id;
    s_buf_t hb; /* the header block being assembled */
    uint32_t hb_stream;
    bool hb_open;
    bool hb_end_stream;
    bool goaway;
    uint32_t goaway_last;
    uint32_t goaway_code;
    kb_h2_stream_t st;
};

static uint32_t s_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int s_append(s_buf_t *b, const void *p, size_t n)
{
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len < n)
            cap *= 2;
        uint8_t *nb = realloc(b->p, cap);
        if (!nb)
            return -ENOMEM;
        b->p = nb;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

/* Queues one frame. */
static int s_frame(kb_h2_t *h, uint8_t type, uint8_t flags, uint32_t sid, const void *p, size_t n)
{
    uint8_t hd[S_HEAD] = {
        (uint8_t)(n >> 16),   (uint8_t)(n >> 8),    (uint8_t)n,          type,        flags,
        (uint8_t)(sid >> 24), (uint8_t)(sid >> 16), (uint8_t)(sid >> 8), (uint8_t)sid};
    int rc = s_append(&h->out, hd, sizeof hd);
    return rc ? rc : s_append(&h->out, p, n);
}

static int s_frame_u32(kb_h2_t *h, uint8_t type, uint32_t sid, uint32_t v)
{
    uint8_t p[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    return s_frame(h, type, 0, sid, p, sizeof p);
}

/* A connection error: GOAWAY queued, the session accepts nothing more. Returns -EPROTO. */
static int s_conn_error(kb_h2_t *h, uint32_t code, const char *fmt, ...)
{
    if (h->failed)
        return -EPROTO; /* the first error is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->error, sizeof h->error, fmt, ap);
    va_end(ap);
    uint8_t p[8] = {0,
                    0,
                    0,
                    0,
                    (uint8_t)(code >> 24),
                    (uint8_t)(code >> 16),
                    (uint8_t)(code >> 8),
                    (uint8_t)code};
    s_frame(h, S_GOAWAY, 0, 0, p, sizeof p);
    h->failed = true;
    return -EPROTO;
}

/* A stream error on the open stream: RST_STREAM queued, the stream is over. */
static int s_stream_error(kb_h2_t *h, uint32_t code, const char *what)
{
    kb_h2_stream_t *st = &h->st;
    if (!st->reset) {
        snprintf(st->error, sizeof st->error, "%s", what);
        st->reset = true;
        st->reset_code = code;
        return s_frame_u32(h, S_RST_STREAM, st->id, code);
    }
    return 0;
}

kb_h2_t *kb_h2_new(void)
{
    kb_h2_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    kb_hpack_dec_init(&h->hpack);
    h->peer_max_frame = KB_H2_MAX_FRAME;
    h->peer_window = S_DEFAULT_WIN;
    h->conn_send_window = S_DEFAULT_WIN;
    h->conn_recv_window = KB_H2_WINDOW;
    h->next_id = 1;
    uint8_t set[] = {0,
                     S_SET_PUSH,
                     0,
                     0,
                     0,
                     0, /* no server push */
                     0,
                     S_SET_WINDOW,
                     (uint8_t)(KB_H2_WINDOW >> 24),
                     (uint8_t)(KB_H2_WINDOW >> 16),
                     (uint8_t)(KB_H2_WINDOW >> 8),
                     (uint8_t)KB_H2_WINDOW};
    if (s_append(&h->out, S_PREFACE, strlen(S_PREFACE)) != 0 ||
        s_frame(h, S_SETTINGS, 0, 0, set, sizeof set) != 0 ||
        s_frame_u32(h, S_WINDOW_UPDATE, 0, KB_H2_WINDOW - S_DEFAULT_WIN) != 0)
        kb_h2_destroy(&h);
    return h;
}

void kb_h2_destroy(kb_h2_t **p)
{
    kb_h2_t *h = *p;
    if (!h)
        return;
    kb_hpack_dec_fini(&h->hpack);
    free(h->out.p);
    free(h->in.p);
    free(h->hb.p);
    free(h->st.data_buf);
    free(h);
    *p = NULL;
}

const char *kb_h2_error(const kb_h2_t *h)
{
    return h->error;
}

bool kb_h2_goaway(const kb_h2_t *h, uint32_t *last, uint32_t *code)
{
    if (h->goaway) {
        *last = h->goaway_last;
        *code = h->goaway_code;
    }
    return h->goaway;
}

const uint8_t *kb_h2_out(const kb_h2_t *h, size_t *len)
{
    *len = h->out.len - h->out_off;
    return h->out.p + h->out_off;
}

void kb_h2_sent(kb_h2_t *h, size_t n)
{
    h->out_off += n;
    if (h->out_off == h->out.len)
        h->out.len = h->out_off = 0;
}

kb_h2_stream_t *kb_h2_stream(kb_h2_t *h)
{
    return &h->st;
}

/* ------------------------------------------------------------------------------------------ */
/* Received header blocks                                                                     */

typedef struct {
    int status;
    bool grpc_ct;
    int grpc_status;
    char grpc_message[KB_H2_MAX_MSG_TEXT];
    bool pseudo_late; /* a pseudo-header after a regular one, repeated, or one we do not know */
    bool pseudo;
    bool regular;
} s_hdrs_t;

static bool s_is(const char *name, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(name, want, len) == 0;
}

/* Parses a small non-negative decimal; -1 if it is not one. */
static int s_num(const char *v, size_t n)
{
    int x = 0;
    if (n == 0 || n > 6)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (v[i] - '0');
    }
    return x;
}

static int s_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* grpc-message is percent-encoded (gRPC over HTTP/2); a bad escape stays as it is. */
static void s_percent_decode(char *out, size_t cap, const char *v, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        int hi, lo;
        if (v[i] == '%' && i + 2 < n && (hi = s_hex(v[i + 1])) >= 0 &&
            (lo = s_hex(v[i + 2])) >= 0) {
            out[o++] = (char)(hi << 4 | lo);
            i += 2;
        } else {
            out[o++] = v[i];
        }
    }
    out[o] = '\0';
}

static int s_on_field(void *user, const char *name, size_t nl, const char *value, size_t vl)
{
    s_hdrs_t *x = user;
    if (nl && name[0] == ':') {
        if (!s_is(name, nl, ":status") || x->pseudo || x->regular)
            x->pseudo_late = true;
        x->pseudo = true;
        x->status = s_num(value, vl);
        return 0;
    }
    x->regular = true;
    if (s_is(name, nl, "content-type")) {
        static const char ct[] = "application/grpc";
        size_t l = sizeof ct - 1;
        x->grpc_ct =
            vl >= l && memcmp(value, ct, l) == 0 && (vl == l || value[l] == '+' || value[l] == ';');
    } else if (s_is(name, nl, "grpc-status")) {
        x->grpc_status = s_num(value, vl);
        if (x->grpc_status < 0)
            x->grpc_status = 2; /* UNKNOWN: unparseable status */
    } else if (s_is(name, nl, "grpc-message")) {
        s_percent_decode(x->grpc_message, sizeof x->grpc_message, value, vl);
    }
    return 0;
}

/* Applies a decoded block to the open stream: response headers, then trailers. */
static int s_stream_headers(kb_h2_t *h, const s_hdrs_t *x, bool end_stream)
{
    kb_h2_stream_t *st = &h->st;
    if (st->reset)
        return 0;
    if (st->remote_closed)
        return s_stream_error(h, KB_H2_STREAM_CLOSED, "HEADERS after the end of the stream");
    if (!st->got_headers) {
        if (x->pseudo_late || x->status < 100)
            return s_stream_error(h, KB_H2_PROTOCOL_ERROR,
                                  "response headers without a valid :status");
        if (x->status < 200) { /* informational: the real headers follow */
            return end_stream ? s_stream_error(h, KB_H2_PROTOCOL_ERROR,
                                               "informational response ends the stream")
                              : 0;
        }
        st->got_headers = true;
        st->http_status = x->status;
        st->grpc_content_type = x->grpc_ct;
    } else if (!end_stream) {
        return s_stream_error(h, KB_H2_PROTOCOL_ERROR, "trailers without END_STREAM");
    } else if (x->pseudo) {
        return s_stream_error(h, KB_H2_PROTOCOL_ERROR, "pseudo-header in trailers");
    }
    if (end_stream) {
        st->got_trailers = true;
        st->remote_closed = true;
        st->grpc_status = x->grpc_status;
        snprintf(st->grpc_message, sizeof st->grpc_message, "%s", x->grpc_message);
    }
    return 0;
}

static int s_block_done(kb_h2_t *h)
{
    s_hdrs_t x = {.grpc_status = -1};
    h->hb_open = false;
    int rc = kb_hpack_decode(&h->hpack, h->hb.p, h->hb.len, s_on_field, &x);
    h->hb.len = 0;
    if (rc == -ENOMEM)
        return s_conn_error(h, KB_H2_INTERNAL_ERROR, "out of memory decoding headers");
    if (rc)
        return s_conn_error(h, KB_H2_COMPRESSION_ERROR, "malformed header block (HPACK)");
    if (h->hb_stream != h->st.id)
        return 0; /* a stream we closed: decoded only to keep the table in step */
    return s_stream_headers(h, &x, h->hb_end_stream);
}

static int s_fragment(kb_h2_t *h, const uint8_t *p, size_t n, bool end_headers)
{
    if (h->hb.len + n > KB_H2_MAX_HEADERS)
        return s_conn_error(h, KB_H2_ENHANCE_YOUR_CALM, "header block larger than %u bytes",
                            KB_H2_MAX_HEADERS);
    if (s_append(&h->hb, p, n) != 0)
        return s_conn_error(h, KB_H2_INTERNAL_ERROR, "out of memory");
    return end_headers ? s_block_done(h) : 0;
}

/* Strips padding (and the priority fields of HEADERS); -1 if the padding does not fit. */
static int s_unpad(uint8_t flags, bool prio, const uint8_t **p, size_t *n)
{
    size_t pad = 0, skip = 0;
    if (flags & S_PADDED) {
        if (*n < 1)
            return -1;
        pad = (*p)[0];
        skip = 1;
    }
    if (prio)
        skip += 5;
    if (skip + pad > *n)
        return -1;
    *p += skip;
    *n -= skip + pad;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Frames                                                                                     */

/* A stream the server names that we never opened (or that it may not open). */
static bool s_idle(const kb_h2_t *h, uint32_t sid)
{
    return sid >= h->next_id || (sid % 2) == 0;
}

static int s_give_back(kb_h2_t *h)
{
    int rc = 0;
    if (h->conn_unacked >= KB_H2_WINDOW / 4) {
        rc = s_frame_u32(h, S_WINDOW_UPDATE, 0, h->conn_unacked);
        h->conn_recv_window += h->conn_unacked;
        h->conn_unacked = 0;
    }
    if (!rc && h->st_unacked >= KB_H2_WINDOW / 4 && !h->st.reset && !h->st.remote_closed) {
        rc = s_frame_u32(h, S_WINDOW_UPDATE, h->st.id, h->st_unacked);
        h->st_recv_window += h->st_unacked;
        h->st_unacked = 0;
    }
    return rc;
}

/* Appends to the stream's unread data: moves it to the front of its buffer when that makes
 * room (taking messages off the front then costs nothing), else grows the buffer. */
static int s_stream_append(kb_h2_stream_t *st, const uint8_t *p, size_t n)
{
    if (n == 0)
        return 0;
    size_t off = st->data_buf ? (size_t)(st->data - st->data_buf) : 0;
    if (st->data_cap - off - st->data_len < n && off) {
        memmove(st->data_buf, st->data, st->data_len);
        st->data = st->data_buf;
    }
    if (st->data_cap - st->data_len < n) {
        s_buf_t b = {st->data_buf, st->data_len, st->data_cap};
        if (s_append(&b, p, n) != 0)
            return -ENOMEM;
        st->data = st->data_buf = b.p;
        st->data_len = b.len;
        st->data_cap = b.cap;
        return 0;
    }
    memcpy(st->data + st->data_len, p, n);
    st->data_len += n;
    return 0;
}

static int s_on_data(kb_h2_t *h, uint8_t flags, uint32_t sid, const uint8_t *p, size_t n)
{
    if (sid == 0)
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "DATA on stream 0");
    if (s_idle(h, sid))
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "DATA on idle stream %u", sid);
    if ((int64_t)n > h->conn_recv_window)
        return s_conn_error(h, KB_H2_FLOW_CONTROL_ERROR, "DATA beyond the connection window");
    h->conn_recv_window -= (int64_t)n;
    h->conn_unacked += (uint32_t)n;
    if (s_unpad(flags, false, &p, &n) != 0)
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "DATA padding longer than the frame");
    kb_h2_stream_t *st = &h->st;
    int rc = 0;
    if (sid != st->id || st->reset) {
        /* a stream we closed: counted for the connection, dropped */
    } else if (!st->got_headers) {
        rc = s_stream_error(h, KB_H2_PROTOCOL_ERROR, "DATA before the response headers");
    } else if (st->remote_closed) {
        rc = s_stream_error(h, KB_H2_STREAM_CLOSED, "DATA after the end of the stream");
    } else if ((int64_t)n > h->st_recv_window) {
        rc = s_stream_error(h, KB_H2_FLOW_CONTROL_ERROR, "DATA beyond the stream window");
    } else {
        h->st_recv_window -= (int64_t)n;
        h->st_unacked += (uint32_t)n;
        if (s_stream_append(st, p, n) != 0)
            return s_conn_error(h, KB_H2_INTERNAL_ERROR, "out of memory");
        st->remote_closed = flags & S_END_STREAM;
    }
    return rc ? rc : s_give_back(h);
}

static int s_on_headers(kb_h2_t *h, uint8_t flags, uint32_t sid, const uint8_t *p, size_t n)
{
    if (sid == 0)
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "HEADERS on stream 0");
    if (s_idle(h, sid))
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "HEADERS on idle stream %u", sid);
    if (s_unpad(flags, flags & S_PRIO, &p, &n) != 0)
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "HEADERS padding longer than the frame");
    h->hb_open = true;
    h->hb_stream = sid;
    h->hb_end_stream = flags & S_END_STREAM;
    return s_fragment(h, p, n, flags & S_END_HEADERS);
}

static int s_on_settings(kb_h2_t *h, uint8_t flags, uint32_t sid, const uint8_t *p, size_t n)
{
    if (sid != 0)
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "SETTINGS on stream %u", sid);
    if (flags & S_ACK)
        return n ? s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "SETTINGS ACK with a payload") : 0;
    if (n % 6)
        return s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "SETTINGS of %zu bytes", n);
    for (size_t i = 0; i < n; i += 6) {
        unsigned id = (unsigned)p[i] << 8 | p[i + 1];
        uint32_t v = s_u32(p + i + 2);
        if (id == S_SET_PUSH && v != 0)
            return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "server enables push");
        if (id == S_SET_WINDOW) {
            if (v > S_WINDOW_MAX)
                return s_conn_error(h, KB_H2_FLOW_CONTROL_ERROR, "initial window too large");
            if (h->st.id)
                h->st.send_window += (int64_t)v - h->peer_window;
            h->peer_window = v;
        }
        if (id == S_SET_FRAME) {
            if (v < KB_H2_MAX_FRAME || v > 0xffffff)
                return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE %u", v);
            h->peer_max_frame = v;
        }
        /* table size (our encoder uses no table), streams (we open one), list size: unused */
    }
    h->got_settings = true;
    return s_frame(h, S_SETTINGS, S_ACK, 0, NULL, 0);
}

static int s_on_window(kb_h2_t *h, uint32_t sid, const uint8_t *p, size_t n)
{
    if (n != 4)
        return s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "WINDOW_UPDATE of %zu bytes", n);
    int64_t inc = s_u32(p) & S_WINDOW_MAX;
    if (sid == 0) {
        if (inc == 0)
            return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "WINDOW_UPDATE of 0");
        if (h->conn_send_window + inc > S_WINDOW_MAX)
            return s_conn_error(h, KB_H2_FLOW_CONTROL_ERROR, "connection window overflow");
        h->conn_send_window += inc;
        return 0;
    }
    if (s_idle(h, sid))
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "WINDOW_UPDATE on idle stream %u", sid);
    if (sid != h->st.id || h->st.reset)
        return 0;
    if (inc == 0)
        return s_stream_error(h, KB_H2_PROTOCOL_ERROR, "WINDOW_UPDATE of 0");
    if (h->st.send_window + inc > S_WINDOW_MAX)
        return s_stream_error(h, KB_H2_FLOW_CONTROL_ERROR, "stream window overflow");
    h->st.send_window += inc;
    return 0;
}

static int s_on_rst(kb_h2_t *h, uint32_t sid, const uint8_t *p, size_t n)
{
    if (n != 4)
        return s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "RST_STREAM of %zu bytes", n);
    if (sid == 0 || s_idle(h, sid))
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "RST_STREAM on stream %u", sid);
    if (sid == h->st.id && !h->st.reset) {
        h->st.reset = true;
        h->st.reset_code = s_u32(p);
    }
    return 0;
}

static int s_on_goaway(kb_h2_t *h, uint32_t sid, const uint8_t *p, size_t n)
{
    if (sid != 0)
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "GOAWAY on stream %u", sid);
    if (n < 8)
        return s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "GOAWAY of %zu bytes", n);
    h->goaway = true;
    h->goaway_last = s_u32(p) & S_WINDOW_MAX;
    h->goaway_code = s_u32(p + 4);
    kb_h2_stream_t *st = &h->st;
    if (st->id > h->goaway_last && !st->reset && !st->remote_closed) {
        st->reset = true;
        st->reset_code = KB_H2_REFUSED_STREAM;
        snprintf(st->error, sizeof st->error, "server is going away (GOAWAY code %u: %.*s)",
                 h->goaway_code, (int)(n - 8 < 200 ? n - 8 : 200), (const char *)p + 8);
    }
    return 0;
}

static int s_on_frame(kb_h2_t *h, uint8_t type, uint8_t flags, uint32_t sid, const uint8_t *p,
                      size_t n)
{
    if (h->hb_open && (type != S_CONTINUATION || sid != h->hb_stream))
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "header block interrupted by a frame");
    switch (type) {
    case S_DATA:
        return s_on_data(h, flags, sid, p, n);
    case S_HEADERS:
        return s_on_headers(h, flags, sid, p, n);
    case S_CONTINUATION:
        if (!h->hb_open)
            return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "CONTINUATION without HEADERS");
        return s_fragment(h, p, n, flags & S_END_HEADERS);
    case S_PRIORITY:
        if (sid == 0)
            return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "PRIORITY on stream 0");
        return n == 5 ? 0 : s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "PRIORITY of %zu bytes", n);
    case S_RST_STREAM:
        return s_on_rst(h, sid, p, n);
    case S_SETTINGS:
        return s_on_settings(h, flags, sid, p, n);
    case S_PUSH_PROMISE:
        return s_conn_error(h, KB_H2_PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled");
    case S_PING:
        if (sid != 0 || n != 8)
            return s_conn_error(h, n != 8 ? KB_H2_FRAME_SIZE_ERROR : KB_H2_PROTOCOL_ERROR,
                                "bad PING frame");
        return flags & S_ACK ? 0 : s_frame(h, S_PING, S_ACK, 0, p, n);
    case S_GOAWAY:
        return s_on_goaway(h, sid, p, n);
    case S_WINDOW_UPDATE:
        return s_on_window(h, sid, p, n);
    default:
        return 0; /* unknown frame types are ignored (5.5) */
    }
}

/* Processes the whole frames at p[0..n); *used is how many bytes they took. */
static int s_frames(kb_h2_t *h, const uint8_t *p, size_t n, size_t *used)
{
    size_t at = 0;
    int rc = 0;
    while (rc == 0 && n - at >= S_HEAD) {
        const uint8_t *f = p + at;
        size_t len = (size_t)f[0] << 16 | (size_t)f[1] << 8 | f[2];
        if (!h->got_settings && (f[3] != S_SETTINGS || len > KB_H2_MAX_FRAME)) {
            s_conn_error(h, KB_H2_PROTOCOL_ERROR, "its first frame is not SETTINGS");
            rc = -EPROTONOSUPPORT;
            break;
        }
        if (len > KB_H2_MAX_FRAME) {
            rc = s_conn_error(h, KB_H2_FRAME_SIZE_ERROR, "frame of %zu bytes (limit %d)", len,
                              KB_H2_MAX_FRAME);
            break;
        }
        if (n - at < S_HEAD + len)
            break;
        rc = s_on_frame(h, f[3], f[4], s_u32(f + 5) & S_WINDOW_MAX, f + S_HEAD, len);
        at += S_HEAD + len;
    }
    *used = at;
    return rc == -ENOMEM ? s_conn_error(h, KB_H2_INTERNAL_ERROR, "out of memory") : rc;
}

int kb_h2_feed(kb_h2_t *h, const uint8_t *p, size_t n)
{
    if (h->failed)
        return -EPROTO;
    size_t used = 0;
    int rc = 0;
    if (h->in.len == 0) { /* no partial frame waiting: straight from the caller's bytes */
        rc = s_frames(h, p, n, &used);
        p += used;
        n -= used;
        if (rc || n == 0)
            return rc;
    }
    if (s_append(&h->in, p, n) != 0)
        return s_conn_error(h, KB_H2_INTERNAL_ERROR, "out of memory");
    rc = s_frames(h, h->in.p, h->in.len, &used);
    memmove(h->in.p, h->in.p + used, h->in.len - used);
    h->in.len -= used;
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Our stream                                                                                 */

int kb_h2_open(kb_h2_t *h, const kb_h2_header_t *hdrs, size_t n, bool end_stream)
{
    if (h->failed || h->goaway || h->next_id > S_WINDOW_MAX)
        return -EPIPE;
    if (h->st.id)
        return -EBUSY;
    uint8_t block[S_HBUF];
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        if (kb_hpack_encode(block, sizeof block, &len, hdrs[i].name, hdrs[i].value) != 0)
            return -E2BIG;
    kb_h2_stream_t *st = &h->st;
    memset(st, 0, sizeof *st);
    st->id = h->next_id;
    h->next_id += 2;
    st->send_window = h->peer_window;
    st->grpc_status = -1;
    st->local_closed = end_stream;
    h->st_recv_window = KB_H2_WINDOW;
    h->st_unacked = 0;
    size_t at = 0;
    int rc = 0;
    do {
        size_t chunk = len - at < h->peer_max_frame ? len - at : h->peer_max_frame;
        uint8_t flags = at + chunk == len ? S_END_HEADERS : 0;
        if (at == 0 && end_stream)
            flags |= S_END_STREAM;
        rc = s_frame(h, at == 0 ? S_HEADERS : S_CONTINUATION, flags, st->id, block + at, chunk);
        at += chunk;
    } while (rc == 0 && at < len);
    return rc;
}

size_t kb_h2_send_room(const kb_h2_t *h)
{
    const kb_h2_stream_t *st = &h->st;
    if (!st->id || st->reset || st->local_closed || h->failed)
        return 0;
    int64_t w = h->conn_send_window < st->send_window ? h->conn_send_window : st->send_window;
    return w > 0 ? (size_t)w : 0;
}

int kb_h2_data(kb_h2_t *h, const uint8_t *p, size_t n, bool end_stream)
{
    kb_h2_stream_t *st = &h->st;
    if (!st->id || st->reset || st->local_closed || h->failed || n > kb_h2_send_room(h))
        return -EPIPE;
    size_t at = 0;
    do {
        size_t chunk = n - at < h->peer_max_frame ? n - at : h->peer_max_frame;
        uint8_t flags = end_stream && at + chunk == n ? S_END_STREAM : 0;
        int rc = s_frame(h, S_DATA, flags, st->id, p + at, chunk);
        if (rc)
            return rc;
        at += chunk;
    } while (at < n);
    h->conn_send_window -= (int64_t)n;
    st->send_window -= (int64_t)n;
    st->local_closed = end_stream;
    return 0;
}

void kb_h2_take(kb_h2_t *h, size_t n)
{
    kb_h2_stream_t *st = &h->st;
    if (n == 0)
        return;
    st->data += n;
    st->data_len -= n;
}

void kb_h2_close_stream(kb_h2_t *h, uint32_t code)
{
    kb_h2_stream_t *st = &h->st;
    if (st->id && !st->reset && !(st->local_closed && st->remote_closed) && !h->failed)
        s_frame_u32(h, S_RST_STREAM, st->id, code);
    free(st->data_buf);
    memset(st, 0, sizeof *st);
}
