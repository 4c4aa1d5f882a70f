/*
 * ka_objstore against an in-process mock S3 server (this module's test only) that checks every
 * request's AWS Signature V4 itself (canonical request, string to sign, HMAC chain, payload
 * hash = the body's sha256), keeps objects and multipart uploads in memory, and injects
 * failures: 503s, a download cut off mid-body, the object replaced between two GETs, refused
 * credentials, nobody listening. GETs carry an ETag (a new one at every write) and answer a
 * Range with a 206 and its Content-Range.
 * The .c is included to reach its addressing statics (virtual-hosted AWS, GCS).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../../../actors/substrate/ka_objstore.c"

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <openssl/hmac.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define KEY_ID    "AKIDTEST"
#define SECRET    "s3cr3t/Key+With=Signs"
#define REGION    "eu-test-1"
#define MAX_OBJ   64
#define MAX_CONNS 32

/* ---- the mock server ---------------------------------------------------------------------- */

typedef struct m_obj {
    char key[512];
    char *data;
    size_t len;
    int gen; /* its ETag: "g<gen>", a new one at every write */
} m_obj_t;

static struct {
    int lfd, port;
    int conns[MAX_CONNS], n_conns;
    pthread_t conn_threads[MAX_CONNS];
    pthread_t thread;
    atomic_bool stop;
    m_obj_t objs[MAX_OBJ];
    char *parts[16];
    size_t part_len[16];
    int n_parts, completes;
    atomic_int requests, sig_failures, fail_next, token_seen;
    atomic_long cut_after; /* GET: close after this many body bytes (once) */
    atomic_int ranges, gets;
    atomic_int swap_after; /* GET: after this many, the object is replaced by swap (once) */
    char *swap;
    size_t swap_len;
    bool ignore_range; /* answer a Range request with the whole object (200) */
    int list_page;     /* keys per list page */
    char last_query[4096];
} M;

static m_obj_t *m_find(const char *key, bool create)
{
    for (int i = 0; i < MAX_OBJ; i++)
        if (M.objs[i].key[0] && !strcmp(M.objs[i].key, key))
            return &M.objs[i];
    for (int i = 0; create && i < MAX_OBJ; i++)
        if (!M.objs[i].key[0]) {
            snprintf(M.objs[i].key, sizeof M.objs[i].key, "%s", key);
            return &M.objs[i];
        }
    return NULL;
}

static void m_hex(const unsigned char *md, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

static void m_hmac(const void *key, size_t kl, const char *msg, unsigned char out[32])
{
    unsigned int l = 32;
    HMAC(EVP_sha256(), key, (int)kl, (const unsigned char *)msg, strlen(msg), out, &l);
}

typedef struct m_req {
    char method[16], path[4096], query[4096];
    char hname[32][64], hval[32][4096];
    int nh;
    char *body;
    size_t len;
} m_req_t;

static const char *m_header(const m_req_t *r, const char *name)
{
    for (int i = 0; i < r->nh; i++)
        if (!strcasecmp(r->hname[i], name))
            return r->hval[i];
    return NULL;
}

static int m_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* SigV4 as AWS documents it, computed independently of libcurl. */
static bool m_sig_ok(const m_req_t *r)
{
    const char *auth = m_header(r, "authorization"), *date = m_header(r, "x-amz-date"),
               *sha = m_header(r, "x-amz-content-sha256");
    if (getenv("MOCK_DEBUG"))
        fprintf(stderr, "auth=%s date=%s sha=%s\n", auth, date, sha);
    if (!auth || !date || !sha)
        return false;
    char body_sha[65];
    s_sha256_hex(r->body ? r->body : "", r->len, body_sha);
    if (strcmp(sha, body_sha)) /* the payload is signed, not UNSIGNED-PAYLOAD */
        return false;
    char cred[256], signed_h[512], sig[80];
    if (sscanf(auth, "AWS4-HMAC-SHA256 Credential=%255[^,], SignedHeaders=%511[^,], Signature=%79s",
               cred, signed_h, sig) != 3)
        return false;
    char scope_date[16];
    snprintf(scope_date, sizeof scope_date, "%.8s", date);
    char want_cred[256];
    snprintf(want_cred, sizeof want_cred, KEY_ID "/%s/" REGION "/s3/aws4_request", scope_date);
    if (strcmp(cred, want_cred) || !strstr(signed_h, "x-amz-content-sha256") ||
        (m_header(r, "x-amz-security-token") && !strstr(signed_h, "x-amz-security-token")))
        return false;
    /* canonical query: pairs sorted, "k" as "k=" */
    char q[4096], *pairs[64], canon_q[4200] = "";
    int np = 0;
    snprintf(q, sizeof q, "%s", r->query);
    for (char *save, *t = strtok_r(q, "&", &save); t && np < 64; t = strtok_r(NULL, "&", &save))
        pairs[np++] = t;
    qsort(pairs, (size_t)np, sizeof pairs[0], m_cmp);
    for (int i = 0; i < np; i++) {
        strcat(canon_q, i ? "&" : "");
        strcat(canon_q, pairs[i]);
        if (!strchr(pairs[i], '='))
            strcat(canon_q, "=");
    }
    char canon_h[8192] = "", sh[512];
    snprintf(sh, sizeof sh, "%s", signed_h);
    for (char *save, *t = strtok_r(sh, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
        const char *v = m_header(r, t);
        if (!v)
            return false;
        snprintf(canon_h + strlen(canon_h), sizeof canon_h - strlen(canon_h), "%s:%s\n", t, v);
    }
    char *canon = NULL, h[65], *sts = NULL;
    if (asprintf(&canon, "%s\n%s\n%s\n%s\n%s\n%s", r->method, r->path, canon_q, canon_h, signed_h,
                 sha) < 0)
        return false;
    s_sha256_hex(canon, strlen(canon), h);
    if (getenv("MOCK_DEBUG"))
        fprintf(stderr, "canonical:\n%s\n", canon);
    free(canon);
    if (asprintf(&sts, "AWS4-HMAC-SHA256\n%s\n%s/" REGION "/s3/aws4_request\n%s", date, scope_date,
                 h) < 0)
        return false;
    unsigned char k1[32], k2[32], k3[32], k4[32], out[32];
    char ks[64], mine[65];
    snprintf(ks, sizeof ks, "AWS4%s", SECRET);
    m_hmac(ks, strlen(ks), scope_date, k1);
    m_hmac(k1, 32, REGION, k2);
    m_hmac(k2, 32, "s3", k3);
    m_hmac(k3, 32, "aws4_request", k4);
    m_hmac(k4, 32, sts, out);
    free(sts);
    m_hex(out, 32, mine);
    return strcmp(mine, sig) == 0;
}

static void m_send(int fd, int status, const char *extra, const char *body, size_t len)
{
    char head[1024];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Length: %zu\r\n%s\r\n", status,
                     len, extra ? extra : "");
    (void)!write(fd, head, (size_t)n);
    if (len)
        (void)!write(fd, body, len);
}

static void m_error(int fd, int status, const char *code)
{
    char b[256];
    int n = snprintf(b, sizeof b, "<Error><Code>%s</Code><Message>mock says no</Message></Error>",
                     code);
    m_send(fd, status, NULL, b, (size_t)n);
}

/* One request from fd: false at EOF or on a malformed one. */
static bool m_read(int fd, m_req_t *r, char *buf, size_t cap)
{
    size_t n = 0;
    char *end = NULL;
    while (!(end = (n ? strstr(buf, "\r\n\r\n") : NULL))) {
        ssize_t k = read(fd, buf + n, cap - n - 1);
        if (k <= 0)
            return false;
        n += (size_t)k;
        buf[n] = '\0';
    }
    *end = '\0';
    char target[4096];
    if (sscanf(buf, "%15s %4095s", r->method, target) != 2)
        return false;
    char *qm = strchr(target, '?');
    snprintf(r->query, sizeof r->query, "%s", qm ? qm + 1 : "");
    if (qm)
        *qm = '\0';
    snprintf(r->path, sizeof r->path, "%s", target);
    r->nh = 0;
    for (char *save, *l = strtok_r(strchr(buf, '\n') + 1, "\r\n", &save); l && r->nh < 32;
         l = strtok_r(NULL, "\r\n", &save)) {
        char *c = strchr(l, ':');
        if (!c)
            continue;
        *c = '\0';
        for (char *p = l; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        snprintf(r->hname[r->nh], sizeof r->hname[0], "%s", l);
        char *v = c + 1;
        while (*v == ' ')
            v++;
        snprintf(r->hval[r->nh++], sizeof r->hval[0], "%s", v);
    }
    const char *ex = m_header(r, "expect");
    if (ex && !strcasecmp(ex, "100-continue"))
        (void)!write(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    const char *cl = m_header(r, "content-length");
    r->len = cl ? strtoul(cl, NULL, 10) : 0;
    r->body = malloc(r->len + 1);
    size_t have = n - (size_t)(end + 4 - buf);
    memcpy(r->body, end + 4, have);
    while (have < r->len) {
        ssize_t k = read(fd, r->body + have, r->len - have);
        if (k <= 0)
            return false;
        have += (size_t)k;
    }
    r->body[r->len] = '\0';
    return true;
}

static void m_list(int fd, const char *prefix_enc, int start)
{
    char prefix[1024], *xml = malloc(1 << 16);
    curl_free(NULL);
    int n = 0;
    CURL *c = curl_easy_init();
    char *dec = curl_easy_unescape(c, prefix_enc, 0, NULL);
    snprintf(prefix, sizeof prefix, "%s", dec ? dec : "");
    curl_free(dec);
    curl_easy_cleanup(c);
    int len = sprintf(xml, "<ListBucketResult>");
    int idx = 0, next = -1;
    for (int i = 0; i < MAX_OBJ; i++) {
        if (!M.objs[i].key[0] || strncmp(M.objs[i].key, prefix, strlen(prefix)))
            continue;
        if (idx++ < start)
            continue;
        if (n == M.list_page) {
            next = idx - 1;
            break;
        }
        len += sprintf(xml + len, "<Contents><Key>%s</Key></Contents>", M.objs[i].key);
        n++;
    }
    if (next >= 0)
        len += sprintf(xml + len,
                       "<IsTruncated>true</IsTruncated><NextContinuationToken>t%d"
                       "</NextContinuationToken>",
                       next);
    else
        len += sprintf(xml + len, "<IsTruncated>false</IsTruncated>");
    len += sprintf(xml + len, "</ListBucketResult>");
    m_send(fd, 200, NULL, xml, (size_t)len);
    free(xml);
}

static const char *m_param(const char *q, const char *name, char *out, size_t cap)
{
    size_t l = strlen(name);
    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL)
        if (!strncmp(p, name, l) && p[l] == '=') {
            const char *e = strchr(p + l + 1, '&');
            snprintf(out, cap, "%.*s", (int)(e ? (size_t)(e - p) - l - 1 : strlen(p + l + 1)),
                     p + l + 1);
            return out;
        }
    return NULL;
}

/* The object replaced by M.swap once M.swap_after GETs were served. */
static void m_maybe_swap(m_obj_t *o)
{
    if (M.swap && M.gets == M.swap_after) {
        free(o->data);
        o->data = M.swap;
        o->len = M.swap_len;
        o->gen++;
        M.swap = NULL;
    }
}

/* GET with Range (bytes=a- or bytes=a-b: 206 with Content-Range), an ETag, and the cut. */
static void m_get(int fd, const m_req_t *r, m_obj_t *o)
{
    m_maybe_swap(o);
    M.gets++;
    const char *range = M.ignore_range ? NULL : m_header(r, "range");
    unsigned long long a = 0, b = o->len ? o->len - 1 : 0;
    if (range && sscanf(range, "bytes=%llu-%llu", &a, &b) < 1) {
        m_error(fd, 400, "InvalidArgument");
        return;
    }
    if (o->len && b >= o->len)
        b = o->len - 1;
    if (range && a >= o->len) {
        m_error(fd, 416, "InvalidRange");
        return;
    }
    size_t from = (size_t)a, len = range ? (size_t)(b - a + 1) : o->len;
    char head[512], crange[128] = "";
    if (range) {
        M.ranges++;
        snprintf(crange, sizeof crange, "Content-Range: bytes %llu-%llu/%zu\r\n", a, b, o->len);
    }
    snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Length: %zu\r\nETag: \"g%d\"\r\n%s\r\n",
             range ? 206 : 200, len, o->gen, crange);
    (void)!write(fd, head, strlen(head));
    long cut = atomic_exchange(&M.cut_after, 0);
    size_t n = cut > 0 && (size_t)cut < len ? (size_t)cut : len;
    (void)!write(fd, o->data + from, n);
    if (n < len)
        shutdown(fd, SHUT_RDWR); /* cut off mid-body */
}

static void m_serve(int fd, m_req_t *r)
{
    M.requests++;
    snprintf(M.last_query, sizeof M.last_query, "%s", r->query);
    if (m_header(r, "x-amz-security-token"))
        M.token_seen++;
    if (!m_sig_ok(r)) {
        M.sig_failures++;
        m_error(fd, 403, "SignatureDoesNotMatch");
        return;
    }
    if (M.fail_next > 0) {
        M.fail_next--;
        m_error(fd, 503, "SlowDown");
        return;
    }
    const char *key = r->path + strlen("/bkt/");
    if (strncmp(r->path, "/bkt", 4)) {
        m_error(fd, 404, "NoSuchBucket");
        return;
    }
    char v[512];
    if (!strcmp(r->method, "GET") && !strcmp(r->path, "/bkt/") &&
        m_param(r->query, "list-type", v, sizeof v)) {
        char tok[64] = "";
        m_param(r->query, "continuation-token", tok, sizeof tok);
        m_list(fd, m_param(r->query, "prefix", v, sizeof v) ? v : "", tok[0] ? atoi(tok + 1) : 0);
        return;
    }
    if (!strcmp(r->method, "POST") && !strcmp(r->query, "uploads=")) {
        const char *x = "<InitiateMultipartUploadResult><UploadId>up/1+x</UploadId>"
                        "</InitiateMultipartUploadResult>";
        M.n_parts = 0;
        m_send(fd, 200, NULL, x, strlen(x));
        return;
    }
    if (!strcmp(r->method, "PUT") && m_param(r->query, "partNumber", v, sizeof v)) {
        int no = atoi(v);
        char id[64];
        assert_string_equal(m_param(r->query, "uploadId", id, sizeof id), "up%2F1%2Bx");
        assert_int_equal(no, M.n_parts + 1);
        M.parts[M.n_parts] = r->body;
        M.part_len[M.n_parts++] = r->len;
        r->body = NULL;
        char etag[64];
        snprintf(etag, sizeof etag, "ETag: \"etag-%d\"\r\n", no);
        m_send(fd, 200, etag, "", 0);
        return;
    }
    if (!strcmp(r->method, "POST") && m_param(r->query, "uploadId", v, sizeof v)) {
        m_obj_t *o = m_find(key, true);
        size_t total = 0;
        for (int i = 0; i < M.n_parts; i++) {
            char want[96];
            snprintf(want, sizeof want, "<PartNumber>%d</PartNumber><ETag>\"etag-%d\"</ETag>",
                     i + 1, i + 1);
            assert_non_null(strstr(r->body, want));
            total += M.part_len[i];
        }
        free(o->data);
        o->data = malloc(total + 1);
        o->len = 0;
        for (int i = 0; i < M.n_parts; i++) {
            memcpy(o->data + o->len, M.parts[i], M.part_len[i]);
            o->len += M.part_len[i];
            free(M.parts[i]);
        }
        M.completes++;
        m_send(fd, 200, NULL, "<CompleteMultipartUploadResult/>", 32);
        return;
    }
    if (!strcmp(r->method, "DELETE") && m_param(r->query, "uploadId", v, sizeof v)) {
        m_send(fd, 204, NULL, "", 0);
        return;
    }
    m_obj_t *o = m_find(key, !strcmp(r->method, "PUT"));
    if (!strcmp(r->method, "PUT")) {
        free(o->data);
        o->data = r->body;
        o->len = r->len;
        o->gen++;
        r->body = NULL;
        m_send(fd, 200, "ETag: \"x\"\r\n", "", 0);
    } else if (!strcmp(r->method, "DELETE")) {
        if (o) {
            free(o->data);
            memset(o, 0, sizeof *o);
        }
        m_send(fd, 204, NULL, "", 0);
    } else if (!o) {
        m_error(fd, 404, "NoSuchKey");
    } else {
        m_get(fd, r, o);
    }
}

static pthread_mutex_t m_lock = PTHREAD_MUTEX_INITIALIZER; /* one request at a time */

static void *m_conn_run(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char *buf = malloc(1 << 20);
    m_req_t *r = calloc(1, sizeof *r);
    while (!M.stop && m_read(fd, r, buf, 1 << 20)) {
        pthread_mutex_lock(&m_lock);
        m_serve(fd, r);
        pthread_mutex_unlock(&m_lock);
        free(r->body);
        r->body = NULL;
    }
    free(r->body);
    free(r);
    free(buf);
    return NULL;
}

static void *m_run(void *arg)
{
    (void)arg;
    while (!M.stop) {
        int fd = accept(M.lfd, NULL, NULL);
        if (fd < 0 || M.stop || M.n_conns == MAX_CONNS) {
            if (fd >= 0)
                close(fd);
            continue;
        }
        M.conns[M.n_conns] = fd;
        pthread_create(&M.conn_threads[M.n_conns++], NULL, m_conn_run, (void *)(intptr_t)fd);
    }
    return NULL;
}

static int m_start(void **unused)
{
    (void)unused;
    memset(&M, 0, sizeof M);
    M.list_page = 1000;
    M.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (bind(M.lfd, (struct sockaddr *)&a, sizeof a) || listen(M.lfd, 8) ||
        getsockname(M.lfd, (struct sockaddr *)&a, &l))
        return -1;
    M.port = ntohs(a.sin_port);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", M.port);
    setenv("AWS_ENDPOINT_URL_S3", ep, 1);
    setenv("AWS_ACCESS_KEY_ID", KEY_ID, 1);
    setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
    setenv("AWS_REGION", REGION, 1);
    unsetenv("AWS_SESSION_TOKEN");
    ka_objstore_set_credentials_file("");
    return pthread_create(&M.thread, NULL, m_run, NULL);
}

static int m_stop(void **unused)
{
    (void)unused;
    M.stop = true;
    shutdown(M.lfd, SHUT_RDWR);
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* wake accept */
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)M.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    connect(fd, (struct sockaddr *)&a, sizeof a);
    close(fd);
    pthread_join(M.thread, NULL);
    for (int i = 0; i < M.n_conns; i++) {
        shutdown(M.conns[i], SHUT_RDWR);
        pthread_join(M.conn_threads[i], NULL);
        close(M.conns[i]);
    }
    close(M.lfd);
    for (int i = 0; i < MAX_OBJ; i++)
        free(M.objs[i].data);
    return 0;
}

/* ---- the client's tests ------------------------------------------------------------------- */

static ka_objstore_t *s_client(const char *loc, size_t part)
{
    char err[KA_OBJSTORE_ERR_CAP];
    ka_objstore_opts_t o = {.backoff_ms = 5, .part_bytes = part};
    ka_objstore_t *s = ka_objstore_new(loc, &o, err, sizeof err);
    if (!s)
        fail_msg("ka_objstore_new: %s", err);
    return s;
}

static void test_put_get_signed(void **unused)
{
    (void)unused;
    ka_objstore_t *s = s_client("s3://bkt/snaps/", 0);
    assert_int_equal(ka_objstore_put(s, "id 1/hello.txt", "hello", 5), 0);
    assert_non_null(m_find("snaps/id%201/hello.txt", false)
                        ?: m_find("snaps/id 1/hello.txt", false));
    char buf[64];
    assert_int_equal(ka_objstore_get_small(s, "id 1/hello.txt", buf, sizeof buf), 0);
    assert_string_equal(buf, "hello");
    assert_int_equal(ka_objstore_get_small(s, "missing", buf, sizeof buf), -ENOENT);
    assert_non_null(strstr(ka_objstore_error(s), "404 NoSuchKey"));
    assert_int_equal(M.sig_failures, 0);
    /* a session token goes along, signed */
    setenv("AWS_SESSION_TOKEN", "tok/en==", 1);
    ka_objstore_t *t = s_client("s3://bkt/snaps", 0);
    unsetenv("AWS_SESSION_TOKEN");
    assert_int_equal(ka_objstore_put(t, "k", "v", 1), 0);
    assert_int_equal(M.token_seen, 1);
    assert_int_equal(M.sig_failures, 0);
    ka_objstore_destroy(&t);
    ka_objstore_destroy(&s);
    assert_null(s);
}

static void test_multipart_streamed(void **unused)
{
    (void)unused;
    ka_objstore_t *s = s_client("s3://bkt/p", 64 << 10);
    size_t n = 300000;
    unsigned char *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 31u >> 3);
    ka_os_upload_t *u = ka_os_upload_new(s, "big");
    for (size_t off = 0; off < n;) { /* odd write sizes */
        size_t k = off + 7777 < n ? 7777 : n - off;
        assert_int_equal(ka_os_upload_write(u, data + off, k), 0);
        off += k;
    }
    assert_int_equal(ka_os_upload_finish(&u), 0);
    assert_null(u);
    assert_int_equal(M.n_parts, 5); /* 4 full parts of 64 KiB and the rest */
    assert_int_equal(M.completes, 1);
    m_obj_t *o = m_find("p/big", false);
    assert_non_null(o);
    assert_int_equal(o->len, n);
    assert_memory_equal(o->data, data, n);
    assert_int_equal(M.sig_failures, 0);
    /* a small one is one PUT */
    u = ka_os_upload_new(s, "small");
    assert_int_equal(ka_os_upload_write(u, "abc", 3), 0);
    assert_int_equal(ka_os_upload_finish(&u), 0);
    assert_int_equal(M.completes, 1);
    assert_int_equal(m_find("p/small", false)->len, 3);
    /* storage failing mid-upload: the upload fails, is aborted, no object appears */
    u = ka_os_upload_new(s, "broken");
    int rc = 0;
    for (size_t off = 0; off < n && !rc; off += 10000) {
        if (off >= 100000)
            M.fail_next = 1000;
        rc = ka_os_upload_write(u, data + off, off + 10000 < n ? 10000 : n - off);
    }
    assert_int_equal(rc ? rc : ka_os_upload_finish(&u), -EIO);
    if (u)
        ka_os_upload_abort(&u);
    assert_null(m_find("p/broken", false));
    assert_non_null(strstr(ka_objstore_error(s), "503"));
    M.fail_next = 0;
    free(data);
    ka_objstore_destroy(&s);
}

static void test_retries_with_backoff(void **unused)
{
    (void)unused;
    ka_objstore_t *s = s_client("s3://bkt", 0);
    M.fail_next = 2;
    int before = M.requests;
    assert_int_equal(ka_objstore_put(s, "k", "v", 1), 0);
    assert_int_equal(M.requests - before, 3);
    M.fail_next = 100;
    before = M.requests;
    assert_int_equal(ka_objstore_put(s, "k", "v", 1), -EIO);
    assert_int_equal(M.requests - before, 4); /* the default attempts */
    assert_non_null(strstr(ka_objstore_error(s), "HTTP 503 SlowDown"));
    M.fail_next = 0;
    ka_objstore_destroy(&s);
}

static char *s_pattern(size_t n, unsigned seed)
{
    char *d = malloc(n);
    for (size_t i = 0; i < n; i++)
        d[i] = (char)((i * 2654435761u + seed) >> 13);
    return d;
}

static void test_get_resumes_with_range(void **unused)
{
    (void)unused;
    ka_objstore_t *s = s_client("s3://bkt/r/", 0);
    size_t n = 200000;
    char *data = malloc(n), *got = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        data[i] = (char)('a' + i % 23);
    assert_int_equal(ka_objstore_put(s, "obj", data, n), 0);
    M.cut_after = 70000;
    s_small_t m = {got, n + 1, 0};
    uint64_t bytes = 0;
    assert_int_equal(ka_objstore_get(s, "obj", s_small_sink, &m, &bytes), 0);
    assert_int_equal(M.ranges, 1);
    assert_int_equal(bytes, n);
    assert_int_equal(m.n, n);
    assert_memory_equal(got, data, n);
    /* the object replaced between the cut and the resume (another size, then the same size with
     * other bytes): the resume is refused, not spliced onto the old object's first bytes */
    for (int same_size = 0; same_size < 2; same_size++) {
        M.gets = 0;
        M.swap_len = same_size ? n : n + 5000;
        M.swap = s_pattern(M.swap_len, 9);
        M.swap_after = 1;
        M.cut_after = 70000;
        m.n = 0;
        assert_int_equal(ka_objstore_get(s, "obj", s_small_sink, &m, NULL), -ESTALE);
        assert_null(M.swap);
        assert_int_equal(m.n, 70000);
        assert_non_null(strstr(ka_objstore_error(s), "changed during the download"));
        assert_int_equal(ka_objstore_put(s, "obj", data, n), 0);
    }
    /* a server that answers the Range with the whole object again is not appended */
    M.ignore_range = true;
    M.cut_after = 70000;
    m.n = 0;
    assert_int_equal(ka_objstore_get(s, "obj", s_small_sink, &m, NULL), -EPROTO);
    free(data);
    free(got);
    ka_objstore_destroy(&s);
}

static void test_refused_and_unreachable(void **unused)
{
    (void)unused;
    setenv("AWS_SECRET_ACCESS_KEY", "wrong", 1);
    ka_objstore_t *s = s_client("s3://bkt", 0);
    setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
    int before = M.requests;
    assert_int_equal(ka_objstore_put(s, "k", "v", 1), -EACCES);
    assert_int_equal(M.requests - before, 1); /* not retried */
    assert_non_null(strstr(ka_objstore_error(s), "403 SignatureDoesNotMatch"));
    assert_null(strstr(ka_objstore_error(s), "wrong")); /* no secret in messages */
    M.sig_failures = 0;
    ka_objstore_destroy(&s);

    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", 1); /* nobody listens */
    setenv("AWS_ENDPOINT_URL_S3", ep, 1);
    s = s_client("s3://bkt", 0);
    assert_int_equal(ka_objstore_put(s, "k", "v", 1), -ECONNREFUSED);
    assert_non_null(strstr(ka_objstore_error(s), "unreachable"));
    ka_objstore_destroy(&s);
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", M.port);
    setenv("AWS_ENDPOINT_URL_S3", ep, 1);

    unsetenv("AWS_ACCESS_KEY_ID");
    char err[KA_OBJSTORE_ERR_CAP];
    assert_null(ka_objstore_new("s3://bkt", NULL, err, sizeof err));
    assert_non_null(strstr(err, "no object storage credentials"));
    setenv("AWS_ACCESS_KEY_ID", KEY_ID, 1);
    assert_null(ka_objstore_new("s3://B@d/", NULL, err, sizeof err));
    assert_non_null(strstr(err, "malformed"));
    assert_null(ka_objstore_new("file:///x", NULL, err, sizeof err));
}

static int s_collect(void *user, const char *key)
{
    char **keys = user;
    int n = 0;
    while (n < 15 && keys[n])
        n++;
    keys[n] = strdup(key);
    keys[n + 1] = NULL;
    return 0;
}

static void test_list_pages_and_delete(void **unused)
{
    (void)unused;
    ka_objstore_t *s = s_client("s3://bkt/pre/", 0);
    for (int i = 0; i < 5; i++) {
        char k[32];
        snprintf(k, sizeof k, "sbx/%d", i);
        assert_int_equal(ka_objstore_put(s, k, "x", 1), 0);
    }
    assert_int_equal(ka_objstore_put(s, "other/1", "x", 1), 0);
    M.list_page = 2;
    char *keys[16] = {NULL};
    int n = 0;
    assert_int_equal(ka_objstore_list(s, "sbx/", s_collect, keys), 0);
    while (n < 16 && keys[n])
        n++;
    assert_int_equal(n, 5);
    assert_string_equal(keys[0], "sbx/0");
    assert_non_null(strstr(M.last_query, "continuation-token=t4"));
    for (int i = 0; i < n; i++) {
        assert_int_equal(ka_objstore_delete(s, keys[i]), 0);
        free(keys[i]);
    }
    assert_null(m_find("pre/sbx/3", false));
    assert_non_null(m_find("pre/other/1", false));
    assert_int_equal(ka_objstore_delete(s, "sbx/3"), 0); /* gone already: still 0 */
    assert_int_equal(M.sig_failures, 0);
    ka_objstore_destroy(&s);
}

/* Makes the client's credentials file (named in path; unlink it after): a decoy profile, then
 * the mock's keys, region and endpoint; AWS_ENDPOINT_URL_S3 then points nowhere useful. */
static void m_creds_file(char path[static 21])
{
    strcpy(path, "/tmp/ka-creds-XXXXXX");
    int fd = mkstemp(path);
    dprintf(fd,
            "# test\n[other]\naws_access_key_id = NOPE\n[default]\naws_access_key_id = %s\n"
            "aws_secret_access_key=%s\nregion = %s\nendpoint_url = http://127.0.0.1:%d/\n",
            KEY_ID, SECRET, REGION, M.port);
    close(fd);
    setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1", 1);
    assert_int_equal(ka_objstore_set_credentials_file(path), 0);
}

static void test_credentials_file_overrides(void **unused)
{
    (void)unused;
    char path[21];
    m_creds_file(path);
    setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
    ka_objstore_t *s = s_client("s3://bkt", 0);
    assert_int_equal(ka_objstore_put(s, "k", "v", 1), 0);
    assert_int_equal(M.sig_failures, 0);
    ka_objstore_destroy(&s);
    ka_objstore_set_credentials_file("/nonexistent/creds");
    char err[KA_OBJSTORE_ERR_CAP];
    assert_null(ka_objstore_new("s3://bkt", NULL, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/creds"));
    ka_objstore_set_credentials_file("");
    unlink(path);
    setenv("AWS_ACCESS_KEY_ID", KEY_ID, 1);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", M.port);
    setenv("AWS_ENDPOINT_URL_S3", ep, 1);
}

/* gs:// is GCS's XML API: path-style, signed with HMAC keys the AWS way; its endpoint comes from
 * the credentials file (or GCS itself), never from AWS_ENDPOINT_URL*. The mock stands in for
 * GCS: a round trip of put, get and delete, every request's signature checked. */
static void test_gcs_location(void **unused)
{
    (void)unused;
    char path[21];
    m_creds_file(path); /* AWS_ENDPOINT_URL_S3 is S3's, not GCS's: never used for gs:// */
    ka_objstore_t *s = s_client("gs://bkt/gsnaps/", 0);
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d/bkt/", M.port);
    assert_string_equal(s->base, base);
    assert_int_equal(ka_objstore_put(s, "a/obj", "gcs", 3), 0);
    assert_non_null(m_find("gsnaps/a/obj", false));
    char buf[16];
    assert_int_equal(ka_objstore_get_small(s, "a/obj", buf, sizeof buf), 0);
    assert_string_equal(buf, "gcs");
    assert_int_equal(ka_objstore_delete(s, "a/obj"), 0);
    assert_null(m_find("gsnaps/a/obj", false));
    assert_int_equal(M.sig_failures, 0);
    ka_objstore_destroy(&s);
    ka_objstore_set_credentials_file("");
    unlink(path);
    snprintf(base, sizeof base, "http://127.0.0.1:%d", M.port);
    setenv("AWS_ENDPOINT_URL_S3", base, 1);
}

/* AWS itself is addressed virtual-hosted, GCS and custom endpoints path-style. */
static void test_addressing(void **unused)
{
    (void)unused;
    unsetenv("AWS_ENDPOINT_URL_S3");
    ka_objstore_t *s = s_client("s3://my-bucket/a/b", 0);
    assert_string_equal(s->base, "https://my-bucket.s3." REGION ".amazonaws.com/");
    assert_string_equal(s->prefix, "a/b/");
    ka_objstore_destroy(&s);
    s = s_client("gs://gbucket/x/", 0);
    assert_string_equal(s->base, "https://storage.googleapis.com/gbucket/");
    ka_objstore_destroy(&s);
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d/", M.port);
    setenv("AWS_ENDPOINT_URL_S3", ep, 1);
    s = s_client("s3://bkt", 0);
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d/bkt/", M.port);
    assert_string_equal(s->base, ep);
    ka_objstore_destroy(&s);
    assert_true(ka_objstore_is_location("gs://b/p"));
    assert_false(ka_objstore_is_location("s3:///p"));
    assert_false(ka_objstore_is_location("file:///p"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_get_signed, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_multipart_streamed, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_retries_with_backoff, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_get_resumes_with_range, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_refused_and_unreachable, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_list_pages_and_delete, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_credentials_file_overrides, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_gcs_location, m_start, m_stop),
        cmocka_unit_test_setup_teardown(test_addressing, m_start, m_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
