/*
 * images_registry: fetching manifests and blobs by digest from an OCI distribution (v2)
 * registry with libcurl. Anonymous access only (loopback registries and mirrors); a 401 is
 * reported as such. Content is streamed into a temp blob and its digest verified.
 */
#include "images_int.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct s_sink {
    ka_blob_writer_t *w;
    uint64_t max; /* refuse bodies larger than this */
    bool too_big; /* the body passed max */
    int err;      /* a write error */
} s_sink_t;

static pthread_once_t s_once = PTHREAD_ONCE_INIT;

static void s_global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t s_body(char *ptr, size_t size, size_t nmemb, void *user)
{
    s_sink_t *s = user;
    size_t n = size * nmemb;
    if (ka_blob_writer_size(s->w) + n > s->max) {
        s->too_big = true;
        return 0;
    }
    if (ka_blob_writer_write(s->w, ptr, n) < 0) {
        s->err = -EIO;
        return 0;
    }
    return n;
}

int ka_registry_fetch(ka_blob_txn_t *t, const char *endpoint, const char *repo, const char *kind,
                      const char *digest, const char *accept, uint64_t max_bytes)
{
    pthread_once(&s_once, s_global_init);
    size_t elen = strlen(endpoint);
    while (elen > 0 && endpoint[elen - 1] == '/')
        elen--;
    char *url = ka_strfmt("%.*s/v2/%s/%s/%s", (int)elen, endpoint, repo, kind, digest);
    if (!url)
        return -ENOMEM;
    CURL *c = curl_easy_init();
    if (!c) {
        free(url);
        return ka_img_fail(-ENOMEM, "curl init failed");
    }
    ka_blob_writer_t *w = ka_blob_txn_writer(t);
    if (!w) {
        curl_easy_cleanup(c);
        free(url);
        return -EIO;
    }
    s_sink_t sink = {.w = w, .max = max_bytes};
    struct curl_slist *hdrs = NULL;
    char *acc = accept ? ka_strfmt("Accept: %s", accept) : NULL;
    if (acc)
        hdrs = curl_slist_append(hdrs, acc);
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, s_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "kagent-images/" KAGENT_VERSION);
    CURLcode cr = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    int rc = 0;
    if (sink.too_big)
        rc = ka_img_fail(-EFBIG, "%s: response larger than %llu bytes", url,
                         (unsigned long long)max_bytes);
    else if (sink.err)
        rc = sink.err;
    else if (cr != CURLE_OK)
        rc = ka_img_fail(-EIO, "%s: %s", url, errbuf[0] ? errbuf : curl_easy_strerror(cr));
    else if (status == 401)
        rc = ka_img_fail(-EACCES, "%s: registry asks for authentication (not supported)", url);
    else if (status == 404)
        rc = ka_img_fail(-ENOENT, "%s: not found in the registry", url);
    else if (status != 200)
        rc = ka_img_fail(-EIO, "%s: HTTP status %ld", url, status);
    curl_slist_free_all(hdrs);
    free(acc);
    curl_easy_cleanup(c);
    if (rc == 0) {
        rc = ka_blob_txn_add_writer(t, &w, digest, -1, NULL);
        if (rc == -EBADMSG) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ka_img_last_error());
            ka_img_fail(rc, "%s: %s", url, msg);
        }
    }
    ka_blob_writer_destroy(&w);
    free(url);
    return rc;
}
