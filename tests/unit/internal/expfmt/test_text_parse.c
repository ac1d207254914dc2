/*
 * Unit tests for internal/expfmt/text_parse.c and family.c.
 *
 * The error-message table was recorded from the real prometheus-pushgateway 1.5.1 (Debian) by
 * PUTting each body and reading the 400 answer; the accept table lists bodies it answered 200
 * (bodies it accepts at parse level but rejects later, e.g. for timestamps, are marked).
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
    A = arena_create(64u << 20);
    return A ? 0 : -1;
}

static int teardown(void **state)
{
    arena_destroy(A);
    return 0;
}

static int parse_lim(const char *body, size_t len, bool om, const expfmt_limits_t *lim, expfmt_result_t *r)
{
    arena_reset(A);
    char *copy = arena_alloc(A, len + 1);
    memcpy(copy, body, len);
    copy[len] = 'X'; /* the parser must never look past len */
    return expfmt_parse_text(copy, len, om, lim, A, r, ERR, sizeof(ERR));
}

static int parse(const char *body, expfmt_result_t *r)
{
    return parse_lim(body, strlen(body), false, NULL, r);
}

static int parse_om(const char *body, expfmt_result_t *r)
{
    return parse_lim(body, strlen(body), true, NULL, r);
}

static const char *lab(const expfmt_sample_t *s, const char *name)
{
    for (uint32_t i = 0; i < s->nlabels; i++)
        if (strcmp(s->labels[i].name, name) == 0)
            return s->labels[i].value;
    return NULL;
}

/* ------------------------------------------------------------------------ basics */

static void test_basic(void **state)
{
    expfmt_result_t r;
    const char *body = "# HELP http_requests_total The total.\n"
                       "# TYPE http_requests_total counter\n"
                       "http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000\n"
                       "http_requests_total{method=\"post\",code=\"400\"}    3\n"
                       "\n"
                       "# a comment\n"
                       "metric_without_labels 12.47\n"
                       "\tsome:metric{ a = \"1\" , b=\"2\", } -Inf\n";
    assert_int_equal(parse(body, &r), 0);
    assert_int_equal(r.nfamilies, 3);
    assert_int_equal(r.nsamples, 4);
    const expfmt_family_t *f = &r.families[0];
    assert_string_equal(f->name, "http_requests_total");
    assert_string_equal(f->help, "The total.");
    assert_int_equal(f->type, EXPFMT_COUNTER);
    assert_int_equal(f->nsamples, 2);
    assert_string_equal(f->samples[0].name, "http_requests_total");
    assert_int_equal(f->samples[0].nlabels, 2);
    assert_string_equal(f->samples[0].labels[0].name, "method");
    assert_string_equal(f->samples[0].labels[0].value, "post");
    assert_string_equal(f->samples[0].labels[1].value, "200");
    assert_true(f->samples[0].value == 1027);
    assert_true(f->samples[0].has_timestamp);
    assert_int_equal(f->samples[0].timestamp_ms, 1395066363000LL);
    assert_false(f->samples[1].has_timestamp);
    assert_true(f->samples[1].value == 3);
    assert_string_equal(r.families[1].name, "metric_without_labels");
    assert_int_equal(r.families[1].type, EXPFMT_UNTYPED);
    assert_null(r.families[1].help);
    assert_true(r.families[1].samples[0].value == 12.47);
    assert_int_equal(r.families[1].samples[0].nlabels, 0);
    const expfmt_sample_t *s = &r.families[2].samples[0];
    assert_string_equal(s->name, "some:metric");
    assert_int_equal(s->nlabels, 2);
    assert_string_equal(lab(s, "b"), "2");
    assert_true(isinf(s->value) && s->value < 0);
}

static void test_empty_bodies(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse("", &r), 0);
    assert_int_equal(r.nfamilies, 0);
    assert_int_equal(parse("\n\n  \t", &r), 0);
    /* Families without samples are dropped, as the Go parser does. */
    assert_int_equal(parse("# HELP a x\n# TYPE a gauge\n", &r), 0);
    assert_int_equal(r.nfamilies, 0);
    assert_int_equal(r.nsamples, 0);
}

/* ------------------------------------------------------------------------ Pushgateway tables */

typedef struct {
    const char *body;
    const char *msg; /* the Pushgateway 1.5.1 400 answer */
} err_case_t;

static const err_case_t pg_errors[] = {
    {"a 1", "text format parsing error in line 1: unexpected end of input stream"},
    {"a 1 \n", "text format parsing error in line 1: expected integer as timestamp, got \"\""},
    {"a 1\t\n", "text format parsing error in line 1: expected integer as timestamp, got \"\""},
    {"a 1\r\n", "text format parsing error in line 1: expected float as value, got \"1\\r\""},
    {"# TYPE a gauge\r\na 1\n", "text format parsing error in line 1: unknown metric type \"gauge\\r\""},
    {"a{x=\"1\",x=\"2\"} 1\n", "text format parsing error in line 1: duplicate label names for metric \"a\""},
    {"a{x=\"\xff\"} 1\n", "text format parsing error in line 1: invalid label value \"\\xff\""},
    {"a 1\n# TYPE a gauge\n",
     "text format parsing error in line 2: second TYPE line for metric name \"a\", or TYPE reported after samples"},
    {"# TYPE a gauge\n# TYPE a gauge\na 1\n",
     "text format parsing error in line 2: second TYPE line for metric name \"a\", or TYPE reported after samples"},
    {"# HELP a x\n# HELP a y\na 1\n", "text format parsing error in line 2: second HELP line for metric name \"a\""},
    {"a abc\n", "text format parsing error in line 1: expected float as value, got \"abc\""},
    {"a 0x1p3\n", "text format parsing error in line 1: expected float as value, got \"0x1p3\""},
    {"a 1_0\n", "text format parsing error in line 1: expected float as value, got \"1_0\""},
    {"a 1e400\n", "text format parsing error in line 1: expected float as value, got \"1e400\""},
    {"a -nan\n", "text format parsing error in line 1: expected float as value, got \"-nan\""},
    {"a 0x10\n", "text format parsing error in line 1: expected float as value, got \"0x10\""},
    {"a 1e\n", "text format parsing error in line 1: expected float as value, got \"1e\""},
    {"a +Infinit\n", "text format parsing error in line 1: expected float as value, got \"+Infinit\""},
    {"a{x=\"a\\qb\"} 1\n", "text format parsing error in line 1: invalid escape sequence '\\q'"},
    {"a{}\n", "text format parsing error in line 1: expected float as value, got \"\""},
    {"# HELP 1a x\n", "text format parsing error in line 1: invalid metric name in comment"},
    {"a{__name__=\"x\"} 1\n", "text format parsing error in line 1: label name \"__name__\" is reserved"},
    {"# TYPE a gauge \n", "text format parsing error in line 1: unknown metric type \"gauge \""},
    {"a 1 123 \n", "text format parsing error in line 1: spurious string after timestamp: \" \""},
    {"a{x=\"1\"\n", "text format parsing error in line 1: unexpected end of label value \"1\""},
    {"a{x=1} 1\n", "text format parsing error in line 1: expected '\"' at start of label value, found '1'"},
    {"a{x=\"a\nb\"} 1\n", "text format parsing error in line 1: label value \"a\" contains unescaped new-line"},
    {"a{1x=\"a\"} 1\n", "text format parsing error in line 1: invalid label name for metric \"a\""},
    {"a{x-y=\"a\"} 1\n", "text format parsing error in line 1: expected '=' after label name, found '-'"},
    {"# TYPE s summary\ns{quantile=\"x\"} 1\n",
     "text format parsing error in line 2: expected float as value for 'quantile' label, got \"x\""},
    {"# TYPE a foo\n", "text format parsing error in line 1: unknown metric type \"foo\""},
    {"# HELP a x\\qy\n", "text format parsing error in line 1: invalid escape sequence '\\q'"},
    {"a{x=\"1\"} 1 12a\n", "text format parsing error in line 1: expected integer as timestamp, got \"12a\""},
    {"a 1 99999999999999999999\n",
     "text format parsing error in line 1: expected integer as timestamp, got \"99999999999999999999\""},
    {"\xef\xbb\xbf"
     "a 1\n",
     "text format parsing error in line 1: invalid metric name"},
    {"a 1 2\\\n", "text format parsing error in line 1: expected integer as timestamp, got \"2\\\\\""},
    {"a 1 2 \\\n", "text format parsing error in line 1: spurious string after timestamp: \" \""},
    {"# TYPE a ga\\ge \n", "text format parsing error in line 1: unknown metric type \"gage \""},
    /* recorded by reasoning from the Go source (same code paths as above) */
    {"a 1\nb 2\nc", "text format parsing error in line 3: unexpected end of input stream"},
    {"# comment without newline", "text format parsing error in line 1: unexpected end of input stream"},
    {"a{x=\"1\"", "text format parsing error in line 1: unexpected end of input stream"},
    {"# TYPE h histogram\nh_bucket{le=\"x\"} 1\n",
     "text format parsing error in line 2: expected float as value for 'le' label, got \"x\""},
    {"# TYPE s summary\n# TYPE s_count gauge\n",
     "text format parsing error in line 2: second TYPE line for metric name \"s\", or TYPE reported after samples"},
};

static const char *const pg_accepts[] = {
    "a 1\n",
    "a{x=\"1\",} 1\n",
    "a 1\nb 2\na{x=\"1\"} 3\n",
    "a 1 123\n", /* parses; the push handler rejects the timestamp */
    "a infinity\n",
    "# TYPE a GAUGE\na 1\n",
    "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_count 2\n",
    "# TYPE s summary\ns 1\n",
    "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_count 2\n",
    "# TYPE h histogram\nh_bucket 1\nh_count 2\n",
    "   a 1\n\n\t\n  ",
    "a{x=\"1\"}1\n",
    "a{ x = \"1\" } 1\n",
    "a{ x = \"1\" , } 1\n",
    "a:b 1\n",
    "#HELP a x\na 1\n",
    "# HELP a\n# HELP a x\na 1\n",
    "# TYPE a\t gauge\n",
    "a +1\n",
    "a .5\n",
    "a 5.\n",
    "a +inf\n",
    "a 1E+3\n",
    "a Infinity\n",
    "a\t1\n",
    "# TYPE s summary\ns{quantile=\"0.5\",quantile=\"0.9\"} 1\n",
    "# TYPE h histogram\nh_bucket{le=\"1\",le=\"2\"} 1\n",
    "# HELP a x\\\\y\\n\na 1\n",
    "# TYPE s summary\n# HELP s_count hh\ns 1\n",
    "a{x=\"1\"}  1\n",
    "a{x=\"1\" } 1\n",
    "a {x=\"1\"} 1\n",
    "# TYPE a gauge_histogram\n", /* accepted: no sample */
    "a -1 -5\n",
    "# TYPE a ga\\uge\na 1\n", /* backslashes vanish from TYPE words */
};

static void test_pushgateway_errors(void **state)
{
    for (size_t i = 0; i < sizeof(pg_errors) / sizeof(pg_errors[0]); i++) {
        expfmt_result_t r;
        int rc = parse(pg_errors[i].body, &r);
        if (rc != EXPFMT_EPARSE || strcmp(ERR, pg_errors[i].msg) != 0)
            fail_msg("case %zu: rc %d\n  got:  %s\n  want: %s", i, rc, ERR, pg_errors[i].msg);
        assert_int_equal(r.nfamilies, 0);
    }
}

static void test_pushgateway_accepts(void **state)
{
    for (size_t i = 0; i < sizeof(pg_accepts) / sizeof(pg_accepts[0]); i++) {
        expfmt_result_t r;
        int rc = parse(pg_accepts[i], &r);
        if (rc != 0)
            fail_msg("case %zu (%s): rc %d: %s", i, pg_accepts[i], rc, ERR);
    }
}

/* ------------------------------------------------------------------------ grammar details */

static void test_escapes(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse("# HELP m a\\\\b\\nc \"q\"\nm{v=\"x\\\\y\\\"z\\nw\",e=\"\"} 1\n", &r), 0);
    assert_string_equal(r.families[0].help, "a\\b\nc \"q\"");
    assert_string_equal(lab(&r.families[0].samples[0], "v"), "x\\y\"z\nw");
    assert_string_equal(lab(&r.families[0].samples[0], "e"), "");
    /* \" is not an escape in 0.0.4 HELP (it is in OpenMetrics) */
    assert_int_equal(parse("# HELP m a\\\"b\nm 1\n", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 1: invalid escape sequence '\\\"'");
}

static void test_values(void **state)
{
    static const struct {
        const char *s;
        double v;
    } ok[] = {{"NaN", NAN},
              {"nan", NAN},
              {"+Inf", INFINITY},
              {"-Inf", -INFINITY},
              {"Inf", INFINITY},
              {"-infinity", -INFINITY},
              {"1", 1},
              {"-0", -0.0},
              {"1.5e3", 1500},
              {"1e-3", 0.001},
              {".5", 0.5},
              {"5.", 5},
              {"0.1", 0.1},
              {"123456789012345678901234567890", 1.2345678901234568e29},
              {"1.2345678901234567e7", 12345678.901234567},
              {"4.9e-324", 4.9e-324},
              {"1e-400", 0},
              {"00012", 12},
              {"1.7976931348623157e308", 1.7976931348623157e308}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        double v;
        if (expfmt__parse_float(ok[i].s, strlen(ok[i].s), &v) != 0)
            fail_msg("%s rejected", ok[i].s);
        if (isnan(ok[i].v))
            assert_true(isnan(v));
        else if (v != ok[i].v || signbit(v) != signbit(ok[i].v))
            fail_msg("%s -> %.17g, want %.17g", ok[i].s, v, ok[i].v);
    }
    static const char *const bad[] = {"",       "+",     "-",    ".",    "e5",   "1e",    "1e+",   "0x1p3",
                                      "0x10",   "1_000", "+nan", "-NaN", "nana", "infin", "1.2.3", "1e400",
                                      "-1e400", " 1",    "1 ",   "1,5",  "Inf1", "1d",    "1f"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double v;
        if (expfmt__parse_float(bad[i], strlen(bad[i]), &v) == 0)
            fail_msg("%s accepted", bad[i]);
    }
    /* the fast path agrees with strtod on short decimals */
    srand(7);
    for (int i = 0; i < 20000; i++) {
        char s[64];
        int k = snprintf(s, sizeof(s), "%d.%0*de%d", rand() % 100000, rand() % 8 + 1, rand() % 1000, rand() % 40 - 20);
        double v;
        assert_int_equal(expfmt__parse_float(s, (size_t)k, &v), 0);
        if (v != strtod(s, NULL))
            fail_msg("%s -> %.17g, strtod %.17g", s, v, strtod(s, NULL));
    }
    int64_t t;
    assert_int_equal(expfmt__parse_int64("9223372036854775807", 19, &t), 0);
    assert_true(t == INT64_MAX);
    assert_int_equal(expfmt__parse_int64("-9223372036854775808", 20, &t), 0);
    assert_true(t == INT64_MIN);
    assert_int_equal(expfmt__parse_int64("9223372036854775808", 19, &t), -1);
    assert_int_equal(expfmt__parse_int64("+12", 3, &t), 0);
    assert_int_equal(t, 12);
    assert_int_equal(expfmt__parse_int64("1_2", 3, &t), -1);
    assert_int_equal(expfmt__parse_int64("1.0", 3, &t), -1);

    expfmt_result_t r;
    assert_int_equal(parse("a NaN\nb +Inf\nc -Inf\n", &r), 0);
    assert_true(isnan(r.families[0].samples[0].value));
    assert_true(isinf(r.families[1].samples[0].value) && r.families[1].samples[0].value > 0);
    assert_true(isinf(r.families[2].samples[0].value) && r.families[2].samples[0].value < 0);
}

static void test_crlf_and_final_newline(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse("a 1\r\n", &r), EXPFMT_EPARSE);
    assert_int_equal(parse("a{b=\"c\"} 1\r\n", &r), EXPFMT_EPARSE);
    /* CR inside a comment or HELP is just text */
    assert_int_equal(parse("# hello\r\n# HELP a x\r\na 1\n", &r), 0);
    assert_string_equal(r.families[0].help, "x\r");
    assert_int_equal(parse("a 1\nb 2", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: unexpected end of input stream");
    assert_int_equal(parse("a 1\nb 2\n", &r), 0);
}

static void test_limits(void **state)
{
    expfmt_result_t r;
    expfmt_limits_t lim = {.max_value_len = 100, .max_labels = 4, .max_name_len = 20, .max_samples = 3};
    size_t n = 200000;
    char *big = malloc(n + 64);
    int k = sprintf(big, "a{x=\"");
    memset(big + k, 'v', n);
    strcpy(big + k + n, "\"} 1\n");
    assert_int_equal(parse_lim(big, strlen(big), false, &lim, &r), EXPFMT_ELIMIT);
    assert_non_null(strstr(ERR, "line 1: label value longer than 100 bytes"));
    /* the default limit (16 KiB) applies when none is given */
    assert_int_equal(parse_lim(big, strlen(big), false, NULL, &r), EXPFMT_ELIMIT);
    /* within a raised limit it parses */
    expfmt_limits_t roomy = {.max_value_len = n};
    assert_int_equal(parse_lim(big, strlen(big), false, &roomy, &r), 0);
    assert_int_equal(strlen(r.families[0].samples[0].labels[0].value), n);
    free(big);

    const char *four_labels = "a{a=\"1\",b=\"1\",c=\"1\",d=\"1\"} 1\n";
    assert_int_equal(parse_lim(four_labels, strlen(four_labels), false, &lim, &r), 0);
    const char *five = "a 1\na{a=\"1\",b=\"1\",c=\"1\",d=\"1\",e=\"1\"} 1\n";
    assert_int_equal(parse_lim(five, strlen(five), false, &lim, &r), EXPFMT_ELIMIT);
    assert_non_null(strstr(ERR, "line 2: more than 4 labels"));
    const char *four = "a 1\nb 1\nc 1\nd 1\n";
    assert_int_equal(parse_lim(four, strlen(four), false, &lim, &r), EXPFMT_ELIMIT);
    assert_non_null(strstr(ERR, "line 4: more than 3 samples"));
    const char *longname = "abcdefghijklmnopqrstuvwxyz 1\n";
    assert_int_equal(parse_lim(longname, strlen(longname), false, &lim, &r), EXPFMT_ELIMIT);

    /* arena limit: a body whose parse needs more than the arena may give */
    arena_t *small = arena_create(4096);
    char body[] = "a 1\nb 2\nc 3\nd 4\ne 5\nf 6\ng 7\nh 8\ni 9\nj 10\nk 11\nl 12\nm 13\nn 14\n"
                  "o 1\np 1\nq 1\nr 1\ns 1\nt 1\nu 1\nv 1\nw 1\nx 1\ny 1\nz 1\naa 1\nab 1\nac 1\n"
                  "ad 1\nae 1\naf 1\nag 1\nah 1\nai 1\naj 1\nak 1\nal 1\nam 1\nan 1\nao 1\nap 1\n";
    int rc = expfmt_parse_text(body, strlen(body), false, NULL, small, &r, ERR, sizeof(ERR));
    assert_int_equal(rc, EXPFMT_ENOMEM);
    arena_destroy(small);
}

static void test_invalid_utf8(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse("a{x=\"ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"} 1\n", &r), 0);
    static const char *const bad[] = {"a{x=\"\xc3\"} 1\n", "a{x=\"\xc0\xaf\"} 1\n", "a{x=\"\xed\xa0\x80\"} 1\n",
                                      "a{x=\"\xf4\x90\x80\x80\"} 1\n", "a{x=\"abcdefgh\x80\"} 1\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse(bad[i], &r), EXPFMT_EPARSE);
        assert_non_null(strstr(ERR, "invalid label value"));
    }
    /* HELP text is not checked by the Go parser */
    assert_int_equal(parse("# HELP a \xff\na 1\n", &r), 0);
}

static void test_duplicate_label_names(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse("a{x=\"1\",y=\"2\",x=\"3\"} 1\n", &r), EXPFMT_EPARSE);
    /* many labels: the hash-set path */
    char body[4096];
    size_t off = (size_t)sprintf(body, "m{");
    for (int i = 0; i < 40; i++)
        off += (size_t)sprintf(body + off, "l%d=\"v\",", i);
    strcpy(body + off, "l7=\"w\"} 1\n");
    assert_int_equal(parse(body, &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 1: duplicate label names for metric \"m\"");
    strcpy(body + off, "l40=\"w\"} 1\nm{l1=\"x\",l2=\"y\"} 2\n");
    assert_int_equal(parse(body, &r), 0);
    assert_int_equal(r.families[0].samples[0].nlabels, 41);
    assert_int_equal(r.families[0].samples[1].nlabels, 2);
    /* quantile twice on a summary: last wins, no error (as in Go) */
    assert_int_equal(parse("# TYPE s summary\ns{quantile=\"0.5\",quantile=\"0.9\"} 1\n", &r), 0);
    assert_string_equal(lab(&r.families[0].samples[0], "quantile"), "0.9");
}

static void test_type_rules(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse("a 1\n# TYPE a gauge\n", &r), EXPFMT_EPARSE);
    /* HELP after samples is fine */
    assert_int_equal(parse("a 1\n# HELP a late\n", &r), 0);
    assert_string_equal(r.families[0].help, "late");
    /* TYPE for another name after samples is fine */
    assert_int_equal(parse("a 1\n# TYPE b gauge\nb 2\n", &r), 0);
    assert_int_equal(r.families[1].type, EXPFMT_GAUGE);
    /* a split family is regrouped, first-appearance order */
    assert_int_equal(parse("a 1\nb 2\na{x=\"1\"} 3\nc 4\nb{y=\"2\"} 5\n", &r), 0);
    assert_int_equal(r.nfamilies, 3);
    assert_string_equal(r.families[0].name, "a");
    assert_int_equal(r.families[0].nsamples, 2);
    assert_true(r.families[0].samples[1].value == 3);
    assert_string_equal(r.families[1].name, "b");
    assert_true(r.families[1].samples[1].value == 5);
    assert_string_equal(r.families[2].name, "c");
    /* gauge_histogram is a valid TYPE word but Pushgateway 1.5 cannot hold a text sample of it */
    assert_int_equal(parse("# TYPE g gauge_histogram\ng 1\n", &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "text format parsing error in line 2: unexpected type for metric name \"g\"");
    /* type words are case-insensitive */
    assert_int_equal(parse("# TYPE a CoUnTeR\na 1\n", &r), 0);
    assert_int_equal(r.families[0].type, EXPFMT_COUNTER);
    /* a name directly followed by its value */
    assert_int_equal(parse("foo+1\nfoo-2\n", &r), 0);
    assert_string_equal(r.families[0].name, "foo");
    assert_string_equal(r.families[0].samples[1].name, "foo");
    assert_true(r.families[0].samples[1].value == -2);
}

static void test_summary_histogram(void **state)
{
    expfmt_result_t r;
    const char *body = "# HELP rpc RPC latency\n"
                       "# TYPE rpc summary\n"
                       "rpc{svc=\"a\",quantile=\"0.50\"} 3\n"
                       "rpc{svc=\"a\",quantile=\"+inf\"} 9\n"
                       "rpc_sum{svc=\"a\"} 10.5\n"
                       "rpc_count{svc=\"a\"} 7.9\n"
                       "rpc{svc=\"a\"} 99\n" /* no quantile: dropped */
                       "# TYPE h histogram\n"
                       "h_bucket{le=\"1.0\"} 2\n"
                       "h{le=\"2e0\"} 3\n" /* a bucket, named h_bucket */
                       "h_bucket{le=\"+Inf\"} 4.5\n"
                       "h_bucket 5\n" /* no le: dropped */
                       "h_sum 8\n"
                       "h_count 4\n"
                       "rpc_count{svc=\"b\"} -1\n";
    assert_int_equal(parse(body, &r), 0);
    assert_int_equal(r.nfamilies, 2);
    const expfmt_family_t *s = &r.families[0];
    assert_int_equal(s->type, EXPFMT_SUMMARY);
    assert_int_equal(s->nsamples, 5);
    assert_string_equal(s->samples[0].name, "rpc");
    assert_int_equal(s->samples[0].kind, EXPFMT_KIND_QUANTILE);
    assert_string_equal(lab(&s->samples[0], "quantile"), "0.5");
    assert_string_equal(lab(&s->samples[0], "svc"), "a");
    assert_string_equal(lab(&s->samples[1], "quantile"), "+Inf");
    assert_string_equal(s->samples[2].name, "rpc_sum");
    assert_int_equal(s->samples[2].kind, EXPFMT_KIND_SUM);
    assert_null(lab(&s->samples[2], "quantile"));
    assert_true(s->samples[2].value == 10.5);
    assert_string_equal(s->samples[3].name, "rpc_count");
    assert_int_equal(s->samples[3].kind, EXPFMT_KIND_COUNT);
    assert_true(s->samples[3].value == 7);                      /* uint64 truncation, as the Pushgateway stores it */
    assert_true(s->samples[4].value == 18446744073709551615.0); /* uint64(-1.0) in Go on amd64 */
    const expfmt_family_t *h = &r.families[1];
    assert_int_equal(h->type, EXPFMT_HISTOGRAM);
    assert_int_equal(h->nsamples, 5);
    assert_string_equal(h->samples[0].name, "h_bucket");
    assert_string_equal(lab(&h->samples[0], "le"), "1");
    assert_string_equal(h->samples[1].name, "h_bucket");
    assert_string_equal(lab(&h->samples[1], "le"), "2");
    assert_string_equal(lab(&h->samples[2], "le"), "+Inf");
    assert_true(h->samples[2].value == 4);
    assert_int_equal(h->samples[3].kind, EXPFMT_KIND_SUM);
    assert_int_equal(h->samples[4].kind, EXPFMT_KIND_COUNT);
    /* a family named like a suffix before the summary exists stays its own family */
    assert_int_equal(parse("x_count 1\n# TYPE x summary\nx_count 2\nx_sum 3\n", &r), 0);
    assert_int_equal(r.nfamilies, 2);
    assert_string_equal(r.families[0].name, "x_count");
    assert_int_equal(r.families[0].nsamples, 2);
    assert_string_equal(r.families[1].name, "x");
    /* le on a non-histogram is an ordinary label */
    assert_int_equal(parse("g{le=\"1.0\"} 1\n", &r), 0);
    assert_string_equal(lab(&r.families[0].samples[0], "le"), "1.0");
    assert_int_equal(r.families[0].samples[0].kind, EXPFMT_KIND_VALUE);
}

static void test_duplicates(void **state)
{
    expfmt_result_t r;
    size_t f, s1, s2;
    assert_int_equal(parse("a{x=\"1\",y=\"2\"} 1\na{x=\"2\"} 1\nb 1\n", &r), 0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, NULL, A, &f, &s1, &s2, ERR, sizeof(ERR)), 0);
    assert_int_equal(parse("a{x=\"1\",y=\"2\"} 1\nb 1\na{y=\"2\",x=\"1\"} 3\n", &r), 0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, NULL, A, &f, &s1, &s2, ERR, sizeof(ERR)), 1);
    assert_int_equal(f, 0);
    assert_int_equal(s1, 0);
    assert_int_equal(s2, 1);
    assert_non_null(strstr(ERR, "was collected before with the same name and label values"));
    /* grouping labels from the path make two samples the same series */
    assert_int_equal(parse("a{job=\"x\"} 1\na{job=\"y\"} 1\n", &r), 0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, NULL, A, &f, &s1, &s2, ERR, sizeof(ERR)), 0);
    const char *ign[] = {"job"};
    assert_int_equal(expfmt_check_duplicates(&r, ign, 1, NULL, A, &f, &s1, &s2, ERR, sizeof(ERR)), 1);
    /* an empty "blank" label is the same as none (instance="" where the push has no instance);
     * an empty value of another label, or a non-empty one, is not */
    assert_int_equal(parse("a 1\na{instance=\"\"} 2\na{x=\"\"} 3\na{instance=\"i\"} 4\n", &r), 0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, NULL, A, &f, &s1, &s2, ERR, sizeof(ERR)), 0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, "instance", A, &f, &s1, &s2, ERR, sizeof(ERR)), 1);
    assert_int_equal(s1, 0);
    assert_int_equal(s2, 1);
    assert_int_equal(parse("a 1\na{x=\"\"} 3\na{instance=\"i\"} 4\n", &r), 0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, "instance", A, &f, &s1, &s2, ERR, sizeof(ERR)), 0);
    /* summary components are different series */
    assert_int_equal(parse("# TYPE s summary\ns{quantile=\"0.5\"} 1\ns{quantile=\"0.9\"} 1\ns_sum 1\ns_count 1\n", &r),
                     0);
    assert_int_equal(expfmt_check_duplicates(&r, NULL, 0, NULL, A, &f, &s1, &s2, ERR, sizeof(ERR)), 0);
}

static void test_quote_and_content_type(void **state)
{
    char q[64];
    expfmt_go_quote(q, sizeof(q), "a\"b\\c\n\r\t\x01\x7f\xff\xc3\xa9", 13);
    assert_string_equal(q, "\"a\\\"b\\\\c\\n\\r\\t\\x01\\x7f\\xff\xc3\xa9\"");
    expfmt__go_quote_rune(q, sizeof(q), '\'');
    assert_string_equal(q, "'\\''");
    expfmt__go_quote_rune(q, sizeof(q), 0);
    assert_string_equal(q, "'\\x00'");
    expfmt__go_quote_rune(q, sizeof(q), 0xff);
    assert_string_equal(q, "'\xc3\xbf'");

    assert_int_equal(expfmt_format_from_content_type(NULL), EXPFMT_FORMAT_TEXT);
    assert_int_equal(expfmt_format_from_content_type("text/plain; version=0.0.4"), EXPFMT_FORMAT_TEXT);
    assert_int_equal(expfmt_format_from_content_type("application/openmetrics-text; version=1.0.0; charset=utf-8"),
                     EXPFMT_FORMAT_OPENMETRICS);
    assert_int_equal(
        expfmt_format_from_content_type(
            "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"),
        EXPFMT_FORMAT_PROTO_DELIM);
    assert_int_equal(
        expfmt_format_from_content_type(
            "Application/Vnd.Google.Protobuf;Encoding=\"delimited\";PROTO=io.prometheus.client.MetricFamily"),
        EXPFMT_FORMAT_PROTO_DELIM);
    assert_int_equal(
        expfmt_format_from_content_type("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily"),
        EXPFMT_FORMAT_TEXT);
    assert_int_equal(
        expfmt_format_from_content_type(
            "application/vnd.google.protobuf; proto=io.prometheus.client.metricfamily; encoding=delimited"),
        EXPFMT_FORMAT_TEXT);
    assert_true(expfmt_go_uint64_trunc(NAN) == 9223372036854775808.0);
    assert_true(expfmt_go_uint64_trunc(2.9) == 2);
    assert_true(expfmt_go_uint64_trunc(1e30) == 9223372036854775808.0);
}

/* ------------------------------------------------------------------------ OpenMetrics */

static void test_openmetrics(void **state)
{
    expfmt_result_t r;
    const char *body = "# TYPE acme_http_router_request_seconds summary\n"
                       "# UNIT acme_http_router_request_seconds seconds\n"
                       "# HELP acme_http_router_request_seconds Latency \\\"quoted\\\".\n"
                       "acme_http_router_request_seconds_sum{path=\"/api/v1\",method=\"GET\"} 9036.32\n"
                       "acme_http_router_request_seconds_count{path=\"/api/v1\",method=\"GET\"} 807283.0\n"
                       "acme_http_router_request_seconds_created{path=\"/api/v1\",method=\"GET\"} 1605281325.0\n"
                       "# TYPE go_goroutines gauge\n"
                       "go_goroutines 69 1605281325.123\n"
                       "# TYPE c counter\n"
                       "c_total{a=\"1\"} 5 # {trace_id=\"abc\"} 1.0 1605281325.0\n"
                       "c_total{a=\"2\"} 6 1605281325 # {} 2\n"
                       "c_created{a=\"1\"} 1605281000\n"
                       "# TYPE i info\n"
                       "i_info{version=\"1.2\"} 1\n"
                       "# TYPE gh gaugehistogram\n"
                       "gh_bucket{le=\"1\"} 2\n"
                       "gh_gcount 2\n"
                       "gh_gsum 1.5\n"
                       "no_type_here 1\n"
                       "# EOF\n";
    assert_int_equal(parse_om(body, &r), 0);
    assert_int_equal(r.nfamilies, 6);
    const expfmt_family_t *f = &r.families[0];
    assert_string_equal(f->unit, "seconds");
    assert_string_equal(f->help, "Latency \"quoted\".");
    assert_int_equal(f->nsamples, 3);
    assert_int_equal(f->samples[2].kind, EXPFMT_KIND_CREATED);
    assert_int_equal(r.families[1].samples[0].timestamp_ms, 1605281325123LL);
    assert_true(r.families[1].samples[0].has_timestamp);
    const expfmt_family_t *c = &r.families[2];
    assert_string_equal(c->name, "c");
    assert_int_equal(c->type, EXPFMT_COUNTER);
    assert_int_equal(c->nsamples, 3);
    assert_string_equal(c->samples[0].name, "c_total");
    assert_int_equal(c->samples[0].nlabels, 1); /* exemplar labels dropped */
    assert_false(c->samples[0].has_timestamp);
    assert_int_equal(c->samples[1].timestamp_ms, 1605281325000LL);
    assert_int_equal(c->samples[2].kind, EXPFMT_KIND_CREATED);
    assert_int_equal(r.families[3].type, EXPFMT_INFO);
    assert_int_equal(r.families[4].type, EXPFMT_GAUGE_HISTOGRAM);
    assert_int_equal(r.families[4].samples[1].kind, EXPFMT_KIND_COUNT);
    assert_int_equal(r.families[5].type, EXPFMT_UNKNOWN);

    assert_int_equal(parse_om("a 1\n# EOF", &r), 0);
    assert_int_equal(parse_om("a 1\n", &r), EXPFMT_EPARSE);
    assert_non_null(strstr(ERR, "# EOF"));
    assert_int_equal(parse_om("a 1\n# EOF\nb 2\n", &r), EXPFMT_EPARSE);
    assert_int_equal(parse_om("# random comment\na 1\n# EOF\n", &r), EXPFMT_EPARSE);
    assert_int_equal(parse_om("# TYPE a untyped\n# EOF\n", &r), EXPFMT_EPARSE);
    assert_int_equal(parse_om("a 1 abc\n# EOF\n", &r), EXPFMT_EPARSE);
    assert_int_equal(parse_om("a 1 # {x=\"1\" 2\n# EOF\n", &r), EXPFMT_EPARSE);
    assert_int_equal(parse_om("# UNIT a s\n# UNIT a s\n# EOF\n", &r), EXPFMT_EPARSE);
}

/* ------------------------------------------------------------------------ Flink fixture */

static void test_flink_body(void **state)
{
    buf_t b1, b2;
    buf_init(&b1);
    buf_init(&b2);
    size_t series = flinkgen_taskmanager(&b1, 3, 42, 1);
    assert_int_equal(flinkgen_taskmanager(&b2, 3, 42, 2), series);
    assert_true(series >= 1000 && series <= 1500);
    expfmt_result_t r1, r2;
    arena_t *a2 = arena_create(0);
    assert_int_equal(expfmt_parse_text(b2.data, b2.len, false, NULL, a2, &r2, ERR, sizeof(ERR)), 0);
    assert_int_equal(parse_lim(b1.data, b1.len, false, NULL, &r1), 0);
    assert_int_equal(r1.nsamples, series);
    size_t summaries = 0, counts = 0, grew = 0;
    for (size_t f = 0; f < r1.nfamilies; f++) {
        const expfmt_family_t *F = &r1.families[f];
        assert_true(F->type == EXPFMT_GAUGE || F->type == EXPFMT_SUMMARY);
        assert_true(strncmp(F->name, "flink_taskmanager_", 18) == 0);
        assert_non_null(F->help);
        assert_non_null(strstr(F->help, " (scope: taskmanager"));
        summaries += F->type == EXPFMT_SUMMARY;
        for (size_t i = 0; i < F->nsamples; i++) {
            const expfmt_sample_t *s = &F->samples[i];
            assert_int_not_equal(s->kind, EXPFMT_KIND_SUM); /* Flink sends no _sum */
            counts += s->kind == EXPFMT_KIND_COUNT;
            assert_false(s->has_timestamp);
            assert_non_null(lab(s, "host"));
            assert_non_null(lab(s, "tm_id"));
            if (strstr(F->name, "_job_task_")) {
                assert_non_null(lab(s, "subtask_index"));
                assert_non_null(lab(s, "task_attempt_num"));
                assert_string_equal(lab(s, "job_name"), "order_enrichment");
            }
            if (strstr(F->name, "_operator_"))
                assert_non_null(lab(s, "operator_name"));
            if (strcmp(F->name, "flink_taskmanager_job_task_operator_numRecordsIn") == 0)
                grew += r2.families[f].samples[i].value > s->value;
        }
    }
    assert_true(summaries >= 3);
    assert_true(counts > 0);
    assert_int_equal(grew, 36); /* 12 subtasks x 3 operators: counters grow between ticks */
    size_t f1, s1, s2;
    assert_int_equal(expfmt_check_duplicates(&r1, NULL, 0, NULL, A, &f1, &s1, &s2, ERR, sizeof(ERR)), 0);
    char job[64];
    flinkgen_job_name(job, sizeof(job), 3, 42);
    assert_int_equal(strlen(job), 8 + 32);
    arena_destroy(a2);
    buf_free(&b1);
    buf_free(&b2);
}

/* ------------------------------------------------------------------------ fuzz */

static const char *const seeds[] = {
    "# HELP a x\\ny\n# TYPE a counter\na{b=\"c\",d=\"e\\\"f\"} 1 123\na{b=\"x\"} +Inf\n",
    "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n# TYPE h histogram\n"
    "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 2\n",
    "a 1\nb{x=\"1\",} 2\na{ y = \"2\" } NaN\n\n# comment\n  c\t-1e3\n",
};

static void test_fuzz(void **state)
{
    const char alphabet[] = "{}\",=\\ \t\n#_:aZ09.e+-le\"quantile\xff\r";
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    size_t parsed = 0, failed = 0;
    char buf[1024];
    for (int it = 0; it < 20000; it++) {
        const char *seed = seeds[it % 3];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        int muts = 1 + (int)(x % 4);
        for (int m = 0; m < muts; m++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t pos = (size_t)(x % (n + 1));
            switch ((x >> 20) % 4) {
            case 0: /* replace */
                if (pos < n)
                    buf[pos] = alphabet[(x >> 32) % (sizeof(alphabet) - 1)];
                break;
            case 1: /* insert */
                if (n + 1 < sizeof(buf)) {
                    memmove(buf + pos + 1, buf + pos, n - pos);
                    buf[pos] = alphabet[(x >> 32) % (sizeof(alphabet) - 1)];
                    n++;
                }
                break;
            case 2: /* delete */
                if (pos < n) {
                    memmove(buf + pos, buf + pos + 1, n - pos - 1);
                    n--;
                }
                break;
            default: /* truncate */ n = pos;
            }
        }
        expfmt_result_t r;
        int rc = parse_lim(buf, n, (it & 7) == 0, NULL, &r);
        if (rc == 0) {
            parsed++;
            size_t total = 0;
            for (size_t f = 0; f < r.nfamilies; f++) {
                assert_non_null(r.families[f].name);
                assert_true(r.families[f].nsamples > 0);
                for (size_t i = 0; i < r.families[f].nsamples; i++) {
                    const expfmt_sample_t *s = &r.families[f].samples[i];
                    assert_non_null(s->name);
                    for (uint32_t l = 0; l < s->nlabels; l++)
                        assert_true(strlen(s->labels[l].name) > 0);
                }
                total += r.families[f].nsamples;
            }
            assert_int_equal(total, r.nsamples);
        } else {
            failed++;
            assert_true(rc == EXPFMT_EPARSE || rc == EXPFMT_ELIMIT);
            assert_true(strncmp(ERR, "text format parsing error in line ", 34) == 0);
            assert_int_equal(r.nfamilies, 0);
        }
    }
    assert_true(parsed > 100);
    assert_true(failed > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_empty_bodies),
        cmocka_unit_test(test_pushgateway_errors),
        cmocka_unit_test(test_pushgateway_accepts),
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_crlf_and_final_newline),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_duplicate_label_names),
        cmocka_unit_test(test_type_rules),
        cmocka_unit_test(test_summary_histogram),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_quote_and_content_type),
        cmocka_unit_test(test_openmetrics),
        cmocka_unit_test(test_flink_body),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
