/*
 * fuzz_promql_parse — internal/promql's parser (every /api/v1/query, query_range, series match[]
 * and rule expression). A query that parses is rendered with String() and Pretty(); the String()
 * form must parse again and render identically (Prometheus' guarantee that the canonical form
 * round-trips). The same input is also parsed as a bare selector (match[] parameters).
 */
#include "internal/promql/ast.h"
#include "internal/promql/selector.h"
#include "internal/util/buf.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 16384)
        return 0; /* depth and length are bounded by the HTTP layer long before this */
    char *q = fuzz_strndup(data, size);
    char err[512];
    promql_ast_t *ast = promql_parse(q, err, sizeof(err));
    if (ast) {
        buf_t s1, pretty;
        buf_init(&s1);
        buf_init(&pretty);
        promql_format_expr(ast->root, &s1);
        promql_format_pretty(ast->root, &pretty);
        buf_putc(&s1, 0);
        promql_ast_t *again = promql_parse(s1.data, err, sizeof(err));
        if (!again)
            fprintf(stderr, "String() of a parsed query does not parse:\n  %s\n  %s\n", s1.data, err);
        FUZZ_CHECK(again != NULL);
        buf_t s2;
        buf_init(&s2);
        promql_format_expr(again->root, &s2);
        buf_putc(&s2, 0);
        if (strcmp(s1.data, s2.data) != 0)
            fprintf(stderr, "String() is not stable:\n  %s\n  %s\n", s1.data, s2.data);
        FUZZ_CHECK(strcmp(s1.data, s2.data) == 0);
        buf_free(&s2);
        promql_ast_free(again);
        buf_free(&s1);
        buf_free(&pretty);
        promql_ast_free(ast);
    } else {
        FUZZ_CHECK(err[0] != 0);
    }
    promql_selector_t sel;
    if (promql_parse_selector(q, &sel, err, sizeof(err)) == 0) {
        (void)promql_selector_all_empty(&sel);
        promql_selector_free(&sel);
    }
    free(q);
    return 0;
}
