/*
 * querier_tiered — raw + roll-up + catalog behind one querier (contract and rules in
 * querier_tiered.h).
 *
 * A select builds a plan (which tier, which resolution, the step-mode boundary when asked for), runs the head
 * querier's select (raw series, sorted by labels) and, for history queries, resolves the
 * matchers against the catalog (candidates sorted by labels). querier_set_next merge-joins the
 * two sorted streams: a series in both is one output series; each output series is built
 * lazily from rollup_read (synthetic chunk(s) before the stitch point B) and the head's chunks
 * (from B on), in buffers the set reuses from one series to the next.
 *
 * Per-series costs a history query over many series must not pay: the set reads roll-ups through
 * one rollup_reader (one SQLite read transaction and one set of prepared statements for all its
 * series; series the roll-up tier knows have nothing on disk that old are answered from memory),
 * and catalog candidates that are also in the head take their labels from the head's index
 * (headrefs) instead of a catalog lookup each.
 */
#include "storage/querier_tiered.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/err.h"

#define DEFAULT_LOOKBACK_MS (5 * 60 * 1000LL)

typedef struct {
    querier_t base;
    querier_tiered_opts_t o;
    querier_t *headq;
    matcher_t *all; /* __name__=~".+": every series (the head select needs one matcher) */
} tq_t;

querier_agg_t querier_tiered_agg(const char *f)
{
    if (!f)
        return QUERIER_AGG_LAST;
    static const struct {
        const char *name;
        querier_agg_t agg;
    } tab[] = {
        {"rate", QUERIER_AGG_COUNTER},          {"increase", QUERIER_AGG_COUNTER},
        {"irate", QUERIER_AGG_COUNTER},         {"resets", QUERIER_AGG_COUNTER},
        {"min_over_time", QUERIER_AGG_MIN},     {"max_over_time", QUERIER_AGG_MAX},
        {"sum_over_time", QUERIER_AGG_SUM},     {"count_over_time", QUERIER_AGG_COUNT},
        {"avg_over_time", QUERIER_AGG_MEAN},    {"stddev_over_time", QUERIER_AGG_MEAN},
        {"stdvar_over_time", QUERIER_AGG_MEAN}, {"quantile_over_time", QUERIER_AGG_MEAN},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
        if (strcmp(tab[i].name, f) == 0)
            return tab[i].agg;
    return QUERIER_AGG_LAST;
}

static int64_t floor_to(int64_t t, int64_t res)
{
    int64_t r = t % res;
    return r < 0 ? t - r - res : t - r;
}

/* ---- plan ---------------------------------------------------------------------------------- */

typedef struct {
    bool rollups; /* read roll-ups at all */
    bool step;    /* step mode */
    bool history; /* mint < raw_start: look in the catalog too */
    size_t res_idx;
    int64_t res;
    int64_t boundary; /* step mode: raw samples from here on at the earliest */
    querier_agg_t agg;
} plan_t;

/* Is every window the engine evaluates this selector over whole buckets of width res, for an
 * aggregate that whole buckets answer exactly (min/max/sum/count_over_time)? Then res answers
 * exactly what any finer resolution would, from a fraction of the buckets. The windows are
 * [te - range, te] for te = mint + range, + step, ... up to maxt (the engine selects
 * [start - offset - range, end - offset]); when [mint, maxt] is wider than that (a subquery, a
 * selector used twice with different offsets) or the steps do not land on maxt, the windows are
 * not known here and the answer is no. */
static bool windows_whole(int64_t mint, int64_t maxt, const querier_hints_t *h, querier_agg_t agg, int64_t res)
{
    if (agg != QUERIER_AGG_MIN && agg != QUERIER_AGG_MAX && agg != QUERIER_AGG_SUM && agg != QUERIER_AGG_COUNT)
        return false;
    if (!h || h->range_ms <= 0 || h->range_ms % res != 0 || mint % res != 0)
        return false;
    int64_t te0 = mint + h->range_ms;
    if (maxt == te0)
        return true; /* one window: an instant query, or @ */
    return h->step_ms > 0 && h->step_ms % res == 0 && maxt > te0 && (maxt - te0) % h->step_ms == 0 &&
           maxt - te0 == h->end_ms - h->start_ms;
}

/* Does a window of `range` over buckets of width res still see enough of them? */
static bool range_fits(int64_t range, int64_t res, querier_agg_t agg)
{
    if (range <= 0)
        return res <= DEFAULT_LOOKBACK_MS;
    return range >= (agg == QUERIER_AGG_COUNTER ? 2 * res : res);
}

static void make_plan(tq_t *q, int64_t mint, int64_t maxt, const querier_hints_t *h, plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->agg = querier_tiered_agg(h ? h->func : NULL);
    if (!q->o.rollup)
        return;
    const rollup_resolutions_t *rs = rollup_resolutions(q->o.rollup);
    int64_t now = q->o.now_ms(q->o.ud);
    int64_t raw_start = head_min_valid_time(q->o.head);
    int64_t step = h ? h->step_ms : 0, range = h ? h->range_ms : 0;
    p->history = mint < raw_start;
    for (size_t k = rs->n; k-- > 0;) {
        bool covers = now - rs->v[k].retention_ms <= mint;
        if (covers && h && h->rollup_step && step > 0 && step >= rs->v[k].res_ms &&
            range_fits(range, rs->v[k].res_ms, p->agg)) {
            p->rollups = p->step = true;
            p->res_idx = k;
            break;
        }
    }
    if (!p->step && p->history) {
        size_t pick = rs->n;
        for (size_t k = 0; k < rs->n && pick == rs->n; k++)
            if (now - rs->v[k].retention_ms <= mint && range_fits(range, rs->v[k].res_ms, p->agg))
                pick = k;
        for (size_t k = 0; k < rs->n && pick == rs->n; k++)
            if (now - rs->v[k].retention_ms <= mint)
                pick = k;
        /* Coarser still where that changes nothing: whole windows of an exact aggregate. */
        for (size_t k = rs->n; pick < rs->n && k-- > pick + 1;)
            if (now - rs->v[k].retention_ms <= mint && windows_whole(mint, maxt, h, p->agg, rs->v[k].res_ms)) {
                pick = k;
                break;
            }
        p->rollups = true;
        p->res_idx = pick == rs->n ? rs->n - 1 : pick;
    }
    if (p->rollups) {
        p->res = rs->v[p->res_idx].res_ms;
        p->boundary = p->step ? floor_to(maxt < now ? maxt : now, p->res) : INT64_MIN;
    }
}

/* ---- catalog candidates ---------------------------------------------------------------------- */

typedef struct {
    labels_t labels;
    uint64_t id;
} ccand_t;

typedef struct {
    ccand_t *v;
    size_t n, cap;
} ccands_t;

static bool labels_match(const labels_t *ls, const matcher_t *const *ms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = labels_get(ls, matcher_name(ms[i]));
        if (!matcher_matches(ms[i], v, v ? strlen(v) : 0))
            return false;
    }
    return true;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_ccand(const void *a, const void *b)
{
    return labels_compare(&((const ccand_t *)a)->labels, &((const ccand_t *)b)->labels);
}

/* Where the head keeps series, by id: lets catalog_select take the labels of a catalog id that is
 * also in memory from the head's index instead of a SQLite lookup per series (a 30-day query over
 * 10k active series did 10k of them). Open addressing, power-of-two size, id 0 = empty (ids start
 * at 1). */
typedef struct {
    index_ref_t *v;
    size_t mask;
} headrefs_t;

static size_t headrefs_slot(const headrefs_t *m, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & m->mask;
}

/* The head's series matching ms (n may be 0: every series). Returns 0 or -1 (OOM). */
static int headrefs_build(tq_t *q, const matcher_t *const *ms, size_t n, headrefs_t *m)
{
    index_refs_t refs = {0};
    const matcher_t *all = q->all;
    if (index_select(head_index(q->o.head), n ? ms : &all, n ? n : 1, &refs) != INDEX_OK) {
        index_refs_free(&refs);
        return -1;
    }
    size_t size = 16;
    while (size < 2 * refs.n)
        size *= 2;
    m->v = calloc(size, sizeof(*m->v));
    m->mask = size - 1;
    for (size_t i = 0; m->v && i < refs.n; i++) {
        size_t k = headrefs_slot(m, refs.v[i].id);
        while (m->v[k].id != 0 && m->v[k].id != refs.v[i].id)
            k = (k + 1) & m->mask;
        m->v[k] = refs.v[i];
    }
    index_refs_free(&refs);
    return m->v ? 0 : -1;
}

/* Labels of series id from the head, in arena a, if it is there. */
static bool headrefs_labels(tq_t *q, const headrefs_t *m, uint64_t id, arena_t *a, labels_t *out)
{
    if (!m || !m->v)
        return false;
    size_t k = headrefs_slot(m, id);
    while (m->v[k].id != 0 && m->v[k].id != id)
        k = (k + 1) & m->mask;
    if (m->v[k].id != id)
        return false;
    index_t *ix = head_index(q->o.head);
    index_series_t *is = index_acquire_ref(ix, &m->v[k]); /* NULL if it left the head since */
    if (!is)
        return false;
    index_series_labels_copy(ix, is, a, out);
    index_release(ix, is);
    return true;
}

/* Series in the catalog seen within [mint, maxt] that match every matcher (n may be 0), labels
 * in arena a (from the head where hr has the id, else from the catalog), sorted by labels.
 * Returns 0 or -1. */
static int catalog_select(tq_t *q, const headrefs_t *hr, const matcher_t *const *ms, size_t n, int64_t mint,
                          int64_t maxt, arena_t *a, ccands_t *out)
{
    catalog_t *cat = q->o.cat;
    catalog_ids_t ids = {0};
    label_t *eq = n ? arena_alloc(a, n * sizeof(label_t)) : NULL;
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        if (matcher_type(ms[i]) == MATCHER_EQ && matcher_value(ms[i])[0])
            eq[k++] = (label_t){matcher_name(ms[i]), matcher_value(ms[i])};
    if (k) {
        rc = catalog_series_by_labels(cat, eq, k, mint, maxt, &ids);
    } else {
        const matcher_t *lit = NULL;
        const char *const *vals = NULL;
        size_t nv = 0;
        for (size_t i = 0; i < n && !lit; i++)
            if (matcher_type(ms[i]) == MATCHER_RE && !matcher_matches_empty(ms[i]) &&
                (nv = matcher_literal_set(ms[i], &vals)) > 0)
                lit = ms[i];
        if (lit) {
            for (size_t j = 0; j < nv && rc == 0; j++) {
                label_t l = {matcher_name(lit), vals[j]};
                rc = catalog_series_by_labels(cat, &l, 1, mint, maxt, &ids);
            }
            if (ids.n > 1) {
                qsort(ids.v, ids.n, sizeof(uint64_t), cmp_u64);
                size_t w = 1;
                for (size_t j = 1; j < ids.n; j++)
                    if (ids.v[j] != ids.v[w - 1])
                        ids.v[w++] = ids.v[j];
                ids.n = w;
            }
        } else {
            const char *name = LABEL_METRIC_NAME; /* every series has one */
            for (size_t i = 0; i < n; i++)
                if (!matcher_matches_empty(ms[i])) {
                    name = matcher_name(ms[i]);
                    break;
                }
            rc = catalog_series_with_name(cat, name, mint, maxt, &ids);
        }
    }
    for (size_t i = 0; i < ids.n && rc == 0; i++) {
        labels_t ls;
        int g = headrefs_labels(q, hr, ids.v[i], a, &ls) ? 0 : catalog_get_labels(cat, ids.v[i], a, &ls);
        if (g < 0)
            rc = -1;
        if (g != 0 || !labels_match(&ls, ms, n))
            continue;
        if (out->n == out->cap) {
            size_t nc = out->cap ? out->cap * 2 : 64;
            ccand_t *p = realloc(out->v, nc * sizeof(*p));
            if (!p) {
                rc = -1;
                break;
            }
            out->v = p;
            out->cap = nc;
        }
        out->v[out->n++] = (ccand_t){ls, ids.v[i]};
    }
    catalog_ids_free(&ids);
    if (rc == 0 && out->n > 1)
        qsort(out->v, out->n, sizeof(ccand_t), cmp_ccand);
    return rc;
}

/* ---- the series set -------------------------------------------------------------------------- */

typedef struct {
    querier_set_t base;
    tq_t *q;
    plan_t plan;
    int64_t mint, maxt;
    querier_set_t *hs;
    const querier_series_t *hcur; /* peeked head series, not yet consumed */
    bool hdone;
    ccands_t cc;
    size_t cpos;
    arena_t *a;
    /* output, reused */
    querier_series_t out;
    querier_chunk_t *ch;
    size_t nch, capch;
    chunk_xor_appender_t *enc; /* chunks encoded for the current series */
    int64_t *enc_mint;
    size_t nenc, capenc;
    rollup_buckets_t bk;
    rollup_reader_t *rd; /* opened at the first roll-up read, closed when the set is exhausted */
    char err[256];
} tset_t;

/* The set's roll-up reader: one SQLite read transaction for all its series. */
static int tset_read(tset_t *s, uint64_t id, size_t res_idx, int64_t mint, int64_t maxt)
{
    if (!s->rd && !(s->rd = rollup_reader_open(s->q->o.rollup)))
        return -1;
    return rollup_reader_read(s->rd, id, res_idx, mint, maxt, &s->bk);
}

static void enc_reset(tset_t *s)
{
    for (size_t i = 0; i < s->nenc; i++)
        chunk_xor_appender_free(&s->enc[i]);
    s->nenc = 0;
}

/* Appends (t, v) to the current encoded chunk, starting a new one every CHUNK_XOR_MAX_SAMPLES
 * (the size Prometheus cuts at, which remote-read clients expect). */
static int enc_append(tset_t *s, bool new_chunk, int64_t t, double v)
{
    if (new_chunk || s->nenc == 0 || chunk_xor_num(&s->enc[s->nenc - 1]) >= CHUNK_XOR_MAX_SAMPLES) {
        if (s->nenc == s->capenc) {
            size_t nc = s->capenc ? s->capenc * 2 : 8;
            chunk_xor_appender_t *p = realloc(s->enc, nc * sizeof(*p));
            if (!p)
                return -1;
            s->enc = p;
            int64_t *m = realloc(s->enc_mint, nc * sizeof(*m));
            if (!m)
                return -1;
            s->enc_mint = m;
            s->capenc = nc;
        }
        if (chunk_xor_appender_init(&s->enc[s->nenc]) < 0)
            return -1;
        s->enc_mint[s->nenc++] = t;
    }
    return chunk_xor_append(&s->enc[s->nenc - 1], t, v);
}

static int ch_push(tset_t *s, querier_chunk_t c)
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

static double agg_value(const rollup_bucket_t *b, querier_agg_t agg)
{
    switch (agg) {
    case QUERIER_AGG_MEAN: return b->count ? b->sum / (double)b->count : NAN;
    case QUERIER_AGG_MIN: return b->min;
    case QUERIER_AGG_MAX: return b->max;
    case QUERIER_AGG_SUM: return b->sum;
    case QUERIER_AGG_COUNT: return (double)b->count;
    default: return b->last;
    }
}

/* The id of the series with labels ls: the head's, else the catalog's exact match. */
static bool lookup_id(tq_t *q, const labels_t *ls, arena_t *a, uint64_t *id)
{
    index_t *ix = head_index(q->o.head);
    index_series_t *is = index_acquire(ix, ls, labels_hash(ls));
    if (is) {
        *id = index_series_id(is);
        index_release(ix, is);
        return true;
    }
    if (!q->o.cat || ls->n == 0)
        return false;
    catalog_ids_t ids = {0};
    bool found = false;
    if (catalog_series_by_labels(q->o.cat, ls->v, ls->n, INT64_MIN, INT64_MAX, &ids) == 0) {
        for (size_t i = 0; i < ids.n && !found; i++) {
            labels_t got;
            if (catalog_get_labels(q->o.cat, ids.v[i], a, &got) == 0 && labels_equal(&got, ls)) {
                *id = ids.v[i];
                found = true;
            }
        }
    }
    catalog_ids_free(&ids);
    return found;
}

/* Builds s->out from raw series h (may be NULL) and/or catalog id. 1 = has data, 0 = empty,
 * -1 = error (s->err set). */
static int build(tset_t *s, const querier_series_t *h, const labels_t *ls, bool have_id, uint64_t id)
{
    enc_reset(s);
    s->nch = 0;
    s->out = (querier_series_t){.labels = *ls};
    if (!s->plan.rollups) {
        if (!h)
            return 0;
        s->out.chunks = h->chunks;
        s->out.nchunks = h->nchunks;
        return h->nchunks > 0;
    }
    const int64_t res = s->plan.res;
    int64_t B = h && h->nchunks ? h->chunks[0].mint : INT64_MAX;
    if (s->plan.step && B != INT64_MAX && B < s->plan.boundary)
        B = s->plan.boundary;

    /* Roll-ups: buckets whose synthetic sample (ts + res - 1) is in [mint, maxt] and that end at
     * or before B. */
    if (B > s->mint) {
        if (!have_id)
            have_id = lookup_id(s->q, ls, s->a, &id);
        int64_t lo = s->mint <= INT64_MIN + res ? INT64_MIN : s->mint - res + 1;
        int64_t hi = s->maxt >= INT64_MAX - res ? INT64_MAX : s->maxt - res + 1;
        if (B != INT64_MAX && B - res < hi)
            hi = B - res;
        s->bk.n = 0;
        if (have_id && lo <= hi && tset_read(s, id, s->plan.res_idx, lo, hi) != 0) {
            snprintf(s->err, sizeof(s->err), "reading roll-ups of series %llu failed", (unsigned long long)id);
            return -1;
        }
        /* The tail: a coarse bucket that B cuts is left out whole, and the raw samples start
         * only at B: the finest buckets fill [floor(B), B), or up to a coarse bucket of data
         * (45 minutes of a 1h bucket) would be missing at the stitch. */
        size_t ncoarse = s->bk.n;
        int64_t fres = 0;
        const rollup_resolutions_t *rs = rollup_resolutions(s->q->o.rollup);
        int64_t Bc = B != INT64_MAX ? floor_to(B, res) : B;
        if (have_id && Bc != B && s->plan.res_idx > 0 && s->q->o.now_ms(s->q->o.ud) - rs->v[0].retention_ms <= Bc) {
            fres = rs->v[0].res_ms;
            int64_t flo = s->mint <= INT64_MIN + fres ? INT64_MIN : s->mint - fres + 1;
            int64_t fhi = s->maxt >= INT64_MAX - fres ? INT64_MAX : s->maxt - fres + 1;
            if (flo < Bc)
                flo = Bc;
            if (B - fres < fhi)
                fhi = B - fres;
            if (flo <= fhi && tset_read(s, id, 0, flo, fhi) != 0) {
                snprintf(s->err, sizeof(s->err), "reading roll-ups of series %llu failed", (unsigned long long)id);
                return -1;
            }
        }
        if (have_id && s->bk.n) {
            const rollup_bucket_t *b = s->bk.v;
            size_t n = s->bk.n;
            double c = 0;
            if (s->plan.agg == QUERIER_AGG_COUNTER) {
                /* Anchor: the synthetic counter ends at the real last value, so it joins the raw
                 * samples after B without a false reset. */
                if (!isnan(b[n - 1].last)) {
                    c = b[n - 1].last;
                    for (size_t k = 1; k < n; k++)
                        c -= b[k].increase;
                } else {
                    c = b[0].increase;
                }
            }
            for (size_t k = 0; k < n; k++) {
                if (s->plan.agg == QUERIER_AGG_COUNTER && k > 0)
                    c += b[k].increase;
                double v = s->plan.agg == QUERIER_AGG_COUNTER ? c : agg_value(&b[k], s->plan.agg);
                if (enc_append(s, false, b[k].ts + (k < ncoarse ? res : fres) - 1, v) < 0)
                    goto oom;
            }
            s->out.rollup_until = b[n - 1].ts + (n - 1 < ncoarse ? res : fres);
            s->out.rollup_res_ms = res;
        }
    }

    /* Raw: samples at or after B. Only a chunk straddling B is re-encoded. */
    size_t first_pass = h ? h->nchunks : 0;
    if (h) {
        for (size_t i = 0; i < h->nchunks; i++) {
            const querier_chunk_t *c = &h->chunks[i];
            if (c->maxt < B)
                continue;
            if (c->mint >= B) {
                first_pass = i;
                break;
            }
            chunk_iter_t it;
            chunk_iter_init(&it, c->enc, c->bytes, c->len);
            int64_t t;
            double v;
            bool first = true;
            while (chunk_iter_next(&it, &t, &v)) {
                if (t < B)
                    continue;
                if (enc_append(s, first, t, v) < 0)
                    goto oom;
                first = false;
            }
        }
    }
    for (size_t i = 0; i < s->nenc; i++) {
        size_t len;
        const uint8_t *bytes = chunk_xor_bytes(&s->enc[i], &len);
        if (ch_push(s, (querier_chunk_t){.mint = s->enc_mint[i], .maxt = s->enc[i].t, .bytes = bytes, .len = len}) < 0)
            goto oom;
    }
    for (size_t i = first_pass; h && i < h->nchunks; i++)
        if (ch_push(s, h->chunks[i]) < 0)
            goto oom;
    s->out.chunks = s->ch;
    s->out.nchunks = s->nch;
    return s->nch > 0;
oom:
    snprintf(s->err, sizeof(s->err), "out of memory reading series");
    return -1;
}

static const querier_series_t *tset_next(querier_set_t *base)
{
    tset_t *s = (tset_t *)base;
    while (!s->err[0]) {
        if (!s->hcur && !s->hdone) {
            s->hcur = querier_set_next(s->hs);
            if (!s->hcur) {
                s->hdone = true;
                const char *e = querier_set_error(s->hs);
                if (e) {
                    snprintf(s->err, sizeof(s->err), "%s", e);
                    return NULL;
                }
            }
        }
        const ccand_t *c = s->cpos < s->cc.n ? &s->cc.v[s->cpos] : NULL;
        if (!s->hcur && !c) {
            rollup_reader_close(s->rd); /* ends its transaction now, not when the engine frees us */
            s->rd = NULL;
            return NULL;
        }
        int cmp = !s->hcur ? 1 : !c ? -1 : labels_compare(&s->hcur->labels, &c->labels);
        const querier_series_t *h = NULL;
        const labels_t *ls = NULL;
        if (cmp <= 0) {
            h = s->hcur;
            ls = &h->labels;
            s->hcur = NULL; /* its memory stays valid until the head set moves on: our next call */
        }
        if (cmp >= 0) {
            s->cpos++;
            if (!ls)
                ls = &c->labels;
        }
        int rc = build(s, h, ls, cmp >= 0, cmp >= 0 ? c->id : 0);
        if (rc < 0)
            return NULL;
        if (rc > 0)
            return &s->out;
    }
    return NULL;
}

static const char *tset_error(querier_set_t *base)
{
    tset_t *s = (tset_t *)base;
    return s->err[0] ? s->err : NULL;
}

static void tset_free(querier_set_t *base)
{
    tset_t *s = (tset_t *)base;
    querier_set_free(s->hs);
    enc_reset(s);
    free(s->enc);
    free(s->enc_mint);
    free(s->ch);
    free(s->cc.v);
    rollup_buckets_free(&s->bk);
    rollup_reader_close(s->rd);
    arena_destroy(s->a);
    free(s);
}

/* Every output series takes its labels from the head set's series or from the catalog candidates
 * (in s->a): stable as long as the head set's are. */
static bool tset_labels_stable(querier_set_t *base)
{
    return querier_set_labels_stable(((tset_t *)base)->hs);
}

static const querier_set_ops_t tset_ops = {
    .next = tset_next, .error = tset_error, .free = tset_free, .labels_stable = tset_labels_stable};

static querier_set_t *tq_select(querier_t *qb, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                                const querier_hints_t *hints)
{
    tq_t *q = (tq_t *)qb;
    tset_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->base.ops = &tset_ops;
    s->q = q;
    s->mint = mint;
    s->maxt = maxt;
    s->a = arena_create(0);
    make_plan(q, mint, maxt, hints, &s->plan);
    if (!s->a) {
        free(s);
        return NULL;
    }
    s->hs = querier_select(q->headq, ms, n, mint, maxt, hints);
    if (!s->hs) {
        arena_destroy(s->a);
        free(s);
        return NULL;
    }
    if (s->plan.history && q->o.cat) {
        headrefs_t hr = {0};
        if (headrefs_build(q, ms, n, &hr) != 0 || catalog_select(q, &hr, ms, n, mint, maxt, s->a, &s->cc) != 0)
            snprintf(s->err, sizeof(s->err), "looking up series in the catalog failed");
        free(hr.v);
    }
    return &s->base;
}

/* ---- label names / values -------------------------------------------------------------------- */

typedef struct {
    const char **v;
    size_t n, cap;
} strs_t;

static int strs_push(strs_t *st, const char *x)
{
    if (st->n == st->cap) {
        size_t nc = st->cap ? st->cap * 2 : 64;
        const char **p = realloc(st->v, nc * sizeof(*p));
        if (!p)
            return -1;
        st->v = p;
        st->cap = nc;
    }
    st->v[st->n++] = x;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* name == NULL: label names; else values of label `name`. */
static int collect(tq_t *q, const char *name, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                   arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    strs_t st = {0};
    int rc = 0;
    head_t *hd = q->o.head;
    head_stats_t hs;
    head_get_stats(hd, &hs);
    if (hs.series && maxt >= hs.min_t && mint <= hs.max_t) {
        if (mint <= hs.min_t && maxt >= hs.max_t) {
            /* The range covers all the head holds: the index answers directly. */
            const char **v;
            size_t c;
            int irc = name ? index_label_values(head_index(hd), name, ms, n, a, &v, &c)
                           : index_label_names(head_index(hd), ms, n, a, &v, &c);
            rc = irc == INDEX_OK ? 0 : -1;
            for (size_t i = 0; i < c && rc == 0; i++)
                rc = strs_push(&st, v[i]);
        } else {
            /* Only the series with data in range. */
            const matcher_t **m2 = arena_alloc(a, (n + 2) * sizeof(*m2));
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                m2[k++] = ms[i];
            char e[128];
            matcher_t *has = name ? matcher_new(MATCHER_RE, name, ".+", e, sizeof(e)) : NULL;
            if (has)
                m2[k++] = has;
            if (k == 0)
                m2[k++] = q->all;
            querier_set_t *set = querier_select(q->headq, m2, k, mint, maxt, NULL);
            const querier_series_t *sr;
            while (set && rc == 0 && (sr = querier_set_next(set))) {
                for (size_t i = 0; i < sr->labels.n && rc == 0; i++) {
                    if (!name)
                        rc = strs_push(&st, arena_strdup(a, sr->labels.v[i].name));
                    else if (strcmp(sr->labels.v[i].name, name) == 0)
                        rc = strs_push(&st, arena_strdup(a, sr->labels.v[i].value));
                }
            }
            if (!set || querier_set_error(set))
                rc = -1;
            querier_set_free(set);
            matcher_free(has);
        }
    }
    if (rc == 0 && q->o.cat && mint < head_min_valid_time(hd)) {
        if (n == 0) {
            const char **v;
            size_t c;
            rc = name ? catalog_label_values(q->o.cat, name, mint, maxt, a, &v, &c)
                      : catalog_label_names(q->o.cat, mint, maxt, a, &v, &c);
            for (size_t i = 0; rc == 0 && i < c; i++)
                rc = strs_push(&st, v[i]);
        } else {
            ccands_t cc = {0};
            rc = catalog_select(q, NULL, ms, n, mint, maxt, a, &cc);
            for (size_t j = 0; rc == 0 && j < cc.n; j++) {
                const labels_t *ls = &cc.v[j].labels;
                for (size_t i = 0; i < ls->n && rc == 0; i++) {
                    if (!name)
                        rc = strs_push(&st, ls->v[i].name);
                    else if (strcmp(ls->v[i].name, name) == 0)
                        rc = strs_push(&st, ls->v[i].value);
                }
            }
            free(cc.v);
        }
    }
    if (rc != 0) {
        free(st.v);
        err_setf(err, errlen, "reading label names/values failed");
        return -1;
    }
    if (st.n > 1)
        qsort(st.v, st.n, sizeof(char *), cmp_str);
    const char **res = arena_alloc(a, (st.n ? st.n : 1) * sizeof(char *));
    size_t w = 0;
    for (size_t i = 0; i < st.n; i++)
        if (w == 0 || strcmp(res[w - 1], st.v[i]) != 0)
            res[w++] = st.v[i];
    free(st.v);
    *out = res;
    *count = w;
    return 0;
}

static int tq_label_names(querier_t *qb, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, arena_t *a,
                          const char ***out, size_t *count, char *err, size_t errlen)
{
    return collect((tq_t *)qb, NULL, ms, n, mint, maxt, a, out, count, err, errlen);
}

static int tq_label_values(querier_t *qb, const char *name, const matcher_t *const *ms, size_t n, int64_t mint,
                           int64_t maxt, arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    return collect((tq_t *)qb, name, ms, n, mint, maxt, a, out, count, err, errlen);
}

static void tq_close(querier_t *qb)
{
    tq_t *q = (tq_t *)qb;
    querier_close(q->headq);
    matcher_free(q->all);
    free(q);
}

static const querier_ops_t tq_ops = {
    .select = tq_select, .label_names = tq_label_names, .label_values = tq_label_values, .close = tq_close};

querier_t *querier_tiered_new(const querier_tiered_opts_t *o)
{
    tq_t *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->base.ops = &tq_ops;
    q->o = *o;
    char err[64];
    q->headq = head_querier(o->head);
    q->all = matcher_new(MATCHER_RE, LABEL_METRIC_NAME, ".+", err, sizeof(err));
    if (!q->headq || !q->all) {
        querier_close(q->headq);
        matcher_free(q->all);
        free(q);
        return NULL;
    }
    return &q->base;
}
