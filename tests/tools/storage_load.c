/*
 * storage_load — drives storage_open/storage_append the way the daemon does, for the crash and
 * corruption tests (tests/integration/test_storage_crash.py). Not a benchmark.
 *
 *   storage_load --dir D [--series N] [--seconds S] [--snapshot-interval-ms MS]
 *       Opens D with the daemon's defaults (WAL group commit, fsync every 1 s, roll-ups
 *       1m:15d,1h:400d, background thread) and appends Flink-shaped samples: N series (default
 *       2000), one sample per series per data-second, value = expected_value(series, t). Data time
 *       starts 90 minutes before the wall clock (or, if D already holds data, right after the
 *       oldest "newest sample" among the series, so a run resumes where a killed one stopped and
 *       re-sends what may be half there: a same-second re-send replaces, with the same value; a
 *       series with no sample at all then starts there, so kill only after the first ack) and
 *       runs as fast as appends return, but never past the wall clock. After each batch (one
 *       data-second, all series) returns STORAGE_OK it prints "acked <t_ms> <wall_ms>" and
 *       flushes stdout. At start it prints "recovered <newest t_ms or 0> <series>". Stops after S
 *       data-seconds (0 = until SIGTERM/SIGINT, then closes cleanly: final snapshot).
 *
 *   storage_load --dir D --verify [--acked T] [--series N] [--allow-missing-prefix] [--allow-gaps]
 *       Reopens D and checks the raw samples of every series: each value must equal
 *       expected_value(series, t) (else "wrong"), samples must be every 1000 ms (a hole counts its
 *       missing samples; tolerated with --allow-gaps), every series must start at the same t
 *       (unless --allow-missing-prefix: data before the oldest surviving WAL record may be gone)
 *       and reach at least T. Prints one line "verify series=... samples=... first_t=... min_last_t=...
 *       max_last_t=... acked=... missing=... wrong=... gaps=..." and exits 1 on loss or corruption.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal/util/log.h"
#include "storage/storage.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *metric_names[] = {
    "flink_taskmanager_job_task_numRecordsIn",        "flink_taskmanager_job_task_numRecordsOut",
    "flink_taskmanager_job_task_numBytesInPerSecond", "flink_taskmanager_job_task_busyTimeMsPerSecond",
    "flink_taskmanager_Status_JVM_Memory_Heap_Used",
};
#define NMETRICS (sizeof(metric_names) / sizeof(metric_names[0]))

/* Deterministic value of series i at t: counters for the first two metric kinds, gauges with
 * decimals for the rest. */
static double expected_value(uint32_t i, int64_t t)
{
    int64_t sec = t / 1000;
    uint32_t kind = i % NMETRICS;
    if (kind < 2)
        return (double)(sec % 100000000) * (double)(i % 7 + 1);
    uint64_t h = (uint64_t)sec * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    return (double)(h % 1000000) / 100.0;
}

typedef struct {
    char name[96], job[32], task[32], subtask[16], series[16];
    label_t l[6];
} series_labels_t;

static void make_labels(series_labels_t *s, uint32_t i)
{
    snprintf(s->name, sizeof s->name, "%s", metric_names[i % NMETRICS]);
    snprintf(s->job, sizeof s->job, "job-%u", i / 400);
    snprintf(s->task, sizeof s->task, "task-%u", (unsigned)((i / NMETRICS) % 20));
    snprintf(s->subtask, sizeof s->subtask, "%u", (i / 100) % 4);
    snprintf(s->series, sizeof s->series, "%u", i);
    s->l[0] = (label_t){"__name__", s->name};
    s->l[1] = (label_t){"job_name", s->job};
    s->l[2] = (label_t){"task_name", s->task};
    s->l[3] = (label_t){"subtask_index", s->subtask};
    s->l[4] = (label_t){"series", s->series};
    s->l[5] = (label_t){"tm_id", "tm-0"};
}

typedef struct {
    int64_t first_t, last_t;
    uint64_t samples, missing, wrong, gaps;
    bool seen;
} sstat_t;

/* Walks every raw series once; fills per-series stats (indexed by the "series" label). */
static int scan(storage_t *st, uint32_t nseries, sstat_t *ss)
{
    char err[128];
    matcher_t *all = matcher_new(MATCHER_RE, "__name__", ".+", err, sizeof err);
    querier_t *q = head_querier(storage_head(st));
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&all, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *s;
    int rc = 0;
    while ((s = querier_set_next(set))) {
        const char *idx = labels_get(&s->labels, "series");
        uint32_t i = idx ? (uint32_t)strtoul(idx, NULL, 10) : UINT32_MAX;
        if (i >= nseries) {
            fprintf(stderr, "unexpected series (series=%s)\n", idx ? idx : "none");
            rc = -1;
            continue;
        }
        sstat_t *x = &ss[i];
        x->seen = true;
        querier_iter_t it;
        querier_iter_init(&it, s, INT64_MIN, INT64_MAX);
        int64_t t;
        double v;
        while (querier_iter_next(&it, &t, &v)) {
            if (x->samples == 0) {
                x->first_t = t;
            } else if (t != x->last_t + 1000) {
                x->gaps++;
                if (t > x->last_t)
                    x->missing += (uint64_t)((t - x->last_t) / 1000 - 1);
            }
            if (v != expected_value(i, t)) {
                if (x->wrong == 0)
                    fprintf(stderr, "wrong value: series %u t %" PRId64 " got %.17g want %.17g\n", i, t, v,
                            expected_value(i, t));
                x->wrong++;
            }
            x->last_t = t;
            x->samples++;
        }
    }
    if (querier_set_error(set)) {
        fprintf(stderr, "querier: %s\n", querier_set_error(set));
        rc = -1;
    }
    querier_set_free(set);
    querier_close(q);
    matcher_free(all);
    return rc;
}

static storage_t *open_store(const char *dir, int64_t snapshot_interval_ms)
{
    storage_options_t o;
    storage_options_default(&o);
    o.path = dir;
    o.wal_fsync_interval_ms = 1000;
    o.snapshot_interval_ms = snapshot_interval_ms;
    char err[512];
    storage_t *st = storage_open(&o, err, sizeof err);
    if (!st)
        fprintf(stderr, "storage_open %s: %s\n", dir, err);
    return st;
}

static int verify(const char *dir, uint32_t nseries, int64_t acked, bool allow_prefix, bool allow_gaps)
{
    storage_t *st = open_store(dir, -1);
    if (!st)
        return 2;
    sstat_t *ss = calloc(nseries, sizeof *ss);
    int rc = scan(st, nseries, ss);
    uint64_t samples = 0, missing = 0, wrong = 0, gaps = 0, absent = 0;
    int64_t first = INT64_MAX, min_last = INT64_MAX, max_last = INT64_MIN, max_first = INT64_MIN;
    for (uint32_t i = 0; i < nseries; i++) {
        if (!ss[i].seen) {
            absent++;
            continue;
        }
        samples += ss[i].samples;
        missing += ss[i].missing;
        wrong += ss[i].wrong;
        gaps += ss[i].gaps;
        first = ss[i].first_t < first ? ss[i].first_t : first;
        max_first = ss[i].first_t > max_first ? ss[i].first_t : max_first;
        min_last = ss[i].last_t < min_last ? ss[i].last_t : min_last;
        max_last = ss[i].last_t > max_last ? ss[i].last_t : max_last;
    }
    uint64_t tail_missing = 0, prefix_missing = 0;
    for (uint32_t i = 0; i < nseries; i++) {
        if (ss[i].seen && ss[i].last_t < acked)
            tail_missing += (uint64_t)((acked - ss[i].last_t) / 1000);
        if (ss[i].seen && ss[i].first_t > first)
            prefix_missing += (uint64_t)((ss[i].first_t - first) / 1000);
    }
    printf("verify series=%u absent=%" PRIu64 " samples=%" PRIu64 " first_t=%" PRId64 " max_first_t=%" PRId64
           " min_last_t=%" PRId64 " max_last_t=%" PRId64 " acked=%" PRId64 " missing=%" PRIu64 " tail_missing=%" PRIu64
           " prefix_missing=%" PRIu64 " wrong=%" PRIu64 " gaps=%" PRIu64 "\n",
           nseries, absent, samples, first == INT64_MAX ? 0 : first, max_first == INT64_MIN ? 0 : max_first,
           min_last == INT64_MAX ? 0 : min_last, max_last == INT64_MIN ? 0 : max_last, acked, missing, tail_missing,
           prefix_missing, wrong, gaps);
    fflush(stdout);
    bool bad = rc != 0 || wrong > 0 || tail_missing > 0 || (acked > 0 && absent > 0) || (!allow_gaps && missing > 0) ||
               (!allow_prefix && prefix_missing > 0);
    free(ss);
    storage_close(st);
    return bad ? 1 : 0;
}

static int load(const char *dir, uint32_t nseries, int64_t seconds, int64_t snapshot_interval_ms)
{
    storage_t *st = open_store(dir, snapshot_interval_ms);
    if (!st)
        return 2;
    /* Resume after the oldest "newest sample" of the series (0 if the store is empty). */
    sstat_t *ss = calloc(nseries, sizeof *ss);
    scan(st, nseries, ss);
    int64_t resume = INT64_MAX, newest = 0;
    uint32_t present = 0;
    for (uint32_t i = 0; i < nseries; i++) {
        if (!ss[i].seen)
            continue;
        present++;
        resume = ss[i].last_t < resume ? ss[i].last_t : resume;
        newest = ss[i].last_t > newest ? ss[i].last_t : newest;
    }
    free(ss);
    printf("recovered %" PRId64 " %u\n", newest, present);
    fflush(stdout);
    int64_t t = present ? resume + 1000 : (wall_ms() / 1000) * 1000 - 90 * 60 * 1000LL;

    series_labels_t *ls = calloc(nseries, sizeof *ls);
    storage_sample_t *batch = calloc(nseries, sizeof *batch);
    for (uint32_t i = 0; i < nseries; i++) {
        make_labels(&ls[i], i);
        batch[i].labels = (labels_t){ls[i].l, 6};
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    int rc = 0;
    for (int64_t n = 0; !stop_flag && (seconds == 0 || n < seconds); n++, t += 1000) {
        while (!stop_flag && t > wall_ms() - 1000)
            usleep(100 * 1000); /* never ahead of the wall clock */
        if (stop_flag)
            break;
        for (uint32_t i = 0; i < nseries; i++) {
            batch[i].t = t;
            batch[i].v = expected_value(i, t);
        }
        storage_append_result_t res;
        int arc;
        while ((arc = storage_append(st, batch, nseries, &res)) == STORAGE_ERR_IO && !stop_flag) {
            fprintf(stderr, "append: %s; retrying\n", res.msg);
            usleep(200 * 1000);
        }
        if (arc == STORAGE_ERR_IO)
            break;
        if (arc != STORAGE_OK && arc != STORAGE_ERR_OUT_OF_ORDER) {
            fprintf(stderr, "append t=%" PRId64 ": %s\n", t, res.msg);
            rc = 1;
            break;
        }
        if (arc == STORAGE_ERR_OUT_OF_ORDER && res.accepted + res.failed != nseries) {
            rc = 1;
            break;
        }
        printf("acked %" PRId64 " %" PRId64 "\n", t, wall_ms());
        fflush(stdout);
    }
    free(batch);
    free(ls);
    storage_close(st);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    uint32_t nseries = 2000;
    int64_t seconds = 0, acked = 0, snap_ms = 0;
    bool do_verify = false, allow_prefix = false, allow_gaps = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--dir") == 0 && v)
            dir = argv[++i];
        else if (strcmp(a, "--series") == 0 && v)
            nseries = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(a, "--seconds") == 0 && v)
            seconds = strtoll(argv[++i], NULL, 10);
        else if (strcmp(a, "--acked") == 0 && v)
            acked = strtoll(argv[++i], NULL, 10);
        else if (strcmp(a, "--snapshot-interval-ms") == 0 && v)
            snap_ms = strtoll(argv[++i], NULL, 10);
        else if (strcmp(a, "--verify") == 0)
            do_verify = true;
        else if (strcmp(a, "--allow-missing-prefix") == 0)
            allow_prefix = true;
        else if (strcmp(a, "--allow-gaps") == 0)
            allow_gaps = true;
        else {
            fprintf(stderr, "usage: storage_load --dir D [--series N] [--seconds S] [--snapshot-interval-ms MS]\n"
                            "       storage_load --dir D --verify [--acked T] [--series N] [--allow-missing-prefix]"
                            " [--allow-gaps]\n");
            return 2;
        }
    }
    if (!dir || nseries == 0) {
        fprintf(stderr, "storage_load: --dir is required\n");
        return 2;
    }
    return do_verify ? verify(dir, nseries, acked, allow_prefix, allow_gaps) : load(dir, nseries, seconds, snap_ms);
}
