/*
 * varint — unsigned LEB128 varints (protobuf's and Go's encoding/binary uvarint) for the compact
 * records sluice keeps in SQLite blobs. The reader never runs past `end` and refuses encodings
 * longer than 64 bits, whatever the bytes say.
 */
#ifndef SLUICE_UTIL_VARINT_H
#define SLUICE_UTIL_VARINT_H

#include <stdint.h>

#include "internal/util/buf.h"

static inline void varint_put(buf_t *b, uint64_t v)
{
    while (v >= 0x80) {
        buf_putc(b, (char)(v | 0x80));
        v >>= 7;
    }
    buf_putc(b, (char)v);
}

/* Reads one varint at *p (advanced past it). 0, or -1 when truncated or too long. */
static inline int varint_get(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

#endif
