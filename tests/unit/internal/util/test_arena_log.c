/* Unit tests for internal/util/arena.c and internal/util/log.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/util/arena.h"
#include "internal/util/log.h"

static void test_arena_basic(void **state)
{
    arena_t *a = arena_create(0);
    assert_non_null(a);
    char *p = arena_alloc(a, 10);
    assert_int_equal((uintptr_t)p % 16, 0);
    memset(p, 1, 10);
    char *big = arena_alloc(a, 1 << 20); /* larger than a block */
    memset(big, 2, 1 << 20);
    assert_string_equal(arena_strdup(a, "hello"), "hello");
    assert_string_equal(arena_sprintf(a, "%d-%s", 42, "x"), "42-x");
    assert_string_equal(arena_strndup(a, "abcdef", 3), "abc");
    assert_true(arena_used(a) >= (1 << 20) + 10);
    arena_reset(a);
    assert_int_equal(arena_used(a), 0);
    arena_destroy(a);
}

static void test_arena_limit(void **state)
{
    arena_t *a = arena_create(4096);
    assert_non_null(arena_try_alloc(a, 4000));
    assert_null(arena_try_alloc(a, 200));
    assert_null(arena_try_alloc(a, SIZE_MAX));
    arena_destroy(a);
}

static char *capture(void (*fn)(void))
{
    char path[] = "/tmp/sluice-log-XXXXXX";
    int fd = mkstemp(path);
    log_set_fd(fd);
    fn();
    log_set_fd(-1);
    static char out[8192];
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, out, sizeof(out) - 1);
    out[n < 0 ? 0 : n] = 0;
    close(fd);
    unlink(path);
    return out;
}

static void emit_logfmt(void)
{
    log_set_format(LOG_FORMAT_LOGFMT);
    log_set_level(LOG_INFO);
    log_info("wal", "replayed segment", LF_S("file", "0001"), LF_I("records", 42), LF_S("note", "has space"),
             LF_B("ok", true), LF_F("ratio", 0.5), LF_F("bad", NAN));
    log_debug("wal", "hidden");
    log_warn("x", "no fields");
}

static void emit_json(void)
{
    log_set_format(LOG_FORMAT_JSON);
    log_error("api", "quote\"and\nnewline", LF_S("k", "v\\"));
    log_set_format(LOG_FORMAT_LOGFMT);
}

static void test_log_formats(void **state)
{
    char *out = capture(emit_logfmt);
    assert_non_null(strstr(out, " level=info component=wal msg=\"replayed segment\" file=0001 records=42 "
                                "note=\"has space\" ok=true ratio=0.5 bad=\"NaN\"\n"));
    assert_null(strstr(out, "hidden"));
    assert_non_null(strstr(out, "level=warn component=x msg=\"no fields\"\n"));
    assert_int_equal(strncmp(out, "ts=", 3), 0);
    out = capture(emit_json);
    assert_non_null(
        strstr(out, "\"level\":\"error\",\"component\":\"api\",\"msg\":\"quote\\\"and\\nnewline\",\"k\":\"v\\\\\"}\n"));
    log_level_t l;
    assert_int_equal(log_parse_level("warn", &l), 0);
    assert_int_equal(l, LOG_WARN);
    assert_int_equal(log_parse_level("loud", &l), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_basic),
        cmocka_unit_test(test_arena_limit),
        cmocka_unit_test(test_log_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
