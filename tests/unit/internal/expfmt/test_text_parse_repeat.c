/*
 * Unit tests for the repeated-label and repeated-name fast paths of internal/expfmt/text_parse.c
 * (read_labels takes a label byte-identical to the previous block's at the same index without
 * re-scanning it; parse_sample compares the name with the previous sample's first): the
 * result must be exactly what the slow path gives, and every error the slow path finds must still
 * be found when a block starts like the previous one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/expfmt/family.h"
#include "internal/expfmt/flinkgen.h"
#include "internal/expfmt/text_parse.h"
#include "internal/util/buf.h"

static arena_t *A;
static char ERR[1024];

static int setup(void **state)
{
    (void)state;
    A = arena_create(256u << 20);
    return A ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    arena_destroy(A);
    return 0;
}

/* Parses a copy of body (the parser writes into its input; the copy lives in the arena). */
static int parse(const char *body, expfmt_result_t *r)
{
    size_t n = strlen(body);
    char *copy = arena_alloc(A, n + 1);
    memcpy(copy, body, n + 1);
    return expfmt_parse_text(copy, n, false, NULL, A, r, ERR, sizeof(ERR));
}

static const expfmt_sample_t *sample(const expfmt_result_t *r, const char *fam, size_t i)
{
    for (size_t f = 0; f < r->nfamilies; f++)
        if (strcmp(r->families[f].name, fam) == 0) {
            assert_true(i < r->families[f].nsamples);
            return &r->families[f].samples[i];
        }
    fail_msg("no family %s", fam);
    return NULL;
}

static void assert_label(const expfmt_sample_t *s, uint32_t i, const char *name, const char *value)
{
    assert_true(i < s->nlabels);
    assert_string_equal(s->labels[i].name, name);
    assert_string_equal(s->labels[i].value, value);
}

static void test_repeated_errors(void **state)
{
    (void)state;
    expfmt_result_t r;
    arena_reset(A);
    /* a repeated first label, then a duplicate of it */
    assert_int_equal(parse("m{a=\"1\",b=\"2\"} 1\nm{a=\"1\",a=\"1\"} 2\n", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: duplicate label names for metric \"m\"");
    /* the whole previous block repeated, then a duplicate of its second label */
    assert_int_equal(parse("m{a=\"1\",b=\"2\"} 1\nm{a=\"1\",b=\"2\",b=\"3\"} 2\n", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: duplicate label names for metric \"m\"");
    /* previous value had an escaped quote: its unescaped bytes must not match a raw quote */
    assert_int_equal(parse("m{a=\"x\\\"y\"} 1\nm{a=\"x\"y\"} 2\n", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: unexpected end of label value \"x\"");
    /* repeated label followed by garbage */
    assert_int_equal(parse("m{a=\"1\"} 1\nm{a=\"1\"x} 2\n", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: unexpected end of label value \"1\"");
    /* repeated label at the end of the body */
    assert_int_equal(parse("m{a=\"1\"} 1\nm{a=\"1\"", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: unexpected end of input stream");
    /* limits still count repeated labels */
    expfmt_limits_t lim = {.max_labels = 2};
    char body[] = "m{a=\"1\",b=\"2\"} 1\nm{a=\"1\",b=\"2\",c=\"3\"} 2\n";
    assert_int_equal(expfmt_parse_text(body, strlen(body), false, &lim, A, &r, ERR, sizeof(ERR)), EXPFMT_ELIMIT);
    assert_string_equal(ERR, "text format parsing error in line 2: more than 2 labels in one sample");
}

static void test_repeated_values(void **state)
{
    (void)state;
    expfmt_result_t r;
    arena_reset(A);
    assert_int_equal(parse("m{a=\"1\",b=\"2\"} 1\n"
                           "m{a=\"1\",b=\"22\"} 2\n"  /* value longer */
                           "m{a=\"1\",bb=\"2\"} 3\n"  /* name longer */
                           "m{a = \"1\",b=\"3\"} 4\n" /* blanks: slow path, same label */
                           "m{a=\"1\",b=\"3\",} 5\n"  /* trailing comma */
                           "m{a=\"1\"} 6\n"           /* fewer labels */
                           "m{a=\"1\",b=\"3\",c=\"\"} 7\n"
                           "m{a=\"x\\\\y\"} 8\n" /* escaped backslash */
                           "m{a=\"x\\\\y\",b=\"1\"} 9\n",
                           &r),
                     0);
    assert_int_equal(r.nsamples, 9);
    const expfmt_sample_t *s = sample(&r, "m", 0);
    assert_int_equal(s->nlabels, 2);
    assert_label(s, 0, "a", "1");
    assert_label(s, 1, "b", "2");
    assert_label(sample(&r, "m", 1), 1, "b", "22");
    assert_label(sample(&r, "m", 2), 1, "bb", "2");
    assert_label(sample(&r, "m", 3), 0, "a", "1");
    assert_label(sample(&r, "m", 3), 1, "b", "3");
    assert_int_equal(sample(&r, "m", 4)->nlabels, 2);
    assert_label(sample(&r, "m", 4), 1, "b", "3");
    assert_int_equal(sample(&r, "m", 5)->nlabels, 1);
    assert_int_equal(sample(&r, "m", 6)->nlabels, 3);
    assert_label(sample(&r, "m", 6), 2, "c", "");
    assert_label(sample(&r, "m", 7), 0, "a", "x\\y");
    assert_label(sample(&r, "m", 8), 0, "a", "x\\y");
    assert_label(sample(&r, "m", 8), 1, "b", "1");
    for (size_t i = 0; i < 9; i++)
        assert_true(sample(&r, "m", i)->value == (double)(i + 1));
}

/* A plain "quantile" label of a gauge, repeated by a summary's sample: there it is the quantile. */
static void test_repeated_special(void **state)
{
    (void)state;
    expfmt_result_t r;
    arena_reset(A);
    assert_int_equal(parse("# TYPE g gauge\ng{quantile=\"0.5\"} 1\n"
                           "# TYPE s summary\ns{quantile=\"0.5\"} 2\ns_count 3\n"
                           "# TYPE h histogram\nh_bucket{a=\"1\",le=\"1\"} 1\nh_bucket{a=\"1\",le=\"+Inf\"} 2\n"
                           "h_count{a=\"1\"} 2\nh_sum{a=\"1\"} 0.5\n",
                           &r),
                     0);
    const expfmt_sample_t *g = sample(&r, "g", 0);
    assert_int_equal(g->kind, EXPFMT_KIND_VALUE);
    assert_label(g, 0, "quantile", "0.5");
    const expfmt_sample_t *q = sample(&r, "s", 0);
    assert_int_equal(q->kind, EXPFMT_KIND_QUANTILE);
    assert_int_equal(q->nlabels, 1);
    assert_label(q, 0, "quantile", "0.5");
    const expfmt_sample_t *b = sample(&r, "h", 1);
    assert_int_equal(b->kind, EXPFMT_KIND_BUCKET);
    assert_label(b, 0, "a", "1");
    assert_label(b, 1, "le", "+Inf");
}

/* The repeated-name fast path (one memcmp against the previous sample's name). */
static void test_repeated_names(void **state)
{
    (void)state;
    expfmt_result_t r;
    arena_reset(A);
    assert_int_equal(parse("mm 1\nm 2\nmm 3\nmmm 4\nm{a=\"1\"} 5\nm+6\nm\t7\nm:x 8\n", &r), 0);
    assert_int_equal(r.nfamilies, 4);
    assert_int_equal(r.nsamples, 8);
    assert_string_equal(r.families[0].name, "mm");
    assert_int_equal(r.families[0].nsamples, 2);
    assert_string_equal(r.families[1].name, "m");
    assert_int_equal(r.families[1].nsamples, 4);
    assert_true(r.families[1].samples[2].value == 6);
    assert_true(r.families[1].samples[3].value == 7);
    assert_string_equal(r.families[2].name, "mmm");
    assert_string_equal(r.families[3].name, "m:x");
    assert_int_equal(parse("m 1\nm", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: unexpected end of input stream");
}

/*
 * Differential: a Flink body parsed as is (consecutive samples share most labels) against the
 * same body with a separator sample between every two lines (so no block repeats its
 * predecessor and every label takes the slow path): same families, samples, labels, values.
 */
static void test_flink_differential(void **state)
{
    (void)state;
    for (unsigned tm = 0; tm < 3; tm++) {
        arena_reset(A);
        buf_t b = BUF_INIT, sep = BUF_INIT;
        buf_init(&b);
        buf_init(&sep);
        flinkgen_taskmanager(&b, tm, 42, 7 + tm);
        for (const char *p = b.data, *e = b.data + b.len; p < e;) {
            const char *nl = memchr(p, '\n', (size_t)(e - p));
            size_t n = nl ? (size_t)(nl - p) + 1 : (size_t)(e - p);
            buf_append(&sep, p, n);
            if (*p != '#')
                buf_puts(&sep, "zz_sep{zz=\"1\"} 0\n");
            p += n;
        }
        expfmt_result_t r1, r2;
        assert_int_equal(parse(b.data, &r1), 0);
        assert_int_equal(parse(sep.data, &r2), 0);
        assert_int_equal(r1.nfamilies + 1, r2.nfamilies);
        size_t f2 = 0;
        for (size_t f = 0; f < r1.nfamilies; f++, f2++) {
            if (strcmp(r2.families[f2].name, "zz_sep") == 0)
                f2++;
            const expfmt_family_t *F1 = &r1.families[f], *F2 = &r2.families[f2];
            assert_string_equal(F1->name, F2->name);
            assert_int_equal(F1->type, F2->type);
            assert_int_equal(F1->nsamples, F2->nsamples);
            for (size_t i = 0; i < F1->nsamples; i++) {
                const expfmt_sample_t *a = &F1->samples[i], *c = &F2->samples[i];
                assert_string_equal(a->name, c->name);
                assert_int_equal(a->kind, c->kind);
                assert_int_equal(a->nlabels, c->nlabels);
                assert_true(a->value == c->value || (isnan(a->value) && isnan(c->value)));
                for (uint32_t k = 0; k < a->nlabels; k++) {
                    assert_string_equal(a->labels[k].name, c->labels[k].name);
                    assert_string_equal(a->labels[k].value, c->labels[k].value);
                }
            }
        }
        buf_free(&b);
        buf_free(&sep);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repeated_errors),    cmocka_unit_test(test_repeated_values),
        cmocka_unit_test(test_repeated_special),   cmocka_unit_test(test_repeated_names),
        cmocka_unit_test(test_flink_differential),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
