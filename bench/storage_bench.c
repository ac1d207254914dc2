/*
 * storage_bench — the storage benchmark of issue 4 (DESIGN.md, Performance budgets). Not a test:
 * it times things, prints a table and asserts nothing. bench/run.sh builds and runs it.
 *
 * Sections (--sections, comma separated; all by default), every figure run --reps times (3) and
 * the median printed:
 *
 *   mem      RSS per active series, bytes per sample in chunks, and samples held per
 *            series, for Flink-shaped data at 10 s with 2h raw retention. A forked child builds a
 *            memory-only store (simulated clock, housekeeping every tick) and loads 2h22m30s:
 *            the head then holds 2h07m30s, the average of what the 15-minute block ring holds
 *            in steady state (between 2h and 2h15m). RSS per series = (RSS after - RSS before
 *            loading) / series; label sets are built before the first reading. Two data sets:
 *              synthetic  --series (30k) series with 11 labels shaped like Flink operator
 *                         metrics (60 metrics per subtask, 12 subtasks per TaskManager); even
 *                         metrics are counters growing by 900..1099 per 10 s, odd ones gauges
 *                         that change to a new integer 0..99 with probability 1/10 per sample
 *              flinkgen   --flink-tms (1) TaskManager(s) of internal/expfmt/flinkgen.h (~1,200
 *                         series each: JVM, task, operator gauges, summaries), every push body
 *                         parsed with the text parser, as the push path would
 *   scan     in the same child: select every series through the store's querier and decode
 *            every sample (querier_iter), one thread: samples/s per core.
 *   append   storage_append throughput on --append-series (100k) synthetic series (memory-only
 *            store, 10 simulated minutes, batches of
 *            1,000 samples as a push of one TaskManager would give), 1 thread and 2 threads over
 *            disjoint halves of the series; series creation (first tick) is not timed.
 *   rollup   roll-up tier: --rollup-series (50) series x 30 days of 10 s samples fed through
 *            rollup_add_samples with a writer flush every simulated hour (timed together:
 *            samples/s and buckets/s), disk bytes per bucket (database files / buckets
 *            written), and the 30-day query: per series min/max/increase over 30 days from the
 *            1h roll-ups (rollup_read) vs decoding the same raw samples from XOR chunks held in
 *            memory. The querier's roll-up tier (storage/querier_tiered) is not used yet: this
 *            measures the tier's read path directly.
 *   writer   the roll-up writer at the real push cadence: --writer-series (20k) synthetic series,
 *            a sample every 10 s each, a writer cycle every simulated 10 s (the states'
 *            checkpoint every simulated minute), for --writer-hours (4.5: past the end of a
 *            4-hour 1m blob span, where the blobs are fullest). CPU seconds (this process, one
 *            thread) and bytes it wrote (/proc/self/io wchar: the WAL and database files) per
 *            simulated minute, per 30 simulated minutes and for the whole run, scaled to 256k
 *            series (the push bench's fleet) in the table. Then every series' 1m buckets read
 *            through one reader, twice (as a dashboard panel over all of them would): us per series.
 *   peers    Debian's victoria-metrics and prometheus 2.42, each fed --peer-series (10k) of the
 *            synthetic series x 2h (ending now) by Prometheus remote write (snappy protobuf,
 *            encoded here), RSS per series = (RSS after ingest and a 5 s settle - idle RSS) /
 *            series, next to ours for the same series count.
 *
 * Scaled to stay under ~10 minutes on the 2-core machine: loading 100k series x 2h07m through
 * storage_append takes ~2 minutes per run, so mem uses 30k series by default.
 *
 * Usage: storage_bench [--series N] [--append-series N] [--flink-tms N] [--peer-series N] [--rollup-series N]
 *                      [--writer-series N] [--writer-hours H] [--reps N]
 *                      [--sections mem,scan,append,rollup,writer,peers] [--workdir DIR]
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <snappy-c.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <dirent.h>

#include "internal/expfmt/flinkgen.h"
#include "internal/expfmt/text_parse.h"
#include "internal/util/arena.h"
#include "internal/util/buf.h"
#include "storage/catalog.h"
#include "storage/chunk_xor.h"
#include "storage/rollup.h"
#include "storage/storage.h"

#define MAXREP 9
#define TICK_MS 10000LL
#define RETENTION_MS (2 * 3600 * 1000LL)

static struct {
    size_t series, append_series, flink_tms, peer_series, rollup_series, writer_series;
    double writer_hours;
    int reps;
    const char *sections;
    char workdir[512];
} opt = {30000, 100000, 1, 10000, 50, 20000, 4.5, 3, "mem,scan,append,rollup,writer,peers", ""};

static bool section(const char *name)
{
    const char *p = opt.sections;
    size_t n = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == opt.sections || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
            return true;
        p += n;
    }
    return false;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[bench] ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* ---- results ------------------------------------------------------------------------------- */

typedef struct {
    char name[80];
    char unit[24];
    double v[MAXREP];
    int n;
    char goal[48];
} figure_t;

static figure_t figs[96];
static int nfigs;

static void fig_add(const char *name, const char *unit, const char *goal, double v)
{
    figure_t *f = NULL;
    for (int i = 0; i < nfigs; i++)
        if (strcmp(figs[i].name, name) == 0)
            f = &figs[i];
    if (!f) {
        if (nfigs == (int)(sizeof(figs) / sizeof(figs[0])))
            return;
        f = &figs[nfigs++];
        snprintf(f->name, sizeof(f->name), "%s", name);
        snprintf(f->unit, sizeof(f->unit), "%s", unit);
        snprintf(f->goal, sizeof(f->goal), "%s", goal ? goal : "");
    }
    if (f->n < MAXREP)
        f->v[f->n++] = v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const figure_t *f)
{
    double v[MAXREP];
    memcpy(v, f->v, sizeof(double) * (size_t)f->n);
    qsort(v, (size_t)f->n, sizeof(double), cmp_double);
    return f->n % 2 ? v[f->n / 2] : (v[f->n / 2 - 1] + v[f->n / 2]) / 2;
}

static void fmt_num(char *out, size_t n, double v)
{
    if (isnan(v))
        snprintf(out, n, "n/a");
    else if (fabs(v) >= 1e6)
        snprintf(out, n, "%.2fM", v / 1e6);
    else if (fabs(v) >= 1e4)
        snprintf(out, n, "%.1fk", v / 1e3);
    else if (fabs(v) >= 100)
        snprintf(out, n, "%.0f", v);
    else
        snprintf(out, n, "%.2f", v);
}

static void print_table(void)
{
    printf("\n| figure | median | unit | runs | goal |\n|---|---:|---|---|---|\n");
    for (int i = 0; i < nfigs; i++) {
        figure_t *f = &figs[i];
        char m[32], runs[160] = "";
        fmt_num(m, sizeof(m), median(f));
        for (int k = 0; k < f->n; k++) {
            char one[32];
            fmt_num(one, sizeof(one), f->v[k]);
            strncat(runs, k ? " / " : "", sizeof(runs) - strlen(runs) - 1);
            strncat(runs, one, sizeof(runs) - strlen(runs) - 1);
        }
        printf("| %s | %s | %s | %s | %s |\n", f->name, m, f->unit, runs, f->goal);
    }
    fflush(stdout);
}

/* ---- process memory ------------------------------------------------------------------------ */

static long rss_bytes_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtol(line + 6, NULL, 10);
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* ---- synthetic Flink-shaped series --------------------------------------------------------- */

/* Series s is metric s % 60 of subtask g = s / 60; 12 subtasks per TaskManager. 20 metric names
 * x 3 operators; even metrics are counters, odd ones gauges. */
static const char *const op_metric[20] = {"numRecordsIn",
                                          "numRecordsInPerSecond",
                                          "numRecordsOut",
                                          "numRecordsOutPerSecond",
                                          "numBytesIn",
                                          "numBytesInPerSecond",
                                          "numBytesOut",
                                          "numBytesOutPerSecond",
                                          "numLateRecordsDropped",
                                          "currentInputWatermarkLag",
                                          "numSplitsProcessed",
                                          "pendingRecords",
                                          "numRecordsSent",
                                          "sourceIdleTime",
                                          "numRecordsInErrors",
                                          "watermarkAlignmentDrift",
                                          "numBytesSend",
                                          "currentEmitEventTimeLag",
                                          "numRecordsOutErrors",
                                          "currentSendTime"};
static const char *const op_name[3] = {"Source__Kafka_Orders", "Map", "Sink__Kafka_Enriched"};

typedef struct {
    labels_t *ls; /* per series, label arrays in one block */
    label_t *lv;
    char **strs; /* the distinct strings, to free */
    size_t nstrs;
    size_t n;
} synth_t;

static char *sdup(synth_t *sy, const char *fmt, ...)
{
    char tmp[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    char *s = strdup(tmp);
    sy->strs[sy->nstrs++] = s;
    return s;
}

static void synth_build(synth_t *sy, size_t n)
{
    memset(sy, 0, sizeof(*sy));
    sy->n = n;
    sy->ls = calloc(n, sizeof(labels_t));
    sy->lv = calloc(n * 11, sizeof(label_t));
    size_t groups = n / 60 + 1, tms = groups / 12 + 1;
    sy->strs = calloc(60 + 3 + 12 + 3 * groups + 2 * tms + 8, sizeof(char *));
    char *names[60], *opid[3], *sub[12];
    for (int m = 0; m < 60; m++)
        names[m] = sdup(sy, "flink_taskmanager_job_task_operator_%s", op_metric[m % 20]);
    for (int o = 0; o < 3; o++)
        opid[o] = sdup(sy, "%016llx%016llx", 0xcbc357ccb763df28ULL * (o + 1), 0x52fee8c4fc7d55f2ULL ^ (unsigned)o);
    for (int k = 0; k < 12; k++)
        sub[k] = sdup(sy, "%d", k);
    char *job_id = sdup(sy, "5d41402abc4b2a76b9719d911017c592");
    char **attempt = calloc(groups, sizeof(char *)), **host = calloc(tms, sizeof(char *)),
         **tmid = calloc(tms, sizeof(char *));
    for (size_t g = 0; g < groups; g++)
        attempt[g] = sdup(sy, "%016llx%016llx", (unsigned long long)(g * 0x9E3779B97F4A7C15ULL),
                          (unsigned long long)(~g * 0xC2B2AE3D27D4EB4FULL));
    for (size_t t = 0; t < tms; t++) {
        host[t] = sdup(sy, "flink-taskmanager-%zu", t);
        tmid[t] = sdup(sy, "container_e05_1700000000000_0042_01_%06zu", t + 2);
    }
    for (size_t s = 0; s < n; s++) {
        size_t m = s % 60, g = s / 60, t = g / 12;
        label_t *l = &sy->lv[s * 11];
        l[0] = (label_t){"__name__", names[m]};
        l[1] = (label_t){"host", host[t]};
        l[2] = (label_t){"job", "flink"};
        l[3] = (label_t){"job_id", job_id};
        l[4] = (label_t){"job_name", "orders-enrichment"};
        l[5] = (label_t){"operator_id", opid[m / 20]};
        l[6] = (label_t){"operator_name", op_name[m / 20]};
        l[7] = (label_t){"subtask_index", sub[g % 12]};
        l[8] = (label_t){"task_attempt_id", attempt[g]};
        l[9] = (label_t){"task_name", "Source__Kafka_Orders____Map____Sink__Kafka_Enriched"};
        l[10] = (label_t){"tm_id", tmid[t]};
        sy->ls[s] = (labels_t){l, 11};
    }
    free(attempt);
    free(host);
    free(tmid);
}

static void synth_free(synth_t *sy)
{
    for (size_t i = 0; i < sy->nstrs; i++)
        free(sy->strs[i]);
    free(sy->strs);
    free(sy->ls);
    free(sy->lv);
}

/* Value state of one series: deterministic in (series, tick), whoever generates it. */
typedef struct {
    double v;
    uint64_t x;
} vstate_t;

static void vstate_init(vstate_t *st, size_t n)
{
    for (size_t s = 0; s < n; s++) {
        st[s].x = 0x9E3779B97F4A7C15ULL * (s + 1) | 1;
        st[s].v = (s % 2 == 0) ? (double)(st[s].x % 1000000) : (double)(st[s].x % 100);
    }
}

static double vstate_next(vstate_t *st, size_t s)
{
    uint64_t x = st->x;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    st->x = x;
    if (s % 2 == 0)
        st->v += (double)(900 + x % 200); /* counter: ~1000 records per 10 s */
    else if (x % 10 == 0)
        st->v = (double)(x % 100); /* gauge changing now and then */
    return st->v;
}

/* ---- simulated clock ----------------------------------------------------------------------- */

static _Atomic int64_t sim_now;

static int64_t sim_clock(void)
{
    return atomic_load(&sim_now);
}

static storage_t *open_mem_store(void)
{
    storage_options_t o;
    storage_options_default(&o);
    o.path = NULL;
    o.no_background = true;
    o.clock_ms = sim_clock;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    if (!s) {
        fprintf(stderr, "storage_open: %s\n", err);
        exit(1);
    }
    return s;
}

/* Appends tick `tick` (t = t0 + tick * 10 s) for series [a, b) in batches of 1,000. */
static void append_tick(storage_t *st, const synth_t *sy, vstate_t *vs, size_t a, size_t b, int64_t t,
                        storage_sample_t *batch)
{
    size_t k = 0;
    for (size_t s = a; s < b; s++) {
        batch[k++] = (storage_sample_t){sy->ls[s], t, vstate_next(&vs[s], s)};
        if (k == 1000 || s + 1 == b) {
            storage_append_result_t res;
            if (storage_append(st, batch, k, &res) != STORAGE_OK && res.failed) {
                fprintf(stderr, "append failed: %s\n", res.msg);
                exit(1);
            }
            k = 0;
        }
    }
}

/* ---- mem + scan (in a forked child) -------------------------------------------------------- */

typedef struct {
    double rss_per_series, heap_per_series /* malloc only: slabs are mmap'd */, bytes_per_sample, samples_per_series,
        series;
    double scan_samples_per_s, index_per_series, open_per_series, slab_per_series;
} memres_t;

/* Decodes every sample of every series through the querier; fills the scan and chunk figures. */
static void scan_all(storage_t *st, memres_t *r)
{
    char err[128];
    matcher_t *m = matcher_new(MATCHER_RE, "__name__", ".+", err, sizeof(err));
    querier_t *q = storage_querier(st);
    double t0 = now_s();
    querier_set_t *set = querier_select(q, (const matcher_t *const *)&m, 1, INT64_MIN, INT64_MAX, NULL);
    const querier_series_t *se;
    uint64_t samples = 0, bytes = 0, nseries = 0;
    double sink = 0;
    while ((se = querier_set_next(set))) {
        nseries++;
        for (size_t i = 0; i < se->nchunks; i++)
            bytes += se->chunks[i].len;
        querier_iter_t it;
        querier_iter_init(&it, se, INT64_MIN, INT64_MAX);
        int64_t t;
        double v;
        while (querier_iter_next(&it, &t, &v)) {
            samples++;
            sink += v;
        }
    }
    double dt = now_s() - t0;
    if (querier_set_error(set))
        fprintf(stderr, "scan error: %s\n", querier_set_error(set));
    querier_set_free(set);
    querier_close(q);
    matcher_free(m);
    r->scan_samples_per_s = (double)samples / dt;
    r->bytes_per_sample = samples ? (double)bytes / (double)samples : NAN;
    r->samples_per_series = nseries ? (double)samples / (double)nseries : NAN;
    if (sink == 42.4242)
        fprintf(stderr, "!");
}

static void breakdown(storage_t *st, memres_t *r)
{
    head_stats_t hs;
    head_get_stats(storage_head(st), &hs);
    double n = (double)hs.series;
    r->index_per_series = (double)index_memory_bytes(head_index(storage_head(st))) / n;
    r->slab_per_series = (double)hs.slab_bytes / n;
    r->open_per_series = (double)(hs.memory_bytes - hs.slab_bytes) / n - r->index_per_series;
}

/* Window: load LOAD_MS of 10 s samples; with 15-minute blocks and 2h retention the head then
 * holds 2h07m30s (t0 is block aligned). */
#define LOAD_MS (RETENTION_MS + 22 * 60 * 1000LL + 30 * 1000LL)
#define T0 (1700000000000LL / (3600 * 1000LL) * (3600 * 1000LL))

static void mem_synthetic_child(memres_t *r, bool scan)
{
    synth_t sy;
    synth_build(&sy, opt.series);
    vstate_t *vs = calloc(sy.n, sizeof(vstate_t));
    vstate_init(vs, sy.n);
    storage_sample_t *batch = calloc(1000, sizeof(storage_sample_t));
    atomic_store(&sim_now, T0);
    storage_t *st = open_mem_store();
    malloc_trim(0);
    long rss0 = rss_bytes_of(getpid());
    size_t heap0 = heap_in_use();
    for (int64_t t = T0; t < T0 + LOAD_MS; t += TICK_MS) {
        atomic_store(&sim_now, t);
        append_tick(st, &sy, vs, 0, sy.n, t, batch);
        storage_housekeep(st);
    }
    /* Finish the expiry pass in progress so idle open chunks are packed, as in steady state. */
    for (int i = 0; i < 1000 && !head_expire(storage_head(st), sim_clock(), 4096); i++)
        ;
    long rss1 = rss_bytes_of(getpid());
    size_t heap1 = heap_in_use();
    r->series = (double)sy.n;
    r->rss_per_series = (double)(rss1 - rss0) / (double)sy.n;
    r->heap_per_series = ((double)heap1 - (double)heap0) / (double)sy.n;
    breakdown(st, r);
    if (scan)
        scan_all(st, r);
    storage_close(st);
    free(batch);
    free(vs);
    synth_free(&sy);
}

/* flinkgen data: every push body of every TaskManager parsed and appended. */
static void mem_flinkgen_child(memres_t *r)
{
    atomic_store(&sim_now, T0);
    storage_t *st = open_mem_store();
    buf_t body = BUF_INIT;
    size_t cap = 4096;
    storage_sample_t *batch = calloc(cap, sizeof(storage_sample_t));
    label_t *lab = calloc(cap * 16, sizeof(label_t));
    /* Warm the body buffer and the parser's arenas so their memory is not counted below. */
    for (unsigned tm = 0; tm < opt.flink_tms; tm++) {
        buf_reset(&body);
        flinkgen_taskmanager(&body, tm, 42, 0);
        arena_t *a = arena_create(0);
        expfmt_result_t res;
        char err[256];
        expfmt_parse_text(body.data, body.len, false, NULL, a, &res, err, sizeof(err));
        arena_destroy(a);
    }
    buf_reserve(&body, body.len * 2);
    malloc_trim(0);
    long rss0 = rss_bytes_of(getpid());
    size_t heap0 = heap_in_use();
    uint64_t tick = 0;
    for (int64_t t = T0; t < T0 + LOAD_MS; t += TICK_MS, tick++) {
        atomic_store(&sim_now, t);
        for (unsigned tm = 0; tm < opt.flink_tms; tm++) {
            buf_reset(&body);
            flinkgen_taskmanager(&body, tm, 42, tick);
            arena_t *a = arena_create(0);
            expfmt_result_t res;
            char err[256];
            if (expfmt_parse_text(body.data, body.len, false, NULL, a, &res, err, sizeof(err)) != 0) {
                fprintf(stderr, "flinkgen parse: %s\n", err);
                exit(1);
            }
            size_t k = 0, nl = 0;
            for (size_t f = 0; f < res.nfamilies; f++)
                for (size_t i = 0; i < res.families[f].nsamples; i++) {
                    const expfmt_sample_t *smp = &res.families[f].samples[i];
                    if (k == cap || nl + smp->nlabels + 2 > cap * 16)
                        break;
                    label_t *l = &lab[nl];
                    l[0] = (label_t){"__name__", smp->name};
                    memcpy(l + 1, smp->labels, smp->nlabels * sizeof(label_t));
                    l[smp->nlabels + 1] = (label_t){"job", "flink_tm"};
                    nl += smp->nlabels + 2;
                    batch[k++] = (storage_sample_t){{l, smp->nlabels + 2}, t, smp->value};
                }
            storage_append_result_t ar;
            storage_append(st, batch, k, &ar);
            arena_destroy(a);
        }
        storage_housekeep(st);
    }
    for (int i = 0; i < 1000 && !head_expire(storage_head(st), sim_clock(), 4096); i++)
        ;
    buf_free(&body);
    free(batch);
    free(lab);
    long rss1 = rss_bytes_of(getpid());
    size_t heap1 = heap_in_use();
    head_stats_t hs;
    head_get_stats(storage_head(st), &hs);
    r->series = (double)hs.series;
    r->rss_per_series = (double)(rss1 - rss0) / r->series;
    r->heap_per_series = ((double)heap1 - (double)heap0) / r->series;
    breakdown(st, r);
    scan_all(st, r);
    storage_close(st);
}

/* Runs fn in a fresh child so every repetition starts from an empty heap. */
static int run_child(void (*fn)(memres_t *, bool), void (*fn2)(memres_t *), bool arg, memres_t *out)
{
    int p[2];
    if (pipe(p) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        memres_t r = {0};
        if (fn)
            fn(&r, arg);
        else
            fn2(&r);
        if (write(p[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
            _exit(1);
        _exit(0);
    }
    close(p[1]);
    ssize_t n = read(p[0], out, sizeof(*out));
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    return n == (ssize_t)sizeof(*out) ? 0 : -1;
}

static void bench_mem(void)
{
    for (int rep = 0; rep < opt.reps; rep++) {
        memres_t r;
        double t0 = now_s();
        if (run_child(mem_synthetic_child, NULL, section("scan"), &r) < 0) {
            note("mem child failed");
            continue;
        }
        note("mem synthetic rep %d: %.0f series, RSS %.0f B/series, heap %.0f B/series (index %.0f, slab %.0f, open "
             "%.0f), "
             "%.3f B/sample, %.0f samples/series, scan %.1fM samples/s (%.1f s)",
             rep + 1, r.series, r.rss_per_series, r.heap_per_series, r.index_per_series, r.slab_per_series,
             r.open_per_series, r.bytes_per_sample, r.samples_per_series, r.scan_samples_per_s / 1e6, now_s() - t0);
        char name[80];
        snprintf(name, sizeof(name), "synthetic %zuk series: RSS per active series", opt.series / 1000);
        fig_add(name, "bytes", "<= 1024", r.rss_per_series);
        fig_add("synthetic: index per series (estimate)", "bytes", "", r.index_per_series);
        fig_add("synthetic: bytes per sample in chunks", "bytes", "<= 1.5", r.bytes_per_sample);
        fig_add("synthetic: samples held per series", "samples", "", r.samples_per_series);
        if (section("scan"))
            fig_add("scan (querier, decode all), 1 thread", "samples/s", ">= 100M", r.scan_samples_per_s);
    }
    if (opt.flink_tms == 0)
        return;
    for (int rep = 0; rep < opt.reps; rep++) {
        memres_t r;
        double t0 = now_s();
        if (run_child(NULL, mem_flinkgen_child, false, &r) < 0) {
            note("flinkgen child failed");
            continue;
        }
        note("mem flinkgen rep %d: %.0f series, RSS %.0f B/series, heap %.0f B/series (index %.0f, slab %.0f, open "
             "%.0f), "
             "%.3f B/sample, %.0f samples/series, scan %.1fM samples/s (%.1f s)",
             rep + 1, r.series, r.rss_per_series, r.heap_per_series, r.index_per_series, r.slab_per_series,
             r.open_per_series, r.bytes_per_sample, r.samples_per_series, r.scan_samples_per_s / 1e6, now_s() - t0);
        char name[80];
        snprintf(name, sizeof(name), "flinkgen %.0fk series: RSS per active series", r.series / 1000);
        fig_add(name, "bytes", "<= 1024", r.rss_per_series);
        fig_add("flinkgen: bytes per sample in chunks", "bytes", "<= 1.5", r.bytes_per_sample);
    }
}

/* ---- append throughput --------------------------------------------------------------------- */

typedef struct {
    storage_t *st;
    const synth_t *sy;
    vstate_t *vs;
    size_t a, b;
    int ticks;
    pthread_barrier_t *bar;
    bool leader;
} appender_arg_t;

static void *appender(void *p)
{
    appender_arg_t *ar = p;
    storage_sample_t *batch = calloc(1000, sizeof(storage_sample_t));
    for (int i = 1; i <= ar->ticks; i++) {
        int64_t t = T0 + i * TICK_MS;
        if (ar->leader) {
            atomic_store(&sim_now, t);
            storage_housekeep(ar->st);
        }
        pthread_barrier_wait(ar->bar);
        append_tick(ar->st, ar->sy, ar->vs, ar->a, ar->b, t, batch);
    }
    free(batch);
    return NULL;
}

static void bench_append(void)
{
    synth_t sy;
    synth_build(&sy, opt.append_series);
    int ticks = 60; /* 10 simulated minutes */
    for (int threads = 1; threads <= 2; threads++) {
        for (int rep = 0; rep < opt.reps; rep++) {
            vstate_t *vs = calloc(sy.n, sizeof(vstate_t));
            vstate_init(vs, sy.n);
            atomic_store(&sim_now, T0);
            storage_t *st = open_mem_store();
            storage_sample_t *batch = calloc(1000, sizeof(storage_sample_t));
            append_tick(st, &sy, vs, 0, sy.n, T0, batch); /* creates the series: not timed */
            free(batch);
            pthread_barrier_t bar;
            pthread_barrier_init(&bar, NULL, (unsigned)threads);
            appender_arg_t args[2];
            pthread_t th[2];
            double t0 = now_s();
            for (int k = 0; k < threads; k++) {
                args[k] = (appender_arg_t){
                    st,    &sy,  vs,    sy.n * (size_t)k / (size_t)threads, sy.n * (size_t)(k + 1) / (size_t)threads,
                    ticks, &bar, k == 0};
                pthread_create(&th[k], NULL, appender, &args[k]);
            }
            for (int k = 0; k < threads; k++)
                pthread_join(th[k], NULL);
            double dt = now_s() - t0;
            double total = (double)sy.n * ticks / dt;
            pthread_barrier_destroy(&bar);
            storage_close(st);
            free(vs);
            note("append %d thread(s) rep %d: %.2fM samples/s total (%.1f s)", threads, rep + 1, total / 1e6, dt);
            fig_add(threads == 1 ? "append, 1 thread (per core)" : "append, 2 threads (total)", "samples/s", "", total);
            if (threads == 2)
                fig_add("append, 2 threads (per core)", "samples/s", "", total / 2);
        }
    }
    synth_free(&sy);
}

/* ---- roll-ups ------------------------------------------------------------------------------ */

static long dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    long total = 0;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            total += sb.st_size;
    }
    closedir(d);
    return total;
}

static void rm_rf(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        note("could not remove %s", dir);
}

typedef struct {
    uint8_t *bytes;
    size_t len;
} rawchunk_t;

static void bench_rollup(void)
{
    size_t S = opt.rollup_series;
    synth_t sy;
    synth_build(&sy, S);
    const int64_t day = 86400 * 1000LL, span = 30 * day;
    int64_t end = (int64_t)time(NULL) * 1000 / (3600 * 1000LL) * (3600 * 1000LL);
    int64_t start = end - span;
    size_t per_series = (size_t)(span / TICK_MS);
    for (int rep = 0; rep < opt.reps; rep++) {
        char dir[600];
        snprintf(dir, sizeof(dir), "%s/rollup-%d", opt.workdir, rep);
        mkdir(dir, 0755);
        char err[256];
        catalog_t *cat = catalog_open(dir, err, sizeof(err));
        if (!cat) {
            note("catalog_open: %s", err);
            return;
        }
        rollup_config_t cfg = {.resolutions = NULL, .no_thread = true};
        rollup_t *r = rollup_open(cat, &cfg, err, sizeof(err));
        if (!r) {
            note("rollup_open: %s", err);
            catalog_close(cat);
            return;
        }
        for (size_t s = 0; s < S; s++)
            catalog_add_series(cat, s + 1, &sy.ls[s], start);
        catalog_flush(cat);
        vstate_t *vs = calloc(S, sizeof(vstate_t));
        vstate_init(vs, S);
        /* The raw equivalent: the same samples as 120-sample XOR chunks in memory. */
        size_t maxch = per_series / 120 + 2;
        rawchunk_t *raw = calloc(S * maxch, sizeof(rawchunk_t));
        size_t *nraw = calloc(S, sizeof(size_t));
        chunk_xor_appender_t *app = calloc(S, sizeof(chunk_xor_appender_t));
        for (size_t s = 0; s < S; s++)
            chunk_xor_appender_init(&app[s]);
        rollup_sample_t *batch = calloc(S, sizeof(rollup_sample_t));
        double t_add = 0, t_flush = 0;
        for (int64_t t = start; t < end; t += TICK_MS) {
            for (size_t s = 0; s < S; s++) {
                double v = vstate_next(&vs[s], s);
                batch[s] = (rollup_sample_t){s + 1, t, v};
                if (chunk_xor_num(&app[s]) == 120) {
                    size_t len;
                    const uint8_t *b = chunk_xor_bytes(&app[s], &len);
                    raw[s * maxch + nraw[s]].bytes = malloc(len);
                    memcpy(raw[s * maxch + nraw[s]].bytes, b, len);
                    raw[s * maxch + nraw[s]++].len = len;
                    chunk_xor_appender_free(&app[s]);
                    chunk_xor_appender_init(&app[s]);
                }
                chunk_xor_append(&app[s], t, v);
            }
            double a0 = now_s();
            rollup_add_samples(r, batch, S);
            t_add += now_s() - a0;
            if ((t - start) % (3600 * 1000LL) == 0 && t > start) {
                double f0 = now_s();
                rollup_close_buckets_before(r, t - 60 * 1000);
                rollup_flush(r, false);
                t_flush += now_s() - f0;
            }
        }
        for (size_t s = 0; s < S; s++) {
            size_t len;
            const uint8_t *b = chunk_xor_bytes(&app[s], &len);
            raw[s * maxch + nraw[s]].bytes = malloc(len);
            memcpy(raw[s * maxch + nraw[s]].bytes, b, len);
            raw[s * maxch + nraw[s]++].len = len;
            chunk_xor_appender_free(&app[s]);
        }
        double f0 = now_s();
        rollup_close_buckets_before(r, end + 3600 * 1000LL);
        rollup_flush(r, true);
        t_flush += now_s() - f0;
        rollup_stats_t rs;
        rollup_get_stats(r, &rs);
        double samples = (double)S * (double)per_series;
        note("rollup rep %d: %.0f samples in %.1f s add + %.1f s flush, %llu buckets", rep + 1, samples, t_add, t_flush,
             (unsigned long long)rs.buckets_written);
        fig_add("roll-up write (add + writer), 1 thread", "samples/s", "", samples / (t_add + t_flush));
        fig_add("roll-up writer", "buckets/s", "", (double)rs.buckets_written / t_flush);

        /* 30-day query: min, max and increase per series, from 1h roll-ups vs from raw. */
        const rollup_resolutions_t *res = rollup_resolutions(r);
        size_t ri = rollup_pick_resolution(res, end, start, 3600 * 1000LL);
        double q0 = now_s(), chk_roll = 0;
        size_t nb = 0;
        for (size_t s = 0; s < S; s++) {
            rollup_buckets_t out = {0};
            rollup_read(r, s + 1, ri, start, end, &out);
            double mn = INFINITY, mx = -INFINITY, inc = 0;
            for (size_t i = 0; i < out.n; i++) {
                mn = fmin(mn, out.v[i].min);
                mx = fmax(mx, out.v[i].max);
                inc += out.v[i].increase;
            }
            nb += out.n;
            chk_roll += mn + mx + inc;
            rollup_buckets_free(&out);
        }
        double t_roll = now_s() - q0;
        q0 = now_s();
        double chk_raw = 0;
        uint64_t nsamp = 0;
        for (size_t s = 0; s < S; s++) {
            double mn = INFINITY, mx = -INFINITY, inc = 0, prev = NAN;
            for (size_t c = 0; c < nraw[s]; c++) {
                chunk_xor_iter_t it;
                chunk_xor_iter_init(&it, raw[s * maxch + c].bytes, raw[s * maxch + c].len);
                int64_t t;
                double v;
                while (chunk_xor_iter_next(&it, &t, &v)) {
                    mn = fmin(mn, v);
                    mx = fmax(mx, v);
                    if (!isnan(prev))
                        inc += v >= prev ? v - prev : v;
                    prev = v;
                    nsamp++;
                }
            }
            chk_raw += mn + mx + inc;
        }
        double t_raw = now_s() - q0;
        note("30-day query rep %d: roll-ups %.2f ms (%zu buckets, resolution %lld s), raw %.1f ms (%llu samples); "
             "checksums %.6g vs %.6g",
             rep + 1, t_roll * 1e3, nb, (long long)(res->v[ri].res_ms / 1000), t_raw * 1e3, (unsigned long long)nsamp,
             chk_roll, chk_raw);
        fig_add("30-day query (min/max/increase per series) from roll-ups", "ms", "", t_roll * 1e3);
        fig_add("30-day query, same over raw XOR chunks in memory", "ms", "", t_raw * 1e3);
        fig_add("30-day query speed-up, roll-ups vs raw", "x", ">= 20", t_raw / t_roll);
        rollup_close(r);
        catalog_close(cat);
        long disk = dir_bytes(dir);
        fig_add("roll-up disk bytes per bucket (all files / buckets)", "bytes", "<= 8",
                (double)disk / (double)rs.buckets_written);
        for (size_t i = 0; i < S * maxch; i++)
            free(raw[i].bytes);
        free(raw);
        free(nraw);
        free(app);
        free(batch);
        free(vs);
        rm_rf(dir);
    }
    synth_free(&sy);
}

/* ---- peers: remote write into VictoriaMetrics and Prometheus -------------------------------- */

static void pb_varint(buf_t *b, uint64_t v)
{
    char tmp[10];
    size_t n = 0;
    while (v >= 0x80) {
        tmp[n++] = (char)(v | 0x80);
        v >>= 7;
    }
    tmp[n++] = (char)v;
    buf_append(b, tmp, n);
}

static void pb_bytes(buf_t *b, unsigned field, const void *p, size_t n)
{
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, n);
    buf_append(b, p, n);
}

/* prometheus.WriteRequest { repeated TimeSeries timeseries = 1; }
 * TimeSeries { repeated Label labels = 1; repeated Sample samples = 2; }
 * Label { string name = 1; string value = 2; }  Sample { double value = 1; int64 timestamp = 2; } */
static void pb_timeseries(buf_t *out, const labels_t *ls, const int64_t *ts, const double *vs, size_t n)
{
    buf_t ts_b = BUF_INIT, tmp = BUF_INIT;
    for (size_t i = 0; i < ls->n; i++) {
        buf_reset(&tmp);
        pb_bytes(&tmp, 1, ls->v[i].name, strlen(ls->v[i].name));
        pb_bytes(&tmp, 2, ls->v[i].value, strlen(ls->v[i].value));
        pb_bytes(&ts_b, 1, tmp.data, tmp.len);
    }
    for (size_t i = 0; i < n; i++) {
        buf_reset(&tmp);
        pb_varint(&tmp, 1 << 3 | 1);
        uint64_t bits;
        memcpy(&bits, &vs[i], 8);
        char le[8];
        for (int k = 0; k < 8; k++)
            le[k] = (char)(bits >> (8 * k));
        buf_append(&tmp, le, 8);
        pb_varint(&tmp, 2 << 3 | 0);
        pb_varint(&tmp, (uint64_t)ts[i]);
        pb_bytes(&ts_b, 2, tmp.data, tmp.len);
    }
    pb_bytes(out, 1, ts_b.data, ts_b.len);
    buf_free(&ts_b);
    buf_free(&tmp);
}

/* One HTTP/1.1 request to 127.0.0.1:port; returns the status code or -1. */
static int http_req(int port, const char *method, const char *path, const char *hdrs, const void *body, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    char head[1024];
    int hn = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %zu\r\nConnection: close\r\n\r\n", method,
                      path, hdrs ? hdrs : "", len);
    const char *parts[2] = {head, body};
    size_t lens[2] = {(size_t)hn, len};
    for (int k = 0; k < 2; k++)
        for (size_t off = 0; off < lens[k];) {
            ssize_t w = write(fd, parts[k] + off, lens[k] - off);
            if (w <= 0) {
                close(fd);
                return -1;
            }
            off += (size_t)w;
        }
    char resp[4096];
    size_t got = 0;
    ssize_t r;
    while ((r = read(fd, resp + got, sizeof(resp) - 1 - got)) > 0) {
        got += (size_t)r;
        if (got == sizeof(resp) - 1)
            got = 64; /* keep the status line, drain the rest */
    }
    close(fd);
    resp[got] = 0;
    int code = -1;
    if (sscanf(resp, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    return code;
}

typedef struct {
    const char *name;
    pid_t pid;
    int port;
    const char *write_path;
    const char *ready_path;
    const char *flush_path;
} peer_t;

static pid_t spawn(char *const argv[], const char *logpath)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setpgid(0, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static bool wait_ready(peer_t *p, double timeout)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout) {
        if (http_req(p->port, "GET", p->ready_path, NULL, "", 0) == 200)
            return true;
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            return false;
        }
        usleep(200 * 1000);
    }
    return false;
}

static void stop_peer(peer_t *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            return;
        }
        usleep(100 * 1000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

/* Sends P series x 2h ending at end_ms: windows of 30 samples per series, 2,000 series per
 * request. Returns samples sent, or -1. */
static long feed_remote_write(peer_t *p, const synth_t *sy, size_t P, int64_t end_ms)
{
    vstate_t *vs = calloc(P, sizeof(vstate_t));
    vstate_init(vs, P);
    const size_t W = 30, per_req = 2000, ticks = (size_t)(RETENTION_MS / TICK_MS);
    int64_t start = end_ms - (int64_t)ticks * TICK_MS;
    int64_t ts[30];
    double *vals = calloc(P * W, sizeof(double));
    buf_t req = BUF_INIT;
    size_t cap = 0;
    char *comp = NULL;
    long sent = 0;
    for (size_t w0 = 0; w0 < ticks; w0 += W) {
        size_t nw = ticks - w0 < W ? ticks - w0 : W;
        for (size_t i = 0; i < nw; i++) {
            ts[i] = start + (int64_t)(w0 + i) * TICK_MS;
            for (size_t s = 0; s < P; s++)
                vals[s * W + i] = vstate_next(&vs[s], s);
        }
        for (size_t s0 = 0; s0 < P; s0 += per_req) {
            buf_reset(&req);
            size_t s1 = s0 + per_req < P ? s0 + per_req : P;
            for (size_t s = s0; s < s1; s++)
                pb_timeseries(&req, &sy->ls[s], ts, &vals[s * W], nw);
            size_t clen = snappy_max_compressed_length(req.len);
            if (clen > cap) {
                free(comp);
                comp = malloc(clen);
                cap = clen;
            }
            if (snappy_compress(req.data, req.len, comp, &clen) != SNAPPY_OK)
                goto fail;
            int code = http_req(p->port, "POST", p->write_path,
                                "Content-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\n"
                                "X-Prometheus-Remote-Write-Version: 0.1.0\r\n",
                                comp, clen);
            if (code < 200 || code >= 300) {
                note("%s: remote write answered %d", p->name, code);
                goto fail;
            }
            sent += (long)((s1 - s0) * nw);
        }
    }
    free(vals);
    free(vs);
    free(comp);
    buf_free(&req);
    return sent;
fail:
    free(vals);
    free(vs);
    free(comp);
    buf_free(&req);
    return -1;
}

static void bench_peers(void)
{
    size_t P = opt.peer_series;
    synth_t sy;
    synth_build(&sy, P);
    int64_t end = (int64_t)time(NULL) * 1000 / 1000 * 1000;
    for (int which = 0; which < 2; which++) {
        for (int rep = 0; rep < opt.reps; rep++) {
            char dir[600], logp[700], cfg[700], a1[800], a2[64], a3[800];
            snprintf(dir, sizeof(dir), "%s/peer-%d-%d", opt.workdir, which, rep);
            mkdir(dir, 0755);
            snprintf(logp, sizeof(logp), "%s.log", dir);
            peer_t p = {0};
            p.port = 19400 + which * 10 + rep + (int)(getpid() % 50) * 20;
            if (which == 0) {
                p = (peer_t){"victoria-metrics", 0, p.port, "/api/v1/write", "/health", "/internal/force_flush"};
                snprintf(a1, sizeof(a1), "-httpListenAddr=127.0.0.1:%d", p.port);
                snprintf(a3, sizeof(a3), "-storageDataPath=%s", dir);
                char *argv[] = {"/usr/bin/victoria-metrics", a1, a3, "-loggerLevel=ERROR", NULL};
                if (access(argv[0], X_OK) != 0) {
                    note("no %s: skipped", argv[0]);
                    break;
                }
                p.pid = spawn(argv, logp);
            } else {
                p = (peer_t){"prometheus", 0, p.port, "/api/v1/write", "/-/ready", NULL};
                snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", dir);
                FILE *f = fopen(cfg, "w");
                if (f) {
                    fputs("global:\n  scrape_interval: 1h\nscrape_configs: []\n", f);
                    fclose(f);
                }
                snprintf(a1, sizeof(a1), "--config.file=%s", cfg);
                snprintf(a2, sizeof(a2), "--web.listen-address=127.0.0.1:%d", p.port);
                snprintf(a3, sizeof(a3), "--storage.tsdb.path=%s/data", dir);
                char *argv[] = {"/usr/bin/prometheus", a1,  a2, a3, "--web.enable-remote-write-receiver",
                                "--log.level=error",   NULL};
                if (access(argv[0], X_OK) != 0) {
                    note("no %s: skipped", argv[0]);
                    break;
                }
                p.pid = spawn(argv, logp);
            }
            if (p.pid <= 0 || !wait_ready(&p, 60)) {
                note("%s did not become ready (log: %s)", p.name, logp);
                stop_peer(&p);
                continue;
            }
            sleep(2);
            long idle = rss_bytes_of(p.pid);
            double t0 = now_s();
            long sent = feed_remote_write(&p, &sy, P, end);
            double dt = now_s() - t0;
            if (p.flush_path)
                http_req(p.port, "GET", p.flush_path, NULL, "", 0);
            sleep(5);
            long rss = rss_bytes_of(p.pid);
            stop_peer(&p);
            rm_rf(dir);
            unlink(logp);
            if (sent < 0)
                continue;
            note("%s rep %d: idle RSS %.1f MB, after %ld samples %.1f MB: %.0f B/series (ingest %.2f s, %.2fM "
                 "samples/s)",
                 p.name, rep + 1, idle / 1e6, sent, rss / 1e6, (double)(rss - idle) / (double)P, dt, sent / dt / 1e6);
            char name[96];
            snprintf(name, sizeof(name), "%s %zuk series: RSS per series (over idle)", p.name, P / 1000);
            fig_add(name, "bytes", "", (double)(rss - idle) / (double)P);
            snprintf(name, sizeof(name), "%s: remote-write ingest (whole process)", p.name);
            fig_add(name, "samples/s", "", sent / dt);
        }
    }
    synth_free(&sy);
    /* Ours for the same series count, for the side-by-side line. */
    size_t keep = opt.series;
    opt.series = P;
    for (int rep = 0; rep < opt.reps; rep++) {
        memres_t r;
        if (run_child(mem_synthetic_child, NULL, false, &r) == 0) {
            char name[96];
            snprintf(name, sizeof(name), "sluice %zuk series: RSS per series (2h07m held)", P / 1000);
            fig_add(name, "bytes", "<= 1024", r.rss_per_series);
        }
    }
    opt.series = keep;
}

/* ---- main ---------------------------------------------------------------------------------- */

/* ---- the roll-up writer at the real cadence ---------------------------------------------------- */

/* Bytes this process passed to write(2) and friends so far (/proc/self/io wchar), -1 unknown. */
static long long wchar_self(void)
{
    FILE *f = fopen("/proc/self/io", "r");
    if (!f)
        return -1;
    char k[64];
    long long v, w = -1;
    while (fscanf(f, "%63s %lld", k, &v) == 2)
        if (strcmp(k, "wchar:") == 0)
            w = v;
    fclose(f);
    return w;
}

static double cpu_self_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void bench_writer(void)
{
    const size_t S = opt.writer_series;
    const int64_t window = 30 * 60000LL, end_ms = (int64_t)(opt.writer_hours * 3600 * 1000);
    const double scale = 256400.0 / (double)S; /* to the push bench's fleet */
    synth_t sy;
    synth_build(&sy, S);
    rollup_sample_t *batch = calloc(S, sizeof(*batch));
    vstate_t *vs = calloc(S, sizeof(*vs));
    for (int rep = 0; rep < opt.reps; rep++) {
        char dir[600], err[256];
        snprintf(dir, sizeof(dir), "%s/writer-%d", opt.workdir, rep);
        mkdir(dir, 0755);
        catalog_t *cat = catalog_open(dir, err, sizeof(err));
        rollup_config_t cfg = {.resolutions = NULL, .no_thread = true};
        rollup_t *r = cat ? rollup_open(cat, &cfg, err, sizeof(err)) : NULL;
        if (!r) {
            note("writer: %s", err);
            if (cat)
                catalog_close(cat);
            break;
        }
        /* An hour boundary, like a server started at some point of a 1m blob's 4-hour span. */
        const int64_t t0 = (int64_t)time(NULL) * 1000 / 3600000 * 3600000;
        for (size_t s = 0; s < S; s++)
            catalog_add_series(cat, s + 1, &sy.ls[s], t0);
        catalog_flush(cat);
        vstate_init(vs, S);
        if (rep == 0)
            printf("\nroll-up writer, %zu series at 10 s, one cycle per 10 s; per simulated minute, scaled to 256k "
                   "series:\n  %-14s %12s %14s\n",
                   S, "hours", "CPU s", "MiB written");
        double c0 = cpu_self_s(), cstart = c0, cmax = 0, wmax = 0;
        long long w0 = wchar_self(), wstart = w0;
        for (int64_t t = 0; t < end_ms; t += TICK_MS) {
            for (size_t s = 0; s < S; s++)
                batch[s] = (rollup_sample_t){s + 1, t0 + t, vstate_next(&vs[s], s)};
            rollup_add_samples(r, batch, S);
            rollup_flush(r, t % 60000 == 0);
            if ((t + TICK_MS) % window == 0) {
                double c = cpu_self_s(), cpm = (c - c0) / 30 * scale;
                long long w = wchar_self();
                double mpm = (double)(w - w0) / 30 / 1048576 * scale;
                if (rep == 0)
                    printf("  %5.1f - %5.1f %12.2f %14.1f\n", (double)(t + TICK_MS - window) / 3.6e6,
                           (double)(t + TICK_MS) / 3.6e6, cpm, mpm);
                cmax = cpm > cmax ? cpm : cmax;
                wmax = mpm > wmax ? mpm : wmax;
                c0 = c;
                w0 = w;
            }
        }
        /* Then what a dashboard panel over every series asks of them: all of their 1m buckets,
         * through one reader, twice (the first read comes right after the writer's commit). */
        for (int pass = 0; pass < 2; pass++) {
            rollup_reader_t *rd = rollup_reader_open(r);
            rollup_buckets_t out = {0};
            size_t nb = 0;
            double q0 = now_s();
            for (size_t s = 0; s < S && rd; s++) {
                out.n = 0;
                rollup_reader_read(rd, s + 1, 0, t0, t0 + end_ms, &out);
                nb += out.n;
            }
            double us = (now_s() - q0) / (double)S * 1e6;
            rollup_buckets_free(&out);
            rollup_reader_close(rd);
            if (rep == 0)
                printf("  read of every series' 1m buckets, pass %d: %.1f us per series (%.0f buckets each)\n",
                       pass + 1, us, (double)nb / (double)S);
            fig_add(pass ? "roll-up read, every series' 1m buckets, again" : "roll-up read, every series' 1m buckets",
                    "us/series", "", us);
        }
        double minutes = (double)end_ms / 60000;
        fig_add("roll-up writer CPU per minute, 256k series (mean)", "s", "", (cpu_self_s() - cstart) / minutes * scale);
        fig_add("roll-up writer CPU per minute, 256k series (worst 30 min)", "s", "", cmax);
        fig_add("roll-up writer writes per minute, 256k series (mean)", "MiB", "",
                (double)(wchar_self() - wstart) / minutes / 1048576 * scale);
        fig_add("roll-up writer writes per minute, 256k series (worst 30 min)", "MiB", "", wmax);
        rollup_close(r);
        catalog_close(cat);
    }
    free(batch);
    free(vs);
    synth_free(&sy);
}

/* Timings on a shared 2-core machine mean little without the load next to them. */
static void print_loadavg(const char *when)
{
    char line[128] = "";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(line, sizeof(line), f))
            line[0] = 0;
        fclose(f);
    }
    line[strcspn(line, "\n")] = 0;
    printf("load average at %s: %s\n", when, line);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: see the top of bench/storage_bench.c\n");
            return 2;
        }
        if (strcmp(a, "--series") == 0)
            opt.series = strtoull(v, NULL, 10);
        else if (strcmp(a, "--append-series") == 0)
            opt.append_series = strtoull(v, NULL, 10);
        else if (strcmp(a, "--flink-tms") == 0)
            opt.flink_tms = strtoull(v, NULL, 10);
        else if (strcmp(a, "--peer-series") == 0)
            opt.peer_series = strtoull(v, NULL, 10);
        else if (strcmp(a, "--rollup-series") == 0)
            opt.rollup_series = strtoull(v, NULL, 10);
        else if (strcmp(a, "--writer-series") == 0)
            opt.writer_series = strtoull(v, NULL, 10);
        else if (strcmp(a, "--writer-hours") == 0)
            opt.writer_hours = atof(v);
        else if (strcmp(a, "--reps") == 0)
            opt.reps = atoi(v) < 1 ? 1 : atoi(v) > MAXREP ? MAXREP : atoi(v);
        else if (strcmp(a, "--sections") == 0)
            opt.sections = v;
        else if (strcmp(a, "--workdir") == 0)
            snprintf(opt.workdir, sizeof(opt.workdir), "%s", v);
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!opt.workdir[0]) {
        snprintf(opt.workdir, sizeof(opt.workdir), "/tmp/sluice-bench-XXXXXX");
        if (!mkdtemp(opt.workdir)) {
            perror("mkdtemp");
            return 1;
        }
    } else {
        mkdir(opt.workdir, 0755);
    }
    signal(SIGPIPE, SIG_IGN);
    double t0 = now_s();
    printf("storage_bench: series=%zu append_series=%zu flink_tms=%zu peer_series=%zu rollup_series=%zu reps=%d "
           "sections=%s\n",
           opt.series, opt.append_series, opt.flink_tms, opt.peer_series, opt.rollup_series, opt.reps, opt.sections);
    print_loadavg("start");
    fflush(stdout);
    if (section("mem") || section("scan"))
        bench_mem();
    if (section("append"))
        bench_append();
    if (section("rollup"))
        bench_rollup();
    if (section("writer"))
        bench_writer();
    if (section("peers"))
        bench_peers();
    print_table();
    printf("\n(total %.0f s; medians of %d runs)\n", now_s() - t0, opt.reps);
    print_loadavg("end");
    rm_rf(opt.workdir);
    return 0;
}
