/*
 * expfmt family — what the text and protobuf parsers share: Content-Type dispatch, type names,
 * Go-compatible number parsing and quoting (so errors read like the Pushgateway's), and the
 * duplicate-series check over one parsed body.
 *
 * Number syntax accepted by expfmt__parse_float (Go's strconv.ParseFloat minus what
 * prometheus/common rejects up front: any 'p', 'P' or '_', hence no hex floats):
 *
 *   [+-] ( inf | infinity )          case-insensitive
 *   nan                              case-insensitive, no sign
 *   [+-] ( d+ [ . d* ] | . d+ ) [ (e|E) [+-] d+ ]
 *
 * Overflow ("1e400") is an error as in Go; underflow rounds to 0 or a subnormal silently.
 * Conversion, cheapest first: Clinger's fast path (mantissa <= 2^53, |exp10| <= 22 is exact in
 * doubles) for integers and short decimals; exact 128-bit integer arithmetic with round-half-even
 * (exact_u64_pow10) for up to 19 significant digits and |exp10| <= 19, which is what Java's
 * Double.toString prints for measured values (Flink's gauges and quantiles); strtod (C locale,
 * correctly rounded like Go) for the rest.
 */
#include "internal/expfmt/family.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "internal/util/utf8.h"
#include "internal/util/hashmap.h"

/* ------------------------------------------------------------------ content type, type names */

static bool ci_eq(const char *a, size_t an, const char *b)
{
    size_t bn = strlen(b);
    if (an != bn)
        return false;
    for (size_t i = 0; i < an; i++) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z')
            x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (char)(y - 'A' + 'a');
        if (x != y)
            return false;
    }
    return true;
}

static void trim(const char **s, const char **e)
{
    while (*s < *e && (**s == ' ' || **s == '\t'))
        (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
        (*e)--;
}

expfmt_format_t expfmt_format_from_content_type(const char *ct)
{
    if (!ct)
        return EXPFMT_FORMAT_TEXT;
    const char *end = ct + strlen(ct);
    const char *semi = memchr(ct, ';', (size_t)(end - ct));
    const char *ms = ct, *me = semi ? semi : end;
    trim(&ms, &me);
    if (ci_eq(ms, (size_t)(me - ms), "application/openmetrics-text"))
        return EXPFMT_FORMAT_OPENMETRICS;
    if (!ci_eq(ms, (size_t)(me - ms), "application/vnd.google.protobuf"))
        return EXPFMT_FORMAT_TEXT;
    bool proto_ok = false, enc_ok = false;
    const char *p = semi;
    while (p && p < end) {
        const char *ks = p + 1;
        const char *next = memchr(ks, ';', (size_t)(end - ks));
        const char *pe = next ? next : end;
        const char *eq = memchr(ks, '=', (size_t)(pe - ks));
        if (eq) {
            const char *ke = eq, *vs = eq + 1, *ve = pe;
            trim(&ks, &ke);
            trim(&vs, &ve);
            if (ve - vs >= 2 && *vs == '"' && ve[-1] == '"') {
                vs++;
                ve--;
            }
            size_t vn = (size_t)(ve - vs);
            /* Parameter names are case-insensitive, values are compared exactly, as Go's
             * mime.ParseMediaType + the Pushgateway's map lookups do. */
            if (ci_eq(ks, (size_t)(ke - ks), "proto"))
                proto_ok = vn == 33 && memcmp(vs, "io.prometheus.client.MetricFamily", 33) == 0;
            else if (ci_eq(ks, (size_t)(ke - ks), "encoding"))
                enc_ok = vn == 9 && memcmp(vs, "delimited", 9) == 0;
        }
        p = next;
    }
    return proto_ok && enc_ok ? EXPFMT_FORMAT_PROTO_DELIM : EXPFMT_FORMAT_TEXT;
}

const char *expfmt_type_name(expfmt_type_t t)
{
    switch (t) {
    case EXPFMT_COUNTER: return "counter";
    case EXPFMT_GAUGE: return "gauge";
    case EXPFMT_SUMMARY: return "summary";
    case EXPFMT_HISTOGRAM: return "histogram";
    case EXPFMT_GAUGE_HISTOGRAM: return "gaugehistogram";
    case EXPFMT_INFO: return "info";
    case EXPFMT_STATESET: return "stateset";
    case EXPFMT_UNKNOWN: return "unknown";
    case EXPFMT_UNTYPED: break;
    }
    return "untyped";
}

const char *expfmt_type_proto_name(expfmt_type_t t)
{
    switch (t) {
    case EXPFMT_COUNTER: return "COUNTER";
    case EXPFMT_GAUGE: return "GAUGE";
    case EXPFMT_SUMMARY: return "SUMMARY";
    case EXPFMT_HISTOGRAM: return "HISTOGRAM";
    case EXPFMT_GAUGE_HISTOGRAM: return "GAUGE_HISTOGRAM";
    default: return "UNTYPED";
    }
}

int expfmt_type_to_proto(expfmt_type_t t)
{
    switch (t) {
    case EXPFMT_COUNTER: return 0;
    case EXPFMT_GAUGE: return 1;
    case EXPFMT_SUMMARY: return 2;
    case EXPFMT_UNTYPED: return 3;
    case EXPFMT_HISTOGRAM: return 4;
    case EXPFMT_GAUGE_HISTOGRAM: return 5;
    default: return -1;
    }
}

expfmt_type_t expfmt_type_from_proto(int v, bool *ok)
{
    static const expfmt_type_t map[] = {EXPFMT_COUNTER, EXPFMT_GAUGE,     EXPFMT_SUMMARY,
                                        EXPFMT_UNTYPED, EXPFMT_HISTOGRAM, EXPFMT_GAUGE_HISTOGRAM};
    bool good = v >= 0 && v < (int)(sizeof(map) / sizeof(map[0]));
    if (ok)
        *ok = good;
    return good ? map[v] : EXPFMT_UNTYPED;
}

/* ------------------------------------------------------------------------ numbers */

static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                       1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static const uint64_t pow10_u64[20] = {
    UINT64_C(1),
    UINT64_C(10),
    UINT64_C(100),
    UINT64_C(1000),
    UINT64_C(10000),
    UINT64_C(100000),
    UINT64_C(1000000),
    UINT64_C(10000000),
    UINT64_C(100000000),
    UINT64_C(1000000000),
    UINT64_C(10000000000),
    UINT64_C(100000000000),
    UINT64_C(1000000000000),
    UINT64_C(10000000000000),
    UINT64_C(100000000000000),
    UINT64_C(1000000000000000),
    UINT64_C(10000000000000000),
    UINT64_C(100000000000000000),
    UINT64_C(1000000000000000000),
    UINT64_C(10000000000000000000),
};

typedef unsigned __int128 u128_t;

/* Rounds q * 2^e2 to the nearest double, ties to even, where `sticky` says whether the exact
 * value lies strictly above q * 2^e2 (a non-zero remainder was dropped). q > 0. The results
 * stay in the normal range for the inputs exact_u64_pow10 makes (about 2^-64 .. 2^128). */
static double round_u128(u128_t q, int e2, bool sticky)
{
    uint64_t hi = (uint64_t)(q >> 64);
    int bits = hi ? 128 - __builtin_clzll(hi) : 64 - __builtin_clzll((uint64_t)q);
    if (bits <= 53)
        return ldexp((double)(uint64_t)q, e2); /* exact (sticky is 0 then: only products) */
    int shift = bits - 53;
    uint64_t mant = (uint64_t)(q >> shift);
    u128_t rest = q & (((u128_t)1 << shift) - 1);
    u128_t half = (u128_t)1 << (shift - 1);
    if (rest > half || (rest == half && (sticky || (mant & 1))))
        mant++; /* 2^53 after a carry is still exact in a double */
    return ldexp((double)mant, e2 + shift);
}

/*
 * m * 10^e correctly rounded, for 0 < m < 2^64 and |e| <= 19, with exact integer arithmetic:
 * a product m * 10^e fits 128 bits; for a quotient, m is shifted to the top of 128 bits so
 * m * 2^s / 10^-e keeps at least 64 significant bits, and the remainder becomes the sticky bit.
 * Covers the 16-17 digit values (Java's Double.toString of a measured double) that miss
 * Clinger's fast path, at a fraction of strtod's cost.
 */
static double exact_u64_pow10(uint64_t m, int e)
{
    if (e >= 0)
        return round_u128((u128_t)m * pow10_u64[e], 0, false);
    int s = 64 + __builtin_clzll(m);
    u128_t num = (u128_t)m << s;
    uint64_t d = pow10_u64[-e];
    u128_t q = num / d;
    bool sticky = num - q * d != 0;
    return round_u128(q, -s, sticky);
}

int expfmt__parse_float(const char *s, size_t n, double *out)
{
    if (n == 0)
        return -1;
    size_t i = 0;
    bool neg = false;
    if (s[0] == '+' || s[0] == '-') {
        neg = s[0] == '-';
        i = 1;
    }
    if (i < n && (s[i] | 0x20) == 'i') {
        if (ci_eq(s + i, n - i, "inf") || ci_eq(s + i, n - i, "infinity")) {
            *out = neg ? -INFINITY : INFINITY;
            return 0;
        }
        return -1;
    }
    if (i == 0 && n == 3 && ci_eq(s, 3, "nan")) {
        *out = NAN;
        return 0;
    }
    uint64_t m = 0;
    int nd = 0, dexp = 0;
    bool any = false, inexact = false;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        any = true;
        unsigned d = (unsigned)(s[i] - '0');
        if (m == 0 && d == 0)
            continue;
        if (nd < 19) {
            m = m * 10 + d;
            nd++;
        } else {
            dexp++;
            inexact |= d != 0;
        }
    }
    if (i < n && s[i] == '.') {
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
            any = true;
            unsigned d = (unsigned)(s[i] - '0');
            if (m == 0 && d == 0) {
                dexp--;
                continue;
            }
            if (nd < 19) {
                m = m * 10 + d;
                nd++;
                dexp--;
            } else {
                inexact |= d != 0;
            }
        }
    }
    if (!any)
        return -1;
    int64_t e10 = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        bool eneg = false;
        if (i < n && (s[i] == '+' || s[i] == '-')) {
            eneg = s[i] == '-';
            i++;
        }
        if (i >= n || s[i] < '0' || s[i] > '9')
            return -1;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            if (e10 < 100000000)
                e10 = e10 * 10 + (s[i] - '0');
        if (eneg)
            e10 = -e10;
    }
    if (i != n)
        return -1;
    if (m == 0) {
        *out = neg ? -0.0 : 0.0;
        return 0;
    }
    int64_t e = e10 + dexp;
    if (!inexact && m <= (UINT64_C(1) << 53) && e >= -22 && e <= 22) {
        double v = (double)m;
        v = e >= 0 ? v * pow10_exact[e] : v / pow10_exact[-e];
        *out = neg ? -v : v;
        return 0;
    }
    if (!inexact && e >= -19 && e <= 19) {
        double v = exact_u64_pow10(m, (int)e);
        *out = neg ? -v : v;
        return 0;
    }
    char stackbuf[128];
    char *tmp = n < sizeof(stackbuf) ? stackbuf : malloc(n + 1);
    if (!tmp)
        return -1;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    double v = strtod(tmp, NULL);
    if (tmp != stackbuf)
        free(tmp);
    if (isinf(v))
        return -1; /* Go: ErrRange on overflow */
    *out = v;
    return 0;
}

int expfmt__parse_int64(const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    bool neg = false;
    if (n > 0 && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i >= n)
        return -1;
    uint64_t v = 0, lim = neg ? (UINT64_C(1) << 63) : (UINT64_C(1) << 63) - 1;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (lim - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

double expfmt_go_uint64_trunc(double v)
{
    /* amd64: x < 2^63 ? uint64(int64(x)) : uint64(int64(x - 2^63)) | 1<<63, where the
     * CVTTSD2SQ of NaN or an out-of-range value is 0x8000000000000000. */
    const double two63 = 9223372036854775808.0;
    uint64_t u;
    if (v < two63) {
        int64_t i = (v > -two63) ? (int64_t)v : INT64_MIN;
        u = (uint64_t)i;
    } else {
        double y = v - two63;
        int64_t i = (!isnan(y) && y < two63) ? (int64_t)y : INT64_MIN;
        u = (uint64_t)i | (UINT64_C(1) << 63);
    }
    return (double)u;
}

/* ------------------------------------------------------------------------ quoting */

/* Go's unicode.IsPrint, approximated: the control ranges and the odd invisible code points
 * that matter in practice. */
static bool go_isprint(uint32_t r)
{
    if (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0xad)
        return false;
    if (r == 0x2028 || r == 0x2029 || (r >= 0x200b && r <= 0x200f) || r == 0xfeff)
        return false;
    if ((r >= 0xd800 && r <= 0xdfff) || r == 0xfffe || r == 0xffff)
        return false;
    return true;
}

typedef struct {
    char *out;
    size_t cap, len;
} qbuf_t;

static void qput(qbuf_t *q, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, q->len++)
        if (q->len + 1 < q->cap)
            q->out[q->len] = s[i];
}

static void quote_rune(qbuf_t *q, uint32_t r, char quote, const unsigned char *raw, size_t rawlen)
{
    char tmp[16];
    if (r == (uint32_t)quote || r == '\\') {
        tmp[0] = '\\';
        tmp[1] = (char)r;
        qput(q, tmp, 2);
        return;
    }
    if (go_isprint(r)) {
        if (raw) {
            qput(q, (const char *)raw, rawlen);
        } else {
            qput(q, tmp, utf8_encode(tmp, r));
        }
        return;
    }
    const char *esc = NULL;
    switch (r) {
    case '\a': esc = "\\a"; break;
    case '\b': esc = "\\b"; break;
    case '\f': esc = "\\f"; break;
    case '\n': esc = "\\n"; break;
    case '\r': esc = "\\r"; break;
    case '\t': esc = "\\t"; break;
    case '\v': esc = "\\v"; break;
    }
    if (esc) {
        qput(q, esc, 2);
        return;
    }
    int l;
    if (r < 0x20 || r == 0x7f)
        l = snprintf(tmp, sizeof(tmp), "\\x%02x", (unsigned)r);
    else if (r < 0x10000)
        l = snprintf(tmp, sizeof(tmp), "\\u%04x", (unsigned)r);
    else
        l = snprintf(tmp, sizeof(tmp), "\\U%08x", (unsigned)r);
    qput(q, tmp, (size_t)l);
}

size_t expfmt_go_quote(char *out, size_t outlen, const char *s, size_t n)
{
    qbuf_t q = {out, outlen, 0};
    const unsigned char *p = (const unsigned char *)s;
    qput(&q, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = utf8_decode(s + i, n - i, &cp);
        if (!l) {
            char tmp[8];
            snprintf(tmp, sizeof(tmp), "\\x%02x", p[i]);
            qput(&q, tmp, 4);
            i++;
            continue;
        }
        quote_rune(&q, cp, '"', p + i, l);
        i += l;
    }
    qput(&q, "\"", 1);
    if (outlen)
        out[q.len < outlen ? q.len : outlen - 1] = 0;
    return q.len;
}

void expfmt__go_quote_rune(char *out, size_t outlen, unsigned char c)
{
    qbuf_t q = {out, outlen, 0};
    qput(&q, "'", 1);
    quote_rune(&q, c, '\'', NULL, 0);
    qput(&q, "'", 1);
    if (outlen)
        out[q.len < outlen ? q.len : outlen - 1] = 0;
}

/* ------------------------------------------------------------------------ duplicates */

/* What the duplicate check leaves out: see expfmt_check_duplicates. */
typedef struct {
    const char *const *ignore;
    size_t nignore;
    const char *blank;
} dup_skip_t;

static bool skipped(const label_t *l, const dup_skip_t *k)
{
    if (k->blank && !l->value[0] && strcmp(l->name, k->blank) == 0)
        return true;
    for (size_t i = 0; i < k->nignore; i++)
        if (strcmp(l->name, k->ignore[i]) == 0)
            return true;
    return false;
}

/* Order-insensitive: the sum of per-label hashes. Collisions are settled by same_series. */
static uint64_t series_hash(const expfmt_sample_t *s, const dup_skip_t *k)
{
    uint64_t h = XXH3_64bits(s->name, strlen(s->name));
    for (uint32_t i = 0; i < s->nlabels; i++) {
        const label_t *l = &s->labels[i];
        if (skipped(l, k))
            continue;
        uint64_t ln = XXH3_64bits(l->name, strlen(l->name));
        uint64_t lv = XXH3_64bits_withSeed(l->value, strlen(l->value), ln);
        h += hash_mix64(lv ^ ln);
    }
    return h;
}

static size_t count_kept(const expfmt_sample_t *s, const dup_skip_t *k)
{
    size_t n = 0;
    for (uint32_t i = 0; i < s->nlabels; i++)
        n += !skipped(&s->labels[i], k);
    return n;
}

static bool same_series(const expfmt_sample_t *a, const expfmt_sample_t *b, const dup_skip_t *k)
{
    if (strcmp(a->name, b->name) != 0)
        return false;
    if (count_kept(a, k) != count_kept(b, k))
        return false;
    for (uint32_t i = 0; i < a->nlabels; i++) {
        const label_t *l = &a->labels[i];
        if (skipped(l, k))
            continue;
        bool found = false;
        for (uint32_t j = 0; j < b->nlabels && !found; j++)
            found = strcmp(l->name, b->labels[j].name) == 0 && strcmp(l->value, b->labels[j].value) == 0;
        if (!found)
            return false;
    }
    return true;
}

typedef struct {
    const expfmt_result_t *r;
    const expfmt_sample_t *s;
    const dup_skip_t *skip;
} dup_key_t;

/* v: (family << 32 | sample index) of an earlier sample. */
static bool dup_eq(uint64_t v, const void *ctx)
{
    const dup_key_t *k = ctx;
    const expfmt_sample_t *o = &k->r->families[v >> 32].samples[(uint32_t)v];
    return same_series(o, k->s, k->skip);
}

int expfmt_check_duplicates(const expfmt_result_t *r, const char *const *ignore, size_t nignore, const char *blank,
                            arena_t *a, size_t *fam, size_t *s1, size_t *s2, char *err, size_t errlen)
{
    if (r->nsamples == 0)
        return 0;
    const dup_skip_t skip = {ignore, nignore, blank};
    /* series hash -> (family << 32 | sample index), for every sample seen so far */
    hashmap_t seen;
    hashmap_init(&seen, a, HASHMAP_HASHED_KEYS);
    if (hashmap_reserve(&seen, r->nsamples) < 0) {
        if (errlen)
            snprintf(err, errlen, "out of memory checking for duplicate samples");
        return EXPFMT_ENOMEM;
    }
    for (size_t f = 0; f < r->nfamilies; f++) {
        const expfmt_family_t *F = &r->families[f];
        for (size_t i = 0; i < F->nsamples; i++) {
            const expfmt_sample_t *s = &F->samples[i];
            uint64_t h = series_hash(s, &skip);
            dup_key_t k = {r, s, &skip};
            const uint64_t *v = hashmap_find(&seen, h, dup_eq, &k);
            if (!v) {
                (void)hashmap_add(&seen, h, (uint64_t)f << 32 | (uint32_t)i); /* reserved: cannot fail */
                continue;
            }
            /* Only same-family duplicates can be reported as (fam, s1, s2); a cross-family
             * one reports the later family and both indices refer to their own family. */
            if (fam)
                *fam = f;
            if (s1)
                *s1 = (uint32_t)*v;
            if (s2)
                *s2 = i;
            if (errlen) {
                char q[256];
                expfmt_go_quote(q, sizeof(q), s->name, strlen(s->name));
                size_t off = (size_t)snprintf(err, errlen, "collected metric %s {", q);
                for (uint32_t k = 0; k < s->nlabels && off < errlen; k++) {
                    expfmt_go_quote(q, sizeof(q), s->labels[k].value, strlen(s->labels[k].value));
                    off += (size_t)snprintf(err + off, errlen - off, "%s%s=%s", k ? "," : "", s->labels[k].name, q);
                }
                if (off < errlen)
                    snprintf(err + off, errlen - off, "} was collected before with the same name and label values");
            }
            return 1;
        }
    }
    return 0;
}
