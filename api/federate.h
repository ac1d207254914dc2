/*
 * federate — Prometheus' federation endpoint over sluice's storage, so a central Prometheus can
 * scrape sluice like any other Prometheus:
 *
 *   GET|POST /federate?match[]=<selector>[&match[]=...]
 *
 * The answer is the latest sample of every series that any match[] selects (the union, each
 * series once), no older than the lookback delta (--query.lookback-delta, 5m), as Prometheus
 * 2.42's web/federate.go answers it: text exposition format 0.0.4, one `# TYPE <name> untyped`
 * per metric name, families in metric-name order, labels in name order, empty label values left
 * out, external labels (--external-label) added to series that lack them and `instance=""` to
 * those without an instance, the sample's own timestamp in ms. A series whose latest sample is a
 * staleness marker is left out. `Accept:` asking for the delimited protobuf format gets it
 * (Prometheus' `application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily;
 * encoding=delimited`); everything else gets text. No match[] → 200 with an empty body and a bad
 * selector → 400 with the parser's message, as Prometheus 2.42. POST with a form body is accepted
 * too (Prometheus 2.42 answers 405): long match[] lists need not fit in a URL.
 *
 * Bounds: reading runs on federation's own threads, never on an HTTP loop. The matched series'
 * labels and samples are held (to sort them by name) in an arena charged, before each block is
 * taken, to a per-request budget (--query.max-memory-per-query: 422 beyond it) under the budget
 * queries share (--query.max-memory: 503 while others hold it); more than --query.max-samples
 * series is 422; --query.timeout is 503; a client that goes away cancels the read. The text is
 * rendered and sent in pieces of ~64 KiB, each once the previous one left for the kernel, so a
 * slow scraper holds one piece, whatever the response's size.
 */
#ifndef SLUICE_API_FEDERATE_H
#define SLUICE_API_FEDERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/server.h"
#include "internal/util/buf.h"
#include "storage/storage.h"

struct arena_budget;

typedef struct {
    api_server_t *srv; /* results hop back to its worker loops */
    storage_t *storage;
    int64_t lookback_ms;         /* --query.lookback-delta (0: 5m) */
    int64_t timeout_ms;          /* --query.timeout (0: 2m) */
    int64_t max_series;          /* --query.max-samples: series one request may hold (0: 50,000,000) */
    size_t max_memory;           /* --query.max-memory-per-query (0: none) */
    struct arena_budget *budget; /* --query.max-memory, shared with queries; may be NULL */
    const char *external_labels; /* --external-label values, "name=value" joined by '\n'; may be NULL */
    int threads;                 /* reader threads (0: 2) */
} api_federate_options_t;

typedef struct api_federate api_federate_t;

/* Starts the reader threads and registers a shutdown hook on srv. NULL + err on failure (a bad
 * external label included). Call before api_server_start. */
api_federate_t *api_federate_new(const api_federate_options_t *o, char *err, size_t errlen);
/* Registers GET|POST /federate and the sluice_federate_* metrics. */
void api_federate_register_routes(api_federate_t *f, api_server_t *srv);
/* The answer to match[0..n) as /federate would send it at now_ms (the text or protobuf body,
 * appended to out, uncompressed), read on the calling thread: for tests and tools. Returns 200, or
 * the status /federate would answer (400 bad selector, 422 a limit, 503) with the message in
 * err. */
int api_federate_render(api_federate_t *f, const char *const *match, size_t n, int64_t now_ms, bool proto, buf_t *out,
                        char *err, size_t errlen);
/* Stops and joins the threads; call after api_server_stop. f may be NULL. */
void api_federate_free(api_federate_t *f);

#endif
