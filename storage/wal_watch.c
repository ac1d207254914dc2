/*
 * wal_watch — follows the WAL read-only (contract in wal_watch.h). Headers and records are read
 * with storage/wal_record (the same frame reader replay uses); this file decides only what a bad
 * or missing piece means for a reader that races the writer.
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
#include "internal/util/log.h"
#include "storage/wal_record.h"

struct wal_watch {
    char *dir;
    wal_pos_t pos;
    int fd;        /* -1 = segment pos.segment not open */
    buf_t payload; /* the last record's payload (wal_record_read reuses it) */
    wal_watch_stats_t stats;
};

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

uint32_t wal_watch_last_segment(const char *dir)
{
    return scan(dir, 0, 1);
}
uint32_t wal_watch_next_segment(const char *dir, uint32_t after)
{
    return scan(dir, after, 0);
}

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
    buf_free(&w->payload);
    free(w->dir);
    free(w);
}

wal_pos_t wal_watch_pos(const wal_watch_t *w)
{
    return w->pos;
}
void wal_watch_get_stats(const wal_watch_t *w, wal_watch_stats_t *out)
{
    *out = w->stats;
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
                 LF_I("first_missing", why == WW_MISSING ? w->pos.segment : w->pos.segment + 1), LF_I("count", gap));
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
        const char *why = "";
        char err[256];
        if (w->pos.offset < WAL_SEG_HEADER_BYTES) {
            int hr = wal_record_read_seg_header(w->fd, w->pos.segment, &why, err, sizeof(err));
            if (hr < 0)
                return WAL_WATCH_ERR_IO;
            if (hr != WAL_RECORD_OK) {
                if (advance(w, later, WW_TORN))
                    continue;
                return WAL_WATCH_EOF;
            }
            w->pos.offset = WAL_SEG_HEADER_BYTES;
        }
        wal_record_t rec;
        int rr = wal_record_read(w->fd, w->pos.offset, &w->payload, &rec, &why, err, sizeof(err));
        if (rr < 0)
            return rr == WAL_ERR_NOMEM ? WAL_WATCH_ERR_NOMEM : WAL_WATCH_ERR_IO;
        if (rr == WAL_RECORD_END) {
            if (advance(w, later, WW_END))
                continue;
            return WAL_WATCH_EOF;
        }
        if (rr != WAL_RECORD_OK) {
            if (advance(w, later, WW_TORN))
                continue;
            return WAL_WATCH_EOF; /* being written: look again later */
        }
        *type = rec.type;
        *payload = rec.payload;
        *len = rec.len;
        *at = w->pos;
        w->pos.offset += WAL_REC_HEADER_BYTES + (uint64_t)rec.len;
        w->stats.records++;
        w->stats.bytes += WAL_REC_HEADER_BYTES + (uint64_t)rec.len;
        return WAL_WATCH_RECORD;
    }
}
