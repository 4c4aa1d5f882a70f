/*
 * kb_h2: the client side of one HTTP/2 connection (RFC 9113), without I/O: the caller feeds the
 * bytes it read (kb_h2_feed) and writes out what the session queued (kb_h2_out / kb_h2_sent).
 * Built for the CLI's gRPC calls: one stream open at a time, response headers, DATA and
 * trailers collected on it, flow control both ways, SETTINGS/PING acknowledged, GOAWAY and
 * RST_STREAM reported. Every frame from the server is checked; a bad one is a connection error
 * (GOAWAY queued, kb_h2_error says why) or, when it concerns only the stream, a stream error
 * (RST_STREAM queued, the stream's error says why).
 */
#ifndef KB_H2_H
#define KB_H2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hpack.h"

#define KB_H2_WINDOW       (16u << 20)  /* what we let the server send ahead: 16 MiB */
#define KB_H2_MAX_FRAME    16384        /* our SETTINGS_MAX_FRAME_SIZE (the default) */
#define KB_H2_MAX_HEADERS  (256u << 10) /* one header block, with its CONTINUATIONs */
#define KB_H2_MAX_MSG_TEXT 512          /* grpc-message and error texts kept */

/* Error codes (RFC 9113 7). */
enum {
    KB_H2_NO_ERROR = 0x0,
    KB_H2_PROTOCOL_ERROR = 0x1,
    KB_H2_INTERNAL_ERROR = 0x2,
    KB_H2_FLOW_CONTROL_ERROR = 0x3,
    KB_H2_STREAM_CLOSED = 0x5,
    KB_H2_FRAME_SIZE_ERROR = 0x6,
    KB_H2_REFUSED_STREAM = 0x7,
    KB_H2_CANCEL = 0x8,
    KB_H2_COMPRESSION_ERROR = 0x9,
    KB_H2_ENHANCE_YOUR_CALM = 0xb,
    KB_H2_INADEQUATE_SECURITY = 0xc,
};

/* A request header; name lower case. */
typedef struct kb_h2_header {
    const char *name;
    const char *value;
} kb_h2_header_t;

/* The open stream as the server has answered it so far. */
typedef struct kb_h2_stream {
    uint32_t id; /* 0: no stream */
    int64_t send_window;
    bool local_closed;  /* we sent END_STREAM */
    bool got_headers;   /* response headers arrived */
    bool got_trailers;  /* trailers (or a trailers-only response) arrived */
    bool remote_closed; /* END_STREAM arrived */
    bool reset;         /* RST_STREAM either way, or a stream error: the stream is over */
    uint32_t reset_code;
    int http_status;                       /* :status, 0 until known */
    bool grpc_content_type;                /* content-type is application/grpc[+...|;...] */
    int grpc_status;                       /* -1 until trailers carry grpc-status */
    char grpc_message[KB_H2_MAX_MSG_TEXT]; /* percent-decoded */
    char error[KB_H2_MAX_MSG_TEXT];        /* why a stream error happened; "" if none */
    uint8_t *data; /* DATA payload received, not yet taken: data[0..data_len) */
    size_t data_len;
    uint8_t *data_buf; /* the allocation data points into, data_cap bytes */
    size_t data_cap;
} kb_h2_stream_t;

typedef struct kb_h2 kb_h2_t;

/* A session with the connection preface, our SETTINGS and connection window queued. */
kb_h2_t *kb_h2_new(void);
void kb_h2_destroy(kb_h2_t **self);

/* Processes n received bytes (any split). 0, or a negative code after a connection error
 * (-EPROTONOSUPPORT: the server's first frame is not SETTINGS, so it does not speak HTTP/2;
 * -EPROTO: a bad frame): then kb_h2_error says why and nothing more is accepted. */
int kb_h2_feed(kb_h2_t *h, const uint8_t *p, size_t n);
/* The connection error ("" if none). Borrowed. */
const char *kb_h2_error(const kb_h2_t *h);
/* True once GOAWAY arrived; *last is the last stream the server will have processed. */
bool kb_h2_goaway(const kb_h2_t *h, uint32_t *last, uint32_t *code);

/* Bytes queued for the server (borrowed), and how many of them were written. */
const uint8_t *kb_h2_out(const kb_h2_t *h, size_t *len);
void kb_h2_sent(kb_h2_t *h, size_t n);

/* Opens the next stream with HEADERS (+ CONTINUATION); end_stream closes our side at once.
 * 0, -EBUSY while a stream is open, -EPIPE after a connection error or GOAWAY, -E2BIG if
 * the headers do not fit one block, -ENOMEM. */
int kb_h2_open(kb_h2_t *h, const kb_h2_header_t *hdrs, size_t n, bool end_stream);
/* The open stream (borrowed); id 0 when none. */
kb_h2_stream_t *kb_h2_stream(kb_h2_t *h);
/* How many DATA bytes flow control lets us send on the stream now. */
size_t kb_h2_send_room(const kb_h2_t *h);
/* Queues DATA (n <= kb_h2_send_room), split into frames the server accepts. 0, -EPIPE when the
 * stream or connection is over, -ENOMEM. */
int kb_h2_data(kb_h2_t *h, const uint8_t *p, size_t n, bool end_stream);
/* Drops the first n bytes of the stream's received data. */
void kb_h2_take(kb_h2_t *h, size_t n);
/* Resets the open stream (if not over yet) and forgets it: the next kb_h2_open may follow. */
void kb_h2_close_stream(kb_h2_t *h, uint32_t code);

#endif
