/*
 * varint — LEB128 varints as protobuf and Go's encoding/binary write them: the one codec behind
 * the WAL records, the remote-write/read protobuf, the delimited protobuf exposition format, the
 * catalog and the roll-up blobs.
 *
 * Unsigned (Go's PutUvarint, protobuf's uint64): seven bits a byte, least significant group
 * first, the high bit set on every byte but the last.
 *
 *   value          bytes
 *   -------------  ------------------------------
 *   0              00
 *   127            7f
 *   128            80 01
 *   300            ac 02
 *   2^64 - 1       ff ff ff ff ff ff ff ff ff 01    (VARINT_MAX = 10 bytes)
 *
 * Signed (Go's PutVarint, protobuf's sint64): zigzag first, so small magnitudes stay short:
 * 0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3, ..., INT64_MIN -> 2^64 - 1.
 *
 * The readers never run past `end` and follow Go's binary.Uvarint: a varint that ends early is
 * VARINT_ETRUNC; one of more than 10 bytes, or whose 10th byte carries bits beyond the 64th, is
 * VARINT_EOVERFLOW. Non-minimal encodings (80 00 for 0) are accepted, as Go and protobuf do.
 * varint_get_max() bounds the length further (5 for protobuf's varint32 message lengths).
 * On error *p has moved by an unspecified amount and *out is untouched.
 */
#ifndef SLUICE_UTIL_VARINT_H
#define SLUICE_UTIL_VARINT_H

#include <stddef.h>
#include <stdint.h>

#include "internal/util/buf.h"

#define VARINT_MAX 10 /* bytes in the longest encoding of a uint64 */

enum {
    VARINT_OK = 0,
    VARINT_ETRUNC = -1,   /* the input ends inside the varint */
    VARINT_EOVERFLOW = -2 /* longer than allowed, or more than 64 bits */
};

/* ---- zigzag ------------------------------------------------------------------------------------- */

static inline uint64_t varint_zigzag(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static inline int64_t varint_unzigzag(uint64_t u)
{
    return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

/* ---- writing ------------------------------------------------------------------------------------ */

/* Bytes varint_encode(v) writes (1..VARINT_MAX). */
static inline size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v at out, which has room for VARINT_MAX bytes; returns the bytes written. */
static inline size_t varint_encode(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

/* Appends v to b (aborts on OOM, as every buf_ appender). */
static inline void varint_put(buf_t *b, uint64_t v)
{
    buf_reserve(b, VARINT_MAX);
    b->len += varint_encode((uint8_t *)b->data + b->len, v);
    b->data[b->len] = 0;
}

/* Appends v zigzag-encoded (Go's binary.PutVarint). */
static inline void varint_put_signed(buf_t *b, int64_t v)
{
    varint_put(b, varint_zigzag(v));
}

/* ---- reading ------------------------------------------------------------------------------------ */

/* Reads one varint of at most max bytes (1..VARINT_MAX) at *p, never past end; *p is advanced
 * past it. VARINT_OK, VARINT_ETRUNC or VARINT_EOVERFLOW. */
static inline int varint_get_max(const uint8_t **p, const uint8_t *end, size_t max, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < max && i < VARINT_MAX; i++) {
        if (*p >= end)
            return VARINT_ETRUNC;
        uint8_t c = *(*p)++;
        if (i == VARINT_MAX - 1 && c > 1)
            return VARINT_EOVERFLOW;
        v |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *out = v;
            return VARINT_OK;
        }
    }
    return VARINT_EOVERFLOW;
}

/* Reads one unsigned varint (up to VARINT_MAX bytes). VARINT_OK or a negative VARINT_E*. */
static inline int varint_get(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    return varint_get_max(p, end, VARINT_MAX, out);
}

/* Reads one zigzag-encoded signed varint (Go's binary.Varint). */
static inline int varint_get_signed(const uint8_t **p, const uint8_t *end, int64_t *out)
{
    uint64_t u;
    int rc = varint_get(p, end, &u);
    if (rc == VARINT_OK)
        *out = varint_unzigzag(u);
    return rc;
}

#endif
