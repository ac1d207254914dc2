/* Unit tests for storage/querier_tiered.c through the storage facade: three hours of 10-second
 * samples (a counter with resets, a gauge, a series that stops after 30 minutes) with a 30-minute
 * raw retention, then history queries (roll-ups before the raw data, raw after, no double
 * counting), step-mode queries, a series found only through the catalog with every matcher type,
 * and time-bounded label names/values. Every expectation is computed directly from the raw
 * samples the test appended. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/log.h"
#include "storage/querier_tiered.h"
#include "internal/promql/engine.h"
#include "storage/storage.h"

#define MIN_MS 60000LL
#define HOUR_MS 3600000LL
#define T0 1699999200000LL /* a multiple of 1h */
#define RAW_RETENTION (30 * MIN_MS)

static int64_t fake_now = T0;
static int64_t clock_fn(void)
{
    return fake_now;
}

typedef struct {
    int64_t *t;
    double *v;
    size_t n, cap;
} raw_t;

static void raw_push(raw_t *r, int64_t t, double v)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 1024;
        r->t = realloc(r->t, r->cap * sizeof(int64_t));
        r->v = realloc(r->v, r->cap * sizeof(double));
    }
    r->t[r->n] = t;
    r->v[r->n++] = v;
}

enum { S_COUNTER, S_GAUGE, S_GONE, NS };
static const char *names[NS] = {"flink_records_total", "flink_ratio", "c_gone"};
static raw_t ref[NS];
static storage_t *st;
static char dir[128];

static int append(int k, int64_t t, double v)
{
    label_t l[3] = {{"__name__", names[k]}, {"job", "etl"}, {k == S_GONE ? "gone_label" : "task", "x"}};
    storage_sample_t smp = {.labels = {l, 3}, .t = t, .v = v};
    storage_append_result_t r;
    return storage_append(st, &smp, 1, &r);
}

static int setup(void **state)
{
    log_set_level(LOG_WARN);
    snprintf(dir, sizeof(dir), "/tmp/sluice-test-tiered-XXXXXX");
    assert_non_null(mkdtemp(dir));
    storage_options_t o;
    storage_options_default(&o);
    o.path = dir;
    o.retention_raw_ms = RAW_RETENTION;
    o.block_ms = 5 * MIN_MS;
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.snapshot_interval_ms = -1;
    char err[256];
    fake_now = T0;
    st = storage_open(&o, err, sizeof(err));
    assert_non_null(st);
    srand(7);
    double counter = 0;
    for (int64_t t = T0; t < T0 + 3 * HOUR_MS; t += 10000) {
        fake_now = t + 1;
        int64_t jt = t + rand() % 3000;
        if (rand() % 50 == 0)
            counter = rand() % 20; /* reset */
        else
            counter += rand() % 500;
        assert_int_equal(append(S_COUNTER, jt, counter), STORAGE_OK);
        raw_push(&ref[S_COUNTER], jt, counter);
        double g = (rand() % 1000) / 8.0;
        assert_int_equal(append(S_GAUGE, jt, g), STORAGE_OK);
        raw_push(&ref[S_GAUGE], jt, g);
        if (t < T0 + 30 * MIN_MS) {
            assert_int_equal(append(S_GONE, jt, t / 1000 % 97), STORAGE_OK);
            raw_push(&ref[S_GONE], jt, t / 1000 % 97);
        }
        if (t % MIN_MS == 0)
            storage_housekeep(st);
    }
    fake_now = T0 + 3 * HOUR_MS;
    /* The catalog reads new series' labels back from memory, so a series leaves memory only
     * once its catalog row is written (the roll-up writer does that every second; here, now). */
    assert_int_equal(storage_flush(st), STORAGE_OK);
    for (int i = 0; i < 20; i++)
        storage_housekeep(st); /* finish sweeping: c_gone leaves memory */
    assert_int_equal(storage_flush(st), STORAGE_OK);
    return 0;
}

static int teardown(void **state)
{
    storage_close(st);
    for (int k = 0; k < NS; k++) {
        free(ref[k].t);
        free(ref[k].v);
    }
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- helpers -------------------------------------------------------------------------------- */

typedef struct {
    int64_t t[4096];
    double v[4096];
    size_t n;
    int64_t rollup_until, res;
    size_t nseries;
} got_t;

static void query(const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, const querier_hints_t *h, got_t *g)
{
    memset(g, 0, sizeof(*g));
    querier_t *q = storage_querier(st);
    querier_set_t *set = querier_select(q, ms, n, mint, maxt, h);
    const querier_series_t *s;
    while ((s = querier_set_next(set))) {
        g->nseries++;
        g->rollup_until = s->rollup_until;
        g->res = s->rollup_res_ms;
        querier_iter_t it;
        querier_iter_init(&it, s, mint, maxt);
        while (g->n < 4096 && querier_iter_next(&it, &g->t[g->n], &g->v[g->n]))
            g->n++;
    }
    assert_null(querier_set_error(set));
    querier_set_free(set);
    querier_close(q);
}

static matcher_t *mk(matcher_type_t t, const char *name, const char *value)
{
    char err[128];
    matcher_t *m = matcher_new(t, name, value, err, sizeof(err));
    assert_non_null(m);
    return m;
}

static void query_name(int k, int64_t mint, int64_t maxt, const querier_hints_t *h, got_t *g)
{
    matcher_t *m = mk(MATCHER_EQ, "__name__", names[k]);
    query((const matcher_t *const *)&m, 1, mint, maxt, h, g);
    matcher_free(m);
}

static int64_t floor_to(int64_t t, int64_t r)
{
    return t - (((t % r) + r) % r);
}

/* Direct aggregate over the reference samples of bucket [ts, ts + res). */
typedef struct {
    size_t count;
    double sum, min, max, last, increase;
} dagg_t;

static dagg_t direct(int k, int64_t ts, int64_t res)
{
    dagg_t d = {0, 0, INFINITY, -INFINITY, NAN, 0};
    const raw_t *r = &ref[k];
    for (size_t i = 0; i < r->n; i++) {
        if (r->t[i] < ts || r->t[i] >= ts + res)
            continue;
        d.count++;
        d.sum += r->v[i];
        d.min = fmin(d.min, r->v[i]);
        d.max = fmax(d.max, r->v[i]);
        d.last = r->v[i];
        if (i > 0)
            d.increase += r->v[i] >= r->v[i - 1] ? r->v[i] - r->v[i - 1] : r->v[i];
    }
    return d;
}

/* Checks that g is: synthetic samples (one per bucket, at its last ms, value from `pick`) before
 * g->rollup_until, then exactly the reference raw samples from the first raw t on, with no
 * sample left out between. Buckets of width res, except a tail of 1m buckets that fills a coarse
 * bucket cut by the start of the raw data. Returns the number of synthetic samples. */
static size_t check_stitched(int k, const got_t *g, int64_t res, double (*pick)(const dagg_t *))
{
    size_t i = 0;
    bool tail = false;
    for (; i < g->n && g->t[i] < g->rollup_until; i++) {
        int64_t w = res;
        if ((g->t[i] + 1) % res != 0) {
            assert_true(res > MIN_MS); /* the 1m tail after coarse buckets */
            w = MIN_MS;
            tail = true;
        } else {
            assert_false(tail);
        }
        int64_t ts = g->t[i] + 1 - w;
        assert_int_equal(ts % w, 0);
        if (i > 0)
            assert_true(g->t[i] > g->t[i - 1]);
        if (pick) {
            dagg_t d = direct(k, ts, w);
            assert_true(d.count > 0);
            double want = pick(&d);
            if (fabs(g->v[i] - want) > 1e-9 * fmax(1, fabs(want)))
                fail_msg("series %d bucket %lld: got %g want %g", k, (long long)ts, g->v[i], want);
        }
    }
    size_t nsynth = i;
    if (i == g->n)
        return nsynth;
    if (nsynth > 0) /* nothing between the last bucket's end and the first raw sample */
        for (size_t j = 0; j < ref[k].n; j++)
            if (ref[k].t[j] >= g->rollup_until && ref[k].t[j] < g->t[i])
                fail_msg("series %d: sample at %lld is in neither tier", k, (long long)ref[k].t[j]);
    /* raw: every reference sample from the first raw t on, exactly */
    size_t j = 0;
    while (j < ref[k].n && ref[k].t[j] < g->t[i])
        j++;
    assert_true(nsynth == 0 || g->t[i] >= g->rollup_until);
    for (; i < g->n; i++, j++) {
        assert_true(j < ref[k].n);
        assert_int_equal(g->t[i], ref[k].t[j]);
        assert_true(g->v[i] == ref[k].v[j]);
    }
    return nsynth;
}

static double pick_max(const dagg_t *d)
{
    return d->max;
}
static double pick_min(const dagg_t *d)
{
    return d->min;
}
static double pick_sum(const dagg_t *d)
{
    return d->sum;
}
static double pick_count(const dagg_t *d)
{
    return (double)d->count;
}
static double pick_last(const dagg_t *d)
{
    return d->last;
}
static double pick_mean(const dagg_t *d)
{
    return d->sum / (double)d->count;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_agg_table(void **state)
{
    assert_int_equal(querier_tiered_agg("rate"), QUERIER_AGG_COUNTER);
    assert_int_equal(querier_tiered_agg("resets"), QUERIER_AGG_COUNTER);
    assert_int_equal(querier_tiered_agg("min_over_time"), QUERIER_AGG_MIN);
    assert_int_equal(querier_tiered_agg("count_over_time"), QUERIER_AGG_COUNT);
    assert_int_equal(querier_tiered_agg("avg_over_time"), QUERIER_AGG_MEAN);
    assert_int_equal(querier_tiered_agg("delta"), QUERIER_AGG_LAST);
    assert_int_equal(querier_tiered_agg(NULL), QUERIER_AGG_LAST);
}

/* Past raw retention: roll-ups (1m) before the raw data, raw after, each aggregate right. */
/* Through the PromQL engine: count_over_time over roll-up buckets counts the samples the buckets
 * hold, not the buckets. */
static void test_promql_count_over_roll_ups(void **state)
{
    /* Prometheus 2.42 windows are closed, [t-30m, t], and a bucket's sample sits at its last
     * millisecond: the buckets [T0+29m, T0+59m) are inside. */
    int64_t t = T0 + 60 * MIN_MS - 2;
    char err[256];
    promql_ast_t *ast = promql_parse("count_over_time(flink_ratio[30m])", err, sizeof(err));
    assert_non_null(ast);
    querier_t *q = storage_querier(st);
    promql_result_t *res = promql_exec_instant(q, ast, t, NULL);
    assert_non_null(res);
    assert_int_equal(res->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(res->value.nsamples, 1);
    size_t want = 0;
    for (size_t i = 0; i < ref[S_GAUGE].n; i++)
        want += ref[S_GAUGE].t[i] >= T0 + 29 * MIN_MS && ref[S_GAUGE].t[i] < T0 + 59 * MIN_MS;
    assert_true(want > 150);
    if (res->value.samples[0].v != (double)want)
        fprintf(stderr, "count_over_time: got %g want %zu\n", res->value.samples[0].v, want);
    assert_true(res->value.samples[0].v == (double)want);
    /* ... and since that window is not whole buckets ([T0+30m-2, T0+60m-2] is answered with
     * [T0+29m, T0+59m)), the result says it is approximate. */
    assert_int_equal(res->nwarnings, 1);
    assert_non_null(strstr(res->warnings[0], "1m roll-ups"));
    assert_non_null(strstr(res->warnings[0], "approximate"));
    promql_result_free(res);
    querier_close(q);
    promql_ast_free(ast);
}

/* Warnings where roll-ups answer approximately, none where they are exact or raw data answers. */
static void test_promql_rollup_warnings(void **state)
{
    struct {
        const char *q;
        int64_t t;
        size_t nwarn;
    } cases[] = {
        /* whole buckets: [T0+30m, T0+60m] holds buckets 30..59, exactly the raw [T0+30m, T0+60m) */
        {"count_over_time(flink_ratio[30m])", T0 + 60 * MIN_MS, 0},
        {"sum_over_time(flink_ratio[30m])", T0 + 60 * MIN_MS, 0},
        {"max_over_time(flink_ratio[10m])", T0 + 60 * MIN_MS, 0},
        {"min_over_time(flink_ratio[10m])", T0 + 60 * MIN_MS, 0},
        /* not whole buckets, or not an exact aggregate */
        {"max_over_time(flink_ratio[10m])", T0 + 60 * MIN_MS + 15000, 1},
        {"max_over_time(flink_ratio[90s])", T0 + 60 * MIN_MS, 1},
        {"avg_over_time(flink_ratio[30m])", T0 + 60 * MIN_MS, 1},
        {"rate(flink_ratio[30m])", T0 + 60 * MIN_MS, 1},
        {"flink_ratio", T0 + 60 * MIN_MS, 1},
        /* raw data only */
        {"avg_over_time(flink_ratio[5m])", fake_now, 0},
        {"flink_ratio", fake_now, 0},
    };
    querier_t *q = storage_querier(st);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[256];
        promql_ast_t *ast = promql_parse(cases[i].q, err, sizeof(err));
        assert_non_null(ast);
        promql_result_t *res = promql_exec_instant(q, ast, cases[i].t, NULL);
        assert_int_equal(res->err_kind, PROMQL_ERR_NONE);
        assert_true(res->value.nsamples == 1);
        if (res->nwarnings != cases[i].nwarn)
            fail_msg("%s at %lld: %zu warnings, want %zu", cases[i].q, (long long)cases[i].t, res->nwarnings,
                     cases[i].nwarn);
        if (i == 0) {
            size_t want = 0;
            for (size_t k = 0; k < ref[S_GAUGE].n; k++)
                want += ref[S_GAUGE].t[k] >= T0 + 30 * MIN_MS && ref[S_GAUGE].t[k] < T0 + 60 * MIN_MS;
            assert_true(res->value.samples[0].v == (double)want);
        }
        promql_result_free(res);
        promql_ast_free(ast);
    }
    /* The step-mode opt-in inside raw retention: roll-ups, and a warning naming it. */
    char err[256];
    promql_ast_t *ast = promql_parse("sum_over_time(flink_ratio[5m])", err, sizeof(err));
    promql_opts_t o = {.rollup_step = true};
    promql_result_t *res = promql_exec_range(q, ast, fake_now - 20 * MIN_MS, fake_now - 7000, MIN_MS, &o);
    assert_int_equal(res->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(res->nwarnings, 1);
    assert_non_null(strstr(res->warnings[0], "rollups=step"));
    promql_result_free(res);
    res = promql_exec_range(q, ast, fake_now - 20 * MIN_MS, fake_now - 7000, MIN_MS, NULL);
    assert_int_equal(res->nwarnings, 0);
    promql_result_free(res);
    promql_ast_free(ast);
    querier_close(q);
}

static void test_history_aggregates(void **state)
{
    int64_t mint = T0 + 10 * MIN_MS, maxt = fake_now;
    struct {
        const char *func;
        double (*pick)(const dagg_t *);
    } cases[] = {{"max_over_time", pick_max},     {"min_over_time", pick_min},  {"sum_over_time", pick_sum},
                 {"count_over_time", pick_count}, {"avg_over_time", pick_mean}, {NULL, pick_last},
                 {"last_over_time", pick_last}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        querier_hints_t h = {
            .start_ms = mint, .end_ms = maxt, .step_ms = 15000, .range_ms = 5 * MIN_MS, .func = cases[c].func};
        got_t g;
        query_name(S_GAUGE, mint, maxt, &h, &g);
        assert_int_equal(g.nseries, 1);
        assert_int_equal(g.res, MIN_MS);
        size_t nsynth = check_stitched(S_GAUGE, &g, MIN_MS, cases[c].pick);
        /* raw retention is 30m: the first ~2h20m come from roll-ups */
        assert_true(nsynth >= 135 && nsynth <= 141);
        assert_true(g.n > nsynth + 150);
    }
    /* Inside raw retention: raw only. */
    querier_hints_t h = {.func = "max_over_time", .range_ms = 5 * MIN_MS, .step_ms = 15000};
    got_t g;
    query_name(S_GAUGE, fake_now - 10 * MIN_MS, fake_now, &h, &g);
    assert_int_equal(g.rollup_until, 0);
    assert_int_equal(check_stitched(S_GAUGE, &g, MIN_MS, NULL), 0);
    assert_true(g.n >= 59);
}

/* rate/increase: a synthetic counter whose steps are the buckets' reset-adjusted increases and
 * whose last value is the real one, so the reset-adjusted increase over the whole answer
 * (synthetic + raw) equals the direct one over the raw samples. */
static void test_history_counter(void **state)
{
    int64_t mint = T0 + 10 * MIN_MS, maxt = fake_now;
    querier_hints_t h = {.func = "rate", .range_ms = 5 * MIN_MS, .step_ms = 15000};
    got_t g;
    query_name(S_COUNTER, mint, maxt, &h, &g);
    size_t nsynth = check_stitched(S_COUNTER, &g, MIN_MS, NULL);
    assert_true(nsynth > 100);
    for (size_t i = 1; i < nsynth; i++) {
        assert_true(g.v[i] >= g.v[i - 1]); /* monotonic: no false resets */
        dagg_t d = direct(S_COUNTER, g.t[i] + 1 - MIN_MS, MIN_MS);
        assert_true(fabs((g.v[i] - g.v[i - 1]) - d.increase) < 1e-6);
    }
    dagg_t dl = direct(S_COUNTER, g.t[nsynth - 1] + 1 - MIN_MS, MIN_MS);
    assert_true(g.v[nsynth - 1] == dl.last); /* anchored at the real value */
    double got_inc = 0;
    for (size_t i = 1; i < g.n; i++)
        got_inc += g.v[i] >= g.v[i - 1] ? g.v[i] - g.v[i - 1] : g.v[i];
    double want_inc = 0;
    int64_t from = g.t[0] + 1 - MIN_MS + MIN_MS; /* the first bucket contributes no step */
    for (size_t j = 1; j < ref[S_COUNTER].n; j++)
        if (ref[S_COUNTER].t[j] >= from)
            want_inc += ref[S_COUNTER].v[j] >= ref[S_COUNTER].v[j - 1] ? ref[S_COUNTER].v[j] - ref[S_COUNTER].v[j - 1]
                                                                       : ref[S_COUNTER].v[j];
    assert_true(fabs(got_inc - want_inc) < 1e-6);
}

/* History queries whose every window is whole hours, for an aggregate whole buckets answer
 * exactly, read the 1h roll-ups (60x fewer buckets than 1m, the same answer); anything else
 * keeps the finest resolution that fits. Through the engine: no warning, and the values of the
 * raw samples. */
static void test_history_coarse_when_exact(void **state)
{
    struct {
        const char *func;
        int64_t mint, maxt, range, step, start, end;
        int64_t want_res;
    } cases[] = {
        /* range query 1h..2h step 1h over [1h]: windows [0h,1h], [1h,2h] */
        {"max_over_time", T0, T0 + 2 * HOUR_MS, HOUR_MS, HOUR_MS, T0 + HOUR_MS, T0 + 2 * HOUR_MS, HOUR_MS},
        {"count_over_time", T0, T0 + 2 * HOUR_MS, HOUR_MS, HOUR_MS, T0 + HOUR_MS, T0 + 2 * HOUR_MS, HOUR_MS},
        /* instant query (one window) */
        {"sum_over_time", T0, T0 + 2 * HOUR_MS, 2 * HOUR_MS, 0, T0 + 2 * HOUR_MS, T0 + 2 * HOUR_MS, HOUR_MS},
        /* not an exact aggregate */
        {"avg_over_time", T0, T0 + 2 * HOUR_MS, HOUR_MS, HOUR_MS, T0 + HOUR_MS, T0 + 2 * HOUR_MS, MIN_MS},
        {"rate", T0, T0 + 2 * HOUR_MS, HOUR_MS, HOUR_MS, T0 + HOUR_MS, T0 + 2 * HOUR_MS, MIN_MS},
        /* windows not whole hours: range, start, step */
        {"max_over_time", T0, T0 + 2 * HOUR_MS, 30 * MIN_MS, HOUR_MS, T0 + 30 * MIN_MS, T0 + 90 * MIN_MS, MIN_MS},
        {"max_over_time", T0 + MIN_MS, T0 + 2 * HOUR_MS + MIN_MS, HOUR_MS, HOUR_MS, T0 + HOUR_MS + MIN_MS,
         T0 + 2 * HOUR_MS + MIN_MS, MIN_MS},
        {"max_over_time", T0, T0 + 2 * HOUR_MS, HOUR_MS, 30 * MIN_MS, T0 + HOUR_MS, T0 + 2 * HOUR_MS, MIN_MS},
        /* [mint, maxt] wider than the windows (a subquery, two offsets): unknown windows */
        {"max_over_time", T0, T0 + 2 * HOUR_MS, HOUR_MS, HOUR_MS, T0 + 2 * HOUR_MS, T0 + 2 * HOUR_MS, MIN_MS},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        querier_hints_t h = {.start_ms = cases[c].start,
                             .end_ms = cases[c].end,
                             .step_ms = cases[c].step,
                             .range_ms = cases[c].range,
                             .func = cases[c].func};
        got_t g;
        query_name(S_GAUGE, cases[c].mint, cases[c].maxt, &h, &g);
        assert_int_equal(g.nseries, 1);
        if (g.res != cases[c].want_res)
            fail_msg("case %zu (%s): resolution %lld, want %lld", c, cases[c].func, (long long)g.res,
                     (long long)cases[c].want_res);
        check_stitched(S_GAUGE, &g, g.res, NULL);
    }
    /* Through the engine: max_over_time(flink_ratio[1h]) at T0+1h, T0+2h is exact from 1h
     * buckets (the raw data starts at ~T0+2h30m). */
    char err[256];
    promql_ast_t *ast = promql_parse("max_over_time(flink_ratio[1h])", err, sizeof(err));
    assert_non_null(ast);
    querier_t *q = storage_querier(st);
    promql_result_t *res = promql_exec_range(q, ast, T0 + HOUR_MS, T0 + 2 * HOUR_MS, HOUR_MS, NULL);
    assert_int_equal(res->err_kind, PROMQL_ERR_NONE);
    assert_int_equal(res->nwarnings, 0);
    assert_int_equal(res->value.nseries, 1);
    assert_int_equal(res->value.series[0].npoints, 2);
    for (size_t i = 0; i < 2; i++) {
        int64_t te = res->value.series[0].points[i].t;
        double want = -INFINITY;
        for (size_t k = 0; k < ref[S_GAUGE].n; k++) {
            assert_true(ref[S_GAUGE].t[k] != te); /* else [te-1h, te] and the buckets differ */
            if (ref[S_GAUGE].t[k] >= te - HOUR_MS && ref[S_GAUGE].t[k] < te)
                want = fmax(want, ref[S_GAUGE].v[k]);
        }
        assert_true(res->value.series[0].points[i].v == want);
    }
    promql_result_free(res);
    promql_ast_free(ast);
    querier_close(q);
}

/* Step >= 1m inside raw retention: raw samples, exactly what Prometheus would read, unless the
 * caller opts in to step mode (rollup_step): then complete 1m buckets up to the last minute
 * boundary, raw after it. A step of 1h with a 5m range cannot use the 1h buckets (range too
 * short). */
static void test_step_mode(void **state)
{
    int64_t mint = fake_now - 20 * MIN_MS, maxt = fake_now - 7000;
    querier_hints_t h = {.func = "sum_over_time", .range_ms = 5 * MIN_MS, .step_ms = MIN_MS};
    got_t g;
    const char *plain[] = {NULL, "rate", "sum_over_time", "avg_over_time", "idelta"};
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
        for (int64_t step = MIN_MS; step <= HOUR_MS; step *= 60) {
            querier_hints_t raw = {.func = plain[i], .range_ms = plain[i] ? 5 * MIN_MS : 0, .step_ms = step};
            query_name(S_GAUGE, mint, maxt, &raw, &g);
            assert_int_equal(g.rollup_until, 0);
            assert_int_equal(check_stitched(S_GAUGE, &g, MIN_MS, NULL), 0);
        }
    }
    h.rollup_step = true;
    query_name(S_GAUGE, mint, maxt, &h, &g);
    assert_int_equal(g.res, MIN_MS);
    assert_int_equal(g.rollup_until, floor_to(maxt, MIN_MS));
    size_t nsynth = check_stitched(S_GAUGE, &g, MIN_MS, pick_sum);
    assert_int_equal(nsynth, 19); /* buckets 2h40m .. 2h58m; raw from 2h59m */
    h.step_ms = HOUR_MS;
    query_name(S_GAUGE, mint, maxt, &h, &g);
    assert_int_equal(g.res, MIN_MS);
    h.range_ms = HOUR_MS;
    query_name(S_GAUGE, fake_now - 2 * HOUR_MS, maxt, &h, &g);
    assert_int_equal(g.res, HOUR_MS);
    check_stitched(S_GAUGE, &g, HOUR_MS, pick_sum);
    /* Step below every resolution: raw. */
    h = (querier_hints_t){.func = "sum_over_time", .range_ms = 5 * MIN_MS, .step_ms = 30000};
    query_name(S_GAUGE, mint, maxt, &h, &g);
    assert_int_equal(g.rollup_until, 0);
}

/* c_gone left memory long ago: found through the catalog, with every matcher type. */
static void test_catalog_only_series(void **state)
{
    int64_t mint = T0, maxt = fake_now;
    struct {
        matcher_type_t t;
        const char *name, *value;
        bool found;
    } cases[][2] = {
        {{MATCHER_EQ, "__name__", "c_gone", true}, {MATCHER_EQ, "job", "etl", true}},
        {{MATCHER_RE, "__name__", "c_g.*", true}, {MATCHER_NEQ, "job", "other", true}},
        {{MATCHER_RE, "__name__", "c_gone|nothing", true}, {MATCHER_EQ, "missing", "", true}},
        {{MATCHER_RE, "gone_label", ".+", true}, {MATCHER_NRE, "job", "x.*", true}},
        {{MATCHER_EQ, "__name__", "c_gone", true}, {MATCHER_EQ, "job", "nope", false}},
        {{MATCHER_EQ, "__name__", "c_gone", true}, {MATCHER_NRE, "job", "etl", false}},
        {{MATCHER_EQ, "__name__", "c_gone", true}, {MATCHER_RE, "missing", ".+", false}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        matcher_t *ms[2] = {mk(cases[c][0].t, cases[c][0].name, cases[c][0].value),
                            mk(cases[c][1].t, cases[c][1].name, cases[c][1].value)};
        got_t g;
        query((const matcher_t *const *)ms, 2, mint, maxt, NULL, &g);
        bool want = cases[c][1].found;
        if (!want) {
            assert_int_equal(g.nseries, 0);
        } else {
            assert_int_equal(g.nseries, 1);
            assert_int_equal(check_stitched(S_GONE, &g, MIN_MS, pick_last), 30);
        }
        matcher_free(ms[0]);
        matcher_free(ms[1]);
    }
    /* A range inside raw retention does not find it. */
    got_t g;
    query_name(S_GONE, fake_now - 10 * MIN_MS, maxt, NULL, &g);
    assert_int_equal(g.nseries, 0);
    /* Its raw samples are gone from memory. */
    head_stats_t hs;
    head_get_stats(storage_head(st), &hs);
    assert_int_equal(hs.series, 2);
}

static bool has(const char **v, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], s) == 0)
            return true;
    return false;
}

static void test_label_names_values_time_range(void **state)
{
    querier_t *q = storage_querier(st);
    arena_t *a = arena_create(0);
    const char **v;
    size_t n;
    char err[128];
    /* recent: only the live series */
    assert_int_equal(
        querier_label_values(q, "__name__", NULL, 0, fake_now - 10 * MIN_MS, fake_now, a, &v, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 2);
    assert_false(has(v, n, "c_gone"));
    assert_int_equal(querier_label_names(q, NULL, 0, fake_now - 10 * MIN_MS, fake_now, a, &v, &n, err, sizeof(err)), 0);
    assert_false(has(v, n, "gone_label"));
    assert_true(has(v, n, "task"));
    /* history: the catalog adds c_gone */
    assert_int_equal(querier_label_values(q, "__name__", NULL, 0, T0, fake_now, a, &v, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 3);
    assert_string_equal(v[0], "c_gone");
    assert_int_equal(querier_label_names(q, NULL, 0, T0, T0 + 5 * MIN_MS, a, &v, &n, err, sizeof(err)), 0);
    assert_true(has(v, n, "gone_label"));
    /* with matchers, history */
    matcher_t *m = mk(MATCHER_RE, "__name__", "c_.*");
    assert_int_equal(querier_label_names(q, (const matcher_t *const *)&m, 1, T0, fake_now, a, &v, &n, err, sizeof(err)),
                     0);
    assert_int_equal(n, 3);
    assert_true(has(v, n, "gone_label") && has(v, n, "job") && has(v, n, "__name__"));
    /* with matchers, recent: nothing */
    assert_int_equal(querier_label_values(q, "job", (const matcher_t *const *)&m, 1, fake_now - MIN_MS, fake_now, a, &v,
                                          &n, err, sizeof(err)),
                     0);
    assert_int_equal(n, 0);
    matcher_free(m);
    /* a range before any data, and one in the future */
    assert_int_equal(
        querier_label_values(q, "__name__", NULL, 0, T0 - 2 * HOUR_MS, T0 - HOUR_MS, a, &v, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 0);
    assert_int_equal(
        querier_label_names(q, NULL, 0, fake_now + HOUR_MS, fake_now + 2 * HOUR_MS, a, &v, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 0);
    arena_destroy(a);
    querier_close(q);
}

/* One select over series with history (roll-ups + raw), one found only in the catalog, and a
 * young one with raw data only: the young one gets no synthetic samples, the others are
 * stitched as always; the same select repeated (the roll-up tier now knows the young series has
 * nothing on disk and skips SQLite for it) and repeated with the roll-up writer committing in
 * the middle of the iteration (the set's read transaction is renewed) answers identically. */
typedef struct {
    char name[64];
    int64_t t[2048];
    double v[2048];
    size_t n;
    int64_t rollup_until;
} one_t;

static size_t select_all(const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, const querier_hints_t *h,
                         bool flush_midway, one_t *out, size_t max)
{
    querier_t *q = storage_querier(st);
    querier_set_t *set = querier_select(q, ms, n, mint, maxt, h);
    const querier_series_t *s;
    size_t k = 0;
    while ((s = querier_set_next(set))) {
        assert_true(k < max);
        one_t *o = &out[k++];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", labels_get(&s->labels, "__name__"));
        o->rollup_until = s->rollup_until;
        querier_iter_t it;
        querier_iter_init(&it, s, mint, maxt);
        while (o->n < 2048 && querier_iter_next(&it, &o->t[o->n], &o->v[o->n]))
            o->n++;
        if (flush_midway && k == 1)
            assert_int_equal(storage_flush(st), STORAGE_OK);
    }
    assert_null(querier_set_error(set));
    querier_set_free(set);
    querier_close(q);
    return k;
}

static void test_history_young_and_old_series(void **state)
{
    raw_t young = {0};
    for (int64_t t = fake_now - 5 * MIN_MS; t < fake_now; t += 10000) {
        label_t l[3] = {{"__name__", "flink_young"}, {"job", "etl"}, {"task", "y"}};
        storage_sample_t smp = {.labels = {l, 3}, .t = t, .v = (double)(t / 1000 % 300)};
        storage_append_result_t r;
        assert_int_equal(storage_append(st, &smp, 1, &r), STORAGE_OK);
        raw_push(&young, t, smp.v);
    }
    matcher_t *m = mk(MATCHER_EQ, "job", "etl");
    int64_t mint = T0, maxt = fake_now;
    querier_hints_t h = {
        .start_ms = mint + 5 * MIN_MS, .end_ms = maxt, .step_ms = 15000, .range_ms = 5 * MIN_MS, .func = "rate"};
    static one_t runs[3][4];
    size_t n[3];
    for (int r = 0; r < 3; r++)
        n[r] = select_all((const matcher_t *const *)&m, 1, mint, maxt, &h, r == 2, runs[r], 4);
    const char *want[4] = {"c_gone", "flink_ratio", "flink_records_total", "flink_young"};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(n[r], 4);
        for (int k = 0; k < 4; k++) {
            const one_t *o = &runs[r][k], *o0 = &runs[0][k];
            assert_string_equal(o->name, want[k]);
            assert_int_equal(o->n, o0->n);
            assert_int_equal(o->rollup_until, o0->rollup_until);
            for (size_t i = 0; i < o->n; i++) {
                assert_int_equal(o->t[i], o0->t[i]);
                assert_memory_equal(&o->v[i], &o0->v[i], sizeof(double));
            }
        }
    }
    /* The young series: its raw samples, nothing synthetic. */
    const one_t *y = &runs[0][3];
    assert_int_equal(y->rollup_until, 0);
    assert_int_equal(y->n, young.n);
    for (size_t i = 0; i < young.n; i++) {
        assert_int_equal(y->t[i], young.t[i]);
        assert_true(y->v[i] == young.v[i]);
    }
    /* The old ones: roll-ups, then raw, as the single-series selects give them. */
    for (int k = 0; k < 3; k++) {
        got_t g;
        int which = k == 0 ? S_GONE : k == 1 ? S_GAUGE : S_COUNTER;
        query_name(which, mint, maxt, &h, &g);
        assert_int_equal(g.n, runs[0][k].n);
        assert_true(runs[0][k].rollup_until > 0);
        for (size_t i = 0; i < g.n; i++) {
            assert_int_equal(g.t[i], runs[0][k].t[i]);
            assert_memory_equal(&g.v[i], &runs[0][k].v[i], sizeof(double));
        }
        check_stitched(which, &g, MIN_MS, NULL);
    }
    matcher_free(m);
    free(young.t);
    free(young.v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agg_table),
        cmocka_unit_test(test_history_aggregates),
        cmocka_unit_test(test_promql_count_over_roll_ups),
        cmocka_unit_test(test_promql_rollup_warnings),
        cmocka_unit_test(test_history_counter),
        cmocka_unit_test(test_history_coarse_when_exact),
        cmocka_unit_test(test_step_mode),
        cmocka_unit_test(test_catalog_only_series),
        cmocka_unit_test(test_label_names_values_time_range),
        cmocka_unit_test(test_history_young_and_old_series), /* last: adds a series */
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
