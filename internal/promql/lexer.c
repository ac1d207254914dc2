/*
 * lexer — PromQL tokeniser; see lexer.h. Follows Prometheus 2.42's lex.go in what it accepts:
 *
 *   numbers    123  1.5  .5  2.  1e-3  0x1F  (hex only outside series notation)  inf  NaN
 *   durations  <int><unit>... with units y w d h m s ms, e.g. 1h30m (parsed later, strictly)
 *   strings    "…" and '…' with Go escapes, `…` raw
 *   idents     [a-zA-Z_][a-zA-Z0-9_]*, with ':' allowed outside braces (metric identifier)
 *   operators  + - * / % ^ == != > < >= <= = =~ !~ ( ) { } [ ] , : @
 */
#include "internal/promql/lexer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal/util/utf8.h"

typedef struct {
    const char *word;
    promql_tok_kind_t kind;
    promql_op_t op;
} keyword_t;

static const keyword_t keywords[] = {
    {"and", TK_OP, PROMQL_OP_AND},
    {"or", TK_OP, PROMQL_OP_OR},
    {"unless", TK_OP, PROMQL_OP_UNLESS},
    {"atan2", TK_OP, PROMQL_OP_ATAN2},
    {"sum", TK_AGG, PROMQL_AGG_SUM},
    {"avg", TK_AGG, PROMQL_AGG_AVG},
    {"count", TK_AGG, PROMQL_AGG_COUNT},
    {"min", TK_AGG, PROMQL_AGG_MIN},
    {"max", TK_AGG, PROMQL_AGG_MAX},
    {"group", TK_AGG, PROMQL_AGG_GROUP},
    {"stddev", TK_AGG, PROMQL_AGG_STDDEV},
    {"stdvar", TK_AGG, PROMQL_AGG_STDVAR},
    {"topk", TK_AGG, PROMQL_AGG_TOPK},
    {"bottomk", TK_AGG, PROMQL_AGG_BOTTOMK},
    {"count_values", TK_AGG, PROMQL_AGG_COUNT_VALUES},
    {"quantile", TK_AGG, PROMQL_AGG_QUANTILE},
    {"offset", TK_OFFSET, PROMQL_OP_NONE},
    {"by", TK_BY, PROMQL_OP_NONE},
    {"without", TK_WITHOUT, PROMQL_OP_NONE},
    {"on", TK_ON, PROMQL_OP_NONE},
    {"ignoring", TK_IGNORING, PROMQL_OP_NONE},
    {"group_left", TK_GROUP_LEFT, PROMQL_OP_NONE},
    {"group_right", TK_GROUP_RIGHT, PROMQL_OP_NONE},
    {"bool", TK_BOOL, PROMQL_OP_NONE},
    {"start", TK_START, PROMQL_OP_NONE},
    {"end", TK_END, PROMQL_OP_NONE},
    {"inf", TK_NUMBER, PROMQL_OP_NONE},
    {"nan", TK_NUMBER, PROMQL_OP_NONE},
};

static bool is_alpha(int c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}
static bool is_alnum(int c)
{
    return is_alpha(c) || is_digit(c);
}

typedef struct {
    const char *q;
    size_t len, i;
} lx_t;

static int peekc(const lx_t *l, size_t k)
{
    return l->i + k < l->len ? (unsigned char)l->q[l->i + k] : 0;
}

static bool accept(lx_t *l, const char *set)
{
    int c = peekc(l, 0);
    if (c && strchr(set, c)) {
        l->i++;
        return true;
    }
    return false;
}

static void accept_run(lx_t *l, const char *set)
{
    while (accept(l, set)) {
    }
}

/* Prometheus scanNumber: true if a complete number was scanned. */
static bool scan_number(lx_t *l)
{
    const char *digits = "0123456789";
    if (peekc(l, 0) == '0' && (peekc(l, 1) == 'x' || peekc(l, 1) == 'X')) {
        l->i += 2;
        digits = "0123456789abcdefABCDEF";
    }
    accept_run(l, digits);
    if (accept(l, "."))
        accept_run(l, digits);
    if (accept(l, "eE")) {
        accept(l, "+-");
        accept_run(l, "0123456789");
    }
    return !is_alnum(peekc(l, 0));
}

static bool accept_remaining_duration(lx_t *l)
{
    if (!accept(l, "smhdwy"))
        return false;
    accept(l, "s");
    while (accept(l, "0123456789")) {
        accept_run(l, "0123456789");
        if (!accept(l, "smhdw"))
            return false;
        accept(l, "s");
    }
    return !is_alnum(peekc(l, 0));
}

int promql__lex(arena_t *a, const char *q, promql_tok_t **out, size_t *n, int *errpos, char *err, size_t errlen)
{
    lx_t l = {q, strlen(q), 0};
    size_t cap = 16, cnt = 0;
    promql_tok_t *toks = arena_alloc(a, cap * sizeof(*toks));
    int brace = 0, bracket = 0;

    for (;;) {
        while (l.i < l.len && (isspace((unsigned char)q[l.i]) || q[l.i] == '#')) {
            if (q[l.i] == '#') {
                while (l.i < l.len && q[l.i] != '\n')
                    l.i++;
            } else {
                l.i++;
            }
        }
        if (cnt + 1 >= cap) {
            promql_tok_t *nt = arena_alloc(a, 2 * cap * sizeof(*toks));
            memcpy(nt, toks, cnt * sizeof(*toks));
            toks = nt;
            cap *= 2;
        }
        promql_tok_t *t = &toks[cnt];
        memset(t, 0, sizeof(*t));
        t->pos = (int)l.i;
        if (l.i >= l.len) {
            t->kind = TK_EOF;
            cnt++;
            break;
        }
        int c = peekc(&l, 0), c1 = peekc(&l, 1);
        if (c == '"' || c == '\'' || c == '`') {
            size_t j = l.i + 1;
            for (;;) {
                if (j >= l.len || (c != '`' && q[j] == '\n')) {
                    *errpos = (int)l.i;
                    snprintf(err, errlen, "unterminated quoted string %c", c);
                    return -1;
                }
                if (c != '`' && q[j] == '\\') {
                    j += 2;
                    continue;
                }
                if (q[j] == c)
                    break;
                j++;
            }
            t->kind = TK_STRING;
            l.i = j + 1;
        } else if (is_digit(c) || (c == '.' && is_digit(c1))) {
            size_t st = l.i;
            if (scan_number(&l)) {
                t->kind = TK_NUMBER;
            } else if (accept_remaining_duration(&l)) {
                t->kind = TK_DURATION;
            } else {
                while (l.i < l.len && is_alnum(q[l.i]))
                    l.i++;
                *errpos = (int)st;
                snprintf(err, errlen, "bad number or duration syntax: \"%.*s\"", (int)(l.i - st), q + st);
                return -1;
            }
        } else if (is_alpha(c) || (c == ':' && brace == 0 && bracket == 0)) {
            size_t st = l.i;
            bool colon = false;
            while (l.i < l.len && (is_alnum(q[l.i]) || (brace == 0 && q[l.i] == ':'))) {
                if (q[l.i] == ':')
                    colon = true;
                l.i++;
            }
            t->kind = colon ? TK_METRIC_IDENT : TK_IDENT;
            if (brace == 0 && !colon) {
                size_t wl = l.i - st;
                for (size_t k = 0; k < sizeof(keywords) / sizeof(keywords[0]); k++) {
                    if (strlen(keywords[k].word) == wl && strncasecmp(keywords[k].word, q + st, wl) == 0) {
                        t->kind = keywords[k].kind;
                        t->op = keywords[k].op;
                        break;
                    }
                }
            }
        } else {
            l.i++;
            switch (c) {
            case '(': t->kind = TK_LPAREN; break;
            case ')': t->kind = TK_RPAREN; break;
            case '{':
                t->kind = TK_LBRACE;
                brace++;
                break;
            case '}':
                t->kind = TK_RBRACE;
                if (brace > 0)
                    brace--;
                break;
            case '[':
                t->kind = TK_LBRACKET;
                bracket++;
                break;
            case ']':
                t->kind = TK_RBRACKET;
                if (bracket > 0)
                    bracket--;
                break;
            case ',': t->kind = TK_COMMA; break;
            case ':': t->kind = TK_COLON; break;
            case '@': t->kind = TK_AT; break;
            case '+':
                t->kind = TK_OP;
                t->op = PROMQL_OP_ADD;
                break;
            case '-':
                t->kind = TK_OP;
                t->op = PROMQL_OP_SUB;
                break;
            case '*':
                t->kind = TK_OP;
                t->op = PROMQL_OP_MUL;
                break;
            case '/':
                t->kind = TK_OP;
                t->op = PROMQL_OP_DIV;
                break;
            case '%':
                t->kind = TK_OP;
                t->op = PROMQL_OP_MOD;
                break;
            case '^':
                t->kind = TK_OP;
                t->op = PROMQL_OP_POW;
                break;
            case '=':
                if (accept(&l, "=")) {
                    t->kind = TK_OP;
                    t->op = PROMQL_OP_EQLC;
                } else if (accept(&l, "~")) {
                    t->kind = TK_EQL_REGEX;
                } else {
                    t->kind = TK_EQL;
                }
                break;
            case '!':
                if (accept(&l, "=")) {
                    t->kind = TK_OP;
                    t->op = PROMQL_OP_NEQ;
                } else if (accept(&l, "~")) {
                    t->kind = TK_NEQ_REGEX;
                } else {
                    *errpos = (int)(l.i - 1);
                    snprintf(err, errlen, "unexpected character after '!': '%c'", c1 ? c1 : ' ');
                    return -1;
                }
                break;
            case '<':
                t->kind = TK_OP;
                t->op = accept(&l, "=") ? PROMQL_OP_LTE : PROMQL_OP_LSS;
                break;
            case '>':
                t->kind = TK_OP;
                t->op = accept(&l, "=") ? PROMQL_OP_GTE : PROMQL_OP_GTR;
                break;
            default:
                *errpos = (int)(l.i - 1);
                if (brace > 0)
                    snprintf(err, errlen, "unexpected character inside braces: '%c'", c);
                else
                    snprintf(err, errlen, "unexpected character: '%c'", c);
                return -1;
            }
        }
        t->len = (int)l.i - t->pos;
        cnt++;
    }
    *out = toks;
    *n = cnt;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

char *promql__unquote(arena_t *a, const char *s, size_t n, char *err, size_t errlen)
{
    if (n < 2 || s[0] != s[n - 1]) {
        snprintf(err, errlen, "invalid syntax");
        return NULL;
    }
    char q = s[0];
    char *o = arena_alloc(a, n * 2 + 1);
    size_t k = 0;
    if (q == '`') {
        memcpy(o, s + 1, n - 2);
        o[n - 2] = 0;
        return o;
    }
    for (size_t i = 1; i < n - 1; i++) {
        char c = s[i];
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        if (++i >= n - 1) {
            snprintf(err, errlen, "invalid syntax");
            return NULL;
        }
        c = s[i];
        switch (c) {
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'x': {
            int h1 = i + 2 < n - 1 ? hexval(s[i + 1]) : -1, h2 = i + 2 < n - 1 ? hexval(s[i + 2]) : -1;
            if (h1 < 0 || h2 < 0) {
                snprintf(err, errlen, "invalid syntax");
                return NULL;
            }
            o[k++] = (char)(h1 * 16 + h2);
            i += 2;
            break;
        }
        case 'u':
        case 'U': {
            int nd = c == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int d = 1; d <= nd; d++) {
                int h = i + d < n - 1 ? hexval(s[i + d]) : -1;
                if (h < 0) {
                    snprintf(err, errlen, "invalid syntax");
                    return NULL;
                }
                cp = cp * 16 + (uint32_t)h;
            }
            k += utf8_encode(o + k, cp);
            i += (size_t)nd;
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                int v = 0;
                for (int d = 0; d < 3; d++) {
                    if (i + d >= n - 1 || s[i + d] < '0' || s[i + d] > '7') {
                        snprintf(err, errlen, "invalid syntax");
                        return NULL;
                    }
                    v = v * 8 + (s[i + d] - '0');
                }
                if (v > 255) {
                    snprintf(err, errlen, "invalid syntax");
                    return NULL;
                }
                o[k++] = (char)v;
                i += 2;
                break;
            }
            snprintf(err, errlen, "invalid syntax");
            return NULL;
        }
    }
    o[k] = 0;
    return o;
}

void promql__tok_desc(const char *q, const promql_tok_t *t, char *out, size_t outlen)
{
    const char *txt = q + t->pos;
    int len = t->len;
    switch (t->kind) {
    case TK_EOF: snprintf(out, outlen, "end of input"); break;
    case TK_IDENT:
    case TK_METRIC_IDENT: snprintf(out, outlen, "identifier \"%.*s\"", len, txt); break;
    case TK_NUMBER: snprintf(out, outlen, "number \"%.*s\"", len, txt); break;
    case TK_DURATION: snprintf(out, outlen, "duration \"%.*s\"", len, txt); break;
    case TK_STRING: snprintf(out, outlen, "string %.*s", len, txt); break;
    case TK_OP:
        if (isalpha((unsigned char)txt[0]))
            snprintf(out, outlen, "<op:%.*s>", len, txt);
        else
            snprintf(out, outlen, "<op:%.*s>", len, txt);
        break;
    case TK_AGG: snprintf(out, outlen, "<aggr:%.*s>", len, txt); break;
    case TK_OFFSET:
    case TK_BY:
    case TK_WITHOUT:
    case TK_ON:
    case TK_IGNORING:
    case TK_GROUP_LEFT:
    case TK_GROUP_RIGHT:
    case TK_BOOL:
    case TK_START:
    case TK_END: snprintf(out, outlen, "<%.*s>", len, txt); break;
    case TK_EQL:
    case TK_EQL_REGEX:
    case TK_NEQ_REGEX: snprintf(out, outlen, "<op:%.*s>", len, txt); break;
    default: snprintf(out, outlen, "\"%.*s\"", len, txt); break;
    }
}
