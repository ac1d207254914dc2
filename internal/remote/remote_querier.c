/*
 * remote_querier — remote read stores as a querier (contract and failure policy in
 * remote_querier.h).
 *
 * select runs the queries right away (the set is then only a cursor): every client's result
 * lands in the set's arena, all series go into one array sorted by (labels, client order), and
 * next() joins runs of equal labels, clips to [mint, maxt] and encodes the samples into XOR
 * chunks in buffers reused from one series to the next.
 */
#include "internal/remote/remote_querier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/log.h"
#include "storage/chunk_xor.h"

#define RQ_MAX_WARNINGS 4

typedef struct {
    querier_t base;
    remote_querier_opts_t o;
    matcher_t *all; /* __name__=~".+", for label calls without matchers */
} rq_t;

typedef struct {
    const remote_read_series_t *s;
    size_t client;
} rq_item_t;

typedef struct {
    querier_set_t base;
    arena_t *a;
    int64_t mint, maxt;
    rq_item_t *items;
    size_t nitems, pos;
    /* output, reused */
    querier_series_t out;
    querier_chunk_t *ch;
    size_t capch;
    chunk_xor_appender_t *enc;
    size_t nenc, capenc;
    remote_read_sample_t *merged;
    size_t capmerged;
    const char *warnings[RQ_MAX_WARNINGS];
    size_t nwarnings;
    querier_err_kind_t kind;
    char err[512];
} rq_set_t;

static int rq_item_cmp(const void *a, const void *b)
{
    const rq_item_t *x = a, *y = b;
    int c = labels_compare(&x->s->labels, &y->s->labels);
    if (c)
        return c;
    return x->client < y->client ? -1 : x->client > y->client;
}

static void rq_enc_reset(rq_set_t *s)
{
    for (size_t i = 0; i < s->nenc; i++)
        chunk_xor_appender_free(&s->enc[i]);
    s->nenc = 0;
}

/* Encodes samples (time order, unique) into chunks of CHUNK_XOR_MAX_SAMPLES. 0 or -1 (OOM). */
static int rq_encode(rq_set_t *s, const remote_read_sample_t *v, size_t n)
{
    rq_enc_reset(s);
    size_t need = (n + CHUNK_XOR_MAX_SAMPLES - 1) / CHUNK_XOR_MAX_SAMPLES;
    if (need > s->capenc) {
        chunk_xor_appender_t *p = realloc(s->enc, need * sizeof(*p));
        querier_chunk_t *c = realloc(s->ch, need * sizeof(*c));
        if (p)
            s->enc = p;
        if (c)
            s->ch = c;
        if (!p || !c)
            return -1;
        s->capenc = s->capch = need;
    }
    for (size_t i = 0; i < n; i++) {
        if (i % CHUNK_XOR_MAX_SAMPLES == 0) {
            if (chunk_xor_appender_init(&s->enc[s->nenc]) < 0)
                return -1;
            s->ch[s->nenc] = (querier_chunk_t){.mint = v[i].t, .enc = CHUNK_ENC_XOR};
            s->nenc++;
        }
        if (chunk_xor_append(&s->enc[s->nenc - 1], v[i].t, v[i].v) < 0)
            return -1;
        s->ch[s->nenc - 1].maxt = v[i].t;
    }
    for (size_t i = 0; i < s->nenc; i++)
        s->ch[i].bytes = chunk_xor_bytes(&s->enc[i], &s->ch[i].len);
    return 0;
}

/* Union by timestamp of the run items[lo..hi) (first client wins), clipped to [mint, maxt], into
 * s->merged. Returns the count, or -1 (OOM). */
static ssize_t rq_merge_run(rq_set_t *s, size_t lo, size_t hi)
{
    size_t total = 0;
    for (size_t i = lo; i < hi; i++)
        total += s->items[i].s->n;
    if (total > s->capmerged) {
        remote_read_sample_t *p = realloc(s->merged, total * sizeof(*p));
        if (!p)
            return -1;
        s->merged = p;
        s->capmerged = total;
    }
    size_t n = 0;
    if (hi - lo == 1) {
        const remote_read_series_t *r = s->items[lo].s;
        for (size_t k = 0; k < r->n; k++)
            if (r->samples[k].t >= s->mint && r->samples[k].t <= s->maxt)
                s->merged[n++] = r->samples[k];
        return (ssize_t)n;
    }
    /* k-way merge by repeated minimum: runs are short (a store or two). */
    size_t *pos = calloc(hi - lo, sizeof(*pos));
    if (!pos)
        return -1;
    for (;;) {
        size_t best = SIZE_MAX;
        int64_t bt = INT64_MAX;
        for (size_t i = lo; i < hi; i++) {
            const remote_read_series_t *r = s->items[i].s;
            if (pos[i - lo] < r->n && r->samples[pos[i - lo]].t < bt) {
                bt = r->samples[pos[i - lo]].t;
                best = i;
            }
        }
        if (best == SIZE_MAX)
            break;
        remote_read_sample_t smp = s->items[best].s->samples[pos[best - lo]];
        for (size_t i = lo; i < hi; i++) {
            const remote_read_series_t *r = s->items[i].s;
            if (pos[i - lo] < r->n && r->samples[pos[i - lo]].t == bt)
                pos[i - lo]++;
        }
        if (smp.t >= s->mint && smp.t <= s->maxt)
            s->merged[n++] = smp;
    }
    free(pos);
    return (ssize_t)n;
}

static const querier_series_t *rq_next(querier_set_t *base)
{
    rq_set_t *s = (rq_set_t *)base;
    while (!s->err[0] && s->pos < s->nitems) {
        size_t lo = s->pos, hi = lo + 1;
        while (hi < s->nitems && labels_equal(&s->items[hi].s->labels, &s->items[lo].s->labels))
            hi++;
        s->pos = hi;
        ssize_t n = rq_merge_run(s, lo, hi);
        if (n < 0 || rq_encode(s, s->merged, (size_t)n) < 0) {
            snprintf(s->err, sizeof(s->err), "out of memory reading remote series");
            s->kind = QUERIER_ERR_INTERNAL;
            return NULL;
        }
        if (n == 0)
            continue;
        s->out = (querier_series_t){.labels = s->items[lo].s->labels, .chunks = s->ch, .nchunks = s->nenc};
        return &s->out;
    }
    return NULL;
}

static const char *rq_error(querier_set_t *base)
{
    rq_set_t *s = (rq_set_t *)base;
    return s->err[0] ? s->err : NULL;
}

static querier_err_kind_t rq_error_kind(querier_set_t *base)
{
    return ((rq_set_t *)base)->kind;
}

static size_t rq_warnings(querier_set_t *base, const char *const **out)
{
    rq_set_t *s = (rq_set_t *)base;
    *out = s->warnings;
    return s->nwarnings;
}

static void rq_free(querier_set_t *base)
{
    rq_set_t *s = (rq_set_t *)base;
    rq_enc_reset(s);
    free(s->enc);
    free(s->ch);
    free(s->merged);
    free(s->items);
    arena_destroy(s->a);
    free(s);
}

static const querier_set_ops_t rq_set_ops = {
    .next = rq_next, .error = rq_error, .free = rq_free, .warnings = rq_warnings, .error_kind = rq_error_kind};

/* Removes labels equal to one of our external labels (the order of the rest is kept). */
static void rq_strip_external(const rq_t *q, labels_t *ls)
{
    if (!q->o.nexternal)
        return;
    size_t w = 0;
    for (size_t i = 0; i < ls->n; i++) {
        bool ext = false;
        for (size_t k = 0; k < q->o.nexternal && !ext; k++)
            ext = strcmp(ls->v[i].name, q->o.external[k].name) == 0 &&
                  strcmp(ls->v[i].value, q->o.external[k].value) == 0;
        if (!ext)
            ls->v[w++] = ls->v[i];
    }
    ls->n = w;
}

static querier_set_t *rq_select(querier_t *qb, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                                const querier_hints_t *hints)
{
    rq_t *q = (rq_t *)qb;
    rq_set_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->base.ops = &rq_set_ops;
    s->mint = mint;
    s->maxt = maxt;
    s->a = arena_create(0);
    remote_read_result_t *res = calloc(q->o.nclients ? q->o.nclients : 1, sizeof(*res));
    if (!s->a || !res) {
        free(res);
        rq_free(&s->base);
        return NULL;
    }
    size_t total = 0;
    for (size_t i = 0; i < q->o.nclients; i++) {
        remote_read_client_t *c = q->o.clients[i];
        char err[512];
        int rc = remote_read_client_query(c, ms, n, mint, maxt, hints, s->a, &res[i], err, sizeof(err));
        if (rc == REMOTE_READ_OK) {
            total += res[i].n;
            continue;
        }
        memset(&res[i], 0, sizeof(res[i]));
        log_warn("remote_read", "remote read failed", LF_S("remote_name", remote_read_client_name(c)),
                 LF_S("err", err));
        if (q->o.fail_on_error) {
            snprintf(s->err, sizeof(s->err), "%s", err);
            s->kind = rc == REMOTE_READ_ERR_UNAVAILABLE ? QUERIER_ERR_UNAVAILABLE
                      : rc == REMOTE_READ_ERR_NOMEM     ? QUERIER_ERR_INTERNAL
                                                        : QUERIER_ERR_REMOTE;
            break;
        }
        if (s->nwarnings < RQ_MAX_WARNINGS)
            s->warnings[s->nwarnings++] =
                arena_sprintf(s->a, "%s; the answer lacks that store's data (partial response)", err);
    }
    if (!s->err[0] && total) {
        s->items = malloc(total * sizeof(*s->items));
        if (!s->items) {
            snprintf(s->err, sizeof(s->err), "out of memory reading remote series");
        } else {
            for (size_t i = 0; i < q->o.nclients; i++)
                for (size_t k = 0; k < res[i].n; k++) {
                    rq_strip_external(q, &res[i].series[k].labels);
                    s->items[s->nitems++] = (rq_item_t){&res[i].series[k], i};
                }
            qsort(s->items, s->nitems, sizeof(*s->items), rq_item_cmp);
        }
    }
    free(res);
    return &s->base;
}

/* ---- label names / values ------------------------------------------------------------------- */

static int rq_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int rq_collect(rq_t *q, const char *name, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                      arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    const matcher_t *const *sel = ms;
    if (n == 0) {
        sel = (const matcher_t *const *)&q->all;
        n = 1;
    }
    querier_set_t *set = rq_select(&q->base, sel, n, mint, maxt, NULL);
    if (!set) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const char **v = NULL;
    size_t nv = 0, cap = 0;
    const querier_series_t *sr;
    while ((sr = querier_set_next(set)) != NULL) {
        for (size_t i = 0; i < sr->labels.n; i++) {
            const label_t *l = &sr->labels.v[i];
            if (name && strcmp(l->name, name) != 0)
                continue;
            if (nv == cap) {
                size_t nc = cap ? cap * 2 : 64;
                const char **p = arena_alloc(a, nc * sizeof(*p));
                if (nv)
                    memcpy(p, v, nv * sizeof(*p));
                v = p;
                cap = nc;
            }
            v[nv++] = arena_strdup(a, name ? l->value : l->name);
        }
    }
    const char *e = querier_set_error(set);
    if (e) {
        snprintf(err, errlen, "%s", e);
        querier_set_free(set);
        return -1;
    }
    querier_set_free(set);
    if (nv > 1)
        qsort(v, nv, sizeof(*v), rq_cmp_str);
    size_t w = 0;
    for (size_t i = 0; i < nv; i++)
        if (w == 0 || strcmp(v[w - 1], v[i]) != 0)
            v[w++] = v[i];
    *out = v ? v : arena_alloc(a, sizeof(char *));
    *count = w;
    return 0;
}

static int rq_label_names(querier_t *qb, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, arena_t *a,
                          const char ***out, size_t *count, char *err, size_t errlen)
{
    return rq_collect((rq_t *)qb, NULL, ms, n, mint, maxt, a, out, count, err, errlen);
}

static int rq_label_values(querier_t *qb, const char *name, const matcher_t *const *ms, size_t n, int64_t mint,
                           int64_t maxt, arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    return rq_collect((rq_t *)qb, name, ms, n, mint, maxt, a, out, count, err, errlen);
}

static void rq_close(querier_t *qb)
{
    rq_t *q = (rq_t *)qb;
    matcher_free(q->all);
    free(q);
}

static const querier_ops_t rq_ops = {
    .select = rq_select, .label_names = rq_label_names, .label_values = rq_label_values, .close = rq_close};

querier_t *remote_querier_new(const remote_querier_opts_t *o)
{
    rq_t *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->base.ops = &rq_ops;
    q->o = *o;
    char err[64];
    q->all = matcher_new(MATCHER_RE, LABEL_METRIC_NAME, ".+", err, sizeof(err));
    if (!q->all) {
        free(q);
        return NULL;
    }
    return &q->base;
}
