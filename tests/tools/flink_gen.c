/*
 * flink_gen — prints Flink TaskManager push bodies (internal/expfmt/flinkgen.h) to stdout.
 *
 *   flink_gen TMS SEED TICK [TM]   bodies of TaskManagers 0..TMS-1 (or only TM), each preceded by
 *                                  a comment line "# flink_gen job=<job name> tm=<i>" (a valid
 *                                  0.0.4 comment, so the concatenation still parses; split on it
 *                                  to get one PUT body per TaskManager: PUT /metrics/job/<job name>)
 *   flink_gen --bench TMS SEED     times expfmt_parse_text over those bodies and prints
 *                                  samples/s and MB/s on one core (a tool, not a test)
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

int main(int argc, char **argv)
{
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
