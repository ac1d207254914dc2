/*
 * api/flow — a Flink job's flow second by second, for the dashboard and for scripts:
 *
 *   GET /api/v1/flow?job=J[&window=5m][&end=<unix s>]   one JSON document for the window
 *   GET /api/v1/flow/stream?job=J[&window=5m]           Server-Sent Events: the window first,
 *                                                       then once a second the seconds that changed
 *
 * The numbers come from what Flink's TaskManagers push (PROTOCOLS.md §1), selected by the
 * `job_name` label (the key the control plane uses too): records in/out per second summed over
 * every operator and subtask (numRecordsIn/numRecordsOut, monotonic gauges read as counters),
 * the highest backpressure and busy ratio among each task's subtasks, lag gauges, and the job's
 * control state. The rules (resets, spreading, staleness, completeness) are written out at the
 * top of flow.c and in docs/dashboard.md.
 */
#ifndef SLUICE_API_FLOW_H
#define SLUICE_API_FLOW_H

#include <stddef.h>
#include <stdint.h>

#include "api/server.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

#define FLOW_MAX_WINDOW_S 3600 /* one hour of one-second points */
#define FLOW_DEFAULT_WINDOW_S 300
#define FLOW_MAX_TASKS 128
#define FLOW_MAX_LAGS 16

/* Metric names read (operator / task scope, as Flink's reporter names them). */
#define FLOW_METRIC_RECORDS_IN "flink_taskmanager_job_task_operator_numRecordsIn"
#define FLOW_METRIC_RECORDS_OUT "flink_taskmanager_job_task_operator_numRecordsOut"
#define FLOW_METRIC_BACKPRESSURE "flink_taskmanager_job_task_backPressuredTimeMsPerSecond"
#define FLOW_METRIC_BUSY "flink_taskmanager_job_task_busyTimeMsPerSecond"
/* Lag gauges: any operator metric ending in one of these (Kafka source: records_lag_max; FLIP-33
 * sources: pendingRecords). Summed over the job's series, per name. */
#define FLOW_LAG_REGEX "flink_taskmanager_job_task_operator_.*(records_lag_max|pendingRecords)"

/* One task's per-second gauges; NaN = no value for that second. */
typedef struct {
    char *name;           /* task_name */
    double *backpressure; /* max over subtasks of backPressuredTimeMsPerSecond / 1000, [0,1] */
    double *busy;         /* same for busyTimeMsPerSecond (NaN samples ignored) */
    int subtasks;         /* distinct series seen for the backpressure metric */
} api_flow_task_t;

typedef struct {
    char *name;     /* full metric name */
    double *values; /* sum over series, per second; NaN = none */
} api_flow_lag_t;

/* The flow of one job for seconds [start_s, end_s] (n = end_s - start_s + 1 points). Arrays are
 * malloc'd, owned by the result; free with api_flow_result_free. */
typedef struct {
    int64_t start_s, end_s;
    size_t n;
    double *records_in, *records_out; /* NaN = unknown (no counter covers it, or past complete_s) */
    int64_t complete_s;               /* every live counter series has reported up to here; -1 = no counters */
    int counter_series;               /* numRecordsIn/Out series seen */
    api_flow_task_t *tasks;           /* sorted by name */
    size_t ntasks;
    api_flow_lag_t *lags; /* sorted by name */
    size_t nlags;
} api_flow_result_t;

/* Computes the flow of `job` over [start_s, end_s] from q (one select per metric group, each
 * sample read once). now_ms decides which counter series are live (reported in the last
 * FLOW_LIVE_S seconds) for complete_s. 0, or -1 with a message in err (bad window, storage
 * error). out is initialised by the call even on failure (free it either way). */
int api_flow_compute(querier_t *q, const char *job, int64_t start_s, int64_t end_s, int64_t now_ms,
                     api_flow_result_t *out, char *err, size_t errlen);
void api_flow_result_free(api_flow_result_t *r);
/* Appends the JSON object documented in api/openapi.yaml (FlowData) without "control", leaving
 * the object open so the caller can add fields and close it with '}'. */
void api_flow_result_json_open(const api_flow_result_t *r, const char *job, buf_t *out);

typedef struct {
    storage_t *storage;
    api_server_t *srv; /* for the shutdown hook that ends streams; may be NULL in tests */
    /* Appends the job's control state as JSON (control_state_to_json's shape) to out, or nothing
     * to leave "control": null. Called on worker threads. NULL = always null. */
    void (*control_json)(const char *job, buf_t *out, void *ud);
    void *control_ud;
    int64_t (*clock_ms)(void); /* tests; NULL = wall clock */
} api_flow_options_t;

typedef struct api_flow api_flow_t;

/* NULL on OOM. Register routes before the server starts. */
api_flow_t *api_flow_new(const api_flow_options_t *opt);
void api_flow_register_routes(api_flow_t *f, api_server_t *srv);
/* After api_server_stop (streams were ended by the shutdown hook). f may be NULL. */
void api_flow_free(api_flow_t *f);

#endif
