/*
 * flinkgen — synthetic TaskManager push bodies shaped exactly like Flink's
 * PrometheusPushGatewayReporter output (simpleclient 0.8.1 text format 0.0.4; PROTOCOLS.md §1),
 * for tests, the differential test and the benchmark.
 *
 * One TaskManager runs one job with two chained tasks (6 subtasks each, 12 in all), three
 * operators per task; it reports TaskManager JVM/network gauges, task gauges (records, bytes,
 * backpressure, buffer usage) and operator gauges plus two latency-style histograms per operator,
 * exported as SUMMARY (quantiles 0.5 .. 0.999 and _count, no _sum). Every family is GAUGE or
 * SUMMARY, HELP is "<metric> (scope: <scope>)", values print as Java's Double.toString.
 * About 1,200 series per TaskManager. Deterministic in (tm, seed, tick); counters grow with tick.
 */
#ifndef SLUICE_EXPFMT_FLINKGEN_H
#define SLUICE_EXPFMT_FLINKGEN_H

#include <stddef.h>
#include <stdint.h>

#include "internal/util/buf.h"

/* Appends TaskManager `tm`'s body for push number `tick` to b; returns its series count. */
size_t flinkgen_taskmanager(buf_t *b, unsigned tm, uint64_t seed, uint64_t tick);

/* The Pushgateway job name that TaskManager pushes to: "flink_tm" + 32-hex random suffix, as
 * Flink's randomJobNameSuffix makes it. */
void flinkgen_job_name(char *out, size_t outlen, unsigned tm, uint64_t seed);

/* --- operations scenario: JobManager checkpoints/restarts, JVM GC, Kafka lag ------------------
 *
 * A second, smaller model for alert rules and dashboards (deploy/rules/flink.yml): two Flink jobs,
 * "orders" reading with a KafkaSource (FLIP-27: pendingRecords and
 * KafkaSourceReader.KafkaConsumer.records-lag-max on the source operator) and "clicks" reading with
 * the legacy FlinkKafkaConsumer (KafkaConsumer.records-lag-max). Each job runs on two
 * TaskManagers (tm 0, 2 run orders; 1, 3 run clicks) with two tasks ("Source: ... -> Map" and
 * "Window -> Sink: ...") of two subtasks each per TaskManager. A healthy job has steady input with
 * a little noise, a small lag, a young GC per push, a sawtooth heap and a checkpoint a minute;
 * incidents, each over a span of ticks, change that the way the real failure would. One tick is
 * one push (Flink's default reporter interval is 10 s). Counters (GC, checkpoints, restarts) are
 * summed over ticks 0..tick, so a body is deterministic in (seed, tick, incidents). */
typedef enum {
    FLINKGEN_CHECKPOINT_SLOW, /* lastCheckpointDuration 12x while active */
    FLINKGEN_STATE_LEAK,      /* lastCheckpointSize grows 0.2% per tick from `from`, stays after `to` */
    FLINKGEN_LAG,             /* source lag grows 1000 records per tick, drains to 1/4 per tick after */
    FLINKGEN_GC,              /* 30% of time in young GC, a full GC every 6 ticks, heap 93-98% full */
    FLINKGEN_STALL,           /* source subtask 0 emits nothing; its lag grows 50 per tick */
    FLINKGEN_SURGE,           /* input rate 3x */
    FLINKGEN_RESTART,         /* at `from`: numRestarts +1, a failed checkpoint, uptime restarts */
} flinkgen_incident_kind_t;

typedef struct {
    flinkgen_incident_kind_t kind;
    unsigned job;       /* 0 = orders, 1 = clicks */
    uint64_t from, to;  /* active for ticks from <= t < to */
} flinkgen_incident_t;

#define FLINKGEN_OPS_JOBS 2
#define FLINKGEN_OPS_TMS 4

/* Parses "kind:job:from:to" (kind one of checkpoint_slow, state_leak, lag, gc, stall, surge,
 * restart; job orders or clicks). 0, or -1 with a message in err. */
int flinkgen_incident_parse(const char *s, flinkgen_incident_t *out, char *err, size_t errlen);

/* Appends the JobManager's body for push `tick` (job-scope checkpoint and restart gauges of both
 * jobs, JobManager-scope job and slot counts); returns its series count. */
size_t flinkgen_jobmanager(buf_t *b, uint64_t seed, uint64_t tick, const flinkgen_incident_t *inc, size_t ninc);

/* Appends ops TaskManager `tm`'s body (0 <= tm < FLINKGEN_OPS_TMS) for push `tick`: JVM heap and
 * GC, task and operator rates, busy/backpressure, the source's lag metrics. Returns its series
 * count. */
size_t flinkgen_ops_taskmanager(buf_t *b, unsigned tm, uint64_t seed, uint64_t tick, const flinkgen_incident_t *inc,
                                size_t ninc);

#endif
