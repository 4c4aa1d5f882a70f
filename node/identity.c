/* ka_identity: the node id and the mesh keys in the state directory (identity.h). */
#include "identity.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <zmq.h>

#include "ka_tree.h"
#include "schema.h"
#include "node_err.h"

#define S_ALLOC_TRIES 64 /* sequence values skipped because a configured id took them */

/* Writes text to path atomically (a temporary file renamed over it), with mode. 0 or -errno. */
static int s_write(const char *path, const char *text, mode_t mode)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -errno;
    size_t len = strlen(text);
    int rc = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0 ? 0 : -EIO;
    close(fd);
    if (!rc && rename(tmp, path))
        rc = -errno;
    if (rc)
        unlink(tmp);
    return rc;
}

/* Reads up to cap-1 bytes of path. 0, -ENOENT or -errno. */
static int s_read(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, cap - 1);
    int e = n < 0 ? -errno : 0;
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return e;
}

/* A new id: the sequence's next value whose row does not exist yet (inserted, lease lapsed). */
static int s_allocate(const char *conninfo, const char *name, uint16_t *id, char *err, size_t cap)
{
    char why[512] = "";
    if (ka_schema_migrate_url(conninfo, NULL, NULL, why, sizeof why))
        return ka_node_fail(err, cap, "cannot allocate a node id: %s", why);
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        ka_node_fail(err, cap, "cannot allocate a node id: %s", PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    const char *params[1] = {name};
    long got = 0;
    for (int i = 0; i < S_ALLOC_TRIES && !got; i++) {
        PGresult *r = PQexecParams(c,
                                   "INSERT INTO ka_nodes (id, name, lease_expires_at)"
                                   " SELECT nextval('ka_node_ids')::text, $1, now()"
                                   " ON CONFLICT (id) DO NOTHING RETURNING id",
                                   1, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            ka_node_fail(err, cap, "cannot allocate a node id: %s", PQresultErrorMessage(r));
            PQclear(r);
            PQfinish(c);
            return -1;
        }
        if (PQntuples(r) == 1)
            got = strtol(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    }
    PQfinish(c);
    if (got < 1 || got > 65535)
        return ka_node_fail(err, cap, "cannot allocate a node id: none free");
    *id = (uint16_t)got;
    return 0;
}

static int s_node_id(const char *dir, int configured, const char *conninfo, const char *name,
                     uint16_t *id, char *err, size_t cap)
{
    if (configured > 0) {
        *id = (uint16_t)configured;
        return 0;
    }
    char path[PATH_MAX], text[32];
    snprintf(path, sizeof path, "%.4000s/node-id", dir);
    int e = s_read(path, text, sizeof text);
    if (e == 0) {
        char *end;
        long v = strtol(text, &end, 10);
        if (v < 1 || v > 65535 || (*end && *end != '\n'))
            return ka_node_fail(err, cap, "%s: not a node id (1..65535)", path);
        *id = (uint16_t)v;
        return 0;
    }
    if (e != -ENOENT)
        return ka_node_fail(err, cap, "cannot read %s: %s", path, strerror(-e));
    if (s_allocate(conninfo, name, id, err, cap))
        return -1;
    snprintf(text, sizeof text, "%u\n", (unsigned)*id);
    if ((e = s_write(path, text, 0644)))
        return ka_node_fail(err, cap, "cannot write %s: %s", path, strerror(-e));
    return 0;
}

static bool s_z85_key(const char *k)
{
    return strlen(k) == KA_IDENTITY_KEY_LEN - 1;
}

static int s_keys(const char *dir, ka_identity_t *out, char *err, size_t cap)
{
    char path[PATH_MAX], text[2 * KA_IDENTITY_KEY_LEN + 8];
    snprintf(path, sizeof path, "%.4000s/mesh.key", dir);
    int e = s_read(path, text, sizeof text);
    if (e == -ENOENT) {
        if (zmq_curve_keypair(out->public_key, out->secret_key))
            return ka_node_fail(err, cap, "cannot generate the mesh keys: %s", zmq_strerror(errno));
        snprintf(text, sizeof text, "%s\n%s\n", out->public_key, out->secret_key);
        if ((e = s_write(path, text, 0600)))
            return ka_node_fail(err, cap, "cannot write %s: %s", path, strerror(-e));
        return 0;
    }
    if (e)
        return ka_node_fail(err, cap, "cannot read %s: %s", path, strerror(-e));
    struct stat st;
    if (stat(path, &st) || (st.st_mode & 077))
        return ka_node_fail(err, cap, "%s: must be readable by its owner only (mode 0600)", path);
    if (sscanf(text, "%40s %40s", out->public_key, out->secret_key) != 2 ||
        !s_z85_key(out->public_key) || !s_z85_key(out->secret_key))
        return ka_node_fail(err, cap, "%s: not a z85 public and secret key", path);
    return 0;
}

int ka_identity_load(const char *state_dir, int configured_id, const char *conninfo,
                     const char *name, ka_identity_t *out, char *err, size_t cap)
{
    memset(out, 0, sizeof *out);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.4000s/cluster", state_dir);
    int e = ka_mkdirs(dir, 0700);
    if (e)
        return ka_node_fail(err, cap, "cannot create %s: %s", dir, strerror(-e));
    if (s_keys(dir, out, err, cap))
        return -1;
    return s_node_id(dir, configured_id, conninfo, name, &out->node_id, err, cap);
}
