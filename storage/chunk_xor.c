/*
 * chunk_xor — Prometheus' XOR ("Gorilla") chunk: encoder (appender) and decoder (iterator),
 * byte-for-byte the encoding of prometheus/tsdb/chunkenc's XOR chunk, so the bytes we keep are
 * the bytes remote read ships, and chunks Prometheus sends us decode here. The integration test
 * tests/integration/test_chunk_interop.py checks this against a real Prometheus.
 *
 * Format
 * ======
 * A chunk is a 2-byte header followed by a bit stream. Bits are written MSB-first: the first bit
 * of the stream is bit 7 of byte 2. The last byte is padded with zero bits.
 *
 *   offset  size  meaning
 *   0       2     sample count, big-endian uint16
 *   2       ...   bit stream, one record per sample (below), no alignment between records
 *
 * Records (t = timestamp in ms, v = value as the 64 raw bits of an IEEE-754 double):
 *
 *   sample 0   varint(t)                 zigzag varint as Go's binary.PutVarint, its bytes
 *                                        written as 8-bit groups into the bit stream (NOT
 *                                        byte-aligned), 1..10 bytes
 *              v                         64 bits
 *   sample 1   uvarint(t1 - t0)          Go's binary.PutUvarint, bytes as 8-bit groups
 *              value(v1 ^ v0)            see below
 *   sample n   dod(Δn - Δn-1)            Δn = tn - tn-1 (as uint64, wrapping), dod its difference
 *   (n >= 2)   value(vn ^ vn-1)          as int64
 *
 *   dod:  prefix  payload   used when dod is in
 *         0       -         0
 *         10      14 bits   -8191 .. 8192
 *         110     17 bits   -65535 .. 65536
 *         1110    20 bits   -524287 .. 524288
 *         1111    64 bits   anything else
 *   The payload is the low bits of the two's complement; the decoder treats a payload greater
 *   than 2^(bits-1) as negative (subtracts 2^bits), so +2^(bits-1) is representable and
 *   -2^(bits-1) is not (hence the asymmetric ranges).
 *
 *   value(x), x = XOR of the value bits with the previous value's bits:
 *         0                              x == 0 (same value)
 *         1 0 <64-L-T bits>              reuse the previous window: x's leading zeros >= L and
 *                                        trailing zeros >= T; the bits are x >> T
 *         1 1 <5 bits lz> <6 bits sig>   new window: lz = leading zeros clamped to 31, tz =
 *             <sig bits>                 trailing zeros, sig = 64 - lz - tz (64 written as 0);
 *                                        the bits are x >> tz; (L, T) := (lz, tz)
 *   The encoder starts with L = 0xff ("no window yet"), so sample 1 always writes a new window
 *   unless the value repeats.
 *
 * Worked example (asserted byte for byte in tests/unit/storage/test_chunk_xor.c):
 * samples (1000, 1.0), (2000, 1.0), (3500, 3.0)
 *   00 03                      count 3
 *   d0 0f                      varint(1000): zigzag 2000 = 0x7d0 -> 0xd0 0x0f
 *   3f f0 00 00 00 00 00 00    1.0
 *   e8 07                      uvarint(1000)
 *   then the bits  0 | 10 00000111110100 | 1 1 00001 001100 111111111111 | 000000 (pad)
 *                  ^same value  ^dod 500     ^1.0^3.0 = 0x7ff8<<48: lz 1, sig 12, bits 0xfff
 *   40 fa 61 33 ff c0
 *
 * Robustness: the iterator reads a slice it does not own and checks every read against its
 * length; a truncated stream, a varint longer than 10 bytes or a window that does not fit in 64
 * bits sets it->err = -1 and ends the iteration. Timestamp arithmetic wraps (done in uint64) as
 * in Go, so hostile input cannot trigger signed overflow.
 *
 * Known difference from Prometheus' own reopen path: Prometheus' XORChunk.Appender() restores
 * the window from an iterator that starts at L = T = 0, so reopening a chunk whose values never
 * changed makes its next append use the 64-bit "reuse" form. We start the iterator at L = 0xff
 * (and read a reuse before any window as the full 64 bits, which is what Prometheus' decoder
 * does), so a reopened appender continues exactly as if it had encoded everything itself. Both
 * forms decode to the same values in either implementation.
 */
#include "storage/chunk_xor.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define XOR_NO_WINDOW 0xff

/* ------------------------------------------------------------------------------------------ */
/* Bit writer                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static size_t xor_used_bytes(uint64_t nbits)
{
    return CHUNK_XOR_HEADER_BYTES + (size_t)((nbits + 7) / 8);
}

static int xor_reserve(chunk_xor_appender_t *a, size_t extra)
{
    size_t need = xor_used_bytes(a->nbits) + extra;
    if (need <= a->cap)
        return 0;
    size_t cap = a->cap ? a->cap : 32;
    while (cap < need)
        cap *= 2;
    uint8_t *p = realloc(a->bytes, cap);
    if (!p)
        return -1;
    a->bytes = p;
    a->cap = cap;
    return 0;
}

/* Writes the low n bits of v (n <= 64), most significant first. Capacity is reserved by the
 * caller. The last byte written is zero after the new bits, which keeps the padding zero. */
static void xor_write_bits(chunk_xor_appender_t *a, uint64_t v, unsigned n)
{
    assert(n <= 64);
    if (n > 32) {
        xor_write_bits(a, v >> 32, n - 32);
        n = 32;
    }
    if (n == 0)
        return;
    /* The current byte's used bits and the n new ones, MSB first, in one word (at most 7 + 32
     * bits), stored byte by byte: the bits after them in the last byte are zero padding. */
    v &= ((uint64_t)1 << n) - 1;
    size_t at = CHUNK_XOR_HEADER_BYTES + (size_t)(a->nbits / 8);
    unsigned used = (unsigned)(a->nbits % 8);
    unsigned nbytes = (used + n + 7) / 8;
    assert(at + nbytes <= a->cap);
    uint64_t w = used ? (uint64_t)(a->bytes[at] >> (8 - used)) << (64 - used) : 0;
    w |= v << (64 - used - n);
    for (unsigned i = 0; i < nbytes; i++)
        a->bytes[at + i] = (uint8_t)(w >> (56 - 8 * i));
    a->nbits += n;
}

static void xor_write_uvarint(chunk_xor_appender_t *a, uint64_t x)
{
    while (x >= 0x80) {
        xor_write_bits(a, (x & 0x7f) | 0x80, 8);
        x >>= 7;
    }
    xor_write_bits(a, x, 8);
}

static void xor_write_varint(chunk_xor_appender_t *a, int64_t t)
{
    uint64_t ux = (uint64_t)t << 1;
    if (t < 0)
        ux = ~ux;
    xor_write_uvarint(a, ux);
}

/* Go's bitRange: -(2^(n-1) - 1) <= x <= 2^(n-1). */
static bool xor_bit_range(int64_t x, unsigned n)
{
    int64_t half = (int64_t)1 << (n - 1);
    return -(half - 1) <= x && x <= half;
}

static void xor_write_value(chunk_xor_appender_t *a, uint64_t vbits)
{
    uint64_t delta = vbits ^ a->vbits;
    if (delta == 0) {
        xor_write_bits(a, 0, 1);
        return;
    }
    unsigned lead = (unsigned)__builtin_clzll(delta);
    unsigned trail = (unsigned)__builtin_ctzll(delta);
    if (lead >= 32)
        lead = 31; /* 5 bits of room */
    /* Fields are joined into as few writes as fit in 64 bits. */
    if (a->leading != XOR_NO_WINDOW && lead >= a->leading && trail >= a->trailing) {
        unsigned n = 64u - a->leading - a->trailing;
        if (n <= 62) {
            xor_write_bits(a, (uint64_t)0x2 << n | delta >> a->trailing, n + 2); /* 10 <bits> */
        } else {
            xor_write_bits(a, 0x2, 2);
            xor_write_bits(a, delta >> a->trailing, n);
        }
        return;
    }
    a->leading = (uint8_t)lead;
    a->trailing = (uint8_t)trail;
    unsigned sig = 64 - lead - trail;
    /* 11 <5 bits lead> <6 bits sig>: 64 does not fit in 6 bits; no XOR has 0 sig bits */
    uint64_t head = (uint64_t)0x3 << 11 | (uint64_t)lead << 6 | (sig & 63u);
    if (sig <= 51) {
        xor_write_bits(a, head << sig | delta >> trail, 13 + sig);
    } else {
        xor_write_bits(a, head, 13);
        xor_write_bits(a, delta >> trail, sig);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Appender                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static void xor_put_count(chunk_xor_appender_t *a)
{
    a->bytes[0] = (uint8_t)(a->num >> 8);
    a->bytes[1] = (uint8_t)(a->num & 0xff);
}

int chunk_xor_appender_init(chunk_xor_appender_t *a)
{
    memset(a, 0, sizeof(*a));
    a->leading = XOR_NO_WINDOW;
    if (xor_reserve(a, 0) != 0)
        return -1;
    xor_put_count(a);
    return 0;
}

void chunk_xor_appender_init_buf(chunk_xor_appender_t *a, uint8_t *buf, size_t cap)
{
    assert(buf && cap >= CHUNK_XOR_HEADER_BYTES);
    memset(a, 0, sizeof(*a));
    a->leading = XOR_NO_WINDOW;
    a->bytes = buf;
    a->cap = cap; /* stale bytes past the header are fine: each byte is zeroed when first written */
    xor_put_count(a);
}

void chunk_xor_appender_free(chunk_xor_appender_t *a)
{
    free(a->bytes);
    memset(a, 0, sizeof(*a));
}

/* Bits xor_write_value(a, vbits) writes. */
static unsigned xor_value_bits(const chunk_xor_appender_t *a, uint64_t vbits)
{
    uint64_t delta = vbits ^ a->vbits;
    if (delta == 0)
        return 1;
    unsigned lead = (unsigned)__builtin_clzll(delta);
    unsigned trail = (unsigned)__builtin_ctzll(delta);
    if (lead >= 32)
        lead = 31;
    if (a->leading != XOR_NO_WINDOW && lead >= a->leading && trail >= a->trailing)
        return 2 + 64u - a->leading - a->trailing;
    return 2 + 5 + 6 + (64 - lead - trail);
}

static unsigned xor_uvarint_bits(uint64_t x)
{
    unsigned n = 8;
    for (; x >= 0x80; x >>= 7)
        n += 8;
    return n;
}

unsigned chunk_xor_record_bits(const chunk_xor_appender_t *a, int64_t t, double v)
{
    uint64_t vbits;
    memcpy(&vbits, &v, sizeof(vbits));
    uint64_t tdelta = (uint64_t)t - (uint64_t)a->t;
    if (a->num == 0) {
        uint64_t ux = (uint64_t)t << 1;
        if (t < 0)
            ux = ~ux;
        return xor_uvarint_bits(ux) + 64;
    }
    if (a->num == 1)
        return xor_uvarint_bits(tdelta) + xor_value_bits(a, vbits);
    int64_t dod = (int64_t)(tdelta - (uint64_t)a->tdelta);
    unsigned tb = dod == 0                 ? 1
                  : xor_bit_range(dod, 14) ? 2 + 14
                  : xor_bit_range(dod, 17) ? 3 + 17
                  : xor_bit_range(dod, 20) ? 4 + 20
                                           : 4 + 64;
    return tb + xor_value_bits(a, vbits);
}

int chunk_xor_append(chunk_xor_appender_t *a, int64_t t, double v)
{
    assert(a->bytes != NULL);
    if (a->num == UINT16_MAX)
        return -1; /* the count would wrap; nobody cuts chunks this late */
    /* Room for the worst case is the usual state; only a chunk near its end asks what this
     * record takes, so a caller that sizes the buffer itself (head.c) need not keep 19 bytes
     * spare. */
    if (xor_used_bytes(a->nbits) + CHUNK_XOR_MAX_RECORD_BYTES > a->cap) {
        size_t need = xor_used_bytes(a->nbits + chunk_xor_record_bits(a, t, v));
        if (need > a->cap && xor_reserve(a, need - xor_used_bytes(a->nbits)) != 0)
            return -1;
    }
    uint64_t vbits;
    memcpy(&vbits, &v, sizeof(vbits));
    /* Deltas wrap in uint64 exactly as Go's uint64(t - a.t) does. */
    uint64_t tdelta = (uint64_t)t - (uint64_t)a->t;

    if (a->num == 0) {
        xor_write_varint(a, t);
        xor_write_bits(a, vbits, 64);
        tdelta = 0;
    } else if (a->num == 1) {
        xor_write_uvarint(a, tdelta);
        xor_write_value(a, vbits);
    } else {
        int64_t dod = (int64_t)(tdelta - (uint64_t)a->tdelta);
        if (dod == 0) {
            xor_write_bits(a, 0, 1);
        } else if (xor_bit_range(dod, 14)) {
            xor_write_bits(a, (uint64_t)0x2 << 14 | ((uint64_t)dod & 0x3fff), 2 + 14);
        } else if (xor_bit_range(dod, 17)) {
            xor_write_bits(a, (uint64_t)0x6 << 17 | ((uint64_t)dod & 0x1ffff), 3 + 17);
        } else if (xor_bit_range(dod, 20)) {
            xor_write_bits(a, (uint64_t)0xe << 20 | ((uint64_t)dod & 0xfffff), 4 + 20);
        } else {
            xor_write_bits(a, 0xf, 4);
            xor_write_bits(a, (uint64_t)dod, 64);
        }
        xor_write_value(a, vbits);
    }
    a->t = t;
    a->tdelta = (int64_t)tdelta;
    a->vbits = vbits;
    a->num++;
    xor_put_count(a);
    return 0;
}

const uint8_t *chunk_xor_bytes(const chunk_xor_appender_t *a, size_t *len)
{
    *len = xor_used_bytes(a->nbits);
    return a->bytes;
}

uint16_t chunk_xor_num(const chunk_xor_appender_t *a)
{
    return a->num;
}

void chunk_xor_appender_compact(chunk_xor_appender_t *a)
{
    size_t used = xor_used_bytes(a->nbits);
    if (used >= a->cap)
        return;
    uint8_t *p = realloc(a->bytes, used);
    if (p) { /* a failed shrink leaves the larger block in place, which is fine */
        a->bytes = p;
        a->cap = used;
    }
}

int chunk_xor_appender_from_bytes(chunk_xor_appender_t *a, const uint8_t *bytes, size_t len)
{
    chunk_xor_iter_t it;
    int64_t t;
    double v;
    memset(a, 0, sizeof(*a));
    chunk_xor_iter_init(&it, bytes, len);
    while (chunk_xor_iter_next(&it, &t, &v))
        ;
    if (it.err != 0)
        return -1;

    /* Keep only the bits the samples used: trailing bytes and padding bits are dropped so the
     * next append continues on a clean stream. */
    size_t used = xor_used_bytes(it.bitpos);
    size_t cap = used + 32;
    a->bytes = malloc(cap);
    if (!a->bytes)
        return -1;
    memcpy(a->bytes, bytes, used);
    a->cap = cap;
    if (it.bitpos % 8 != 0)
        a->bytes[used - 1] &= (uint8_t)(0xff00u >> (it.bitpos % 8));
    a->nbits = it.bitpos;
    a->num = it.num;
    a->t = it.t;
    a->tdelta = it.tdelta;
    a->vbits = it.vbits;
    a->leading = it.leading;
    a->trailing = it.trailing;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Iterator (bounds-checked bit reader)                                                       */
/* ------------------------------------------------------------------------------------------ */

/* The last bytes of a chunk, where no 64-bit load fits: byte by byte. The caller checked that n
 * bits are there. */
static __attribute__((noinline)) uint64_t xor_read_bits_tail(chunk_xor_iter_t *it, unsigned n)
{
    uint64_t v = 0;
    while (n > 0) {
        size_t at = CHUNK_XOR_HEADER_BYTES + (size_t)(it->bitpos / 8);
        unsigned used = (unsigned)(it->bitpos % 8);
        unsigned room = 8 - used;
        unsigned take = n < room ? n : room;
        unsigned part = ((unsigned)it->bytes[at] >> (room - take)) & ((1u << take) - 1);
        v = v << take | part;
        it->bitpos += take;
        n -= take;
    }
    return v;
}

/* Reads n bits (n <= 64) into *out; -1 if the stream ends first. */
static inline int xor_read_bits(chunk_xor_iter_t *it, unsigned n, uint64_t *out)
{
    assert(n <= 64);
    uint64_t avail = (uint64_t)(it->len - CHUNK_XOR_HEADER_BYTES) * 8;
    if (it->bitpos > avail || n > avail - it->bitpos)
        return -1;
    if (n == 0) {
        *out = 0;
        return 0;
    }
    size_t at = CHUNK_XOR_HEADER_BYTES + (size_t)(it->bitpos / 8);
    unsigned used = (unsigned)(it->bitpos % 8);
    /* Decoding is much of what a query over many series spends reading them: bits within one
     * byte (most reads: control bits) come from it directly, longer runs from one big-endian
     * 64-bit load (plus, when they straddle it, the next byte, which the length check above says
     * is there) instead of byte by byte. */
    if (used + n <= 8) {
        it->bitpos += n;
        *out = ((uint64_t)it->bytes[at] >> (8 - used - n)) & (((uint64_t)1 << n) - 1);
        return 0;
    }
    if (at + 8 > it->len) {
        *out = xor_read_bits_tail(it, n);
        return 0;
    }
    uint64_t w;
    memcpy(&w, it->bytes + at, sizeof(w));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    uint64_t v = (w << used) >> (64 - n);
    if (used + n > 64) {
        unsigned rest = used + n - 64; /* 1..7 bits of the next byte */
        v |= (uint64_t)it->bytes[at + 8] >> (8 - rest);
    }
    it->bitpos += n;
    *out = v;
    return 0;
}

/* Go's binary.ReadUvarint over 8-bit groups of the bit stream. */
static int xor_read_uvarint(chunk_xor_iter_t *it, uint64_t *out)
{
    uint64_t x = 0;
    unsigned shift = 0;
    for (int i = 0; i < 10; i++) {
        uint64_t b;
        if (xor_read_bits(it, 8, &b) != 0)
            return -1;
        if (b < 0x80) {
            if (i == 9 && b > 1)
                return -1; /* overflows 64 bits */
            *out = x | b << shift;
            return 0;
        }
        x |= (b & 0x7f) << shift;
        shift += 7;
    }
    return -1;
}

static int xor_read_value(chunk_xor_iter_t *it)
{
    uint64_t bit, bits;
    if (xor_read_bits(it, 1, &bit) != 0)
        return -1;
    if (bit == 0)
        return 0;
    if (xor_read_bits(it, 1, &bit) != 0)
        return -1;
    unsigned lead, trail, sig;
    if (bit == 0) {
        /* Before any window Prometheus' reader has L = T = 0, i.e. a full 64-bit window. */
        lead = it->leading == XOR_NO_WINDOW ? 0 : it->leading;
        trail = it->leading == XOR_NO_WINDOW ? 0 : it->trailing;
        sig = 64 - lead - trail;
    } else {
        if (xor_read_bits(it, 5, &bits) != 0)
            return -1;
        lead = (unsigned)bits;
        if (xor_read_bits(it, 6, &bits) != 0)
            return -1;
        sig = bits == 0 ? 64 : (unsigned)bits;
        if (lead + sig > 64)
            return -1; /* no encoder writes this window */
        trail = 64 - lead - sig;
        it->leading = (uint8_t)lead;
        it->trailing = (uint8_t)trail;
    }
    if (xor_read_bits(it, sig, &bits) != 0)
        return -1;
    it->vbits ^= trail == 64 ? 0 : bits << trail;
    return 0;
}

static int xor_read_dod(chunk_xor_iter_t *it, int64_t *dod)
{
    unsigned prefix = 0, i;
    uint64_t bit;
    for (i = 0; i < 4; i++) {
        if (xor_read_bits(it, 1, &bit) != 0)
            return -1;
        if (bit == 0)
            break;
        prefix++;
    }
    static const unsigned sizes[] = {0, 14, 17, 20, 64};
    unsigned sz = sizes[prefix];
    if (sz == 0) {
        *dod = 0;
        return 0;
    }
    uint64_t bits;
    if (xor_read_bits(it, sz, &bits) != 0)
        return -1;
    if (sz < 64 && bits > ((uint64_t)1 << (sz - 1)))
        bits -= (uint64_t)1 << sz; /* sign-extend; wraps to the two's complement */
    *dod = (int64_t)bits;
    return 0;
}

void chunk_xor_iter_init(chunk_xor_iter_t *it, const uint8_t *bytes, size_t len)
{
    memset(it, 0, sizeof(*it));
    it->bytes = bytes;
    it->len = len;
    it->leading = XOR_NO_WINDOW;
    if (len < CHUNK_XOR_HEADER_BYTES) {
        it->err = -1;
        it->len = CHUNK_XOR_HEADER_BYTES; /* keeps xor_read_bits' arithmetic away from wrap */
        return;
    }
    it->num = (uint16_t)((unsigned)bytes[0] << 8 | bytes[1]);
}

static int xor_iter_step(chunk_xor_iter_t *it)
{
    uint64_t u;
    if (it->read == 0) {
        if (xor_read_uvarint(it, &u) != 0)
            return -1;
        int64_t t = (int64_t)(u >> 1);
        if (u & 1)
            t = ~t;
        it->t = t;
        return xor_read_bits(it, 64, &it->vbits);
    }
    if (it->read == 1) {
        if (xor_read_uvarint(it, &u) != 0)
            return -1;
        it->tdelta = (int64_t)u;
        it->t = (int64_t)((uint64_t)it->t + u);
        return xor_read_value(it);
    }
    int64_t dod;
    if (xor_read_dod(it, &dod) != 0)
        return -1;
    uint64_t tdelta = (uint64_t)it->tdelta + (uint64_t)dod;
    it->tdelta = (int64_t)tdelta;
    it->t = (int64_t)((uint64_t)it->t + tdelta);
    return xor_read_value(it);
}

bool chunk_xor_iter_next(chunk_xor_iter_t *it, int64_t *t, double *v)
{
    if (it->err != 0 || it->read >= it->num)
        return false;
    if (xor_iter_step(it) != 0) {
        it->err = -1;
        return false;
    }
    it->read++;
    *t = it->t;
    memcpy(v, &it->vbits, sizeof(*v));
    return true;
}
