/*
 * The Files API guest frames as hostile input: ka_fsframes alone (listings out of order, with
 * more entries than asked, names with '/', "..", bad types and modes; watch events of unknown
 * kinds, absolute or unclean paths, stray NULs) and through ka_gc_check on a real channel (a
 * socketpair and guestconn): a bad frame is FATAL, a good one is delivered and its event bytes
 * are counted against the watch's credit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "guestconn.h"
#include "ka_fsframes.h"
#include "ka_guestcalls.h"

/* ---- building frames ---------------------------------------------------------------------- */

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
} s_msg_t;

static void s_init(s_msg_t *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
    msgpack_unpacked_init(&m->up);
}

static const msgpack_object *s_obj(s_msg_t *m)
{
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&m->up, m->sb.data, m->sb.size, &off),
                     MSGPACK_UNPACK_SUCCESS);
    return &m->up.data;
}

static void s_fini(s_msg_t *m)
{
    msgpack_unpacked_destroy(&m->up);
    msgpack_sbuffer_destroy(&m->sb);
}

static void s_entry(msgpack_packer *pk, const char *name, uint64_t type, uint64_t mode)
{
    msgpack_pack_array(pk, 5);
    ka_gp_pack_cstr(pk, name);
    msgpack_pack_uint64(pk, type);
    msgpack_pack_uint64(pk, 10);
    msgpack_pack_uint64(pk, mode);
    msgpack_pack_int64(pk, 1700000000000);
}

/* A listing end frame of the given names (all files, mode 0644) as an object. */
static const char *s_check_list(const char *const *names, size_t n, const char *after,
                                uint32_t limit)
{
    s_msg_t m;
    s_init(&m);
    msgpack_pack_map(&m.pk, 3);
    ka_gp_pack_cstr(&m.pk, "entries");
    msgpack_pack_array(&m.pk, n);
    for (size_t i = 0; i < n; i++)
        s_entry(&m.pk, names[i], KA_GP_FT_FILE, 0644);
    ka_gp_pack_cstr(&m.pk, "more");
    msgpack_pack_false(&m.pk);
    ka_gp_pack_cstr(&m.pk, "end");
    msgpack_pack_true(&m.pk);
    const char *why = ka_fsf_check_list(s_obj(&m), after, limit);
    s_fini(&m);
    return why;
}

static void test_list(void **state)
{
    (void)state;
    const char *ok[] = {"A", "a", "a.b", "ab", "b"};
    assert_null(s_check_list(ok, 5, "", 5));
    assert_null(s_check_list(ok, 5, "0", 10));
    assert_null(s_check_list(ok, 0, "", 10));
    assert_non_null(s_check_list(ok, 5, "", 4));   /* more than asked */
    assert_non_null(s_check_list(ok, 5, "a", 10)); /* not after the token */
    const char *unsorted[] = {"b", "a"};
    assert_non_null(s_check_list(unsorted, 2, "", 10));
    const char *dup[] = {"a", "a"};
    assert_non_null(s_check_list(dup, 2, "", 10));
    const char *prefix[] = {"ab", "a"};
    assert_non_null(s_check_list(prefix, 2, "", 10));
    const char *bad[] = {"a/b", "..", ".", "", "x\0y"};
    for (size_t i = 0; i < 4; i++)
        assert_non_null(s_check_list(&bad[i], 1, "", 10));
    char longname[300];
    memset(longname, 'n', 256);
    longname[256] = 0;
    const char *ln[] = {longname};
    assert_non_null(s_check_list(ln, 1, "", 10));
    longname[255] = 0;
    assert_null(s_check_list(ln, 1, "", 10));

    /* entries with a bad type, mode or shape; a frame without "more" */
    s_msg_t m;
    for (int k = 0; k < 4; k++) {
        s_init(&m);
        msgpack_pack_map(&m.pk, k == 3 ? 1 : 2);
        ka_gp_pack_cstr(&m.pk, "entries");
        msgpack_pack_array(&m.pk, 1);
        if (k == 0)
            s_entry(&m.pk, "a", 9, 0644);
        else if (k == 1)
            s_entry(&m.pk, "a", KA_GP_FT_DIR, 010000);
        else {
            msgpack_pack_array(&m.pk, 2);
            ka_gp_pack_cstr(&m.pk, "a");
            msgpack_pack_uint64(&m.pk, 1);
        }
        if (k != 3) {
            ka_gp_pack_cstr(&m.pk, "more");
            msgpack_pack_true(&m.pk);
        }
        assert_non_null(ka_fsf_check_list(s_obj(&m), "", 10));
        s_fini(&m);
    }
}

static void test_stat_and_page(void **state)
{
    (void)state;
    s_msg_t m;
    s_init(&m);
    msgpack_pack_map(&m.pk, 1);
    ka_gp_pack_cstr(&m.pk, "entry");
    s_entry(&m.pk, ".", KA_GP_FT_DIR, 0755);
    const msgpack_object *o = s_obj(&m);
    assert_null(ka_fsf_check_stat(o));
    size_t len = 0;
    ka_fs_page_t *pg = ka_fsf_page(o, &len);
    assert_non_null(pg);
    assert_int_equal(pg->count, 1);
    assert_int_equal(len, sizeof *pg + sizeof pg->entries[0]);
    assert_string_equal(pg->entries[0].name, ".");
    assert_int_equal(pg->entries[0].mode, 0755);
    assert_int_equal(pg->entries[0].mtime_ms, 1700000000000);
    free(pg);
    s_fini(&m);
    s_init(&m);
    msgpack_pack_map(&m.pk, 1);
    ka_gp_pack_cstr(&m.pk, "entry");
    s_entry(&m.pk, "..", KA_GP_FT_DIR, 0755);
    assert_non_null(ka_fsf_check_stat(s_obj(&m)));
    s_fini(&m);
}

static const char *s_ev(const char *bytes, size_t n)
{
    return ka_fsf_check_event(bytes, n);
}

#define EV(lit) s_ev(lit, sizeof(lit) - 1)

static void test_event(void **state)
{
    (void)state;
    assert_null(EV("\x01"
                   "a/b\0\0"));
    assert_null(EV("\x81"
                   "dir\0\0"));
    assert_null(EV("\x02"
                   "f\0\0"));
    assert_null(EV("\x03"
                   "f\0\0"));
    assert_null(EV("\x04"
                   "new\0old/x\0"));
    assert_null(EV("\x05\0\0"));
    assert_non_null(EV("\x06"
                       "a\0\0")); /* unknown kind */
    assert_non_null(EV("\x00"
                       "a\0\0")); /* kind 0 */
    assert_non_null(EV("\x01"
                       "/etc\0\0")); /* absolute */
    assert_non_null(EV("\x01"
                       "../x\0\0")); /* escaping */
    assert_non_null(EV("\x01"
                       "a/../../x\0\0"));
    assert_non_null(EV("\x01"
                       "a/./b\0\0"));
    assert_non_null(EV("\x01"
                       "a//b\0\0")); /* empty component */
    assert_non_null(EV("\x01"
                       "a/\0\0"));
    assert_non_null(EV("\x01\0\0")); /* no path */
    assert_non_null(EV("\x01"
                       "a\0b\0")); /* from on a create */
    assert_non_null(EV("\x04"
                       "a\0\0")); /* a move without from */
    assert_non_null(EV("\x04"
                       "a\0/etc\0")); /* a move from outside */
    assert_non_null(EV("\x05"
                       "a\0\0"));    /* overflow with a path */
    assert_non_null(EV("\x85\0\0")); /* a "directory" overflow */
    assert_non_null(EV("\x01"
                       "a\0\0\0")); /* a stray NUL */
    assert_non_null(EV("\x01"
                       "a\0")); /* cut short */
    assert_non_null(EV("\x01"
                       "a"));
    assert_non_null(s_ev("", 0));
    char big[KA_GP_PATH_MAX + 8];
    big[0] = 1;
    for (size_t k = 0; k < KA_GP_PATH_MAX + 2; k++) /* names of 199 bytes */
        big[1 + k] = k % 200 == 199 ? '/' : 'a';
    big[KA_GP_PATH_MAX + 1] = 0; /* a path of 4095 bytes */
    big[KA_GP_PATH_MAX + 2] = 0;
    assert_null(s_ev(big, KA_GP_PATH_MAX + 3));
    big[KA_GP_PATH_MAX + 1] = 'a'; /* 4096 bytes */
    big[KA_GP_PATH_MAX + 3] = 0;
    assert_non_null(s_ev(big, KA_GP_PATH_MAX + 4));
    int kind;
    bool dir;
    const char *path, *from;
    ka_fsf_event("\x84"
                 "new\0old\0",
                 &kind, &dir, &path, &from);
    assert_int_equal(kind, KA_GP_EV_MOVE);
    assert_true(dir);
    assert_string_equal(path, "new");
    assert_string_equal(from, "old");
}

/* ---- through ka_gc_check on a channel ---------------------------------------------------- */

static int s_fd[2];
static ka_guestconn_t *s_gc;

static int s_setup(void **state)
{
    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s_fd), 0);
    s_gc = ka_guestconn_new(s_fd[0], true);
    assert_non_null(s_gc);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    ka_guestconn_destroy(&s_gc);
    close(s_fd[1]);
    return 0;
}

/* Sends a frame {id, key: value} (value packed by fn) from the "guest" and checks it. */
typedef void (*s_pack_fn)(msgpack_packer *pk, const void *arg);

static ka_gc_verdict_t s_send(ka_gc_table_t *t, uint64_t id, const char *key, s_pack_fn fn,
                              const void *arg, bool end, const char **why)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    size_t off = ka_gp_frame_begin(&sb);
    msgpack_pack_map(&pk, 2 + end);
    ka_gp_pack_cstr(&pk, "id");
    msgpack_pack_uint64(&pk, id);
    ka_gp_pack_cstr(&pk, key);
    fn(&pk, arg);
    if (end) {
        ka_gp_pack_cstr(&pk, "end");
        msgpack_pack_true(&pk);
    }
    ka_gp_frame_end(&sb, off);
    assert_int_equal(write(s_fd[1], sb.data, sb.size), (ssize_t)sb.size);
    msgpack_sbuffer_destroy(&sb);
    ka_gp_frame_t *f = NULL;
    assert_int_equal(ka_guestconn_wait(s_gc, 2000, &f), 0);
    ka_gc_call_t *c;
    ka_gc_verdict_t v = ka_gc_check(t, 100, f, 0, &c, why);
    ka_gp_frame_free(&f);
    return v;
}

typedef struct {
    const char *p;
    size_t n;
} s_bytes_t;

static void s_pack_bin(msgpack_packer *pk, const void *arg)
{
    const s_bytes_t *b = arg;
    ka_gp_pack_bytes(pk, b->p, b->n, true);
}

static void s_pack_str(msgpack_packer *pk, const void *arg)
{
    const s_bytes_t *b = arg;
    ka_gp_pack_bytes(pk, b->p, b->n, false);
}

static void s_pack_entries(msgpack_packer *pk, const void *arg)
{
    const char *const *names = arg;
    size_t n = 0;
    while (names[n])
        n++;
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        s_entry(pk, names[i], KA_GP_FT_FILE, 0600);
}

static void test_through_guestcalls(void **state)
{
    (void)state;
    ka_gc_table_t t = {0};
    const char *why;
    ka_gc_call_t *w = ka_gc_add(&t, 7, KA_GC_WATCH, 0, NULL, 16, 0, NULL);
    assert_non_null(w);
    assert_true(ka_gc_kind_streams(KA_GC_WATCH));
    assert_int_equal(ka_gc_count(&t, KA_GC_WATCH), 1);
    s_bytes_t good = {"\x01"
                      "f\0",
                      4};
    assert_int_equal(s_send(&t, 7, "event", s_pack_bin, &good, false, &why), KA_GC_DELIVER);
    assert_int_equal(w->credit, 12);
    assert_int_equal(w->unacked, 4);
    s_bytes_t bad = {"\x01"
                     "../x\0",
                     7};
    assert_int_equal(s_send(&t, 7, "event", s_pack_bin, &bad, false, &why), KA_GC_FATAL);
    assert_non_null(strstr(why, "relative"));
    assert_int_equal(s_send(&t, 7, "event", s_pack_str, &good, false, &why), KA_GC_FATAL);
    assert_int_equal(s_send(&t, 7, "chunk", s_pack_bin, &good, false, &why), KA_GC_FATAL);
    s_bytes_t big = {"\x01"
                     "abcdefghijklmn\0",
                     17}; /* past the 12 bytes of credit left */
    assert_int_equal(s_send(&t, 7, "event", s_pack_bin, &big, false, &why), KA_GC_FATAL);
    assert_non_null(strstr(why, "credit"));
    assert_int_equal(ka_gc_credit(w, 4), 4);
    assert_int_equal(w->credit, 16);
    /* a watch never ends but with an error */
    assert_int_equal(s_send(&t, 7, "more", s_pack_bin, &good, true, &why), KA_GC_FATAL);
    /* an event on a read is not what it streams */
    ka_gc_add(&t, 8, KA_GC_READ, 0, NULL, 0, 0, NULL);
    assert_int_equal(s_send(&t, 8, "event", s_pack_bin, &good, false, &why), KA_GC_FATAL);
    /* listings: checked against the call's page token and size */
    ka_gc_call_t *l = ka_gc_add(&t, 9, KA_GC_LIST, 0, NULL, 0, 0, NULL);
    l->after = strdup("b");
    l->limit = 2;
    const char *ok[] = {"c", "d", NULL}, *early[] = {"a", NULL}, *many[] = {"c", "d", "e", NULL};
    assert_int_equal(s_send(&t, 9, "entries", s_pack_entries, early, true, &why), KA_GC_FATAL);
    assert_int_equal(s_send(&t, 9, "entries", s_pack_entries, many, true, &why), KA_GC_FATAL);
    /* well ordered, but without "more": malformed */
    assert_int_equal(s_send(&t, 9, "entries", s_pack_entries, ok, true, &why), KA_GC_FATAL);
    ka_gc_call_t *s = ka_gc_add(&t, 10, KA_GC_STAT, 0, NULL, 0, 0, NULL);
    assert_non_null(s);
    assert_int_equal(s_send(&t, 10, "entries", s_pack_entries, ok, true, &why), KA_GC_FATAL);
    while (t.head)
        ka_gc_remove(&t, t.head);
    assert_int_equal(ka_gc_count(&t, KA_GC_WATCH), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_stat_and_page),
        cmocka_unit_test(test_event),
        cmocka_unit_test(test_through_guestcalls),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
