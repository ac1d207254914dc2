/*
 * federate — GET|POST /federate; see federate.h.
 *
 * Request life:
 *
 *   worker loop                        reader thread                      worker loop
 *   -----------                        -------------                      -----------
 *   match[] parsed (400 on a bad one)
 *   job, park ──────────────────────▶  queue ─▶ querier select per match[]
 *                                      over [now-lookback, now]; per series
 *                                      its last sample (stale → skipped):
 *                                      labels + sample copied into the job's
 *                                      budgeted arena; sort by name, labels;
 *                                      drop duplicates ──────────────────────▶ fed_job_ready:
 *                                                                              render ~64 KiB,
 *                                                                              send; drained →
 *                                                                              render the next
 *
 * The job belongs to the reader thread between enqueue and api_server_run_on, then to the
 * request's worker, which frees it when the reply is done or the client has gone (on_close, same
 * worker). job->req is touched only on the worker loop; job->cancel is how the loop tells a
 * running read to stop.
 *
 * Output follows Prometheus 2.42 (web/federate.go + expfmt): families by metric name, each
 * opened with `# TYPE <name> untyped` (no HELP: federation keeps no metadata), series within a
 * family in label order, labels in name order without __name__ and without empty values, then
 * the external labels the series lacks (instance="" always among them), value as Go's
 * FormatFloat 'g' (+Inf, -Inf, NaN), timestamp in ms. Label values escape \ " and newline.
 * Protobuf: the same families as length-delimited io.prometheus.client.MetricFamily messages
 * (name 1, type 3 = UNTYPED, metric 4 { label 1 {name 1, value 2}, untyped 5 {value 1},
 * timestamp_ms 6 }).
 */
#include "api/federate.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "api/router.h"
#include "internal/labels/labels.h"
#include "internal/promql/selector.h"
#include "internal/util/arena.h"
#include "internal/util/clock.h"
#include "internal/util/heap.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "internal/util/varint.h"
#include "storage/querier.h"

#define FED_PIECE (64 * 1024) /* bytes rendered before they are handed to the connection */
#define FED_CHECK_EVERY 256   /* series between looks at the clock and the cancel flag */
#define FED_STALE_BITS 0x7ff0000000000002ULL
#define FED_CT_TEXT "text/plain; version=0.0.4; charset=utf-8"
#define FED_CT_PROTO "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

typedef struct {
    const char *name; /* __name__, or NULL */
    labels_t ls;
    int64_t t;
    double v;
} fed_entry_t;

typedef struct fed_job fed_job_t;

struct api_federate {
    api_federate_options_t opt;
    labels_t ext; /* external labels, sorted, instance included (value "" unless given) */
    char *ext_strs;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fed_job_t *head, *tail; /* FIFO of jobs waiting for a reader */
    fed_job_t *live;        /* jobs queued or being read */
    bool stop;
    atomic_uint_least64_t n_requests, n_series, n_refused;
};

struct fed_job {
    api_federate_t *f;
    api_req_t *req; /* NULL once the client has gone; worker loop only */
    int worker;
    volatile int cancel;
    bool proto;
    promql_selector_t *sels;
    size_t nsels;
    int64_t mint, maxt, deadline_ns;
    arena_t *arena;                /* the entries and their labels; charged to budget */
    arena_budget_t budget;         /* this request's, under the shared query budget */
    unsigned long shared_refused0; /* the shared budget's refusals when the job began */
    /* result */
    int code; /* 200, or the error status with err */
    char err[512];
    fed_entry_t *ents;
    size_t n, cap;
    /* sending */
    size_t next;     /* first entry not yet rendered */
    const char *fam; /* name of the family being rendered (text) */
    buf_t out;       /* rendered, not yet handed to the connection */
    bool gzip;       /* the client accepts gzip: each piece goes through z into zout */
    bool z_open;
    z_stream z;
    buf_t zout;
    bool sending; /* the reply has started (worker loop only): from then the worker owns the job */
    bool in_pump, again;
    fed_job_t *qnext, *live_prev, *live_next;
};

/* ---- rendering ------------------------------------------------------------------------------ */

static void fed_put_label_value(buf_t *b, const char *v)
{
    const char *run = v;
    for (; *v; v++) {
        const char *esc = *v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : *v == '\n' ? "\\n" : NULL;
        if (!esc)
            continue;
        buf_append(b, run, (size_t)(v - run));
        buf_puts(b, esc);
        run = v + 1;
    }
    buf_append(b, run, (size_t)(v - run));
}

/* The labels a series is shown with: its own (no __name__, no empty values) in name order, then
 * the external labels it lacks, in name order (Prometheus appends them after, unsorted with the
 * rest). Calls fn for each. */
typedef void (*fed_label_fn)(buf_t *b, const char *name, const char *value, bool first);

static void fed_each_label(const api_federate_t *f, const labels_t *ls, buf_t *b, fed_label_fn fn)
{
    bool first = true;
    for (size_t i = 0; i < ls->n; i++) {
        if (!ls->v[i].value[0] || strcmp(ls->v[i].name, "__name__") == 0)
            continue;
        fn(b, ls->v[i].name, ls->v[i].value, first);
        first = false;
    }
    for (size_t i = 0; i < f->ext.n; i++) {
        const char *have = labels_get(ls, f->ext.v[i].name);
        if (have && have[0])
            continue;
        fn(b, f->ext.v[i].name, f->ext.v[i].value, first);
        first = false;
    }
}

static void fed_text_label(buf_t *b, const char *name, const char *value, bool first)
{
    buf_putc(b, first ? '{' : ',');
    buf_puts(b, name);
    buf_puts(b, "=\"");
    fed_put_label_value(b, value);
    buf_putc(b, '"');
}

static void fed_render_text(fed_job_t *j, const fed_entry_t *e)
{
    buf_t *b = &j->out;
    if (!j->fam || strcmp(j->fam, e->name) != 0) {
        buf_puts(b, "# TYPE ");
        buf_puts(b, e->name);
        buf_puts(b, " untyped\n");
        j->fam = e->name;
    }
    buf_puts(b, e->name);
    size_t before = b->len;
    fed_each_label(j->f, &e->ls, b, fed_text_label);
    if (b->len > before)
        buf_putc(b, '}');
    buf_putc(b, ' ');
    buf_put_float(b, e->v);
    buf_printf(b, " %lld\n", (long long)e->t);
}

/* protobuf helpers: field keys and length-delimited fields */
static void pb_key(buf_t *b, unsigned field, unsigned wire)
{
    buf_putc(b, (char)(field << 3 | wire));
}

static void pb_uvarint(buf_t *b, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = varint_encode(tmp, v);
    buf_append(b, tmp, n);
}

static void pb_bytes(buf_t *b, unsigned field, const void *p, size_t n)
{
    pb_key(b, field, 2);
    pb_uvarint(b, n);
    buf_append(b, p, n);
}

static void fed_proto_label(buf_t *b, const char *name, const char *value, bool first)
{
    (void)first;
    size_t nl = strlen(name), vl = strlen(value);
    buf_t lp = BUF_INIT;
    pb_bytes(&lp, 1, name, nl);
    pb_bytes(&lp, 2, value, vl);
    pb_bytes(b, 1, lp.data, lp.len);
    buf_free(&lp);
}

/* One MetricFamily per run of entries with one name, from j->next; leaves j->next past it. */
static void fed_render_proto_family(fed_job_t *j)
{
    const char *name = j->ents[j->next].name;
    buf_t fam = BUF_INIT, m = BUF_INIT;
    pb_bytes(&fam, 1, name, strlen(name));
    pb_key(&fam, 3, 0);
    pb_uvarint(&fam, 3); /* UNTYPED */
    for (; j->next < j->n && strcmp(j->ents[j->next].name, name) == 0; j->next++) {
        const fed_entry_t *e = &j->ents[j->next];
        buf_reset(&m);
        fed_each_label(j->f, &e->ls, &m, fed_proto_label);
        uint8_t u[9];
        uint64_t bits;
        memcpy(&bits, &e->v, sizeof(bits));
        u[0] = 1 << 3 | 1; /* Untyped.value, fixed64 */
        for (int k = 0; k < 8; k++)
            u[1 + k] = (uint8_t)(bits >> (8 * k));
        pb_bytes(&m, 5, u, sizeof(u));
        pb_key(&m, 6, 0);
        pb_uvarint(&m, (uint64_t)e->t);
        pb_bytes(&fam, 4, m.data, m.len);
    }
    pb_uvarint(&j->out, fam.len);
    buf_append(&j->out, fam.data, fam.len);
    buf_free(&fam);
    buf_free(&m);
}

/* Renders from j->next until about a piece is ready or every entry is out. */
static void fed_render_piece(fed_job_t *j)
{
    while (j->next < j->n && j->out.len < FED_PIECE) {
        if (j->proto)
            fed_render_proto_family(j);
        else
            fed_render_text(j, &j->ents[j->next++]);
    }
}

/* ---- jobs ----------------------------------------------------------------------------------- */

static void fed_job_free(fed_job_t *j)
{
    for (size_t i = 0; i < j->nsels; i++)
        promql_selector_free(&j->sels[i]);
    free(j->sels);
    size_t held = j->budget.peak;
    arena_destroy(j->arena); /* gives its blocks back to the budgets */
    buf_free(&j->out);
    buf_free(&j->zout);
    if (j->z_open)
        deflateEnd(&j->z);
    free(j);
    heap_trim_after(held);
}

static void fed_unlink_live(fed_job_t *j)
{
    api_federate_t *f = j->f;
    pthread_mutex_lock(&f->mu);
    if (j->live_prev)
        j->live_prev->live_next = j->live_next;
    else if (f->live == j)
        f->live = j->live_next;
    if (j->live_next)
        j->live_next->live_prev = j->live_prev;
    j->live_prev = j->live_next = NULL;
    pthread_mutex_unlock(&f->mu);
}

/* Worker loop: the client closed the connection (while parked or mid-stream). */
static void fed_client_gone(api_req_t *req, void *ud)
{
    (void)req;
    fed_job_t *j = ud;
    j->req = NULL;
    j->cancel = 1;
    if (j->sending) /* mid-stream: the job is this loop's to free; else the reader still has it */
        fed_job_free(j);
}

/* Compresses the rendered piece into zout: a sync flush per piece, so every piece goes out at
 * once; the last one ends the gzip stream. 0 or -1. */
static int fed_gzip_piece(fed_job_t *j, bool last)
{
    if (!j->z_open) {
        memset(&j->z, 0, sizeof(j->z));
        if (deflateInit2(&j->z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return -1;
        j->z_open = true;
    }
    buf_reset(&j->zout);
    size_t bound = deflateBound(&j->z, (uLong)j->out.len) + 64;
    if (buf_try_reserve(&j->zout, bound) != 0)
        return -1;
    j->z.next_in = (Bytef *)(j->out.data ? j->out.data : "");
    j->z.avail_in = (uInt)j->out.len;
    j->z.next_out = (Bytef *)j->zout.data;
    j->z.avail_out = (uInt)bound;
    int rc = deflate(&j->z, last ? Z_FINISH : Z_SYNC_FLUSH);
    j->zout.len = bound - j->z.avail_out;
    return (last ? rc == Z_STREAM_END : rc == Z_OK) && j->z.avail_in == 0 ? 0 : -1;
}

/* The bytes of the piece as they go out (compressed when asked for); NULL when zlib failed. */
static const buf_t *fed_wire(fed_job_t *j, bool last)
{
    if (!j->gzip)
        return &j->out;
    return fed_gzip_piece(j, last) == 0 ? &j->zout : NULL;
}

static void fed_pump(fed_job_t *j);

static void fed_drained(api_req_t *req, void *ud)
{
    (void)req;
    fed_job_t *j = ud;
    if (j->in_pump) {
        j->again = true;
        return;
    }
    fed_pump(j);
}

/* Worker loop: hands the rendered piece to the connection; ends the reply after the last. */
static void fed_pump(fed_job_t *j)
{
    j->in_pump = true;
    do {
        j->again = false;
        buf_reset(&j->out);
        fed_render_piece(j);
        bool last = j->next >= j->n;
        const buf_t *w = fed_wire(j, last);
        if (!w) { /* cannot compress: cut the stream short so the client sees it fail */
            api_req_t *req = j->req;
            log_warn("federate", "cannot compress the federation reply; ending it early");
            fed_job_free(j);
            api_reply_stream_end(req);
            return;
        }
        if (last) {
            api_req_t *req = j->req;
            if (w->len && api_reply_stream_chunk(req, w->data, w->len, NULL, NULL) < 0)
                log_debug("federate", "client went away before the last piece");
            atomic_fetch_add(&j->f->n_series, j->n);
            fed_job_free(j);
            api_reply_stream_end(req);
            return;
        }
        if (api_reply_stream_chunk(j->req, w->data, w->len, fed_drained, j) < 0) {
            api_req_t *req = j->req;
            fed_job_free(j);
            api_reply_stream_end(req);
            return;
        }
    } while (j->again);
    j->in_pump = false;
}

/* Worker loop: the read is over. */
static void fed_job_ready(void *arg)
{
    fed_job_t *j = arg;
    fed_unlink_live(j);
    api_req_t *req = j->req;
    if (!req) {
        fed_job_free(j);
        return;
    }
    const char *ct = j->proto ? FED_CT_PROTO : FED_CT_TEXT;
    if (j->code != 200) {
        atomic_fetch_add(&j->f->n_refused, 1);
        api_reply_text(req, j->code, "%s\n", j->err);
        fed_job_free(j);
        return;
    }
    fed_render_piece(j);
    bool last = j->next >= j->n;
    const buf_t *w = fed_wire(j, last);
    if (!w) {
        api_reply_text(req, 503, "out of memory\n");
        fed_job_free(j);
        return;
    }
    if (j->gzip) {
        api_reply_header(req, "Content-Encoding", "gzip");
        api_reply_header(req, "Vary", "Accept-Encoding");
    }
    if (last) { /* all of it fits in one piece: a plain reply with its length */
        api_reply(req, 200, ct, w->data ? w->data : "", w->len);
        atomic_fetch_add(&j->f->n_series, j->n);
        fed_job_free(j);
        return;
    }
    j->sending = true;
    api_reply_stream_start(req, 200, ct, fed_client_gone, j);
    if (api_reply_stream_chunk(req, w->data, w->len, fed_drained, j) < 0) {
        fed_job_free(j);
        api_reply_stream_end(req);
    }
}

/* ---- reading (reader threads) ------------------------------------------------------------- */

static int fed_fail(fed_job_t *j, int code, const char *msg)
{
    j->code = code;
    snprintf(j->err, sizeof(j->err), "%s", msg);
    return -1;
}

/* Why the arena said no: this request's limit, the shared one, or the system. */
static int fed_fail_memory(fed_job_t *j)
{
    char msg[256];
    if (atomic_load(&j->budget.refused)) {
        snprintf(msg, sizeof(msg), "federation would use more than %zu bytes of memory (--query.max-memory-per-query)",
                 j->budget.limit);
        return fed_fail(j, 422, msg);
    }
    if (j->budget.parent && atomic_load(&j->budget.parent->refused) != j->shared_refused0) {
        snprintf(msg, sizeof(msg),
                 "the queries running now hold all of the query memory budget (%zu bytes, --query.max-memory); try "
                 "again later",
                 j->budget.parent->limit);
        return fed_fail(j, 503, msg);
    }
    return fed_fail(j, 503, "out of memory");
}

/* Copies s's labels and (t, v) into the job. 0 or -1 (job failed). */
static int fed_keep(fed_job_t *j, const querier_series_t *s, int64_t t, double v)
{
    api_federate_t *f = j->f;
    if (j->n >= (size_t)f->opt.max_series) {
        char msg[256];
        snprintf(msg, sizeof(msg), "federation would hold more than %lld series (--query.max-samples)",
                 (long long)f->opt.max_series);
        return fed_fail(j, 422, msg);
    }
    if (j->n == j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 64;
        fed_entry_t *nv = arena_try_alloc(j->arena, cap * sizeof(*nv));
        if (!nv)
            return fed_fail_memory(j);
        if (j->n)
            memcpy(nv, j->ents, j->n * sizeof(*nv));
        j->ents = nv;
        j->cap = cap;
    }
    size_t need = (s->labels.n ? s->labels.n : 1) * sizeof(label_t);
    for (size_t k = 0; k < s->labels.n; k++)
        need += strlen(s->labels.v[k].name) + strlen(s->labels.v[k].value) + 2;
    char *mem = arena_try_alloc(j->arena, need);
    if (!mem)
        return fed_fail_memory(j);
    fed_entry_t *e = &j->ents[j->n];
    e->ls.v = (label_t *)mem;
    e->ls.n = s->labels.n;
    e->name = NULL;
    char *p = mem + (s->labels.n ? s->labels.n : 1) * sizeof(label_t);
    for (size_t k = 0; k < s->labels.n; k++) {
        size_t nl = strlen(s->labels.v[k].name) + 1, vl = strlen(s->labels.v[k].value) + 1;
        memcpy(p, s->labels.v[k].name, nl);
        e->ls.v[k].name = p;
        p += nl;
        memcpy(p, s->labels.v[k].value, vl);
        e->ls.v[k].value = p;
        p += vl;
        if (strcmp(e->ls.v[k].name, "__name__") == 0 && e->ls.v[k].value[0])
            e->name = e->ls.v[k].value;
    }
    if (!e->name) /* nameless series are never federated (Prometheus logs and skips them) */
        return 0;
    e->t = t;
    e->v = v;
    j->n++;
    return 0;
}

static int fed_entry_cmp(const void *a, const void *b)
{
    const fed_entry_t *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : labels_compare(&x->ls, &y->ls);
}

static void fed_read(fed_job_t *j)
{
    api_federate_t *f = j->f;
    querier_t *q = storage_querier(f->opt.storage);
    if (!q) {
        fed_fail(j, 503, "out of memory");
        return;
    }
    querier_hints_t hints = {.start_ms = j->mint, .end_ms = j->maxt};
    size_t seen = 0;
    for (size_t i = 0; i < j->nsels && !j->code; i++) {
        if (j->sels[i].n == 0) /* `{}`: no matcher selects nothing (Prometheus' Select), not everything */
            continue;
        querier_set_t *set =
            querier_select(q, (const matcher_t *const *)j->sels[i].ms, j->sels[i].n, j->mint, j->maxt, &hints);
        if (!set) {
            fed_fail(j, 503, "out of memory");
            break;
        }
        const querier_series_t *s;
        while (!j->code && (s = querier_set_next(set)) != NULL) {
            if (++seen % FED_CHECK_EVERY == 0) {
                if (j->cancel)
                    fed_fail(j, 503, "federation was canceled");
                else if (clock_mono_ns() > j->deadline_ns)
                    fed_fail(j, 503, "federation timed out (--query.timeout)");
                if (j->code)
                    break;
            }
            /* the last sample in [mint, maxt]; roll-up buckets are not samples anyone scraped */
            querier_iter_t it;
            querier_iter_init(&it, s, s->rollup_until > j->mint ? s->rollup_until : j->mint, j->maxt);
            int64_t t, lt = 0;
            double v, lv = 0;
            bool any = false;
            while (querier_iter_next(&it, &t, &v)) {
                lt = t, lv = v;
                any = true;
            }
            uint64_t bits;
            memcpy(&bits, &lv, sizeof(bits));
            /* the exposition formats cannot carry a staleness marker: such a series is left out */
            if (!any || bits == FED_STALE_BITS)
                continue;
            fed_keep(j, s, lt, lv);
        }
        if (!j->code && querier_set_error(set)) {
            char msg[400];
            snprintf(msg, sizeof(msg), "%s", querier_set_error(set));
            fed_fail(j, 500, msg);
        }
        querier_set_free(set);
    }
    querier_close(q);
    if (j->code)
        return;
    /* Prometheus sorts by metric name only; label order within a name makes the answer stable */
    if (j->n > 1)
        qsort(j->ents, j->n, sizeof(*j->ents), fed_entry_cmp);
    if (j->nsels > 1 && j->n > 1) { /* the union: a series several match[] select, once */
        size_t w = 1;
        for (size_t r = 1; r < j->n; r++)
            if (!labels_equal(&j->ents[r].ls, &j->ents[w - 1].ls))
                j->ents[w++] = j->ents[r];
        j->n = w;
    }
    j->code = 200;
}

static void *fed_thread(void *arg)
{
    api_federate_t *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        while (!f->stop && !f->head)
            pthread_cond_wait(&f->cv, &f->mu);
        if (!f->head) {
            pthread_mutex_unlock(&f->mu);
            return NULL;
        }
        fed_job_t *j = f->head;
        f->head = j->qnext;
        if (!f->head)
            f->tail = NULL;
        j->qnext = NULL;
        pthread_mutex_unlock(&f->mu);

        if (j->cancel)
            fed_fail(j, 503, "federation was canceled");
        else if (clock_mono_ns() > j->deadline_ns)
            fed_fail(j, 503, "federation timed out in the queue (--query.timeout)");
        else
            fed_read(j);
        if (api_server_run_on(f->opt.srv, j->worker, fed_job_ready, j) != 0) {
            log_warn("federate", "cannot hand a result back to its worker; dropping it");
            fed_unlink_live(j);
            fed_job_free(j);
        }
    }
}

/* ---- handler -------------------------------------------------------------------------------- */

/* Prometheus' expfmt.Negotiate: the delimited protobuf when Accept asks for it, else text. */
static bool fed_wants_proto(api_req_t *req)
{
    const char *a = api_req_header(req, "Accept");
    return a && strstr(a, "application/vnd.google.protobuf") && strstr(a, "io.prometheus.client.MetricFamily") &&
           strstr(a, "encoding=delimited");
}

/* A job for match[] v[0..n) read at now_ms: selectors parsed, memory budget set. NULL with the
 * status (400, 503) and message in *code/err. */
static fed_job_t *fed_job_new(api_federate_t *f, const char *const *v, size_t n, bool proto, int64_t now_ms, int *code,
                              char *err, size_t errlen)
{
    fed_job_t *j = calloc(1, sizeof(*j));
    if (j) {
        j->sels = calloc(n ? n : 1, sizeof(*j->sels));
        j->arena = arena_create(0);
    }
    if (!j || !j->sels || !j->arena) {
        if (j) {
            free(j->sels);
            arena_destroy(j->arena);
        }
        free(j);
        *code = 503;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    j->f = f;
    j->proto = proto;
    for (size_t i = 0; i < n; i++) {
        if (promql_parse_selector(v[i], &j->sels[i], err, errlen) != 0) {
            *code = 400;
            fed_job_free(j);
            return NULL;
        }
        j->nsels++;
    }
    j->budget = (arena_budget_t){.limit = f->opt.max_memory, .parent = f->opt.budget};
    j->shared_refused0 = f->opt.budget ? atomic_load(&f->opt.budget->refused) : 0;
    if (arena_set_budget(j->arena, &j->budget, NULL, NULL) != 0) {
        *code = 503;
        snprintf(err, errlen, "the queries running now hold all of the query memory budget; try again later");
        fed_job_free(j);
        return NULL;
    }
    j->maxt = now_ms;
    j->mint = now_ms - f->opt.lookback_ms;
    j->deadline_ns = clock_mono_ns() + f->opt.timeout_ms * 1000000;
    return j;
}

int api_federate_render(api_federate_t *f, const char *const *match, size_t n, int64_t now_ms, bool proto, buf_t *out,
                        char *err, size_t errlen)
{
    int code = 200;
    fed_job_t *j = fed_job_new(f, match, n, proto, now_ms, &code, err, errlen);
    if (!j)
        return code;
    fed_read(j);
    if (j->code != 200) {
        code = j->code;
        snprintf(err, errlen, "%s", j->err);
    } else {
        while (j->next < j->n) { /* every piece, one after the other */
            buf_reset(&j->out);
            fed_render_piece(j);
            buf_append(out, j->out.data, j->out.len);
        }
    }
    fed_job_free(j);
    return code;
}

static void fed_handler(api_req_t *req, void *ud)
{
    api_federate_t *f = ud;
    atomic_fetch_add(&f->n_requests, 1);
    const char **v;
    size_t n = api_req_params(req, "match[]", &v);
    bool proto = fed_wants_proto(req);
    if (n == 0) { /* Prometheus 2.42 answers an empty exposition, not an error */
        api_reply(req, 200, proto ? FED_CT_PROTO : FED_CT_TEXT, "", 0);
        return;
    }
    int code;
    char err[512];
    fed_job_t *j = fed_job_new(f, v, n, proto, clock_wall_ms(), &code, err, sizeof(err));
    if (!j) {
        atomic_fetch_add(&f->n_refused, 1);
        api_reply_text(req, code, "%s\n", err);
        return;
    }
    const char *ae = api_req_header(req, "Accept-Encoding");
    j->gzip = ae && strstr(ae, "gzip"); /* as Prometheus' compression handler: Prometheus scrapes ask for it */
    j->req = req;
    j->worker = req->worker;
    api_req_park(req, fed_client_gone, j);
    pthread_mutex_lock(&f->mu);
    j->live_next = f->live;
    if (f->live)
        f->live->live_prev = j;
    f->live = j;
    if (f->tail)
        f->tail->qnext = j;
    else
        f->head = j;
    f->tail = j;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static void fed_on_shutdown(void *ud)
{
    api_federate_t *f = ud;
    pthread_mutex_lock(&f->mu);
    for (fed_job_t *j = f->live; j; j = j->live_next)
        j->cancel = 1;
    pthread_mutex_unlock(&f->mu);
}

/* --external-label's "name=value" lines (forward.c checks them the same way), plus instance=""
 * unless one names instance: Prometheus always counts instance among the external labels. */
static int fed_parse_external(api_federate_t *f, const char *list, char *err, size_t errlen)
{
    size_t n = 2;
    for (const char *p = list ? list : ""; *p; p++)
        n += *p == '\n';
    f->ext.v = calloc(n, sizeof(label_t));
    f->ext_strs = strdup(list ? list : "");
    if (!f->ext.v || !f->ext_strs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    bool instance = false;
    for (char *save = NULL, *tok = strtok_r(f->ext_strs, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || !labels_valid_name(tok, (size_t)(eq - tok))) {
            snprintf(err, errlen, "--external-label must be name=value with a valid label name (got \"%s\")", tok);
            return -1;
        }
        *eq = 0;
        char *val = eq + 1;
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = 0;
            val++;
        }
        for (size_t i = 0; i < f->ext.n; i++)
            if (strcmp(f->ext.v[i].name, tok) == 0) {
                snprintf(err, errlen, "--external-label %s given twice", tok);
                return -1;
            }
        instance = instance || strcmp(tok, "instance") == 0;
        f->ext.v[f->ext.n++] = (label_t){tok, val};
    }
    if (!instance)
        f->ext.v[f->ext.n++] = (label_t){"instance", ""};
    labels_sort(&f->ext);
    return 0;
}

api_federate_t *api_federate_new(const api_federate_options_t *o, char *err, size_t errlen)
{
    api_federate_t *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->opt = *o;
    if (f->opt.lookback_ms <= 0)
        f->opt.lookback_ms = 5 * 60 * 1000;
    if (f->opt.timeout_ms <= 0)
        f->opt.timeout_ms = 2 * 60 * 1000;
    if (f->opt.max_series <= 0)
        f->opt.max_series = 50000000;
    int n = o->threads > 0 ? o->threads : 2;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->threads = calloc((size_t)n, sizeof(*f->threads));
    if (!f->threads) {
        snprintf(err, errlen, "out of memory");
        api_federate_free(f);
        return NULL;
    }
    if (fed_parse_external(f, o->external_labels, err, errlen) != 0) {
        api_federate_free(f);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (pthread_create(&f->threads[i], NULL, fed_thread, f) != 0) {
            snprintf(err, errlen, "cannot start federation threads");
            api_federate_free(f);
            return NULL;
        }
        f->nthreads++;
    }
    if (o->srv)
        api_server_on_shutdown(o->srv, fed_on_shutdown, f);
    return f;
}

static void fed_metrics(void *ud, buf_t *b)
{
    api_federate_t *f = ud;
    buf_printf(b,
               "# HELP sluice_federate_requests_total Requests to /federate.\n"
               "# TYPE sluice_federate_requests_total counter\nsluice_federate_requests_total %lu\n"
               "# HELP sluice_federate_series_total Series sent by /federate.\n"
               "# TYPE sluice_federate_series_total counter\nsluice_federate_series_total %lu\n"
               "# HELP sluice_federate_refused_total /federate requests answered with an error.\n"
               "# TYPE sluice_federate_refused_total counter\nsluice_federate_refused_total %lu\n",
               (unsigned long)atomic_load(&f->n_requests), (unsigned long)atomic_load(&f->n_series),
               (unsigned long)atomic_load(&f->n_refused));
}

void api_federate_register_routes(api_federate_t *f, api_server_t *srv)
{
    api_route_add(srv, API_GET | API_POST, "/federate", "federate", fed_handler, f);
    metrics_register("federate", fed_metrics, f);
}

void api_federate_free(api_federate_t *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    for (fed_job_t *j = f->live; j; j = j->live_next)
        j->cancel = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < f->nthreads; i++)
        pthread_join(f->threads[i], NULL);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f->threads);
    free(f->ext.v);
    free(f->ext_strs);
    free(f);
}
