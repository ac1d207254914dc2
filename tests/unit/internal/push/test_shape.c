/* Unit tests for internal/push/shape.c: which bodies repeat a shape (only values changed) and
 * which do not (a series added, removed, renamed, a type changed, lines reordered, timestamps,
 * exemplars, bad values, another format), and that the values come back in parsed order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal/expfmt/text_parse.h"
#include "internal/push/shape.h"

/* Builds the shape of body (text 0.0.4 unless fmt says otherwise). */
static push_shape_t *shape_of(const char *body, expfmt_format_t fmt)
{
    arena_t *a = arena_create(0);
    char *b = arena_strdup(a, body);
    expfmt_result_t r;
    char err[256];
    assert_int_equal(
        expfmt_parse_text_spans(b, strlen(b), fmt == EXPFMT_FORMAT_OPENMETRICS, NULL, a, &r, err, sizeof(err)), 0);
    push_shape_t *s = push_shape_build(body, strlen(body), fmt, &r);
    arena_destroy(a);
    return s;
}

/* The values a full parse gives, in parsed order. */
static size_t parse_values(const char *body, expfmt_format_t fmt, double *out)
{
    arena_t *a = arena_create(0);
    char *b = arena_strdup(a, body);
    expfmt_result_t r;
    char err[256];
    assert_int_equal(expfmt_parse_text(b, strlen(b), fmt == EXPFMT_FORMAT_OPENMETRICS, NULL, a, &r, err, sizeof(err)),
                     0);
    size_t k = 0;
    for (size_t i = 0; i < r.nfamilies; i++)
        for (size_t j = 0; j < r.families[i].nsamples; j++)
            out[k++] = r.families[i].samples[j].value;
    arena_destroy(a);
    return k;
}

static bool matches(const push_shape_t *s, const char *body, double *v)
{
    return push_shape_match(s, body, strlen(body), EXPFMT_FORMAT_TEXT, v);
}

static const char *B1 = "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
                        "s{quantile=\"0.5\"} 3\ns_count 4\n";

static void test_same_shape_reads_values(void **state)
{
    push_shape_t *s = shape_of(B1, EXPFMT_FORMAT_TEXT);
    assert_non_null(s);
    assert_int_equal(push_shape_nvalues(s), 4);
    const char *b2 = "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 10.5\nrec{t=\"b\"} -2e3\n\n# TYPE s summary\n"
                     "s{quantile=\"0.5\"} NaN\ns_count 4.9\n";
    double v[4], want[4];
    assert_true(matches(s, b2, v));
    assert_int_equal(parse_values(b2, EXPFMT_FORMAT_TEXT, want), 4);
    assert_true(v[0] == want[0] && v[1] == want[1] && isnan(v[2]));
    assert_true(v[3] == 4.9);       /* raw: truncating counts is the registry's job */
    assert_true(matches(s, B1, v)); /* the same body again */
    push_shape_free(s);
}

static void test_changed_bodies_miss(void **state)
{
    push_shape_t *s = shape_of(B1, EXPFMT_FORMAT_TEXT);
    double v[8];
    static const char *miss[] = {
        /* a series added */
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\nrec{t=\"c\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        /* a series removed */
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\n\n# TYPE s summary\ns{quantile=\"0.5\"} 3\ns_count 4\n",
        /* a label value renamed (same length) */
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"x\"} 1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        /* a type changed */
        "# HELP rec records\n# TYPE rec counter\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        /* two lines swapped */
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"b\"} 2\nrec{t=\"a\"} 1\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        /* a help text changed, a comment added, the blank line dropped */
        "# HELP rec Records\n# TYPE rec gauge\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n# more\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        /* a timestamp, a trailing blank, a value that is no float, "\r", an empty value */
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1 1700000000000\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1 \nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} abc\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\r\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} \nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        /* blanks before a value changed; the final newline missing; cut short; empty */
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"}  1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4\n",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\nrec{t=\"b\"} 2\n\n# TYPE s summary\n"
        "s{quantile=\"0.5\"} 3\ns_count 4",
        "# HELP rec records\n# TYPE rec gauge\nrec{t=\"a\"} 1\n",
        "",
    };
    for (size_t i = 0; i < sizeof(miss) / sizeof(miss[0]); i++)
        if (matches(s, miss[i], v))
            fail_msg("body %zu matched the shape", i);
    /* The same bytes as OpenMetrics are another parse. */
    assert_false(push_shape_match(s, B1, strlen(B1), EXPFMT_FORMAT_OPENMETRICS, v));
    push_shape_free(s);
}

/* One hash covers every piece: a change of the same length in the first, a middle or the last
 * piece (what follows the last sample) is a miss; an unchanged body with new values matches. */
static void test_one_hash_covers_every_piece(void **state)
{
    const char *base = "# HELP a x\na 1\nb{l=\"v\"} 2\nc 3\n# end\n";
    push_shape_t *s = shape_of(base, EXPFMT_FORMAT_TEXT);
    assert_non_null(s);
    double v[3];
    assert_true(matches(s, "# HELP a x\na 7\nb{l=\"v\"} 8\nc 9\n# end\n", v));
    assert_true(v[0] == 7 && v[1] == 8 && v[2] == 9);
    assert_false(matches(s, "# HELP a y\na 7\nb{l=\"v\"} 8\nc 9\n# end\n", v)); /* first */
    assert_false(matches(s, "# HELP a x\na 7\nb{l=\"w\"} 8\nc 9\n# end\n", v)); /* middle */
    assert_false(matches(s, "# HELP a x\na 7\nb{l=\"v\"} 8\nd 9\n# end\n", v)); /* last sample's */
    assert_false(matches(s, "# HELP a x\na 7\nb{l=\"v\"} 8\nc 9\n# enD\n", v)); /* tail */
    push_shape_free(s);
}

/* A family split over the body (a, b, a) is regrouped by the parser: values come back in the
 * parsed order, not the body's. */
static void test_split_family_order(void **state)
{
    push_shape_t *s = shape_of("a 1\nb 2\na{x=\"y\"} 3\n", EXPFMT_FORMAT_TEXT);
    assert_non_null(s);
    double v[3], want[3];
    const char *b2 = "a 10\nb 20\na{x=\"y\"} 30\n";
    assert_true(matches(s, b2, v));
    parse_values(b2, EXPFMT_FORMAT_TEXT, want);
    assert_memory_equal(v, want, sizeof(v));
    assert_true(v[0] == 10 && v[1] == 30 && v[2] == 20);
    push_shape_free(s);
}

/* Bodies the shape cannot describe: a timestamp or an exemplar after a value, protobuf. */
static void test_unrecognisable_bodies(void **state)
{
    assert_null(shape_of("a 1 1700000000000\n", EXPFMT_FORMAT_TEXT));
    assert_null(shape_of("# TYPE c counter\nc_total 1 # {t=\"x\"} 2\n# EOF\n", EXPFMT_FORMAT_OPENMETRICS));
    arena_t *a = arena_create(0);
    expfmt_result_t r;
    char err[64], *b = arena_strdup(a, "a 1\n");
    assert_int_equal(expfmt_parse_text(b, 4, false, NULL, a, &r, err, sizeof(err)), 0);
    assert_null(r.spans);
    assert_null(push_shape_build("a 1\n", 4, EXPFMT_FORMAT_TEXT, &r)); /* parsed without spans */
    assert_null(push_shape_build("a 1\n", 4, EXPFMT_FORMAT_PROTO_DELIM, &r));
    arena_destroy(a);
}

static void test_openmetrics(void **state)
{
    const char *om = "# TYPE c counter\nc_total{a=\"1\"} 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_count 2.5\n"
                     "h_sum 3\n# EOF\n";
    push_shape_t *s = shape_of(om, EXPFMT_FORMAT_OPENMETRICS);
    assert_non_null(s);
    const char *om2 = "# TYPE c counter\nc_total{a=\"1\"} 7\n# TYPE h histogram\nh_bucket{le=\"1\"} 8\nh_count 9.5\n"
                      "h_sum 10\n# EOF\n";
    double v[4], want[4];
    assert_true(push_shape_match(s, om2, strlen(om2), EXPFMT_FORMAT_OPENMETRICS, v));
    assert_int_equal(parse_values(om2, EXPFMT_FORMAT_OPENMETRICS, want), 4);
    assert_memory_equal(v, want, sizeof(v));
    /* without # EOF it is no longer the same body */
    assert_false(push_shape_match(s, om2, strlen(om2) - 6, EXPFMT_FORMAT_OPENMETRICS, v));
    push_shape_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_shape_reads_values),     cmocka_unit_test(test_changed_bodies_miss),
        cmocka_unit_test(test_one_hash_covers_every_piece), cmocka_unit_test(test_split_family_order),
        cmocka_unit_test(test_unrecognisable_bodies),       cmocka_unit_test(test_openmetrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
