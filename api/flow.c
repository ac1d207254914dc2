/*
 * api/flow — per-second flow of a Flink job (see flow.h for the endpoints).
 *
 * What one point (second s, the samples with timestamps in [s*1000, s*1000+999]) means:
 *
 *   records_in / records_out  Sum over every numRecordsIn / numRecordsOut series of the job (each
 *       operator of each subtask on each TaskManager) of the series' increase during second s.
 *       A series' increase between two consecutive samples at seconds a < b is v_b - v_a, or v_b
 *       when v_b < v_a (the counter restarted from zero, as Prometheus' increase() reads it), and
 *       it is spread evenly over seconds a+1 .. b — a TaskManager pushes every 10 s, so one push
 *       covers ten bars, and a missed push makes the next one cover twenty. The first sample of
 *       a series, and the first after a staleness marker, only sets the base. Samples more than
 *       FLOW_LOOKBEHIND_S apart are not joined (the gap is unknown, not zero).
 *   complete_until  TaskManagers push at different seconds, so the newest seconds are known for
 *       some series only. complete_until is the oldest "last sample" among the live counter
 *       series (those that reported in the last FLOW_LIVE_S seconds and did not end with a
 *       staleness marker); seconds after it are null rather than too low. A job whose counters
 *       all stopped is complete up to their newest sample.
 *   tasks[].backpressure / busy  Per task (task_name), the largest value among its subtasks of
 *       backPressuredTimeMsPerSecond / 1000 and busyTimeMsPerSecond / 1000. A gauge keeps its
 *       value from its sample until the next one, at most FLOW_GAUGE_HOLD_S seconds, and not past
 *       a staleness marker; NaN samples (busy time of an idle source) give no value.
 *   lags[]  Each lag gauge (FLOW_LAG_REGEX) held the same way and summed over the job's series.
 *
 * Cost: two selects (metric-name alternation + job_name, then the lag regex + job_name) over
 * [start - FLOW_LOOKBEHIND_S, end], each sample decoded once, O(series * samples + tasks * n).
 *
 * Streams (framing, worker lists and the shutdown fan-out from api/sse): each subscriber is a
 * struct on its worker's list with a timer that fires a quarter second after every wall-clock
 * second. The first event carries the whole window; each later one carries only the seconds
 * that can have changed since the previous event — from the previous complete_until + 1 (or the
 * previous end + 1 if that is older) to now — and the client overwrites those seconds. A
 * subscriber whose unsent output exceeds FLOW_SSE_SKIP_BYTES skips a tick (the next patch simply
 * covers more seconds); beyond FLOW_SSE_MAX_PENDING it is dropped. At shutdown a hook ends every
 * stream on its own worker (api_sse_close_workers).
 */
#include "api/flow.h"

#include <assert.h>
#include <event2/event.h>
#include <event2/http.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/router.h"
#include "api/sse.h"
#include "internal/control/control.h"
#include "internal/labels/matcher.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"
#include "internal/util/parse.h"

#define FLOW_LOOKBEHIND_S 600
#define FLOW_LIVE_S 120
#define FLOW_GAUGE_HOLD_S 120
#define FLOW_MAX_SUBSCRIBERS 256
#define FLOW_SSE_SKIP_BYTES (64 * 1024)
#define FLOW_SSE_MAX_PENDING (1024 * 1024)
#define FLOW_STALE_NAN_BITS 0x7ff0000000000002ULL /* Prometheus' staleness marker */

/* --- computation --------------------------------------------------------------------------------- */

static bool flow_is_stale(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b == FLOW_STALE_NAN_BITS;
}

static int64_t flow_floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static double *flow_nan_array(size_t n)
{
    double *a = malloc((n ? n : 1) * sizeof(*a));
    if (a)
        for (size_t i = 0; i < n; i++)
            a[i] = NAN;
    return a;
}

typedef enum { FLOW_IN, FLOW_OUT, FLOW_BP, FLOW_BUSY, FLOW_LAG } flow_kind_t;
typedef enum { FLOW_COMBINE_MAX, FLOW_COMBINE_SUM } flow_combine_t;

/* Adds one counter series' increases to dst (see the rules above). *last_sec is its newest
 * sample's second, *ended whether the newest sample was a staleness marker. */
static void flow_counter(const querier_series_t *s, int64_t mint, int64_t maxt, int64_t start_s, int64_t end_s,
                         double *dst, int64_t *last_sec, bool *ended)
{
    querier_iter_t it;
    querier_iter_init(&it, s, mint, maxt);
    int64_t t, psec = 0;
    double v, pv = 0;
    bool has = false;
    *last_sec = INT64_MIN;
    *ended = false;
    while (querier_iter_next(&it, &t, &v)) {
        int64_t sec = flow_floor_div(t, 1000);
        if (flow_is_stale(v)) {
            has = false;
            *ended = true;
            continue;
        }
        if (isnan(v))
            continue;
        *ended = false;
        *last_sec = sec;
        if (has && sec - psec <= FLOW_LOOKBEHIND_S) {
            double delta = v >= pv ? v - pv : v;
            int64_t span = sec > psec ? sec - psec : 1;
            int64_t from = sec > psec ? psec + 1 : sec;
            double per = delta / (double)span;
            int64_t a = from > start_s ? from : start_s, b = sec < end_s ? sec : end_s;
            for (int64_t x = a; x <= b; x++) {
                double *d = &dst[x - start_s];
                *d = isnan(*d) ? per : *d + per;
            }
        }
        psec = sec;
        pv = v;
        has = true;
    }
}

static void flow_hold_fill(double *dst, int64_t start_s, int64_t end_s, int64_t a, int64_t b, double v,
                           flow_combine_t how)
{
    if (a < start_s)
        a = start_s;
    if (b > end_s)
        b = end_s;
    for (int64_t x = a; x <= b; x++) {
        double *d = &dst[x - start_s];
        if (isnan(*d))
            *d = v;
        else if (how == FLOW_COMBINE_SUM)
            *d += v;
        else if (v > *d)
            *d = v;
    }
}

/* Folds one gauge series, held from each sample until the next (bounded), into dst. */
static void flow_gauge(const querier_series_t *s, int64_t mint, int64_t maxt, int64_t start_s, int64_t end_s,
                       double scale, flow_combine_t how, double *dst)
{
    querier_iter_t it;
    querier_iter_init(&it, s, mint, maxt);
    int64_t t, psec = 0;
    double v, pv = 0;
    bool has = false;
    while (querier_iter_next(&it, &t, &v)) {
        int64_t sec = flow_floor_div(t, 1000);
        if (has) {
            int64_t until = sec - 1 < psec + FLOW_GAUGE_HOLD_S ? sec - 1 : psec + FLOW_GAUGE_HOLD_S;
            flow_hold_fill(dst, start_s, end_s, psec, until, pv, how);
        }
        has = !isnan(v); /* staleness markers are NaN too: both end the hold */
        psec = sec;
        pv = v * scale;
        if (has && scale != 1.0)
            pv = pv < 0 ? 0 : pv > 1 ? 1 : pv;
    }
    if (has)
        flow_hold_fill(dst, start_s, end_s, psec, psec + FLOW_GAUGE_HOLD_S, pv, how);
}

static api_flow_task_t *flow_task(api_flow_result_t *r, const char *name, char *err, size_t errlen)
{
    for (size_t i = 0; i < r->ntasks; i++)
        if (strcmp(r->tasks[i].name, name) == 0)
            return &r->tasks[i];
    if (r->ntasks >= FLOW_MAX_TASKS) {
        snprintf(err, errlen, "job has more than %d tasks", FLOW_MAX_TASKS);
        return NULL;
    }
    if (!r->tasks && !(r->tasks = calloc(FLOW_MAX_TASKS, sizeof(*r->tasks))))
        goto oom;
    api_flow_task_t *tk = &r->tasks[r->ntasks];
    tk->name = strdup(name);
    tk->backpressure = flow_nan_array(r->n);
    tk->busy = flow_nan_array(r->n);
    r->ntasks++; /* counted before the check so result_free releases partial allocations */
    if (!tk->name || !tk->backpressure || !tk->busy)
        goto oom;
    return tk;
oom:
    snprintf(err, errlen, "out of memory");
    return NULL;
}

static api_flow_lag_t *flow_lag(api_flow_result_t *r, const char *name, char *err, size_t errlen)
{
    for (size_t i = 0; i < r->nlags; i++)
        if (strcmp(r->lags[i].name, name) == 0)
            return &r->lags[i];
    if (r->nlags >= FLOW_MAX_LAGS)
        return NULL; /* more lag metrics than we show: ignore the rest */
    if (!r->lags && !(r->lags = calloc(FLOW_MAX_LAGS, sizeof(*r->lags))))
        goto oom;
    api_flow_lag_t *lg = &r->lags[r->nlags++];
    lg->name = strdup(name);
    lg->values = flow_nan_array(r->n);
    if (!lg->name || !lg->values)
        goto oom;
    return lg;
oom:
    snprintf(err, errlen, "out of memory");
    return NULL;
}

static int flow_cmp_task(const void *a, const void *b)
{
    return strcmp(((const api_flow_task_t *)a)->name, ((const api_flow_task_t *)b)->name);
}

static int flow_cmp_lag(const void *a, const void *b)
{
    return strcmp(((const api_flow_lag_t *)a)->name, ((const api_flow_lag_t *)b)->name);
}

/* Runs one select and hands each series to the folding code. */
static int flow_select(querier_t *q, api_flow_result_t *r, const char *job, matcher_type_t name_type,
                       const char *name_value, int64_t now_s, int64_t *live_min, int64_t *any_max, char *err,
                       size_t errlen)
{
    matcher_t *ms[2] = {matcher_new(MATCHER_EQ, "job_name", job, err, errlen),
                        matcher_new(name_type, LABEL_METRIC_NAME, name_value, err, errlen)};
    int rc = 0;
    if (!ms[0] || !ms[1]) {
        rc = -1;
        goto out;
    }
    int64_t mint = (r->start_s - FLOW_LOOKBEHIND_S) * 1000, maxt = r->end_s * 1000 + 999;
    querier_hints_t hints = {.start_ms = mint, .end_ms = maxt};
    querier_set_t *set = querier_select(q, (const matcher_t *const *)ms, 2, mint, maxt, &hints);
    if (!set) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
        goto out;
    }
    const querier_series_t *s;
    while (rc == 0 && (s = querier_set_next(set)) != NULL) {
        const char *name = labels_get(&s->labels, LABEL_METRIC_NAME);
        if (!name)
            continue;
        flow_kind_t kind = strcmp(name, FLOW_METRIC_RECORDS_IN) == 0     ? FLOW_IN
                           : strcmp(name, FLOW_METRIC_RECORDS_OUT) == 0  ? FLOW_OUT
                           : strcmp(name, FLOW_METRIC_BACKPRESSURE) == 0 ? FLOW_BP
                           : strcmp(name, FLOW_METRIC_BUSY) == 0         ? FLOW_BUSY
                                                                         : FLOW_LAG;
        if (kind == FLOW_IN || kind == FLOW_OUT) {
            int64_t last;
            bool ended;
            flow_counter(s, mint, maxt, r->start_s, r->end_s, kind == FLOW_IN ? r->records_in : r->records_out, &last,
                         &ended);
            if (last == INT64_MIN)
                continue;
            r->counter_series++;
            if (last > *any_max)
                *any_max = last;
            if (!ended && last >= now_s - FLOW_LIVE_S && last < *live_min)
                *live_min = last;
        } else if (kind == FLOW_BP || kind == FLOW_BUSY) {
            const char *task = labels_get(&s->labels, "task_name");
            api_flow_task_t *tk = flow_task(r, task ? task : "", err, errlen);
            if (!tk) {
                rc = -1;
                break;
            }
            if (kind == FLOW_BP)
                tk->subtasks++;
            flow_gauge(s, mint, maxt, r->start_s, r->end_s, 1.0 / 1000.0, FLOW_COMBINE_MAX,
                       kind == FLOW_BP ? tk->backpressure : tk->busy);
        } else {
            api_flow_lag_t *lg = flow_lag(r, name, err, errlen);
            if (lg)
                flow_gauge(s, mint, maxt, r->start_s, r->end_s, 1.0, FLOW_COMBINE_SUM, lg->values);
            else if (r->nlags < FLOW_MAX_LAGS)
                rc = -1;
        }
    }
    const char *serr = querier_set_error(set);
    if (rc == 0 && serr) {
        snprintf(err, errlen, "%s", serr);
        rc = -1;
    }
    querier_set_free(set);
out:
    matcher_free(ms[0]);
    matcher_free(ms[1]);
    return rc;
}

int api_flow_compute(querier_t *q, const char *job, int64_t start_s, int64_t end_s, int64_t now_ms,
                     api_flow_result_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->complete_s = -1;
    if (end_s < start_s || end_s - start_s + 1 > FLOW_MAX_WINDOW_S) {
        snprintf(err, errlen, "window must be 1s..%ds", FLOW_MAX_WINDOW_S);
        return -1;
    }
    out->start_s = start_s;
    out->end_s = end_s;
    out->n = (size_t)(end_s - start_s + 1);
    out->records_in = flow_nan_array(out->n);
    out->records_out = flow_nan_array(out->n);
    if (!out->records_in || !out->records_out) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int64_t now_s = flow_floor_div(now_ms, 1000);
    int64_t live_min = INT64_MAX, any_max = INT64_MIN;
    if (flow_select(q, out, job, MATCHER_RE,
                    FLOW_METRIC_RECORDS_IN "|" FLOW_METRIC_RECORDS_OUT "|" FLOW_METRIC_BACKPRESSURE
                                           "|" FLOW_METRIC_BUSY,
                    now_s, &live_min, &any_max, err, errlen) != 0 ||
        flow_select(q, out, job, MATCHER_RE, FLOW_LAG_REGEX, now_s, &live_min, &any_max, err, errlen) != 0)
        return -1;
    if (out->counter_series > 0) {
        int64_t c = live_min != INT64_MAX ? live_min : any_max;
        out->complete_s = c < end_s ? c : end_s;
        for (int64_t x = out->complete_s + 1; x <= end_s; x++) {
            if (x < start_s)
                continue;
            out->records_in[x - start_s] = NAN;
            out->records_out[x - start_s] = NAN;
        }
    }
    if (out->ntasks > 1)
        qsort(out->tasks, out->ntasks, sizeof(*out->tasks), flow_cmp_task);
    if (out->nlags > 1)
        qsort(out->lags, out->nlags, sizeof(*out->lags), flow_cmp_lag);
    return 0;
}

void api_flow_result_free(api_flow_result_t *r)
{
    free(r->records_in);
    free(r->records_out);
    for (size_t i = 0; i < r->ntasks; i++) {
        free(r->tasks[i].name);
        free(r->tasks[i].backpressure);
        free(r->tasks[i].busy);
    }
    free(r->tasks);
    for (size_t i = 0; i < r->nlags; i++) {
        free(r->lags[i].name);
        free(r->lags[i].values);
    }
    free(r->lags);
    memset(r, 0, sizeof(*r));
}

/* --- JSON ------------------------------------------------------------------------------------------ */

static void flow_put_num(buf_t *b, double v)
{
    if (isnan(v) || isinf(v)) {
        buf_puts(b, "null");
        return;
    }
    /* Three decimals are plenty for records/s and ratios and keep the payload small. */
    buf_put_float_json(b, round(v * 1000.0) / 1000.0);
}

static void flow_put_array(buf_t *b, const double *a, size_t n)
{
    buf_putc(b, '[');
    for (size_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        flow_put_num(b, a[i]);
    }
    buf_putc(b, ']');
}

static double flow_last_value(const double *a, size_t n)
{
    for (size_t i = n; i-- > 0;)
        if (!isnan(a[i]))
            return a[i];
    return NAN;
}

/* Flink's web UI thresholds on the backpressured-time ratio. */
static const char *flow_level(double ratio)
{
    if (isnan(ratio))
        return NULL;
    return ratio < 0.1 ? "ok" : ratio <= 0.5 ? "low" : "high";
}

void api_flow_result_json_open(const api_flow_result_t *r, const char *job, buf_t *b)
{
    buf_puts(b, "{\"job\":");
    buf_put_json_string(b, job, strlen(job));
    buf_printf(b, ",\"start\":%lld,\"end\":%lld,\"step\":1,\"complete_until\":", (long long)r->start_s,
               (long long)r->end_s);
    if (r->complete_s >= 0)
        buf_printf(b, "%lld", (long long)r->complete_s);
    else
        buf_puts(b, "null");
    buf_printf(b, ",\"counter_series\":%d,\"records_in\":", r->counter_series);
    flow_put_array(b, r->records_in, r->n);
    buf_puts(b, ",\"records_out\":");
    flow_put_array(b, r->records_out, r->n);
    buf_puts(b, ",\"tasks\":[");
    for (size_t i = 0; i < r->ntasks; i++) {
        const api_flow_task_t *t = &r->tasks[i];
        double bp = flow_last_value(t->backpressure, r->n);
        const char *lvl = flow_level(bp);
        buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
        buf_put_json_string(b, t->name, strlen(t->name));
        buf_printf(b, ",\"subtasks\":%d,\"backpressure_now\":", t->subtasks);
        flow_put_num(b, bp);
        buf_puts(b, ",\"busy_now\":");
        flow_put_num(b, flow_last_value(t->busy, r->n));
        buf_puts(b, ",\"level\":");
        if (lvl)
            buf_printf(b, "\"%s\"", lvl);
        else
            buf_puts(b, "null");
        buf_puts(b, ",\"backpressure\":");
        flow_put_array(b, t->backpressure, r->n);
        buf_puts(b, ",\"busy\":");
        flow_put_array(b, t->busy, r->n);
        buf_putc(b, '}');
    }
    buf_puts(b, "],\"lags\":[");
    for (size_t i = 0; i < r->nlags; i++) {
        buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
        buf_put_json_string(b, r->lags[i].name, strlen(r->lags[i].name));
        buf_puts(b, ",\"values\":");
        flow_put_array(b, r->lags[i].values, r->n);
        buf_putc(b, '}');
    }
    buf_putc(b, ']');
}

/* --- HTTP --------------------------------------------------------------------------------------------- */

typedef struct flow_sub flow_sub_t;

typedef struct {
    api_sse_list_t subs; /* of flow_sub_t */
    bool closing;
} flow_worker_t;

struct api_flow {
    api_flow_options_t opt;
    int nworkers;
    flow_worker_t *workers;
    _Atomic int subscribers;
};

struct flow_sub {
    api_flow_t *f;
    api_req_t *req;
    char *job;
    int64_t window_s;
    int64_t prev_end;      /* end of the previous event */
    int64_t prev_complete; /* its complete_until, -1 = none */
    struct event *timer;
    int worker;
    api_sse_link_t link; /* on workers[worker].subs */
};

static int64_t flow_now_ms(const api_flow_t *f)
{
    if (f->opt.clock_ms)
        return f->opt.clock_ms();
    return clock_wall_ms();
}

/* Checks job and window; 0 or replies 400 and returns -1. */
static int flow_params(api_req_t *req, const char **job, int64_t *window_s)
{
    char err[256];
    *job = api_req_param(req, "job");
    if (!*job || !**job) {
        api_reply_prom_error(req, API_ERR_BAD_DATA, "missing parameter \"job\" (the Flink job_name)");
        return -1;
    }
    if (control_job_name_valid(*job, strlen(*job), err, sizeof(err)) != 0) {
        api_reply_prom_error(req, API_ERR_BAD_DATA, "invalid parameter \"job\": %s", err);
        return -1;
    }
    *window_s = FLOW_DEFAULT_WINDOW_S;
    const char *w = api_req_param(req, "window");
    if (w) {
        int64_t ms;
        if (parse_duration_or_seconds_ms(w, &ms) != 0 || ms < 1000 || ms > FLOW_MAX_WINDOW_S * 1000LL ||
            ms % 1000 != 0) {
            api_reply_prom_error(req, API_ERR_BAD_DATA,
                                 "invalid parameter \"window\": want whole seconds between 1s and %ds",
                                 FLOW_MAX_WINDOW_S);
            return -1;
        }
        *window_s = ms / 1000;
    }
    return 0;
}

/* The event/data body for [start_s, end_s]: the flow object plus "control". */
static int flow_render(api_flow_t *f, const char *job, int64_t start_s, int64_t end_s, int64_t now_ms, buf_t *out,
                       int64_t *complete, char *err, size_t errlen)
{
    querier_t *q = storage_querier(f->opt.storage);
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    api_flow_result_t r;
    int rc = api_flow_compute(q, job, start_s, end_s, now_ms, &r, err, errlen);
    querier_close(q);
    if (rc == 0) {
        api_flow_result_json_open(&r, job, out);
        buf_puts(out, ",\"control\":");
        size_t before = out->len;
        if (f->opt.control_json)
            f->opt.control_json(job, out, f->opt.control_ud);
        if (out->len == before)
            buf_puts(out, "null");
        buf_putc(out, '}');
        if (complete)
            *complete = r.complete_s;
    }
    api_flow_result_free(&r);
    return rc;
}

static void flow_h_get(api_req_t *req, void *ud)
{
    api_flow_t *f = ud;
    const char *job;
    int64_t window_s;
    if (flow_params(req, &job, &window_s) != 0)
        return;
    int64_t now_ms = flow_now_ms(f);
    int64_t end_s = flow_floor_div(now_ms, 1000);
    const char *e = api_req_param(req, "end");
    if (e) {
        double d;
        if (parse_double(e, &d) != 0 || !isfinite(d) || d < 0 || d > 1e11) {
            api_reply_prom_error(req, API_ERR_BAD_DATA, "invalid parameter \"end\": want Unix seconds");
            return;
        }
        end_s = (int64_t)floor(d);
    }
    char err[256];
    buf_t b = BUF_INIT;
    if (flow_render(f, job, end_s - window_s + 1, end_s, now_ms, &b, NULL, err, sizeof(err)) != 0) {
        api_reply_prom_error(req, API_ERR_INTERNAL, "%s", err);
    } else {
        api_reply_header(req, "Cache-Control", "no-store");
        api_reply_prom_success(req, b.data, b.len);
    }
    buf_free(&b);
}

static void flow_sub_free(flow_sub_t *s)
{
    if (s->timer)
        event_free(s->timer);
    atomic_fetch_sub(&s->f->subscribers, 1);
    free(s->job);
    free(s);
}

/* Ends the stream from our side (shutdown, or a reader too slow). */
static void flow_sub_end(flow_sub_t *s)
{
    api_sse_list_remove(&s->f->workers[s->worker].subs, &s->link);
    api_reply_stream_end(s->req);
    flow_sub_free(s);
}

static void flow_sub_closed(api_req_t *req, void *ud)
{
    flow_sub_t *s = ud;
    api_sse_list_remove(&s->f->workers[s->worker].subs, &s->link);
    flow_sub_free(s);
}

static void flow_sub_arm(flow_sub_t *s)
{
    int64_t now = flow_now_ms(s->f);
    int64_t delay = 1250 - now % 1000; /* a quarter second into the next second */
    struct timeval tv = {(time_t)(delay / 1000), (suseconds_t)((delay % 1000) * 1000)};
    event_add(s->timer, &tv);
}

/* Sends seconds [from, now] (the whole window the first time). 0, or -1 if the stream ended. */
static int flow_sub_send(flow_sub_t *s, bool first)
{
    int64_t now_ms = flow_now_ms(s->f);
    int64_t end_s = flow_floor_div(now_ms, 1000);
    int64_t wstart = end_s - s->window_s + 1, from = wstart;
    if (!first) {
        if (s->prev_complete >= 0)
            from = (s->prev_complete < s->prev_end ? s->prev_complete : s->prev_end) + 1;
        if (from < wstart)
            from = wstart;
        if (from > end_s)
            from = end_s;
    }
    buf_t b = BUF_INIT;
    char err[256];
    int64_t complete = -1;
    int rc = flow_render(s->f, s->job, from, end_s, now_ms, &b, &complete, err, sizeof(err));
    if (rc != 0) {
        buf_reset(&b);
        buf_put_json_string(&b, err, strlen(err));
    }
    rc = api_sse_send(s->req, 0, rc == 0 ? "flow" : "error", b.data, b.len);
    buf_free(&b);
    if (rc != 0)
        return 0; /* the client is gone: the close callback frees the subscriber */
    s->prev_end = end_s;
    s->prev_complete = complete;
    return 0;
}

static void flow_sub_tick(evutil_socket_t fd, short what, void *arg)
{
    flow_sub_t *s = arg;
    (void)fd;
    (void)what;
    size_t pending = api_reply_stream_pending(s->req);
    if (pending > FLOW_SSE_MAX_PENDING) {
        log_info("flow", "dropping a stream subscriber that does not read", LF_S("job", s->job));
        flow_sub_end(s);
        return;
    }
    if (pending <= FLOW_SSE_SKIP_BYTES)
        flow_sub_send(s, false);
    flow_sub_arm(s);
}

static void flow_h_stream(api_req_t *req, void *ud)
{
    api_flow_t *f = ud;
    const char *job;
    int64_t window_s;
    if (flow_params(req, &job, &window_s) != 0)
        return;
    if (!f->workers || req->worker < 0 || req->worker >= f->nworkers || f->workers[req->worker].closing) {
        api_reply_prom_error(req, API_ERR_UNAVAILABLE, "streams are not available");
        return;
    }
    if (atomic_fetch_add(&f->subscribers, 1) >= FLOW_MAX_SUBSCRIBERS) {
        atomic_fetch_sub(&f->subscribers, 1);
        api_reply_prom_error(req, API_ERR_UNAVAILABLE, "too many flow streams (limit %d)", FLOW_MAX_SUBSCRIBERS);
        return;
    }
    flow_sub_t *s = calloc(1, sizeof(*s));
    if (s) {
        s->f = f;
        s->job = strdup(job);
        s->timer = event_new(api_req_base(req), -1, 0, flow_sub_tick, s);
    }
    if (!s || !s->job || !s->timer) {
        if (s) {
            s->f = f;
            flow_sub_free(s);
        } else {
            atomic_fetch_sub(&f->subscribers, 1);
        }
        api_reply_prom_error(req, API_ERR_INTERNAL, "out of memory");
        return;
    }
    s->req = req;
    s->window_s = window_s;
    s->prev_complete = -1;
    s->worker = req->worker;
    api_sse_list_push(&f->workers[req->worker].subs, &s->link);
    api_sse_start(req, 2000, NULL, flow_sub_closed, s);
    flow_sub_send(s, true);
    flow_sub_arm(s);
}

/* --- lifecycle ------------------------------------------------------------------------------------------ */

/* Runs on each worker at shutdown: ends its streams, refuses new ones. */
static void flow_worker_close(void *ud, int worker)
{
    flow_worker_t *w = &((api_flow_t *)ud)->workers[worker];
    w->closing = true;
    while (w->subs.head)
        flow_sub_end(API_SSE_OF(w->subs.head, flow_sub_t, link));
}

static void flow_on_shutdown(void *ud)
{
    api_flow_t *f = ud;
    api_sse_close_workers(f->opt.srv, flow_worker_close, f);
}

api_flow_t *api_flow_new(const api_flow_options_t *opt)
{
    api_flow_t *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->opt = *opt;
    if (opt->srv) {
        f->nworkers = api_server_worker_count(opt->srv);
        f->workers = calloc((size_t)(f->nworkers > 0 ? f->nworkers : 1), sizeof(*f->workers));
        if (!f->workers) {
            free(f);
            return NULL;
        }
    }
    return f;
}

void api_flow_register_routes(api_flow_t *f, api_server_t *srv)
{
    api_route_add(srv, API_GET, "/api/v1/flow", "flow", flow_h_get, f);
    api_route_add(srv, API_GET, "/api/v1/flow/stream", "flow_stream", flow_h_stream, f);
    if (f->opt.srv)
        api_server_on_shutdown(f->opt.srv, flow_on_shutdown, f);
}

void api_flow_free(api_flow_t *f)
{
    if (!f)
        return;
    free(f->workers);
    free(f);
}
