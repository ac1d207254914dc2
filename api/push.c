/*
 * push — the Pushgateway API on top of the push registry and storage:
 *
 *   PUT|POST|DELETE /metrics/job/<JOB>{/<LABEL>/<VALUE>}     (also <name>@base64/<url-safe base64>)
 *   GET /api/v1/metrics       GET /api/v1/status       PUT /api/v1/admin/wipe (--web.enable-admin-api)
 *   GET /metrics              every group's metrics (a registered collector, before self-metrics)
 *
 * A push: path -> grouping labels; body (gzip/snappy decoded, bounded) -> parser chosen by
 * Content-Type; registry build (checks, families, samples) -> under one mutex: registry settle
 * (types against other groups, staleness markers) -> storage append (WAL before the reply) ->
 * registry commit and its WAL delta -> after the mutex: the append's roll-up step (storage
 * runs these in the mutex's order) -> 200. The mutex keeps storage seeing pushes in order;
 * parsing and building run outside it on every push thread in parallel.
 *
 * All of that runs on a pool of push threads, not on the HTTP worker that read the request (see
 * "the push pool" below); the worker parks the request and sends the reply the pool hands back.
 *
 * Error words follow the Pushgateway: parse errors are 400 with the parser's line-numbered text
 * and leave the group alone; consistency errors are 400 with "pushed metrics are invalid or
 * inconsistent with existing metrics: ..." and stamp push_failure_time_seconds.
 */
#include "api/push.h"

#include <event2/buffer.h>
#include <pthread.h>
#include <stdarg.h>
#include <snappy-c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "api/router.h"
#include "internal/push/shape.h"
#include "internal/expfmt/proto_parse.h"
#include "internal/expfmt/text_parse.h"
#include "internal/util/buildinfo.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "internal/util/utf8.h"

typedef struct push_job push_job_t;

struct api_push {
    api_push_options_t opt;
    push_registry_t *reg;
    pthread_mutex_t apply_mu;
    /* the push pool */
    api_server_t *srv;
    pthread_t *pool;
    int npool;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;
    push_job_t *head, *tail; /* queued pushes, oldest first */
    bool pool_stop;
    pthread_t expiry_thread;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop, thread_started;
    char *flags_json;
};

static int64_t push_now_ms(const api_push_t *p)
{
    if (p->opt.clock_ms)
        return p->opt.clock_ms();
    return clock_wall_ms();
}

/* ---- path ------------------------------------------------------------------------------------- */

/* RFC 4648 URL-safe base64, padding optional (Go's RawURLEncoding after trimming '='). */
static int push_base64_decode(const char *in, arena_t *a, char **out, char *err, size_t errlen)
{
    size_t n = strlen(in);
    while (n && in[n - 1] == '=')
        n--;
    char *o = arena_alloc(a, n * 3 / 4 + 4);
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        int v = c >= 'A' && c <= 'Z'   ? c - 'A'
                : c >= 'a' && c <= 'z' ? c - 'a' + 26
                : c >= '0' && c <= '9' ? c - '0' + 52
                : c == '-'             ? 62
                : c == '_'             ? 63
                                       : -1;
        if (v < 0) {
            snprintf(err, errlen, "illegal base64 data at input byte %zu", i);
            return -1;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (char)((acc >> bits) & 0xff);
        }
    }
    /* A lone trailing character (6 bits) cannot encode a byte; leftover bits must be zero. */
    if (n % 4 == 1 || (bits > 0 && (acc & ((1u << bits) - 1)) != 0)) {
        snprintf(err, errlen, "illegal base64 data at input byte %zu", n % 4 == 1 ? n - 1 : n - 1);
        return -1;
    }
    o[k] = 0;
    if (memchr(o, 0, k)) {
        snprintf(err, errlen, "decoded value contains a NUL byte");
        return -1;
    }
    *out = o;
    return 0;
}

/* Parses "/metrics/job[@base64]/<job>{/<name>[@base64]/<value>}" into grouping labels (job
 * included). 0, or -1 with a Pushgateway-style message. Not static: tests/fuzz reaches it. */
int api__push_parse_path(const char *path, arena_t *a, labels_t *out, char *err, size_t errlen)
{
    static const char prefix[] = "/metrics/";
    if (strncmp(path, prefix, sizeof(prefix) - 1) != 0)
        return -1;
    char *rest = arena_strdup(a, path + sizeof(prefix) - 1);
    size_t ncomp = 1;
    for (char *c = rest; *c; c++)
        ncomp += *c == '/';
    char **comp = arena_alloc(a, ncomp * sizeof(char *));
    size_t k = 0;
    for (char *c = rest, *s = rest;; c++) {
        if (*c == '/' || *c == 0) {
            bool end = *c == 0;
            *c = 0;
            comp[k++] = s;
            s = c + 1;
            if (end)
                break;
        }
    }
    /* comp[0] = "job" or "job@base64", comp[1] = job, then name/value pairs. */
    if (k < 2 || (strcmp(comp[0], "job") != 0 && strcmp(comp[0], "job@base64") != 0)) {
        snprintf(err, errlen, "the path must start with /metrics/job/<JOB>");
        return -1;
    }
    const char *job = comp[1];
    if (strcmp(comp[0], "job@base64") == 0) {
        char *dec, berr[128];
        if (push_base64_decode(comp[1], a, &dec, berr, sizeof(berr)) != 0) {
            snprintf(err, errlen, "invalid base64 encoding in job name \"%s\": %s", comp[1], berr);
            return -1;
        }
        job = dec;
    }
    if (!job[0]) {
        snprintf(err, errlen, "job name is required");
        return -1;
    }
    if (!utf8_valid(job, strlen(job))) {
        snprintf(err, errlen, "job name is not valid UTF-8");
        return -1;
    }
    size_t npairs = k - 2;
    if (npairs % 2 != 0) {
        snprintf(err, errlen, "odd number of components in label string \"/%s\"",
                 path + sizeof(prefix) - 1 + strlen(comp[0]) + strlen(comp[1]) + 2);
        return -1;
    }
    label_t *ls = arena_alloc(a, (npairs / 2 + 1) * sizeof(label_t));
    size_t n = 0;
    for (size_t i = 2; i + 1 < k; i += 2) {
        char *name = comp[i];
        const char *value = comp[i + 1];
        size_t nl = strlen(name);
        bool b64 = nl > 7 && strcmp(name + nl - 7, "@base64") == 0;
        if (b64)
            name[nl - 7] = 0;
        if (!labels_valid_name(name, strlen(name)) || strncmp(name, "__", 2) == 0) {
            snprintf(err, errlen, "improper label name \"%s\"", name);
            return -1;
        }
        if (b64) {
            char *dec, berr[128];
            if (push_base64_decode(value, a, &dec, berr, sizeof(berr)) != 0) {
                snprintf(err, errlen, "invalid base64 encoding for label %s=\"%s\": %s", name, value, berr);
                return -1;
            }
            value = dec;
        }
        if (!utf8_valid(value, strlen(value))) {
            snprintf(err, errlen, "value of label %s is not valid UTF-8", name);
            return -1;
        }
        if (strcmp(name, "job") == 0)
            continue; /* the job from the path's head wins */
        size_t j;
        for (j = 0; j < n; j++)
            if (strcmp(ls[j].name, name) == 0)
                break;
        ls[j] = (label_t){name, value}; /* a repeated name: the last one wins */
        if (j == n)
            n++;
    }
    ls[n++] = (label_t){"job", job};
    out->v = ls;
    out->n = n;
    labels_sort(out);
    return 0;
}

/* ---- a push in flight ---------------------------------------------------------------------------- */

/* One push, from the worker that read it to a push thread and back. It lives in the request's
 * arena, which it owns (api_req_arena_steal), so a connection freed while its push waits or runs
 * frees nothing the push thread is using. Two references: the push thread's, and the parked
 * request's (dropped when the reply is sent, or by the close callback when the connection goes
 * first); whoever drops the last frees the arena. */
struct push_job {
    api_push_t *p;
    api_req_t *req; /* NULL once the client is gone (worker thread only) */
    arena_t *arena; /* holds this job and the path */
    _Atomic int refs;
    int worker;
    int method;
    const char *path;
    struct evbuffer *body_evb; /* the body as read, until push_job_run copies it */
    const char *content_encoding, *content_type; /* NULL when absent */
    int code;      /* the reply */
    buf_t reply;   /* its text/plain body; empty for none */
    push_job_t *next;
};

static void push_job_reply(push_job_t *j, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void push_job_reply(push_job_t *j, int code, const char *fmt, ...)
{
    j->code = code;
    buf_reset(&j->reply);
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&j->reply, fmt, ap);
    va_end(ap);
}

static void push_job_unref(push_job_t *j)
{
    if (atomic_fetch_sub(&j->refs, 1) == 1) {
        buf_free(&j->reply);
        if (j->body_evb)
            evbuffer_free(j->body_evb);
        arena_destroy(j->arena); /* the job with it */
    }
}

/* ---- body ---------------------------------------------------------------------------------------- */

/* Decodes Content-Encoding (enc may be NULL) of a mutable, NUL-terminated body into a mutable,
 * NUL-terminated buffer (the body itself, or one in arena a). Returns 0, or an HTTP status (400,
 * 413, 415) with a message. */
static int push_decode_body(api_push_t *p, const char *enc, uint8_t *body, size_t len, arena_t *a, char **out,
                            size_t *out_len, char *err, size_t errlen)
{
    size_t limit = p->opt.max_decoded_bytes;
    if (!enc || !enc[0] || strcasecmp(enc, "identity") == 0) {
        *out = (char *)body; /* arena-owned and mutable */
        *out_len = len;
        return 0;
    }
    if (strcasecmp(enc, "snappy") == 0) {
        size_t dlen;
        if (snappy_uncompressed_length((const char *)body, len, &dlen) != SNAPPY_OK ||
            snappy_validate_compressed_buffer((const char *)body, len) != SNAPPY_OK) {
            snprintf(err, errlen, "invalid snappy-compressed body");
            return 400;
        }
        if (dlen > limit) {
            snprintf(err, errlen, "decompressed body is larger than %zu bytes", limit);
            return 413;
        }
        char *d = arena_try_alloc(a, dlen + 1);
        if (!d || snappy_uncompress((const char *)body, len, d, &dlen) != SNAPPY_OK) {
            snprintf(err, errlen, "invalid snappy-compressed body");
            return 400;
        }
        d[dlen] = 0;
        *out = d;
        *out_len = dlen;
        return 0;
    }
    if (strcasecmp(enc, "gzip") == 0 || strcasecmp(enc, "deflate") == 0) {
        z_stream zs;
        memset(&zs, 0, sizeof(zs));
        if (inflateInit2(&zs, strcasecmp(enc, "gzip") == 0 ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK) {
            snprintf(err, errlen, "cannot initialise zlib");
            return 400;
        }
        buf_t b = BUF_INIT;
        zs.next_in = (Bytef *)body;
        zs.avail_in = (uInt)len;
        int zr = Z_OK;
        bool gzip = strcasecmp(enc, "gzip") == 0;
        int members = 0; /* complete gzip members read */
        for (;;) {
            if (zr == Z_STREAM_END) {
                /* A gzip body may hold several members one after another (RFC 1952 2.2); Go's
                 * gzip reader, and so the Pushgateway, reads them all as one stream. */
                members++;
                if (!gzip || zs.avail_in == 0)
                    break;
                inflateReset(&zs);
            }
            buf_reserve(&b, 65536);
            zs.next_out = (Bytef *)b.data + b.len;
            zs.avail_out = 65536;
            zr = inflate(&zs, Z_NO_FLUSH);
            b.len = (size_t)((char *)zs.next_out - b.data);
            bool truncated = zr == Z_OK && zs.avail_in == 0 && zs.avail_out != 0;
            if (b.len > limit) {
                inflateEnd(&zs);
                buf_free(&b);
                snprintf(err, errlen, "decompressed body is larger than %zu bytes", limit);
                return 413;
            }
            if ((zr != Z_OK && zr != Z_STREAM_END) || truncated) {
                /* After a complete member the Pushgateway keeps what it decoded and ignores the
                 * rest (garbage, zeros, a cut-off member): so do we. */
                if (members > 0)
                    break;
                inflateEnd(&zs);
                buf_free(&b);
                snprintf(err, errlen, truncated ? "truncated %s-compressed body" : "invalid %s-compressed body", enc);
                return 400;
            }
        }
        inflateEnd(&zs);
        char *d = arena_try_alloc(a, b.len + 1);
        if (!d) {
            buf_free(&b);
            snprintf(err, errlen, "out of memory");
            return 413;
        }
        memcpy(d, b.data, b.len);
        d[b.len] = 0;
        *out = d;
        *out_len = b.len;
        buf_free(&b);
        return 0;
    }
    snprintf(err, errlen, "unsupported Content-Encoding \"%s\" (identity, gzip, deflate and snappy are)", enc);
    return 415;
}

/* ---- storing an effect ---------------------------------------------------------------------------- */

/* The effect's samples as storage takes them (arena-owned), at the push second; NULL on OOM. */
static storage_sample_t *push_storage_samples(const push_effect_t *e, arena_t *a)
{
    storage_sample_t *ss = arena_try_alloc(a, (e->n ? e->n : 1) * sizeof(*ss));
    if (!ss)
        return NULL;
    int64_t t = e->t_ms - e->t_ms % 1000; /* one-second resolution: pushes of one second line up */
    for (size_t i = 0; i < e->n; i++) {
        ss[i].labels = e->samples[i].labels;
        ss[i].t = t;
        ss[i].v = e->samples[i].v;
    }
    return ss;
}

/* A push with series storage does not hold yet (a reporter's first push: 1,282 of them for a
 * Flink TaskManager) has them created here, before the push lock, so the push threads create
 * series in parallel; under the lock the append then finds every series by its ref. Only when the
 * push's types agree with the other groups' now: settle checks again under the lock, and a
 * conflicting push in between leaves the series made here without samples, which expiry sweeps. */
static void push_prepare_series(api_push_t *p, push_pending_t *pending, arena_t *a)
{
    push_effect_t own;
    if (!p->opt.storage || push_registry_presettle(p->reg, pending, &own) != PUSH_OK || !own.nrefs)
        return;
    static const push_ref_t none;
    size_t missing = 0;
    for (size_t i = 0; i < own.nrefs; i++)
        missing += memcmp(&own.refs[i], &none, sizeof(none)) == 0;
    storage_sample_t *ss = missing ? push_storage_samples(&own, a) : NULL;
    storage_ref_t *refs = ss ? arena_try_alloc(a, own.nrefs * sizeof(*refs)) : NULL;
    if (!refs)
        return; /* nothing new, or out of memory: the append does it all */
    memcpy(refs, own.refs, own.nrefs * sizeof(*refs));
    storage_prepare_refs(p->opt.storage, ss, own.nrefs, refs); /* a refusal is met again by the append */
    memcpy(own.refs, refs, own.nrefs * sizeof(*refs));
}

/* Appends the samples of a change (pushed values or staleness markers) at the push second.
 * Returns 0 or a storage error; msg is filled on error. The roll-up step is left in *job, for
 * storage_append_rollups once apply_mu is released (storage.h): a push's roll-ups then overlap
 * the next push's turn under the lock instead of adding to it. Every change goes this way, so
 * the roll-ups take them in apply_mu's order. */
static int push_store(api_push_t *p, const push_effect_t *e, arena_t *a, char *msg, size_t msglen,
                      storage_rollup_job_t **job)
{
    *job = NULL;
    if (!e->n || !p->opt.storage)
        return 0;
    storage_sample_t *ss = push_storage_samples(e, a);
    if (!ss) {
        snprintf(msg, msglen, "out of memory");
        return STORAGE_ERR_NOMEM;
    }
    /* The series refs the group's previous push resolved to (registry.h: series reference
     * cache); storage verifies each before use and returns the ones it resolved now. */
    storage_ref_t *refs = NULL;
    if (e->nrefs) {
        _Static_assert(sizeof(push_ref_t) == sizeof(storage_ref_t), "push_ref_t holds a storage_ref_t");
        refs = arena_try_alloc(a, e->n * sizeof(*refs));
        if (!refs) {
            snprintf(msg, msglen, "out of memory");
            return STORAGE_ERR_NOMEM;
        }
        memcpy(refs, e->refs, e->nrefs * sizeof(*refs));
        memset(refs + e->nrefs, 0, (e->n - e->nrefs) * sizeof(*refs));
    }
    storage_append_result_t res;
    int rc = storage_append_refs_defer(p->opt.storage, ss, e->n, refs, &res, job);
    if (refs)
        memcpy(e->refs, refs, e->nrefs * sizeof(*refs));
    if (rc == STORAGE_OK)
        return 0;
    if (rc == STORAGE_ERR_OUT_OF_ORDER || rc == STORAGE_ERR_TOO_OLD) {
        /* The clock went back: keep what could be stored, note the rest. */
        log_warn("push", "some samples were not stored", LF_S("reason", res.msg), LF_I("failed", (int64_t)res.failed));
        return 0;
    }
    snprintf(msg, msglen, "%s", res.msg);
    return rc;
}

#define PUSH_STATE_TYPE 1 /* storage state-client type byte of the push groups (storage.h registry) */

/* Logs a registry delta so the groups survive kill -9; the snapshot holds the full state. */
static void push_log_delta(api_push_t *p, const buf_t *delta)
{
    if (!p->opt.storage || !delta->len)
        return;
    char err[256];
    if (storage_log_state(p->opt.storage, PUSH_STATE_TYPE, delta->data, delta->len, err, sizeof(err)) != STORAGE_OK)
        log_error("push", "cannot log a group change; it is kept in memory until the next snapshot", LF_S("err", err));
}

static int push_state_restore(void *ud, const void *data, size_t len, bool full)
{
    api_push_t *p = ud;
    int rc = full ? push_registry_restore(p->reg, data, len) : push_registry_apply_delta(p->reg, data, len);
    if (rc != 0)
        log_warn("push",
                 full ? "push groups in the snapshot are unreadable" : "skipped an unreadable push group change");
    return rc;
}

static int push_state_put(void *ctx, const void *data, size_t len)
{
    return storage_state_put(ctx, data, len);
}

/* In pieces of about 1 MiB: the whole registry in one buffer was ~130 MB at 256k series. */
static int push_state_checkpoint(void *ud, storage_state_sink_t *sink)
{
    api_push_t *p = ud;
    return push_registry_serialize(p->reg, 1u << 20, push_state_put, sink);
}

static int push_storage_status(int rc)
{
    switch (rc) {
    case STORAGE_ERR_IO:
    case STORAGE_ERR_NOT_READY:
    case STORAGE_ERR_NOMEM: return 503;
    default: return 400;
    }
}

/* ---- handlers ------------------------------------------------------------------------------------- */

/* The registry delta of a push is built in a buffer each HTTP worker keeps: a new group's record
 * is ~0.5 MiB (every label set of ~860 metrics), and a fresh buffer per push grew to that by
 * doubling, copying and page-faulting each time, under the push lock (~10 % of the CPU of the
 * pushes that create the groups). Kept up to PUSH_DELTA_KEEP bytes; a larger one is let go. */
#define PUSH_DELTA_KEEP (8u << 20)
static pthread_key_t push_delta_key;
static pthread_once_t push_delta_once = PTHREAD_ONCE_INIT;
static bool push_delta_key_ok;

static void push_delta_free(void *v)
{
    buf_free(v);
    free(v);
}

static void push_delta_key_init(void)
{
    push_delta_key_ok = pthread_key_create(&push_delta_key, push_delta_free) == 0;
}

/* The calling thread's delta buffer, empty (freed when the thread exits). A key or a buffer that
 * cannot be had is out of memory: abort, as buf_* do. */
static buf_t *push_delta_take(void)
{
    pthread_once(&push_delta_once, push_delta_key_init);
    if (!push_delta_key_ok)
        abort();
    buf_t *b = pthread_getspecific(push_delta_key);
    if (!b) {
        b = calloc(1, sizeof(*b));
        if (!b || pthread_setspecific(push_delta_key, b) != 0)
            abort();
    }
    buf_reset(b);
    return b;
}

static void push_delta_done(buf_t *d)
{
    if (d->cap > PUSH_DELTA_KEEP)
        buf_free(d);
    else
        buf_reset(d);
}

/* Runs a PUT or POST of the job's group with its body (mutable, NUL-terminated past len); the
 * push's allocations go to arena. */
static void push_handle_write(api_push_t *p, push_job_t *j, arena_t *arena, uint8_t *raw, size_t raw_len,
                              push_mode_t mode)
{
    char err[2048];
    labels_t grouping;
    if (api__push_parse_path(j->path, arena, &grouping, err, sizeof(err)) != 0) {
        push_job_reply(j, 400, "%s\n", err);
        return;
    }
    char *body;
    size_t len;
    int st = push_decode_body(p, j->content_encoding, raw, raw_len, arena, &body, &len, err, sizeof(err));
    if (st) {
        push_job_reply(j, st, "%s\n", err);
        return;
    }
    expfmt_format_t fmt = expfmt_format_from_content_type(j->content_type);
    bool text = fmt != EXPFMT_FORMAT_PROTO_DELIM;
    push_pending_t *pending = NULL;
    push_effect_t effect;
    int rc;
    int64_t now;
    /* A reporter's push usually repeats its previous body with new values: then only the values
     * are read (registry.h, repeated pushes); anything else is parsed in full. */
    push_fast_t *fast = NULL;
    if (text && mode == PUSH_PUT &&
        push_registry_match(p->reg, &grouping, body, len, fmt, arena, &fast) == PUSH_OK) {
        now = push_now_ms(p);
        pthread_mutex_lock(&p->apply_mu);
        rc = push_registry_settle_fast(p->reg, fast, now, arena, &pending, &effect);
        push_registry_fast_release(p->reg, fast);
        if (rc == PUSH_OK)
            goto store;
        pthread_mutex_unlock(&p->apply_mu);
        if (rc == PUSH_ERR_NOMEM) {
            push_job_reply(j, 503, "out of memory\n");
            return;
        }
    }
    /* The text parser changes the body in place: the shape of a PUT is taken from a copy. */
    char *orig = NULL;
    if (text && mode == PUSH_PUT && (orig = arena_try_alloc(arena, len ? len : 1)) != NULL)
        memcpy(orig, body, len);
    expfmt_result_t parsed;
    rc = !text ? expfmt_parse_proto((const uint8_t *)body, len, &p->opt.limits, arena, &parsed, err, sizeof(err))
               : expfmt_parse_text_spans(body, len, fmt == EXPFMT_FORMAT_OPENMETRICS, &p->opt.limits, arena,
                                         &parsed, err, sizeof(err));
    if (rc != EXPFMT_OK) {
        push_job_reply(j, rc == EXPFMT_ENOMEM ? 413 : 400, "%s\n", err);
        return;
    }
    now = push_now_ms(p);
    /* Building what the group will hold is the costly part: it runs on every push thread in parallel;
     * only the check against other groups, the append and the commit are serialized. */
    rc = push_registry_build(p->reg, &grouping, mode, &parsed, now, arena, &pending, err, sizeof(err));
    if (rc == PUSH_OK && orig)
        push_registry_pending_take_shape(pending, push_shape_build(orig, len, fmt, &parsed),
                                         fmt == EXPFMT_FORMAT_OPENMETRICS);
    if (rc == PUSH_OK)
        push_prepare_series(p, pending, arena);
    pthread_mutex_lock(&p->apply_mu);
    if (rc == PUSH_OK) {
        rc = push_registry_settle(p->reg, pending, &effect, err, sizeof(err));
        if (rc != PUSH_OK)
            push_registry_abort(pending);
    }
store:;
    buf_t *delta = push_delta_take();
    if (rc != PUSH_OK) {
        push_registry_fail(p->reg, &grouping, now, delta);
        push_log_delta(p, delta);
        pthread_mutex_unlock(&p->apply_mu);
        push_delta_done(delta);
        push_job_reply(j, rc == PUSH_ERR_NOMEM ? 503 : 400, "%s\n", rc == PUSH_ERR_NOMEM ? "out of memory" : err);
        return;
    }
    storage_rollup_job_t *job;
    rc = push_store(p, &effect, arena, err, sizeof(err), &job);
    if (rc != 0) {
        push_registry_abort(pending);
        push_registry_fail(p->reg, &grouping, now, delta);
        push_log_delta(p, delta);
        pthread_mutex_unlock(&p->apply_mu);
        storage_append_rollups(p->opt.storage, job);
        push_delta_done(delta);
        push_job_reply(j, push_storage_status(rc), "cannot store the push: %s\n", err);
        return;
    }
    push_registry_commit(p->reg, pending, delta);
    push_log_delta(p, delta);
    pthread_mutex_unlock(&p->apply_mu);
    storage_append_rollups(p->opt.storage, job);
    push_delta_done(delta);
    j->code = 200;
}

static void push_handle_delete(api_push_t *p, push_job_t *j, arena_t *arena)
{
    char err[1024];
    labels_t grouping;
    if (api__push_parse_path(j->path, arena, &grouping, err, sizeof(err)) != 0) {
        push_job_reply(j, 400, "%s\n", err);
        return;
    }
    push_effect_t effect;
    buf_t delta = BUF_INIT;
    storage_rollup_job_t *job;
    pthread_mutex_lock(&p->apply_mu);
    push_registry_delete(p->reg, &grouping, push_now_ms(p), arena, &effect, &delta);
    int rc = push_store(p, &effect, arena, err, sizeof(err), &job);
    push_log_delta(p, &delta);
    pthread_mutex_unlock(&p->apply_mu);
    storage_append_rollups(p->opt.storage, job);
    buf_free(&delta);
    if (rc != 0)
        log_warn("push", "cannot store staleness markers of a deleted group", LF_S("err", err));
    j->code = 202;
}

/* The connection of a parked push was freed before its reply: at the server's teardown (evhttp
 * does not read from a connection whose request is unanswered, so a client that leaves is only
 * noticed when its reply is written). The push itself still runs; its reply has nowhere to go. */
static void push_job_client_gone(api_req_t *req, void *ud)
{
    push_job_t *j = ud;
    (void)req;
    j->req = NULL;
    push_job_unref(j);
}

static void push_job_answer(api_req_t *req, const push_job_t *j)
{
    api_reply(req, j->code, j->reply.len ? "text/plain; charset=utf-8" : NULL, j->reply.data, j->reply.len);
}

/* On the worker: the push ran; answer it if its client is still there. */
static void push_job_done(void *arg)
{
    push_job_t *j = arg;
    if (j->req) {
        push_job_answer(j->req, j);
        j->req = NULL;
        push_job_unref(j); /* the request's reference: replied, it is gone */
    }
    push_job_unref(j);
}

/* Runs a push in an arena of its own, freed here: the request's arena (this job, the path) lives
 * until the worker has sent the reply, and a push's blocks (its body and what parsing it makes,
 * megabytes for a new TaskManager) held that long were more blocks the arena cache kept. */
static void push_job_run(push_job_t *j)
{
    api_push_t *p = j->p;
    arena_t *work = arena_create(0);
    size_t n = evbuffer_get_length(j->body_evb);
    uint8_t *body = work ? arena_try_alloc(work, n + 1) : NULL;
    if (!body) {
        push_job_reply(j, 503, "out of memory\n");
        arena_destroy(work);
        return;
    }
    evbuffer_remove(j->body_evb, body, n);
    body[n] = 0;
    evbuffer_free(j->body_evb);
    j->body_evb = NULL;
    switch (j->method) {
    case API_PUT: push_handle_write(p, j, work, body, n, PUSH_PUT); break;
    case API_POST: push_handle_write(p, j, work, body, n, PUSH_POST); break;
    default: push_handle_delete(p, j, work); break;
    }
    arena_destroy(work);
}

/* ---- the push pool -------------------------------------------------------------------------------
 *
 * An HTTP worker owns a connection for the connection's life (evhttp), and a worker busy with a
 * push accepts nothing meanwhile. A reporter pool's 8 keep-alive connections, opened while the
 * first pushes were being served, ended up 2 on one worker and 6 on the other in most runs of the
 * push bench, and every push on the six waited behind five others: a round of 200 new
 * TaskManagers had its p99 at 85-160 ms, its p50 at 30 ms. Here the pushes of every connection
 * wait in one queue, oldest first, for the first free push thread (as many as workers). The
 * same round's p99 was 38-47 ms, and the round took 0.57-0.67 s instead of 0.71-0.90 s. */
static void *push_pool_main(void *arg)
{
    api_push_t *p = arg;
    pthread_setname_np(pthread_self(), "push");
    for (;;) {
        pthread_mutex_lock(&p->pool_mu);
        while (!p->pool_stop && !p->head)
            pthread_cond_wait(&p->pool_cv, &p->pool_mu);
        push_job_t *j = p->head;
        if (!j) { /* stopping, and the queue is empty */
            pthread_mutex_unlock(&p->pool_mu);
            return NULL;
        }
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        pthread_mutex_unlock(&p->pool_mu);
        push_job_run(j);
        if (api_server_run_on(p->srv, j->worker, push_job_done, j) != 0) {
            /* the loops are gone (shutdown): the server's teardown drops the other reference */
            log_warn("push", "cannot hand a push's reply back to its worker; dropping the reply");
            push_job_unref(j);
        }
    }
}

/* On the worker: a push is read; park it and queue it for the pool. */
static void push_handler(api_req_t *req, void *ud)
{
    api_push_t *p = ud;
    if (req->method != API_PUT && req->method != API_POST && req->method != API_DELETE) {
        api_reply_text(req, 405, "method not allowed\n");
        return;
    }
    const char *enc = api_req_header(req, "Content-Encoding"), *ctype = api_req_header(req, "Content-Type");
    push_job_t *j = arena_try_alloc(req->arena, sizeof(*j));
    char *enc_copy = enc ? arena_strdup(req->arena, enc) : NULL, *ctype_copy = ctype ? arena_strdup(req->arena, ctype) : NULL;
    struct evbuffer *body = j && (!enc || enc_copy) && (!ctype || ctype_copy) ? api_req_body_steal(req) : NULL;
    if (!body) {
        api_reply_text(req, 503, "out of memory\n");
        return;
    }
    if (!p->npool) { /* no pool (it could not start): serve it here */
        *j = (push_job_t){.p = p, .arena = req->arena, .method = req->method, .path = req->path, .body_evb = body};
        j->content_encoding = enc_copy;
        j->content_type = ctype_copy;
        push_job_run(j);
        if (j->body_evb)
            evbuffer_free(j->body_evb);
        push_job_answer(req, j);
        buf_free(&j->reply);
        return;
    }
    *j = (push_job_t){.p = p,
                      .req = req,
                      .worker = req->worker,
                      .method = req->method,
                      .path = req->path,
                      .body_evb = body,
                      .content_encoding = enc_copy,
                      .content_type = ctype_copy};
    atomic_init(&j->refs, 2);
    j->arena = api_req_arena_steal(req);
    api_req_park(req, push_job_client_gone, j);
    pthread_mutex_lock(&p->pool_mu);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->pool_cv);
    pthread_mutex_unlock(&p->pool_mu);
}

static void push_api_metrics(api_req_t *req, void *ud)
{
    api_push_t *p = ud;
    buf_t b = BUF_INIT;
    push_registry_write_json(p->reg, &b);
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

static void push_api_status(api_req_t *req, void *ud)
{
    api_push_t *p = ud;
    buf_t b = BUF_INIT;
    char start[64];
    time_t s = (time_t)metrics_process_start_time();
    struct tm tm;
    gmtime_r(&s, &tm);
    strftime(start, sizeof(start), "%Y-%m-%dT%H:%M:%SZ", &tm);
    buf_puts(&b, "{\"flags\":");
    buf_puts(&b, p->flags_json ? p->flags_json : "{}");
    buf_printf(&b,
               ",\"start_time\":\"%s\",\"build_information\":{\"version\":\"%s\",\"revision\":\"%s\","
               "\"branch\":\"%s\",\"buildUser\":\"%s\",\"buildDate\":\"%s\",\"goVersion\":\"%s\"}}",
               start, SLUICE_VERSION, SLUICE_REVISION, SLUICE_BRANCH, SLUICE_BUILD_USER, SLUICE_BUILD_DATE,
               SLUICE_COMPILER);
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

static void push_api_wipe(api_req_t *req, void *ud)
{
    api_push_t *p = ud;
    push_effect_t effect;
    char err[512];
    buf_t delta = BUF_INIT;
    storage_rollup_job_t *job;
    pthread_mutex_lock(&p->apply_mu);
    push_registry_wipe(p->reg, push_now_ms(p), req->arena, &effect, &delta);
    int rc = push_store(p, &effect, req->arena, err, sizeof(err), &job);
    push_log_delta(p, &delta);
    pthread_mutex_unlock(&p->apply_mu);
    storage_append_rollups(p->opt.storage, job);
    buf_free(&delta);
    if (rc != 0)
        log_warn("push", "cannot store staleness markers of wiped groups", LF_S("err", err));
    log_info("push", "all groups wiped by the admin API");
    api_reply(req, 202, NULL, NULL, 0);
}

/* The push groups on GET /metrics, as a stream collector (see metrics.h). */
static void *push_collect_begin(void *ud)
{
    return push_registry_render_begin(((api_push_t *)ud)->reg);
}
static bool push_collect_next(void *h, buf_t *out, size_t max_bytes)
{
    return push_registry_render_next(h, out, max_bytes);
}
static void push_collect_end(void *h)
{
    push_registry_render_end(h);
}
static const metrics_stream_ops_t push_collect_text = {push_collect_begin, push_collect_next, push_collect_end};
static void push_collect_self(void *ud, buf_t *out)
{
    push_registry_write_metrics(((api_push_t *)ud)->reg, out);
}

/* ---- expiry ------------------------------------------------------------------------------------ */

void api_push_expire_now(api_push_t *p)
{
    arena_t *a = arena_create(0);
    if (!a)
        return;
    push_effect_t effect;
    char err[512];
    buf_t delta = BUF_INIT;
    storage_rollup_job_t *job;
    pthread_mutex_lock(&p->apply_mu);
    size_t n = push_registry_expire(p->reg, push_now_ms(p), a, &effect, &delta);
    int rc = push_store(p, &effect, a, err, sizeof(err), &job);
    push_log_delta(p, &delta);
    pthread_mutex_unlock(&p->apply_mu);
    storage_append_rollups(p->opt.storage, job);
    buf_free(&delta);
    if (n)
        log_info("push", "expired groups", LF_I("groups", (int64_t)n), LF_I("stale_series", (int64_t)effect.n));
    if (rc != 0)
        log_warn("push", "cannot store staleness markers of expired groups", LF_S("err", err));
    arena_destroy(a);
}

static void *push_expiry_main(void *arg)
{
    api_push_t *p = arg;
    pthread_mutex_lock(&p->stop_mu);
    while (!p->stop) {
        struct timespec ts = clock_deadline_ms(CLOCK_REALTIME, 1000);
        pthread_cond_timedwait(&p->stop_cv, &p->stop_mu, &ts);
        if (p->stop)
            break;
        pthread_mutex_unlock(&p->stop_mu);
        api_push_expire_now(p);
        pthread_mutex_lock(&p->stop_mu);
    }
    pthread_mutex_unlock(&p->stop_mu);
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------------------- */

api_push_t *api_push_new(const api_push_options_t *opt)
{
    api_push_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->opt = *opt;
    if (!p->opt.max_decoded_bytes)
        p->opt.max_decoded_bytes = 32u << 20;
    push_options_t po = {.group_ttl_ms = opt->group_ttl_ms,
                         .missed_intervals = opt->missed_intervals,
                         .on_beat = opt->on_beat,
                         .beat_ud = opt->beat_ud};
    p->reg = push_registry_new(&po);
    p->flags_json = opt->flags_json ? strdup(opt->flags_json) : NULL;
    pthread_mutex_init(&p->apply_mu, NULL);
    pthread_mutex_init(&p->pool_mu, NULL);
    pthread_cond_init(&p->pool_cv, NULL);
    pthread_mutex_init(&p->stop_mu, NULL);
    pthread_cond_init(&p->stop_cv, NULL);
    if (!p->reg) {
        api_push_free(p);
        return NULL;
    }
    if (p->opt.storage) {
        storage_state_client_t c = {.ud = p, .restore = push_state_restore, .checkpoint = push_state_checkpoint};
        if (storage_register_state(p->opt.storage, PUSH_STATE_TYPE, &c) != STORAGE_OK) {
            api_push_free(p);
            return NULL;
        }
    }
    return p;
}

push_registry_t *api_push_registry(api_push_t *p)
{
    return p->reg;
}

/* As many push threads as HTTP workers: pushes use the cores the workers would have. */
static void push_pool_start(api_push_t *p, api_server_t *srv)
{
    int n = api_server_worker_count(srv);
    p->srv = srv;
    p->pool = calloc((size_t)n, sizeof(*p->pool));
    if (!p->pool) {
        log_warn("push", "cannot start the push threads; pushes run on the HTTP workers");
        return;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&p->pool[i], NULL, push_pool_main, p) != 0) {
            log_warn("push", "cannot start a push thread", LF_I("started", (int64_t)p->npool));
            break;
        }
        p->npool++;
    }
}

/* Runs what is queued, then joins the threads. */
static void push_pool_stop(api_push_t *p)
{
    pthread_mutex_lock(&p->pool_mu);
    p->pool_stop = true;
    pthread_cond_broadcast(&p->pool_cv);
    pthread_mutex_unlock(&p->pool_mu);
    for (int i = 0; i < p->npool; i++)
        pthread_join(p->pool[i], NULL);
    p->npool = 0;
    free(p->pool);
    p->pool = NULL;
}

void api_push_register_routes(api_push_t *p, api_server_t *srv)
{
    push_pool_start(p, srv);
    api_route_add(srv, API_PUT | API_POST | API_DELETE, "/metrics/job/*", "push", push_handler, p);
    api_route_add(srv, API_PUT | API_POST | API_DELETE, "/metrics/job@base64/*", "push", push_handler, p);
    api_route_add(srv, API_GET, "/api/v1/metrics", "push_metrics", push_api_metrics, p);
    api_route_add(srv, API_GET, "/api/v1/status", "push_status", push_api_status, p);
    if (p->opt.enable_admin_api)
        api_route_add(srv, API_PUT, "/api/v1/admin/wipe", "push_wipe", push_api_wipe, p);
    metrics_register_pushed_stream("push_groups", &push_collect_text, p);
    metrics_register("push_self", push_collect_self, p);
}

int api_push_start(api_push_t *p)
{
    if (pthread_create(&p->expiry_thread, NULL, push_expiry_main, p) != 0)
        return -1;
    p->thread_started = true;
    return 0;
}

void api_push_stop(api_push_t *p)
{
    if (!p)
        return;
    push_pool_stop(p);
    if (!p->thread_started)
        return;
    pthread_mutex_lock(&p->stop_mu);
    p->stop = true;
    pthread_cond_signal(&p->stop_cv);
    pthread_mutex_unlock(&p->stop_mu);
    pthread_join(p->expiry_thread, NULL);
    p->thread_started = false;
}

void api_push_free(api_push_t *p)
{
    if (!p)
        return;
    api_push_stop(p);
    push_registry_free(p->reg);
    pthread_mutex_destroy(&p->apply_mu);
    pthread_mutex_destroy(&p->pool_mu);
    pthread_cond_destroy(&p->pool_cv);
    pthread_mutex_destroy(&p->stop_mu);
    pthread_cond_destroy(&p->stop_cv);
    free(p->flags_json);
    free(p);
}
