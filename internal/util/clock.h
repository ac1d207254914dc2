/*
 * clock — the two clocks sluice reads, in the units its callers want.
 *
 *   clock        POSIX id          use it for                           may go back?
 *   ----------   ---------------   ----------------------------------   -------------------------
 *   wall         CLOCK_REALTIME    timestamps others read: sample       yes, when the system
 *                                  times, ages, "last seen", snapshot   clock is set
 *                                  headers
 *   mono         CLOCK_MONOTONIC   durations and deadlines inside the   never; starts at an
 *                                  process: request latency, query      arbitrary point, so a
 *                                  timeouts, fsync timings, log rate    value means nothing
 *                                  limits                               outside the process
 *
 * Every reading is an int64_t (both clocks stay below 2^63 ns until the year 2262). Milliseconds
 * are the nanosecond reading truncated, tv_sec * 1000 + tv_nsec / 1000000, so a ms and a ns
 * reading of the same instant agree: ms == ns / 1000000.
 *
 * clock_deadline_ms() gives the absolute struct timespec that pthread_cond_timedwait() wants for
 * "ms from now". It must be read on the clock the condition variable waits on: CLOCK_REALTIME for
 * a default condition variable, CLOCK_MONOTONIC for one made with
 * pthread_condattr_setclock(CLOCK_MONOTONIC).
 *
 * All functions are thread-safe and never fail (clock_gettime cannot fail for these two ids).
 */
#ifndef SLUICE_UTIL_CLOCK_H
#define SLUICE_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* ---- readings ---------------------------------------------------------------------------------- */

static inline int64_t clock__ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wall-clock time: nanoseconds / milliseconds since the Unix epoch. */
static inline int64_t clock_wall_ns(void)
{
    return clock__ns(CLOCK_REALTIME);
}

static inline int64_t clock_wall_ms(void)
{
    return clock_wall_ns() / 1000000;
}

/* Monotonic time: nanoseconds / milliseconds / seconds since an unspecified start. */
static inline int64_t clock_mono_ns(void)
{
    return clock__ns(CLOCK_MONOTONIC);
}

static inline int64_t clock_mono_ms(void)
{
    return clock_mono_ns() / 1000000;
}

static inline double clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- deadlines --------------------------------------------------------------------------------- */

/* The instant ms milliseconds from now on clock id, normalized (0 <= tv_nsec < 1e9), for
 * pthread_cond_timedwait(). A negative ms counts as 0: the deadline is now. */
static inline struct timespec clock_deadline_ms(clockid_t id, int64_t ms)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    if (ms < 0)
        ms = 0;
    int64_t ns = (int64_t)ts.tv_nsec + (ms % 1000) * 1000000;
    ts.tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}

#endif
