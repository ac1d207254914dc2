/*
 * wal_watch — a read-only reader that follows the WAL while the daemon keeps appending to it, as
 * Prometheus' WAL watcher does for remote write. The remote-write sender (api/forward) uses one
 * per target to read every accepted sample, series record and staleness marker.
 *
 * Unlike wal_replay it never repairs or renames anything and never blocks: wal_watch_next
 * returns the next complete record, or WAL_WATCH_EOF when the newest segment has nothing more
 * yet (the caller polls again later). Records are framed and checked by storage/wal_record (byte
 * tables in wal_record.h), the same code replay uses; payloads are decoded with its
 * wal_record_decode_series / wal_record_decode_samples.
 *
 * Positions: a wal_pos_t (segment number, byte offset in that segment) names the start of a
 * record; offset 0 means "the segment's beginning, before its header". A position saved by the
 * caller and passed to wal_watch_open later resumes exactly there.
 *
 * What "the end" of a segment means for a reader that races the writer:
 *   - A segment is final once a segment with a higher number exists (wal_cut fsyncs and closes a
 *     segment before it creates the next, and a restarted daemon never appends to an old one).
 *   - In the newest segment, a short or CRC-failing record may be a write in progress: EOF, try
 *     again later.
 *   - In a final segment, a short or bad record is a torn tail (cut off by replay) or corruption:
 *     the reader moves on to the next segment (counted in stats.torn_tails).
 *   - A segment that is missing (deleted by truncation before the reader got to it, or never
 *     existed) is skipped: the reader goes on with the next one on disk (counted in
 *     stats.segments_skipped). Data in it is lost to this reader; callers keep segments they
 *     still need with storage_set_wal_hold.
 *
 * Thread safety: a wal_watch_t belongs to one thread. Several readers may follow one WAL.
 */
#ifndef SLUICE_STORAGE_WAL_WATCH_H
#define SLUICE_STORAGE_WAL_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "storage/wal.h"

typedef struct wal_watch wal_watch_t;

typedef struct {
    uint32_t segment;
    uint64_t offset;
} wal_pos_t;

enum {
    WAL_WATCH_RECORD = 1, /* a record was returned */
    WAL_WATCH_EOF = 0,    /* nothing more for now */
    WAL_WATCH_ERR_IO = -1,
    WAL_WATCH_ERR_NOMEM = -2,
};

typedef struct {
    uint64_t records;          /* records returned */
    uint64_t bytes;            /* bytes of records returned (headers included) */
    uint32_t segments_skipped; /* missing segments jumped over */
    uint32_t torn_tails;       /* final segments left at a bad or short record */
} wal_watch_stats_t;

/* Opens a reader at `start` in WAL directory `dir` (nothing is opened until the first read, so a
 * segment that does not exist yet is fine). NULL on OOM. */
wal_watch_t *wal_watch_open(const char *dir, wal_pos_t start);
void wal_watch_close(wal_watch_t *w);

/* Reads the next record. On WAL_WATCH_RECORD: *type is its type, *payload and *len its payload
 * (valid until the next call), *at the position of the record and wal_watch_pos() the position
 * after it. Returns WAL_WATCH_RECORD, WAL_WATCH_EOF, or a negative WAL_WATCH_ERR_*. */
int wal_watch_next(wal_watch_t *w, uint8_t *type, const uint8_t **payload, size_t *len, wal_pos_t *at);

/* The position after the last record returned (where the next read starts). */
wal_pos_t wal_watch_pos(const wal_watch_t *w);
void wal_watch_get_stats(const wal_watch_t *w, wal_watch_stats_t *out);

/* The highest segment number in dir (0 if none): where a reader that only wants new data starts. */
uint32_t wal_watch_last_segment(const char *dir);
/* The lowest segment number > after in dir (0 if none). */
uint32_t wal_watch_next_segment(const char *dir, uint32_t after);

#endif
