/* Unit tests for storage/rollup.c: aggregates against a direct computation over the raw samples
 * (counter resets, NaN, staleness markers, bucket boundaries, close/reopen with partial buckets),
 * retention (also the writer's, on the configured clock), the rollup_1h view, and the
 * bytes-per-bucket figure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal/util/varint.h"
#include "storage/catalog.h"
#include "storage/rollup.h"

#define MIN_MS 60000LL
#define HOUR_MS 3600000LL
#define DAY_MS 86400000LL
#define T0 1700000040000LL /* a multiple of 1m but not of 1h */

static double stale_nan(void)
{
    uint64_t u = 0x7ff0000000000002ull;
    double v;
    memcpy(&v, &u, 8);
    return v;
}

static bool is_stale(double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    return u == 0x7ff0000000000002ull;
}

static char *make_dir(void)
{
    char *d = strdup("/tmp/sluice-rollup-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void remove_dir(char *d)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

typedef struct {
    char *dir;
    catalog_t *cat;
    rollup_t *r;
    const char *res;
} fx_t;

static void fx_open(fx_t *f)
{
    char err[256] = "";
    f->cat = catalog_open(f->dir, err, sizeof(err));
    assert_non_null(f->cat);
    rollup_config_t cfg = {.resolutions = f->res, .no_thread = true};
    f->r = rollup_open(f->cat, &cfg, err, sizeof(err));
    if (!f->r)
        fail_msg("rollup_open: %s", err);
}

static void fx_close(fx_t *f)
{
    rollup_close(f->r);
    catalog_close(f->cat);
    f->r = NULL;
    f->cat = NULL;
}

static void add(rollup_t *r, uint64_t id, int64_t t, double v)
{
    rollup_sample_t s = {id, t, v};
    rollup_add_samples(r, &s, 1);
}

/* ---- the reference: a direct computation over raw samples --------------------------------- */

typedef struct {
    rollup_buckets_t b;
    double prev;
    bool prev_ok;
    int64_t last_t;
} ref_t;

static void ref_add(ref_t *ref, int64_t res, int64_t t, double v)
{
    if (t <= ref->last_t)
        return;
    ref->last_t = t;
    if (is_stale(v)) {
        ref->prev_ok = false;
        return;
    }
    double inc = 0;
    if (!isnan(v)) {
        if (ref->prev_ok)
            inc = v >= ref->prev ? v - ref->prev : v;
        ref->prev = v;
        ref->prev_ok = true;
    }
    int64_t ts = t - (((t % res) + res) % res);
    rollup_buckets_t *b = &ref->b;
    if (b->n == 0 || b->v[b->n - 1].ts != ts) {
        if (b->n == b->cap) {
            b->cap = b->cap ? b->cap * 2 : 64;
            b->v = realloc(b->v, b->cap * sizeof(*b->v));
        }
        b->v[b->n++] = (rollup_bucket_t){.ts = ts, .min = NAN, .max = NAN};
    }
    rollup_bucket_t *x = &b->v[b->n - 1];
    x->count++;
    x->sum += v;
    if (!isnan(v) && (isnan(x->min) || v < x->min))
        x->min = v;
    if (!isnan(v) && (isnan(x->max) || v > x->max))
        x->max = v;
    x->last = v;
    x->increase += inc;
}

static int64_t floor_to_hour(int64_t t)
{
    return t - (((t % HOUR_MS) + HOUR_MS) % HOUR_MS);
}

static bool close_enough(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    if (a == b)
        return true;
    return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b));
}

static void assert_same(const rollup_buckets_t *got, const rollup_buckets_t *want, const char *what)
{
    if (got->n != want->n)
        fail_msg("%s: %zu buckets (%lld..%lld), want %zu (%lld..%lld)", what, got->n,
                 got->n ? (long long)got->v[0].ts : 0, got->n ? (long long)got->v[got->n - 1].ts : 0, want->n,
                 want->n ? (long long)want->v[0].ts : 0, want->n ? (long long)want->v[want->n - 1].ts : 0);
    for (size_t i = 0; i < want->n; i++) {
        const rollup_bucket_t *g = &got->v[i], *w = &want->v[i];
        if (g->ts != w->ts || g->count != w->count || !close_enough(g->sum, w->sum) || !close_enough(g->min, w->min) ||
            !close_enough(g->max, w->max) || !close_enough(g->last, w->last) || !close_enough(g->increase, w->increase))
            fail_msg("%s: bucket %zu: got ts=%lld n=%llu sum=%g min=%g max=%g last=%g inc=%g;"
                     " want ts=%lld n=%llu sum=%g min=%g max=%g last=%g inc=%g",
                     what, i, (long long)g->ts, (unsigned long long)g->count, g->sum, g->min, g->max, g->last,
                     g->increase, (long long)w->ts, (unsigned long long)w->count, w->sum, w->min, w->max, w->last,
                     w->increase);
    }
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_parse_resolutions(void **state)
{
    rollup_resolutions_t rs;
    char err[256];
    assert_int_equal(rollup_parse_resolutions("1m:15d,1h:400d", &rs, err, sizeof(err)), 0);
    assert_int_equal(rs.n, 2);
    assert_int_equal(rs.v[0].res_ms, MIN_MS);
    assert_int_equal(rs.v[0].retention_ms, 15 * DAY_MS);
    assert_int_equal(rs.v[1].res_ms, HOUR_MS);
    assert_int_equal(rs.v[1].retention_ms, 400 * DAY_MS);
    assert_int_equal(rollup_parse_resolutions("5m:2d", &rs, err, sizeof(err)), 0);
    assert_int_equal(rs.n, 1);
    assert_int_equal(rollup_parse_resolutions("", &rs, err, sizeof(err)), -1);
    assert_int_equal(rollup_parse_resolutions("1m", &rs, err, sizeof(err)), -1);
    assert_int_equal(rollup_parse_resolutions("1h:1d,1m:15d", &rs, err, sizeof(err)), -1);   /* not increasing */
    assert_int_equal(rollup_parse_resolutions("1m:15d,90s:20d", &rs, err, sizeof(err)), -1); /* not a multiple */
    assert_int_equal(rollup_parse_resolutions("1h:30m", &rs, err, sizeof(err)), -1);         /* retention < res */
    assert_int_equal(rollup_parse_resolutions("500ms:1d", &rs, err, sizeof(err)), -1);
    assert_int_equal(rollup_parse_resolutions("1m:15d,,1h:400d", &rs, err, sizeof(err)), 0); /* strtok: empty skipped */
    assert_int_equal(rollup_parse_resolutions("1m:x", &rs, err, sizeof(err)), -1);
}

static void test_pick_resolution(void **state)
{
    rollup_resolutions_t rs;
    char err[256];
    assert_int_equal(rollup_parse_resolutions("1m:15d,1h:400d", &rs, err, sizeof(err)), 0);
    int64_t now = T0;
    assert_int_equal(rollup_pick_resolution(&rs, now, now - DAY_MS, 5 * MIN_MS), 0);
    assert_int_equal(rollup_pick_resolution(&rs, now, now - DAY_MS, 2 * HOUR_MS), 0);
    assert_int_equal(rollup_pick_resolution(&rs, now, now - DAY_MS, 15000), 0); /* step finer than all */
    assert_int_equal(rollup_pick_resolution(&rs, now, now - 30 * DAY_MS, 5 * MIN_MS), 1);
    assert_int_equal(rollup_pick_resolution(&rs, now, now - 500 * DAY_MS, 5 * MIN_MS), 1); /* none covers */
}

/* Random counters with resets and gauges with NaN and staleness markers, fed across many bucket
 * boundaries with flushes in between and a close/reopen in the middle of a bucket (partial
 * buckets merge), with the samples before the restart replayed (must be ignored). */
static void test_random_against_direct(void **state)
{
    enum { NSERIES = 12 };
    fx_t f = {.dir = make_dir(), .res = "1m:15d,1h:400d"};
    fx_open(&f);
    srand(42);
    ref_t ref[2][NSERIES];
    memset(ref, 0, sizeof(ref));
    double val[NSERIES] = {0};
    for (int s = 0; s < NSERIES; s++)
        for (int k = 0; k < 2; k++)
            ref[k][s].last_t = INT64_MIN;
    const int64_t res[2] = {MIN_MS, HOUR_MS};
    const int64_t end = T0 + 5 * HOUR_MS + 17 * MIN_MS;
    const int64_t restart_at = T0 + 2 * HOUR_MS + 23 * MIN_MS + 31000; /* mid-bucket for both */
    bool restarted = false;
    int64_t next_flush = T0 + 7 * MIN_MS;
    for (int64_t t = T0 + 3000; t < end; t += 10000) {
        if (!restarted && t >= restart_at) {
            fx_close(&f);
            fx_open(&f);
            restarted = true;
            /* A WAL replay re-feeds what the roll-up already saw: must change nothing. (A sample
             * in the newest second itself would replace the newest sample: see
             * test_same_second_replace.) */
            for (int s = 0; s < NSERIES; s++)
                add(f.r, (uint64_t)s + 1, ref[0][s].last_t - 1000, 12345.0);
            rollup_stats_t st;
            rollup_get_stats(f.r, &st);
            assert_int_equal(st.samples_ignored, NSERIES);
        }
        for (int s = 0; s < NSERIES; s++) {
            if (rand() % 9 == 0)
                continue;                   /* a missed push */
            int64_t ts = t + rand() % 5000; /* jitter */
            double v;
            int kind = rand() % 100;
            if (s % 2 == 0) { /* counter */
                if (kind < 3)
                    val[s] = rand() % 50; /* reset */
                else
                    val[s] += rand() % 1000;
                v = val[s];
            } else { /* gauge */
                v = (rand() % 10000) / 7.0;
            }
            if (kind >= 97)
                v = stale_nan();
            else if (kind == 96 && s % 4 == 1)
                v = NAN;
            add(f.r, (uint64_t)s + 1, ts, v);
            for (int k = 0; k < 2; k++)
                ref_add(&ref[k][s], res[k], ts, v);
        }
        if (t >= next_flush) {
            assert_int_equal(rollup_flush(f.r, rand() % 2 == 0), 0);
            next_flush += (rand() % 20 + 1) * MIN_MS;
        }
    }
    /* Before and after the last flush, open buckets included. */
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1)
            assert_int_equal(rollup_flush(f.r, true), 0);
        if (pass == 2) {
            fx_close(&f);
            fx_open(&f);
        }
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < NSERIES; s++) {
                rollup_buckets_t got = {0};
                assert_int_equal(rollup_read(f.r, (uint64_t)s + 1, (size_t)k, INT64_MIN, INT64_MAX, &got), 0);
                char what[64];
                snprintf(what, sizeof(what), "pass %d res %d series %d", pass, k, s);
                assert_same(&got, &ref[k][s].b, what);
                /* A sub-range gives exactly the buckets whose start lies in it. */
                rollup_buckets_free(&got);
                int64_t lo = T0 + HOUR_MS + 30 * MIN_MS, hi = T0 + 3 * HOUR_MS;
                assert_int_equal(rollup_read(f.r, (uint64_t)s + 1, (size_t)k, lo, hi, &got), 0);
                size_t want = 0;
                for (size_t i = 0; i < ref[k][s].b.n; i++)
                    want += ref[k][s].b.v[i].ts >= lo && ref[k][s].b.v[i].ts <= hi;
                assert_int_equal(got.n, want);
                for (size_t i = 0; i < got.n; i++)
                    assert_true(got.v[i].ts >= lo && got.v[i].ts <= hi);
                rollup_buckets_free(&got);
            }
    }
    fx_close(&f);
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < NSERIES; s++)
            free(ref[k][s].b.v);
    remove_dir(f.dir);
}

/* The in-memory state keeps one `last` for all of a series' open buckets and 32-bit counts: with
 * three resolutions, buckets closing in one resolution but not the others, staleness markers
 * (not aggregated: last stays), NaN (aggregated), checkpoints and a restart between buckets, every
 * resolution still agrees with the direct computation. */
static void test_three_resolutions_against_direct(void **state)
{
    (void)state;
    enum { NS = 6, NR = 3 };
    fx_t f = {.dir = make_dir(), .res = "1m:15d,10m:30d,1h:400d"};
    fx_open(&f);
    const int64_t res[NR] = {MIN_MS, 10 * MIN_MS, HOUR_MS};
    ref_t ref[NR][NS];
    memset(ref, 0, sizeof(ref));
    for (int k = 0; k < NR; k++)
        for (int s = 0; s < NS; s++)
            ref[k][s].last_t = INT64_MIN;
    srand(7);
    double val[NS] = {0};
    const int64_t end = T0 + 3 * HOUR_MS + 41 * MIN_MS;
    for (int64_t t = T0 + 1000, i = 0; t < end; t += 7000, i++) {
        if (i == 900) { /* mid-bucket in every resolution: open buckets via the checkpoint */
            fx_close(&f);
            fx_open(&f);
        }
        for (int s = 0; s < NS; s++) {
            int kind = rand() % 100;
            if (kind < 10)
                continue;
            double v = s % 2 ? (double)(rand() % 1000) / 3.0 : (val[s] += rand() % 100);
            if (kind >= 95)
                v = stale_nan();
            else if (kind >= 92)
                v = NAN;
            else if (s % 2 == 0 && kind < 12)
                v = val[s] = rand() % 10; /* counter reset */
            add(f.r, (uint64_t)s + 100, t, v);
            for (int k = 0; k < NR; k++)
                ref_add(&ref[k][s], res[k], t, v);
        }
        if (i % 97 == 0)
            assert_int_equal(rollup_flush(f.r, i % 2 == 0), 0);
    }
    /* The newest sample of each series is held back as pending: reads show it as aggregated. */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            fx_close(&f);
            fx_open(&f);
        }
        for (int k = 0; k < NR; k++)
            for (int s = 0; s < NS; s++) {
                rollup_buckets_t got = {0};
                assert_int_equal(rollup_read(f.r, (uint64_t)s + 100, (size_t)k, INT64_MIN, INT64_MAX, &got), 0);
                char what[64];
                snprintf(what, sizeof(what), "pass %d res %d series %d", pass, k, s);
                assert_same(&got, &ref[k][s].b, what);
                rollup_buckets_free(&got);
            }
    }
    fx_close(&f);
    for (int k = 0; k < NR; k++)
        for (int s = 0; s < NS; s++)
            free(ref[k][s].b.v);
    remove_dir(f.dir);
}

/* disk_lo (what memory knows of the oldest stored bucket) is kept as a 32-bit multiple of the
 * resolution: at 1s past 2038 it saturates, and must stay a lower bound — a read of the stored
 * buckets is never skipped, a read of a range before them may be. */
static void test_disk_lo_saturates_as_lower_bound(void **state)
{
    (void)state;
    fx_t f = {.dir = make_dir(), .res = "1s:400d,1m:400d"};
    fx_open(&f);
    const int64_t t2100 = 4102444800000LL; /* 2100-01-01, 4.1e9 s: past INT32_MAX seconds */
    for (int i = 0; i < 30; i++)
        add(f.r, 9, t2100 + i * 1000, i);
    rollup_close_buckets_before(f.r, INT64_MAX);
    assert_int_equal(rollup_flush(f.r, true), 0);
    rollup_reader_t *rd = rollup_reader_open(f.r);
    assert_non_null(rd);
    rollup_buckets_t got = {0};
    /* Nothing before 2000: this read teaches the state its disk_lo. */
    assert_int_equal(rollup_reader_read(rd, 9, 0, 0, 946684800000LL, &got), 0);
    assert_int_equal(got.n, 0);
    for (int round = 0; round < 2; round++) {
        got.n = 0;
        assert_int_equal(rollup_reader_read(rd, 9, 0, t2100, t2100 + 60000, &got), 0);
        int want = round ? 40 : 30;
        assert_int_equal(got.n, want);
        assert_int_equal(got.v[0].ts, t2100);
        assert_true(got.v[want - 1].last == want - 1);
        got.n = 0;
        assert_int_equal(rollup_reader_read(rd, 9, 1, t2100 - HOUR_MS, t2100 + HOUR_MS, &got), 0);
        assert_int_equal(got.n, 1);
        assert_int_equal(got.v[0].count, want);
        assert_true(got.v[0].sum == want * (want - 1) / 2);
        /* More buckets after the state knew its disk_lo: still found. */
        for (int i = 30; i < 40 && round == 0; i++)
            add(f.r, 9, t2100 + i * 1000, i);
        if (round == 0) {
            rollup_close_buckets_before(f.r, INT64_MAX);
            assert_int_equal(rollup_flush(f.r, true), 0);
        }
    }
    got.n = 0;
    assert_int_equal(rollup_reader_read(rd, 9, 0, t2100 + 29000, t2100 + 60000, &got), 0);
    assert_int_equal(got.n, 11);
    rollup_buckets_free(&got);
    rollup_reader_close(rd);
    fx_close(&f);
    remove_dir(f.dir);
}

static void read1(rollup_t *r, uint64_t id, size_t res_idx, rollup_buckets_t *out)
{
    out->n = 0;
    assert_int_equal(rollup_read(r, id, res_idx, INT64_MIN, INT64_MAX, out), 0);
}

/* Hinted adds (the caller keeps a slot per series): the same aggregates as plain adds; a slot
 * learns its state; a stale slot (state evicted, its record reused by another series) is
 * detected and neither series is corrupted. */
static void test_hinted_adds(void **state)
{
    (void)state;
    enum { N = 300 };
    fx_t f = {.dir = make_dir(), .res = "1m:15d,1h:400d"};
    fx_open(&f);
    void *slot[N + 1000];
    memset(slot, 0, sizeof(slot));
    rollup_sample_t v[N];
    /* Series 1..N hinted, N+1..2N plain, the same values: same buckets. */
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++)
            v[i] = (rollup_sample_t){(uint64_t)i + 1, T0 + round * 20000, (double)(i * round)};
        rollup_add_samples_hinted(f.r, v, N, slot);
        for (int i = 0; i < N; i++)
            v[i].series_id += N;
        rollup_add_samples(f.r, v, N);
    }
    for (int i = 0; i < N; i++)
        assert_non_null(slot[i]);
    for (int i = 0; i < N; i += 7) {
        rollup_buckets_t a = {0}, b = {0};
        read1(f.r, (uint64_t)i + 1, 0, &a);
        read1(f.r, (uint64_t)i + 1 + N, 0, &b);
        assert_int_equal(a.n, 2);
        assert_same(&a, &b, "hinted vs plain");
        rollup_buckets_free(&a);
        rollup_buckets_free(&b);
    }
    /* Series 1..N go quiet; the others move on two hours: every 1..N state is evicted. */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            v[i] = (rollup_sample_t){(uint64_t)i + 1 + N, T0 + (2 + round) * HOUR_MS, 1};
        rollup_add_samples(f.r, v, N);
        assert_int_equal(rollup_flush(f.r, false), 0);
    }
    rollup_stats_t st;
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, N);
    /* New series take the freed records; the stale slots of 1..N must not reach them. */
    for (int i = 0; i < 1000; i++) {
        rollup_sample_t x = {(uint64_t)i + 5000, T0 + 4 * HOUR_MS, 42};
        rollup_add_samples_hinted(f.r, &x, 1, &slot[N + i]);
    }
    for (int i = 0; i < N; i++)
        v[i] = (rollup_sample_t){(uint64_t)i + 1, T0 + 4 * HOUR_MS + 1000, 7};
    void *before[N];
    memcpy(before, slot, sizeof(before));
    rollup_add_samples_hinted(f.r, v, N, slot);
    size_t moved = 0;
    for (int i = 0; i < N; i++)
        moved += slot[i] != before[i];
    assert_true(moved > 0); /* some stale slots pointed at records now holding 5000+ */
    for (int i = 0; i < 1000; i += 13) {
        rollup_buckets_t a = {0};
        read1(f.r, (uint64_t)i + 5000, 0, &a);
        assert_int_equal(a.n, 1);
        assert_int_equal(a.v[0].count, 1);
        assert_true(a.v[0].last == 42);
        rollup_buckets_free(&a);
    }
    for (int i = 0; i < N; i += 11) {
        rollup_buckets_t a = {0};
        read1(f.r, (uint64_t)i + 1, 0, &a);
        bool found = false;
        for (size_t k = 0; k < a.n; k++)
            if (a.v[k].ts == T0 + 4 * HOUR_MS) {
                found = true;
                assert_int_equal(a.v[k].count, 1);
                assert_true(a.v[k].last == 7);
            }
        assert_true(found);
        rollup_buckets_free(&a);
    }
    fx_close(&f);
    remove_dir(f.dir);
}

/* The raw tier keeps the LAST sample of a second; so must the roll-up, also across a restart. */
static void test_same_second_replace(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    rollup_buckets_t b = {0};
    add(f.r, 1, T0 + 1000, 10);
    add(f.r, 1, T0 + 1500, 20); /* replaces */
    add(f.r, 1, T0 + 1200, 30); /* replaces (an earlier ms of the same second, as the head allows) */
    read1(f.r, 1, 0, &b);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.v[0].count, 1);
    assert_true(b.v[0].sum == 30 && b.v[0].last == 30 && b.v[0].min == 30 && b.v[0].max == 30);
    add(f.r, 1, T0 + 2000, 40);
    add(f.r, 1, T0 + 2900, 35); /* replaces 40 */
    read1(f.r, 1, 0, &b);
    assert_int_equal(b.v[0].count, 2);
    assert_true(b.v[0].sum == 65 && b.v[0].max == 35 && b.v[0].increase == 5);
    add(f.r, 1, T0 + 1000, 99); /* a second already aggregated: ignored (replay) */
    rollup_stats_t st;
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.samples_ignored, 1);
    /* The pending sample survives a restart and is still replaceable. */
    fx_close(&f);
    fx_open(&f);
    read1(f.r, 1, 0, &b);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.v[0].count, 2);
    assert_true(b.v[0].sum == 65);
    add(f.r, 1, T0 + 2100, 50);
    add(f.r, 1, T0 + 61000, 60);
    assert_int_equal(rollup_flush(f.r, true), 0);
    rollup_close_buckets_before(f.r, T0 + 3 * MIN_MS);
    assert_int_equal(rollup_flush(f.r, true), 0);
    read1(f.r, 1, 0, &b);
    assert_int_equal(b.n, 2);
    assert_int_equal(b.v[0].count, 2);
    assert_true(b.v[0].sum == 80 && b.v[0].last == 50 && b.v[0].increase == 20);
    assert_int_equal(b.v[1].count, 1);
    assert_true(b.v[1].sum == 60 && b.v[1].increase == 10);
    read1(f.r, 1, 1, &b); /* the hour */
    assert_int_equal(b.n, 1);
    assert_int_equal(b.v[0].count, 3);
    assert_true(b.v[0].sum == 140 && b.v[0].increase == 30);
    /* A staleness marker replaced within its second does not end counter continuity. */
    add(f.r, 2, T0 + 1000, 5);
    add(f.r, 2, T0 + 2000, stale_nan());
    add(f.r, 2, T0 + 2500, 7);
    add(f.r, 2, T0 + 3000, 9);
    read1(f.r, 2, 0, &b);
    assert_int_equal(b.v[0].count, 3);
    assert_true(b.v[0].increase == 4);
    rollup_buckets_free(&b);
    fx_close(&f);
    remove_dir(f.dir);
}

static void test_counter_reset_stale_nan(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    /* Series 1: reset 20 -> 3 adds 3; staleness marker ends continuity: 5 starts afresh. */
    add(f.r, 1, T0 + 1000, 10);
    add(f.r, 1, T0 + 11000, 20);
    add(f.r, 1, T0 + 21000, 3);
    add(f.r, 1, T0 + 31000, stale_nan());
    add(f.r, 1, T0 + 41000, 5);
    add(f.r, 1, T0 + 51000, 7);
    /* next minute: continuity from 7 across the bucket boundary */
    add(f.r, 1, T0 + 61000, 9);
    /* Series 2: NaN counts, poisons sum, min/max skip it, increase skips it. */
    add(f.r, 2, T0 + 1000, 4);
    add(f.r, 2, T0 + 11000, NAN);
    add(f.r, 2, T0 + 21000, 6);
    /* Series 3: only NaN -> min/max NaN. */
    add(f.r, 3, T0 + 1000, NAN);
    assert_int_equal(rollup_flush(f.r, false), 0);

    rollup_buckets_t b = {0};
    assert_int_equal(rollup_read(f.r, 1, 0, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 2);
    assert_int_equal(b.v[0].ts, T0);
    assert_int_equal(b.v[0].count, 5); /* the marker is not counted */
    assert_true(b.v[0].sum == 45);
    assert_true(b.v[0].min == 3 && b.v[0].max == 20 && b.v[0].last == 7);
    assert_true(b.v[0].increase == 10 + 3 + 0 + 2);
    assert_int_equal(b.v[1].ts, T0 + MIN_MS);
    assert_true(b.v[1].increase == 2 && b.v[1].count == 1);
    rollup_buckets_free(&b);

    assert_int_equal(rollup_read(f.r, 2, 0, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.v[0].count, 3);
    assert_true(isnan(b.v[0].sum));
    assert_true(b.v[0].min == 4 && b.v[0].max == 6 && b.v[0].last == 6);
    assert_true(b.v[0].increase == 2);
    rollup_buckets_free(&b);

    assert_int_equal(rollup_read(f.r, 3, 0, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 1);
    assert_true(isnan(b.v[0].min) && isnan(b.v[0].max) && isnan(b.v[0].last));
    rollup_buckets_free(&b);

    /* The same through disk, after the buckets closed and the restart. */
    add(f.r, 9, T0 + 3 * HOUR_MS, 1); /* moves the high-water mark: quiet series' buckets close */
    assert_int_equal(rollup_flush(f.r, true), 0);
    fx_close(&f);
    fx_open(&f);
    assert_int_equal(rollup_read(f.r, 2, 1, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 1);
    assert_true(isnan(b.v[0].sum) && b.v[0].min == 4 && b.v[0].max == 6 && b.v[0].increase == 2);
    rollup_buckets_free(&b);
    assert_int_equal(rollup_read(f.r, 3, 1, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 1);
    assert_true(isnan(b.v[0].min) && isnan(b.v[0].max));
    rollup_buckets_free(&b);
    fx_close(&f);
    remove_dir(f.dir);
}

/* A bucket closed by time and written, then a late sample for it: the stored bucket and the
 * re-opened one merge (count/sum add, min/max combine, last = later, increase adds). */
static void test_late_sample_merges(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    add(f.r, 1, T0 + 1000, 5);
    add(f.r, 1, T0 + 2000, 8);
    rollup_close_buckets_before(f.r, T0 + HOUR_MS);
    assert_int_equal(rollup_flush(f.r, false), 0);
    add(f.r, 1, T0 + 3000, 2); /* reset: +2 */
    assert_int_equal(rollup_flush(f.r, false), 0);
    rollup_buckets_t b = {0};
    for (size_t k = 0; k < 2; k++) {
        rollup_close_buckets_before(f.r, T0 + HOUR_MS);
        assert_int_equal(rollup_flush(f.r, false), 0);
        assert_int_equal(rollup_read(f.r, 1, k, INT64_MIN, INT64_MAX, &b), 0);
        assert_int_equal(b.n, 1);
        assert_int_equal(b.v[0].count, 3);
        assert_true(b.v[0].sum == 15 && b.v[0].min == 2 && b.v[0].max == 8 && b.v[0].last == 2);
        assert_true(b.v[0].increase == 3 + 2);
        rollup_buckets_free(&b);
    }
    fx_close(&f);
    remove_dir(f.dir);
}

static void test_retention(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:3d"};
    fx_open(&f);
    /* 5 days of hourly samples for two series. */
    for (int64_t t = T0; t < T0 + 5 * DAY_MS; t += 10 * MIN_MS) {
        add(f.r, 1, t, (double)(t - T0) / 1000);
        add(f.r, 2, t, 1);
        if ((t - T0) % (6 * HOUR_MS) == 0)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    assert_int_equal(rollup_flush(f.r, true), 0);
    int64_t now = T0 + 5 * DAY_MS;
    rollup_buckets_t b = {0};
    assert_int_equal(rollup_read(f.r, 1, 0, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.v[0].ts, T0);
    rollup_buckets_free(&b);
    int rc, calls = 0;
    while ((rc = rollup_enforce_retention(f.r, now, 1)) == 1)
        calls++;
    assert_int_equal(rc, 0);
    assert_true(calls > 2); /* sliced */
    for (uint64_t id = 1; id <= 2; id++) {
        assert_int_equal(rollup_read(f.r, id, 0, INT64_MIN, INT64_MAX, &b), 0);
        assert_true(b.n > 0);
        /* 1m: whole 4 h blobs go once entirely older than 1 day */
        assert_true(b.v[0].ts >= now - DAY_MS - 4 * HOUR_MS);
        assert_true(b.v[0].ts < now - DAY_MS + 10 * MIN_MS);
        rollup_buckets_free(&b);
        assert_int_equal(rollup_read(f.r, id, 1, INT64_MIN, INT64_MAX, &b), 0);
        assert_true(b.n > 0);
        assert_true(b.v[0].ts >= now - 3 * DAY_MS); /* hourly rows: exact */
        assert_true(b.v[0].ts < now - 3 * DAY_MS + HOUR_MS);
        assert_int_equal(b.v[b.n - 1].ts, floor((double)(now - 10 * MIN_MS) / HOUR_MS) * HOUR_MS);
        rollup_buckets_free(&b);
    }
    fx_close(&f);
    remove_dir(f.dir);
}

static void test_view(void **state)
{
    fx_t f = {.dir = make_dir(), .res = NULL};
    fx_open(&f);
    label_t lv[] = {{"__name__", "flink_taskmanager_job_task_numRecordsIn"}, {"job", "etl"}, {"task", "map \"1\""}};
    labels_t ls = {lv, 3};
    assert_int_equal(catalog_add_series(f.cat, 7, &ls, T0), 0);
    for (int64_t t = T0; t < T0 + 3 * HOUR_MS; t += 10000)
        add(f.r, 7, t, (double)((t - T0) / 10000));
    fx_close(&f);

    char path[512];
    snprintf(path, sizeof(path), "%s/sluice.db", f.dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT metric, labels, ts, count, sum, min, max, last, increase FROM rollup_1h"
                                        " WHERE metric = 'flink_taskmanager_job_task_numRecordsIn' ORDER BY ts",
                                        -1, &st, NULL),
                     SQLITE_OK);
    int rows = 0;
    int64_t first_ts = (T0 / HOUR_MS) * HOUR_MS;
    double total_inc = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        assert_string_equal((const char *)sqlite3_column_text(st, 1), "{job=\"etl\",task=\"map \\\"1\\\"\"}");
        assert_int_equal(sqlite3_column_int64(st, 2), first_ts + rows * HOUR_MS);
        total_inc += sqlite3_column_double(st, 8);
        int64_t n = sqlite3_column_int64(st, 3);
        assert_true(n > 0 && n <= 360);
        assert_true(sqlite3_column_double(st, 7) == sqlite3_column_double(st, 6)); /* counter: last = max */
        rows++;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    /* T0 is not hour-aligned: a partial first hour, two full ones, and the open last one was
     * checkpointed but not written as a row (the view shows closed hours). */
    assert_true(rows >= 3);
    assert_true(total_inc > 0);
    remove_dir(f.dir);
}

static int64_t db_bytes(const char *dir, const char *table)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/sluice.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    int64_t bytes = -1;
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT sum(pgsize) FROM dbstat WHERE name = '%s'", table);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            bytes = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return bytes;
}

/* Blob payload bytes per bucket of resolution res for series ids == k mod 5 (k < 0: all). */
static double payload_per_bucket(const char *dir, int64_t res, int k)
{
    char path[512], sql[200];
    snprintf(path, sizeof(path), "%s/sluice.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    snprintf(
        sql, sizeof(sql),
        "SELECT sum(length(data)) * 1.0 / sum(n) FROM rollup_blob WHERE res = %lld AND (%d < 0 OR series_id %% 5 = %d)",
        (long long)res, k, k);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    double v = sqlite3_column_double(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* Flink-shaped data, 10 s pushes, one day: counters (records in/out, bytes), gauges with a few
 * distinct values (backpressure, idle ratio), constant gauges, and noisy float gauges. Prints
 * on-disk bytes per bucket for the 1m blobs and the 1h plain rows. */
static void test_bytes_per_bucket(void **state)
{
    enum { NSERIES = 200 };
    fx_t f = {.dir = make_dir(), .res = NULL};
    fx_open(&f);
    srand(7);
    double val[NSERIES] = {0};
    for (int64_t t = T0; t < T0 + DAY_MS; t += 10000) {
        for (int s = 0; s < NSERIES; s++) {
            double v;
            switch (s % 5) {
            case 0: /* counter, steady rate */
            case 1:
                val[s] += 1000 + rand() % 200;
                v = val[s];
                break;
            case 2: /* ratio gauge with few values */ v = (rand() % 4) * 0.25; break;
            case 3: /* constant */ v = 4; break;
            default: /* noisy float (e.g. CPU load) */ v = (rand() % 100000) / 1000.0; break;
            }
            add(f.r, (uint64_t)s + 1, t, v);
        }
        if ((t - T0) % HOUR_MS == 0)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    fx_close(&f);
    int64_t blob_bytes =
        db_bytes(f.dir, "rollup_blob") + db_bytes(f.dir, "rollup_blob_key") + db_bytes(f.dir, "rollup_blob_start");
    int64_t plain_bytes = db_bytes(f.dir, "rollup_plain");
    /* Every 1m bucket but the open last one is in blobs; every 1h one but the open last one in
     * rows and in blobs. */
    double nb1m = (double)NSERIES * (1440 - 1), nb1h = (double)NSERIES * (24 - 1);
    if (blob_bytes < 0 || plain_bytes < 0) {
        print_message("dbstat not available; bytes per bucket not measured\n");
    } else {
        print_message("roll-up disk bytes per bucket: blobs (1m and 1h) %.2f (incl. index, page slack), 1h plain"
                      " rows %.2f\n",
                      blob_bytes / (nb1m + nb1h), plain_bytes / nb1h);
        static const char *kind[5] = {"counter", "counter", "ratio gauge", "constant", "noisy float"};
        for (int k = 0; k < 5; k++)
            print_message("  1m payload bytes per bucket, %-11s %.2f\n", kind[k],
                          payload_per_bucket(f.dir, MIN_MS, (k + 1) % 5));
        print_message("  1h payload bytes per bucket (not deflated), all series %.2f\n",
                      payload_per_bucket(f.dir, HOUR_MS, -1));
        assert_true(blob_bytes / (nb1m + nb1h) <= 8.0);
    }
    remove_dir(f.dir);
}

/* The writer thread running (10 ms flushes) while two ingest threads add and a reader reads:
 * after close and reopen, every sample is counted exactly once. */
typedef struct {
    rollup_t *r;
    uint64_t first_id;
    int64_t t0;
} ingest_arg_t;

static void *ingest_main(void *p)
{
    ingest_arg_t *a = p;
    for (int64_t t = a->t0; t < a->t0 + 2 * HOUR_MS; t += 10000) {
        rollup_sample_t s[4];
        for (int k = 0; k < 4; k++)
            s[k] = (rollup_sample_t){a->first_id + (uint64_t)k, t, 1};
        rollup_add_samples(a->r, s, 4);
    }
    return NULL;
}

static void test_threaded(void **state)
{
    fx_t f = {.dir = make_dir()};
    char err[256];
    f.cat = catalog_open(f.dir, err, sizeof(err));
    assert_non_null(f.cat);
    rollup_config_t cfg = {.flush_interval_ms = 10, .checkpoint_interval_ms = 30};
    f.r = rollup_open(f.cat, &cfg, err, sizeof(err));
    assert_non_null(f.r);
    pthread_t th[2];
    /* Recent data: the writer enforces retention against the wall clock. */
    int64_t t0 = (int64_t)time(NULL) * 1000 / HOUR_MS * HOUR_MS - 3 * HOUR_MS + MIN_MS;
    ingest_arg_t args[2] = {{f.r, 1, t0}, {f.r, 5, t0}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, ingest_main, &args[i]), 0);
    for (int i = 0; i < 200; i++) { /* reads never see a bucket twice or more samples than sent */
        rollup_buckets_t b = {0};
        assert_int_equal(rollup_read(f.r, 3, 0, INT64_MIN, INT64_MAX, &b), 0);
        for (size_t k = 0; k < b.n; k++) {
            assert_true(b.v[k].count <= 6);
            if (k > 0)
                assert_true(b.v[k].ts > b.v[k - 1].ts);
        }
        rollup_buckets_free(&b);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    fx_close(&f);
    f.res = NULL;
    fx_open(&f);
    for (uint64_t id = 1; id <= 8; id++) {
        for (size_t k = 0; k < 2; k++) {
            rollup_buckets_t b = {0};
            assert_int_equal(rollup_read(f.r, id, k, INT64_MIN, INT64_MAX, &b), 0);
            uint64_t total = 0;
            for (size_t i = 0; i < b.n; i++)
                total += b.v[i].count;
            assert_int_equal(total, 720);
            assert_int_equal(b.n, k == 0 ? 120 : 3);
            rollup_buckets_free(&b);
        }
    }
    fx_close(&f);
    remove_dir(f.dir);
}

/* ---- the writer's retention clock ----------------------------------------------------------- */

static _Atomic int64_t test_now;
static int64_t test_clock(void)
{
    return atomic_load(&test_now);
}

static int64_t rows_on_disk(const char *dir, const char *table)
{
    char path[512], sql[128];
    snprintf(path, sizeof(path), "%s/sluice.db", dir);
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s", table);
    sqlite3 *db;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* Opens the roll-up with its writer thread on test_clock and waits until the writer has run
 * three cycles: the first retention pass (one slice per resolution, one slice per cycle) is
 * then complete. */
static void writer_open_and_wait(fx_t *f)
{
    char err[256] = "";
    f->cat = catalog_open(f->dir, err, sizeof(err));
    assert_non_null(f->cat);
    rollup_config_t cfg = {.resolutions = f->res, .flush_interval_ms = 10, .clock_ms = test_clock};
    f->r = rollup_open(f->cat, &cfg, err, sizeof(err));
    if (!f->r)
        fail_msg("rollup_open: %s", err);
    struct timespec t0, now, nap = {0, 5000000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        rollup_stats_t stats;
        rollup_get_stats(f->r, &stats);
        if (stats.flushes >= 3)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 120) /* a guard against hanging, not a timing expectation */
            fail_msg("the writer ran %llu cycles in 120 s", (unsigned long long)stats.flushes);
        nanosleep(&nap, NULL);
    }
}

/* The writer judges age by the configured clock, not the wall clock: buckets from 2023 on a
 * clock in 2023 stay (with the wall clock they were all deleted on the writer's first wake-up,
 * which made every test on a fake clock lose its roll-ups once it ran longer than a second);
 * the same buckets on a clock past both retentions go. */
static void test_writer_retention_clock(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f); /* no thread: the data reaches disk before any writer runs */
    for (int64_t t = T0; t < T0 + 3 * HOUR_MS; t += 10000)
        add(f.r, 1, t, 1);
    assert_int_equal(rollup_flush(f.r, true), 0);
    fx_close(&f);
    int64_t blobs = rows_on_disk(f.dir, "rollup_blob"), plain = rows_on_disk(f.dir, "rollup_plain");
    assert_true(blobs > 0 && plain > 0);

    atomic_store(&test_now, T0 + 3 * HOUR_MS);
    writer_open_and_wait(&f);
    fx_close(&f);
    assert_int_equal(rows_on_disk(f.dir, "rollup_blob"), blobs);
    assert_int_equal(rows_on_disk(f.dir, "rollup_plain"), plain);

    atomic_store(&test_now, T0 + 3 * DAY_MS);
    writer_open_and_wait(&f);
    fx_close(&f);
    assert_int_equal(rows_on_disk(f.dir, "rollup_blob"), 0);
    assert_int_equal(rows_on_disk(f.dir, "rollup_plain"), 0);
    remove_dir(f.dir);
}

static int64_t buckets_on_disk(const char *dir)
{
    return rows_on_disk(dir, "rollup_plain") + rows_on_disk(dir, "rollup_blob") + rows_on_disk(dir, "rollup_recent");
}

/* A catalog backlog written in slices (the writer thread's cycles): a slice that leaves rows
 * pending writes rows only, no bucket and no state, so a series' row is never later than its
 * first roll-up; the cycle that writes the last rows writes the buckets with them. */
static void test_catalog_backlog_in_slices(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d"};
    fx_open(&f);
    enum { N = 20000 };
    uint64_t first = 0;
    for (int i = 0; i < N; i++) {
        uint64_t id = catalog_next_id(f.cat);
        char num[16];
        snprintf(num, sizeof(num), "%d", i);
        label_t l[] = {{"__name__", "s"}, {"i", num}};
        labels_t ls = {l, 2};
        assert_int_equal(catalog_add_series(f.cat, id, &ls, T0), 0);
        if (i == 0)
            first = id;
    }
    for (int64_t t = T0; t <= T0 + 3 * 60000; t += 10000) /* closes the first minutes' buckets */
        add(f.r, first, t, 1);
    bool rows_only = false;
    assert_int_equal(rollup__flush_some(f.r, true, 1000, &rows_only), 0);
    assert_true(rows_only);
    int64_t rows = rows_on_disk(f.dir, "series");
    assert_true(rows > 0 && rows < N);
    assert_int_equal(buckets_on_disk(f.dir), 0);
    assert_int_equal(rows_on_disk(f.dir, "rollup_state"), 0);
    int cycles = 1;
    while (rows_only) {
        assert_true(++cycles < 100);
        assert_int_equal(rollup__flush_some(f.r, true, 1000, &rows_only), 0);
    }
    assert_true(cycles > 2);
    assert_int_equal(rows_on_disk(f.dir, "series"), N);
    assert_true(buckets_on_disk(f.dir) > 0);
    assert_true(rows_on_disk(f.dir, "rollup_state") > 0);
    rollup_buckets_t got = {0};
    read1(f.r, first, 0, &got);
    assert_true(got.n >= 3);
    rollup_buckets_free(&got);
    fx_close(&f);
    remove_dir(f.dir);
}

/* ---- 1h blobs and databases from before them -------------------------------------------------- */

static sqlite3 *db_open_rw(const char *dir)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/sluice.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    return db;
}

static int64_t query_i64(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_type(st, 0) == SQLITE_NULL ? INT64_MIN : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The 1h buckets as the rollup_1h view shows them (the rows), for comparison with rollup_read. */
static void view_buckets(const char *dir, uint64_t id, rollup_buckets_t *out)
{
    sqlite3 *db = db_open_rw(dir);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT ts, count, sum, min, max, last, increase FROM rollup_1h"
                                        " WHERE series_id = ? ORDER BY ts",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, (sqlite3_int64)id);
    out->n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (out->n == out->cap) {
            out->cap = out->cap ? out->cap * 2 : 64;
            out->v = realloc(out->v, out->cap * sizeof(*out->v));
        }
        double d[5];
        for (int k = 0; k < 5; k++)
            d[k] = sqlite3_column_type(st, 2 + k) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 2 + k);
        out->v[out->n++] = (rollup_bucket_t){.ts = sqlite3_column_int64(st, 0),
                                             .count = (uint64_t)sqlite3_column_int64(st, 1),
                                             .sum = d[0],
                                             .min = d[1],
                                             .max = d[2],
                                             .last = d[3],
                                             .increase = d[4]};
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* Two months of one counter and one gauge at 1 minute: the 1h buckets are read from 30-day blobs
 * (a month is at most two of them) and agree with the reference, with the rows the view shows,
 * and across blob boundaries for sub-ranges; retention then trims the blob that straddles the
 * cutoff exactly as it deletes the rows. */
static void test_hour_blobs(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:2d,1h:40d"};
    fx_open(&f);
    ref_t ref[2];
    memset(ref, 0, sizeof(ref));
    ref[0].last_t = ref[1].last_t = INT64_MIN;
    const int64_t end = T0 + 62 * DAY_MS;
    double c = 0;
    for (int64_t t = T0; t < end; t += MIN_MS) {
        c += (double)((t / MIN_MS) % 7);
        double g = (double)((t / MIN_MS) % 1000) / 8;
        add(f.r, 1, t, c);
        add(f.r, 2, t, g);
        ref_add(&ref[0], HOUR_MS, t, c);
        ref_add(&ref[1], HOUR_MS, t, g);
        if ((t - T0) % (6 * HOUR_MS) == 0)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    rollup_close_buckets_before(f.r, end + HOUR_MS);
    assert_int_equal(rollup_flush(f.r, true), 0);
    sqlite3 *db = db_open_rw(f.dir);
    int64_t nblobs = query_i64(db, "SELECT count(*) FROM rollup_blob WHERE res = 3600000 AND series_id = 1");
    assert_true(nblobs >= 3 && nblobs <= 4); /* 62 days in 30-day spans */
    assert_int_equal(query_i64(db, "SELECT count(*) FROM rollup_plain WHERE res = 3600000 AND series_id = 1"),
                     ref[0].b.n);
    sqlite3_close(db);
    rollup_buckets_t got = {0}, view = {0};
    for (uint64_t id = 1; id <= 2; id++) {
        read1(f.r, id, 1, &got);
        assert_same(&got, &ref[id - 1].b, "1h from blobs");
        view_buckets(f.dir, id, &view);
        assert_same(&got, &view, "1h blobs vs view");
        /* Sub-ranges ending and starting inside blobs. */
        int64_t lo = floor_to_hour(T0 + 29 * DAY_MS + 5 * HOUR_MS), hi = lo + 33 * DAY_MS + 7 * HOUR_MS;
        got.n = 0;
        assert_int_equal(rollup_read(f.r, id, 1, lo, hi, &got), 0);
        size_t k = 0;
        while (ref[id - 1].b.v[k].ts < lo)
            k++;
        rollup_buckets_t sub = {.v = ref[id - 1].b.v + k, .n = 0};
        while (k + sub.n < ref[id - 1].b.n && sub.v[sub.n].ts <= hi)
            sub.n++;
        assert_same(&got, &sub, "1h sub-range");
    }
    /* Retention at end + 1d: cutoff = end - 39 days, inside a blob (not on a span boundary). */
    int64_t now = end + DAY_MS, cutoff = now - 40 * DAY_MS;
    while (rollup_enforce_retention(f.r, now, 2) == 1)
        ;
    fx_close(&f);
    fx_open(&f); /* no retention cutoff in memory: what the reads see is what is on disk */
    for (uint64_t id = 1; id <= 2; id++) {
        read1(f.r, id, 1, &got);
        view_buckets(f.dir, id, &view);
        assert_true(view.n > 0 && view.v[0].ts >= cutoff && view.v[0].ts < cutoff + HOUR_MS);
        assert_same(&got, &view, "1h blobs vs view after retention");
    }
    fx_close(&f);
    rollup_buckets_free(&got);
    rollup_buckets_free(&view);
    free(ref[0].b.v);
    free(ref[1].b.v);
    remove_dir(f.dir);
}

/* An open bucket has no ts of its own: it is the period of the state's newest sample. A
 * staleness marker in a later period closes it (it aggregates nothing), also when the marker was
 * pending across a restart; and a state row whose open bucket is of an older period than its
 * last_t (written when a marker moved last_t on without closing it) loads with that bucket
 * closed, kept and written, not moved into last_t's period. */
static void test_open_bucket_dated_by_last_t(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    add(f.r, 1, T0 + 1000, 10);
    add(f.r, 1, T0 + 11000, 12);
    add(f.r, 1, T0 + MIN_MS + 1000, stale_nan()); /* pending across the restart */
    assert_int_equal(rollup_flush(f.r, true), 0);
    fx_close(&f);
    fx_open(&f);
    add(f.r, 1, T0 + MIN_MS + 11000, 20);    /* commits the marker: minute 0 closes */
    add(f.r, 1, T0 + 2 * MIN_MS + 1000, 25); /* commits 20: minute 1, no increase */
    rollup_buckets_t b = {0};
    assert_int_equal(rollup_read(f.r, 1, 0, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 3);
    assert_true(b.v[0].ts == T0 && b.v[0].count == 2 && b.v[0].sum == 22 && b.v[0].last == 12);
    assert_true(b.v[0].increase == 2);
    assert_true(b.v[1].ts == T0 + MIN_MS && b.v[1].count == 1 && b.v[1].sum == 20 && b.v[1].increase == 0);
    assert_true(b.v[2].ts == T0 + 2 * MIN_MS && b.v[2].count == 1 && b.v[2].increase == 5);
    rollup_buckets_free(&b);
    assert_int_equal(rollup_read(f.r, 1, 1, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, 1);
    assert_true(b.v[0].count == 4 && b.v[0].sum == 67 && b.v[0].increase == 7 && b.v[0].last == 25);
    rollup_buckets_free(&b);
    fx_close(&f);

    /* A row with last_t in minute 1 and an open 1m bucket of minute 0. */
    sqlite3 *db = db_open_rw(f.dir);
    uint64_t w[8] = {(uint64_t)MIN_MS, (uint64_t)T0, 2, 0, 0, 0, 0, 0};
    double d[5] = {5, 2, 3, 3, 1}; /* sum, min, max, last, increase */
    memcpy(&w[3], d, sizeof(d));
    uint8_t blob[64];
    for (int k = 0; k < 8; k++)
        for (int byte = 0; byte < 8; byte++)
            blob[k * 8 + byte] = (uint8_t)(w[k] >> (8 * byte));
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "INSERT OR REPLACE INTO rollup_state(series_id, last_t, prev, prev_ok, open)"
                                        " VALUES(5, ?, 3, 1, ?)",
                                        -1, &st, NULL),
                     SQLITE_OK);
    sqlite3_bind_int64(st, 1, T0 + MIN_MS + 1000);
    sqlite3_bind_blob(st, 2, blob, sizeof(blob), SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
    for (int pass = 0; pass < 2; pass++) { /* as loaded, then from disk after a flush and restart */
        fx_open(&f);
        if (pass == 0) {
            add(f.r, 5, T0 + MIN_MS + 500, 99); /* in last_t's second: ignored */
            add(f.r, 5, T0 + MIN_MS + 11000, 4);
            add(f.r, 5, T0 + MIN_MS + 21000, 6);
        }
        assert_int_equal(rollup_read(f.r, 5, 0, INT64_MIN, INT64_MAX, &b), 0);
        assert_int_equal(b.n, 2);
        assert_true(b.v[0].ts == T0 && b.v[0].count == 2 && b.v[0].sum == 5 && b.v[0].last == 3);
        assert_true(b.v[0].min == 2 && b.v[0].max == 3 && b.v[0].increase == 1);
        assert_true(b.v[1].ts == T0 + MIN_MS && b.v[1].count == 2 && b.v[1].sum == 10 && b.v[1].increase == 3);
        rollup_buckets_free(&b);
        assert_int_equal(rollup_flush(f.r, true), 0);
        fx_close(&f);
    }
    remove_dir(f.dir);
}

/* A database from before 1h blobs (1h buckets in rollup_plain only, no boundary in meta) opens
 * and reads correctly: old hours from the rows until the writer's first cycle copies them into
 * blobs (then the boundary is gone, in meta too), an old hour re-opened by late samples merged
 * right in both tables, the view unchanged, retention on both. The old layout is made by removing
 * what the old code did not write (the 1h blobs and the meta key): the schema is otherwise the
 * same. */
static void test_old_layout(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:10d"};
    fx_open(&f);
    ref_t ref;
    memset(&ref, 0, sizeof(ref));
    ref.last_t = INT64_MIN;
    double c = 0;
    int64_t t = T0, mid = T0 + 3 * DAY_MS + 20 * MIN_MS, end = T0 + 6 * DAY_MS;
    for (; t < mid; t += 30000) {
        c += 3;
        add(f.r, 1, t, c);
        ref_add(&ref, HOUR_MS, t, c);
        if ((t - T0) % (2 * HOUR_MS) == 0)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    /* The hour of `mid` is written although the series goes on in it (as for a series that was
     * quiet for a while): the next samples re-open it. */
    rollup_close_buckets_before(f.r, floor_to_hour(mid) + HOUR_MS);
    fx_close(&f);
    sqlite3 *db = db_open_rw(f.dir);
    assert_true(query_i64(db, "SELECT count(*) FROM rollup_blob WHERE res = 3600000") > 0);
    assert_int_equal(sqlite3_exec(db,
                                  "DELETE FROM rollup_blob WHERE res = 3600000;"
                                  " DELETE FROM rollup_recent WHERE res = 3600000;"
                                  " DELETE FROM meta WHERE key = 'rollup_1h_blob_from';",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(query_i64(db, "SELECT max(ts) FROM rollup_plain WHERE res = 3600000"), floor_to_hour(mid));
    sqlite3_close(db);

    fx_open(&f);
    db = db_open_rw(f.dir);
    assert_int_equal(query_i64(db, "SELECT value FROM meta WHERE key = 'rollup_1h_blob_from'"),
                     floor_to_hour(mid) + HOUR_MS);
    sqlite3_close(db);
    rollup_buckets_t got = {0}, view = {0};
    read1(f.r, 1, 1, &got);
    assert_same(&got, &ref.b, "old layout, reopened (rows)");
    /* Samples up to the first writer cycle: the re-opened hour closes and goes to its row and to
     * a new blob (holding only its late part); then the cycle copies the rows into blobs. */
    bool flushed = false;
    for (; t < end; t += 30000) {
        c += 3;
        add(f.r, 1, t, c);
        ref_add(&ref, HOUR_MS, t, c);
        if ((t - T0) % (2 * HOUR_MS) == 0) {
            if (!flushed) {
                read1(f.r, 1, 1, &got);
                assert_same(&got, &ref.b, "old layout + the re-opened hour, before the first cycle");
            }
            assert_int_equal(rollup_flush(f.r, false), 0);
            if (!flushed) {
                db = db_open_rw(f.dir);
                assert_int_equal(query_i64(db, "SELECT value FROM meta WHERE key = 'rollup_1h_blob_from'"), INT64_MIN);
                sqlite3_close(db);
                read1(f.r, 1, 1, &got); /* from blobs only now */
                assert_same(&got, &ref.b, "after the copy into blobs");
            }
            flushed = true;
        }
    }
    assert_true(flushed);
    rollup_close_buckets_before(f.r, end + HOUR_MS);
    assert_int_equal(rollup_flush(f.r, true), 0);
    read1(f.r, 1, 1, &got);
    assert_same(&got, &ref.b, "old + new hours from blobs");
    fx_close(&f);
    view_buckets(f.dir, 1, &view);
    assert_same(&view, &ref.b, "view over old + new rows");
    fx_open(&f);
    read1(f.r, 1, 1, &got);
    assert_same(&got, &ref.b, "old + new hours, reopened");

    /* Retention cutting into the old hours: reads and the view agree after reopening. */
    int64_t now = T0 + 13 * DAY_MS;
    while (rollup_enforce_retention(f.r, now, 1) == 1)
        ;
    fx_close(&f);
    fx_open(&f);
    read1(f.r, 1, 1, &got);
    view_buckets(f.dir, 1, &view);
    assert_true(view.n > 0 && view.v[0].ts >= now - 10 * DAY_MS);
    assert_same(&got, &view, "old + new layout after retention");
    fx_close(&f);
    rollup_buckets_free(&got);
    rollup_buckets_free(&view);
    free(ref.b.v);
    remove_dir(f.dir);
}

/* ---- readers: one transaction for many series, series without history --------------------- */

static void keep_before(const rollup_buckets_t *in, int64_t maxt, rollup_buckets_t *out)
{
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        if (in->v[i].ts > maxt)
            continue;
        if (out->n == out->cap) {
            out->cap = out->cap ? out->cap * 2 : 64;
            out->v = realloc(out->v, out->cap * sizeof(*out->v));
        }
        out->v[out->n++] = in->v[i];
    }
}

static void rd_read(rollup_reader_t *rd, uint64_t id, size_t ri, int64_t mint, int64_t maxt, rollup_buckets_t *out)
{
    out->n = 0;
    assert_int_equal(rollup_reader_read(rd, id, ri, mint, maxt, out), 0);
}

static uint64_t mem_reads(rollup_t *r)
{
    rollup_stats_t st;
    rollup_get_stats(r, &st);
    return st.reads_from_memory;
}

/* A reader keeps one read transaction across series: series 1 has six hours on disk, series 2 is
 * young (only open buckets). Series 2's read learns that the disk has nothing for it, and the
 * next read of the old range skips SQLite. Then series 2's hour closes and the writer commits
 * while the reader's transaction (and its snapshot from before) is still open: the reader must
 * see the hour (from the closed list before the commit, from disk after it), not lose it between
 * its old snapshot and the forgotten inflight list, and not skip the disk on a stale bound. */
static void test_reader_one_transaction(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:10d"};
    fx_open(&f);
    ref_t r1m = {.last_t = INT64_MIN}, r1h = {.last_t = INT64_MIN}, r2m = {.last_t = INT64_MIN},
          r2h = {.last_t = INT64_MIN};
    double c = 0;
    int64_t t;
    for (t = T0; t < T0 + 6 * HOUR_MS; t += 30000) {
        c += 2;
        add(f.r, 1, t, c);
        ref_add(&r1m, MIN_MS, t, c);
        ref_add(&r1h, HOUR_MS, t, c);
        if ((t - T0) % (2 * HOUR_MS) == 0)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    rollup_close_buckets_before(f.r, T0 + 6 * HOUR_MS + HOUR_MS);
    assert_int_equal(rollup_flush(f.r, false), 0);
    int64_t young = floor_to_hour(T0) + 7 * HOUR_MS; /* an hour of its own, after series 1's */
    for (t = young + 10 * MIN_MS; t < young + 20 * MIN_MS; t += 15000) {
        add(f.r, 2, t, (double)(t / 1000 % 1000));
        ref_add(&r2m, MIN_MS, t, (double)(t / 1000 % 1000));
        ref_add(&r2h, HOUR_MS, t, (double)(t / 1000 % 1000));
    }

    rollup_reader_t *rd = rollup_reader_open(f.r);
    assert_non_null(rd);
    rollup_buckets_t got = {0}, want = {0};
    rd_read(rd, 1, 1, INT64_MIN, INT64_MAX, &got);
    assert_same(&got, &r1h.b, "series 1, 1h, first read of the transaction");
    uint64_t m0 = mem_reads(f.r);
    rd_read(rd, 2, 1, T0 - 30 * 24 * HOUR_MS, young - 1, &got);
    assert_int_equal(got.n, 0);
    assert_int_equal(mem_reads(f.r), m0); /* learnt, not yet used */
    rd_read(rd, 2, 1, T0 - 30 * 24 * HOUR_MS, young - 1, &got);
    assert_int_equal(got.n, 0);
    assert_int_equal(mem_reads(f.r), m0 + 1);
    rd_read(rd, 2, 0, T0 - 30 * 24 * HOUR_MS, young + HOUR_MS, &got); /* open buckets: from memory */
    assert_int_equal(mem_reads(f.r), m0 + 2);
    assert_same(&got, &r2m.b, "series 2, 1m, open buckets");
    rd_read(rd, 1, 0, INT64_MIN, INT64_MAX, &got); /* found on disk: nothing learnt */
    assert_same(&got, &r1m.b, "series 1, 1m");

    /* Series 2 moves into the next hour: its first hour closes (closed list, memory). */
    for (t = young + HOUR_MS + MIN_MS; t < young + HOUR_MS + 5 * MIN_MS; t += 15000) {
        add(f.r, 2, t, (double)(t / 1000 % 1000));
        ref_add(&r2m, MIN_MS, t, (double)(t / 1000 % 1000));
        ref_add(&r2h, HOUR_MS, t, (double)(t / 1000 % 1000));
    }
    rollup_close_buckets_before(f.r, young + HOUR_MS);
    keep_before(&r2h.b, young, &want);
    assert_int_equal(want.n, 1);
    rd_read(rd, 2, 1, T0 - 30 * 24 * HOUR_MS, young, &got);
    assert_same(&got, &want, "series 2's closed hour, before the commit");
    /* The writer commits it while the reader's transaction is open. */
    assert_int_equal(rollup_flush(f.r, false), 0);
    uint64_t m1 = mem_reads(f.r);
    rd_read(rd, 2, 1, T0 - 30 * 24 * HOUR_MS, young, &got);
    assert_same(&got, &want, "series 2's closed hour, after the commit, same reader");
    assert_int_equal(mem_reads(f.r), m1); /* the bound was lowered: the disk was read */
    rd_read(rd, 2, 0, INT64_MIN, INT64_MAX, &got);
    assert_same(&got, &r2m.b, "series 2, 1m, after the commit");
    rd_read(rd, 2, 1, INT64_MIN, INT64_MAX, &got);
    assert_same(&got, &r2h.b, "series 2, 1h, disk and open");
    rd_read(rd, 1, 1, INT64_MIN, INT64_MAX, &got);
    assert_same(&got, &r1h.b, "series 1, 1h, after the commit");
    rollup_reader_close(rd);
    read1(f.r, 2, 1, &got);
    assert_same(&got, &r2h.b, "series 2, 1h, rollup_read");

    /* After a restart the states know nothing: reads go to the disk and agree. */
    fx_close(&f);
    fx_open(&f);
    rd = rollup_reader_open(f.r);
    rd_read(rd, 2, 1, INT64_MIN, INT64_MAX, &got);
    assert_same(&got, &r2h.b, "series 2, 1h, reopened");
    rd_read(rd, 1, 1, INT64_MIN, INT64_MAX, &got);
    assert_same(&got, &r1h.b, "series 1, 1h, reopened");
    rollup_reader_close(rd);
    fx_close(&f);
    rollup_buckets_free(&got);
    rollup_buckets_free(&want);
    free(r1m.b.v);
    free(r1h.b.v);
    free(r2m.b.v);
    free(r2h.b.v);
    remove_dir(f.dir);
}

/* Readers on several threads while the writer thread commits every few ms: each read sees every
 * bucket once (the counts add up to what was sent), whether its transaction is renewed or not. */
typedef struct {
    rollup_t *r;
    _Atomic bool *stop;
    int bad;
} rdth_t;

static void *reader_main(void *arg)
{
    rdth_t *a = arg;
    rollup_buckets_t b = {0};
    while (!atomic_load(a->stop)) {
        rollup_reader_t *rd = rollup_reader_open(a->r);
        if (!rd) {
            a->bad++;
            break;
        }
        for (uint64_t id = 1; id <= 4; id++) {
            b.n = 0;
            if (rollup_reader_read(rd, id, 0, INT64_MIN, INT64_MAX, &b) != 0) {
                a->bad++;
                continue;
            }
            for (size_t k = 1; k < b.n; k++)
                if (b.v[k].ts <= b.v[k - 1].ts)
                    a->bad++;
            for (size_t k = 0; k < b.n; k++)
                if (b.v[k].count > 4) /* 4 samples per minute are sent */
                    a->bad++;
        }
        rollup_reader_close(rd);
    }
    rollup_buckets_free(&b);
    return NULL;
}

static void test_readers_threaded(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:400d,1h:400d"};
    char err[256];
    f.cat = catalog_open(f.dir, err, sizeof(err));
    assert_non_null(f.cat);
    rollup_config_t cfg = {.resolutions = f.res, .flush_interval_ms = 2, .checkpoint_interval_ms = 30};
    f.r = rollup_open(f.cat, &cfg, err, sizeof(err));
    assert_non_null(f.r);
    _Atomic bool stop = false;
    pthread_t th[2];
    rdth_t args[2] = {{f.r, &stop, 0}, {f.r, &stop, 0}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, &args[i]), 0);
    int64_t t0 = (int64_t)time(NULL) * 1000 / HOUR_MS * HOUR_MS - 6 * HOUR_MS;
    for (int64_t t = t0; t < t0 + 4 * HOUR_MS; t += 15000)
        for (uint64_t id = 1; id <= 4; id++)
            add(f.r, id, t, (double)t);
    rollup_close_buckets_before(f.r, t0 + 5 * HOUR_MS);
    assert_int_equal(rollup_flush(f.r, false), 0);
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    for (uint64_t id = 1; id <= 4; id++) {
        rollup_buckets_t b = {0};
        assert_int_equal(rollup_read(f.r, id, 0, INT64_MIN, INT64_MAX, &b), 0);
        uint64_t total = 0;
        for (size_t i = 0; i < b.n; i++)
            total += b.v[i].count;
        assert_int_equal(total, 4 * 60 * 4);
        assert_int_equal(b.n, 4 * 60);
        rollup_buckets_free(&b);
    }
    fx_close(&f);
    remove_dir(f.dir);
}

/* The writer takes a shard's closed buckets, sorts them outside the shard lock and swaps them in
 * as inflight; readers meanwhile find a series' closed buckets through its links, or, for a
 * series whose state the same cycle evicted, by a scan. Readers on two threads, during a cycle
 * that takes every bucket of 512 series and evicts half of them, must see each bucket exactly
 * once: a lost or doubled bucket changes a series' total count. */
#define TAKE_SERIES 512

typedef struct {
    rollup_t *r;
    _Atomic bool *stop;
    _Atomic int passes;
    int bad;
} takerd_t;

static uint64_t take_expected(uint64_t id)
{
    return id % 2 == 0 ? 240 : 540; /* even: 1 h at 15 s; odd: 2 h 15 min */
}

static void *take_reader_main(void *arg)
{
    takerd_t *a = arg;
    rollup_buckets_t b = {0};
    while (!atomic_load(a->stop)) {
        rollup_reader_t *rd = rollup_reader_open(a->r);
        if (!rd) {
            a->bad++;
            break;
        }
        for (uint64_t id = 1; id <= TAKE_SERIES; id++) {
            for (size_t res = 0; res < 2; res++) {
                b.n = 0;
                if (rollup_reader_read(rd, id, res, INT64_MIN, INT64_MAX, &b) != 0) {
                    a->bad++;
                    continue;
                }
                uint64_t total = 0;
                for (size_t k = 0; k < b.n; k++)
                    total += b.v[k].count;
                if (total != take_expected(id))
                    a->bad++;
            }
        }
        rollup_reader_close(rd);
        atomic_fetch_add(&a->passes, 1);
    }
    rollup_buckets_free(&b);
    return NULL;
}

static void wait_passes(takerd_t *a, int n)
{
    struct timespec nap = {0, 1000000};
    for (int i = 0; i < 2; i++)
        while (atomic_load(&a[i].passes) < n && a[i].bad == 0)
            nanosleep(&nap, NULL);
}

static void test_take_while_reading(void **state)
{
    fx_t f = {.dir = make_dir(), .res = "1m:400d,1h:400d"};
    char err[256];
    f.cat = catalog_open(f.dir, err, sizeof(err));
    assert_non_null(f.cat);
    /* The writer thread sleeps; the test runs the cycles. */
    rollup_config_t cfg = {.resolutions = f.res, .flush_interval_ms = 3600000, .checkpoint_interval_ms = 3600000};
    f.r = rollup_open(f.cat, &cfg, err, sizeof(err));
    assert_non_null(f.r);
    int64_t t0 = (int64_t)time(NULL) * 1000 / HOUR_MS * HOUR_MS - 6 * HOUR_MS;
    for (int64_t t = t0; t < t0 + 2 * HOUR_MS + 15 * MIN_MS; t += 15000)
        for (uint64_t id = 1; id <= TAKE_SERIES; id++)
            if (id % 2 == 1 || t < t0 + HOUR_MS)
                add(f.r, id, t, (double)t);
    rollup_close_buckets_before(f.r, t0 + 3 * HOUR_MS);

    _Atomic bool stop = false;
    pthread_t th[2];
    takerd_t args[2] = {{.r = f.r, .stop = &stop}, {.r = f.r, .stop = &stop}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, take_reader_main, &args[i]), 0);
    wait_passes(args, 1); /* everything in the closed lists, found through the links */
    assert_int_equal(rollup_flush(f.r, false), 0); /* take, evict the even series, commit */
    wait_passes(args, atomic_load(&args[0].passes) + 2);
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    rollup_stats_t st;
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, TAKE_SERIES / 2); /* the even ones were evicted */

    /* An evicted series comes back: its new buckets are linked from its new state. */
    for (int64_t t = t0 + 4 * HOUR_MS; t < t0 + 4 * HOUR_MS + 10 * MIN_MS; t += 15000)
        add(f.r, 2, t, (double)t);
    rollup_close_buckets_before(f.r, t0 + 5 * HOUR_MS);
    rollup_buckets_t b = {0};
    assert_int_equal(rollup_read(f.r, 2, 0, INT64_MIN, INT64_MAX, &b), 0);
    uint64_t total = 0;
    for (size_t k = 0; k < b.n; k++)
        total += b.v[k].count;
    assert_int_equal(total, 240 + 40);
    assert_int_equal(b.n, 60 + 10);
    rollup_buckets_free(&b);
    fx_close(&f);
    remove_dir(f.dir);
}

/* ---- the writer's due heap ------------------------------------------------------------------ */

static void fx_open_cfg(fx_t *f, const rollup_config_t *cfg)
{
    char err[256] = "";
    f->cat = catalog_open(f->dir, err, sizeof(err));
    assert_non_null(f->cat);
    f->r = rollup_open(f->cat, cfg, err, sizeof(err));
    if (!f->r)
        fail_msg("rollup_open: %s", err);
}

static bool same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof(a)) == 0 || (isnan(a) && isnan(b));
}

/* Every bucket of series id at resolution k, the same in both roll-ups. */
static void assert_reads_equal(rollup_t *a, rollup_t *b, uint64_t id, size_t k, const char *when)
{
    rollup_buckets_t x = {0}, y = {0};
    assert_int_equal(rollup_read(a, id, k, INT64_MIN, INT64_MAX, &x), 0);
    assert_int_equal(rollup_read(b, id, k, INT64_MIN, INT64_MAX, &y), 0);
    if (x.n != y.n)
        fail_msg("%s: series %llu res %zu: %zu buckets, want %zu", when, (unsigned long long)id, k, x.n, y.n);
    for (size_t i = 0; i < x.n; i++) {
        const rollup_bucket_t *g = &x.v[i], *w = &y.v[i];
        if (g->ts != w->ts || g->count != w->count || !same_double(g->sum, w->sum) || !same_double(g->min, w->min) ||
            !same_double(g->max, w->max) || !same_double(g->last, w->last) ||
            !same_double(g->increase, w->increase))
            fail_msg("%s: series %llu res %zu bucket %zu: ts %lld n %llu, want ts %lld n %llu", when,
                     (unsigned long long)id, k, i, (long long)g->ts, (unsigned long long)g->count, (long long)w->ts,
                     (unsigned long long)w->count);
    }
    rollup_buckets_free(&x);
    rollup_buckets_free(&y);
}

static void assert_stats_equal(rollup_t *a, rollup_t *b, const char *when)
{
    rollup_stats_t x, y;
    rollup_get_stats(a, &x);
    rollup_get_stats(b, &y);
    if (x.series != y.series || x.buckets_written != y.buckets_written || x.samples_ignored != y.samples_ignored)
        fail_msg("%s: series %llu written %llu ignored %llu; every-state sweep: %llu %llu %llu", when,
                 (unsigned long long)x.series, (unsigned long long)x.buckets_written,
                 (unsigned long long)x.samples_ignored, (unsigned long long)y.series,
                 (unsigned long long)y.buckets_written, (unsigned long long)y.samples_ignored);
}

/* The rollup_state rows of both stores, byte for byte. */
static void assert_state_rows_equal(const char *da, const char *db_dir)
{
    sqlite3 *d[2] = {db_open_rw(da), db_open_rw(db_dir)};
    sqlite3_stmt *st[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(sqlite3_prepare_v2(d[i],
                                            "SELECT series_id, last_t, prev, prev_ok, quote(open) FROM rollup_state"
                                            " ORDER BY series_id",
                                            -1, &st[i], NULL),
                         SQLITE_OK);
    size_t rows = 0;
    for (;;) {
        int rc0 = sqlite3_step(st[0]), rc1 = sqlite3_step(st[1]);
        assert_int_equal(rc0, rc1);
        if (rc0 != SQLITE_ROW)
            break;
        rows++;
        for (int c = 0; c < 5; c++) {
            const char *x = (const char *)sqlite3_column_text(st[0], c), *y = (const char *)sqlite3_column_text(st[1], c);
            if ((x == NULL) != (y == NULL) || (x && strcmp(x, y) != 0))
                fail_msg("rollup_state row %zu column %d: %s, every-state sweep: %s", rows, c, x ? x : "NULL",
                         y ? y : "NULL");
        }
    }
    assert_true(rows > 0);
    for (int i = 0; i < 2; i++) {
        sqlite3_finalize(st[i]);
        sqlite3_close(d[i]);
    }
}

/* The writer's sweep through the due heap against the sweep of every state and the snapshot walk
 * (the writer before the heap), fed the same samples: series that stop and come back (evicted or not), a first sample
 * that is a staleness marker, NaN, duplicates and late samples, a jump of the newest time, checkpoints, an
 * explicit close and restarts. After every cycle both have the same states, the same buckets
 * written and the same samples ignored; reads agree in between (closed lists at their fullest),
 * and the state rows agree at the end. With ~6 series per shard, a cycle pops a few due states
 * or, when most of a shard is due, takes the bulk pass. The heap's store starts its closed-list positions just
 * before their 2^32 wrap. */
/* Ids 97 apart: consecutive ids share a shard (runs of 256), so the series spread over most
 * shards only when their ids are not consecutive. */
#define DUE_ID(s) ((uint64_t)(s) * 97 + 1)

static void test_due_against_every_state(void **state)
{
    (void)state;
    enum { NS = 400 };
    const char *res = "1m:1d,5m:1d,15m:1d";
    fx_t fa = {.dir = make_dir(), .res = res}, fb = {.dir = make_dir(), .res = res};
    rollup_config_t ca = {.resolutions = res, .no_thread = true, .closed_pos_start = UINT32_MAX - 40};
    rollup_config_t cb = {.resolutions = res, .no_thread = true, .sweep_every_state = true};
    fx_open_cfg(&fa, &ca);
    fx_open_cfg(&fb, &cb);
    srand(7);
    double val[NS] = {0};
    int64_t quiet_until[NS] = {0};
    int64_t last_t[NS];
    for (int s = 0; s < NS; s++)
        last_t[s] = INT64_MIN;
    int64_t next_flush = T0 + 3 * MIN_MS;
    int cycles = 0;
    bool jumped = false, closed_explicitly = false;
    for (int64_t t = T0; t < T0 + 3 * HOUR_MS; t += 10000) {
        if (!jumped && t >= T0 + HOUR_MS) { /* nobody sends for 50 minutes */
            t += 50 * MIN_MS;
            jumped = true;
        }
        for (int s = 0; s < NS; s++) {
            if (t < quiet_until[s])
                continue;
            if (rand() % 200 == 0) { /* goes quiet: for minutes, or long enough to be evicted */
                quiet_until[s] = t + (rand() % 2 ? (rand() % 10 + 1) * MIN_MS : (rand() % 60 + 31) * MIN_MS);
                continue;
            }
            if (rand() % 7 == 0)
                continue; /* a missed push */
            int64_t ts = t + rand() % 9000;
            int kind = rand() % 100;
            double v;
            if (s % 2 == 0)
                v = kind < 3 ? (val[s] = rand() % 50) : (val[s] += rand() % 100);
            else
                v = (rand() % 1000) / 8.0;
            if (kind >= 96 || (last_t[s] == INT64_MIN && s % 5 == 0))
                v = stale_nan();
            else if (kind == 95)
                v = NAN;
            rollup_sample_t smp[3] = {{DUE_ID(s), ts, v}};
            size_t n = 1;
            if (kind == 94) /* the same second again: replaces it */
                smp[n++] = (rollup_sample_t){DUE_ID(s), ts - ts % 1000 + 999, v + 1};
            if (kind == 93 && last_t[s] != INT64_MIN) /* late: ignored */
                smp[n++] = (rollup_sample_t){DUE_ID(s), last_t[s] - 2000, 1};
            rollup_add_samples(fa.r, smp, n);
            rollup_add_samples(fb.r, smp, n);
            last_t[s] = ts;
        }
        if (t < next_flush)
            continue;
        /* Reads before the cycle: the closed lists hold everything closed since the last one. */
        for (int i = 0; i < 5; i++) {
            uint64_t id = DUE_ID(rand() % NS);
            for (size_t k = 0; k < 3; k++)
                assert_reads_equal(fa.r, fb.r, id, k, "before a cycle");
        }
        if (!closed_explicitly && t >= T0 + 2 * HOUR_MS + 30 * MIN_MS) {
            rollup_close_buckets_before(fa.r, t - 7 * MIN_MS);
            rollup_close_buckets_before(fb.r, t - 7 * MIN_MS);
            closed_explicitly = true;
        }
        bool ckpt = rand() % 3 == 0;
        assert_int_equal(rollup_flush(fa.r, ckpt), 0);
        assert_int_equal(rollup_flush(fb.r, ckpt), 0);
        char when[64];
        snprintf(when, sizeof(when), "cycle %d at +%lld s", ++cycles, (long long)(t - T0) / 1000);
        assert_stats_equal(fa.r, fb.r, when);
        if (cycles % 17 == 0) { /* a restart: the heap is rebuilt from the loaded states */
            fx_close(&fa);
            fx_close(&fb);
            fx_open_cfg(&fa, &ca);
            fx_open_cfg(&fb, &cb);
        }
        next_flush = t + (rand() % 6 + 1) * MIN_MS / 2;
    }
    rollup_stats_t st;
    rollup_get_stats(fa.r, &st);
    assert_true(st.series > 0 && st.series < NS); /* some were evicted, some were not */
    assert_true(cycles > 40);
    for (int s = 0; s < NS; s++)
        for (size_t k = 0; k < 3; k++)
            assert_reads_equal(fa.r, fb.r, DUE_ID(s), k, "at the end");
    assert_int_equal(rollup_flush(fa.r, true), 0);
    assert_int_equal(rollup_flush(fb.r, true), 0);
    assert_stats_equal(fa.r, fb.r, "last cycle");
    fx_close(&fa);
    fx_close(&fb);
    assert_state_rows_equal(fa.dir, fb.dir);
    remove_dir(fa.dir);
    remove_dir(fb.dir);
}

/* The entries of a compact rollup_state.open value, read by the layout documented in
 * storage/rollup.c ("Tables"), not by the store's own decoder; *bytes gets the value's length. */
static int64_t open_entries(sqlite3 *db, uint64_t id, int64_t *bytes)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "SELECT open FROM rollup_state WHERE series_id = %llu", (unsigned long long)id);
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const uint8_t *p = sqlite3_column_blob(st, 0), *end = p + sqlite3_column_bytes(st, 0);
    *bytes = sqlite3_column_bytes(st, 0);
    int64_t n = 0;
    if (p && p < end) {
        assert_int_equal(*p++, 0xC5);
        while (p < end) {
            uint64_t v, modes = 0;
            for (int k = 0; k < 3; k++) /* res_ms, ts delta, count */
                assert_int_equal(varint_get(&p, end, &v), VARINT_OK);
            assert_int_equal(varint_get(&p, end, &modes), VARINT_OK);
            for (int k = 0; k < 5; k++) {
                if (((modes >> (2 * k)) & 3) == 2) {
                    assert_true(end - p >= 8);
                    p += 8;
                } else {
                    assert_int_equal(varint_get(&p, end, &v), VARINT_OK);
                }
            }
            n++;
        }
    }
    sqlite3_finalize(st);
    return n;
}

/* The number of open entries (pending sample included) in series id's rollup_state row. */
static int64_t state_entries(const char *dir, uint64_t id)
{
    sqlite3 *db = db_open_rw(dir);
    int64_t bytes;
    int64_t n = open_entries(db, id, &bytes);
    sqlite3_close(db);
    return n;
}

/* A series whose finest bucket the writer closed (it went quiet; its hour stays open, due an hour
 * later) comes back: its new minute is committed and closed as soon as the newest sample is a
 * minute past it, not when the hour is due. Series 2 moves the newest time on. */
static void test_due_revived_series(void **state)
{
    (void)state;
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    add(f.r, 1, T0 + 5000, 1);
    add(f.r, 2, T0 + 2 * MIN_MS, 0); /* hw: minute 0 is due */
    assert_int_equal(rollup_flush(f.r, true), 0);
    assert_int_equal(state_entries(f.dir, 1), 1); /* the hour only: pending committed, minute closed */
    add(f.r, 1, T0 + 10 * MIN_MS + 5000, 2);
    add(f.r, 2, T0 + 12 * MIN_MS - 1, 0);
    assert_int_equal(rollup_flush(f.r, true), 0);
    assert_int_equal(state_entries(f.dir, 1), 2); /* the hour and the pending sample */
    add(f.r, 2, T0 + 12 * MIN_MS, 0);
    assert_int_equal(rollup_flush(f.r, true), 0);
    assert_int_equal(state_entries(f.dir, 1), 1); /* minute 10 closed and written */
    rollup_stats_t st;
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.buckets_written, 3); /* series 1's minutes 0 and 10, series 2's minute 2 */
    fx_close(&f);
    remove_dir(f.dir);
}

/* A state with nothing open is evicted by the first cycle whose newest sample is more than the
 * coarsest resolution after its own newest one, to the millisecond: a series whose only sample is
 * a staleness marker (committed, it opens nothing), and one whose buckets an explicit close
 * ended. */
static void test_due_eviction_boundary(void **state)
{
    (void)state;
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    add(f.r, 1, T0 + 5000, stale_nan());
    add(f.r, 2, T0 + 2 * MIN_MS, 0);
    assert_int_equal(rollup_flush(f.r, false), 0); /* the marker is committed */
    rollup_stats_t st;
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, 2);
    add(f.r, 2, T0 + 5000 + HOUR_MS, 0);
    assert_int_equal(rollup_flush(f.r, false), 0);
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, 2);
    add(f.r, 2, T0 + 5000 + HOUR_MS + 1, 0); /* same second: replaces, moves hw by 1 ms */
    assert_int_equal(rollup_flush(f.r, false), 0);
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, 1);

    add(f.r, 3, T0 + 2 * HOUR_MS + 7000, 5);
    rollup_close_buckets_before(f.r, T0 + 4 * HOUR_MS); /* commits and closes everything */
    add(f.r, 2, T0 + 3 * HOUR_MS + 7000, 0);            /* not an hour past series 3 */
    assert_int_equal(rollup_flush(f.r, false), 0);
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, 2);
    add(f.r, 2, T0 + 3 * HOUR_MS + 8000, 0);
    assert_int_equal(rollup_flush(f.r, false), 0);
    rollup_get_stats(f.r, &st);
    assert_int_equal(st.series, 1);
    fx_close(&f);
    remove_dir(f.dir);
}

/* The series table's last_seen: a series the writer holds is marked CATALOG_SEEN_OPEN by about
 * its first snapshots, not rewritten at every minute's snapshot (a trigger counts the writes),
 * stays open across a restart, and gets its newest sample's time when it is evicted. Range
 * filters (catalog_series_by_labels) keep an open series and drop a closed one after its end. */
static int64_t seen_query(sqlite3 *db, const char *fmt, uint64_t id)
{
    char sql[128];
    snprintf(sql, sizeof(sql), fmt, (unsigned long long)id);
    return query_i64(db, sql);
}

static int64_t seen_of(sqlite3 *db, uint64_t id)
{
    return seen_query(db, "SELECT last_seen FROM series WHERE id = %llu", id);
}

static int64_t seen_writes(sqlite3 *db, uint64_t id)
{
    return seen_query(db, "SELECT count(*) FROM seen_log WHERE id = %llu", id);
}

static bool job_seen_after(catalog_t *cat, const char *job, int64_t mint, uint64_t id)
{
    label_t eq[] = {{"job", job}};
    catalog_ids_t ids = {0};
    assert_int_equal(catalog_series_by_labels(cat, eq, 1, mint, INT64_MAX, &ids), 0);
    bool found = false;
    for (size_t i = 0; i < ids.n; i++)
        found |= ids.v[i] == id;
    catalog_ids_free(&ids);
    return found;
}

static void test_last_seen_open_until_evicted(void **state)
{
    (void)state;
    fx_t f = {.dir = make_dir(), .res = "1m:1d,1h:2d"};
    fx_open(&f);
    label_t l7[] = {{"__name__", "a"}, {"job", "seven"}}, l8[] = {{"__name__", "a"}, {"job", "eight"}};
    assert_int_equal(catalog_add_series(f.cat, 7, &(labels_t){l7, 2}, T0), 0);
    assert_int_equal(catalog_add_series(f.cat, 8, &(labels_t){l8, 2}, T0), 0);
    assert_int_equal(catalog_flush(f.cat), 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/sluice.db", f.dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TABLE seen_log(id);"
                                  " CREATE TRIGGER seen_upd AFTER UPDATE OF last_seen ON series"
                                  " BEGIN INSERT INTO seen_log VALUES(new.id); END;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    /* 30 minutes of both, a writer cycle every minute: each closes a 1m bucket of both. */
    int64_t t = T0;
    for (; t < T0 + 30 * MIN_MS; t += 10000) {
        add(f.r, 7, t, 1);
        add(f.r, 8, t, 2);
        if ((t - T0) % MIN_MS == 50000)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    int64_t last7 = t - 10000;
    assert_int_equal(seen_of(db, 7), CATALOG_SEEN_OPEN);
    assert_int_equal(seen_of(db, 8), CATALOG_SEEN_OPEN);
    assert_true(seen_writes(db, 7) >= 1 && seen_writes(db, 7) <= 2); /* not one per cycle (30) */
    assert_true(job_seen_after(f.cat, "seven", T0 + 400 * 24 * HOUR_MS, 7)); /* open: any range */

    /* A restart keeps the mark; the reloaded states write it once more at most. */
    sqlite3_close(db);
    fx_close(&f);
    fx_open(&f);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    assert_int_equal(seen_of(db, 7), CATALOG_SEEN_OPEN);
    int64_t before_restart = seen_writes(db, 8);

    /* 7 goes quiet; 8 goes on for 3 hours, long enough for 7's state to be evicted. */
    for (; t < T0 + 30 * MIN_MS + 3 * HOUR_MS; t += 10000) {
        add(f.r, 8, t, 2);
        if ((t - T0) % MIN_MS == 50000)
            assert_int_equal(rollup_flush(f.r, false), 0);
    }
    rollup_stats_t rs;
    rollup_get_stats(f.r, &rs);
    assert_int_equal(rs.series, 1);
    assert_int_equal(seen_of(db, 7), last7);
    assert_int_equal(seen_of(db, 8), CATALOG_SEEN_OPEN);
    assert_true(seen_writes(db, 8) - before_restart <= 2); /* 180 cycles */
    assert_false(job_seen_after(f.cat, "seven", last7 + 1, 7));
    assert_true(job_seen_after(f.cat, "seven", last7, 7));
    assert_true(job_seen_after(f.cat, "eight", t + HOUR_MS, 8));

    /* It comes back: open again. */
    add(f.r, 7, t, 3);
    add(f.r, 7, t + MIN_MS + 10000, 3);
    add(f.r, 7, t + 2 * MIN_MS + 20000, 3); /* the sample before is aggregated: a bucket closes */
    assert_int_equal(rollup_flush(f.r, false), 0);
    assert_int_equal(seen_of(db, 7), CATALOG_SEEN_OPEN);
    sqlite3_close(db);
    fx_close(&f);
    remove_dir(f.dir);
}

/* The compact rollup_state rows: a store checkpointed, closed and reopened reads every series'
 * open buckets and pending sample exactly as a twin that never restarted, for values of every
 * kind (whole numbers, decimals, random doubles, NaN, staleness markers, -0, infinities), and
 * goes on the same afterwards; counters' rows are well under the 64 bytes per entry of the old
 * layout. */
static void test_state_rows_compact(void **state)
{
    (void)state;
    enum { NS = 40 };
    const char *res = "1m:1d,1h:2d";
    fx_t fa = {.dir = make_dir(), .res = res}, fb = {.dir = make_dir(), .res = res};
    fx_open(&fa);
    fx_open(&fb);
    srand(11);
    double special[] = {NAN, -0.0, INFINITY, -INFINITY, 1e308, 5e-324, 0.1, 3};
    int64_t t = T0;
    for (int round = 0; round < 2; round++) {
        for (int64_t end = t + 7 * MIN_MS + 25000; t < end; t += 10000) {
            for (int s = 0; s < NS; s++) {
                double v;
                switch (s % 5) {
                case 0: v = (double)((t - T0) / 10000 * 1000 + s); break;          /* counter */
                case 1: v = (double)(rand() % 100000) / 1000.0; break;              /* decimals */
                case 2: v = (double)rand() / RAND_MAX * 1e6 + (double)rand() / RAND_MAX; break; /* noise */
                case 3: v = special[(t / 10000 + s) % 8]; break;
                default: v = (t / 10000) % 9 == 0 ? stale_nan() : 42; break;
                }
                add(fa.r, (uint64_t)s + 1, t, v);
                add(fb.r, (uint64_t)s + 1, t, v);
            }
        }
        add(fa.r, 1, t + 1500, 7); /* a pending sample a second past the last round */
        add(fb.r, 1, t + 1500, 7);
        assert_int_equal(rollup_flush(fa.r, true), 0);
        assert_int_equal(rollup_flush(fb.r, true), 0);
        if (round == 0) {
            sqlite3 *db = db_open_rw(fa.dir);
            int64_t bytes, n = open_entries(db, 1, &bytes);
            assert_true(n >= 2);                 /* the hour, the minute, the pending sample */
            assert_true(bytes < 1 + n * 40);     /* a counter: < 40 of the old 64 bytes an entry */
            sqlite3_close(db);
            fx_close(&fa); /* checkpoints, then loads the compact rows back */
            fx_open(&fa);
        }
        for (int s = 0; s < NS; s++)
            for (size_t k = 0; k < 2; k++)
                assert_reads_equal(fa.r, fb.r, (uint64_t)s + 1, k, round == 0 ? "after a restart" : "after more");
        t += 20000;
    }
    rollup_stats_t xa, xb; /* the counters of the restarted one began again; its states did not */
    rollup_get_stats(fa.r, &xa);
    rollup_get_stats(fb.r, &xb);
    assert_int_equal(xa.series, xb.series);
    fx_close(&fa);
    fx_close(&fb);
    assert_state_rows_equal(fa.dir, fb.dir);
    remove_dir(fa.dir);
    remove_dir(fb.dir);
}

/* Reads of series id over [mint, maxt] at resolution res_idx equal the reference's buckets there. */
static void assert_range(rollup_t *r, uint64_t id, size_t res_idx, int64_t mint, int64_t maxt, const ref_t *ref,
                         const char *what)
{
    rollup_buckets_t got = {0}, want = {0};
    assert_int_equal(rollup_read(r, id, res_idx, mint, maxt, &got), 0);
    for (size_t i = 0; i < ref->b.n; i++)
        if (ref->b.v[i].ts >= mint && ref->b.v[i].ts <= maxt) {
            want.v = realloc(want.v, (want.n + 1) * sizeof(*want.v));
            want.v[want.n++] = ref->b.v[i];
        }
    assert_same(&got, &want, what);
    rollup_buckets_free(&got);
    free(want.v);
}

/* A writer cycle every minute, as at the real push cadence: a closed 1m bucket goes into its
 * span's small rollup_recent row, which is folded into the span's blob about every 16 minutes,
 * not into the blob each time (that rewrote the whole span, up to 240 buckets, per bucket).
 * Reads merge the two (a reopened minute has parts in both), across a restart; a series with only
 * a recent row is known to the disk_lo bound; retention deletes recent rows too. */
static void test_recent_rows_fold(void **state)
{
    (void)state;
    fx_t f = {.dir = make_dir(), .res = "1m:2d,1h:60d"};
    fx_open(&f);
    sqlite3 *db = db_open_rw(f.dir);
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TABLE blob_log(res, id);"
                                  " CREATE TRIGGER blob_ins AFTER INSERT ON rollup_blob"
                                  " BEGIN INSERT INTO blob_log VALUES(new.res, new.series_id); END;"
                                  " CREATE TRIGGER blob_upd AFTER UPDATE ON rollup_blob"
                                  " BEGIN INSERT INTO blob_log VALUES(new.res, new.series_id); END;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    enum { NS = 3, LONE = 9000 };
    const uint64_t ids[NS] = {1, 300, 5000}; /* three fold phases */
    ref_t ref[NS][2], lone;
    memset(ref, 0, sizeof(ref));
    memset(&lone, 0, sizeof(lone));
    lone.last_t = INT64_MIN;
    for (int k = 0; k < NS; k++)
        ref[k][0].last_t = ref[k][1].last_t = INT64_MIN;
    const int64_t S0 = T0 - T0 % (4 * HOUR_MS) + 4 * HOUR_MS; /* a 1m span starts here */
    int64_t t = S0, end = S0 + 5 * HOUR_MS;
    double c = 0;
    int minute = 0;
    for (; t < end; t += 10000) {
        c += 7;
        for (int k = 0; k < NS; k++) {
            add(f.r, ids[k], t, c + k);
            ref_add(&ref[k][0], MIN_MS, t, c + k);
            ref_add(&ref[k][1], HOUR_MS, t, c + k);
        }
        if (t < S0 + 3 * MIN_MS) { /* LONE: three minutes at the span's start, then silence */
            add(f.r, LONE, t, c);
            ref_add(&lone, MIN_MS, t, c);
        }
        int64_t in_min = (t - S0) % MIN_MS;
        if (in_min == 20000 && minute % 7 == 3) {
            /* The minute is written while its samples still come (as for a bucket the writer
             * closed for a quiet series): its later samples reopen it, and its two parts may
             * land in the blob and in the recent row. */
            rollup_close_buckets_before(f.r, t - in_min + MIN_MS);
            assert_int_equal(rollup_flush(f.r, false), 0);
        }
        if (in_min == 50000) {
            assert_int_equal(rollup_flush(f.r, false), 0);
            assert_true(query_i64(db, "SELECT coalesce(max(n), 0) FROM rollup_recent") < 32);
            if (++minute % 30 == 0)
                for (int k = 0; k < NS; k++)
                    for (size_t ri = 0; ri < 2; ri++)
                        assert_range(f.r, ids[k], ri, INT64_MIN, INT64_MAX, &ref[k][ri], "every 30 minutes");
        }
    }
    assert_true(query_i64(db, "SELECT count(*) FROM rollup_recent WHERE res = 60000") >= NS);
    for (int k = 0; k < NS; k++) {
        char sql[128];
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM blob_log WHERE res = 60000 AND id = %llu",
                 (unsigned long long)ids[k]);
        int64_t writes = query_i64(db, sql);
        /* 300 minutes: a fold per 16, the two spans' ends, reopened minutes: not one per minute */
        assert_true(writes >= 300 / 16 && writes <= 300 / 8);
    }
    assert_int_equal(query_i64(db, "SELECT count(*) FROM rollup_blob WHERE series_id = 9000"), 0);
    assert_int_equal(query_i64(db, "SELECT n FROM rollup_recent WHERE res = 60000 AND series_id = 9000"), 3);

    /* Across a restart (recent rows are on disk like blobs). */
    sqlite3_close(db);
    fx_close(&f);
    fx_open(&f);
    for (int k = 0; k < NS; k++)
        for (size_t ri = 0; ri < 2; ri++) {
            assert_range(f.r, ids[k], ri, INT64_MIN, INT64_MAX, &ref[k][ri], "after a restart");
            assert_range(f.r, ids[k], ri, S0 + 17 * MIN_MS, S0 + 4 * HOUR_MS + 33 * MIN_MS, &ref[k][ri],
                         "a range across the spans");
        }
    /* LONE comes back (a fresh state): a read finding nothing teaches the state where its disk
     * begins; its recent row must count, or later reads skip the disk. */
    add(f.r, LONE, t, 1);
    lone.prev_ok = false; /* its state was evicted long ago: the increase starts afresh */
    ref_add(&lone, MIN_MS, t, 1);
    assert_range(f.r, LONE, 0, S0 - DAY_MS, S0 - MIN_MS, &lone, "before LONE's first bucket");
    assert_range(f.r, LONE, 0, S0, S0 + HOUR_MS, &lone, "LONE's recent row");
    assert_range(f.r, LONE, 0, INT64_MIN, INT64_MAX, &lone, "LONE, all of it");

    /* Retention takes recent rows with their spans. */
    while (rollup_enforce_retention(f.r, end + 100 * DAY_MS, 64) == 1)
        ;
    db = db_open_rw(f.dir);
    assert_int_equal(query_i64(db, "SELECT count(*) FROM rollup_recent"), 0);
    assert_int_equal(query_i64(db, "SELECT count(*) FROM rollup_blob"), 0);
    sqlite3_close(db);
    fx_close(&f);
    for (int k = 0; k < NS; k++)
        for (size_t ri = 0; ri < 2; ri++)
            free(ref[k][ri].b.v);
    free(lone.b.v);
    remove_dir(f.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_resolutions),
        cmocka_unit_test(test_pick_resolution),
        cmocka_unit_test(test_counter_reset_stale_nan),
        cmocka_unit_test(test_open_bucket_dated_by_last_t),
        cmocka_unit_test(test_late_sample_merges),
        cmocka_unit_test(test_random_against_direct),
        cmocka_unit_test(test_three_resolutions_against_direct),
        cmocka_unit_test(test_disk_lo_saturates_as_lower_bound),
        cmocka_unit_test(test_hinted_adds),
        cmocka_unit_test(test_retention),
        cmocka_unit_test(test_view),
        cmocka_unit_test(test_bytes_per_bucket),
        cmocka_unit_test(test_threaded),
        cmocka_unit_test(test_same_second_replace),
        cmocka_unit_test(test_writer_retention_clock),
        cmocka_unit_test(test_catalog_backlog_in_slices),
        cmocka_unit_test(test_hour_blobs),
        cmocka_unit_test(test_old_layout),
        cmocka_unit_test(test_reader_one_transaction),
        cmocka_unit_test(test_readers_threaded),
        cmocka_unit_test(test_take_while_reading),
        cmocka_unit_test(test_due_against_every_state),
        cmocka_unit_test(test_due_revived_series),
        cmocka_unit_test(test_due_eviction_boundary),
        cmocka_unit_test(test_last_seen_open_until_evicted),
        cmocka_unit_test(test_state_rows_compact),
        cmocka_unit_test(test_recent_rows_fold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
