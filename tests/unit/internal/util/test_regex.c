/* Unit tests for internal/util/regex.h (regex_re2.cc, regex.c): Go's syntax, errors and expansion.
 * Expected values are what Go's regexp package (Prometheus 2.42) answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/regex.h"

static regex_prog_t *compile_ok(const char *pat, unsigned flags)
{
    regex_prog_t *re = NULL;
    char err[256] = "";
    int rc = regex_compile(pat, flags, &re, err, sizeof(err));
    if (rc != REGEX_OK)
        fail_msg("%s: %s", pat, err);
    return re;
}

static bool full(const char *pat, const char *s)
{
    regex_prog_t *re = compile_ok(pat, REGEX_ANCHOR);
    bool r = regex_full_match(re, s, strlen(s));
    /* With REGEX_ANCHOR a search is the same question. */
    assert_int_equal(r, regex_search(re, s, strlen(s), 0, NULL, 0));
    regex_free(re);
    return r;
}

static void test_go_semantics(void **state)
{
    assert_true(full("abc", "abc"));
    assert_false(full("abc", "abcd"));
    assert_false(full("a|b", "ab"));   /* ^(?:a|b)$ */
    assert_false(full("a.b", "a\nb")); /* . excludes \n */
    assert_true(full("(?s)a.b", "a\nb"));
    assert_false(full(".*", "x\n"));
    assert_false(full("a$", "a\n")); /* $ is end of text */
    assert_true(full("(?m)a$\nb", "a\nb"));
    assert_true(full("(?i)k", "\xe2\x84\xaa")); /* KELVIN SIGN folds to k, as in Go */
    assert_true(full("\\pL+", "h\xc3\xa9llo"));
    assert_true(full("h.llo", "h\xc3\xa9llo")); /* . is one code point */
    assert_false(full("\\d", "\xd9\xa1"));      /* \d is ASCII */
    assert_true(full("\\p{Nd}", "\xd9\xa1"));
    assert_true(full("[[:alpha:]]+", "abcXYZ"));
    assert_false(full("[[:alpha:]]", "\xc3\xa9"));
    assert_true(full("abc|", ""));
    assert_false(full("a{1000}", "aaaa"));
    assert_true(full("\\Qa.b\\E", "a.b"));
    assert_false(full("\\Qa.b\\E", "axb"));
    assert_true(full("\\Qa\\C\\E", "a\\C")); /* \C inside \Q..\E is text */
    assert_true(full("(?U)a+", "aaa"));
    assert_true(full("x*", ""));
}

static void refused(const char *pat, unsigned flags, const char *want)
{
    regex_prog_t *re = (regex_prog_t *)1;
    char err[256] = "";
    assert_int_equal(regex_compile(pat, flags, &re, err, sizeof(err)), REGEX_ERR_SYNTAX);
    assert_null(re);
    assert_string_equal(err, want);
}

/* The messages are the ones Prometheus 2.42 returned for up{job=~"..."} (tests/integration/
 * test_regex_re2.py compares them with the real binary). */
static void test_refused_like_go(void **state)
{
    refused("(a)\\1", REGEX_ANCHOR, "error parsing regexp: invalid escape sequence: `\\1`");
    refused("(?R)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?R`");
    refused("(?=x)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?=`");
    refused("(?!x)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?!`");
    refused("(?<=x)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?<`");
    refused("(?<!x)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?<`");
    refused("(?<n>a)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?<`");
    refused("(?P=n)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?P`");
    refused("\\C", REGEX_ANCHOR, "error parsing regexp: invalid escape sequence: `\\C`");
    refused("[\\C]", 0, "error parsing regexp: invalid escape sequence: `\\C`");
    refused("\\Z", REGEX_ANCHOR, "error parsing regexp: invalid escape sequence: `\\Z`");
    refused("(a", REGEX_ANCHOR, "error parsing regexp: missing closing ): `^(?:(a)$`");
    refused("(a", 0, "error parsing regexp: missing closing ): `(a`");
    refused("x)", REGEX_ANCHOR, "error parsing regexp: unexpected ): `^(?:x))$`");
    refused("[a", REGEX_ANCHOR, "error parsing regexp: missing closing ]: `[a)$`");
    refused("a**", REGEX_ANCHOR, "error parsing regexp: invalid nested repetition operator: `**`");
    refused("a++", REGEX_ANCHOR, "error parsing regexp: invalid nested repetition operator: `++`");
    refused("*", REGEX_ANCHOR, "error parsing regexp: missing argument to repetition operator: `*`");
    refused("a{1001}", REGEX_ANCHOR, "error parsing regexp: invalid repeat count: `{1001}`");
    refused("(a{100}){100}", REGEX_ANCHOR, "error parsing regexp: invalid repeat count: `{100}`");
    refused("[z-a]", REGEX_ANCHOR, "error parsing regexp: invalid character class range: `z-a`");
    refused("\\pX", REGEX_ANCHOR, "error parsing regexp: invalid character class range: `\\pX`");
    refused("(?z)", REGEX_ANCHOR, "error parsing regexp: invalid or unsupported Perl syntax: `(?z`");
    /* Accepted by Go 1.19 too: duplicate group names. */
    regex_free(compile_ok("(?P<n>a)(?P<n>b)", REGEX_ANCHOR));
}

/* Issue #16: no match limit, no silent "no match". */
static void test_linear_time(void **state)
{
    size_t n = 100000;
    char *s = malloc(n + 2);
    assert_non_null(s);
    memset(s, 'a', n);
    s[n] = 0;
    regex_prog_t *re = compile_ok("(a+)+b|a*", REGEX_ANCHOR);
    assert_true(regex_full_match(re, s, n));
    regex_free(re);
    re = compile_ok("(a|aa)*b", REGEX_ANCHOR);
    assert_false(regex_full_match(re, s, n));
    s[n - 1] = 'b';
    assert_true(regex_full_match(re, s, n));
    regex_span_t sp[2];
    assert_true(regex_search(re, s, n, 0, sp, 2));
    assert_int_equal(sp[0].start, 0);
    assert_int_equal(sp[0].end, (long)n);
    regex_free(re);
    free(s);
}

static void test_search_and_groups(void **state)
{
    regex_prog_t *re = compile_ok("(?P<word>[a-z]+)(\\d)?", 0);
    assert_int_equal(regex_group_count(re), 2);
    assert_string_equal(regex_group_name(re, 1), "word");
    assert_null(regex_group_name(re, 2));
    const char *s = "12 abc x9";
    regex_span_t sp[4];
    assert_true(regex_search(re, s, strlen(s), 0, sp, 4));
    assert_int_equal(sp[0].start, 3);
    assert_int_equal(sp[0].end, 6);
    assert_int_equal(sp[1].start, 3);
    assert_int_equal(sp[2].start, -1); /* did not take part */
    assert_int_equal(sp[3].start, -1); /* beyond the pattern's groups */
    assert_true(regex_search(re, s, strlen(s), 6, sp, 3));
    assert_int_equal(sp[0].start, 7);
    assert_int_equal(sp[2].start, 8);
    assert_false(regex_search(re, s, strlen(s), 9, sp, 3));
    regex_free(re);
    /* Text before `from` is context: ^ does not match there, \b sees the previous byte. */
    re = compile_ok("^a|\\bb", 0);
    assert_false(regex_search(re, "xab", 3, 1, sp, 1));
    assert_true(regex_search(re, "x b", 3, 1, sp, 1));
    regex_free(re);
    /* Leftmost-first, as Go (not leftmost-longest). */
    re = compile_ok("a|ab", 0);
    assert_true(regex_search(re, "ab", 2, 0, sp, 1));
    assert_int_equal(sp[0].end, 1);
    regex_free(re);
}

static char *expand(const char *pat, const char *tmpl, const char *src)
{
    regex_prog_t *re = compile_ok(pat, REGEX_ANCHOR);
    size_t nsp = regex_group_count(re) + 1;
    regex_span_t sp[8];
    assert_true(nsp <= 8);
    buf_t b = BUF_INIT;
    if (regex_search(re, src, strlen(src), 0, sp, nsp))
        regex_expand(re, &b, tmpl, src, sp, nsp);
    regex_free(re);
    buf_putc(&b, 0);
    return b.data;
}

#define EXPANDS(pat, tmpl, src, want)                                                                                  \
    do {                                                                                                               \
        char *got_ = expand(pat, tmpl, src);                                                                           \
        assert_string_equal(got_, want);                                                                               \
        free(got_);                                                                                                    \
    } while (0)

/* Go's Regexp.ExpandString, case by case. */
static void test_expand(void **state)
{
    EXPANDS("(a)(b)", "$2$1", "ab", "ba");
    EXPANDS("(a)(b)", "${1}x$1x", "ab", "ax");          /* $1x is the group named "1x": empty */
    EXPANDS("(a)(b)", "$$1 $ ${1", "ab", "$1 $ ${1");   /* $$ and malformed references */
    EXPANDS("(a)(b)", "$01|$3|$100000000", "ab", "||"); /* leading zero = name; no group 3 */
    EXPANDS("(?P<x>a)(?P<y>b)?", "[$x][$y][${x}]", "a", "[a][][a]");
    EXPANDS("(?P<n>a)|(?P<n>b)", "$n", "b", "b");           /* first group of that name that matched */
    EXPANDS("(a)", "$\xc3\xa9!", "a", "!");                 /* "é" is a name (no such group) */
    EXPANDS("(a)", "$1\xe2\x80\x94", "a", "a\xe2\x80\x94"); /* an em dash is not a letter */
    EXPANDS("(a)", "$1\xc3\xa9", "a", "");                  /* "1é" is a name, not group 1 */
    EXPANDS("(.*)", "", "x", "");
}

static char *replace_all(const char *pat, const char *src, const char *tmpl)
{
    regex_prog_t *re = compile_ok(pat, 0);
    buf_t b = BUF_INIT;
    regex_replace_all(re, &b, src, strlen(src), tmpl);
    regex_free(re);
    buf_putc(&b, 0);
    return b.data;
}

#define REPLACES(pat, src, tmpl, want)                                                                                 \
    do {                                                                                                               \
        char *got_ = replace_all(pat, src, tmpl);                                                                      \
        assert_string_equal(got_, want);                                                                               \
        free(got_);                                                                                                    \
    } while (0)

/* Go's Regexp.ReplaceAllString (results checked against Go's regexp docs and tests). */
static void test_replace_all(void **state)
{
    REPLACES("a(x*)b", "-ab-axxb-", "T", "-T-T-");
    REPLACES("a(x*)b", "-ab-axxb-", "$1", "--xx-");
    REPLACES("a(x*)b", "-ab-axxb-", "$1W", "---");
    REPLACES("a(x*)b", "-ab-axxb-", "${1}W", "-W-xxW-");
    REPLACES("x*", "abc", "-", "-a-b-c-");
    REPLACES("b*", "abc", "x", "xaxcx"); /* no empty match right after "b" */
    REPLACES("a*", "baaac", "x", "xbxcx");
    REPLACES("", "\xc3\xa9", "-", "-\xc3\xa9-"); /* advances by a whole character */
    REPLACES("tm-(\\d+).*", "tm-1.example", "TaskManager $1", "TaskManager 1");
    REPLACES("^", "abc", "x", "xabc");
    REPLACES("$", "abc", "x", "abcx");
    REPLACES("q", "abc", "x", "abc");
}

static void test_invalid_utf8_and_budget(void **state)
{
    regex_prog_t *re = NULL;
    char err[256];
    assert_int_equal(regex_compile("a\xff", REGEX_ANCHOR, &re, err, sizeof(err)), REGEX_ERR_SYNTAX);
    assert_non_null(strstr(err, "error parsing regexp: invalid UTF-8"));
    /* A pattern over the memory budget is refused, not accepted and then failed at match time. */
    char big[16 * 12 + 1] = "";
    for (int i = 0; i < 12; i++)
        strcat(big, "\\pL{1000}");
    assert_int_equal(regex_compile(big, REGEX_ANCHOR, &re, err, sizeof(err)), REGEX_ERR_SYNTAX);
    assert_null(re);
    assert_non_null(strstr(err, "error parsing regexp: expression too large"));
    /* One that compiles but whose reverse program does not fit still answers right: RE2 falls
     * back to the NFA (older RE2 releases answered "no match" here). */
    re = compile_ok("x\\pL{1000}", 0);
    size_t n = 1 + 1001;
    char *s = malloc(n + 1);
    assert_non_null(s);
    s[0] = '1';
    memset(s + 1, 'x', n - 1);
    s[n] = 0;
    regex_span_t sp[1];
    assert_true(regex_search(re, s, n, 0, sp, 1));
    assert_int_equal(sp[0].start, 1);
    assert_int_equal(sp[0].end, (long)n);
    assert_true(regex_search(re, s, n, 0, NULL, 0));
    s[n - 1] = '1';
    assert_false(regex_search(re, s, n, 0, sp, 1));
    regex_free(re);
    free(s);
    /* A NULL error buffer is allowed. */
    assert_int_equal(regex_compile("(", 0, &re, NULL, 0), REGEX_ERR_SYNTAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_go_semantics),
        cmocka_unit_test(test_refused_like_go),
        cmocka_unit_test(test_linear_time),
        cmocka_unit_test(test_search_and_groups),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_replace_all),
        cmocka_unit_test(test_invalid_utf8_and_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
