/*
 * rules/template — the part of Go's text/template that Prometheus alert labels and annotations
 * use, with Prometheus' template data and functions, so a rule file written for Prometheus
 * renders the same text here.
 *
 * Supported:
 *   text and {{ actions }}, trim markers {{- and -}}, comments (a Go block comment alone in an action)
 *   variables $labels, $externalLabels, $externalURL, $value and $ (the data), with field access
 *   ($labels.job, .Labels.job, .Value, .ExternalLabels.x, .ExternalURL)
 *   literals: "strings" (Go escapes), `raw strings`, numbers (int or float, as Go types them),
 *   true/false
 *   pipelines (a | f b), parenthesised pipelines, {{ if p }}..{{ else if p }}..{{ else }}..{{ end }}
 *   functions: humanize, humanize1024, humanizePercentage, humanizeDuration, humanizeTimestamp,
 *   printf, toUpper, toLower, title, stripPort, reReplaceAll, match, eq, ne, lt, le, gt, ge, and,
 *   or, not, len
 * Not supported (parse error "function %q not defined" or "unexpected ..."): range, with,
 * define/template/block, query, and the other Prometheus functions that need the query engine.
 *
 * Errors follow Go's wording closely enough to be recognised ("template: NAME:1:5: function
 * \"foo\" not defined"); rules_tmpl_expand puts them in the output as Prometheus does:
 * "<error expanding template: error executing template NAME: ...>".
 *
 * Missing map keys render as "" (Prometheus sets missingkey=zero).
 */
#ifndef SLUICE_RULES_TEMPLATE_H
#define SLUICE_RULES_TEMPLATE_H

#include <stddef.h>

#include "internal/labels/labels.h"
#include "internal/util/buf.h"

typedef struct rules_tmpl rules_tmpl_t;

typedef struct {
    const labels_t *labels;          /* the alert's labels ($labels); may be NULL */
    const labels_t *external_labels; /* $externalLabels; may be NULL */
    const char *external_url;        /* $externalURL; may be NULL */
    double value;                    /* $value */
} rules_tmpl_data_t;

/* Parses text. NULL with "template: NAME:LINE:COL: msg" in err on a syntax error. */
rules_tmpl_t *rules_tmpl_parse(const char *name, const char *text, char *err, size_t errlen);
void rules_tmpl_free(rules_tmpl_t *t);
/* Executes t, appending to out. 0, or -1 with the message in err (out then holds partial
 * output, which the caller should discard). */
int rules_tmpl_exec(const rules_tmpl_t *t, const rules_tmpl_data_t *d, buf_t *out, char *err, size_t errlen);
/* Parse + execute as Prometheus' expandTemplate does: on any error, appends
 * "<error expanding template: ...>" instead of the output. Returns 0 on success, -1 if the error
 * text was written. */
int rules_tmpl_expand(const char *name, const char *text, const rules_tmpl_data_t *d, buf_t *out);
/* True if text has no "{{" at all (so expansion is the identity, as in Go). */
int rules_tmpl_is_plain(const char *text);

#endif
