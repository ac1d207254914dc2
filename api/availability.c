/*
 * api/availability — heartbeat accounting wired into the daemon; see availability.h.
 *
 * Locks: `mu` guards the heartbeat (the push path takes it, under the registry's lock, for one
 * O(1) update per push); `db_mu` guards the SQLite handle and is always taken before `mu` when
 * both are needed, so gap events are written in the order they happened (the tick and a reader
 * that flushes first both take them under db_mu). Storage appends happen with neither held.
 *
 * availability.db:
 *   gaps(job, grp, start_ms, end_ms NULL = open, reason)   grp '' = the job's own gap, else the
 *                                                            group's labels {a="b",...}
 *   jobs(job PRIMARY KEY, first_seen_ms)                    the start of a job's observed time
 *   expected_jobs(job PRIMARY KEY, interval_ms, updated_by, updated_at_ms)   declared by the API
 *   meta(k PRIMARY KEY, v)                                  alive_ms: last tick (crash recovery)
 */
#include "api/availability.h"

#include <errno.h>
#include <stdarg.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/router.h"
#include "internal/control/control.h"
#include "internal/push/heartbeat.h"
#include "internal/util/arena.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"
#include "internal/util/parse.h"

#define AV_TICK_MS 1000
#define AV_RECENT_GAPS 20
#define AV_MAX_RANGE_MS (3660LL * 24 * 3600 * 1000) /* ten years */
#define AV_MAX_EXPECTED 10000
#define AV_MAX_BODY 65536

struct api_avail {
    api_avail_options_t o;
    api_control_t *control; /* set by register_routes; NULL = no expected-jobs endpoints */
    char *expected_file;
    heartbeat_t *hb;
    pthread_mutex_t mu;
    sqlite3 *db;
    pthread_mutex_t db_mu;
    /* declarations: from the file (replaced on reload) and from the API (mirrors expected_jobs);
     * guarded by db_mu */
    char **file_jobs;
    int64_t *file_iv;
    int nfile;
    /* series written last time (for staleness markers); tick thread only */
    arena_t *prev_arena;
    uint64_t *prev_hash;
    labels_t *prev_labels;
    size_t nprev;
    int64_t last_series_ms;
    /* thread */
    pthread_t thread;
    bool started, stop;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
};

static int64_t av_now(const api_avail_t *av)
{
    return av->o.clock_ms ? av->o.clock_ms() : clock_wall_ms();
}

/* ---- SQLite ---------------------------------------------------------------------------------- */

static const char av_schema[] =
    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS gaps(id INTEGER PRIMARY KEY, job TEXT NOT NULL, grp TEXT NOT NULL,"
    " start_ms INTEGER NOT NULL, end_ms INTEGER, reason TEXT);"
    "CREATE INDEX IF NOT EXISTS gaps_job ON gaps(job, grp, start_ms);"
    "CREATE TABLE IF NOT EXISTS jobs(job TEXT PRIMARY KEY, first_seen_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS expected_jobs(job TEXT PRIMARY KEY, interval_ms INTEGER NOT NULL,"
    " updated_by TEXT NOT NULL, updated_at_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL);";

static int av_exec(api_avail_t *av, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(av->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "availability.db: %s", msg ? msg : sqlite3_errmsg(av->db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* BEGIN/COMMIT around a batch of writes: a failure is logged (the rows are retried or lost with
 * the transaction; nothing else can be done about it here). */
static void av_exec_logged(api_avail_t *av, const char *sql)
{
    char err[512];
    if (av_exec(av, sql, err, sizeof(err)) != 0)
        log_error("availability", "statement failed", LF_S("sql", sql), LF_S("err", err));
}

/* Runs one statement with integer/text parameters: fmt letters 'i' (int64_t) and 's' (const
 * char *). 0 or -1 (logged). db_mu held. */
static int av_run(api_avail_t *av, const char *sql, const char *fmt, ...)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(av->db, sql, -1, &st, NULL) != SQLITE_OK) {
        log_error("availability", "cannot prepare a statement", LF_S("err", sqlite3_errmsg(av->db)));
        return -1;
    }
    va_list ap;
    va_start(ap, fmt);
    for (int i = 0; fmt[i]; i++) {
        if (fmt[i] == 'i')
            sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
        else
            sqlite3_bind_text(st, i + 1, va_arg(ap, const char *), -1, SQLITE_TRANSIENT);
    }
    va_end(ap);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        log_error("availability", "cannot write availability.db", LF_S("err", sqlite3_errmsg(av->db)));
        return -1;
    }
    return 0;
}

/* Writes the heartbeat's queued gap events (db_mu held; takes mu briefly). */
static void av_flush_events_locked(api_avail_t *av)
{
    heartbeat_event_t *ev;
    pthread_mutex_lock(&av->mu);
    size_t n = heartbeat_take_events(av->hb, &ev);
    pthread_mutex_unlock(&av->mu);
    if (!n) {
        heartbeat_events_free(ev, n);
        return;
    }
    av_exec_logged(av, "BEGIN");
    for (size_t i = 0; i < n; i++) {
        heartbeat_event_t *e = &ev[i];
        if (e->kind == HEARTBEAT_GAP_OPEN) {
            av_run(av, "INSERT INTO gaps(job, grp, start_ms) VALUES(?, ?, ?)", "ssi", e->job, e->group, e->start_ms);
            log_info("availability", "gap opened", LF_S("job", e->job), LF_S("group", e->group),
                     LF_I("start_ms", e->start_ms));
            continue;
        }
        av_run(av,
               "UPDATE gaps SET end_ms = ?, reason = ? WHERE job = ? AND grp = ? AND start_ms = ? AND end_ms IS NULL",
               "isssi", e->end_ms, e->reason, e->job, e->group, e->start_ms);
        if (sqlite3_changes(av->db) == 0)
            av_run(av, "INSERT INTO gaps(job, grp, start_ms, end_ms, reason) VALUES(?, ?, ?, ?, ?)", "ssiis", e->job,
                   e->group, e->start_ms, e->end_ms, e->reason);
        log_info("availability", "gap closed", LF_S("job", e->job), LF_S("group", e->group),
                 LF_F("seconds", (double)(e->end_ms - e->start_ms) / 1000.0), LF_S("reason", e->reason));
    }
    av_exec_logged(av, "COMMIT");
    heartbeat_events_free(ev, n);
}

/* ---- expected jobs ------------------------------------------------------------------------------ */

void api_avail_free_expected(char **jobs, int64_t *intervals, int n)
{
    for (int i = 0; i < n; i++)
        free(jobs[i]);
    free(jobs);
    free(intervals);
}

int api_avail_parse_expected(const char *text, char ***jobs_out, int64_t **iv_out, char *err, size_t errlen)
{
    char **jobs = NULL;
    int64_t *iv = NULL;
    int n = 0, cap = 0, lineno = 0;
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        lineno++;
        char *line = strndup(p, len);
        p += len + (eol ? 1 : 0);
        if (!line)
            goto oom;
        char *s = line, *e = line + strlen(line);
        while (*s == ' ' || *s == '\t')
            s++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            *--e = 0;
        if (!*s || *s == '#') {
            free(line);
            continue;
        }
        int64_t interval = 0;
        char *opt = strstr(s, " interval=");
        if (!opt)
            opt = strstr(s, "\tinterval=");
        if (opt) {
            const char *d = opt + strlen(" interval=");
            if (parse_duration_ms(d, &interval) != 0 || interval <= 0) {
                snprintf(err, errlen, "line %d: interval \"%s\" is not a positive duration like 10s", lineno, d);
                free(line);
                goto fail;
            }
            *opt = 0;
            e = opt;
            while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
                *--e = 0;
        }
        char verr[256];
        if (control_job_name_valid(s, strlen(s), verr, sizeof(verr)) != 0) {
            snprintf(err, errlen, "line %d: %s", lineno, verr);
            free(line);
            goto fail;
        }
        if (n >= AV_MAX_EXPECTED) {
            snprintf(err, errlen, "line %d: more than %d expected jobs", lineno, AV_MAX_EXPECTED);
            free(line);
            goto fail;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nj = realloc(jobs, (size_t)cap * sizeof(*nj));
            if (nj)
                jobs = nj;
            int64_t *ni = realloc(iv, (size_t)cap * sizeof(*ni));
            if (ni)
                iv = ni;
            if (!nj || !ni) {
                free(line);
                goto oom;
            }
        }
        jobs[n] = strdup(s);
        iv[n] = interval;
        free(line);
        if (!jobs[n])
            goto oom;
        n++;
    }
    *jobs_out = jobs;
    *iv_out = iv;
    return n;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    api_avail_free_expected(jobs, iv, n);
    return -1;
}

static int av_read_file(const char *path, char ***jobs, int64_t **iv, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open expected-jobs file %s: %s", path, strerror(errno));
        return -1;
    }
    buf_t b = BUF_INIT;
    char chunk[4096];
    size_t k;
    while ((k = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        buf_append(&b, chunk, k);
        if (b.len > (4u << 20)) {
            fclose(f);
            buf_free(&b);
            snprintf(err, errlen, "expected-jobs file %s is larger than 4 MiB", path);
            return -1;
        }
    }
    fclose(f);
    buf_putc(&b, 0);
    char perr[384];
    int n = api_avail_parse_expected(b.data, jobs, iv, perr, sizeof(perr));
    buf_free(&b);
    if (n < 0)
        snprintf(err, errlen, "expected-jobs file %s: %s", path, perr);
    return n;
}

/* Hands the union of file and API declarations to the heartbeat (API intervals win). db_mu
 * held. 0 or -1. */
static int av_apply_expected_locked(api_avail_t *av)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(av->db, "SELECT job, interval_ms FROM expected_jobs", -1, &st, NULL) != SQLITE_OK)
        return -1;
    size_t cap = (size_t)av->nfile + 16, n = 0;
    heartbeat_expect_t *list = malloc(cap * sizeof(*list));
    char **owned = malloc(cap * sizeof(*owned));
    size_t nowned = 0;
    int rc = list && owned ? 0 : -1;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        if (n == cap) {
            cap *= 2;
            heartbeat_expect_t *nl = realloc(list, cap * sizeof(*nl));
            char **no = nl ? realloc(owned, cap * sizeof(*no)) : NULL;
            if (nl)
                list = nl;
            if (no)
                owned = no;
            if (!nl || !no) {
                rc = -1;
                break;
            }
        }
        char *job = strdup((const char *)sqlite3_column_text(st, 0));
        if (!job) {
            rc = -1;
            break;
        }
        owned[nowned++] = job;
        list[n++] = (heartbeat_expect_t){.job = job, .interval_ms = sqlite3_column_int64(st, 1)};
    }
    sqlite3_finalize(st);
    size_t napi = n;
    for (int i = 0; rc == 0 && i < av->nfile; i++) {
        bool dup = false;
        for (size_t k = 0; k < napi && !dup; k++)
            if (strcmp(list[k].job, av->file_jobs[i]) == 0) {
                dup = true;
                if (list[k].interval_ms == 0)
                    list[k].interval_ms = av->file_iv[i];
            }
        if (dup)
            continue;
        if (n == cap) {
            cap *= 2;
            heartbeat_expect_t *nl = realloc(list, cap * sizeof(*nl));
            if (!nl) {
                rc = -1;
                break;
            }
            list = nl;
        }
        list[n++] = (heartbeat_expect_t){.job = av->file_jobs[i], .interval_ms = av->file_iv[i]};
    }
    if (rc == 0) {
        pthread_mutex_lock(&av->mu);
        rc = heartbeat_set_expected(av->hb, list, n, av_now(av));
        pthread_mutex_unlock(&av->mu);
    }
    for (size_t i = 0; i < nowned; i++)
        free(owned[i]);
    free(owned);
    free(list);
    return rc;
}

int api_avail_reload(void *ud, buf_t *errs)
{
    api_avail_t *av = ud;
    if (!av->expected_file)
        return 0;
    char **jobs;
    int64_t *iv;
    char err[512];
    int n = av_read_file(av->expected_file, &jobs, &iv, err, sizeof(err));
    if (n < 0) {
        log_error("availability", "expected-jobs reload failed; the previous declarations stay", LF_S("err", err));
        buf_printf(errs, "%s\n", err);
        return 1;
    }
    pthread_mutex_lock(&av->db_mu);
    api_avail_free_expected(av->file_jobs, av->file_iv, av->nfile);
    av->file_jobs = jobs;
    av->file_iv = iv;
    av->nfile = n;
    int rc = av_apply_expected_locked(av);
    pthread_mutex_unlock(&av->db_mu);
    if (rc != 0) {
        buf_printf(errs, "expected jobs: out of memory\n");
        return 1;
    }
    log_info("availability", "expected jobs reloaded", LF_S("file", av->expected_file), LF_I("jobs", n));
    return 0;
}

/* ---- series ------------------------------------------------------------------------------------ */

typedef struct {
    arena_t *a;
    storage_sample_t *v;
    size_t n, cap;
    int64_t t;
} av_out_t;

/* Room for one more sample; false on OOM (then that sample is skipped). */
static bool av_out_room(av_out_t *o)
{
    if (o->n < o->cap)
        return true;
    size_t cap = o->cap ? o->cap * 2 : 64;
    storage_sample_t *nv = realloc(o->v, cap * sizeof(*nv));
    if (!nv)
        return false;
    o->v = nv;
    o->cap = cap;
    return true;
}

static void av_out_add(av_out_t *o, const char *name, const labels_t *base, const char *job, double v)
{
    if (!av_out_room(o))
        return;
    size_t nl = (base ? base->n : 0) + 2;
    label_t *ls = arena_alloc(o->a, nl * sizeof(label_t));
    size_t k = 0;
    ls[k++] = (label_t){LABEL_METRIC_NAME, arena_strdup(o->a, name)};
    for (size_t i = 0; base && i < base->n; i++)
        ls[k++] = (label_t){arena_strdup(o->a, base->v[i].name), arena_strdup(o->a, base->v[i].value)};
    if (job)
        ls[k++] = (label_t){"job", arena_strdup(o->a, job)};
    labels_t l = {ls, k};
    labels_sort(&l);
    o->v[o->n++] = (storage_sample_t){.labels = l, .t = o->t, .v = v};
}

/* A staleness marker for a series written last round (its labels are copied into this round's
 * arena: last round's goes away). */
static void av_out_add_copy(av_out_t *o, const labels_t *full, double v)
{
    if (!av_out_room(o))
        return;
    label_t *ls = arena_alloc(o->a, (full->n ? full->n : 1) * sizeof(label_t));
    for (size_t i = 0; i < full->n; i++)
        ls[i] = (label_t){arena_strdup(o->a, full->v[i].name), arena_strdup(o->a, full->v[i].value)};
    o->v[o->n++] = (storage_sample_t){.labels = {ls, full->n}, .t = o->t, .v = v};
}

static void av_group_series(const heartbeat_group_view_t *g, void *ud)
{
    av_out_t *o = ud;
    av_out_add(o, "sluice_push_expected_total", g->labels, NULL, g->expected);
    av_out_add(o, "sluice_push_received_total", g->labels, NULL, g->received);
    av_out_add(o, "sluice_push_last_seconds", g->labels, NULL, (double)g->last_ms / 1000.0);
    if (g->interval_ms > 0)
        av_out_add(o, "sluice_push_interval_seconds", g->labels, NULL, (double)g->interval_ms / 1000.0);
}

static void av_job_series(const heartbeat_job_view_t *j, void *ud)
{
    av_out_t *o = ud;
    av_out_add(o, "sluice_job_push_expected_total", NULL, j->job, j->expected);
    av_out_add(o, "sluice_job_push_received_total", NULL, j->job, j->received);
    if (j->last_ms)
        av_out_add(o, "sluice_job_push_last_seconds", NULL, j->job, (double)j->last_ms / 1000.0);
    av_out_add(o, "sluice_job_push_interval_seconds", NULL, j->job, (double)j->interval_ms / 1000.0);
    /* declared jobs always; others while they push (a job nobody declared that stops is not
     * "missing": its series ends) */
    if (j->expected_job || j->up)
        av_out_add(o, "sluice_job_up", NULL, j->job, j->up ? 1 : 0);
}

static int av_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double av_stale_nan(void)
{
    uint64_t bits = 0x7ff0000000000002ULL;
    double d;
    memcpy(&d, &bits, sizeof(d));
    return d;
}

/* Builds this round's samples (under mu), adds staleness markers for series gone since the last
 * round, and appends them (no lock held). */
static void av_write_series(api_avail_t *av, int64_t now)
{
    av_out_t o = {.a = arena_create(0), .t = now - now % 1000};
    if (!o.a)
        return;
    pthread_mutex_lock(&av->mu);
    heartbeat_each_group(av->hb, now, av_group_series, &o);
    heartbeat_each_job(av->hb, now, av_job_series, &o);
    pthread_mutex_unlock(&av->mu);
    size_t nreal = o.n;
    uint64_t *hs = malloc((nreal ? nreal : 1) * sizeof(*hs));
    labels_t *ls = malloc((nreal ? nreal : 1) * sizeof(*ls));
    if (!hs || !ls) {
        free(hs);
        free(ls);
        free(o.v);
        arena_destroy(o.a);
        return;
    }
    for (size_t i = 0; i < nreal; i++) {
        hs[i] = labels_hash(&o.v[i].labels);
        ls[i] = o.v[i].labels;
    }
    uint64_t *sorted = malloc((nreal ? nreal : 1) * sizeof(*sorted));
    if (sorted) {
        memcpy(sorted, hs, nreal * sizeof(*hs));
        qsort(sorted, nreal, sizeof(*sorted), av_cmp_u64);
        for (size_t i = 0; i < av->nprev; i++)
            if (!bsearch(&av->prev_hash[i], sorted, nreal, sizeof(*sorted), av_cmp_u64)) {
                av_out_add_copy(&o, &av->prev_labels[i], av_stale_nan());
            }
        free(sorted);
    }
    if (o.n && av->o.storage) {
        storage_append_result_t res;
        if (storage_append(av->o.storage, o.v, o.n, &res) != STORAGE_OK)
            log_warn("availability", "heartbeat series not fully stored", LF_I("failed", (int64_t)res.failed),
                     LF_S("err", res.msg));
    }
    /* keep this round's labels (in o.a) for the next round's staleness markers */
    arena_destroy(av->prev_arena);
    free(av->prev_hash);
    free(av->prev_labels);
    av->prev_arena = o.a;
    av->prev_hash = hs;
    av->prev_labels = ls;
    av->nprev = nreal;
    free(o.v);
}

static void av_persist_jobs(const heartbeat_job_view_t *j, void *ud)
{
    api_avail_t *av = ud;
    av_run(av, "INSERT OR IGNORE INTO jobs(job, first_seen_ms) VALUES(?, ?)", "si", j->job, j->first_ms);
}

/* ---- the tick thread ---------------------------------------------------------------------------- */

static void av_tick(api_avail_t *av)
{
    int64_t now = av_now(av);
    pthread_mutex_lock(&av->db_mu);
    pthread_mutex_lock(&av->mu);
    heartbeat_tick(av->hb, now);
    pthread_mutex_unlock(&av->mu);
    av_flush_events_locked(av);
    bool series = now - av->last_series_ms >= av->o.series_interval_ms;
    if (series) {
        av_exec_logged(av, "BEGIN");
        pthread_mutex_lock(&av->mu);
        heartbeat_each_job(av->hb, now, av_persist_jobs, av);
        pthread_mutex_unlock(&av->mu);
        av_run(av, "INSERT OR REPLACE INTO meta(k, v) VALUES('alive_ms', ?)", "i", now);
        av_exec_logged(av, "COMMIT");
    }
    pthread_mutex_unlock(&av->db_mu);
    if (series && (!av->o.storage || storage_ready(av->o.storage))) {
        av->last_series_ms = now;
        av_write_series(av, now);
    }
}

static void *av_main(void *arg)
{
    api_avail_t *av = arg;
    pthread_mutex_lock(&av->stop_mu);
    while (!av->stop) {
        struct timespec ts = clock_deadline_ms(CLOCK_REALTIME, AV_TICK_MS);
        pthread_cond_timedwait(&av->stop_cv, &av->stop_mu, &ts);
        if (av->stop)
            break;
        pthread_mutex_unlock(&av->stop_mu);
        av_tick(av);
        pthread_mutex_lock(&av->stop_mu);
    }
    pthread_mutex_unlock(&av->stop_mu);
    return NULL;
}

/* ---- push hook --------------------------------------------------------------------------------- */

void api_avail_on_beat(void *ud, const push_beat_t *b)
{
    api_avail_t *av = ud;
    pthread_mutex_lock(&av->mu);
    if (b->gone)
        heartbeat_group_gone(av->hb, b->key, b->hash, b->now_ms);
    else if (heartbeat_push(av->hb, b->key, b->hash, b->grouping, b->jobs, b->njobs, b->now_ms) != 0)
        log_warn("availability", "out of memory: a heartbeat was not counted");
    pthread_mutex_unlock(&av->mu);
}

/* ---- GET /api/v1/availability ---------------------------------------------------------------------- */

static void av_put_time(buf_t *b, int64_t ms)
{
    buf_printf(b, "%.3f", (double)ms / 1000.0);
}

/* Appends one job's availability object. db_mu held (events flushed). Returns false if the job
 * is unknown (nothing appended). */
static bool av_job_json(api_avail_t *av, const char *job, int64_t now, int64_t range_ms, size_t nrecent, buf_t *b)
{
    heartbeat_job_view_t v;
    pthread_mutex_lock(&av->mu);
    bool live = heartbeat_job(av->hb, job, now, &v);
    pthread_mutex_unlock(&av->mu);
    int64_t first = live ? v.first_ms : 0;
    sqlite3_stmt *st = NULL;
    bool known = live;
    if (sqlite3_prepare_v2(av->db, "SELECT first_seen_ms FROM jobs WHERE job = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            int64_t f = sqlite3_column_int64(st, 0);
            if (!first || f < first)
                first = f;
            known = true;
        }
        sqlite3_finalize(st);
    }
    if (!known)
        return false;
    int64_t start = now - range_ms;
    int64_t obs_start = first > start ? first : start;
    double observed = now > obs_start ? (double)(now - obs_start) : 0;
    /* every job-level gap overlapping the range, clipped to it */
    double total = 0, longest = 0;
    int64_t count = 0;
    buf_t recent = BUF_INIT;
    size_t nr = 0;
    if (sqlite3_prepare_v2(av->db,
                           "SELECT start_ms, end_ms, reason FROM gaps WHERE job = ? AND grp = '' AND start_ms < ?"
                           " AND (end_ms IS NULL OR end_ms > ?) ORDER BY start_ms DESC",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 2, now);
        sqlite3_bind_int64(st, 3, start);
        while (sqlite3_step(st) == SQLITE_ROW) {
            int64_t gs = sqlite3_column_int64(st, 0);
            bool open = sqlite3_column_type(st, 1) == SQLITE_NULL;
            int64_t ge = open ? now : sqlite3_column_int64(st, 1);
            int64_t cs = gs > obs_start ? gs : obs_start, ce = ge < now ? ge : now;
            double len = ce > cs ? (double)(ce - cs) : 0;
            total += len;
            if (len > longest)
                longest = len;
            count++;
            if (nr < nrecent) {
                buf_puts(&recent, nr ? ",{\"start\":" : "{\"start\":");
                av_put_time(&recent, gs);
                buf_puts(&recent, ",\"end\":");
                if (open)
                    buf_puts(&recent, "null");
                else
                    av_put_time(&recent, ge);
                buf_printf(&recent, ",\"seconds\":%.3f,\"open\":%s,\"end_reason\":", (double)(ge - gs) / 1000.0,
                           open ? "true" : "false");
                const char *r = (const char *)sqlite3_column_text(st, 2);
                if (r)
                    buf_put_json_string(&recent, r, strlen(r));
                else
                    buf_puts(&recent, "null");
                buf_putc(&recent, '}');
                nr++;
            }
        }
        sqlite3_finalize(st);
    }
    buf_puts(b, "{\"job\":");
    buf_put_json_string(b, job, strlen(job));
    buf_printf(b, ",\"range_seconds\":%.3f,\"start\":", (double)range_ms / 1000.0);
    av_put_time(b, start);
    buf_puts(b, ",\"end\":");
    av_put_time(b, now);
    buf_printf(b, ",\"observed_seconds\":%.3f,\"availability\":", observed / 1000.0);
    if (observed > 0)
        buf_printf(b, "%.6f", 100.0 * (1.0 - total / observed));
    else
        buf_puts(b, "null");
    buf_printf(b, ",\"gaps\":{\"count\":%lld,\"total_seconds\":%.3f,\"longest_seconds\":%.3f}", (long long)count,
               total / 1000.0, longest / 1000.0);
    buf_printf(b, ",\"expected\":%s,\"up\":", live && v.expected_job ? "true" : "false");
    buf_puts(b, live ? (v.up ? "true" : "false") : "null");
    buf_puts(b, ",\"in_gap\":");
    buf_puts(b, live && v.in_gap ? "true" : "false");
    buf_puts(b, ",\"last_push\":");
    if (live && v.last_ms)
        av_put_time(b, v.last_ms);
    else
        buf_puts(b, "null");
    buf_puts(b, ",\"interval_seconds\":");
    if (live)
        buf_printf(b, "%.3f", (double)v.interval_ms / 1000.0);
    else
        buf_puts(b, "null");
    buf_printf(b, ",\"groups\":%zu", live ? v.ngroups : 0);
    if (live) {
        buf_printf(b, ",\"heartbeats\":{\"expected\":%.3f,\"received\":%.3f}", v.expected, v.received);
    }
    buf_puts(b, ",\"recent_gaps\":[");
    if (recent.len)
        buf_append(b, recent.data, recent.len);
    buf_putc(b, ']');
    buf_free(&recent);
    /* gaps of single groups (a lost TaskManager while the job went on) */
    buf_puts(b, ",\"group_gaps\":[");
    if (sqlite3_prepare_v2(av->db,
                           "SELECT grp, start_ms, end_ms, reason FROM gaps WHERE job = ? AND grp != '' AND start_ms < ?"
                           " AND (end_ms IS NULL OR end_ms > ?) ORDER BY start_ms DESC LIMIT ?",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 2, now);
        sqlite3_bind_int64(st, 3, start);
        sqlite3_bind_int64(st, 4, (int64_t)nrecent);
        for (int k = 0; sqlite3_step(st) == SQLITE_ROW; k++) {
            const char *g = (const char *)sqlite3_column_text(st, 0);
            int64_t gs = sqlite3_column_int64(st, 1);
            bool open = sqlite3_column_type(st, 2) == SQLITE_NULL;
            int64_t ge = open ? now : sqlite3_column_int64(st, 2);
            buf_puts(b, k ? ",{\"group\":" : "{\"group\":");
            buf_put_json_string(b, g ? g : "", g ? strlen(g) : 0);
            buf_puts(b, ",\"start\":");
            av_put_time(b, gs);
            buf_puts(b, ",\"end\":");
            if (open)
                buf_puts(b, "null");
            else
                av_put_time(b, ge);
            buf_printf(b, ",\"seconds\":%.3f,\"open\":%s}", (double)(ge - gs) / 1000.0, open ? "true" : "false");
        }
        sqlite3_finalize(st);
    }
    buf_puts(b, "]}");
    return true;
}

typedef struct {
    char **v;
    size_t n, cap;
} av_names_t;

static void av_names_add(av_names_t *ns, const char *s)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], s) == 0)
            return;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? ns->cap * 2 : 16;
        char **nv = realloc(ns->v, cap * sizeof(*nv));
        if (!nv)
            return;
        ns->v = nv;
        ns->cap = cap;
    }
    char *d = strdup(s);
    if (d)
        ns->v[ns->n++] = d;
}

static void av_collect_job(const heartbeat_job_view_t *j, void *ud)
{
    av_names_add(ud, j->job);
}

static int av_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void av_h_availability(api_req_t *req, void *ud)
{
    api_avail_t *av = ud;
    const char *job = api_req_param(req, "job");
    const char *rs = api_req_param(req, "range");
    int64_t range_ms = 30LL * 24 * 3600 * 1000;
    if (rs && (parse_duration_or_seconds_ms(rs, &range_ms) != 0 || range_ms <= 0 || range_ms > AV_MAX_RANGE_MS)) {
        api_reply_prom_error(req, API_ERR_BAD_DATA,
                             "invalid parameter \"range\": want a positive duration like 30d or 24h (at most 10y), "
                             "got \"%s\"",
                             rs);
        return;
    }
    if (job && !job[0]) {
        api_reply_prom_error(req, API_ERR_BAD_DATA, "invalid parameter \"job\": empty job name");
        return;
    }
    int64_t now = av_now(av);
    buf_t b = BUF_INIT;
    pthread_mutex_lock(&av->db_mu);
    av_flush_events_locked(av);
    if (job) {
        bool ok = av_job_json(av, job, now, range_ms, AV_RECENT_GAPS, &b);
        pthread_mutex_unlock(&av->db_mu);
        if (!ok)
            api_reply_prom_error(req, API_ERR_NOT_FOUND, "unknown job \"%s\": it has neither pushed nor been declared",
                                 job);
        else
            api_reply_prom_success(req, b.data, b.len);
        buf_free(&b);
        return;
    }
    av_names_t ns = {0};
    pthread_mutex_lock(&av->mu);
    heartbeat_each_job(av->hb, now, av_collect_job, &ns);
    pthread_mutex_unlock(&av->mu);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(av->db, "SELECT job FROM jobs", -1, &st, NULL) == SQLITE_OK) {
        while (sqlite3_step(st) == SQLITE_ROW)
            av_names_add(&ns, (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    if (ns.n)
        qsort(ns.v, ns.n, sizeof(*ns.v), av_cmp_str);
    buf_puts(&b, "{\"jobs\":[");
    for (size_t i = 0, k = 0; i < ns.n; i++) {
        size_t mark = b.len;
        if (k)
            buf_putc(&b, ',');
        if (av_job_json(av, ns.v[i], now, range_ms, 5, &b))
            k++;
        else
            b.len = mark;
        free(ns.v[i]);
    }
    free(ns.v);
    pthread_mutex_unlock(&av->db_mu);
    buf_puts(&b, "]}");
    api_reply_prom_success(req, b.data, b.len);
    buf_free(&b);
}

/* ---- expected jobs through the control API ------------------------------------------------------------ */

static void av_reply_error(api_req_t *req, int code, const char *type, const char *field, const char *msg)
{
    buf_t b = BUF_INIT;
    buf_puts(&b, "{\"status\":\"error\",\"errorType\":");
    buf_put_json_string(&b, type, strlen(type));
    buf_puts(&b, ",\"error\":");
    buf_put_json_string(&b, msg, strlen(msg));
    if (field) {
        buf_puts(&b, ",\"field\":");
        buf_put_json_string(&b, field, strlen(field));
    }
    buf_putc(&b, '}');
    api_reply_header(req, "Cache-Control", "no-store");
    api_reply(req, code, "application/json", b.data, b.len);
    buf_free(&b);
}

/* One declaration as JSON (db_mu held): {"job":..,"expected":bool,"source":"api"|"file"|"api+file"|null,
 * "interval_seconds":..|null,"up":..,"last_push":..,"updated_by":..,"updated_at":..} */
static void av_expected_json(api_avail_t *av, const char *job, buf_t *b)
{
    int64_t api_iv = -1, file_iv = -1, at = 0;
    char *by = NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(av->db, "SELECT interval_ms, updated_by, updated_at_ms FROM expected_jobs WHERE job = ?", -1,
                           &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, job, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) == SQLITE_ROW) {
            api_iv = sqlite3_column_int64(st, 0);
            by = strdup((const char *)sqlite3_column_text(st, 1));
            at = sqlite3_column_int64(st, 2);
        }
        sqlite3_finalize(st);
    }
    for (int i = 0; i < av->nfile; i++)
        if (strcmp(av->file_jobs[i], job) == 0)
            file_iv = av->file_iv[i];
    bool expected = api_iv >= 0 || file_iv >= 0;
    heartbeat_job_view_t v;
    int64_t now = av_now(av);
    pthread_mutex_lock(&av->mu);
    bool live = heartbeat_job(av->hb, job, now, &v);
    pthread_mutex_unlock(&av->mu);
    buf_puts(b, "{\"job\":");
    buf_put_json_string(b, job, strlen(job));
    buf_printf(b, ",\"expected\":%s,\"source\":%s", expected ? "true" : "false",
               api_iv >= 0 && file_iv >= 0 ? "\"api+file\""
               : api_iv >= 0               ? "\"api\""
               : file_iv >= 0              ? "\"file\""
                                           : "null");
    int64_t conf = api_iv > 0 ? api_iv : file_iv > 0 ? file_iv : 0;
    buf_puts(b, ",\"interval\":");
    if (conf > 0) {
        char d[32];
        format_duration_ms(conf, d, sizeof(d));
        buf_put_json_string(b, d, strlen(d));
    } else {
        buf_puts(b, "null");
    }
    buf_puts(b, ",\"interval_seconds\":");
    if (live)
        buf_printf(b, "%.3f", (double)v.interval_ms / 1000.0);
    else
        buf_puts(b, "null");
    buf_puts(b, ",\"up\":");
    buf_puts(b, live ? (v.up ? "true" : "false") : "null");
    buf_puts(b, ",\"last_push\":");
    if (live && v.last_ms)
        av_put_time(b, v.last_ms);
    else
        buf_puts(b, "null");
    buf_puts(b, ",\"updated_by\":");
    if (by)
        buf_put_json_string(b, by, strlen(by));
    else
        buf_puts(b, "null");
    buf_puts(b, ",\"updated_at\":");
    if (at)
        av_put_time(b, at);
    else
        buf_puts(b, "null");
    buf_putc(b, '}');
    free(by);
}

static void av_reply_expected(api_avail_t *av, api_req_t *req, const char *job)
{
    buf_t b = BUF_INIT;
    pthread_mutex_lock(&av->db_mu);
    av_expected_json(av, job, &b);
    pthread_mutex_unlock(&av->db_mu);
    api_reply_header(req, "Cache-Control", "no-cache");
    api_reply(req, 200, "application/json", b.data, b.len);
    buf_free(&b);
}

/* Sets (expected) or removes a job's API declaration. 0 or -1. */
static int av_declare(api_avail_t *av, const char *job, bool expected, int64_t interval_ms, const char *who)
{
    pthread_mutex_lock(&av->db_mu);
    int rc = expected ? av_run(av,
                               "INSERT OR REPLACE INTO expected_jobs(job, interval_ms, updated_by, updated_at_ms)"
                               " VALUES(?, ?, ?, ?)",
                               "sisi", job, interval_ms, who, av_now(av))
                      : av_run(av, "DELETE FROM expected_jobs WHERE job = ?", "s", job);
    if (rc == 0)
        rc = av_apply_expected_locked(av);
    pthread_mutex_unlock(&av->db_mu);
    if (rc == 0)
        log_info("availability", expected ? "job declared expected" : "job no longer expected", LF_S("job", job),
                 LF_S("by", who), LF_I("interval_ms", interval_ms));
    return rc;
}

/* Parses {"expected": bool, "interval": "10s" | seconds | null, "reason": "..."}. 0 or -1 with
 * the offending field and message. */
static int av_parse_body(const char *body, size_t len, bool require_expected, bool *expected, int64_t *interval_ms,
                         const char **field, char *err, size_t errlen)
{
    *field = NULL;
    *expected = true;
    *interval_ms = 0;
    if (len > AV_MAX_BODY) {
        snprintf(err, errlen, "body larger than %d bytes", AV_MAX_BODY);
        return -1;
    }
    if (len == 0 && !require_expected)
        return 0;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        snprintf(err, errlen, "body must be a JSON object%s%s", o ? "" : ": ", o ? "" : je.text);
        json_decref(o);
        return -1;
    }
    const char *key;
    json_t *val;
    bool have_expected = false;
    json_object_foreach(o, key, val)
    {
        if (strcmp(key, "expected") == 0) {
            if (!json_is_boolean(val)) {
                *field = "expected";
                snprintf(err, errlen, "expected must be true or false");
                goto fail;
            }
            *expected = json_is_true(val);
            have_expected = true;
        } else if (strcmp(key, "interval") == 0) {
            if (json_is_null(val))
                continue;
            int64_t ms = -1;
            if (json_is_string(val)) {
                if (parse_duration_or_seconds_ms(json_string_value(val), &ms) != 0)
                    ms = -1;
            } else if (json_is_number(val)) {
                double s = json_number_value(val);
                ms = s > 0 && s < 1e9 ? (int64_t)llround(s * 1000) : -1;
            }
            if (ms < 1000 || ms > 24LL * 3600 * 1000) {
                *field = "interval";
                snprintf(err, errlen, "interval must be a duration between 1s and 24h, like \"10s\"");
                goto fail;
            }
            *interval_ms = ms;
        } else if (strcmp(key, "reason") == 0) {
            if (!json_is_string(val)) {
                *field = "reason";
                snprintf(err, errlen, "reason must be a string");
                goto fail;
            }
        } else {
            *field = key;
            snprintf(err, errlen,
                     "unknown field \"%s\" (expected-job changes take expected, interval and reason; flow-control "
                     "fields go in a separate request)",
                     key);
            goto fail;
        }
    }
    if (require_expected && !have_expected) {
        *field = "expected";
        snprintf(err, errlen, "expected is required");
        goto fail;
    }
    json_decref(o);
    return 0;
fail:
    if (*field) {
        /* the key points into o: copy it out before freeing */
        static _Thread_local char fbuf[64];
        snprintf(fbuf, sizeof(fbuf), "%s", *field);
        *field = fbuf;
    }
    json_decref(o);
    return -1;
}

/* Does the body name "expected" at the top level? (PUT /jobs/{job} serves both APIs.) */
static bool av_body_is_expected(const char *body, size_t len)
{
    if (!len || len > AV_MAX_BODY)
        return false;
    json_t *o = json_loadb(body, len, 0, NULL);
    bool yes = o && json_is_object(o) && json_object_get(o, "expected") != NULL;
    json_decref(o);
    return yes;
}

static bool av_job_hook(api_req_t *req, const char *job, const char *action, void *ud)
{
    api_avail_t *av = ud;
    size_t len;
    const char *body = (const char *)api_req_body(req, &len);
    bool sub = strcmp(action, "expected") == 0;
    if (!sub && !(action[0] == 0 && req->method == API_PUT && av_body_is_expected(body, len)))
        return false;
    char who[160];
    int m = req->method;
    if (sub && (m == API_GET || m == API_HEAD)) {
        if (api_control_authorize_read(av->control, req, who, sizeof(who)) != 0)
            return true;
        av_reply_expected(av, req, job);
        return true;
    }
    if (m != API_PUT && m != API_DELETE) {
        api_reply_header(req, "Allow", "GET, HEAD, PUT, DELETE");
        av_reply_error(req, 405, "method_not_allowed", NULL, "use GET, PUT or DELETE on a job's expected declaration");
        return true;
    }
    if (api_control_authorize_change(av->control, req, who, sizeof(who)) != 0)
        return true;
    bool expected = false;
    int64_t interval = 0;
    if (m == API_PUT) {
        const char *field;
        char err[256];
        if (av_parse_body(body, len, !sub, &expected, &interval, &field, err, sizeof(err)) != 0) {
            av_reply_error(req, 400, "bad_data", field, err);
            return true;
        }
    }
    if (av_declare(av, job, expected, interval, who) != 0) {
        av_reply_error(req, 503, "unavailable", NULL, "cannot store the declaration (see the log)");
        return true;
    }
    av_reply_expected(av, req, job);
    return true;
}

static void av_h_expected_list(api_req_t *req, void *ud)
{
    api_avail_t *av = ud;
    char who[160];
    if (api_control_authorize_read(av->control, req, who, sizeof(who)) != 0)
        return;
    av_names_t ns = {0};
    pthread_mutex_lock(&av->db_mu);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(av->db, "SELECT job FROM expected_jobs", -1, &st, NULL) == SQLITE_OK) {
        while (sqlite3_step(st) == SQLITE_ROW)
            av_names_add(&ns, (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    for (int i = 0; i < av->nfile; i++)
        av_names_add(&ns, av->file_jobs[i]);
    if (ns.n)
        qsort(ns.v, ns.n, sizeof(*ns.v), av_cmp_str);
    buf_t b = BUF_INIT;
    buf_puts(&b, "{\"jobs\":[");
    for (size_t i = 0; i < ns.n; i++) {
        if (i)
            buf_putc(&b, ',');
        av_expected_json(av, ns.v[i], &b);
        free(ns.v[i]);
    }
    pthread_mutex_unlock(&av->db_mu);
    free(ns.v);
    buf_puts(&b, "]}");
    api_reply_header(req, "Cache-Control", "no-cache");
    api_reply(req, 200, "application/json", b.data, b.len);
    buf_free(&b);
}

/* ---- lifecycle -------------------------------------------------------------------------------------- */

api_avail_t *api_avail_new(const api_avail_options_t *o, char *err, size_t errlen)
{
    api_avail_t *av = calloc(1, sizeof(*av));
    if (!av) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    av->o = *o;
    if (av->o.series_interval_ms <= 0)
        av->o.series_interval_ms = 10000;
    pthread_mutex_init(&av->mu, NULL);
    pthread_mutex_init(&av->db_mu, NULL);
    pthread_mutex_init(&av->stop_mu, NULL);
    pthread_cond_init(&av->stop_cv, NULL);
    av->expected_file = o->expected_file && o->expected_file[0] ? strdup(o->expected_file) : NULL;
    heartbeat_options_t ho = {.default_interval_ms = o->default_interval_ms, .missing_intervals = o->missing_intervals};
    int64_t now = av_now(av);
    av->hb = heartbeat_new(&ho, now);
    if (!av->hb) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/availability.db", o->storage_path);
    if (sqlite3_open_v2(path, &av->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "cannot open %s: %s", path, av->db ? sqlite3_errmsg(av->db) : "out of memory");
        goto fail;
    }
    sqlite3_busy_timeout(av->db, 5000);
    if (av_exec(av, av_schema, err, errlen) != 0)
        goto fail;
    /* gaps the last run left open end when it was last alive: sluice could not see past it */
    int64_t alive = 0;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(av->db, "SELECT v FROM meta WHERE k = 'alive_ms'", -1, &st, NULL) == SQLITE_OK) {
        if (sqlite3_step(st) == SQLITE_ROW)
            alive = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    av_run(av, "UPDATE gaps SET end_ms = MAX(start_ms, ?), reason = 'sluice stopped' WHERE end_ms IS NULL", "i", alive);
    if (av->expected_file) {
        int n = av_read_file(av->expected_file, &av->file_jobs, &av->file_iv, err, errlen);
        if (n < 0)
            goto fail;
        av->nfile = n;
    }
    if (av_apply_expected_locked(av) != 0) {
        snprintf(err, errlen, "cannot read the expected jobs: %s", sqlite3_errmsg(av->db));
        goto fail;
    }
    return av;
fail:
    api_avail_free(av);
    return NULL;
}

void api_avail_register_routes(api_avail_t *av, api_server_t *srv, api_control_t *ctl)
{
    api_route_add(srv, API_GET, "/api/v1/availability", "availability", av_h_availability, av);
    av->control = ctl;
    if (av->control) {
        api_route_add(srv, API_GET, "/api/v1/control/expected-jobs", "control_expected_jobs", av_h_expected_list, av);
        api_control_set_job_hook(av->control, av_job_hook, av);
    }
}

int api_avail_start(api_avail_t *av)
{
    if (pthread_create(&av->thread, NULL, av_main, av) != 0)
        return -1;
    av->started = true;
    return 0;
}

void api_avail_stop(api_avail_t *av)
{
    if (!av)
        return;
    if (av->started) {
        pthread_mutex_lock(&av->stop_mu);
        av->stop = true;
        pthread_cond_signal(&av->stop_cv);
        pthread_mutex_unlock(&av->stop_mu);
        pthread_join(av->thread, NULL);
        av->started = false;
    }
    if (av->db) {
        int64_t now = av_now(av);
        pthread_mutex_lock(&av->db_mu);
        av_flush_events_locked(av);
        av_run(av, "UPDATE gaps SET end_ms = MAX(start_ms, ?), reason = 'sluice stopped' WHERE end_ms IS NULL", "i",
               now);
        av_run(av, "INSERT OR REPLACE INTO meta(k, v) VALUES('alive_ms', ?)", "i", now);
        sqlite3_close(av->db);
        av->db = NULL;
        pthread_mutex_unlock(&av->db_mu);
    }
}

void api_avail_free(api_avail_t *av)
{
    if (!av)
        return;
    api_avail_stop(av);
    heartbeat_free(av->hb);
    api_avail_free_expected(av->file_jobs, av->file_iv, av->nfile);
    arena_destroy(av->prev_arena);
    free(av->prev_hash);
    free(av->prev_labels);
    free(av->expected_file);
    pthread_mutex_destroy(&av->mu);
    pthread_mutex_destroy(&av->db_mu);
    pthread_mutex_destroy(&av->stop_mu);
    pthread_cond_destroy(&av->stop_cv);
    free(av);
}
