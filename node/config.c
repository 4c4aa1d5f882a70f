/*
 * ka_config: the node configuration. A table of sections and fields drives both parsing and
 * printing; every key lives in exactly one table row.
 */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ka_yaml.h"
#include "krt.h"

typedef enum {
    F_STR,      /* char[size] */
    F_INT,      /* int64_t in [min, max] */
    F_BOOL,     /* bool */
    F_DURATION, /* int64_t milliseconds */
    F_BYTES,    /* int64_t bytes */
    F_CPU,      /* int64_t millicpus */
    F_LOGLEVEL, /* int */
    F_LOGFMT,   /* bool: json? */
    F_AUTH,     /* ka_auth_mode_t */
    F_MAP,      /* a nested section over the same base */
    F_LIST,     /* a sequence of maps: elements of `size` bytes, count at count_off */
    F_STRLIST   /* a sequence of strings: char[max][size], count at count_off */
} s_ftype_t;

typedef struct s_section s_section_t;
typedef struct {
    const char *key;
    s_ftype_t type;
    size_t off;
    size_t size;
    int64_t min, max;
    const s_section_t *sub;
    size_t count_off, max_items;
    void (*init)(void *elem); /* F_LIST: element defaults, else NULL */
} s_field_t;

struct s_section {
    const s_field_t *fields;
    size_t n;
};

#define OFF(f) offsetof(ka_config_t, f)
#define SZ(f)  sizeof(((ka_config_t *)0)->f)
#define STR(k, f)                                                                                  \
    {                                                                                              \
        .key = k, .type = F_STR, .off = OFF(f), .size = SZ(f)                                      \
    }
#define INT(k, f, lo, hi)                                                                          \
    {                                                                                              \
        .key = k, .type = F_INT, .off = OFF(f), .min = lo, .max = hi                               \
    }
#define TYPED(k, t, f)                                                                             \
    {                                                                                              \
        .key = k, .type = t, .off = OFF(f)                                                         \
    }
#define MAP(k, s)                                                                                  \
    {                                                                                              \
        .key = k, .type = F_MAP, .sub = &s                                                         \
    }
#define ESTR(k, T, f)                                                                              \
    {                                                                                              \
        .key = k, .type = F_STR, .off = offsetof(T, f), .size = sizeof(((T *)0)->f)                \
    }
#define EINT(k, T, f, lo, hi)                                                                      \
    {                                                                                              \
        .key = k, .type = F_INT, .off = offsetof(T, f), .min = lo, .max = hi                       \
    }
#define LIST(k, f, T, s, n, c, i)                                                                  \
    {                                                                                              \
        .key = k, .type = F_LIST, .off = OFF(f), .size = sizeof(T), .sub = &s,                     \
        .count_off = OFF(n), .max_items = c, .init = i                                             \
    }
#define SECTION(a)                                                                                 \
    {                                                                                              \
        a, sizeof a / sizeof a[0]                                                                  \
    }

static void s_pool_defaults(void *elem)
{
    ka_pool_cfg_t *p = elem;
    strcpy(p->klass, "namespaces");
    p->capacity = 1000;
    p->warm = KA_DEFAULT_WARM;
}

static const s_field_t s_pool_fields[] = {
    ESTR("name", ka_pool_cfg_t, name),
    ESTR("class", ka_pool_cfg_t, klass),
    EINT("capacity", ka_pool_cfg_t, capacity, 1, 1000000),
    EINT("warm", ka_pool_cfg_t, warm, 0, 1000),
};
static const s_section_t s_pool = SECTION(s_pool_fields);

static const s_field_t s_registry_fields[] = {
    ESTR("host", ka_registry_cfg_t, host),
    ESTR("endpoint", ka_registry_cfg_t, endpoint),
    {.key = "insecure", .type = F_BOOL, .off = offsetof(ka_registry_cfg_t, insecure)},
};
static const s_section_t s_registry = SECTION(s_registry_fields);

static const s_field_t s_node_fields[] = {
    STR("name", node_name),
    INT("id", node_id, 0, 65535), /* 0: allocated from the database (ka_identity) */
    STR("stateDir", state_dir),
};
static const s_field_t s_tls_fields[] = {
    STR("certFile", tls_cert_file),
    STR("keyFile", tls_key_file),
    STR("clientCAFile", tls_client_ca_file),
    TYPED("requireClientCert", F_BOOL, tls_require_client_cert),
};
static const s_section_t s_tls = SECTION(s_tls_fields);
static const s_field_t s_listen_fields[] = {
    STR("address", listen_address),
    INT("port", listen_port, 0, 65535), /* 0: an ephemeral port (tests) */
    MAP("tls", s_tls),
};
static const s_field_t s_log_fields[] = {
    TYPED("level", F_LOGLEVEL, log_level),
    TYPED("format", F_LOGFMT, log_json),
};
static const s_field_t s_runtime_fields[] = {
    INT("schedulers", schedulers, 0, 256),
    INT("jobThreads", job_threads, 0, 256),
};
static const s_field_t s_database_fields[] = {STR("url", database_url)};
static const s_field_t s_auth_fields[] = {
    TYPED("mode", F_AUTH, auth_mode),
    STR("tokensFile", tokens_file),
    {.key = "operators",
     .type = F_STRLIST,
     .off = OFF(operators),
     .size = SZ(operators[0]),
     .count_off = OFF(n_operators),
     .max_items = KA_CFG_MAX_OPERATORS},
};
static const s_field_t s_guest_image_fields[] = {STR("digest", guest_image_digest)};
static const s_section_t s_guest_image = SECTION(s_guest_image_fields);
static const s_field_t s_sandbox_fields[] = {
    STR("class", sandbox_class),
    MAP("guestImage", s_guest_image),
    TYPED("cpu", F_CPU, cpu_millis),
    TYPED("memory", F_BYTES, memory_bytes),
    TYPED("defaultTTL", F_DURATION, default_ttl_ms),
    TYPED("maxTTL", F_DURATION, max_ttl_ms),
    INT("maxProcesses", max_processes, 1, 1000),
    TYPED("processTimeout", F_DURATION, process_timeout_ms),
    TYPED("spoolBytes", F_BYTES, spool_bytes),
    INT("pidsMax", pids_max, 8, 1000000),
    TYPED("disk", F_BYTES, disk_bytes),
    INT("diskInodes", disk_inodes, 0, 4294967295LL),
    INT("maxOpenFiles", max_open_files, 64, 1048576),
    INT("uidBase", uid_base, 100000, 4294967294LL),
    INT("uidCount", uid_count, 1, 16777216),
};
static const s_field_t s_images_fields[] = {
    LIST("registries", registries, ka_registry_cfg_t, s_registry, n_registries, KA_CFG_MAX_REGS,
         NULL),
};
static const s_field_t s_mcp_fields[] = {
    {.key = "allowedHosts",
     .type = F_STRLIST,
     .off = OFF(allowed_hosts),
     .size = SZ(allowed_hosts[0]),
     .count_off = OFF(n_allowed_hosts),
     .max_items = KA_CFG_MAX_HOSTS},
};
static const s_field_t s_snapshots_fields[] = {
    STR("credentialsFile", snapshot_credentials_file),
};
static const s_field_t s_mesh_fields[] = {
    STR("bind", mesh_bind),
    STR("advertise", mesh_advertise),
    TYPED("lease", F_DURATION, lease_ms),
    TYPED("renew", F_DURATION, renew_ms),
    TYPED("forget", F_DURATION, forget_ms),
};

static const s_section_t s_node = SECTION(s_node_fields), s_listen = SECTION(s_listen_fields),
                         s_log = SECTION(s_log_fields), s_runtime = SECTION(s_runtime_fields),
                         s_database = SECTION(s_database_fields), s_auth = SECTION(s_auth_fields),
                         s_sandbox = SECTION(s_sandbox_fields), s_images = SECTION(s_images_fields),
                         s_mcp = SECTION(s_mcp_fields), s_mesh = SECTION(s_mesh_fields),
                         s_snapshots = SECTION(s_snapshots_fields);

static const s_field_t s_top_fields[] = {
    MAP("node", s_node),
    MAP("listen", s_listen),
    MAP("log", s_log),
    MAP("runtime", s_runtime),
    MAP("database", s_database),
    MAP("auth", s_auth),
    MAP("sandbox", s_sandbox),
    LIST("pools", pools, ka_pool_cfg_t, s_pool, n_pools, KA_CFG_MAX_POOLS, s_pool_defaults),
    MAP("images", s_images),
    MAP("mcp", s_mcp),
    MAP("mesh", s_mesh),
    MAP("snapshots", s_snapshots),
};
static const s_section_t s_top = SECTION(s_top_fields);

/* ---- value parsers ------------------------------------------------------------------------ */

typedef struct {
    const char *suffix;
    double mul;
} s_unit_t;

/* Parses "<number><suffix>" repeated (once unless `repeat`), summing number * unit. Numbers are
 * non-negative decimals; suffixes are matched exactly (the table lists "ms" before "m"). */
static int s_parse_units(const char *s, const s_unit_t *units, size_t n, bool repeat, int64_t *out)
{
    double total = 0;
    if (!s || !*s)
        return -EINVAL;
    do {
        if (!isdigit((unsigned char)*s))
            return -EINVAL;
        char *end;
        double v = strtod(s, &end);
        size_t i;
        for (i = 0; i < n; i++) {
            size_t len = strlen(units[i].suffix);
            if (strncmp(end, units[i].suffix, len) == 0 && !isalpha((unsigned char)end[len]))
                break;
        }
        if (i == n)
            return -EINVAL;
        total += v * units[i].mul;
        s = end + strlen(units[i].suffix);
    } while (repeat && *s);
    if (*s || total > 9.2e18)
        return -EINVAL;
    *out = (int64_t)(total + 0.5);
    return 0;
}

int ka_parse_duration_ms(const char *s, int64_t *out)
{
    static const s_unit_t units[] = {
        {"ms", 1}, {"s", 1e3}, {"m", 6e4}, {"h", 3.6e6}, {"d", 8.64e7}};
    return s_parse_units(s, units, sizeof units / sizeof units[0], true, out);
}

int ka_parse_bytes(const char *s, int64_t *out)
{
    static const s_unit_t units[] = {{"Ki", 0x1p10}, {"Mi", 0x1p20}, {"Gi", 0x1p30},
                                     {"Ti", 0x1p40}, {"K", 1e3},     {"M", 1e6},
                                     {"G", 1e9},     {"T", 1e12},    {"", 1}};
    return s_parse_units(s, units, sizeof units / sizeof units[0], false, out);
}

int ka_parse_cpu_millis(const char *s, int64_t *out)
{
    static const s_unit_t units[] = {{"m", 1}, {"", 1000}};
    return s_parse_units(s, units, sizeof units / sizeof units[0], false, out);
}

/* ---- the walker --------------------------------------------------------------------------- */

typedef struct {
    const char *origin;
    char *err;
    size_t errcap;
} s_ctx_t;

static int s_err(s_ctx_t *c, int line, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int s_err(s_ctx_t *c, int line, const char *path, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errcap, "%s:%d: %s: %s", c->origin, line, path, what);
    return -EINVAL;
}

static int s_apply_section(s_ctx_t *c, const s_section_t *sec, const ka_yaml_node_t *map,
                           void *base, const char *prefix);

static bool s_scalar_of(const ka_yaml_node_t *n)
{
    return n->kind == KA_YAML_SCALAR;
}

static int s_apply_str(s_ctx_t *c, const s_field_t *f, const ka_yaml_node_t *n, char *dst,
                       size_t cap, const char *path)
{
    if (!s_scalar_of(n))
        return s_err(c, n->line, path, "expected a string, found a %s", ka_yaml_kind_name(n->kind));
    if (strlen(n->value) >= cap)
        return s_err(c, n->line, path, "too long (at most %zu characters)", cap - 1);
    strcpy(dst, n->value);
    return 0;
}

static int s_apply_list(s_ctx_t *c, const s_field_t *f, const ka_yaml_node_t *n, void *base,
                        const char *path)
{
    if (n->kind != KA_YAML_SEQ)
        return s_err(c, n->line, path, "expected a list, found a %s", ka_yaml_kind_name(n->kind));
    if (n->n_children > f->max_items)
        return s_err(c, n->line, path, "too many entries (%zu, at most %zu)", n->n_children,
                     f->max_items);
    size_t i = 0;
    for (const ka_yaml_node_t *e = n->child; e; e = e->next, i++) {
        char epath[240];
        snprintf(epath, sizeof epath, "%s[%zu]", path, i);
        char *slot = (char *)base + f->off + i * f->size;
        int rc;
        if (f->type == F_STRLIST)
            rc = s_apply_str(c, f, e, slot, f->size, epath);
        else if (e->kind != KA_YAML_MAP)
            rc = s_err(c, e->line, epath, "expected a map, found a %s", ka_yaml_kind_name(e->kind));
        else {
            memset(slot, 0, f->size);
            if (f->init)
                f->init(slot);
            rc = s_apply_section(c, f->sub, e, slot, epath);
        }
        if (rc)
            return rc;
    }
    *(size_t *)((char *)base + f->count_off) = i;
    return 0;
}

static int s_apply_scalar(s_ctx_t *c, const s_field_t *f, const ka_yaml_node_t *n, void *base,
                          const char *path)
{
    void *dst = (char *)base + f->off;
    const char *v = n->value;
    int64_t x;
    if (!s_scalar_of(n))
        return s_err(c, n->line, path, "expected a value, found a %s", ka_yaml_kind_name(n->kind));
    switch (f->type) {
    case F_INT: {
        char *end;
        errno = 0;
        long long ll = strtoll(v, &end, 10);
        if (n->quoted || !*v || *end || errno)
            return s_err(c, n->line, path, "expected an integer, found \"%s\"", v);
        if (ll < f->min || ll > f->max)
            return s_err(c, n->line, path, "%lld is out of range [%" PRId64 ", %" PRId64 "]", ll,
                         f->min, f->max);
        *(int64_t *)dst = ll;
        return 0;
    }
    case F_BOOL:
        if (!n->quoted && (!strcmp(v, "true") || !strcmp(v, "false"))) {
            *(bool *)dst = v[0] == 't';
            return 0;
        }
        return s_err(c, n->line, path, "expected true or false, found \"%s\"", v);
    case F_DURATION:
        if (ka_parse_duration_ms(v, &x))
            return s_err(c, n->line, path, "expected a duration like 90s, 30m or 1h, found \"%s\"",
                         v);
        *(int64_t *)dst = x;
        return 0;
    case F_BYTES:
        if (ka_parse_bytes(v, &x))
            return s_err(c, n->line, path, "expected a size like 512Mi or 1Gi, found \"%s\"", v);
        *(int64_t *)dst = x;
        return 0;
    case F_CPU:
        if (ka_parse_cpu_millis(v, &x) || x < 10)
            return s_err(c, n->line, path,
                         "expected CPUs like 1, 0.5 or 500m (>= 10m), found \"%s\"", v);
        *(int64_t *)dst = x;
        return 0;
    case F_LOGLEVEL:
        if (krt_log_level_parse(v) < 0)
            return s_err(c, n->line, path, "expected debug, info, warn or error, found \"%s\"", v);
        *(int *)dst = krt_log_level_parse(v);
        return 0;
    case F_LOGFMT:
        if (strcmp(v, "text") && strcmp(v, "json"))
            return s_err(c, n->line, path, "expected text or json, found \"%s\"", v);
        *(bool *)dst = v[0] == 'j';
        return 0;
    case F_AUTH:
        if (strcmp(v, "user-header") && strcmp(v, "tokens"))
            return s_err(c, n->line, path, "expected user-header or tokens, found \"%s\"", v);
        *(ka_auth_mode_t *)dst = v[0] == 't' ? KA_AUTH_TOKENS : KA_AUTH_USER_HEADER;
        return 0;
    default:
        return s_apply_str(c, f, n, dst, f->size, path);
    }
}

static const s_field_t *s_find(const s_section_t *sec, const char *key)
{
    for (size_t i = 0; i < sec->n; i++)
        if (strcmp(sec->fields[i].key, key) == 0)
            return &sec->fields[i];
    return NULL;
}

static int s_apply_section(s_ctx_t *c, const s_section_t *sec, const ka_yaml_node_t *map,
                           void *base, const char *prefix)
{
    for (const ka_yaml_node_t *n = map->child; n; n = n->next) {
        char path[200];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", n->key);
        const s_field_t *f = s_find(sec, n->key);
        if (!f)
            return s_err(c, n->key_line, path, "unknown key");
        int rc;
        if (f->type == F_MAP)
            rc = n->kind == KA_YAML_MAP ? s_apply_section(c, f->sub, n, base, path)
                 : ka_yaml_is_null(n)   ? 0
                                        : s_err(c, n->line, path, "expected a map, found a %s",
                                                ka_yaml_kind_name(n->kind));
        else if (f->type == F_LIST || f->type == F_STRLIST)
            rc = s_apply_list(c, f, n, base, path);
        else
            rc = s_apply_scalar(c, f, n, base, path);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- public ------------------------------------------------------------------------------- */

void ka_config_defaults(ka_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->node_name, "node-1");
    strcpy(cfg->state_dir, "/var/lib/kagent");
    strcpy(cfg->listen_address, "127.0.0.1");
    cfg->listen_port = KA_DEFAULT_PORT;
    cfg->log_level = KRT_LOG_INFO;
    cfg->auth_mode = KA_AUTH_USER_HEADER;
    strcpy(cfg->sandbox_class, "namespaces");
    cfg->cpu_millis = 1000;
    cfg->memory_bytes = 1LL << 30;
    cfg->default_ttl_ms = 3600000;
    cfg->lease_ms = 5000;
    cfg->renew_ms = 1000;
    cfg->forget_ms = 3600000;
    cfg->max_ttl_ms = 24 * 3600000LL;
    cfg->max_processes = 10;
    cfg->process_timeout_ms = 3600000;
    cfg->spool_bytes = 10LL << 20;
    cfg->pids_max = 256;
    cfg->disk_bytes = 10LL << 30;
    cfg->max_open_files = 1024;
    cfg->uid_base = 1000000;
    cfg->uid_count = 65536;
    strcpy(cfg->pools[0].name, KA_DEFAULT_POOL);
    strcpy(cfg->pools[0].klass, "namespaces");
    cfg->pools[0].capacity = 1000;
    cfg->pools[0].warm = KA_DEFAULT_WARM;
    cfg->n_pools = 1;
    strcpy(cfg->allowed_hosts[0], "localhost");
    strcpy(cfg->allowed_hosts[1], "127.0.0.1");
    cfg->n_allowed_hosts = 2;
}

static bool s_is_digest(const char *s)
{
    if (strncmp(s, "sha256:", 7) != 0 || strlen(s) != 7 + 64)
        return false;
    for (s += 7; *s; s++)
        if (!isdigit((unsigned char)*s) && !(*s >= 'a' && *s <= 'f'))
            return false;
    return true;
}

static int s_invalid(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int s_invalid(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int s_validate_pools(const ka_config_t *cfg, char *err, size_t cap)
{
    if (cfg->n_pools == 0)
        return s_invalid(err, cap, "pools: at least one pool is required");
    for (size_t i = 0; i < cfg->n_pools; i++) {
        const ka_pool_cfg_t *p = &cfg->pools[i];
        if (!p->name[0])
            return s_invalid(err, cap, "pools[%zu].name: required", i);
        if (strcmp(p->klass, "namespaces") != 0)
            return s_invalid(
                err, cap,
                "pools[%zu].class: unsupported sandbox class \"%s\" (this node offers: namespaces)",
                i, p->klass);
        for (size_t j = 0; j < i; j++)
            if (strcmp(cfg->pools[j].name, p->name) == 0)
                return s_invalid(err, cap, "pools[%zu].name: duplicate pool \"%s\"", i, p->name);
    }
    return 0;
}

bool ka_config_tls(const ka_config_t *cfg)
{
    return cfg->tls_cert_file[0] != '\0';
}

bool ka_config_loopback(const char *address)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcmp(address, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, address, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, address, &a6) != 1)
        return false;
    if (IN6_IS_ADDR_LOOPBACK(&a6))
        return true;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

static int s_validate_listen(const ka_config_t *cfg, char *err, size_t cap)
{
    bool tls = ka_config_tls(cfg), loopback = ka_config_loopback(cfg->listen_address);
    if (tls != (cfg->tls_key_file[0] != '\0'))
        return s_invalid(err, cap, "listen.tls: certFile and keyFile go together (%s is missing)",
                         tls ? "keyFile" : "certFile");
    if (cfg->tls_client_ca_file[0] && !tls)
        return s_invalid(err, cap, "listen.tls.clientCAFile: needs listen.tls.certFile/keyFile");
    if (cfg->tls_require_client_cert && !cfg->tls_client_ca_file[0])
        return s_invalid(err, cap, "listen.tls.requireClientCert: needs listen.tls.clientCAFile");
    if (cfg->auth_mode == KA_AUTH_USER_HEADER && !loopback)
        return s_invalid(err, cap,
                         "auth.mode: user-header trusts any caller, so listen.address "
                         "must be loopback (use auth.mode: tokens to listen on %s)",
                         cfg->listen_address);
    if (!loopback && !tls)
        return s_invalid(err, cap,
                         "listen.tls: required when listen.address (%s) is not loopback: bearer "
                         "tokens and files must not cross the network in clear",
                         cfg->listen_address);
    return 0;
}

int ka_config_validate(const ka_config_t *cfg, char *err, size_t cap)
{
    if (!cfg->guest_image_digest[0])
        return s_invalid(err, cap,
                         "sandbox.guestImage.digest: required (the digest of the guest "
                         "image; `make run` builds it and writes it into the config)");
    if (!s_is_digest(cfg->guest_image_digest))
        return s_invalid(err, cap,
                         "sandbox.guestImage.digest: must be sha256:<64 lowercase hex>, got \"%s\"",
                         cfg->guest_image_digest);
    if (!cfg->state_dir[0] || cfg->state_dir[0] != '/')
        return s_invalid(err, cap, "node.stateDir: must be an absolute path");
    if (cfg->default_ttl_ms < 1000 || cfg->max_ttl_ms < 1000)
        return s_invalid(err, cap, "sandbox.defaultTTL/maxTTL: must be at least 1s");
    if (cfg->default_ttl_ms > cfg->max_ttl_ms)
        return s_invalid(err, cap, "sandbox.defaultTTL: must not exceed sandbox.maxTTL");
    if (cfg->renew_ms < 100 || cfg->lease_ms < 2 * cfg->renew_ms || cfg->lease_ms > 3600000)
        return s_invalid(err, cap,
                         "mesh.lease/renew: renew must be at least 100ms and the lease at least "
                         "two renewals (and at most 1h)");
    if (cfg->forget_ms < cfg->lease_ms)
        return s_invalid(err, cap, "mesh.forget: must be at least mesh.lease");
    if (cfg->uid_base + cfg->uid_count > 4294967295LL)
        return s_invalid(err, cap, "sandbox.uidBase + sandbox.uidCount: must stay below 2^32");
    if (cfg->memory_bytes < (16LL << 20))
        return s_invalid(err, cap, "sandbox.memory: must be at least 16Mi");
    if (cfg->disk_bytes < (16LL << 20))
        return s_invalid(err, cap, "sandbox.disk: must be at least 16Mi");
    if (cfg->disk_inodes != 0 &&
        (cfg->disk_inodes < 16 || cfg->disk_inodes > cfg->disk_bytes / 4096))
        return s_invalid(err, cap,
                         "sandbox.diskInodes: must be 0 (automatic) or 16 to one per 4 KiB of "
                         "sandbox.disk");
    if (strcmp(cfg->sandbox_class, "namespaces") != 0)
        return s_invalid(
            err, cap,
            "sandbox.class: unsupported sandbox class \"%s\" (this node offers: namespaces)",
            cfg->sandbox_class);
    if (cfg->auth_mode == KA_AUTH_TOKENS && !cfg->tokens_file[0])
        return s_invalid(err, cap, "auth.tokensFile: required when auth.mode is tokens");
    int rc = s_validate_listen(cfg, err, cap);
    return rc ? rc : s_validate_pools(cfg, err, cap);
}

int ka_config_load_buffer(ka_config_t *cfg, const char *origin, const char *yaml, size_t len,
                          char *err, size_t errcap)
{
    ka_yaml_node_t *root = NULL;
    char yerr[KA_YAML_ERR_CAP];
    ka_config_defaults(cfg);
    if (ka_yaml_parse(yaml, len, &root, yerr, sizeof yerr)) {
        snprintf(err, errcap, "%s: %s", origin, yerr);
        return -EINVAL;
    }
    s_ctx_t c = {origin, err, errcap};
    int rc = 0;
    if (root->kind != KA_YAML_MAP)
        rc = s_err(&c, root->line, "(top)", "expected a map of sections, found a %s",
                   ka_yaml_kind_name(root->kind));
    else
        rc = s_apply_section(&c, &s_top, root, cfg, "");
    ka_yaml_free(&root);
    if (rc)
        return rc;
    char verr[KA_CFG_ERR_CAP];
    if (ka_config_validate(cfg, verr, sizeof verr)) {
        snprintf(err, errcap, "%s: %s", origin, verr);
        return -EINVAL;
    }
    return 0;
}

int ka_config_load_file(ka_config_t *cfg, const char *path, char *err, size_t errcap)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, errcap, "%s: %s", path, strerror(e));
        return -e;
    }
    char *buf = malloc(KA_YAML_MAX_BYTES + 1);
    size_t len = buf ? fread(buf, 1, KA_YAML_MAX_BYTES + 1, f) : 0;
    int rc = buf ? ka_config_load_buffer(cfg, path, buf, len, err, errcap) : -ENOMEM;
    if (rc == -ENOMEM)
        snprintf(err, errcap, "%s: out of memory", path);
    free(buf);
    fclose(f);
    return rc;
}

/* ---- printing ----------------------------------------------------------------------------- */

static void s_print_ms(FILE *out, int64_t ms)
{
    if (ms % 3600000 == 0)
        fprintf(out, "%" PRId64 "h", ms / 3600000);
    else if (ms % 60000 == 0)
        fprintf(out, "%" PRId64 "m", ms / 60000);
    else if (ms % 1000 == 0)
        fprintf(out, "%" PRId64 "s", ms / 1000);
    else
        fprintf(out, "%" PRId64 "ms", ms);
}

static void s_print_value(FILE *out, const s_field_t *f, const void *base)
{
    const void *v = (const char *)base + f->off;
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    switch (f->type) {
    case F_INT:
    case F_BYTES:
        fprintf(out, "%" PRId64, *(const int64_t *)v);
        break;
    case F_CPU:
        fprintf(out, "%" PRId64 "m", *(const int64_t *)v);
        break;
    case F_DURATION:
        s_print_ms(out, *(const int64_t *)v);
        break;
    case F_BOOL:
        fputs(*(const bool *)v ? "true" : "false", out);
        break;
    case F_LOGLEVEL:
        fputs(levels[*(const int *)v], out);
        break;
    case F_LOGFMT:
        fputs(*(const bool *)v ? "json" : "text", out);
        break;
    case F_AUTH:
        fputs(*(const ka_auth_mode_t *)v == KA_AUTH_TOKENS ? "tokens" : "user-header", out);
        break;
    default:
        fprintf(out, "\"%s\"", (const char *)v);
    }
}

static void s_print_section(FILE *out, const s_section_t *sec, const void *base, int indent,
                            bool first_dash)
{
    for (size_t i = 0; i < sec->n; i++) {
        const s_field_t *f = &sec->fields[i];
        int pad = indent - (first_dash && i == 0 ? 2 : 0);
        fprintf(out, "%*s%s%s:", pad, "", first_dash && i == 0 ? "- " : "", f->key);
        if (f->type == F_MAP) {
            fputc('\n', out);
            s_print_section(out, f->sub, base, indent + 2, false);
            continue;
        }
        if (f->type == F_LIST || f->type == F_STRLIST) {
            size_t n = *(const size_t *)((const char *)base + f->count_off);
            fputs(n ? "\n" : " []\n", out);
            for (size_t j = 0; j < n; j++) {
                const char *slot = (const char *)base + f->off + j * f->size;
                if (f->type == F_STRLIST)
                    fprintf(out, "%*s- \"%s\"\n", indent + 2, "", slot);
                else
                    s_print_section(out, f->sub, slot, indent + 4, true);
            }
            continue;
        }
        fputc(' ', out);
        s_print_value(out, f, base);
        fputc('\n', out);
    }
}

void ka_config_print(const ka_config_t *cfg, FILE *out)
{
    s_print_section(out, &s_top, cfg, 0, false);
}
