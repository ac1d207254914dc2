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

#endif
