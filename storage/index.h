/*
 * index — the in-memory series index: interned label strings, series identity, postings.
 *
 * Strings are interned once in a global symbol table (string <-> uint32 symbol id, refcounted:
 * a symbol lives while some series uses it, then its id is reused). A series is stored as its
 * sorted (name id, value id) pairs plus a stable 64-bit id handed in by the caller (from the
 * catalog), and a fixed-size payload the owner (storage/head) uses for its samples, all in one
 * allocation.
 *
 * Series are sharded by label hash (INDEX_SHARDS shards). Each shard has a rwlock, its series
 * slots, a hash table label-hash -> slot and postings (label pair -> sorted slot list). A global
 * name -> values table (own rwlock) answers label-values queries and lets regex matchers be
 * evaluated once per distinct value, not once per shard.
 *
 * Locking contract. index_acquire*() return a series with its shard READ-locked; the caller
 * may use the series (and its payload, under the owner's own finer lock) until index_release().
 * Series are created and removed only under the shard's WRITE lock, so a held series never
 * disappears. Lock order: shard -> symbols -> names; never hold two shards at once.
 */
#ifndef SLUICE_STORAGE_INDEX_H
#define SLUICE_STORAGE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/labels/matcher.h"
#include "internal/util/arena.h"

#define INDEX_SHARDS 16

enum {
    INDEX_OK = 0,
    INDEX_ERR_NOMEM = -1,
    INDEX_ERR_LIMIT = -2, /* max_series reached */
};

typedef struct index index_t;
typedef struct index_series index_series_t;

/* Where a series lives; valid as long as the series with that id is in the index (checked by
 * index_acquire_ref, so a stale ref is harmless). */
typedef struct {
    uint64_t id;
    uint32_t shard;
    uint32_t slot;
} index_ref_t;

/* Growable list of refs. Zero-initialise; free with index_refs_free. */
typedef struct {
    index_ref_t *v;
    size_t n, cap;
} index_refs_t;

void index_refs_free(index_refs_t *r);

/* payload_size: bytes reserved per series for the owner (zeroed at creation). max_series: 0 =
 * unlimited. Returns NULL on OOM. */
index_t *index_new(size_t payload_size, uint64_t max_series);
/* Calls payload_free (may be NULL) for every series, then frees everything. */
void index_free(index_t *ix, void (*payload_free)(void *ud, index_series_t *s), void *ud);

/* Finds the series with labels ls (sorted, unique; hash = labels_hash(ls)). Returns it with its
 * shard read-locked, or NULL (nothing locked). */
index_series_t *index_acquire(index_t *ix, const labels_t *ls, uint64_t hash);
/* As index_acquire, creating the series with id `id` if it is absent (*created = true; its
 * payload is zeroed). Returns INDEX_OK with *out locked, INDEX_ERR_LIMIT or INDEX_ERR_NOMEM. */
int index_acquire_or_create(index_t *ix, const labels_t *ls, uint64_t hash, uint64_t id, index_series_t **out,
                            bool *created);
/* As index_acquire_or_create, returning the series' ref with nothing held: no read lock to take
 * again after a creation (pthread rwlocks cannot downgrade). look_first false skips the
 * read-locked lookup, for a caller that has just missed the series (the write-locked lookup
 * that creation makes still finds one created meanwhile). */
int index_get_or_create(index_t *ix, const labels_t *ls, uint64_t hash, uint64_t id, bool look_first, index_ref_t *ref,
                        bool *created);
/* Finding or creating many series at once (an ingest batch of a thousand new series): the
 * symbol table, the names table and the name lists are each locked once for the whole batch,
 * and each shard once, where index_get_or_create takes each once per series; two writers
 * creating at the same time then meet a handful of times, not thousands. Each item:
 *   in   labels (sorted, unique), hash = labels_hash(labels), id: the id to create the series
 *        with, or 0: the id the labels had when they left (index_departed_id), else next_id(ud)
 *        (next_id NULL: 0 is taken as given, as index_get_or_create takes any id)
 *   out  rc: INDEX_OK (ref set), INDEX_ERR_LIMIT or INDEX_ERR_NOMEM; made: INDEX_MADE_NONE (it
 *        was there: a series created meanwhile, or by an earlier item with the same labels),
 *        INDEX_MADE_NEW (created with the caller's id or a fresh one) or INDEX_MADE_RETURNED
 *        (created with its departed id)
 * The caller looks the series up first (a batch assumes they are missing). Returns 0, or -1 when
 * its scratch memory cannot be had (nothing done). */
enum { INDEX_MADE_NONE, INDEX_MADE_NEW, INDEX_MADE_RETURNED };
typedef uint64_t (*index_next_id_fn)(void *ud);
typedef struct {
    const labels_t *labels;
    uint64_t hash;
    uint64_t id;
    index_ref_t ref;
    int rc;
    int made;
} index_create_t;
int index_create_many(index_t *ix, index_create_t *items, size_t n, index_next_id_fn next_id, void *ud);
/* Ids outlive their series. A series that leaves the index (index_sweep) leaves its labels hash
 * -> id behind, so that the same labels coming back can be created with the same id; creating a
 * series forgets the entry of its hash (the id lives in the series again). So the ids of series in
 * memory cost nothing extra, and only those of departed ones take a table entry. The 64-bit
 * labels hash is trusted as identity here (no labels are kept).
 * index_departed_id: the id the labels with this hash had, if they left (true) or were noted.
 * index_departed_note: remembers an id for labels not in the index (the catalog's series at
 * startup); INDEX_OK or INDEX_ERR_NOMEM. */
bool index_departed_id(index_t *ix, uint64_t hash, uint64_t *id);
int index_departed_note(index_t *ix, uint64_t hash, uint64_t id);
/* The series ref points at, shard read-locked, or NULL if it is gone. */
index_series_t *index_acquire_ref(index_t *ix, const index_ref_t *ref);
void index_release(index_t *ix, index_series_t *s);

/* index_acquire_ref for many refs at once: for each k in sel[0..m), fn(ud, k, s) with s the
 * series refs[k] names (NULL if none), called with s's shard read-locked as between acquire
 * and release. Visits shard by shard, taking each shard's lock once (an ingest batch of a
 * thousand series takes 16 lock rounds, not a thousand), and within a shard in sel order.
 * 0, or -1 out of memory (then nothing was visited). */
typedef void (*index_ref_fn)(void *ud, uint32_t k, index_series_t *s);
int index_visit_refs(index_t *ix, const index_ref_t *refs, const uint32_t *sel, size_t m, index_ref_fn fn, void *ud);

uint64_t index_series_id(const index_series_t *s);
index_ref_t index_series_ref(const index_series_t *s);
void *index_series_payload(index_series_t *s);
size_t index_series_nlabels(const index_series_t *s);
/* Fills out[0..nlabels) with the series' labels; the strings belong to the index and stay valid
 * while the series is held (copy them before index_release). */
void index_series_labels(const index_t *ix, const index_series_t *s, label_t *out);
/* Copies the labels into arena a (strings too). */
void index_series_labels_copy(const index_t *ix, const index_series_t *s, arena_t *a, labels_t *out);

/* Refs of all series matching every matcher (Prometheus semantics, see matcher.h), appended to
 * out in no particular order. n = 0 selects every series. Returns INDEX_OK or INDEX_ERR_NOMEM. */
int index_select(index_t *ix, const matcher_t *const *ms, size_t n, index_refs_t *out);

/* Sorted distinct label names (values of `name`) of the series matching ms (n = 0: all series).
 * The array and strings are allocated in a. Returns INDEX_OK or INDEX_ERR_NOMEM. */
int index_label_names(index_t *ix, const matcher_t *const *ms, size_t n, arena_t *a, const char ***names,
                      size_t *count);
int index_label_values(index_t *ix, const char *name, const matcher_t *const *ms, size_t n, arena_t *a,
                       const char ***values, size_t *count);

/* Visits the series of shard `shard` from slot *cursor on, at most `budget` of them, under the
 * shard's WRITE lock; fn returns true to remove the series (after freeing what its payload owns).
 * *cursor advances; returns true when the shard is done (and resets *cursor to 0). */
bool index_sweep(index_t *ix, uint32_t shard, uint32_t *cursor, uint32_t budget,
                 bool (*fn)(void *ud, index_series_t *s), void *ud);

/* Calls fn for every series, one shard at a time under its READ lock. fn returns 0 to go on. */
int index_foreach(index_t *ix, int (*fn)(void *ud, index_series_t *s), void *ud);

uint64_t index_num_series(const index_t *ix);
/* Approximate heap bytes used by the index itself (series structs, symbols, postings). */
uint64_t index_memory_bytes(const index_t *ix);

typedef struct {
    const char *name;
    uint64_t value;
} index_stat_t;

/* Prometheus /api/v1/status/tsdb statistics, top `top` of each, descending; strings and arrays
 * in arena a. */
typedef struct {
    index_stat_t *series_by_metric; /* series count by __name__ value */
    size_t n_series_by_metric;
    index_stat_t *values_by_name; /* distinct value count by label name */
    size_t n_values_by_name;
    index_stat_t *memory_by_name; /* sum of value bytes by label name */
    size_t n_memory_by_name;
    index_stat_t *series_by_pair; /* series count by "name=value" */
    size_t n_series_by_pair;
} index_stats_t;

int index_stats(index_t *ix, size_t top, arena_t *a, index_stats_t *out);

#endif
