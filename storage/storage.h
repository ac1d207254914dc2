/*
 * storage — the facade the rest of sluice uses: open/recover, append, query, snapshot, close,
 * limits, statistics. It owns the head (raw tier), the WAL, the snapshot file, the series
 * catalog and the roll-ups, and keeps them consistent:
 *
 *   append:   resolve/create series (ids from the catalog; or by the caller's series refs, see
 *             storage_append_refs) -> check rules -> WAL (series, then samples) -> head ->
 *             roll-ups. A sample is acknowledged only once it is in the WAL.
 *   open:     catalog load (label hash -> id) -> snapshot load (a damaged snapshot is set aside
 *             and logged; recovery uses the previous snapshot, or the damaged one's intact
 *             records, or the WAL alone) -> WAL replay -> ready.
 *   snapshot: WAL cut under a brief exclusive lock, then the head is written without blocking
 *             appenders; once the snapshot is durable and verified, the one before it is kept as
 *             the fallback and the WAL segments neither needs are deleted.
 *   close:    snapshot, then everything is closed.
 *   query:    storage_querier picks the tier per query and series (storage/querier_tiered.h):
 *             raw samples, roll-ups past the raw retention or for steps >= a roll-up width,
 *             stitched; series that left memory are found through the catalog.
 *   state:    other subsystems persist their own state through the same snapshot + WAL
 *             (storage_register_state / storage_log_state, below).
 *
 * With path == NULL the store is memory-only (no WAL, snapshot, catalog or roll-ups): the same
 * API for tests and tools.
 *
 * Thread safety: every function except storage_open/storage_close may be called from any thread.
 */
#ifndef SLUICE_STORAGE_STORAGE_H
#define SLUICE_STORAGE_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/util/arena.h"
#include "internal/util/buf.h"
#include "storage/head.h"
#include "storage/index.h"
#include "storage/querier.h"

/* Error vocabulary (0 ok, negative error). The HTTP mapping callers should use is noted. */
enum {
    STORAGE_OK = 0,
    STORAGE_ERR_NOMEM = -1,        /* 500 */
    STORAGE_ERR_IO = -2,           /* WAL write failed; retry later: 503 */
    STORAGE_ERR_OUT_OF_ORDER = -3, /* sample older than the series' newest second: 400 */
    STORAGE_ERR_TOO_OLD = -4,      /* before the raw retention window: 400 */
    STORAGE_ERR_MAX_SERIES = -5,   /* storage.max-series reached, new series refused: 503 for
                                      remote write (retry later), 400 for push */
    STORAGE_ERR_LIMIT = -6,        /* per-request series/sample limit exceeded: 400 */
    STORAGE_ERR_BAD_LABELS = -7,   /* invalid/duplicate label names, missing __name__: 400 */
    STORAGE_ERR_NOT_READY = -8,    /* recovery still running: 503 */
    STORAGE_ERR_TOO_NEW = -9,      /* more than max_future_ms after now: 400 */
};

typedef struct storage storage_t;

typedef struct {
    const char *path;                 /* data directory (created if missing); NULL = memory only */
    int64_t retention_raw_ms;         /* 0 = 2h */
    int64_t block_ms;                 /* 0 = 15m */
    bool wal_fsync_always;            /* fsync before acknowledging (default: group commit) */
    uint32_t wal_fsync_interval_ms;   /* 0 = 1000 */
    uint64_t max_series;              /* 0 = unlimited */
    uint32_t max_series_per_request;  /* 0 = unlimited */
    uint32_t max_samples_per_request; /* 0 = unlimited */
    int64_t max_future_ms;            /* samples further ahead of the clock are refused; 0 = no limit */
    const char *rollups;              /* NULL = ROLLUP_DEFAULT_RESOLUTIONS, "" = no roll-ups */
    int64_t snapshot_interval_ms;     /* periodic snapshot; 0 = 1h, < 0 = only on close */
    bool no_background;               /* tests: no housekeeping thread and no roll-up writer thread
                                         (call storage_housekeep, storage_flush) */
    int64_t (*clock_ms)(void);        /* tests: NULL = wall clock (CLOCK_REALTIME) */
} storage_options_t;

void storage_options_default(storage_options_t *o);

/* Allocates the store and opens nothing yet (so the daemon can answer /-/ready while recovering).
 * The options' strings are copied. NULL with a message in err on failure. */
storage_t *storage_new(const storage_options_t *o, char *err, size_t errlen);
/* Opens catalog, snapshot, WAL and roll-ups and recovers; sets ready. Call once. Returns 0, or a
 * STORAGE_ERR_* with a message (the store stays not ready). */
int storage_recover(storage_t *s, char *err, size_t errlen);
/* storage_new + storage_recover. */
storage_t *storage_open(const storage_options_t *o, char *err, size_t errlen);
bool storage_ready(const storage_t *s);
/* Writes a final snapshot (if ready and on disk), stops the background thread and frees
 * everything. s may be NULL. */
void storage_close(storage_t *s);

/* One sample to append. labels need not be sorted; empty-valued labels are dropped (as absent). */
typedef struct {
    labels_t labels;
    int64_t t; /* ms */
    double v;
} storage_sample_t;

typedef struct {
    size_t accepted;     /* samples stored */
    size_t failed;       /* samples refused */
    size_t first_failed; /* index of the first refused sample (valid if failed > 0) */
    int first_error;     /* its STORAGE_ERR_* */
    char msg[512];       /* human-readable reason naming the first refused sample */
} storage_append_result_t;

/* Appends a batch. Valid samples are stored even when others are refused (as Prometheus does);
 * the return value is STORAGE_OK if all were stored, else the first error (STORAGE_ERR_IO and
 * STORAGE_ERR_LIMIT / NOT_READY mean nothing was stored). res may be NULL. Does not modify
 * samples. */
int storage_append(storage_t *s, const storage_sample_t *samples, size_t n, storage_append_result_t *res);

/* A series reference: where a series lives in the head (index_ref_t). A caller that appends the
 * same series again and again (a push group re-pushing its metrics) keeps the ref each sample
 * resolved to and hands it back next time, skipping label normalisation, hashing and the index
 * lookup. A ref is a hint, never trusted: it is used only if the index slot it names still holds
 * a series with its id (ids are never shared by two label sets: the catalog maps a label set to
 * one id for good), checked under the shard's read lock as a label lookup is. A series removed
 * since (expiry, retention), or a slot reused by another series, makes the ref miss, and the
 * sample takes the label path. id 0 means "no ref" (ids start at 1). */
typedef index_ref_t storage_ref_t;

/* storage_append with refs (may be NULL): on entry refs[i] is sample i's series ref from an
 * earlier append of the same labels, or zeroed when unknown; the caller must only pass a ref that
 * some earlier call returned for exactly samples[i].labels. On return refs[i] is the ref sample i
 * resolved to, zeroed when its series could not be resolved (invalid labels, series limit).
 * Every refusal (limits, out of order, too old, too new) is exactly as storage_append's. */
int storage_append_refs(storage_t *s, const storage_sample_t *samples, size_t n, storage_ref_t *refs,
                        storage_append_result_t *res);

/* The series of an append to come, without its samples: for every sample whose refs[i] is zero,
 * finds or creates its series (new ones logged to the WAL and the catalog as an append would)
 * and sets refs[i]; a sample refused on its own (labels, --storage.max-series) keeps a zero ref.
 * Returns STORAGE_OK; the refusal of the whole request (not ready, samples or series per
 * request), with nothing created; or STORAGE_ERR_NOMEM / STORAGE_ERR_IO. For a caller that
 * serializes its appends under a lock of its own (the push path's): creating series is most of
 * a first push's cost, and done before that lock it runs on every worker at once. A series made
 * here that never gets a sample (its append is refused after all) is swept as any empty one. */
int storage_prepare_refs(storage_t *s, const storage_sample_t *samples, size_t n, storage_ref_t *refs);

/* The roll-up step of an append, left for later by storage_append_refs_defer. */
typedef struct storage_rollup_job storage_rollup_job_t;

/* storage_append_refs for a caller that serializes its appends under a lock of its own (the push
 * path's): all of it (WAL, head; the result and refs are the same) except feeding the applied
 * samples to the roll-ups, which *job holds for storage_append_rollups (NULL: nothing to do).
 * Run the job once that lock is released: the roll-ups of one append then overlap the next
 * append. Jobs run in the order their appends made them (a job waits for the ones before it), so
 * the roll-ups see each series' samples in the order the head took them. Every job must be run,
 * or the later ones wait forever. */
int storage_append_refs_defer(storage_t *s, const storage_sample_t *samples, size_t n, storage_ref_t *refs,
                              storage_append_result_t *res, storage_rollup_job_t **job);

/* Feeds a deferred append's samples to the roll-ups (after every earlier job) and frees the job.
 * job may be NULL. */
void storage_append_rollups(storage_t *s, storage_rollup_job_t *job);

/* A querier over everything stored (querier.h; tiers and synthetic roll-up samples:
 * storage/querier_tiered.h); close with querier_close. NULL on OOM. */
querier_t *storage_querier(storage_t *s);

/* ---- fall-through to remote stores (storage/querier_fallthrough.h) ---------------------------
 *
 * With a fall-through set, storage_querier_fallthrough reads what the store no longer holds
 * (before storage_min_time) from remote stores, through the querier `open` returns (one per
 * query; the daemon's is internal/remote/remote_querier.h). Only PromQL and the series/labels
 * API read through it: rules, the dashboard and sluice's own remote read endpoint stay local
 * (a remote read that fell through could loop between two stores reading each other). */
typedef struct {
    querier_t *(*open)(void *ud); /* NULL on OOM */
    void *ud;
    bool read_recent; /* ask the remote for the whole range, not only before storage_min_time */
} storage_fallthrough_t;

/* Call before the store serves queries; ft is copied (NULL: none). */
void storage_set_fallthrough(storage_t *s, const storage_fallthrough_t *ft);
/* storage_querier, plus the remote history when a fall-through is set. NULL on OOM. */
querier_t *storage_querier_fallthrough(storage_t *s);
/* Oldest timestamp the store holds data for: the oldest raw sample in memory, or where roll-ups
 * still hold data if that is earlier (from the catalog's first-seen times, bounded by the longest
 * roll-up retention; cached for STORAGE_MIN_TIME_CACHE_MS). INT64_MAX when it holds nothing. */
int64_t storage_min_time(storage_t *s);
#define STORAGE_MIN_TIME_CACHE_MS 30000

/* Writes a snapshot now (no-op for memory-only stores). Returns 0 or a STORAGE_ERR_*. */
int storage_snapshot(storage_t *s, char *err, size_t errlen);
/* Writes pending catalog rows and closed roll-up buckets to SQLite now (the roll-up writer does
 * this every second by itself). For tests and tools. Returns 0 or STORAGE_ERR_IO. */
int storage_flush(storage_t *s);
/* One slice of background work (expiry, periodic snapshot); what the background thread does
 * every second. For tests with no_background. */
void storage_housekeep(storage_t *s);

/* Current time as the store sees it (the clock option). */
int64_t storage_now_ms(const storage_t *s);
/* Oldest timestamp the raw tier accepts. */
int64_t storage_min_valid_time(const storage_t *s);

/* /api/v1/status/tsdb data: head stats and the index's top-`top` tables (in arena a). */
typedef struct {
    head_stats_t head;
    index_stats_t index;
} storage_tsdb_stats_t;

int storage_tsdb_stats(storage_t *s, size_t top, arena_t *a, storage_tsdb_stats_t *out);
/* Appends sluice_storage_* self-metrics in Prometheus text format 0.0.4. */
void storage_write_metrics(storage_t *s, buf_t *b);

/* ---- persisted state of other subsystems (push gateway groups, ...) -------------------------
 *
 * A subsystem whose state must survive a restart and kill -9 registers a client for one type
 * byte (1..255, its own; see the registry below) before storage_recover, then logs every change
 * as a delta with storage_log_state, which is durable exactly like samples (in the WAL before it
 * returns, fsync'd by the group commit or before returning with wal_fsync_always).
 *
 * Recovery (inside storage_recover, before ready): restore(ud, data, len, true) once with the
 * full state the snapshot recovery loaded holds for this type (skipped when there is none, or
 * its record was lost to damage), then restore(ud, data, len, false) for each further piece of
 * that checkpoint (see below) and every delta of the type logged after that snapshot, in log
 * order. A full record replaces whatever the client has.
 *
 * Snapshots: every storage_snapshot calls checkpoint(ud, sink) right after cutting the WAL; the
 * client writes its complete state with storage_state_put: the first piece it puts is its full
 * state, each later one a delta on top of it, so a large state never has to sit in one buffer.
 * Deltas logged before the cut are then dropped with the old WAL segments. The call is made outside the store's locks (so a client may hold its own
 * lock while calling storage_log_state without deadlocking against a snapshot); the client must
 * take its own lock in checkpoint so the state it writes includes every delta whose
 * storage_log_state has returned. A delta logged concurrently with a snapshot may therefore be
 * both inside the checkpoint and replayed after it: deltas must be safe to re-apply in order on
 * top of a state that already contains them (set/replace/delete of a key is; "add 1" is not).
 *
 * If checkpoint fails (non-zero) the whole snapshot fails and the WAL keeps everything.
 * A restore error is logged and recovery goes on (the record is skipped).
 * A snapshot state record of a type nobody registered is logged and dropped.
 * Memory-only stores accept registrations and deltas and persist nothing.
 *
 * Type registry: 1 = push gateway groups (api/push). */
typedef struct storage_state_sink storage_state_sink_t;
typedef struct {
    void *ud;
    int (*restore)(void *ud, const void *data, size_t len, bool full);
    int (*checkpoint)(void *ud, storage_state_sink_t *sink);
} storage_state_client_t;

/* Writes one piece of a checkpoint into the snapshot (copied; at most 256 MiB). Returns
 * STORAGE_OK or STORAGE_ERR_IO (the checkpoint should then return non-zero). */
int storage_state_put(storage_state_sink_t *sink, const void *data, size_t len);

/* Call between storage_new and storage_recover. The client struct is copied. Returns STORAGE_OK,
 * or -1 (type 0, type already registered, NULL callbacks, or recovery already started). */
int storage_register_state(storage_t *s, uint8_t type, const storage_state_client_t *c);
/* Appends one delta of `type` (registered) to the WAL. Returns STORAGE_OK once it is logged,
 * STORAGE_ERR_NOT_READY during recovery, STORAGE_ERR_IO (message in err; retry later: 503), or
 * STORAGE_ERR_LIMIT if len is too large for one WAL record (64 MiB). err may be NULL. */
int storage_log_state(storage_t *s, uint8_t type, const void *data, size_t len, char *err, size_t errlen);

/* ---- WAL readers (the remote-write sender, api/forward) -------------------------------------
 *
 * A reader follows <path>/wal with storage/wal_watch.h. Because every snapshot deletes the
 * segments it covers, a reader that is behind registers a hold: after a snapshot, segments
 * numbered >= hold(ud) are kept (hold returns 0 for "no hold"). The hold is asked for on every
 * snapshot, from the snapshotting thread, outside the store's locks. */
typedef uint32_t (*storage_wal_hold_fn)(void *ud);

/* The WAL directory, or NULL for a memory-only store. */
const char *storage_wal_dir(const storage_t *s);
/* Call between storage_new and storage_recover (one hold per store). Returns STORAGE_OK or -1. */
int storage_set_wal_hold(storage_t *s, storage_wal_hold_fn fn, void *ud);
/* Labels of a series id (from the catalog, queued rows included), copied into a. Returns 0, 1 if
 * the id is unknown (or the store is memory-only), -1 on error. */
int storage_series_labels(storage_t *s, uint64_t id, arena_t *a, labels_t *out);

/* For tests and tools: the head. */
head_t *storage_head(storage_t *s);

#endif
