/*
 * expfmt protobuf parser — delimited MetricFamily records, unpacked by protobuf-c into the
 * request arena, then flattened into families and component samples.
 *
 * Body layout (repeated until the body ends exactly at a record boundary):
 *
 *   offset  size      field
 *   0       1..5      uvarint n: length of the record (Go's ReadDelimited reads at most 5 bytes)
 *   k       n         io.prometheus.client.MetricFamily (internal/proto/metrics.proto)
 *
 * Errors: a length varint longer than 5 bytes ("invalid varint32 encountered", the
 * Pushgateway's words), a record running past the end ("unexpected EOF"), a record protobuf-c
 * cannot decode. Stricter than Pushgateway 1.5 on purpose: it silently accepts a body that ends
 * inside a length varint or right after a length (its reader sees io.EOF there); sluice rejects
 * both as truncated.
 *
 * Flattening (what the Pushgateway would re-expose, hence what a scraping Prometheus stores):
 *   counter/gauge/untyped  -> <name> value
 *   summary                -> <name>{quantile=q} per quantile, <name>_sum, <name>_count
 *   histogram (gauge too)  -> <name>_bucket{le=b} per bucket, <name>_sum, <name>_count
 * quantile/le values are rendered as Go's FormatFloat 'g' -1; _sum/_count only when the record
 * has them (the Pushgateway would expose a missing one as 0; see family.h). A bucket's
 * cumulative_count_float / a histogram's sample_count_float win over the integer fields when set.
 * A later record with the same family name replaces the earlier one (the Pushgateway keys a map
 * by name). Families without metrics are dropped. Checks the Pushgateway makes later in its
 * consistency pass and that only a protobuf body can fail are made here: metric and label name
 * syntax, duplicate label names, UTF-8 label values, the value field matching the type, no explicit
 * quantile/le label on a summary/histogram.
 *
 * Memory: protobuf-c allocates from the arena (its free is a no-op), so a record can never take
 * more than the arena limit, and nothing needs freeing on any path.
 */
#include "internal/expfmt/proto_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal/proto/metrics.pb-c.h"
#include "internal/util/buf.h"
#include "internal/util/utf8.h"
#include "internal/util/varint.h"

#define DEF_MAX_LABELS 256
#define DEF_MAX_NAME 1024
#define DEF_MAX_VALUE 16384

typedef Io__Prometheus__Client__MetricFamily pb_family_t;
typedef Io__Prometheus__Client__Metric pb_metric_t;

typedef struct {
    arena_t *a;
    char *err;
    size_t errlen;
    size_t record; /* 1-based, for messages */
    size_t max_samples, max_labels, max_name, max_value;
    buf_t fbuf;
} pp_t;

static int pp_fail(pp_t *pp, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pp_fail(pp_t *pp, int rc, const char *fmt, ...)
{
    if (pp->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pp->err, pp->errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static void *pp_alloc(void *data, size_t size)
{
    return arena_try_alloc((arena_t *)data, size);
}
static void pp_free(void *data, void *ptr) {}

static bool valid_name(const char *s, bool metric)
{
    if (!*s)
        return false;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (metric && c == ':') ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return false;
    }
    return true;
}

/* ------------------------------------------------------------------------ records */

size_t expfmt_proto_put_delimited(uint8_t *out, size_t cap, const uint8_t *msg, size_t n)
{
    uint8_t hdr[VARINT_MAX];
    size_t h = varint_encode(hdr, n);
    if (h + n > cap)
        return 0;
    memcpy(out, hdr, h);
    memcpy(out + h, msg, n);
    return h + n;
}

/* Reads the record length at body[*off]. 0 ok, else an error already written. */
static int read_len(pp_t *pp, const uint8_t *body, size_t len, size_t *off, uint64_t *n)
{
    const uint8_t *p = body + *off;
    switch (varint_get_max(&p, body + len, 5, n)) { /* a varint32, as Go's pbutil.ReadDelimited */
    case VARINT_OK: *off = (size_t)(p - body); return 0;
    case VARINT_ETRUNC: return pp_fail(pp, EXPFMT_EPARSE, "unexpected EOF (record %zu: truncated length)", pp->record);
    default: return pp_fail(pp, EXPFMT_EPARSE, "invalid varint32 encountered");
    }
}

/* ------------------------------------------------------------------------ flattening */

static int check_labels(pp_t *pp, const pb_family_t *mf, const pb_metric_t *m, size_t extra)
{
    if (m->n_label + extra > pp->max_labels)
        return pp_fail(pp, EXPFMT_ELIMIT, "metric %s: more than %zu labels in one sample", mf->name, pp->max_labels);
    for (size_t i = 0; i < m->n_label; i++) {
        const char *ln = m->label[i]->name ? m->label[i]->name : "";
        const char *lv = m->label[i]->value ? m->label[i]->value : "";
        size_t lvn = strlen(lv);
        if (strlen(ln) > pp->max_name)
            return pp_fail(pp, EXPFMT_ELIMIT, "label name longer than %zu bytes", pp->max_name);
        if (lvn > pp->max_value)
            return pp_fail(pp, EXPFMT_ELIMIT, "label value longer than %zu bytes", pp->max_value);
        if (!valid_name(ln, false) || strcmp(ln, "__name__") == 0)
            return pp_fail(pp, EXPFMT_EPARSE, "collected metric \"%s\" has a label with an invalid name: %s", mf->name,
                           ln);
        if ((mf->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__SUMMARY && strcmp(ln, "quantile") == 0) ||
            ((mf->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM ||
              mf->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE_HISTOGRAM) &&
             strcmp(ln, "le") == 0))
            return pp_fail(pp, EXPFMT_EPARSE, "collected metric \"%s\" must not have an explicit \"%s\" label",
                           mf->name, ln);
        if (!utf8_valid(lv, lvn)) {
            char q[320];
            expfmt_go_quote(q, sizeof(q), lv, lvn);
            return pp_fail(pp, EXPFMT_EPARSE,
                           "collected metric \"%s\" has a label named \"%s\" whose value is not utf8: %s", mf->name, ln,
                           q);
        }
        for (size_t j = 0; j < i; j++)
            if (m->label[j]->name && strcmp(m->label[j]->name, ln) == 0)
                return pp_fail(pp, EXPFMT_EPARSE,
                               "collected metric \"%s\" has two or more labels with the same name: %s", mf->name, ln);
    }
    return 0;
}

/* Labels of m (+ one extra slot for quantile/le when `extra`). */
static label_t *copy_labels(pp_t *pp, const pb_metric_t *m, bool extra)
{
    size_t n = m->n_label + (extra ? 1 : 0);
    if (!n)
        return NULL;
    label_t *l = arena_try_alloc(pp->a, n * sizeof(*l));
    if (!l)
        return NULL;
    for (size_t i = 0; i < m->n_label; i++) {
        l[i].name = m->label[i]->name ? m->label[i]->name : "";
        l[i].value = m->label[i]->value ? m->label[i]->value : "";
    }
    return l;
}

static const char *float_str(pp_t *pp, double v)
{
    buf_reset(&pp->fbuf);
    buf_put_float(&pp->fbuf, v);
    return arena_strndup(pp->a, pp->fbuf.data, pp->fbuf.len);
}

static size_t samples_of(const pb_family_t *mf)
{
    size_t n = 0;
    for (size_t i = 0; i < mf->n_metric; i++) {
        const pb_metric_t *m = mf->metric[i];
        switch (mf->type) {
        case IO__PROMETHEUS__CLIENT__METRIC_TYPE__SUMMARY: n += (m->summary ? m->summary->n_quantile : 0) + 2; break;
        case IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM:
        case IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE_HISTOGRAM:
            n += (m->histogram ? m->histogram->n_bucket : 0) + 2;
            break;
        default: n += 1;
        }
    }
    return n;
}

typedef struct {
    expfmt_sample_t *s;
    size_t n;
} out_t;

static void put(out_t *o, const char *name, label_t *l, size_t nl, expfmt_kind_t kind, double v, const pb_metric_t *m)
{
    expfmt_sample_t *s = &o->s[o->n++];
    s->name = name;
    s->labels = nl ? l : NULL;
    s->nlabels = (uint32_t)nl;
    s->kind = (uint8_t)kind;
    s->value = v;
    s->has_timestamp = m->has_timestamp_ms;
    s->timestamp_ms = m->has_timestamp_ms ? m->timestamp_ms : 0;
}

/* Flattens one family into f (samples allocated here). */
static int flatten(pp_t *pp, const pb_family_t *mf, expfmt_family_t *f)
{
    bool ok;
    f->type = expfmt_type_from_proto((int)mf->type, &ok);
    if (!ok)
        return pp_fail(pp, EXPFMT_EPARSE, "metric family \"%s\": unknown metric type %d", mf->name, (int)mf->type);
    f->name = mf->name;
    f->help = mf->help;
    f->unit = NULL;
    size_t cap = samples_of(mf);
    out_t o = {arena_try_alloc(pp->a, (cap ? cap : 1) * sizeof(expfmt_sample_t)), 0};
    if (!o.s)
        return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
    const char *sum_name = NULL, *count_name = NULL, *bucket_name = NULL;
    if (f->type == EXPFMT_SUMMARY || f->type == EXPFMT_HISTOGRAM || f->type == EXPFMT_GAUGE_HISTOGRAM) {
        sum_name = arena_sprintf(pp->a, "%s_sum", mf->name);
        count_name = arena_sprintf(pp->a, "%s_count", mf->name);
        bucket_name = arena_sprintf(pp->a, "%s_bucket", mf->name);
    }
    static const char *const want[] = {"counter", "gauge", "summary", "untyped", "histogram", "gauge histogram"};
    for (size_t i = 0; i < mf->n_metric; i++) {
        const pb_metric_t *m = mf->metric[i];
        bool quant = f->type == EXPFMT_SUMMARY, hist = f->type == EXPFMT_HISTOGRAM || f->type == EXPFMT_GAUGE_HISTOGRAM;
        int rc = check_labels(pp, mf, m, quant || hist);
        if (rc)
            return rc;
        const void *field = NULL;
        double v = 0;
        switch (f->type) {
        case EXPFMT_COUNTER:
            field = m->counter;
            v = m->counter ? m->counter->value : 0;
            break;
        case EXPFMT_GAUGE:
            field = m->gauge;
            v = m->gauge ? m->gauge->value : 0;
            break;
        case EXPFMT_UNTYPED:
            field = m->untyped;
            v = m->untyped ? m->untyped->value : 0;
            break;
        case EXPFMT_SUMMARY: field = m->summary; break;
        default: field = m->histogram; break;
        }
        if (!field)
            return pp_fail(pp, EXPFMT_EPARSE, "collected metric \"%s\" is not a %s", mf->name, want[mf->type]);
        label_t *base = copy_labels(pp, m, false);
        if (m->n_label && !base)
            return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
        size_t nl = m->n_label;
        if (!quant && !hist) {
            put(&o, mf->name, base, nl, EXPFMT_KIND_VALUE, v, m);
            continue;
        }
        if (quant) {
            const Io__Prometheus__Client__Summary *s = m->summary;
            for (size_t q = 0; q < s->n_quantile; q++) {
                label_t *l = copy_labels(pp, m, true);
                const char *qs = float_str(pp, s->quantile[q]->quantile);
                if (!l || !qs)
                    return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
                l[nl].name = "quantile";
                l[nl].value = qs;
                put(&o, mf->name, l, nl + 1, EXPFMT_KIND_QUANTILE, s->quantile[q]->value, m);
            }
            if (s->has_sample_sum)
                put(&o, sum_name, base, nl, EXPFMT_KIND_SUM, s->sample_sum, m);
            if (s->has_sample_count)
                put(&o, count_name, base, nl, EXPFMT_KIND_COUNT, (double)s->sample_count, m);
        } else {
            const Io__Prometheus__Client__Histogram *h = m->histogram;
            for (size_t b = 0; b < h->n_bucket; b++) {
                const Io__Prometheus__Client__Bucket *bk = h->bucket[b];
                label_t *l = copy_labels(pp, m, true);
                const char *le = float_str(pp, bk->upper_bound);
                if (!l || !le)
                    return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
                l[nl].name = "le";
                l[nl].value = le;
                double c = bk->has_cumulative_count_float ? bk->cumulative_count_float : (double)bk->cumulative_count;
                put(&o, bucket_name, l, nl + 1, EXPFMT_KIND_BUCKET, c, m);
            }
            if (h->has_sample_sum)
                put(&o, sum_name, base, nl, EXPFMT_KIND_SUM, h->sample_sum, m);
            if (h->has_sample_count || h->has_sample_count_float)
                put(&o, count_name, base, nl, EXPFMT_KIND_COUNT,
                    h->has_sample_count_float ? h->sample_count_float : (double)h->sample_count, m);
        }
    }
    f->samples = o.s;
    f->nsamples = o.n;
    return 0;
}

/* ------------------------------------------------------------------------ driver */

static int parse_all(pp_t *pp, const uint8_t *body, size_t len, expfmt_result_t *out)
{
    ProtobufCAllocator alloc = {pp_alloc, pp_free, pp->a};
    size_t capf = 16, nf = 0, total = 0;
    pb_family_t **mfs = arena_try_alloc(pp->a, capf * sizeof(*mfs));
    if (!mfs)
        return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
    size_t off = 0;
    while (off < len) {
        pp->record++;
        uint64_t n = 0;
        int rc = read_len(pp, body, len, &off, &n);
        if (rc)
            return rc;
        if (n > len - off)
            return pp_fail(pp, EXPFMT_EPARSE, "unexpected EOF (record %zu: %llu bytes announced, %zu left)", pp->record,
                           (unsigned long long)n, len - off);
        pb_family_t *mf = io__prometheus__client__metric_family__unpack(&alloc, (size_t)n, body + off);
        if (!mf)
            return pp_fail(pp, EXPFMT_EPARSE, "record %zu: invalid MetricFamily protobuf (or memory limit reached)",
                           pp->record);
        off += (size_t)n;
        if (!mf->name)
            mf->name = "";
        /* The Pushgateway keys families by name: a later record replaces an earlier one. */
        size_t slot = nf;
        for (size_t i = 0; i < nf; i++)
            if (strcmp(mfs[i]->name, mf->name) == 0) {
                slot = i;
                break;
            }
        if (slot == nf) {
            if (nf == capf) {
                pb_family_t **nm = arena_try_alloc(pp->a, 2 * capf * sizeof(*nm));
                if (!nm)
                    return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
                memcpy(nm, mfs, nf * sizeof(*nm));
                mfs = nm;
                capf *= 2;
            }
            nf++;
        }
        mfs[slot] = mf;
    }
    size_t kept = 0;
    for (size_t i = 0; i < nf; i++) {
        if (!mfs[i]->n_metric)
            continue;
        if (strlen(mfs[i]->name) > pp->max_name)
            return pp_fail(pp, EXPFMT_ELIMIT, "metric name longer than %zu bytes", pp->max_name);
        if (!valid_name(mfs[i]->name, true)) {
            char q[320];
            expfmt_go_quote(q, sizeof(q), mfs[i]->name, strlen(mfs[i]->name));
            return pp_fail(pp, EXPFMT_EPARSE, "%s is not a valid metric name", q);
        }
        total += samples_of(mfs[i]);
        if (total > pp->max_samples)
            return pp_fail(pp, EXPFMT_ELIMIT, "more than %zu samples", pp->max_samples);
        mfs[kept++] = mfs[i];
    }
    expfmt_family_t *fams = arena_try_alloc(pp->a, (kept ? kept : 1) * sizeof(*fams));
    if (!fams)
        return pp_fail(pp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
    size_t ns = 0, nfo = 0;
    for (size_t i = 0; i < kept; i++) {
        int rc = flatten(pp, mfs[i], &fams[nfo]);
        if (rc)
            return rc;
        if (!fams[nfo].nsamples) /* e.g. summaries with neither quantiles nor sum/count */
            continue;
        ns += fams[nfo].nsamples;
        nfo++;
    }
    out->families = fams;
    out->nfamilies = nfo;
    out->nsamples = ns;
    return 0;
}

int expfmt_parse_proto(const uint8_t *body, size_t len, const expfmt_limits_t *lim, arena_t *a, expfmt_result_t *out,
                       char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (errlen)
        err[0] = 0;
    pp_t pp = {.a = a, .err = err, .errlen = errlen};
    pp.max_samples = lim && lim->max_samples ? lim->max_samples : SIZE_MAX;
    pp.max_labels = lim && lim->max_labels ? lim->max_labels : DEF_MAX_LABELS;
    pp.max_name = lim && lim->max_name_len ? lim->max_name_len : DEF_MAX_NAME;
    pp.max_value = lim && lim->max_value_len ? lim->max_value_len : DEF_MAX_VALUE;
    buf_init(&pp.fbuf);
    int rc = parse_all(&pp, body, len, out);
    buf_free(&pp.fbuf);
    if (rc)
        memset(out, 0, sizeof(*out));
    return rc;
}
