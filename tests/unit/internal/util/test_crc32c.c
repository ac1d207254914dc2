/* Unit tests for internal/util/crc32c.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "internal/util/crc32c.h"

/* The bit-at-a-time definition, the reference both fast paths must match. */
static uint32_t crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & -(c & 1));
    }
    return ~c;
}

static void test_check_values(void **state)
{
    /* the standard check value of CRC-32C */
    assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c__sw(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c_update(0, "123456789", 9), 0xE3069283u);
    /* nothing is 0, and an empty piece changes nothing */
    assert_int_equal(crc32c("", 0), 0);
    assert_int_equal(crc32c_update(0xE3069283u, "", 0), 0xE3069283u);
    /* RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of 0xff, and ascending 0..31 */
    uint8_t b[32];
    memset(b, 0, sizeof b);
    assert_int_equal(crc32c(b, sizeof b), 0x8A9136AAu);
    memset(b, 0xff, sizeof b);
    assert_int_equal(crc32c(b, sizeof b), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    assert_int_equal(crc32c(b, sizeof b), 0x46DD794Eu);
}

/* Every alignment and length: the CPU path, the software path and the bitwise reference agree,
 * and a checksum fed in pieces equals the one over the whole. */
static void test_paths_agree(void **state)
{
    uint8_t buf[1000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    for (size_t off = 0; off < 9; off++) {
        for (size_t len = 0; len + off <= sizeof buf; len += 37) {
            uint32_t a = crc32c(buf + off, len);
            assert_int_equal(a, crc32c__sw(0, buf + off, len));
            assert_int_equal(a, crc32c_bitwise(buf + off, len));
            size_t third = len / 3;
            assert_int_equal(a, crc32c_update(crc32c(buf + off, third), buf + off + third, len - third));
            assert_int_equal(a, crc32c__sw(crc32c__sw(0, buf + off, third), buf + off + third, len - third));
        }
    }
    for (size_t len = 0; len < 20; len++) /* the byte tails of both paths */
        assert_int_equal(crc32c(buf, len), crc32c_bitwise(buf, len));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_values),
        cmocka_unit_test(test_paths_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
