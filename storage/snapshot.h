/*
 * snapshot — one file holding a checkpoint of the head, written atomically and verified on read.
 * The byte layout is specified at the top of snapshot.c.
 *
 * A generic container: a header (magic, version, the WAL segment the snapshot corresponds to),
 * then typed records the head chooses (series labels, chunk bytes, group state, ...), each with
 * its own CRC-32C, then a trailer with the record count and a CRC of the whole file. The writer
 * writes `<path>.tmp`, fsyncs it, renames it over `<path>` and fsyncs the directory, so `<path>`
 * is always either the old snapshot or the complete new one.
 *
 * The reader maps the file and verifies every byte (all record CRCs, trailer, whole-file CRC)
 * in snapshot_reader_open, before the caller sees a single record; so a corrupt snapshot is
 * rejected as a whole, and the caller never has to undo half-applied state (it logs the error
 * and falls back to WAL-only replay).
 *
 * Record type 0 is reserved; types 1..255 are the head's to assign.
 */
#ifndef SLUICE_STORAGE_SNAPSHOT_H
#define SLUICE_STORAGE_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

enum {
    SNAPSHOT_OK = 0,
    SNAPSHOT_ERR_IO = -1, /* open/write/fsync/rename failed */
    SNAPSHOT_ERR_NOMEM = -2,
    SNAPSHOT_ERR_NOT_FOUND = -3, /* no snapshot file (a first start): not an error for callers */
    SNAPSHOT_ERR_CORRUPT = -4,   /* bad magic, version, CRC, truncated, trailing garbage */
    SNAPSHOT_ERR_ARG = -5,       /* type 0, or a record too large */
};

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

/* Writes the trailer, fsyncs, renames over <path>, fsyncs the directory, frees w (also on error,
 * removing the temp file). Returns 0 only when the new snapshot is durable. */
int snapshot_writer_commit(snapshot_writer_t *w, char *err, size_t errlen);

/* Discards the temp file and frees w. w may be NULL. */
void snapshot_writer_abort(snapshot_writer_t *w);

/* ---- reading -------------------------------------------------------------------------------- */

/* Opens and fully verifies <path>. On success *out is set (close with snapshot_reader_close).
 * Returns 0, SNAPSHOT_ERR_NOT_FOUND, SNAPSHOT_ERR_CORRUPT (err says where), SNAPSHOT_ERR_IO or
 * SNAPSHOT_ERR_NOMEM. */
int snapshot_reader_open(const char *path, snapshot_reader_t **out, char *err, size_t errlen);

uint32_t snapshot_reader_wal_segment(const snapshot_reader_t *r);
uint64_t snapshot_reader_record_count(const snapshot_reader_t *r);
/* Unix milliseconds at which the writer was opened. */
int64_t snapshot_reader_created_ms(const snapshot_reader_t *r);

/* Next record: returns 1 and sets *type, *data, *len (data points into the mapped file, valid until
 * snapshot_reader_close); 0 at the end. Never fails (the file was verified at open). */
int snapshot_reader_next(snapshot_reader_t *r, uint8_t *type, const void **data, size_t *len);

/* Restarts iteration at the first record. */
void snapshot_reader_rewind(snapshot_reader_t *r);

void snapshot_reader_close(snapshot_reader_t *r);

#endif
