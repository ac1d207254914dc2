/* buf — growable byte buffer; see buf.h. */
#include "internal/util/buf.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_init(buf_t *b)
{
    *b = BUF_INIT;
}

void buf_free(buf_t *b)
{
    free(b->data);
    *b = BUF_INIT;
}

void buf_reset(buf_t *b)
{
    b->len = 0;
    if (b->cap)
        b->data[0] = 0;
}

int buf_try_reserve(buf_t *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

void buf_reserve(buf_t *b, size_t extra)
{
    if (buf_try_reserve(b, extra) != 0) {
        fputs("sluice: out of memory\n", stderr);
        abort();
    }
}

void buf_append(buf_t *b, const void *p, size_t n)
{
    buf_reserve(b, n);
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void buf_puts(buf_t *b, const char *s)
{
    buf_append(b, s, strlen(s));
}

void buf_putc(buf_t *b, char c)
{
    buf_reserve(b, 1);
    b->data[b->len++] = c;
    b->data[b->len] = 0;
}

void buf_vprintf(buf_t *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap2);
    va_end(ap2);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        buf_append(b, tmp, (size_t)n);
        return;
    }
    buf_reserve(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

void buf_printf(buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void buf_put_json_string(buf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    buf_reserve(b, n + 2);
    buf_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c < 0x20) {
            u[0] = '\\', u[1] = 'u', u[2] = '0', u[3] = '0', u[4] = hex[c >> 4], u[5] = hex[c & 15], u[6] = 0;
            esc = u;
        }
        if (esc) {
            buf_append(b, s + run, i - run);
            buf_puts(b, esc);
            run = i + 1;
        }
    }
    buf_append(b, s + run, n - run);
    buf_putc(b, '"');
}

void buf_put_float(buf_t *b, double v)
{
    if (isnan(v)) {
        buf_puts(b, "NaN");
        return;
    }
    if (isinf(v)) {
        buf_puts(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    buf_put_float_go(b, v, 'g');
}

/* Shortest digit count (1..17) whose %e rendering parses back to v; leaves that text in tmp.
 * Round-tripping is monotone in the digit count (the p-digit rounding is also a (p+1)-digit
 * decimal, so the (p+1)-digit one is at least as close), hence a binary search: 4-5 formatting
 * passes instead of up to 17 for the random-looking values gauges carry. */
static int float_shortest(double v, char *tmp, size_t cap)
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

/* Integral values below 2^53 print as their integer digits whenever the decimal form is chosen;
 * counters and most Flink gauges are such values. Returns false when the general path decides. */
static bool float_put_integral(buf_t *b, double v, char fmt)
{
    double a = fabs(v);
    if (fmt == 'e' || v == 0 || a >= 9007199254740992.0 || v != (double)(int64_t)v)
        return false;
    if (fmt == 'g' && a >= 1e6) /* Go's 'g' switches to an exponent at 1e6 and above */
        return false;
    char tmp[24];
    int n = snprintf(tmp, sizeof(tmp), "%" PRId64, (int64_t)v);
    buf_append(b, tmp, (size_t)n);
    return true;
}

void buf_put_float_go(buf_t *b, double v, char fmt)
{
    if (isnan(v)) {
        buf_puts(b, "NaN");
        return;
    }
    if (isinf(v)) {
        buf_puts(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (float_put_integral(b, v, fmt))
        return;
    char tmp[400];
    int prec = float_shortest(v, tmp, sizeof(tmp));
    const char *e = strchr(tmp, 'e');
    int exp = e ? atoi(e + 1) : 0;
    bool use_e;
    if (fmt == 'e')
        use_e = true;
    else if (fmt == 'f')
        use_e = false;
    else /* Go 'g' with precision -1 decides with eprec = 6. */
        use_e = exp < -4 || exp >= 6;
    if (v == 0) {
        buf_puts(b, signbit(v) ? "-0" : "0");
        return;
    }
    if (use_e) {
        buf_puts(b, tmp);
        return;
    }
    int decimals = prec - 1 - exp;
    if (decimals < 0) {
        /* Like Go: the shortest digits padded with zeros, not %.0f's exact binary expansion
         * (1e23 is 100000000000000000000000, not 99999999999999991611392). */
        if (v < 0)
            buf_putc(b, '-');
        for (const char *p = tmp; p < e; p++)
            if (*p >= '0' && *p <= '9')
                buf_putc(b, *p);
        for (int i = 0; i < -decimals; i++)
            buf_putc(b, '0');
        return;
    }
    snprintf(tmp, sizeof(tmp), "%.*f", decimals, v);
    buf_puts(b, tmp);
}

void buf_put_float_json(buf_t *b, double v)
{
    double a = fabs(v);
    buf_put_float_go(b, v, (a != 0 && (a < 1e-6 || a >= 1e21)) ? 'e' : 'f');
}

char *buf_steal(buf_t *b, size_t *len)
{
    char *p = b->data;
    if (len)
        *len = b->len;
    *b = BUF_INIT;
    return p;
}
