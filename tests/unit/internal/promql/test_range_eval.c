/*
 * Series-major range evaluation (internal/promql/range_eval.c) against the step-wise evaluator:
 * every query runs as a range query over several step sizes and alignments both ways
 * (promql_opts_t.stepwise), and the two results must be identical -- error kind and message,
 * series, labels, timestamps, values bit for bit, warnings, peak samples -- and again with
 * max_samples just below and at the step-wise run's peak.
 *
 * Queries: every eval of Prometheus 2.42's conformance scripts (when the folder is there, see
 * test_conformance.c; skipped otherwise), and a list of our own over data with stale markers,
 * gaps, counter resets, NaN/Inf, histograms, metric-name collisions and series churn, covering
 * each node the fast path evaluates (those must take it: result.series_major) -- binary operators
 * between vectors with every matching mode and the set operators among them -- shapes it must
 * decline, and queries the step-wise run refuses (many-to-many matching, duplicate match groups,
 * label_replace's bad regexes and colliding outputs), which must come out as the same error --
 * once with aggregations fed straight from range functions, once (SLUICE_PROMQL_NO_FUSE) from
 * materialised values.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "internal/promql/ast.h"
#include "internal/promql/engine.h"
#include "internal/promql/testscript.h"

typedef struct {
    int compared, fast, mismatches;
} tally_t;

/* NULL when a and b are identical, else what differs (static buffer). */
static const char *result_diff(const promql_result_t *a, const promql_result_t *b)
{
    static char why[1200];
    if (a->err_kind != b->err_kind || strcmp(a->err, b->err) != 0) {
        snprintf(why, sizeof(why), "error: [%s] %s vs [%s] %s", promql_errkind_name(a->err_kind), a->err,
                 promql_errkind_name(b->err_kind), b->err);
        return why;
    }
    if (a->nwarnings != b->nwarnings)
        return "number of warnings";
    for (size_t i = 0; i < a->nwarnings; i++)
        if (strcmp(a->warnings[i], b->warnings[i]) != 0)
            return "warning text";
    if (a->err_kind != PROMQL_ERR_NONE)
        return NULL;
    if (a->peak_samples != b->peak_samples) {
        snprintf(why, sizeof(why), "peak samples %lld vs %lld", (long long)a->peak_samples, (long long)b->peak_samples);
        return why;
    }
    if (a->value.type != b->value.type || a->value.nseries != b->value.nseries) {
        snprintf(why, sizeof(why), "series: %zu vs %zu", a->value.nseries, b->value.nseries);
        return why;
    }
    for (size_t i = 0; i < a->value.nseries; i++) {
        const promql_series_t *x = &a->value.series[i], *y = &b->value.series[i];
        if (!labels_equal(&x->metric, &y->metric))
            return "labels / series order";
        if (x->npoints != y->npoints) {
            snprintf(why, sizeof(why), "series %zu: %zu vs %zu points", i, x->npoints, y->npoints);
            return why;
        }
        for (size_t j = 0; j < x->npoints; j++) {
            if (x->points[j].t != y->points[j].t || memcmp(&x->points[j].v, &y->points[j].v, sizeof(double)) != 0) {
                snprintf(why, sizeof(why), "series %zu point %zu: %lld %.17g vs %lld %.17g", i, j,
                         (long long)x->points[j].t, x->points[j].v, (long long)y->points[j].t, y->points[j].v);
                return why;
            }
        }
    }
    return NULL;
}

/* Runs ast over [start, end] at step both ways; counts into t; returns whether the fast path ran. */
static bool compare_once(tally_t *t, querier_t *q, const promql_ast_t *ast, const char *query, int64_t start,
                         int64_t end, int64_t step, int64_t max_samples, int64_t *peak)
{
    promql_opts_t slow = {.stepwise = true, .max_samples = max_samples};
    promql_opts_t fast = {.max_samples = max_samples};
    promql_result_t *a = promql_exec_range(q, ast, start, end, step, &slow);
    promql_result_t *b = promql_exec_range(q, ast, start, end, step, &fast);
    t->compared++;
    bool used = b->series_major;
    if (used)
        t->fast++;
    assert_false(a->series_major);
    const char *why = result_diff(a, b);
    if (why) {
        t->mismatches++;
        printf("MISMATCH %s [%lld, %lld] step %lld max_samples %lld: %s\n", query, (long long)start, (long long)end,
               (long long)step, (long long)max_samples, why);
    }
    if (peak)
        *peak = a->err_kind == PROMQL_ERR_NONE ? a->peak_samples : 0;
    promql_result_free(a);
    promql_result_free(b);
    return used;
}

/* The query at several windows around t (with `dashboard`, also a dashboard's 6 h panel: 1,111
 * steps, the data in the last few dozen); returns whether the fast path ran in all of them. */
static bool compare_query(tally_t *t, querier_t *q, const char *query, int64_t at, bool dashboard)
{
    char err[512];
    promql_ast_t *ast = promql_parse(query, err, sizeof(err));
    if (!ast)
        return false;
    if (ast->root->type != PROMQL_VT_SCALAR && ast->root->type != PROMQL_VT_VECTOR) {
        promql_ast_free(ast);
        return false;
    }
    static const struct {
        int64_t from, to, step;
    } win[] = {
        {-300000, 300000, 60000}, {-3600000, 0, 15000},         {-125013, 65000, 10000},    {0, 0, 1000},
        {-600000, 600000, 37000}, {-7200000, 7200000, 3600000}, {-21600000, 600000, 20000},
    };
    bool all = true;
    for (size_t i = 0; i < sizeof(win) / sizeof(win[0]) - (dashboard ? 0 : 1); i++) {
        int64_t peak = 0;
        if (!compare_once(t, q, ast, query, at + win[i].from, at + win[i].to, win[i].step, 0, &peak))
            all = false;
        if (i == 0 && peak > 1) { /* max_samples: just too few, just enough */
            compare_once(t, q, ast, query, at + win[i].from, at + win[i].to, win[i].step, peak - 1, NULL);
            compare_once(t, q, ast, query, at + win[i].from, at + win[i].to, win[i].step, peak, NULL);
        }
    }
    promql_ast_free(ast);
    return all;
}

/* ---- the conformance scripts' queries ------------------------------------------------------- */

static void script_hook(void *ctx, querier_t *q, const char *query, int64_t t, int line)
{
    (void)line;
    compare_query(ctx, q, query, t, false);
}

static void test_conformance_queries(void **state)
{
    (void)state;
    static const char *const files[] = {"aggregators.test", "at_modifier.test", "collision.test",     "functions.test",
                                        "histograms.test",  "literals.test",    "operators.test",     "selectors.test",
                                        "staleness.test",   "subquery.test",    "trig_functions.test"};
    const char *dir = getenv("PROMQL_TESTS");
    const char *shared = getenv("SLUICE_SHARED_DIR");
    char sdir[4096];
    if (dir && *dir)
        snprintf(sdir, sizeof(sdir), "%s", dir);
    else
        snprintf(sdir, sizeof(sdir), "%s/conformance/promql-2.42", shared ? shared : "../shared");
    char probe[4200];
    snprintf(probe, sizeof(probe), "%s/%s", sdir, files[0]);
    struct stat st;
    if (stat(probe, &st) != 0) {
        printf("conformance scripts not found in %s: this part is skipped\n", sdir);
        skip();
    }
    tally_t t = {0};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(probe, sizeof(probe), "%s/%s", sdir, files[i]);
        assert_int_equal(promql_script_each_eval(probe, stderr, script_hook, &t), 0);
    }
    printf("conformance queries: %d range runs compared, %d series-major, %d mismatches\n", t.compared, t.fast,
           t.mismatches);
    /* the fast path ran on most of them (2,278 before it took vector / vector operators,
     * label_replace / label_join, vector() and scalar(); 2,933 with them) */
    assert_true(t.fast >= 2933);
    assert_int_equal(t.mismatches, 0);
}

/* ---- our own data and queries --------------------------------------------------------------- */

static void add(promql_memstore_t *m, const char *name, const char *k1, const char *v1, const char *k2, const char *v2,
                int64_t t, double v)
{
    label_t l[3] = {{"__name__", name}, {k1, v1}, {k2, v2}};
    labels_t ls = {l, k2 ? 3 : 2};
    promql_memstore_add(m, &ls, t, v);
}

static promql_memstore_t *own_store(void)
{
    promql_memstore_t *m = promql_memstore_new();
    const char *jobs[] = {"api", "db", "web"};
    for (int j = 0; j < 3; j++) {
        for (int in = 0; in < 4; in++) {
            char inst[8];
            snprintf(inst, sizeof(inst), "i%d", in);
            double v = 0;
            for (int i = 0; i <= 240; i++) { /* 40 minutes at 10 s */
                int64_t t = (int64_t)i * 10000;
                if (in == 1 && i >= 100 && i < 130)
                    continue; /* a gap longer than the lookback */
                if (in == 2 && i == 150) {
                    add(m, "req_total", "job", jobs[j], "instance", inst, t, promql_stale_nan());
                    continue;
                }
                if (in == 3 && i % 70 == 69)
                    v = 0; /* counter reset */
                v += 1.5 * (j + 1) + (i % 7) * 0.1 + in;
                add(m, "req_total", "job", jobs[j], "instance", inst, t, v);
                add(m, "temp", "job", jobs[j], "instance", inst, t + 3000, (double)((i * 37 + in * 11) % 23) - 7.25);
            }
        }
    }
    /* the same labels under two names: name-dropping functions collide */
    for (int i = 0; i <= 240; i++) {
        add(m, "dup_a", "job", "x", NULL, NULL, (int64_t)i * 10000, i);
        if (i >= 120)
            add(m, "dup_b", "job", "x", NULL, NULL, (int64_t)i * 10000, 2.0 * i);
    }
    /* specials */
    for (int i = 0; i <= 240; i++) {
        double v = i % 5 == 0 ? NAN : (i % 11 == 0 ? INFINITY : (i % 13 == 0 ? -INFINITY : i * 0.25));
        add(m, "odd", "job", "api", "kind", "special", (int64_t)i * 10000, v);
    }
    /* series churn: pod a ends (stale marker) where pod b starts, so one selector holds either */
    for (int i = 0; i <= 240; i++) {
        bool b = i >= 120;
        add(m, "churn", "job", "api", "pod", b ? "b" : "a", (int64_t)i * 10000, i == 120 ? 7 : 3.0 + i % 4);
        if (i == 120)
            add(m, "churn", "job", "api", "pod", "a", (int64_t)i * 10000, promql_stale_nan());
    }
    /* short-lived series: a long range sees them at a few of its steps (range_eval.c's spans) */
    for (int i = 100; i <= 110; i++) {
        add(m, "blip", "job", "api", NULL, NULL, (int64_t)i * 10000, i * 2.5);
        add(m, "blip", "job", "db", NULL, NULL, (int64_t)i * 10000 + 4000, 300 - i);
    }
    for (int i = 200; i <= 204; i++)
        add(m, "blip", "job", "web", NULL, NULL, (int64_t)i * 10000, i == 202 ? promql_stale_nan() : i);
    /* classic histogram, two jobs */
    const char *le[] = {"0.1", "0.5", "1", "+Inf"};
    for (int j = 0; j < 2; j++)
        for (int b = 0; b < 4; b++)
            for (int i = 0; i <= 240; i++)
                add(m, "lat_bucket", "job", jobs[j], "le", le[b], (int64_t)i * 10000,
                    (double)i * (b + 1) * (j + 2) + (b == 3 ? i % 3 : 0));
    return m;
}

static const char *const fast_queries[] = {
    "req_total",
    "req_total offset 3m",
    "req_total @ 1200",
    "req_total @ end()",
    "temp @ start() offset 1m",
    "rate(req_total[5m])",
    "rate(req_total[1m] offset 2m)",
    "rate(req_total[2m] @ 1500)",
    "irate(req_total[1m])",
    "increase(req_total[3m])",
    "delta(temp[4m])",
    "idelta(temp[2m])",
    "deriv(temp[5m])",
    "predict_linear(temp[5m], 600)",
    "holt_winters(temp[5m], 0.3, 0.7)",
    "resets(req_total[10m])",
    "changes(temp[5m])",
    "avg_over_time(temp[3m])",
    "min_over_time(odd[2m])",
    "max_over_time(odd[2m])",
    "sum_over_time(odd[1m])",
    "count_over_time(req_total[90s])",
    "stddev_over_time(temp[5m])",
    "stdvar_over_time(odd[5m])",
    "last_over_time(req_total[1m])",
    "present_over_time(req_total[30s])",
    "quantile_over_time(0.9, temp[5m])",
    "quantile_over_time(-1, temp[5m])",
    "abs(temp)",
    "sqrt(temp)",
    "ln(odd)",
    "-req_total",
    "+temp",
    "temp * 2",
    "2 - temp",
    "temp > 3",
    "3 < temp",
    "temp >= bool 0",
    "1 == bool temp",
    "temp % 3",
    "temp ^ 2",
    "temp atan2 2",
    "time()",
    "time() - 60",
    "-(time() + 1)",
    "1 > bool 2",
    "sum(rate(req_total[5m]))",
    "sum by (job) (rate(req_total[5m]))",
    "sum without (instance) (rate(req_total[5m]))",
    "avg by (job) (temp)",
    "avg(odd)",
    "count by (instance) (req_total)",
    "min by (job) (temp)",
    "max without (job) (odd)",
    "group by (job) (temp)",
    "stddev by (job) (temp)",
    "stdvar(temp)",
    "quantile by (job) (0.75, temp)",
    "quantile(1.5, temp)",
    "topk(3, rate(req_total[5m]))",
    "bottomk by (job) (2, irate(req_total[1m]))",
    "topk(1, last_over_time({__name__=~\"dup_.\"}[1m]))",
    "bottomk by (job) (2, temp)",
    "topk(2, odd)",
    "topk(0, temp)",
    "avg by (job) (irate(req_total[1m]))",
    "max(delta(temp[4m]))",
    "min without (job) (last_over_time(req_total[1m]))",
    "quantile by (job) (0.3, deriv(temp[5m]))",
    "stddev(rate(req_total[5m]))",
    "stdvar by (instance) (avg_over_time(odd[3m]))",
    "group by (instance) (changes(temp[5m]))",
    "count by (job) (rate(req_total[30s]))",
    "sum by (job) (sum_over_time(odd[1m] @ 1000))",
    "sum(sum by (job) (rate(req_total[5m])))",
    "max(avg by (instance) (temp))",
    "sum by (job) (rate(req_total[5m])) * 60",
    "histogram_quantile(0.9, rate(lat_bucket[5m]))",
    "histogram_quantile(0.5, sum by (le) (rate(lat_bucket[5m])))",
    "histogram_quantile(0.99, sum by (job, le) (rate(lat_bucket[5m])))",
    "histogram_quantile(2, lat_bucket)",
    "sum by (job) (rate(dup_a[5m]))",
    "last_over_time({__name__=~\"dup_.\"}[1m])",
    /* vector / vector arithmetic and comparisons, every matching mode */
    "req_total + temp",
    "temp - req_total",
    "req_total / on (job, instance) temp",
    "req_total % ignoring (kind) temp",
    "temp ^ on (job, instance) temp",
    "temp atan2 temp",
    "rate(req_total[5m]) / on (job) group_left sum by (job) (rate(req_total[5m]))",
    "req_total - ignoring (instance) group_left sum by (job) (temp)",
    "req_total * on (job) group_left (kind) odd",
    "odd * on (job) group_right (kind) req_total",
    "sum by (job) (temp) * on (job) group_right req_total",
    "max by (job, kind) (odd) - on (job) group_right (kind) temp",
    "temp > req_total",
    "req_total > temp",
    "temp > bool req_total",
    "req_total >= on (job, instance) temp",
    "temp == bool ignoring (instance) group_left avg by (job) (temp)",
    "temp < on (job) group_left max by (job) (temp)",
    "max by (job) (temp) >= bool on (job) group_right temp",
    "temp != bool temp",
    "temp <= odd",
    "{__name__=~\"req_total|temp\"} > on (job, instance) group_left sum by (job, instance) (temp)",
    "(temp > 1000) + on () group_left {__name__=~\"dup_.\"}",
    "temp * on (job) group_left (pod) churn",
    "temp * on (job) group_left churn",
    "churn / on (job) group_left max by (job) (temp)",
    "-(temp + req_total) * 2",
    "sum by (job) (temp * req_total)",
    "histogram_quantile(0.9, rate(lat_bucket[5m]) * on (job) group_left max by (job) (temp > -100))",
    /* set operators */
    "temp and req_total",
    "temp and on (job) odd",
    "temp and on (job) churn",
    "temp or odd",
    "temp or req_total",
    "churn or on (job) temp",
    "req_total unless on (instance) (temp > 5)",
    "temp unless temp > 2",
    "(temp > 0) and ignoring (instance) (req_total > 1000)",
    "temp > 0 or temp < -3",
    "vector(1) and on () temp",
    "sum(temp > 100) or vector(0)",
    "count(max by (job, instance) (temp) / 10 > 0.5) or vector(0)",
    "count(req_total) or vector(0)",
    "rate(req_total[5m]) and on (instance) group by (instance) (temp > 1)",
    "sum by (job) (temp unless on (job, instance) req_total > 200)",
    "{__name__=~\"dup_.\"} unless on (job) vector(1)",
    "({__name__=~\"dup_.\"} or temp) and on (job) {__name__=~\"dup_.\"}",
    /* vector(), scalar() */
    "vector(time())",
    "vector(2) * temp",
    "scalar(sum(temp)) * temp",
    "scalar(temp)",
    "scalar(churn) + 1",
    /* label_replace / label_join */
    "label_replace(temp, \"dst\", \"$1-x\", \"instance\", \"i(.*)\")",
    "label_replace(temp, \"instance\", \"\", \"job\", \"nomatch\")",
    "label_replace(temp, \"__name__\", \"renamed\", \"\", \"\")",
    "label_replace(req_total, \"x\", \"$2$1\", \"instance\", \"(i)(.)\")",
    "sum by (x) (label_replace(rate(req_total[5m]), \"x\", \"${1}\", \"instance\", \"i([0-1])\"))",
    "label_join(temp, \"ji\", \"/\", \"job\", \"instance\")",
    "label_join(temp, \"job\", \"-\", \"job\", \"job\", \"none\")",
    "label_join(req_total, \"empty\", \",\")",
    "label_replace(temp, \"a\", \"$1\", \"job\", \"(.*)\")",
    "label_replace(blip, \"j\", \"$1\", \"job\", \"(.)b\")",
    "label_replace(vector(1), \"a\", \"b\", \"\", \"\") + label_replace(vector(1), \"a\", \"b\", \"\", \"\")",
    "temp * on (job, instance) group_left (i) label_replace(max by (job, instance) (req_total), \"i\", \"$0\", "
    "\"instance\", \".*\")",
    /* short-lived series over long ranges */
    "blip",
    "blip offset 10m",
    "blip @ 1050",
    "blip @ 2020 offset 1m",
    "rate(blip[1m])",
    "rate(blip[2m] offset 7m)",
    "last_over_time(blip[30s] @ 1100)",
    "quantile_over_time(scalar(blip), blip[1m])",
    "max by (job) (blip)",
    "max by (job) (blip >= 0) / 1000",
    "sum(rate(blip[1m]))",
    "sum by (job) (rate(blip[40s]))",
    "avg(rate(blip[1m]) * 2)",
    "topk(1, blip)",
    "bottomk(1, rate(blip[1m]))",
    "quantile(0.5, blip)",
    "-blip",
    "abs(blip) > 100",
    "blip + on (job) group_left max by (job) (temp)",
    "temp * on (job) group_left blip",
    "blip / blip",
    "blip or temp",
    "temp unless on (job) blip",
    "temp and on (job) blip",
    "count(max by (job) (blip) / 1000 > 0.1) or vector(0)",
    "vector(1) + on () group_left sum(blip)",
    "scalar(sum(blip)) * temp",
    "histogram_quantile(0.5, label_replace(blip, \"le\", \"+Inf\", \"\", \"\"))",
    /* the panels bench/query_bench.py --dashboard sends (deploy/grafana/flink-flow.json, $job_name = All,
     * $__rate_interval = 1m), which must not fall back to the step-wise engine */
    "sum by (job_name, task_name) (rate(flink_taskmanager_job_task_numRecordsIn{job_name=~\".*\"}[1m]))",
    "sum by (job_name) (rate(flink_taskmanager_job_task_numBytesIn{job_name=~\".*\"}[1m]))",
    "max by (job_name, task_name) (flink_taskmanager_job_task_backPressuredTimeMsPerSecond{job_name=~\".*\"}) / 1000",
    "max by (job_name, task_name) (flink_taskmanager_job_task_busyTimeMsPerSecond{job_name=~\".*\"} >= 0) / 1000",
    "max by (task_name) (flink_taskmanager_job_task_mailboxLatencyMs{job_name=~\".*\",quantile=\"0.99\"})",
    "sum by (job_name) (rate(flink_taskmanager_job_task_operator_numLateRecordsDropped{job_name=~\".*\"}[1m]))",
};

/* Shapes the fast path declines (or errors it hands to the step-wise run): compared all the same. */
static const char *const other_queries[] = {
    "rate({__name__=~\"dup_.\"}[5m])",
    "count(rate({__name__=~\"dup_.\"}[5m] offset 30m))",
    "-{__name__=~\"dup_.\"}",
    "{__name__=~\"dup_.\"} * 1",
    "abs({__name__=~\"dup_.\"})",
    "holt_winters(temp[5m], 2, 0.5)",
    "topk(1e30, temp)",
    "sum(topk(2, temp))",
    "histogram_quantile(0.5, topk(100, lat_bucket))",
    "count_values(\"v\", temp)",
    "rate(req_total[5m:1m])",
    "timestamp(temp)",
    /* unordered inputs an order-sensitive consumer declines */
    "sum(topk(2, temp) and req_total)",
    "topk(2, temp) + on (job, instance) req_total",
    "sum(req_total or topk(1, temp))",
};

/* Queries the step-wise run refuses over [0, 40m] (some only at the steps where both dup_a and
 * dup_b are present, i.e. after 20m): the fast path must hand each to it and come out the same. */
static const char *const error_queries[] = {
    /* vector matching: many-to-many, duplicate match groups, multiple matches */
    "req_total + on (job) temp",
    "req_total + ignoring (instance) temp",
    "sum by (job) (temp) + on (job) group_left req_total",
    "req_total * on (job) group_right sum by (job) (temp)",
    "{__name__=~\"req_total|temp\"} + on (job, instance) sum by (job, instance) (temp)",
    "{__name__=~\"req_total|temp\"} / on (job, instance) group_left sum by (job, instance) (temp)",
    "vector(2) * on () group_left {__name__=~\"dup_.\"}",
    "{__name__=~\"dup_.\"} * on () group_left vector(2)",
    "{__name__=~\"dup_.\"} + {__name__=~\"dup_.\"}",
    "churn + on (job) group_left temp",
    "temp or label_replace(temp, \"job\", \"x\", \"\", \"\")",
    "{__name__=~\"dup_.\"} / 2 or vector(1)",
    /* label_replace / label_join refused or colliding */
    "label_replace(temp, \"job\", \"\", \"job\", \".*\")",
    "label_replace(req_total, \"instance\", \"all\", \"instance\", \"i[0-3]\")",
    "label_replace(temp, \"a\", \"$1\", \"job\", \"(.*\")",
    "label_replace(temp, \"1a\", \"$1\", \"job\", \"(.*)\")",
    "label_join(req_total, \"job\", \"\", \"nolabel\")",
    "label_join(temp, \"x-y\", \"\", \"job\")",
    "label_join(temp, \"x\", \"\", \"a-b\")",
};

static void assert_parses(const char *query)
{
    char err[512];
    promql_ast_t *ast = promql_parse(query, err, sizeof(err));
    if (!ast)
        printf("%s: %s\n", query, err);
    assert_non_null(ast);
    promql_ast_free(ast);
}

static void own_queries(void)
{
    promql_memstore_t *m = own_store();
    querier_t *q = promql_memstore_querier(m);
    tally_t t = {0};
    static const int64_t at[] = {1200000, 2400000, 400000};
    for (size_t i = 0; i < sizeof(fast_queries) / sizeof(fast_queries[0]); i++) {
        assert_parses(fast_queries[i]);
        bool all = true;
        for (size_t k = 0; k < 3; k++)
            all &= compare_query(&t, q, fast_queries[i], at[k], true);
        if (!all)
            printf("not evaluated series-major: %s\n", fast_queries[i]);
        assert_true(all);
    }
    for (size_t i = 0; i < sizeof(other_queries) / sizeof(other_queries[0]); i++) {
        assert_parses(other_queries[i]);
        for (size_t k = 0; k < 3; k++)
            compare_query(&t, q, other_queries[i], at[k], true);
    }
    for (size_t i = 0; i < sizeof(error_queries) / sizeof(error_queries[0]); i++) {
        char err[512];
        promql_ast_t *ast = promql_parse(error_queries[i], err, sizeof(err));
        assert_non_null(ast);
        promql_result_t *r = promql_exec_range(q, ast, 0, 2400000, 15000, NULL);
        if (r->err_kind != PROMQL_ERR_EXECUTION)
            printf("no error: %s\n", error_queries[i]);
        assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
        assert_false(r->series_major);
        promql_result_free(r);
        promql_ast_free(ast);
        for (size_t k = 0; k < 3; k++)
            compare_query(&t, q, error_queries[i], at[k], true);
    }
    printf("own queries: %d range runs compared, %d series-major, %d mismatches\n", t.compared, t.fast, t.mismatches);
    assert_int_equal(t.mismatches, 0);
    querier_close(q);
    promql_memstore_free(m);
}

static void test_own_queries(void **state)
{
    (void)state;
    own_queries();
}

/* The same with aggregations of range functions evaluated from materialised values. */
static void test_own_queries_unfused(void **state)
{
    (void)state;
    setenv("SLUICE_PROMQL_NO_FUSE", "1", 1);
    own_queries();
    unsetenv("SLUICE_PROMQL_NO_FUSE");
}

/* Errors the fast path leaves to the step-wise run come out the same; timeouts and cancellation
 * stop it directly; a memory limit it exceeds is the step-wise run's to report or not. */
static void test_errors_and_limits(void **state)
{
    (void)state;
    promql_memstore_t *m = own_store();
    querier_t *q = promql_memstore_querier(m);
    char err[256];
    promql_ast_t *ast = promql_parse("rate({__name__=~\"dup_.\"}[5m])", err, sizeof(err));
    promql_result_t *r = promql_exec_range(q, ast, 0, 2400000, 60000, NULL);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_string_equal(r->err, "vector cannot contain metrics with the same labelset");
    assert_false(r->series_major);
    promql_result_free(r);
    promql_ast_free(ast);

    ast = promql_parse("sum by (job) (rate(req_total[5m]))", err, sizeof(err));
    volatile int cancel = 1;
    promql_opts_t o = {.cancel = &cancel};
    r = promql_exec_range(q, ast, 0, 2400000, 10000, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_CANCELED);
    promql_result_free(r);

    o = (promql_opts_t){.max_samples = 100};
    r = promql_exec_range(q, ast, 0, 2400000, 10000, &o);
    assert_int_equal(r->err_kind, PROMQL_ERR_EXECUTION);
    assert_non_null(strstr(r->err, "too many samples"));
    promql_result_free(r);

    /* a budget the series-major values do not fit in, the step-wise steps do */
    o = (promql_opts_t){.max_memory = 1 << 20};
    promql_result_t *slow =
        promql_exec_range(q, ast, 0, 2400000, 1000, &(promql_opts_t){.stepwise = true, .max_memory = 1 << 20});
    r = promql_exec_range(q, ast, 0, 2400000, 1000, &o);
    assert_int_equal(r->err_kind, slow->err_kind);
    assert_null(result_diff(slow, r));
    promql_result_free(slow);
    promql_result_free(r);
    promql_ast_free(ast);
    querier_close(q);
    promql_memstore_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_queries),
        cmocka_unit_test(test_own_queries_unfused),
        cmocka_unit_test(test_errors_and_limits),
        cmocka_unit_test(test_conformance_queries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
