/*
 * catalog — the persistent series catalog: stable series id <-> label set, and a label index, in
 * the SQLite file <storage.path>/sluice.db (WAL journal mode, synchronous=NORMAL).
 *
 * The head keeps every active series in memory; the catalog is what survives a restart (ids are
 * never reused) and what lets history queries find series that have left memory. Schema: see the
 * top of catalog.c and docs/storage-rollups.md.
 *
 * Writes are queued: catalog_add_series copies the labels into a pending list and returns at once;
 * catalog_add_series_ref queues only the id and a hint, and the writer reads the labels back from
 * their owner (the head's index, which interns them) through the label source, so a burst of new
 * series costs ~6 bytes each in the queue (varint-encoded, see catalog.c) instead of a copy of
 * every label string.
 * The pending list is written by the roll-up writer thread at the start of each of its
 * transactions (so a series row is always durable no later than the first roll-up that names it),
 * or by catalog_flush when no roll-up writer runs. Lookups read committed rows only, through a
 * separate read connection (WAL mode: readers never wait for the writer), except
 * catalog_get_labels which also looks at the pending list.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef SLUICE_STORAGE_CATALOG_H
#define SLUICE_STORAGE_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/util/arena.h"

typedef struct catalog catalog_t;

/* A growable list of series ids (ascending when filled by a lookup). Zero-initialise; free with
 * catalog_ids_free. */
typedef struct {
    uint64_t *v;
    size_t n, cap;
} catalog_ids_t;

void catalog_ids_free(catalog_ids_t *ids);

/* Opens (creating if needed) <dir>/sluice.db and the catalog tables. dir must exist.
 * Returns NULL with a message in err on failure. Close with catalog_close. */
catalog_t *catalog_open(const char *dir, char *err, size_t errlen);
/* Writes what is pending, then closes. A roll-up opened on this catalog must be closed first. */
void catalog_close(catalog_t *cat);
/* Path of the database file (owned by the catalog). */
const char *catalog_path(const catalog_t *cat);

/* Called once per stored series by catalog_load. labels point into memory that is only valid
 * during the call (copy what you keep). Return 0 to continue, non-zero to stop (then
 * catalog_load returns that value). */
typedef int (*catalog_load_fn)(void *ud, uint64_t id, const labels_t *ls, int64_t first_t, int64_t last_t);
/* Iterates every committed series in id order (start-up). Returns 0, the callback's non-zero
 * value, or -1 on a database error. */
int catalog_load(catalog_t *cat, catalog_load_fn fn, void *ud);

/* Hands out a new series id (> every id ever handed out or stored; ids start at 1). Cheap
 * (an atomic increment); the id is persisted by catalog_add_series. */
uint64_t catalog_next_id(catalog_t *cat);

/* Queues (id, labels) for the writer; copies ls (sorted, unique names, __name__ included).
 * t = first time the series was seen (ms). Returns 0, or -1 on OOM / bad labels.
 * Adding an id that already exists keeps the stored labels and widens first/last seen. */
int catalog_add_series(catalog_t *cat, uint64_t id, const labels_t *ls, int64_t t);
/* The owner of the labels of series queued by catalog_add_series_ref: fills *out (strings in a)
 * with the labels of series id (hint as given to catalog_add_series_ref); returns 0, or 1 if the
 * series is gone. Called without any catalog lock held. */
typedef int (*catalog_label_fn)(void *ud, uint64_t id, uint64_t hint, arena_t *a, labels_t *out);
/* Set once, before the first catalog_add_series_ref. */
void catalog_set_label_source(catalog_t *cat, catalog_label_fn fn, void *ud);
/* Queues series id without copying its labels: the writer asks the label source for them. The
 * owner must keep the series until catalog_is_written(id) says it may let it go. Returns 0 or -1
 * (OOM). */
int catalog_add_series_ref(catalog_t *cat, uint64_t id, uint64_t hint, int64_t t);
/* catalog_add_series_ref for n series, queued under one lock round (a first push creates a
 * thousand). Returns 0 or -1 (OOM: the ones before the failure are queued). */
typedef struct {
    uint64_t id, hint;
    int64_t t;
} catalog_ref_t;
int catalog_add_series_refs(catalog_t *cat, const catalog_ref_t *refs, size_t n);
/* False while a catalog_add_series_ref of an id <= id may still need its labels (conservative:
 * series are queued in about id order, so a series newer than the oldest unwritten one waits). */
bool catalog_is_written(const catalog_t *cat, uint64_t id);
/* last_seen of a series the roll-up tier still holds in memory (it may get samples at any time):
 * the roll-up writer marks a series open once and writes its newest sample's time when it lets
 * the series go (storage/rollup.c, write_snaps). A range filter `last_seen >= mint` keeps it. */
#define CATALOG_SEEN_OPEN INT64_MAX

/* Records that series id had a sample at t (widens last_seen). Queued like catalog_add_series.
 * The roll-up writer already widens last_seen of every series whose roll-ups it writes (to the
 * newest sample it has seen), so the head does not need to call this. */
int catalog_touch_series(catalog_t *cat, uint64_t id, int64_t t);
/* Writes everything pending in one transaction now (when no roll-up writer runs, and in tests).
 * Returns 0 or -1. */
int catalog_flush(catalog_t *cat);

/* Ids of the series that have every pair eq[0..n) (equality matchers, n >= 1) and were seen
 * within [mint, maxt] (first_seen <= maxt and last_seen >= mint; pass INT64_MIN/INT64_MAX for no
 * bound). Appends to out in ascending order. Returns 0 or -1. */
int catalog_series_by_labels(catalog_t *cat, const label_t *eq, size_t n, int64_t mint, int64_t maxt,
                             catalog_ids_t *out);
/* Ids of the series that have a label `name` (any value), seen within [mint, maxt]. */
int catalog_series_with_name(catalog_t *cat, const char *name, int64_t mint, int64_t maxt, catalog_ids_t *out);
/* Distinct values of label `name` among series seen within [mint, maxt], sorted. Strings and the
 * array are allocated in arena a. Returns 0 or -1. */
int catalog_label_values(catalog_t *cat, const char *name, int64_t mint, int64_t maxt, arena_t *a, const char ***values,
                         size_t *n);
/* Distinct label names (including __name__) among series seen within [mint, maxt], sorted. */
int catalog_label_names(catalog_t *cat, int64_t mint, int64_t maxt, arena_t *a, const char ***names, size_t *n);
/* The oldest first_seen, but not before `since`, among series last seen at or after `since`
 * (INT64_MAX when there is none): where the data the store may still hold for them begins.
 * Returns 0 or -1. */
int catalog_min_first_seen(catalog_t *cat, int64_t since, int64_t *out);
/* Labels of series id, allocated in arena a. Returns 0, 1 if the id is unknown, -1 on error. */
int catalog_get_labels(catalog_t *cat, uint64_t id, arena_t *a, labels_t *out);

/* ---- shared inside storage/ (the roll-up writer) -------------------------------------------- */
struct sqlite3;
/* The write connection. Use only between catalog__write_lock and catalog__write_unlock. */
struct sqlite3 *catalog__write_db(catalog_t *cat);
void catalog__write_lock(catalog_t *cat);
void catalog__write_unlock(catalog_t *cat);
/* Writes the pending list with the write connection inside the caller's open transaction (lock
 * held): all of it when max is 0, else its oldest entries, whole queue blocks of a few thousand
 * entries, until at least max are taken (the rest waits for the next call; *left, if not NULL,
 * gets how many). The entries stay in flight until catalog__settle_pending. Returns 0 or -1. */
int catalog__write_pending(catalog_t *cat, size_t max, size_t *left);
/* Entries waiting for catalog__write_pending (tests check the queue with it). */
size_t catalog__pending_count(catalog_t *cat);
/* After the caller's COMMIT or ROLLBACK (lock still held): committed, the written entries are
 * done; otherwise they go back to the pending list for the next attempt. Call it after every
 * transaction that called catalog__write_pending, whatever that returned. */
void catalog__settle_pending(catalog_t *cat, bool committed);

#endif
