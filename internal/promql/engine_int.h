/*
 * engine_int — what engine.c, functions.c, aggregators.c and parser.c share inside
 * internal/promql: the per-step value representation, the evaluation context and the function
 * table. Not for use outside this directory.
 */
#ifndef SLUICE_PROMQL_ENGINE_INT_H
#define SLUICE_PROMQL_ENGINE_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "internal/promql/ast.h"
#include "internal/promql/engine.h"
#include "internal/promql/value.h"
#include "internal/util/arena.h"
#include "internal/util/hashmap.h"

/* A growable instant vector in the step arena. */
typedef struct {
    promql_sample_t *v;
    size_t n, cap;
} pq_vec_t;

/* One series of a range vector at one step: a window of points (not owned). */
typedef struct {
    labels_t metric;
    const promql_point_t *pts;
    size_t n;
    int64_t rollup_until; /* points before it are roll-up buckets (storage/querier.h), else 0 */
} pq_mseries_t;

typedef struct {
    pq_mseries_t *v;
    size_t n, cap;
} pq_mat_t;

/* A value during evaluation of one step. */
typedef struct {
    promql_vtype_t type;
    double scalar;
    const char *str;
    pq_vec_t vec;
    pq_mat_t mat;
    /* For range vectors: the window [mint, maxt] they were cut from and the range, as
     * extrapolating functions need them. */
    int64_t range_ms, win_end;
} pq_val_t;

/* A selector's loaded series. Its samples stay XOR-encoded as the store gave them (chunks, about
 * 1-8 bytes a sample instead of 16) until they are used: the series-major evaluation decodes one
 * series at a time (pq_sseries_decode), the step-wise one decodes every series once up front
 * (pts). A dashboard's range query over tens of thousands of series would otherwise hold all their
 * samples decoded at once, and writing those fresh pages was most of its time. */
typedef struct {
    labels_t metric;
    const querier_chunk_t *chunks; /* copies; the first holds the first sample in [mint, maxt] */
    size_t nchunks;
    promql_point_t *pts; /* step-wise evaluation only: all samples incl. stale markers, time ordered */
    size_t n;
    bool has_stale;
    int64_t rollup_until; /* points before it are roll-up buckets (storage/querier.h), else 0 */
    int64_t rollup_res;   /* their bucket width */
} pq_sseries_t;

typedef struct {
    pq_sseries_t *s;
    size_t n;
    int64_t mint, maxt;
    bool needed;
    const char *func; /* the function the selector is a direct argument of, or NULL */
    bool name_dups;   /* two of its series have the same labels but for __name__ */
} pq_seldata_t;

#define PQ_MAX_SET_WARNINGS 4

typedef struct pq_ctx {
    arena_t *qa; /* query lifetime: loaded series, result */
    arena_t *sa; /* step scratch, reset after every outer step */
    querier_t *q;
    int64_t start, end, interval; /* outer query; interval 0 for instant */
    int64_t lookback, subq_step, max_samples;
    int64_t cur_samples, peak_samples, result_samples;
    int64_t deadline_ns;           /* 0: none */
    arena_budget_t budget;         /* this query's memory; parent: promql_opts_t.budget */
    struct pq_owned_arena *owned;  /* arenas made mid-evaluation, destroyed at the end even on error */
    struct pq_open_set *open_sets; /* selector sets whose labels the loaded series use, freed at the end */
    const volatile int *cancel;
    unsigned tick;
    pq_seldata_t *sel;
    struct pq_subq_cache *subq_caches; /* range queries: inner steps of each subquery, by time */
    struct pq_re_cache *re_caches;     /* label_replace regexes, compiled once per query */
    struct pq_range_dups *range_dups;  /* engine.c, range_dups_note */
    const promql_ast_t *ast;
    bool rollup_step;    /* promql_opts_t.rollup_step */
    bool stepwise;       /* promql_opts_t.stepwise */
    bool rollups_used;   /* some step read roll-up samples */
    bool rollups_approx; /* ... in a way that is not exact (engine.c, note_rollups) */
    int64_t rollup_res;  /* the widest bucket width read */
    /* warnings of the series sets (querier_set_warnings), in qa */
    const char *set_warnings[PQ_MAX_SET_WARNINGS];
    size_t nset_warnings;
    jmp_buf jb;
    promql_errkind_t err_kind;
    char err[512];
} pq_ctx_t;

/* The most samples pq_sseries_decode can write for ss (its chunks' sample counts, bounded by
 * what their bytes can hold). */
size_t pq_sseries_bound(const pq_sseries_t *ss);
/* Decodes ss's samples in [sd->mint, sd->maxt] into out (room for `most`, at least
 * pq_sseries_bound(ss) for all of them), stale markers included unless drop_stale; returns how
 * many. *has_stale (optional): some were stale. */
size_t pq_sseries_decode(const pq_seldata_t *sd, const pq_sseries_t *ss, bool drop_stale, promql_point_t *out,
                         size_t most, bool *has_stale);

/* Raises an evaluation error (longjmp to the query entry). */
_Noreturn void pq_errorf(pq_ctx_t *c, promql_errkind_t k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void pq_vec_push(pq_ctx_t *c, pq_vec_t *v, labels_t m, int64_t t, double val);
/* Sample accounting against max_samples. */
void pq_count_samples(pq_ctx_t *c, int64_t n);

/* Label helpers; results live in the step arena. */
labels_t pq_labels_drop_name(pq_ctx_t *c, labels_t ls);
labels_t pq_labels_set(pq_ctx_t *c, labels_t ls, const char *name, const char *value); /* "" deletes */
labels_t pq_labels_del(pq_ctx_t *c, labels_t ls, const char *const *names, size_t n);
labels_t pq_labels_keep(pq_ctx_t *c, labels_t ls, const char *const *names, size_t n);
bool pq_vec_has_dup_labelsets(pq_ctx_t *c, const pq_vec_t *v);

/* Evaluates e at time t (milliseconds). */
pq_val_t pq_eval(pq_ctx_t *c, const promql_expr_t *e, int64_t t);

/* Helpers engine.c shares with the series-major range evaluator (range_eval.c). */
labels_t pq_copy_labels(arena_t *a, labels_t m); /* deep copy into a */
arena_t *pq_owned_create(pq_ctx_t *c);          /* budgeted arena freed at the query's end */
void pq_owned_release(pq_ctx_t *c, arena_t *a);
void pq_check_interrupt(pq_ctx_t *c); /* raises on timeout or cancel */
void pq_hmap_init(pq_ctx_t *c, hashmap_t *m, size_t expect); /* in c->sa */
uint64_t *pq_hmap_put(pq_ctx_t *c, hashmap_t *m, uint64_t k, uint64_t v, bool *existed);
int64_t pq_resolve_at(const pq_ctx_t *c, promql_at_t at, int64_t at_ms, int64_t t);
ssize_t pq_last_le(const promql_point_t *p, size_t n, int64_t ts); /* last index with t <= ts, or -1 */
size_t pq_first_ge(const promql_point_t *p, size_t n, int64_t ts); /* first index with t >= ts */
void pq_note_rollups(pq_ctx_t *c, const char *func, int64_t range, int64_t te, int64_t res, int64_t until);
double pq_elem_binop(promql_op_t op, double l, double r, bool *keep);
bool pq_op_drops_name(promql_op_t op);
/* Vector matching: the signature of ls under on / ignoring(names), and the labels of a result
 * sample from l matched with r (both in c->sa), as the step-wise operators compute them. */
uint64_t pq_match_signature(pq_ctx_t *c, labels_t ls, bool on, const promql_strlist_t *names);
labels_t pq_binop_result_metric(pq_ctx_t *c, const promql_expr_t *e, labels_t l, labels_t r);
bool pq_range_arg_may_collide(const pq_ctx_t *c, const promql_expr_t *a);

/* Series-major evaluation of a whole range query (range_eval.c). Returns 0 with the result in
 * res->value, or -1 when the query has a shape it does not evaluate (or any evaluation error
 * but timeout / cancel, which it raises): the caller then evaluates step by step, which gives
 * the exact error. Leaves no trace in c but what the step-wise evaluation would leave too. */
int pq_range_eval(pq_ctx_t *c, promql_result_t *res);

/* --- functions ------------------------------------------------------------------------------ */

/* Context of one call at one step. */
typedef struct {
    const promql_expr_t *call;
    int64_t t;            /* evaluation time of the step */
    int64_t range_ms;     /* matrix argument's range */
    int64_t win_end;      /* matrix argument's window end (t - offset, or @ - offset) */
    double sargs[4];      /* scalar arguments by position */
    int64_t rollup_until; /* of the series a range-vector function is applied to (0: all raw) */
} pq_fcall_t;

/* Range-vector function applied to one series' window (n >= 1); false: no output. */
typedef bool (*pq_mfn_t)(pq_ctx_t *c, const pq_fcall_t *fc, const promql_point_t *p, size_t n, double *out);
/* Elementwise function on an instant vector's values. */
typedef double (*pq_efn_t)(double v);
/* Anything else: receives evaluated arguments, writes the result. */
typedef void (*pq_gfn_t)(pq_ctx_t *c, const pq_fcall_t *fc, pq_val_t *args, size_t nargs, pq_val_t *out);

struct promql_func {
    const char *name;
    promql_vtype_t args[5];
    int nargs;
    int variadic; /* 0 fixed; >0 up to that many optional trailing args; -1 unlimited */
    promql_vtype_t ret;
    pq_mfn_t mfn;
    pq_efn_t efn;
    pq_gfn_t gfn;
    bool keep_name; /* mfn / efn outputs keep __name__ */
};

const promql_func_t *promql__func_lookup(const char *name, size_t n);
/* Frees what functions cached for the query (compiled regexes). */
void pq_func_caches_free(pq_ctx_t *c);

/* Aggregation over one step's vector. param: scalar (topk, bottomk, quantile) or string
 * (count_values). */
void pq_aggregate(pq_ctx_t *c, const promql_expr_t *e, const pq_vec_t *in, double param, const char *sparam,
                  pq_vec_t *out);

/* Series-major aggregation over all steps of a range query (range_eval.c). Input series i has
 * values v[i][step] where has[i][step], sits in group gid[i] (groups numbered 0.. by first
 * member) and comes in the order the step-wise vector holds it. Each (group, step) gets the same
 * arithmetic in the same order as pq_aggregate, so the values are bit-identical. Outputs: per
 * group for sum..quantile, per input series for topk / bottomk (ov / ohas, zeroed by the
 * caller); cnt[step] grows by the samples each step outputs. ordered: every step's output came
 * in group order, as the step-wise vector would hold it (never for topk / bottomk). */
typedef struct {
    size_t nsteps, nin, ngroups;
    double *const *v;
    const uint8_t *const *has;
    const size_t *lo, *hi; /* per input: has[i] is 0 outside steps [lo[i], hi[i]) */
    const uint32_t *gid;
    const double *param; /* per step (topk, bottomk, quantile), else NULL */
    double **ov;
    uint8_t **ohas;
    int64_t *cnt;
    bool ordered;
} pq_agg_range_t;
void pq_aggregate_range(pq_ctx_t *c, promql_op_t op, pq_agg_range_t *a);
/* The same, streaming: the state of every (group, step) at once, then every input series in the
 * vector's order (in: its index, for topk / bottomk outputs), then the outputs as above but for
 * topk / bottomk, whose ov[in] / ohas[in] start NULL and are allocated (in c->sa) for the inputs
 * that come out; returns `ordered`. Cells take pq_agg_stream_cell_bytes() each, in c->sa. */
typedef struct pq_agg_stream pq_agg_stream_t;
pq_agg_stream_t *pq_agg_stream_begin(pq_ctx_t *c, promql_op_t op, size_t ngroups, size_t nsteps, const double *param);
void pq_agg_stream_add(pq_ctx_t *c, pq_agg_stream_t *a, size_t in, uint32_t gid, const double *v, const uint8_t *has,
                       size_t lo, size_t hi); /* has is 0 outside steps [lo, hi) */
bool pq_agg_stream_end(pq_ctx_t *c, pq_agg_stream_t *a, const double *param, double **ov, uint8_t **ohas,
                       int64_t *cnt);
size_t pq_agg_stream_cell_bytes(void);
/* The group of m under aggregation e (its labels in *out_labels, step arena) and their hash. */
uint64_t pq_agg_group_key(pq_ctx_t *c, const promql_expr_t *e, labels_t m, labels_t *out_labels);

/* histogram_quantile's pieces (functions.c). */
typedef struct {
    double ub, count;
} pq_bucket_t;
double pq_bucket_quantile(double q, pq_bucket_t *b, size_t n); /* sorts b */
bool pq_parse_float_go(const char *s, double *out);            /* Go's strconv.ParseFloat */

/* quantile of values (sorts them), Prometheus' rules for q outside [0,1] and empty input. */
double pq_quantile(double q, double *vals, size_t n);

/* Go's sort.Sort over small arrays: insertion sort (n <= 12), else a heap-sort-free stable merge;
 * less(a, b, arg). */
void pq_go_sort(void *base, size_t n, size_t size, bool (*less)(const void *, const void *));

#endif
