/*
 * engine — PromQL evaluation (see engine.h for the design). This file owns the query entry
 * points, selector loading and the evaluation of every node kind except function bodies
 * (functions.c) and aggregations (aggregators.c).
 *
 * Time windows (Prometheus 2.42, all in milliseconds, both ends inclusive):
 *   instant selector at t   newest sample in [te - lookback, te], dropped if it is a stale
 *                           marker, where te = (@ time or t) - offset
 *   range selector at t     samples in [te - range, te], stale markers removed
 *   subquery at t           the inner expression evaluated at every multiple of the step in
 *                           [te - range, te]
 *
 * Memory: loaded series live in a data arena for the query, their samples as the store's XOR
 * chunks (decoded per series by the series-major evaluation, all at once by the step-wise one);
 * every step allocates in a scratch arena reset after the step; results are deep-copied into the
 * result's arena.
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "internal/promql/engine_int.h"
#include "internal/util/clock.h"
#include "internal/util/hashmap.h"
#include "internal/util/parse.h"

#define DEFAULT_LOOKBACK_MS (5 * 60 * 1000)
#define DEFAULT_MAX_SAMPLES 50000000
#define DEFAULT_SUBQ_STEP_MS (60 * 1000)

/* ---- small utilities ------------------------------------------------------------------------ */

double promql_stale_nan(void)
{
    uint64_t b = PROMQL_STALE_NAN_BITS;
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

int promql_is_stale_nan(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof(b));
    return b == PROMQL_STALE_NAN_BITS;
}

const char *promql_errkind_name(promql_errkind_t k)
{
    switch (k) {
    case PROMQL_ERR_BAD_DATA: return "bad_data";
    case PROMQL_ERR_EXECUTION: return "execution";
    case PROMQL_ERR_TIMEOUT: return "timeout";
    case PROMQL_ERR_CANCELED: return "canceled";
    case PROMQL_ERR_INTERNAL: return "internal";
    case PROMQL_ERR_UNAVAILABLE: return "unavailable";
    default: return "";
    }
}

_Noreturn void pq_errorf(pq_ctx_t *c, promql_errkind_t k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    c->err_kind = k;
    longjmp(c->jb, 1);
}

/* A block of the query's memory was refused before it was allocated (arena budgets). */
_Noreturn static void memory_refused(pq_ctx_t *c, const arena_budget_t *refused)
{
    if (refused == &c->budget)
        pq_errorf(c, PROMQL_ERR_EXECUTION,
                  "query processing would use more than %zu bytes of memory (--query.max-memory-per-query)",
                  c->budget.limit);
    if (refused)
        pq_errorf(c, PROMQL_ERR_UNAVAILABLE,
                  "the queries running now hold all of the query memory budget (%zu bytes, --query.max-memory); "
                  "try again later",
                  refused->limit);
    pq_errorf(c, PROMQL_ERR_INTERNAL, "out of memory");
}

static void on_arena_refused(void *ctx, const arena_budget_t *refused, size_t want)
{
    (void)want;
    memory_refused(ctx, refused);
}

/* Makes arena a charge the query's budget; a refusal unwinds the evaluation. */
static void budget_arena(pq_ctx_t *c, arena_t *a)
{
    if (!a)
        pq_errorf(c, PROMQL_ERR_INTERNAL, "out of memory");
    if (arena_set_budget(a, &c->budget, on_arena_refused, c) < 0)
        memory_refused(c, &c->budget);
}

/* An arena that lives past the current step, destroyed by owned_release or at the query's end
 * (also when an error unwinds the evaluation). */
typedef struct pq_owned_arena {
    arena_t *a;
    struct pq_owned_arena *next;
} pq_owned_arena_t;

arena_t *pq_owned_create(pq_ctx_t *c)
{
    pq_owned_arena_t *o = malloc(sizeof(*o));
    arena_t *a = arena_create(0);
    if (!o || !a) {
        free(o);
        arena_destroy(a);
        pq_errorf(c, PROMQL_ERR_INTERNAL, "out of memory");
    }
    o->a = a;
    o->next = c->owned;
    c->owned = o;
    budget_arena(c, a);
    return a;
}

/* Hands a back to the caller, who destroys it. */
static arena_t *owned_steal(pq_ctx_t *c, arena_t *a)
{
    for (pq_owned_arena_t **p = &c->owned; *p; p = &(*p)->next) {
        if ((*p)->a == a) {
            pq_owned_arena_t *o = *p;
            *p = o->next;
            free(o);
            return a;
        }
    }
    assert(!"arena not owned by the query");
    return a;
}

void pq_owned_release(pq_ctx_t *c, arena_t *a)
{
    arena_destroy(owned_steal(c, a));
}

static void owned_release_all(pq_ctx_t *c)
{
    while (c->owned)
        pq_owned_release(c, c->owned->a);
}

void pq_check_interrupt(pq_ctx_t *c)
{
    if (c->cancel && *c->cancel)
        pq_errorf(c, PROMQL_ERR_CANCELED, "query was canceled in expression evaluation");
    if (c->deadline_ns && clock_mono_ns() > c->deadline_ns)
        pq_errorf(c, PROMQL_ERR_TIMEOUT, "query timed out in expression evaluation");
}

void pq_count_samples(pq_ctx_t *c, int64_t n)
{
    c->cur_samples += n;
    if (c->cur_samples > c->peak_samples)
        c->peak_samples = c->cur_samples;
    if (c->cur_samples > c->max_samples)
        pq_errorf(c, PROMQL_ERR_EXECUTION,
                  "query processing would load too many samples into memory in query execution");
    if ((++c->tick & 1023) == 0)
        pq_check_interrupt(c);
}

void pq_vec_push(pq_ctx_t *c, pq_vec_t *v, labels_t m, int64_t t, double val)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        promql_sample_t *ns = arena_alloc(c->sa, nc * sizeof(*ns));
        if (v->n)
            memcpy(ns, v->v, v->n * sizeof(*ns));
        v->v = ns;
        v->cap = nc;
    }
    v->v[v->n++] = (promql_sample_t){m, t, val};
    pq_count_samples(c, 1);
}

static void mat_push(pq_ctx_t *c, pq_mat_t *m, labels_t metric, const promql_point_t *p, size_t n)
{
    if (m->n == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 8;
        pq_mseries_t *ns = arena_alloc(c->sa, nc * sizeof(*ns));
        if (m->n)
            memcpy(ns, m->v, m->n * sizeof(*ns));
        m->v = ns;
        m->cap = nc;
    }
    m->v[m->n++] = (pq_mseries_t){metric, p, n, 0};
    pq_count_samples(c, (int64_t)n);
}

/* ---- labels --------------------------------------------------------------------------------- */

static labels_t labels_alloc(pq_ctx_t *c, size_t n)
{
    labels_t r = {arena_alloc(c->sa, (n ? n : 1) * sizeof(label_t)), 0};
    return r;
}

labels_t pq_labels_drop_name(pq_ctx_t *c, labels_t ls)
{
    /* Label sets are sorted and never written once built, so where __name__ comes first (every
     * name but upper-case ones sorts after it) the rest is a view of the same array: a range
     * function over tens of thousands of series then copies no label arrays. */
    if (ls.n && strcmp(ls.v[0].name, LABEL_METRIC_NAME) == 0)
        return (labels_t){ls.v + 1, ls.n - 1};
    for (size_t i = 0; i < ls.n; i++) {
        if (strcmp(ls.v[i].name, LABEL_METRIC_NAME) == 0) {
            labels_t r = labels_alloc(c, ls.n);
            for (size_t j = 0; j < ls.n; j++)
                if (j != i)
                    r.v[r.n++] = ls.v[j];
            return r;
        }
    }
    return ls;
}

labels_t pq_labels_set(pq_ctx_t *c, labels_t ls, const char *name, const char *value)
{
    labels_t r = labels_alloc(c, ls.n + 1);
    bool done = false;
    for (size_t i = 0; i < ls.n; i++) {
        int cmp = strcmp(ls.v[i].name, name);
        if (!done && cmp >= 0) {
            if (value[0])
                r.v[r.n++] = (label_t){name, value};
            done = true;
            if (cmp == 0)
                continue;
        }
        r.v[r.n++] = ls.v[i];
    }
    if (!done && value[0])
        r.v[r.n++] = (label_t){name, value};
    return r;
}

static bool in_names(const char *n, const char *const *names, size_t k)
{
    for (size_t i = 0; i < k; i++)
        if (strcmp(n, names[i]) == 0)
            return true;
    return false;
}

labels_t pq_labels_del(pq_ctx_t *c, labels_t ls, const char *const *names, size_t n)
{
    labels_t r = labels_alloc(c, ls.n);
    for (size_t i = 0; i < ls.n; i++)
        if (!in_names(ls.v[i].name, names, n))
            r.v[r.n++] = ls.v[i];
    return r;
}

labels_t pq_labels_keep(pq_ctx_t *c, labels_t ls, const char *const *names, size_t n)
{
    labels_t r = labels_alloc(c, ls.n);
    for (size_t i = 0; i < ls.n; i++)
        if (in_names(ls.v[i].name, names, n))
            r.v[r.n++] = ls.v[i];
    return r;
}

/* Open-addressing set/map keyed by 64-bit hashes (values: int). */
/* Which budget refused the block an arena_try_alloc just failed to get (NULL: malloc failed). */
static const arena_budget_t *refusal_of(const pq_ctx_t *c)
{
    return atomic_load(&c->budget.refused) ? &c->budget : c->budget.parent;
}

/* Label-set hash -> index tables of one evaluation: util/hashmap in the step arena. The map
 * allocates with arena_try_alloc, so a refused block comes back as a failure here: the budget
 * said no (or malloc did). */
static void hmap_oom(pq_ctx_t *c)
{
    memory_refused(c, refusal_of(c));
}

void pq_hmap_init(pq_ctx_t *c, hashmap_t *m, size_t expect)
{
    hashmap_init(m, c->sa, HASHMAP_HASHED_KEYS);
    if (hashmap_reserve(m, expect) < 0)
        hmap_oom(c);
}

/* Key's value, inserting v if absent (*existed says which). */
uint64_t *pq_hmap_put(pq_ctx_t *c, hashmap_t *m, uint64_t k, uint64_t v, bool *existed)
{
    uint64_t *p = hashmap_upsert(m, k, v, existed);
    if (!p)
        hmap_oom(c);
    return p;
}

bool pq_vec_has_dup_labelsets(pq_ctx_t *c, const pq_vec_t *v)
{
    if (v->n < 2)
        return false;
    hashmap_t m;
    pq_hmap_init(c, &m, v->n);
    for (size_t i = 0; i < v->n; i++) {
        bool ex;
        pq_hmap_put(c, &m, labels_hash(&v->v[i].metric), i, &ex);
        if (ex)
            return true;
    }
    return false;
}

static void check_dups(pq_ctx_t *c, const pq_vec_t *v)
{
    if (pq_vec_has_dup_labelsets(c, v))
        pq_errorf(c, PROMQL_ERR_EXECUTION, "vector cannot contain metrics with the same labelset");
}

/* Prometheus' Labels.String(): {a="b", c="d"}. */
static const char *labels_str(pq_ctx_t *c, labels_t ls)
{
    buf_t b = BUF_INIT;
    buf_putc(&b, '{');
    for (size_t i = 0; i < ls.n; i++) {
        if (i)
            buf_puts(&b, ", ");
        buf_printf(&b, "%s=\"%s\"", ls.v[i].name, ls.v[i].value);
    }
    buf_putc(&b, '}');
    char *s = arena_strdup(c->sa, b.data);
    buf_free(&b);
    return s;
}

/* ---- selectors ------------------------------------------------------------------------------ */

int64_t pq_resolve_at(const pq_ctx_t *c, promql_at_t at, int64_t at_ms, int64_t t)
{
    switch (at) {
    case PROMQL_AT_TS: return at_ms;
    case PROMQL_AT_START: return c->start;
    case PROMQL_AT_END: return c->end;
    default: return t;
    }
}

typedef struct {
    const promql_expr_t **nodes; /* by selector id */
    const char **funcs;          /* enclosing function by selector id */
} prep_t;

static void prepare(pq_ctx_t *c, prep_t *pp, const promql_expr_t *e, int64_t s, int64_t en, const char *fn)
{
    switch (e->kind) {
    case PROMQL_NODE_VECTOR_SEL:
    case PROMQL_NODE_MATRIX_SEL: {
        int64_t bs = s, be = en;
        if (e->u.sel.at != PROMQL_AT_NONE)
            bs = be = pq_resolve_at(c, e->u.sel.at, e->u.sel.at_ms, s);
        bs -= e->u.sel.offset_ms;
        be -= e->u.sel.offset_ms;
        int64_t mint = bs - (e->kind == PROMQL_NODE_MATRIX_SEL ? e->u.sel.range_ms : c->lookback);
        pq_seldata_t *sd = &c->sel[e->u.sel.id];
        if (!sd->needed) {
            sd->needed = true;
            sd->mint = mint;
            sd->maxt = be;
        } else {
            if (mint < sd->mint)
                sd->mint = mint;
            if (be > sd->maxt)
                sd->maxt = be;
        }
        pp->nodes[e->u.sel.id] = e;
        pp->funcs[e->u.sel.id] = fn;
        return;
    }
    case PROMQL_NODE_SUBQUERY: {
        int64_t bs = s, be = en;
        if (e->u.subq.at != PROMQL_AT_NONE)
            bs = be = pq_resolve_at(c, e->u.subq.at, e->u.subq.at_ms, s);
        bs -= e->u.subq.offset_ms;
        be -= e->u.subq.offset_ms;
        prepare(c, pp, e->u.subq.expr, bs - e->u.subq.range_ms, be, NULL);
        return;
    }
    case PROMQL_NODE_PAREN: prepare(c, pp, e->u.paren.expr, s, en, fn); return;
    case PROMQL_NODE_UNARY: prepare(c, pp, e->u.unary.expr, s, en, NULL); return;
    case PROMQL_NODE_BINARY:
        prepare(c, pp, e->u.bin.lhs, s, en, NULL);
        prepare(c, pp, e->u.bin.rhs, s, en, NULL);
        return;
    case PROMQL_NODE_AGG:
        if (e->u.agg.param)
            prepare(c, pp, e->u.agg.param, s, en, NULL);
        prepare(c, pp, e->u.agg.expr, s, en, NULL);
        return;
    case PROMQL_NODE_CALL:
        for (size_t i = 0; i < e->u.call.nargs; i++)
            prepare(c, pp, e->u.call.args[i], s, en, e->u.call.func->name);
        return;
    default: return;
    }
}

/* Do two of the selector's series differ only in __name__? Only then can a function that drops
 * the name make one labelset of two series (range_dups_note). Series with one name cannot. */
static bool has_name_dups(pq_ctx_t *c, const pq_seldata_t *sd)
{
    if (sd->n < 2)
        return false;
    const char *first = labels_get(&sd->s[0].metric, LABEL_METRIC_NAME);
    size_t i = 1;
    while (i < sd->n) {
        const char *nm = labels_get(&sd->s[i].metric, LABEL_METRIC_NAME);
        if (!first || !nm || strcmp(first, nm) != 0)
            break;
        i++;
    }
    if (i == sd->n)
        return false;
    hashmap_t m;
    pq_hmap_init(c, &m, sd->n);
    for (i = 0; i < sd->n; i++) {
        bool ex;
        labels_t ls = pq_labels_drop_name(c, sd->s[i].metric);
        pq_hmap_put(c, &m, labels_hash(&ls), i, &ex);
        if (ex)
            return true;
    }
    return false;
}

/* Keeps a set's warnings (a remote store that failed in warn mode) for the result, each once. */
static void note_set_warnings(pq_ctx_t *c, querier_set_t *set)
{
    const char *const *w;
    size_t n = querier_set_warnings(set, &w);
    for (size_t i = 0; i < n; i++) {
        bool dup = false;
        for (size_t k = 0; k < c->nset_warnings && !dup; k++)
            dup = strcmp(c->set_warnings[k], w[i]) == 0;
        if (!dup && c->nset_warnings < PQ_MAX_SET_WARNINGS)
            c->set_warnings[c->nset_warnings++] = arena_strdup(c->qa, w[i]);
    }
}

/* A selector's set kept open while its series' labels are in use (querier_set_labels_stable). */
typedef struct pq_open_set {
    querier_set_t *set;
    struct pq_open_set *next;
} pq_open_set_t;

static void open_sets_free(pq_ctx_t *c)
{
    while (c->open_sets) {
        pq_open_set_t *os = c->open_sets;
        c->open_sets = os->next;
        querier_set_free(os->set);
        free(os);
    }
}

static void load_selectors(pq_ctx_t *c, arena_t *da)
{
    int n = c->ast->nselectors;
    if (n == 0)
        return;
    prep_t pp;
    pp.nodes = arena_calloc(c->sa, (size_t)n, sizeof(*pp.nodes));
    pp.funcs = arena_calloc(c->sa, (size_t)n, sizeof(*pp.funcs));
    prepare(c, &pp, c->ast->root, c->start, c->end, NULL);
    for (int id = 0; id < n; id++) {
        pq_seldata_t *sd = &c->sel[id];
        if (!sd->needed)
            continue;
        const promql_expr_t *e = pp.nodes[id];
        querier_hints_t h = {c->start,     c->end,
                             c->interval,  e->kind == PROMQL_NODE_MATRIX_SEL ? e->u.sel.range_ms : 0,
                             pp.funcs[id], c->rollup_step};
        sd->func = pp.funcs[id];
        querier_set_t *set = querier_select(c->q, (const matcher_t *const *)e->u.sel.matchers, e->u.sel.nmatchers,
                                            sd->mint, sd->maxt, &h);
        if (!set)
            pq_errorf(c, PROMQL_ERR_INTERNAL, "out of memory selecting series");
        size_t cap = 0;
        const querier_series_t *qs;
        /* Each series keeps its chunks (copied: the set reuses its buffers) from the one holding
         * its first sample in [mint, maxt] up to the last one starting before maxt; series with no
         * sample there are left out. Nothing here may unwind while the set is open: a refusal
         * breaks out, closes it, then raises the error. */
        const arena_budget_t *refused = NULL;
        bool failed = false;
        /* labels the set keeps until it is freed are used where they are, the set kept open */
        bool keep = querier_set_labels_stable(set);
        pq_open_set_t *os = keep ? malloc(sizeof(*os)) : NULL;
        if (keep && !os)
            keep = false;
        while (!failed && (qs = querier_set_next(set)) != NULL) {
            querier_iter_t it;
            querier_iter_init(&it, qs, sd->mint, sd->maxt);
            int64_t t;
            double v;
            if (!querier_iter_next(&it, &t, &v))
                continue;
            size_t c0 = it.ci, c1 = c0 + 1, cbytes = 0;
            while (c1 < qs->nchunks && qs->chunks[c1].mint <= sd->maxt)
                c1++;
            for (size_t k = c0; k < c1; k++)
                cbytes += qs->chunks[k].len;
            if (sd->n == cap) {
                size_t ncap = cap ? cap * 2 : 16;
                pq_sseries_t *ns = arena_try_alloc(da, ncap * sizeof(*ns));
                if (!ns) {
                    refused = refusal_of(c);
                    failed = true;
                    break;
                }
                if (sd->n)
                    memcpy(ns, sd->s, sd->n * sizeof(*ns));
                sd->s = ns;
                cap = ncap;
            }
            pq_sseries_t *ss = &sd->s[sd->n];
            memset(ss, 0, sizeof(*ss));
            ss->metric.n = qs->labels.n;
            /* the label set in one piece: the label_t array, then every name and value; the
             * chunks likewise: their descriptors, then their bytes */
            size_t lbytes = (qs->labels.n ? qs->labels.n : 1) * sizeof(label_t);
            for (size_t i = 0; !keep && i < qs->labels.n; i++)
                lbytes += strlen(qs->labels.v[i].name) + strlen(qs->labels.v[i].value) + 2;
            ss->metric.v = keep ? qs->labels.v : arena_try_alloc(da, lbytes);
            querier_chunk_t *ch = arena_try_alloc(da, (c1 - c0) * sizeof(*ch) + cbytes);
            bool ok = ss->metric.v && ch;
            char *str = ok && !keep ? (char *)(ss->metric.v + (qs->labels.n ? qs->labels.n : 1)) : NULL;
            for (size_t i = 0; ok && !keep && i < qs->labels.n; i++) {
                size_t nl = strlen(qs->labels.v[i].name) + 1, vl = strlen(qs->labels.v[i].value) + 1;
                memcpy(str, qs->labels.v[i].name, nl);
                memcpy(str + nl, qs->labels.v[i].value, vl);
                ss->metric.v[i].name = str;
                ss->metric.v[i].value = str + nl;
                str += nl + vl;
            }
            if (!ok) {
                refused = refusal_of(c);
                failed = true;
                break;
            }
            uint8_t *bytes = (uint8_t *)(ch + (c1 - c0));
            for (size_t k = c0; k < c1; k++) {
                ch[k - c0] = qs->chunks[k];
                memcpy(bytes, qs->chunks[k].bytes, qs->chunks[k].len);
                ch[k - c0].bytes = bytes;
                bytes += qs->chunks[k].len;
            }
            ss->chunks = ch;
            ss->nchunks = c1 - c0;
            ss->rollup_until = qs->rollup_until;
            ss->rollup_res = qs->rollup_res_ms;
            sd->n++;
        }
        if (!failed)
            sd->name_dups = has_name_dups(c, sd);
        const char *qerr = failed ? NULL : querier_set_error(set);
        if (qerr) {
            char m[400];
            snprintf(m, sizeof(m), "%s", qerr);
            /* A remote store's failure (fall-through, fail mode) is Prometheus' 422 / 503. */
            querier_err_kind_t qk = querier_set_error_kind(set);
            free(os);
            querier_set_free(set);
            if (qk == QUERIER_ERR_REMOTE)
                pq_errorf(c, PROMQL_ERR_EXECUTION, "expanding series: %s", m);
            if (qk == QUERIER_ERR_UNAVAILABLE)
                pq_errorf(c, PROMQL_ERR_UNAVAILABLE, "expanding series: %s", m);
            pq_errorf(c, PROMQL_ERR_INTERNAL, "%s", m);
        }
        if (!failed)
            note_set_warnings(c, set);
        if (keep && !failed) {
            os->set = set;
            os->next = c->open_sets;
            c->open_sets = os;
        } else {
            free(os);
            querier_set_free(set);
        }
        if (failed)
            memory_refused(c, refused);
    }
}

size_t pq_sseries_bound(const pq_sseries_t *ss)
{
    size_t n = 0;
    for (size_t k = 0; k < ss->nchunks; k++) {
        const querier_chunk_t *ch = &ss->chunks[k];
        if (ch->len < CHUNK_XOR_HEADER_BYTES)
            continue;
        /* the header's count, but an XOR sample after the first takes at least 2 bits: a chunk
         * from a remote store cannot make this allocate more than its bytes justify (the head's
         * integer chunks, which can hold samples in no bits, never come from outside) */
        size_t num = ((size_t)ch->bytes[0] << 8) | ch->bytes[1];
        size_t most = 1 + (ch->len - CHUNK_XOR_HEADER_BYTES) * 4;
        n += num < most || ch->enc == CHUNK_ENC_INT ? num : most;
    }
    return n;
}

size_t pq_sseries_decode(const pq_seldata_t *sd, const pq_sseries_t *ss, bool drop_stale, promql_point_t *out,
                         size_t most, bool *has_stale)
{
    querier_series_t qs = {.chunks = ss->chunks, .nchunks = ss->nchunks};
    querier_iter_t it;
    querier_iter_init(&it, &qs, sd->mint, sd->maxt);
    size_t n = 0;
    bool stale = false;
    int64_t t;
    double v;
    while (n < most && querier_iter_next(&it, &t, &v)) {
        if (promql_is_stale_nan(v)) {
            stale = true;
            if (drop_stale)
                continue;
        }
        out[n++] = (promql_point_t){t, v};
    }
    if (has_stale)
        *has_stale = stale;
    return n;
}

/* The step-wise evaluation reads every series' samples at every step: decodes them all once. */
static void materialize_selectors(pq_ctx_t *c, arena_t *da)
{
    for (int id = 0; id < c->ast->nselectors; id++) {
        pq_seldata_t *sd = &c->sel[id];
        for (size_t i = 0; i < sd->n; i++) {
            pq_sseries_t *ss = &sd->s[i];
            if (ss->pts)
                continue;
            size_t most = pq_sseries_bound(ss);
            ss->pts = arena_alloc(da, (most + 1) * sizeof(promql_point_t));
            ss->n = pq_sseries_decode(sd, ss, false, ss->pts, most, &ss->has_stale);
        }
    }
}

/* Index of the last point with t <= ts, or -1. */
ssize_t pq_last_le(const promql_point_t *p, size_t n, int64_t ts)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p[mid].t <= ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ssize_t)lo - 1;
}

/* Index of the first point with t >= ts. */
size_t pq_first_ge(const promql_point_t *p, size_t n, int64_t ts)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p[mid].t < ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A step read roll-up samples of a series (bucket width res, synthetic before `until`) through
 * the window [te - range, te] (range 0: a plain selector's lookback). Notes whether that is exact:
 * min/max/sum/count_over_time see exactly the raw samples' aggregate when the window starts on a
 * bucket boundary and either ends on one too or reaches into the raw samples after `until` (a
 * bucket's sample sits at its last millisecond, so a window [kR, mR] holds buckets k..m-1: the
 * raw [kR, mR); only a raw sample at exactly mR is missing). Everything else (values at a time,
 * means, quantiles, rate's extrapolation from bucket ends, unaligned windows) is approximate.
 * docs/storage-rollups.md has the table. */
void pq_note_rollups(pq_ctx_t *c, const char *func, int64_t range, int64_t te, int64_t res, int64_t until)
{
    static const char *const exact[] = {"min_over_time", "max_over_time", "sum_over_time", "count_over_time"};
    c->rollups_used = true;
    if (res > c->rollup_res)
        c->rollup_res = res;
    if (c->rollups_approx)
        return;
    bool ok = false;
    for (size_t i = 0; func && range > 0 && res > 0 && i < sizeof(exact) / sizeof(exact[0]); i++)
        if (strcmp(func, exact[i]) == 0)
            ok = range % res == 0 && (te - range) % res == 0 && (te % res == 0 || te >= until);
    if (!ok)
        c->rollups_approx = true;
}

static pq_val_t eval_vector_sel(pq_ctx_t *c, const promql_expr_t *e, int64_t t, bool keep_ts)
{
    pq_val_t r = {.type = PROMQL_VT_VECTOR};
    int64_t te = pq_resolve_at(c, e->u.sel.at, e->u.sel.at_ms, t) - e->u.sel.offset_ms;
    const pq_seldata_t *sd = &c->sel[e->u.sel.id];
    for (size_t i = 0; i < sd->n; i++) {
        const pq_sseries_t *s = &sd->s[i];
        ssize_t k = pq_last_le(s->pts, s->n, te);
        if (k < 0 || s->pts[k].t < te - c->lookback || promql_is_stale_nan(s->pts[k].v))
            continue;
        if (s->pts[k].t < s->rollup_until)
            pq_note_rollups(c, NULL, 0, te, s->rollup_res, s->rollup_until);
        pq_vec_push(c, &r.vec, s->metric, keep_ts ? s->pts[k].t : t, s->pts[k].v);
    }
    return r;
}

static pq_val_t eval_matrix_sel(pq_ctx_t *c, const promql_expr_t *e, int64_t t)
{
    pq_val_t r = {.type = PROMQL_VT_MATRIX};
    int64_t te = pq_resolve_at(c, e->u.sel.at, e->u.sel.at_ms, t) - e->u.sel.offset_ms;
    int64_t ts = te - e->u.sel.range_ms;
    r.range_ms = e->u.sel.range_ms;
    r.win_end = te;
    const pq_seldata_t *sd = &c->sel[e->u.sel.id];
    for (size_t i = 0; i < sd->n; i++) {
        const pq_sseries_t *s = &sd->s[i];
        size_t lo = pq_first_ge(s->pts, s->n, ts);
        ssize_t hi = pq_last_le(s->pts, s->n, te);
        if (hi < (ssize_t)lo)
            continue;
        size_t n = (size_t)hi - lo + 1;
        const promql_point_t *p = s->pts + lo;
        if (s->has_stale) {
            promql_point_t *f = arena_alloc(c->sa, n * sizeof(*f));
            size_t k = 0;
            for (size_t j = 0; j < n; j++)
                if (!promql_is_stale_nan(p[j].v))
                    f[k++] = p[j];
            if (k == 0)
                continue;
            p = f;
            n = k;
        }
        mat_push(c, &r.mat, s->metric, p, n);
        r.mat.v[r.mat.n - 1].rollup_until = s->rollup_until;
        if (p[0].t < s->rollup_until)
            pq_note_rollups(c, sd->func, e->u.sel.range_ms, te, s->rollup_res, s->rollup_until);
    }
    return r;
}

/* ---- subqueries ----------------------------------------------------------------------------- */

typedef struct {
    labels_t metric;
    promql_point_t *p;
    size_t n, cap;
} acc_series_t;

typedef struct {
    acc_series_t *s;
    size_t n, cap;
    hashmap_t idx;
} acc_t;

static void acc_init(pq_ctx_t *c, acc_t *a)
{
    memset(a, 0, sizeof(*a));
    pq_hmap_init(c, &a->idx, 16);
}

static void acc_push(arena_t *ar, acc_series_t *s, int64_t t, double v)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        promql_point_t *np = arena_alloc(ar, nc * sizeof(*np));
        if (s->n)
            memcpy(np, s->p, s->n * sizeof(*np));
        s->p = np;
        s->cap = nc;
    }
    s->p[s->n++] = (promql_point_t){t, v};
}

/* Appends (t, v) to the series m (created if new); returns its index in a. */
static int acc_add(pq_ctx_t *c, arena_t *ar, acc_t *a, labels_t m, int64_t t, double v, bool copy_labels)
{
    bool ex;
    uint64_t *slot = pq_hmap_put(c, &a->idx, labels_hash(&m), a->n, &ex);
    acc_series_t *s;
    if (!ex) {
        if (a->n == a->cap) {
            size_t nc = a->cap ? a->cap * 2 : 16;
            acc_series_t *ns = arena_alloc(ar, nc * sizeof(*ns));
            if (a->n)
                memcpy(ns, a->s, a->n * sizeof(*ns));
            a->s = ns;
            a->cap = nc;
        }
        s = &a->s[a->n++];
        memset(s, 0, sizeof(*s));
        if (copy_labels) {
            s->metric.n = m.n;
            s->metric.v = arena_alloc(ar, (m.n ? m.n : 1) * sizeof(label_t));
            for (size_t i = 0; i < m.n; i++) {
                s->metric.v[i].name = arena_strdup(ar, m.v[i].name);
                s->metric.v[i].value = arena_strdup(ar, m.v[i].value);
            }
        } else {
            s->metric = m;
        }
    } else {
        s = &a->s[*slot];
    }
    acc_push(ar, s, t, v);
    return (int)(s - a->s);
}

/* Subquery cache. In a range query, consecutive outer steps ask for almost the same inner
 * steps (the window slides by one outer step), and an inner step's value depends only on its own
 * time. So each subquery node keeps the inner values it computed, keyed by time, in its own arena
 * (the step arena is reset after every outer step): entries older than the current window are
 * dropped, and the arena is rebuilt once dropped entries outweigh the live ones. Instant queries
 * evaluate each subquery once and skip the cache. */
typedef struct {
    int64_t ts;
    pq_val_t v; /* SCALAR or VECTOR; samples and labels live in the cache's arena */
} subq_ent_t;

typedef struct pq_subq_cache {
    const promql_expr_t *e;
    arena_t *a;
    subq_ent_t *ent; /* live entries are ent[head, n), sorted by ts */
    size_t head, n, cap;
    struct pq_subq_cache *next;
} pq_subq_cache_t;

static pq_subq_cache_t *subq_cache_get(pq_ctx_t *c, const promql_expr_t *e)
{
    for (pq_subq_cache_t *sc = c->subq_caches; sc; sc = sc->next)
        if (sc->e == e)
            return sc;
    pq_subq_cache_t *sc = arena_calloc(c->qa, 1, sizeof(*sc));
    sc->e = e;
    sc->a = arena_create(0);
    if (!sc->a)
        abort();
    sc->next = c->subq_caches;
    c->subq_caches = sc;
    budget_arena(c, sc->a);
    return sc;
}

static void subq_caches_free(pq_ctx_t *c)
{
    for (pq_subq_cache_t *sc = c->subq_caches; sc; sc = sc->next)
        arena_destroy(sc->a);
    c->subq_caches = NULL;
}

/* Copies v into arena a; labels equal to those at the same index of `prev` are shared. */
static pq_val_t subq_copy(arena_t *a, const pq_val_t *v, const pq_val_t *prev)
{
    pq_val_t r = {.type = v->type, .scalar = v->scalar};
    if (v->type != PROMQL_VT_VECTOR)
        return r;
    r.vec.n = r.vec.cap = v->vec.n;
    r.vec.v = arena_alloc(a, (v->vec.n ? v->vec.n : 1) * sizeof(promql_sample_t));
    for (size_t i = 0; i < v->vec.n; i++) {
        r.vec.v[i] = v->vec.v[i];
        if (prev && i < prev->vec.n && labels_equal(&prev->vec.v[i].metric, &v->vec.v[i].metric))
            r.vec.v[i].metric = prev->vec.v[i].metric;
        else
            r.vec.v[i].metric = pq_copy_labels(a, v->vec.v[i].metric);
    }
    return r;
}

static const pq_val_t *subq_cache_find(pq_subq_cache_t *sc, int64_t ts)
{
    size_t lo = sc->head, hi = sc->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sc->ent[mid].ts < ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < sc->n && sc->ent[lo].ts == ts ? &sc->ent[lo].v : NULL;
}

static void subq_cache_evict(pq_ctx_t *c, pq_subq_cache_t *sc, int64_t before)
{
    while (sc->head < sc->n && sc->ent[sc->head].ts < before)
        sc->head++;
    size_t live = sc->n - sc->head;
    if (sc->head < 64 || sc->head < live)
        return;
    /* dropped entries outweigh live ones: move the live ones to a fresh arena */
    arena_t *na = pq_owned_create(c);
    size_t cap = live * 2 + 16;
    subq_ent_t *ne = arena_alloc(na, cap * sizeof(*ne));
    for (size_t i = 0; i < live; i++) {
        ne[i].ts = sc->ent[sc->head + i].ts;
        ne[i].v = subq_copy(na, &sc->ent[sc->head + i].v, i ? &ne[i - 1].v : NULL);
    }
    arena_destroy(sc->a);
    sc->a = owned_steal(c, na); /* freed with the caches from here */
    sc->ent = ne;
    sc->head = 0;
    sc->n = live;
    sc->cap = cap;
}

static void subq_cache_put(pq_subq_cache_t *sc, int64_t ts, const pq_val_t *v)
{
    if (v->type != PROMQL_VT_SCALAR && v->type != PROMQL_VT_VECTOR)
        return;
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 64;
        subq_ent_t *ne = arena_alloc(sc->a, cap * sizeof(*ne));
        if (sc->n > sc->head)
            memcpy(ne, sc->ent + sc->head, (sc->n - sc->head) * sizeof(*ne));
        sc->n -= sc->head;
        sc->head = 0;
        sc->ent = ne;
        sc->cap = cap;
    }
    size_t pos = sc->n; /* usually appended: inner times grow */
    while (pos > sc->head && sc->ent[pos - 1].ts > ts)
        pos--;
    memmove(sc->ent + pos + 1, sc->ent + pos, (sc->n - pos) * sizeof(*sc->ent));
    sc->ent[pos].ts = ts;
    sc->ent[pos].v = subq_copy(sc->a, v, pos > sc->head ? &sc->ent[pos - 1].v : NULL);
    sc->n++;
}

/* Inner steps are gathered into an arena of the subquery's own, and the scratch each inner
 * evaluation used is rewound once its values are gathered: memory follows the gathered samples,
 * not every temporary of every inner step. Gathered samples count against max_samples as they
 * grow (as Prometheus counts a subquery's matrix); a step's temporaries count only while it
 * runs. */
static pq_val_t eval_subquery(pq_ctx_t *c, const promql_expr_t *e, int64_t t)
{
    pq_val_t r = {.type = PROMQL_VT_MATRIX};
    int64_t te = pq_resolve_at(c, e->u.subq.at, e->u.subq.at_ms, t) - e->u.subq.offset_ms;
    int64_t step = e->u.subq.step_ms ? e->u.subq.step_ms : c->subq_step;
    int64_t from = te - e->u.subq.range_ms;
    /* first multiple of step >= from (Go's truncating division, then round up) */
    int64_t first = step * (from / step);
    if (first < from)
        first += step;
    r.range_ms = e->u.subq.range_ms;
    r.win_end = te;
    pq_subq_cache_t *sc = c->interval > 0 ? subq_cache_get(c, e) : NULL;
    if (sc)
        subq_cache_evict(c, sc, first);
    arena_t *ga = pq_owned_create(c);
    arena_t *keep = c->sa;
    c->sa = ga; /* the gathering index grows in ga */
    acc_t acc;
    acc_init(c, &acc);
    c->sa = keep;
    int64_t base = c->cur_samples, gathered = 0;
    /* With the cache, values come from its arena, where an inner step shares label arrays with
     * its predecessor: the same label pointer at the same index is the same series. Fresh values
     * point into the rewound scratch, so there the labels are compared instead. */
    const label_t **prev_l = NULL;
    int *prev_slot = NULL;
    size_t prev_n = 0, prev_cap = 0;
    for (int64_t ts = first; ts <= te; ts += step) {
        arena_mark_t mark = arena_mark(c->sa);
        c->cur_samples = base + gathered;
        const pq_val_t *cv = sc ? subq_cache_find(sc, ts) : NULL;
        pq_val_t v;
        if (cv) {
            v = *cv;
        } else {
            v = pq_eval(c, e->u.subq.expr, ts);
            if (sc) {
                subq_cache_put(sc, ts, &v);
                cv = subq_cache_find(sc, ts);
                if (cv)
                    v = *cv;
            }
        }
        bool stable = cv != NULL;
        if (v.type == PROMQL_VT_SCALAR) {
            labels_t none = {NULL, 0};
            acc_add(c, ga, &acc, none, ts, v.scalar, false);
            gathered++;
        } else {
            if (v.vec.n > prev_cap) {
                prev_cap = v.vec.n * 2;
                prev_l = arena_alloc(ga, prev_cap * sizeof(*prev_l));
                prev_slot = arena_alloc(ga, prev_cap * sizeof(*prev_slot));
                prev_n = 0; /* the old pairs are not carried over: those series are hashed once */
            }
            for (size_t i = 0; i < v.vec.n; i++) {
                const promql_sample_t *smp = &v.vec.v[i];
                const label_t *lv = smp->metric.v;
                bool same = i < prev_n &&
                            (stable ? lv && prev_l[i] == lv : labels_equal(&acc.s[prev_slot[i]].metric, &smp->metric));
                if (same) {
                    acc_push(ga, &acc.s[prev_slot[i]], ts, smp->v);
                } else {
                    prev_slot[i] = acc_add(c, ga, &acc, smp->metric, ts, smp->v, !stable);
                }
                prev_l[i] = stable ? lv : NULL;
            }
            prev_n = v.vec.n;
            gathered += (int64_t)v.vec.n;
        }
        arena_rewind(c->sa, mark);
        c->cur_samples = base;
        pq_count_samples(c, gathered);
    }
    /* The result goes to the caller's scratch; ga's copy and its growth garbage are dropped. */
    c->cur_samples = base;
    for (size_t i = 0; i < acc.n; i++) {
        promql_point_t *p = arena_alloc(c->sa, (acc.s[i].n ? acc.s[i].n : 1) * sizeof(*p));
        memcpy(p, acc.s[i].p, acc.s[i].n * sizeof(*p));
        mat_push(c, &r.mat, pq_copy_labels(c->sa, acc.s[i].metric), p, acc.s[i].n);
    }
    pq_owned_release(c, ga);
    return r;
}

/* ---- binary operators ----------------------------------------------------------------------- */

double pq_elem_binop(promql_op_t op, double l, double r, bool *keep)
{
    *keep = true;
    switch (op) {
    case PROMQL_OP_ADD: return l + r;
    case PROMQL_OP_SUB: return l - r;
    case PROMQL_OP_MUL: return l * r;
    case PROMQL_OP_DIV: return l / r;
    case PROMQL_OP_POW: return pow(l, r);
    case PROMQL_OP_MOD: return fmod(l, r);
    case PROMQL_OP_ATAN2: return atan2(l, r);
    case PROMQL_OP_EQLC: *keep = l == r; return l;
    case PROMQL_OP_NEQ: *keep = l != r; return l;
    case PROMQL_OP_GTR: *keep = l > r; return l;
    case PROMQL_OP_LSS: *keep = l < r; return l;
    case PROMQL_OP_GTE: *keep = l >= r; return l;
    case PROMQL_OP_LTE: *keep = l <= r; return l;
    default: return NAN;
    }
}

bool pq_op_drops_name(promql_op_t op)
{
    return op == PROMQL_OP_ADD || op == PROMQL_OP_SUB || op == PROMQL_OP_MUL || op == PROMQL_OP_DIV ||
           op == PROMQL_OP_POW || op == PROMQL_OP_MOD;
}

/* Matching signature: hash of the `on` labels, or of all labels but the `ignoring` ones and
 * __name__. */
static uint64_t signature(pq_ctx_t *c, labels_t ls, bool on, const promql_strlist_t *names)
{
    label_t stackbuf[32];
    labels_t k = {ls.n <= 32 ? stackbuf : arena_alloc(c->sa, ls.n * sizeof(label_t)), 0};
    for (size_t i = 0; i < ls.n; i++) {
        bool listed = in_names(ls.v[i].name, names->names, names->n);
        if (on ? listed : (!listed && strcmp(ls.v[i].name, LABEL_METRIC_NAME) != 0))
            k.v[k.n++] = ls.v[i];
    }
    return labels_hash(&k);
}

static labels_t result_metric(pq_ctx_t *c, const promql_expr_t *e, labels_t l, labels_t r)
{
    labels_t m = l;
    if (pq_op_drops_name(e->u.bin.op))
        m = pq_labels_drop_name(c, m);
    if (e->u.bin.card == PROMQL_CARD_ONE_TO_ONE) {
        if (e->u.bin.on)
            m = pq_labels_keep(c, m, e->u.bin.labels.names, e->u.bin.labels.n);
        else
            m = pq_labels_del(c, m, e->u.bin.labels.names, e->u.bin.labels.n);
    }
    for (size_t i = 0; i < e->u.bin.include.n; i++) {
        const char *ln = e->u.bin.include.names[i];
        const char *v = labels_get(&r, ln);
        m = pq_labels_set(c, m, ln, v ? v : "");
    }
    return m;
}

static void vector_binop(pq_ctx_t *c, const promql_expr_t *e, pq_vec_t *lhs, pq_vec_t *rhs, int64_t t, pq_vec_t *out)
{
    promql_card_t card = e->u.bin.card;
    bool on = e->u.bin.on;
    const promql_strlist_t *names = &e->u.bin.labels;
    /* Nothing can match, and Prometheus returns before looking for duplicate match groups: an
     * empty side must not turn the other side's duplicates into an error. */
    if (lhs->n == 0 || rhs->n == 0)
        return;
    if (card == PROMQL_CARD_ONE_TO_MANY) {
        pq_vec_t *tmp = lhs;
        lhs = rhs;
        rhs = tmp;
    }
    hashmap_t right;
    pq_hmap_init(c, &right, rhs->n);
    for (size_t i = 0; i < rhs->n; i++) {
        bool ex;
        uint64_t *slot = pq_hmap_put(c, &right, signature(c, rhs->v[i].metric, on, names), i, &ex);
        if (ex) {
            const char *side = card == PROMQL_CARD_ONE_TO_MANY ? "left" : "right";
            labels_t ml = on ? pq_labels_keep(c, rhs->v[i].metric, names->names, names->n)
                             : pq_labels_del(c, pq_labels_drop_name(c, rhs->v[i].metric), names->names, names->n);
            pq_errorf(c, PROMQL_ERR_EXECUTION,
                      "found duplicate series for the match group %s on the %s hand-side of the operation: "
                      "[%s, %s];many-to-many matching not allowed: matching labels must be unique on one side",
                      labels_str(c, ml), side, labels_str(c, rhs->v[i].metric), labels_str(c, rhs->v[*slot].metric));
        }
    }
    hashmap_t matched;
    pq_hmap_init(c, &matched, lhs->n);
    for (size_t i = 0; i < lhs->n; i++) {
        const promql_sample_t *ls = &lhs->v[i];
        uint64_t sig = signature(c, ls->metric, on, names);
        uint64_t *ri = hashmap_get(&right, sig);
        if (!ri)
            continue;
        const promql_sample_t *rs = &rhs->v[*ri];
        double vl = ls->v, vr = rs->v;
        if (card == PROMQL_CARD_ONE_TO_MANY) {
            double x = vl;
            vl = vr;
            vr = x;
        }
        bool keep;
        double val = pq_elem_binop(e->u.bin.op, vl, vr, &keep);
        if (e->u.bin.return_bool)
            val = keep ? 1.0 : 0.0;
        else if (!keep)
            continue;
        labels_t m = result_metric(c, e, ls->metric, rs->metric);
        if (e->u.bin.return_bool)
            m = pq_labels_drop_name(c, m);
        bool ex;
        if (card == PROMQL_CARD_ONE_TO_ONE) {
            pq_hmap_put(c, &matched, sig, 0, &ex);
            if (ex)
                pq_errorf(
                    c, PROMQL_ERR_EXECUTION,
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)");
        } else {
            uint64_t k = sig ^ (labels_hash(&m) * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL);
            pq_hmap_put(c, &matched, k, 0, &ex);
            if (ex)
                pq_errorf(c, PROMQL_ERR_EXECUTION,
                          "multiple matches for labels: grouping labels must ensure unique matches");
        }
        pq_vec_push(c, out, m, t, val);
    }
}

static void set_binop(pq_ctx_t *c, const promql_expr_t *e, pq_vec_t *lhs, pq_vec_t *rhs, pq_vec_t *out)
{
    bool on = e->u.bin.on;
    const promql_strlist_t *names = &e->u.bin.labels;
    hashmap_t set;
    switch (e->u.bin.op) {
    case PROMQL_OP_AND:
        pq_hmap_init(c, &set, rhs->n);
        for (size_t i = 0; i < rhs->n; i++)
            pq_hmap_put(c, &set, signature(c, rhs->v[i].metric, on, names), 0, NULL);
        for (size_t i = 0; i < lhs->n; i++)
            if (hashmap_has(&set, signature(c, lhs->v[i].metric, on, names)))
                pq_vec_push(c, out, lhs->v[i].metric, lhs->v[i].t, lhs->v[i].v);
        break;
    case PROMQL_OP_OR:
        pq_hmap_init(c, &set, lhs->n);
        for (size_t i = 0; i < lhs->n; i++) {
            pq_hmap_put(c, &set, signature(c, lhs->v[i].metric, on, names), 0, NULL);
            pq_vec_push(c, out, lhs->v[i].metric, lhs->v[i].t, lhs->v[i].v);
        }
        for (size_t i = 0; i < rhs->n; i++)
            if (!hashmap_has(&set, signature(c, rhs->v[i].metric, on, names)))
                pq_vec_push(c, out, rhs->v[i].metric, rhs->v[i].t, rhs->v[i].v);
        break;
    case PROMQL_OP_UNLESS:
        pq_hmap_init(c, &set, rhs->n);
        for (size_t i = 0; i < rhs->n; i++)
            pq_hmap_put(c, &set, signature(c, rhs->v[i].metric, on, names), 0, NULL);
        for (size_t i = 0; i < lhs->n; i++)
            if (!hashmap_has(&set, signature(c, lhs->v[i].metric, on, names)))
                pq_vec_push(c, out, lhs->v[i].metric, lhs->v[i].t, lhs->v[i].v);
        break;
    default: break;
    }
}

/* The matching above for the series-major evaluator (range_eval.c), so both match alike. */
uint64_t pq_match_signature(pq_ctx_t *c, labels_t ls, bool on, const promql_strlist_t *names)
{
    return signature(c, ls, on, names);
}

labels_t pq_binop_result_metric(pq_ctx_t *c, const promql_expr_t *e, labels_t l, labels_t r)
{
    return result_metric(c, e, l, r);
}

static pq_val_t eval_binary(pq_ctx_t *c, const promql_expr_t *e, int64_t t)
{
    pq_val_t l = pq_eval(c, e->u.bin.lhs, t);
    pq_val_t r = pq_eval(c, e->u.bin.rhs, t);
    promql_op_t op = e->u.bin.op;
    pq_val_t out = {.type = PROMQL_VT_VECTOR};
    if (l.type == PROMQL_VT_SCALAR && r.type == PROMQL_VT_SCALAR) {
        bool keep;
        double v = pq_elem_binop(op, l.scalar, r.scalar, &keep);
        if (e->u.bin.return_bool)
            v = keep ? 1.0 : 0.0;
        out.type = PROMQL_VT_SCALAR;
        out.scalar = v;
        return out;
    }
    if (l.type == PROMQL_VT_VECTOR && r.type == PROMQL_VT_VECTOR) {
        if (promql_op_is_set(op))
            set_binop(c, e, &l.vec, &r.vec, &out.vec);
        else
            vector_binop(c, e, &l.vec, &r.vec, t, &out.vec);
    } else {
        bool swap = l.type == PROMQL_VT_SCALAR;
        pq_vec_t *vec = swap ? &r.vec : &l.vec;
        double sc = swap ? l.scalar : r.scalar;
        for (size_t i = 0; i < vec->n; i++) {
            double lv = vec->v[i].v, rv = sc;
            if (swap) {
                lv = sc;
                rv = vec->v[i].v;
            }
            bool keep;
            double v = pq_elem_binop(op, lv, rv, &keep);
            if (promql_op_is_comparison(op) && swap)
                v = rv;
            if (e->u.bin.return_bool) {
                v = keep ? 1.0 : 0.0;
                keep = true;
            }
            if (!keep)
                continue;
            labels_t m = vec->v[i].metric;
            if (pq_op_drops_name(op) || e->u.bin.return_bool)
                m = pq_labels_drop_name(c, m);
            pq_vec_push(c, &out.vec, m, t, v);
        }
    }
    check_dups(c, &out.vec);
    return out;
}

/* ---- functions ------------------------------------------------------------------------------ */

/* Duplicate labelsets across a whole evaluation. Prometheus 2.42 evaluates a function of a range
 * vector (a matrix selector or a subquery) over the whole query range at once and then refuses
 * the result if two of its series have one labelset ("vector cannot contain metrics with the
 * same labelset") -- even when the two never have a value at the same step, which a per-step
 * check cannot see. So for every such call whose input can collide once __name__ is dropped, this
 * remembers, for the query's lifetime, which input series produced each output labelset. */
typedef struct pq_range_dups {
    const promql_expr_t *e;
    hashmap_t seen; /* labels_hash(output) -> labels_hash(input series) */
    struct pq_range_dups *next;
} pq_range_dups_t;

static void range_dups_note(pq_ctx_t *c, const promql_expr_t *e, labels_t out, labels_t in)
{
    pq_range_dups_t *d = c->range_dups;
    while (d && d->e != e)
        d = d->next;
    if (!d) {
        d = arena_alloc(c->qa, sizeof(*d));
        d->e = e;
        hashmap_init(&d->seen, c->qa, HASHMAP_HASHED_KEYS);
        d->next = c->range_dups;
        c->range_dups = d;
    }
    bool ex;
    uint64_t src = labels_hash(&in);
    uint64_t *p = pq_hmap_put(c, &d->seen, labels_hash(&out), src, &ex);
    if (ex && *p != src)
        pq_errorf(c, PROMQL_ERR_EXECUTION, "vector cannot contain metrics with the same labelset");
}

/* Can the range-vector argument a of a name-dropping function give two series one labelset? */
bool pq_range_arg_may_collide(const pq_ctx_t *c, const promql_expr_t *a)
{
    a = promql_unwrap_parens(a);
    if (a->kind == PROMQL_NODE_MATRIX_SEL)
        return c->sel[a->u.sel.id].name_dups;
    return a->kind == PROMQL_NODE_SUBQUERY;
}

static pq_val_t eval_call(pq_ctx_t *c, const promql_expr_t *e, int64_t t)
{
    const promql_func_t *f = e->u.call.func;
    size_t na = e->u.call.nargs;
    pq_val_t out = {.type = f->ret};
    pq_fcall_t fc = {.call = e, .t = t};

    if (strcmp(f->name, "timestamp") == 0) {
        const promql_expr_t *a = promql_unwrap_parens(e->u.call.args[0]);
        pq_val_t v = a->kind == PROMQL_NODE_VECTOR_SEL ? eval_vector_sel(c, a, t, true) : pq_eval(c, a, t);
        for (size_t i = 0; i < v.vec.n; i++)
            pq_vec_push(c, &out.vec, pq_labels_drop_name(c, v.vec.v[i].metric), t, (double)v.vec.v[i].t / 1000.0);
        check_dups(c, &out.vec);
        return out;
    }

    pq_val_t *args = arena_calloc(c->sa, na ? na : 1, sizeof(*args));
    int mat_idx = -1;
    for (size_t i = 0; i < na; i++) {
        args[i] = pq_eval(c, e->u.call.args[i], t);
        if (args[i].type == PROMQL_VT_SCALAR && i < 4)
            fc.sargs[i] = args[i].scalar;
        if (args[i].type == PROMQL_VT_MATRIX && mat_idx < 0) {
            mat_idx = (int)i;
            fc.range_ms = args[i].range_ms;
            fc.win_end = args[i].win_end;
        }
    }

    if (f->mfn) {
        pq_mat_t *m = &args[mat_idx].mat;
        bool track = !f->keep_name && m->n > 0 && pq_range_arg_may_collide(c, e->u.call.args[mat_idx]);
        for (size_t i = 0; i < m->n; i++) {
            if (m->v[i].n == 0)
                continue;
            double v;
            fc.rollup_until = m->v[i].rollup_until;
            if (!f->mfn(c, &fc, m->v[i].pts, m->v[i].n, &v))
                continue;
            labels_t ls = f->keep_name ? m->v[i].metric : pq_labels_drop_name(c, m->v[i].metric);
            if (track)
                range_dups_note(c, e, ls, m->v[i].metric);
            pq_vec_push(c, &out.vec, ls, t, v);
        }
    } else if (f->efn) {
        pq_vec_t *in = &args[0].vec;
        for (size_t i = 0; i < in->n; i++) {
            labels_t ls = f->keep_name ? in->v[i].metric : pq_labels_drop_name(c, in->v[i].metric);
            pq_vec_push(c, &out.vec, ls, t, f->efn(in->v[i].v));
        }
    } else {
        f->gfn(c, &fc, args, na, &out);
    }
    if (out.type == PROMQL_VT_VECTOR)
        check_dups(c, &out.vec);
    return out;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

pq_val_t pq_eval(pq_ctx_t *c, const promql_expr_t *e, int64_t t)
{
    pq_val_t r = {.type = e->type};
    switch (e->kind) {
    case PROMQL_NODE_NUMBER: r.scalar = e->u.number; return r;
    case PROMQL_NODE_STRING: r.str = e->u.string; return r;
    case PROMQL_NODE_VECTOR_SEL: return eval_vector_sel(c, e, t, false);
    case PROMQL_NODE_MATRIX_SEL: return eval_matrix_sel(c, e, t);
    case PROMQL_NODE_SUBQUERY: return eval_subquery(c, e, t);
    case PROMQL_NODE_PAREN: return pq_eval(c, e->u.paren.expr, t);
    case PROMQL_NODE_UNARY: {
        pq_val_t v = pq_eval(c, e->u.unary.expr, t);
        if (e->u.unary.op != PROMQL_OP_SUB)
            return v;
        if (v.type == PROMQL_VT_SCALAR) {
            v.scalar = -v.scalar;
            return v;
        }
        for (size_t i = 0; i < v.vec.n; i++) {
            v.vec.v[i].metric = pq_labels_drop_name(c, v.vec.v[i].metric);
            v.vec.v[i].v = -v.vec.v[i].v;
        }
        check_dups(c, &v.vec);
        return v;
    }
    case PROMQL_NODE_BINARY: return eval_binary(c, e, t);
    case PROMQL_NODE_AGG: {
        double param = 0;
        const char *sparam = NULL;
        if (e->u.agg.param) {
            pq_val_t p = pq_eval(c, e->u.agg.param, t);
            param = p.scalar;
            sparam = p.str;
        }
        pq_val_t in = pq_eval(c, e->u.agg.expr, t);
        for (size_t i = 0; i < in.vec.n; i++)
            in.vec.v[i].t = t;
        r.type = PROMQL_VT_VECTOR;
        pq_aggregate(c, e, &in.vec, param, sparam, &r.vec);
        for (size_t i = 0; i < r.vec.n; i++)
            r.vec.v[i].t = t;
        return r;
    }
    case PROMQL_NODE_CALL: return eval_call(c, e, t);
    }
    return r;
}

/* ---- entry points --------------------------------------------------------------------------- */

labels_t pq_copy_labels(arena_t *a, labels_t m)
{
    labels_t r = {arena_alloc(a, (m.n ? m.n : 1) * sizeof(label_t)), m.n};
    for (size_t i = 0; i < m.n; i++) {
        r.v[i].name = arena_strdup(a, m.v[i].name);
        r.v[i].value = arena_strdup(a, m.v[i].value);
    }
    return r;
}

static promql_result_t *result_new(void)
{
    promql_result_t *r = calloc(1, sizeof(*r));
    if (!r)
        abort();
    r->arena = arena_create(0);
    if (!r->arena)
        abort();
    return r;
}

void promql_result_free(promql_result_t *r)
{
    if (!r)
        return;
    arena_destroy(r->arena);
    free(r);
}

static int cmp_series(const void *a, const void *b)
{
    const promql_series_t *x = a, *y = b;
    return labels_compare(&x->metric, &y->metric);
}

/* Tells the user (Prometheus' "warnings", which Grafana shows) when roll-ups shaped the answer:
 * always under the step-mode opt-in, else only where note_rollups found it approximate. */
static void add_rollup_warnings(pq_ctx_t *c, promql_result_t *res)
{
    if (!c->rollups_used || (!c->rollup_step && !c->rollups_approx))
        return;
    char w[48];
    format_duration_ms(c->rollup_res, w, sizeof(w));
    char m[400];
    if (c->rollup_step)
        snprintf(m, sizeof(m),
                 "sluice: rollups=step: answered from %s roll-ups at the query step although raw samples exist; "
                 "the result is approximate (docs/storage-rollups.md)",
                 w);
    else
        snprintf(m, sizeof(m),
                 "sluice: part of the range is older than raw retention and was read from %s roll-ups; the result "
                 "is approximate there (exact only for min/max/sum/count_over_time over whole buckets, see "
                 "docs/storage-rollups.md)",
                 w);
    res->warnings[res->nwarnings++] = arena_strdup(res->arena, m);
}

/* Runs the query; interval 0 = instant. */
static promql_result_t *exec(querier_t *q, const promql_ast_t *ast, int64_t start, int64_t end, int64_t interval,
                             const promql_opts_t *o)
{
    promql_result_t *res = result_new();
    promql_opts_t def = {0};
    if (!o)
        o = &def;
    pq_ctx_t *c = calloc(1, sizeof(*c));
    arena_t *da = arena_create(0);
    if (!c || !da)
        abort();
    c->qa = res->arena;
    c->sa = arena_create(0);
    if (!c->sa)
        abort();
    c->q = q;
    c->ast = ast;
    c->start = start;
    c->end = end;
    c->interval = interval;
    c->lookback = o->lookback_ms > 0 ? o->lookback_ms : DEFAULT_LOOKBACK_MS;
    c->subq_step = o->subquery_step_ms > 0 ? o->subquery_step_ms : DEFAULT_SUBQ_STEP_MS;
    c->max_samples = o->max_samples > 0 ? o->max_samples : DEFAULT_MAX_SAMPLES;
    c->cancel = o->cancel;
    if (o->timeout_ms > 0)
        c->deadline_ns = clock_mono_ns() + o->timeout_ms * 1000000;
    c->budget.limit = o->max_memory;
    c->budget.parent = o->budget;
    c->rollup_step = o->rollup_step;
    c->stepwise = o->stepwise;

    if (setjmp(c->jb)) {
        res->err_kind = c->err_kind;
        snprintf(res->err, sizeof(res->err), "%s", c->err);
        goto done;
    }
    budget_arena(c, da);
    budget_arena(c, c->sa);
    budget_arena(c, c->qa);
    c->sel = arena_calloc(da, (size_t)(ast->nselectors ? ast->nselectors : 1), sizeof(pq_seldata_t));
    promql_vtype_t rt = ast->root->type;
    if (interval > 0 && rt != PROMQL_VT_SCALAR && rt != PROMQL_VT_VECTOR)
        pq_errorf(c, PROMQL_ERR_BAD_DATA,
                  "invalid expression type \"%s\" for range query, must be Scalar or instant Vector",
                  promql_vtype_name(rt));
    load_selectors(c, da);
    arena_reset(c->sa);

    promql_value_t *out = &res->value;
    if (interval == 0) {
        materialize_selectors(c, da);
        pq_val_t v = pq_eval(c, ast->root, start);
        out->type = v.type;
        out->t = start;
        switch (v.type) {
        case PROMQL_VT_SCALAR: out->scalar = v.scalar; break;
        case PROMQL_VT_STRING: out->string = arena_strdup(c->qa, v.str); break;
        case PROMQL_VT_VECTOR:
            out->samples = arena_alloc(c->qa, (v.vec.n ? v.vec.n : 1) * sizeof(promql_sample_t));
            out->nsamples = v.vec.n;
            for (size_t i = 0; i < v.vec.n; i++) {
                out->samples[i] = v.vec.v[i];
                out->samples[i].metric = pq_copy_labels(c->qa, v.vec.v[i].metric);
                out->samples[i].t = start;
            }
            break;
        case PROMQL_VT_MATRIX:
            out->series = arena_alloc(c->qa, (v.mat.n ? v.mat.n : 1) * sizeof(promql_series_t));
            out->nseries = v.mat.n;
            for (size_t i = 0; i < v.mat.n; i++) {
                promql_series_t *s = &out->series[i];
                s->metric = pq_copy_labels(c->qa, v.mat.v[i].metric);
                s->npoints = v.mat.v[i].n;
                s->points = arena_alloc(c->qa, (s->npoints ? s->npoints : 1) * sizeof(promql_point_t));
                memcpy(s->points, v.mat.v[i].pts, s->npoints * sizeof(promql_point_t));
            }
            break;
        default: break;
        }
    } else if (!c->stepwise && pq_range_eval(c, res) == 0) {
        res->series_major = true;
    } else {
        materialize_selectors(c, da);
        acc_t acc;
        /* the accumulator and its index must outlive step resets: build it in the data arena */
        arena_t *keep = c->sa;
        c->sa = da;
        acc_init(c, &acc);
        c->sa = keep;
        for (int64_t ts = start; ts <= end; ts += interval) {
            pq_check_interrupt(c);
            c->cur_samples = c->result_samples;
            pq_val_t v = pq_eval(c, ast->root, ts);
            keep = c->sa;
            c->sa = da; /* acc_add may grow the index */
            if (v.type == PROMQL_VT_SCALAR) {
                labels_t none = {NULL, 0};
                acc_add(c, da, &acc, none, ts, v.scalar, true);
                c->result_samples++;
            } else {
                for (size_t i = 0; i < v.vec.n; i++)
                    acc_add(c, da, &acc, v.vec.v[i].metric, ts, v.vec.v[i].v, true);
                c->result_samples += (int64_t)v.vec.n;
            }
            c->sa = keep;
            if (c->result_samples > c->max_samples)
                pq_errorf(c, PROMQL_ERR_EXECUTION,
                          "query processing would load too many samples into memory in query execution");
            arena_reset(c->sa);
        }
        out->type = PROMQL_VT_MATRIX;
        out->series = arena_alloc(c->qa, (acc.n ? acc.n : 1) * sizeof(promql_series_t));
        out->nseries = acc.n;
        for (size_t i = 0; i < acc.n; i++) {
            promql_series_t *s = &out->series[i];
            s->metric = pq_copy_labels(c->qa, acc.s[i].metric);
            s->npoints = acc.s[i].n;
            s->points = arena_alloc(c->qa, s->npoints * sizeof(promql_point_t));
            memcpy(s->points, acc.s[i].p, s->npoints * sizeof(promql_point_t));
        }
        qsort(out->series, out->nseries, sizeof(promql_series_t), cmp_series);
    }
    add_rollup_warnings(c, res);
    for (size_t i = 0; i < c->nset_warnings && res->nwarnings < PROMQL_MAX_WARNINGS; i++)
        res->warnings[res->nwarnings++] = c->set_warnings[i];
done:
    res->peak_samples = c->peak_samples;
    res->peak_memory = atomic_load(&c->budget.peak);
    subq_caches_free(c);
    pq_func_caches_free(c);
    owned_release_all(c);
    arena_destroy(c->sa);
    arena_destroy(da);
    open_sets_free(c); /* after everything that may point at their labels */
    /* the result outlives the query's budget, which lives in c; it is bounded by max_samples */
    (void)arena_set_budget(res->arena, NULL, NULL, NULL);
    assert(atomic_load(&c->budget.used) == 0);
    free(c);
    return res;
}

promql_result_t *promql_exec_instant(querier_t *q, const promql_ast_t *ast, int64_t t_ms, const promql_opts_t *opts)
{
    return exec(q, ast, t_ms, t_ms, 0, opts);
}

promql_result_t *promql_exec_range(querier_t *q, const promql_ast_t *ast, int64_t start_ms, int64_t end_ms,
                                   int64_t step_ms, const promql_opts_t *opts)
{
    if (step_ms <= 0 || end_ms < start_ms) {
        promql_result_t *r = result_new();
        r->err_kind = PROMQL_ERR_BAD_DATA;
        snprintf(r->err, sizeof(r->err), "invalid range: end before start or step <= 0");
        return r;
    }
    return exec(q, ast, start_ms, end_ms, step_ms, opts);
}
