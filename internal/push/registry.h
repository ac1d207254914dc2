/*
 * push registry — the Pushgateway's state: groups of metric families keyed by their grouping
 * labels (job plus the path's label pairs), with Pushgateway 1.5's semantics:
 *
 *   PUT    replaces the whole group          POST   replaces the families named in the body
 *   DELETE removes the group                 every change stamps push_time_seconds; a refused
 *                                            push stamps push_failure_time_seconds
 *
 * A push is checked before anything changes: no timestamps, no duplicate series, and every
 * family's type must agree with the type the gateway already holds for that name in any group.
 * The type check is incremental — an index of name -> (type, number of groups holding it) — so
 * its cost is proportional to the push, not to everything stored (the Pushgateway re-gathers
 * everything on every push, its best-known scaling failure).
 *
 * Applying a push yields the samples to append to storage (every component series, stamped with
 * the push time) and staleness markers for every series the change removed; expiry does the same
 * for groups that stopped pushing. The registry itself does no I/O: the caller appends the
 * samples and persists the state through push_registry_serialize/restore.
 *
 * Series labels as exposed (and stored): body labels, overridden by same-named grouping labels,
 * plus instance="" when no instance label is present — as the Pushgateway exposes them.
 *
 * Thread safety: all functions lock internally. push_registry_prepare + push_registry_commit
 * must be called by one thread at a time per registry (the caller serializes pushes so that the
 * storage append between them happens in push order).
 */
#ifndef SLUICE_PUSH_REGISTRY_H
#define SLUICE_PUSH_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/expfmt/family.h"
#include "internal/labels/labels.h"
#include "internal/util/arena.h"
#include "internal/util/buf.h"

typedef struct push_registry push_registry_t;

typedef enum { PUSH_PUT = 0, PUSH_POST = 1 } push_mode_t;

enum {
    PUSH_OK = 0,
    PUSH_ERR_INVALID = -1, /* the push is refused (400); message in err */
    PUSH_ERR_NOMEM = -2,
    PUSH_MISS = -3, /* not a repeat of the group's previous body: parse it in full */
};

/* A heartbeat (internal/push/heartbeat.h): a group's successful push, or its leaving. */
typedef struct {
    const char *key; /* the canonical grouping key, and its hash */
    uint64_t hash;
    const labels_t *grouping;
    const char *const *jobs; /* the job label, then the distinct job_name values of its series */
    size_t njobs;
    int64_t now_ms;
    bool gone; /* deleted, wiped or expired (jobs not set) */
} push_beat_t;

typedef struct {
    int64_t group_ttl_ms;      /* expire a group this long after its last push; 0 = never */
    uint32_t missed_intervals; /* expire after this many of its own push intervals without a push; 0 = never */
    /* Heartbeat observer, or NULL: called under the registry's lock at each commit and when a
     * group leaves (not on restore), so it must not call back into the registry. Its cost per
     * push is O(1): the jobs list is recomputed only when the group's shape changed. */
    void (*on_beat)(void *ud, const push_beat_t *beat);
    void *beat_ud;
} push_options_t;

/* One sample to store: full label set including __name__ (arena-owned). */
typedef struct {
    labels_t labels;
    double v;
} push_sample_t;

/* The caller's reference to the stored series of a sample (storage_ref_t), kept verbatim and
 * handed back on the next push; all zero = none. Opaque to the registry. */
typedef struct {
    uint64_t w[2];
} push_ref_t;

/* What a change means for storage: samples to append at time t_ms (stale markers included).
 *
 * Series reference cache. refs[0..nrefs) (nrefs <= n) are the series refs of the first nrefs
 * samples: a push's own samples carry the refs the group's previous push of the same family
 * resolved to, when the family kept its shape (same name, type, help, metrics' labels and
 * bounds: the same component series in the same order); else zero. The caller appends with them
 * and writes back the refs storage resolved (before push_registry_commit): the committed families
 * keep them for the next push. Staleness markers (and deletes, wipes, expiry) carry none. */
typedef struct {
    push_sample_t *samples;
    size_t n;
    int64_t t_ms;
    push_ref_t *refs; /* owned by the pending push; NULL when nrefs = 0 */
    size_t nrefs;
} push_effect_t;

/* A validated push waiting for its samples to be stored; owned by the arena passed to prepare. */
typedef struct push_pending push_pending_t;

push_registry_t *push_registry_new(const push_options_t *opt);
void push_registry_free(push_registry_t *r);

/*
 * Checks a parsed body against the gateway's state and computes the effect, changing nothing.
 * grouping: the path's labels (job first is not required; names unique). now_ms is the push
 * time (the caller truncates to the second for storage). Returns PUSH_OK with *pending and
 * *effect set (both in arena a), or PUSH_ERR_INVALID with the Pushgateway's message in err (then
 * call push_registry_fail to stamp push_failure_time_seconds).
 */
int push_registry_prepare(push_registry_t *r, const labels_t *grouping, push_mode_t mode, const expfmt_result_t *body,
                          int64_t now_ms, arena_t *a, push_pending_t **pending, push_effect_t *effect, char *err,
                          size_t errlen);
/*
 * Persistence: every function that changes state takes `delta` (may be NULL) and appends a record
 * describing the change, to be logged (storage_log_state) and replayed with
 * push_registry_apply_delta after the last full state (push_registry_serialize/restore). Records
 * set state rather than add to it, so replaying one twice is harmless.
 */

/* push_registry_prepare in two steps, so the costly part runs without the caller's push lock:
 * build checks the body and builds what the group will hold (no shared state read); settle,
 * called under the caller's lock, checks types against the other groups and adds staleness
 * markers for dropped series to the effect (skipped when every replaced family kept its shape,
 * the steady state of a periodic reporter). On a settle error call push_registry_abort. */
int push_registry_build(push_registry_t *r, const labels_t *grouping, push_mode_t mode, const expfmt_result_t *body,
                        int64_t now_ms, arena_t *a, push_pending_t **pending, char *err, size_t errlen);
int push_registry_settle(push_registry_t *r, push_pending_t *pending, push_effect_t *effect, char *err, size_t errlen);
/* Before the caller's lock, what settle would check and carry now: PUSH_OK when the pushed types
 * agree with the other groups' (settle checks again under the lock), with the series refs carried
 * from replaced families of the same shape; *own is the push's own samples and their refs (zero
 * where unknown: the series a caller may create ahead, storage_prepare_refs). Changes nothing
 * of the registry. */
int push_registry_presettle(push_registry_t *r, push_pending_t *pending, push_effect_t *own);

/*
 * Repeated pushes (shape cache, push/shape.h). After a full PUT of a text or OpenMetrics body, the
 * caller hands the body's shape to the pending push; commit keeps it as the group's cache. The
 * next push of the group is first matched against it:
 *
 *   push_registry_match        outside the caller's push lock: reads only the values of a body
 *                              that repeats the cached one; PUSH_MISS when it does not (or the
 *                              group has no cache), then parse in full as usual
 *   push_registry_settle_fast  under the caller's push lock: the pending push (the group's
 *                              families with the new values, same labels, series refs carried)
 *                              and its effect (no staleness markers: the same series); PUSH_MISS
 *                              when the group changed since the match
 *   push_registry_fast_release always, after settle_fast or instead of it
 *
 * then push_store + push_registry_commit / abort as for any push. Every check a full push makes
 * (timestamps, duplicates, reserved names, types against other groups) holds for a repeat of a
 * body that passed it. Only PUT is recognised: Flink's reporter and the client libraries' push()
 * replace their group.
 */
typedef struct push_fast push_fast_t;
struct push_shape;
void push_registry_pending_take_shape(push_pending_t *pending, struct push_shape *shape, bool openmetrics);
int push_registry_match(push_registry_t *r, const labels_t *grouping, const char *body, size_t len,
                        expfmt_format_t fmt, arena_t *a, push_fast_t **fast);
int push_registry_settle_fast(push_registry_t *r, push_fast_t *fast, int64_t now_ms, arena_t *a,
                              push_pending_t **pending, push_effect_t *effect);
void push_registry_fast_release(push_registry_t *r, push_fast_t *fast);

/* Makes a prepared push visible (after its samples were stored). */
void push_registry_commit(push_registry_t *r, push_pending_t *pending, buf_t *delta);
/* Discards a prepared push whose samples could not be stored (nothing changes). */
void push_registry_abort(push_pending_t *pending);
/* Records a refused push: stamps push_failure_time_seconds, creating the group if needed. */
void push_registry_fail(push_registry_t *r, const labels_t *grouping, int64_t now_ms, buf_t *delta);

/* Removes a group; *effect gets staleness markers for its series (arena a). Returns true if the
 * group existed. */
bool push_registry_delete(push_registry_t *r, const labels_t *grouping, int64_t now_ms, arena_t *a,
                          push_effect_t *effect, buf_t *delta);
/* Removes every group (admin wipe). */
void push_registry_wipe(push_registry_t *r, int64_t now_ms, arena_t *a, push_effect_t *effect, buf_t *delta);
/* Expires groups per the options; *effect gets their staleness markers. Returns groups expired. */
size_t push_registry_expire(push_registry_t *r, int64_t now_ms, arena_t *a, push_effect_t *effect, buf_t *delta);

/* GET /metrics: every group's families in text format 0.0.4, Pushgateway order (families by
 * name, series by label values), with push_time_seconds / push_failure_time_seconds. */
void push_registry_write_text(push_registry_t *r, buf_t *out);

/* The same text in pieces, for a reply streamed to a possibly slow client (100s of MB):
 *   begin   pins every family's batch under the lock (a short walk), copies the bookkeeping
 *           series and sorts all series into Pushgateway order unlocked: the expensive part,
 *           meant for a thread other than the HTTP worker's. NULL when out of memory.
 *   next    appends whole series lines to out until it grew by max_bytes or more (or the end);
 *           returns true while there is more. Any one thread at a time, no lock taken.
 *   end     drops the pins (takes the lock briefly) and frees the handle; at any point.
 * Pushes, deletes, expiry and wipes go on meanwhile: they replace families, and the pins keep
 * the ones being rendered alive. The pieces concatenated are exactly push_registry_write_text's
 * output at begin. The registry must outlive the handle. */
typedef struct push_render push_render_t;
push_render_t *push_registry_render_begin(push_registry_t *r);
bool push_registry_render_next(push_render_t *h, buf_t *out, size_t max_bytes);
void push_registry_render_end(push_render_t *h);
/* GET /api/v1/metrics: the JSON array that goes in "data". */
void push_registry_write_json(push_registry_t *r, buf_t *out);
size_t push_registry_group_count(push_registry_t *r);
/* What the registry holds (tests, diagnostics). A group's families share the batch of the push
 * that delivered them (one exact-size block: families, metrics, values, series refs) and that
 * batch's base (blocks of names, label sets, bounds, interned per push), which repeats of the
 * push share. bytes: what both kinds hold (block capacities; not counting malloc overhead). */
typedef struct {
    size_t groups, families, metrics;
    size_t batches;    /* distinct batches and bases */
    size_t label_sets; /* distinct label sets stored (one per set per base) */
    size_t bytes;
} push_registry_mem_t;
void push_registry_memory(push_registry_t *r, push_registry_mem_t *out);
/* sluice_push_* self-metrics. */
void push_registry_write_metrics(push_registry_t *r, buf_t *out);

/* The whole state as bytes (for the storage snapshot), in pieces of about piece_bytes so that no
 * buffer holds all of it (at 256k series it is ~130 MB): the first piece is a full state with no
 * groups (push_registry_restore), every later one a delta of whole groups
 * (push_registry_apply_delta), and restoring them in order rebuilds the registry. put receives
 * each piece (valid during the call only) and returns 0, or non-zero to stop: serialize then
 * returns that value. The registry lock is held throughout, so the pieces are one consistent
 * state. */
typedef int (*push_registry_put_fn)(void *ctx, const void *data, size_t len);
int push_registry_serialize(push_registry_t *r, size_t piece_bytes, push_registry_put_fn put, void *ctx);
/* Replaces the state; returns 0 or -1 on malformed input (state left empty). */
int push_registry_restore(push_registry_t *r, const void *data, size_t len);
/* Replays a delta (see above). Returns 0, or -1 if malformed (records before the bad one stay
 * applied). */
int push_registry_apply_delta(push_registry_t *r, const void *data, size_t len);

#endif
