/*
 * rules — the rule manager and evaluator; see rules.h for the timing, the alert state machine
 * and the series written.
 *
 * Locking: one mutex (mu) guards the group list and every rule's state. The evaluation thread
 * marks itself busy, drops mu while PromQL runs and while it appends to storage, and takes it
 * again to update a rule's state; a reload waits until the evaluator is not busy before swapping
 * the group list, so the group being evaluated is never freed under it. API readers take mu
 * briefly and render JSON from the state.
 */
#include "internal/rules/rules.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "internal/labels/matcher.h"
#include "internal/promql/engine.h"
#include "internal/rules/rulefile.h"
#include "internal/rules/template.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"

#define RL_RESOLVED_RETENTION_MS (15 * 60 * 1000)

typedef enum { RL_INACTIVE = 0, RL_PENDING = 1, RL_FIRING = 2 } rl_state_t;
typedef enum { RL_HEALTH_UNKNOWN = 0, RL_HEALTH_OK, RL_HEALTH_ERR } rl_health_t;

static const char *rl_state_name(rl_state_t s)
{
    return s == RL_FIRING ? "firing" : s == RL_PENDING ? "pending" : "inactive";
}

typedef struct {
    uint64_t hash;
    labels_t labels;      /* owned, sorted; alertname included */
    labels_t annotations; /* owned, sorted */
    rl_state_t state;
    double value;
    int64_t active_at, fired_at, resolved_at, last_sent_at, valid_until, keep_firing_since;
} rl_alert_t;

typedef struct {
    uint64_t hash;
    labels_t labels; /* owned */
} rl_series_t;

typedef struct {
    const rules_rule_def_t *def;
    char *query; /* canonical expression */
    rl_health_t health;
    char *last_error;
    int64_t last_eval_wall_ms;
    double eval_seconds;
    rl_alert_t *alerts;
    size_t nalerts, capalerts;
    rl_series_t *prev;
    size_t nprev;
    bool restored;
} rl_rule_t;

typedef struct {
    const rules_group_def_t *def;
    rl_rule_t *rules;
    size_t nrules;
    int64_t interval_ms;
    int64_t next_ns;
    int64_t last_eval_wall_ms;
    double eval_seconds, last_eval_seconds;
    int evals;
    bool should_restore;
    uint64_t iterations, missed;
} rl_group_t;

struct rules_manager {
    rules_options_t o;
    labels_t external_labels;
    char *external_url;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* wakes the evaluator (reload, stop) */
    pthread_cond_t idle_cv; /* the evaluator finished a group */
    bool busy;
    bool stop;
    bool started, loaded_once;
    pthread_t thread;
    rules_file_t files;
    rl_group_t *groups;
    size_t ngroups;
    char **patterns;
    size_t npatterns;
    bool last_reload_ok;
    int64_t last_reload_ms;
    /* metrics */
    uint64_t evaluations, eval_failures, missed_total, reloads, reload_failures;
    double eval_seconds_sum;
    uint64_t samples_written, append_failures;
};

/* --- small helpers ------------------------------------------------------------------------------- */

void rules_format_time(int64_t ms, buf_t *out)
{
    if (ms == 0) {
        buf_puts(out, "0001-01-01T00:00:00Z");
        return;
    }
    int64_t s = ms / 1000, frac = ms % 1000;
    if (frac < 0) {
        frac += 1000;
        s--;
    }
    time_t tt = (time_t)s;
    struct tm tm;
    gmtime_r(&tt, &tm);
    buf_printf(out, "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
               tm.tm_min, tm.tm_sec);
    if (frac) {
        char f[8];
        snprintf(f, sizeof(f), "%03d", (int)frac);
        size_t l = 3;
        while (l > 0 && f[l - 1] == '0')
            f[--l] = 0;
        buf_printf(out, ".%s", f);
    }
    buf_putc(out, 'Z');
}

/* labels.Labels.Hash() of Prometheus 2.42: xxhash64 over name 0xff value 0xff ... */
static uint64_t rl_prom_hash(const labels_t *ls)
{
    buf_t b = BUF_INIT;
    for (size_t i = 0; i < ls->n; i++) {
        buf_puts(&b, ls->v[i].name);
        buf_putc(&b, (char)0xff);
        buf_puts(&b, ls->v[i].value);
        buf_putc(&b, (char)0xff);
    }
    uint64_t h = XXH64(b.data ? b.data : "", b.len, 0);
    buf_free(&b);
    return h;
}

int64_t rules_group_eval_timestamp_ns(const char *name, const char *file, int64_t interval_ms, int64_t now_ns)
{
    label_t lv[2] = {{"file", file}, {"name", name}};
    labels_t ls = {lv, 2};
    int64_t iv = interval_ms * 1000000LL;
    int64_t offset = (int64_t)(rl_prom_hash(&ls) % (uint64_t)iv);
    int64_t adj = now_ns - offset;
    int64_t base = adj - (adj % iv);
    return base + offset;
}

static void rl_set_error(rl_rule_t *r, const char *msg)
{
    free(r->last_error);
    r->last_error = msg ? strdup(msg) : NULL;
    r->health = msg ? RL_HEALTH_ERR : RL_HEALTH_OK;
}

static void rl_series_free(rl_series_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        rules_labels_free(&s[i].labels);
    free(s);
}

static void rl_alert_free(rl_alert_t *a)
{
    rules_labels_free(&a->labels);
    rules_labels_free(&a->annotations);
}

/* The alert invariants (rules.h). */
__attribute__((unused)) /* only in assert(), compiled out with NDEBUG */
static bool
rl_alert_check(const rl_alert_t *a)
{
    switch (a->state) {
    case RL_PENDING: return a->resolved_at == 0 && a->fired_at == 0;
    case RL_FIRING: return a->resolved_at == 0 && a->fired_at >= a->active_at;
    case RL_INACTIVE: return a->resolved_at != 0;
    }
    return false;
}

static void rl_rule_free(rl_rule_t *r)
{
    free(r->query);
    free(r->last_error);
    for (size_t i = 0; i < r->nalerts; i++)
        rl_alert_free(&r->alerts[i]);
    free(r->alerts);
    rl_series_free(r->prev, r->nprev);
}

static void rl_groups_free(rl_group_t *g, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < g[i].nrules; j++)
            rl_rule_free(&g[i].rules[j]);
        free(g[i].rules);
    }
    free(g);
}

/* A label set being built: owned copies of names/values, set/delete like labels.Builder. */
typedef struct {
    label_t *v;
    size_t n, cap;
} rl_lb_t;

static void rl_lb_set(rl_lb_t *b, const char *name, const char *value)
{
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->v[i].name, name) == 0) {
            free((char *)b->v[i].value);
            if (!value[0]) { /* an empty value deletes */
                free((char *)b->v[i].name);
                b->v[i] = b->v[--b->n];
            } else {
                b->v[i].value = strdup(value);
            }
            return;
        }
    if (!value[0])
        return;
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 8;
        b->v = realloc(b->v, b->cap * sizeof(*b->v));
        if (!b->v)
            abort();
    }
    b->v[b->n].name = strdup(name);
    b->v[b->n].value = strdup(value);
    b->n++;
}

static labels_t rl_lb_finish(rl_lb_t *b)
{
    labels_t ls = {b->v, b->n};
    labels_sort(&ls);
    return ls;
}

/* --- evaluation ------------------------------------------------------------------------------------- */

typedef struct {
    storage_sample_t *v;
    size_t n, cap;
    arena_t *a; /* label arrays of the samples */
} rl_out_t;

static void rl_out_add(rl_out_t *o, const labels_t *ls, int64_t t, double v)
{
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 64;
        o->v = realloc(o->v, o->cap * sizeof(*o->v));
        if (!o->v)
            abort();
    }
    label_t *lv = arena_alloc(o->a, (ls->n ? ls->n : 1) * sizeof(*lv));
    for (size_t i = 0; i < ls->n; i++) {
        lv[i].name = arena_strdup(o->a, ls->v[i].name);
        lv[i].value = arena_strdup(o->a, ls->v[i].value);
    }
    o->v[o->n].labels = (labels_t){lv, ls->n};
    o->v[o->n].t = t;
    o->v[o->n].v = v;
    o->n++;
}

/* Labels of ALERTS / ALERTS_FOR_STATE for an alert, in arena a. */
static labels_t rl_alert_series_labels(arena_t *a, const rl_alert_t *al, const char *metric, const char *state)
{
    label_t *lv = arena_alloc(a, (al->labels.n + 2) * sizeof(*lv));
    size_t n = 0;
    for (size_t i = 0; i < al->labels.n; i++)
        lv[n++] = al->labels.v[i];
    lv[n++] = (label_t){LABEL_METRIC_NAME, metric};
    if (state)
        lv[n++] = (label_t){"alertstate", state};
    labels_t ls = {lv, n};
    labels_sort(&ls);
    return ls;
}

static void rl_url_escape(buf_t *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
            c == '.' || c == '~')
            buf_putc(b, (char)c);
        else if (c == ' ')
            buf_putc(b, '+');
        else
            buf_printf(b, "%%%02X", c);
    }
}

/* Runs the query at ts. On success the samples (vector, or a scalar as one unlabelled sample)
 * are returned in *out and *n (valid until promql_result_free). NULL result + err on failure. */
static promql_result_t *rl_query_eval(rules_manager_t *m, const rl_rule_t *r, int64_t ts, promql_sample_t **out,
                                      size_t *n, promql_sample_t *scalar_tmp, char *err, size_t errlen)
{
    querier_t *q = storage_querier(m->o.storage);
    if (!q) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    promql_opts_t po = {.lookback_ms = m->o.lookback_ms,
                        .timeout_ms = m->o.query_timeout_ms,
                        .max_samples = m->o.max_samples,
                        .max_memory = m->o.max_memory};
    promql_result_t *res = promql_exec_instant(q, r->def->ast, ts, &po);
    querier_close(q);
    if (res->err_kind != PROMQL_ERR_NONE) {
        snprintf(err, errlen, "%s", res->err);
        promql_result_free(res);
        return NULL;
    }
    if (res->value.type == PROMQL_VT_VECTOR) {
        *out = res->value.samples;
        *n = res->value.nsamples;
    } else if (res->value.type == PROMQL_VT_SCALAR) {
        scalar_tmp->metric = (labels_t){NULL, 0};
        scalar_tmp->t = ts;
        scalar_tmp->v = res->value.scalar;
        *out = scalar_tmp;
        *n = 1;
    } else {
        snprintf(err, errlen, "rule result is not a vector or scalar");
        promql_result_free(res);
        return NULL;
    }
    return res;
}

/* Evaluates r at ts. On failure records the error on the rule, sets *failed and returns NULL. */
static promql_result_t *rl_query(rules_manager_t *m, rl_rule_t *r, int64_t ts, promql_sample_t **out, size_t *n,
                                 promql_sample_t *scalar_tmp, bool *failed)
{
    char err[600];
    promql_result_t *res = rl_query_eval(m, r, ts, out, n, scalar_tmp, err, sizeof(err));
    if (!res) {
        pthread_mutex_lock(&m->mu);
        rl_set_error(r, err);
        pthread_mutex_unlock(&m->mu);
        *failed = true;
    }
    return res;
}

static int rl_cmp_hash(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Appends out to storage, plus staleness markers for r->prev series missing from out, and makes
 * out's series the new prev. Called without mu (storage may block briefly). */
static void rl_commit(rules_manager_t *m, rl_rule_t *r, rl_out_t *o, int64_t ts, rl_series_t **newprev, size_t *nnew)
{
    size_t nreal = o->n;
    uint64_t *hs = malloc((nreal ? nreal : 1) * sizeof(*hs));
    rl_series_t *np = calloc(nreal ? nreal : 1, sizeof(*np));
    if (!hs || !np)
        abort();
    for (size_t i = 0; i < nreal; i++) {
        labels_t ls = o->v[i].labels;
        labels_sort(&ls);
        np[i].hash = hs[i] = labels_hash(&ls);
        rules_labels_dup(&np[i].labels, &ls);
    }
    qsort(hs, nreal, sizeof(*hs), rl_cmp_hash);
    for (size_t i = 0; i < r->nprev; i++)
        if (!bsearch(&r->prev[i].hash, hs, nreal, sizeof(*hs), rl_cmp_hash))
            rl_out_add(o, &r->prev[i].labels, ts, promql_stale_nan());
    free(hs);
    if (o->n) {
        storage_append_result_t res;
        int rc = storage_append(m->o.storage, o->v, o->n, &res);
        __atomic_add_fetch(&m->samples_written, res.accepted, __ATOMIC_RELAXED);
        if (rc != STORAGE_OK) {
            __atomic_add_fetch(&m->append_failures, res.failed, __ATOMIC_RELAXED);
            log_warn("rules", "rule evaluation result not fully stored", LF_S("rule", r->def->name),
                     LF_I("failed", (int64_t)res.failed), LF_S("err", res.msg));
        }
    }
    *newprev = np;
    *nnew = nreal;
}

static void rl_eval_recording(rules_manager_t *m, rl_group_t *g, rl_rule_t *r, int64_t ts, bool *failed)
{
    promql_sample_t *smp, stmp;
    size_t n;
    promql_result_t *res = rl_query(m, r, ts, &smp, &n, &stmp, failed);
    if (!res)
        return;
    rl_out_t o = {.a = arena_create(0)};
    const char *msg = NULL;
    char ebuf[160];
    uint64_t *hs = malloc((n ? n : 1) * sizeof(*hs));
    for (size_t i = 0; i < n; i++) {
        rl_lb_t b = {0};
        for (size_t k = 0; k < smp[i].metric.n; k++)
            rl_lb_set(&b, smp[i].metric.v[k].name, smp[i].metric.v[k].value);
        rl_lb_set(&b, LABEL_METRIC_NAME, r->def->name);
        for (size_t k = 0; k < r->def->labels.n; k++)
            rl_lb_set(&b, r->def->labels.v[k].name, r->def->labels.v[k].value);
        labels_t ls = rl_lb_finish(&b);
        hs[i] = labels_hash(&ls);
        rl_out_add(&o, &ls, ts, smp[i].v);
        rules_labels_free(&ls);
    }
    qsort(hs, n, sizeof(*hs), rl_cmp_hash);
    for (size_t i = 1; i < n && !msg; i++)
        if (hs[i] == hs[i - 1])
            msg = "vector contains metrics with the same labelset after applying rule labels";
    free(hs);
    if (!msg && g->def->limit > 0 && (int64_t)n > g->def->limit) {
        snprintf(ebuf, sizeof(ebuf), "exceeded limit %lld with %zu series", (long long)g->def->limit, n);
        msg = ebuf;
    }
    promql_result_free(res);
    if (msg) {
        /* Prometheus writes nothing for the rule then (and no staleness markers either) */
        pthread_mutex_lock(&m->mu);
        rl_set_error(r, msg);
        pthread_mutex_unlock(&m->mu);
        *failed = true;
    } else {
        rl_series_t *np;
        size_t nn;
        rl_commit(m, r, &o, ts, &np, &nn);
        pthread_mutex_lock(&m->mu);
        rl_series_free(r->prev, r->nprev);
        r->prev = np;
        r->nprev = nn;
        rl_set_error(r, NULL);
        pthread_mutex_unlock(&m->mu);
    }
    free(o.v);
    arena_destroy(o.a);
}

static void rl_expand(rules_manager_t *m, const char *tname, const labels_t *tmpl, const labels_t *metric, double v,
                      rl_lb_t *into)
{
    rules_tmpl_data_t d = {
        .labels = metric, .external_labels = &m->external_labels, .external_url = m->external_url, .value = v};
    for (size_t k = 0; k < tmpl->n; k++) {
        buf_t b = BUF_INIT;
        rules_tmpl_expand(tname, tmpl->v[k].value, &d, &b);
        rl_lb_set(into, tmpl->v[k].name, b.data ? b.data : "");
        buf_free(&b);
    }
}

typedef struct {
    rules_alert_note_t *v;
    size_t n, cap;
    bool *firing; /* for transitions */
} rl_notes_t;

static void rl_note_add(rl_notes_t *ns, const rl_alert_t *a, const char *rule, const char *group, const char *url,
                        bool firing)
{
    if (ns->n == ns->cap) {
        ns->cap = ns->cap ? ns->cap * 2 : 8;
        ns->v = realloc(ns->v, ns->cap * sizeof(*ns->v));
        ns->firing = realloc(ns->firing, ns->cap * sizeof(*ns->firing));
        if (!ns->v || !ns->firing)
            abort();
    }
    /* hooks get private copies: the state may change once mu is dropped */
    labels_t *l = malloc(2 * sizeof(*l));
    if (!l)
        abort();
    rules_labels_dup(&l[0], &a->labels);
    rules_labels_dup(&l[1], &a->annotations);
    ns->v[ns->n] = (rules_alert_note_t){.alertname = rule,
                                        .group = group,
                                        .labels = &l[0],
                                        .annotations = &l[1],
                                        .value = a->value,
                                        .active_at_ms = a->active_at,
                                        .starts_at_ms = a->fired_at,
                                        .ends_at_ms = a->resolved_at ? a->resolved_at : a->valid_until,
                                        .resolved = a->resolved_at != 0,
                                        .generator_url = url};
    ns->firing[ns->n] = firing;
    ns->n++;
}

static void rl_notes_free(rl_notes_t *ns)
{
    for (size_t i = 0; i < ns->n; i++) {
        labels_t *l = (labels_t *)ns->v[i].labels;
        rules_labels_free(&l[0]);
        rules_labels_free(&l[1]);
        free(l);
    }
    free(ns->v);
    free(ns->firing);
}

static rl_alert_t *rl_find_alert(rl_rule_t *r, uint64_t h)
{
    for (size_t i = 0; i < r->nalerts; i++)
        if (r->alerts[i].hash == h)
            return &r->alerts[i];
    return NULL;
}

static void rl_eval_alerting(rules_manager_t *m, rl_group_t *g, rl_rule_t *r, int64_t ts, bool *failed)
{
    promql_sample_t *smp, stmp;
    size_t n;
    promql_result_t *res = rl_query(m, r, ts, &smp, &n, &stmp, failed);
    if (!res)
        return;
    char tname[300];
    snprintf(tname, sizeof(tname), "__alert_%s", r->def->name);
    uint64_t *cur = malloc((n ? n : 1) * sizeof(*cur));
    if (!cur)
        abort();
    /* New alert candidates from the result (templates expanded without the lock). */
    rl_alert_t *cand = calloc(n ? n : 1, sizeof(*cand));
    const char *msg = NULL;
    for (size_t i = 0; i < n; i++) {
        rl_lb_t lb = {0}, ab = {0};
        for (size_t k = 0; k < smp[i].metric.n; k++)
            if (strcmp(smp[i].metric.v[k].name, LABEL_METRIC_NAME) != 0)
                rl_lb_set(&lb, smp[i].metric.v[k].name, smp[i].metric.v[k].value);
        rl_expand(m, tname, &r->def->labels, &smp[i].metric, smp[i].v, &lb);
        rl_lb_set(&lb, "alertname", r->def->name);
        rl_expand(m, tname, &r->def->annotations, &smp[i].metric, smp[i].v, &ab);
        cand[i].labels = rl_lb_finish(&lb);
        cand[i].annotations = rl_lb_finish(&ab);
        cand[i].hash = cur[i] = labels_hash(&cand[i].labels);
        cand[i].value = smp[i].v;
        for (size_t j = 0; j < i && !msg; j++)
            if (cand[j].hash == cand[i].hash)
                msg = "vector contains metrics with the same labelset after applying alert labels";
    }
    promql_result_free(res);
    if (msg) {
        for (size_t i = 0; i < n; i++)
            rl_alert_free(&cand[i]);
        free(cand);
        free(cur);
        pthread_mutex_lock(&m->mu);
        rl_set_error(r, msg);
        pthread_mutex_unlock(&m->mu);
        *failed = true;
        return;
    }
    qsort(cur, n, sizeof(*cur), rl_cmp_hash);

    rl_notes_t notes = {0}, trans = {0};
    buf_t url = BUF_INIT;
    buf_puts(&url, m->external_url);
    buf_puts(&url, "/graph?g0.expr=");
    rl_url_escape(&url, r->query);
    buf_puts(&url, "&g0.tab=1");
    int64_t delta = m->o.resend_delay_ms > g->interval_ms ? m->o.resend_delay_ms : g->interval_ms;

    pthread_mutex_lock(&m->mu);
    /* merge: an alert already active keeps its state (value and annotations refresh) */
    for (size_t i = 0; i < n; i++) {
        rl_alert_t *a = rl_find_alert(r, cand[i].hash);
        if (a && a->state != RL_INACTIVE) {
            a->value = cand[i].value;
            rules_labels_free(&a->annotations);
            a->annotations = cand[i].annotations;
            cand[i].annotations = (labels_t){0};
            a->keep_firing_since = 0;
            rl_alert_free(&cand[i]);
            continue;
        }
        if (a) { /* a resolved alert comes back: a new pending alert replaces it */
            rl_alert_free(a);
        } else {
            if (r->nalerts == r->capalerts) {
                r->capalerts = r->capalerts ? r->capalerts * 2 : 8;
                r->alerts = realloc(r->alerts, r->capalerts * sizeof(*r->alerts));
                if (!r->alerts)
                    abort();
            }
            a = &r->alerts[r->nalerts++];
        }
        *a = cand[i];
        a->state = RL_PENDING;
        a->active_at = ts;
        a->fired_at = a->resolved_at = a->last_sent_at = a->valid_until = a->keep_firing_since = 0;
    }
    free(cand);

    /* every known alert: absent ones resolve (or go), pending ones may fire */
    rl_out_t o = {.a = arena_create(0)};
    for (size_t i = 0; i < r->nalerts;) {
        rl_alert_t *a = &r->alerts[i];
        bool present = bsearch(&a->hash, cur, n, sizeof(*cur), rl_cmp_hash) != NULL;
        if (!present) {
            bool keep = false;
            if (r->def->keep_firing_for_ms > 0 && a->state == RL_FIRING) {
                if (a->keep_firing_since == 0)
                    a->keep_firing_since = ts;
                keep = ts - a->keep_firing_since < r->def->keep_firing_for_ms;
            }
            if (!keep) {
                if (a->state == RL_PENDING || (a->resolved_at != 0 && ts - a->resolved_at > RL_RESOLVED_RETENTION_MS)) {
                    rl_alert_free(a);
                    r->alerts[i] = r->alerts[--r->nalerts];
                    continue;
                }
                if (a->state != RL_INACTIVE) {
                    a->state = RL_INACTIVE;
                    a->resolved_at = ts;
                    rl_note_add(&trans, a, r->def->name, g->def->name, url.data, false);
                }
                assert(rl_alert_check(a));
                i++;
                continue;
            }
        }
        if (a->state == RL_PENDING && ts - a->active_at >= r->def->for_ms) {
            a->state = RL_FIRING;
            a->fired_at = ts;
            rl_note_add(&trans, a, r->def->name, g->def->name, url.data, true);
        }
        assert(rl_alert_check(a));
        if (r->restored) {
            labels_t ls = rl_alert_series_labels(o.a, a, "ALERTS", rl_state_name(a->state));
            rl_out_add(&o, &ls, ts, 1);
            ls = rl_alert_series_labels(o.a, a, "ALERTS_FOR_STATE", NULL);
            rl_out_add(&o, &ls, ts, (double)(a->active_at / 1000));
        }
        i++;
    }
    free(cur);
    size_t nactive = 0;
    for (size_t i = 0; i < r->nalerts; i++)
        nactive += r->alerts[i].state != RL_INACTIVE;
    bool over = g->def->limit > 0 && (int64_t)nactive > g->def->limit;
    if (over) {
        char ebuf[160];
        snprintf(ebuf, sizeof(ebuf), "exceeded limit of %lld with %zu alerts", (long long)g->def->limit, nactive);
        for (size_t i = 0; i < r->nalerts; i++)
            rl_alert_free(&r->alerts[i]);
        r->nalerts = 0;
        rl_set_error(r, ebuf);
        *failed = true;
        o.n = 0; /* Prometheus returns before anything is appended */
        rl_notes_free(&trans);
        trans = (rl_notes_t){0};
    } else {
        rl_set_error(r, NULL);
        /* Prometheus' needsSending / sendAlerts */
        for (size_t i = 0; i < r->nalerts; i++) {
            rl_alert_t *a = &r->alerts[i];
            if (a->state == RL_PENDING)
                continue;
            bool need = a->resolved_at > a->last_sent_at || a->last_sent_at + m->o.resend_delay_ms < ts;
            if (!need)
                continue;
            a->last_sent_at = ts;
            a->valid_until = ts + 4 * delta;
            rl_note_add(&notes, a, r->def->name, g->def->name, url.data, a->state == RL_FIRING);
        }
    }
    pthread_mutex_unlock(&m->mu);

    if (!over) {
        rl_series_t *np;
        size_t nn;
        rl_commit(m, r, &o, ts, &np, &nn);
        pthread_mutex_lock(&m->mu);
        rl_series_free(r->prev, r->nprev);
        r->prev = np;
        r->nprev = nn;
        pthread_mutex_unlock(&m->mu);
    }
    for (size_t i = 0; i < trans.n; i++) {
        log_info("rules", trans.firing[i] ? "alert firing" : "alert resolved", LF_S("alertname", r->def->name),
                 LF_S("group", g->def->name), LF_F("value", trans.v[i].value));
        if (m->o.hooks.transition)
            m->o.hooks.transition(m->o.hooks.ud, &trans.v[i], trans.firing[i], ts);
    }
    if (notes.n && m->o.hooks.send)
        m->o.hooks.send(m->o.hooks.ud, notes.v, notes.n);
    buf_free(&url);
    rl_notes_free(&notes);
    rl_notes_free(&trans);
    free(o.v);
    arena_destroy(o.a);
}

/* Prometheus' Group.RestoreForState: pending alerts of rules with for >= the grace period take
 * their active time back from the last ALERTS_FOR_STATE sample. Called with mu held. */
static void rl_restore_for_state(rules_manager_t *m, rl_group_t *g, int64_t now_ms)
{
    for (size_t ri = 0; ri < g->nrules; ri++) {
        rl_rule_t *r = &g->rules[ri];
        if (r->def->kind != RULES_ALERT)
            continue;
        int64_t hold = r->def->for_ms;
        if (hold < m->o.for_grace_period_ms) {
            r->restored = true;
            continue;
        }
        for (size_t ai = 0; ai < r->nalerts; ai++) {
            rl_alert_t *a = &r->alerts[ai];
            arena_t *ar = arena_create(0);
            labels_t ls = rl_alert_series_labels(ar, a, "ALERTS_FOR_STATE", NULL);
            matcher_t **ms = arena_alloc(ar, ls.n * sizeof(*ms));
            char merr[128];
            size_t nm = 0;
            for (size_t k = 0; k < ls.n; k++) {
                ms[nm] = matcher_new(MATCHER_EQ, ls.v[k].name, ls.v[k].value, merr, sizeof(merr));
                if (ms[nm])
                    nm++;
            }
            querier_t *q = storage_querier(m->o.storage);
            querier_set_t *set =
                q ? querier_select(q, (const matcher_t *const *)ms, nm, now_ms - m->o.outage_tolerance_ms, now_ms, NULL)
                  : NULL;
            const querier_series_t *s;
            int64_t t = 0;
            double v = 0;
            bool found = false;
            while (set && (s = querier_set_next(set))) {
                if (!labels_equal(&s->labels, &ls))
                    continue;
                querier_iter_t it;
                querier_iter_init(&it, s, now_ms - m->o.outage_tolerance_ms, now_ms);
                int64_t tt;
                double vv;
                while (querier_iter_next(&it, &tt, &vv)) {
                    t = tt;
                    v = vv;
                    found = true;
                }
            }
            querier_set_free(set);
            querier_close(q);
            for (size_t k = 0; k < nm; k++)
                matcher_free(ms[k]);
            arena_destroy(ar);
            if (!found || promql_is_stale_nan(v))
                continue;
            int64_t down_at = (t / 1000) * 1000;
            int64_t restored = (int64_t)v * 1000;
            int64_t remaining = hold - (down_at - restored);
            if (remaining <= 0) {
                /* it was firing when sluice went down: the next evaluation decides */
            } else if (remaining < m->o.for_grace_period_ms) {
                restored = now_ms + m->o.for_grace_period_ms - hold;
            } else {
                restored += now_ms - down_at;
            }
            a->active_at = restored;
            log_info("rules", "restored the for state of an alert", LF_S("alertname", r->def->name),
                     LF_I("active_at_ms", restored));
        }
        r->restored = true;
    }
}

static void rl_eval_group(rules_manager_t *m, rl_group_t *g, int64_t ts)
{
    double t0 = clock_mono_s();
    int64_t wall = clock_wall_ns() / 1000000;
    for (size_t i = 0; i < g->nrules; i++) {
        rl_rule_t *r = &g->rules[i];
        double r0 = clock_mono_s();
        bool failed = false;
        if (r->def->kind == RULES_RECORD)
            rl_eval_recording(m, g, r, ts, &failed);
        else
            rl_eval_alerting(m, g, r, ts, &failed);
        double dt = clock_mono_s() - r0;
        pthread_mutex_lock(&m->mu);
        r->eval_seconds = dt;
        r->last_eval_wall_ms = clock_wall_ns() / 1000000;
        m->evaluations++;
        m->eval_seconds_sum += dt;
        if (failed) {
            m->eval_failures++;
            log_warn("rules", "rule evaluation failed", LF_S("group", g->def->name), LF_S("rule", r->def->name),
                     LF_S("err", r->last_error ? r->last_error : ""));
        }
        pthread_mutex_unlock(&m->mu);
    }
    pthread_mutex_lock(&m->mu);
    g->last_eval_seconds = clock_mono_s() - t0;
    g->last_eval_wall_ms = wall;
    g->iterations++;
    g->evals++;
    if (g->should_restore && g->evals >= 2) {
        rl_restore_for_state(m, g, clock_wall_ns() / 1000000);
        g->should_restore = false;
    }
    pthread_mutex_unlock(&m->mu);
}

/* --- loading ------------------------------------------------------------------------------------------ */

static bool rl_labels_same(const labels_t *a, const labels_t *b)
{
    return labels_equal(a, b);
}

/* Prometheus' nameAndLabels: rules of two versions of a group are matched by name and labels. */
static bool rl_rule_matches(const rules_rule_def_t *a, const rules_rule_def_t *b)
{
    return a->kind == b->kind && strcmp(a->name, b->name) == 0 && rl_labels_same(&a->labels, &b->labels);
}

static bool rl_group_equal(const rl_group_t *og, const rules_group_def_t *nd, int64_t interval)
{
    const rules_group_def_t *od = og->def;
    if (strcmp(od->name, nd->name) || strcmp(od->file, nd->file) || og->interval_ms != interval ||
        od->limit != nd->limit || od->nrules != nd->nrules)
        return false;
    for (size_t i = 0; i < od->nrules; i++) {
        const rules_rule_def_t *a = &od->rules[i], *b = &nd->rules[i];
        if (!rl_rule_matches(a, b) || strcmp(a->expr, b->expr) || a->for_ms != b->for_ms ||
            a->keep_firing_for_ms != b->keep_firing_for_ms || !rl_labels_same(&a->annotations, &b->annotations))
            return false;
    }
    return true;
}

static void rl_free_patterns(rules_manager_t *m)
{
    for (size_t i = 0; i < m->npatterns; i++)
        free(m->patterns[i]);
    free(m->patterns);
    m->patterns = NULL;
    m->npatterns = 0;
}

int rules_manager_load(rules_manager_t *m, const char *const *patterns, size_t n, buf_t *errs)
{
    rules_file_t nf = {0};
    int nerr = rules_files_load(&nf, patterns, n, errs);
    /* Prometheus' manager refuses the same group name twice in one file (checked above) and
     * keys groups by file + name, so different files may reuse a name. */
    pthread_mutex_lock(&m->mu);
    if (patterns != (const char *const *)m->patterns) {
        char **np = calloc(n ? n : 1, sizeof(*np));
        for (size_t i = 0; np && i < n; i++)
            np[i] = strdup(patterns[i]);
        rl_free_patterns(m);
        m->patterns = np;
        m->npatterns = np ? n : 0;
    }
    m->reloads++;
    m->last_reload_ms = clock_wall_ns() / 1000000;
    if (nerr) {
        m->reload_failures++;
        m->last_reload_ok = false;
        pthread_mutex_unlock(&m->mu);
        rules_file_free(&nf);
        return nerr;
    }
    while (m->busy)
        pthread_cond_wait(&m->idle_cv, &m->mu);

    rl_group_t *ng = calloc(nf.ngroups ? nf.ngroups : 1, sizeof(*ng));
    if (!ng)
        abort();
    int64_t now_ns = clock_wall_ns();
    bool *kept_old = calloc(m->ngroups ? m->ngroups : 1, sizeof(*kept_old));
    for (size_t gi = 0; gi < nf.ngroups; gi++) {
        const rules_group_def_t *d = &nf.groups[gi];
        rl_group_t *g = &ng[gi];
        g->def = d;
        g->interval_ms = d->interval_ms > 0 ? d->interval_ms : m->o.default_interval_ms;
        g->nrules = d->nrules;
        g->rules = calloc(d->nrules ? d->nrules : 1, sizeof(*g->rules));
        g->should_restore = !m->loaded_once;
        for (size_t ri = 0; ri < d->nrules; ri++) {
            rl_rule_t *r = &g->rules[ri];
            r->def = &d->rules[ri];
            buf_t q = BUF_INIT;
            promql_format_expr(r->def->ast->root, &q);
            r->query = buf_steal(&q, NULL);
            r->restored = m->loaded_once;
        }
        g->next_ns =
            rules_group_eval_timestamp_ns(d->name, d->file, g->interval_ms, now_ns) + g->interval_ms * 1000000LL;
        /* the same group before: keep its alerts and previous series (CopyState) */
        for (size_t oi = 0; oi < m->ngroups; oi++) {
            rl_group_t *og = &m->groups[oi];
            if (kept_old[oi] || strcmp(og->def->name, d->name) || strcmp(og->def->file, d->file))
                continue;
            kept_old[oi] = true;
            if (rl_group_equal(og, d, g->interval_ms)) {
                g->next_ns = og->next_ns; /* an unchanged group keeps running as it was */
                g->evals = og->evals;
                g->should_restore = og->should_restore;
            }
            g->last_eval_wall_ms = og->last_eval_wall_ms;
            g->last_eval_seconds = og->last_eval_seconds;
            g->iterations = og->iterations;
            g->missed = og->missed;
            bool *taken = calloc(og->nrules ? og->nrules : 1, sizeof(*taken));
            for (size_t ri = 0; ri < g->nrules; ri++) {
                rl_rule_t *r = &g->rules[ri];
                for (size_t k = 0; k < og->nrules; k++) {
                    rl_rule_t *o = &og->rules[k];
                    if (taken[k] || !rl_rule_matches(o->def, r->def))
                        continue;
                    taken[k] = true;
                    r->prev = o->prev;
                    r->nprev = o->nprev;
                    o->prev = NULL;
                    o->nprev = 0;
                    r->alerts = o->alerts;
                    r->nalerts = o->nalerts;
                    r->capalerts = o->capalerts;
                    o->alerts = NULL;
                    o->nalerts = o->capalerts = 0;
                    r->health = o->health;
                    r->last_error = o->last_error;
                    o->last_error = NULL;
                    r->last_eval_wall_ms = o->last_eval_wall_ms;
                    r->eval_seconds = o->eval_seconds;
                    if (rl_group_equal(og, d, g->interval_ms))
                        r->restored = o->restored;
                    break;
                }
            }
            free(taken);
            break;
        }
    }
    /* series of rules that are gone get staleness markers */
    rl_out_t o = {.a = arena_create(0)};
    int64_t now_ms = m->o.storage ? storage_now_ms(m->o.storage) : now_ns / 1000000;
    for (size_t oi = 0; oi < m->ngroups; oi++)
        for (size_t k = 0; k < m->groups[oi].nrules; k++) {
            rl_rule_t *r = &m->groups[oi].rules[k];
            for (size_t s = 0; s < r->nprev; s++)
                rl_out_add(&o, &r->prev[s].labels, now_ms, promql_stale_nan());
        }
    free(kept_old);
    rl_groups_free(m->groups, m->ngroups);
    rules_file_free(&m->files);
    m->files = nf;
    m->groups = ng;
    m->ngroups = nf.ngroups;
    m->loaded_once = true;
    m->last_reload_ok = true;
    size_t nrules = 0;
    for (size_t i = 0; i < m->ngroups; i++)
        nrules += m->groups[i].nrules;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (o.n && m->o.storage)
        storage_append(m->o.storage, o.v, o.n, NULL);
    free(o.v);
    arena_destroy(o.a);
    log_info("rules", "rule files loaded", LF_I("files", (int64_t)nf.nfiles), LF_I("groups", (int64_t)nf.ngroups),
             LF_I("rules", (int64_t)nrules));
    return 0;
}

int rules_manager_reload(rules_manager_t *m, buf_t *errs)
{
    /* the pattern list is replaced only by rules_manager_load with other patterns */
    pthread_mutex_lock(&m->mu);
    size_t n = m->npatterns;
    char **copy = calloc(n ? n : 1, sizeof(*copy));
    for (size_t i = 0; copy && i < n; i++)
        copy[i] = strdup(m->patterns[i]);
    pthread_mutex_unlock(&m->mu);
    int rc = rules_manager_load(m, (const char *const *)copy, n, errs);
    for (size_t i = 0; copy && i < n; i++)
        free(copy[i]);
    free(copy);
    return rc;
}

/* --- the evaluation thread ------------------------------------------------------------------------------ */

static void *rl_thread_main(void *arg)
{
    rules_manager_t *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        rl_group_t *next = NULL;
        for (size_t i = 0; i < m->ngroups; i++)
            if (m->groups[i].nrules && (!next || m->groups[i].next_ns < next->next_ns))
                next = &m->groups[i];
        int64_t now = clock_wall_ns();
        if (!next || next->next_ns > now) {
            struct timespec dl;
            int64_t until = next ? next->next_ns : now + 1000000000LL;
            dl.tv_sec = (time_t)(until / 1000000000LL);
            dl.tv_nsec = (long)(until % 1000000000LL);
            pthread_cond_timedwait(&m->cv, &m->mu, &dl);
            continue;
        }
        int64_t ts_ns = next->next_ns;
        int64_t iv = next->interval_ms * 1000000LL;
        next->next_ns += iv;
        if (next->next_ns <= now) { /* missed slots are skipped, as Prometheus does */
            int64_t missed = (now - next->next_ns) / iv + 1;
            next->next_ns += missed * iv;
            next->missed += (uint64_t)missed;
            m->missed_total += (uint64_t)missed;
        }
        m->busy = true;
        pthread_mutex_unlock(&m->mu);
        rl_eval_group(m, next, ts_ns / 1000000);
        pthread_mutex_lock(&m->mu);
        m->busy = false;
        pthread_cond_broadcast(&m->idle_cv);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

rules_manager_t *rules_manager_new(const rules_options_t *o)
{
    rules_manager_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->o = *o;
    if (m->o.default_interval_ms <= 0)
        m->o.default_interval_ms = 60000;
    if (m->o.resend_delay_ms <= 0)
        m->o.resend_delay_ms = 60000;
    if (m->o.outage_tolerance_ms <= 0)
        m->o.outage_tolerance_ms = 3600000;
    if (m->o.for_grace_period_ms <= 0)
        m->o.for_grace_period_ms = 600000;
    rules_labels_dup(&m->external_labels, o->external_labels);
    labels_sort(&m->external_labels);
    m->external_url = strdup(o->external_url ? o->external_url : "");
    m->o.external_labels = &m->external_labels;
    m->o.external_url = m->external_url;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    pthread_cond_init(&m->idle_cv, NULL);
    m->last_reload_ok = true;
    return m;
}

int rules_manager_start(rules_manager_t *m)
{
    if (pthread_create(&m->thread, NULL, rl_thread_main, m) != 0)
        return -1;
    m->started = true;
    return 0;
}

void rules_manager_free(rules_manager_t *m)
{
    if (!m)
        return;
    if (m->started) {
        pthread_mutex_lock(&m->mu);
        m->stop = true;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->thread, NULL);
    }
    rl_groups_free(m->groups, m->ngroups);
    rules_file_free(&m->files);
    rl_free_patterns(m);
    rules_labels_free(&m->external_labels);
    free(m->external_url);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    pthread_cond_destroy(&m->idle_cv);
    free(m);
}

void rules_manager_eval_all_at(rules_manager_t *m, int64_t ts_ms)
{
    pthread_mutex_lock(&m->mu);
    while (m->busy)
        pthread_cond_wait(&m->idle_cv, &m->mu);
    m->busy = true;
    size_t n = m->ngroups;
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < n; i++)
        rl_eval_group(m, &m->groups[i], ts_ms);
    pthread_mutex_lock(&m->mu);
    m->busy = false;
    pthread_cond_broadcast(&m->idle_cv);
    pthread_mutex_unlock(&m->mu);
}

size_t rules_manager_group_count(rules_manager_t *m)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->ngroups;
    pthread_mutex_unlock(&m->mu);
    return n;
}

bool rules_manager_last_reload_ok(rules_manager_t *m)
{
    pthread_mutex_lock(&m->mu);
    bool ok = m->last_reload_ok;
    pthread_mutex_unlock(&m->mu);
    return ok;
}

/* --- JSON ------------------------------------------------------------------------------------------------- */

static void rl_json_labels(buf_t *b, const labels_t *ls)
{
    buf_putc(b, '{');
    for (size_t i = 0; ls && i < ls->n; i++) {
        if (i)
            buf_putc(b, ',');
        buf_put_json_string(b, ls->v[i].name, strlen(ls->v[i].name));
        buf_putc(b, ':');
        buf_put_json_string(b, ls->v[i].value, strlen(ls->v[i].value));
    }
    buf_putc(b, '}');
}

static void rl_json_alert(buf_t *b, const rl_alert_t *a)
{
    buf_puts(b, "{\"labels\":");
    rl_json_labels(b, &a->labels);
    buf_puts(b, ",\"annotations\":");
    rl_json_labels(b, &a->annotations);
    buf_printf(b, ",\"state\":\"%s\",\"activeAt\":\"", rl_state_name(a->state));
    rules_format_time(a->active_at, b);
    buf_puts(b, "\",\"value\":\"");
    buf_put_float_go(b, a->value, 'e');
    buf_puts(b, "\"}");
}

static void rl_json_seconds(buf_t *b, double s)
{
    buf_put_float_json(b, s);
}

static const char *rl_health_name(rl_health_t h)
{
    return h == RL_HEALTH_OK ? "ok" : h == RL_HEALTH_ERR ? "err" : "unknown";
}

void rules_manager_rules_json(rules_manager_t *m, const char *type_filter, buf_t *out)
{
    bool want_alert = !type_filter || !type_filter[0] || strcmp(type_filter, "alert") == 0;
    bool want_record = !type_filter || !type_filter[0] || strcmp(type_filter, "record") == 0;
    pthread_mutex_lock(&m->mu);
    buf_puts(out, "{\"groups\":[");
    for (size_t gi = 0; gi < m->ngroups; gi++) {
        rl_group_t *g = &m->groups[gi];
        if (gi)
            buf_putc(out, ',');
        buf_puts(out, "{\"name\":");
        buf_put_json_string(out, g->def->name, strlen(g->def->name));
        buf_puts(out, ",\"file\":");
        buf_put_json_string(out, g->def->file, strlen(g->def->file));
        buf_puts(out, ",\"rules\":[");
        bool first = true;
        for (size_t ri = 0; ri < g->nrules; ri++) {
            rl_rule_t *r = &g->rules[ri];
            bool alert = r->def->kind == RULES_ALERT;
            if ((alert && !want_alert) || (!alert && !want_record))
                continue;
            if (!first)
                buf_putc(out, ',');
            first = false;
            if (alert) {
                rl_state_t st = RL_INACTIVE;
                for (size_t i = 0; i < r->nalerts; i++)
                    if (r->alerts[i].state > st)
                        st = r->alerts[i].state;
                buf_printf(out, "{\"state\":\"%s\",\"name\":", rl_state_name(st));
                buf_put_json_string(out, r->def->name, strlen(r->def->name));
                buf_puts(out, ",\"query\":");
                buf_put_json_string(out, r->query, strlen(r->query));
                buf_puts(out, ",\"duration\":");
                rl_json_seconds(out, (double)r->def->for_ms / 1000.0);
                buf_puts(out, ",\"labels\":");
                rl_json_labels(out, &r->def->labels);
                buf_puts(out, ",\"annotations\":");
                rl_json_labels(out, &r->def->annotations);
                buf_puts(out, ",\"alerts\":[");
                bool fa = true;
                for (size_t i = 0; i < r->nalerts; i++) {
                    if (r->alerts[i].state == RL_INACTIVE)
                        continue;
                    if (!fa)
                        buf_putc(out, ',');
                    fa = false;
                    rl_json_alert(out, &r->alerts[i]);
                }
                buf_putc(out, ']');
            } else {
                buf_puts(out, "{\"name\":");
                buf_put_json_string(out, r->def->name, strlen(r->def->name));
                buf_puts(out, ",\"query\":");
                buf_put_json_string(out, r->query, strlen(r->query));
                if (r->def->labels.n) {
                    buf_puts(out, ",\"labels\":");
                    rl_json_labels(out, &r->def->labels);
                }
            }
            buf_printf(out, ",\"health\":\"%s\"", rl_health_name(r->health));
            if (r->last_error) {
                buf_puts(out, ",\"lastError\":");
                buf_put_json_string(out, r->last_error, strlen(r->last_error));
            }
            buf_puts(out, ",\"evaluationTime\":");
            rl_json_seconds(out, r->eval_seconds);
            buf_puts(out, ",\"lastEvaluation\":\"");
            rules_format_time(r->last_eval_wall_ms, out);
            buf_printf(out, "\",\"type\":\"%s\"}", alert ? "alerting" : "recording");
        }
        buf_puts(out, "],\"interval\":");
        rl_json_seconds(out, (double)g->interval_ms / 1000.0);
        buf_printf(out, ",\"limit\":%lld,\"evaluationTime\":", (long long)g->def->limit);
        rl_json_seconds(out, g->last_eval_seconds);
        buf_puts(out, ",\"lastEvaluation\":\"");
        rules_format_time(g->last_eval_wall_ms, out);
        buf_puts(out, "\"}");
    }
    buf_puts(out, "]}");
    pthread_mutex_unlock(&m->mu);
}

void rules_manager_alerts_json(rules_manager_t *m, buf_t *out)
{
    pthread_mutex_lock(&m->mu);
    buf_puts(out, "{\"alerts\":[");
    bool first = true;
    for (size_t gi = 0; gi < m->ngroups; gi++)
        for (size_t ri = 0; ri < m->groups[gi].nrules; ri++) {
            rl_rule_t *r = &m->groups[gi].rules[ri];
            for (size_t i = 0; i < r->nalerts; i++) {
                if (r->alerts[i].state == RL_INACTIVE)
                    continue;
                if (!first)
                    buf_putc(out, ',');
                first = false;
                rl_json_alert(out, &r->alerts[i]);
            }
        }
    buf_puts(out, "]}");
    pthread_mutex_unlock(&m->mu);
}

void rules_manager_write_metrics(rules_manager_t *m, buf_t *out)
{
    pthread_mutex_lock(&m->mu);
    buf_printf(out,
               "# HELP sluice_rule_evaluations_total Rule evaluations.\n"
               "# TYPE sluice_rule_evaluations_total counter\nsluice_rule_evaluations_total %llu\n"
               "# HELP sluice_rule_evaluation_failures_total Rule evaluations that failed (query error, "
               "duplicate labels, limit).\n"
               "# TYPE sluice_rule_evaluation_failures_total counter\nsluice_rule_evaluation_failures_total %llu\n"
               "# HELP sluice_rule_evaluation_duration_seconds Time spent evaluating rules.\n"
               "# TYPE sluice_rule_evaluation_duration_seconds summary\n"
               "sluice_rule_evaluation_duration_seconds_sum %.9f\nsluice_rule_evaluation_duration_seconds_count %llu\n"
               "# HELP sluice_rule_group_iterations_missed_total Group evaluations skipped because the previous "
               "one ran late.\n"
               "# TYPE sluice_rule_group_iterations_missed_total counter\n"
               "sluice_rule_group_iterations_missed_total %llu\n"
               "# HELP sluice_rule_samples_written_total Samples written by rules (results, ALERTS, staleness "
               "markers).\n"
               "# TYPE sluice_rule_samples_written_total counter\nsluice_rule_samples_written_total %llu\n"
               "# HELP sluice_rule_samples_refused_total Rule samples storage refused.\n"
               "# TYPE sluice_rule_samples_refused_total counter\nsluice_rule_samples_refused_total %llu\n"
               "# HELP sluice_rule_reloads_total Rule file loads (start-up, SIGHUP, POST /-/reload).\n"
               "# TYPE sluice_rule_reloads_total counter\nsluice_rule_reloads_total %llu\n"
               "# HELP sluice_rule_reload_failures_total Rule file loads refused (the old rules kept running).\n"
               "# TYPE sluice_rule_reload_failures_total counter\nsluice_rule_reload_failures_total %llu\n"
               "# HELP sluice_rule_last_reload_successful Whether the last rule load succeeded.\n"
               "# TYPE sluice_rule_last_reload_successful gauge\nsluice_rule_last_reload_successful %d\n",
               (unsigned long long)m->evaluations, (unsigned long long)m->eval_failures, m->eval_seconds_sum,
               (unsigned long long)m->evaluations, (unsigned long long)m->missed_total,
               (unsigned long long)__atomic_load_n(&m->samples_written, __ATOMIC_RELAXED),
               (unsigned long long)__atomic_load_n(&m->append_failures, __ATOMIC_RELAXED),
               (unsigned long long)m->reloads, (unsigned long long)m->reload_failures, m->last_reload_ok ? 1 : 0);
    buf_puts(out, "# HELP sluice_rule_group_last_duration_seconds Duration of the group's last evaluation.\n"
                  "# TYPE sluice_rule_group_last_duration_seconds gauge\n");
    for (size_t i = 0; i < m->ngroups; i++) {
        buf_puts(out, "sluice_rule_group_last_duration_seconds{rule_group=");
        buf_t k = BUF_INIT;
        buf_printf(&k, "%s;%s", m->groups[i].def->file, m->groups[i].def->name);
        buf_put_json_string(out, k.data, k.len);
        buf_free(&k);
        buf_printf(out, "} %.9f\n", m->groups[i].last_eval_seconds);
    }
    buf_puts(out, "# HELP sluice_alerts Active alerts by state.\n# TYPE sluice_alerts gauge\n");
    size_t pending = 0, firing = 0;
    for (size_t gi = 0; gi < m->ngroups; gi++)
        for (size_t ri = 0; ri < m->groups[gi].nrules; ri++)
            for (size_t i = 0; i < m->groups[gi].rules[ri].nalerts; i++) {
                rl_state_t st = m->groups[gi].rules[ri].alerts[i].state;
                pending += st == RL_PENDING;
                firing += st == RL_FIRING;
            }
    buf_printf(out, "sluice_alerts{state=\"firing\"} %zu\nsluice_alerts{state=\"pending\"} %zu\n", firing, pending);
    pthread_mutex_unlock(&m->mu);
}
