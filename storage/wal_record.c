/*
 * wal_record — WAL segment bytes: encoders, the frame reader and the payload decoders (byte
 * tables and contract in wal_record.h).
 *
 * The frame reader reads a record in two preads (header, then payload) and trusts nothing: a
 * length field is checked against the format's limit and, before the payload buffer grows,
 * against the file's size, so a garbage length never makes it allocate more than the file holds.
 *
 * The decoders validate a whole payload (varints in range, lengths inside the payload, no NUL in a
 * label, nothing left over) before they deliver anything, so a caller never acts on half a record.
 */
#include "storage/wal_record.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal/util/crc32c.h"
#include "internal/util/endian.h"
#include "internal/util/varint.h"

#define WAL_SEG_MAGIC "SLWL"
#define WAL_SEG_VERSION 1
/* Split sample batches so one record stays modest (replay allocates one record at a time). */
#define WAL_SAMPLES_PER_RECORD 65536
/* Start a new series record once the current payload passes this. */
#define WAL_SERIES_RECORD_SOFT_BYTES (1u << 20)
/* Smallest encoded sample: 1-byte id, 1-byte t, 8-byte value. */
#define WAL_MIN_SAMPLE_BYTES 10

/* ============================================================================================
 * Little-endian and varint helpers
 * ============================================================================================ */

static void buf_put_u64le(buf_t *b, uint64_t v)
{
    uint8_t t[8];
    le_put64(t, v);
    buf_append(b, t, 8);
}

/* A bounded reader: any overrun or overlong varint sets err and reads as 0 (varint_get refuses a
 * 10th byte above 1, which overflows 64 bits, as the WAL always has). */
typedef struct {
    const uint8_t *p, *end;
    int err;
} rd_t;

static uint64_t rd_uvarint(rd_t *r)
{
    uint64_t v = 0;
    if (varint_get(&r->p, r->end, &v) != VARINT_OK) {
        r->err = -1;
        return 0;
    }
    return v;
}

static int64_t rd_svarint(rd_t *r)
{
    return varint_unzigzag(rd_uvarint(r));
}

static uint64_t rd_u64le(rd_t *r)
{
    if (r->end - r->p < 8) {
        r->err = -1;
        return 0;
    }
    uint64_t v = le_get64(r->p);
    r->p += 8;
    return v;
}

static uint32_t rd_u32le(rd_t *r)
{
    if (r->end - r->p < 4) {
        r->err = -1;
        return 0;
    }
    uint32_t v = le_get32(r->p);
    r->p += 4;
    return v;
}

/* ============================================================================================
 * Writing
 * ============================================================================================ */

void wal_record_seg_header(uint8_t h[WAL_SEG_HEADER_BYTES], uint32_t no)
{
    memcpy(h, WAL_SEG_MAGIC, 4);
    le_put16(h + 4, WAL_SEG_VERSION);
    le_put16(h + 6, 0);
    le_put32(h + 8, no);
    le_put32(h + 12, crc32c(h, 12));
}

/* Starts a record in b: reserves the header; returns its offset for rec_finish. */
static size_t rec_begin(buf_t *b)
{
    size_t off = b->len;
    uint8_t zero[WAL_REC_HEADER_BYTES] = {0};
    buf_append(b, zero, sizeof zero);
    return off;
}

/* Fills in the header of the record started at off. Returns 0 or WAL_ERR_TOO_LARGE. */
static int rec_finish(buf_t *b, size_t off, uint8_t type)
{
    size_t plen = b->len - off - WAL_REC_HEADER_BYTES;
    if (plen == 0 || plen > WAL_MAX_RECORD_BYTES)
        return WAL_ERR_TOO_LARGE;
    uint8_t *h = (uint8_t *)b->data + off;
    h[0] = type;
    h[1] = 0;
    le_put16(h + 2, 0);
    le_put32(h + 4, (uint32_t)plen);
    uint32_t crc = crc32c(h, 8);
    crc = crc32c_update(crc, h + WAL_REC_HEADER_BYTES, plen);
    le_put32(h + 8, crc);
    return WAL_OK;
}

/* One string of a SERIES_SHARED series: 0 when it is `was` (the previous series' string at that
 * place; NULL: none), else its length + 1 and its bytes. Neighbours from one push mostly hold the
 * same interned pointer, so the common case compares no bytes. */
static void put_shared(buf_t *b, const char *str, const char *was)
{
    if (was && (was == str || strcmp(was, str) == 0)) {
        buf_putc(b, 0);
        return;
    }
    size_t n = strlen(str);
    varint_put(b, n + 1);
    buf_append(b, str, n);
}

int wal_record_encode_series(buf_t *b, const wal_series_t *s, size_t n, uint64_t *nrec)
{
    size_t i = 0;
    while (i < n) {
        size_t off = rec_begin(b);
        size_t count_at = b->len;
        buf_append(b, "\0\0\0\0", 4);
        uint32_t count = 0;
        while (i < n && (count == 0 || b->len - count_at < WAL_SERIES_RECORD_SOFT_BYTES)) {
            varint_put(b, s[i].id);
            varint_put(b, s[i].labels.n);
            /* the previous series of this record, whose strings a 0 stands for */
            const labels_t *prev = count > 0 ? &s[i - 1].labels : NULL;
            for (size_t k = 0; k < s[i].labels.n; k++) {
                const label_t *l = &s[i].labels.v[k];
                if (!l->name || !l->value)
                    return WAL_ERR_ARG;
                const label_t *pl = prev && k < prev->n ? &prev->v[k] : NULL;
                put_shared(b, l->name, pl ? pl->name : NULL);
                put_shared(b, l->value, pl ? pl->value : NULL);
            }
            count++;
            i++;
        }
        le_put32((uint8_t *)b->data + count_at, count);
        int rc = rec_finish(b, off, WAL_REC_SERIES_SHARED);
        if (rc != WAL_OK)
            return rc;
        (*nrec)++;
    }
    return WAL_OK;
}

void wal_record_encode_samples(buf_t *b, const wal_sample_t *s, size_t n, uint64_t *nrec)
{
    size_t i = 0;
    while (i < n) {
        size_t cnt = n - i < WAL_SAMPLES_PER_RECORD ? n - i : WAL_SAMPLES_PER_RECORD;
        buf_reserve(b, WAL_REC_HEADER_BYTES + 4 + cnt * 28);
        size_t off = rec_begin(b);
        uint8_t c4[4];
        le_put32(c4, (uint32_t)cnt);
        buf_append(b, c4, 4);
        uint64_t pid = 0;
        int64_t pt = 0;
        for (size_t k = 0; k < cnt; k++) {
            const wal_sample_t *x = &s[i + k];
            uint64_t vb;
            memcpy(&vb, &x->v, 8);
            if (k == 0) {
                varint_put(b, x->series_id);
                varint_put_signed(b, x->t_ms);
            } else {
                varint_put_signed(b, (int64_t)(x->series_id - pid));
                varint_put_signed(b, (int64_t)((uint64_t)x->t_ms - (uint64_t)pt));
            }
            buf_put_u64le(b, vb);
            pid = x->series_id;
            pt = x->t_ms;
        }
        /* 65536 samples * 28 bytes < 64 MiB: cannot be too large */
        int rc = rec_finish(b, off, WAL_REC_SAMPLES);
        (void)rc;
        (*nrec)++;
        i += cnt;
    }
}

void wal_record_encode_blob(buf_t *b, uint8_t tag, const void *data, size_t len)
{
    size_t off = rec_begin(b);
    buf_append(b, &tag, 1);
    if (len)
        buf_append(b, data, len);
    int rc = rec_finish(b, off, WAL_REC_BLOB); /* len < WAL_MAX_RECORD_BYTES: cannot fail */
    (void)rc;
}

/* ============================================================================================
 * Reading frames
 * ============================================================================================ */

/* Reads up to n bytes at off; *got is how many (fewer at the end of the file). 0 or -errno. */
static int pread_full(int fd, void *p, size_t n, uint64_t off, size_t *got)
{
    char *c = p;
    *got = 0;
    while (*got < n) {
        ssize_t r = pread(fd, c + *got, n - *got, (off_t)(off + *got));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    return 0;
}

int wal_record_read_seg_header(int fd, uint32_t no, const char **why, char *err, size_t errlen)
{
    uint8_t h[WAL_SEG_HEADER_BYTES];
    size_t got;
    int e = pread_full(fd, h, sizeof h, 0, &got);
    if (e) {
        snprintf(err, errlen, "read segment %08" PRIu32 ": %s", no, strerror(-e));
        return WAL_ERR_IO;
    }
    if (got < sizeof h) {
        *why = "short segment header";
        return WAL_RECORD_TORN;
    }
    uint8_t expect[WAL_SEG_HEADER_BYTES];
    wal_record_seg_header(expect, no);
    if (memcmp(h, expect, sizeof h) == 0)
        return WAL_RECORD_OK;
    *why = le_get16(h + 4) != WAL_SEG_VERSION && memcmp(h, WAL_SEG_MAGIC, 4) == 0 ? "unsupported segment version"
                                                                                  : "bad segment header";
    static const uint8_t zero[WAL_SEG_HEADER_BYTES];
    return memcmp(h, zero, sizeof h) == 0 ? WAL_RECORD_TORN : WAL_RECORD_BAD;
}

int wal_record_read(int fd, uint64_t off, buf_t *payload, wal_record_t *rec, const char **why, char *err, size_t errlen)
{
    uint8_t rh[WAL_REC_HEADER_BYTES];
    size_t got;
    int e = pread_full(fd, rh, sizeof rh, off, &got);
    if (e)
        goto io_error;
    if (got == 0)
        return WAL_RECORD_END;
    if (got < sizeof rh) {
        *why = "short record header";
        return WAL_RECORD_BAD;
    }
    uint32_t len = le_get32(rh + 4);
    if (rh[0] == 0 || rh[1] != 0 || le_get16(rh + 2) != 0) {
        *why = "bad record header";
        return WAL_RECORD_BAD;
    }
    if (len == 0 || len > WAL_MAX_RECORD_BYTES) {
        *why = "bad record length";
        return WAL_RECORD_BAD;
    }
    buf_reset(payload);
    if (len >= payload->cap) {
        /* never trust a length past the end of the file: no allocation beyond what is there */
        struct stat sb;
        if (fstat(fd, &sb) != 0) {
            e = -errno;
            goto io_error;
        }
        if ((uint64_t)sb.st_size < off + WAL_REC_HEADER_BYTES + len) {
            *why = "short record payload";
            return WAL_RECORD_BAD;
        }
        if (buf_try_reserve(payload, len) != 0) {
            snprintf(err, errlen, "out of memory for a %" PRIu32 "-byte record", len);
            return WAL_ERR_NOMEM;
        }
    }
    e = pread_full(fd, payload->data, len, off + WAL_REC_HEADER_BYTES, &got);
    if (e)
        goto io_error;
    if (got < len) {
        *why = "short record payload";
        return WAL_RECORD_BAD;
    }
    payload->len = len;
    payload->data[len] = 0;
    if (crc32c_update(crc32c(rh, 8), payload->data, len) != le_get32(rh + 8)) {
        *why = "record checksum mismatch";
        return WAL_RECORD_BAD;
    }
    rec->type = rh[0];
    rec->payload = (const uint8_t *)payload->data;
    rec->len = len;
    return WAL_RECORD_OK;
io_error:
    snprintf(err, errlen, "read at offset %" PRIu64 ": %s", off, strerror(-e));
    return WAL_ERR_IO;
}

/* ============================================================================================
 * Decoding payloads
 * ============================================================================================ */

void wal_record_decoder_init(wal_record_decoder_t *d)
{
    memset(d, 0, sizeof(*d));
    buf_init(&d->strs);
}

void wal_record_decoder_free(wal_record_decoder_t *d)
{
    buf_free(&d->strs);
    free(d->labels);
    free(d->samples);
    memset(d, 0, sizeof(*d));
}

bool wal_record_is_series(uint8_t type)
{
    return type == WAL_REC_SERIES || type == WAL_REC_SERIES_SHARED;
}

/* The length of the next string of a series payload, which must be in the payload; SIZE_MAX for a
 * SERIES_SHARED "as the previous series" (0). rd.err set on a bad one. */
static size_t rd_string_len(rd_t *rd, bool shared)
{
    uint64_t sl = rd_uvarint(rd);
    if (shared) {
        if (sl == 0)
            return SIZE_MAX;
        sl--;
    }
    if (rd->err || sl > (uint64_t)(rd->end - rd->p) || memchr(rd->p, 0, (size_t)sl)) {
        rd->err = -1; /* past the end, or a NUL inside: labels are C strings */
        return 0;
    }
    return (size_t)sl;
}

int wal_record_decode_series(wal_record_decoder_t *d, uint8_t type, const uint8_t *p, size_t len,
                             int (*fn)(void *ud, uint64_t id, const labels_t *ls), void *ud)
{
    if (!wal_record_is_series(type))
        return WAL_ERR_CORRUPT;
    bool shared = type == WAL_REC_SERIES_SHARED;
    rd_t rd = {p, p + len, 0};
    uint32_t count = rd_u32le(&rd);
    if (rd.err || count == 0 || count > len / 2)
        return WAL_ERR_CORRUPT;
    /* pass 1: validate (a shared string needs the previous series to have that label), size the
     * scratch */
    size_t max_labels = 0, nstrings = 0;
    uint64_t prev_nl = 0;
    for (uint32_t i = 0; i < count; i++) {
        rd_uvarint(&rd);
        uint64_t nl = rd_uvarint(&rd);
        if (rd.err || nl > len)
            return WAL_ERR_CORRUPT;
        if (nl > max_labels)
            max_labels = nl;
        for (uint64_t k = 0; k < 2 * nl; k++) {
            size_t sl = rd_string_len(&rd, shared);
            if (rd.err || (sl == SIZE_MAX && (i == 0 || k / 2 >= prev_nl)))
                return WAL_ERR_CORRUPT;
            if (sl != SIZE_MAX)
                rd.p += sl;
        }
        nstrings += 2 * nl;
        prev_nl = nl;
    }
    if (rd.p != rd.end)
        return WAL_ERR_CORRUPT;
    if (max_labels > d->labels_cap) {
        label_t *nl = realloc(d->labels, max_labels * sizeof *nl);
        if (!nl)
            return WAL_ERR_NOMEM;
        d->labels = nl;
        d->labels_cap = max_labels;
    }
    /* pass 2: deliver. Every string of the record goes into strs, which is sized for all of them
     * (at most the payload's bytes plus a NUL each) and so never moves: a shared string is the
     * previous series' pointer, still in d->labels[k] when label k is read. */
    buf_reset(&d->strs);
    if (buf_try_reserve(&d->strs, len + nstrings) != 0)
        return WAL_ERR_NOMEM;
    rd = (rd_t){p + 4, p + len, 0};
    for (uint32_t i = 0; i < count; i++) {
        uint64_t id = rd_uvarint(&rd);
        uint64_t nl = rd_uvarint(&rd);
        for (uint64_t k = 0; k < 2 * nl; k++) {
            /* validated in pass 1: lengths in bounds, no NUL, a shared string's label there */
            uint64_t code = rd_uvarint(&rd);
            if (shared && code == 0)
                continue; /* label k / 2 of the previous series, still in d->labels */
            size_t sl = (size_t)(shared ? code - 1 : code);
            const char **slot = k % 2 ? &d->labels[k / 2].value : &d->labels[k / 2].name;
            *slot = d->strs.data + d->strs.len;
            buf_append(&d->strs, rd.p, sl);
            buf_putc(&d->strs, 0);
            rd.p += sl;
        }
        labels_t ls = {d->labels, (size_t)nl};
        if (fn && fn(ud, id, &ls) != 0)
            return WAL_ERR_ABORTED;
    }
    return WAL_OK;
}

int wal_record_decode_samples(wal_record_decoder_t *d, const uint8_t *p, size_t len,
                              int (*fn)(void *ud, const wal_sample_t *s, size_t n), void *ud)
{
    rd_t rd = {p, p + len, 0};
    uint32_t count = rd_u32le(&rd);
    if (rd.err || count == 0 || count > len / WAL_MIN_SAMPLE_BYTES)
        return WAL_ERR_CORRUPT;
    if (count > d->samples_cap) {
        wal_sample_t *ns = realloc(d->samples, (size_t)count * sizeof *ns);
        if (!ns)
            return WAL_ERR_NOMEM;
        d->samples = ns;
        d->samples_cap = count;
    }
    uint64_t id = 0;
    int64_t t = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (i == 0) {
            id = rd_uvarint(&rd);
            t = rd_svarint(&rd);
        } else {
            id += (uint64_t)rd_svarint(&rd);
            t = (int64_t)((uint64_t)t + (uint64_t)rd_svarint(&rd));
        }
        uint64_t vb = rd_u64le(&rd);
        if (rd.err)
            return WAL_ERR_CORRUPT;
        d->samples[i].series_id = id;
        d->samples[i].t_ms = t;
        memcpy(&d->samples[i].v, &vb, 8);
    }
    if (rd.p != rd.end)
        return WAL_ERR_CORRUPT;
    if (fn && fn(ud, d->samples, count) != 0)
        return WAL_ERR_ABORTED;
    return WAL_OK;
}
