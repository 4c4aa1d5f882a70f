/*
 * File commands: upload (WriteFile client stream, 1 MiB chunks) and download (ReadFile server
 * stream into a .kagent-download-* temporary renamed over the destination only on success).
 */
#include "cli_int.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ateenv/v1alpha/guest.pb-c.h"

static const char s_upload_limit[] = "upload requires a regular file of at most 64 MiB";

static int s_run_upload(kb_cli_t *cli, const kb_args_t *a)
{
    const char *sandbox_id = a->pos[0], *local = a->pos[1], *remote = a->pos[2];
    /* Checked before any network call. */
    int fd = open(local, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (uint64_t)sb.st_size > KB_TRANSFER_CAP) {
        if (fd >= 0)
            close(fd);
        return kb_cli_fail(cli, "%s", s_upload_limit);
    }
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc) {
        close(fd);
        return KB_EXIT_ERROR;
    }
    uint8_t *buf = malloc(KB_CHUNK);
    if (!buf) {
        close(fd);
        return kb_cli_fail(cli, "out of memory");
    }
    kb_rpc_status_t st;
    char cause[KB_RPC_MSG_CAP + 64] = "";
    int rc = KB_EXIT_OK;
    kb_rpc_call_t *call =
        kb_rpc_client_stream(rpc, "/ateenv.v1alpha.FileSystemService/WriteFile", sandbox_id, &st);
    uint64_t total = (uint64_t)sb.st_size, sent = 0;
    bool first = true, failed = call == NULL;
    while (!failed) {
        ssize_t n = read(fd, buf, KB_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(cause, sizeof cause, "read %s: %s", local, strerror(errno));
            failed = true;
            break;
        }
        if (n == 0 && !first)
            break;
        Ateenv__V1alpha__WriteFileRequest req = ATEENV__V1ALPHA__WRITE_FILE_REQUEST__INIT;
        if (first) {
            req.path = (char *)remote;
            req.mode = (uint32_t)kb_args_int(a, "mode");
        }
        req.chunk.data = buf;
        req.chunk.len = (size_t)n;
        if (kb_rpc_call_write(call, &req.base) != 0) {
            failed = true;
            break;
        }
        first = false;
        sent += (uint64_t)n;
        kb_cli_progress(cli, "upload", sent, total, sent == total);
        if (n == 0)
            break; /* an empty file: one message with the path only */
    }
    ProtobufCMessage *resp = NULL;
    if (call) {
        if (cause[0])
            kb_rpc_call_destroy(&call); /* local read error: cancel, the cause is ours */
        else if (kb_rpc_call_finish(call, &ateenv__v1alpha__write_file_response__descriptor, &resp,
                                    &st) != 0)
            failed = true;
        kb_rpc_call_destroy(&call);
    }
    if (failed) {
        if (!cause[0])
            kb_cli_cause(&st, cause, sizeof cause);
        rc = kb_cli_fail(cli, "upload failed; remote file may be partial: %s", cause);
    } else if (cli->json) {
        rc = kb_cli_print(cli, resp);
    } else {
        fprintf(cli->out, "Wrote %lld bytes to %s\n",
                (long long)((Ateenv__V1alpha__WriteFileResponse *)resp)->bytes_written, remote);
    }
    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    free(buf);
    close(fd);
    return rc;
}

static const kb_flag_t s_upload_flags[] = {
    {"mode", 0, KB_F_UINT32, NULL, "remote Unix mode, e.g. 0644 (guest default if omitted)",
     "uint32"},
    {0},
};

const kb_cmd_t kb_cmd_sandbox_upload = {
    .name = "upload",
    .use = "upload ID LOCAL_FILE REMOTE_PATH",
    .short_help = "Stream a local file into a sandbox (replaces the remote file)",
    .long_help = "Stream a local file into a sandbox (replaces the remote file).\n\nLOCAL_FILE "
                 "must be a regular file of at most 64 MiB. REMOTE_PATH is absolute or relative "
                 "to /data/workspace.",
    .flags = s_upload_flags,
    .min_args = 3,
    .max_args = 3,
    .run = s_run_upload,
};

/* ------------------------------------------------------------------------------------------ */

/* Writes all of buf to fd. 0 or -errno. */
static int s_write_all(int fd, const uint8_t *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int s_run_download(kb_cli_t *cli, const kb_args_t *a)
{
    const char *sandbox_id = a->pos[0], *remote = a->pos[1], *local = a->pos[2];
    char *dup = strdup(local);
    if (!dup)
        return kb_cli_fail(cli, "out of memory");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/.kagent-download-XXXXXX", dirname(dup));
    free(dup);
    kb_rpc_t *rpc = kb_cli_rpc(cli);
    if (!rpc)
        return KB_EXIT_ERROR;
    int fd = mkstemp(tmp);
    if (fd < 0)
        return kb_cli_fail(cli,
                           "download failed: create temporary file in the destination "
                           "directory: %s",
                           strerror(errno));
    mode_t um = umask(0);
    umask(um);
    fchmod(fd, 0666 & ~um);
    Ateenv__V1alpha__ReadFileRequest req = ATEENV__V1ALPHA__READ_FILE_REQUEST__INIT;
    req.path = (char *)remote;
    kb_rpc_status_t st;
    char cause[KB_RPC_MSG_CAP + 64] = "";
    kb_rpc_call_t *call = kb_rpc_server_stream(rpc, "/ateenv.v1alpha.FileSystemService/ReadFile",
                                               sandbox_id, &req.base, &st);
    uint64_t got = 0;
    int rrc = call ? 0 : -1;
    ProtobufCMessage *m = NULL;
    while (call && (rrc = kb_rpc_call_read(call, &ateenv__v1alpha__read_file_response__descriptor,
                                           &m)) == 1) {
        Ateenv__V1alpha__ReadFileResponse *r = (Ateenv__V1alpha__ReadFileResponse *)m;
        got += r->chunk.len;
        int wrc = got > KB_TRANSFER_CAP ? -EFBIG : s_write_all(fd, r->chunk.data, r->chunk.len);
        protobuf_c_message_free_unpacked(m, NULL);
        if (wrc) {
            snprintf(cause, sizeof cause, "%s",
                     wrc == -EFBIG ? "File exceeds 64 MiB transfer limit" : strerror(-wrc));
            break;
        }
        kb_cli_progress(cli, "download", got, 0, false);
    }
    kb_cli_progress(cli, "download", got, 0, true);
    bool ok = !cause[0] && call && rrc == 0;
    if (call) {
        if (!cause[0] && kb_rpc_call_finish(call, NULL, NULL, &st) != 0)
            ok = false;
        kb_rpc_call_destroy(&call);
    }
    if (ok && fsync(fd) != 0) {
        snprintf(cause, sizeof cause, "sync temporary file: %s", strerror(errno));
        ok = false;
    }
    if (close(fd) != 0 && ok) {
        snprintf(cause, sizeof cause, "close temporary file: %s", strerror(errno));
        ok = false;
    }
    if (ok && rename(tmp, local) != 0) {
        snprintf(cause, sizeof cause, "rename to %s: %s", local, strerror(errno));
        ok = false;
    }
    if (!ok) {
        unlink(tmp);
        if (!cause[0])
            kb_cli_cause(&st, cause, sizeof cause);
        return kb_cli_fail(cli, "download failed; %s left unchanged: %s", local, cause);
    }
    if (cli->json) {
        json_t *j = json_pack("{s:s}", "path", local);
        if (j)
            kb_out_json(cli->out, j);
        json_decref(j);
    } else {
        fprintf(cli->out, "%s\n", local);
    }
    return KB_EXIT_OK;
}

const kb_cmd_t kb_cmd_sandbox_download = {
    .name = "download",
    .use = "download ID REMOTE_PATH LOCAL_FILE",
    .short_help = "Download a file, replacing the local destination only after success",
    .min_args = 3,
    .max_args = 3,
    .run = s_run_download,
};
