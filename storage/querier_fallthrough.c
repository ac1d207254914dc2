/*
 * querier_fallthrough — local + remote history as one querier (rules in querier_fallthrough.h).
 *
 * A select that needs the remote opens both sets and merge-joins them by labels (both come out
 * sorted). The output series of a join is built in buffers the set reuses: remote samples before
 * the seam re-encoded into XOR chunks followed by the local chunks as they are (default), or the
 * by-timestamp union of both re-encoded (read_recent).
 */
#include "storage/querier_fallthrough.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/chunk_xor.h"

typedef struct {
    querier_t base;
    querier_fallthrough_opts_t o;
} fq_t;

/* The part of the remote to ask for [mint, maxt]; false when the remote is not needed. */
static bool fq_remote_range(const fq_t *q, int64_t mint, int64_t maxt, int64_t *rmint, int64_t *rmaxt)
{
    *rmint = mint;
    *rmaxt = maxt;
    if (q->o.read_recent)
        return true;
    if (mint >= q->o.local_min)
        return false;
    if (q->o.local_min != INT64_MAX && q->o.local_min - 1 < maxt)
        *rmaxt = q->o.local_min - 1;
    return true;
}

typedef struct {
    int64_t t;
    double v;
} fq_sample_t;

typedef struct {
    querier_set_t base;
    fq_t *q;
    querier_set_t *ls, *rs;
    const querier_series_t *lcur, *rcur; /* peeked, not yet consumed */
    bool ldone, rdone;
    int64_t mint, maxt;
    /* output, reused */
    querier_series_t out;
    labels_t out_labels; /* copy of the labels of a remote-only series (the peek may move on) */
    querier_chunk_t *ch;
    size_t nch, capch;
    chunk_xor_appender_t *enc;
    size_t nenc, capenc;
    fq_sample_t *rbuf, *mbuf;
    size_t caprbuf, capmbuf;
    querier_err_kind_t kind;
    char err[512];
} fset_t;

static void fs_enc_reset(fset_t *s)
{
    for (size_t i = 0; i < s->nenc; i++)
        chunk_xor_appender_free(&s->enc[i]);
    s->nenc = 0;
    s->nch = 0;
}

static int fs_push_chunk(fset_t *s, querier_chunk_t c)
{
    if (s->nch == s->capch) {
        size_t nc = s->capch ? s->capch * 2 : 16;
        querier_chunk_t *p = realloc(s->ch, nc * sizeof(*p));
        if (!p)
            return -1;
        s->ch = p;
        s->capch = nc;
    }
    s->ch[s->nch++] = c;
    return 0;
}

/* Encodes samples (time order, unique) as chunks of CHUNK_XOR_MAX_SAMPLES and appends them to
 * s->ch. The appenders stay alive (their bytes are referenced) until fs_enc_reset. */
static int fs_encode(fset_t *s, const fq_sample_t *v, size_t n)
{
    size_t first = s->nenc;
    for (size_t i = 0; i < n; i++) {
        if (i % CHUNK_XOR_MAX_SAMPLES == 0) {
            if (s->nenc == s->capenc) {
                size_t nc = s->capenc ? s->capenc * 2 : 8;
                chunk_xor_appender_t *p = realloc(s->enc, nc * sizeof(*p));
                if (!p)
                    return -1;
                s->enc = p;
                s->capenc = nc;
            }
            if (chunk_xor_appender_init(&s->enc[s->nenc]) < 0)
                return -1;
            s->nenc++;
        }
        if (chunk_xor_append(&s->enc[s->nenc - 1], v[i].t, v[i].v) < 0)
            return -1;
    }
    for (size_t i = first, k = 0; i < s->nenc; i++, k += CHUNK_XOR_MAX_SAMPLES) {
        size_t len;
        const uint8_t *b = chunk_xor_bytes(&s->enc[i], &len);
        size_t last = k + CHUNK_XOR_MAX_SAMPLES < n ? k + CHUNK_XOR_MAX_SAMPLES - 1 : n - 1;
        if (fs_push_chunk(s, (querier_chunk_t){.mint = v[k].t, .maxt = v[last].t, .bytes = b, .len = len}) < 0)
            return -1;
    }
    return 0;
}

/* Samples of series x with t in [lo, hi] into *buf (grown as needed). Returns the count or -1. */
static ssize_t fs_samples(const querier_series_t *x, int64_t lo, int64_t hi, fq_sample_t **buf, size_t *cap)
{
    querier_iter_t it;
    querier_iter_init(&it, x, lo, hi);
    size_t n = 0;
    int64_t t;
    double v;
    while (querier_iter_next(&it, &t, &v)) {
        if (n == *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            fq_sample_t *p = realloc(*buf, nc * sizeof(*p));
            if (!p)
                return -1;
            *buf = p;
            *cap = nc;
        }
        if (n && t <= (*buf)[n - 1].t)
            continue; /* the contract says time order; never trust it into a broken chunk */
        (*buf)[n++] = (fq_sample_t){t, v};
    }
    return (ssize_t)n;
}

/* Builds s->out from local series l and remote series r (both present). 1 = has data, -1 = OOM. */
static int fs_join(fset_t *s, const querier_series_t *l, const querier_series_t *r)
{
    fs_enc_reset(s);
    s->out = (querier_series_t){.labels = l->labels};
    int64_t lfirst = l->nchunks ? l->chunks[0].mint : INT64_MAX;
    if (!s->q->o.read_recent) {
        int64_t seam = s->q->o.local_min < lfirst ? s->q->o.local_min : lfirst;
        ssize_t nr = seam == INT64_MIN ? 0 : fs_samples(r, s->mint, seam - 1, &s->rbuf, &s->caprbuf);
        if (nr < 0 || fs_encode(s, s->rbuf, (size_t)nr) < 0)
            return -1;
        for (size_t i = 0; i < l->nchunks; i++)
            if (fs_push_chunk(s, l->chunks[i]) < 0)
                return -1;
        s->out.rollup_until = l->rollup_until;
        s->out.rollup_res_ms = l->rollup_res_ms;
    } else {
        ssize_t nr = fs_samples(r, s->mint, s->maxt, &s->rbuf, &s->caprbuf);
        if (nr < 0)
            return -1;
        /* Raw remote samples replace local roll-ups where they exist. */
        int64_t cut = INT64_MIN;
        if (l->rollup_until && nr > 0 && s->rbuf[0].t < l->rollup_until)
            cut = l->rollup_until;
        else {
            s->out.rollup_until = l->rollup_until;
            s->out.rollup_res_ms = l->rollup_res_ms;
        }
        ssize_t nl = fs_samples(l, cut > s->mint ? cut : s->mint, s->maxt, &s->mbuf, &s->capmbuf);
        if (nl < 0)
            return -1;
        /* Merge into a fresh array: local wins a tie. */
        size_t need = (size_t)nr + (size_t)nl;
        fq_sample_t *m = malloc((need ? need : 1) * sizeof(*m));
        if (!m)
            return -1;
        size_t i = 0, j = 0, k = 0;
        while (i < (size_t)nr || j < (size_t)nl) {
            if (j < (size_t)nl && (i >= (size_t)nr || s->mbuf[j].t <= s->rbuf[i].t)) {
                if (i < (size_t)nr && s->rbuf[i].t == s->mbuf[j].t)
                    i++;
                m[k++] = s->mbuf[j++];
            } else {
                m[k++] = s->rbuf[i++];
            }
        }
        int rc = fs_encode(s, m, k);
        free(m);
        if (rc < 0)
            return -1;
    }
    s->out.chunks = s->ch;
    s->out.nchunks = s->nch;
    return s->nch > 0;
}

/* A remote-only series, clipped to what the remote was asked for. */
static int fs_remote_only(fset_t *s, const querier_series_t *r, int64_t hi)
{
    fs_enc_reset(s);
    ssize_t nr = fs_samples(r, s->mint, hi, &s->rbuf, &s->caprbuf);
    if (nr < 0 || fs_encode(s, s->rbuf, (size_t)nr) < 0)
        return -1;
    s->out = (querier_series_t){.labels = r->labels, .chunks = s->ch, .nchunks = s->nch};
    return s->nch > 0;
}

static bool fs_peek(fset_t *s, querier_set_t *set, const querier_series_t **cur, bool *done, bool remote)
{
    if (*cur || *done)
        return true;
    *cur = querier_set_next(set);
    if (*cur)
        return true;
    *done = true;
    const char *e = querier_set_error(set);
    if (e) {
        snprintf(s->err, sizeof(s->err), "%s", e);
        s->kind = remote ? querier_set_error_kind(set) : QUERIER_ERR_INTERNAL;
        return false;
    }
    return true;
}

static const querier_series_t *fs_next(querier_set_t *base)
{
    fset_t *s = (fset_t *)base;
    int64_t rhi;
    {
        int64_t rlo;
        fq_remote_range(s->q, s->mint, s->maxt, &rlo, &rhi);
    }
    while (!s->err[0]) {
        if (!fs_peek(s, s->ls, &s->lcur, &s->ldone, false) || !fs_peek(s, s->rs, &s->rcur, &s->rdone, true))
            return NULL;
        if (!s->lcur && !s->rcur)
            return NULL;
        int cmp = !s->lcur ? 1 : !s->rcur ? -1 : labels_compare(&s->lcur->labels, &s->rcur->labels);
        int rc;
        /* A consumed series' memory stays valid until its set moves on, which is our next call. */
        if (cmp < 0) {
            const querier_series_t *l = s->lcur;
            s->lcur = NULL;
            return l;
        } else if (cmp > 0) {
            rc = fs_remote_only(s, s->rcur, rhi);
            s->rcur = NULL;
        } else {
            rc = fs_join(s, s->lcur, s->rcur);
            s->lcur = s->rcur = NULL;
        }
        if (rc < 0) {
            snprintf(s->err, sizeof(s->err), "out of memory merging remote series");
            s->kind = QUERIER_ERR_INTERNAL;
            return NULL;
        }
        if (rc > 0)
            return &s->out;
    }
    return NULL;
}

static const char *fs_error(querier_set_t *base)
{
    fset_t *s = (fset_t *)base;
    return s->err[0] ? s->err : NULL;
}

static querier_err_kind_t fs_error_kind(querier_set_t *base)
{
    return ((fset_t *)base)->kind;
}

static size_t fs_warnings(querier_set_t *base, const char *const **out)
{
    fset_t *s = (fset_t *)base;
    return querier_set_warnings(s->rs, out);
}

static void fs_free(querier_set_t *base)
{
    fset_t *s = (fset_t *)base;
    querier_set_free(s->ls);
    querier_set_free(s->rs);
    fs_enc_reset(s);
    free(s->enc);
    free(s->ch);
    free(s->rbuf);
    free(s->mbuf);
    free(s);
}

static const querier_set_ops_t fs_ops = {
    .next = fs_next, .error = fs_error, .free = fs_free, .warnings = fs_warnings, .error_kind = fs_error_kind};

static querier_set_t *fq_select(querier_t *qb, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                                const querier_hints_t *hints)
{
    fq_t *q = (fq_t *)qb;
    int64_t rmint, rmaxt;
    if (!fq_remote_range(q, mint, maxt, &rmint, &rmaxt))
        return querier_select(q->o.local, ms, n, mint, maxt, hints);
    fset_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->base.ops = &fs_ops;
    s->q = q;
    s->mint = mint;
    s->maxt = maxt;
    s->ls = querier_select(q->o.local, ms, n, mint, maxt, hints);
    s->rs = querier_select(q->o.remote, ms, n, rmint, rmaxt, hints);
    if (!s->ls || !s->rs) {
        fs_free(&s->base);
        return NULL;
    }
    return &s->base;
}

/* ---- label names / values -------------------------------------------------------------------- */

static int fq_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int fq_union(arena_t *a, const char **x, size_t nx, const char **y, size_t ny, const char ***out, size_t *count)
{
    const char **v = arena_alloc(a, (nx + ny ? nx + ny : 1) * sizeof(*v));
    if (nx)
        memcpy(v, x, nx * sizeof(*v));
    if (ny)
        memcpy(v + nx, y, ny * sizeof(*v));
    size_t n = nx + ny;
    if (n > 1)
        qsort(v, n, sizeof(*v), fq_cmp_str);
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (w == 0 || strcmp(v[w - 1], v[i]) != 0)
            v[w++] = v[i];
    *out = v;
    *count = w;
    return 0;
}

static int fq_collect(fq_t *q, const char *name, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                      arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    const char **lv = NULL, **rv = NULL;
    size_t ln = 0, rn = 0;
    int rc = name ? querier_label_values(q->o.local, name, ms, n, mint, maxt, a, &lv, &ln, err, errlen)
                  : querier_label_names(q->o.local, ms, n, mint, maxt, a, &lv, &ln, err, errlen);
    if (rc != 0)
        return rc;
    int64_t rmint, rmaxt;
    if (fq_remote_range(q, mint, maxt, &rmint, &rmaxt)) {
        rc = name ? querier_label_values(q->o.remote, name, ms, n, rmint, rmaxt, a, &rv, &rn, err, errlen)
                  : querier_label_names(q->o.remote, ms, n, rmint, rmaxt, a, &rv, &rn, err, errlen);
        if (rc != 0)
            return rc;
    }
    return fq_union(a, lv, ln, rv, rn, out, count);
}

static int fq_label_names(querier_t *qb, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, arena_t *a,
                          const char ***out, size_t *count, char *err, size_t errlen)
{
    return fq_collect((fq_t *)qb, NULL, ms, n, mint, maxt, a, out, count, err, errlen);
}

static int fq_label_values(querier_t *qb, const char *name, const matcher_t *const *ms, size_t n, int64_t mint,
                           int64_t maxt, arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    return fq_collect((fq_t *)qb, name, ms, n, mint, maxt, a, out, count, err, errlen);
}

static void fq_close(querier_t *qb)
{
    fq_t *q = (fq_t *)qb;
    querier_close(q->o.local);
    querier_close(q->o.remote);
    free(q);
}

static const querier_ops_t fq_ops = {
    .select = fq_select, .label_names = fq_label_names, .label_values = fq_label_values, .close = fq_close};

querier_t *querier_fallthrough_new(const querier_fallthrough_opts_t *o)
{
    fq_t *q = calloc(1, sizeof(*q));
    if (!q) {
        querier_close(o->local);
        querier_close(o->remote);
        return NULL;
    }
    q->base.ops = &fq_ops;
    q->o = *o;
    return &q->base;
}
