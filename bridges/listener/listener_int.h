/* kb_listener internals shared by the cleartext loop (listener.c) and the TLS loop (relay.c). */
#ifndef KB_LISTENER_INT_H
#define KB_LISTENER_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "listener.h"

#define KB_LISTENER_LOG_PATH "bridges/listener"

/* A connection whose protocol is not known yet. */
typedef struct {
    int fd;
    int64_t deadline_ms;
    struct sockaddr_storage peer;
    socklen_t peer_len;
} kb_pending_t;

struct kb_listener {
    kb_listener_options_t opts;
    int lfd;
    int wake[2]; /* pipe: a byte stops the thread */
    int port;
    pthread_t thread;
    kb_pending_t *pending;
    int n_pending;
    pthread_mutex_t mu; /* stats */
    kb_listener_stats_t stats;
};

int64_t kb_listener_now_ms(void);
/* Adds delta to *counter under the lock. */
void kb_listener_count(kb_listener_t *l, uint64_t *counter, int64_t delta);
/* Runs the TLS accept/handshake/relay loop on the listener thread until wake[0] is readable;
 * closes every TLS connection it still holds before returning. */
void kb_listener_tls_loop(kb_listener_t *l);

#endif
