/*
 * fuzz_promql_eval — internal/promql's evaluator (engine.c, functions.c, aggregators.c), not just
 * its parser: the input is a PromQL query; one that parses is evaluated as an instant query at
 * two times and as a range query of 10 steps over a small fixed data set, held in the PromQL test
 * scripts' in-memory store (testscript.h) and built once:
 *
 *   http_requests_total{job,instance,code}  counters, one with a reset and one with a gap
 *   lat_bucket{job,le}                      a classic histogram (le 0.1 .. +Inf), lat_sum/lat_count
 *   temp{room}                              a gauge with NaN, +-Inf, -0 and a staleness marker
 *   up{job,instance}                        0/1, going stale at 6m and coming back at 8m
 *   flink_numRecordsIn{job,task,tm}         a handful of Flink-shaped series (same name, 3 labels)
 *
 * samples every 15 s over [0, 10m]. The engine's own limits keep a hostile query cheap (and are
 * fuzzed with it): max_samples 100000, 64 MiB of memory, timeout 200 ms — `up[1d:1ms]` (86 M
 * subquery steps) ends at the timeout.
 *
 * Checks: a result has the type the parser gave the expression; every sample and point is at an
 * evaluation time of the query; label sets are sorted, unique and never repeated within a result;
 * a range query of a string expression fails; and, for a query without @, topk/bottomk/limitk or
 * sort, the range query's point at an instant equals the instant query there (same label sets,
 * same values) — the consistency Prometheus' own test runner asserts.
 */
#include <math.h>

#include "internal/labels/labels.h"
#include "internal/promql/ast.h"
#include "internal/promql/engine.h"
#include "internal/promql/testscript.h"
#include "internal/promql/value.h"
#include "internal/util/buf.h"
#include "tests/fuzz/fuzz.h"

#define FUZZ_STEP_MS 15000
#define FUZZ_END_MS (10 * 60 * 1000)
#define FUZZ_SUBQUERY_STEP_MS 60000

/* --- the data set (built once) ------------------------------------------------------------------ */

static promql_memstore_t *data;

static void add(const char *const *kv, int n, int64_t t, double v)
{
    label_t l[8];
    for (int i = 0; i < n; i++)
        l[i] = (label_t){kv[2 * i], kv[2 * i + 1]};
    labels_t ls = {l, (size_t)n};
    promql_memstore_add(data, &ls, t, v);
}

static void build_data(void)
{
    data = promql_memstore_new();
    static const char *const req_a[] = {"__name__", "http_requests_total", "job", "api", "instance", "a", "code",
                                        "200"};
    static const char *const req_b[] = {"__name__", "http_requests_total", "job", "api", "instance", "b", "code",
                                        "500"};
    static const char *const req_c[] = {"__name__", "http_requests_total", "job", "web", "instance", "a", "code",
                                        "200"};
    static const char *const temp_a[] = {"__name__", "temp", "room", "a"};
    static const char *const temp_b[] = {"__name__", "temp", "room", "b\xc3\xa9\n\""};
    static const char *const up_a[] = {"__name__", "up", "job", "api", "instance", "a"};
    static const char *const up_b[] = {"__name__", "up", "job", "api", "instance", "b"};
    static const char *const les[] = {"0.1", "0.5", "1", "+Inf"};
    static const double le_share[] = {0.25, 0.6, 0.9, 1};
    for (int64_t t = 0, i = 0; t <= FUZZ_END_MS; t += FUZZ_STEP_MS, i++) {
        add(req_a, 4, t, (double)(i < 20 ? i * 10 : (i - 20) * 3)); /* reset at 5m */
        if (i % 7 != 3)                                             /* gaps */
            add(req_b, 4, t, (double)i * 0.5);
        add(req_c, 4, t, 1e15 + (double)i);
        for (int b = 0; b < 4; b++) {
            const char *kv[] = {"__name__", "lat_bucket", "job", "api", "le", les[b]};
            add(kv, 3, t, floor((double)(i * 4) * le_share[b]));
        }
        static const char *const lsum[] = {"__name__", "lat_sum", "job", "api"};
        static const char *const lcount[] = {"__name__", "lat_count", "job", "api"};
        add(lsum, 2, t, (double)i * 1.3);
        add(lcount, 2, t, (double)(i * 4));
        static const double odd[] = {NAN, INFINITY, -INFINITY, -0.0, 1e308, -5e-324};
        add(temp_a, 2, t, i % 9 == 4 ? odd[(i / 9) % 6] : 20 + (double)(i % 5));
        if (i == 30)
            add(temp_b, 2, t, promql_stale_nan());
        else
            add(temp_b, 2, t, -3.5 * (double)i);
        if (t < 6 * 60000 || t >= 8 * 60000)
            add(up_a, 3, t, i % 11 == 0 ? 0 : 1);
        else if (t == 6 * 60000)
            add(up_a, 3, t, promql_stale_nan());
        if (i % 2 == 0)
            add(up_b, 3, t, 1);
        for (int k = 0; k < 3; k++) {
            const char *task[] = {"source", "map", "sink"};
            const char *kv[] = {"__name__", "flink_numRecordsIn", "job", "etl", "task", task[k],
                                "tm",       k ? "tm-1" : "tm-2"};
            add(kv, 4, t, (double)(i * (k + 1) * 100));
        }
    }
}

/* --- checks ------------------------------------------------------------------------------------------ */

/* {a="b", ...} for messages; caller frees. */
static char *labels_fmt(const labels_t *ls)
{
    buf_t b;
    buf_init(&b);
    buf_putc(&b, '{');
    for (size_t i = 0; i < ls->n; i++)
        buf_printf(&b, "%s%s=\"%s\"", i ? ", " : "", ls->v[i].name, ls->v[i].value);
    buf_puts(&b, "}");
    buf_putc(&b, 0);
    return b.data;
}

static void check_labels(const labels_t *ls)
{
    FUZZ_CHECK(labels_check_sorted_unique(ls) == 0);
    for (size_t i = 0; i < ls->n; i++)
        FUZZ_CHECK(ls->v[i].name && ls->v[i].value);
}

static int cmp_labels_p(const void *a, const void *b)
{
    return labels_compare(*(const labels_t *const *)a, *(const labels_t *const *)b);
}

/* No two of the n label sets are equal. */
static void check_distinct(const labels_t **ls, size_t n)
{
    if (n < 2)
        return;
    qsort(ls, n, sizeof(*ls), cmp_labels_p);
    for (size_t i = 1; i < n; i++) {
        if (labels_equal(ls[i - 1], ls[i])) {
            char *s = labels_fmt(ls[i]);
            fprintf(stderr, "result holds %s twice\n", s);
            free(s);
        }
        FUZZ_CHECK(!labels_equal(ls[i - 1], ls[i]));
    }
}

static void check_instant(const promql_ast_t *ast, const promql_result_t *r, int64_t t)
{
    if (r->err_kind != PROMQL_ERR_NONE) {
        FUZZ_CHECK(r->err[0] != 0);
        return;
    }
    const promql_value_t *v = &r->value;
    promql_vtype_t want = ast->root->type;
    FUZZ_CHECK(v->type == want);
    if (v->type == PROMQL_VT_VECTOR) {
        const labels_t **ls = malloc((v->nsamples + 1) * sizeof(*ls));
        for (size_t i = 0; i < v->nsamples; i++) {
            FUZZ_CHECK(v->samples[i].t == t);
            check_labels(&v->samples[i].metric);
            ls[i] = &v->samples[i].metric;
        }
        check_distinct(ls, v->nsamples);
        free(ls);
    } else if (v->type == PROMQL_VT_MATRIX) {
        const labels_t **ls = malloc((v->nseries + 1) * sizeof(*ls));
        for (size_t i = 0; i < v->nseries; i++) {
            const promql_series_t *s = &v->series[i];
            check_labels(&s->metric);
            for (size_t j = 0; j < s->npoints; j++)
                FUZZ_CHECK(j == 0 || s->points[j].t > s->points[j - 1].t);
            ls[i] = &s->metric;
        }
        check_distinct(ls, v->nseries);
        free(ls);
    }
}

static void check_range(const promql_ast_t *ast, const promql_result_t *r, int64_t start, int64_t end, int64_t step)
{
    promql_vtype_t t = ast->root->type;
    if (t != PROMQL_VT_SCALAR && t != PROMQL_VT_VECTOR) {
        FUZZ_CHECK(r->err_kind != PROMQL_ERR_NONE);
        return;
    }
    if (r->err_kind != PROMQL_ERR_NONE) {
        FUZZ_CHECK(r->err[0] != 0);
        return;
    }
    const promql_value_t *v = &r->value;
    FUZZ_CHECK(v->type == PROMQL_VT_MATRIX);
    const labels_t **ls = malloc((v->nseries + 1) * sizeof(*ls));
    for (size_t i = 0; i < v->nseries; i++) {
        const promql_series_t *s = &v->series[i];
        check_labels(&s->metric);
        FUZZ_CHECK(s->npoints <= (size_t)((end - start) / step + 1));
        for (size_t j = 0; j < s->npoints; j++) {
            int64_t pt = s->points[j].t;
            FUZZ_CHECK(pt >= start && pt <= end && (pt - start) % step == 0);
            FUZZ_CHECK(j == 0 || pt > s->points[j - 1].t);
        }
        ls[i] = &s->metric;
    }
    check_distinct(ls, v->nseries);
    free(ls);
}

static bool same_value(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (a == b)
        return true;
    return fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b));
}

/* The range result's points at t against the instant result at t. */
static void check_consistent(const promql_result_t *in, const promql_result_t *rg, int64_t t, const char *q)
{
    if (in->err_kind != PROMQL_ERR_NONE || rg->err_kind != PROMQL_ERR_NONE)
        return;
    const promql_value_t *iv = &in->value, *rv = &rg->value;
    if (iv->type == PROMQL_VT_SCALAR) {
        bool found = false;
        for (size_t i = 0; i < rv->nseries; i++)
            for (size_t j = 0; j < rv->series[i].npoints; j++)
                if (rv->series[i].points[j].t == t) {
                    FUZZ_CHECK(!found);
                    found = true;
                    if (!same_value(rv->series[i].points[j].v, iv->scalar))
                        fprintf(stderr, "%s: instant %.17g, range %.17g\n", q, iv->scalar, rv->series[i].points[j].v);
                    FUZZ_CHECK(same_value(rv->series[i].points[j].v, iv->scalar));
                }
        FUZZ_CHECK(found);
        return;
    }
    if (iv->type != PROMQL_VT_VECTOR)
        return;
    size_t matched = 0;
    for (size_t i = 0; i < rv->nseries; i++) {
        const promql_series_t *s = &rv->series[i];
        for (size_t j = 0; j < s->npoints; j++) {
            if (s->points[j].t != t)
                continue;
            matched++;
            const promql_sample_t *hit = NULL;
            for (size_t k = 0; k < iv->nsamples && !hit; k++)
                if (labels_equal(&iv->samples[k].metric, &s->metric))
                    hit = &iv->samples[k];
            if (!hit || !same_value(hit->v, s->points[j].v)) {
                char *l = labels_fmt(&s->metric);
                fprintf(stderr, "%s: range has %s %.17g at %lld, instant %s\n", q, l, s->points[j].v, (long long)t,
                        hit ? "another value" : "does not have it");
                free(l);
            }
            FUZZ_CHECK(hit && same_value(hit->v, s->points[j].v));
        }
    }
    if (matched != iv->nsamples)
        fprintf(stderr, "%s: instant has %zu samples at %lld, range %zu\n", q, iv->nsamples, (long long)t, matched);
    FUZZ_CHECK(matched == iv->nsamples);
}

/* --- the target ---------------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    if (size > 4096)
        return 0;
    if (!data)
        build_data(); /* kept for the life of the process (replay_main has no initializer hook) */
    char *q = fuzz_strndup(in, size);
    char err[512];
    promql_ast_t *ast = promql_parse(q, err, sizeof(err));
    if (!ast) {
        promql_ast_free(ast);
        free(q);
        return 0;
    }
    promql_opts_t opts = {
        .timeout_ms = 200, .max_samples = 100000, .max_memory = 64 << 20, .subquery_step_ms = FUZZ_SUBQUERY_STEP_MS};
    querier_t *qr = promql_memstore_querier(data);
    const int64_t t_mid = 5 * 60000, t_after = FUZZ_END_MS + 2 * 60000;
    const int64_t start = 60000, end = FUZZ_END_MS, step = 60000; /* 10 steps, t_mid among them */

    promql_result_t *mid = promql_exec_instant(qr, ast, t_mid, &opts);
    check_instant(ast, mid, t_mid);
    promql_result_t *after = promql_exec_instant(qr, ast, t_after, &opts);
    check_instant(ast, after, t_after);
    promql_result_free(after);
    promql_result_t *rg = promql_exec_range(qr, ast, start, end, step, &opts);
    check_range(ast, rg, start, end, step);
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("FUZZ_PROMQL_EVAL_VERBOSE") != NULL;
    if (verbose) /* what each query came to: for checking that seeds meet the data */
        fprintf(stderr, "%s\n  instant: %s %zu samples; range: %s %zu series\n", q, mid->err_kind ? mid->err : "ok",
                mid->value.nsamples, rg->err_kind ? rg->err : "ok", rg->value.nseries);
    /* keywords are case-insensitive: look in a lower-case copy */
    char *lq = fuzz_strndup(in, size);
    for (char *p = lq; *p; p++)
        *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    bool order_or_at =
        strchr(lq, '@') || strstr(lq, "topk") || strstr(lq, "bottomk") || strstr(lq, "limit") || strstr(lq, "sort");
    free(lq);
    if (!order_or_at)
        check_consistent(mid, rg, t_mid, q);
    promql_result_free(rg);
    promql_result_free(mid);

    querier_close(qr);
    promql_ast_free(ast);
    free(q);
    return 0;
}
