/* Unit tests for internal/util/parse.c and the float formatting in internal/util/buf.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/buf.h"
#include "internal/util/parse.h"

static void test_duration(void **state)
{
    int64_t ms;
    assert_int_equal(parse_duration_ms("5m", &ms), 0);
    assert_int_equal(ms, 300000);
    assert_int_equal(parse_duration_ms("1h30m", &ms), 0);
    assert_int_equal(ms, 5400000);
    assert_int_equal(parse_duration_ms("250ms", &ms), 0);
    assert_int_equal(ms, 250);
    assert_int_equal(parse_duration_ms("1m500ms", &ms), 0);
    assert_int_equal(ms, 60500);
    assert_int_equal(parse_duration_ms("2w1d", &ms), 0);
    assert_int_equal(ms, 15LL * 86400000);
    assert_int_equal(parse_duration_ms("0", &ms), 0);
    assert_int_equal(ms, 0);
    assert_int_equal(parse_duration_ms("", &ms), -1);
    assert_int_equal(parse_duration_ms("5", &ms), -1);
    assert_int_equal(parse_duration_ms("m", &ms), -1);
    assert_int_equal(parse_duration_ms("1m1h", &ms), -1); /* out of order */
    assert_int_equal(parse_duration_ms("1h1h", &ms), -1);
    assert_int_equal(parse_duration_ms("1.5h", &ms), -1);
    assert_int_equal(parse_duration_ms("-1h", &ms), -1);
    assert_int_equal(parse_duration_ms("99999999999999999999y", &ms), -1);
    assert_int_equal(parse_duration_or_seconds_ms("1.5", &ms), 0);
    assert_int_equal(ms, 1500);
    assert_int_equal(parse_duration_or_seconds_ms("30s", &ms), 0);
    assert_int_equal(ms, 30000);
    char out[32];
    format_duration_ms(5400000, out, sizeof(out));
    assert_string_equal(out, "1h30m");
    format_duration_ms(0, out, sizeof(out));
    assert_string_equal(out, "0s");
}

static void test_size(void **state)
{
    uint64_t v;
    assert_int_equal(parse_size_bytes("32MiB", &v), 0);
    assert_int_equal(v, 32u << 20);
    assert_int_equal(parse_size_bytes("64KB", &v), 0);
    assert_int_equal(v, 64000);
    assert_int_equal(parse_size_bytes("1024", &v), 0);
    assert_int_equal(v, 1024);
    assert_int_equal(parse_size_bytes("12XB", &v), -1);
    assert_int_equal(parse_size_bytes("-1", &v), -1);
    assert_int_equal(parse_size_bytes("", &v), -1);
}

static void test_bool_int(void **state)
{
    bool b;
    int64_t i;
    assert_int_equal(parse_bool("true", &b), 0);
    assert_true(b);
    assert_int_equal(parse_bool("0", &b), 0);
    assert_false(b);
    assert_int_equal(parse_bool("maybe", &b), -1);
    assert_int_equal(parse_int64("-42", &i), 0);
    assert_int_equal(i, -42);
    assert_int_equal(parse_int64("42x", &i), -1);
}

static const char *fmt_g(buf_t *b, double v)
{
    buf_reset(b);
    buf_put_float(b, v);
    return b->data;
}

static const char *fmt_json(buf_t *b, double v)
{
    buf_reset(b);
    buf_put_float_json(b, v);
    return b->data;
}

static void test_float_format(void **state)
{
    buf_t b = BUF_INIT;
    /* Go strconv.FormatFloat(v, 'g', -1, 64), as the text exposition format writes values. */
    assert_string_equal(fmt_g(&b, 1), "1");
    assert_string_equal(fmt_g(&b, 0.1), "0.1");
    assert_string_equal(fmt_g(&b, 100000), "100000");
    assert_string_equal(fmt_g(&b, 1e6), "1e+06");
    assert_string_equal(fmt_g(&b, 1234567), "1.234567e+06");
    assert_string_equal(fmt_g(&b, 0.0001), "0.0001");
    assert_string_equal(fmt_g(&b, 0.00001), "1e-05");
    assert_string_equal(fmt_g(&b, -2.5), "-2.5");
    assert_string_equal(fmt_g(&b, NAN), "NaN");
    assert_string_equal(fmt_g(&b, INFINITY), "+Inf");
    assert_string_equal(fmt_g(&b, -INFINITY), "-Inf");
    assert_string_equal(fmt_g(&b, 0), "0");
    /* Prometheus API JSON: 'f' unless |v| < 1e-6 or >= 1e21. */
    assert_string_equal(fmt_json(&b, 1e6), "1000000");
    assert_string_equal(fmt_json(&b, 1234567.5), "1234567.5");
    assert_string_equal(fmt_json(&b, 1e-7), "1e-07");
    assert_string_equal(fmt_json(&b, 1e21), "1e+21");
    assert_string_equal(fmt_json(&b, 0.000001), "0.000001");
    assert_string_equal(fmt_json(&b, 1.0 / 3), "0.3333333333333333");
    assert_string_equal(fmt_json(&b, 123456789012345678.0), "123456789012345680");
    assert_string_equal(fmt_json(&b, 1e20), "100000000000000000000");
    assert_string_equal(fmt_json(&b, -4503599627370497.0), "-4503599627370497");
    buf_free(&b);
}

/* Significant digits of a formatted number: mantissa digits without leading or trailing zeros. */
static int sig_digits(const char *s)
{
    char d[64];
    int n = 0;
    for (; *s && *s != 'e' && n < 63; s++)
        if ((*s >= '1' && *s <= '9') || (*s == '0' && n > 0))
            d[n++] = *s;
    while (n > 0 && d[n - 1] == '0')
        n--;
    return n;
}

static int shortest_reference(double v)
{
    char t[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof(t), "%.*e", p - 1, v);
        if (strtod(t, NULL) == v)
            return p;
    }
    return 17;
}

/* The formatter (floatfmt.cc: double-conversion digits, integers by division) against the definition: the
 * text parses back to v and has no more digits than the shortest %e form that does. */
static void test_float_format_shortest(void **state)
{
    buf_t b = BUF_INIT;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    const char fmts[] = {'g', 'e', 'f'};
    for (int i = 0; i < 30000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double v;
        switch (i % 4) {
        case 0: memcpy(&v, &x, sizeof(v)); break;                                  /* any bit pattern */
        case 1: v = (double)(int64_t)(x >> (x & 63)) * ((x & 64) ? -1 : 1); break; /* integers */
        case 2: v = (double)(x % 100000000) / 1000.0; break;                       /* gauges */
        default: v = (double)(x >> 11) / 9007199254740992.0; break;                /* [0,1) */
        }
        if (!isfinite(v) || v == 0)
            continue;
        char fmt = fmts[i % 3];
        buf_reset(&b);
        buf_put_float_go(&b, v, fmt);
        assert_true(strtod(b.data, NULL) == v);
        assert_int_equal(sig_digits(b.data), shortest_reference(v));
        if (fmt == 'e')
            assert_non_null(strchr(b.data, 'e'));
    }
    buf_free(&b);
}

static void test_json_string(void **state)
{
    buf_t b = BUF_INIT;
    buf_put_json_string(&b, "a\"b\\c\n\x01", 7);
    assert_string_equal(b.data, "\"a\\\"b\\\\c\\n\\u0001\"");
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duration),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_bool_int),
        cmocka_unit_test(test_float_format),
        cmocka_unit_test(test_float_format_shortest),
        cmocka_unit_test(test_json_string),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
