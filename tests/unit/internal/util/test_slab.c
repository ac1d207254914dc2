/* Unit tests for internal/util/slab.c: zeroed aligned records, reuse of freed ones before new
 * pages, ownership checks for hints, page accounting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "internal/util/slab.h"

static void test_alloc_free_reuse(void **state)
{
    (void)state;
    slab_t s;
    slab_init(&s, 150, 4096); /* rounded to 160: 25 records per page */
    assert_int_equal(s.size, 160);
    assert_true(s.per_page >= 20 && s.per_page <= 25);
    void *p[100];
    for (int i = 0; i < 100; i++) {
        p[i] = slab_alloc(&s);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % 16, 0);
        const unsigned char *b = p[i];
        for (size_t k = 0; k < s.size; k++)
            assert_int_equal(b[k], 0);
        memset(p[i], 0xAB, s.size); /* records do not overlap: checked below */
        assert_true(slab_owns(&s, p[i]));
    }
    for (int i = 0; i < 100; i++)
        for (size_t k = 0; k < s.size; k++)
            assert_int_equal(((unsigned char *)p[i])[k], 0xAB);
    assert_int_equal(s.used, 100);
    size_t pages = s.npages;
    assert_int_equal(pages, (100 + s.per_page - 1) / s.per_page);
    assert_int_equal(slab_bytes(&s) >= 100 * 160, 1);
    /* Freed records come back (zeroed) before any new page. */
    for (int i = 0; i < 100; i += 2)
        slab_free(&s, p[i]);
    assert_int_equal(s.used, 50);
    for (int i = 0; i < 50; i++) {
        void *q = slab_alloc(&s);
        bool was_freed = false;
        for (int k = 0; k < 100; k += 2)
            was_freed |= q == p[k];
        assert_true(was_freed);
        assert_int_equal(((unsigned char *)q)[0], 0);
        assert_int_equal(((unsigned char *)q)[s.size - 1], 0);
    }
    assert_int_equal(s.npages, pages);
    /* Not a record start, or not ours. */
    assert_false(slab_owns(&s, (char *)p[1] + 8));
    int local;
    assert_false(slab_owns(&s, &local));
    slab_destroy(&s);
    assert_int_equal(s.npages, 0);
    assert_int_equal(slab_bytes(&s), 0);
}

static void test_page_smaller_than_record(void **state)
{
    (void)state;
    slab_t s;
    slab_init(&s, 1000, 64); /* at least one record per page */
    assert_int_equal(s.per_page, 1);
    void *a = slab_alloc(&s), *b = slab_alloc(&s);
    assert_non_null(a);
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    assert_int_equal(s.npages, 2);
    slab_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free_reuse),
        cmocka_unit_test(test_page_smaller_than_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
