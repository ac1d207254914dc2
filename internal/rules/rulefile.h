/*
 * rules/rulefile — Prometheus rule files (rulefmt), read with libyaml and checked the way
 * `promtool check rules` (Prometheus 2.42) checks them, with the same messages:
 *
 *   groups:
 *   - name: <string, unique in the file, not empty>
 *     interval: <duration>        # default: the evaluator's interval
 *     limit: <int>                # 0 = no limit of series/alerts per rule
 *     rules:
 *     - record: <metric name>     # or
 *       alert: <string>
 *       expr: <PromQL>
 *       for: <duration>           # alerts only
 *       keep_firing_for: <duration> # alerts only (2.42 accepts it)
 *       labels: {<label name>: <template>}
 *       annotations: {<label name>: <template>}   # alerts only
 *
 * Unknown fields are refused (Go's strict unmarshal: "field foo not found in type
 * rulefmt.RuleNode"); durations use Prometheus' syntax ("not a valid duration string"); every
 * rule's expression is parsed by internal/promql and every label/annotation template by
 * rules/template. Errors are collected, one line each, as promtool prints them:
 *   <file>: <line>:<col>: group "<g>", rule <n>, "<name>": <message>
 *
 * Ownership: a rules_file_t and everything in it is heap-owned; rules_file_free releases it.
 */
#ifndef SLUICE_RULES_RULEFILE_H
#define SLUICE_RULES_RULEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/promql/ast.h"
#include "internal/util/buf.h"

typedef enum { RULES_RECORD = 0, RULES_ALERT = 1 } rules_kind_t;

typedef struct {
    rules_kind_t kind;
    char *name; /* record: metric name; alert: alert name */
    char *expr; /* as written */
    promql_ast_t *ast;
    int64_t for_ms;
    int64_t keep_firing_for_ms;
    labels_t labels;      /* sorted by name; strings owned */
    labels_t annotations; /* sorted by name; strings owned */
} rules_rule_def_t;

typedef struct {
    char *name;
    char *file;
    int64_t interval_ms; /* 0: the default */
    int64_t limit;
    rules_rule_def_t *rules;
    size_t nrules;
} rules_group_def_t;

typedef struct {
    rules_group_def_t *groups;
    size_t ngroups;
    size_t nfiles;
} rules_file_t;

/* Parses and checks one file, appending its groups to f (which may already hold other files'
 * groups). Returns the number of errors; each is appended to errs as "<path>: <msg>\n". Nothing
 * is appended to f when there are errors. */
int rules_file_load(rules_file_t *f, const char *path, buf_t *errs);
/* Expands each pattern with glob(3) (a pattern that matches nothing and has no glob characters is
 * an error: "no such file") and loads every file, in order. Returns the number of errors. */
int rules_files_load(rules_file_t *f, const char *const *patterns, size_t npatterns, buf_t *errs);
void rules_file_free(rules_file_t *f);

void rules_labels_free(labels_t *ls);
/* Deep copy (array and strings malloc'd); NULL array for an empty set. */
int rules_labels_dup(labels_t *dst, const labels_t *src);

#endif
