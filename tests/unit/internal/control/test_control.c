/* Unit tests for internal/control/control.c: transitions, expiry/revert, request validation, JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "internal/control/control.h"

/* Parses body for kind; returns rc and leaves the field name in field. */
static int parse(control_req_kind_t kind, const char *body, control_change_t *chg, char *field, char *err)
{
    static char reason[CONTROL_MAX_REASON_LEN + 1];
    return control_change_parse(kind, body, strlen(body), chg, reason, field, 64, err, 256);
}

static void expect_bad(control_req_kind_t kind, const char *body, const char *want_field, const char *want_in_err)
{
    control_change_t chg;
    char field[64], err[256];
    int rc = parse(kind, body, &chg, field, err);
    if (rc == 0)
        fail_msg("accepted %s", body);
    if (strcmp(field, want_field) != 0)
        fail_msg("body %s: field \"%s\", want \"%s\" (%s)", body, field, want_field, err);
    if (want_in_err && !strstr(err, want_in_err))
        fail_msg("body %s: error \"%s\" lacks \"%s\"", body, err, want_in_err);
}

static void test_mode_names(void **state)
{
    control_mode_t m;
    assert_int_equal(control_mode_parse("rate_limited", &m), 0);
    assert_int_equal(m, CONTROL_RATE_LIMITED);
    assert_int_equal(control_mode_parse("stopped", &m), -1);
    assert_string_equal(control_mode_tis_type(CONTROL_PAUSED), "Paused");
    assert_string_equal(control_mode_tis_type(CONTROL_DRAINING), "FloodDischargeRate");
    assert_string_equal(control_mode_tis_type(CONTROL_RATE_LIMITED), "RateLimit");
    assert_string_equal(control_mode_tis_type(CONTROL_RUNNING), "NoLimitParam");
}

static void test_parse_good(void **state)
{
    control_change_t chg;
    char field[64], err[256];
    assert_int_equal(parse(CONTROL_REQ_PAUSE, "", &chg, field, err), 0);
    assert_int_equal(chg.spec.mode, CONTROL_PAUSED);
    assert_null(chg.reason);
    assert_int_equal(parse(CONTROL_REQ_PAUSE, "{\"reason\":\"dba fix\",\"for\":\"10m\"}", &chg, field, err), 0);
    assert_string_equal(chg.reason, "dba fix");
    assert_int_equal(chg.for_ms, 600000);
    assert_int_equal(parse(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":5000}", &chg, field, err), 0);
    assert_int_equal(chg.spec.mode, CONTROL_RATE_LIMITED);
    assert_int_equal(chg.spec.rate_limit_per_second, 5000);
    assert_int_equal(parse(CONTROL_REQ_DRAIN, "{\"match\":[{\"attribute\":\"table\",\"regex\":\"^tmp_\"},\"db=x.*\"]}",
                           &chg, field, err),
                     0);
    assert_int_equal(chg.spec.ndrain, 2);
    assert_string_equal(chg.spec.drain[0].attribute, "table");
    assert_string_equal(chg.spec.drain[1].attribute, "db");
    assert_string_equal(chg.spec.drain[1].regex, "x.*");
    control_spec_free(&chg.spec);
    assert_int_equal(parse(CONTROL_REQ_DRAIN, "{}", &chg, field, err), 0);
    assert_int_equal(chg.spec.ndrain, 0);
    assert_int_equal(parse(CONTROL_REQ_PUT,
                           "{\"mode\":\"rate_limited\",\"rate_limit_per_second\":10,\"version\":3,\"job\":\"x\","
                           "\"updated_by\":\"y\",\"expires_at\":null}",
                           &chg, field, err),
                     0);
    assert_true(chg.check_version);
    assert_int_equal(chg.expect_version, 3);
}

static void test_parse_bad_names_the_field(void **state)
{
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"stopped\"}", "mode", "running, paused");
    expect_bad(CONTROL_REQ_PUT, "{}", "mode", "required");
    expect_bad(CONTROL_REQ_PUT, "", "body", NULL);
    expect_bad(CONTROL_REQ_PUT, "[1]", "body", "object");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":", "body", "JSON");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"running\",\"colour\":1}", "colour", "unknown field");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"rate_limited\"}", "rate_limit_per_second", "required");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"rate_limited\",\"rate_limit_per_second\":0}", "rate_limit_per_second",
               NULL);
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"paused\",\"rate_limit_per_second\":5}", "rate_limit_per_second", "only");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"paused\",\"drain\":[]}", "drain", "only");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"paused\",\"expires_at\":\"2030-01-01\"}", "expires_at", "read-only");
    expect_bad(CONTROL_REQ_PUT, "{\"mode\":\"paused\",\"mode\":\"running\"}", "body", NULL); /* duplicate key */
    expect_bad(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":-1}", "per_second", NULL);
    expect_bad(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":1e12}", "per_second", NULL);
    expect_bad(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":2.5}", "per_second", NULL);
    expect_bad(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":\"5\"}", "per_second", NULL);
    expect_bad(CONTROL_REQ_RATE_LIMIT, "{}", "per_second", "required");
    expect_bad(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":5,\"mode\":\"paused\"}", "mode", "unknown field");
    expect_bad(CONTROL_REQ_DRAIN, "{\"match\":[{\"attribute\":\"t\",\"regex\":\"(\"}]}", "match", "regular expression");
    expect_bad(CONTROL_REQ_DRAIN, "{\"match\":[{\"attribute\":\"t\"}]}", "match", "both");
    expect_bad(CONTROL_REQ_DRAIN, "{\"match\":[{\"attribute\":\"t\",\"regex\":\"x\",\"op\":1}]}", "match", "op");
    expect_bad(CONTROL_REQ_DRAIN, "{\"match\":\"table\"}", "match", "array");
    expect_bad(CONTROL_REQ_PAUSE, "{\"for\":\"10 minutes\"}", "for", "duration");
    expect_bad(CONTROL_REQ_PAUSE, "{\"for\":\"0s\"}", "for", "greater than 0");
    expect_bad(CONTROL_REQ_PAUSE, "{\"for\":600}", "for", NULL);
    expect_bad(CONTROL_REQ_PAUSE, "{\"reason\":\"a\\u0001b\"}", "reason", "control character");
    expect_bad(CONTROL_REQ_PAUSE, "{\"reason\":7}", "reason", "string");

    char big[CONTROL_MAX_REASON_LEN + 64];
    snprintf(big, sizeof(big), "{\"reason\":\"%0*d\"}", CONTROL_MAX_REASON_LEN + 1, 0);
    expect_bad(CONTROL_REQ_PAUSE, big, "reason", "too long");

    static char huge[CONTROL_MAX_BODY + 16];
    memset(huge, ' ', sizeof(huge) - 1);
    huge[0] = '{';
    huge[sizeof(huge) - 2] = '}';
    expect_bad(CONTROL_REQ_PAUSE, huge, "body", "too large");
}

static void test_job_names(void **state)
{
    char err[256];
    assert_int_equal(control_job_name_valid("orders-sync", 11, err, sizeof(err)), 0);
    assert_int_equal(control_job_name_valid("数据同步", strlen("数据同步"), err, sizeof(err)), 0);
    assert_int_equal(control_job_name_valid("", 0, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "job"));
    assert_int_equal(control_job_name_valid("a\nb", 3, err, sizeof(err)), -1);
    assert_int_equal(control_job_name_valid("a\xff", 2, err, sizeof(err)), -1);
    char longname[CONTROL_MAX_JOB_LEN + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    assert_int_equal(control_job_name_valid(longname, strlen(longname), err, sizeof(err)), -1);
    assert_int_equal(control_job_name_valid(longname, CONTROL_MAX_JOB_LEN, err, sizeof(err)), 0);
}

static void test_apply_and_revert(void **state)
{
    control_state_t s0, s1, s2, s3;
    control_state_init(&s0);
    assert_true(control_state_check(&s0));
    control_change_t chg;
    char field[64], err[256];

    /* running -> paused for 10m: the running spec is what comes back */
    assert_int_equal(parse(CONTROL_REQ_PAUSE, "{\"reason\":\"dba\",\"for\":\"10m\"}", &chg, field, err), 0);
    assert_int_equal(control_state_apply(&s0, &chg, 1000, "alice", &s1), 0);
    control_spec_free(&chg.spec);
    assert_int_equal(s1.version, 1);
    assert_int_equal(s1.spec.mode, CONTROL_PAUSED);
    assert_string_equal(s1.updated_by, "alice");
    assert_string_equal(s1.reason, "dba");
    assert_int_equal(s1.expires_at_ms, 1000 + 600000);
    assert_true(s1.has_revert);
    assert_int_equal(s1.revert.mode, CONTROL_RUNNING);
    assert_true(control_state_check(&s1));

    /* expiry: back to running, version 2, by sluice */
    assert_int_equal(control_state_revert(&s1, 601000, &s2), 0);
    assert_int_equal(s2.version, 2);
    assert_int_equal(s2.spec.mode, CONTROL_RUNNING);
    assert_false(s2.has_revert);
    assert_int_equal(s2.expires_at_ms, 0);
    assert_string_equal(s2.updated_by, "sluice (expiry)");
    assert_true(control_state_check(&s2));

    /* rate limit (permanent), then a temporary drain returns to that rate limit */
    assert_int_equal(parse(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":300}", &chg, field, err), 0);
    control_state_free(&s1);
    assert_int_equal(control_state_apply(&s2, &chg, 602000, "bob", &s1), 0);
    control_spec_free(&chg.spec);
    assert_int_equal(parse(CONTROL_REQ_DRAIN, "{\"match\":[\"table=^tmp_\"],\"for\":\"1m\"}", &chg, field, err), 0);
    assert_int_equal(control_state_apply(&s1, &chg, 603000, "bob", &s3), 0);
    control_spec_free(&chg.spec);
    assert_int_equal(s3.spec.mode, CONTROL_DRAINING);
    assert_int_equal(s3.revert.mode, CONTROL_RATE_LIMITED);
    assert_int_equal(s3.revert.rate_limit_per_second, 300);
    control_state_free(&s2);
    assert_int_equal(control_state_revert(&s3, 663000, &s2), 0);
    assert_int_equal(s2.spec.mode, CONTROL_RATE_LIMITED);
    assert_int_equal(s2.spec.rate_limit_per_second, 300);
    assert_int_equal(s2.version, 5);

    /* a permanent change clears a pending expiry */
    assert_int_equal(parse(CONTROL_REQ_RESUME, "", &chg, field, err), 0);
    control_state_t s4;
    assert_int_equal(control_state_apply(&s3, &chg, 604000, "carol", &s4), 0);
    assert_false(s4.has_revert);
    assert_int_equal(s4.expires_at_ms, 0);
    control_state_free(&s4);

    /* the invariant checker catches broken states */
    s4 = s2;
    s4.spec.rate_limit_per_second = 0;
    assert_false(control_state_check(&s4));
    s4 = s2;
    s4.expires_at_ms = 5;
    assert_false(control_state_check(&s4));

    control_state_free(&s0);
    control_state_free(&s1);
    control_state_free(&s2);
    control_state_free(&s3);
}

static void test_json_roundtrip(void **state)
{
    control_state_t s0, s1, back;
    control_state_init(&s0);
    control_change_t chg;
    char field[64], err[256];
    assert_int_equal(parse(CONTROL_REQ_DRAIN,
                           "{\"match\":[{\"attribute\":\"ta\\\"ble\",\"regex\":\"^tmp_\\\\d\"}],\"for\":\"5m\","
                           "\"reason\":\"bulk fix\"}",
                           &chg, field, err),
                     0);
    assert_int_equal(control_state_apply(&s0, &chg, 1714532400123, "ops", &s1), 0);
    control_spec_free(&chg.spec);
    buf_t b = BUF_INIT;
    control_state_to_json(&s1, "job \"1\"", &b);
    assert_non_null(strstr(b.data, "\"updated_at\":\"2024-05-01T03:00:00.123Z\""));
    assert_non_null(strstr(b.data, "\"mode\":\"draining\""));
    assert_non_null(strstr(b.data, "\"revert_to\":{\"mode\":\"running\""));
    assert_int_equal(control_state_from_json(b.data, b.len, &back, err, sizeof(err)), 0);
    assert_int_equal(back.version, 1);
    assert_int_equal(back.spec.mode, CONTROL_DRAINING);
    assert_string_equal(back.spec.drain[0].attribute, "ta\"ble");
    assert_string_equal(back.spec.drain[0].regex, "^tmp_\\d");
    assert_int_equal(back.expires_at_ms, s1.expires_at_ms);
    assert_true(back.has_revert);
    assert_string_equal(back.reason, "bulk fix");
    buf_t b2 = BUF_INIT;
    control_state_to_json(&back, "job \"1\"", &b2);
    assert_string_equal(b.data, b2.data);
    control_state_t bad;
    assert_int_equal(control_state_from_json("{\"mode\":\"sideways\"}", 19, &bad, err, sizeof(err)), -1);
    buf_free(&b);
    buf_free(&b2);
    control_state_free(&back);
    control_state_free(&s1);
    control_state_free(&s0);
}

/* Applies a request body of kind to a fresh job at t=now and returns the poll's bizresult. */
static void tis_of(control_req_kind_t kind, const char *body, int64_t now, buf_t *out)
{
    control_state_t s0, s1;
    control_state_init(&s0);
    control_change_t chg;
    char field[64], err[256];
    assert_int_equal(parse(kind, body, &chg, field, err), 0);
    assert_int_equal(control_state_apply(&s0, &chg, now, "ops", &s1), 0);
    control_spec_free(&chg.spec);
    buf_reset(out);
    control_state_to_tis_json(&s1, out);
    control_state_free(&s1);
    control_state_free(&s0);
}

/* The TIS mapping of every mode, drains with and without matchers apart. */
static void test_tis_mapping(void **state)
{
    buf_t b = BUF_INIT;
    control_state_t s;
    control_state_init(&s);
    control_state_to_tis_json(&s, &b);
    assert_string_equal(b.data, "{\"pause\":false,\"lastModified\":0,\"controllerType\":\"NoLimitParam\","
                                "\"payloadParams\":{\"rateLimitPerSecond\":0}}");
    control_state_free(&s);

    tis_of(CONTROL_REQ_PAUSE, "", 1000, &b);
    assert_string_equal(b.data, "{\"pause\":true,\"lastModified\":1000,\"controllerType\":\"Paused\","
                                "\"payloadParams\":{\"rateLimitPerSecond\":0}}");
    tis_of(CONTROL_REQ_RATE_LIMIT, "{\"per_second\":2500}", 2000, &b);
    assert_string_equal(b.data, "{\"pause\":false,\"lastModified\":2000,\"controllerType\":\"RateLimit\","
                                "\"payloadParams\":{\"rateLimitPerSecond\":2500}}");
    /* drain everything: TIS's flood discharge */
    tis_of(CONTROL_REQ_DRAIN, "", 3000, &b);
    assert_string_equal(b.data, "{\"pause\":false,\"lastModified\":3000,\"controllerType\":"
                                "\"FloodDischargeRate\",\"payloadParams\":{\"rateLimitPerSecond\":0}}");
    tis_of(CONTROL_REQ_DRAIN, "{\"match\":[]}", 3500, &b);
    assert_non_null(strstr(b.data, "\"FloodDischargeRate\""));
    /* drain by matchers: never FloodDischargeRate (that would discard the rest too) */
    tis_of(CONTROL_REQ_DRAIN, "{\"match\":[{\"attribute\":\"table\",\"regex\":\"^tmp_\\\"x\"},\"db=^scratch$\"]}", 4000,
           &b);
    assert_string_equal(b.data, "{\"pause\":false,\"lastModified\":4000,\"controllerType\":\"SkipProcess\","
                                "\"payloadParams\":{\"rateLimitPerSecond\":0,\"drain\":["
                                "{\"attribute\":\"table\",\"regex\":\"^tmp_\\\"x\"},"
                                "{\"attribute\":\"db\",\"regex\":\"^scratch$\"}]}}");
    tis_of(CONTROL_REQ_RESUME, "", 5000, &b);
    assert_non_null(strstr(b.data, "\"controllerType\":\"NoLimitParam\""));
    buf_free(&b);

    control_spec_t sp = {.mode = CONTROL_DRAINING};
    assert_string_equal(control_spec_tis_type(&sp), "FloodDischargeRate");
    control_match_t m = {"table", "^tmp_"};
    sp.drain = &m;
    sp.ndrain = 1;
    assert_string_equal(control_spec_tis_type(&sp), "SkipProcess");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_names),
        cmocka_unit_test(test_parse_good),
        cmocka_unit_test(test_parse_bad_names_the_field),
        cmocka_unit_test(test_job_names),
        cmocka_unit_test(test_apply_and_revert),
        cmocka_unit_test(test_json_roundtrip),
        cmocka_unit_test(test_tis_mapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
