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
#include "krt.h"
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

/* The database, migrated first (the sequence and the name index exist). NULL with err set. */
static PGconn *s_db(const char *conninfo, char *err, size_t cap)
{
    PGconn *c = PQconnectdb(conninfo ? conninfo : "");
    char why[512] = "";
    if (PQstatus(c) != CONNECTION_OK)
        snprintf(why, sizeof why, "%s", PQerrorMessage(c));
    else if (ka_schema_migrate(c, NULL, NULL, why, sizeof why) == 0)
        return c;
    ka_node_fail(err, cap, "cannot check the node's identity: %s", why);
    PQfinish(c);
    return NULL;
}

/* One row of a statement with text parameters, or -1 with err set (0 rows: 0, *r NULL). */
static int s_query(PGconn *c, const char *sql, int n, const char *const *params, PGresult **r,
                   char *err, size_t cap)
{
    *r = PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(*r) != PGRES_TUPLES_OK) {
        ka_node_fail(err, cap, "cannot check the node's identity: %s", PQresultErrorMessage(*r));
        PQclear(*r);
        *r = NULL;
        return -1;
    }
    if (PQntuples(*r) == 0) {
        PQclear(*r);
        *r = NULL;
    }
    return 0;
}

/* Node names are unique in a cluster (sandboxes name their node by it), and an id is one
 * node's: 0 if no node but id (0: none) has name in the table and no live node under another
 * name has id, else -1 with err saying whose it is. */
static int s_name_free(PGconn *c, const char *name, uint16_t id, char *err, size_t cap)
{
    char ids[8];
    snprintf(ids, sizeof ids, "%u", (unsigned)id);
    const char *params[2] = {name, ids};
    PGresult *r;
    if (s_query(c,
                "SELECT id, name, lease_expires_at > now() FROM ka_nodes"
                " WHERE (name = $1 AND id <> $2)"
                " OR (id = $2 AND name <> $1 AND lease_expires_at > now())",
                2, params, &r, err, cap))
        return -1;
    if (!r)
        return 0;
    bool alive = PQgetvalue(r, 0, 2)[0] == 't';
    if (strcmp(PQgetvalue(r, 0, 1), name) != 0)
        ka_node_fail(err, cap,
                     "node.id %s is node \"%s\"'s, alive in the node table: two nodes under one "
                     "id would fence each other; leave node.id unset (an id is allocated) or give "
                     "each node its own",
                     ids, PQgetvalue(r, 0, 1));
    else
        ka_node_fail(err, cap,
                     "node.name \"%s\" is node %s's in the node table (%s): names are unique in a "
                     "cluster; give this node another node.name, or start it with that node's "
                     "state directory",
                     name, PQgetvalue(r, 0, 0),
                     alive ? "alive"
                           : "its lease lapsed; the row goes mesh.forget later, once no live "
                             "sandbox names it");
    PQclear(r);
    return -1;
}

/* A new id: the sequence's next value whose row does not exist yet (inserted, lease lapsed). */
static int s_allocate(PGconn *c, const char *name, uint16_t *id, char *err, size_t cap)
{
    const char *params[1] = {name};
    long got = 0;
    for (int i = 0; i < S_ALLOC_TRIES && !got; i++) {
        PGresult *r;
        if (s_query(c,
                    "INSERT INTO ka_nodes (id, name, lease_expires_at)"
                    " SELECT nextval('ka_node_ids')::text, $1, now()"
                    " ON CONFLICT DO NOTHING RETURNING id",
                    1, params, &r, err, cap))
            return -1;
        if (r) {
            got = strtol(PQgetvalue(r, 0, 0), NULL, 10);
            PQclear(r);
        } else if (s_name_free(c, name, 0, err, cap)) {
            return -1;
        }
    }
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
    PGconn *c = s_db(conninfo, err, cap);
    int rc = c ? s_allocate(c, name, id, err, cap) : -1;
    PQfinish(c);
    if (rc)
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
    if (s_node_id(dir, configured_id, conninfo, name, &out->node_id, err, cap))
        return -1;
    /* a database down now is the store's to wait for: the name index refuses a duplicate at
     * registration then (register_failed) */
    char why[512];
    PGconn *c = s_db(conninfo, why, sizeof why);
    if (!c) {
        krt_log(KRT_LOG_WARN, "identity", "name_unchecked", "%s", why);
        return 0;
    }
    int rc = s_name_free(c, name, out->node_id, err, cap);
    PQfinish(c);
    return rc;
}
