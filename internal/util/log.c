/*
 * log — formats one event per line (logfmt or JSON) into a stack buffer and writes it with one
 * write(2). Values needing quotes in logfmt (spaces, '=', '"', control bytes) are quoted with
 * Go-style escapes, as go-kit/log does for Prometheus. Over-long lines are cut with "...".
 */
#include "internal/util/log.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = LOG_INFO;
static _Atomic int log_format = LOG_FORMAT_LOGFMT;
static _Atomic int log_fd = 2;

static const char *const log_level_names[] = {"debug", "info", "warn", "error", "off"};

void log_set_level(log_level_t level)
{
    atomic_store(&log_level, (int)level);
}
log_level_t log_get_level(void)
{
    return (log_level_t)atomic_load(&log_level);
}
void log_set_format(log_format_t format)
{
    atomic_store(&log_format, (int)format);
}
void log_set_fd(int fd)
{
    atomic_store(&log_fd, fd < 0 ? 2 : fd);
}

int log_parse_level(const char *s, log_level_t *out)
{
    for (int i = 0; i <= LOG_ERROR; i++) {
        if (strcmp(s, log_level_names[i]) == 0) {
            *out = (log_level_t)i;
            return 0;
        }
    }
    return -1;
}

int log_parse_format(const char *s, log_format_t *out)
{
    if (strcmp(s, "logfmt") == 0) {
        *out = LOG_FORMAT_LOGFMT;
        return 0;
    }
    if (strcmp(s, "json") == 0) {
        *out = LOG_FORMAT_JSON;
        return 0;
    }
    return -1;
}

typedef struct {
    char *p;
    size_t len, cap;
} log_line_t;

static void line_putc(log_line_t *l, char c)
{
    if (l->len + 1 < l->cap)
        l->p[l->len++] = c;
}

static void line_puts(log_line_t *l, const char *s)
{
    while (*s)
        line_putc(l, *s++);
}

static void line_printf(log_line_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line_printf(log_line_t *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (l->len < l->cap) {
        int n = vsnprintf(l->p + l->len, l->cap - l->len, fmt, ap);
        if (n > 0)
            l->len += (size_t)n < l->cap - l->len ? (size_t)n : l->cap - l->len - 1;
    }
    va_end(ap);
}

/* Escaped string body (without the quotes), shared by both formats. */
static void line_put_escaped(log_line_t *l, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '"': line_puts(l, "\\\""); break;
        case '\\': line_puts(l, "\\\\"); break;
        case '\n': line_puts(l, "\\n"); break;
        case '\r': line_puts(l, "\\r"); break;
        case '\t': line_puts(l, "\\t"); break;
        default:
            if (c < 0x20)
                line_printf(l, "\\u%04x", c);
            else
                line_putc(l, (char)c);
        }
    }
}

static bool logfmt_needs_quotes(const char *s)
{
    if (*s == 0)
        return true;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == '=' || c == '"' || c == '\\' || c == 0x7f)
            return true;
    }
    return false;
}

static void line_put_value(log_line_t *l, bool json, const char *s)
{
    if (json || logfmt_needs_quotes(s)) {
        line_putc(l, '"');
        line_put_escaped(l, s);
        line_putc(l, '"');
    } else {
        line_puts(l, s);
    }
}

static void line_put_field(log_line_t *l, bool json, bool first, const char *key, const log_field_t *f,
                           const char *sval)
{
    if (json) {
        if (!first)
            line_putc(l, ',');
        line_putc(l, '"');
        line_put_escaped(l, key);
        line_puts(l, "\":");
    } else {
        if (!first)
            line_putc(l, ' ');
        line_puts(l, key);
        line_putc(l, '=');
    }
    if (!f) {
        line_put_value(l, json, sval ? sval : "");
        return;
    }
    switch (f->type) {
    case LOG_FIELD_STR: line_put_value(l, json, f->v.s ? f->v.s : "<nil>"); break;
    case LOG_FIELD_INT: line_printf(l, "%lld", (long long)f->v.i); break;
    case LOG_FIELD_FLOAT:
        if (isfinite(f->v.f))
            line_printf(l, "%.17g", f->v.f);
        else
            line_put_value(l, true, isnan(f->v.f) ? "NaN" : (f->v.f > 0 ? "+Inf" : "-Inf"));
        break;
    case LOG_FIELD_BOOL: line_puts(l, f->v.b ? "true" : "false"); break;
    case LOG_FIELD_NONE: break;
    }
}

void log_emit(log_level_t level, const char *component, const char *msg, const log_field_t *fields)
{
    char buf[4096];
    log_line_t l = {buf, 0, sizeof(buf) - 4};
    bool json = atomic_load(&log_format) == LOG_FORMAT_JSON;
    struct timeval tv;
    struct tm tm;
    char ts[64];

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000));
    if (level > LOG_ERROR)
        level = LOG_ERROR;

    if (json)
        line_putc(&l, '{');
    line_put_field(&l, json, true, "ts", NULL, ts);
    line_put_field(&l, json, false, "level", NULL, log_level_names[level]);
    if (component)
        line_put_field(&l, json, false, "component", NULL, component);
    line_put_field(&l, json, false, "msg", NULL, msg);
    for (const log_field_t *f = fields; f && f->key; f++)
        line_put_field(&l, json, false, f->key, f, NULL);
    if (json)
        line_putc(&l, '}');
    if (l.len >= l.cap - 1) {
        /* Truncated: mark it so a reader knows. */
        memcpy(buf + l.cap - 4, "...", 3);
        l.len = l.cap - 1;
    }
    buf[l.len++] = '\n';
    ssize_t rc = write(atomic_load(&log_fd), buf, l.len);
    (void)rc;
}
