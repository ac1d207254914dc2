/* Unit tests for storage/catalog.c: ids survive a reopen, label lookups (with time bounds),
 * pending rows visible to catalog_get_labels, catalog_load, series queued by reference, pairs
 * shared across write chunks, a version-1 file converted on open, the encoded pending queue over
 * many blocks (and a failed write putting it back), rows of a rolled-back transaction kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "storage/catalog.h"

static char *make_dir(void)
{
    char *d = strdup("/tmp/sluice-catalog-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void remove_dir(char *d)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
    free(d);
}

static catalog_t *open_cat(const char *dir)
{
    char err[256] = "";
    catalog_t *cat = catalog_open(dir, err, sizeof(err));
    if (!cat)
        fail_msg("catalog_open: %s", err);
    return cat;
}

/* Three series: two of metric "up" (jobs a, b), one of "lag" (job a), seen at different times. */
static void add_three(catalog_t *cat, uint64_t ids[3])
{
    label_t l1[] = {{"__name__", "up"}, {"instance", "h1"}, {"job", "a"}};
    label_t l2[] = {{"__name__", "up"}, {"instance", "h2"}, {"job", "b"}};
    label_t l3[] = {{"__name__", "lag"}, {"job", "a"}, {"topic", "t\"x\n"}};
    labels_t ls[3] = {{l1, 3}, {l2, 3}, {l3, 3}};
    for (int i = 0; i < 3; i++) {
        ids[i] = catalog_next_id(cat);
        assert_int_equal(catalog_add_series(cat, ids[i], &ls[i], 1000 * (i + 1)), 0);
    }
}

static void test_ids_and_lookups(void **state)
{
    char *dir = make_dir();
    catalog_t *cat = open_cat(dir);
    uint64_t ids[3];
    add_three(cat, ids);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[2], 3);

    /* Pending rows: get_labels sees them, lookups (committed only) do not yet. */
    arena_t *a = arena_create(0);
    labels_t ls;
    assert_int_equal(catalog_get_labels(cat, ids[2], a, &ls), 0);
    assert_int_equal(ls.n, 3);
    assert_string_equal(ls.v[2].value, "t\"x\n");
    catalog_ids_t got = {0};
    label_t q_up = {"__name__", "up"};
    assert_int_equal(catalog_series_by_labels(cat, &q_up, 1, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 0);

    assert_int_equal(catalog_flush(cat), 0);
    assert_int_equal(catalog_touch_series(cat, ids[0], 50000), 0);
    assert_int_equal(catalog_flush(cat), 0);

    assert_int_equal(catalog_series_by_labels(cat, &q_up, 1, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 2);
    assert_int_equal(got.v[0], ids[0]);
    assert_int_equal(got.v[1], ids[1]);
    got.n = 0;
    label_t q_and[] = {{"__name__", "up"}, {"job", "a"}};
    assert_int_equal(catalog_series_by_labels(cat, q_and, 2, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 1);
    assert_int_equal(got.v[0], ids[0]);
    got.n = 0;
    /* Time bounds: series 2 was seen only at 2000; series 1 until 50000 (touch). */
    assert_int_equal(catalog_series_by_labels(cat, &q_up, 1, 10000, 60000, &got), 0);
    assert_int_equal(got.n, 1);
    assert_int_equal(got.v[0], ids[0]);
    got.n = 0;
    assert_int_equal(catalog_series_by_labels(cat, &q_up, 1, 0, 500, &got), 0);
    assert_int_equal(got.n, 0);
    assert_int_equal(catalog_series_with_name(cat, "topic", INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 1);
    assert_int_equal(got.v[0], ids[2]);
    got.n = 0;

    const char **vals;
    size_t n;
    assert_int_equal(catalog_label_values(cat, "job", INT64_MIN, INT64_MAX, a, &vals, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(vals[0], "a");
    assert_string_equal(vals[1], "b");
    assert_int_equal(catalog_label_values(cat, "job", 2500, 3500, a, &vals, &n), 0); /* only series 3 */
    assert_int_equal(n, 1);
    assert_string_equal(vals[0], "a");
    assert_int_equal(catalog_label_values(cat, "nope", INT64_MIN, INT64_MAX, a, &vals, &n), 0);
    assert_int_equal(n, 0);
    const char **names;
    assert_int_equal(catalog_label_names(cat, INT64_MIN, INT64_MAX, a, &names, &n), 0);
    assert_int_equal(n, 4);
    assert_string_equal(names[0], "__name__");
    assert_string_equal(names[1], "instance");
    assert_string_equal(names[2], "job");
    assert_string_equal(names[3], "topic");
    assert_int_equal(catalog_label_names(cat, 1500, 2500, a, &names, &n), 0); /* only series 2 */
    assert_int_equal(n, 3);
    assert_string_equal(names[2], "job");

    assert_int_equal(catalog_get_labels(cat, ids[1], a, &ls), 0);
    assert_int_equal(ls.n, 3);
    assert_string_equal(ls.v[0].value, "up");
    assert_string_equal(ls.v[1].value, "h2");
    assert_int_equal(catalog_get_labels(cat, 999, a, &ls), 1);

    /* Unsorted labels are refused. */
    label_t bad[] = {{"job", "a"}, {"__name__", "up"}};
    labels_t badls = {bad, 2};
    assert_int_equal(catalog_add_series(cat, catalog_next_id(cat), &badls, 0), -1);
    catalog_ids_free(&got);
    arena_destroy(a);
    catalog_close(cat);
    remove_dir(dir);
}

typedef struct {
    uint64_t ids[8];
    char first_label[8][64];
    int64_t last_seen[8];
    int n;
} loaded_t;

static int on_load(void *ud, uint64_t id, const labels_t *ls, int64_t first_t, int64_t last_t)
{
    loaded_t *l = ud;
    assert_true(l->n < 8);
    l->ids[l->n] = id;
    snprintf(l->first_label[l->n], 64, "%s=%s", ls->v[0].name, ls->v[0].value);
    l->last_seen[l->n] = last_t;
    l->n++;
    return 0;
}

static void test_reopen(void **state)
{
    char *dir = make_dir();
    catalog_t *cat = open_cat(dir);
    uint64_t ids[3];
    add_three(cat, ids);
    uint64_t unused = catalog_next_id(cat); /* handed out, never added */
    assert_int_equal(unused, 4);
    /* An id that came from elsewhere (WAL replay) bumps the counter. */
    label_t l[] = {{"__name__", "x"}};
    labels_t ls = {l, 1};
    assert_int_equal(catalog_add_series(cat, 10, &ls, 5), 0);
    assert_int_equal(catalog_next_id(cat), 11);
    catalog_close(cat); /* flushes pending */

    cat = open_cat(dir);
    loaded_t got = {0};
    assert_int_equal(catalog_load(cat, on_load, &got), 0);
    assert_int_equal(got.n, 4);
    assert_int_equal(got.ids[0], 1);
    assert_int_equal(got.ids[3], 10);
    assert_string_equal(got.first_label[2], "__name__=lag");
    assert_int_equal(got.last_seen[1], 2000);
    assert_true(catalog_next_id(cat) > 10);
    /* Adding an existing id again keeps the labels, widens the times. */
    label_t other[] = {{"__name__", "other"}};
    labels_t ols = {other, 1};
    assert_int_equal(catalog_add_series(cat, 1, &ols, 7), 0);
    assert_int_equal(catalog_flush(cat), 0);
    arena_t *a = arena_create(0);
    labels_t back;
    assert_int_equal(catalog_get_labels(cat, 1, a, &back), 0);
    assert_string_equal(back.v[0].value, "up");
    arena_destroy(a);
    catalog_close(cat);
    remove_dir(dir);
}

/* A label source standing in for the head's index: series i has labels {__name__="m", i="<i>"}
 * while present[i]; calls are counted. */
typedef struct {
    bool present[8];
    int calls;
} source_t;

static int source_labels(void *ud, uint64_t id, uint64_t hint, arena_t *a, labels_t *out)
{
    source_t *src = ud;
    src->calls++;
    assert_int_equal(hint, id * 100); /* handed back as given */
    if (id >= 8 || !src->present[id])
        return 1;
    label_t *v = arena_alloc(a, 2 * sizeof(*v));
    char *num = arena_alloc(a, 8);
    snprintf(num, 8, "%u", (unsigned)id);
    v[0] = (label_t){"__name__", "m"};
    v[1] = (label_t){"i", num};
    *out = (labels_t){v, 2};
    return 0;
}

static void test_add_by_reference(void **state)
{
    char *dir = make_dir();
    catalog_t *cat = open_cat(dir);
    source_t src = {0};
    catalog_set_label_source(cat, source_labels, &src);
    assert_true(catalog_is_written(cat, 1));
    for (uint64_t id = 1; id <= 3; id++) {
        assert_int_equal(catalog_next_id(cat), id);
        src.present[id] = true;
        assert_int_equal(catalog_add_series_ref(cat, id, id * 100, 1000 * (int64_t)id), 0);
    }
    /* Nothing written yet: the owner must keep series 1 and everything newer. */
    assert_false(catalog_is_written(cat, 1));
    assert_false(catalog_is_written(cat, 3));
    arena_t *a = arena_create(0);
    labels_t back;
    /* A pending reference is answered by the source. */
    assert_int_equal(catalog_get_labels(cat, 2, a, &back), 0);
    assert_int_equal(back.n, 2);
    assert_string_equal(back.v[1].value, "2");
    assert_int_equal(catalog_flush(cat), 0);
    assert_true(catalog_is_written(cat, 3));
    int calls = src.calls;
    /* Written rows are read from the database, not the source. */
    src.present[2] = false;
    arena_reset(a);
    assert_int_equal(catalog_get_labels(cat, 2, a, &back), 0);
    assert_string_equal(back.v[1].value, "2");
    assert_int_equal(src.calls, calls);
    label_t eq[] = {{"i", "3"}};
    catalog_ids_t ids = {0};
    assert_int_equal(catalog_series_by_labels(cat, eq, 1, INT64_MIN, INT64_MAX, &ids), 0);
    assert_int_equal(ids.n, 1);
    assert_int_equal(ids.v[0], 3);
    catalog_ids_free(&ids);

    /* A series its owner let go before the writer read it is skipped, not written empty. */
    assert_int_equal(catalog_add_series_ref(cat, 4, 400, 4000), 0);
    src.present[5] = true;
    assert_int_equal(catalog_add_series_ref(cat, 5, 500, 5000), 0);
    assert_false(catalog_is_written(cat, 4));
    assert_true(catalog_is_written(cat, 3));
    assert_int_equal(catalog_flush(cat), 0);
    arena_reset(a);
    assert_int_equal(catalog_get_labels(cat, 4, a, &back), 1);
    assert_int_equal(catalog_get_labels(cat, 5, a, &back), 0);
    assert_string_equal(back.v[1].value, "5");
    arena_destroy(a);
    catalog_close(cat);

    /* The rows survive a reopen with their first_seen. */
    cat = open_cat(dir);
    loaded_t got = {0};
    assert_int_equal(catalog_load(cat, on_load, &got), 0);
    assert_int_equal(got.n, 4);
    assert_int_equal(got.ids[3], 5);
    assert_int_equal(got.last_seen[0], 1000);
    assert_string_equal(got.first_label[1], "__name__=m");
    assert_true(catalog_next_id(cat) > 5);
    catalog_close(cat);
    remove_dir(dir);
}

/* Rows written into a transaction that then rolls back (the roll-up writer's, when a later step
 * of it fails) are not lost: they go back to the pending list and the next flush writes them.
 * Until the transaction settles, they are not reported written and their labels are still found. */
static void test_rollback_keeps_rows(void **state)
{
    char *dir = make_dir();
    catalog_t *cat = open_cat(dir);
    source_t src = {0};
    catalog_set_label_source(cat, source_labels, &src);
    uint64_t ids[3];
    add_three(cat, ids);
    uint64_t ref = catalog_next_id(cat);
    src.present[ref] = true;
    assert_int_equal(catalog_add_series_ref(cat, ref, ref * 100, 5000), 0);

    sqlite3 *db = catalog__write_db(cat);
    catalog__write_lock(cat);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(catalog__write_pending(cat, 0, NULL), 0);
    /* In flight: not committed, so neither written nor missing. */
    assert_false(catalog_is_written(cat, ref));
    arena_t *a = arena_create(0);
    labels_t back;
    assert_int_equal(catalog_get_labels(cat, ids[2], a, &back), 0);
    assert_string_equal(back.v[0].value, "lag");
    assert_int_equal(catalog_get_labels(cat, ref, a, &back), 0);
    assert_int_equal(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    catalog__settle_pending(cat, false);
    catalog__write_unlock(cat);

    assert_false(catalog_is_written(cat, ref));
    arena_reset(a);
    assert_int_equal(catalog_get_labels(cat, ids[0], a, &back), 0);
    assert_string_equal(back.v[1].value, "h1");
    assert_int_equal(catalog_flush(cat), 0);
    assert_true(catalog_is_written(cat, ref));
    arena_destroy(a);
    catalog_close(cat);

    cat = open_cat(dir);
    loaded_t got = {0};
    assert_int_equal(catalog_load(cat, on_load, &got), 0);
    assert_int_equal(got.n, 4);
    catalog_close(cat);
    remove_dir(dir);
}

static int64_t sql_int(const char *path, const char *sql)
{
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

/* More series than one write chunk (4,096), sharing pairs across chunks and within them: every
 * posting is written once, under one pair id per distinct pair. */
static void test_pairs_across_chunks(void **state)
{
    char *dir = make_dir();
    catalog_t *cat = open_cat(dir);
    enum { N = 9000 };
    for (int i = 0; i < N; i++) {
        char num[16], grp[16];
        snprintf(num, sizeof(num), "%d", i);
        snprintf(grp, sizeof(grp), "g%d", i % 7);
        label_t l[] = {{"__name__", i % 2 ? "odd" : "even"}, {"g", grp}, {"i", num}, {"job", "flink"}};
        labels_t ls = {l, 4};
        assert_int_equal(catalog_add_series(cat, catalog_next_id(cat), &ls, 1000), 0);
    }
    assert_int_equal(catalog_flush(cat), 0);
    catalog_ids_t got = {0};
    label_t q[] = {{"g", "g3"}, {"job", "flink"}};
    assert_int_equal(catalog_series_by_labels(cat, q, 2, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, (N + 3) / 7); /* i = 3, 10, 17, ... */
    for (size_t k = 0; k < got.n; k++)
        assert_int_equal(got.v[k], 4 + 7 * k); /* ids start at 1 */
    got.n = 0;
    label_t q2[] = {{"__name__", "odd"}, {"i", "8001"}};
    assert_int_equal(catalog_series_by_labels(cat, q2, 2, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 1);
    assert_int_equal(got.v[0], 8002);
    got.n = 0;
    assert_int_equal(catalog_series_with_name(cat, "g", INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, N);
    catalog_ids_free(&got);
    char path[512];
    snprintf(path, sizeof(path), "%s/sluice.db", dir);
    /* 2 names + 7 groups + N numbers + 1 job; the view shows every posting once. */
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_pair"), 2 + 7 + N + 1);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_index"), 4 * N);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_index WHERE name = 'g' AND value = 'g3'"), (N + 3) / 7);
    assert_int_equal(sql_int(path, "SELECT value FROM meta WHERE key = 'catalog_version'"), 2);
    catalog_close(cat);
    remove_dir(dir);
}

/* A file written by a version-1 sluice (postings as (name, value, series_id) rows of a table
 * called label_index) opens as version 2 with the same answers. */
static void test_converts_version_1(void **state)
{
    char *dir = make_dir();
    char path[512];
    snprintf(path, sizeof(path), "%s/sluice.db", dir);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    const char *v1 =
        "PRAGMA page_size=16384; PRAGMA journal_mode=WAL;"
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;"
        "INSERT INTO meta(key, value) VALUES('catalog_version', 1);"
        "CREATE TABLE series(id INTEGER PRIMARY KEY, metric TEXT NOT NULL, labels TEXT NOT NULL, enc BLOB NOT NULL,"
        " first_seen INTEGER NOT NULL, last_seen INTEGER NOT NULL);"
        "CREATE INDEX series_metric ON series(metric);"
        "CREATE TABLE label_index(name TEXT NOT NULL, value TEXT NOT NULL, series_id INTEGER NOT NULL,"
        " PRIMARY KEY(name, value, series_id)) WITHOUT ROWID;"
        /* enc of {__name__="up", job="a"} and {__name__="up", job="b"} */
        "INSERT INTO series VALUES(1, 'up', '{job=\"a\"}', x'085f5f6e616d655f5f027570036a6f620161', 1000, 1000);"
        "INSERT INTO series VALUES(2, 'up', '{job=\"b\"}', x'085f5f6e616d655f5f027570036a6f620162', 2000, 2000);"
        "INSERT INTO label_index VALUES('__name__', 'up', 1), ('job', 'a', 1), ('__name__', 'up', 2),"
        " ('job', 'b', 2);";
    char *msg = NULL;
    if (sqlite3_exec(db, v1, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("v1 schema: %s", msg);
    sqlite3_close(db);

    catalog_t *cat = open_cat(dir);
    assert_int_equal(sql_int(path, "SELECT value FROM meta WHERE key = 'catalog_version'"), 2);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'label_index' AND type = 'view'"),
                     1);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_index"), 4);
    catalog_ids_t got = {0};
    label_t q = {"__name__", "up"};
    assert_int_equal(catalog_series_by_labels(cat, &q, 1, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 2);
    got.n = 0;
    label_t qb = {"job", "b"};
    assert_int_equal(catalog_series_by_labels(cat, &qb, 1, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 1);
    assert_int_equal(got.v[0], 2);
    got.n = 0;
    arena_t *a = arena_create(0);
    const char **vals;
    size_t n;
    assert_int_equal(catalog_label_values(cat, "job", 1500, 2500, a, &vals, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(vals[0], "b");
    /* New series after the conversion share the converted pairs. */
    label_t l3[] = {{"__name__", "up"}, {"job", "c"}};
    labels_t ls3 = {l3, 2};
    assert_int_equal(catalog_next_id(cat), 3);
    assert_int_equal(catalog_add_series(cat, 3, &ls3, 3000), 0);
    assert_int_equal(catalog_flush(cat), 0);
    assert_int_equal(catalog_series_by_labels(cat, &q, 1, INT64_MIN, INT64_MAX, &got), 0);
    assert_int_equal(got.n, 3);
    assert_int_equal(catalog_label_values(cat, "job", INT64_MIN, INT64_MAX, a, &vals, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(vals[2], "c");
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_pair"), 4);
    catalog_ids_free(&got);
    arena_destroy(a);
    catalog_close(cat);
    /* Opening again changes nothing. */
    cat = open_cat(dir);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_index"), 6);
    catalog_close(cat);
    remove_dir(dir);
}

/* A label source for many series: series id has {__name__="q", i="<id>"} and was queued with
 * hint_of(id), which it checks; ids in `gone` are not there. */
static uint64_t hint_of(uint64_t id)
{
    return (id % 16) << 32 | (id * 7919) % (1u << 24);
}

typedef struct {
    uint64_t gone;
    int calls;
} many_source_t;

static int many_labels(void *ud, uint64_t id, uint64_t hint, arena_t *a, labels_t *out)
{
    many_source_t *src = ud;
    src->calls++;
    assert_int_equal(hint, hint_of(id));
    if (id == src->gone)
        return 1;
    label_t *v = arena_alloc(a, 2 * sizeof(*v));
    char *num = arena_alloc(a, 24);
    snprintf(num, 24, "%llu", (unsigned long long)id);
    v[0] = (label_t){"__name__", "q"};
    v[1] = (label_t){"i", num};
    *out = (labels_t){v, 2};
    return 0;
}

/* A catalog in dir with src as its label source; path gets the database file's name. */
static catalog_t *open_many(const char *dir, char *path, size_t pathlen, many_source_t *src)
{
    snprintf(path, pathlen, "%s/sluice.db", dir);
    catalog_t *cat = open_cat(dir);
    catalog_set_label_source(cat, many_labels, src);
    return cat;
}

/* The pending queue over many blocks: references queued out of id order with times that repeat,
 * jump and go negative, copies and touches among them. Every entry comes back as queued (labels
 * of pending ids, rows and first/last seen after the flush); a write that fails puts the whole
 * batch back, and the next flush writes it. */
static void test_queue_many_entries(void **state)
{
    char *dir = make_dir();
    char path[512];
    many_source_t src = {0};
    catalog_t *cat = open_many(dir, path, sizeof(path), &src);
    enum { N = 30000 };
    static uint64_t ids[N];
    static int64_t ts[N];
    for (int i = 0; i < N; i++)
        ids[i] = catalog_next_id(cat);
    for (int i = 0; i + 1 < N; i += 3) { /* queued out of order, as concurrent pushes do */
        uint64_t x = ids[i];
        ids[i] = ids[i + 1];
        ids[i + 1] = x;
    }
    for (int i = 0; i < N; i++) {
        ts[i] = (int64_t)(i / 100) * 10000 - 50000 + (i % 1000 == 7 ? 123456789012 : 0);
        if (i % 1000 == 500) {
            char num[24];
            snprintf(num, sizeof(num), "%llu", (unsigned long long)ids[i]);
            label_t l[] = {{"__name__", "q"}, {"i", num}};
            labels_t ls = {l, 2};
            assert_int_equal(catalog_add_series(cat, ids[i], &ls, ts[i]), 0);
        } else {
            assert_int_equal(catalog_add_series_ref(cat, ids[i], hint_of(ids[i]), ts[i]), 0);
        }
        if (i % 777 == 0)
            assert_int_equal(catalog_touch_series(cat, ids[i], ts[i] + 5), 0);
    }
    assert_false(catalog_is_written(cat, ids[N - 1]));
    /* Pending labels: references through the source, copies from the queue. */
    arena_t *a = arena_create(0);
    labels_t back;
    int probe[] = {0, 1, 2, 500, 4999, 15500, N - 1};
    for (size_t k = 0; k < sizeof(probe) / sizeof(probe[0]); k++) {
        arena_reset(a);
        int calls = src.calls;
        assert_int_equal(catalog_get_labels(cat, ids[probe[k]], a, &back), 0);
        assert_int_equal(back.n, 2);
        assert_int_equal(strtoull(back.v[1].value, NULL, 10), ids[probe[k]]);
        assert_int_equal(src.calls - calls, probe[k] % 1000 == 500 ? 0 : 1);
    }

    /* A write that fails half-way (a trigger refuses one row): nothing is lost. */
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char sql[256];
    snprintf(sql, sizeof(sql),
             "CREATE TRIGGER refuse BEFORE INSERT ON series WHEN NEW.id = %llu BEGIN SELECT RAISE(ABORT, 'no'); END",
             (unsigned long long)ids[N / 2]);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(catalog_flush(cat), -1);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM series"), 0);
    assert_false(catalog_is_written(cat, ids[0]));
    arena_reset(a);
    assert_int_equal(catalog_get_labels(cat, ids[N - 2], a, &back), 0);
    assert_int_equal(strtoull(back.v[1].value, NULL, 10), ids[N - 2]);
    /* Queued after the failure: written after the ones put back. */
    uint64_t late = catalog_next_id(cat);
    assert_int_equal(catalog_add_series_ref(cat, late, hint_of(late), 42), 0);
    assert_int_equal(sqlite3_exec(db, "DROP TRIGGER refuse", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_int_equal(catalog_flush(cat), 0);
    assert_true(catalog_is_written(cat, late));
    assert_int_equal(sql_int(path, "SELECT count(*) FROM series"), N + 1);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM label_posting"), 2 * (N + 1));
    for (int i = 0; i < N; i += 97) {
        snprintf(sql, sizeof(sql), "SELECT first_seen FROM series WHERE id = %llu", (unsigned long long)ids[i]);
        assert_int_equal(sql_int(path, sql), ts[i]);
        snprintf(sql, sizeof(sql), "SELECT last_seen FROM series WHERE id = %llu", (unsigned long long)ids[i]);
        assert_int_equal(sql_int(path, sql), ts[i] + (i % 777 == 0 ? 5 : 0));
    }
    snprintf(sql, sizeof(sql), "SELECT first_seen FROM series WHERE id = %llu", (unsigned long long)late);
    assert_int_equal(sql_int(path, sql), 42);
    arena_reset(a);
    assert_int_equal(catalog_get_labels(cat, ids[12345], a, &back), 0);
    assert_int_equal(strtoull(back.v[1].value, NULL, 10), ids[12345]);

    /* Copies still queued when the catalog closes are written (and freed) by the close. */
    label_t l[] = {{"__name__", "last"}};
    labels_t ls = {l, 1};
    assert_int_equal(catalog_add_series(cat, catalog_next_id(cat), &ls, 1), 0);
    arena_destroy(a);
    catalog_close(cat);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM series"), N + 2);
    remove_dir(dir);
}

/* One transaction of the writer thread takes a slice of the pending queue (whole blocks, at least
 * the asked count), not all of it: the rest stays pending, unwritten but found, and the next
 * writes take it. A slice that rolls back goes back in front. */
static void slice_write(catalog_t *cat, size_t max, bool commit)
{
    sqlite3 *db = catalog__write_db(cat);
    catalog__write_lock(cat);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    size_t before = catalog__pending_count(cat), left = SIZE_MAX;
    assert_int_equal(catalog__write_pending(cat, max, &left), 0);
    assert_true(before - left >= (before < max ? before : max) && left == catalog__pending_count(cat));
    assert_int_equal(sqlite3_exec(db, commit ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    catalog__settle_pending(cat, commit);
    catalog__write_unlock(cat);
}

static void test_write_in_slices(void **state)
{
    char *dir = make_dir();
    char path[512];
    many_source_t src = {0};
    catalog_t *cat = open_many(dir, path, sizeof(path), &src);
    enum { N = 30000, SLICE = 5000 };
    static uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        ids[i] = catalog_next_id(cat);
        assert_int_equal(catalog_add_series_ref(cat, ids[i], hint_of(ids[i]), 1000), 0);
    }
    assert_int_equal(catalog__pending_count(cat), N);

    slice_write(cat, SLICE, false); /* rolled back: everything is pending again */
    assert_int_equal(catalog__pending_count(cat), N);
    assert_false(catalog_is_written(cat, ids[0]));

    slice_write(cat, SLICE, true);
    size_t left = catalog__pending_count(cat);
    assert_true(left > 0 && left <= N - SLICE);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM series"), N - (int64_t)left);
    assert_true(catalog_is_written(cat, ids[0]));
    assert_false(catalog_is_written(cat, ids[N - 1]));
    arena_t *a = arena_create(0);
    labels_t back;
    for (int k = 0; k < 2; k++) { /* a written row, and a pending one through the source */
        uint64_t id = k ? ids[N - 1] : ids[0];
        arena_reset(a);
        int calls = src.calls;
        assert_int_equal(catalog_get_labels(cat, id, a, &back), 0);
        assert_int_equal(strtoull(back.v[1].value, NULL, 10), id);
        assert_int_equal(src.calls - calls, k);
    }
    /* The next slice takes more; a flush (no limit) takes all that is left. */
    slice_write(cat, SLICE, true);
    assert_true(catalog__pending_count(cat) < left);
    assert_int_equal(catalog_flush(cat), 0);
    assert_int_equal(catalog__pending_count(cat), 0);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM series"), N);
    assert_true(catalog_is_written(cat, ids[N - 1]));
    arena_destroy(a);
    catalog_close(cat);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_and_lookups),    cmocka_unit_test(test_reopen),
        cmocka_unit_test(test_add_by_reference),   cmocka_unit_test(test_pairs_across_chunks),
        cmocka_unit_test(test_converts_version_1), cmocka_unit_test(test_queue_many_entries),
        cmocka_unit_test(test_rollback_keeps_rows), cmocka_unit_test(test_write_in_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
