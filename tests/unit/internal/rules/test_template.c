/* Unit tests for internal/rules/template.c: the Go text/template subset with Prometheus' functions.
 * Expected strings are what Prometheus 2.42 renders for the same template and data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal/rules/template.h"

static label_t lv[] = {{"instance", "tm-1:9249"}, {"job_name", "orders"}, {"severity", "page"}};
static labels_t lbls = {lv, 3};
static label_t ev[] = {{"cluster", "eu1"}};
static labels_t ext = {ev, 1};

static void expect(const char *tmpl, double value, const char *want)
{
    rules_tmpl_data_t d = {
        .labels = &lbls, .external_labels = &ext, .external_url = "http://sluice:9091", .value = value};
    buf_t b = BUF_INIT;
    rules_tmpl_expand("__alert_Test", tmpl, &d, &b);
    if (strcmp(b.data ? b.data : "", want) != 0)
        fail_msg("template %s (value %g):\n got  [%s]\n want [%s]", tmpl, value, b.data ? b.data : "", want);
    buf_free(&b);
}

static void expect_err(const char *tmpl, double value, const char *want_in)
{
    rules_tmpl_data_t d = {.labels = &lbls, .external_labels = &ext, .value = value};
    buf_t b = BUF_INIT;
    int rc = rules_tmpl_expand("__alert_Test", tmpl, &d, &b);
    if (rc == 0 || !strstr(b.data, "<error expanding template: ") || !strstr(b.data, want_in))
        fail_msg("template %s: got [%s], want an error containing [%s]", tmpl, b.data ? b.data : "", want_in);
    buf_free(&b);
}

static void test_variables(void **state)
{
    (void)state;
    expect("plain text", 1, "plain text");
    expect("{{ $labels.job_name }} is backpressured", 1, "orders is backpressured");
    expect("{{$labels.missing}}|", 1, "|");
    expect("{{ .Labels.instance }} {{ .Value }}", 0.75, "tm-1:9249 0.75");
    expect("{{ $value }}", 1234567, "1.234567e+06");
    expect("{{ $value }}", 100, "100");
    expect("{{ $externalLabels.cluster }} {{ $externalURL }}", 1, "eu1 http://sluice:9091");
    expect("{{ $labels }}", 1, "map[instance:tm-1:9249 job_name:orders severity:page]");
    expect("a {{- \" b \" -}} c", 1, "a b c");
    expect("x {{/* comment */}}y", 1, "x y");
    expect("{{ $v := printf \"%.1f\" $value }}v={{ $v }}", 2.25, "v=2.2");
}

static void test_humanize(void **state)
{
    (void)state;
    expect("{{ humanize $value }}", 1234567, "1.235M");
    expect("{{ $value | humanize }}", 0.00123, "1.23m");
    expect("{{ humanize 0 }}", 0, "0");
    expect("{{ humanize1024 $value }}", 1048576, "1Mi");
    expect("{{ humanizePercentage $value }}", 0.8765, "87.65%");
    expect("{{ humanizeDuration $value }}", 90061, "1d 1h 1m 1s");
    expect("{{ humanizeDuration $value }}", 3725, "1h 2m 5s");
    expect("{{ humanizeDuration $value }}", 61, "1m 1s");
    expect("{{ humanizeDuration $value }}", 1.5, "1.5s");
    expect("{{ humanizeDuration $value }}", 0.25, "250ms");
    expect("{{ humanizeDuration 0 }}", 0, "0s");
    expect("{{ humanize $value }}", INFINITY, "+Inf");
    expect("{{ humanizeTimestamp $value }}", 1435065584.128, "2015-06-23 13:19:44.128 +0000 UTC");
    expect("{{ humanize \"2048\" }}", 0, "2.048k");
}

static void test_printf_and_logic(void **state)
{
    (void)state;
    expect("{{ printf \"%.2f\" $value }}", 0.756, "0.76");
    expect("{{ printf \"%s=%v\" \"x\" $value }}", 3, "x=3");
    expect("{{ printf \"%d items\" 5 }}", 0, "5 items");
    expect("{{ printf \"%d\" $value }}", 1.5, "%!d(float64=1.5)");
    expect("{{ printf \"%5.1f%%\" $value }}", 12.34, " 12.3%");
    expect("{{ if gt $value 0.5 }}HIGH{{ else if gt $value 0.1 }}LOW{{ else }}OK{{ end }}", 0.7, "HIGH");
    expect("{{ if gt $value 0.5 }}HIGH{{ else if gt $value 0.1 }}LOW{{ else }}OK{{ end }}", 0.2, "LOW");
    expect("{{ if gt $value 0.5 }}HIGH{{ else if gt $value 0.1 }}LOW{{ else }}OK{{ end }}", 0.0, "OK");
    expect("{{ if eq $labels.severity \"page\" }}P{{ end }}", 0, "P");
    expect("{{ toUpper $labels.job_name }} {{ title \"hello world\" }}", 0, "ORDERS Hello World");
    expect("{{ stripPort $labels.instance }}", 0, "tm-1");
    expect("{{ reReplaceAll \"tm-(\\\\d+).*\" \"TaskManager $1\" $labels.instance }}", 0, "TaskManager 1");
    expect("{{ if match \"^ord\" $labels.job_name }}yes{{ end }}", 0, "yes");
    expect("{{ and 1 0 }} {{ or 0 \"x\" }} {{ not true }}", 0, "0 x false");
}

static void test_errors(void **state)
{
    (void)state;
    /* Go: function "nope" not defined (a parse error) */
    expect_err("{{ nope $value }}", 1,
               "error parsing template __alert_Test: template: __alert_Test:1: function \"nope\" not defined");
    expect_err("{{ $labels.job", 1, "unclosed action");
    expect_err("{{ if true }}x", 1, "unexpected EOF");
    expect_err("{{ end }}", 1, "unexpected {{end}}");
    /* execution errors */
    expect_err("{{ humanize \"abc\" }}", 1, "error executing template __alert_Test: template: __alert_Test:1:");
    expect_err("{{ humanize \"abc\" }}", 1, "strconv.ParseFloat: parsing \"abc\": invalid syntax");
    expect_err("{{ gt $value 1 }}", 1, "incompatible types for comparison");
    expect_err("{{ $nope }}", 1, "undefined variable");
    expect_err("{{ .Nope }}", 1, "can't evaluate field Nope");
    expect_err("{{ humanize 1 2 }}", 1, "wrong number of args for humanize: want 1 got 2");

    char err[256];
    rules_tmpl_t *t = rules_tmpl_parse("x", "{{ range $labels }}{{ end }}", err, sizeof(err));
    assert_null(t);
    assert_non_null(strstr(err, "not supported"));
    t = rules_tmpl_parse("x", "ok {{ $value }}", err, sizeof(err));
    assert_non_null(t);
    rules_tmpl_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variables),
        cmocka_unit_test(test_humanize),
        cmocka_unit_test(test_printf_and_logic),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
