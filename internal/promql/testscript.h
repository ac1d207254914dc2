/*
 * testscript — runs Prometheus' PromQL test scripts (the `.test` format of promql/testdata) and
 * sluice's own, against an in-memory store (promql_memstore_t) behind the querier interface.
 *
 * Script format (Prometheus 2.42 promql/test.go):
 *
 *   load <step>                      then indented lines: <series> <values...>
 *       metric{l="v"} 0+10x5 _ stale 3 _x2 1x3
 *   clear                            drop all data
 *   eval instant at <time> <expr>    then expected lines until a blank line:
 *       {l="v"} 42                   one sample (labels exactly, __name__ included when given)
 *       3.5                          a scalar result
 *   eval_fail instant at ...         the query must fail
 *   eval_ordered instant at ...      samples must come in the given order
 *   # comment                        (also ends a block)
 *
 * Values: `a+bxN` / `a-bxN` expand to N+1 values a, a±b, ...; `axN` repeats a N+1 times; `_` skips
 * one step, `_xN` skips N; `stale` writes a staleness marker. Sample i of a load sits at
 * i * step ms. Values compare with Prometheus' tolerance (relative 1e-6, NaN equals NaN).
 * Like Prometheus' runner, every passing instant eval is run again as a range query from
 * t-1m to t+1m at 1m steps and the middle step compared too (not for eval_ordered), and — when
 * the query has no time-dependent functions — again with `@ t` pinned on every selector at
 * several evaluation times.
 */
#ifndef SLUICE_PROMQL_TESTSCRIPT_H
#define SLUICE_PROMQL_TESTSCRIPT_H

#include <stdint.h>
#include <stdio.h>

#include "internal/labels/labels.h"
#include "storage/querier.h"

typedef struct promql_memstore promql_memstore_t;

promql_memstore_t *promql_memstore_new(void);
void promql_memstore_free(promql_memstore_t *m);
/* Appends a sample to the series with these labels (sorted or not; copied). Samples of a series
 * are kept sorted by time; a second sample at the same time replaces the first. */
void promql_memstore_add(promql_memstore_t *m, const labels_t *ls, int64_t t, double v);
void promql_memstore_clear(promql_memstore_t *m);
/* A querier over the store's current content; close with querier_close. Not thread-safe against
 * concurrent adds. */
querier_t *promql_memstore_querier(promql_memstore_t *m);

typedef struct {
    int evals;  /* eval blocks seen */
    int passed; /* eval blocks that passed (all variants) */
    int failed;
} promql_script_stats_t;

/* Runs one script. Failures are described on `log` (may be NULL) as "file:line: message".
 * Returns 0 if the file could be read and parsed, -1 otherwise (message on log). */
int promql_script_run_file(const char *path, FILE *log, promql_script_stats_t *st);
/* Same for a script in memory; `name` is used in messages. */
int promql_script_run(const char *name, const char *text, FILE *log, promql_script_stats_t *st);

/* For tests of the engine itself: walks a script like promql_script_run_file, but instead of
 * checking an eval block calls hook with the querier of the data loaded at that point, the
 * block's query, its time and its line (eval_fail blocks too). */
typedef void (*promql_script_hook_t)(void *ctx, querier_t *q, const char *query, int64_t t, int line);
int promql_script_each_eval(const char *path, FILE *log, promql_script_hook_t hook, void *ctx);

#endif
