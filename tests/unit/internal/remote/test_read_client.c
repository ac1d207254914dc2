/* Unit tests for internal/remote/read_client.c: both response decoders on bytes built here with
 * protobuf-c and storage/chunk_xor (sorting, joining a series split over frames, duplicate
 * timestamps), every malformed input we can think of (bad CRC, truncated frame, bad snappy,
 * non-XOR chunk, a chunk claiming more samples than it holds, duplicate label names), the bounds
 * (samples, declared snappy length, body size), target spec errors, and an unreachable store. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal/proto/remote.pb-c.h"
#include "internal/remote/read_client.h"
#include "internal/util/buf.h"
#include "internal/util/crc32c.h"
#include "internal/util/log.h"
#include "internal/util/varint.h"
#include "storage/chunk_xor.h"

/* ---- builders -------------------------------------------------------------------------------- */

static Prometheus__Label lab[8];
static Prometheus__Label *labp[8];

static void set_labels(size_t n, const char *const *kv)
{
    for (size_t i = 0; i < n; i++) {
        prometheus__label__init(&lab[i]);
        lab[i].name = (char *)kv[2 * i];
        lab[i].value = (char *)kv[2 * i + 1];
        labp[i] = &lab[i];
    }
}

/* A SAMPLES body: one series per call of add; snappy-compressed ReadResponse. */
static void samples_body(buf_t *out, size_t nseries, const char *const *const *kvs, const size_t *nl,
                         const int64_t *const *ts, const double *const *vs, const size_t *ns)
{
    Prometheus__TimeSeries *tsv = calloc(nseries, sizeof(*tsv));
    Prometheus__TimeSeries **tsp = calloc(nseries, sizeof(*tsp));
    Prometheus__Label *labs = calloc(nseries * 8, sizeof(*labs));
    Prometheus__Label **labps = calloc(nseries * 8, sizeof(*labps));
    Prometheus__Sample *sm = calloc(nseries * 64, sizeof(*sm));
    Prometheus__Sample **smp = calloc(nseries * 64, sizeof(*smp));
    for (size_t s = 0; s < nseries; s++) {
        prometheus__time_series__init(&tsv[s]);
        for (size_t i = 0; i < nl[s]; i++) {
            prometheus__label__init(&labs[s * 8 + i]);
            labs[s * 8 + i].name = (char *)kvs[s][2 * i];
            labs[s * 8 + i].value = (char *)kvs[s][2 * i + 1];
            labps[s * 8 + i] = &labs[s * 8 + i];
        }
        tsv[s].labels = &labps[s * 8];
        tsv[s].n_labels = nl[s];
        for (size_t i = 0; i < ns[s]; i++) {
            prometheus__sample__init(&sm[s * 64 + i]);
            sm[s * 64 + i].timestamp = ts[s][i];
            sm[s * 64 + i].value = vs[s][i];
            smp[s * 64 + i] = &sm[s * 64 + i];
        }
        tsv[s].samples = &smp[s * 64];
        tsv[s].n_samples = ns[s];
        tsp[s] = &tsv[s];
    }
    Prometheus__QueryResult qr = PROMETHEUS__QUERY_RESULT__INIT;
    qr.timeseries = tsp;
    qr.n_timeseries = nseries;
    Prometheus__QueryResult *qrp = &qr;
    Prometheus__ReadResponse rr = PROMETHEUS__READ_RESPONSE__INIT;
    rr.results = &qrp;
    rr.n_results = 1;
    size_t len = prometheus__read_response__get_packed_size(&rr);
    uint8_t *pb = malloc(len + 1);
    prometheus__read_response__pack(&rr, pb);
    size_t clen = snappy_max_compressed_length(len);
    buf_reserve(out, clen);
    assert_int_equal(snappy_compress((char *)pb, len, out->data + out->len, &clen), SNAPPY_OK);
    out->len += clen;
    free(pb);
    free(tsv);
    free(tsp);
    free(labs);
    free(labps);
    free(sm);
    free(smp);
}

/* Appends one frame with one ChunkedSeries (labels from set_labels) holding the given chunks. */
static void frame(buf_t *out, size_t nl, const chunk_xor_appender_t *chunks, size_t nc, int encoding, bool bad_crc)
{
    Prometheus__Chunk ch[4];
    Prometheus__Chunk *chp[4];
    for (size_t i = 0; i < nc; i++) {
        prometheus__chunk__init(&ch[i]);
        ch[i].type = encoding;
        size_t len;
        const uint8_t *b = chunk_xor_bytes(&chunks[i], &len);
        ch[i].data.data = (uint8_t *)b;
        ch[i].data.len = len;
        chp[i] = &ch[i];
    }
    Prometheus__ChunkedSeries cs = PROMETHEUS__CHUNKED_SERIES__INIT;
    cs.labels = labp;
    cs.n_labels = nl;
    cs.chunks = chp;
    cs.n_chunks = nc;
    Prometheus__ChunkedSeries *csp = &cs;
    Prometheus__ChunkedReadResponse cr = PROMETHEUS__CHUNKED_READ_RESPONSE__INIT;
    cr.chunked_series = &csp;
    cr.n_chunked_series = 1;
    size_t len = prometheus__chunked_read_response__get_packed_size(&cr);
    uint8_t *pb = malloc(len + 1);
    prometheus__chunked_read_response__pack(&cr, pb);
    varint_put(out, len);
    uint32_t crc = crc32c(pb, len) ^ (bad_crc ? 1 : 0);
    uint8_t be[4] = {crc >> 24, crc >> 16, crc >> 8, crc};
    buf_append(out, be, 4);
    buf_append(out, pb, len);
    free(pb);
}

static void chunk_of(chunk_xor_appender_t *c, int64_t from, int64_t step, size_t n, double base)
{
    assert_int_equal(chunk_xor_appender_init(c), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(chunk_xor_append(c, from + (int64_t)i * step, base + (double)i), 0);
}

static int decode(const buf_t *b, bool streamed, size_t max_bytes, uint64_t max_samples, arena_t *a,
                  remote_read_result_t *out, char *err)
{
    return remote_read__decode((const uint8_t *)b->data, b->len, streamed, max_bytes, max_samples, a, out, err, 256);
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_samples_sorted_and_deduped(void **state)
{
    const char *const s0[] = {"job", "b", "__name__", "up"};
    const char *const s1[] = {"__name__", "up", "job", "a", "empty", ""};
    const char *const *kvs[] = {s0, s1};
    size_t nl[] = {2, 3};
    int64_t t0[] = {3000, 1000, 2000, 1000};
    double v0[] = {3, 1, 2, 1};
    int64_t t1[] = {5000};
    double v1[] = {9};
    const int64_t *ts[] = {t0, t1};
    const double *vs[] = {v0, v1};
    size_t ns[] = {4, 1};
    buf_t b = BUF_INIT;
    samples_body(&b, 2, kvs, nl, ts, vs, ns);
    arena_t *a = arena_create(0);
    remote_read_result_t r;
    char err[256];
    assert_int_equal(decode(&b, false, 1 << 20, 0, a, &r, err), REMOTE_READ_OK);
    assert_int_equal(r.n, 2);
    assert_false(r.streamed);
    /* sorted by labels: job="a" first; the empty label is dropped */
    assert_int_equal(r.series[0].labels.n, 2);
    assert_string_equal(labels_get(&r.series[0].labels, "job"), "a");
    assert_string_equal(r.series[0].labels.v[0].name, "__name__");
    assert_int_equal(r.series[1].n, 3);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(r.series[1].samples[i].t, (int64_t)(i + 1) * 1000);
    /* the sample bound */
    assert_int_equal(decode(&b, false, 1 << 20, 4, a, &r, err), REMOTE_READ_ERR_LIMIT);
    assert_non_null(strstr(err, "more than 4 samples"));
    /* the declared decompressed length is checked before anything is allocated */
    assert_int_equal(decode(&b, false, 16, 0, a, &r, err), REMOTE_READ_ERR_LIMIT);
    /* garbage */
    buf_t g = BUF_INIT;
    buf_puts(&g, "\xff\xff\xff\xff\xff\x0fnot snappy");
    assert_int_equal(decode(&g, false, 1 << 20, 0, a, &r, err), REMOTE_READ_ERR_BAD_RESPONSE);
    buf_free(&g);
    buf_free(&b);
    arena_destroy(a);
}

static void test_streamed_split_series(void **state)
{
    const char *const kv[] = {"__name__", "x", "job", "j"};
    set_labels(2, kv);
    chunk_xor_appender_t c[3];
    chunk_of(&c[0], 1000, 1000, 120, 0);
    chunk_of(&c[1], 121000, 1000, 10, 120);
    chunk_of(&c[2], 131000, 1000, 5, 130);
    buf_t b = BUF_INIT;
    frame(&b, 2, &c[1], 2, PROMETHEUS__CHUNK__ENCODING__XOR, false); /* the later chunks first */
    frame(&b, 2, &c[0], 1, PROMETHEUS__CHUNK__ENCODING__XOR, false);
    arena_t *a = arena_create(0);
    remote_read_result_t r;
    char err[256];
    assert_int_equal(decode(&b, true, 1 << 20, 0, a, &r, err), REMOTE_READ_OK);
    assert_true(r.streamed);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.series[0].n, 135);
    for (size_t i = 0; i < 135; i++) {
        assert_int_equal(r.series[0].samples[i].t, 1000 + (int64_t)i * 1000);
        assert_true(r.series[0].samples[i].v == (double)i);
    }
    assert_int_equal(decode(&b, true, 1 << 20, 100, a, &r, err), REMOTE_READ_ERR_LIMIT);
    assert_int_equal(decode(&b, true, 10, 0, a, &r, err), REMOTE_READ_ERR_LIMIT);

    /* a truncated stream */
    b.len -= 3;
    assert_int_equal(decode(&b, true, 1 << 20, 0, a, &r, err), REMOTE_READ_ERR_BAD_RESPONSE);
    /* a bad checksum */
    buf_reset(&b);
    frame(&b, 2, &c[0], 1, PROMETHEUS__CHUNK__ENCODING__XOR, true);
    assert_int_equal(decode(&b, true, 1 << 20, 0, a, &r, err), REMOTE_READ_ERR_BAD_RESPONSE);
    assert_non_null(strstr(err, "checksum"));
    /* a histogram chunk */
    buf_reset(&b);
    frame(&b, 2, &c[0], 1, PROMETHEUS__CHUNK__ENCODING__HISTOGRAM, false);
    assert_int_equal(decode(&b, true, 1 << 20, 0, a, &r, err), REMOTE_READ_ERR_BAD_RESPONSE);
    /* a chunk whose header claims more samples than its bytes hold */
    c[2].bytes[1] = 200;
    buf_reset(&b);
    frame(&b, 2, &c[2], 1, PROMETHEUS__CHUNK__ENCODING__XOR, false);
    assert_int_equal(decode(&b, true, 1 << 20, 0, a, &r, err), REMOTE_READ_ERR_BAD_RESPONSE);
    /* duplicate label names */
    const char *const dup[] = {"__name__", "x", "__name__", "y"};
    set_labels(2, dup);
    buf_reset(&b);
    frame(&b, 2, &c[0], 1, PROMETHEUS__CHUNK__ENCODING__XOR, false);
    assert_int_equal(decode(&b, true, 1 << 20, 0, a, &r, err), REMOTE_READ_ERR_BAD_RESPONSE);
    /* random bytes never crash */
    srand(3);
    for (int k = 0; k < 2000; k++) {
        buf_reset(&b);
        size_t n = (size_t)(rand() % 64);
        for (size_t i = 0; i < n; i++)
            buf_putc(&b, (char)rand());
        (void)decode(&b, k & 1, 1 << 20, 1000, a, &r, err);
    }
    for (int i = 0; i < 3; i++)
        chunk_xor_appender_free(&c[i]);
    buf_free(&b);
    arena_destroy(a);
}

static void test_spec_errors(void **state)
{
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"", "empty"},
        {"   ", "empty"},
        {"ftp://x/api/v1/read", ""},
        {"http://127.0.0.1:9090/api/v1/read nokey", "key=value"},
        {"http://127.0.0.1:9090/api/v1/read frobnicate=1", "unknown remote-read option"},
        {"http://127.0.0.1:9090/api/v1/read header=NoColon", "Name:value"},
        {"http://127.0.0.1:9090/api/v1/read basic-auth-password=x", "needs basic-auth-username"},
        {"http://127.0.0.1:9090/api/v1/read basic-auth-username=u bearer-token-file=/t", "exclusive"},
        {"http://127.0.0.1:9090/api/v1/read response-type=json", "streamed or samples"},
        {"http://127.0.0.1:9090/api/v1/read basic-auth-username=u basic-auth-password-file=/nonexistent/pw",
         "cannot read"},
        /* TLS: the keys remote write takes, checked (files loaded) when the client is made */
        {"http://127.0.0.1:9090/api/v1/read tls-ca-file=/ca.crt", "tls-* options need an https:// URL"},
        {"https://127.0.0.1:9090/api/v1/read tls-ca-file=/nonexistent/rr-ca.crt", "/nonexistent/rr-ca.crt"},
        {"https://127.0.0.1:9090/api/v1/read tls-cert-file=/x.crt", "key file"},
        {"https://127.0.0.1:9090/api/v1/read tls-insecure-skip-verify=yes", "true or false"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "";
        remote_read_client_opts_t o = {.spec = bad[i].spec};
        remote_read_client_t *c = remote_read_client_new(&o, err, sizeof(err));
        if (c)
            fail_msg("spec %s accepted", bad[i].spec);
        if (!strstr(err, bad[i].msg))
            fail_msg("spec %s: %s", bad[i].spec, err);
    }
    char err[256];
    remote_read_client_opts_t o = {
        .spec = "http://127.0.0.1:9090/api/v1/read header=X-Scope-OrgID:t1 basic-auth-username=u "
                "basic-auth-password=p response-type=samples"};
    remote_read_client_t *c = remote_read_client_new(&o, err, sizeof(err));
    assert_non_null(c);
    assert_string_equal(remote_read_client_name(c), "127.0.0.1:9090");
    remote_read_client_free(c);
}

/* --remote-read.tls-* defaults apply to https:// targets only, and a target's tls-*= options
 * override them (an empty value clears one). */
static void test_tls_defaults(void **state)
{
    (void)state;
    char err[512] = "";
    const tls_client_options_t bad_ca = {.ca_file = "/nonexistent/default-ca.crt"};
    remote_read_client_opts_t o = {.spec = "https://127.0.0.1:9090/api/v1/read", .tls = &bad_ca};
    assert_null(remote_read_client_new(&o, err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/default-ca.crt"));
    /* a plain-http target ignores the defaults */
    o.spec = "http://127.0.0.1:9090/api/v1/read";
    remote_read_client_t *c = remote_read_client_new(&o, err, sizeof(err));
    assert_non_null(c);
    remote_read_client_free(c);
    /* the target's empty tls-ca-file= means the system store instead of the default */
    o.spec = "https://127.0.0.1:9090/api/v1/read tls-ca-file= tls-server-name=prom.example";
    c = remote_read_client_new(&o, err, sizeof(err));
    assert_non_null(c);
    remote_read_client_free(c);
    /* and a client certificate given by default can be dropped for one target */
    const tls_client_options_t bad_cert = {.cert_file = "/nonexistent/client.crt", .key_file = "/nonexistent/k"};
    o = (remote_read_client_opts_t){.spec = "https://127.0.0.1:9090/api/v1/read", .tls = &bad_cert};
    assert_null(remote_read_client_new(&o, err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/client.crt"));
    o.spec = "https://127.0.0.1:9090/api/v1/read tls-cert-file= tls-key-file=";
    c = remote_read_client_new(&o, err, sizeof(err));
    assert_non_null(c);
    remote_read_client_free(c);
}

static void test_unreachable(void **state)
{
    /* A port nobody listens on: bind one, learn it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    char spec[128], err[512];
    snprintf(spec, sizeof(spec), "http://127.0.0.1:%d/api/v1/read name=gone", ntohs(sa.sin_port));
    remote_read_client_opts_t o = {.spec = spec, .timeout_ms = 2000};
    remote_read_client_t *c = remote_read_client_new(&o, err, sizeof(err));
    assert_non_null(c);
    matcher_t *m = matcher_new(MATCHER_EQ, "__name__", "up", err, sizeof(err));
    arena_t *a = arena_create(0);
    remote_read_result_t r;
    assert_int_equal(
        remote_read_client_query(c, (const matcher_t *const *)&m, 1, 0, 1000, NULL, a, &r, err, sizeof(err)),
        REMOTE_READ_ERR_UNAVAILABLE);
    assert_non_null(strstr(err, "gone"));
    arena_destroy(a);
    matcher_free(m);
    remote_read_client_free(c);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_samples_sorted_and_deduped),
        cmocka_unit_test(test_streamed_split_series),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_tls_defaults),
        cmocka_unit_test(test_unreachable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
