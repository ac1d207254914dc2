/* api/federate.c's answer (api_federate_render) over a memory-only store with a fixed clock: the
 * lookback window, staleness markers, the union of several match[], the order of families and
 * labels, external labels, the protobuf bytes, and the series and memory bounds. Prometheus
 * itself is compared in tests/integration/test_federate.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "api/federate.h"
#include "internal/util/arena.h"

#define NOW 1700000300000LL /* ms */
static int64_t clock_fn(void)
{
    return NOW;
}

static storage_t *open_store(void)
{
    storage_options_t o;
    storage_options_default(&o);
    o.rollups = "";
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.snapshot_interval_ms = -1;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    return s;
}

/* Appends one sample; labels as "name", "value" pairs ending in NULL. */
static void put(storage_t *s, int64_t t, double v, ...)
{
    label_t l[8];
    size_t n = 0;
    va_list ap;
    va_start(ap, v);
    const char *name;
    while ((name = va_arg(ap, const char *)) != NULL) {
        assert_true(n < 8);
        l[n].name = name;
        l[n].value = va_arg(ap, const char *);
        n++;
    }
    va_end(ap);
    storage_sample_t smp = {.labels = {l, n}, .t = t, .v = v};
    storage_append_result_t r;
    assert_int_equal(storage_append(s, &smp, 1, &r), 0);
}

static double stale_nan(void)
{
    uint64_t b = 0x7ff0000000000002ULL;
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

static api_federate_t *fed(storage_t *s, int64_t max_series, size_t max_memory, arena_budget_t *budget, const char *ext)
{
    api_federate_options_t o = {.storage = s,
                                .max_series = max_series,
                                .max_memory = max_memory,
                                .budget = budget,
                                .external_labels = ext,
                                .threads = 1};
    char err[256];
    api_federate_t *f = api_federate_new(&o, err, sizeof(err));
    assert_non_null(f);
    return f;
}

/* The answer as a string (static buffer) and its status. */
static int render(api_federate_t *f, const char *const *m, size_t n, bool proto, char **body)
{
    static buf_t out;
    buf_free(&out);
    out = BUF_INIT;
    char err[512] = "";
    int code = api_federate_render(f, m, n, NOW, proto, &out, err, sizeof(err));
    buf_putc(&out, 0);
    if (code != 200) {
        buf_reset(&out);
        buf_puts(&out, err);
    }
    *body = out.data;
    return code;
}

static void test_window_staleness_and_format(void **st)
{
    (void)st;
    storage_t *s = open_store();
    /* the newest sample inside [now-5m, now] wins */
    put(s, NOW - 20000, 1.5, "__name__", "zeta", "instance", "i1", "job", "j", NULL);
    put(s, NOW - 10000, 2.5, "__name__", "zeta", "instance", "i1", "job", "j", NULL);
    put(s, NOW - 300000, 7, "__name__", "edge", "job", "j", NULL);  /* exactly the lookback: kept */
    put(s, NOW - 300001, 8, "__name__", "older", "job", "j", NULL); /* just outside */
    put(s, NOW - 20000, 5, "__name__", "gone", "job", "j", NULL);
    put(s, NOW - 10000, stale_nan(), "__name__", "gone", "job", "j", NULL); /* ends in a marker: left out */
    put(s, NOW - 1000, 1e21, "__name__", "alpha", "job", "j", NULL);
    put(s, NOW - 1000, -INFINITY, "__name__", "alpha", "Zed", "1", NULL);      /* Z sorts before __name__ */
    put(s, NOW - 1000, 0.1, "__name__", "alpha", "a", "x\"y\\z\nw", NULL);     /* escaped */
    put(s, NOW - 1000, 3, "__name__", "alpha", "empty", "", "job", "k", NULL); /* empty values are no labels */
    api_federate_t *f = fed(s, 0, 0, NULL, NULL);
    char *body;
    const char *all[] = {"{__name__=~\".+\"}"};
    assert_int_equal(render(f, all, 1, false, &body), 200);
    assert_string_equal(body, "# TYPE alpha untyped\n"
                              "alpha{Zed=\"1\",instance=\"\"} -Inf 1700000299000\n"
                              "alpha{a=\"x\\\"y\\\\z\\nw\",instance=\"\"} 0.1 1700000299000\n"
                              "alpha{job=\"j\",instance=\"\"} 1e+21 1700000299000\n"
                              "alpha{job=\"k\",instance=\"\"} 3 1700000299000\n"
                              "# TYPE edge untyped\n"
                              "edge{job=\"j\",instance=\"\"} 7 1700000000000\n"
                              "# TYPE zeta untyped\n"
                              "zeta{instance=\"i1\",job=\"j\"} 2.5 1700000290000\n");
    /* the union of several match[]: each series once, families still in name order */
    const char *u[] = {"zeta", "{job=\"j\"}", "alpha{job=\"j\"}", "{}"};
    assert_int_equal(render(f, u, 4, false, &body), 200);
    assert_string_equal(body, "# TYPE alpha untyped\n"
                              "alpha{job=\"j\",instance=\"\"} 1e+21 1700000299000\n"
                              "# TYPE edge untyped\n"
                              "edge{job=\"j\",instance=\"\"} 7 1700000000000\n"
                              "# TYPE zeta untyped\n"
                              "zeta{instance=\"i1\",job=\"j\"} 2.5 1700000290000\n");
    /* nothing selected, a matcher-less selector: an empty body */
    const char *none[] = {"nothing", "{}"};
    assert_int_equal(render(f, none, 2, false, &body), 200);
    assert_string_equal(body, "");
    /* a bad selector: 400 with the parser's message */
    const char *bad[] = {"zeta", "zeta[5m]"};
    assert_int_equal(render(f, bad, 2, false, &body), 400);
    assert_string_equal(body, "1:5: parse error: unexpected \"[\"");
    api_federate_free(f);
    storage_close(s);
}

static void test_protobuf(void **st)
{
    (void)st;
    storage_t *s = open_store();
    put(s, NOW - 1000, 2.5, "__name__", "zeta", "job", "j", NULL);
    api_federate_t *f = fed(s, 0, 0, NULL, NULL);
    const char *m[] = {"zeta"};
    buf_t out = BUF_INIT;
    char err[256];
    assert_int_equal(api_federate_render(f, m, 1, NOW, true, &out, err, sizeof(err)), 200);
    /* len, MetricFamily{name "zeta", type UNTYPED, metric {label job=j, label instance="",
     * untyped {2.5}, timestamp_ms}} */
    static const unsigned char want[] = {
        0x34, 0x0a, 0x04, 'z',  'e',  't',  'a',  0x18, 0x03, 0x22, 0x2a,       /* len, name, type, metric */
        0x0a, 0x08, 0x0a, 0x03, 'j',  'o',  'b',  0x12, 0x01, 'j',              /* job="j" */
        0x0a, 0x0c, 0x0a, 0x08, 'i',  'n',  's',  't',  'a',  'n',  'c',  'e',  /* instance="" */
        0x12, 0x00, 0x2a, 0x09, 0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, /* untyped 2.5 */
        0x40, 0x30, 0xf8, 0xef, 0xa7, 0xff, 0xbc, 0x31,                         /* timestamp_ms */
    };
    assert_int_equal(out.len, sizeof(want));
    assert_memory_equal(out.data, want, sizeof(want));
    buf_free(&out);
    api_federate_free(f);
    storage_close(s);
}

static void test_external_labels(void **st)
{
    (void)st;
    storage_t *s = open_store();
    put(s, NOW - 1000, 1, "__name__", "x", "job", "a", NULL);
    put(s, NOW - 1000, 2, "__name__", "x", "instance", "h:1", "job", "b", "region", "us", NULL);
    api_federate_t *f = fed(s, 0, 0, NULL, "region=eu\ninstance=\"sluice-1\"");
    char *body;
    const char *m[] = {"x"};
    assert_int_equal(render(f, m, 1, false, &body), 200);
    assert_string_equal(body, "# TYPE x untyped\n"
                              "x{instance=\"h:1\",job=\"b\",region=\"us\"} 2 1700000299000\n"
                              "x{job=\"a\",instance=\"sluice-1\",region=\"eu\"} 1 1700000299000\n");
    api_federate_free(f);
    api_federate_options_t o = {.storage = s, .external_labels = "0bad=x"};
    char err[256];
    assert_null(api_federate_new(&o, err, sizeof(err)));
    assert_non_null(strstr(err, "--external-label"));
    storage_close(s);
}

static void test_bounds(void **st)
{
    (void)st;
    storage_t *s = open_store();
    char v[16], pad[201];
    memset(pad, 'p', 200);
    pad[200] = 0;
    for (int i = 0; i < 500; i++) {
        snprintf(v, sizeof(v), "%04d", i);
        put(s, NOW - 1000, i, "__name__", "wide", "i", v, "pad", pad, NULL);
    }
    char *body;
    const char *m[] = {"wide"};
    const char *one[] = {"wide{i=\"0007\"}"};
    /* series */
    api_federate_t *f = fed(s, 100, 0, NULL, NULL);
    assert_int_equal(render(f, m, 1, false, &body), 422);
    assert_string_equal(body, "federation would hold more than 100 series (--query.max-samples)");
    assert_int_equal(render(f, one, 1, false, &body), 200);
    api_federate_free(f);
    /* this request's memory */
    f = fed(s, 0, 32 * 1024, NULL, NULL);
    assert_int_equal(render(f, m, 1, false, &body), 422);
    assert_string_equal(body, "federation would use more than 32768 bytes of memory (--query.max-memory-per-query)");
    assert_int_equal(render(f, one, 1, false, &body), 200);
    api_federate_free(f);
    /* the shared budget, held by someone else */
    arena_budget_t shared = {.limit = 1024 * 1024};
    assert_null(arena_budget_charge(&shared, 1020 * 1024));
    f = fed(s, 0, 0, &shared, NULL);
    assert_int_equal(render(f, m, 1, false, &body), 503);
    assert_non_null(strstr(body, "--query.max-memory"));
    arena_budget_release(&shared, 1020 * 1024);
    assert_int_equal(render(f, m, 1, false, &body), 200);
    assert_int_equal(atomic_load(&shared.used), 0); /* all given back */
    api_federate_free(f);
    storage_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_staleness_and_format),
        cmocka_unit_test(test_protobuf),
        cmocka_unit_test(test_external_labels),
        cmocka_unit_test(test_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
