/*
 * head — the raw tier: every active series' recent samples in memory, as Prometheus XOR chunks
 * in a ring of time blocks covering the raw retention (default 2h in 15-minute blocks).
 *
 * Append rules (DESIGN.md, Data model and time):
 *  - at most one sample per series per second (second = floor(t / 1000)); a later sample in the
 *    same second replaces the earlier one;
 *  - a sample in an earlier second than the series' newest is HEAD_ERR_OUT_OF_ORDER;
 *  - a sample older than the retained window (head_min_valid_time) is HEAD_ERR_TOO_OLD;
 *  - any value bits are stored exactly, including the staleness marker NaN 0x7ff0000000000002.
 *
 * Memory: closed chunks are packed into per-block slabs; dropping a block frees its slab pages
 * wholesale after a sliced sweep has unlinked its chunks from their series (head_expire). A
 * series with no samples left is removed from memory (it stays in the catalog).
 *
 * Thread safety: all functions may be called concurrently from any threads, except head_free.
 * Appends to different series proceed in parallel; readers copy a series' chunks under a short
 * per-series lock, so they never wait for more than one append.
 */
#ifndef SLUICE_STORAGE_HEAD_H
#define SLUICE_STORAGE_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "storage/index.h"
#include "storage/querier.h"

#define HEAD_DEFAULT_RETENTION_MS (2 * 3600 * 1000LL)
#define HEAD_DEFAULT_BLOCK_MS (15 * 60 * 1000LL)

enum {
    HEAD_OK = 0,
    HEAD_ERR_NOMEM = -1,
    HEAD_ERR_LIMIT = -2,        /* max_series reached: new series refused */
    HEAD_ERR_OUT_OF_ORDER = -3, /* older second than the series' newest sample */
    HEAD_ERR_TOO_OLD = -4,      /* before head_min_valid_time() */
    HEAD_ERR_NOT_FOUND = -5,    /* the ref names a series no longer in memory */
};

typedef struct head head_t;

typedef struct {
    int64_t retention_ms; /* 0 = HEAD_DEFAULT_RETENTION_MS */
    int64_t block_ms;     /* 0 = HEAD_DEFAULT_BLOCK_MS; a divisor of a day works best */
    uint64_t max_series;  /* 0 = unlimited */
    /* May the sweep remove the empty series `id` now? NULL = yes. The catalog says no while the
     * series' labels are still to be read back from the index. Called under the series' shard
     * WRITE lock: must not take index locks. */
    bool (*may_remove)(void *ud, uint64_t id);
    void *may_remove_ud;
} head_options_t;

/* o may be NULL (defaults). Returns NULL on OOM. */
head_t *head_new(const head_options_t *o);
void head_free(head_t *h);

/* The series with labels ls (sorted, unique, no empty values; hash = labels_hash(ls)), created
 * with id new_id if absent (*created = true). A created series that receives no sample is
 * removed by a later head_expire. Returns HEAD_OK, HEAD_ERR_LIMIT or HEAD_ERR_NOMEM. */
int head_get_or_create(head_t *h, const labels_t *ls, uint64_t hash, uint64_t new_id, index_ref_t *ref, bool *created);
/* The same for a caller that has just looked ls up and not found it: skips the first lookup (a
 * series created meanwhile is still found, *created false). */
int head_create(head_t *h, const labels_t *ls, uint64_t hash, uint64_t new_id, index_ref_t *ref, bool *created);
/* head_create for many series at once (index_create_many: the index's locks taken once per
 * batch; an item with id 0 takes its departed id or next_id's). HEAD_OK, or HEAD_ERR_NOMEM with
 * nothing done; each item's rc is the index's code. */
int head_create_many(head_t *h, index_create_t *items, size_t n, index_next_id_fn next_id, void *ud);
/* Would a sample at t be accepted now? HEAD_OK or the error head_append_ref would return (a
 * refusal is counted in the stats, as the caller is expected to drop the sample). */
int head_check(head_t *h, const index_ref_t *ref, int64_t t);
int head_append_ref(head_t *h, const index_ref_t *ref, int64_t t, double v);
/* Every series has one pointer-sized slot for the head's owner (storage keeps the roll-up's hint
 * for the series there): NULL when the series is created, freed with it (the head never
 * dereferences it). head_append_ref_aux also returns the slot's value in *aux (read under the
 * series' lock, whatever the result). head_set_aux sets it, if the series ref names is still in
 * memory (false: it is not; a series that left and came back starts with NULL again). */
int head_append_ref_aux(head_t *h, const index_ref_t *ref, int64_t t, double v, void **aux);
bool head_set_aux(head_t *h, const index_ref_t *ref, void *aux);
/* head_check / head_append_ref for the samples sel[0..m) of a batch at once: sample k is
 * refs[k], t[k] (and v[k]); rc[k] receives what the single call would return. The index's shard
 * locks are taken once per shard (index_visit_refs), not twice per sample. 0, or -1 out of
 * memory (then nothing was checked or appended). */
int head_check_batch(head_t *h, const index_ref_t *refs, const int64_t *t, const uint32_t *sel, size_t m, int8_t *rc);
int head_append_batch(head_t *h, const index_ref_t *refs, const int64_t *t, const double *v, const uint32_t *sel,
                      size_t m, int8_t *rc, void **aux);
/* Convenience for tests and the in-memory store: resolve (ids from an internal counter) and
 * append. ls must be sorted. */
int head_append(head_t *h, const labels_t *ls, int64_t t, double v);

/* Expiry, in slices: moves the retained window to end at now_ms and sweeps at most `budget`
 * series (trimming expired chunks, cutting idle open chunks, removing empty series); a block's
 * slab is freed once a full sweep pass has unlinked it. Returns true when a pass just finished
 * or nothing is pending. Call it periodically (e.g. every second, budget 4096). */
bool head_expire(head_t *h, int64_t now_ms, uint32_t budget);
/* Oldest timestamp still accepted / kept. INT64_MIN before the first head_expire. */
int64_t head_min_valid_time(const head_t *h);

/* A querier over the head (see querier.h). Close it with querier_close. NULL on OOM. */
querier_t *head_querier(head_t *h);

index_t *head_index(head_t *h);

typedef struct {
    uint64_t series;
    uint64_t chunks;       /* closed + open */
    uint64_t chunk_bytes;  /* encoded bytes in closed and open chunks */
    uint64_t slab_bytes;   /* bytes allocated for closed chunks */
    uint64_t memory_bytes; /* estimate: index + series + chunks */
    uint64_t samples_appended, samples_replaced, out_of_order, too_old;
    uint64_t series_created, series_removed;
    int64_t min_t, max_t; /* INT64_MAX / INT64_MIN when empty */
} head_stats_t;

void head_get_stats(head_t *h, head_stats_t *out);

/* ---- snapshot support ----------------------------------------------------------------------- */

/* One series' in-memory state, as handed to a snapshot and back. */
typedef struct {
    uint64_t id;
    labels_t labels;
    const querier_chunk_t *chunks; /* closed chunks, time order */
    size_t nchunks;
    const uint8_t *open; /* open chunk bytes (may be NULL) */
    size_t open_len;
    uint8_t open_enc; /* CHUNK_ENC_XOR or CHUNK_ENC_INT (chunk_int's appendable layout) */
    bool has_pending; /* the newest sample, not yet encoded (same-second replace) */
    int64_t pending_t;
    double pending_v;
} head_series_state_t;

/* Calls fn for every series under its locks (fn must copy what it keeps and must not call
 * back into the head). fn returns 0 to go on. Returns 0 or fn's value. */
int head_foreach_series(head_t *h, int (*fn)(void *ud, const head_series_state_t *st), void *ud);
/* Recreates a series from a snapshot (chunks are copied; chunks older than the retained window
 * are skipped). Returns HEAD_OK, HEAD_ERR_LIMIT, HEAD_ERR_NOMEM, or -EINVAL style
 * HEAD_ERR_OUT_OF_ORDER if the chunks do not decode. */
int head_restore_series(head_t *h, const head_series_state_t *st);

#endif
