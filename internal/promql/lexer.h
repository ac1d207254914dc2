/*
 * lexer — PromQL tokens (internal to internal/promql).
 *
 * The whole query is tokenised up front into an array (queries are short; the parser then looks
 * ahead freely). Like Prometheus' lexer it has two modes: inside `{...}` every word is a plain
 * identifier (label names may be keywords); outside, words are looked up case-insensitively as
 * keywords (`sum`, `BY`, `and`, `offset`, `inf`, `nan`, ...). A number directly followed by a unit
 * letter is a duration (`5m`, `1h30m`, `250ms`). `#` starts a comment to the end of the line.
 */
#ifndef SLUICE_PROMQL_LEXER_H
#define SLUICE_PROMQL_LEXER_H

#include <stddef.h>

#include "internal/promql/ast.h"

typedef enum {
    TK_EOF = 0,
    TK_IDENT,        /* foo, label names */
    TK_METRIC_IDENT, /* foo:bar (contains a colon) */
    TK_NUMBER,
    TK_DURATION,
    TK_STRING, /* still quoted; unquote with promql__unquote */
    TK_LPAREN,
    TK_RPAREN,
    TK_LBRACE,
    TK_RBRACE,
    TK_LBRACKET,
    TK_RBRACKET,
    TK_COMMA,
    TK_COLON,
    TK_AT,
    TK_EQL,       /* = */
    TK_EQL_REGEX, /* =~ */
    TK_NEQ_REGEX, /* !~ */
    TK_OP,        /* binary operator incl. keyword ones (and, or, unless, atan2); see .op */
    TK_AGG,       /* aggregation keyword; see .op */
    TK_OFFSET,
    TK_BY,
    TK_WITHOUT,
    TK_ON,
    TK_IGNORING,
    TK_GROUP_LEFT,
    TK_GROUP_RIGHT,
    TK_BOOL,
    TK_START,
    TK_END,
} promql_tok_kind_t;

typedef struct {
    promql_tok_kind_t kind;
    promql_op_t op; /* for TK_OP / TK_AGG */
    int pos, len;   /* byte range in the query */
} promql_tok_t;

/* Tokenises q. Returns 0 and an array ending with TK_EOF (arena-allocated) in *out, or -1 with
 * *errpos and a message in err. */
int promql__lex(arena_t *a, const char *q, promql_tok_t **out, size_t *n, int *errpos, char *err, size_t errlen);
/* Unquotes a "..", '..' or `..` literal (Go escapes). Returns NULL with a message on bad input. */
char *promql__unquote(arena_t *a, const char *s, size_t n, char *err, size_t errlen);
/* Human description of a token for error messages, e.g. `"offset"`, `number "5"`. */
void promql__tok_desc(const char *q, const promql_tok_t *t, char *out, size_t outlen);

#endif
