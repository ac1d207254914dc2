/*
 * functions — every PromQL function of Prometheus 2.42 (native-histogram ones return nothing for
 * float samples) and the table the parser type-checks calls against.
 *
 * Three shapes, chosen per function in the table:
 *   mfn  range-vector function: called once per series with that step's window (never empty);
 *        the engine drops __name__ from the output unless keep_name (last_over_time);
 *   efn  elementwise on an instant vector's values, __name__ dropped;
 *   gfn  anything else, receives all evaluated arguments.
 * Numerics follow Prometheus: Kahan-Neumaier sums in sum/avg/stddev_over_time and in the linear
 * regression of deriv/predict_linear; extrapolation in rate/increase/delta as in
 * extrapolatedRate(); Go's math.Max/Min NaN rules in clamp.
 */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "internal/labels/labels.h"
#include "internal/promql/engine_int.h"
#include "internal/util/regex.h"

/* ---- numeric helpers ------------------------------------------------------------------------ */

static void kahan_inc(double inc, double *sum, double *c)
{
    double t = *sum + inc;
    if (fabs(*sum) >= fabs(inc))
        *c += (*sum - t) + inc;
    else
        *c += (inc - t) + *sum;
    *sum = t;
}

static double go_max(double x, double y)
{
    if (isinf(x) && x > 0)
        return x;
    if (isinf(y) && y > 0)
        return y;
    if (isnan(x) || isnan(y))
        return NAN;
    if (x == 0 && x == y)
        return signbit(x) ? y : x;
    return x > y ? x : y;
}

static double go_min(double x, double y)
{
    if (isinf(x) && x < 0)
        return x;
    if (isinf(y) && y < 0)
        return y;
    if (isnan(x) || isnan(y))
        return NAN;
    if (x == 0 && x == y)
        return signbit(x) ? x : y;
    return x < y ? x : y;
}

static void linear_regression(const promql_point_t *p, size_t n, int64_t intercept_t, double *slope, double *intercept)
{
    double cnt = 0, sx = 0, cx = 0, sy = 0, cy = 0, sxy = 0, cxy = 0, sx2 = 0, cx2 = 0;
    double init_y = p[0].v;
    bool const_y = true;
    for (size_t i = 0; i < n; i++) {
        if (const_y && i > 0 && p[i].v != init_y)
            const_y = false;
        cnt += 1.0;
        double x = (double)(p[i].t - intercept_t) / 1e3;
        kahan_inc(x, &sx, &cx);
        kahan_inc(p[i].v, &sy, &cy);
        kahan_inc(x * p[i].v, &sxy, &cxy);
        kahan_inc(x * x, &sx2, &cx2);
    }
    if (const_y) {
        if (isinf(init_y)) {
            *slope = NAN;
            *intercept = NAN;
            return;
        }
        *slope = 0;
        *intercept = init_y;
        return;
    }
    sx += cx;
    sy += cy;
    sxy += cxy;
    sx2 += cx2;
    double cov = sxy - sx * sy / cnt;
    double var = sx2 - sx * sx / cnt;
    *slope = cov / var;
    *intercept = sy / cnt - *slope * sx / cnt;
}

/* ---- range-vector functions ----------------------------------------------------------------- */

static bool extrapolated_rate(const pq_fcall_t *fc, const promql_point_t *p, size_t n, bool counter, bool is_rate,
                              double *out)
{
    if (n < 2)
        return false;
    int64_t range_start = fc->win_end - fc->range_ms, range_end = fc->win_end;
    double result = p[n - 1].v - p[0].v;
    if (counter) {
        double last = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i].v < last)
                result += last;
            last = p[i].v;
        }
    }
    double to_start = (double)(p[0].t - range_start) / 1000;
    double to_end = (double)(range_end - p[n - 1].t) / 1000;
    double sampled = (double)(p[n - 1].t - p[0].t) / 1000;
    double avg_between = sampled / (double)(n - 1);
    if (counter && result > 0 && p[0].v >= 0) {
        double to_zero = sampled * (p[0].v / result);
        if (to_zero < to_start)
            to_start = to_zero;
    }
    double threshold = avg_between * 1.1;
    double interval = sampled;
    interval += to_start < threshold ? to_start : avg_between / 2;
    interval += to_end < threshold ? to_end : avg_between / 2;
    /* One factor, divided by the range before it scales the result, as 2.42 computes it (since
     * native histograms): result * (interval / sampled) / range rounds differently in the last
     * bit, and `%` or `==` on a rate can turn that bit into a different answer. */
    double factor = interval / sampled;
    if (is_rate)
        factor /= (double)fc->range_ms / 1000;
    *out = result * factor;
    return true;
}

static bool f_rate(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c;
    return extrapolated_rate(fc, p, n, true, true, o);
}
static bool f_increase(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c;
    return extrapolated_rate(fc, p, n, true, false, o);
}
static bool f_delta(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c;
    return extrapolated_rate(fc, p, n, false, false, o);
}

static bool instant_value(const promql_point_t *p, size_t n, bool is_rate, double *out)
{
    if (n < 2)
        return false;
    promql_point_t last = p[n - 1], prev = p[n - 2];
    double r;
    if (is_rate && last.v < prev.v)
        r = last.v;
    else
        r = last.v - prev.v;
    int64_t dt = last.t - prev.t;
    if (dt == 0)
        return false;
    if (is_rate)
        r /= (double)dt / 1000;
    *out = r;
    return true;
}

static bool f_irate(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    return instant_value(p, n, true, o);
}
static bool f_idelta(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    return instant_value(p, n, false, o);
}

static bool f_deriv(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    if (n < 2)
        return false;
    double slope, icpt;
    linear_regression(p, n, p[0].t, &slope, &icpt);
    *o = slope;
    return true;
}

static bool f_predict_linear(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c;
    if (n < 2)
        return false;
    double slope, icpt;
    linear_regression(p, n, fc->t, &slope, &icpt);
    *o = slope * fc->sargs[1] + icpt;
    return true;
}

static bool f_resets(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    int r = 0;
    for (size_t i = 1; i < n; i++)
        if (p[i].v < p[i - 1].v)
            r++;
    *o = r;
    return true;
}

static bool f_changes(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    int r = 0;
    for (size_t i = 1; i < n; i++) {
        double cur = p[i].v, prev = p[i - 1].v;
        if (cur != prev && !(isnan(cur) && isnan(prev)))
            r++;
    }
    *o = r;
    return true;
}

static bool f_avg_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    double mean = 0, cm = 0, count = 0;
    for (size_t i = 0; i < n; i++) {
        double v = p[i].v;
        count++;
        if (isinf(mean)) {
            if (isinf(v) && (mean > 0) == (v > 0))
                continue;
            if (!isinf(v) && !isnan(v))
                continue;
        }
        kahan_inc(v / count - mean / count, &mean, &cm);
    }
    *o = isinf(mean) ? mean : mean + cm;
    return true;
}

static bool f_count_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c;
    /* A roll-up sample stands for a bucket: for count_over_time the querier gives it the
     * bucket's sample count as its value (storage/querier.h), so those count by value. */
    double count = 0;
    for (size_t i = 0; i < n; i++)
        count += p[i].t < fc->rollup_until ? p[i].v : 1;
    *o = count;
    return true;
}

static bool f_max_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    double m = p[0].v;
    for (size_t i = 0; i < n; i++)
        if (p[i].v > m || isnan(m))
            m = p[i].v;
    *o = m;
    return true;
}

static bool f_min_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    double m = p[0].v;
    for (size_t i = 0; i < n; i++)
        if (p[i].v < m || isnan(m))
            m = p[i].v;
    *o = m;
    return true;
}

static bool f_sum_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    double s = 0, k = 0;
    for (size_t i = 0; i < n; i++)
        kahan_inc(p[i].v, &s, &k);
    *o = isinf(s) ? s : s + k;
    return true;
}

static double stdvar_ot(const promql_point_t *p, size_t n)
{
    double count = 0, mean = 0, cm = 0, aux = 0, ca = 0;
    for (size_t i = 0; i < n; i++) {
        count++;
        double delta = p[i].v - (mean + cm);
        kahan_inc(delta / count, &mean, &cm);
        kahan_inc(delta * (p[i].v - (mean + cm)), &aux, &ca);
    }
    return (aux + ca) / count;
}

static bool f_stddev_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    *o = sqrt(stdvar_ot(p, n));
    return true;
}

static bool f_stdvar_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    *o = stdvar_ot(p, n);
    return true;
}

static bool f_last_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc;
    *o = p[n - 1].v;
    return true;
}

static bool f_present_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    (void)c, (void)fc, (void)p, (void)n;
    *o = 1;
    return true;
}

static bool f_quantile_ot(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    double *v = arena_alloc(c->sa, n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        v[i] = p[i].v;
    *o = pq_quantile(fc->sargs[0], v, n);
    return true;
}

static double calc_trend(size_t i, double tf, double s0, double s1, double b)
{
    if (i == 0)
        return b;
    return tf * (s1 - s0) + (1 - tf) * b;
}

static bool f_holt_winters(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *o)
{
    double sf = fc->sargs[1], tf = fc->sargs[2];
    if (sf <= 0 || sf >= 1)
        pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid smoothing factor. Expected: 0 < sf < 1, got: %f", sf);
    if (tf <= 0 || tf >= 1)
        pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid trend factor. Expected: 0 < tf < 1, got: %f", tf);
    if (n < 2)
        return false;
    double s0 = 0, s1 = p[0].v, b = p[1].v - p[0].v;
    for (size_t i = 1; i < n; i++) {
        double x = sf * p[i].v;
        b = calc_trend(i - 1, tf, s0, s1, b);
        double y = (1 - sf) * (s1 + b);
        s0 = s1;
        s1 = x + y;
    }
    *o = s1;
    return true;
}

/* ---- elementwise ---------------------------------------------------------------------------- */

static double e_abs(double v)
{
    return fabs(v);
}
static double e_ceil(double v)
{
    return ceil(v);
}
static double e_floor(double v)
{
    return floor(v);
}
static double e_exp(double v)
{
    return exp(v);
}
static double e_sqrt(double v)
{
    return sqrt(v);
}
static double e_ln(double v)
{
    return log(v);
}
static double e_log2(double v)
{
    return log2(v);
}
static double e_log10(double v)
{
    return log10(v);
}
static double e_sgn(double v)
{
    return v < 0 ? -1 : (v > 0 ? 1 : v);
}
static double e_deg(double v)
{
    return v * 180 / M_PI;
}
static double e_rad(double v)
{
    return v * M_PI / 180;
}
static double e_sin(double v)
{
    return sin(v);
}
static double e_cos(double v)
{
    return cos(v);
}
static double e_tan(double v)
{
    return tan(v);
}
static double e_asin(double v)
{
    return asin(v);
}
static double e_acos(double v)
{
    return acos(v);
}
static double e_atan(double v)
{
    return atan(v);
}
static double e_sinh(double v)
{
    return sinh(v);
}
static double e_cosh(double v)
{
    return cosh(v);
}
static double e_tanh(double v)
{
    return tanh(v);
}
static double e_asinh(double v)
{
    return asinh(v);
}
static double e_acosh(double v)
{
    return acosh(v);
}
static double e_atanh(double v)
{
    return atanh(v);
}

/* ---- general -------------------------------------------------------------------------------- */

static const labels_t no_labels = {NULL, 0};

static void g_time(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)c, (void)a, (void)n;
    out->scalar = (double)fc->t / 1000.0;
}

static void g_pi(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)c, (void)fc, (void)a, (void)n;
    out->scalar = M_PI;
}

static void g_vector(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    pq_vec_push(c, &out->vec, no_labels, fc->t, a[0].scalar);
}

static void g_scalar(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)c, (void)fc, (void)n;
    out->scalar = a[0].vec.n == 1 ? a[0].vec.v[0].v : NAN;
}

static void g_empty(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)c, (void)fc, (void)a, (void)n, (void)out;
}

/* The labels absent() reports, as 2.42 builds them: matchers in order; the first `=` of a label
 * sets it, any other matcher of that label (a later `=` too) deletes it at once, and a deleted
 * label never comes back through another `=`. So order matters: {job!~"a",job="x"} gives
 * {job="x"}, {job="x",job!~"a"} and {job="x",job="y",job="z"} give {}. */
static labels_t absent_labels(pq_ctx_t *c, const promql_expr_t *arg)
{
    arg = promql_unwrap_parens(arg);
    if (arg->kind != PROMQL_NODE_VECTOR_SEL && arg->kind != PROMQL_NODE_MATRIX_SEL)
        return no_labels;
    labels_t m = no_labels;
    size_t nm = arg->u.sel.nmatchers, nseen = 0;
    const char **seen = arena_alloc(c->sa, (nm ? nm : 1) * sizeof(*seen)); /* names set by an `=` */
    for (size_t i = 0; i < nm; i++) {
        const matcher_t *ma = arg->u.sel.matchers[i];
        const char *name = matcher_name(ma);
        if (strcmp(name, LABEL_METRIC_NAME) == 0)
            continue;
        bool was_set = false;
        for (size_t k = 0; k < nseen && !was_set; k++)
            was_set = strcmp(seen[k], name) == 0;
        if (matcher_type(ma) == MATCHER_EQ && !was_set) {
            m = pq_labels_set(c, m, name, matcher_value(ma));
            seen[nseen++] = name;
        } else {
            m = pq_labels_del(c, m, &name, 1);
        }
    }
    return m;
}

static void g_absent(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    if (a[0].vec.n > 0)
        return;
    pq_vec_push(c, &out->vec, absent_labels(c, fc->call->u.call.args[0]), fc->t, 1);
}

static void g_absent_ot(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    for (size_t i = 0; i < a[0].mat.n; i++)
        if (a[0].mat.v[i].n > 0)
            return;
    pq_vec_push(c, &out->vec, absent_labels(c, fc->call->u.call.args[0]), fc->t, 1);
}

static void g_clamp(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    double lo = a[1].scalar, hi = a[2].scalar;
    if (hi < lo)
        return;
    for (size_t i = 0; i < a[0].vec.n; i++)
        pq_vec_push(c, &out->vec, pq_labels_drop_name(c, a[0].vec.v[i].metric), fc->t,
                    go_max(lo, go_min(hi, a[0].vec.v[i].v)));
}

static void g_clamp_max(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    for (size_t i = 0; i < a[0].vec.n; i++)
        pq_vec_push(c, &out->vec, pq_labels_drop_name(c, a[0].vec.v[i].metric), fc->t,
                    go_min(a[0].vec.v[i].v, a[1].scalar));
}

static void g_clamp_min(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    for (size_t i = 0; i < a[0].vec.n; i++)
        pq_vec_push(c, &out->vec, pq_labels_drop_name(c, a[0].vec.v[i].metric), fc->t,
                    go_max(a[0].vec.v[i].v, a[1].scalar));
}

static void g_round(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    double to = n > 1 ? a[1].scalar : 1;
    double inv = 1.0 / to;
    for (size_t i = 0; i < a[0].vec.n; i++)
        pq_vec_push(c, &out->vec, pq_labels_drop_name(c, a[0].vec.v[i].metric), fc->t,
                    floor(a[0].vec.v[i].v * inv + 0.5) / inv);
}

static bool sort_less_asc(const void *x, const void *y)
{
    /* sort.Reverse(vectorByReverseValueHeap): Less(i,j) = isNaN(v[j]) || v[j] > v[i] */
    double vi = ((const promql_sample_t *)x)->v, vj = ((const promql_sample_t *)y)->v;
    if (isnan(vj))
        return true;
    return vj > vi;
}

static bool sort_less_desc(const void *x, const void *y)
{
    /* sort.Reverse(vectorByValueHeap): Less(i,j) = isNaN(v[j]) || v[j] < v[i] */
    double vi = ((const promql_sample_t *)x)->v, vj = ((const promql_sample_t *)y)->v;
    if (isnan(vj))
        return true;
    return vj < vi;
}

static void do_sort(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, pq_val_t *out, bool desc)
{
    (void)fc;
    out->vec.n = 0;
    for (size_t i = 0; i < a[0].vec.n; i++)
        pq_vec_push(c, &out->vec, a[0].vec.v[i].metric, a[0].vec.v[i].t, a[0].vec.v[i].v);
    pq_go_sort(out->vec.v, out->vec.n, sizeof(promql_sample_t), desc ? sort_less_desc : sort_less_asc);
}

static void g_sort(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    do_sort(c, fc, a, out, false);
}

static void g_sort_desc(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    do_sort(c, fc, a, out, true);
}

/* Date functions: with no argument, of vector(time()).
 *
 * Prometheus converts the value with Go's int64(v) and reads the fields of time.Unix(sec, 0).UTC().
 * Both have edges C does not share, and answers must match: int64() of NaN, +-Inf or anything out
 * of range is 0x8000000000000000 on amd64 (so day_of_week(NaN) is 0, not NaN), and Go computes the
 * civil date from "absolute" seconds since year -292277022399 in wrapping uint64 arithmetic, which
 * gives defined (if odd) dates where gmtime_r fails. go_date below is that computation. */
typedef struct {
    int64_t year;
    int month, mday, yday, wday, hour, min; /* month 1-12, mday 1-31, yday 0-365, wday 0 = Sunday */
} go_date_t;

#define GO_SECS_PER_DAY 86400ULL
#define GO_ABSOLUTE_ZERO_YEAR (-292277022399LL)
/* time.go: unixToInternal + internalToAbsolute (62135596800 + 9223371966579724800), the shift
 * from Unix to absolute seconds. */
#define GO_UNIX_TO_ABSOLUTE (9223372028715321600LL)

static int64_t go_int64_of(double v)
{
    if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
        return INT64_MIN; /* NaN, +-Inf, out of range: amd64's CVTTSD2SQ answer */
    return (int64_t)v;
}

static bool go_is_leap(int64_t y)
{
    return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
}

static void go_date(int64_t unix_sec, go_date_t *d)
{
    static const int days_before[] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365};
    uint64_t abs = (uint64_t)unix_sec + (uint64_t)GO_UNIX_TO_ABSOLUTE; /* wraps as in Go */
    d->hour = (int)(abs % GO_SECS_PER_DAY / 3600);
    d->min = (int)(abs % 3600 / 60);
    /* Absolute day 0 is a Monday. */
    d->wday = (int)((abs + GO_SECS_PER_DAY) % (7 * GO_SECS_PER_DAY) / GO_SECS_PER_DAY);
    uint64_t days = abs / GO_SECS_PER_DAY;
    uint64_t n = days / 146097, y = 400 * n;
    days -= 146097 * n;
    n = days / 36524;
    n -= n >> 2;
    y += 100 * n;
    days -= 36524 * n;
    n = days / 1461;
    y += 4 * n;
    days -= 1461 * n;
    n = days / 365;
    n -= n >> 2;
    y += n;
    days -= 365 * n;
    d->year = (int64_t)y + GO_ABSOLUTE_ZERO_YEAR;
    d->yday = (int)days;
    int day = d->yday;
    if (go_is_leap(d->year)) {
        if (day == 31 + 29 - 1) {
            d->month = 2;
            d->mday = 29;
            return;
        }
        if (day > 31 + 29 - 1)
            day--;
    }
    int m = day / 31;
    int begin = days_before[m];
    if (day >= days_before[m + 1])
        begin = days_before[++m];
    d->month = m + 1;
    d->mday = day - begin + 1;
}

typedef double (*date_fn_t)(const go_date_t *d);

static void date_wrap(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out, date_fn_t f)
{
    go_date_t d;
    if (n == 0) {
        go_date(fc->t / 1000, &d); /* Go's enh.Ts / 1000 truncates toward zero */
        pq_vec_push(c, &out->vec, no_labels, fc->t, f(&d));
        return;
    }
    for (size_t i = 0; i < a[0].vec.n; i++) {
        go_date(go_int64_of(a[0].vec.v[i].v), &d);
        pq_vec_push(c, &out->vec, pq_labels_drop_name(c, a[0].vec.v[i].metric), fc->t, f(&d));
    }
}

static double d_dim(const go_date_t *d)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (d->month == 2 && go_is_leap(d->year))
        return 29;
    return days[d->month - 1];
}
static double d_dom(const go_date_t *d)
{
    return d->mday;
}
static double d_dow(const go_date_t *d)
{
    return d->wday;
}
static double d_doy(const go_date_t *d)
{
    return d->yday + 1;
}
static double d_hour(const go_date_t *d)
{
    return d->hour;
}
static double d_minute(const go_date_t *d)
{
    return d->min;
}
static double d_month(const go_date_t *d)
{
    return d->month;
}
static double d_year(const go_date_t *d)
{
    return (double)d->year;
}

#define DATE_FN(fname, df)                                                                                             \
    static void fname(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)                         \
    {                                                                                                                  \
        date_wrap(c, fc, a, n, out, df);                                                                               \
    }
DATE_FN(g_days_in_month, d_dim)
DATE_FN(g_day_of_month, d_dom)
DATE_FN(g_day_of_week, d_dow)
DATE_FN(g_day_of_year, d_doy)
DATE_FN(g_hour, d_hour)
DATE_FN(g_minute, d_minute)
DATE_FN(g_month, d_month)
DATE_FN(g_year, d_year)

/* histogram_quantile over classic buckets (le labels). */

static int cmp_bucket(const void *a, const void *b)
{
    double x = ((const pq_bucket_t *)a)->ub, y = ((const pq_bucket_t *)b)->ub;
    return x < y ? -1 : (x > y ? 1 : 0);
}

double pq_bucket_quantile(double q, pq_bucket_t *b, size_t n)
{
    if (isnan(q))
        return NAN;
    if (q < 0)
        return -INFINITY;
    if (q > 1)
        return INFINITY;
    qsort(b, n, sizeof(*b), cmp_bucket);
    if (!(isinf(b[n - 1].ub) && b[n - 1].ub > 0))
        return NAN;
    /* coalesce equal upper bounds */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && b[k - 1].ub == b[i].ub)
            b[k - 1].count += b[i].count;
        else
            b[k++] = b[i];
    }
    n = k;
    /* ensure monotonic */
    double max = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (b[i].count > max)
            max = b[i].count;
        else if (b[i].count < max)
            b[i].count = max;
    }
    if (n < 2)
        return NAN;
    double obs = b[n - 1].count;
    if (obs == 0)
        return NAN;
    double rank = q * obs;
    size_t lo = 0, hi = n - 1; /* sort.Search over [0, n-1) */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (!(b[mid].count >= rank))
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t i = lo;
    if (i == n - 1)
        return b[n - 2].ub;
    if (i == 0 && b[0].ub <= 0)
        return b[0].ub;
    double start = 0, end = b[i].ub, count = b[i].count;
    if (i > 0) {
        start = b[i - 1].ub;
        count -= b[i - 1].count;
        rank -= b[i - 1].count;
    }
    return start + (end - start) * (rank / count);
}

bool pq_parse_float_go(const char *s, double *out)
{
    if (!s || !*s)
        return false;
    if (*s == ' ' || *s == '\t' || *s == '\n')
        return false;
    char *end;
    double v = strtod(s, &end);
    if (*end != 0)
        return false;
    *out = v;
    return true;
}

static void g_histogram_quantile(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    double q = a[0].scalar;
    pq_vec_t *in = &a[1].vec;
    size_t ng = 0;
    labels_t *keys = arena_alloc(c->sa, (in->n ? in->n : 1) * sizeof(*keys));
    uint64_t *hashes = arena_alloc(c->sa, (in->n ? in->n : 1) * sizeof(*hashes));
    pq_bucket_t **bk = arena_alloc(c->sa, (in->n ? in->n : 1) * sizeof(*bk));
    size_t *bn = arena_calloc(c->sa, in->n ? in->n : 1, sizeof(*bn));
    static const char *const le[] = {"le"};
    static const char *const name_le[] = {LABEL_METRIC_NAME, "le"};
    for (size_t i = 0; i < in->n; i++) {
        double ub;
        if (!pq_parse_float_go(labels_get(&in->v[i].metric, "le"), &ub))
            continue;
        labels_t sig = pq_labels_del(c, in->v[i].metric, le, 1);
        uint64_t h = labels_hash(&sig);
        size_t g;
        for (g = 0; g < ng; g++)
            if (hashes[g] == h)
                break;
        if (g == ng) {
            hashes[ng] = h;
            keys[ng] = pq_labels_del(c, in->v[i].metric, name_le, 2);
            bk[ng] = arena_alloc(c->sa, in->n * sizeof(pq_bucket_t));
            ng++;
        }
        bk[g][bn[g]++] = (pq_bucket_t){ub, in->v[i].v};
    }
    for (size_t g = 0; g < ng; g++)
        pq_vec_push(c, &out->vec, keys[g], fc->t, pq_bucket_quantile(q, bk[g], bn[g]));
}

/* label_replace / label_join */

/* label_replace's arguments are string literals, so one call node always has the same regex:
 * compile it on the first step and keep it until the query ends. */
typedef struct pq_re_cache {
    const promql_expr_t *call;
    regex_prog_t *re;
    struct pq_re_cache *next;
} pq_re_cache_t;

void pq_func_caches_free(pq_ctx_t *c)
{
    for (pq_re_cache_t *rc = c->re_caches; rc; rc = rc->next)
        regex_free(rc->re);
    c->re_caches = NULL;
}

static void g_label_replace(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    (void)n;
    const char *dst = a[1].str, *repl = a[2].str, *src = a[3].str, *regex = a[4].str;
    pq_re_cache_t *rcache = c->re_caches;
    while (rcache && rcache->call != fc->call)
        rcache = rcache->next;
    if (!rcache) {
        /* Prometheus: regexp.Compile("^(?:" + regex + ")$"); its error text is not shown. */
        regex_prog_t *re;
        char rerr[256];
        int rc = regex_compile(regex, REGEX_ANCHOR, &re, rerr, sizeof(rerr));
        if (rc == REGEX_ERR_NOMEM)
            pq_errorf(c, PROMQL_ERR_INTERNAL, "out of memory");
        if (rc != REGEX_OK)
            pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid regular expression in label_replace(): %s", regex);
        rcache = arena_calloc(c->qa, 1, sizeof(*rcache));
        rcache->call = fc->call;
        rcache->re = re;
        rcache->next = c->re_caches;
        c->re_caches = rcache; /* owned by the context from here: freed even if we error out */
    }
    if (!labels_valid_name(dst, strlen(dst)))
        pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid destination label name in label_replace(): %s", dst);
    regex_prog_t *re = rcache->re;
    size_t nsp = regex_group_count(re) + 1;
    regex_span_t *sp = arena_alloc(c->sa, nsp * sizeof(*sp));
    for (size_t i = 0; i < a[0].vec.n; i++) {
        promql_sample_t *s = &a[0].vec.v[i];
        const char *sv = labels_get(&s->metric, src);
        if (!sv)
            sv = "";
        labels_t m = s->metric;
        if (regex_search(re, sv, strlen(sv), 0, sp, nsp)) {
            buf_t b = BUF_INIT;
            regex_expand(re, &b, repl, sv, sp, nsp);
            m = pq_labels_set(c, m, dst, b.data ? arena_strdup(c->sa, b.data) : "");
            buf_free(&b);
        }
        pq_vec_push(c, &out->vec, m, fc->t, s->v);
    }
}

static void g_label_join(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *a, size_t n, pq_val_t *out)
{
    const char *dst = a[1].str, *sep = a[2].str;
    for (size_t k = 3; k < n; k++)
        if (!labels_valid_name(a[k].str, strlen(a[k].str)))
            pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid source label name in label_join(): %s", a[k].str);
    if (!labels_valid_name(dst, strlen(dst)))
        pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid destination label name in label_join(): %s", dst);
    for (size_t i = 0; i < a[0].vec.n; i++) {
        promql_sample_t *s = &a[0].vec.v[i];
        buf_t b = BUF_INIT;
        for (size_t k = 3; k < n; k++) {
            if (k > 3)
                buf_puts(&b, sep);
            const char *v = labels_get(&s->metric, a[k].str);
            if (v)
                buf_puts(&b, v);
        }
        labels_t m = pq_labels_set(c, s->metric, dst, b.data ? arena_strdup(c->sa, b.data) : "");
        buf_free(&b);
        pq_vec_push(c, &out->vec, m, fc->t, s->v);
    }
}

/* ---- table ---------------------------------------------------------------------------------- */

#define S PROMQL_VT_SCALAR
#define V PROMQL_VT_VECTOR
#define M PROMQL_VT_MATRIX
#define STR PROMQL_VT_STRING

#define MFN(nm, f)                                                                                                     \
    {                                                                                                                  \
        nm, {M}, 1, 0, V, f, NULL, NULL, false                                                                         \
    }
#define EFN(nm, f)                                                                                                     \
    {                                                                                                                  \
        nm, {V}, 1, 0, V, NULL, f, NULL, false                                                                         \
    }
#define DFN(nm, f)                                                                                                     \
    {                                                                                                                  \
        nm, {V}, 1, 1, V, NULL, NULL, f, false                                                                         \
    }

static const promql_func_t funcs[] = {
    EFN("abs", e_abs),
    {"absent", {V}, 1, 0, V, NULL, NULL, g_absent, false},
    {"absent_over_time", {M}, 1, 0, V, NULL, NULL, g_absent_ot, false},
    EFN("acos", e_acos),
    EFN("acosh", e_acosh),
    EFN("asin", e_asin),
    EFN("asinh", e_asinh),
    EFN("atan", e_atan),
    EFN("atanh", e_atanh),
    MFN("avg_over_time", f_avg_ot),
    EFN("ceil", e_ceil),
    MFN("changes", f_changes),
    {"clamp", {V, S, S}, 3, 0, V, NULL, NULL, g_clamp, false},
    {"clamp_max", {V, S}, 2, 0, V, NULL, NULL, g_clamp_max, false},
    {"clamp_min", {V, S}, 2, 0, V, NULL, NULL, g_clamp_min, false},
    EFN("cos", e_cos),
    EFN("cosh", e_cosh),
    MFN("count_over_time", f_count_ot),
    DFN("day_of_month", g_day_of_month),
    DFN("day_of_week", g_day_of_week),
    DFN("day_of_year", g_day_of_year),
    DFN("days_in_month", g_days_in_month),
    EFN("deg", e_deg),
    MFN("delta", f_delta),
    MFN("deriv", f_deriv),
    EFN("exp", e_exp),
    EFN("floor", e_floor),
    {"histogram_count", {V}, 1, 0, V, NULL, NULL, g_empty, false},
    {"histogram_fraction", {S, S, V}, 3, 0, V, NULL, NULL, g_empty, false},
    {"histogram_quantile", {S, V}, 2, 0, V, NULL, NULL, g_histogram_quantile, false},
    {"histogram_sum", {V}, 1, 0, V, NULL, NULL, g_empty, false},
    {"holt_winters", {M, S, S}, 3, 0, V, f_holt_winters, NULL, NULL, false},
    DFN("hour", g_hour),
    MFN("idelta", f_idelta),
    MFN("increase", f_increase),
    MFN("irate", f_irate),
    {"label_join", {V, STR, STR, STR}, 4, -1, V, NULL, NULL, g_label_join, false},
    {"label_replace", {V, STR, STR, STR, STR}, 5, 0, V, NULL, NULL, g_label_replace, false},
    {"last_over_time", {M}, 1, 0, V, f_last_ot, NULL, NULL, true},
    EFN("ln", e_ln),
    EFN("log10", e_log10),
    EFN("log2", e_log2),
    MFN("max_over_time", f_max_ot),
    MFN("min_over_time", f_min_ot),
    DFN("minute", g_minute),
    DFN("month", g_month),
    {"pi", {0}, 0, 0, S, NULL, NULL, g_pi, false},
    {"predict_linear", {M, S}, 2, 0, V, f_predict_linear, NULL, NULL, false},
    MFN("present_over_time", f_present_ot),
    {"quantile_over_time", {S, M}, 2, 0, V, f_quantile_ot, NULL, NULL, false},
    EFN("rad", e_rad),
    MFN("rate", f_rate),
    MFN("resets", f_resets),
    {"round", {V, S}, 2, 1, V, NULL, NULL, g_round, false},
    {"scalar", {V}, 1, 0, S, NULL, NULL, g_scalar, false},
    EFN("sgn", e_sgn),
    EFN("sin", e_sin),
    EFN("sinh", e_sinh),
    {"sort", {V}, 1, 0, V, NULL, NULL, g_sort, false},
    {"sort_desc", {V}, 1, 0, V, NULL, NULL, g_sort_desc, false},
    EFN("sqrt", e_sqrt),
    MFN("stddev_over_time", f_stddev_ot),
    MFN("stdvar_over_time", f_stdvar_ot),
    MFN("sum_over_time", f_sum_ot),
    EFN("tan", e_tan),
    EFN("tanh", e_tanh),
    {"time", {0}, 0, 0, S, NULL, NULL, g_time, false},
    {"timestamp", {V}, 1, 0, V, NULL, NULL, NULL, false}, /* evaluated by the engine */
    {"vector", {S}, 1, 0, V, NULL, NULL, g_vector, false},
    DFN("year", g_year),
};

const promql_func_t *promql__func_lookup(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof(funcs) / sizeof(funcs[0]); i++)
        if (strlen(funcs[i].name) == n && memcmp(funcs[i].name, name, n) == 0)
            return &funcs[i];
    return NULL;
}
