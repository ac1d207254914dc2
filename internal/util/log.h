/*
 * log — one line per event on stderr, logfmt (default, like Prometheus) or JSON.
 *
 *   log_info("wal", "replayed segment", LF_S("file", name), LF_I("records", n));
 *   -> ts=2026-11-29T19:20:28.123Z level=info component=wal msg="replayed segment" file=00000001 records=42
 *
 * Fields are typed (LF_S string, LF_I integer, LF_F float, LF_B bool) so both formats are exact.
 * A line is formatted into a stack buffer and written with a single write(2), so lines from
 * different threads never interleave. Level and format may change at run time (SIGHUP).
 */
#ifndef SLUICE_UTIL_LOG_H
#define SLUICE_UTIL_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF } log_level_t;
typedef enum { LOG_FORMAT_LOGFMT = 0, LOG_FORMAT_JSON } log_format_t;
typedef enum { LOG_FIELD_NONE = 0, LOG_FIELD_STR, LOG_FIELD_INT, LOG_FIELD_FLOAT, LOG_FIELD_BOOL } log_field_type_t;

typedef struct {
    const char *key;
    log_field_type_t type;
    union {
        const char *s;
        int64_t i;
        double f;
        bool b;
    } v;
} log_field_t;

#define LF_S(k, val) ((log_field_t){.key = (k), .type = LOG_FIELD_STR, .v.s = (val)})
#define LF_I(k, val) ((log_field_t){.key = (k), .type = LOG_FIELD_INT, .v.i = (int64_t)(val)})
#define LF_F(k, val) ((log_field_t){.key = (k), .type = LOG_FIELD_FLOAT, .v.f = (double)(val)})
#define LF_B(k, val) ((log_field_t){.key = (k), .type = LOG_FIELD_BOOL, .v.b = (val)})
#define LF__END ((log_field_t){.key = NULL, .type = LOG_FIELD_NONE})

void log_set_level(log_level_t level);
log_level_t log_get_level(void);
void log_set_format(log_format_t format);
/* Redirect output (tests); fd < 0 restores stderr. */
void log_set_fd(int fd);
/* Parses "debug|info|warn|error"; returns 0 or -1. */
int log_parse_level(const char *s, log_level_t *out);
int log_parse_format(const char *s, log_format_t *out);

/* fields ends with an entry whose key is NULL. */
void log_emit(log_level_t level, const char *component, const char *msg, const log_field_t *fields);

#define log__at(lvl, comp, msg, ...)                                                                                   \
    do {                                                                                                               \
        if ((lvl) >= log_get_level())                                                                                  \
            log_emit((lvl), (comp), (msg), (const log_field_t[]){__VA_ARGS__ LF__END});                                \
    } while (0)
/* Trailing fields are optional; write them as LF_x(...), each followed by a comma-free list. */
#define log_debug(comp, msg, ...) log__at(LOG_DEBUG, comp, msg, LOG__FIELDS(__VA_ARGS__))
#define log_info(comp, msg, ...) log__at(LOG_INFO, comp, msg, LOG__FIELDS(__VA_ARGS__))
#define log_warn(comp, msg, ...) log__at(LOG_WARN, comp, msg, LOG__FIELDS(__VA_ARGS__))
#define log_error(comp, msg, ...) log__at(LOG_ERROR, comp, msg, LOG__FIELDS(__VA_ARGS__))
/* Appends a comma after a non-empty field list so the LF__END sentinel can follow. */
#define LOG__FIELDS(...) __VA_ARGS__ __VA_OPT__(, )

#endif
