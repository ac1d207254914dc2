/*
 * testscript — see testscript.h. Two parts: an in-memory store that serves series as XOR chunks
 * through storage/querier.h (so tests exercise the same path as real storage), and the script
 * interpreter.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal/promql/ast.h"
#include "internal/promql/engine.h"
#include "internal/promql/engine_int.h"
#include "internal/promql/lexer.h"
#include "internal/promql/testscript.h"
#include "internal/util/parse.h"
#include "storage/chunk_xor.h"

/* ---- in-memory store ------------------------------------------------------------------------ */

typedef struct {
    labels_t ls; /* owned strings, sorted */
    int64_t *t;
    double *v;
    size_t n, cap;
} mseries_t;

struct promql_memstore {
    mseries_t *s;
    size_t n, cap;
};

promql_memstore_t *promql_memstore_new(void)
{
    promql_memstore_t *m = calloc(1, sizeof(*m));
    if (!m)
        abort();
    return m;
}

void promql_memstore_clear(promql_memstore_t *m)
{
    for (size_t i = 0; i < m->n; i++) {
        for (size_t j = 0; j < m->s[i].ls.n; j++) {
            free((char *)m->s[i].ls.v[j].name);
            free((char *)m->s[i].ls.v[j].value);
        }
        free(m->s[i].ls.v);
        free(m->s[i].t);
        free(m->s[i].v);
    }
    m->n = 0;
}

void promql_memstore_free(promql_memstore_t *m)
{
    if (!m)
        return;
    promql_memstore_clear(m);
    free(m->s);
    free(m);
}

void promql_memstore_add(promql_memstore_t *m, const labels_t *in, int64_t t, double v)
{
    labels_t ls = {malloc((in->n ? in->n : 1) * sizeof(label_t)), in->n};
    if (!ls.v)
        abort();
    memcpy(ls.v, in->v, in->n * sizeof(label_t));
    labels_sort(&ls);
    mseries_t *s = NULL;
    for (size_t i = 0; i < m->n; i++)
        if (labels_equal(&m->s[i].ls, &ls)) {
            s = &m->s[i];
            break;
        }
    if (!s) {
        if (m->n == m->cap) {
            m->cap = m->cap ? m->cap * 2 : 16;
            m->s = realloc(m->s, m->cap * sizeof(*m->s));
            if (!m->s)
                abort();
        }
        s = &m->s[m->n++];
        memset(s, 0, sizeof(*s));
        s->ls.n = ls.n;
        s->ls.v = malloc((ls.n ? ls.n : 1) * sizeof(label_t));
        for (size_t j = 0; j < ls.n; j++) {
            s->ls.v[j].name = strdup(ls.v[j].name);
            s->ls.v[j].value = strdup(ls.v[j].value);
        }
    }
    free(ls.v);
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->t = realloc(s->t, s->cap * sizeof(int64_t));
        s->v = realloc(s->v, s->cap * sizeof(double));
        if (!s->t || !s->v)
            abort();
    }
    size_t pos = s->n;
    while (pos > 0 && s->t[pos - 1] > t)
        pos--;
    if (pos > 0 && s->t[pos - 1] == t) {
        s->v[pos - 1] = v;
        return;
    }
    memmove(s->t + pos + 1, s->t + pos, (s->n - pos) * sizeof(int64_t));
    memmove(s->v + pos + 1, s->v + pos, (s->n - pos) * sizeof(double));
    s->t[pos] = t;
    s->v[pos] = v;
    s->n++;
}

typedef struct {
    querier_set_t base;
    querier_series_t *out;
    size_t n, i;
    chunk_xor_appender_t *apps;
    size_t napps;
    querier_chunk_t *chunks;
} mset_t;

typedef struct {
    querier_t base;
    promql_memstore_t *m;
} mquerier_t;

static const querier_series_t *mset_next(querier_set_t *s)
{
    mset_t *ms = (mset_t *)s;
    return ms->i < ms->n ? &ms->out[ms->i++] : NULL;
}

static const char *mset_error(querier_set_t *s)
{
    (void)s;
    return NULL;
}

static void mset_free(querier_set_t *s)
{
    mset_t *ms = (mset_t *)s;
    for (size_t i = 0; i < ms->napps; i++)
        chunk_xor_appender_free(&ms->apps[i]);
    free(ms->apps);
    free(ms->chunks);
    free(ms->out);
    free(ms);
}

static const querier_set_ops_t mset_ops = {.next = mset_next, .error = mset_error, .free = mset_free};

static int cmp_qseries(const void *a, const void *b)
{
    return labels_compare(&((const querier_series_t *)a)->labels, &((const querier_series_t *)b)->labels);
}

static querier_set_t *mq_select(querier_t *q, const matcher_t *const *ms, size_t nm, int64_t mint, int64_t maxt,
                                const querier_hints_t *hints)
{
    (void)hints;
    promql_memstore_t *m = ((mquerier_t *)q)->m;
    mset_t *set = calloc(1, sizeof(*set));
    if (!set)
        abort();
    set->base.ops = &mset_ops;
    set->out = calloc(m->n ? m->n : 1, sizeof(*set->out));
    size_t total_chunks = 0;
    for (size_t i = 0; i < m->n; i++)
        total_chunks += m->s[i].n / CHUNK_XOR_MAX_SAMPLES + 1;
    set->apps = calloc(total_chunks ? total_chunks : 1, sizeof(*set->apps));
    set->chunks = calloc(total_chunks ? total_chunks : 1, sizeof(*set->chunks));
    if (!set->out || !set->apps || !set->chunks)
        abort();
    for (size_t i = 0; i < m->n; i++) {
        const mseries_t *s = &m->s[i];
        bool ok = true;
        for (size_t k = 0; k < nm && ok; k++) {
            const char *v = labels_get(&s->ls, matcher_name(ms[k]));
            ok = matcher_matches(ms[k], v ? v : "", v ? strlen(v) : 0);
        }
        if (!ok)
            continue;
        size_t first_chunk = set->napps, cnt = 0;
        for (size_t j = 0; j < s->n; j++) {
            if (s->t[j] < mint || s->t[j] > maxt)
                continue;
            if (cnt % CHUNK_XOR_MAX_SAMPLES == 0) {
                chunk_xor_appender_init(&set->apps[set->napps]);
                set->chunks[set->napps].mint = s->t[j];
                set->napps++;
            }
            chunk_xor_append(&set->apps[set->napps - 1], s->t[j], s->v[j]);
            set->chunks[set->napps - 1].maxt = s->t[j];
            cnt++;
        }
        if (cnt == 0)
            continue;
        for (size_t c = first_chunk; c < set->napps; c++)
            set->chunks[c].bytes = chunk_xor_bytes(&set->apps[c], &set->chunks[c].len);
        querier_series_t *o = &set->out[set->n++];
        o->labels = s->ls;
        o->chunks = &set->chunks[first_chunk];
        o->nchunks = set->napps - first_chunk;
    }
    qsort(set->out, set->n, sizeof(*set->out), cmp_qseries);
    return &set->base;
}

static void mq_close(querier_t *q)
{
    free(q);
}

static const querier_ops_t mq_ops = {.select = mq_select, .close = mq_close};

querier_t *promql_memstore_querier(promql_memstore_t *m)
{
    mquerier_t *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->base.ops = &mq_ops;
    q->m = m;
    return &q->base;
}

/* ---- script parsing helpers ----------------------------------------------------------------- */

typedef struct {
    const char *name;
    FILE *log;
    promql_script_stats_t *st;
    promql_memstore_t *store;
    promql_script_hook_t hook; /* promql_script_each_eval */
    void *hook_ctx;
} run_t;

static void logf_(run_t *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void logf_(run_t *r, int line, const char *fmt, ...)
{
    if (!r->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(r->log, "%s:%d: ", r->name, line);
    vfprintf(r->log, fmt, ap);
    fputc('\n', r->log);
    va_end(ap);
}

/* A number as the series notation writes it: [+-] (digits[.digits][e[+-]digits] | Inf | NaN). */
static bool scan_value(const char **pp, double *out)
{
    const char *p = *pp, *st = p;
    if (*p == '+' || *p == '-')
        p++;
    if (strncasecmp(p, "inf", 3) == 0 && !isalnum((unsigned char)p[3])) {
        p += 3;
    } else if (strncasecmp(p, "nan", 3) == 0 && !isalnum((unsigned char)p[3])) {
        p += 3;
    } else {
        const char *d = p;
        while (isdigit((unsigned char)*p))
            p++;
        if (*p == '.') {
            p++;
            while (isdigit((unsigned char)*p))
                p++;
        }
        if (p == d || (p == d + 1 && *d == '.'))
            return false;
        if (*p == 'e' || *p == 'E') {
            const char *e = p + 1;
            if (*e == '+' || *e == '-')
                e++;
            if (isdigit((unsigned char)*e)) {
                while (isdigit((unsigned char)*e))
                    e++;
                p = e;
            }
        }
    }
    char tmp[64];
    size_t n = (size_t)(p - st);
    if (n >= sizeof(tmp))
        return false;
    memcpy(tmp, st, n);
    tmp[n] = 0;
    *out = strtod(tmp, NULL);
    *pp = p;
    return true;
}

typedef struct {
    bool omitted;
    double v;
} seqval_t;

/* Parses "<values>" into vals (malloc'd). Returns count or -1. */
static long parse_values(const char *s, seqval_t **vals)
{
    size_t cap = 16, n = 0;
    seqval_t *v = malloc(cap * sizeof(*v));
    const char *p = s;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            break;
        seqval_t item = {0};
        long reps = 1;
        double step = 0;
        if (*p == '_') {
            p++;
            item.omitted = true;
            if (*p == 'x') {
                p++;
                reps = strtol(p, (char **)&p, 10);
            }
        } else if (strncmp(p, "stale", 5) == 0) {
            p += 5;
            item.v = promql_stale_nan();
        } else {
            if (!scan_value(&p, &item.v))
                goto bad;
            if (*p == '+' || *p == '-') {
                if (!scan_value(&p, &step) || *p != 'x')
                    goto bad;
            }
            if (*p == 'x') {
                p++;
                reps = strtol(p, (char **)&p, 10) + 1;
            }
        }
        if (*p && !isspace((unsigned char)*p))
            goto bad;
        for (long k = 0; k < reps; k++) {
            if (n == cap) {
                cap *= 2;
                v = realloc(v, cap * sizeof(*v));
            }
            v[n++] = item;
            if (!item.omitted)
                item.v += step;
        }
    }
    *vals = v;
    return (long)n;
bad:
    free(v);
    return -1;
}

/* Splits "<metric>{labels} <values>" into labels (arena) and the rest. Returns the values part
 * or NULL. */
static const char *parse_series_desc(arena_t *a, const char *line, labels_t *out)
{
    const char *p = line;
    const char *name_end = p;
    while (*name_end && !isspace((unsigned char)*name_end) && *name_end != '{')
        name_end++;
    size_t cap = 8;
    out->v = arena_alloc(a, cap * sizeof(label_t));
    out->n = 0;
    if (name_end > p)
        out->v[out->n++] = (label_t){LABEL_METRIC_NAME, arena_strndup(a, p, (size_t)(name_end - p))};
    p = name_end;
    if (*p == '{') {
        p++;
        for (;;) {
            while (isspace((unsigned char)*p) || *p == ',')
                p++;
            if (*p == '}') {
                p++;
                break;
            }
            const char *ln = p;
            while (isalnum((unsigned char)*p) || *p == '_')
                p++;
            if (p == ln)
                return NULL;
            char *lname = arena_strndup(a, ln, (size_t)(p - ln));
            while (isspace((unsigned char)*p))
                p++;
            if (*p != '=')
                return NULL;
            p++;
            while (isspace((unsigned char)*p))
                p++;
            char q = *p;
            if (q != '"' && q != '\'')
                return NULL;
            const char *vs = p;
            p++;
            while (*p && *p != q) {
                if (*p == '\\' && p[1])
                    p++;
                p++;
            }
            if (*p != q)
                return NULL;
            p++;
            char err[64];
            char *val = promql__unquote(a, vs, (size_t)(p - vs), err, sizeof(err));
            if (!val)
                return NULL;
            if (out->n == cap) {
                label_t *nv = arena_alloc(a, cap * 2 * sizeof(label_t));
                memcpy(nv, out->v, out->n * sizeof(label_t));
                out->v = nv;
                cap *= 2;
            }
            out->v[out->n++] = (label_t){lname, val};
        }
    }
    labels_sort(out);
    return p;
}

static bool almost_equal(double a, double b)
{
    if (isnan(a) && isnan(b))
        return true;
    if (a == b)
        return true;
    double diff = fabs(a - b);
    const double min_normal = 2.2250738585072014e-308, eps = 1e-6;
    if (a == 0 || b == 0 || diff < min_normal)
        return diff < eps * min_normal;
    return diff / (fabs(a) + fabs(b)) < eps;
}

/* ---- eval blocks ---------------------------------------------------------------------------- */

typedef struct {
    labels_t ls;
    double v;
    bool seen;
} expect_t;

typedef struct {
    int line;
    bool fail, ordered, scalar;
    double scalar_v;
    expect_t *exp;
    size_t nexp;
} evalcmd_t;

static char *labels_fmt(const labels_t *ls)
{
    buf_t b = BUF_INIT;
    buf_putc(&b, '{');
    for (size_t i = 0; i < ls->n; i++)
        buf_printf(&b, "%s%s=\"%s\"", i ? ", " : "", ls->v[i].name, ls->v[i].value);
    buf_putc(&b, '}');
    return buf_steal(&b, NULL);
}

/* Compares an instant-vector result (samples) with the expectations. Returns NULL or a message
 * (malloc'd). */
static char *compare_vector(const evalcmd_t *ev, const promql_sample_t *s, size_t n)
{
    char msg[1024];
    if (ev->scalar) {
        snprintf(msg, sizeof(msg), "expected scalar %g but got a vector", ev->scalar_v);
        return strdup(msg);
    }
    for (size_t e = 0; e < ev->nexp; e++)
        ev->exp[e].seen = false;
    for (size_t i = 0; i < n; i++) {
        size_t e;
        for (e = 0; e < ev->nexp; e++)
            if (labels_equal(&ev->exp[e].ls, &s[i].metric))
                break;
        char *l = labels_fmt(&s[i].metric);
        if (e == ev->nexp) {
            snprintf(msg, sizeof(msg), "unexpected metric %s in result (value %g)", l, s[i].v);
            free(l);
            return strdup(msg);
        }
        if (ev->ordered && e != i) {
            snprintf(msg, sizeof(msg), "expected metric %s at position %zu but was at %zu", l, e + 1, i + 1);
            free(l);
            return strdup(msg);
        }
        if (!almost_equal(ev->exp[e].v, s[i].v)) {
            snprintf(msg, sizeof(msg), "expected %.17g for %s but got %.17g", ev->exp[e].v, l, s[i].v);
            free(l);
            return strdup(msg);
        }
        free(l);
        ev->exp[e].seen = true;
    }
    for (size_t e = 0; e < ev->nexp; e++)
        if (!ev->exp[e].seen) {
            char *l = labels_fmt(&ev->exp[e].ls);
            snprintf(msg, sizeof(msg), "expected metric %s with %g not found", l, ev->exp[e].v);
            free(l);
            return strdup(msg);
        }
    return NULL;
}

static char *compare_scalar(const evalcmd_t *ev, double v)
{
    char msg[256];
    if (!ev->scalar) {
        snprintf(msg, sizeof(msg), "expected a vector but got scalar %g", v);
        return strdup(msg);
    }
    if (!almost_equal(ev->scalar_v, v)) {
        snprintf(msg, sizeof(msg), "expected scalar %.17g but got %.17g", ev->scalar_v, v);
        return strdup(msg);
    }
    return NULL;
}

/* Runs one variant (query text at time t). Returns NULL or an error message (malloc'd). */
static char *run_variant(run_t *r, const evalcmd_t *ev, const char *query, int64_t t)
{
    char err[512], msg[1024];
    promql_ast_t *ast = promql_parse(query, err, sizeof(err));
    if (!ast) {
        snprintf(msg, sizeof(msg), "parse error in %s: %s", query, err);
        return strdup(msg);
    }
    querier_t *q = promql_memstore_querier(r->store);
    promql_opts_t opts = {0};
    char *res_msg = NULL;
    promql_result_t *res = promql_exec_instant(q, ast, t, &opts);
    if (res->err_kind != PROMQL_ERR_NONE) {
        if (!ev->fail) {
            snprintf(msg, sizeof(msg), "error evaluating %s at %lld: %s", query, (long long)t, res->err);
            res_msg = strdup(msg);
        }
        goto out;
    }
    if (ev->fail) {
        snprintf(msg, sizeof(msg), "expected error evaluating %s but got none", query);
        res_msg = strdup(msg);
        goto out;
    }
    bool was_scalar = false;
    switch (res->value.type) {
    case PROMQL_VT_VECTOR: res_msg = compare_vector(ev, res->value.samples, res->value.nsamples); break;
    case PROMQL_VT_SCALAR:
        was_scalar = true;
        res_msg = compare_scalar(ev, res->value.scalar);
        break;
    case PROMQL_VT_MATRIX: res_msg = strdup("received range result on instant evaluation"); break;
    default: res_msg = strdup("unexpected string result"); break;
    }
    if (res_msg) {
        char *m2 = malloc(strlen(res_msg) + strlen(query) + 64);
        sprintf(m2, "%s: %s", query, res_msg);
        free(res_msg);
        res_msg = m2;
        goto out;
    }
    /* the same query as a range query, middle step */
    promql_result_free(res);
    res = promql_exec_range(q, ast, t - 60000, t + 60000, 60000, &opts);
    if (res->err_kind != PROMQL_ERR_NONE) {
        snprintf(msg, sizeof(msg), "error evaluating %s in range mode: %s", query, res->err);
        res_msg = strdup(msg);
        goto out;
    }
    if (ev->ordered)
        goto out;
    size_t cnt = 0;
    promql_sample_t *vec = calloc(res->value.nseries + 1, sizeof(*vec));
    for (size_t i = 0; i < res->value.nseries; i++) {
        const promql_series_t *s = &res->value.series[i];
        for (size_t j = 0; j < s->npoints; j++)
            if (s->points[j].t == t) {
                vec[cnt++] = (promql_sample_t){s->metric, t, s->points[j].v};
                break;
            }
    }
    if (was_scalar)
        res_msg = cnt ? compare_scalar(ev, vec[0].v) : strdup("range mode: no scalar value");
    else
        res_msg = compare_vector(ev, vec, cnt);
    free(vec);
    if (res_msg) {
        char *m2 = malloc(strlen(res_msg) + strlen(query) + 64);
        sprintf(m2, "%s (range mode): %s", query, res_msg);
        free(res_msg);
        res_msg = m2;
    }
out:
    promql_result_free(res);
    querier_close(q);
    promql_ast_free(ast);
    return res_msg;
}

static const char *const at_unsafe[] = {"days_in_month",  "day_of_month", "day_of_week", "day_of_year",
                                        "hour",           "minute",       "month",       "year",
                                        "predict_linear", "time",         "timestamp"};

static bool has_unsafe(const promql_expr_t *e)
{
    switch (e->kind) {
    case PROMQL_NODE_CALL:
        for (size_t i = 0; i < sizeof(at_unsafe) / sizeof(at_unsafe[0]); i++)
            if (strcmp(e->u.call.func->name, at_unsafe[i]) == 0)
                return true;
        for (size_t i = 0; i < e->u.call.nargs; i++)
            if (has_unsafe(e->u.call.args[i]))
                return true;
        return false;
    case PROMQL_NODE_SUBQUERY: return has_unsafe(e->u.subq.expr);
    case PROMQL_NODE_PAREN: return has_unsafe(e->u.paren.expr);
    case PROMQL_NODE_UNARY: return has_unsafe(e->u.unary.expr);
    case PROMQL_NODE_BINARY: return has_unsafe(e->u.bin.lhs) || has_unsafe(e->u.bin.rhs);
    case PROMQL_NODE_AGG: return (e->u.agg.param && has_unsafe(e->u.agg.param)) || has_unsafe(e->u.agg.expr);
    default: return false;
    }
}

/* Pins `@ ts` on every selector and outermost subquery that has no @ (Prometheus'
 * atModifierTestCases); does not descend into subqueries. */
static void pin_at(promql_expr_t *e, int64_t ts)
{
    switch (e->kind) {
    case PROMQL_NODE_VECTOR_SEL:
    case PROMQL_NODE_MATRIX_SEL:
        if (e->u.sel.at == PROMQL_AT_NONE) {
            e->u.sel.at = PROMQL_AT_TS;
            e->u.sel.at_ms = ts;
        }
        return;
    case PROMQL_NODE_SUBQUERY:
        if (e->u.subq.at == PROMQL_AT_NONE) {
            e->u.subq.at = PROMQL_AT_TS;
            e->u.subq.at_ms = ts;
        }
        return;
    case PROMQL_NODE_PAREN: pin_at(e->u.paren.expr, ts); return;
    case PROMQL_NODE_UNARY: pin_at(e->u.unary.expr, ts); return;
    case PROMQL_NODE_BINARY:
        pin_at(e->u.bin.lhs, ts);
        pin_at(e->u.bin.rhs, ts);
        return;
    case PROMQL_NODE_AGG:
        if (e->u.agg.param)
            pin_at(e->u.agg.param, ts);
        pin_at(e->u.agg.expr, ts);
        return;
    case PROMQL_NODE_CALL:
        for (size_t i = 0; i < e->u.call.nargs; i++)
            pin_at(e->u.call.args[i], ts);
        return;
    default: return;
    }
}

static void run_eval(run_t *r, const evalcmd_t *ev, const char *query, int64_t t)
{
    r->st->evals++;
    char *m = run_variant(r, ev, query, t);
    if (!m) {
        char err[256];
        promql_ast_t *ast = promql_parse(query, err, sizeof(err));
        if (ast && !has_unsafe(ast->root)) {
            pin_at(ast->root, t);
            buf_t b = BUF_INIT;
            promql_format_expr(ast->root, &b);
            int64_t times[5] = {-10 * t, 0, t / 5, t, 10 * t};
            size_t nt = 5;
            if (t == 0) {
                times[0] = -1000;
                times[1] = 0;
                times[2] = 1000;
                nt = 3;
            }
            for (size_t i = 0; i < nt && !m; i++)
                m = run_variant(r, ev, b.data, times[i]);
            if (m) {
                char *m2 = malloc(strlen(m) + 64);
                sprintf(m2, "@ variant: %s", m);
                free(m);
                m = m2;
            }
            buf_free(&b);
        }
        promql_ast_free(ast);
    }
    if (m) {
        r->st->failed++;
        logf_(r, ev->line, "%s", m);
        free(m);
    } else {
        r->st->passed++;
    }
}

/* ---- the interpreter ------------------------------------------------------------------------ */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

static int script_run(const char *name, const char *text, FILE *log, promql_script_stats_t *st,
                      promql_script_hook_t hook, void *hook_ctx)
{
    run_t r = {name, log, st, promql_memstore_new(), hook, hook_ctx};
    char *copy = strdup(text);
    size_t nl = 1;
    for (char *p = copy; *p; p++)
        if (*p == '\n')
            nl++;
    char **lines = calloc(nl + 1, sizeof(char *));
    size_t n = 0;
    for (char *p = copy, *s = copy;; p++) {
        if (*p == '\n' || *p == 0) {
            bool end = *p == 0;
            *p = 0;
            char *t = trim(s);
            if (t[0] == '#')
                t[0] = 0;
            lines[n++] = t;
            s = p + 1;
            if (end)
                break;
        }
    }
    int rc = 0;
    arena_t *a = arena_create(0);
    for (size_t i = 0; i < n; i++) {
        char *l = lines[i];
        int lineno = (int)i + 1;
        if (!*l)
            continue;
        if (strcmp(l, "clear") == 0) {
            promql_memstore_clear(r.store);
        } else if (strncmp(l, "load ", 5) == 0) {
            int64_t step;
            if (parse_duration_ms(trim(l + 5), &step) != 0) {
                logf_(&r, lineno, "bad load step");
                rc = -1;
                break;
            }
            while (i + 1 < n && lines[i + 1][0]) {
                i++;
                labels_t ls;
                const char *vals = parse_series_desc(a, lines[i], &ls);
                seqval_t *sv;
                long nv = vals ? parse_values(vals, &sv) : -1;
                if (nv < 0) {
                    logf_(&r, (int)i + 1, "bad series line: %s", lines[i]);
                    rc = -1;
                    continue;
                }
                for (long k = 0; k < nv; k++)
                    if (!sv[k].omitted)
                        promql_memstore_add(r.store, &ls, k * step, sv[k].v);
                free(sv);
            }
        } else if (strncmp(l, "eval", 4) == 0) {
            evalcmd_t ev = {.line = lineno};
            char *p = l + 4;
            if (strncmp(p, "_fail", 5) == 0) {
                ev.fail = true;
                p += 5;
            } else if (strncmp(p, "_ordered", 8) == 0) {
                ev.ordered = true;
                p += 8;
            }
            p = trim(p);
            if (strncmp(p, "instant", 7) != 0) {
                logf_(&r, lineno, "only instant evals are supported");
                rc = -1;
                continue;
            }
            p = trim(p + 7);
            if (strncmp(p, "at ", 3) != 0) {
                logf_(&r, lineno, "expected 'at'");
                rc = -1;
                continue;
            }
            p = trim(p + 3);
            char *sp = p;
            while (*sp && !isspace((unsigned char)*sp))
                sp++;
            char save = *sp;
            *sp = 0;
            int64_t t;
            if (parse_duration_ms(p, &t) != 0) {
                logf_(&r, lineno, "bad eval time %s", p);
                rc = -1;
                continue;
            }
            *sp = save;
            const char *query = trim(sp);
            size_t cap = 8;
            ev.exp = arena_alloc(a, cap * sizeof(expect_t));
            bool bad = false;
            while (i + 1 < n && lines[i + 1][0]) {
                i++;
                const char *x = lines[i];
                double v;
                const char *xp = x;
                if (scan_value(&xp, &v) && *xp == 0) {
                    ev.scalar = true;
                    ev.scalar_v = v;
                    continue;
                }
                labels_t ls;
                const char *vals = parse_series_desc(a, x, &ls);
                seqval_t *sv;
                long nv = vals ? parse_values(vals, &sv) : -1;
                if (nv < 1) {
                    logf_(&r, (int)i + 1, "bad expectation: %s", x);
                    bad = true;
                    if (nv == 0)
                        free(sv);
                    continue;
                }
                if (ev.nexp == cap) {
                    expect_t *ne = arena_alloc(a, cap * 2 * sizeof(expect_t));
                    memcpy(ne, ev.exp, ev.nexp * sizeof(expect_t));
                    ev.exp = ne;
                    cap *= 2;
                }
                ev.exp[ev.nexp++] = (expect_t){ls, sv[0].v, false};
                free(sv);
            }
            if (bad) {
                st->evals++;
                st->failed++;
                continue;
            }
            if (r.hook) {
                querier_t *q = promql_memstore_querier(r.store);
                r.hook(r.hook_ctx, q, query, t, ev.line);
                querier_close(q);
                st->evals++;
                continue;
            }
            run_eval(&r, &ev, query, t);
        } else {
            logf_(&r, lineno, "unknown command: %s", l);
            rc = -1;
        }
    }
    arena_destroy(a);
    free(lines);
    free(copy);
    promql_memstore_free(r.store);
    return rc;
}

int promql_script_run(const char *name, const char *text, FILE *log, promql_script_stats_t *st)
{
    return script_run(name, text, log, st, NULL, NULL);
}

static int script_run_file(const char *path, FILE *log, promql_script_stats_t *st, promql_script_hook_t hook,
                           void *hook_ctx)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (log)
            fprintf(log, "%s: cannot open\n", path);
        return -1;
    }
    buf_t b = BUF_INIT;
    char tmp[65536];
    size_t k;
    while ((k = fread(tmp, 1, sizeof(tmp), f)) > 0)
        buf_append(&b, tmp, k);
    fclose(f);
    buf_putc(&b, 0);
    const char *base = strrchr(path, '/');
    int rc = script_run(base ? base + 1 : path, b.data, log, st, hook, hook_ctx);
    buf_free(&b);
    return rc;
}

int promql_script_run_file(const char *path, FILE *log, promql_script_stats_t *st)
{
    return script_run_file(path, log, st, NULL, NULL);
}

int promql_script_each_eval(const char *path, FILE *log, promql_script_hook_t hook, void *ctx)
{
    promql_script_stats_t st = {0};
    return script_run_file(path, log, &st, hook, ctx);
}
