/*
 * matcher — Prometheus label matchers: `=`, `!=`, `=~`, `!~`.
 *
 * Semantics are Prometheus 2.42's:
 *  - A regex is fully anchored: `=~"re"` matches a value v iff v matches ^(?:re)$ as a whole.
 *    Syntax and semantics are Go's regexp (RE2, through internal/util/regex.h): `.` does not
 *    match "\n", `$` is end of text. What Go refuses (backreferences, look-arounds, (?R), \C) is
 *    refused here with Go's message, and matching is linear-time, so it never gives up.
 *  - A series that lacks the label is matched as if the label's value were "" — so a matcher that
 *    matches the empty string (`x=""`, `x!="a"`, `x=~".*"`, `x!~".+"`) also selects series
 *    without label x. matcher_matches_empty() tells callers which case they are in.
 *
 * Fast paths decided once at construction, so matching a value rarely reaches RE2:
 * `.*` (any value without "\n"), `.+`, a literal (`foo`, `foo\.bar`), a literal prefix
 * (`foo.*`), and an alternation of literals (`a|b|c`, binary search in a sorted set). Any other
 * regex is compiled once with RE2.
 *
 * A matcher owns copies of its name and value; it is immutable after matcher_new, so one matcher
 * may be used from many threads at once.
 */
#ifndef SLUICE_LABELS_MATCHER_H
#define SLUICE_LABELS_MATCHER_H

#include <stdbool.h>
#include <stddef.h>

/* Values equal remote read's LabelMatcher.Type (EQ=0, NEQ=1, RE=2, NRE=3). */
typedef enum {
    MATCHER_EQ = 0,
    MATCHER_NEQ = 1,
    MATCHER_RE = 2,
    MATCHER_NRE = 3,
} matcher_type_t;

typedef struct matcher matcher_t;

/* Builds a matcher; copies name and value. Returns NULL with a message in err on a bad regex
 * ("error parsing regexp: ...") or OOM. Free with matcher_free. */
matcher_t *matcher_new(matcher_type_t type, const char *name, const char *value, char *err, size_t errlen);
/* m may be NULL. */
void matcher_free(matcher_t *m);

matcher_type_t matcher_type(const matcher_t *m);
/* Owned by the matcher. */
const char *matcher_name(const matcher_t *m);
const char *matcher_value(const matcher_t *m);

/* Does value v (n bytes; v may be NULL when the label is absent, meaning "") match? */
bool matcher_matches(const matcher_t *m, const char *v, size_t n);
/* Same as matcher_matches(m, "", 0), precomputed. */
bool matcher_matches_empty(const matcher_t *m);

/* When the matcher is decided by a finite literal set S — `=` (S = {value}) and `=~` of a literal
 * or an alternation of literals — returns |S| and points *vals at S (sorted, owned by the matcher);
 * the matcher selects values in S (EQ/RE) or values not in S (NEQ/NRE). Returns 0 otherwise. */
size_t matcher_literal_set(const matcher_t *m, const char *const **vals);

/* "name=\"value\"" style rendering (op = = != =~ !~), into buf; returns buf. */
const char *matcher_format(const matcher_t *m, char *buf, size_t len);

/* Shared inside labels/ and with tests: a matcher that skips every fast path (always RE2 for
 * regex types), to check the fast paths agree with RE2. */
matcher_t *matcher__new_no_fastpath(matcher_type_t type, const char *name, const char *value, char *err, size_t errlen);

#endif
