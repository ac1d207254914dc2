/* Unit tests for internal/rules/rulefile.c. The expected messages were taken from Debian's
 * `promtool check rules` (Prometheus 2.42) run on the same files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal/rules/rulefile.h"

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/sluice-rulefile-XXXXXX.yml");
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* Loads text; returns the error text with the temp path replaced by "F". */
static char *load(const char *text, rules_file_t *f, int *nerr)
{
    char *path = write_tmp(text);
    buf_t errs = BUF_INIT;
    *nerr = rules_file_load(f, path, &errs);
    buf_t out = BUF_INIT;
    const char *s = errs.data ? errs.data : "";
    size_t pl = strlen(path);
    while (*s) {
        if (strncmp(s, path, pl) == 0) {
            buf_putc(&out, 'F');
            s += pl;
        } else {
            buf_putc(&out, *s++);
        }
    }
    unlink(path);
    free(path);
    buf_free(&errs);
    return out.data ? out.data : strdup("");
}

static void expect_errors(const char *text, const char *want)
{
    rules_file_t f = {0};
    int nerr;
    char *got = load(text, &f, &nerr);
    if (strcmp(got, want) != 0)
        fail_msg("errors:\n%s\nwant:\n%s", got, want);
    assert_true(nerr > 0);
    assert_int_equal(f.ngroups, 0);
    free(got);
    rules_file_free(&f);
}

static void test_valid(void **state)
{
    (void)state;
    rules_file_t f = {0};
    int nerr;
    char *got = load("groups:\n"
                     "- name: flink\n"
                     "  interval: 15s\n"
                     "  limit: 10\n"
                     "  rules:\n"
                     "  - record: job:bp:max\n"
                     "    expr: max by (job_name) (flink_taskmanager_job_task_backPressuredTimeMsPerSecond) / 1000\n"
                     "    labels: {tier: \"1\"}\n"
                     "  - alert: Backpressured\n"
                     "    expr: job:bp:max > 0.5\n"
                     "    for: 1m\n"
                     "    keep_firing_for: 30s\n"
                     "    labels:\n      severity: page\n"
                     "    annotations:\n      summary: '{{ $labels.job_name }} at {{ $value | humanizePercentage }}'\n"
                     "- name: other\n  rules: []\n",
                     &f, &nerr);
    assert_string_equal(got, "");
    free(got);
    assert_int_equal(nerr, 0);
    assert_int_equal(f.ngroups, 2);
    rules_group_def_t *g = &f.groups[0];
    assert_string_equal(g->name, "flink");
    assert_int_equal(g->interval_ms, 15000);
    assert_int_equal(g->limit, 10);
    assert_int_equal(g->nrules, 2);
    assert_int_equal(g->rules[0].kind, RULES_RECORD);
    assert_string_equal(g->rules[0].name, "job:bp:max");
    assert_non_null(g->rules[0].ast);
    assert_string_equal(labels_get(&g->rules[0].labels, "tier"), "1");
    assert_int_equal(g->rules[1].kind, RULES_ALERT);
    assert_int_equal(g->rules[1].for_ms, 60000);
    assert_int_equal(g->rules[1].keep_firing_for_ms, 30000);
    assert_string_equal(labels_get(&g->rules[1].labels, "severity"), "page");
    assert_int_equal(f.groups[1].nrules, 0);
    rules_file_free(&f);

    /* empty files and empty group lists are fine */
    got = load("", &f, &nerr);
    assert_int_equal(nerr, 0);
    free(got);
    got = load("groups: []\n", &f, &nerr);
    assert_int_equal(nerr, 0);
    free(got);
    rules_file_free(&f);
}

static void test_promtool_messages(void **state)
{
    (void)state;
    expect_errors("groups:\n- name: \"\"\n  rules: []\n- rules: []\n",
                  "F: 2:3: Groupname must not be empty\n"
                  "F: 4:3: Groupname must not be empty\n"
                  "F: 4:3: groupname: \"\" is repeated in the same file\n");
    expect_errors("group:\n- name: x\n",
                  "F: yaml: unmarshal errors:\n  line 1: field group not found in type rulefmt.RuleGroups\n");
    expect_errors("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    for: 1x\n",
                  "F: not a valid duration string: \"1x\"\n");
    expect_errors("groups:\n- name: g\n  rules:\n  - record: a\n    expr: up\n    foo: bar\n",
                  "F: yaml: unmarshal errors:\n  line 6: field foo not found in type rulefmt.RuleNode\n");
    expect_errors("groups:\n"
                  "- name: g\n"
                  "  interval: 10s\n"
                  "  rules:\n"
                  "  - record: job:up\n"
                  "    expr: sum(up)\n"
                  "  - alert: B\n"
                  "    expr: up == 0\n"
                  "    for: 1m\n"
                  "- name: g\n"
                  "  rules:\n"
                  "  - alert: 'bad name'\n"
                  "    expr: up\n"
                  "    annotations:\n"
                  "      x: \"{{ nope }}\"\n"
                  "      \"9\": y\n"
                  "    labels:\n"
                  "      \"a-b\": c\n"
                  "  - record: x\n"
                  "    alert: y\n"
                  "    expr: up\n"
                  "  - expr: up\n"
                  "  - record: ok\n"
                  "    expr: up\n"
                  "    for: 1m\n"
                  "    annotations: {a: b}\n",
                  "F: 10:3: groupname: \"g\" is repeated in the same file\n"
                  "F: group \"g\", rule 1, \"bad name\": invalid label name: a-b\n"
                  "F: group \"g\", rule 1, \"bad name\": invalid annotation name: 9\n"
                  "F: group \"g\", rule 1, \"bad name\": annotation \"x\": template: __alert_bad name:1: function "
                  "\"nope\" not defined\n"
                  "F: 19:13: 20:12: group \"g\", rule 2, \"y\": only one of 'record' and 'alert' must be set\n"
                  "F: 0:0: group \"g\", rule 3, \"\": one of 'record' or 'alert' must be set\n"
                  "F: 23:13: group \"g\", rule 4, \"ok\": invalid field 'annotations' in recording rule\n"
                  "F: 23:13: group \"g\", rule 4, \"ok\": invalid field 'for' in recording rule\n");
    expect_errors("groups:\n"
                  "- name: g\n"
                  "  rules:\n"
                  "  - record: job:up\n"
                  "    expr: rate(up)\n"
                  "  - record: \"bad name\"\n"
                  "    expr: up\n"
                  "  - alert: X\n"
                  "  - record: r\n"
                  "    expr: up\n"
                  "    labels:\n"
                  "      __name__: x\n",
                  "F: 5:11: group \"g\", rule 1, \"job:up\": could not parse expression: 1:6: parse error: expected "
                  "type range vector in call to function \"rate\", got instant vector\n"
                  "F: 6:13: group \"g\", rule 2, \"bad name\": invalid recording rule name: bad name\n"
                  "F: 0:0: group \"g\", rule 3, \"X\": field 'expr' must be set in rule\n"
                  "F: group \"g\", rule 4, \"r\": invalid label name: __name__\n");
}

static void test_globs(void **state)
{
    (void)state;
    char dir[] = "/tmp/sluice-rules-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p1[256], p2[256], pat[256];
    snprintf(p1, sizeof(p1), "%s/a.yml", dir);
    snprintf(p2, sizeof(p2), "%s/b.yml", dir);
    FILE *fp = fopen(p1, "w");
    fputs("groups:\n- name: a\n  rules:\n  - record: x\n    expr: up\n", fp);
    fclose(fp);
    fp = fopen(p2, "w");
    fputs("groups:\n- name: a\n  rules:\n  - record: y\n    expr: up\n", fp);
    fclose(fp);
    snprintf(pat, sizeof(pat), "%s/*.yml", dir);
    const char *pats[] = {pat, "/nonexistent/*.yml"};
    rules_file_t f = {0};
    buf_t errs = BUF_INIT;
    assert_int_equal(rules_files_load(&f, pats, 2, &errs), 0);
    assert_int_equal(f.ngroups, 2); /* same group name in two files is fine */
    assert_string_equal(f.groups[1].file, p2);
    rules_file_free(&f);
    const char *missing[] = {"/nonexistent/rules.yml"};
    assert_int_equal(rules_files_load(&f, missing, 1, &errs), 1);
    assert_non_null(strstr(errs.data, "no such file"));
    buf_free(&errs);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_promtool_messages),
        cmocka_unit_test(test_globs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
