/*
 * endian — little-endian integers in byte buffers, the byte order of every file sluice writes
 * (WAL segments and records, the snapshot container and its records). Byte by byte, so they work
 * at any alignment and on any host; compilers turn the loops into single loads and stores.
 *
 *   le_put(p, v, n)  writes the low n bytes of v (n <= 8) at p, least significant first
 *   le_get(p, n)     reads n bytes (n <= 8) at p back
 *   le_put16/32/64, le_get16/32/64: the fixed widths
 */
#ifndef SLUICE_UTIL_ENDIAN_H
#define SLUICE_UTIL_ENDIAN_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

static inline void le_put(uint8_t *p, uint64_t v, size_t n)
{
    assert(n <= 8);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t le_get(const uint8_t *p, size_t n)
{
    assert(n <= 8);
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline void le_put16(uint8_t *p, uint16_t v)
{
    le_put(p, v, 2);
}

static inline void le_put32(uint8_t *p, uint32_t v)
{
    le_put(p, v, 4);
}

static inline void le_put64(uint8_t *p, uint64_t v)
{
    le_put(p, v, 8);
}

static inline uint16_t le_get16(const uint8_t *p)
{
    return (uint16_t)le_get(p, 2);
}

static inline uint32_t le_get32(const uint8_t *p)
{
    return (uint32_t)le_get(p, 4);
}

static inline uint64_t le_get64(const uint8_t *p)
{
    return le_get(p, 8);
}

#endif
