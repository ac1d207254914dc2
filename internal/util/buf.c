/* buf — growable byte buffer; see buf.h. */
#include "internal/util/buf.h"

#include "internal/util/floatfmt.h"

#include <math.h>
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
    buf_put_float_go(b, v, 'g');
}

void buf_put_float_go(buf_t *b, double v, char fmt)
{
    buf_reserve(b, FLOATFMT_MAX);
    b->len += floatfmt_go(b->data + b->len, v, fmt);
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
