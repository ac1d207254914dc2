/* Unit tests for internal/push/heartbeat.c: counters, gaps (start, end, length), learned and
 * configured intervals, expected jobs going missing and coming back, forgetting, monotonicity. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "internal/push/heartbeat.h"

#define T0 1700000000000LL

static label_t g1_labels[] = {{"instance", "tm1"}, {"job", "flink"}};
static const labels_t g1 = {g1_labels, 2};

static void push(heartbeat_t *hb, const char *key, const char *const *jobs, size_t njobs, int64_t t)
{
    assert_int_equal(heartbeat_push(hb, key, XXH3_64bits(key, strlen(key)), &g1, jobs, njobs, t), 0);
}

/* Ticks every second from `from` to `to` (inclusive), as the daemon does. */
static void tick_until(heartbeat_t *hb, int64_t from, int64_t to)
{
    for (int64_t t = from; t <= to; t += 1000)
        heartbeat_tick(hb, t);
}

typedef struct {
    double e, r;
    int64_t last, iv;
    int n;
} gview_t;

static void grab_group(const heartbeat_group_view_t *v, void *ud)
{
    gview_t *g = ud;
    g->e = v->expected;
    g->r = v->received;
    g->last = v->last_ms;
    g->iv = v->interval_ms;
    g->n++;
}

static gview_t group_view(heartbeat_t *hb, int64_t now)
{
    gview_t g = {0};
    heartbeat_each_group(hb, now, grab_group, &g);
    return g;
}

static size_t take(heartbeat_t *hb, heartbeat_event_t **ev)
{
    return heartbeat_take_events(hb, ev);
}

/* Pushes every 10 s that stop for 60 s (six missing): a 60 s gap, six missed heartbeats for the
 * group and six intervals for the job; the gap opens once two intervals passed. */
static void test_gap_of_sixty_seconds(void **state)
{
    (void)state;
    heartbeat_options_t o = {.default_interval_ms = 10000};
    heartbeat_t *hb = heartbeat_new(&o, T0);
    const char *jobs[] = {"flink", "orders"};
    for (int i = 0; i <= 10; i++)
        push(hb, "k1", jobs, 2, T0 + i * 10000);
    int64_t last = T0 + 100000;
    heartbeat_event_t *ev;
    heartbeat_events_free(ev, take(hb, &ev));
    gview_t g = group_view(hb, last);
    assert_true(g.e == 11 && g.r == 11);
    heartbeat_job_view_t jv;
    assert_true(heartbeat_job(hb, "orders", last, &jv));
    assert_true(fabs(jv.expected - 10) < 1e-9 && fabs(jv.received - 10) < 1e-9);

    /* no gap at 1.9 intervals, one at 2 intervals + 1 s */
    tick_until(hb, last + 1000, last + 20000);
    assert_int_equal(take(hb, &ev), 0);
    heartbeat_events_free(ev, 0);
    heartbeat_tick(hb, last + 21000);
    size_t n = take(hb, &ev);
    assert_int_equal(n, 4); /* group gap for both jobs, then each job's gap */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].kind, HEARTBEAT_GAP_OPEN);
        assert_int_equal(ev[i].start_ms, last + 10000);
    }
    heartbeat_events_free(ev, n);
    assert_true(heartbeat_job(hb, "orders", last + 45000, &jv));
    assert_true(jv.in_gap && jv.up == false); /* 45 s > 3 intervals: not up (not expected either) */
    /* while the gap is open, expected grows and received does not */
    g = group_view(hb, last + 45000);
    assert_true(g.e == 11 + 4 && g.r == 11);

    tick_until(hb, last + 22000, last + 69000);
    push(hb, "k1", jobs, 2, last + 70000);
    n = take(hb, &ev);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ev[i].kind, HEARTBEAT_GAP_CLOSE);
        assert_int_equal(ev[i].end_ms - ev[i].start_ms, 60000);
        assert_string_equal(ev[i].reason, "push");
    }
    assert_string_equal(ev[0].group, "{instance=\"tm1\",job=\"flink\"}");
    assert_string_equal(ev[2].group, "");
    heartbeat_events_free(ev, n);
    g = group_view(hb, last + 70000);
    assert_true(g.e == 11 + 7 && g.r == 12); /* six missed */
    assert_true(heartbeat_job(hb, "orders", last + 70000, &jv));
    assert_true(fabs((jv.expected - jv.received) - 6.0) < 1e-9);
    assert_true(fabs(jv.expected - 17) < 1e-9);
    assert_true(!jv.in_gap && jv.up);
    heartbeat_free(hb);
}

/* The learned cadence ignores the push that ends a gap; a push that ends a gap before any tick saw
 * it is still recorded whole. */
static void test_learned_interval_and_untested_gap(void **state)
{
    (void)state;
    heartbeat_options_t o = {0};
    heartbeat_t *hb = heartbeat_new(&o, T0);
    const char *jobs[] = {"j"};
    for (int i = 0; i < 6; i++)
        push(hb, "k", jobs, 1, T0 + i * 5000);
    gview_t g = group_view(hb, T0 + 25000);
    assert_int_equal(g.iv, 5000);
    push(hb, "k", jobs, 1, T0 + 25000 + 30000); /* no tick in between */
    heartbeat_event_t *ev;
    size_t n = take(hb, &ev);
    assert_int_equal(n, 4); /* open+close of the group gap, open+close of the job gap */
    assert_int_equal(ev[1].kind, HEARTBEAT_GAP_CLOSE);
    assert_int_equal(ev[1].start_ms, T0 + 30000);
    assert_int_equal(ev[1].end_ms, T0 + 55000);
    heartbeat_events_free(ev, n);
    g = group_view(hb, T0 + 55000);
    assert_int_equal(g.iv, 5000); /* not taught by the 30 s gap */
    assert_true(g.e == 6 + 6 && g.r == 7);
    heartbeat_free(hb);
}

/* An expected job that never pushed is missing after 3 intervals from its declaration, stays
 * missing, and is up again with its first push; its gap is recorded from declaration + interval. */
static void test_expected_job_missing_and_back(void **state)
{
    (void)state;
    heartbeat_options_t o = {0};
    heartbeat_t *hb = heartbeat_new(&o, T0);
    heartbeat_expect_t ex[] = {{"etl", 2000}};
    assert_int_equal(heartbeat_set_expected(hb, ex, 1, T0 + 1000), 0);
    heartbeat_job_view_t jv;
    assert_true(heartbeat_job(hb, "etl", T0 + 7000, &jv));
    assert_true(jv.expected_job && jv.up && jv.last_ms == 0); /* 6 s = 3 intervals: not yet */
    assert_true(heartbeat_job(hb, "etl", T0 + 7001, &jv));
    assert_false(jv.up);
    tick_until(hb, T0 + 1000, T0 + 60000);
    assert_true(heartbeat_job(hb, "etl", T0 + 60000, &jv));
    assert_false(jv.up);
    assert_true(jv.in_gap);
    assert_int_equal(jv.gap_start_ms, T0 + 3000);
    const char *jobs[] = {"etl"};
    push(hb, "g", jobs, 1, T0 + 61000);
    assert_true(heartbeat_job(hb, "etl", T0 + 61000, &jv));
    assert_true(jv.up && !jv.in_gap);
    /* (61 s - 1 s) / 2 s = 30 intervals expected, 1 received: 29 missed = 58 s of gap / 2 s */
    assert_true(fabs(jv.expected - 30) < 1e-9 && fabs(jv.received - 1) < 1e-9);
    heartbeat_event_t *ev;
    size_t n = take(hb, &ev);
    assert_int_equal(n, 2);
    assert_int_equal(ev[1].kind, HEARTBEAT_GAP_CLOSE);
    assert_int_equal(ev[1].start_ms, T0 + 3000);
    assert_int_equal(ev[1].end_ms, T0 + 61000);
    heartbeat_events_free(ev, n);
    /* no longer expected: it stays while its group is there */
    assert_int_equal(heartbeat_set_expected(hb, NULL, 0, T0 + 62000), 0);
    assert_true(heartbeat_job(hb, "etl", T0 + 62000, &jv));
    assert_false(jv.expected_job);
    heartbeat_free(hb);
}

/* A job nobody declared is forgotten with its last group (its open gap ends, reason "gone"); a
 * declared one is kept and keeps counting. */
static void test_forget_with_last_group(void **state)
{
    (void)state;
    heartbeat_options_t o = {.default_interval_ms = 1000};
    heartbeat_t *hb = heartbeat_new(&o, T0);
    const char *a[] = {"a"}, *b[] = {"b"};
    push(hb, "ga", a, 1, T0);
    push(hb, "gb", b, 1, T0);
    heartbeat_expect_t ex[] = {{"b", 0}};
    assert_int_equal(heartbeat_set_expected(hb, ex, 1, T0), 0);
    tick_until(hb, T0, T0 + 5000);
    heartbeat_event_t *ev;
    heartbeat_events_free(ev, take(hb, &ev));
    heartbeat_group_gone(hb, "ga", XXH3_64bits("ga", 2), T0 + 5500);
    heartbeat_group_gone(hb, "gb", XXH3_64bits("gb", 2), T0 + 5500);
    heartbeat_group_gone(hb, "nope", XXH3_64bits("nope", 4), T0 + 5500); /* ignored */
    size_t n = take(hb, &ev);
    /* group gaps of ga and gb close, job a's gap closes; job b stays open */
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(ev[i].reason, "gone");
    heartbeat_events_free(ev, n);
    heartbeat_job_view_t jv;
    assert_false(heartbeat_job(hb, "a", T0 + 6000, &jv));
    assert_true(heartbeat_job(hb, "b", T0 + 6000, &jv));
    assert_true(jv.in_gap && !jv.up && jv.ngroups == 0);
    assert_int_equal(heartbeat_group_count(hb), 0);
    assert_int_equal(heartbeat_job_count(hb), 1);
    heartbeat_free(hb);
}

/* Several groups of one job pushing at staggered times count one interval per interval; the job
 * has no gap while any of them pushes. Counters never go down when the interval changes. */
static void test_many_groups_one_job_and_monotonic(void **state)
{
    (void)state;
    heartbeat_options_t o = {0};
    heartbeat_t *hb = heartbeat_new(&o, T0);
    const char *j[] = {"job"};
    for (int i = 0; i < 30; i++) {
        push(hb, "g1", j, 1, T0 + i * 2000);
        push(hb, "g2", j, 1, T0 + i * 2000 + 700);
        push(hb, "g3", j, 1, T0 + i * 2000 + 1400);
        heartbeat_tick(hb, T0 + i * 2000 + 1500);
    }
    heartbeat_job_view_t jv;
    assert_true(heartbeat_job(hb, "job", T0 + 59400, &jv));
    assert_int_equal(jv.interval_ms, 2000);
    assert_true(fabs(jv.expected - jv.received) < 1e-9);
    /* the first 2 s count at the fallback interval, until the groups learned their cadence */
    assert_true(jv.expected > 28 && jv.expected <= 59400.0 / 2000);
    heartbeat_event_t *ev;
    assert_int_equal(take(hb, &ev), 0);
    heartbeat_events_free(ev, 0);
    /* one group stops: a group gap, no job gap */
    for (int i = 30; i < 40; i++) {
        push(hb, "g1", j, 1, T0 + i * 2000);
        heartbeat_tick(hb, T0 + i * 2000 + 1500);
    }
    size_t n = take(hb, &ev);
    assert_int_equal(n, 2);
    assert_string_not_equal(ev[0].group, "");
    heartbeat_events_free(ev, n);
    /* declaring a longer interval during a gap must not make counters go down */
    double before_e = 0, before_r = 0;
    tick_until(hb, T0 + 80000, T0 + 100000);
    assert_true(heartbeat_job(hb, "job", T0 + 100000, &jv));
    before_e = jv.expected;
    before_r = jv.received;
    heartbeat_expect_t ex[] = {{"job", 60000}};
    assert_int_equal(heartbeat_set_expected(hb, ex, 1, T0 + 100000), 0);
    assert_true(heartbeat_job(hb, "job", T0 + 100001, &jv));
    assert_true(jv.expected >= before_e && jv.received >= before_r);
    gview_t g = group_view(hb, T0 + 100001);
    assert_true(g.n == 3);
    heartbeat_free(hb);
}

/* A group reporting for more jobs than the cap keeps the first ones; repeated and empty names are
 * skipped. */
static void test_job_list_limits(void **state)
{
    (void)state;
    heartbeat_options_t o = {0};
    heartbeat_t *hb = heartbeat_new(&o, T0);
    const char *names[40];
    char buf[40][8];
    for (int i = 0; i < 40; i++) {
        snprintf(buf[i], sizeof(buf[i]), "j%d", i % 20);
        names[i] = buf[i];
    }
    names[1] = "";
    push(hb, "g", names, 40, T0);
    assert_true(heartbeat_job_count(hb) <= HEARTBEAT_MAX_JOBS_PER_GROUP);
    push(hb, "g", names, 40, T0 + 1000); /* same list: no change */
    const char *one[] = {"j0"};
    push(hb, "g", one, 1, T0 + 2000);
    heartbeat_tick(hb, T0 + 2000);
    assert_int_equal(heartbeat_job_count(hb), 1);
    heartbeat_free(hb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gap_of_sixty_seconds),
        cmocka_unit_test(test_learned_interval_and_untested_gap),
        cmocka_unit_test(test_expected_job_missing_and_back),
        cmocka_unit_test(test_forget_with_last_group),
        cmocka_unit_test(test_many_groups_one_job_and_monotonic),
        cmocka_unit_test(test_job_list_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
