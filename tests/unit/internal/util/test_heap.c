/* Unit tests for internal/util/heap.c: when the timer's tick trims (first tick, RSS growth of
 * 32 MiB or an eighth since the last trim, a large release by the caller) and that a tick without
 * any of these leaves the heap alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "internal/util/buf.h"
#include "internal/util/heap.h"

#define MIB ((int64_t)1 << 20)

static void test_trim_wanted(void **state)
{
    (void)state;
    assert_true(heap_trim_wanted(100 * MIB, 0, 0)); /* no trim yet */
    assert_false(heap_trim_wanted(100 * MIB, 100 * MIB, 0));
    assert_false(heap_trim_wanted(131 * MIB, 100 * MIB, 0)); /* the pushes' working set again */
    assert_true(heap_trim_wanted(132 * MIB, 100 * MIB, 0));
    assert_false(heap_trim_wanted(90 * MIB, 100 * MIB, 0)); /* smaller than after the last trim */
    assert_true(heap_trim_wanted(100 * MIB, 100 * MIB, (size_t)(32 * MIB)));
    assert_false(heap_trim_wanted(100 * MIB, 100 * MIB, (size_t)(31 * MIB)));
    /* a large process: an eighth */
    assert_false(heap_trim_wanted(1024 * MIB + 127 * MIB, 1024 * MIB, 0));
    assert_true(heap_trim_wanted(1024 * MIB + 128 * MIB, 1024 * MIB, 0));
}

static unsigned long long trims_total(void)
{
    buf_t b = BUF_INIT;
    heap_write_metrics(NULL, &b);
    const char *p = strstr(b.data, "\nsluice_heap_trims_total ");
    assert_non_null(p);
    unsigned long long n = 0;
    assert_int_equal(sscanf(p, "\nsluice_heap_trims_total %llu", &n), 1);
    buf_free(&b);
    return n;
}

static void test_tick(void **state)
{
    (void)state;
    unsigned long long n0 = trims_total();
    heap_trim_tick(0); /* the first: no trim before it */
    assert_int_equal(trims_total(), n0 + 1);
    heap_trim_tick(0); /* nothing grew */
    assert_int_equal(trims_total(), n0 + 1);
    heap_trim_tick((size_t)(64 * MIB)); /* the caller just freed that much */
    assert_int_equal(trims_total(), n0 + 2);
    heap_trim(); /* an explicit trim always trims */
    assert_int_equal(trims_total(), n0 + 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_wanted),
        cmocka_unit_test(test_tick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
