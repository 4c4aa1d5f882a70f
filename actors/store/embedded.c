/* ka_pg_embedded: see embedded.h. */
#include "embedded.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define S_PORT "5432"

static _Thread_local char s_error[1024];

const char *ka_pg_embedded_error(void)
{
    return s_error;
}

static int s_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_fail(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_error, sizeof(s_error), fmt, ap);
    va_end(ap);
    return rc;
}

/* Paths and identity for one state dir. */
typedef struct s_ctx {
    char base[4096];
    char data[4096];
    char bindir[4096];
    bool drop; /* run tools as the postgres user */
    uid_t uid;
    gid_t gid;
} s_ctx_t;

static int s_bindir(char *out, size_t cap)
{
    const char *env = getenv("KAGENT_PG_BINDIR");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return 0;
    }
    glob_t g;
    int rc = glob("/usr/lib/postgresql/*/bin/initdb", 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        globfree(&g);
        return s_fail(-ENOENT, "PostgreSQL server binaries not found under /usr/lib/postgresql "
                               "(apt-get install postgresql) and KAGENT_PG_BINDIR is not set");
    }
    /* newest major version: compare numerically */
    const char *best = NULL;
    long best_v = -1;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        long v = strtol(g.gl_pathv[i] + strlen("/usr/lib/postgresql/"), NULL, 10);
        if (v > best_v) {
            best_v = v;
            best = g.gl_pathv[i];
        }
    }
    snprintf(out, cap, "%.*s", (int)(strlen(best) - strlen("/initdb")), best);
    globfree(&g);
    return 0;
}

static int s_ctx_init(s_ctx_t *c, const char *state_dir)
{
    memset(c, 0, sizeof(*c));
    if (!state_dir || !*state_dir)
        return s_fail(-EINVAL, "no state directory");
    if (strlen(state_dir) > 80)
        return s_fail(-ENAMETOOLONG,
                      "state directory path too long for a unix socket (max 80 chars): %s",
                      state_dir);
    snprintf(c->base, sizeof(c->base), "%s/postgres", state_dir);
    snprintf(c->data, sizeof(c->data), "%s/postgres/data", state_dir);
    int rc = s_bindir(c->bindir, sizeof(c->bindir));
    if (rc)
        return rc;
    if (geteuid() == 0) {
        struct passwd *pw = getpwnam("postgres");
        if (!pw)
            return s_fail(-ENOENT, "running as root but there is no `postgres` user "
                                   "(it comes with Debian's postgresql package)");
        c->drop = true;
        c->uid = pw->pw_uid;
        c->gid = pw->pw_gid;
    } else {
        c->uid = geteuid();
        c->gid = getegid();
    }
    return 0;
}

/* Runs argv (argv[0] a program in bindir) as the cluster owner; stdin /dev/null, stdout and
 * stderr appended to <base>/ctl.log (so a daemonized server never holds the caller's pipes).
 * Returns the exit status (>= 0) or a negative code. */
static int s_run(const s_ctx_t *c, char *const argv[])
{
    char prog[4200], logpath[4200];
    snprintf(prog, sizeof(prog), "%s/%s", c->bindir, argv[0]);
    snprintf(logpath, sizeof(logpath), "%s/ctl.log", c->base);
    pid_t pid = fork();
    if (pid < 0)
        return s_fail(-errno, "fork: %s", strerror(errno));
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int out = open(logpath, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (in < 0 || out < 0)
            _exit(126);
        dup2(in, 0);
        dup2(out, 1);
        dup2(out, 2);
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        if (c->drop) {
            if (setgroups(0, NULL) != 0 || setgid(c->gid) != 0 || setuid(c->uid) != 0)
                _exit(126);
        }
        execv(prog, argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR)
            return s_fail(-errno, "waitpid: %s", strerror(errno));
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The tail of ctl.log, for error messages. */
static void s_log_tail(const s_ctx_t *c, const char *file, char *out, size_t cap)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", c->base, file);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > (long)cap - 1 ? size - ((long)cap - 1) : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
    for (char *p = out; *p; p++)
        if (*p == '\n')
            *p = ' ';
}

static int s_prepare_dirs(const s_ctx_t *c, const char *state_dir)
{
    if (mkdir(state_dir, 0755) != 0 && errno != EEXIST)
        return s_fail(-errno, "mkdir %s: %s", state_dir, strerror(errno));
    if (c->drop) {
        struct stat st;
        if (stat(state_dir, &st) != 0)
            return s_fail(-errno, "stat %s: %s", state_dir, strerror(errno));
        if (!(st.st_mode & S_IXOTH) && chmod(state_dir, (st.st_mode & 07777) | S_IXOTH) != 0)
            return s_fail(-errno, "chmod o+x %s: %s", state_dir, strerror(errno));
    }
    if (mkdir(c->base, 0700) != 0 && errno != EEXIST)
        return s_fail(-errno, "mkdir %s: %s", c->base, strerror(errno));
    if (chmod(c->base, 0700) != 0)
        return s_fail(-errno, "chmod %s: %s", c->base, strerror(errno));
    if (c->drop && chown(c->base, c->uid, c->gid) != 0)
        return s_fail(-errno, "chown %s: %s", c->base, strerror(errno));
    return 0;
}

/* Writes data/kagent.conf (socket dir, no TCP) and makes postgresql.conf include it. */
static int s_write_conf(const s_ctx_t *c)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/kagent.conf", c->data);
    FILE *f = fopen(path, "w");
    if (!f)
        return s_fail(-errno, "write %s: %s", path, strerror(errno));
    fprintf(f, "# written by kagentd at every start\nlisten_addresses = ''\nport = " S_PORT
               "\nunix_socket_directories = '");
    for (const char *p = c->base; *p; p++) {
        if (*p == '\'')
            fputc('\'', f);
        fputc(*p, f);
    }
    fprintf(f, "'\nmax_connections = 100\n");
    if (fclose(f) != 0)
        return s_fail(-EIO, "write %s", path);
    if (c->drop && chown(path, c->uid, c->gid) != 0)
        return s_fail(-errno, "chown %s: %s", path, strerror(errno));
    snprintf(path, sizeof(path), "%s/postgresql.conf", c->data);
    f = fopen(path, "r");
    if (!f)
        return s_fail(-errno, "read %s: %s", path, strerror(errno));
    char line[512];
    bool included = false;
    while (fgets(line, sizeof(line), f))
        included |= strstr(line, "include_if_exists = 'kagent.conf'") != NULL;
    fclose(f);
    if (!included) {
        f = fopen(path, "a");
        if (!f)
            return s_fail(-errno, "append %s: %s", path, strerror(errno));
        fprintf(f, "\ninclude_if_exists = 'kagent.conf'\n");
        fclose(f);
    }
    return 0;
}

static int s_initdb(const s_ctx_t *c)
{
    char pgv[4200];
    snprintf(pgv, sizeof(pgv), "%s/PG_VERSION", c->data);
    struct stat st;
    if (stat(pgv, &st) == 0 && st.st_size > 0)
        return 0; /* reuse */
    char *argv[] = {"initdb", "-D",   (char *)c->data,    "-U", "postgres", "-A", "trust",
                    "-E",     "UTF8", "--locale=C.UTF-8", NULL};
    int rc = s_run(c, argv);
    if (rc != 0) {
        char tail[600];
        s_log_tail(c, "ctl.log", tail, sizeof(tail));
        return s_fail(rc < 0 ? rc : -EIO, "initdb failed (status %d): %s", rc, tail);
    }
    return 0;
}

static char *s_conninfo(const s_ctx_t *c, const char *db)
{
    char *out = NULL;
    /* conninfo values in single quotes, with \ and ' escaped */
    char host[8300];
    size_t j = 0;
    for (const char *p = c->base; *p && j < sizeof(host) - 3; p++) {
        if (*p == '\'' || *p == '\\')
            host[j++] = '\\';
        host[j++] = *p;
    }
    host[j] = '\0';
    if (asprintf(&out, "host='%s' port=" S_PORT " user=postgres dbname=%s", host, db) < 0)
        return NULL;
    return out;
}

static int s_ensure_db(const s_ctx_t *c)
{
    char *ci = s_conninfo(c, "postgres");
    if (!ci)
        return s_fail(-ENOMEM, "out of memory");
    PGconn *conn = PQconnectdb(ci);
    free(ci);
    int rc = 0;
    if (PQstatus(conn) != CONNECTION_OK) {
        rc = s_fail(-ENOTCONN, "cannot connect to the embedded database: %s", PQerrorMessage(conn));
    } else {
        PGresult *r = PQexec(conn, "SELECT 1 FROM pg_database WHERE datname = 'kagent'");
        bool exists = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
        PQclear(r);
        if (!exists) {
            r = PQexec(conn, "CREATE DATABASE kagent");
            if (PQresultStatus(r) != PGRES_COMMAND_OK)
                rc = s_fail(-EIO, "create database kagent: %s", PQresultErrorMessage(r));
            PQclear(r);
        }
    }
    PQfinish(conn);
    return rc;
}

int ka_pg_embedded_running(const char *state_dir)
{
    s_ctx_t c;
    if (s_ctx_init(&c, state_dir) != 0)
        return 0;
    char pgv[4200];
    snprintf(pgv, sizeof(pgv), "%s/PG_VERSION", c.data);
    if (access(pgv, F_OK) != 0)
        return 0;
    char *argv[] = {"pg_ctl", "status", "-D", c.data, NULL};
    return s_run(&c, argv) == 0;
}

int ka_pg_embedded_start(const char *state_dir, char **conninfo_out)
{
    s_error[0] = '\0';
    if (!conninfo_out)
        return s_fail(-EINVAL, "conninfo_out is NULL");
    *conninfo_out = NULL;
    s_ctx_t c;
    int rc = s_ctx_init(&c, state_dir);
    if (!rc)
        rc = s_prepare_dirs(&c, state_dir);
    if (!rc)
        rc = s_initdb(&c);
    if (!rc)
        rc = s_write_conf(&c);
    if (rc)
        return rc;
    char *status[] = {"pg_ctl", "status", "-D", c.data, NULL};
    if (s_run(&c, status) != 0) {
        char logf[4200];
        snprintf(logf, sizeof(logf), "%s/server.log", c.base);
        char *start[] = {"pg_ctl", "start", "-D", c.data, "-l", logf, "-w", "-t", "60", "-s", NULL};
        rc = s_run(&c, start);
        if (rc != 0) {
            char tail[600];
            s_log_tail(&c, "server.log", tail, sizeof(tail));
            return s_fail(rc < 0 ? rc : -EIO, "pg_ctl start failed (status %d): %s", rc, tail);
        }
    }
    rc = s_ensure_db(&c);
    if (rc)
        return rc;
    *conninfo_out = s_conninfo(&c, "kagent");
    return *conninfo_out ? 0 : s_fail(-ENOMEM, "out of memory");
}

int ka_pg_embedded_stop(const char *state_dir)
{
    s_error[0] = '\0';
    s_ctx_t c;
    int rc = s_ctx_init(&c, state_dir);
    if (rc)
        return rc;
    char pgv[4200];
    snprintf(pgv, sizeof(pgv), "%s/PG_VERSION", c.data);
    if (access(pgv, F_OK) != 0)
        return 0; /* never created */
    char *status[] = {"pg_ctl", "status", "-D", c.data, NULL};
    if (s_run(&c, status) != 0)
        return 0; /* not running */
    char *stop[] = {"pg_ctl", "stop", "-D", c.data, "-m", "fast", "-w", "-t", "60", "-s", NULL};
    rc = s_run(&c, stop);
    if (rc != 0) {
        char tail[600];
        s_log_tail(&c, "ctl.log", tail, sizeof(tail));
        return s_fail(rc < 0 ? rc : -EIO, "pg_ctl stop failed (status %d): %s", rc, tail);
    }
    return 0;
}
