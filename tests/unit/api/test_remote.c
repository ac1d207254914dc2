/*
 * test_remote — the hand-written WriteRequest decoder (api/remote.c) against protobuf-c's
 * generated one (internal/proto/remote.proto): random requests packed by protobuf-c decode to the same
 * samples; truncations and random mutations never crash it and, whenever protobuf-c refuses the
 * bytes, it refuses them too; validation rules name the offending series.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal/proto/remote.pb-c.h"
#include "api/remote.h"

/* ---- building requests with protobuf-c -------------------------------------------------------- */

typedef struct {
    Prometheus__WriteRequest wr;
    Prometheus__TimeSeries *ts;
    Prometheus__TimeSeries **tsp;
    Prometheus__Label *lab;
    Prometheus__Label **labp;
    Prometheus__Sample *smp;
    Prometheus__Sample **smpp;
    Prometheus__MetricMetadata md;
    Prometheus__MetricMetadata *mdp;
    char names[64][16];
    char values[64][16];
} req_t;

static uint32_t rnd_state = 12345;
static uint32_t rnd(void)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return rnd_state >> 8;
}

/* nser series of nlab labels (shuffled, __name__ among them) and nsmp increasing samples. */
static uint8_t *build(req_t *r, size_t nser, size_t nlab, size_t nsmp, size_t *len)
{
    memset(r, 0, sizeof(*r));
    prometheus__write_request__init(&r->wr);
    r->ts = calloc(nser, sizeof(*r->ts));
    r->tsp = calloc(nser, sizeof(*r->tsp));
    r->lab = calloc(nser * nlab, sizeof(*r->lab));
    r->labp = calloc(nser * nlab, sizeof(*r->labp));
    r->smp = calloc(nser * nsmp, sizeof(*r->smp));
    r->smpp = calloc(nser * nsmp, sizeof(*r->smpp));
    for (size_t i = 0; i < 64; i++) {
        snprintf(r->names[i], sizeof(r->names[i]), "l%02zu", i);
        snprintf(r->values[i], sizeof(r->values[i]), "v%u", rnd() % 1000);
    }
    for (size_t s = 0; s < nser; s++) {
        Prometheus__TimeSeries *ts = &r->ts[s];
        prometheus__time_series__init(ts);
        r->tsp[s] = ts;
        ts->n_labels = nlab;
        ts->labels = &r->labp[s * nlab];
        for (size_t l = 0; l < nlab; l++) {
            Prometheus__Label *lb = &r->lab[s * nlab + l];
            prometheus__label__init(lb);
            /* reversed order: the decoder must sort */
            size_t k = nlab - 1 - l;
            lb->name = k == 0 ? "__name__" : r->names[k];
            lb->value = k == 0 ? "metric_x" : r->values[(k + s) % 64];
            ts->labels[l] = lb;
        }
        ts->n_samples = nsmp;
        ts->samples = &r->smpp[s * nsmp];
        int64_t t = 1700000000000 + (int64_t)(rnd() % 1000);
        for (size_t k = 0; k < nsmp; k++) {
            Prometheus__Sample *sm = &r->smp[s * nsmp + k];
            prometheus__sample__init(sm);
            t += 1 + rnd() % 20000;
            sm->timestamp = t;
            sm->value = (double)(int32_t)rnd() / 7.0;
            ts->samples[k] = sm;
        }
    }
    r->wr.n_timeseries = nser;
    r->wr.timeseries = r->tsp;
    prometheus__metric_metadata__init(&r->md);
    r->md.type = PROMETHEUS__METRIC_METADATA__METRIC_TYPE__GAUGE;
    r->md.metric_family_name = "metric_x";
    r->md.help = "help text";
    r->md.unit = "seconds";
    r->mdp = &r->md;
    r->wr.n_metadata = 1;
    r->wr.metadata = &r->mdp;
    *len = prometheus__write_request__get_packed_size(&r->wr);
    uint8_t *buf = malloc(*len + 1);
    prometheus__write_request__pack(&r->wr, buf);
    return buf;
}

static void req_free(req_t *r)
{
    free(r->ts);
    free(r->tsp);
    free(r->lab);
    free(r->labp);
    free(r->smp);
    free(r->smpp);
}

/* ---- tests -------------------------------------------------------------------------------------- */

static void test_matches_protobuf_c(void **state)
{
    (void)state;
    for (int round = 0; round < 50; round++) {
        req_t r;
        size_t len;
        size_t nser = 1 + rnd() % 20, nlab = 1 + rnd() % 10, nsmp = rnd() % 30;
        uint8_t *buf = build(&r, nser, nlab, nsmp, &len);
        arena_t *a = arena_create(0);
        remote_write_req_t out;
        char err[512];
        assert_int_equal(remote_write_decode(buf, len, 0, a, &out, err, sizeof(err)), REMOTE_OK);
        assert_int_equal(out.nsamples, nser * nsmp);
        assert_int_equal(out.nseries, nsmp ? nser : 0);
        assert_int_equal(out.nmetadata, 1);
        assert_string_equal(out.metadata[0].name, "metric_x");
        assert_string_equal(out.metadata[0].help, "help text");
        assert_string_equal(out.metadata[0].unit, "seconds");
        assert_int_equal(out.metadata[0].type, 2);
        for (size_t s = 0; s < nser; s++) {
            for (size_t k = 0; k < nsmp; k++) {
                const storage_sample_t *ss = &out.samples[s * nsmp + k];
                assert_int_equal(ss->t, r.ts[s].samples[k]->timestamp);
                assert_memory_equal(&ss->v, &r.ts[s].samples[k]->value, sizeof(double));
                assert_int_equal(ss->labels.n, nlab);
                for (size_t l = 0; l < nlab; l++) {
                    if (l > 0)
                        assert_true(strcmp(ss->labels.v[l - 1].name, ss->labels.v[l].name) < 0);
                    /* the sorted position l holds original label nlab-1-l' reversed back */
                    const Prometheus__Label *orig = r.ts[s].labels[nlab - 1 - l];
                    assert_string_equal(ss->labels.v[l].name, orig->name);
                    assert_string_equal(ss->labels.v[l].value, orig->value);
                }
            }
        }
        arena_destroy(a);
        free(buf);
        req_free(&r);
    }
}

/* Decodes with both; if protobuf-c refuses, ours must refuse. Returns our code. */
static int both(const uint8_t *buf, size_t len)
{
    Prometheus__WriteRequest *pc = prometheus__write_request__unpack(NULL, len, buf);
    arena_t *a = arena_create(0);
    remote_write_req_t out;
    char err[512];
    int rc = remote_write_decode(buf, len, 0, a, &out, err, sizeof(err));
    if (!pc)
        assert_int_not_equal(rc, REMOTE_OK);
    if (pc && rc == REMOTE_ERR_DECODE) {
        /* protobuf-c accepted: only semantic refusals are allowed from us */
        fail_msg("protobuf-c accepted bytes our decoder calls malformed: %s", err);
    }
    if (pc)
        prometheus__write_request__free_unpacked(pc, NULL);
    arena_destroy(a);
    return rc;
}

static void test_truncation_at_every_offset(void **state)
{
    (void)state;
    req_t r;
    size_t len;
    uint8_t *buf = build(&r, 3, 4, 5, &len);
    int refused = 0;
    for (size_t n = 0; n <= len; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        refused += both(cut, n) != REMOTE_OK;
        free(cut);
    }
    assert_true(refused > (int)len / 2);
    free(buf);
    req_free(&r);
}

static void test_random_mutations(void **state)
{
    (void)state;
    req_t r;
    size_t len;
    uint8_t *buf = build(&r, 4, 3, 6, &len);
    uint8_t *m = malloc(len + 64);
    for (int i = 0; i < 20000; i++) {
        memcpy(m, buf, len);
        size_t ml = len;
        int nmut = 1 + rnd() % 4;
        for (int k = 0; k < nmut; k++) {
            switch (rnd() % 4) {
            case 0: m[rnd() % ml] = (uint8_t)rnd(); break;
            case 1: m[rnd() % ml] ^= (uint8_t)(1u << (rnd() % 8)); break;
            case 2: ml = 1 + rnd() % ml; break;
            default:
                if (ml + 8 < len + 64) {
                    size_t pos = rnd() % ml;
                    memmove(m + pos + 5, m + pos, ml - pos);
                    memcpy(m + pos, "\xff\xff\xff\xff\x0f", 5); /* a huge varint */
                    ml += 5;
                }
            }
        }
        both(m, ml);
    }
    free(m);
    free(buf);
    req_free(&r);
}

static int decode_str(const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    arena_t *a = arena_create(0);
    remote_write_req_t out;
    int rc = remote_write_decode(buf, len, 3, a, &out, err, errlen);
    arena_destroy(a);
    return rc;
}

static void test_validation(void **state)
{
    (void)state;
    char err[512];
    /* series {__name__="m", a="1", a="2"} */
    static const uint8_t dup[] = {0x0a, 0x1f, 0x0a, 0x0d, 0x0a, 0x08, '_',  '_',  'n',  'a',  'm',
                                  'e',  '_',  '_',  0x12, 0x01, 'm',  0x0a, 0x06, 0x0a, 0x01, 'a',
                                  0x12, 0x01, '1',  0x0a, 0x06, 0x0a, 0x01, 'a',  0x12, 0x01, '2'};
    assert_int_equal(decode_str(dup, sizeof(dup), err, sizeof(err)), REMOTE_ERR_INVALID);
    assert_non_null(strstr(err, "duplicate label name \"a\""));
    /* {a="1"}: no __name__ */
    static const uint8_t noname[] = {0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, 'a', 0x12, 0x01, '1'};
    assert_int_equal(decode_str(noname, sizeof(noname), err, sizeof(err)), REMOTE_ERR_INVALID);
    assert_non_null(strstr(err, "no __name__"));
    /* {__name__="m"} with an empty-valued label b */
    static const uint8_t empty[] = {0x0a, 0x14, 0x0a, 0x0d, 0x0a, 0x08, '_',  '_',  'n',  'a',  'm',
                                    'e',  '_',  '_',  0x12, 0x01, 'm',  0x0a, 0x03, 0x0a, 0x01, 'b'};
    assert_int_equal(decode_str(empty, sizeof(empty), err, sizeof(err)), REMOTE_ERR_INVALID);
    assert_non_null(strstr(err, "empty value for label \"b\""));
    /* four samples with a limit of 3 */
    uint8_t four[128];
    size_t n = 0;
    four[n++] = 0x0a;
    size_t lenpos = n++;
    static const uint8_t name[] = {0x0a, 0x0d, 0x0a, 0x08, '_', '_', 'n', 'a', 'm', 'e', '_', '_', 0x12, 0x01, 'm'};
    memcpy(four + n, name, sizeof(name));
    n += sizeof(name);
    for (int i = 0; i < 4; i++) {
        four[n++] = 0x12;
        four[n++] = 2;
        four[n++] = 0x10;
        four[n++] = (uint8_t)(i + 1);
    }
    four[lenpos] = (uint8_t)(n - 2);
    assert_int_equal(decode_str(four, n, err, sizeof(err)), REMOTE_ERR_LIMIT);
    assert_non_null(strstr(err, "limit of 3"));
    /* same with 3 samples is fine; the 4th timestamp going back is not */
    four[lenpos] = (uint8_t)(n - 2 - 4);
    assert_int_equal(decode_str(four, n - 4, err, sizeof(err)), REMOTE_OK);
    four[n - 4 - 1] = 1; /* third sample's timestamp 3 -> 1 */
    assert_int_equal(decode_str(four, n - 4, err, sizeof(err)), REMOTE_ERR_INVALID);
    assert_non_null(strstr(err, "out of order"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_protobuf_c),
        cmocka_unit_test(test_truncation_at_every_offset),
        cmocka_unit_test(test_random_mutations),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
