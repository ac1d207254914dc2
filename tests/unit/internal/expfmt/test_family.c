/*
 * Unit tests for the number conversion paths of internal/expfmt/family.c (expfmt__parse_float):
 * every path (Clinger's fast path, the exact 128-bit path, strtod) must give the correctly
 * rounded double, which glibc's strtod is taken as the reference for (it rounds correctly, as
 * Go's ParseFloat does). test_text_parse.c covers syntax and the other helpers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/expfmt/family.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void check(const char *s)
{
    double v, want = strtod(s, NULL);
    if (expfmt__parse_float(s, strlen(s), &v) != 0)
        fail_msg("%s rejected", s);
    uint64_t a, b;
    memcpy(&a, &v, 8);
    memcpy(&b, &want, 8);
    if (a != b)
        fail_msg("%s -> %.17g (%016llx), strtod %.17g (%016llx)", s, v, (unsigned long long)a, want,
                 (unsigned long long)b);
}

/* Random 1..19-digit mantissas with a decimal point anywhere and exponents around the exact
 * path's |e| <= 19 window (and past it, where strtod takes over). */
static void test_random_decimals(void **state)
{
    (void)state;
    char s[96];
    for (int i = 0; i < 400000; i++) {
        int nd = 1 + (int)(rnd() % 19);
        char digits[24];
        for (int k = 0; k < nd; k++)
            digits[k] = (char)('0' + rnd() % 10);
        if (digits[0] == '0')
            digits[0] = '1';
        int dot = (int)(rnd() % (unsigned)(nd + 1));
        int n = 0;
        if (rnd() & 1)
            s[n++] = '-';
        for (int k = 0; k < nd; k++) {
            if (k == dot)
                s[n++] = '.';
            s[n++] = digits[k];
        }
        int r = (int)(rnd() % 4);
        if (r == 0)
            n += snprintf(s + n, sizeof(s) - (size_t)n, "E%d", (int)(rnd() % 61) - 30);
        else if (r == 1)
            n += snprintf(s + n, sizeof(s) - (size_t)n, "e%d", (int)(rnd() % 21) - 10);
        s[n] = 0;
        check(s);
    }
}

/* Java's Double.toString of random doubles (shortest round-trip digits, 16-17 of them), which is
 * what Flink pushes; %.17g and %.16g renderings as well. */
static void test_round_trip(void **state)
{
    (void)state;
    char s[64];
    for (int i = 0; i < 300000; i++) {
        uint64_t bits = rnd();
        double d;
        memcpy(&d, &bits, 8);
        if (!isfinite(d))
            continue;
        snprintf(s, sizeof(s), "%.17g", d);
        check(s);
        snprintf(s, sizeof(s), "%.16g", d);
        check(s);
        /* values of a realistic size: [1e-6, 1e12) */
        double u = (double)(rnd() >> 11) / 9007199254740992.0;
        double v = pow(10, -6 + 18 * u) * (1 + u);
        snprintf(s, sizeof(s), "%.17g", v);
        check(s);
        snprintf(s, sizeof(s), "%.15g", v);
        check(s);
        double back;
        assert_int_equal(expfmt__parse_float(s, strlen(s), &back), 0);
    }
}

/* Exact halfway cases between two doubles: the tie must go to the even mantissa, and one more
 * digit past the tie must round up. */
static void test_ties(void **state)
{
    (void)state;
    static const char *const cases[] = {
        "9007199254740993", /* 2^53 + 1: tie, stays 2^53 */
        "9007199254740995", /* tie, goes up to 2^53 + 4 */
        "9007199254740993.000000001",
        "18014398509481986",
        "18014398509481990",
        "18446744073709551615", /* 2^64 - 1 (20 digits: strtod path) */
        "1844674407370955161.5",
        "0.30000000000000004",
        "0.1",
        "0.2",
        "0.3",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "5e-324",
        "123456789012345678e-19",
        "1234567890123456789e-19",
        "9999999999999999999e-19",
        "9999999999999999999e19",
        "1000000000000000000e19",
        "4.35679e-10",
        "0.000000000000000000123",
        "93.53937673408831",
        "177.0566773895243",
        "3.917977798E9",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check(cases[i]);
    /* every double of the form (2k+1) * 2^j / 2 near 2^53..2^64, printed exactly */
    char s[64];
    for (int j = 0; j < 11; j++)
        for (int k = 0; k < 2000; k++) {
            uint64_t base = (UINT64_C(1) << (53 + j)) + ((uint64_t)k << (j + 1));
            uint64_t tie = base + (UINT64_C(1) << j); /* halfway to the next double */
            snprintf(s, sizeof(s), "%llu", (unsigned long long)tie);
            check(s);
            snprintf(s, sizeof(s), "%llu.5", (unsigned long long)(tie - 1));
            check(s);
            snprintf(s, sizeof(s), "%llue-5", (unsigned long long)tie);
            check(s);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_decimals),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_ties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
