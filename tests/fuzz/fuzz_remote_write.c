/*
 * fuzz_remote_write — POST /api/v1/write bodies: snappy block decoding exactly as api/remote.c
 * does it (length header checked against a bound before allocating), then remote_write_decode.
 * The raw input is also decoded as an uncompressed WriteRequest, so mutations reach the protobuf
 * decoder without having to keep the snappy framing valid. Checks: accepted requests carry
 * sorted, unique, non-empty label sets with a __name__, and strictly increasing timestamps within
 * a series.
 */
#include <snappy-c.h>

#include "api/remote.h"
#include "tests/fuzz/fuzz.h"

#define MAX_DECODED (4u << 20)

static void decode(const uint8_t *buf, size_t len)
{
    arena_t *a = arena_create(256u << 20);
    remote_write_req_t req;
    char err[1024] = "";
    int rc = remote_write_decode(buf, len, 200000, a, &req, err, sizeof(err));
    if (rc == REMOTE_OK) {
        const label_t *prev = NULL;
        int64_t prev_t = 0;
        for (size_t i = 0; i < req.nsamples; i++) {
            const storage_sample_t *s = &req.samples[i];
            const labels_t *ls = &s->labels;
            FUZZ_CHECK(ls->n > 0);
            FUZZ_CHECK(labels_check_sorted_unique(ls) == 0);
            bool has_name = false;
            for (size_t k = 0; k < ls->n; k++) {
                FUZZ_CHECK(ls->v[k].value[0] != 0);
                has_name |= strcmp(ls->v[k].name, "__name__") == 0;
            }
            FUZZ_CHECK(has_name);
            if (ls->v == prev) /* same series: its samples share one label array */
                FUZZ_CHECK(s->t > prev_t);
            prev = ls->v;
            prev_t = s->t;
        }
    } else {
        FUZZ_CHECK(rc == REMOTE_ERR_DECODE || rc == REMOTE_ERR_INVALID || rc == REMOTE_ERR_LIMIT ||
                   rc == REMOTE_ERR_NOMEM);
        FUZZ_CHECK(err[0] != 0);
    }
    arena_destroy(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t dlen;
    if (snappy_uncompressed_length((const char *)data, size, &dlen) == SNAPPY_OK && dlen <= MAX_DECODED) {
        char *d = malloc(dlen ? dlen : 1);
        size_t got = dlen;
        if (snappy_uncompress((const char *)data, size, d, &got) == SNAPPY_OK && got == dlen)
            decode((const uint8_t *)d, dlen);
        free(d);
    }
    decode(data, size);
    return 0;
}
