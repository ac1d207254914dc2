/*
 * storage — the facade over head, WAL, snapshot, catalog and roll-ups (contract in storage.h).
 *
 * Files under <path>:
 *   wal/           WAL segments (storage/wal.c)
 *   head.snapshot  the last snapshot (storage/snapshot.c container, records below)
 *   head.snapshot.prev          the one before, kept (with the WAL it needs) as the fallback
 *   head.snapshot.corrupt-<ms>  damaged snapshots set aside at start-up, for inspection
 *   sluice.db      catalog + roll-ups (SQLite, storage/catalog.c, storage/rollup.c)
 *
 * Snapshot record type 1, one per series with samples in memory (little-endian):
 *
 *   offset  size        field
 *   0       8           series id
 *   8       1           flags: bit 0 = a pending (newest, not yet encoded) sample follows
 *   9       8           pending t (ms)
 *   17      8           pending value bits
 *   25      2           number of labels L
 *   27      ...         L times: u16 name length, name bytes, u16 value length, value bytes
 *   ...     4           number of closed chunks C
 *   ...     ...         C times: i64 mint, i64 maxt, u32 length, chunk bytes; the length's top
 *                       bit set means a chunk_int chunk (the head's integer encoding), clear XOR
 *   ...     4           open chunk length O (0 = none), then O bytes; the top bit as for closed
 *                       chunks (an integer open chunk is in chunk_int's appendable layout)
 *
 * Snapshot record type 2, the first piece of a state client's checkpoint (its full state), and
 * type 3, each later piece (a delta on top of it; storage_state_put):
 *
 *   offset  size        field
 *   0       1           client type (1..255)
 *   1       ...         the client's checkpoint bytes
 *
 * State deltas (storage_log_state) are WAL blob records whose tag is the client type.
 *
 * Recovery state machine (storage_recover):
 *
 *   CATALOG --load ids--> SNAPSHOT --loaded / none--> REPLAY
 *     --segments >= the loaded snapshot's (or all)--> OPEN_WAL --> ROLLUPS --> READY
 *
 *   SNAPSHOT (load_snapshot): head.snapshot verifies -> load it. Otherwise the previous one
 *   (whole, its WAL on disk) -> the intact records of the damaged newest -> those of a damaged
 *   previous -> none (WAL alone); damaged files are set aside and what was lost is logged.
 *   Replaying the WAL over a snapshot that already holds some of its samples is harmless: the
 *   head refuses a second sample for a second it has closed (out of order), a same-second
 *   replay is replaced again by the later record, and state deltas are re-appliable.
 *
 * Locks: ckpt (rwlock) is held for reading by appenders across "WAL log + head apply" and for
 * writing only around wal_cut, so a snapshot never needs to stop appends for longer than that.
 * Series ids stay stable when a series leaves memory and comes back: the index keeps the labels
 * hash -> id of the series that left it (index_departed_id; the 64-bit xxh3 label hash is trusted
 * as identity), and at startup is told the catalog's; series in memory carry their id themselves.
 */
#include "storage/storage.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "internal/util/clock.h"
#include "internal/util/endian.h"
#include "internal/util/hashmap.h"
#include "internal/util/log.h"
#include "storage/catalog.h"
#include "storage/querier_fallthrough.h"
#include "storage/querier_tiered.h"
#include "storage/rollup.h"
#include "storage/snapshot.h"
#include "storage/wal.h"

#define SNAP_REC_SERIES 1
#define SNAP_REC_STATE 2
#define SNAP_REC_STATE_DELTA 3
#define SNAP_CHUNK_INT 0x80000000u
#define SNAP_CHUNK_LEN_MASK 0x7fffffffu
#define MAX_LABELS_PER_SERIES 256
#define EXPIRE_BUDGET 4096

/* ---- the store ----------------------------------------------------------------------------- */

struct storage {
    storage_options_t o;
    char *path, *rollups_spec;
    char wal_dir[4096], snap_path[4096];
    head_t *head;
    wal_t *wal;
    catalog_t *cat;
    rollup_t *rollup;
    _Atomic bool ready;
    _Atomic uint64_t next_id; /* memory-only stores */

    pthread_rwlock_t ckpt;

    pthread_mutex_t snap_lock; /* one snapshot at a time */
    int64_t last_snapshot_ms;
    _Atomic uint64_t snapshots, snapshot_errors, wal_errors, rejected_limit, rejected_labels, rejected_max_series;
    _Atomic int64_t last_snapshot_duration_ms;

    /* Deferred roll-up steps (storage_append_refs_defer): the next ticket and the one whose
     * turn it is. */
    pthread_mutex_t rj_mu;
    pthread_cond_t rj_cv;
    uint64_t rj_next, rj_turn;

    storage_wal_hold_fn wal_hold; /* see storage_set_wal_hold */
    void *wal_hold_ud;

    storage_state_client_t clients[256];
    bool has_client[256];
    bool recover_started;
    _Atomic uint64_t state_logged, state_restore_errors;

    storage_fallthrough_t ft; /* ft.open NULL: none */
    pthread_mutex_t min_lock; /* storage_min_time's cache of the roll-ups' oldest data */
    int64_t min_rollup_t, min_rollup_at;
    bool min_rollup_valid;

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t stop_lock;
    pthread_cond_t stop_cond;
    bool stopping;
};

static void *storage_thread(void *arg);

int64_t storage_now_ms(const storage_t *s)
{
    return s->o.clock_ms ? s->o.clock_ms() : clock_wall_ms();
}

void storage_options_default(storage_options_t *o)
{
    memset(o, 0, sizeof(*o));
    o->retention_raw_ms = HEAD_DEFAULT_RETENTION_MS;
    o->block_ms = HEAD_DEFAULT_BLOCK_MS;
    o->wal_fsync_interval_ms = 1000;
}

head_t *storage_head(storage_t *s)
{
    return s->head;
}

bool storage_ready(const storage_t *s)
{
    return atomic_load(&((storage_t *)s)->ready);
}

int64_t storage_min_valid_time(const storage_t *s)
{
    return head_min_valid_time(s->head);
}

/* New series are queued for the catalog by reference (catalog_add_series_ref): the writer reads
 * their labels back from the index, where they are interned, instead of the queue holding a copy
 * of every label string (~600 bytes per Flink series) until the writer gets to it. */
static uint64_t ref_hint(const index_ref_t *ref)
{
    return (uint64_t)ref->shard << 32 | ref->slot;
}

static int catalog_labels_from_head(void *ud, uint64_t id, uint64_t hint, arena_t *a, labels_t *out)
{
    storage_t *s = ud;
    index_t *ix = head_index(s->head);
    index_ref_t ref = {.id = id, .shard = (uint32_t)(hint >> 32), .slot = (uint32_t)hint};
    index_series_t *is = index_acquire_ref(ix, &ref);
    if (!is)
        return 1;
    index_series_labels_copy(ix, is, a, out);
    index_release(ix, is);
    return 0;
}

/* The head keeps a series the catalog has yet to read back. */
static bool head_may_remove(void *ud, uint64_t id)
{
    storage_t *s = ud;
    return !s->cat || catalog_is_written(s->cat, id);
}

storage_t *storage_new(const storage_options_t *o, char *err, size_t errlen)
{
    storage_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->o = *o;
    s->path = o->path ? strdup(o->path) : NULL;
    s->rollups_spec = o->rollups ? strdup(o->rollups) : NULL;
    s->o.path = s->path;
    s->o.rollups = s->rollups_spec;
    if (s->path) {
        snprintf(s->wal_dir, sizeof(s->wal_dir), "%s/wal", s->path);
        snprintf(s->snap_path, sizeof(s->snap_path), "%s/head.snapshot", s->path);
    }
    head_options_t ho = {.retention_ms = o->retention_raw_ms,
                         .block_ms = o->block_ms,
                         .max_series = o->max_series,
                         .may_remove = head_may_remove,
                         .may_remove_ud = s};
    s->head = head_new(&ho);
    if (!s->head || (o->path && !s->path)) {
        snprintf(err, errlen, "out of memory");
        head_free(s->head);
        free(s->path);
        free(s->rollups_spec);
        free(s);
        return NULL;
    }
    atomic_init(&s->next_id, 1);
    pthread_rwlock_init(&s->ckpt, NULL);
    pthread_mutex_init(&s->snap_lock, NULL);
    pthread_mutex_init(&s->stop_lock, NULL);
    pthread_mutex_init(&s->min_lock, NULL);
    pthread_mutex_init(&s->rj_mu, NULL);
    pthread_cond_init(&s->rj_cv, NULL);
    pthread_cond_init(&s->stop_cond, NULL);
    return s;
}

/* ---- recovery ------------------------------------------------------------------------------ */

typedef struct {
    storage_t *s;
    hashmap_t refs; /* series id -> index into refv */
    index_ref_t *refv;
    size_t nref, capref;
    uint64_t restored, replay_errors, from_catalog;
    uint64_t catalog_misses_left;
} recover_t;

/* The value stored under k into *v; false if k is absent. */
static bool map_lookup(const hashmap_t *m, uint64_t k, uint64_t *v)
{
    const uint64_t *p = hashmap_get(m, k);
    if (p)
        *v = *p;
    return p != NULL;
}

static int remember_ref(recover_t *r, uint64_t id, index_ref_t ref)
{
    if (r->nref == r->capref) {
        size_t nc = r->capref ? r->capref * 2 : 1024;
        index_ref_t *p = realloc(r->refv, nc * sizeof(*p));
        if (!p)
            return -1;
        r->refv = p;
        r->capref = nc;
    }
    r->refv[r->nref] = ref;
    return hashmap_put(&r->refs, id, r->nref++);
}

/* Every catalog series, before recovery: the ones recovery brings back into the head drop their
 * entry again; the others keep their ids for when their labels return. */
static int catalog_cb(void *ud, uint64_t id, const labels_t *ls, int64_t first_t, int64_t last_t)
{
    storage_t *s = ud;
    /* OOM: the id may change on return; not fatal */
    (void)index_departed_note(head_index(s->head), labels_hash(ls), id);
    return 0;
}

/* Little-endian readers over a bounded record; any overrun marks the record bad. */
typedef struct {
    const uint8_t *p, *end;
    bool bad;
} rd_t;

static uint64_t rd_u(rd_t *r, int n)
{
    if (r->bad || r->end - r->p < n) {
        r->bad = true;
        return 0;
    }
    uint64_t v = le_get(r->p, (size_t)n);
    r->p += n;
    return v;
}

static const uint8_t *rd_bytes(rd_t *r, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    return p;
}

static int restore_record(recover_t *rc, const uint8_t *data, size_t len, arena_t *a)
{
    rd_t r = {data, data + len, false};
    head_series_state_t st = {0};
    st.id = rd_u(&r, 8);
    uint8_t flags = (uint8_t)rd_u(&r, 1);
    st.pending_t = (int64_t)rd_u(&r, 8);
    uint64_t vb = rd_u(&r, 8);
    memcpy(&st.pending_v, &vb, 8);
    st.has_pending = flags & 1;
    size_t nl = (size_t)rd_u(&r, 2);
    st.labels.v = arena_alloc(a, sizeof(label_t) * (nl ? nl : 1));
    st.labels.n = nl;
    for (size_t i = 0; i < nl && !r.bad; i++) {
        size_t l = (size_t)rd_u(&r, 2);
        const uint8_t *b = rd_bytes(&r, l);
        st.labels.v[i].name = b ? arena_strndup(a, (const char *)b, l) : "";
        l = (size_t)rd_u(&r, 2);
        b = rd_bytes(&r, l);
        st.labels.v[i].value = b ? arena_strndup(a, (const char *)b, l) : "";
    }
    size_t nc = (size_t)rd_u(&r, 4);
    if (r.bad || nc > len)
        return -1;
    querier_chunk_t *ch = arena_alloc(a, sizeof(querier_chunk_t) * (nc ? nc : 1));
    for (size_t i = 0; i < nc && !r.bad; i++) {
        ch[i].mint = (int64_t)rd_u(&r, 8);
        ch[i].maxt = (int64_t)rd_u(&r, 8);
        uint64_t lw = rd_u(&r, 4);
        ch[i].len = (size_t)(lw & SNAP_CHUNK_LEN_MASK);
        ch[i].enc = (lw & SNAP_CHUNK_INT) ? CHUNK_ENC_INT : CHUNK_ENC_XOR;
        ch[i].bytes = rd_bytes(&r, ch[i].len);
    }
    st.chunks = ch;
    st.nchunks = nc;
    uint64_t ow = rd_u(&r, 4);
    st.open_len = (size_t)(ow & SNAP_CHUNK_LEN_MASK);
    st.open_enc = (ow & SNAP_CHUNK_INT) ? CHUNK_ENC_INT : CHUNK_ENC_XOR;
    st.open = st.open_len ? rd_bytes(&r, st.open_len) : NULL;
    if (r.bad || labels_check_sorted_unique(&st.labels) != 0)
        return -1;
    int hrc = head_restore_series(rc->s->head, &st);
    if (hrc == HEAD_ERR_LIMIT || hrc == HEAD_ERR_NOMEM)
        return hrc;
    index_ref_t ref;
    bool created;
    uint64_t hash = labels_hash(&st.labels);
    if (head_get_or_create(rc->s->head, &st.labels, hash, st.id, &ref, &created) == HEAD_OK)
        remember_ref(rc, ref.id, ref);
    else
        (void)index_departed_note(head_index(rc->s->head), hash, st.id); /* not in memory: keep its id */
    rc->restored++;
    return 0;
}

static void restore_state(storage_t *s, uint8_t type, const void *data, size_t len, bool full)
{
    if (!s->has_client[type]) {
        log_warn("storage", "state record of an unregistered type dropped", LF_I("type", type), LF_I("bytes", len),
                 LF_B("snapshot", full));
        return;
    }
    const storage_state_client_t *c = &s->clients[type];
    if (c->restore(c->ud, data, len, full) != 0) {
        atomic_fetch_add(&s->state_restore_errors, 1);
        log_error("storage", "state client refused a record; skipped", LF_I("type", type), LF_I("bytes", len),
                  LF_B("snapshot", full));
    }
}

/* Restores every record r delivers; returns the WAL segment to replay from. */
static uint32_t restore_snapshot(recover_t *rc, snapshot_reader_t *r)
{
    storage_t *s = rc->s;
    uint32_t seg = snapshot_reader_wal_segment(r);
    arena_t *a = arena_create(0);
    uint8_t type;
    const void *data;
    size_t len;
    uint64_t bad = 0;
    while (snapshot_reader_next(r, &type, &data, &len)) {
        if ((type == SNAP_REC_STATE || type == SNAP_REC_STATE_DELTA) && len >= 1) {
            restore_state(s, ((const uint8_t *)data)[0], (const uint8_t *)data + 1, len - 1, type == SNAP_REC_STATE);
            continue;
        }
        if (type != SNAP_REC_SERIES)
            continue;
        if (restore_record(rc, data, len, a) < 0)
            bad++;
        arena_reset(a);
    }
    arena_destroy(a);
    if (bad)
        log_warn("storage", "snapshot records skipped", LF_I("records", bad));
    return seg;
}

/* One snapshot file considered at start-up. */
typedef struct {
    char path[4200];
    snapshot_reader_t *r; /* set for SNAPSHOT_OK and SNAPSHOT_PARTIAL */
    int rc;
    char err[256];
} snap_file_t;

static void snap_file_open(snap_file_t *f, const char *path, const char *suffix)
{
    snprintf(f->path, sizeof(f->path), "%s%s", path, suffix);
    f->r = NULL;
    f->err[0] = 0;
    f->rc = snapshot_reader_salvage(f->path, &f->r, f->err, sizeof(f->err));
}

static bool snap_file_damaged(const snap_file_t *f)
{
    return f->rc == SNAPSHOT_PARTIAL || f->rc == SNAPSHOT_ERR_CORRUPT;
}

/* Does the WAL on disk still reach back to segment seg (so nothing after seg was deleted)? */
static bool wal_reaches(const storage_t *s, uint32_t seg)
{
    uint32_t oldest;
    return wal_oldest_segment(s->wal_dir, &oldest) == WAL_OK && oldest != 0 && oldest <= seg;
}

/* Renames a damaged snapshot aside (never deleted: it may hold what nothing else does). */
static void snap_file_set_aside(snap_file_t *f)
{
    char to[4300] = "", err[256];
    if (snapshot_set_aside(f->path, to, sizeof(to), err, sizeof(err)) == SNAPSHOT_OK)
        log_error("storage", "damaged snapshot set aside", LF_S("file", f->path), LF_S("now", to),
                  LF_S("damage", f->err));
    else
        log_error("storage", "cannot set a damaged snapshot aside", LF_S("file", f->path), LF_S("err", err));
}

/*
 * Picks what to recover from, loads it, and returns the first WAL segment to replay (0: all).
 * The newest snapshot when it verifies; otherwise, in order of preference:
 *   1. the previous snapshot, whole, + the WAL from its segment: lossless, because snapshots
 *      keep the segments the older one needs (unless they were deleted by hand: then only when
 *      there is nothing of the newest to salvage);
 *   2. the intact records of the damaged newest one + the WAL from its segment: the series
 *      after the damage keep only what the WAL holds;
 *   3. the intact records of a damaged previous one + the WAL from its segment;
 *   4. nothing: the WAL alone (samples only a snapshot held are lost; the catalog names the
 *      series whose WAL series records are gone).
 * Salvaged and previous snapshots are never mixed: restoring a series twice is refused by the
 * head, but state records replace each other, and the WAL from the chosen segment is exactly
 * what completes the chosen snapshot. Every damaged file is set aside.
 */
static uint32_t load_snapshot(recover_t *rc)
{
    storage_t *s = rc->s;
    snap_file_t cur, prev;
    snap_file_open(&cur, s->snap_path, "");
    if (cur.rc == SNAPSHOT_OK) {
        uint32_t seg = restore_snapshot(rc, cur.r);
        snapshot_reader_close(cur.r);
        log_info("storage", "snapshot loaded", LF_I("series", rc->restored), LF_I("wal_segment", seg));
        return seg;
    }
    snap_file_open(&prev, s->snap_path, SNAPSHOT_PREV_SUFFIX);
    if (cur.rc == SNAPSHOT_ERR_NOT_FOUND && prev.rc == SNAPSHOT_ERR_NOT_FOUND)
        return 0; /* a first start */

    snap_file_t *use = NULL;
    bool prev_reach = prev.rc == SNAPSHOT_OK && wal_reaches(s, snapshot_reader_wal_segment(prev.r));
    if (prev.rc == SNAPSHOT_OK && (prev_reach || cur.rc != SNAPSHOT_PARTIAL))
        use = &prev;
    else if (cur.rc == SNAPSHOT_PARTIAL)
        use = &cur;
    else if (prev.rc == SNAPSHOT_PARTIAL)
        use = &prev;

    uint32_t seg = use ? restore_snapshot(rc, use->r) : 0;
    snapshot_verdict_t v = {0};
    if (use)
        snapshot_reader_verdict(use->r, &v);
    snapshot_reader_close(cur.r);
    snapshot_reader_close(prev.r);

    if (use == &prev && prev.rc == SNAPSHOT_OK && cur.rc == SNAPSHOT_ERR_NOT_FOUND)
        log_warn("storage", "newest snapshot missing (a crash while it was replaced?); loaded the previous one",
                 LF_S("file", prev.path), LF_I("series", rc->restored), LF_I("wal_segment", seg),
                 LF_B("wal_complete", prev_reach));
    else if (use == &prev && prev.rc == SNAPSHOT_OK)
        log_error("storage", "snapshot damaged; recovering from the previous snapshot and the WAL since it",
                  LF_S("file", cur.path), LF_S("err", cur.err), LF_S("previous", prev.path),
                  LF_I("series", rc->restored), LF_I("wal_segment", seg), LF_B("wal_complete", prev_reach),
                  LF_S("lost", prev_reach ? "nothing" : "the records of the missing WAL segments"));
    else if (use)
        log_error("storage",
                  "snapshot damaged; recovered the records before the damage, the rest is lost unless the WAL "
                  "holds it",
                  LF_S("file", use->path), LF_S("err", use->err), LF_I("records", v.records),
                  LF_I("records_expected", v.records_expected), LF_I("damage_offset", v.stop_offset),
                  LF_I("bytes_lost", v.file_bytes - v.stop_offset), LF_I("series", rc->restored),
                  LF_I("wal_segment", seg),
                  LF_S("fallback", use == &prev             ? cur.err
                                   : prev.rc == SNAPSHOT_OK ? "previous snapshot whole, but the WAL it needs is gone"
                                                            : prev.err));
    else
        log_error("storage", "no usable snapshot, recovering from the WAL alone; what only the snapshot held is lost",
                  LF_S("file", cur.path), LF_S("err", cur.err), LF_S("previous", prev.err));

    if (snap_file_damaged(&cur))
        snap_file_set_aside(&cur);
    if (snap_file_damaged(&prev))
        snap_file_set_aside(&prev);
    return seg;
}

static int replay_series(void *ud, uint64_t id, const labels_t *ls)
{
    recover_t *rc = ud;
    uint64_t hash = labels_hash(ls);
    index_ref_t ref;
    bool created;
    if (labels_check_sorted_unique(ls) != 0)
        return 0;
    if (head_get_or_create(rc->s->head, ls, hash, id, &ref, &created) != HEAD_OK) {
        rc->replay_errors++;
        return 0;
    }
    /* The WAL may name the same labels under the id the head already has; map both ids. */
    remember_ref(rc, id, ref);
    return 0;
}

/* A sample of a series whose WAL series record is gone (a deleted or set-aside segment): the
 * catalog knows its labels if the roll-up writer committed them. */
static bool replay_series_from_catalog(recover_t *rc, uint64_t id, uint64_t *k)
{
    if (!rc->s->cat || rc->catalog_misses_left == 0)
        return false;
    arena_t *a = arena_create(0);
    labels_t ls;
    bool ok = a && catalog_get_labels(rc->s->cat, id, a, &ls) == 0;
    if (ok) {
        replay_series(rc, id, &ls);
        ok = map_lookup(&rc->refs, id, k);
        rc->from_catalog += ok;
    } else {
        rc->catalog_misses_left--; /* bound the lookups when the catalog lacks many ids */
    }
    arena_destroy(a);
    return ok;
}

static int replay_samples(void *ud, const wal_sample_t *v, size_t n)
{
    recover_t *rc = ud;
    storage_t *s = rc->s;
    for (size_t i = 0; i < n; i++) {
        uint64_t k;
        if (!map_lookup(&rc->refs, v[i].series_id, &k) && !replay_series_from_catalog(rc, v[i].series_id, &k)) {
            rc->replay_errors++;
            continue;
        }
        /* Duplicates of what the snapshot holds come back as out of order: expected. The
         * roll-up hint is kept in the head series as on the append path (append_rollup). */
        void *aux = NULL;
        if (head_append_ref_aux(s->head, &rc->refv[k], v[i].t_ms, v[i].v, &aux) == HEAD_OK && s->rollup) {
            rollup_sample_t rs = {.series_id = rc->refv[k].id, .t = v[i].t_ms, .v = v[i].v};
            void *aux0 = aux;
            rollup_add_samples_hinted(s->rollup, &rs, 1, &aux);
            if (aux != aux0)
                head_set_aux(s->head, &rc->refv[k], aux);
        }
    }
    return 0;
}

static int replay_blob(void *ud, uint8_t type, const void *data, size_t len)
{
    recover_t *rc = ud;
    restore_state(rc->s, type, data, len, false);
    return 0;
}

int storage_register_state(storage_t *s, uint8_t type, const storage_state_client_t *c)
{
    if (type == 0 || !c || !c->restore || !c->checkpoint || s->has_client[type] || s->recover_started)
        return -1;
    s->clients[type] = *c;
    s->has_client[type] = true;
    return STORAGE_OK;
}

/* Counts a WAL write failure and logs it, at most every 10 s (a full disk fails every write). */
static void storage_note_wal_error(storage_t *s, const char *why)
{
    atomic_fetch_add(&s->wal_errors, 1);
    static _Atomic int64_t last_log_ms;
    int64_t now = clock_mono_ms(), last = atomic_load(&last_log_ms);
    if (now - last >= 10000 && atomic_compare_exchange_strong(&last_log_ms, &last, now))
        log_error("storage", "write-ahead log write failed; writes answer 503 until it works again", LF_S("err", why),
                  LF_I("errors_total", (int64_t)atomic_load(&s->wal_errors)));
}

int storage_log_state(storage_t *s, uint8_t type, const void *data, size_t len, char *err, size_t errlen)
{
    if (!storage_ready(s)) {
        if (err && errlen)
            snprintf(err, errlen, "storage is still recovering");
        return STORAGE_ERR_NOT_READY;
    }
    assert(s->has_client[type]);
    if (len >= WAL_MAX_RECORD_BYTES - 1) {
        if (err && errlen)
            snprintf(err, errlen, "state record of %zu bytes is too large", len);
        return STORAGE_ERR_LIMIT;
    }
    if (!s->wal)
        return STORAGE_OK;
    char werr[256] = "";
    if (wal_log_blob(s->wal, type, data, len, werr, sizeof(werr)) != WAL_OK) {
        storage_note_wal_error(s, werr);
        if (err && errlen)
            snprintf(err, errlen, "write-ahead log: %s", werr);
        return STORAGE_ERR_IO;
    }
    atomic_fetch_add(&s->state_logged, 1);
    return STORAGE_OK;
}

const char *storage_wal_dir(const storage_t *s)
{
    return s->path ? s->wal_dir : NULL;
}

int storage_set_wal_hold(storage_t *s, storage_wal_hold_fn fn, void *ud)
{
    if (s->recover_started || !fn)
        return -1;
    s->wal_hold = fn;
    s->wal_hold_ud = ud;
    return STORAGE_OK;
}

int storage_series_labels(storage_t *s, uint64_t id, arena_t *a, labels_t *out)
{
    if (!s->cat)
        return 1;
    return catalog_get_labels(s->cat, id, a, out);
}

int storage_recover(storage_t *s, char *err, size_t errlen)
{
    s->recover_started = true;
    if (!s->path)
        goto start_thread;
    if (mkdir(s->path, 0755) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", s->path, strerror(errno));
        return STORAGE_ERR_IO;
    }
    s->cat = catalog_open(s->path, err, errlen);
    if (!s->cat)
        return STORAGE_ERR_IO;
    catalog_set_label_source(s->cat, catalog_labels_from_head, s);
    if (catalog_load(s->cat, catalog_cb, s) < 0) {
        snprintf(err, errlen, "cannot load the series catalog in %s", catalog_path(s->cat));
        return STORAGE_ERR_IO;
    }
    /* Expire first, so recovery does not load what is already past retention. */
    head_expire(s->head, storage_now_ms(s), 0);

    if (!s->rollups_spec || s->rollups_spec[0]) {
        /* no_background covers the roll-up writer too: a test that drives the store by hand
         * (storage_housekeep, storage_flush) must not have a thread rewriting or deleting
         * roll-ups behind it on the real clock's schedule. */
        rollup_config_t rcfg = {
            .resolutions = s->rollups_spec, .no_thread = s->o.no_background, .clock_ms = s->o.clock_ms};
        s->rollup = rollup_open(s->cat, &rcfg, err, errlen);
        if (!s->rollup)
            return STORAGE_ERR_IO;
    }

    recover_t rc = {.s = s, .catalog_misses_left = 100000};
    uint32_t seg = load_snapshot(&rc);
    wal_replay_cb_t cb = {.on_series = replay_series, .on_samples = replay_samples, .on_blob = replay_blob};
    wal_replay_stats_t ws;
    int wrc = wal_replay(s->wal_dir, seg, &cb, &rc, &ws, err, errlen);
    hashmap_free(&rc.refs);
    free(rc.refv);
    if (wrc != WAL_OK)
        return STORAGE_ERR_IO;
    log_info("storage", "WAL replayed", LF_I("segments", ws.segments), LF_I("samples", ws.samples),
             LF_I("series", ws.series), LF_B("truncated_tail", ws.truncated),
             LF_I("missing_segments", ws.missing_segments), LF_I("series_from_catalog", rc.from_catalog),
             LF_I("unknown_series", rc.replay_errors));

    wal_options_t wo;
    wal_options_default(&wo);
    wo.fsync_mode = s->o.wal_fsync_always ? WAL_FSYNC_ALWAYS : WAL_FSYNC_INTERVAL;
    if (s->o.wal_fsync_interval_ms)
        wo.fsync_interval_ms = s->o.wal_fsync_interval_ms;
    s->wal = wal_open(s->wal_dir, &wo, err, errlen);
    if (!s->wal)
        return STORAGE_ERR_IO;
    s->last_snapshot_ms = storage_now_ms(s);
    head_stats_t hs;
    head_get_stats(s->head, &hs);
    log_info("storage", "ready", LF_I("series", hs.series), LF_I("chunks", hs.chunks));
start_thread:
    /* The housekeeping thread exists, named, before the store says it is ready (named from here:
     * the thread itself may not have run yet when /-/ready first answers 200). */
    if (!s->o.no_background) {
        if (pthread_create(&s->thread, NULL, storage_thread, s) == 0) {
            s->thread_started = true;
            pthread_setname_np(s->thread, "storage-house");
        }
    }
    atomic_store(&s->ready, true);
    return STORAGE_OK;
}

storage_t *storage_open(const storage_options_t *o, char *err, size_t errlen)
{
    storage_t *s = storage_new(o, err, errlen);
    if (!s)
        return NULL;
    if (storage_recover(s, err, errlen) != STORAGE_OK) {
        storage_close(s);
        return NULL;
    }
    return s;
}

/* ---- background ---------------------------------------------------------------------------- */

int storage_flush(storage_t *s)
{
    if (s->rollup)
        return rollup_flush(s->rollup, false) == 0 ? STORAGE_OK : STORAGE_ERR_IO;
    if (s->cat)
        return catalog_flush(s->cat) == 0 ? STORAGE_OK : STORAGE_ERR_IO;
    return STORAGE_OK;
}

void storage_housekeep(storage_t *s)
{
    if (!storage_ready(s))
        return;
    int64_t now = storage_now_ms(s);
    head_expire(s->head, now, EXPIRE_BUDGET);
    int64_t every = s->o.snapshot_interval_ms ? s->o.snapshot_interval_ms : 3600 * 1000;
    if (s->wal && every > 0 && now - s->last_snapshot_ms >= every) {
        char err[256];
        if (storage_snapshot(s, err, sizeof(err)) != STORAGE_OK)
            log_error("storage", "periodic snapshot failed", LF_S("err", err));
    }
}

static void *storage_thread(void *arg)
{
    storage_t *s = arg;
    pthread_mutex_lock(&s->stop_lock);
    while (!s->stopping) {
        struct timespec ts = clock_deadline_ms(CLOCK_REALTIME, 1000);
        pthread_cond_timedwait(&s->stop_cond, &s->stop_lock, &ts);
        if (s->stopping)
            break;
        pthread_mutex_unlock(&s->stop_lock);
        storage_housekeep(s);
        pthread_mutex_lock(&s->stop_lock);
    }
    pthread_mutex_unlock(&s->stop_lock);
    return NULL;
}

/* ---- snapshot ------------------------------------------------------------------------------ */

static void put_u(buf_t *b, uint64_t v, int n)
{
    uint8_t tmp[8];
    le_put(tmp, v, (size_t)n);
    buf_append(b, tmp, (size_t)n);
}

typedef struct {
    snapshot_writer_t *w;
    buf_t b;
    char *err;
    size_t errlen;
    uint64_t series;
} snapctx_t;

struct storage_state_sink {
    snapctx_t *c;
    uint8_t type;
    int pieces;
    bool failed; /* a piece was not written: the writer's message is in c->err */
};

int storage_state_put(storage_state_sink_t *k, const void *data, size_t len)
{
    buf_t *b = &k->c->b;
    buf_reset(b);
    buf_putc(b, (char)k->type);
    buf_append(b, data, len);
    int rtype = k->pieces++ ? SNAP_REC_STATE_DELTA : SNAP_REC_STATE;
    if (snapshot_writer_add(k->c->w, rtype, b->data, b->len, k->c->err, k->c->errlen) != SNAPSHOT_OK)
        k->failed = true;
    return k->failed ? STORAGE_ERR_IO : STORAGE_OK;
}

static int snap_series(void *ud, const head_series_state_t *st)
{
    snapctx_t *c = ud;
    buf_t *b = &c->b;
    buf_reset(b);
    put_u(b, st->id, 8);
    put_u(b, st->has_pending ? 1 : 0, 1);
    put_u(b, (uint64_t)st->pending_t, 8);
    uint64_t vb;
    memcpy(&vb, &st->pending_v, 8);
    put_u(b, vb, 8);
    put_u(b, st->labels.n, 2);
    for (size_t i = 0; i < st->labels.n; i++) {
        size_t l = strlen(st->labels.v[i].name);
        put_u(b, l, 2);
        buf_append(b, st->labels.v[i].name, l);
        l = strlen(st->labels.v[i].value);
        put_u(b, l, 2);
        buf_append(b, st->labels.v[i].value, l);
    }
    put_u(b, st->nchunks, 4);
    for (size_t i = 0; i < st->nchunks; i++) {
        put_u(b, (uint64_t)st->chunks[i].mint, 8);
        put_u(b, (uint64_t)st->chunks[i].maxt, 8);
        assert(st->chunks[i].len <= SNAP_CHUNK_LEN_MASK);
        put_u(b, st->chunks[i].len | (st->chunks[i].enc == CHUNK_ENC_INT ? SNAP_CHUNK_INT : 0), 4);
        buf_append(b, st->chunks[i].bytes, st->chunks[i].len);
    }
    assert(!st->open || st->open_len <= SNAP_CHUNK_LEN_MASK);
    put_u(b, st->open ? st->open_len | (st->open_enc == CHUNK_ENC_INT ? SNAP_CHUNK_INT : 0) : 0, 4);
    if (st->open)
        buf_append(b, st->open, st->open_len);
    c->series++;
    return snapshot_writer_add(c->w, SNAP_REC_SERIES, b->data, b->len, c->err, c->errlen) == SNAPSHOT_OK ? 0 : -1;
}

int storage_snapshot(storage_t *s, char *err, size_t errlen)
{
    if (!s->wal || !storage_ready(s))
        return STORAGE_OK;
    pthread_mutex_lock(&s->snap_lock);
    int64_t t0 = clock_wall_ms();
    uint32_t seg;
    /* Every record logged before the cut has been applied to the head (appenders hold ckpt
     * across log + apply), so the capture below includes all of segments < seg. */
    pthread_rwlock_wrlock(&s->ckpt);
    int wrc = wal_cut(s->wal, &seg, err, errlen);
    pthread_mutex_lock(&s->rj_mu);
    uint64_t jobs_before_cut = s->rj_next; /* deferred roll-up steps of records before the cut */
    pthread_mutex_unlock(&s->rj_mu);
    pthread_rwlock_unlock(&s->ckpt);
    if (wrc != WAL_OK) {
        atomic_fetch_add(&s->snapshot_errors, 1);
        pthread_mutex_unlock(&s->snap_lock);
        return STORAGE_ERR_IO;
    }
    snapctx_t c = {.err = err, .errlen = errlen};
    buf_init(&c.b);
    c.w = snapshot_writer_open(s->snap_path, seg, err, errlen);
    int rc = c.w ? 0 : -1;
    /* State clients right after the cut (outside ckpt: see storage.h for why that is safe). */
    for (int type = 1; type < 256 && rc == 0; type++) {
        if (!s->has_client[type])
            continue;
        storage_state_sink_t sink = {.c = &c, .type = (uint8_t)type};
        if (s->clients[type].checkpoint(s->clients[type].ud, &sink) != 0) {
            if (!sink.failed)
                snprintf(err, errlen, "state client %d failed to checkpoint", type);
            rc = -1;
        }
    }
    if (rc == 0)
        rc = head_foreach_series(s->head, snap_series, &c);
    buf_free(&c.b);
    /* Recovery replays the WAL from this cut into the roll-ups too, and they keep only what is
     * newer than their checkpointed states: so before this snapshot can be the one recovered
     * from, the roll-ups are checkpointed with every sample before the cut in them. (Their own
     * periodic checkpoint can then be rare: the writer snapshots a state whenever it writes one
     * of its buckets anyway.) */
    if (rc == 0 && s->rollup) {
        pthread_mutex_lock(&s->rj_mu);
        while (s->rj_turn < jobs_before_cut)
            pthread_cond_wait(&s->rj_cv, &s->rj_mu);
        pthread_mutex_unlock(&s->rj_mu);
        if (rollup_flush(s->rollup, true) != 0) {
            snprintf(err, errlen, "roll-up checkpoint failed");
            rc = -1;
        }
    }
    if (rc != 0) {
        snapshot_writer_abort(c.w);
        atomic_fetch_add(&s->snapshot_errors, 1);
        pthread_mutex_unlock(&s->snap_lock);
        return STORAGE_ERR_IO;
    }
    if (snapshot_writer_commit(c.w, err, errlen) != SNAPSHOT_OK) {
        atomic_fetch_add(&s->snapshot_errors, 1);
        pthread_mutex_unlock(&s->snap_lock);
        return STORAGE_ERR_IO;
    }
    char terr[256];
    uint32_t keep = seg, oldest;
    /* The previous snapshot, kept as the fallback should this one prove damaged, needs the WAL
     * from its own segment on. */
    if (snapshot_oldest_wal_segment(s->snap_path, &oldest) == SNAPSHOT_OK && oldest < keep)
        keep = oldest;
    if (s->wal_hold) {
        uint32_t h = s->wal_hold(s->wal_hold_ud);
        if (h && h < keep)
            keep = h; /* a WAL reader (remote write) still needs these */
    }
    /* The segments about to go hold series records. If this snapshot is ever unreadable, the
     * catalog is what names the series of the later segments' samples, so it must have committed
     * every series queued before the cut first (the roll-up writer flushes only every few
     * seconds: a kill -9 in between lost the labels of every series created since). */
    if (s->cat && catalog_flush(s->cat) != 0) {
        log_warn("storage", "catalog not flushed; old WAL segments kept until the next snapshot");
        keep = 0;
    }
    if (keep && wal_truncate_before(s->wal, keep, terr, sizeof(terr)) != WAL_OK)
        log_warn("storage", "old WAL segments not removed", LF_S("err", terr));
    s->last_snapshot_ms = storage_now_ms(s);
    atomic_store(&s->last_snapshot_duration_ms, clock_wall_ms() - t0);
    atomic_fetch_add(&s->snapshots, 1);
    log_info("storage", "snapshot written", LF_I("series", c.series), LF_I("wal_segment", seg),
             LF_I("duration_ms", clock_wall_ms() - t0));
    pthread_mutex_unlock(&s->snap_lock);
    return STORAGE_OK;
}

void storage_close(storage_t *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->stop_lock);
        s->stopping = true;
        pthread_cond_signal(&s->stop_cond);
        pthread_mutex_unlock(&s->stop_lock);
        pthread_join(s->thread, NULL);
    }
    char err[256];
    if (s->wal && storage_ready(s) && storage_snapshot(s, err, sizeof(err)) != STORAGE_OK)
        log_error("storage", "final snapshot failed; the WAL still has everything", LF_S("err", err));
    if (s->wal && wal_close(s->wal, err, sizeof(err)) != WAL_OK)
        log_error("storage", "closing the WAL failed", LF_S("err", err));
    if (s->rollup)
        rollup_close(s->rollup);
    if (s->cat)
        catalog_close(s->cat);
    head_free(s->head);
    pthread_rwlock_destroy(&s->ckpt);
    pthread_mutex_destroy(&s->snap_lock);
    pthread_mutex_destroy(&s->stop_lock);
    pthread_mutex_destroy(&s->min_lock);
    pthread_mutex_destroy(&s->rj_mu);
    pthread_cond_destroy(&s->rj_cv);
    pthread_cond_destroy(&s->stop_cond);
    free(s->path);
    free(s->rollups_spec);
    free(s);
}

/* ---- append -------------------------------------------------------------------------------- */

static int fail(storage_append_result_t *res, size_t i, int code, const char *fmt, const labels_t *ls)
{
    if (res->failed++ == 0) {
        res->first_failed = i;
        res->first_error = code;
        int n = snprintf(res->msg, sizeof(res->msg), "%s; sample %zu, series {", fmt, i);
        for (size_t k = 0; ls && k < ls->n && n > 0 && (size_t)n < sizeof(res->msg); k++)
            n += snprintf(res->msg + n, sizeof(res->msg) - (size_t)n, "%s%s=\"%s\"", k ? ", " : "", ls->v[k].name,
                          ls->v[k].value);
        if (n > 0 && (size_t)n < sizeof(res->msg))
            snprintf(res->msg + n, sizeof(res->msg) - (size_t)n, "}");
    }
    return code;
}

/* Whether a label set is already what normalize makes (sorted, unique, valid names, no empty
 * value, a metric name): the push path's are, and then they are used in place, uncopied. */
static bool normalized(const labels_t *in)
{
    bool has_name = false;
    if (in->n > MAX_LABELS_PER_SERIES)
        return false;
    for (size_t i = 0; i < in->n; i++) {
        const char *name = in->v[i].name, *value = in->v[i].value;
        if (!name || !value || !value[0] || (i > 0 && strcmp(in->v[i - 1].name, name) >= 0))
            return false;
        if (strcmp(name, LABEL_METRIC_NAME) == 0)
            has_name = true;
        else if (!labels_valid_name(name, strlen(name)))
            return false;
    }
    return has_name;
}

/* Sorted copy without empty values into out (capacity MAX_LABELS_PER_SERIES), or in itself when
 * it is that already; -1 if invalid. */
static int normalize(const labels_t *in, label_t *out, labels_t *ls, const char **why)
{
    if (normalized(in)) {
        *ls = *in;
        return 0;
    }
    size_t n = 0;
    bool has_name = false;
    for (size_t i = 0; i < in->n; i++) {
        const char *name = in->v[i].name, *value = in->v[i].value;
        if (!name || !value) {
            *why = "label without name or value";
            return -1;
        }
        if (!value[0])
            continue;
        if (strcmp(name, LABEL_METRIC_NAME) == 0)
            has_name = true;
        else if (!labels_valid_name(name, strlen(name))) {
            *why = "invalid label name";
            return -1;
        }
        if (n == MAX_LABELS_PER_SERIES) {
            *why = "too many labels";
            return -1;
        }
        out[n++] = in->v[i];
    }
    if (!has_name) {
        *why = "missing metric name (__name__)";
        return -1;
    }
    ls->v = out;
    ls->n = n;
    labels_sort(ls);
    if (labels_check_sorted_unique(ls) != 0) {
        *why = "duplicate label name";
        return -1;
    }
    return 0;
}

static int head_to_storage_err(int hrc)
{
    switch (hrc) {
    case HEAD_ERR_OUT_OF_ORDER: return STORAGE_ERR_OUT_OF_ORDER;
    case HEAD_ERR_TOO_OLD: return STORAGE_ERR_TOO_OLD;
    case HEAD_ERR_LIMIT: return STORAGE_ERR_MAX_SERIES;
    default: return STORAGE_ERR_NOMEM;
    }
}

static const char *err_text(int code)
{
    switch (code) {
    case STORAGE_ERR_OUT_OF_ORDER: return "out of order sample (older than the series' newest second)";
    case STORAGE_ERR_TOO_OLD: return "sample too old (before the raw retention window)";
    case STORAGE_ERR_TOO_NEW: return "sample too far in the future (storage.max-future after now)";
    case STORAGE_ERR_MAX_SERIES: return "series limit reached (storage.max-series): new series refused";
    default: return "out of memory";
    }
}

/* One append's working state. storage_append runs it in steps: resolve (find or create each
 * sample's series and check the sample), log (the new series and the samples to the WAL), apply
 * (into the head) — the three under the checkpoint lock, taken and released in one place — then
 * the roll-ups outside it. A step that fails the whole request sets res and returns its code. */
typedef struct {
    storage_t *s;
    const storage_sample_t *smp;
    size_t n;
    storage_append_result_t *res;
    index_ref_t *refs;         /* each sample's series, valid where ok[i] & APPEND_RESOLVED */
    uint8_t *ok;               /* APPEND_* flags of sample i */
    const storage_ref_t *hint; /* caller's refs (storage_append_refs), or NULL */
    /* The batch head calls: each sample's time and value, the samples of a call, its results. */
    int64_t *t;
    double *v;
    uint32_t *sel;
    int8_t *hrc;
    bool prechecked;  /* hrc[i] holds head_check of hint[i] for every hinted sample */
    wal_sample_t *ws; /* samples to log */
    size_t nws;
    /* The samples applied, for the roll-ups (NULL without them): rs[j] is sample sel[j], aux[j]
     * the roll-up hint its head series held, aux0[j] a copy to see which the roll-up changed. */
    rollup_sample_t *rs;
    void **aux, **aux0;
    size_t nrs;
    wal_series_t *wser; /* series created by this request, to log */
    size_t nwser, capwser;
    arena_t *a;    /* the new series' label arrays */
    int64_t max_t; /* newest timestamp accepted (now + max_future_ms); INT64_MAX = any */
    label_t lbuf[MAX_LABELS_PER_SERIES];
} append_t;

enum {
    APPEND_RESOLVED = 1, /* refs[i] holds the sample's series */
    APPEND_PASSED = 2,   /* the sample passed its checks: log and apply it */
};

/* Fails the whole request: nothing of it counts as accepted. */
static int append_fail_all(append_t *ap, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int append_fail_all(append_t *ap, int code, const char *fmt, ...)
{
    memset(ap->res, 0, sizeof(*ap->res));
    va_list va;
    va_start(va, fmt);
    vsnprintf(ap->res->msg, sizeof(ap->res->msg), fmt, va);
    va_end(va);
    ap->res->failed = ap->n;
    ap->res->first_error = code;
    return code;
}

static int append_init(append_t *ap, storage_t *s, const storage_sample_t *smp, size_t n, storage_append_result_t *res)
{
    *ap = (append_t){.s = s, .smp = smp, .n = n, .res = res, .max_t = INT64_MAX};
    if (s->o.max_future_ms > 0)
        ap->max_t = storage_now_ms(s) + s->o.max_future_ms;
    size_t m = n ? n : 1;
    ap->refs = malloc(sizeof(index_ref_t) * m);
    ap->ok = calloc(m, 1);
    ap->ws = malloc(sizeof(wal_sample_t) * m);
    ap->t = malloc(sizeof(int64_t) * m);
    ap->v = malloc(sizeof(double) * m);
    ap->sel = malloc(sizeof(uint32_t) * m);
    ap->hrc = malloc(m);
    ap->a = arena_create(0);
    if (!ap->refs || !ap->ok || !ap->ws || !ap->t || !ap->v || !ap->sel || !ap->hrc || !ap->a)
        return append_fail_all(ap, STORAGE_ERR_NOMEM, "out of memory");
    if (s->rollup) {
        ap->rs = malloc(sizeof(rollup_sample_t) * m);
        ap->aux = malloc(sizeof(void *) * m * 2);
        if (!ap->rs || !ap->aux)
            return append_fail_all(ap, STORAGE_ERR_NOMEM, "out of memory");
        ap->aux0 = ap->aux + m;
    }
    for (size_t i = 0; i < n; i++) {
        ap->t[i] = smp[i].t;
        ap->v[i] = smp[i].v;
    }
    return STORAGE_OK;
}

static void append_free(append_t *ap)
{
    free(ap->refs);
    free(ap->ok);
    free(ap->ws);
    free(ap->t);
    free(ap->v);
    free(ap->sel);
    free(ap->hrc);
    free(ap->rs);
    free(ap->aux);
    free(ap->wser);
    arena_destroy(ap->a);
}

/* Checks sample i against its series (ap->refs[i]); queues it for the WAL when it passes. A
 * caller's ref (verified false) is verified by the check itself, under the same shard read lock a
 * label lookup takes: false, with nothing done, when it names no live series. */
static bool append_check(append_t *ap, size_t i, const labels_t *ls, bool verified)
{
    const storage_sample_t *x = &ap->smp[i];
    /* A sample from a clock years ahead (or at INT64_MAX) would make every later sample of its
     * series out of order until that time: refuse it instead. */
    if (x->t > ap->max_t) {
        if (!verified) {
            index_series_t *is = index_acquire_ref(head_index(ap->s->head), &ap->refs[i]);
            if (!is)
                return false;
            index_release(head_index(ap->s->head), is);
        }
        ap->ok[i] |= APPEND_RESOLVED;
        fail(ap->res, i, STORAGE_ERR_TOO_NEW, err_text(STORAGE_ERR_TOO_NEW), ls);
        return true;
    }
    int hrc = !verified && ap->prechecked ? ap->hrc[i] : head_check(ap->s->head, &ap->refs[i], x->t);
    if (hrc == HEAD_ERR_NOT_FOUND) {
        if (!verified)
            return false;
        hrc = HEAD_OK; /* swept meanwhile: recreated at apply time */
    }
    ap->ok[i] |= APPEND_RESOLVED;
    if (hrc != HEAD_OK) {
        int code = head_to_storage_err(hrc);
        fail(ap->res, i, code, err_text(code), ls);
        return true;
    }
    ap->ok[i] |= APPEND_PASSED;
    ap->ws[ap->nws++] = (wal_sample_t){.series_id = ap->refs[i].id, .t_ms = x->t, .v = x->v};
    return true;
}

/* Remembers a series this request created, for the WAL's series record. */
static int append_note_series(append_t *ap, uint64_t id, const labels_t *ls)
{
    if (ap->nwser == ap->capwser) {
        size_t cap = ap->capwser ? ap->capwser * 2 : 16;
        wal_series_t *p = realloc(ap->wser, cap * sizeof(*p));
        if (!p)
            return append_fail_all(ap, STORAGE_ERR_NOMEM, "out of memory");
        ap->wser = p;
        ap->capwser = cap;
    }
    wal_series_t *w = &ap->wser[ap->nwser++];
    w->id = id;
    w->labels = *ls;
    /* The caller's labels live through the call (the WAL record is made in it); the scratch
     * copy normalize may have made is reused by the next sample. */
    if (ls->v == ap->lbuf) {
        w->labels.v = arena_alloc(ap->a, sizeof(label_t) * ls->n);
        memcpy(w->labels.v, ls->v, sizeof(label_t) * ls->n);
    }
    return STORAGE_OK;
}

/* Finds or creates the series of sample i into refs[i]. *resolved: refs[i] holds its series. */
static int append_resolve_one(append_t *ap, size_t i, bool *resolved)
{
    storage_t *s = ap->s;
    labels_t ls;
    const char *why;
    *resolved = false;
    if (normalize(&ap->smp[i].labels, ap->lbuf, &ls, &why) < 0) {
        atomic_fetch_add(&s->rejected_labels, 1);
        fail(ap->res, i, STORAGE_ERR_BAD_LABELS, why, &ap->smp[i].labels);
        return STORAGE_OK;
    }
    uint64_t hash = labels_hash(&ls);
    /* Most samples belong to series already in memory: find those through the sharded index
     * alone; only a series to create asks for the id its labels had if they were here before. */
    index_series_t *existing = index_acquire(head_index(s->head), &ls, hash);
    int hrc = HEAD_OK;
    bool created = false, known = true;
    if (existing) {
        ap->refs[i] = index_series_ref(existing);
        index_release(head_index(s->head), existing);
    } else {
        uint64_t id;
        known = index_departed_id(head_index(s->head), hash, &id);
        if (!known)
            id = s->cat ? catalog_next_id(s->cat) : atomic_fetch_add(&s->next_id, 1);
        hrc = head_create(s->head, &ls, hash, id, &ap->refs[i], &created);
    }
    if (hrc != HEAD_OK) {
        if (hrc == HEAD_ERR_LIMIT)
            atomic_fetch_add(&s->rejected_max_series, 1);
        int code = head_to_storage_err(hrc);
        fail(ap->res, i, code, err_text(code), &ls);
        return STORAGE_OK;
    }
    if (created) {
        if (!known && s->cat)
            catalog_add_series_ref(s->cat, ap->refs[i].id, ref_hint(&ap->refs[i]), ap->smp[i].t);
        if (s->wal && append_note_series(ap, ap->refs[i].id, &ls) != STORAGE_OK)
            return STORAGE_ERR_NOMEM;
    }
    *resolved = true;
    /* A series this call just made holds no sample: only the age limit can refuse it (what
     * head_check would find, without its index and stripe locks). Anything else, e.g. another
     * appender's sample landing in between, is caught by the append itself. */
    const storage_sample_t *x = &ap->smp[i];
    if (created && x->t <= ap->max_t && x->t >= head_min_valid_time(s->head)) {
        ap->ok[i] |= APPEND_RESOLVED | APPEND_PASSED;
        ap->ws[ap->nws++] = (wal_sample_t){.series_id = ap->refs[i].id, .t_ms = x->t, .v = x->v};
        return STORAGE_OK;
    }
    append_check(ap, i, &ls, true);
    return STORAGE_OK;
}

/* The per-request series limit, checked before any series is created: a refused request must
 * change nothing (no series in the index, no catalog rows, no share of --storage.max-series).
 * Senders put one series' samples behind one label array, so runs of the same array bound the
 * distinct series from above; only a request over the limit by that count pays for hashing. */
static int append_check_series_limit(append_t *ap)
{
    uint32_t limit = ap->s->o.max_series_per_request;
    if (!limit || ap->n <= limit)
        return STORAGE_OK;
    size_t runs = 0;
    for (size_t i = 0; i < ap->n && runs <= limit; i++)
        runs +=
            i == 0 || ap->smp[i].labels.v != ap->smp[i - 1].labels.v || ap->smp[i].labels.n != ap->smp[i - 1].labels.n;
    if (runs <= limit)
        return STORAGE_OK;
    hashmap_t seen = HASHMAP_INIT_HASHED; /* label hashes of the distinct series (a set) */
    if (hashmap_reserve(&seen, (size_t)limit + 1) < 0)
        return append_fail_all(ap, STORAGE_ERR_NOMEM, "out of memory");
    int rc = STORAGE_OK;
    for (size_t i = 0; i < ap->n; i++) {
        labels_t ls;
        const char *why;
        if (normalize(&ap->smp[i].labels, ap->lbuf, &ls, &why) < 0)
            continue; /* refused on its own later */
        if (hashmap_put(&seen, labels_hash(&ls), 0) == 0 && hashmap_count(&seen) > limit) {
            atomic_fetch_add(&ap->s->rejected_limit, 1);
            rc = append_fail_all(ap, STORAGE_ERR_LIMIT, "request has more than %u series (the limit)", limit);
            break;
        }
    }
    hashmap_free(&seen);
    return rc;
}

/* Step 1 (under ckpt). */
static int append_resolve(append_t *ap)
{
    int lrc = append_check_series_limit(ap);
    if (lrc != STORAGE_OK)
        return lrc;
    /* The caller's refs are checked in one batch (one index lock round per shard); the loop
     * below uses the results in sample order, as if it had checked each in turn (checks change
     * nothing, so the order does not matter). A sample too far ahead is only verified, below. */
    if (ap->hint) {
        size_t m = 0;
        for (size_t i = 0; i < ap->n; i++)
            if (ap->hint[i].id != 0 && ap->smp[i].t <= ap->max_t) {
                ap->refs[i] = ap->hint[i];
                ap->sel[m++] = (uint32_t)i;
            }
        ap->prechecked = head_check_batch(ap->s->head, ap->refs, ap->t, ap->sel, m, ap->hrc) == 0;
    }
    bool resolved_prev = false; /* refs[i - 1] holds the series of smp[i - 1]'s labels */
    for (size_t i = 0; i < ap->n; i++) {
        const storage_sample_t *x = &ap->smp[i];
        /* Senders batch many samples of one series behind one label set (remote write does):
         * when a sample carries the very same labels as the previous one, its series is known. */
        if (i > 0 && resolved_prev && x->labels.v == x[-1].labels.v && x->labels.n == x[-1].labels.n) {
            ap->refs[i] = ap->refs[i - 1];
            append_check(ap, i, &x->labels, true);
            continue;
        }
        /* The caller's ref, if the series is still where it says: the check itself verifies it
         * (same shard read lock as a label lookup); a miss falls through to the labels. */
        if (ap->hint && ap->hint[i].id != 0) {
            ap->refs[i] = ap->hint[i];
            if (append_check(ap, i, &x->labels, false)) {
                resolved_prev = true;
                continue;
            }
        }
        int rc = append_resolve_one(ap, i, &resolved_prev);
        if (rc != STORAGE_OK)
            return rc;
    }
    return STORAGE_OK;
}

/* Step 2 (under ckpt): the new series, then the samples that passed. */
static int append_log(append_t *ap)
{
    storage_t *s = ap->s;
    if (!s->wal)
        return STORAGE_OK;
    char werr[256] = "";
    int wrc = ap->nwser ? wal_log_series(s->wal, ap->wser, ap->nwser, werr, sizeof(werr)) : WAL_OK;
    if (wrc == WAL_OK && ap->nws)
        wrc = wal_log_samples(s->wal, ap->ws, ap->nws, werr, sizeof(werr));
    if (wrc == WAL_OK)
        return STORAGE_OK;
    storage_note_wal_error(s, werr);
    return append_fail_all(ap, STORAGE_ERR_IO, "write-ahead log: %s", werr);
}

/* Step 3 (under ckpt): into the head; rs becomes the samples applied (with roll-ups). */
static void append_apply(append_t *ap)
{
    storage_t *s = ap->s;
    /* One batch: one index lock round per shard (head_append_batch); the results are then taken
     * in sample order. aux[i]: sample i's roll-up hint, compacted into rs order below. */
    size_t m = 0;
    for (size_t i = 0; i < ap->n; i++)
        if (ap->ok[i] & APPEND_PASSED)
            ap->sel[m++] = (uint32_t)i;
    bool batched = head_append_batch(s->head, ap->refs, ap->t, ap->v, ap->sel, m, ap->hrc, ap->aux) == 0;
    ap->nrs = 0;
    for (size_t i = 0; i < ap->n; i++) {
        if (!(ap->ok[i] & APPEND_PASSED))
            continue;
        const storage_sample_t *x = &ap->smp[i];
        index_ref_t *ref = &ap->refs[i];
        void *aux = NULL;
        int hrc = batched ? ap->hrc[i] : head_append_ref_aux(s->head, ref, x->t, x->v, &aux);
        if (batched && ap->aux)
            aux = ap->aux[i];
        /* Swept as empty between creation and now (expiry removes series with no samples):
         * bring it back under the same id; its WAL series record is already logged. A sweep may
         * come between that and the append again (expiry passes back to back), hence a few
         * tries. */
        for (int tries = 0; hrc == HEAD_ERR_NOT_FOUND && tries < 4; tries++) {
            labels_t ls;
            const char *why;
            bool created;
            if (normalize(&x->labels, ap->lbuf, &ls, &why) != 0 ||
                head_get_or_create(s->head, &ls, labels_hash(&ls), ref->id, ref, &created) != HEAD_OK)
                break;
            hrc = head_append_ref_aux(s->head, ref, x->t, x->v, &aux);
        }
        if (hrc != HEAD_OK) {
            /* Lost a race with another appender of this series since the check. */
            int code = hrc == HEAD_ERR_NOT_FOUND ? STORAGE_ERR_NOMEM : head_to_storage_err(hrc);
            fail(ap->res, i, code, err_text(code), &x->labels);
            continue;
        }
        ap->res->accepted++;
        if (ap->rs) {
            /* In place: sel and aux are read at index i >= nrs only, or not any more. */
            ap->rs[ap->nrs] = (rollup_sample_t){.series_id = ref->id, .t = x->t, .v = x->v};
            ap->aux[ap->nrs] = aux;
            ap->sel[ap->nrs++] = (uint32_t)i;
        }
    }
}

/* Step 4 (outside ckpt): the applied samples into the open roll-up buckets. Each head series
 * keeps the roll-up's hint for it (head_set_aux), so a known series' roll-up state is found
 * without a hash lookup; the hints are stored back only where the roll-up changed one (a new
 * series, or a state evicted and made again). A series that left the head meanwhile is simply
 * not found: its slot went with it, nothing dangles. */
static void append_rollup(append_t *ap)
{
    if (!ap->rs || !ap->nrs)
        return;
    memcpy(ap->aux0, ap->aux, ap->nrs * sizeof(void *));
    rollup_add_samples_hinted(ap->s->rollup, ap->rs, ap->nrs, ap->aux);
    for (size_t j = 0; j < ap->nrs; j++)
        if (ap->aux[j] != ap->aux0[j])
            head_set_aux(ap->s->head, &ap->refs[ap->sel[j]], ap->aux[j]);
}

int storage_append(storage_t *s, const storage_sample_t *smp, size_t n, storage_append_result_t *res)
{
    return storage_append_refs(s, smp, n, NULL, res);
}

/* A deferred roll-up step: the append's state (its roll-up samples, hints and refs) and its
 * place in line. Jobs are numbered as their appends finish (under the caller's lock, so in its
 * order) and run in that order (rj_turn). */
struct storage_rollup_job {
    append_t ap;
    uint64_t ticket;
};

static int append_refs(storage_t *s, const storage_sample_t *smp, size_t n, storage_ref_t *refs,
                       storage_append_result_t *res, storage_rollup_job_t **job);

int storage_append_refs(storage_t *s, const storage_sample_t *smp, size_t n, storage_ref_t *refs,
                        storage_append_result_t *res)
{
    return append_refs(s, smp, n, refs, res, NULL);
}

int storage_append_refs_defer(storage_t *s, const storage_sample_t *smp, size_t n, storage_ref_t *refs,
                              storage_append_result_t *res, storage_rollup_job_t **job)
{
    *job = NULL;
    return append_refs(s, smp, n, refs, res, job);
}

void storage_append_rollups(storage_t *s, storage_rollup_job_t *job)
{
    if (!job)
        return;
    pthread_mutex_lock(&s->rj_mu);
    while (s->rj_turn != job->ticket)
        pthread_cond_wait(&s->rj_cv, &s->rj_mu);
    pthread_mutex_unlock(&s->rj_mu);
    append_rollup(&job->ap);
    pthread_mutex_lock(&s->rj_mu);
    s->rj_turn++;
    pthread_cond_broadcast(&s->rj_cv);
    pthread_mutex_unlock(&s->rj_mu);
    append_free(&job->ap);
    free(job);
}

/* What refuses a request before anything is looked at: clears res, fills it on a refusal. */
static int append_admit(storage_t *s, size_t n, storage_append_result_t *res)
{
    memset(res, 0, sizeof(*res));
    if (!storage_ready(s)) {
        snprintf(res->msg, sizeof(res->msg), "storage is still recovering");
        res->failed = n;
        res->first_error = STORAGE_ERR_NOT_READY;
        return STORAGE_ERR_NOT_READY;
    }
    if (s->o.max_samples_per_request && n > s->o.max_samples_per_request) {
        atomic_fetch_add(&s->rejected_limit, 1);
        snprintf(res->msg, sizeof(res->msg), "request has %zu samples, more than the limit of %u", n,
                 s->o.max_samples_per_request);
        res->failed = n;
        res->first_error = STORAGE_ERR_LIMIT;
        return STORAGE_ERR_LIMIT;
    }
    return STORAGE_OK;
}

static uint64_t prepare_next_id(void *ud)
{
    storage_t *s = ud;
    return s->cat ? catalog_next_id(s->cat) : atomic_fetch_add(&s->next_id, 1);
}

/* Lookups that miss in a row before prepare_resolve takes the samples that follow for new series
 * (a new group's first push: all of them are) and leaves finding them to head_create_many, which
 * finds one that exists all the same, only at a higher price (its symbols and label pairs are
 * taken and given back); every PREPARE_PROBE-th still looks first, so a body that turns back to
 * known series is noticed. The lookup skipped is a hash probe that misses the cache, per series. */
#define PREPARE_MISS_STREAK 8
#define PREPARE_PROBE 32

/* storage_prepare_refs under ckpt: the series of refs[i] == 0 looked up, the missing ones created
 * in one head_create_many and noted for the catalog (one lock round) and the WAL's series record. */
static int prepare_resolve(append_t *ap, storage_ref_t *refs)
{
    storage_t *s = ap->s;
    const storage_sample_t *smp = ap->smp;
    size_t n = ap->n, m = 0, misses = 0;
    index_create_t *items = arena_try_alloc(ap->a, n * sizeof(*items));
    labels_t *lsv = arena_try_alloc(ap->a, n * sizeof(*lsv));
    uint32_t *of = arena_try_alloc(ap->a, n * sizeof(*of)); /* item -> sample */
    catalog_ref_t *cr = s->cat ? arena_try_alloc(ap->a, n * sizeof(*cr)) : NULL;
    if (!items || !lsv || !of || (s->cat && !cr))
        return STORAGE_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        if (refs[i].id != 0 ||
            (i > 0 && smp[i].labels.v == smp[i - 1].labels.v && smp[i].labels.n == smp[i - 1].labels.n))
            continue; /* a label array repeated is the previous sample's series (filled below) */
        labels_t ls;
        const char *why;
        if (normalize(&smp[i].labels, ap->lbuf, &ls, &why) < 0)
            continue; /* the append refuses it (and counts it) */
        if (ls.v == ap->lbuf) {
            label_t *v = arena_try_alloc(ap->a, ls.n * sizeof(*v));
            if (!v)
                return STORAGE_ERR_NOMEM;
            memcpy(v, ls.v, ls.n * sizeof(*v));
            ls.v = v;
        }
        uint64_t hash = labels_hash(&ls);
        bool look = misses < PREPARE_MISS_STREAK || misses % PREPARE_PROBE == 0;
        index_series_t *existing = look ? index_acquire(head_index(s->head), &ls, hash) : NULL;
        if (existing) {
            refs[i] = index_series_ref(existing);
            index_release(head_index(s->head), existing);
            misses = 0;
            continue;
        }
        misses++;
        lsv[m] = ls;
        items[m] = (index_create_t){.labels = &lsv[m], .hash = hash};
        of[m++] = (uint32_t)i;
    }
    if (!m)
        goto repeats;
    if (head_create_many(s->head, items, m, prepare_next_id, s) != HEAD_OK)
        return STORAGE_ERR_NOMEM;
    size_t ncr = 0;
    for (size_t j = 0; j < m; j++) {
        if (items[j].rc != INDEX_OK)
            continue; /* over --storage.max-series or out of memory: the append meets it again */
        size_t i = of[j];
        refs[i] = items[j].ref;
        if (items[j].made == INDEX_MADE_NONE)
            continue;
        /* A series that returns under its departed id has its catalog row already. */
        if (items[j].made == INDEX_MADE_NEW && cr)
            cr[ncr++] = (catalog_ref_t){.id = items[j].ref.id, .hint = ref_hint(&items[j].ref), .t = smp[i].t};
        if (s->wal && append_note_series(ap, items[j].ref.id, &lsv[j]) != STORAGE_OK)
            return STORAGE_ERR_NOMEM;
    }
    if (ncr && catalog_add_series_refs(s->cat, cr, ncr) < 0)
        return STORAGE_ERR_NOMEM;
repeats:
    for (size_t i = 1; i < n; i++)
        if (refs[i].id == 0 && refs[i - 1].id != 0 && smp[i].labels.v == smp[i - 1].labels.v &&
            smp[i].labels.n == smp[i - 1].labels.n)
            refs[i] = refs[i - 1];
    return STORAGE_OK;
}

int storage_prepare_refs(storage_t *s, const storage_sample_t *smp, size_t n, storage_ref_t *refs)
{
    storage_append_result_t res;
    int rc = append_admit(s, n, &res);
    if (rc != STORAGE_OK)
        return rc;
    append_t ap;
    rc = append_init(&ap, s, smp, n, &res);
    if (rc == STORAGE_OK) {
        /* Under ckpt, as an append's resolve and log are: a snapshot's cut sees the series made
         * here either in the head it writes or in the WAL after the cut. */
        pthread_rwlock_rdlock(&s->ckpt);
        rc = append_check_series_limit(&ap);
        if (rc == STORAGE_OK)
            rc = prepare_resolve(&ap, refs);
        if (rc == STORAGE_OK)
            rc = append_log(&ap); /* the new series' record; no sample */
        pthread_rwlock_unlock(&s->ckpt);
    }
    append_free(&ap);
    return rc;
}

static int append_refs(storage_t *s, const storage_sample_t *smp, size_t n, storage_ref_t *refs,
                       storage_append_result_t *res, storage_rollup_job_t **job)
{
    storage_append_result_t local;
    if (!res)
        res = &local;
    int arc = append_admit(s, n, res);
    if (arc != STORAGE_OK)
        return arc;
    /* A deferred roll-up step keeps the append's state until it runs: on the heap then. */
    storage_rollup_job_t *jb = job && s->rollup ? malloc(sizeof(*jb)) : NULL;
    append_t aplocal, *ap = jb ? &jb->ap : &aplocal;
    int rc = append_init(ap, s, smp, n, res);
    ap->hint = refs;
    bool deferred = false;
    if (rc == STORAGE_OK) {
        pthread_rwlock_rdlock(&s->ckpt);
        rc = append_resolve(ap);
        if (rc == STORAGE_OK)
            rc = append_log(ap);
        if (rc == STORAGE_OK) {
            append_apply(ap);
            /* The roll-up step, or its ticket, still under ckpt: a snapshot's WAL cut then knows
             * every roll-up step of the records before it is done or numbered (storage_snapshot
             * waits for those before it checkpoints the roll-ups). */
            if (jb && ap->rs && ap->nrs) {
                pthread_mutex_lock(&s->rj_mu);
                jb->ticket = s->rj_next++;
                pthread_mutex_unlock(&s->rj_mu);
                *job = jb;
                deferred = true;
            } else {
                append_rollup(ap);
            }
            rc = res->failed ? res->first_error : STORAGE_OK;
        }
        pthread_rwlock_unlock(&s->ckpt);
    }
    for (size_t i = 0; refs && i < n; i++)
        refs[i] = ap->ok && (ap->ok[i] & APPEND_RESOLVED) ? ap->refs[i] : (storage_ref_t){0};
    if (!deferred) {
        append_free(ap);
        free(jb);
    }
    return rc;
}

/* ---- reading ------------------------------------------------------------------------------- */

static int64_t querier_now(void *ud)
{
    return storage_now_ms(ud);
}

querier_t *storage_querier(storage_t *s)
{
    querier_tiered_opts_t o = {.head = s->head, .rollup = s->rollup, .cat = s->cat, .now_ms = querier_now, .ud = s};
    return querier_tiered_new(&o);
}

/* ---- fall-through ---------------------------------------------------------------------------- */

void storage_set_fallthrough(storage_t *s, const storage_fallthrough_t *ft)
{
    if (ft)
        s->ft = *ft;
    else
        memset(&s->ft, 0, sizeof(s->ft));
}

int64_t storage_min_time(storage_t *s)
{
    head_stats_t hs;
    head_get_stats(s->head, &hs);
    int64_t m = hs.min_t;
    if (!s->rollup || !s->cat)
        return m;
    const rollup_resolutions_t *rs = rollup_resolutions(s->rollup);
    int64_t longest = 0;
    for (size_t i = 0; i < rs->n; i++)
        if (rs->v[i].retention_ms > longest)
            longest = rs->v[i].retention_ms;
    int64_t now = storage_now_ms(s);
    pthread_mutex_lock(&s->min_lock);
    if (!s->min_rollup_valid || now - s->min_rollup_at >= STORAGE_MIN_TIME_CACHE_MS || now < s->min_rollup_at) {
        int64_t r;
        if (catalog_min_first_seen(s->cat, now - longest, &r) == 0) {
            s->min_rollup_t = r;
            s->min_rollup_at = now;
            s->min_rollup_valid = true;
        }
    }
    int64_t r = s->min_rollup_valid ? s->min_rollup_t : INT64_MAX;
    pthread_mutex_unlock(&s->min_lock);
    return r < m ? r : m;
}

querier_t *storage_querier_fallthrough(storage_t *s)
{
    querier_t *local = storage_querier(s);
    if (!local || !s->ft.open)
        return local;
    querier_t *remote = s->ft.open(s->ft.ud);
    if (!remote) {
        querier_close(local);
        return NULL;
    }
    querier_fallthrough_opts_t o = {
        .local = local, .remote = remote, .local_min = storage_min_time(s), .read_recent = s->ft.read_recent};
    return querier_fallthrough_new(&o);
}

/* ---- statistics ---------------------------------------------------------------------------- */

int storage_tsdb_stats(storage_t *s, size_t top, arena_t *a, storage_tsdb_stats_t *out)
{
    head_get_stats(s->head, &out->head);
    return index_stats(head_index(s->head), top, a, &out->index) == INDEX_OK ? STORAGE_OK : STORAGE_ERR_NOMEM;
}

static void metric(buf_t *b, const char *name, const char *type, const char *help, double v)
{
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s ", name, help, name, type, name);
    buf_put_float(b, v);
    buf_putc(b, '\n');
}

void storage_write_metrics(storage_t *s, buf_t *b)
{
    head_stats_t h;
    head_get_stats(s->head, &h);
    metric(b, "sluice_storage_head_series", "gauge", "Series held in memory.", (double)h.series);
    metric(b, "sluice_storage_head_chunks", "gauge", "Chunks held in memory.", (double)h.chunks);
    metric(b, "sluice_storage_head_chunk_bytes", "gauge", "Bytes of encoded chunk data in memory.",
           (double)h.chunk_bytes);
    metric(b, "sluice_storage_head_memory_bytes", "gauge", "Estimated heap bytes of index and chunks.",
           (double)h.memory_bytes);
    metric(b, "sluice_storage_head_min_time_seconds", "gauge", "Oldest sample time in memory.",
           h.series ? (double)h.min_t / 1000.0 : 0);
    metric(b, "sluice_storage_head_max_time_seconds", "gauge", "Newest sample time in memory.",
           h.series ? (double)h.max_t / 1000.0 : 0);
    metric(b, "sluice_storage_samples_appended_total", "counter", "Samples appended.", (double)h.samples_appended);
    metric(b, "sluice_storage_samples_replaced_total", "counter", "Samples replaced by a later one in the same second.",
           (double)h.samples_replaced);
    metric(b, "sluice_storage_out_of_order_samples_total", "counter", "Samples refused as out of order.",
           (double)h.out_of_order);
    metric(b, "sluice_storage_too_old_samples_total", "counter", "Samples refused as older than raw retention.",
           (double)h.too_old);
    metric(b, "sluice_storage_series_created_total", "counter", "Series created in memory.", (double)h.series_created);
    metric(b, "sluice_storage_series_removed_total", "counter", "Series removed from memory (no samples left).",
           (double)h.series_removed);
    metric(b, "sluice_storage_rejected_max_series_total", "counter", "Samples refused by the series limit.",
           (double)atomic_load(&s->rejected_max_series));
    metric(b, "sluice_storage_rejected_requests_limit_total", "counter", "Requests refused by per-request limits.",
           (double)atomic_load(&s->rejected_limit));
    metric(b, "sluice_storage_rejected_bad_labels_total", "counter", "Samples refused for invalid labels.",
           (double)atomic_load(&s->rejected_labels));
    metric(b, "sluice_storage_wal_errors_total", "counter", "Appends that failed to reach the WAL.",
           (double)atomic_load(&s->wal_errors));
    metric(b, "sluice_storage_snapshots_total", "counter", "Snapshots written.", (double)atomic_load(&s->snapshots));
    metric(b, "sluice_storage_snapshot_errors_total", "counter", "Snapshots that failed.",
           (double)atomic_load(&s->snapshot_errors));
    metric(b, "sluice_storage_snapshot_duration_seconds", "gauge", "Duration of the last snapshot.",
           (double)atomic_load(&s->last_snapshot_duration_ms) / 1000.0);
    metric(b, "sluice_storage_ready", "gauge", "1 once recovery is complete.", storage_ready(s) ? 1 : 0);
    metric(b, "sluice_storage_state_records_logged_total", "counter",
           "State deltas of other subsystems logged to the WAL.", (double)atomic_load(&s->state_logged));
    metric(b, "sluice_storage_state_restore_errors_total", "counter", "State records a client refused at recovery.",
           (double)atomic_load(&s->state_restore_errors));
    if (s->wal) {
        wal_stats_t w;
        wal_get_stats(s->wal, &w);
        metric(b, "sluice_storage_wal_records_total", "counter", "WAL records written.", (double)w.records_written);
        metric(b, "sluice_storage_wal_bytes_total", "counter", "WAL bytes written.", (double)w.bytes_written);
        metric(b, "sluice_storage_wal_fsyncs_total", "counter", "WAL fsyncs.", (double)w.fsyncs);
        metric(b, "sluice_storage_wal_fsync_duration_seconds_total", "counter", "Time spent in WAL fsyncs.",
               (double)w.fsync_duration_ns / 1e9);
        metric(b, "sluice_storage_wal_segment_current", "gauge", "Number of the WAL segment being written.",
               (double)w.segment_current);
        metric(b, "sluice_storage_wal_buffer_bytes", "gauge", "Memory of the WAL's two batch buffers.",
               (double)w.buffer_bytes);
    }
    if (s->rollup) {
        rollup_stats_t r;
        rollup_get_stats(s->rollup, &r);
        metric(b, "sluice_storage_rollup_series", "gauge", "Series with open roll-up buckets.", (double)r.series);
        metric(b, "sluice_storage_rollup_buckets_written_total", "counter", "Roll-up buckets written.",
               (double)r.buckets_written);
        metric(b, "sluice_storage_rollup_flush_errors_total", "counter", "Roll-up writer errors.",
               (double)r.flush_errors);
    }
}
