/*
 * status — the daemon's own endpoints: /-/healthy, /-/ready, /api/v1/status/{buildinfo,flags,
 * runtimeinfo} in Prometheus' shapes, and GET /metrics (self-metrics from every registered
 * collector). Readiness is a flag the daemon sets once recovery is done.
 */
#ifndef SLUICE_API_STATUS_H
#define SLUICE_API_STATUS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *flags_json;    /* {"name":"value",...}; owned by the caller, must outlive the server */
    const char *storage_path;
    int64_t retention_raw_ms;
} api_status_options_t;

void api_status_register(const api_status_options_t *opt);
void api_status_set_ready(bool ready);
bool api_status_ready(void);
/* Records the outcome of a config (re)load for runtimeinfo. */
void api_status_note_config_load(bool success);

#endif
