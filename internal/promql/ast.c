/*
 * ast — names of types and operators, and the two printers of ast.h:
 *
 *   promql_format_expr    Prometheus' Node.String(): one line; matchers sorted, the __name__
 *                         matcher folded into the metric name, durations as model.Duration
 *                         ("1h30m"), numbers as Go's %v, strings as Go's %q, offset and @ after
 *                         a range, aggregations as "sum by (a, b) (x)".
 *   promql_format_pretty  Node.Pretty(0): a node whose String() is over 100 characters is split
 *                         over lines with two-space indentation; shorter nodes stay on one line.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/promql/ast.h"
#include "internal/promql/engine_int.h"

const char *promql_vtype_name(promql_vtype_t t)
{
    switch (t) {
    case PROMQL_VT_SCALAR: return "scalar";
    case PROMQL_VT_VECTOR: return "instant vector";
    case PROMQL_VT_MATRIX: return "range vector";
    case PROMQL_VT_STRING: return "string";
    default: return "none";
    }
}

const char *promql_op_name(promql_op_t op)
{
    switch (op) {
    case PROMQL_OP_ADD: return "+";
    case PROMQL_OP_SUB: return "-";
    case PROMQL_OP_MUL: return "*";
    case PROMQL_OP_DIV: return "/";
    case PROMQL_OP_MOD: return "%";
    case PROMQL_OP_POW: return "^";
    case PROMQL_OP_ATAN2: return "atan2";
    case PROMQL_OP_EQLC: return "==";
    case PROMQL_OP_NEQ: return "!=";
    case PROMQL_OP_GTR: return ">";
    case PROMQL_OP_LSS: return "<";
    case PROMQL_OP_GTE: return ">=";
    case PROMQL_OP_LTE: return "<=";
    case PROMQL_OP_AND: return "and";
    case PROMQL_OP_OR: return "or";
    case PROMQL_OP_UNLESS: return "unless";
    case PROMQL_AGG_SUM: return "sum";
    case PROMQL_AGG_AVG: return "avg";
    case PROMQL_AGG_COUNT: return "count";
    case PROMQL_AGG_MIN: return "min";
    case PROMQL_AGG_MAX: return "max";
    case PROMQL_AGG_GROUP: return "group";
    case PROMQL_AGG_STDDEV: return "stddev";
    case PROMQL_AGG_STDVAR: return "stdvar";
    case PROMQL_AGG_TOPK: return "topk";
    case PROMQL_AGG_BOTTOMK: return "bottomk";
    case PROMQL_AGG_COUNT_VALUES: return "count_values";
    case PROMQL_AGG_QUANTILE: return "quantile";
    default: return "?";
    }
}

bool promql_op_is_comparison(promql_op_t op)
{
    return op == PROMQL_OP_EQLC || op == PROMQL_OP_NEQ || op == PROMQL_OP_GTR || op == PROMQL_OP_LSS ||
           op == PROMQL_OP_GTE || op == PROMQL_OP_LTE;
}

bool promql_op_is_set(promql_op_t op)
{
    return op == PROMQL_OP_AND || op == PROMQL_OP_OR || op == PROMQL_OP_UNLESS;
}

const promql_expr_t *promql_unwrap_parens(const promql_expr_t *e)
{
    while (e && e->kind == PROMQL_NODE_PAREN)
        e = e->u.paren.expr;
    return e;
}

/* ---- String() ------------------------------------------------------------------------------ */

/* Go's strconv.Quote for the ASCII range; UTF-8 bytes pass through. */
static void put_go_quoted(buf_t *b, const char *s)
{
    buf_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        switch (c) {
        case '"': buf_puts(b, "\\\""); break;
        case '\\': buf_puts(b, "\\\\"); break;
        case '\a': buf_puts(b, "\\a"); break;
        case '\b': buf_puts(b, "\\b"); break;
        case '\f': buf_puts(b, "\\f"); break;
        case '\n': buf_puts(b, "\\n"); break;
        case '\r': buf_puts(b, "\\r"); break;
        case '\t': buf_puts(b, "\\t"); break;
        case '\v': buf_puts(b, "\\v"); break;
        default:
            if (c < 0x20 || c == 0x7f)
                buf_printf(b, "\\x%02x", c);
            else
                buf_putc(b, (char)c);
        }
    }
    buf_putc(b, '"');
}

/* model.Duration.String(): years and weeks only when they divide the rest exactly ("90d", not
 * "12w6d"). */
static void put_duration(buf_t *b, int64_t ms)
{
    static const struct {
        const char *unit;
        int64_t ms;
        bool exact;
    } units[] = {
        {"y", 365LL * 86400000, true}, {"w", 7LL * 86400000, true}, {"d", 86400000, false}, {"h", 3600000, false},
        {"m", 60000, false},           {"s", 1000, false},          {"ms", 1, false}};
    if (ms == 0) {
        buf_puts(b, "0s");
        return;
    }
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (units[i].exact && ms % units[i].ms != 0)
            continue;
        int64_t v = ms / units[i].ms;
        if (v > 0) {
            buf_printf(b, "%lld%s", (long long)v, units[i].unit);
            ms -= v * units[i].ms;
        }
    }
}

static void put_at_offset(buf_t *b, promql_at_t at, int64_t at_ms, int64_t offset_ms)
{
    if (at == PROMQL_AT_TS)
        buf_printf(b, " @ %.3f", (double)at_ms / 1000.0);
    else if (at == PROMQL_AT_START)
        buf_puts(b, " @ start()");
    else if (at == PROMQL_AT_END)
        buf_puts(b, " @ end()");
    if (offset_ms > 0) {
        buf_puts(b, " offset ");
        put_duration(b, offset_ms);
    } else if (offset_ms < 0) {
        buf_puts(b, " offset -");
        put_duration(b, -offset_ms);
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void put_selector_core(buf_t *b, const promql_expr_t *e)
{
    const char *name = e->u.sel.name;
    size_t n = e->u.sel.nmatchers;
    char **strs = calloc(n ? n : 1, sizeof(*strs));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const matcher_t *m = e->u.sel.matchers[i];
        if (name && matcher_type(m) == MATCHER_EQ && strcmp(matcher_name(m), LABEL_METRIC_NAME) == 0 &&
            strcmp(matcher_value(m), name) == 0)
            continue;
        buf_t t = BUF_INIT;
        static const char *const ops[] = {"=", "!=", "=~", "!~"};
        buf_puts(&t, matcher_name(m));
        buf_puts(&t, ops[matcher_type(m)]);
        put_go_quoted(&t, matcher_value(m));
        strs[k++] = buf_steal(&t, NULL);
    }
    qsort(strs, k, sizeof(*strs), cmp_str);
    if (name)
        buf_puts(b, name);
    if (k > 0) {
        buf_putc(b, '{');
        for (size_t i = 0; i < k; i++) {
            if (i)
                buf_putc(b, ',');
            buf_puts(b, strs[i]);
            free(strs[i]);
        }
        buf_putc(b, '}');
    }
    free(strs);
}

static void put_list(buf_t *b, const promql_strlist_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            buf_puts(b, ", ");
        buf_puts(b, l->names[i]);
    }
}

static void put_agg_op(buf_t *b, const promql_expr_t *e)
{
    buf_puts(b, promql_op_name(e->u.agg.op));
    if (e->u.agg.without) {
        buf_puts(b, " without (");
        put_list(b, &e->u.agg.grouping);
        buf_puts(b, ") ");
    } else if (e->u.agg.grouping.n > 0) {
        buf_puts(b, " by (");
        put_list(b, &e->u.agg.grouping);
        buf_puts(b, ") ");
    }
}

static void put_matching(buf_t *b, const promql_expr_t *e)
{
    bool vec = e->u.bin.lhs->type == PROMQL_VT_VECTOR && e->u.bin.rhs->type == PROMQL_VT_VECTOR;
    if (!vec || !(e->u.bin.labels.n > 0 || e->u.bin.on))
        return;
    buf_puts(b, e->u.bin.on ? " on (" : " ignoring (");
    put_list(b, &e->u.bin.labels);
    buf_putc(b, ')');
    if (e->u.bin.card == PROMQL_CARD_MANY_TO_ONE || e->u.bin.card == PROMQL_CARD_ONE_TO_MANY) {
        buf_puts(b, e->u.bin.card == PROMQL_CARD_MANY_TO_ONE ? " group_left (" : " group_right (");
        put_list(b, &e->u.bin.include);
        buf_putc(b, ')');
    }
}

static void put_subquery_suffix(buf_t *b, const promql_expr_t *e)
{
    buf_putc(b, '[');
    put_duration(b, e->u.subq.range_ms);
    buf_putc(b, ':');
    if (e->u.subq.step_ms)
        put_duration(b, e->u.subq.step_ms);
    buf_putc(b, ']');
    put_at_offset(b, e->u.subq.at, e->u.subq.at_ms, e->u.subq.offset_ms);
}

void promql_format_expr(const promql_expr_t *e, buf_t *b)
{
    switch (e->kind) {
    case PROMQL_NODE_NUMBER: buf_put_float_go(b, e->u.number, 'g'); break;
    case PROMQL_NODE_STRING: put_go_quoted(b, e->u.string); break;
    case PROMQL_NODE_VECTOR_SEL:
        put_selector_core(b, e);
        put_at_offset(b, e->u.sel.at, e->u.sel.at_ms, e->u.sel.offset_ms);
        break;
    case PROMQL_NODE_MATRIX_SEL:
        put_selector_core(b, e);
        buf_putc(b, '[');
        put_duration(b, e->u.sel.range_ms);
        buf_putc(b, ']');
        put_at_offset(b, e->u.sel.at, e->u.sel.at_ms, e->u.sel.offset_ms);
        break;
    case PROMQL_NODE_SUBQUERY:
        promql_format_expr(e->u.subq.expr, b);
        put_subquery_suffix(b, e);
        break;
    case PROMQL_NODE_PAREN:
        buf_putc(b, '(');
        promql_format_expr(e->u.paren.expr, b);
        buf_putc(b, ')');
        break;
    case PROMQL_NODE_UNARY:
        buf_puts(b, promql_op_name(e->u.unary.op));
        promql_format_expr(e->u.unary.expr, b);
        break;
    case PROMQL_NODE_BINARY: {
        /* A signed number left of ^ ("+Inf" from 1e999, say) would read back as a unary sign
         * applied to the power (^ binds tighter): parenthesize it so the text parses to the same
         * tree. Prometheus prints it bare; this only differs for such folded literals. */
        const promql_expr_t *l = e->u.bin.lhs;
        bool signed_pow = e->u.bin.op == PROMQL_OP_POW && l->kind == PROMQL_NODE_NUMBER && !isnan(l->u.number) &&
                          (signbit(l->u.number) || isinf(l->u.number));
        if (signed_pow)
            buf_putc(b, '(');
        promql_format_expr(l, b);
        if (signed_pow)
            buf_putc(b, ')');
        buf_putc(b, ' ');
        buf_puts(b, promql_op_name(e->u.bin.op));
        if (e->u.bin.return_bool)
            buf_puts(b, " bool");
        put_matching(b, e);
        buf_putc(b, ' ');
        promql_format_expr(e->u.bin.rhs, b);
        break;
    }
    case PROMQL_NODE_AGG:
        put_agg_op(b, e);
        buf_putc(b, '(');
        if (e->u.agg.param) {
            promql_format_expr(e->u.agg.param, b);
            buf_puts(b, ", ");
        }
        promql_format_expr(e->u.agg.expr, b);
        buf_putc(b, ')');
        break;
    case PROMQL_NODE_CALL:
        buf_puts(b, e->u.call.func->name);
        buf_putc(b, '(');
        for (size_t i = 0; i < e->u.call.nargs; i++) {
            if (i)
                buf_puts(b, ", ");
            promql_format_expr(e->u.call.args[i], b);
        }
        buf_putc(b, ')');
        break;
    }
}

/* ---- Pretty() ------------------------------------------------------------------------------ */

#define PRETTY_MAX_LINE 100

static bool needs_split(const promql_expr_t *e)
{
    buf_t t = BUF_INIT;
    promql_format_expr(e, &t);
    bool r = t.len > PRETTY_MAX_LINE;
    buf_free(&t);
    return r;
}

static void indent(buf_t *b, int level)
{
    for (int i = 0; i < level; i++)
        buf_puts(b, "  ");
}

static void pretty(const promql_expr_t *e, int level, buf_t *b)
{
    switch (e->kind) {
    case PROMQL_NODE_AGG:
        indent(b, level);
        if (!needs_split(e)) {
            promql_format_expr(e, b);
            return;
        }
        put_agg_op(b, e);
        buf_puts(b, "(\n");
        if (e->u.agg.param) {
            pretty(e->u.agg.param, level + 1, b);
            buf_puts(b, ",\n");
        }
        pretty(e->u.agg.expr, level + 1, b);
        buf_putc(b, '\n');
        indent(b, level);
        buf_putc(b, ')');
        return;
    case PROMQL_NODE_BINARY:
        if (!needs_split(e)) {
            indent(b, level);
            promql_format_expr(e, b);
            return;
        }
        pretty(e->u.bin.lhs, level + 1, b);
        buf_putc(b, '\n');
        indent(b, level);
        buf_puts(b, promql_op_name(e->u.bin.op));
        if (e->u.bin.return_bool)
            buf_puts(b, " bool");
        put_matching(b, e);
        buf_putc(b, '\n');
        pretty(e->u.bin.rhs, level + 1, b);
        return;
    case PROMQL_NODE_CALL:
        indent(b, level);
        if (!needs_split(e)) {
            promql_format_expr(e, b);
            return;
        }
        buf_puts(b, e->u.call.func->name);
        buf_puts(b, "(\n");
        for (size_t i = 0; i < e->u.call.nargs; i++) {
            if (i)
                buf_puts(b, ",\n");
            pretty(e->u.call.args[i], level + 1, b);
        }
        buf_putc(b, '\n');
        indent(b, level);
        buf_putc(b, ')');
        return;
    case PROMQL_NODE_PAREN:
        indent(b, level);
        if (!needs_split(e)) {
            promql_format_expr(e, b);
            return;
        }
        buf_puts(b, "(\n");
        pretty(e->u.paren.expr, level + 1, b);
        buf_putc(b, '\n');
        indent(b, level);
        buf_putc(b, ')');
        return;
    case PROMQL_NODE_SUBQUERY:
        /* As Prometheus: no indent when it fits on a line. */
        if (!needs_split(e)) {
            promql_format_expr(e, b);
            return;
        }
        pretty(e->u.subq.expr, level, b);
        put_subquery_suffix(b, e);
        return;
    case PROMQL_NODE_UNARY: {
        buf_t child = BUF_INIT;
        pretty(e->u.unary.expr, level, &child);
        size_t s = 0, n = child.len;
        while (s < n && (child.data[s] == ' ' || child.data[s] == '\n' || child.data[s] == '\t'))
            s++;
        while (n > s && (child.data[n - 1] == ' ' || child.data[n - 1] == '\n' || child.data[n - 1] == '\t'))
            n--;
        indent(b, level);
        buf_puts(b, promql_op_name(e->u.unary.op));
        buf_append(b, child.data + s, n - s);
        buf_free(&child);
        return;
    }
    default:
        indent(b, level);
        promql_format_expr(e, b);
        return;
    }
}

void promql_format_pretty(const promql_expr_t *e, buf_t *out)
{
    pretty(e, 0, out);
}
