/*
 * snapshot — one file holding a checkpoint of the head, written atomically, verified, and kept
 * beside its predecessor. The byte layout is specified at the top of snapshot.c.
 *
 * A generic container: a header (magic, version, the WAL segment the snapshot corresponds to),
 * then typed records the head chooses (series labels, chunk bytes, group state, ...), each with
 * its own CRC-32C, then a trailer with the record count and a CRC of the whole file.
 *
 * Writing: the writer writes `<path>.tmp`, fsyncs it and reads it back through the verifying
 * reader; only a file that verifies is published. Publishing renames the current `<path>` to
 * `<path>.prev` (replacing the older one), renames the temp file over `<path>` and fsyncs the
 * directory. So at any moment `<path>` and `<path>.prev` are whole snapshots, or `<path>` is
 * missing for the instant between the two renames (readers then use `<path>.prev`). The caller
 * must keep the WAL segments the OLDER of the two needs (snapshot_oldest_wal_segment), so either
 * one plus the WAL is a complete recovery.
 *
 * Reading: snapshot_reader_open verifies every byte (all record CRCs, trailer, whole-file CRC)
 * before the caller sees a single record, so the caller never has to undo half-applied state.
 * snapshot_reader_salvage is the fallback for a damaged file: with a good header it delivers the
 * records whose own CRC holds, up to the first one that does not, and says where it stopped
 * (snapshot_reader_verdict). Records after damage are never delivered: a bad length field makes
 * everything after it unframeable, and a guess could hand the head garbage.
 *
 * A damaged file is never overwritten or deleted here: snapshot_set_aside renames it to
 * `<path>.corrupt-<unix ms>` for inspection.
 *
 * Record type 0 is reserved; types 1..255 are the head's to assign.
 */
#ifndef SLUICE_STORAGE_SNAPSHOT_H
#define SLUICE_STORAGE_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    SNAPSHOT_OK = 0,
    SNAPSHOT_ERR_IO = -1, /* open/write/fsync/rename failed */
    SNAPSHOT_ERR_NOMEM = -2,
    SNAPSHOT_ERR_NOT_FOUND = -3, /* no snapshot file (a first start): not an error for callers */
    SNAPSHOT_ERR_CORRUPT = -4,   /* bad magic, version, CRC, truncated, trailing garbage */
    SNAPSHOT_ERR_ARG = -5,       /* type 0, or a record too large */
    SNAPSHOT_PARTIAL = 1,        /* snapshot_reader_salvage: damaged, the intact prefix is readable */
};

/* The predecessor kept beside <path>, and the prefix of the names damaged files are moved to. */
#define SNAPSHOT_PREV_SUFFIX ".prev"
#define SNAPSHOT_CORRUPT_SUFFIX ".corrupt-"

/* Largest record payload the writer accepts and the reader believes. */
#define SNAPSHOT_MAX_RECORD_BYTES (256u << 20)

typedef struct snapshot_writer snapshot_writer_t;
typedef struct snapshot_reader snapshot_reader_t;

/* ---- writing -------------------------------------------------------------------------------- */

/* Starts writing `<path>.tmp` (replacing a stale one). wal_segment: the segment wal_cut returned.
 * Returns NULL and fills err on failure. Finish with snapshot_writer_commit or _abort. */
snapshot_writer_t *snapshot_writer_open(const char *path, uint32_t wal_segment, char *err, size_t errlen);

/* Appends one record (copied; buffered, written in large pieces). type 1..255.
 * Returns 0, SNAPSHOT_ERR_ARG or SNAPSHOT_ERR_IO. After an error the writer is spoiled: commit
 * fails (cleaning up) and abort is the usual way out. */
int snapshot_writer_add(snapshot_writer_t *w, uint8_t type, const void *data, size_t len, char *err, size_t errlen);

/* Writes the trailer, fsyncs, reads the file back through the verifying reader, moves the current
 * <path> (if any) to <path>SNAPSHOT_PREV_SUFFIX, renames the temp file over <path>, fsyncs the
 * directory, and frees w (also on error, removing the temp file; <path> and its predecessor are
 * then untouched). Returns 0 only when the new snapshot is durable and verified. */
int snapshot_writer_commit(snapshot_writer_t *w, char *err, size_t errlen);

/* Discards the temp file and frees w. w may be NULL. */
void snapshot_writer_abort(snapshot_writer_t *w);

/* ---- reading -------------------------------------------------------------------------------- */

/* Opens and fully verifies <path>. On success *out is set (close with snapshot_reader_close).
 * Returns 0, SNAPSHOT_ERR_NOT_FOUND, SNAPSHOT_ERR_CORRUPT (err says where), SNAPSHOT_ERR_IO or
 * SNAPSHOT_ERR_NOMEM. */
int snapshot_reader_open(const char *path, snapshot_reader_t **out, char *err, size_t errlen);

/* Like snapshot_reader_open, but a damaged file whose header is intact still opens: returns
 * SNAPSHOT_PARTIAL with *out set and err describing the damage; the reader then delivers only the
 * records before the first one that fails its own checks (which may be all of them, e.g. when
 * only the trailer is bad, or none). Returns 0 (the file verified completely, exactly as
 * snapshot_reader_open), SNAPSHOT_PARTIAL, or the errors of snapshot_reader_open (a bad header
 * is SNAPSHOT_ERR_CORRUPT: without it the WAL segment is unknown and nothing is usable). */
int snapshot_reader_salvage(const char *path, snapshot_reader_t **out, char *err, size_t errlen);

/* What the reader found. */
typedef struct {
    bool whole;               /* every check passed */
    uint64_t records;         /* records the reader delivers */
    int64_t records_expected; /* the trailer's count; -1 if the trailer is missing or damaged */
    uint64_t stop_offset;     /* where delivery stops: the trailer, or the first damaged record */
    uint64_t file_bytes;
} snapshot_verdict_t;

void snapshot_reader_verdict(const snapshot_reader_t *r, snapshot_verdict_t *out);

uint32_t snapshot_reader_wal_segment(const snapshot_reader_t *r);
/* Records the reader delivers (for a salvaged file: those before the damage). */
uint64_t snapshot_reader_record_count(const snapshot_reader_t *r);
/* Unix milliseconds at which the writer was opened. */
int64_t snapshot_reader_created_ms(const snapshot_reader_t *r);

/* Next record: returns 1 and sets *type, *data, *len (data points into the mapped file, valid until
 * snapshot_reader_close, even if the file is renamed meanwhile); 0 at the end (for a salvaged
 * file: at the damage). Never fails (what it delivers was verified at open). */
int snapshot_reader_next(snapshot_reader_t *r, uint8_t *type, const void **data, size_t *len);

/* Restarts iteration at the first record. */
void snapshot_reader_rewind(snapshot_reader_t *r);

void snapshot_reader_close(snapshot_reader_t *r);

/* ---- files ---------------------------------------------------------------------------------- */

/* Reads only the header of <path> and sets *segment to its WAL segment. Returns 0,
 * SNAPSHOT_ERR_NOT_FOUND, SNAPSHOT_ERR_CORRUPT (bad header) or SNAPSHOT_ERR_IO. */
int snapshot_read_wal_segment(const char *path, uint32_t *segment, char *err, size_t errlen);

/* The lowest WAL segment that <path> or <path>SNAPSHOT_PREV_SUFFIX (those with a readable header)
 * needs replayed: WAL segments below it are needed by neither. Returns 0, or
 * SNAPSHOT_ERR_NOT_FOUND when neither file has a readable header (keep the whole WAL). */
int snapshot_oldest_wal_segment(const char *path, uint32_t *segment);

/* Renames the damaged file <path> to <path>SNAPSHOT_CORRUPT_SUFFIX<unix ms> (a later ms if that
 * name is taken: an existing file is never replaced) and fsyncs the directory. The new name goes
 * to moved_to. Returns 0, SNAPSHOT_ERR_NOT_FOUND or SNAPSHOT_ERR_IO. */
int snapshot_set_aside(const char *path, char *moved_to, size_t moved_len, char *err, size_t errlen);

#endif
