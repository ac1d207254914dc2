/*
 * metrics — the registry behind GET /metrics. Subsystems (storage, push groups, rules, ...)
 * register a collector once at start-up; a scrape calls each in registration order and each
 * appends Prometheus text exposition (HELP/TYPE + samples) to the buffer. Collectors run on the
 * scraping worker thread, so they must be thread-safe and quick (read atomics / take short locks).
 * The process_* metrics every Prometheus exporter has are built in (metrics_write_process).
 * The pushed groups (100s of MB) register as a stream collector instead: GET /metrics prepares
 * them off the worker (metrics_render_begin) and sends them a piece at a time (_next).
 */
#ifndef SLUICE_UTIL_METRICS_H
#define SLUICE_UTIL_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "internal/util/buf.h"

typedef void (*metrics_collector_fn)(void *ud, buf_t *out);

/* Not thread-safe: register before the server starts. Returns 0 or -1 when full. */
int metrics_register(const char *name, metrics_collector_fn fn, void *ud);
/* A collector of pushed data rather than sluice's own state (the Pushgateway part of GET
 * /metrics, which can be 100s of MB; metrics_write_self skips it), rendered in pieces (GET
 * /metrics streams it): begin does
 * the expensive preparation and returns a handle (NULL: nothing to show, e.g. out of memory);
 * next appends about max_bytes or more of text and returns true while there is more; end frees
 * the handle, at any point. begin may run on any thread; next/end on one thread at a time. */
typedef struct {
    void *(*begin)(void *ud);
    bool (*next)(void *handle, buf_t *out, size_t max_bytes);
    void (*end)(void *handle);
} metrics_stream_ops_t;
int metrics_register_pushed_stream(const char *name, const metrics_stream_ops_t *ops, void *ud);
void metrics_unregister_all(void);
/* Runs every collector. */
void metrics_write_all(buf_t *out);
/* Runs every collector but the pushed-data ones (GET /-/metrics). */
void metrics_write_self(buf_t *out);

/* metrics_write_all in pieces (GET /metrics to a slow scraper must hold only a piece at a time):
 *   begin  runs every stream collector's begin (the expensive part: run it off the HTTP worker);
 *   next   appends the next piece (about max_bytes; the plain collectors run when their turn in
 *          registration order comes) and returns true while there is more;
 *   end    frees it, at any point.
 * The pieces concatenated are what metrics_write_all would have written. NULL when out of memory. */
typedef struct metrics_render metrics_render_t;
metrics_render_t *metrics_render_begin(void);
bool metrics_render_next(metrics_render_t *h, buf_t *out, size_t max_bytes);
void metrics_render_end(metrics_render_t *h);
/* process_resident_memory_bytes, process_virtual_memory_bytes, process_cpu_seconds_total,
 * process_open_fds, process_max_fds, process_start_time_seconds. */
void metrics_write_process(buf_t *out);
/* Resident set size of this process in bytes (from /proc/self/statm), 0 if unknown. */
long long metrics_process_rss_bytes(void);
/* Wall-clock time at which the process started (seconds since the epoch). */
double metrics_process_start_time(void);

#endif
