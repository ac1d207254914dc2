/*
 * heartbeat — availability from pushes: every push of a group is a heartbeat. This module counts
 * expected and received heartbeats per push group and per job, finds gaps (pushes stopped), and
 * says which expected jobs are missing. Pure logic: no I/O, no locks, no clock — every call gets
 * the time; the caller (api/availability.c) serializes calls, stores the series and the gaps.
 *
 * Interval. A group's interval I is, in order: its job's configured interval (API or file), the
 * default (--push.expected-interval), or the learned one (a smoothed mean of the time between
 * its pushes; pushes that end a gap do not teach it; at least 1 s, storage's resolution). A job's
 * interval is its configured one, the default, or the smallest interval of its groups (10 s,
 * Flink's default reporter interval, while none is known).
 *
 * Gap. With the last push at L, a gap opens once now - L > HEARTBEAT_GAP_INTERVALS * I; it
 * started at L + I (the first heartbeat that did not come) and ends with the next push P, so its
 * length is P - L - I: pushes every 10 s that stop for 60 s (six missing) make a 60 s gap.
 *
 *            L     L+I  (opens at L+2I)               P
 *   push ----|------:------:------ ... ------:-------|---- push
 *                   [============ gap =============]
 *
 * Counters. Group counters count pushes: a push adds 1 to received and to expected 1, or the
 * number of intervals since the previous push when it ends a gap (round((P - L) / I)); during an
 * open gap expected grows by one per interval due (floor((now - L) / I)). So over a range,
 * expected - received = missing heartbeats. Job counters count intervals: while the job pushes
 * (any of its groups) each interval is expected and received once; during a gap its intervals are
 * expected only, so expected - received = gap seconds / I exactly, and
 * 1 - increase(missed) / increase(expected) is the share of time the job was not in a gap. Both
 * are monotonic whatever happens to the interval (a reported value never goes down).
 *
 * Jobs. A group reports for one or more jobs: its `job` grouping label and the job_name values
 * its series carry (the registry says which). Expected jobs are declared by the caller; an
 * expected job that has not pushed for missing_intervals intervals (counted from when it was
 * declared or from start-up if it never pushed) is missing: up = 0 until it pushes again or is
 * no longer expected. A job that is not expected is forgotten (its open gap ended with reason
 * "gone") when its last group leaves (the registry expired or deleted it).
 *
 * Events. Gap opened/closed and job forgotten are queued for the caller (heartbeat_take_events)
 * so that SQLite writes never happen on the push path.
 */
#ifndef SLUICE_PUSH_HEARTBEAT_H
#define SLUICE_PUSH_HEARTBEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"

#define HEARTBEAT_GAP_INTERVALS 2.0          /* a gap opens after this many intervals without a push */
#define HEARTBEAT_MIN_INTERVAL_MS 1000       /* storage's resolution: no interval counts as shorter */
#define HEARTBEAT_FALLBACK_INTERVAL_MS 10000 /* Flink's default reporter interval */
#define HEARTBEAT_MAX_JOBS_PER_GROUP 16      /* job_name values one group reports for (a session TM) */

typedef struct heartbeat heartbeat_t;

typedef struct {
    int64_t default_interval_ms; /* 0 = learn each group's */
    uint32_t missing_intervals;  /* expected job missing after this many intervals; 0 = 3 */
} heartbeat_options_t;

typedef enum {
    HEARTBEAT_GAP_OPEN = 1,  /* start_ms set, end_ms 0 */
    HEARTBEAT_GAP_CLOSE = 2, /* start_ms and end_ms set, reason "push" or "gone" */
} heartbeat_event_kind_t;

typedef struct {
    heartbeat_event_kind_t kind;
    char *job;   /* owned */
    char *group; /* owned; "" for a job-level gap, else the group's labels as {a="b",...} */
    int64_t start_ms, end_ms;
    const char *reason; /* static: "push" (the job/group pushed again) or "gone" */
} heartbeat_event_t;

/* One declared job: interval_ms 0 = the default / learned one. */
typedef struct {
    const char *job;
    int64_t interval_ms;
} heartbeat_expect_t;

/* A group's counters as of now (labels owned by the heartbeat, valid until the next call). */
typedef struct {
    const labels_t *labels; /* the group's grouping labels (sorted) */
    double expected, received;
    int64_t last_ms;
    int64_t interval_ms; /* 0 = not known yet */
} heartbeat_group_view_t;

typedef struct {
    const char *job;
    double expected, received;
    int64_t last_ms; /* 0 = no push since start-up */
    int64_t interval_ms;
    bool expected_job; /* declared */
    bool up;           /* pushed within missing_intervals intervals */
    bool in_gap;
    int64_t gap_start_ms; /* when in_gap */
    int64_t first_ms;     /* when the job became known (first push or declaration) */
    size_t ngroups;
} heartbeat_job_view_t;

/* now_ms: start-up time (the clock of expected jobs that never pushed starts here). NULL on OOM. */
heartbeat_t *heartbeat_new(const heartbeat_options_t *o, int64_t now_ms);
void heartbeat_free(heartbeat_t *hb);

/* A successful push of a group. key/hash: the registry's canonical grouping key and its hash;
 * grouping: its labels (copied on first sight); jobs: the job identities it reports for (the
 * job label first; copied when they change). O(njobs). 0 or -1 (OOM; nothing counted). */
int heartbeat_push(heartbeat_t *hb, const char *key, uint64_t hash, const labels_t *grouping, const char *const *jobs,
                   size_t njobs, int64_t now_ms);
/* The registry dropped a group (DELETE, wipe, expiry): its open gap ends ("gone"), its series
 * end; jobs left without groups and not expected are forgotten. Unknown keys are ignored. */
void heartbeat_group_gone(heartbeat_t *hb, const char *key, uint64_t hash, int64_t now_ms);
/* Replaces the set of expected jobs (jobs named for the first time start their clock at now).
 * 0 or -1 (OOM: the set is partly applied; call again). */
int heartbeat_set_expected(heartbeat_t *hb, const heartbeat_expect_t *jobs, size_t n, int64_t now_ms);
/* Opens the gaps due at now and updates up/missing. Call about once a second. */
void heartbeat_tick(heartbeat_t *hb, int64_t now_ms);
/* Moves the queued events to *out (malloc'd array, caller frees with heartbeat_events_free). */
size_t heartbeat_take_events(heartbeat_t *hb, heartbeat_event_t **out);
void heartbeat_events_free(heartbeat_event_t *ev, size_t n);

/* Visits every group / job with its counters as of now (call heartbeat_tick(now) first). */
void heartbeat_each_group(heartbeat_t *hb, int64_t now_ms, void (*fn)(const heartbeat_group_view_t *v, void *ud),
                          void *ud);
void heartbeat_each_job(heartbeat_t *hb, int64_t now_ms, void (*fn)(const heartbeat_job_view_t *v, void *ud), void *ud);
/* One job; false if unknown. */
bool heartbeat_job(heartbeat_t *hb, const char *job, int64_t now_ms, heartbeat_job_view_t *out);
/* Groups and jobs tracked (for tests and self-metrics). */
size_t heartbeat_group_count(const heartbeat_t *hb);
size_t heartbeat_job_count(const heartbeat_t *hb);

#endif
