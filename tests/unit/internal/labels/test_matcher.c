/* Unit tests for internal/labels/matcher.c: Prometheus matcher semantics and fast paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "internal/labels/matcher.h"

static bool m1(matcher_type_t t, const char *re, const char *v)
{
    char err[256];
    matcher_t *m = matcher_new(t, "x", re, err, sizeof(err));
    assert_non_null(m);
    bool r = matcher_matches(m, v, v ? strlen(v) : 0);
    /* Every verdict must agree with plain RE2 (no fast path). */
    matcher_t *p = matcher__new_no_fastpath(t, "x", re, err, sizeof(err));
    assert_non_null(p);
    assert_int_equal(r, matcher_matches(p, v, v ? strlen(v) : 0));
    assert_int_equal(matcher_matches_empty(m), matcher_matches_empty(p));
    matcher_free(m);
    matcher_free(p);
    return r;
}

static void test_equality(void **state)
{
    assert_true(m1(MATCHER_EQ, "a", "a"));
    assert_false(m1(MATCHER_EQ, "a", "ab"));
    assert_false(m1(MATCHER_EQ, "a", NULL));
    assert_true(m1(MATCHER_EQ, "", NULL)); /* absent label == "" */
    assert_true(m1(MATCHER_NEQ, "a", "b"));
    assert_true(m1(MATCHER_NEQ, "a", NULL));
    assert_false(m1(MATCHER_NEQ, "a", "a"));
    assert_false(m1(MATCHER_NEQ, "", NULL));
}

static void test_anchoring(void **state)
{
    assert_true(m1(MATCHER_RE, "foo", "foo"));
    assert_false(m1(MATCHER_RE, "foo", "xfoo"));
    assert_false(m1(MATCHER_RE, "foo", "foox"));
    assert_false(m1(MATCHER_RE, "fo+", "fooo\n")); /* $ is end of text, like Go */
    assert_true(m1(MATCHER_RE, "a|b", "b"));
    assert_false(m1(MATCHER_RE, "a|b", "ab")); /* ^(?:a|b)$, not ^a|b$ */
    assert_true(m1(MATCHER_RE, "f.o", "fxo"));
    assert_false(m1(MATCHER_RE, "f.o", "f\no")); /* . excludes newline */
    assert_true(m1(MATCHER_RE, "[a-c]+\\d", "abc1"));
    assert_true(m1(MATCHER_NRE, "foo", "xfoo"));
    assert_false(m1(MATCHER_NRE, "fo.*", "foo"));
    assert_true(m1(MATCHER_RE, "(?i)FOO", "foo"));
    assert_true(m1(MATCHER_RE, "\\pL+", "héllo")); /* UTF-8 aware */
    assert_true(m1(MATCHER_RE, "h.llo", "héllo")); /* . is one code point */
}

static void test_fast_paths(void **state)
{
    const char *vals[] = {"",     "a",   "b",   "c",   "ab", "foo",   "foobar", "fo",
                          "x\ny", "a|b", "a.b", "axb", "\n", "foo\n", "ÿ",      NULL};
    const char *res[] = {".*", ".+",          "a",   "a|b|c", "foo.*", "fo.*",  "a\\|b", "a\\.b",
                         "|a", "foo|foobar|", "a.b", "",      "x.y",   "(a|b)", "b|a|b", NULL};
    for (int i = 0; res[i]; i++)
        for (int j = 0; vals[j]; j++) {
            m1(MATCHER_RE, res[i], vals[j]);
            m1(MATCHER_NRE, res[i], vals[j]);
        }
    assert_true(m1(MATCHER_RE, ".*", ""));
    assert_false(m1(MATCHER_RE, ".*", "x\ny"));
    assert_false(m1(MATCHER_RE, ".+", ""));
    assert_true(m1(MATCHER_RE, "foo.*", "foobar"));
    assert_true(m1(MATCHER_RE, "a\\|b", "a|b"));
    assert_false(m1(MATCHER_RE, "a\\.b", "axb"));
    assert_true(m1(MATCHER_RE, "|a", ""));

    char err[128];
    const char *const *set;
    matcher_t *m = matcher_new(MATCHER_RE, "x", "c|a|b|a", err, sizeof(err));
    assert_int_equal(matcher_literal_set(m, &set), 3);
    assert_string_equal(set[0], "a");
    assert_string_equal(set[2], "c");
    assert_false(matcher_matches_empty(m));
    matcher_free(m);
    m = matcher_new(MATCHER_RE, "x", "a+", err, sizeof(err));
    assert_int_equal(matcher_literal_set(m, &set), 0);
    matcher_free(m);
    m = matcher_new(MATCHER_NEQ, "x", "v", err, sizeof(err));
    assert_int_equal(matcher_literal_set(m, &set), 1);
    assert_true(matcher_matches_empty(m));
    char buf[64];
    assert_string_equal(matcher_format(m, buf, sizeof(buf)), "x!=\"v\"");
    matcher_free(m);
}

static void test_empty_match_flags(void **state)
{
    struct {
        matcher_type_t t;
        const char *v;
        bool empty;
    } cases[] = {
        {MATCHER_EQ, "", true},   {MATCHER_EQ, "a", false},  {MATCHER_NEQ, "a", true},  {MATCHER_NEQ, "", false},
        {MATCHER_RE, ".*", true}, {MATCHER_RE, ".+", false}, {MATCHER_NRE, ".+", true}, {MATCHER_NRE, ".*", false},
        {MATCHER_RE, "a?", true}, {MATCHER_RE, "a|", true},
    };
    char err[128];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        matcher_t *m = matcher_new(cases[i].t, "x", cases[i].v, err, sizeof(err));
        assert_non_null(m);
        assert_int_equal(matcher_matches_empty(m), cases[i].empty);
        matcher_free(m);
    }
}

static void test_bad_regex(void **state)
{
    char err[256] = "";
    assert_null(matcher_new(MATCHER_RE, "x", "a(b", err, sizeof(err)));
    assert_non_null(strstr(err, "error parsing regexp"));
    assert_null(matcher_new(MATCHER_NRE, "x", "[z-a]", err, sizeof(err)));
    /* What Go's regexp refuses is refused, with Go's message and the label's regex quoted. */
    static const struct {
        const char *re, *msg;
    } refused[] = {
        {"(a)\\1", "error parsing regexp: invalid escape sequence: `\\1`"},
        {"(?R)", "error parsing regexp: invalid or unsupported Perl syntax: `(?R`"},
        {"(?=x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?=`"},
        {"(?!x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?!`"},
        {"(?<=x)", "error parsing regexp: invalid or unsupported Perl syntax: `(?<`"},
        {"\\C", "error parsing regexp: invalid escape sequence: `\\C`"},
        {"(a", "error parsing regexp: missing closing ): `^(?:(a)$`"},
        {"a++", "error parsing regexp: invalid nested repetition operator: `++`"},
        {"\\xff", NULL}, /* valid: the escape \\xff is U+00FF */
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        for (int fast = 0; fast < 2; fast++) {
            err[0] = 0;
            matcher_t *m = fast ? matcher_new(MATCHER_RE, "x", refused[i].re, err, sizeof(err))
                                : matcher__new_no_fastpath(MATCHER_RE, "x", refused[i].re, err, sizeof(err));
            if (!refused[i].msg) {
                assert_non_null(m);
                matcher_free(m);
                continue;
            }
            assert_null(m);
            assert_string_equal(err, refused[i].msg);
        }
    }
    /* A literal-looking value that is not UTF-8 does not slip through the fast paths. */
    assert_null(matcher_new(MATCHER_RE, "x", "ab\xff", err, sizeof(err)));
    assert_non_null(strstr(err, "error parsing regexp: invalid UTF-8"));
}

/* Issue #16: a pattern a backtracking engine gives up on must still give the right answer. */
static void test_pathological_regex(void **state)
{
    char err[256];
    char *s = malloc(5001);
    assert_non_null(s);
    memset(s, 'a', 5000);
    s[5000] = 0;
    matcher_t *re = matcher_new(MATCHER_RE, "v", "(a+)+b|a*", err, sizeof(err));
    matcher_t *nre = matcher_new(MATCHER_NRE, "v", "(a+)+b|a*", err, sizeof(err));
    matcher_t *nob = matcher_new(MATCHER_RE, "v", "(a+)+b", err, sizeof(err));
    assert_non_null(re);
    assert_non_null(nre);
    assert_non_null(nob);
    assert_true(matcher_matches(re, s, 5000));
    assert_false(matcher_matches(nre, s, 5000));
    assert_false(matcher_matches(nob, s, 5000));
    s[4999] = 'b';
    assert_true(matcher_matches(nob, s, 5000));
    matcher_free(re);
    matcher_free(nre);
    matcher_free(nob);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equality),   cmocka_unit_test(test_anchoring),
        cmocka_unit_test(test_fast_paths), cmocka_unit_test(test_empty_match_flags),
        cmocka_unit_test(test_bad_regex),  cmocka_unit_test(test_pathological_regex),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
