/*
 * querier_tiered — the querier storage_querier hands out: the raw tier (head) wherever it holds
 * the data, the roll-up tier (SQLite) only for what raw retention no longer covers, stitched per
 * series, and the series catalog to find series that have left memory. Implements querier.h.
 *
 * Tier choice for select(ms, mint, maxt, hints) (DESIGN.md, Storage tiers item 4). Raw samples are
 * the answer wherever they exist: PromQL over data the raw tier holds must answer exactly as
 * Prometheus does, at any step. Let raw_start = head_min_valid_time (oldest time the raw tier
 * keeps), res_i the roll-up widths:
 *   - history mode: when mint < raw_start: each series reads roll-ups (the finest resolution
 *     covering mint whose width fits the range; a coarser one covering mint when every window
 *     of the query is whole buckets of it and the function is min/max/sum/count_over_time, where
 *     the coarse buckets give the same exact answer from far fewer buckets: windows_whole in
 *     the .c file) up to where its raw data starts, raw after;
 *     series that are no longer in memory are found in the catalog and read from roll-ups only.
 *     Only this mode touches roll-ups unasked; querier_series_t.rollup_until tells the engine
 *     which samples are synthetic, so it can warn where the answer is approximate
 *     (docs/storage-rollups.md has the per-function exactness table).
 *   - step mode, only with hints->rollup_step (an explicit, approximate opt-in: the API's
 *     `rollups=step` parameter): the coarsest resolution i whose retention covers mint, with
 *     hints->step >= res_i and a range that still sees enough buckets (range >= 2 res_i for
 *     counter functions, >= res_i for the other *_over_time functions; plain selectors (range 0)
 *     only while res_i <= 5m, PromQL's default lookback, or they would show gaps). Every series
 *     reads complete buckets of res_i up to the last bucket boundary before min(maxt, now), raw
 *     samples after.
 *   - otherwise raw only (also for every store without roll-ups).
 * Stitching: for a series whose raw data starts at B (B = first raw chunk's mint; in step mode
 * at least the boundary above), only buckets with ts + res <= B are used and only raw samples
 * with t >= B, so nothing is counted twice; a raw chunk straddling B is re-encoded from B on,
 * chunks after B are passed through byte for byte. When B cuts a bucket of a coarser
 * resolution than the finest, buckets of the finest resolution fill [floor(B, res), B) (a
 * "tail" of synthetic samples at their own last milliseconds), so the samples of the cut bucket
 * before B are not lost; rollup_res_ms stays the coarse width, the one whose window alignment
 * decides exactness (a window ending on a coarse boundary never ends inside the tail).
 *
 * Synthetic samples: one per bucket at ts + res - 1 ms, the bucket's last millisecond. The END
 * and not the start, because a sample stands for data up to its timestamp: at the start it would
 * show PromQL (which looks back from each evaluation time) data from up to one bucket in the
 * future, and a range [T - r, T] would count a bucket that extends past T. The last millisecond
 * and not ts + res, so a synthetic sample never shares a timestamp with a raw sample at B.
 *
 * The value of a synthetic sample depends on hints->func (querier_tiered_agg):
 *   rate, increase, irate, resets          -> a synthetic counter: the running sum of the
 *                                             buckets' reset-adjusted `increase`, anchored so
 *                                             that its last value equals the last bucket's
 *                                             `last` (for a counter without resets the synthetic
 *                                             values ARE the real values), so rate()/increase()
 *                                             over it, and across the stitch into raw samples,
 *                                             see the true increase and no false reset.
 *                                             resets() over roll-ups is therefore 0 (the buckets
 *                                             keep no reset count).
 *   min_over_time / max_over_time          -> min / max
 *   sum_over_time                          -> sum
 *   count_over_time                        -> count (the number of raw samples in the bucket; an
 *                                             engine must SUM these values over roll-up samples,
 *                                             querier_series_t.rollup_until tells which)
 *   avg_over_time, stddev_over_time,
 *   stdvar_over_time, quantile_over_time   -> sum / count, the bucket mean (avg_over_time is
 *                                             exact when buckets hold equal counts, as with a
 *                                             regular push interval)
 *   anything else, and plain selectors     -> last (a sub-sampling of the real series at the
 *                                             bucket width: value-at-time functions stay honest)
 *
 * Label names / values honour [mint, maxt]: the head's index when the range covers everything
 * the head holds, else the head series that have data in range; plus, for ranges older than
 * raw_start, the catalog (series seen within the range, matchers applied to their labels).
 *
 * Catalog matcher resolution: candidates come from the most selective lookup available (all
 * non-empty `=` pairs together; else a `=~` literal alternation; else any matcher that cannot
 * match "" via "has label name"; else every series), then every matcher is applied to the
 * candidate's labels with Prometheus semantics (absent label = "").
 */
#ifndef SLUICE_STORAGE_QUERIER_TIERED_H
#define SLUICE_STORAGE_QUERIER_TIERED_H

#include <stdint.h>

#include "storage/catalog.h"
#include "storage/head.h"
#include "storage/querier.h"
#include "storage/rollup.h"

typedef struct {
    head_t *head;                /* required */
    rollup_t *rollup;            /* NULL: raw only */
    catalog_t *cat;              /* NULL: no series outside the head */
    int64_t (*now_ms)(void *ud); /* the store's clock */
    void *ud;
} querier_tiered_opts_t;

/* NULL on OOM. Close with querier_close. */
querier_t *querier_tiered_new(const querier_tiered_opts_t *o);

typedef enum {
    QUERIER_AGG_LAST = 0,
    QUERIER_AGG_MEAN,
    QUERIER_AGG_MIN,
    QUERIER_AGG_MAX,
    QUERIER_AGG_SUM,
    QUERIER_AGG_COUNT,
    QUERIER_AGG_COUNTER,
} querier_agg_t;

/* Which bucket aggregate stands in for raw samples under function func (NULL = plain selector). */
querier_agg_t querier_tiered_agg(const char *func);

#endif
