/*
 * status — the daemon's own endpoints: /-/healthy, /-/ready, /api/v1/status/{buildinfo,flags,
 * runtimeinfo} in Prometheus' shapes, and GET /metrics (self-metrics from every registered
 * collector). Readiness is a flag the daemon sets once recovery is done. One handle, made by
 * main.c, like every API module.
 */
#ifndef SLUICE_API_STATUS_H
#define SLUICE_API_STATUS_H

#include <stdbool.h>
#include <stdint.h>
#include "api/server.h"

typedef struct {
    const char *flags_json; /* {"name":"value",...}; owned by the caller, must outlive the server */
    const char *storage_path;
    int64_t retention_raw_ms;
} api_status_options_t;

typedef struct api_status api_status_t;

/* Copies the options (their strings stay the caller's); NULL when out of memory. Not ready. */
api_status_t *api_status_new(const api_status_options_t *opt);
/* Call after the server stopped: its routes point at st. */
void api_status_free(api_status_t *st);
void api_status_register_routes(api_status_t *st, api_server_t *srv);
/* /-/ready answers 200 once set (the daemon sets it when recovery is done), 503 before and after. */
void api_status_set_ready(api_status_t *st, bool ready);
bool api_status_ready(const api_status_t *st);
/* Records the outcome of a config (re)load for runtimeinfo. */
void api_status_note_config_load(api_status_t *st, bool success);

#endif
