/*
 * control/store — SQLite persistence, audit log and in-memory current states; see store.h for the
 * tables and the locking rule (writers: db_mu across the commit; readers: cache_mu, briefly).
 *
 * The in-memory copy is an array of jobs sorted by name (binary search; a few thousand jobs at
 * most). Each entry keeps its parsed state and its JSON, so a read is a lookup and a memcpy.
 */
#include "internal/control/store.h"

#include <assert.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/log.h"

typedef struct {
    char *job;
    control_state_t state;
    char *json;
    size_t json_len;
} store_entry_t;

struct control_store {
    sqlite3 *db;
    sqlite3_stmt *ins_event, *put_job; /* prepared once at open; used under db_mu */
    int wal_frames;                    /* frames in the WAL since the last checkpoint (db_mu) */
    pthread_mutex_t db_mu;    /* serialises writers and every use of db */
    pthread_mutex_t cache_mu; /* guards jobs/njobs */
    store_entry_t *jobs;
    size_t njobs, cap;
    uint64_t last_event_id; /* under cache_mu */
    _Atomic uint64_t changes_total;
};

static const char store_schema[] =
    "CREATE TABLE IF NOT EXISTS control_jobs("
    " job TEXT PRIMARY KEY, version INTEGER NOT NULL, state TEXT NOT NULL, expires_at_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS control_events("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, version INTEGER NOT NULL, at_ms INTEGER NOT NULL,"
    " updated_by TEXT NOT NULL, reason TEXT NOT NULL, state TEXT NOT NULL, UNIQUE(job, version));";

void control_event_free(control_event_t *ev)
{
    if (!ev)
        return;
    free(ev->job);
    free(ev->json);
    free(ev);
}

/* --- the in-memory copy (cache_mu held) ---------------------------------------------------------- */

static size_t store_find(const control_store_t *st, const char *job, bool *found)
{
    size_t lo = 0, hi = st->njobs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(st->jobs[mid].job, job);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* Installs (taking ownership of state and json) the new current state of job. */
static int store_put(control_store_t *st, const char *job, control_state_t *state, char *json, size_t json_len)
{
    bool found;
    size_t i = store_find(st, job, &found);
    if (found) {
        store_entry_t *e = &st->jobs[i];
        control_state_free(&e->state);
        free(e->json);
        e->state = *state;
        e->json = json;
        e->json_len = json_len;
        return 0;
    }
    if (st->njobs == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 16;
        store_entry_t *n = realloc(st->jobs, cap * sizeof(*n));
        if (!n)
            return -1;
        st->jobs = n;
        st->cap = cap;
    }
    char *name = strdup(job);
    if (!name)
        return -1;
    memmove(&st->jobs[i + 1], &st->jobs[i], (st->njobs - i) * sizeof(*st->jobs));
    st->jobs[i] = (store_entry_t){.job = name, .state = *state, .json = json, .json_len = json_len};
    st->njobs++;
    return 0;
}

/* --- open / close ------------------------------------------------------------------------------------ */

static int store_exec(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int store_load(control_store_t *st, char *err, size_t errlen)
{
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(st->db, "SELECT job, state FROM control_jobs ORDER BY job", -1, &q, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        return -1;
    }
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *job = (const char *)sqlite3_column_text(q, 0);
        const char *json = (const char *)sqlite3_column_text(q, 1);
        size_t len = (size_t)sqlite3_column_bytes(q, 1);
        control_state_t s;
        char perr[128];
        if (!job || !json || control_state_from_json(json, len, &s, perr, sizeof(perr)) != 0) {
            /* One damaged row must not take every other job's state with it. */
            log_error("control", "ignoring a malformed stored state", LF_S("job", job ? job : "?"), LF_S("err", perr));
            continue;
        }
        char *copy = strndup(json, len);
        if (!copy || store_put(st, job, &s, copy, len) != 0) {
            free(copy);
            control_state_free(&s);
            sqlite3_finalize(q);
            snprintf(err, errlen, "out of memory loading control states");
            return -1;
        }
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        return -1;
    }
    /* sqlite_sequence remembers the highest id ever handed out, even if rows were removed by hand. */
    if (sqlite3_prepare_v2(st->db,
                           "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name='control_events'),0),"
                           " coalesce((SELECT max(id) FROM control_events),0))",
                           -1, &q, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        return -1;
    }
    if (sqlite3_step(q) == SQLITE_ROW)
        st->last_event_id = (uint64_t)sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return 0;
}

static int store_wal_hook(void *ud, sqlite3 *db, const char *name, int frames)
{
    (void)db;
    (void)name;
    ((control_store_t *)ud)->wal_frames = frames;
    return SQLITE_OK;
}

control_store_t *control_store_open(const char *dir, char *err, size_t errlen)
{
    control_store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&st->db_mu, NULL);
    pthread_mutex_init(&st->cache_mu, NULL);
    /* Its own file in the data directory, not sluice.db: the roll-up writer's transactions on
     * sluice.db can hold its write lock for seconds on a large flush, and a pause must never
     * wait for (or fail on) that. */
    size_t n = strlen(dir) + sizeof("/control.db");
    char *path = malloc(n);
    if (!path) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(path, n, "%s/control.db", dir);
    int rc = sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "cannot open %s: %s", path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        free(path);
        goto fail;
    }
    free(path);
    sqlite3_busy_timeout(st->db, 10000);
    /* wal_autocheckpoint=0: SQLite would otherwise checkpoint (and fsync control.db) inside the
     * commit that crosses 1000 WAL pages, i.e. while a change's pollers wait; the control thread
     * checkpoints between changes instead (control_store_checkpoint). journal_size_limit keeps
     * the WAL file at its size after a reset, so later commits overwrite blocks that are already
     * allocated and their fdatasync does not wait for a filesystem journal commit. */
    if (store_exec(st->db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA wal_autocheckpoint=0;"
                   " PRAGMA journal_size_limit=8388608;",
                   err, errlen) != 0 ||
        store_exec(st->db, store_schema, err, errlen) != 0 || store_load(st, err, errlen) != 0)
        goto fail;
    if (sqlite3_prepare_v3(st->db,
                           "INSERT INTO control_events(job, version, at_ms, updated_by, reason, state)"
                           " VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
                           -1, SQLITE_PREPARE_PERSISTENT, &st->ins_event, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(st->db,
                           "INSERT OR REPLACE INTO control_jobs(job, version, state, expires_at_ms)"
                           " VALUES(?1, ?2, ?3, ?4)",
                           -1, SQLITE_PREPARE_PERSISTENT, &st->put_job, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        goto fail;
    }
    sqlite3_wal_hook(st->db, store_wal_hook, st);
    return st;
fail:
    control_store_close(st);
    return NULL;
}

void control_store_close(control_store_t *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->njobs; i++) {
        free(st->jobs[i].job);
        free(st->jobs[i].json);
        control_state_free(&st->jobs[i].state);
    }
    free(st->jobs);
    sqlite3_finalize(st->ins_event);
    sqlite3_finalize(st->put_job);
    if (st->db)
        sqlite3_close(st->db);
    pthread_mutex_destroy(&st->db_mu);
    pthread_mutex_destroy(&st->cache_mu);
    free(st);
}

/* --- reads ----------------------------------------------------------------------------------------- */

int control_store_get(control_store_t *st, const char *job, control_state_t *out)
{
    int rc = 0;
    pthread_mutex_lock(&st->cache_mu);
    bool found;
    size_t i = store_find(st, job, &found);
    if (found)
        rc = control_state_copy(out, &st->jobs[i].state);
    else
        control_state_init(out);
    pthread_mutex_unlock(&st->cache_mu);
    return rc;
}

uint64_t control_store_get_json(control_store_t *st, const char *job, buf_t *out)
{
    uint64_t v = 0;
    pthread_mutex_lock(&st->cache_mu);
    bool found;
    size_t i = store_find(st, job, &found);
    if (found) {
        buf_append(out, st->jobs[i].json, st->jobs[i].json_len);
        v = st->jobs[i].state.version;
    }
    pthread_mutex_unlock(&st->cache_mu);
    if (!found) {
        control_state_t s;
        control_state_init(&s);
        control_state_to_json(&s, job, out);
    }
    return v;
}

void control_store_list_json(control_store_t *st, buf_t *out)
{
    pthread_mutex_lock(&st->cache_mu);
    buf_putc(out, '[');
    for (size_t i = 0; i < st->njobs; i++) {
        if (i)
            buf_putc(out, ',');
        buf_append(out, st->jobs[i].json, st->jobs[i].json_len);
    }
    buf_putc(out, ']');
    pthread_mutex_unlock(&st->cache_mu);
}

size_t control_store_job_count(control_store_t *st)
{
    pthread_mutex_lock(&st->cache_mu);
    size_t n = st->njobs;
    pthread_mutex_unlock(&st->cache_mu);
    return n;
}

uint64_t control_store_last_event_id(control_store_t *st)
{
    pthread_mutex_lock(&st->cache_mu);
    uint64_t id = st->last_event_id;
    pthread_mutex_unlock(&st->cache_mu);
    return id;
}

/* --- writes (db_mu held) ---------------------------------------------------------------------------- */

/* Writes one change's two rows inside the open transaction; *id receives its event id. */
static int store_write_rows(control_store_t *st, const char *job, const control_state_t *next, const buf_t *json,
                            uint64_t *id)
{
    sqlite3_stmt *ins = st->ins_event, *up = st->put_job;
    sqlite3_bind_text(ins, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(ins, 2, (sqlite3_int64)next->version);
    sqlite3_bind_int64(ins, 3, next->updated_at_ms);
    sqlite3_bind_text(ins, 4, next->updated_by, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins, 5, next->reason, -1, SQLITE_STATIC);
    sqlite3_bind_text(ins, 6, json->data, (int)json->len, SQLITE_STATIC);
    int rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    sqlite3_clear_bindings(ins);
    if (rc != SQLITE_DONE)
        return -1;
    *id = (uint64_t)sqlite3_last_insert_rowid(st->db);
    sqlite3_bind_text(up, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(up, 2, (sqlite3_int64)next->version);
    sqlite3_bind_text(up, 3, json->data, (int)json->len, SQLITE_STATIC);
    sqlite3_bind_int64(up, 4, next->expires_at_ms);
    rc = sqlite3_step(up);
    sqlite3_reset(up);
    sqlite3_clear_bindings(up);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* One change on its way into a transaction (store_txn_*). */
typedef struct {
    const char *job;
    control_state_t next; /* owned until installed */
    buf_t json;
    uint64_t id;
    bool live; /* written in this transaction */
} store_pending_t;

/* After COMMIT: installs a written change in the cache (taking next and json) and makes its event.
 * Returns the event, or NULL (out of memory: the cache is behind the file, said loudly). */
static control_event_t *store_install(control_store_t *st, store_pending_t *p)
{
    control_event_t *ev = calloc(1, sizeof(*ev));
    char *cache_json = strndup(p->json.data, p->json.len);
    if (ev) {
        ev->id = p->id;
        ev->job = strdup(p->job);
        ev->version = p->next.version;
        ev->at_ms = p->next.updated_at_ms;
        ev->json = strndup(p->json.data, p->json.len);
        ev->json_len = p->json.len;
    }
    pthread_mutex_lock(&st->cache_mu);
    if (p->id > st->last_event_id)
        st->last_event_id = p->id;
    int prc = cache_json ? store_put(st, p->job, &p->next, cache_json, p->json.len) : -1;
    pthread_mutex_unlock(&st->cache_mu);
    if (prc != 0) {
        free(cache_json);
        control_state_free(&p->next);
    } else {
        control_state_init(&p->next); /* the cache owns it now */
    }
    buf_free(&p->json);
    p->live = false;
    if (prc != 0 || !ev || !ev->job || !ev->json) {
        log_error("control", "out of memory after a committed change", LF_S("job", p->job));
        control_event_free(ev);
        return NULL;
    }
    atomic_fetch_add(&st->changes_total, 1);
    return ev;
}

static void store_pending_drop(store_pending_t *p)
{
    control_state_free(&p->next);
    buf_free(&p->json);
    p->live = false;
}

/* Writes next as job's new state plus its audit row, in one transaction, then installs it in the
 * cache. Takes ownership of next. */
static int store_commit(control_store_t *st, const char *job, control_state_t *next, control_event_t **evp, char *err,
                        size_t errlen)
{
    store_pending_t p = {.job = job, .next = *next, .json = BUF_INIT};
    control_state_to_json(&p.next, job, &p.json);
    if (store_exec(st->db, "BEGIN IMMEDIATE", err, errlen) != 0) {
        store_pending_drop(&p);
        return -1;
    }
    if (store_write_rows(st, job, &p.next, &p.json, &p.id) != 0 ||
        sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        store_pending_drop(&p);
        return -1;
    }
    *evp = store_install(st, &p);
    if (!*evp) {
        snprintf(err, errlen, "out of memory after commit");
        return -1;
    }
    return 0;
}

int control_store_apply_batch(control_store_t *st, control_store_item_t *items, size_t n, int64_t now_ms)
{
    store_pending_t *pend = calloc(n ? n : 1, sizeof(*pend));
    if (!pend) {
        for (size_t i = 0; i < n; i++) {
            items[i].rc = CONTROL_STORE_ERR;
            items[i].ev = NULL;
            snprintf(items[i].err, sizeof(items[i].err), "out of memory");
        }
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        items[i].rc = CONTROL_STORE_ERR; /* until it is decided */
        items[i].ev = NULL;
        items[i].err[0] = 0;
    }
    pthread_mutex_lock(&st->db_mu);
    char err[256] = "";
    bool failed = store_exec(st->db, "BEGIN IMMEDIATE", err, sizeof(err)) != 0;
    size_t written = 0;
    for (size_t i = 0; i < n && !failed; i++) {
        control_store_item_t *it = &items[i];
        /* The current state: the newest change to this job earlier in the batch, else the cache. */
        control_state_t cur;
        const store_pending_t *prev = NULL;
        for (size_t j = i; j-- > 0;)
            if (pend[j].live && strcmp(pend[j].job, it->job) == 0) {
                prev = &pend[j];
                break;
            }
        int crc = prev ? control_state_copy(&cur, &prev->next) : control_store_get(st, it->job, &cur);
        if (crc != 0) {
            it->rc = CONTROL_STORE_ERR;
            snprintf(it->err, sizeof(it->err), "out of memory");
            continue;
        }
        if (it->chg->check_version && it->chg->expect_version != cur.version) {
            it->rc = CONTROL_STORE_CONFLICT;
            snprintf(it->err, sizeof(it->err), "%llu", (unsigned long long)cur.version);
            control_state_free(&cur);
            continue;
        }
        /* Wall clocks step backwards; updated_at must not, or TIS's lastModified check misses it. */
        int64_t at = now_ms <= cur.updated_at_ms ? cur.updated_at_ms + 1 : now_ms;
        store_pending_t *p = &pend[i];
        p->job = it->job;
        p->json = (buf_t)BUF_INIT;
        int arc = control_state_apply(&cur, it->chg, at, it->updated_by, &p->next);
        control_state_free(&cur);
        if (arc != 0) {
            it->rc = CONTROL_STORE_ERR;
            snprintf(it->err, sizeof(it->err), "out of memory");
            continue;
        }
        control_state_to_json(&p->next, it->job, &p->json);
        p->live = true;
        it->rc = CONTROL_STORE_OK;
        if (store_write_rows(st, it->job, &p->next, &p->json, &p->id) != 0) {
            snprintf(err, sizeof(err), "sqlite: %s", sqlite3_errmsg(st->db));
            failed = true;
        }
        written++;
    }
    /* One COMMIT, one fsync of the WAL, for every change of the batch. */
    if (!failed && written && sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(err, sizeof(err), "sqlite: %s", sqlite3_errmsg(st->db));
        failed = true;
    } else if (!failed && !written) {
        sqlite3_exec(st->db, "COMMIT", NULL, NULL, NULL); /* nothing to write: just end it */
    }
    int committed = 0;
    if (failed) {
        if (!sqlite3_get_autocommit(st->db))
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        for (size_t i = 0; i < n; i++) {
            if (pend[i].live)
                store_pending_drop(&pend[i]);
            if (items[i].rc == CONTROL_STORE_OK || !items[i].err[0]) {
                items[i].rc = CONTROL_STORE_ERR;
                snprintf(items[i].err, sizeof(items[i].err), "%s", err);
            }
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            if (!pend[i].live)
                continue;
            items[i].ev = store_install(st, &pend[i]);
            if (!items[i].ev) {
                items[i].rc = CONTROL_STORE_ERR;
                snprintf(items[i].err, sizeof(items[i].err), "out of memory after commit");
            } else {
                committed++;
            }
        }
    }
    pthread_mutex_unlock(&st->db_mu);
    free(pend);
    return failed ? -1 : committed;
}

int control_store_apply(control_store_t *st, const char *job, const control_change_t *chg, int64_t now_ms,
                        const char *updated_by, control_event_t **ev, char *err, size_t errlen)
{
    control_store_item_t it = {.job = job, .chg = chg, .updated_by = updated_by};
    control_store_apply_batch(st, &it, 1, now_ms);
    *ev = it.ev;
    if (it.rc != CONTROL_STORE_OK)
        snprintf(err, errlen, "%s", it.err);
    return it.rc;
}

int control_store_checkpoint(control_store_t *st, int min_frames)
{
    int rc = 0;
    pthread_mutex_lock(&st->db_mu);
    if (st->wal_frames >= min_frames && st->wal_frames > 0) {
        int log = 0, done = 0;
        rc = sqlite3_wal_checkpoint_v2(st->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done) == SQLITE_OK ? 1 : -1;
        if (rc == 1 && done == log)
            st->wal_frames = 0; /* all copied: the next commit restarts the WAL from its start */
    }
    pthread_mutex_unlock(&st->db_mu);
    return rc;
}

int64_t control_store_next_expiry(control_store_t *st)
{
    int64_t next = 0;
    pthread_mutex_lock(&st->cache_mu);
    for (size_t i = 0; i < st->njobs; i++) {
        int64_t e = st->jobs[i].state.expires_at_ms;
        if (e && (next == 0 || e < next))
            next = e;
    }
    pthread_mutex_unlock(&st->cache_mu);
    return next;
}

int control_store_expire_due(control_store_t *st, int64_t now_ms, void (*fn)(control_event_t *ev, void *ud), void *ud,
                             char *err, size_t errlen)
{
    int n = 0;
    pthread_mutex_lock(&st->db_mu);
    for (;;) {
        /* Find one due job; committing changes the array, so search again each time. */
        char *job = NULL;
        control_state_t cur;
        pthread_mutex_lock(&st->cache_mu);
        for (size_t i = 0; i < st->njobs && !job; i++) {
            const control_state_t *s = &st->jobs[i].state;
            if (s->has_revert && s->expires_at_ms <= now_ms) {
                job = strdup(st->jobs[i].job);
                if (job && control_state_copy(&cur, s) != 0) {
                    free(job);
                    job = NULL;
                    break;
                }
            }
        }
        pthread_mutex_unlock(&st->cache_mu);
        if (!job)
            break;
        control_state_t next;
        control_event_t *ev = NULL;
        int rc = control_state_revert(&cur, now_ms, &next);
        if (rc == 0)
            rc = store_commit(st, job, &next, &ev, err, errlen);
        else
            snprintf(err, errlen, "out of memory");
        control_state_free(&cur);
        if (rc != 0) {
            free(job);
            pthread_mutex_unlock(&st->db_mu);
            return -1;
        }
        log_info("control", "temporary change expired; previous state restored", LF_S("job", job),
                 LF_I("version", (int64_t)ev->version));
        free(job);
        n++;
        if (fn)
            fn(ev, ud);
        else
            control_event_free(ev);
    }
    pthread_mutex_unlock(&st->db_mu);
    return n;
}

/* --- audit log ------------------------------------------------------------------------------------------ */

/* "{...}" state JSON -> "{"event_id":E,...}" */
static void store_put_entry(buf_t *out, uint64_t id, const char *json, size_t len)
{
    buf_printf(out, "{\"event_id\":%llu,", (unsigned long long)id);
    if (len > 2)
        buf_append(out, json + 1, len - 1);
    else
        out->data[--out->len] = '}';
}

int control_store_history_json(control_store_t *st, const char *job, uint64_t before, int limit, buf_t *out, char *err,
                               size_t errlen)
{
    sqlite3_stmt *q = NULL;
    pthread_mutex_lock(&st->db_mu);
    if (sqlite3_prepare_v2(st->db,
                           "SELECT id, version, state FROM control_events WHERE job = ?1 AND version < ?2"
                           " ORDER BY version DESC LIMIT ?3",
                           -1, &q, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        pthread_mutex_unlock(&st->db_mu);
        return -1;
    }
    sqlite3_bind_text(q, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, before ? (sqlite3_int64)before : INT64_MAX);
    sqlite3_bind_int(q, 3, limit + 1); /* one more tells whether another page exists */
    buf_puts(out, "{\"job\":");
    buf_put_json_string(out, job, strlen(job));
    buf_puts(out, ",\"entries\":[");
    int n = 0, rc;
    uint64_t last_version = 0;
    bool more = false;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        if (n == limit) {
            more = true;
            break;
        }
        if (n)
            buf_putc(out, ',');
        last_version = (uint64_t)sqlite3_column_int64(q, 1);
        store_put_entry(out, (uint64_t)sqlite3_column_int64(q, 0), (const char *)sqlite3_column_text(q, 2),
                        (size_t)sqlite3_column_bytes(q, 2));
        n++;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        sqlite3_finalize(q);
        pthread_mutex_unlock(&st->db_mu);
        return -1;
    }
    sqlite3_finalize(q);
    pthread_mutex_unlock(&st->db_mu);
    if (more)
        buf_printf(out, "],\"next_before\":%llu}", (unsigned long long)last_version);
    else
        buf_puts(out, "],\"next_before\":null}");
    return 0;
}

int control_store_events_since(control_store_t *st, uint64_t after_id, const char *job, int limit,
                               void (*fn)(control_event_t *ev, void *ud), void *ud, char *err, size_t errlen)
{
    sqlite3_stmt *q = NULL;
    pthread_mutex_lock(&st->db_mu);
    if (sqlite3_prepare_v2(st->db,
                           "SELECT id, job, version, at_ms, state FROM control_events"
                           " WHERE id > ?1 AND (?2 IS NULL OR job = ?2) ORDER BY id LIMIT ?3",
                           -1, &q, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        pthread_mutex_unlock(&st->db_mu);
        return -1;
    }
    sqlite3_bind_int64(q, 1, (sqlite3_int64)after_id);
    if (job)
        sqlite3_bind_text(q, 2, job, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(q, 2);
    sqlite3_bind_int(q, 3, limit);
    int n = 0, rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        control_event_t *ev = calloc(1, sizeof(*ev));
        if (!ev)
            break;
        ev->id = (uint64_t)sqlite3_column_int64(q, 0);
        ev->job = strdup((const char *)sqlite3_column_text(q, 1));
        ev->version = (uint64_t)sqlite3_column_int64(q, 2);
        ev->at_ms = sqlite3_column_int64(q, 3);
        ev->json_len = (size_t)sqlite3_column_bytes(q, 4);
        ev->json = strndup((const char *)sqlite3_column_text(q, 4), ev->json_len);
        if (!ev->job || !ev->json) {
            control_event_free(ev);
            break;
        }
        fn(ev, ud);
        n++;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(st->db));
        n = -1;
    } else if (rc == SQLITE_ROW) {
        snprintf(err, errlen, "out of memory");
        n = -1;
    }
    sqlite3_finalize(q);
    pthread_mutex_unlock(&st->db_mu);
    return n;
}

/* --- metrics ------------------------------------------------------------------------------------------ */

static void store_put_label(buf_t *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            buf_putc(out, '\\');
        if (*s == '\n') {
            buf_puts(out, "\\n");
            continue;
        }
        buf_putc(out, *s);
    }
}

void control_store_write_metrics(control_store_t *st, buf_t *out)
{
    buf_puts(out, "# HELP sluice_control_mode Flow-control mode of a job (1 for the current mode).\n"
                  "# TYPE sluice_control_mode gauge\n");
    pthread_mutex_lock(&st->cache_mu);
    for (size_t i = 0; i < st->njobs; i++)
        for (int m = 0; m < CONTROL_NMODES; m++) {
            buf_puts(out, "sluice_control_mode{job=\"");
            store_put_label(out, st->jobs[i].job);
            buf_printf(out, "\",mode=\"%s\"} %d\n", control_mode_name((control_mode_t)m),
                       st->jobs[i].state.spec.mode == (control_mode_t)m);
        }
    buf_puts(out, "# HELP sluice_control_rate_limit_per_second Records per second a rate-limited job may "
                  "process (0 when not rate limited).\n# TYPE sluice_control_rate_limit_per_second gauge\n");
    for (size_t i = 0; i < st->njobs; i++) {
        buf_puts(out, "sluice_control_rate_limit_per_second{job=\"");
        store_put_label(out, st->jobs[i].job);
        buf_printf(out, "\"} %lld\n", (long long)st->jobs[i].state.spec.rate_limit_per_second);
    }
    buf_puts(out, "# HELP sluice_control_version Version of a job's control state.\n"
                  "# TYPE sluice_control_version gauge\n");
    for (size_t i = 0; i < st->njobs; i++) {
        buf_puts(out, "sluice_control_version{job=\"");
        store_put_label(out, st->jobs[i].job);
        buf_printf(out, "\"} %llu\n", (unsigned long long)st->jobs[i].state.version);
    }
    buf_puts(out, "# HELP sluice_control_expires_at_seconds When a job's temporary change expires (0 = never).\n"
                  "# TYPE sluice_control_expires_at_seconds gauge\n");
    for (size_t i = 0; i < st->njobs; i++) {
        buf_puts(out, "sluice_control_expires_at_seconds{job=\"");
        store_put_label(out, st->jobs[i].job);
        buf_printf(out, "\"} %.3f\n", (double)st->jobs[i].state.expires_at_ms / 1000.0);
    }
    pthread_mutex_unlock(&st->cache_mu);
    buf_printf(out,
               "# HELP sluice_control_changes_total Flow-control changes committed since start (expiries "
               "included).\n# TYPE sluice_control_changes_total counter\nsluice_control_changes_total %llu\n",
               (unsigned long long)atomic_load(&st->changes_total));
}
