/* kb_grpc_reflection: gRPC server reflection (grpc.reflection.v1alpha and v1 ServerReflection)
 * answered from serialized FileDescriptorSets (protoc --include_imports --descriptor_set_out).
 *
 * Supports list_services, file_by_filename and file_containing_symbol (services, methods,
 * messages, nested messages, enums, fields and enum values); file_containing_extension and
 * all_extension_numbers_of_type answer NOT_FOUND (proto3 APIs have no extensions).
 * File answers carry the file and its transitive dependencies.
 */
#ifndef KB_GRPC_REFLECTION_H
#define KB_GRPC_REFLECTION_H

#include <stddef.h>

#include "grpc_server.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kb_grpc_reflection kb_grpc_reflection_t;

/* The descriptor set of this build's protos (proto/), embedded at build time. */
extern const unsigned char kb_grpc_protoset[];
extern const size_t kb_grpc_protoset_len;

/* An empty index. NULL on failure. */
kb_grpc_reflection_t *kb_grpc_reflection_new(void);
/* Adds every file of a serialized FileDescriptorSet (copied). Files already known by name are
 * skipped. 0, -EBADMSG (not a descriptor set), -ENOMEM. */
int kb_grpc_reflection_add_set(kb_grpc_reflection_t *r, const void *data, size_t len);
/* Same, reading the set from a file. 0, -errno, -EBADMSG. */
int kb_grpc_reflection_add_file(kb_grpc_reflection_t *r, const char *path);
/* Number of services known. */
size_t kb_grpc_reflection_service_count(const kb_grpc_reflection_t *r);
/* Registers both reflection methods on srv (before kb_grpc_server_start). The index must
 * outlive the server and must not change once the server runs. 0 or the add_methods error. */
int kb_grpc_reflection_register(kb_grpc_reflection_t *r, kb_grpc_server_t *srv);
/* Frees the index (after the server is destroyed). Idempotent. */
void kb_grpc_reflection_destroy(kb_grpc_reflection_t **r_p);

#ifdef __cplusplus
}
#endif
#endif
