/* Unit tests for storage/querier_fallthrough.c: two memory-only stores play the local store and
 * the remote one (a wrapper counts the remote's selects and can fail or warn like
 * internal/remote/remote_querier does). Checks the seam (remote before local_min or the series'
 * first local sample, local after, nothing twice), remote-only series clipped at the seam, no
 * remote select for ranges the local store covers, read_recent merging with local winning a tie,
 * raw remote samples replacing local roll-ups, warnings and error kinds passed on, label
 * union, and the storage facade's storage_min_time / storage_querier_fallthrough. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/log.h"
#include "storage/chunk_xor.h"
#include "storage/querier_fallthrough.h"
#include "storage/storage.h"

static storage_t *mem_store(void)
{
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    return s;
}

static void put(storage_t *s, const char *name, const char *job, int64_t t, double v)
{
    label_t l[2] = {{"__name__", name}, {"job", job}};
    storage_sample_t smp = {.labels = {l, 2}, .t = t, .v = v};
    storage_append_result_t r;
    assert_int_equal(storage_append(s, &smp, 1, &r), STORAGE_OK);
}

/* ---- a remote wrapper: counts selects, may fail or warn ---------------------------------------- */

typedef struct {
    querier_t base;
    querier_t *inner;
    int selects;
    int64_t last_mint, last_maxt;
    bool fail;
    querier_err_kind_t kind;
    bool warn;
} wrap_t;

typedef struct {
    querier_set_t base;
    querier_set_t *inner;
    wrap_t *w;
} wset_t;

static const querier_series_t *w_next(querier_set_t *b)
{
    wset_t *s = (wset_t *)b;
    return s->w->fail ? NULL : querier_set_next(s->inner);
}
static const char *w_error(querier_set_t *b)
{
    return ((wset_t *)b)->w->fail ? "remote read central: connection refused" : NULL;
}
static querier_err_kind_t w_kind(querier_set_t *b)
{
    return ((wset_t *)b)->w->kind;
}
static const char *const warn_msgs[] = {"remote read central: timeout; partial response"};
static size_t w_warnings(querier_set_t *b, const char *const **out)
{
    if (!((wset_t *)b)->w->warn)
        return 0;
    *out = warn_msgs;
    return 1;
}
static void w_free(querier_set_t *b)
{
    querier_set_free(((wset_t *)b)->inner);
    free(b);
}
static const querier_set_ops_t wset_ops = {
    .next = w_next, .error = w_error, .free = w_free, .warnings = w_warnings, .error_kind = w_kind};

static querier_set_t *w_select(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                               const querier_hints_t *h)
{
    wrap_t *w = (wrap_t *)q;
    w->selects++;
    w->last_mint = mint;
    w->last_maxt = maxt;
    wset_t *s = calloc(1, sizeof(*s));
    s->base.ops = &wset_ops;
    s->w = w;
    s->inner = querier_select(w->inner, ms, n, mint, maxt, h);
    return &s->base;
}
static int w_names(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, arena_t *a,
                   const char ***out, size_t *count, char *err, size_t errlen)
{
    ((wrap_t *)q)->selects++;
    return querier_label_names(((wrap_t *)q)->inner, ms, n, mint, maxt, a, out, count, err, errlen);
}
static int w_values(querier_t *q, const char *name, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                    arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    ((wrap_t *)q)->selects++;
    return querier_label_values(((wrap_t *)q)->inner, name, ms, n, mint, maxt, a, out, count, err, errlen);
}
static void w_close(querier_t *q)
{
    querier_close(((wrap_t *)q)->inner);
    /* the wrap_t itself belongs to the test */
}
static const querier_ops_t wrap_ops = {
    .select = w_select, .label_names = w_names, .label_values = w_values, .close = w_close};

/* ---- fixture --------------------------------------------------------------------------------- */

#define SEAM 600000LL /* local data from 10 min on; remote has 0 .. 20 min */
static storage_t *local_st, *remote_st;
static wrap_t wrap;
static matcher_t *m_name, *m_all;

static int setup(void **state)
{
    log_set_level(LOG_ERROR);
    local_st = mem_store();
    remote_st = mem_store();
    for (int64_t t = 0; t <= 1200000; t += 15000) {
        put(remote_st, "up_total", "a", t, (double)t / 1000);
        put(remote_st, "only_remote", "a", t, 1);
        if (t >= SEAM) {
            /* local values differ by a marker so the test sees who answered */
            put(local_st, "up_total", "a", t, (double)t / 1000 + 0.5);
        }
    }
    put(local_st, "only_local", "a", SEAM + 30000, 7);
    char err[64];
    m_name = matcher_new(MATCHER_RE, "__name__", "up_total|only_remote|only_local", err, sizeof(err));
    m_all = matcher_new(MATCHER_RE, "__name__", ".+", err, sizeof(err));
    return 0;
}

static int teardown(void **state)
{
    matcher_free(m_name);
    matcher_free(m_all);
    storage_close(local_st);
    storage_close(remote_st);
    return 0;
}

static querier_t *open_ft(bool read_recent)
{
    memset(&wrap, 0, sizeof(wrap));
    wrap.base.ops = &wrap_ops;
    wrap.inner = storage_querier(remote_st);
    querier_fallthrough_opts_t o = {.local = storage_querier(local_st),
                                    .remote = &wrap.base,
                                    .local_min = storage_min_time(local_st),
                                    .read_recent = read_recent};
    return querier_fallthrough_new(&o);
}

typedef struct {
    char name[32];
    int64_t t[256];
    double v[256];
    size_t n;
} ser_t;

/* Runs a select; returns the number of series (at most 4 kept). */
static size_t run(querier_t *q, int64_t mint, int64_t maxt, ser_t *out, const char **err, querier_err_kind_t *kind,
                  size_t *nwarn)
{
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m_name, 1, mint, maxt, NULL);
    assert_non_null(set);
    size_t k = 0;
    const querier_series_t *s;
    while ((s = querier_set_next(set))) {
        assert_true(k < 4);
        ser_t *o = &out[k++];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", labels_get(&s->labels, "__name__"));
        for (size_t i = 1; i < s->nchunks; i++)
            assert_true(s->chunks[i - 1].maxt < s->chunks[i].mint); /* ordered, non-overlapping */
        querier_iter_t it;
        querier_iter_init(&it, s, mint, maxt);
        while (o->n < 256 && querier_iter_next(&it, &o->t[o->n], &o->v[o->n]))
            o->n++;
    }
    static char ebuf[256];
    const char *e = querier_set_error(set);
    if (err)
        *err = e ? (snprintf(ebuf, sizeof(ebuf), "%s", e), ebuf) : NULL;
    if (kind)
        *kind = querier_set_error_kind(set);
    const char *const *w;
    if (nwarn)
        *nwarn = querier_set_warnings(set, &w);
    querier_set_free(set);
    return k;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_min_time(void **state)
{
    assert_int_equal(storage_min_time(local_st), SEAM);
    storage_t *empty = mem_store();
    assert_true(storage_min_time(empty) == INT64_MAX);
    storage_close(empty);
}

static void test_seam_default(void **state)
{
    querier_t *q = open_ft(false);
    ser_t s[4];
    const char *err;
    size_t nw;
    size_t n = run(q, 0, 1200000, s, &err, NULL, &nw);
    assert_null(err);
    assert_int_equal(nw, 0);
    assert_int_equal(wrap.selects, 1);
    assert_int_equal(wrap.last_maxt, SEAM - 1); /* only the part before the seam is asked for */
    assert_int_equal(n, 3);
    /* sorted by labels: only_local, only_remote, up_total */
    assert_string_equal(s[0].name, "only_local");
    assert_int_equal(s[0].n, 1);
    assert_string_equal(s[1].name, "only_remote");
    assert_int_equal(s[1].n, SEAM / 15000); /* clipped at the seam */
    assert_true(s[1].t[s[1].n - 1] < SEAM);
    assert_string_equal(s[2].name, "up_total");
    assert_int_equal(s[2].n, 1200000 / 15000 + 1); /* every timestamp once */
    for (size_t i = 0; i < s[2].n; i++) {
        assert_int_equal(s[2].t[i], (int64_t)i * 15000);
        double want = (double)s[2].t[i] / 1000 + (s[2].t[i] >= SEAM ? 0.5 : 0);
        assert_true(s[2].v[i] == want); /* remote before the seam, local from it */
    }
    /* A range the local store covers never asks the remote. */
    n = run(q, SEAM, 1200000, s, &err, NULL, NULL);
    assert_int_equal(wrap.selects, 1);
    assert_int_equal(n, 2);
    querier_close(q);
}

static void test_read_recent(void **state)
{
    querier_t *q = open_ft(true);
    ser_t s[4];
    const char *err;
    size_t n = run(q, SEAM, 1200000, s, &err, NULL, NULL);
    assert_null(err);
    assert_int_equal(wrap.selects, 1);
    assert_int_equal(wrap.last_maxt, 1200000);
    assert_int_equal(n, 3); /* only_remote is there although the range is all local */
    assert_string_equal(s[2].name, "up_total");
    assert_int_equal(s[2].n, SEAM / 15000 + 1);
    for (size_t i = 0; i < s[2].n; i++)
        assert_true(s[2].v[i] == (double)s[2].t[i] / 1000 + 0.5); /* local wins every tie */
    querier_close(q);
}

static void test_remote_failure(void **state)
{
    querier_t *q = open_ft(false);
    wrap.fail = true;
    wrap.kind = QUERIER_ERR_UNAVAILABLE;
    ser_t s[4];
    const char *err;
    querier_err_kind_t kind;
    run(q, 0, 1200000, s, &err, &kind, NULL);
    assert_non_null(err);
    assert_non_null(strstr(err, "connection refused"));
    assert_int_equal(kind, QUERIER_ERR_UNAVAILABLE);
    querier_close(q);

    q = open_ft(false);
    wrap.warn = true;
    size_t nw;
    size_t n = run(q, 0, 1200000, s, &err, NULL, &nw);
    assert_null(err);
    assert_int_equal(nw, 1);
    assert_int_equal(n, 3);
    querier_close(q);
}

static void test_labels(void **state)
{
    querier_t *q = open_ft(false);
    arena_t *a = arena_create(0);
    const char **v;
    size_t c;
    char err[128];
    assert_int_equal(querier_label_values(q, "__name__", NULL, 0, 0, 1200000, a, &v, &c, err, sizeof(err)), 0);
    assert_int_equal(c, 3);
    assert_string_equal(v[0], "only_local");
    assert_string_equal(v[1], "only_remote");
    assert_string_equal(v[2], "up_total");
    int before = wrap.selects;
    assert_int_equal(querier_label_names(q, NULL, 0, SEAM, 1200000, a, &v, &c, err, sizeof(err)), 0);
    assert_int_equal(wrap.selects, before); /* local range: remote not asked */
    assert_int_equal(c, 2);
    arena_destroy(a);
    querier_close(q);
}

static querier_t *ft_open_remote(void *ud)
{
    wrap_t *w = ud;
    memset(w, 0, sizeof(*w));
    w->base.ops = &wrap_ops;
    w->inner = storage_querier(remote_st);
    return &w->base;
}

static void test_storage_facade(void **state)
{
    /* Without a fall-through, the facade is the plain local querier. */
    querier_t *q = storage_querier_fallthrough(local_st);
    ser_t s[4];
    assert_int_equal(run(q, 0, 1200000, s, NULL, NULL, NULL), 2);
    querier_close(q);
    storage_fallthrough_t ft = {.open = ft_open_remote, .ud = &wrap};
    storage_set_fallthrough(local_st, &ft);
    q = storage_querier_fallthrough(local_st);
    assert_int_equal(run(q, 0, 1200000, s, NULL, NULL, NULL), 3);
    querier_close(q);
    /* storage_querier (rules, the dashboard, remote read) stays local. */
    q = storage_querier(local_st);
    assert_int_equal(run(q, 0, 1200000, s, NULL, NULL, NULL), 2);
    querier_close(q);
    storage_set_fallthrough(local_st, NULL);
}

/* ---- read_recent over local roll-ups: a fake local querier with one series whose first two
 * samples are synthetic roll-up samples ---------------------------------------------------------- */

typedef struct {
    querier_set_t base;
    chunk_xor_appender_t app;
    querier_chunk_t ch;
    querier_series_t s;
    label_t l[2];
    bool done;
} fake_set_t;

static const querier_series_t *fk_next(querier_set_t *b)
{
    fake_set_t *f = (fake_set_t *)b;
    if (f->done)
        return NULL;
    f->done = true;
    return &f->s;
}
static const char *fk_error(querier_set_t *b)
{
    return NULL;
}
static void fk_free(querier_set_t *b)
{
    chunk_xor_appender_free(&((fake_set_t *)b)->app);
    free(b);
}
static const querier_set_ops_t fk_set_ops = {.next = fk_next, .error = fk_error, .free = fk_free};

static querier_set_t *fk_select(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                                const querier_hints_t *h)
{
    fake_set_t *f = calloc(1, sizeof(*f));
    f->base.ops = &fk_set_ops;
    chunk_xor_appender_init(&f->app);
    chunk_xor_append(&f->app, 59999, 1000); /* roll-up buckets [0, 60 s) and [60 s, 120 s) */
    chunk_xor_append(&f->app, 119999, 2000);
    for (int64_t t = 120000; t <= 240000; t += 15000)
        chunk_xor_append(&f->app, t, (double)t / 1000 + 0.5);
    f->ch.mint = 59999;
    f->ch.maxt = 240000;
    f->ch.bytes = chunk_xor_bytes(&f->app, &f->ch.len);
    f->l[0] = (label_t){"__name__", "up_total"};
    f->l[1] = (label_t){"job", "a"};
    f->s = (querier_series_t){
        .labels = {f->l, 2}, .chunks = &f->ch, .nchunks = 1, .rollup_until = 120000, .rollup_res_ms = 60000};
    return &f->base;
}
static void fk_close(querier_t *q)
{
    free(q);
}
static const querier_ops_t fk_ops = {.select = fk_select, .close = fk_close};

static void test_read_recent_replaces_rollups(void **state)
{
    querier_t *local = calloc(1, sizeof(*local));
    local->ops = &fk_ops;
    memset(&wrap, 0, sizeof(wrap));
    wrap.base.ops = &wrap_ops;
    wrap.inner = storage_querier(remote_st);
    querier_fallthrough_opts_t o = {.local = local, .remote = &wrap.base, .local_min = 59999, .read_recent = true};
    querier_t *q = querier_fallthrough_new(&o);
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", "up_total", err, sizeof(err));
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, 0, 240000, NULL);
    const querier_series_t *s = querier_set_next(set);
    assert_non_null(s);
    assert_int_equal(s->rollup_until, 0); /* no synthetic samples left */
    querier_iter_t it;
    querier_iter_init(&it, s, 0, 240000);
    int64_t t;
    double v;
    size_t n = 0;
    while (querier_iter_next(&it, &t, &v)) {
        assert_int_equal(t, (int64_t)n * 15000); /* the remote's raw grid, no bucket-end samples */
        assert_true(v == (double)t / 1000 + (t >= 120000 ? 0.5 : 0));
        n++;
    }
    assert_int_equal(n, 240000 / 15000 + 1);
    assert_null(querier_set_next(set));
    querier_set_free(set);
    matcher_free(m);
    querier_close(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_min_time),
        cmocka_unit_test(test_seam_default),
        cmocka_unit_test(test_read_recent),
        cmocka_unit_test(test_remote_failure),
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_storage_facade),
        cmocka_unit_test(test_read_recent_replaces_rollups),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
