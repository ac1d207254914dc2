/*
 * remote — Prometheus remote storage on top of storage/: remote write 1.0 in, remote read out,
 * and the metadata remote write carries.
 *
 * ---- POST /api/v1/write ------------------------------------------------------------------------
 *
 *   body (snappy block) --snappy_uncompressed_length, bounded--> WriteRequest bytes
 *     --remote_write_decode (hand-written, arena-owned, validates)--> samples + metadata
 *     --storage_append (WAL before the reply)--> 204
 *
 * The decoder is hand-written because it is the ingest hot path: two passes over the bytes (count,
 * then fill arrays allocated once), strings copied into the request arena, no per-message heap
 * allocation. The generated protobuf-c decoder (internal/proto/remote.proto) is its reference in
 * tests/unit/api/test_remote.c. Unknown fields are skipped as proto3 requires; a known field with
 * the wrong wire type is a decode error.
 *
 * Status codes (Prometheus senders never retry 4xx except 429, and retry 5xx with backoff):
 *
 *   condition                                                        status
 *   snappy or protobuf undecodable, wrong wire types                 400
 *   label name invalid / duplicate, empty label value, no __name__,
 *     invalid UTF-8, timestamps not increasing inside one series     400, nothing stored
 *   more samples or series than --storage.max-*-per-request          400, nothing stored
 *   uncompressed size above the decode limit                         413, nothing stored
 *   sample older than its series' newest, or before raw retention    400, the other samples of
 *                                                                    the request are stored
 *   Content-Type proto=io.prometheus.write.v2.Request                415 (2.0 is not supported)
 *   Content-Encoding other than snappy                               415
 *   storage recovering, WAL write failed, out of memory,
 *     --storage.max-series reached                                   503 (a retry can succeed)
 *
 * Why the in-order samples of a request stay stored when some are out of order: the sender
 * drops a 400 batch for good, so keeping what was valid loses less; and a retried batch is
 * idempotent for samples that were stored (same timestamp = same-second replace).
 * Sub-second samples: the raw tier keeps one sample per series per second; within a request a
 * series' timestamps must increase, and a later sample in the same second as the series' newest
 * replaces it (so a 1 s scrape with jitter keeps the newest of two scrapes that share a second).
 * Native histograms and exemplars are skipped (counted in sluice_remote_write_*_dropped_total);
 * refusing the request would also drop the float samples it carries.
 *
 * ---- POST /api/v1/read ---------------------------------------------------------------------------
 *
 * ReadRequest (snappy, protobuf-c) -> response type: none listed -> SAMPLES; else the first listed
 * type sluice knows (SAMPLES, STREAMED_XOR_CHUNKS); none known -> 400. Every query's matchers are
 * built first (a bad regex is a 400 before anything is sent); the hints go to the querier so long
 * ranges come from roll-ups.
 *
 * SAMPLES: ReadResponse{results: one QueryResult per query, in order}, series sorted, samples
 * time-ordered within [start, end]; built in memory (bounded by --storage.remote.read-sample-limit
 * for the whole request: above it the answer is 400 "exceeded sample limit (N)", Prometheus' words.
 * Prometheus counts per query, so a request repeating one query 400 times could take 400 times
 * the limit; here the queries of a request share it), snappy compressed, Content-Type
 * application/x-protobuf, Content-Encoding snappy. The bytes it builds (response, its pieces, the
 * compressed copy) are charged before they are taken to a per-request budget
 * (--query.max-memory-per-query: 400 beyond it) under the budget queries share
 * (--query.max-memory: 503 while others hold it), and the request gives up after --query.timeout
 * (503), checked as samples are read.
 *
 * STREAMED_XOR_CHUNKS: chunked HTTP reply, Content-Type
 * "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse", a stream of frames:
 *
 *   offset  size    field
 *   0       1..10   uvarint: length n of the message
 *   ..      4       big-endian CRC-32C (Castagnoli) of the message
 *   ..      n       ChunkedReadResponse{chunked_series: [one ChunkedSeries], query_index}
 *
 * As in Prometheus 2.42: one series per frame at most, a series spans several frames when its
 * chunks exceed the frame budget (--storage.remote.read-max-bytes-in-frame; a frame exceeds it by
 * at most one chunk), series in label order, queries in request order, no sample limit.
 * Chunks are the querier's bytes as they are (raw XOR chunks from the ring; roll-up data comes
 * from the tiered querier already re-encoded as XOR chunks of at most 120 samples). A chunk only
 * partly inside [start, end] is re-encoded with just the samples inside, as Prometheus 2.42's TSDB
 * trims chunks at the query range for remote read.
 *
 * Flow control: frames are batched into pieces of about one frame budget; a piece is handed to
 * api_reply_stream_chunk and the next is produced only in its drained callback, once the kernel
 * took the previous one. A slow reader therefore holds at most ~2 budgets of sluice's memory,
 * whatever the response size. A querier error mid-stream writes the error text into the stream
 * (as Prometheus does), so the client fails to decode a frame instead of taking a short answer
 * for a complete one; so does running past --query.timeout.
 *
 * ---- GET /api/v1/metadata ------------------------------------------------------------------------
 *
 * Metadata from WriteRequest.metadata, newest per metric family name, bounded by
 * metadata_max_metrics (names beyond it are dropped and counted). Shape and parameters (limit,
 * limit_per_metric, metric) follow Prometheus' /api/v1/metadata; metrics come out sorted by name.
 */
#include "api/remote.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal/proto/remote.pb-c.h"
#include "api/router.h"
#include "internal/labels/matcher.h"
#include "internal/util/clock.h"
#include "internal/util/crc32c.h"
#include "internal/util/heap.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "internal/util/utf8.h"
#include "internal/util/varint.h"
#include "storage/chunk_xor.h"

#define REMOTE_DEFAULT_DECODE_LIMIT (32u << 20)
#define REMOTE_DEFAULT_FRAME_BYTES (1u << 20)
#define REMOTE_DEFAULT_METADATA 10000
#define REMOTE_MAX_LABELS 256

#define CT_STREAMED "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"

typedef struct {
    char *name, *help, *unit;
    uint8_t type;
} meta_entry_t;

struct api_remote {
    api_remote_options_t opt;
    /* metadata, sorted by name */
    pthread_mutex_t meta_mu;
    meta_entry_t *meta;
    size_t nmeta, capmeta;
    /* self-metrics */
    atomic_uint_least64_t w_requests, w_samples, w_rejected, w_failed_samples, w_histograms, w_exemplars;
    atomic_uint_least64_t meta_dropped;
    atomic_uint_least64_t r_samples_req, r_streamed_req, r_rejected, r_frames, r_chunks_reencoded;
};

/* ==== protobuf wire reading ===================================================================== */

typedef struct {
    const uint8_t *p, *end;
} pbr_t;

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

static int pbr_key(pbr_t *r, uint32_t *field, int *wire)
{
    uint64_t k;
    if (varint_get(&r->p, r->end, &k) < 0 || (k >> 3) == 0 || (k >> 3) > 0x1fffffff)
        return -1;
    *field = (uint32_t)(k >> 3);
    *wire = (int)(k & 7);
    return 0;
}

static int pbr_len(pbr_t *r, const uint8_t **b, size_t *n)
{
    uint64_t l;
    if (varint_get(&r->p, r->end, &l) < 0 || l > (uint64_t)(r->end - r->p))
        return -1;
    *b = r->p;
    *n = (size_t)l;
    r->p += l;
    return 0;
}

static int pbr_fixed64(pbr_t *r, uint64_t *v)
{
    if (r->end - r->p < 8)
        return -1;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--)
        x = x << 8 | r->p[i];
    r->p += 8;
    *v = x;
    return 0;
}

static int pbr_skip(pbr_t *r, int wire)
{
    uint64_t v;
    const uint8_t *b;
    size_t n;
    switch (wire) {
    case WT_VARINT: return varint_get(&r->p, r->end, &v);
    case WT_I64: return pbr_fixed64(r, &v);
    case WT_LEN: return pbr_len(r, &b, &n);
    case WT_I32:
        if (r->end - r->p < 4)
            return -1;
        r->p += 4;
        return 0;
    default: return -1; /* groups (3, 4) do not exist in proto3; 6, 7 are invalid */
    }
}

/* ==== WriteRequest decoding ======================================================================= */

/* Counts what one TimeSeries holds and checks its wire format. */
static int ts_count(const uint8_t *b, size_t n, size_t *nlabels, size_t *nsamples)
{
    pbr_t r = {b, b + n};
    while (r.p < r.end) {
        uint32_t f;
        int w;
        if (pbr_key(&r, &f, &w) < 0)
            return -1;
        if ((f >= 1 && f <= 4) && w != WT_LEN)
            return -1;
        if (f == 1)
            (*nlabels)++;
        else if (f == 2)
            (*nsamples)++;
        if (pbr_skip(&r, w) < 0)
            return -1;
    }
    return 0;
}

static char *dup_str(arena_t *a, const uint8_t *b, size_t n)
{
    char *s = arena_try_alloc(a, n + 1);
    if (s) {
        memcpy(s, b, n);
        s[n] = 0;
    }
    return s;
}

/* Parses a Label or the string fields of a MetricMetadata: fields whose numbers are listed get
 * their string copied into out[i]; a varint field `vfield` (0 = none) goes to *vout. */
static int msg_strings(const uint8_t *b, size_t n, const uint32_t *fields, size_t nf, const uint8_t **sb, size_t *sn,
                       uint32_t vfield, uint64_t *vout)
{
    pbr_t r = {b, b + n};
    while (r.p < r.end) {
        uint32_t f;
        int w;
        if (pbr_key(&r, &f, &w) < 0)
            return -1;
        size_t i;
        for (i = 0; i < nf && fields[i] != f; i++)
            ;
        if (i < nf) {
            if (w != WT_LEN || pbr_len(&r, &sb[i], &sn[i]) < 0)
                return -1;
        } else if (vfield && f == vfield) {
            if (w != WT_VARINT || varint_get(&r.p, r.end, vout) < 0)
                return -1;
        } else if (pbr_skip(&r, w) < 0) {
            return -1;
        }
    }
    return 0;
}

static int label_cmp(const void *a, const void *b)
{
    return strcmp(((const label_t *)a)->name, ((const label_t *)b)->name);
}

/* Describes a label set for error messages: {__name__="x", a="b"} (truncated). */
static void describe_labels(const labels_t *ls, char *out, size_t len)
{
    size_t k = 0;
    k += (size_t)snprintf(out + k, len - k, "{");
    for (size_t i = 0; i < ls->n && k < len; i++)
        k += (size_t)snprintf(out + k, len - k, "%s%s=\"%s\"", i ? ", " : "", ls->v[i].name, ls->v[i].value);
    if (k < len)
        snprintf(out + k, len - k, "}");
}

static int ts_check_labels(labels_t *ls, char *err, size_t errlen)
{
    char desc[256];
    if (ls->n > 1)
        qsort(ls->v, ls->n, sizeof(label_t), label_cmp);
    const char *metric = NULL;
    for (size_t i = 0; i < ls->n; i++) {
        const label_t *l = &ls->v[i];
        size_t nl = strlen(l->name), vl = strlen(l->value);
        if (!labels_valid_name(l->name, nl)) {
            describe_labels(ls, desc, sizeof(desc));
            snprintf(err, errlen, "invalid label name \"%.64s\" in series %s", l->name, desc);
            return -1;
        }
        if (i > 0 && strcmp(ls->v[i - 1].name, l->name) == 0) {
            describe_labels(ls, desc, sizeof(desc));
            snprintf(err, errlen, "duplicate label name \"%s\" in series %s", l->name, desc);
            return -1;
        }
        if (vl == 0) {
            describe_labels(ls, desc, sizeof(desc));
            snprintf(err, errlen, "empty value for label \"%s\" in series %s", l->name, desc);
            return -1;
        }
        if (!utf8_valid(l->value, vl)) {
            snprintf(err, errlen, "label \"%s\" has a value that is not valid UTF-8", l->name);
            return -1;
        }
        if (strcmp(l->name, LABEL_METRIC_NAME) == 0)
            metric = l->value;
    }
    if (!metric) {
        describe_labels(ls, desc, sizeof(desc));
        snprintf(err, errlen, "series %s has no __name__ label", desc);
        return -1;
    }
    if (!labels_valid_metric_name(metric, strlen(metric))) {
        snprintf(err, errlen, "invalid metric name \"%.128s\"", metric);
        return -1;
    }
    return 0;
}

/* Fills one series: labels into lv (capacity nl), samples into ss. Returns samples written. */
static int ts_fill(const uint8_t *b, size_t n, arena_t *a, label_t *lv, size_t nl, storage_sample_t *ss, size_t *nss,
                   remote_write_req_t *out, char *err, size_t errlen)
{
    pbr_t r = {b, b + n};
    size_t kl = 0, ks = 0;
    while (r.p < r.end) {
        uint32_t f;
        int w;
        const uint8_t *mb;
        size_t mn;
        if (pbr_key(&r, &f, &w) < 0)
            return REMOTE_ERR_DECODE;
        if (f < 1 || f > 4) {
            if (pbr_skip(&r, w) < 0)
                return REMOTE_ERR_DECODE;
            continue;
        }
        if (pbr_len(&r, &mb, &mn) < 0) /* wire type checked by ts_count */
            return REMOTE_ERR_DECODE;
        if (f == 1) {
            static const uint32_t lf[2] = {1, 2};
            const uint8_t *sb[2] = {(const uint8_t *)"", (const uint8_t *)""};
            size_t sn[2] = {0, 0};
            if (msg_strings(mb, mn, lf, 2, sb, sn, 0, NULL) < 0)
                return REMOTE_ERR_DECODE;
            assert(kl < nl);
            lv[kl].name = dup_str(a, sb[0], sn[0]);
            lv[kl].value = dup_str(a, sb[1], sn[1]);
            if (!lv[kl].name || !lv[kl].value)
                return REMOTE_ERR_NOMEM;
            kl++;
        } else if (f == 2) {
            pbr_t sr = {mb, mb + mn};
            double v = 0;
            int64_t t = 0;
            while (sr.p < sr.end) {
                uint32_t sf;
                int sw;
                uint64_t x;
                if (pbr_key(&sr, &sf, &sw) < 0)
                    return REMOTE_ERR_DECODE;
                if (sf == 1) {
                    if (sw != WT_I64 || pbr_fixed64(&sr, &x) < 0)
                        return REMOTE_ERR_DECODE;
                    memcpy(&v, &x, sizeof(v));
                } else if (sf == 2) {
                    if (sw != WT_VARINT || varint_get(&sr.p, sr.end, &x) < 0)
                        return REMOTE_ERR_DECODE;
                    t = (int64_t)x;
                } else if (pbr_skip(&sr, sw) < 0) {
                    return REMOTE_ERR_DECODE;
                }
            }
            ss[ks].t = t;
            ss[ks].v = v;
            ks++;
        } else if (f == 3) {
            out->nexemplars++;
        } else {
            out->nhistograms++;
        }
    }
    assert(kl == nl);
    labels_t ls = {lv, nl};
    if (ts_check_labels(&ls, err, errlen) < 0)
        return REMOTE_ERR_INVALID;
    for (size_t i = 0; i < ks; i++) {
        if (i > 0 && ss[i].t <= ss[i - 1].t) {
            char desc[256];
            describe_labels(&ls, desc, sizeof(desc));
            snprintf(err, errlen, "out of order sample: timestamp %" PRId64 " after %" PRId64 " in series %s", ss[i].t,
                     ss[i - 1].t, desc);
            return REMOTE_ERR_INVALID;
        }
        ss[i].labels = ls;
    }
    *nss = ks;
    return REMOTE_OK;
}

int remote_write_decode(const uint8_t *buf, size_t len, size_t max_samples, arena_t *a, remote_write_req_t *out,
                        char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    /* Pass 1: wire format and sizes. */
    size_t nts = 0, nlabels = 0, nsamples = 0, nmeta = 0;
    pbr_t r = {buf, buf + len};
    while (r.p < r.end) {
        uint32_t f;
        int w;
        const uint8_t *mb;
        size_t mn;
        if (pbr_key(&r, &f, &w) < 0)
            goto bad;
        if (f == 1 || f == 3) {
            if (w != WT_LEN || pbr_len(&r, &mb, &mn) < 0)
                goto bad;
            if (f == 1) {
                size_t nl = 0, ns = 0;
                if (ts_count(mb, mn, &nl, &ns) < 0)
                    goto bad;
                if (nl > REMOTE_MAX_LABELS) {
                    snprintf(err, errlen, "a series has %zu labels, more than the limit of %d", nl, REMOTE_MAX_LABELS);
                    return REMOTE_ERR_INVALID;
                }
                nts++;
                nlabels += nl;
                nsamples += ns;
            } else {
                nmeta++;
            }
        } else if (pbr_skip(&r, w) < 0) {
            goto bad;
        }
    }
    if (max_samples && nsamples > max_samples) {
        snprintf(err, errlen, "request has %zu samples, more than the limit of %zu", nsamples, max_samples);
        return REMOTE_ERR_LIMIT;
    }
    label_t *lpool = arena_try_alloc(a, (nlabels ? nlabels : 1) * sizeof(label_t));
    out->samples = arena_try_alloc(a, (nsamples ? nsamples : 1) * sizeof(storage_sample_t));
    out->metadata = arena_try_alloc(a, (nmeta ? nmeta : 1) * sizeof(remote_metadata_t));
    if (!lpool || !out->samples || !out->metadata) {
        snprintf(err, errlen, "out of memory decoding the request");
        return REMOTE_ERR_NOMEM;
    }

    /* Pass 2: fill. */
    r = (pbr_t){buf, buf + len};
    size_t kl = 0;
    while (r.p < r.end) {
        uint32_t f;
        int w;
        const uint8_t *mb;
        size_t mn;
        if (pbr_key(&r, &f, &w) < 0)
            goto bad;
        if (f != 1 && f != 3) {
            if (pbr_skip(&r, w) < 0)
                goto bad;
            continue;
        }
        if (pbr_len(&r, &mb, &mn) < 0)
            goto bad;
        if (f == 1) {
            size_t nl = 0, ns = 0, got = 0;
            if (ts_count(mb, mn, &nl, &ns) < 0)
                goto bad;
            int rc = ts_fill(mb, mn, a, lpool + kl, nl, out->samples + out->nsamples, &got, out, err, errlen);
            if (rc == REMOTE_ERR_DECODE)
                goto bad;
            if (rc != REMOTE_OK)
                return rc;
            assert(got == ns);
            kl += nl;
            out->nsamples += got;
            out->nseries += got > 0;
        } else {
            static const uint32_t mf[3] = {2, 4, 5};
            const uint8_t *sb[3] = {(const uint8_t *)"", (const uint8_t *)"", (const uint8_t *)""};
            size_t sn[3] = {0, 0, 0};
            uint64_t type = 0;
            if (msg_strings(mb, mn, mf, 3, sb, sn, 1, &type) < 0)
                goto bad;
            if (sn[0] == 0)
                continue; /* nameless metadata: nothing to key it by */
            remote_metadata_t *m = &out->metadata[out->nmetadata];
            m->type = type <= 7 ? (uint8_t)type : 0;
            m->name = dup_str(a, sb[0], sn[0]);
            m->help = dup_str(a, sb[1], sn[1]);
            m->unit = dup_str(a, sb[2], sn[2]);
            if (!m->name || !m->help || !m->unit) {
                snprintf(err, errlen, "out of memory decoding the request");
                return REMOTE_ERR_NOMEM;
            }
            if (!utf8_valid(m->help, sn[1]) || !utf8_valid(m->unit, sn[2]) || !utf8_valid(m->name, sn[0])) {
                snprintf(err, errlen, "metadata of \"%.64s\" is not valid UTF-8", m->name);
                return REMOTE_ERR_INVALID;
            }
            out->nmetadata++;
        }
    }
    return REMOTE_OK;
bad:
    snprintf(err, errlen, "cannot decode the WriteRequest: malformed protobuf at byte %zu of %zu", (size_t)(r.p - buf),
             len);
    return REMOTE_ERR_DECODE;
}

/* ==== metadata store ============================================================================== */

static const char *const meta_type_names[8] = {"unknown",        "counter", "gauge", "histogram",
                                               "gaugehistogram", "summary", "info",  "stateset"};

/* Binary search; returns the index of name or where it would go. */
static size_t meta_find(const api_remote_t *r, const char *name, bool *found)
{
    size_t lo = 0, hi = r->nmeta;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(r->meta[mid].name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static void meta_put(api_remote_t *r, const remote_metadata_t *m)
{
    bool found;
    size_t i = meta_find(r, m->name, &found);
    if (found) {
        meta_entry_t *e = &r->meta[i];
        if (e->type == m->type && strcmp(e->help, m->help) == 0 && strcmp(e->unit, m->unit) == 0)
            return; /* the usual case: the same metadata every minute */
        char *help = strdup(m->help), *unit = strdup(m->unit);
        if (!help || !unit) {
            free(help);
            free(unit);
            return;
        }
        free(e->help);
        free(e->unit);
        e->help = help;
        e->unit = unit;
        e->type = m->type;
        return;
    }
    if (r->nmeta >= r->opt.metadata_max_metrics) {
        atomic_fetch_add(&r->meta_dropped, 1);
        return;
    }
    if (r->nmeta == r->capmeta) {
        size_t nc = r->capmeta ? r->capmeta * 2 : 64;
        meta_entry_t *p = realloc(r->meta, nc * sizeof(*p));
        if (!p)
            return;
        r->meta = p;
        r->capmeta = nc;
    }
    meta_entry_t e = {strdup(m->name), strdup(m->help), strdup(m->unit), m->type};
    if (!e.name || !e.help || !e.unit) {
        free(e.name);
        free(e.help);
        free(e.unit);
        return;
    }
    memmove(&r->meta[i + 1], &r->meta[i], (r->nmeta - i) * sizeof(meta_entry_t));
    r->meta[i] = e;
    r->nmeta++;
}

static void meta_write_entry(buf_t *b, const meta_entry_t *e)
{
    buf_puts(b, "{\"type\":");
    const char *t = meta_type_names[e->type < 8 ? e->type : 0];
    buf_put_json_string(b, t, strlen(t));
    buf_puts(b, ",\"help\":");
    buf_put_json_string(b, e->help, strlen(e->help));
    buf_puts(b, ",\"unit\":");
    buf_put_json_string(b, e->unit, strlen(e->unit));
    buf_putc(b, '}');
}

static int parse_int_param(api_req_t *req, const char *name, long long *out)
{
    const char *s = api_req_param(req, name);
    if (!s || !s[0])
        return 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end) {
        api_reply_prom_error(req, API_ERR_BAD_DATA, "%s must be a number", name);
        return -1;
    }
    *out = v;
    return 0;
}

/* GET /api/v1/metadata?limit=&limit_per_metric=&metric= */
static void remote_h_metadata(api_req_t *req, void *ud)
{
    api_remote_t *r = ud;
    long long limit = -1, per_metric = -1;
    if (parse_int_param(req, "limit", &limit) < 0 || parse_int_param(req, "limit_per_metric", &per_metric) < 0)
        return;
    const char *metric = api_req_param(req, "metric");
    buf_t b = BUF_INIT;
    buf_putc(&b, '{');
    size_t written = 0;
    pthread_mutex_lock(&r->meta_mu);
    size_t lo = 0, hi = r->nmeta;
    if (metric && metric[0]) {
        bool found;
        lo = meta_find(r, metric, &found);
        hi = found ? lo + 1 : lo;
    }
    for (size_t i = lo; i < hi; i++) {
        /* Prometheus: limit caps the number of metrics; limit_per_metric the entries of each (one
         * here: the newest). 0 means none, as in Prometheus. */
        if (limit >= 0 && (long long)written >= limit)
            break;
        if (written)
            buf_putc(&b, ',');
        buf_put_json_string(&b, r->meta[i].name, strlen(r->meta[i].name));
        buf_puts(&b, ":[");
        if (per_metric != 0)
            meta_write_entry(&b, &r->meta[i]);
        buf_putc(&b, ']');
        written++;
    }
    pthread_mutex_unlock(&r->meta_mu);
    buf_putc(&b, '}');
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

/* ==== request bodies ================================================================================ */

/* Snappy block body -> arena bytes. 0, or an HTTP status with a message. */
static int remote_body(api_remote_t *r, api_req_t *req, uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
    size_t len;
    const uint8_t *body = api_req_body(req, &len);
    const char *enc = api_req_header(req, "Content-Encoding");
    if (enc && enc[0] && strcasecmp(enc, "snappy") != 0) {
        snprintf(err, errlen, "unsupported Content-Encoding \"%.64s\": remote storage bodies are snappy block format",
                 enc);
        return 415;
    }
    size_t dlen;
    if (snappy_uncompressed_length((const char *)body, len, &dlen) != SNAPPY_OK) {
        snprintf(err, errlen, "cannot decode the snappy body: corrupt input");
        return 400;
    }
    if (dlen > r->opt.max_decoded_bytes) {
        snprintf(err, errlen, "the uncompressed body would be %zu bytes, more than the limit of %" PRIu64, dlen,
                 r->opt.max_decoded_bytes);
        return 413;
    }
    uint8_t *d = arena_try_alloc(req->arena, dlen + 1);
    if (!d) {
        snprintf(err, errlen, "out of memory for a %zu-byte body", dlen);
        return 503;
    }
    size_t got = dlen;
    if (snappy_uncompress((const char *)body, len, (char *)d, &got) != SNAPPY_OK || got != dlen) {
        snprintf(err, errlen, "cannot decode the snappy body: corrupt input");
        return 400;
    }
    *out = d;
    *out_len = dlen;
    return 0;
}

/* ==== POST /api/v1/write ============================================================================ */

static int storage_status(int rc)
{
    switch (rc) {
    case STORAGE_ERR_IO:
    case STORAGE_ERR_NOT_READY:
    case STORAGE_ERR_NOMEM:
    case STORAGE_ERR_MAX_SERIES: return 503;
    default: return 400;
    }
}

static void remote_h_write(api_req_t *req, void *ud)
{
    api_remote_t *r = ud;
    char err[1024];
    atomic_fetch_add(&r->w_requests, 1);
    const char *ct = api_req_header(req, "Content-Type");
    if (ct && strstr(ct, "io.prometheus.write.v2.Request")) {
        atomic_fetch_add(&r->w_rejected, 1);
        api_reply_text(req, 415,
                       "remote write 2.0 (io.prometheus.write.v2.Request) is not supported; "
                       "send remote write 1.0 (prometheus.WriteRequest)\n");
        return;
    }
    uint8_t *body;
    size_t len;
    int st = remote_body(r, req, &body, &len, err, sizeof(err));
    if (st) {
        atomic_fetch_add(&r->w_rejected, 1);
        api_reply_text(req, st, "%s\n", err);
        return;
    }
    remote_write_req_t wr;
    storage_t *s = r->opt.storage;
    int rc = remote_write_decode(body, len, 0, req->arena, &wr, err, sizeof(err));
    if (rc != REMOTE_OK) {
        atomic_fetch_add(&r->w_rejected, 1);
        api_reply_text(req, rc == REMOTE_ERR_NOMEM ? 503 : 400, "%s\n", err);
        return;
    }
    if (wr.nhistograms)
        atomic_fetch_add(&r->w_histograms, wr.nhistograms);
    if (wr.nexemplars)
        atomic_fetch_add(&r->w_exemplars, wr.nexemplars);
    if (wr.nmetadata) {
        pthread_mutex_lock(&r->meta_mu);
        for (size_t i = 0; i < wr.nmetadata; i++)
            meta_put(r, &wr.metadata[i]);
        pthread_mutex_unlock(&r->meta_mu);
    }
    if (wr.nsamples) {
        storage_append_result_t res;
        rc = storage_append(s, wr.samples, wr.nsamples, &res);
        atomic_fetch_add(&r->w_samples, res.accepted);
        if (rc != STORAGE_OK) {
            atomic_fetch_add(&r->w_rejected, 1);
            atomic_fetch_add(&r->w_failed_samples, res.failed);
            int code = storage_status(rc);
            if (rc == STORAGE_ERR_OUT_OF_ORDER || rc == STORAGE_ERR_TOO_OLD || rc == STORAGE_ERR_TOO_NEW)
                api_reply_text(req, code, "%s (%zu of %zu samples refused%s)\n", res.msg, res.failed, wr.nsamples,
                               res.accepted ? ", the others were stored" : "");
            else
                api_reply_text(req, code, "%s\n", res.msg);
            return;
        }
    }
    api_reply(req, 204, NULL, NULL, 0);
}

/* ==== remote read: common ============================================================================ */

typedef struct {
    matcher_t **ms;
    size_t nms;
    int64_t start, end;
    querier_hints_t hints;
} rquery_t;

static void *pb_arena_alloc(void *ud, size_t n)
{
    return arena_try_alloc(ud, n ? n : 1);
}

static void pb_arena_free(void *ud, void *p)
{
    (void)ud;
    (void)p;
}

static void rqueries_free(rquery_t *qs, size_t n)
{
    for (size_t i = 0; qs && i < n; i++)
        for (size_t j = 0; j < qs[i].nms; j++)
            matcher_free(qs[i].ms[j]);
}

/* Builds every query's matchers and hints. 0, or -1 with a message (the matchers built so far are
 * freed). */
static int rqueries_build(const Prometheus__ReadRequest *rr, arena_t *a, rquery_t **out, char *err, size_t errlen)
{
    rquery_t *qs = arena_calloc(a, rr->n_queries ? rr->n_queries : 1, sizeof(rquery_t));
    for (size_t i = 0; i < rr->n_queries; i++) {
        const Prometheus__Query *q = rr->queries[i];
        rquery_t *o = &qs[i];
        o->start = q->start_timestamp_ms;
        o->end = q->end_timestamp_ms;
        o->ms = arena_calloc(a, q->n_matchers ? q->n_matchers : 1, sizeof(matcher_t *));
        for (size_t j = 0; j < q->n_matchers; j++) {
            const Prometheus__LabelMatcher *m = q->matchers[j];
            if ((unsigned)m->type > MATCHER_NRE) {
                snprintf(err, errlen, "query %zu: unknown matcher type %d", i, (int)m->type);
                rqueries_free(qs, i + 1);
                return -1;
            }
            char merr[512];
            o->ms[j] = matcher_new((matcher_type_t)m->type, m->name ? m->name : "", m->value ? m->value : "", merr,
                                   sizeof(merr));
            if (!o->ms[j]) {
                snprintf(err, errlen, "query %zu: matcher %s: %s", i, m->name ? m->name : "", merr);
                rqueries_free(qs, i + 1);
                return -1;
            }
            o->nms++;
        }
        o->hints = (querier_hints_t){.start_ms = o->start, .end_ms = o->end};
        if (q->hints) {
            const Prometheus__ReadHints *h = q->hints;
            o->hints.step_ms = h->step_ms;
            o->hints.range_ms = h->range_ms;
            o->hints.func = h->func && h->func[0] ? h->func : NULL;
            if (h->start_ms || h->end_ms) {
                o->hints.start_ms = h->start_ms;
                o->hints.end_ms = h->end_ms;
            }
        }
    }
    *out = qs;
    return 0;
}

/* ---- protobuf writing --------------------------------------------------------------------------- */

static void buf_len_field(buf_t *b, uint32_t field, const void *p, size_t n)
{
    varint_put(b, (uint64_t)field << 3 | WT_LEN);
    varint_put(b, n);
    buf_append(b, p, n);
}

/* Appends the Label messages of ls as repeated field 1 (TimeSeries.labels, ChunkedSeries.labels). */
static void put_labels(buf_t *b, const labels_t *ls)
{
    for (size_t i = 0; i < ls->n; i++) {
        size_t nl = strlen(ls->v[i].name), vl = strlen(ls->v[i].value);
        size_t inner = 1 + varint_len(nl) + nl + 1 + varint_len(vl) + vl;
        varint_put(b, 1 << 3 | WT_LEN);
        varint_put(b, inner);
        buf_len_field(b, 1, ls->v[i].name, nl);
        buf_len_field(b, 2, ls->v[i].value, vl);
    }
}

/* ==== SAMPLES ================================================================================== */

/* Answers with SAMPLES; frees qs's matchers. */
/* One SAMPLES request's memory and time: the bytes its buffers hold are charged to a budget of
 * its own under the shared query budget, growth by growth. */
typedef struct {
    arena_budget_t budget;
    size_t charged;
    int64_t deadline_ns; /* 0: none */
} rlimits_t;

/* Makes sure `have` bytes are charged. 0, or an HTTP status with the message in err. */
static int rlimits_charge(rlimits_t *l, size_t have, char *err, size_t errlen)
{
    if (have > l->charged) {
        arena_budget_t *no = arena_budget_charge(&l->budget, have - l->charged);
        if (no == &l->budget) {
            snprintf(err, errlen, "remote read would use more than %zu bytes of memory (--query.max-memory-per-query)",
                     l->budget.limit);
            return 400;
        }
        if (no) {
            snprintf(err, errlen,
                     "the queries running now hold all of the query memory budget (%zu bytes, --query.max-memory); "
                     "try again later",
                     no->limit);
            return 503;
        }
        l->charged = have;
    }
    if (l->deadline_ns && clock_mono_ns() > l->deadline_ns) {
        snprintf(err, errlen, "remote read timed out (--query.timeout)");
        return 503;
    }
    return 0;
}

static void remote_read_samples(api_remote_t *r, api_req_t *req, rquery_t *qs, size_t nq)
{
    buf_t resp = BUF_INIT, qr = BUF_INIT, ts = BUF_INIT;
    querier_t *q = storage_querier(r->opt.storage);
    char err[600] = "";
    int code = 0;
    if (!q) {
        code = 503;
        snprintf(err, sizeof(err), "out of memory");
    }
    rlimits_t lim = {.budget = {.limit = r->opt.read_max_memory, .parent = r->opt.read_budget}};
    if (r->opt.read_timeout_ms > 0)
        lim.deadline_ns = clock_mono_ns() + r->opt.read_timeout_ms * 1000000;
    uint64_t nsamples = 0; /* across every query of the request */
    for (size_t i = 0; i < nq && !code; i++) {
        buf_reset(&qr);
        querier_set_t *set = qs[i].nms ? querier_select(q, (const matcher_t *const *)qs[i].ms, qs[i].nms, qs[i].start,
                                                        qs[i].end, &qs[i].hints)
                                       : NULL;
        const querier_series_t *s;
        while (set && !code && (s = querier_set_next(set))) {
            buf_reset(&ts);
            put_labels(&ts, &s->labels);
            size_t lablen = ts.len;
            querier_iter_t it;
            querier_iter_init(&it, s, qs[i].start, qs[i].end);
            int64_t t;
            double v;
            while (querier_iter_next(&it, &t, &v)) {
                if (r->opt.read_sample_limit && ++nsamples > r->opt.read_sample_limit) {
                    code = 400;
                    snprintf(err, sizeof(err), "exceeded sample limit (%" PRIu64 ")", r->opt.read_sample_limit);
                    break;
                }
                /* before ts doubles (so the check runs once per growth, and the clock with it) */
                if (ts.len + 32 > ts.cap &&
                    (code = rlimits_charge(&lim, resp.cap + qr.cap + 3 * ts.cap + 64, err, sizeof(err))) != 0)
                    break;
                uint8_t sm[32];
                size_t k = 0;
                uint64_t bits;
                memcpy(&bits, &v, sizeof(bits));
                sm[k++] = 1 << 3 | WT_I64;
                for (int j = 0; j < 8; j++)
                    sm[k++] = (uint8_t)(bits >> (8 * j));
                sm[k++] = 2 << 3 | WT_VARINT;
                k += varint_encode(sm + k, (uint64_t)t);
                buf_reserve(&ts, k + 2);
                ts.data[ts.len++] = 2 << 3 | WT_LEN;
                ts.data[ts.len++] = (char)k;
                memcpy(ts.data + ts.len, sm, k);
                ts.len += k;
            }
            /* qr is about to take a copy of ts */
            if (!code)
                code = rlimits_charge(&lim, resp.cap + ts.cap + 2 * (qr.len + ts.len + 16), err, sizeof(err));
            if (ts.len > lablen && !code)
                buf_len_field(&qr, 1, ts.data, ts.len);
        }
        if (set && !code && querier_set_error(set)) {
            code = 500;
            snprintf(err, sizeof(err), "query %zu: %s", i, querier_set_error(set));
        }
        querier_set_free(set);
        if (!code)
            code = rlimits_charge(&lim, qr.cap + ts.cap + 2 * (resp.len + qr.len + 16), err, sizeof(err));
        if (!code)
            buf_len_field(&resp, 1, qr.data ? qr.data : "", qr.len);
    }
    querier_close(q);
    rqueries_free(qs, nq); /* before replying: qs lives in the request arena */
    buf_free(&qr);
    buf_free(&ts);
    size_t clen = snappy_max_compressed_length(resp.len);
    if (!code)
        code = rlimits_charge(&lim, resp.cap + clen, err, sizeof(err));
    if (code) {
        buf_free(&resp);
        arena_budget_release(&lim.budget, lim.charged);
        heap_trim_after(lim.charged);
        atomic_fetch_add(&r->r_rejected, 1);
        api_reply_text(req, code, "%s\n", err);
        return;
    }
    char *c = malloc(clen ? clen : 1);
    if (!c || snappy_compress(resp.data ? resp.data : "", resp.len, c, &clen) != SNAPPY_OK) {
        free(c);
        buf_free(&resp);
        arena_budget_release(&lim.budget, lim.charged);
        api_reply_text(req, 503, "out of memory\n");
        return;
    }
    buf_free(&resp);
    arena_budget_release(&lim.budget, lim.charged);
    api_reply_header(req, "Content-Encoding", "snappy");
    api_reply(req, 200, "application/x-protobuf", c, clen);
    free(c);
    heap_trim_after(lim.charged);
}

/* ==== STREAMED_XOR_CHUNKS ============================================================================ */

typedef struct {
    api_remote_t *r;
    api_req_t *req;
    querier_t *q;
    rquery_t *qs;
    size_t nq, qi;
    querier_set_t *set;
    const querier_series_t *cur; /* series being framed; valid until the next querier_set_next */
    size_t ci;                   /* its next chunk */
    buf_t lbl;                   /* cur's encoded labels */
    buf_t cs;                    /* chunk messages of the frame being built */
    buf_t out;                   /* frames not yet handed to the connection */
    size_t budget;
    int64_t deadline_ns; /* --query.timeout; 0: none */
    bool in_pump, again;
} rstream_t;

static void rstream_free(rstream_t *st)
{
    querier_set_free(st->set);
    querier_close(st->q);
    rqueries_free(st->qs, st->nq);
    buf_free(&st->lbl);
    buf_free(&st->cs);
    buf_free(&st->out);
    free(st);
}

/* Appends one Chunk message to cs: the chunk's bytes, or its samples inside [mint, maxt]
 * re-encoded as XOR when it sticks out of the range or is not an XOR chunk (the head's integer
 * chunks stay inside sluice). Returns 0, or -1 on OOM / undecodable bytes. */
static int rstream_add_chunk(rstream_t *st, const querier_chunk_t *c, int64_t mint, int64_t maxt)
{
    const uint8_t *bytes = c->bytes;
    size_t len = c->len;
    int64_t cmin = c->mint, cmax = c->maxt;
    chunk_xor_appender_t app;
    bool trimmed = c->mint < mint || c->maxt > maxt || c->enc != CHUNK_ENC_XOR;
    if (trimmed) {
        /* An integer chunk is re-encoded whole: room for every sample's worst case up front, so
         * the appender never grows (a trimmed XOR chunk starts small, as it usually shrinks). */
        size_t num = c->len >= 2 ? (size_t)c->bytes[0] << 8 | c->bytes[1] : 0;
        size_t cap = c->enc == CHUNK_ENC_INT ? CHUNK_XOR_HEADER_BYTES + CHUNK_XOR_MAX_RECORD_BYTES * num : 0;
        uint8_t *buf = cap ? malloc(cap) : NULL;
        if (buf)
            chunk_xor_appender_init_buf(&app, buf, cap);
        else if (chunk_xor_appender_init(&app) < 0)
            return -1;
        chunk_iter_t it;
        chunk_iter_init(&it, c->enc, c->bytes, c->len);
        int64_t t;
        double v;
        while (chunk_iter_next(&it, &t, &v)) {
            if (t < mint)
                continue;
            if (t > maxt)
                break;
            if (chunk_xor_num(&app) == 0)
                cmin = t;
            cmax = t;
            if (chunk_xor_append(&app, t, v) < 0) {
                chunk_xor_appender_free(&app);
                return -1;
            }
        }
        if (chunk_iter_err(&it)) {
            chunk_xor_appender_free(&app);
            return -1;
        }
        if (chunk_xor_num(&app) == 0) {
            chunk_xor_appender_free(&app);
            return 0;
        }
        bytes = chunk_xor_bytes(&app, &len);
        atomic_fetch_add(&st->r->r_chunks_reencoded, 1);
    }
    size_t inner = 1 + varint_len((uint64_t)cmin) + 1 + varint_len((uint64_t)cmax) + 2 + 1 + varint_len(len) + len;
    varint_put(&st->cs, 2 << 3 | WT_LEN);
    varint_put(&st->cs, inner);
    varint_put(&st->cs, 1 << 3 | WT_VARINT);
    varint_put(&st->cs, (uint64_t)cmin);
    varint_put(&st->cs, 2 << 3 | WT_VARINT);
    varint_put(&st->cs, (uint64_t)cmax);
    varint_put(&st->cs, 3 << 3 | WT_VARINT);
    varint_put(&st->cs, 1); /* XOR */
    buf_len_field(&st->cs, 4, bytes, len);
    if (trimmed)
        chunk_xor_appender_free(&app);
    return 0;
}

/* Moves the frame being built (labels + cs) into out: uvarint length, BE CRC-32C, message. */
static void rstream_flush_frame(rstream_t *st)
{
    uint8_t hdr[24];
    size_t cslen = st->lbl.len + st->cs.len;
    size_t h = 0;
    hdr[h++] = 1 << 3 | WT_LEN; /* chunked_series */
    h += varint_encode(hdr + h, cslen);
    uint8_t tail[12];
    size_t tl = 0;
    if (st->qi) {
        tail[tl++] = 2 << 3 | WT_VARINT; /* query_index, omitted when 0 as proto3 does */
        tl += varint_encode(tail + tl, st->qi);
    }
    size_t msglen = h + cslen + tl;
    uint32_t crc = crc32c(hdr, h);
    crc = crc32c_update(crc, st->lbl.data, st->lbl.len);
    crc = crc32c_update(crc, st->cs.data, st->cs.len);
    crc = crc32c_update(crc, tail, tl);
    varint_put(&st->out, msglen);
    uint8_t be[4] = {(uint8_t)(crc >> 24), (uint8_t)(crc >> 16), (uint8_t)(crc >> 8), (uint8_t)crc};
    buf_append(&st->out, be, 4);
    buf_append(&st->out, hdr, h);
    buf_append(&st->out, st->lbl.data, st->lbl.len);
    buf_append(&st->out, st->cs.data, st->cs.len);
    buf_append(&st->out, tail, tl);
    buf_reset(&st->cs);
    atomic_fetch_add(&st->r->r_frames, 1);
}

static void rstream_pump(rstream_t *st);

static void rstream_drained(api_req_t *req, void *ud)
{
    (void)req;
    rstream_t *st = ud;
    if (st->in_pump) {
        st->again = true;
        return;
    }
    rstream_pump(st);
}

static void rstream_closed(api_req_t *req, void *ud)
{
    (void)req;
    rstream_t *st = ud;
    log_debug("remote", "remote read client went away mid-stream");
    rstream_free(st);
}

/* Produces frames until about one budget is ready, hands them to the connection and returns; the
 * drained callback calls it again. At the end of the last query it ends the reply and frees st. */
static void rstream_pump(rstream_t *st)
{
    const char *fail = NULL;
    char ferr[600];
    st->in_pump = true;
    do {
        st->again = false;
        while (st->out.len < st->budget && !fail) {
            if (!st->cur) {
                if (!st->set) {
                    while (st->qi < st->nq && st->qs[st->qi].nms == 0)
                        st->qi++; /* no matchers: selects nothing, as in Prometheus */
                    if (st->qi >= st->nq)
                        break;
                    rquery_t *q = &st->qs[st->qi];
                    st->set =
                        querier_select(st->q, (const matcher_t *const *)q->ms, q->nms, q->start, q->end, &q->hints);
                    if (!st->set) {
                        fail = "out of memory";
                        break;
                    }
                }
                if (st->deadline_ns && clock_mono_ns() > st->deadline_ns) {
                    fail = "remote read timed out (--query.timeout)";
                    break;
                }
                st->cur = querier_set_next(st->set);
                if (!st->cur) {
                    if (querier_set_error(st->set)) {
                        snprintf(ferr, sizeof(ferr), "query %zu: %s", st->qi, querier_set_error(st->set));
                        fail = ferr;
                        break;
                    }
                    querier_set_free(st->set);
                    st->set = NULL;
                    st->qi++;
                    continue;
                }
                buf_reset(&st->lbl);
                put_labels(&st->lbl, &st->cur->labels);
                buf_reset(&st->cs);
                st->ci = 0;
            }
            const rquery_t *q = &st->qs[st->qi];
            while (st->ci < st->cur->nchunks) {
                const querier_chunk_t *c = &st->cur->chunks[st->ci++];
                if (c->maxt < q->start || c->mint > q->end)
                    continue;
                if (rstream_add_chunk(st, c, q->start, q->end) < 0) {
                    fail = "cannot re-encode a chunk at the query range";
                    break;
                }
                if (st->lbl.len + st->cs.len >= st->budget) {
                    rstream_flush_frame(st);
                    if (st->out.len >= st->budget)
                        break; /* send; this series goes on in the next frame */
                }
            }
            if (fail)
                break;
            if (st->ci >= st->cur->nchunks) {
                if (st->cs.len)
                    rstream_flush_frame(st);
                st->cur = NULL;
            }
        }
        bool done = !fail && !st->cur && !st->set && st->qi >= st->nq;
        if (fail) {
            log_warn("remote", "remote read failed mid-stream", LF_S("err", fail));
            buf_puts(&st->out, fail); /* undecodable as a frame: the client sees an error */
            done = true;
        }
        if (done) {
            api_req_t *req = st->req;
            if (st->out.len)
                api_reply_stream_chunk(req, st->out.data, st->out.len, NULL, NULL);
            rstream_free(st); /* before the end: st->qs lives in the request's arena */
            api_reply_stream_end(req);
            return;
        }
        if (st->out.len) {
            if (api_reply_stream_chunk(st->req, st->out.data, st->out.len, rstream_drained, st) < 0) {
                api_req_t *req = st->req;
                rstream_free(st);
                api_reply_stream_end(req);
                return;
            }
            buf_reset(&st->out);
        } else {
            st->again = true; /* nothing to send yet: go on producing */
        }
    } while (st->again);
    st->in_pump = false;
}

static void remote_read_streamed(api_remote_t *r, api_req_t *req, rquery_t *qs, size_t nq)
{
    rstream_t *st = calloc(1, sizeof(*st));
    querier_t *q = st ? storage_querier(r->opt.storage) : NULL;
    if (!q) {
        free(st);
        rqueries_free(qs, nq);
        api_reply_text(req, 503, "out of memory\n");
        return;
    }
    *st = (rstream_t){.r = r, .req = req, .q = q, .qs = qs, .nq = nq, .budget = r->opt.read_max_bytes_in_frame};
    if (r->opt.read_timeout_ms > 0)
        st->deadline_ns = clock_mono_ns() + r->opt.read_timeout_ms * 1000000;
    api_reply_stream_start(req, 200, CT_STREAMED, rstream_closed, st);
    rstream_pump(st);
}

/* ==== POST /api/v1/read ================================================================================ */

static void remote_h_read(api_req_t *req, void *ud)
{
    api_remote_t *r = ud;
    char err[1024];
    uint8_t *body;
    size_t len;
    int st = remote_body(r, req, &body, &len, err, sizeof(err));
    if (st) {
        atomic_fetch_add(&r->r_rejected, 1);
        api_reply_text(req, st, "%s\n", err);
        return;
    }
    ProtobufCAllocator al = {pb_arena_alloc, pb_arena_free, req->arena};
    Prometheus__ReadRequest *rr = prometheus__read_request__unpack(&al, len, body);
    if (!rr) {
        atomic_fetch_add(&r->r_rejected, 1);
        api_reply_text(req, 400, "cannot decode the ReadRequest: malformed protobuf\n");
        return;
    }
    /* Negotiation, as Prometheus: nothing listed = SAMPLES, else the first type we know. */
    int type = rr->n_accepted_response_types ? -1 : PROMETHEUS__READ_REQUEST__RESPONSE_TYPE__SAMPLES;
    for (size_t i = 0; i < rr->n_accepted_response_types && type < 0; i++)
        if (rr->accepted_response_types[i] == PROMETHEUS__READ_REQUEST__RESPONSE_TYPE__SAMPLES ||
            rr->accepted_response_types[i] == PROMETHEUS__READ_REQUEST__RESPONSE_TYPE__STREAMED_XOR_CHUNKS)
            type = rr->accepted_response_types[i];
    if (type < 0) {
        atomic_fetch_add(&r->r_rejected, 1);
        api_reply_text(req, 400,
                       "server does not support any of the requested response types: %d%s; supported: "
                       "SAMPLES (0), STREAMED_XOR_CHUNKS (1)\n",
                       (int)rr->accepted_response_types[0], rr->n_accepted_response_types > 1 ? ", ..." : "");
        return;
    }
    if (!storage_ready(r->opt.storage)) {
        api_reply_text(req, 503, "storage is still recovering\n");
        return;
    }
    rquery_t *qs;
    if (rqueries_build(rr, req->arena, &qs, err, sizeof(err)) < 0) {
        atomic_fetch_add(&r->r_rejected, 1);
        api_reply_text(req, 400, "%s\n", err);
        return;
    }
    size_t nq = rr->n_queries; /* rr is in the arena, gone once the reply is sent */
    if (type == PROMETHEUS__READ_REQUEST__RESPONSE_TYPE__SAMPLES) {
        atomic_fetch_add(&r->r_samples_req, 1);
        remote_read_samples(r, req, qs, nq); /* owns qs now */
    } else {
        atomic_fetch_add(&r->r_streamed_req, 1);
        remote_read_streamed(r, req, qs, nq); /* owns qs now */
    }
}

/* ==== lifecycle ======================================================================================== */

static void remote_metrics(void *ud, buf_t *b)
{
    api_remote_t *r = ud;
    static const struct {
        const char *name, *help;
        size_t off;
    } counters[] = {
        {"sluice_remote_write_requests_total", "Remote write requests received.", offsetof(api_remote_t, w_requests)},
        {"sluice_remote_write_rejected_requests_total", "Remote write requests answered with an error.",
         offsetof(api_remote_t, w_rejected)},
        {"sluice_remote_write_samples_total", "Samples stored from remote write.", offsetof(api_remote_t, w_samples)},
        {"sluice_remote_write_failed_samples_total", "Remote-written samples the storage refused.",
         offsetof(api_remote_t, w_failed_samples)},
        {"sluice_remote_write_histograms_dropped_total", "Native histogram samples skipped (not supported).",
         offsetof(api_remote_t, w_histograms)},
        {"sluice_remote_write_exemplars_dropped_total", "Exemplars skipped (not stored).",
         offsetof(api_remote_t, w_exemplars)},
        {"sluice_remote_write_metadata_dropped_total", "Metadata of new metric names dropped at the limit.",
         offsetof(api_remote_t, meta_dropped)},
        {"sluice_remote_read_samples_requests_total", "Remote read requests answered with SAMPLES.",
         offsetof(api_remote_t, r_samples_req)},
        {"sluice_remote_read_streamed_requests_total", "Remote read requests answered with STREAMED_XOR_CHUNKS.",
         offsetof(api_remote_t, r_streamed_req)},
        {"sluice_remote_read_rejected_requests_total", "Remote read requests answered with an error.",
         offsetof(api_remote_t, r_rejected)},
        {"sluice_remote_read_frames_total", "ChunkedReadResponse frames sent.", offsetof(api_remote_t, r_frames)},
        {"sluice_remote_read_chunks_reencoded_total",
         "Chunks re-encoded as XOR because they stuck out of the query range or were the head's integer chunks.",
         offsetof(api_remote_t, r_chunks_reencoded)},
    };
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
        atomic_uint_least64_t *c = (atomic_uint_least64_t *)((char *)r + counters[i].off);
        buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", counters[i].name, counters[i].help,
                   counters[i].name, counters[i].name, (uint64_t)atomic_load(c));
    }
    pthread_mutex_lock(&r->meta_mu);
    size_t n = r->nmeta;
    pthread_mutex_unlock(&r->meta_mu);
    buf_printf(b,
               "# HELP sluice_remote_write_metadata_metrics Metric names with metadata from remote write.\n"
               "# TYPE sluice_remote_write_metadata_metrics gauge\nsluice_remote_write_metadata_metrics %zu\n",
               n);
}

api_remote_t *api_remote_new(const api_remote_options_t *opt)
{
    api_remote_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->opt = *opt;
    if (!r->opt.max_decoded_bytes)
        r->opt.max_decoded_bytes = REMOTE_DEFAULT_DECODE_LIMIT;
    if (!r->opt.read_max_bytes_in_frame)
        r->opt.read_max_bytes_in_frame = REMOTE_DEFAULT_FRAME_BYTES;
    if (!r->opt.metadata_max_metrics)
        r->opt.metadata_max_metrics = REMOTE_DEFAULT_METADATA;
    pthread_mutex_init(&r->meta_mu, NULL);
    return r;
}

void api_remote_register_routes(api_remote_t *r, api_server_t *srv)
{
    api_route_add(srv, API_POST, "/api/v1/write", "remote_write", remote_h_write, r);
    api_route_add(srv, API_POST, "/api/v1/read", "remote_read", remote_h_read, r);
    api_route_add(srv, API_GET, "/api/v1/metadata", "metadata", remote_h_metadata, r);
    metrics_register("remote", remote_metrics, r);
}

void api_remote_free(api_remote_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nmeta; i++) {
        free(r->meta[i].name);
        free(r->meta[i].help);
        free(r->meta[i].unit);
    }
    free(r->meta);
    pthread_mutex_destroy(&r->meta_mu);
    free(r);
}
