/* Unit tests for storage/chunk_int.c: the worked example of the format comment byte for byte,
 * which layout the encoder picks for each shape of data (and that it is the smallest), round
 * trips over extreme integers and timestamps, what it refuses, and truncated, flipped and random
 * bytes (run under ASan by make test: the iterator must never read past its slice). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "storage/chunk_int.h"
#include "storage/chunk_xor.h"

#define P53 9007199254740992.0

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Encodes, checks the size against chunk_int_size, decodes into a malloc'd copy of exactly the
 * encoded length, and compares every sample. Returns the length. */
static size_t round_trip(const int64_t *t, const double *v, size_t n, uint8_t *modes)
{
    size_t size = chunk_int_size(t, v, n);
    assert_true(size > 0);
    uint8_t *buf = malloc(size + 16);
    assert_int_equal(chunk_int_encode(t, v, n, buf, size - 1), 0); /* one byte short: refused */
    size_t len = chunk_int_encode(t, v, n, buf, size + 16);
    assert_int_equal(len, size);
    uint8_t *exact = malloc(len);
    memcpy(exact, buf, len);
    chunk_int_iter_t it;
    chunk_int_iter_init(&it, exact, len);
    int64_t tt;
    double vv;
    size_t k = 0;
    while (chunk_int_iter_next(&it, &tt, &vv)) {
        assert_true(k < n);
        assert_int_equal(tt, t[k]);
        assert_true(vv == v[k] && !signbit(vv) == !signbit(v[k]));
        k++;
    }
    assert_int_equal(it.err, 0);
    assert_int_equal(k, n);
    if (modes)
        *modes = it.tmode | it.vmode << 2;
    free(exact);
    free(buf);
    return len;
}

static void test_hand_vector(void **state)
{
    (void)state;
    int64_t t[] = {1000, 2000, 3000};
    double v[] = {5, 7, 9};
    uint8_t out[32];
    size_t len = chunk_int_encode(t, v, 3, out, sizeof(out));
    const uint8_t want[] = {0x00, 0x03, 0xd0, 0x0f, 0x0a, 0xe8, 0x07, 0x00, 0x04, 0x00};
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(out, want, sizeof(want));
    round_trip(t, v, 3, NULL);
    /* One sample: count, t0, v0 and nothing else. */
    len = chunk_int_encode(t, v, 1, out, sizeof(out));
    const uint8_t one[] = {0x00, 0x01, 0xd0, 0x0f, 0x0a};
    assert_int_equal(len, sizeof(one));
    assert_memory_equal(out, one, sizeof(one));
}

static void test_holds(void **state)
{
    (void)state;
    assert_true(chunk_int_holds(0.0));
    assert_true(chunk_int_holds(-17.0));
    assert_true(chunk_int_holds(P53));
    assert_true(chunk_int_holds(-P53));
    assert_false(chunk_int_holds(-0.0)); /* its sign bit would be lost */
    assert_false(chunk_int_holds(0.5));
    assert_false(chunk_int_holds(P53 * 2));
    assert_false(chunk_int_holds(NAN));
    assert_false(chunk_int_holds(INFINITY));
    assert_false(chunk_int_holds(-INFINITY));
    assert_false(chunk_int_holds(1e300));
}

/* Each shape of data gets the layout meant for it, and that layout is no bigger than XOR. */
static void test_layouts(void **state)
{
    (void)state;
    enum { N = 90 };
    int64_t t[N];
    double v[N];
    uint8_t modes;

    /* a constant gauge: packed deltas of width 0, a few bytes for 90 samples */
    for (int i = 0; i < N; i++)
        t[i] = 1700000000000LL + i * 10000LL, v[i] = 42;
    size_t len = round_trip(t, v, N, &modes);
    assert_int_equal(modes, 0);
    assert_true(len <= 16);

    /* a counter growing by 900..1099: packed deltas, 8 bits each */
    uint64_t x = 7;
    double c = 123456;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        c += 900 + (double)(x % 200);
        v[i] = c;
    }
    len = round_trip(t, v, N, &modes);
    assert_int_equal(modes, 0);
    assert_true(len <= 20 + (N - 1));

    /* a gauge that mostly stands still: variable-length deltas */
    for (int i = 0; i < N; i++)
        v[i] = (i / 30) * 1000000.0;
    len = round_trip(t, v, N, &modes);
    assert_int_equal(modes, 1 << 2);
    assert_true(len <= 36); /* 12 header bytes, 87 one-bit zeros, two 38-bit jumps */

    /* a counter whose rate changes once: variable-length delta-of-deltas */
    c = 0;
    for (int i = 0; i < N; i++) {
        c += i < 45 ? 1000 : 5000;
        v[i] = c;
    }
    len = round_trip(t, v, N, &modes);
    assert_int_equal(modes, 2 << 2);
    assert_true(len <= 30);

    /* pushes arriving with a few ms of jitter: timestamps as delta-of-deltas */
    for (int i = 0; i < N; i++)
        t[i] = 1700000000000LL + i * 10000LL + (int64_t)(rng_next() % 40);
    len = round_trip(t, v, N, &modes);
    assert_int_equal(modes & 3, 1);

    /* the choice is the smallest: XOR of the same samples is never smaller for these */
    chunk_xor_appender_t a;
    assert_int_equal(chunk_xor_appender_init(&a), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(chunk_xor_append(&a, t[i], v[i]), 0);
    size_t xlen;
    chunk_xor_bytes(&a, &xlen);
    assert_true(len < xlen);
    chunk_xor_appender_free(&a);
}

/* Extreme values and timestamps, every bucket of the variable-length numbers, random chunk
 * sizes: every sample comes back exactly. */
static void test_round_trip_extremes(void **state)
{
    (void)state;
    enum { N = 240 };
    int64_t t[N];
    double v[N];
    for (int rep = 0; rep < 400; rep++) {
        size_t n = 1 + (size_t)(rng_next() % N);
        int64_t tt = (int64_t)(rng_next() % 4000000000000ULL) - 2000000000000LL;
        int kind = rep % 5;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_next();
            switch (rep % 4) {
            case 0: tt += 1 + (int64_t)(r % 3); break;
            case 1: tt += INT32_MAX; break;
            case 2: tt += 1 + (int64_t)(r % ((1u << ((r >> 40) % 31)) + 1u)); break;
            default: tt += 10000; break;
            }
            t[i] = tt;
            int shift = (int)(rng_next() % 54);
            double mag = (double)(rng_next() & (((uint64_t)1 << shift) - 1));
            switch (kind) {
            case 0: v[i] = (r & 1) ? mag : -mag; break;                     /* any size, either sign */
            case 1: v[i] = (i & 1) ? P53 : -P53; break;                     /* the widest deltas */
            case 2: v[i] = (i ? v[i - 1] : 0) + (double)(r % 3); break;     /* small steps */
            case 3: v[i] = (r % 10 == 0) ? mag : (i ? v[i - 1] : 1); break; /* rare jumps */
            default: v[i] = (double)(int64_t)(i * i) * ((r & 1) ? 1 : -1); break;
            }
            if (v[i] == 0)
                v[i] = 0; /* never -0.0 */
        }
        round_trip(t, v, n, NULL);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    int64_t t[] = {1000, 2000, 3000};
    double v[] = {1, 2, 3};
    uint8_t out[64];
    assert_int_equal(chunk_int_size(t, v, 0), 0);
    double frac[] = {1, 2.5, 3};
    assert_int_equal(chunk_int_size(t, frac, 3), 0);
    assert_int_equal(chunk_int_encode(t, frac, 3, out, sizeof(out)), 0);
    double negz[] = {1, -0.0, 3};
    assert_int_equal(chunk_int_size(t, negz, 3), 0);
    double stale[] = {1, 2, 0};
    uint64_t sb = 0x7ff0000000000002ULL;
    memcpy(&stale[2], &sb, 8);
    assert_int_equal(chunk_int_size(t, stale, 3), 0);
    int64_t same[] = {1000, 1000, 2000};
    assert_int_equal(chunk_int_size(same, v, 3), 0);
    int64_t back[] = {2000, 1000, 3000};
    assert_int_equal(chunk_int_size(back, v, 3), 0);
    int64_t far[] = {0, (int64_t)INT32_MAX + 1, (int64_t)INT32_MAX + 2};
    assert_int_equal(chunk_int_size(far, v, 3), 0);
    assert_int_equal(chunk_int_encode(t, v, 3, out, 3), 0);
}

/* Every truncation of valid chunks, single-bit flips and random bytes: the iterator stops (with
 * err set, or with fewer or different samples) and never reads outside the slice. */
static void test_malformed(void **state)
{
    (void)state;
    enum { N = 120 };
    int64_t t[N];
    double v[N];
    for (int shape = 0; shape < 8; shape++) { /* 4..7: the same shapes, appended (vmode 3) */
        double c = 5;
        for (int i = 0; i < N; i++) {
            t[i] = 1000000 + i * 10000LL + (shape == 3 ? (int64_t)(rng_next() % 50) : 0);
            c += shape % 4 == 0   ? 1000 + (double)(rng_next() % 100)
                 : shape % 4 == 1 ? (rng_next() % 9 == 0 ? 77 : 0)
                 : shape % 4 == 2 ? (i < 60 ? 3 : 400)
                                  : (double)(rng_next() % 1000);
            v[i] = c;
        }
        uint8_t full[2048];
        size_t len;
        if (shape < 4) {
            len = chunk_int_encode(t, v, N, full, sizeof(full));
        } else {
            chunk_int_appender_t a;
            chunk_int_appender_init(&a, full, sizeof(full));
            for (int i = 0; i < N; i++)
                assert_int_equal(chunk_int_append(&a, t[i], (int64_t)v[i]), 0);
            len = chunk_int_appender_len(&a);
        }
        assert_true(len > 0);
        for (size_t cut = 0; cut < len; cut++) {
            uint8_t *b = malloc(cut ? cut : 1);
            memcpy(b, full, cut);
            chunk_int_iter_t it;
            chunk_int_iter_init(&it, b, cut);
            int64_t tt;
            double vv;
            size_t k = 0;
            while (chunk_int_iter_next(&it, &tt, &vv))
                k++;
            /* a truncated chunk never yields all its samples without complaint */
            assert_true(k < N || it.err == -1);
            if (cut >= 2)
                assert_int_equal(it.err, -1);
            free(b);
        }
        for (size_t bit = 0; bit < len * 8; bit++) {
            uint8_t *b = malloc(len);
            memcpy(b, full, len);
            b[bit / 8] ^= (uint8_t)(0x80 >> (bit % 8));
            chunk_int_iter_t it;
            chunk_int_iter_init(&it, b, len);
            int64_t tt;
            double vv;
            size_t k = 0;
            while (chunk_int_iter_next(&it, &tt, &vv))
                k++;
            assert_true(k <= 65535);
            free(b);
        }
    }
    for (int rep = 0; rep < 20000; rep++) {
        size_t len = (size_t)(rng_next() % 64);
        uint8_t *b = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++)
            b[i] = (uint8_t)rng_next();
        if (len > 7 && rep % 2)
            b[7] &= rep % 4 == 1 ? 0x0f : 0x1f; /* a valid modes byte more often, vmode 3's too */
        chunk_int_iter_t it;
        chunk_int_iter_init(&it, b, len);
        int64_t tt;
        double vv;
        while (chunk_int_iter_next(&it, &tt, &vv))
            ;
        free(b);
    }
}

/* Appends every sample one at a time into a buffer of cap bytes, checking before each append that
 * chunk_int_append_size says what the append then makes, that a buffer one byte short is
 * refused without a change, and after it that the chunk decodes to exactly the samples so far.
 * Returns the final length; the chunk is left in out. */
static size_t append_all(const int64_t *t, const int64_t *v, size_t n, uint8_t *out, size_t cap)
{
    chunk_int_appender_t a;
    chunk_int_appender_init(&a, out, cap);
    for (size_t i = 0; i < n; i++) {
        size_t want = chunk_int_append_size(&a, t[i], v[i]);
        assert_true(want > 0 && want <= cap);
        if (!chunk_int_append_rewrites(&a, t[i]))
            assert_true(want <= chunk_int_appender_len(&a) + CHUNK_INT_APPEND_MAX_BYTES);
        chunk_int_appender_t short_a = a;
        short_a.cap = want - 1;
        uint8_t before[4096];
        size_t blen = chunk_int_appender_len(&a);
        memcpy(before, out, blen);
        assert_int_equal(chunk_int_append(&short_a, t[i], v[i]), -1);
        assert_int_equal(short_a.num, a.num);
        assert_memory_equal(before, out, blen);
        assert_int_equal(chunk_int_append(&a, t[i], v[i]), 0);
        assert_int_equal(chunk_int_appender_len(&a), want);
        if (i % 17 == 0 || i == n - 1) {
            uint8_t *exact = malloc(want); /* exact length: ASan catches a read past it */
            memcpy(exact, out, want);
            chunk_int_iter_t it;
            chunk_int_iter_init(&it, exact, want);
            int64_t tt;
            double vv;
            size_t k = 0;
            while (chunk_int_iter_next(&it, &tt, &vv)) {
                assert_true(k <= i);
                assert_int_equal(tt, t[k]);
                assert_true(vv == (double)v[k]);
                k++;
            }
            assert_int_equal(it.err, 0);
            assert_int_equal(k, i + 1);
            assert_int_equal(it.vmode, i ? 3 : 0);
            free(exact);
        }
    }
    return chunk_int_appender_len(&a);
}

/* The appendable layout's worked example (chunk_int.c, vmode 3), byte for byte. */
static void test_append_hand_vector(void **state)
{
    (void)state;
    const int64_t t[] = {1000, 2000, 3000, 4000, 5000}, v[] = {5, 7, 9, 12, 14};
    const uint8_t want[] = {0x00, 0x05, 0xd0, 0x0f, 0x0a, 0xe8, 0x07, 0x1c, 0x02, 0x00, 0x00, 0x00, 0x60};
    uint8_t buf[64];
    assert_int_equal(append_all(t, v, 5, buf, sizeof(buf)), sizeof(want));
    assert_memory_equal(buf, want, sizeof(want));
    /* three samples: no predictor yet, each delta a flag and rice(zigzag(2) - 1 = 3), k 0 then 1 */
    const uint8_t want3[] = {0x00, 0x03, 0xd0, 0x0f, 0x0a, 0xe8, 0x07, 0x0c, 0xf6, 0x80};
    assert_int_equal(append_all(t, v, 3, buf, sizeof(buf)), sizeof(want3));
    assert_memory_equal(buf, want3, sizeof(want3));
}

static size_t xor_size(const int64_t *t, const int64_t *v, size_t n)
{
    chunk_xor_appender_t a;
    assert_int_equal(chunk_xor_appender_init(&a), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(chunk_xor_append(&a, t[i], (double)v[i]), 0);
    size_t len;
    chunk_xor_bytes(&a, &len);
    chunk_xor_appender_free(&a);
    return len;
}

/* Shapes of data appended one at a time: each decodes back, and the ones the head sees most cost
 * well under XOR. */
static void test_append_shapes(void **state)
{
    (void)state;
    enum { N = 240 };
    int64_t t[N], v[N];
    uint8_t buf[N * 24];
    for (int shape = 0; shape < 12; shape++) {
        int64_t c = shape == 6 ? -(INT64_C(1) << 53) : 1234567;
        for (int i = 0; i < N; i++) {
            t[i] = 1700000000000LL + i * 10000LL;
            if (shape == 3 || shape == 7)
                t[i] += (int64_t)(rng_next() % 80); /* arrival jitter */
            if (shape == 8 && i > 100)
                t[i] += 2147483647LL - 10000; /* the largest gap, once */
            int64_t d;
            switch (shape) {
            case 0: d = 900 + (int64_t)(rng_next() % 200); break;       /* the bench's counter */
            case 1: d = rng_next() % 10 == 0 ? (int64_t)(rng_next() % 100) - 50 : 0; break; /* gauge */
            case 2: d = 0; break;                                         /* constant */
            case 3: d = 500 + (int64_t)(rng_next() % 20); break;          /* steady rate, jitter */
            case 4: d = i == 0 ? 0 : (i < 50 ? 0 : 1000); break;         /* idle, then counting */
            case 5: d = i == 120 ? -c : 7; break;                         /* a counter reset */
            case 6: d = i == 0 ? 0 : (INT64_C(1) << 54) / N; break;       /* -2^53 .. 2^53 */
            case 7: d = (int64_t)(rng_next() % 1000000) - 500000; break;  /* noise */
            case 8: d = 3; break;
            case 9: d = i % 2 ? 5000000000LL : -5000000000LL; break;      /* D_1 beyond int32 */
            case 10: d = i < 3 ? i : 1; break;                            /* D_1 = 0: no predictor */
            default: d = (int64_t)(rng_next() % 3); break;
            }
            c = i ? c + d : c;
            v[i] = c;
        }
        size_t len = append_all(t, v, N, buf, sizeof(buf));
        size_t x = xor_size(t, v, N);
        if (shape <= 3)
            assert_true(len * 10 < x * 7); /* at least 30 % under XOR */
        if (shape == 0)
            assert_true(len < 240 * 11 / 8 + 24); /* ~10 bits a sample */
        if (shape == 2)
            assert_true(len < 240 / 8 + 24); /* one bit a sample */
    }
}

static void test_append_refusals(void **state)
{
    (void)state;
    uint8_t buf[16384];
    chunk_int_appender_t a;
    chunk_int_appender_init(&a, buf, sizeof(buf));
    assert_int_equal(chunk_int_append_size(&a, 0, (INT64_C(1) << 53) + 1), 0);
    assert_int_equal(chunk_int_append(&a, 0, -(INT64_C(1) << 53) - 1), -1);
    assert_int_equal(chunk_int_append(&a, 1000, 1), 0);
    assert_int_equal(chunk_int_append(&a, 1000, 2), -1);     /* not after the last */
    assert_int_equal(chunk_int_append(&a, 999, 2), -1);
    assert_int_equal(chunk_int_append(&a, 1000 + 2147483648LL, 2), -1); /* 2^31 ms later */
    assert_int_equal(chunk_int_append(&a, 1000 + 2147483647LL, 2), 0);
    assert_int_equal(a.num, 2);
    for (int64_t i = 2; i < CHUNK_INT_APPEND_MAX_SAMPLES; i++)
        assert_int_equal(chunk_int_append(&a, a.t + 10, i), 0);
    assert_int_equal(chunk_int_append_size(&a, a.t + 10, 1), 0);
    assert_int_equal(chunk_int_append(&a, a.t + 10, 1), -1);
    assert_int_equal(a.num, CHUNK_INT_APPEND_MAX_SAMPLES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_vector),         cmocka_unit_test(test_holds),    cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_round_trip_extremes), cmocka_unit_test(test_refusals), cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_append_hand_vector),  cmocka_unit_test(test_append_shapes),
        cmocka_unit_test(test_append_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
