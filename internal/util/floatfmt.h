/*
 * floatfmt — float64 to text as Go's strconv.FormatFloat(v, fmt, -1, 64) writes it, the way every
 * float leaves sluice (query answers, the text exposition, federation, le/quantile label values,
 * alert values). buf_put_float* in buf.h are the usual entry points; this is the layer under them.
 *
 * Digits: the shortest decimal that parses back to v, and of those the one closest to v (ties to
 * the even digit), as Go's shortest mode picks them. They come from Google's double-conversion
 * (Debian's libdouble-conversion, C++: Grisu3 with an exact bignum fallback) through the C shim
 * floatfmt.cc; the layouts 'e', 'f' and 'g' are written here, not by printf.
 *
 * Spellings that are sluice's, kept as they always were: NaN, +Inf, -Inf. A zero is "0" or "-0",
 * and "0e+00" / "-0e+00" in the 'e' layout, as Go writes it (Prometheus' alert values).
 */
#ifndef SLUICE_UTIL_FLOATFMT_H
#define SLUICE_UTIL_FLOATFMT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest text floatfmt_go writes, plus its NUL: 'f' of the smallest subnormal is "-0." then
 * 323 zeros and up to 17 digits. */
#define FLOATFMT_MAX 352

/* Writes v in layout fmt ('e', 'f' or 'g') to out (FLOATFMT_MAX bytes), NUL-terminated; returns
 * the length. */
size_t floatfmt_go(char *out, double v, char fmt);

/* The shortest round-trip digits of a finite, non-zero |v| into digits (18 bytes, NUL-terminated,
 * no leading or trailing zeros); *point is where the decimal point goes (v = 0.DIGITS x 10^point).
 * Returns the digit count (1..17). */
int floatfmt_shortest(double v, char *digits, int *point);

#ifdef __cplusplus
}
#endif

#endif
