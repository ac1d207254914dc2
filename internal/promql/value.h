/*
 * value — the results a PromQL evaluation hands out: scalar, string, instant vector (samples
 * all at the evaluation time) and range vector / matrix (series of points).
 *
 * Everything a value points at (labels, strings, arrays) lives in the arena of the result that
 * holds it (promql_result_t in engine.h) and dies with it.
 */
#ifndef SLUICE_PROMQL_VALUE_H
#define SLUICE_PROMQL_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/promql/ast.h"

typedef struct {
    int64_t t; /* milliseconds */
    double v;
} promql_point_t;

typedef struct {
    labels_t metric;
    int64_t t;
    double v;
} promql_sample_t;

typedef struct {
    labels_t metric;
    promql_point_t *points;
    size_t npoints;
} promql_series_t;

typedef struct {
    promql_vtype_t type;
    int64_t t;                /* SCALAR / STRING: evaluation time */
    double scalar;            /* SCALAR */
    const char *string;       /* STRING */
    promql_sample_t *samples; /* VECTOR */
    size_t nsamples;
    promql_series_t *series; /* MATRIX (range queries, and instant queries of range vectors) */
    size_t nseries;
} promql_value_t;

/* The bits of Prometheus' staleness marker. */
#define PROMQL_STALE_NAN_BITS 0x7ff0000000000002ULL
double promql_stale_nan(void);
int promql_is_stale_nan(double v);

#endif
