/* Unit tests for storage/wal_watch.c: following a WAL that wal.c writes, record by record. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/util/log.h"
#include "storage/wal.h"
#include "storage/wal_record.h"
#include "storage/wal_watch.h"

static char *tmpdir_make(void)
{
    char *t = strdup("/tmp/sluice-walwatch-XXXXXX");
    assert_non_null(mkdtemp(t));
    return t;
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char p[4096];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

typedef struct {
    uint64_t ids[64];
    char names[64][64];
    size_t nseries;
    wal_sample_t samples[256];
    size_t nsamples;
} got_t;

static int on_series(void *ud, uint64_t id, const labels_t *ls)
{
    got_t *g = ud;
    g->ids[g->nseries] = id;
    snprintf(g->names[g->nseries], sizeof(g->names[0]), "%s=%s", ls->v[0].name, ls->v[0].value);
    g->nseries++;
    return 0;
}

static int on_samples(void *ud, const wal_sample_t *s, size_t n)
{
    got_t *g = ud;
    memcpy(g->samples + g->nsamples, s, n * sizeof(*s));
    g->nsamples += n;
    return 0;
}

/* Reads everything available now into g; returns the number of records. */
static int drain(wal_watch_t *w, got_t *g)
{
    int n = 0;
    uint8_t type;
    const uint8_t *p;
    size_t len;
    wal_pos_t at;
    int rc;
    wal_record_decoder_t dec;
    wal_record_decoder_init(&dec);
    while ((rc = wal_watch_next(w, &type, &p, &len, &at)) == WAL_WATCH_RECORD) {
        if (wal_record_is_series(type))
            assert_int_equal(wal_record_decode_series(&dec, type, p, len, on_series, g), 0);
        else if (type == WAL_REC_SAMPLES)
            assert_int_equal(wal_record_decode_samples(&dec, p, len, on_samples, g), 0);
        n++;
    }
    wal_record_decoder_free(&dec);
    assert_int_equal(rc, WAL_WATCH_EOF);
    return n;
}

static void log_one(wal_t *w, uint64_t id, const char *name)
{
    label_t l = {"__name__", name};
    wal_series_t s = {.id = id, .labels = {&l, 1}};
    assert_int_equal(wal_log_series(w, &s, 1, NULL, 0), 0);
}

static void test_follows_appends_and_cuts(void **state)
{
    (void)state;
    char *dir = tmpdir_make();
    wal_t *w = wal_open(dir, NULL, NULL, 0);
    assert_non_null(w);
    wal_watch_t *ww = wal_watch_open(dir, (wal_pos_t){0, 0});
    got_t g = {0};
    assert_int_equal(drain(ww, &g), 0);

    log_one(w, 7, "a");
    double stale;
    uint64_t bits = 0x7ff0000000000002ULL;
    memcpy(&stale, &bits, 8);
    wal_sample_t s[3] = {{7, 1000, 1.5}, {9, 1000, -2}, {7, 999, stale}};
    assert_int_equal(wal_log_samples(w, s, 3, NULL, 0), 0);
    assert_int_equal(drain(ww, &g), 2);
    assert_int_equal(g.nseries, 1);
    assert_int_equal(g.ids[0], 7);
    assert_string_equal(g.names[0], "__name__=a");
    assert_int_equal(g.nsamples, 3);
    assert_int_equal(g.samples[1].series_id, 9);
    assert_int_equal(g.samples[2].t_ms, 999);
    uint64_t got_bits;
    memcpy(&got_bits, &g.samples[2].v, 8);
    assert_true(got_bits == bits); /* the stale marker's exact bits */

    /* a cut: the reader moves on to the next segment by itself */
    uint32_t seg;
    assert_int_equal(wal_cut(w, &seg, NULL, 0), 0);
    log_one(w, 8, "b");
    assert_int_equal(drain(ww, &g), 1);
    assert_string_equal(g.names[1], "__name__=b");
    assert_int_equal(wal_watch_pos(ww).segment, seg);

    /* a reader opened at a saved position resumes exactly there */
    wal_pos_t saved = wal_watch_pos(ww);
    log_one(w, 10, "c");
    wal_watch_t *w2 = wal_watch_open(dir, saved);
    got_t g2 = {0};
    assert_int_equal(drain(w2, &g2), 1);
    assert_string_equal(g2.names[0], "__name__=c");
    wal_watch_close(w2);

    wal_watch_stats_t st;
    wal_watch_get_stats(ww, &st);
    assert_int_equal(st.segments_skipped, 0);
    assert_int_equal(st.torn_tails, 0);
    wal_watch_close(ww);
    assert_int_equal(wal_close(w, NULL, 0), 0);
    rm_rf(dir);
    free(dir);
}

static void test_partial_record_in_newest_segment_waits(void **state)
{
    (void)state;
    char *dir = tmpdir_make();
    wal_t *w = wal_open(dir, NULL, NULL, 0);
    log_one(w, 1, "x");
    assert_int_equal(wal_close(w, NULL, 0), 0);
    /* a half-written record at the end of the newest segment: a write in progress */
    char path[4096];
    snprintf(path, sizeof(path), "%s/%08d.wal", dir, 1);
    int fd = open(path, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    uint8_t part[7] = {WAL_REC_SAMPLES, 0, 0, 0, 100, 0, 0};
    assert_int_equal(write(fd, part, sizeof(part)), (ssize_t)sizeof(part));
    close(fd);
    wal_watch_t *ww = wal_watch_open(dir, (wal_pos_t){1, 0});
    got_t g = {0};
    assert_int_equal(drain(ww, &g), 1);
    wal_pos_t before = wal_watch_pos(ww);
    assert_int_equal(drain(ww, &g), 0); /* still waiting, position unchanged */
    assert_int_equal(wal_watch_pos(ww).offset, before.offset);
    wal_watch_stats_t st;
    wal_watch_get_stats(ww, &st);
    assert_int_equal(st.torn_tails, 0);

    /* once a later segment exists, the same bytes are a torn tail: skipped, reader goes on */
    w = wal_open(dir, NULL, NULL, 0); /* starts segment 2 */
    log_one(w, 2, "y");
    assert_int_equal(drain(ww, &g), 1);
    assert_string_equal(g.names[1], "__name__=y");
    wal_watch_get_stats(ww, &st);
    assert_int_equal(st.torn_tails, 1);
    wal_watch_close(ww);
    assert_int_equal(wal_close(w, NULL, 0), 0);
    rm_rf(dir);
    free(dir);
}

static void test_missing_segments_are_skipped_and_counted(void **state)
{
    (void)state;
    char *dir = tmpdir_make();
    wal_t *w = wal_open(dir, NULL, NULL, 0);
    uint32_t seg;
    log_one(w, 1, "s1");
    assert_int_equal(wal_cut(w, &seg, NULL, 0), 0);
    log_one(w, 2, "s2");
    assert_int_equal(wal_cut(w, &seg, NULL, 0), 0);
    log_one(w, 3, "s3");
    assert_int_equal(wal_truncate_before(w, 3, NULL, 0), 0); /* segments 1, 2 gone */
    assert_int_equal(wal_watch_next_segment(dir, 0), 3);
    assert_int_equal(wal_watch_last_segment(dir), 3);
    wal_watch_t *ww = wal_watch_open(dir, (wal_pos_t){1, 40});
    got_t g = {0};
    assert_int_equal(drain(ww, &g), 1);
    assert_string_equal(g.names[0], "__name__=s3");
    wal_watch_stats_t st;
    wal_watch_get_stats(ww, &st);
    assert_int_equal(st.segments_skipped, 2);
    wal_watch_close(ww);
    assert_int_equal(wal_close(w, NULL, 0), 0);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_follows_appends_and_cuts),
        cmocka_unit_test(test_partial_record_in_newest_segment_waits),
        cmocka_unit_test(test_missing_segments_are_skipped_and_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
