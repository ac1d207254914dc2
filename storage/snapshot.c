/*
 * snapshot — an atomically replaced, fully checksummed container of typed records; see
 * snapshot.h for the contract. What the records mean is the head's business.
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
 * trailer is a truncated write and is rejected; so the rename in commit is the only moment a
 * snapshot becomes visible, and it happens after the data is fsync'd.
 *
 * Records are checked in place through a read-only mapping, so a corrupt length field cannot make
 * the reader allocate anything.
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
    uint64_t count;
    size_t pos; /* iteration offset */
    size_t end; /* offset of the trailer */
};

/* Verifies the mapped file; returns 0 or SNAPSHOT_ERR_CORRUPT with err naming the offset. */
static int reader_verify(snapshot_reader_t *r, const char *path, char *err, size_t errlen)
{
    const uint8_t *m = r->map;
    size_t size = r->size;
    if (size < SNAP_HEADER_BYTES + SNAP_TRAILER_BYTES) {
        err_setf(err, errlen, "snapshot %s: truncated (%zu bytes)", path, size);
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (memcmp(m, SNAP_MAGIC, 8) != 0 || le_get32(m + 28) != crc32c(m, 28)) {
        err_setf(err, errlen, "snapshot %s: bad header", path);
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (le_get32(m + 8) != SNAP_VERSION) {
        err_setf(err, errlen, "snapshot %s: unsupported version %" PRIu32, path, le_get32(m + 8));
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (le_get32(m + 24) != 0) {
        err_setf(err, errlen, "snapshot %s: bad header", path);
        return SNAPSHOT_ERR_CORRUPT;
    }
    r->wal_segment = le_get32(m + 12);
    r->created_ms = (int64_t)le_get64(m + 16);

    size_t end = size - SNAP_TRAILER_BYTES;
    size_t off = SNAP_HEADER_BYTES;
    uint64_t count = 0;
    while (off < end) {
        if (end - off < SNAP_REC_HEADER_BYTES) {
            err_setf(err, errlen, "snapshot %s: short record header at offset %zu", path, off);
            return SNAPSHOT_ERR_CORRUPT;
        }
        const uint8_t *h = m + off;
        uint32_t len = le_get32(h + 4);
        if (h[0] == 0 || h[1] || h[2] || h[3] || len > SNAPSHOT_MAX_RECORD_BYTES ||
            len > end - off - SNAP_REC_HEADER_BYTES) {
            err_setf(err, errlen, "snapshot %s: bad record header at offset %zu", path, off);
            return SNAPSHOT_ERR_CORRUPT;
        }
        uint32_t crc = crc32c(h, 8);
        crc = crc32c_update(crc, h + SNAP_REC_HEADER_BYTES, len);
        if (crc != le_get32(h + 8)) {
            err_setf(err, errlen, "snapshot %s: record checksum mismatch at offset %zu", path, off);
            return SNAPSHOT_ERR_CORRUPT;
        }
        off += SNAP_REC_HEADER_BYTES + len;
        count++;
    }
    const uint8_t *t = m + end;
    if (memcmp(t, SNAP_END_MAGIC, 8) != 0 || le_get32(t + 20) != crc32c(t, 20)) {
        err_setf(err, errlen, "snapshot %s: missing or bad trailer (truncated write?)", path);
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (le_get64(t + 8) != count) {
        err_setf(err, errlen, "snapshot %s: trailer counts %" PRIu64 " records, file has %" PRIu64, path,
                 le_get64(t + 8), count);
        return SNAPSHOT_ERR_CORRUPT;
    }
    if (le_get32(t + 16) != crc32c(m, end)) {
        err_setf(err, errlen, "snapshot %s: whole-file checksum mismatch", path);
        return SNAPSHOT_ERR_CORRUPT;
    }
    r->count = count;
    r->end = end;
    r->pos = SNAP_HEADER_BYTES;
    return SNAPSHOT_OK;
}

int snapshot_reader_open(const char *path, snapshot_reader_t **out, char *err, size_t errlen)
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
    snapshot_reader_t *r = calloc(1, sizeof *r);
    if (!r) {
        close(fd);
        err_setf(err, errlen, "snapshot: out of memory");
        return SNAPSHOT_ERR_NOMEM;
    }
    r->size = (size_t)sb.st_size;
    if (r->size < SNAP_HEADER_BYTES + SNAP_TRAILER_BYTES) {
        close(fd);
        free(r);
        err_setf(err, errlen, "snapshot %s: truncated (%zu bytes)", path, (size_t)sb.st_size);
        return SNAPSHOT_ERR_CORRUPT;
    }
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
    if (rc != SNAPSHOT_OK) {
        snapshot_reader_close(r);
        return rc;
    }
    *out = r;
    return SNAPSHOT_OK;
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
