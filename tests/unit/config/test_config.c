/* Unit tests for actors/yaml (ka_yaml) and node/config (ka_config). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "ka_yaml.h"

#define DIGEST "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define GUEST  "sandbox:\n  guestImage:\n    digest: " DIGEST "\n"

static char s_err[KA_CFG_ERR_CAP];

static int s_load(ka_config_t *cfg, const char *yaml)
{
    s_err[0] = '\0';
    return ka_config_load_buffer(cfg, "test.yaml", yaml, strlen(yaml), s_err, sizeof s_err);
}

static void assert_err(const char *yaml, const char *expected)
{
    ka_config_t cfg;
    assert_int_not_equal(s_load(&cfg, yaml), 0);
    if (!strstr(s_err, expected))
        fail_msg("error \"%s\" does not contain \"%s\"", s_err, expected);
}

static void test_yaml_tree_lines(void **unused)
{
    const char *doc = "a: 1\nb:\n  c: \"x\"\n  d: [1, 2]\n";
    ka_yaml_node_t *root;
    char err[KA_YAML_ERR_CAP];
    assert_int_equal(ka_yaml_parse(doc, strlen(doc), &root, err, sizeof err), 0);
    assert_int_equal(root->kind, KA_YAML_MAP);
    assert_int_equal(root->n_children, 2);
    const ka_yaml_node_t *b = ka_yaml_get(root, "b");
    assert_non_null(b);
    assert_int_equal(b->key_line, 2);
    const ka_yaml_node_t *c = ka_yaml_get(b, "c");
    assert_string_equal(c->value, "x");
    assert_true(c->quoted);
    assert_int_equal(c->line, 3);
    assert_int_equal(ka_yaml_get(b, "d")->n_children, 2);
    assert_null(ka_yaml_get(b, "zz"));
    ka_yaml_free(&root);
    assert_null(root);
    ka_yaml_free(&root); /* idempotent */
}

static void test_yaml_refusals(void **unused)
{
    static const struct {
        const char *doc, *want;
    } cases[] = {
        {"a: 1\na: 2\n", "line 2: duplicate key \"a\""},
        {"a: &x 1\nb: *x\n", "anchors and aliases"},
        {"a: [1, 2\n", "invalid YAML"},
        {"a: 1\n---\nb: 2\n", "found several"},
        {"? [1, 2]\n: 3\n", "map keys must be plain scalars"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ka_yaml_node_t *root = NULL;
        char err[KA_YAML_ERR_CAP] = "";
        assert_int_not_equal(
            ka_yaml_parse(cases[i].doc, strlen(cases[i].doc), &root, err, sizeof err), 0);
        assert_null(root);
        if (!strstr(err, cases[i].want))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].want);
    }
}

static void test_yaml_deep_nesting_refused(void **unused)
{
    char doc[4 * KA_YAML_MAX_DEPTH + 16];
    size_t n = 0;
    for (int i = 0; i < KA_YAML_MAX_DEPTH + 2; i++)
        doc[n++] = '[';
    for (int i = 0; i < KA_YAML_MAX_DEPTH + 2; i++)
        doc[n++] = ']';
    ka_yaml_node_t *root = NULL;
    char err[KA_YAML_ERR_CAP];
    assert_int_not_equal(ka_yaml_parse(doc, n, &root, err, sizeof err), 0);
    assert_non_null(strstr(err, "nested too deeply"));
}

static void test_defaults_and_full_document(void **unused)
{
    ka_config_t cfg;
    const char *doc = "node:\n  name: n7\n  id: 7\n  stateDir: /tmp/k\n"
                      "listen: {address: 127.0.0.1, port: 9000}\n"
                      "log: {level: debug, format: json}\n" GUEST
                      "  cpu: 500m\n  memory: 512Mi\n  defaultTTL: 90s\n  maxTTL: 2h\n"
                      "pools:\n  - name: gpu\n    class: namespaces\n    capacity: 5\n"
                      "images:\n  registries:\n    - host: r.example\n      endpoint: "
                      "http://127.0.0.1:5000\n      insecure: true\n"
                      "mcp:\n  allowedHosts: [a.example]\n";
    assert_int_equal(s_load(&cfg, doc), 0);
    assert_string_equal(cfg.node_name, "n7");
    assert_int_equal(cfg.node_id, 7);
    assert_int_equal(cfg.listen_port, 9000);
    assert_int_equal(cfg.log_level, 0);
    assert_true(cfg.log_json);
    assert_int_equal(cfg.cpu_millis, 500);
    assert_int_equal(cfg.memory_bytes, 512LL << 20);
    assert_int_equal(cfg.default_ttl_ms, 90000);
    assert_int_equal(cfg.max_ttl_ms, 7200000);
    assert_int_equal(cfg.n_pools, 1);
    assert_string_equal(cfg.pools[0].name, "gpu");
    assert_int_equal(cfg.pools[0].capacity, 5);
    assert_int_equal(cfg.n_registries, 1);
    assert_true(cfg.registries[0].insecure);
    assert_int_equal(cfg.n_allowed_hosts, 1);
    assert_string_equal(cfg.allowed_hosts[0], "a.example");
    /* untouched keys keep their defaults */
    assert_int_equal(cfg.max_processes, 10);
    assert_int_equal(cfg.spool_bytes, 10LL << 20);
    assert_int_equal(cfg.disk_bytes, 10LL << 30);
    assert_int_equal(cfg.disk_inodes, 0);

    assert_int_equal(s_load(&cfg, GUEST), 0);
    assert_string_equal(cfg.pools[0].name, KA_DEFAULT_POOL);
    assert_int_equal(cfg.listen_port, KA_DEFAULT_PORT);
    assert_int_equal(cfg.default_ttl_ms, 3600000);
}

static void test_unknown_key_names_key_and_line(void **unused)
{
    assert_err(GUEST "listen:\n  prot: 80\n", "test.yaml:5: listen.prot: unknown key");
    assert_err(GUEST "nodes: {}\n", "test.yaml:4: nodes: unknown key");
    assert_err(GUEST "pools:\n  - name: a\n    capacty: 3\n",
               "test.yaml:6: pools[0].capacty: unknown key");
}

static void test_wrong_types_name_key_and_line(void **unused)
{
    assert_err(GUEST "listen:\n  port: eighty\n", "test.yaml:5: listen.port: expected an integer");
    assert_err(GUEST "listen:\n  port: \"80\"\n", "listen.port: expected an integer");
    assert_err(GUEST "listen:\n  port: 70000\n", "listen.port: 70000 is out of range");
    assert_err(GUEST "  memory: lots\n", "test.yaml:4: sandbox.memory: expected a size");
    assert_err(GUEST "  defaultTTL: soon\n", "sandbox.defaultTTL: expected a duration");
    assert_err(GUEST "log:\n  level: loud\n", "log.level: expected debug, info, warn or error");
    assert_err(GUEST "listen: [1]\n", "listen: expected a map, found a list");
    assert_err(GUEST "pools: {name: x}\n", "pools: expected a list, found a map");
    assert_err(GUEST "images:\n  registries:\n    - insecure: maybe\n",
               "images.registries[0].insecure: expected true or false");
}

static void test_validation_rules(void **unused)
{
    assert_err("node: {id: 1}\n", "sandbox.guestImage.digest: required");
    assert_err("sandbox:\n  guestImage:\n    digest: sha256:abc\n",
               "must be sha256:<64 lowercase hex>");
    assert_err(GUEST "  defaultTTL: 2d\n", "sandbox.defaultTTL: must not exceed sandbox.maxTTL");
    assert_err(GUEST "listen: {address: 0.0.0.0}\n", "must be loopback");
    assert_err(GUEST "auth: {mode: tokens}\n", "auth.tokensFile: required");
    assert_err(GUEST "pools:\n  - {name: a}\n  - {name: a}\n", "duplicate pool");
    assert_err(GUEST "pools:\n  - {name: a, class: microvm}\n", "unsupported sandbox class");
    assert_err(GUEST "node: {stateDir: relative/dir}\n", "node.stateDir: must be an absolute path");
    assert_err(GUEST "  disk: 1Mi\n", "sandbox.disk: must be at least 16Mi");
    assert_err(GUEST "  disk: 64Mi\n  diskInodes: 100000\n", "sandbox.diskInodes: must be 0");
    assert_err(GUEST "  uidBase: 4294000000\n  uidCount: 16000000\n", "must stay below 2^32");
    assert_err(GUEST "  uidBase: 1000\n", "sandbox.uidBase");
    assert_err(GUEST "  maxOpenFiles: 2000000\n", "sandbox.maxOpenFiles");
}

static void test_listen_tls(void **unused)
{
    ka_config_t cfg;
    assert_int_equal(s_load(&cfg, GUEST "listen:\n  tls:\n    certFile: /c.pem\n    keyFile: "
                                        "/k.pem\n    clientCAFile: /ca.pem\n"
                                        "    requireClientCert: true\n"),
                     0);
    assert_true(ka_config_tls(&cfg));
    assert_string_equal(cfg.tls_cert_file, "/c.pem");
    assert_string_equal(cfg.tls_key_file, "/k.pem");
    assert_string_equal(cfg.tls_client_ca_file, "/ca.pem");
    assert_true(cfg.tls_require_client_cert);
    assert_int_equal(s_load(&cfg, GUEST), 0);
    assert_false(ka_config_tls(&cfg));
    assert_err(GUEST "listen:\n  tls:\n    certFIle: /c.pem\n",
               "test.yaml:6: listen.tls.certFIle: unknown key");
    assert_err(GUEST "listen:\n  tls:\n    certFile: /c.pem\n", "keyFile is missing");
    assert_err(GUEST "listen:\n  tls:\n    keyFile: /k.pem\n", "certFile is missing");
    assert_err(GUEST "listen:\n  tls:\n    clientCAFile: /ca.pem\n",
               "listen.tls.clientCAFile: needs listen.tls.certFile");
    assert_err(GUEST "listen:\n  tls:\n    certFile: /c\n    keyFile: /k\n"
                     "    requireClientCert: true\n",
               "listen.tls.requireClientCert: needs listen.tls.clientCAFile");
    assert_err(GUEST "listen:\n  tls:\n    requireClientCert: yes\n",
               "listen.tls.requireClientCert: expected true or false");
    /* off loopback: tokens and TLS both required */
    assert_err(GUEST "auth: {mode: tokens, tokensFile: /t}\nlisten: {address: 0.0.0.0}\n",
               "listen.tls: required when listen.address (0.0.0.0) is not loopback");
    assert_err(GUEST "listen:\n  address: 10.0.0.5\n  tls: {certFile: /c, keyFile: /k}\n",
               "user-header trusts any caller");
    assert_int_equal(s_load(&cfg, GUEST "auth: {mode: tokens, tokensFile: /t}\nlisten:\n  "
                                        "address: 0.0.0.0\n  tls: {certFile: /c, keyFile: /k}\n"),
                     0);
}

static void test_loopback(void **unused)
{
    const char *yes[] = {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "localhost"};
    const char *no[] = {"0.0.0.0", "10.0.0.1", "::", "::ffff:10.0.0.1", "128.0.0.1", "local"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        assert_true(ka_config_loopback(yes[i]));
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_false(ka_config_loopback(no[i]));
}

static void test_value_parsers(void **unused)
{
    int64_t v;
    assert_int_equal(ka_parse_duration_ms("1h30m", &v), 0);
    assert_int_equal(v, 5400000);
    assert_int_equal(ka_parse_duration_ms("250ms", &v), 0);
    assert_int_equal(v, 250);
    assert_int_equal(ka_parse_duration_ms("1.5s", &v), 0);
    assert_int_equal(v, 1500);
    assert_int_not_equal(ka_parse_duration_ms("10", &v), 0);
    assert_int_not_equal(ka_parse_duration_ms("-1s", &v), 0);
    assert_int_not_equal(ka_parse_duration_ms("1hh", &v), 0);
    assert_int_equal(ka_parse_bytes("1Gi", &v), 0);
    assert_int_equal(v, 1LL << 30);
    assert_int_equal(ka_parse_bytes("10M", &v), 0);
    assert_int_equal(v, 10000000);
    assert_int_equal(ka_parse_bytes("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_not_equal(ka_parse_bytes("4096X", &v), 0);
    assert_int_not_equal(ka_parse_bytes("", &v), 0);
    assert_int_equal(ka_parse_cpu_millis("0.5", &v), 0);
    assert_int_equal(v, 500);
    assert_int_equal(ka_parse_cpu_millis("250m", &v), 0);
    assert_int_equal(v, 250);
    assert_int_not_equal(ka_parse_cpu_millis("2 cores", &v), 0);
}

static void test_print_round_trips(void **unused)
{
    ka_config_t a, b;
    assert_int_equal(s_load(&a, GUEST "  defaultTTL: 90s\npools:\n  - {name: p1, capacity: 3}\n"),
                     0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ka_config_print(&a, f);
    fclose(f);
    if (ka_config_load_buffer(&b, "printed", buf, len, s_err, sizeof s_err))
        fail_msg("printed config does not load: %s\n%s", s_err, buf);
    assert_memory_equal(&a, &b, sizeof a);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yaml_tree_lines),
        cmocka_unit_test(test_yaml_refusals),
        cmocka_unit_test(test_yaml_deep_nesting_refused),
        cmocka_unit_test(test_defaults_and_full_document),
        cmocka_unit_test(test_unknown_key_names_key_and_line),
        cmocka_unit_test(test_wrong_types_name_key_and_line),
        cmocka_unit_test(test_validation_rules),
        cmocka_unit_test(test_listen_tls),
        cmocka_unit_test(test_loopback),
        cmocka_unit_test(test_value_parsers),
        cmocka_unit_test(test_print_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
