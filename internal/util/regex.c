/*
 * regex — Go's template expansion and global replacement on top of the RE2 shim (regex_re2.cc);
 * see regex.h. Both follow Go's regexp package line by line, because label_replace and the
 * template function reReplaceAll must produce Prometheus' bytes:
 *
 *   expand:       "$$" -> "$"; "$" name or "${" name "}" with name = [\pL\p{Nd}_]+ -> group:
 *                 all digits (no leading zero, < 1e8) -> by number, else by name (the first
 *                 group of that name that took part); unknown or unmatched -> ""; anything
 *                 else after "$" -> "$" copied and scanning goes on.
 *   replace_all:  search from pos; copy the text up to the match, then the expansion unless the
 *                 match is empty and ends where the previous one ended; advance past the match,
 *                 at least one character (one UTF-8 sequence, or one byte if invalid).
 */
#include "internal/util/regex.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal/util/utf8.h"

/* Go's regexp.extract: parses "name" or "{name}" at t; returns false when malformed. */
static bool expand_extract(const char *t, const char **name, size_t *namelen, long *num, const char **rest)
{
    bool brace = false;
    if (*t == '{') {
        brace = true;
        t++;
    }
    size_t i = 0, len = strlen(t), w;
    while (i < len && (w = regex__name_char(t + i, len - i)) > 0)
        i += w;
    if (i == 0)
        return false;
    *name = t;
    *namelen = i;
    if (brace) {
        if (t[i] != '}')
            return false;
        *rest = t + i + 1;
    } else {
        *rest = t + i;
    }
    long n = 0;
    for (size_t k = 0; k < i; k++) {
        if (t[k] < '0' || t[k] > '9' || n >= 100000000) {
            n = -1;
            break;
        }
        n = n * 10 + (t[k] - '0');
    }
    if (t[0] == '0' && i > 1)
        n = -1;
    *num = n;
    return true;
}

static void put_group(buf_t *dst, const char *src, const regex_span_t *sp, size_t nsp, long g)
{
    if (g >= 0 && (size_t)g < nsp && sp[g].start >= 0)
        buf_append(dst, src + sp[g].start, (size_t)(sp[g].end - sp[g].start));
}

void regex_expand(const regex_prog_t *re, buf_t *dst, const char *tmpl, const char *src, const regex_span_t *sp,
                  size_t nsp)
{
    const char *t = tmpl;
    for (;;) {
        const char *d = strchr(t, '$');
        if (!d) {
            buf_puts(dst, t);
            return;
        }
        buf_append(dst, t, (size_t)(d - t));
        t = d + 1;
        if (*t == '$') {
            buf_putc(dst, '$');
            t++;
            continue;
        }
        const char *name, *rest;
        size_t namelen;
        long num;
        if (!expand_extract(t, &name, &namelen, &num, &rest)) {
            buf_putc(dst, '$');
            continue;
        }
        t = rest;
        if (num >= 0) {
            put_group(dst, src, sp, nsp, num);
            continue;
        }
        /* By name: the first group of that name that took part in the match. */
        for (size_t g = 1; g < nsp; g++) {
            const char *gn = regex_group_name(re, g);
            if (gn && strlen(gn) == namelen && memcmp(gn, name, namelen) == 0 && sp[g].start >= 0) {
                put_group(dst, src, sp, nsp, (long)g);
                break;
            }
        }
    }
}

void regex_replace_all(const regex_prog_t *re, buf_t *dst, const char *s, size_t n, const char *tmpl)
{
    size_t ngroups = regex_group_count(re) + 1;
    regex_span_t small[16];
    regex_span_t *sp = small;
    if (ngroups > 16) {
        sp = malloc(ngroups * sizeof(*sp));
        if (!sp)
            abort(); /* as buf_* does: a partial replacement would be a wrong answer */
    }
    size_t last_end = 0, pos = 0;
    while (pos <= n) {
        if (!regex_search(re, s, n, pos, sp, ngroups))
            break;
        size_t ms = (size_t)sp[0].start, me = (size_t)sp[0].end;
        buf_append(dst, s + last_end, ms - last_end);
        if (me > last_end || ms == 0)
            regex_expand(re, dst, tmpl, s, sp, ngroups);
        last_end = me;
        size_t width = 0;
        if (pos < n) {
            width = utf8_decode(s + pos, n - pos, NULL);
            if (width == 0)
                width = 1;
        }
        if (pos + width > me)
            pos += width;
        else if (pos + 1 > me)
            pos++;
        else
            pos = me;
    }
    buf_append(dst, s + last_end, n - last_end);
    if (sp != small)
        free(sp);
}
