/*
 * rules/template — a small Go text/template for alert labels and annotations; see template.h for
 * the subset.
 *
 * How it works. rules_tmpl_parse turns the text into a tree in one arena:
 *
 *   list   := { TEXT | ACTION(pipe) | IF(pipe, list, list) }
 *   pipe   := [ $var := ] cmd { '|' cmd }
 *   cmd    := arg { arg }            (first arg an identifier: a function call)
 *   arg    := $var{.f} | .f{.f} | . | "str" | `raw` | number | true | false | ident | ( pipe )
 *
 * rules_tmpl_exec walks it with a per-execution arena for intermediate strings. Values are
 * tagged (string, float64, int, bool, label map, the data struct), as Go's reflect values are;
 * that matters for the errors Go raises, e.g. `gt $value 1` compares float64 with int and fails
 * with "incompatible types for comparison" in Prometheus too.
 *
 * Positions: Prometheus prepends four variable definitions to every template before parsing it
 * ("{{$labels := .Labels}}..."), all on line 1, so its columns on line 1 are shifted by their
 * length. Errors here report the same line:column Prometheus would.
 */
#include "internal/rules/template.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal/util/arena.h"
#include "internal/util/regex.h"

/* What Prometheus prepends (template.go, Expander.Expand); only its length is used. */
static const char tmpl_defs[] = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}"
                                "{{$externalURL := .ExternalURL}}{{$value := .Value}}";
#define TMPL_DEFS_LEN (sizeof(tmpl_defs) - 1)
#define TMPL_MAX_DEPTH 64
#define TMPL_MAX_VARS 32

/* --- tree -------------------------------------------------------------------------------------- */

typedef enum { A_VAR, A_FIELD, A_DOT, A_STRING, A_NUMBER, A_BOOL, A_NIL, A_IDENT, A_PIPE } arg_kind_t;

struct tmpl_pipe;

typedef struct {
    arg_kind_t kind;
    int pos;
    const char *s; /* var name (without $; "" for $), identifier, or string value */
    size_t slen;
    const char **fields;
    size_t nfields;
    double num;
    int64_t inum;
    bool is_int;
    bool b;
    struct tmpl_pipe *pipe;
} tmpl_arg_t;

typedef struct {
    tmpl_arg_t *args;
    size_t nargs;
    int pos;
} tmpl_cmd_t;

typedef struct tmpl_pipe {
    const char *decl; /* $decl := ..., or NULL */
    tmpl_cmd_t *cmds;
    size_t ncmds;
    int pos;
} tmpl_pipe_t;

typedef enum { N_TEXT, N_ACTION, N_IF } node_kind_t;

struct tmpl_list;
typedef struct {
    node_kind_t kind;
    int pos;
    const char *text;
    size_t len;
    tmpl_pipe_t *pipe;
    struct tmpl_list *then, *els;
} tmpl_node_t;

typedef struct tmpl_list {
    tmpl_node_t **v;
    size_t n, cap;
} tmpl_list_t;

struct rules_tmpl {
    arena_t *arena;
    char *name;
    const char *text;
    tmpl_list_t *root;
};

/* --- positions and errors ------------------------------------------------------------------------- */

static void tmpl_linecol(const char *text, int pos, int *line, int *col)
{
    int l = 1, last_nl = -1;
    for (int i = 0; i < pos && text[i]; i++)
        if (text[i] == '\n') {
            l++;
            last_nl = i;
        }
    *line = l;
    *col = pos - last_nl;
    if (l == 1)
        *col += (int)TMPL_DEFS_LEN;
}

/* --- parser ------------------------------------------------------------------------------------------ */

typedef struct {
    rules_tmpl_t *t;
    const char *s;
    size_t i, n;
    jmp_buf jb;
    char *err;
    size_t errlen;
    bool trim_next; /* the last action ended with -}} */
} tmpl_parser_t;

__attribute__((noreturn, format(printf, 3, 4))) static void tmpl_perr(tmpl_parser_t *p, size_t pos, const char *fmt,
                                                                      ...)
{
    int line, col;
    tmpl_linecol(p->s, (int)pos, &line, &col);
    (void)col;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(p->err, p->errlen, "template: %s:%d: %s", p->t->name, line, msg);
    longjmp(p->jb, 1);
}

static void *tmpl_push(arena_t *a, void *v, size_t *n, size_t *cap, size_t size)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        void *nv = arena_alloc(a, nc * size);
        if (*n)
            memcpy(nv, v, *n * size);
        v = nv;
        *cap = nc;
    }
    (*n)++;
    return v;
}

static void tmpl_skip_space(tmpl_parser_t *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* At "}}" or " -}}" (after spaces): consumes it. */
static bool tmpl_at_close(tmpl_parser_t *p, bool consume)
{
    size_t j = p->i;
    bool trim = false;
    if (j + 3 <= p->n && p->s[j] == '-' && p->s[j + 1] == '}' && p->s[j + 2] == '}' && j > 0 &&
        (p->s[j - 1] == ' ' || p->s[j - 1] == '\t' || p->s[j - 1] == '\n')) {
        trim = true;
        j++;
    }
    if (j + 2 <= p->n && p->s[j] == '}' && p->s[j + 1] == '}') {
        if (consume) {
            p->i = j + 2;
            p->trim_next = trim;
        }
        return true;
    }
    return false;
}

static bool tmpl_is_ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

static const char *tmpl_word(tmpl_parser_t *p, size_t *len)
{
    size_t st = p->i;
    while (p->i < p->n && tmpl_is_ident_char(p->s[p->i]))
        p->i++;
    *len = p->i - st;
    return p->s + st;
}

static tmpl_pipe_t *tmpl_parse_pipe(tmpl_parser_t *p, bool in_parens, int depth);

/* Field chain ".a.b" starting at p->i (which is at a '.'). */
static void tmpl_parse_fields(tmpl_parser_t *p, tmpl_arg_t *a)
{
    size_t cap = 0;
    while (p->i < p->n && p->s[p->i] == '.' && p->i + 1 < p->n && tmpl_is_ident_char(p->s[p->i + 1])) {
        p->i++;
        size_t len;
        const char *w = tmpl_word(p, &len);
        a->fields = tmpl_push(p->t->arena, a->fields, &a->nfields, &cap, sizeof(*a->fields));
        a->fields[a->nfields - 1] = arena_strndup(p->t->arena, w, len);
    }
}

static void tmpl_parse_string(tmpl_parser_t *p, tmpl_arg_t *a)
{
    size_t st = p->i;
    char q = p->s[p->i++];
    buf_t b = BUF_INIT;
    buf_reserve(&b, 16);
    for (;;) {
        if (p->i >= p->n || (q == '"' && p->s[p->i] == '\n')) {
            buf_free(&b);
            tmpl_perr(p, st, "unterminated %s string", q == '"' ? "quoted" : "raw quote");
        }
        char c = p->s[p->i++];
        if (c == q)
            break;
        if (c == '\\' && q == '"') {
            char e = p->i < p->n ? p->s[p->i++] : 0;
            switch (e) {
            case 'n': buf_putc(&b, '\n'); break;
            case 't': buf_putc(&b, '\t'); break;
            case 'r': buf_putc(&b, '\r'); break;
            case '\\': buf_putc(&b, '\\'); break;
            case '"': buf_putc(&b, '"'); break;
            case '\'': buf_putc(&b, '\''); break;
            case 'a': buf_putc(&b, '\a'); break;
            case 'b': buf_putc(&b, '\b'); break;
            case 'f': buf_putc(&b, '\f'); break;
            case 'v': buf_putc(&b, '\v'); break;
            case 'x': {
                unsigned v = 0;
                for (int k = 0; k < 2; k++) {
                    char h = p->i < p->n ? p->s[p->i++] : 0;
                    if (!isxdigit((unsigned char)h)) {
                        buf_free(&b);
                        tmpl_perr(p, st, "invalid syntax");
                    }
                    v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                }
                buf_putc(&b, (char)v);
                break;
            }
            default: buf_free(&b); tmpl_perr(p, st, "invalid syntax");
            }
        } else {
            buf_putc(&b, c);
        }
    }
    a->kind = A_STRING;
    a->s = arena_strndup(p->t->arena, b.data, b.len);
    a->slen = b.len;
    buf_free(&b);
}

static void tmpl_parse_number(tmpl_parser_t *p, tmpl_arg_t *a)
{
    size_t st = p->i;
    if (p->s[p->i] == '+' || p->s[p->i] == '-')
        p->i++;
    while (p->i < p->n &&
           (isalnum((unsigned char)p->s[p->i]) || p->s[p->i] == '.' || p->s[p->i] == '_' ||
            ((p->s[p->i] == '+' || p->s[p->i] == '-') && (p->s[p->i - 1] == 'e' || p->s[p->i - 1] == 'E'))))
        p->i++;
    char tmp[64];
    size_t len = p->i - st;
    if (len >= sizeof(tmp))
        tmpl_perr(p, st, "bad number syntax: \"%.*s\"", (int)len, p->s + st);
    memcpy(tmp, p->s + st, len);
    tmp[len] = 0;
    char *end;
    errno = 0;
    long long iv = strtoll(tmp, &end, 0);
    a->kind = A_NUMBER;
    if (*end == 0 && errno == 0) {
        a->is_int = true;
        a->inum = iv;
        a->num = (double)iv;
        return;
    }
    double dv = strtod(tmp, &end);
    if (*end != 0 || len == 0 || strpbrk(tmp, "xXpP") || !(isdigit((unsigned char)tmp[len - 1]) || tmp[len - 1] == '.'))
        tmpl_perr(p, st, "bad number syntax: \"%s\"", tmp);
    a->num = dv;
}

/* One operand; false at a pipe/close/paren. */
static bool tmpl_parse_arg(tmpl_parser_t *p, tmpl_arg_t *a, int depth)
{
    tmpl_skip_space(p);
    if (p->i >= p->n)
        tmpl_perr(p, p->i, "unclosed action");
    if (tmpl_at_close(p, false))
        return false;
    char c = p->s[p->i];
    memset(a, 0, sizeof(*a));
    a->pos = (int)p->i;
    if (c == '|' || c == ')')
        return false;
    if (c == '(') {
        p->i++;
        a->kind = A_PIPE;
        a->pipe = tmpl_parse_pipe(p, true, depth + 1);
        tmpl_parse_fields(p, a);
        return true;
    }
    if (c == '"' || c == '`') {
        tmpl_parse_string(p, a);
        return true;
    }
    if (c == '$') {
        p->i++;
        size_t len;
        const char *w = tmpl_word(p, &len);
        a->kind = A_VAR;
        a->s = arena_strndup(p->t->arena, w, len);
        tmpl_parse_fields(p, a);
        return true;
    }
    if (c == '.') {
        if (p->i + 1 < p->n && tmpl_is_ident_char(p->s[p->i + 1]) && !isdigit((unsigned char)p->s[p->i + 1])) {
            a->kind = A_FIELD;
            tmpl_parse_fields(p, a);
            return true;
        }
        if (p->i + 1 < p->n && isdigit((unsigned char)p->s[p->i + 1])) {
            tmpl_parse_number(p, a);
            return true;
        }
        p->i++;
        a->kind = A_DOT;
        return true;
    }
    if (isdigit((unsigned char)c) || ((c == '-' || c == '+') && p->i + 1 < p->n &&
                                      (isdigit((unsigned char)p->s[p->i + 1]) || p->s[p->i + 1] == '.'))) {
        tmpl_parse_number(p, a);
        return true;
    }
    if (isalpha((unsigned char)c) || c == '_') {
        size_t len;
        const char *w = tmpl_word(p, &len);
        if (len == 4 && memcmp(w, "true", 4) == 0) {
            a->kind = A_BOOL;
            a->b = true;
        } else if (len == 5 && memcmp(w, "false", 5) == 0) {
            a->kind = A_BOOL;
        } else if (len == 3 && memcmp(w, "nil", 3) == 0) {
            a->kind = A_NIL;
        } else {
            a->kind = A_IDENT;
            a->s = arena_strndup(p->t->arena, w, len);
        }
        return true;
    }
    tmpl_perr(p, p->i, "unexpected \"%c\" in command", c);
}

static const char *const tmpl_funcs[] = {
    "humanize",
    "humanize1024",
    "humanizePercentage",
    "humanizeDuration",
    "humanizeTimestamp",
    "printf",
    "toUpper",
    "toLower",
    "title",
    "stripPort",
    "reReplaceAll",
    "match",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "and",
    "or",
    "not",
    "len",
    "print",
    "println",
    NULL,
};

static bool tmpl_func_known(const char *name)
{
    for (const char *const *f = tmpl_funcs; *f; f++)
        if (strcmp(*f, name) == 0)
            return true;
    return false;
}

static tmpl_pipe_t *tmpl_parse_pipe(tmpl_parser_t *p, bool in_parens, int depth)
{
    if (depth > TMPL_MAX_DEPTH)
        tmpl_perr(p, p->i, "expression nested too deeply");
    tmpl_pipe_t *pp = arena_calloc(p->t->arena, 1, sizeof(*pp));
    pp->pos = (int)p->i;
    tmpl_skip_space(p);
    /* $x := ... */
    if (p->i < p->n && p->s[p->i] == '$') {
        size_t save = p->i;
        p->i++;
        size_t len;
        const char *w = tmpl_word(p, &len);
        tmpl_skip_space(p);
        if (p->i + 1 < p->n && p->s[p->i] == ':' && p->s[p->i + 1] == '=') {
            p->i += 2;
            pp->decl = arena_strndup(p->t->arena, w, len);
        } else {
            p->i = save;
        }
    }
    size_t ccap = 0;
    for (;;) {
        tmpl_cmd_t cmd = {0};
        size_t acap = 0;
        tmpl_skip_space(p);
        cmd.pos = (int)p->i;
        tmpl_arg_t a;
        while (tmpl_parse_arg(p, &a, depth)) {
            if (cmd.nargs == 0 && a.kind == A_IDENT && !tmpl_func_known(a.s))
                tmpl_perr(p, (size_t)a.pos, "function \"%s\" not defined", a.s);
            if (cmd.nargs > 0 && a.kind == A_IDENT && !tmpl_func_known(a.s))
                tmpl_perr(p, (size_t)a.pos, "function \"%s\" not defined", a.s);
            cmd.args = tmpl_push(p->t->arena, cmd.args, &cmd.nargs, &acap, sizeof(*cmd.args));
            cmd.args[cmd.nargs - 1] = a;
        }
        if (cmd.nargs == 0) {
            if (pp->ncmds == 0 && !in_parens && tmpl_at_close(p, false))
                tmpl_perr(p, p->i, "missing value for command");
            tmpl_perr(p, p->i, "missing value for %s", in_parens ? "parenthesized pipeline" : "command");
        }
        pp->cmds = tmpl_push(p->t->arena, pp->cmds, &pp->ncmds, &ccap, sizeof(*pp->cmds));
        pp->cmds[pp->ncmds - 1] = cmd;
        tmpl_skip_space(p);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        if (in_parens) {
            if (p->i < p->n && p->s[p->i] == ')') {
                p->i++;
                return pp;
            }
            tmpl_perr(p, p->i, "unclosed left paren");
        }
        if (tmpl_at_close(p, true))
            return pp;
        if (p->i < p->n && p->s[p->i] == ')')
            tmpl_perr(p, p->i, "unexpected right paren");
        tmpl_perr(p, p->i, "unexpected input in command");
    }
}

typedef enum { STOP_EOF, STOP_ELSE, STOP_END } tmpl_stop_t;

static void tmpl_list_add(tmpl_parser_t *p, tmpl_list_t *l, tmpl_node_t *nd)
{
    l->v = tmpl_push(p->t->arena, l->v, &l->n, &l->cap, sizeof(*l->v));
    l->v[l->n - 1] = nd;
}

static tmpl_list_t *tmpl_parse_list(tmpl_parser_t *p, tmpl_stop_t *stop, int depth, bool *else_if);

/* After "if": pipe, body, optional else/else-if, end. */
static tmpl_node_t *tmpl_parse_if(tmpl_parser_t *p, size_t pos, int depth)
{
    if (depth > TMPL_MAX_DEPTH)
        tmpl_perr(p, pos, "if nested too deeply");
    tmpl_node_t *nd = arena_calloc(p->t->arena, 1, sizeof(*nd));
    nd->kind = N_IF;
    nd->pos = (int)pos;
    nd->pipe = tmpl_parse_pipe(p, false, depth);
    tmpl_stop_t stop;
    bool else_if = false;
    nd->then = tmpl_parse_list(p, &stop, depth + 1, &else_if);
    if (stop == STOP_EOF)
        tmpl_perr(p, p->n, "unexpected EOF");
    if (stop == STOP_ELSE) {
        if (else_if) {
            /* "else if" is an if nested in the else branch that shares the end. */
            nd->els = arena_calloc(p->t->arena, 1, sizeof(*nd->els));
            tmpl_list_add(p, nd->els, tmpl_parse_if(p, p->i, depth + 1));
            return nd;
        }
        nd->els = tmpl_parse_list(p, &stop, depth + 1, &else_if);
        if (stop != STOP_END)
            tmpl_perr(p, p->i, stop == STOP_EOF ? "unexpected EOF" : "expected end; found {{else}}");
    }
    return nd;
}

static tmpl_list_t *tmpl_parse_list(tmpl_parser_t *p, tmpl_stop_t *stop, int depth, bool *else_if)
{
    tmpl_list_t *l = arena_calloc(p->t->arena, 1, sizeof(*l));
    for (;;) {
        const char *open = p->i < p->n ? strstr(p->s + p->i, "{{") : NULL;
        size_t tend = open ? (size_t)(open - p->s) : p->n;
        size_t tstart = p->i;
        if (p->trim_next) {
            while (tstart < tend && isspace((unsigned char)p->s[tstart]))
                tstart++;
            p->trim_next = false;
        }
        size_t tstop = tend;
        bool trim_left = open && tend + 3 < p->n + 1 && p->s[tend + 2] == '-' && tend + 3 < p->n &&
                         isspace((unsigned char)p->s[tend + 3]);
        if (trim_left)
            while (tstop > tstart && isspace((unsigned char)p->s[tstop - 1]))
                tstop--;
        if (tstop > tstart) {
            tmpl_node_t *nd = arena_calloc(p->t->arena, 1, sizeof(*nd));
            nd->kind = N_TEXT;
            nd->text = p->s + tstart;
            nd->len = tstop - tstart;
            nd->pos = (int)tstart;
            tmpl_list_add(p, l, nd);
        }
        if (!open) {
            p->i = p->n;
            *stop = STOP_EOF;
            return l;
        }
        size_t apos = tend;
        p->i = tend + 2 + (trim_left ? 1 : 0);
        /* comment */
        if (p->i + 1 < p->n && p->s[p->i] == '/' && p->s[p->i + 1] == '*') {
            const char *e = strstr(p->s + p->i + 2, "*/");
            if (!e)
                tmpl_perr(p, apos, "unclosed comment");
            p->i = (size_t)(e - p->s) + 2;
            tmpl_skip_space(p);
            if (!tmpl_at_close(p, true))
                tmpl_perr(p, apos, "comment ends before closing delimiter");
            continue;
        }
        tmpl_skip_space(p);
        size_t save = p->i;
        size_t wlen;
        const char *w = tmpl_word(p, &wlen);
        if (wlen == 2 && memcmp(w, "if", 2) == 0) {
            tmpl_list_add(p, l, tmpl_parse_if(p, apos, depth));
            continue;
        }
        if (wlen == 4 && memcmp(w, "else", 4) == 0) {
            if (depth == 0)
                tmpl_perr(p, apos, "unexpected {{else}}");
            tmpl_skip_space(p);
            size_t s2 = p->i;
            size_t l2;
            const char *w2 = tmpl_word(p, &l2);
            if (l2 == 2 && memcmp(w2, "if", 2) == 0) {
                *else_if = true;
            } else {
                p->i = s2;
                if (!tmpl_at_close(p, true))
                    tmpl_perr(p, p->i, "unexpected input in else");
            }
            *stop = STOP_ELSE;
            return l;
        }
        if (wlen == 3 && memcmp(w, "end", 3) == 0) {
            if (depth == 0)
                tmpl_perr(p, apos, "unexpected {{end}}");
            tmpl_skip_space(p);
            if (!tmpl_at_close(p, true))
                tmpl_perr(p, p->i, "unexpected input in end");
            *stop = STOP_END;
            return l;
        }
        if ((wlen == 5 && (memcmp(w, "range", 5) == 0 || memcmp(w, "block", 5) == 0)) ||
            (wlen == 4 && memcmp(w, "with", 4) == 0) || (wlen == 6 && memcmp(w, "define", 6) == 0) ||
            (wlen == 8 && memcmp(w, "template", 8) == 0) || (wlen == 5 && memcmp(w, "break", 5) == 0))
            tmpl_perr(p, apos, "{{%.*s}} is not supported by sluice's template engine", (int)wlen, w);
        p->i = save;
        tmpl_node_t *nd = arena_calloc(p->t->arena, 1, sizeof(*nd));
        nd->kind = N_ACTION;
        nd->pos = (int)save;
        nd->pipe = tmpl_parse_pipe(p, false, depth);
        tmpl_list_add(p, l, nd);
    }
}

rules_tmpl_t *rules_tmpl_parse(const char *name, const char *text, char *err, size_t errlen)
{
    arena_t *a = arena_create(0);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    rules_tmpl_t *t = arena_calloc(a, 1, sizeof(*t));
    t->arena = a;
    t->name = arena_strdup(a, name);
    t->text = arena_strdup(a, text);
    tmpl_parser_t p = {.t = t, .s = t->text, .i = 0, .n = strlen(text), .err = err, .errlen = errlen};
    if (setjmp(p.jb)) {
        arena_destroy(a);
        return NULL;
    }
    tmpl_stop_t stop;
    bool else_if = false;
    t->root = tmpl_parse_list(&p, &stop, 0, &else_if);
    return t;
}

void rules_tmpl_free(rules_tmpl_t *t)
{
    if (t)
        arena_destroy(t->arena);
}

int rules_tmpl_is_plain(const char *text)
{
    return strstr(text, "{{") == NULL;
}

/* --- values -------------------------------------------------------------------------------------------- */

typedef enum { V_NONE, V_STR, V_FLOAT, V_INT, V_BOOL, V_MAP, V_DATA } vkind_t;

typedef struct {
    vkind_t k;
    const char *s;
    size_t n;
    double f;
    int64_t i;
    bool b;
    const labels_t *m;
} tmpl_val_t;

typedef struct {
    const rules_tmpl_t *t;
    const rules_tmpl_data_t *d;
    arena_t *a;
    buf_t *out;
    jmp_buf jb;
    char *err;
    size_t errlen;
    const char *vnames[TMPL_MAX_VARS];
    tmpl_val_t vvals[TMPL_MAX_VARS];
    int nvars;
} tmpl_exec_t;

static const char *tmpl_type_name(vkind_t k)
{
    switch (k) {
    case V_STR: return "string";
    case V_FLOAT: return "float64";
    case V_INT: return "int";
    case V_BOOL: return "bool";
    case V_MAP: return "map[string]string";
    case V_DATA: return "template.tmplData";
    default: return "<nil>";
    }
}

__attribute__((noreturn, format(printf, 3, 4))) static void tmpl_xerr(tmpl_exec_t *x, int pos, const char *fmt, ...)
{
    int line, col;
    tmpl_linecol(x->t->text, pos, &line, &col);
    /* Go names the node it was executing: the source text of the command, roughly. */
    const char *s = x->t->text + pos;
    size_t len = 0;
    while (s[len] && !(s[len] == '}' && s[len + 1] == '}') && s[len] != '|' && len < 60)
        len++;
    while (len > 0 && s[len - 1] == ' ')
        len--;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(x->err, x->errlen, "template: %s:%d:%d: executing \"%s\" at <%.*s>: %s", x->t->name, line, col, x->t->name,
             (int)len, s, msg);
    longjmp(x->jb, 1);
}

static tmpl_val_t tmpl_str(const char *s, size_t n)
{
    tmpl_val_t v = {.k = V_STR, .s = s, .n = n};
    return v;
}

static tmpl_val_t tmpl_bufstr(tmpl_exec_t *x, buf_t *b)
{
    char *s = arena_strndup(x->a, b->data ? b->data : "", b->len);
    size_t n = b->len;
    buf_free(b);
    return tmpl_str(s, n);
}

/* Go's %.4g (C's, except for NaN and infinities). */
static void tmpl_fmt4g(buf_t *b, double v, const char *suffix)
{
    if (isnan(v))
        buf_puts(b, "NaN");
    else if (isinf(v))
        buf_puts(b, v > 0 ? "+Inf" : "-Inf");
    else
        buf_printf(b, "%.4g", v);
    buf_puts(b, suffix);
}

/* fmt.Sprint of a value. */
static void tmpl_print(buf_t *b, const tmpl_val_t *v)
{
    switch (v->k) {
    case V_STR: buf_append(b, v->s, v->n); break;
    case V_FLOAT: buf_put_float(b, v->f); break;
    case V_INT: buf_printf(b, "%" PRId64, v->i); break;
    case V_BOOL: buf_puts(b, v->b ? "true" : "false"); break;
    case V_MAP:
        buf_puts(b, "map[");
        for (size_t i = 0; v->m && i < v->m->n; i++)
            buf_printf(b, "%s%s:%s", i ? " " : "", v->m->v[i].name, v->m->v[i].value);
        buf_putc(b, ']');
        break;
    case V_DATA: buf_puts(b, "{...}"); break;
    default: buf_puts(b, "<no value>"); break;
    }
}

static bool tmpl_truth(const tmpl_val_t *v)
{
    switch (v->k) {
    case V_STR: return v->n > 0;
    case V_FLOAT: return v->f != 0;
    case V_INT: return v->i != 0;
    case V_BOOL: return v->b;
    case V_MAP: return v->m && v->m->n > 0;
    case V_DATA: return true;
    default: return false;
    }
}

/* convertToFloat in Prometheus' template.go */
static double tmpl_to_float(tmpl_exec_t *x, int pos, const char *fn, const tmpl_val_t *v)
{
    switch (v->k) {
    case V_FLOAT: return v->f;
    case V_INT: return (double)v->i;
    case V_STR: {
        char tmp[128];
        if (v->n < sizeof(tmp)) {
            memcpy(tmp, v->s, v->n);
            tmp[v->n] = 0;
            char *end;
            double d = strtod(tmp, &end);
            if (v->n > 0 && *end == 0 && !isspace((unsigned char)tmp[0]))
                return d;
            if (strcmp(tmp, "+Inf") == 0 || strcmp(tmp, "Inf") == 0)
                return INFINITY;
            if (strcmp(tmp, "-Inf") == 0)
                return -INFINITY;
            if (strcmp(tmp, "NaN") == 0)
                return NAN;
        }
        tmpl_xerr(x, pos, "error calling %s: strconv.ParseFloat: parsing \"%.*s\": invalid syntax", fn,
                  (int)(v->n > 64 ? 64 : v->n), v->s);
    }
    default: tmpl_xerr(x, pos, "error calling %s: can't convert %s to float", fn, tmpl_type_name(v->k));
    }
}

static tmpl_val_t tmpl_field(tmpl_exec_t *x, int pos, tmpl_val_t v, const char *f)
{
    if (v.k == V_DATA) {
        if (strcmp(f, "Labels") == 0)
            return (tmpl_val_t){.k = V_MAP, .m = x->d->labels};
        if (strcmp(f, "ExternalLabels") == 0)
            return (tmpl_val_t){.k = V_MAP, .m = x->d->external_labels};
        if (strcmp(f, "ExternalURL") == 0) {
            const char *u = x->d->external_url ? x->d->external_url : "";
            return tmpl_str(u, strlen(u));
        }
        if (strcmp(f, "Value") == 0)
            return (tmpl_val_t){.k = V_FLOAT, .f = x->d->value};
        tmpl_xerr(x, pos, "can't evaluate field %s in type template.tmplData", f);
    }
    if (v.k == V_MAP) {
        const char *s = v.m ? labels_get(v.m, f) : NULL;
        return tmpl_str(s ? s : "", s ? strlen(s) : 0);
    }
    if (v.k == V_NONE)
        tmpl_xerr(x, pos, "nil pointer evaluating interface {}.%s", f);
    tmpl_xerr(x, pos, "can't evaluate field %s in type %s", f, tmpl_type_name(v.k));
}

/* --- functions ------------------------------------------------------------------------------------------ */

static void tmpl_humanize(buf_t *b, double v, bool binary)
{
    if (v == 0 || isinf(v) || isnan(v)) {
        tmpl_fmt4g(b, v, "");
        return;
    }
    if (binary) {
        if (fabs(v) <= 1) {
            tmpl_fmt4g(b, v, "");
            return;
        }
        static const char *const p2[] = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"};
        const char *prefix = "";
        for (int i = 0; i < 8; i++) {
            if (fabs(v) < 1024)
                break;
            prefix = p2[i];
            v /= 1024;
        }
        tmpl_fmt4g(b, v, prefix);
        return;
    }
    const char *prefix = "";
    if (fabs(v) >= 1) {
        static const char *const big[] = {"k", "M", "G", "T", "P", "E", "Z", "Y"};
        for (int i = 0; i < 8; i++) {
            if (fabs(v) < 1000)
                break;
            prefix = big[i];
            v /= 1000;
        }
    } else {
        static const char *const small[] = {"m", "u", "n", "p", "f", "a", "z", "y"};
        for (int i = 0; i < 8; i++) {
            if (fabs(v) >= 1)
                break;
            prefix = small[i];
            v *= 1000;
        }
    }
    tmpl_fmt4g(b, v, prefix);
}

static void tmpl_humanize_duration(buf_t *b, double v)
{
    if (isinf(v) || isnan(v)) {
        tmpl_fmt4g(b, v, "");
        return;
    }
    if (v == 0) {
        tmpl_fmt4g(b, v, "s");
        return;
    }
    if (fabs(v) >= 1) {
        const char *sign = "";
        if (v < 0) {
            sign = "-";
            v = -v;
        }
        int64_t d = (int64_t)v;
        int64_t sec = d % 60, min = (d / 60) % 60, hours = (d / 3600) % 24, days = d / 86400;
        if (days)
            buf_printf(b, "%s%" PRId64 "d %" PRId64 "h %" PRId64 "m %" PRId64 "s", sign, days, hours, min, sec);
        else if (hours)
            buf_printf(b, "%s%" PRId64 "h %" PRId64 "m %" PRId64 "s", sign, hours, min, sec);
        else if (min)
            buf_printf(b, "%s%" PRId64 "m %" PRId64 "s", sign, min, sec);
        else {
            buf_puts(b, sign);
            tmpl_fmt4g(b, v, "s");
        }
        return;
    }
    static const char *const small[] = {"m", "u", "n", "p", "f", "a", "z", "y"};
    const char *prefix = "";
    for (int i = 0; i < 8; i++) {
        if (fabs(v) >= 1)
            break;
        prefix = small[i];
        v *= 1000;
    }
    char suf[8];
    snprintf(suf, sizeof(suf), "%ss", prefix);
    tmpl_fmt4g(b, v, suf);
}

/* Go's time.Time String() in UTC: "2006-01-02 15:04:05.999999999 +0000 UTC". */
static void tmpl_humanize_timestamp(buf_t *b, double v)
{
    if (isinf(v) || isnan(v)) {
        tmpl_fmt4g(b, v, "");
        return;
    }
    /* model.TimeFromUnixNano(int64(v * 1e9)): millisecond precision, truncated. */
    int64_t ms = (int64_t)(v * 1e9) / 1000000;
    int64_t msf = ms % 1000;
    time_t s = (time_t)(ms / 1000);
    if (msf < 0) {
        msf += 1000;
        s--;
    }
    long ns = (long)msf * 1000000L;
    struct tm tm;
    gmtime_r(&s, &tm);
    buf_printf(b, "%04d-%02d-%02d %02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
               tm.tm_sec);
    if (ns) {
        char frac[32];
        snprintf(frac, sizeof(frac), "%09ld", ns);
        size_t l = strlen(frac);
        while (l > 0 && frac[l - 1] == '0')
            frac[--l] = 0;
        buf_printf(b, ".%s", frac);
    }
    buf_puts(b, " +0000 UTC");
}

/* Go's fmt.Sprintf for the verbs people use in alert text. */
static void tmpl_printf(tmpl_exec_t *x, buf_t *b, const char *fmt, size_t flen, const tmpl_val_t *args, size_t nargs)
{
    size_t ai = 0;
    for (size_t i = 0; i < flen; i++) {
        if (fmt[i] != '%') {
            buf_putc(b, fmt[i]);
            continue;
        }
        size_t st = i++;
        char spec[32];
        size_t sl = 0;
        spec[sl++] = '%';
        while (i < flen && strchr("+-# 0", fmt[i]) && sl < 8)
            spec[sl++] = fmt[i++];
        while (i < flen && isdigit((unsigned char)fmt[i]) && sl < 16)
            spec[sl++] = fmt[i++];
        bool has_prec = false;
        if (i < flen && fmt[i] == '.') {
            has_prec = true;
            spec[sl++] = fmt[i++];
            while (i < flen && isdigit((unsigned char)fmt[i]) && sl < 24)
                spec[sl++] = fmt[i++];
        }
        if (i >= flen) {
            buf_puts(b, "%!(NOVERB)");
            break;
        }
        char verb = fmt[i];
        if (verb == '%') {
            buf_putc(b, '%');
            continue;
        }
        if (ai >= nargs) {
            buf_printf(b, "%%!%c(MISSING)", verb);
            continue;
        }
        const tmpl_val_t *v = &args[ai++];
        char cspec[40];
        bool bad = false;
        switch (v->k) {
        case V_FLOAT:
            if (strchr("eEfFgG", verb) && !(strchr("gG", verb) && !has_prec)) {
                snprintf(cspec, sizeof(cspec), "%.*s%c", (int)sl, spec, verb);
                if (isnan(v->f) || isinf(v->f))
                    tmpl_print(b, &(tmpl_val_t){.k = V_STR,
                                                .s = isnan(v->f) ? "NaN"
                                                     : v->f > 0  ? "+Inf"
                                                                 : "-Inf",
                                                .n = isnan(v->f) ? 3 : 4});
                else
                    buf_printf(b, cspec, v->f);
            } else if (verb == 'v' || verb == 'g' || verb == 'G') {
                buf_t t = BUF_INIT;
                buf_put_float(&t, v->f);
                snprintf(cspec, sizeof(cspec), "%.*ss", (int)sl, spec);
                buf_printf(b, cspec, t.data);
                buf_free(&t);
            } else {
                bad = true;
            }
            break;
        case V_INT:
            if (strchr("dxXoc", verb)) {
                snprintf(cspec, sizeof(cspec), "%.*sll%c", (int)sl, spec, verb == 'c' ? 'c' : verb);
                if (verb == 'c')
                    buf_putc(b, (char)v->i);
                else
                    buf_printf(b, cspec, (long long)v->i);
            } else if (verb == 'v') {
                snprintf(cspec, sizeof(cspec), "%.*slld", (int)sl, spec);
                buf_printf(b, cspec, (long long)v->i);
            } else {
                bad = true;
            }
            break;
        case V_STR:
            if (verb == 's' || verb == 'v') {
                snprintf(cspec, sizeof(cspec), "%.*s.*s", (int)sl, spec);
                if (has_prec) {
                    snprintf(cspec, sizeof(cspec), "%.*ss", (int)sl, spec);
                    char *tmp = arena_strndup(x->a, v->s, v->n);
                    buf_printf(b, cspec, tmp);
                } else {
                    char *tmp = arena_strndup(x->a, v->s, v->n);
                    snprintf(cspec, sizeof(cspec), "%.*ss", (int)sl, spec);
                    buf_printf(b, cspec, tmp);
                }
            } else if (verb == 'q') {
                buf_put_json_string(b, v->s, v->n);
            } else if (verb == 'x' || verb == 'X') {
                for (size_t k = 0; k < v->n; k++)
                    buf_printf(b, verb == 'x' ? "%02x" : "%02X", (unsigned char)v->s[k]);
            } else {
                bad = true;
            }
            break;
        case V_BOOL:
            if (verb == 't' || verb == 'v')
                buf_puts(b, v->b ? "true" : "false");
            else
                bad = true;
            break;
        default:
            if (verb == 'v' || verb == 's')
                tmpl_print(b, v);
            else
                bad = true;
        }
        if (bad) {
            buf_printf(b, "%%!%c(%s=", verb, tmpl_type_name(v->k));
            tmpl_print(b, v);
            buf_putc(b, ')');
        }
        (void)st;
    }
    if (ai < nargs) {
        buf_puts(b, "%!(EXTRA ");
        for (size_t k = ai; k < nargs; k++) {
            buf_printf(b, "%s%s=", k > ai ? ", " : "", tmpl_type_name(args[k].k));
            tmpl_print(b, &args[k]);
        }
        buf_putc(b, ')');
    }
}

static int tmpl_cmp_basic(tmpl_exec_t *x, int pos, const char *fn, const tmpl_val_t *a, const tmpl_val_t *b,
                          bool ordered)
{
    if ((a->k == V_FLOAT || a->k == V_INT) && a->k != b->k && (b->k == V_FLOAT || b->k == V_INT))
        tmpl_xerr(x, pos, "error calling %s: incompatible types for comparison", fn);
    if (a->k != b->k)
        tmpl_xerr(x, pos, "error calling %s: incompatible types for comparison", fn);
    switch (a->k) {
    case V_FLOAT: return a->f < b->f ? -1 : a->f > b->f ? 1 : (a->f == b->f ? 0 : 2);
    case V_INT: return a->i < b->i ? -1 : a->i > b->i ? 1 : 0;
    case V_STR: {
        size_t n = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, n);
        if (c == 0)
            c = a->n < b->n ? -1 : a->n > b->n ? 1 : 0;
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    case V_BOOL:
        if (ordered)
            tmpl_xerr(x, pos, "error calling %s: invalid type for comparison", fn);
        return a->b == b->b ? 0 : 1;
    default: tmpl_xerr(x, pos, "error calling %s: invalid type for comparison", fn);
    }
}

static void tmpl_want_args(tmpl_exec_t *x, int pos, const char *fn, size_t got, size_t want)
{
    if (got != want)
        tmpl_xerr(x, pos, "wrong number of args for %s: want %zu got %zu", fn, want, got);
}

static const char *tmpl_cstr(tmpl_exec_t *x, int pos, const char *fn, const tmpl_val_t *v)
{
    if (v->k != V_STR)
        tmpl_xerr(x, pos, "wrong type for value; expected string; got %s", tmpl_type_name(v->k));
    (void)fn;
    return arena_strndup(x->a, v->s, v->n);
}

/* Go's regexp.Compile (unanchored); a refused pattern is the function's error, as in Go: `match`
 * returns Compile's error, `reReplaceAll` calls MustCompile, whose panic text wraps it in
 * "regexp: Compile(`re`): " (re in backquotes when strconv.CanBackquote, else Go-quoted; the
 * rare second form is approximated with C escapes). */
static regex_prog_t *tmpl_regex(tmpl_exec_t *x, int pos, const char *fn, const char *re, bool must)
{
    regex_prog_t *c;
    char err[256];
    if (regex_compile(re, 0, &c, err, sizeof(err)) == REGEX_OK)
        return c;
    if (!must)
        tmpl_xerr(x, pos, "error calling %s: %s", fn, err);
    bool backquote = true;
    for (const char *p = re; *p; p++)
        if (*p == '`' || ((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f)
            backquote = false;
    if (backquote)
        tmpl_xerr(x, pos, "error calling %s: regexp: Compile(`%s`): %s", fn, re, err);
    buf_t q = BUF_INIT;
    buf_put_json_string(&q, re, strlen(re));
    char *qs = arena_strndup(x->a, q.data, q.len);
    buf_free(&q);
    tmpl_xerr(x, pos, "error calling %s: regexp: Compile(%s): %s", fn, qs, err);
}

static tmpl_val_t tmpl_call(tmpl_exec_t *x, int pos, const char *fn, tmpl_val_t *av, size_t n)
{
    buf_t b = BUF_INIT; /* allocated only by the functions that return a new string */
    if (strcmp(fn, "humanize") == 0 || strcmp(fn, "humanize1024") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        tmpl_humanize(&b, tmpl_to_float(x, pos, fn, &av[0]), fn[8] == '1');
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "humanizePercentage") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        tmpl_fmt4g(&b, tmpl_to_float(x, pos, fn, &av[0]) * 100, "%");
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "humanizeDuration") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        tmpl_humanize_duration(&b, tmpl_to_float(x, pos, fn, &av[0]));
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "humanizeTimestamp") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        tmpl_humanize_timestamp(&b, tmpl_to_float(x, pos, fn, &av[0]));
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "printf") == 0) {
        if (n < 1)
            tmpl_xerr(x, pos, "wrong number of args for printf: want at least 1 got 0");
        if (av[0].k != V_STR)
            tmpl_xerr(x, pos, "wrong type for value; expected string; got %s", tmpl_type_name(av[0].k));
        tmpl_printf(x, &b, av[0].s, av[0].n, av + 1, n - 1);
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "print") == 0 || strcmp(fn, "println") == 0) {
        for (size_t i = 0; i < n; i++) {
            /* Go's Sprint adds spaces between operands when neither is a string. */
            if (i > 0 && (fn[5] == 'l' || (av[i - 1].k != V_STR && av[i].k != V_STR)))
                buf_putc(&b, ' ');
            tmpl_print(&b, &av[i]);
        }
        if (fn[5] == 'l')
            buf_putc(&b, '\n');
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "toUpper") == 0 || strcmp(fn, "toLower") == 0 || strcmp(fn, "title") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        const char *s = tmpl_cstr(x, pos, fn, &av[0]);
        bool start = true;
        for (size_t i = 0; s[i]; i++) {
            char c = s[i];
            if (fn[2] == 'U')
                c = (char)toupper((unsigned char)c);
            else if (fn[2] == 'L')
                c = (char)tolower((unsigned char)c);
            else {
                if (start && isalpha((unsigned char)c))
                    c = (char)toupper((unsigned char)c);
                start = !(isalnum((unsigned char)c) || c == '_' || c == '\'' || (unsigned char)c >= 0x80);
            }
            buf_putc(&b, c);
        }
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "stripPort") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        const char *s = tmpl_cstr(x, pos, fn, &av[0]);
        const char *colon = strrchr(s, ':');
        if (s[0] == '[') {
            const char *rb = strchr(s, ']');
            if (rb && rb[1] == ':')
                return tmpl_str(s + 1, (size_t)(rb - s - 1));
            return tmpl_str(s, strlen(s));
        }
        if (colon && strchr(s, ':') == colon)
            return tmpl_str(s, (size_t)(colon - s));
        return tmpl_str(s, strlen(s));
    }
    if (strcmp(fn, "match") == 0) {
        /* regexp.MatchString(pattern, s): a search, not anchored. */
        tmpl_want_args(x, pos, fn, n, 2);
        const char *re = tmpl_cstr(x, pos, fn, &av[0]);
        const char *s = tmpl_cstr(x, pos, fn, &av[1]);
        regex_prog_t *c = tmpl_regex(x, pos, fn, re, false);
        bool hit = regex_search(c, s, strlen(s), 0, NULL, 0);
        regex_free(c);
        return (tmpl_val_t){.k = V_BOOL, .b = hit};
    }
    if (strcmp(fn, "reReplaceAll") == 0) {
        /* regexp.MustCompile(pattern).ReplaceAllString(text, repl) */
        tmpl_want_args(x, pos, fn, n, 3);
        const char *re = tmpl_cstr(x, pos, fn, &av[0]);
        const char *repl = tmpl_cstr(x, pos, fn, &av[1]);
        const char *s = tmpl_cstr(x, pos, fn, &av[2]);
        regex_prog_t *c = tmpl_regex(x, pos, fn, re, true);
        regex_replace_all(c, &b, s, strlen(s), repl);
        regex_free(c);
        return tmpl_bufstr(x, &b);
    }
    if (strcmp(fn, "len") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        if (av[0].k == V_STR)
            return (tmpl_val_t){.k = V_INT, .i = (int64_t)av[0].n};
        if (av[0].k == V_MAP)
            return (tmpl_val_t){.k = V_INT, .i = av[0].m ? (int64_t)av[0].m->n : 0};
        tmpl_xerr(x, pos, "error calling len: len of type %s", tmpl_type_name(av[0].k));
    }
    if (strcmp(fn, "not") == 0) {
        tmpl_want_args(x, pos, fn, n, 1);
        return (tmpl_val_t){.k = V_BOOL, .b = !tmpl_truth(&av[0])};
    }
    if (strcmp(fn, "and") == 0 || strcmp(fn, "or") == 0) {
        if (n < 1)
            tmpl_xerr(x, pos, "wrong number of args for %s: want at least 1 got 0", fn);
        bool is_and = fn[0] == 'a';
        for (size_t i = 0; i < n - 1; i++)
            if (tmpl_truth(&av[i]) != is_and)
                return av[i];
        return av[n - 1];
    }
    if (strcmp(fn, "eq") == 0) {
        if (n < 2)
            tmpl_xerr(x, pos, "error calling eq: missing argument for comparison");
        for (size_t i = 1; i < n; i++)
            if (tmpl_cmp_basic(x, pos, fn, &av[0], &av[i], false) == 0)
                return (tmpl_val_t){.k = V_BOOL, .b = true};
        return (tmpl_val_t){.k = V_BOOL, .b = false};
    }
    if (fn[0] == 'n' || fn[0] == 'l' || fn[0] == 'g') { /* ne lt le gt ge */
        tmpl_want_args(x, pos, fn, n, 2);
        int c = tmpl_cmp_basic(x, pos, fn, &av[0], &av[1], fn[0] != 'n');
        bool r;
        if (strcmp(fn, "ne") == 0)
            r = c != 0;
        else if (strcmp(fn, "lt") == 0)
            r = c == -1;
        else if (strcmp(fn, "le") == 0)
            r = c == -1 || c == 0;
        else if (strcmp(fn, "gt") == 0)
            r = c == 1;
        else
            r = c == 1 || c == 0;
        return (tmpl_val_t){.k = V_BOOL, .b = r};
    }
    tmpl_xerr(x, pos, "function \"%s\" not defined", fn);
}

/* --- execution -------------------------------------------------------------------------------------------- */

static tmpl_val_t tmpl_eval_pipe(tmpl_exec_t *x, const tmpl_pipe_t *p);

static tmpl_val_t tmpl_var(tmpl_exec_t *x, int pos, const char *name)
{
    for (int i = x->nvars - 1; i >= 0; i--)
        if (strcmp(x->vnames[i], name) == 0)
            return x->vvals[i];
    tmpl_xerr(x, pos, "undefined variable \"$%s\"", name);
}

static tmpl_val_t tmpl_eval_arg(tmpl_exec_t *x, const tmpl_arg_t *a)
{
    tmpl_val_t v;
    switch (a->kind) {
    case A_VAR: v = tmpl_var(x, a->pos, a->s); break;
    case A_FIELD:
    case A_DOT: v = (tmpl_val_t){.k = V_DATA}; break;
    case A_STRING: return tmpl_str(a->s, a->slen);
    case A_NUMBER:
        if (a->is_int)
            return (tmpl_val_t){.k = V_INT, .i = a->inum};
        return (tmpl_val_t){.k = V_FLOAT, .f = a->num};
    case A_BOOL: return (tmpl_val_t){.k = V_BOOL, .b = a->b};
    case A_NIL: tmpl_xerr(x, a->pos, "nil is not a command");
    case A_PIPE: v = tmpl_eval_pipe(x, a->pipe); break;
    case A_IDENT: return tmpl_call(x, a->pos, a->s, NULL, 0);
    default: tmpl_xerr(x, a->pos, "bad argument");
    }
    for (size_t i = 0; i < a->nfields; i++)
        v = tmpl_field(x, a->pos, v, a->fields[i]);
    return v;
}

static tmpl_val_t tmpl_eval_cmd(tmpl_exec_t *x, const tmpl_cmd_t *c, const tmpl_val_t *piped)
{
    const tmpl_arg_t *first = &c->args[0];
    if (first->kind == A_IDENT) {
        size_t n = c->nargs - 1 + (piped ? 1 : 0);
        tmpl_val_t *av = arena_calloc(x->a, n ? n : 1, sizeof(*av));
        for (size_t i = 1; i < c->nargs; i++)
            av[i - 1] = tmpl_eval_arg(x, &c->args[i]);
        if (piped)
            av[n - 1] = *piped;
        return tmpl_call(x, first->pos, first->s, av, n);
    }
    if (c->nargs > 1)
        tmpl_xerr(x, c->args[1].pos, "can't give argument to non-function %.*s", 20, x->t->text + first->pos);
    if (piped)
        tmpl_xerr(x, first->pos, "can't give argument to non-function");
    return tmpl_eval_arg(x, first);
}

static tmpl_val_t tmpl_eval_pipe(tmpl_exec_t *x, const tmpl_pipe_t *p)
{
    tmpl_val_t v = {0};
    for (size_t i = 0; i < p->ncmds; i++)
        v = tmpl_eval_cmd(x, &p->cmds[i], i ? &v : NULL);
    if (p->decl) {
        if (x->nvars >= TMPL_MAX_VARS)
            tmpl_xerr(x, p->pos, "too many variables");
        x->vnames[x->nvars] = p->decl;
        x->vvals[x->nvars++] = v;
    }
    return v;
}

static void tmpl_exec_list(tmpl_exec_t *x, const tmpl_list_t *l)
{
    for (size_t i = 0; l && i < l->n; i++) {
        const tmpl_node_t *nd = l->v[i];
        switch (nd->kind) {
        case N_TEXT: buf_append(x->out, nd->text, nd->len); break;
        case N_ACTION: {
            tmpl_val_t v = tmpl_eval_pipe(x, nd->pipe);
            if (!nd->pipe->decl)
                tmpl_print(x->out, &v);
            break;
        }
        case N_IF: {
            int saved = x->nvars;
            tmpl_val_t v = tmpl_eval_pipe(x, nd->pipe);
            tmpl_exec_list(x, tmpl_truth(&v) ? nd->then : nd->els);
            x->nvars = saved;
            break;
        }
        }
    }
}

int rules_tmpl_exec(const rules_tmpl_t *t, const rules_tmpl_data_t *d, buf_t *out, char *err, size_t errlen)
{
    tmpl_exec_t *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    x->t = t;
    x->d = d;
    x->out = out;
    x->err = err;
    x->errlen = errlen;
    x->a = arena_create(0);
    const char *eu = d->external_url ? d->external_url : "";
    x->vnames[0] = "";
    x->vvals[0] = (tmpl_val_t){.k = V_DATA};
    x->vnames[1] = "labels";
    x->vvals[1] = (tmpl_val_t){.k = V_MAP, .m = d->labels};
    x->vnames[2] = "externalLabels";
    x->vvals[2] = (tmpl_val_t){.k = V_MAP, .m = d->external_labels};
    x->vnames[3] = "externalURL";
    x->vvals[3] = tmpl_str(eu, strlen(eu));
    x->vnames[4] = "value";
    x->vvals[4] = (tmpl_val_t){.k = V_FLOAT, .f = d->value};
    x->nvars = 5;
    int rc = 0;
    if (!x->a) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    } else if (setjmp(x->jb)) {
        rc = -1;
    } else {
        tmpl_exec_list(x, t->root);
    }
    if (x->a)
        arena_destroy(x->a);
    free(x);
    return rc;
}

int rules_tmpl_expand(const char *name, const char *text, const rules_tmpl_data_t *d, buf_t *out)
{
    if (rules_tmpl_is_plain(text)) {
        buf_puts(out, text);
        return 0;
    }
    char err[512];
    rules_tmpl_t *t = rules_tmpl_parse(name, text, err, sizeof(err));
    if (!t) {
        buf_printf(out, "<error expanding template: error parsing template %s: %s>", name, err);
        return -1;
    }
    size_t mark = out->len;
    int rc = rules_tmpl_exec(t, d, out, err, sizeof(err));
    rules_tmpl_free(t);
    if (rc != 0) {
        out->len = mark;
        if (out->data)
            out->data[mark] = 0;
        buf_printf(out, "<error expanding template: error executing template %s: %s>", name, err);
        return -1;
    }
    return 0;
}
