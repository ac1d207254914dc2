/* Unit tests for api/forward.c's pure pieces (spec parsing, backoff, status classes). Its HTTP
 * client is tested in tests/unit/internal/net/test_httpc.c; the sender end to end against real
 * receivers in tests/integration/test_forward*.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "api/forward.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_spec),
        cmocka_unit_test(test_backoff_doubles_and_caps),
        cmocka_unit_test(test_classify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
