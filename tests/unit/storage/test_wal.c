/* Unit tests for storage/wal.c: round trips, concurrency, group commit, segment roll, torn and
 * corrupt tails, garbage lengths, checkpoint cut/truncate, write errors (RLIMIT_FSIZE). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal/util/crc32c.h"
#include "internal/util/log.h"
#include "storage/wal.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static char *tmpdir_make(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/sluice-wal-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void path_of(char *out, size_t n, const char *dir, uint32_t seg, const char *suffix)
{
    snprintf(out, n, "%s/%08u.wal%s", dir, seg, suffix);
}

static off_t file_size(const char *p)
{
    struct stat sb;
    if (stat(p, &sb) != 0)
        return -1;
    return sb.st_size;
}

static bool file_exists(const char *p)
{
    return file_size(p) >= 0;
}

static size_t count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0, sl = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l > sl && !strcmp(e->d_name + l - sl, suffix))
            n++;
    }
    closedir(d);
    return n;
}

static void *read_file(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_file(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* Replay events, flattened to compare against what was written. */
enum { EV_SERIES = 1, EV_SAMPLE, EV_BLOB };
typedef struct {
    int kind;
    uint64_t id;
    int64_t t;
    uint64_t vbits;
    char *text; /* series: "n=v,n=v"; blob: bytes */
} ev_t;

typedef struct {
    ev_t *v;
    size_t n, cap;
    int abort_after_samples; /* >0: fail the on_samples call after this many samples */
} evs_t;

static void evs_push(evs_t *e, ev_t x)
{
    if (e->n == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->v = realloc(e->v, e->cap * sizeof *e->v);
        assert_non_null(e->v);
    }
    e->v[e->n++] = x;
}

static void evs_free(evs_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i].text);
    free(e->v);
    memset(e, 0, sizeof *e);
}

static char *labels_text(const labels_t *ls)
{
    size_t n = 1;
    for (size_t i = 0; i < ls->n; i++)
        n += strlen(ls->v[i].name) + strlen(ls->v[i].value) + 2;
    char *s = malloc(n);
    assert_non_null(s);
    s[0] = 0;
    for (size_t i = 0; i < ls->n; i++) {
        if (i)
            strcat(s, ",");
        strcat(s, ls->v[i].name);
        strcat(s, "=");
        strcat(s, ls->v[i].value);
    }
    return s;
}

static int cb_series(void *ud, uint64_t id, const labels_t *ls)
{
    evs_push(ud, (ev_t){.kind = EV_SERIES, .id = id, .text = labels_text(ls)});
    return 0;
}

static int cb_samples(void *ud, const wal_sample_t *s, size_t n)
{
    evs_t *e = ud;
    for (size_t i = 0; i < n; i++) {
        if (e->abort_after_samples && (int)e->n >= e->abort_after_samples)
            return 1;
        uint64_t vb;
        memcpy(&vb, &s[i].v, 8);
        evs_push(e, (ev_t){.kind = EV_SAMPLE, .id = s[i].series_id, .t = s[i].t_ms, .vbits = vb});
    }
    return 0;
}

static int cb_blob(void *ud, uint8_t type, const void *data, size_t len)
{
    char *b = malloc(len + 1);
    assert_non_null(b);
    memcpy(b, data, len);
    b[len] = 0;
    evs_push(ud, (ev_t){.kind = EV_BLOB, .t = type, .vbits = len, .text = b});
    return 0;
}

static const wal_replay_cb_t all_cb = {cb_series, cb_samples, cb_blob};

static void replay_into(const char *dir, uint32_t first, evs_t *e, wal_replay_stats_t *st)
{
    char err[256] = "";
    int rc = wal_replay(dir, first, &all_cb, e, st, err, sizeof err);
    if (rc != 0)
        fail_msg("replay: %d %s", rc, err);
}

static wal_t *open_wal(const char *dir, wal_fsync_mode_t mode, uint32_t interval_ms, uint64_t segmax)
{
    wal_options_t o;
    wal_options_default(&o);
    o.fsync_mode = mode;
    if (interval_ms)
        o.fsync_interval_ms = interval_ms;
    if (segmax)
        o.segment_max_bytes = segmax;
    char err[256] = "";
    wal_t *w = wal_open(dir, &o, err, sizeof err);
    if (!w)
        fail_msg("wal_open: %s", err);
    return w;
}

static void close_wal(wal_t *w)
{
    char err[256] = "";
    int rc = wal_close(w, err, sizeof err);
    if (rc != 0)
        fail_msg("wal_close: %s", err);
}

/* A deterministic workload: record k is a series (k % 3 == 0), a sample batch, or a blob. */
static void log_record(wal_t *w, int k)
{
    char err[256] = "";
    int rc;
    if (k % 3 == 0) {
        char val[32];
        snprintf(val, sizeof val, "job-%d", k);
        label_t lv[2] = {{"__name__", "flink_records_in"}, {"job", val}};
        wal_series_t s = {.id = (uint64_t)k, .labels = {lv, 2}};
        rc = wal_log_series(w, &s, 1, err, sizeof err);
    } else if (k % 3 == 1) {
        wal_sample_t s[3];
        for (int i = 0; i < 3; i++)
            s[i] = (wal_sample_t){.series_id = (uint64_t)(k + i), .t_ms = 1000LL * k, .v = k * 0.5 + i};
        rc = wal_log_samples(w, s, 3, err, sizeof err);
    } else {
        char b[16];
        int n = snprintf(b, sizeof b, "blob%d", k);
        rc = wal_log_blob(w, (uint8_t)(k & 0xff), b, (size_t)n, err, sizeof err);
    }
    if (rc != 0)
        fail_msg("log record %d: %s", k, err);
}

/* Number of replay events record k produces. */
static size_t record_events(int k)
{
    return k % 3 == 1 ? 3 : 1;
}

/* Checks that e holds exactly records [0, n) of the workload. */
static void check_records(const evs_t *e, int n)
{
    size_t j = 0;
    for (int k = 0; k < n; k++) {
        if (k % 3 == 0) {
            assert_true(j < e->n);
            char want[64];
            snprintf(want, sizeof want, "__name__=flink_records_in,job=job-%d", k);
            assert_int_equal(e->v[j].kind, EV_SERIES);
            assert_int_equal(e->v[j].id, (uint64_t)k);
            assert_string_equal(e->v[j].text, want);
            j++;
        } else if (k % 3 == 1) {
            for (int i = 0; i < 3; i++, j++) {
                assert_true(j < e->n);
                double v = k * 0.5 + i;
                uint64_t vb;
                memcpy(&vb, &v, 8);
                assert_int_equal(e->v[j].kind, EV_SAMPLE);
                assert_int_equal(e->v[j].id, (uint64_t)(k + i));
                assert_int_equal(e->v[j].t, 1000LL * k);
                assert_int_equal(e->v[j].vbits, vb);
            }
        } else {
            assert_true(j < e->n);
            char want[16];
            snprintf(want, sizeof want, "blob%d", k);
            assert_int_equal(e->v[j].kind, EV_BLOB);
            assert_int_equal(e->v[j].t, k & 0xff);
            assert_string_equal(e->v[j].text, want);
            j++;
        }
    }
    assert_int_equal(j, e->n);
}

/* ---- round trip ------------------------------------------------------------------------------ */

static void test_roundtrip(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    char err[256];

    label_t l1[] = {{"__name__", "up"}, {"instance", "tm-1:9249"}, {"job", ""}};
    label_t l2[] = {{"__name__", "x"}};
    wal_series_t ss[] = {
        {.id = 7, .labels = {l1, 3}}, {.id = UINT64_MAX, .labels = {l2, 1}}, {.id = 0, .labels = {NULL, 0}}};
    assert_int_equal(wal_log_series(w, ss, 3, err, sizeof err), 0);

    uint64_t stale_bits = 0x7ff0000000000002ull;
    double stale;
    memcpy(&stale, &stale_bits, 8);
    wal_sample_t s[] = {
        {7, 1700000000000, 1.5},  {UINT64_MAX, 1700000000000, stale}, {0, -5, -0.0},
        {7, INT64_MAX, INFINITY}, {1, INT64_MIN, -INFINITY},          {2, 0, 4.9e-324},
    };
    assert_int_equal(wal_log_samples(w, s, 6, err, sizeof err), 0);
    assert_int_equal(wal_log_blob(w, 9, "", 0, err, sizeof err), 0);
    assert_int_equal(wal_log_blob(w, 255, "a\0b", 3, err, sizeof err), 0);
    /* a batch larger than one record is split */
    size_t big = 65536 * 2 + 17;
    wal_sample_t *bs = malloc(big * sizeof *bs);
    for (size_t i = 0; i < big; i++)
        bs[i] = (wal_sample_t){.series_id = i % 1000, .t_ms = (int64_t)(i / 1000) * 1000, .v = (double)i};
    assert_int_equal(wal_log_samples(w, bs, big, err, sizeof err), 0);
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_int_equal(st.records_written, 2 + 3 + 2); /* series, samples, 2 blobs, 3 split */
    close_wal(w);

    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(e.n, 3 + 6 + 2 + big);
    assert_string_equal(e.v[0].text, "__name__=up,instance=tm-1:9249,job=");
    assert_int_equal(e.v[0].id, 7);
    assert_string_equal(e.v[1].text, "__name__=x");
    assert_int_equal(e.v[1].id, UINT64_MAX);
    assert_string_equal(e.v[2].text, "");
    for (int i = 0; i < 6; i++) {
        uint64_t vb;
        memcpy(&vb, &s[i].v, 8);
        assert_int_equal(e.v[3 + i].kind, EV_SAMPLE);
        assert_int_equal(e.v[3 + i].id, s[i].series_id);
        assert_int_equal(e.v[3 + i].t, s[i].t_ms);
        assert_int_equal(e.v[3 + i].vbits, vb);
    }
    assert_int_equal(e.v[9].kind, EV_BLOB);
    assert_int_equal(e.v[9].t, 9);
    assert_int_equal(e.v[9].vbits, 0);
    assert_int_equal(e.v[10].t, 255);
    assert_int_equal(e.v[10].vbits, 3);
    assert_memory_equal(e.v[10].text, "a\0b", 3);
    for (size_t i = 0; i < big; i++) {
        assert_int_equal(e.v[11 + i].id, bs[i].series_id);
        assert_int_equal(e.v[11 + i].t, bs[i].t_ms);
        uint64_t vb;
        memcpy(&vb, &bs[i].v, 8);
        assert_int_equal(e.v[11 + i].vbits, vb);
    }
    assert_int_equal(rs.records, 7);
    assert_int_equal(rs.series, 3);
    assert_int_equal(rs.samples, 6 + big);
    assert_int_equal(rs.blobs, 2);
    assert_false(rs.truncated);
    assert_false(rs.corrupt_middle);
    free(bs);
    evs_free(&e);

    /* replay is idempotent and a new open starts a new segment after the old one */
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(e.n, 3 + 6 + 2 + big);
    evs_free(&e);
    w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    wal_get_stats(w, &st);
    assert_int_equal(st.segment_current, 2);
    assert_int_equal(st.segments_on_disk, 2);
    close_wal(w);

    /* an empty directory or a missing one replays nothing, successfully */
    rm_rf(dir);
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(e.n, 0);
    assert_int_equal(rs.segments, 0);
    free(dir);
}

/* ---- concurrency ------------------------------------------------------------------------------ */

#define CT_THREADS 4

typedef struct {
    wal_t *w;
    int tid;
    int iters;
} ct_arg_t;

static void *ct_main(void *p)
{
    ct_arg_t *a = p;
    char err[256];
    for (int i = 0; i < a->iters; i++) {
        uint64_t id = (uint64_t)a->tid * 1000000 + (uint64_t)i;
        char v[32];
        snprintf(v, sizeof v, "%d-%d", a->tid, i);
        label_t l[] = {{"__name__", "m"}, {"k", v}};
        wal_series_t s = {.id = id, .labels = {l, 2}};
        if (wal_log_series(a->w, &s, 1, err, sizeof err) != 0)
            return (void *)1;
        wal_sample_t smp[2] = {{id, i * 1000, (double)i}, {id, i * 1000 + 1, -(double)i}};
        if (wal_log_samples(a->w, smp, 2, err, sizeof err) != 0)
            return (void *)1;
    }
    return NULL;
}

static void run_concurrent(wal_fsync_mode_t mode)
{
    /* ALWAYS mode pays real fsyncs: fewer iterations */
    const int CT_ITERS = mode == WAL_FSYNC_ALWAYS ? 100 : 300;
    char *dir = tmpdir_make();
    /* small segments so rolls happen while threads append */
    wal_t *w = open_wal(dir, mode, 5, 16384);
    pthread_t th[CT_THREADS];
    ct_arg_t args[CT_THREADS];
    for (int t = 0; t < CT_THREADS; t++) {
        args[t] = (ct_arg_t){w, t, CT_ITERS};
        assert_int_equal(pthread_create(&th[t], NULL, ct_main, &args[t]), 0);
    }
    for (int t = 0; t < CT_THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        assert_null(r);
    }
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_int_equal(st.records_written, CT_THREADS * CT_ITERS * 2);
    assert_int_equal(st.write_errors, 0);
    if (mode == WAL_FSYNC_ALWAYS) {
        /* every append waited for an fsync; concurrent ones may share it */
        assert_true(st.fsyncs >= 1);
        assert_true(st.fsyncs <= (uint64_t)CT_THREADS * CT_ITERS * 2 + st.segments_created);
    }
    assert_true(st.segments_created > 1);
    close_wal(w);

    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(e.n, CT_THREADS * CT_ITERS * 3);
    assert_int_equal(rs.segments, st.segments_created);
    /* per thread, events arrive in the order the thread logged them */
    int next[CT_THREADS] = {0}, phase[CT_THREADS] = {0};
    for (size_t j = 0; j < e.n; j++) {
        int t = (int)(e.v[j].id / 1000000), i = (int)(e.v[j].id % 1000000);
        assert_true(t >= 0 && t < CT_THREADS);
        assert_int_equal(i, next[t]);
        if (phase[t] == 0) {
            char want[64];
            snprintf(want, sizeof want, "__name__=m,k=%d-%d", t, i);
            assert_int_equal(e.v[j].kind, EV_SERIES);
            assert_string_equal(e.v[j].text, want);
        } else {
            assert_int_equal(e.v[j].kind, EV_SAMPLE);
            assert_int_equal(e.v[j].t, i * 1000 + (phase[t] - 1));
        }
        if (++phase[t] == 3) {
            phase[t] = 0;
            next[t]++;
        }
    }
    for (int t = 0; t < CT_THREADS; t++)
        assert_int_equal(next[t], CT_ITERS);
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

static void test_concurrent_interval(void **state)
{
    run_concurrent(WAL_FSYNC_INTERVAL);
}
static void test_concurrent_always(void **state)
{
    run_concurrent(WAL_FSYNC_ALWAYS);
}

/* ---- fsync modes ----------------------------------------------------------------------------- */

static void test_fsync_always(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_ALWAYS, 3600 * 1000, 0);
    for (int k = 0; k < 10; k++)
        log_record(w, k);
    wal_stats_t st;
    wal_get_stats(w, &st);
    /* one append at a time: each returned only after its own fsync */
    assert_int_equal(st.fsyncs, 10);
    assert_int_equal(st.records_written, 10);
    assert_int_equal(st.writes, 10);
    close_wal(w);
    rm_rf(dir);
    free(dir);
}

static void test_fsync_interval(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 3600 * 1000, 0);
    for (int k = 0; k < 10; k++)
        log_record(w, k);
    wal_stats_t st;
    wal_get_stats(w, &st);
    /* written (a process crash loses nothing), not yet fsync'd (the interval is an hour) */
    assert_int_equal(st.fsyncs, 0);
    assert_int_equal(st.records_written, 10);
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    assert_int_equal(file_size(seg), (off_t)st.segment_bytes);
    evs_t e = {0};
    replay_into(dir, 0, &e, NULL); /* readable while open */
    check_records(&e, 10);
    evs_free(&e);
    char err[256];
    assert_int_equal(wal_sync(w, err, sizeof err), 0);
    wal_get_stats(w, &st);
    assert_int_equal(st.fsyncs, 1);
    assert_int_equal(wal_sync(w, err, sizeof err), 0); /* nothing new: no fsync */
    wal_get_stats(w, &st);
    assert_int_equal(st.fsyncs, 1);
    close_wal(w);
    rm_rf(dir);
    free(dir);

    /* the background thread fsyncs by itself (wait for it: no timing threshold) */
    dir = tmpdir_make();
    w = open_wal(dir, WAL_FSYNC_INTERVAL, 10, 0);
    log_record(w, 1);
    for (;;) {
        wal_get_stats(w, &st);
        if (st.fsyncs >= 1)
            break;
        usleep(1000);
    }
    close_wal(w);
    rm_rf(dir);
    free(dir);
}

/* Interval mode: a leader that rolls a full segment does not fsync it while the appenders wait;
 * the segment is fsync'd by the next sync (background pass, wal_sync, wal_cut or wal_close). */
static void test_roll_fsync_deferred(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 3600 * 1000, 4096);
    for (int k = 0; k < 300; k++)
        log_record(w, k);
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_true(st.segments_created >= 3);
    assert_int_equal(st.fsyncs, 0); /* no roll fsync'd inline */
    char err[256];
    assert_int_equal(wal_sync(w, err, sizeof err), 0);
    wal_get_stats(w, &st);
    /* every closed segment (retired) and the current one */
    assert_int_equal(st.fsyncs, st.segments_created);
    assert_int_equal(st.fsync_errors, 0);
    assert_int_equal(wal_sync(w, err, sizeof err), 0); /* nothing new: no fsync */
    wal_get_stats(w, &st);
    assert_int_equal(st.fsyncs, st.segments_created);
    for (int k = 300; k < 600; k++)
        log_record(w, k);
    close_wal(w); /* fsyncs what rolled since, and closes their fds */
    evs_t e = {0};
    replay_into(dir, 0, &e, NULL);
    check_records(&e, 600);
    evs_free(&e);
    rm_rf(dir);
    free(dir);

    /* the background pass fsyncs retired segments and the current one by itself */
    dir = tmpdir_make();
    w = open_wal(dir, WAL_FSYNC_INTERVAL, 10, 4096);
    for (int k = 0; k < 300; k++)
        log_record(w, k);
    wal_get_stats(w, &st);
    uint64_t created = st.segments_created;
    for (;;) {
        wal_get_stats(w, &st);
        if (st.fsyncs >= created)
            break;
        usleep(1000);
    }
    assert_int_equal(st.fsync_errors, 0);
    close_wal(w);
    rm_rf(dir);
    free(dir);
}

/* ---- segments -------------------------------------------------------------------------------- */

static void test_segment_roll(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 4096);
    for (int k = 0; k < 600; k++)
        log_record(w, k);
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_true(st.segments_created >= 3);
    assert_int_equal(st.segment_current, st.segments_created);
    close_wal(w);
    assert_int_equal(count_files(dir, ".wal"), st.segments_created);
    /* each full segment ended at the first batch that reached the limit */
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    assert_true(file_size(seg) >= 4096 && file_size(seg) < 4096 + 200);
    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    check_records(&e, 600);
    assert_int_equal(rs.segments, st.segments_created);
    assert_int_equal(rs.last_segment, st.segment_current);
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

/* A burst's batch buffers are given back once batches are small again: a record of thousands of
 * series grows a buffer to megabytes; 64 small batches in a row later, neither buffer keeps it. */
static void test_batch_buffers_shrink(void **state)
{
    (void)state;
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    enum { N = 20000 };
    wal_series_t *big = calloc(N, sizeof(*big));
    label_t(*lv)[2] = calloc(N, sizeof(*lv));
    char(*vals)[48] = calloc(N, sizeof(*vals));
    for (int i = 0; i < N; i++) {
        snprintf(vals[i], sizeof vals[i], "task-%08d-of-a-long-enough-name", i);
        lv[i][0] = (label_t){"__name__", "flink_taskmanager_job_task_numRecordsIn"};
        lv[i][1] = (label_t){"task", vals[i]};
        big[i] = (wal_series_t){.id = (uint64_t)i + 1, .labels = {lv[i], 2}};
    }
    char err[256] = "";
    assert_int_equal(wal_log_series(w, big, N, err, sizeof err), WAL_OK);
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_true(st.buffer_bytes >= (1u << 20));
    for (int k = 0; k < 2 * 64 + 2; k++) {
        wal_sample_t smp = {.series_id = 1, .t_ms = 1000LL * (k + 1), .v = k};
        assert_int_equal(wal_log_samples(w, &smp, 1, err, sizeof err), WAL_OK);
    }
    wal_get_stats(w, &st);
    assert_true(st.buffer_bytes < (256u << 10));
    close_wal(w);
    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(rs.series, N);
    assert_int_equal(rs.samples, 2 * 64 + 2);
    evs_free(&e);
    free(big);
    free(lv);
    free(vals);
    rm_rf(dir);
    free(dir);
}

static void test_cut_truncate(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    char err[256];
    for (int k = 0; k < 6; k++)
        log_record(w, k);
    uint32_t s1 = 0;
    assert_int_equal(wal_cut(w, &s1, err, sizeof err), 0);
    assert_int_equal(s1, 2);
    for (int k = 6; k < 9; k++)
        log_record(w, k);
    uint32_t s2 = 0;
    assert_int_equal(wal_cut(w, &s2, err, sizeof err), 0);
    assert_int_equal(s2, 3);
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_int_equal(st.segments_on_disk, 3);
    assert_int_equal(st.fsyncs, 2); /* a cut makes the closed segment durable */

    /* before truncation: from 0 everything, from s1 only what followed the cut */
    evs_t e = {0};
    replay_into(dir, 0, &e, NULL);
    check_records(&e, 9);
    evs_free(&e);
    replay_into(dir, s1, &e, NULL);
    size_t want = 0;
    for (int k = 6; k < 9; k++)
        want += record_events(k);
    assert_int_equal(e.n, want);
    assert_int_equal(e.v[0].kind, EV_SERIES);
    assert_int_equal(e.v[0].id, 6);
    evs_free(&e);

    assert_int_equal(wal_truncate_before(w, s1, err, sizeof err), 0);
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    assert_false(file_exists(seg));
    wal_get_stats(w, &st);
    assert_int_equal(st.segments_on_disk, 2);
    /* asking for more than exists never removes the current segment */
    assert_int_equal(wal_truncate_before(w, 1000, err, sizeof err), 0);
    path_of(seg, sizeof seg, dir, 3, "");
    assert_true(file_exists(seg));
    path_of(seg, sizeof seg, dir, 2, "");
    assert_false(file_exists(seg));
    log_record(w, 9);
    close_wal(w);
    replay_into(dir, 0, &e, NULL);
    assert_int_equal(e.n, 1);
    assert_int_equal(e.v[0].kind, EV_SERIES);
    assert_int_equal(e.v[0].id, 9);
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

/* ---- damage ---------------------------------------------------------------------------------- */

/* Writes records [0, n) into a single segment; returns where record n-1 starts. */
static off_t write_n(const char *dir, int n)
{
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    for (int k = 0; k < n - 1; k++)
        log_record(w, k);
    wal_stats_t st;
    wal_get_stats(w, &st);
    off_t last = (off_t)st.segment_bytes;
    log_record(w, n - 1);
    close_wal(w);
    return last;
}

static void test_torn_tail(void **state)
{
    char *dir = tmpdir_make();
    const int n = 5; /* record 4 is a 3-sample batch */
    off_t last = write_n(dir, n);
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    size_t len;
    char *orig = read_file(seg, &len);
    assert_true((size_t)last < len);

    char *work = tmpdir_make();
    char wseg[4096];
    path_of(wseg, sizeof wseg, work, 1, "");
    for (size_t cut = (size_t)last; cut < len; cut++) {
        write_file(wseg, orig, cut);
        evs_t e = {0};
        wal_replay_stats_t rs;
        replay_into(work, 0, &e, &rs);
        check_records(&e, n - 1);
        assert_int_equal(file_size(wseg), last);
        assert_int_equal(rs.truncated, cut > (size_t)last);
        assert_int_equal(rs.bytes_dropped, cut - (size_t)last);
        assert_false(rs.corrupt_middle);
        evs_free(&e);
    }
    /* torn while the segment header was being written: the file is removed */
    for (size_t cut = 0; cut < 16; cut++) {
        write_file(wseg, orig, cut);
        evs_t e = {0};
        wal_replay_stats_t rs;
        replay_into(work, 0, &e, &rs);
        assert_int_equal(e.n, 0);
        assert_false(file_exists(wseg));
        evs_free(&e);
    }
    /* a zero-filled tail (preallocated, or metadata ahead of data after a crash) */
    char *z = calloc(1, len + 4096);
    memcpy(z, orig, len);
    write_file(wseg, z, len + 4096);
    evs_t e = {0};
    replay_into(work, 0, &e, NULL);
    check_records(&e, n);
    assert_int_equal(file_size(wseg), (off_t)len);
    evs_free(&e);
    free(z);

    free(orig);
    rm_rf(work);
    free(work);
    rm_rf(dir);
    free(dir);
}

static void test_flipped_bit(void **state)
{
    char *dir = tmpdir_make();
    const int n = 5;
    off_t last = write_n(dir, n);
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    size_t len;
    char *orig = read_file(seg, &len);
    char *work = tmpdir_make();
    char wseg[4096];
    path_of(wseg, sizeof wseg, work, 1, "");
    for (size_t i = (size_t)last; i < len; i++) {
        orig[i] ^= (char)(1u << (i % 8));
        write_file(wseg, orig, len);
        orig[i] ^= (char)(1u << (i % 8));
        evs_t e = {0};
        wal_replay_stats_t rs;
        replay_into(work, 0, &e, &rs);
        check_records(&e, n - 1);
        assert_true(rs.truncated);
        assert_int_equal(file_size(wseg), last);
        evs_free(&e);
    }
    free(orig);
    rm_rf(work);
    free(work);
    rm_rf(dir);
    free(dir);
}

static void test_corrupt_middle_segment(void **state)
{
    char *dir = tmpdir_make();
    /* three segments: records 0-2, 3-5, 6-8 */
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    char err[256];
    uint32_t s;
    for (int k = 0; k < 9; k++) {
        if (k == 3 || k == 6)
            assert_int_equal(wal_cut(w, &s, err, sizeof err), 0);
        log_record(w, k);
    }
    close_wal(w);
    /* flip a bit in the second record of segment 1 */
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    size_t len;
    char *b = read_file(seg, &len);
    off_t first_len = 16; /* segment header */
    uint32_t rlen = (uint8_t)b[16 + 4] | (uint8_t)b[16 + 5] << 8;
    off_t second = first_len + 12 + (off_t)rlen;
    b[second + 14] ^= 0x10;
    write_file(seg, b, len);
    free(b);

    log_set_level(LOG_OFF);
    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    log_set_level(LOG_ERROR);
    check_records(&e, 1);
    assert_true(rs.truncated);
    assert_true(rs.corrupt_middle);
    assert_int_equal(file_size(seg), second);
    path_of(seg, sizeof seg, dir, 2, ".corrupt");
    assert_true(file_exists(seg));
    path_of(seg, sizeof seg, dir, 3, ".corrupt");
    assert_true(file_exists(seg));
    assert_int_equal(count_files(dir, ".wal"), 1);
    evs_free(&e);

    /* the repaired directory replays cleanly, and new segments number after the set-aside ones */
    replay_into(dir, 0, &e, &rs);
    check_records(&e, 1);
    assert_false(rs.truncated);
    evs_free(&e);
    w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_int_equal(st.segment_current, 4);
    log_record(w, 1);
    close_wal(w);
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(e.n, 1 + 3);
    evs_free(&e);

    /* a bad segment header (not a torn creation) sets the segment aside too */
    path_of(seg, sizeof seg, dir, 1, "");
    b = read_file(seg, &len);
    b[9] ^= 1; /* segment number */
    write_file(seg, b, len);
    free(b);
    log_set_level(LOG_OFF);
    replay_into(dir, 0, &e, &rs);
    log_set_level(LOG_ERROR);
    assert_int_equal(e.n, 0);
    assert_true(rs.corrupt_middle);
    path_of(seg, sizeof seg, dir, 1, ".corrupt");
    assert_true(file_exists(seg));
    path_of(seg, sizeof seg, dir, 4, ".corrupt");
    assert_true(file_exists(seg));
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

/* Appends a raw record (header + payload, correct CRC unless told) to a segment file. */
static void append_raw(const char *path, uint8_t type, uint32_t len_field, const void *payload, size_t plen)
{
    uint8_t h[12] = {type, 0, 0, 0};
    for (int i = 0; i < 4; i++)
        h[4 + i] = (uint8_t)(len_field >> (8 * i));
    uint32_t crc = crc32c_update(crc32c(h, 8), payload, plen);
    for (int i = 0; i < 4; i++)
        h[8 + i] = (uint8_t)(crc >> (8 * i));
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    fwrite(h, 1, 12, f);
    fwrite(payload, 1, plen, f);
    fclose(f);
}

static void test_garbage_length(void **state)
{
    char *dir = tmpdir_make();
    off_t end_good;
    write_n(dir, 3);
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    end_good = file_size(seg);

    /* a length just under the cap, far beyond the file: no 60 MiB buffer */
    char junk[100] = {1, 2, 3};
    append_raw(seg, WAL_REC_SAMPLES, 60u << 20, junk, sizeof junk);
    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    check_records(&e, 3);
    assert_true(rs.truncated);
    assert_true(rs.buffer_bytes < 4096);
    assert_int_equal(file_size(seg), end_good);
    evs_free(&e);

    /* a length beyond the cap */
    append_raw(seg, WAL_REC_SAMPLES, 0xFFFFFFF0u, junk, sizeof junk);
    replay_into(dir, 0, &e, &rs);
    check_records(&e, 3);
    assert_true(rs.truncated);
    assert_true(rs.buffer_bytes < 4096);
    evs_free(&e);

    /* a good CRC over a sample count that claims more than the payload holds */
    uint8_t lie[14] = {0xff, 0xff, 0xff, 0x7f, 1, 2};
    append_raw(seg, WAL_REC_SAMPLES, sizeof lie, lie, sizeof lie);
    replay_into(dir, 0, &e, &rs);
    check_records(&e, 3);
    assert_true(rs.truncated);
    assert_true(rs.buffer_bytes < 4096);
    assert_int_equal(file_size(seg), end_good);
    evs_free(&e);

    /* an unknown record type with a good CRC is skipped, not fatal */
    append_raw(seg, 77, 5, "hello", 5);
    uint8_t blob[4] = {3, 'a', 'b', 'c'};
    append_raw(seg, WAL_REC_BLOB, 4, blob, 4);
    replay_into(dir, 0, &e, &rs);
    assert_int_equal(rs.skipped, 1);
    assert_false(rs.truncated);
    size_t before = record_events(0) + record_events(1) + record_events(2);
    assert_int_equal(e.n, before + 1);
    assert_int_equal(e.v[before].kind, EV_BLOB);
    assert_int_equal(e.v[before].t, 3);
    assert_string_equal(e.v[before].text, "abc");
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

static void test_limits_and_abort(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    char err[256] = "";
    static const char dummy[1];
    /* rejected before anything is copied */
    assert_int_equal(wal_log_blob(w, 1, dummy, WAL_MAX_RECORD_BYTES, err, sizeof err), WAL_ERR_TOO_LARGE);
    assert_true(strlen(err) > 0);
    label_t bad[] = {{"__name__", NULL}};
    wal_series_t s = {.id = 1, .labels = {bad, 1}};
    assert_int_equal(wal_log_series(w, &s, 1, err, sizeof err), WAL_ERR_ARG);
    /* Records are encoded in place into the batch being collected: a call refused halfway (a
     * good series, then a bad one) must leave none of its bytes behind, not even the good
     * series' (replay below sees exactly the six records logged after). */
    label_t good[] = {{"__name__", "up"}};
    wal_series_t two[] = {{.id = 7, .labels = {good, 1}}, {.id = 8, .labels = {bad, 1}}};
    assert_int_equal(wal_log_series(w, two, 2, err, sizeof err), WAL_ERR_ARG);
    for (int k = 0; k < 6; k++)
        log_record(w, k);
    close_wal(w);

    evs_t e = {.abort_after_samples = 2};
    int rc = wal_replay(dir, 0, &all_cb, &e, NULL, err, sizeof err);
    assert_int_equal(rc, WAL_ERR_ABORTED);
    assert_true(strlen(err) > 0);
    evs_free(&e);
    /* an aborted replay repaired nothing */
    replay_into(dir, 0, &e, NULL);
    check_records(&e, 6);
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

/* ---- write errors ------------------------------------------------------------------------------ */

/* In a child (RLIMIT_FSIZE is per process): append until the file size limit makes write(2) fail,
 * check the error reaches the caller, lift the limit, check appends work again, and that replay
 * holds exactly the appends that reported success. Exit code = failing check. */
static int write_error_child(const char *dir)
{
    signal(SIGXFSZ, SIG_IGN); /* get EFBIG instead of being killed */
    wal_options_t o;
    wal_options_default(&o);
    o.fsync_mode = WAL_FSYNC_ALWAYS;
    char err[256] = "";
    wal_t *w = wal_open(dir, &o, err, sizeof err);
    if (!w)
        return 10;
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    struct rlimit small = {.rlim_cur = 3000, .rlim_max = rl.rlim_max};
    if (setrlimit(RLIMIT_FSIZE, &small) != 0)
        return 11;
    int ok[200];
    int nok = 0, nfail = 0;
    for (int i = 0; i < 100; i++) {
        wal_sample_t s[4];
        for (int j = 0; j < 4; j++)
            s[j] = (wal_sample_t){(uint64_t)j, i * 1000, (double)i};
        err[0] = 0;
        int rc = wal_log_samples(w, s, 4, err, sizeof err);
        if (rc == 0) {
            if (nfail)
                return 12; /* still limited: must not succeed */
            ok[nok++] = i;
        } else {
            if (rc != WAL_ERR_IO || strlen(err) == 0)
                return 13;
            nfail++;
        }
    }
    if (nok == 0 || nfail == 0)
        return 14;
    wal_stats_t st;
    wal_get_stats(w, &st);
    if (st.write_errors != (uint64_t)nfail)
        return 15;
    /* space comes back */
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
        return 16;
    for (int i = 1000; i < 1010; i++) {
        wal_sample_t s = {0, i * 1000, 1};
        if (wal_log_samples(w, &s, 1, err, sizeof err) != 0)
            return 17;
        ok[nok++] = i;
    }
    if (wal_close(w, err, sizeof err) != 0)
        return 18;

    evs_t e = {0};
    wal_replay_stats_t rs;
    if (wal_replay(dir, 0, &all_cb, &e, &rs, err, sizeof err) != 0)
        return 19;
    if (rs.truncated)
        return 20; /* the failed partial write was cut back at once */
    size_t j = 0;
    for (int k = 0; k < nok; k++) {
        int nsamp = ok[k] < 1000 ? 4 : 1;
        for (int q = 0; q < nsamp; q++, j++)
            if (j >= e.n || e.v[j].t != ok[k] * 1000)
                return 21;
    }
    if (j != e.n)
        return 22;
    evs_free(&e);
    return 0;
}

static void test_write_error(void **state)
{
    char *dir = tmpdir_make();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(write_error_child(dir));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    rm_rf(dir);
    free(dir);
}

/* Finds this process' descriptor for `path` (the WAL keeps its segment fd private). */
static int find_fd(const char *path)
{
    char real[4096];
    assert_non_null(realpath(path, real));
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    struct dirent *e;
    int found = -1;
    while ((e = readdir(d)) != NULL) {
        char link[300], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = 0;
        if (!strcmp(target, real) && atoi(e->d_name) != dirfd(d))
            found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}

/* A failed write whose cut-back also fails: every append fails until the file can be repaired,
 * then the WAL works again and holds exactly the successful appends. */
static void test_write_error_repair(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_ALWAYS, 3600 * 1000, 0);
    log_record(w, 0);
    log_record(w, 1);
    char seg[4096];
    path_of(seg, sizeof seg, dir, 1, "");
    int fd = find_fd(seg);
    assert_true(fd >= 0);
    int keep = dup(fd);
    int ro = open(seg, O_RDONLY);
    assert_true(keep >= 0 && ro >= 0);
    assert_int_equal(dup2(ro, fd), fd); /* writes and ftruncate now fail */
    char err[256];
    wal_sample_t s = {1, 5, 5};
    for (int i = 0; i < 3; i++) {
        err[0] = 0;
        assert_int_equal(wal_log_samples(w, &s, 1, err, sizeof err), WAL_ERR_IO);
        assert_true(strlen(err) > 0);
    }
    wal_stats_t st;
    wal_get_stats(w, &st);
    assert_int_equal(st.write_errors, 1); /* later ones failed at the repair step */
    assert_int_equal(dup2(keep, fd), fd);
    close(keep);
    close(ro);
    log_record(w, 2);
    close_wal(w);
    evs_t e = {0};
    wal_replay_stats_t rs;
    replay_into(dir, 0, &e, &rs);
    check_records(&e, 3);
    assert_false(rs.truncated);
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

/* The failure of a roll (cannot create the next segment) fails wal_cut but keeps the WAL
 * working in the old segment. */
static void test_cut_failure(void **state)
{
    char *dir = tmpdir_make();
    wal_t *w = open_wal(dir, WAL_FSYNC_INTERVAL, 0, 0);
    log_record(w, 0);
    /* occupy the name of the next segment with a directory so O_EXCL creation fails */
    char seg[4096];
    path_of(seg, sizeof seg, dir, 2, "");
    assert_int_equal(mkdir(seg, 0755), 0);
    char err[256] = "";
    uint32_t s = 0;
    assert_int_equal(wal_cut(w, &s, err, sizeof err), WAL_ERR_IO);
    assert_true(strlen(err) > 0);
    log_record(w, 1);
    rmdir(seg);
    assert_int_equal(wal_cut(w, &s, err, sizeof err), 0);
    assert_int_equal(s, 2);
    log_record(w, 2);
    close_wal(w);
    evs_t e = {0};
    replay_into(dir, 0, &e, NULL);
    check_records(&e, 3);
    evs_free(&e);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),         cmocka_unit_test(test_concurrent_interval),
        cmocka_unit_test(test_concurrent_always), cmocka_unit_test(test_fsync_always),
        cmocka_unit_test(test_fsync_interval),    cmocka_unit_test(test_segment_roll),
        cmocka_unit_test(test_cut_truncate),      cmocka_unit_test(test_torn_tail),
        cmocka_unit_test(test_flipped_bit),       cmocka_unit_test(test_corrupt_middle_segment),
        cmocka_unit_test(test_garbage_length),    cmocka_unit_test(test_limits_and_abort),
        cmocka_unit_test(test_write_error),       cmocka_unit_test(test_write_error_repair),
        cmocka_unit_test(test_cut_failure),       cmocka_unit_test(test_roll_fsync_deferred),
        cmocka_unit_test(test_batch_buffers_shrink),
    };
    log_set_level(LOG_ERROR); /* the damage tests log warnings on purpose */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
