/*
 * matcher — Prometheus label matchers (see matcher.h for the semantics).
 *
 * Construction classifies the value once:
 *
 *   kind        used for                     match test
 *   ----------  ---------------------------  ---------------------------------------------
 *   LITERAL     `=`, `!=`, literal regexes   n == litlen && memcmp
 *   SET         `a|b|c` of literals          binary search in a sorted array
 *   ANY         `.*`                         no '\n' in v  (Go's `.` excludes newline)
 *   NONEMPTY    `.+`                         n > 0 and no '\n'
 *   PREFIX      `lit.*`                      starts with lit, no '\n' after it
 *   REGEX       anything else                RE2 (util/regex) on ^(?:re)$
 *
 * The result is negated for `!=` and `!~`. The literal scanner accepts plain bytes and a
 * backslash before any non-alphanumeric ASCII character (`\.` is a literal dot, as in Go); any
 * other metacharacter, escape or flag group sends the regex to RE2. A value that is not valid
 * UTF-8 also goes to RE2, which refuses it as Go does.
 */
#include "internal/labels/matcher.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/regex.h"
#include "internal/util/utf8.h"

typedef enum { K_LITERAL, K_SET, K_ANY, K_NONEMPTY, K_PREFIX, K_REGEX } kind_t;

struct matcher {
    matcher_type_t type;
    kind_t kind;
    bool negate;
    bool matches_empty;
    char *name;
    char *value;
    char *lit; /* LITERAL, PREFIX: unescaped literal */
    size_t litlen;
    char **set; /* SET (and LITERAL, as a 1-element set): sorted, unique */
    size_t nset;
    regex_prog_t *re; /* REGEX */
};

/* ---- literal scanning ---------------------------------------------------------------------- */

static bool is_meta(unsigned char c)
{
    return strchr(".[]{}()*+?^$|\\", c) != NULL && c != 0;
}

/* Unescapes [s, s+n) into out (capacity >= n+1) if it is a plain literal; returns length or -1. */
static long unescape_literal(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') {
            if (i + 1 >= n)
                return -1;
            unsigned char e = (unsigned char)s[i + 1];
            if (e >= 0x80 || (e >= '0' && e <= '9') || (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
                return -1;
            out[o++] = (char)e;
            i++;
        } else if (is_meta(c)) {
            return -1;
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return (long)o;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Splits a regex on '|' into literal alternatives; true if every part is a literal. Fills
 * m->set (sorted, deduplicated). */
static bool try_literal_set(matcher_t *m, const char *re)
{
    size_t n = strlen(re), parts = 1;
    /* An unescaped '|' separates alternatives; count them (escapes never precede '|' here
     * because "\|" is an escaped literal bar). */
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '\\') {
            i++;
            continue;
        }
        if (re[i] == '|')
            parts++;
    }
    char **set = calloc(parts, sizeof(char *));
    if (!set)
        return false;
    size_t k = 0, start = 0;
    bool ok = true;
    for (size_t i = 0; i <= n && ok; i++) {
        if (i < n && re[i] == '\\') {
            i++;
            continue;
        }
        if (i == n || re[i] == '|') {
            char *lit = malloc(i - start + 1);
            if (!lit || unescape_literal(re + start, i - start, lit) < 0) {
                free(lit);
                ok = false;
                break;
            }
            set[k++] = lit;
            start = i + 1;
        }
    }
    if (!ok) {
        for (size_t i = 0; i < k; i++)
            free(set[i]);
        free(set);
        return false;
    }
    qsort(set, k, sizeof(char *), cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++) {
        if (u > 0 && strcmp(set[u - 1], set[i]) == 0)
            free(set[i]);
        else
            set[u++] = set[i];
    }
    m->set = set;
    m->nset = u;
    return true;
}

/* ---- RE2 ------------------------------------------------------------------------------------ */

static int compile_regex(matcher_t *m, const char *re, char *err, size_t errlen)
{
    return regex_compile(re, REGEX_ANCHOR, &m->re, err, errlen) == REGEX_OK ? 0 : -1;
}

/* ---- construction --------------------------------------------------------------------------- */

static bool match_raw(const matcher_t *m, const char *v, size_t n);

static matcher_t *build(matcher_type_t type, const char *name, const char *value, bool fast, char *err, size_t errlen)
{
    char dummy[1];
    if (!err) {
        err = dummy;
        errlen = sizeof(dummy);
    }
    if (type < MATCHER_EQ || type > MATCHER_NRE || !name || !value) {
        snprintf(err, errlen, "invalid matcher");
        return NULL;
    }
    matcher_t *m = calloc(1, sizeof(*m));
    if (!m)
        goto oom;
    m->type = type;
    m->negate = type == MATCHER_NEQ || type == MATCHER_NRE;
    m->name = strdup(name);
    m->value = strdup(value);
    if (!m->name || !m->value)
        goto oom;

    if (type == MATCHER_EQ || type == MATCHER_NEQ) {
        m->kind = K_LITERAL;
        m->lit = strdup(value);
        if (!m->lit)
            goto oom;
        m->litlen = strlen(value);
        m->set = malloc(sizeof(char *));
        if (!m->set || !(m->set[0] = strdup(value)))
            goto oom;
        m->nset = 1;
    } else if (fast && !utf8_valid(value, strlen(value))) {
        m->kind = K_REGEX; /* refused by RE2 ("invalid UTF-8"), as by Go */
        if (compile_regex(m, value, err, errlen) < 0) {
            matcher_free(m);
            return NULL;
        }
    } else if (fast && strcmp(value, ".*") == 0) {
        m->kind = K_ANY;
    } else if (fast && strcmp(value, ".+") == 0) {
        m->kind = K_NONEMPTY;
    } else if (fast && try_literal_set(m, value)) {
        m->kind = K_SET;
        if (m->nset == 1) {
            m->kind = K_LITERAL;
            m->lit = strdup(m->set[0]);
            if (!m->lit)
                goto oom;
            m->litlen = strlen(m->lit);
        }
    } else {
        size_t n = strlen(value);
        char *lit = NULL;
        long ll = -1;
        if (fast && n >= 2 && strcmp(value + n - 2, ".*") == 0 && (n < 3 || value[n - 3] != '\\')) {
            lit = malloc(n);
            if (!lit)
                goto oom;
            ll = unescape_literal(value, n - 2, lit);
        }
        if (ll >= 0) {
            m->kind = K_PREFIX;
            m->lit = lit;
            m->litlen = (size_t)ll;
        } else {
            free(lit);
            m->kind = K_REGEX;
            if (compile_regex(m, value, err, errlen) < 0) {
                matcher_free(m);
                return NULL;
            }
        }
    }
    m->matches_empty = match_raw(m, "", 0) != m->negate;
    return m;
oom:
    snprintf(err, errlen, "out of memory");
    matcher_free(m);
    return NULL;
}

matcher_t *matcher_new(matcher_type_t type, const char *name, const char *value, char *err, size_t errlen)
{
    return build(type, name, value, true, err, errlen);
}

matcher_t *matcher__new_no_fastpath(matcher_type_t type, const char *name, const char *value, char *err, size_t errlen)
{
    return build(type, name, value, false, err, errlen);
}

void matcher_free(matcher_t *m)
{
    if (!m)
        return;
    free(m->name);
    free(m->value);
    free(m->lit);
    for (size_t i = 0; i < m->nset; i++)
        free(m->set[i]);
    free(m->set);
    regex_free(m->re);
    free(m);
}

/* ---- matching ------------------------------------------------------------------------------- */

static bool in_set(const matcher_t *m, const char *v, size_t n)
{
    size_t lo = 0, hi = m->nset;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *s = m->set[mid];
        size_t sl = strlen(s);
        int c = memcmp(s, v, sl < n ? sl : n);
        if (c == 0)
            c = sl < n ? -1 : sl > n ? 1 : 0;
        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

static bool match_raw(const matcher_t *m, const char *v, size_t n)
{
    if (!v)
        v = "", n = 0;
    switch (m->kind) {
    case K_LITERAL: return n == m->litlen && memcmp(v, m->lit, n) == 0;
    case K_SET: return in_set(m, v, n);
    case K_ANY: return memchr(v, '\n', n) == NULL;
    case K_NONEMPTY: return n > 0 && memchr(v, '\n', n) == NULL;
    case K_PREFIX:
        return n >= m->litlen && memcmp(v, m->lit, m->litlen) == 0 &&
               memchr(v + m->litlen, '\n', n - m->litlen) == NULL;
    case K_REGEX: return regex_full_match(m->re, v, n);
    }
    return false;
}

bool matcher_matches(const matcher_t *m, const char *v, size_t n)
{
    return match_raw(m, v, n) != m->negate;
}

bool matcher_matches_empty(const matcher_t *m)
{
    return m->matches_empty;
}

matcher_type_t matcher_type(const matcher_t *m)
{
    return m->type;
}

const char *matcher_name(const matcher_t *m)
{
    return m->name;
}

const char *matcher_value(const matcher_t *m)
{
    return m->value;
}

size_t matcher_literal_set(const matcher_t *m, const char *const **vals)
{
    if (m->kind != K_LITERAL && m->kind != K_SET)
        return 0;
    *vals = (const char *const *)m->set;
    return m->nset;
}

const char *matcher_format(const matcher_t *m, char *buf, size_t len)
{
    static const char *ops[] = {"=", "!=", "=~", "!~"};
    snprintf(buf, len, "%s%s\"%s\"", m->name, ops[m->type], m->value);
    return buf;
}
