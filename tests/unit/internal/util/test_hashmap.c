/* Unit tests for internal/util/hashmap.c and internal/util/hash.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/arena.h"
#include "internal/util/hash.h"
#include "internal/util/hashmap.h"

static uint64_t rng_state;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* The table's invariants: n counts the full slots, no more than half are full, and every entry
 * is reachable from its home without crossing an empty slot. */
static void check(const hashmap_t *m)
{
    size_t full = 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].val == HASHMAP_NONE)
            continue;
        full++;
        size_t mask = m->cap - 1;
        uint64_t h = m->hashed ? m->slots[i].key : hash_mix64(m->slots[i].key);
        for (size_t j = h & mask; j != i; j = (j + 1) & mask)
            assert_true(m->slots[j].val != HASHMAP_NONE);
    }
    assert_int_equal(full, m->n);
    assert_true(m->n * 2 <= m->cap);
    assert_true((m->cap & (m->cap - 1)) == 0);
}

/* n distinct keys whose home slot in a table of cap slots is `home`. */
static void colliding_keys(uint64_t *out, size_t n, size_t cap, size_t home)
{
    size_t k = 0;
    for (uint64_t x = 1; k < n; x++)
        if ((hash_mix64(x) & (cap - 1)) == home)
            out[k++] = x;
}

static void test_mix64(void **state)
{
    assert_int_equal(hash_mix64(0), 0);
    /* fmix64 reference values */
    assert_true(hash_mix64(1) == UINT64_C(0xb456bcfc34c2cb2c));
    assert_true(hash_mix64(1) != hash_mix64(2));
    assert_true(hash_mix64(UINT64_MAX) != UINT64_MAX);
}

static void test_basic(void **state)
{
    hashmap_t m = HASHMAP_INIT;
    assert_null(hashmap_get(&m, 1));
    assert_false(hashmap_del(&m, 1));
    assert_int_equal(hashmap_put(&m, 1, 10), 0);
    assert_int_equal(hashmap_put(&m, 2, 20), 0);
    assert_int_equal(*hashmap_get(&m, 1), 10);
    assert_int_equal(*hashmap_get(&m, 2), 20);
    assert_null(hashmap_get(&m, 3));
    assert_int_equal(hashmap_put(&m, 1, 11), 0); /* replaces */
    assert_int_equal(*hashmap_get(&m, 1), 11);
    assert_int_equal(hashmap_count(&m), 2);
    *hashmap_get(&m, 2) = 21; /* values change in place */
    assert_int_equal(*hashmap_get(&m, 2), 21);
    assert_true(hashmap_del(&m, 1));
    assert_false(hashmap_del(&m, 1));
    assert_null(hashmap_get(&m, 1));
    assert_int_equal(hashmap_count(&m), 1);
    assert_int_equal(hashmap_put(&m, 1, 12), 0); /* delete, then insert again */
    assert_int_equal(*hashmap_get(&m, 1), 12);
    check(&m);
    hashmap_clear(&m);
    assert_int_equal(hashmap_count(&m), 0);
    assert_null(hashmap_get(&m, 2));
    assert_int_equal(hashmap_put(&m, 2, 0), 0);
    assert_true(hashmap_has(&m, 2));
    hashmap_free(&m);
    assert_null(hashmap_get(&m, 2));
    hashmap_free(&m); /* twice is harmless */
}

static void test_extreme_keys(void **state)
{
    hashmap_t m = HASHMAP_INIT;
    assert_int_equal(hashmap_put(&m, 0, 100), 0);
    assert_int_equal(hashmap_put(&m, UINT64_MAX, 200), 0);
    assert_int_equal(hashmap_put(&m, UINT64_MAX - 1, UINT64_MAX - 1), 0); /* the largest value */
    assert_int_equal(*hashmap_get(&m, 0), 100);
    assert_int_equal(*hashmap_get(&m, UINT64_MAX), 200);
    assert_true(*hashmap_get(&m, UINT64_MAX - 1) == UINT64_MAX - 1);
    for (uint64_t k = 1; k < 100; k++)
        assert_int_equal(hashmap_put(&m, k, k), 0); /* grows with them inside */
    assert_int_equal(*hashmap_get(&m, 0), 100);
    assert_int_equal(*hashmap_get(&m, UINT64_MAX), 200);
    assert_true(hashmap_del(&m, 0));
    assert_null(hashmap_get(&m, 0));
    assert_true(hashmap_del(&m, UINT64_MAX));
    assert_null(hashmap_get(&m, UINT64_MAX));
    assert_int_equal(hashmap_count(&m), 100);
    check(&m);
    hashmap_free(&m);
}

static void test_grow(void **state)
{
    hashmap_t m = HASHMAP_INIT;
    for (uint64_t k = 0; k < 100000; k++) {
        assert_int_equal(hashmap_put(&m, k * 7919, k), 0);
        if ((k & (k - 1)) == 0)
            check(&m);
    }
    assert_int_equal(hashmap_count(&m), 100000);
    assert_int_equal(m.cap, 262144);
    for (uint64_t k = 0; k < 100000; k++)
        assert_int_equal(*hashmap_get(&m, k * 7919), k);
    assert_null(hashmap_get(&m, 7918));
    check(&m);
    hashmap_free(&m);

    /* reserve: no growth (and so no failure) for the reserved entries */
    assert_int_equal(hashmap_reserve(&m, 1000), 0);
    size_t cap = m.cap;
    assert_true(cap >= 2000);
    hashmap_slot_t *slots = m.slots;
    for (uint64_t k = 0; k < 1000; k++)
        assert_int_equal(hashmap_put(&m, k, k), 0);
    assert_int_equal(m.cap, cap);
    assert_ptr_equal(m.slots, slots);
    assert_int_equal(hashmap_reserve(&m, 10), 0); /* never shrinks */
    assert_int_equal(m.cap, cap);
    hashmap_free(&m);
}

static void test_collisions(void **state)
{
    /* Nine keys sharing home slot 3 of a 32-slot table, then deletions from the middle of the
     * run: the entries after each hole must stay reachable. */
    hashmap_t m = HASHMAP_INIT;
    assert_int_equal(hashmap_reserve(&m, 16), 0);
    assert_int_equal(m.cap, 32);
    uint64_t k[9];
    colliding_keys(k, 9, 32, 3);
    for (int i = 0; i < 9; i++)
        assert_int_equal(hashmap_put(&m, k[i], (uint64_t)i), 0);
    for (int i = 0; i < 9; i++)
        assert_int_equal(*hashmap_get(&m, k[i]), i);
    int order[9] = {4, 0, 8, 2, 6, 1, 7, 3, 5};
    for (int d = 0; d < 9; d++) {
        assert_true(hashmap_del(&m, k[order[d]]));
        check(&m);
        for (int e = 0; e < 9; e++) {
            bool gone = false;
            for (int f = 0; f <= d; f++)
                gone |= order[f] == e;
            if (gone)
                assert_null(hashmap_get(&m, k[e]));
            else
                assert_int_equal(*hashmap_get(&m, k[e]), e);
        }
    }
    assert_int_equal(hashmap_count(&m), 0);

    /* A run that wraps past the end: homes 30 and 31 and 0; deleting at the end must pull the
     * wrapped entries back across slot 0 only when their home allows it. */
    uint64_t a[3], b[3], c[2];
    colliding_keys(a, 3, 32, 30);
    colliding_keys(b, 3, 32, 31);
    colliding_keys(c, 2, 32, 0);
    uint64_t all[8] = {a[0], a[1], a[2], b[0], b[1], b[2], c[0], c[1]};
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < 8; i++)
            assert_int_equal(hashmap_put(&m, all[i], (uint64_t)i), 0);
        assert_int_equal(m.cap, 32);
        assert_true(hashmap_del(&m, all[round]));
        check(&m);
        for (int i = 0; i < 8; i++) {
            if (i == round)
                assert_null(hashmap_get(&m, all[i]));
            else
                assert_int_equal(*hashmap_get(&m, all[i]), i);
        }
        assert_int_equal(hashmap_put(&m, all[round], 99), 0); /* reinsert after delete */
        assert_int_equal(*hashmap_get(&m, all[round]), 99);
        check(&m);
        hashmap_clear(&m);
    }
    hashmap_free(&m);
}

static void test_iteration(void **state)
{
    hashmap_t m = HASHMAP_INIT;
    size_t pos = 0;
    assert_null(hashmap_next(&m, &pos));
    uint64_t sum = 0;
    for (uint64_t k = 1; k <= 1000; k++) {
        assert_int_equal(hashmap_put(&m, k, k * 2), 0);
        sum += k;
    }
    for (uint64_t k = 1; k <= 1000; k += 2)
        assert_true(hashmap_del(&m, k));
    pos = 0;
    size_t seen = 0;
    uint64_t ksum = 0;
    for (hashmap_slot_t *e; (e = hashmap_next(&m, &pos));) {
        assert_int_equal(e->key % 2, 0);
        assert_int_equal(e->val, e->key * 2);
        ksum += e->key;
        seen++;
    }
    assert_int_equal(seen, 500);
    assert_int_equal(ksum, 2 * (500 * 501 / 2));
    assert_null(hashmap_next(&m, &pos)); /* stays at the end */
    (void)sum;
    hashmap_free(&m);
}

static void test_multimap(void **state)
{
    hashmap_t m = HASHMAP_INIT;
    /* Three values under key 7 (hash collisions of different objects), one under 8. */
    assert_int_equal(hashmap_add(&m, 7, 1), 0);
    assert_int_equal(hashmap_add(&m, 8, 5), 0);
    assert_int_equal(hashmap_add(&m, 7, 2), 0);
    assert_int_equal(hashmap_add(&m, 7, 3), 0);
    assert_int_equal(hashmap_count(&m), 4);
    size_t pos = SIZE_MAX;
    uint64_t got = 0;
    int n = 0;
    for (uint64_t *v; (v = hashmap_next_of(&m, 7, &pos));) {
        got |= 1u << *v;
        n++;
    }
    assert_int_equal(n, 3);
    assert_int_equal(got, 0xe);
    assert_false(hashmap_del_pair(&m, 7, 5));
    assert_true(hashmap_del_pair(&m, 7, 2));
    assert_false(hashmap_del_pair(&m, 7, 2));
    pos = SIZE_MAX;
    got = 0;
    for (uint64_t *v; (v = hashmap_next_of(&m, 7, &pos));)
        got |= 1u << *v;
    assert_int_equal(got, 0xa);
    pos = SIZE_MAX;
    assert_int_equal(*hashmap_next_of(&m, 8, &pos), 5);
    assert_null(hashmap_next_of(&m, 8, &pos));
    pos = SIZE_MAX;
    assert_null(hashmap_next_of(&m, 9, &pos));
    check(&m);
    hashmap_free(&m);
}

/* hashmap_find: values name strings in an array; equal hashes are told apart by eq. */
static const char *const find_words[] = {"alpha", "beta", "gamma", "delta"};

static bool word_eq(uint64_t v, const void *ctx)
{
    return strcmp(find_words[v], ctx) == 0;
}

static void test_find(void **state)
{
    hashmap_t m = HASHMAP_INIT_HASHED;
    assert_null(hashmap_find(&m, 1, word_eq, "alpha"));
    /* alpha, beta and gamma collide on hash 1; delta has hash 2 */
    assert_int_equal(hashmap_add(&m, 1, 0), 0);
    assert_int_equal(hashmap_add(&m, 1, 1), 0);
    assert_int_equal(hashmap_add(&m, 2, 3), 0);
    assert_int_equal(hashmap_add(&m, 1, 2), 0);
    assert_int_equal(*hashmap_find(&m, 1, word_eq, "alpha"), 0);
    assert_int_equal(*hashmap_find(&m, 1, word_eq, "beta"), 1);
    assert_int_equal(*hashmap_find(&m, 1, word_eq, "gamma"), 2);
    assert_int_equal(*hashmap_find(&m, 2, word_eq, "delta"), 3);
    assert_null(hashmap_find(&m, 1, word_eq, "delta")); /* right word, wrong hash */
    assert_null(hashmap_find(&m, 3, word_eq, "alpha"));
    assert_true(hashmap_del_pair(&m, 1, 1));
    assert_null(hashmap_find(&m, 1, word_eq, "beta"));
    assert_int_equal(*hashmap_find(&m, 1, word_eq, "gamma"), 2);
    hashmap_free(&m);
}

static void test_upsert(void **state)
{
    hashmap_t m = HASHMAP_INIT;
    bool existed = true;
    uint64_t *v = hashmap_upsert(&m, 42, 0, &existed);
    assert_non_null(v);
    assert_false(existed);
    (*v)++;
    v = hashmap_upsert(&m, 42, 0, &existed);
    assert_true(existed);
    assert_int_equal(*v, 1);
    assert_non_null(hashmap_upsert(&m, 43, 7, NULL));
    assert_int_equal(*hashmap_get(&m, 43), 7);
    hashmap_free(&m);
}

static void test_arena(void **state)
{
    arena_t *a = arena_create(0);
    hashmap_t m;
    hashmap_init(&m, a, 0);
    for (uint64_t k = 0; k < 5000; k++)
        assert_int_equal(hashmap_put(&m, k, k + 1), 0);
    for (uint64_t k = 0; k < 5000; k++)
        assert_int_equal(*hashmap_get(&m, k), k + 1);
    check(&m);
    hashmap_free(&m); /* forgets the arena's memory */
    arena_destroy(a);

    /* a full arena: the insert fails and leaves the table as it was */
    a = arena_create(4096);
    hashmap_init(&m, a, 0);
    int rc = 0;
    uint64_t k = 0;
    for (; rc == 0; k++)
        rc = hashmap_put(&m, k, k);
    assert_int_equal(rc, -1);
    k--; /* the key that failed */
    assert_int_equal(hashmap_count(&m), k);
    assert_null(hashmap_get(&m, k));
    for (uint64_t j = 0; j < k; j++)
        assert_int_equal(*hashmap_get(&m, j), j);
    check(&m);
    arena_destroy(a);
}

/* A table of hashed keys: homes are the keys' low bits (so keys alike in them collide), and
 * every operation works as in a mixed table. */
static void test_hashed_keys(void **state)
{
    hashmap_t m = HASHMAP_INIT_HASHED;
    assert_int_equal(hashmap_reserve(&m, 16), 0);
    for (uint64_t k = 0; k < 8; k++) /* all home at slot 5 of 32 */
        assert_int_equal(hashmap_put(&m, (k << 40) | 5, k), 0);
    assert_int_equal(m.cap, 32);
    for (size_t i = 5; i < 13; i++)
        assert_true((m.slots[i].key & 31) == 5);
    assert_true(hashmap_del(&m, (UINT64_C(3) << 40) | 5));
    check(&m);
    for (uint64_t k = 0; k < 8; k++)
        if (k != 3)
            assert_int_equal(*hashmap_get(&m, (k << 40) | 5), k);
    for (uint64_t k = 0; k < 1000; k++) /* grows, keeping the mode */
        assert_int_equal(hashmap_put(&m, hash_mix64(k + 100), k), 0);
    assert_true(m.hashed);
    for (uint64_t k = 0; k < 1000; k++)
        assert_int_equal(*hashmap_get(&m, hash_mix64(k + 100)), k);
    check(&m);
    hashmap_free(&m);

    arena_t *a = arena_create(0);
    hashmap_init(&m, a, HASHMAP_HASHED_KEYS);
    assert_true(m.hashed);
    assert_int_equal(hashmap_add(&m, 7, 1), 0);
    assert_int_equal(hashmap_add(&m, 7, 2), 0);
    assert_true(hashmap_del_pair(&m, 7, 1));
    assert_int_equal(*hashmap_get(&m, 7), 2);
    arena_destroy(a);
}

/* Random operations on keys from a small range (so inserts hit present keys and deletions hit
 * long runs) checked against a plain array. */
static void test_random_map(void **state)
{
    enum { RANGE = 3000, OPS = 300000 };
    static uint64_t ref[RANGE];
    static bool present[RANGE];
    memset(present, 0, sizeof(present));
    rng_state = 0x2545f4914f6cdd1dULL;
    hashmap_t m = HASHMAP_INIT;
    size_t n = 0;
    for (int op = 0; op < OPS; op++) {
        uint64_t r = rng();
        size_t i = (size_t)(r % RANGE);
        uint64_t key = i == 0 ? UINT64_MAX : (uint64_t)i * 0x10000; /* low bits alike */
        if (i == 1)
            key = 0;
        switch ((r >> 32) % 4) {
        case 0:
        case 1: {
            uint64_t v = r >> 20;
            assert_int_equal(hashmap_put(&m, key, v), 0);
            n += !present[i];
            present[i] = true;
            ref[i] = v;
            break;
        }
        case 2:
            assert_int_equal(hashmap_del(&m, key), present[i]);
            n -= present[i];
            present[i] = false;
            break;
        default: {
            uint64_t *v = hashmap_get(&m, key);
            if (present[i])
                assert_true(v && *v == ref[i]);
            else
                assert_null(v);
        }
        }
        assert_int_equal(hashmap_count(&m), n);
        if (op % 10000 == 0)
            check(&m);
    }
    for (size_t i = 0; i < RANGE; i++) {
        uint64_t key = i == 0 ? UINT64_MAX : i == 1 ? 0 : (uint64_t)i * 0x10000;
        uint64_t *v = hashmap_get(&m, key);
        if (present[i])
            assert_true(v && *v == ref[i]);
        else
            assert_null(v);
    }
    check(&m);
    hashmap_free(&m);
}

/* Random adds and pair deletions in a multimap with few distinct keys, against a list. */
static void test_random_multimap(void **state)
{
    enum { MAXE = 4000, OPS = 100000, KEYS = 64 };
    static uint64_t rk[MAXE], rv[MAXE];
    size_t rn = 0;
    rng_state = 0x9e3779b97f4a7c15ULL;
    hashmap_t m = HASHMAP_INIT;
    uint64_t next_val = 1;
    for (int op = 0; op < OPS; op++) {
        uint64_t r = rng();
        if ((r & 1) && rn < MAXE) {
            uint64_t key = (r >> 8) % KEYS;
            assert_int_equal(hashmap_add(&m, key, next_val), 0);
            rk[rn] = key;
            rv[rn++] = next_val++;
        } else if (rn) {
            size_t i = (size_t)((r >> 8) % rn);
            assert_true(hashmap_del_pair(&m, rk[i], rv[i]));
            assert_false(hashmap_del_pair(&m, rk[i], rv[i]));
            rk[i] = rk[--rn];
            rv[i] = rv[rn];
        }
        if (op % 5000 == 0) {
            check(&m);
            for (uint64_t key = 0; key < KEYS; key++) {
                size_t want = 0, got = 0, pos = SIZE_MAX;
                for (size_t i = 0; i < rn; i++)
                    want += rk[i] == key;
                for (uint64_t *v; (v = hashmap_next_of(&m, key, &pos));) {
                    bool found = false;
                    for (size_t i = 0; i < rn && !found; i++)
                        found = rk[i] == key && rv[i] == *v;
                    assert_true(found);
                    got++;
                }
                assert_int_equal(got, want);
            }
        }
    }
    assert_int_equal(hashmap_count(&m), rn);
    hashmap_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mix64),           cmocka_unit_test(test_basic),
        cmocka_unit_test(test_extreme_keys),    cmocka_unit_test(test_grow),
        cmocka_unit_test(test_collisions),      cmocka_unit_test(test_iteration),
        cmocka_unit_test(test_multimap),        cmocka_unit_test(test_find),
        cmocka_unit_test(test_upsert),          cmocka_unit_test(test_arena),
        cmocka_unit_test(test_hashed_keys),     cmocka_unit_test(test_random_map),
        cmocka_unit_test(test_random_multimap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
