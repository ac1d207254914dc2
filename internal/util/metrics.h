/*
 * metrics — the registry behind GET /metrics. Subsystems (storage, push groups, rules, ...)
 * register a collector once at start-up; a scrape calls each in registration order and each
 * appends Prometheus text exposition (HELP/TYPE + samples) to the buffer. Collectors run on the
 * scraping worker thread, so they must be thread-safe and quick (read atomics / take short locks).
 * The process_* metrics every Prometheus exporter has are built in (metrics_write_process).
 */
#ifndef SLUICE_UTIL_METRICS_H
#define SLUICE_UTIL_METRICS_H

#include "internal/util/buf.h"

typedef void (*metrics_collector_fn)(void *ud, buf_t *out);

/* Not thread-safe: register before the server starts. Returns 0 or -1 when full. */
int metrics_register(const char *name, metrics_collector_fn fn, void *ud);
/* The same for a collector that exposes pushed data rather than sluice's own state (the
 * Pushgateway part of GET /metrics, which can be 100s of MB); metrics_write_self skips it. */
int metrics_register_pushed(const char *name, metrics_collector_fn fn, void *ud);
void metrics_unregister_all(void);
/* Runs every collector. */
void metrics_write_all(buf_t *out);
/* Runs every collector but the pushed-data ones (GET /-/metrics). */
void metrics_write_self(buf_t *out);
/* process_resident_memory_bytes, process_virtual_memory_bytes, process_cpu_seconds_total,
 * process_open_fds, process_max_fds, process_start_time_seconds. */
void metrics_write_process(buf_t *out);
/* Resident set size of this process in bytes (from /proc/self/statm), 0 if unknown. */
long long metrics_process_rss_bytes(void);
/* Wall-clock time at which the process started (seconds since the epoch). */
double metrics_process_start_time(void);

#endif
