/*
 * fuzz_chunk_int — storage/chunk_int.c's decoder, which reads the head's integer chunks back from
 * snapshot files. Arbitrary bytes are decoded to the end or to the first error, never reading
 * past the slice. Property: when the decoded samples are something the encoder accepts (integers
 * it holds, strictly increasing timestamps less than 2^31 ms apart), encoding them and decoding
 * that gives the same samples, bit for bit, in exactly chunk_int_size bytes; and so does
 * appending them one at a time (the open chunks' layout), each append exactly as long as
 * chunk_int_append_size said.
 */
#include "storage/chunk_int.h"
#include "tests/fuzz/fuzz.h"

#define MAXS 65535

static size_t decode_all(const uint8_t *b, size_t n, int64_t *t, double *v, int *err)
{
    chunk_int_iter_t it;
    chunk_int_iter_init(&it, b, n);
    size_t k = 0;
    while (k < MAXS && chunk_int_iter_next(&it, &t[k], &v[k]))
        k++;
    *err = it.err;
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int64_t t[MAXS], t2[MAXS];
    static double v[MAXS], v2[MAXS];
    static uint8_t enc[MAXS * 20];
    int err;
    size_t n = decode_all(data, size, t, v, &err);
    FUZZ_CHECK(err == 0 || err == -1);
    size_t want = n ? chunk_int_size(t, v, n) : 0;
    if (want == 0)
        return 0;
    size_t len = chunk_int_encode(t, v, n, enc, sizeof(enc));
    FUZZ_CHECK(len == want);
    size_t m = decode_all(enc, len, t2, v2, &err);
    FUZZ_CHECK(err == 0 && m == n);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(t[i] == t2[i] && memcmp(&v[i], &v2[i], 8) == 0);
    if (n > CHUNK_INT_APPEND_MAX_SAMPLES)
        return 0;
    chunk_int_appender_t a;
    chunk_int_appender_init(&a, enc, sizeof(enc));
    for (size_t i = 0; i < n; i++) {
        size_t want = chunk_int_append_size(&a, t[i], (int64_t)v[i]);
        FUZZ_CHECK(want > 0 && chunk_int_append(&a, t[i], (int64_t)v[i]) == 0);
        FUZZ_CHECK(chunk_int_appender_len(&a) == want);
    }
    m = decode_all(enc, chunk_int_appender_len(&a), t2, v2, &err);
    FUZZ_CHECK(err == 0 && m == n);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(t[i] == t2[i] && memcmp(&v[i], &v2[i], 8) == 0);
    return 0;
}
