/*
 * fuzz_wal_series — storage/wal_record.c's series decoder, which reads WAL segments from disk at
 * start (replay) and while the remote-write sender tails them, so a torn or corrupted segment
 * reaches it whenever its checksum happens to hold. The first byte picks the record type (odd:
 * SERIES_SHARED, even: SERIES, the spelt-out form of older versions), the rest is the payload.
 * Properties:
 *   - decoding reads nothing outside the payload and delivers every series or none (a payload
 *     that does not decode delivers nothing);
 *   - what decodes, encoded again (SERIES_SHARED, what sluice writes) and decoded, gives the same
 *     ids and labels, in the same order.
 */
#include "storage/wal_record.h"
#include "tests/fuzz/fuzz.h"

#define MAX_SERIES 4096
#define MAX_LABELS 16384

typedef struct {
    size_t n, nlabels;
    uint64_t ids[MAX_SERIES];
    size_t first[MAX_SERIES + 1]; /* series i: labels first[i] .. first[i + 1] */
    char *names[MAX_LABELS], *values[MAX_LABELS];
    bool overflow;
} got_t;

static int collect(void *ud, uint64_t id, const labels_t *ls)
{
    got_t *g = ud;
    if (g->n == MAX_SERIES || g->nlabels + ls->n > MAX_LABELS) {
        g->overflow = true;
        return 0;
    }
    g->ids[g->n] = id;
    g->first[g->n] = g->nlabels;
    for (size_t k = 0; k < ls->n; k++) {
        FUZZ_CHECK(ls->v[k].name && ls->v[k].value);
        g->names[g->nlabels] = strdup(ls->v[k].name);
        g->values[g->nlabels] = strdup(ls->v[k].value);
        if (!g->names[g->nlabels] || !g->values[g->nlabels])
            abort();
        g->nlabels++;
    }
    g->n++;
    g->first[g->n] = g->nlabels;
    return 0;
}

static void got_free(got_t *g)
{
    for (size_t i = 0; i < g->nlabels; i++) {
        free(g->names[i]);
        free(g->values[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t type = data[0] & 1 ? WAL_REC_SERIES_SHARED : WAL_REC_SERIES;
    static got_t a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    /* a copy of exactly the payload, so reading past it is caught */
    uint8_t *p = malloc(size - 1 ? size - 1 : 1);
    if (!p)
        return 0;
    memcpy(p, data + 1, size - 1);
    wal_record_decoder_t d;
    wal_record_decoder_init(&d);
    int rc = wal_record_decode_series(&d, type, p, size - 1, collect, &a);
    FUZZ_CHECK(rc == WAL_OK || rc == WAL_ERR_CORRUPT);
    FUZZ_CHECK(rc == WAL_OK || a.n == 0);
    if (rc == WAL_OK && !a.overflow) {
        wal_series_t *s = malloc((a.n ? a.n : 1) * sizeof(*s));
        label_t *lv = malloc((a.nlabels ? a.nlabels : 1) * sizeof(*lv));
        if (!s || !lv)
            abort();
        for (size_t i = 0; i < a.nlabels; i++)
            lv[i] = (label_t){a.names[i], a.values[i]};
        for (size_t i = 0; i < a.n; i++)
            s[i] = (wal_series_t){.id = a.ids[i], .labels = {lv + a.first[i], a.first[i + 1] - a.first[i]}};
        buf_t enc = BUF_INIT;
        uint64_t nrec = 0;
        FUZZ_CHECK(wal_record_encode_series(&enc, s, a.n, &nrec) == WAL_OK);
        /* every record of the encoding, decoded in turn, gives the series back in order */
        size_t at = 0;
        for (uint64_t r = 0; r < nrec; r++) {
            FUZZ_CHECK(enc.len - at >= WAL_REC_HEADER_BYTES);
            const uint8_t *h = (const uint8_t *)enc.data + at;
            FUZZ_CHECK(h[0] == WAL_REC_SERIES_SHARED);
            size_t plen = (size_t)h[4] | (size_t)h[5] << 8 | (size_t)h[6] << 16 | (size_t)h[7] << 24;
            FUZZ_CHECK(enc.len - at - WAL_REC_HEADER_BYTES >= plen);
            FUZZ_CHECK(wal_record_decode_series(&d, h[0], h + WAL_REC_HEADER_BYTES, plen, collect, &b) == WAL_OK);
            at += WAL_REC_HEADER_BYTES + plen;
        }
        FUZZ_CHECK(at == enc.len);
        FUZZ_CHECK(b.n == a.n && b.nlabels == a.nlabels);
        for (size_t i = 0; i < a.n; i++)
            FUZZ_CHECK(b.ids[i] == a.ids[i] && b.first[i] == a.first[i]);
        for (size_t i = 0; i < a.nlabels; i++)
            FUZZ_CHECK(strcmp(a.names[i], b.names[i]) == 0 && strcmp(a.values[i], b.values[i]) == 0);
        buf_free(&enc);
        free(s);
        free(lv);
    }
    got_free(&a);
    got_free(&b);
    wal_record_decoder_free(&d);
    free(p);
    return 0;
}
