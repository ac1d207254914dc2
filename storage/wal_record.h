/*
 * wal_record — the bytes of a WAL segment, written and read in one place: the segment header, the
 * record frame and the SERIES and SAMPLES payloads. storage/wal.c (appending, replay with repair)
 * and storage/wal_watch.c (the remote-write sender's read-only tail) both go through it, so they
 * agree to the bit on what a good record is; api/forward decodes payloads with it.
 *
 * ---- Segment header (16 bytes, little-endian) ----------------------------------------------------
 *
 *   offset  size  field
 *   0       4     magic "SLWL"
 *   4       2     format version = 1
 *   6       2     reserved, 0
 *   8       4     segment number (equals the number in the file name)
 *   12      4     CRC-32C of bytes 0..11
 *
 * ---- Record (12-byte header + payload, little-endian) --------------------------------------------
 *
 *   offset  size  field
 *   0       1     type: 1 series, 2 samples, 3 blob, 4 series with shared strings (0 never
 *                 written: zero-filled space is invalid)
 *   1       1     flags, 0 (room for e.g. compression)
 *   2       2     reserved, 0
 *   4       4     payload length L, 0 < L <= WAL_MAX_RECORD_BYTES (64 MiB)
 *   8       4     CRC-32C of header bytes 0..7 followed by the L payload bytes
 *   12      L     payload
 *
 * Payloads (uvarint = LEB128 unsigned, at most 64 bits; svarint = zigzag then uvarint; f64 = IEEE
 * bits, LE):
 *
 *   SERIES   u32 count (>= 1), then count times:
 *              uvarint id, uvarint nlabels, nlabels times (uvarint len, name bytes,
 *                                                         uvarint len, value bytes)
 *            (names and values hold no NUL byte; written by versions before type 4, still read)
 *   SERIES_SHARED  u32 count (>= 1), then count times:
 *              uvarint id, uvarint nlabels, nlabels times (name, value), each string as
 *                uvarint 0: the string at the same place (label k, name or value) of the previous
 *                           series of this record, which must have label k; or
 *                uvarint len + 1, then len bytes
 *            (a push's series share most strings with their neighbour: job, host, task and
 *            operator names; type 1 spelt each out, ~460 KiB for the 1,282 series of a Flink
 *            TaskManager's first push)
 *   SAMPLES  u32 count (>= 1), then the first sample:  uvarint id, svarint t_ms, f64 v
 *              and each next one, relative to the previous: svarint (id - prev_id) (mod 2^64),
 *              svarint (t_ms - prev_t) (mod 2^64), f64 v
 *            (a push stamps all its samples with the same second: t deltas are one 0 byte)
 *   BLOB     u8 tag, then the caller's bytes
 *
 * A payload must fill its record exactly; one that does not decode is, to every reader, as bad as
 * a checksum mismatch.
 *
 * Ownership: encoders append to a caller's buf_t; the frame reader fills a caller's buf_t (kept
 * between calls so its allocation is reused); a decoder's scratch belongs to the decoder and what
 * it hands to a callback is valid only during that call.
 */
#ifndef SLUICE_STORAGE_WAL_RECORD_H
#define SLUICE_STORAGE_WAL_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/util/buf.h"
#include "storage/wal.h"

#define WAL_SEG_HEADER_BYTES 16
#define WAL_REC_HEADER_BYTES 12

/* ---- writing ------------------------------------------------------------------------------- */

/* Fills in the header of segment `no`. */
void wal_record_seg_header(uint8_t h[WAL_SEG_HEADER_BYTES], uint32_t no);

/* Appends SERIES_SHARED records for s[0..n) to b (a new record once one passes ~1 MiB); *nrec is
 * increased by the number of records. Returns 0, WAL_ERR_ARG (a label with a NULL name or value)
 * or WAL_ERR_TOO_LARGE (one series alone exceeds WAL_MAX_RECORD_BYTES); b then holds a partial
 * record and must be discarded. */
int wal_record_encode_series(buf_t *b, const wal_series_t *s, size_t n, uint64_t *nrec);

/* Appends SAMPLES records for s[0..n) to b (at most 65536 samples a record). */
void wal_record_encode_samples(buf_t *b, const wal_sample_t *s, size_t n, uint64_t *nrec);

/* Appends one BLOB record (tag, then len bytes). len must be < WAL_MAX_RECORD_BYTES. */
void wal_record_encode_blob(buf_t *b, uint8_t tag, const void *data, size_t len);

/* ---- reading frames from a segment file ---------------------------------------------------- */

/* Outcomes of the readers below (not errors: what the bytes on disk say). */
enum {
    WAL_RECORD_OK = 0,   /* a good segment header / a complete record with a good CRC */
    WAL_RECORD_END = 1,  /* wal_record_read: the file ends exactly at the offset */
    WAL_RECORD_TORN = 2, /* wal_record_read_seg_header: short or all-zero (a crash at creation) */
    WAL_RECORD_BAD = 3,  /* anything else; *why says what */
};

/* Checks the header of segment file fd against segment number `no`. Returns a WAL_RECORD_*
 * outcome (OK, TORN or BAD, with *why for the last two), or WAL_ERR_IO with err. */
int wal_record_read_seg_header(int fd, uint32_t no, const char **why, char *err, size_t errlen);

typedef struct {
    uint8_t type;
    const uint8_t *payload; /* points into the caller's buffer */
    uint32_t len;           /* payload bytes; the record takes WAL_REC_HEADER_BYTES + len */
} wal_record_t;

/* Reads the record at byte `off` of segment file fd into `payload` (reset first; grown as needed,
 * but never past what the file holds, whatever a length field claims). Returns WAL_RECORD_OK with
 * *rec filled, WAL_RECORD_END, WAL_RECORD_BAD with *why (short header or payload, bad header or
 * length, checksum mismatch: for a file still being written, possibly a record in progress), or
 * WAL_ERR_IO / WAL_ERR_NOMEM with err. */
int wal_record_read(int fd, uint64_t off, buf_t *payload, wal_record_t *rec, const char **why, char *err,
                    size_t errlen);

/* ---- decoding payloads ------------------------------------------------------------------------ */

/* Scratch reused from record to record. Fields are private. */
typedef struct {
    buf_t strs;
    label_t *labels;
    size_t labels_cap;
    wal_sample_t *samples;
    size_t samples_cap;
} wal_record_decoder_t;

void wal_record_decoder_init(wal_record_decoder_t *d);
void wal_record_decoder_free(wal_record_decoder_t *d);

/* A record of this type holds series (SERIES or SERIES_SHARED): wal_record_decode_series reads it. */
bool wal_record_is_series(uint8_t type);

/* Calls fn for each series of a SERIES or SERIES_SHARED payload (`type`; labels valid during the
 * call only). The whole payload is checked before the first call. Returns 0, WAL_ERR_CORRUPT (does
 * not decode: nothing was delivered), WAL_ERR_NOMEM, or WAL_ERR_ABORTED (fn returned nonzero; it
 * was not called again). */
int wal_record_decode_series(wal_record_decoder_t *d, uint8_t type, const uint8_t *p, size_t len,
                             int (*fn)(void *ud, uint64_t id, const labels_t *ls), void *ud);

/* Calls fn once with all samples of a SAMPLES payload (valid during the call only). Returns 0,
 * WAL_ERR_CORRUPT (nothing delivered), WAL_ERR_NOMEM or WAL_ERR_ABORTED (fn returned nonzero). */
int wal_record_decode_samples(wal_record_decoder_t *d, const uint8_t *p, size_t len,
                              int (*fn)(void *ud, const wal_sample_t *s, size_t n), void *ud);

#endif
