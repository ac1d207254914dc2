/*
 * wal_watch — follows the WAL read-only (contract in wal_watch.h; byte layout in wal.c).
 *
 * Reader state machine (one step per wal_watch_next call, looping until a record or EOF):
 *
 *   CLOSED --open(seg) ok--> OPEN --offset 0: header ok--> OPEN(offset 16)
 *      |  missing: a later segment exists? skip to it : EOF
 *   OPEN --record complete, CRC ok--> return it, offset += 12 + L
 *      |  short / bad: segment final (a later one existed before the read)? next segment : EOF
 *
 * "A later one existed before the read" is checked before each read attempt that fails, so a
 * record that is being written while we look is never mistaken for a torn tail: a segment only
 * becomes final after its last write (wal_cut closes it first), so if the later segment was there
 * before we read, everything the writer will ever put in this one was already there.
 */
#include "storage/wal_watch.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/util/buf.h"
#include "internal/util/crc32c.h"
#include "internal/util/log.h"
#include "internal/util/varint.h"

#define WW_SEG_HEADER 16
#define WW_REC_HEADER 12

struct wal_watch {
    char *dir;
    wal_pos_t pos;
    int fd; /* -1 = segment pos.segment not open */
    uint8_t *payload;
    size_t payload_cap;
    wal_watch_stats_t stats;
};

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- directory ------------------------------------------------------------------------------- */

/* Parses "NNNNNNNN.wal" exactly (not .wal.corrupt); 0 if it is something else. */
static uint32_t seg_number(const char *name)
{
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".wal") != 0)
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n - 4; i++) {
        if (name[i] < '0' || name[i] > '9' || v > UINT32_MAX)
            return 0;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    return v <= UINT32_MAX ? (uint32_t)v : 0;
}

static uint32_t scan(const char *dir, uint32_t after, int want_max)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    uint32_t best = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint32_t no = seg_number(e->d_name);
        if (!no || no <= after)
            continue;
        if (want_max ? no > best : (best == 0 || no < best))
            best = no;
    }
    closedir(d);
    return best;
}

uint32_t wal_watch_last_segment(const char *dir) { return scan(dir, 0, 1); }
uint32_t wal_watch_next_segment(const char *dir, uint32_t after) { return scan(dir, after, 0); }

/* ---- reader ---------------------------------------------------------------------------------- */

wal_watch_t *wal_watch_open(const char *dir, wal_pos_t start)
{
    wal_watch_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return NULL;
    }
    w->pos = start;
    w->fd = -1;
    return w;
}

void wal_watch_close(wal_watch_t *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    free(w->payload);
    free(w->dir);
    free(w);
}

wal_pos_t wal_watch_pos(const wal_watch_t *w) { return w->pos; }
void wal_watch_get_stats(const wal_watch_t *w, wal_watch_stats_t *out) { *out = w->stats; }

/* Reads exactly n bytes at off; returns bytes read (< n at end of file) or -1. */
static ssize_t read_at(int fd, void *p, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (uint8_t *)p + got, n - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

enum { WW_END, WW_MISSING, WW_TORN };

/* Leaves the current segment for `next` (0 = there is none yet: stay). Returns 1 if moved. */
static int advance(wal_watch_t *w, uint32_t next, int why)
{
    if (!next)
        return 0;
    assert(next > w->pos.segment);
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    uint32_t gap = next - w->pos.segment - 1 + (why == WW_MISSING ? 1 : 0);
    if (gap) {
        w->stats.segments_skipped += gap;
        log_warn("wal_watch", "WAL segments skipped (deleted before they were read)", LF_S("dir", w->dir),
                 LF_I("first_missing", why == WW_MISSING ? w->pos.segment : w->pos.segment + 1),
                 LF_I("count", gap));
    }
    if (why == WW_TORN) {
        w->stats.torn_tails++;
        log_warn("wal_watch", "left a finished WAL segment at a torn or corrupt record", LF_S("dir", w->dir),
                 LF_I("segment", w->pos.segment), LF_I("offset", (int64_t)w->pos.offset));
    }
    w->pos.segment = next;
    w->pos.offset = 0;
    return 1;
}

int wal_watch_next(wal_watch_t *w, uint8_t *type, const uint8_t **payload, size_t *len, wal_pos_t *at)
{
    for (;;) {
        if (w->fd < 0) {
            char path[4096];
            if (w->pos.segment == 0) {
                /* Nothing chosen yet: start at the oldest segment there is. */
                uint32_t first = wal_watch_next_segment(w->dir, 0);
                if (!first)
                    return WAL_WATCH_EOF;
                w->pos.segment = first;
                w->pos.offset = 0;
            }
            snprintf(path, sizeof(path), "%s/%08" PRIu32 ".wal", w->dir, w->pos.segment);
            w->fd = open(path, O_RDONLY | O_CLOEXEC);
            if (w->fd < 0) {
                if (errno != ENOENT)
                    return WAL_WATCH_ERR_IO;
                if (advance(w, wal_watch_next_segment(w->dir, w->pos.segment), WW_MISSING))
                    continue;
                return WAL_WATCH_EOF;
            }
        }
        /* Whether this segment is final must be known before the read (see the top). */
        uint32_t later = wal_watch_next_segment(w->dir, w->pos.segment);
        if (w->pos.offset < WW_SEG_HEADER) {
            uint8_t h[WW_SEG_HEADER];
            ssize_t r = read_at(w->fd, h, sizeof(h), 0);
            if (r < 0)
                return WAL_WATCH_ERR_IO;
            if (r < WW_SEG_HEADER || memcmp(h, "SLWL", 4) != 0 || crc32c(h, 12) != get_u32(h + 12)) {
                if (advance(w, later, WW_TORN))
                    continue;
                return WAL_WATCH_EOF;
            }
            w->pos.offset = WW_SEG_HEADER;
        }
        uint8_t rh[WW_REC_HEADER];
        ssize_t r = read_at(w->fd, rh, sizeof(rh), w->pos.offset);
        if (r < 0)
            return WAL_WATCH_ERR_IO;
        if (r == 0) {
            if (advance(w, later, WW_END))
                continue;
            return WAL_WATCH_EOF;
        }
        uint32_t plen = get_u32(rh + 4);
        int bad = r < WW_REC_HEADER || rh[0] == 0 || rh[1] != 0 || rh[2] != 0 || rh[3] != 0 || plen == 0 ||
                  plen > WAL_MAX_RECORD_BYTES;
        if (!bad) {
            if (plen > w->payload_cap) {
                size_t cap = w->payload_cap ? w->payload_cap : 4096;
                while (cap < plen)
                    cap *= 2;
                uint8_t *np = realloc(w->payload, cap);
                if (!np)
                    return WAL_WATCH_ERR_NOMEM;
                w->payload = np;
                w->payload_cap = cap;
            }
            ssize_t pr = read_at(w->fd, w->payload, plen, w->pos.offset + WW_REC_HEADER);
            if (pr < 0)
                return WAL_WATCH_ERR_IO;
            bad = (size_t)pr < plen ||
                  crc32c_update(crc32c(rh, 8), w->payload, plen) != get_u32(rh + 8);
        }
        if (bad) {
            if (advance(w, later, WW_TORN))
                continue;
            return WAL_WATCH_EOF; /* being written: look again later */
        }
        *type = rh[0];
        *payload = w->payload;
        *len = plen;
        *at = w->pos;
        w->pos.offset += WW_REC_HEADER + (uint64_t)plen;
        w->stats.records++;
        w->stats.bytes += WW_REC_HEADER + (uint64_t)plen;
        return WAL_WATCH_RECORD;
    }
}

/* ---- payload decoding ------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *p, *end;
    int err;
} rd_t;

/* The varint at r->p, or 0 with r->err set when it is truncated or overflows. */
static uint64_t rd_uvarint(rd_t *r)
{
    uint64_t v = 0;
    if (varint_get(&r->p, r->end, &v) != VARINT_OK)
        r->err = -1;
    return v;
}

static uint64_t rd_fixed(rd_t *r, int n)
{
    if (r->end - r->p < n) {
        r->err = -1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return v;
}

int wal_watch_decode_series(const uint8_t *p, size_t len,
                            int (*fn)(void *ud, uint64_t id, const labels_t *ls), void *ud)
{
    rd_t r = {p, p + len, 0};
    uint32_t count = (uint32_t)rd_fixed(&r, 4);
    buf_t strs = BUF_INIT;
    label_t *lv = NULL;
    size_t lcap = 0;
    size_t *offs = NULL;
    int rc = 0;
    for (uint32_t i = 0; i < count && !r.err && rc == 0; i++) {
        uint64_t id = rd_uvarint(&r);
        uint64_t nl = rd_uvarint(&r);
        if (r.err || nl > (uint64_t)(r.end - r.p)) {
            r.err = -1;
            break;
        }
        if (nl > lcap) {
            lcap = nl;
            label_t *nv = realloc(lv, lcap * sizeof(*lv));
            size_t *no = realloc(offs, lcap * 2 * sizeof(*offs));
            if (nv)
                lv = nv;
            if (no)
                offs = no;
            if (!nv || !no) {
                rc = -1;
                break;
            }
        }
        buf_reset(&strs);
        for (uint64_t k = 0; k < nl * 2 && !r.err; k++) {
            uint64_t sl = rd_uvarint(&r);
            if (r.err || sl > (uint64_t)(r.end - r.p)) {
                r.err = -1;
                break;
            }
            offs[k] = strs.len;
            buf_append(&strs, r.p, (size_t)sl);
            buf_putc(&strs, 0);
            r.p += sl;
        }
        if (r.err)
            break;
        for (uint64_t k = 0; k < nl; k++) {
            lv[k].name = strs.data + offs[2 * k];
            lv[k].value = strs.data + offs[2 * k + 1];
        }
        labels_t ls = {lv, (size_t)nl};
        rc = fn(ud, id, &ls);
    }
    buf_free(&strs);
    free(lv);
    free(offs);
    if (rc)
        return rc;
    return r.err ? -1 : 0;
}

int wal_watch_decode_samples(const uint8_t *p, size_t len,
                             int (*fn)(void *ud, const wal_sample_t *s, size_t n), void *ud)
{
    enum { CHUNK = 1024 };
    wal_sample_t chunk[CHUNK];
    rd_t r = {p, p + len, 0};
    uint32_t count = (uint32_t)rd_fixed(&r, 4);
    if (r.err || count == 0)
        return -1;
    uint64_t id = 0;
    int64_t t = 0;
    size_t n = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (i == 0) {
            id = rd_uvarint(&r);
            t = varint_unzigzag(rd_uvarint(&r));
        } else {
            id += (uint64_t)varint_unzigzag(rd_uvarint(&r));
            t = (int64_t)((uint64_t)t + (uint64_t)varint_unzigzag(rd_uvarint(&r)));
        }
        uint64_t bits = rd_fixed(&r, 8);
        if (r.err)
            return -1;
        chunk[n].series_id = id;
        chunk[n].t_ms = t;
        memcpy(&chunk[n].v, &bits, 8);
        if (++n == CHUNK) {
            int rc = fn(ud, chunk, n);
            if (rc)
                return rc;
            n = 0;
        }
    }
    if (n) {
        int rc = fn(ud, chunk, n);
        if (rc)
            return rc;
    }
    return 0;
}
