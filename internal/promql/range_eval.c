/*
 * range_eval — series-major evaluation of range queries: each node of the query evaluates once
 * for all steps to a list of series, each with its labels (computed once) and a dense array of
 * per-step values with presence flags, instead of the whole tree once per step (engine.c).
 *
 * What it evaluates: number literals, time(), parentheses, unary minus, vector selectors
 * (lookback, staleness, offset, @), range-vector functions of a matrix selector (windows slide
 * over the series' samples with two moving pointers; the function bodies are functions.c's, so
 * every value is bit-identical), elementwise functions, histogram_quantile, aggregations but
 * count_values (groups computed once per input series; aggregators.c accumulates each (group,
 * step) in the step-wise order), vector(), scalar(), label_replace / label_join (output labels
 * once per input series), and binary operators of every kind: between scalars, a vector and a
 * scalar, or two vectors -- arithmetic and comparisons with any matching (on / ignoring,
 * group_left / group_right, bool) and and / or / unless; the pairs of series that can match are
 * found once from their signatures, and each pair's values computed at the steps where both are
 * present. Any other node -- subqueries, count_values, timestamp(), absent(), ... -- makes
 * pq_range_eval decline the whole query, which engine.c then evaluates step by step.
 *
 * Equality with the step-wise evaluation is the contract (tests compare the two on every
 * conformance expression):
 *   - order: within a step, the step-wise vector holds series in a node-specific order, and
 *     aggregations and histogram_quantile add up their inputs in it. Every value here keeps its
 *     series in that order ("ordered"), or says it cannot (topk's output, an aggregation whose
 *     groups came first-seen in a different order at some step); an order-sensitive consumer of
 *     an unordered input declines.
 *   - errors: whenever the step-wise evaluation would fail (duplicate label sets, too many
 *     samples, a function's argument check, memory), this one declines too, and the step-wise
 *     run produces the exact error. It counts per step the samples the step-wise run would hold
 *     (pq_count_samples' arithmetic) and replays max_samples at the end. Only timeouts and
 *     cancellation are raised directly.
 *   - roll-ups: pq_note_rollups is called for the same (series, step) reads.
 *
 * An aggregation of a range function (sum by (job) (rate(x[5m])), the common dashboard shape)
 * does not keep the function's values: each series' values go into the groups' state as soon as
 * they are computed (pq_agg_stream_*), when that state is small enough; topk keeps only the
 * values that made a top k. SLUICE_PROMQL_NO_FUSE=1
 * in the environment turns this off, for the tests that compare the two.
 *
 * Memory: all values live in one arena of the query (charged to its budget), released when the
 * result is built or the evaluation declines.
 */
#include <assert.h>
#include <math.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "internal/labels/labels.h"
#include "internal/promql/engine_int.h"
#include "internal/util/buf.h"
#include "internal/util/regex.h"

typedef struct {
    labels_t metric;
    double *v;    /* per step */
    uint8_t *has; /* per step: 1 where the series has a value */
    /* has[] is 0 outside [lo, hi): the steps a series can be present at. A dashboard's 24 h window
     * over one hour of data has values at a twentieth of its steps; every loop over a series'
     * steps stays inside its span, so the empty steps cost nothing per series. */
    size_t lo, hi;
} rv_series_t;

typedef struct {
    bool scalar;
    double *sv; /* scalar: per step */
    rv_series_t *s;
    size_t n;
    bool ordered; /* each step's vector holds the present series in this order */
} rv_val_t;

/* A compiled label_replace regex, freed when the evaluation ends (declined or not). */
typedef struct rv_regex {
    regex_prog_t *re;
    struct rv_regex *next;
} rv_regex_t;

typedef struct {
    pq_ctx_t *c;
    arena_t *a; /* everything below; c->sa points at it while evaluating */
    size_t nsteps;
    int64_t *ts;  /* step times */
    int64_t *cnt; /* per step: samples the step-wise evaluation would have counted */
    bool fuse;    /* aggregations of range functions without materialising the latter */
    arena_t *pa;  /* the samples of the one selector series being read (rv_points), or NULL */
    /* heap memory of the evaluation (not in the arena), freed by rv_free_heap */
    rv_regex_t *regexes; /* malloc'd nodes */
    buf_t text;          /* label_replace / label_join values being built */
} rv_t;

static void rv_free_heap(rv_t *r)
{
    while (r->regexes) {
        rv_regex_t *x = r->regexes;
        r->regexes = x->next;
        regex_free(x->re);
        free(x);
    }
    buf_free(&r->text);
}

/* Gives up: the step-wise evaluation takes over (engine_int.h, pq_range_eval). */
_Noreturn static void rv_decline(rv_t *r)
{
    r->c->err_kind = PROMQL_ERR_NONE;
    longjmp(r->c->jb, 2);
}

/* ---- what is supported ---------------------------------------------------------------------- */

static bool rv_supported(const promql_expr_t *e)
{
    switch (e->kind) {
    case PROMQL_NODE_NUMBER:
    case PROMQL_NODE_VECTOR_SEL: return true;
    case PROMQL_NODE_PAREN: return rv_supported(e->u.paren.expr);
    case PROMQL_NODE_UNARY: return rv_supported(e->u.unary.expr);
    case PROMQL_NODE_BINARY: return rv_supported(e->u.bin.lhs) && rv_supported(e->u.bin.rhs);
    case PROMQL_NODE_AGG:
        if (e->u.agg.op == PROMQL_AGG_COUNT_VALUES)
            return false;
        return (!e->u.agg.param || rv_supported(e->u.agg.param)) && rv_supported(e->u.agg.expr);
    case PROMQL_NODE_CALL: {
        const promql_func_t *f = e->u.call.func;
        if (f->mfn) {
            for (size_t i = 0; i < e->u.call.nargs; i++) {
                const promql_expr_t *a = promql_unwrap_parens(e->u.call.args[i]);
                if (a->type == PROMQL_VT_MATRIX ? a->kind != PROMQL_NODE_MATRIX_SEL : !rv_supported(a))
                    return false;
            }
            return true;
        }
        if (f->efn)
            return rv_supported(e->u.call.args[0]);
        if (strcmp(f->name, "histogram_quantile") == 0)
            return rv_supported(e->u.call.args[0]) && rv_supported(e->u.call.args[1]);
        if (strcmp(f->name, "vector") == 0 || strcmp(f->name, "scalar") == 0)
            return rv_supported(e->u.call.args[0]);
        if (strcmp(f->name, "label_replace") == 0 || strcmp(f->name, "label_join") == 0) {
            for (size_t i = 1; i < e->u.call.nargs; i++)
                if (promql_unwrap_parens(e->u.call.args[i])->kind != PROMQL_NODE_STRING)
                    return false;
            return rv_supported(e->u.call.args[0]);
        }
        return strcmp(f->name, "time") == 0;
    }
    default: return false;
    }
}

/* ---- values --------------------------------------------------------------------------------- */

static rv_val_t rv_scalar(rv_t *r)
{
    rv_val_t v = {.scalar = true, .ordered = true};
    v.sv = arena_alloc(r->a, r->nsteps * sizeof(double));
    return v;
}

static rv_val_t rv_vector(rv_t *r, size_t cap)
{
    rv_val_t v = {.ordered = true};
    v.s = arena_alloc(r->a, (cap ? cap : 1) * sizeof(rv_series_t));
    return v;
}

/* A new series at the end of v (cap permitting), values to be filled at steps [lo, hi) at most,
 * nothing present. */
static rv_series_t *rv_add_span(rv_t *r, rv_val_t *v, labels_t metric, size_t lo, size_t hi)
{
    rv_series_t *s = &v->s[v->n++];
    s->metric = metric;
    s->v = arena_alloc(r->a, r->nsteps * sizeof(double));
    s->has = arena_calloc(r->a, r->nsteps, 1);
    s->lo = lo < hi ? lo : 0;
    s->hi = lo < hi ? hi : 0;
    return s;
}

static rv_series_t *rv_add(rv_t *r, rv_val_t *v, labels_t metric)
{
    return rv_add_span(r, v, metric, 0, r->nsteps);
}

/* Narrows s's span to its first and last present step (empty: lo = hi = 0); returns how many
 * steps it is present at. */
static size_t rv_tighten(rv_series_t *s)
{
    size_t lo = s->lo, hi = s->hi, k = 0;
    while (lo < hi && !s->has[lo])
        lo++;
    while (hi > lo && !s->has[hi - 1])
        hi--;
    for (size_t st = lo; st < hi; st++)
        k += s->has[st];
    s->lo = k ? lo : 0;
    s->hi = k ? hi : 0;
    return k;
}

/* Counts s's samples as the step-wise pushes count them. */
static void rv_count(rv_t *r, const rv_series_t *s)
{
    for (size_t st = s->lo; st < s->hi; st++)
        r->cnt[st] += s->has[st];
}

/* Drops the last series again when it has no value at any step (the step-wise vectors never hold
 * it); else, with `count`, counts its samples as the step-wise pushes count them. */
static void rv_settle(rv_t *r, rv_val_t *v, bool count)
{
    rv_series_t *s = &v->s[v->n - 1];
    if (rv_tighten(s) == 0)
        v->n--;
    else if (count)
        rv_count(r, s);
}

static int64_t rv_sat_add(int64_t a, int64_t b)
{
    int64_t s;
    return __builtin_add_overflow(a, b, &s) ? (b > 0 ? INT64_MAX : INT64_MIN) : s;
}

/* The steps [*lo, *hi) whose evaluation time minus `off` (a selector's window end) lies in
 * [tmin, tmax]: where a series whose samples span [tmin, tmax] (lookback or range included) can
 * have a value. */
static void rv_step_span(rv_t *r, promql_at_t at, int64_t at_ms, int64_t off, int64_t tmin, int64_t tmax, size_t *lo,
                         size_t *hi)
{
    *lo = *hi = 0;
    if (tmin > tmax)
        return;
    if (at != PROMQL_AT_NONE) { /* one window end for every step */
        int64_t te = pq_resolve_at(r->c, at, at_ms, r->ts[0]) - off;
        if (te >= tmin && te <= tmax)
            *hi = r->nsteps;
        return;
    }
    /* te(st) = start + st * interval - off, increasing in st; in 128 bits, as offsets, @ times and
     * sample times a client chose may be anywhere in int64 */
    __int128 start = (__int128)r->ts[0] - off, iv = r->c->interval, last = (__int128)r->nsteps - 1;
    __int128 a = tmin <= start ? 0 : ((__int128)tmin - start + iv - 1) / iv;
    __int128 b = tmax < start ? -1 : ((__int128)tmax - start) / iv;
    if (b > last)
        b = last;
    if (a > b)
        return;
    *lo = (size_t)a;
    *hi = (size_t)b + 1;
}

#ifndef NDEBUG
/* The span invariant: nothing present outside [lo, hi). */
static void rv_assert_spans(const rv_t *r, const rv_val_t *v)
{
    for (size_t i = 0; i < v->n; i++) {
        assert(v->s[i].lo <= v->s[i].hi && v->s[i].hi <= r->nsteps);
        for (size_t st = 0; st < r->nsteps; st++)
            assert(!v->s[i].has[st] || (st >= v->s[i].lo && st < v->s[i].hi));
    }
}
#endif

/* The step-wise evaluation would already fail on max_samples somewhere: no need to go on. */
static void rv_check_samples(rv_t *r)
{
    for (size_t i = 0; i < r->nsteps; i++)
        if (r->cnt[i] > r->c->max_samples)
            rv_decline(r);
}

/* Declines when two of the n series s with one key are present at one step (a step where `when`
 * is set, if given) -- or, with `any_step`, when two merely share a key. */
static void rv_check_keys(rv_t *r, const uint64_t *keys, const rv_series_t *s, size_t n, const uint8_t *when,
                          bool any_step)
{
    if (n < 2)
        return;
    pq_ctx_t *c = r->c;
    hashmap_t m;
    pq_hmap_init(c, &m, n);
    uint8_t **uni = arena_calloc(r->a, n, sizeof(*uni)); /* presence union by first series */
    for (size_t i = 0; i < n; i++) {
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, keys[i], i, &ex);
        if (!ex)
            continue;
        if (any_step)
            rv_decline(r);
        size_t j = (size_t)*p;
        if (!uni[j]) {
            uni[j] = arena_alloc(r->a, r->nsteps);
            memcpy(uni[j], s[j].has, r->nsteps);
        }
        for (size_t k = s[i].lo; k < s[i].hi; k++) {
            if ((uni[j][k] & s[i].has[k]) && (!when || when[k]))
                rv_decline(r);
            uni[j][k] |= s[i].has[k];
        }
    }
}

/* The step-wise check_dups: two series of one label set present at one step is an error there.
 * With `any_step` (range_dups_note's rule for range-vector functions) it is an error even when
 * they never meet. Series of one label set at different steps are fine (the result merges them). */
static void rv_check_dups(rv_t *r, const rv_val_t *v, bool any_step)
{
    if (v->n < 2)
        return;
    uint64_t *keys = arena_alloc(r->a, v->n * sizeof(*keys));
    for (size_t i = 0; i < v->n; i++)
        keys[i] = labels_hash(&v->s[i].metric);
    rv_check_keys(r, keys, v->s, v->n, NULL, any_step);
}

/* ---- nodes ---------------------------------------------------------------------------------- */

static rv_val_t rv_eval(rv_t *r, const promql_expr_t *e);

/* The samples of a selector series, decoded from its chunks (stale markers left out with
 * drop_stale); valid until the next call: one series' samples are in memory at a time. */
static const promql_point_t *rv_points(rv_t *r, const pq_seldata_t *sd, const pq_sseries_t *ss, bool drop_stale,
                                       size_t *n)
{
    if (!r->pa)
        r->pa = pq_owned_create(r->c);
    arena_reset(r->pa);
    size_t most = pq_sseries_bound(ss);
    promql_point_t *p = arena_alloc(r->pa, (most + 1) * sizeof(*p));
    *n = pq_sseries_decode(sd, ss, drop_stale, p, most, NULL);
    return p;
}

static int64_t rv_te(rv_t *r, promql_at_t at, int64_t at_ms, int64_t off, size_t step)
{
    return (at == PROMQL_AT_NONE ? r->ts[step] : pq_resolve_at(r->c, at, at_ms, r->ts[step])) - off;
}

/* Newest sample in [te - lookback, te] that is no stale marker; one pointer per series. */
static rv_val_t rv_vector_sel(rv_t *r, const promql_expr_t *e)
{
    pq_ctx_t *c = r->c;
    const pq_seldata_t *sd = &c->sel[e->u.sel.id];
    rv_val_t out = rv_vector(r, sd->n);
    for (size_t i = 0; i < sd->n; i++) {
        const pq_sseries_t *ss = &sd->s[i];
        size_t np;
        const promql_point_t *pts = rv_points(r, sd, ss, false, &np);
        size_t lo = 0, hi = 0; /* the steps whose lookback window [te - lookback, te] holds a sample */
        if (np)
            rv_step_span(r, e->u.sel.at, e->u.sel.at_ms, e->u.sel.offset_ms, pts[0].t,
                         rv_sat_add(pts[np - 1].t, c->lookback), &lo, &hi);
        rv_series_t *o = rv_add_span(r, &out, ss->metric, lo, hi);
        ssize_t k = -1; /* last point with t <= te */
        for (size_t st = lo; st < hi; st++) {
            int64_t te = rv_te(r, e->u.sel.at, e->u.sel.at_ms, e->u.sel.offset_ms, st);
            while (k + 1 < (ssize_t)np && pts[k + 1].t <= te)
                k++;
            if (k < 0 || pts[k].t < te - c->lookback || promql_is_stale_nan(pts[k].v))
                continue;
            if (pts[k].t < ss->rollup_until)
                pq_note_rollups(c, NULL, 0, te, ss->rollup_res, ss->rollup_until);
            o->v[st] = pts[k].v;
            o->has[st] = 1;
        }
        rv_settle(r, &out, true);
        pq_check_interrupt(c);
    }
    return out;
}

/* Where rv_call_range hands its values when an aggregation consumes them right away (their
 * series then keep labels and presence, for the duplicate checks, but no values). */
typedef struct {
    pq_agg_stream_t *agg;
    const uint32_t *gid; /* group by selector series */
} rv_sink_t;

/* The matrix selector argument of a range-vector function. */
static const promql_expr_t *rv_matrix_arg(const promql_expr_t *e)
{
    for (size_t i = 0; i < e->u.call.nargs; i++) {
        const promql_expr_t *a = promql_unwrap_parens(e->u.call.args[i]);
        if (a->type == PROMQL_VT_MATRIX)
            return a;
    }
    return NULL;
}

/* The labels a range-vector function gives a selector series. */
static labels_t rv_range_out_labels(rv_t *r, const promql_func_t *f, labels_t metric)
{
    return f->keep_name ? metric : pq_labels_drop_name(r->c, metric);
}

/* A range-vector function of a matrix selector: the window [te - range, te] of each series slides
 * over its (stale-marker-free) samples; the function runs on every non-empty window. */
static rv_val_t rv_call_range(rv_t *r, const promql_expr_t *e, const rv_sink_t *sink)
{
    pq_ctx_t *c = r->c;
    const promql_func_t *f = e->u.call.func;
    const promql_expr_t *ms = NULL;
    const double *sargs[4] = {NULL, NULL, NULL, NULL};
    for (size_t i = 0; i < e->u.call.nargs; i++) {
        const promql_expr_t *a = promql_unwrap_parens(e->u.call.args[i]);
        if (a->type == PROMQL_VT_MATRIX) {
            if (!ms)
                ms = a;
        } else if (i < 4) {
            sargs[i] = rv_eval(r, a).sv;
        }
    }
    const pq_seldata_t *sd = &c->sel[ms->u.sel.id];
    int64_t range = ms->u.sel.range_ms;
    bool track = !f->keep_name && sd->n > 0 && pq_range_arg_may_collide(c, ms);
    pq_fcall_t fc = {.call = e, .range_ms = range};
    rv_val_t out = rv_vector(r, sd->n);
    double *scratch = sink ? arena_alloc(r->a, r->nsteps * sizeof(double)) : NULL;
    for (size_t i = 0; i < sd->n; i++) {
        const pq_sseries_t *ss = &sd->s[i];
        arena_mark_t smark = arena_mark(r->a);
        double *vals = sink ? scratch : arena_alloc(r->a, r->nsteps * sizeof(double));
        uint8_t *has = arena_calloc(r->a, r->nsteps, 1);
        arena_mark_t fmark = arena_mark(r->a); /* temporaries of the series from here */
        size_t n;
        const promql_point_t *p = rv_points(r, sd, ss, true, &n);
        arena_mark_t cmark = arena_mark(r->a); /* temporaries of one call from here */
        size_t any = 0;
        size_t lo = 0, hi = 0; /* window: p[lo, hi) */
        fc.rollup_until = ss->rollup_until;
        size_t slo = 0, shi = 0; /* the steps whose window [te - range, te] holds a point */
        if (n)
            rv_step_span(r, ms->u.sel.at, ms->u.sel.at_ms, ms->u.sel.offset_ms, p[0].t, rv_sat_add(p[n - 1].t, range),
                         &slo, &shi);
        for (size_t st = slo; st < shi; st++) {
            int64_t te = rv_te(r, ms->u.sel.at, ms->u.sel.at_ms, ms->u.sel.offset_ms, st);
            while (lo < n && p[lo].t < te - range)
                lo++;
            if (hi < lo)
                hi = lo;
            while (hi < n && p[hi].t <= te)
                hi++;
            if (hi <= lo)
                continue;
            r->cnt[st] += (int64_t)(hi - lo); /* the step-wise window (mat_push) */
            if (p[lo].t < ss->rollup_until)
                pq_note_rollups(c, sd->func, range, te, ss->rollup_res, ss->rollup_until);
            fc.t = r->ts[st];
            fc.win_end = te;
            for (int a = 0; a < 4; a++)
                if (sargs[a])
                    fc.sargs[a] = sargs[a][st];
            double v;
            bool ok = f->mfn(c, &fc, p + lo, hi - lo, &v);
            arena_rewind(r->a, cmark);
            if (ok) {
                vals[st] = v;
                has[st] = 1;
                any++;
            }
        }
        if (!any) {
            arena_rewind(r->a, smark);
        } else {
            arena_rewind(r->a, fmark);
            rv_series_t *o = &out.s[out.n++];
            o->metric = rv_range_out_labels(r, f, ss->metric);
            o->v = sink ? NULL : vals;
            o->has = has;
            o->lo = slo;
            o->hi = shi;
            rv_tighten(o);
            if (sink)
                pq_agg_stream_add(c, sink->agg, out.n - 1, sink->gid[i], vals, has, o->lo, o->hi);
            rv_count(r, o);
        }
        pq_check_interrupt(c);
    }
    rv_check_dups(r, &out, track);
    return out;
}

static rv_val_t rv_call_elementwise(rv_t *r, const promql_expr_t *e)
{
    const promql_func_t *f = e->u.call.func;
    rv_val_t in = rv_eval(r, e->u.call.args[0]);
    rv_val_t out = rv_vector(r, in.n);
    out.ordered = in.ordered;
    for (size_t i = 0; i < in.n; i++) {
        const rv_series_t *s = &in.s[i];
        rv_series_t *o =
            rv_add_span(r, &out, f->keep_name ? s->metric : pq_labels_drop_name(r->c, s->metric), s->lo, s->hi);
        for (size_t st = s->lo; st < s->hi; st++) {
            if (s->has[st]) {
                o->v[st] = f->efn(s->v[st]);
                o->has[st] = 1;
            }
        }
        rv_settle(r, &out, true);
    }
    rv_check_dups(r, &out, false);
    return out;
}

/* histogram_quantile: buckets grouped once per input series by their labels but `le`. */
static rv_val_t rv_histogram_quantile(rv_t *r, const promql_expr_t *e)
{
    pq_ctx_t *c = r->c;
    rv_val_t q = rv_eval(r, e->u.call.args[0]);
    rv_val_t in = rv_eval(r, e->u.call.args[1]);
    if (!in.ordered)
        rv_decline(r);
    static const char *const le[] = {"le"};
    static const char *const name_le[] = {LABEL_METRIC_NAME, "le"};
    uint32_t *gid = arena_alloc(r->a, (in.n ? in.n : 1) * sizeof(*gid));
    double *ub = arena_alloc(r->a, (in.n ? in.n : 1) * sizeof(*ub));
    size_t *members = arena_calloc(r->a, in.n ? in.n : 1, sizeof(*members));
    rv_val_t out = rv_vector(r, in.n);
    hashmap_t m;
    pq_hmap_init(c, &m, in.n);
    for (size_t i = 0; i < in.n; i++) {
        gid[i] = UINT32_MAX;
        if (!pq_parse_float_go(labels_get(&in.s[i].metric, "le"), &ub[i]))
            continue;
        labels_t sig = pq_labels_del(c, in.s[i].metric, le, 1);
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, labels_hash(&sig), out.n, &ex);
        if (!ex)
            rv_add(r, &out, pq_labels_del(c, in.s[i].metric, name_le, 2));
        gid[i] = (uint32_t)*p;
        members[*p]++;
    }
    pq_bucket_t **bk = arena_alloc(r->a, (out.n ? out.n : 1) * sizeof(*bk));
    size_t *bn = arena_alloc(r->a, (out.n ? out.n : 1) * sizeof(*bn));
    for (size_t g = 0; g < out.n; g++)
        bk[g] = arena_alloc(r->a, members[g] * sizeof(pq_bucket_t));
    size_t ulo = r->nsteps, uhi = 0; /* the steps some bucket is present at lie in [ulo, uhi) */
    for (size_t i = 0; i < in.n; i++) {
        if (gid[i] != UINT32_MAX && in.s[i].lo < ulo)
            ulo = in.s[i].lo;
        if (gid[i] != UINT32_MAX && in.s[i].hi > uhi)
            uhi = in.s[i].hi;
    }
    for (size_t st = ulo; st < uhi; st++) {
        memset(bn, 0, (out.n ? out.n : 1) * sizeof(*bn));
        int64_t last_first = -1;
        for (size_t i = 0; i < in.n; i++) {
            if (gid[i] == UINT32_MAX || !in.s[i].has[st])
                continue;
            uint32_t g = gid[i];
            if (bn[g] == 0) {
                if ((int64_t)g < last_first)
                    out.ordered = false;
                last_first = g;
            }
            bk[g][bn[g]++] = (pq_bucket_t){ub[i], in.s[i].v[st]};
        }
        for (size_t g = 0; g < out.n; g++) {
            if (bn[g] == 0)
                continue;
            out.s[g].v[st] = pq_bucket_quantile(q.sv[st], bk[g], bn[g]);
            out.s[g].has[st] = 1;
            r->cnt[st]++;
        }
    }
    for (size_t g = 0; g < out.n; g++)
        rv_tighten(&out.s[g]);
    pq_check_interrupt(c);
    rv_check_dups(r, &out, false);
    return out;
}

/* The most memory the (group, step) state of a fused aggregation may take. */
#define RV_FUSE_MAX_BYTES (64u << 20)

/* agg(f(m[r])) without f's values in memory: the groups come from the selector's series (f's
 * output labels are theirs, maybe without __name__), and each series' values go into the groups'
 * state as soon as they are computed. Returns false (nothing done) where it does not apply. */
static bool rv_aggregate_fused(rv_t *r, const promql_expr_t *e, const double *param, rv_val_t *out)
{
    pq_ctx_t *c = r->c;
    promql_op_t op = e->u.agg.op;
    const promql_expr_t *call = promql_unwrap_parens(e->u.agg.expr);
    bool heaps = op == PROMQL_AGG_TOPK || op == PROMQL_AGG_BOTTOMK;
    if (call->kind != PROMQL_NODE_CALL || !call->u.call.func->mfn)
        return false;
    const pq_seldata_t *sd = &c->sel[rv_matrix_arg(call)->u.sel.id];
    size_t n = sd->n ? sd->n : 1;
    uint32_t *gid = arena_alloc(r->a, n * sizeof(*gid));
    labels_t *glabels = arena_alloc(r->a, n * sizeof(*glabels));
    size_t ng = 0;
    hashmap_t m;
    pq_hmap_init(c, &m, sd->n);
    for (size_t i = 0; i < sd->n; i++) {
        labels_t gl;
        uint64_t key = pq_agg_group_key(c, e, rv_range_out_labels(r, call->u.call.func, sd->s[i].metric), &gl);
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, key, ng, &ex);
        if (!ex)
            glabels[ng++] = gl;
        gid[i] = (uint32_t)*p;
    }
    if ((double)ng * (double)r->nsteps * (double)pq_agg_stream_cell_bytes() > RV_FUSE_MAX_BYTES)
        return false;
    rv_sink_t sink = {pq_agg_stream_begin(c, op, ng, r->nsteps, param), gid};
    rv_val_t in = rv_call_range(r, call, &sink);
    if (heaps) { /* the inputs that were in some top k, with their values there */
        double **ov = arena_calloc(r->a, in.n ? in.n : 1, sizeof(*ov));
        uint8_t **oh = arena_calloc(r->a, in.n ? in.n : 1, sizeof(*oh));
        pq_agg_stream_end(c, sink.agg, param, ov, oh, r->cnt);
        *out = rv_vector(r, in.n);
        out->ordered = false;
        for (size_t i = 0; i < in.n; i++) {
            if (!ov[i])
                continue;
            rv_series_t *o = &out->s[out->n++]; /* in some top k: at steps where in.s[i] is present */
            *o = (rv_series_t){in.s[i].metric, ov[i], oh[i], in.s[i].lo, in.s[i].hi};
            rv_tighten(o);
        }
        return true;
    }
    *out = rv_vector(r, ng);
    double **ov = arena_alloc(r->a, (ng ? ng : 1) * sizeof(*ov));
    uint8_t **oh = arena_alloc(r->a, (ng ? ng : 1) * sizeof(*oh));
    for (size_t g = 0; g < ng; g++) {
        rv_series_t *o = rv_add(r, out, glabels[g]);
        ov[g] = o->v;
        oh[g] = o->has;
    }
    out->ordered = pq_agg_stream_end(c, sink.agg, param, ov, oh, r->cnt);
    size_t k = 0; /* groups whose series never had a value */
    for (size_t g = 0; g < out->n; g++)
        if (rv_tighten(&out->s[g]))
            out->s[k++] = out->s[g];
    out->n = k;
    return true;
}

static rv_val_t rv_aggregate(rv_t *r, const promql_expr_t *e)
{
    pq_ctx_t *c = r->c;
    promql_op_t op = e->u.agg.op;
    const double *param = e->u.agg.param ? rv_eval(r, e->u.agg.param).sv : NULL;
    rv_val_t fused;
    if (r->fuse && rv_aggregate_fused(r, e, param, &fused))
        return fused;
    rv_val_t in = rv_eval(r, e->u.agg.expr);
    if (!in.ordered)
        rv_decline(r);
    bool heaps = op == PROMQL_AGG_TOPK || op == PROMQL_AGG_BOTTOMK;
    size_t nin = in.n ? in.n : 1;
    uint32_t *gid = arena_alloc(r->a, nin * sizeof(*gid));
    double **iv = arena_alloc(r->a, nin * sizeof(*iv));
    uint8_t **ih = arena_alloc(r->a, nin * sizeof(*ih));
    size_t *ilo = arena_alloc(r->a, nin * sizeof(*ilo)), *ihi = arena_alloc(r->a, nin * sizeof(*ihi));
    labels_t *glabels = arena_alloc(r->a, nin * sizeof(*glabels));
    size_t ng = 0;
    hashmap_t m;
    pq_hmap_init(c, &m, in.n);
    for (size_t i = 0; i < in.n; i++) {
        labels_t gl;
        uint64_t key = pq_agg_group_key(c, e, in.s[i].metric, &gl);
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, key, ng, &ex);
        if (!ex)
            glabels[ng++] = gl;
        gid[i] = (uint32_t)*p;
        iv[i] = in.s[i].v;
        ih[i] = in.s[i].has;
        ilo[i] = in.s[i].lo;
        ihi[i] = in.s[i].hi;
    }
    size_t nout = heaps ? in.n : ng;
    rv_val_t out = rv_vector(r, nout);
    for (size_t i = 0; i < nout; i++) { /* topk: an input comes out only where it is present */
        if (heaps)
            rv_add_span(r, &out, in.s[i].metric, ilo[i], ihi[i]);
        else
            rv_add(r, &out, glabels[i]);
    }
    double **ov = arena_alloc(r->a, (nout ? nout : 1) * sizeof(*ov));
    uint8_t **oh = arena_alloc(r->a, (nout ? nout : 1) * sizeof(*oh));
    for (size_t i = 0; i < nout; i++) {
        ov[i] = out.s[i].v;
        oh[i] = out.s[i].has;
    }
    pq_agg_range_t a = {.nsteps = r->nsteps,
                        .nin = in.n,
                        .ngroups = ng,
                        .v = iv,
                        .has = (const uint8_t *const *)ih,
                        .lo = ilo,
                        .hi = ihi,
                        .gid = gid,
                        .param = param,
                        .ov = ov,
                        .ohas = oh,
                        .cnt = r->cnt};
    pq_aggregate_range(c, op, &a);
    out.ordered = a.ordered;
    size_t k = 0; /* drop series that never came out (topk) */
    for (size_t i = 0; i < out.n; i++)
        if (rv_tighten(&out.s[i]))
            out.s[k++] = out.s[i];
    out.n = k;
    return out;
}

/* ---- vector / vector operators -------------------------------------------------------------- */

/* Per step: 1 where some series of v is present. */
static uint8_t *rv_any_present(rv_t *r, const rv_val_t *v)
{
    uint8_t *any = arena_calloc(r->a, r->nsteps, 1);
    for (size_t i = 0; i < v->n; i++)
        for (size_t st = v->s[i].lo; st < v->s[i].hi; st++)
            any[st] |= v->s[i].has[st];
    return any;
}

/* The matching signature of each series of v under e's on / ignoring, computed once. */
static uint64_t *rv_signatures(rv_t *r, const promql_expr_t *e, const rv_val_t *v)
{
    uint64_t *sig = arena_alloc(r->a, (v->n ? v->n : 1) * sizeof(*sig));
    for (size_t i = 0; i < v->n; i++)
        sig[i] = pq_match_signature(r->c, v->s[i].metric, e->u.bin.on, &e->u.bin.labels);
    return sig;
}

/* and / or / unless. Step-wise, each step looks up the signatures of one side's present series
 * in a set of the other side's; here each signature of the looked-up side gets, once, the steps
 * where some series with it is present, and every series of the other side keeps the steps its
 * signature is present (and) or absent (unless, or's right side). Values and labels are the
 * input's; the output holds the left side's series in order, then (or) the right side's. */
static rv_val_t rv_set_binop(rv_t *r, const promql_expr_t *e, const rv_val_t *l, const rv_val_t *rr)
{
    pq_ctx_t *c = r->c;
    promql_op_t op = e->u.bin.op;
    bool is_or = op == PROMQL_OP_OR;
    const rv_val_t *idx = is_or ? l : rr;  /* the side whose signatures are looked up */
    const rv_val_t *scan = is_or ? rr : l; /* the side filtered by them */
    uint64_t *isig = rv_signatures(r, e, idx);
    hashmap_t m;
    pq_hmap_init(c, &m, idx->n);
    uint8_t **pres = arena_alloc(r->a, (idx->n ? idx->n : 1) * sizeof(*pres));
    size_t np = 0;
    for (size_t i = 0; i < idx->n; i++) {
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, isig[i], np, &ex);
        if (!ex)
            pres[np++] = arena_calloc(r->a, r->nsteps, 1);
        uint8_t *ps = pres[*p];
        for (size_t st = idx->s[i].lo; st < idx->s[i].hi; st++)
            ps[st] |= idx->s[i].has[st];
    }
    rv_val_t out = rv_vector(r, l->n + (is_or ? rr->n : 0));
    out.ordered = l->ordered && (!is_or || rr->ordered);
    if (is_or) { /* the left side as it is */
        for (size_t i = 0; i < l->n; i++) {
            rv_series_t o = l->s[i];
            if (rv_tighten(&o)) {
                rv_count(r, &o);
                out.s[out.n++] = o;
            }
        }
    }
    uint64_t *ssig = rv_signatures(r, e, scan);
    for (size_t i = 0; i < scan->n; i++) {
        const rv_series_t *s = &scan->s[i];
        const uint64_t *p = hashmap_get(&m, ssig[i]);
        const uint8_t *ps = p ? pres[*p] : NULL;
        if (op == PROMQL_OP_AND && !ps)
            continue;
        uint8_t *has = arena_calloc(r->a, r->nsteps, 1);
        for (size_t st = s->lo; st < s->hi; st++) {
            bool other = ps && ps[st];
            has[st] = s->has[st] && (op == PROMQL_OP_AND ? other : !other);
        }
        rv_series_t o = {s->metric, s->v, has, s->lo, s->hi};
        if (rv_tighten(&o)) {
            rv_count(r, &o);
            out.s[out.n++] = o;
        }
    }
    rv_check_dups(r, &out, false);
    return out;
}

/* Arithmetic and comparisons between two vectors, with any matching. Step-wise, each step
 * indexes the "one" side's present series by signature (two of one signature: "many-to-many
 * matching not allowed", unless the other side is empty then), and each present series of the
 * "many" side (the left one; the right one for group_right) that finds its match there gives a
 * sample. Here the pairs that can match are found once, from the signatures; a pair gives values
 * at the steps where both are present. A series of the many side matching different series over
 * time (series churn) gives one output series per distinct result label set; at any one step at
 * most one of them is present, so every step's output is in the many side's order. The errors
 * (two matches on the one side, two samples for one match group) make the evaluation decline. */
static rv_val_t rv_vector_binop(rv_t *r, const promql_expr_t *e, const rv_val_t *l, const rv_val_t *rr)
{
    pq_ctx_t *c = r->c;
    promql_op_t op = e->u.bin.op;
    promql_card_t card = e->u.bin.card;
    bool rb = e->u.bin.return_bool;
    bool swap = card == PROMQL_CARD_ONE_TO_MANY;
    const rv_val_t *many = swap ? rr : l, *one = swap ? l : rr;
    uint8_t *many_any = rv_any_present(r, many);
    uint64_t *osig = rv_signatures(r, e, one);
    rv_check_keys(r, osig, one->s, one->n, many_any, false); /* duplicate series for the match group */
    /* the one side's series by signature: first index in the map, the rest chained */
    hashmap_t m;
    pq_hmap_init(c, &m, one->n);
    size_t *next = arena_alloc(r->a, (one->n ? one->n : 1) * sizeof(*next));
    size_t *tail = arena_alloc(r->a, (one->n ? one->n : 1) * sizeof(*tail));
    for (size_t j = 0; j < one->n; j++) {
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, osig[j], j, &ex);
        next[j] = SIZE_MAX;
        tail[j] = j;
        if (ex) {
            next[tail[*p]] = j;
            tail[*p] = j;
        }
    }
    uint64_t *msig = rv_signatures(r, e, many);
    size_t cap = 0;
    for (size_t i = 0; i < many->n; i++) {
        const uint64_t *p = hashmap_get(&m, msig[i]);
        for (size_t j = p ? (size_t)*p : SIZE_MAX; j != SIZE_MAX; j = next[j])
            cap++;
    }
    rv_val_t out = rv_vector(r, cap);
    out.ordered = many->ordered;
    uint64_t *ohash = arena_alloc(r->a, (cap ? cap : 1) * sizeof(*ohash)); /* labels_hash per output */
    uint64_t *okey = arena_alloc(r->a, (cap ? cap : 1) * sizeof(*okey));   /* its match key */
    for (size_t i = 0; i < many->n; i++) {
        const uint64_t *p = hashmap_get(&m, msig[i]);
        const rv_series_t *a = &many->s[i];
        size_t first = out.n; /* outputs of this series from here */
        for (size_t j = p ? (size_t)*p : SIZE_MAX; j != SIZE_MAX; j = next[j]) {
            const rv_series_t *b = &one->s[j];
            size_t st0 = a->lo > b->lo ? a->lo : b->lo, st1 = a->hi < b->hi ? a->hi : b->hi;
            while (st0 < st1 && !(a->has[st0] && b->has[st0]))
                st0++;
            if (st0 >= st1)
                continue; /* never present together */
            labels_t mt = pq_binop_result_metric(c, e, a->metric, b->metric);
            if (rb)
                mt = pq_labels_drop_name(c, mt);
            uint64_t h = labels_hash(&mt);
            size_t k = first;
            while (k < out.n && ohash[k] != h)
                k++;
            if (k == out.n) {
                rv_add(r, &out, mt);
                ohash[k] = h;
                /* one-to-one: one sample per signature; else per (signature, result labels) */
                okey[k] = card == PROMQL_CARD_ONE_TO_ONE
                              ? msig[i]
                              : msig[i] ^ (h * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL);
            }
            rv_series_t *o = &out.s[k];
            for (size_t st = st0; st < st1; st++) {
                if (!a->has[st] || !b->has[st])
                    continue;
                double vl = a->v[st], vr = b->v[st];
                if (swap) {
                    vl = b->v[st];
                    vr = a->v[st];
                }
                bool keep;
                double v = pq_elem_binop(op, vl, vr, &keep);
                if (rb)
                    v = keep ? 1.0 : 0.0;
                else if (!keep)
                    continue;
                o->v[st] = v;
                o->has[st] = 1;
            }
        }
        pq_check_interrupt(c);
    }
    size_t k = 0; /* drop outputs that never had a sample (comparisons) */
    for (size_t i = 0; i < out.n; i++) {
        if (rv_tighten(&out.s[i])) {
            rv_count(r, &out.s[i]);
            okey[k] = okey[i];
            out.s[k++] = out.s[i];
        }
    }
    out.n = k;
    rv_check_keys(r, okey, out.s, out.n, NULL, false); /* multiple matches for labels */
    rv_check_dups(r, &out, false);
    return out;
}

/* ---- functions of instant vectors that are not elementwise ---------------------------------- */

/* vector(s): one series without labels. */
static rv_val_t rv_call_vector(rv_t *r, const promql_expr_t *e)
{
    rv_val_t s = rv_eval(r, e->u.call.args[0]);
    rv_val_t out = rv_vector(r, 1);
    uint8_t *has = arena_alloc(r->a, r->nsteps);
    memset(has, 1, r->nsteps);
    out.s[out.n++] = (rv_series_t){(labels_t){NULL, 0}, s.sv, has, 0, r->nsteps};
    for (size_t st = 0; st < r->nsteps; st++)
        r->cnt[st]++;
    return out;
}

/* scalar(v): the value of v's only sample at each step, else NaN. */
static rv_val_t rv_call_scalar(rv_t *r, const promql_expr_t *e)
{
    rv_val_t in = rv_eval(r, e->u.call.args[0]);
    rv_val_t out = rv_scalar(r);
    uint32_t *n = arena_calloc(r->a, r->nsteps, sizeof(*n));
    for (size_t i = 0; i < in.n; i++) {
        for (size_t st = in.s[i].lo; st < in.s[i].hi; st++) {
            if (in.s[i].has[st]) {
                n[st]++;
                out.sv[st] = in.s[i].v[st];
            }
        }
    }
    for (size_t st = 0; st < r->nsteps; st++)
        if (n[st] != 1)
            out.sv[st] = NAN;
    return out;
}

static const char *rv_str_arg(const promql_expr_t *e, size_t i)
{
    return promql_unwrap_parens(e->u.call.args[i])->u.string; /* rv_supported checked the kind */
}

/* The labels of every output series come once from its input series' labels; values and
 * presence are the input's. What the step-wise run would refuse (a bad regex, bad label names,
 * two outputs of one label set at one step) makes it decline. */
/* Appends series s under new labels mt (its values shared, not copied) and counts its samples. */
static void rv_push_relabeled(rv_t *r, rv_val_t *out, const rv_series_t *s, labels_t mt)
{
    out->s[out->n++] = (rv_series_t){mt, s->v, s->has, s->lo, s->hi};
    rv_count(r, s);
}

static rv_val_t rv_label_replace(rv_t *r, const promql_expr_t *e)
{
    pq_ctx_t *c = r->c;
    rv_val_t in = rv_eval(r, e->u.call.args[0]);
    const char *dst = rv_str_arg(e, 1), *repl = rv_str_arg(e, 2), *src = rv_str_arg(e, 3);
    regex_prog_t *re;
    char rerr[256];
    if (regex_compile(rv_str_arg(e, 4), REGEX_ANCHOR, &re, rerr, sizeof(rerr)) != REGEX_OK)
        rv_decline(r);
    rv_regex_t *node = malloc(sizeof(*node));
    if (!node) {
        regex_free(re);
        rv_decline(r);
    }
    *node = (rv_regex_t){re, r->regexes};
    r->regexes = node;
    if (!labels_valid_name(dst, strlen(dst)))
        rv_decline(r);
    size_t nsp = regex_group_count(re) + 1;
    regex_span_t *sp = arena_alloc(r->a, nsp * sizeof(*sp));
    rv_val_t out = rv_vector(r, in.n);
    out.ordered = in.ordered;
    for (size_t i = 0; i < in.n; i++) {
        const rv_series_t *s = &in.s[i];
        const char *sv = labels_get(&s->metric, src);
        if (!sv)
            sv = "";
        labels_t mt = s->metric;
        if (regex_search(re, sv, strlen(sv), 0, sp, nsp)) {
            buf_reset(&r->text);
            regex_expand(re, &r->text, repl, sv, sp, nsp);
            mt = pq_labels_set(c, mt, dst, r->text.data ? arena_strdup(r->a, r->text.data) : "");
        }
        rv_push_relabeled(r, &out, s, mt);
    }
    rv_check_dups(r, &out, false);
    return out;
}

static rv_val_t rv_label_join(rv_t *r, const promql_expr_t *e)
{
    pq_ctx_t *c = r->c;
    rv_val_t in = rv_eval(r, e->u.call.args[0]);
    size_t n = e->u.call.nargs;
    const char *dst = rv_str_arg(e, 1), *sep = rv_str_arg(e, 2);
    for (size_t k = 3; k < n; k++)
        if (!labels_valid_name(rv_str_arg(e, k), strlen(rv_str_arg(e, k))))
            rv_decline(r);
    if (!labels_valid_name(dst, strlen(dst)))
        rv_decline(r);
    rv_val_t out = rv_vector(r, in.n);
    out.ordered = in.ordered;
    for (size_t i = 0; i < in.n; i++) {
        const rv_series_t *s = &in.s[i];
        buf_reset(&r->text);
        for (size_t k = 3; k < n; k++) {
            if (k > 3)
                buf_puts(&r->text, sep);
            const char *v = labels_get(&s->metric, rv_str_arg(e, k));
            if (v)
                buf_puts(&r->text, v);
        }
        rv_push_relabeled(r, &out, s,
                          pq_labels_set(c, s->metric, dst, r->text.data ? arena_strdup(r->a, r->text.data) : ""));
    }
    rv_check_dups(r, &out, false);
    return out;
}

static rv_val_t rv_binary(rv_t *r, const promql_expr_t *e)
{
    rv_val_t l = rv_eval(r, e->u.bin.lhs);
    rv_val_t rr = rv_eval(r, e->u.bin.rhs);
    promql_op_t op = e->u.bin.op;
    bool rb = e->u.bin.return_bool;
    if (l.scalar && rr.scalar) {
        rv_val_t out = rv_scalar(r);
        for (size_t st = 0; st < r->nsteps; st++) {
            bool keep;
            double v = pq_elem_binop(op, l.sv[st], rr.sv[st], &keep);
            out.sv[st] = rb ? (keep ? 1.0 : 0.0) : v;
        }
        return out;
    }
    if (!l.scalar && !rr.scalar)
        return promql_op_is_set(op) ? rv_set_binop(r, e, &l, &rr) : rv_vector_binop(r, e, &l, &rr);
    bool swap = l.scalar;
    const rv_val_t *vec = swap ? &rr : &l;
    const double *sc = swap ? l.sv : rr.sv;
    bool drop = pq_op_drops_name(op) || rb;
    rv_val_t out = rv_vector(r, vec->n);
    out.ordered = vec->ordered;
    for (size_t i = 0; i < vec->n; i++) {
        const rv_series_t *s = &vec->s[i];
        rv_series_t *o = rv_add_span(r, &out, drop ? pq_labels_drop_name(r->c, s->metric) : s->metric, s->lo, s->hi);
        for (size_t st = s->lo; st < s->hi; st++) {
            if (!s->has[st])
                continue;
            double lv = s->v[st], rv = sc[st];
            if (swap) {
                lv = sc[st];
                rv = s->v[st];
            }
            bool keep;
            double v = pq_elem_binop(op, lv, rv, &keep);
            if (promql_op_is_comparison(op) && swap)
                v = rv;
            if (rb) {
                v = keep ? 1.0 : 0.0;
                keep = true;
            }
            if (keep) {
                o->v[st] = v;
                o->has[st] = 1;
            }
        }
        rv_settle(r, &out, true);
    }
    rv_check_dups(r, &out, false);
    return out;
}

static rv_val_t rv_eval(rv_t *r, const promql_expr_t *e)
{
    rv_val_t out;
    switch (e->kind) {
    case PROMQL_NODE_NUMBER:
        out = rv_scalar(r);
        for (size_t st = 0; st < r->nsteps; st++)
            out.sv[st] = e->u.number;
        return out;
    case PROMQL_NODE_PAREN: return rv_eval(r, e->u.paren.expr);
    case PROMQL_NODE_UNARY: {
        rv_val_t in = rv_eval(r, e->u.unary.expr);
        if (e->u.unary.op != PROMQL_OP_SUB)
            return in;
        if (in.scalar) {
            for (size_t st = 0; st < r->nsteps; st++)
                in.sv[st] = -in.sv[st];
            return in;
        }
        out = rv_vector(r, in.n);
        out.ordered = in.ordered;
        for (size_t i = 0; i < in.n; i++) {
            rv_series_t *o = rv_add_span(r, &out, pq_labels_drop_name(r->c, in.s[i].metric), in.s[i].lo, in.s[i].hi);
            for (size_t st = in.s[i].lo; st < in.s[i].hi; st++) {
                o->v[st] = -in.s[i].v[st];
                o->has[st] = in.s[i].has[st];
            }
            rv_settle(r, &out, false); /* negated in place step-wise: no new samples */
        }
        rv_check_dups(r, &out, false);
        break;
    }
    case PROMQL_NODE_VECTOR_SEL: out = rv_vector_sel(r, e); break;
    case PROMQL_NODE_BINARY: out = rv_binary(r, e); break;
    case PROMQL_NODE_AGG: out = rv_aggregate(r, e); break;
    case PROMQL_NODE_CALL: {
        const promql_func_t *f = e->u.call.func;
        if (f->mfn) {
            out = rv_call_range(r, e, NULL);
        } else if (f->efn) {
            out = rv_call_elementwise(r, e);
        } else if (strcmp(f->name, "histogram_quantile") == 0) {
            out = rv_histogram_quantile(r, e);
        } else if (strcmp(f->name, "vector") == 0) {
            out = rv_call_vector(r, e);
        } else if (strcmp(f->name, "scalar") == 0) {
            out = rv_call_scalar(r, e);
        } else if (strcmp(f->name, "label_replace") == 0) {
            out = rv_label_replace(r, e);
        } else if (strcmp(f->name, "label_join") == 0) {
            out = rv_label_join(r, e);
        } else { /* time() */
            out = rv_scalar(r);
            for (size_t st = 0; st < r->nsteps; st++)
                out.sv[st] = (double)r->ts[st] / 1000.0;
        }
        break;
    }
    default: rv_decline(r); /* rv_supported let nothing else through */
    }
    if (!out.scalar) {
#ifndef NDEBUG
        rv_assert_spans(r, &out);
#endif
        rv_check_samples(r);
    }
    return out;
}

/* ---- result --------------------------------------------------------------------------------- */

static int cmp_series(const void *a, const void *b)
{
    const promql_series_t *x = a, *y = b;
    return labels_compare(&x->metric, &y->metric);
}

/* The step-wise result: per label set (series of one label set at different steps merged, as the
 * step-wise accumulator does), sorted by labels; max_samples replayed as pq_count_samples and the
 * step loop count it. */
static void rv_result(rv_t *r, rv_val_t *v, promql_result_t *res)
{
    pq_ctx_t *c = r->c;
    if (v->scalar) { /* one series without labels */
        rv_val_t s = rv_vector(r, 1);
        rv_series_t *o = rv_add(r, &s, (labels_t){NULL, 0});
        memcpy(o->v, v->sv, r->nsteps * sizeof(double));
        memset(o->has, 1, r->nsteps);
        s.n = 1;
        *v = s;
    }
    /* merge series of one label set: first one's index, the rest chained behind it */
    size_t *next = arena_alloc(r->a, (v->n ? v->n : 1) * sizeof(*next));
    bool *head = arena_alloc(r->a, (v->n ? v->n : 1) * sizeof(*head));
    size_t *tail = arena_alloc(r->a, (v->n ? v->n : 1) * sizeof(*tail));
    hashmap_t m;
    pq_hmap_init(c, &m, v->n);
    size_t nout = 0;
    int64_t *outn = arena_calloc(r->a, r->nsteps, sizeof(*outn));
    for (size_t i = 0; i < v->n; i++) {
        bool ex;
        uint64_t *p = pq_hmap_put(c, &m, labels_hash(&v->s[i].metric), i, &ex);
        next[i] = SIZE_MAX;
        head[i] = !ex;
        tail[i] = i;
        if (ex) {
            size_t h = (size_t)*p;
            next[tail[h]] = i;
            tail[h] = i;
            for (size_t st = v->s[i].lo; st < v->s[i].hi; st++)
                if (v->s[i].has[st])
                    for (size_t j = h; j != i; j = next[j])
                        if (v->s[j].has[st])
                            rv_decline(r); /* two points at one time: leave that to the step-wise run */
        } else {
            nout++;
        }
        for (size_t st = v->s[i].lo; st < v->s[i].hi; st++)
            outn[st] += v->s[i].has[st];
    }
    int64_t result = 0, peak = 0;
    for (size_t st = 0; st < r->nsteps; st++) {
        if (r->cnt[st] > 0 && result + r->cnt[st] > peak)
            peak = result + r->cnt[st];
        if (result + r->cnt[st] > c->max_samples)
            rv_decline(r);
        result += outn[st];
        if (result > c->max_samples)
            rv_decline(r);
    }
    promql_value_t *out = &res->value;
    out->type = PROMQL_VT_MATRIX;
    out->series = arena_alloc(c->qa, (nout ? nout : 1) * sizeof(promql_series_t));
    out->nseries = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (!head[i])
            continue;
        size_t np = 0, lo = r->nsteps, hi = 0; /* points, and the steps they are at */
        for (size_t j = i; j != SIZE_MAX; j = next[j]) {
            for (size_t st = v->s[j].lo; st < v->s[j].hi; st++)
                np += v->s[j].has[st];
            lo = v->s[j].lo < lo ? v->s[j].lo : lo;
            hi = v->s[j].hi > hi ? v->s[j].hi : hi;
        }
        promql_series_t *s = &out->series[out->nseries++];
        s->metric = pq_copy_labels(c->qa, v->s[i].metric);
        s->points = arena_alloc(c->qa, (np ? np : 1) * sizeof(promql_point_t));
        s->npoints = 0;
        for (size_t st = lo; st < hi; st++)
            for (size_t j = i; j != SIZE_MAX; j = next[j])
                if (v->s[j].has[st])
                    s->points[s->npoints++] = (promql_point_t){r->ts[st], v->s[j].v[st]};
    }
    qsort(out->series, out->nseries, sizeof(promql_series_t), cmp_series);
    c->peak_samples = peak;
}

/* Per-step values of every loaded series may take no more than this (one node's worth, a rough
 * measure of what the evaluation holds); bigger queries go step by step, which holds one step. */
#define RV_MAX_VALUE_BYTES (512u << 20)

int pq_range_eval(pq_ctx_t *c, promql_result_t *res)
{
    if (c->interval <= 0 || !rv_supported(c->ast->root))
        return -1;
    double loaded = 0;
    for (int id = 0; id < c->ast->nselectors; id++)
        loaded += (double)c->sel[id].n;
    double steps = (double)((c->end - c->start) / c->interval) + 1;
    if (loaded * steps * (sizeof(double) + 1) > RV_MAX_VALUE_BYTES)
        return -1;
    rv_t *r = calloc(1, sizeof(*r));
    if (!r)
        return -1;
    jmp_buf outer;
    memcpy(outer, c->jb, sizeof(outer));
    arena_t *sa = c->sa;
    bool rollups_used = c->rollups_used, rollups_approx = c->rollups_approx;
    int64_t rollup_res = c->rollup_res;
    if (setjmp(c->jb)) {
        memcpy(c->jb, outer, sizeof(outer));
        c->sa = sa;
        rv_free_heap(r);
        if (r->pa)
            pq_owned_release(c, r->pa);
        if (r->a)
            pq_owned_release(c, r->a);
        free(r);
        if (c->err_kind == PROMQL_ERR_TIMEOUT || c->err_kind == PROMQL_ERR_CANCELED)
            longjmp(c->jb, 1);
        /* the step-wise run starts from the state this one found */
        c->err_kind = PROMQL_ERR_NONE;
        c->err[0] = 0;
        c->cur_samples = c->peak_samples = 0;
        c->rollups_used = rollups_used;
        c->rollups_approx = rollups_approx;
        c->rollup_res = rollup_res;
        memset(&res->value, 0, sizeof(res->value));
        arena_reset(c->sa);
        return -1;
    }
    r->c = c;
    r->fuse = !getenv("SLUICE_PROMQL_NO_FUSE"); /* tests compare both */
    r->a = pq_owned_create(c);
    c->sa = r->a;
    r->nsteps = (size_t)((c->end - c->start) / c->interval) + 1;
    r->ts = arena_alloc(r->a, r->nsteps * sizeof(*r->ts));
    r->cnt = arena_calloc(r->a, r->nsteps, sizeof(*r->cnt));
    for (size_t st = 0; st < r->nsteps; st++)
        r->ts[st] = c->start + (int64_t)st * c->interval;
    rv_val_t v = rv_eval(r, c->ast->root);
    rv_result(r, &v, res);
    memcpy(c->jb, outer, sizeof(outer));
    c->sa = sa;
    rv_free_heap(r);
    if (r->pa)
        pq_owned_release(c, r->pa);
    pq_owned_release(c, r->a);
    free(r);
    return 0;
}
