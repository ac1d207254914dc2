/* Unit tests for storage/index.c: interning, lookup, postings selection with Prometheus matcher
 * semantics, label names/values, removal, limits, series records from the shard pools. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/index.h"

typedef struct {
    uint64_t marker;
} payload_t;

/* Builds labels from "k=v,k=v" (sorted by the caller's order after labels_sort). */
static labels_t mk(arena_t *a, const char *spec)
{
    labels_t ls = {arena_alloc(a, sizeof(label_t) * 16), 0};
    char *s = arena_strdup(a, spec), *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        *eq = 0;
        ls.v[ls.n].name = tok;
        ls.v[ls.n].value = eq + 1;
        ls.n++;
    }
    labels_sort(&ls);
    return ls;
}

static uint64_t add(index_t *ix, arena_t *a, const char *spec, uint64_t id)
{
    labels_t ls = mk(a, spec);
    index_series_t *s;
    bool created;
    assert_int_equal(index_acquire_or_create(ix, &ls, labels_hash(&ls), id, &s, &created), INDEX_OK);
    uint64_t got = index_series_id(s);
    index_release(ix, s);
    return got;
}

/* Selects with matchers given as (type, name, value) triples; returns sorted ids as a string. */
static const char *sel(index_t *ix, int n, ...)
{
    static char out[512];
    matcher_t *ms[8];
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        matcher_type_t t = va_arg(ap, matcher_type_t);
        const char *name = va_arg(ap, const char *);
        const char *value = va_arg(ap, const char *);
        char err[128];
        ms[i] = matcher_new(t, name, value, err, sizeof(err));
        assert_non_null(ms[i]);
    }
    va_end(ap);
    index_refs_t refs = {0};
    assert_int_equal(index_select(ix, (const matcher_t *const *)ms, (size_t)n, &refs), INDEX_OK);
    uint64_t ids[64];
    size_t k = 0;
    for (size_t i = 0; i < refs.n && k < 64; i++)
        ids[k++] = refs.v[i].id;
    for (size_t i = 0; i < k; i++)
        for (size_t j = i + 1; j < k; j++)
            if (ids[j] < ids[i]) {
                uint64_t t = ids[i];
                ids[i] = ids[j];
                ids[j] = t;
            }
    out[0] = 0;
    for (size_t i = 0; i < k; i++)
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%llu", i ? "," : "", (unsigned long long)ids[i]);
    index_refs_free(&refs);
    for (int i = 0; i < n; i++)
        matcher_free(ms[i]);
    return out;
}

static index_t *fixture(arena_t *a)
{
    index_t *ix = index_new(sizeof(payload_t), 0);
    assert_non_null(ix);
    add(ix, a, "__name__=up,job=a,instance=1", 1);
    add(ix, a, "__name__=up,job=a,instance=2", 2);
    add(ix, a, "__name__=up,job=b,instance=1", 3);
    add(ix, a, "__name__=up,instance=3", 4);             /* no job */
    add(ix, a, "__name__=cpu,job=a,instance=1,env=", 5); /* empty value never stored as such */
    add(ix, a, "__name__=cpu,job=foobar", 6);
    return ix;
}

static void test_create_lookup(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = fixture(a);
    assert_int_equal(index_num_series(ix), 6);
    /* Re-creating returns the existing series with its original id. */
    assert_int_equal(add(ix, a, "__name__=up,job=a,instance=1", 99), 1);
    assert_int_equal(index_num_series(ix), 6);
    labels_t ls = mk(a, "instance=2,job=a,__name__=up");
    index_series_t *s = index_acquire(ix, &ls, labels_hash(&ls));
    assert_non_null(s);
    assert_int_equal(index_series_id(s), 2);
    label_t out[8];
    index_series_labels(ix, s, out);
    assert_string_equal(out[0].name, "__name__");
    assert_string_equal(out[0].value, "up");
    assert_string_equal(out[2].value, "a");
    index_ref_t ref = index_series_ref(s);
    index_release(ix, s);
    s = index_acquire_ref(ix, &ref);
    assert_non_null(s);
    index_release(ix, s);
    ref.id = 12345;
    assert_null(index_acquire_ref(ix, &ref));
    labels_t missing = mk(a, "__name__=up,job=zzz");
    assert_null(index_acquire(ix, &missing, labels_hash(&missing)));
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

static void test_select_semantics(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = fixture(a);
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "__name__", "up"), "1,2,3,4");
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "up", MATCHER_EQ, "job", "a"), "1,2");
    /* != also selects series without the label */
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "up", MATCHER_NEQ, "job", "a"), "3,4");
    /* job="" selects exactly the series without job */
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "up", MATCHER_EQ, "job", ""), "4");
    /* job!="" selects the series that have it */
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "up", MATCHER_NEQ, "job", ""), "1,2,3");
    /* =~".*" matches everything, =~".+" only series with the label */
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "up", MATCHER_RE, "job", ".*"), "1,2,3,4");
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "up", MATCHER_RE, "job", ".+"), "1,2,3");
    assert_string_equal(sel(ix, 1, MATCHER_NRE, "job", ".+"), "4");
    /* anchoring: "foo" must not match "foobar", "foo.*" must */
    assert_string_equal(sel(ix, 1, MATCHER_RE, "job", "foo"), "");
    assert_string_equal(sel(ix, 1, MATCHER_RE, "job", "foo.*"), "6");
    assert_string_equal(sel(ix, 1, MATCHER_RE, "job", "fo+bar"), "6");
    /* alternation fast path and its negation */
    assert_string_equal(sel(ix, 1, MATCHER_RE, "job", "a|b"), "1,2,3,5");
    assert_string_equal(sel(ix, 1, MATCHER_NRE, "job", "a|b"), "4,6");
    assert_string_equal(sel(ix, 1, MATCHER_RE, "job", "b|a|"), "1,2,3,4,5");
    /* a label nobody has: "" matchers are no-ops, others select nothing */
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "nolabel", "x"), "");
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "cpu", MATCHER_EQ, "nolabel", ""), "5,6");
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "cpu", MATCHER_NEQ, "nolabel", "x"), "5,6");
    /* empty value label is the same as absent */
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "cpu", MATCHER_EQ, "env", ""), "5,6");
    assert_string_equal(sel(ix, 0), "1,2,3,4,5,6");
    assert_string_equal(
        sel(ix, 3, MATCHER_RE, "__name__", "up|cpu", MATCHER_EQ, "instance", "1", MATCHER_NEQ, "job", "b"), "1,5");
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

static void test_names_values(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = fixture(a);
    const char **v;
    size_t n;
    assert_int_equal(index_label_names(ix, NULL, 0, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 4); /* the index stores env="" as given; storage strips it */
    assert_string_equal(v[0], "__name__");
    assert_string_equal(v[1], "env");
    assert_int_equal(index_label_values(ix, "job", NULL, 0, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 3);
    assert_string_equal(v[0], "a");
    assert_string_equal(v[2], "foobar");
    char err[64];
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", "up", err, sizeof(err));
    assert_int_equal(index_label_values(ix, "instance", (const matcher_t *const *)&m, 1, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 3);
    assert_int_equal(index_label_names(ix, (const matcher_t *const *)&m, 1, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 3);
    assert_string_equal(v[2], "job");
    matcher_free(m);
    assert_int_equal(index_label_values(ix, "nope", NULL, 0, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 0);

    index_stats_t st;
    assert_int_equal(index_stats(ix, 10, a, &st), INDEX_OK);
    assert_int_equal(st.n_series_by_metric, 2);
    assert_string_equal(st.series_by_metric[0].name, "up");
    assert_int_equal(st.series_by_metric[0].value, 4);
    assert_string_equal(st.series_by_pair[0].name, "__name__=up");
    assert_int_equal(st.series_by_pair[0].value, 4);
    assert_true(index_memory_bytes(ix) > 0);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

static bool drop_odd(void *ud, index_series_t *s)
{
    (void)ud;
    return index_series_id(s) % 2 == 1;
}

static void test_sweep_and_reuse(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = fixture(a);
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 1, drop_odd, NULL)) {
        }
    }
    assert_int_equal(index_num_series(ix), 3);
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "__name__", "up"), "2,4");
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "job", "b"), "");
    const char **v;
    size_t n;
    assert_int_equal(index_label_values(ix, "job", NULL, 0, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 2); /* "b" went with series 3 */
    /* Freed symbols and slots are reused and everything still resolves. */
    add(ix, a, "__name__=new,job=b,zz=1", 7);
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "job", "b"), "7");
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "zz", "1"), "7");
    /* Many creations and removals: memory returns to where it was. */
    uint64_t before = index_num_series(ix);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 500; i++) {
            char spec[64];
            snprintf(spec, sizeof(spec), "__name__=churn,pod=p%d", i);
            add(ix, a, spec, 1001 + 2 * (uint64_t)i); /* odd ids: swept */
        }
        assert_int_equal(index_num_series(ix), before + 500);
        for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
            uint32_t cur = 0;
            while (!index_sweep(ix, sh, &cur, 100, drop_odd, NULL)) {
            }
        }
        assert_int_equal(index_num_series(ix), 3); /* 2, 4, 6 (7 is odd too) */
        before = index_num_series(ix);
    }
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

static bool drop_all(void *ud, index_series_t *s)
{
    (void)ud;
    (void)s;
    return true;
}

/* Series with the same label names share one name list; labels still come back per series,
 * and removing series releases names and values alike (also a string that is a name in one
 * series and a value in another). */
static void test_shared_names(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = index_new(sizeof(payload_t), 0);
    uint64_t empty = index_memory_bytes(ix);
    char spec[96];
    for (int i = 0; i < 200; i++) {
        snprintf(spec, sizeof(spec), "__name__=m%d,job=j%d,pod=p%d", i % 7, i % 3, i);
        add(ix, a, spec, 1 + (uint64_t)i);
    }
    uint64_t with200 = index_memory_bytes(ix);
    for (int i = 200; i < 250; i++) {
        snprintf(spec, sizeof(spec), "__name__=job,job=pod,x=%d", i);
        add(ix, a, spec, 1 + (uint64_t)i);
    }
    assert_int_equal(index_num_series(ix), 250);
    /* Every series reads back its own labels. */
    for (int i = 0; i < 250; i++) {
        if (i < 200)
            snprintf(spec, sizeof(spec), "__name__=m%d,job=j%d,pod=p%d", i % 7, i % 3, i);
        else
            snprintf(spec, sizeof(spec), "__name__=job,job=pod,x=%d", i);
        labels_t ls = mk(a, spec);
        index_series_t *s = index_acquire(ix, &ls, labels_hash(&ls));
        assert_non_null(s);
        assert_int_equal(index_series_id(s), 1 + (uint64_t)i);
        label_t out[3];
        assert_int_equal(index_series_nlabels(s), 3);
        index_series_labels(ix, s, out);
        for (int k = 0; k < 3; k++) {
            assert_string_equal(out[k].name, ls.v[k].name);
            assert_string_equal(out[k].value, ls.v[k].value);
        }
        index_release(ix, s);
    }
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "job", "pod", MATCHER_EQ, "x", "201"), "202");
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "pod", "p5", MATCHER_EQ, "__name__", "m5"), "6");
    assert_string_equal(sel(ix, 2, MATCHER_EQ, "__name__", "job", MATCHER_EQ, "pod", "p5"), "");
    /* Drop the odd ids (half of both kinds), then everything. */
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 7, drop_odd, NULL)) {
        }
    }
    assert_int_equal(index_num_series(ix), 125);
    const char **v;
    size_t n;
    assert_int_equal(index_label_names(ix, NULL, 0, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 4); /* __name__, job, pod, x */
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 1000, drop_all, NULL)) {
        }
    }
    assert_int_equal(index_num_series(ix), 0);
    assert_int_equal(index_label_names(ix, NULL, 0, a, &v, &n), INDEX_OK);
    assert_int_equal(n, 0);
    /* Symbols and name lists are gone; only table capacity remains. */
    assert_true(index_memory_bytes(ix) < with200);
    /* And the same names come back as new. */
    add(ix, a, "__name__=job,job=pod,x=1", 9);
    assert_string_equal(sel(ix, 1, MATCHER_EQ, "x", "1"), "9");
    assert_true(index_memory_bytes(ix) > empty);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

/* Flink-shaped label sets: long values (job_name, task_name, tm_id) shared by every series of a
 * TaskManager are stored once, so a series costs its own few symbols and a fixed record, not
 * its label bytes; the strings read back are the index's single copies. */
static void test_interned_values(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = index_new(sizeof(payload_t), 0);
    char job_name[1024], task_name[512];
    memset(job_name, 'j', sizeof(job_name) - 1);
    job_name[sizeof(job_name) - 1] = 0;
    memset(task_name, 't', sizeof(task_name) - 1);
    task_name[sizeof(task_name) - 1] = 0;
    char *spec = arena_alloc(a, 4096);
    snprintf(spec, 4096, "__name__=first,job_name=%s,task_name=%s,subtask_index=0", job_name, task_name);
    add(ix, a, spec, 1);
    uint64_t one = index_memory_bytes(ix);
    for (int i = 1; i < 1000; i++) {
        snprintf(spec, 4096, "__name__=m%d,job_name=%s,task_name=%s,subtask_index=%d", i % 50, job_name, task_name,
                 i % 8);
        add(ix, a, spec, 1 + (uint64_t)i);
    }
    uint64_t per_series = (index_memory_bytes(ix) - one) / 999;
    /* 1.5 KB of label values per series if they were copied; interned, a few dozen bytes of
     * symbol ids and postings, plus hash-table growth. */
    assert_true(per_series < 256);
    /* Two series' job_name values are the same pointer: one copy. */
    labels_t l1 = mk(a, "__name__=m1,subtask_index=1");
    labels_t l2 = mk(a, "__name__=m2,subtask_index=2");
    label_t extra1[2] = {{"job_name", job_name}, {"task_name", task_name}};
    labels_t ls1 = {arena_alloc(a, 4 * sizeof(label_t)), 0}, ls2 = {arena_alloc(a, 4 * sizeof(label_t)), 0};
    for (size_t k = 0; k < 2; k++) {
        ls1.v[ls1.n++] = l1.v[k];
        ls2.v[ls2.n++] = l2.v[k];
        ls1.v[ls1.n++] = extra1[k];
        ls2.v[ls2.n++] = extra1[k];
    }
    labels_sort(&ls1);
    labels_sort(&ls2);
    index_series_t *s1 = index_acquire(ix, &ls1, labels_hash(&ls1));
    assert_non_null(s1);
    label_t out1[4], out2[4];
    index_series_labels(ix, s1, out1);
    index_release(ix, s1);
    index_series_t *s2 = index_acquire(ix, &ls2, labels_hash(&ls2));
    assert_non_null(s2);
    index_series_labels(ix, s2, out2);
    index_release(ix, s2);
    bool seen = false;
    for (int k = 0; k < 4; k++)
        if (strcmp(out1[k].name, "job_name") == 0) {
            assert_ptr_equal(out1[k].value, out2[k].value);
            assert_string_equal(out1[k].value, job_name);
            seen = true;
        }
    assert_true(seen);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

/* Ids outlive their series: a swept series leaves labels hash -> id behind, creating the labels
 * again forgets it (the id lives in the series), a noted id works the same, and series still in
 * the index take no entry. */
static void test_departed_ids(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = fixture(a);
    uint64_t id;
    labels_t up1 = mk(a, "__name__=up,job=a,instance=1"), up2 = mk(a, "__name__=up,job=a,instance=2");
    uint64_t h1 = labels_hash(&up1), h2 = labels_hash(&up2);
    assert_false(index_departed_id(ix, h1, &id)); /* in the index: its id is in the series */
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 2, drop_odd, NULL)) {
        }
    }
    assert_null(index_acquire(ix, &up1, h1));
    assert_true(index_departed_id(ix, h1, &id));
    assert_int_equal(id, 1);
    assert_false(index_departed_id(ix, h2, &id)); /* id 2 stayed */
    labels_t up3 = mk(a, "__name__=up,job=b,instance=1");
    assert_true(index_departed_id(ix, labels_hash(&up3), &id));
    assert_int_equal(id, 3);
    /* Back under its old id (the caller's choice, made from the entry); the entry goes. */
    assert_int_equal(add(ix, a, "__name__=up,job=a,instance=1", 1), 1);
    assert_false(index_departed_id(ix, h1, &id));
    /* Gone again: the entry is back. */
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 100, drop_odd, NULL)) {
        }
    }
    assert_true(index_departed_id(ix, h1, &id));
    assert_int_equal(id, 1);
    /* Noted ids (a catalog's): found until the labels are created, whatever id they get. */
    labels_t nw = mk(a, "__name__=noted,job=z");
    uint64_t hn = labels_hash(&nw);
    assert_false(index_departed_id(ix, hn, &id));
    assert_int_equal(index_departed_note(ix, hn, 77), INDEX_OK);
    assert_true(index_departed_id(ix, hn, &id));
    assert_int_equal(id, 77);
    assert_int_equal(index_departed_note(ix, hn, 78), INDEX_OK); /* replaces */
    assert_true(index_departed_id(ix, hn, &id));
    assert_int_equal(id, 78);
    assert_int_equal(add(ix, a, "__name__=noted,job=z", 78), 78);
    assert_false(index_departed_id(ix, hn, &id));
    /* Many: every departed id comes back exactly, through table growth. */
    char spec[64];
    for (int i = 0; i < 3000; i++) {
        snprintf(spec, sizeof(spec), "__name__=churn,pod=p%d", i);
        add(ix, a, spec, 10001 + 2 * (uint64_t)i); /* odd: swept */
    }
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 100, drop_odd, NULL)) {
        }
    }
    for (int i = 0; i < 3000; i++) {
        snprintf(spec, sizeof(spec), "__name__=churn,pod=p%d", i);
        labels_t ls = mk(a, spec);
        assert_null(index_acquire(ix, &ls, labels_hash(&ls)));
        assert_true(index_departed_id(ix, labels_hash(&ls), &id));
        assert_int_equal(id, 10001 + 2 * (uint64_t)i);
    }
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

/* Postings hold 2-byte slots until a shard hands out slot 65,536, then 4-byte ones: fill one
 * shard past that (label sets picked by their hash's shard) and check that selections, removals
 * and slot reuse stay exact on both sides of the switch. */
static bool drop_id_mod3(void *ud, index_series_t *s)
{
    (void)ud;
    return index_series_id(s) % 3 == 0;
}

static void test_postings_widen(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = index_new(sizeof(payload_t), 0);
    enum { N = 66000 };
    char spec[96];
    uint32_t made = 0, g5 = 0, g5_kept = 0;
    for (uint32_t i = 0; made < N; i++) {
        snprintf(spec, sizeof(spec), "__name__=w,job=one,g=%u,pod=p%u", made % 7, i);
        labels_t ls = mk(a, spec);
        uint64_t h = labels_hash(&ls);
        if (h % INDEX_SHARDS != 0)
            continue;
        index_series_t *s;
        bool created;
        assert_int_equal(index_acquire_or_create(ix, &ls, h, made + 1, &s, &created), INDEX_OK);
        assert_true(created);
        index_release(ix, s);
        g5 += made % 7 == 5;
        g5_kept += made % 7 == 5 && (made + 1) % 3 != 0;
        made++;
        if (made % 4096 == 0)
            arena_reset(a);
    }
    assert_int_equal(index_num_series(ix), N);
    matcher_t *ms[2];
    char err[128];
    ms[0] = matcher_new(MATCHER_EQ, "job", "one", err, sizeof(err));
    ms[1] = matcher_new(MATCHER_EQ, "g", "5", err, sizeof(err));
    index_refs_t refs = {0};
    assert_int_equal(index_select(ix, (const matcher_t *const *)ms, 1, &refs), INDEX_OK);
    assert_int_equal(refs.n, N);
    refs.n = 0;
    assert_int_equal(index_select(ix, (const matcher_t *const *)ms, 2, &refs), INDEX_OK);
    assert_int_equal(refs.n, g5);
    for (size_t i = 0; i < refs.n; i++) {
        assert_int_equal((refs.v[i].id - 1) % 7, 5);        /* id - 1 = made at creation */
        assert_int_equal(refs.v[i].slot, refs.v[i].id - 1); /* handed out in order, past 65,535 */
    }
    /* remove a third of them everywhere in the slot range */
    uint32_t cur = 0;
    while (!index_sweep(ix, 0, &cur, 5000, drop_id_mod3, NULL)) {
    }
    assert_int_equal(index_num_series(ix), N - N / 3);
    refs.n = 0;
    assert_int_equal(index_select(ix, (const matcher_t *const *)ms, 2, &refs), INDEX_OK);
    assert_int_equal(refs.n, g5_kept);
    for (size_t i = 0; i < refs.n; i++)
        assert_true(refs.v[i].id % 3 != 0 && (refs.v[i].id - 1) % 7 == 5);
    /* freed slots (low and high) are reused by new series, which join the postings in order */
    for (uint32_t i = 0, k = 0; k < 100; i++) {
        snprintf(spec, sizeof(spec), "__name__=w,job=one,g=5,pod=new%u", i);
        labels_t ls = mk(a, spec);
        uint64_t h = labels_hash(&ls);
        if (h % INDEX_SHARDS != 0)
            continue;
        index_series_t *s;
        bool created;
        assert_int_equal(index_acquire_or_create(ix, &ls, h, 1000000 + k, &s, &created), INDEX_OK);
        index_release(ix, s);
        k++;
    }
    refs.n = 0;
    assert_int_equal(index_select(ix, (const matcher_t *const *)ms, 2, &refs), INDEX_OK);
    assert_int_equal(refs.n, g5_kept + 100);
    refs.n = 0;
    assert_int_equal(index_select(ix, (const matcher_t *const *)ms, 1, &refs), INDEX_OK);
    assert_int_equal(refs.n, N - N / 3 + 100);
    index_refs_free(&refs);
    matcher_free(ms[0]);
    matcher_free(ms[1]);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

static void test_limit(void **state)
{
    arena_t *a = arena_create(0);
    index_t *ix = index_new(8, 2);
    add(ix, a, "__name__=a", 1);
    add(ix, a, "__name__=b", 2);
    labels_t ls = mk(a, "__name__=c");
    index_series_t *s;
    bool created;
    assert_int_equal(index_acquire_or_create(ix, &ls, labels_hash(&ls), 3, &s, &created), INDEX_ERR_LIMIT);
    /* existing series still resolve at the limit */
    assert_int_equal(add(ix, a, "__name__=a", 9), 1);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

/* Series with n labels: l00="<tag>", l01=..., so every record size class is used. */
static labels_t wide_labels(arena_t *a, size_t n, int tag)
{
    labels_t ls = {arena_alloc(a, sizeof(label_t) * n), n};
    for (size_t i = 0; i < n; i++) {
        char *name = arena_alloc(a, 8), *value = arena_alloc(a, 24);
        snprintf(name, 8, "l%03zu", i);
        if (i == 0)
            snprintf(value, 24, "s%d", tag);
        else
            snprintf(value, 24, "v%zu_%d", i, tag % 5);
        ls.v[i] = (label_t){name, value};
    }
    return ls;
}

static size_t nlabels_of(int tag)
{
    return tag == 77 ? 300 : 1 + (size_t)tag % 40; /* 300 labels: a record above the pool's sizes */
}

static bool drop_odd_tag(void *ud, index_series_t *s)
{
    (void)ud;
    return index_series_id(s) % 2 == 1;
}

/* Series records come from per-shard pages of one size each: records never overlap (every
 * series keeps its labels and its owner's payload), a new record's payload is zeroed even where
 * a removed series' record is reused, and a page whose last series left is given back (index_free
 * asserts no page is left once the series are gone; ASan sees any leak). */
static void test_series_records(void **state)
{
    (void)state;
    enum { N = 3000, P = 72 };
    arena_t *a = arena_create(0);
    index_t *ix = index_new(P, 0);
    for (int round = 0; round < 2; round++) {
        for (int tag = round * N; tag < (round + 1) * N; tag++) {
            arena_reset(a);
            labels_t ls = wide_labels(a, nlabels_of(tag % N), tag);
            labels_sort(&ls);
            index_series_t *s;
            bool created;
            assert_int_equal(index_acquire_or_create(ix, &ls, labels_hash(&ls), 1 + (uint64_t)tag, &s, &created),
                             INDEX_OK);
            assert_true(created);
            unsigned char *pl = index_series_payload(s);
            for (int k = 0; k < P; k++)
                assert_int_equal(pl[k], 0);
            memset(pl, tag & 0xff, P);
            index_release(ix, s);
        }
        /* Every series reads back its labels and payload. */
        for (int tag = 0; tag < (round + 1) * N; tag++) {
            bool present = round == 0 || tag >= N || tag % 2 == 1; /* round 0's sweep took even tags */
            arena_reset(a);
            labels_t ls = wide_labels(a, nlabels_of(tag % N), tag);
            labels_sort(&ls);
            index_series_t *s = index_acquire(ix, &ls, labels_hash(&ls));
            if (!present) {
                assert_null(s);
                continue;
            }
            assert_non_null(s);
            assert_int_equal(index_series_id(s), 1 + (uint64_t)tag);
            assert_int_equal(index_series_nlabels(s), ls.n);
            label_t *out = arena_alloc(a, sizeof(label_t) * ls.n);
            index_series_labels(ix, s, out);
            for (size_t k = 0; k < ls.n; k++) {
                assert_string_equal(out[k].name, ls.v[k].name);
                assert_string_equal(out[k].value, ls.v[k].value);
            }
            unsigned char *pl = index_series_payload(s);
            for (int k = 0; k < P; k++)
                assert_int_equal(pl[k], tag & 0xff);
            index_release(ix, s);
        }
        /* Drop the odd ids (even tags); the next round's series reuse their records. */
        for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
            uint32_t cur = 0;
            while (!index_sweep(ix, sh, &cur, 97, drop_odd_tag, NULL)) {
            }
        }
    }
    /* Everything leaves: every page goes back (index_free asserts it). */
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 1000, drop_all, NULL)) {
        }
    }
    assert_int_equal(index_num_series(ix), 0);
    arena_reset(a);
    labels_t ls = wide_labels(a, 11, 5);
    labels_sort(&ls);
    index_series_t *s;
    bool created;
    assert_int_equal(index_acquire_or_create(ix, &ls, labels_hash(&ls), 1, &s, &created), INDEX_OK);
    index_release(ix, s);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

/* "name=value,..." of ls (the spec mk reads), in a. */
static const char *spec_of(arena_t *a, const labels_t *ls)
{
    size_t len = 1;
    for (size_t i = 0; i < ls->n; i++)
        len += strlen(ls->v[i].name) + strlen(ls->v[i].value) + 2;
    char *out = arena_alloc(a, len);
    out[0] = 0;
    for (size_t i = 0; i < ls->n; i++)
        snprintf(out + strlen(out), len - strlen(out), "%s%s=%s", i ? "," : "", ls->v[i].name, ls->v[i].value);
    return out;
}

static void assert_no_label_names(index_t *ix, arena_t *a)
{
    const char **v;
    size_t nv;
    assert_int_equal(index_label_names(ix, NULL, 0, a, &v, &nv), INDEX_OK);
    assert_int_equal(nv, 0);
}

static uint64_t next_id_fn(void *ud)
{
    return (*(uint64_t *)ud)++;
}

static void sweep_all(index_t *ix)
{
    for (uint32_t sh = 0; sh < INDEX_SHARDS; sh++) {
        uint32_t cur = 0;
        while (!index_sweep(ix, sh, &cur, 1000, drop_all, NULL)) {
        }
    }
}

/* index_create_many, a first push's series made in one batch: every item gets its series (ids
 * from the caller, from next_id, or the departed id of labels that come back); an item whose
 * labels are already in the index, or repeat an earlier item's (a different array with the same
 * labels), gets that series and makes nothing; over the series limit an item is refused alone.
 * Every reference an item took and did not keep is given back: swept, the index holds what one
 * that made the same series one at a time holds. */
static void test_create_many(void **state)
{
    (void)state;
    arena_t *a = arena_create(0);
    index_t *ix = index_new(sizeof(payload_t), 0);
    assert_int_equal(add(ix, a, "__name__=flink_up,host=h1,tm=tm-1,op=src,sub=0", 5), 5);
    enum { N = 300 };
    labels_t ls[N + 2];
    index_create_t it[N + 2];
    char spec[160];
    for (int i = 0; i < N; i++) {
        /* Neighbours share names and most values, as a TaskManager's series do. */
        snprintf(spec, sizeof(spec), "__name__=flink_m%d,host=h1,tm=tm-1,op=%s,sub=%d", i % 9,
                 i % 2 ? "src" : "map", i % 17);
        ls[i] = mk(a, spec);
    }
    ls[N] = mk(a, "__name__=flink_up,host=h1,tm=tm-1,op=src,sub=0"); /* already there */
    ls[N + 1] = mk(a, "__name__=flink_m0,host=h1,tm=tm-1,op=map,sub=0"); /* = ls[0], another array */
    uint64_t next = 1000;
    for (int i = 0; i < N + 2; i++)
        it[i] = (index_create_t){.labels = &ls[i], .hash = labels_hash(&ls[i]), .id = i == 7 ? 77 : 0};
    assert_int_equal(index_create_many(ix, it, N + 2, next_id_fn, &next), 0);
    size_t made = 0;
    for (int i = 0; i < N + 2; i++)
        made += it[i].rc == INDEX_OK && it[i].made != INDEX_MADE_NONE;
    /* 9 names x 2 ops x 17 subtasks repeat after lcm(9, 2, 17) = 306 > N: all N distinct */
    assert_int_equal(made, N);
    assert_int_equal(index_num_series(ix), N + 1);
    assert_int_equal(it[7].ref.id, 77);
    assert_int_equal(it[7].made, INDEX_MADE_NEW);
    assert_int_equal(it[N].made, INDEX_MADE_NONE);
    assert_int_equal(it[N].ref.id, 5);
    assert_int_equal(it[N + 1].made, INDEX_MADE_NONE);
    assert_memory_equal(&it[N + 1].ref, &it[0].ref, sizeof(index_ref_t));
    assert_int_equal(next, 1000 + N - 1); /* one fresh id per series made without one */
    for (int i = 0; i < N; i++) {
        index_series_t *s = index_acquire_ref(ix, &it[i].ref);
        assert_non_null(s);
        label_t out[8];
        assert_int_equal(index_series_nlabels(s), ls[i].n);
        index_series_labels(ix, s, out);
        for (size_t k = 0; k < ls[i].n; k++) {
            assert_string_equal(out[k].name, ls[i].v[k].name);
            assert_string_equal(out[k].value, ls[i].v[k].value);
        }
        index_release(ix, s);
        assert_non_null(s = index_acquire(ix, &ls[i], it[i].hash));
        assert_int_equal(index_series_id(s), it[i].ref.id);
        index_release(ix, s);
    }
    char want[32];
    snprintf(want, sizeof(want), "%llu", (unsigned long long)it[4].ref.id); /* the one item with these */
    assert_string_equal(sel(ix, 3, MATCHER_EQ, "__name__", "flink_m4", MATCHER_EQ, "sub", "4", MATCHER_EQ, "op", "map"),
                        want);
    /* Swept, it holds what an index that made the same series one by one holds: the references
     * the two items that made nothing took are all given back. */
    index_t *one = index_new(sizeof(payload_t), 0);
    add(one, a, "__name__=flink_up,host=h1,tm=tm-1,op=src,sub=0", 5);
    for (int i = 0; i < N + 2; i++)
        add(one, a, spec_of(a, &ls[i]), 1000 + (uint64_t)i);
    sweep_all(ix);
    sweep_all(one);
    assert_int_equal(index_num_series(ix), 0);
    assert_int_equal(index_memory_bytes(ix), index_memory_bytes(one));
    index_free(one, NULL, NULL);
    /* Made again: the departed ids come back. */
    for (int i = 0; i < N; i++)
        it[i] = (index_create_t){.labels = &ls[i], .hash = labels_hash(&ls[i])};
    uint64_t before = next;
    assert_int_equal(index_create_many(ix, it, N, next_id_fn, &next), 0);
    assert_int_equal(next, before);
    assert_int_equal(it[7].ref.id, 77);
    assert_int_equal(it[7].made, INDEX_MADE_RETURNED);
    assert_int_equal(it[0].made, INDEX_MADE_RETURNED);
    sweep_all(ix);
    assert_no_label_names(ix, a);
    index_free(ix, NULL, NULL);

    /* The limit: the first three are made, the rest refused, and give back all they took. */
    ix = index_new(sizeof(payload_t), 3);
    for (int i = 0; i < 8; i++)
        it[i] = (index_create_t){.labels = &ls[i], .hash = labels_hash(&ls[i]), .id = 1 + (uint64_t)i};
    assert_int_equal(index_create_many(ix, it, 8, NULL, NULL), 0);
    size_t ok = 0, refused = 0;
    for (int i = 0; i < 8; i++) {
        ok += it[i].rc == INDEX_OK;
        refused += it[i].rc == INDEX_ERR_LIMIT;
    }
    assert_int_equal(ok, 3);
    assert_int_equal(refused, 5);
    /* Full: a series that exists is still found; a new one is refused without being interned. */
    int had = 0, refused_one = 0;
    for (int i = 0; i < 8; i++) {
        if (it[i].rc == INDEX_OK)
            had = i;
        else
            refused_one = i;
    }
    index_ref_t had_ref = it[had].ref;
    uint64_t full_bytes = index_memory_bytes(ix);
    index_create_t again[2] = {{.labels = &ls[had], .hash = labels_hash(&ls[had]), .id = 100},
                               {.labels = &ls[refused_one], .hash = labels_hash(&ls[refused_one]), .id = 101}};
    assert_int_equal(index_create_many(ix, again, 2, NULL, NULL), 0);
    assert_int_equal(again[0].rc, INDEX_OK);
    assert_int_equal(again[0].made, INDEX_MADE_NONE);
    assert_memory_equal(&again[0].ref, &had_ref, sizeof(had_ref));
    assert_int_equal(again[1].rc, INDEX_ERR_LIMIT);
    assert_int_equal(index_memory_bytes(ix), full_bytes);
    one = index_new(sizeof(payload_t), 3);
    for (int i = 0; i < 8; i++)
        if (it[i].rc == INDEX_OK)
            add(one, a, spec_of(a, &ls[i]), it[i].ref.id);
    sweep_all(ix);
    sweep_all(one);
    assert_int_equal(index_memory_bytes(ix), index_memory_bytes(one));
    assert_no_label_names(ix, a);
    index_free(one, NULL, NULL);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

typedef struct {
    index_t *ix;
    labels_t *ls;
    size_t n;
    index_create_t *it;
    _Atomic uint64_t *next;
} racer_t;

static uint64_t next_atomic(void *ud)
{
    return atomic_fetch_add((_Atomic uint64_t *)ud, 1);
}

static void *racer(void *arg)
{
    racer_t *r = arg;
    for (size_t i = 0; i < r->n; i++)
        r->it[i] = (index_create_t){.labels = &r->ls[i], .hash = labels_hash(&r->ls[i])};
    /* In slices, so the two threads' batches interleave. */
    for (size_t i = 0; i < r->n; i += 50)
        if (index_create_many(r->ix, r->it + i, r->n - i < 50 ? r->n - i : 50, next_atomic, r->next) != 0)
            return (void *)1;
    return NULL;
}

/* Two writers creating the same series in batches at once: each label set ends up as exactly one
 * series, both writers get its ref, and exactly one of them made it. */
static void test_create_many_race(void **state)
{
    (void)state;
    arena_t *a = arena_create(0);
    index_t *ix = index_new(sizeof(payload_t), 0);
    enum { N = 2000 };
    labels_t *ls = arena_alloc(a, N * sizeof(*ls));
    for (int i = 0; i < N; i++) {
        char spec[96];
        snprintf(spec, sizeof(spec), "__name__=m%d,job=j,pod=p%d", i % 13, i);
        ls[i] = mk(a, spec);
    }
    _Atomic uint64_t next = 1;
    index_create_t *it1 = arena_alloc(a, N * sizeof(*it1)), *it2 = arena_alloc(a, N * sizeof(*it2));
    racer_t r1 = {ix, ls, N, it1, &next}, r2 = {ix, ls, N, it2, &next};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, racer, &r1);
    pthread_create(&t2, NULL, racer, &r2);
    void *e1, *e2;
    pthread_join(t1, &e1);
    pthread_join(t2, &e2);
    assert_null(e1);
    assert_null(e2);
    assert_int_equal(index_num_series(ix), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(it1[i].rc, INDEX_OK);
        assert_int_equal(it2[i].rc, INDEX_OK);
        assert_memory_equal(&it1[i].ref, &it2[i].ref, sizeof(index_ref_t));
        assert_int_equal((it1[i].made != INDEX_MADE_NONE) + (it2[i].made != INDEX_MADE_NONE), 1);
    }
    sweep_all(ix);
    assert_no_label_names(ix, a);
    index_free(ix, NULL, NULL);
    arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_lookup),  cmocka_unit_test(test_select_semantics),
        cmocka_unit_test(test_names_values),   cmocka_unit_test(test_sweep_and_reuse),
        cmocka_unit_test(test_departed_ids),   cmocka_unit_test(test_limit),
        cmocka_unit_test(test_shared_names),   cmocka_unit_test(test_interned_values),
        cmocka_unit_test(test_postings_widen), cmocka_unit_test(test_series_records),
        cmocka_unit_test(test_create_many),    cmocka_unit_test(test_create_many_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
