/* Unit tests for storage/wal_record.c, the WAL byte format both wal.c (replay) and wal_watch.c (the
 * forwarder's tail) read through: encoders and decoders round trip, malformed payloads deliver
 * nothing, and the frame reader's outcomes on a file (end, short, bad header, bad CRC, a garbage
 * length that must not allocate). Replay's repair on top of these is in test_wal.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "storage/wal_record.h"

typedef struct {
    uint64_t ids[8];
    char text[8][128];
    size_t nseries;
    wal_sample_t samples[16];
    size_t nsamples, calls;
    int stop_after; /* callback returns nonzero on this call (1-based); 0 = never */
} got_t;

static int on_series(void *ud, uint64_t id, const labels_t *ls)
{
    got_t *g = ud;
    g->calls++;
    char *t = g->text[g->nseries];
    t[0] = 0;
    for (size_t i = 0; i < ls->n; i++)
        snprintf(t + strlen(t), 128 - strlen(t), "%s%s=%s", i ? "," : "", ls->v[i].name, ls->v[i].value);
    g->ids[g->nseries++] = id;
    return g->stop_after && (int)g->calls == g->stop_after;
}

static int on_samples(void *ud, const wal_sample_t *s, size_t n)
{
    got_t *g = ud;
    g->calls++;
    memcpy(g->samples + g->nsamples, s, n * sizeof(*s));
    g->nsamples += n;
    return g->stop_after && (int)g->calls == g->stop_after;
}

/* The payload of the one record at the start of b. */
static const uint8_t *payload_of(const buf_t *b, size_t *len)
{
    const uint8_t *h = (const uint8_t *)b->data;
    *len = (size_t)h[4] | (size_t)h[5] << 8 | (size_t)h[6] << 16 | (size_t)h[7] << 24;
    return h + WAL_REC_HEADER_BYTES;
}

static void test_roundtrip(void **state)
{
    (void)state;
    label_t a[] = {{"__name__", "up"}, {"job", "flink"}};
    label_t b[] = {{"__name__", ""}};
    wal_series_t s[] = {{.id = 7, .labels = {a, 2}}, {.id = UINT64_MAX, .labels = {b, 1}}};
    buf_t enc = BUF_INIT;
    uint64_t nrec = 0;
    assert_int_equal(wal_record_encode_series(&enc, s, 2, &nrec), WAL_OK);
    assert_int_equal(nrec, 1);
    wal_record_decoder_t d;
    wal_record_decoder_init(&d);
    got_t g = {0};
    size_t len;
    const uint8_t *p = payload_of(&enc, &len);
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES_SHARED, p, len, on_series, &g), WAL_OK);
    assert_int_equal(g.nseries, 2);
    assert_int_equal(g.ids[0], 7);
    assert_string_equal(g.text[0], "__name__=up,job=flink");
    assert_true(g.ids[1] == UINT64_MAX);
    assert_string_equal(g.text[1], "__name__=");

    double stale;
    uint64_t stale_bits = 0x7ff0000000000002ULL;
    memcpy(&stale, &stale_bits, 8);
    wal_sample_t in[] = {{5, 1000, 1.5}, {3, -20, -0.0}, {UINT64_MAX, INT64_MIN, stale}, {0, INT64_MAX, INFINITY}};
    buf_reset(&enc);
    nrec = 0;
    wal_record_encode_samples(&enc, in, 4, &nrec);
    assert_int_equal(nrec, 1);
    p = payload_of(&enc, &len);
    assert_int_equal(wal_record_decode_samples(&d, p, len, on_samples, &g), WAL_OK);
    assert_int_equal(g.nsamples, 4);
    for (size_t i = 0; i < 4; i++) {
        assert_true(g.samples[i].series_id == in[i].series_id);
        assert_true(g.samples[i].t_ms == in[i].t_ms);
        assert_memory_equal(&g.samples[i].v, &in[i].v, 8);
    }
    wal_record_decoder_free(&d);
    buf_free(&enc);
}

static void test_malformed_payloads_deliver_nothing(void **state)
{
    (void)state;
    wal_record_decoder_t d;
    wal_record_decoder_init(&d);
    got_t g = {0};
    static const uint8_t past_end[] = {1, 0, 0, 0, 5, 1, 3, 'a', 'b'};      /* label name runs past the end */
    static const uint8_t nul[] = {1, 0, 0, 0, 5, 1, 1, 0, 1, 'v'};          /* a NUL in a label name */
    static const uint8_t extra[] = {1, 0, 0, 0, 5, 1, 1, 'n', 1, 'v', 9};   /* a byte left over */
    static const uint8_t two_of_one[] = {2, 0, 0, 0, 5, 1, 1, 'n', 1, 'v'}; /* second series missing */
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES, past_end, sizeof past_end, on_series, &g), WAL_ERR_CORRUPT);
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES, nul, sizeof nul, on_series, &g), WAL_ERR_CORRUPT);
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES, extra, sizeof extra, on_series, &g), WAL_ERR_CORRUPT);
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES, two_of_one, sizeof two_of_one, on_series, &g), WAL_ERR_CORRUPT);
    /* SERIES_SHARED: "as the previous series" in the first series, or for a label the previous
     * one does not have; a length past the end */
    static const uint8_t first_shared[] = {1, 0, 0, 0, 5, 1, 0, 2, 'v'};
    static const uint8_t beyond_prev[] = {2, 0, 0, 0, 5, 1, 2, 'n', 2, 'v', 6, 2, 2, 'm', 2, 'w', 0, 0};
    static const uint8_t shared_past_end[] = {1, 0, 0, 0, 5, 1, 2, 'n', 4, 'v'};
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES_SHARED, first_shared, sizeof first_shared, on_series, &g),
                     WAL_ERR_CORRUPT);
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES_SHARED, beyond_prev, sizeof beyond_prev, on_series, &g),
                     WAL_ERR_CORRUPT);
    assert_int_equal(
        wal_record_decode_series(&d, WAL_REC_SERIES_SHARED, shared_past_end, sizeof shared_past_end, on_series, &g),
        WAL_ERR_CORRUPT);
    /* a type that holds no series */
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SAMPLES, two_of_one, sizeof two_of_one, on_series, &g),
                     WAL_ERR_CORRUPT);
    static const uint8_t cut[] = {1, 0, 0, 0, 5, 2, 0, 0, 0, 0, 0, 0}; /* value cut short */
    static const uint8_t none[] = {0, 0, 0, 0};
    static const uint8_t overlong[] = {1,    0,    0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0x02, 0, 0, 0,    0,    0,    0,    0,    0,    0}; /* id past 64 bits */
    assert_int_equal(wal_record_decode_samples(&d, cut, sizeof cut, on_samples, &g), WAL_ERR_CORRUPT);
    assert_int_equal(wal_record_decode_samples(&d, none, sizeof none, on_samples, &g), WAL_ERR_CORRUPT);
    assert_int_equal(wal_record_decode_samples(&d, overlong, sizeof overlong, on_samples, &g), WAL_ERR_CORRUPT);
    assert_int_equal(g.calls, 0);
    wal_record_decoder_free(&d);
}

/* A SERIES record as versions before SERIES_SHARED wrote it (every string spelt out) still
 * decodes; SERIES_SHARED writes a string the previous series has at the same place as one byte,
 * whatever the previous series' length, and the decoder gives back every label. */
static void test_series_strings_shared_with_previous(void **state)
{
    (void)state;
    wal_record_decoder_t d;
    wal_record_decoder_init(&d);
    got_t g = {0};
    /* type 1: two series, {n=v} and {n=w, x=y} */
    static const uint8_t v1[] = {2, 0, 0, 0, 5, 1, 1, 'n', 1, 'v', 6, 2, 1, 'n', 1, 'w', 1, 'x', 1, 'y'};
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES, v1, sizeof v1, on_series, &g), WAL_OK);
    assert_int_equal(g.nseries, 2);
    assert_string_equal(g.text[0], "n=v");
    assert_string_equal(g.text[1], "n=w,x=y");

    /* neighbours sharing strings at the same place: interned (one pointer) and equal copies;
     * one with more labels, one with fewer, one with the same name at another place */
    char host1[] = "tm-1", host2[] = "tm-1";
    label_t a[] = {{"__name__", "m1"}, {"host", host1}, {"task", "Source: kafka"}};
    label_t b[] = {{"__name__", "m2"}, {"host", host2}, {"task", "Source: kafka"}, {"z", "1"}};
    label_t c[] = {{"__name__", "m2"}, {"host", host1}};
    label_t e[] = {{"host", "m2"}, {"task", "tm-1"}, {"z", "1"}};
    wal_series_t s[] = {{.id = 1, .labels = {a, 3}}, {.id = 2, .labels = {b, 4}}, {.id = 3, .labels = {c, 2}},
                        {.id = 4, .labels = {e, 3}}};
    buf_t enc = BUF_INIT;
    uint64_t nrec = 0;
    assert_int_equal(wal_record_encode_series(&enc, s, 4, &nrec), WAL_OK);
    assert_int_equal(nrec, 1);
    assert_int_equal(((const uint8_t *)enc.data)[0], WAL_REC_SERIES_SHARED);
    size_t len;
    const uint8_t *p = payload_of(&enc, &len);
    /* count 4, then id and label count 2 each, a string 1 byte when shared, else length + 1 and
     * its bytes: a 2 + 9+3+5+5+5+14; b 2 + 1+3+1+1+1+1+2+2 (host2 is a copy); c 2 + 1+1+1+1;
     * e 2 + 5+1+5+1+2+2 (by place: its host's value and task's value are c's values there) */
    assert_int_equal(len, 4 + 43 + 14 + 6 + 18);
    memset(&g, 0, sizeof(g));
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES_SHARED, p, len, on_series, &g), WAL_OK);
    assert_int_equal(g.nseries, 4);
    assert_string_equal(g.text[0], "__name__=m1,host=tm-1,task=Source: kafka");
    assert_string_equal(g.text[1], "__name__=m2,host=tm-1,task=Source: kafka,z=1");
    assert_string_equal(g.text[2], "__name__=m2,host=tm-1");
    assert_string_equal(g.text[3], "host=m2,task=tm-1,z=1");
    for (int i = 0; i < 4; i++)
        assert_int_equal(g.ids[i], i + 1);
    wal_record_decoder_free(&d);
    buf_free(&enc);
}

static void test_callback_stops_decoding(void **state)
{
    (void)state;
    label_t l = {"a", "b"};
    wal_series_t s[] = {{.id = 1, .labels = {&l, 1}}, {.id = 2, .labels = {&l, 1}}, {.id = 3, .labels = {&l, 1}}};
    buf_t enc = BUF_INIT;
    uint64_t nrec = 0;
    assert_int_equal(wal_record_encode_series(&enc, s, 3, &nrec), WAL_OK);
    wal_record_decoder_t d;
    wal_record_decoder_init(&d);
    got_t g = {.stop_after = 2};
    size_t len;
    const uint8_t *p = payload_of(&enc, &len);
    assert_int_equal(wal_record_decode_series(&d, WAL_REC_SERIES_SHARED, p, len, on_series, &g), WAL_ERR_ABORTED);
    assert_int_equal(g.calls, 2);
    wal_record_decoder_free(&d);
    buf_free(&enc);
}

/* ---- the frame reader on a file --------------------------------------------------------------- */

/* Creates the file named by the mkstemp template path. */
static void tmp_file(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

/* Overwrites path with n bytes of p; returns an fd open on it. */
static int file_with(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, p, n), (ssize_t)n);
    return fd;
}

static void test_segment_header(void **state)
{
    (void)state;
    char path[] = "/tmp/sluice-walrec-XXXXXX";
    tmp_file(path);
    uint8_t h[WAL_SEG_HEADER_BYTES];
    wal_record_seg_header(h, 42);
    assert_memory_equal(h, "SLWL\x01\x00\x00\x00\x2a\x00\x00\x00", 12);
    const char *why = "";
    char err[128];
    int fd = file_with(path, h, sizeof h);
    assert_int_equal(wal_record_read_seg_header(fd, 42, &why, err, sizeof err), WAL_RECORD_OK);
    assert_int_equal(wal_record_read_seg_header(fd, 43, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "bad segment header");
    close(fd);
    fd = file_with(path, h, 9);
    assert_int_equal(wal_record_read_seg_header(fd, 42, &why, err, sizeof err), WAL_RECORD_TORN);
    close(fd);
    static const uint8_t zero[WAL_SEG_HEADER_BYTES];
    fd = file_with(path, zero, sizeof zero);
    assert_int_equal(wal_record_read_seg_header(fd, 42, &why, err, sizeof err), WAL_RECORD_TORN);
    close(fd);
    h[4] = 2;
    fd = file_with(path, h, sizeof h);
    assert_int_equal(wal_record_read_seg_header(fd, 42, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "unsupported segment version");
    close(fd);
    unlink(path);
}

static void test_read_records(void **state)
{
    (void)state;
    char path[] = "/tmp/sluice-walrec-XXXXXX";
    tmp_file(path);
    buf_t enc = BUF_INIT;
    uint8_t h[WAL_SEG_HEADER_BYTES];
    wal_record_seg_header(h, 1);
    buf_append(&enc, h, sizeof h);
    wal_record_encode_blob(&enc, 9, "hello", 5);
    size_t first_end = enc.len;
    wal_sample_t smp = {1, 2, 3.0};
    uint64_t nrec = 0;
    wal_record_encode_samples(&enc, &smp, 1, &nrec);

    buf_t payload = BUF_INIT;
    wal_record_t rec;
    const char *why = "";
    char err[128];
    int fd = file_with(path, enc.data, enc.len);
    assert_int_equal(wal_record_read(fd, WAL_SEG_HEADER_BYTES, &payload, &rec, &why, err, sizeof err), WAL_RECORD_OK);
    assert_int_equal(rec.type, WAL_REC_BLOB);
    assert_int_equal(rec.len, 6);
    assert_memory_equal(rec.payload, "\x09hello", 6);
    assert_int_equal(wal_record_read(fd, first_end, &payload, &rec, &why, err, sizeof err), WAL_RECORD_OK);
    assert_int_equal(rec.type, WAL_REC_SAMPLES);
    assert_int_equal(wal_record_read(fd, enc.len, &payload, &rec, &why, err, sizeof err), WAL_RECORD_END);
    close(fd);

    /* cut inside the second record's header, then inside its payload */
    fd = file_with(path, enc.data, first_end + 5);
    assert_int_equal(wal_record_read(fd, first_end, &payload, &rec, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "short record header");
    close(fd);
    fd = file_with(path, enc.data, enc.len - 1);
    assert_int_equal(wal_record_read(fd, first_end, &payload, &rec, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "short record payload");
    close(fd);

    /* one flipped payload bit; a nonzero reserved byte; a garbage length far past the file */
    enc.data[WAL_SEG_HEADER_BYTES + WAL_REC_HEADER_BYTES + 2] ^= 1;
    fd = file_with(path, enc.data, enc.len);
    assert_int_equal(wal_record_read(fd, WAL_SEG_HEADER_BYTES, &payload, &rec, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "record checksum mismatch");
    close(fd);
    enc.data[WAL_SEG_HEADER_BYTES + 2] = 1;
    fd = file_with(path, enc.data, enc.len);
    assert_int_equal(wal_record_read(fd, WAL_SEG_HEADER_BYTES, &payload, &rec, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "bad record header");
    close(fd);
    enc.data[WAL_SEG_HEADER_BYTES + 2] = 0;
    enc.data[WAL_SEG_HEADER_BYTES + 7] = 0x03; /* 48 MiB + a little */
    buf_free(&payload);
    fd = file_with(path, enc.data, enc.len);
    assert_int_equal(wal_record_read(fd, WAL_SEG_HEADER_BYTES, &payload, &rec, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "short record payload");
    assert_true(payload.cap < 4096);
    enc.data[WAL_SEG_HEADER_BYTES + 7] = 0x7f; /* past WAL_MAX_RECORD_BYTES */
    close(fd);
    fd = file_with(path, enc.data, enc.len);
    assert_int_equal(wal_record_read(fd, WAL_SEG_HEADER_BYTES, &payload, &rec, &why, err, sizeof err), WAL_RECORD_BAD);
    assert_string_equal(why, "bad record length");
    close(fd);
    buf_free(&payload);
    buf_free(&enc);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_malformed_payloads_deliver_nothing),
        cmocka_unit_test(test_series_strings_shared_with_previous),
        cmocka_unit_test(test_callback_stops_decoding),
        cmocka_unit_test(test_segment_header),
        cmocka_unit_test(test_read_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
