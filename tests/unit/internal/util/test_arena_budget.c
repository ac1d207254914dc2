/* Unit tests for arena budgets: blocks are charged to a budget and its parents, refused before
 * they are allocated, released when freed; arena_alloc calls the fail handler on refusal. And the
 * process-wide cache of freed 1 MiB blocks: reused by the next arena, bounded, still charged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "internal/util/arena.h"

static void test_budget_charges_parents(void **state)
{
    (void)state;
    arena_budget_t global = {.limit = 1 << 20};
    arena_budget_t q1 = {.limit = 600 << 10, .parent = &global}, q2 = {.limit = 2 << 20, .parent = &global};
    arena_t *a = arena_create(0), *b = arena_create(0);
    assert_int_equal(arena_set_budget(a, &q1, NULL, NULL), 0);
    assert_int_equal(arena_set_budget(b, &q2, NULL, NULL), 0);
    assert_non_null(arena_try_alloc(a, 500 << 10));
    assert_true(atomic_load(&q1.used) >= 500 << 10);
    assert_int_equal(atomic_load(&global.used), atomic_load(&q1.used));
    /* q1's own limit refuses */
    assert_null(arena_try_alloc(a, 200 << 10));
    assert_int_equal(atomic_load(&q1.refused), 1);
    /* the parent refuses what q2 alone would take */
    assert_non_null(arena_try_alloc(b, 400 << 10));
    assert_null(arena_try_alloc(b, 190 << 10));
    assert_int_equal(atomic_load(&global.refused), 1);
    assert_int_equal(atomic_load(&q2.refused), 0);
    /* nothing refused was charged; freeing releases everything */
    size_t used = atomic_load(&global.used);
    assert_int_equal(used, atomic_load(&q1.used) + atomic_load(&q2.used));
    arena_reset(a); /* keeps one block (the newest) */
    assert_true(atomic_load(&q1.used) < used && atomic_load(&q1.used) > 0);
    arena_destroy(a);
    arena_destroy(b);
    assert_int_equal(atomic_load(&q1.used), 0);
    assert_int_equal(atomic_load(&q2.used), 0);
    assert_int_equal(atomic_load(&global.used), 0);
}

static jmp_buf jb;
static const arena_budget_t *seen;

static void on_fail(void *ctx, const arena_budget_t *refused, size_t want)
{
    (void)ctx;
    (void)want;
    seen = refused;
    longjmp(jb, 1);
}

static void test_alloc_calls_fail_handler(void **state)
{
    (void)state;
    arena_budget_t q = {.limit = 64 << 10};
    arena_t *a = arena_create(0);
    assert_int_equal(arena_set_budget(a, &q, on_fail, NULL), 0);
    volatile int n = 0;
    if (setjmp(jb) == 0) {
        for (;;) {
            arena_alloc(a, 4096);
            n++;
        }
    }
    assert_ptr_equal(seen, &q);
    assert_true(n >= 8 && n < 16);
    assert_true(atomic_load(&q.used) <= q.limit);
    arena_destroy(a);
    assert_int_equal(atomic_load(&q.used), 0);
}

static void test_set_budget_charges_existing_blocks(void **state)
{
    (void)state;
    arena_t *a = arena_create(0);
    assert_non_null(arena_try_alloc(a, 100 << 10));
    arena_budget_t small = {.limit = 16 << 10};
    assert_int_equal(arena_set_budget(a, &small, NULL, NULL), -1);
    assert_int_equal(atomic_load(&small.used), 0);
    /* Without a budget, a 100 KiB piece took a standard 1 MiB block (arena.c): that is charged. */
    arena_budget_t big = {.limit = 2 << 20};
    assert_int_equal(arena_set_budget(a, &big, NULL, NULL), 0);
    assert_true(atomic_load(&big.used) > 1 << 20);
    assert_true(atomic_load(&big.used) >= 100 << 10);
    arena_destroy(a);
    assert_int_equal(atomic_load(&big.used), 0);
}

static void test_mark_rewind(void **state)
{
    (void)state;
    arena_budget_t q = {0};
    arena_t *a = arena_create(0);
    assert_int_equal(arena_set_budget(a, &q, NULL, NULL), 0);
    char *keep = arena_strdup(a, "kept");
    arena_mark_t m = arena_mark(a);
    size_t used = atomic_load(&q.used), total = arena_used(a);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 100; i++)
            assert_non_null(arena_alloc(a, 10000));
        assert_true(atomic_load(&q.used) > used);
        size_t peak = atomic_load(&q.used);
        arena_rewind(a, m);
        /* one block is kept as the spare: the next round reuses it instead of asking malloc */
        assert_true(atomic_load(&q.used) > used && atomic_load(&q.used) <= used + (1u << 20) + 64);
        assert_int_equal(arena_used(a), total);
        assert_true(peak < used + 3 * (1000 * 10000 / 2));
    }
    assert_string_equal(keep, "kept");
    char *next = arena_alloc(a, 8);
    assert_ptr_equal(next, keep + 16); /* the space after the mark is handed out again */
    arena_destroy(a);
}

static void test_block_cache(void **state)
{
    (void)state;
    /* 8 KiB doubling to 1 MiB: 8 MiB of small allocations ends in several 1 MiB blocks. */
    arena_t *a = arena_create(0);
    for (int i = 0; i < 8 * 1024; i++)
        memset(arena_alloc(a, 1000), 0xab, 1000);
    size_t before = arena_cache_bytes();
    arena_destroy(a);
    size_t kept = arena_cache_bytes();
    assert_true(kept >= before + (4u << 20));
    /* The next arena takes its 1 MiB blocks from the cache, charged to its budget as new ones. */
    arena_budget_t q = {.limit = 64u << 20};
    arena_t *b = arena_create(0);
    assert_int_equal(arena_set_budget(b, &q, NULL, NULL), 0);
    for (int i = 0; i < 4 * 1024; i++)
        memset(arena_alloc(b, 1000), 0xcd, 1000);
    assert_true(arena_cache_bytes() < kept);
    assert_true(atomic_load(&q.used) >= 4000u * 1000);
    arena_destroy(b);
    assert_int_equal(atomic_load(&q.used), 0);
    /* Bounded: 200 MiB freed at once leaves at most 128 MiB cached. */
    arena_t *c = arena_create(0);
    for (int i = 0; i < 200; i++)
        memset(arena_alloc(c, 1u << 19), 1, 1u << 19);
    for (int i = 0; i < 200; i++)
        memset(arena_alloc(c, 1u << 19), 2, 1u << 19);
    arena_destroy(c);
    assert_true(arena_cache_bytes() <= (128u << 20));
    assert_true(arena_cache_bytes() > (64u << 20));
}

static void test_block_cache_release_idle(void **state)
{
    (void)state;
    arena_cache_release_idle();
    arena_cache_release_idle(); /* whatever earlier tests left is idle now */
    assert_int_equal(arena_cache_bytes(), 0);
    arena_t *a = arena_create(0);
    for (int i = 0; i < 16 * 1024; i++)
        memset(arena_alloc(a, 1000), 0xab, 1000);
    arena_destroy(a);
    size_t cached = arena_cache_bytes();
    assert_true(cached >= (8u << 20));
    /* Nothing was taken yet, but the blocks arrived in this interval: the first call keeps them. */
    assert_int_equal(arena_cache_release_idle(), 0);
    /* A query takes some; the blocks it never needed are idle and go, the ones it used stay. */
    arena_t *b = arena_create(0);
    for (int i = 0; i < 4 * 1024; i++)
        memset(arena_alloc(b, 1000), 0xcd, 1000);
    size_t low = arena_cache_bytes();
    arena_destroy(b);
    assert_int_equal(arena_cache_bytes(), cached);
    assert_int_equal(arena_cache_release_idle(), low);
    assert_int_equal(arena_cache_bytes(), cached - low);
    /* An interval without queries frees the rest. */
    assert_int_equal(arena_cache_release_idle(), cached - low);
    assert_int_equal(arena_cache_bytes(), 0);
    /* Freed blocks are real frees: a new arena still works. */
    arena_t *c = arena_create(0);
    for (int i = 0; i < 2 * 1024; i++)
        memset(arena_alloc(c, 1000), 0xef, 1000);
    arena_destroy(c);
}

/* A pushed body (~0.6 MiB) in an arena without a budget takes a standard block: freed, it goes to
 * the cache, and the next request's body takes it from there instead of fresh pages. */
static void test_big_piece_reuses_cached_block(void **state)
{
    (void)state;
    arena_cache_release_idle();
    arena_cache_release_idle();
    assert_int_equal(arena_cache_bytes(), 0);
    arena_t *a = arena_create(0);
    memset(arena_alloc(a, 600 << 10), 1, 600 << 10);
    arena_destroy(a);
    size_t cached = arena_cache_bytes();
    assert_true(cached > (1u << 20));
    arena_t *b = arena_create(0);
    assert_non_null(arena_try_alloc(b, 600 << 10));
    assert_int_equal(arena_cache_bytes(), 0); /* taken from the cache */
    assert_non_null(arena_try_alloc(b, 3 << 20)); /* over a standard block: a block of its own */
    arena_destroy(b);
    assert_int_equal(arena_cache_bytes(), cached);
    arena_cache_release_idle();
    arena_cache_release_idle();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_cache),
        cmocka_unit_test(test_block_cache_release_idle),
        cmocka_unit_test(test_big_piece_reuses_cached_block),
        cmocka_unit_test(test_budget_charges_parents),
        cmocka_unit_test(test_alloc_calls_fail_handler),
        cmocka_unit_test(test_set_budget_charges_existing_blocks),
        cmocka_unit_test(test_mark_rewind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
