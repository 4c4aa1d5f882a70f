/* Unit tests for bridges/auth: both modes, the tokens file format, refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"

/* sha256("s3cret-token") */
#define TOKEN      "s3cret-token"
#define TOKEN_HASH "8d6e2d4c2b4ed7c4e0c4a7e8d4c87fb8bb6b9f0f4e9ea80b5f7c8a8be67e0f53"

static char s_path[64];

static void s_write(const char *text)
{
    snprintf(s_path, sizeof s_path, "/tmp/kb-auth-XXXXXX");
    int fd = mkstemp(s_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void test_user_header_mode(void **unused)
{
    kb_auth_t *a = kb_auth_new(KB_AUTH_USER_HEADER, NULL, NULL, NULL, 0);
    char id[KB_AUTH_ID_MAX + 1];
    assert_int_equal(kb_auth_identify(a, NULL, "alice@example.com", id, sizeof id), 0);
    assert_string_equal(id, "alice@example.com");
    assert_int_equal(kb_auth_identify(a, NULL, NULL, id, sizeof id), -EACCES);
    assert_non_null(strstr(id, "identity required"));
    assert_int_equal(kb_auth_identify(a, NULL, "", id, sizeof id), -EACCES);
    assert_int_equal(kb_auth_identify(a, NULL, "has space", id, sizeof id), -EACCES);
    kb_auth_destroy(&a);
    assert_null(a);
}

/* The test computes the hash itself, so the fixture cannot drift from the code. */
static void s_hash_hex(const char *s, char out[65])
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "printf %%s '%s' | sha256sum", s);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(out, 65, p));
    pclose(p);
}

static void test_tokens_mode(void **unused)
{
    char hash[65], file[256];
    s_hash_hex(TOKEN, hash);
    snprintf(file, sizeof file, "# tokens\n\n%s  alice@example.com\n", hash);
    s_write(file);
    int err = 0;
    char why[256];
    kb_auth_t *a = kb_auth_new(KB_AUTH_TOKENS, s_path, &err, why, sizeof why);
    assert_non_null(a);
    char id[KB_AUTH_ID_MAX + 1];
    assert_int_equal(kb_auth_identify(a, "Bearer " TOKEN, NULL, id, sizeof id), 0);
    assert_string_equal(id, "alice@example.com");
    /* the user header grants nothing in tokens mode */
    assert_int_equal(kb_auth_identify(a, NULL, "alice@example.com", id, sizeof id), -EACCES);
    assert_non_null(strstr(id, "authentication required"));
    assert_int_equal(kb_auth_identify(a, "Bearer wrong", NULL, id, sizeof id), -EACCES);
    assert_string_equal(id, "invalid bearer token");
    assert_int_equal(kb_auth_identify(a, "Basic abc", NULL, id, sizeof id), -EACCES);
    assert_int_equal(kb_auth_identify(a, "Bearer " TOKEN_HASH, NULL, id, sizeof id), -EACCES);
    kb_auth_destroy(&a);
    unlink(s_path);
}

static void test_bad_tokens_file(void **unused)
{
    s_write("not-a-hash alice\n");
    int err = 0;
    char why[256];
    assert_null(kb_auth_new(KB_AUTH_TOKENS, s_path, &err, why, sizeof why));
    assert_int_equal(err, -EINVAL);
    assert_non_null(strstr(why, ":1: expected"));
    unlink(s_path);
    assert_null(kb_auth_new(KB_AUTH_TOKENS, "/nonexistent/tokens", &err, why, sizeof why));
    assert_int_equal(err, -ENOENT);
    assert_null(kb_auth_new(KB_AUTH_TOKENS, NULL, &err, NULL, 0));
}

static void test_operators(void **state)
{
    kb_auth_t *a = kb_auth_new(KB_AUTH_USER_HEADER, NULL, NULL, NULL, 0);
    assert_non_null(a);
    assert_false(kb_auth_is_operator(a, "ops@example.com")); /* none by default */
    const char *ops[] = {"ops@example.com", "root@example.com"};
    assert_int_equal(kb_auth_set_operators(a, ops, 2), 0);
    assert_true(kb_auth_is_operator(a, "ops@example.com"));
    assert_true(kb_auth_is_operator(a, "root@example.com"));
    assert_false(kb_auth_is_operator(a, "OPS@example.com")); /* identities are exact */
    assert_false(kb_auth_is_operator(a, "ops@example.co"));
    assert_false(kb_auth_is_operator(a, NULL));
    assert_int_equal(kb_auth_set_operators(a, ops + 1, 1), 0); /* replaces the list */
    assert_false(kb_auth_is_operator(a, "ops@example.com"));
    assert_int_equal(kb_auth_set_operators(a, NULL, 0), 0);
    assert_false(kb_auth_is_operator(a, "root@example.com"));
    kb_auth_destroy(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_header_mode),
        cmocka_unit_test(test_tokens_mode),
        cmocka_unit_test(test_bad_tokens_file),
        cmocka_unit_test(test_operators),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
