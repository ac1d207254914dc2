/*
 * query — the Prometheus HTTP query API v1 over sluice's PromQL engine and storage:
 *
 *   GET|POST /api/v1/query, /api/v1/query_range       PromQL instant / range queries
 *   GET|POST /api/v1/series, /api/v1/labels            series and label names by match[]
 *   GET      /api/v1/label/<name>/values               label values by match[]
 *   GET|POST /api/v1/query_exemplars                   (sluice keeps no exemplars: always [])
 *   GET|POST /api/v1/format_query                      PromQL pretty-printer
 *   GET      /api/v1/status/config                     the effective settings as YAML
 *
 * Parameters, error messages, status codes and JSON bytes follow Prometheus 2.42 (checked against
 * the real binary); see query.c. Replies are gzip-compressed when the client accepts gzip.
 *
 * Every request that reads storage runs on a small pool of query threads (--query.max-concurrency
 * of them; more wait in a FIFO queue), never on an HTTP event loop: the request is parked, a pool
 * thread evaluates and renders it, then hands the reply back to the request's worker loop. A
 * client that goes away cancels its query; shutdown cancels all of them.
 */
#ifndef SLUICE_API_QUERY_H
#define SLUICE_API_QUERY_H

#include <stdint.h>

#include "api/server.h"
#include "storage/storage.h"

typedef struct {
    api_server_t *srv; /* replies hop back to its worker loops */
    storage_t *storage;
    int64_t lookback_ms;         /* --query.lookback-delta (0: 5m) */
    int64_t timeout_ms;          /* --query.timeout (0: 2m) */
    int64_t max_samples;         /* --query.max-samples (0: 50,000,000) */
    int max_concurrency;         /* --query.max-concurrency: pool threads (0: 20) */
    size_t max_memory;           /* --query.max-memory-per-query (0: none) */
    struct arena_budget *budget; /* --query.max-memory, shared with remote read; may be NULL */
    const char *config_yaml;     /* /api/v1/status/config body; copied */
} api_query_options_t;

typedef struct api_query api_query_t;

/* Starts the pool and registers a shutdown hook on srv that cancels running queries. Call before
 * api_server_start. NULL on failure (message in err). */
api_query_t *api_query_new(const api_query_options_t *o, char *err, size_t errlen);
/* Registers the routes listed above. */
void api_query_register_routes(api_query_t *q, api_server_t *srv);
/* Stops and joins the pool; call after api_server_stop (no request may still be queued). q may
 * be NULL. */
void api_query_free(api_query_t *q);

#endif
