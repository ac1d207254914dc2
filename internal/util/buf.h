/*
 * buf — a growable byte buffer (pointer, length, capacity), the one way sluice builds output.
 *
 * Growth doubles capacity. The `buf_*` appenders abort on out-of-memory (like sdscat in Redis:
 * a daemon that cannot allocate a few KB cannot do anything useful); `buf_try_reserve` returns
 * -1 instead for sizes a client controls. The data is always NUL-terminated past `len` when
 * cap > 0, so text can be handed to C string functions. Whoever calls buf_init calls buf_free.
 */
#ifndef SLUICE_UTIL_BUF_H
#define SLUICE_UTIL_BUF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} buf_t;

#define BUF_INIT ((buf_t){NULL, 0, 0})

void buf_init(buf_t *b);
void buf_free(buf_t *b);
/* Keeps the allocation, forgets the content. */
void buf_reset(buf_t *b);
/* Ensures room for `extra` more bytes (plus the NUL); aborts on OOM. */
void buf_reserve(buf_t *b, size_t extra);
/* As buf_reserve, but returns -1 on overflow or OOM. */
__attribute__((warn_unused_result)) int buf_try_reserve(buf_t *b, size_t extra);
void buf_append(buf_t *b, const void *p, size_t n);
void buf_puts(buf_t *b, const char *s);
void buf_putc(buf_t *b, char c);
void buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(buf_t *b, const char *fmt, va_list ap);
/* Appends a JSON string literal (with quotes), escaping as RFC 8259 requires. */
void buf_put_json_string(buf_t *b, const char *s, size_t n);
/* Appends a float as Go's strconv.FormatFloat(v, fmt, -1, 64) does (fmt 'g', 'e' or 'f': shortest
 * digits that round-trip), with NaN, +Inf, -Inf (floatfmt.h has the details; a zero is "0" or "-0"
 * in every layout). buf_put_float is 'g' (text exposition format);
 * buf_put_float_json is the Prometheus API's rule ('f', or 'e' when |v| < 1e-6 or >= 1e21). */
void buf_put_float(buf_t *b, double v);
void buf_put_float_go(buf_t *b, double v, char fmt);
void buf_put_float_json(buf_t *b, double v);
/* Hands the allocation to the caller (who frees it) and leaves b empty. */
char *buf_steal(buf_t *b, size_t *len);

#endif
