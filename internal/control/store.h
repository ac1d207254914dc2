/*
 * control/store — the durable home of flow-control states: the current state of every job and the
 * append-only audit log, in SQLite, with an in-memory copy of the current states for readers.
 *
 * File: <storage.path>/control.db, this module's alone (the series catalog and the roll-up tier
 * write sluice.db, whose long transactions must never hold up a pause). One connection, opened
 * once, in WAL journal mode with synchronous=FULL: each commit is fsync'd before the apply call
 * returns, so an acknowledged change survives a power cut. Its statements are prepared once.
 * Group commit: control_store_apply_batch writes every change queued meanwhile in one
 * transaction, one fsync for all. Checkpoints are not left to SQLite (which would run one inside
 * the commit that crosses 1000 WAL pages); the owner calls control_store_checkpoint between
 * changes. A busy_timeout makes another writer of the file (an operator's sqlite3) delay a change
 * instead of failing it.
 *
 * Tables (this module's only):
 *   control_jobs(job TEXT PRIMARY KEY, version INTEGER, state TEXT, expires_at_ms INTEGER)
 *       one row per job ever changed; `state` is the API JSON (control_state_to_json), which holds
 *       the state to return to when expires_at_ms (0 = never) is reached.
 *   control_events(id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT, version INTEGER, at_ms INTEGER,
 *                  updated_by TEXT, reason TEXT, state TEXT, UNIQUE(job, version))
 *       the audit log: one row per change, never updated or deleted. `id` is the global event id
 *       of the SSE stream (AUTOINCREMENT: ids are never reused, so Last-Event-ID resume stays
 *       correct across restarts); `version` is the job's version after the change.
 * Both rows of a change are written in one transaction.
 *
 * Threading: every function is thread-safe. Writers (apply, expire) are serialised by one mutex
 * that is held across the SQLite commit; readers of current states (get, list, metrics) take only
 * a short lock on the in-memory copy and never wait for a commit's fsync.
 */
#ifndef SLUICE_CONTROL_STORE_H
#define SLUICE_CONTROL_STORE_H

#include <stdint.h>

#include "internal/control/control.h"
#include "internal/util/buf.h"

typedef struct control_store control_store_t;

/* One change, as the stream and the long-polls see it. Heap-allocated, owned by the receiver. */
typedef struct {
    uint64_t id; /* global event id */
    char *job;
    uint64_t version; /* the job's version after the change */
    int64_t at_ms;
    char *json; /* control_state_to_json of the new state */
    size_t json_len;
} control_event_t;

enum {
    CONTROL_STORE_OK = 0,
    CONTROL_STORE_ERR = -1,
    CONTROL_STORE_CONFLICT = -2, /* chg->check_version and the version differs */
};

/* Opens (creating if needed) <dir>/sluice.db and the control tables, and loads current states.
 * NULL + err. */
control_store_t *control_store_open(const char *dir, char *err, size_t errlen);
void control_store_close(control_store_t *st);

/* A copy of a job's current state (RUNNING at version 0 if never changed); release with
 * control_state_free. 0 or -1 (OOM). */
int control_store_get(control_store_t *st, const char *job, control_state_t *out);
/* Appends the job's current state JSON to out and returns its version. */
uint64_t control_store_get_json(control_store_t *st, const char *job, buf_t *out);
/* Appends a JSON array of every job's current state, ordered by job name. */
void control_store_list_json(control_store_t *st, buf_t *out);
/* Number of jobs with a stored state. */
size_t control_store_job_count(control_store_t *st);

/* Applies a validated change (see control_state_apply), durably. On success *ev receives the event
 * (caller frees with control_event_free). CONTROL_STORE_CONFLICT writes the current version to
 * err. */
int control_store_apply(control_store_t *st, const char *job, const control_change_t *chg, int64_t now_ms,
                        const char *updated_by, control_event_t **ev, char *err, size_t errlen);

/* One change of a group commit. The caller fills job, chg and updated_by (borrowed); the store
 * fills rc (CONTROL_STORE_*), ev (on OK, owned by the caller) and err. */
typedef struct {
    const char *job;
    const control_change_t *chg;
    const char *updated_by;
    int rc;
    control_event_t *ev;
    char err[256]; /* CONFLICT: the current version */
} control_store_item_t;

/* Applies n changes in order in one transaction with one fsync. Each sees the changes before it
 * (versions count up through the batch; check_version is compared with the version the earlier
 * items made), so the result is the same as n control_store_apply calls in a row: an item that
 * conflicts changes nothing and the others still commit. If the storage fails, none of them is
 * committed (every item not in conflict gets CONTROL_STORE_ERR). Returns the number committed, or
 * -1 on a storage failure. */
int control_store_apply_batch(control_store_t *st, control_store_item_t *items, size_t n, int64_t now_ms);

/* Copies the WAL back into control.db (a passive checkpoint: it waits for no one) when it holds at
 * least min_frames pages. 1 checkpointed, 0 nothing to do, -1 error (harmless: retried later). */
int control_store_checkpoint(control_store_t *st, int min_frames);

/* The earliest expires_at_ms of any job, or 0 when nothing expires. */
int64_t control_store_next_expiry(control_store_t *st);
/* Reverts every job whose expiry is <= now_ms (control_state_revert), each as one durable change,
 * handing each event to fn (which takes ownership). Returns the number reverted, or -1 + err. */
int control_store_expire_due(control_store_t *st, int64_t now_ms, void (*fn)(control_event_t *ev, void *ud), void *ud,
                             char *err, size_t errlen);

/* The audit log of one job, newest first: appends
 *   {"job":J,"entries":[{"event_id":E, <state fields>}...],"next_before":V|null}
 * with at most `limit` entries of version < before (before = 0: from the newest). next_before is
 * the value to pass for the next page. 0 or -1 + err. */
int control_store_history_json(control_store_t *st, const char *job, uint64_t before, int limit, buf_t *out, char *err,
                               size_t errlen);
/* Events with id > after_id, oldest first, at most limit, for one job or all (job NULL), each
 * handed to fn (which takes ownership). Returns the number of events, or -1 + err. */
int control_store_events_since(control_store_t *st, uint64_t after_id, const char *job, int limit,
                               void (*fn)(control_event_t *ev, void *ud), void *ud, char *err, size_t errlen);
/* The id of the newest event (0 when the log is empty). */
uint64_t control_store_last_event_id(control_store_t *st);

/* sluice_control_mode{job,mode}, sluice_control_rate_limit_per_second{job},
 * sluice_control_expires_at_seconds{job} and sluice_control_changes_total (changes since start). */
void control_store_write_metrics(control_store_t *st, buf_t *out);

void control_event_free(control_event_t *ev);

#endif
