/*
 * ka_objstore: a small blocking S3 client for snapshot objects (s3:// and gs:// locations).
 *
 * Requests are signed with AWS Signature V4 by libcurl (CURLOPT_AWS_SIGV4); every payload is
 * hashed and the hash signed (x-amz-content-sha256), so a body altered on the way is refused by
 * the server. gs:// uses Google Cloud Storage's S3-compatible XML API with HMAC keys
 * (storage.googleapis.com, path-style). A custom endpoint (AWS_ENDPOINT_URL_S3 /
 * AWS_ENDPOINT_URL or endpoint_url in the credentials file) is addressed path-style, AWS itself
 * virtual-hosted.
 *
 * Credentials: the node's credentials file when one is set (ka_objstore_set_credentials_file:
 * an AWS shared-credentials style file, keys aws_access_key_id, aws_secret_access_key,
 * aws_session_token, region, endpoint_url), else AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN, AWS_REGION (or AWS_DEFAULT_REGION) from the environment. Secrets never
 * appear in an error text.
 *
 * Transient failures (no connection, timeouts, HTTP 408/429/5xx) are retried with exponential
 * backoff; a download that breaks off resumes with a Range request where it stopped, and only
 * from the object it started on (the same ETag and size, else -ESTALE: never two objects
 * spliced). Large uploads go as multipart uploads, one part buffered at a time: nothing holds
 * a whole object.
 *
 * One client is used from one thread at a time. Errors are negative errnos (-ECONNREFUSED
 * unreachable, -EACCES refused credentials, -ENOENT no such object or bucket, -EIO other
 * server errors, -ETIMEDOUT past the deadline, -ESTALE the object changed during a download);
 * ka_objstore_error says what happened.
 */
#ifndef KA_OBJSTORE_H
#define KA_OBJSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KA_OBJSTORE_PART_BYTES (8u << 20) /* default multipart part size (S3's minimum: 5 MiB) */
#define KA_OBJSTORE_MAX_PARTS  10000      /* S3's limit */
#define KA_OBJSTORE_ERR_CAP    768

typedef struct ka_objstore ka_objstore_t;
typedef struct ka_os_upload ka_os_upload_t;

typedef struct ka_objstore_opts {
    int attempts;           /* tries per request; 0: 4 */
    int backoff_ms;         /* first retry's delay, doubled per retry (capped at 2 s); 0: 100 */
    size_t part_bytes;      /* multipart part size; 0: KA_OBJSTORE_PART_BYTES */
    int64_t deadline_ms;    /* CLOCK_MONOTONIC ms (krt_mono_ms) by which every request ends; 0 */
    int connect_timeout_ms; /* per connection attempt; 0: 5000 */
} ka_objstore_opts_t;

/* Receives downloaded bytes in order; 0 to go on, a negative errno to stop the download. */
typedef int (*ka_os_sink_fn)(void *user, const void *buf, size_t n);
/* Receives one listed key (relative to the location's prefix); 0 or a negative errno. */
typedef int (*ka_os_key_fn)(void *user, const char *key);

/* True for the locations this client serves: s3://bucket[/prefix] and gs://bucket[/prefix]. */
bool ka_objstore_is_location(const char *location);

/* Node-wide: a credentials file that overrides the environment ("" or NULL: none). Call before
 * clients are made (the node's start); the file is read by every ka_objstore_new. */
int ka_objstore_set_credentials_file(const char *path);

/*
 * A client for location ("s3://bucket/prefix/"; keys given to the other calls are relative to
 * the prefix). opts may be NULL. NULL on failure with a reason in err (a malformed location,
 * no credentials, an unreadable credentials file).
 */
ka_objstore_t *ka_objstore_new(const char *location, const ka_objstore_opts_t *opts, char *err,
                               size_t cap);
/* Idempotent; NULLs *self_p. */
void ka_objstore_destroy(ka_objstore_t **self_p);

/* The last failure, for people: "PUT s3://b/p/k: HTTP 403 AccessDenied: ..." (borrowed). */
const char *ka_objstore_error(const ka_objstore_t *self);

/* Stores buf (n bytes) as key in one request. */
int ka_objstore_put(ka_objstore_t *self, const char *key, const void *buf, size_t n);
/* Streams key to sink; *bytes (may be NULL) gets the object's size. */
int ka_objstore_get(ka_objstore_t *self, const char *key, ka_os_sink_fn sink, void *user,
                    uint64_t *bytes);
/* Reads a small object whole into buf (NUL-terminated; longer than cap-1: -EFBIG). */
int ka_objstore_get_small(ka_objstore_t *self, const char *key, char *buf, size_t cap);
/* Deletes key (a missing key is 0, as S3 says). */
int ka_objstore_delete(ka_objstore_t *self, const char *key);
/* Lists the keys under prefix (relative to the location's prefix) and calls fn for each. */
int ka_objstore_list(ka_objstore_t *self, const char *prefix, ka_os_key_fn fn, void *user);

/* Starts a streamed upload of key. NULL only when out of memory. */
ka_os_upload_t *ka_os_upload_new(ka_objstore_t *self, const char *key);
/* Appends n bytes; a full part goes to the server before this returns. */
int ka_os_upload_write(ka_os_upload_t *u, const void *buf, size_t n);
/* Completes the upload (the object exists only from here on) and frees u; on failure the
 * partial upload is aborted. NULLs *u_p. */
int ka_os_upload_finish(ka_os_upload_t **u_p);
/* Abandons the upload (parts already sent are discarded by the server). NULLs *u_p. */
void ka_os_upload_abort(ka_os_upload_t **u_p);

#endif
