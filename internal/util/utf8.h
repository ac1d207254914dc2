/*
 * utf8 — UTF-8 decoding, validation and encoding by Go's rules (unicode/utf8), which is what
 * Prometheus and its clients apply to label values, metadata and JSON.
 *
 * A well-formed sequence is one of
 *
 *   bytes  first      second     third      fourth     code points
 *   -----  ---------  ---------  ---------  ---------  ------------------------------------
 *   1      00..7F                                      U+0000..U+007F
 *   2      C2..DF     80..BF                           U+0080..U+07FF
 *   3      E0..EF     80..BF     80..BF                U+0800..U+FFFF minus U+D800..U+DFFF
 *   4      F0..F4     80..BF     80..BF     80..BF     U+10000..U+10FFFF
 *
 * so overlong forms (C0 80 for U+0000, E0 80 80, F0 80 80 80), UTF-16 surrogates (ED A0 80),
 * code points above U+10FFFF (F4 90 80 80, F5..FF), stray continuation bytes and sequences cut
 * short by the end of the input are invalid. NUL and other control characters are valid UTF-8:
 * callers that refuse them check for them themselves.
 *
 * Inputs are (pointer, length) slices; nothing reads past s + n and nothing needs a terminator.
 */
#ifndef SLUICE_UTIL_UTF8_H
#define SLUICE_UTIL_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_MAX 4               /* bytes in the longest sequence */
#define UTF8_REPLACEMENT 0xFFFDu /* U+FFFD, what Go writes for an invalid code point */

/* Decodes the sequence at s[0:n] (n >= 1). Returns its length (1..4) and stores the code point in
 * *cp (when cp is not NULL), or returns 0 when the sequence is invalid or truncated. */
size_t utf8_decode(const char *s, size_t n, uint32_t *cp);

/* Whether all n bytes at s are well-formed UTF-8 (Go's utf8.Valid). n = 0 is valid. */
bool utf8_valid(const char *s, size_t n);

/* Writes cp as UTF-8 to out (room for UTF8_MAX bytes) and returns the bytes written (1..4).
 * A surrogate or a value above U+10FFFF is written as U+FFFD (Go's utf8.EncodeRune). */
size_t utf8_encode(char *out, uint32_t cp);

#endif
