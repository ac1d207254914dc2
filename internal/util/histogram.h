/*
 * histogram — a Prometheus histogram (cumulative `_bucket{le=...}`, `_sum`, `_count`) that any
 * thread may observe into without a lock: one atomic counter per bucket and an atomic sum.
 * Buckets are fixed at init (ascending upper bounds; +Inf is implicit). The exposition is
 * written by histogram_write; a scrape racing an observation may see the bucket counted and the
 * sum not yet (or the reverse), which Prometheus' own client libraries also allow.
 */
#ifndef SLUICE_UTIL_HISTOGRAM_H
#define SLUICE_UTIL_HISTOGRAM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/util/buf.h"

#define HISTOGRAM_MAX_BOUNDS 24

typedef struct {
    double bounds[HISTOGRAM_MAX_BOUNDS]; /* upper bounds, strictly ascending */
    size_t nbounds;
    _Atomic uint64_t counts[HISTOGRAM_MAX_BOUNDS + 1]; /* per bucket, not cumulative; last is +Inf */
    _Atomic uint64_t sum_bits;                         /* the sum, a double's bits */
} histogram_t;

/* bounds: nbounds ascending finite upper bounds (at most HISTOGRAM_MAX_BOUNDS). Returns 0, or -1
 * (nothing set) if they are too many, not finite or not strictly ascending. */
int histogram_init(histogram_t *h, const double *bounds, size_t nbounds);

/* Counts v in the first bucket whose bound is >= v (Prometheus' `le`); NaN counts in +Inf. */
void histogram_observe(histogram_t *h, double v);

/* Appends the histogram as exposition text: HELP and TYPE lines, then name_bucket{le=...},
 * name_sum, name_count. */
void histogram_write(const histogram_t *h, const char *name, const char *help, buf_t *out);

#endif
