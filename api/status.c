/*
 * status — health, readiness, build/runtime info and /metrics; see status.h.
 *
 * GET /metrics holds every pushed group (100+ MB for a few hundred TaskManagers), so it never
 * renders on the worker loop in one go:
 *
 *   worker loop                 render thread                      worker loop
 *   park the request ────────▶  metrics_render_begin: pins the ──▶ scrape_ready: render ~64 KiB,
 *                               push groups' batches, sorts every   send it; once it drained
 *                               series (the expensive part)         (scrape_drained) the next
 *
 * so the loop serves other requests (pushes, health checks) between pieces and a slow scraper
 * holds about one piece in memory. A reply that fits in one piece goes out as a plain one. The
 * job belongs to the render thread from the handler until api_server_run_on hands it back, then
 * to the request's worker, which frees it (dropping the pins) when the reply is done or the
 * client has gone. Every job is on st->live until freed, so api_status_free can free the ones
 * the stopped server never handed back.
 */
#include "api/status.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "api/router.h"
#include "internal/util/buildinfo.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "internal/util/parse.h"

#define STATUS_PIECE (64 * 1024) /* /metrics bytes rendered before they are handed to the connection */
#define STATUS_CT_TEXT "text/plain; version=0.0.4; charset=utf-8"

typedef struct status_scrape status_scrape_t;

struct api_status {
    api_status_options_t opt;
    _Atomic bool ready;
    _Atomic bool config_ok;
    _Atomic int64_t config_time; /* unix seconds of the last successful load */
    /* GET /metrics rendering */
    api_server_t *srv;
    pthread_t render_thread;
    bool render_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    status_scrape_t *head, *tail; /* waiting for the render thread */
    status_scrape_t *live;        /* every job not yet freed */
    bool stop;
};

struct status_scrape {
    api_status_t *st;
    api_req_t *req; /* NULL once the client has gone; worker loop only */
    int worker;
    atomic_bool gone;    /* the client left before the render began: skip it */
    metrics_render_t *h; /* NULL when the render could not begin */
    buf_t out;           /* the piece being sent */
    bool sending;        /* the stream has started: the worker owns the job */
    bool in_pump, again;
    status_scrape_t *qnext, *live_prev, *live_next;
};

api_status_t *api_status_new(const api_status_options_t *opt)
{
    api_status_t *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->opt = *opt;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    atomic_store(&st->config_ok, true);
    atomic_store(&st->config_time, (int64_t)time(NULL));
    return st;
}

static void scrape_free(status_scrape_t *j)
{
    api_status_t *st = j->st;
    pthread_mutex_lock(&st->mu);
    if (j->live_prev)
        j->live_prev->live_next = j->live_next;
    else
        st->live = j->live_next;
    if (j->live_next)
        j->live_next->live_prev = j->live_prev;
    pthread_mutex_unlock(&st->mu);
    metrics_render_end(j->h); /* drops the pins on the push groups */
    buf_free(&j->out);
    free(j);
}

void api_status_free(api_status_t *st)
{
    if (!st)
        return;
    if (st->render_started) {
        pthread_mutex_lock(&st->mu);
        st->stop = true;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->render_thread, NULL);
    }
    /* The server is gone: jobs it never handed back (queued, or posted to a stopped loop). */
    while (st->live)
        scrape_free(st->live);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st);
}

void api_status_set_ready(api_status_t *st, bool ready)
{
    atomic_store(&st->ready, ready);
}

bool api_status_ready(const api_status_t *st)
{
    return atomic_load(&st->ready);
}

void api_status_note_config_load(api_status_t *st, bool success)
{
    atomic_store(&st->config_ok, success);
    if (success)
        atomic_store(&st->config_time, (int64_t)time(NULL));
}

static void status_healthy(api_req_t *req, void *ud)
{
    api_reply_text(req, 200, "sluice is Healthy.\n");
}

static void status_ready_h(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    if (api_status_ready(st))
        api_reply_text(req, 200, "sluice is Ready.\n");
    else
        api_reply_text(req, 503, "Service Unavailable\n");
}

static void put_field(buf_t *b, const char *key, const char *val, bool comma)
{
    if (comma)
        buf_putc(b, ',');
    buf_put_json_string(b, key, strlen(key));
    buf_putc(b, ':');
    buf_put_json_string(b, val, strlen(val));
}

static void status_buildinfo(api_req_t *req, void *ud)
{
    buf_t b = BUF_INIT;
    buf_putc(&b, '{');
    put_field(&b, "version", SLUICE_VERSION, false);
    put_field(&b, "revision", SLUICE_REVISION, true);
    put_field(&b, "branch", SLUICE_BRANCH, true);
    put_field(&b, "buildUser", SLUICE_BUILD_USER, true);
    put_field(&b, "buildDate", SLUICE_BUILD_DATE, true);
    put_field(&b, "goVersion", SLUICE_COMPILER, true);
    buf_putc(&b, '}');
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

static void status_flags(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    const char *j = st->opt.flags_json ? st->opt.flags_json : "{}";
    api_reply_prom_success(req, j, strlen(j));
}

static void rfc3339(double t, char *out, size_t cap)
{
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (int)((t - (double)s) * 1000));
}

static void status_runtimeinfo(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    buf_t b = BUF_INIT;
    char tmp[64], cwd[4096];
    rfc3339(metrics_process_start_time(), tmp, sizeof(tmp));
    buf_putc(&b, '{');
    put_field(&b, "startTime", tmp, false);
    put_field(&b, "CWD", getcwd(cwd, sizeof(cwd)) ? cwd : "", true);
    buf_printf(&b, ",\"reloadConfigSuccess\":%s", atomic_load(&st->config_ok) ? "true" : "false");
    rfc3339((double)atomic_load(&st->config_time), tmp, sizeof(tmp));
    put_field(&b, "lastConfigTime", tmp, true);
    buf_printf(&b, ",\"corruptionCount\":0,\"goroutineCount\":0,\"GOMAXPROCS\":%ld", sysconf(_SC_NPROCESSORS_ONLN));
    put_field(&b, "GOGC", "", true);
    put_field(&b, "GODEBUG", "", true);
    format_duration_ms(st->opt.retention_raw_ms, tmp, sizeof(tmp));
    put_field(&b, "storageRetention", tmp, true);
    buf_putc(&b, '}');
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

/* ---- GET /metrics ---------------------------------------------------------------------------- */

/* Worker loop: the client closed the connection (while parked or mid-stream). */
static void scrape_gone(api_req_t *req, void *ud)
{
    (void)req;
    status_scrape_t *j = ud;
    j->req = NULL;
    atomic_store(&j->gone, true);
    if (j->sending) /* mid-stream: the job is this loop's to free; else the render thread has it */
        scrape_free(j);
}

static void scrape_pump(status_scrape_t *j);

static void scrape_drained(api_req_t *req, void *ud)
{
    (void)req;
    status_scrape_t *j = ud;
    if (j->in_pump) {
        j->again = true;
        return;
    }
    scrape_pump(j);
}

/* Worker loop: renders the next piece and hands it to the connection; ends after the last. */
static void scrape_pump(status_scrape_t *j)
{
    j->in_pump = true;
    do {
        j->again = false;
        buf_reset(&j->out);
        bool more = metrics_render_next(j->h, &j->out, STATUS_PIECE);
        api_req_t *req = j->req;
        if (!more) {
            if (j->out.len && api_reply_stream_chunk(req, j->out.data, j->out.len, NULL, NULL) < 0)
                log_debug("status", "scraper went away before the last piece of /metrics");
            scrape_free(j);
            api_reply_stream_end(req);
            return;
        }
        if (api_reply_stream_chunk(req, j->out.data, j->out.len, scrape_drained, j) < 0) {
            scrape_free(j);
            api_reply_stream_end(req);
            return;
        }
    } while (j->again);
    j->in_pump = false;
}

/* Worker loop: the render thread has prepared the job. */
static void scrape_ready(void *arg)
{
    status_scrape_t *j = arg;
    api_req_t *req = j->req;
    if (!req) {
        scrape_free(j);
        return;
    }
    if (!j->h) {
        api_reply_text(req, 503, "out of memory\n");
        scrape_free(j);
        return;
    }
    bool more = metrics_render_next(j->h, &j->out, STATUS_PIECE);
    if (!more) { /* all of it fits in one piece: a plain reply with its length */
        api_reply(req, 200, STATUS_CT_TEXT, j->out.data ? j->out.data : "", j->out.len);
        scrape_free(j);
        return;
    }
    j->sending = true;
    api_reply_stream_start(req, 200, STATUS_CT_TEXT, scrape_gone, j);
    if (api_reply_stream_chunk(req, j->out.data, j->out.len, scrape_drained, j) < 0) {
        scrape_free(j);
        api_reply_stream_end(req);
    }
}

/* The render thread sorts every pushed series of every scrape (~0.3 s of CPU at 600k series);
 * nothing but the scraper waits for it, while pushes and control changes wait for the workers it
 * would take a core from. At nice 5 it gets about a quarter of a busy core (all of an idle one):
 * a scrape then takes longer on a saturated machine, far within Prometheus' 10 s timeout. */
#define STATUS_RENDER_NICE 5

static void *status_render_main(void *arg)
{
    api_status_t *st = arg;
    pthread_setname_np(pthread_self(), "metrics-render");
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), STATUS_RENDER_NICE) != 0)
        log_debug("status", "cannot lower the /metrics render thread's priority; it runs at normal priority");
    for (;;) {
        pthread_mutex_lock(&st->mu);
        while (!st->stop && !st->head)
            pthread_cond_wait(&st->cv, &st->mu);
        if (st->stop) { /* the server has stopped: api_status_free frees what is left */
            pthread_mutex_unlock(&st->mu);
            return NULL;
        }
        status_scrape_t *j = st->head;
        st->head = j->qnext;
        if (!st->head)
            st->tail = NULL;
        j->qnext = NULL;
        pthread_mutex_unlock(&st->mu);

        if (!atomic_load(&j->gone))
            j->h = metrics_render_begin();
        /* On failure (the loops are stopping, or no memory) the job stays on st->live for
         * api_status_free: its parked request may still call scrape_gone until then. */
        if (api_server_run_on(st->srv, j->worker, scrape_ready, j) != 0)
            log_warn("status", "cannot hand a /metrics render back to its worker");
    }
}

/* GET /metrics is the Pushgateway's: every pushed group, then sluice's own metrics. */
static void status_metrics(api_req_t *req, void *ud)
{
    api_status_t *st = ud;
    status_scrape_t *j = st->render_started ? calloc(1, sizeof(*j)) : NULL;
    if (!j) { /* no render thread (or no memory for the job): render here, as a whole */
        buf_t b = BUF_INIT;
        metrics_write_all(&b);
        api_reply(req, 200, STATUS_CT_TEXT, b.data, b.len);
        buf_free(&b);
        return;
    }
    j->st = st;
    j->req = req;
    j->worker = req->worker;
    api_req_park(req, scrape_gone, j);
    pthread_mutex_lock(&st->mu);
    j->live_next = st->live;
    if (st->live)
        st->live->live_prev = j;
    st->live = j;
    if (st->tail)
        st->tail->qnext = j;
    else
        st->head = j;
    st->tail = j;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

/* GET /-/metrics: sluice's own alone, for scraping sluice itself without the pushed data. */
static void status_metrics_self(api_req_t *req, void *ud)
{
    buf_t b = BUF_INIT;
    metrics_write_self(&b);
    api_reply(req, 200, STATUS_CT_TEXT, b.data, b.len);
    buf_free(&b);
}

void api_status_register_routes(api_status_t *st, api_server_t *srv)
{
    st->srv = srv;
    if (pthread_create(&st->render_thread, NULL, status_render_main, st) == 0)
        st->render_started = true;
    else
        log_warn("status", "cannot start the /metrics render thread; GET /metrics renders on the workers");
    api_route_add(srv, API_GET, "/-/healthy", "healthy", status_healthy, st);
    api_route_add(srv, API_GET, "/-/ready", "ready", status_ready_h, st);
    api_route_add(srv, API_GET | API_POST, "/api/v1/status/buildinfo", "buildinfo", status_buildinfo, st);
    api_route_add(srv, API_GET, "/api/v1/status/flags", "flags", status_flags, st);
    api_route_add(srv, API_GET, "/api/v1/status/runtimeinfo", "runtimeinfo", status_runtimeinfo, st);
    api_route_add(srv, API_GET, "/metrics", "metrics", status_metrics, st);
    api_route_add(srv, API_GET, "/-/metrics", "metrics_self", status_metrics_self, st);
}
