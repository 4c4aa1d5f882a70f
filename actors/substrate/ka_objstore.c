/* ka_objstore: an S3 client on libcurl's SigV4 signer (ka_objstore.h). */
#include "ka_objstore.h"
#include "krt.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define S_URL_CAP        4096
#define S_KEY_CAP        1024
#define S_SECRET_CAP     256
#define S_TOKEN_CAP      4096
#define S_BODY_CAP       (64u << 10) /* error and XML replies kept at most */
#define S_BACKOFF_MAX_MS 2000
#define S_GET_BUFFER     (128L << 10) /* a download's receive buffer (libcurl's default: 16 KiB) */
#define S_SIZE_UNKNOWN   UINT64_MAX
#define S_GCS_ENDPOINT   "https://storage.googleapis.com"
#define S_EMPTY_SHA256   "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

typedef struct s_creds {
    char key_id[S_SECRET_CAP], secret[S_SECRET_CAP], token[S_TOKEN_CAP];
    char region[64], endpoint[S_URL_CAP];
} s_creds_t;

struct ka_objstore {
    CURL *curl;
    ka_objstore_opts_t o;
    s_creds_t c;
    char bucket[256], prefix[S_KEY_CAP];
    char base[S_URL_CAP]; /* URL up to the key: ".../bucket/" or "https://bucket.host/" */
    char scheme[8];       /* "s3" or "gs", for messages */
    char userpwd[2 * S_SECRET_CAP];
    char sigv4[128];
    char err[KA_OBJSTORE_ERR_CAP];
};

/* One request: what to send, where the reply goes. */
typedef struct s_req {
    const char *method, *key, *query; /* key relative to the prefix; query sorted and encoded */
    const void *body;
    size_t body_len;
    ka_os_sink_fn sink; /* 2xx body: streamed here; else kept in reply */
    void *user;
    uint64_t offset; /* GET: bytes already delivered (Range on a retry) */
    bool ranged;     /* this attempt asked for a Range: only a 206 may continue it */
    long status;
    uint64_t total; /* a 206's Content-Range: the whole object's size */
    char etag[256];
    const char *why; /* what the sink's failure means, for people (NULL: its errno) */
    bool checked;    /* this attempt's reply was checked against the object's first one */
    bool seen;       /* a first reply was: its ETag and size follow */
    char obj_etag[256];
    uint64_t obj_size; /* S_SIZE_UNKNOWN without a Content-Length or Content-Range */
    char *reply;       /* the body when not streamed (malloc'd, NUL-terminated) */
    size_t reply_len;
    int sink_rc;
} s_req_t;

static char s_creds_file[1024];
static pthread_once_t s_once = PTHREAD_ONCE_INIT;

static void s_global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

bool ka_objstore_is_location(const char *l)
{
    return l && (strncmp(l, "s3://", 5) == 0 || strncmp(l, "gs://", 5) == 0) && l[5] && l[5] != '/';
}

int ka_objstore_set_credentials_file(const char *path)
{
    if (path && strlen(path) >= sizeof s_creds_file)
        return -ENAMETOOLONG;
    snprintf(s_creds_file, sizeof s_creds_file, "%s", path ? path : "");
    pthread_once(&s_once, s_global_init);
    return 0;
}

/* ---- credentials -------------------------------------------------------------------------- */

static void s_set(char *dst, size_t cap, const char *v)
{
    if (v && v[0])
        snprintf(dst, cap, "%s", v);
}

static char *s_trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* key = value lines of the [default] section (or of no section). */
static int s_read_creds_file(s_creds_t *c, const char *path, char *err, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, cap, "cannot read the object storage credentials file %s: %s", path,
                 strerror(errno));
        return -errno;
    }
    char line[S_TOKEN_CAP + 64];
    bool in = true;
    while (fgets(line, sizeof line, f)) {
        char *l = s_trim(line), *eq;
        if (!l[0] || l[0] == '#' || l[0] == ';')
            continue;
        if (l[0] == '[') {
            in = strcmp(l, "[default]") == 0;
            continue;
        }
        if (!in || !(eq = strchr(l, '=')))
            continue;
        *eq = '\0';
        char *k = s_trim(l), *v = s_trim(eq + 1);
        if (!strcmp(k, "aws_access_key_id"))
            s_set(c->key_id, sizeof c->key_id, v);
        else if (!strcmp(k, "aws_secret_access_key"))
            s_set(c->secret, sizeof c->secret, v);
        else if (!strcmp(k, "aws_session_token"))
            s_set(c->token, sizeof c->token, v);
        else if (!strcmp(k, "region"))
            s_set(c->region, sizeof c->region, v);
        else if (!strcmp(k, "endpoint_url"))
            s_set(c->endpoint, sizeof c->endpoint, v);
    }
    fclose(f);
    return 0;
}

static int s_load_creds(s_creds_t *c, bool gcs, char *err, size_t cap)
{
    memset(c, 0, sizeof *c);
    s_set(c->key_id, sizeof c->key_id, getenv("AWS_ACCESS_KEY_ID"));
    s_set(c->secret, sizeof c->secret, getenv("AWS_SECRET_ACCESS_KEY"));
    s_set(c->token, sizeof c->token, getenv("AWS_SESSION_TOKEN"));
    s_set(c->region, sizeof c->region, getenv("AWS_DEFAULT_REGION"));
    s_set(c->region, sizeof c->region, getenv("AWS_REGION"));
    if (!gcs) {
        s_set(c->endpoint, sizeof c->endpoint, getenv("AWS_ENDPOINT_URL"));
        s_set(c->endpoint, sizeof c->endpoint, getenv("AWS_ENDPOINT_URL_S3"));
    }
    int rc = s_creds_file[0] ? s_read_creds_file(c, s_creds_file, err, cap) : 0;
    if (rc)
        return rc;
    if (!c->key_id[0] || !c->secret[0]) {
        snprintf(err, cap,
                 "no object storage credentials: set AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY for kagentd, or snapshots.credentialsFile");
        return -EACCES;
    }
    if (!c->region[0])
        snprintf(c->region, sizeof c->region, "%s", gcs ? "auto" : "us-east-1");
    return 0;
}

/* ---- addressing --------------------------------------------------------------------------- */

/* RFC 3986 unreserved characters stay, '/' too (when keep_slash), the rest is %XX. */
static int s_encode(char *out, size_t cap, const char *in, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        bool plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                     (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~' ||
                     (keep_slash && *p == '/');
        if (n + 4 > cap)
            return -ENAMETOOLONG;
        if (plain)
            out[n++] = (char)*p;
        else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = '\0';
    return 0;
}

static bool s_bucket_ok(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
              b[i] == '.' || b[i] == '_'))
            return false;
    return true;
}

static int s_parse_location(ka_objstore_t *s, const char *loc, char *err, size_t cap)
{
    const char *p = loc + 5, *slash = strchr(p, '/');
    size_t bn = slash ? (size_t)(slash - p) : strlen(p);
    snprintf(s->scheme, sizeof s->scheme, "%.2s", loc);
    if (bn >= sizeof s->bucket)
        bn = sizeof s->bucket - 1;
    memcpy(s->bucket, p, bn);
    s->bucket[bn] = '\0';
    const char *pre = slash ? slash + 1 : "";
    size_t pn = strlen(pre);
    if (!s_bucket_ok(s->bucket) || strstr(pre, "//") || pn + 2 >= sizeof s->prefix) {
        snprintf(err, cap, "malformed object storage location \"%.300s\"", loc);
        return -EINVAL;
    }
    snprintf(s->prefix, sizeof s->prefix, "%s%s", pre, pn && pre[pn - 1] != '/' ? "/" : "");
    return 0;
}

static int s_base_url(ka_objstore_t *s)
{
    const char *ep = s->c.endpoint;
    int n;
    if (!strcmp(s->scheme, "gs"))
        ep = ep[0] ? ep : S_GCS_ENDPOINT;
    if (ep[0]) { /* custom endpoint (or GCS): path-style */
        size_t l = strlen(ep);
        n = snprintf(s->base, sizeof s->base, "%.*s/%s/", (int)(l && ep[l - 1] == '/' ? l - 1 : l),
                     ep, s->bucket);
    } else {
        n = snprintf(s->base, sizeof s->base, "https://%s.s3.%s.amazonaws.com/", s->bucket,
                     s->c.region);
    }
    return n > 0 && (size_t)n < sizeof s->base ? 0 : -ENAMETOOLONG;
}

/* ---- the client --------------------------------------------------------------------------- */

ka_objstore_t *ka_objstore_new(const char *location, const ka_objstore_opts_t *opts, char *err,
                               size_t cap)
{
    char scratch[8];
    if (!err || !cap) {
        err = scratch;
        cap = sizeof scratch;
    }
    err[0] = '\0';
    if (!ka_objstore_is_location(location)) {
        snprintf(err, cap, "not an object storage location: \"%.300s\"", location ? location : "");
        return NULL;
    }
    pthread_once(&s_once, s_global_init);
    ka_objstore_t *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    if (opts)
        s->o = *opts;
    if (s->o.attempts <= 0)
        s->o.attempts = 4;
    if (s->o.backoff_ms <= 0)
        s->o.backoff_ms = 100;
    if (!s->o.part_bytes)
        s->o.part_bytes = KA_OBJSTORE_PART_BYTES;
    if (s->o.connect_timeout_ms <= 0)
        s->o.connect_timeout_ms = 5000;
    if (s_parse_location(s, location, err, cap) ||
        s_load_creds(&s->c, !strcmp(s->scheme, "gs"), err, cap))
        goto fail;
    if (s_base_url(s) || !(s->curl = curl_easy_init())) {
        snprintf(err, cap, "cannot set up the object storage client for \"%.300s\"", location);
        goto fail;
    }
    snprintf(s->userpwd, sizeof s->userpwd, "%s:%s", s->c.key_id, s->c.secret);
    snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:s3", s->c.region);
    return s;
fail:
    ka_objstore_destroy(&s);
    return NULL;
}

void ka_objstore_destroy(ka_objstore_t **self_p)
{
    ka_objstore_t *s = self_p ? *self_p : NULL;
    if (!s)
        return;
    if (s->curl)
        curl_easy_cleanup(s->curl);
    explicit_bzero(&s->c, sizeof s->c);
    explicit_bzero(s->userpwd, sizeof s->userpwd);
    free(s);
    *self_p = NULL;
}

const char *ka_objstore_error(const ka_objstore_t *self)
{
    return self ? self->err : "";
}

/* ---- one HTTP exchange -------------------------------------------------------------------- */

static void s_sha256_hex(const void *buf, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int len = 0;
    EVP_Digest(buf, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + (size_t)2 * i, 3, "%02x", md[i]);
}

typedef struct s_body {
    const char *p;
    size_t left;
} s_body_t;

static size_t s_read_cb(char *buf, size_t sz, size_t nm, void *arg)
{
    s_body_t *b = arg;
    size_t n = sz * nm < b->left ? sz * nm : b->left;
    memcpy(buf, b->p, n);
    b->p += n;
    b->left -= n;
    return n;
}

static void s_keep(s_req_t *r, const char *buf, size_t n)
{
    if (r->reply_len + n > S_BODY_CAP)
        n = S_BODY_CAP - r->reply_len;
    char *p = n ? realloc(r->reply, r->reply_len + n + 1) : r->reply;
    if (!p)
        return;
    memcpy(p + r->reply_len, buf, n);
    r->reply = p;
    r->reply_len += n;
    p[r->reply_len] = '\0';
}

typedef struct s_xfer {
    ka_objstore_t *s;
    s_req_t *r;
} s_xfer_t;

/* The whole object's size as this reply states it (a 206's Content-Range, else its length). */
static uint64_t s_reply_size(CURL *c, const s_req_t *r)
{
    curl_off_t len = -1;
    if (r->ranged)
        return r->total ? r->total : S_SIZE_UNKNOWN;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
    return len >= 0 ? (uint64_t)len : S_SIZE_UNKNOWN;
}

/* A GET's reply comes from the object its first reply came from: the same ETag and size, where
 * both replies state them. A Range resume of a replaced object would splice two objects. */
static int s_same_object(CURL *c, s_req_t *r)
{
    uint64_t size = s_reply_size(c, r);
    if (!r->seen) {
        r->seen = true;
        snprintf(r->obj_etag, sizeof r->obj_etag, "%s", r->etag);
        r->obj_size = size;
        return 0;
    }
    bool etag_differs = r->etag[0] && r->obj_etag[0] && strcmp(r->etag, r->obj_etag) != 0;
    bool size_differs =
        size != S_SIZE_UNKNOWN && r->obj_size != S_SIZE_UNKNOWN && size != r->obj_size;
    if (!etag_differs && !size_differs)
        return 0;
    r->why = "the object changed during the download (its size or ETag differs between replies)";
    return -ESTALE;
}

static size_t s_write_cb(char *buf, size_t sz, size_t nm, void *arg)
{
    s_xfer_t *x = arg;
    size_t n = sz * nm;
    long status = 0;
    curl_easy_getinfo(x->s->curl, CURLINFO_RESPONSE_CODE, &status);
    if (x->r->sink && status >= 200 && status < 300) {
        if (x->r->ranged && status != 206) { /* the whole object again: not a continuation */
            x->r->sink_rc = -EPROTO;
            return 0;
        }
        if (!x->r->checked && (x->r->sink_rc = s_same_object(x->s->curl, x->r)))
            return 0;
        x->r->checked = true;
        x->r->sink_rc = x->r->sink(x->r->user, buf, n);
        if (x->r->sink_rc)
            return 0; /* stops the transfer */
        x->r->offset += n;
        return n;
    }
    s_keep(x->r, buf, n);
    return n;
}

static size_t s_header_cb(char *buf, size_t sz, size_t nm, void *arg)
{
    s_req_t *r = arg;
    size_t n = sz * nm;
    unsigned long long a, b, t;
    char line[128];
    snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), buf);
    if (!strncasecmp(line, "content-range:", 14) &&
        sscanf(line + 14, " bytes %llu-%llu/%llu", &a, &b, &t) == 3)
        r->total = t;
    if (n > 5 && !strncasecmp(buf, "etag:", 5)) {
        const char *v = buf + 5;
        while (*v == ' ')
            v++;
        size_t l = n - (size_t)(v - buf);
        while (l && (v[l - 1] == '\r' || v[l - 1] == '\n' || v[l - 1] == ' '))
            l--;
        snprintf(r->etag, sizeof r->etag, "%.*s", (int)l, v);
    }
    return n;
}

/* The text of <tag>...</tag> in xml (first one), "" if none. */
static void s_xml_text(const char *xml, const char *tag, char *out, size_t cap)
{
    char open[64], close[64];
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    const char *a = xml ? strstr(xml, open) : NULL, *b = a ? strstr(a, close) : NULL;
    out[0] = '\0';
    if (a && b)
        snprintf(out, cap, "%.*s", (int)(b - a - strlen(open)), a + strlen(open));
}

static bool s_transient(CURLcode cc, long status)
{
    if (cc != CURLE_OK)
        return cc != CURLE_WRITE_ERROR && cc != CURLE_ABORTED_BY_CALLBACK &&
               cc != CURLE_URL_MALFORMAT && cc != CURLE_OUT_OF_MEMORY;
    return status == 408 || status == 429 || status >= 500;
}

static int s_errno_of(CURLcode cc, long status)
{
    if (cc == CURLE_OPERATION_TIMEDOUT)
        return -ETIMEDOUT;
    if (cc != CURLE_OK)
        return -ECONNREFUSED;
    if (status == 401 || status == 403)
        return -EACCES;
    if (status == 404)
        return -ENOENT;
    if (status == 416) /* a Range past the end: the object is shorter than it was */
        return -ESTALE;
    return -EIO;
}

static int s_url(ka_objstore_t *s, const s_req_t *r, char *url, size_t cap)
{
    char full[2 * S_KEY_CAP], enc[3 * 2 * S_KEY_CAP];
    int n = snprintf(full, sizeof full, "%s%s", s->prefix, r->key ? r->key : "");
    if (n < 0 || (size_t)n >= sizeof full || s_encode(enc, sizeof enc, full, true))
        return -ENAMETOOLONG;
    /* a bucket-level request ("" key, no prefix) is the bucket's URL */
    n = snprintf(url, cap, "%s%s%s%s", s->base, enc, r->query ? "?" : "", r->query ? r->query : "");
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

static void s_describe(ka_objstore_t *s, const s_req_t *r, CURLcode cc, const char *curl_err)
{
    char code[128] = "", msg[256] = "";
    if (cc != CURLE_OK) {
        snprintf(s->err, sizeof s->err,
                 "%s %s://%.63s/%.120s%.80s: object storage unreachable: %.200s", r->method,
                 s->scheme, s->bucket, s->prefix, r->key ? r->key : "",
                 curl_err[0] ? curl_err : curl_easy_strerror(cc));
        return;
    }
    s_xml_text(r->reply, "Code", code, sizeof code);
    s_xml_text(r->reply, "Message", msg, sizeof msg);
    snprintf(s->err, sizeof s->err, "%s %s://%.63s/%.120s%.80s: HTTP %ld%s%.60s%s%.160s", r->method,
             s->scheme, s->bucket, s->prefix, r->key ? r->key : "", r->status, code[0] ? " " : "",
             code, msg[0] ? ": " : "", msg);
}

static int s_perform_once(ka_objstore_t *s, s_req_t *r, CURLcode *cc, char *curl_err)
{
    char url[S_URL_CAP], hash[65], range[64], hdr_sha[96];
    char *token = NULL;
    int rc = s_url(s, r, url, sizeof url);
    if (rc)
        return rc;
    CURL *c = s->curl;
    curl_easy_reset(c);
    s_body_t body = {r->body, r->body_len};
    s_xfer_t x = {s, r};
    struct curl_slist *h = NULL;
    if (r->body_len)
        s_sha256_hex(r->body, r->body_len, hash);
    else
        snprintf(hash, sizeof hash, "%s", S_EMPTY_SHA256);
    snprintf(hdr_sha, sizeof hdr_sha, "x-amz-content-sha256: %s", hash);
    h = curl_slist_append(h, hdr_sha);
    if (s->c.token[0] && asprintf(&token, "x-amz-security-token: %s", s->c.token) > 0)
        h = curl_slist_append(h, token);
    r->ranged = r->sink && r->offset;
    if (r->ranged) {
        snprintf(range, sizeof range, "Range: bytes=%llu-", (unsigned long long)r->offset);
        h = curl_slist_append(h, range);
    }
    /* no "Expect:" to turn 100-continue off: libcurl's signer would sign a header it never
     * sends (7.88), and the server refuse the signature */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, r->method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(c, CURLOPT_USERPWD, s->userpwd);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)s->o.connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stalled transfer ends */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    if (s->o.deadline_ms) {
        int64_t left = s->o.deadline_ms - krt_mono_ms();
        if (left <= 0)
            rc = -ETIMEDOUT;
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(left > 0 ? left : 1));
    }
    if (!strcmp(r->method, "PUT") || !strcmp(r->method, "POST")) {
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, s_read_cb);
        curl_easy_setopt(c, CURLOPT_READDATA, &body);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    } else if (!strcmp(r->method, "HEAD")) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, s_write_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    if (r->sink) /* a download: fewer, larger reads and sink calls */
        curl_easy_setopt(c, CURLOPT_BUFFERSIZE, S_GET_BUFFER);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, s_header_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    free(r->reply);
    r->reply = NULL;
    r->reply_len = 0;
    r->status = 0;
    r->total = 0;
    r->checked = false;
    r->etag[0] = '\0';
    curl_err[0] = '\0';
    *cc = rc ? CURLE_OPERATION_TIMEDOUT : curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    if (token) {
        explicit_bzero(token, strlen(token));
        free(token);
    }
    return 0;
}

static void s_sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* The request with retries; 0 on a 2xx reply, else a negative errno and s->err. */
static int s_request(ka_objstore_t *s, s_req_t *r)
{
    int64_t delay = s->o.backoff_ms;
    for (int attempt = 1;; attempt++) {
        CURLcode cc = CURLE_OK;
        char curl_err[CURL_ERROR_SIZE];
        r->sink_rc = 0;
        int rc = s_perform_once(s, r, &cc, curl_err);
        if (rc) {
            snprintf(s->err, sizeof s->err, "%s %s: %s", r->method, r->key ? r->key : "",
                     strerror(-rc));
            return rc;
        }
        if (r->sink_rc) { /* the receiver stopped it: not the server's failure */
            snprintf(s->err, sizeof s->err, "%s %s://%.63s/%.120s%.80s: %s", r->method, s->scheme,
                     s->bucket, s->prefix, r->key ? r->key : "",
                     r->why ? r->why : strerror(-r->sink_rc));
            return r->sink_rc;
        }
        if (cc == CURLE_OK && r->status >= 200 && r->status < 300)
            return 0;
        s_describe(s, r, cc, curl_err);
        bool late = s->o.deadline_ms && krt_mono_ms() + delay >= s->o.deadline_ms;
        if (!s_transient(cc, r->status) || attempt >= s->o.attempts || late)
            return late && s_transient(cc, r->status) ? -ETIMEDOUT : s_errno_of(cc, r->status);
        krt_log(KRT_LOG_DEBUG, "objstore", "objstore_retry", "attempt=%d delay_ms=%lld %s", attempt,
                (long long)delay, s->err);
        s_sleep_ms(delay);
        delay = delay * 2 > S_BACKOFF_MAX_MS ? S_BACKOFF_MAX_MS : delay * 2;
    }
}

static void s_req_done(s_req_t *r)
{
    free(r->reply);
    r->reply = NULL;
}

/* ---- objects ------------------------------------------------------------------------------ */

int ka_objstore_put(ka_objstore_t *s, const char *key, const void *buf, size_t n)
{
    s_req_t r = {.method = "PUT", .key = key, .body = buf, .body_len = n};
    int rc = s_request(s, &r);
    s_req_done(&r);
    return rc;
}

int ka_objstore_get(ka_objstore_t *s, const char *key, ka_os_sink_fn sink, void *user,
                    uint64_t *bytes)
{
    s_req_t r = {.method = "GET", .key = key, .sink = sink, .user = user};
    int rc = s_request(s, &r);
    if (bytes)
        *bytes = r.offset;
    s_req_done(&r);
    return rc;
}

typedef struct s_small {
    char *buf;
    size_t cap, n;
} s_small_t;

static int s_small_sink(void *user, const void *buf, size_t n)
{
    s_small_t *m = user;
    if (m->n + n >= m->cap)
        return -EFBIG;
    memcpy(m->buf + m->n, buf, n);
    m->n += n;
    return 0;
}

int ka_objstore_get_small(ka_objstore_t *s, const char *key, char *buf, size_t cap)
{
    s_small_t m = {buf, cap, 0};
    if (!cap)
        return -EINVAL;
    int rc = ka_objstore_get(s, key, s_small_sink, &m, NULL);
    buf[rc ? 0 : m.n] = '\0';
    return rc;
}

int ka_objstore_delete(ka_objstore_t *s, const char *key)
{
    s_req_t r = {.method = "DELETE", .key = key};
    int rc = s_request(s, &r);
    s_req_done(&r);
    return rc == -ENOENT ? 0 : rc;
}

/* Calls fn for each <Key> of a ListObjectsV2 page; the continuation token (or "") to next. */
static int s_list_page(ka_objstore_t *s, const char *xml, ka_os_key_fn fn, void *user, char *next,
                       size_t cap)
{
    size_t pl = strlen(s->prefix);
    for (const char *p = xml; (p = strstr(p, "<Key>")) != NULL;) {
        p += 5;
        const char *e = strstr(p, "</Key>");
        if (!e)
            break;
        char key[S_KEY_CAP * 2];
        snprintf(key, sizeof key, "%.*s", (int)(e - p), p);
        if (strncmp(key, s->prefix, pl) == 0) {
            int rc = fn(user, key + pl);
            if (rc)
                return rc;
        }
        p = e;
    }
    char trunc[16];
    s_xml_text(xml, "IsTruncated", trunc, sizeof trunc);
    next[0] = '\0';
    if (!strcmp(trunc, "true"))
        s_xml_text(xml, "NextContinuationToken", next, cap);
    return 0;
}

int ka_objstore_list(ka_objstore_t *s, const char *prefix, ka_os_key_fn fn, void *user)
{
    char full[2 * S_KEY_CAP], enc[6 * S_KEY_CAP], token[1024] = "", etok[3 * 1024];
    char query[sizeof enc + sizeof etok + 64];
    snprintf(full, sizeof full, "%s%s", s->prefix, prefix ? prefix : "");
    if (s_encode(enc, sizeof enc, full, false))
        return -ENAMETOOLONG;
    int rc = 0;
    do {
        if (s_encode(etok, sizeof etok, token, false))
            return -ENAMETOOLONG;
        /* parameters in canonical (sorted) order, so any SigV4 canonicalization agrees */
        snprintf(query, sizeof query, "%s%s%slist-type=2&prefix=%s",
                 token[0] ? "continuation-token=" : "", token[0] ? etok : "", token[0] ? "&" : "",
                 enc);
        s_req_t r = {.method = "GET", .key = NULL, .query = query};
        char saved[sizeof s->prefix];
        snprintf(saved, sizeof saved, "%s", s->prefix);
        s->prefix[0] = '\0'; /* the bucket's URL */
        rc = s_request(s, &r);
        snprintf(s->prefix, sizeof s->prefix, "%s", saved);
        if (!rc)
            rc = s_list_page(s, r.reply ? r.reply : "", fn, user, token, sizeof token);
        s_req_done(&r);
    } while (!rc && token[0]);
    return rc;
}

/* ---- streamed (multipart) uploads --------------------------------------------------------- */

/* Two part buffers: one fills while the other is sent by a sender thread (the client's handle
 * is used by one thread at a time: the sender is joined before any other request). */
struct ka_os_upload {
    ka_objstore_t *s;
    char key[S_KEY_CAP];
    char *part, *spare; /* filling; the other one (in flight while busy) */
    size_t fill, flight_len;
    pthread_t sender;
    bool busy;
    int sent_rc;
    char upload_id[512];
    int parts;
    char **etags;
    int failed;
};

ka_os_upload_t *ka_os_upload_new(ka_objstore_t *s, const char *key)
{
    ka_os_upload_t *u = calloc(1, sizeof *u);
    if (!u || strlen(key) >= sizeof u->key || !(u->part = malloc(s->o.part_bytes)) ||
        !(u->spare = malloc(s->o.part_bytes))) {
        if (u) {
            free(u->part);
            free(u->spare);
        }
        free(u);
        return NULL;
    }
    u->s = s;
    snprintf(u->key, sizeof u->key, "%s", key);
    return u;
}

static int s_mp_start(ka_os_upload_t *u)
{
    s_req_t r = {.method = "POST", .key = u->key, .query = "uploads="};
    int rc = s_request(u->s, &r);
    if (!rc) {
        s_xml_text(r.reply, "UploadId", u->upload_id, sizeof u->upload_id);
        if (!u->upload_id[0]) {
            snprintf(u->s->err, sizeof u->s->err, "POST %.200s?uploads: no UploadId in the reply",
                     u->key);
            rc = -EIO;
        }
    }
    s_req_done(&r);
    return rc;
}

static int s_mp_part(ka_os_upload_t *u, const char *buf, size_t len)
{
    if (!u->upload_id[0]) {
        int rc = s_mp_start(u);
        if (rc)
            return rc;
    }
    if (u->parts >= KA_OBJSTORE_MAX_PARTS) {
        snprintf(u->s->err, sizeof u->s->err, "more than %d parts of %zu bytes",
                 KA_OBJSTORE_MAX_PARTS, u->s->o.part_bytes);
        return -EFBIG;
    }
    char query[3 * 512 + 48], eid[3 * 512];
    if (s_encode(eid, sizeof eid, u->upload_id, false))
        return -ENAMETOOLONG;
    snprintf(query, sizeof query, "partNumber=%d&uploadId=%s", u->parts + 1, eid);
    s_req_t r = {.method = "PUT", .key = u->key, .query = query, .body = buf, .body_len = len};
    int rc = s_request(u->s, &r);
    s_req_done(&r);
    if (rc)
        return rc;
    char **e = realloc(u->etags, (size_t)(u->parts + 1) * sizeof *e);
    if (!e)
        return -ENOMEM;
    u->etags = e;
    if (!(e[u->parts] = strdup(r.etag)))
        return -ENOMEM;
    u->parts++;
    return 0;
}

static void *s_sender_run(void *arg)
{
    ka_os_upload_t *u = arg;
    u->sent_rc = s_mp_part(u, u->spare, u->flight_len);
    return NULL;
}

/* Waits for the part in flight; the upload's first failure. */
static int s_wait_sent(ka_os_upload_t *u)
{
    if (u->busy) {
        pthread_join(u->sender, NULL);
        u->busy = false;
        if (u->sent_rc && !u->failed)
            u->failed = u->sent_rc;
    }
    return u->failed;
}

/* Hands the full part to the sender and goes on filling the other buffer. */
static int s_send_part(ka_os_upload_t *u)
{
    if (s_wait_sent(u))
        return u->failed;
    char *full = u->part;
    u->part = u->spare;
    u->spare = full;
    u->flight_len = u->fill;
    u->fill = 0;
    if (pthread_create(&u->sender, NULL, s_sender_run, u) == 0)
        u->busy = true;
    else
        s_sender_run(u), u->failed = u->sent_rc; /* no thread: send it here */
    return u->failed;
}

int ka_os_upload_write(ka_os_upload_t *u, const void *buf, size_t n)
{
    const char *p = buf;
    if (u->failed)
        return u->failed;
    while (n) {
        size_t room = u->s->o.part_bytes - u->fill, k = n < room ? n : room;
        memcpy(u->part + u->fill, p, k);
        u->fill += k;
        p += k;
        n -= k;
        if (u->fill == u->s->o.part_bytes && s_send_part(u))
            return u->failed;
    }
    return 0;
}

static int s_mp_complete(ka_os_upload_t *u)
{
    size_t cap = 128 + (size_t)u->parts * 320, len = 0;
    char *xml = malloc(cap), query[3 * 512 + 16], eid[3 * 512];
    if (!xml)
        return -ENOMEM;
    len += (size_t)snprintf(xml + len, cap - len, "<CompleteMultipartUpload>");
    for (int i = 0; i < u->parts; i++)
        len += (size_t)snprintf(xml + len, cap - len,
                                "<Part><PartNumber>%d</PartNumber><ETag>%.256s</ETag></Part>",
                                i + 1, u->etags[i]);
    len += (size_t)snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
    s_encode(eid, sizeof eid, u->upload_id, false);
    snprintf(query, sizeof query, "uploadId=%s", eid);
    s_req_t r = {.method = "POST", .key = u->key, .query = query, .body = xml, .body_len = len};
    int rc = s_request(u->s, &r);
    if (!rc && r.reply && strstr(r.reply, "<Error>")) { /* S3 may fail a completion with a 200 */
        r.status = 500;
        s_describe(u->s, &r, CURLE_OK, "");
        rc = -EIO;
    }
    s_req_done(&r);
    free(xml);
    return rc;
}

static void s_upload_free(ka_os_upload_t *u)
{
    s_wait_sent(u);
    for (int i = 0; i < u->parts; i++)
        free(u->etags[i]);
    free(u->etags);
    free(u->part);
    free(u->spare);
    free(u);
}

int ka_os_upload_finish(ka_os_upload_t **u_p)
{
    ka_os_upload_t *u = *u_p;
    int rc = s_wait_sent(u);
    if (!rc && !u->upload_id[0]) /* small: one PUT */
        rc = ka_objstore_put(u->s, u->key, u->part, u->fill);
    else if (!rc && !(rc = u->fill ? s_mp_part(u, u->part, u->fill) : 0))
        rc = s_mp_complete(u);
    if (rc) {
        ka_objstore_t *s = u->s;
        char keep[sizeof s->err];
        snprintf(keep, sizeof keep, "%s", s->err); /* the abort's outcome is not the news */
        ka_os_upload_abort(u_p);
        snprintf(s->err, sizeof s->err, "%s", keep);
        return rc;
    }
    s_upload_free(u);
    *u_p = NULL;
    return 0;
}

void ka_os_upload_abort(ka_os_upload_t **u_p)
{
    ka_os_upload_t *u = u_p ? *u_p : NULL;
    if (!u)
        return;
    s_wait_sent(u);
    if (u->upload_id[0]) {
        char query[3 * 512 + 16], eid[3 * 512];
        s_encode(eid, sizeof eid, u->upload_id, false);
        snprintf(query, sizeof query, "uploadId=%s", eid);
        s_req_t r = {.method = "DELETE", .key = u->key, .query = query};
        int attempts = u->s->o.attempts;
        u->s->o.attempts = 1; /* best effort: storage may be what failed */
        s_request(u->s, &r);
        u->s->o.attempts = attempts;
        s_req_done(&r);
    }
    s_upload_free(u);
    *u_p = NULL;
}
