/*
 * read_client — Prometheus remote read client (contract, spec options and bounds in
 * read_client.h).
 *
 * A query: ReadRequest built with protobuf-c, snappy-compressed, POSTed over a pooled httpc
 * connection. The answer is decoded by remote_read__decode into per-series sample arrays in the
 * caller's arena: SAMPLES via prometheus__read_response__unpack (protobuf-c allocating from the
 * arena), STREAMED_XOR_CHUNKS frame by frame (length, CRC-32C checked, then
 * prometheus__chunked_read_response__unpack), chunks decoded with storage/chunk_xor. Series are
 * then sorted by labels and series split over several frames (or listed twice) are joined, their
 * samples sorted by time with duplicate timestamps dropped (the first one seen is kept).
 */
#include "internal/remote/read_client.h"

#include <errno.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal/net/httpc.h"
#include "internal/proto/remote.pb-c.h"
#include "internal/proto/types.pb-c.h"
#include "internal/util/buf.h"
#include "internal/util/crc32c.h"
#include "internal/util/log.h"
#include "internal/util/varint.h"
#include "storage/chunk_xor.h"

#define RR_DEFAULT_MAX_BYTES ((size_t)256 << 20)
#define RR_DEFAULT_MAX_SAMPLES 50000000ULL
#define RR_POOL 8

struct remote_read_client {
    char *url, *name;
    httpc_url_t u;
    char *headers;     /* "Name: value\r\n" lines: protocol headers, extra headers, basic auth */
    char *bearer_file; /* NULL = none */
    bool samples_only;
    int64_t timeout_ms;
    size_t max_bytes;
    uint64_t max_samples;
    httpc_tls_t *tls; /* https:// targets; shared by the pooled connections */
    pthread_mutex_t mu;
    httpc_conn_t *idle[RR_POOL];
    size_t nidle;
};

/* ---- setup ---------------------------------------------------------------------------------- */

/* Applies the options after the URL (space-separated key=value); the tls-* ones go to tls. */
static int rr_parse_options(remote_read_client_t *c, const char *p, buf_t *h, httpc_tls_spec_t *tls, char *err,
                            size_t errlen)
{
    httpc_auth_spec_t auth = HTTPC_AUTH_SPEC_INIT;
    int rc = 0;
    while (rc == 0) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        size_t len = strcspn(p, " \t");
        const char *eq = memchr(p, '=', len);
        if (!eq) {
            snprintf(err, errlen, "remote-read option \"%.*s\" is not key=value", (int)len, p);
            rc = -1;
            break;
        }
        size_t kl = (size_t)(eq - p), vl = len - kl - 1;
        const char *v = eq + 1;
#define KEY(s) (kl == strlen(s) && memcmp(p, s, kl) == 0)
        int tr = httpc_tls_spec_parse(tls, p, kl, v, vl, err, errlen);
        if (tr == 0)
            tr = httpc_auth_spec_parse(&auth, p, kl, v, vl, err, errlen);
        if (tr != 0) {
            rc = tr < 0 ? -1 : 0;
        } else if (KEY("name")) {
            free(c->name);
            c->name = strndup(v, vl);
        } else if (KEY("response-type")) {
            if (vl == 7 && memcmp(v, "samples", 7) == 0)
                c->samples_only = true;
            else if (vl == 8 && memcmp(v, "streamed", 8) == 0)
                c->samples_only = false;
            else {
                snprintf(err, errlen, "response-type must be streamed or samples");
                rc = -1;
            }
        } else {
            snprintf(err, errlen, "unknown remote-read option \"%.*s\"", (int)kl, p);
            rc = -1;
        }
#undef KEY
        p += len;
    }
    if (rc == 0)
        rc = httpc_auth_spec_build(&auth, h, err, errlen);
    free(c->bearer_file);
    c->bearer_file = auth.bearer_file; /* read per request */
    auth.bearer_file = NULL;
    httpc_auth_spec_free(&auth);
    return rc;
}

remote_read_client_t *remote_read_client_new(const remote_read_client_opts_t *o, char *err, size_t errlen)
{
    remote_read_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
    c->max_bytes = o->max_response_bytes ? o->max_response_bytes : RR_DEFAULT_MAX_BYTES;
    c->max_samples = o->max_samples ? o->max_samples : RR_DEFAULT_MAX_SAMPLES;
    const char *p = o->spec ? o->spec : "";
    while (*p == ' ' || *p == '\t')
        p++;
    size_t ul = strcspn(p, " \t");
    if (!ul) {
        snprintf(err, errlen, "empty --remote-read.url");
        remote_read_client_free(c);
        return NULL;
    }
    c->url = strndup(p, ul);
    buf_t h = BUF_INIT;
    buf_puts(&h, "Content-Encoding: snappy\r\nContent-Type: application/x-protobuf\r\n"
                 "X-Prometheus-Remote-Read-Version: 0.1.0\r\n");
    char perr[512] = "";
    httpc_tls_spec_t tls = HTTPC_TLS_SPEC_INIT;
    bool insecure = false;
    if (!c->url || httpc_url_parse(c->url, &c->u, perr, sizeof(perr)) != 0 ||
        rr_parse_options(c, p + ul, &h, &tls, perr, sizeof(perr)) != 0 ||
        httpc_tls_spec_build(&tls, o->tls, &c->u, &c->tls, &insecure, perr, sizeof(perr)) != 0) {
        snprintf(err, errlen, "--remote-read.url %.*s: %s", (int)(ul < 200 ? ul : 200), p,
                 perr[0] ? perr : "out of memory");
        httpc_tls_spec_free(&tls);
        buf_free(&h);
        remote_read_client_free(c);
        return NULL;
    }
    httpc_tls_spec_free(&tls);
    c->headers = buf_steal(&h, NULL);
    if (!c->name)
        c->name = strdup(c->u.hostport);
    if (insecure)
        log_warn("remote_read", "TLS certificate verification is off for this target (insecure-skip-verify)",
                 LF_S("remote_name", c->name), LF_S("url", c->url));
    return c;
}

void remote_read_client_free(remote_read_client_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nidle; i++)
        httpc_conn_free(c->idle[i]);
    httpc_tls_free(c->tls); /* after the connections that used it */
    pthread_mutex_destroy(&c->mu);
    free(c->url);
    free(c->name);
    free(c->headers);
    free(c->bearer_file);
    free(c);
}

const char *remote_read_client_name(const remote_read_client_t *c)
{
    return c->name;
}

const char *remote_read_client_url(const remote_read_client_t *c)
{
    return c->url;
}

/* ---- decoding ------------------------------------------------------------------------------- */

static void *rr_pb_alloc(void *ud, size_t n)
{
    return arena_try_alloc(ud, n ? n : 1);
}

static void rr_pb_free(void *ud, void *p)
{
    (void)ud;
    (void)p;
}

/* Series as collected, before sorting and joining. */
typedef struct {
    remote_read_series_t *v;
    size_t n, cap;
    uint64_t samples;
    uint64_t max_samples;
    arena_t *a;
} rr_acc_t;

static int rr_acc_series(rr_acc_t *acc, Prometheus__Label **lv, size_t nl, char *err, size_t errlen)
{
    if (acc->n == acc->cap) {
        size_t nc = acc->cap ? acc->cap * 2 : 64;
        remote_read_series_t *p = arena_try_alloc(acc->a, nc * sizeof(*p));
        if (!p)
            goto oom;
        if (acc->n)
            memcpy(p, acc->v, acc->n * sizeof(*p));
        acc->v = p;
        acc->cap = nc;
    }
    remote_read_series_t *s = &acc->v[acc->n];
    memset(s, 0, sizeof(*s));
    s->labels.v = arena_try_alloc(acc->a, (nl ? nl : 1) * sizeof(label_t));
    if (!s->labels.v)
        goto oom;
    for (size_t i = 0; i < nl; i++) {
        const char *name = lv[i]->name ? lv[i]->name : "", *value = lv[i]->value ? lv[i]->value : "";
        if (!name[0] || !value[0])
            continue; /* an empty value is an absent label */
        s->labels.v[s->labels.n++] = (label_t){name, value};
    }
    labels_sort(&s->labels);
    if (labels_check_sorted_unique(&s->labels) != 0) {
        snprintf(err, errlen, "remote read response has a series with duplicate label names");
        return REMOTE_READ_ERR_BAD_RESPONSE;
    }
    acc->n++;
    return 0;
oom:
    snprintf(err, errlen, "out of memory decoding the remote read response");
    return REMOTE_READ_ERR_NOMEM;
}

/* Appends samples to the last series (grown in the arena: the old array is abandoned there). */
static int rr_acc_reserve(rr_acc_t *acc, size_t more, size_t *cap, char *err, size_t errlen)
{
    remote_read_series_t *s = &acc->v[acc->n - 1];
    if (acc->samples + more > acc->max_samples) {
        snprintf(err, errlen, "remote read response has more than %llu samples", (unsigned long long)acc->max_samples);
        return REMOTE_READ_ERR_LIMIT;
    }
    if (s->n + more <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 128;
    while (nc < s->n + more)
        nc *= 2;
    remote_read_sample_t *p = arena_try_alloc(acc->a, nc * sizeof(*p));
    if (!p) {
        snprintf(err, errlen, "out of memory decoding the remote read response");
        return REMOTE_READ_ERR_NOMEM;
    }
    if (s->n)
        memcpy(p, s->samples, s->n * sizeof(*p));
    s->samples = p;
    *cap = nc;
    return 0;
}

static int rr_decode_samples(const uint8_t *body, size_t len, size_t max_bytes, rr_acc_t *acc, char *err, size_t errlen)
{
    size_t dlen;
    if (snappy_uncompressed_length((const char *)body, len, &dlen) != SNAPPY_OK) {
        snprintf(err, errlen, "remote read response is not snappy-compressed protobuf");
        return REMOTE_READ_ERR_BAD_RESPONSE;
    }
    if (dlen > max_bytes) {
        snprintf(err, errlen, "remote read response decompresses to %zu bytes, more than the %zu allowed", dlen,
                 max_bytes);
        return REMOTE_READ_ERR_LIMIT;
    }
    char *d = malloc(dlen ? dlen : 1);
    if (!d) {
        snprintf(err, errlen, "out of memory decoding the remote read response");
        return REMOTE_READ_ERR_NOMEM;
    }
    size_t got = dlen;
    if (snappy_uncompress((const char *)body, len, d, &got) != SNAPPY_OK || got != dlen) {
        free(d);
        snprintf(err, errlen, "remote read response: corrupt snappy data");
        return REMOTE_READ_ERR_BAD_RESPONSE;
    }
    ProtobufCAllocator al = {rr_pb_alloc, rr_pb_free, acc->a};
    Prometheus__ReadResponse *rr = prometheus__read_response__unpack(&al, dlen, (const uint8_t *)d);
    free(d);
    if (!rr) {
        snprintf(err, errlen, "remote read response: malformed ReadResponse protobuf");
        return REMOTE_READ_ERR_BAD_RESPONSE;
    }
    if (rr->n_results > 1) {
        snprintf(err, errlen, "remote read response has %zu results for 1 query", rr->n_results);
        return REMOTE_READ_ERR_BAD_RESPONSE;
    }
    for (size_t r = 0; r < rr->n_results; r++) {
        for (size_t i = 0; i < rr->results[r]->n_timeseries; i++) {
            const Prometheus__TimeSeries *ts = rr->results[r]->timeseries[i];
            int rc = rr_acc_series(acc, ts->labels, ts->n_labels, err, errlen);
            size_t cap = 0;
            if (rc == 0)
                rc = rr_acc_reserve(acc, ts->n_samples, &cap, err, errlen);
            if (rc != 0)
                return rc;
            remote_read_series_t *s = &acc->v[acc->n - 1];
            for (size_t k = 0; k < ts->n_samples; k++)
                s->samples[s->n++] = (remote_read_sample_t){ts->samples[k]->timestamp, ts->samples[k]->value};
            acc->samples += ts->n_samples;
        }
    }
    return 0;
}

static int rr_decode_streamed(const uint8_t *body, size_t len, rr_acc_t *acc, char *err, size_t errlen)
{
    const uint8_t *p = body, *end = body + len;
    ProtobufCAllocator al = {rr_pb_alloc, rr_pb_free, acc->a};
    while (p < end) {
        uint64_t mlen;
        if (varint_get(&p, end, &mlen) < 0 || (uint64_t)(end - p) < 4 || mlen > (uint64_t)(end - p) - 4) {
            snprintf(err, errlen, "remote read response: truncated frame in the chunked stream");
            return REMOTE_READ_ERR_BAD_RESPONSE;
        }
        uint32_t want = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        p += 4;
        if (crc32c(p, (size_t)mlen) != want) {
            snprintf(err, errlen, "remote read response: frame checksum mismatch");
            return REMOTE_READ_ERR_BAD_RESPONSE;
        }
        Prometheus__ChunkedReadResponse *cr = prometheus__chunked_read_response__unpack(&al, (size_t)mlen, p);
        p += mlen;
        if (!cr) {
            snprintf(err, errlen, "remote read response: malformed ChunkedReadResponse protobuf");
            return REMOTE_READ_ERR_BAD_RESPONSE;
        }
        if (cr->query_index != 0) {
            snprintf(err, errlen, "remote read response: query_index %lld for a request of 1 query",
                     (long long)cr->query_index);
            return REMOTE_READ_ERR_BAD_RESPONSE;
        }
        for (size_t i = 0; i < cr->n_chunked_series; i++) {
            const Prometheus__ChunkedSeries *cs = cr->chunked_series[i];
            int rc = rr_acc_series(acc, cs->labels, cs->n_labels, err, errlen);
            if (rc != 0)
                return rc;
            size_t cap = 0;
            for (size_t k = 0; k < cs->n_chunks; k++) {
                const Prometheus__Chunk *ch = cs->chunks[k];
                if (ch->type != PROMETHEUS__CHUNK__ENCODING__XOR) {
                    snprintf(err, errlen,
                             "remote read response has a chunk of encoding %d; only XOR (float samples) is supported",
                             (int)ch->type);
                    return REMOTE_READ_ERR_BAD_RESPONSE;
                }
                if (ch->data.len < CHUNK_XOR_HEADER_BYTES) {
                    snprintf(err, errlen, "remote read response has a truncated XOR chunk");
                    return REMOTE_READ_ERR_BAD_RESPONSE;
                }
                size_t num = (size_t)ch->data.data[0] << 8 | ch->data.data[1];
                if ((rc = rr_acc_reserve(acc, num, &cap, err, errlen)) != 0)
                    return rc;
                remote_read_series_t *s = &acc->v[acc->n - 1];
                chunk_xor_iter_t it;
                chunk_xor_iter_init(&it, ch->data.data, ch->data.len);
                int64_t t;
                double v;
                size_t got = 0;
                while (got < num && chunk_xor_iter_next(&it, &t, &v)) {
                    s->samples[s->n++] = (remote_read_sample_t){t, v};
                    got++;
                }
                if (it.err || got != num) {
                    snprintf(err, errlen, "remote read response has a malformed XOR chunk");
                    return REMOTE_READ_ERR_BAD_RESPONSE;
                }
                acc->samples += got;
            }
        }
    }
    return 0;
}

static int rr_cmp_series(const void *a, const void *b)
{
    return labels_compare(&((const remote_read_series_t *)a)->labels, &((const remote_read_series_t *)b)->labels);
}

static int rr_cmp_sample(const void *a, const void *b)
{
    int64_t x = ((const remote_read_sample_t *)a)->t, y = ((const remote_read_sample_t *)b)->t;
    return x < y ? -1 : x > y;
}

/* Samples in time order, one per timestamp (qsort is not stable, so "first seen" is only
 * meaningful within one frame's order; duplicates from one honest server are identical). */
static void rr_sort_samples(remote_read_series_t *s)
{
    bool sorted = true;
    for (size_t i = 1; i < s->n && sorted; i++)
        sorted = s->samples[i - 1].t < s->samples[i].t;
    if (sorted)
        return;
    qsort(s->samples, s->n, sizeof(*s->samples), rr_cmp_sample);
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++)
        if (w == 0 || s->samples[w - 1].t != s->samples[i].t)
            s->samples[w++] = s->samples[i];
    s->n = w;
}

int remote_read__decode(const uint8_t *body, size_t len, bool streamed, size_t max_bytes, uint64_t max_samples,
                        arena_t *a, remote_read_result_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    rr_acc_t acc = {.a = a, .max_samples = max_samples ? max_samples : RR_DEFAULT_MAX_SAMPLES};
    if (len > max_bytes) {
        snprintf(err, errlen, "remote read response is larger than %zu bytes", max_bytes);
        return REMOTE_READ_ERR_LIMIT;
    }
    int rc = streamed ? rr_decode_streamed(body, len, &acc, err, errlen)
                      : rr_decode_samples(body, len, max_bytes, &acc, err, errlen);
    if (rc != 0)
        return rc;
    if (acc.n > 1)
        qsort(acc.v, acc.n, sizeof(*acc.v), rr_cmp_series);
    /* Join series listed more than once (a streamed series split over frames). */
    size_t w = 0;
    for (size_t i = 0; i < acc.n; i++) {
        if (w && labels_equal(&acc.v[w - 1].labels, &acc.v[i].labels)) {
            remote_read_series_t *d = &acc.v[w - 1];
            remote_read_sample_t *p = arena_try_alloc(a, (d->n + acc.v[i].n + 1) * sizeof(*p));
            if (!p) {
                snprintf(err, errlen, "out of memory decoding the remote read response");
                return REMOTE_READ_ERR_NOMEM;
            }
            if (d->n)
                memcpy(p, d->samples, d->n * sizeof(*p));
            if (acc.v[i].n)
                memcpy(p + d->n, acc.v[i].samples, acc.v[i].n * sizeof(*p));
            d->samples = p;
            d->n += acc.v[i].n;
            continue;
        }
        acc.v[w++] = acc.v[i];
    }
    size_t keep = 0;
    for (size_t i = 0; i < w; i++) {
        rr_sort_samples(&acc.v[i]);
        if (acc.v[i].n)
            acc.v[keep++] = acc.v[i];
    }
    out->series = acc.v;
    out->n = keep;
    out->samples = acc.samples;
    out->streamed = streamed;
    return 0;
}

/* ---- the request ---------------------------------------------------------------------------- */

static httpc_conn_t *rr_conn_get(remote_read_client_t *c)
{
    pthread_mutex_lock(&c->mu);
    httpc_conn_t *k = c->nidle ? c->idle[--c->nidle] : NULL;
    pthread_mutex_unlock(&c->mu);
    return k ? k : httpc_conn_new_tls(&c->u, c->tls);
}

static void rr_conn_put(remote_read_client_t *c, httpc_conn_t *k)
{
    pthread_mutex_lock(&c->mu);
    if (c->nidle < RR_POOL) {
        c->idle[c->nidle++] = k;
        k = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    httpc_conn_free(k);
}

/* The snappy-compressed ReadRequest. 0 or REMOTE_READ_ERR_NOMEM. */
static int rr_build_request(const remote_read_client_t *c, const matcher_t *const *ms, size_t n, int64_t mint,
                            int64_t maxt, const querier_hints_t *hints, buf_t *out)
{
    Prometheus__LabelMatcher *lm = calloc(n ? n : 1, sizeof(*lm));
    Prometheus__LabelMatcher **lmp = calloc(n ? n : 1, sizeof(*lmp));
    if (!lm || !lmp) {
        free(lm);
        free(lmp);
        return REMOTE_READ_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        prometheus__label_matcher__init(&lm[i]);
        static const Prometheus__LabelMatcher__Type types[] = {[MATCHER_EQ] = PROMETHEUS__LABEL_MATCHER__TYPE__EQ,
                                                               [MATCHER_NEQ] = PROMETHEUS__LABEL_MATCHER__TYPE__NEQ,
                                                               [MATCHER_RE] = PROMETHEUS__LABEL_MATCHER__TYPE__RE,
                                                               [MATCHER_NRE] = PROMETHEUS__LABEL_MATCHER__TYPE__NRE};
        lm[i].type = types[matcher_type(ms[i])];
        lm[i].name = (char *)matcher_name(ms[i]);
        lm[i].value = (char *)matcher_value(ms[i]);
        lmp[i] = &lm[i];
    }
    Prometheus__ReadHints rh = PROMETHEUS__READ_HINTS__INIT;
    Prometheus__Query q = PROMETHEUS__QUERY__INIT;
    q.start_timestamp_ms = mint;
    q.end_timestamp_ms = maxt;
    q.n_matchers = n;
    q.matchers = lmp;
    if (hints) {
        /* As Prometheus sends them: the selector's own range as start/end. */
        rh.step_ms = hints->step_ms;
        rh.func = (char *)(hints->func ? hints->func : "");
        rh.start_ms = mint;
        rh.end_ms = maxt;
        rh.range_ms = hints->range_ms;
        q.hints = &rh;
    }
    Prometheus__Query *qp = &q;
    Prometheus__ReadRequest rr = PROMETHEUS__READ_REQUEST__INIT;
    rr.n_queries = 1;
    rr.queries = &qp;
    Prometheus__ReadRequest__ResponseType types[2] = {PROMETHEUS__READ_REQUEST__RESPONSE_TYPE__STREAMED_XOR_CHUNKS,
                                                      PROMETHEUS__READ_REQUEST__RESPONSE_TYPE__SAMPLES};
    rr.accepted_response_types = c->samples_only ? &types[1] : types;
    rr.n_accepted_response_types = c->samples_only ? 1 : 2;
    size_t plen = prometheus__read_request__get_packed_size(&rr);
    uint8_t *pb = malloc(plen ? plen : 1);
    int rc = REMOTE_READ_ERR_NOMEM;
    if (pb) {
        prometheus__read_request__pack(&rr, pb);
        size_t clen = snappy_max_compressed_length(plen);
        buf_reserve(out, clen);
        if (snappy_compress((const char *)pb, plen, out->data + out->len, &clen) == SNAPPY_OK) {
            out->len += clen;
            rc = 0;
        }
    }
    free(pb);
    free(lm);
    free(lmp);
    return rc;
}

int remote_read_client_query(remote_read_client_t *c, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                             const querier_hints_t *hints, arena_t *a, remote_read_result_t *out, char *err,
                             size_t errlen)
{
    memset(out, 0, sizeof(*out));
    buf_t body = BUF_INIT, hdr = BUF_INIT;
    httpc_response_t resp;
    httpc_response_init(&resp);
    int rc = rr_build_request(c, ms, n, mint, maxt, hints, &body);
    if (rc != 0) {
        snprintf(err, errlen, "out of memory building the remote read request");
        goto out;
    }
    buf_puts(&hdr, c->headers);
    if (c->bearer_file) {
        buf_t tok = BUF_INIT;
        buf_puts(&tok, "");
        char ferr[256];
        if (httpc_read_secret_file(c->bearer_file, &tok, ferr, sizeof(ferr)) != 0) {
            snprintf(err, errlen, "remote read %s: %s", c->name, ferr);
            buf_free(&tok);
            rc = REMOTE_READ_ERR_UNAVAILABLE;
            goto out;
        }
        buf_printf(&hdr, "Authorization: Bearer %s\r\n", tok.data);
        buf_free(&tok);
    }
    httpc_conn_t *k = rr_conn_get(c);
    if (!k) {
        snprintf(err, errlen, "out of memory");
        rc = REMOTE_READ_ERR_NOMEM;
        goto out;
    }
    char herr[256] = "";
    if (httpc_post(k, hdr.data, body.data, body.len, c->timeout_ms, c->max_bytes + 1, &resp, herr, sizeof(herr)) != 0) {
        httpc_conn_free(k);
        snprintf(err, errlen, "remote read %s: %s", c->name, herr);
        rc = REMOTE_READ_ERR_UNAVAILABLE;
        goto out;
    }
    rr_conn_put(c, k);
    if (resp.status < 200 || resp.status >= 300) {
        /* The body of an error is text in every server we know; show its first line. */
        const char *b = resp.body.len ? resp.body.data : "";
        size_t bl = strcspn(b, "\n");
        snprintf(err, errlen, "remote read %s: server returned HTTP status %d: %.*s", c->name, resp.status,
                 (int)(bl < 200 ? bl : 200), b);
        rc = resp.status >= 500 || resp.status == 429 ? REMOTE_READ_ERR_UNAVAILABLE : REMOTE_READ_ERR_BAD_RESPONSE;
        goto out;
    }
    if (resp.body.len > c->max_bytes) {
        snprintf(err, errlen, "remote read %s: response larger than %zu bytes (--remote-read.max-response-size)",
                 c->name, c->max_bytes);
        rc = REMOTE_READ_ERR_LIMIT;
        goto out;
    }
    bool streamed = strncasecmp(resp.content_type, "application/x-streamed-protobuf", 31) == 0;
    char derr[384];
    rc = remote_read__decode((const uint8_t *)(resp.body.len ? resp.body.data : ""), resp.body.len, streamed,
                             c->max_bytes, c->max_samples, a, out, derr, sizeof(derr));
    if (rc != 0)
        snprintf(err, errlen, "remote read %s: %s", c->name, derr);
    else
        log_debug("remote_read", "remote read answered", LF_S("remote_name", c->name),
                  LF_S("response_type", streamed ? "STREAMED_XOR_CHUNKS" : "SAMPLES"), LF_I("series", (int64_t)out->n),
                  LF_I("samples", (int64_t)out->samples));
out:
    httpc_response_free(&resp);
    buf_free(&body);
    buf_free(&hdr);
    return rc;
}
