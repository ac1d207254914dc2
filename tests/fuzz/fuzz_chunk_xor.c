/*
 * fuzz_chunk_xor — storage/chunk_xor.c's decoder, which reads chunk bytes from snapshot files
 * and (through chunk interop) from other Prometheus-compatible writers. Arbitrary bytes are
 * decoded to the end or to the first error, never reading past the slice. Properties:
 *   - re-encoding what was decoded and decoding that again gives the same samples, bit for bit
 *     (when the timestamps are strictly increasing and their deltas fit in int64, i.e. when the
 *     decoded samples are something the appender accepts);
 *   - chunk_xor_appender_from_bytes on a chunk that decodes cleanly reopens it: one more append
 *     gives the old samples plus the new one.
 */
#include "storage/chunk_xor.h"
#include "tests/fuzz/fuzz.h"

#define MAXS 70000

typedef struct {
    int64_t t;
    uint64_t v;
} smp_t;

static size_t decode_all(const uint8_t *b, size_t n, smp_t *out, int *err)
{
    chunk_xor_iter_t it;
    chunk_xor_iter_init(&it, b, n);
    size_t k = 0;
    int64_t t;
    double v;
    while (k < MAXS && chunk_xor_iter_next(&it, &t, &v)) {
        out[k].t = t;
        memcpy(&out[k].v, &v, 8);
        k++;
    }
    *err = it.err;
    return k;
}

static double bits2d(uint64_t b)
{
    double d;
    memcpy(&d, &b, 8);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static smp_t a[MAXS], b[MAXS];
    int err;
    size_t n = decode_all(data, size, a, &err);
    FUZZ_CHECK(err == 0 || err == -1);

    bool appendable = true;
    for (size_t i = 1; i < n && appendable; i++) {
        int64_t d, pd, dod;
        if (a[i].t <= a[i - 1].t || __builtin_sub_overflow(a[i].t, a[i - 1].t, &d))
            appendable = false;
        else if (i >= 2 && (__builtin_sub_overflow(a[i - 1].t, a[i - 2].t, &pd) || __builtin_sub_overflow(d, pd, &dod)))
            appendable = false;
    }
    if (appendable && n > 0 && n <= 65535) {
        chunk_xor_appender_t ap;
        FUZZ_CHECK(chunk_xor_appender_init(&ap) == 0);
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(chunk_xor_append(&ap, a[i].t, bits2d(a[i].v)) == 0);
        size_t len;
        const uint8_t *enc = chunk_xor_bytes(&ap, &len);
        size_t m = decode_all(enc, len, b, &err);
        FUZZ_CHECK(err == 0 && m == n);
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(a[i].t == b[i].t && a[i].v == b[i].v);
        chunk_xor_appender_free(&ap);
    }

    if (err == 0 && appendable && n < 65535) {
        chunk_xor_appender_t ap;
        if (chunk_xor_appender_from_bytes(&ap, data, size) == 0) {
            int64_t nt = 1000;
            /* the last timestamp may sit near INT64_MAX (found by this fuzzer): no next sample then */
            bool ok = n == 0 || !__builtin_add_overflow(a[n - 1].t, (int64_t)1000, &nt);
            int64_t d, pd, dod;
            if (n >= 1 && __builtin_sub_overflow(nt, a[n - 1].t, &d))
                ok = false;
            if (ok && n >= 2 &&
                (__builtin_sub_overflow(a[n - 1].t, a[n - 2].t, &pd) || __builtin_sub_overflow(d, pd, &dod)))
                ok = false;
            if (ok) {
                FUZZ_CHECK(chunk_xor_append(&ap, nt, 42.5) == 0);
                size_t len;
                const uint8_t *enc = chunk_xor_bytes(&ap, &len);
                size_t m = decode_all(enc, len, b, &err);
                FUZZ_CHECK(err == 0 && m == n + 1);
                for (size_t i = 0; i < n; i++)
                    FUZZ_CHECK(a[i].t == b[i].t && a[i].v == b[i].v);
                FUZZ_CHECK(b[n].t == nt && bits2d(b[n].v) == 42.5);
            }
            chunk_xor_appender_free(&ap);
        }
    }
    return 0;
}
