/*
 * fuzz_messages: the message types of the public gRPC services (kagent.api.v1,
 * ateenv.v1alpha, kagent.runtime.v1), for the protobuf and pbjson fuzz targets. A selector byte
 * picks one: fuzz_message(sel, want_output) walks the methods in order.
 */
#ifndef FUZZ_MESSAGES_H
#define FUZZ_MESSAGES_H

#include <stdbool.h>
#include <stdint.h>

#include "ateenv/v1alpha/guest.pb-c.h"
#include "kagent/api/v1/sandbox_templates.pb-c.h"
#include "kagent/api/v1/sandboxes.pb-c.h"
#include "kagent/runtime/v1/runtime.pb-c.h"

static const ProtobufCServiceDescriptor *const fuzz_services[] = {
    &kagent__api__v1__sandbox_service__descriptor,
    &kagent__api__v1__sandbox_template_service__descriptor,
    &ateenv__v1alpha__process_service__descriptor,
    &ateenv__v1alpha__file_system_service__descriptor,
    &kagent__runtime__v1__runtime_service__descriptor,
};

/* The request (or response) type of method number sel modulo the number of methods. */
static inline const ProtobufCMessageDescriptor *fuzz_message(uint8_t sel, bool response)
{
    unsigned n = 0;
    for (size_t s = 0; s < sizeof fuzz_services / sizeof *fuzz_services; s++)
        n += fuzz_services[s]->n_methods;
    unsigned k = sel % n;
    for (size_t s = 0;; s++) {
        if (k < fuzz_services[s]->n_methods) {
            const ProtobufCMethodDescriptor *m = &fuzz_services[s]->methods[k];
            return response ? m->output : m->input;
        }
        k -= fuzz_services[s]->n_methods;
    }
}

#endif
