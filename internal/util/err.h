/*
 * err — the error-buffer convention every module follows: a function that can fail returns an int
 * status (or NULL) and writes one line into `char *err, size_t errlen`, a buffer its caller owns.
 * err_setf formats into it; a NULL buffer or errlen 0 means the caller does not want the text, and
 * a message longer than the buffer is cut (and still NUL-terminated).
 */
#ifndef SLUICE_UTIL_ERR_H
#define SLUICE_UTIL_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void err_setf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void err_setf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

#endif
