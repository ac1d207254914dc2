/* Unit tests for internal/util/varint.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "internal/util/buf.h"
#include "internal/util/varint.h"

/* Known encodings (Go's binary.PutUvarint). */
static void test_known_bytes(void **state)
{
    static const struct {
        uint64_t v;
        const char *bytes;
        size_t n;
    } k[] = {
        {0, "\x00", 1},
        {1, "\x01", 1},
        {127, "\x7f", 1},
        {128, "\x80\x01", 2},
        {300, "\xac\x02", 2},
        {16383, "\xff\x7f", 2},
        {16384, "\x80\x80\x01", 3},
        {UINT64_C(1) << 63, "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", 10},
        {UINT64_MAX, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 10},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        uint8_t out[VARINT_MAX];
        assert_int_equal(varint_len(k[i].v), k[i].n);
        assert_int_equal(varint_encode(out, k[i].v), k[i].n);
        assert_memory_equal(out, k[i].bytes, k[i].n);
        buf_t b = BUF_INIT;
        varint_put(&b, k[i].v);
        assert_int_equal(b.len, k[i].n);
        assert_memory_equal(b.data, k[i].bytes, k[i].n);
        assert_int_equal(b.data[b.len], 0); /* buf stays NUL-terminated */
        const uint8_t *p = (const uint8_t *)k[i].bytes;
        uint64_t v = 0;
        assert_int_equal(varint_get(&p, p + k[i].n, &v), VARINT_OK);
        assert_true(v == k[i].v);
        assert_ptr_equal(p, (const uint8_t *)k[i].bytes + k[i].n);
        buf_free(&b);
    }
}

/* Values around every 7-bit boundary and some signed extremes survive a round trip through one
 * buffer, read back in order. */
static void test_round_trip(void **state)
{
    buf_t b = BUF_INIT;
    uint64_t uv[200];
    int64_t sv[200];
    size_t n = 0;
    for (int bit = 0; bit < 64; bit++) {
        uint64_t x = UINT64_C(1) << bit;
        uv[n] = x - 1, sv[n] = -(int64_t)(x >> 1), n++;
        uv[n] = x, sv[n] = (int64_t)(x >> 1), n++;
        uv[n] = x + 1, sv[n] = (int64_t)(x >> 2) - 1, n++;
    }
    uv[n] = UINT64_MAX, sv[n] = INT64_MIN, n++;
    uv[n] = UINT64_MAX - 1, sv[n] = INT64_MAX, n++;
    for (size_t i = 0; i < n; i++) {
        varint_put(&b, uv[i]);
        varint_put_signed(&b, sv[i]);
    }
    const uint8_t *p = (const uint8_t *)b.data, *end = p + b.len;
    for (size_t i = 0; i < n; i++) {
        uint64_t u;
        int64_t s;
        assert_int_equal(varint_get(&p, end, &u), VARINT_OK);
        assert_true(u == uv[i]);
        assert_int_equal(varint_get_signed(&p, end, &s), VARINT_OK);
        assert_true(s == sv[i]);
    }
    assert_ptr_equal(p, end);
    buf_free(&b);
}

/* Zigzag keeps small magnitudes small, as protobuf's sint64. */
static void test_zigzag(void **state)
{
    assert_true(varint_zigzag(0) == 0);
    assert_true(varint_zigzag(-1) == 1);
    assert_true(varint_zigzag(1) == 2);
    assert_true(varint_zigzag(-2) == 3);
    assert_true(varint_zigzag(INT64_MAX) == UINT64_MAX - 1);
    assert_true(varint_zigzag(INT64_MIN) == UINT64_MAX);
    for (int64_t v = -1000; v <= 1000; v++)
        assert_true(varint_unzigzag(varint_zigzag(v)) == v);
    assert_true(varint_unzigzag(UINT64_MAX) == INT64_MIN);
    /* Go's binary.PutVarint(-1000) = 0xcf 0x0f */
    buf_t b = BUF_INIT;
    varint_put_signed(&b, -1000);
    assert_int_equal(b.len, 2);
    assert_memory_equal(b.data, "\xcf\x0f", 2);
    buf_free(&b);
}

/* Every proper prefix of an encoding is truncated, including the empty input. */
static void test_truncated(void **state)
{
    uint8_t enc[VARINT_MAX];
    size_t n = varint_encode(enc, UINT64_MAX);
    for (size_t cut = 0; cut < n; cut++) {
        const uint8_t *p = enc;
        uint64_t v = 42;
        assert_int_equal(varint_get(&p, enc + cut, &v), VARINT_ETRUNC);
        assert_true(v == 42); /* untouched on error */
        assert_true(p <= enc + cut);
    }
    const uint8_t *p = enc;
    int64_t s = 7;
    assert_int_equal(varint_get_signed(&p, enc + 1, &s), VARINT_ETRUNC);
    assert_true(s == 7);
}

/* Beyond 64 bits: an 11th byte, or a 10th byte above 1, is an overflow; 10th byte 0 or 1 is fine. */
static void test_overflow(void **state)
{
    uint8_t in[12] = {0};
    memset(in, 0xff, 9);
    uint64_t v;
    const uint8_t *p;

    in[9] = 0x01;
    p = in;
    assert_int_equal(varint_get(&p, in + 10, &v), VARINT_OK);
    assert_true(v == UINT64_MAX);

    in[9] = 0x02;
    p = in;
    assert_int_equal(varint_get(&p, in + 10, &v), VARINT_EOVERFLOW);

    in[9] = 0x7f;
    p = in;
    assert_int_equal(varint_get(&p, in + 10, &v), VARINT_EOVERFLOW);

    in[9] = 0x81, in[10] = 0x00; /* 11 bytes */
    p = in;
    assert_int_equal(varint_get(&p, in + 11, &v), VARINT_EOVERFLOW);

    memset(in, 0x80, 11), in[11] = 0; /* 12-byte non-minimal zero */
    p = in;
    assert_int_equal(varint_get(&p, in + 12, &v), VARINT_EOVERFLOW);

    /* a non-minimal encoding within 10 bytes is accepted, as Go does */
    p = (const uint8_t *)"\x80\x00";
    assert_int_equal(varint_get(&p, p + 2, &v), VARINT_OK);
    assert_true(v == 0);
}

/* varint_get_max bounds the length: protobuf's varint32 message lengths read at most 5 bytes. */
static void test_get_max(void **state)
{
    uint8_t enc[VARINT_MAX];
    uint64_t v;
    const uint8_t *p;

    size_t n = varint_encode(enc, UINT32_MAX); /* 5 bytes */
    assert_int_equal(n, 5);
    p = enc;
    assert_int_equal(varint_get_max(&p, enc + n, 5, &v), VARINT_OK);
    assert_true(v == UINT32_MAX);

    n = varint_encode(enc, UINT64_C(1) << 35); /* 6 bytes */
    p = enc;
    assert_int_equal(varint_get_max(&p, enc + n, 5, &v), VARINT_EOVERFLOW);
    p = enc;
    assert_int_equal(varint_get_max(&p, enc + 3, 5, &v), VARINT_ETRUNC);
    p = enc;
    assert_int_equal(varint_get_max(&p, enc + n, 1, &v), VARINT_EOVERFLOW);
    /* a bound above VARINT_MAX is VARINT_MAX */
    uint8_t big[11];
    memset(big, 0x80, 10), big[10] = 0;
    p = big;
    assert_int_equal(varint_get_max(&p, big + 11, 64, &v), VARINT_EOVERFLOW);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_bytes), cmocka_unit_test(test_round_trip), cmocka_unit_test(test_zigzag),
        cmocka_unit_test(test_truncated),   cmocka_unit_test(test_overflow),   cmocka_unit_test(test_get_max),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
