/* Unit tests for internal/rules/rules.c: evaluation against a memory-only store — recording rules
 * write their results, the alert state machine (pending -> firing -> resolved, for,
 * keep_firing_for), ALERTS/ALERTS_FOR_STATE and staleness markers, hooks, limits, reload keeping
 * state, refused reloads keeping the old rules, the group evaluation offset, API JSON. */
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

#include "internal/promql/engine.h"
#include "internal/rules/rules.h"
#include "internal/util/log.h"

#define T0 1700000000000LL

static int64_t now_ms = T0;
static int64_t test_clock(void)
{
    return now_ms;
}

static storage_t *new_store(void)
{
    storage_options_t o;
    storage_options_default(&o);
    o.path = NULL;
    o.no_background = true;
    o.clock_ms = test_clock;
    char err[256];
    storage_t *s = storage_open(&o, err, sizeof(err));
    assert_non_null(s);
    return s;
}

static void push(storage_t *s, const char *job, const char *task, double v, int64_t t)
{
    label_t lv[] = {{"__name__", "flink_taskmanager_job_task_backPressuredTimeMsPerSecond"},
                    {"job_name", job},
                    {"task_name", task}};
    storage_sample_t smp = {.labels = {lv, 3}, .t = t, .v = v};
    assert_int_equal(storage_append(s, &smp, 1, NULL), STORAGE_OK);
}

/* Value of an instant query (one sample expected) or NAN if empty; -1 if more than one. */
static double query1(storage_t *s, const char *q, int64_t t)
{
    char err[256];
    promql_ast_t *ast = promql_parse(q, err, sizeof(err));
    assert_non_null(ast);
    querier_t *qr = storage_querier(s);
    promql_result_t *r = promql_exec_instant(qr, ast, t, NULL);
    querier_close(qr);
    assert_int_equal(r->err_kind, PROMQL_ERR_NONE);
    double v = NAN;
    if (r->value.type == PROMQL_VT_VECTOR && r->value.nsamples == 1)
        v = r->value.samples[0].v;
    else if (r->value.type == PROMQL_VT_VECTOR && r->value.nsamples > 1)
        v = -1;
    promql_result_free(r);
    promql_ast_free(ast);
    return v;
}

static char *write_rules(const char *text)
{
    char *path = strdup("/tmp/sluice-rules-XXXXXX.yml");
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static const char *rules_text =
    "groups:\n"
    "- name: flink\n"
    "  interval: 10s\n"
    "  rules:\n"
    "  - record: job:backpressure:ratio\n"
    "    expr: max by (job_name) (flink_taskmanager_job_task_backPressuredTimeMsPerSecond) / 1000\n"
    "  - alert: FlinkJobBackpressured\n"
    "    expr: job:backpressure:ratio > 0.5\n"
    "    for: 20s\n"
    "    labels:\n"
    "      severity: page\n"
    "      job_name: '{{ $labels.job_name }}'\n"
    "    annotations:\n"
    "      summary: '{{ $labels.job_name }} is backpressured {{ $value | humanizePercentage }}'\n"
    "      broken: '{{ humanize \"x\" }}'\n";

typedef struct {
    int firing, resolved, sent;
    char last_job[64];
    int64_t last_ends_at;
} hooks_seen_t;

static void h_send(void *ud, const rules_alert_note_t *a, size_t n)
{
    hooks_seen_t *h = ud;
    h->sent += (int)n;
    h->last_ends_at = a[n - 1].ends_at_ms;
}

static void h_transition(void *ud, const rules_alert_note_t *a, bool firing, int64_t ts)
{
    (void)ts;
    hooks_seen_t *h = ud;
    if (firing)
        h->firing++;
    else
        h->resolved++;
    snprintf(h->last_job, sizeof(h->last_job), "%s", labels_get(a->labels, "job_name"));
}

static void test_alert_lifecycle(void **state)
{
    (void)state;
    storage_t *s = new_store();
    hooks_seen_t seen = {0};
    rules_options_t o = {.storage = s, .hooks = {.ud = &seen, .send = h_send, .transition = h_transition}};
    rules_manager_t *m = rules_manager_new(&o);
    char *path = write_rules(rules_text);
    buf_t errs = BUF_INIT;
    const char *pats[] = {path};
    assert_int_equal(rules_manager_load(m, pats, 1, &errs), 0);
    assert_int_equal(rules_manager_group_count(m), 1);

    int64_t t = T0;
    /* healthy: 100 ms/s backpressured */
    for (int i = 0; i < 3; i++, t += 10000) {
        now_ms = t;
        push(s, "orders", "map", 100, t);
        rules_manager_eval_all_at(m, t);
    }
    assert_true(fabs(query1(s, "job:backpressure:ratio{job_name=\"orders\"}", t - 10000) - 0.1) < 1e-9);
    assert_int_equal(seen.firing, 0);
    /* backpressured: 800 ms/s; pending for 20s, then firing */
    int64_t bp_start = t;
    for (int i = 0; i < 2; i++, t += 10000) {
        now_ms = t;
        push(s, "orders", "map", 800, t);
        rules_manager_eval_all_at(m, t);
        assert_int_equal(seen.firing, 0);
    }
    buf_t b = BUF_INIT;
    rules_manager_alerts_json(m, &b);
    assert_non_null(strstr(b.data, "\"state\":\"pending\""));
    assert_non_null(strstr(b.data, "orders is backpressured 80%"));
    assert_non_null(
        strstr(b.data, "<error expanding template: error executing template __alert_FlinkJobBackpressured: "));
    assert_non_null(strstr(b.data, "\"value\":\"8e-01\""));
    buf_reset(&b);
    now_ms = t;
    push(s, "orders", "map", 800, t);
    rules_manager_eval_all_at(m, t);
    assert_int_equal(seen.firing, 1);
    assert_string_equal(seen.last_job, "orders");
    assert_int_equal(seen.sent, 1);
    assert_int_equal(seen.last_ends_at, t + 4 * 60000); /* ValidUntil = ts + 4 * max(resend, interval) */
    /* ALERTS: written from the third evaluation after start-up on (restored after the second) */
    assert_true(isnan(query1(s, "ALERTS", T0 + 10000)));
    assert_true(query1(s, "ALERTS{alertstate=\"pending\"}", bp_start) == 1);
    assert_true(query1(s, "ALERTS{alertstate=\"firing\",alertname=\"FlinkJobBackpressured\",severity=\"page\"}", t) ==
                1);
    assert_true(query1(s, "ALERTS_FOR_STATE", t) == (double)(bp_start / 1000));
    rules_manager_rules_json(m, NULL, &b);
    assert_non_null(strstr(b.data, "\"state\":\"firing\",\"name\":\"FlinkJobBackpressured\""));
    assert_non_null(strstr(b.data, "\"query\":\"job:backpressure:ratio > 0.5\""));
    assert_non_null(strstr(b.data, "\"duration\":20"));
    assert_non_null(strstr(b.data, "\"type\":\"recording\""));
    assert_non_null(strstr(b.data, "\"interval\":10,\"limit\":0"));
    buf_reset(&b);
    rules_manager_rules_json(m, "record", &b);
    assert_null(strstr(b.data, "alerting"));
    buf_reset(&b);

    /* firing again: not re-sent before the resend delay */
    t += 10000;
    now_ms = t;
    push(s, "orders", "map", 900, t);
    rules_manager_eval_all_at(m, t);
    assert_int_equal(seen.sent, 1);
    /* recovers: resolved at once, ALERTS goes stale */
    t += 10000;
    now_ms = t;
    push(s, "orders", "map", 50, t);
    rules_manager_eval_all_at(m, t);
    assert_int_equal(seen.resolved, 1);
    assert_int_equal(seen.sent, 2); /* the resolved alert is sent once */
    assert_int_equal(seen.last_ends_at, t);
    assert_true(isnan(query1(s, "ALERTS", t)));
    rules_manager_alerts_json(m, &b);
    assert_string_equal(b.data, "{\"alerts\":[]}");
    buf_reset(&b);

    /* a refused reload keeps the old rules */
    FILE *fp = fopen(path, "w");
    fputs("groups:\n- name: x\n  rules:\n  - record: y\n    expr: sum(\n", fp);
    fclose(fp);
    assert_true(rules_manager_reload(m, &errs) > 0);
    assert_non_null(strstr(errs.data, "could not parse expression"));
    assert_false(rules_manager_last_reload_ok(m));
    rules_manager_rules_json(m, NULL, &b);
    assert_non_null(strstr(b.data, "FlinkJobBackpressured"));
    buf_reset(&b);
    /* a good reload replaces them; the removed recording rule's series go stale */
    fp = fopen(path, "w");
    fputs("groups:\n- name: other\n  rules:\n  - record: two\n    expr: vector(2)\n", fp);
    fclose(fp);
    t += 10000;
    now_ms = t;
    buf_reset(&errs);
    assert_int_equal(rules_manager_reload(m, &errs), 0);
    assert_true(isnan(query1(s, "job:backpressure:ratio", t + 1000)));
    rules_manager_eval_all_at(m, t + 1000);
    assert_true(query1(s, "two", t + 1000) == 2);

    buf_free(&b);
    buf_free(&errs);
    rules_manager_free(m);
    storage_close(s);
    unlink(path);
    free(path);
}

static void test_limits_and_errors(void **state)
{
    (void)state;
    now_ms = T0;
    storage_t *s = new_store();
    rules_options_t o = {.storage = s};
    rules_manager_t *m = rules_manager_new(&o);
    char *path = write_rules("groups:\n- name: g\n  limit: 1\n  rules:\n"
                             "  - record: r\n    expr: flink_taskmanager_job_task_backPressuredTimeMsPerSecond\n"
                             "  - record: dup\n    expr: flink_taskmanager_job_task_backPressuredTimeMsPerSecond\n"
                             "    labels: {job_name: same, task_name: same}\n"
                             "  - alert: Str\n    expr: '\"x\"'\n");
    const char *pats[] = {path};
    buf_t errs = BUF_INIT;
    assert_int_equal(rules_manager_load(m, pats, 1, &errs), 0);
    push(s, "a", "t1", 1, T0);
    push(s, "a", "t2", 1, T0);
    rules_manager_eval_all_at(m, T0);
    buf_t b = BUF_INIT;
    rules_manager_rules_json(m, NULL, &b);
    assert_non_null(strstr(b.data, "\"lastError\":\"exceeded limit 1 with 2 series\""));
    assert_non_null(strstr(b.data, "vector contains metrics with the same labelset after applying rule labels"));
    assert_non_null(strstr(b.data, "rule result is not a vector or scalar"));
    assert_non_null(strstr(b.data, "\"health\":\"err\""));
    buf_reset(&b);
    rules_manager_write_metrics(m, &b);
    assert_non_null(strstr(b.data, "sluice_rule_evaluation_failures_total 3"));
    buf_free(&b);
    buf_free(&errs);
    rules_manager_free(m);
    storage_close(s);
    unlink(path);
    free(path);
}

static void test_keep_firing_for(void **state)
{
    (void)state;
    now_ms = T0;
    storage_t *s = new_store();
    hooks_seen_t seen = {0};
    rules_options_t o = {.storage = s, .hooks = {.ud = &seen, .transition = h_transition}};
    rules_manager_t *m = rules_manager_new(&o);
    char *path = write_rules("groups:\n- name: g\n  interval: 10s\n  rules:\n"
                             "  - alert: Hot\n    expr: flink_taskmanager_job_task_backPressuredTimeMsPerSecond > 500\n"
                             "    keep_firing_for: 15s\n");
    const char *pats[] = {path};
    buf_t errs = BUF_INIT;
    assert_int_equal(rules_manager_load(m, pats, 1, &errs), 0);
    int64_t t = T0;
    push(s, "a", "t", 900, t);
    rules_manager_eval_all_at(m, t); /* for: 0 -> fires at once */
    assert_int_equal(seen.firing, 1);
    t += 10000;
    push(s, "a", "t", 100, t);
    rules_manager_eval_all_at(m, t); /* absent for the first time: kept firing */
    assert_int_equal(seen.resolved, 0);
    t += 10000;
    push(s, "a", "t", 100, t);
    rules_manager_eval_all_at(m, t); /* absent since T0+10s: 10s < 15s, still firing */
    assert_int_equal(seen.resolved, 0);
    t += 10000;
    push(s, "a", "t", 100, t);
    rules_manager_eval_all_at(m, t); /* 20s >= 15s: resolved */
    assert_int_equal(seen.resolved, 1);
    buf_free(&errs);
    rules_manager_free(m);
    storage_close(s);
    unlink(path);
    free(path);
}

static void test_eval_offset(void **state)
{
    (void)state;
    /* Same group, file and interval -> same instants; the offset stays within the interval and
     * the result is aligned: ts - offset is a multiple of the interval. */
    int64_t now = 1700000012345678901LL;
    int64_t t1 = rules_group_eval_timestamp_ns("flink", "/etc/rules.yml", 15000, now);
    int64_t t2 = rules_group_eval_timestamp_ns("flink", "/etc/rules.yml", 15000, now + 15000000000LL);
    assert_true(t1 <= now && now - t1 < 15000000000LL);
    assert_int_equal(t2 - t1, 15000000000LL);
    int64_t t3 = rules_group_eval_timestamp_ns("flink2", "/etc/rules.yml", 15000, now);
    assert_true(t3 != t1);
    buf_t b = BUF_INIT;
    rules_format_time(1700000000120, &b);
    assert_string_equal(b.data, "2023-11-14T22:13:20.12Z");
    buf_reset(&b);
    rules_format_time(0, &b);
    assert_string_equal(b.data, "0001-01-01T00:00:00Z");
    buf_free(&b);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alert_lifecycle),
        cmocka_unit_test(test_limits_and_errors),
        cmocka_unit_test(test_keep_firing_for),
        cmocka_unit_test(test_eval_offset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
