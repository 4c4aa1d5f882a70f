/*
 * ka_snapobj's restore ring: the download's thread puts what arrives into a bounded ring that
 * the archive reader unpacks from in place. Bytes come out in order and whole, whatever the
 * sizes put (larger than the ring too) and however the ring wraps; a short stream (less than
 * the reader waits for) still comes out once the download ends; a download that fails after
 * some bytes gives the reader those bytes, then its error; a reader that stops (a refused
 * archive) ends a download blocked on a full ring with -EPIPE instead of leaving it hanging;
 * a real archive restores through it.
 * The .c is included to reach the ring's statics.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../../../actors/substrate/ka_snapobj.c"

#include <fcntl.h>
#include <sys/stat.h>

static char s_tmp[64];

static int s_setup(void **unused)
{
    (void)unused;
    snprintf(s_tmp, sizeof s_tmp, "/tmp/ka-snapobj-XXXXXX");
    return mkdtemp(s_tmp) ? 0 : -1;
}

static int s_teardown(void **unused)
{
    (void)unused;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static unsigned char s_byte(size_t i)
{
    return (unsigned char)((i * 2654435761u) >> 11);
}

/* A download: puts `len` bytes (from `data`, else s_byte) in pieces cycling through `pieces`,
 * then ends with `end_rc` (unless a put failed: then with that). */
typedef struct s_writer {
    s_fetch_t *f;
    const unsigned char *data;
    size_t len;
    const size_t *pieces;
    size_t n_pieces;
    int end_rc;
    int put_rc; /* the first failed put's result */
    size_t put; /* bytes put */
} s_writer_t;

static void *s_write_run(void *arg)
{
    s_writer_t *w = arg;
    unsigned char *buf = malloc(3 * S_RING);
    assert_non_null(buf);
    for (size_t i = 0; w->put < w->len && !w->put_rc; i++) {
        size_t n = w->pieces[i % w->n_pieces];
        n = n < w->len - w->put ? n : w->len - w->put;
        const unsigned char *p = w->data ? w->data + w->put : buf;
        for (size_t k = 0; !w->data && k < n; k++)
            buf[k] = s_byte(w->put + k);
        w->put_rc = s_ring_put(w->f, p, n);
        w->put += w->put_rc ? 0 : n;
    }
    free(buf);
    s_ring_end(w->f, w->put_rc ? w->put_rc : w->end_rc);
    return NULL;
}

/* Takes everything the ring gives, checking it against s_byte; the count, or the error. */
static ssize_t s_read_all(s_fetch_t *f, size_t *takes)
{
    size_t got = 0;
    for (;;) {
        const void *p = NULL;
        ssize_t n = s_ring_take(f, &p);
        if (n <= 0)
            return n < 0 ? n : (ssize_t)got;
        assert_true((size_t)n <= S_RING);
        const unsigned char *b = p;
        for (ssize_t k = 0; k < n; k++)
            if (b[k] != s_byte(got + (size_t)k))
                fail_msg("byte %zu differs", got + (size_t)k);
        got += (size_t)n;
        ++*takes;
    }
}

static void test_ring_in_order_whole(void **unused)
{
    (void)unused;
    static const size_t pieces[] = {1, 16384, 700001, 3, 2 * S_RING + 17, 65536, S_RING};
    static const size_t sizes[] = {5 * S_RING + 12345, 1000, 0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        s_fetch_t f = {0};
        assert_int_equal(s_ring_init(&f), 0);
        s_writer_t w = {.f = &f, .len = sizes[i], .pieces = pieces, .n_pieces = 7};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, s_write_run, &w), 0);
        size_t takes = 0;
        assert_int_equal(s_read_all(&f, &takes), (ssize_t)sizes[i]);
        assert_int_equal(s_ring_take(&f, &(const void *){NULL}), 0); /* the end stays the end */
        s_ring_close(&f);
        pthread_join(t, NULL);
        assert_int_equal(w.put_rc, 0);
        if (sizes[i] > S_RING) /* the reader woke for batches, not for every piece */
            assert_true(takes <= 2 * sizes[i] / S_TAKE_MIN + 2);
        s_ring_free(&f);
    }
}

/* Puts n bytes of the s_byte stream from offset at (the ring has room: no wait). */
static void s_put_at(s_fetch_t *f, size_t at, size_t n)
{
    unsigned char *b = malloc(n);
    assert_non_null(b);
    for (size_t k = 0; k < n; k++)
        b[k] = s_byte(at + k);
    assert_int_equal(s_ring_put(f, b, n), 0);
    free(b);
}

/* Takes once, expecting n bytes of the s_byte stream from offset at. */
static void s_take_at(s_fetch_t *f, size_t at, size_t n)
{
    const void *p = NULL;
    assert_int_equal(s_ring_take(f, &p), (ssize_t)n);
    for (size_t k = 0; k < n; k++)
        if (((const unsigned char *)p)[k] != s_byte(at + k))
            fail_msg("byte %zu differs", at + k);
}

static void test_ring_wraps(void **unused)
{
    (void)unused;
    s_fetch_t f = {0};
    assert_int_equal(s_ring_init(&f), 0);
    size_t a = 700000, b = 300000, c = 200000, to_end = S_RING - a - b;
    s_put_at(&f, 0, a);
    s_take_at(&f, 0, a); /* lent until the next take: b goes after it */
    s_put_at(&f, a, b);
    s_take_at(&f, a, b);    /* a given back */
    s_put_at(&f, a + b, c); /* to the ring's end, then from its start */
    s_ring_end(&f, 0);
    s_take_at(&f, a + b, to_end); /* only what is contiguous */
    s_take_at(&f, a + b + to_end, c - to_end);
    s_take_at(&f, a + b + c, 0);
    s_ring_free(&f);
}

static void test_ring_download_failure_after_bytes(void **unused)
{
    (void)unused;
    static const size_t pieces[] = {16384};
    s_fetch_t f = {0};
    assert_int_equal(s_ring_init(&f), 0);
    s_writer_t w = {
        .f = &f, .len = 3 * S_RING + 5, .pieces = pieces, .n_pieces = 1, .end_rc = -ECONNREFUSED};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_write_run, &w), 0);
    size_t takes = 0, got = 0;
    for (ssize_t n; (n = s_ring_take(&f, &(const void *){NULL})) > 0;)
        got += (size_t)n;
    assert_int_equal(got, 3 * S_RING + 5); /* every byte before the failure */
    assert_int_equal(s_ring_take(&f, &(const void *){NULL}), -ECONNREFUSED);
    (void)takes;
    s_ring_close(&f);
    pthread_join(t, NULL);
    s_ring_free(&f);
}

static void test_ring_reader_stop_ends_download(void **unused)
{
    (void)unused;
    static const size_t pieces[] = {S_RING / 3};
    s_fetch_t f = {0};
    assert_int_equal(s_ring_init(&f), 0);
    s_writer_t w = {.f = &f, .len = 64 * S_RING, .pieces = pieces, .n_pieces = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_write_run, &w), 0);
    const void *p;
    assert_true(s_ring_take(&f, &p) > 0);
    while (1) { /* until the download waits on a full ring */
        pthread_mutex_lock(&f.lock);
        bool full = f.len == S_RING;
        pthread_mutex_unlock(&f.lock);
        if (full)
            break;
        usleep(1000);
    }
    s_ring_close(&f);
    pthread_join(t, NULL); /* it ends: a hang here is the test's timeout */
    assert_int_equal(w.put_rc, -EPIPE);
    assert_true(w.put < 64 * S_RING);
    s_ring_free(&f);
}

/* An archive of a tree (a file larger than the ring, a small one, a directory) in memory. */
typedef struct s_mem {
    unsigned char *p;
    size_t n, cap;
} s_mem_t;

static int s_mem_sink(void *user, const void *buf, size_t n)
{
    s_mem_t *m = user;
    if (m->n + n > m->cap) {
        m->cap = (m->n + n) * 2;
        m->p = realloc(m->p, m->cap);
        assert_non_null(m->p);
    }
    memcpy(m->p + m->n, buf, n);
    m->n += n;
    return 0;
}

static void s_archive(s_mem_t *m, ka_snapshot_info_t *info)
{
    char src[128], p[160];
    snprintf(src, sizeof src, "%s/src", s_tmp);
    assert_int_equal(mkdir(src, 0755), 0);
    snprintf(p, sizeof p, "%s/sub", src);
    assert_int_equal(mkdir(p, 0750), 0);
    size_t big = 3 * S_RING + 777;
    unsigned char *b = malloc(big);
    assert_non_null(b);
    for (size_t i = 0; i < big; i++)
        b[i] = s_byte(i * 7);
    snprintf(p, sizeof p, "%s/sub/big", src);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0640);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, big), (ssize_t)big);
    close(fd);
    free(b);
    snprintf(p, sizeof p, "%s/small", src);
    fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hello", 5), 5);
    close(fd);
    ka_tree_opts_t o = {.deadline_ms = krt_mono_ms() + 60000, .owner = -1};
    char err[256];
    assert_int_equal(ka_snapshot_write(src, &o, s_mem_sink, m, info, err, sizeof err), 0);
}

static void test_archive_restores_through_ring(void **unused)
{
    (void)unused;
    s_mem_t m = {0};
    ka_snapshot_info_t wi, ri;
    s_archive(&m, &wi);
    static const size_t pieces[] = {16384, 524288, 1};
    s_fetch_t f = {0};
    assert_int_equal(s_ring_init(&f), 0);
    s_writer_t w = {.f = &f, .data = m.p, .len = m.n, .pieces = pieces, .n_pieces = 3};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_write_run, &w), 0);
    char dst[128], err[KA_SNAPSHOT_ERR_CAP];
    snprintf(dst, sizeof dst, "%s/dst", s_tmp);
    ka_tree_opts_t o = {.deadline_ms = krt_mono_ms() + 60000, .owner = -1};
    assert_int_equal(ka_snapshot_read_from(dst, s_ring_take, &f, &o, &ri, err, sizeof err), 0);
    s_ring_close(&f);
    pthread_join(t, NULL);
    s_ring_free(&f);
    assert_int_equal(ri.archive_bytes, m.n);
    assert_string_equal(ri.sha256, wi.sha256);
    assert_int_equal(ri.tree.bytes, wi.tree.bytes);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "diff -r '%s/src' '%s'", s_tmp, dst);
    assert_int_equal(system(cmd), 0);
    free(m.p);
}

static void test_refused_archive_stops_download(void **unused)
{
    (void)unused;
    static const size_t pieces[] = {65536};
    s_fetch_t f = {0};
    assert_int_equal(s_ring_init(&f), 0);
    /* not an archive: the reader refuses it at once while the download has far more to put */
    s_writer_t w = {.f = &f, .len = 256 * S_RING, .pieces = pieces, .n_pieces = 1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_write_run, &w), 0);
    char dst[128], err[KA_SNAPSHOT_ERR_CAP];
    snprintf(dst, sizeof dst, "%s/dst", s_tmp);
    ka_tree_opts_t o = {.deadline_ms = krt_mono_ms() + 60000, .owner = -1};
    ka_snapshot_info_t ri;
    assert_int_equal(ka_snapshot_read_from(dst, s_ring_take, &f, &o, &ri, err, sizeof err),
                     -EINVAL);
    s_ring_close(&f);
    pthread_join(t, NULL);
    assert_int_equal(w.put_rc, -EPIPE);
    assert_true(w.put < 256 * S_RING);
    s_ring_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_in_order_whole),
        cmocka_unit_test(test_ring_wraps),
        cmocka_unit_test(test_ring_download_failure_after_bytes),
        cmocka_unit_test(test_ring_reader_stop_ends_download),
        cmocka_unit_test_setup_teardown(test_archive_restores_through_ring, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_refused_archive_stops_download, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
