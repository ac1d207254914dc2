/*
 * heartbeat — heartbeat and gap accounting per push group and per job; see heartbeat.h.
 *
 *   heartbeat ── groups (hash of the grouping key -> hb_group_t*, and a vector for iteration)
 *             └─ jobs   (hash of the name -> hb_job_t*, and a vector)
 *   a group points at the jobs it reports for; a job counts its groups (nref) so that it can be
 *   forgotten when the last one leaves.
 *
 * A push is one lookup of the group and one of each of its jobs only when the job list changed
 * (else the group's job pointers are reused): O(jobs of the group), never per series.
 */
#include "internal/push/heartbeat.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "internal/util/buf.h"
#include "internal/util/hashmap.h"

typedef struct hb_job {
    char *name;
    uint64_t hash;
    size_t idx;       /* in hb->jobs */
    size_t nref;      /* groups reporting for it */
    int64_t last_ms;  /* last push, or the clock origin of a declared job that never pushed */
    bool pushed;      /* last_ms is a real push */
    int64_t first_ms; /* known since */
    double e, r;      /* settled counters (intervals) */
    double e_shown, r_shown;
    bool in_gap;
    int64_t gap_start_ms;
    bool expected;
    int64_t conf_interval_ms;      /* declared interval; 0 = none */
    int64_t min_group_interval_ms; /* smallest learned interval of its groups (refreshed by tick) */
    bool mark;                     /* heartbeat_set_expected scratch */
} hb_job_t;

typedef struct hb_group {
    char *key;
    uint64_t hash;
    size_t idx;
    labels_t labels;
    char *strings;     /* the label names and values */
    char *labels_text; /* {a="b",...} for gap records */
    hb_job_t **jobs;
    size_t njobs;
    int64_t last_ms;
    int64_t learned_ms; /* smoothed interval, 0 = unknown */
    uint64_t e, r;      /* settled counters (pushes) */
    double e_shown;
    bool in_gap;
    int64_t gap_start_ms;
} hb_group_t;

struct heartbeat {
    heartbeat_options_t o;
    int64_t start_ms;
    hashmap_t gmap, jmap;
    hb_group_t **groups;
    size_t ngroups, gcap;
    hb_job_t **jobs;
    size_t njobs, jcap;
    heartbeat_event_t *ev;
    size_t nev, evcap;
};

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t hb_hash(const char *s)
{
    return XXH3_64bits(s, strlen(s));
}

static bool hb_group_eq(uint64_t val, const void *key)
{
    return strcmp(((const hb_group_t *)(uintptr_t)val)->key, key) == 0;
}

static bool hb_job_eq(uint64_t val, const void *name)
{
    return strcmp(((const hb_job_t *)(uintptr_t)val)->name, name) == 0;
}

static hb_group_t *hb_group_find(heartbeat_t *hb, const char *key, uint64_t hash)
{
    uint64_t *v = hashmap_find(&hb->gmap, hash, hb_group_eq, key);
    return v ? (hb_group_t *)(uintptr_t)*v : NULL;
}

static hb_job_t *hb_job_find(heartbeat_t *hb, const char *name)
{
    uint64_t *v = hashmap_find(&hb->jmap, hb_hash(name), hb_job_eq, name);
    return v ? (hb_job_t *)(uintptr_t)*v : NULL;
}

static int hb_grow(void **arr, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, nc * size);
    if (!p)
        return -1;
    *arr = p;
    *cap = nc;
    return 0;
}

/* Queues an event; on OOM the event is lost (logged by nobody: the counters still hold). */
static void hb_event(heartbeat_t *hb, heartbeat_event_kind_t kind, const char *job, const char *group, int64_t start,
                     int64_t end, const char *reason)
{
    if (hb_grow((void **)&hb->ev, &hb->evcap, hb->nev, sizeof(*hb->ev)) != 0)
        return;
    heartbeat_event_t *e = &hb->ev[hb->nev];
    e->job = strdup(job);
    e->group = strdup(group ? group : "");
    if (!e->job || !e->group) {
        free(e->job);
        free(e->group);
        return;
    }
    e->kind = kind;
    e->start_ms = start;
    e->end_ms = end;
    e->reason = reason;
    hb->nev++;
}

static int64_t hb_group_interval(const heartbeat_t *hb, const hb_group_t *g)
{
    for (size_t i = 0; i < g->njobs; i++)
        if (g->jobs[i]->conf_interval_ms > 0)
            return g->jobs[i]->conf_interval_ms;
    if (hb->o.default_interval_ms > 0)
        return hb->o.default_interval_ms;
    return g->learned_ms;
}

static int64_t hb_job_interval(const heartbeat_t *hb, const hb_job_t *j)
{
    if (j->conf_interval_ms > 0)
        return j->conf_interval_ms;
    if (hb->o.default_interval_ms > 0)
        return hb->o.default_interval_ms;
    if (j->min_group_interval_ms > 0)
        return j->min_group_interval_ms;
    return HEARTBEAT_FALLBACK_INTERVAL_MS;
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static hb_job_t *hb_job_get(heartbeat_t *hb, const char *name, int64_t now_ms)
{
    hb_job_t *j = hb_job_find(hb, name);
    if (j)
        return j;
    if (hb_grow((void **)&hb->jobs, &hb->jcap, hb->njobs, sizeof(*hb->jobs)) != 0)
        return NULL;
    j = calloc(1, sizeof(*j));
    if (!j || !(j->name = strdup(name))) {
        free(j);
        return NULL;
    }
    j->hash = hb_hash(name);
    if (hashmap_add(&hb->jmap, j->hash, (uintptr_t)j) != 0) {
        free(j->name);
        free(j);
        return NULL;
    }
    j->first_ms = now_ms;
    j->last_ms = now_ms;
    j->idx = hb->njobs;
    hb->jobs[hb->njobs++] = j;
    return j;
}

static void hb_job_free(heartbeat_t *hb, hb_job_t *j)
{
    hashmap_del_pair(&hb->jmap, j->hash, (uintptr_t)j);
    hb->jobs[j->idx] = hb->jobs[--hb->njobs];
    hb->jobs[j->idx]->idx = j->idx;
    free(j->name);
    free(j);
}

/* Ends a job the caller no longer needs: not expected and no group reports for it. */
static void hb_job_forget_if_unused(heartbeat_t *hb, hb_job_t *j, int64_t now_ms)
{
    if (j->nref || j->expected)
        return;
    if (j->in_gap)
        hb_event(hb, HEARTBEAT_GAP_CLOSE, j->name, "", j->gap_start_ms, now_ms, "gone");
    hb_job_free(hb, j);
}

/* The job's counters as of now (see heartbeat.h); the values shown never go down. */
static void hb_job_counters(const heartbeat_t *hb, hb_job_t *j, int64_t now_ms, double *e, double *r)
{
    double iv = (double)hb_job_interval(hb, j);
    double el = now_ms > j->last_ms ? (double)(now_ms - j->last_ms) : 0;
    double ee = j->e + el / iv;
    double rr = j->r + (j->pushed ? (el < iv ? el : iv) / iv : 0);
    if (ee < j->e_shown)
        ee = j->e_shown;
    if (rr < j->r_shown)
        rr = j->r_shown;
    j->e_shown = ee;
    j->r_shown = rr;
    *e = ee;
    *r = rr;
}

/* A push of one of the job's groups. */
static void hb_job_beat(heartbeat_t *hb, hb_job_t *j, int64_t now_ms)
{
    double e, r;
    hb_job_counters(hb, j, now_ms, &e, &r); /* what was shown up to now: the floor of what follows */
    double iv = (double)hb_job_interval(hb, j);
    double el = now_ms > j->last_ms ? (double)(now_ms - j->last_ms) : 0;
    bool gap = j->in_gap || el > HEARTBEAT_GAP_INTERVALS * iv;
    j->e += el / iv;
    j->r += gap ? 1 : el / iv; /* a gap's intervals were expected only; the push itself came */
    if (j->e < e)
        j->e = e;
    if (j->r < r)
        j->r = r;
    if (j->r > j->e)
        j->e = j->r;
    j->e_shown = j->e;
    j->r_shown = j->r;
    if (j->in_gap) {
        hb_event(hb, HEARTBEAT_GAP_CLOSE, j->name, "", j->gap_start_ms, now_ms, "push");
    } else if (gap) { /* over before a tick saw it: record it whole */
        int64_t start = j->last_ms + (int64_t)iv;
        hb_event(hb, HEARTBEAT_GAP_OPEN, j->name, "", start, 0, NULL);
        hb_event(hb, HEARTBEAT_GAP_CLOSE, j->name, "", start, now_ms, "push");
    }
    j->in_gap = false;
    j->last_ms = now_ms;
    j->pushed = true;
}

static bool hb_job_up(const heartbeat_t *hb, const hb_job_t *j, int64_t now_ms)
{
    uint32_t n = hb->o.missing_intervals ? hb->o.missing_intervals : 3;
    return (double)(now_ms - j->last_ms) <= (double)n * (double)hb_job_interval(hb, j);
}

/* ---- groups ---------------------------------------------------------------------------------- */

static void hb_group_counters(const heartbeat_t *hb, hb_group_t *g, int64_t now_ms, double *e, double *r)
{
    int64_t iv = hb_group_interval(hb, g);
    double ee = (double)g->e;
    if (g->in_gap && iv > 0 && now_ms > g->last_ms)
        ee += floor((double)(now_ms - g->last_ms) / (double)iv);
    if (ee < g->e_shown)
        ee = g->e_shown;
    g->e_shown = ee;
    *e = ee;
    *r = (double)g->r;
}

static char *hb_labels_text(const labels_t *ls)
{
    buf_t b = BUF_INIT;
    buf_putc(&b, '{');
    for (size_t i = 0; i < ls->n; i++) {
        if (i)
            buf_putc(&b, ',');
        buf_puts(&b, ls->v[i].name);
        buf_puts(&b, "=\"");
        for (const char *c = ls->v[i].value; *c; c++) {
            if (*c == '"' || *c == '\\')
                buf_putc(&b, '\\');
            buf_putc(&b, *c);
        }
        buf_putc(&b, '"');
    }
    buf_putc(&b, '}');
    buf_putc(&b, 0);
    return b.data;
}

static void hb_group_gap_event(heartbeat_t *hb, hb_group_t *g, heartbeat_event_kind_t kind, int64_t start, int64_t end,
                               const char *reason)
{
    for (size_t i = 0; i < g->njobs; i++)
        hb_event(hb, kind, g->jobs[i]->name, g->labels_text, start, end, reason);
}

/* Points g at the jobs named (refs on the new jobs are taken before the old ones are dropped, so
 * a job that stays is never forgotten in between). -1 on OOM with g unchanged. */
static int hb_group_set_jobs(heartbeat_t *hb, hb_group_t *g, const char *const *names, size_t n, int64_t now_ms)
{
    if (n > HEARTBEAT_MAX_JOBS_PER_GROUP)
        n = HEARTBEAT_MAX_JOBS_PER_GROUP;
    hb_job_t **nj = calloc(n ? n : 1, sizeof(*nj));
    if (!nj)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool dup = !names[i] || !names[i][0];
        for (size_t m = 0; m < k && !dup; m++)
            dup = strcmp(nj[m]->name, names[i]) == 0;
        if (dup)
            continue;
        hb_job_t *j = hb_job_get(hb, names[i], now_ms);
        if (!j) {
            for (size_t m = 0; m < k; m++) {
                nj[m]->nref--;
                hb_job_forget_if_unused(hb, nj[m], now_ms);
            }
            free(nj);
            return -1;
        }
        j->nref++;
        nj[k++] = j;
    }
    hb_job_t **old = g->jobs;
    size_t nold = g->njobs;
    g->jobs = nj;
    g->njobs = k;
    for (size_t i = 0; i < nold; i++) {
        assert(old[i]->nref > 0);
        old[i]->nref--;
        hb_job_forget_if_unused(hb, old[i], now_ms);
    }
    free(old);
    return 0;
}

/* Whether names (as a group's push reports them) are what g points at already. */
static bool hb_group_jobs_same(const hb_group_t *g, const char *const *names, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k <= g->njobs; i++) {
        if (!names[i] || !names[i][0])
            continue;
        if (k == g->njobs || strcmp(g->jobs[k]->name, names[i]) != 0)
            return false;
        k++;
        if (k == HEARTBEAT_MAX_JOBS_PER_GROUP)
            break;
    }
    return k == g->njobs;
}

static hb_group_t *hb_group_new(heartbeat_t *hb, const char *key, uint64_t hash, const labels_t *grouping)
{
    if (hb_grow((void **)&hb->groups, &hb->gcap, hb->ngroups, sizeof(*hb->groups)) != 0)
        return NULL;
    hb_group_t *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    size_t bytes = 1 + labels_strings_size(grouping);
    g->key = strdup(key);
    g->labels.v = calloc(grouping->n ? grouping->n : 1, sizeof(label_t));
    g->strings = malloc(bytes);
    if (!g->key || !g->labels.v || !g->strings)
        goto fail;
    labels_pack(grouping, g->labels.v, g->strings);
    g->labels.n = grouping->n;
    labels_sort(&g->labels);
    g->labels_text = hb_labels_text(&g->labels);
    if (!g->labels_text || hashmap_add(&hb->gmap, hash, (uintptr_t)g) != 0)
        goto fail;
    g->hash = hash;
    g->idx = hb->ngroups;
    hb->groups[hb->ngroups++] = g;
    return g;
fail:
    free(g->strings);
    free(g->labels_text);
    free(g->labels.v);
    free(g->key);
    free(g);
    return NULL;
}

static void hb_group_free(heartbeat_t *hb, hb_group_t *g, int64_t now_ms)
{
    hashmap_del_pair(&hb->gmap, g->hash, (uintptr_t)g);
    hb->groups[g->idx] = hb->groups[--hb->ngroups];
    hb->groups[g->idx]->idx = g->idx;
    for (size_t i = 0; i < g->njobs; i++) {
        assert(g->jobs[i]->nref > 0);
        g->jobs[i]->nref--;
        hb_job_forget_if_unused(hb, g->jobs[i], now_ms);
    }
    free(g->jobs);
    free(g->strings);
    free(g->labels.v);
    free(g->labels_text);
    free(g->key);
    free(g);
}

/* ---- public ---------------------------------------------------------------------------------- */

heartbeat_t *heartbeat_new(const heartbeat_options_t *o, int64_t now_ms)
{
    heartbeat_t *hb = calloc(1, sizeof(*hb));
    if (!hb)
        return NULL;
    hb->o = *o;
    if (!hb->o.missing_intervals)
        hb->o.missing_intervals = 3;
    if (hb->o.default_interval_ms > 0 && hb->o.default_interval_ms < HEARTBEAT_MIN_INTERVAL_MS)
        hb->o.default_interval_ms = HEARTBEAT_MIN_INTERVAL_MS;
    hb->start_ms = now_ms;
    hashmap_init(&hb->gmap, NULL, HASHMAP_HASHED_KEYS);
    hashmap_init(&hb->jmap, NULL, HASHMAP_HASHED_KEYS);
    return hb;
}

void heartbeat_free(heartbeat_t *hb)
{
    if (!hb)
        return;
    while (hb->ngroups)
        hb_group_free(hb, hb->groups[hb->ngroups - 1], 0);
    while (hb->njobs)
        hb_job_free(hb, hb->jobs[hb->njobs - 1]);
    heartbeat_events_free(hb->ev, hb->nev);
    hashmap_free(&hb->gmap);
    hashmap_free(&hb->jmap);
    free(hb->groups);
    free(hb->jobs);
    free(hb);
}

int heartbeat_push(heartbeat_t *hb, const char *key, uint64_t hash, const labels_t *grouping, const char *const *jobs,
                   size_t njobs, int64_t now_ms)
{
    hb_group_t *g = hb_group_find(hb, key, hash);
    bool fresh = false;
    if (!g) {
        if (!(g = hb_group_new(hb, key, hash, grouping)))
            return -1;
        fresh = true;
    }
    if (!hb_group_jobs_same(g, jobs, njobs) && hb_group_set_jobs(hb, g, jobs, njobs, now_ms) != 0) {
        if (fresh)
            hb_group_free(hb, g, now_ms);
        return -1;
    }
    if (fresh) {
        g->e = g->r = 1;
        g->e_shown = 1;
    } else {
        double e, r;
        hb_group_counters(hb, g, now_ms, &e, &r);
        int64_t iv = hb_group_interval(hb, g);
        int64_t el = now_ms > g->last_ms ? now_ms - g->last_ms : 0;
        bool gap = g->in_gap || (iv > 0 && (double)el > HEARTBEAT_GAP_INTERVALS * (double)iv);
        uint64_t n = 1;
        if (gap) {
            double k = floor((double)el / (double)iv + 0.5);
            n = k > 1 ? (uint64_t)k : 1;
        }
        g->e += n;
        if ((double)g->e < e)
            g->e = (uint64_t)e;
        g->r++;
        g->e_shown = (double)g->e;
        if (!gap) {
            /* learn the cadence from ordinary intervals only: a gap is not the cadence */
            double l = g->learned_ms > 0 ? 0.7 * (double)g->learned_ms + 0.3 * (double)el : (double)el;
            g->learned_ms = l < HEARTBEAT_MIN_INTERVAL_MS ? HEARTBEAT_MIN_INTERVAL_MS : (int64_t)l;
        }
        if (g->in_gap) {
            hb_group_gap_event(hb, g, HEARTBEAT_GAP_CLOSE, g->gap_start_ms, now_ms, "push");
        } else if (gap) {
            hb_group_gap_event(hb, g, HEARTBEAT_GAP_OPEN, g->last_ms + iv, 0, NULL);
            hb_group_gap_event(hb, g, HEARTBEAT_GAP_CLOSE, g->last_ms + iv, now_ms, "push");
        }
        g->in_gap = false;
    }
    g->last_ms = now_ms;
    for (size_t i = 0; i < g->njobs; i++) {
        hb_job_t *j = g->jobs[i];
        if (g->learned_ms > 0 && (j->min_group_interval_ms == 0 || g->learned_ms < j->min_group_interval_ms))
            j->min_group_interval_ms = g->learned_ms;
        hb_job_beat(hb, j, now_ms);
    }
    return 0;
}

void heartbeat_group_gone(heartbeat_t *hb, const char *key, uint64_t hash, int64_t now_ms)
{
    hb_group_t *g = hb_group_find(hb, key, hash);
    if (!g)
        return;
    if (g->in_gap)
        hb_group_gap_event(hb, g, HEARTBEAT_GAP_CLOSE, g->gap_start_ms, now_ms, "gone");
    hb_group_free(hb, g, now_ms);
}

int heartbeat_set_expected(heartbeat_t *hb, const heartbeat_expect_t *jobs, size_t n, int64_t now_ms)
{
    for (size_t i = 0; i < hb->njobs; i++)
        hb->jobs[i]->mark = false;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        hb_job_t *j = hb_job_get(hb, jobs[i].job, now_ms);
        if (!j) {
            rc = -1;
            continue;
        }
        if (!j->expected && !j->pushed) {
            /* declared now and not seen since start-up: its clock starts now (or at start-up) */
            j->last_ms = now_ms > hb->start_ms ? now_ms : hb->start_ms;
            j->first_ms = j->last_ms;
        }
        j->expected = true;
        j->conf_interval_ms = jobs[i].interval_ms > 0 && jobs[i].interval_ms < HEARTBEAT_MIN_INTERVAL_MS
                                  ? HEARTBEAT_MIN_INTERVAL_MS
                                  : jobs[i].interval_ms;
        j->mark = true;
    }
    if (rc != 0)
        return rc; /* keep every old declaration rather than drop one by mistake */
    for (size_t i = hb->njobs; i-- > 0;) {
        hb_job_t *j = hb->jobs[i];
        if (j->mark || !j->expected)
            continue;
        j->expected = false;
        j->conf_interval_ms = 0;
        hb_job_forget_if_unused(hb, j, now_ms);
    }
    return 0;
}

void heartbeat_tick(heartbeat_t *hb, int64_t now_ms)
{
    for (size_t i = 0; i < hb->njobs; i++)
        hb->jobs[i]->min_group_interval_ms = 0;
    for (size_t i = 0; i < hb->ngroups; i++) {
        hb_group_t *g = hb->groups[i];
        int64_t iv = hb_group_interval(hb, g);
        for (size_t k = 0; k < g->njobs; k++) {
            hb_job_t *j = g->jobs[k];
            if (g->learned_ms > 0 && (j->min_group_interval_ms == 0 || g->learned_ms < j->min_group_interval_ms))
                j->min_group_interval_ms = g->learned_ms;
        }
        if (!g->in_gap && iv > 0 && (double)(now_ms - g->last_ms) > HEARTBEAT_GAP_INTERVALS * (double)iv) {
            double e, r;
            hb_group_counters(hb, g, now_ms, &e, &r);
            g->in_gap = true;
            g->gap_start_ms = g->last_ms + iv;
            hb_group_gap_event(hb, g, HEARTBEAT_GAP_OPEN, g->gap_start_ms, 0, NULL);
        }
    }
    for (size_t i = hb->njobs; i-- > 0;) {
        hb_job_t *j = hb->jobs[i];
        if (!j->nref && !j->expected) {
            hb_job_forget_if_unused(hb, j, now_ms);
            continue;
        }
        int64_t iv = hb_job_interval(hb, j);
        if (!j->in_gap && (double)(now_ms - j->last_ms) > HEARTBEAT_GAP_INTERVALS * (double)iv) {
            double e, r;
            hb_job_counters(hb, j, now_ms, &e, &r);
            j->in_gap = true;
            j->gap_start_ms = j->last_ms + iv;
            hb_event(hb, HEARTBEAT_GAP_OPEN, j->name, "", j->gap_start_ms, 0, NULL);
        }
    }
}

size_t heartbeat_take_events(heartbeat_t *hb, heartbeat_event_t **out)
{
    size_t n = hb->nev;
    *out = hb->ev;
    hb->ev = NULL;
    hb->nev = hb->evcap = 0;
    return n;
}

void heartbeat_events_free(heartbeat_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ev[i].job);
        free(ev[i].group);
    }
    free(ev);
}

void heartbeat_each_group(heartbeat_t *hb, int64_t now_ms, void (*fn)(const heartbeat_group_view_t *v, void *ud),
                          void *ud)
{
    for (size_t i = 0; i < hb->ngroups; i++) {
        hb_group_t *g = hb->groups[i];
        heartbeat_group_view_t v = {
            .labels = &g->labels, .last_ms = g->last_ms, .interval_ms = hb_group_interval(hb, g)};
        hb_group_counters(hb, g, now_ms, &v.expected, &v.received);
        fn(&v, ud);
    }
}

static void hb_job_view(heartbeat_t *hb, hb_job_t *j, int64_t now_ms, heartbeat_job_view_t *v)
{
    memset(v, 0, sizeof(*v));
    v->job = j->name;
    hb_job_counters(hb, j, now_ms, &v->expected, &v->received);
    v->last_ms = j->pushed ? j->last_ms : 0;
    v->interval_ms = hb_job_interval(hb, j);
    v->expected_job = j->expected;
    v->up = hb_job_up(hb, j, now_ms);
    v->in_gap = j->in_gap;
    v->gap_start_ms = j->gap_start_ms;
    v->first_ms = j->first_ms;
    v->ngroups = j->nref;
}

void heartbeat_each_job(heartbeat_t *hb, int64_t now_ms, void (*fn)(const heartbeat_job_view_t *v, void *ud), void *ud)
{
    for (size_t i = 0; i < hb->njobs; i++) {
        heartbeat_job_view_t v;
        hb_job_view(hb, hb->jobs[i], now_ms, &v);
        fn(&v, ud);
    }
}

bool heartbeat_job(heartbeat_t *hb, const char *job, int64_t now_ms, heartbeat_job_view_t *out)
{
    hb_job_t *j = hb_job_find(hb, job);
    if (!j)
        return false;
    hb_job_view(hb, j, now_ms, out);
    return true;
}

size_t heartbeat_group_count(const heartbeat_t *hb)
{
    return hb->ngroups;
}

size_t heartbeat_job_count(const heartbeat_t *hb)
{
    return hb->njobs;
}
