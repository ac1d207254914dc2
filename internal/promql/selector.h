/*
 * selector — parses a lone series selector (`metric{a="b",c=~"d.*"}`), the `match[]` parameter of
 * /api/v1/series, /labels and /label/<name>/values (Prometheus' parser.ParseMetricSelector).
 *
 * Grammar: [metric_name] ['{' matchers '}'] and nothing else. Unlike a full PromQL expression,
 * a selector whose matchers all match the empty string (`{a=""}`) parses: the HTTP API rejects it
 * itself with its own message. Anything after the selector (`x[5m]`, `x offset 5m`, `rate(x)`)
 * is "unexpected <token>" at that token, with Prometheus' "line:col: parse error:" prefix.
 */
#ifndef SLUICE_PROMQL_SELECTOR_H
#define SLUICE_PROMQL_SELECTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "internal/labels/matcher.h"
#include "internal/promql/ast.h"

typedef struct {
    matcher_t **ms; /* the matchers, __name__="metric" included when a name was written */
    size_t n;
    /* private: who owns ms */
    promql_ast_t *ast_;
    bool own_;
} promql_selector_t;

/* Parses s into out. Returns 0, or -1 with "line:col: parse error: ..." in err (out untouched).
 * Release with promql_selector_free. */
int promql_parse_selector(const char *s, promql_selector_t *out, char *err, size_t errlen);
void promql_selector_free(promql_selector_t *sel);
/* true when every matcher matches the empty string (Prometheus' API refuses such a match[]). */
bool promql_selector_all_empty(const promql_selector_t *sel);

#endif
