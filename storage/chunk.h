/*
 * chunk — the chunk encodings a querier_chunk_t can carry, and one iterator over either.
 *
 *   CHUNK_ENC_XOR   Prometheus' XOR chunk (chunk_xor.h): head chunks with a non-integer value
 *                   or a stale marker, everything from roll-ups and remote stores, everything
 *                   sluice sends
 *   CHUNK_ENC_INT   sluice's encoding for integer values (chunk_int.h), open or closed: only the
 *                   head makes these, and only inside the process (and its snapshots)
 *
 * Both start with the big-endian sample count and the first timestamp's varint at byte 2.
 */
#ifndef SLUICE_STORAGE_CHUNK_H
#define SLUICE_STORAGE_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/chunk_int.h"
#include "storage/chunk_xor.h"

enum { CHUNK_ENC_XOR = 0, CHUNK_ENC_INT = 1 };

typedef struct {
    uint8_t enc;
    union {
        chunk_xor_iter_t x;
        chunk_int_iter_t i;
    } u;
} chunk_iter_t;

static inline void chunk_iter_init(chunk_iter_t *it, uint8_t enc, const uint8_t *bytes, size_t len)
{
    it->enc = enc;
    if (enc == CHUNK_ENC_INT)
        chunk_int_iter_init(&it->u.i, bytes, len);
    else
        chunk_xor_iter_init(&it->u.x, bytes, len);
}

static inline bool chunk_iter_next(chunk_iter_t *it, int64_t *t, double *v)
{
    if (it->enc == CHUNK_ENC_INT)
        return chunk_int_iter_next(&it->u.i, t, v);
    return chunk_xor_iter_next(&it->u.x, t, v);
}

/* 0, or -1 once the bytes turned out malformed. */
static inline int chunk_iter_err(const chunk_iter_t *it)
{
    return it->enc == CHUNK_ENC_INT ? it->u.i.err : it->u.x.err;
}

#endif
