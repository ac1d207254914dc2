/*
 * query — Prometheus HTTP API v1 query endpoints; see query.h.
 *
 * Request life:
 *
 *   worker loop                         pool thread                        worker loop
 *   -----------                         -----------                        -----------
 *   parse + validate params ──error──▶ reply at once
 *        │ ok
 *   job (own arena: copies of
 *   everything it needs), park req ──▶ queue ──▶ pop; cancelled? timed out
 *                                                 in queue? else run():
 *                                                 querier, evaluate, render
 *                                                 JSON, gzip ──────────────▶ job_done: reply if the
 *                                                                             client is still there
 *
 * The parked request may vanish (client closed): its on_close runs on the worker loop, clears
 * job->req and sets job->cancel, which the engine polls. job_done runs on the same loop, so
 * job->req needs no lock. Every job ends in job_done (which frees it), except when the server's
 * loops are already gone at shutdown (then the pool frees it).
 *
 * Bytes follow Prometheus 2.42 (api/v1/api.go, jsoniter codecs):
 *   vector/matrix points  [<ts>,"<value>"]  ts = seconds with exactly 3 decimals when not whole
 *                                            ("1.500", "-1.250"), value = buf_put_float_json
 *   scalar/string          [<ts>,"<value>"]  ts = Go's JSON float (1.5), value = FormatFloat 'f'
 *   strings                Go's encoding/json escaping: <, >, & as \u003c \u003e \u0026,
 *                          U+2028/2029 escaped, invalid UTF-8 as \ufffd
 *
 * Times (parseTime): Unix seconds as a float (fraction rounded to ms), or RFC3339(Nano).
 * Durations (parseDuration): float seconds, or a Prometheus duration ("5m", "1h30m").
 */
#include "api/query.h"

#include <assert.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "api/router.h"
#include "internal/promql/engine.h"
#include "internal/promql/selector.h"
#include "internal/util/clock.h"
#include "internal/util/heap.h"
#include "internal/util/arena.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "internal/util/parse.h"
#include "internal/util/utf8.h"

#define Q_MIN_TIME (INT64_MIN / 4) /* "all time" bounds for series/labels without start/end */
#define Q_MAX_TIME (INT64_MAX / 4)
#define Q_MAX_POINTS 11000

typedef struct query_job query_job_t;

struct api_query {
    api_query_options_t opt;
    char *config_yaml;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    query_job_t *head, *tail; /* FIFO of queued jobs */
    query_job_t *live;        /* every job not yet freed (queued, running, replying) */
    bool stop;
};

typedef enum { JOB_INSTANT, JOB_RANGE, JOB_SERIES, JOB_LABELS, JOB_LABEL_VALUES } query_job_kind_t;

struct query_job {
    api_query_t *q;
    query_job_kind_t kind;
    api_req_t *req; /* NULL once the client has gone; touched only on the worker loop */
    int worker;
    bool gzip;    /* the client accepts gzip */
    bool gzipped; /* body is compressed already */
    volatile int cancel;
    int64_t deadline_ns; /* CLOCK_MONOTONIC; 0 = none */
    arena_t *arena;      /* inputs copied here: the request's arena may die first */
    /* inputs */
    promql_ast_t *ast;
    int64_t t, start, end, step;
    bool rollup_step; /* rollups=step: the approximate opt-in (promql_opts_t.rollup_step) */
    promql_selector_t *sels;
    size_t nsels;
    const char *label_name;
    /* output */
    int code;
    buf_t body;
    /* lists */
    query_job_t *next; /* queue */
    query_job_t *live_prev, *live_next;
};

/* ---- JSON output -------------------------------------------------------------------------- */

/* A JSON string exactly as Go's encoding/json (HTML-safe) writes it. */
static void q_json_str(buf_t *b, const char *str, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    buf_reserve(b, n + 2);
    buf_putc(b, '"');
    size_t run = 0, i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80) {
            size_t l = utf8_decode(str + i, n - i, NULL);
            bool ls = l == 3 && s[i] == 0xe2 && s[i + 1] == 0x80 && (s[i + 2] == 0xa8 || s[i + 2] == 0xa9);
            if (l && !ls) {
                i += l;
                continue;
            }
            buf_append(b, str + run, i - run);
            if (ls)
                buf_puts(b, s[i + 2] == 0xa8 ? "\\u2028" : "\\u2029");
            else
                buf_puts(b, "\\ufffd");
            i += l ? l : 1;
            run = i;
            continue;
        }
        buf_append(b, str + run, i - run);
        switch (c) {
        case '"': buf_puts(b, "\\\""); break;
        case '\\': buf_puts(b, "\\\\"); break;
        case '\n': buf_puts(b, "\\n"); break;
        case '\r': buf_puts(b, "\\r"); break;
        case '\t': buf_puts(b, "\\t"); break;
        default: {
            char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            buf_puts(b, u);
        }
        }
        i++;
        run = i;
    }
    buf_append(b, str + run, n - run);
    buf_putc(b, '"');
}

static void q_json_cstr(buf_t *b, const char *s)
{
    q_json_str(b, s, strlen(s));
}

/* Point timestamps: integer seconds, then '.' and exactly three digits when not whole. */
static void q_put_ts(buf_t *b, int64_t t)
{
    if (t < 0) {
        buf_putc(b, '-');
        t = -t;
    }
    buf_printf(b, "%lld", (long long)(t / 1000));
    if (t % 1000)
        buf_printf(b, ".%03lld", (long long)(t % 1000));
}

/* Scalar and string timestamps go through Go's JSON float encoding of t/1000. */
static void q_put_ts_float(buf_t *b, int64_t t)
{
    buf_put_float_json(b, (double)t / 1000.0);
}

static void q_put_metric(buf_t *b, const labels_t *ls)
{
    buf_putc(b, '{');
    for (size_t i = 0; i < ls->n; i++) {
        if (i)
            buf_putc(b, ',');
        q_json_cstr(b, ls->v[i].name);
        buf_putc(b, ':');
        q_json_cstr(b, ls->v[i].value);
    }
    buf_putc(b, '}');
}

static void q_put_point(buf_t *b, int64_t t, double v)
{
    buf_putc(b, '[');
    q_put_ts(b, t);
    buf_puts(b, ",\"");
    buf_put_float_json(b, v);
    buf_puts(b, "\"]");
}

static void q_put_matrix(buf_t *b, const promql_value_t *v)
{
    buf_putc(b, '[');
    for (size_t i = 0; i < v->nseries; i++) {
        const promql_series_t *s = &v->series[i];
        if (i)
            buf_putc(b, ',');
        buf_puts(b, "{\"metric\":");
        q_put_metric(b, &s->metric);
        buf_puts(b, ",\"values\":[");
        for (size_t k = 0; k < s->npoints; k++) {
            if (k)
                buf_putc(b, ',');
            q_put_point(b, s->points[k].t, s->points[k].v);
        }
        buf_puts(b, "]}");
    }
    buf_putc(b, ']');
}

/* {"resultType":...,"result":...} */
static void q_put_value(buf_t *b, const promql_value_t *v)
{
    switch (v->type) {
    case PROMQL_VT_SCALAR:
        buf_puts(b, "{\"resultType\":\"scalar\",\"result\":[");
        q_put_ts_float(b, v->t);
        buf_puts(b, ",\"");
        buf_put_float_go(b, v->scalar, 'f');
        buf_puts(b, "\"]}");
        break;
    case PROMQL_VT_STRING:
        buf_puts(b, "{\"resultType\":\"string\",\"result\":[");
        q_put_ts_float(b, v->t);
        buf_putc(b, ',');
        q_json_cstr(b, v->string ? v->string : "");
        buf_puts(b, "]}");
        break;
    case PROMQL_VT_VECTOR:
        buf_puts(b, "{\"resultType\":\"vector\",\"result\":[");
        for (size_t i = 0; i < v->nsamples; i++) {
            if (i)
                buf_putc(b, ',');
            buf_puts(b, "{\"metric\":");
            q_put_metric(b, &v->samples[i].metric);
            buf_puts(b, ",\"value\":");
            q_put_point(b, v->samples[i].t, v->samples[i].v);
            buf_putc(b, '}');
        }
        buf_puts(b, "]}");
        break;
    case PROMQL_VT_MATRIX:
    default:
        buf_puts(b, "{\"resultType\":\"matrix\",\"result\":");
        q_put_matrix(b, v);
        buf_putc(b, '}');
        break;
    }
}

static void q_success(buf_t *b, const char *data, size_t len)
{
    buf_puts(b, "{\"status\":\"success\",\"data\":");
    buf_append(b, data, len);
    buf_putc(b, '}');
}

/* A success with Prometheus' optional "warnings" array after the data (left out when empty, as
 * Prometheus' omitempty does). */
static void q_success_warn(buf_t *b, const char *data, size_t len, const char *const *warnings, size_t nwarnings)
{
    buf_puts(b, "{\"status\":\"success\",\"data\":");
    buf_append(b, data, len);
    if (nwarnings) {
        buf_puts(b, ",\"warnings\":[");
        for (size_t i = 0; i < nwarnings; i++) {
            if (i)
                buf_putc(b, ',');
            q_json_cstr(b, warnings[i]);
        }
        buf_putc(b, ']');
    }
    buf_putc(b, '}');
}

static int q_error(buf_t *b, api_error_kind_t kind, const char *msg)
{
    buf_puts(b, "{\"status\":\"error\",\"errorType\":\"");
    buf_puts(b, api_error_type(kind));
    buf_puts(b, "\",\"error\":");
    q_json_cstr(b, msg);
    buf_putc(b, '}');
    return api_error_status(kind);
}

/* gzip (RFC 1952) of body into out. 0 or -1. */
static int q_gzip(const buf_t *body, buf_t *out)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    size_t bound = deflateBound(&z, (uLong)body->len) + 32;
    if (buf_try_reserve(out, bound) != 0) {
        deflateEnd(&z);
        return -1;
    }
    z.next_in = (Bytef *)body->data;
    z.avail_in = (uInt)body->len;
    z.next_out = (Bytef *)out->data;
    z.avail_out = (uInt)bound;
    int rc = deflate(&z, Z_FINISH);
    out->len = bound - z.avail_out;
    deflateEnd(&z);
    return rc == Z_STREAM_END ? 0 : -1;
}

static bool q_accepts_gzip(api_req_t *req)
{
    const char *ae = api_req_header(req, "Accept-Encoding");
    return ae && strstr(ae, "gzip") != NULL;
}

/* Sends body (JSON) with code, compressed when the client accepts gzip. */
static void q_send(api_req_t *req, int code, const buf_t *body, bool gzip)
{
    if (gzip && body->len > 0) {
        buf_t z = BUF_INIT;
        if (q_gzip(body, &z) == 0) {
            api_reply_header(req, "Content-Encoding", "gzip");
            api_reply_header(req, "Vary", "Accept-Encoding");
            api_reply(req, code, "application/json", z.data, z.len);
            buf_free(&z);
            return;
        }
        buf_free(&z);
    }
    api_reply(req, code, "application/json", body->data, body->len);
}

static void q_reply_error(api_req_t *req, api_error_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void q_reply_error(api_req_t *req, api_error_kind_t kind, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    buf_t b = BUF_INIT;
    int code = q_error(&b, kind, msg);
    q_send(req, code, &b, q_accepts_gzip(req));
    buf_free(&b);
}

static void q_reply_success(api_req_t *req, const char *data, size_t len)
{
    buf_t b = BUF_INIT;
    q_success(&b, data, len);
    q_send(req, 200, &b, q_accepts_gzip(req));
    buf_free(&b);
}

/* ---- parameters ---------------------------------------------------------------------------- */

/* Go's strconv.ParseFloat on decimal input (hex floats and underscores are not worth it here). */
static int q_parse_float(const char *s, double *out)
{
    const char *p = s;
    if (*p == '+' || *p == '-')
        p++;
    if (strcasecmp(p, "inf") == 0 || strcasecmp(p, "infinity") == 0) {
        *out = s[0] == '-' ? -INFINITY : INFINITY;
        return 0;
    }
    if (strcasecmp(p, "nan") == 0) {
        *out = NAN;
        return 0;
    }
    bool digits = false;
    while (isdigit((unsigned char)*p))
        p++, digits = true;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p))
            p++, digits = true;
    }
    if (!digits)
        return -1;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!isdigit((unsigned char)*p))
            return -1;
        while (isdigit((unsigned char)*p))
            p++;
    }
    if (*p)
        return -1;
    *out = strtod(s, NULL);
    return 0;
}

static int64_t q_floordiv(int64_t a, int64_t b)
{
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

/* RFC3339 with optional fraction: 2006-01-02T15:04:05[.999999999](Z|±hh:mm). */
static int q_parse_rfc3339(const char *s, int64_t *ms)
{
    int Y, M, D, h, m, sec, n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &Y, &M, &D, &h, &m, &sec, &n) != 6 || n != 19)
        return -1;
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 59)
        return -1;
    const char *p = s + 19;
    int64_t frac_ns = 0;
    if (*p == '.') {
        p++;
        int digits = 0;
        int64_t scale = 100000000;
        while (isdigit((unsigned char)*p)) {
            if (digits < 9)
                frac_ns += (*p - '0') * scale, scale /= 10;
            digits++, p++;
        }
        if (!digits)
            return -1;
    }
    int64_t off = 0;
    if (*p == 'Z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om, k = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &k) != 2 || k != 5 || oh > 23 || om > 59)
            return -1;
        off = (oh * 3600 + om * 60) * (*p == '-' ? -1 : 1);
        p += 6;
    } else {
        return -1;
    }
    if (*p)
        return -1;
    struct tm tm = {.tm_year = Y - 1900, .tm_mon = M - 1, .tm_mday = D, .tm_hour = h, .tm_min = m, .tm_sec = sec};
    int64_t secs = (int64_t)timegm(&tm) - off;
    *ms = secs * 1000 + frac_ns / 1000000;
    return 0;
}

/* Prometheus' parseTime. 0 or -1. */
static int q_parse_time(const char *s, int64_t *ms)
{
    double f;
    if (q_parse_float(s, &f) == 0) {
        if (!isfinite(f) || fabs(f) > 9.2e9) { /* Go's int64 conversion gives MinInt64 ns */
            *ms = q_floordiv(INT64_MIN, 1000000);
            return 0;
        }
        double ip;
        double frac = modf(f, &ip);
        frac = round(frac * 1000) / 1000;
        int64_t ns = (int64_t)ip * 1000000000LL + (int64_t)(frac * 1e9);
        *ms = q_floordiv(ns, 1000000);
        return 0;
    }
    return q_parse_rfc3339(s, ms);
}

/* Prometheus' parseDuration: float seconds or a model.Duration. Result in ns (steps and timeouts
 * are compared in ns, as Go does) — or -1 with the message. */
static int q_parse_duration(const char *s, int64_t *ns, char *err, size_t errlen)
{
    double f;
    if (q_parse_float(s, &f) == 0) {
        double v = f * 1e9;
        if (!(v <= 9.2233720368547e18 && v >= -9.2233720368547e18)) {
            snprintf(err, errlen, "cannot parse \"%s\" to a valid duration. It overflows int64", s);
            return -1;
        }
        *ns = (int64_t)v;
        return 0;
    }
    int64_t ms;
    if (parse_duration_ms(s, &ms) == 0 && ms <= INT64_MAX / 1000000) {
        *ns = ms * 1000000;
        return 0;
    }
    snprintf(err, errlen, "cannot parse \"%s\" to a valid duration", s);
    return -1;
}

static const char *q_param(api_req_t *req, const char *name)
{
    const char *v = api_req_param(req, name);
    return v ? v : "";
}

/* parseTimeParam: absent/empty → def. Replies and returns -1 on a bad value. */
static int q_time_param(api_req_t *req, const char *name, int64_t def, int64_t *out)
{
    const char *v = q_param(req, name);
    if (!*v) {
        *out = def;
        return 0;
    }
    if (q_parse_time(v, out) != 0) {
        buf_t e = BUF_INIT;
        q_json_cstr(&e, v); /* Go's %q of an ASCII string is close enough to a JSON literal */
        q_reply_error(req, API_ERR_BAD_DATA,
                      "invalid parameter \"%s\": Invalid time value for '%s': cannot parse %s to a valid timestamp",
                      name, name, e.data);
        buf_free(&e);
        return -1;
    }
    return 0;
}

/* ---- jobs and the pool -------------------------------------------------------------------- */

static void job_free(query_job_t *j)
{
    for (size_t i = 0; i < j->nsels; i++)
        promql_selector_free(&j->sels[i]);
    free(j->sels);
    promql_ast_free(j->ast);
    buf_free(&j->body);
    arena_destroy(j->arena);
    free(j);
}

static void job_unlink_live(query_job_t *j)
{
    api_query_t *q = j->q;
    pthread_mutex_lock(&q->mu);
    if (j->live_prev)
        j->live_prev->live_next = j->live_next;
    else
        q->live = j->live_next;
    if (j->live_next)
        j->live_next->live_prev = j->live_prev;
    pthread_mutex_unlock(&q->mu);
}

static query_job_t *job_new(api_query_t *q, api_req_t *req, query_job_kind_t kind)
{
    query_job_t *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->arena = arena_create(0);
    if (!j->arena) {
        free(j);
        return NULL;
    }
    j->q = q;
    j->kind = kind;
    j->req = req;
    j->worker = req->worker;
    j->gzip = q_accepts_gzip(req);
    return j;
}

/* On the worker loop: the reply is ready (or the job was dropped). */
static void job_done(void *arg)
{
    query_job_t *j = arg;
    job_unlink_live(j);
    if (j->req && j->gzipped) {
        api_reply_header(j->req, "Content-Encoding", "gzip");
        api_reply_header(j->req, "Vary", "Accept-Encoding");
        api_reply(j->req, j->code, "application/json", j->body.data, j->body.len);
        j->req = NULL;
    } else if (j->req) {
        q_send(j->req, j->code, &j->body, j->gzip);
        j->req = NULL;
    }
    job_free(j);
}

/* On the worker loop: the client closed the connection of a parked request. */
static void job_client_gone(api_req_t *req, void *ud)
{
    query_job_t *j = ud;
    (void)req;
    j->req = NULL;
    j->cancel = 1;
}

static void job_submit(query_job_t *j)
{
    api_query_t *q = j->q;
    api_req_park(j->req, job_client_gone, j);
    pthread_mutex_lock(&q->mu);
    j->live_next = q->live;
    if (q->live)
        q->live->live_prev = j;
    q->live = j;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static void job_fail(query_job_t *j, api_error_kind_t kind, const char *msg)
{
    buf_reset(&j->body);
    j->code = q_error(&j->body, kind, msg);
}

static api_error_kind_t q_kind_of(promql_errkind_t k)
{
    switch (k) {
    case PROMQL_ERR_BAD_DATA: return API_ERR_BAD_DATA;
    case PROMQL_ERR_EXECUTION: return API_ERR_EXECUTION;
    case PROMQL_ERR_TIMEOUT: return API_ERR_TIMEOUT;
    case PROMQL_ERR_CANCELED: return API_ERR_CANCELED;
    case PROMQL_ERR_UNAVAILABLE: return API_ERR_UNAVAILABLE;
    default: return API_ERR_INTERNAL;
    }
}

static void job_run_promql(query_job_t *j)
{
    api_query_t *q = j->q;
    querier_t *qr = storage_querier_fallthrough(q->opt.storage);
    if (!qr) {
        job_fail(j, API_ERR_INTERNAL, "out of memory");
        return;
    }
    promql_opts_t o = {
        .lookback_ms = q->opt.lookback_ms,
        .max_samples = q->opt.max_samples,
        .cancel = &j->cancel,
        .budget = q->opt.budget,
        .max_memory = q->opt.max_memory,
        .rollup_step = j->rollup_step,
    };
    if (j->deadline_ns) {
        int64_t left = (j->deadline_ns - clock_mono_ns()) / 1000000;
        o.timeout_ms = left > 0 ? left : 1;
    }
    promql_result_t *r = j->kind == JOB_INSTANT ? promql_exec_instant(qr, j->ast, j->t, &o)
                                                : promql_exec_range(qr, j->ast, j->start, j->end, j->step, &o);
    if (r->err_kind != PROMQL_ERR_NONE) {
        job_fail(j, q_kind_of(r->err_kind), r->err);
    } else {
        buf_t data = BUF_INIT;
        q_put_value(&data, &r->value);
        q_success_warn(&j->body, data.data, data.len, r->warnings, r->nwarnings);
        buf_free(&data);
        j->code = 200;
    }
    size_t held = r->peak_memory;
    promql_result_free(r);
    querier_close(qr);
    heap_trim_after(held);
}

/* Sorted, de-duplicated union of string lists. */
static int q_strcmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void q_put_string_list(buf_t *b, const char **v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof(*v), q_strcmp);
    buf_putc(b, '[');
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && strcmp(v[i], v[i - 1]) == 0)
            continue;
        if (out++)
            buf_putc(b, ',');
        q_json_cstr(b, v[i]);
    }
    buf_putc(b, ']');
}

static void job_run_labels(query_job_t *j)
{
    querier_t *qr = storage_querier_fallthrough(j->q->opt.storage);
    if (!qr) {
        job_fail(j, API_ERR_INTERNAL, "out of memory");
        return;
    }
    const char **all = NULL;
    size_t nall = 0, cap = 0;
    char err[512] = "";
    size_t rounds = j->nsels ? j->nsels : 1;
    int rc = 0;
    for (size_t i = 0; i < rounds && rc == 0 && !j->cancel; i++) {
        const matcher_t *const *ms = j->nsels ? (const matcher_t *const *)j->sels[i].ms : NULL;
        size_t n = j->nsels ? j->sels[i].n : 0;
        const char **vals = NULL;
        size_t count = 0;
        if (j->kind == JOB_LABELS)
            rc = querier_label_names(qr, ms, n, j->start, j->end, j->arena, &vals, &count, err, sizeof(err));
        else
            rc = querier_label_values(qr, j->label_name, ms, n, j->start, j->end, j->arena, &vals, &count, err,
                                      sizeof(err));
        if (rc == 0 && count) {
            if (nall + count > cap) {
                cap = (nall + count) * 2;
                const char **nv = arena_alloc(j->arena, cap * sizeof(*nv));
                if (nall)
                    memcpy(nv, all, nall * sizeof(*nv));
                all = nv;
            }
            memcpy(all + nall, vals, count * sizeof(*vals));
            nall += count;
        }
    }
    querier_close(qr);
    if (rc != 0) {
        job_fail(j, API_ERR_INTERNAL, err);
        return;
    }
    buf_t data = BUF_INIT;
    q_put_string_list(&data, all, nall);
    q_success(&j->body, data.data, data.len);
    buf_free(&data);
    j->code = 200;
}

typedef struct {
    labels_t ls;
} q_series_t;

static int q_series_cmp(const void *a, const void *b)
{
    return labels_compare(&((const q_series_t *)a)->ls, &((const q_series_t *)b)->ls);
}

static void job_run_series(query_job_t *j)
{
    querier_t *qr = storage_querier_fallthrough(j->q->opt.storage);
    if (!qr) {
        job_fail(j, API_ERR_INTERNAL, "out of memory");
        return;
    }
    q_series_t *all = NULL;
    size_t n = 0, cap = 0;
    const char *err = NULL;
    char errbuf[512];
    api_error_kind_t err_kind = API_ERR_INTERNAL;
    for (size_t i = 0; i < j->nsels && !err && !j->cancel; i++) {
        querier_set_t *set =
            querier_select(qr, (const matcher_t *const *)j->sels[i].ms, j->sels[i].n, j->start, j->end, NULL);
        if (!set) {
            err = "out of memory";
            break;
        }
        const querier_series_t *s;
        while ((s = querier_set_next(set)) != NULL) {
            if (n == cap) {
                cap = cap ? cap * 2 : 256;
                q_series_t *nv = arena_alloc(j->arena, cap * sizeof(*nv));
                if (n)
                    memcpy(nv, all, n * sizeof(*nv));
                all = nv;
            }
            /* the set owns s until next(): copy the labels */
            labels_t c = {arena_alloc(j->arena, (s->labels.n ? s->labels.n : 1) * sizeof(label_t)), s->labels.n};
            for (size_t k = 0; k < c.n; k++) {
                c.v[k].name = arena_strdup(j->arena, s->labels.v[k].name);
                c.v[k].value = arena_strdup(j->arena, s->labels.v[k].value);
            }
            all[n++].ls = c;
        }
        if (querier_set_error(set)) {
            snprintf(errbuf, sizeof(errbuf), "%s", querier_set_error(set));
            err = errbuf;
            querier_err_kind_t qk = querier_set_error_kind(set);
            err_kind = qk == QUERIER_ERR_REMOTE        ? API_ERR_EXECUTION
                       : qk == QUERIER_ERR_UNAVAILABLE ? API_ERR_UNAVAILABLE
                                                       : API_ERR_INTERNAL;
        }
        querier_set_free(set);
    }
    querier_close(qr);
    if (err) {
        job_fail(j, err_kind, err);
        return;
    }
    if (j->nsels > 1 && n > 1)
        qsort(all, n, sizeof(*all), q_series_cmp);
    buf_t data = BUF_INIT;
    buf_putc(&data, '[');
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        if (i && labels_equal(&all[i].ls, &all[i - 1].ls))
            continue;
        if (out++)
            buf_putc(&data, ',');
        q_put_metric(&data, &all[i].ls);
    }
    buf_putc(&data, ']');
    q_success(&j->body, data.data, data.len);
    buf_free(&data);
    j->code = 200;
}

static void *pool_main(void *arg)
{
    api_query_t *q = arg;
    pthread_setname_np(pthread_self(), "query");
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->stop && !q->head)
            pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) { /* stop, queue drained */
            pthread_mutex_unlock(&q->mu);
            return NULL;
        }
        query_job_t *j = q->head;
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&q->mu);

        if (j->cancel)
            job_fail(j, API_ERR_CANCELED, "query was canceled in query queue");
        else if (j->deadline_ns && clock_mono_ns() >= j->deadline_ns)
            job_fail(j, API_ERR_TIMEOUT, "query timed out in query queue");
        else if (j->kind == JOB_INSTANT || j->kind == JOB_RANGE)
            job_run_promql(j);
        else if (j->kind == JOB_SERIES)
            job_run_series(j);
        else
            job_run_labels(j);
        if (j->gzip && j->body.len) { /* compress here, not on the loop */
            buf_t z = BUF_INIT;
            if (q_gzip(&j->body, &z) == 0) {
                buf_free(&j->body);
                j->body = z;
                j->gzipped = true;
            } else {
                buf_free(&z);
            }
        }
        if (api_server_run_on(q->opt.srv, j->worker, job_done, j) != 0) {
            log_warn("query", "cannot hand a reply back to its worker; dropping it");
            job_unlink_live(j);
            job_free(j);
        }
    }
}

static void query_on_shutdown(void *ud)
{
    api_query_t *q = ud;
    pthread_mutex_lock(&q->mu);
    for (query_job_t *j = q->live; j; j = j->live_next)
        j->cancel = 1;
    pthread_mutex_unlock(&q->mu);
}

api_query_t *api_query_new(const api_query_options_t *o, char *err, size_t errlen)
{
    api_query_t *q = calloc(1, sizeof(*q));
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    q->opt = *o;
    if (q->opt.timeout_ms <= 0)
        q->opt.timeout_ms = 2 * 60 * 1000;
    int n = o->max_concurrency > 0 ? o->max_concurrency : 20;
    q->config_yaml = strdup(o->config_yaml ? o->config_yaml : "");
    q->threads = calloc((size_t)n, sizeof(*q->threads));
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (!q->config_yaml || !q->threads) {
        snprintf(err, errlen, "out of memory");
        api_query_free(q);
        return NULL;
    }
    /* Evaluation recurses on the query tree (at most 1024 levels, see the parser): give the
     * query threads room for that even under sanitizers. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 32u << 20);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&q->threads[i], &attr, pool_main, q) != 0) {
            pthread_attr_destroy(&attr);
            snprintf(err, errlen, "cannot start query threads");
            api_query_free(q);
            return NULL;
        }
        q->nthreads++;
    }
    pthread_attr_destroy(&attr);
    if (o->srv)
        api_server_on_shutdown(o->srv, query_on_shutdown, q);
    return q;
}

void api_query_free(api_query_t *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    for (query_job_t *j = q->live; j; j = j->live_next)
        j->cancel = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->nthreads; i++)
        pthread_join(q->threads[i], NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->threads);
    free(q->config_yaml);
    free(q);
}

/* ---- handlers ----------------------------------------------------------------------------- */

/* The timeout parameter (combined with --query.timeout). Replies and returns -1 when bad or
 * already expired (Prometheus answers timeout=0 from its queue, negative ones from execution). */
static int q_timeout(api_query_t *q, api_req_t *req, query_job_t *j)
{
    int64_t ns = q->opt.timeout_ms * 1000000;
    const char *v = q_param(req, "timeout");
    if (*v) {
        char err[256];
        int64_t t;
        if (q_parse_duration(v, &t, err, sizeof(err)) != 0) {
            q_reply_error(req, API_ERR_BAD_DATA, "invalid parameter \"timeout\": %s", err);
            return -1;
        }
        if (t <= 0) {
            q_reply_error(req, API_ERR_TIMEOUT, "query timed out in query %s", t == 0 ? "queue" : "execution");
            return -1;
        }
        if (t < ns)
            ns = t;
    }
    j->deadline_ns = clock_mono_ns() + ns;
    return 0;
}

/* The sluice-only `rollups` parameter: "exact" (the default) answers from raw samples wherever
 * they exist; "step" opts in to roll-ups at the query step (faster over long ranges, approximate,
 * and said so in the response's warnings). Replies and returns -1 when bad. */
static int q_rollups(api_req_t *req, query_job_t *j)
{
    const char *v = q_param(req, "rollups");
    if (!*v || strcmp(v, "exact") == 0)
        j->rollup_step = false;
    else if (strcmp(v, "step") == 0)
        j->rollup_step = true;
    else {
        q_reply_error(req, API_ERR_BAD_DATA, "invalid parameter \"rollups\": want \"exact\" or \"step\"");
        return -1;
    }
    return 0;
}

static void q_reply_oom(api_req_t *req)
{
    q_reply_error(req, API_ERR_INTERNAL, "out of memory");
}

static void h_query(api_req_t *req, void *ud)
{
    api_query_t *q = ud;
    int64_t t;
    if (q_time_param(req, "time", clock_wall_ms(), &t) != 0)
        return;
    query_job_t *j = job_new(q, req, JOB_INSTANT);
    if (!j)
        return q_reply_oom(req);
    if (q_timeout(q, req, j) != 0 || q_rollups(req, j) != 0)
        return job_free(j);
    char err[512];
    j->ast = promql_parse(q_param(req, "query"), err, sizeof(err));
    if (!j->ast) {
        job_free(j);
        return q_reply_error(req, API_ERR_BAD_DATA, "invalid parameter \"query\": %s", err);
    }
    j->t = t;
    job_submit(j);
}

static int q_required_time(api_req_t *req, const char *name, int64_t *out)
{
    const char *v = q_param(req, name);
    if (q_parse_time(v, out) == 0 && *v)
        return 0;
    buf_t e = BUF_INIT;
    q_json_cstr(&e, v);
    q_reply_error(req, API_ERR_BAD_DATA, "invalid parameter \"%s\": cannot parse %s to a valid timestamp", name,
                  e.data);
    buf_free(&e);
    return -1;
}

static void h_query_range(api_req_t *req, void *ud)
{
    api_query_t *q = ud;
    int64_t start, end, step_ns;
    char err[512];
    if (q_required_time(req, "start", &start) != 0 || q_required_time(req, "end", &end) != 0)
        return;
    if (end < start)
        return q_reply_error(req, API_ERR_BAD_DATA,
                             "invalid parameter \"end\": end timestamp must not be before start time");
    if (q_parse_duration(q_param(req, "step"), &step_ns, err, sizeof(err)) != 0)
        return q_reply_error(req, API_ERR_BAD_DATA, "invalid parameter \"step\": %s", err);
    if (step_ns <= 0)
        return q_reply_error(req, API_ERR_BAD_DATA,
                             "invalid parameter \"step\": zero or negative query resolution step widths are not "
                             "accepted. Try a positive integer");
    /* Go: end.Sub(start)/step > 11000, in nanoseconds */
    double span_ns = (double)(end - start) * 1e6;
    if (span_ns >= 9.2e18 ? true : (int64_t)span_ns / step_ns > Q_MAX_POINTS)
        return q_reply_error(req, API_ERR_BAD_DATA,
                             "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the "
                             "query resolution (?step=XX)");
    if (step_ns < 1000000) /* sub-millisecond: the engine counts in ms */
        return q_reply_error(req, API_ERR_BAD_DATA,
                             "invalid parameter \"step\": zero or negative query resolution step widths are not "
                             "accepted. Try a positive integer");
    query_job_t *j = job_new(q, req, JOB_RANGE);
    if (!j)
        return q_reply_oom(req);
    if (q_timeout(q, req, j) != 0 || q_rollups(req, j) != 0)
        return job_free(j);
    j->ast = promql_parse(q_param(req, "query"), err, sizeof(err));
    if (!j->ast) {
        job_free(j);
        return q_reply_error(req, API_ERR_BAD_DATA, "%s", err);
    }
    if (j->ast->root->type != PROMQL_VT_SCALAR && j->ast->root->type != PROMQL_VT_VECTOR) {
        const char *tn = j->ast->root->type == PROMQL_VT_STRING ? "string" : "range vector";
        job_free(j);
        return q_reply_error(req, API_ERR_BAD_DATA,
                             "invalid expression type \"%s\" for range query, must be Scalar or instant Vector", tn);
    }
    j->start = start;
    j->end = end;
    j->step = step_ns / 1000000;
    job_submit(j);
}

/* match[] → j->sels. prefix_errors: series says `invalid parameter "match[]": ...`, labels and
 * label values do not. Replies and returns -1 on error. */
static int q_matchers(api_req_t *req, query_job_t *j, bool prefix_errors)
{
    const char **v;
    size_t n = api_req_params(req, "match[]", &v);
    if (!n)
        return 0;
    j->sels = calloc(n, sizeof(*j->sels));
    if (!j->sels) {
        q_reply_oom(req);
        return -1;
    }
    const char *pre = prefix_errors ? "invalid parameter \"match[]\": " : "";
    for (size_t i = 0; i < n; i++) {
        char err[512];
        if (promql_parse_selector(v[i], &j->sels[i], err, sizeof(err)) != 0) {
            q_reply_error(req, API_ERR_BAD_DATA, "%s%s", pre, err);
            return -1;
        }
        j->nsels++;
        if (promql_selector_all_empty(&j->sels[i])) {
            q_reply_error(req, API_ERR_BAD_DATA, "%smatch[] must contain at least one non-empty matcher", pre);
            return -1;
        }
    }
    return 0;
}

static int q_range_params(api_req_t *req, query_job_t *j)
{
    if (q_time_param(req, "start", Q_MIN_TIME, &j->start) != 0 || q_time_param(req, "end", Q_MAX_TIME, &j->end) != 0)
        return -1;
    return 0;
}

static void h_series(api_req_t *req, void *ud)
{
    api_query_t *q = ud;
    const char **v;
    if (api_req_params(req, "match[]", &v) == 0)
        return q_reply_error(req, API_ERR_BAD_DATA, "no match[] parameter provided");
    query_job_t *j = job_new(q, req, JOB_SERIES);
    if (!j)
        return q_reply_oom(req);
    /* `limit` arrived in later Prometheus versions; 2.42 ignores it, and so do we. */
    if (q_range_params(req, j) != 0 || q_matchers(req, j, true) != 0)
        return job_free(j);
    job_submit(j);
}

static void h_labels(api_req_t *req, void *ud)
{
    api_query_t *q = ud;
    query_job_t *j = job_new(q, req, JOB_LABELS);
    if (!j)
        return q_reply_oom(req);
    if (q_range_params(req, j) != 0 || q_matchers(req, j, false) != 0)
        return job_free(j);
    job_submit(j);
}

static void h_label_values(api_req_t *req, void *ud)
{
    api_query_t *q = ud;
    /* /api/v1/label/<name>/values */
    const char *p = req->path + strlen("/api/v1/label/");
    size_t len = strlen(p);
    if (len < strlen("/values") || strcmp(p + len - strlen("/values"), "/values") != 0) {
        api_reply_text(req, 404, "404 page not found\n");
        return;
    }
    len -= strlen("/values");
    if (memchr(p, '/', len)) {
        api_reply_text(req, 404, "404 page not found\n");
        return;
    }
    query_job_t *j = job_new(q, req, JOB_LABEL_VALUES);
    if (!j)
        return q_reply_oom(req);
    j->label_name = arena_strndup(j->arena, p, len);
    if (!labels_valid_name(j->label_name, len)) {
        buf_t e = BUF_INIT;
        q_json_cstr(&e, j->label_name);
        q_reply_error(req, API_ERR_BAD_DATA, "invalid label name: %s", e.data);
        buf_free(&e);
        return job_free(j);
    }
    if (q_range_params(req, j) != 0 || q_matchers(req, j, false) != 0)
        return job_free(j);
    job_submit(j);
}

static void h_query_exemplars(api_req_t *req, void *ud)
{
    int64_t start, end;
    if (q_time_param(req, "start", Q_MIN_TIME, &start) != 0 || q_time_param(req, "end", Q_MAX_TIME, &end) != 0)
        return;
    if (end < start)
        return q_reply_error(req, API_ERR_BAD_DATA, "end timestamp must not be before start timestamp");
    char err[512];
    promql_ast_t *ast = promql_parse(q_param(req, "query"), err, sizeof(err));
    if (!ast)
        return q_reply_error(req, API_ERR_BAD_DATA, "%s", err);
    promql_ast_free(ast);
    q_reply_success(req, "[]", 2); /* sluice stores no exemplars */
}

static void h_format_query(api_req_t *req, void *ud)
{
    char err[512];
    promql_ast_t *ast = promql_parse(q_param(req, "query"), err, sizeof(err));
    if (!ast)
        return q_reply_error(req, API_ERR_BAD_DATA, "invalid parameter \"query\": %s", err);
    buf_t pretty = BUF_INIT, data = BUF_INIT;
    promql_format_pretty(ast->root, &pretty);
    q_json_str(&data, pretty.data ? pretty.data : "", pretty.len);
    promql_ast_free(ast);
    q_reply_success(req, data.data, data.len);
    buf_free(&pretty);
    buf_free(&data);
}

static void h_config(api_req_t *req, void *ud)
{
    api_query_t *q = ud;
    buf_t data = BUF_INIT;
    buf_puts(&data, "{\"yaml\":");
    q_json_cstr(&data, q->config_yaml);
    buf_putc(&data, '}');
    q_reply_success(req, data.data, data.len);
    buf_free(&data);
}

/* The shared query memory budget (--query.max-memory), which remote reads charge too. */
static void q_metrics(void *ud, buf_t *b)
{
    const arena_budget_t *m = ((api_query_t *)ud)->opt.budget;
    if (!m)
        return;
    buf_printf(b,
               "# HELP sluice_query_memory_bytes Memory held now by running queries and remote reads.\n"
               "# TYPE sluice_query_memory_bytes gauge\nsluice_query_memory_bytes %zu\n"
               "# HELP sluice_query_memory_limit_bytes What they may hold together (--query.max-memory; 0: no limit).\n"
               "# TYPE sluice_query_memory_limit_bytes gauge\nsluice_query_memory_limit_bytes %zu\n"
               "# HELP sluice_query_memory_refused_total Queries and remote reads ended because the others held "
               "the budget.\n"
               "# TYPE sluice_query_memory_refused_total counter\nsluice_query_memory_refused_total %lu\n",
               atomic_load(&m->used), m->limit, atomic_load(&m->refused));
}

void api_query_register_routes(api_query_t *q, api_server_t *srv)
{
    metrics_register("query", q_metrics, q);
    api_route_add(srv, API_GET | API_POST, "/api/v1/query", "query", h_query, q);
    api_route_add(srv, API_GET | API_POST, "/api/v1/query_range", "query_range", h_query_range, q);
    api_route_add(srv, API_GET | API_POST, "/api/v1/series", "series", h_series, q);
    api_route_add(srv, API_GET | API_POST, "/api/v1/labels", "labels", h_labels, q);
    api_route_add(srv, API_GET, "/api/v1/label/*", "label_values", h_label_values, q);
    api_route_add(srv, API_GET | API_POST, "/api/v1/query_exemplars", "query_exemplars", h_query_exemplars, q);
    api_route_add(srv, API_GET | API_POST, "/api/v1/format_query", "format_query", h_format_query, q);
    /* /api/v1/rules and /api/v1/alerts are api/rules.c's */
    api_route_add(srv, API_GET, "/api/v1/status/config", "config", h_config, q);
}
