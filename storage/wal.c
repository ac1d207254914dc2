/*
 * wal — write-ahead log: numbered segment files of CRC-framed records, group commit, replay with
 * repair. The API and its contract with the head (checkpoint order, duplicates) are in wal.h; the
 * byte format is in wal_record.h.
 *
 * ---- Files ------------------------------------------------------------------------------------
 *
 *   <dir>/00000001.wal  00000002.wal  ...      segments, decimal, 8 digits, replayed in order
 *   <dir>/00000007.wal.corrupt                 set aside by replay (never read again)
 *
 * wal_open always starts a NEW segment numbered after every file present (.corrupt included), so
 * a segment is only ever appended to by the process that created it, and a repaired tail is never
 * written after.
 *
 * ---- Bytes ------------------------------------------------------------------------------------
 *
 * Every segment starts with a 16-byte header (magic, version, its own number, CRC-32C) followed by
 * records: a 12-byte frame (type, flags, length, CRC-32C of header and payload) and the payload.
 * The byte tables of both, of the SERIES / SAMPLES / BLOB payloads, the encoders, the frame reader
 * and the decoders are in storage/wal_record.h and .c, shared with storage/wal_watch.c.
 *
 * Records of an unknown type with a good CRC are skipped (counted in replay stats), so a newer
 * version's new record kinds do not stop an older replay. A good CRC with a payload that does not
 * decode is treated like corruption.
 *
 * ---- Writing ------------------------------------------------------------------------------------
 *
 * Appenders encode their record(s) outside the lock, then under `mu` append the bytes to
 * `pending` and put a waiter (on their stack) on the pending list. Then, until their waiter is
 * done: if nobody holds the I/O token (`io_busy`), they take it and become the leader: they swap
 * out `pending` and its waiter list, drop the lock, pwrite the batch at the end of the segment
 * (and fsync in ALWAYS mode), retake the lock, mark every waiter of that batch done with the
 * batch's result, and broadcast. Otherwise they wait on `cv`. Whoever appends while a leader
 * writes lands in the next batch: that is the group commit. The background thread takes the
 * token every fsync_interval_ms to write anything pending and fsync.
 *
 * The segment fields (fd, seg_no, seg_size, dirty, need_repair) belong to whoever holds the token;
 * the leader publishes them into `stats` under `mu` for everyone else.
 *
 * In interval mode the background fsync runs without the token (wal_sync_behind): it writes what
 * is pending as a leader, then, token released, fsyncs a dup of the segment's fd while appenders
 * go on writing. A segment that rolls while dirty is not fsync'd by the rolling leader either: its
 * fd is retired to a list the next background pass (or an explicit wal_sync, wal_cut, wal_close)
 * fsyncs and closes. Before, every fsync (a second of writes: tens of MiB while a burst of new
 * series is logged) held the token, so each append that came in meanwhile, and the push waiting
 * on it, waited for the disk. Durability is what interval mode promised: written data is
 * fsync'd within about one interval; always mode still fsyncs each batch under the token.
 *
 * A failed pwrite may have written part of the batch. The leader immediately ftruncates the
 * segment back to `seg_size` (the end of the last good batch); if even that fails, `need_repair`
 * makes every later leader retry the ftruncate before writing anything, failing until it works.
 * So the file never holds a partial record followed by good ones, and nothing is reported
 * written that is not. A failed fsync fails its batch too (the kernel may have dropped the pages).
 *
 * ---- Recovery (wal_replay) ------------------------------------------------------------------------
 *
 *            read header ──bad/torn──▶ [last segment, torn creation (short or zeroed header)]
 *                │                         └─ unlink it, warn, done
 *                │                     [otherwise] ─▶ SET ASIDE this and later segments, error, done
 *                ▼
 *        ┌─▶ read record ──ok──▶ deliver to callbacks ─┐
 *        │       │  └─ end of file exactly ──▶ next segment
 *        └───────┼─────────────────────────────────────┘
 *                │ short header, short payload, bad length, reserved bits, CRC mismatch,
 *                ▼ undecodable payload
 *        [last segment]  ftruncate at the record's start, log_warn(file, offset), replay succeeds
 *        [earlier one]   ftruncate it there, rename every later segment to *.wal.corrupt,
 *                        log_error(file, offset), replay succeeds with what came before
 *
 * Later segments are set aside rather than replayed because their records may depend on what was
 * lost (a series record for an id they use) and would leave a silent hole in the middle of the
 * history; they are renamed, not deleted, so an operator can look at them. Within one segment,
 * nothing after the first bad record is trusted: without a sync marker there is no safe way to
 * find the next record boundary.
 */
#include "storage/wal.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal/util/buf.h"
#include "internal/util/clock.h"
#include "internal/util/err.h"
#include "internal/util/log.h"
#include "storage/wal_record.h"

/* ============================================================================================
 * Small helpers
 * ============================================================================================ */

/* ============================================================================================
 * Segment files
 * ============================================================================================ */

static void seg_name(char *out, size_t n, uint32_t no, const char *suffix)
{
    snprintf(out, n, "%08" PRIu32 ".wal%s", no, suffix);
}

/* Parses "NNNNNNNN.wal" (kind 0) or "NNNNNNNN.wal.corrupt" (kind 1). Returns -1 for others. */
static int seg_parse_name(const char *name, uint32_t *no)
{
    for (int i = 0; i < 8; i++)
        if (name[i] < '0' || name[i] > '9')
            return -1;
    if (strncmp(name + 8, ".wal", 4) != 0)
        return -1;
    uint32_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v * 10 + (uint32_t)(name[i] - '0');
    *no = v;
    if (name[12] == 0)
        return 0;
    if (strcmp(name + 12, ".corrupt") == 0)
        return 1;
    return -1;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Lists live segments (sorted) and the highest number of any segment file, corrupt ones too.
 * *segs is malloc'd (may be NULL when *n = 0). Returns 0, or -errno (ENOENT: no directory). */
static int seg_list(const char *dir, uint32_t **segs, size_t *n, uint32_t *max_any)
{
    *segs = NULL;
    *n = 0;
    *max_any = 0;
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint32_t no;
        int kind = seg_parse_name(e->d_name, &no);
        if (kind < 0)
            continue;
        if (no > *max_any)
            *max_any = no;
        if (kind != 0)
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *p = realloc(*segs, cap * sizeof *p);
            if (!p) {
                closedir(d);
                free(*segs);
                *segs = NULL;
                return -ENOMEM;
            }
            *segs = p;
        }
        (*segs)[(*n)++] = no;
    }
    closedir(d);
    if (*n)
        qsort(*segs, *n, sizeof **segs, cmp_u32);
    return 0;
}

static int fsync_dir(int dirfd)
{
    return fsync(dirfd) == 0 ? 0 : -errno;
}

static int pwrite_all(int fd, const void *p, size_t n, off_t off)
{
    const char *c = p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        c += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/* Creates segment `no` with its header, durable in the directory. Returns an fd or -errno. */
static int seg_create(int dirfd, uint32_t no)
{
    char name[32];
    seg_name(name, sizeof name, no, "");
    int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    uint8_t h[WAL_SEG_HEADER_BYTES];
    wal_record_seg_header(h, no);
    int rc = pwrite_all(fd, h, sizeof h, 0);
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (rc == 0)
        rc = fsync_dir(dirfd);
    if (rc != 0) {
        close(fd);
        unlinkat(dirfd, name, 0);
        return rc;
    }
    return fd;
}

/* ============================================================================================
 * The log
 * ============================================================================================ */

typedef struct wal_waiter {
    struct wal_waiter *next;
    bool done;
    int rc;
    char *err;
    size_t errlen;
} wal_waiter_t;

struct wal {
    char *dir;
    int dirfd;
    wal_options_t opts;

    pthread_mutex_t mu;
    pthread_cond_t cv;    /* a leader finished a batch */
    pthread_cond_t bg_cv; /* wakes the group-commit thread early (close) */
    pthread_t bg;
    bool bg_started;
    bool closing;

    /* under mu */
    buf_t pending;
    uint64_t pending_records;
    uint32_t oversized; /* batches in a row written from a buffer far larger than they were */
    wal_waiter_t *wait_head, **wait_tail;
    bool io_busy;
    wal_stats_t stats;
    int *retired; /* fds of rolled segments still to fsync and close (interval mode) */
    size_t nretired, capretired;
    uint32_t syncing; /* wal_sync_behind passes fsyncing outside the token */
    bool resync;      /* a fsync outside the token failed: fsync the current segment again */

    /* owned by the holder of the io_busy token */
    int fd;
    uint32_t seg_no;
    uint64_t seg_size; /* end of the last good batch in the segment */
    bool dirty;        /* written since the last successful fsync */
    bool need_repair;  /* the file may extend past seg_size with a partial batch */
    buf_t spare;       /* the batch being written; its allocation is reused */
};

void wal_options_default(wal_options_t *o)
{
    o->fsync_mode = WAL_FSYNC_INTERVAL;
    o->fsync_interval_ms = 1000;
    o->segment_max_bytes = 64u << 20;
}

typedef struct {
    int rc;     /* batch result: what every waiter of the batch gets */
    int cut_rc; /* wal_cut only */
    uint64_t fsync_ns;
    uint32_t nfsyncs; /* successful fsyncs besides `fsynced` (retired segments) */
    bool fsynced, fsync_failed, write_failed, rolled;
    uint64_t written, records;
    char msg[256];
} io_result_t;

/* Queues a dup of fd for the next fsync pass (mu held). 0, or -1 (no memory or fds): then the
 * caller fsyncs itself. */
static int wal_retire_locked(wal_t *w, int fd)
{
    if (w->nretired == w->capretired) {
        size_t cap = w->capretired ? w->capretired * 2 : 4;
        int *v = realloc(w->retired, cap * sizeof(*v));
        if (!v)
            return -1;
        w->retired = v;
        w->capretired = cap;
    }
    int d = dup(fd);
    if (d < 0)
        return -1;
    w->retired[w->nretired++] = d;
    return 0;
}

/* Fsyncs and closes the fds taken from `retired`; counts into res. Any lock may be held or not:
 * nothing else sees these fds. Returns 0 or -1 (message in msg; every fd is closed anyway: a
 * failed fsync may have dropped the pages, retrying it would report a false success). */
static int wal_sync_retired(wal_t *w, int *fds, size_t n, io_result_t *res, char *msg, size_t msglen)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t t0 = clock_mono_ns();
        int fr = fsync(fds[i]);
        int e = errno;
        res->fsync_ns += (uint64_t)(clock_mono_ns() - t0);
        if (fr == 0) {
            res->nfsyncs++;
        } else {
            res->fsync_failed = true;
            if (rc == 0)
                err_setf(msg, msglen, "wal: fsync of a closed segment in %s: %s", w->dir, strerror(e));
            rc = -1;
        }
        close(fds[i]);
    }
    return rc;
}

/* Closes the current segment and starts seg_no+1. Token held. On failure the old segment stays
 * current. */
static int wal_roll(wal_t *w, io_result_t *res, char *msg, size_t msglen)
{
    /* Interval mode: the old segment is fsync'd by the next background pass, not while every
     * appender waits for this leader (see the top); a dup of its fd waits in `retired`. If the
     * new segment cannot be made, the old one stays current and is fsync'd through both fds. */
    if (w->dirty && w->opts.fsync_mode == WAL_FSYNC_INTERVAL) {
        pthread_mutex_lock(&w->mu);
        if (wal_retire_locked(w, w->fd) == 0)
            w->dirty = false;
        pthread_mutex_unlock(&w->mu);
    }
    if (w->dirty) {
        /* the group-commit thread only ever fsyncs the current segment: make this one durable now */
        int64_t t0 = clock_mono_ns();
        int fr = fsync(w->fd);
        int e = errno;
        res->fsync_ns += (uint64_t)(clock_mono_ns() - t0);
        if (fr != 0) {
            res->fsync_failed = true;
            err_setf(msg, msglen, "wal: fsync segment %08" PRIu32 ": %s", w->seg_no, strerror(e));
            return WAL_ERR_IO;
        }
        res->fsynced = true;
        w->dirty = false;
    }
    int fd = seg_create(w->dirfd, w->seg_no + 1);
    if (fd < 0) {
        err_setf(msg, msglen, "wal: create segment %08" PRIu32 " in %s: %s", w->seg_no + 1, w->dir, strerror(-fd));
        return WAL_ERR_IO;
    }
    close(w->fd);
    w->fd = fd;
    w->seg_no++;
    w->seg_size = WAL_SEG_HEADER_BYTES;
    w->need_repair = false;
    return WAL_OK;
}

/*
 * The leader step. Called with mu held and the token free; takes the token, writes everything
 * pending (fsync if `sync`), rolls the segment if it is full (or `cut`), publishes, gives the
 * token back and wakes everybody. Returns with mu held.
 */
#define WAL_KEEP_BYTES (256u << 10)
#define WAL_SHRINK_AFTER 64

static void wal_lead(wal_t *w, bool sync, bool cut, io_result_t *res)
{
    assert(!w->io_busy);
    memset(res, 0, sizeof *res);
    w->io_busy = true;

    buf_t batch = w->pending;
    w->pending = w->spare;
    buf_reset(&w->pending);
    uint64_t nrec = w->pending_records;
    w->pending_records = 0;
    wal_waiter_t *waiters = w->wait_head;
    w->wait_head = NULL;
    w->wait_tail = &w->wait_head;
    /* A sync covers the segments retired since the last pass too. */
    int *retired = sync ? w->retired : NULL;
    size_t nretired = sync ? w->nretired : 0;
    if (sync) {
        w->retired = NULL;
        w->nretired = w->capretired = 0;
    }
    pthread_mutex_unlock(&w->mu);

    int rc = WAL_OK;
    if (w->need_repair) {
        if (ftruncate(w->fd, (off_t)w->seg_size) == 0) {
            w->need_repair = false;
        } else {
            rc = WAL_ERR_IO;
            err_setf(res->msg, sizeof res->msg,
                     "wal: cannot cut segment %08" PRIu32 " back to %" PRIu64 " after a failed write: %s", w->seg_no,
                     w->seg_size, strerror(errno));
        }
    }
    if (rc == WAL_OK && batch.len) {
        int e = pwrite_all(w->fd, batch.data, batch.len, (off_t)w->seg_size);
        if (e == 0) {
            w->seg_size += batch.len;
            w->dirty = true;
            res->written = batch.len;
            res->records = nrec;
        } else {
            rc = WAL_ERR_IO;
            res->write_failed = true;
            err_setf(res->msg, sizeof res->msg, "wal: write segment %08" PRIu32 " in %s: %s", w->seg_no, w->dir,
                     strerror(-e));
            /* drop the partial batch so the next good one follows a complete record */
            if (ftruncate(w->fd, (off_t)w->seg_size) != 0)
                w->need_repair = true;
        }
    }
    if (rc == WAL_OK && sync && w->dirty) {
        int64_t t0 = clock_mono_ns();
        int fr = fsync(w->fd);
        int e = errno;
        res->fsync_ns += (uint64_t)(clock_mono_ns() - t0);
        if (fr == 0) {
            w->dirty = false;
            res->fsynced = true;
        } else {
            rc = WAL_ERR_IO;
            res->fsync_failed = true;
            err_setf(res->msg, sizeof res->msg, "wal: fsync segment %08" PRIu32 " in %s: %s", w->seg_no, w->dir,
                     strerror(e));
        }
    }
    if (nretired && wal_sync_retired(w, retired, nretired, res, rc == WAL_OK ? res->msg : NULL, sizeof res->msg) != 0)
        rc = WAL_ERR_IO;
    free(retired);
    res->rc = rc;
    if (cut || (rc == WAL_OK && w->seg_size >= w->opts.segment_max_bytes)) {
        char rmsg[256] = "";
        int rr = rc == WAL_OK ? wal_roll(w, res, rmsg, sizeof rmsg) : rc;
        if (rr == WAL_OK) {
            res->rolled = true;
        } else if (rc == WAL_OK) {
            /* size-triggered: the batch itself is fine, retry the roll next time */
            if (!cut)
                log_error("wal", "cannot start a new segment", LF_S("dir", w->dir), LF_S("err", rmsg));
            else
                snprintf(res->msg, sizeof res->msg, "%s", rmsg);
        }
        res->cut_rc = rr;
    }

    pthread_mutex_lock(&w->mu);
    w->stats.bytes_written += res->written;
    w->stats.records_written += res->records;
    if (res->written)
        w->stats.writes++;
    if (res->write_failed)
        w->stats.write_errors++;
    if (res->fsynced)
        w->stats.fsyncs++;
    w->stats.fsyncs += res->nfsyncs;
    if (res->fsync_failed)
        w->stats.fsync_errors++;
    w->stats.fsync_duration_ns += res->fsync_ns;
    if (res->rolled) {
        w->stats.segments_created++;
        w->stats.segments_on_disk++;
    }
    w->stats.segment_current = w->seg_no;
    w->stats.segment_bytes = w->seg_size;
    for (wal_waiter_t *x = waiters; x; x = x->next) {
        x->done = true;
        x->rc = rc;
        if (rc != WAL_OK)
            err_setf(x->err, x->errlen, "%s", res->msg);
    }
    /* A burst (a round of new TaskManagers: the series records of thousands of new series in one
     * batch) grows the two batch buffers to megabytes, where steady pushes need tens of KB: a
     * buffer that stayed far larger than its batches for WAL_SHRINK_AFTER batches in a row is
     * given back (it was ~4 MB held for good after the push bench's first round). */
    if (batch.cap > WAL_KEEP_BYTES && batch.len * 4 >= batch.cap) {
        w->oversized = 0; /* still needed */
    } else if (batch.cap > WAL_KEEP_BYTES && ++w->oversized >= WAL_SHRINK_AFTER) {
        buf_free(&batch);
        w->oversized = 0;
    }
    buf_reset(&batch);
    w->spare = batch;
    w->io_busy = false;
    pthread_cond_broadcast(&w->cv);
}

/* The interval fsync without the token (see the top). Called with mu held, the token free and
 * the pending batch just written; returns with mu held. The fds are dups: a leader may roll or
 * close the segment meanwhile. */
static void wal_sync_behind(wal_t *w)
{
    bool cur = w->dirty || w->resync;
    if (!cur && !w->nretired)
        return;
    /* dirty belongs to the token holder; the token is free and mu held, so no leader runs */
    if (cur && wal_retire_locked(w, w->fd) == 0) {
        w->dirty = false;
        w->resync = false;
    }
    int *fds = w->retired;
    size_t n = w->nretired;
    w->retired = NULL;
    w->nretired = w->capretired = 0;
    w->syncing++;
    pthread_mutex_unlock(&w->mu);
    io_result_t res;
    memset(&res, 0, sizeof res);
    int rc = wal_sync_retired(w, fds, n, &res, res.msg, sizeof res.msg);
    free(fds);
    pthread_mutex_lock(&w->mu);
    w->stats.fsyncs += res.nfsyncs;
    w->stats.fsync_duration_ns += res.fsync_ns;
    if (rc != 0) {
        w->stats.fsync_errors++;
        w->resync = true; /* whatever the current segment holds gets another fsync next pass */
        log_error("wal", "background fsync failed", LF_S("err", res.msg));
    }
    w->syncing--;
    pthread_cond_broadcast(&w->cv);
}

static void *wal_bg_main(void *arg)
{
    wal_t *w = arg;
    pthread_setname_np(pthread_self(), "wal-sync");
    pthread_mutex_lock(&w->mu);
    while (!w->closing) {
        struct timespec ts = clock_deadline_ms(CLOCK_MONOTONIC, (int64_t)w->opts.fsync_interval_ms);
        int r = 0;
        while (!w->closing && r != ETIMEDOUT)
            r = pthread_cond_timedwait(&w->bg_cv, &w->mu, &ts);
        if (w->closing)
            break;
        while (w->io_busy)
            pthread_cond_wait(&w->cv, &w->mu);
        bool behind = w->opts.fsync_mode == WAL_FSYNC_INTERVAL;
        io_result_t res;
        wal_lead(w, !behind, false, &res);
        if (res.rc != WAL_OK)
            log_error("wal", "background flush failed", LF_S("err", res.msg));
        /* wal_lead returned with mu held and the token free: no leader can have started since */
        assert(!w->io_busy);
        if (behind)
            wal_sync_behind(w);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

wal_t *wal_open(const char *dir, const wal_options_t *opts, char *err, size_t errlen)
{
    wal_t *w = calloc(1, sizeof *w);
    if (!w) {
        err_setf(err, errlen, "wal: out of memory");
        return NULL;
    }
    w->fd = -1;
    w->dirfd = -1;
    if (opts)
        w->opts = *opts;
    else
        wal_options_default(&w->opts);
    if (w->opts.fsync_interval_ms == 0)
        w->opts.fsync_interval_ms = 1000;
    if (w->opts.segment_max_bytes < 4096)
        w->opts.segment_max_bytes = 4096;
    w->wait_tail = &w->wait_head;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    {
        /* monotonic, so a wall-clock jump cannot stall the group commit */
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&w->bg_cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    w->dir = strdup(dir);
    if (!w->dir) {
        err_setf(err, errlen, "wal: out of memory");
        goto fail;
    }
    if (mkdir(dir, 0755) == 0) {
        /* a new directory must itself survive a crash before segments in it can */
        char *parent = strdup(dir);
        int pfd = parent ? open(dirname(parent), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (pfd >= 0) {
            fsync(pfd);
            close(pfd);
        }
        free(parent);
    } else if (errno != EEXIST) {
        err_setf(err, errlen, "wal: mkdir %s: %s", dir, strerror(errno));
        goto fail;
    }
    w->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (w->dirfd < 0) {
        err_setf(err, errlen, "wal: open %s: %s", dir, strerror(errno));
        goto fail;
    }
    uint32_t *segs, max_any;
    size_t nseg;
    int lr = seg_list(dir, &segs, &nseg, &max_any);
    free(segs);
    if (lr != 0) {
        err_setf(err, errlen, "wal: list %s: %s", dir, strerror(-lr));
        goto fail;
    }
    if (max_any >= 99999999u) {
        err_setf(err, errlen, "wal: segment numbers exhausted in %s", dir);
        goto fail;
    }
    w->seg_no = max_any + 1;
    w->fd = seg_create(w->dirfd, w->seg_no);
    if (w->fd < 0) {
        err_setf(err, errlen, "wal: create segment %08" PRIu32 " in %s: %s", w->seg_no, dir, strerror(-w->fd));
        goto fail;
    }
    w->seg_size = WAL_SEG_HEADER_BYTES;
    w->stats.segments_created = 1;
    w->stats.segments_on_disk = (uint32_t)nseg + 1;
    w->stats.segment_current = w->seg_no;
    w->stats.segment_bytes = w->seg_size;
    if (pthread_create(&w->bg, NULL, wal_bg_main, w) != 0) {
        err_setf(err, errlen, "wal: cannot start the group-commit thread");
        goto fail;
    }
    w->bg_started = true;
    return w;
fail:
    if (w->fd >= 0)
        close(w->fd);
    if (w->dirfd >= 0)
        close(w->dirfd);
    pthread_cond_destroy(&w->bg_cv);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->dir);
    free(w);
    return NULL;
}

int wal_close(wal_t *w, char *err, size_t errlen)
{
    if (!w)
        return WAL_OK;
    pthread_mutex_lock(&w->mu);
    w->closing = true;
    pthread_cond_signal(&w->bg_cv);
    pthread_mutex_unlock(&w->mu);
    if (w->bg_started)
        pthread_join(w->bg, NULL);

    pthread_mutex_lock(&w->mu);
    while (w->io_busy || w->syncing)
        pthread_cond_wait(&w->cv, &w->mu);
    assert(w->wait_head == NULL); /* no appender may still be running */
    io_result_t res;
    wal_lead(w, true, false, &res);
    pthread_mutex_unlock(&w->mu);
    if (res.rc != WAL_OK)
        err_setf(err, errlen, "%s", res.msg);

    close(w->fd);
    close(w->dirfd);
    buf_free(&w->pending);
    buf_free(&w->spare);
    pthread_cond_destroy(&w->bg_cv);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->dir);
    free(w);
    return res.rc;
}

/* Encodes records (enc appends them to b and counts them in *nrec; on error b may hold a partial
 * record) straight into the shared pending buffer, under mu, and waits until they are written
 * (and fsync'd in ALWAYS mode). Encoding in place, instead of into a fresh buffer that is then
 * copied into the pending one, saves a copy and, for the large SERIES and state records of a
 * push that creates its series (~0.5 MiB each), the page faults of a new mmap'd buffer per
 * call: the pending buffers keep their allocation from batch to batch. `bound` is reserved first
 * (an estimate: encoders grow the buffer themselves if it is short), so an allocation failure is
 * WAL_ERR_NOMEM rather than an abort. */
typedef int (*wal_encode_fn)(buf_t *b, const void *arg, uint64_t *nrec);

static int wal_submit(wal_t *w, size_t bound, wal_encode_fn enc, const void *arg, char *err, size_t errlen)
{
    wal_waiter_t me = {.err = err, .errlen = errlen};
    pthread_mutex_lock(&w->mu);
    assert(!w->closing);
    if (buf_try_reserve(&w->pending, bound) != 0) {
        pthread_mutex_unlock(&w->mu);
        err_setf(err, errlen, "wal: out of memory");
        return WAL_ERR_NOMEM;
    }
    size_t len0 = w->pending.len;
    uint64_t nrec = 0;
    int rc = enc(&w->pending, arg, &nrec);
    if (rc != WAL_OK) {
        w->pending.len = len0; /* drop the partial record: the batch stays well-formed */
        pthread_mutex_unlock(&w->mu);
        return rc;
    }
    w->pending_records += nrec;
    *w->wait_tail = &me;
    w->wait_tail = &me.next;
    bool sync = w->opts.fsync_mode == WAL_FSYNC_ALWAYS;
    while (!me.done) {
        if (!w->io_busy) {
            io_result_t res;
            wal_lead(w, sync, false, &res);
        } else {
            pthread_cond_wait(&w->cv, &w->mu);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return me.rc;
}

typedef struct {
    const void *v;
    size_t n;
} wal_encode_arg_t;

static int wal_encode_series(buf_t *b, const void *arg, uint64_t *nrec)
{
    const wal_encode_arg_t *a = arg;
    return wal_record_encode_series(b, a->v, a->n, nrec);
}

int wal_log_series(wal_t *w, const wal_series_t *series, size_t n, char *err, size_t errlen)
{
    if (n == 0)
        return WAL_OK;
    /* Upper bound of the encoding (wal_record.h: a record header per record, at worst one per
     * series; uvarints of at most 10 bytes). */
    size_t bound = WAL_REC_HEADER_BYTES + 4;
    for (size_t i = 0; i < n; i++) {
        bound += WAL_REC_HEADER_BYTES + 4 + 20;
        for (size_t k = 0; k < series[i].labels.n; k++) {
            const label_t *l = &series[i].labels.v[k];
            bound += 20 + (l->name ? strlen(l->name) : 0) + (l->value ? strlen(l->value) : 0);
        }
    }
    wal_encode_arg_t a = {series, n};
    int rc = wal_submit(w, bound, wal_encode_series, &a, err, errlen);
    if (rc == WAL_ERR_TOO_LARGE)
        err_setf(err, errlen, "wal: a series record exceeds %u bytes", WAL_MAX_RECORD_BYTES);
    else if (rc == WAL_ERR_ARG)
        err_setf(err, errlen, "wal: label with a NULL name or value");
    return rc;
}

static int wal_encode_samples(buf_t *b, const void *arg, uint64_t *nrec)
{
    const wal_encode_arg_t *a = arg;
    wal_record_encode_samples(b, a->v, a->n, nrec);
    return WAL_OK;
}

int wal_log_samples(wal_t *w, const wal_sample_t *samples, size_t n, char *err, size_t errlen)
{
    if (n == 0)
        return WAL_OK;
    wal_encode_arg_t a = {samples, n};
    size_t bound = (n / 65536 + 1) * (WAL_REC_HEADER_BYTES + 4) + n * 28;
    return wal_submit(w, bound, wal_encode_samples, &a, err, errlen);
}

typedef struct {
    uint8_t type;
    const void *data;
    size_t len;
} wal_blob_arg_t;

static int wal_encode_blob(buf_t *b, const void *arg, uint64_t *nrec)
{
    const wal_blob_arg_t *a = arg;
    wal_record_encode_blob(b, a->type, a->data, a->len);
    (*nrec)++;
    return WAL_OK;
}

int wal_log_blob(wal_t *w, uint8_t type, const void *data, size_t len, char *err, size_t errlen)
{
    if (len >= WAL_MAX_RECORD_BYTES) {
        err_setf(err, errlen, "wal: blob of %zu bytes exceeds %u", len, WAL_MAX_RECORD_BYTES - 1);
        return WAL_ERR_TOO_LARGE;
    }
    wal_blob_arg_t a = {type, data, len};
    return wal_submit(w, WAL_REC_HEADER_BYTES + 1 + len, wal_encode_blob, &a, err, errlen);
}

int wal_sync(wal_t *w, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    /* a background pass outside the token holds retired fds this call must see fsync'd */
    while (w->io_busy || w->syncing)
        pthread_cond_wait(&w->cv, &w->mu);
    io_result_t res;
    wal_lead(w, true, false, &res);
    pthread_mutex_unlock(&w->mu);
    if (res.rc != WAL_OK)
        err_setf(err, errlen, "%s", res.msg);
    return res.rc;
}

int wal_cut(wal_t *w, uint32_t *segment_no, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    while (w->io_busy)
        pthread_cond_wait(&w->cv, &w->mu);
    io_result_t res;
    wal_lead(w, true, true, &res);
    uint32_t cur = w->stats.segment_current;
    pthread_mutex_unlock(&w->mu);
    int rc = res.rc != WAL_OK ? res.rc : res.cut_rc;
    if (rc != WAL_OK) {
        err_setf(err, errlen, "%s", res.msg);
        return rc;
    }
    if (segment_no)
        *segment_no = cur;
    return WAL_OK;
}

int wal_truncate_before(wal_t *w, uint32_t segment_no, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    uint32_t cur = w->stats.segment_current;
    pthread_mutex_unlock(&w->mu);
    if (segment_no > cur)
        segment_no = cur; /* never the segment being written */

    uint32_t *segs, max_any;
    size_t n;
    int lr = seg_list(w->dir, &segs, &n, &max_any);
    if (lr != 0) {
        err_setf(err, errlen, "wal: list %s: %s", w->dir, strerror(-lr));
        return WAL_ERR_IO;
    }
    int rc = WAL_OK;
    uint32_t removed = 0;
    for (size_t i = 0; i < n && segs[i] < segment_no; i++) {
        char name[32];
        seg_name(name, sizeof name, segs[i], "");
        if (unlinkat(w->dirfd, name, 0) == 0) {
            removed++;
        } else if (errno != ENOENT) {
            err_setf(err, errlen, "wal: remove %s/%s: %s", w->dir, name, strerror(errno));
            rc = WAL_ERR_IO;
        }
    }
    free(segs);
    if (removed && fsync_dir(w->dirfd) != 0 && rc == WAL_OK) {
        err_setf(err, errlen, "wal: fsync %s: %s", w->dir, strerror(errno));
        rc = WAL_ERR_IO;
    }
    pthread_mutex_lock(&w->mu);
    w->stats.segments_on_disk = (uint32_t)(n - removed);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int wal_oldest_segment(const char *dir, uint32_t *segment_no)
{
    uint32_t *segs, max_any;
    size_t n;
    *segment_no = 0;
    int lr = seg_list(dir, &segs, &n, &max_any);
    if (lr == -ENOENT)
        return WAL_OK;
    if (lr != 0)
        return lr == -ENOMEM ? WAL_ERR_NOMEM : WAL_ERR_IO;
    if (n)
        *segment_no = segs[0]; /* sorted */
    free(segs);
    return WAL_OK;
}

void wal_get_stats(wal_t *w, wal_stats_t *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    out->buffer_bytes = w->pending.cap + w->spare.cap;
    pthread_mutex_unlock(&w->mu);
}

/* ============================================================================================
 * Replay
 * ============================================================================================ */

typedef struct {
    const wal_replay_cb_t *cb;
    void *ud;
    wal_replay_stats_t *st;
    buf_t payload;
    wal_record_decoder_t dec;
} replay_t;

static int replay_on_series(void *ud, uint64_t id, const labels_t *ls)
{
    replay_t *r = ud;
    r->st->series++;
    return r->cb->on_series ? r->cb->on_series(r->ud, id, ls) : 0;
}

static int replay_on_samples(void *ud, const wal_sample_t *s, size_t n)
{
    replay_t *r = ud;
    r->st->samples += n;
    return r->cb->on_samples ? r->cb->on_samples(r->ud, s, n) : 0;
}

/* Decodes and delivers one good-CRC record. Returns 0, 1 (payload does not decode: treat as
 * corruption), WAL_ERR_ABORTED or WAL_ERR_NOMEM. The whole record is validated before the first
 * callback, so a bad record delivers nothing. */
static int replay_record(replay_t *r, const wal_record_t *rec)
{
    int rc;
    switch (rec->type) {
    case WAL_REC_SERIES:
    case WAL_REC_SERIES_SHARED:
        rc = wal_record_decode_series(&r->dec, rec->type, rec->payload, rec->len, replay_on_series, r);
        break;
    case WAL_REC_SAMPLES: rc = wal_record_decode_samples(&r->dec, rec->payload, rec->len, replay_on_samples, r); break;
    case WAL_REC_BLOB:
        if (rec->len < 1)
            return 1;
        r->st->blobs++;
        rc = r->cb->on_blob && r->cb->on_blob(r->ud, rec->payload[0], rec->payload + 1, rec->len - 1) != 0
                 ? WAL_ERR_ABORTED
                 : WAL_OK;
        break;
    default: r->st->skipped++; return 0;
    }
    return rc == WAL_ERR_CORRUPT ? 1 : rc;
}

typedef enum { SEG_OK, SEG_BAD_HEADER, SEG_TORN_HEADER, SEG_BAD_RECORD } seg_outcome_t;

/*
 * Replays one segment file. On SEG_BAD_RECORD, *bad_off is where the first bad record starts and
 * *why says what was wrong. Returns 0 with *out set, or a negative WAL_ERR_*.
 */
static int replay_segment(replay_t *r, int fd, uint32_t no, seg_outcome_t *out, uint64_t *bad_off, const char **why,
                          char *err, size_t errlen)
{
    char msg[256];
    *bad_off = 0;
    int hr = wal_record_read_seg_header(fd, no, why, msg, sizeof msg);
    if (hr < 0) {
        err_setf(err, errlen, "wal: %s", msg);
        return hr;
    }
    if (hr != WAL_RECORD_OK) {
        *out = hr == WAL_RECORD_TORN ? SEG_TORN_HEADER : SEG_BAD_HEADER;
        return 0;
    }
    uint64_t off = WAL_SEG_HEADER_BYTES;
    for (;;) {
        wal_record_t rec;
        int rr = wal_record_read(fd, off, &r->payload, &rec, why, msg, sizeof msg);
        if (r->payload.cap > r->st->buffer_bytes)
            r->st->buffer_bytes = r->payload.cap;
        if (rr < 0) {
            err_setf(err, errlen, "wal: segment %08" PRIu32 ": %s", no, msg);
            return rr;
        }
        if (rr == WAL_RECORD_END) {
            *out = SEG_OK;
            return 0;
        }
        *bad_off = off;
        *out = SEG_BAD_RECORD;
        if (rr != WAL_RECORD_OK)
            return 0;
        rr = replay_record(r, &rec);
        if (rr < 0) {
            if (rr == WAL_ERR_ABORTED)
                err_setf(err, errlen, "wal: replay aborted by callback in segment %08" PRIu32 " at offset %" PRIu64, no,
                         off);
            else
                err_setf(err, errlen, "wal: out of memory during replay");
            return rr;
        }
        if (rr > 0) {
            *why = "record payload does not decode";
            return 0;
        }
        r->st->records++;
        off += WAL_REC_HEADER_BYTES + rec.len;
    }
}

int wal_replay(const char *dir, uint32_t first_segment, const wal_replay_cb_t *cb, void *ud, wal_replay_stats_t *stats,
               char *err, size_t errlen)
{
    wal_replay_stats_t local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    static const wal_replay_cb_t none = {0};
    replay_t r = {.cb = cb ? cb : &none, .ud = ud, .st = stats};
    wal_record_decoder_init(&r.dec);

    uint32_t *segs, max_any;
    size_t n;
    int lr = seg_list(dir, &segs, &n, &max_any);
    if (lr == -ENOENT)
        return WAL_OK;
    if (lr != 0) {
        err_setf(err, errlen, "wal: list %s: %s", dir, strerror(-lr));
        return lr == -ENOMEM ? WAL_ERR_NOMEM : WAL_ERR_IO;
    }
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) {
        err_setf(err, errlen, "wal: open %s: %s", dir, strerror(errno));
        free(segs);
        return WAL_ERR_IO;
    }
    size_t first = 0;
    while (first < n && segs[first] < first_segment)
        first++;

    int rc = WAL_OK;
    for (size_t i = first; i < n && rc == WAL_OK; i++) {
        uint32_t no = segs[i];
        bool last = i + 1 == n;
        /* Segment numbers are consecutive from the snapshot's on: a hole means someone deleted
         * a file. Its records are lost; the later ones are still good, so go on (log it). */
        uint32_t expect = i > first ? segs[i - 1] + 1 : first_segment;
        if (expect && no > expect) {
            stats->missing_segments += no - expect;
            log_error("wal", "WAL segments missing, their records are lost", LF_S("dir", dir),
                      LF_I("first_missing", expect), LF_I("count", no - expect));
        }
        char name[32], path[4096];
        seg_name(name, sizeof name, no, "");
        snprintf(path, sizeof path, "%s/%s", dir, name);
        int fd = openat(dirfd, name, O_RDWR | O_CLOEXEC);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            err_setf(err, errlen, "wal: open %s: %s", path, strerror(errno));
            if (fd >= 0)
                close(fd);
            rc = WAL_ERR_IO;
            break;
        }
        uint64_t fsize = (uint64_t)sb.st_size;
        seg_outcome_t outcome = SEG_OK;
        uint64_t bad_off = 0;
        const char *why = "";
        rc = replay_segment(&r, fd, no, &outcome, &bad_off, &why, err, errlen);
        stats->segments++;
        stats->last_segment = no;
        if (rc != WAL_OK || outcome == SEG_OK) {
            close(fd);
            continue;
        }

        if (last && outcome == SEG_TORN_HEADER) {
            /* the crash came while the segment was being created: it holds no record */
            log_warn("wal", "removing a segment torn at creation", LF_S("file", path), LF_I("size", fsize),
                     LF_S("reason", why));
            close(fd);
            if (unlinkat(dirfd, name, 0) != 0) {
                err_setf(err, errlen, "wal: remove %s: %s", path, strerror(errno));
                rc = WAL_ERR_IO;
            }
            fsync_dir(dirfd);
            stats->truncated = true;
            stats->bytes_dropped += fsize;
            break;
        }
        if (outcome == SEG_BAD_RECORD) {
            if (last)
                log_warn("wal", "torn or corrupt WAL tail, truncating", LF_S("file", path), LF_I("offset", bad_off),
                         LF_I("dropped_bytes", fsize - bad_off), LF_S("reason", why));
            else
                log_error("wal", "corrupt WAL segment, truncating it and setting later segments aside",
                          LF_S("file", path), LF_I("offset", bad_off), LF_I("dropped_bytes", fsize - bad_off),
                          LF_S("reason", why));
            int tr = ftruncate(fd, (off_t)bad_off);
            int te = errno;
            if (tr == 0 && fsync(fd) != 0) {
                tr = -1;
                te = errno;
            }
            close(fd);
            if (tr != 0) {
                err_setf(err, errlen, "wal: truncate %s at %" PRIu64 ": %s", path, bad_off, strerror(te));
                rc = WAL_ERR_IO;
                break;
            }
            stats->truncated = true;
            stats->bytes_dropped += fsize - bad_off;
            i++; /* this segment keeps its good prefix; set aside only the later ones */
        } else {
            close(fd);
            log_error("wal", "corrupt WAL segment header, setting it and later segments aside", LF_S("file", path),
                      LF_S("reason", why));
        }
        if (i < n)
            stats->corrupt_middle = true;
        for (; i < n; i++) {
            char from[32], to[48];
            seg_name(from, sizeof from, segs[i], "");
            seg_name(to, sizeof to, segs[i], ".corrupt");
            struct stat s2;
            if (fstatat(dirfd, from, &s2, 0) == 0)
                stats->bytes_dropped += (uint64_t)s2.st_size;
            if (renameat(dirfd, from, dirfd, to) != 0) {
                err_setf(err, errlen, "wal: rename %s/%s: %s", dir, from, strerror(errno));
                rc = WAL_ERR_IO;
                break;
            }
            log_error("wal", "set aside WAL segment", LF_S("file", from), LF_S("now", to));
        }
        if (fsync_dir(dirfd) != 0 && rc == WAL_OK) {
            err_setf(err, errlen, "wal: fsync %s: %s", dir, strerror(errno));
            rc = WAL_ERR_IO;
        }
        break;
    }
    close(dirfd);
    free(segs);
    buf_free(&r.payload);
    wal_record_decoder_free(&r.dec);
    return rc;
}
