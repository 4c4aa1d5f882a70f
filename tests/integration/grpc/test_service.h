/* kbt_service: the kbtest.TestService implementation used by the gRPC bridge tests and the
 * benchmark. Replies that the test asks for (delays, streams, uploads) come from a worker
 * thread, so the "answer from any thread" paths of kb_grpc are exercised. */
#ifndef KBT_SERVICE_H
#define KBT_SERVICE_H

#include <stdint.h>

#include "grpc_server.h"

typedef struct kbt_service kbt_service_t;

/* Starts the worker thread. NULL on failure. */
kbt_service_t *kbt_service_new(void);
/* Registers the TestService methods on srv (before start) and remembers srv for Stats. */
int kbt_service_register(kbt_service_t *svc, kb_grpc_server_t *srv);
/* Cancellations the handlers observed. */
uint64_t kbt_service_handler_cancels(kbt_service_t *svc);
/* Stops the worker. Call after kb_grpc_server_destroy. Idempotent. */
void kbt_service_destroy(kbt_service_t **svc_p);

#endif
