/*
 * snapshot — an atomically replaced, fully checksummed container of typed records, kept beside
 * its predecessor; see snapshot.h for the contract. What the records mean is the head's business.
 *
 * ---- File layout (little-endian) ------------------------------------------------------------
 *
 * Header, 32 bytes:
 *   offset  size  field
 *   0       8     magic "SLUICESN"
 *   8       4     format version = 1
 *   12      4     WAL segment number: replay segments >= this on top of the snapshot
 *   16      8     created, unix milliseconds (int64)
 *   24      4     reserved, 0
 *   28      4     CRC-32C of bytes 0..27
 *
 * Then any number of records, each:
 *   0       1     type, 1..255
 *   1       3     reserved, 0
 *   4       4     payload length L <= SNAPSHOT_MAX_RECORD_BYTES
 *   8       4     CRC-32C of bytes 0..7 followed by the payload
 *   12      L     payload
 *
 * Trailer, 24 bytes, ending the file exactly:
 *   0       8     magic "SNAPEND\0" (a record can never start so: its reserved bytes are 0)
 *   8       8     number of records
 *   16      4     CRC-32C of every byte of the file before the trailer
 *   20      4     CRC-32C of trailer bytes 0..19
 *
 * The per-record CRCs say which record is bad; the whole-file CRC and the count make any flipped,
 * missing or extra byte fail verification, the reserved bytes included. A file without its
 * trailer is a truncated write and fails verification; so the rename in commit is the only
 * moment a snapshot becomes visible, and it happens after the data is fsync'd and read back.
 *
 * ---- Files on disk -------------------------------------------------------------------------
 *
 *   <path>.tmp              being written (a stale one is replaced by the next writer)
 *   <path>                  the newest snapshot
 *   <path>.prev             the one before it: the fallback when <path> turns out damaged
 *   <path>.corrupt-<ms>     damaged files set aside at start-up (never read, never deleted)
 *
 * Commit: fsync tmp -> verify tmp -> rename <path> to <path>.prev -> rename tmp to <path> ->
 * fsync the directory. A crash between the two renames leaves no <path> and the previous one as
 * <path>.prev, which the caller then loads (its WAL segments are still there: the caller only
 * drops segments below the older snapshot's, snapshot_oldest_wal_segment).
 *
 * ---- Reading -------------------------------------------------------------------------------
 *
 * One scan frames the records from the header on: a record whose header or CRC fails, or the
 * end of the file without a trailer, stops it. Strict open (snapshot_reader_open) then demands a
 * good trailer exactly at the end, the right count and the whole-file CRC; salvage
 * (snapshot_reader_salvage) accepts whatever the scan framed before it stopped. Records are
 * checked in place through a read-only mapping, so a corrupt length field cannot make the reader
 * allocate anything.
 */
#include "storage/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal/util/buf.h"
#include "internal/util/clock.h"
#include "internal/util/crc32c.h"
#include "internal/util/err.h"
#include "internal/util/endian.h"

#define SNAP_MAGIC "SLUICESN"
#define SNAP_END_MAGIC "SNAPEND\0"
#define SNAP_VERSION 1
#define SNAP_HEADER_BYTES 32
#define SNAP_REC_HEADER_BYTES 12
#define SNAP_TRAILER_BYTES 24
#define SNAP_FLUSH_BYTES (1u << 20)

/* ============================================================================================
 * Writer
 * ============================================================================================ */

struct snapshot_writer {
    char *path, *tmp;
    int fd;
    buf_t buf;    /* bytes not yet written */
    uint32_t crc; /* running CRC of everything emitted so far */
    uint64_t count;
    bool failed;
};

/* Writes n bytes at p to the file (short writes and EINTR retried); a failure fails the writer. */
static int writer_write(snapshot_writer_t *w, const void *p, size_t n, char *err, size_t errlen)
{
    const char *c = p;
    while (n) {
        ssize_t r = write(w->fd, c, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            err_setf(err, errlen, "snapshot: write %s: %s", w->tmp, strerror(errno));
            w->failed = true;
            return SNAPSHOT_ERR_IO;
        }
        c += r;
        n -= (size_t)r;
    }
    return SNAPSHOT_OK;
}

static int writer_flush(snapshot_writer_t *w, char *err, size_t errlen)
{
    int rc = writer_write(w, w->buf.data, w->buf.len, err, errlen);
    if (rc == SNAPSHOT_OK)
        buf_reset(&w->buf);
    return rc;
}

/* Appends to the staging buffer, keeping the running CRC. */
static void writer_emit(snapshot_writer_t *w, const void *p, size_t n)
{
    w->crc = crc32c_update(w->crc, p, n);
    buf_append(&w->buf, p, n);
}

static void writer_free(snapshot_writer_t *w)
{
    if (w->fd >= 0)
        close(w->fd);
    buf_free(&w->buf);
    free(w->path);
    free(w->tmp);
    free(w);
}

snapshot_writer_t *snapshot_writer_open(const char *path, uint32_t wal_segment, char *err, size_t errlen)
{
    snapshot_writer_t *w = calloc(1, sizeof *w);
    if (!w) {
        err_setf(err, errlen, "snapshot: out of memory");
        return NULL;
    }
    w->fd = -1;
    size_t pl = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(pl + 5);
    if (!w->path || !w->tmp) {
        err_setf(err, errlen, "snapshot: out of memory");
        writer_free(w);
        return NULL;
    }
    memcpy(w->tmp, path, pl);
    memcpy(w->tmp + pl, ".tmp", 5);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        err_setf(err, errlen, "snapshot: create %s: %s", w->tmp, strerror(errno));
        writer_free(w);
        return NULL;
    }
    int64_t now_ms = clock_wall_ms();
    uint8_t h[SNAP_HEADER_BYTES] = {0};
    memcpy(h, SNAP_MAGIC, 8);
    le_put32(h + 8, SNAP_VERSION);
    le_put32(h + 12, wal_segment);
    le_put64(h + 16, (uint64_t)now_ms);
    le_put32(h + 28, crc32c(h, 28));
    writer_emit(w, h, sizeof h);
    return w;
}

int snapshot_writer_add(snapshot_writer_t *w, uint8_t type, const void *data, size_t len, char *err, size_t errlen)
{
    if (w->failed) {
        err_setf(err, errlen, "snapshot: writer already failed");
        return SNAPSHOT_ERR_IO;
    }
    if (type == 0 || len > SNAPSHOT_MAX_RECORD_BYTES) {
        err_setf(err, errlen, "snapshot: bad record (type %u, %zu bytes)", type, len);
        w->failed = true; /* the head asked for something impossible: this snapshot is not whole */
        return SNAPSHOT_ERR_ARG;
    }
    uint8_t h[SNAP_REC_HEADER_BYTES] = {0};
    h[0] = type;
    le_put32(h + 4, (uint32_t)len);
    uint32_t crc = crc32c(h, 8);
    crc = crc32c_update(crc, data, len);
    le_put32(h + 8, crc);
    writer_emit(w, h, sizeof h);
    if (len >= SNAP_FLUSH_BYTES) {
        /* big record: do not copy it into the staging buffer */
        int rc = writer_flush(w, err, errlen);
        if (rc != SNAPSHOT_OK)
            return rc;
        w->crc = crc32c_update(w->crc, data, len);
        rc = writer_write(w, data, len, err, errlen);
        if (rc != SNAPSHOT_OK)
            return rc;
    } else if (len) {
        writer_emit(w, data, len);
    }
    w->count++;
    if (w->buf.len >= SNAP_FLUSH_BYTES)
        return writer_flush(w, err, errlen);
    return SNAPSHOT_OK;
}

int snapshot_writer_commit(snapshot_writer_t *w, char *err, size_t errlen)
{
    int rc = SNAPSHOT_OK;
    if (w->failed) {
        err_setf(err, errlen, "snapshot: writer already failed");
        rc = SNAPSHOT_ERR_IO;
    }
    if (rc == SNAPSHOT_OK) {
        uint8_t t[SNAP_TRAILER_BYTES];
        memcpy(t, SNAP_END_MAGIC, 8);
        le_put64(t + 8, w->count);
        le_put32(t + 16, w->crc);
        le_put32(t + 20, crc32c(t, 20));
        buf_append(&w->buf, t, sizeof t);
        rc = writer_flush(w, err, errlen);
    }
    if (rc == SNAPSHOT_OK && fsync(w->fd) != 0) {
        err_setf(err, errlen, "snapshot: fsync %s: %s", w->tmp, strerror(errno));
        rc = SNAPSHOT_ERR_IO;
    }
    if (rc == SNAPSHOT_OK && close(w->fd) != 0) {
        err_setf(err, errlen, "snapshot: close %s: %s", w->tmp, strerror(errno));
        rc = SNAPSHOT_ERR_IO;
    }
    w->fd = -1;
    if (rc == SNAPSHOT_OK) {
        /* Read it back before it replaces anything: a writer bug or a short write must cost this
         * snapshot, never the good one on disk. (The bytes likely come from the page cache; media
         * errors later are the start-up reader's and the kept predecessor's business.) */
        snapshot_reader_t *r;
        char verr[256];
        int vr = snapshot_reader_open(w->tmp, &r, verr, sizeof verr);
        snapshot_reader_close(r);
        if (vr != SNAPSHOT_OK) {
            err_setf(err, errlen, "snapshot: written file does not verify: %s", verr);
            rc = SNAPSHOT_ERR_IO;
        }
    }
    if (rc == SNAPSHOT_OK) {
        /* keep the current one as the predecessor (replacing the older predecessor) */
        size_t pl = strlen(w->path);
        char *prev = malloc(pl + sizeof SNAPSHOT_PREV_SUFFIX);
        if (!prev) {
            err_setf(err, errlen, "snapshot: out of memory");
            rc = SNAPSHOT_ERR_NOMEM;
        } else {
            memcpy(prev, w->path, pl);
            memcpy(prev + pl, SNAPSHOT_PREV_SUFFIX, sizeof SNAPSHOT_PREV_SUFFIX);
            if (rename(w->path, prev) != 0 && errno != ENOENT) {
                err_setf(err, errlen, "snapshot: rename %s: %s", w->path, strerror(errno));
                rc = SNAPSHOT_ERR_IO;
            }
            free(prev);
        }
    }
    if (rc == SNAPSHOT_OK && rename(w->tmp, w->path) != 0) {
        err_setf(err, errlen, "snapshot: rename %s: %s", w->tmp, strerror(errno));
        rc = SNAPSHOT_ERR_IO;
    }
    if (rc == SNAPSHOT_OK) {
        /* the rename is durable only once the directory is */
        char *d = strdup(w->path);
        int dfd = d ? open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (dfd < 0 || fsync(dfd) != 0) {
            err_setf(err, errlen, "snapshot: fsync directory of %s: %s", w->path,
                     d ? strerror(errno) : "out of memory");
            rc = SNAPSHOT_ERR_IO;
        }
        if (dfd >= 0)
            close(dfd);
        free(d);
    } else {
        unlink(w->tmp);
    }
    writer_free(w);
    return rc;
}

void snapshot_writer_abort(snapshot_writer_t *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    unlink(w->tmp);
    writer_free(w);
}

/* ============================================================================================
 * Reader
 * ============================================================================================ */

struct snapshot_reader {
    const uint8_t *map;
    size_t size;
    uint32_t wal_segment;
    int64_t created_ms;
    uint64_t count;   /* records delivered */
    int64_t expected; /* the trailer's count, -1 if unknown */
    bool whole;
    size_t pos; /* iteration offset */
    size_t end; /* where delivery stops: the trailer, or the first damaged record */
};

/* Verifies the header; returns 0 or SNAPSHOT_ERR_CORRUPT. */
static int header_check(const uint8_t *m, size_t size, const char *path, char *err, size_t errlen)
{
    if (size < SNAP_HEADER_BYTES) {
        err_setf(err, errlen, "snapshot %s: truncated (%zu bytes)", path, size);
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (memcmp(m, SNAP_MAGIC, 8) != 0 || le_get32(m + 28) != crc32c(m, 28) || le_get32(m + 24) != 0) {
        err_setf(err, errlen, "snapshot %s: bad header", path);
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (le_get32(m + 8) != SNAP_VERSION) {
        err_setf(err, errlen, "snapshot %s: unsupported version %" PRIu32, path, le_get32(m + 8));
        return SNAPSHOT_ERR_CORRUPT;
    }
    return SNAPSHOT_OK;
}

/* Verifies the mapped file (see "Reading" above). Returns SNAPSHOT_ERR_CORRUPT for a bad header,
 * otherwise 0 with r->whole telling whether every check passed and err naming the first failure;
 * r->end/count then cover the records framed before the scan stopped. */
static int reader_verify(snapshot_reader_t *r, const char *path, char *err, size_t errlen)
{
    const uint8_t *m = r->map;
    size_t size = r->size;
    int rc = header_check(m, size, path, err, errlen);
    if (rc != SNAPSHOT_OK)
        return rc;
    r->wal_segment = le_get32(m + 12);
    r->created_ms = (int64_t)le_get64(m + 16);
    r->expected = -1;
    r->whole = false;

    size_t off = SNAP_HEADER_BYTES;
    uint64_t count = 0;
    bool damaged = false;
    for (;;) {
        if (off == size) {
            err_setf(err, errlen, "snapshot %s: missing trailer after %" PRIu64 " records (truncated write?)", path,
                     count);
            damaged = true;
            break;
        }
        size_t left = size - off;
        if (left >= SNAP_TRAILER_BYTES && memcmp(m + off, SNAP_END_MAGIC, 8) == 0)
            break;
        const uint8_t *h = m + off;
        uint32_t len = left >= SNAP_REC_HEADER_BYTES ? le_get32(h + 4) : 0;
        if (left < SNAP_REC_HEADER_BYTES || h[0] == 0 || h[1] || h[2] || h[3] || len > SNAPSHOT_MAX_RECORD_BYTES ||
            len > left - SNAP_REC_HEADER_BYTES) {
            err_setf(err, errlen, "snapshot %s: bad record header at offset %zu (record %" PRIu64 ")", path, off,
                     count);
            damaged = true;
            break;
        }
        uint32_t crc = crc32c(h, 8);
        crc = crc32c_update(crc, h + SNAP_REC_HEADER_BYTES, len);
        if (crc != le_get32(h + 8)) {
            err_setf(err, errlen, "snapshot %s: record checksum mismatch at offset %zu (record %" PRIu64 ")", path, off,
                     count);
            damaged = true;
            break;
        }
        off += SNAP_REC_HEADER_BYTES + len;
        count++;
    }
    r->count = count;
    r->end = off;
    r->pos = SNAP_HEADER_BYTES;
    if (damaged) {
        /* the trailer, if it survived, says how many records the damage cost */
        const uint8_t *t = m + size - SNAP_TRAILER_BYTES;
        if (size - off >= SNAP_TRAILER_BYTES && memcmp(t, SNAP_END_MAGIC, 8) == 0 && le_get32(t + 20) == crc32c(t, 20))
            r->expected = (int64_t)le_get64(t + 8);
        return SNAPSHOT_OK;
    }

    const uint8_t *t = m + off;
    if (le_get32(t + 20) != crc32c(t, 20)) {
        err_setf(err, errlen, "snapshot %s: bad trailer after %" PRIu64 " records", path, count);
        return SNAPSHOT_OK;
    }
    r->expected = (int64_t)le_get64(t + 8);
    if (le_get64(t + 8) != count) {
        err_setf(err, errlen, "snapshot %s: trailer counts %" PRIu64 " records, file has %" PRIu64, path,
                 le_get64(t + 8), count);
        return SNAPSHOT_OK;
    }
    if (off + SNAP_TRAILER_BYTES != size) {
        err_setf(err, errlen, "snapshot %s: %zu bytes after the trailer", path, size - off - SNAP_TRAILER_BYTES);
        return SNAPSHOT_OK;
    }
    if (le_get32(t + 16) != crc32c(m, off)) {
        err_setf(err, errlen, "snapshot %s: whole-file checksum mismatch", path);
        return SNAPSHOT_OK;
    }
    r->whole = true;
    return SNAPSHOT_OK;
}

/* Maps and verifies <path>; salvage says whether a damaged file with a good header is opened. */
static int reader_open(const char *path, bool salvage, snapshot_reader_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        err_setf(err, errlen, "snapshot: open %s: %s", path, strerror(e));
        return e == ENOENT ? SNAPSHOT_ERR_NOT_FOUND : SNAPSHOT_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        err_setf(err, errlen, "snapshot: stat %s: %s", path, strerror(errno));
        close(fd);
        return SNAPSHOT_ERR_IO;
    }
    if ((size_t)sb.st_size < SNAP_HEADER_BYTES) {
        close(fd);
        err_setf(err, errlen, "snapshot %s: truncated (%zu bytes)", path, (size_t)sb.st_size);
        return SNAPSHOT_ERR_CORRUPT;
    }
    snapshot_reader_t *r = calloc(1, sizeof *r);
    if (!r) {
        close(fd);
        err_setf(err, errlen, "snapshot: out of memory");
        return SNAPSHOT_ERR_NOMEM;
    }
    r->size = (size_t)sb.st_size;
    void *m = mmap(NULL, r->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        err_setf(err, errlen, "snapshot: map %s: %s", path, strerror(errno));
        free(r);
        return SNAPSHOT_ERR_IO;
    }
    madvise(m, r->size, MADV_SEQUENTIAL);
    r->map = m;
    int rc = reader_verify(r, path, err, errlen);
    if (rc == SNAPSHOT_OK && !r->whole)
        rc = salvage ? SNAPSHOT_PARTIAL : SNAPSHOT_ERR_CORRUPT;
    if (rc != SNAPSHOT_OK && rc != SNAPSHOT_PARTIAL) {
        snapshot_reader_close(r);
        return rc;
    }
    *out = r;
    return rc;
}

int snapshot_reader_open(const char *path, snapshot_reader_t **out, char *err, size_t errlen)
{
    return reader_open(path, false, out, err, errlen);
}

int snapshot_reader_salvage(const char *path, snapshot_reader_t **out, char *err, size_t errlen)
{
    return reader_open(path, true, out, err, errlen);
}

void snapshot_reader_verdict(const snapshot_reader_t *r, snapshot_verdict_t *out)
{
    *out = (snapshot_verdict_t){.whole = r->whole,
                                .records = r->count,
                                .records_expected = r->expected,
                                .stop_offset = r->end,
                                .file_bytes = r->size};
}

uint32_t snapshot_reader_wal_segment(const snapshot_reader_t *r)
{
    return r->wal_segment;
}
uint64_t snapshot_reader_record_count(const snapshot_reader_t *r)
{
    return r->count;
}
int64_t snapshot_reader_created_ms(const snapshot_reader_t *r)
{
    return r->created_ms;
}

int snapshot_reader_next(snapshot_reader_t *r, uint8_t *type, const void **data, size_t *len)
{
    if (r->pos >= r->end)
        return 0;
    const uint8_t *h = r->map + r->pos;
    uint32_t l = le_get32(h + 4);
    *type = h[0];
    *data = h + SNAP_REC_HEADER_BYTES;
    *len = l;
    r->pos += SNAP_REC_HEADER_BYTES + l;
    return 1;
}

void snapshot_reader_rewind(snapshot_reader_t *r)
{
    r->pos = SNAP_HEADER_BYTES;
}

void snapshot_reader_close(snapshot_reader_t *r)
{
    if (!r)
        return;
    if (r->map)
        munmap((void *)r->map, r->size);
    free(r);
}

/* ============================================================================================
 * Files
 * ============================================================================================ */

int snapshot_read_wal_segment(const char *path, uint32_t *segment, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        err_setf(err, errlen, "snapshot: open %s: %s", path, strerror(e));
        return e == ENOENT ? SNAPSHOT_ERR_NOT_FOUND : SNAPSHOT_ERR_IO;
    }
    uint8_t h[SNAP_HEADER_BYTES];
    ssize_t n;
    do
        n = pread(fd, h, sizeof h, 0);
    while (n < 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (n < 0) {
        err_setf(err, errlen, "snapshot: read %s: %s", path, strerror(e));
        return SNAPSHOT_ERR_IO;
    }
    int rc = header_check(h, (size_t)n, path, err, errlen);
    if (rc == SNAPSHOT_OK)
        *segment = le_get32(h + 12);
    return rc;
}

int snapshot_oldest_wal_segment(const char *path, uint32_t *segment)
{
    char prev[4096], err[256];
    snprintf(prev, sizeof prev, "%s%s", path, SNAPSHOT_PREV_SUFFIX);
    uint32_t a, b;
    bool has_a = snapshot_read_wal_segment(path, &a, err, sizeof err) == SNAPSHOT_OK;
    bool has_b = snapshot_read_wal_segment(prev, &b, err, sizeof err) == SNAPSHOT_OK;
    if (!has_a && !has_b)
        return SNAPSHOT_ERR_NOT_FOUND;
    *segment = !has_b || (has_a && a < b) ? a : b;
    return SNAPSHOT_OK;
}

int snapshot_set_aside(const char *path, char *moved_to, size_t moved_len, char *err, size_t errlen)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        int e = errno;
        err_setf(err, errlen, "snapshot: stat %s: %s", path, strerror(e));
        return e == ENOENT ? SNAPSHOT_ERR_NOT_FOUND : SNAPSHOT_ERR_IO;
    }
    char to[4200];
    int64_t ms = clock_wall_ms();
    /* One daemon per data directory (it is locked), so nobody races us to the name. */
    for (int tries = 0;; tries++, ms++) {
        snprintf(to, sizeof to, "%s%s%" PRId64, path, SNAPSHOT_CORRUPT_SUFFIX, ms);
        if (lstat(to, &sb) != 0 && errno == ENOENT)
            break;
        if (tries == 1000) {
            err_setf(err, errlen, "snapshot: no free name to set %s aside", path);
            return SNAPSHOT_ERR_IO;
        }
    }
    if (rename(path, to) != 0) {
        err_setf(err, errlen, "snapshot: rename %s: %s", path, strerror(errno));
        return SNAPSHOT_ERR_IO;
    }
    if (moved_to && moved_len)
        snprintf(moved_to, moved_len, "%s", to);
    char *d = strdup(path);
    int dfd = d ? open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int rc = SNAPSHOT_OK;
    if (dfd < 0 || fsync(dfd) != 0) {
        err_setf(err, errlen, "snapshot: fsync directory of %s: %s", path, d ? strerror(errno) : "out of memory");
        rc = SNAPSHOT_ERR_IO; /* the rename happened; only its durability is in doubt */
    }
    if (dfd >= 0)
        close(dfd);
    free(d);
    return rc;
}
