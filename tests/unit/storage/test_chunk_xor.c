/* Unit tests for storage/chunk_xor.c: a byte-exact vector worked out by hand from the format
 * table, round trips over awkward values and timestamps (bit-exact, NaN payloads included), the
 * size of every delta-of-delta bucket at its boundaries, truncated and random input, and
 * reopening a chunk for append, the exact size of the next record. Interop with a real Prometheus is
 * tests/integration/test_chunk_interop.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "storage/chunk_xor.h"

typedef struct {
    int64_t t;
    uint64_t vbits;
} sample_t;

static double from_bits(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof(v));
    return v;
}

static uint64_t to_bits(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
}

/* xorshift64*: a fixed-seed generator so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void encode(chunk_xor_appender_t *a, const sample_t *s, size_t n)
{
    assert_int_equal(chunk_xor_appender_init(a), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(chunk_xor_append(a, s[i].t, from_bits(s[i].vbits)), 0);
    assert_int_equal(chunk_xor_num(a), n);
}

/* Decodes bytes and asserts they hold exactly s[0..n), values compared by bits. */
static void assert_decodes_to(const uint8_t *b, size_t len, const sample_t *s, size_t n)
{
    chunk_xor_iter_t it;
    int64_t t;
    double v;
    size_t i = 0;
    chunk_xor_iter_init(&it, b, len);
    while (chunk_xor_iter_next(&it, &t, &v)) {
        assert_true(i < n);
        assert_int_equal(t, s[i].t);
        assert_int_equal(to_bits(v), s[i].vbits);
        i++;
    }
    assert_int_equal(it.err, 0);
    assert_int_equal(i, n);
}

static void round_trip(const sample_t *s, size_t n)
{
    chunk_xor_appender_t a;
    size_t len;
    encode(&a, s, n);
    const uint8_t *b = chunk_xor_bytes(&a, &len);
    assert_decodes_to(b, len, s, n);
    chunk_xor_appender_compact(&a);
    b = chunk_xor_bytes(&a, &len);
    assert_decodes_to(b, len, s, n);
    chunk_xor_appender_free(&a);
}

static void test_hand_vector(void **state)
{
    static const uint8_t want[] = {0x00, 0x03, 0xd0, 0x0f, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00,
                                   0x00, 0x00, 0xe8, 0x07, 0x40, 0xfa, 0x61, 0x33, 0xff, 0xc0};
    const sample_t s[] = {{1000, to_bits(1.0)}, {2000, to_bits(1.0)}, {3500, to_bits(3.0)}};
    chunk_xor_appender_t a;
    size_t len;
    encode(&a, s, 3);
    const uint8_t *b = chunk_xor_bytes(&a, &len);
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(b, want, sizeof(want));
    assert_decodes_to(want, sizeof(want), s, 3);
    chunk_xor_appender_free(&a);
}

/* A second hand vector: a negative first timestamp (zigzag), and a value XOR reusing the window
 * of the previous one. (-1, 0.0) (0, 2.0) (1, 3.0):
 *   00 03 | 01 (zigzag -1) | 00*8 (0.0) | 01 (uvarint 1)
 *   2.0 ^ 0.0 = 0x4000000000000000: 1 1 00001 000001 1   (lz 1, sig 1, bits 1)
 *   dod 0: 0
 *   3.0 ^ 2.0 = 0x0008000000000000: lz 12 >= 1 but tz 51 >= 62? no -> new window:
 *     1 1 01100 000001 1                                  (lz 12, sig 1, bits 1)
 *   bits: 11 00001 000001 1 | 0 | 11 01100 000001 1 -> 11000010 00001101 10110000 00011000
 */
static void test_hand_vector_negative_and_window(void **state)
{
    static const uint8_t want[] = {0x00, 0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
                                   0x00, 0x00, 0x00, 0x01, 0xc2, 0x0d, 0xb0, 0x18};
    const sample_t s[] = {{-1, to_bits(0.0)}, {0, to_bits(2.0)}, {1, to_bits(3.0)}};
    chunk_xor_appender_t a;
    size_t len;
    encode(&a, s, 3);
    const uint8_t *b = chunk_xor_bytes(&a, &len);
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(b, want, sizeof(want));
    chunk_xor_appender_free(&a);
}

static void test_empty_and_single(void **state)
{
    chunk_xor_appender_t a;
    size_t len;
    assert_int_equal(chunk_xor_appender_init(&a), 0);
    const uint8_t *b = chunk_xor_bytes(&a, &len);
    assert_int_equal(len, 2);
    assert_int_equal(b[0], 0);
    assert_int_equal(b[1], 0);
    assert_decodes_to(b, len, NULL, 0);
    chunk_xor_appender_free(&a);

    const sample_t one[] = {{1700000000123, to_bits(42.5)}};
    round_trip(one, 1);
}

static void test_edge_values(void **state)
{
    const uint64_t vals[] = {
        to_bits(NAN),
        0x7ff0000000000002ull, /* staleness marker */
        0x7ff8000000000001ull, /* Go's math.NaN() */
        0xfff8000000000000ull, /* negative quiet NaN */
        to_bits(INFINITY),
        to_bits(-INFINITY),
        to_bits(-0.0),
        to_bits(0.0),
        to_bits(DBL_MIN / 4), /* denormal */
        1,                    /* smallest denormal */
        to_bits(-DBL_MIN / 8),
        to_bits(DBL_MAX),
        to_bits(-DBL_MAX),
        to_bits(DBL_MIN),
        0x7ff0000000000002ull,
        0x7ff0000000000002ull,
        to_bits(1e-300),
        to_bits(123456789.125),
        0xffffffffffffffffull, /* all bits: XOR window of 64 significant bits */
        0,
        0x8000000000000001ull, /* lz 0, tz 0 -> sig 64 written as 0 */
        1,
        0x8000000000000000ull,
    };
    size_t n = sizeof(vals) / sizeof(vals[0]);
    sample_t s[64];
    for (size_t i = 0; i < n; i++) {
        s[i].t = 1700000000000 + (int64_t)i * 15000;
        s[i].vbits = vals[i];
    }
    round_trip(s, n);
    /* And every ordered pair on its own, so each XOR lands right after the first window. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            sample_t p[3] = {{10, vals[i]}, {20, vals[j]}, {30, vals[i]}};
            round_trip(p, 3);
        }
}

/* Bits one record takes for a delta-of-delta, measured on constant-valued chunks. */
static uint64_t dod_bits(int64_t dod)
{
    chunk_xor_appender_t a;
    int64_t d1 = 10000000;
    sample_t s[3] = {{0, 0}, {d1, 0}, {2 * d1 + dod, 0}};
    encode(&a, s, 2);
    uint64_t before = a.nbits;
    assert_int_equal(chunk_xor_append(&a, s[2].t, 0.0), 0);
    uint64_t used = a.nbits - before - 1; /* minus the '0' of the repeated value */
    size_t len;
    const uint8_t *b = chunk_xor_bytes(&a, &len);
    assert_decodes_to(b, len, s, 3);
    chunk_xor_appender_free(&a);
    return used;
}

static void test_dod_buckets(void **state)
{
    assert_int_equal(dod_bits(0), 1);
    assert_int_equal(dod_bits(1), 2 + 14);
    assert_int_equal(dod_bits(-1), 2 + 14);
    assert_int_equal(dod_bits(8192), 2 + 14);
    assert_int_equal(dod_bits(-8191), 2 + 14);
    assert_int_equal(dod_bits(8193), 3 + 17);
    assert_int_equal(dod_bits(-8192), 3 + 17);
    assert_int_equal(dod_bits(65536), 3 + 17);
    assert_int_equal(dod_bits(-65535), 3 + 17);
    assert_int_equal(dod_bits(65537), 4 + 20);
    assert_int_equal(dod_bits(-65536), 4 + 20);
    assert_int_equal(dod_bits(524288), 4 + 20);
    assert_int_equal(dod_bits(-524287), 4 + 20);
    assert_int_equal(dod_bits(524289), 4 + 64);
    assert_int_equal(dod_bits(-524288), 4 + 64);
    assert_int_equal(dod_bits(-9999999), 4 + 64);
    assert_int_equal(dod_bits(86400000000LL), 4 + 64);
}

static void test_timestamp_jumps(void **state)
{
    /* Irregular gaps that cross every bucket in both directions, plus extreme timestamps. */
    const int64_t gaps[] = {
        15000, 15000, 15001, 14999, 30000, 1,      9000, 100000, 1, 600000, 1, 3600000, 1, 86400000LL * 365,
        1,     2,     4,     70000, 5000,  500000, 1,    65537,  1, 8193,   1, 524289};
    sample_t s[64];
    size_t n = 0;
    int64_t t = -5000; /* negative first timestamp exercises zigzag */
    s[n++] = (sample_t){t, to_bits(1.0)};
    for (size_t i = 0; i < sizeof(gaps) / sizeof(gaps[0]); i++) {
        t += gaps[i];
        s[n] = (sample_t){t, to_bits((double)i * 0.5)};
        n++;
    }
    round_trip(s, n);

    const sample_t extreme[] = {{INT64_MIN + 1, 0}, {-1, 1}, {INT64_MAX - 10, 2}, {INT64_MAX, 3}};
    round_trip(extreme, 4);
    const sample_t big_first[] = {{INT64_MAX, to_bits(1.0)}};
    round_trip(big_first, 1);
    const sample_t min_first[] = {{INT64_MIN, to_bits(1.0)}, {0, 0}};
    round_trip(min_first, 2);
}

static void test_full_chunk_constant_and_random(void **state)
{
    sample_t s[CHUNK_XOR_MAX_SAMPLES];
    for (int i = 0; i < CHUNK_XOR_MAX_SAMPLES; i++)
        s[i] = (sample_t){1700000000000 + i * 15000, to_bits(3.25)};
    round_trip(s, CHUNK_XOR_MAX_SAMPLES);

    for (int round = 0; round < 200; round++) {
        int64_t t = (int64_t)(rng_next() % 2000000000000ull);
        double counter = 0;
        for (int i = 0; i < CHUNK_XOR_MAX_SAMPLES; i++) {
            uint64_t r = rng_next();
            switch (r % 4) {
            case 0: t += 15000; break;
            case 1: t += 1 + (int64_t)(r >> 40) % 100000; break;
            case 2: t += 1 + (int64_t)(r >> 20) % 10000000; break;
            default: t += 1; break;
            }
            uint64_t vb;
            switch ((r >> 8) % 5) {
            case 0: vb = rng_next(); break; /* any bit pattern, NaNs included */
            case 1:
                counter += (double)(r >> 50);
                vb = to_bits(counter);
                break;
            case 2: vb = to_bits((double)((r >> 16) % 1000) / 10.0); break;
            case 3: vb = i ? s[i - 1].vbits : 0; break; /* repeat */
            default: vb = to_bits(sin((double)i) * 1e6); break;
            }
            s[i] = (sample_t){t, vb};
        }
        round_trip(s, CHUNK_XOR_MAX_SAMPLES);
    }
}

static void build_random_chunk(chunk_xor_appender_t *a, sample_t *s, size_t n)
{
    int64_t t = 1700000000000;
    for (size_t i = 0; i < n; i++) {
        t += 1 + (int64_t)(rng_next() % 1000000);
        s[i] = (sample_t){t, (rng_next() & 1) ? rng_next() : to_bits((double)(i % 7))};
    }
    encode(a, s, n);
}

static void test_truncated(void **state)
{
    for (int round = 0; round < 50; round++) {
        chunk_xor_appender_t a;
        sample_t s[CHUNK_XOR_MAX_SAMPLES];
        size_t n = 1 + rng_next() % CHUNK_XOR_MAX_SAMPLES, len;
        build_random_chunk(&a, s, n);
        const uint8_t *full = chunk_xor_bytes(&a, &len);
        for (size_t cut = 0; cut < len; cut++) {
            /* A heap copy of exactly `cut` bytes, so ASan catches any over-read. */
            uint8_t *p = malloc(cut ? cut : 1);
            assert_non_null(p);
            memcpy(p, full, cut);
            chunk_xor_iter_t it;
            int64_t t;
            double v;
            size_t got = 0;
            chunk_xor_iter_init(&it, p, cut);
            /* The samples before the cut come out bit for bit: near the end of the bytes the
             * decoder reads byte by byte, elsewhere 64 bits at a time, and both must agree. */
            while (chunk_xor_iter_next(&it, &t, &v)) {
                assert_int_equal(t, s[got].t);
                assert_int_equal(to_bits(v), s[got].vbits);
                got++;
            }
            assert_int_equal(it.err, -1);
            assert_true(got < n);
            chunk_xor_appender_t r;
            assert_int_equal(chunk_xor_appender_from_bytes(&r, p, cut), -1);
            free(p);
        }
        chunk_xor_appender_free(&a);
    }
}

static size_t drain(const uint8_t *p, size_t len, int *err)
{
    chunk_xor_iter_t it;
    int64_t t;
    double v;
    size_t got = 0;
    chunk_xor_iter_init(&it, p, len);
    while (chunk_xor_iter_next(&it, &t, &v))
        got++;
    *err = it.err;
    assert_true(got <= it.num);
    return got;
}

static void test_garbage(void **state)
{
    int errs = 0, err;
    for (int round = 0; round < 20000; round++) {
        size_t len = rng_next() % 64;
        uint8_t *p = malloc(len ? len : 1);
        assert_non_null(p);
        for (size_t i = 0; i < len; i++)
            p[i] = (uint8_t)rng_next();
        if (len >= 2 && (round & 1))
            p[0] = 0; /* small counts get further into the stream */
        size_t got = drain(p, len, &err);
        if (err)
            errs++;
        else
            assert_true(len >= 2 && got == (size_t)(p[0] << 8 | p[1]));
        chunk_xor_appender_t r;
        if (chunk_xor_appender_from_bytes(&r, p, len) == 0) {
            assert_int_equal(err, 0);
            assert_int_equal(chunk_xor_append(&r, INT64_MAX, 1.0), 0);
            chunk_xor_appender_free(&r);
        }
        free(p);
    }
    assert_true(errs > 10000);

    /* Flipped bits in valid chunks: whatever they decode to, no over-read, no crash. */
    for (int round = 0; round < 300; round++) {
        chunk_xor_appender_t a;
        sample_t s[CHUNK_XOR_MAX_SAMPLES];
        size_t len;
        build_random_chunk(&a, s, 1 + rng_next() % CHUNK_XOR_MAX_SAMPLES);
        chunk_xor_appender_compact(&a);
        uint8_t *p = (uint8_t *)chunk_xor_bytes(&a, &len);
        for (int k = 0; k < 3; k++)
            p[2 + rng_next() % (len - 2)] ^= (uint8_t)(1u << (rng_next() % 8));
        drain(p, len, &err);
        chunk_xor_appender_free(&a);
    }
}

static void test_malformed_specific(void **state)
{
    int err;
    /* One sample whose varint never ends within 10 bytes. */
    uint8_t ovf[2 + 11 + 8];
    memset(ovf, 0xff, sizeof(ovf));
    ovf[0] = 0;
    ovf[1] = 1;
    assert_int_equal(drain(ovf, sizeof(ovf), &err), 0);
    assert_int_equal(err, -1);
    /* 10th varint byte > 1 overflows 64 bits. */
    ovf[11] = 0x02;
    assert_int_equal(drain(ovf, sizeof(ovf), &err), 0);
    assert_int_equal(err, -1);
    ovf[11] = 0x01; /* 10-byte varint that fits: then 64 value bits (all set) */
    assert_int_equal(drain(ovf, sizeof(ovf), &err), 1);
    assert_int_equal(err, 0);

    /* Sample 1 with a window of lz 31 + 40 significant bits (> 64). */
    uint8_t win[] = {0,
                     2,
                     0x00,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0,
                     0x01,
                     /* 1 1 11111 101000 ... */ 0xff,
                     0xd0,
                     0xff,
                     0xff,
                     0xff,
                     0xff,
                     0xff,
                     0xff};
    assert_int_equal(drain(win, sizeof(win), &err), 1);
    assert_int_equal(err, -1);

    /* Header shorter than 2 bytes. */
    assert_int_equal(drain(win, 1, &err), 0);
    assert_int_equal(err, -1);
    assert_int_equal(drain(NULL, 0, &err), 0);
    assert_int_equal(err, -1);

    /* A count of 0 with trailing bytes: fine, nothing to read. */
    uint8_t zero[] = {0, 0, 0xab};
    assert_int_equal(drain(zero, sizeof(zero), &err), 0);
    assert_int_equal(err, 0);
}

/* Reopening after k samples and appending the rest gives the bytes of encoding all at once. */
static void check_reopen(const sample_t *s, size_t n)
{
    chunk_xor_appender_t whole;
    size_t wlen;
    encode(&whole, s, n);
    const uint8_t *wb = chunk_xor_bytes(&whole, &wlen);
    for (size_t k = 0; k <= n; k++) {
        chunk_xor_appender_t part, re;
        size_t plen, rlen;
        encode(&part, s, k);
        const uint8_t *pb = chunk_xor_bytes(&part, &plen);
        /* Dirty the padding and add trailing junk: from_bytes must drop both. */
        uint8_t *copy = malloc(plen + 3);
        assert_non_null(copy);
        memcpy(copy, pb, plen);
        if (part.nbits % 8)
            copy[plen - 1] |= (uint8_t)(0xffu >> (part.nbits % 8));
        memset(copy + plen, 0x5a, 3);
        assert_int_equal(chunk_xor_appender_from_bytes(&re, copy, plen + 3), 0);
        free(copy);
        assert_int_equal(chunk_xor_num(&re), k);
        for (size_t i = k; i < n; i++)
            assert_int_equal(chunk_xor_append(&re, s[i].t, from_bits(s[i].vbits)), 0);
        const uint8_t *rb = chunk_xor_bytes(&re, &rlen);
        assert_int_equal(rlen, wlen);
        assert_memory_equal(rb, wb, wlen);
        chunk_xor_appender_free(&re);
        chunk_xor_appender_free(&part);
    }
    chunk_xor_appender_free(&whole);
}

static void test_reopen(void **state)
{
    sample_t s[CHUNK_XOR_MAX_SAMPLES];
    /* Constant values: no window is ever written, the reopened appender must not invent one. */
    for (int i = 0; i < 10; i++)
        s[i] = (sample_t){1000 + i * 1000, to_bits(7.0)};
    s[10] = (sample_t){12000, to_bits(8.0)};
    s[11] = (sample_t){13000, to_bits(9.0)};
    check_reopen(s, 12);
    for (int round = 0; round < 10; round++) {
        chunk_xor_appender_t a;
        size_t n = 2 + rng_next() % (CHUNK_XOR_MAX_SAMPLES - 2);
        build_random_chunk(&a, s, n);
        chunk_xor_appender_free(&a);
        check_reopen(s, n);
    }
}

/* chunk_xor_record_bits is exactly what the next append writes, over every record kind (first
 * sample, first delta, each dod bucket, same value, reused and new windows, negative times); and
 * a buffer sized to that exactly is enough: the appender neither grows nor moves it. */
static void test_record_bits_exact(void **state)
{
    (void)state;
    enum { N = 300 };
    sample_t s[N];
    for (int round = 0; round < 300; round++) {
        int64_t t = (int64_t)(rng_next() % 4000000000000ull) - 2000000000000ll;
        double counter = 0;
        size_t cap = CHUNK_XOR_HEADER_BYTES;
        uint8_t *buf = malloc(cap);
        assert_non_null(buf);
        chunk_xor_appender_t a;
        chunk_xor_appender_init_buf(&a, buf, cap);
        for (int i = 0; i < N; i++) {
            uint64_t r = rng_next();
            switch (r % 6) {
            case 0: t += 10000; break;
            case 1: t += 1 + (int64_t)(r >> 40) % 100000; break;
            case 2: t += 1 + (int64_t)(r >> 20) % 10000000; break;
            case 3: t += 1 + (int64_t)(r >> 8) % 2000000000000ll; break; /* the 64-bit dod */
            case 4: t += 10000 + (int64_t)(r >> 60); break;
            default: t += 1; break;
            }
            uint64_t vb;
            switch ((r >> 8) % 5) {
            case 0: vb = rng_next(); break;
            case 1:
                counter += (double)(r >> 50);
                vb = to_bits(counter);
                break;
            case 2: vb = to_bits((double)((r >> 16) % 1000) / 10.0); break;
            case 3: vb = i ? s[i - 1].vbits : 0; break;
            default: vb = to_bits(sin((double)i) * 1e6); break;
            }
            s[i] = (sample_t){t, vb};
            unsigned bits = chunk_xor_record_bits(&a, t, from_bits(vb));
            assert_true(bits >= 1 && bits <= 145);
            size_t need = CHUNK_XOR_HEADER_BYTES + (size_t)((a.nbits + bits + 7) / 8);
            if (need > a.cap) { /* as head.c does: grow to exactly what the record needs */
                uint8_t *p = realloc(a.bytes, need);
                assert_non_null(p);
                a.bytes = p;
                a.cap = need;
            }
            uint8_t *before = a.bytes;
            size_t cap_before = a.cap;
            uint64_t nbits = a.nbits;
            assert_int_equal(chunk_xor_append(&a, t, from_bits(vb)), 0);
            assert_int_equal(a.nbits - nbits, bits);
            assert_ptr_equal(a.bytes, before);
            assert_int_equal(a.cap, cap_before);
        }
        size_t len;
        const uint8_t *b = chunk_xor_bytes(&a, &len);
        assert_int_equal(len, a.cap); /* every byte grown was needed */
        assert_decodes_to(b, len, s, N);
        chunk_xor_appender_free(&a);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_vector),
        cmocka_unit_test(test_hand_vector_negative_and_window),
        cmocka_unit_test(test_empty_and_single),
        cmocka_unit_test(test_edge_values),
        cmocka_unit_test(test_dod_buckets),
        cmocka_unit_test(test_timestamp_jumps),
        cmocka_unit_test(test_full_chunk_constant_and_random),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_malformed_specific),
        cmocka_unit_test(test_reopen),
        cmocka_unit_test(test_record_bits_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
