/*
 * rollup — fixed-resolution aggregates of every series, kept in SQLite for long retentions.
 *
 * ---- Life of a sample -------------------------------------------------------------------------
 *
 *   ingest thread                        writer thread (only SQLite writer)
 *   rollup_add_samples                   every flush interval (rollup_flush), one transaction:
 *     shard lock (shard_of(id))            1. catalog rows; per shard: close open buckets whose
 *     state = per-series record               series went quiet (the due heap: see below)
 *     update open bucket per resolution    2. per shard: move its closed list to `inflight` and
 *     bucket start moved on?                  snapshot the states that changed (a copy of the
 *       -> push old bucket on the shard's     closed list, sorted outside the shard lock, becomes
 *          closed list                        its `inflight` and leaves the closed list in one
 *                                             step); the shard's state rows, last_seen
 *                                          3. every shard's inflight buckets merged into blobs /
 *                                             plain rows, in key order
 *                                          4. COMMIT and forget `inflight` in one step w.r.t.
 *                                             readers (view lock held exclusively)
 *                                          5. a database from before 1h blobs: copy a few
 *                                             series' old 1h rows into blobs (migrate_step)
 *                                          A backlog of catalog rows (a burst of new series) is
 *                                          written 8,192 rows per cycle, 5 ms apart (50 ms
 *                                          while the burst goes on), and those
 *                                          cycles stop after step 1: buckets never reach disk
 *                                          before their series' rows (rollup__flush_some).
 *
 * A reader (rollup_read) holds the view lock shared while it reads the disk and, under one hold
 * of the shard lock, the shard's inflight and closed lists and the open bucket, so every bucket
 * is seen exactly once: the writer moves buckets from closed to inflight under the shard lock,
 * and from inflight to disk under the exclusive view lock. Only the COMMIT holds that: sorting a
 * bulk load's millions of closed buckets (seconds) used to, and stalled every history query.
 * A state links its closed buckets (closed_last, then closed_t.prev), so a reader finds a
 * series' few among the shard's (after a bulk load, hundreds of thousands) without a scan. The
 * links are positions that do not change when the writer takes the front of the list (see
 * closed_index): a take renumbers nothing.
 * Buckets with the same ts from several places (a late sample re-opened an already written
 * bucket) are merged.
 *
 * ---- The writer's sweep: only what is due ------------------------------------------------------
 * Each cycle the writer commits pending samples and closes buckets that end a full resolution
 * before the newest sample seen (hw), and evicts states with nothing open whose newest sample is
 * older than the coarsest resolution. Walking every state for that (256k states, 64 shard locks,
 * every second) was ~40 % of sluice's CPU at the real push cadence, and most of each shard
 * lock's hold. Instead each shard keeps a min-heap with one entry per state: the hw from which
 * the sweep may have something to do for it (state_wake), or earlier. A cycle pops the entries
 * up to hw, sweeps those states and gives them their real wake. At 10 s pushes a series' 1m
 * bucket is closed by its next sample, so its entry is early: one pop per series per minute.
 * The wake only moves forward while samples keep coming, except when a sample arrives for a
 * state without a pending one (new, or idle since the sweep committed it): add_one then brings
 * its entry forward. The heap's positions live in the states (duepos), so eviction removes the
 * entry and the heap never holds stale entries. The snapshot of states that closed a bucket
 * finds them through the closed list, which the writer walks anyway; only a checkpoint walks
 * every state.
 *
 * ---- Readers: one transaction for many series --------------------------------------------------
 * A rollup_reader_t owns a pooled read connection and keeps ONE SQLite read transaction open
 * across its reads (a query reads thousands of series; a transaction each cost two fcntl locks
 * and a WAL-index check per series). Its snapshot is only valid together with the `inflight` it
 * was taken with: the writer's COMMIT moves buckets from inflight to disk, so a snapshot from
 * before it would miss them. The writer bumps disk_gen under the exclusive view lock at that
 * COMMIT; a reader compares, under the shared view lock, the generation its transaction began
 * in and begins a new one when it changed (the snapshot is taken by the first SELECT, which runs
 * under the same shared lock). Retention needs no bump: readers skip what it deletes by
 * ret_cutoff, whichever snapshot they hold.
 *
 * ---- Knowing a series has no history -------------------------------------------------------------
 * A query over 30 days reads every matching series, and most active series are young: their
 * disk holds nothing in range. Each in-memory state may know disk_lo, per resolution a lower
 * bound of the ts of every stored bucket. A reader that found nothing on disk for a series with
 * a state learns it (the first bucket of the oldest blob per resolution, in its snapshot, and the
 * series' inflight buckets, under the shard lock; not while the writer sorts a take of that
 * shard's closed list); the writer lowers it for every closed bucket it takes (step 2, shard
 * lock), so it stays a bound; retention only raises the truth; a state created afresh (new, or
 * after eviction) knows nothing. A read over [mint, maxt] with maxt < disk_lo then skips SQLite.
 * Not used while 1h buckets still live in rows (blob_from != INT64_MIN: the migration adds older
 * blobs).
 *
 * ---- Per-series state --------------------------------------------------------------------------
 * last_t (newest aggregated sample t; samples in its second or earlier are ignored, which makes
 * WAL replay harmless), the pending sample (the newest one, held back until a later second
 * arrives or its bucket closes, so a same-second replacement replaces it instead of being
 * aggregated as a second sample; readers see it as if aggregated; checkpointed as an open-bucket
 * entry with res_ms 0, ts = t, last = value), prev/prev_ok (last non-NaN value, for the counter increase; a staleness marker
 * clears prev_ok), and one open bucket per resolution. A state whose buckets are all closed is
 * evicted from memory (its continuity is lost: a series silent for more than ~2 of the coarsest
 * resolution starts its increase afresh). States are checkpointed to rollup_state whenever one of
 * their buckets is written (so a checkpointed open bucket is never also on disk; at the real
 * cadence, every minute), every checkpoint interval (5 minutes), when the store snapshots its head
 * (recovery replays the WAL from that snapshot's cut, and the roll-ups take from it only what is
 * newer than their states), and at close; rollup_open loads them back. The interval was 60 s:
 * that rewrote every active series' state row a second time each minute.
 *
 * ---- Tables ----------------------------------------------------------------------------------
 *   rollup_blob(id, res, series_id, start, n, data)  unique index (res, series_id, start), index
 *       (res, start). Every resolution: one row per series per span of buckets, BLOB_SPAN (240;
 *       1m: 4 h) or, for 1h, HOUR_BLOB_SPAN (720: 30 days, so a month of one series is one or two
 *       blobs, one seek and one decode), data encoded as below. A rowid table, not WITHOUT ROWID:
 *       its leaves hold blobs up to ~4 KB in place, where an index b-tree spills anything over
 *       ~1 KB to a mostly empty overflow page (docs/storage-rollups.md has the measurements).
 *   rollup_recent(res, series_id, start, n, data)  PK (res, series_id, start), WITHOUT ROWID
 *       the buckets of a span written since its rollup_blob row was last rewritten (same key,
 *       same encoding, never deflated); a read merges the two, the recent row's buckets being the
 *       later ones. A closed bucket goes into the small recent row; about every FOLD_SLOTS
 *       buckets (and at the span's last slot) the recent row is folded into the blob and deleted.
 *       Rewriting the span's blob for every closed bucket, as before, cost in proportion to how
 *       full the span was, a cost no short benchmark saw: at the real cadence every series
 *       re-encoded ~120 buckets a minute on average to add one, 240 at the end of a 4-hour span
 *       (storage_bench's writer section, scaled to 256k series: 13 s of CPU and 361 MiB written
 *       per minute on average, 23 s and 703 MiB at a span's end; with recent rows 2.0 s and
 *       134 MiB). The fold time is staggered by id run (fold_due), so a minute rewrites
 *       1/FOLD_SLOTS of the blobs, neighbours on disk.
 *   rollup_plain(res, series_id, ts, count, sum, min, max, last, increase)  PK (res, series_id, ts)
 *       the 1h resolution again, one plain row per bucket, written in the same transaction as
 *       its blob, so the rollup_1h view needs no decoder; reads use the blobs. SQLite stores NaN
 *       as NULL: sum/min/max/last NULL = NaN. A database from before 1h blobs has 1h buckets in
 *       rows only; those before meta 'rollup_1h_blob_from' are read from here (setup_blob_from)
 *       until the writer has copied them into blobs (migrate_step).
 *   rollup_state(series_id PRIMARY KEY, last_t, prev, prev_ok, open)
 *       open = the open buckets (and the pending sample, res_ms 0: ts, count 1, last), compact:
 *       | 1 byte  | 0xC5                                                                      |
 *       per entry:
 *       | uvarint | res_ms                                                                    |
 *       | uvarint | ts, zigzag delta from the previous entry's ts (first: from 0)             |
 *       | uvarint | count                                                                     |
 *       | uvarint | modes: 2 bits per value below, lowest first                               |
 *       | 5 values| last, max, min, sum, increase: x = bits(v) XOR bits(previous value; first |
 *       |         | 0); mode 0: uvarint of bswap64(x), 1: uvarint of x, 2: x in 8 bytes LE    |
 *       Rows written before it hold 64 bytes little-endian per entry instead (res_ms i64, ts
 *       i64, count u64, sum, min, max, last, increase f64), whose first byte is never 0xC5
 *       (res_ms is 0 or a multiple of 1000); both are read. The compact rows are ~100 bytes
 *       instead of ~230: every active series' row is rewritten about twice a minute (when its
 *       minute closes, and at the checkpoint), so this is most of the writer's disk traffic.
 *   VIEW rollup_1h(series_id, metric, labels, ts, count, sum, min, max, last, increase)
 *
 * ---- Blob format (rollup_blob.data) ------------------------------------------------------------
 *   | 1 byte  | format: 1 = payload follows raw (always for 1h), 2 = zlib stream of it   |
 *   | uvarint | format 2 only: payload length (<= MAX_PAYLOAD)                            |
 *   payload:
 *   | uvarint      | n, number of buckets (1..span)                                       |
 *   | n uvarints   | bucket slot: first = (ts - start) / res, then gap to previous - 1    |
 *   | n uvarints   | count, zigzag delta from the previous count (first from 0)           |
 *   | 5 columns    | sum, min, max, last, increase, each:                                 |
 *   |   1 byte     |   mode 0: decimals - then 1 byte d (0..6) and n zigzag uvarints of   |
 *   |              |           v*10^d as an integer, delta from the previous (from 0)     |
 *   |              |   mode 1: floats - n uvarints of bswap64(bits XOR previous bits)     |
 *   |              |   mode 2: near-decimals - 1 byte d, then per value the mode 0 uvarint |
 *   |              |           and a uvarint of bits(v) XOR bits(xi/10^d)               |
 * Mode 0 is possible when every value of the column is exactly xi/10^d (checked bit for bit,
 * |xi| < 2^53, no -0): counters, most Flink gauges, values printed with a few decimals. Mode 1
 * keeps constant or slowly moving floats short (a repeated value costs one byte; byte-swapping
 * puts the mantissa's trailing zero bytes at the high end, where uvarint drops them). The
 * Mode 2 catches sums of such values, which are a few ULPs off a decimal. The encoder writes the
 * candidates and keeps the shortest; zlib then squeezes the runs.
 *
 * ---- Aggregation rules: see rollup.h.
 */
#include "storage/rollup.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "internal/util/buf.h"
#include "internal/util/clock.h"
#include "internal/util/slab.h"
#include "internal/util/log.h"
#include "internal/util/endian.h"
#include "internal/util/varint.h"
#include "internal/util/parse.h"

#define SHARDS 64
#define BLOB_SPAN 240      /* buckets per blob, every resolution but 1h (1m: 4 h) */
#define FOLD_SLOTS 16      /* a span's recent row is folded into its blob about this often */
#define HOUR_BLOB_SPAN 720 /* 1h: 30 days per blob, so a month of one series is one or two blobs */
#define PLAIN_RES_MS 3600000
#define META_BLOB_FROM "rollup_1h_blob_from"
#define MAX_PAYLOAD (1u << 20)
#define STATE_ENTRY_BYTES 64 /* an entry of the first rollup_state.open layout */
#define STATE_COMPACT 0xC5u  /* first byte of the compact layout; never one of the first */
#define STATE_COMPACT_MAX (3 * VARINT_MAX + 2 + 5 * VARINT_MAX)
#define STATE_OPEN_MAX (1 + (ROLLUP_MAX_RESOLUTIONS + 1) * STATE_COMPACT_MAX)
#define PENDING_RES_MS 0 /* a rollup_state.open entry holding the pending sample (ts, last) */
#define NO_BUCKET INT64_MIN
#define STALE_NAN_BITS 0x7ff0000000000002ull
#define RETENTION_PASS_MS 3600000
#define RETENTION_BUDGET 256

/* ---- types ------------------------------------------------------------------------------ */

/* zlib streams and scratch buffers kept from one blob to the next. deflateInit allocates ~270 KB
 * (and inflateInit ~40 KB) every time, and glibc hands such blocks back to the kernel on free
 * (a brk shrink and a TLB shootdown on every core): with a fresh stream per blob, that was most of
 * the writer's time. One codec per thread role, used under the lock that role holds. */
typedef struct {
    z_stream def, inf;
    bool def_ok, inf_ok;
    buf_t payload, cand, best; /* encoder scratch */
    uint8_t *raw;              /* decoder scratch: the inflated payload */
    size_t rawcap;
} codec_t;

/* A state's open bucket of one resolution: a rollup_bucket_t without `last`, which every open
 * bucket of a state shares (each aggregated the state's newest sample: commit_pending adds a
 * sample to every resolution, and a bucket only leaves by closing), and without `ts`, which is
 * the one of last_t (commit_pending closes a bucket of another period before last_t moves on:
 * see open_ts), with a 32-bit count (at most one sample per second is aggregated: 136 years of
 * seconds; 0: none open), and the resolution's disk_lo. */
typedef struct {
    double sum, min, max, increase;
    uint32_t count;
    /* Every bucket stored for the series at this resolution has ts >= disk_lo * res (INT32_MAX:
     * none stored), valid while disk_known; see disk_lo_get. */
    int32_t disk_lo;
} sbucket_t;

/* 64 bytes + 40 per resolution (144 with the default two), from the shard's slab: no allocator
 * header or size-class rounding (it was 184 bytes in a 192-byte malloc chunk). */
typedef struct sstate {
    struct sstate *next; /* hash chain */
    uint64_t id;
    int64_t last_t;
    double prev;
    int64_t pend_t;
    double pend_v;
    double last; /* the `last` of every open bucket */
    bool prev_ok : 1;
    bool dirty : 1;  /* changed since its last checkpoint */
    bool closed : 1; /* a bucket went to the closed list since the last snapshot */
    bool pend : 1;   /* pend_t/pend_v: the newest sample, not aggregated yet (see add_one) */
    /* disk_lo is known (see "Knowing a series has no history" above) */
    bool disk_known : 1;
    bool live : 1; /* not freed: a hint (rollup_add_samples_hinted) may point at a freed record */
    /* Its series' catalog row says CATALOG_SEEN_OPEN (written by a committed cycle), so its
     * snapshots need not touch the series table (see write_snaps). */
    bool seen_open : 1;
    /* Its entry in the shard's due heap (see "The writer's sweep"), DUE_NONE: none. Fits the
     * padding before closed_last: the record stays 64 bytes + the open buckets. */
    unsigned duepos : 24;
    /* Its newest entry in the shard's closed list, as a position (see closed_index); may be
     * stale (taken by the writer since) */
    uint32_t closed_last;
    sbucket_t open[]; /* one per resolution */
} sstate_t;

_Static_assert(sizeof(sstate_t) == 64, "sstate_t grew: the slab record and its cache lines with it");

#define CLOSED_NONE UINT32_MAX
#define DUE_NONE 0xffffffu

/* An entry of a shard's due heap: a state and the high-water mark from which the writer's sweep
 * may have something to do for it (key <= that time; see state_wake). */
typedef struct {
    int64_t key;
    struct sstate *s;
} due_t;

typedef struct {
    uint64_t id;
    uint32_t res_idx;
    uint32_t seq;  /* order of arrival in its shard (a series' buckets are all in one), so merging
                    * keeps the later `last` */
    uint32_t prev; /* in a shard's closed list: the series' previous entry there, or CLOSED_NONE */
    rollup_bucket_t b;
} closed_t;

typedef struct {
    closed_t *v;
    size_t n, cap;
} closed_vec_t;

typedef struct {
    pthread_mutex_t mu;
    sstate_t **tab;
    size_t nbuckets, count;
    /* No state here has a larger id (every state is made by state_get). Ids of new series come
     * from the catalog's counter, above every id seen before, so a new series' first sample
     * skips the chain walk that would only miss (a push of 1,282 new series walked 1,282). */
    uint64_t max_id;
    /* Min-heap by key of every state of the shard (each at s->duepos), unless due_lost. */
    due_t *due;
    size_t ndue, capdue;
    bool due_lost; /* a state has no entry (out of memory, a new shard): sweep all and rebuild */
    bool snap_all; /* a state's closed flag is set without a closed-list entry (out of memory) */
    closed_vec_t closed;   /* buckets not taken by the writer yet (arrival order) */
    uint32_t closed_base;  /* position of closed.v[0]: positions count every bucket ever listed */
    closed_vec_t inflight; /* sorted by (id, res_idx, ts, seq), waiting for the writer's COMMIT */
    bool taking;           /* the writer sorts a take of the closed list (see shard_take_in) */
    bool orphans;          /* ... which holds buckets of states it evicted, linked from none */
    slab_t states;         /* the shard's sstate_t records */
    /* closed_t.seq of the next bucket closed here: under the shard lock, not one atomic counter
     * for all shards (every series closes a bucket per minute, all at once: ingest threads
     * bounced that counter's cache line between them) */
    uint32_t seq;
} shard_t;

/* Snapshots for the state table are verbatim copies of the states (state_bytes each, in one
 * buffer: rollup_t.snaps), encoded into rows only when written. Evicted states are r->evicted:
 * their rows are deleted and their series' last_seen closed at their newest sample. */
typedef struct {
    uint64_t id;
    int64_t seen_t;
} evicted_t;

/* A read connection with its statements and decoder; owned by one reader at a time, kept in the
 * pool (rollup_t.idle) between readers so its prepared statements are reused. */
typedef struct rconn {
    struct rconn *next;
    sqlite3 *db;
    sqlite3_stmt *blob, *recent, *plain;
    codec_t codec;
} rconn_t;

struct rollup_reader {
    rollup_t *r;
    rconn_t *c;
    rollup_buckets_t scratch; /* reader_disk_lo's decoded blob; read_disk's recent buckets */
    rollup_buckets_t merged;  /* read_disk: blobs and recent rows merged */
    bool txn;                 /* BEGIN issued; the snapshot is the one of disk_gen == gen */
    uint64_t gen;             /* r->disk_gen when the transaction began */
};

struct rollup {
    catalog_t *cat;
    rollup_resolutions_t rs;
    int64_t flush_ms, ckpt_ms;
    int64_t (*clock_ms)(void); /* retention `now`; NULL = wall clock */
    pthread_mutex_t pool_mu;   /* idle, nidle */
    rconn_t *idle;
    size_t nidle;
    /* Bumped (view lock held exclusively) whenever a commit changes what readers must see on disk
     * together with memory: the writer cycle's COMMIT (inflight forgotten), the end of the 1h
     * migration. A reader whose transaction began in an older generation starts a new one. */
    _Atomic uint64_t disk_gen;
    codec_t wcodec; /* the writer cycle and retention (cycle_mu) */
    /* 1h buckets with ts < blob_from are read from rollup_plain (written before 1h blobs existed,
     * see setup_blob_from) until the migration (migrate_step) has copied them into blobs; from
     * blob_from on, both hold them. INT64_MIN for a database made with blobs, or migrated. */
    _Atomic int64_t blob_from;
    uint64_t mig_cursor; /* migrate_step: next series id (writer, cycle_mu) */
    /* Per resolution, the cutoff of the latest retention pass: reads skip older buckets. */
    _Atomic int64_t ret_cutoff[ROLLUP_MAX_RESOLUTIONS];
    pthread_mutex_t cycle_mu; /* one writer cycle at a time */
    pthread_rwlock_t view_rw; /* readers shared; the COMMIT that moves inflight to disk exclusive */
    shard_t shards[SHARDS];
    unsigned char *snaps; /* nsnaps copies of states, state_bytes(r) each */
    size_t nsnaps, capsnaps;
    evicted_t *evicted;
    size_t nevicted, capevicted;
    _Atomic int64_t high_water; /* newest sample t seen */
    bool force_checkpoint;
    bool sweep_every_state; /* rollup_config_t.sweep_every_state */
    int64_t last_ckpt_wall, last_retention_wall;
    size_t ret_res;      /* retention pass: resolution being cleaned */
    int ret_phase;       /* 0: whole blobs, 1: 1h rows and straddling 1h blobs per series */
    uint64_t ret_cursor; /* and series id cursor for phase 1 */
    bool ret_active;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop;
    _Atomic uint64_t st_written, st_ignored, st_flushes, st_flush_errors, st_series, st_mem_reads;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static int64_t floor_to(int64_t t, int64_t res)
{
    int64_t q = t / res;
    if (t % res != 0 && t < 0)
        q--;
    return q * res;
}

static uint64_t dbits(double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    return u;
}

static double bitsd(uint64_t u)
{
    double v;
    memcpy(&v, &u, 8);
    return v;
}

static double nan_min(double a, double b)
{
    return isnan(a) ? b : isnan(b) ? a : (b < a ? b : a);
}
static double nan_max(double a, double b)
{
    return isnan(a) ? b : isnan(b) ? a : (b > a ? b : a);
}

static void bucket_start(rollup_bucket_t *b, int64_t ts)
{
    *b = (rollup_bucket_t){.ts = ts, .min = NAN, .max = NAN, .last = NAN};
}

/* b (later) merged into a (earlier), same ts. */
static void bucket_merge(rollup_bucket_t *a, const rollup_bucket_t *b)
{
    assert(a->ts == b->ts);
    a->count += b->count;
    a->sum += b->sum;
    a->min = nan_min(a->min, b->min);
    a->max = nan_max(a->max, b->max);
    a->last = b->last;
    a->increase += b->increase;
}

static int buckets_reserve(rollup_buckets_t *b, size_t extra)
{
    if (b->cap - b->n >= extra)
        return 0;
    size_t cap = b->n + extra + b->cap / 2;
    rollup_bucket_t *v = realloc(b->v, cap * sizeof(*v));
    if (!v)
        return -1;
    b->v = v;
    b->cap = cap;
    return 0;
}

static int closed_push(closed_vec_t *cv, const closed_t *c)
{
    if (cv->n == cv->cap) {
        size_t cap = cv->cap ? cv->cap * 2 : 64;
        closed_t *v = realloc(cv->v, cap * sizeof(*v));
        if (!v)
            return -1;
        cv->v = v;
        cv->cap = cap;
    }
    cv->v[cv->n++] = *c;
    return 0;
}

static int closed_cmp(const void *pa, const void *pb)
{
    const closed_t *a = pa, *b = pb;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    if (a->res_idx != b->res_idx)
        return a->res_idx < b->res_idx ? -1 : 1;
    if (a->b.ts != b->b.ts)
        return a->b.ts < b->b.ts ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* The 1h resolution keeps plain rows (for the rollup_1h view) besides its blobs. */
static bool has_plain(const rollup_t *r, size_t i)
{
    return r->rs.v[i].res_ms == PLAIN_RES_MS;
}

/* Buckets per blob of resolution res (fixed per resolution: it decides blob starts on disk). */
static int64_t span_of(int64_t res)
{
    return res == PLAIN_RES_MS ? HOUR_BLOB_SPAN : BLOB_SPAN;
}

/* Is a rollup_blob row of resolution res deflated? Not 1h blobs: long-range queries read them far
 * more often per byte than the writer stores them (inflate was a third of a 30-day read), and
 * they are a 60th of the buckets (13 instead of ~7.5 bytes each). rollup_recent rows never are:
 * they hold a few buckets, rewritten every minute. */
static bool blob_squeeze(int64_t res)
{
    return span_of(res) == BLOB_SPAN;
}

/* ---- resolutions -------------------------------------------------------------------------- */

int rollup_parse_resolutions(const char *s, rollup_resolutions_t *out, char *err, size_t errlen)
{
    rollup_resolutions_t rs = {0};
    char tmp[256];
    if (!s || strlen(s) >= sizeof(tmp) || !*s) {
        snprintf(err, errlen, "roll-up resolutions: empty or too long");
        return -1;
    }
    strcpy(tmp, s);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (!colon) {
            snprintf(err, errlen, "roll-up resolutions: %s: want <resolution>:<retention>", tok);
            return -1;
        }
        *colon = 0;
        int64_t res, ret;
        if (parse_duration_ms(tok, &res) != 0 || parse_duration_ms(colon + 1, &ret) != 0) {
            snprintf(err, errlen, "roll-up resolutions: bad duration in %s:%s", tok, colon + 1);
            return -1;
        }
        if (res < 1000 || res % 1000 != 0) {
            snprintf(err, errlen, "roll-up resolutions: %s is not a positive whole number of seconds", tok);
            return -1;
        }
        if (ret < res) {
            snprintf(err, errlen, "roll-up resolutions: retention %s shorter than resolution %s", colon + 1, tok);
            return -1;
        }
        if (rs.n == ROLLUP_MAX_RESOLUTIONS) {
            snprintf(err, errlen, "roll-up resolutions: more than %d", ROLLUP_MAX_RESOLUTIONS);
            return -1;
        }
        if (rs.n > 0 && (res <= rs.v[rs.n - 1].res_ms || res % rs.v[rs.n - 1].res_ms != 0)) {
            snprintf(err, errlen, "roll-up resolutions: %s must be larger than and a multiple of the previous", tok);
            return -1;
        }
        rs.v[rs.n++] = (rollup_resolution_t){res, ret};
    }
    if (rs.n == 0) {
        snprintf(err, errlen, "roll-up resolutions: none given");
        return -1;
    }
    *out = rs;
    return 0;
}

const rollup_resolutions_t *rollup_resolutions(const rollup_t *r)
{
    return &r->rs;
}

size_t rollup_pick_resolution(const rollup_resolutions_t *rs, int64_t now_ms, int64_t mint, int64_t step_ms)
{
    assert(rs->n > 0);
    size_t finest_cover = rs->n;
    for (size_t i = 0; i < rs->n; i++) {
        bool covers = now_ms - rs->v[i].retention_ms <= mint;
        if (covers && rs->v[i].res_ms <= step_ms)
            return i;
        if (covers && finest_cover == rs->n)
            finest_cover = i;
    }
    return finest_cover < rs->n ? finest_cover : rs->n - 1;
}

/* ---- blob codec -------------------------------------------------------------------------- */

static const double pow10_tab[7] = {1, 10, 100, 1000, 10000, 100000, 1000000};

/* Decimal scale d (0..6) such that every value is exactly xi / 10^d for an integer |xi| < 2^53,
 * or -1. Exactness is checked bit for bit so decoding gives the same doubles back. */
static int col_decimals(const rollup_bucket_t *b, size_t n, size_t off)
{
    for (int d = 0; d <= 6; d++) {
        size_t i;
        for (i = 0; i < n; i++) {
            double v;
            memcpy(&v, (const char *)&b[i] + off, sizeof(v));
            double x = v * pow10_tab[d];
            if (!(fabs(x) < 9007199254740992.0) || (v == 0 && signbit(v)))
                return -1;
            double xi = nearbyint(x);
            if (xi / pow10_tab[d] != v)
                break;
        }
        if (i == n)
            return d;
    }
    return -1;
}

/* Appends one column in mode 0 (scaled integers: a scale byte, then zigzag deltas), mode 1
 * (byte-swapped XOR) or mode 2 (scaled integers plus the XOR residual of each value against
 * its decimal approximation: sums of decimals are a few ULPs off a decimal). Returns -1 if mode
 * 2 does not apply (a value too large for scaled integers). */
static int col_encode(buf_t *p, const rollup_bucket_t *b, size_t n, size_t off, int mode, int decimals)
{
    buf_putc(p, (char)mode);
    if (mode != 1)
        buf_putc(p, (char)decimals);
    int64_t pi = 0;
    uint64_t pb = 0;
    for (size_t i = 0; i < n; i++) {
        double v;
        memcpy(&v, (const char *)&b[i] + off, sizeof(v));
        if (mode != 1) {
            double x = nearbyint(v * pow10_tab[decimals]);
            if (!(fabs(x) < 9007199254740992.0))
                return -1;
            int64_t iv = (int64_t)x;
            varint_put_signed(p, (int64_t)((uint64_t)iv - (uint64_t)pi));
            if (mode == 2)
                varint_put(p, dbits(v) ^ dbits((double)iv / pow10_tab[decimals]));
            pi = iv;
        } else {
            varint_put(p, __builtin_bswap64(dbits(v) ^ pb));
            pb = dbits(v);
        }
    }
    return 0;
}

static const size_t col_off[5] = {offsetof(rollup_bucket_t, sum), offsetof(rollup_bucket_t, min),
                                  offsetof(rollup_bucket_t, max), offsetof(rollup_bucket_t, last),
                                  offsetof(rollup_bucket_t, increase)};

static void codec_free(codec_t *cx)
{
    if (cx->def_ok)
        deflateEnd(&cx->def);
    if (cx->inf_ok)
        inflateEnd(&cx->inf);
    buf_free(&cx->payload);
    buf_free(&cx->cand);
    buf_free(&cx->best);
    free(cx->raw);
    memset(cx, 0, sizeof(*cx));
}

/* Appends the zlib stream of p to out (the same bytes compress2(level 6) gives). Returns the
 * compressed length, or 0 on failure. */
static size_t codec_deflate(codec_t *cx, const buf_t *p, buf_t *out)
{
    if (!cx->def_ok) {
        memset(&cx->def, 0, sizeof(cx->def));
        if (deflateInit(&cx->def, 6) != Z_OK)
            return 0;
        cx->def_ok = true;
    } else if (deflateReset(&cx->def) != Z_OK) {
        return 0;
    }
    uLong bound = deflateBound(&cx->def, (uLong)p->len);
    buf_reserve(out, bound);
    cx->def.next_in = (Bytef *)p->data;
    cx->def.avail_in = (uInt)p->len;
    cx->def.next_out = (Bytef *)out->data + out->len;
    cx->def.avail_out = (uInt)bound;
    if (deflate(&cx->def, Z_FINISH) != Z_STREAM_END)
        return 0;
    size_t zlen = bound - cx->def.avail_out;
    out->len += zlen;
    out->data[out->len] = 0; /* buf_t's terminator (buf_reserve left room for it) */
    return zlen;
}

/* Inflates in[0..inlen) into the codec's scratch, which must come out exactly plen bytes. */
static const uint8_t *codec_inflate(codec_t *cx, const uint8_t *in, size_t inlen, size_t plen)
{
    if (cx->rawcap < plen) {
        uint8_t *v = realloc(cx->raw, plen);
        if (!v)
            return NULL;
        cx->raw = v;
        cx->rawcap = plen;
    }
    if (!cx->inf_ok) {
        memset(&cx->inf, 0, sizeof(cx->inf));
        if (inflateInit(&cx->inf) != Z_OK)
            return NULL;
        cx->inf_ok = true;
    } else if (inflateReset(&cx->inf) != Z_OK) {
        return NULL;
    }
    cx->inf.next_in = (Bytef *)in;
    cx->inf.avail_in = (uInt)inlen;
    cx->inf.next_out = cx->raw;
    cx->inf.avail_out = (uInt)plen;
    if (inflate(&cx->inf, Z_FINISH) != Z_STREAM_END || cx->inf.avail_out != 0)
        return NULL;
    return cx->raw;
}

/* Encodes sorted, distinct-ts buckets b[0..n) of the blob starting at `start` (span buckets of
 * width res) into out, deflated if `squeeze` (see blob_squeeze) and shorter so. */
static void blob_encode(codec_t *cx, buf_t *out, const rollup_bucket_t *b, size_t n, int64_t start, int64_t res,
                        int64_t span, bool squeeze)
{
    buf_t *p = &cx->payload;
    buf_reset(p);
    varint_put(p, n);
    int64_t prev_slot = -1;
    for (size_t i = 0; i < n; i++) {
        int64_t slot = (b[i].ts - start) / res;
        assert(slot > prev_slot && slot < span);
        varint_put(p, (uint64_t)(slot - prev_slot - 1));
        prev_slot = slot;
    }
    uint64_t pc = 0;
    for (size_t i = 0; i < n; i++) {
        varint_put_signed(p, (int64_t)(b[i].count - pc));
        pc = b[i].count;
    }
    buf_t *a = &cx->cand, *x = &cx->best;
    for (int c = 0; c < 5; c++) {
        /* Both candidates, keep the shorter. */
        buf_reset(a);
        buf_reset(x);
        int d = col_decimals(b, n, col_off[c]);
        col_encode(x, b, n, col_off[c], 1, 0);
        if (d >= 0) {
            col_encode(a, b, n, col_off[c], 0, d);
            if (a->len < x->len) {
                buf_t *t = x;
                x = a;
                a = t;
            }
        } else {
            for (int k = 0; k <= 6; k++) {
                buf_reset(a);
                if (col_encode(a, b, n, col_off[c], 2, k) == 0 && a->len < x->len) {
                    buf_t *t = x;
                    x = a;
                    a = t;
                }
            }
        }
        buf_append(p, x->data, x->len);
    }
    buf_reset(out);
    size_t zlen = 0;
    if (squeeze) {
        buf_putc(out, 2);
        varint_put(out, p->len);
        zlen = codec_deflate(cx, p, out);
    }
    if (zlen == 0 || zlen + 4 >= p->len) {
        buf_reset(out);
        buf_putc(out, 1);
        buf_append(out, p->data, p->len);
    }
}

/* Decodes a blob of `span` slots into out (appending). Never reads past len. Returns 0 or -1. */
static int blob_decode(codec_t *cx, const uint8_t *data, size_t len, int64_t start, int64_t res, int64_t span,
                       rollup_buckets_t *out)
{
    if (len < 1)
        return -1;
    const uint8_t *p = data + 1, *end = data + len;
    if (data[0] == 2) {
        uint64_t plen;
        if (varint_get(&p, end, &plen) != 0 || plen == 0 || plen > MAX_PAYLOAD)
            return -1;
        const uint8_t *raw = codec_inflate(cx, p, (size_t)(end - p), plen);
        if (!raw)
            return -1;
        p = raw;
        end = raw + plen;
    } else if (data[0] != 1) {
        return -1;
    }
    uint64_t n;
    if (varint_get(&p, end, &n) != 0 || n == 0 || n > (uint64_t)span)
        return -1;
    if (out->cap - out->n < n) {
        size_t cap = out->n + n + out->cap;
        rollup_bucket_t *v = realloc(out->v, cap * sizeof(*v));
        if (!v)
            return -1;
        out->v = v;
        out->cap = cap;
    }
    rollup_bucket_t *b = out->v + out->n;
    int64_t slot = -1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t gap;
        if (varint_get(&p, end, &gap) != 0 || gap >= (uint64_t)span)
            return -1;
        slot += (int64_t)gap + 1;
        if (slot >= span)
            return -1;
        b[i] = (rollup_bucket_t){.ts = start + slot * res};
    }
    uint64_t pc = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t z;
        if (varint_get(&p, end, &z) != 0)
            return -1;
        pc += (uint64_t)varint_unzigzag(z);
        b[i].count = pc;
    }
    for (int c = 0; c < 5; c++) {
        if (p >= end || *p > 2)
            return -1;
        int mode = *p++;
        int decimals = 0;
        if (mode != 1) {
            if (p >= end || *p > 6)
                return -1;
            decimals = *p++;
        }
        int64_t pi = 0;
        uint64_t pb = 0;
        size_t off = col_off[c];
        for (uint64_t i = 0; i < n; i++) {
            uint64_t u;
            if (varint_get(&p, end, &u) != 0)
                return -1;
            double v;
            if (mode != 1) {
                pi = (int64_t)((uint64_t)pi + (uint64_t)varint_unzigzag(u));
                v = (double)pi / pow10_tab[decimals];
                if (mode == 2) {
                    uint64_t resid;
                    if (varint_get(&p, end, &resid) != 0)
                        return -1;
                    v = bitsd(dbits(v) ^ resid);
                }
            } else {
                pb ^= __builtin_bswap64(u);
                v = bitsd(pb);
            }
            memcpy((char *)&b[i] + off, &v, sizeof(v));
        }
    }
    if (p != end)
        return -1;
    out->n += n;
    return 0;
}

/* ---- shards and states -------------------------------------------------------------------- */

/* Runs of SHARD_RUN consecutive ids share a shard; the runs are spread over the shards by a hash.
 * The writer writes a cycle's state rows one shard at a time, and rollup_state (and the series
 * table) are ordered by id: with every id in a shard of its own hash, each shard's rows were spread
 * over every page of the table, so SQLite's 2 MB page cache spilled every page once per shard, 64
 * times per minute boundary (~4 GB of WAL writes at 256k series for a 63 MB table). A run spans a
 * few pages of either table, so a page is written about once per cycle. A push's series (ids
 * given out together) also meet a few shard locks instead of all 64. */
#define SHARD_RUN 256

static size_t shard_of(uint64_t id)
{
    return (size_t)(((id / SHARD_RUN) * 0x9E3779B97F4A7C15ull) >> 58) & (SHARDS - 1);
}
static size_t slot_of(const shard_t *sh, uint64_t id)
{
    return (size_t)((id * 0xC2B2AE3D27D4EB4Full) >> 20) & (sh->nbuckets - 1);
}

static sstate_t *state_find(shard_t *sh, uint64_t id)
{
    for (sstate_t *s = sh->tab[slot_of(sh, id)]; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static void shard_grow(shard_t *sh)
{
    size_t nb = sh->nbuckets * 2;
    sstate_t **tab = calloc(nb, sizeof(*tab));
    if (!tab)
        return; /* keep the longer chains */
    shard_t tmp = {.tab = tab, .nbuckets = nb};
    for (size_t i = 0; i < sh->nbuckets; i++) {
        for (sstate_t *s = sh->tab[i], *next; s; s = next) {
            next = s->next;
            size_t k = slot_of(&tmp, s->id);
            s->next = tab[k];
            tab[k] = s;
        }
    }
    free(sh->tab);
    sh->tab = tab;
    sh->nbuckets = nb;
}

/* disk_lo of resolution i, in ms (INT64_MAX: nothing stored). Kept as a 32-bit multiple of the
 * resolution, rounded down and saturated, so it stays a lower bound of every stored ts. */
static int64_t disk_lo_get(const rollup_t *r, const sstate_t *s, size_t i)
{
    int32_t q = s->open[i].disk_lo;
    return q == INT32_MAX ? INT64_MAX : (int64_t)q * r->rs.v[i].res_ms;
}

static void disk_lo_set(const rollup_t *r, sstate_t *s, size_t i, int64_t ts)
{
    if (ts == INT64_MAX) {
        s->open[i].disk_lo = INT32_MAX;
        return;
    }
    int64_t q = floor_to(ts, r->rs.v[i].res_ms) / r->rs.v[i].res_ms;
    s->open[i].disk_lo = q < INT32_MIN ? INT32_MIN : q >= INT32_MAX ? INT32_MAX - 1 : (int32_t)q;
}

static bool open_is(const sstate_t *s, size_t i)
{
    return s->open[i].count != 0;
}

/* The start of open bucket i of s (NO_BUCKET: none open): the period of last_t. */
static int64_t open_ts(const rollup_t *r, const sstate_t *s, size_t i)
{
    return open_is(s, i) ? floor_to(s->last_t, r->rs.v[i].res_ms) : NO_BUCKET;
}

/* Open bucket i of s as a rollup_bucket_t (ts NO_BUCKET: none). */
static rollup_bucket_t open_get(const rollup_t *r, const sstate_t *s, size_t i)
{
    const sbucket_t *b = &s->open[i];
    return (rollup_bucket_t){.ts = open_ts(r, s, i),
                             .count = b->count,
                             .sum = b->sum,
                             .min = b->min,
                             .max = b->max,
                             .last = s->last,
                             .increase = b->increase};
}

static size_t state_bytes(const rollup_t *r)
{
    return sizeof(sstate_t) + r->rs.n * sizeof(sbucket_t);
}

static void state_free(shard_t *sh, sstate_t *s)
{
    s->live = false;
    slab_free(&sh->states, s);
}

static sstate_t *state_get(rollup_t *r, shard_t *sh, uint64_t id)
{
    sstate_t *s = id <= sh->max_id ? state_find(sh, id) : NULL;
    assert(id <= sh->max_id || !state_find(sh, id));
    if (s)
        return s;
    s = slab_alloc(&sh->states);
    if (!s)
        return NULL;
    s->id = id;
    s->live = true;
    s->last_t = INT64_MIN;
    s->closed_last = CLOSED_NONE;
    s->duepos = DUE_NONE;
    for (size_t i = 0; i < r->rs.n; i++)
        s->open[i].count = 0;
    /* Up to two states per chain: ingest finds its states through hints and checkpoints walk
     * the chains anyway, so a bucket per state would only double the table (4 MB at 256k series). */
    if (sh->count >= 2 * sh->nbuckets)
        shard_grow(sh);
    size_t k = slot_of(sh, id);
    s->next = sh->tab[k];
    sh->tab[k] = s;
    sh->count++;
    if (id > sh->max_id)
        sh->max_id = id;
    atomic_fetch_add(&r->st_series, 1);
    return s;
}

/* The index in the shard's closed list of the entry of series id at position pos, if it is
 * still there and before index `below`; SIZE_MAX if not. Positions (closed_base + index) do not
 * move when the writer takes the front of the list, so nothing has to be renumbered then; a
 * taken one falls outside the list. After 2^32 buckets a stale position can point into the list
 * again, at another series' entry (this series has none there, or its newest position would be
 * current): the id check ends the chain there. */
static size_t closed_index(const shard_t *sh, uint32_t pos, uint64_t id, size_t below)
{
    size_t i = (uint32_t)(pos - sh->closed_base);
    return i < sh->closed.n && i < below && sh->closed.v[i].id == id ? i : SIZE_MAX;
}

/* Appends bucket b of resolution i of s to the shard's closed list, linked from s. */
static int closed_add(shard_t *sh, sstate_t *s, size_t i, const rollup_bucket_t *b)
{
    closed_t c = {.id = s->id, .res_idx = (uint32_t)i, .seq = sh->seq++, .prev = s->closed_last, .b = *b};
    assert(sh->closed.n < CLOSED_NONE);
    if (closed_push(&sh->closed, &c) != 0)
        return -1;
    s->closed_last = sh->closed_base + (uint32_t)(sh->closed.n - 1);
    return 0;
}

/* Moves the open bucket i of s to the shard's closed list (shard locked). */
static void close_open(rollup_t *r, shard_t *sh, sstate_t *s, size_t i)
{
    if (!open_is(s, i))
        return;
    rollup_bucket_t b = open_get(r, s, i);
    if (closed_add(sh, s, i, &b) != 0) {
        log_error("rollup", "out of memory; bucket dropped", LF_I("series", s->id), LF_I("ts", b.ts));
        sh->snap_all = true; /* the writer finds the states to snapshot through the closed list */
    }
    s->open[i].count = 0;
    s->closed = true;
    s->dirty = true;
}

/* ---- the due heap (see "The writer's sweep") ---------------------------------------------- */

static int64_t add_sat(int64_t a, int64_t b)
{
    int64_t c;
    if (__builtin_add_overflow(a, b, &c))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return c;
}

/* The high-water mark from which the writer's sweep (before[i] = hw - res_i) has something to do
 * for s: commit its pending sample (its finest bucket ends at or before before[0]), close an open
 * bucket (it ends at or before before[i]), or, with neither, evict it (last_t < before[n-1]). */
static int64_t state_wake(const rollup_t *r, const sstate_t *s)
{
    int64_t k = INT64_MAX;
    bool any = false;
    if (s->pend) {
        int64_t res = r->rs.v[0].res_ms;
        k = add_sat(floor_to(s->pend_t, res), 2 * res);
        any = true;
    }
    for (size_t i = 0; i < r->rs.n; i++) {
        if (!open_is(s, i))
            continue;
        int64_t w = add_sat(open_ts(r, s, i), 2 * r->rs.v[i].res_ms);
        k = w < k ? w : k;
        any = true;
    }
    if (!any)
        k = add_sat(add_sat(s->last_t, r->rs.v[r->rs.n - 1].res_ms), 1);
    return k;
}

static void due_place(shard_t *sh, size_t i, due_t e)
{
    sh->due[i] = e;
    e.s->duepos = (unsigned)i;
}

static void due_up(shard_t *sh, size_t i)
{
    due_t e = sh->due[i];
    while (i > 0 && sh->due[(i - 1) / 2].key > e.key) {
        due_place(sh, i, sh->due[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    due_place(sh, i, e);
}

/* setpos: keep the states' duepos (false: the caller sets them all afterwards, see
 * due_heapify: every write is a cache miss on a state). */
static void due_sift_down(shard_t *sh, size_t i, bool setpos)
{
    due_t e = sh->due[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= sh->ndue)
            break;
        if (c + 1 < sh->ndue && sh->due[c + 1].key < sh->due[c].key)
            c++;
        if (sh->due[c].key >= e.key)
            break;
        if (setpos)
            due_place(sh, i, sh->due[c]);
        else
            sh->due[i] = sh->due[c];
        i = c;
    }
    if (setpos)
        due_place(sh, i, e);
    else
        sh->due[i] = e;
}

static void due_down(shard_t *sh, size_t i)
{
    due_sift_down(sh, i, true);
}

/* Makes the shard's entries a heap and points every state at its entry. */
static void due_heapify(shard_t *sh)
{
    for (size_t i = sh->ndue / 2; i-- > 0;)
        due_sift_down(sh, i, false);
    for (size_t i = 0; i < sh->ndue; i++)
        sh->due[i].s->duepos = (unsigned)i;
}

/* Gives s (no entry yet) an entry with key. On failure the shard is marked due_lost. */
static void due_insert(shard_t *sh, sstate_t *s, int64_t key)
{
    assert(s->duepos == DUE_NONE);
    if (sh->ndue == sh->capdue) {
        size_t cap = sh->capdue ? sh->capdue * 2 : 64;
        due_t *v = cap < DUE_NONE ? realloc(sh->due, cap * sizeof(*v)) : NULL;
        if (!v) {
            sh->due_lost = true;
            return;
        }
        sh->due = v;
        sh->capdue = cap;
    }
    sh->due[sh->ndue] = (due_t){.key = key, .s = s};
    due_up(sh, sh->ndue++);
}

static void due_remove(shard_t *sh, sstate_t *s)
{
    size_t i = s->duepos;
    if (i == DUE_NONE)
        return;
    assert(i < sh->ndue && sh->due[i].s == s);
    s->duepos = DUE_NONE;
    due_t last = sh->due[--sh->ndue];
    if (i == sh->ndue)
        return;
    int64_t old = sh->due[i].key;
    due_place(sh, i, last);
    if (last.key < old)
        due_up(sh, i);
    else
        due_down(sh, i);
}

/* s's entry gets key (any direction), or one is made. */
static void due_set(shard_t *sh, sstate_t *s, int64_t key)
{
    size_t i = s->duepos;
    if (i == DUE_NONE) {
        due_insert(sh, s, key);
        return;
    }
    int64_t old = sh->due[i].key;
    sh->due[i].key = key;
    if (key < old)
        due_up(sh, i);
    else if (key > old)
        due_down(sh, i);
}

/* Ingest, after s got a pending sample: the only change that can bring its wake forward (a new
 * state, or one whose pending sample the sweep committed: its wake was a coarser bucket's end or
 * its eviction). A pending sample that replaced or committed another keeps or delays it: the
 * buckets a commit opens end after the old pending sample's finest one. */
static void due_note_pending(rollup_t *r, shard_t *sh, sstate_t *s)
{
    int64_t res = r->rs.v[0].res_ms;
    int64_t k = add_sat(floor_to(s->pend_t, res), 2 * res);
    if (s->duepos == DUE_NONE) {
        if (!sh->due_lost)
            due_insert(sh, s, k);
    } else if (k < sh->due[s->duepos].key) {
        due_set(sh, s, k);
    }
}

static int64_t sec_of(int64_t t)
{
    return floor_to(t, 1000) / 1000;
}

/* The counter increase sample v adds after s's predecessor (0 without one, or for NaN). */
static double increase_of(const sstate_t *s, double v)
{
    if (isnan(v) || !s->prev_ok)
        return 0;
    return v >= s->prev ? v - s->prev : v;
}

/* Adds sample (t, v) to bucket b (already started at the right ts). */
static void bucket_add(rollup_bucket_t *b, double v, double inc)
{
    b->count++;
    b->sum += v;
    b->min = nan_min(b->min, v);
    b->max = nan_max(b->max, v);
    b->last = v;
    b->increase += inc;
}

/* Aggregates the pending sample into the open buckets (shard locked). */
static void commit_pending(rollup_t *r, shard_t *sh, sstate_t *s)
{
    if (!s->pend)
        return;
    s->pend = false;
    s->dirty = true;
    /* Open buckets of another period than the sample's close while last_t still dates them
     * (a staleness marker too, which aggregates nothing: no later sample can land in them). */
    for (size_t i = 0; i < r->rs.n; i++)
        if (open_is(s, i) && open_ts(r, s, i) != floor_to(s->pend_t, r->rs.v[i].res_ms))
            close_open(r, sh, s, i); /* with the `last` it had */
    s->last_t = s->pend_t;
    double v = s->pend_v;
    if (dbits(v) == STALE_NAN_BITS) {
        s->prev_ok = false; /* ends continuity, is not aggregated */
        return;
    }
    double inc = increase_of(s, v);
    if (!isnan(v)) {
        s->prev = v;
        s->prev_ok = true;
    }
    for (size_t i = 0; i < r->rs.n; i++) {
        sbucket_t *b = &s->open[i];
        if (b->count == 0) {
            b->sum = b->increase = 0;
            b->min = b->max = NAN;
        }
        b->count++;
        b->sum += v;
        b->min = nan_min(b->min, v);
        b->max = nan_max(b->max, v);
        b->increase += inc;
    }
    s->last = v;
}

/* A sample is held as pending until a sample of a later second arrives (or its bucket is
 * closed): the raw tier lets a later sample in the same second replace the earlier one, and the
 * roll-up must aggregate only the survivor. Samples in a second at or before the newest
 * aggregated one, or before the pending one, are ignored (WAL replay, duplicates). */
static void add_one(rollup_t *r, shard_t *sh, const rollup_sample_t *smp, void **hint)
{
    /* A hint points into a slab of this rollup (pages live until close): it is this series'
     * state if the record is live and has its id, and then the record is of this shard. */
    sstate_t *h = hint ? *hint : NULL;
    sstate_t *s = h && h->live && h->id == smp->series_id ? h : state_get(r, sh, smp->series_id);
    if (hint)
        *hint = s;
    if (!s) {
        log_error("rollup", "out of memory; sample dropped", LF_I("series", smp->series_id));
        return;
    }
    int64_t sec = sec_of(smp->t);
    if ((s->last_t != INT64_MIN && sec <= sec_of(s->last_t)) || (s->pend && sec < sec_of(s->pend_t))) {
        atomic_fetch_add(&r->st_ignored, 1);
        return;
    }
    bool had_pend = s->pend;
    if (s->pend && sec > sec_of(s->pend_t))
        commit_pending(r, sh, s);
    s->pend = true;
    s->pend_t = smp->t;
    s->pend_v = smp->v;
    s->dirty = true;
    if (!had_pend)
        due_note_pending(r, sh, s);
}

#define PREFETCH_AHEAD 8

static void state_prefetch(const rollup_t *r, const void *st)
{
    if (!st)
        return;
    const char *p = st;
    for (size_t off = 0; off < state_bytes(r); off += 64)
        __builtin_prefetch(p + off, 1);
}

void rollup_add_samples(rollup_t *r, const rollup_sample_t *s, size_t n)
{
    rollup_add_samples_hinted(r, s, n, NULL);
}

void rollup_add_samples_hinted(rollup_t *r, const rollup_sample_t *s, size_t n, void **hints)
{
    int64_t hw = atomic_load(&r->high_water);
    /* A push's samples spread over every shard: take each shard's lock once, for its samples in
     * their order (a series' samples stay in order: one series, one shard). */
    uint32_t *by_shard = n > SHARDS && n < UINT32_MAX ? malloc(n * sizeof(*by_shard)) : NULL;
    if (by_shard) {
        uint32_t start[SHARDS + 1] = {0};
        for (size_t i = 0; i < n; i++)
            start[shard_of(s[i].series_id) + 1]++;
        for (size_t k = 0; k < SHARDS; k++)
            start[k + 1] += start[k];
        uint32_t at[SHARDS];
        memcpy(at, start, sizeof(at));
        for (size_t i = 0; i < n; i++)
            by_shard[at[shard_of(s[i].series_id)]++] = (uint32_t)i;
        for (size_t k = 0; k < SHARDS; k++) {
            if (start[k] == start[k + 1])
                continue;
            shard_t *sh = &r->shards[k];
            pthread_mutex_lock(&sh->mu);
            for (uint32_t j = start[k]; j < start[k + 1]; j++) {
                const rollup_sample_t *x = &s[by_shard[j]];
                /* A hinted state is a cache miss away (one per series, scattered over slabs):
                 * start loading the one a few samples ahead. A stale hint's record is still
                 * mapped (slab pages live until close), and a prefetch never faults anyway. */
                if (hints && j + PREFETCH_AHEAD < start[k + 1])
                    state_prefetch(r, hints[by_shard[j + PREFETCH_AHEAD]]);
                add_one(r, sh, x, hints ? &hints[by_shard[j]] : NULL);
                if (x->t > hw)
                    hw = x->t;
            }
            pthread_mutex_unlock(&sh->mu);
        }
        free(by_shard);
    }
    size_t i = by_shard ? n : 0;
    while (i < n) {
        /* Consecutive samples of one shard share one lock acquisition. */
        size_t k = shard_of(s[i].series_id);
        shard_t *sh = &r->shards[k];
        pthread_mutex_lock(&sh->mu);
        for (; i < n && shard_of(s[i].series_id) == k; i++) {
            add_one(r, sh, &s[i], hints ? &hints[i] : NULL);
            if (s[i].t > hw)
                hw = s[i].t;
        }
        pthread_mutex_unlock(&sh->mu);
    }
    int64_t cur = atomic_load(&r->high_water);
    while (hw > cur && !atomic_compare_exchange_weak(&r->high_water, &cur, hw))
        ;
}

/* ---- the writer's sweep ------------------------------------------------------------------ */

/* Removes s from its hash chain. */
static void state_unlink(shard_t *sh, sstate_t *s)
{
    sstate_t **pp = &sh->tab[slot_of(sh, s->id)];
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
}

/* Shard locked. For one state: commits its pending sample and closes its buckets if they end at
 * or before `before` (per resolution: before[i]); with `evict`, evicts it if nothing is open and
 * its newest sample is older than before[n-1] (then it is freed: returns true). An eviction that
 * cannot be recorded (out of memory) is left for the next sweep. */
static bool state_sweep(rollup_t *r, shard_t *sh, sstate_t *s, const int64_t *before, bool evict)
{
    bool any_open = false;
    if (s->pend && floor_to(s->pend_t, r->rs.v[0].res_ms) + r->rs.v[0].res_ms <= before[0])
        commit_pending(r, sh, s);
    for (size_t i = 0; i < r->rs.n; i++) {
        if (open_is(s, i) && open_ts(r, s, i) + r->rs.v[i].res_ms <= before[i])
            close_open(r, sh, s, i);
        any_open |= open_is(s, i);
    }
    if (!evict || any_open || s->pend || s->last_t >= before[r->rs.n - 1])
        return false;
    if (r->nevicted == r->capevicted) {
        size_t cap = r->capevicted ? r->capevicted * 2 : 256;
        evicted_t *v = realloc(r->evicted, cap * sizeof(*v));
        if (!v)
            return false;
        r->evicted = v;
        r->capevicted = cap;
    }
    r->evicted[r->nevicted++] = (evicted_t){.id = s->id, .seen_t = s->last_t};
    if (closed_index(sh, s->closed_last, s->id, SIZE_MAX) != SIZE_MAX)
        sh->orphans = true;
    due_remove(sh, s);
    state_unlink(sh, s);
    state_free(sh, s);
    sh->count--;
    atomic_fetch_sub(&r->st_series, 1);
    return true;
}

/* Shard locked. Sweeps every state (the first cycle, after a lost heap entry, and
 * rollup_close_buckets_before, which is not the writer's rule) and rebuilds the due heap. */
static void shard_sweep_all(rollup_t *r, shard_t *sh, const int64_t *before, bool evict)
{
    sh->ndue = 0;
    bool lost = false;
    if (sh->capdue < sh->count) {
        due_t *v = sh->count < DUE_NONE ? realloc(sh->due, sh->count * sizeof(*v)) : NULL;
        if (v) {
            sh->due = v;
            sh->capdue = sh->count;
        } else {
            lost = true;
        }
    }
    for (size_t k = 0; k < sh->nbuckets; k++) {
        for (sstate_t *s = sh->tab[k], *next; s; s = next) {
            next = s->next;
            s->duepos = DUE_NONE;
            if (state_sweep(r, sh, s, before, evict))
                continue;
            if (!lost)
                sh->due[sh->ndue++] = (due_t){.key = state_wake(r, s), .s = s};
        }
    }
    due_heapify(sh);
    sh->due_lost = lost;
}

/* shard_sweep_due when much of the shard is due at once (at the real cadence every series'
 * minute comes due in the same cycle): one pass over the entries in array order and one heapify,
 * instead of a sift per state whose every step moves another state's duepos (a cache miss). */
static void shard_sweep_due_bulk(rollup_t *r, shard_t *sh, int64_t hw, const int64_t *before)
{
    size_t w = 0;
    for (size_t i = 0; i < sh->ndue; i++) {
        due_t e = sh->due[i];
        if (e.key <= hw) {
            e.s->duepos = DUE_NONE; /* an eviction has no entry to remove: this pass drops it */
            if (state_sweep(r, sh, e.s, before, true))
                continue;
            e.key = state_wake(r, e.s);
            if (e.key <= hw) { /* an eviction it could not record: see shard_sweep_due */
                sh->due_lost = true;
                e.key = add_sat(hw, 1);
            }
        }
        sh->due[w++] = e;
    }
    sh->ndue = w;
    due_heapify(sh);
}

/* Shard locked. The writer's sweep at high-water mark hw (before[i] = hw - res_i): only the
 * states whose wake has come, so a cycle costs what changed, not every state of the shard. A
 * state whose entry was early (its bucket closed by a later sample instead) gets its real wake. */
static void shard_sweep_due(rollup_t *r, shard_t *sh, int64_t hw, const int64_t *before)
{
    if (sh->due_lost) {
        shard_sweep_all(r, sh, before, true);
        return;
    }
    size_t budget = sh->ndue / 16 > 4 ? sh->ndue / 16 : 4;
    while (sh->ndue > 0 && sh->due[0].key <= hw) {
        if (budget-- == 0) {
            shard_sweep_due_bulk(r, sh, hw, before);
            return;
        }
        sstate_t *s = sh->due[0].s;
        if (state_sweep(r, sh, s, before, true))
            continue; /* freed, its entry removed */
        int64_t k = state_wake(r, s);
        if (k <= hw) {
            /* An eviction it could not record: the next cycle's sweep walks every state. */
            sh->due_lost = true;
            k = add_sat(hw, 1);
        }
        due_set(sh, s, k);
    }
}

void rollup_close_buckets_before(rollup_t *r, int64_t before_ms)
{
    int64_t before[ROLLUP_MAX_RESOLUTIONS];
    for (size_t i = 0; i < r->rs.n; i++)
        before[i] = before_ms;
    for (size_t k = 0; k < SHARDS; k++) {
        pthread_mutex_lock(&r->shards[k].mu);
        shard_sweep_all(r, &r->shards[k], before, false);
        pthread_mutex_unlock(&r->shards[k].mu);
    }
}

/* ---- state snapshots ------------------------------------------------------------------------ */

static void get_state_entry(const uint8_t *p, int64_t *res_ms, rollup_bucket_t *b)
{
    uint64_t w[8];
    for (int i = 0; i < 8; i++)
        w[i] = le_get64(p + 8 * i);
    *res_ms = (int64_t)w[0];
    *b = (rollup_bucket_t){.ts = (int64_t)w[1],
                           .count = w[2],
                           .sum = bitsd(w[3]),
                           .min = bitsd(w[4]),
                           .max = bitsd(w[5]),
                           .last = bitsd(w[6]),
                           .increase = bitsd(w[7])};
}

/* Capacities kept from one writer cycle to the next, in bytes: a cycle after a minute boundary
 * closes a bucket of every series, ~22 MB of closed buckets at 256k series (the snapshots are
 * one shard's at a time, ~0.6 MB). Beyond this, the buffers are freed after the cycle (they are
 * big enough to be mmap'd, so the memory goes back to the system instead of staying in the
 * writer thread's malloc arena). */
#define KEEP_CAP_BYTES (1u << 20)

/* Shard locked. Copies s for write_snaps and marks it written (not closed, not dirty). Once its
 * catalog row is committed, the copy's write will also mark that row open (unless an earlier one
 * did), so later snapshots can skip it: s->seen_open is set now, on the live state; a cycle that
 * rolls back rewrites every state and every mark (rollup_flush's `all`). */
static void snap_state(rollup_t *r, sstate_t *s)
{
    size_t sz = state_bytes(r);
    if (r->nsnaps == r->capsnaps) {
        size_t cap = r->capsnaps ? r->capsnaps * 2 : 256;
        unsigned char *v = realloc(r->snaps, cap * sz);
        if (!v)
            return; /* state stays dirty; the next checkpoint writes it */
        r->snaps = v;
        r->capsnaps = cap;
    }
    memcpy(r->snaps + r->nsnaps * sz, s, sz);
    r->nsnaps++;
    s->closed = s->dirty = false;
    /* Not yet: the row may be in this very transaction's catalog batch (then this cycle's
     * UPDATE marks it, and the next snapshot does so again), or still queued (then the UPDATE
     * finds no row and the INSERT will write the first sample's time). */
    if (catalog_is_written(r->cat, s->id))
        s->seen_open = true;
}

/* One compact entry (see "Tables" above) at out; returns its length (<= STATE_COMPACT_MAX). */
static size_t put_state_compact(uint8_t *out, int64_t res_ms, const rollup_bucket_t *b, int64_t *prev_ts)
{
    size_t n = varint_encode(out, (uint64_t)res_ms);
    n += varint_encode(out + n, varint_zigzag((int64_t)((uint64_t)b->ts - (uint64_t)*prev_ts)));
    *prev_ts = b->ts;
    n += varint_encode(out + n, b->count);
    const double v[5] = {b->last, b->max, b->min, b->sum, b->increase};
    uint8_t body[5 * VARINT_MAX];
    size_t m = 0;
    uint64_t modes = 0, prev = 0;
    for (int k = 0; k < 5; k++) {
        uint64_t x = dbits(v[k]) ^ prev;
        prev = dbits(v[k]);
        /* mode 0: trailing zero bytes (whole numbers, short decimals) dropped; mode 1: leading
         * ones (a value near the previous one); mode 2: 8 bytes as they are. */
        size_t l0 = varint_len(__builtin_bswap64(x)), l1 = varint_len(x);
        uint64_t mode = l0 <= l1 ? (l0 < 8 ? 0 : 2) : (l1 < 8 ? 1 : 2);
        modes |= mode << (2 * k);
        if (mode == 0)
            m += varint_encode(body + m, __builtin_bswap64(x));
        else if (mode == 1)
            m += varint_encode(body + m, x);
        else {
            le_put64(body + m, x);
            m += 8;
        }
    }
    n += varint_encode(out + n, modes);
    memcpy(out + n, body, m);
    return n + m;
}

/* Reads one compact entry at *p (never past end); 0, or -1 if it is malformed. */
static int get_state_compact(const uint8_t **p, const uint8_t *end, int64_t *prev_ts, int64_t *res_ms,
                             rollup_bucket_t *b)
{
    uint64_t res, dts, count, modes;
    if (varint_get(p, end, &res) != VARINT_OK || res > INT64_MAX || varint_get(p, end, &dts) != VARINT_OK ||
        varint_get(p, end, &count) != VARINT_OK || varint_get(p, end, &modes) != VARINT_OK || modes >= (1u << 10))
        return -1;
    *res_ms = (int64_t)res;
    *prev_ts = (int64_t)((uint64_t)*prev_ts + (uint64_t)varint_unzigzag(dts));
    double v[5];
    uint64_t prev = 0;
    for (int k = 0; k < 5; k++) {
        uint64_t x = 0, mode = (modes >> (2 * k)) & 3;
        if (mode == 0 || mode == 1) {
            if (varint_get(p, end, &x) != VARINT_OK)
                return -1;
            if (mode == 0)
                x = __builtin_bswap64(x);
        } else if (mode == 2 && end - *p >= 8) {
            x = le_get64(*p);
            *p += 8;
        } else {
            return -1;
        }
        prev ^= x;
        v[k] = bitsd(prev);
    }
    *b = (rollup_bucket_t){
        .ts = *prev_ts, .count = count, .last = v[0], .max = v[1], .min = v[2], .sum = v[3], .increase = v[4]};
    return 0;
}

/* The rollup_state.open of a snapshot, compact, into out (room for STATE_OPEN_MAX); returns its
 * length, 0 if nothing is open. */
static size_t snap_open(const rollup_t *r, const sstate_t *s, uint8_t *out)
{
    size_t n = 0;
    int64_t prev_ts = 0;
    out[n++] = STATE_COMPACT;
    for (size_t i = 0; i < r->rs.n; i++)
        if (open_is(s, i)) {
            rollup_bucket_t b = open_get(r, s, i);
            n += put_state_compact(out + n, r->rs.v[i].res_ms, &b, &prev_ts);
        }
    if (s->pend) {
        rollup_bucket_t pb = {.ts = s->pend_t, .count = 1, .last = s->pend_v};
        n += put_state_compact(out + n, PENDING_RES_MS, &pb, &prev_ts);
    }
    assert(n <= STATE_OPEN_MAX);
    return n > 1 ? n : 0;
}

/* The entries of a rollup_state.open value, in either layout. */
typedef struct {
    const uint8_t *p, *end;
    bool compact;
    int64_t prev_ts;
} state_iter_t;

static state_iter_t state_iter_start(const uint8_t *p, size_t len)
{
    state_iter_t it = {.p = p, .end = p + len};
    if (len > 0 && p[0] == STATE_COMPACT) {
        it.compact = true;
        it.p++;
    }
    return it;
}

/* 1: an entry; 0: no more; -1: malformed (the rest is skipped). */
static int state_iter_next(state_iter_t *it, int64_t *res_ms, rollup_bucket_t *b)
{
    if (!it->p || it->p >= it->end)
        return 0;
    if (it->compact) {
        if (get_state_compact(&it->p, it->end, &it->prev_ts, res_ms, b) != 0) {
            it->p = it->end;
            return -1;
        }
        return 1;
    }
    if (it->end - it->p < STATE_ENTRY_BYTES) {
        it->p = it->end;
        return 0; /* as before: a short tail is ignored */
    }
    get_state_entry(it->p, res_ms, b);
    it->p += STATE_ENTRY_BYTES;
    return 1;
}

static void snaps_clear(rollup_t *r)
{
    r->nsnaps = 0;
    r->nevicted = 0;
    if (r->capsnaps * state_bytes(r) > KEEP_CAP_BYTES) {
        free(r->snaps);
        r->snaps = NULL;
        r->capsnaps = 0;
    }
}

/* Empties a list of closed buckets, freeing it when it grew past what a cycle usually needs. */
static void closed_clear(closed_vec_t *cv, size_t keep_bytes)
{
    cv->n = 0;
    if (cv->cap * sizeof(closed_t) > keep_bytes) {
        free(cv->v);
        cv->v = NULL;
        cv->cap = 0;
    }
}

/* ---- SQL ---------------------------------------------------------------------------------- */

#define ROLLUP_SCHEMA                                                                                                  \
    "CREATE TABLE IF NOT EXISTS rollup_blob(id INTEGER PRIMARY KEY, res INTEGER NOT NULL,"                             \
    " series_id INTEGER NOT NULL, start INTEGER NOT NULL, n INTEGER NOT NULL, data BLOB NOT NULL);"                    \
    "CREATE UNIQUE INDEX IF NOT EXISTS rollup_blob_key ON rollup_blob(res, series_id, start);"                         \
    "CREATE INDEX IF NOT EXISTS rollup_blob_start ON rollup_blob(res, start);"                                         \
    "CREATE TABLE IF NOT EXISTS rollup_recent(res INTEGER NOT NULL, series_id INTEGER NOT NULL,"                       \
    " start INTEGER NOT NULL, n INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY(res, series_id, start))"            \
    " WITHOUT ROWID;"                                                                                                  \
    "CREATE TABLE IF NOT EXISTS rollup_plain(res INTEGER NOT NULL, series_id INTEGER NOT NULL,"                        \
    " ts INTEGER NOT NULL, count INTEGER NOT NULL, sum REAL, min REAL, max REAL, last REAL,"                           \
    " increase REAL, PRIMARY KEY(res, series_id, ts)) WITHOUT ROWID;"                                                  \
    "CREATE TABLE IF NOT EXISTS rollup_state(series_id INTEGER PRIMARY KEY, last_t INTEGER NOT NULL,"                  \
    " prev REAL, prev_ok INTEGER NOT NULL, open BLOB);"                                                                \
    "CREATE VIEW IF NOT EXISTS rollup_1h AS SELECT p.series_id AS series_id, s.metric AS metric,"                      \
    " s.labels AS labels, p.ts AS ts, p.count AS count, p.sum AS sum, p.min AS min, p.max AS max,"                     \
    " p.last AS last, p.increase AS increase FROM rollup_plain p LEFT JOIN series s"                                   \
    " ON s.id = p.series_id WHERE p.res = 3600000;"

static int exec_sql(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        log_error("rollup", "sqlite", LF_S("err", msg ? msg : sqlite3_errmsg(db)), LF_S("sql", sql));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static double col_double(sqlite3_stmt *st, int i)
{
    return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

/* The statements of one writer transaction. */
typedef struct {
    sqlite3_stmt *plain, *state, *del, *seen, *close, *bsel, *bup, *rsel, *rup, *rdel;
} wst_t;

/* Appends a[0..na) and then-later b[0..nb) (each sorted by ts, repeats allowed) to out in ts
 * order, buckets of one ts merged in that order. Returns 0 or -1 (out of memory). */
static int buckets_merge(rollup_buckets_t *out, const rollup_bucket_t *a, size_t na, const rollup_bucket_t *b,
                         size_t nb)
{
    if (buckets_reserve(out, na + nb) != 0)
        return -1;
    size_t i = 0, k = 0, n0 = out->n;
    while (i < na || k < nb) {
        const rollup_bucket_t *next = k >= nb || (i < na && a[i].ts <= b[k].ts) ? &a[i++] : &b[k++];
        if (out->n > n0 && out->v[out->n - 1].ts == next->ts)
            bucket_merge(&out->v[out->n - 1], next);
        else
            out->v[out->n++] = *next;
    }
    return 0;
}

/* Decodes the row `sel` finds for (res, id, start) into out (nothing if there is none; a corrupt
 * one is logged and replaced by what is written next). *found: there was a row. Returns 0 or -1. */
static int blob_load(rollup_t *r, sqlite3_stmt *sel, int64_t res, uint64_t id, int64_t start, rollup_buckets_t *out,
                     bool *found)
{
    sqlite3_bind_int64(sel, 1, res);
    sqlite3_bind_int64(sel, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(sel, 3, start);
    int rc = sqlite3_step(sel);
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW && blob_decode(&r->wcodec, sqlite3_column_blob(sel, 0), (size_t)sqlite3_column_bytes(sel, 0),
                                        start, res, span_of(res), out) != 0) {
        log_error("rollup", "corrupt blob replaced", LF_I("series", id), LF_I("start", start));
        out->n = 0;
    }
    sqlite3_reset(sel);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

/* Runs `st` (a statement without results) for the row key (res, id, start) as ?1..?3. Returns 0
 * or -1. */
static int key_exec(sqlite3_stmt *st, int64_t res, uint64_t id, int64_t start)
{
    sqlite3_bind_int64(st, 1, res);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(st, 3, start);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Encodes b into the row `up` writes for (res, id, start). Returns 0 or -1. */
static int blob_store(rollup_t *r, sqlite3_stmt *up, int64_t res, uint64_t id, int64_t start,
                      const rollup_buckets_t *b, bool squeeze, buf_t *enc)
{
    blob_encode(&r->wcodec, enc, b->v, b->n, start, res, span_of(res), squeeze);
    sqlite3_bind_int64(up, 1, res);
    sqlite3_bind_int64(up, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(up, 3, start);
    sqlite3_bind_int64(up, 4, (sqlite3_int64)b->n);
    sqlite3_bind_blob(up, 5, enc->data, (int)enc->len, SQLITE_STATIC);
    int rc = sqlite3_step(up);
    sqlite3_reset(up);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Is it time to fold a span's recent row, whose newest bucket is in `slot`, into the blob? At the
 * span's last slot (a finished span is one row), when the recent row has grown to 2 FOLD_SLOTS
 * buckets (a series with gaps), and otherwise once per FOLD_SLOTS slots at a phase of the id's
 * run: a minute then rewrites the blobs of 1/FOLD_SLOTS of the runs, which the span's first
 * write laid out next to each other in the table (write_inflight goes in id order). */
static bool fold_due(uint64_t id, int64_t slot, int64_t span, size_t nrecent)
{
    uint64_t phase = (id / SHARD_RUN) % FOLD_SLOTS;
    return slot == span - 1 || nrecent >= 2 * FOLD_SLOTS || ((uint64_t)slot + phase) % FOLD_SLOTS == FOLD_SLOTS - 1;
}

/* Writes buckets c[0..n) (same id, resolution, span; sorted by ts, seq): merged into the span's
 * rollup_recent row, or, when fold_due, together with that row into the span's blob (the recent
 * row deleted). */
static int write_blob_group(rollup_t *r, const wst_t *w, const closed_t *c, size_t n, int64_t start, buf_t *enc)
{
    int64_t res = r->rs.v[c[0].res_idx].res_ms;
    uint64_t id = c[0].id;
    rollup_buckets_t fresh = {0}, recent = {0}, have = {0}, m = {0};
    bool had_recent, had_blob;
    int ret = -1;
    if (buckets_reserve(&fresh, n) != 0)
        goto out;
    for (size_t i = 0; i < n; i++)
        fresh.v[fresh.n++] = c[i].b;
    if (blob_load(r, w->rsel, res, id, start, &recent, &had_recent) != 0 ||
        buckets_merge(&m, recent.v, recent.n, fresh.v, fresh.n) != 0)
        goto out;
    int64_t slot = (c[n - 1].b.ts - start) / res;
    if (!fold_due(id, slot, span_of(res), m.n)) {
        ret = blob_store(r, w->rup, res, id, start, &m, false, enc);
        goto out;
    }
    if (blob_load(r, w->bsel, res, id, start, &have, &had_blob) != 0)
        goto out;
    recent.n = 0;
    if (buckets_merge(&recent, have.v, have.n, m.v, m.n) != 0 ||
        blob_store(r, w->bup, res, id, start, &recent, blob_squeeze(res), enc) != 0)
        goto out;
    if (had_recent && key_exec(w->rdel, res, id, start) != 0)
        goto out;
    ret = 0;
out:
    rollup_buckets_free(&fresh);
    rollup_buckets_free(&recent);
    rollup_buckets_free(&have);
    rollup_buckets_free(&m);
    return ret;
}

static int bind_double(sqlite3_stmt *st, int i, double v)
{
    return isnan(v) ? sqlite3_bind_null(st, i) : sqlite3_bind_double(st, i, v);
}

static int write_plain(rollup_t *r, sqlite3_stmt *st, const closed_t *c)
{
    sqlite3_bind_int64(st, 1, r->rs.v[c->res_idx].res_ms);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)c->id);
    sqlite3_bind_int64(st, 3, c->b.ts);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)c->b.count);
    bind_double(st, 5, c->b.sum);
    bind_double(st, 6, c->b.min);
    bind_double(st, 7, c->b.max);
    bind_double(st, 8, c->b.last);
    bind_double(st, 9, c->b.increase);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* The inflight buckets of every shard, merged into (id, res_idx, ts) order (rows arriving in key
 * order fill SQLite's b-trees best and touch each page once): per series, resolution and blob
 * span, one blob merge (and, for 1h, the plain rows). A series' buckets are all in one shard. */
static int write_inflight(rollup_t *r, const wst_t *w, buf_t *enc)
{
    size_t pos[SHARDS] = {0};
    for (;;) {
        const closed_vec_t *cv = NULL;
        size_t sk = 0;
        for (size_t k = 0; k < SHARDS; k++) {
            const closed_vec_t *x = &r->shards[k].inflight;
            if (pos[k] < x->n && (!cv || closed_cmp(&x->v[pos[k]], &cv->v[pos[sk]]) < 0)) {
                cv = x;
                sk = k;
            }
        }
        if (!cv)
            return 0;
        const closed_t *c = cv->v;
        size_t i = pos[sk], n = cv->n;
        int64_t res = r->rs.v[c[i].res_idx].res_ms, span = res * span_of(res);
        int64_t start = floor_to(c[i].b.ts, span);
        size_t k = i + 1;
        while (k < n && c[k].id == c[i].id && c[k].res_idx == c[i].res_idx && c[k].b.ts < start + span)
            k++;
        /* 1h: rows and blob alike. (Before blob_from, the blob may hold only the late part of
         * an hour until migrate_step copies the row over it; readers use the row until then.) */
        if (has_plain(r, c[i].res_idx))
            for (size_t x = i; x < k; x++)
                if (write_plain(r, w->plain, &c[x]) != 0)
                    return -1;
        if (write_blob_group(r, w, &c[i], k - i, start, enc) != 0)
            return -1;
        pos[sk] = k;
    }
}

static void wst_finalize(wst_t *w)
{
    sqlite3_finalize(w->plain);
    sqlite3_finalize(w->state);
    sqlite3_finalize(w->del);
    sqlite3_finalize(w->seen);
    sqlite3_finalize(w->close);
    sqlite3_finalize(w->bsel);
    sqlite3_finalize(w->bup);
    sqlite3_finalize(w->rsel);
    sqlite3_finalize(w->rup);
    sqlite3_finalize(w->rdel);
    *w = (wst_t){0};
}

static int wst_prepare(sqlite3 *db, wst_t *w)
{
    *w = (wst_t){0};
    if (sqlite3_prepare_v2(db,
                           "INSERT INTO rollup_plain(res, series_id, ts, count, sum, min, max, last, increase)"
                           " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET"
                           " count = count + excluded.count, sum = sum + excluded.sum,"
                           " min = min(coalesce(min, excluded.min), coalesce(excluded.min, min)),"
                           " max = max(coalesce(max, excluded.max), coalesce(excluded.max, max)),"
                           " last = excluded.last, increase = increase + excluded.increase",
                           -1, &w->plain, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT OR REPLACE INTO rollup_state(series_id, last_t, prev, prev_ok, open)"
                           " VALUES(?, ?, ?, ?, ?)",
                           -1, &w->state, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "DELETE FROM rollup_state WHERE series_id = ?", -1, &w->del, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "UPDATE series SET last_seen = max(last_seen, ?1) WHERE id = ?2", -1, &w->seen, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "UPDATE series SET last_seen = CASE WHEN last_seen = ?3 THEN ?1 ELSE max(last_seen, ?1) END"
                           " WHERE id = ?2",
                           -1, &w->close, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT data FROM rollup_blob WHERE res = ? AND series_id = ? AND start = ?", -1,
                           &w->bsel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT INTO rollup_blob(res, series_id, start, n, data) VALUES(?, ?, ?, ?, ?)"
                           " ON CONFLICT DO UPDATE SET n = excluded.n, data = excluded.data",
                           -1, &w->bup, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT data FROM rollup_recent WHERE res = ? AND series_id = ? AND start = ?", -1,
                           &w->rsel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT OR REPLACE INTO rollup_recent(res, series_id, start, n, data) VALUES(?, ?, ?, ?, ?)",
                           -1, &w->rup, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "DELETE FROM rollup_recent WHERE res = ? AND series_id = ? AND start = ?", -1,
                           &w->rdel, NULL) != SQLITE_OK) {
        log_error("rollup", "write failed", LF_S("err", sqlite3_errmsg(db)));
        wst_finalize(w);
        return -1;
    }
    return 0;
}

/* The snapshots and evictions taken so far (one shard's, see rollup_flush) into the open
 * transaction; they are cleared either way.
 *
 * The series table's last_seen: a series with a state in memory is marked CATALOG_SEEN_OPEN
 * once (its first snapshot after its catalog row is committed; every snapshot with `all`, after
 * a cycle rolled back), and given its newest sample's time when the state is evicted, in the
 * transaction that deletes its rollup_state row. Writing the newest time at every snapshot, as
 * before, rewrote every page of the series table (~1 KB per series: 250 MB at 256k series) plus
 * its WAL copy at every minute boundary; that write burst also held up the fsync of anything else
 * on the disk (a flow-control change's commit waited 100-250 ms behind it). Readers need no
 * change: `last_seen >= mint` holds for an open series, and a crash keeps the mark and the state
 * row together (both in one transaction), so the reloaded state closes it when it is evicted. */
static int write_snaps(rollup_t *r, sqlite3 *db, const wst_t *w, bool all)
{
    int ret = -1;
    for (size_t i = 0; i < r->nsnaps; i++) {
        const sstate_t *sn = (const sstate_t *)(const void *)(r->snaps + i * state_bytes(r));
        uint8_t open[STATE_OPEN_MAX];
        size_t nopen = snap_open(r, sn, open);
        sqlite3_bind_int64(w->state, 1, (sqlite3_int64)sn->id);
        sqlite3_bind_int64(w->state, 2, sn->last_t);
        sqlite3_bind_double(w->state, 3, sn->prev_ok ? sn->prev : 0);
        sqlite3_bind_int(w->state, 4, sn->prev_ok);
        if (nopen)
            sqlite3_bind_blob(w->state, 5, open, (int)nopen, SQLITE_STATIC);
        else
            sqlite3_bind_null(w->state, 5);
        int rc = sqlite3_step(w->state);
        sqlite3_reset(w->state);
        if (rc != SQLITE_DONE)
            goto out;
        if (sn->seen_open && !all)
            continue;
        sqlite3_bind_int64(w->seen, 1, CATALOG_SEEN_OPEN);
        sqlite3_bind_int64(w->seen, 2, (sqlite3_int64)sn->id);
        rc = sqlite3_step(w->seen);
        sqlite3_reset(w->seen);
        if (rc != SQLITE_DONE)
            goto out;
    }
    for (size_t i = 0; i < r->nevicted; i++) {
        sqlite3_bind_int64(w->del, 1, (sqlite3_int64)r->evicted[i].id);
        int rc = sqlite3_step(w->del);
        sqlite3_reset(w->del);
        if (rc != SQLITE_DONE)
            goto out;
        sqlite3_bind_int64(w->close, 1, r->evicted[i].seen_t);
        sqlite3_bind_int64(w->close, 2, (sqlite3_int64)r->evicted[i].id);
        sqlite3_bind_int64(w->close, 3, CATALOG_SEEN_OPEN);
        rc = sqlite3_step(w->close);
        sqlite3_reset(w->close);
        if (rc != SQLITE_DONE)
            goto out;
    }
    ret = 0;
out:
    if (ret != 0)
        log_error("rollup", "write failed", LF_S("err", sqlite3_errmsg(db)));
    r->nsnaps = r->nevicted = 0; /* the buffers stay for the next shard; rollup_flush frees them */
    return ret;
}

/* ---- migrating 1h rows into blobs ------------------------------------------------------------ */

#define MIGRATE_BUDGET 16 /* series per writer cycle */

/* One slice of copying the 1h rows older than blob_from into blobs (a database from before 1h
 * blobs): up to `budget` series in one transaction. For each, every 30-day blob gets the rows'
 * buckets before blob_from (there the rows are authoritative: what the writer merged into a blob
 * meanwhile, a late part of an old hour, is in the row too) and keeps its own from blob_from on.
 * After the last series, blob_from becomes INT64_MIN in meta and, after the COMMIT, for readers,
 * who until then read those hours from the rows. A crash only loses the cursor: copying a series
 * again gives the same blobs. cycle_mu held. Returns 0 or -1. */
static int migrate_step(rollup_t *r, int budget)
{
    int64_t from = atomic_load(&r->blob_from);
    if (from == INT64_MIN)
        return 0;
    const int64_t res = PLAIN_RES_MS, span = res * span_of(res);
    catalog_t *cat = r->cat;
    sqlite3 *db = catalog__write_db(cat);
    sqlite3_stmt *next = NULL, *rows = NULL, *sel = NULL, *up = NULL, *done = NULL, *rsel = NULL, *rdel = NULL;
    rollup_buckets_t rw = {0}, m = {0}, rec = {0}, all = {0};
    buf_t enc = BUF_INIT;
    uint64_t cursor = r->mig_cursor;
    bool finished = false;
    int ret = -1;
    catalog__write_lock(cat);
    if (sqlite3_prepare_v2(db, "SELECT min(series_id) FROM rollup_plain WHERE res = ?1 AND series_id > ?2", -1, &next,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT ts, count, sum, min, max, last, increase FROM rollup_plain WHERE res = ?1"
                           " AND series_id = ?2 AND ts < ?3 ORDER BY ts",
                           -1, &rows, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT data FROM rollup_blob WHERE res = ?1 AND series_id = ?2 AND start = ?3", -1,
                           &sel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT INTO rollup_blob(res, series_id, start, n, data) VALUES(?1, ?2, ?3, ?4, ?5)"
                           " ON CONFLICT DO UPDATE SET n = excluded.n, data = excluded.data",
                           -1, &up, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO meta(key, value) VALUES('" META_BLOB_FROM "', ?1)", -1, &done,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT data FROM rollup_recent WHERE res = ?1 AND series_id = ?2 AND start = ?3", -1,
                           &rsel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "DELETE FROM rollup_recent WHERE res = ?1 AND series_id = ?2 AND start = ?3", -1,
                           &rdel, NULL) != SQLITE_OK ||
        exec_sql(db, "BEGIN IMMEDIATE") != 0)
        goto out;
    int rc = SQLITE_DONE;
    for (int visited = 0; visited < budget && rc == SQLITE_DONE; visited++) {
        sqlite3_bind_int64(next, 1, res);
        sqlite3_bind_int64(next, 2, (sqlite3_int64)cursor);
        rc = sqlite3_step(next);
        bool none = rc != SQLITE_ROW || sqlite3_column_type(next, 0) == SQLITE_NULL;
        if (!none)
            cursor = (uint64_t)sqlite3_column_int64(next, 0);
        sqlite3_reset(next);
        if (rc != SQLITE_ROW)
            break;
        rc = SQLITE_DONE;
        if (none) {
            finished = true;
            break;
        }
        sqlite3_bind_int64(rows, 1, res);
        sqlite3_bind_int64(rows, 2, (sqlite3_int64)cursor);
        sqlite3_bind_int64(rows, 3, from);
        rw.n = 0;
        while ((rc = sqlite3_step(rows)) == SQLITE_ROW) {
            if (buckets_reserve(&rw, 1) != 0) {
                rc = SQLITE_NOMEM;
                break;
            }
            rw.v[rw.n++] = (rollup_bucket_t){.ts = sqlite3_column_int64(rows, 0),
                                             .count = (uint64_t)sqlite3_column_int64(rows, 1),
                                             .sum = col_double(rows, 2),
                                             .min = col_double(rows, 3),
                                             .max = col_double(rows, 4),
                                             .last = col_double(rows, 5),
                                             .increase = col_double(rows, 6)};
        }
        sqlite3_reset(rows);
        for (size_t i = 0; rc == SQLITE_DONE && i < rw.n;) {
            int64_t start = floor_to(rw.v[i].ts, span);
            size_t k = i;
            while (k < rw.n && rw.v[k].ts < start + span)
                k++;
            m.n = 0;
            if (buckets_reserve(&m, k - i) != 0) {
                rc = SQLITE_NOMEM;
                break;
            }
            memcpy(m.v, rw.v + i, (k - i) * sizeof(*m.v));
            m.n = k - i;
            sqlite3_bind_int64(sel, 1, res);
            sqlite3_bind_int64(sel, 2, (sqlite3_int64)cursor);
            sqlite3_bind_int64(sel, 3, start);
            if ((rc = sqlite3_step(sel)) == SQLITE_ROW) {
                size_t n0 = m.n;
                if (blob_decode(&r->wcodec, sqlite3_column_blob(sel, 0), (size_t)sqlite3_column_bytes(sel, 0), start,
                                res, span_of(res), &m) != 0) {
                    m.n = n0;
                } else { /* keep the blob's hours from blob_from on (they follow the rows') */
                    size_t w = n0;
                    for (size_t x = n0; x < m.n; x++)
                        if (m.v[x].ts >= from)
                            m.v[w++] = m.v[x];
                    m.n = w;
                }
                rc = SQLITE_DONE;
            }
            sqlite3_reset(sel);
            if (rc != SQLITE_DONE)
                break;
            /* The span's recent row goes into the blob too, from blob_from on like the blob's:
             * a re-opened hour's late part is there, and the row copied above holds all of it. */
            bool had_recent;
            rec.n = 0;
            all.n = 0;
            if (blob_load(r, rsel, res, cursor, start, &rec, &had_recent) != 0) {
                rc = SQLITE_ERROR;
                break;
            }
            size_t w = 0;
            for (size_t x = 0; x < rec.n; x++)
                if (rec.v[x].ts >= from)
                    rec.v[w++] = rec.v[x];
            rec.n = w;
            if (buckets_merge(&all, m.v, m.n, rec.v, rec.n) != 0) {
                rc = SQLITE_NOMEM;
                break;
            }
            rc = blob_store(r, up, res, cursor, start, &all, blob_squeeze(res), &enc) == 0 ? SQLITE_DONE : SQLITE_ERROR;
            if (rc == SQLITE_DONE && had_recent && key_exec(rdel, res, cursor, start) != 0)
                rc = SQLITE_ERROR;
            i = k;
        }
    }
    if (rc == SQLITE_DONE && finished) {
        sqlite3_bind_int64(done, 1, INT64_MIN);
        rc = sqlite3_step(done);
    }
    if (rc != SQLITE_DONE || exec_sql(db, "COMMIT") != 0) {
        log_warn("rollup", "copying old 1h rows into blobs failed; will retry", LF_S("err", sqlite3_errmsg(db)));
        exec_sql(db, "ROLLBACK");
        goto out;
    }
    r->mig_cursor = cursor;
    if (finished) {
        pthread_rwlock_wrlock(&r->view_rw);
        atomic_store(&r->blob_from, INT64_MIN);
        atomic_fetch_add(&r->disk_gen, 1); /* an older snapshot lacks the last series' blobs */
        pthread_rwlock_unlock(&r->view_rw);
        r->mig_cursor = 0;
        log_info("rollup", "old 1h rows copied into blobs");
    }
    ret = 0;
out:
    catalog__write_unlock(cat);
    sqlite3_finalize(next);
    sqlite3_finalize(rows);
    sqlite3_finalize(sel);
    sqlite3_finalize(up);
    sqlite3_finalize(done);
    sqlite3_finalize(rsel);
    sqlite3_finalize(rdel);
    rollup_buckets_free(&rw);
    rollup_buckets_free(&m);
    rollup_buckets_free(&rec);
    rollup_buckets_free(&all);
    buf_free(&enc);
    return ret;
}

/* ---- the writer cycle --------------------------------------------------------------------- */

static size_t inflight_count(const rollup_t *r)
{
    size_t n = 0;
    for (size_t k = 0; k < SHARDS; k++)
        n += r->shards[k].inflight.n;
    return n;
}

/* Writer, shard locked: the first n entries of the closed list leave it (they are inflight now). */
static void closed_drop_front(shard_t *sh, size_t n)
{
    closed_vec_t *cv = &sh->closed;
    assert(n <= cv->n);
    memmove(cv->v, cv->v + n, (cv->n - n) * sizeof(*cv->v));
    cv->n -= n;
    sh->closed_base += (uint32_t)n; /* positions stay: links into the taken part go stale */
    if (cv->n == 0)
        closed_clear(cv, KEEP_CAP_BYTES / SHARDS);
}

/* Writer: the shard's taken closed buckets (take: m + n entries, the first m free, the n taken
 * after them) sorted and merged with what is still inflight (after a failed cycle) into its new
 * inflight. After a bulk load that is hundreds of thousands of buckets per shard, a sort of
 * tens of milliseconds: it runs without the shard lock, the taken buckets still in the closed
 * list for readers, and only the exchange holds the lock. */
static void shard_take_in(shard_t *sh, closed_t *take, size_t n)
{
    /* inflight is read without the lock: only the writer thread (cycle_mu) changes it. */
    size_t m = sh->inflight.n;
    qsort(take + m, n, sizeof(*take), closed_cmp);
    /* Merge from the front into the free room before the new run: the write position never
     * passes the next unread entry of the run. */
    const closed_t *a = sh->inflight.v;
    size_t ia = 0, ib = m, w = 0;
    while (ia < m && ib < m + n)
        take[w++] = closed_cmp(&a[ia], &take[ib]) <= 0 ? a[ia++] : take[ib++];
    while (ia < m)
        take[w++] = a[ia++];
    pthread_mutex_lock(&sh->mu);
    free(sh->inflight.v);
    sh->inflight = (closed_vec_t){.v = take, .n = n + m, .cap = n + m};
    closed_drop_front(sh, n);
    sh->taking = sh->orphans = false; /* evictions happen only in the writer's sweep, before its take */
    pthread_mutex_unlock(&sh->mu);
}

int rollup__flush_some(rollup_t *r, bool checkpoint, size_t catalog_max, bool *rows_only)
{
    pthread_mutex_lock(&r->cycle_mu);
    bool all = r->force_checkpoint; /* after a failed cycle, whose snapshots were lost */
    /* 1. Buckets of series that went quiet: close once the newest sample is a full resolution
     *    past their end; evict states with nothing open. */
    int64_t hw = atomic_load(&r->high_water);
    int64_t before[ROLLUP_MAX_RESOLUTIONS];
    for (size_t i = 0; i < r->rs.n; i++)
        before[i] = hw == INT64_MIN ? INT64_MIN : hw - r->rs.v[i].res_ms;

    /* One transaction. Readers still see `inflight` until the COMMIT below. */
    catalog_t *cat = r->cat;
    sqlite3 *db = catalog__write_db(cat);
    catalog__write_lock(cat);
    size_t old_inflight = inflight_count(r);
    wst_t w = {0};
    int rc = exec_sql(db, "BEGIN IMMEDIATE");
    size_t left = 0; /* rows queued before this cycle that it leaves for the next */
    if (rc == 0)
        rc = catalog__write_pending(cat, catalog_max, &left);
    bool slice = rc == 0 && left > 0;
    *rows_only = slice;
    if (rc == 0 && !slice)
        rc = wst_prepare(db, &w);

    /* 2. Per shard, under its lock only: the closed list is copied (the take) and the states
     *    are snapshotted; the take is sorted into the shard's inflight outside the lock, and the
     *    snapshots go into the transaction before the next shard is taken. Snapshotting every
     *    shard first held a copy of every state that closed a bucket: after a minute boundary,
     *    all of them (~40 MB at 256k series) for the whole cycle. A state's snapshot and its
     *    shard's take are still made in one hold of the shard lock, so a checkpointed open
     *    bucket is never also on disk. A failed transaction takes nothing: what is closed waits
     *    in the closed lists for the next cycle. */
    for (size_t k = 0; k < SHARDS && rc == 0 && !slice; k++) {
        shard_t *sh = &r->shards[k];
        pthread_mutex_lock(&sh->mu);
        if (hw != INT64_MIN && r->sweep_every_state)
            shard_sweep_all(r, sh, before, true);
        else if (hw != INT64_MIN)
            shard_sweep_due(r, sh, hw, before);
        /* A walk over every state only to checkpoint (every checkpoint interval, or after a failed
         * cycle); otherwise the states to snapshot are the ones that closed a bucket, which are
         * the series of the closed list. */
        bool walk = all || checkpoint || sh->snap_all || r->sweep_every_state;
        for (size_t j = 0; j < sh->closed.n; j++) {
            const closed_t *c = &sh->closed.v[j];
            /* Evictions happen only in this sweep: a state of this id is the one that closed c. */
            sstate_t *st = state_find(sh, c->id);
            if (!st)
                continue; /* evicted just now: its row is deleted instead */
            /* It will be on disk: a state that knows its disk_lo must stay a lower bound. */
            if (st->disk_known && c->b.ts < disk_lo_get(r, st, c->res_idx))
                disk_lo_set(r, st, c->res_idx, c->b.ts);
            if (!walk && st->closed)
                snap_state(r, st);
        }
        size_t n = sh->closed.n, m = sh->inflight.n;
        closed_t *take = n ? malloc((m + n) * sizeof(*take)) : NULL;
        if (take) {
            memcpy(take + m, sh->closed.v, n * sizeof(*take));
            sh->taking = true;
        } else if (n) {
            log_error("rollup", "out of memory; buckets dropped", LF_I("buckets", n));
            closed_drop_front(sh, n);
            sh->orphans = false;
            n = 0;
        }
        for (size_t b = 0; walk && b < sh->nbuckets; b++) {
            for (sstate_t *s = sh->tab[b]; s; s = s->next) {
                if (s->closed || all || (checkpoint && s->dirty))
                    snap_state(r, s);
            }
        }
        sh->snap_all = false;
        pthread_mutex_unlock(&sh->mu);
        if (n)
            shard_take_in(sh, take, n);
        rc = write_snaps(r, db, &w, all);
    }
    /* 3. Every shard's inflight buckets, in key order. */
    if (rc == 0 && !slice) {
        buf_t enc = BUF_INIT;
        rc = write_inflight(r, &w, &enc);
        if (rc != 0)
            log_error("rollup", "write failed", LF_S("err", sqlite3_errmsg(db)));
        buf_free(&enc);
    }
    wst_finalize(&w);
    /* 4. COMMIT and forget inflight atomically for readers. */
    pthread_rwlock_wrlock(&r->view_rw);
    if (rc == 0)
        rc = exec_sql(db, "COMMIT");
    if (rc == 0 && slice) {
        /* rows only: inflight (a failed cycle's buckets) stays for the cycle that writes it */
    } else if (rc == 0) {
        atomic_fetch_add(&r->st_written, inflight_count(r));
        for (size_t k = 0; k < SHARDS; k++)
            closed_clear(&r->shards[k].inflight, KEEP_CAP_BYTES / SHARDS);
        atomic_fetch_add(&r->disk_gen, 1); /* readers' older snapshots lack what inflight held */
        r->force_checkpoint = false;
    } else {
        int ecode = sqlite3_errcode(db) & 0xff; /* before ROLLBACK replaces it */
        exec_sql(db, "ROLLBACK");
        /* inflight stays for the next cycle; states may have moved on, so rewrite all of them. */
        r->force_checkpoint = true;
        atomic_fetch_add(&r->st_flush_errors, 1);
        if (ecode == SQLITE_BUSY || ecode == SQLITE_LOCKED)
            log_warn("rollup", "database locked by another process (busy timeout 10s); roll-ups wait in memory",
                     LF_S("path", catalog_path(cat)));
        log_warn("rollup", "flush failed; will retry", LF_I("buckets", inflight_count(r)),
                 LF_I("carried", old_inflight));
    }
    pthread_rwlock_unlock(&r->view_rw);
    catalog__settle_pending(cat, rc == 0);
    catalog__write_unlock(cat);
    snaps_clear(r);
    /* 5. A slice of copying a pre-blob database's old 1h rows into blobs, if any are left. */
    if (rc == 0 && !slice)
        migrate_step(r, MIGRATE_BUDGET);
    atomic_fetch_add(&r->st_flushes, 1);
    pthread_mutex_unlock(&r->cycle_mu);
    return rc;
}

int rollup_flush(rollup_t *r, bool checkpoint)
{
    bool rows_only;
    return rollup__flush_some(r, checkpoint, 0, &rows_only);
}

/* ---- retention -------------------------------------------------------------------------- */

/* Statements of a 1h retention slice (phase 1). */
typedef struct {
    sqlite3_stmt *next, *rows, *whole, *sel, *up, *del;
} retst_t;

/* Phase 1 for one series of the 1h resolution: rows older than cutoff, blobs wholly older, and
 * the blob straddling the cutoff rewritten without its expired hours (deleted once all are), so
 * 1h reads agree with the rows and the view, as before 1h blobs. That rewrite is one blob of at
 * most 720 buckets per series per pass: about the page the row delete dirties anyway. */
static int retain_series(rollup_t *r, retst_t *q, uint64_t id, int64_t res, int64_t cutoff, buf_t *enc)
{
    int64_t span = res * span_of(res);
    sqlite3_bind_int64(q->rows, 1, res);
    sqlite3_bind_int64(q->rows, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(q->rows, 3, cutoff);
    int rc = sqlite3_step(q->rows);
    sqlite3_reset(q->rows);
    if (rc != SQLITE_DONE)
        return -1;
    sqlite3_bind_int64(q->whole, 1, res);
    sqlite3_bind_int64(q->whole, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(q->whole, 3, cutoff - span);
    rc = sqlite3_step(q->whole);
    sqlite3_reset(q->whole);
    if (rc != SQLITE_DONE)
        return -1;
    sqlite3_bind_int64(q->sel, 1, res);
    sqlite3_bind_int64(q->sel, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(q->sel, 3, cutoff - span);
    sqlite3_bind_int64(q->sel, 4, cutoff);
    rollup_buckets_t b = {0};
    int64_t start = 0;
    bool found = false;
    rc = sqlite3_step(q->sel);
    if (rc == SQLITE_ROW) {
        found = true;
        start = sqlite3_column_int64(q->sel, 0);
        if (blob_decode(&r->wcodec, sqlite3_column_blob(q->sel, 1), (size_t)sqlite3_column_bytes(q->sel, 1), start, res,
                        span_of(res), &b) != 0)
            b.n = 0; /* corrupt: deleted below like an expired one */
        rc = SQLITE_DONE;
    }
    sqlite3_reset(q->sel);
    if (rc != SQLITE_DONE) {
        rollup_buckets_free(&b);
        return -1;
    }
    size_t e = 0;
    while (e < b.n && b.v[e].ts < cutoff)
        e++;
    int ret = 0;
    if (found) {
        sqlite3_stmt *st = NULL;
        if (e == b.n) {
            st = q->del;
            sqlite3_bind_int64(st, 1, res);
            sqlite3_bind_int64(st, 2, (sqlite3_int64)id);
            sqlite3_bind_int64(st, 3, start);
        } else if (e > 0) {
            blob_encode(&r->wcodec, enc, b.v + e, b.n - e, start, res, span_of(res), blob_squeeze(res));
            st = q->up;
            sqlite3_bind_int64(st, 1, (sqlite3_int64)(b.n - e));
            sqlite3_bind_blob(st, 2, enc->data, (int)enc->len, SQLITE_STATIC);
            sqlite3_bind_int64(st, 3, res);
            sqlite3_bind_int64(st, 4, (sqlite3_int64)id);
            sqlite3_bind_int64(st, 5, start);
        }
        if (st) {
            if (sqlite3_step(st) != SQLITE_DONE)
                ret = -1;
            sqlite3_reset(st);
        }
    }
    rollup_buckets_free(&b);
    return ret;
}

int rollup_enforce_retention(rollup_t *r, int64_t now_ms, int budget)
{
    pthread_mutex_lock(&r->cycle_mu);
    catalog_t *cat = r->cat;
    sqlite3 *db = catalog__write_db(cat);
    int ret = 0;
    catalog__write_lock(cat);
    if (r->ret_res >= r->rs.n) {
        r->ret_res = 0;
        r->ret_phase = 0;
        r->ret_cursor = 0;
    }
    size_t i = r->ret_res;
    int64_t res = r->rs.v[i].res_ms;
    int64_t cutoff = now_ms - r->rs.v[i].retention_ms; /* buckets with ts < cutoff go */
    int64_t span = res * span_of(res);
    /* From now on, readers skip what this pass deletes (whole blobs can only go later). */
    int64_t seen = atomic_load(&r->ret_cutoff[i]);
    while (cutoff > seen && !atomic_compare_exchange_weak(&r->ret_cutoff[i], &seen, cutoff))
        ;
    sqlite3_stmt *st = NULL;
    retst_t q = {0};
    buf_t enc = BUF_INIT;
    if (r->ret_phase == 0) {
        /* Whole blobs only: a blob goes once its last slot is past retention. The (res, start)
         * index makes this a bounded range delete. */
        if (sqlite3_prepare_v2(db,
                               "DELETE FROM rollup_blob WHERE id IN (SELECT id FROM rollup_blob"
                               " WHERE res = ?1 AND start <= ?2 LIMIT ?3)",
                               -1, &st, NULL) != SQLITE_OK) {
            ret = -1;
            goto out;
        }
        sqlite3_bind_int64(st, 1, res);
        sqlite3_bind_int64(st, 2, cutoff - span);
        sqlite3_bind_int(st, 3, budget);
        if (sqlite3_step(st) != SQLITE_DONE) {
            ret = -1;
            goto out;
        }
        if (sqlite3_changes(db) < budget) {
            /* Then the spans' recent rows: a small table (a row per active series and
             * resolution, and those of series that stopped in a span), scanned once a pass. */
            sqlite3_finalize(st);
            st = NULL;
            if (sqlite3_prepare_v2(db, "DELETE FROM rollup_recent WHERE res = ?1 AND start <= ?2", -1, &st, NULL) !=
                SQLITE_OK) {
                ret = -1;
                goto out;
            }
            sqlite3_bind_int64(st, 1, res);
            sqlite3_bind_int64(st, 2, cutoff - span);
            if (sqlite3_step(st) != SQLITE_DONE) {
                ret = -1;
                goto out;
            }
            r->ret_cursor = 0;
            if (has_plain(r, i))
                r->ret_phase = 1;
            else
                r->ret_res++;
        }
        ret = r->ret_res < r->rs.n ? 1 : 0;
        goto out;
    }
    /* Phase 1, the 1h resolution: rows have no time index (it would double their size), so walk
     * series ids from a cursor, `budget` series per call, each a few primary-key range
     * operations. */
    if (sqlite3_prepare_v2(db, "SELECT min(series_id) FROM rollup_plain WHERE res = ?1 AND series_id > ?2", -1, &q.next,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "DELETE FROM rollup_plain WHERE res = ?1 AND series_id = ?2 AND ts < ?3", -1, &q.rows,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "DELETE FROM rollup_blob WHERE res = ?1 AND series_id = ?2 AND start <= ?3", -1,
                           &q.whole, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "SELECT start, data FROM rollup_blob WHERE res = ?1 AND series_id = ?2 AND start > ?3"
                           " AND start < ?4",
                           -1, &q.sel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "UPDATE rollup_blob SET n = ?1, data = ?2 WHERE res = ?3 AND series_id = ?4 AND start = ?5",
                           -1, &q.up, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "DELETE FROM rollup_blob WHERE res = ?1 AND series_id = ?2 AND start = ?3", -1, &q.del,
                           NULL) != SQLITE_OK) {
        ret = -1;
        goto out;
    }
    exec_sql(db, "BEGIN IMMEDIATE");
    int visited = 0;
    for (; visited < budget; visited++) {
        sqlite3_bind_int64(q.next, 1, res);
        sqlite3_bind_int64(q.next, 2, (sqlite3_int64)r->ret_cursor);
        if (sqlite3_step(q.next) != SQLITE_ROW || sqlite3_column_type(q.next, 0) == SQLITE_NULL) {
            sqlite3_reset(q.next);
            break;
        }
        r->ret_cursor = (uint64_t)sqlite3_column_int64(q.next, 0);
        sqlite3_reset(q.next);
        if (retain_series(r, &q, r->ret_cursor, res, cutoff, &enc) != 0) {
            ret = -1;
            break;
        }
    }
    if (ret == 0 && exec_sql(db, "COMMIT") != 0)
        ret = -1;
    if (ret != 0) {
        exec_sql(db, "ROLLBACK");
        goto out;
    }
    if (visited < budget) { /* this resolution is done */
        r->ret_res++;
        r->ret_phase = 0;
        r->ret_cursor = 0;
    }
    ret = r->ret_res < r->rs.n ? 1 : 0;
out:
    sqlite3_finalize(st);
    sqlite3_finalize(q.next);
    sqlite3_finalize(q.rows);
    sqlite3_finalize(q.whole);
    sqlite3_finalize(q.sel);
    sqlite3_finalize(q.up);
    sqlite3_finalize(q.del);
    buf_free(&enc);
    catalog__write_unlock(cat);
    if (ret == 0) {
        r->ret_res = 0; /* the next call starts a new pass */
        r->ret_phase = 0;
    }
    pthread_mutex_unlock(&r->cycle_mu);
    return ret;
}

/* ---- reads -------------------------------------------------------------------------------- */

void rollup_buckets_free(rollup_buckets_t *b)
{
    free(b->v);
    *b = (rollup_buckets_t){0};
}

typedef struct {
    rollup_bucket_t b;
    uint32_t seq;
} rd_t;

static int rd_cmp(const void *pa, const void *pb)
{
    const rd_t *a = pa, *b = pb;
    if (a->b.ts != b->b.ts)
        return a->b.ts < b->b.ts ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int rd_push(rd_t **v, size_t *n, size_t *cap, const rollup_bucket_t *b, uint32_t seq)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        rd_t *nv = realloc(*v, nc * sizeof(*nv));
        if (!nv)
            return -1;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = (rd_t){*b, seq};
    return 0;
}

/* Appends the buckets with ts in [mint, maxt] of the rows `st` (the rollup_blob or rollup_recent
 * select) finds for series id to out, in time order. */
static int read_rows(rollup_reader_t *rdr, sqlite3_stmt *st, uint64_t id, int64_t res, int64_t mint, int64_t maxt,
                     rollup_buckets_t *out)
{
    int64_t span = res * span_of(res);
    int rc;
    sqlite3_bind_int64(st, 1, res);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(st, 3, mint > INT64_MIN + span ? mint - span : INT64_MIN);
    sqlite3_bind_int64(st, 4, maxt);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        size_t n0 = out->n;
        int64_t start = sqlite3_column_int64(st, 0);
        if (blob_decode(&rdr->c->codec, sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1), start, res,
                        span_of(res), out) != 0) {
            log_warn("rollup", "corrupt blob skipped", LF_I("series", id), LF_I("start", start));
            continue;
        }
        if (start >= mint && start + span - 1 <= maxt)
            continue; /* the whole blob is in range */
        size_t w = n0;
        for (size_t k = n0; k < out->n; k++)
            if (out->v[k].ts >= mint && out->v[k].ts <= maxt)
                out->v[w++] = out->v[k];
        out->n = w;
    }
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Appends the stored buckets with ts in [mint, maxt] to out, in time order, through the reader's
 * connection (its transaction begun). A series' month of 1h buckets is one or two blobs: one
 * index seek and one inflate, where plain rows cost a b-tree step and seven column fetches per
 * hour. */
static int read_disk(rollup_reader_t *rdr, uint64_t id, size_t ri, int64_t mint, int64_t maxt, rollup_buckets_t *out)
{
    rollup_t *r = rdr->r;
    int64_t res = r->rs.v[ri].res_ms;
    int rc = SQLITE_DONE;
    int64_t from = atomic_load(&r->blob_from);
    if (has_plain(r, ri) && mint < from) {
        /* Hours written before this database had 1h blobs: only in rows. */
        sqlite3_stmt *st = rdr->c->plain;
        sqlite3_bind_int64(st, 1, res);
        sqlite3_bind_int64(st, 2, (sqlite3_int64)id);
        sqlite3_bind_int64(st, 3, mint);
        sqlite3_bind_int64(st, 4, maxt < from ? maxt : from - 1);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            if (buckets_reserve(out, 1) != 0) {
                rc = SQLITE_NOMEM;
                break;
            }
            out->v[out->n++] = (rollup_bucket_t){.ts = sqlite3_column_int64(st, 0),
                                                 .count = (uint64_t)sqlite3_column_int64(st, 1),
                                                 .sum = col_double(st, 2),
                                                 .min = col_double(st, 3),
                                                 .max = col_double(st, 4),
                                                 .last = col_double(st, 5),
                                                 .increase = col_double(st, 6)};
        }
        sqlite3_reset(st);
        if (rc != SQLITE_DONE)
            return -1;
        mint = from;
    }
    if (mint > maxt)
        return 0;
    size_t n0 = out->n;
    if (read_rows(rdr, rdr->c->blob, id, res, mint, maxt, out) != 0)
        return -1;
    /* The spans' recent rows (at most a few per series), merged in as the later buckets. */
    rdr->scratch.n = 0;
    if (read_rows(rdr, rdr->c->recent, id, res, mint, maxt, &rdr->scratch) != 0)
        return -1;
    if (rdr->scratch.n == 0)
        return 0;
    if (out->n == n0 || out->v[out->n - 1].ts < rdr->scratch.v[0].ts) {
        /* the usual case: the recent buckets follow the blobs' */
        if (buckets_reserve(out, rdr->scratch.n) != 0)
            return -1;
        memcpy(out->v + out->n, rdr->scratch.v, rdr->scratch.n * sizeof(*out->v));
        out->n += rdr->scratch.n;
        return 0;
    }
    rdr->merged.n = 0;
    if (buckets_merge(&rdr->merged, out->v + n0, out->n - n0, rdr->scratch.v, rdr->scratch.n) != 0 ||
        buckets_reserve(out, rdr->merged.n) != 0)
        return -1;
    memcpy(out->v + n0, rdr->merged.v, rdr->merged.n * sizeof(*out->v));
    out->n = n0 + rdr->merged.n;
    return 0;
}

/* ---- readers ----------------------------------------------------------------------------- */

#define READERS_IDLE_MAX 8 /* pooled connections kept beyond what is in use */

static void conn_free(rconn_t *c)
{
    if (!c)
        return;
    sqlite3_finalize(c->blob);
    sqlite3_finalize(c->recent);
    sqlite3_finalize(c->plain);
    sqlite3_close(c->db);
    codec_free(&c->codec);
    free(c);
}

static rconn_t *conn_open(rollup_t *r, char *err, size_t errlen)
{
    rconn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(catalog_path(r->cat), &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "open %s: %s", catalog_path(r->cat), sqlite3_errmsg(c->db));
        conn_free(c);
        return NULL;
    }
    sqlite3_busy_timeout(c->db, 10000);
    /* No mmap_size: mapping halved a read right after a bulk write, but every commit that grows
     * the file makes SQLite remap it (munmap with TLB shootdowns, then page faults again), and
     * reads after the writer's small per-second commits, the usual case, were slower with it. */
    if (sqlite3_prepare_v3(c->db,
                           "SELECT ts, count, sum, min, max, last, increase FROM rollup_plain WHERE res = ?"
                           " AND series_id = ? AND ts >= ? AND ts <= ? ORDER BY ts",
                           -1, SQLITE_PREPARE_PERSISTENT, &c->plain, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(c->db,
                           "SELECT start, data FROM rollup_blob WHERE res = ? AND series_id = ? AND start > ?"
                           " AND start <= ? ORDER BY start",
                           -1, SQLITE_PREPARE_PERSISTENT, &c->blob, NULL) != SQLITE_OK ||
        sqlite3_prepare_v3(c->db,
                           "SELECT start, data FROM rollup_recent WHERE res = ? AND series_id = ? AND start > ?"
                           " AND start <= ? ORDER BY start",
                           -1, SQLITE_PREPARE_PERSISTENT, &c->recent, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "preparing roll-up reads: %s", sqlite3_errmsg(c->db));
        conn_free(c);
        return NULL;
    }
    return c;
}

rollup_reader_t *rollup_reader_open(rollup_t *r)
{
    rollup_reader_t *rd = calloc(1, sizeof(*rd));
    if (!rd)
        return NULL;
    rd->r = r;
    pthread_mutex_lock(&r->pool_mu);
    rd->c = r->idle;
    if (rd->c) {
        r->idle = rd->c->next;
        r->nidle--;
    }
    pthread_mutex_unlock(&r->pool_mu);
    if (!rd->c) {
        char err[256];
        rd->c = conn_open(r, err, sizeof(err));
        if (!rd->c) {
            log_error("rollup", "cannot open a read connection", LF_S("err", err));
            free(rd);
            return NULL;
        }
    }
    return rd;
}

/* Ends the read transaction (releasing its snapshot, so WAL checkpoints can pass it). */
static void reader_end(rollup_reader_t *rd)
{
    if (!rd->txn)
        return;
    if (sqlite3_exec(rd->c->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        sqlite3_exec(rd->c->db, "ROLLBACK", NULL, NULL, NULL);
    rd->txn = false;
}

void rollup_reader_close(rollup_reader_t *rd)
{
    if (!rd)
        return;
    reader_end(rd);
    rollup_buckets_free(&rd->scratch);
    rollup_buckets_free(&rd->merged);
    rollup_t *r = rd->r;
    rconn_t *c = rd->c;
    pthread_mutex_lock(&r->pool_mu);
    if (r->nidle < READERS_IDLE_MAX) {
        c->next = r->idle;
        r->idle = c;
        r->nidle++;
        c = NULL;
    }
    pthread_mutex_unlock(&r->pool_mu);
    conn_free(c);
    free(rd);
}

/* View lock held shared: a transaction whose snapshot matches the current inflight. BEGIN is
 * deferred; the snapshot is taken by the first SELECT after it, under the same shared lock. */
static int reader_begin(rollup_reader_t *rd)
{
    uint64_t g = atomic_load(&rd->r->disk_gen);
    if (rd->txn && rd->gen == g)
        return 0;
    reader_end(rd);
    if (sqlite3_exec(rd->c->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
        return -1;
    rd->txn = true;
    rd->gen = g;
    return 0;
}

/* The ts of the first bucket of the first row (by start) `st` finds for series id at resolution res
 * that decodes to any, or INT64_MAX. Returns 0 or -1. */
static int first_stored(rollup_reader_t *rd, sqlite3_stmt *st, uint64_t id, int64_t res, int64_t *lo)
{
    *lo = INT64_MAX;
    sqlite3_bind_int64(st, 1, res);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)id);
    sqlite3_bind_int64(st, 3, INT64_MIN);
    sqlite3_bind_int64(st, 4, INT64_MAX);
    int rc;
    /* A corrupt row is skipped, as read_rows does. */
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        rd->scratch.n = 0;
        if (blob_decode(&rd->c->codec, sqlite3_column_blob(st, 1), (size_t)sqlite3_column_bytes(st, 1),
                        sqlite3_column_int64(st, 0), res, span_of(res), &rd->scratch) == 0 &&
            rd->scratch.n > 0) {
            *lo = rd->scratch.v[0].ts;
            break;
        }
    }
    sqlite3_reset(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

/* View lock held shared, transaction begun: per resolution, the ts of the oldest bucket of series
 * id on disk, INT64_MAX if there is none. The oldest blob and the oldest recent row are decoded
 * (a blob's start is up to a span, 30 days for 1h, before its first bucket; a series that
 * stopped early in a span has only a recent row there). Returns 0 or -1. */
static int reader_disk_lo(rollup_reader_t *rd, uint64_t id, int64_t *lo)
{
    rollup_t *r = rd->r;
    for (size_t i = 0; i < r->rs.n; i++) {
        int64_t res = r->rs.v[i].res_ms, rlo;
        if (first_stored(rd, rd->c->blob, id, res, &lo[i]) != 0 || first_stored(rd, rd->c->recent, id, res, &rlo) != 0)
            return -1;
        if (rlo < lo[i])
            lo[i] = rlo;
    }
    return 0;
}

/* Index of the first entry of a sorted inflight at or after (id, res_idx). */
static size_t inflight_find(const closed_vec_t *cv, uint64_t id, uint32_t res_idx)
{
    size_t lo = 0, hi = cv->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const closed_t *c = &cv->v[mid];
        if (c->id < id || (c->id == id && c->res_idx < res_idx))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int rollup_reader_read(rollup_reader_t *rd, uint64_t series_id, size_t res_idx, int64_t mint, int64_t maxt,
                       rollup_buckets_t *out)
{
    rollup_t *r = rd->r;
    if (res_idx >= r->rs.n)
        return -1;
    /* What the last retention pass deleted (or will, once its whole blob expires) is gone. */
    int64_t cut = atomic_load(&r->ret_cutoff[res_idx]);
    if (mint < cut)
        mint = cut;
    if (mint > maxt)
        return 0;
    /* Stored buckets go straight to out (sorted, distinct ts); the few others (waiting for the
     * writer, open, pending) are collected, sorted and merged in after. */
    rd_t *v = NULL;
    size_t n = 0, cap = 0, n0 = out->n;
    int ret = 0;
    shard_t *sh = &r->shards[shard_of(series_id)];
    pthread_rwlock_rdlock(&r->view_rw);
    /* Does memory know the disk holds nothing this old? (disk_lo is lowered when the writer
     * takes a closed bucket, before it can reach the disk.) */
    bool blobs_only = atomic_load(&r->blob_from) == INT64_MIN, skip = false, learn = false;
    pthread_mutex_lock(&sh->mu);
    sstate_t *s = state_find(sh, series_id);
    if (s && blobs_only) {
        skip = s->disk_known && disk_lo_get(r, s, res_idx) > maxt;
        learn = !s->disk_known;
    }
    pthread_mutex_unlock(&sh->mu);
    if (skip) {
        atomic_fetch_add_explicit(&r->st_mem_reads, 1, memory_order_relaxed);
    } else {
        if (reader_begin(rd) != 0 || read_disk(rd, series_id, res_idx, mint, maxt, out) != 0)
            ret = -1;
        int64_t lo[ROLLUP_MAX_RESOLUTIONS];
        if (ret == 0 && learn && out->n == n0 && reader_disk_lo(rd, series_id, lo) == 0) {
            pthread_mutex_lock(&sh->mu);
            /* The same state, or one created since by an ingest thread: disk_lo is about the
             * disk and inflight, not the state, and this state's closed buckets will lower it
             * when the writer takes them. Not while the writer sorts a take: it took that
             * state's closed buckets before the state knew, so they lowered nothing. */
            s = state_find(sh, series_id);
            if (s && !s->disk_known && !sh->taking) {
                for (size_t i = inflight_find(&sh->inflight, series_id, 0);
                     i < sh->inflight.n && sh->inflight.v[i].id == series_id; i++) {
                    const closed_t *c = &sh->inflight.v[i];
                    if (c->b.ts < lo[c->res_idx])
                        lo[c->res_idx] = c->b.ts;
                }
                s->disk_known = true;
                for (size_t i = 0; i < r->rs.n; i++)
                    disk_lo_set(r, s, i, lo[i]);
            }
            pthread_mutex_unlock(&sh->mu);
        }
    }
    /* The buckets waiting for the writer, inflight (sorted: the series' entries are one run) and
     * closed (linked from the state), under one hold of the shard lock because the writer moves
     * buckets from one to the other under it. */
    pthread_mutex_lock(&sh->mu);
    for (size_t i = inflight_find(&sh->inflight, series_id, (uint32_t)res_idx); ret == 0 && i < sh->inflight.n; i++) {
        const closed_t *c = &sh->inflight.v[i];
        if (c->id != series_id || c->res_idx != res_idx)
            break;
        if (c->b.ts >= mint && c->b.ts <= maxt && rd_push(&v, &n, &cap, &c->b, c->seq + 1) != 0)
            ret = -1;
    }
    s = state_find(sh, series_id);
    if (sh->orphans) { /* an evicted incarnation's buckets may be there too */
        for (size_t i = 0; ret == 0 && i < sh->closed.n; i++) {
            const closed_t *c = &sh->closed.v[i];
            if (c->id == series_id && c->res_idx == res_idx && c->b.ts >= mint && c->b.ts <= maxt &&
                rd_push(&v, &n, &cap, &c->b, c->seq + 1) != 0)
                ret = -1;
        }
    } else if (s) {
        for (size_t i = closed_index(sh, s->closed_last, series_id, SIZE_MAX); ret == 0 && i != SIZE_MAX;
             i = closed_index(sh, sh->closed.v[i].prev, series_id, i)) {
            const closed_t *c = &sh->closed.v[i];
            if (c->res_idx == res_idx && c->b.ts >= mint && c->b.ts <= maxt &&
                rd_push(&v, &n, &cap, &c->b, c->seq + 1) != 0)
                ret = -1;
        }
    }
    rollup_bucket_t open = {.ts = NO_BUCKET}, pendb = {.ts = NO_BUCKET};
    if (s) {
        open = open_get(r, s, res_idx);
        /* The pending sample is part of what the series has sent: show it as if committed. */
        if (s->pend && dbits(s->pend_v) != STALE_NAN_BITS) {
            int64_t pts = floor_to(s->pend_t, r->rs.v[res_idx].res_ms);
            rollup_bucket_t *b = open.ts == pts ? &open : &pendb;
            if (b == &pendb)
                bucket_start(b, pts);
            bucket_add(b, s->pend_v, increase_of(s, s->pend_v));
        }
    }
    if (ret == 0 && open.ts != NO_BUCKET && open.ts >= mint && open.ts <= maxt &&
        rd_push(&v, &n, &cap, &open, UINT32_MAX - 1) != 0)
        ret = -1;
    if (ret == 0 && pendb.ts != NO_BUCKET && pendb.ts >= mint && pendb.ts <= maxt &&
        rd_push(&v, &n, &cap, &pendb, UINT32_MAX) != 0)
        ret = -1;
    pthread_mutex_unlock(&sh->mu);
    pthread_rwlock_unlock(&r->view_rw);
    if (ret == 0 && n > 0) {
        /* Merge: disk buckets first at equal ts (they are the oldest part of a re-opened bucket),
         * then the others in arrival order. Usually all of them are newer than the disk ones
         * and this only appends. */
        if (n > 1)
            qsort(v, n, sizeof(*v), rd_cmp);
        size_t nd = out->n - n0, j = 0;
        rollup_bucket_t *d = NULL;
        if (nd && v[0].b.ts <= out->v[out->n - 1].ts) {
            d = malloc(nd * sizeof(*d));
            if (!d)
                ret = -1;
            else
                memcpy(d, out->v + n0, nd * sizeof(*d));
        } else {
            j = nd; /* disk part stays in place */
        }
        size_t i = 0;
        if (d)
            out->n = n0;
        while (ret == 0 && (j < nd || i < n)) {
            const rollup_bucket_t *next = i >= n || (j < nd && d[j].ts <= v[i].b.ts) ? &d[j++] : &v[i++].b;
            if (out->n > n0 && out->v[out->n - 1].ts == next->ts) {
                bucket_merge(&out->v[out->n - 1], next);
                continue;
            }
            if (buckets_reserve(out, 1) != 0) {
                ret = -1;
                break;
            }
            out->v[out->n++] = *next;
        }
        free(d);
    }
    free(v);
    return ret;
}

int rollup_read(rollup_t *r, uint64_t series_id, size_t res_idx, int64_t mint, int64_t maxt, rollup_buckets_t *out)
{
    rollup_reader_t *rd = rollup_reader_open(r);
    if (!rd)
        return -1;
    int rc = rollup_reader_read(rd, series_id, res_idx, mint, maxt, out);
    rollup_reader_close(rd);
    return rc;
}

/* ---- open / close / thread ---------------------------------------------------------------- */

/* Where 1h blobs begin (r->blob_from). A database written before 1h blobs existed holds its 1h
 * buckets in rollup_plain only. Opening it does not rewrite a year of rows: every 1h bucket
 * before the first hour after the newest stored row is read from the rows, and the writer copies
 * them into blobs a few series per cycle (migrate_step), then moves the boundary to INT64_MIN.
 * Buckets written from now on go to both tables. Kept in the catalog's meta table; a database
 * that starts with blobs gets INT64_MIN. Called with the write lock held. Returns 0 or -1. */
static int setup_blob_from(rollup_t *r, sqlite3 *db)
{
    sqlite3_stmt *get = NULL, *next = NULL, *last = NULL, *put = NULL;
    int ret = -1;
    if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = '" META_BLOB_FROM "'", -1, &get, NULL) != SQLITE_OK)
        goto out;
    if (sqlite3_step(get) == SQLITE_ROW) {
        atomic_store(&r->blob_from, sqlite3_column_int64(get, 0));
        ret = 0;
        goto out;
    }
    /* Newest row per series: two index seeks per series, not a scan of every row. */
    if (sqlite3_prepare_v2(db, "SELECT min(series_id) FROM rollup_plain WHERE res = ?1 AND series_id > ?2", -1, &next,
                           NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "SELECT max(ts) FROM rollup_plain WHERE res = ?1 AND series_id = ?2", -1, &last, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(db, "INSERT INTO meta(key, value) VALUES('" META_BLOB_FROM "', ?1)", -1, &put, NULL) !=
            SQLITE_OK)
        goto out;
    int64_t from = INT64_MIN, cursor = -1;
    for (;;) {
        sqlite3_bind_int64(next, 1, PLAIN_RES_MS);
        sqlite3_bind_int64(next, 2, cursor);
        if (sqlite3_step(next) != SQLITE_ROW || sqlite3_column_type(next, 0) == SQLITE_NULL)
            break;
        cursor = sqlite3_column_int64(next, 0);
        sqlite3_reset(next);
        sqlite3_bind_int64(last, 1, PLAIN_RES_MS);
        sqlite3_bind_int64(last, 2, cursor);
        if (sqlite3_step(last) == SQLITE_ROW && sqlite3_column_int64(last, 0) + PLAIN_RES_MS > from)
            from = sqlite3_column_int64(last, 0) + PLAIN_RES_MS;
        sqlite3_reset(last);
    }
    sqlite3_bind_int64(put, 1, from);
    if (sqlite3_step(put) != SQLITE_DONE)
        goto out;
    if (from != INT64_MIN)
        log_info("rollup", "1h roll-ups before this hour stay in rows; later ones are blobs too",
                 LF_I("blob_from", from));
    atomic_store(&r->blob_from, from);
    ret = 0;
out:
    sqlite3_finalize(get);
    sqlite3_finalize(next);
    sqlite3_finalize(last);
    sqlite3_finalize(put);
    return ret;
}

static int load_states(rollup_t *r, sqlite3 *db)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if (sqlite3_prepare_v2(db, "SELECT series_id, last_t, prev, prev_ok, open FROM rollup_state", -1, &st, NULL) !=
        SQLITE_OK)
        return -1;
    int64_t hw = INT64_MIN;
    size_t dropped = 0, malformed = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        uint64_t id = (uint64_t)sqlite3_column_int64(st, 0);
        shard_t *sh = &r->shards[shard_of(id)];
        sstate_t *s = state_get(r, sh, id);
        if (!s) {
            sqlite3_finalize(st);
            return -1;
        }
        s->last_t = sqlite3_column_int64(st, 1);
        s->prev = sqlite3_column_double(st, 2);
        s->prev_ok = sqlite3_column_int(st, 3) != 0;
        if (s->last_t > hw)
            hw = s->last_t;
        const uint8_t *p = sqlite3_column_blob(st, 4);
        state_iter_t it = state_iter_start(p, p ? (size_t)sqlite3_column_bytes(st, 4) : 0);
        int64_t res_ms;
        rollup_bucket_t b;
        int more;
        while ((more = state_iter_next(&it, &res_ms, &b)) > 0) {
            if (res_ms == PENDING_RES_MS) {
                s->pend = true;
                s->pend_t = b.ts;
                s->pend_v = b.last;
                if (b.ts > hw)
                    hw = b.ts;
                continue;
            }
            size_t i = 0;
            while (i < r->rs.n && r->rs.v[i].res_ms != res_ms)
                i++;
            if (i == r->rs.n || floor_to(b.ts, res_ms) != b.ts) {
                dropped++; /* resolution no longer configured */
                continue;
            }
            if (b.count == 0)
                continue; /* aggregated nothing */
            if (s->last_t == INT64_MIN || floor_to(s->last_t, res_ms) != b.ts) {
                /* Not of last_t's period (written when a staleness marker moved last_t on without
                 * closing it): closed now, as the next sample or sweep would have. */
                if (closed_add(sh, s, i, &b) != 0) {
                    sqlite3_finalize(st);
                    return -1;
                }
                s->closed = s->dirty = true;
                continue;
            }
            s->open[i] = (sbucket_t){.sum = b.sum,
                                     .min = b.min,
                                     .max = b.max,
                                     .increase = b.increase,
                                     .count = b.count > UINT32_MAX ? UINT32_MAX : (uint32_t)b.count,
                                     .disk_lo = s->open[i].disk_lo};
            s->last = b.last; /* the same in every open bucket of a state */
        }
        if (more < 0)
            malformed++; /* the entries before it are kept; WAL replay brings the rest back */
    }
    sqlite3_finalize(st);
    if (dropped)
        log_warn("rollup", "open buckets of unconfigured resolutions dropped", LF_I("buckets", dropped));
    if (malformed)
        log_warn("rollup", "undecodable open buckets in rollup_state skipped", LF_I("rows", malformed));
    atomic_store(&r->high_water, hw);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* The writer's work (catalog rows of new series, bucket blobs, states) is never on a request's
 * path: the WAL already made every sample durable. At normal priority it took most of a core for
 * seconds after a burst of new series (256k of them: ~6 s of CPU) and pushes on a 2-core machine
 * ran that much slower. At nice 10 it gets ~10 % of a busy core and all of an idle one; a push
 * waiting for one of its shard locks sleeps, which lets it run and release the lock. */
#define ROLLUP_WRITER_NICE 10
/* A cycle of the writer thread writes at most this many catalog rows (~16-24 us each), and
 * while more wait, the next cycle starts after ROLLUP_BACKLOG_WAIT_MS instead of the flush
 * interval. A burst of new series (round 1 of a Flink fleet: 256k) used to be one cycle of
 * seconds of CPU, which at nice 10 on a busy machine took 10-30 s, and whatever needs cycle_mu
 * (a head snapshot's flush, the flush at shutdown) waited for all of it. Now it waits for one
 * slice; its own flush, at the caller's priority, writes the rest (rollup__flush_some). */
#define ROLLUP_CATALOG_PER_CYCLE 8192
#define ROLLUP_BACKLOG_WAIT_MS 5
/* ... or after ROLLUP_BURST_WAIT_MS while the burst goes on (rows were queued during the last
 * wait): then the pushes creating those series need the CPU, and the rows can wait, their series
 * being in the WAL already. On 2 cores the slices took ~13 % of the CPU during a fleet's first
 * round and made it ~9 % slower; at this pace a slice still writes 160k rows a second. */
#define ROLLUP_BURST_WAIT_MS 50
/* Buckets wait while the rows are written in slices (rollup__flush_some); after this many slices
 * in a row, a cycle writes the whole backlog with its buckets, so a steady stream of new series
 * cannot hold roll-ups in memory for ever. */
#define ROLLUP_MAX_SLICES 64

static void *writer_main(void *arg)
{
    rollup_t *r = arg;
    pthread_setname_np(pthread_self(), "rollup-writer");
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), ROLLUP_WRITER_NICE) != 0)
        log_debug("rollup", "cannot lower the writer's priority; it runs at normal priority");
    pthread_mutex_lock(&r->stop_mu);
    int slices = 0;     /* cycles in a row that wrote only catalog rows: rows from before them wait */
    bool burst = false; /* rows were queued while the writer waited for its last slice */
    size_t queued = 0;  /* rows left queued after the last cycle */
    while (!r->stop) {
        int64_t wait_ms = !slices ? r->flush_ms : burst ? ROLLUP_BURST_WAIT_MS : ROLLUP_BACKLOG_WAIT_MS;
        struct timespec ts = clock_deadline_ms(CLOCK_REALTIME, wait_ms);
        pthread_cond_timedwait(&r->stop_cv, &r->stop_mu, &ts);
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->stop_mu);
        burst = slices && catalog__pending_count(r->cat) > queued;
        int64_t now = clock_wall_ms();
        bool ckpt = now - r->last_ckpt_wall >= r->ckpt_ms;
        bool rows_only;
        int rc = rollup__flush_some(r, ckpt, slices < ROLLUP_MAX_SLICES ? ROLLUP_CATALOG_PER_CYCLE : 0, &rows_only);
        if (rc == 0 && ckpt && !rows_only)
            r->last_ckpt_wall = now;
        slices = rc == 0 && rows_only ? slices + 1 : 0;
        queued = slices ? catalog__pending_count(r->cat) : 0;
        /* Retention: a pass every hour, one bounded slice per wake-up so a delete never holds
         * the write lock for long. */
        if (!r->ret_active && now - r->last_retention_wall >= RETENTION_PASS_MS) {
            r->ret_active = true;
            r->last_retention_wall = now;
        }
        /* When to run is wall-clock scheduling; what is old is the store's clock's call: with
         * a test clock set years back, the wall clock would delete every bucket at once. */
        if (r->ret_active && rollup_enforce_retention(r, r->clock_ms ? r->clock_ms() : now, RETENTION_BUDGET) <= 0)
            r->ret_active = false;
        pthread_mutex_lock(&r->stop_mu);
    }
    pthread_mutex_unlock(&r->stop_mu);
    return NULL;
}

rollup_t *rollup_open(catalog_t *cat, const rollup_config_t *cfg, char *err, size_t errlen)
{
    rollup_config_t dflt = {0};
    if (!cfg)
        cfg = &dflt;
    rollup_t *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->cat = cat;
    r->flush_ms = cfg->flush_interval_ms > 0 ? cfg->flush_interval_ms : 1000;
    r->ckpt_ms = cfg->checkpoint_interval_ms > 0 ? cfg->checkpoint_interval_ms : 300000;
    r->clock_ms = cfg->clock_ms;
    r->sweep_every_state = cfg->sweep_every_state;
    atomic_store(&r->high_water, INT64_MIN);
    for (size_t i = 0; i < ROLLUP_MAX_RESOLUTIONS; i++)
        atomic_store(&r->ret_cutoff[i], INT64_MIN);
    pthread_mutex_init(&r->pool_mu, NULL);
    pthread_mutex_init(&r->cycle_mu, NULL);
    pthread_rwlock_init(&r->view_rw, NULL);
    pthread_mutex_init(&r->stop_mu, NULL);
    pthread_cond_init(&r->stop_cv, NULL);
    for (size_t k = 0; k < SHARDS; k++) {
        pthread_mutex_init(&r->shards[k].mu, NULL);
        r->shards[k].nbuckets = 64;
        r->shards[k].due_lost = true; /* the first sweep builds the heap, loaded states included */
        r->shards[k].closed_base = cfg->closed_pos_start;
        r->shards[k].tab = calloc(64, sizeof(sstate_t *));
        if (!r->shards[k].tab) {
            snprintf(err, errlen, "out of memory");
            goto err;
        }
    }
    if (rollup_parse_resolutions(cfg->resolutions ? cfg->resolutions : ROLLUP_DEFAULT_RESOLUTIONS, &r->rs, err,
                                 errlen) != 0)
        goto err;
    /* ~4k states per shard at 256k series: 16 KiB pages (~100 states) keep the tail small. */
    for (size_t k = 0; k < SHARDS; k++)
        slab_init(&r->shards[k].states, state_bytes(r), 16384);
    catalog__write_lock(cat);
    int rc = exec_sql(catalog__write_db(cat), ROLLUP_SCHEMA);
    if (rc == 0)
        rc = setup_blob_from(r, catalog__write_db(cat));
    catalog__write_unlock(cat);
    if (rc != 0) {
        snprintf(err, errlen, "creating roll-up tables in %s failed", catalog_path(cat));
        goto err;
    }
    /* The first pooled read connection also loads the states. */
    rconn_t *c0 = conn_open(r, err, errlen);
    if (!c0)
        goto err;
    r->idle = c0;
    r->nidle = 1;
    if (load_states(r, c0->db) != 0) {
        snprintf(err, errlen, "loading roll-up state: %s", sqlite3_errmsg(c0->db));
        goto err;
    }
    r->last_ckpt_wall = clock_wall_ms();
    /* last_retention_wall = 0: the first retention pass starts with the first wake-up. */
    if (!cfg->no_thread) {
        if (pthread_create(&r->thread, NULL, writer_main, r) != 0) {
            snprintf(err, errlen, "cannot start the roll-up writer thread");
            goto err;
        }
        r->thread_started = true;
    }
    log_info("rollup", "opened", LF_S("path", catalog_path(cat)), LF_I("series", atomic_load(&r->st_series)));
    return r;
err:
    for (size_t k = 0; k < SHARDS; k++) {
        slab_destroy(&r->shards[k].states);
        free(r->shards[k].tab);
        pthread_mutex_destroy(&r->shards[k].mu);
    }
    for (rconn_t *c = r->idle, *next; c; c = next) {
        next = c->next;
        conn_free(c);
    }
    codec_free(&r->wcodec);
    pthread_mutex_destroy(&r->pool_mu);
    pthread_mutex_destroy(&r->cycle_mu);
    pthread_rwlock_destroy(&r->view_rw);
    pthread_mutex_destroy(&r->stop_mu);
    pthread_cond_destroy(&r->stop_cv);
    free(r);
    return NULL;
}

void rollup_close(rollup_t *r)
{
    if (!r)
        return;
    if (r->thread_started) {
        pthread_mutex_lock(&r->stop_mu);
        r->stop = true;
        pthread_cond_signal(&r->stop_cv);
        pthread_mutex_unlock(&r->stop_mu);
        pthread_join(r->thread, NULL);
    }
    /* Closed buckets to disk, open (partial) buckets to rollup_state; try twice in case the
     * first attempt lost a race for the database lock. */
    if (rollup_flush(r, true) != 0 && rollup_flush(r, true) != 0)
        log_error("rollup", "final flush failed; recent roll-ups lost", LF_I("buckets", inflight_count(r)));
    for (size_t k = 0; k < SHARDS; k++) {
        shard_t *sh = &r->shards[k];
        slab_destroy(&sh->states);
        free(sh->tab);
        free(sh->due);
        free(sh->closed.v);
        free(sh->inflight.v);
        pthread_mutex_destroy(&sh->mu);
    }
    snaps_clear(r);
    free(r->snaps);
    free(r->evicted);
    for (rconn_t *c = r->idle, *next; c; c = next) {
        next = c->next;
        conn_free(c);
    }
    codec_free(&r->wcodec);
    pthread_mutex_destroy(&r->pool_mu);
    pthread_mutex_destroy(&r->cycle_mu);
    pthread_rwlock_destroy(&r->view_rw);
    pthread_mutex_destroy(&r->stop_mu);
    pthread_cond_destroy(&r->stop_cv);
    free(r);
}

void rollup_get_stats(rollup_t *r, rollup_stats_t *out)
{
    *out = (rollup_stats_t){.series = atomic_load(&r->st_series),
                            .buckets_written = atomic_load(&r->st_written),
                            .samples_ignored = atomic_load(&r->st_ignored),
                            .flushes = atomic_load(&r->st_flushes),
                            .flush_errors = atomic_load(&r->st_flush_errors),
                            .reads_from_memory = atomic_load(&r->st_mem_reads)};
}
