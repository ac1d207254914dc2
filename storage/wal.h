/*
 * wal — the write-ahead log: every accepted series and sample is in here before the reply.
 * The byte layout is specified in wal_record.h (shared with the read-only tail, wal_watch.h), the
 * recovery state machine at the top of wal.c.
 *
 * A WAL is a directory of numbered segment files (00000001.wal, 00000002.wal, ...). Records are
 * appended to the newest segment; a segment is closed (fsync'd) and a new one started when it
 * grows past `segment_max_bytes`, or when the head checkpoints (wal_cut).
 *
 * Concurrency: any number of threads may call the wal_log_* functions at once. A call copies its
 * encoded record into a shared buffer under a mutex and returns once that buffer has been
 * written to the segment file with write(2) (mode WAL_FSYNC_INTERVAL; a background thread
 * fsyncs at least every fsync_interval_ms) or written AND fsync'd (mode WAL_FSYNC_ALWAYS).
 * Either way one thread does the I/O for everybody who appended meanwhile (group commit), so
 * concurrent callers share one write and one fsync.
 *
 * Errors: an I/O failure (ENOSPC, EIO, ...) is returned to exactly the callers whose records were
 * in the failed write, as WAL_ERR_IO with a message (callers answer 503). The segment is cut back
 * to its last complete record, so a later append, once space returns, works again and the log
 * stays well-formed. A call never returns 0 for a record that did not reach the file.
 *
 * Start-up order (the contract with storage/head):
 *   1. snapshot_reader_open(); remember snapshot_reader_wal_segment() = S (or S = 0 if none).
 *   2. wal_replay(dir, S, callbacks): segments numbered >= S are replayed in order.
 *   3. wal_open(dir): opens a NEW segment numbered after every existing one.
 * Checkpoint order:
 *   1. Quiesce appenders (e.g. take a checkpoint rwlock for writing — appenders hold it for reading
 *      across "wal_log_* + apply to head"), so every record in the WAL has been applied to the
 *      head and nothing is half-done.
 *   2. wal_cut(wal, &S): new segment S; everything logged before is in segments < S.
 *   3. Capture the head state for the snapshot; release the rwlock; write the snapshot with
 *      wal segment S (snapshot_writer_open(path, S)) and commit it.
 *   4. wal_truncate_before(wal, K) once the snapshot is durable (commit returned 0), where K is
 *      the segment of the OLDEST snapshot kept (snapshot.h keeps the previous one as a fallback,
 *      and it needs segments >= its own S; snapshot_oldest_wal_segment).
 * A crash between 3 and 4 leaves older segments on disk; replay skips them (step 2 above).
 * Records logged between the cut and the capture are in the snapshot AND in segment S. So replay
 * on top of a snapshot may deliver samples the head already has: the head must ignore a sample
 * whose timestamp is <= the newest it holds for that series (it does anyway: out of order), and a
 * series record for an id it already knows with the same labels.
 */
#ifndef SLUICE_STORAGE_WAL_H
#define SLUICE_STORAGE_WAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"

typedef struct wal wal_t;

/* Error vocabulary: 0 ok, negative error. */
enum {
    WAL_OK = 0,
    WAL_ERR_IO = -1,        /* open/write/fsync/rename/unlink failed; retry later (HTTP 503) */
    WAL_ERR_NOMEM = -2,     /* allocation failed */
    WAL_ERR_TOO_LARGE = -3, /* one record would exceed WAL_MAX_RECORD_BYTES */
    WAL_ERR_CORRUPT = -4,   /* replay: unreadable directory layout (never for a torn tail) */
    WAL_ERR_ABORTED = -5,   /* replay: a callback returned nonzero */
    WAL_ERR_ARG = -6,       /* bad argument */
};

typedef enum {
    WAL_FSYNC_INTERVAL = 0, /* write(2) before returning; fsync every fsync_interval_ms */
    WAL_FSYNC_ALWAYS,       /* write(2) + fsync before returning (group commit) */
} wal_fsync_mode_t;

/* Record types as stored (see the tables in wal_record.h). Values are part of the on-disk format. */
enum {
    WAL_REC_SERIES = 1, /* read only: written before SERIES_SHARED */
    WAL_REC_SAMPLES = 2,
    WAL_REC_BLOB = 3,
    WAL_REC_SERIES_SHARED = 4,
};

/* A record's payload may not exceed this; replay treats a larger length field as corruption, so a
 * garbage length never makes it allocate more. */
#define WAL_MAX_RECORD_BYTES (64u << 20)

typedef struct {
    wal_fsync_mode_t fsync_mode;
    uint32_t fsync_interval_ms; /* WAL_FSYNC_INTERVAL: fsync at least this often; default 1000 */
    uint64_t segment_max_bytes; /* roll to a new segment once a segment reaches this; default 64 MiB
                                   (soft: the write that crosses it completes in the same file) */
} wal_options_t;

typedef struct {
    uint64_t series_id;
    int64_t t_ms;
    double v; /* any bits, including the stale NaN 0x7ff0000000000002, are kept exactly */
} wal_sample_t;

typedef struct {
    uint64_t id;
    labels_t labels; /* sorted, NUL-terminated strings */
} wal_series_t;

/* Self-metrics for /metrics. Counters since wal_open; gauges marked. */
typedef struct {
    uint64_t records_written;   /* records that reached the file */
    uint64_t bytes_written;     /* bytes that reached the file (headers included) */
    uint64_t writes;            /* write(2) batches */
    uint64_t fsyncs;            /* successful fsyncs */
    uint64_t fsync_duration_ns; /* sum over all fsync calls */
    uint64_t write_errors;      /* failed write batches */
    uint64_t fsync_errors;      /* failed fsyncs */
    uint64_t segments_created;  /* segment files started (including the first) */
    uint32_t segment_current;   /* gauge: number of the segment being written */
    uint32_t segments_on_disk;  /* gauge: segment files wal_open found or created, minus removed */
    uint64_t segment_bytes;     /* gauge: size of the current segment */
    uint64_t buffer_bytes;      /* gauge: allocated by the two batch buffers */
} wal_stats_t;

/* Defaults: interval mode, 1000 ms, 64 MiB. */
void wal_options_default(wal_options_t *o);

/* Opens (creating if needed) the WAL directory and starts a new segment numbered after every file
 * in it, plus the group-commit thread. opts may be NULL (defaults). Returns NULL and fills err on
 * failure. Call after wal_replay. The directory must not be used by another wal_t. */
wal_t *wal_open(const char *dir, const wal_options_t *opts, char *err, size_t errlen);

/* Flushes, fsyncs and closes; stops the thread; frees wal. Returns 0 or WAL_ERR_IO (the final
 * fsync failed — not everything may be durable). wal may be NULL. */
int wal_close(wal_t *wal, char *err, size_t errlen);

/* Logs new series (id -> labels). The labels are copied; the caller keeps ownership. err may be
 * NULL. Returns 0 once the record is written (and fsync'd in ALWAYS mode), or a WAL_ERR_*. */
int wal_log_series(wal_t *wal, const wal_series_t *series, size_t n, char *err, size_t errlen);

/* Logs a batch of samples; large batches are split into several records transparently (each
 * record is all-or-nothing on replay; on WAL_ERR_IO some records of a split batch may have been
 * written — retried duplicates are harmless, see the contract above). */
int wal_log_samples(wal_t *wal, const wal_sample_t *samples, size_t n, char *err, size_t errlen);

/* Logs an opaque blob with a caller-chosen tag (e.g. push-gateway group state). len must be <
 * WAL_MAX_RECORD_BYTES - 1. */
int wal_log_blob(wal_t *wal, uint8_t type, const void *data, size_t len, char *err, size_t errlen);

/* Writes whatever is buffered and fsyncs now. Returns 0 or WAL_ERR_IO. */
int wal_sync(wal_t *wal, char *err, size_t errlen);

/* Closes the current segment (fsync'd) and starts a new one; *segment_no gets the new number.
 * Every record logged before the call is in a segment < *segment_no, every record after in
 * segments >= it. Returns 0, or WAL_ERR_IO (the WAL keeps writing to the old segment). */
int wal_cut(wal_t *wal, uint32_t *segment_no, char *err, size_t errlen);

/* Deletes segment files numbered < segment_no (never the current one) and fsyncs the directory.
 * Returns 0, or WAL_ERR_IO if some could not be removed (harmless: replay skips them). */
int wal_truncate_before(wal_t *wal, uint32_t segment_no, char *err, size_t errlen);

void wal_get_stats(wal_t *wal, wal_stats_t *out);

/* The lowest segment number in `dir` (0 when it holds none or does not exist), so recovery can
 * tell whether the WAL still reaches back to an older snapshot's segment. Returns 0,
 * WAL_ERR_IO or WAL_ERR_NOMEM. */
int wal_oldest_segment(const char *dir, uint32_t *segment_no);

/* ---- replay -------------------------------------------------------------------------------- */

/* Callbacks return 0 to go on; anything else stops replay with WAL_ERR_ABORTED. Pointers passed
 * in are valid only during the call (copy what you keep). Any callback may be NULL (skip). */
typedef struct {
    int (*on_series)(void *ud, uint64_t id, const labels_t *labels);
    int (*on_samples)(void *ud, const wal_sample_t *samples, size_t n);
    int (*on_blob)(void *ud, uint8_t type, const void *data, size_t len);
} wal_replay_cb_t;

typedef struct {
    uint32_t segments;     /* segment files read */
    uint32_t last_segment; /* number of the last segment read (0 if none) */
    uint64_t records;      /* good records delivered */
    uint64_t series;       /* series entries delivered */
    uint64_t samples;      /* samples delivered */
    uint64_t blobs;
    uint64_t skipped;          /* records of unknown type (well-formed, from a newer version) */
    bool truncated;            /* a torn/corrupt tail was cut off */
    bool corrupt_middle;       /* corruption before the last segment: later segments set aside */
    uint32_t missing_segments; /* numbers missing between the first expected and the last (deleted
                                  files; logged, replay goes on with the later ones) */
    uint64_t bytes_dropped;    /* bytes cut off or set aside */
    uint64_t buffer_bytes;     /* largest payload buffer replay allocated (bounded by what the
                                file holds, whatever a length field claims) */
} wal_replay_stats_t;

/* Reads segments numbered >= first_segment of `dir` in order, calling cb for every record.
 * A missing or empty directory is not an error (nothing to replay). Because it repairs files, it
 * must not run while a wal_t has the directory open and is appending. 
 * Repairs as it goes (see "Recovery" in wal.c): a torn or corrupt tail of the last segment is cut
 * off (ftruncate) with a log_warn naming file and offset, and replay succeeds; corruption in an
 * earlier segment stops replay there: that segment is cut at its last good record and every later
 * segment is renamed to NNNNNNNN.wal.corrupt (kept for inspection, never replayed), with a
 * log_error. stats may be NULL. Returns 0, WAL_ERR_ABORTED, WAL_ERR_IO (cannot read or repair)
 * or WAL_ERR_NOMEM. */
int wal_replay(const char *dir, uint32_t first_segment, const wal_replay_cb_t *cb, void *ud, wal_replay_stats_t *stats,
               char *err, size_t errlen);

#endif
