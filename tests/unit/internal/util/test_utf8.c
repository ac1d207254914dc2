/* Unit tests for internal/util/utf8.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "internal/util/utf8.h"

/* One input and what Go's utf8.Valid says of it. Lengths are explicit so NULs can be inside. */
typedef struct {
    const char *s;
    size_t n;
    bool valid;
    const char *what;
} utf8_case_t;

#define CASE(lit, v, what)                                                                                             \
    {                                                                                                                  \
        lit, sizeof(lit) - 1, v, what                                                                                  \
    }

static const utf8_case_t cases[] = {
    CASE("", true, "empty"),
    CASE("hello", true, "ASCII"),
    CASE("a\0b", true, "NUL is valid UTF-8"),
    CASE("\x7f", true, "DEL, the last 1-byte"),
    CASE("\xc2\x80", true, "U+0080, the first 2-byte"),
    CASE("\xdf\xbf", true, "U+07FF, the last 2-byte"),
    CASE("\xe0\xa0\x80", true, "U+0800, the first 3-byte"),
    CASE("\xed\x9f\xbf", true, "U+D7FF, below the surrogates"),
    CASE("\xee\x80\x80", true, "U+E000, above the surrogates"),
    CASE("\xef\xbf\xbd", true, "U+FFFD"),
    CASE("\xef\xbf\xbf", true, "U+FFFF, the last 3-byte"),
    CASE("\xf0\x90\x80\x80", true, "U+10000, the first 4-byte"),
    CASE("\xf4\x8f\xbf\xbf", true, "U+10FFFF, the largest code point"),
    CASE("gr\xc3\xbc\xc3\x9f dich \xe2\x82\xac \xf0\x9f\x98\x80 and a long ASCII tail", true, "mixed"),
    CASE("\x80", false, "stray continuation"),
    CASE("\xbf", false, "stray continuation (last)"),
    CASE("\xc0\x80", false, "overlong U+0000 (2 bytes)"),
    CASE("\xc1\xbf", false, "overlong U+007F"),
    CASE("\xe0\x80\x80", false, "overlong U+0000 (3 bytes)"),
    CASE("\xe0\x9f\xbf", false, "overlong U+07FF"),
    CASE("\xf0\x80\x80\x80", false, "overlong U+0000 (4 bytes)"),
    CASE("\xf0\x8f\xbf\xbf", false, "overlong U+FFFF"),
    CASE("\xed\xa0\x80", false, "surrogate U+D800"),
    CASE("\xed\xbf\xbf", false, "surrogate U+DFFF"),
    CASE("\xed\xa0\xbd\xed\xb8\x80", false, "CESU-8 surrogate pair"),
    CASE("\xf4\x90\x80\x80", false, "U+110000"),
    CASE("\xf5\x80\x80\x80", false, "lead F5"),
    CASE("\xf8\x88\x80\x80\x80", false, "5-byte form"),
    CASE("\xfe", false, "FE"),
    CASE("\xff", false, "FF"),
    CASE("\xc3", false, "2-byte cut after 1"),
    CASE("\xe2\x82", false, "3-byte cut after 2"),
    CASE("\xf0\x9f\x98", false, "4-byte cut after 3"),
    CASE("abc\xf0", false, "4-byte cut after 1, at the end"),
    CASE("\xc3\x28", false, "2-byte with a bad continuation"),
    CASE("\xe2\x28\xa1", false, "3-byte with a bad second byte"),
    CASE("\xe2\x82\x28", false, "3-byte with a bad third byte"),
    CASE("\xf0\x9f\x98\x28", false, "4-byte with a bad fourth byte"),
    CASE("abcdefgh\xff", false, "invalid after an 8-byte ASCII run"),
    CASE("abcdefghijklmnop\xed\xa0\x80xyz", false, "surrogate after ASCII runs"),
};

static void test_valid_table(void **state)
{
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const utf8_case_t *c = &cases[i];
        if (utf8_valid(c->s, c->n) != c->valid)
            fail_msg("utf8_valid(%s) = %d, want %d", c->what, !c->valid, c->valid);
    }
}

/* utf8_decode of a single whole sequence agrees with utf8_valid and gives the code point. */
static void test_decode(void **state)
{
    static const struct {
        const char *s;
        size_t len;
        uint32_t cp;
    } ok[] = {
        {"A", 1, 'A'},
        {"\xc2\x80", 2, 0x80},
        {"\xdf\xbf", 2, 0x7ff},
        {"\xe2\x82\xac", 3, 0x20ac},
        {"\xef\xbf\xbf", 3, 0xffff},
        {"\xf0\x9f\x98\x80", 4, 0x1f600},
        {"\xf4\x8f\xbf\xbf", 4, 0x10ffff},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint32_t cp = 0;
        assert_int_equal(utf8_decode(ok[i].s, strlen(ok[i].s), &cp), ok[i].len);
        assert_int_equal(cp, ok[i].cp);
        assert_int_equal(utf8_decode(ok[i].s, strlen(ok[i].s), NULL), ok[i].len);
    }
    /* only the first sequence is read */
    assert_int_equal(utf8_decode("\xc3\xa9xyz", 5, NULL), 2);
    /* NUL decodes as itself */
    uint32_t cp = 7;
    assert_int_equal(utf8_decode("\0", 1, &cp), 1);
    assert_int_equal(cp, 0);
    /* n bounds the read even when more bytes follow in memory */
    assert_int_equal(utf8_decode("\xe2\x82\xac", 2, NULL), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const utf8_case_t *c = &cases[i];
        if (c->valid || c->n == 0)
            continue;
        size_t l = utf8_decode(c->s, c->n, NULL);
        if (l == c->n)
            fail_msg("utf8_decode accepts all of %s", c->what);
    }
}

/* Every code point: encode, then decode gives it back; utf8_valid agrees. */
static void test_encode_round_trip(void **state)
{
    char out[UTF8_MAX];
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        size_t l = utf8_encode(out, cp);
        uint32_t back;
        if (cp >= 0xd800 && cp <= 0xdfff) {
            assert_int_equal(l, 3);
            assert_int_equal(utf8_decode(out, l, &back), 3);
            assert_int_equal(back, UTF8_REPLACEMENT);
            continue;
        }
        size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (l != want || utf8_decode(out, l, &back) != l || back != cp || !utf8_valid(out, l))
            fail_msg("U+%04X does not round-trip", (unsigned)cp);
    }
    assert_int_equal(utf8_encode(out, 0x110000), 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
    assert_int_equal(utf8_encode(out, UINT32_MAX), 3);
    assert_memory_equal(out, "\xef\xbf\xbd", 3);
}

/* Every 2- and 3-byte input: utf8_valid accepts exactly what the table in utf8.h allows. */
static void test_exhaustive_short(void **state)
{
    unsigned char b[3];
    for (unsigned x = 0; x < 256; x++)
        for (unsigned y = 0; y < 256; y++) {
            b[0] = (unsigned char)x, b[1] = (unsigned char)y;
            bool cont1 = (y & 0xc0) == 0x80;
            bool want = (x < 0x80 && y < 0x80) || (x >= 0xc2 && x <= 0xdf && cont1);
            if (utf8_valid((const char *)b, 2) != want)
                fail_msg("%02x %02x", x, y);
        }
    for (unsigned x = 0xe0; x <= 0xef; x++)
        for (unsigned y = 0; y < 256; y++)
            for (unsigned z = 0x70; z < 0xc8; z++) {
                b[0] = (unsigned char)x, b[1] = (unsigned char)y, b[2] = (unsigned char)z;
                bool conts = (y & 0xc0) == 0x80 && (z & 0xc0) == 0x80;
                bool want = conts && !(x == 0xe0 && y < 0xa0) && !(x == 0xed && y >= 0xa0);
                if (utf8_valid((const char *)b, 3) != want)
                    fail_msg("%02x %02x %02x", x, y, z);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_table),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_encode_round_trip),
        cmocka_unit_test(test_exhaustive_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
