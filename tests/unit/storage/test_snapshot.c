/* Unit tests for storage/snapshot.c: round trip, every flipped byte detected, missing, truncated
 * and extended files, atomic replacement, abort; salvage of the intact records before damage
 * (flipped bytes anywhere, bad trailer, truncation); the kept predecessor and setting aside. */
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

static void remove_prev(const char *path)
{
    char prev[4200];
    snprintf(prev, sizeof prev, "%s%s", path, SNAPSHOT_PREV_SUFFIX);
    unlink(prev);
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

/* Offset of record i in a file written by write_snapshot (i == nrec: the trailer's). */
static size_t record_offset(int i)
{
    size_t off = 32;
    for (int k = 0; k < i; k++) {
        uint8_t t;
        char b[128];
        off += 12 + content(k, &t, b, sizeof b);
    }
    return off;
}

/* Reads everything r delivers, checking it is the first records of the test content; returns how
 * many there were. */
static int check_prefix(snapshot_reader_t *r)
{
    uint8_t type;
    const void *data;
    size_t len;
    int i = 0;
    while (snapshot_reader_next(r, &type, &data, &len) == 1) {
        uint8_t t;
        char b[128];
        size_t n = content(i, &t, b, sizeof b);
        assert_int_equal(type, t);
        assert_int_equal(len, n);
        assert_memory_equal(data, b, n);
        i++;
    }
    return i;
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
    remove_prev(path);
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

/* A record damaged in the middle: salvage delivers exactly the records before it and says where
 * it stopped; the strict reader still refuses the file. */
static void test_salvage_intact_prefix(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    write_snapshot(path, 6, 12);
    size_t len;
    uint8_t *orig = read_file(path, &len);
    char err[256] = "";
    snapshot_reader_t *r = NULL;
    snapshot_verdict_t v;

    /* intact: salvage is the strict open */
    assert_int_equal(snapshot_reader_salvage(path, &r, err, sizeof err), SNAPSHOT_OK);
    snapshot_reader_verdict(r, &v);
    assert_true(v.whole);
    assert_int_equal(v.records, 12);
    assert_int_equal(v.records_expected, 12);
    assert_int_equal(v.stop_offset, record_offset(12));
    assert_int_equal(v.file_bytes, len);
    check_snapshot(r, 6, 12);
    snapshot_reader_close(r);

    for (int bad = 0; bad < 12; bad++) {
        /* the last byte of record `bad` (its payload, or its CRC when the payload is empty) */
        size_t at = record_offset(bad + 1) - 1;
        orig[at] ^= 0x10;
        write_file(path, orig, len);
        orig[at] ^= 0x10;
        assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), SNAPSHOT_ERR_CORRUPT);
        assert_null(r);
        err[0] = 0;
        assert_int_equal(snapshot_reader_salvage(path, &r, err, sizeof err), SNAPSHOT_PARTIAL);
        assert_non_null(strstr(err, "record"));
        assert_int_equal(snapshot_reader_wal_segment(r), 6);
        snapshot_reader_verdict(r, &v);
        assert_false(v.whole);
        assert_int_equal(v.records, (uint64_t)bad);
        assert_int_equal(v.records_expected, 12); /* the trailer survived: it says what was lost */
        assert_int_equal(v.stop_offset, record_offset(bad));
        assert_int_equal(snapshot_reader_record_count(r), (uint64_t)bad);
        assert_int_equal(check_prefix(r), bad);
        snapshot_reader_rewind(r);
        assert_int_equal(check_prefix(r), bad);
        snapshot_reader_close(r);
    }
    free(orig);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Every flipped byte: salvage never delivers a byte that is not the original's; a damaged header
 * is refused, anything else opens as PARTIAL with an intact prefix. */
static void test_salvage_every_flipped_byte(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    write_snapshot(path, 3, 12);
    size_t len;
    uint8_t *orig = read_file(path, &len);
    char err[256];
    for (size_t i = 0; i < len; i++) {
        orig[i] ^= 0x81;
        write_file(path, orig, len);
        orig[i] ^= 0x81;
        snapshot_reader_t *r = NULL;
        int rc = snapshot_reader_salvage(path, &r, err, sizeof err);
        if (i < 32) {
            assert_int_equal(rc, SNAPSHOT_ERR_CORRUPT);
            assert_null(r);
            continue;
        }
        if (rc != SNAPSHOT_PARTIAL)
            fail_msg("flip byte %zu: rc %d", i, rc);
        int n = check_prefix(r);
        snapshot_verdict_t v;
        snapshot_reader_verdict(r, &v);
        assert_int_equal(v.records, (uint64_t)n);
        if (i < record_offset(12)) {
            /* record k holds byte i: exactly the records before it */
            int k = 0;
            while (record_offset(k + 1) <= i)
                k++;
            assert_int_equal(n, k);
        } else {
            assert_int_equal(n, 12); /* trailer damage costs no record */
        }
        snapshot_reader_close(r);
    }
    free(orig);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* A damaged or missing trailer: every record is intact, the count is unknown or wrong. */
static void test_salvage_bad_trailer(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    write_snapshot(path, 4, 7);
    size_t len;
    uint8_t *b = read_file(path, &len);
    char err[256] = "";
    snapshot_reader_t *r = NULL;
    snapshot_verdict_t v;

    b[len - 10] ^= 0xff; /* whole-file CRC field: the trailer's own CRC fails */
    write_file(path, b, len);
    assert_int_equal(snapshot_reader_salvage(path, &r, err, sizeof err), SNAPSHOT_PARTIAL);
    assert_non_null(strstr(err, "trailer"));
    snapshot_reader_verdict(r, &v);
    assert_int_equal(v.records, 7);
    assert_int_equal(v.records_expected, -1);
    assert_int_equal(check_prefix(r), 7);
    snapshot_reader_close(r);
    b[len - 10] ^= 0xff;

    /* bytes after a good trailer */
    uint8_t *ext = malloc(len + 5);
    memcpy(ext, b, len);
    memset(ext + len, 0, 5);
    write_file(path, ext, len + 5);
    free(ext);
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), SNAPSHOT_ERR_CORRUPT);
    assert_int_equal(snapshot_reader_salvage(path, &r, err, sizeof err), SNAPSHOT_PARTIAL);
    snapshot_reader_verdict(r, &v);
    assert_int_equal(v.records_expected, 7);
    assert_int_equal(check_prefix(r), 7);
    snapshot_reader_close(r);

    /* the trailer counts a record that is not there */
    memmove(b + 32, b + 44, len - 44); /* record 0 is 12 bytes */
    write_file(path, b, len - 12);
    assert_int_equal(snapshot_reader_salvage(path, &r, err, sizeof err), SNAPSHOT_PARTIAL);
    assert_non_null(strstr(err, "records"));
    snapshot_reader_verdict(r, &v);
    assert_int_equal(v.records, 6);
    assert_int_equal(v.records_expected, 7);
    snapshot_reader_close(r);
    free(b);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Truncated anywhere: a cut header is refused; otherwise the whole records before the cut. */
static void test_salvage_truncated(void **state)
{
    char *dir = tmpdir_make();
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    write_snapshot(path, 5, 9);
    size_t len;
    uint8_t *orig = read_file(path, &len);
    char err[256] = "";
    for (size_t cut = 0; cut < len; cut++) {
        write_file(path, orig, cut);
        snapshot_reader_t *r = NULL;
        int rc = snapshot_reader_salvage(path, &r, err, sizeof err);
        if (cut < 32) {
            assert_int_equal(rc, SNAPSHOT_ERR_CORRUPT);
            assert_null(r);
            continue;
        }
        assert_int_equal(rc, SNAPSHOT_PARTIAL);
        int whole = 0;
        while (whole < 9 && record_offset(whole + 1) <= cut)
            whole++;
        assert_int_equal(check_prefix(r), whole);
        snapshot_verdict_t v;
        snapshot_reader_verdict(r, &v);
        assert_int_equal(v.stop_offset, record_offset(whole));
        assert_int_equal(v.records_expected, -1);
        snapshot_reader_close(r);
    }
    free(orig);
    unlink(path);
    rmdir(dir);
    free(dir);
}

/* Commit keeps the current snapshot as <path>.prev; a failed commit touches neither. */
static void test_keep_previous(void **state)
{
    char *dir = tmpdir_make();
    char path[4096], prev[4200];
    snprintf(path, sizeof path, "%s/snapshot", dir);
    snprintf(prev, sizeof prev, "%s%s", path, SNAPSHOT_PREV_SUFFIX);
    char err[256] = "";
    uint32_t seg = 0;
    assert_int_equal(snapshot_oldest_wal_segment(path, &seg), SNAPSHOT_ERR_NOT_FOUND);
    assert_int_equal(snapshot_read_wal_segment(path, &seg, err, sizeof err), SNAPSHOT_ERR_NOT_FOUND);

    write_snapshot(path, 3, 4);
    assert_false(exists(prev));
    assert_int_equal(snapshot_oldest_wal_segment(path, &seg), 0);
    assert_int_equal(seg, 3);

    write_snapshot(path, 5, 6);
    snapshot_reader_t *r = NULL;
    assert_int_equal(snapshot_reader_open(path, &r, err, sizeof err), 0);
    check_snapshot(r, 5, 6);
    snapshot_reader_close(r);
    assert_int_equal(snapshot_reader_open(prev, &r, err, sizeof err), 0);
    check_snapshot(r, 3, 4);
    snapshot_reader_close(r);
    assert_int_equal(snapshot_oldest_wal_segment(path, &seg), 0);
    assert_int_equal(seg, 3);

    write_snapshot(path, 7, 2);
    assert_int_equal(snapshot_read_wal_segment(path, &seg, err, sizeof err), 0);
    assert_int_equal(seg, 7);
    assert_int_equal(snapshot_read_wal_segment(prev, &seg, err, sizeof err), 0);
    assert_int_equal(seg, 5);
    assert_int_equal(snapshot_oldest_wal_segment(path, &seg), 0);
    assert_int_equal(seg, 5);

    /* a failed writer rotates nothing */
    snapshot_writer_t *w = snapshot_writer_open(path, 9, err, sizeof err);
    assert_int_equal(snapshot_writer_add(w, 0, "z", 1, err, sizeof err), SNAPSHOT_ERR_ARG);
    assert_int_equal(snapshot_writer_commit(w, err, sizeof err), SNAPSHOT_ERR_IO);
    assert_int_equal(snapshot_read_wal_segment(path, &seg, err, sizeof err), 0);
    assert_int_equal(seg, 7);
    assert_int_equal(snapshot_read_wal_segment(prev, &seg, err, sizeof err), 0);
    assert_int_equal(seg, 5);

    /* only the predecessor (a crash between the two renames of a commit) */
    unlink(path);
    assert_int_equal(snapshot_oldest_wal_segment(path, &seg), 0);
    assert_int_equal(seg, 5);
    /* a damaged header does not count */
    write_file(path, "SLUICESN garbage garbage garbage garbage", 40);
    assert_int_equal(snapshot_read_wal_segment(path, &seg, err, sizeof err), SNAPSHOT_ERR_CORRUPT);
    assert_int_equal(snapshot_oldest_wal_segment(path, &seg), 0);
    assert_int_equal(seg, 5);

    unlink(path);
    unlink(prev);
    rmdir(dir);
    free(dir);
}

/* Setting aside renames and never replaces an existing file. */
static void test_set_aside(void **state)
{
    char *dir = tmpdir_make();
    char path[4096], to1[4300] = "", to2[4300] = "";
    snprintf(path, sizeof path, "%s/snapshot", dir);
    char err[256] = "";
    assert_int_equal(snapshot_set_aside(path, to1, sizeof to1, err, sizeof err), SNAPSHOT_ERR_NOT_FOUND);
    write_file(path, "one", 3);
    assert_int_equal(snapshot_set_aside(path, to1, sizeof to1, err, sizeof err), 0);
    assert_false(exists(path));
    assert_non_null(strstr(to1, "/snapshot.corrupt-"));
    write_file(path, "two", 3);
    assert_int_equal(snapshot_set_aside(path, to2, sizeof to2, err, sizeof err), 0);
    assert_string_not_equal(to1, to2);
    size_t n;
    char *b = read_file(to1, &n);
    assert_memory_equal(b, "one", 3);
    free(b);
    b = read_file(to2, &n);
    assert_memory_equal(b, "two", 3);
    free(b);
    unlink(to1);
    unlink(to2);
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
        cmocka_unit_test(test_salvage_intact_prefix),
        cmocka_unit_test(test_salvage_every_flipped_byte),
        cmocka_unit_test(test_salvage_bad_trailer),
        cmocka_unit_test(test_salvage_truncated),
        cmocka_unit_test(test_keep_previous),
        cmocka_unit_test(test_set_aside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
