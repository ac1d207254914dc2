/*
 * expfmt family — the parsed form of one pushed body, shared by the text and protobuf parsers.
 *
 * A body becomes a list of metric families in order of first appearance, names unique. Each
 * family holds its samples as Prometheus would store them after scraping a Pushgateway that
 * received the body: one sample per series, summaries and histograms already split into their
 * component series.
 *
 *   family  { name "rpc", help, unit, type SUMMARY }
 *     sample  name "rpc"        labels {a="1", quantile="0.5"}  kind QUANTILE  value 3
 *     sample  name "rpc_sum"    labels {a="1"}                  kind SUM       value 10
 *     sample  name "rpc_count"  labels {a="1"}                  kind COUNT     value 7
 *
 * - `labels` are the body's labels in body order, __name__ excluded (the series name is
 *   `sample.name`), `quantile`/`le` included on QUANTILE/BUCKET samples only. Their values are
 *   normalised the way the Pushgateway re-exposes them (Go's FormatFloat 'g' -1: "1.0" -> "1",
 *   "+inf" -> "+Inf"), and summary/histogram counts are truncated to integers as its uint64
 *   fields do. Grouping labels from the push path are NOT applied here (the push handler does).
 * - Every pointer is owned by the request: strings point into the (mutated) request body or into
 *   the arena passed to the parser; arrays live in that arena. Nothing is valid after the arena is
 *   destroyed or the body freed.
 * - Parsers return 0 or a negative EXPFMT_E* code and write a one-line reason into the caller's
 *   err buffer, in the Pushgateway's words where it has words for it
 *   ("text format parsing error in line 3: expected float as value, got \"abc\"").
 */
#ifndef SLUICE_EXPFMT_FAMILY_H
#define SLUICE_EXPFMT_FAMILY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/util/arena.h"

/* Error codes. PARSE and LIMIT are the client's fault (400); NOMEM is the arena limit or OOM. */
#define EXPFMT_OK 0
#define EXPFMT_EPARSE (-1)
#define EXPFMT_ELIMIT (-2)
#define EXPFMT_ENOMEM (-3)

/* Family types (NOT io.prometheus.client.MetricType numbers: convert with expfmt_type_to_proto /
 * expfmt_type_from_proto). INFO, STATESET and UNKNOWN only come from OpenMetrics bodies. */
typedef enum {
    EXPFMT_UNTYPED = 0,
    EXPFMT_COUNTER,
    EXPFMT_GAUGE,
    EXPFMT_SUMMARY,
    EXPFMT_HISTOGRAM,
    EXPFMT_GAUGE_HISTOGRAM,
    EXPFMT_INFO,
    EXPFMT_STATESET,
    EXPFMT_UNKNOWN,
} expfmt_type_t;

/* What part of its family a sample is. */
typedef enum {
    EXPFMT_KIND_VALUE = 0, /* counter, gauge, untyped (and OpenMetrics info/stateset/unknown) */
    EXPFMT_KIND_QUANTILE,  /* summary sample with a quantile label */
    EXPFMT_KIND_SUM,       /* _sum (_gsum for gauge histograms) */
    EXPFMT_KIND_COUNT,     /* _count (_gcount) */
    EXPFMT_KIND_BUCKET,    /* _bucket with an le label */
    EXPFMT_KIND_CREATED,   /* OpenMetrics _created */
} expfmt_kind_t;

typedef struct {
    const char *name; /* series name, suffix included ("rpc_count") */
    label_t *labels;  /* body order, no __name__; see the top of this file */
    uint32_t nlabels;
    uint8_t kind;       /* expfmt_kind_t */
    bool has_timestamp; /* the push handler rejects pushed timestamps, the parser does not */
    double value;
    int64_t timestamp_ms;
} expfmt_sample_t;

typedef struct {
    const char *name;
    const char *help; /* NULL when the body gave none */
    const char *unit; /* OpenMetrics # UNIT, else NULL */
    expfmt_type_t type;
    expfmt_sample_t *samples;
    size_t nsamples;
} expfmt_family_t;

/* Where a sample's line lies in the text body, as byte offsets from the body's start: the line
 * starts at `line`, its value token is [value, value_end) (then a blank or the line's '\n'). */
typedef struct {
    uint32_t line, value, value_end;
} expfmt_span_t;

typedef struct {
    expfmt_family_t *families; /* order of first appearance; never a family with 0 samples */
    size_t nfamilies;
    size_t nsamples; /* over all families */
    /* spans[k] locates sample k, counting families in order and samples within each; NULL
     * unless the parser was asked for them (expfmt_parse_text_spans). */
    expfmt_span_t *spans;
} expfmt_result_t;

/* Caller-chosen bounds; 0 means the built-in default (in brackets). Exceeding one is
 * EXPFMT_ELIMIT with a line-numbered reason. Memory is further bounded by the arena's limit
 * (EXPFMT_ENOMEM). */
typedef struct {
    size_t max_samples;   /* per body [unlimited] */
    size_t max_labels;    /* per sample, quantile/le included [256] */
    size_t max_name_len;  /* metric and label names [1024] */
    size_t max_value_len; /* label values after unescaping [16384] */
} expfmt_limits_t;

/* Body formats, chosen from the Content-Type the way the Pushgateway chooses (anything it does
 * not recognise is text 0.0.4). */
typedef enum {
    EXPFMT_FORMAT_TEXT = 0,    /* text/plain; version=0.0.4 and every unknown type */
    EXPFMT_FORMAT_OPENMETRICS, /* application/openmetrics-text (sluice extension) */
    EXPFMT_FORMAT_PROTO_DELIM, /* application/vnd.google.protobuf; proto=io.prometheus.client.
                                  MetricFamily; encoding=delimited */
} expfmt_format_t;

/* NULL or malformed -> TEXT, as Pushgateway 1.5 does. Parameter names are case-insensitive,
 * values may be quoted. */
expfmt_format_t expfmt_format_from_content_type(const char *content_type);

/* "counter", "gauge", ... as in `# TYPE` lines; "untyped" for UNTYPED. */
const char *expfmt_type_name(expfmt_type_t t);
/* "COUNTER", "GAUGE_HISTOGRAM", ... as the Pushgateway's JSON API spells them (INFO, STATESET
 * and UNKNOWN, which it cannot hold, come out as "UNTYPED"). */
const char *expfmt_type_proto_name(expfmt_type_t t);
/* io.prometheus.client.MetricType value <-> expfmt_type_t; -1 / EXPFMT_UNTYPED when unknown. */
int expfmt_type_to_proto(expfmt_type_t t);
expfmt_type_t expfmt_type_from_proto(int proto_type, bool *ok);

/*
 * Finds two samples with the same series name and the same label set (order-insensitive), which
 * the Pushgateway rejects ("was collected before with the same name and label values").
 * Labels named in `ignore` (the grouping labels the path will override) take no part, and a
 * label named `blank` (NULL: none) with an empty value counts as absent (the Pushgateway gives
 * every metric without an instance label instance="", so those two are one series to it).
 * Returns 0 when none, 1 when found (then *fam, *s1 < *s2 locate them and err says which), or
 * EXPFMT_ENOMEM. Scratch memory comes from `a`. O(samples).
 */
int expfmt_check_duplicates(const expfmt_result_t *r, const char *const *ignore, size_t nignore, const char *blank,
                            arena_t *a, size_t *fam, size_t *s1, size_t *s2, char *err, size_t errlen);

/* Appends Go's strconv.Quote(s[0:n]) rendering (the %q of the Pushgateway's messages) to
 * out[0:outlen], always NUL-terminating; returns the length it wanted. */
size_t expfmt_go_quote(char *out, size_t outlen, const char *s, size_t n);

/* Go's float64 -> uint64 conversion as compiled for amd64 (what the Pushgateway does to counts). */
double expfmt_go_uint64_trunc(double v);

/* ---- module-internal (text_parse.c, proto_parse.c, tests; push/shape.c reads values with the
 * text parser's own expfmt__parse_float, as it must accept exactly the values the parser does) -- */

/* Go's strconv.ParseFloat(s, 64) as prometheus/common's parseFloat wraps it (no 'p', 'P', '_'):
 * decimal syntax, case-insensitive inf/infinity/nan (sign allowed on inf only); overflow is an
 * error. Returns 0 or -1. */
int expfmt__parse_float(const char *s, size_t n, double *out);
/* strconv.ParseInt(s, 10, 64). Returns 0 or -1. */
int expfmt__parse_int64(const char *s, size_t n, int64_t *out);
/* Go's %q of a single byte taken as a rune ('a', '\n', '\x00', 'ÿ'). */
void expfmt__go_quote_rune(char *out, size_t outlen, unsigned char c);

#endif
