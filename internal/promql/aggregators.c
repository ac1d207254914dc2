/*
 * aggregators — sum, avg, count, min, max, group, stddev, stdvar, topk, bottomk, count_values
 * and quantile over one step's instant vector, with Prometheus 2.42's arithmetic:
 *
 *   - groups are keyed by the `by` labels (or all labels but the `without` ones and __name__) and
 *     come out in the order their first member was seen;
 *   - avg keeps a running mean (with Prometheus' care for infinities), stddev/stdvar use
 *     Welford's update, min/max replace a NaN accumulator;
 *   - topk/bottomk keep a binary heap per group that behaves exactly like Go's container/heap,
 *     then sort it the way Go's sort.Sort does for small inputs (insertion sort), so ties and NaNs
 *     come out in Prometheus' order.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/labels/labels.h"
#include "internal/promql/engine_int.h"

/* ---- Go-compatible sorting ------------------------------------------------------------------ */

static void swap_bytes(char *a, char *b, size_t size)
{
    char tmp[64];
    while (size > 0) {
        size_t k = size < sizeof(tmp) ? size : sizeof(tmp);
        memcpy(tmp, a, k);
        memcpy(a, b, k);
        memcpy(b, tmp, k);
        a += k;
        b += k;
        size -= k;
    }
}

static void merge_sort(char *base, char *tmp, size_t n, size_t size, bool (*less)(const void *, const void *))
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(base, tmp, h, size, less);
    merge_sort(base + h * size, tmp, n - h, size, less);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (less(base + j * size, base + i * size))
            memcpy(tmp + (k++) * size, base + (j++) * size, size);
        else
            memcpy(tmp + (k++) * size, base + (i++) * size, size);
    }
    while (i < h)
        memcpy(tmp + (k++) * size, base + (i++) * size, size);
    while (j < n)
        memcpy(tmp + (k++) * size, base + (j++) * size, size);
    memcpy(base, tmp, n * size);
}

void pq_go_sort(void *base, size_t n, size_t size, bool (*less)(const void *, const void *))
{
    char *b = base;
    if (n <= 12) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && less(b + j * size, b + (j - 1) * size); j--)
                swap_bytes(b + j * size, b + (j - 1) * size, size);
        return;
    }
    char *tmp = malloc(n * size);
    if (!tmp)
        abort();
    merge_sort(b, tmp, n, size, less);
    free(tmp);
}

static int cmp_nan_first(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    bool xn = isnan(x), yn = isnan(y);
    if (xn || yn)
        return xn && yn ? 0 : (xn ? -1 : 1);
    return x < y ? -1 : (x > y ? 1 : 0);
}

double pq_quantile(double q, double *vals, size_t n)
{
    if (n == 0)
        return NAN;
    if (q < 0)
        return -INFINITY;
    if (q > 1)
        return INFINITY;
    qsort(vals, n, sizeof(double), cmp_nan_first);
    double nn = (double)n;
    double rank = q * (nn - 1);
    double lower = fmax(0, floor(rank));
    double upper = fmin(nn - 1, lower + 1);
    double weight = rank - floor(rank);
    return vals[(size_t)lower] * (1 - weight) + vals[(size_t)upper] * weight;
}

/* ---- heaps (Go container/heap) -------------------------------------------------------------- */

typedef struct {
    promql_sample_t *v;
    size_t n, cap;
    bool reverse; /* bottomk: max-heap on value */
} heap_t;

static bool heap_less(const heap_t *h, size_t i, size_t j)
{
    double vi = h->v[i].v, vj = h->v[j].v;
    if (isnan(vi))
        return true;
    return h->reverse ? vi > vj : vi < vj;
}

static void heap_swap(heap_t *h, size_t i, size_t j)
{
    promql_sample_t t = h->v[i];
    h->v[i] = h->v[j];
    h->v[j] = t;
}

static void heap_up(heap_t *h, size_t j)
{
    while (j > 0) {
        size_t i = (j - 1) / 2;
        if (!heap_less(h, j, i))
            break;
        heap_swap(h, i, j);
        j = i;
    }
}

static void heap_down(heap_t *h, size_t i, size_t n)
{
    for (;;) {
        size_t j1 = 2 * i + 1;
        if (j1 >= n)
            break;
        size_t j = j1;
        if (j1 + 1 < n && heap_less(h, j1 + 1, j1))
            j = j1 + 1;
        if (!heap_less(h, j, i))
            break;
        heap_swap(h, i, j);
        i = j;
    }
}

static void heap_push(pq_ctx_t *c, heap_t *h, promql_sample_t s)
{
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 4;
        promql_sample_t *nv = arena_alloc(c->sa, nc * sizeof(*nv));
        if (h->n)
            memcpy(nv, h->v, h->n * sizeof(*nv));
        h->v = nv;
        h->cap = nc;
    }
    h->v[h->n++] = s;
    heap_up(h, h->n - 1);
}

static void heap_pop(heap_t *h)
{
    size_t n = h->n - 1;
    heap_swap(h, 0, n);
    heap_down(h, 0, n);
    h->n--;
}

/* sort.Sort(sort.Reverse(heap)) as Go does it for small n; larger n stable merge. */
static bool rev_less_top(const void *a, const void *b)
{
    /* Reverse(Less)(i, j) = Less(j, i) with Less = NaN-first ascending */
    double vi = ((const promql_sample_t *)b)->v, vj = ((const promql_sample_t *)a)->v;
    if (isnan(vi))
        return true;
    return vi < vj;
}

static bool rev_less_bottom(const void *a, const void *b)
{
    double vi = ((const promql_sample_t *)b)->v, vj = ((const promql_sample_t *)a)->v;
    if (isnan(vi))
        return true;
    return vi > vj;
}

/* ---- aggregation ---------------------------------------------------------------------------- */

typedef struct {
    labels_t labels;
    double value, mean;
    int64_t count; /* 0: no member yet */
    heap_t heap;
    double *qvals;
    size_t nq, capq;
} group_t;

/* The group's first member. */
static void group_first(pq_ctx_t *c, promql_op_t op, group_t *grp, promql_sample_t s)
{
    grp->value = s.v;
    grp->mean = s.v;
    grp->count = 1;
    switch (op) {
    case PROMQL_AGG_STDVAR:
    case PROMQL_AGG_STDDEV: grp->value = 0; break;
    case PROMQL_AGG_TOPK:
    case PROMQL_AGG_BOTTOMK:
        grp->heap.reverse = op == PROMQL_AGG_BOTTOMK;
        heap_push(c, &grp->heap, s);
        break;
    case PROMQL_AGG_QUANTILE:
        grp->capq = 8;
        grp->qvals = arena_alloc(c->sa, grp->capq * sizeof(double));
        grp->qvals[grp->nq++] = s.v;
        break;
    case PROMQL_AGG_GROUP: grp->value = 1; break;
    default: break;
    }
}

/* Every further member, in the vector's order. */
static void group_add(pq_ctx_t *c, promql_op_t op, group_t *grp, promql_sample_t s, int64_t k)
{
    switch (op) {
    case PROMQL_AGG_SUM: grp->value += s.v; break;
    case PROMQL_AGG_AVG:
        grp->count++;
        if (isinf(grp->mean)) {
            if (isinf(s.v) && (grp->mean > 0) == (s.v > 0))
                break;
            if (!isinf(s.v) && !isnan(s.v))
                break;
        }
        grp->mean += s.v / (double)grp->count - grp->mean / (double)grp->count;
        break;
    case PROMQL_AGG_GROUP: break;
    case PROMQL_AGG_MAX:
        if (grp->value < s.v || isnan(grp->value))
            grp->value = s.v;
        break;
    case PROMQL_AGG_MIN:
        if (grp->value > s.v || isnan(grp->value))
            grp->value = s.v;
        break;
    case PROMQL_AGG_COUNT:
    case PROMQL_AGG_COUNT_VALUES: grp->count++; break;
    case PROMQL_AGG_STDVAR:
    case PROMQL_AGG_STDDEV: {
        grp->count++;
        double delta = s.v - grp->mean;
        grp->mean += delta / (double)grp->count;
        grp->value += delta * (s.v - grp->mean);
        break;
    }
    case PROMQL_AGG_TOPK:
        if ((int64_t)grp->heap.n < k || grp->heap.v[0].v < s.v || isnan(grp->heap.v[0].v)) {
            if ((int64_t)grp->heap.n == k)
                heap_pop(&grp->heap);
            heap_push(c, &grp->heap, s);
        }
        break;
    case PROMQL_AGG_BOTTOMK:
        if ((int64_t)grp->heap.n < k || grp->heap.v[0].v > s.v || isnan(grp->heap.v[0].v)) {
            if ((int64_t)grp->heap.n == k)
                heap_pop(&grp->heap);
            heap_push(c, &grp->heap, s);
        }
        break;
    case PROMQL_AGG_QUANTILE:
        if (grp->nq == grp->capq) {
            double *nv = arena_alloc(c->sa, grp->capq * 2 * sizeof(double));
            memcpy(nv, grp->qvals, grp->nq * sizeof(double));
            grp->qvals = nv;
            grp->capq *= 2;
        }
        grp->qvals[grp->nq++] = s.v;
        break;
    default: break;
    }
}

/* The group's value once all members are in (not topk / bottomk). */
static double group_result(promql_op_t op, group_t *grp, double param)
{
    switch (op) {
    case PROMQL_AGG_AVG: return grp->mean;
    case PROMQL_AGG_COUNT:
    case PROMQL_AGG_COUNT_VALUES: return (double)grp->count;
    case PROMQL_AGG_STDVAR: return grp->value / (double)grp->count;
    case PROMQL_AGG_STDDEV: return sqrt(grp->value / (double)grp->count);
    case PROMQL_AGG_QUANTILE: return pq_quantile(param, grp->qvals, grp->nq);
    default: return grp->value;
    }
}

/* topk / bottomk: the group's heap in output order. */
static void group_sort_heap(promql_op_t op, group_t *grp)
{
    if (grp->heap.n > 1)
        pq_go_sort(grp->heap.v, grp->heap.n, sizeof(promql_sample_t),
                   op == PROMQL_AGG_TOPK ? rev_less_top : rev_less_bottom);
}

/* topk / bottomk's k from the parameter, raising as 2.42 does when it does not fit an int64. */
static int64_t topk_k(pq_ctx_t *c, double param)
{
    if (!(param <= 9.2233720368547758e18 && param >= -9.2233720368547758e18))
        pq_errorf(c, PROMQL_ERR_EXECUTION, "Scalar value %g overflows int64", param);
    return (int64_t)param;
}

static uint64_t grouping_key(pq_ctx_t *c, labels_t m, const char *const *g, size_t ng, bool without,
                             labels_t *out_labels)
{
    labels_t k;
    if (without) {
        k = pq_labels_drop_name(c, pq_labels_del(c, m, g, ng));
    } else {
        k = pq_labels_keep(c, m, g, ng);
    }
    *out_labels = k;
    return labels_hash(&k);
}

void pq_aggregate(pq_ctx_t *c, const promql_expr_t *e, const pq_vec_t *in, double param, const char *sparam,
                  pq_vec_t *out)
{
    promql_op_t op = e->u.agg.op;
    const char **g = e->u.agg.grouping.names;
    size_t ng = e->u.agg.grouping.n;
    bool without = e->u.agg.without;
    int64_t k = 0;
    if (op == PROMQL_AGG_TOPK || op == PROMQL_AGG_BOTTOMK) {
        k = topk_k(c, param);
        if (k < 1)
            return;
    }
    const char *value_label = NULL;
    if (op == PROMQL_AGG_COUNT_VALUES) {
        value_label = sparam;
        if (!labels_valid_name(value_label, strlen(value_label)))
            pq_errorf(c, PROMQL_ERR_EXECUTION, "invalid label name \"%s\"", value_label);
        if (!without) {
            const char **ng2 = arena_alloc(c->sa, (ng + 1) * sizeof(*ng2));
            if (ng)
                memcpy(ng2, g, ng * sizeof(*ng2));
            ng2[ng] = value_label;
            g = ng2;
            ng++;
        }
    }

    size_t cap = 16, ngroups = 0;
    group_t *groups = arena_alloc(c->sa, cap * sizeof(*groups));
    size_t hcap = 32;
    while (hcap < in->n * 2 + 1)
        hcap *= 2;
    uint64_t *hk = arena_alloc(c->sa, hcap * sizeof(uint64_t));
    int *hv = arena_alloc(c->sa, hcap * sizeof(int));
    unsigned char *hu = arena_calloc(c->sa, hcap, 1);

    for (size_t si = 0; si < in->n; si++) {
        promql_sample_t s = in->v[si];
        labels_t metric = s.metric;
        if (op == PROMQL_AGG_COUNT_VALUES) {
            buf_t b = BUF_INIT;
            buf_put_float_go(&b, s.v, 'f');
            metric = pq_labels_set(c, metric, value_label, arena_strdup(c->sa, b.data));
            buf_free(&b);
        }
        labels_t glabels;
        uint64_t key = grouping_key(c, metric, g, ng, without, &glabels);
        size_t slot = (size_t)(key * 0x9E3779B97F4A7C15ULL) & (hcap - 1);
        group_t *grp = NULL;
        while (hu[slot]) {
            if (hk[slot] == key) {
                grp = &groups[hv[slot]];
                break;
            }
            slot = (slot + 1) & (hcap - 1);
        }
        if (!grp) {
            if (ngroups == cap) {
                group_t *ngp = arena_alloc(c->sa, cap * 2 * sizeof(*ngp));
                memcpy(ngp, groups, ngroups * sizeof(*ngp));
                groups = ngp;
                cap *= 2;
            }
            hu[slot] = 1;
            hk[slot] = key;
            hv[slot] = (int)ngroups;
            grp = &groups[ngroups++];
            memset(grp, 0, sizeof(*grp));
            grp->labels = glabels;
            group_first(c, op, grp, s);
            continue;
        }
        group_add(c, op, grp, s, k);
    }

    for (size_t i = 0; i < ngroups; i++) {
        group_t *grp = &groups[i];
        if (op == PROMQL_AGG_TOPK || op == PROMQL_AGG_BOTTOMK) {
            group_sort_heap(op, grp);
            for (size_t j = 0; j < grp->heap.n; j++)
                pq_vec_push(c, out, grp->heap.v[j].metric, grp->heap.v[j].t, grp->heap.v[j].v);
            continue;
        }
        pq_vec_push(c, out, grp->labels, 0, group_result(op, grp, param));
    }
}

/* ---- series-major (range_eval.c) ------------------------------------------------------------ */

uint64_t pq_agg_group_key(pq_ctx_t *c, const promql_expr_t *e, labels_t m, labels_t *out_labels)
{
    return grouping_key(c, m, e->u.agg.grouping.names, e->u.agg.grouping.n, e->u.agg.without, out_labels);
}

/* Steps are taken in blocks: every input series adds its values of the block's steps to the
 * groups' state for those steps, so each (group, step) sees its members in input order -- the
 * order the step-wise pq_aggregate sees them in -- while the values are read series by series. */
#define AGG_BLOCK 32

void pq_aggregate_range(pq_ctx_t *c, promql_op_t op, pq_agg_range_t *a)
{
    bool heaps = op == PROMQL_AGG_TOPK || op == PROMQL_AGG_BOTTOMK;
    a->ordered = !heaps;
    size_t ng = a->ngroups;
    group_t *st = arena_alloc(c->sa, (ng ? ng : 1) * AGG_BLOCK * sizeof(*st));
    int64_t ks[AGG_BLOCK];
    for (size_t s = 0; heaps && s < a->nsteps; s++)
        (void)topk_k(c, a->param[s]); /* a bad k is an error at every step, with inputs or not */
    size_t ulo = a->nsteps, uhi = 0;  /* the steps some input is present at lie in [ulo, uhi) */
    for (size_t i = 0; i < a->nin; i++) {
        if (a->lo[i] < ulo)
            ulo = a->lo[i];
        if (a->hi[i] > uhi)
            uhi = a->hi[i];
    }
    for (size_t s0 = ulo; s0 < uhi; s0 += AGG_BLOCK) {
        size_t nb = uhi - s0 < AGG_BLOCK ? uhi - s0 : AGG_BLOCK;
        arena_mark_t mark = arena_mark(c->sa);
        memset(st, 0, (ng ? ng : 1) * AGG_BLOCK * sizeof(*st));
        int64_t last_first[AGG_BLOCK]; /* the group a step saw first-member last, for `ordered` */
        for (size_t b = 0; b < nb; b++) {
            last_first[b] = -1;
            ks[b] = heaps ? topk_k(c, a->param[s0 + b]) : 0;
        }
        for (size_t i = 0; i < a->nin; i++) {
            if (a->lo[i] >= s0 + nb || a->hi[i] <= s0)
                continue; /* nothing in this block */
            const double *v = a->v[i] + s0;
            const uint8_t *has = a->has[i] + s0;
            group_t *gs = st + (size_t)a->gid[i] * AGG_BLOCK;
            size_t b0 = a->lo[i] > s0 ? a->lo[i] - s0 : 0, b1 = a->hi[i] - s0 < nb ? a->hi[i] - s0 : nb;
            for (size_t b = b0; b < b1; b++) {
                if (!has[b] || (heaps && ks[b] < 1))
                    continue;
                promql_sample_t smp = {{NULL, 0}, (int64_t)i, v[b]};
                group_t *grp = &gs[b];
                if (grp->count == 0) {
                    if ((int64_t)a->gid[i] < last_first[b])
                        a->ordered = false;
                    last_first[b] = a->gid[i];
                    group_first(c, op, grp, smp);
                } else {
                    group_add(c, op, grp, smp, ks[b]);
                }
            }
        }
        for (size_t g = 0; g < ng; g++) {
            for (size_t b = 0; b < nb; b++) {
                group_t *grp = &st[g * AGG_BLOCK + b];
                if (grp->count == 0)
                    continue;
                size_t s = s0 + b;
                if (heaps) {
                    group_sort_heap(op, grp);
                    for (size_t j = 0; j < grp->heap.n; j++) {
                        size_t in = (size_t)grp->heap.v[j].t;
                        a->ov[in][s] = grp->heap.v[j].v;
                        a->ohas[in][s] = 1;
                    }
                    a->cnt[s] += (int64_t)grp->heap.n;
                    continue;
                }
                a->ov[g][s] = group_result(op, grp, a->param ? a->param[s] : 0);
                a->ohas[g][s] = 1;
                a->cnt[s]++;
            }
        }
        arena_rewind(c->sa, mark);
        pq_check_interrupt(c);
    }
}

/* The streaming form: the whole (group, step) state at once, input series added one by one in
 * the vector's order (for inputs that are never materialised; range_eval.c). */
struct pq_agg_stream {
    promql_op_t op;
    size_t ngroups, nsteps;
    group_t *st;         /* [group * nsteps + step] */
    size_t *glo, *ghi;   /* per group: the steps its members were added at lie in [glo, ghi) */
    int64_t *ks;         /* topk / bottomk: k per step */
    int64_t *last_first; /* per step: the group that saw its first member last */
    bool ordered;
};

pq_agg_stream_t *pq_agg_stream_begin(pq_ctx_t *c, promql_op_t op, size_t ngroups, size_t nsteps, const double *param)
{
    pq_agg_stream_t *a = arena_calloc(c->sa, 1, sizeof(*a));
    a->op = op;
    a->ngroups = ngroups;
    a->nsteps = nsteps;
    a->st = arena_calloc(c->sa, (ngroups ? ngroups : 1) * nsteps, sizeof(group_t));
    a->glo = arena_alloc(c->sa, (ngroups ? ngroups : 1) * sizeof(size_t));
    a->ghi = arena_calloc(c->sa, ngroups ? ngroups : 1, sizeof(size_t));
    for (size_t g = 0; g < ngroups; g++)
        a->glo[g] = nsteps;
    a->ks = arena_calloc(c->sa, nsteps, sizeof(int64_t));
    a->last_first = arena_alloc(c->sa, nsteps * sizeof(int64_t));
    a->ordered = op != PROMQL_AGG_TOPK && op != PROMQL_AGG_BOTTOMK;
    for (size_t s = 0; s < nsteps; s++) {
        a->last_first[s] = -1;
        if (!a->ordered)
            a->ks[s] = topk_k(c, param[s]);
    }
    return a;
}

void pq_agg_stream_add(pq_ctx_t *c, pq_agg_stream_t *a, size_t in, uint32_t gid, const double *v, const uint8_t *has,
                       size_t lo, size_t hi)
{
    bool heaps = a->op == PROMQL_AGG_TOPK || a->op == PROMQL_AGG_BOTTOMK;
    group_t *gs = a->st + (size_t)gid * a->nsteps;
    if (lo >= hi)
        return;
    if (lo < a->glo[gid])
        a->glo[gid] = lo;
    if (hi > a->ghi[gid])
        a->ghi[gid] = hi;
    for (size_t s = lo; s < hi; s++) {
        if (!has[s] || (heaps && a->ks[s] < 1))
            continue;
        promql_sample_t smp = {{NULL, 0}, (int64_t)in, v[s]};
        group_t *grp = &gs[s];
        if (grp->count == 0) {
            if ((int64_t)gid < a->last_first[s])
                a->ordered = false;
            a->last_first[s] = gid;
            group_first(c, a->op, grp, smp);
        } else {
            group_add(c, a->op, grp, smp, a->ks[s]);
        }
    }
}

bool pq_agg_stream_end(pq_ctx_t *c, pq_agg_stream_t *a, const double *param, double **ov, uint8_t **ohas, int64_t *cnt)
{
    for (size_t g = 0; g < a->ngroups; g++) {
        for (size_t s = a->glo[g]; s < a->ghi[g]; s++) {
            group_t *grp = &a->st[g * a->nsteps + s];
            if (grp->count == 0)
                continue;
            if (a->op == PROMQL_AGG_TOPK || a->op == PROMQL_AGG_BOTTOMK) {
                group_sort_heap(a->op, grp);
                for (size_t j = 0; j < grp->heap.n; j++) {
                    size_t in = (size_t)grp->heap.v[j].t;
                    if (!ov[in]) { /* the first time this input is in a top k */
                        ov[in] = arena_alloc(c->sa, a->nsteps * sizeof(double));
                        ohas[in] = arena_calloc(c->sa, a->nsteps, 1);
                    }
                    ov[in][s] = grp->heap.v[j].v;
                    ohas[in][s] = 1;
                }
                cnt[s] += (int64_t)grp->heap.n;
                continue;
            }
            ov[g][s] = group_result(a->op, grp, param ? param[s] : 0);
            ohas[g][s] = 1;
            cnt[s]++;
        }
    }
    return a->ordered;
}

size_t pq_agg_stream_cell_bytes(void)
{
    return sizeof(group_t);
}
