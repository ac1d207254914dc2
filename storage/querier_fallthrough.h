/*
 * querier_fallthrough — the local store (storage/querier_tiered.h) with history it no longer
 * holds read from remote stores (any querier: internal/remote/remote_querier.h in the daemon),
 * as one querier (querier.h). This is what PromQL queries (/api/v1/query, query_range, series,
 * labels) read when --remote-read.url is set (storage_querier_fallthrough).
 *
 * local_min is the oldest timestamp the local store holds, raw samples and roll-ups together
 * (storage_min_time; INT64_MAX when it holds nothing).
 *
 * Default (read_recent false): the remote is asked only when a select reaches before local_min,
 * and only for [mint, min(maxt, local_min - 1)]. A series both sides have is the remote's samples
 * before the seam, then the local ones; the seam is local_min or the series' first local sample
 * if earlier, so the local store wins wherever it has data and nothing is counted twice. The
 * local chunks pass through untouched (roll-up markers included); only remote samples are
 * re-encoded.
 *
 * read_recent: the remote is asked for the whole [mint, maxt] and the two are merged by
 * timestamp, the local sample winning a tie. Where the local series holds only roll-ups
 * (synthetic samples before querier_series_t.rollup_until) and the remote has raw samples there,
 * the remote's raw samples replace the roll-ups (no mixing of bucket aggregates with raw data).
 *
 * Remote failures follow the remote querier's policy: warnings (passed on through
 * querier_set_warnings, the local data still answers) or the set's error with its kind.
 * label_names / label_values: the union of both sides under the same range rule; a failing remote
 * in warn mode contributes nothing.
 */
#ifndef SLUICE_STORAGE_QUERIER_FALLTHROUGH_H
#define SLUICE_STORAGE_QUERIER_FALLTHROUGH_H

#include <stdbool.h>
#include <stdint.h>

#include "storage/querier.h"

typedef struct {
    querier_t *local;  /* owned from here on */
    querier_t *remote; /* owned from here on */
    int64_t local_min; /* INT64_MAX: the local store holds nothing */
    bool read_recent;
} querier_fallthrough_opts_t;

/* NULL on OOM (both queriers are closed then). Close with querier_close. */
querier_t *querier_fallthrough_new(const querier_fallthrough_opts_t *o);

#endif
