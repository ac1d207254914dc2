/*
 * rollup — the roll-up tier: fixed-resolution aggregates of every series in SQLite (the file the
 * catalog opened), kept for long retentions (default "1m:15d,1h:400d").
 *
 * Each bucket [ts, ts+res) (ts a multiple of res in Unix ms) holds count, sum, min, max, last and
 * the reset-adjusted counter increase. Ingest threads call rollup_add_samples, which only updates
 * the open in-memory bucket of each series and resolution (locks sharded by series id). One
 * writer thread - the only SQLite writer - moves closed buckets to disk in batched transactions
 * every flush interval, checkpoints the open buckets so a restart or crash loses no more than a
 * checkpoint interval (and re-feeding WAL-replayed samples is harmless: samples at or before a
 * series' last seen time are ignored), and deletes data past retention in small slices.
 *
 * Sample rules (also in docs/storage-rollups.md):
 *  - staleness markers (bits 0x7ff0000000000002) are not aggregated; they end counter continuity
 *    (the next sample's increase starts from zero).
 *  - a plain NaN is a value: it counts, becomes `last`, and poisons `sum`; min/max skip it unless
 *    every sample of the bucket is NaN (as Prometheus' min_over_time/max_over_time); for
 *    `increase` it is skipped (continuity runs from the last non-NaN value).
 *  - increase over a bucket = sum over each sample v in the bucket with predecessor p (possibly in
 *    an earlier bucket) of (v >= p ? v - p : v)  (Prometheus counter-reset rule).
 *  - at most one sample per series per second is aggregated, the LAST one received for that second
 *    (the raw tier's same-second replace): the newest sample is held back until a sample of a
 *    later second arrives or its bucket closes; rollup_read shows it as if aggregated.
 *  - a sample in a second before the newest seen second is ignored, and so is one in the same
 *    second as an already aggregated sample (replays, duplicates).
 *
 * Thread safety: every function may be called from any thread, except open/close.
 */
#ifndef SLUICE_STORAGE_ROLLUP_H
#define SLUICE_STORAGE_ROLLUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/catalog.h"

#define ROLLUP_MAX_RESOLUTIONS 8
#define ROLLUP_DEFAULT_RESOLUTIONS "1m:15d,1h:400d"

typedef struct {
    int64_t res_ms;       /* bucket width */
    int64_t retention_ms; /* buckets older than now - retention are deleted */
} rollup_resolution_t;

typedef struct {
    rollup_resolution_t v[ROLLUP_MAX_RESOLUTIONS]; /* strictly increasing res_ms */
    size_t n;
} rollup_resolutions_t;

/* Parses "1m:15d,1h:400d" (Prometheus durations, comma separated, resolutions strictly
 * increasing, each a multiple of the previous and of 1s, retention >= resolution).
 * Returns 0, or -1 with a message in err. */
int rollup_parse_resolutions(const char *s, rollup_resolutions_t *out, char *err, size_t errlen);

typedef struct {
    const char *resolutions;        /* NULL = ROLLUP_DEFAULT_RESOLUTIONS */
    int64_t flush_interval_ms;      /* writer wake-up period; 0 = 1000 */
    int64_t checkpoint_interval_ms; /* open buckets written at least this often; 0 = 300000 (the
                                     * store also checkpoints them at every snapshot) */
    bool no_thread;                 /* tests: no writer thread, call rollup_flush yourself */
    /* tests: each writer cycle sweeps and walks every state, as before the due heap (the reference
     * it is tested against) */
    bool sweep_every_state;
    /* tests: the first closed-list position of every shard (0), to cross the positions' wrap */
    uint32_t closed_pos_start;
    /* The writer's retention `now` (ms since the epoch): the store's clock, so a store on a test
     * clock is not aged by the real one. NULL = wall clock. Called from the writer thread. */
    int64_t (*clock_ms)(void);
} rollup_config_t;

typedef struct rollup rollup_t;

/* Opens the roll-up tables in the catalog's database, loads the checkpointed open buckets and
 * starts the writer thread. cat must outlive the roll-up. Returns NULL with a message in err. */
rollup_t *rollup_open(catalog_t *cat, const rollup_config_t *cfg, char *err, size_t errlen);
/* Stops the writer, writes every closed bucket and checkpoints every open (partial) bucket, then
 * frees everything. Samples of a partial bucket that arrive after the restart merge into it. */
void rollup_close(rollup_t *r);

typedef struct {
    uint64_t series_id;
    int64_t t; /* ms */
    double v;
} rollup_sample_t;

/* Aggregates samples into the open buckets (any order across series; per series, increasing t).
 * Cheap: a shard lock and a hash lookup per sample, no I/O. The series must have been passed to
 * catalog_add_series before (or the writer will still store its buckets, with no catalog row). */
void rollup_add_samples(rollup_t *r, const rollup_sample_t *s, size_t n);
/* The same, for a caller that keeps one pointer-sized slot per series (the head's series): each
 * slot remembers where the series' roll-up state lives, so the sample skips the hash lookup
 * (a chain walk whose head usually misses the cache). hints[i] is the slot of s[i].series_id:
 * NULL at first, afterwards only what this function wrote there for that series (never copied
 * between series). A slot may go stale (its state evicted after the series went quiet, the
 * record reused): states come from slabs that live until rollup_close, so the pointer is
 * checked against the record's id and liveness, under the shard lock, and a stale one costs
 * one lookup. Slots must not be used after rollup_close. */
void rollup_add_samples_hinted(rollup_t *r, const rollup_sample_t *s, size_t n, void **hints);

/* Synchronously runs one writer cycle: catalog pending rows, closed buckets, and (if
 * checkpoint) every open bucket. Returns 0 or -1. */
int rollup_flush(rollup_t *r, bool checkpoint);
/* The writer thread's cycle (and tests'): rollup_flush writing at most about catalog_max of the
 * catalog's pending rows (0: all). A cycle that leaves rows pending writes only rows
 * (*rows_only): buckets and states wait for the cycle that writes the last of them, so a series'
 * row is never later than its first roll-up. */
int rollup__flush_some(rollup_t *r, bool checkpoint, size_t catalog_max, bool *rows_only);

/* Closes, in memory, every open bucket that ends at or before `before_ms` (the writer does this
 * by itself for buckets more than one resolution behind the newest sample seen, so series that
 * stop sending still get their last bucket written). */
void rollup_close_buckets_before(rollup_t *r, int64_t before_ms);

/* One slice of a retention pass: deletes stored buckets older than now_ms - retention (blobs:
 * once their whole span is older), touching at most `budget` blobs (or, for the plain hourly
 * rows, `budget` series) per call. Returns 1 if the pass has more to do (call again), 0 when the
 * pass is complete, -1 on error. The writer runs a pass every hour (wall clock), judging age
 * by the configured clock (rollup_config_t.clock_ms); tests may call it with their own now. */
int rollup_enforce_retention(rollup_t *r, int64_t now_ms, int budget);

typedef struct {
    int64_t ts; /* bucket start, multiple of the resolution */
    uint64_t count;
    double sum, min, max, last;
    double increase; /* reset-adjusted counter increase */
} rollup_bucket_t;

/* Growable list of buckets. Zero-initialise; free with rollup_buckets_free. */
typedef struct {
    rollup_bucket_t *v;
    size_t n, cap;
} rollup_buckets_t;

void rollup_buckets_free(rollup_buckets_t *b);

/* Appends to out the buckets of series_id at resolution index res_idx whose start ts lies in
 * [mint, maxt], in time order: stored ones, ones waiting for the writer, and the open ones.
 * Returns 0 or -1. */
int rollup_read(rollup_t *r, uint64_t series_id, size_t res_idx, int64_t mint, int64_t maxt, rollup_buckets_t *out);

/* A read session for many series (a query's select): one pooled SQLite connection with its
 * prepared statements and ONE read transaction across reads, renewed only when the writer has
 * committed since (so each read still sees every bucket exactly once, as rollup_read does). A
 * series whose in-memory state knows its stored buckets all start after maxt is answered from
 * memory without SQLite. Use from one thread at a time; close before rollup_close. NULL on error.
 * Closing ends the transaction (a reader kept open holds its snapshot, which keeps WAL
 * checkpoints from passing it). */
typedef struct rollup_reader rollup_reader_t;
rollup_reader_t *rollup_reader_open(rollup_t *r);
/* Same contract as rollup_read. */
int rollup_reader_read(rollup_reader_t *rd, uint64_t series_id, size_t res_idx, int64_t mint, int64_t maxt,
                       rollup_buckets_t *out);
void rollup_reader_close(rollup_reader_t *rd);

const rollup_resolutions_t *rollup_resolutions(const rollup_t *r);
/* The resolution to read for a query over [mint, ...] evaluated at now_ms with step step_ms: the
 * finest one whose retention covers mint and whose width is <= step; if none has width <= step,
 * the finest that covers mint; if none covers mint, the coarsest. Returns an index. */
size_t rollup_pick_resolution(const rollup_resolutions_t *rs, int64_t now_ms, int64_t mint, int64_t step_ms);

typedef struct {
    uint64_t series;          /* series with in-memory state */
    uint64_t buckets_written; /* since open */
    uint64_t samples_ignored; /* t <= newest seen */
    uint64_t flushes, flush_errors;
    uint64_t reads_from_memory; /* reader reads that knew the disk holds nothing in range */
} rollup_stats_t;

void rollup_get_stats(rollup_t *r, rollup_stats_t *out);

#endif
