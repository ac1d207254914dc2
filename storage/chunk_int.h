/*
 * chunk_int — sluice's own encoding for head chunks whose values are all integers (most Flink
 * metrics: record and byte counters, watermarks, buffer counts). A closed chunk is written once,
 * from the finished samples, so it can pick per chunk the cheapest of a few value layouts
 * (bit-packed deltas, or variable-length deltas or delta-of-deltas) and store regular timestamps
 * in no bits at all. An open chunk takes one sample at a time through the appender below, in a
 * layout made for that (adaptive Rice-coded deltas). XOR stays the format of every chunk that
 * holds a non-integer value or a stale marker, and of everything that leaves the process (remote
 * read transcodes). The format is specified at the top of chunk_int.c.
 *
 * Only the head writes these chunks; the iterator still never reads past the slice it is given
 * (snapshots on disk carry them).
 */
#ifndef SLUICE_STORAGE_CHUNK_INT_H
#define SLUICE_STORAGE_CHUNK_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHUNK_INT_HEADER_BYTES 2

typedef struct {
    const uint8_t *bytes;
    size_t len;
    uint64_t bitpos; /* absolute bit position in bytes (MSB first) */
    uint16_t num, read;
    uint8_t tmode, vmode, width;
    int64_t t, td; /* last timestamp and timestamp delta */
    int64_t v, vd; /* last value and value delta */
    int64_t base;  /* bit-packed deltas: what every packed number is added to */
    uint8_t k, pred; /* vmode 3: Rice parameter, predictor */
    int err;       /* 0, or -1 once the bytes turned out malformed */
} chunk_int_iter_t;

/* Is v an integer this encoding holds exactly (|v| <= 2^53, not -0.0, not NaN)? */
bool chunk_int_holds(double v);

/* Encoded size in bytes of samples (t[i], v[i]), i < n (1 <= n <= 65535, t strictly increasing,
 * every v chunk_int_holds, consecutive timestamps less than 2^31 ms apart). 0 if they cannot be
 * encoded. */
size_t chunk_int_size(const int64_t *t, const double *v, size_t n);
/* Encodes them into out (cap >= chunk_int_size(...)). Returns the length, or 0 if they cannot be
 * encoded or do not fit. */
size_t chunk_int_encode(const int64_t *t, const double *v, size_t n, uint8_t *out, size_t cap);

/* The appendable layout (vmode 3). Its bytes are a function of the samples alone: appending
 * them one at a time gives what one chunk_int_append of each in turn into an empty appender gives,
 * whatever was appended before. The caller owns the buffer; nothing here allocates. */
#define CHUNK_INT_APPEND_MAX_SAMPLES 512
/* Most bytes one append adds when chunk_int_append_rewrites says no (158 bits, plus the partial
 * last byte). */
#define CHUNK_INT_APPEND_MAX_BYTES 21

typedef struct {
    uint8_t *bytes;
    size_t cap;
    uint64_t nbits; /* the chunk is bytes[0, (nbits + 7) / 8) */
    uint16_t num;
    uint8_t k;     /* the Rice parameter for the next value */
    uint8_t tmode; /* 0: every timestamp delta so far equals the first */
    uint8_t pred;  /* 1: values are coded against the first delta (d1v) */
    uint8_t hdr;   /* bytes before the bit stream (num >= 2) */
    int32_t d1v;
    int64_t t, td, v; /* last timestamp, last timestamp delta, last value */
} chunk_int_appender_t;

/* An empty chunk over buf (cap bytes; nothing is written until the first append). */
void chunk_int_appender_init(chunk_int_appender_t *a, uint8_t *buf, size_t cap);
/* Does appending (t, v) re-encode the chunk (the 1st, 2nd and 4th samples and the first
 * irregular timestamp delta do)? Then the chunk can grow by more than CHUNK_INT_APPEND_MAX_BYTES. */
bool chunk_int_append_rewrites(const chunk_int_appender_t *a, int64_t t);
/* The chunk's length in bytes once (t, v) is appended; 0 if it cannot be (t not after the last
 * timestamp or 2^31 ms or more after it, |v| > 2^53, CHUNK_INT_APPEND_MAX_SAMPLES reached). */
size_t chunk_int_append_size(const chunk_int_appender_t *a, int64_t t, int64_t v);
/* Appends (t, v). Returns 0, or -1 (nothing changed) if it cannot be appended or cap is smaller
 * than chunk_int_append_size. */
int chunk_int_append(chunk_int_appender_t *a, int64_t t, int64_t v);
/* The chunk's length in bytes. */
size_t chunk_int_appender_len(const chunk_int_appender_t *a);

void chunk_int_iter_init(chunk_int_iter_t *it, const uint8_t *bytes, size_t len);
/* Next sample: true and (*t, *v); false at the end or on error (then it->err is -1). */
bool chunk_int_iter_next(chunk_int_iter_t *it, int64_t *t, double *v);

#endif
