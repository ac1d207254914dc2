/*
 * hash — the 64-bit integer mixer shared by sluice's hash tables and shard choices.
 *
 * hash_mix64 is the finalizer of MurmurHash3 (fmix64): two xor-shift-multiply rounds that make
 * every output bit depend on every input bit. It is a bijection on 64-bit integers (so distinct
 * keys never collide before the table's mask is applied) and hash_mix64(0) == 0. Use it to spread
 * integer keys that are not random (series ids, symbol ids, pointers) over a power-of-two table.
 * Strings and byte runs are hashed with xxHash (XXH3_64bits), not with this.
 *
 * Its values are part of some behaviour (api/forward.c picks a series' shard with it): changing
 * the constants moves series between forwarding shards.
 */
#ifndef SLUICE_UTIL_HASH_H
#define SLUICE_UTIL_HASH_H

#include <stdint.h>

static inline uint64_t hash_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

#endif
