/*
 * remote — Prometheus remote storage endpoints (see remote.c for the request flows):
 *
 *   POST /api/v1/write      remote write 1.0 (snappy block + WriteRequest) -> storage; 204
 *   POST /api/v1/read       remote read: SAMPLES (snappy ReadResponse) or STREAMED_XOR_CHUNKS
 *                           (framed ChunkedReadResponse, streamed with flow control)
 *   GET  /api/v1/metadata   metric metadata received by remote write, Prometheus' JSON shape
 *
 * The WriteRequest decoder is public so unit tests can check it against protobuf-c's generated
 * one and feed it garbage.
 */
#ifndef SLUICE_API_REMOTE_H
#define SLUICE_API_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "internal/util/arena.h"
#include "storage/storage.h"
#include "api/server.h"

typedef struct {
    storage_t *storage;             /* required for the routes (may be NULL for decoder tests) */
    uint64_t max_decoded_bytes;     /* uncompressed request limit; 0 = 32 MiB */
    uint64_t read_sample_limit;     /* SAMPLES responses, per query; 0 = no limit */
    size_t read_max_bytes_in_frame; /* STREAMED_XOR_CHUNKS frame budget; 0 = 1 MiB */
    size_t metadata_max_metrics;    /* distinct metric names kept for /api/v1/metadata; 0 = 10000 */
    int64_t read_timeout_ms;        /* --query.timeout for a whole read request; 0 = none */
    size_t read_max_memory;         /* SAMPLES: bytes one request may build (--query.max-memory-per-query); 0 = none */
    arena_budget_t *read_budget;    /* shared with queries (--query.max-memory); may be NULL */
} api_remote_options_t;

typedef struct api_remote api_remote_t;

/* NULL on OOM. The options are copied. */
api_remote_t *api_remote_new(const api_remote_options_t *opt);
/* Registers the three routes (before the server starts) and a /metrics collector. */
void api_remote_register_routes(api_remote_t *r, api_server_t *srv);
/* Call after the server has stopped (no request in flight). r may be NULL. */
void api_remote_free(api_remote_t *r);

/* ---- WriteRequest decoding (exposed for tests) ------------------------------------------------ */

typedef struct {
    uint8_t type; /* MetricMetadata.MetricType, 0..7 */
    const char *name, *help, *unit;
} remote_metadata_t;

typedef struct {
    storage_sample_t *samples; /* every sample of every series, series after series; each
                                  sample's labels point at its series' sorted, validated set */
    size_t nsamples;
    size_t nseries; /* TimeSeries messages with at least one sample */
    remote_metadata_t *metadata;
    size_t nmetadata;
    size_t nhistograms; /* native histogram samples skipped (not supported) */
    size_t nexemplars;  /* exemplars skipped */
} remote_write_req_t;

enum {
    REMOTE_OK = 0,
    REMOTE_ERR_DECODE = -1,  /* not a WriteRequest: truncated, wrong wire type, bad varint */
    REMOTE_ERR_INVALID = -2, /* well-formed but refused: labels, sample order, values */
    REMOTE_ERR_LIMIT = -3,   /* more than max_samples samples */
    REMOTE_ERR_NOMEM = -4,
};

/* Decodes and validates a WriteRequest (already snappy-decoded). Every label set is sorted and
 * checked: valid names, no duplicates, no empty values, valid UTF-8, a valid __name__; samples of
 * one series must have strictly increasing timestamps. All output lives in arena a. max_samples
 * = 0: no limit. Returns REMOTE_OK, or an error with a one-line reason in err. */
int remote_write_decode(const uint8_t *buf, size_t len, size_t max_samples, arena_t *a, remote_write_req_t *out,
                        char *err, size_t errlen);

#endif
