/*
 * floatfmt — the C shim over double-conversion behind internal/util/floatfmt.h, and the three Go
 * layouts on top of its digits (the header says what the output is).
 *
 * Why a library and not printf: the old way found the shortest digits by formatting with %.*e
 * and parsing back with strtod for several precisions per value (a binary search over 1..17),
 * 3-4 us per value; double-conversion's SHORTEST mode gives them in one pass (0.1-0.25 us,
 * bench/floatfmt_bench.c) and needs no locale.
 *
 * The two places where shortest-digit algorithms differ, and where this one stands (Go's side):
 *   - ties: v exactly halfway between the two closest shortest candidates (1125899906842624.25:
 *     .2 and .3 both parse back). Go rounds to the even digit, and so does double-conversion in
 *     practice, whatever its header says about "farther away from 0": test_floatfmt_go.py
 *     checks thousands of such values against Python's repr (David Gay's dtoa, which picks the
 *     digits Go picks), and test_floatfmt.c pins some of them.
 *   - powers of two, where the gap below v is half the gap above: both use the true, uneven
 *     bounds. The old printf search did not: for 46 powers of two it wrote 17 digits where a
 *     shorter string parses back (2^-1017: Go 7.120236347223045e-307); those now come out as Go's.
 * Nothing here allocates or throws.
 */
#include "internal/util/floatfmt.h"

#include <double-conversion/double-to-string.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>

using double_conversion::DoubleToStringConverter;

/* Integers below 2^53 (counters, most Flink gauges): their own digits are the shortest (neighbouring
 * doubles are at most 1 apart, so no other integer, the only shorter kind of decimal, parses back),
 * and a division loop is cheaper than double-conversion. Returns 0 for any other value. */
static int float_integral_digits(double a, char *digits, int *point)
{
    if (!(a >= 1.0 && a < 9007199254740992.0) || a != (double)(uint64_t)a)
        return 0;
    char tmp[20];
    int len = 0;
    uint64_t u = (uint64_t)a;
    do
        tmp[len++] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    int zeros = 0;
    while (tmp[zeros] == '0')
        zeros++;
    int n = len - zeros;
    for (int i = 0; i < n; i++)
        digits[i] = tmp[len - 1 - i];
    digits[n] = '\0';
    *point = len;
    return n;
}

int floatfmt_shortest(double v, char *digits, int *point)
{
    assert(std::isfinite(v) && v != 0);
    int n = float_integral_digits(std::fabs(v), digits, point);
    if (n > 0)
        return n;
    bool sign;
    DoubleToStringConverter::DoubleToAscii(v, DoubleToStringConverter::SHORTEST, 0, digits,
                                           DoubleToStringConverter::kBase10MaximalLength + 1, &sign, &n, point);
    return n;
}

/* Go's %e with the shortest digits: d[.ddd]e±dd (at least two exponent digits). */
static char *float_put_e(char *p, const char *d, int n, int point)
{
    *p++ = d[0];
    if (n > 1) {
        *p++ = '.';
        memcpy(p, d + 1, (size_t)(n - 1));
        p += n - 1;
    }
    int exp = point - 1;
    *p++ = 'e';
    *p++ = exp < 0 ? '-' : '+';
    if (exp < 0)
        exp = -exp;
    if (exp >= 100)
        *p++ = (char)('0' + exp / 100);
    *p++ = (char)('0' + exp / 10 % 10);
    *p++ = (char)('0' + exp % 10);
    return p;
}

/* Go's %f with the shortest digits: the integer part padded with zeros, then as many decimals as
 * the digits need (none for an integer). */
static char *float_put_f(char *p, const char *d, int n, int point)
{
    if (point <= 0) {
        *p++ = '0';
    } else if (point >= n) {
        memcpy(p, d, (size_t)n);
        memset(p + n, '0', (size_t)(point - n));
        return p + point;
    } else {
        memcpy(p, d, (size_t)point);
        p += point;
    }
    *p++ = '.';
    if (point < 0) {
        memset(p, '0', (size_t)-point);
        p += -point;
        point = 0;
    }
    memcpy(p, d + point, (size_t)(n - point));
    return p + (n - point);
}

size_t floatfmt_go(char *out, double v, char fmt)
{
    assert(fmt == 'e' || fmt == 'f' || fmt == 'g');
    char *p = out;
    if (std::isnan(v)) {
        memcpy(out, "NaN", 4);
        return 3;
    }
    if (std::isinf(v)) {
        memcpy(out, v > 0 ? "+Inf" : "-Inf", 5);
        return 4;
    }
    if (std::signbit(v))
        *p++ = '-';
    if (v == 0) {
        /* Go: FormatFloat(0, 'e', -1, 64) is "0e+00" (Prometheus' alert values) */
        memcpy(p, fmt == 'e' ? "0e+00" : "0", fmt == 'e' ? 5 : 1);
        p += fmt == 'e' ? 5 : 1;
    } else {
        char d[DoubleToStringConverter::kBase10MaximalLength + 1];
        int point;
        int n = floatfmt_shortest(v, d, &point);
        bool use_e = fmt == 'e';
        if (fmt == 'g') /* Go's 'g' with precision -1 decides with eprec = 6 */
            use_e = point - 1 < -4 || point - 1 >= 6;
        p = use_e ? float_put_e(p, d, n, point) : float_put_f(p, d, n, point);
    }
    *p = '\0';
    assert(p - out < FLOATFMT_MAX);
    return (size_t)(p - out);
}
