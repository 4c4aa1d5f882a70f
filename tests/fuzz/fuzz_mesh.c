/*
 * fuzz_mesh: one ZeroMQ message on a node's mesh ROUTER, as the I/O thread reads it: a mesh
 * frame (krt_mesh_frame.h) opened, every envelope in it decoded (krt_codec.h), and each one
 * that decoded handed to krt_system_deliver of a node (node 2, not started: local targets do
 * not exist, so runtime signals, node-service requests and call replies take their checking
 * and answering paths). A decoded envelope must re-encode to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "krt.h"
#include "krt_mesh_frame.h"

static krt_system_t *s_sys;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!s_sys) {
        krt_log_configure(KRT_LOG_ERROR, false, NULL);
        krt_config_t cfg = {.node_id = 2, .schedulers = 1, .job_threads = 1};
        s_sys = krt_system_new(&cfg);
        if (!s_sys)
            abort();
    }
    krt_mframe_t f;
    if (krt_mframe_open(&f, data, size))
        return 0;
    const uint8_t *env;
    size_t len;
    int rc;
    while ((rc = krt_mframe_next(&f, &env, &len)) > 0) {
        if (env < data || env + len > data + size)
            abort();
        krt_addr_t to;
        krt_msg_t msg;
        if (krt_envelope_decode(env, len, &to, &msg))
            continue;
        uint8_t *re = malloc(len + 1);
        size_t rlen = 0;
        if (!re || krt_envelope_encode_buf(re, len + 1, to, &msg, &rlen) || rlen > len)
            abort();
        free(re);
        krt_system_deliver(s_sys, to, &msg);
    }
    if (rc < 0 && rc != -ENODATA)
        abort();
    return 0;
}
