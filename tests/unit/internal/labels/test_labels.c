/* Unit tests for internal/labels/labels.c: sorting, validation, hashing, comparison. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "internal/labels/labels.h"

static void test_sort_and_check(void **state)
{
    label_t v[] = {{"job", "a"}, {"__name__", "up"}, {"instance", "x"}};
    labels_t ls = {v, 3};
    assert_int_equal(labels_check_sorted_unique(&ls), -1);
    labels_sort(&ls);
    assert_string_equal(v[0].name, "__name__");
    assert_string_equal(v[1].name, "instance");
    assert_string_equal(v[2].name, "job");
    assert_int_equal(labels_check_sorted_unique(&ls), 0);
    label_t d[] = {{"a", "1"}, {"a", "2"}};
    labels_t dup = {d, 2};
    assert_int_equal(labels_check_sorted_unique(&dup), -1);
    labels_t empty = {NULL, 0};
    assert_int_equal(labels_check_sorted_unique(&empty), 0);
}

static void test_hash_equal_compare(void **state)
{
    label_t a[] = {{"__name__", "up"}, {"job", "a"}};
    label_t b[] = {{"__name__", "up"}, {"job", "a"}};
    label_t c[] = {{"__name__", "up"}, {"job", "b"}};
    /* Shifting a byte between name and value must change the hash (separator matters). */
    label_t d[] = {{"__name__", "up"}, {"jo", "ba"}};
    labels_t la = {a, 2}, lb = {b, 2}, lc = {c, 2}, ld = {d, 2}, l1 = {a, 1};
    assert_true(labels_hash(&la) == labels_hash(&lb));
    assert_true(labels_hash(&la) != labels_hash(&lc));
    assert_true(labels_hash(&la) != labels_hash(&ld));
    assert_true(labels_equal(&la, &lb));
    assert_false(labels_equal(&la, &lc));
    assert_int_equal(labels_compare(&la, &lb), 0);
    assert_int_equal(labels_compare(&la, &lc), -1);
    assert_int_equal(labels_compare(&lc, &la), 1);
    assert_int_equal(labels_compare(&l1, &la), -1); /* prefix sorts first */
    assert_string_equal(labels_get(&la, "job"), "a");
    assert_null(labels_get(&la, "nope"));

    /* Long sets take the streaming path; it must agree with the one-shot path's definition:
     * equal sets hash equal, different ones differ. */
    char big1[600], big2[600];
    memset(big1, 'x', sizeof(big1) - 1);
    big1[sizeof(big1) - 1] = 0;
    memcpy(big2, big1, sizeof(big1));
    big2[10] = 'y';
    label_t e[] = {{"__name__", big1}}, f[] = {{"__name__", big1}}, g[] = {{"__name__", big2}};
    labels_t le = {e, 1}, lf = {f, 1}, lg = {g, 1};
    assert_true(labels_hash(&le) == labels_hash(&lf));
    assert_true(labels_hash(&le) != labels_hash(&lg));

    /* The hash is xxh3 of name 0xff value 0xff ... (snapshots keep it): on both sides of the
     * stack buffer's size, with the overflow in the first or a later label. */
    for (size_t len = 500; len <= 520; len++) {
        char v1[600], cat[700];
        memset(v1, 'v', len);
        v1[len] = 0;
        label_t one[] = {{"a", v1}}, two[] = {{"__name__", "up"}, {"a", v1}};
        labels_t l_one = {one, 1}, l_two = {two, 2};
        int n = snprintf(cat, sizeof(cat), "a\xff%s\xff", v1);
        assert_true(labels_hash(&l_one) == XXH3_64bits(cat, (size_t)n));
        n = snprintf(cat, sizeof(cat), "__name__\xffup\xff%s\xff%s\xff", "a", v1);
        assert_true(labels_hash(&l_two) == XXH3_64bits(cat, (size_t)n));
    }
}

static void test_valid_names(void **state)
{
    assert_true(labels_valid_name("job", 3));
    assert_true(labels_valid_name("_a1", 3));
    assert_true(labels_valid_name("__name__", 8));
    assert_false(labels_valid_name("1a", 2));
    assert_false(labels_valid_name("a:b", 3));
    assert_false(labels_valid_name("a-b", 3));
    assert_false(labels_valid_name("", 0));
    assert_true(labels_valid_metric_name("a:b_c", 5));
    assert_true(labels_valid_metric_name(":x", 2));
    assert_false(labels_valid_metric_name("9x", 2));
    assert_false(labels_valid_metric_name("a.b", 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sort_and_check),
        cmocka_unit_test(test_hash_equal_compare),
        cmocka_unit_test(test_valid_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
