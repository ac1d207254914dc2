/* api/webconfig: parsing of --web.config.file and the bcrypt basic-auth check. The hashes were made
 * with python3-bcrypt (another implementation than the libxcrypt one sluice uses). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/webconfig.h"
#include "internal/net/httpc.h"

/* "secret" at cost 4 ($2b$, and the same hash spelled $2y$ as htpasswd writes it) */
#define HASH_2B "$2b$04$2tnOaqYuMh7cdJ4xnF9SHuWxyfcCntgsMoD5dhLalr2zjwCKoEI8S"
#define HASH_2Y "$2y$04$2tnOaqYuMh7cdJ4xnF9SHuWxyfcCntgsMoD5dhLalr2zjwCKoEI8S"

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/sluice-webconfig-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static api_webconfig_t *load(const char *text, char *err, size_t errlen)
{
    char *p = write_tmp(text);
    api_webconfig_t *wc = api_webconfig_load(p, err, errlen);
    unlink(p);
    return wc;
}

static char *basic(const char *cred)
{
    static char h[256];
    buf_t b = BUF_INIT;
    buf_puts(&b, "Basic ");
    httpc_base64(&b, cred, strlen(cred));
    snprintf(h, sizeof(h), "%s", b.data);
    buf_free(&b);
    return h;
}

static void test_basic_auth(void **state)
{
    (void)state;
    char err[512] = "";
    api_webconfig_t *wc = load("basic_auth_users:\n  alice: '" HASH_2B "'\n  bob: '" HASH_2Y "'\n", err, sizeof(err));
    assert_non_null(wc);
    assert_null(api_webconfig_tls(wc));
    assert_true(api_webconfig_has_users(wc));
    for (int round = 0; round < 2; round++) { /* the second round answers from the cache */
        assert_true(api_webconfig_check_basic(wc, basic("alice:secret")));
        assert_true(api_webconfig_check_basic(wc, basic("bob:secret")));
    }
    assert_false(api_webconfig_check_basic(wc, basic("alice:Secret")));
    assert_false(api_webconfig_check_basic(wc, basic("alice:secret2")));
    assert_false(api_webconfig_check_basic(wc, basic("carol:secret")));
    assert_false(api_webconfig_check_basic(wc, basic("alice")));
    assert_false(api_webconfig_check_basic(wc, basic(":secret")));
    assert_false(api_webconfig_check_basic(wc, NULL));
    assert_false(api_webconfig_check_basic(wc, "Bearer abc"));
    assert_false(api_webconfig_check_basic(wc, "Basic !!!"));
    assert_true(api_webconfig_check_basic(wc, "basic YWxpY2U6c2VjcmV0")); /* scheme is case-insensitive */
    char big[3000];
    memset(big, 'A', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    memcpy(big, "Basic ", 6);
    assert_false(api_webconfig_check_basic(wc, big)); /* longer than any credentials we keep */
    api_webconfig_unref(wc);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"basic_auth_users:\n  alice: plain\n", "not a bcrypt hash"},
        {"basic_auth_users:\n  alice: '$1$abc$def'\n", "not a bcrypt hash"},
        {"basic_auth_users: [a]\n", "must be a mapping"},
        {"tls_server_config:\n  cert_file: a.crt\n", "missing key_file"},
        {"tls_server_config:\n  client_auth_type: Sometimes\n", "invalid client_auth_type"},
        {"tls_server_config:\n  min_version: TLS14\n", "unknown TLS version"},
        {"tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "not supported"},
        {"tls_server_config:\n  client_ca_file: ca.crt\n", "need TLS"},
        {"tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
         "cannot load server certificate /nonexistent.crt"},
        {"http_server_config:\n  headers: {X: y}\n", "not supported"},
        {"foo: 1\n", "unknown or repeated key foo"},
        {"tls_server_config: {\n", "line"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[512] = "";
        api_webconfig_t *wc = load(cases[i].text, err, sizeof(err));
        if (wc || !strstr(err, cases[i].msg))
            fail_msg("case %zu: %s -> %s", i, cases[i].text, err);
    }
    /* empty file, empty sections and the accepted no-op keys: plain HTTP, no auth */
    char err[512] = "";
    api_webconfig_t *wc = load("tls_server_config:\n  prefer_server_cipher_suites: true\nhttp_server_config:\n  "
                               "http2: false\nbasic_auth_users:\n",
                               err, sizeof(err));
    assert_non_null(wc);
    assert_null(api_webconfig_tls(wc));
    assert_false(api_webconfig_has_users(wc));
    assert_true(api_webconfig_check_basic(wc, NULL));
    api_webconfig_unref(wc);
    wc = load("", err, sizeof(err));
    assert_non_null(wc);
    api_webconfig_unref(wc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_auth),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
