/* api/flow.c's computation (api_flow_compute) over a memory-only store with a fixed clock: counter
 * increases spread between samples, resets, staleness markers, completeness across TaskManagers,
 * gauges held and maxed per task, and the window limits. The HTTP side is in
 * tests/integration/test_dashboard.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "api/flow.h"

#define T0 1700000000LL /* seconds */
static int64_t now_ms = (T0 + 60) * 1000;
static int64_t clock_fn(void)
{
    return now_ms;
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

static void put(storage_t *s, const char *name, const char *job, const char *tm, const char *task, const char *sub,
                int64_t sec, double v)
{
    label_t l[5] = {{"__name__", name}, {"job_name", job}, {"tm_id", tm}, {"task_name", task}, {"subtask_index", sub}};
    storage_sample_t smp = {.labels = {l, 5}, .t = sec * 1000, .v = v};
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

static void compute(storage_t *s, const char *job, int64_t start, int64_t end, api_flow_result_t *r)
{
    char err[256] = "";
    querier_t *q = storage_querier(s);
    int rc = api_flow_compute(q, job, start, end, now_ms, r, err, sizeof(err));
    querier_close(q);
    if (rc != 0)
        fprintf(stderr, "api_flow_compute: %s\n", err);
    assert_int_equal(rc, 0);
}

#define IN FLOW_METRIC_RECORDS_IN
#define OUT FLOW_METRIC_RECORDS_OUT

static void test_counters_spread_reset_and_completeness(void **st)
{
    (void)st;
    storage_t *s = open_store();
    /* TM a: 100 @0, 200 @10, (missed 20), 400 @30, reset to 50 @40. TM b: 0 @5, 100 @15. */
    put(s, IN, "j", "a", "t", "0", T0, 100);
    put(s, IN, "j", "a", "t", "0", T0 + 10, 200);
    put(s, IN, "j", "a", "t", "0", T0 + 30, 400);
    put(s, IN, "j", "a", "t", "0", T0 + 40, 50);
    put(s, IN, "j", "b", "t", "1", T0 + 5, 0);
    put(s, IN, "j", "b", "t", "1", T0 + 15, 100);
    put(s, IN, "other", "a", "t", "0", T0, 0);
    put(s, IN, "other", "a", "t", "0", T0 + 10, 1e9);
    api_flow_result_t r;
    compute(s, "j", T0, T0 + 45, &r);
    assert_int_equal(r.n, 46);
    assert_int_equal(r.counter_series, 2);
    /* b's newest sample (t0+15) is live and the oldest among the live ones. */
    assert_int_equal(r.complete_s, T0 + 15);
    assert_true(isnan(r.records_in[0])); /* t0: a's base, b not started */
    for (int x = 1; x <= 5; x++)
        assert_true(r.records_in[x] == 10.0);
    for (int x = 6; x <= 15; x++)
        assert_true(r.records_in[x] == 20.0);
    for (int x = 16; x <= 45; x++)
        assert_true(isnan(r.records_in[x])); /* past complete_until */
    for (size_t x = 0; x < r.n; x++)
        assert_true(isnan(r.records_out[x]));
    api_flow_result_free(&r);

    /* Once b is no longer live (no sample for > 120 s), a alone decides: reset included. */
    now_ms = (T0 + 15 + 121) * 1000;
    compute(s, "j", T0 + 26, T0 + 45, &r);
    assert_int_equal(r.complete_s, T0 + 40);
    for (int x = T0 + 26; x <= T0 + 30; x++)
        assert_true(r.records_in[x - (T0 + 26)] == 10.0); /* 200 over the 20 s gap */
    for (int x = T0 + 31; x <= T0 + 40; x++)
        assert_true(r.records_in[x - (T0 + 26)] == 5.0); /* reset: 50 over 10 s */
    assert_true(isnan(r.records_in[T0 + 41 - (T0 + 26)]));
    api_flow_result_free(&r);
    now_ms = (T0 + 60) * 1000;
    storage_close(s);
}

static void test_stale_marker_breaks_the_series(void **st)
{
    (void)st;
    storage_t *s = open_store();
    put(s, OUT, "j", "c", "t", "0", T0, 0);
    put(s, OUT, "j", "c", "t", "0", T0 + 10, 100);
    put(s, OUT, "j", "c", "t", "0", T0 + 12, stale_nan());
    put(s, OUT, "j", "c", "t", "0", T0 + 30, 1000);
    put(s, OUT, "j", "c", "t", "0", T0 + 40, 1100);
    api_flow_result_t r;
    compute(s, "j", T0, T0 + 40, &r);
    assert_int_equal(r.complete_s, T0 + 40);
    assert_true(r.records_out[10] == 10.0);
    for (int x = 11; x <= 30; x++)
        assert_true(isnan(r.records_out[x])); /* not joined across the marker */
    assert_true(r.records_out[31] == 10.0 && r.records_out[40] == 10.0);
    api_flow_result_free(&r);
    storage_close(s);
}

static void test_gauges_held_maxed_and_levels(void **st)
{
    (void)st;
    storage_t *s = open_store();
    put(s, FLOW_METRIC_BACKPRESSURE, "j", "a", "sink", "0", T0, 100);
    put(s, FLOW_METRIC_BACKPRESSURE, "j", "a", "sink", "0", T0 + 20, 800);
    put(s, FLOW_METRIC_BACKPRESSURE, "j", "a", "sink", "1", T0 + 10, 300);
    put(s, FLOW_METRIC_BACKPRESSURE, "j", "a", "src", "0", T0, 2000); /* clamped to 1 */
    put(s, FLOW_METRIC_BUSY, "j", "a", "sink", "0", T0, 500);
    put(s, FLOW_METRIC_BUSY, "j", "a", "sink", "0", T0 + 10, NAN);
    api_flow_result_t r;
    compute(s, "j", T0 - 1, T0 + 200, &r);
    assert_int_equal(r.ntasks, 2);
    assert_string_equal(r.tasks[0].name, "sink"); /* sorted */
    assert_string_equal(r.tasks[1].name, "src");
    const api_flow_task_t *k = &r.tasks[0];
    assert_int_equal(k->subtasks, 2);
    assert_true(isnan(k->backpressure[0]));
    assert_true(k->backpressure[1] == 0.1 && k->backpressure[10] == 0.1);
    assert_true(k->backpressure[11] == 0.3 && k->backpressure[20] == 0.3);
    assert_true(k->backpressure[21] == 0.8);
    /* Held at most FLOW_GAUGE_HOLD_S (120 s) after the newest sample (t0+20). */
    assert_true(k->backpressure[1 + 20 + 120] == 0.8);
    assert_true(isnan(k->backpressure[1 + 20 + 121]));
    assert_true(k->busy[1] == 0.5 && k->busy[10] == 0.5 && isnan(k->busy[11]));
    assert_true(r.tasks[1].backpressure[1] == 1.0);
    assert_int_equal(r.counter_series, 0);
    assert_int_equal(r.complete_s, -1);
    api_flow_result_free(&r);
    storage_close(s);
}

static void test_window_limits_and_json(void **st)
{
    (void)st;
    storage_t *s = open_store();
    querier_t *q = storage_querier(s);
    api_flow_result_t r;
    char err[128];
    assert_int_equal(api_flow_compute(q, "j", T0, T0 - 1, now_ms, &r, err, sizeof(err)), -1);
    api_flow_result_free(&r);
    assert_int_equal(api_flow_compute(q, "j", T0, T0 + FLOW_MAX_WINDOW_S, now_ms, &r, err, sizeof(err)), -1);
    api_flow_result_free(&r);
    assert_int_equal(api_flow_compute(q, "j\"x", T0, T0 + 1, now_ms, &r, err, sizeof(err)), 0);
    buf_t b = BUF_INIT;
    api_flow_result_json_open(&r, "j\"x", &b);
    buf_putc(&b, '}');
    assert_string_equal(b.data, "{\"job\":\"j\\\"x\",\"start\":1700000000,\"end\":1700000001,\"step\":1,"
                                "\"complete_until\":null,\"counter_series\":0,\"records_in\":[null,null],"
                                "\"records_out\":[null,null],\"tasks\":[],\"lags\":[]}");
    buf_free(&b);
    api_flow_result_free(&r);
    querier_close(q);
    storage_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counters_spread_reset_and_completeness),
        cmocka_unit_test(test_stale_marker_breaks_the_series),
        cmocka_unit_test(test_gauges_held_maxed_and_levels),
        cmocka_unit_test(test_window_limits_and_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
