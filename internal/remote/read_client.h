/*
 * read_client — the Prometheus remote read CLIENT: asks one remote store (Prometheus, Thanos,
 * VictoriaMetrics, Mimir, another sluice) for the series matching a selector over a time range,
 * for sluice's fall-through (storage/querier_fallthrough.h). The server side is api/remote.c.
 *
 * Protocol (Prometheus remote read 0.1.0): POST a snappy-compressed protobuf ReadRequest with one
 * Query (range, matchers, hints) and accepted_response_types; the answer is either
 *   SAMPLES               Content-Type application/x-protobuf, snappy block of a ReadResponse
 *                         (TimeSeries with labels and samples), or
 *   STREAMED_XOR_CHUNKS   Content-Type application/x-streamed-protobuf; proto=prometheus.
 *                         ChunkedReadResponse: frames of uvarint length, big-endian CRC-32C of
 *                         the message, ChunkedReadResponse (ChunkedSeries with XOR chunks). One
 *                         series may be split over several frames.
 * The client decides by the response's Content-Type, so a server that ignores the preference
 * (or only knows SAMPLES) still works. Both are decoded into one shape: series sorted by labels,
 * each with its samples in time order, duplicates (same timestamp) dropped, XOR chunks checked
 * while they are decoded (storage/chunk_xor.h never reads past a chunk).
 *
 * Bounds: the response body is kept up to max_response_bytes (more is an error, not a silent
 * truncation), snappy's declared length is checked against the same bound before anything is
 * allocated, and decoding stops with an error past max_samples samples.
 *
 * Target spec (one --remote-read.url value): the URL, then optional space-separated options:
 *   name=<name>                     in warnings, errors and logs (default: host:port)
 *   header=<Name>:<value>           extra request header (repeatable)
 *   basic-auth-username=<user>      with basic-auth-password-file=<path> (or basic-auth-password=)
 *   bearer-token-file=<path>        re-read for each request (rotation works)
 *   response-type=streamed|samples  streamed (default) lists STREAMED_XOR_CHUNKS first, SAMPLES
 *                                   as fallback; samples asks for SAMPLES only
 *   tls-ca-file=, tls-cert-file=, tls-key-file=, tls-server-name=, tls-insecure-skip-verify=
 *                                   override the --remote-read.tls-* defaults (https:// only;
 *                                   parsed by httpc_tls_spec_parse, as for remote write)
 *
 * https:// targets speak TLS (internal/net/httpc): the server certificate is verified against the
 * CA file (default: the system store), including its name; a client certificate gives mTLS. The
 * files are loaded by remote_read_client_new (a bad one stops start-up); a failed handshake is a
 * REMOTE_READ_ERR_UNAVAILABLE whose message says why ("127.0.0.1:9090: TLS handshake failed:
 * certificate verify failed (unable to get local issuer certificate)").
 *
 * Thread safety: a client may be used by any number of threads at once (idle keep-alive
 * connections are pooled under a mutex; each request holds its own connection).
 */
#ifndef SLUICE_REMOTE_READ_CLIENT_H
#define SLUICE_REMOTE_READ_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/labels/matcher.h"
#include "internal/net/tls.h"
#include "internal/util/arena.h"
#include "storage/querier.h"

/* Outcome of a query; the fall-through maps these onto querier_err_kind_t. */
enum {
    REMOTE_READ_OK = 0,
    REMOTE_READ_ERR_UNAVAILABLE = -1,  /* connect/timeout/network error, or a 5xx/429 answer */
    REMOTE_READ_ERR_BAD_RESPONSE = -2, /* a 4xx answer, or bytes that do not decode */
    REMOTE_READ_ERR_LIMIT = -3,        /* the answer is larger than the configured bounds */
    REMOTE_READ_ERR_NOMEM = -4,
};

typedef struct {
    const char *spec;                   /* see above */
    int64_t timeout_ms;                 /* one request, connect to last byte; <= 0: 30 s */
    size_t max_response_bytes;          /* 0: 256 MiB */
    uint64_t max_samples;               /* 0: 50,000,000 */
    const tls_client_options_t *tls;    /* https:// targets' defaults (--remote-read.tls-*), read here;
                                           NULL = system store, verification on */
} remote_read_client_opts_t;

typedef struct remote_read_client remote_read_client_t;

/* Parses the spec. NULL with a message in err on a bad spec (or OOM). */
remote_read_client_t *remote_read_client_new(const remote_read_client_opts_t *o, char *err, size_t errlen);
void remote_read_client_free(remote_read_client_t *c);
const char *remote_read_client_name(const remote_read_client_t *c);
const char *remote_read_client_url(const remote_read_client_t *c);

typedef struct {
    int64_t t;
    double v;
} remote_read_sample_t;

typedef struct {
    labels_t labels;               /* sorted by name */
    remote_read_sample_t *samples; /* time order, unique timestamps */
    size_t n;
} remote_read_series_t;

typedef struct {
    remote_read_series_t *series; /* sorted by labels, unique */
    size_t n;
    uint64_t samples; /* total */
    bool streamed;    /* the answer was STREAMED_XOR_CHUNKS */
} remote_read_result_t;

/* Reads the series matching ms (n >= 1) with samples in [mint, maxt] (hints optional, passed on
 * as ReadHints). Everything in out lives in arena a. Returns REMOTE_READ_OK or a REMOTE_READ_ERR_*
 * with a message in err. */
int remote_read_client_query(remote_read_client_t *c, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                             const querier_hints_t *hints, arena_t *a, remote_read_result_t *out, char *err,
                             size_t errlen);

/* ---- pieces exposed for unit tests ---------------------------------------------------------- */

/* Decodes a response body (as received: snappy SAMPLES or streamed frames, told by streamed).
 * Same result and bounds as remote_read_client_query. */
int remote_read__decode(const uint8_t *body, size_t len, bool streamed, size_t max_bytes, uint64_t max_samples,
                        arena_t *a, remote_read_result_t *out, char *err, size_t errlen);

#endif
