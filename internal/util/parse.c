/* parse — strict parsers for durations, sizes, booleans and numbers; see parse.h. */
#include "internal/util/parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int parse_int64(const char *s, int64_t *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

int parse_double(const char *s, double *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || (errno == ERANGE && isinf(v)))
        return -1;
    *out = v;
    return 0;
}

int parse_bool(const char *s, bool *out)
{
    static const char *const t[] = {"true", "1", "yes", "on", "TRUE", "True"};
    static const char *const f[] = {"false", "0", "no", "off", "FALSE", "False"};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (strcmp(s, t[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(s, f[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* Prometheus' duration units, largest first (format_duration_ms relies on the order). */
static const struct {
    const char *unit;
    int64_t ms;
} duration_units[] = {{"y", 365LL * 86400000},
                      {"w", 7LL * 86400000},
                      {"d", 86400000},
                      {"h", 3600000},
                      {"m", 60000},
                      {"s", 1000},
                      {"ms", 1}};

int parse_duration_ms(const char *s, int64_t *out_ms)
{
    if (!s || !*s)
        return -1;
    if (strcmp(s, "0") == 0) {
        *out_ms = 0;
        return 0;
    }
    int64_t total = 0;
    int last = -1;
    const char *p = s;
    while (*p) {
        if (*p < '0' || *p > '9')
            return -1;
        int64_t n = 0;
        while (*p >= '0' && *p <= '9') {
            if (n > (INT64_MAX - 9) / 10)
                return -1;
            n = n * 10 + (*p++ - '0');
        }
        int u = -1;
        /* "ms" must be tried before "m". */
        if (p[0] == 'm' && p[1] == 's')
            u = 6;
        else
            for (int i = 0; i < 6; i++)
                if (*p == duration_units[i].unit[0]) {
                    u = i;
                    break;
                }
        if (u < 0 || u <= last)
            return -1;
        p += strlen(duration_units[u].unit);
        if (n > INT64_MAX / duration_units[u].ms || total > INT64_MAX - n * duration_units[u].ms)
            return -1;
        total += n * duration_units[u].ms;
        last = u;
    }
    *out_ms = total;
    return 0;
}

int parse_duration_or_seconds_ms(const char *s, int64_t *out_ms)
{
    double d;
    if (parse_double(s, &d) == 0) {
        if (!isfinite(d) || fabs(d * 1000.0) >= 9.2e18)
            return -1;
        *out_ms = (int64_t)llround(d * 1000.0);
        return 0;
    }
    return parse_duration_ms(s, out_ms);
}

void format_duration_ms(int64_t ms, char *out, int cap)
{
    int n = 0;
    if (ms == 0) {
        snprintf(out, (size_t)cap, "0s");
        return;
    }
    if (ms < 0) {
        n += snprintf(out + n, (size_t)(cap - n), "-");
        ms = -ms;
    }
    for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]) && n < cap; i++) {
        if (ms >= duration_units[i].ms) {
            n += snprintf(out + n, (size_t)(cap - n), "%lld%s", (long long)(ms / duration_units[i].ms),
                          duration_units[i].unit);
            ms %= duration_units[i].ms;
        }
    }
}

int parse_size_bytes(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } sfx[] = {{"KiB", 1ULL << 10},   {"MiB", 1ULL << 20},      {"GiB", 1ULL << 30},
               {"TiB", 1ULL << 40},   {"KB", 1000ULL},          {"MB", 1000000ULL},
               {"GB", 1000000000ULL}, {"TB", 1000000000000ULL}, {"B", 1}};
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return -1;
    uint64_t mult = 1;
    if (*end) {
        size_t i;
        for (i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++)
            if (strcmp(end, sfx[i].suffix) == 0)
                break;
        if (i == sizeof(sfx) / sizeof(sfx[0]))
            return -1;
        mult = sfx[i].mult;
    }
    if (v > UINT64_MAX / mult)
        return -1;
    *out = v * mult;
    return 0;
}
