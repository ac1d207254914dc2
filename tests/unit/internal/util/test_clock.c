/* Unit tests for internal/util/clock.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "internal/util/clock.h"

/* The ms, ns and s readings of one clock, taken in a row, describe the same instant give or take
 * the time between the calls. */
static void test_units_agree(void **state)
{
    int64_t ns0 = clock_wall_ns();
    int64_t ms = clock_wall_ms();
    int64_t ns1 = clock_wall_ns();
    assert_true(ns0 / 1000000 <= ms);
    assert_true(ms <= ns1 / 1000000);

    ns0 = clock_mono_ns();
    ms = clock_mono_ms();
    double s = clock_mono_s();
    ns1 = clock_mono_ns();
    assert_true(ns0 / 1000000 <= ms);
    assert_true(ms <= ns1 / 1000000);
    assert_true(s >= (double)ns0 / 1e9 - 1e-6);
    assert_true(s <= (double)ns1 / 1e9 + 1e-6);
}

static void test_mono_never_goes_back(void **state)
{
    int64_t prev_ns = clock_mono_ns(), prev_ms = clock_mono_ms();
    double prev_s = clock_mono_s();
    for (int i = 0; i < 100000; i++) {
        int64_t ns = clock_mono_ns(), ms = clock_mono_ms();
        double s = clock_mono_s();
        assert_true(ns >= prev_ns);
        assert_true(ms >= prev_ms);
        assert_true(s >= prev_s);
        prev_ns = ns, prev_ms = ms, prev_s = s;
    }
    /* and it moves: a 2 ms sleep shows */
    int64_t t0 = clock_mono_ns();
    struct timespec two = {0, 2000000};
    nanosleep(&two, NULL);
    assert_true(clock_mono_ns() - t0 >= 2000000);
}

static void test_wall_is_epoch(void **state)
{
    /* The wall clock can be stepped (NTP, the hypervisor) between two readings: make_test saw one
     * go back by more than a second once, and once time() (the kernel's per-tick copy) trail
     * clock_gettime by 1.005 s in five readings within a microsecond. What this checks is that
     * the clock counts from the Unix epoch, not its precision: a few seconds either way are
     * allowed, and attempts are spread over half a second so a step in progress passes. */
    int ok = 0;
    for (int attempt = 0; attempt < 5 && !ok; attempt++) {
        if (attempt)
            usleep(100 * 1000);
        int64_t before = (int64_t)time(NULL) * 1000;
        int64_t ms = clock_wall_ms();
        int64_t after = (int64_t)time(NULL) * 1000;
        ok = ms > before - 3000 && ms < after + 3000 && ms > 1600000000000LL; /* after September 2020 */
        if (!ok)
            print_message("attempt %d: time() %lld ms, clock_wall_ms %lld, time() %lld ms\n", attempt,
                          (long long)before, (long long)ms, (long long)after);
    }
    assert_true(ok);
}

static void test_deadline(void **state)
{
    struct timespec now, dl;
    clock_gettime(CLOCK_MONOTONIC, &now);
    dl = clock_deadline_ms(CLOCK_MONOTONIC, 1999);
    int64_t now_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    int64_t dl_ns = (int64_t)dl.tv_sec * 1000000000 + dl.tv_nsec;
    assert_true(dl.tv_nsec >= 0 && dl.tv_nsec < 1000000000);
    assert_true(dl_ns - now_ns >= 1999000000LL);
    assert_true(dl_ns - now_ns < 2999000000LL);

    /* every sub-second remainder normalizes */
    for (int64_t ms = 0; ms < 3000; ms += 7) {
        dl = clock_deadline_ms(CLOCK_REALTIME, ms);
        assert_true(dl.tv_nsec >= 0 && dl.tv_nsec < 1000000000);
    }

    /* a negative wait is "now": a timed wait on it returns at once */
    dl = clock_deadline_ms(CLOCK_REALTIME, -5000);
    assert_true(dl.tv_nsec >= 0 && dl.tv_nsec < 1000000000);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pthread_mutex_lock(&mu);
    int64_t t0 = clock_mono_ms();
    assert_int_equal(pthread_cond_timedwait(&cv, &mu, &dl), ETIMEDOUT);
    pthread_mutex_unlock(&mu);
    assert_true(clock_mono_ms() - t0 < 1000);

    /* a short one on the default (REALTIME) condition variable times out after about that long */
    pthread_mutex_lock(&mu);
    t0 = clock_mono_ms();
    dl = clock_deadline_ms(CLOCK_REALTIME, 20);
    while (pthread_cond_timedwait(&cv, &mu, &dl) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&mu);
    assert_true(clock_mono_ms() - t0 >= 19);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_agree),
        cmocka_unit_test(test_mono_never_goes_back),
        cmocka_unit_test(test_wall_is_epoch),
        cmocka_unit_test(test_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
