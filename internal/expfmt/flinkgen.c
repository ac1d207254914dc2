/*
 * flinkgen — Flink TaskManager push bodies; see flinkgen.h.
 *
 * Body shape (simpleclient 0.8.1 TextFormat.write004, one collector per metric name):
 *
 *   # HELP flink_taskmanager_job_task_operator_numRecordsIn numRecordsIn (scope: taskmanager_job_task_operator)
 *   # TYPE flink_taskmanager_job_task_operator_numRecordsIn gauge
 *   flink_taskmanager_job_task_operator_numRecordsIn{host="...",tm_id="...",...,operator_name="Map",} 1234.0
 *
 * simpleclient 0.8.1 ends every label list with a comma ("...,subtask_index=\"3\",}"), which the
 * 0.0.4 grammar allows; Flink's label values are filtered to [a-zA-Z0-9:_] (other characters
 * become '_'), so no escapes occur. Metric table entries are "Group.Sub.metric": the family name
 * joins scope and all parts with '_', HELP names the last part and the scope with the groups.
 */
#include "internal/expfmt/flinkgen.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { V_COUNTER, V_RATE, V_RATIO, V_BOOL, V_MSPS, V_MSPS_NAN, V_MEM, V_WATERMARK, V_SMALL, V_HIST };

typedef struct {
    const char *name;
    int kind;
} metric_t;

static const metric_t tm_metrics[] = {
    {"Status.JVM.CPU.Load", V_RATIO},
    {"Status.JVM.CPU.Time", V_COUNTER},
    {"Status.JVM.Memory.Heap.Used", V_MEM},
    {"Status.JVM.Memory.Heap.Committed", V_MEM},
    {"Status.JVM.Memory.Heap.Max", V_MEM},
    {"Status.JVM.Memory.NonHeap.Used", V_MEM},
    {"Status.JVM.Memory.NonHeap.Committed", V_MEM},
    {"Status.JVM.Memory.NonHeap.Max", V_MEM},
    {"Status.JVM.Memory.Metaspace.Used", V_MEM},
    {"Status.JVM.Memory.Metaspace.Committed", V_MEM},
    {"Status.JVM.Memory.Metaspace.Max", V_MEM},
    {"Status.JVM.Memory.Direct.Count", V_SMALL},
    {"Status.JVM.Memory.Direct.MemoryUsed", V_MEM},
    {"Status.JVM.Memory.Direct.TotalCapacity", V_MEM},
    {"Status.JVM.Memory.Mapped.Count", V_SMALL},
    {"Status.JVM.Memory.Mapped.MemoryUsed", V_MEM},
    {"Status.JVM.Memory.Mapped.TotalCapacity", V_MEM},
    {"Status.JVM.Threads.Count", V_SMALL},
    {"Status.JVM.ClassLoader.ClassesLoaded", V_COUNTER},
    {"Status.JVM.ClassLoader.ClassesUnloaded", V_SMALL},
    {"Status.JVM.GarbageCollector.G1_Young_Generation.Count", V_COUNTER},
    {"Status.JVM.GarbageCollector.G1_Young_Generation.Time", V_COUNTER},
    {"Status.JVM.GarbageCollector.G1_Old_Generation.Count", V_SMALL},
    {"Status.JVM.GarbageCollector.G1_Old_Generation.Time", V_SMALL},
    {"Status.Network.AvailableMemorySegments", V_SMALL},
    {"Status.Network.TotalMemorySegments", V_SMALL},
    {"Status.Shuffle.Netty.AvailableMemorySegments", V_SMALL},
    {"Status.Shuffle.Netty.UsedMemorySegments", V_SMALL},
    {"Status.Shuffle.Netty.TotalMemorySegments", V_SMALL},
    {"Status.Shuffle.Netty.AvailableMemory", V_MEM},
    {"Status.Shuffle.Netty.UsedMemory", V_MEM},
    {"Status.Shuffle.Netty.TotalMemory", V_MEM},
    {"Status.Flink.Memory.Managed.Used", V_MEM},
    {"Status.Flink.Memory.Managed.Total", V_MEM},
};

static const metric_t task_metrics[] = {
    {"numRecordsIn", V_COUNTER},
    {"numRecordsOut", V_COUNTER},
    {"numRecordsInPerSecond", V_RATE},
    {"numRecordsOutPerSecond", V_RATE},
    {"numBytesIn", V_COUNTER},
    {"numBytesOut", V_COUNTER},
    {"numBytesInPerSecond", V_RATE},
    {"numBytesOutPerSecond", V_RATE},
    {"numBytesInLocal", V_COUNTER},
    {"numBytesInRemote", V_COUNTER},
    {"numBuffersInLocal", V_COUNTER},
    {"numBuffersInRemote", V_COUNTER},
    {"numBuffersOut", V_COUNTER},
    {"isBackPressured", V_BOOL},
    {"backPressuredTimeMsPerSecond", V_MSPS},
    {"softBackPressuredTimeMsPerSecond", V_MSPS},
    {"hardBackPressuredTimeMsPerSecond", V_MSPS},
    {"busyTimeMsPerSecond", V_MSPS_NAN},
    {"idleTimeMsPerSecond", V_MSPS},
    {"buffers.inPoolUsage", V_RATIO},
    {"buffers.outPoolUsage", V_RATIO},
    {"buffers.inputQueueLength", V_SMALL},
    {"buffers.outputQueueLength", V_SMALL},
    {"buffers.inputFloatingBuffersUsage", V_RATIO},
    {"buffers.inputExclusiveBuffersUsage", V_RATIO},
    {"Shuffle.Netty.Input.Buffers.inPoolUsage", V_RATIO},
    {"Shuffle.Netty.Output.Buffers.outPoolUsage", V_RATIO},
    {"checkpointAlignmentTime", V_SMALL},
    {"checkpointStartDelayNanos", V_MEM},
    {"mailboxMailsPerSecond", V_RATE},
    {"mailboxQueueSize", V_SMALL},
    {"mailboxLatencyMs", V_HIST},
};

static const metric_t op_metrics[] = {
    {"numRecordsIn", V_COUNTER},        {"numRecordsOut", V_COUNTER},           {"numRecordsInPerSecond", V_RATE},
    {"numRecordsOutPerSecond", V_RATE}, {"currentInputWatermark", V_WATERMARK}, {"currentOutputWatermark", V_WATERMARK},
    {"numLateRecordsDropped", V_SMALL}, {"watermarkAlignmentDrift", V_SMALL},   {"processingLatencyMs", V_HIST},
    {"stateAccessLatencyNs", V_HIST},
};

static const char *const quantiles[] = {"0.5", "0.75", "0.95", "0.98", "0.99", "0.999"};
static const double qv[] = {0.5, 0.75, 0.95, 0.98, 0.99, 0.999};

#define NTASKS 2
#define NSUB 6 /* per task: 12 subtasks per TaskManager */
#define NOPS 3

static const char *const task_names[NTASKS] = {"Source:_Kafka_Orders____Map____Filter",
                                               "Window_TumblingEventTimeWindows____Sink:_Kafka_Enriched"};
static const char *const op_names[NTASKS][NOPS] = {{"Source:_Kafka_Orders", "Map", "Filter"},
                                                   {"Window_TumblingEventTimeWindows_", "Map", "Sink:_Kafka_Enriched"}};

/* ------------------------------------------------------------------------ helpers */

static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static void hex32(char out[33], uint64_t a)
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)mix(a), (unsigned long long)mix(a ^ 0x5555));
}

/* Java's Double.toString (as simpleclient prints gauges), with Go's spellings of NaN/Inf
 * (simpleclient's doubleToGoString). */
static void java_double(buf_t *b, double v)
{
    if (isnan(v)) {
        buf_puts(b, "NaN");
        return;
    }
    if (isinf(v)) {
        buf_puts(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == 0) {
        buf_puts(b, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    if (*p == '-') {
        buf_putc(b, '-');
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    double a = fabs(v);
    if (a >= 1e-3 && a < 1e7) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                buf_putc(b, (size_t)i < nd ? digits[i] : '0');
            buf_putc(b, '.');
            if ((size_t)exp + 1 < nd)
                buf_append(b, digits + exp + 1, nd - (size_t)exp - 1);
            else
                buf_putc(b, '0');
        } else {
            buf_puts(b, "0.");
            for (int i = 0; i < -exp - 1; i++)
                buf_putc(b, '0');
            buf_append(b, digits, nd);
        }
        return;
    }
    buf_putc(b, digits[0]);
    buf_putc(b, '.');
    if (nd > 1)
        buf_append(b, digits + 1, nd - 1);
    else
        buf_putc(b, '0');
    buf_printf(b, "E%d", exp);
}

static double value(int kind, uint64_t id, uint64_t tick)
{
    uint64_t h = mix(id);
    uint64_t r = mix(h ^ (tick * UINT64_C(0x9e3779b97f4a7c15)));
    double u = (double)(r >> 11) / 9007199254740992.0; /* [0,1) per tick */
    switch (kind) {
    case V_COUNTER: return (double)(h % 1000000 + tick * (1 + h % 5000) + r % 100);
    case V_RATE: return (double)(h % 20000) / 7.0 * (0.8 + 0.4 * u);
    case V_RATIO: return u;
    case V_BOOL: return (r % 10) == 0 ? 1 : 0;
    case V_MSPS: return (double)(r % 1001);
    case V_MSPS_NAN: return (r % 17) == 0 ? NAN : (double)(r % 1001);
    case V_MEM: return (double)((h % 4000 + 100) * 1048576 + r % 1048576);
    case V_WATERMARK: return (double)(UINT64_C(1700000000000) + tick * 10000 + h % 5000);
    case V_SMALL: return (double)(h % 200 + (r % 3));
    default: return u;
    }
}

typedef struct {
    buf_t *b;
    const char *host, *tm_id, *job_id, *job_name;
    unsigned tm;
    uint64_t seed, tick;
    size_t series;
} gen_t;

/* Writes "# HELP <fam> <metric> (scope: <scope>)\n# TYPE <fam> gauge|summary\n" and returns the
 * family name (in fam[]). */
static void header(gen_t *g, const char *scope, const char *metric, bool summary, char *fam, size_t famlen)
{
    const char *last = strrchr(metric, '.');
    int n = snprintf(fam, famlen, "flink_%s_%s", scope, metric);
    for (int i = 0; i < n && (size_t)i < famlen; i++)
        if (fam[i] == '.')
            fam[i] = '_';
    char groups[128] = "";
    if (last) {
        snprintf(groups, sizeof(groups), "_%.*s", (int)(last - metric), metric);
        for (char *c = groups; *c; c++)
            if (*c == '.')
                *c = '_';
    }
    buf_printf(g->b, "# HELP %s %s (scope: %s%s)\n# TYPE %s %s\n", fam, last ? last + 1 : metric, scope, groups, fam,
               summary ? "summary" : "gauge");
}

static void labels_tm(gen_t *g)
{
    buf_printf(g->b, "{host=\"%s\",tm_id=\"%s\",", g->host, g->tm_id);
}

static void labels_task(gen_t *g, unsigned task, unsigned sub)
{
    char task_id[33], attempt[33];
    hex32(task_id, g->seed * 131 + task + 7);
    hex32(attempt, g->seed * 977 + (uint64_t)g->tm * 1000 + task * 100 + sub);
    buf_printf(g->b,
               "{host=\"%s\",tm_id=\"%s\",job_id=\"%s\",job_name=\"%s\",task_id=\"%s\",task_name=\"%s\","
               "task_attempt_id=\"%s\",task_attempt_num=\"0\",subtask_index=\"%u\",",
               g->host, g->tm_id, g->job_id, g->job_name, task_id, task_names[task], attempt, g->tm * NSUB + sub);
}

static void labels_op(gen_t *g, unsigned task, unsigned sub, unsigned op)
{
    char op_id[33];
    hex32(op_id, g->seed * 733 + task * 10 + op);
    labels_task(g, task, sub);
    buf_printf(g->b, "operator_id=\"%s\",operator_name=\"%s\",", op_id, op_names[task][op]);
}

/* One child of a family: a gauge line, or the quantile lines and _count of a summary. */
static void child(gen_t *g, const char *fam, int kind, uint64_t id, int scope, unsigned task, unsigned sub, unsigned op)
{
    buf_t *b = g->b;
    if (kind != V_HIST) {
        buf_puts(b, fam);
        if (scope == 0)
            labels_tm(g);
        else if (scope == 1)
            labels_task(g, task, sub);
        else
            labels_op(g, task, sub, op);
        buf_puts(b, "} ");
        java_double(b, value(kind, id, g->tick));
        buf_putc(b, '\n');
        g->series++;
        return;
    }
    double base = (double)(mix(id) % 50 + 1);
    for (size_t q = 0; q < 6; q++) {
        buf_puts(b, fam);
        if (scope == 1)
            labels_task(g, task, sub);
        else
            labels_op(g, task, sub, op);
        buf_printf(b, "quantile=\"%s\",} ", quantiles[q]);
        java_double(b, base * (1 + 10 * qv[q] * qv[q]) * (0.9 + 0.2 * value(V_RATIO, id, g->tick)));
        buf_putc(b, '\n');
    }
    buf_puts(b, fam);
    buf_puts(b, "_count");
    if (scope == 1)
        labels_task(g, task, sub);
    else
        labels_op(g, task, sub, op);
    buf_puts(b, "} ");
    java_double(b, value(V_COUNTER, id, g->tick));
    buf_putc(b, '\n');
    g->series += 7;
}

void flinkgen_job_name(char *out, size_t outlen, unsigned tm, uint64_t seed)
{
    char h[33];
    hex32(h, seed * 1000003 + tm);
    snprintf(out, outlen, "flink_tm%s", h);
}

size_t flinkgen_taskmanager(buf_t *b, unsigned tm, uint64_t seed, uint64_t tick)
{
    char host[64], tm_id[96], job_id[33], fam[256];
    snprintf(host, sizeof(host), "flink_taskmanager_%u", tm);
    snprintf(tm_id, sizeof(tm_id), "container_e05_1700000000000_%04llu_01_%06u", (unsigned long long)(seed % 10000),
             tm + 2);
    hex32(job_id, seed * 31 + 1);
    gen_t g = {b, host, tm_id, job_id, "order_enrichment", tm, seed, tick, 0};
    uint64_t fid = 0;
    for (size_t m = 0; m < sizeof(tm_metrics) / sizeof(tm_metrics[0]); m++, fid++) {
        header(&g, "taskmanager", tm_metrics[m].name, false, fam, sizeof(fam));
        child(&g, fam, tm_metrics[m].kind, mix(fid) ^ tm, 0, 0, 0, 0);
    }
    for (size_t m = 0; m < sizeof(task_metrics) / sizeof(task_metrics[0]); m++, fid++) {
        header(&g, "taskmanager_job_task", task_metrics[m].name, task_metrics[m].kind == V_HIST, fam, sizeof(fam));
        for (unsigned t = 0; t < NTASKS; t++)
            for (unsigned s = 0; s < NSUB; s++)
                child(&g, fam, task_metrics[m].kind, mix(fid) ^ ((uint64_t)tm << 20 | t << 8 | s), 1, t, s, 0);
    }
    for (size_t m = 0; m < sizeof(op_metrics) / sizeof(op_metrics[0]); m++, fid++) {
        header(&g, "taskmanager_job_task_operator", op_metrics[m].name, op_metrics[m].kind == V_HIST, fam, sizeof(fam));
        for (unsigned t = 0; t < NTASKS; t++)
            for (unsigned s = 0; s < NSUB; s++)
                for (unsigned o = 0; o < NOPS; o++)
                    child(&g, fam, op_metrics[m].kind, mix(fid) ^ ((uint64_t)tm << 20 | t << 12 | s << 4 | o), 2, t, s,
                          o);
    }
    return g.series;
}

/* ------------------------------------------------------------------------ operations scenario */

enum { OPS_SUB = 2 }; /* subtasks per task per TaskManager: a job runs with parallelism 4 */

static const char *const ops_job_names[FLINKGEN_OPS_JOBS] = {"orders", "clicks"};
static const double ops_base_rate[FLINKGEN_OPS_JOBS] = {1000, 400};                /* records/s per subtask */
static const double ops_base_state[FLINKGEN_OPS_JOBS] = {536870912.0, 134217728.0}; /* checkpoint bytes */
static const char *const ops_task_names[FLINKGEN_OPS_JOBS][2] = {
    {"Source:_Kafka_Orders____Map", "Window_TumblingEventTimeWindows____Sink:_Orders_Enriched"},
    {"Source:_Kafka_Clicks____Filter", "Window_SlidingEventTimeWindows____Sink:_Click_Counts"}};
static const char *const ops_op_names[FLINKGEN_OPS_JOBS][2][2] = {
    {{"Source:_Kafka_Orders", "Map"}, {"Window_TumblingEventTimeWindows", "Sink:_Orders_Enriched"}},
    {{"Source:_Kafka_Clicks", "Filter"}, {"Window_SlidingEventTimeWindows", "Sink:_Click_Counts"}}};
static const char *const ops_kind_names[] = {"checkpoint_slow", "state_leak", "lag",    "gc",
                                             "stall",           "surge",      "restart"};

int flinkgen_incident_parse(const char *s, flinkgen_incident_t *out, char *err, size_t errlen)
{
    char kind[32], job[32];
    unsigned long long from, to;
    int n = 0;
    if (sscanf(s, "%31[a-z_]:%31[a-z]:%llu:%llu%n", kind, job, &from, &to, &n) != 4 || s[n] != '\0' || from > to) {
        snprintf(err, errlen, "incident %s: want kind:job:from:to with from <= to", s);
        return -1;
    }
    memset(out, 0, sizeof(*out));
    size_t k = 0;
    for (; k < sizeof(ops_kind_names) / sizeof(ops_kind_names[0]); k++)
        if (strcmp(kind, ops_kind_names[k]) == 0)
            break;
    if (k == sizeof(ops_kind_names) / sizeof(ops_kind_names[0])) {
        snprintf(err, errlen, "incident %s: unknown kind %s", s, kind);
        return -1;
    }
    unsigned j = 0;
    for (; j < FLINKGEN_OPS_JOBS; j++)
        if (strcmp(job, ops_job_names[j]) == 0)
            break;
    if (j == FLINKGEN_OPS_JOBS) {
        snprintf(err, errlen, "incident %s: unknown job %s (orders or clicks)", s, job);
        return -1;
    }
    out->kind = (flinkgen_incident_kind_t)k;
    out->job = j;
    out->from = from;
    out->to = to;
    return 0;
}

/* [0,1), deterministic in (seed, id, tick). */
static double ops_noise(uint64_t seed, uint64_t id, uint64_t tick)
{
    uint64_t r = mix(mix(seed ^ (id * UINT64_C(0x9e3779b97f4a7c15))) ^ (tick * UINT64_C(0xbf58476d1ce4e5b9)));
    return (double)(r >> 11) / 9007199254740992.0;
}

/* The incident of this kind and job active at tick t, or NULL. */
static const flinkgen_incident_t *ops_active(const flinkgen_incident_t *inc, size_t ninc, flinkgen_incident_kind_t kind,
                                             unsigned job, uint64_t t)
{
    for (size_t i = 0; i < ninc; i++)
        if (inc[i].kind == kind && inc[i].job == job && inc[i].from <= t && t < inc[i].to)
            return &inc[i];
    return NULL;
}

/* Extra backlog from LAG (1000 per tick) or STALL (50 per tick, subtask 0 only) incidents: grows
 * while active, then drains to a quarter each tick, as a source catching up does. */
static double ops_extra_lag(const flinkgen_incident_t *inc, size_t ninc, unsigned job, unsigned sub, uint64_t t)
{
    double lag = 0;
    for (size_t i = 0; i < ninc; i++) {
        double per = inc[i].kind == FLINKGEN_LAG ? 1000 : inc[i].kind == FLINKGEN_STALL && sub == 0 ? 50 : 0;
        if (per == 0 || inc[i].job != job || t < inc[i].from)
            continue;
        if (t < inc[i].to)
            lag += per * (double)(t - inc[i].from + 1);
        else
            lag += per * (double)(inc[i].to - inc[i].from) * pow(0.25, (double)(t - inc[i].to + 1));
    }
    return floor(lag);
}

/* Records/s the source operator of (job, subtask) emits at tick t. */
static double ops_source_rate(uint64_t seed, const flinkgen_incident_t *inc, size_t ninc, unsigned job, unsigned sub,
                              uint64_t t)
{
    if (sub == 0 && ops_active(inc, ninc, FLINKGEN_STALL, job, t))
        return 0;
    double r = ops_base_rate[job] * (1 + 0.1 * sin(6.283185307179586 * (double)t / 360.0) /* a slow wave, one per hour */) *
               (0.97 + 0.06 * ops_noise(seed, 1000 + job * 16 + sub, t));
    if (ops_active(inc, ninc, FLINKGEN_SURGE, job, t))
        r *= 3;
    return floor(r * 10) / 10;
}

static void ops_line(buf_t *b, const char *fam, const char *labels, double v)
{
    buf_printf(b, "%s{%s} ", fam, labels);
    java_double(b, v);
    buf_putc(b, '\n');
}

size_t flinkgen_jobmanager(buf_t *b, uint64_t seed, uint64_t tick, const flinkgen_incident_t *inc, size_t ninc)
{
    gen_t g = {.b = b};
    char fam[256], labels[512];
    size_t series = 0;
    static const struct {
        const char *name;
        double v;
    } jm[] = {{"numRunningJobs", FLINKGEN_OPS_JOBS},
              {"numRegisteredTaskManagers", FLINKGEN_OPS_TMS},
              {"taskSlotsTotal", FLINKGEN_OPS_TMS * 2},
              {"taskSlotsAvailable", 0}};
    for (size_t m = 0; m < sizeof(jm) / sizeof(jm[0]); m++) {
        header(&g, "jobmanager", jm[m].name, false, fam, sizeof(fam));
        ops_line(b, fam, "host=\"flink_jobmanager\",", jm[m].v);
        series++;
    }
    /* per job: counters summed over ticks 0..tick */
    double completed[FLINKGEN_OPS_JOBS], failed[FLINKGEN_OPS_JOBS], restarts[FLINKGEN_OPS_JOBS];
    uint64_t up_since[FLINKGEN_OPS_JOBS];
    double duration[FLINKGEN_OPS_JOBS], size[FLINKGEN_OPS_JOBS];
    for (unsigned j = 0; j < FLINKGEN_OPS_JOBS; j++) {
        completed[j] = 100 + (double)(tick / 6); /* a checkpoint a minute at 10 s pushes */
        failed[j] = restarts[j] = 0;
        up_since[j] = 0;
        for (size_t i = 0; i < ninc; i++)
            if (inc[i].kind == FLINKGEN_RESTART && inc[i].job == j && inc[i].from <= tick) {
                restarts[j]++;
                failed[j]++;
                if (inc[i].from > up_since[j])
                    up_since[j] = inc[i].from;
            }
        uint64_t ck = tick / 6; /* the gauges hold the last completed checkpoint's values */
        duration[j] = floor(1800 + 400 * ops_noise(seed, 2000 + j, ck));
        if (ops_active(inc, ninc, FLINKGEN_CHECKPOINT_SLOW, j, tick))
            duration[j] *= 12;
        double leak = 1;
        for (size_t i = 0; i < ninc; i++)
            if (inc[i].kind == FLINKGEN_STATE_LEAK && inc[i].job == j && inc[i].from <= tick)
                leak += 0.002 * (double)((tick < inc[i].to ? tick : inc[i].to) - inc[i].from);
        size[j] = floor(ops_base_state[j] * (0.995 + 0.01 * ops_noise(seed, 3000 + j, ck)) * leak);
    }
    const struct {
        const char *name;
        int what;
    } jobm[] = {{"lastCheckpointDuration", 0},        {"lastCheckpointSize", 1},
                {"lastCheckpointFullSize", 1},        {"numberOfCompletedCheckpoints", 2},
                {"numberOfFailedCheckpoints", 3},     {"numberOfInProgressCheckpoints", 4},
                {"totalNumberOfCheckpoints", 5},      {"numRestarts", 6},
                {"uptime", 7},                        {"downtime", 8}};
    for (size_t m = 0; m < sizeof(jobm) / sizeof(jobm[0]); m++) {
        header(&g, "jobmanager_job", jobm[m].name, false, fam, sizeof(fam));
        for (unsigned j = 0; j < FLINKGEN_OPS_JOBS; j++) {
            char job_id[33];
            hex32(job_id, seed * 31 + 100 + j);
            double inprog = tick % 6 == 5 ? 1 : 0, v = 0;
            switch (jobm[m].what) {
            case 0: v = duration[j]; break;
            case 1: v = size[j]; break;
            case 2: v = completed[j]; break;
            case 3: v = failed[j]; break;
            case 4: v = inprog; break;
            case 5: v = completed[j] + failed[j] + inprog; break;
            case 6: v = restarts[j]; break;
            case 7: v = (double)(tick - up_since[j]) * 10000; break;
            default: v = 0; break;
            }
            snprintf(labels, sizeof(labels), "host=\"flink_jobmanager\",job_id=\"%s\",job_name=\"%s\",", job_id,
                     ops_job_names[j]);
            ops_line(b, fam, labels, v);
            series++;
        }
    }
    return series;
}

size_t flinkgen_ops_taskmanager(buf_t *b, unsigned tm, uint64_t seed, uint64_t tick, const flinkgen_incident_t *inc,
                                size_t ninc)
{
    assert(tm < FLINKGEN_OPS_TMS);
    gen_t g = {.b = b};
    char fam[256], tml[160], labels[1024];
    size_t series = 0;
    unsigned job = tm % FLINKGEN_OPS_JOBS, first_sub = (tm / FLINKGEN_OPS_JOBS) * OPS_SUB;
    snprintf(tml, sizeof(tml), "host=\"flink_ops_tm_%u\",tm_id=\"ops_tm_%u\",", tm, tm);

    /* JVM: counters summed over the ticks so far */
    double ycount = 0, ytime = 0, ocount = 0, otime = 0;
    for (uint64_t u = 0; u <= tick; u++) {
        ycount += 1;
        ytime += floor(12 + 6 * ops_noise(seed, 4000 + tm, u));
        const flinkgen_incident_t *gc = ops_active(inc, ninc, FLINKGEN_GC, job, u);
        if (gc) {
            ycount += 3;
            ytime += 3000;
            if ((u - gc->from) % 6 == 0) {
                ocount += 1;
                otime += 1000;
            }
        }
    }
    double heap_max = 1073741824.0, heap_used;
    if (ops_active(inc, ninc, FLINKGEN_GC, job, tick))
        heap_used = floor(heap_max * (0.93 + 0.05 * ops_noise(seed, 5000 + tm, tick)));
    else
        heap_used = floor(heap_max * (0.30 + 0.42 * (double)((tick + tm) % 6) / 5.0));
    const struct {
        const char *name;
        double v;
    } jvm[] = {{"Status.JVM.GarbageCollector.G1_Young_Generation.Count", ycount},
               {"Status.JVM.GarbageCollector.G1_Young_Generation.Time", ytime},
               {"Status.JVM.GarbageCollector.G1_Old_Generation.Count", ocount},
               {"Status.JVM.GarbageCollector.G1_Old_Generation.Time", otime},
               {"Status.JVM.Memory.Heap.Used", heap_used},
               {"Status.JVM.Memory.Heap.Max", heap_max}};
    for (size_t m = 0; m < sizeof(jvm) / sizeof(jvm[0]); m++) {
        header(&g, "taskmanager", jvm[m].name, false, fam, sizeof(fam));
        ops_line(b, fam, tml, jvm[m].v);
        series++;
    }

    /* rates along the job graph, per subtask */
    double src[OPS_SUB], mid[OPS_SUB], win[OPS_SUB];
    for (unsigned s = 0; s < OPS_SUB; s++) {
        src[s] = ops_source_rate(seed, inc, ninc, job, first_sub + s, tick);
        mid[s] = floor(src[s] * (job == 0 ? 0.98 : 0.6) * 10) / 10; /* Map keeps most, Filter 60% */
        win[s] = floor(mid[s] * 0.05 * 10) / 10;                    /* the window aggregates */
    }
    char job_id[33];
    hex32(job_id, seed * 31 + 100 + job);
    enum { T_IN, T_OUT, T_BP, T_BUSY, T_NTASK };
    static const char *const task_metric[T_NTASK] = {"numRecordsInPerSecond", "numRecordsOutPerSecond",
                                                     "backPressuredTimeMsPerSecond", "busyTimeMsPerSecond"};
    for (unsigned m = 0; m < T_NTASK; m++) {
        header(&g, "taskmanager_job_task", task_metric[m], false, fam, sizeof(fam));
        for (unsigned t = 0; t < 2; t++)
            for (unsigned s = 0; s < OPS_SUB; s++) {
                unsigned sub = first_sub + s;
                char task_id[33], attempt[33];
                hex32(task_id, seed * 131 + 100 + job * 10 + t);
                hex32(attempt, seed * 977 + 100000 + job * 1000 + t * 100 + sub);
                double v = 0, nz = ops_noise(seed, 6000 + job * 100 + t * 10 + sub + m * 1000, tick);
                switch (m) {
                /* a legacy source task reports numRecordsIn 0; a FLIP-27 one counts what it read */
                case T_IN: v = t == 0 ? (job == 0 ? src[s] : 0) : mid[s]; break;
                case T_OUT: v = t == 0 ? mid[s] : win[s]; break;
                case T_BP: v = floor(30 * nz); break;
                default: v = src[s] == 0 && t == 0 ? 0 : floor((t == 0 ? 150 : 250) + 100 * nz); break;
                }
                snprintf(labels, sizeof(labels),
                         "%sjob_id=\"%s\",job_name=\"%s\",task_id=\"%s\",task_name=\"%s\",task_attempt_id=\"%s\","
                         "task_attempt_num=\"0\",subtask_index=\"%u\",",
                         tml, job_id, ops_job_names[job], task_id, ops_task_names[job][t], attempt, sub);
                ops_line(b, fam, labels, v);
                series++;
            }
    }

    /* operator scope: output rates of every operator, the source's lag metrics */
    enum { O_OUT, O_PENDING, O_SRC_LAG, O_LEGACY_LAG, O_N };
    static const char *const op_metric[O_N] = {"numRecordsOutPerSecond", "pendingRecords",
                                               "KafkaSourceReader.KafkaConsumer.records_lag_max",
                                               "KafkaConsumer.records_lag_max"};
    for (unsigned m = 0; m < O_N; m++) {
        if ((m == O_PENDING || m == O_SRC_LAG) && job != 0)
            continue; /* only the KafkaSource job has these */
        if (m == O_LEGACY_LAG && job != 1)
            continue; /* only the FlinkKafkaConsumer job */
        header(&g, "taskmanager_job_task_operator", op_metric[m], false, fam, sizeof(fam));
        for (unsigned t = 0; t < 2; t++)
            for (unsigned o = 0; o < 2; o++) {
                if (m != O_OUT && (t != 0 || o != 0))
                    continue; /* lag lives on the source operator */
                for (unsigned s = 0; s < OPS_SUB; s++) {
                    unsigned sub = first_sub + s;
                    char task_id[33], attempt[33], op_id[33];
                    hex32(task_id, seed * 131 + 100 + job * 10 + t);
                    hex32(attempt, seed * 977 + 100000 + job * 1000 + t * 100 + sub);
                    hex32(op_id, seed * 733 + 100 + job * 10 + t * 2 + o);
                    double v;
                    if (m == O_OUT) {
                        v = t == 0 ? (o == 0 ? src[s] : mid[s]) : win[s];
                    } else {
                        double lag = (job == 0 ? 200 + 300 * ops_noise(seed, 7000 + sub, tick)
                                               : 50 + 100 * ops_noise(seed, 7100 + sub, tick)) +
                                     ops_extra_lag(inc, ninc, job, sub, tick);
                        lag = floor(lag);
                        /* records-lag-max is the worst of the reader's (about three) partitions */
                        v = m == O_SRC_LAG ? floor(lag * 0.4) : lag;
                    }
                    snprintf(labels, sizeof(labels),
                             "%sjob_id=\"%s\",job_name=\"%s\",task_id=\"%s\",task_name=\"%s\","
                             "task_attempt_id=\"%s\",task_attempt_num=\"0\",subtask_index=\"%u\",operator_id=\"%s\","
                             "operator_name=\"%s\",",
                             tml, job_id, ops_job_names[job], task_id, ops_task_names[job][t], attempt, sub, op_id,
                             ops_op_names[job][t][o]);
                    ops_line(b, fam, labels, v);
                    series++;
                }
            }
    }
    return series;
}
