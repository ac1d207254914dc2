/*
 * engine — evaluates a parsed PromQL query (ast.h) against a querier (storage/querier.h) as an
 * instant query at one time or a range query over [start, end] at a step, with Prometheus 2.42's
 * semantics (lookback delta, staleness markers, extrapolated rates, __name__ dropping, vector
 * matching, step-aligned subqueries, max_samples).
 *
 * How it works. Before evaluating, one pass over the AST computes for every selector the widest
 * time window any step may need (offsets, @, ranges and subqueries included) and loads each
 * selector's series once through the querier into the query's arena. Evaluation then runs step by
 * step, like Prometheus' evaluator: each step evaluates the tree at one time t using a scratch
 * arena that is reset after the step, and the step's output is appended to the result series
 * (matched by label set). Subqueries evaluate their inner expression at each step-aligned time in
 * their window. Range queries whose every node range_eval.c handles (selectors, range functions of
 * matrix selectors, elementwise functions, aggregations, histogram_quantile, scalar operators)
 * are evaluated series-major instead -- each node once for all steps -- with identical results;
 * any other query, and any error but a timeout, goes the step-wise way. Errors unwind with
 * longjmp to the query entry point; since everything a query allocates lives in its arenas,
 * nothing leaks.
 *
 * Thread safety: no global mutable state; any number of queries may run at once, each on one
 * thread, each with its own querier.
 */
#ifndef SLUICE_PROMQL_ENGINE_H
#define SLUICE_PROMQL_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "internal/promql/ast.h"
#include "internal/promql/value.h"
#include "storage/querier.h"

typedef struct {
    int64_t lookback_ms;        /* 0: 5 minutes */
    int64_t timeout_ms;         /* 0: no timeout */
    int64_t max_samples;        /* 0: 50,000,000 */
    int64_t subquery_step_ms;   /* default subquery step; 0: 60 s */
    const volatile int *cancel; /* optional: evaluation stops with PROMQL_ERR_CANCELED when != 0 */
    /* Memory: every block the evaluation takes is charged, before it is allocated, to a budget of
     * max_memory bytes (0: none of its own) whose parent is `budget` (optional, shared by all
     * queries of the process). A refusal ends the query: PROMQL_ERR_EXECUTION for its own limit,
     * PROMQL_ERR_UNAVAILABLE for the shared one. */
    struct arena_budget *budget;
    size_t max_memory;
    /* Opt-in to approximate answers: selectors may read roll-ups at the query step although raw
     * samples exist (querier_hints_t.rollup_step). The result then carries a warning. */
    bool rollup_step;
    /* Range queries: evaluate step by step only, never series-major (range_eval.c). The two give
     * identical answers; tests compare them. */
    bool stepwise;
} promql_opts_t;

#define PROMQL_MAX_WARNINGS 6

/* Error kinds; the HTTP layer maps them to Prometheus' errorType and status. */
typedef enum {
    PROMQL_ERR_NONE = 0,
    PROMQL_ERR_BAD_DATA,    /* "bad_data", 400: e.g. range query of a string expression */
    PROMQL_ERR_EXECUTION,   /* "execution", 422: evaluation errors, too many samples */
    PROMQL_ERR_TIMEOUT,     /* "timeout", 503 */
    PROMQL_ERR_CANCELED,    /* "canceled", 503 */
    PROMQL_ERR_INTERNAL,    /* "internal", 500: storage failures */
    PROMQL_ERR_UNAVAILABLE, /* "unavailable", 503: the shared query memory budget is in use */
} promql_errkind_t;

const char *promql_errkind_name(promql_errkind_t k); /* "bad_data", "execution", ... */

typedef struct {
    arena_t *arena;       /* owns everything value points at */
    promql_value_t value; /* valid when err_kind == PROMQL_ERR_NONE */
    promql_errkind_t err_kind;
    char err[512];
    int64_t peak_samples; /* statistic: the most samples held at once */
    size_t peak_memory;   /* statistic: the most bytes the evaluation held (its budget's peak) */
    bool series_major;    /* statistic: a range query evaluated series-major (range_eval.c) */
    /* Prometheus-style warnings (the API's "warnings" array), in the arena: set when part of the
     * answer came from roll-ups and is approximate there (docs/storage-rollups.md), or when a
     * remote store of the fall-through failed (partial response, storage/querier_fallthrough.h). */
    const char *warnings[PROMQL_MAX_WARNINGS];
    size_t nwarnings;
} promql_result_t;

/* Instant query at t_ms. Never NULL (aborts on OOM). The value is a SCALAR, STRING, VECTOR or,
 * for a range-vector expression, a MATRIX. The AST is not modified. */
promql_result_t *promql_exec_instant(querier_t *q, const promql_ast_t *ast, int64_t t_ms, const promql_opts_t *opts);
/* Range query: steps start, start+step, ... <= end (step > 0, end >= start; the caller checks
 * the API's limits). The value is a MATRIX sorted by labels; scalar results become one series
 * with no labels. */
promql_result_t *promql_exec_range(querier_t *q, const promql_ast_t *ast, int64_t start_ms, int64_t end_ms,
                                   int64_t step_ms, const promql_opts_t *opts);
void promql_result_free(promql_result_t *r);

#endif
