/*
 * ast — the PromQL syntax tree, the parser that builds it and the printers that render it.
 *
 * A query is parsed once into a promql_ast_t, which owns everything it points at: the nodes and
 * strings live in the AST's own arena, the compiled label matchers (matcher_t, heap objects)
 * are listed in the AST and freed by promql_ast_free. An AST is immutable after parsing, so one
 * AST may be evaluated by several threads at once (the evaluator keeps all per-query state in its
 * own context, indexing selectors by `sel.id`).
 *
 * The grammar and the checks are Prometheus 2.42's (promql/parser/generated_parser.y, lex.go,
 * parse.go), written anew as a hand-made lexer and a precedence-climbing parser:
 *
 *     precedence (low -> high)      associativity
 *     or                            left
 *     and unless                    left
 *     == != <= < >= >               left
 *     + -                           left
 *     * / % atan2                   left
 *     unary + -                     (binds like * /: -a^b is -(a^b), -a*b is (-a)*b)
 *     ^                             right
 *     postfix [range] [r:s] offset @
 *
 * Errors carry Prometheus' wording and a "line:col:" position prefix, e.g.
 * "1:5: parse error: unexpected end of input".
 *
 * Printers: promql_format_expr() is Prometheus' Node.String() (one line, normalised: sorted
 * matchers, durations re-rendered, numbers as Go's %v); promql_format_pretty() is Pretty(0) as
 * /api/v1/format_query returns it (split at 100 characters, two-space indents).
 */
#ifndef SLUICE_PROMQL_AST_H
#define SLUICE_PROMQL_AST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/matcher.h"
#include "internal/util/arena.h"
#include "internal/util/buf.h"

typedef enum {
    PROMQL_VT_NONE = 0,
    PROMQL_VT_SCALAR,
    PROMQL_VT_VECTOR,
    PROMQL_VT_MATRIX,
    PROMQL_VT_STRING,
} promql_vtype_t;

/* "scalar", "instant vector", "range vector", "string" (Prometheus' DocumentedType). */
const char *promql_vtype_name(promql_vtype_t t);

typedef enum {
    PROMQL_NODE_NUMBER,
    PROMQL_NODE_STRING,
    PROMQL_NODE_VECTOR_SEL,
    PROMQL_NODE_MATRIX_SEL,
    PROMQL_NODE_SUBQUERY,
    PROMQL_NODE_PAREN,
    PROMQL_NODE_UNARY,
    PROMQL_NODE_BINARY,
    PROMQL_NODE_AGG,
    PROMQL_NODE_CALL,
} promql_node_kind_t;

/* Operators: binary, unary and aggregation. */
typedef enum {
    PROMQL_OP_NONE = 0,
    PROMQL_OP_ADD,
    PROMQL_OP_SUB,
    PROMQL_OP_MUL,
    PROMQL_OP_DIV,
    PROMQL_OP_MOD,
    PROMQL_OP_POW,
    PROMQL_OP_ATAN2,
    PROMQL_OP_EQLC,
    PROMQL_OP_NEQ,
    PROMQL_OP_GTR,
    PROMQL_OP_LSS,
    PROMQL_OP_GTE,
    PROMQL_OP_LTE,
    PROMQL_OP_AND,
    PROMQL_OP_OR,
    PROMQL_OP_UNLESS,
    /* aggregations */
    PROMQL_AGG_SUM,
    PROMQL_AGG_AVG,
    PROMQL_AGG_COUNT,
    PROMQL_AGG_MIN,
    PROMQL_AGG_MAX,
    PROMQL_AGG_GROUP,
    PROMQL_AGG_STDDEV,
    PROMQL_AGG_STDVAR,
    PROMQL_AGG_TOPK,
    PROMQL_AGG_BOTTOMK,
    PROMQL_AGG_COUNT_VALUES,
    PROMQL_AGG_QUANTILE,
} promql_op_t;

const char *promql_op_name(promql_op_t op);
bool promql_op_is_comparison(promql_op_t op);
bool promql_op_is_set(promql_op_t op);

/* Vector matching cardinality. */
typedef enum {
    PROMQL_CARD_ONE_TO_ONE = 0,
    PROMQL_CARD_MANY_TO_ONE,  /* group_left */
    PROMQL_CARD_ONE_TO_MANY,  /* group_right */
    PROMQL_CARD_MANY_TO_MANY, /* set operators */
} promql_card_t;

/* @ modifier. */
typedef enum {
    PROMQL_AT_NONE = 0,
    PROMQL_AT_TS,    /* @ <timestamp> */
    PROMQL_AT_START, /* @ start() */
    PROMQL_AT_END,   /* @ end() */
} promql_at_t;

typedef struct promql_func promql_func_t;
typedef struct promql_expr promql_expr_t;

typedef struct {
    const char **names; /* arena strings */
    size_t n;
} promql_strlist_t;

struct promql_expr {
    promql_node_kind_t kind;
    promql_vtype_t type; /* result type, set by the parser */
    int pos;             /* byte offset of the first character in the query */
    union {
        double number;
        const char *string;       /* unquoted */
        struct {                  /* VECTOR_SEL and MATRIX_SEL */
            const char *name;     /* metric name written before the braces, or NULL */
            matcher_t **matchers; /* owned by the AST; includes __name__="name" when name set */
            size_t nmatchers;
            int64_t range_ms; /* MATRIX_SEL only */
            int64_t offset_ms;
            promql_at_t at;
            int64_t at_ms;
            int id; /* dense index 0..ast->nselectors-1, for per-query selector state */
        } sel;
        struct {
            promql_expr_t *expr;
            int64_t range_ms;
            int64_t step_ms; /* 0: the engine's default subquery step */
            int64_t offset_ms;
            promql_at_t at;
            int64_t at_ms;
        } subq;
        struct {
            promql_expr_t *expr;
        } paren;
        struct {
            promql_op_t op; /* ADD or SUB */
            promql_expr_t *expr;
        } unary;
        struct {
            promql_op_t op;
            promql_expr_t *lhs, *rhs;
            bool return_bool;
            /* vector matching (only meaningful when both sides are vectors) */
            promql_card_t card;
            bool on;                  /* on(...) rather than ignoring(...) */
            bool matching_given;      /* on/ignoring was written */
            promql_strlist_t labels;  /* on / ignoring labels */
            promql_strlist_t include; /* group_left / group_right labels */
        } bin;
        struct {
            promql_op_t op;
            promql_expr_t *expr;
            promql_expr_t *param; /* topk, bottomk, quantile, count_values */
            promql_strlist_t grouping;
            bool without;
        } agg;
        struct {
            const promql_func_t *func;
            promql_expr_t **args;
            size_t nargs;
        } call;
    } u;
};

typedef struct promql_ast {
    arena_t *arena;
    promql_expr_t *root;
    matcher_t **matchers; /* every matcher of every selector, freed with the AST */
    size_t nmatchers, capmatchers;
    int nselectors;
    const char *query; /* copy of the input */
} promql_ast_t;

/* Parses a PromQL expression. Returns NULL on error with "line:col: parse error: msg" in err.
 * Free with promql_ast_free. */
promql_ast_t *promql_parse(const char *query, char *err, size_t errlen);
void promql_ast_free(promql_ast_t *ast);

/* Node.String(): the canonical one-line rendering. Appends to out. */
void promql_format_expr(const promql_expr_t *e, buf_t *out);
/* Node.Pretty(0): what /api/v1/format_query returns. Appends to out. */
void promql_format_pretty(const promql_expr_t *e, buf_t *out);

/* Strips parentheses. */
const promql_expr_t *promql_unwrap_parens(const promql_expr_t *e);

#endif
