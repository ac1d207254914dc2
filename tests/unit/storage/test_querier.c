/* Unit tests for storage/querier.h (the sample iterator over chunks) through the head querier,
 * and a memory measurement: bytes per sample in chunks and per series for 2h of 10 s samples on
 * Flink-shaped series (printed; the only assertions are loose sanity bounds). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "storage/head.h"

static void test_iter_clipping(void **state)
{
    /* Hand-built series: two chunks [0..9 s] and [20..29 s], 1 s apart; the first XOR, the
     * second in the head's integer encoding. */
    chunk_xor_appender_t a1;
    assert_int_equal(chunk_xor_appender_init(&a1), 0);
    int64_t t2[10];
    double v2[10];
    for (int i = 0; i < 10; i++) {
        chunk_xor_append(&a1, i * 1000, i);
        t2[i] = (20 + i) * 1000;
        v2[i] = 20 + i;
    }
    size_t l1;
    uint8_t b2[64];
    size_t l2 = chunk_int_encode(t2, v2, 10, b2, sizeof(b2));
    assert_true(l2 > 0);
    const uint8_t *b1 = chunk_xor_bytes(&a1, &l1);
    querier_chunk_t ch[2] = {{0, 9000, b1, l1, CHUNK_ENC_XOR}, {20000, 29000, b2, l2, CHUNK_ENC_INT}};
    label_t l[] = {{"__name__", "x"}};
    querier_series_t s = {.labels = {l, 1}, .chunks = ch, .nchunks = 2};
    struct {
        int64_t mint, maxt;
        int n;
        int64_t first, last;
    } cases[] = {
        {INT64_MIN, INT64_MAX, 20, 0, 29000}, {5000, 25000, 11, 5000, 25000}, {9500, 19999, 0, 0, 0},
        {9000, 20000, 2, 9000, 20000},        {30000, 40000, 0, 0, 0},        {-5000, 0, 1, 0, 0},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        querier_iter_t it;
        querier_iter_init(&it, &s, cases[c].mint, cases[c].maxt);
        int64_t t, first = 0, last = 0;
        double v;
        int n = 0;
        while (querier_iter_next(&it, &t, &v)) {
            if (n == 0)
                first = t;
            last = t;
            assert_true(v == t / 1000);
            n++;
        }
        assert_int_equal(n, cases[c].n);
        if (n) {
            assert_int_equal(first, cases[c].first);
            assert_int_equal(last, cases[c].last);
        }
    }
    querier_series_t empty = {.labels = {l, 1}};
    querier_iter_t it;
    querier_iter_init(&it, &empty, INT64_MIN, INT64_MAX);
    int64_t t;
    double v;
    assert_false(querier_iter_next(&it, &t, &v));
    chunk_xor_appender_free(&a1);
}

static void test_chunks_are_prometheus_chunks(void **state)
{
    /* The chunk bytes a querier hands out decode on their own, start with the sample count,
     * and carry exact min/max times (what remote read streams). */
    head_t *h = head_new(NULL);
    label_t l[] = {{"__name__", "x"}};
    labels_t ls = {l, 1};
    for (int i = 0; i < 250; i++)
        assert_int_equal(head_append(h, &ls, 1000000 + i * 15000LL, i * 1.25), HEAD_OK);
    querier_t *q = head_querier(h);
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", "x", err, sizeof(err));
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *s = querier_set_next(set);
    assert_non_null(s);
    int total = 0;
    for (size_t i = 0; i < s->nchunks; i++) {
        const querier_chunk_t *c = &s->chunks[i];
        int num = c->bytes[0] << 8 | c->bytes[1];
        chunk_xor_iter_t it;
        chunk_xor_iter_init(&it, c->bytes, c->len);
        int64_t t, first = -1, last = -1;
        double v;
        int n = 0;
        while (chunk_xor_iter_next(&it, &t, &v)) {
            if (first < 0)
                first = t;
            last = t;
            n++;
        }
        assert_int_equal(it.err, 0);
        assert_int_equal(n, num);
        assert_true(n <= CHUNK_XOR_MAX_SAMPLES + 1);
        assert_int_equal(first, c->mint);
        assert_int_equal(last, c->maxt);
        total += n;
    }
    assert_int_equal(total, 250);
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
    head_free(h);
}

static void test_memory_per_series(void **state)
{
    /* 1000 Flink-shaped series (11 labels, shared job/host values, a unique task id), 2h of
     * 10 s samples: half counters growing by varying integer amounts, half slowly moving gauges. */
    head_t *h = head_new(NULL);
    enum { SERIES = 1000, SAMPLES = 720 };
    char names[SERIES][48], tms[SERIES][24], subtasks[SERIES][8], tasks[SERIES][40];
    label_t lv[SERIES][11];
    for (int s = 0; s < SERIES; s++) {
        snprintf(names[s], sizeof(names[s]), "flink_taskmanager_job_task_operator_m%d", s % 25);
        snprintf(tms[s], sizeof(tms[s]), "tm-%d", s % 40);
        snprintf(subtasks[s], sizeof(subtasks[s]), "%d", s % 16);
        snprintf(tasks[s], sizeof(tasks[s]), "task-%08x", (unsigned)(s * 2654435761u));
        label_t *l = lv[s];
        l[0] = (label_t){"__name__", names[s]};
        l[1] = (label_t){"host", tms[s]};
        l[2] = (label_t){"job", "pushgateway"};
        l[3] = (label_t){"job_id", "5d41402abc4b2a76b9719d911017c592"};
        l[4] = (label_t){"job_name", "orders-enrichment"};
        l[5] = (label_t){"operator_id", "cbc357ccb763df2852fee8c4fc7d55f2"};
        l[6] = (label_t){"operator_name", "Map"};
        l[7] = (label_t){"subtask_index", subtasks[s]};
        l[8] = (label_t){"task_attempt_id", tasks[s]};
        l[9] = (label_t){"task_name", "Source__Kafka____Map"};
        l[10] = (label_t){"tm_id", tms[s]};
    }
    uint64_t x = 88172645463325252ULL;
    double vals[SERIES] = {0};
    for (int i = 0; i < SAMPLES; i++) {
        for (int s = 0; s < SERIES; s++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if (s % 2 == 0)
                vals[s] += (double)(900 + x % 200); /* counter: ~1000 records per 10 s */
            else if (x % 10 == 0)
                vals[s] = (double)(x % 100); /* gauge changing now and then */
            labels_t ls = {lv[s], 11};
            assert_int_equal(head_append(h, &ls, 1700000000000LL + i * 10000LL, vals[s]), HEAD_OK);
        }
    }
    head_expire(h, 1700000000000LL + SAMPLES * 10000LL, 100000); /* packs idle open chunks */
    head_stats_t st;
    head_get_stats(h, &st);
    double per_sample = (double)(st.chunk_bytes) / ((double)SERIES * SAMPLES);
    double per_series = (double)st.memory_bytes / SERIES;
    fprintf(
        stderr,
        "head memory: %.2f bytes/sample in chunks (encoded %llu, slab %llu), %.0f bytes/series total, %llu chunks\n",
        per_sample, (unsigned long long)st.chunk_bytes, (unsigned long long)st.slab_bytes, per_series,
        (unsigned long long)st.chunks);
    assert_true(per_sample < 8);
    assert_true(per_series < 8192);
    head_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iter_clipping),
        cmocka_unit_test(test_chunks_are_prometheus_chunks),
        cmocka_unit_test(test_memory_per_series),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
