/*
 * chunk_int — sluice's own encoding for a closed head chunk whose values are all integers (most
 * Flink metrics: record and byte counters, watermarks, buffer counts). It is written once, from
 * the finished samples, so it can pick per chunk the cheapest of a few value layouts (bit-packed
 * deltas, or variable-length deltas or delta-of-deltas) and store regular timestamps in no bits at
 * all. XOR stays the format of open chunks, of every chunk that holds a non-integer value or a
 * stale marker, and of everything that leaves the process (remote read transcodes). The format is
 * specified at the top of chunk_int.c.
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

void chunk_int_iter_init(chunk_int_iter_t *it, const uint8_t *bytes, size_t len);
/* Next sample: true and (*t, *v); false at the end or on error (then it->err is -1). */
bool chunk_int_iter_next(chunk_int_iter_t *it, int64_t *t, double *v);

#endif
