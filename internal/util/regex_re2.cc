/*
 * regex_re2 — the C shim over RE2 behind internal/util/regex.h (sluice's C++ is this and floatfmt.cc; see the
 * header for why RE2). It owns compiling with Go's options and messages, matching, searching and
 * group lookup; the template expansion on top lives in regex.c.
 *
 * Go vs RE2, and what is done about each difference:
 *   - error texts: RE2's codes are Go's, its texts are not ("missing )" for Go's "missing
 *     closing )"): go_reason() maps the code to Go's text, error_arg() is the same fragment.
 *   - \C (one byte): RE2 accepts it, Go refuses it. has_backslash_c() refuses it after RE2 has
 *     accepted the rest, so an earlier error is reported first, as Go would.
 *   - budget: RE2 refuses at compile time a pattern whose program does not fit REGEX_MAX_MEM
 *     ("expression too large"; Go, which counts differently, accepts some of those). What RE2
 *     builds later, the reverse program and the DFA caches, falls back to the NFA when it does
 *     not fit: slower, never a different answer (test_regex.c checks this of the libre2 we link).
 *   - out of memory inside RE2 (std::bad_alloc) never crosses into C: compile reports
 *     REGEX_ERR_NOMEM; matching aborts, as buf_* does, since "no match" would be a wrong answer.
 */
#include "internal/util/regex.h"

#include <re2/re2.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>

struct regex_prog {
    re2::RE2 *re;
};

static const char *go_reason(re2::RE2::ErrorCode code)
{
    switch (code) {
    case re2::RE2::ErrorBadEscape: return "invalid escape sequence";
    case re2::RE2::ErrorBadCharClass: return "invalid character class";
    case re2::RE2::ErrorBadCharRange: return "invalid character class range";
    case re2::RE2::ErrorMissingBracket: return "missing closing ]";
    case re2::RE2::ErrorMissingParen: return "missing closing )";
    case re2::RE2::ErrorUnexpectedParen: return "unexpected )";
    case re2::RE2::ErrorTrailingBackslash: return "trailing backslash at end of expression";
    case re2::RE2::ErrorRepeatArgument: return "missing argument to repetition operator";
    case re2::RE2::ErrorRepeatSize: return "invalid repeat count";
    case re2::RE2::ErrorRepeatOp: return "invalid nested repetition operator";
    case re2::RE2::ErrorBadPerlOp: return "invalid or unsupported Perl syntax";
    case re2::RE2::ErrorBadUTF8: return "invalid UTF-8";
    case re2::RE2::ErrorBadNamedCapture: return "invalid named capture group";
    case re2::RE2::ErrorPatternTooLarge: return "expression too large";
    default: return "regexp/syntax: internal error";
    }
}

/* Whether the pattern uses \C outside \Q...\E (where it is literal text). */
static bool has_backslash_c(const char *p)
{
    for (size_t i = 0; p[i]; i++) {
        if (p[i] != '\\')
            continue;
        if (p[i + 1] == 'C')
            return true;
        if (p[i + 1] == 'Q') {
            const char *e = strstr(p + i + 2, "\\E");
            if (!e)
                return false;
            i = (size_t)(e - p) + 1;
            continue;
        }
        if (p[i + 1])
            i++;
    }
    return false;
}

static int compile(const char *pattern, unsigned flags, regex_prog_t **out, char *err, size_t errlen)
{
    std::string text = (flags & REGEX_ANCHOR) ? std::string("^(?:") + pattern + ")$" : std::string(pattern);
    re2::RE2::Options o;
    o.set_encoding(re2::RE2::Options::EncodingUTF8);
    o.set_log_errors(false);
    o.set_max_mem(REGEX_MAX_MEM);
    /* The rest are RE2's defaults and Go's syntax.Perl: not POSIX syntax (so Perl classes,
     * \b, \pN, non-greedy operators), case-sensitive, `.` without "\n", ^ $ at text ends. */
    re2::RE2 *re = new (std::nothrow) re2::RE2(text, o);
    if (!re) {
        snprintf(err, errlen, "out of memory");
        return REGEX_ERR_NOMEM;
    }
    if (!re->ok()) {
        snprintf(err, errlen, "error parsing regexp: %s: `%s`", go_reason(re->error_code()), re->error_arg().c_str());
        delete re;
        return REGEX_ERR_SYNTAX;
    }
    if (has_backslash_c(pattern)) {
        snprintf(err, errlen, "error parsing regexp: %s: `\\C`", go_reason(re2::RE2::ErrorBadEscape));
        delete re;
        return REGEX_ERR_SYNTAX;
    }
    regex_prog_t *r = new (std::nothrow) regex_prog_t;
    if (!r) {
        delete re;
        snprintf(err, errlen, "out of memory");
        return REGEX_ERR_NOMEM;
    }
    r->re = re;
    *out = r;
    return REGEX_OK;
}

extern "C" int regex_compile(const char *pattern, unsigned flags, regex_prog_t **out, char *err, size_t errlen)
{
    char dummy[1];
    if (!err || !errlen) {
        err = dummy;
        errlen = sizeof(dummy);
    }
    *out = nullptr;
    try {
        return compile(pattern, flags, out, err, errlen);
    } catch (...) {
        snprintf(err, errlen, "out of memory");
        return REGEX_ERR_NOMEM;
    }
}

extern "C" void regex_free(regex_prog_t *r)
{
    if (!r)
        return;
    delete r->re;
    delete r;
}

[[noreturn]] static void match_failed(void)
{
    fprintf(stderr, "regex: out of memory while matching\n");
    abort();
}

extern "C" bool regex_full_match(const regex_prog_t *r, const char *s, size_t n)
{
    try {
        return r->re->Match(re2::StringPiece(n ? s : "", n), 0, n, re2::RE2::ANCHOR_BOTH, nullptr, 0);
    } catch (...) {
        match_failed();
    }
}

extern "C" bool regex_search(const regex_prog_t *r, const char *s, size_t n, size_t from, regex_span_t *sp, size_t nsp)
{
    if (from > n)
        return false;
    if (!s)
        s = "";
    size_t want = nsp;
    size_t have = 1 + (size_t)r->re->NumberOfCapturingGroups();
    if (want > have)
        want = have;
    try {
        re2::StringPiece small[16];
        re2::StringPiece *m = small;
        if (want > 16)
            m = new re2::StringPiece[want];
        re2::StringPiece text(s, n);
        bool ok = r->re->Match(text, from, n, re2::RE2::UNANCHORED, m, (int)want);
        if (ok) {
            for (size_t i = 0; i < nsp; i++) {
                if (i < want && m[i].data() != nullptr) {
                    sp[i].start = (long)(m[i].data() - s);
                    sp[i].end = sp[i].start + (long)m[i].size();
                } else {
                    sp[i].start = sp[i].end = -1;
                }
            }
        }
        if (m != small)
            delete[] m;
        return ok;
    } catch (...) {
        match_failed();
    }
}

extern "C" size_t regex_group_count(const regex_prog_t *r)
{
    return (size_t)r->re->NumberOfCapturingGroups();
}

extern "C" const char *regex_group_name(const regex_prog_t *r, size_t i)
{
    try {
        const std::map<int, std::string> &names = r->re->CapturingGroupNames(); /* built once, kept */
        auto it = names.find((int)i);
        return it == names.end() ? nullptr : it->second.c_str();
    } catch (...) {
        match_failed();
    }
}

extern "C" size_t regex__name_char(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    unsigned char c = (unsigned char)s[0];
    if (c < 0x80)
        return (c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) ? 1 : 0;
    /* Go's unicode.IsLetter is \pL, unicode.IsDigit is \p{Nd}. Built once, thread-safe (C++11). */
    try {
        static const re2::RE2 name_char("[\\pL\\p{Nd}]");
        re2::StringPiece m;
        if (!name_char.Match(re2::StringPiece(s, n), 0, n, re2::RE2::ANCHOR_START, &m, 1))
            return 0;
        return m.size();
    } catch (...) {
        match_failed();
    }
}
