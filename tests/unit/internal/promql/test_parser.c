/*
 * Parser, type checks, error messages and both printers (String() and Pretty()) of
 * internal/promql, against the renderings and messages of Prometheus 2.42.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal/promql/ast.h"

static char *fmt(const char *q)
{
    char err[512];
    promql_ast_t *ast = promql_parse(q, err, sizeof(err));
    if (!ast) {
        fprintf(stderr, "parse of %s failed: %s\n", q, err);
        return NULL;
    }
    buf_t b = BUF_INIT;
    promql_format_expr(ast->root, &b);
    promql_ast_free(ast);
    return buf_steal(&b, NULL);
}

static void check_fmt(const char *q, const char *want)
{
    char *got = fmt(q);
    assert_non_null(got);
    if (strcmp(got, want) != 0)
        fprintf(stderr, "%s: got %s want %s\n", q, got, want);
    assert_string_equal(got, want);
    /* the rendering parses back to itself */
    char *again = fmt(got);
    assert_non_null(again);
    assert_string_equal(again, want);
    free(again);
    free(got);
}

static void check_err(const char *q, const char *want_substr)
{
    char err[512] = "";
    promql_ast_t *ast = promql_parse(q, err, sizeof(err));
    if (ast)
        fprintf(stderr, "%s: parsed but should fail\n", q);
    assert_null(ast);
    if (!strstr(err, want_substr))
        fprintf(stderr, "%s: error %s lacks %s\n", q, err, want_substr);
    assert_non_null(strstr(err, want_substr));
    assert_non_null(strstr(err, "parse error"));
}

static void test_format_literals(void **s)
{
    (void)s;
    check_fmt("1", "1");
    check_fmt("1e6", "1e+06");
    check_fmt("123456", "123456");
    check_fmt("0x10", "16");
    check_fmt("-1.5", "-1.5");
    check_fmt(".5", "0.5");
    check_fmt("Inf", "+Inf");
    check_fmt("-inf", "-Inf");
    check_fmt("NaN", "NaN");
    check_fmt("1e-7", "1e-07");
    check_fmt("\"a\\nb\"", "\"a\\nb\"");
    check_fmt("'it\"s'", "\"it\\\"s\"");
    check_fmt("`raw\\n`", "\"raw\\\\n\"");
}

static void test_format_selectors(void **s)
{
    (void)s;
    check_fmt("foo", "foo");
    check_fmt("foo{b=\"2\",a=\"1\"}", "foo{a=\"1\",b=\"2\"}");
    check_fmt("foo{a=~\"x.*\", b!=\"y\", c!~'z'}", "foo{a=~\"x.*\",b!=\"y\",c!~\"z\"}");
    check_fmt("{__name__=\"foo\"}", "{__name__=\"foo\"}");
    check_fmt("{__name__=~\"foo|bar\", job=\"x\",}", "{__name__=~\"foo|bar\",job=\"x\"}");
    check_fmt("foo:bar:rate5m", "foo:bar:rate5m");
    check_fmt("foo[5m]", "foo[5m]");
    check_fmt("foo[90m]", "foo[1h30m]");
    check_fmt("foo[8d]", "foo[8d]");
    check_fmt("foo[14d]", "foo[2w]");
    check_fmt("foo offset 5m", "foo offset 5m");
    check_fmt("foo offset -5m", "foo offset -5m");
    check_fmt("foo[5m] offset 1h", "foo[5m] offset 1h");
    check_fmt("foo @ 100", "foo @ 100.000");
    check_fmt("foo @ 100.5 offset 1m", "foo @ 100.500 offset 1m");
    check_fmt("foo offset 1m @ -5", "foo @ -5.000 offset 1m");
    check_fmt("foo[5m] @ start()", "foo[5m] @ start()");
    check_fmt("foo @ end()", "foo @ end()");
    check_fmt("{on=\"x\", by=\"y\"}", "{by=\"y\",on=\"x\"}");
}

static void test_format_operators(void **s)
{
    (void)s;
    check_fmt("a+b*c", "a + b * c");
    check_fmt("(a+b)*c", "(a + b) * c");
    check_fmt("a > bool 1", "a > bool 1");
    check_fmt("a + on(b) group_left(c) d", "a + on (b) group_left (c) d");
    check_fmt("a + ignoring(b) e", "a + ignoring (b) e");
    check_fmt("a * on() group_right b", "a * on () group_right () b");
    check_fmt("a and on(x) b", "a and on (x) b");
    check_fmt("a unless b or c", "a unless b or c");
    check_fmt("a atan2 b", "a atan2 b");
    check_fmt("- x", "-x");
    check_fmt("-(1)", "-(1)");
    check_fmt("- - 1", "1");
    check_fmt("+x", "+x");
    check_fmt("1 == bool 1", "1 == bool 1");
}

static void test_format_aggregations_calls(void **s)
{
    (void)s;
    check_fmt("sum(x)", "sum(x)");
    check_fmt("SUM(x) BY (job)", "sum by (job) (x)");
    check_fmt("sum by(job,instance) (x)", "sum by (job, instance) (x)");
    check_fmt("sum without(a)(x)", "sum without (a) (x)");
    check_fmt("sum without() (x)", "sum without () (x)");
    check_fmt("topk(3, x) by (le)", "topk by (le) (3, x)");
    check_fmt("count_values(\"v\", x)", "count_values(\"v\", x)");
    check_fmt("quantile(0.9, x)", "quantile(0.9, x)");
    check_fmt("rate(x[5m])", "rate(x[5m])");
    check_fmt("label_join(x, \"d\", \",\", \"a\", \"b\")", "label_join(x, \"d\", \",\", \"a\", \"b\")");
    check_fmt("time()", "time()");
    check_fmt("day_of_week()", "day_of_week()");
    check_fmt("round(x)", "round(x)");
    check_fmt("rate(x[1h:5m] offset 1m)", "rate(x[1h:5m] offset 1m)");
    check_fmt("max_over_time(rate(x[5m])[30m:])", "max_over_time(rate(x[5m])[30m:])");
    check_fmt("min_over_time((x)[5m:1m] @ 10)", "min_over_time((x)[5m:1m] @ 10.000)");
    check_fmt("sum by (by, on, group_left) (x)", "sum by (by, on, group_left) (x)");
    check_fmt("sum # comment\n(x)", "sum(x)");
}

static void test_precedence_shape(void **s)
{
    (void)s;
    char err[256];
    /* ^ is right-associative and binds tighter than unary minus */
    promql_ast_t *a = promql_parse("2 ^ 3 ^ 2", err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(a->root->kind, PROMQL_NODE_BINARY);
    assert_int_equal(a->root->u.bin.lhs->kind, PROMQL_NODE_NUMBER);
    assert_int_equal(a->root->u.bin.rhs->kind, PROMQL_NODE_BINARY);
    promql_ast_free(a);
    a = promql_parse("-x ^ 2", err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(a->root->kind, PROMQL_NODE_UNARY);
    assert_int_equal(a->root->u.unary.expr->kind, PROMQL_NODE_BINARY);
    promql_ast_free(a);
    a = promql_parse("-x * 2", err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(a->root->kind, PROMQL_NODE_BINARY);
    assert_int_equal(a->root->u.bin.lhs->kind, PROMQL_NODE_UNARY);
    promql_ast_free(a);
    /* or < and < comparison < + < * */
    a = promql_parse("a or b and c == d + e * f", err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(a->root->u.bin.op, PROMQL_OP_OR);
    assert_int_equal(a->root->u.bin.rhs->u.bin.op, PROMQL_OP_AND);
    assert_int_equal(a->root->u.bin.rhs->u.bin.rhs->u.bin.op, PROMQL_OP_EQLC);
    assert_int_equal(a->root->u.bin.rhs->u.bin.rhs->u.bin.rhs->u.bin.op, PROMQL_OP_ADD);
    assert_int_equal(a->root->u.bin.rhs->u.bin.rhs->u.bin.rhs->u.bin.rhs->u.bin.op, PROMQL_OP_MUL);
    assert_int_equal(a->root->u.bin.rhs->u.bin.card, PROMQL_CARD_MANY_TO_MANY);
    promql_ast_free(a);
    /* selectors get dense ids; the metric name becomes a matcher */
    a = promql_parse("a + b{x=\"1\"}", err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(a->nselectors, 2);
    assert_int_equal(a->root->u.bin.rhs->u.sel.nmatchers, 2);
    assert_int_equal(a->root->type, PROMQL_VT_VECTOR);
    promql_ast_free(a);
}

static void test_errors(void **s)
{
    (void)s;
    check_err("", "no expression found in input");
    check_err("sum(", "1:5: parse error: unexpected end of input");
    check_err("foo{a=\"b\"", "unexpected end of input");
    check_err("(1", "unclosed left parenthesis");
    check_err("1)", "unexpected right parenthesis ')'");
    check_err("rate(x)", "expected type range vector in call to function \"rate\", got instant vector");
    check_err("abs(x[5m])", "expected type instant vector in call to function \"abs\", got range vector");
    check_err("rate(x[5m], 1)", "expected 1 argument(s) in call to \"rate\", got 2");
    check_err("label_join(x)", "expected at least 3 argument(s) in call to \"label_join\", got 1");
    check_err("round(x, 1, 2)", "expected at most 2 argument(s) in call to \"round\", got 3");
    check_err("nosuch(x)", "unknown function with name \"nosuch\"");
    check_err("1 > 2", "comparisons between scalars must use BOOL modifier");
    check_err("a + bool b", "bool modifier can only be used on comparison operators");
    check_err("1 and 2", "set operator \"and\" not allowed in binary scalar expression");
    check_err("a and on(x) group_left b", "no grouping allowed for \"and\" operation");
    check_err("a + on(x) group_left(x) b", "label \"x\" must not occur in ON and GROUP clause at once");
    check_err("a + on(x) 1", "vector matching only allowed between instant vectors");
    check_err("x[5m] + 1", "binary expression must contain only scalar and instant vector types");
    check_err("{}", "vector selector must contain at least one non-empty matcher");
    check_fmt("foo{}", "foo");
    check_err("{a=~\".*\"}", "vector selector must contain at least one non-empty matcher");
    check_err("foo{__name__=\"bar\"}", "metric name must not be set twice");
    check_err("(x)[5m]", "ranges only allowed for vector selectors");
    check_err("x offset 5m [5m]", "no offset modifiers allowed before range");
    check_err("x offset 5m offset 1m", "offset may not be set multiple times");
    check_err("sum(x) offset 5m", "offset modifier must be preceded by");
    check_err("x @ 1 @ 2", "may not be set multiple times");
    check_err("x[5m][5m:1m]", "subquery is only allowed on instant vector, got range vector");
    check_err("sum(x[5m])", "expected type instant vector in aggregation expression, got range vector");
    check_err("topk(x, y)", "expected type scalar in aggregation parameter, got instant vector");
    check_err("count_values(1, y)", "expected type string in aggregation parameter, got scalar");
    check_err("topk(y)", "wrong number of arguments for aggregate expression provided, expected 2, got 1");
    check_err("-\"a\"", "unary expression only allowed on expressions of type scalar or instant vector");
    check_err("foo{a=~\"(\"}", "parse error");
    check_err("x[5x]", "parse error");
    check_err("1 +", "unexpected end of input");
    check_err("foo bar", "unexpected identifier \"bar\"");
    check_err("a\n+ !", "2:3: parse error");
    check_err("x @ Inf", "timestamp out of bounds for @ modifier");
}

static void test_deep_nesting_refused(void **s)
{
    (void)s;
    size_t n = 5000;
    char *q = malloc(2 * n + 2);
    for (size_t i = 0; i < n; i++)
        q[i] = '(';
    q[n] = '1';
    for (size_t i = 0; i < n; i++)
        q[n + 1 + i] = ')';
    q[2 * n + 1] = 0;
    check_err(q, "nested too deeply");
    free(q);
    /* but reasonable nesting is fine */
    check_fmt("((((((((((1))))))))))", "((((((((((1))))))))))");
}

static void test_pretty(void **s)
{
    (void)s;
    char err[256];
    const char *q = "sum by (job) "
                    "(rate(http_requests_total{job=\"api-server\",handler=\"/api/v1/query\",code=~\"5..|429\"}[5m])) / "
                    "sum by (job) (rate(http_requests_total{job=\"api-server\"}[5m]))";
    promql_ast_t *a = promql_parse(q, err, sizeof(err));
    assert_non_null(a);
    buf_t b = BUF_INIT;
    promql_format_pretty(a->root, &b);
    const char *want =
        "  sum by (job) (\n"
        "    rate(http_requests_total{code=~\"5..|429\",handler=\"/api/v1/query\",job=\"api-server\"}[5m])\n"
        "  )\n"
        "/\n"
        "  sum by (job) (rate(http_requests_total{job=\"api-server\"}[5m]))";
    if (strcmp(b.data, want) != 0)
        fprintf(stderr, "pretty got:\n%s\n", b.data);
    assert_string_equal(b.data, want);
    buf_free(&b);
    promql_ast_free(a);
    /* short expressions stay on one line */
    a = promql_parse("sum(rate(x[5m]))", err, sizeof(err));
    buf_init(&b);
    promql_format_pretty(a->root, &b);
    assert_string_equal(b.data, "sum(rate(x[5m]))");
    buf_free(&b);
    promql_ast_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_literals),      cmocka_unit_test(test_format_selectors),
        cmocka_unit_test(test_format_operators),     cmocka_unit_test(test_format_aggregations_calls),
        cmocka_unit_test(test_precedence_shape),     cmocka_unit_test(test_errors),
        cmocka_unit_test(test_deep_nesting_refused), cmocka_unit_test(test_pretty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
