/* Unit tests for the WAL-reader hooks of storage/storage.c (storage_set_wal_hold, storage_wal_dir,
 * storage_series_labels): a snapshot keeps the segments a WAL reader still needs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/util/log.h"
#include "storage/storage.h"
#include "storage/wal_watch.h"

static uint32_t hold_value;
static int hold_calls;

static uint32_t hold(void *ud)
{
    (void)ud;
    hold_calls++;
    return hold_value;
}

static void append_one(storage_t *s, const char *name, int64_t t)
{
    label_t l = {"__name__", name};
    storage_sample_t smp = {.labels = {&l, 1}, .t = t, .v = 1};
    assert_int_equal(storage_append(s, &smp, 1, NULL), STORAGE_OK);
}

static void test_snapshot_keeps_held_segments(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/sluice-hold-XXXXXX";
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    storage_options_t o;
    storage_options_default(&o);
    o.path = dir;
    o.rollups = "";
    o.no_background = true;
    o.snapshot_interval_ms = -1;
    char err[256];
    storage_t *s = storage_new(&o, err, sizeof(err));
    assert_non_null(s);
    assert_int_equal(storage_set_wal_hold(s, hold, NULL), 0);
    assert_int_equal(storage_recover(s, err, sizeof(err)), 0);
    assert_int_equal(storage_set_wal_hold(s, hold, NULL), -1); /* too late */
    const char *wal = storage_wal_dir(s);
    assert_non_null(wal);

    int64_t now = storage_now_ms(s);
    uint32_t first = wal_watch_last_segment(wal);
    append_one(s, "a", now);
    hold_value = first; /* a reader still at the first segment */
    assert_int_equal(storage_snapshot(s, err, sizeof(err)), 0);
    append_one(s, "b", now);
    assert_int_equal(storage_snapshot(s, err, sizeof(err)), 0);
    assert_true(hold_calls >= 2);
    assert_int_equal(wal_watch_next_segment(wal, 0), first); /* still there */

    hold_value = 0; /* caught up: the next snapshot truncates as usual */
    assert_int_equal(storage_snapshot(s, err, sizeof(err)), 0);
    assert_true(wal_watch_next_segment(wal, 0) > first);

    /* the catalog answers labels by id (the reader's path for series of deleted segments) */
    int found = 0;
    for (uint64_t id = 0; id < 16; id++) {
        arena_t *a = arena_create(0);
        labels_t ls;
        if (storage_series_labels(s, id, a, &ls) == 0) {
            assert_int_equal(ls.n, 1);
            found += strcmp(ls.v[0].value, "a") == 0 || strcmp(ls.v[0].value, "b") == 0;
        }
        arena_destroy(a);
    }
    assert_int_equal(found, 2);
    storage_close(s);
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_memory_only_store_has_no_wal(void **state)
{
    (void)state;
    char err[256];
    storage_options_t o;
    storage_options_default(&o);
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    assert_null(storage_wal_dir(s));
    arena_t *a = arena_create(0);
    labels_t ls;
    assert_int_equal(storage_series_labels(s, 1, a, &ls), 1);
    arena_destroy(a);
    storage_close(s);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_keeps_held_segments),
        cmocka_unit_test(test_memory_only_store_has_no_wal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
