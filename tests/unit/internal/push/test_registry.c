/* Unit tests for internal/push/registry.c: PUT/POST/DELETE semantics, the incremental type index,
 * staleness effects, expiry, and serialize/restore. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/expfmt/text_parse.h"
#include "internal/push/registry.h"
#include "internal/push/shape.h"

typedef struct {
    arena_t *a;
    push_effect_t effect;
} step_t;

/* Every change's delta record, in order, as the WAL would hold them. */
static buf_t journal[64];
static size_t njournal;

static buf_t *next_delta(void)
{
    assert_true(njournal < 64);
    buf_t *b = &journal[njournal++];
    *b = (buf_t)BUF_INIT;
    return b;
}

static void journal_free(void)
{
    for (size_t i = 0; i < njournal; i++)
        buf_free(&journal[i]);
    njournal = 0;
}

/* A push with the given grouping labels (name, value pairs; sorted by the registry). */
static int push_grouped(push_registry_t *r, push_mode_t mode, const label_t *g, size_t ng, const char *body,
                        int64_t now, step_t *st, char *err, size_t errlen)
{
    st->a = arena_create(0);
    char *b = arena_strdup(st->a, body);
    expfmt_result_t res;
    assert_int_equal(expfmt_parse_text(b, strlen(b), false, NULL, st->a, &res, err, errlen), 0);
    labels_t grouping = {(label_t *)g, ng};
    push_pending_t *p;
    int rc = push_registry_prepare(r, &grouping, mode, &res, now, st->a, &p, &st->effect, err, errlen);
    if (rc == PUSH_OK)
        push_registry_commit(r, p, next_delta());
    return rc;
}

static int push(push_registry_t *r, push_mode_t mode, const char *job, const char *body, int64_t now, step_t *st,
                char *err, size_t errlen)
{
    label_t g[1] = {{"job", job}};
    int rc = push_grouped(r, mode, g, 1, body, now, st, err, errlen);
    if (rc != PUSH_OK) {
        labels_t grouping = {g, 1};
        push_registry_fail(r, &grouping, now, next_delta());
    }
    return rc;
}

static size_t count_stale(const push_effect_t *e)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n; i++) {
        uint64_t bits;
        memcpy(&bits, &e->samples[i].v, 8);
        n += bits == 0x7ff0000000000002ULL;
    }
    return n;
}

/* A serialized registry: its pieces, in order (push_registry_serialize). */
typedef struct {
    buf_t v[64];
    size_t n;
} pieces_t;

static int pieces_put(void *ctx, const void *data, size_t len)
{
    pieces_t *p = ctx;
    assert_true(p->n < 64);
    p->v[p->n] = (buf_t)BUF_INIT;
    buf_append(&p->v[p->n++], data, len);
    return 0;
}

static void pieces_serialize(push_registry_t *r, size_t piece_bytes, pieces_t *p)
{
    p->n = 0;
    assert_int_equal(push_registry_serialize(r, piece_bytes, pieces_put, p), 0);
    assert_true(p->n >= 1);
}

static int pieces_restore(push_registry_t *r, const pieces_t *p)
{
    int rc = push_registry_restore(r, p->v[0].data, p->v[0].len);
    for (size_t i = 1; i < p->n && rc == 0; i++)
        rc = push_registry_apply_delta(r, p->v[i].data, p->v[i].len);
    return rc;
}

static void pieces_free(pieces_t *p)
{
    for (size_t i = 0; i < p->n; i++)
        buf_free(&p->v[i]);
    p->n = 0;
}

static void test_put_post_semantics(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    char err[512];
    step_t s1, s2, s3;
    assert_int_equal(push(r, PUSH_PUT, "j", "a 1\nb 2\n", 1000, &s1, err, sizeof(err)), PUSH_OK);
    assert_int_equal(s1.effect.n, 2);
    assert_int_equal(count_stale(&s1.effect), 0);
    /* POST of b keeps a; nothing goes stale. */
    assert_int_equal(push(r, PUSH_POST, "j", "b 3\n", 2000, &s2, err, sizeof(err)), PUSH_OK);
    assert_int_equal(s2.effect.n, 1);
    assert_int_equal(count_stale(&s2.effect), 0);
    /* PUT of c drops a and b: two staleness markers plus the new sample. */
    assert_int_equal(push(r, PUSH_PUT, "j", "c 4\n", 3000, &s3, err, sizeof(err)), PUSH_OK);
    assert_int_equal(s3.effect.n, 3);
    assert_int_equal(count_stale(&s3.effect), 2);
    buf_t t = BUF_INIT;
    push_registry_write_text(r, &t);
    assert_non_null(strstr(t.data, "c{instance=\"\",job=\"j\"} 4\n"));
    assert_null(strstr(t.data, "\na{"));
    buf_free(&t);
    arena_destroy(s1.a);
    arena_destroy(s2.a);
    arena_destroy(s3.a);
    push_registry_free(r);
}

/* The steady state (same series, new values) writes no staleness markers; a changed label value
 * or a vanished quantile in an otherwise identical family does. */
static void test_staleness_only_for_dropped_series(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    char err[512];
    step_t s[4];
    const char *b1 = "# TYPE s summary\ns{t=\"a\",quantile=\"0.5\"} 1\ns{t=\"a\",quantile=\"0.99\"} "
                     "2\ns_count{t=\"a\"} 3\ng{t=\"a\"} 1\n";
    const char *b2 = "# TYPE s summary\ns{t=\"a\",quantile=\"0.5\"} 4\ns{t=\"a\",quantile=\"0.99\"} "
                     "5\ns_count{t=\"a\"} 6\ng{t=\"a\"} 2\n";
    const char *b3 = "# TYPE s summary\ns{t=\"a\",quantile=\"0.5\"} 4\ns_count{t=\"a\"} 6\ng{t=\"b\"} 2\n";
    assert_int_equal(push(r, PUSH_PUT, "j", b1, 1000, &s[0], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "j", b2, 2000, &s[1], err, sizeof(err)), PUSH_OK);
    assert_int_equal(count_stale(&s[1].effect), 0);
    assert_int_equal(s[1].effect.n, 5); /* 2 quantiles, _sum, _count, g */
    assert_int_equal(push(r, PUSH_PUT, "j", b3, 3000, &s[2], err, sizeof(err)), PUSH_OK);
    /* gone: s{quantile="0.99"} and g{t="a"} */
    assert_int_equal(count_stale(&s[2].effect), 2);
    bool saw_q99 = false;
    for (size_t i = 0; i < s[2].effect.n; i++) {
        const char *q = labels_get(&s[2].effect.samples[i].labels, "quantile");
        saw_q99 |= q && strcmp(q, "0.99") == 0;
    }
    assert_true(saw_q99);
    for (int i = 0; i < 3; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
}

static void test_type_index_is_incremental(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    char err[512];
    step_t s[6];
    assert_int_equal(push(r, PUSH_PUT, "j1", "# TYPE m counter\nm 1\n", 1000, &s[0], err, sizeof(err)), PUSH_OK);
    /* Another group may not hold m as a gauge... */
    assert_int_equal(push(r, PUSH_PUT, "j2", "# TYPE m gauge\nm 1\n", 1000, &s[1], err, sizeof(err)), PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "pushed metrics are invalid or inconsistent with existing metrics"));
    /* ...but j1 itself may change m's type, since it replaces its own family. */
    assert_int_equal(push(r, PUSH_PUT, "j1", "# TYPE m gauge\nm 1\n", 2000, &s[2], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "j2", "# TYPE m gauge\nm 1\n", 2000, &s[3], err, sizeof(err)), PUSH_OK);
    /* Once no group holds m, any type is fine again. */
    arena_t *a = arena_create(0);
    push_effect_t e;
    label_t g1[1] = {{"job", "j1"}}, g2[1] = {{"job", "j2"}};
    assert_true(push_registry_delete(r, &(labels_t){g1, 1}, 3000, a, &e, next_delta()));
    assert_int_equal(count_stale(&e), 1);
    assert_true(push_registry_delete(r, &(labels_t){g2, 1}, 3000, a, &e, next_delta()));
    assert_false(push_registry_delete(r, &(labels_t){g2, 1}, 3000, a, &e, next_delta()));
    assert_int_equal(
        push(r, PUSH_PUT, "j3", "# TYPE m summary\nm{quantile=\"0.5\"} 1\n", 4000, &s[4], err, sizeof(err)), PUSH_OK);
    /* Timestamps and duplicates are refused and stamp the failure time. */
    assert_int_equal(push(r, PUSH_PUT, "j4", "x 1 1000\n", 5000, &s[5], err, sizeof(err)), PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "must not have timestamps"));
    buf_t j = BUF_INIT;
    push_registry_write_json(r, &j);
    assert_non_null(strstr(j.data, "\"labels\":{\"job\":\"j4\"},\"last_push_successful\":false"));
    buf_free(&j);
    for (int i = 0; i < 6; i++)
        arena_destroy(s[i].a);
    arena_destroy(a);
    push_registry_free(r);
}

static void test_expiry(void **state)
{
    push_options_t o = {.group_ttl_ms = 0, .missed_intervals = 3};
    push_registry_t *r = push_registry_new(&o);
    char err[512];
    step_t s[3];
    assert_int_equal(push(r, PUSH_PUT, "p", "v 1\n", 10000, &s[0], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "once", "v 1\n", 10000, &s[1], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "p", "v 2\n", 20000, &s[2], err, sizeof(err)), PUSH_OK);
    arena_t *a = arena_create(0);
    push_effect_t e;
    /* Interval 10 s: still there after 29 s of silence, gone after 31 s. One-off groups stay. */
    assert_int_equal(push_registry_expire(r, 49000, a, &e, NULL), 0);
    assert_int_equal(push_registry_expire(r, 51000, a, &e, NULL), 1);
    assert_int_equal(count_stale(&e), 1);
    assert_int_equal(push_registry_group_count(r), 1);
    for (int i = 0; i < 3; i++)
        arena_destroy(s[i].a);
    arena_destroy(a);
    push_registry_free(r);

    /* Two pushes 5 ms apart: the interval counts as 1 s, so the group outlives a restart's
     * pause and goes only after three missed seconds. */
    r = push_registry_new(&o);
    assert_int_equal(push(r, PUSH_PUT, "burst", "v 1\n", 10000, &s[0], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "burst", "v 2\n", 10005, &s[1], err, sizeof(err)), PUSH_OK);
    a = arena_create(0);
    assert_int_equal(push_registry_expire(r, 10500, a, &e, NULL), 0);
    assert_int_equal(push_registry_expire(r, 12900, a, &e, NULL), 0);
    assert_int_equal(push_registry_expire(r, 13100, a, &e, NULL), 1);
    for (int i = 0; i < 2; i++)
        arena_destroy(s[i].a);
    arena_destroy(a);
    push_registry_free(r);

    push_options_t ttl = {.group_ttl_ms = 5000};
    r = push_registry_new(&ttl);
    assert_int_equal(push(r, PUSH_PUT, "t", "v 1\n", 1000, &s[0], err, sizeof(err)), PUSH_OK);
    a = arena_create(0);
    assert_int_equal(push_registry_expire(r, 5000, a, &e, NULL), 0);
    assert_int_equal(push_registry_expire(r, 7000, a, &e, NULL), 1);
    arena_destroy(s[0].a);
    arena_destroy(a);
    push_registry_free(r);
}

static void put_u32(buf_t *b, uint32_t v)
{
    buf_append(b, &v, 4);
}

static void put_u64(buf_t *b, uint64_t v)
{
    buf_append(b, &v, 8);
}

static void put_f64(buf_t *b, double v)
{
    buf_append(b, &v, 8);
}

static void put_str(buf_t *b, const char *s)
{
    put_u32(b, (uint32_t)strlen(s));
    buf_append(b, s, strlen(s));
}

/* Group records: written as 'S' (each distinct label set once, then by number), so a group whose
 * metrics share their sets takes a fraction of its 'G' size; a 'G' record as earlier versions
 * wrote it (every set spelt out) still restores to the same state; a set number not yet given is
 * refused. */
static void test_group_records_number_label_sets(void **state)
{
    (void)state;
    push_registry_t *r = push_registry_new(NULL);
    char err[512];
    step_t st;
    assert_int_equal(push(r, PUSH_PUT, "g", "# TYPE x gauge\nx{l=\"1\"} 5\nx{l=\"1\",q=\"a\"} 6\n# TYPE y gauge\ny{l=\"1\"} 7\n",
                          1000, &st, err, sizeof(err)),
                     PUSH_OK);
    arena_destroy(st.a);
    buf_t want = BUF_INIT, got = BUF_INIT;
    push_registry_write_text(r, &want);
    pieces_t ser;
    pieces_serialize(r, 1u << 20, &ser);
    assert_int_equal(ser.n, 2);
    assert_int_equal(ser.v[1].data[0], 'S');

    /* the same group as a 'G' record: grouping, times, then families by name */
    buf_t g = BUF_INIT;
    buf_putc(&g, 'G');
    put_u32(&g, 1);
    put_str(&g, "job");
    put_str(&g, "g");
    put_u64(&g, 1000); /* push_ms */
    put_u64(&g, 0);    /* fail_ms */
    buf_putc(&g, 1);   /* last_ok */
    put_f64(&g, 0);    /* interval_ms */
    put_u64(&g, 1000); /* first_push_ms */
    put_u32(&g, 2);
    /* family, its metrics' label sets (as stored: instance "" added) and values */
    static const struct {
        const char *name;
        int n;
        const char *sets[2][4][2];
        int nl[2];
        double v[2];
    } fams[] = {
        {"x", 2, {{{"instance", ""}, {"job", "g"}, {"l", "1"}}, {{"instance", ""}, {"job", "g"}, {"l", "1"}, {"q", "a"}}}, {3, 4}, {5, 6}},
        {"y", 1, {{{"instance", ""}, {"job", "g"}, {"l", "1"}}}, {3}, {7}},
    };
    for (int f = 0; f < 2; f++) {
        put_str(&g, fams[f].name);
        buf_putc(&g, 0);            /* no help */
        buf_putc(&g, EXPFMT_GAUGE); /* type */
        put_u64(&g, 1000);
        put_u32(&g, (uint32_t)fams[f].n);
        for (int m = 0; m < fams[f].n; m++) {
            put_u32(&g, (uint32_t)fams[f].nl[m]);
            for (int l = 0; l < fams[f].nl[m]; l++) {
                put_str(&g, fams[f].sets[m][l][0]);
                put_str(&g, fams[f].sets[m][l][1]);
            }
            put_f64(&g, fams[f].v[m]);
            put_f64(&g, 0);
            put_f64(&g, 0);
            put_u32(&g, 0);
        }
    }
    /* 'S' gives each metric a 4-byte set number (0: a new set follows) and wrote y's set, 42 bytes
     * (a count and three labels), as x's first set's number */
    assert_int_equal(ser.v[1].len - 3 * 4 + 42, g.len);
    push_registry_t *r2 = push_registry_new(NULL);
    assert_int_equal(push_registry_restore(r2, ser.v[0].data, ser.v[0].len), 0);
    assert_int_equal(push_registry_apply_delta(r2, g.data, g.len), 0);
    push_registry_write_text(r2, &got);
    assert_string_equal(got.data, want.data);
    push_registry_free(r2);
    /* and from the 'S' record */
    r2 = push_registry_new(NULL);
    assert_int_equal(pieces_restore(r2, &ser), 0);
    buf_reset(&got);
    push_registry_write_text(r2, &got);
    assert_string_equal(got.data, want.data);
    push_registry_free(r2);
    /* a set number not given yet: y's 1 made 3 (x gave two) */
    buf_t bad = BUF_INIT;
    buf_append(&bad, ser.v[1].data, ser.v[1].len);
    size_t at = ser.v[1].len - (8 * 3 + 4) - 4; /* y's metric: set number, then value, sum, count, nq */
    assert_int_equal((unsigned char)bad.data[at], 1);
    bad.data[at] = 3;
    r2 = push_registry_new(NULL);
    assert_int_equal(push_registry_apply_delta(r2, bad.data, bad.len), -1);
    assert_int_equal(push_registry_group_count(r2), 0);
    push_registry_free(r2);
    buf_free(&bad);
    buf_free(&g);
    buf_free(&want);
    buf_free(&got);
    pieces_free(&ser);
    push_registry_free(r);
}

static void test_serialize_restore(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    char err[512];
    step_t s[3];
    assert_int_equal(
        push(r, PUSH_PUT, "a", "# HELP x the x\n# TYPE x counter\nx{l=\"1\"} 5\n", 1000, &s[0], err, sizeof(err)),
        PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "b",
                          "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n"
                          "# TYPE s summary\ns{quantile=\"0.5\"} 7\ns_count 3\n",
                          2000, &s[1], err, sizeof(err)),
                     PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "c", "x 1 5\n", 3000, &s[2], err, sizeof(err)), PUSH_ERR_INVALID);
    buf_t t1 = BUF_INIT, t2 = BUF_INIT, j1 = BUF_INIT, j2 = BUF_INIT;
    push_registry_write_text(r, &t1);
    push_registry_write_json(r, &j1);
    /* Pieces of one byte or more each hold one group; big pieces hold them all. */
    size_t sizes[] = {1, 1u << 20};
    for (size_t si = 0; si < 2; si++) {
        pieces_t ser;
        pieces_serialize(r, sizes[si], &ser);
        /* the empty full state, then the groups: a, b and c (whose push failed) */
        assert_int_equal(ser.n, si == 0 ? 4 : 2);
        push_registry_t *r2 = push_registry_new(NULL);
        assert_int_equal(pieces_restore(r2, &ser), 0);
        assert_int_equal(push_registry_group_count(r2), 3);
        buf_reset(&t2);
        buf_reset(&j2);
        push_registry_write_text(r2, &t2);
        push_registry_write_json(r2, &j2);
        assert_string_equal(t1.data, t2.data);
        assert_int_equal(j1.len, j2.len);
        /* Restoring replaces: a registry holding other groups ends up with exactly these. */
        step_t s5;
        assert_int_equal(push(r2, PUSH_PUT, "other", "y 1\n", 3500, &s5, err, sizeof(err)), PUSH_OK);
        arena_destroy(s5.a);
        assert_int_equal(push_registry_group_count(r2), 4);
        assert_int_equal(pieces_restore(r2, &ser), 0);
        assert_int_equal(push_registry_group_count(r2), 3);
        /* The restored type index still guards consistency. */
        step_t s4;
        assert_int_equal(push(r2, PUSH_PUT, "z", "# TYPE x gauge\nx 1\n", 4000, &s4, err, sizeof(err)),
                         PUSH_ERR_INVALID);
        arena_destroy(s4.a);
        push_registry_free(r2);
        if (si == 1) {
            pieces_free(&ser);
            break;
        }
        /* Every truncation and a few corruptions of the full state and of a group piece are
         * refused without crashing; a refused full state leaves the registry empty. */
        for (size_t n = 0; n < ser.v[0].len; n++) {
            push_registry_t *r3 = push_registry_new(NULL);
            assert_int_equal(push_registry_restore(r3, ser.v[0].data, n), -1);
            assert_int_equal(push_registry_group_count(r3), 0);
            push_registry_free(r3);
        }
        for (size_t n = 0; n < ser.v[1].len; n++) {
            push_registry_t *r3 = push_registry_new(NULL);
            assert_int_equal(push_registry_restore(r3, ser.v[0].data, ser.v[0].len), 0);
            assert_int_equal(push_registry_apply_delta(r3, ser.v[1].data, n), n ? -1 : 0);
            assert_int_equal(push_registry_group_count(r3), 0);
            push_registry_free(r3);
        }
        for (size_t i = 1; i < ser.v[1].len; i += 7) {
            char *copy = malloc(ser.v[1].len);
            memcpy(copy, ser.v[1].data, ser.v[1].len);
            copy[i] ^= 0x5a;
            push_registry_t *r3 = push_registry_new(NULL);
            (void)push_registry_apply_delta(r3, copy, ser.v[1].len); /* may or may not decode; must not crash */
            buf_t t3 = BUF_INIT;
            push_registry_write_text(r3, &t3);
            buf_free(&t3);
            push_registry_free(r3);
            free(copy);
        }
        pieces_free(&ser);
    }
    buf_free(&t1);
    buf_free(&t2);
    buf_free(&j1);
    buf_free(&j2);
    for (int i = 0; i < 3; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
}

/* Deltas alone (no snapshot) rebuild the same state, also when replayed twice, and a push that
 * keeps the group's shape logs only its values. */
static void test_delta_replay(void **state)
{
    journal_free();
    push_registry_t *r = push_registry_new(NULL);
    char err[512];
    step_t s[6];
    const char *body1 = "# TYPE c counter\nc{l=\"1\"} 5\n# TYPE s summary\ns{quantile=\"0.5\"} 7\ns_count 3\n";
    const char *body2 = "# TYPE c counter\nc{l=\"1\"} 6\n# TYPE s summary\ns{quantile=\"0.5\"} 8\ns_count 4\n";
    assert_int_equal(push(r, PUSH_PUT, "a", body1, 1000, &s[0], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "a", body2, 2000, &s[1], err, sizeof(err)), PUSH_OK);
    assert_int_equal(journal[0].data[0], 'S');
    assert_int_equal(journal[1].data[0], 'V');
    assert_true(journal[1].len < journal[0].len);
    assert_int_equal(push(r, PUSH_POST, "a", "g 1\n", 3000, &s[2], err, sizeof(err)), PUSH_OK);
    assert_int_equal(journal[2].data[0], 'S');
    assert_int_equal(push(r, PUSH_PUT, "b", "x 1 5\n", 4000, &s[3], err, sizeof(err)), PUSH_ERR_INVALID);
    assert_int_equal(journal[3].data[0], 'F');
    assert_int_equal(push(r, PUSH_PUT, "c", "z 1\n", 5000, &s[4], err, sizeof(err)), PUSH_OK);
    arena_t *a = arena_create(0);
    push_effect_t e;
    label_t gc[1] = {{"job", "c"}};
    assert_true(push_registry_delete(r, &(labels_t){gc, 1}, 6000, a, &e, next_delta()));
    buf_t want = BUF_INIT, got = BUF_INIT;
    push_registry_write_json(r, &want);
    for (int pass = 0; pass < 2; pass++) {
        push_registry_t *r2 = push_registry_new(NULL);
        for (int rep = 0; rep <= pass; rep++)
            for (size_t i = 0; i < njournal; i++)
                assert_int_equal(push_registry_apply_delta(r2, journal[i].data, journal[i].len), 0);
        buf_reset(&got);
        push_registry_write_json(r2, &got);
        assert_string_equal(got.data, want.data);
        push_registry_free(r2);
    }
    /* Garbage deltas are refused without crashing. */
    push_registry_t *r3 = push_registry_new(NULL);
    assert_int_equal(push_registry_apply_delta(r3, "Q", 1), -1);
    for (size_t n = 1; n < journal[0].len; n++)
        (void)push_registry_apply_delta(r3, journal[0].data, n);
    push_registry_free(r3);
    buf_free(&want);
    buf_free(&got);
    for (int i = 0; i < 5; i++)
        arena_destroy(s[i].a);
    arena_destroy(a);
    push_registry_free(r);
    journal_free();
}

/* GET /metrics renders outside the registry lock (it pins the families it shows): renders that
 * race with PUTs and DELETEs must each show every group as one push left it. Under ASan this
 * also catches a family freed while pinned; `make tsan` runs it for races. */
typedef struct {
    push_registry_t *r;
    _Atomic int done;
    _Atomic int renders; /* read by the pushing thread while the renderer counts */
} race_t;

static void race_put(push_registry_t *r, const char *job, int n, int64_t now)
{
    arena_t *a = arena_create(0);
    char body[128];
    snprintf(body, sizeof(body), "a{x=\"1\"} %d\nb %d\nc %d\n", n, n, n);
    char *b = arena_strdup(a, body);
    expfmt_result_t res;
    char err[256];
    assert_int_equal(expfmt_parse_text(b, strlen(b), false, NULL, a, &res, err, sizeof(err)), 0);
    label_t g[1] = {{"job", job}};
    labels_t grouping = {g, 1};
    push_pending_t *p;
    push_effect_t effect;
    assert_int_equal(push_registry_prepare(r, &grouping, PUSH_PUT, &res, now, a, &p, &effect, err, sizeof(err)),
                     PUSH_OK);
    push_registry_commit(r, p, NULL);
    arena_destroy(a);
}

/* A render must show every group as one push left it: per job, a, b and c carry the same value. */
static void check_render_consistent(buf_t *t)
{
    buf_putc(t, '\0');
    long seen[4][3];
    memset(seen, -1, sizeof(seen));
    for (char *line = t->data; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (*line == '#')
            continue;
        char *job = strstr(line, "job=\"j");
        char *sp = strchr(line, ' ');
        if (!job || !sp || (line[0] != 'a' && line[0] != 'b' && line[0] != 'c') || line[1] != '{')
            continue;
        seen[job[6] - '0'][line[0] - 'a'] = strtol(sp + 1, NULL, 10);
    }
    for (int k = 0; k < 4; k++)
        if (seen[k][0] >= 0 || seen[k][1] >= 0 || seen[k][2] >= 0) {
            assert_int_equal(seen[k][0], seen[k][1]);
            assert_int_equal(seen[k][1], seen[k][2]);
        }
}

static void *race_render(void *ud)
{
    race_t *rt = ud;
    while (!atomic_load(&rt->done)) {
        buf_t t = BUF_INIT;
        push_registry_write_text(rt->r, &t);
        check_render_consistent(&t);
        buf_free(&t);
        rt->renders++;
    }
    return NULL;
}

/* Pushes and deletes groups j0..j3 while render runs on another thread: 3000 changes (more until
 * min_renders renders are done when wait is set); the renderer must have done min_renders. */
static void race_run(void *(*render)(void *), int min_renders, bool wait)
{
    race_t rt = {.r = push_registry_new(NULL)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, render, &rt), 0);
    for (int i = 1; i <= 3000 || (wait && rt.renders < min_renders); i++) {
        char job[8];
        snprintf(job, sizeof(job), "j%d", i % 4);
        if (i % 7 == 0) {
            arena_t *a = arena_create(0);
            label_t g[1] = {{"job", job}};
            labels_t grouping = {g, 1};
            push_effect_t effect;
            push_registry_delete(rt.r, &grouping, i, a, &effect, NULL);
            arena_destroy(a);
        } else {
            race_put(rt.r, job, i, i);
        }
    }
    atomic_store(&rt.done, 1);
    pthread_join(th, NULL);
    assert_true(rt.renders >= min_renders);
    push_registry_free(rt.r);
}

static void test_render_races_pushes(void **state)
{
    race_run(race_render, 1, false);
}

/* Pushes body and plays storage for the series reference cache: a sample without a ref gets a
 * fresh one (w[0] = ++*next_ref), a sample with a ref keeps it; then commits. */
static int push_with_refs(push_registry_t *r, push_mode_t mode, const char *job, const char *body, int64_t now,
                          step_t *st, uint64_t *next_ref)
{
    char err[512];
    st->a = arena_create(0);
    char *b = arena_strdup(st->a, body);
    expfmt_result_t res;
    assert_int_equal(expfmt_parse_text(b, strlen(b), false, NULL, st->a, &res, err, sizeof(err)), 0);
    label_t g[1] = {{"job", job}};
    labels_t grouping = {g, 1};
    push_pending_t *p;
    int rc = push_registry_prepare(r, &grouping, mode, &res, now, st->a, &p, &st->effect, err, sizeof(err));
    if (rc != PUSH_OK)
        return rc;
    assert_true(st->effect.nrefs <= st->effect.n);
    for (size_t i = 0; i < st->effect.nrefs; i++)
        if (st->effect.refs[i].w[0] == 0)
            st->effect.refs[i] = (push_ref_t){{++*next_ref, 7}};
    push_registry_commit(r, p, NULL);
    return rc;
}

/* The ref the step's effect carried for series `name` with label l=v (v NULL: any), 0 if none. */
static uint64_t ref_of(const step_t *st, const char *name, const char *l, const char *v)
{
    for (size_t i = 0; i < st->effect.nrefs; i++) {
        const labels_t *ls = &st->effect.samples[i].labels;
        const char *n = labels_get(ls, "__name__"), *x = l ? labels_get(ls, l) : NULL;
        if (strcmp(n, name) == 0 && (!l || (x && strcmp(x, v) == 0)))
            return st->effect.refs[i].w[0];
    }
    return UINT64_MAX; /* no such sample */
}

/* Series refs (registry.h): carried to the next push of a family that kept its shape, reset when
 * the family's labels, bounds or type change, absent on staleness markers, gone with the group. */
static void test_series_refs(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    uint64_t next = 0;
    step_t s[12];
    int k = 0;
    const char *b1 = "# TYPE a counter\na 1\nb{x=\"1\"} 2\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                     "h_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n";
    const char *b2 = "# TYPE a counter\na 5\nb{x=\"1\"} 6\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                     "h_bucket{le=\"+Inf\"} 3\nh_sum 4\nh_count 3\n";
    /* First push: nothing known. */
    assert_int_equal(push_with_refs(r, PUSH_PUT, "j", b1, 1000, &s[k], &next), PUSH_OK);
    assert_int_equal(s[k].effect.nrefs, 6);
    assert_int_equal(s[k].effect.n, 6);
    assert_int_equal(next, 6); /* every sample was fresh */
    uint64_t ra = ref_of(&s[k], "a", NULL, NULL), rb = ref_of(&s[k], "b", "x", "1");
    uint64_t rh1 = ref_of(&s[k], "h_bucket", "le", "1"), rhs = ref_of(&s[k], "h_sum", NULL, NULL);
    k++;
    /* Same shape, new values: every ref carried, each to its own series. */
    assert_int_equal(push_with_refs(r, PUSH_PUT, "j", b2, 2000, &s[k], &next), PUSH_OK);
    assert_int_equal(next, 6);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), ra);
    assert_int_equal(ref_of(&s[k], "b", "x", "1"), rb);
    assert_int_equal(ref_of(&s[k], "h_bucket", "le", "1"), rh1);
    assert_int_equal(ref_of(&s[k], "h_sum", NULL, NULL), rhs);
    k++;
    /* b's label changes: b's family starts over, the others keep theirs; the dropped series'
     * staleness marker carries no ref (it lies past nrefs). */
    const char *b3 = "# TYPE a counter\na 6\nb{x=\"2\"} 7\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                     "h_bucket{le=\"+Inf\"} 3\nh_sum 4\nh_count 3\n";
    assert_int_equal(push_with_refs(r, PUSH_PUT, "j", b3, 3000, &s[k], &next), PUSH_OK);
    assert_int_equal(s[k].effect.nrefs, 6);
    assert_int_equal(s[k].effect.n, 7);
    assert_int_equal(count_stale(&s[k].effect), 1);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), ra);
    assert_int_equal(ref_of(&s[k], "b", "x", "2"), 7);
    assert_int_equal(next, 7);
    uint64_t rb2 = 7;
    k++;
    /* A histogram bound changes: h starts over. */
    const char *b4 = "# TYPE a counter\na 7\nb{x=\"2\"} 8\n# TYPE h histogram\nh_bucket{le=\"2\"} 2\n"
                     "h_bucket{le=\"+Inf\"} 3\nh_sum 4\nh_count 3\n";
    assert_int_equal(push_with_refs(r, PUSH_PUT, "j", b4, 4000, &s[k], &next), PUSH_OK);
    assert_int_equal(ref_of(&s[k], "b", "x", "2"), rb2);
    assert_true(ref_of(&s[k], "h_sum", NULL, NULL) > 7);
    assert_int_equal(next, 11);
    k++;
    /* POST of another family keeps a's refs in the group; a type change starts a over. */
    assert_int_equal(push_with_refs(r, PUSH_POST, "j", "c 1\n", 5000, &s[k], &next), PUSH_OK);
    assert_int_equal(s[k].effect.nrefs, 1);
    assert_int_equal(next, 12);
    k++;
    assert_int_equal(push_with_refs(r, PUSH_POST, "j", "# TYPE a counter\na 8\n", 6000, &s[k], &next), PUSH_OK);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), ra);
    k++;
    assert_int_equal(push_with_refs(r, PUSH_POST, "j", "# TYPE a gauge\na 8\n", 7000, &s[k], &next), PUSH_OK);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), 13);
    k++;
    /* Another group with the same body has its own refs. */
    assert_int_equal(push_with_refs(r, PUSH_PUT, "other", "# TYPE a gauge\na 1\n", 7000, &s[k], &next), PUSH_OK);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), 14);
    k++;
    /* Deleted: markers carry no refs, and the group's next push starts over. */
    arena_t *a = arena_create(0);
    push_effect_t e;
    label_t g[1] = {{"job", "j"}};
    assert_true(push_registry_delete(r, &(labels_t){g, 1}, 8000, a, &e, NULL));
    assert_int_equal(e.nrefs, 0);
    assert_null(e.refs);
    assert_int_equal(push_with_refs(r, PUSH_PUT, "j", "# TYPE a gauge\na 9\n", 9000, &s[k], &next), PUSH_OK);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), 15);
    k++;
    /* Restored state knows no refs (they do not outlive the process). */
    pieces_t ser;
    pieces_serialize(r, 1u << 20, &ser);
    push_registry_t *r2 = push_registry_new(NULL);
    assert_int_equal(pieces_restore(r2, &ser), 0);
    pieces_free(&ser);
    assert_int_equal(push_with_refs(r2, PUSH_PUT, "j", "# TYPE a gauge\na 10\n", 10000, &s[k], &next), PUSH_OK);
    assert_int_equal(ref_of(&s[k], "a", NULL, NULL), 16);
    k++;
    push_registry_wipe(r2, 11000, a, &e, NULL);
    assert_int_equal(e.nrefs, 0);
    for (int i = 0; i < k; i++)
        arena_destroy(s[i].a);
    arena_destroy(a);
    push_registry_free(r);
    push_registry_free(r2);
}

/* A full PUT with its body's shape handed over (as api/push.c does for text bodies). */
static int push_shaped(push_registry_t *r, const char *job, const char *body, int64_t now, step_t *st)
{
    char err[256];
    st->a = arena_create(0);
    char *b = arena_strdup(st->a, body);
    expfmt_result_t res;
    assert_int_equal(expfmt_parse_text_spans(b, strlen(b), false, NULL, st->a, &res, err, sizeof(err)), 0);
    label_t g[1] = {{"job", job}};
    labels_t grouping = {g, 1};
    push_pending_t *p;
    int rc = push_registry_build(r, &grouping, PUSH_PUT, &res, now, st->a, &p, err, sizeof(err));
    assert_int_equal(rc, PUSH_OK);
    push_registry_pending_take_shape(p, push_shape_build(body, strlen(body), EXPFMT_FORMAT_TEXT, &res), false);
    rc = push_registry_settle(r, p, &st->effect, err, sizeof(err));
    assert_int_equal(rc, PUSH_OK);
    for (size_t i = 0; i < st->effect.nrefs; i++) /* as storage would resolve them */
        st->effect.refs[i] = (push_ref_t){{i + 1, 7}};
    push_registry_commit(r, p, next_delta());
    return rc;
}

/* A repeat: match, settle_fast, commit. Returns PUSH_MISS where the caller would parse in full. */
static int push_repeat(push_registry_t *r, const char *job, const char *body, int64_t now, step_t *st)
{
    st->a = arena_create(0);
    label_t g[1] = {{"job", job}};
    labels_t grouping = {g, 1};
    push_fast_t *f;
    int rc = push_registry_match(r, &grouping, body, strlen(body), EXPFMT_FORMAT_TEXT, st->a, &f);
    if (rc != PUSH_OK)
        return rc;
    push_pending_t *p;
    rc = push_registry_settle_fast(r, f, now, st->a, &p, &st->effect);
    push_registry_fast_release(r, f);
    if (rc == PUSH_OK)
        push_registry_commit(r, p, next_delta());
    return rc;
}

static double effect_value(const push_effect_t *e, const char *name, const char *lname, const char *lvalue)
{
    for (size_t i = 0; i < e->n; i++) {
        const labels_t *ls = &e->samples[i].labels;
        const char *n = labels_get(ls, "__name__");
        const char *v = lname ? labels_get(ls, lname) : NULL;
        if (n && strcmp(n, name) == 0 && (!lname || (v && strcmp(v, lvalue) == 0)))
            return e->samples[i].v;
    }
    fail_msg("no sample %s", name);
    return 0;
}

static void test_repeated_push(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    step_t s[8];
    const char *b1 = "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 2\nh_count 3\n# TYPE s summary\n"
                     "s{quantile=\"0.5\"} 4\ns_count 5\ng{t=\"a\"} 6\ng{t=\"b\"} 7\n";
    const char *b2 = "# TYPE h histogram\nh_bucket{le=\"1\"} 1.9\nh_sum 2.5\nh_count 30\n# TYPE s summary\n"
                     "s{quantile=\"0.5\"} 40\ns_count 50.7\ng{t=\"a\"} 60\ng{t=\"b\"} 70\n";
    /* No cache before the first full push. */
    assert_int_equal(push_repeat(r, "j", b1, 1000, &s[0]), PUSH_MISS);
    arena_destroy(s[0].a);
    push_shaped(r, "j", b1, 1000, &s[0]);
    assert_int_equal(push_repeat(r, "j", b2, 2000, &s[1]), PUSH_OK);
    /* Same series as the full push, new values (0.0.4 truncates counts and buckets), the refs
     * storage resolved last time carried, and no staleness markers. */
    assert_int_equal(s[1].effect.n, s[0].effect.n);
    assert_int_equal(count_stale(&s[1].effect), 0);
    assert_int_equal(s[1].effect.nrefs, s[1].effect.n);
    for (size_t i = 0; i < s[1].effect.n; i++) {
        assert_int_equal(s[1].effect.refs[i].w[0], i + 1);
        assert_true(labels_equal(&s[1].effect.samples[i].labels, &s[0].effect.samples[i].labels));
    }
    assert_true(effect_value(&s[1].effect, "h_bucket", "le", "1") == 1);
    assert_true(effect_value(&s[1].effect, "h_bucket", "le", "+Inf") == 30); /* from the count */
    assert_true(effect_value(&s[1].effect, "h_sum", NULL, NULL) == 2.5);
    assert_true(effect_value(&s[1].effect, "s_count", NULL, NULL) == 50);
    assert_true(effect_value(&s[1].effect, "s", "quantile", "0.5") == 40);
    assert_true(effect_value(&s[1].effect, "g", "t", "b") == 70);
    buf_t t = BUF_INIT;
    push_registry_write_text(r, &t);
    assert_non_null(strstr(t.data, "g{instance=\"\",job=\"j\",t=\"b\"} 70\n"));
    assert_non_null(strstr(t.data, "s_count{instance=\"\",job=\"j\"} 50\n"));
    buf_free(&t);
    /* A repeat of a repeat (its families point into the first push's labels). */
    assert_int_equal(push_repeat(r, "j", b1, 3000, &s[2]), PUSH_OK);
    assert_true(effect_value(&s[2].effect, "g", "t", "b") == 7);
    /* A changed body misses; a POST drops the cache. */
    assert_int_equal(push_repeat(r, "j", "g{t=\"a\"} 1\n", 4000, &s[3]), PUSH_MISS);
    char err[256];
    assert_int_equal(push(r, PUSH_POST, "j", "other 1\n", 5000, &s[4], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push_repeat(r, "j", b1, 6000, &s[5]), PUSH_MISS);
    for (int i = 0; i < 6; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
}

/* A Flink-shaped body: NFAM gauge families and a summary, each with one metric per one of NSET
 * label sets of 10 labels (every operator metric of a subtask carries the same labels). */
enum { NFAM = 20, NSET = 6 };

static char *flink_like_body(int tick)
{
    buf_t b = BUF_INIT;
    for (int f = 0; f <= NFAM; f++) {
        bool summary = f == NFAM;
        char fam[32];
        snprintf(fam, sizeof(fam), summary ? "lat_%d" : "op_metric_%d", f);
        buf_printf(&b, "# HELP %s help of %s\n# TYPE %s %s\n", fam, fam, fam, summary ? "summary" : "gauge");
        for (int k = 0; k < NSET; k++) {
            char ls[512];
            int n = 0;
            for (int l = 0; l < 10; l++)
                n += snprintf(ls + n, sizeof(ls) - (size_t)n, "%sl%d=\"v%d_%d\"", l ? "," : "", l, l, l < 5 ? 0 : k);
            if (summary) {
                buf_printf(&b, "%s{%s,quantile=\"0.5\"} %d\n%s{%s,quantile=\"0.99\"} %d\n", fam, ls, tick + k, fam, ls,
                           tick * 2 + k);
                buf_printf(&b, "%s_sum{%s} %d\n%s_count{%s} %d\n", fam, ls, tick * 3, fam, ls, tick);
            } else {
                buf_printf(&b, "%s{%s} %d.5\n", fam, ls, tick * 100 + f * 10 + k);
            }
        }
    }
    char *s = strdup(b.data);
    buf_free(&b);
    return s;
}

/* A summary's or histogram's sum, count and quantiles/buckets are kept apart from the metric:
 * parts a body leaves out read as 0 (text, storage), come back the same from a snapshot, and a
 * repeated push sets the parts it has; gauges beside them keep their values. */
static void test_metric_parts_apart(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    step_t s[3];
    const char *b1 = "# TYPE s summary\ns{quantile=\"0.5\"} 7\n# TYPE h histogram\nh_count 3\n"
                     "# TYPE u summary\nu_sum 1.5\n# TYPE g gauge\ng 2\n";
    const char *b2 = "# TYPE s summary\ns{quantile=\"0.5\"} 8\n# TYPE h histogram\nh_count 4\n"
                     "# TYPE u summary\nu_sum 2.5\n# TYPE g gauge\ng 5\n";
    push_shaped(r, "j", b1, 1000, &s[0]);
    const push_effect_t *e = &s[0].effect;
    assert_true(effect_value(e, "s", "quantile", "0.5") == 7);
    assert_true(effect_value(e, "s_sum", NULL, NULL) == 0 && effect_value(e, "s_count", NULL, NULL) == 0);
    assert_true(effect_value(e, "h_bucket", "le", "+Inf") == 3 && effect_value(e, "h_sum", NULL, NULL) == 0);
    assert_true(effect_value(e, "u_sum", NULL, NULL) == 1.5 && effect_value(e, "u_count", NULL, NULL) == 0);
    assert_true(effect_value(e, "g", NULL, NULL) == 2);
    assert_int_equal(push_repeat(r, "j", b2, 2000, &s[1]), PUSH_OK);
    e = &s[1].effect;
    assert_true(effect_value(e, "s", "quantile", "0.5") == 8 && effect_value(e, "s_sum", NULL, NULL) == 0);
    assert_true(effect_value(e, "h_count", NULL, NULL) == 4 && effect_value(e, "h_bucket", "le", "+Inf") == 4);
    assert_true(effect_value(e, "u_sum", NULL, NULL) == 2.5 && effect_value(e, "g", NULL, NULL) == 5);
    buf_t t1 = BUF_INIT, t2 = BUF_INIT, j1 = BUF_INIT, j2 = BUF_INIT;
    push_registry_write_text(r, &t1);
    push_registry_write_json(r, &j1);
    assert_non_null(strstr(t1.data, "s_count{instance=\"\",job=\"j\"} 0\n"));
    assert_non_null(strstr(t1.data, "u_sum{instance=\"\",job=\"j\"} 2.5\n"));
    assert_non_null(strstr(t1.data, "g{instance=\"\",job=\"j\"} 5\n"));
    pieces_t ser;
    pieces_serialize(r, 1u << 20, &ser);
    push_registry_t *r2 = push_registry_new(NULL);
    assert_int_equal(pieces_restore(r2, &ser), 0);
    push_registry_write_text(r2, &t2);
    push_registry_write_json(r2, &j2);
    assert_string_equal(t1.data, t2.data);
    assert_string_equal(j1.data, j2.data);
    pieces_free(&ser);
    push_registry_free(r2);
    buf_free(&t1);
    buf_free(&t2);
    buf_free(&j1);
    buf_free(&j2);
    for (int i = 0; i < 2; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
}

/* The representation: label sets stored once per push, not once per metric; a repeat adds only
 * a block of metrics and values over the same base, replacing the previous one; a restore
 * interns the sets again; the text is unchanged throughout. */
static void test_label_sets_interned(void **state)
{
    (void)state;
    push_registry_t *r = push_registry_new(NULL);
    step_t s[8];
    char *b1 = flink_like_body(1);
    push_shaped(r, "j", b1, 1000, &s[0]);
    push_registry_mem_t m0;
    push_registry_memory(r, &m0);
    assert_int_equal(m0.groups, 1);
    assert_int_equal(m0.families, NFAM + 1);
    assert_int_equal(m0.metrics, (NFAM + 1) * NSET);
    assert_int_equal(m0.label_sets, NSET); /* quantile dropped, job and instance="" added: shared */
    assert_int_equal(m0.batches, 2);       /* the block and its base */
    /* Everything the registry holds is less than per-metric copies of the label arrays alone
     * (12 labels each: 10 + job + instance). */
    assert_true(m0.bytes < (size_t)(NFAM + 1) * NSET * 12 * sizeof(label_t));
    buf_t t0 = BUF_INIT;
    push_registry_write_text(r, &t0);
    assert_non_null(strstr(t0.data, "op_metric_3{instance=\"\",job=\"j\",l0=\"v0_0\",l1=\"v1_0\",l2=\"v2_0\","
                                    "l3=\"v3_0\",l4=\"v4_0\",l5=\"v5_2\",l6=\"v6_2\",l7=\"v7_2\",l8=\"v8_2\","
                                    "l9=\"v9_2\"} 132.5\n"));

    /* Repeats: new values, the same base, one block at a time. */
    char *b2 = flink_like_body(2);
    assert_int_equal(push_repeat(r, "j", b2, 2000, &s[1]), PUSH_OK);
    push_registry_mem_t m1;
    push_registry_memory(r, &m1);
    assert_int_equal(m1.batches, 2);
    assert_int_equal(m1.label_sets, NSET);
    assert_int_equal(m1.metrics, m0.metrics);
    for (int i = 2; i < 6; i++)
        assert_int_equal(push_repeat(r, "j", i % 2 ? b2 : b1, 1000 * (i + 1), &s[i]), PUSH_OK);
    push_registry_mem_t m2;
    push_registry_memory(r, &m2);
    assert_int_equal(m2.batches, 2);
    assert_int_equal(m2.bytes, m1.bytes);
    buf_t t1 = BUF_INIT;
    push_registry_write_text(r, &t1);
    assert_non_null(strstr(t1.data, "l9=\"v9_2\"} 232.5\n"));
    assert_non_null(strstr(t1.data, "lat_20{instance=\"\",job=\"j\",l0=\"v0_0\",l1=\"v1_0\",l2=\"v2_0\",l3=\"v3_0\","
                                    "l4=\"v4_0\",l5=\"v5_5\",l6=\"v6_5\",l7=\"v7_5\",l8=\"v8_5\",l9=\"v9_5\","
                                    "quantile=\"0.99\"} 9\n"));
    /* The repeat's values, in the sum/count of the summary too. */
    assert_true(effect_value(&s[5].effect, "lat_20_sum", "l9", "v9_1") == 6);
    assert_true(effect_value(&s[5].effect, "lat_20_count", "l9", "v9_1") == 2);

    /* A restore rebuilds the same sets and the same text. */
    pieces_t pc;
    pieces_serialize(r, 1 << 20, &pc);
    push_registry_t *r2 = push_registry_new(NULL);
    assert_int_equal(pieces_restore(r2, &pc), 0);
    push_registry_mem_t m3;
    push_registry_memory(r2, &m3);
    assert_int_equal(m3.metrics, m0.metrics);
    assert_int_equal(m3.label_sets, NSET);
    buf_t t2 = BUF_INIT;
    push_registry_write_text(r2, &t2);
    assert_int_equal(t2.len, t1.len);
    assert_memory_equal(t2.data, t1.data, t1.len);

    /* After a full push of a different shape, the old base goes with its last block. */
    assert_int_equal(push_repeat(r, "j", "g 1\n", 9000, &s[6]), PUSH_MISS);
    arena_destroy(s[6].a);
    push_shaped(r, "j", "g 1\n", 9000, &s[6]);
    push_registry_mem_t m4;
    push_registry_memory(r, &m4);
    assert_int_equal(m4.batches, 2);
    assert_int_equal(m4.metrics, 1);
    assert_int_equal(m4.label_sets, 1);

    buf_free(&t0);
    buf_free(&t1);
    buf_free(&t2);
    pieces_free(&pc);
    for (int i = 0; i < 7; i++)
        arena_destroy(s[i].a);
    free(b1);
    free(b2);
    push_registry_free(r2);
    push_registry_free(r);
    journal_free();
}

/* Every stored sample's labels are sorted by name with no empty value, wherever __name__ and the
 * quantile/le label fall among the metric's own labels (names before "__name__", between, after
 * "quantile"), on the full push, its repeat, and the staleness markers of a DELETE. */
static void expect_sorted_labels(const push_effect_t *e, size_t n, size_t nlabels_min)
{
    assert_int_equal(e->n, n);
    for (size_t i = 0; i < e->n; i++) {
        const labels_t *ls = &e->samples[i].labels;
        assert_true(ls->n >= nlabels_min);
        assert_int_equal(labels_check_sorted_unique(ls), 0);
        for (size_t j = 0; j < ls->n; j++)
            assert_true(ls->v[j].value[0] != 0);
        assert_non_null(labels_get(ls, "__name__"));
    }
}

static void test_effect_labels_sorted(void **state)
{
    (void)state;
    push_registry_t *r = push_registry_new(NULL);
    step_t s[3];
    const char *b1 = "# TYPE s summary\ns{A=\"x\",_b=\"y\",m=\"\",p=\"z\",zz=\"w\",quantile=\"0.5\"} 1\n"
                     "s_sum{A=\"x\",_b=\"y\",m=\"\",p=\"z\",zz=\"w\"} 2\n"
                     "s_count{A=\"x\",_b=\"y\",m=\"\",p=\"z\",zz=\"w\"} 3\n"
                     "# TYPE h histogram\nh_bucket{a=\"1\",lz=\"2\",le=\"0.5\"} 1\nh_sum{a=\"1\",lz=\"2\"} 2\n"
                     "h_count{a=\"1\",lz=\"2\"} 3\n";
    const char *b2 = "# TYPE s summary\ns{A=\"x\",_b=\"y\",m=\"\",p=\"z\",zz=\"w\",quantile=\"0.5\"} 4\n"
                     "s_sum{A=\"x\",_b=\"y\",m=\"\",p=\"z\",zz=\"w\"} 5\n"
                     "s_count{A=\"x\",_b=\"y\",m=\"\",p=\"z\",zz=\"w\"} 6\n"
                     "# TYPE h histogram\nh_bucket{a=\"1\",lz=\"2\",le=\"0.5\"} 4\nh_sum{a=\"1\",lz=\"2\"} 5\n"
                     "h_count{a=\"1\",lz=\"2\"} 6\n";
    /* summary: quantile, _sum, _count; histogram: le=0.5, le=+Inf, _sum, _count */
    push_shaped(r, "j", b1, 1000, &s[0]);
    expect_sorted_labels(&s[0].effect, 7, 4);
    assert_true(effect_value(&s[0].effect, "s", "quantile", "0.5") == 1);
    assert_true(effect_value(&s[0].effect, "h_bucket", "le", "+Inf") == 3);
    assert_int_equal(push_repeat(r, "j", b2, 2000, &s[1]), PUSH_OK);
    expect_sorted_labels(&s[1].effect, 7, 4);
    assert_true(effect_value(&s[1].effect, "s", "quantile", "0.5") == 4);
    assert_true(effect_value(&s[1].effect, "h_bucket", "le", "0.5") == 4);
    for (size_t i = 0; i < s[1].effect.n; i++)
        assert_true(labels_equal(&s[1].effect.samples[i].labels, &s[0].effect.samples[i].labels));
    s[2].a = arena_create(0);
    label_t g[1] = {{"job", "j"}};
    labels_t grouping = {g, 1};
    assert_true(push_registry_delete(r, &grouping, 3000, s[2].a, &s[2].effect, next_delta()));
    expect_sorted_labels(&s[2].effect, 7, 4);
    assert_int_equal(count_stale(&s[2].effect), 7);
    for (int i = 0; i < 3; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
    journal_free();
}

/* Neighbouring samples share interned strings and their sort (registry.c, push_neigh_t): every
 * way a sample can differ from its neighbour must still give its own labels, sorted, with the
 * grouping's overriding the body's and instance="" only where the body has none. */
static void test_neighbour_labels(void **state)
{
    (void)state;
    push_registry_t *r = push_registry_new(NULL);
    step_t s[1];
    buf_t body = BUF_INIT, wide = BUF_INIT;
    buf_puts(&body, "# TYPE m gauge\n"
                    "m{a=\"1\",b=\"2\",c=\"3\"} 1\n"         /* first */
                    "m{a=\"1\",b=\"2\",c=\"4\"} 2\n"         /* a value differs */
                    "m{c=\"3\",b=\"2\",a=\"1\",d=\"0\"} 3\n" /* names in another order, one more */
                    "m{c=\"5\",b=\"2\",a=\"1\",d=\"0\"} 4\n" /* the same names: the same sort */
                    "m{job=\"x\",b=\"2\",c=\"6\"} 5\n"       /* the grouping's name where c was */
                    "m{a=\"1\",b=\"2\",c=\"7\"} 6\n"         /* after a name the grouping took */
                    "m{job=\"y\",c=\"8\"} 7\n"
                    "m{instance=\"i1\",a=\"1\"} 8\n" /* instance from the body */
                    "m{a=\"2\",instance=\"i1\"} 9\n"
                    "m{a=\"3\"} 10\n" /* none: instance="" */
                    "# TYPE n counter\n"
                    "n{a=\"1\",b=\"2\",c=\"3\"} 11\n"); /* another family, the same strings */
    /* More labels than the neighbour keeps, twice: the last differs. */
    buf_puts(&body, "# TYPE w gauge\n");
    for (int k = 0; k < 2; k++) {
        buf_puts(&body, "w{");
        for (int i = 39; i >= 0; i--)
            buf_printf(&body, "l%02d=\"%s\"%s", i, i == 39 && k ? "x" : "v", i ? "," : "");
        buf_printf(&body, "} %d\n", 12 + k);
    }
    buf_putc(&body, '\0');
    push_shaped(r, "j", body.data, 1000, &s[0]);
    buf_t text = BUF_INIT;
    push_registry_write_text(r, &text);
    buf_putc(&text, '\0');
    static const char *const want[] = {
        "m{a=\"1\",b=\"2\",c=\"3\",instance=\"\",job=\"j\"} 1\n",
        "m{a=\"1\",b=\"2\",c=\"4\",instance=\"\",job=\"j\"} 2\n",
        "m{a=\"1\",b=\"2\",c=\"3\",d=\"0\",instance=\"\",job=\"j\"} 3\n",
        "m{a=\"1\",b=\"2\",c=\"5\",d=\"0\",instance=\"\",job=\"j\"} 4\n",
        "m{b=\"2\",c=\"6\",instance=\"\",job=\"j\"} 5\n",
        "m{a=\"1\",b=\"2\",c=\"7\",instance=\"\",job=\"j\"} 6\n",
        "m{c=\"8\",instance=\"\",job=\"j\"} 7\n",
        "m{a=\"1\",instance=\"i1\",job=\"j\"} 8\n",
        "m{a=\"2\",instance=\"i1\",job=\"j\"} 9\n",
        "m{a=\"3\",instance=\"\",job=\"j\"} 10\n",
        "n{a=\"1\",b=\"2\",c=\"3\",instance=\"\",job=\"j\"} 11\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(text.data, want[i]))
            fail_msg("missing %s in\n%s", want[i], text.data);
    for (int k = 0; k < 2; k++) {
        buf_reset(&wide);
        buf_puts(&wide, "w{instance=\"\",job=\"j\",");
        for (int i = 0; i < 40; i++)
            buf_printf(&wide, "l%02d=\"%s\"%s", i, i == 39 && k ? "x" : "v", i < 39 ? "," : "");
        buf_printf(&wide, "} %d\n", 12 + k);
        buf_putc(&wide, '\0');
        if (!strstr(text.data, wide.data))
            fail_msg("missing %s in\n%s", wide.data, text.data);
    }
    buf_free(&text);
    buf_free(&wide);
    buf_free(&body);
    arena_destroy(s[0].a);
    push_registry_free(r);
    journal_free();
}

/* A family named like a summary's or histogram's suffixed series is refused beside it, in the
 * same push, in another group or in the group's own families a POST keeps (the client library's
 * suffix check, which the Pushgateway runs on every push). */
static void test_suffix_collisions(void **state)
{
    (void)state;
    push_registry_t *r = push_registry_new(NULL);
    step_t s[16];
    int n = 0;
    char err[512];
    const char *hist = "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n";
    /* a summary beside its _bucket name is fine; beside _count it is not */
    assert_int_equal(push(r, PUSH_PUT, "a", "# TYPE s summary\ns_sum 3\ns_count 2\n# TYPE s_bucket gauge\ns_bucket 4\n",
                          1000, &s[n++], err, sizeof(err)),
                     PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "b", "# TYPE s_count gauge\ns_count 1\n", 1000, &s[n++], err, sizeof(err)),
                     PUSH_ERR_INVALID);
    assert_non_null(
        strstr(err, "collected metric named \"s_count\" collides with previously collected summary named \"s\""));
    assert_int_equal(
        push(r, PUSH_PUT, "b", "# TYPE s_sum_count gauge\ns_sum_count 1\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    /* a histogram beside another group's h_count, then once that group dropped it */
    assert_int_equal(push(r, PUSH_PUT, "c", "h_count 1\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "d", hist, 1000, &s[n++], err, sizeof(err)), PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "collected histogram or summary named \"h\" collides with previously collected metric "
                                "named \"h_count\""));
    assert_int_equal(push(r, PUSH_PUT, "c", "other 1\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push(r, PUSH_PUT, "d", hist, 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    /* the group's own histogram, kept by a POST; replaced by a PUT */
    assert_int_equal(push(r, PUSH_POST, "d", "h_bucket 1\n", 1000, &s[n++], err, sizeof(err)), PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "collected metric named \"h_bucket\" collides with previously collected histogram"));
    assert_int_equal(push(r, PUSH_PUT, "d", "h_bucket 1\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    /* both in one push */
    assert_int_equal(push(r, PUSH_PUT, "e",
                          "g_bucket{a=\"1\"} 1\n# TYPE g histogram\ng_bucket{le=\"+Inf\"} 2\ng_sum 3\ng_count 2\n",
                          1000, &s[n++], err, sizeof(err)),
                     PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "collides with previously collected"));
    for (int i = 0; i < n; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
    journal_free();
}

/* The same metric twice, as the Pushgateway sees it after applying the grouping and defaulting
 * instance to "": refused within a push and across groups whose groupings overlap. */
static void test_duplicates_as_gateway_sees_them(void **state)
{
    (void)state;
    push_registry_t *r = push_registry_new(NULL);
    step_t s[16];
    int n = 0;
    char err[512];
    const label_t a[] = {{"job", "a"}}, ai[] = {{"job", "a"}, {"instance", "i"}},
                  aj[] = {{"job", "a"}, {"instance", "j"}}, b[] = {{"job", "b"}}, c[] = {{"job", "c"}};
    assert_int_equal(push_grouped(r, PUSH_PUT, a, 1, "x{instance=\"i\"} 1\n", 1000, &s[n++], err, sizeof(err)),
                     PUSH_OK);
    assert_int_equal(push_grouped(r, PUSH_PUT, ai, 2, "x 2\n", 1000, &s[n++], err, sizeof(err)), PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "collected metric \"x\" {instance=\"i\",job=\"a\"} was collected before"));
    assert_int_equal(push_grouped(r, PUSH_PUT, ai, 2, "y 2\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push_grouped(r, PUSH_PUT, aj, 2, "x 2\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    assert_int_equal(push_grouped(r, PUSH_PUT, b, 1, "x{instance=\"i\"} 1\n", 1000, &s[n++], err, sizeof(err)),
                     PUSH_OK);
    /* the first group lets go of it: then it is the other's to push */
    assert_int_equal(push_grouped(r, PUSH_PUT, a, 1, "x{instance=\"k\"} 1\n", 1000, &s[n++], err, sizeof(err)),
                     PUSH_OK);
    assert_int_equal(push_grouped(r, PUSH_POST, ai, 2, "x 3\n", 1000, &s[n++], err, sizeof(err)), PUSH_OK);
    /* within one push, no instance and instance="" are one metric */
    assert_int_equal(push_grouped(r, PUSH_PUT, c, 1, "z 1\nz{instance=\"\"} 2\n", 1000, &s[n++], err, sizeof(err)),
                     PUSH_ERR_INVALID);
    assert_non_null(strstr(err, "was collected before with the same name and label values"));
    assert_int_equal(
        push_grouped(r, PUSH_PUT, c, 1, "z 1\nz{instance=\"x\"} 2\nz{a=\"\"} 3\n", 1000, &s[n++], err, sizeof(err)),
        PUSH_OK);
    for (int i = 0; i < n; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
    journal_free();
}

/* The group changes between match and settle (another push, a DELETE): settle_fast misses. */
static void test_repeat_of_changed_group_misses(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    step_t s[3];
    const char *b = "a 1\nb 2\n";
    push_shaped(r, "j", b, 1000, &s[0]);
    arena_t *a = arena_create(0);
    label_t g[1] = {{"job", "j"}};
    labels_t grouping = {g, 1};
    push_fast_t *f;
    assert_int_equal(push_registry_match(r, &grouping, "a 5\nb 6\n", 8, EXPFMT_FORMAT_TEXT, a, &f), PUSH_OK);
    push_effect_t e;
    assert_true(push_registry_delete(r, &grouping, 1500, a, &e, next_delta()));
    push_pending_t *p;
    assert_int_equal(push_registry_settle_fast(r, f, 2000, a, &p, &e), PUSH_MISS);
    push_registry_fast_release(r, f); /* the last ref on the deleted group's cache */
    /* Matched, then a full PUT of the same shape replaced the families: miss too. */
    push_shaped(r, "j", b, 3000, &s[1]);
    assert_int_equal(push_registry_match(r, &grouping, "a 5\nb 6\n", 8, EXPFMT_FORMAT_TEXT, a, &f), PUSH_OK);
    push_shaped(r, "j", b, 3500, &s[2]);
    assert_int_equal(push_registry_settle_fast(r, f, 4000, a, &p, &e), PUSH_MISS);
    push_registry_fast_release(r, f);
    arena_destroy(a);
    for (int i = 0; i < 3; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
}

/* The render in pieces (GET /metrics streams it) ---------------------------------------------- */

/* Groups with every family type, HELP texts (escaped), several series per family and families
 * shared across groups, so the sort interleaves groups within a family. */
static void render_fixture(push_registry_t *r, step_t *s, int n)
{
    char err[512];
    for (int i = 0; i < n; i++) {
        char job[16], body[1024];
        snprintf(job, sizeof(job), "j%d", i);
        snprintf(body, sizeof(body),
                 "# HELP h a \\\\ histogram\n# TYPE h histogram\nh_bucket{le=\"1\"} %d\nh_bucket{le=\"5\"} %d\n"
                 "h_sum 2.5\nh_count %d\n# TYPE s summary\ns{quantile=\"0.5\",q=\"x\\\"y\"} 4\ns_sum 1\n"
                 "s_count 5\n# HELP g gauge %d\n# TYPE g gauge\ng{t=\"a\"} %d\ng{t=\"b\"} 7\nu_%d 1e-9\n"
                 "# TYPE c counter\nc{k=\"line\\nbreak\"} %d\n",
                 i, i + 1, i + 2, i, i, i % 3, i);
        assert_int_equal(push(r, PUSH_PUT, job, body, 1000 + i, &s[i], err, sizeof(err)), PUSH_OK);
    }
}

static void render_all(push_registry_t *r, size_t piece, buf_t *out, size_t *npieces)
{
    push_render_t *h = push_registry_render_begin(r);
    assert_non_null(h);
    bool more;
    size_t n = 0;
    do {
        size_t before = out->len;
        more = push_registry_render_next(h, out, piece);
        n++;
        /* whole lines, and a full piece unless it is the last */
        assert_true(out->len == before || out->data[out->len - 1] == '\n');
        if (more)
            assert_true(out->len - before >= piece);
    } while (more);
    push_registry_render_end(h);
    if (npieces)
        *npieces = n;
}

static void test_render_pieces_equal_one_shot(void **state)
{
    push_registry_t *r = push_registry_new(NULL);
    step_t s[20];
    render_fixture(r, s, 20);
    buf_t want = BUF_INIT;
    push_registry_write_text(r, &want);
    assert_true(want.len > 4096);
    assert_non_null(strstr(want.data, "# HELP h a \\\\ histogram\n# TYPE h histogram\n"));
    static const size_t pieces[] = {1, 37, 512, 4096, 65536, SIZE_MAX};
    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        buf_t got = BUF_INIT;
        size_t n;
        render_all(r, pieces[i], &got, &n);
        assert_int_equal(got.len, want.len);
        assert_memory_equal(got.data, want.data, want.len);
        if (pieces[i] < want.len / 2)
            assert_true(n > 2);
        buf_free(&got);
    }
    /* An empty registry: no pieces of text, done at once. */
    push_registry_t *e = push_registry_new(NULL);
    push_render_t *h = push_registry_render_begin(e);
    buf_t got = BUF_INIT;
    assert_false(push_registry_render_next(h, &got, 10));
    assert_int_equal(got.len, 0);
    push_registry_render_end(h);
    push_registry_free(e);
    /* Ended halfway: the pins go (ASan and the registry's free would notice otherwise). */
    h = push_registry_render_begin(r);
    assert_true(push_registry_render_next(h, &got, 100));
    push_registry_render_end(h);
    buf_free(&got);
    buf_free(&want);
    for (int i = 0; i < 20; i++)
        arena_destroy(s[i].a);
    push_registry_free(r);
    journal_free();
}

/* A render in progress shows the registry as it was at begin while every kind of change goes
 * on: full PUTs, POSTs, repeats through the fast path, deletes, expiry, a wipe. Under ASan this
 * catches a family, its labels or a batch freed while pinned. */
static void test_render_survives_changes(void **state)
{
    push_options_t opt = {.group_ttl_ms = 1000};
    push_registry_t *r = push_registry_new(&opt);
    step_t s[8], t[16];
    render_fixture(r, s, 6);
    push_shaped(r, "fast", "# TYPE g gauge\ng{t=\"z\"} 1\nh2 2\n", 2000, &t[0]);
    buf_t want = BUF_INIT;
    push_registry_write_text(r, &want);

    push_render_t *h = push_registry_render_begin(r);
    buf_t got = BUF_INIT;
    assert_true(push_registry_render_next(h, &got, 200));
    char err[512];
    int k = 1;
    assert_int_equal(push(r, PUSH_PUT, "j0", "# TYPE g gauge\ng{t=\"a\"} 100\n", 3000, &t[k++], err, sizeof(err)),
                     PUSH_OK);
    assert_true(push_registry_render_next(h, &got, 200));
    assert_int_equal(push(r, PUSH_POST, "j1", "# TYPE h histogram\nh_bucket{le=\"1\"} 9\nh_sum 9\nh_count 9\n", 3001,
                          &t[k++], err, sizeof(err)),
                     PUSH_OK);
    assert_int_equal(push_repeat(r, "fast", "# TYPE g gauge\ng{t=\"z\"} 5\nh2 6\n", 3002, &t[k++]), PUSH_OK);
    assert_true(push_registry_render_next(h, &got, 200));
    arena_t *a = arena_create(0);
    label_t g2[1] = {{"job", "j2"}};
    labels_t grouping = {g2, 1};
    push_effect_t effect;
    assert_true(push_registry_delete(r, &grouping, 3003, a, &effect, NULL));
    assert_true(push_registry_render_next(h, &got, 200));
    push_registry_wipe(r, 3004, a, &effect, NULL);
    assert_int_equal(push_registry_group_count(r), 0);
    assert_int_equal(push(r, PUSH_PUT, "j3", "# TYPE g gauge\ng{t=\"a\"} 200\n", 3005, &t[k++], err, sizeof(err)),
                     PUSH_OK);
    assert_int_equal(push_registry_expire(r, 10000, a, &effect, NULL), 1);
    while (push_registry_render_next(h, &got, 200))
        ;
    push_registry_render_end(h);
    assert_int_equal(got.len, want.len);
    assert_memory_equal(got.data, want.data, want.len);
    /* And the registry renders what it now holds. */
    buf_reset(&got);
    push_registry_write_text(r, &got);
    buf_putc(&got, '\0');
    assert_null(strstr(got.data, "job=\"j2\""));
    arena_destroy(a);
    buf_free(&got);
    buf_free(&want);
    for (int i = 0; i < 6; i++)
        arena_destroy(s[i].a);
    for (int i = 0; i < k; i++)
        arena_destroy(t[i].a);
    push_registry_free(r);
    journal_free();
}

/* Renders in small pieces on one thread, with pauses between them as a slow client makes, while
 * another thread pushes and deletes: each render must show every group as one push left it. */
static void *race_render_pieces(void *ud)
{
    race_t *rt = ud;
    while (!atomic_load(&rt->done)) {
        push_render_t *h = push_registry_render_begin(rt->r);
        assert_non_null(h);
        buf_t t = BUF_INIT;
        while (push_registry_render_next(h, &t, 16))
            sched_yield();
        push_registry_render_end(h);
        check_render_consistent(&t);
        buf_free(&t);
        rt->renders++;
    }
    return NULL;
}

static void test_render_pieces_race_pushes(void **state)
{
    race_run(race_render_pieces, 3, true);
}

/* A group record encodes each distinct label set once and copies its bytes for the metrics that
 * share it (ser_group): 40 families whose metrics share 6 label sets, enough metrics that the
 * record's buffer grows while sets are copied. Replayed, the record gives back every metric
 * (with its own labels), as the full snapshot does. */
static void test_group_record_shared_sets(void **state)
{
    journal_free();
    push_registry_t *r = push_registry_new(NULL);
    buf_t body = BUF_INIT;
    for (int f = 0; f < 40; f++) {
        buf_printf(&body, "# HELP m%d some help text for family %d\n# TYPE m%d gauge\n", f, f, f);
        for (int k = 0; k < 6; k++)
            buf_printf(&body,
                       "m%d{host=\"host-%d.example\",task=\"Source: a long operator name -> Map -> Sink %d\","
                       "subtask=\"%d\"} %d\n",
                       f, k % 2, k, k, f * 10 + k);
    }
    buf_puts(&body, "# TYPE s summary\ns{host=\"host-0.example\",quantile=\"0.5\"} 1\n"
                    "s{host=\"host-0.example\",quantile=\"0.9\"} 2\ns_sum{host=\"host-0.example\"} 3\n"
                    "s_count{host=\"host-0.example\"} 4\n");
    buf_putc(&body, '\0');
    char err[512];
    step_t st;
    assert_int_equal(push(r, PUSH_PUT, "a", body.data, 1000, &st, err, sizeof(err)), PUSH_OK);
    assert_int_equal(njournal, 1);
    assert_int_equal(journal[0].data[0], 'S');
    buf_t want = BUF_INIT, got = BUF_INIT, snap = BUF_INIT;
    push_registry_write_text(r, &want);
    push_registry_t *r2 = push_registry_new(NULL);
    assert_int_equal(push_registry_apply_delta(r2, journal[0].data, journal[0].len), 0);
    push_registry_write_text(r2, &got);
    buf_putc(&want, '\0');
    buf_putc(&got, '\0');
    assert_string_equal(got.data, want.data);
    assert_non_null(strstr(got.data, "m39{host=\"host-1.example\",instance=\"\",job=\"a\",subtask=\"5\","
                                     "task=\"Source: a long operator name -> Map -> Sink 5\"} 395"));
    /* the snapshot encodes groups the same way */
    pieces_t p;
    pieces_serialize(r, 1u << 20, &p);
    push_registry_t *r3 = push_registry_new(NULL);
    assert_int_equal(pieces_restore(r3, &p), 0);
    push_registry_write_text(r3, &snap);
    buf_putc(&snap, '\0');
    assert_string_equal(snap.data, want.data);
    pieces_free(&p);
    push_registry_free(r3);
    push_registry_free(r2);
    push_registry_free(r);
    arena_destroy(st.a);
    buf_free(&body);
    buf_free(&want);
    buf_free(&got);
    buf_free(&snap);
    journal_free();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_post_semantics),
        cmocka_unit_test(test_staleness_only_for_dropped_series),
        cmocka_unit_test(test_type_index_is_incremental),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_serialize_restore),
        cmocka_unit_test(test_group_records_number_label_sets),
        cmocka_unit_test(test_delta_replay),
        cmocka_unit_test(test_render_races_pushes),
        cmocka_unit_test(test_series_refs),
        cmocka_unit_test(test_repeated_push),
        cmocka_unit_test(test_metric_parts_apart),
        cmocka_unit_test(test_repeat_of_changed_group_misses),
        cmocka_unit_test(test_effect_labels_sorted),
        cmocka_unit_test(test_neighbour_labels),
        cmocka_unit_test(test_suffix_collisions),
        cmocka_unit_test(test_duplicates_as_gateway_sees_them),
        cmocka_unit_test(test_label_sets_interned),
        cmocka_unit_test(test_render_pieces_equal_one_shot),
        cmocka_unit_test(test_render_survives_changes),
        cmocka_unit_test(test_render_pieces_race_pushes),
        cmocka_unit_test(test_group_record_shared_sets),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    journal_free();
    return rc;
}
