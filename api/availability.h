/*
 * api/availability — availability from push heartbeats, and expected jobs (docs/operations.md,
 * "Availability" and "Expected jobs"):
 *
 *   GET /api/v1/availability[?job=J][&range=30d]   availability %, gaps (count, total, longest,
 *                                                   recent list) of one job, or of every job
 *   GET|PUT|DELETE /api/v1/control/jobs/{job}/expected   a job's declaration (through api/control,
 *   PUT /api/v1/control/jobs/{job} {"expected":...}      with its auth and cross-site checks)
 *   GET /api/v1/control/expected-jobs                     every declared job and whether it is up
 *
 * It owns the heartbeat accounting (internal/push/heartbeat.h, fed by the push registry's
 * on_beat hook), a thread that ticks it every second, and availability.db (SQLite, in the data
 * directory): the gaps (opened and closed as they happen, so they survive a restart; a gap still
 * open when sluice stopped is closed at the last moment sluice was alive, reason "sluice
 * stopped"), the jobs' first sighting and the jobs declared through the API. Jobs declared in
 * --control.expected-jobs-file are read at start-up and on reload (SIGHUP, POST /-/reload).
 *
 * Series written to storage every --push.heartbeat-series-interval (stale markers when a group or
 * job goes away):
 *   sluice_push_expected_total, sluice_push_received_total, sluice_push_last_seconds,
 *   sluice_push_interval_seconds                        {<the group's grouping labels>}
 *   sluice_job_push_expected_total, sluice_job_push_received_total,
 *   sluice_job_push_last_seconds, sluice_job_push_interval_seconds, sluice_job_up   {job="<job>"}
 */
#ifndef SLUICE_API_AVAILABILITY_H
#define SLUICE_API_AVAILABILITY_H

#include <stdint.h>

#include "api/control.h"
#include "api/server.h"
#include "internal/push/registry.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

typedef struct {
    storage_t *storage;          /* may be NULL (no series) */
    const char *storage_path;    /* availability.db goes here (exists) */
    const char *expected_file;   /* --control.expected-jobs-file; NULL/"" = none */
    int64_t default_interval_ms; /* --push.expected-interval; 0 = learned */
    uint32_t missing_intervals;  /* --push.missing-intervals */
    int64_t series_interval_ms;  /* --push.heartbeat-series-interval */
    int64_t (*clock_ms)(void);   /* tests; NULL = wall clock */
} api_avail_options_t;

typedef struct api_avail api_avail_t;

/* Opens availability.db (closing gaps left open by the last run) and reads the expected-jobs file
 * (an invalid file fails start-up). NULL + err. */
api_avail_t *api_avail_new(const api_avail_options_t *o, char *err, size_t errlen);
/* For api_push_options_t.on_beat (ud = the api_avail_t). */
void api_avail_on_beat(void *ud, const push_beat_t *beat);
/* The routes; the expected-jobs ones only with ctl (which authorizes them and routes
 * /api/v1/control/jobs/{job}/expected here). */
void api_avail_register_routes(api_avail_t *av, api_server_t *srv, api_control_t *ctl);
/* Starts the tick thread (once storage is ready). 0 or -1. */
int api_avail_start(api_avail_t *av);
/* Re-reads the expected-jobs file; on error the previous declarations stay. 0 or 1 (error
 * appended to errs). Signature fits api_rules_options_t.also_reload. */
int api_avail_reload(void *ud, buf_t *errs);
/* Stops the thread, closes open gaps (reason "sluice stopped"), closes the database. Before
 * storage_close. Idempotent; NULL is fine. */
void api_avail_stop(api_avail_t *av);
void api_avail_free(api_avail_t *av);

/* The expected-jobs file: one job per line, optionally followed by " interval=<duration>";
 * '#' starts a comment line; blank lines are ignored. Exposed for tests. Returns the number of
 * jobs (arrays malloc'd; free with api_avail_free_expected) or -1 + err naming the line. */
int api_avail_parse_expected(const char *text, char ***jobs, int64_t **intervals, char *err, size_t errlen);
void api_avail_free_expected(char **jobs, int64_t *intervals, int n);

#endif
