/* Unit tests for storage/storage.c: append rules and limits through the facade, reopen after a
 * clean close (snapshot + WAL), recovery from the WAL alone after a crash (child exits without
 * closing), a corrupt snapshot (previous snapshot + WAL, salvage of intact records, set aside),
 * and the statistics/metrics outputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal/labels/matcher.h"
#include "internal/util/log.h"
#include "storage/catalog.h"
#include "storage/rollup.h"
#include "storage/storage.h"

static int64_t fake_now = 10 * 3600 * 1000LL;
static int64_t clock_fn(void)
{
    return fake_now;
}

static char dir[256];

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/sluice-test-storage-XXXXXX");
    assert_non_null(mkdtemp(dir));
    log_set_level(LOG_WARN);
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static storage_t *open_store(const char *path, uint64_t max_series)
{
    storage_options_t o;
    storage_options_default(&o);
    o.path = path;
    o.rollups = "";
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.max_series = max_series;
    o.snapshot_interval_ms = -1;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    if (!s)
        fprintf(stderr, "storage_open: %s\n", err);
    assert_non_null(s);
    assert_true(storage_ready(s));
    return s;
}

static int append1(storage_t *s, const char *name, const char *job, int64_t t, double v, storage_append_result_t *r)
{
    label_t l[3] = {{"job", job}, {"__name__", name}, {"empty", ""}};
    storage_sample_t smp = {.labels = {l, 3}, .t = t, .v = v};
    return storage_append(s, &smp, 1, r);
}

/* Sum of all values and sample count of series __name__=name. */
static void totals(storage_t *s, const char *name, size_t *n, double *sum, size_t *series)
{
    *n = 0;
    *sum = 0;
    *series = 0;
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", name, err, sizeof(err));
    querier_t *q = storage_querier(s);
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *sr;
    while ((sr = querier_set_next(set))) {
        (*series)++;
        assert_null(labels_get(&sr->labels, "empty")); /* empty values are dropped */
        querier_iter_t it;
        querier_iter_init(&it, sr, INT64_MIN, INT64_MAX);
        int64_t t;
        double v;
        while (querier_iter_next(&it, &t, &v)) {
            (*n)++;
            *sum += v;
        }
    }
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
}

static void test_append_rules_and_limits(void **state)
{
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.max_series = 4;
    o.max_samples_per_request = 10;
    char err[128];
    storage_t *s = storage_open(&o, err, sizeof(err)); /* memory only */
    assert_non_null(s);
    storage_append_result_t r;
    int64_t t0 = fake_now - 60000;
    assert_int_equal(append1(s, "m", "a", t0, 1, &r), STORAGE_OK);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(append1(s, "m", "a", t0 - 1000, 1, &r), STORAGE_ERR_OUT_OF_ORDER);
    assert_non_null(strstr(r.msg, "out of order"));
    assert_non_null(strstr(r.msg, "job=\"a\""));
    assert_int_equal(append1(s, "m", "a2", fake_now - 3 * 3600 * 1000LL, 1, &r), STORAGE_OK); /* no expiry yet */
    storage_housekeep(s);
    assert_int_equal(append1(s, "m", "b", fake_now - 3 * 3600 * 1000LL, 1, &r), STORAGE_ERR_TOO_OLD);

    /* Batch: one bad label set, the rest stored. */
    label_t good[] = {{"__name__", "m"}, {"job", "c"}};
    label_t bad[] = {{"__name__", "m"}, {"0bad", "x"}};
    label_t noname[] = {{"job", "x"}};
    storage_sample_t batch[] = {
        {.labels = {good, 2}, .t = t0, .v = 1},
        {.labels = {bad, 2}, .t = t0, .v = 1},
        {.labels = {noname, 1}, .t = t0, .v = 1},
    };
    assert_int_equal(storage_append(s, batch, 3, &r), STORAGE_ERR_BAD_LABELS);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.failed, 2);
    assert_int_equal(r.first_failed, 1);
    /* max_series = 4: a, a2, b (created, then its sample refused), c; d is refused. */
    int rc = append1(s, "m", "d", t0, 1, &r);
    assert_int_equal(rc, STORAGE_ERR_MAX_SERIES);
    assert_non_null(strstr(r.msg, "series limit"));
    /* per-request sample limit: nothing stored */
    storage_sample_t many[11];
    for (int i = 0; i < 11; i++)
        many[i] = (storage_sample_t){.labels = {good, 2}, .t = t0 + 1000 * (i + 1), .v = i};
    assert_int_equal(storage_append(s, many, 11, &r), STORAGE_ERR_LIMIT);
    assert_int_equal(r.accepted, 0);

    buf_t b;
    buf_init(&b);
    storage_write_metrics(s, &b);
    assert_non_null(strstr(b.data, "sluice_storage_head_series 4\n"));
    assert_non_null(strstr(b.data, "sluice_storage_out_of_order_samples_total 1\n"));
    buf_free(&b);
    arena_t *a = arena_create(0);
    storage_tsdb_stats_t st;
    assert_int_equal(storage_tsdb_stats(s, 10, a, &st), STORAGE_OK);
    assert_int_equal(st.head.series, 4);
    assert_int_equal(st.index.n_series_by_metric, 1);
    assert_int_equal(st.index.series_by_metric[0].value, 4);
    arena_destroy(a);
    storage_close(s);
}

static void fill(storage_t *s, int64_t from, int count)
{
    char job[16];
    for (int j = 0; j < 20; j++) {
        snprintf(job, sizeof(job), "j%d", j);
        for (int i = 0; i < count; i++) {
            storage_append_result_t r;
            assert_int_equal(append1(s, "m", job, from + i * 10000LL, i + j, &r), STORAGE_OK);
        }
    }
}

/* Number of damaged snapshots set aside in <path>. */
static int count_set_aside(const char *path)
{
    char pat[400];
    snprintf(pat, sizeof(pat), "%s/head.snapshot.corrupt-*", path);
    glob_t g;
    int n = glob(pat, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    globfree(&g);
    return n;
}

static long snapshot_size(const char *path)
{
    char snap[400];
    snprintf(snap, sizeof(snap), "%s/head.snapshot", path);
    FILE *f = fopen(snap, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    return size;
}

/* Flips bytes of <path>/head.snapshot at offset off (XOR 0x5a, 0xa5, ...). */
static void corrupt_snapshot(const char *path, long off, int n)
{
    char snap[400];
    snprintf(snap, sizeof(snap), "%s/head.snapshot", path);
    FILE *f = fopen(snap, "r+b");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        fseek(f, off + i, SEEK_SET);
        int c = fgetc(f);
        assert_true(c != EOF);
        fseek(f, off + i, SEEK_SET);
        fputc(c ^ (i % 2 ? 0xa5 : 0x5a), f);
    }
    fclose(f);
}

static void test_reopen_snapshot_and_wal(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/a", dir);
    storage_t *s = open_store(path, 0);
    int64_t t0 = fake_now - 3600 * 1000LL;
    fill(s, t0, 100);
    char err[256];
    assert_int_equal(storage_snapshot(s, err, sizeof(err)), STORAGE_OK);
    fill(s, t0 + 100 * 10000LL, 50); /* after the snapshot: only in the WAL (until close) */
    size_t n1, ser1;
    double sum1;
    totals(s, "m", &n1, &sum1, &ser1);
    assert_int_equal(n1, 20 * 150);
    assert_int_equal(ser1, 20);
    storage_close(s);

    s = open_store(path, 0);
    size_t n2, ser2;
    double sum2;
    totals(s, "m", &n2, &sum2, &ser2);
    assert_int_equal(n2, n1);
    assert_int_equal(ser2, ser1);
    assert_true(sum1 == sum2);
    /* The same-second rule holds across the restart: the newest sample is still replaceable. */
    storage_append_result_t r;
    int64_t last = t0 + 149 * 10000LL;
    assert_int_equal(append1(s, "m", "j0", last + 500, 1000, &r), STORAGE_OK);
    assert_int_equal(append1(s, "m", "j0", last - 1000, 1, &r), STORAGE_ERR_OUT_OF_ORDER);
    storage_close(s);

    /* Crash: a child appends and exits without closing; the WAL alone brings the data back. */
    pid_t pid = fork();
    if (pid == 0) {
        storage_t *c = open_store(path, 0);
        storage_append_result_t rr;
        for (int i = 0; i < 10; i++)
            if (append1(c, "crash", "x", t0 + 2000000 + i * 1000LL, i, &rr) != STORAGE_OK)
                _exit(1);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    s = open_store(path, 0);
    size_t n3, ser3;
    double sum3;
    totals(s, "crash", &n3, &sum3, &ser3);
    assert_int_equal(n3, 10);
    assert_true(sum3 == 45);
    totals(s, "m", &n3, &sum3, &ser3);
    assert_int_equal(n3, n1);
    storage_close(s);

    /* Corrupt snapshot: the previous snapshot and the WAL since it bring everything back, and the
     * damaged file is set aside. */
    corrupt_snapshot(path, 100, 2);
    s = open_store(path, 0);
    totals(s, "m", &n3, &sum3, &ser3);
    assert_int_equal(n3, n1);
    assert_int_equal(ser3, ser1);
    totals(s, "crash", &n3, &sum3, &ser3);
    assert_int_equal(n3, 10);
    assert_int_equal(count_set_aside(path), 1);
    assert_int_equal(append1(s, "m", "j0", fake_now, 1, &r), STORAGE_OK);
    storage_close(s);
}

/* The only snapshot, damaged in its last record, with the WAL before it gone: the series in the
 * intact records come back, the one in the damaged record is lost. Then the damaged newest
 * snapshot of two, when the WAL the previous one needs is gone: its intact records win too. */
static void test_salvage_snapshot(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/salvage", dir);
    storage_t *s = open_store(path, 0);
    int64_t t0 = fake_now - 3600 * 1000LL;
    fill(s, t0, 30);
    storage_close(s); /* the only snapshot; segments before it are deleted */

    corrupt_snapshot(path, snapshot_size(path) - 24 - 8, 4); /* the last record's payload */
    s = open_store(path, 0);
    size_t n, ser;
    double sum;
    totals(s, "m", &n, &sum, &ser);
    assert_int_equal(ser, 19);
    assert_int_equal(n, 19 * 30);
    assert_int_equal(count_set_aside(path), 1);
    fill(s, t0 + 30 * 10000LL, 10); /* the lost series starts afresh */
    storage_close(s);

    s = open_store(path, 0);
    fill(s, t0 + 40 * 10000LL, 10);
    storage_close(s); /* two snapshots now */
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -f %s/wal/*", path); /* the previous one's WAL is gone */
    assert_int_equal(system(cmd), 0);
    corrupt_snapshot(path, snapshot_size(path) - 24 - 8, 4);
    s = open_store(path, 0);
    totals(s, "m", &n, &sum, &ser);
    assert_int_equal(ser, 19);
    assert_true(n >= 18 * 50 + 20);
    assert_int_equal(count_set_aside(path), 2);
    storage_close(s);

    /* A damaged header, no previous snapshot: nothing to salvage, the WAL alone; still set aside. */
    char prev[400];
    snprintf(prev, sizeof(prev), "%s/head.snapshot.prev", path);
    unlink(prev);
    corrupt_snapshot(path, 4, 2);
    s = open_store(path, 0);
    assert_int_equal(count_set_aside(path), 3);
    storage_close(s);
}

/* A store with 1m roll-ups on the fake clock, driven by hand: no background thread (so no roll-up
 * writer either: only explicit flushes and snapshots reach SQLite), no periodic snapshot. */
static void options_with_rollups(storage_options_t *o, const char *path)
{
    storage_options_default(o);
    o->path = path;
    o->rollups = "1m:1d";
    o->no_background = true;
    o->clock_ms = clock_fn;
    o->snapshot_interval_ms = -1;
}

/* The roll-ups of a closed store, opened on their own (*cat to close after them). */
static rollup_t *rollups_of(const char *path, catalog_t **cat)
{
    char err[256];
    *cat = catalog_open(path, err, sizeof(err));
    assert_non_null(*cat);
    rollup_config_t cfg = {.resolutions = "1m:1d", .no_thread = true, .clock_ms = clock_fn};
    rollup_t *ru = rollup_open(*cat, &cfg, err, sizeof(err));
    assert_non_null(ru);
    return ru;
}

/* In a child: a store on o takes samples 0..before-1 of series `name` (sample i has value i, at
 * t0 + i * step; a writer cycle after every flush_every-th, 0: none), a snapshot, then samples
 * before..before+after-1, and dies without closing or flushing (kill -9 style). */
static void crash_after_snapshot(const storage_options_t *o, const char *name, int64_t t0, int64_t step, int before,
                                 int after, int flush_every)
{
    pid_t pid = fork();
    if (pid == 0) {
        char err[256];
        storage_t *c = storage_open(o, err, sizeof(err));
        storage_append_result_t r;
        if (!c)
            _exit(1);
        for (int i = 0; i < before + after; i++) {
            if (i == before && storage_snapshot(c, err, sizeof(err)) != STORAGE_OK)
                _exit(2);
            if (append1(c, name, "x", t0 + i * step, i, &r) != STORAGE_OK)
                _exit(3);
            if (i < before && flush_every && i % flush_every == 0 && storage_flush(c) != STORAGE_OK)
                _exit(4);
        }
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A snapshot removes the WAL segments that held the series records; if that snapshot is later
 * unreadable, the catalog names the series of the newer segments' samples. With roll-ups on,
 * the catalog is written by the roll-up writer every few seconds, so the snapshot must flush it
 * before it removes segments: a crash in between lost every series created since. */
static void test_corrupt_snapshot_series_from_catalog(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/cat", dir);
    storage_options_t o;
    options_with_rollups(&o, path);
    crash_after_snapshot(&o, "cat", fake_now - 600 * 1000LL, 1000, 10, 10, 0);
    corrupt_snapshot(path, 40, 2);
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    size_t n, series;
    double sum;
    totals(s, "cat", &n, &sum, &series);
    assert_int_equal(series, 1);
    assert_int_equal(n, 10); /* the samples logged after the snapshot */
    storage_close(s);
}

static void test_series_ids_stable(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/b", dir);
    storage_t *s = open_store(path, 0);
    storage_append_result_t r;
    assert_int_equal(append1(s, "m", "x", fake_now - 1000, 1, &r), STORAGE_OK);
    assert_int_equal(append1(s, "m", "y", fake_now - 1000, 1, &r), STORAGE_OK);
    index_refs_t refs = {0};
    assert_int_equal(index_select(head_index(storage_head(s)), NULL, 0, &refs), INDEX_OK);
    uint64_t ids1 = refs.v[0].id + refs.v[1].id;
    index_refs_free(&refs);
    storage_close(s);
    s = open_store(path, 0);
    assert_int_equal(index_select(head_index(storage_head(s)), NULL, 0, &refs), INDEX_OK);
    assert_int_equal(refs.n, 2);
    assert_int_equal(refs.v[0].id + refs.v[1].id, ids1);
    index_refs_free(&refs);
    storage_close(s);
}

/* Per-request series limit: a true distinct count, whatever the order of the samples. */
static void test_series_per_request_distinct(void **state)
{
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.max_series_per_request = 2;
    char err[128];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    label_t a[] = {{"__name__", "m"}, {"job", "a"}}, b[] = {{"__name__", "m"}, {"job", "b"}},
            c[] = {{"__name__", "m"}, {"job", "c"}};
    storage_sample_t batch[6];
    for (int i = 0; i < 6; i++) /* a b a b a b: 6 runs, 2 series */
        batch[i] = (storage_sample_t){.labels = {i % 2 ? b : a, 2}, .t = fake_now - 10000 + (i / 2) * 1000, .v = i};
    storage_append_result_t r;
    assert_int_equal(storage_append(s, batch, 6, &r), STORAGE_OK);
    assert_int_equal(r.accepted, 6);
    batch[5].labels.v = c; /* a third series, last */
    for (int i = 0; i < 6; i++)
        batch[i].t += 10000;
    assert_int_equal(storage_append(s, batch, 6, &r), STORAGE_ERR_LIMIT);
    assert_int_equal(r.accepted, 0);
    assert_non_null(strstr(r.msg, "more than 2 series"));
    storage_close(s);
}

/* A toy state client: 16 integer slots; a delta is (slot, value), two bytes. */
typedef struct {
    uint8_t slots[16];
    int full_calls, delta_calls;
    bool split; /* checkpoint slots 8..15 as deltas after the full state */
} toy_t;

static int toy_restore(void *ud, const void *data, size_t len, bool full)
{
    toy_t *t = ud;
    const uint8_t *p = data;
    if (full) {
        if (len != sizeof(t->slots))
            return -1;
        memcpy(t->slots, p, len);
        t->full_calls++;
        return 0;
    }
    if (len != 2 || p[0] >= 16)
        return -1;
    t->slots[p[0]] = p[1];
    t->delta_calls++;
    return 0;
}

static int toy_checkpoint(void *ud, storage_state_sink_t *sink)
{
    toy_t *t = ud;
    if (!t->split)
        return storage_state_put(sink, t->slots, sizeof(t->slots));
    uint8_t full[16] = {0};
    memcpy(full, t->slots, 8);
    int rc = storage_state_put(sink, full, sizeof(full));
    for (uint8_t i = 8; i < 16 && rc == STORAGE_OK; i++)
        if (t->slots[i])
            rc = storage_state_put(sink, (uint8_t[2]){i, t->slots[i]}, 2);
    return rc;
}

static storage_t *open_toy(const char *path, toy_t *t)
{
    storage_options_t o;
    storage_options_default(&o);
    o.path = path;
    o.rollups = "";
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.snapshot_interval_ms = -1;
    char err[256];
    storage_t *s = storage_new(&o, err, sizeof(err));
    assert_non_null(s);
    storage_state_client_t c = {.ud = t, .restore = toy_restore, .checkpoint = toy_checkpoint};
    assert_int_equal(storage_register_state(s, 7, &c), STORAGE_OK);
    assert_int_equal(storage_register_state(s, 7, &c), -1); /* twice */
    assert_int_equal(storage_register_state(s, 0, &c), -1);
    assert_int_equal(storage_recover(s, err, sizeof(err)), STORAGE_OK);
    assert_int_equal(storage_register_state(s, 8, &c), -1); /* too late */
    return s;
}

static void toy_set(storage_t *s, toy_t *t, uint8_t slot, uint8_t v)
{
    t->slots[slot] = v;
    uint8_t d[2] = {slot, v};
    char err[128];
    assert_int_equal(storage_log_state(s, 7, d, 2, err, sizeof(err)), STORAGE_OK);
}

/* kill -9 style: a child takes a snapshot, logs one delta and exits without closing. */
static void log_delta_after_snapshot(const char *path, uint8_t slot, uint8_t v)
{
    pid_t pid = fork();
    if (pid == 0) {
        toy_t tc = {0};
        storage_t *c = open_toy(path, &tc);
        char e[128];
        uint8_t d[2] = {slot, v};
        if (storage_snapshot(c, e, sizeof(e)) != STORAGE_OK ||
            storage_log_state(c, 7, d, 2, e, sizeof(e)) != STORAGE_OK)
            _exit(1);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_state_clients(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/state", dir);
    toy_t t = {0};
    storage_t *s = open_toy(path, &t);
    assert_int_equal(t.full_calls + t.delta_calls, 0); /* nothing stored yet */
    toy_set(s, &t, 1, 10);
    toy_set(s, &t, 2, 20);
    char err[256];
    assert_int_equal(storage_snapshot(s, err, sizeof(err)), STORAGE_OK);
    toy_set(s, &t, 3, 30);
    toy_set(s, &t, 1, 11);
    storage_close(s); /* final snapshot holds everything */

    toy_t t2 = {0};
    s = open_toy(path, &t2);
    assert_int_equal(t2.full_calls, 1);
    assert_int_equal(t2.delta_calls, 0);
    assert_memory_equal(t2.slots, ((uint8_t[16]){0, 11, 20, 30}), 16);
    storage_close(s);

    /* kill -9 style: a child logs deltas after a snapshot and exits without closing. */
    pid_t pid = fork();
    if (pid == 0) {
        toy_t tc = {0};
        storage_t *c = open_toy(path, &tc);
        char e[128];
        if (storage_snapshot(c, e, sizeof(e)) != STORAGE_OK)
            _exit(1);
        uint8_t d1[2] = {4, 40}, d2[2] = {2, 21};
        if (storage_log_state(c, 7, d1, 2, e, sizeof(e)) != STORAGE_OK ||
            storage_log_state(c, 7, d2, 2, e, sizeof(e)) != STORAGE_OK)
            _exit(1);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    toy_t t3 = {0};
    s = open_toy(path, &t3);
    assert_int_equal(t3.full_calls, 1);
    assert_int_equal(t3.delta_calls, 2);
    assert_memory_equal(t3.slots, ((uint8_t[16]){0, 11, 21, 30, 40}), 16);
    storage_close(s);

    /* Corrupt snapshot: the previous snapshot's full record, then every delta since it. */
    log_delta_after_snapshot(path, 5, 50);
    corrupt_snapshot(path, 40, 1);
    toy_t t4 = {0};
    s = open_toy(path, &t4);
    assert_int_equal(t4.full_calls, 1);
    assert_int_equal(t4.delta_calls, 1);
    assert_memory_equal(t4.slots, ((uint8_t[16]){0, 11, 21, 30, 40, 50}), 16);
    assert_int_equal(count_set_aside(path), 1);
    storage_close(s);

    /* No previous snapshot either: the damaged one's intact records (none here: the state record
     * is the first) and the deltas after it. */
    log_delta_after_snapshot(path, 6, 60);
    corrupt_snapshot(path, 40, 1);
    char prev[400];
    snprintf(prev, sizeof(prev), "%s/head.snapshot.prev", path);
    assert_int_equal(unlink(prev), 0);
    toy_t t5 = {0};
    s = open_toy(path, &t5);
    assert_int_equal(t5.full_calls, 0);
    assert_int_equal(t5.delta_calls, 1);
    assert_int_equal(t5.slots[6], 60);
    assert_int_equal(count_set_aside(path), 2);
    storage_close(s);

    /* A checkpoint in pieces: the full state, then its deltas, restored in order before the WAL's. */
    toy_t t6 = {0};
    s = open_toy(path, &t6);
    t6.split = true;
    toy_set(s, &t6, 9, 90);
    toy_set(s, &t6, 12, 120);
    toy_set(s, &t6, 3, 33);
    assert_int_equal(storage_snapshot(s, err, sizeof(err)), STORAGE_OK);
    toy_set(s, &t6, 12, 121);
    uint8_t want[16];
    memcpy(want, t6.slots, 16);
    storage_close(s);
    toy_t t7 = {0};
    s = open_toy(path, &t7);
    assert_int_equal(t7.full_calls, 1);
    assert_int_equal(t7.delta_calls, 2); /* the close snapshot's two pieces; its WAL is empty */
    assert_memory_equal(t7.slots, want, 16);
    storage_close(s);

    /* Memory-only stores accept deltas and keep nothing. */
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    s = storage_new(&o, err, sizeof(err));
    storage_state_client_t c = {.ud = &t, .restore = toy_restore, .checkpoint = toy_checkpoint};
    assert_int_equal(storage_register_state(s, 7, &c), STORAGE_OK);
    uint8_t d[2] = {1, 1};
    assert_int_equal(storage_log_state(s, 7, d, 2, err, sizeof(err)), STORAGE_ERR_NOT_READY);
    assert_int_equal(storage_recover(s, err, sizeof(err)), STORAGE_OK);
    assert_int_equal(storage_log_state(s, 7, d, 2, err, sizeof(err)), STORAGE_OK);
    storage_close(s);
}

/* Many samples of one series behind one label array (as remote write sends them) resolve the
 * series once; their errors are still reported per sample. */
static void test_shared_label_arrays(void **state)
{
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    o.clock_ms = clock_fn;
    char err[128];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    int64_t t0 = fake_now - 600000;
    label_t a[] = {{"job", "r"}, {"__name__", "shared"}}; /* unsorted on purpose */
    label_t b[] = {{"__name__", "other"}};
    storage_sample_t batch[] = {
        {.labels = {a, 2}, .t = t0, .v = 1},        {.labels = {a, 2}, .t = t0 + 1000, .v = 2},
        {.labels = {a, 2}, .t = t0 + 2000, .v = 3}, {.labels = {b, 1}, .t = t0, .v = 9},
        {.labels = {a, 2}, .t = t0 + 3000, .v = 4}, /* same series again after another */
    };
    storage_append_result_t r;
    assert_int_equal(storage_append(s, batch, 5, &r), STORAGE_OK);
    assert_int_equal(r.accepted, 5);
    /* A cached sample that is too old for its series is refused on its own. */
    storage_sample_t late[] = {
        {.labels = {a, 2}, .t = t0 + 4000, .v = 5},
        {.labels = {a, 2}, .t = t0 - 5000, .v = 0},
    };
    assert_int_equal(storage_append(s, late, 2, &r), STORAGE_ERR_OUT_OF_ORDER);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(r.first_failed, 1);
    /* Everything landed in one series. */
    querier_t *q = storage_querier(s);
    char merr[128];
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", "shared", merr, sizeof(merr));
    assert_non_null(m);
    const matcher_t *ms[] = {m};
    querier_set_t *set = querier_select(q, ms, 1, t0 - 1, t0 + 10000, NULL);
    const querier_series_t *ser = querier_set_next(set);
    assert_non_null(ser);
    querier_iter_t it;
    querier_iter_init(&it, ser, t0 - 1, t0 + 10000);
    int64_t t;
    double v, sum = 0;
    int count = 0;
    while (querier_iter_next(&it, &t, &v)) {
        sum += v;
        count++;
    }
    assert_int_equal(count, 5);
    assert_true(sum == 15);
    assert_null(querier_set_next(set));
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
    storage_close(s);
}

/* Samples of series __name__=name, job=job. */
static size_t count_job(storage_t *s, const char *name, const char *job, double *sum)
{
    char err[64];
    matcher_t *m[2] = {matcher_new(MATCHER_EQ, "__name__", name, err, sizeof(err)),
                       matcher_new(MATCHER_EQ, "job", job, err, sizeof(err))};
    querier_t *q = storage_querier(s);
    querier_set_t *set = querier_select(q, (const matcher_t *const *)m, 2, INT64_MIN, INT64_MAX, NULL);
    size_t n = 0;
    *sum = 0;
    for (const querier_series_t *sr; (sr = querier_set_next(set));) {
        querier_iter_t it;
        querier_iter_init(&it, sr, INT64_MIN, INT64_MAX);
        int64_t t;
        double v;
        while (querier_iter_next(&it, &t, &v)) {
            n++;
            *sum += v;
        }
    }
    querier_set_free(set);
    querier_close(q);
    matcher_free(m[0]);
    matcher_free(m[1]);
    return n;
}

static int append_ref(storage_t *s, const char *job, int64_t t, double v, storage_ref_t *ref,
                      storage_append_result_t *r)
{
    label_t l[2] = {{"job", job}, {"__name__", "rm"}};
    storage_sample_t smp = {.labels = {l, 2}, .t = t, .v = v};
    return storage_append_refs(s, &smp, 1, ref, r);
}

/* The series reference cache (storage_append_refs): refs come back from the label path, a valid
 * ref is used as is, every refusal is as without refs, and a stale ref (series removed, its slot
 * reused by another series) falls back to the labels and never writes to the other series. */
static void test_append_refs(void **state)
{
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.max_future_ms = 60000;
    char err[128];
    storage_t *s = storage_open(&o, err, sizeof(err)); /* memory only */
    assert_non_null(s);
    storage_append_result_t r;
    int64_t t0 = fake_now - 600000;

    /* Batch with no refs: every resolved sample gets one; an invalid one gets none. */
    label_t la[] = {{"job", "a"}, {"__name__", "rm"}}, lb[] = {{"__name__", "rm"}, {"job", "b"}};
    label_t bad[] = {{"job", "x"}};
    storage_sample_t batch[] = {
        {.labels = {la, 2}, .t = t0, .v = 1},
        {.labels = {bad, 1}, .t = t0, .v = 1},
        {.labels = {lb, 2}, .t = t0, .v = 10},
    };
    storage_ref_t refs[3];
    memset(refs, 0, sizeof(refs));
    assert_int_equal(storage_append_refs(s, batch, 3, refs, &r), STORAGE_ERR_BAD_LABELS);
    assert_int_equal(r.accepted, 2);
    assert_true(refs[0].id != 0 && refs[2].id != 0 && refs[0].id != refs[2].id);
    assert_int_equal(refs[1].id, 0);
    storage_ref_t ra = refs[0], rb = refs[2];

    /* By ref: stored in the right series, the same refs come back. */
    for (int i = 0; i < 3; i++)
        batch[i].t = t0 + 10000;
    batch[0].v = 2;
    batch[2].v = 20;
    assert_int_equal(storage_append_refs(s, batch, 3, refs, &r), STORAGE_ERR_BAD_LABELS);
    assert_int_equal(r.accepted, 2);
    assert_memory_equal(&refs[0], &ra, sizeof(ra));
    assert_memory_equal(&refs[2], &rb, sizeof(rb));
    double sum;
    assert_int_equal(count_job(s, "rm", "a", &sum), 2);
    assert_true(sum == 3);
    assert_int_equal(count_job(s, "rm", "b", &sum), 2);
    assert_true(sum == 30);
    /* A valid ref is used as is: labels are not even looked at (the caller's promise is that they
     * are the ref's), which is what makes it cheap. */
    storage_sample_t nolabels = {.labels = {bad, 1}, .t = t0 + 20000, .v = 3};
    storage_ref_t ref = ra;
    assert_int_equal(storage_append_refs(s, &nolabels, 1, &ref, &r), STORAGE_OK);
    assert_int_equal(count_job(s, "rm", "a", &sum), 3);

    /* Refusals by ref are those of the label path, message included. */
    ref = ra;
    assert_int_equal(append_ref(s, "a", t0, 9, &ref, &r), STORAGE_ERR_OUT_OF_ORDER);
    assert_non_null(strstr(r.msg, "out of order"));
    assert_non_null(strstr(r.msg, "job=\"a\""));
    assert_memory_equal(&ref, &ra, sizeof(ra));
    ref = ra;
    assert_int_equal(append_ref(s, "a", fake_now + 120000, 9, &ref, &r), STORAGE_ERR_TOO_NEW);
    assert_memory_equal(&ref, &ra, sizeof(ra));
    assert_int_equal(count_job(s, "rm", "a", &sum), 3);

    /* Refs that name nothing fall back to the labels. */
    storage_ref_t junk[] = {
        {.id = ra.id + 1000, .shard = ra.shard, .slot = ra.slot},
        {.id = ra.id, .shard = INDEX_SHARDS + 3, .slot = 0},
        {.id = ra.id, .shard = ra.shard, .slot = 1u << 30},
        {.id = rb.id, .shard = ra.shard, .slot = ra.slot}, /* another series' id */
    };
    for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
        ref = junk[i];
        assert_int_equal(append_ref(s, "a", t0 + 30000 + 1000 * (int64_t)i, 1, &ref, &r), STORAGE_OK);
        assert_memory_equal(&ref, &ra, sizeof(ra));
    }
    assert_int_equal(count_job(s, "rm", "a", &sum), 7);
    assert_int_equal(count_job(s, "rm", "b", &sum), 2);

    /* A series that expires: its ref goes stale, and its slot is taken by another series. */
    storage_ref_t rold;
    memset(&rold, 0, sizeof(rold));
    assert_int_equal(append_ref(s, "old", fake_now - 3 * 3600 * 1000LL, 1, &rold, &r), STORAGE_OK);
    assert_true(rold.id != 0);
    for (int i = 0; i < 20; i++)
        storage_housekeep(s);
    assert_int_equal(count_job(s, "rm", "old", &sum), 0);
    storage_ref_t ry = {0};
    char job[32];
    for (int i = 0; i < 10000 && ry.shard != rold.shard; i++) {
        snprintf(job, sizeof(job), "y%d", i);
        memset(&ry, 0, sizeof(ry));
        assert_int_equal(append_ref(s, job, t0, 5, &ry, &r), STORAGE_OK);
    }
    assert_int_equal(ry.shard, rold.shard);
    assert_int_equal(ry.slot, rold.slot); /* the freed slot was reused */
    ref = rold;
    assert_int_equal(append_ref(s, "old", t0 + 40000, 7, &ref, &r), STORAGE_OK);
    assert_true(ref.id == rold.id); /* same labels, same id (the index keeps departed ids) */
    assert_false(ref.shard == ry.shard && ref.slot == ry.slot);
    assert_int_equal(count_job(s, "rm", "old", &sum), 1);
    assert_true(sum == 7);
    assert_int_equal(count_job(s, "rm", job, &sum), 1);
    assert_true(sum == 5);
    storage_close(s);
}

static uint64_t head_series(storage_t *s)
{
    arena_t *a = arena_create(0);
    storage_tsdb_stats_t st;
    assert_int_equal(storage_tsdb_stats(s, 10, a, &st), STORAGE_OK);
    arena_destroy(a);
    return st.head.series;
}

/* storage_prepare_refs, the series of an append made ahead of it: refs only where the caller has
 * none (a repeated label array shares its series), no sample stored, a sample with bad labels
 * keeps no ref; the refs are the series the append then fills; a request over the per-request
 * series limit creates nothing; after a crash the WAL replays the series made ahead and the
 * samples appended to them; a series made ahead and never filled is swept like any empty one. */
static void test_prepare_refs(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/prep", dir);
    storage_t *s = open_store(path, 0);
    int64_t t0 = fake_now - 600000;
    label_t la[] = {{"job", "a"}, {"__name__", "rm"}}, lb[] = {{"__name__", "rm"}, {"job", "b"}};
    label_t bad[] = {{"job", "x"}};
    storage_sample_t batch[] = {
        {.labels = {la, 2}, .t = t0, .v = 1},
        {.labels = {la, 2}, .t = t0 + 1000, .v = 2},
        {.labels = {bad, 1}, .t = t0, .v = 1},
        {.labels = {lb, 2}, .t = t0, .v = 10},
    };
    storage_ref_t refs[4], again[4];
    memset(refs, 0, sizeof(refs));
    assert_int_equal(storage_prepare_refs(s, batch, 4, refs), STORAGE_OK);
    assert_true(refs[0].id != 0 && refs[3].id != 0 && refs[0].id != refs[3].id);
    assert_memory_equal(&refs[1], &refs[0], sizeof(refs[0]));
    assert_int_equal(refs[2].id, 0);
    assert_int_equal(head_series(s), 2);
    double sum;
    assert_int_equal(count_job(s, "rm", "a", &sum), 0);
    /* refs the caller has are kept; without them the same series are found, none made */
    memcpy(again, refs, sizeof(refs));
    assert_int_equal(storage_prepare_refs(s, batch, 4, again), STORAGE_OK);
    assert_memory_equal(again, refs, sizeof(refs));
    memset(again, 0, sizeof(again));
    assert_int_equal(storage_prepare_refs(s, batch, 4, again), STORAGE_OK);
    assert_memory_equal(again, refs, sizeof(refs));
    assert_int_equal(head_series(s), 2);
    storage_append_result_t r;
    assert_int_equal(storage_append_refs(s, batch, 4, refs, &r), STORAGE_ERR_BAD_LABELS);
    assert_int_equal(r.accepted, 3);
    assert_int_equal(count_job(s, "rm", "a", &sum), 2);
    assert_true(sum == 3);
    assert_int_equal(count_job(s, "rm", "b", &sum), 1);
    assert_true(sum == 10);

    /* made ahead, never filled: gone after a sweep (once the catalog has its row) */
    label_t ld[] = {{"__name__", "rm"}, {"job", "d"}};
    storage_sample_t d = {.labels = {ld, 2}, .t = t0, .v = 1};
    storage_ref_t rd = {0};
    assert_int_equal(storage_prepare_refs(s, &d, 1, &rd), STORAGE_OK);
    assert_true(rd.id != 0);
    assert_int_equal(head_series(s), 3);
    assert_int_equal(storage_flush(s), STORAGE_OK);
    for (int i = 0; i < 20; i++)
        storage_housekeep(s);
    assert_int_equal(head_series(s), 2);
    storage_close(s);

    /* over the per-request series limit: refused whole, nothing made */
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.max_series_per_request = 1;
    char err[128];
    s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    memset(refs, 0, sizeof(refs));
    assert_int_equal(storage_prepare_refs(s, batch, 4, refs), STORAGE_ERR_LIMIT);
    assert_int_equal(refs[0].id, 0);
    assert_int_equal(refs[3].id, 0);
    assert_int_equal(head_series(s), 0);
    storage_close(s);

    /* kill -9 after an append by refs made ahead: the WAL holds the series before the samples */
    char path2[300];
    snprintf(path2, sizeof(path2), "%s/prep2", dir);
    pid_t pid = fork();
    if (pid == 0) {
        storage_t *c = open_store(path2, 0);
        storage_ref_t rc[4] = {{0}};
        storage_append_result_t cr;
        if (storage_prepare_refs(c, batch, 4, rc) != STORAGE_OK || rc[0].id == 0 || rc[3].id == 0)
            _exit(1);
        _exit(storage_append_refs(c, batch, 4, rc, &cr) == STORAGE_ERR_BAD_LABELS && cr.accepted == 3 ? 0 : 2);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    s = open_store(path2, 0);
    assert_int_equal(count_job(s, "rm", "a", &sum), 2);
    assert_true(sum == 3);
    assert_int_equal(count_job(s, "rm", "b", &sum), 1);
    storage_close(s);
}

/* storage_prepare_refs over a body that starts with new series (after a few misses it stops
 * looking series up first and leaves finding them to the index's creation) and then turns to
 * known ones, new ones after them: every known series gets its own ref, none is made twice, and
 * the WAL replays exactly the series there are. */
static void test_prepare_refs_new_then_known(void **state)
{
    (void)state;
    char path[300];
    snprintf(path, sizeof(path), "%s/prep_streak", dir);
    storage_t *s = open_store(path, 0);
    int64_t t0 = fake_now - 600000;
    enum { KNOWN = 100, FRESH = 150, BODY = KNOWN + FRESH };
    static char vals[BODY][16];
    static label_t ls[BODY][3];
    storage_sample_t smp[BODY];
    /* known series are k0..k99; the body is n0..n19, k0..k99, n20..n149 */
    for (int i = 0; i < BODY; i++) {
        int fresh_no = i < 20 ? i : i - KNOWN;
        if (i >= 20 && i < 20 + KNOWN)
            snprintf(vals[i], sizeof(vals[i]), "k%d", i - 20);
        else
            snprintf(vals[i], sizeof(vals[i]), "n%d", fresh_no);
        ls[i][0] = (label_t){"__name__", "streak"};
        ls[i][1] = (label_t){"job", "j"};
        ls[i][2] = (label_t){"s", vals[i]};
        smp[i] = (storage_sample_t){.labels = {ls[i], 3}, .t = t0, .v = i};
    }
    storage_ref_t known[KNOWN], refs[BODY];
    memset(known, 0, sizeof(known));
    assert_int_equal(storage_prepare_refs(s, smp + 20, KNOWN, known), STORAGE_OK);
    assert_int_equal(head_series(s), KNOWN);
    memset(refs, 0, sizeof(refs));
    assert_int_equal(storage_prepare_refs(s, smp, BODY, refs), STORAGE_OK);
    assert_int_equal(head_series(s), BODY);
    for (int i = 0; i < KNOWN; i++)
        assert_memory_equal(&refs[20 + i], &known[i], sizeof(known[i]));
    for (int i = 0; i < BODY; i++) {
        assert_true(refs[i].id != 0);
        for (int j = 0; j < i; j++)
            assert_true(refs[j].id != refs[i].id);
    }
    storage_append_result_t r;
    assert_int_equal(storage_append_refs(s, smp, BODY, refs, &r), STORAGE_OK);
    assert_int_equal(r.accepted, BODY);
    storage_close(s);
    s = open_store(path, 0);
    assert_int_equal(head_series(s), BODY);
    double sum;
    assert_int_equal(count_job(s, "streak", "j", &sum), BODY);
    assert_true(sum == (double)(BODY - 1) * BODY / 2);
    storage_close(s);
}

/* A push-sized request by refs (storage_append_refs checks and appends its refs in one batch per
 * index shard): valid, stale and missing refs, out-of-order and too-new samples mixed over
 * hundreds of series; the result (first failure in sample order, counts, refs) and what the WAL
 * replays are those of the sample-by-sample path. */
static void test_append_refs_batch(void **state)
{
    enum { N = 600 };
    char path[300];
    snprintf(path, sizeof(path), "%s/refs_batch", dir);
    storage_t *s = open_store(path, 0);
    static label_t ls[N][2];
    static char jobs[N][16];
    storage_sample_t smp[N];
    storage_ref_t refs[N];
    int64_t t0 = fake_now - 600000;
    for (int i = 0; i < N; i++) {
        snprintf(jobs[i], sizeof(jobs[i]), "j%d", i);
        ls[i][0] = (label_t){"__name__", "rb"};
        ls[i][1] = (label_t){"job", jobs[i]};
        smp[i] = (storage_sample_t){.labels = {ls[i], 2}, .t = t0, .v = 1};
    }
    memset(refs, 0, sizeof(refs));
    storage_append_result_t r;
    assert_int_equal(storage_append_refs(s, smp, N, refs, &r), STORAGE_OK);
    assert_int_equal(r.accepted, N);
    storage_ref_t first[N];
    memcpy(first, refs, sizeof(refs));
    /* Second request: samples 3 and 11 out of order; every 10th ref stale (another series' id),
     * every 7th missing. */
    for (int i = 0; i < N; i++) {
        smp[i].t = i == 3 ? t0 - 1000 : t0 + 10000;
        smp[i].v = 2;
        if (i % 10 == 0)
            refs[i].id = first[(i + 1) % N].id;
        if (i % 7 == 0)
            memset(&refs[i], 0, sizeof(refs[i]));
    }
    smp[11].t = t0 - 2000;
    assert_int_equal(storage_append_refs(s, smp, N, refs, &r), STORAGE_ERR_OUT_OF_ORDER);
    assert_int_equal(r.failed, 2);
    assert_int_equal(r.first_failed, 3);
    assert_int_equal(r.accepted, N - 2);
    assert_non_null(strstr(r.msg, "job=\"j3\""));
    for (int i = 0; i < N; i++)
        assert_memory_equal(&refs[i], &first[i], sizeof(refs[i])); /* resolved again where stale */
    size_t n, series;
    double sum;
    totals(s, "rb", &n, &sum, &series);
    assert_int_equal(series, N);
    assert_int_equal(n, 2 * N - 2);
    assert_true(sum == N + 2.0 * (N - 2));
    storage_close(s);
    /* The WAL holds what was applied, nothing else. */
    s = open_store(path, 0);
    totals(s, "rb", &n, &sum, &series);
    assert_int_equal(series, N);
    assert_int_equal(n, 2 * N - 2);
    assert_true(sum == N + 2.0 * (N - 2));
    storage_close(s);
}

/* A series the catalog knows but the head does not hold after a restart (here its snapshot and
 * WAL are gone; an expired series is the usual case) keeps its id when its labels return, through
 * the ids the catalog hands the index at startup; a new series still gets a new id. */
static void test_series_id_from_catalog_only(void **state)
{
    char path[300], cmd[700];
    snprintf(path, sizeof(path), "%s/idcat", dir);
    storage_t *s = open_store(path, 0);
    storage_append_result_t r;
    storage_ref_t ra = {0}, rb = {0};
    assert_int_equal(append_ref(s, "a", fake_now - 1000, 1, &ra, &r), STORAGE_OK);
    assert_int_equal(append_ref(s, "b", fake_now - 1000, 1, &rb, &r), STORAGE_OK);
    assert_true(ra.id != 0 && rb.id != 0 && ra.id != rb.id);
    storage_close(s);
    snprintf(cmd, sizeof(cmd), "rm -rf %s/wal %s/head.snapshot*", path, path);
    assert_int_equal(system(cmd), 0);
    s = open_store(path, 0);
    assert_int_equal(index_num_series(head_index(storage_head(s))), 0); /* in the catalog only */
    storage_ref_t ref = {0};
    assert_int_equal(append_ref(s, "b", fake_now, 2, &ref, &r), STORAGE_OK);
    assert_true(ref.id == rb.id);
    ref = (storage_ref_t){0};
    assert_int_equal(append_ref(s, "new", fake_now, 2, &ref, &r), STORAGE_OK);
    assert_true(ref.id != ra.id && ref.id != rb.id);
    ref = (storage_ref_t){0};
    assert_int_equal(append_ref(s, "a", fake_now, 2, &ref, &r), STORAGE_OK);
    assert_true(ref.id == ra.id);
    storage_close(s);
}

/* Checks the buckets of series id at the first resolution: n of them, bucket k at ts[k] with
 * count[k] samples summing to sum[k]. */
static void expect_buckets(rollup_t *ru, uint64_t id, size_t n, const int64_t *ts, const uint64_t *count,
                           const double *sum)
{
    rollup_buckets_t b = {0};
    assert_int_equal(rollup_read(ru, id, 0, INT64_MIN, INT64_MAX, &b), 0);
    assert_int_equal(b.n, n);
    for (size_t k = 0; k < n; k++) {
        assert_int_equal(b.v[k].ts, ts[k]);
        assert_int_equal(b.v[k].count, count[k]);
        assert_true(b.v[k].sum == sum[k]);
    }
    rollup_buckets_free(&b);
}

/* The roll-up hint each head series keeps (append_rollup): it goes stale when the roll-up evicts
 * the series' state and the record is handed to other series, and it leaves with the head series
 * when that expires; neither mixes data between series or touches freed memory (ASan build), and
 * every sample lands in its own series' buckets. */
static void test_rollup_hints(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/hints", dir);
    storage_options_t o;
    options_with_rollups(&o, path);
    int64_t now0 = fake_now;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    storage_append_result_t r;
    int64_t base = fake_now - 3600 * 1000LL; /* a whole minute */
    assert_int_equal(base % 60000, 0);
    storage_ref_t ra = {0}, rb = {0};
    assert_int_equal(append_ref(s, "a", base, 1, &ra, &r), STORAGE_OK);
    assert_int_equal(append_ref(s, "a", base + 10000, 2, &ra, &r), STORAGE_OK);
    /* B moves the roll-up's newest time 10 minutes on: a writer cycle closes A's bucket and
     * evicts A's state, so the hint A's head series holds is stale (the rule: a state stays
     * while a bucket is open or until a coarsest resolution passes its last sample). */
    assert_int_equal(append_ref(s, "b", base + 600000, 1, &rb, &r), STORAGE_OK);
    assert_int_equal(storage_flush(s), STORAGE_OK);
    /* A at once, through the hint to its freed state record (still free, still with A's id). */
    storage_ref_t ra0 = ra;
    assert_int_equal(append_ref(s, "a", base + 610000, 4, &ra, &r), STORAGE_OK);
    assert_int_equal(append_ref(s, "b", base + 1200000, 1, &rb, &r), STORAGE_OK);
    assert_int_equal(storage_flush(s), STORAGE_OK); /* evicted again */
    /* New series take the freed state records (A's among them: 256 series over 64 shards). */
    enum { N = 256 };
    storage_ref_t rn[N];
    char job[32];
    for (int i = 0; i < N; i++) {
        snprintf(job, sizeof(job), "n%d", i);
        memset(&rn[i], 0, sizeof(rn[i]));
        assert_int_equal(append_ref(s, job, base + 600000, 100 + i, &rn[i], &r), STORAGE_OK);
    }
    /* A again, by ref, through its stale hint; twice, the second through the renewed one. */
    assert_int_equal(append_ref(s, "a", base + 1230000, 5, &ra, &r), STORAGE_OK);
    assert_int_equal(append_ref(s, "a", base + 1240000, 6, &ra, &r), STORAGE_OK);
    assert_memory_equal(&ra, &ra0, sizeof(ra));
    /* Everything leaves the head (the catalog has read the series back first). */
    fake_now += 3 * 3600 * 1000LL;
    assert_int_equal(storage_flush(s), STORAGE_OK);
    for (int i = 0; i < 20; i++)
        storage_housekeep(s);
    head_stats_t hs;
    head_get_stats(storage_head(s), &hs);
    assert_int_equal(hs.series, 0);
    /* A comes back: a new head series with an empty slot, by its stale ref and by labels. */
    int64_t base2 = fake_now - 600000;
    assert_int_equal(append_ref(s, "a", base2, 7, &ra, &r), STORAGE_OK);
    assert_int_equal(ra.id, ra0.id);
    assert_int_equal(append_ref(s, "a", base2 + 10000, 8, &ra, &r), STORAGE_OK);
    storage_close(s);

    catalog_t *cat;
    rollup_t *ru = rollups_of(path, &cat);
    expect_buckets(ru, ra.id, 4, (int64_t[]){base, base + 600000, base + 1200000, base2}, (uint64_t[]){2, 1, 2, 2},
                   (double[]){3, 4, 11, 15});
    expect_buckets(ru, rb.id, 2, (int64_t[]){base + 600000, base + 1200000}, (uint64_t[]){1, 1}, (double[]){1, 1});
    for (int i = 0; i < N; i++)
        expect_buckets(ru, rn[i].id, 1, (int64_t[]){base + 600000}, (uint64_t[]){1}, (double[]){100 + i});
    rollup_close(ru);
    catalog_close(cat);
    fake_now = now0;
}

/* Recovery replays the WAL from the snapshot's cut into the roll-ups, which take from it only what
 * is newer than their checkpointed states; a snapshot checkpoints them first, so a crash after it
 * loses no sample from the roll-ups however rare their own checkpoints are (here there are none:
 * no writer thread, and the cycles below write closed buckets and their states only). */
static void test_snapshot_checkpoints_rollups(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/rollckpt", dir);
    storage_options_t o;
    options_with_rollups(&o, path);
    int64_t t0 = fake_now - 600 * 1000LL;
    assert_int_equal(t0 % 60000, 0);
    /* 3.5 minutes at 10 s with a writer cycle at each minute's first sample, the snapshot, half a
     * minute more */
    crash_after_snapshot(&o, "rc", t0, 10000, 21, 3, 6);
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    index_refs_t refs = {0};
    assert_int_equal(index_select(head_index(storage_head(s)), NULL, 0, &refs), INDEX_OK);
    assert_int_equal(refs.n, 1);
    uint64_t id = refs.v[0].id;
    index_refs_free(&refs);
    storage_close(s);
    catalog_t *cat;
    rollup_t *ru = rollups_of(path, &cat);
    /* minute k holds samples 6k..6k+5 (values = their numbers); the last one is still open */
    expect_buckets(ru, id, 4, (int64_t[]){t0, t0 + 60000, t0 + 120000, t0 + 180000}, (uint64_t[]){6, 6, 6, 6},
                   (double[]){15, 51, 87, 123});
    rollup_close(ru);
    catalog_close(cat);
}

typedef struct {
    storage_t *s;
    storage_rollup_job_t *job;
} job_run_t;

static void *run_job(void *ud)
{
    job_run_t *j = ud;
    storage_append_rollups(j->s, j->job);
    return NULL;
}

/* Deferred roll-up steps (storage_append_refs_defer) run in the order of their appends, whoever
 * runs them first: the roll-up ignores a sample older than one it took, so the second append's
 * job, started first on another thread, must wait for the first's. The appends themselves are
 * complete before their jobs run (refs, result, head). */
static void test_rollup_jobs_in_order(void **state)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/jobs", dir);
    storage_options_t o;
    storage_options_default(&o);
    o.path = path;
    o.rollups = "1m:1d";
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.snapshot_interval_ms = -1;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    int64_t base = fake_now - 3600 * 1000LL; /* a whole minute */
    label_t l[2] = {{"job", "j"}, {"__name__", "deferred"}};
    storage_sample_t s1 = {.labels = {l, 2}, .t = base + 1000, .v = 1};
    storage_sample_t s2 = {.labels = {l, 2}, .t = base + 2000, .v = 2};
    storage_ref_t ref = {0};
    storage_append_result_t r;
    storage_rollup_job_t *j1, *j2;
    assert_int_equal(storage_append_refs_defer(s, &s1, 1, &ref, &r, &j1), STORAGE_OK);
    assert_int_not_equal(ref.id, 0);
    assert_int_equal(r.accepted, 1);
    assert_int_equal(storage_append_refs_defer(s, &s2, 1, &ref, &r, &j2), STORAGE_OK);
    assert_non_null(j1);
    assert_non_null(j2);
    size_t n, series;
    double sum;
    totals(s, "deferred", &n, &sum, &series);
    assert_int_equal(n, 2); /* in the head already */
    job_run_t second = {s, j2};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_job, &second), 0);
    usleep(20000); /* give the second job the chance to (wrongly) go first; no threshold */
    storage_append_rollups(s, j1);
    pthread_join(th, NULL);
    /* A refused append leaves no job; NULL runs as nothing. */
    storage_rollup_job_t *j3 = (storage_rollup_job_t *)&j3;
    assert_int_equal(storage_append_refs_defer(s, &s1, 1, &ref, &r, &j3), STORAGE_ERR_OUT_OF_ORDER);
    assert_null(j3);
    storage_append_rollups(s, NULL);
    uint64_t id = ref.id;
    storage_close(s);

    catalog_t *cat = catalog_open(path, err, sizeof(err));
    assert_non_null(cat);
    rollup_config_t cfg = {.resolutions = "1m:1d", .no_thread = true, .clock_ms = clock_fn};
    rollup_t *ru = rollup_open(cat, &cfg, err, sizeof(err));
    assert_non_null(ru);
    expect_buckets(ru, id, 1, (int64_t[]){base}, (uint64_t[]){2}, (double[]){3});
    rollup_close(ru);
    catalog_close(cat);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_rules_and_limits),
        cmocka_unit_test(test_reopen_snapshot_and_wal),
        cmocka_unit_test(test_corrupt_snapshot_series_from_catalog),
        cmocka_unit_test(test_salvage_snapshot),
        cmocka_unit_test(test_series_ids_stable),
        cmocka_unit_test(test_series_per_request_distinct),
        cmocka_unit_test(test_state_clients),
        cmocka_unit_test(test_shared_label_arrays),
        cmocka_unit_test(test_append_refs),
        cmocka_unit_test(test_append_refs_batch),
        cmocka_unit_test(test_prepare_refs),
        cmocka_unit_test(test_prepare_refs_new_then_known),
        cmocka_unit_test(test_series_id_from_catalog_only),
        cmocka_unit_test(test_rollup_hints),
        cmocka_unit_test(test_snapshot_checkpoints_rollups),
        cmocka_unit_test(test_rollup_jobs_in_order),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
