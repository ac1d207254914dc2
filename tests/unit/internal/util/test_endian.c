/* Unit tests for internal/util/endian.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "internal/util/endian.h"

static void test_byte_order(void **state)
{
    uint8_t b[8];
    le_put32(b, 0x11223344u);
    const uint8_t want32[4] = {0x44, 0x33, 0x22, 0x11};
    assert_memory_equal(b, want32, 4);
    le_put64(b, 0x0102030405060708ull);
    const uint8_t want64[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    assert_memory_equal(b, want64, 8);
    le_put16(b, 0xBEEF);
    assert_int_equal(b[0], 0xEF);
    assert_int_equal(b[1], 0xBE);
    assert_int_equal(b[2], 6); /* untouched beyond the width */
}

static void test_round_trip(void **state)
{
    const uint64_t vals[] = {0,          1,           0x80,           0xff,       0x100,
                             0x7fffffff, 0xffffffffu, 0x100000000ull, UINT64_MAX, 0x8000000000000000ull};
    uint8_t buf[16]; /* room beyond the widest write (8 bytes at offset 1) */
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        uint64_t v = vals[i];
        for (size_t n = 0; n <= 8; n++) {
            memset(buf, 0xAA, sizeof(buf));
            le_put(buf + 1, v, n); /* unaligned on purpose */
            uint64_t mask = n == 8 ? UINT64_MAX : ((1ull << (8 * n)) - 1);
            assert_true(le_get(buf + 1, n) == (v & mask));
            assert_int_equal(buf[0], 0xAA);
            if (n < 8)
                assert_int_equal(buf[1 + n], 0xAA);
        }
        le_put64(buf + 1, v);
        assert_true(le_get64(buf + 1) == v);
        le_put32(buf + 1, (uint32_t)v);
        assert_true(le_get32(buf + 1) == (uint32_t)v);
        le_put16(buf + 1, (uint16_t)v);
        assert_true(le_get16(buf + 1) == (uint16_t)v);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_order),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
