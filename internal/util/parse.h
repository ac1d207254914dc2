/*
 * parse — the small value grammars shared by flags, config files and HTTP parameters:
 * Prometheus durations ("1h30m", "5m", "250ms", "1y", "2w", "1d"), sizes ("32MiB", "64KB", "1024"),
 * booleans and integers. Every parser is strict (the whole string must match) and returns 0 or -1.
 */
#ifndef SLUICE_UTIL_PARSE_H
#define SLUICE_UTIL_PARSE_H

#include <stdbool.h>
#include <stdint.h>

/* Prometheus model.ParseDuration syntax: one or more <int><unit>, units y w d h m s ms, in that
 * order, each at most once. "0" is allowed. Result in milliseconds. */
int parse_duration_ms(const char *s, int64_t *out_ms);
/* Duration as above, or a plain decimal number of seconds (float), as the HTTP API accepts. */
int parse_duration_or_seconds_ms(const char *s, int64_t *out_ms);
/* Formats a duration in Prometheus style ("1h30m", "0s") into out (>= 32 bytes). */
void format_duration_ms(int64_t ms, char *out, int cap);
/* "1024", "64KB", "64KiB", "32MB", "32MiB", "1GiB" (B, KB=1000, KiB=1024, ...). */
int parse_size_bytes(const char *s, uint64_t *out);
int parse_bool(const char *s, bool *out);
int parse_int64(const char *s, int64_t *out);
int parse_double(const char *s, double *out);

#endif
