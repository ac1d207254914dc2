/* Unit tests for storage/snapshot.c: round trip, every flipped byte detected, missing, truncated
 * and extended files, atomic replacement, abort. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/snapshot.h"

static char *tmpdir_make(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/sluice-snap-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void *read_file(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void write_file(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static bool exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Record i of the test content: type 1 + i % 3, payload "rec-<i>" repeated i % 5 times (so some
 * payloads are empty). */
static size_t content(int i, uint8_t *type, char *out, size_t cap)
{
    *type = (uint8_t)(1 + i % 3);
    size_t n = 0;
    for (int k = 0; k < i % 5; k++)
        n += (size_t)snprintf(out + n, cap - n, "rec-%d;", i);
    return n;
}

static void write_snapshot(const char *path, uint32_t seg, int nrec)
{
    char err[256] = "";
    snapshot_writer_t *w = snapshot_writer_open(path, seg, err, sizeof err);
    if (!w)
        fail_msg("open: %s", err);
    for (int i = 0; i < nrec; i++) {
        uint8_t t;
        char b[128];
        size_t n = content(i, &t, b, sizeof b);
        assert_int_equal(snapshot_writer_add(w, t, b, n, err, sizeof err), 0);
    }
    if (snapshot_writer_commit(w, err, sizeof err) != 0)
        fail_msg("commit: %s", err);
}

static void check_snapshot(snapshot_reader_t *r, uint32_t seg, int nrec)
{
    assert_int_equal(snapshot_reader_wal_segment(r), seg);
    assert_int_equal(snapshot_reader_record_count(r), (uint64_t)nrec);
    assert_true(snapshot_reader_created_ms(r) > 1600000000000LL);
    uint8_t type;
    const void *data;
    size_t len;
    for (int i = 0; i < nrec; i++) {
        assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 1);
        uint8_t t;
        char b[128];
        size_t n = content(i, &t, b, sizeof b);
        assert_int_equal(type, t);
        assert_int_equal(len, n);
        assert_memory_equal(data, b, n);
    }
    assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 0);
    assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 0);
}

static void test_roundtrip(void **state)
{
    char *dir = tmpdir_make();
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    write_snapshot(path, 42, 50);
    assert_false(exists(tmp));

    snapshot_reader_t *r = NULL;
    char err[256] = "";
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    check_snapshot(r, 42, 50);
    snapshot_reader_rewind(r);
    check_snapshot(r, 42, 50);
    snapshot_reader_close(r);

    /* empty snapshot */
    write_snapshot(path, 1, 0);
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    check_snapshot(r, 1, 0);
    snapshot_reader_close(r);

    /* a record over the flush size streams past the buffer */
    char err2[256];
    snapshot_writer_t *w = snapshot_writer_open(path, 7, err2, sizeof err2);
    assert_non_null(w);
    size_t big = (3u << 20) + 5;
    uint8_t *b = malloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (uint8_t)(i * 7);
    assert_int_equal(snapshot_writer_add(w, 9, "x", 1, err2, sizeof err2), 0);
    assert_int_equal(snapshot_writer_add(w, 200, b, big, err2, sizeof err2), 0);
    assert_int_equal(snapshot_writer_add(w, 9, "y", 1, err2, sizeof err2), 0);
    assert_int_equal(snapshot_writer_add(w, 0, "z", 1, err2, sizeof err2), SNAPSHOT_ERR_ARG);
    assert_int_equal(snapshot_writer_commit(w, err2, sizeof err2), SNAPSHOT_ERR_IO); /* after an error */
    assert_false(exists(tmp));
    /* the failed writer did not replace the previous snapshot */
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    check_snapshot(r, 1, 0);
    snapshot_reader_close(r);

    w = snapshot_writer_open(path, 7, err2, sizeof err2);
    assert_int_equal(snapshot_writer_add(w, 9, "x", 1, err2, sizeof err2), 0);
    assert_int_equal(snapshot_writer_add(w, 200, b, big, err2, sizeof err2), 0);
    assert_int_equal(snapshot_writer_add(w, 9, "y", 1, err2, sizeof err2), 0);
    assert_int_equal(snapshot_writer_commit(w, err2, sizeof err2), 0);
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    uint8_t type;
    const void *data;
    size_t len;
    assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 1);
    assert_int_equal(type, 9);
    assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 1);
    assert_int_equal(type, 200);
    assert_int_equal(len, big);
    assert_memory_equal(data, b, big);
    assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 1);
    assert_memory_equal(data, "y", 1);
    assert_int_equal(snapshot_reader_next(r, &type, &data, &len), 0);
    snapshot_reader_close(r);
    free(b);

    /* abort leaves the old file and no temp file */
    w = snapshot_writer_open(path, 8, err2, sizeof err2);
    assert_int_equal(snapshot_writer_add(w, 1, "q", 1, err2, sizeof err2), 0);
    snapshot_writer_abort(w);
    assert_false(exists(tmp));
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    assert_int_equal(snapshot_reader_wal_segment(r), 7);
    snapshot_reader_close(r);
    snapshot_writer_abort(NULL);

    unlink(path);
    rmdir(dir);
    free(dir);
}

static void test_every_flipped_byte(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    write_snapshot(path, 3, 12);
    size_t len;
    uint8_t *orig = read_file(path, &len);
    char err[256];
    snapshot_reader_t *r = NULL;
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            orig[i] ^= (uint8_t)(1u << bit);
            write_file(path, orig, len);
            orig[i] ^= (uint8_t)(1u << bit);
            err[0] = 0;
            int rc = snapshot_reader_open(path, &r, err, sizeof err);
            if (rc != SNAPSHOT_ERR_CORRUPT)
                fail_msg("flip byte %zu bit %d: rc %d", i, bit, rc);
            assert_null(r);
            assert_true(strlen(err) > 0);
        }
    }
    write_file(path, orig, len);
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    snapshot_reader_close(r);
    free(orig);
    unlink(path);
    rmdir(dir);
    free(dir);
}

static void test_missing_truncated_extended(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    char err[256] = "";
    snapshot_reader_t *r = NULL;
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), SNAPSHOT_ERR_NOT_FOUND);
    assert_null(r);

    write_snapshot(path, 5, 9);
    size_t len;
    uint8_t *orig = read_file(path, &len);
    for (size_t cut = 0; cut < len; cut++) {
        write_file(path, orig, cut);
        assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), SNAPSHOT_ERR_CORRUPT);
        assert_null(r);
    }
    /* trailing garbage after a good trailer */
    uint8_t *ext = malloc(len + 30);
    memcpy(ext, orig, len);
    memset(ext + len, 0, 30);
    for (size_t extra = 1; extra <= 30; extra++) {
        write_file(path, ext, len + extra);
        assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), SNAPSHOT_ERR_CORRUPT);
    }
    free(ext);
    free(orig);

    /* unwritable location */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/no/such/dir/snapshot", dir);
    assert_null(snapshot_writer_open(bad, 1, err, sizeof err));
    assert_true(strlen(err) > 0);

    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Removing a whole record keeps every per-record CRC valid; the count and file CRC catch it. */
static void test_record_removed(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    write_snapshot(path, 5, 3);
    size_t len;
    uint8_t *b = read_file(path, &len);
    /* record 0 (empty payload) is 12 bytes right after the 32-byte header */
    memmove(b + 32, b + 44, len - 44);
    write_file(path, b, len - 12);
    char err[256] = "";
    snapshot_reader_t *r = NULL;
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), SNAPSHOT_ERR_CORRUPT);
    assert_non_null(strstr(err, "records"));
    free(b);
    unlink(path);
    rmdir(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_every_flipped_byte),
        cmocka_unit_test(test_missing_truncated_extended),
        cmocka_unit_test(test_record_removed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
