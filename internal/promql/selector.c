/*
 * selector — parser.ParseMetricSelector for the HTTP API; see selector.h.
 *
 * How it works: the query is tokenised once; the tokens say where the selector ends (after the
 * metric name, or after the first '}'). That prefix goes through the full PromQL parser, so
 * errors inside the braces carry exactly the parser's wording and positions. The one check the
 * expression parser makes that a selector must not (at least one matcher not matching "") is
 * recognised by its error and the matchers are then built from the tokens directly — the parser
 * has already proven their syntax. A token left after the selector is reported as unexpected.
 */
#include "internal/promql/selector.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/labels/labels.h"
#include "internal/promql/lexer.h"

static void sel_pos(const char *q, int pos, char *out, size_t outlen)
{
    int line = 1, last_nl = -1;
    for (int i = 0; i < pos && q[i]; i++)
        if (q[i] == '\n') {
            last_nl = i;
            line++;
        }
    snprintf(out, outlen, "%d:%d:", line, pos - last_nl);
}

static void sel_unexpected(const char *q, const promql_tok_t *t, char *err, size_t errlen)
{
    char where[32], d[160];
    sel_pos(q, t->pos, where, sizeof(where));
    promql__tok_desc(q, t, d, sizeof(d));
    snprintf(err, errlen, "%s parse error: unexpected %s", where, d);
}

static matcher_type_t sel_op(promql_tok_kind_t k, promql_op_t op)
{
    if (k == TK_EQL_REGEX)
        return MATCHER_RE;
    if (k == TK_NEQ_REGEX)
        return MATCHER_NRE;
    if (k == TK_OP && op == PROMQL_OP_NEQ)
        return MATCHER_NEQ;
    return MATCHER_EQ;
}

/* Builds the matchers of an already syntax-checked selector from its tokens [0, end). */
static int sel_build(arena_t *a, const char *q, const promql_tok_t *t, size_t end, promql_selector_t *out, char *err,
                     size_t errlen)
{
    size_t cap = end + 1, n = 0;
    matcher_t **ms = calloc(cap, sizeof(*ms));
    if (!ms) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t i = 0;
    if (t[0].kind == TK_IDENT || t[0].kind == TK_METRIC_IDENT) {
        char *name = arena_strndup(a, q + t[0].pos, (size_t)t[0].len);
        ms[n++] = matcher_new(MATCHER_EQ, LABEL_METRIC_NAME, name, err, errlen);
        i = 1;
    }
    if (i < end && t[i].kind == TK_LBRACE)
        i++;
    while (i + 2 < end && t[i].kind != TK_RBRACE) {
        char *lname = arena_strndup(a, q + t[i].pos, (size_t)t[i].len);
        char *val = promql__unquote(a, q + t[i + 2].pos, (size_t)t[i + 2].len, err, errlen);
        matcher_t *m = val ? matcher_new(sel_op(t[i + 1].kind, t[i + 1].op), lname, val, err, errlen) : NULL;
        if (!m)
            goto fail;
        ms[n++] = m;
        i += 3;
        if (i < end && t[i].kind == TK_COMMA)
            i++;
    }
    for (size_t k = 0; k < n; k++)
        if (!ms[k])
            goto fail;
    out->ms = ms;
    out->n = n;
    out->ast_ = NULL;
    out->own_ = true;
    return 0;
fail:
    for (size_t k = 0; k < n; k++)
        matcher_free(ms[k]);
    free(ms);
    return -1;
}

int promql_parse_selector(const char *s, promql_selector_t *out, char *err, size_t errlen)
{
    arena_t *a = arena_create(0);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1, errpos = 0;
    promql_tok_t *t;
    size_t nt;
    char lerr[256];
    if (promql__lex(a, s, &t, &nt, &errpos, lerr, sizeof(lerr)) != 0 || t[0].kind == TK_EOF) {
        promql_ast_t *ast = promql_parse(s, err, errlen); /* reports the lexer's error its way */
        promql_ast_free(ast);
        goto out;
    }
    size_t end = 0;
    if (t[0].kind == TK_IDENT || t[0].kind == TK_METRIC_IDENT)
        end = 1;
    if (t[end].kind == TK_LBRACE) {
        while (t[end].kind != TK_RBRACE && t[end].kind != TK_EOF)
            end++;
        if (t[end].kind == TK_EOF) { /* unclosed: the parser says how */
            promql_ast_t *ast = promql_parse(s, err, errlen);
            promql_ast_free(ast);
            if (ast)
                sel_unexpected(s, &t[end], err, errlen);
            goto out;
        }
        end++;
    }
    if (end == 0) {
        sel_unexpected(s, &t[0], err, errlen);
        goto out;
    }
    /* Parse the selector text alone: inside-brace errors keep their positions. */
    char *prefix = arena_strndup(a, s, (size_t)(end < nt && t[end].kind != TK_EOF ? t[end].pos : (int)strlen(s)));
    promql_ast_t *ast = promql_parse(prefix, err, errlen);
    if (!ast) {
        if (strstr(err, "at least one non-empty matcher") && sel_build(a, s, t, end, out, err, errlen) == 0)
            goto check_rest;
        goto out;
    }
    if (ast->root->kind != PROMQL_NODE_VECTOR_SEL) { /* cannot happen given the token shape */
        promql_ast_free(ast);
        sel_unexpected(s, &t[0], err, errlen);
        goto out;
    }
    out->ms = ast->root->u.sel.matchers;
    out->n = ast->root->u.sel.nmatchers;
    out->ast_ = ast;
    out->own_ = false;
check_rest:
    if (t[end].kind != TK_EOF) {
        sel_unexpected(s, &t[end], err, errlen);
        promql_selector_free(out);
        goto out;
    }
    rc = 0;
out:
    arena_destroy(a);
    return rc;
}

void promql_selector_free(promql_selector_t *sel)
{
    if (!sel)
        return;
    if (sel->own_) {
        for (size_t i = 0; i < sel->n; i++)
            matcher_free(sel->ms[i]);
        free(sel->ms);
    }
    promql_ast_free(sel->ast_);
    memset(sel, 0, sizeof(*sel));
}

bool promql_selector_all_empty(const promql_selector_t *sel)
{
    for (size_t i = 0; i < sel->n; i++)
        if (!matcher_matches_empty(sel->ms[i]))
            return false;
    return true;
}
