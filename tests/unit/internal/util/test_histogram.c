/* Unit tests for internal/util/histogram.c: bucket choice at and between bounds, NaN and +Inf,
 * the cumulative exposition and the sum, rejected bounds, observations from several threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "internal/util/histogram.h"

static const double bounds[] = {0.001, 0.01, 0.1};

static void test_buckets_and_exposition(void **state)
{
    (void)state;
    histogram_t h;
    assert_int_equal(histogram_init(&h, bounds, 3), 0);
    histogram_observe(&h, 0.001);  /* le is inclusive: first bucket */
    histogram_observe(&h, 0.0005); /* first */
    histogram_observe(&h, 0.05);   /* third */
    histogram_observe(&h, 7);      /* +Inf */
    histogram_observe(&h, NAN);    /* +Inf, and the sum becomes NaN as in Prometheus' clients */
    buf_t out = BUF_INIT;
    histogram_write(&h, "x_seconds", "Some help.", &out);
    buf_putc(&out, '\0');
    assert_string_equal(out.data, "# HELP x_seconds Some help.\n"
                                  "# TYPE x_seconds histogram\n"
                                  "x_seconds_bucket{le=\"0.001\"} 2\n"
                                  "x_seconds_bucket{le=\"0.01\"} 2\n"
                                  "x_seconds_bucket{le=\"0.1\"} 3\n"
                                  "x_seconds_bucket{le=\"+Inf\"} 5\n"
                                  "x_seconds_sum NaN\n"
                                  "x_seconds_count 5\n");
    buf_free(&out);
}

static void test_sum(void **state)
{
    (void)state;
    histogram_t h;
    assert_int_equal(histogram_init(&h, bounds, 1), 0);
    histogram_observe(&h, 0.25);
    histogram_observe(&h, 0.5);
    buf_t out = BUF_INIT;
    histogram_write(&h, "y", "Y.", &out);
    buf_putc(&out, '\0');
    assert_string_equal(out.data, "# HELP y Y.\n"
                                  "# TYPE y histogram\n"
                                  "y_bucket{le=\"0.001\"} 0\n"
                                  "y_bucket{le=\"+Inf\"} 2\n"
                                  "y_sum 0.75\n"
                                  "y_count 2\n");
    buf_free(&out);
}

static void test_rejected_bounds(void **state)
{
    (void)state;
    histogram_t h;
    const double unordered[] = {0.1, 0.01};
    const double repeated[] = {0.1, 0.1};
    const double inf[] = {1, INFINITY};
    double many[HISTOGRAM_MAX_BOUNDS + 1];
    for (int i = 0; i <= HISTOGRAM_MAX_BOUNDS; i++)
        many[i] = i + 1;
    assert_int_equal(histogram_init(&h, unordered, 2), -1);
    assert_int_equal(histogram_init(&h, repeated, 2), -1);
    assert_int_equal(histogram_init(&h, inf, 2), -1);
    assert_int_equal(histogram_init(&h, many, HISTOGRAM_MAX_BOUNDS + 1), -1);
    assert_int_equal(histogram_init(&h, many, HISTOGRAM_MAX_BOUNDS), 0);
    assert_int_equal(histogram_init(&h, NULL, 0), 0); /* only +Inf */
}

static histogram_t shared;

static void *observer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000; i++)
        histogram_observe(&shared, (i % 2) ? 0.5 : 0.0005);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    assert_int_equal(histogram_init(&shared, bounds, 3), 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, observer, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&shared.counts[0]), 200000);
    assert_int_equal(atomic_load(&shared.counts[3]), 200000);
    uint64_t bits = atomic_load(&shared.sum_bits);
    double sum;
    memcpy(&sum, &bits, sizeof(sum));
    /* every addition landed (no lost CAS update): 200,000 × 0.5 + 200,000 × 0.0005 */
    assert_true(fabs(sum - 100100.0) < 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_and_exposition),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_rejected_bounds),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
