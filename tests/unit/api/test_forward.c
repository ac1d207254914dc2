/* Unit tests for api/forward.c's pure pieces (spec parsing, backoff, status classes) and
 * api/httpc.c's URL parsing and base64. The sender end to end is tested against real receivers in
 * tests/integration/test_forward*.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "api/forward.h"
#include "api/httpc.h"

static void test_parse_spec(void **state)
{
    (void)state;
    char *url, *opts, err[256];
    assert_int_equal(api_forward__parse_spec("http://a:1/w", &url, &opts, err, sizeof(err)), 0);
    assert_string_equal(url, "http://a:1/w");
    assert_string_equal(opts, "");
    free(url);
    free(opts);
    assert_int_equal(api_forward__parse_spec("  http://a/w  name=x\theader=X-A:b  ", &url, &opts, err, sizeof(err)), 0);
    assert_string_equal(url, "http://a/w");
    assert_string_equal(opts, "name=x\nheader=X-A:b");
    free(url);
    free(opts);
    assert_int_equal(api_forward__parse_spec("http://a/w novalue", &url, &opts, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "novalue"));
    assert_null(url);
    assert_int_equal(api_forward__parse_spec("   ", &url, &opts, err, sizeof(err)), -1);
}

static void test_backoff_doubles_and_caps(void **state)
{
    (void)state;
    assert_int_equal(api_forward__backoff_ms(30, 5000, 0), 30);
    assert_int_equal(api_forward__backoff_ms(30, 5000, 1), 60);
    assert_int_equal(api_forward__backoff_ms(30, 5000, 4), 480);
    assert_int_equal(api_forward__backoff_ms(30, 5000, 8), 5000);
    assert_int_equal(api_forward__backoff_ms(30, 5000, 4000000000u), 5000); /* no overflow */
}

static void test_classify(void **state)
{
    (void)state;
    assert_int_equal(api_forward__classify(200, false), 0);
    assert_int_equal(api_forward__classify(204, false), 0);
    assert_int_equal(api_forward__classify(400, true), -1);
    assert_int_equal(api_forward__classify(404, true), -1);
    assert_int_equal(api_forward__classify(429, false), -1);
    assert_int_equal(api_forward__classify(429, true), 1);
    assert_int_equal(api_forward__classify(500, false), 1);
    assert_int_equal(api_forward__classify(503, false), 1);
    assert_int_equal(api_forward__classify(302, false), -1);
}

static void test_url_parse(void **state)
{
    (void)state;
    httpc_url_t u;
    char err[256];
    assert_int_equal(httpc_url_parse("http://vm.example:8480/insert/0/prometheus/api/v1/write?x=1", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "vm.example");
    assert_string_equal(u.port, "8480");
    assert_string_equal(u.path, "/insert/0/prometheus/api/v1/write?x=1");
    assert_string_equal(u.hostport, "vm.example:8480");
    assert_int_equal(httpc_url_parse("http://h", &u, err, sizeof(err)), 0);
    assert_string_equal(u.port, "80");
    assert_string_equal(u.path, "/");
    assert_int_equal(httpc_url_parse("http://[::1]:9090/api/v1/write", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.port, "9090");
    assert_int_equal(httpc_url_parse("https://h/w", &u, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "https"));
    assert_int_equal(httpc_url_parse("ftp://h/w", &u, err, sizeof(err)), -1);
    assert_int_equal(httpc_url_parse("http://h:x/w", &u, err, sizeof(err)), -1);
    assert_int_equal(httpc_url_parse("http:///w", &u, err, sizeof(err)), -1);
}

static void test_base64(void **state)
{
    (void)state;
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar", "u:s3cret"};
    const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy", "dTpzM2NyZXQ="};
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        buf_t b = BUF_INIT;
        buf_puts(&b, "");
        httpc_base64(&b, in[i], strlen(in[i]));
        assert_string_equal(b.data, out[i]);
        buf_free(&b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_spec),
        cmocka_unit_test(test_backoff_doubles_and_caps),
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
