/*
 * chunk_xor — Prometheus' XOR ("Gorilla") chunk encoding, byte-compatible with
 * prometheus/tsdb/chunkenc, so remote read can ship our chunk bytes as they are.
 * The full format specification is at the top of chunk_xor.c.
 *
 * An appender owns a growable byte array. "Chunk full" (120 samples, or a caller-chosen cap) is a
 * normal outcome the caller handles by cutting a new chunk, not an error. Iterators read a byte
 * slice they do not own and never read past its length, whatever the bytes say (the decoder is
 * fed by remote clients and by files on disk).
 */
#ifndef SLUICE_STORAGE_CHUNK_XOR_H
#define SLUICE_STORAGE_CHUNK_XOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHUNK_XOR_MAX_SAMPLES 120
#define CHUNK_XOR_HEADER_BYTES 2
/* Worst case of one record: 4 + 64 dod bits + 1 + 1 + 5 + 6 + 64 value bits = 145 bits, or
 * 10 varint bytes + 64 bits = 144 bits for sample 0. The appender reserves it before each
 * append so the bit writer never has to fail half-way through a record; a caller that sizes a
 * buffer for n samples up front needs HEADER + n times this. */
#define CHUNK_XOR_MAX_RECORD_BYTES 19

typedef struct {
    uint8_t *bytes; /* owned; bytes[0..1] = big-endian sample count */
    size_t cap;     /* allocated bytes */
    uint64_t nbits; /* bits written after the header */
    uint16_t num;
    int64_t t;       /* last timestamp */
    int64_t tdelta;  /* last timestamp delta */
    uint64_t vbits;  /* last value as raw bits */
    uint8_t leading; /* 0xff before the first XOR window is written */
    uint8_t trailing;
} chunk_xor_appender_t;

typedef struct {
    const uint8_t *bytes;
    size_t len;
    uint64_t bitpos; /* bits consumed after the header */
    uint16_t num, read;
    int64_t t, tdelta;
    uint64_t vbits;
    uint8_t leading, trailing;
    int err; /* 0, or -1 once the bytes turned out to be malformed or truncated */
} chunk_xor_iter_t;

/* Starts an empty chunk. Returns 0, or -1 on OOM. Release with chunk_xor_appender_free. */
int chunk_xor_appender_init(chunk_xor_appender_t *a);
/* Starts an empty chunk in buf (cap >= 2 bytes, malloc'd; the appender owns it from now on, as
 * if init had allocated it): a caller that closes chunks one after another reuses one buffer
 * instead of freeing it and growing a new one from nothing. */
void chunk_xor_appender_init_buf(chunk_xor_appender_t *a, uint8_t *buf, size_t cap);
void chunk_xor_appender_free(chunk_xor_appender_t *a);
/* Appends (t, v). t must be > the last timestamp (callers enforce ordering). Returns 0, or -1 on
 * OOM (or if the chunk already holds 65535 samples and the 16-bit count would wrap); never fails
 * for being "full" (callers check chunk_xor_num / their own cut policy). */
int chunk_xor_append(chunk_xor_appender_t *a, int64_t t, double v);
/* Bits chunk_xor_append(a, t, v) would add to the stream now (at most 145): for a caller that
 * sizes the buffer exactly. */
unsigned chunk_xor_record_bits(const chunk_xor_appender_t *a, int64_t t, double v);
/* Encoded bytes so far, length in bytes (last byte zero-padded). */
const uint8_t *chunk_xor_bytes(const chunk_xor_appender_t *a, size_t *len);
uint16_t chunk_xor_num(const chunk_xor_appender_t *a);
/* Shrinks the allocation to the encoded length (call when a chunk is cut and becomes read-only). */
void chunk_xor_appender_compact(chunk_xor_appender_t *a);
/* Reopens encoded bytes for appending (used after loading a snapshot). Copies the bytes.
 * Returns 0, or -1 if they do not decode. */
int chunk_xor_appender_from_bytes(chunk_xor_appender_t *a, const uint8_t *bytes, size_t len);

void chunk_xor_iter_init(chunk_xor_iter_t *it, const uint8_t *bytes, size_t len);
/* Advances to the next sample: returns true and sets *t, *v; false at the end or on error
 * (then it->err is -1). */
bool chunk_xor_iter_next(chunk_xor_iter_t *it, int64_t *t, double *v);

#endif
