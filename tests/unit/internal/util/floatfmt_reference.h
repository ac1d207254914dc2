/*
 * floatfmt_reference — sluice's float formatting as it was before floatfmt.cc (printf %.*e with a
 * strtod round trip, binary-searched over the digit count), kept verbatim as the reference that
 * test_floatfmt.c and bench/floatfmt_bench.c hold the new formatter against. Not linked into
 * sluice. The one change: it writes into a char array instead of a buf_t.
 */
#ifndef SLUICE_TEST_FLOATFMT_REFERENCE_H
#define SLUICE_TEST_FLOATFMT_REFERENCE_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char s[512];
    size_t len;
} ref_out_t;

static void ref_puts(ref_out_t *o, const char *s)
{
    size_t n = strlen(s);
    memcpy(o->s + o->len, s, n + 1);
    o->len += n;
}

static void ref_putc(ref_out_t *o, char c)
{
    o->s[o->len++] = c;
    o->s[o->len] = '\0';
}

static int ref_shortest(double v, char *tmp, size_t cap)
{
    char probe[64];
    int lo = 1, hi = 17;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        snprintf(probe, sizeof(probe), "%.*e", mid - 1, v);
        if (strtod(probe, NULL) == v)
            hi = mid;
        else
            lo = mid + 1;
    }
    snprintf(tmp, cap, "%.*e", lo - 1, v);
    return lo;
}

static bool ref_put_integral(ref_out_t *o, double v, char fmt)
{
    double a = fabs(v);
    if (fmt == 'e' || v == 0 || a >= 9007199254740992.0 || v != (double)(int64_t)v)
        return false;
    if (fmt == 'g' && a >= 1e6)
        return false;
    char tmp[24];
    snprintf(tmp, sizeof(tmp), "%" PRId64, (int64_t)v);
    ref_puts(o, tmp);
    return true;
}

/* The old buf_put_float_go. */
static void ref_float_go(ref_out_t *o, double v, char fmt)
{
    o->len = 0;
    o->s[0] = '\0';
    if (isnan(v)) {
        ref_puts(o, "NaN");
        return;
    }
    if (isinf(v)) {
        ref_puts(o, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (ref_put_integral(o, v, fmt))
        return;
    char tmp[400];
    int prec = ref_shortest(v, tmp, sizeof(tmp));
    const char *e = strchr(tmp, 'e');
    int exp = e ? atoi(e + 1) : 0;
    bool use_e;
    if (fmt == 'e')
        use_e = true;
    else if (fmt == 'f')
        use_e = false;
    else
        use_e = exp < -4 || exp >= 6;
    if (v == 0) {
        ref_puts(o, signbit(v) ? "-0" : "0");
        return;
    }
    if (use_e) {
        ref_puts(o, tmp);
        return;
    }
    int decimals = prec - 1 - exp;
    if (decimals < 0) {
        if (v < 0)
            ref_putc(o, '-');
        for (const char *p = tmp; p < e; p++)
            if (*p >= '0' && *p <= '9')
                ref_putc(o, *p);
        for (int i = 0; i < -decimals; i++)
            ref_putc(o, '0');
        return;
    }
    snprintf(tmp, sizeof(tmp), "%.*f", decimals, v);
    ref_puts(o, tmp);
}

#endif
