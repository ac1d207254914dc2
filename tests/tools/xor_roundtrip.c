/*
 * xor_roundtrip — lets tests/integration/test_chunk_interop.py compare storage/chunk_xor.c with
 * a real Prometheus.
 *
 * stdin:  one chunk per line, its bytes in hex (upper or lower case; blank lines skipped).
 * stdout: one line per chunk:
 *           <count> <reencoded-hex> <t1>:<v1-bits-hex>,<t2>:<v2-bits-hex>,...
 *         count = samples decoded; reencoded-hex = those samples appended to a fresh
 *         chunk_xor appender; values as the 16 hex digits of their IEEE-754 bits, so NaN payloads
 *         and -0 survive. A chunk with no samples prints "0 <hex> " (empty list).
 * exit:   0, or 1 (with a message on stderr) at the first line that is not hex or does not
 *         decode; 2 on out-of-memory.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/chunk_xor.h"

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static void print_hex(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", b[i]);
}

/* Decodes, re-encodes and prints one chunk. Returns 0, 1 on bad input, 2 on OOM. */
static int roundtrip(const uint8_t *bytes, size_t len, size_t lineno)
{
    chunk_xor_iter_t it;
    chunk_xor_appender_t a;
    int64_t t;
    double v;
    char *list = NULL;
    size_t list_len = 0;
    FILE *lf = open_memstream(&list, &list_len);
    if (!lf || chunk_xor_appender_init(&a) != 0)
        return 2;
    unsigned n = 0;
    chunk_xor_iter_init(&it, bytes, len);
    while (chunk_xor_iter_next(&it, &t, &v)) {
        uint64_t bits;
        memcpy(&bits, &v, sizeof(bits));
        fprintf(lf, "%s%" PRId64 ":%016" PRIx64, n ? "," : "", t, bits);
        if (chunk_xor_append(&a, t, v) != 0) {
            fclose(lf);
            free(list);
            chunk_xor_appender_free(&a);
            return 2;
        }
        n++;
    }
    fclose(lf);
    int rc = 0;
    if (it.err != 0) {
        fprintf(stderr, "xor_roundtrip: line %zu: chunk does not decode (%u of %u samples read)\n", lineno, n,
                (unsigned)it.num);
        rc = 1;
    } else {
        size_t outlen;
        const uint8_t *out = chunk_xor_bytes(&a, &outlen);
        printf("%u ", n);
        print_hex(out, outlen);
        printf(" %s\n", list);
    }
    free(list);
    chunk_xor_appender_free(&a);
    return rc;
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    int rc = 0;
    while (rc == 0 && (got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r' || line[got - 1] == ' '))
            line[--got] = '\0';
        if (got == 0)
            continue;
        if (got % 2 != 0) {
            fprintf(stderr, "xor_roundtrip: line %zu: odd number of hex digits\n", lineno);
            rc = 1;
            break;
        }
        size_t len = (size_t)got / 2;
        uint8_t *bytes = malloc(len);
        if (!bytes) {
            rc = 2;
            break;
        }
        for (size_t i = 0; i < len && rc == 0; i++) {
            int hi = hexval((unsigned char)line[2 * i]), lo = hexval((unsigned char)line[2 * i + 1]);
            if (hi < 0 || lo < 0) {
                fprintf(stderr, "xor_roundtrip: line %zu: not hex\n", lineno);
                rc = 1;
            }
            bytes[i] = (uint8_t)(hi << 4 | lo);
        }
        if (rc == 0)
            rc = roundtrip(bytes, len, lineno);
        free(bytes);
        fflush(stdout);
    }
    free(line);
    return rc;
}
