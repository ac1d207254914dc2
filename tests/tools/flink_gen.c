/*
 * flink_gen — prints Flink TaskManager push bodies (internal/expfmt/flinkgen.h) to stdout.
 *
 *   flink_gen TMS SEED TICK [TM]   bodies of TaskManagers 0..TMS-1 (or only TM), each preceded by
 *                                  a comment line "# flink_gen job=<job name> tm=<i>" (a valid
 *                                  0.0.4 comment, so the concatenation still parses; split on it
 *                                  to get one PUT body per TaskManager: PUT /metrics/job/<job name>)
 *   flink_gen --bench TMS SEED     times expfmt_parse_text over those bodies and prints
 *                                  samples/s and MB/s on one core (a tool, not a test)
 *   flink_gen --ops SEED FROM TO [INCIDENT...]
 *                                  the operations scenario (flinkgen.h: JobManager checkpoints and
 *                                  restarts, GC, Kafka lag of a KafkaSource and a legacy consumer)
 *                                  for ticks FROM..TO: per tick the JobManager's body, then the
 *                                  TaskManagers', each preceded by "# flink_gen ops tick=<t>
 *                                  job=<push job name> instance=<jm|tm<i>>". INCIDENT is
 *                                  kind:job:from:to, e.g. lag:orders:100:130 (ticks from <= t < to)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal/expfmt/flinkgen.h"
#include "internal/expfmt/text_parse.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int bench(unsigned tms, uint64_t seed)
{
    buf_t *bodies = calloc(tms, sizeof(*bodies));
    size_t bytes = 0, series = 0;
    for (unsigned i = 0; i < tms; i++) {
        buf_init(&bodies[i]);
        series += flinkgen_taskmanager(&bodies[i], i, seed, 1);
        bytes += bodies[i].len;
    }
    arena_t *a = arena_create(0);
    char err[512];
    size_t maxlen = 0;
    for (unsigned i = 0; i < tms; i++)
        if (bodies[i].len > maxlen)
            maxlen = bodies[i].len;
    char *work = malloc(maxlen);
    size_t samples = 0, rounds = 0;
    double t0 = now(), t;
    do {
        for (unsigned i = 0; i < tms; i++) {
            memcpy(work, bodies[i].data, bodies[i].len); /* the parser writes into its input */
            arena_reset(a);
            expfmt_result_t r;
            if (expfmt_parse_text(work, bodies[i].len, false, NULL, a, &r, err, sizeof(err)) != 0) {
                fprintf(stderr, "flink_gen: parse failed: %s\n", err);
                return 1;
            }
            samples += r.nsamples;
        }
        rounds++;
        t = now() - t0;
    } while (t < 2.0);
    printf("flink_gen bench: %u TaskManagers, %zu series, %.1f KiB per body\n", tms, series,
           (double)bytes / tms / 1024);
    printf("text parse: %.2f M samples/s, %.1f MB/s, %.1f us per body (%zu rounds, %.2f s, includes memcpy)\n",
           (double)samples / t / 1e6, (double)bytes * (double)rounds / t / 1e6, t / ((double)rounds * tms) * 1e6,
           rounds, t);
    free(work);
    arena_destroy(a);
    for (unsigned i = 0; i < tms; i++)
        buf_free(&bodies[i]);
    free(bodies);
    return 0;
}

static int ops(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: flink_gen --ops SEED FROM TO [kind:job:from:to...]\n");
        return 2;
    }
    uint64_t seed = strtoull(argv[2], NULL, 10), from = strtoull(argv[3], NULL, 10), to = strtoull(argv[4], NULL, 10);
    size_t ninc = (size_t)(argc - 5);
    flinkgen_incident_t *inc = calloc(ninc ? ninc : 1, sizeof(*inc));
    char err[256];
    for (size_t i = 0; i < ninc; i++)
        if (flinkgen_incident_parse(argv[5 + i], &inc[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "flink_gen: %s\n", err);
            free(inc);
            return 2;
        }
    char jm_job[64];
    flinkgen_job_name(jm_job, sizeof(jm_job), 1000, seed);
    memcpy(jm_job, "flink_jm", 8); /* the JobManager's reporter pushes under its own random name */
    buf_t b;
    buf_init(&b);
    for (uint64_t t = from; t <= to; t++) {
        buf_reset(&b);
        buf_printf(&b, "# flink_gen ops tick=%llu job=%s instance=jm\n", (unsigned long long)t, jm_job);
        flinkgen_jobmanager(&b, seed, t, inc, ninc);
        for (unsigned tm = 0; tm < FLINKGEN_OPS_TMS; tm++) {
            char job[64];
            flinkgen_job_name(job, sizeof(job), 1001 + tm, seed);
            buf_printf(&b, "# flink_gen ops tick=%llu job=%s instance=tm%u\n", (unsigned long long)t, job, tm);
            flinkgen_ops_taskmanager(&b, tm, seed, t, inc, ninc);
        }
        fwrite(b.data, 1, b.len, stdout);
    }
    buf_free(&b);
    free(inc);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--ops") == 0)
        return ops(argc, argv);
    if (argc >= 4 && strcmp(argv[1], "--bench") == 0)
        return bench((unsigned)strtoul(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (argc < 4) {
        fprintf(stderr, "usage: flink_gen TMS SEED TICK [TM] | flink_gen --bench TMS SEED\n");
        return 2;
    }
    unsigned tms = (unsigned)strtoul(argv[1], NULL, 10);
    uint64_t seed = strtoull(argv[2], NULL, 10), tick = strtoull(argv[3], NULL, 10);
    unsigned first = 0, last = tms;
    if (argc > 4) {
        first = (unsigned)strtoul(argv[4], NULL, 10);
        last = first + 1;
    }
    buf_t b;
    buf_init(&b);
    for (unsigned i = first; i < last; i++) {
        char job[64];
        flinkgen_job_name(job, sizeof(job), i, seed);
        buf_reset(&b);
        buf_printf(&b, "# flink_gen job=%s tm=%u\n", job, i);
        flinkgen_taskmanager(&b, i, seed, tick);
        fwrite(b.data, 1, b.len, stdout);
    }
    buf_free(&b);
    return 0;
}
