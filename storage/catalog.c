/*
 * catalog — persistent series catalog (series id <-> labels) and label index in SQLite.
 *
 * File: <storage.path>/sluice.db, shared with the roll-up tier (storage/rollup.c), opened in WAL
 * journal mode with synchronous=NORMAL: a commit is an append to the -wal file, fsync'd at
 * checkpoints, so a power cut can lose the last commits but never corrupts the file.
 *
 * Tables (also documented for humans in docs/storage-rollups.md):
 *
 *   series(id INTEGER PRIMARY KEY,      stable series id, never reused
 *          metric TEXT,                 value of __name__ ('' if none), indexed
 *          labels TEXT,                 the other labels as {a="b",c="d"} (Prometheus escaping,
 *                                       sorted by name) - for people with the sqlite3 CLI
 *          enc BLOB,                    canonical encoding of the full sorted set, see below
 *          first_seen INTEGER,          ms; widened by catalog_add_series
 *          last_seen INTEGER)           ms; widened by catalog_touch_series; CATALOG_SEEN_OPEN
 *                                       (INT64_MAX) while the roll-up writer holds the series,
 *                                       which writes its newest sample's time when it lets go
 *   label_pair(id INTEGER PRIMARY KEY, name, value, UNIQUE(name, value))
 *                                       every label pair ever written, __name__ included, once
 *   label_posting(pair_id, series_id) WITHOUT ROWID, primary key in that order: the postings of
 *          each pair, for matchers over series that left memory.
 *   label_index(name, value, series_id) a VIEW joining the two (what version 1 stored as a table)
 *   meta(key, value)                    key 'catalog_version' = 2.
 *
 * Why pairs are numbered (version 2): version 1 stored each posting as a (name, value, series_id)
 * row. A Flink series has ~11 labels whose values are often 50-150 bytes (task and operator
 * names), so each new series cost ~11 b-tree descents comparing long strings and ~700 bytes of
 * index: writing 256k series took ~8 s of CPU and 420 MB, as much CPU as ingesting them. Now a
 * new series' postings are ~11 rows of two integers; a pair's strings are looked up once per
 * write chunk (a chunk's series share most pairs). A version-1 file is converted when opened
 * (catalog_open, one transaction); the label_index view keeps queries written against the old
 * table working.
 *
 * enc, for each label in name order:
 *   | uvarint | name length n            |
 *   | n bytes | name                     |
 *   | uvarint | value length m           |
 *   | m bytes | value                    |
 * (uvarint = LEB128, 7 bits per byte, low group first, high bit = more follows.)
 *
 * Writes go through a pending list (mutex-protected, varint-encoded blocks; see "the pending
 * queue" below): ingest threads only append to it, the roll-up writer drains it inside its own
 * transaction. The write connection is guarded by write_mu so catalog_flush and the roll-up
 * writer never interleave statements.
 * Lookups use a second connection guarded by read_mu; in WAL mode it reads the last committed
 * state without waiting for the writer.
 */
#include "storage/catalog.h"

#include <assert.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "internal/util/buf.h"
#include "internal/util/hashmap.h"
#include "internal/util/log.h"
#include "internal/util/varint.h"

/* ---- types ------------------------------------------------------------------------------ */

typedef enum { PENDING_ADD = 0, PENDING_TOUCH, PENDING_REF } pending_kind_t;

/* One queued write, as pq_push takes it and pq_next hands it back. */
typedef struct {
    pending_kind_t kind;
    uint64_t id;
    int64_t t;
    labels_t ls;   /* PENDING_ADD: ls.v and the strings live in one malloc'd block at ls.v */
    uint64_t hint; /* PENDING_REF: handed back to the label source */
} pending_t;

/* The pending list, encoded. A burst of new series queues a quarter of a million references at
 * once (round 1 of a Flink fleet), which the writer takes seconds to write; as 40-byte structs
 * they held ~10 MB (plus the doubling array's slack) all that time. Entries are appended to a
 * chain of blocks as a tag byte and varints relative to the block's previous entry:
 *
 *   tag        bits 0-1 kind; bit 2: id = previous id + 1; bit 3: t = previous t
 *   [id]       zigzag varint of id - previous id, unless bit 2
 *   [t]        zigzag varint of t - previous t, unless bit 3
 *   REF        uvarint(hint >> 32), uvarint(hint & 0xffffffff)   (storage's hint: shard, slot)
 *   ADD        the label block's pointer (8 bytes as they are), uvarint(label count)
 *
 * so a series queued by reference costs ~5-7 bytes. Each block starts from id 0 and t 0, so
 * blocks decode on their own and a failed write's blocks are put back in front of newer ones as
 * they are. A block also keeps the smallest and largest id of its ADD and REF entries, which
 * lets catalog_get_labels decode only the blocks that may hold an id. */
#define PQ_BLOCK_BYTES (16384 - 64)
#define PQ_MAX_ENTRY (1 + 3 * VARINT_MAX + 8)
enum { PQ_ID_NEXT = 4, PQ_T_SAME = 8 };

typedef struct pq_block {
    struct pq_block *next;
    uint64_t min_id, max_id; /* of ADD and REF entries; min > max while there is none */
    uint64_t last_id;        /* encoder state: the previous entry's id and t */
    int64_t last_t;
    uint32_t used;
    uint32_t n, nadd; /* entries, PENDING_ADD entries (pq_take_front splits at blocks) */
    uint8_t data[PQ_BLOCK_BYTES];
} pq_block_t;

typedef struct {
    pq_block_t *head, *tail;
    size_t n;    /* entries */
    size_t nadd; /* PENDING_ADD entries */
} pqueue_t;

/* A reader over a chain of blocks. */
typedef struct {
    const pq_block_t *b;
    uint32_t off;
    uint64_t last_id;
    int64_t last_t;
} pq_reader_t;

struct catalog {
    char *path;
    sqlite3 *wdb, *rdb;
    pthread_mutex_t write_mu, read_mu, pending_mu;
    pqueue_t pending; /* under pending_mu */
    /* The batch catalog__write_pending wrote into the writer's open transaction: kept (and
     * searched by catalog_get_labels) until catalog__settle_pending says whether that
     * transaction committed, so a rollback puts it back instead of losing its rows. Set and
     * cleared under pending_mu by the writer (write_mu held), which alone reads it unlocked. */
    pqueue_t inflight;
    _Atomic uint64_t next_id;
    catalog_label_fn label_fn;
    void *label_ud;
    /* Smallest id of a PENDING_REF in `pending` / in the batch being written (UINT64_MAX: none).
     * catalog_is_written reads pending_min first; the writer sets inflight_min before it resets
     * pending_min, so a reader never sees both empty while a batch still needs its labels. */
    _Atomic uint64_t pending_min, inflight_min;
    sqlite3_stmt *get_st; /* SELECT enc by id on rdb, prepared once (under read_mu) */
};

/* Run in one transaction by catalog_open. A new file gets version 2 directly; a version-1 file
 * (label_index is a table) is converted by CAT_MIGRATE_V1 first. */
#define CAT_SCHEMA                                                                                                     \
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;"                                      \
    "INSERT OR IGNORE INTO meta(key, value) VALUES('catalog_version', 2);"                                             \
    "CREATE TABLE IF NOT EXISTS series(id INTEGER PRIMARY KEY, metric TEXT NOT NULL,"                                  \
    " labels TEXT NOT NULL, enc BLOB NOT NULL, first_seen INTEGER NOT NULL,"                                           \
    " last_seen INTEGER NOT NULL);"                                                                                    \
    "CREATE INDEX IF NOT EXISTS series_metric ON series(metric);"                                                      \
    "CREATE TABLE IF NOT EXISTS label_pair(id INTEGER PRIMARY KEY, name TEXT NOT NULL, value TEXT NOT NULL,"           \
    " UNIQUE(name, value));"                                                                                           \
    "CREATE TABLE IF NOT EXISTS label_posting(pair_id INTEGER NOT NULL, series_id INTEGER NOT NULL,"                   \
    " PRIMARY KEY(pair_id, series_id)) WITHOUT ROWID;"
#define CAT_VIEW                                                                                                       \
    "CREATE VIEW IF NOT EXISTS label_index(name, value, series_id) AS SELECT p.name, p.value, x.series_id"             \
    " FROM label_posting x JOIN label_pair p ON p.id = x.pair_id;"
#define CAT_MIGRATE_V1                                                                                                 \
    "INSERT OR IGNORE INTO label_pair(name, value) SELECT DISTINCT name, value FROM label_index ORDER BY name, value;" \
    "INSERT OR IGNORE INTO label_posting(pair_id, series_id) SELECT p.id, li.series_id FROM label_index li"            \
    " JOIN label_pair p ON p.name = li.name AND p.value = li.value;"                                                   \
    "DROP TABLE label_index;"

/* ---- small helpers ---------------------------------------------------------------------- */

static void encode_labels(buf_t *b, const labels_t *ls)
{
    for (size_t i = 0; i < ls->n; i++) {
        size_t nl = strlen(ls->v[i].name), vl = strlen(ls->v[i].value);
        varint_put(b, nl);
        buf_append(b, ls->v[i].name, nl);
        varint_put(b, vl);
        buf_append(b, ls->v[i].value, vl);
    }
}

/* Decodes enc into labels whose strings are allocated by alloc(ud, n). Returns 0 or -1. */
typedef void *(*alloc_fn)(void *ud, size_t n);

static int decode_labels(const uint8_t *p, size_t len, alloc_fn alloc, void *ud, labels_t *out)
{
    const uint8_t *end = p + len, *q = p;
    size_t n = 0;
    while (q < end) { /* count first so one array suffices */
        uint64_t l;
        for (int k = 0; k < 2; k++) {
            if (varint_get(&q, end, &l) != 0 || l > (uint64_t)(end - q))
                return -1;
            q += l;
        }
        n++;
    }
    label_t *v = n ? alloc(ud, n * sizeof(label_t)) : NULL;
    if (n && !v)
        return -1;
    q = p;
    for (size_t i = 0; i < n; i++) {
        char *s[2];
        for (int k = 0; k < 2; k++) {
            uint64_t l = 0;
            varint_get(&q, end, &l);
            s[k] = alloc(ud, l + 1);
            if (!s[k])
                return -1;
            memcpy(s[k], q, l);
            s[k][l] = 0;
            q += l;
        }
        v[i].name = s[0];
        v[i].value = s[1];
    }
    out->v = v;
    out->n = n;
    return 0;
}

static bool sorted_unique(const labels_t *ls)
{
    for (size_t i = 1; i < ls->n; i++)
        if (strcmp(ls->v[i - 1].name, ls->v[i].name) >= 0)
            return false;
    return true;
}

static void *arena_alloc_cb(void *ud, size_t n)
{
    return arena_try_alloc(ud, n);
}

/* {a="b",c="d"} without __name__, escaping \ " and newline as the text exposition format does. */
static void format_labels_text(buf_t *b, const labels_t *ls)
{
    buf_putc(b, '{');
    bool first = true;
    for (size_t i = 0; i < ls->n; i++) {
        if (strcmp(ls->v[i].name, LABEL_METRIC_NAME) == 0)
            continue;
        if (!first)
            buf_putc(b, ',');
        first = false;
        buf_puts(b, ls->v[i].name);
        buf_puts(b, "=\"");
        for (const char *s = ls->v[i].value; *s; s++) {
            if (*s == '\\')
                buf_puts(b, "\\\\");
            else if (*s == '"')
                buf_puts(b, "\\\"");
            else if (*s == '\n')
                buf_puts(b, "\\n");
            else
                buf_putc(b, *s);
        }
        buf_putc(b, '"');
    }
    buf_putc(b, '}');
}

static int exec_sql(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        if (err)
            snprintf(err, errlen, "sqlite: %s", msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static sqlite3 *open_db(const char *path, char *err, size_t errlen)
{
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, errlen, "open %s: %s", path, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 10000);
    /* page_size only takes effect on a new file, before WAL mode is set. 16 KiB pages pack the
     * roll-up blobs (1-4 KB each) with far less slack than 4 KiB ones (docs/storage-rollups.md). */
    if (exec_sql(db, "PRAGMA page_size=16384; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", err, errlen) != 0) {
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

/* ---- the pending queue ------------------------------------------------------------------- */

/* Appends p; 0, or -1 out of memory (then nothing changed). */
static int pq_push(pqueue_t *q, const pending_t *p)
{
    pq_block_t *b = q->tail;
    if (!b || PQ_BLOCK_BYTES - b->used < PQ_MAX_ENTRY) {
        pq_block_t *nb = malloc(sizeof(*nb));
        if (!nb)
            return -1;
        nb->next = NULL;
        nb->min_id = UINT64_MAX;
        nb->max_id = 0;
        nb->last_id = 0;
        nb->last_t = 0;
        nb->used = 0;
        nb->n = nb->nadd = 0;
        if (b)
            b->next = nb;
        else
            q->head = nb;
        q->tail = b = nb;
    }
    uint8_t *start = b->data + b->used, *w = start + 1;
    uint8_t tag = (uint8_t)p->kind;
    if (p->id == b->last_id + 1)
        tag |= PQ_ID_NEXT;
    else
        w += varint_encode(w, varint_zigzag((int64_t)(p->id - b->last_id)));
    if (p->t == b->last_t)
        tag |= PQ_T_SAME;
    else
        w += varint_encode(w, varint_zigzag((int64_t)((uint64_t)p->t - (uint64_t)b->last_t)));
    if (p->kind == PENDING_REF) {
        w += varint_encode(w, p->hint >> 32);
        w += varint_encode(w, p->hint & 0xffffffffu);
    } else if (p->kind == PENDING_ADD) {
        memcpy(w, &p->ls.v, sizeof(p->ls.v));
        w += sizeof(p->ls.v);
        w += varint_encode(w, p->ls.n);
    }
    *start = tag;
    assert(w - start <= PQ_MAX_ENTRY);
    b->used += (uint32_t)(w - start);
    b->last_id = p->id;
    b->last_t = p->t;
    if (p->kind != PENDING_TOUCH) {
        if (p->id < b->min_id)
            b->min_id = p->id;
        if (p->id > b->max_id)
            b->max_id = p->id;
    }
    b->n++;
    b->nadd += p->kind == PENDING_ADD;
    q->n++;
    q->nadd += p->kind == PENDING_ADD;
    return 0;
}

static pq_reader_t pq_reader(const pq_block_t *b)
{
    return (pq_reader_t){.b = b};
}

/* The next entry; false at the end of the chain. The bytes were written by pq_push, so they
 * decode without checks beyond the block's end. */
static bool pq_next(pq_reader_t *r, pending_t *p)
{
    while (r->b && r->off >= r->b->used) {
        r->b = r->b->next;
        r->off = 0;
        r->last_id = 0;
        r->last_t = 0;
    }
    if (!r->b)
        return false;
    const uint8_t *q = r->b->data + r->off, *end = r->b->data + r->b->used;
    uint8_t tag = *q++;
    uint64_t u = 0;
    p->kind = (pending_kind_t)(tag & 3);
    if (tag & PQ_ID_NEXT) {
        p->id = r->last_id + 1;
    } else {
        varint_get(&q, end, &u);
        p->id = r->last_id + (uint64_t)varint_unzigzag(u);
    }
    if (tag & PQ_T_SAME) {
        p->t = r->last_t;
    } else {
        varint_get(&q, end, &u);
        p->t = (int64_t)((uint64_t)r->last_t + (uint64_t)varint_unzigzag(u));
    }
    p->hint = 0;
    p->ls = (labels_t){0};
    if (p->kind == PENDING_REF) {
        uint64_t hi = 0, lo = 0;
        varint_get(&q, end, &hi);
        varint_get(&q, end, &lo);
        p->hint = hi << 32 | lo;
    } else if (p->kind == PENDING_ADD) {
        memcpy(&p->ls.v, q, sizeof(p->ls.v));
        q += sizeof(p->ls.v);
        varint_get(&q, end, &u);
        p->ls.n = (size_t)u;
    }
    r->off = (uint32_t)(q - r->b->data);
    r->last_id = p->id;
    r->last_t = p->t;
    return true;
}

/* Takes every entry of q into a new queue, leaving q empty. */
static pqueue_t pq_take(pqueue_t *q)
{
    pqueue_t t = *q;
    *q = (pqueue_t){0};
    return t;
}

/* Takes q's first whole blocks holding at least max entries (all of q when max is 0 or q holds
 * no more), leaving the rest in q. */
static pqueue_t pq_take_front(pqueue_t *q, size_t max)
{
    if (max == 0 || q->n <= max)
        return pq_take(q);
    pq_block_t *b = q->head;
    size_t n = b->n, nadd = b->nadd;
    while (n < max && b->next) {
        b = b->next;
        n += b->n;
        nadd += b->nadd;
    }
    if (!b->next)
        return pq_take(q);
    pqueue_t t = {.head = q->head, .tail = b, .n = n, .nadd = nadd};
    q->head = b->next; /* q->tail stays: it is after b */
    b->next = NULL;
    q->n -= n;
    q->nadd -= nadd;
    return t;
}

/* A lower bound of the ids of q's ADD and REF entries (UINT64_MAX: none). */
static uint64_t pq_min_id(const pqueue_t *q)
{
    uint64_t min = UINT64_MAX;
    for (const pq_block_t *b = q->head; b; b = b->next)
        if (b->min_id < min)
            min = b->min_id;
    return min;
}

/* Puts the entries of `front` (an earlier take) back before those of q. */
static void pq_put_back(pqueue_t *q, pqueue_t *front)
{
    if (!front->head)
        return;
    front->tail->next = q->head;
    if (!q->tail)
        q->tail = front->tail;
    q->head = front->head;
    q->n += front->n;
    q->nadd += front->nadd;
    *front = (pqueue_t){0};
}

/* Frees the queue's blocks and the label copies of its ADD entries. */
static void pq_free(pqueue_t *q)
{
    if (q->nadd) {
        pq_reader_t r = pq_reader(q->head);
        for (pending_t p; pq_next(&r, &p);)
            if (p.kind == PENDING_ADD)
                free(p.ls.v);
    }
    for (pq_block_t *b = q->head, *nb; b; b = nb) {
        nb = b->next;
        free(b);
    }
    *q = (pqueue_t){0};
}

/* ---- open / close ----------------------------------------------------------------------- */

/* Creates the tables, converting a version-1 file (label_index a table) on the way; one
 * transaction, so a crash mid-way leaves the file as it was. */
static int catalog_schema(sqlite3 *db, const char *path, char *err, size_t errlen)
{
    if (exec_sql(db, "BEGIN IMMEDIATE", err, errlen) != 0)
        return -1;
    int rc = exec_sql(db, CAT_SCHEMA, err, errlen);
    sqlite3_stmt *st = NULL;
    bool v1 = false;
    if (rc == 0) {
        rc = sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'label_index'", -1,
                                &st, NULL) == SQLITE_OK
                 ? 0
                 : -1;
        int step = rc == 0 ? sqlite3_step(st) : SQLITE_ERROR;
        v1 = step == SQLITE_ROW;
        if (step != SQLITE_ROW && step != SQLITE_DONE) {
            snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(db));
            rc = -1;
        }
        sqlite3_finalize(st);
    }
    if (rc == 0 && v1) {
        log_info("catalog", "converting the label index to catalog version 2 (once)", LF_S("path", path));
        rc = exec_sql(db, CAT_MIGRATE_V1 "UPDATE meta SET value = 2 WHERE key = 'catalog_version';", err, errlen);
    }
    if (rc == 0)
        rc = exec_sql(db, CAT_VIEW, err, errlen);
    if (rc == 0)
        return exec_sql(db, "COMMIT", err, errlen);
    exec_sql(db, "ROLLBACK", NULL, 0);
    return -1;
}

catalog_t *catalog_open(const char *dir, char *err, size_t errlen)
{
    catalog_t *cat = calloc(1, sizeof(*cat));
    if (!cat) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&cat->write_mu, NULL);
    pthread_mutex_init(&cat->read_mu, NULL);
    pthread_mutex_init(&cat->pending_mu, NULL);
    atomic_init(&cat->pending_min, UINT64_MAX);
    atomic_init(&cat->inflight_min, UINT64_MAX);
    size_t n = strlen(dir) + sizeof("/sluice.db");
    cat->path = malloc(n);
    if (!cat->path) {
        snprintf(err, errlen, "out of memory");
        goto err;
    }
    snprintf(cat->path, n, "%s/sluice.db", dir);
    cat->wdb = open_db(cat->path, err, errlen);
    if (!cat->wdb)
        goto err;
    if (catalog_schema(cat->wdb, cat->path, err, errlen) != 0)
        goto err;
    cat->rdb = open_db(cat->path, err, errlen);
    if (!cat->rdb)
        goto err;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(cat->wdb, "SELECT coalesce(max(id), 0) FROM series", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        snprintf(err, errlen, "sqlite: %s", sqlite3_errmsg(cat->wdb));
        sqlite3_finalize(st);
        goto err;
    }
    atomic_store(&cat->next_id, (uint64_t)sqlite3_column_int64(st, 0) + 1);
    sqlite3_finalize(st);
    return cat;
err:
    sqlite3_close(cat->rdb);
    sqlite3_close(cat->wdb);
    free(cat->path);
    pthread_mutex_destroy(&cat->write_mu);
    pthread_mutex_destroy(&cat->read_mu);
    pthread_mutex_destroy(&cat->pending_mu);
    free(cat);
    return NULL;
}

void catalog_close(catalog_t *cat)
{
    if (!cat)
        return;
    if (catalog_flush(cat) != 0)
        log_error("catalog", "final flush failed; pending series rows lost", LF_S("path", cat->path));
    pq_free(&cat->pending);
    pq_free(&cat->inflight); /* empty: every transaction settles */
    sqlite3_finalize(cat->get_st);
    sqlite3_close(cat->rdb);
    sqlite3_close(cat->wdb);
    free(cat->path);
    pthread_mutex_destroy(&cat->write_mu);
    pthread_mutex_destroy(&cat->read_mu);
    pthread_mutex_destroy(&cat->pending_mu);
    free(cat);
}

const char *catalog_path(const catalog_t *cat)
{
    return cat->path;
}

void catalog_ids_free(catalog_ids_t *ids)
{
    free(ids->v);
    *ids = (catalog_ids_t){0};
}

static int ids_push(catalog_ids_t *ids, uint64_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        uint64_t *v = realloc(ids->v, cap * sizeof(*v));
        if (!v)
            return -1;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

/* ---- writes ----------------------------------------------------------------------------- */

uint64_t catalog_next_id(catalog_t *cat)
{
    return atomic_fetch_add(&cat->next_id, 1);
}

static int pending_push(catalog_t *cat, const pending_t *p)
{
    pthread_mutex_lock(&cat->pending_mu);
    int rc = pq_push(&cat->pending, p);
    if (rc == 0 && p->kind == PENDING_REF && p->id < atomic_load(&cat->pending_min))
        atomic_store(&cat->pending_min, p->id);
    pthread_mutex_unlock(&cat->pending_mu);
    return rc;
}

void catalog_set_label_source(catalog_t *cat, catalog_label_fn fn, void *ud)
{
    cat->label_fn = fn;
    cat->label_ud = ud;
}

int catalog_add_series_ref(catalog_t *cat, uint64_t id, uint64_t hint, int64_t t)
{
    assert(cat->label_fn);
    if (id == 0)
        return -1;
    uint64_t cur = atomic_load(&cat->next_id);
    while (cur <= id && !atomic_compare_exchange_weak(&cat->next_id, &cur, id + 1))
        ;
    pending_t p = {.kind = PENDING_REF, .id = id, .t = t, .hint = hint};
    return pending_push(cat, &p);
}

int catalog_add_series_refs(catalog_t *cat, const catalog_ref_t *refs, size_t n)
{
    assert(cat->label_fn);
    uint64_t max = 0, min = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        if (refs[i].id == 0)
            return -1;
        max = refs[i].id > max ? refs[i].id : max;
        min = refs[i].id < min ? refs[i].id : min;
    }
    if (!n)
        return 0;
    uint64_t cur = atomic_load(&cat->next_id);
    while (cur <= max && !atomic_compare_exchange_weak(&cat->next_id, &cur, max + 1))
        ;
    int rc = 0;
    pthread_mutex_lock(&cat->pending_mu);
    for (size_t i = 0; i < n && rc == 0; i++) {
        pending_t p = {.kind = PENDING_REF, .id = refs[i].id, .t = refs[i].t, .hint = refs[i].hint};
        rc = pq_push(&cat->pending, &p);
    }
    if (min < atomic_load(&cat->pending_min))
        atomic_store(&cat->pending_min, min);
    pthread_mutex_unlock(&cat->pending_mu);
    return rc;
}

size_t catalog__pending_count(catalog_t *cat)
{
    pthread_mutex_lock(&cat->pending_mu);
    size_t n = cat->pending.n;
    pthread_mutex_unlock(&cat->pending_mu);
    return n;
}

bool catalog_is_written(const catalog_t *cat, uint64_t id)
{
    uint64_t p = atomic_load(&cat->pending_min);
    uint64_t f = atomic_load(&cat->inflight_min);
    return id < p && id < f;
}

int catalog_add_series(catalog_t *cat, uint64_t id, const labels_t *ls, int64_t t)
{
    if (id == 0 || !sorted_unique(ls))
        return -1;
    /* One block: the label array, then the strings. */
    size_t total = ls->n * sizeof(label_t);
    for (size_t i = 0; i < ls->n; i++)
        total += strlen(ls->v[i].name) + strlen(ls->v[i].value) + 2;
    label_t *v = malloc(total ? total : 1);
    if (!v)
        return -1;
    char *s = (char *)(v + ls->n);
    for (size_t i = 0; i < ls->n; i++) {
        size_t nl = strlen(ls->v[i].name) + 1, vl = strlen(ls->v[i].value) + 1;
        memcpy(s, ls->v[i].name, nl);
        v[i].name = s;
        s += nl;
        memcpy(s, ls->v[i].value, vl);
        v[i].value = s;
        s += vl;
    }
    /* Ids handed out elsewhere (e.g. replayed from the WAL) must never be handed out again. */
    uint64_t cur = atomic_load(&cat->next_id);
    while (cur <= id && !atomic_compare_exchange_weak(&cat->next_id, &cur, id + 1))
        ;
    pending_t p = {.kind = PENDING_ADD, .id = id, .t = t, .ls = {v, ls->n}};
    if (pending_push(cat, &p) != 0) {
        free(v);
        return -1;
    }
    return 0;
}

int catalog_touch_series(catalog_t *cat, uint64_t id, int64_t t)
{
    pending_t p = {.kind = PENDING_TOUCH, .id = id, .t = t};
    return pending_push(cat, &p);
}

sqlite3 *catalog__write_db(catalog_t *cat)
{
    return cat->wdb;
}
void catalog__write_lock(catalog_t *cat)
{
    pthread_mutex_lock(&cat->write_mu);
}
void catalog__write_unlock(catalog_t *cat)
{
    pthread_mutex_unlock(&cat->write_mu);
}

/* One series row. */
static int write_series(sqlite3_stmt *ins, const pending_t *p, const labels_t *ls, buf_t *enc, buf_t *text)
{
    buf_reset(enc);
    buf_reset(text);
    encode_labels(enc, ls);
    format_labels_text(text, ls);
    const char *metric = NULL;
    for (size_t i = 0; i < ls->n && !metric; i++)
        if (strcmp(ls->v[i].name, LABEL_METRIC_NAME) == 0)
            metric = ls->v[i].value;
    sqlite3_bind_int64(ins, 1, (sqlite3_int64)p->id);
    sqlite3_bind_text(ins, 2, metric ? metric : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(ins, 3, text->data, (int)text->len, SQLITE_STATIC);
    sqlite3_bind_blob(ins, 4, enc->len ? enc->data : "", (int)enc->len, SQLITE_STATIC);
    sqlite3_bind_int64(ins, 5, p->t);
    int rc = sqlite3_step(ins);
    sqlite3_reset(ins);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* A distinct label pair of the chunk being written, and its id in label_pair. */
typedef struct {
    const char *name, *value;
    int64_t id;
} catalog_pair_t;

/* A posting to write: (pair, series id); pair is first an index into the chunk's pairs. */
typedef struct {
    int64_t pair, series;
} catalog_posting_t;

static int pair_cmp(const void *pa, const void *pb)
{
    const catalog_pair_t *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    return c ? c : strcmp(a->value, b->value);
}

static int posting_cmp(const void *pa, const void *pb)
{
    const catalog_posting_t *a = pa, *b = pb;
    if (a->pair != b->pair)
        return (a->pair > b->pair) - (a->pair < b->pair);
    return (a->series > b->series) - (a->series < b->series);
}

/* The statements of one write. */
typedef struct {
    sqlite3_stmt *ins, *touch; /* series row; last_seen */
    sqlite3_stmt *pair_get, *pair_ins, *post_ins;
} catalog_stmts_t;

/* The id of pair (name, value), numbered now if new. 0 on error. */
static int64_t pair_id(sqlite3 *db, const catalog_stmts_t *st, const char *name, const char *value)
{
    sqlite3_bind_text(st->pair_get, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st->pair_get, 2, value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st->pair_get);
    int64_t id = rc == SQLITE_ROW ? sqlite3_column_int64(st->pair_get, 0) : 0;
    sqlite3_reset(st->pair_get);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return 0;
    if (id)
        return id;
    sqlite3_bind_text(st->pair_ins, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st->pair_ins, 2, value, -1, SQLITE_STATIC);
    rc = sqlite3_step(st->pair_ins);
    sqlite3_reset(st->pair_ins);
    return rc == SQLITE_DONE ? sqlite3_last_insert_rowid(db) : 0;
}

/* The distinct pairs of a chunk: pairs[] found by hash through `seen` (a multimap of indexes). */
typedef struct {
    catalog_pair_t *v;
    size_t n, cap;
    hashmap_t seen;
} catalog_chunk_pairs_t;

typedef struct {
    const catalog_chunk_pairs_t *c;
    const char *name, *value;
} catalog_pair_key_t;

static bool pair_key_eq(uint64_t i, const void *ctx)
{
    const catalog_pair_key_t *k = ctx;
    const catalog_pair_t *p = &k->c->v[i];
    return strcmp(p->name, k->name) == 0 && strcmp(p->value, k->value) == 0;
}

/* The index of (name, value) among the chunk's pairs, added if new (its strings copied into
 * `keep`, which lives as long as the chunk); -1 out of memory. */
static int64_t chunk_pair(catalog_chunk_pairs_t *c, arena_t *keep, const char *name, const char *value)
{
    uint64_t h = XXH3_64bits_withSeed(value, strlen(value), XXH3_64bits(name, strlen(name)));
    catalog_pair_key_t k = {c, name, value};
    const uint64_t *v = hashmap_find(&c->seen, h, pair_key_eq, &k);
    if (v)
        return (int64_t)*v;
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 1024;
        catalog_pair_t *g = realloc(c->v, ncap * sizeof(*g));
        if (!g)
            return -1;
        c->v = g;
        c->cap = ncap;
    }
    size_t nl = strlen(name) + 1, vl = strlen(value) + 1;
    char *copy = arena_try_alloc(keep, nl + vl);
    if (!copy || hashmap_add(&c->seen, h, c->n) < 0)
        return -1;
    memcpy(copy, name, nl);
    memcpy(copy + nl, value, vl);
    c->v[c->n] = (catalog_pair_t){copy, copy + nl, 0};
    return (int64_t)c->n++;
}

/* Series rows go in queue order; their postings a chunk of series at a time: each distinct pair
 * of the chunk is looked up (or numbered) once, in (name, value) order, then the postings are
 * inserted in key order, so an insert lands next to the previous one and the b-tree pages stay
 * in cache. A series' labels (read back from the index for a queued reference) live only while
 * its row is written; the chunk keeps one copy of each distinct pair, so a chunk of Flink series
 * holds ~100 KB of strings instead of every series' labels (~4 MB). */
#define CATALOG_WRITE_CHUNK 4096

static int write_chunks(catalog_t *cat, const catalog_stmts_t *st, const pqueue_t *batch)
{
    pq_reader_t r = pq_reader(batch->head);
    size_t n = batch->n;
    buf_t enc = BUF_INIT, text = BUF_INIT;
    arena_t *scratch = arena_create(0), *keep = arena_create(0);
    catalog_chunk_pairs_t pairs = {.seen = HASHMAP_INIT_HASHED};
    catalog_posting_t *posts = NULL;
    int64_t *pid = NULL; /* chunk pair index -> label_pair id, after sorting */
    size_t cap = 0, pidcap = 0;
    int ret = scratch && keep ? 0 : -1;
    for (size_t i = 0; i < n && ret == 0;) {
        size_t nser = 0, np = 0;
        arena_reset(keep);
        pairs.n = 0;
        hashmap_clear(&pairs.seen);
        for (; i < n && nser < CATALOG_WRITE_CHUNK && ret == 0; i++) {
            pending_t entry;
            if (!pq_next(&r, &entry)) {
                assert(!"pending queue shorter than its count");
                ret = -1;
                break;
            }
            const pending_t *p = &entry;
            if (p->kind == PENDING_TOUCH) {
                sqlite3_bind_int64(st->touch, 1, p->t);
                sqlite3_bind_int64(st->touch, 2, (sqlite3_int64)p->id);
                ret = sqlite3_step(st->touch) == SQLITE_DONE ? 0 : -1;
                sqlite3_reset(st->touch);
                continue;
            }
            labels_t ls = p->ls;
            arena_reset(scratch);
            if (p->kind == PENDING_REF && cat->label_fn(cat->label_ud, p->id, p->hint, scratch, &ls) != 0) {
                /* The owner let it go before it was written: a broken promise, not the client's doing. */
                log_error("catalog", "a queued series left memory before it was written; its row is lost",
                          LF_I("id", p->id));
                continue;
            }
            if (write_series(st->ins, p, &ls, &enc, &text) != 0) {
                ret = -1;
                break;
            }
            if (np + ls.n > cap) {
                size_t ncap = cap ? cap * 2 : 4096;
                while (ncap < np + ls.n)
                    ncap *= 2;
                catalog_posting_t *g = realloc(posts, ncap * sizeof(*g));
                if (!g) {
                    ret = -1;
                    break;
                }
                posts = g;
                cap = ncap;
            }
            for (size_t k = 0; k < ls.n && ret == 0; k++) {
                int64_t pi = chunk_pair(&pairs, keep, ls.v[k].name, ls.v[k].value);
                if (pi < 0)
                    ret = -1;
                posts[np++] = (catalog_posting_t){pi, (int64_t)p->id};
            }
            nser++;
        }
        if (ret != 0)
            break;
        /* Number the pairs in (name, value) order: neighbours in label_pair's index. */
        if (pairs.n > pidcap) {
            int64_t *g = realloc(pid, pairs.n * sizeof(*g));
            if (!g) {
                ret = -1;
                break;
            }
            pid = g;
            pidcap = pairs.n;
        }
        catalog_pair_t *sorted = arena_try_alloc(keep, (pairs.n ? pairs.n : 1) * sizeof(*sorted));
        if (!sorted) {
            ret = -1;
            break;
        }
        for (size_t k = 0; k < pairs.n; k++)
            sorted[k] = (catalog_pair_t){pairs.v[k].name, pairs.v[k].value, (int64_t)k};
        if (pairs.n > 1)
            qsort(sorted, pairs.n, sizeof(*sorted), pair_cmp);
        for (size_t k = 0; k < pairs.n && ret == 0; k++) {
            int64_t id = pair_id(cat->wdb, st, sorted[k].name, sorted[k].value);
            if (id == 0)
                ret = -1;
            pid[sorted[k].id] = id;
        }
        for (size_t k = 0; k < np && ret == 0; k++)
            posts[k].pair = pid[posts[k].pair];
        if (ret == 0 && np > 1)
            qsort(posts, np, sizeof(*posts), posting_cmp);
        for (size_t k = 0; k < np && ret == 0; k++) {
            sqlite3_bind_int64(st->post_ins, 1, posts[k].pair);
            sqlite3_bind_int64(st->post_ins, 2, posts[k].series);
            ret = sqlite3_step(st->post_ins) == SQLITE_DONE ? 0 : -1;
            sqlite3_reset(st->post_ins);
        }
    }
    free(pairs.v);
    hashmap_free(&pairs.seen);
    free(posts);
    free(pid);
    arena_destroy(scratch);
    arena_destroy(keep);
    buf_free(&enc);
    buf_free(&text);
    return ret;
}

int catalog__write_pending(catalog_t *cat, size_t max, size_t *left)
{
    pthread_mutex_lock(&cat->pending_mu);
    assert(cat->inflight.n == 0 && !cat->inflight.head); /* settled after the previous transaction */
    cat->inflight = pq_take_front(&cat->pending, max);
    if (left)
        *left = cat->pending.n;
    if (cat->pending.n == 0) {
        atomic_store(&cat->inflight_min, atomic_load(&cat->pending_min));
        atomic_store(&cat->pending_min, UINT64_MAX);
    } else {
        /* Both lower bounds (the blocks' smallest ids), never above the exact minimum they
         * replace, set in the order catalog_is_written reads them. */
        atomic_store(&cat->inflight_min, pq_min_id(&cat->inflight));
        atomic_store(&cat->pending_min, pq_min_id(&cat->pending));
    }
    pthread_mutex_unlock(&cat->pending_mu);
    const pqueue_t *batch = &cat->inflight;
    if (batch->n == 0)
        return 0;

    catalog_stmts_t st = {0};
    int ret = -1;
    if (sqlite3_prepare_v2(cat->wdb,
                           "INSERT INTO series(id, metric, labels, enc, first_seen, last_seen)"
                           " VALUES(?1, ?2, ?3, ?4, ?5, ?5) ON CONFLICT(id) DO UPDATE SET"
                           " first_seen = min(first_seen, excluded.first_seen),"
                           " last_seen = max(last_seen, excluded.last_seen)",
                           -1, &st.ins, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(cat->wdb, "SELECT id FROM label_pair WHERE name = ?1 AND value = ?2", -1, &st.pair_get,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(cat->wdb, "INSERT INTO label_pair(name, value) VALUES(?1, ?2)", -1, &st.pair_ins, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(cat->wdb, "INSERT OR IGNORE INTO label_posting(pair_id, series_id) VALUES(?1, ?2)", -1,
                           &st.post_ins, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(cat->wdb, "UPDATE series SET last_seen = max(last_seen, ?1) WHERE id = ?2", -1, &st.touch,
                           NULL) != SQLITE_OK)
        goto out;
    ret = write_chunks(cat, &st, batch);
out:
    if (ret != 0)
        log_error("catalog", "writing series rows failed", LF_S("err", sqlite3_errmsg(cat->wdb)));
    sqlite3_finalize(st.ins);
    sqlite3_finalize(st.pair_get);
    sqlite3_finalize(st.pair_ins);
    sqlite3_finalize(st.post_ins);
    sqlite3_finalize(st.touch);
    return ret;
}

void catalog__settle_pending(catalog_t *cat, bool committed)
{
    pthread_mutex_lock(&cat->pending_mu);
    pqueue_t batch = pq_take(&cat->inflight);
    if (committed || batch.n == 0) {
        atomic_store(&cat->inflight_min, UINT64_MAX);
        pthread_mutex_unlock(&cat->pending_mu);
        pq_free(&batch);
        return;
    }
    /* Rolled back: the entries go back in front of what was queued meanwhile (writes are
     * idempotent), for the next attempt. */
    pq_put_back(&cat->pending, &batch);
    uint64_t batch_min = atomic_load(&cat->inflight_min);
    if (batch_min < atomic_load(&cat->pending_min))
        atomic_store(&cat->pending_min, batch_min);
    atomic_store(&cat->inflight_min, UINT64_MAX);
    pthread_mutex_unlock(&cat->pending_mu);
}

int catalog_flush(catalog_t *cat)
{
    catalog__write_lock(cat);
    int rc = exec_sql(cat->wdb, "BEGIN IMMEDIATE", NULL, 0);
    if (rc == 0)
        rc = catalog__write_pending(cat, 0, NULL);
    if (rc == 0)
        rc = exec_sql(cat->wdb, "COMMIT", NULL, 0);
    else
        exec_sql(cat->wdb, "ROLLBACK", NULL, 0);
    catalog__settle_pending(cat, rc == 0);
    catalog__write_unlock(cat);
    return rc;
}

/* ---- reads ------------------------------------------------------------------------------ */

int catalog_load(catalog_t *cat, catalog_load_fn fn, void *ud)
{
    pthread_mutex_lock(&cat->read_mu);
    sqlite3_stmt *st = NULL;
    int ret = 0;
    arena_t *a = arena_create(0);
    if (!a || sqlite3_prepare_v2(cat->rdb, "SELECT id, enc, first_seen, last_seen FROM series ORDER BY id", -1, &st,
                                 NULL) != SQLITE_OK) {
        ret = -1;
        goto out;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        labels_t ls;
        arena_reset(a);
        if (decode_labels(sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1), arena_alloc_cb, a, &ls) !=
            0) {
            log_warn("catalog", "undecodable labels; series skipped", LF_I("id", sqlite3_column_int64(st, 0)));
            continue;
        }
        ret = fn(ud, (uint64_t)sqlite3_column_int64(st, 0), &ls, sqlite3_column_int64(st, 2),
                 sqlite3_column_int64(st, 3));
        if (ret != 0)
            break;
    }
    if (ret == 0 && rc != SQLITE_DONE)
        ret = -1;
out:
    sqlite3_finalize(st);
    arena_destroy(a);
    pthread_mutex_unlock(&cat->read_mu);
    return ret;
}

static int collect_ids(sqlite3_stmt *st, catalog_ids_t *out)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (ids_push(out, (uint64_t)sqlite3_column_int64(st, 0)) != 0)
            return -1;
    return rc == SQLITE_DONE ? 0 : -1;
}

int catalog_series_by_labels(catalog_t *cat, const label_t *eq, size_t n, int64_t mint, int64_t maxt,
                             catalog_ids_t *out)
{
    if (n == 0)
        return -1;
    buf_t sql = BUF_INIT;
    buf_puts(&sql, "SELECT id FROM series WHERE first_seen <= ?1 AND last_seen >= ?2 AND id IN (");
    for (size_t i = 0; i < n; i++)
        buf_printf(&sql,
                   "%sSELECT series_id FROM label_posting WHERE pair_id ="
                   " (SELECT id FROM label_pair WHERE name = ?%zu AND value = ?%zu)",
                   i ? " INTERSECT " : "", 3 + 2 * i, 4 + 2 * i);
    buf_puts(&sql, ") ORDER BY id");
    pthread_mutex_lock(&cat->read_mu);
    sqlite3_stmt *st = NULL;
    int ret = -1;
    if (sqlite3_prepare_v2(cat->rdb, sql.data, (int)sql.len, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, maxt);
        sqlite3_bind_int64(st, 2, mint);
        for (size_t i = 0; i < n; i++) {
            sqlite3_bind_text(st, (int)(3 + 2 * i), eq[i].name, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, (int)(4 + 2 * i), eq[i].value, -1, SQLITE_STATIC);
        }
        ret = collect_ids(st, out);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&cat->read_mu);
    buf_free(&sql);
    return ret;
}

int catalog_series_with_name(catalog_t *cat, const char *name, int64_t mint, int64_t maxt, catalog_ids_t *out)
{
    pthread_mutex_lock(&cat->read_mu);
    sqlite3_stmt *st = NULL;
    int ret = -1;
    if (sqlite3_prepare_v2(cat->rdb,
                           "SELECT id FROM series WHERE first_seen <= ?1 AND last_seen >= ?2 AND id IN"
                           " (SELECT x.series_id FROM label_pair p JOIN label_posting x ON x.pair_id = p.id"
                           " WHERE p.name = ?3) ORDER BY id",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, maxt);
        sqlite3_bind_int64(st, 2, mint);
        sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
        ret = collect_ids(st, out);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&cat->read_mu);
    return ret;
}

/* Collects column 0 (text) of every row into an arena array. */
static int collect_strings(sqlite3_stmt *st, arena_t *a, const char ***out, size_t *n)
{
    size_t cap = 16, k = 0;
    const char **v = arena_try_alloc(a, cap * sizeof(*v));
    int rc;
    while (v && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (k == cap) {
            const char **nv = arena_try_alloc(a, 2 * cap * sizeof(*v));
            if (!nv)
                return -1;
            memcpy(nv, v, k * sizeof(*v));
            v = nv;
            cap *= 2;
        }
        const char *s = (const char *)sqlite3_column_text(st, 0);
        v[k] = arena_strndup(a, s ? s : "", (size_t)sqlite3_column_bytes(st, 0));
        k++;
    }
    if (!v || rc != SQLITE_DONE)
        return -1;
    *out = v;
    *n = k;
    return 0;
}

static bool unbounded(int64_t mint, int64_t maxt)
{
    return mint == INT64_MIN && maxt == INT64_MAX;
}

int catalog_label_values(catalog_t *cat, const char *name, int64_t mint, int64_t maxt, arena_t *a, const char ***values,
                         size_t *n)
{
    /* Unbounded: the pairs alone (a pair exists only with postings), over their (name, value)
     * index. */
    const char *sql = unbounded(mint, maxt)
                          ? "SELECT value FROM label_pair WHERE name = ?3 ORDER BY value"
                          : "SELECT DISTINCT p.value FROM label_pair p JOIN label_posting x ON x.pair_id = p.id"
                            " JOIN series s ON s.id = x.series_id"
                            " WHERE p.name = ?3 AND s.first_seen <= ?1 AND s.last_seen >= ?2 ORDER BY p.value";
    pthread_mutex_lock(&cat->read_mu);
    sqlite3_stmt *st = NULL;
    int ret = -1;
    if (sqlite3_prepare_v2(cat->rdb, sql, -1, &st, NULL) == SQLITE_OK) {
        if (!unbounded(mint, maxt)) {
            sqlite3_bind_int64(st, 1, maxt);
            sqlite3_bind_int64(st, 2, mint);
        }
        sqlite3_bind_text(st, 3, name, -1, SQLITE_STATIC);
        ret = collect_strings(st, a, values, n);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&cat->read_mu);
    return ret;
}

int catalog_label_names(catalog_t *cat, int64_t mint, int64_t maxt, arena_t *a, const char ***names, size_t *n)
{
    /* A skip scan over the pairs' (name, value) index: one seek per distinct name instead of
     * reading every pair. With a time bound, a name counts if any of its postings belongs to a
     * series seen in range. */
    const char *sql = unbounded(mint, maxt)
                          ? "WITH RECURSIVE nm(name) AS (SELECT min(name) FROM label_pair UNION ALL"
                            " SELECT (SELECT min(name) FROM label_pair WHERE name > nm.name) FROM nm"
                            " WHERE nm.name IS NOT NULL) SELECT name FROM nm WHERE name IS NOT NULL"
                          : "WITH RECURSIVE nm(name) AS (SELECT min(name) FROM label_pair UNION ALL"
                            " SELECT (SELECT min(name) FROM label_pair WHERE name > nm.name) FROM nm"
                            " WHERE nm.name IS NOT NULL) SELECT name FROM nm WHERE name IS NOT NULL AND EXISTS"
                            " (SELECT 1 FROM label_pair p JOIN label_posting x ON x.pair_id = p.id"
                            " JOIN series s ON s.id = x.series_id WHERE"
                            " p.name = nm.name AND s.first_seen <= ?1 AND s.last_seen >= ?2)";
    pthread_mutex_lock(&cat->read_mu);
    sqlite3_stmt *st = NULL;
    int ret = -1;
    if (sqlite3_prepare_v2(cat->rdb, sql, -1, &st, NULL) == SQLITE_OK) {
        if (!unbounded(mint, maxt)) {
            sqlite3_bind_int64(st, 1, maxt);
            sqlite3_bind_int64(st, 2, mint);
        }
        ret = collect_strings(st, a, names, n);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&cat->read_mu);
    return ret;
}

int catalog_min_first_seen(catalog_t *cat, int64_t since, int64_t *out)
{
    /* A scan of the series table (no index on the times): callers cache the answer. */
    pthread_mutex_lock(&cat->read_mu);
    sqlite3_stmt *st = NULL;
    int ret = -1;
    *out = INT64_MAX;
    if (sqlite3_prepare_v2(cat->rdb, "SELECT min(max(first_seen, ?1)) FROM series WHERE last_seen >= ?1", -1, &st,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, since);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            if (sqlite3_column_type(st, 0) != SQLITE_NULL)
                *out = sqlite3_column_int64(st, 0);
            ret = 0;
        } else if (rc == SQLITE_DONE) {
            ret = 0;
        }
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&cat->read_mu);
    return ret;
}

static int copy_labels_to_arena(const labels_t *src, arena_t *a, labels_t *out)
{
    label_t *v = src->n ? arena_try_alloc(a, src->n * sizeof(label_t)) : NULL;
    if (src->n && !v)
        return -1;
    for (size_t i = 0; i < src->n; i++) {
        v[i].name = arena_strdup(a, src->v[i].name);
        v[i].value = arena_strdup(a, src->v[i].value);
    }
    out->v = v;
    out->n = src->n;
    return 0;
}

/* The newest entry of q that carries id's labels (a copy or a reference), into *out. Only
 * blocks whose id range covers id are decoded. */
static bool pq_find(const pqueue_t *q, uint64_t id, pending_t *out)
{
    bool found = false;
    pending_t e;
    for (const pq_block_t *b = q->head; b; b = b->next) {
        if (id < b->min_id || id > b->max_id)
            continue;
        pq_reader_t r = pq_reader(b);
        while (r.off < b->used && pq_next(&r, &e))
            if (e.id == id && e.kind != PENDING_TOUCH) {
                *out = e;
                found = true;
            }
    }
    return found;
}

int catalog_get_labels(catalog_t *cat, uint64_t id, arena_t *a, labels_t *out)
{
    int ret = 1;
    pending_t match = {0};
    bool by_ref = false;
    uint64_t hint = 0;
    pthread_mutex_lock(&cat->pending_mu);
    /* Only a queued copy, or a queued reference at or above pending_min, can hold id: after a
     * burst of new series, a history query's thousands of lookups skip the scan. The newest
     * entry for id wins; only blocks whose id range covers id are decoded. */
    bool found = (cat->pending.nadd || id >= atomic_load(&cat->pending_min)) && pq_find(&cat->pending, id, &match);
    /* Written but not yet committed: the read connection cannot see those rows. */
    if (!found && (cat->inflight.nadd || id >= atomic_load(&cat->inflight_min)))
        found = pq_find(&cat->inflight, id, &match);
    if (found && match.kind == PENDING_ADD) {
        ret = copy_labels_to_arena(&match.ls, a, out);
    } else if (found) {
        by_ref = true;
        hint = match.hint;
    }
    pthread_mutex_unlock(&cat->pending_mu);
    /* The label source takes its own locks: never call it under pending_mu. */
    if (by_ref && cat->label_fn(cat->label_ud, id, hint, a, out) == 0)
        return 0;
    if (ret != 1)
        return ret;
    pthread_mutex_lock(&cat->read_mu);
    ret = -1;
    if (cat->get_st || sqlite3_prepare_v3(cat->rdb, "SELECT enc FROM series WHERE id = ?", -1,
                                          SQLITE_PREPARE_PERSISTENT, &cat->get_st, NULL) == SQLITE_OK) {
        sqlite3_stmt *st = cat->get_st;
        sqlite3_bind_int64(st, 1, (sqlite3_int64)id);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            ret =
                decode_labels(sqlite3_column_blob(st, 0), (size_t)sqlite3_column_bytes(st, 0), arena_alloc_cb, a, out);
        else if (rc == SQLITE_DONE)
            ret = 1;
        sqlite3_reset(st);
    }
    pthread_mutex_unlock(&cat->read_mu);
    return ret;
}
