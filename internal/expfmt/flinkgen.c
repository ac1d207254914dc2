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
