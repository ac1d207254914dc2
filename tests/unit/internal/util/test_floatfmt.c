/*
 * floatfmt: the double-conversion formatter against the printf/strtod one it replaced
 * (floatfmt_reference.h, the old code kept verbatim), over millions of random bit patterns and
 * the edge values, in every layout sluice uses ('e', 'f', 'g' and the JSON API's f-or-e rule).
 * The outputs must be byte-identical, with one known, counted exception: 46 powers of two where
 * the old search wrote 17 digits and Go (and now sluice) writes a shorter one (floatfmt.cc says
 * why). Pinned strings are Go's strconv.FormatFloat(v, fmt, -1, 64) outputs.
 *
 * SLUICE_FLOATFMT_RANDOM sets the number of random bit patterns (default 1,000,000: about 15 s of
 * CPU under ASan; `SLUICE_FLOATFMT_RANDOM=20000000` for a longer run).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "floatfmt_reference.h"
#include "internal/util/buf.h"
#include "internal/util/floatfmt.h"

static const char LAYOUTS[] = {'e', 'f', 'g', 'j'}; /* 'j': buf_put_float_json's choice */

static double from_bits(uint64_t x)
{
    double v;
    memcpy(&v, &x, sizeof(v));
    return v;
}

static uint64_t to_bits(double v)
{
    uint64_t x;
    memcpy(&x, &v, sizeof(x));
    return x;
}

static char json_layout(double v)
{
    double a = fabs(v);
    return (a != 0 && (a < 1e-6 || a >= 1e21)) ? 'e' : 'f';
}

/* The new formatter through the buf_t entry points callers use. */
static const char *fmt_new(buf_t *b, double v, char layout)
{
    buf_reset(b);
    if (layout == 'j')
        buf_put_float_json(b, v);
    else if (layout == 'g')
        buf_put_float(b, v);
    else
        buf_put_float_go(b, v, layout);
    assert_int_equal(strlen(b->data), b->len);
    return b->data;
}

static const char *fmt_old(ref_out_t *o, double v, char layout)
{
    ref_float_go(o, v, layout == 'j' ? json_layout(v) : layout);
    return o->s;
}

static int sig_digits(const char *s)
{
    int n = 0, pending = 0;
    bool started = false;
    for (; *s && *s != 'e'; s++) {
        if (*s < '0' || *s > '9')
            continue;
        if (*s != '0')
            started = true, n += pending + 1, pending = 0;
        else if (started)
            pending++;
    }
    return n;
}

/* Compares one value in every layout. Returns the number of layouts where the outputs differ;
 * a difference is only allowed for a power of two, where the new text must parse back to v and
 * be shorter than the old. */
static int compare_value(buf_t *b, ref_out_t *o, double v)
{
    int diffs = 0;
    for (size_t i = 0; i < sizeof(LAYOUTS); i++) {
        const char *n = fmt_new(b, v, LAYOUTS[i]);
        if (v == 0 && LAYOUTS[i] == 'e') {
            /* the old code wrote "0"; Go (and so Prometheus' alert values) writes 0e+00 */
            assert_string_equal(n, signbit(v) ? "-0e+00" : "0e+00");
            continue;
        }
        const char *r = fmt_old(o, v, LAYOUTS[i]);
        if (strcmp(n, r) == 0)
            continue;
        uint64_t x = to_bits(v);
        if ((x & ((1ull << 52) - 1)) != 0 || ((x >> 52) & 0x7ff) <= 1) {
            print_error("%a in layout %c: new \"%s\", old \"%s\"\n", v, LAYOUTS[i], n, r);
            fail();
        }
        assert_true(strtod(n, NULL) == v);
        assert_true(sig_digits(n) < sig_digits(r));
        diffs++;
    }
    return diffs;
}

static void test_random_bit_patterns(void **state)
{
    long count = 1000000;
    const char *env = getenv("SLUICE_FLOATFMT_RANDOM");
    if (env)
        count = atol(env);
    buf_t b = BUF_INIT;
    ref_out_t o;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (long i = 0; i < count; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double v = from_bits(x);
        switch (i & 7) {
        case 0: v = (double)(int64_t)(x >> (x & 63)); break;     /* integers, any size */
        case 1: v = (double)(x % 100000000) / 1000.0; break;     /* gauges with 3 decimals */
        case 2: v = from_bits(x & 0x800fffffffffffffull); break; /* subnormals */
        default: break;                                          /* any bit pattern */
        }
        assert_int_equal(compare_value(&b, &o, v), 0);
    }
    buf_free(&b);
}

/* Every power of two and its neighbours, both signs; the subnormal range's ends; powers of ten
 * and their neighbours; the layout switches (1e-6 and 1e21 for JSON, 1e-4 and 1e6 for 'g'); the
 * integers around 2^53; zeros, infinities and NaNs with any payload. */
static void test_edge_values(void **state)
{
    buf_t b = BUF_INIT;
    ref_out_t o;
    int diffs = 0, powers = 0;
    for (int k = -1074; k <= 1023; k++) {
        double p = ldexp(1.0, k);
        for (int s = 0; s < 2; s++) {
            double v = s ? -p : p;
            int d = compare_value(&b, &o, v);
            diffs += d;
            powers += d > 0;
            compare_value(&b, &o, nextafter(v, 0));
            compare_value(&b, &o, nextafter(v, s ? -INFINITY : INFINITY));
        }
    }
    /* The old search's misses: 46 magnitudes, each with both signs, in all 4 layouts. */
    assert_int_equal(powers, 92);
    assert_int_equal(diffs, 92 * 4);
    for (int k = -324; k <= 308; k++) {
        char ten[16];
        snprintf(ten, sizeof(ten), "1e%d", k);
        double t = strtod(ten, NULL);
        double vs[] = {t, nextafter(t, 0), nextafter(t, INFINITY), 5 * t, 0.5 * t, 3 * t};
        for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++)
            assert_int_equal(compare_value(&b, &o, vs[i]) + compare_value(&b, &o, -vs[i]), 0);
    }
    for (int64_t i = -2000; i <= 2000; i++) {
        double vs[] = {9007199254740992.0 + (double)i * 2, 9007199254740992.0 - (double)i, 1e6 + (double)i,
                       999999.5 + (double)i / 8,           1e21 + (double)i * 131072,      (double)i / 1000.0};
        for (size_t j = 0; j < sizeof(vs) / sizeof(vs[0]); j++)
            assert_int_equal(compare_value(&b, &o, vs[j]) + compare_value(&b, &o, -vs[j]), 0);
    }
    double specials[] = {0.0,
                         -0.0,
                         INFINITY,
                         -INFINITY,
                         NAN,
                         -NAN,
                         DBL_MIN,
                         DBL_MAX,
                         DBL_TRUE_MIN,
                         from_bits(0x000fffffffffffffull),
                         from_bits(0x7ff0000000000001ull),
                         from_bits(0xfff8000000000123ull),
                         1e-6,
                         1e21,
                         1e-4,
                         1e-5,
                         0.1,
                         0.2,
                         0.3};
    for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++)
        assert_int_equal(compare_value(&b, &o, specials[i]) + compare_value(&b, &o, -specials[i]), 0);
    buf_free(&b);
}

/* Exact halfway values: quarters and eighths near 2^50 and 2^49 (1125899906842624.25 has the
 * shortest candidates ...624.2 and ...624.3 at the same distance). Go takes the even digit, as did
 * printf's correctly rounded %e. */
static void test_ties(void **state)
{
    buf_t b = BUF_INIT;
    ref_out_t o;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double v = ldexp((double)((x >> 11) | (1ull << 52)), -1 - i % 6);
        assert_int_equal(compare_value(&b, &o, v), 0);
    }
    assert_string_equal(fmt_new(&b, 1125899906842624.25, 'f'), "1125899906842624.2");
    assert_string_equal(fmt_new(&b, 1125899906842624.75, 'f'), "1125899906842624.8");
    assert_string_equal(fmt_new(&b, 562949953421312.125, 'f'), "562949953421312.1");
    buf_free(&b);
}

/* Go's strconv.FormatFloat(v, fmt, -1, 64), including where the old search was not Go. */
static void test_go_outputs(void **state)
{
    buf_t b = BUF_INIT;
    assert_string_equal(fmt_new(&b, ldexp(1, -1017), 'e'), "7.120236347223045e-307"); /* old: ...0444 */
    /* Not a tie: ...062 is as far below 2^-24 as ...063 is above, but the gap below a power of two
     * is half as wide, so only ...063 parses back. */
    assert_string_equal(fmt_new(&b, ldexp(1, -24), 'e'), "5.960464477539063e-08");
    assert_string_equal(fmt_new(&b, DBL_TRUE_MIN, 'e'), "5e-324");
    assert_string_equal(fmt_new(&b, DBL_TRUE_MIN, 'g'), "5e-324");
    assert_string_equal(fmt_new(&b, -DBL_MAX, 'g'), "-1.7976931348623157e+308");
    assert_string_equal(fmt_new(&b, DBL_MIN, 'e'), "2.2250738585072014e-308");
    assert_string_equal(fmt_new(&b, 1e23, 'f'), "100000000000000000000000");
    assert_string_equal(fmt_new(&b, 1e23, 'g'), "1e+23");
    assert_string_equal(fmt_new(&b, 1e21, 'j'), "1e+21");
    assert_string_equal(fmt_new(&b, 999999999999999900000.0, 'j'), "999999999999999900000");
    assert_string_equal(fmt_new(&b, 1e-6, 'j'), "0.000001");
    assert_string_equal(fmt_new(&b, 9.99e-7, 'j'), "9.99e-07");
    assert_string_equal(fmt_new(&b, 123456.7, 'g'), "123456.7");
    assert_string_equal(fmt_new(&b, 1234567.5, 'g'), "1.2345675e+06");
    assert_string_equal(fmt_new(&b, 0.0001, 'g'), "0.0001");
    assert_string_equal(fmt_new(&b, 0.00012, 'g'), "0.00012");
    assert_string_equal(fmt_new(&b, 0.00001, 'g'), "1e-05");
    assert_string_equal(fmt_new(&b, 1e100, 'e'), "1e+100");
    assert_string_equal(fmt_new(&b, -1.5, 'e'), "-1.5e+00");
    assert_string_equal(fmt_new(&b, 12, 'e'), "1.2e+01");
    assert_string_equal(fmt_new(&b, -0.0, 'f'), "-0");
    assert_string_equal(fmt_new(&b, -0.0, 'g'), "-0");
    assert_string_equal(fmt_new(&b, NAN, 'j'), "NaN");
    assert_string_equal(fmt_new(&b, -NAN, 'g'), "NaN");
    assert_string_equal(fmt_new(&b, INFINITY, 'j'), "+Inf");
    assert_string_equal(fmt_new(&b, -INFINITY, 'e'), "-Inf");
    /* Go's 'e' of a zero (Prometheus' alert values). */
    assert_string_equal(fmt_new(&b, 0.0, 'e'), "0e+00");
    assert_string_equal(fmt_new(&b, -0.0, 'e'), "-0e+00");
    /* 'f' of the smallest subnormal: "0." and 323 zeros and "5". */
    const char *s = fmt_new(&b, -DBL_TRUE_MIN, 'f');
    assert_int_equal(strlen(s), 327);
    assert_memory_equal(s, "-0.000", 6);
    assert_string_equal(s + 325, "05");
    /* 'f' of the largest double: 17 digits and 292 zeros. */
    s = fmt_new(&b, DBL_MAX, 'f');
    assert_int_equal(strlen(s), 309);
    assert_memory_equal(s, "17976931348623157000", 20);
    buf_free(&b);
}

/* Appending keeps what the buffer held, and the NUL after it. */
static void test_appends(void **state)
{
    buf_t b = BUF_INIT;
    buf_puts(&b, "x=");
    buf_put_float_json(&b, 0.25);
    buf_putc(&b, ',');
    buf_put_float(&b, 1e6);
    buf_putc(&b, ',');
    buf_put_float_go(&b, -DBL_TRUE_MIN, 'f');
    assert_int_equal(b.len, strlen(b.data));
    assert_memory_equal(b.data, "x=0.25,1e+06,-0.0000", 20);
    char direct[FLOATFMT_MAX];
    assert_int_equal(floatfmt_go(direct, 0.1, 'f'), 3);
    assert_string_equal(direct, "0.1");
    char digits[18];
    int point;
    assert_int_equal(floatfmt_shortest(-1234.5, digits, &point), 5);
    assert_string_equal(digits, "12345");
    assert_int_equal(point, 4);
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_go_outputs),
        cmocka_unit_test(test_appends),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_edge_values),
        cmocka_unit_test(test_random_bit_patterns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
