/*
 * regex — the one regular-expression engine of sluice: label matchers, label_replace, the alert
 * template functions (match, reReplaceAll) and the control API's drain patterns all go through it.
 *
 * Why RE2. Prometheus evaluates regexes with Go's regexp package, which is RE2: the same syntax
 * (Perl classes, \pN, (?flags), named groups (?P<n>re)), leftmost-first submatches, and matching
 * in time linear in the text. A backtracking engine differs in two ways that change answers: it
 * accepts what Go refuses (backreferences \1, recursion (?R), look-arounds (?=..) (?<=..)), and
 * it gives up on patterns like `(a+)+b` over long values, which a caller then sees as "no match"
 * (issue #16). RE2 has neither: what Go refuses, RE2 refuses with the same error codes, and a
 * match never gives up. The engine is Debian's libre2 (C++) behind the C shim regex_re2.cc; this
 * header is all the rest of the tree sees.
 *
 * Semantics are Go's regexp.Compile with syntax.Perl, as Prometheus 2.42 uses it:
 *  - UTF-8 text and pattern; `.` and `[^a]` do not match "\n" unless the pattern says (?s);
 *    `^`/`$` are start/end of text unless (?m); `\d \w \s \b` and [[:alpha:]] are ASCII.
 *  - REGEX_ANCHOR compiles "^(?:" pattern ")$", the form Prometheus gives label matchers and
 *    label_replace: the whole value must match. Errors then quote the wrapped text as Go does
 *    ("missing closing ): `^(?:(a)$`").
 *  - Refused, with Go's messages ("error parsing regexp: <reason>: `<fragment>`"): \1..\9,
 *    (?R), (?=, (?!, (?<=, (?<!, (?<name>, (?P=name), possessive a++, \C (RE2 has it, Go does
 *    not: refused here), \Z, repeat counts over 1000, unknown classes, invalid UTF-8.
 *  - A pattern whose compiled program needs more than REGEX_MAX_MEM is refused ("expression too
 *    large"); one that compiles never fails later (a DFA out of room falls back to the NFA).
 *
 * Matching cannot fail: no match limit, no depth limit, no "gave up" result. Compiled patterns
 * are immutable and may be used from many threads at once.
 */
#ifndef SLUICE_UTIL_REGEX_H
#define SLUICE_UTIL_REGEX_H

#include <stdbool.h>
#include <stddef.h>

#include "internal/util/buf.h"

#ifdef __cplusplus
extern "C" { /* defined in C++ by regex_re2.cc */
#endif

/* Compile flags. */
#define REGEX_ANCHOR 0x1u /* match the whole text: "^(?:" pattern ")$" */

/* Status codes (0 = ok). */
#define REGEX_OK 0
#define REGEX_ERR_SYNTAX (-1) /* refused pattern; the message says why */
#define REGEX_ERR_NOMEM (-2)

/* Memory budget of one compiled pattern (RE2's max_mem: programs plus DFA caches). */
#define REGEX_MAX_MEM (32 << 20)

typedef struct regex_prog regex_prog_t;

/* Byte offsets [start, end) into the searched text; both -1 for a group that took no part. */
typedef struct {
    long start;
    long end;
} regex_span_t;

/* Compiles the NUL-terminated pattern into *out (freed with regex_free). On failure returns
 * REGEX_ERR_SYNTAX or REGEX_ERR_NOMEM, leaves *out NULL and writes Go's message into err. */
__attribute__((warn_unused_result)) int regex_compile(const char *pattern, unsigned flags, regex_prog_t **out,
                                                      char *err, size_t errlen);
/* re may be NULL. */
void regex_free(regex_prog_t *re);

/* Does the whole of s[0:n] match? (For a REGEX_ANCHOR pattern, the same as any match.) */
bool regex_full_match(const regex_prog_t *re, const char *s, size_t n);

/* Leftmost-first search of s[0:n] for a match starting at or after `from` (the text before it
 * still counts as context for ^ and \b, as in Go). On a match fills sp[0] with the whole match
 * and sp[1..nsp-1] with the groups (spans past the pattern's groups are -1), and returns true. */
bool regex_search(const regex_prog_t *re, const char *s, size_t n, size_t from, regex_span_t *sp, size_t nsp);

/* Number of capture groups (group 0, the whole match, not counted). */
size_t regex_group_count(const regex_prog_t *re);
/* Name of group i (1 <= i <= regex_group_count) as in (?P<name>re), owned by re; NULL when the
 * group has no name. Names may repeat (Go allows it). */
const char *regex_group_name(const regex_prog_t *re, size_t i);

/* Go's Regexp.ExpandString: appends tmpl to dst with $1, ${1}, $name, ${name} replaced by the
 * groups sp[0..nsp-1] of a match in src, $$ by "$"; an unknown or unmatched group expands to "",
 * a malformed reference ("$", "${x") is copied as it is. */
void regex_expand(const regex_prog_t *re, buf_t *dst, const char *tmpl, const char *src, const regex_span_t *sp,
                  size_t nsp);

/* Go's Regexp.ReplaceAllString: appends s[0:n] to dst with every match replaced by tmpl expanded
 * as regex_expand does (an empty match right after a match is not replaced). */
void regex_replace_all(const regex_prog_t *re, buf_t *dst, const char *s, size_t n, const char *tmpl);

/* Shared with regex.c: whether the character at s[0:n] is a letter, a decimal digit or '_' by
 * Go's unicode.IsLetter/IsDigit (what a $name in a template may hold); returns its length in
 * bytes, or 0. */
size_t regex__name_char(const char *s, size_t n);

#ifdef __cplusplus
}
#endif

#endif
