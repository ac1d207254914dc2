/*
 * floatfmt_bench — formatting alone: nanoseconds per value for the double-conversion formatter
 * (internal/util/floatfmt.cc, through buf_put_float_json / buf_put_float) against the printf +
 * strtod search it replaced (tests/unit/internal/util/floatfmt_reference.h), over the kinds of
 * values query answers carry. Built by bench/run.sh against the release core library.
 *
 * Usage: floatfmt_bench [values per kind, default 1000000]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal/util/buf.h"
#include "tests/unit/internal/util/floatfmt_reference.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double value(int kind, uint64_t x)
{
    switch (kind) {
    case 0: return (double)(x >> 11) / 9007199254740992.0 * 250.0;  /* rate(): full 17 digits */
    case 1: return (double)(x % 100000000) / 1000.0;                /* gauges with 3 decimals */
    case 2: return (double)(x % 10000000000ull);                    /* counters */
    default: return 1700000000.0 + (double)(x % 86400000) / 1000.0; /* timestamps in seconds */
    }
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    static const char *kinds[] = {"rate results (random, 17 digits)", "gauges (3 decimals)", "counters (integers)",
                                  "timestamps (ms precision)"};
    double *vs = malloc((size_t)n * sizeof(double));
    if (!vs)
        return 1;
    printf("%-34s %-6s %12s %12s %8s\n", "values", "layout", "old ns/op", "new ns/op", "speed-up");
    buf_t b = BUF_INIT;
    ref_out_t o;
    size_t sink = 0;
    for (int k = 0; k < 4; k++) {
        uint64_t x = 0x9E3779B97F4A7C15ull + (uint64_t)k;
        for (long i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            vs[i] = value(k, x);
        }
        for (int layout = 0; layout < 2; layout++) { /* JSON API, text exposition ('g') */
            double t0 = now();
            for (long i = 0; i < n; i++) {
                double a = fabs(vs[i]);
                ref_float_go(&o, vs[i], layout ? 'g' : ((a != 0 && (a < 1e-6 || a >= 1e21)) ? 'e' : 'f'));
                sink += o.len;
            }
            double t1 = now();
            for (long i = 0; i < n; i++) {
                buf_reset(&b);
                if (layout)
                    buf_put_float(&b, vs[i]);
                else
                    buf_put_float_json(&b, vs[i]);
                sink += b.len;
            }
            double t2 = now();
            printf("%-34s %-6s %12.1f %12.1f %7.1fx\n", kinds[k], layout ? "g" : "json", (t1 - t0) / (double)n * 1e9,
                   (t2 - t1) / (double)n * 1e9, (t1 - t0) / (t2 - t1));
        }
    }
    printf("(%zu bytes written)\n", sink);
    buf_free(&b);
    free(vs);
    return 0;
}
