/*
 * parser — PromQL text to promql_ast_t (see ast.h for the grammar, precedence and ownership).
 *
 * A precedence-climbing parser over the token array from lexer.c. Checks Prometheus' parser
 * performs in checkAST (operand types, bool only on comparisons, set operators many-to-many,
 * function arity and argument types, selector rules) are done as each node is built, with the
 * same messages. Errors unwind with longjmp to promql_parse, which frees the partial AST.
 * Nesting deeper than PARSE_MAX_DEPTH is refused, so hostile input cannot exhaust the stack.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/labels/labels.h"
#include "internal/promql/ast.h"
#include "internal/promql/engine_int.h"
#include "internal/promql/lexer.h"
#include "internal/util/parse.h"

#define PARSE_MAX_DEPTH 256

typedef struct {
    promql_ast_t *ast;
    arena_t *a;
    const char *q;
    promql_tok_t *t;
    size_t n, i;
    int depth;
    jmp_buf jb;
    char *err;
    size_t errlen;
} ps_t;

/* ---- errors --------------------------------------------------------------------------------- */

static void format_pos(const char *q, int pos, char *out, size_t outlen)
{
    int line = 1, last_nl = -1;
    int len = (int)strlen(q);
    if (pos < 0 || pos > len) {
        snprintf(out, outlen, "invalid position:");
        return;
    }
    for (int i = 0; i < pos; i++) {
        if (q[i] == '\n') {
            last_nl = i;
            line++;
        }
    }
    snprintf(out, outlen, "%d:%d:", line, pos - last_nl);
}

static _Noreturn __attribute__((format(printf, 3, 4))) void perr(ps_t *p, int pos, const char *fmt, ...)
{
    char msg[400], where[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    format_pos(p->q, pos, where, sizeof(where));
    snprintf(p->err, p->errlen, "%s parse error: %s", where, msg);
    longjmp(p->jb, 1);
}

static const promql_tok_t *peek(const ps_t *p)
{
    return &p->t[p->i];
}
static const promql_tok_t *peek2(const ps_t *p)
{
    return p->i + 1 < p->n ? &p->t[p->i + 1] : &p->t[p->n - 1];
}
static const promql_tok_t *next(ps_t *p)
{
    const promql_tok_t *t = &p->t[p->i];
    if (t->kind != TK_EOF)
        p->i++;
    return t;
}

static _Noreturn void unexpected(ps_t *p, const promql_tok_t *t, const char *ctx)
{
    char d[128];
    if (t->kind == TK_RPAREN && !ctx)
        perr(p, t->pos, "unexpected right parenthesis ')'");
    /* Prometheus' lexer reports running out of input inside {...} itself, before the parser */
    if (t->kind == TK_EOF && ctx && strncmp(ctx, "in label matching", 17) == 0)
        perr(p, t->pos, "unexpected end of input inside braces");
    promql__tok_desc(p->q, t, d, sizeof(d));
    if (ctx)
        perr(p, t->pos, "unexpected %s %s", d, ctx);
    perr(p, t->pos, "unexpected %s", d);
}

static const promql_tok_t *expect(ps_t *p, promql_tok_kind_t k, const char *ctx)
{
    const promql_tok_t *t = peek(p);
    if (t->kind != k)
        unexpected(p, t, ctx);
    return next(p);
}

static char *tok_str(ps_t *p, const promql_tok_t *t)
{
    return arena_strndup(p->a, p->q + t->pos, (size_t)t->len);
}

static promql_expr_t *new_node(ps_t *p, promql_node_kind_t k, int pos)
{
    promql_expr_t *e = arena_calloc(p->a, 1, sizeof(*e));
    e->kind = k;
    e->pos = pos;
    return e;
}

/* ---- small grammars ------------------------------------------------------------------------- */

static double parse_number_text(const char *s)
{
    /* Go's ParseInt(s, 0, 64) first (hex, octal), then ParseFloat. */
    char *end;
    errno = 0;
    long long ll = strtoll(s, &end, 0);
    if (*end == 0 && errno == 0 && end != s)
        return (double)ll;
    if (strncasecmp(s, "0x", 2) == 0) {
        errno = 0;
        unsigned long long ull = strtoull(s, &end, 16);
        if (*end == 0)
            return (double)ull;
    }
    return strtod(s, NULL);
}

static int64_t parse_dur(ps_t *p, const promql_tok_t *t)
{
    char *s = tok_str(p, t);
    int64_t ms;
    if (parse_duration_ms(s, &ms) != 0)
        perr(p, t->pos, "not a valid duration string: \"%s\"", s);
    return ms;
}

static void push_matcher(ps_t *p, matcher_t *m)
{
    promql_ast_t *ast = p->ast;
    if (ast->nmatchers == ast->capmatchers) {
        size_t nc = ast->capmatchers ? ast->capmatchers * 2 : 8;
        matcher_t **nm = realloc(ast->matchers, nc * sizeof(*nm));
        if (!nm)
            abort();
        ast->matchers = nm;
        ast->capmatchers = nc;
    }
    ast->matchers[ast->nmatchers++] = m;
}

/* ( label, label, ... ) with optional trailing comma; label names may be keywords. */
static promql_strlist_t parse_label_list(ps_t *p)
{
    promql_strlist_t l = {NULL, 0};
    size_t cap = 0;
    expect(p, TK_LPAREN, "in grouping opts, expected \"(\"");
    for (;;) {
        const promql_tok_t *t = peek(p);
        if (t->kind == TK_RPAREN)
            break;
        bool ok = t->kind == TK_IDENT || t->kind == TK_AGG || t->kind == TK_OFFSET || t->kind == TK_BY ||
                  t->kind == TK_WITHOUT || t->kind == TK_ON || t->kind == TK_IGNORING || t->kind == TK_GROUP_LEFT ||
                  t->kind == TK_GROUP_RIGHT || t->kind == TK_BOOL || t->kind == TK_START || t->kind == TK_END ||
                  (t->kind == TK_OP && (t->op == PROMQL_OP_AND || t->op == PROMQL_OP_OR || t->op == PROMQL_OP_UNLESS ||
                                        t->op == PROMQL_OP_ATAN2)) ||
                  (t->kind == TK_NUMBER && labels_valid_name(p->q + t->pos, (size_t)t->len));
        if (!ok)
            unexpected(p, t, "in grouping opts, expected label");
        next(p);
        if (l.n == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nn = arena_alloc(p->a, cap * sizeof(*nn));
            if (l.n)
                memcpy(nn, l.names, l.n * sizeof(*nn));
            l.names = nn;
        }
        l.names[l.n++] = tok_str(p, t);
        t = peek(p);
        if (t->kind == TK_COMMA) {
            next(p);
            continue;
        }
        if (t->kind != TK_RPAREN)
            unexpected(p, t, "in grouping opts, expected \",\" or \")\"");
    }
    next(p);
    return l;
}

/* ---- selectors ------------------------------------------------------------------------------ */

static promql_expr_t *parse_selector(ps_t *p, const promql_tok_t *name_tok, int pos)
{
    promql_expr_t *e = new_node(p, PROMQL_NODE_VECTOR_SEL, pos);
    e->type = PROMQL_VT_VECTOR;
    size_t cap = 4, n = 0;
    matcher_t **ms = arena_alloc(p->a, cap * sizeof(*ms));
    const char *name = name_tok ? tok_str(p, name_tok) : NULL;
    e->u.sel.name = name;
    if (peek(p)->kind == TK_LBRACE) {
        next(p);
        for (;;) {
            const promql_tok_t *t = peek(p);
            if (t->kind == TK_RBRACE)
                break;
            if (t->kind != TK_IDENT)
                unexpected(p, t, "in label matching, expected label");
            next(p);
            const promql_tok_t *op = next(p);
            matcher_type_t mt;
            if (op->kind == TK_EQL)
                mt = MATCHER_EQ;
            else if (op->kind == TK_OP && op->op == PROMQL_OP_NEQ)
                mt = MATCHER_NEQ;
            else if (op->kind == TK_EQL_REGEX)
                mt = MATCHER_RE;
            else if (op->kind == TK_NEQ_REGEX)
                mt = MATCHER_NRE;
            else
                unexpected(p, op, "in label matching, expected label matching operator");
            const promql_tok_t *vt = next(p);
            if (vt->kind != TK_STRING)
                unexpected(p, vt, "in label matching, expected string");
            char uerr[128];
            char *val = promql__unquote(p->a, p->q + vt->pos, (size_t)vt->len, uerr, sizeof(uerr));
            if (!val)
                perr(p, vt->pos, "%s", uerr);
            char *lname = tok_str(p, t);
            char merr[256];
            matcher_t *m = matcher_new(mt, lname, val, merr, sizeof(merr));
            if (!m) /* Prometheus reports the matcher's range: it starts at the label */
                perr(p, t->pos, "%s", merr);
            push_matcher(p, m);
            if (n == cap) {
                matcher_t **nm = arena_alloc(p->a, cap * 2 * sizeof(*nm));
                memcpy(nm, ms, n * sizeof(*nm));
                ms = nm;
                cap *= 2;
            }
            ms[n++] = m;
            if (name && strcmp(lname, LABEL_METRIC_NAME) == 0)
                perr(p, pos, "metric name must not be set twice: \"%s\" or \"%s\"", name, val);
            t = peek(p);
            if (t->kind == TK_COMMA) {
                next(p);
                continue;
            }
            if (t->kind != TK_RBRACE)
                unexpected(p, t, "in label matching, expected \",\" or \"}\"");
        }
        next(p);
    }
    if (name) {
        char merr[256];
        matcher_t *m = matcher_new(MATCHER_EQ, LABEL_METRIC_NAME, name, merr, sizeof(merr));
        if (!m)
            perr(p, pos, "%s", merr);
        push_matcher(p, m);
        if (n == cap) {
            matcher_t **nm = arena_alloc(p->a, (cap + 1) * sizeof(*nm));
            memcpy(nm, ms, n * sizeof(*nm));
            ms = nm;
        }
        ms[n++] = m;
    }
    bool nonempty = false;
    for (size_t k = 0; k < n; k++)
        if (!matcher_matches_empty(ms[k]))
            nonempty = true;
    if (!nonempty)
        perr(p, pos, "vector selector must contain at least one non-empty matcher");
    e->u.sel.matchers = ms;
    e->u.sel.nmatchers = n;
    e->u.sel.id = p->ast->nselectors++;
    return e;
}

/* ---- expressions ---------------------------------------------------------------------------- */

static promql_expr_t *parse_expr(ps_t *p, int min_prec);

static int op_prec(promql_op_t op)
{
    switch (op) {
    case PROMQL_OP_OR: return 1;
    case PROMQL_OP_AND:
    case PROMQL_OP_UNLESS: return 2;
    case PROMQL_OP_EQLC:
    case PROMQL_OP_NEQ:
    case PROMQL_OP_GTR:
    case PROMQL_OP_LSS:
    case PROMQL_OP_GTE:
    case PROMQL_OP_LTE: return 3;
    case PROMQL_OP_ADD:
    case PROMQL_OP_SUB: return 4;
    case PROMQL_OP_MUL:
    case PROMQL_OP_DIV:
    case PROMQL_OP_MOD:
    case PROMQL_OP_ATAN2: return 5;
    case PROMQL_OP_POW: return 6;
    default: return 0;
    }
}
#define PREC_MUL 5
#define PREC_POW 6

static void expect_type(ps_t *p, const promql_expr_t *e, promql_vtype_t want, const char *ctx)
{
    if (e->type != want)
        perr(p, e->pos, "expected type %s in %s, got %s", promql_vtype_name(want), ctx, promql_vtype_name(e->type));
}

static promql_expr_t *parse_call(ps_t *p, const promql_tok_t *name)
{
    const promql_func_t *f = promql__func_lookup(p->q + name->pos, (size_t)name->len);
    if (!f)
        perr(p, name->pos, "unknown function with name \"%.*s\"", name->len, p->q + name->pos);
    promql_expr_t *e = new_node(p, PROMQL_NODE_CALL, name->pos);
    e->u.call.func = f;
    e->type = f->ret;
    expect(p, TK_LPAREN, NULL);
    size_t cap = 4, n = 0;
    promql_expr_t **args = arena_alloc(p->a, cap * sizeof(*args));
    while (peek(p)->kind != TK_RPAREN) {
        promql_expr_t *a = parse_expr(p, 0);
        if (n == cap) {
            promql_expr_t **na = arena_alloc(p->a, cap * 2 * sizeof(*na));
            memcpy(na, args, n * sizeof(*na));
            args = na;
            cap *= 2;
        }
        args[n++] = a;
        const promql_tok_t *t = peek(p);
        if (t->kind == TK_COMMA) {
            next(p);
            continue;
        }
        if (t->kind != TK_RPAREN)
            unexpected(p, t, "in call to function, expected \",\" or \")\"");
    }
    next(p);
    e->u.call.args = args;
    e->u.call.nargs = n;
    int na = f->nargs;
    if (f->variadic == 0) {
        if ((size_t)na != n)
            perr(p, e->pos, "expected %d argument(s) in call to \"%s\", got %zu", na, f->name, n);
    } else {
        if ((size_t)(na - 1) > n)
            perr(p, e->pos, "expected at least %d argument(s) in call to \"%s\", got %zu", na - 1, f->name, n);
        if (f->variadic > 0 && (size_t)(na - 1 + f->variadic) < n)
            perr(p, e->pos, "expected at most %d argument(s) in call to \"%s\", got %zu", na - 1 + f->variadic, f->name,
                 n);
    }
    char ctx[96];
    snprintf(ctx, sizeof(ctx), "call to function \"%s\"", f->name);
    for (size_t k = 0; k < n; k++) {
        int ti = (int)k < na ? (int)k : na - 1;
        expect_type(p, args[k], f->args[ti], ctx);
    }
    return e;
}

static promql_expr_t *parse_agg(ps_t *p)
{
    const promql_tok_t *opt = next(p);
    promql_expr_t *e = new_node(p, PROMQL_NODE_AGG, opt->pos);
    e->type = PROMQL_VT_VECTOR;
    e->u.agg.op = opt->op;
    bool grouped = false;
    if (peek(p)->kind == TK_BY || peek(p)->kind == TK_WITHOUT) {
        e->u.agg.without = next(p)->kind == TK_WITHOUT;
        e->u.agg.grouping = parse_label_list(p);
        grouped = true;
    }
    expect(p, TK_LPAREN, NULL);
    promql_expr_t *args[2];
    size_t n = 0;
    while (peek(p)->kind != TK_RPAREN) {
        promql_expr_t *a = parse_expr(p, 0);
        if (n < 2)
            args[n] = a;
        n++;
        const promql_tok_t *t = peek(p);
        if (t->kind == TK_COMMA) {
            next(p);
            continue;
        }
        if (t->kind != TK_RPAREN)
            unexpected(p, t, "in aggregation, expected \",\" or \")\"");
    }
    next(p);
    if (!grouped && (peek(p)->kind == TK_BY || peek(p)->kind == TK_WITHOUT)) {
        e->u.agg.without = next(p)->kind == TK_WITHOUT;
        e->u.agg.grouping = parse_label_list(p);
    }
    promql_op_t op = opt->op;
    bool has_param =
        op == PROMQL_AGG_TOPK || op == PROMQL_AGG_BOTTOMK || op == PROMQL_AGG_QUANTILE || op == PROMQL_AGG_COUNT_VALUES;
    size_t want = has_param ? 2 : 1;
    if (n != want)
        perr(p, e->pos, "wrong number of arguments for aggregate expression provided, expected %zu, got %zu", want, n);
    if (has_param) {
        e->u.agg.param = args[0];
        e->u.agg.expr = args[1];
    } else {
        e->u.agg.expr = args[0];
    }
    expect_type(p, e->u.agg.expr, PROMQL_VT_VECTOR, "aggregation expression");
    if (op == PROMQL_AGG_COUNT_VALUES)
        expect_type(p, e->u.agg.param, PROMQL_VT_STRING, "aggregation parameter");
    else if (has_param)
        expect_type(p, e->u.agg.param, PROMQL_VT_SCALAR, "aggregation parameter");
    return e;
}

static bool tok_is_metric_ident_keyword(const promql_tok_t *t)
{
    switch (t->kind) {
    case TK_AGG:
    case TK_BY:
    case TK_WITHOUT:
    case TK_OFFSET:
    case TK_START:
    case TK_END: return true;
    case TK_OP: return t->op == PROMQL_OP_AND || t->op == PROMQL_OP_OR || t->op == PROMQL_OP_UNLESS;
    default: return false;
    }
}

static promql_expr_t *parse_primary(ps_t *p)
{
    const promql_tok_t *t = peek(p);
    switch (t->kind) {
    case TK_NUMBER: {
        next(p);
        promql_expr_t *e = new_node(p, PROMQL_NODE_NUMBER, t->pos);
        e->type = PROMQL_VT_SCALAR;
        e->u.number = parse_number_text(tok_str(p, t));
        return e;
    }
    case TK_STRING: {
        next(p);
        promql_expr_t *e = new_node(p, PROMQL_NODE_STRING, t->pos);
        e->type = PROMQL_VT_STRING;
        char uerr[128];
        e->u.string = promql__unquote(p->a, p->q + t->pos, (size_t)t->len, uerr, sizeof(uerr));
        if (!e->u.string)
            perr(p, t->pos, "%s", uerr);
        return e;
    }
    case TK_LPAREN: {
        next(p);
        promql_expr_t *e = new_node(p, PROMQL_NODE_PAREN, t->pos);
        e->u.paren.expr = parse_expr(p, 0);
        e->type = e->u.paren.expr->type;
        const promql_tok_t *r = peek(p);
        if (r->kind != TK_RPAREN) {
            if (r->kind == TK_EOF)
                perr(p, r->pos, "unclosed left parenthesis");
            unexpected(p, r, "in paren expression, expected \")\"");
        }
        next(p);
        return e;
    }
    case TK_LBRACE: return parse_selector(p, NULL, t->pos);
    case TK_IDENT:
        if (peek2(p)->kind == TK_LPAREN) {
            next(p);
            return parse_call(p, t);
        }
        next(p);
        return parse_selector(p, t, t->pos);
    case TK_METRIC_IDENT: next(p); return parse_selector(p, t, t->pos);
    case TK_AGG:
        if (peek2(p)->kind == TK_LPAREN || peek2(p)->kind == TK_BY || peek2(p)->kind == TK_WITHOUT)
            return parse_agg(p);
        next(p);
        return parse_selector(p, t, t->pos);
    case TK_EOF: perr(p, t->pos, "unexpected end of input");
    default:
        if (tok_is_metric_ident_keyword(t)) {
            next(p);
            return parse_selector(p, t, t->pos);
        }
        unexpected(p, t, NULL);
    }
}

static void set_at(ps_t *p, promql_expr_t *e, const promql_tok_t *at)
{
    promql_at_t *kind;
    int64_t *ms;
    if (e->kind == PROMQL_NODE_VECTOR_SEL || e->kind == PROMQL_NODE_MATRIX_SEL) {
        kind = &e->u.sel.at;
        ms = &e->u.sel.at_ms;
    } else if (e->kind == PROMQL_NODE_SUBQUERY) {
        kind = &e->u.subq.at;
        ms = &e->u.subq.at_ms;
    } else {
        perr(p, at->pos,
             "@ modifier must be preceded by an instant vector selector or range vector selector or a subquery");
    }
    if (*kind != PROMQL_AT_NONE)
        perr(p, at->pos, "@ <timestamp> may not be set multiple times");
    const promql_tok_t *t = peek(p);
    if (t->kind == TK_START || t->kind == TK_END) {
        next(p);
        expect(p, TK_LPAREN, NULL);
        expect(p, TK_RPAREN, NULL);
        *kind = t->kind == TK_START ? PROMQL_AT_START : PROMQL_AT_END;
        return;
    }
    double sign = 1;
    if (t->kind == TK_OP && (t->op == PROMQL_OP_SUB || t->op == PROMQL_OP_ADD)) {
        sign = t->op == PROMQL_OP_SUB ? -1 : 1;
        next(p);
        t = peek(p);
    }
    if (t->kind != TK_NUMBER)
        unexpected(p, t, "in @, expected timestamp");
    next(p);
    double v = sign * parse_number_text(tok_str(p, t));
    if (isinf(v) || isnan(v) || v >= 9.2233720368547758e18 / 1000 || v <= -9.2233720368547758e18 / 1000)
        perr(p, at->pos, "timestamp out of bounds for @ modifier: %f", v);
    *kind = PROMQL_AT_TS;
    *ms = (int64_t)llround(v * 1000.0);
}

static promql_expr_t *parse_postfix(ps_t *p, promql_expr_t *e)
{
    for (;;) {
        const promql_tok_t *t = peek(p);
        if (t->kind == TK_LBRACKET) {
            next(p);
            const promql_tok_t *d = peek(p);
            if (d->kind != TK_DURATION && !(d->kind == TK_NUMBER))
                unexpected(p, d, "in subquery or range selector, expected duration");
            next(p);
            int64_t range = parse_dur(p, d);
            const promql_tok_t *c = next(p);
            if (c->kind == TK_COLON) {
                int64_t step = 0;
                if (peek(p)->kind == TK_DURATION || peek(p)->kind == TK_NUMBER)
                    step = parse_dur(p, next(p));
                expect(p, TK_RBRACKET, "in subquery, expected \"]\"");
                if (e->type != PROMQL_VT_VECTOR)
                    perr(p, e->pos, "subquery is only allowed on instant vector, got %s instead",
                         promql_vtype_name(e->type));
                promql_expr_t *s = new_node(p, PROMQL_NODE_SUBQUERY, e->pos);
                s->type = PROMQL_VT_MATRIX;
                s->u.subq.expr = e;
                s->u.subq.range_ms = range;
                s->u.subq.step_ms = step;
                e = s;
            } else if (c->kind == TK_RBRACKET) {
                if (e->kind != PROMQL_NODE_VECTOR_SEL)
                    perr(p, e->pos, "ranges only allowed for vector selectors");
                if (e->u.sel.offset_ms != 0)
                    perr(p, t->pos, "no offset modifiers allowed before range");
                if (e->u.sel.at != PROMQL_AT_NONE)
                    perr(p, t->pos, "no @ modifiers allowed before range");
                e->kind = PROMQL_NODE_MATRIX_SEL;
                e->type = PROMQL_VT_MATRIX;
                e->u.sel.range_ms = range;
            } else {
                unexpected(p, c, "in subquery or range selector, expected \":\" or \"]\"");
            }
        } else if (t->kind == TK_OFFSET) {
            next(p);
            int64_t *off;
            if (e->kind == PROMQL_NODE_VECTOR_SEL || e->kind == PROMQL_NODE_MATRIX_SEL)
                off = &e->u.sel.offset_ms;
            else if (e->kind == PROMQL_NODE_SUBQUERY)
                off = &e->u.subq.offset_ms;
            else
                perr(p, t->pos,
                     "offset modifier must be preceded by an instant vector selector or range vector selector or a "
                     "subquery");
            if (*off != 0)
                perr(p, t->pos, "offset may not be set multiple times");
            int64_t sign = 1;
            if (peek(p)->kind == TK_OP && peek(p)->op == PROMQL_OP_SUB) {
                next(p);
                sign = -1;
            }
            const promql_tok_t *d = next(p);
            if (d->kind != TK_DURATION && d->kind != TK_NUMBER)
                unexpected(p, d, "in offset, expected duration");
            *off = sign * parse_dur(p, d);
        } else if (t->kind == TK_AT) {
            next(p);
            set_at(p, e, t);
        } else {
            return e;
        }
    }
}

static promql_expr_t *parse_unary(ps_t *p)
{
    if (++p->depth > PARSE_MAX_DEPTH)
        perr(p, peek(p)->pos, "expression nested too deeply (more than %d levels)", PARSE_MAX_DEPTH);
    const promql_tok_t *t = peek(p);
    promql_expr_t *e;
    if (t->kind == TK_OP && (t->op == PROMQL_OP_ADD || t->op == PROMQL_OP_SUB)) {
        next(p);
        promql_expr_t *x = parse_expr(p, PREC_POW);
        if (x->kind == PROMQL_NODE_NUMBER) {
            if (t->op == PROMQL_OP_SUB)
                x->u.number = -x->u.number;
            x->pos = t->pos;
            e = x;
        } else {
            if (x->type != PROMQL_VT_SCALAR && x->type != PROMQL_VT_VECTOR)
                perr(p, x->pos,
                     "unary expression only allowed on expressions of type scalar or instant vector, got \"%s\"",
                     promql_vtype_name(x->type));
            e = new_node(p, PROMQL_NODE_UNARY, t->pos);
            e->u.unary.op = t->op;
            e->u.unary.expr = x;
            e->type = x->type;
        }
    } else {
        e = parse_postfix(p, parse_primary(p));
    }
    p->depth--;
    return e;
}

static promql_expr_t *parse_expr(ps_t *p, int min_prec)
{
    promql_expr_t *lhs = parse_unary(p);
    for (;;) {
        const promql_tok_t *t = peek(p);
        if (t->kind != TK_OP)
            return lhs;
        int prec = op_prec(t->op);
        if (prec < min_prec)
            return lhs;
        next(p);
        promql_expr_t *e = new_node(p, PROMQL_NODE_BINARY, lhs->pos);
        e->u.bin.op = t->op;
        if (peek(p)->kind == TK_BOOL) {
            next(p);
            e->u.bin.return_bool = true;
        }
        if (peek(p)->kind == TK_ON || peek(p)->kind == TK_IGNORING) {
            e->u.bin.on = next(p)->kind == TK_ON;
            e->u.bin.matching_given = true;
            e->u.bin.labels = parse_label_list(p);
            if (peek(p)->kind == TK_GROUP_LEFT || peek(p)->kind == TK_GROUP_RIGHT) {
                e->u.bin.card = next(p)->kind == TK_GROUP_LEFT ? PROMQL_CARD_MANY_TO_ONE : PROMQL_CARD_ONE_TO_MANY;
                if (peek(p)->kind == TK_LPAREN)
                    e->u.bin.include = parse_label_list(p);
            }
        }
        promql_expr_t *rhs = parse_expr(p, t->op == PROMQL_OP_POW ? prec : prec + 1);
        e->u.bin.lhs = lhs;
        e->u.bin.rhs = rhs;
        promql_op_t op = t->op;
        promql_vtype_t lt = lhs->type, rt = rhs->type;
        if (e->u.bin.return_bool && !promql_op_is_comparison(op))
            perr(p, t->pos, "bool modifier can only be used on comparison operators");
        if (promql_op_is_comparison(op) && !e->u.bin.return_bool && lt == PROMQL_VT_SCALAR && rt == PROMQL_VT_SCALAR)
            perr(p, t->pos, "comparisons between scalars must use BOOL modifier");
        if (promql_op_is_set(op) && e->u.bin.card == PROMQL_CARD_ONE_TO_ONE)
            e->u.bin.card = PROMQL_CARD_MANY_TO_MANY;
        if (e->u.bin.on)
            for (size_t a = 0; a < e->u.bin.labels.n; a++)
                for (size_t b = 0; b < e->u.bin.include.n; b++)
                    if (strcmp(e->u.bin.labels.names[a], e->u.bin.include.names[b]) == 0)
                        perr(p, t->pos, "label \"%s\" must not occur in ON and GROUP clause at once",
                             e->u.bin.labels.names[a]);
        if (lt != PROMQL_VT_SCALAR && lt != PROMQL_VT_VECTOR)
            perr(p, lhs->pos, "binary expression must contain only scalar and instant vector types");
        if (rt != PROMQL_VT_SCALAR && rt != PROMQL_VT_VECTOR)
            perr(p, rhs->pos, "binary expression must contain only scalar and instant vector types");
        if (lt != PROMQL_VT_VECTOR || rt != PROMQL_VT_VECTOR) {
            if (e->u.bin.labels.n > 0)
                perr(p, e->pos, "vector matching only allowed between instant vectors");
        } else if (promql_op_is_set(op)) {
            if (e->u.bin.card == PROMQL_CARD_ONE_TO_MANY || e->u.bin.card == PROMQL_CARD_MANY_TO_ONE)
                perr(p, e->pos, "no grouping allowed for \"%s\" operation", promql_op_name(op));
        }
        if ((lt == PROMQL_VT_SCALAR || rt == PROMQL_VT_SCALAR) && promql_op_is_set(op))
            perr(p, e->pos, "set operator \"%s\" not allowed in binary scalar expression", promql_op_name(op));
        e->type = (lt == PROMQL_VT_SCALAR && rt == PROMQL_VT_SCALAR) ? PROMQL_VT_SCALAR : PROMQL_VT_VECTOR;
        lhs = e;
    }
}

/* ---- entry points --------------------------------------------------------------------------- */

/* Every consumer of the tree (evaluator, printers) recurses on it, and a left-associative chain
 * such as 1+1+...+1 grows the tree without growing the parser's recursion: measure the finished
 * tree's height with an explicit stack and refuse what the recursions could not survive. */
#define PARSE_MAX_HEIGHT 1024

static void check_height(ps_t *p, promql_expr_t *root)
{
    typedef struct {
        promql_expr_t *e;
        int h;
    } item_t;
    size_t cap = 64, n = 0;
    item_t *st = arena_alloc(p->a, cap * sizeof(*st));
    st[n++] = (item_t){root, 1};
    while (n) {
        item_t it = st[--n];
        if (it.h > PARSE_MAX_HEIGHT)
            perr(p, it.e->pos, "expression nested too deeply (more than %d levels)", PARSE_MAX_HEIGHT);
        promql_expr_t *kids[3] = {NULL, NULL, NULL};
        promql_expr_t **more = NULL;
        size_t nmore = 0;
        switch (it.e->kind) {
        case PROMQL_NODE_SUBQUERY: kids[0] = it.e->u.subq.expr; break;
        case PROMQL_NODE_PAREN: kids[0] = it.e->u.paren.expr; break;
        case PROMQL_NODE_UNARY: kids[0] = it.e->u.unary.expr; break;
        case PROMQL_NODE_BINARY: kids[0] = it.e->u.bin.lhs, kids[1] = it.e->u.bin.rhs; break;
        case PROMQL_NODE_AGG: kids[0] = it.e->u.agg.expr, kids[1] = it.e->u.agg.param; break;
        case PROMQL_NODE_CALL: more = it.e->u.call.args, nmore = it.e->u.call.nargs; break;
        default: break;
        }
        for (size_t i = 0; i < 3 + nmore; i++) {
            promql_expr_t *k = i < 3 ? kids[i] : more[i - 3];
            if (!k)
                continue;
            if (n == cap) {
                item_t *ns = arena_alloc(p->a, 2 * cap * sizeof(*st));
                memcpy(ns, st, n * sizeof(*st));
                st = ns;
                cap *= 2;
            }
            st[n++] = (item_t){k, it.h + 1};
        }
    }
}

promql_ast_t *promql_parse(const char *query, char *err, size_t errlen)
{
    promql_ast_t *volatile ast = calloc(1, sizeof(*ast)); /* read after longjmp */
    if (!ast) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ast->arena = arena_create(0);
    if (!ast->arena) {
        free(ast);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ast->query = arena_strdup(ast->arena, query);
    ps_t *p = arena_calloc(ast->arena, 1, sizeof(*p));
    p->ast = ast;
    p->a = ast->arena;
    p->q = ast->query;
    p->err = err;
    p->errlen = errlen;
    if (setjmp(p->jb)) {
        promql_ast_free(ast);
        return NULL;
    }
    int errpos = 0;
    char lerr[256];
    if (promql__lex(p->a, p->q, &p->t, &p->n, &errpos, lerr, sizeof(lerr)) != 0)
        perr(p, errpos, "%s", lerr);
    if (p->t[0].kind == TK_EOF)
        perr(p, 0, "no expression found in input");
    ast->root = parse_expr(p, 0);
    const promql_tok_t *t = peek(p);
    if (t->kind != TK_EOF)
        unexpected(p, t, NULL);
    check_height(p, ast->root);
    return ast;
}

void promql_ast_free(promql_ast_t *ast)
{
    if (!ast)
        return;
    for (size_t i = 0; i < ast->nmatchers; i++)
        matcher_free(ast->matchers[i]);
    free(ast->matchers);
    arena_destroy(ast->arena);
    free(ast);
}
