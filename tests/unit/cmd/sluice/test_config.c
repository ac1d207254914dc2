/* Unit tests for cmd/sluice/config.c: defaults, flag forms, config file layering, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/sluice/config.h"

static config_parse_result_t parse(config_t *c, char *err, size_t errlen, int argc, ...)
{
    char *argv[32] = {"sluice"};
    va_list ap;
    va_start(ap, argc);
    for (int i = 1; i <= argc; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    return config_parse_args(c, argc + 1, argv, err, errlen);
}

static void test_defaults(void **state)
{
    config_t c;
    config_init(&c);
    assert_string_equal(c.listen_address, ":9091");
    assert_string_equal(c.storage_path, "./data");
    assert_int_equal(c.retention_raw_ms, 2 * 3600 * 1000);
    assert_int_equal(c.max_body_bytes, 32u << 20);
    assert_string_equal(c.log_level, "info");
    assert_string_equal(c.log_format, "logfmt");
    assert_false(c.enable_admin_api);
    config_free(&c);
}

static void test_flag_forms(void **state)
{
    config_t c;
    char err[256];
    config_init(&c);
    assert_int_equal(parse(&c, err, sizeof(err), 5, "--web.listen-address", "127.0.0.1:1", "--retention.raw=3h",
                           "--web.enable-admin-api", "--web.max-body-size=1MiB"),
                     CONFIG_PARSE_OK);
    assert_string_equal(c.listen_address, "127.0.0.1:1");
    assert_int_equal(c.retention_raw_ms, 3 * 3600 * 1000);
    assert_true(c.enable_admin_api);
    assert_int_equal(c.max_body_bytes, 1u << 20);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--no-web.enable-admin-api"), CONFIG_PARSE_OK);
    assert_false(c.enable_admin_api);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--web.enable-admin-api=false"), CONFIG_PARSE_OK);
    assert_false(c.enable_admin_api);
    config_free(&c);
}

static void test_flag_errors(void **state)
{
    config_t c;
    char err[256];
    config_init(&c);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--nope"), CONFIG_PARSE_ERROR);
    assert_non_null(strstr(err, "unknown long flag '--nope'"));
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--retention.raw=abc"), CONFIG_PARSE_ERROR);
    assert_non_null(strstr(err, "invalid duration \"abc\""));
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--web.max-body-size=lots"), CONFIG_PARSE_ERROR);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--log.format=xml"), CONFIG_PARSE_ERROR);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--web.enable-admin-api=maybe"), CONFIG_PARSE_ERROR);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--no-storage.path"), CONFIG_PARSE_ERROR);
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--retention.raw"), CONFIG_PARSE_ERROR);
    assert_non_null(strstr(err, "expected argument"));
    assert_int_equal(parse(&c, err, sizeof(err), 1, "--retention.raw=1s"), CONFIG_PARSE_ERROR);
    assert_non_null(strstr(err, "at least 1m"));
    config_free(&c);
}

static char *write_tmp(const char *content)
{
    char *path = strdup("/tmp/sluice-config-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    return path;
}

static void test_config_file_layers(void **state)
{
    char *path = write_tmp("web:\n  listen-address: \":7777\"\n  max-body-size: 1KiB\nretention.raw: 4h\n");
    char arg[300];
    snprintf(arg, sizeof(arg), "--config.file=%s", path);
    config_t c;
    char err[256];
    config_init(&c);
    /* The flag after the file's value wins, wherever it stands on the command line. */
    assert_int_equal(parse(&c, err, sizeof(err), 2, "--retention.raw=5h", arg), CONFIG_PARSE_OK);
    assert_string_equal(c.listen_address, ":7777");
    assert_int_equal(c.max_body_bytes, 1024);
    assert_int_equal(c.retention_raw_ms, 5 * 3600 * 1000);
    config_free(&c);
    unlink(path);
    free(path);
}

static void test_config_file_errors(void **state)
{
    static const char *const bad[] = {
        "nope: 1\n",                     /* unknown setting */
        "web:\n  listen-address: [a]\n", /* not a scalar */
        "retention.raw: forever\n",      /* bad value */
        "- a\n- b\n",                    /* not a mapping */
        "web: {\n",                      /* YAML syntax */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *path = write_tmp(bad[i]);
        config_t c;
        char err[512];
        config_init(&c);
        assert_int_equal(config_load_file(&c, path, err, sizeof(err)), -1);
        assert_non_null(strstr(err, path));
        config_free(&c);
        unlink(path);
        free(path);
    }
    config_t c;
    char err[512];
    config_init(&c);
    assert_int_equal(config_load_file(&c, "/nonexistent/sluice.yml", err, sizeof(err)), -1);
    config_free(&c);
}

static void test_flags_json(void **state)
{
    config_t c;
    config_init(&c);
    buf_t b = BUF_INIT;
    config_format_flags_json(&c, &b);
    assert_non_null(strstr(b.data, "\"web.listen-address\":\":9091\""));
    assert_non_null(strstr(b.data, "\"retention.raw\":\"2h\""));
    buf_free(&b);
    config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),           cmocka_unit_test(test_flag_forms),
        cmocka_unit_test(test_flag_errors),        cmocka_unit_test(test_config_file_layers),
        cmocka_unit_test(test_config_file_errors), cmocka_unit_test(test_flags_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
