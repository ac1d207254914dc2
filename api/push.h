/*
 * push — the Pushgateway HTTP API (PUT/POST/DELETE /metrics/job/..., /api/v1/metrics,
 * /api/v1/status, admin wipe) and group expiry; see push.c for the request flow and
 * internal/push/registry.h for the semantics.
 */
#ifndef SLUICE_API_PUSH_H
#define SLUICE_API_PUSH_H

#include <stdbool.h>
#include <stdint.h>

#include "internal/expfmt/family.h"
#include "internal/push/registry.h"
#include "storage/storage.h"
#include "api/server.h"

typedef struct {
    storage_t *storage;         /* may be NULL (tests): nothing is stored */
    expfmt_limits_t limits;     /* parser limits per push */
    uint64_t max_decoded_bytes; /* after Content-Encoding; 0 = 32 MiB */
    int64_t group_ttl_ms;       /* see push_options_t */
    uint32_t missed_intervals;
    bool enable_admin_api;
    const char *flags_json;    /* for /api/v1/status; copied */
    int64_t (*clock_ms)(void); /* tests; NULL = wall clock */
    /* Heartbeats of the groups (api/availability), or NULL: see push_options_t.on_beat. */
    void (*on_beat)(void *ud, const push_beat_t *beat);
    void *beat_ud;
} api_push_options_t;

typedef struct api_push api_push_t;

/* With a storage, registers the groups as its state client (type 1): call between storage_new
 * and storage_recover, so recovery restores the groups. */
api_push_t *api_push_new(const api_push_options_t *opt);
/* Routes and the /metrics collectors (call before the server starts, before other collectors so
 * pushed groups come first in /metrics). */
void api_push_register_routes(api_push_t *p, api_server_t *srv);
/* Starts the expiry thread (once storage is recovered). */
int api_push_start(api_push_t *p);
/* Runs one expiry pass now (tests, and the thread). */
void api_push_expire_now(api_push_t *p);
void api_push_stop(api_push_t *p);
void api_push_free(api_push_t *p);
push_registry_t *api_push_registry(api_push_t *p);

/* Internal (exposed for tests/fuzz): "/metrics/job[@base64]/<job>{/<name>[@base64]/<value>}" ->
 * grouping labels, job included, sorted by name; strings in arena a. 0, or -1 with a
 * Pushgateway-style message in err (nothing written for a path outside /metrics/). */
int api__push_parse_path(const char *path, arena_t *a, labels_t *out, char *err, size_t errlen);

#endif
