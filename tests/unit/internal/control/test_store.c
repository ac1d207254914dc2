/* Unit tests for internal/control/store.c: durable changes, versions and event ids monotonic across
 * reopen, expiry (also of changes that ran out while closed), history paging, event replay,
 * optimistic concurrency, and coexistence with another writer of control.db. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/control/store.h"

static char *tmpdir(void)
{
    char tmpl[] = "/tmp/sluice-ctl-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void rmdir_all(const char *d)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
}

static control_event_t *change(control_store_t *st, const char *job, control_req_kind_t kind, const char *body,
                               int64_t now)
{
    control_change_t chg;
    char reason[CONTROL_MAX_REASON_LEN + 1], field[64], err[256];
    assert_int_equal(
        control_change_parse(kind, body, strlen(body), &chg, reason, field, sizeof(field), err, sizeof(err)), 0);
    control_event_t *ev = NULL;
    int rc = control_store_apply(st, job, &chg, now, "tester", &ev, err, sizeof(err));
    control_spec_free(&chg.spec);
    if (rc != 0)
        fail_msg("apply: %s", err);
    return ev;
}

static void test_versions_survive_reopen(void **state)
{
    char *dir = tmpdir();
    char err[256];
    control_store_t *st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    control_state_t s;
    assert_int_equal(control_store_get(st, "j", &s), 0);
    assert_int_equal(s.version, 0);
    assert_int_equal(s.spec.mode, CONTROL_RUNNING);
    control_state_free(&s);

    control_event_t *e1 = change(st, "j", CONTROL_REQ_PAUSE, "{\"reason\":\"r1\"}", 1000);
    control_event_t *e2 = change(st, "k", CONTROL_REQ_RATE_LIMIT, "{\"per_second\":7}", 1001);
    control_event_t *e3 = change(st, "j", CONTROL_REQ_RESUME, "", 1002);
    assert_int_equal(e1->version, 1);
    assert_int_equal(e2->version, 1);
    assert_int_equal(e3->version, 2);
    assert_true(e1->id < e2->id && e2->id < e3->id);
    uint64_t last = e3->id;
    control_event_free(e1);
    control_event_free(e2);
    control_event_free(e3);
    control_store_close(st);

    st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    assert_int_equal(control_store_last_event_id(st), last);
    assert_int_equal(control_store_job_count(st), 2);
    assert_int_equal(control_store_get(st, "k", &s), 0);
    assert_int_equal(s.spec.mode, CONTROL_RATE_LIMITED);
    assert_int_equal(s.spec.rate_limit_per_second, 7);
    assert_int_equal(s.version, 1);
    control_state_free(&s);
    /* the clock went backwards: updated_at must still grow (TIS compares lastModified) */
    control_event_t *e4 = change(st, "j", CONTROL_REQ_PAUSE, "", 5);
    assert_int_equal(e4->version, 3);
    assert_true(e4->id > last);
    assert_true(e4->at_ms > 1002);
    control_event_free(e4);

    buf_t b = BUF_INIT;
    control_store_list_json(st, &b);
    assert_non_null(strstr(b.data, "\"job\":\"j\""));
    assert_non_null(strstr(b.data, "\"job\":\"k\""));
    buf_reset(&b);
    control_store_write_metrics(st, &b);
    assert_non_null(strstr(b.data, "sluice_control_mode{job=\"j\",mode=\"paused\"} 1"));
    assert_non_null(strstr(b.data, "sluice_control_rate_limit_per_second{job=\"k\"} 7"));
    assert_non_null(strstr(b.data, "sluice_control_changes_total 1"));
    buf_free(&b);
    control_store_close(st);
    rmdir_all(dir);
    free(dir);
}

static void collect(control_event_t *ev, void *ud)
{
    control_event_t **out = ud;
    for (int i = 0; i < 16; i++)
        if (!out[i]) {
            out[i] = ev;
            return;
        }
    control_event_free(ev);
}

static void test_expiry_and_expiry_while_closed(void **state)
{
    char *dir = tmpdir();
    char err[256];
    control_store_t *st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    control_event_free(change(st, "j", CONTROL_REQ_RATE_LIMIT, "{\"per_second\":100}", 1000));
    control_event_free(change(st, "j", CONTROL_REQ_PAUSE, "{\"for\":\"10s\"}", 2000));
    control_event_free(change(st, "k", CONTROL_REQ_PAUSE, "{\"for\":\"1h\"}", 2000));
    assert_int_equal(control_store_next_expiry(st), 12000);

    control_event_t *got[16] = {0};
    assert_int_equal(control_store_expire_due(st, 11999, collect, got, err, sizeof(err)), 0);
    assert_null(got[0]);
    assert_int_equal(control_store_expire_due(st, 12000, collect, got, err, sizeof(err)), 1);
    assert_non_null(got[0]);
    assert_string_equal(got[0]->job, "j");
    assert_int_equal(got[0]->version, 3);
    assert_non_null(strstr(got[0]->json, "\"updated_by\":\"sluice (expiry)\""));
    control_event_free(got[0]);
    control_state_t s;
    assert_int_equal(control_store_get(st, "j", &s), 0);
    assert_int_equal(s.spec.mode, CONTROL_RATE_LIMITED); /* what the pause replaced */
    assert_int_equal(s.spec.rate_limit_per_second, 100);
    assert_false(s.has_revert);
    control_state_free(&s);
    assert_int_equal(control_store_next_expiry(st), 2000 + 3600000);
    control_store_close(st);

    /* k's hour passes while closed: reverting at start is a plain expire_due after open */
    st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    assert_int_equal(control_store_expire_due(st, 2000 + 3600000 + 5, NULL, NULL, err, sizeof(err)), 1);
    assert_int_equal(control_store_get(st, "k", &s), 0);
    assert_int_equal(s.spec.mode, CONTROL_RUNNING);
    assert_int_equal(s.version, 2);
    control_state_free(&s);
    assert_int_equal(control_store_next_expiry(st), 0);

    /* the history records both expiries like any change */
    buf_t b = BUF_INIT;
    assert_int_equal(control_store_history_json(st, "k", 0, 10, &b, err, sizeof(err)), 0);
    assert_non_null(strstr(b.data, "sluice (expiry)"));
    buf_free(&b);
    control_store_close(st);
    rmdir_all(dir);
    free(dir);
}

static void test_history_paging_and_replay(void **state)
{
    char *dir = tmpdir();
    char err[256];
    control_store_t *st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    for (int i = 0; i < 5; i++) {
        char body[64];
        snprintf(body, sizeof(body), "{\"per_second\":%d}", i + 1);
        control_event_free(change(st, "j", CONTROL_REQ_RATE_LIMIT, body, 1000 + i));
        control_event_free(change(st, "other", CONTROL_REQ_PAUSE, "", 1000 + i));
    }
    buf_t b = BUF_INIT;
    assert_int_equal(control_store_history_json(st, "j", 0, 2, &b, err, sizeof(err)), 0);
    /* newest first, two entries, and a cursor for the next page */
    char *v5 = strstr(b.data, "\"version\":5"), *v4 = strstr(b.data, "\"version\":4");
    assert_non_null(v5);
    assert_non_null(v4);
    assert_true(v5 < v4);
    assert_null(strstr(b.data, "\"version\":3"));
    assert_non_null(strstr(b.data, "\"next_before\":4"));
    buf_reset(&b);
    assert_int_equal(control_store_history_json(st, "j", 2, 10, &b, err, sizeof(err)), 0);
    assert_non_null(strstr(b.data, "\"version\":1"));
    assert_null(strstr(b.data, "\"version\":2"));
    assert_non_null(strstr(b.data, "\"next_before\":null"));
    buf_free(&b);

    control_event_t *got[16] = {0};
    assert_int_equal(control_store_events_since(st, 6, "j", 100, collect, got, err, sizeof(err)), 2);
    assert_int_equal(got[0]->id, 7);
    assert_int_equal(got[1]->id, 9);
    assert_string_equal(got[1]->job, "j");
    for (int i = 0; got[i]; i++)
        control_event_free(got[i]);
    memset(got, 0, sizeof(got));
    assert_int_equal(control_store_events_since(st, 8, NULL, 100, collect, got, err, sizeof(err)), 2);
    assert_int_equal(got[0]->id, 9);
    assert_int_equal(got[1]->id, 10);
    for (int i = 0; got[i]; i++)
        control_event_free(got[i]);
    control_store_close(st);
    rmdir_all(dir);
    free(dir);
}

typedef struct {
    const char *path;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool locked;
    int rc;
} other_t;

static void *other_writer(void *arg)
{
    other_t *o = arg;
    sqlite3 *db;
    o->rc = sqlite3_open(o->path, &db);
    if (o->rc == SQLITE_OK)
        o->rc =
            sqlite3_exec(db, "CREATE TABLE IF NOT EXISTS rollup_x(a); BEGIN IMMEDIATE; INSERT INTO rollup_x VALUES(1);",
                         NULL, NULL, NULL);
    pthread_mutex_lock(&o->mu);
    o->locked = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    usleep(300 * 1000);
    if (o->rc == SQLITE_OK)
        o->rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(db);
    return NULL;
}

static void test_conflict_and_other_writer(void **state)
{
    char *dir = tmpdir();
    char err[256], path[512];
    control_store_t *st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    control_event_free(change(st, "j", CONTROL_REQ_PAUSE, "", 1000));

    control_change_t chg;
    char reason[CONTROL_MAX_REASON_LEN + 1], field[64];
    const char *body = "{\"mode\":\"running\",\"version\":0}";
    assert_int_equal(
        control_change_parse(CONTROL_REQ_PUT, body, strlen(body), &chg, reason, field, sizeof(field), err, sizeof(err)),
        0);
    control_event_t *ev = NULL;
    assert_int_equal(control_store_apply(st, "j", &chg, 2000, "x", &ev, err, sizeof(err)), CONTROL_STORE_CONFLICT);
    assert_null(ev);
    assert_string_equal(err, "1");
    chg.expect_version = 1;
    assert_int_equal(control_store_apply(st, "j", &chg, 2000, "x", &ev, err, sizeof(err)), CONTROL_STORE_OK);
    control_event_free(ev);

    /* Another connection (say, sqlite3 opened by an operator) holds the write lock for a while:
     * the change waits for it (busy_timeout) instead of failing. */
    snprintf(path, sizeof(path), "%s/control.db", dir);
    other_t o = {.path = path};
    pthread_mutex_init(&o.mu, NULL);
    pthread_cond_init(&o.cv, NULL);
    pthread_t t;
    pthread_create(&t, NULL, other_writer, &o);
    pthread_mutex_lock(&o.mu);
    while (!o.locked)
        pthread_cond_wait(&o.cv, &o.mu);
    pthread_mutex_unlock(&o.mu);
    control_event_t *e = change(st, "j", CONTROL_REQ_PAUSE, "", 3000);
    assert_int_equal(e->version, 3);
    control_event_free(e);
    pthread_join(t, NULL);
    assert_int_equal(o.rc, SQLITE_OK);
    control_store_close(st);
    rmdir_all(dir);
    free(dir);
}

static void parse_change(control_req_kind_t kind, const char *body, control_change_t *chg, char *reason)
{
    char field[64], err[256];
    assert_int_equal(
        control_change_parse(kind, body, strlen(body), chg, reason, field, sizeof(field), err, sizeof(err)), 0);
}

/* Group commit: one transaction for several changes gives the same result as applying them one
 * after another — versions count up through the batch, a version check sees the earlier items,
 * a conflicting item changes nothing while the rest commit, event ids follow the batch order —
 * and all of it is on disk after the call. */
static void test_group_commit(void **state)
{
    (void)state;
    char *dir = tmpdir();
    char err[256];
    control_store_t *st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    control_event_free(change(st, "b", CONTROL_REQ_PAUSE, "", 1000)); /* b at version 1 */

    enum { N = 5 };
    control_change_t chg[N];
    char reasons[N][CONTROL_MAX_REASON_LEN + 1];
    parse_change(CONTROL_REQ_PAUSE, "{\"reason\":\"first\"}", &chg[0], reasons[0]);
    parse_change(CONTROL_REQ_PUT, "{\"mode\":\"running\",\"version\":1}", &chg[1], reasons[1]); /* sees item 0 */
    parse_change(CONTROL_REQ_PUT, "{\"mode\":\"running\",\"version\":0}", &chg[2],
                 reasons[2]); /* b is at 1: conflict */
    parse_change(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":7}", &chg[3], reasons[3]);
    parse_change(CONTROL_REQ_DRAIN, "", &chg[4], reasons[4]);
    control_store_item_t items[N] = {
        {.job = "a", .chg = &chg[0], .updated_by = "t0"}, {.job = "a", .chg = &chg[1], .updated_by = "t1"},
        {.job = "b", .chg = &chg[2], .updated_by = "t2"}, {.job = "a", .chg = &chg[3], .updated_by = "t3"},
        {.job = "c", .chg = &chg[4], .updated_by = "t4"},
    };
    uint64_t last_before = control_store_last_event_id(st);
    assert_int_equal(control_store_apply_batch(st, items, N, 5000), 4);
    assert_int_equal(items[2].rc, CONTROL_STORE_CONFLICT);
    assert_string_equal(items[2].err, "1");
    assert_null(items[2].ev);
    const uint64_t want_version[N] = {1, 2, 0, 3, 1};
    uint64_t prev_id = last_before;
    for (int i = 0; i < N; i++) {
        if (i == 2)
            continue;
        assert_int_equal(items[i].rc, CONTROL_STORE_OK);
        assert_non_null(items[i].ev);
        assert_string_equal(items[i].ev->job, items[i].job);
        assert_int_equal(items[i].ev->version, want_version[i]);
        assert_true(items[i].ev->id > prev_id); /* ids in batch order */
        prev_id = items[i].ev->id;
    }
    /* updated_at strictly increases within a job even though the batch shares one clock */
    assert_true(items[1].ev->at_ms > items[0].ev->at_ms && items[3].ev->at_ms > items[1].ev->at_ms);
    assert_int_equal(control_store_last_event_id(st), prev_id);
    control_state_t s;
    assert_int_equal(control_store_get(st, "a", &s), 0);
    assert_int_equal(s.version, 3);
    assert_int_equal(s.spec.mode, CONTROL_RATE_LIMITED);
    assert_int_equal(s.spec.rate_limit_per_second, 7);
    control_state_free(&s);
    assert_int_equal(control_store_get(st, "b", &s), 0);
    assert_int_equal(s.version, 1); /* the conflict changed nothing */
    assert_int_equal(s.spec.mode, CONTROL_PAUSED);
    control_state_free(&s);
    for (int i = 0; i < N; i++) {
        control_event_free(items[i].ev);
        control_spec_free(&chg[i].spec);
    }
    /* a checkpoint between changes is harmless and leaves everything readable */
    assert_true(control_store_checkpoint(st, 1) >= 0);
    control_store_close(st);

    /* durable: reopened, the states and the log are the batch's */
    st = control_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    assert_int_equal(control_store_get(st, "a", &s), 0);
    assert_int_equal(s.version, 3);
    assert_string_equal(s.updated_by, "t3");
    control_state_free(&s);
    assert_int_equal(control_store_get(st, "c", &s), 0);
    assert_int_equal(s.version, 1);
    assert_int_equal(s.spec.mode, CONTROL_DRAINING);
    control_state_free(&s);
    assert_int_equal(control_store_last_event_id(st), prev_id);
    buf_t h = BUF_INIT;
    assert_int_equal(control_store_history_json(st, "a", 0, 10, &h, err, sizeof(err)), 0);
    const char *v3 = strstr(h.data, "\"version\":3"), *v2 = strstr(h.data, "\"version\":2"),
               *v1 = strstr(h.data, "\"version\":1");
    assert_true(v3 && v2 && v1 && v3 < v2 && v2 < v1);
    buf_free(&h);
    /* an empty batch is nothing */
    assert_int_equal(control_store_apply_batch(st, NULL, 0, 6000), 0);
    control_store_close(st);
    rmdir_all(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versions_survive_reopen),
        cmocka_unit_test(test_expiry_and_expiry_while_closed),
        cmocka_unit_test(test_history_paging_and_replay),
        cmocka_unit_test(test_conflict_and_other_writer),
        cmocka_unit_test(test_group_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
