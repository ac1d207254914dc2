/*
 * Engine entry points beyond the conformance scripts: range-query shape (step alignment, sorted
 * series, scalar results as one label-less series), result ownership, error kinds (bad_data for
 * range queries of range vectors, execution for max_samples and duplicate label sets, canceled),
 * memory bounds (subqueries counted as Prometheus counts them, per-query and shared budgets), the
 * decoding of a loaded series' chunks (clipped to the selector's window, stale markers, a chunk
 * whose header claims more samples than its bytes hold), and the test-script runner's own failure
 * reporting.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal/promql/ast.h"
#include "internal/promql/engine.h"
#include "internal/promql/engine_int.h"
#include "internal/promql/testscript.h"
#include "internal/util/arena.h"
#include "storage/chunk_xor.h"

static promql_memstore_t *store_with_counters(void)
{
    promql_memstore_t *m = promql_memstore_new();
    for (int s = 0; s < 3; s++) {
        char inst[8];
        snprintf(inst, sizeof(inst), "%d", s);
        label_t l[] = {{"__name__", "req_total"}, {"instance", inst}};
        labels_t ls = {l, 2};
        for (int i = 0; i <= 60; i++) /* every 10 s for 10 minutes */
            promql_memstore_add(m, &ls, i * 10000, (double)(i * (s + 1)));
    }
    return m;
}

static promql_result_t *run(promql_memstore_t *m, const char *q, int64_t start, int64_t end, int64_t step,
                            const promql_opts_t *o)
{
    char err[256];
    promql_ast_t *ast = promql_parse(q, err, sizeof(err));
    assert_non_null(ast);
    querier_t *qr = promql_memstore_querier(m);
    promql_result_t *r =
        step ? promql_exec_range(qr, ast, start, end, step, o) : promql_exec_instant(qr, ast, start, o);
    querier_close(qr);
    promql_ast_free(ast); /* results must not point into the AST */
    return r;
}

static void test_range_rate(void **s)
{
    (void)s;
    promql_memstore_t *m = store_with_counters();
    promql_result_t *r = run(m, "rate(req_total[1m])", 120000, 300000, 30000, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->value.type, PROMQL_VT_MATRIX);
    assert_int_equal(r->value.nseries, 3);
    for (size_t i = 0; i < 3; i++) {
        const promql_series_t *se = &r->value.series[i];
        char want[8];
        snprintf(want, sizeof(want), "%zu", i);
        assert_string_equal(labels_get(&se->metric, "instance"), want); /* sorted by labels */
        assert_null(labels_get(&se->metric, "__name__"));               /* rate drops the name */
        assert_int_equal(se->npoints, 7);
        for (size_t j = 0; j < se->npoints; j++) {
            assert_int_equal(se->points[j].t, 120000 + (int64_t)j * 30000);
            assert_true(se->points[j].v > 0.0999 * (double)(i + 1) && se->points[j].v < 0.1001 * (double)(i + 1));
        }
    }
    promql_result_free(r);
    promql_memstore_free(m);
}

static void test_scalar_range_and_instant_vector(void **s)
{
    (void)s;
    promql_memstore_t *m = store_with_counters();
    promql_result_t *r = run(m, "time() * 2", 0, 20000, 10000, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->value.nseries, 1);
    assert_int_equal(r->value.series[0].metric.n, 0);
    assert_int_equal(r->value.series[0].npoints, 3);
    assert_true(r->value.series[0].points[2].v == 40.0);
    promql_result_free(r);

    r = run(m, "sum(req_total)", 600000, 0, 0, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->value.type, PROMQL_VT_VECTOR);
    assert_int_equal(r->value.nsamples, 1);
    assert_true(r->value.samples[0].v == 60.0 + 120.0 + 180.0);
    assert_int_equal(r->value.samples[0].t, 600000);
    promql_result_free(r);

    /* an instant query of a range vector returns the raw window */
    r = run(m, "req_total{instance=\"0\"}[30s]", 600000, 0, 0, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->value.type, PROMQL_VT_MATRIX);
    assert_int_equal(r->value.nseries, 1);
    assert_int_equal(r->value.series[0].npoints, 4); /* 570, 580, 590, 600 s: both ends inclusive */
    assert_non_null(labels_get(&r->value.series[0].metric, "__name__"));
    promql_result_free(r);
    promql_memstore_free(m);
}

static void test_errors(void **s)
{
    (void)s;
    promql_memstore_t *m = store_with_counters();
    promql_result_t *r = run(m, "req_total[5m]", 0, 60000, 10000, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_BAD_DATA);
    assert_string_equal(promql_errkind_name(r->err_kind), "bad_data");
    assert_non_null(strstr(r->err, "invalid expression type \"range vector\" for range query"));
    promql_result_free(r);

    promql_opts_t o = {.max_samples = 10};
    r = run(m, "sum_over_time(req_total[5m])", 600000, 0, 0, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_non_null(strstr(r->err, "query processing would load too many samples into memory"));
    promql_result_free(r);

    r = run(m, "req_total", 0, 600000, 1000, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    promql_result_free(r);

    r = run(m, "req_total * 0 + 1 + ignoring(instance) group_left req_total", 600000, 0, 0, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_non_null(strstr(r->err, "many-to-many matching not allowed"));
    promql_result_free(r);

    r = run(m, "label_replace(req_total, \"instance\", \"x\", \"\", \"\")", 600000, 0, 0, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_string_equal(r->err, "vector cannot contain metrics with the same labelset");
    promql_result_free(r);

    volatile int cancel = 1;
    promql_opts_t oc = {.cancel = &cancel};
    r = run(m, "req_total", 0, 600000, 1000, &oc);
    assert_int_equal(r->err_kind, PROMQL_ERR_CANCELED);
    promql_result_free(r);
    promql_memstore_free(m);
}

static void test_script_runner_reports_failures(void **s)
{
    (void)s;
    const char *script = "load 1m\n"
                         "  m{a=\"1\"} 0+1x10 stale\n"
                         "  n 1 _x3 5\n"
                         "\n"
                         "eval instant at 5m m\n"
                         "  m{a=\"1\"} 5\n"
                         "\n"
                         "eval instant at 5m m\n"
                         "  m{a=\"1\"} 6\n"
                         "\n"
                         "eval instant at 11m m\n"
                         "\n"
                         "eval instant at 4m n\n"
                         "  n 5\n"
                         "\n"
                         "eval_fail instant at 1m m\n"
                         "\n"
                         "eval instant at 1m 1 + 1\n"
                         "  2\n";
    FILE *devnull = fopen("/dev/null", "w");
    promql_script_stats_t st = {0};
    assert_int_equal(promql_script_run("inline", script, devnull, &st), 0);
    fclose(devnull);
    assert_int_equal(st.evals, 6);
    assert_int_equal(st.passed, 4); /* the wrong value and the eval_fail that succeeds fail */
    assert_int_equal(st.failed, 2);
}

/* A subquery holds its gathered inner steps (counted as they grow) plus one inner step's
 * temporaries; earlier steps' temporaries are gone. */
static void test_subquery_sample_accounting(void **s)
{
    (void)s;
    promql_memstore_t *m = store_with_counters();
    /* 600 inner steps x 3 series gathered */
    promql_result_t *r = run(m, "sum_over_time(req_total[10m:1s])", 600000, 0, 0, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->value.nsamples, 3);
    assert_true(r->peak_samples >= 1800 && r->peak_samples <= 1800 + 10);
    promql_result_free(r);

    promql_opts_t o = {.max_samples = 1500};
    r = run(m, "sum_over_time(req_total[10m:1s])", 600000, 0, 0, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_non_null(strstr(r->err, "too many samples"));
    promql_result_free(r);

    /* the same in a range query (inner steps come from the subquery cache), and nested: the
     * answers agree with the instant ones */
    promql_result_t *ri = run(m, "max_over_time(sum_over_time(req_total[1m:10s])[3m:20s])", 600000, 0, 0, NULL);
    r = run(m, "max_over_time(sum_over_time(req_total[1m:10s])[3m:20s])", 540000, 600000, 30000, NULL);
    assert_int_equal(ri->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(r->value.nseries, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(r->value.series[i].npoints, 3);
        assert_true(r->value.series[i].points[2].v == ri->value.samples[i].v);
    }
    promql_result_free(ri);
    promql_result_free(r);
    promql_memstore_free(m);
}

static void test_memory_budgets(void **s)
{
    (void)s;
    promql_memstore_t *m = store_with_counters();
    arena_budget_t shared = {.limit = 1 << 30};
    promql_opts_t o = {.max_memory = 256 << 10, .budget = &shared};
    promql_result_t *r = run(m, "count_over_time(req_total[10m:1ms])", 600000, 0, 0, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_non_null(strstr(r->err, "more than 262144 bytes of memory"));
    promql_result_free(r);
    assert_int_equal(atomic_load(&shared.used), 0);

    /* within its own limit, the shared budget refuses: unavailable (503), to try again later */
    shared.limit = 200 << 10;
    o.max_memory = 0;
    r = run(m, "count_over_time(req_total[10m:1ms])", 600000, 0, 0, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_UNAVAILABLE);
    assert_string_equal(promql_errkind_name(r->err_kind), "unavailable");
    assert_non_null(strstr(r->err, "--query.max-memory"));
    promql_result_free(r);
    assert_int_equal(atomic_load(&shared.used), 0);

    /* a small query fits; the budget is given back when it ends */
    r = run(m, "sum(rate(req_total[1m]))", 0, 600000, 10000, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    promql_result_free(r);
    assert_int_equal(atomic_load(&shared.used), 0);
    promql_memstore_free(m);
}

/* A loaded series keeps its chunks; decoding clips them to [mint, maxt], drops stale markers when
 * asked, and never writes more than pq_sseries_bound says, whatever a chunk's header claims. */
static void test_sseries_decode(void **s)
{
    (void)s;
    chunk_xor_appender_t a[2];
    querier_chunk_t ch[2];
    for (int c = 0; c < 2; c++) {
        assert_int_equal(chunk_xor_appender_init(&a[c]), 0);
        for (int i = 0; i < 100; i++) {
            int64_t t = (int64_t)(c * 100 + i) * 1000;
            double v = (c == 1 && i == 10) ? promql_stale_nan() : (double)(c * 100 + i);
            assert_int_equal(chunk_xor_append(&a[c], t, v), 0);
        }
        size_t len;
        const uint8_t *b = chunk_xor_bytes(&a[c], &len);
        ch[c] = (querier_chunk_t){.mint = c * 100000, .maxt = (c * 100 + 99) * 1000, .bytes = b, .len = len};
    }
    pq_sseries_t ss = {.chunks = ch, .nchunks = 2};
    pq_seldata_t sd = {.mint = 50000, .maxt = 150000};
    size_t bound = pq_sseries_bound(&ss);
    assert_int_equal(bound, 200);
    promql_point_t *out = malloc(bound * sizeof(*out));
    bool stale = false;
    size_t n = pq_sseries_decode(&sd, &ss, false, out, bound, &stale);
    assert_int_equal(n, 101); /* t = 50 s .. 150 s */
    assert_true(stale);
    assert_int_equal(out[0].t, 50000);
    assert_int_equal(out[100].t, 150000);
    assert_true(promql_is_stale_nan(out[60].v)); /* t = 110 s */
    n = pq_sseries_decode(&sd, &ss, true, out, bound, &stale);
    assert_int_equal(n, 100);
    assert_true(stale);
    for (size_t i = 0; i < n; i++)
        assert_false(promql_is_stale_nan(out[i].v));
    free(out);

    /* a chunk of 12 bytes whose header says 65535 samples: at most 1 + 10 * 4 come out */
    uint8_t lie[12];
    size_t len;
    memcpy(lie, chunk_xor_bytes(&a[0], &len), sizeof(lie));
    lie[0] = lie[1] = 0xff;
    querier_chunk_t lc = {.mint = 0, .maxt = INT64_MAX, .bytes = lie, .len = sizeof(lie)};
    pq_sseries_t ls = {.chunks = &lc, .nchunks = 1};
    pq_seldata_t all = {.mint = INT64_MIN, .maxt = INT64_MAX};
    bound = pq_sseries_bound(&ls);
    assert_int_equal(bound, 41);
    out = malloc(bound * sizeof(*out)); /* ASan: no write past it */
    n = pq_sseries_decode(&all, &ls, false, out, bound, NULL);
    assert_true(n <= bound);
    free(out);
    chunk_xor_appender_free(&a[0]);
    chunk_xor_appender_free(&a[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_range_rate),     cmocka_unit_test(test_scalar_range_and_instant_vector),
        cmocka_unit_test(test_errors),         cmocka_unit_test(test_subquery_sample_accounting),
        cmocka_unit_test(test_memory_budgets), cmocka_unit_test(test_script_runner_reports_failures),
        cmocka_unit_test(test_sseries_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
