/* Unit tests for storage/head.c: append rules, chunk cutting, stale markers, expiry, querier
 * over the head, snapshot state round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/head.h"

#define STALE_BITS 0x7ff0000000000002ULL

static double stale(void)
{
    uint64_t b = STALE_BITS;
    double d;
    memcpy(&d, &b, 8);
    return d;
}

static uint64_t bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, 8);
    return b;
}

static labels_t lbl(label_t *v, const char *name, const char *job)
{
    v[0] = (label_t){"__name__", name};
    v[1] = (label_t){"job", job};
    return (labels_t){v, 2};
}

typedef struct {
    int64_t t[4096];
    double v[4096];
    size_t n;
    size_t nseries;
    size_t nchunks;
    size_t nint, int_bytes; /* chunks in the integer encoding, their bytes */
    uint8_t enc[64];        /* the first 64 chunks' encodings, in order */
} dump_t;

/* Reads every sample of every series whose label lname is lvalue, in [mint, maxt]. */
static void dump_match(head_t *h, const char *lname, const char *lvalue, int64_t mint, int64_t maxt, dump_t *d)
{
    memset(d, 0, sizeof(*d));
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, lname, lvalue, err, sizeof(err));
    querier_t *q = head_querier(h);
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, mint, maxt, NULL);
    assert_non_null(set);
    const querier_series_t *s;
    while ((s = querier_set_next(set))) {
        d->nseries++;
        for (size_t i = 0; i < s->nchunks; i++) {
            if (d->nchunks + i < 64)
                d->enc[d->nchunks + i] = s->chunks[i].enc;
            d->nint += s->chunks[i].enc == CHUNK_ENC_INT;
            d->int_bytes += s->chunks[i].enc == CHUNK_ENC_INT ? s->chunks[i].len : 0;
            assert_true(s->chunks[i].mint <= s->chunks[i].maxt);
            if (i)
                assert_true(s->chunks[i - 1].maxt < s->chunks[i].mint);
        }
        d->nchunks += s->nchunks;
        querier_iter_t it;
        querier_iter_init(&it, s, mint, maxt);
        int64_t t;
        double v;
        while (querier_iter_next(&it, &t, &v) && d->n < 4096) {
            d->t[d->n] = t;
            d->v[d->n++] = v;
        }
    }
    assert_null(querier_set_error(set));
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
}

/* Every series named name, in [mint, maxt]. */
static void dump(head_t *h, const char *name, int64_t mint, int64_t maxt, dump_t *d)
{
    dump_match(h, "__name__", name, mint, maxt, d);
}

static void test_same_second_and_ooo(void **state)
{
    head_t *h = head_new(NULL);
    label_t v[2];
    labels_t ls = lbl(v, "m", "a");
    assert_int_equal(head_append(h, &ls, 1000, 1), HEAD_OK);
    assert_int_equal(head_append(h, &ls, 1500, 2), HEAD_OK); /* replaces */
    assert_int_equal(head_append(h, &ls, 1200, 3), HEAD_OK); /* same second, later arrival wins */
    dump_t *d = malloc(sizeof(dump_t));
    dump(h, "m", 0, 100000, d);
    assert_int_equal(d->n, 1);
    assert_int_equal(d->t[0], 1200);
    assert_true(d->v[0] == 3);
    assert_int_equal(head_append(h, &ls, 2000, 4), HEAD_OK);
    assert_int_equal(head_append(h, &ls, 5000, 5), HEAD_OK);
    assert_int_equal(head_append(h, &ls, 4999, 6), HEAD_ERR_OUT_OF_ORDER);
    assert_int_equal(head_append(h, &ls, 1000, 6), HEAD_ERR_OUT_OF_ORDER);
    assert_int_equal(head_append(h, &ls, 5999, 7), HEAD_OK);
    dump(h, "m", 0, 100000, d);
    assert_int_equal(d->n, 3);
    assert_int_equal(d->t[0], 1200);
    assert_int_equal(d->t[1], 2000);
    assert_int_equal(d->t[2], 5999);
    assert_true(d->v[2] == 7);
    head_stats_t st;
    head_get_stats(h, &st);
    assert_int_equal(st.series, 1);
    assert_int_equal(st.out_of_order, 2);
    assert_int_equal(st.samples_replaced, 3);
    assert_int_equal(st.min_t, 1000);
    assert_int_equal(st.max_t, 5999);
    free(d);
    head_free(h);
}

static void test_stale_and_special_values(void **state)
{
    head_t *h = head_new(NULL);
    label_t v[2];
    labels_t ls = lbl(v, "m", "a");
    double vals[] = {1.5, stale(), NAN, INFINITY, -INFINITY, -0.0, 4.9e-324, 7};
    for (int i = 0; i < 8; i++)
        assert_int_equal(head_append(h, &ls, 1000 * (i + 1), vals[i]), HEAD_OK);
    dump_t *d = malloc(sizeof(dump_t));
    dump(h, "m", 0, 100000, d);
    assert_int_equal(d->n, 8);
    for (int i = 0; i < 8; i++)
        assert_true(bits(d->v[i]) == bits(vals[i]));
    /* A stale marker as the pending (newest) sample comes back exact too. */
    assert_int_equal(head_append(h, &ls, 9000, stale()), HEAD_OK);
    dump(h, "m", 8500, 100000, d);
    assert_int_equal(d->n, 1);
    assert_true(bits(d->v[0]) == STALE_BITS);
    free(d);
    head_free(h);
}

static void test_chunk_cutting(void **state)
{
    head_options_t o = {.retention_ms = 3600 * 1000, .block_ms = 600 * 1000};
    head_t *h = head_new(&o);
    label_t v[2];
    labels_t ls = lbl(v, "m", "a");
    /* 1 s samples from t=0 for 1000 s: blocks [0,600s) and [600s,1200s). */
    for (int i = 0; i < 1000; i++)
        assert_int_equal(head_append(h, &ls, i * 1000LL, i), HEAD_OK);
    dump_t *d = malloc(sizeof(dump_t));
    dump(h, "m", INT64_MIN, INT64_MAX, d);
    assert_int_equal(d->n, 1000);
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(d->t[i], i * 1000LL);
        assert_true(d->v[i] == i);
    }
    /* Cut at 240 samples or a block boundary: 600 samples in block 0 -> 240,240,120; 400 in
     * block 1 -> 240,160 (incl. pending). */
    assert_int_equal(d->nchunks, 5);
    /* Clipping to a range inside one chunk. */
    dump(h, "m", 10500, 20000, d);
    assert_int_equal(d->n, 10); /* 11 s .. 20 s */
    assert_int_equal(d->t[0], 11000);
    assert_int_equal(d->nchunks, 1);
    /* No chunk straddles the block boundary at 600 s. */
    querier_t *q = head_querier(h);
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, "job", "a", err, sizeof(err));
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *s = querier_set_next(set);
    assert_non_null(s);
    for (size_t i = 0; i < s->nchunks; i++)
        assert_true(s->chunks[i].maxt < 600000 || s->chunks[i].mint >= 600000);
    assert_null(querier_set_next(set));
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
    free(d);
    head_free(h);
}

/* A series cutting at a block boundary opens its next chunk in the buffer of the one it closed:
 * the open capacity stays (no free, no growing from nothing), and the samples stay exact. */
static void test_cut_keeps_open_buffer(void **state)
{
    (void)state;
    head_options_t o = {.retention_ms = 3600 * 1000, .block_ms = 900 * 1000};
    head_t *h = head_new(&o);
    label_t v[2];
    labels_t ls = lbl(v, "m", "a");
    /* 10 s samples fill block 0; the first of block 1 stays pending, so all 90 are encoded */
    for (int i = 0; i < 91; i++)
        assert_int_equal(head_append(h, &ls, i * 10000LL, i * 1.37 + 0.001 * i * i), HEAD_OK);
    head_stats_t before, after;
    head_get_stats(h, &before);
    assert_int_equal(before.chunks, 1);
    assert_true(before.chunk_bytes > 200); /* the open chunk's buffer */
    /* The next sample encodes the pending one of block 1: that cuts (the new one stays pending). */
    assert_int_equal(head_append(h, &ls, 91 * 10000LL, 91 * 1.37 + 0.001 * 91 * 91), HEAD_OK);
    head_get_stats(h, &after);
    assert_int_equal(after.chunks, 2);
    /* The closed chunk (at most the buffer's size) plus the same open capacity again. */
    assert_true(after.chunk_bytes >= before.chunk_bytes + 150);
    assert_true(after.chunk_bytes <= 2 * before.chunk_bytes);
    dump_t *d = malloc(sizeof(dump_t));
    dump(h, "m", INT64_MIN, INT64_MAX, d);
    assert_int_equal(d->n, 92);
    for (int i = 0; i < 92; i++)
        assert_true(d->t[i] == i * 10000LL && d->v[i] == i * 1.37 + 0.001 * i * i);
    free(d);
    head_free(h);
}

static void test_expiry(void **state)
{
    head_options_t o = {.retention_ms = 120 * 1000, .block_ms = 60 * 1000};
    head_t *h = head_new(&o);
    label_t v[2];
    char job[32];
    /* 50 series with 10 s samples over 10 minutes; 10 more that stop after the first minute. */
    for (int i = 0; i < 60; i++) {
        snprintf(job, sizeof(job), "j%d", i);
        labels_t ls = lbl(v, "m", job);
        int64_t end = i < 50 ? 600 : 60;
        for (int64_t t = 0; t < end; t += 10)
            assert_int_equal(head_append(h, &ls, t * 1000, (double)t), HEAD_OK);
    }
    head_stats_t before, after;
    head_get_stats(h, &before);
    assert_int_equal(before.series, 60);
    /* now = 600 s: window starts at floor((600-120)/60)*60 = 480 s. Slices of 7 series. */
    int passes = 0;
    for (int i = 0; i < 1000 && passes < 2; i++)
        passes += head_expire(h, 600 * 1000, 7);
    assert_int_equal(passes, 2);
    assert_int_equal(head_min_valid_time(h), 480 * 1000);
    head_get_stats(h, &after);
    assert_int_equal(after.series, 50); /* the 10 idle series are gone from memory */
    assert_int_equal(after.series_removed, 10);
    assert_true(after.slab_bytes < before.slab_bytes);
    assert_true(after.memory_bytes < before.memory_bytes);
    dump_t *d = malloc(sizeof(dump_t));
    dump(h, "m", INT64_MIN, INT64_MAX, d);
    assert_int_equal(d->nseries, 50);
    assert_int_equal(d->n, 50 * 12); /* 480..590 s */
    for (size_t i = 0; i < d->n; i++)
        assert_true(d->t[i] >= 480000);
    snprintf(job, sizeof(job), "j0");
    labels_t ls = lbl(v, "m", job);
    assert_int_equal(head_append(h, &ls, 479999, 1), HEAD_ERR_TOO_OLD);
    assert_int_equal(head_append(h, &ls, 600000, 1), HEAD_OK);
    /* Everything expires: series and slabs go away entirely. */
    for (int i = 0; i < 1000 && passes < 5; i++)
        passes += head_expire(h, 3600 * 1000, 1000);
    head_get_stats(h, &after);
    assert_int_equal(after.series, 0);
    assert_int_equal(after.slab_bytes, 0);
    assert_int_equal(after.chunks, 0);
    free(d);
    head_free(h);
}

/* The owner's veto (the catalog has not read the series back yet): an empty series the owner
 * still needs stays in memory until the owner lets it go. */
static bool keep_from(void *ud, uint64_t id)
{
    return id < *(uint64_t *)ud;
}

static void test_removal_veto(void **state)
{
    uint64_t written_below = 6;
    head_options_t o = {.retention_ms = 120 * 1000, .block_ms = 60 * 1000, .may_remove = keep_from,
                        .may_remove_ud = &written_below};
    head_t *h = head_new(&o);
    label_t v[2];
    char job[32];
    for (int i = 0; i < 10; i++) { /* ids 1..10 in creation order */
        snprintf(job, sizeof(job), "j%d", i);
        labels_t ls = lbl(v, "m", job);
        assert_int_equal(head_append(h, &ls, 0, 1), HEAD_OK);
    }
    int passes = 0;
    for (int i = 0; i < 1000 && passes < 3; i++)
        passes += head_expire(h, 3600 * 1000, 1000);
    head_stats_t st;
    head_get_stats(h, &st);
    assert_int_equal(st.series, 5); /* ids 6..10 are kept, empty */
    written_below = UINT64_MAX;
    for (int i = 0; i < 1000 && passes < 6; i++)
        passes += head_expire(h, 3600 * 1000, 1000);
    head_get_stats(h, &st);
    assert_int_equal(st.series, 0);
    head_free(h);
}

/* The owner's slot (head_set_aux / head_append_ref_aux): NULL for a new series, kept across
 * appends and chunk cuts, per series; it goes with the series when expiry removes it (the stale
 * ref then sets nothing), and the series made again under the same id starts with NULL. */
static void test_aux_slot(void **state)
{
    head_options_t o = {.retention_ms = 120 * 1000, .block_ms = 60 * 1000};
    head_t *h = head_new(&o);
    label_t v[2];
    labels_t la = lbl(v, "m", "a");
    index_ref_t ra, rb;
    bool created;
    assert_int_equal(head_get_or_create(h, &la, labels_hash(&la), 7, &ra, &created), HEAD_OK);
    assert_true(created);
    label_t w[2];
    labels_t lb = lbl(w, "m", "b");
    assert_int_equal(head_get_or_create(h, &lb, labels_hash(&lb), 8, &rb, &created), HEAD_OK);
    void *aux = &aux;
    assert_int_equal(head_append_ref_aux(h, &ra, 0, 1, &aux), HEAD_OK);
    assert_null(aux);
    int x, y;
    assert_true(head_set_aux(h, &ra, &x));
    assert_true(head_set_aux(h, &rb, &y));
    /* 10 s samples over 3 blocks: chunks are cut, the slot stays. */
    for (int64_t t = 10; t < 180; t += 10) {
        assert_int_equal(head_append_ref_aux(h, &ra, t * 1000, (double)t, &aux), HEAD_OK);
        assert_ptr_equal(aux, &x);
    }
    /* A refused sample still reports the slot. */
    aux = NULL;
    assert_int_equal(head_append_ref_aux(h, &ra, 5000, 1, &aux), HEAD_ERR_OUT_OF_ORDER);
    assert_ptr_equal(aux, &x);
    assert_int_equal(head_append_ref_aux(h, &rb, 170000, 1, &aux), HEAD_OK);
    assert_ptr_equal(aux, &y);
    /* Everything expires; both series leave memory with their slots. */
    int passes = 0;
    for (int i = 0; i < 1000 && passes < 4; i++)
        passes += head_expire(h, 3600 * 1000, 1000);
    head_stats_t st;
    head_get_stats(h, &st);
    assert_int_equal(st.series, 0);
    assert_false(head_set_aux(h, &ra, &y));
    assert_int_equal(head_append_ref_aux(h, &ra, 3600 * 1000, 1, &aux), HEAD_ERR_NOT_FOUND);
    /* Back under the same id (maybe in the same slot): a fresh, empty slot. */
    assert_int_equal(head_get_or_create(h, &la, labels_hash(&la), 7, &ra, &created), HEAD_OK);
    assert_true(created);
    aux = &aux;
    assert_int_equal(head_append_ref_aux(h, &ra, 3600 * 1000, 1, &aux), HEAD_OK);
    assert_null(aux);
    head_free(h);
}

static void test_querier_select(void **state)
{
    head_t *h = head_new(NULL);
    label_t v[2];
    const char *jobs[] = {"c", "a", "b"};
    for (int i = 0; i < 3; i++) {
        labels_t ls = lbl(v, "up", jobs[i]);
        assert_int_equal(head_append(h, &ls, 1000, i), HEAD_OK);
    }
    labels_t other = lbl(v, "down", "a");
    assert_int_equal(head_append(h, &other, 1000, 9), HEAD_OK);
    querier_t *q = head_querier(h);
    char err[64];
    matcher_t *ms[2] = {matcher_new(MATCHER_EQ, "__name__", "up", err, sizeof(err)),
                        matcher_new(MATCHER_NEQ, "job", "b", err, sizeof(err))};
    querier_set_t *set = querier_select(q, (const matcher_t *const *)ms, 2, 0, 5000, NULL);
    const querier_series_t *s = querier_set_next(set);
    assert_string_equal(labels_get(&s->labels, "job"), "a"); /* sorted by labels */
    s = querier_set_next(set);
    assert_string_equal(labels_get(&s->labels, "job"), "c");
    assert_null(querier_set_next(set));
    querier_set_free(set);
    /* Out of the time range: no series. */
    set = querier_select(q, (const matcher_t *const *)ms, 1, 2000, 5000, NULL);
    assert_null(querier_set_next(set));
    querier_set_free(set);
    arena_t *a = arena_create(0);
    const char **out;
    size_t n;
    assert_int_equal(querier_label_values(q, "job", NULL, 0, 0, 5000, a, &out, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 3);
    assert_int_equal(querier_label_values(q, "__name__", NULL, 0, 0, 5000, a, &out, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 2);
    assert_string_equal(out[0], "down");
    assert_int_equal(querier_label_names(q, NULL, 0, 0, 5000, a, &out, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 2);
    arena_destroy(a);
    querier_close(q);
    matcher_free(ms[0]);
    matcher_free(ms[1]);
    head_free(h);
}

typedef struct {
    head_t *dst;
    int n;
} copy_ctx_t;

static int copy_one(void *ud, const head_series_state_t *st)
{
    copy_ctx_t *c = ud;
    assert_int_equal(head_restore_series(c->dst, st), HEAD_OK);
    c->n++;
    return 0;
}

static void test_state_round_trip(void **state)
{
    head_t *h = head_new(NULL), *h2 = head_new(NULL);
    label_t v[2];
    labels_t a = lbl(v, "m", "a");
    for (int i = 0; i < 300; i++)
        assert_int_equal(head_append(h, &a, 1000LL * i, i * 0.5), HEAD_OK);
    labels_t b = lbl(v, "m", "b");
    assert_int_equal(head_append(h, &b, 5000, stale()), HEAD_OK);
    labels_t ic = lbl(v, "n", "c"); /* integers: its first 240 samples close as an integer chunk */
    for (int i = 0; i < 300; i++)
        assert_int_equal(head_append(h, &ic, 1000LL * i, 1000.0 * i + i % 7), HEAD_OK);
    copy_ctx_t c = {h2, 0};
    assert_int_equal(head_foreach_series(h, copy_one, &c), 0);
    assert_int_equal(c.n, 3);
    dump_t *d1 = malloc(sizeof(dump_t)), *d2 = malloc(sizeof(dump_t));
    dump(h, "m", INT64_MIN, INT64_MAX, d1);
    dump(h2, "m", INT64_MIN, INT64_MAX, d2);
    assert_int_equal(d1->n, 301);
    assert_int_equal(d1->n, d2->n);
    for (size_t i = 0; i < d1->n; i++) {
        assert_int_equal(d1->t[i], d2->t[i]);
        assert_true(bits(d1->v[i]) == bits(d2->v[i]));
    }
    dump(h, "n", INT64_MIN, INT64_MAX, d1);
    dump(h2, "n", INT64_MIN, INT64_MAX, d2);
    assert_int_equal(d1->n, 300);
    assert_int_equal(d1->nint, 2); /* the closed chunk and the open one */
    assert_int_equal(d2->nint, 2); /* the open one restored in its own encoding */
    assert_int_equal(d1->n, d2->n);
    for (size_t i = 0; i < d1->n; i++) {
        assert_int_equal(d1->t[i], d2->t[i]);
        assert_true(bits(d1->v[i]) == bits(d2->v[i]));
    }
    /* ...and the restored open chunk takes appends like the original */
    for (int i = 300; i < 320; i++) {
        assert_int_equal(head_append(h, &ic, 1000LL * i, 1000.0 * i), HEAD_OK);
        assert_int_equal(head_append(h2, &ic, 1000LL * i, 1000.0 * i), HEAD_OK);
    }
    dump(h, "n", INT64_MIN, INT64_MAX, d1);
    dump(h2, "n", INT64_MIN, INT64_MAX, d2);
    assert_int_equal(d1->n, 320);
    assert_int_equal(d1->n, d2->n);
    for (size_t i = 0; i < d1->n; i++) {
        assert_int_equal(d1->t[i], d2->t[i]);
        assert_true(bits(d1->v[i]) == bits(d2->v[i]));
    }
    /* The restored series keeps the same-second rule: its pending sample is replaceable. */
    labels_t a2 = lbl(v, "m", "a");
    assert_int_equal(head_append(h2, &a2, 299500, 42), HEAD_OK);
    assert_int_equal(head_append(h2, &a2, 298000, 1), HEAD_ERR_OUT_OF_ORDER);
    assert_int_equal(head_append(h2, &a2, 300000, 43), HEAD_OK);
    dump(h2, "m", 299000, INT64_MAX, d2);
    assert_int_equal(d2->n, 2); /* 299.5 s replaced 299 s; then 300 s */
    assert_int_equal(d2->t[0], 299500);
    assert_true(d2->v[0] == 42);
    free(d1);
    free(d2);
    head_free(h);
    head_free(h2);
}

/* A closed chunk whose values are all integers is kept in the integer encoding, smaller and with
 * every sample exact; one fraction, a -0.0 or a stale marker keeps a chunk XOR, bit for bit. */
static void test_integer_chunks(void **state)
{
    (void)state;
    head_options_t o = {.retention_ms = 3600 * 1000, .block_ms = 900 * 1000};
    head_t *h = head_new(&o), *hx = head_new(&o);
    const int64_t base = 1700000100000LL; /* a block start */
    label_t lv[2];
    enum { S = 6, N = 200 }; /* 90 + 90 closed at the block boundaries, 20 open */
    uint64_t x = 99;
    double val[3] = {1e6, 0, -5e12};
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < S; k++) {
            char job[8];
            snprintf(job, sizeof(job), "j%d", k);
            labels_t ls = lbl(lv, "ints", job);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            double v;
            switch (k) {
            case 0: v = val[0] += 900 + (double)(x % 200); break; /* a counter */
            case 1:
                v = (x % 10 == 0) ? (double)(x % 100) : val[1]; /* a gauge */
                val[1] = v;
                break;
            case 2: v = val[2] -= 3; break;                                  /* negative, steady */
            case 3: v = (i == 20) ? -0.0 : (double)i; break;                 /* -0.0 in the first chunk */
            case 4: v = (i == 100) ? stale() : (i == 150 ? 2.5 : 1); break; /* stale, fraction */
            default: v = (i == N - 1) ? 0.5 : 7.0 * i; break; /* a fraction, still pending */
            }
            int64_t t = base + i * 10000LL + (k == 0 ? (int64_t)(x % 30) : 0); /* jitter on 0 */
            assert_int_equal(head_append(h, &ls, t, v), HEAD_OK);
            if (k == 0)
                assert_int_equal(head_append(hx, &ls, t, v), HEAD_OK);
        }
    }
    dump_t *d = malloc(sizeof(dump_t));
    /* Open chunks of integers are integer chunks too, the pending sample appended to the copy
     * a reader gets. j0-j2 are integers throughout; j3's first chunk (the -0.0) and j4's second
     * (the stale marker, then the 2.5 that turned the open chunk into XOR) stay XOR; j5's
     * pending 0.5 comes as a one-sample XOR chunk after its integer open chunk. */
    size_t want_int[S] = {3, 3, 3, 2, 2, 3};
    for (int k = 0; k < S; k++) {
        char job[8];
        snprintf(job, sizeof(job), "j%d", k);
        dump_match(h, "job", job, INT64_MIN, INT64_MAX, d);
        assert_int_equal(d->nseries, 1);
        assert_int_equal(d->nchunks, k == 5 ? 4 : 3);
        assert_int_equal(d->nint, want_int[k]);
        assert_int_equal(d->enc[2], CHUNK_ENC_INT); /* the open chunk */
        if (k == 5)
            assert_int_equal(d->enc[3], CHUNK_ENC_XOR);
        assert_int_equal(d->n, N);
        if (k == 3)
            assert_true(d->v[20] == 0 && signbit(d->v[20]));
        if (k == 4)
            assert_true(bits(d->v[100]) == bits(stale()));
    }
    /* the jittered counter alone: ~19 bits per closed sample (11 of timestamp, 8 of value)
     * where XOR takes ~37, so its two closed chunks and its 20-sample open one stay under 600
     * bytes (XOR: ~960) */
    dump_t *dx = malloc(sizeof(dump_t));
    dump(hx, "ints", INT64_MIN, INT64_MAX, dx);
    assert_int_equal(dx->n, N);
    assert_int_equal(dx->nint, 3);
    assert_true(dx->int_bytes < 600); /* with the 20-sample open chunk */
    dump(h, "ints", INT64_MIN, INT64_MAX, d);
    assert_int_equal(d->n, S * N);
    free(dx);
    free(d);
    head_free(h);
    head_free(hx);
}

/* A reader sees an integer open chunk plus its pending sample at every size, including the sizes
 * where appending re-encodes the chunk (the 2nd and 4th sample, the first irregular timestamp),
 * and after every kind of value that turns it into XOR. */
static void test_open_integer_reads(void **state)
{
    (void)state;
    head_options_t o = {.retention_ms = 3600 * 1000, .block_ms = 900 * 1000};
    label_t lv[2];
    const int64_t base = 1700000100000LL; /* a block start */
    dump_t *d = malloc(sizeof(dump_t));
    for (int shape = 0; shape < 4; shape++) {
        head_t *h = head_new(&o);
        labels_t ls = lbl(lv, "oi", "a");
        int64_t ts[12];
        double vs[12];
        for (int i = 0; i < 12; i++) {
            ts[i] = base + i * 10000LL + (shape == 1 && i >= 5 ? 7 : 0); /* irregular from the 6th */
            vs[i] = shape == 2 ? (double)(i % 3) : 1000.0 * i + (i % 4); /* a gauge, or a counter */
            if (shape == 3 && i == 8)
                vs[i] = 0.25; /* a fraction: pending, then encoded (the chunk turns XOR) */
            assert_int_equal(head_append(h, &ls, ts[i], vs[i]), HEAD_OK);
            dump(h, "oi", INT64_MIN, INT64_MAX, d);
            assert_int_equal(d->n, (size_t)i + 1);
            for (int k = 0; k <= i; k++) {
                assert_int_equal(d->t[k], ts[k]);
                assert_true(bits(d->v[k]) == bits(vs[k]));
            }
            /* one chunk (the pending sample appended to the copy), or two when the pending
             * value is the fraction; once encoded, the fraction made the open chunk XOR. The
             * first sample alone is only pending: there is no open chunk yet. */
            assert_int_equal(d->nchunks, shape == 3 && i == 8 ? 2 : 1);
            assert_int_equal(d->enc[0], i == 0 || (shape == 3 && i > 8) ? CHUNK_ENC_XOR : CHUNK_ENC_INT);
        }
        head_free(h);
    }
    free(d);
}

/* Worst-case encodings (random value bits, every dod class, 64-bit jumps) grow the open chunk in
 * its small steps and through the record list; every sample comes back bit-exact and every
 * chunk is a valid XOR chunk of at most 240 samples. */
static void test_hard_samples_round_trip(void **state)
{
    head_options_t o = {.retention_ms = 400LL * 86400 * 1000, .block_ms = 100LL * 86400 * 1000};
    head_t *h = head_new(&o);
    label_t lv[2];
    labels_t ls = lbl(lv, "hard", "a");
    enum { N = 1500 };
    int64_t *ts = malloc(sizeof(int64_t) * N);
    uint64_t *vb = malloc(sizeof(uint64_t) * N);
    uint64_t x = 0x2545F4914F6CDD1DULL;
    int64_t t = 1000;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* mostly 1 s steps, sometimes big jumps, twice more than INT32_MAX ms (~25 days) */
        int64_t step = (i % 97 == 0) ? 1000 * (int64_t)(x % 100000) : 1000 + 1000 * (int64_t)(x % 3);
        if (i == 700 || i == 1200)
            step = 30LL * 86400 * 1000;
        t += step;
        ts[i] = t;
        vb[i] = (i % 5 == 0) ? x : bits((double)(x % 1000)); /* random NaNs and denormals too */
        double v;
        memcpy(&v, &vb[i], 8);
        assert_int_equal(head_append(h, &ls, t, v), HEAD_OK);
    }
    querier_t *q = head_querier(h);
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", "hard", err, sizeof(err));
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *s = querier_set_next(set);
    assert_non_null(s);
    int n = 0;
    for (size_t c = 0; c < s->nchunks; c++) {
        const querier_chunk_t *ch = &s->chunks[c];
        int num = ch->bytes[0] << 8 | ch->bytes[1];
        assert_true(num >= 1 && num <= 240);
        chunk_xor_iter_t it;
        chunk_xor_iter_init(&it, ch->bytes, ch->len);
        int64_t tt;
        double v;
        int k = 0;
        while (chunk_xor_iter_next(&it, &tt, &v)) {
            assert_true(n < N);
            assert_int_equal(tt, ts[n]);
            uint64_t b;
            memcpy(&b, &v, 8);
            assert_true(b == vb[n]);
            if (k == 0)
                assert_int_equal(tt, ch->mint);
            assert_true(tt <= ch->maxt);
            n++, k++;
        }
        assert_int_equal(it.err, 0);
        assert_int_equal(k, num);
        /* the 30-day jumps cut a chunk even inside one (100-day) block */
        if (c + 1 < s->nchunks)
            assert_true(s->chunks[c + 1].mint - ch->maxt <= INT32_MAX || num < 240);
    }
    assert_int_equal(n, N);
    head_stats_t st;
    head_get_stats(h, &st);
    assert_int_equal(st.chunks, s->nchunks);
    assert_int_equal(st.samples_appended, N);
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
    free(ts);
    free(vb);
    head_free(h);
}

/* Closed chunks of many series share block slabs; reading while appending keeps every series'
 * own chunk chain (records link only within a series). */
static void test_many_series_chains(void **state)
{
    head_options_t o = {.retention_ms = 3600 * 1000, .block_ms = 300 * 1000};
    head_t *h = head_new(&o);
    label_t lv[2];
    char job[16];
    for (int i = 0; i < 1200; i++) /* 1 s samples for 20 minutes: 4 blocks */
        for (int k = 0; k < 20; k++) {
            snprintf(job, sizeof(job), "j%d", k);
            labels_t ls = lbl(lv, "chain", job);
            assert_int_equal(head_append(h, &ls, 1000LL * i, k * 1e6 + i), HEAD_OK);
        }
    head_stats_t st;
    head_get_stats(h, &st);
    assert_int_equal(st.series, 20);
    assert_true(st.slab_bytes >= 4 * 64 * 1024); /* one mmap'd page per block at least */
    dump_t *d = malloc(sizeof(dump_t));
    for (int k = 0; k < 20; k++) {
        snprintf(job, sizeof(job), "j%d", k);
        dump_match(h, "job", job, INT64_MIN, INT64_MAX, d);
        assert_int_equal(d->nseries, 1);
        assert_int_equal(d->n, 1200);
        for (int n = 0; n < 1200; n++) {
            assert_int_equal(d->t[n], 1000LL * n);
            assert_true(d->v[n] == k * 1e6 + n);
        }
    }
    free(d);
    head_free(h);
}

/* head_check_batch / head_append_batch give what the single calls give, sample by sample: over
 * many series (every index shard), a stale ref, a selection that skips samples, and two samples
 * of one series in one batch (applied in selection order). */
static void test_batch_check_append(void **state)
{
    enum { N = 300 };
    head_t *h = head_new(NULL);
    head_t *one = head_new(NULL); /* the same appends through the single calls */
    index_ref_t refs[N + 2], refs1[N + 2];
    char names[N][16];
    for (int i = 0; i < N; i++) {
        label_t v[2];
        snprintf(names[i], sizeof(names[i]), "s%d", i);
        labels_t ls = lbl(v, names[i], "a");
        bool created;
        assert_int_equal(head_get_or_create(h, &ls, labels_hash(&ls), 100 + i, &refs[i], &created), HEAD_OK);
        assert_int_equal(head_get_or_create(one, &ls, labels_hash(&ls), 100 + i, &refs1[i], &created), HEAD_OK);
        assert_int_equal(head_append_ref(h, &refs[i], 5000, 1), HEAD_OK);
        assert_int_equal(head_append_ref(one, &refs1[i], 5000, 1), HEAD_OK);
    }
    refs[N] = (index_ref_t){.id = 99999, .shard = refs[0].shard, .slot = refs[0].slot}; /* stale */
    refs1[N] = refs[N];
    refs[N + 1] = refs[8]; /* series 8 again, later */
    refs1[N + 1] = refs1[8];
    int64_t t[N + 2];
    double v[N + 2];
    uint32_t sel[N + 2];
    size_t m = 0;
    for (int i = 0; i < N + 2; i++) {
        /* every 5th sample goes back in time; every 3rd is not selected */
        t[i] = i % 5 == 0 ? 4000 : 6000 + i;
        v[i] = i;
        if (i % 3 != 1 || i == N + 1)
            sel[m++] = (uint32_t)i;
    }
    t[N + 1] = 9000;
    int8_t rc[N + 2];
    memset(rc, 99, sizeof(rc));
    assert_int_equal(head_check_batch(h, refs, t, sel, m, rc), 0);
    for (size_t j = 0; j < m; j++) {
        uint32_t i = sel[j];
        assert_int_equal(rc[i], head_check(one, &refs1[i], t[i]));
        assert_int_equal(rc[i], i == N ? HEAD_ERR_NOT_FOUND : i % 5 == 0 ? HEAD_ERR_OUT_OF_ORDER : HEAD_OK);
    }
    for (int i = 0; i < N + 2; i++)
        if (i % 3 == 1 && i != N + 1)
            assert_int_equal(rc[i], 99); /* not selected: untouched */
    memset(rc, 99, sizeof(rc));
    assert_int_equal(head_append_batch(h, refs, t, v, sel, m, rc, NULL), 0);
    for (size_t j = 0; j < m; j++) {
        uint32_t i = sel[j];
        assert_int_equal(rc[i], head_append_ref(one, &refs1[i], t[i], v[i]));
    }
    head_stats_t a, b;
    head_get_stats(h, &a);
    head_get_stats(one, &b);
    assert_int_equal(a.out_of_order, b.out_of_order);
    assert_int_equal(a.samples_appended, b.samples_appended);
    dump_t *d = malloc(sizeof(dump_t)), *d1 = malloc(sizeof(dump_t));
    for (int i = 0; i < N; i += 7) {
        dump(h, names[i], 0, 100000, d);
        dump(one, names[i], 0, 100000, d1);
        assert_int_equal(d->n, d1->n);
        for (size_t k = 0; k < d->n; k++) {
            assert_int_equal(d->t[k], d1->t[k]);
            assert_true(d->v[k] == d1->v[k]);
        }
    }
    dump(h, names[8], 0, 100000, d); /* 5000, 6008 then 9000 (the second sample of the batch) */
    assert_int_equal(d->n, 3);
    assert_int_equal(d->t[2], 9000);
    free(d);
    free(d1);
    head_free(h);
    head_free(one);
}

/* The open chunk's buffer follows its samples, with no worst-case record kept spare: steady
 * counters (Flink's shape, 10 s apart) fit their first five encoded samples in the first 40
 * bytes (the old reserve grew them to 56 at the second), and 90 of them in under 1.3x what they
 * encode to. */
static void test_open_chunk_sized_to_samples(void **state)
{
    (void)state;
    head_options_t o = {.retention_ms = 3600 * 1000, .block_ms = 900 * 1000};
    head_t *h = head_new(&o);
    enum { S = 200 };
    const int64_t base = 1700000100000LL; /* a block start */
    label_t v[2];
    char job[16];
    double val[S] = {0};
    head_stats_t st;
    for (int i = 0; i < 90; i++) {
        for (int k = 0; k < S; k++) {
            snprintf(job, sizeof(job), "j%d", k);
            labels_t ls = lbl(v, "c", job);
            val[k] += 1 + (k * 7919 + i * 31) % 50;
            val[k] += (i == 89) ? 0.5 : 0; /* a fraction at the end: the closed chunk stays XOR */
            assert_int_equal(head_append(h, &ls, base + i * 10000LL, val[k]), HEAD_OK);
        }
        if (i == 5) {
            head_get_stats(h, &st);
            assert_int_equal(st.chunks, S);
            assert_true(st.chunk_bytes <= 40 * S); /* five encoded, one pending */
        }
    }
    /* A sample of a later block encodes the 90th into the open chunk; the next one cuts it. */
    for (int k = 0; k < S; k++) {
        snprintf(job, sizeof(job), "j%d", k);
        labels_t ls = lbl(v, "c", job);
        assert_int_equal(head_append(h, &ls, base + 900 * 10000LL, 0), HEAD_OK);
    }
    head_get_stats(h, &st);
    assert_int_equal(st.chunks, S);
    uint64_t open_cap = st.chunk_bytes;
    for (int k = 0; k < S; k++) {
        snprintf(job, sizeof(job), "j%d", k);
        labels_t ls = lbl(v, "c", job);
        assert_int_equal(head_append(h, &ls, base + 901 * 10000LL, 0), HEAD_OK);
    }
    head_get_stats(h, &st);
    assert_int_equal(st.chunks, 2 * S);
    /* Closed chunks are packed at their exact size; the open buffers were kept for the next. */
    uint64_t closed = st.chunk_bytes - open_cap;
    assert_true(closed > 90 * S);
    assert_true(open_cap * 10 <= closed * 13);
    dump_t *d = malloc(sizeof(dump_t));
    dump(h, "c", base, base + 89 * 10000LL, d);
    assert_int_equal(d->nseries, S);
    assert_int_equal(d->n, 4096); /* capped by dump; values are checked by the other tests */
    free(d);
    head_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_second_and_ooo),
        cmocka_unit_test(test_stale_and_special_values),
        cmocka_unit_test(test_chunk_cutting),
        cmocka_unit_test(test_cut_keeps_open_buffer),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_removal_veto),
        cmocka_unit_test(test_aux_slot),
        cmocka_unit_test(test_querier_select),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_integer_chunks),
        cmocka_unit_test(test_open_integer_reads),
        cmocka_unit_test(test_hard_samples_round_trip),
        cmocka_unit_test(test_many_series_chains),
        cmocka_unit_test(test_batch_check_append),
        cmocka_unit_test(test_open_chunk_sized_to_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
