/* Unit tests for internal/expfmt/proto_parse.c: delimited MetricFamily bodies built with protobuf-c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal/proto/metrics.pb-c.h"
#include "internal/expfmt/proto_parse.h"

typedef Io__Prometheus__Client__MetricFamily mf_t;
typedef Io__Prometheus__Client__Metric m_t;
typedef Io__Prometheus__Client__LabelPair lp_t;

static arena_t *A;
static char ERR[512];

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

/* Appends mf as a delimited record to body at *off. */
static void put(uint8_t *body, size_t cap, size_t *off, const mf_t *mf)
{
    size_t n = io__prometheus__client__metric_family__get_packed_size(mf);
    uint8_t *tmp = malloc(n ? n : 1);
    io__prometheus__client__metric_family__pack(mf, tmp);
    size_t w = expfmt_proto_put_delimited(body + *off, cap - *off, tmp, n);
    assert_true(w > n);
    *off += w;
    free(tmp);
}

static int parse(const uint8_t *body, size_t len, expfmt_result_t *r)
{
    arena_reset(A);
    /* a private copy of exactly len bytes, so ASan sees any read past the end */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, body, len);
    int rc = expfmt_parse_proto(copy, len, NULL, A, r, ERR, sizeof(ERR));
    free(copy);
    return rc;
}

static const char *lab(const expfmt_sample_t *s, const char *name)
{
    for (uint32_t i = 0; i < s->nlabels; i++)
        if (strcmp(s->labels[i].name, name) == 0)
            return s->labels[i].value;
    return NULL;
}

/* A body with a gauge family (2 metrics), a summary and a histogram. */
static size_t build_body(uint8_t *body, size_t cap)
{
    size_t off = 0;
    lp_t l1 = IO__PROMETHEUS__CLIENT__LABEL_PAIR__INIT, l2 = IO__PROMETHEUS__CLIENT__LABEL_PAIR__INIT;
    l1.name = "host", l1.value = "h1";
    l2.name = "host", l2.value = "h2";
    lp_t *ls1[] = {&l1}, *ls2[] = {&l2};

    Io__Prometheus__Client__Gauge g1 = IO__PROMETHEUS__CLIENT__GAUGE__INIT, g2 = IO__PROMETHEUS__CLIENT__GAUGE__INIT;
    g1.has_value = 1, g1.value = 1.5;
    g2.has_value = 1, g2.value = NAN;
    m_t m1 = IO__PROMETHEUS__CLIENT__METRIC__INIT, m2 = IO__PROMETHEUS__CLIENT__METRIC__INIT;
    m1.n_label = 1, m1.label = ls1, m1.gauge = &g1;
    m2.n_label = 1, m2.label = ls2, m2.gauge = &g2, m2.has_timestamp_ms = 1, m2.timestamp_ms = 1234;
    m_t *ms[] = {&m1, &m2};
    mf_t g = IO__PROMETHEUS__CLIENT__METRIC_FAMILY__INIT;
    g.name = "temp", g.help = "Temperature", g.has_type = 1, g.type = IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE;
    g.n_metric = 2, g.metric = ms;
    put(body, cap, &off, &g);

    Io__Prometheus__Client__Quantile q1 = IO__PROMETHEUS__CLIENT__QUANTILE__INIT,
                                     q2 = IO__PROMETHEUS__CLIENT__QUANTILE__INIT;
    q1.has_quantile = 1, q1.quantile = 0.5, q1.has_value = 1, q1.value = 10;
    q2.has_quantile = 1, q2.quantile = 0.999, q2.has_value = 1, q2.value = 20;
    Io__Prometheus__Client__Quantile *qs[] = {&q1, &q2};
    Io__Prometheus__Client__Summary su = IO__PROMETHEUS__CLIENT__SUMMARY__INIT;
    su.n_quantile = 2, su.quantile = qs, su.has_sample_count = 1, su.sample_count = 7; /* no sum, like Flink */
    m_t m3 = IO__PROMETHEUS__CLIENT__METRIC__INIT;
    m3.n_label = 1, m3.label = ls1, m3.summary = &su;
    m_t *ms3[] = {&m3};
    mf_t s = IO__PROMETHEUS__CLIENT__METRIC_FAMILY__INIT;
    s.name = "lat", s.has_type = 1, s.type = IO__PROMETHEUS__CLIENT__METRIC_TYPE__SUMMARY;
    s.n_metric = 1, s.metric = ms3;
    put(body, cap, &off, &s);

    Io__Prometheus__Client__Bucket b1 = IO__PROMETHEUS__CLIENT__BUCKET__INIT, b2 = IO__PROMETHEUS__CLIENT__BUCKET__INIT;
    b1.has_upper_bound = 1, b1.upper_bound = 0.25, b1.has_cumulative_count = 1, b1.cumulative_count = 3;
    b2.has_upper_bound = 1, b2.upper_bound = INFINITY, b2.has_cumulative_count = 1, b2.cumulative_count = 5;
    Io__Prometheus__Client__Bucket *bs[] = {&b1, &b2};
    Io__Prometheus__Client__Histogram hi = IO__PROMETHEUS__CLIENT__HISTOGRAM__INIT;
    hi.n_bucket = 2, hi.bucket = bs, hi.has_sample_count = 1, hi.sample_count = 5, hi.has_sample_sum = 1,
    hi.sample_sum = 2.5;
    m_t m4 = IO__PROMETHEUS__CLIENT__METRIC__INIT;
    m4.histogram = &hi;
    m_t *ms4[] = {&m4};
    mf_t h = IO__PROMETHEUS__CLIENT__METRIC_FAMILY__INIT;
    h.name = "req", h.has_type = 1, h.type = IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM;
    h.n_metric = 1, h.metric = ms4;
    put(body, cap, &off, &h);
    return off;
}

static void test_roundtrip(void **state)
{
    uint8_t body[4096];
    size_t n = build_body(body, sizeof(body));
    expfmt_result_t r;
    assert_int_equal(parse(body, n, &r), 0);
    assert_int_equal(r.nfamilies, 3);
    assert_int_equal(r.nsamples, 2 + 3 + 4);
    const expfmt_family_t *g = &r.families[0];
    assert_string_equal(g->name, "temp");
    assert_string_equal(g->help, "Temperature");
    assert_int_equal(g->type, EXPFMT_GAUGE);
    assert_true(g->samples[0].value == 1.5);
    assert_string_equal(lab(&g->samples[0], "host"), "h1");
    assert_false(g->samples[0].has_timestamp);
    assert_true(isnan(g->samples[1].value));
    assert_true(g->samples[1].has_timestamp);
    assert_int_equal(g->samples[1].timestamp_ms, 1234);
    const expfmt_family_t *s = &r.families[1];
    assert_null(s->help);
    assert_int_equal(s->nsamples, 3);
    assert_string_equal(s->samples[0].name, "lat");
    assert_string_equal(lab(&s->samples[0], "quantile"), "0.5");
    assert_string_equal(lab(&s->samples[1], "quantile"), "0.999");
    assert_string_equal(lab(&s->samples[1], "host"), "h1");
    assert_int_equal(s->samples[2].kind, EXPFMT_KIND_COUNT);
    assert_string_equal(s->samples[2].name, "lat_count");
    assert_true(s->samples[2].value == 7);
    const expfmt_family_t *h = &r.families[2];
    assert_int_equal(h->nsamples, 4);
    assert_string_equal(h->samples[0].name, "req_bucket");
    assert_string_equal(lab(&h->samples[0], "le"), "0.25");
    assert_string_equal(lab(&h->samples[1], "le"), "+Inf");
    assert_string_equal(h->samples[2].name, "req_sum");
    assert_string_equal(h->samples[3].name, "req_count");
    assert_true(h->samples[3].value == 5);
}

static void test_empty_and_replace(void **state)
{
    expfmt_result_t r;
    assert_int_equal(parse((const uint8_t *)"", 0, &r), 0);
    assert_int_equal(r.nfamilies, 0);
    /* an empty MetricFamily record (length 0) is fine and dropped */
    assert_int_equal(parse((const uint8_t *)"\x00", 1, &r), 0);
    assert_int_equal(r.nfamilies, 0);
    /* the same family twice: the later record wins (the Pushgateway keys families by name) */
    uint8_t body[4096];
    size_t n = build_body(body, sizeof(body));
    size_t n2 = build_body(body + n, sizeof(body) - n);
    /* hand-made record: temp as untyped with one metric */
    static const uint8_t rec[] = {0x0a, 0x04, 't', 'e', 'm', 'p', 0x18, 0x03, 0x22, 0x0b, 0x2a,
                                  0x09, 0x09, 0,   0,   0,   0,   0,    0,    0xf0, 0x3f};
    size_t n3 = expfmt_proto_put_delimited(body + n + n2, sizeof(body) - n - n2, rec, sizeof(rec));
    assert_int_equal(parse(body, n + n2 + n3, &r), 0);
    assert_int_equal(r.nfamilies, 3);
    assert_string_equal(r.families[0].name, "temp");
    assert_int_equal(r.families[0].type, EXPFMT_UNTYPED);
    assert_int_equal(r.families[0].nsamples, 1);
    assert_true(r.families[0].samples[0].value == 1.0);
}

static void test_truncation(void **state)
{
    uint8_t body[4096];
    size_t n = build_body(body, sizeof(body));
    expfmt_result_t r;
    /* every strict prefix that is not a record boundary is an error, never a crash */
    size_t boundaries = 0;
    for (size_t k = 0; k < n; k++) {
        int rc = parse(body, k, &r);
        if (rc == 0)
            boundaries++;
        else
            assert_int_equal(rc, EXPFMT_EPARSE);
    }
    assert_int_equal(boundaries, 3); /* 0, after record 1, after record 2 */

    /* a length varint running past the end */
    assert_int_equal(parse((const uint8_t *)"\x85", 1, &r), EXPFMT_EPARSE);
    assert_non_null(strstr(ERR, "unexpected EOF"));
    /* a length with no record after it */
    assert_int_equal(parse((const uint8_t *)"\x05", 1, &r), EXPFMT_EPARSE);
    /* a length beyond the body */
    static const uint8_t longer[] = {0x13, 0x0a, 0x01, 0x61, 0x18, 0x01, 0x22, 0x0b, 0x12, 0x09,
                                     0x09, 0,    0,    0,    0,    0,    0,    0xf0, 0x3f};
    assert_int_equal(parse(longer, sizeof(longer), &r), EXPFMT_EPARSE);
    assert_non_null(strstr(ERR, "unexpected EOF"));
    /* the same record with the right length parses */
    uint8_t fixed[sizeof(longer)];
    memcpy(fixed, longer, sizeof(longer));
    fixed[0] = 0x12;
    assert_int_equal(parse(fixed, sizeof(fixed), &r), 0);
    assert_int_equal(r.nsamples, 1);
    /* a huge length */
    assert_int_equal(parse((const uint8_t *)"\xff\xff\xff\xff\x0f\x0a", 6, &r), EXPFMT_EPARSE);
    /* a varint longer than 5 bytes */
    assert_int_equal(parse((const uint8_t *)"\xff\xff\xff\xff\xff\x01", 6, &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "invalid varint32 encountered");
    /* a record that is not a MetricFamily (field 4 claims more bytes than the record has) */
    assert_int_equal(parse((const uint8_t *)"\x03\x22\x05\x00", 4, &r), EXPFMT_EPARSE);
}

static void test_validation(void **state)
{
    expfmt_result_t r;
    /* gauge "a" with label x="\xc3(" (invalid UTF-8), as sent to the real Pushgateway */
    static const uint8_t bad_utf8[] = {0x1b, 0x0a, 0x01, 0x61, 0x18, 0x01, 0x22, 0x14, 0x0a, 0x07,
                                       0x0a, 0x01, 0x78, 0x12, 0x02, 0xc3, 0x28, 0x12, 0x09, 0x09,
                                       0,    0,    0,    0,    0,    0,    0xf0, 0x3f};
    assert_int_equal(parse(bad_utf8, sizeof(bad_utf8), &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "collected metric \"a\" has a label named \"x\" whose value is not utf8: \"\\xc3(\"");

    lp_t l1 = IO__PROMETHEUS__CLIENT__LABEL_PAIR__INIT, l2 = IO__PROMETHEUS__CLIENT__LABEL_PAIR__INIT;
    lp_t *ls[] = {&l1, &l2};
    Io__Prometheus__Client__Counter c = IO__PROMETHEUS__CLIENT__COUNTER__INIT;
    c.has_value = 1, c.value = 3;
    m_t m = IO__PROMETHEUS__CLIENT__METRIC__INIT;
    m.n_label = 2, m.label = ls, m.counter = &c;
    m_t *ms[] = {&m};
    mf_t f = IO__PROMETHEUS__CLIENT__METRIC_FAMILY__INIT;
    f.name = "cnt", f.has_type = 1, f.type = IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER;
    f.n_metric = 1, f.metric = ms;
    uint8_t body[1024];
    size_t off;

    l1.name = "a", l1.value = "1", l2.name = "a", l2.value = "2";
    off = 0, put(body, sizeof(body), &off, &f);
    assert_int_equal(parse(body, off, &r), EXPFMT_EPARSE);
    assert_non_null(strstr(ERR, "two or more labels with the same name: a"));

    l2.name = "1bad";
    off = 0, put(body, sizeof(body), &off, &f);
    assert_int_equal(parse(body, off, &r), EXPFMT_EPARSE);
    assert_non_null(strstr(ERR, "invalid name: 1bad"));

    l2.name = "b";
    f.name = "bad-name";
    off = 0, put(body, sizeof(body), &off, &f);
    assert_int_equal(parse(body, off, &r), EXPFMT_EPARSE);
    assert_non_null(strstr(ERR, "not a valid metric name"));

    f.name = "cnt";
    f.type = IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE; /* but the metric carries a counter */
    off = 0, put(body, sizeof(body), &off, &f);
    assert_int_equal(parse(body, off, &r), EXPFMT_EPARSE);
    assert_string_equal(ERR, "collected metric \"cnt\" is not a gauge");

    f.type = IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER;
    off = 0, put(body, sizeof(body), &off, &f);
    assert_int_equal(parse(body, off, &r), 0);
    assert_int_equal(r.families[0].samples[0].nlabels, 2);

    /* limits */
    expfmt_limits_t lim = {.max_labels = 1};
    arena_reset(A);
    assert_int_equal(expfmt_parse_proto(body, off, &lim, A, &r, ERR, sizeof(ERR)), EXPFMT_ELIMIT);
    lim = (expfmt_limits_t){.max_samples = 1};
    uint8_t two[2048];
    memcpy(two, body, off);
    memcpy(two + off, body, off);
    f.name = "cnt2";
    size_t off2 = 2 * off;
    off2 = off, put(two, sizeof(two), &off2, &f);
    arena_reset(A);
    assert_int_equal(expfmt_parse_proto(two, off2, &lim, A, &r, ERR, sizeof(ERR)), EXPFMT_ELIMIT);
    /* an arena limit bounds what protobuf-c may allocate */
    arena_t *small = arena_create(512);
    assert_true(expfmt_parse_proto(two, off2, NULL, small, &r, ERR, sizeof(ERR)) < 0);
    arena_destroy(small);
}

static void test_fuzz(void **state)
{
    uint8_t seed[4096], buf[4200];
    size_t n = build_body(seed, sizeof(seed));
    uint64_t x = 0x2545f4914f6cdd1dULL;
    size_t ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, seed, n);
        size_t len = n;
        int muts = 1 + (int)(x % 3);
        for (int m = 0; m < muts; m++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t pos = (size_t)(x % len);
            switch ((x >> 24) % 4) {
            case 0: buf[pos] = (uint8_t)(x >> 40); break;
            case 1: buf[pos] ^= (uint8_t)(1u << ((x >> 40) % 8)); break;
            case 2: len = pos + 1; break;
            default:
                if (len < sizeof(buf)) {
                    memmove(buf + pos + 1, buf + pos, len - pos);
                    buf[pos] = (uint8_t)(x >> 48);
                    len++;
                }
            }
        }
        expfmt_result_t r;
        int rc = parse(buf, len, &r);
        if (rc == 0) {
            ok++;
            size_t total = 0;
            for (size_t f = 0; f < r.nfamilies; f++) {
                assert_non_null(r.families[f].name);
                for (size_t i = 0; i < r.families[f].nsamples; i++)
                    assert_non_null(r.families[f].samples[i].name);
                total += r.families[f].nsamples;
            }
            assert_int_equal(total, r.nsamples);
        } else {
            bad++;
            assert_true(rc == EXPFMT_EPARSE || rc == EXPFMT_ELIMIT);
            assert_true(ERR[0] != 0);
        }
    }
    assert_true(ok > 100);
    assert_true(bad > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),  cmocka_unit_test(test_empty_and_replace),
        cmocka_unit_test(test_truncation), cmocka_unit_test(test_validation),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
