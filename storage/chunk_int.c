/*
 * chunk_int — the head's encoding for chunks of integer values (contract in chunk_int.h).
 *
 * Why: in Prometheus' XOR encoding a counter that grows by a varying amount costs ~2.7 bytes per
 * sample (the XOR of two nearby doubles differs in ~11 mantissa bits and the window keeps
 * moving), although the amount itself carries ~1 byte of information. A closed chunk is written
 * once and its samples are all known, so the encoder can measure layouts 0-2 below and keep the
 * smallest; the head keeps the XOR bytes instead when they are not larger. An open chunk cannot
 * know its samples ahead, so it uses layout 3, whose code adapts as samples arrive (~10 bits per
 * sample of such a counter, 1 per sample of a gauge standing still).
 *
 * Format
 * ======
 *   offset  size  field
 *   0       2     sample count n, big-endian uint16, >= 1
 *   2       var   t0: Go's zigzag varint, byte-aligned right after the count as in an XOR chunk
 *                 (so both encodings give their first timestamp the same way)
 *           var   v0: the first value as a zigzag varint (an integer, |v0| <= 2^53)
 *   only when n >= 2:
 *           var   d1 = t1 - t0, unsigned varint (> 0)
 *           1     modes: bits 0..1 tmode, bits 2..3 vmode, bit 4 vmode 3's predictor, other
 *                 bits 0
 *           ...   vmode's header (below)
 *           bits  from the next byte on, MSB first, the last byte zero-padded: for each sample
 *                 i = 1..n-1 its timestamp bits, then its value bits
 *
 *   Timestamps (d_i = t_i - t_(i-1)):
 *     tmode 0   every d_i equals d1: no bits
 *     tmode 1   for i >= 2: varbit(d_i - d_(i-1)); sample 1 has no timestamp bits
 *   Values (D_i = v_i - v_(i-1), as int64):
 *     vmode 0   packed deltas. Header: zigzag varint base, 1 byte width w (0..64). Each sample
 *               i >= 1: w bits, the unsigned number D_i - base. (A steady counter's or a constant
 *               gauge's chunk has w = 0: its values cost no bits.)
 *     vmode 1   each sample i >= 1: varbit(D_i). (Gauges that mostly stand still.)
 *     vmode 2   header: zigzag varint D_1. Each sample i >= 2: varbit(D_i - D_(i-1)).
 *               (Counters with a steady rate.)
 *     vmode 3   appendable; modes bit 4 is its predictor p, Rice parameter k starts at 0.
 *               p = 0: each sample i >= 1: one bit, 0 if D_i = 0, else 1 and then
 *                      rice(zigzag(D_i) - 1). (Gauges that mostly stand still.)
 *               p = 1: header: D_1 as 4 bytes, little-endian int32. Each sample i >= 2:
 *                      rice(zigzag(D_i - D_1)). (Counters.)
 *               rice(u): q = u >> k; if q < 16: q one bits, a zero bit, then u's low k bits;
 *               else 16 one bits, then L = u's bit length in 7 bits, then u's L bits. After it,
 *               with m = bit length of u minus 1 (0 for u <= 1): k += (m - k + 1) / 2 if m > k,
 *               else k -= 1 if m < k.
 *               An appender writes what the samples so far decide: tmode 1 iff some d_i differs
 *               from d1, p = 1 iff n >= 4, D_1, D_2 and D_3 are non-zero and D_1 fits an int32.
 *               When that changes, or the count reaches 2 (the header grows) or 4, it re-encodes
 *               the chunk.
 *
 *   varbit(x), x a signed integer:
 *     prefix   payload   x in
 *     0        -         0
 *     10       4 bits    -8 .. 7
 *     110      8 bits    -128 .. 127
 *     1110     12 bits   -2048 .. 2047
 *     11110    20 bits   -2^19 .. 2^19-1
 *     111110   32 bits   -2^31 .. 2^31-1
 *     111111   64 bits   anything else
 *   The payload is x's two's complement, low bits, sign-extended on reading.
 *
 * Worked example (asserted byte for byte in tests/unit/storage/test_chunk_int.c): samples
 * (1000, 5), (2000, 7), (3000, 9)
 *   00 03       count 3
 *   d0 0f       t0 = 1000 (zigzag 2000)
 *   0a          v0 = 5 (zigzag 10)
 *   e8 07       d1 = 1000
 *   00          tmode 0, vmode 0
 *   04 00       base 2 (zigzag 4), width 0: both deltas are exactly 2, no bits follow
 *
 * The same as they arrive one at a time, with (4000, 12), (5000, 14) after them (vmode 3):
 *   00 05 d0 0f 0a e8 07   count 5, t0, v0, d1 as above
 *   1c                     tmode 0, vmode 3, predictor 1 (D_1, D_2, D_3 = 2, 2, 3)
 *   02 00 00 00            D_1 = 2
 *   60                     0 | 110 | 0 0: rice(0) at k 0; rice(zigzag(1) = 2) at k 0, k becomes 1;
 *                          rice(0) at k 1 (its low bit), k back to 0; zero padding
 *
 * The iterator checks every read against the slice's length; values are summed in uint64 (they
 * wrap, as Go's would, instead of overflowing) so no input can make it misbehave.
 */
#include "storage/chunk_int.h"

#include <math.h>
#include <string.h>

#include "internal/util/varint.h"

#define MAX_ABS 9007199254740992.0 /* 2^53: every integer up to it is a double exactly */

static const uint8_t VB_PAYLOAD[7] = {0, 4, 8, 12, 20, 32, 64};
/* rice(u): quotients from this on escape to u's bit length and bits */
#define RICE_ESC 16

bool chunk_int_holds(double v)
{
    if (!(v >= -MAX_ABS && v <= MAX_ABS)) /* NaN fails both */
        return false;
    if (v != (double)(int64_t)v)
        return false;
    return v != 0 || !signbit(v);
}

static unsigned bit_len(uint64_t x)
{
    return x ? 64u - (unsigned)__builtin_clzll(x) : 0;
}

/* The varbit bucket of x (index into VB_PAYLOAD): a b-bit payload holds x exactly when x's
 * zigzag form is below 2^b, so the bucket follows from that form's bit length. */
static unsigned vb_bucket(int64_t x)
{
    static const uint8_t by_len[65] = {0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5,
                                       5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
                                       6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6};
    return by_len[bit_len(varint_zigzag(x))];
}

static unsigned vb_prefix_bits(unsigned k)
{
    return k < 6 ? k + 1 : 6;
}

static uint64_t vb_bits(int64_t x)
{
    static const uint8_t cost[7] = {1, 2 + 4, 3 + 8, 4 + 12, 5 + 20, 6 + 32, 6 + 64};
    return cost[vb_bucket(x)];
}

/* vmode 3's Rice parameter after coding u (both sides run this). */
static void rice_adapt(uint8_t *k, uint64_t u)
{
    unsigned m = u > 1 ? bit_len(u) - 1 : 0;
    if (m > *k)
        *k = (uint8_t)(*k + (m - *k + 1) / 2);
    else if (m < *k)
        (*k)--;
}

/* The layout the encoder chose, and what it costs. */
typedef struct {
    unsigned tmode, vmode, width;
    int64_t base;  /* vmode 0: the smallest delta; vmode 2: D_1 */
    size_t hdr;    /* bytes from the count up to the bit stream */
    uint64_t bits; /* bits in the stream */
} plan_t;

static int64_t ival(double v)
{
    return (int64_t)v;
}

/* Measures every layout; false if the samples cannot be encoded. */
static bool plan_make(const int64_t *t, const double *v, size_t n, plan_t *p)
{
    if (n == 0 || n > UINT16_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!chunk_int_holds(v[i]))
            return false;
        if (i && (t[i] <= t[i - 1] || (uint64_t)t[i] - (uint64_t)t[i - 1] > INT32_MAX))
            return false;
    }
    *p = (plan_t){0};
    p->hdr = CHUNK_INT_HEADER_BYTES + varint_len(varint_zigzag(t[0])) + varint_len(varint_zigzag(ival(v[0])));
    if (n == 1)
        return true;
    int64_t d1 = t[1] - t[0];
    p->hdr += varint_len((uint64_t)d1) + 1;

    bool regular = true;
    for (size_t i = 2; i < n && regular; i++)
        regular = t[i] - t[i - 1] == d1;
    uint64_t tbits = 0;
    for (size_t i = 2; i < n && !regular; i++)
        tbits += vb_bits((t[i] - t[i - 1]) - (t[i - 1] - t[i - 2]));
    p->tmode = regular ? 0 : 1;

    int64_t dmin = INT64_MAX, dmax = INT64_MIN;
    uint64_t b1 = 0, b2 = 0;
    int64_t dprev = 0;
    for (size_t i = 1; i < n; i++) {
        int64_t d = ival(v[i]) - ival(v[i - 1]);
        dmin = d < dmin ? d : dmin;
        dmax = d > dmax ? d : dmax;
        b1 += vb_bits(d);
        if (i >= 2)
            b2 += vb_bits(d - dprev);
        dprev = d;
    }
    unsigned w = bit_len((uint64_t)dmax - (uint64_t)dmin);
    uint64_t b0 = (uint64_t)w * (n - 1);
    size_t h0 = varint_len(varint_zigzag(dmin)) + 1;
    int64_t D1 = ival(v[1]) - ival(v[0]);
    size_t h2 = varint_len(varint_zigzag(D1));
    /* Whole bytes decide: compare header bytes plus stream bytes. */
    size_t c0 = h0 + (size_t)((tbits + b0 + 7) / 8), c1 = (size_t)((tbits + b1 + 7) / 8),
           c2 = h2 + (size_t)((tbits + b2 + 7) / 8);
    if (c0 <= c1 && c0 <= c2) {
        p->vmode = 0, p->width = w, p->base = dmin, p->hdr += h0, p->bits = tbits + b0;
    } else if (c1 <= c2) {
        p->vmode = 1, p->bits = tbits + b1;
    } else {
        p->vmode = 2, p->base = D1, p->hdr += h2, p->bits = tbits + b2;
    }
    return true;
}

size_t chunk_int_size(const int64_t *t, const double *v, size_t n)
{
    plan_t p;
    if (!plan_make(t, v, n, &p))
        return 0;
    return p.hdr + (size_t)((p.bits + 7) / 8);
}

/* ---- bit writer ---------------------------------------------------------------------------- */

/* Writes x's low n (<= 64) bits at bit *nb of buf, MSB first; buf NULL only counts. A byte the
 * stream enters is overwritten, not or'ed into, so what lies past the chunk's end never shows. */
static void ab_put(uint8_t *buf, uint64_t *nb, uint64_t x, unsigned n)
{
    if (!buf) {
        *nb += n;
        return;
    }
    while (n) {
        unsigned off = (unsigned)(*nb & 7), room = 8 - off, take = n < room ? n : room;
        uint8_t bits = (uint8_t)(((x >> (n - take)) & ((1u << take) - 1)) << (room - take));
        uint8_t *p = buf + (*nb >> 3);
        *p = off ? (uint8_t)(*p | bits) : bits;
        *nb += take;
        n -= take;
    }
}

static void ab_varbit(uint8_t *buf, uint64_t *nb, int64_t x)
{
    unsigned k = vb_bucket(x);
    ab_put(buf, nb, k < 6 ? (((uint64_t)1 << k) - 1) << 1 : 0x3f, vb_prefix_bits(k));
    ab_put(buf, nb, (uint64_t)x, VB_PAYLOAD[k]);
}

static void ab_rice(uint8_t *buf, uint64_t *nb, uint8_t *k, uint64_t u)
{
    uint64_t q = u >> *k;
    if (q < RICE_ESC) {
        ab_put(buf, nb, (((uint64_t)1 << q) - 1) << 1, (unsigned)q + 1);
        ab_put(buf, nb, u, *k);
    } else {
        unsigned l = bit_len(u);
        ab_put(buf, nb, ((uint64_t)1 << RICE_ESC) - 1, RICE_ESC);
        ab_put(buf, nb, l, 7);
        ab_put(buf, nb, u, l);
    }
    rice_adapt(k, u);
}

static uint8_t *put_varint(uint8_t *p, uint8_t *end, uint64_t x, bool *over)
{
    if ((size_t)(end - p) < varint_len(x)) {
        *over = true;
        return p;
    }
    return p + varint_encode(p, x);
}

size_t chunk_int_encode(const int64_t *t, const double *v, size_t n, uint8_t *out, size_t cap)
{
    plan_t pl;
    if (!plan_make(t, v, n, &pl))
        return 0;
    size_t len = pl.hdr + (size_t)((pl.bits + 7) / 8);
    if (len > cap)
        return 0;
    uint8_t *p = out, *end = out + cap;
    bool over = false;
    p[0] = (uint8_t)(n >> 8);
    p[1] = (uint8_t)n;
    p += 2;
    p = put_varint(p, end, varint_zigzag(t[0]), &over);
    p = put_varint(p, end, varint_zigzag(ival(v[0])), &over);
    if (n >= 2) {
        p = put_varint(p, end, (uint64_t)(t[1] - t[0]), &over);
        if (p < end)
            *p++ = (uint8_t)(pl.tmode | pl.vmode << 2);
        if (pl.vmode == 0) {
            p = put_varint(p, end, varint_zigzag(pl.base), &over);
            if (p < end)
                *p++ = (uint8_t)pl.width;
        } else if (pl.vmode == 2) {
            p = put_varint(p, end, varint_zigzag(pl.base), &over);
        }
        /* len <= cap was checked and the plan is exact, so the stream fits */
        uint64_t nb = over ? 0 : (uint64_t)(p - out) * 8;
        for (size_t i = 1; i < n && !over; i++) {
            if (pl.tmode == 1 && i >= 2)
                ab_varbit(out, &nb, (t[i] - t[i - 1]) - (t[i - 1] - t[i - 2]));
            int64_t d = ival(v[i]) - ival(v[i - 1]);
            if (pl.vmode == 0)
                ab_put(out, &nb, (uint64_t)d - (uint64_t)pl.base, pl.width);
            else if (pl.vmode == 1)
                ab_varbit(out, &nb, d);
            else if (i >= 2)
                ab_varbit(out, &nb, d - (ival(v[i - 1]) - ival(v[i - 2])));
        }
        p = out + (nb + 7) / 8;
    }
    if (over || (size_t)(p - out) != len)
        return 0;
    return len;
}

/* ---- appender (vmode 3) -------------------------------------------------------------------- */

static void ab_count(const chunk_int_appender_t *a)
{
    a->bytes[0] = (uint8_t)(a->num >> 8);
    a->bytes[1] = (uint8_t)a->num;
}

/* The stream bits of sample number a->num (>= 1) into buf (NULL: only counts); a moves past it. */
static void app_sample(chunk_int_appender_t *a, uint8_t *buf, int64_t t, int64_t v)
{
    int64_t td = t - a->t;
    if (a->tmode == 1 && a->num >= 2)
        ab_varbit(buf, &a->nbits, td - a->td);
    int64_t d = (int64_t)((uint64_t)v - (uint64_t)a->v);
    if (a->pred) {
        if (a->num >= 2)
            ab_rice(buf, &a->nbits, &a->k, varint_zigzag((int64_t)((uint64_t)d - (uint64_t)(int64_t)a->d1v)));
    } else {
        ab_put(buf, &a->nbits, d != 0, 1);
        if (d)
            ab_rice(buf, &a->nbits, &a->k, varint_zigzag(d) - 1);
    }
    a->t = t;
    a->td = td;
    a->v = v;
    a->num++;
}

/* Encodes n >= 1 samples whole into buf (NULL: only measures), in the layout they decide; a
 * ends as the appender after them (bytes and cap untouched). */
static void app_encode(chunk_int_appender_t *a, uint8_t *buf, const int64_t *t, const int64_t *v, size_t n)
{
    a->k = 0;
    a->tmode = 0;
    a->pred = 0;
    a->d1v = 0;
    for (size_t i = 2; i < n; i++)
        if (t[i] - t[i - 1] != t[1] - t[0])
            a->tmode = 1;
    if (n >= 4) {
        int64_t d1 = v[1] - v[0];
        a->pred = d1 != 0 && v[2] != v[1] && v[3] != v[2] && d1 >= INT32_MIN && d1 <= INT32_MAX;
        a->d1v = a->pred ? (int32_t)d1 : 0;
    }
    uint8_t tmp[2 + 3 * 10 + 1 + 4];
    uint8_t *p = tmp + 2;
    p += varint_encode(p, varint_zigzag(t[0]));
    p += varint_encode(p, varint_zigzag(v[0]));
    if (n >= 2) {
        p += varint_encode(p, (uint64_t)(t[1] - t[0]));
        *p++ = (uint8_t)(a->tmode | 3 << 2 | a->pred << 4);
        if (a->pred) {
            uint32_t u = (uint32_t)a->d1v;
            for (int i = 0; i < 4; i++)
                *p++ = (uint8_t)(u >> (8 * i));
        }
    }
    a->hdr = (uint8_t)(p - tmp);
    if (buf)
        memcpy(buf + 2, tmp + 2, a->hdr - 2u);
    a->nbits = (uint64_t)a->hdr * 8;
    a->num = 1;
    a->t = t[0];
    a->td = 0;
    a->v = v[0];
    for (size_t i = 1; i < n; i++)
        app_sample(a, buf, t[i], v[i]);
}

void chunk_int_appender_init(chunk_int_appender_t *a, uint8_t *buf, size_t cap)
{
    *a = (chunk_int_appender_t){.bytes = buf, .cap = cap};
}

size_t chunk_int_appender_len(const chunk_int_appender_t *a)
{
    return a->num ? (size_t)((a->nbits + 7) / 8) : 0;
}

bool chunk_int_append_rewrites(const chunk_int_appender_t *a, int64_t t)
{
    return a->num <= 1 || a->num == 3 || (a->tmode == 0 && t - a->t != a->td);
}

static bool app_accepts(const chunk_int_appender_t *a, int64_t t, int64_t v)
{
    if (a->num >= CHUNK_INT_APPEND_MAX_SAMPLES || v < -(INT64_C(1) << 53) || v > (INT64_C(1) << 53))
        return false;
    return a->num == 0 || (t > a->t && (uint64_t)t - (uint64_t)a->t <= INT32_MAX);
}

/* The samples so far plus (t, v), decoded into ts/vs; their count, 0 if the bytes do not decode. */
static size_t app_samples(const chunk_int_appender_t *a, int64_t t, int64_t v, int64_t *ts, int64_t *vs)
{
    chunk_int_iter_t it;
    chunk_int_iter_init(&it, a->bytes, chunk_int_appender_len(a));
    size_t n = 0;
    double d;
    while (n < a->num && chunk_int_iter_next(&it, &ts[n], &d))
        vs[n++] = (int64_t)d;
    if (n != a->num)
        return 0;
    ts[n] = t;
    vs[n] = v;
    return n + 1;
}

size_t chunk_int_append_size(const chunk_int_appender_t *a, int64_t t, int64_t v)
{
    if (!app_accepts(a, t, v))
        return 0;
    chunk_int_appender_t b = *a;
    if (chunk_int_append_rewrites(a, t)) {
        int64_t ts[CHUNK_INT_APPEND_MAX_SAMPLES], vs[CHUNK_INT_APPEND_MAX_SAMPLES];
        size_t n = app_samples(a, t, v, ts, vs);
        if (!n)
            return 0;
        app_encode(&b, NULL, ts, vs, n);
    } else {
        app_sample(&b, NULL, t, v);
    }
    return (size_t)((b.nbits + 7) / 8);
}

int chunk_int_append(chunk_int_appender_t *a, int64_t t, int64_t v)
{
    if (!app_accepts(a, t, v))
        return -1;
    if (chunk_int_append_rewrites(a, t)) {
        int64_t ts[CHUNK_INT_APPEND_MAX_SAMPLES], vs[CHUNK_INT_APPEND_MAX_SAMPLES];
        size_t n = app_samples(a, t, v, ts, vs);
        chunk_int_appender_t b = *a;
        if (!n)
            return -1;
        app_encode(&b, NULL, ts, vs, n);
        if ((b.nbits + 7) / 8 > a->cap)
            return -1;
        app_encode(a, a->bytes, ts, vs, n);
    } else {
        if (chunk_int_appender_len(a) + CHUNK_INT_APPEND_MAX_BYTES > a->cap) {
            chunk_int_appender_t b = *a;
            app_sample(&b, NULL, t, v);
            if ((b.nbits + 7) / 8 > a->cap)
                return -1;
        }
        app_sample(a, a->bytes, t, v);
    }
    ab_count(a);
    return 0;
}

/* ---- iterator ------------------------------------------------------------------------------ */

void chunk_int_iter_init(chunk_int_iter_t *it, const uint8_t *bytes, size_t len)
{
    memset(it, 0, sizeof(*it));
    it->bytes = bytes;
    it->len = len;
    if (len < CHUNK_INT_HEADER_BYTES) {
        it->err = len ? -1 : 0;
        return;
    }
    it->num = (uint16_t)(bytes[0] << 8 | bytes[1]);
}

/* The next n bits (n <= 56), zero-filled past the end; does not advance. */
static uint64_t br_peek(const chunk_int_iter_t *it, unsigned n)
{
    size_t byte = (size_t)(it->bitpos >> 3);
    unsigned off = (unsigned)(it->bitpos & 7);
    uint64_t w = 0;
    if (byte + 8 <= it->len) {
        memcpy(&w, it->bytes + byte, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        w = __builtin_bswap64(w); /* the stream is MSB first */
#endif
    } else {
        for (size_t i = 0; i < 8; i++)
            w = w << 8 | (byte + i < it->len ? it->bytes[byte + i] : 0);
    }
    return n ? (w << off) >> (64 - n) : 0;
}

static bool br_get(chunk_int_iter_t *it, unsigned n, uint64_t *out)
{
    if (it->bitpos + n > (uint64_t)it->len * 8)
        return false;
    if (n > 56) {
        uint64_t hi = br_peek(it, n - 32);
        it->bitpos += n - 32;
        *out = hi << 32 | br_peek(it, 32);
        it->bitpos += 32;
        return true;
    }
    *out = br_peek(it, n);
    it->bitpos += n;
    return true;
}

static bool br_varbit(chunk_int_iter_t *it, int64_t *x)
{
    uint64_t pre = br_peek(it, 6);
    unsigned k = (unsigned)__builtin_clzll(~(pre << 58)); /* leading ones, at most 6 */
    if (k > 6)
        k = 6;
    unsigned pb = vb_prefix_bits(k), b = VB_PAYLOAD[k];
    if (it->bitpos + pb > (uint64_t)it->len * 8)
        return false;
    it->bitpos += pb;
    uint64_t u;
    if (!br_get(it, b, &u))
        return false;
    if (b && b < 64 && (u >> (b - 1)))
        u -= (uint64_t)1 << b;
    *x = (int64_t)u;
    return true;
}

static bool br_rice(chunk_int_iter_t *it, uint64_t *u)
{
    uint64_t pre = br_peek(it, RICE_ESC + 1);
    unsigned q = (unsigned)__builtin_clzll(~(pre << (63 - RICE_ESC))); /* leading ones */
    if (q > RICE_ESC)
        q = RICE_ESC;
    if (q < RICE_ESC) {
        uint64_t low;
        if (it->bitpos + q + 1 > (uint64_t)it->len * 8)
            return false;
        it->bitpos += q + 1;
        if (!br_get(it, it->k, &low))
            return false;
        *u = (uint64_t)q << it->k | low;
    } else {
        uint64_t l;
        if (it->bitpos + RICE_ESC > (uint64_t)it->len * 8)
            return false;
        it->bitpos += RICE_ESC;
        if (!br_get(it, 7, &l) || l > 64 || !br_get(it, (unsigned)l, u))
            return false;
    }
    rice_adapt(&it->k, *u);
    return true;
}

static bool iter_fail(chunk_int_iter_t *it)
{
    it->err = -1;
    return false;
}

static bool iter_header(chunk_int_iter_t *it)
{
    const uint8_t *p = it->bytes + CHUNK_INT_HEADER_BYTES, *end = it->bytes + it->len;
    uint64_t u;
    if (varint_get(&p, end, &u) != VARINT_OK)
        return false;
    it->t = varint_unzigzag(u);
    if (varint_get(&p, end, &u) != VARINT_OK)
        return false;
    it->v = varint_unzigzag(u);
    if (it->num >= 2) {
        if (varint_get(&p, end, &u) != VARINT_OK || p >= end)
            return false;
        it->td = (int64_t)u;
        uint8_t m = *p++;
        it->tmode = m & 3;
        it->vmode = (m >> 2) & 3;
        it->pred = (m >> 4) & 1;
        if (it->tmode > 1 || (m >> 5) || (it->pred && it->vmode != 3))
            return false;
        if (it->vmode == 0) {
            if (varint_get(&p, end, &u) != VARINT_OK || p >= end)
                return false;
            it->base = varint_unzigzag(u);
            it->width = *p++;
            if (it->width > 64)
                return false;
        } else if (it->vmode == 2) {
            if (varint_get(&p, end, &u) != VARINT_OK)
                return false;
            it->vd = varint_unzigzag(u);
        } else if (it->pred) {
            if (end - p < 4)
                return false;
            it->vd = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            p += 4;
        }
    }
    it->bitpos = (uint64_t)(p - it->bytes) * 8;
    return true;
}

bool chunk_int_iter_next(chunk_int_iter_t *it, int64_t *t, double *v)
{
    if (it->err || it->read >= it->num)
        return false;
    if (it->read == 0) {
        if (!iter_header(it))
            return iter_fail(it);
    } else {
        if (it->read >= 2 && it->tmode == 1) {
            int64_t dod;
            if (!br_varbit(it, &dod))
                return iter_fail(it);
            it->td = (int64_t)((uint64_t)it->td + (uint64_t)dod);
        }
        it->t = (int64_t)((uint64_t)it->t + (uint64_t)it->td);
        int64_t d;
        if (it->vmode == 0) {
            uint64_t u;
            /* the common widths read in place: this is the closed counters' inner loop */
            if (it->width <= 56 && it->bitpos + it->width <= (uint64_t)it->len * 8) {
                u = br_peek(it, it->width);
                it->bitpos += it->width;
            } else if (!br_get(it, it->width, &u)) {
                return iter_fail(it);
            }
            d = (int64_t)((uint64_t)it->base + u);
        } else if (it->vmode == 1) {
            /* a gauge standing still, most of its samples: the 1-bit "0" read in place */
            if (it->bitpos < (uint64_t)it->len * 8 && !br_peek(it, 1)) {
                d = 0;
                it->bitpos++;
            } else if (!br_varbit(it, &d)) {
                return iter_fail(it);
            }
        } else if (it->vmode == 2) {
            int64_t dd = 0;
            if (it->read >= 2 && !br_varbit(it, &dd))
                return iter_fail(it);
            it->vd = (int64_t)((uint64_t)it->vd + (uint64_t)dd);
            d = it->vd;
        } else if (it->pred) {
            uint64_t u = 0;
            if (it->read >= 2 && !br_rice(it, &u))
                return iter_fail(it);
            d = (int64_t)((uint64_t)it->vd + (uint64_t)varint_unzigzag(u));
        } else {
            uint64_t u = 0;
            if (it->bitpos >= (uint64_t)it->len * 8)
                return iter_fail(it);
            bool flag = br_peek(it, 1);
            it->bitpos++;
            if (flag && !br_rice(it, &u))
                return iter_fail(it);
            d = flag ? varint_unzigzag(u + 1) : 0;
        }
        it->v = (int64_t)((uint64_t)it->v + (uint64_t)d);
    }
    it->read++;
    *t = it->t;
    *v = (double)it->v;
    return true;
}
