/*
 * expfmt text parser — text format 0.0.4 exactly as the Pushgateway 1.5 parser takes it
 * (prometheus/common expfmt.TextParser, checked against the real binary), plus OpenMetrics 1.0.
 *
 * One pass over the body, no regex, no per-line allocation: names, label values and HELP text
 * are NUL-terminated (and unescaped) in place in the body; samples go into one array sized by
 * the body's newline count (a sample needs a line), labels into arena chunks.
 *
 * Grammar (0.0.4), "blank" = ' ' or '\t', every line ends in '\n':
 *
 *   line     = blank* ( '\n' | comment | sample )          body may end with blanks, no '\n'
 *   comment  = '#' blank* [ word [ blank+ name [ blank+ rest ] ] ] '\n'
 *              word HELP: rest is the help text, escapes \\ and \n, else "invalid escape"
 *              word TYPE: rest must be counter|gauge|summary|untyped|histogram|gauge_histogram
 *                         (case-insensitive, trailing blanks or '\r' included => unknown type)
 *              any other word: a comment; a name followed by neither blank nor '\n' is
 *              "invalid metric name in comment"
 *   sample   = name blank* [ '{' labels '}' blank* ] value [ blank+ timestamp ] '\n'
 *   labels   = blank* [ label ( blank* ',' blank* label )* [ blank* ',' ] ] blank*
 *   label    = lname blank* '=' blank* '"' ( char | '\\' | '\"' | '\n' )* '"'
 *   name     = [a-zA-Z_:][a-zA-Z0-9_:]*      lname = [a-zA-Z_][a-zA-Z0-9_]*, not __name__
 *   value    = Go float (family.c), terminated by blank or '\n' ("1\r" is not a float)
 *   timestamp= Go int64 ms; anything after it, even one blank, is "spurious string"
 *   In TYPE words and after the timestamp every backslash is dropped first (a Go quirk:
 *   "# TYPE a ga\\uge" is a gauge, "a 1 2\\" is fine).
 *
 * Semantics mirrored from the Go parser:
 * - Families are keyed by name; "foo_count"/"foo_sum" belong to family "foo" if "foo" is a
 *   summary, and "_bucket" too if a histogram, but only when no family named "foo_count" etc.
 *   exists already. This also applies to HELP/TYPE lines ("# TYPE foo_sum gauge" after a summary
 *   foo is a second TYPE for foo).
 * - A TYPE after samples of its family, a second TYPE or a second HELP is an error; a family
 *   split over non-adjacent lines (a, b, a) is not. Families with no sample are dropped.
 * - Summary samples that are neither _sum, _count nor carry quantile are dropped silently, as
 *   are histogram samples with no le that are not _sum/_count; "h{le=...}" is a bucket.
 *   A quantile/le label (last one wins) is not counted for the duplicate-label check.
 * - Label values must be valid UTF-8 ("invalid label value"). _count and bucket values go
 *   through uint64 (2.7 -> 2); quantile/le values are re-rendered as Go prints floats.
 * - Any end of input except at the start of a line is "unexpected end of input stream".
 * Deliberate differences from Pushgateway 1.5 (it accepts these and then misbehaves):
 * - a sample of a gauge_histogram family is an error (Go stores it without a value and later
 *   fails to render /metrics); a NUL byte in a label value is an error (C strings).
 *
 * OpenMetrics 1.0 (sluice extension; the Pushgateway would parse such a body as 0.0.4):
 * `# EOF` must end the body (optionally followed by one '\n'); `# UNIT`; types counter, gauge,
 * histogram, gaugehistogram, summary, info, stateset, unknown; samples resolve to their family
 * through _total/_created (counter), _count/_sum/_created (summary), _bucket/_count/_sum/_created
 * (histogram), _bucket/_gcount/_gsum (gaugehistogram), _info (info); unknown names make an
 * "unknown" family; timestamps are float seconds (-> int64(ts*1000) ms, as Prometheus does);
 * exemplars (" # {labels} value [ts]") are checked and dropped; HELP escapes \" too; other
 * comments are errors. Not enforced (accepted leniently): single-space separators, blank
 * lines, counter samples without _total, the OM rules on metric-name/unit/suffix collisions,
 * histogram bucket ordering and +Inf presence, _created placement.
 */
#include "internal/expfmt/text_parse.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "internal/util/buf.h"
#include "internal/util/utf8.h"
#include "internal/util/hashmap.h"

#define DEF_MAX_LABELS 256
#define DEF_MAX_NAME 1024
#define DEF_MAX_VALUE 16384
#define LCHUNK 4096
#define SET_THRESHOLD 16 /* per-sample label count from which names are checked with a hash */

enum { SUB_NONE = 0, SUB_COUNT, SUB_SUM, SUB_BUCKET, SUB_TOTAL, SUB_CREATED, SUB_GCOUNT, SUB_GSUM, SUB_INFO };

static const char *const sub_suffix[] = {"",         "_count",  "_sum",  "_bucket", "_total",
                                         "_created", "_gcount", "_gsum", "_info"};

typedef struct {
    const char *name;
    size_t namelen;
    const char *help, *unit;
    expfmt_type_t type;
    bool type_set, help_set, unit_set;
    size_t first, count, last; /* sample indices */
    const char *bucket_name;   /* "<name>_bucket", made on demand for "h{le=..}" samples */
} tfam_t;

typedef struct {
    char *end;
    uint32_t line;
    bool om;
    size_t max_samples, max_labels, max_name, max_value;
    arena_t *a;
    char *err;
    size_t errlen;

    tfam_t *fams;
    size_t nfams, capfams;
    hashmap_t fam_by_hash; /* XXH3(name) -> family index (a multimap, in the arena) */
    size_t cur;            /* last family used + 1 (0 = none): most lines belong to the previous family */

    char *body;          /* start of the body (span offsets count from here) */
    char *line_start;    /* the current line's first byte */
    expfmt_span_t *span; /* per sample, parallel to smp; NULL when not asked for */
    expfmt_sample_t *smp;
    uint32_t *sfam;
    size_t nsmp, capsmp;
    bool split;

    label_t *lchunk;
    size_t lpos, lcap;

    uint32_t *lset; /* (gen << 16 | index) hash set of this sample's label names */
    size_t lsetcap;
    uint32_t lgen;

    /* The previous sample's plain labels (first SET_THRESHOLD), for the repeated-label fast
     * path in read_labels; cur is filled while a label block is read, then swapped in. */
    struct lrec {
        const char *name, *value;
        uint32_t nlen, vlen;
        uint64_t key;
        bool raw; /* the value had no escapes: its bytes equal the body's bytes */
    } lrec[2][SET_THRESHOLD];
    unsigned nprev, prev; /* count and index into lrec of the previous block */
    const char *pname;    /* the previous sample's name in the body (pnlen bytes), same idea */
    size_t pnlen;

    buf_t fbuf;
    struct {
        const char *in;
        const char *out;
    } fcache[8];
    unsigned fnext;
} tp_t;

#define TP_EOF 1 /* internal: ran into the end of the body */
#define TP_DONE 2

/* ------------------------------------------------------------------------ errors */

static int tp_fail(tp_t *tp, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int tp_fail(tp_t *tp, int rc, const char *fmt, ...)
{
    if (tp->errlen) {
        int off = snprintf(tp->err, tp->errlen, "text format parsing error in line %u: ", tp->line);
        if (off >= 0 && (size_t)off < tp->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(tp->err + off, tp->errlen - (size_t)off, fmt, ap);
            va_end(ap);
        }
    }
    return rc;
}

static int tp_eof(tp_t *tp)
{
    return tp_fail(tp, EXPFMT_EPARSE, "unexpected end of input stream");
}

static int tp_nomem(tp_t *tp)
{
    return tp_fail(tp, EXPFMT_ENOMEM, "request too large (memory limit reached)");
}

/* Go %q of s[0:n] into a stack buffer for messages. */
#define QUOTE(var, s, n)                                                                                               \
    char var[320];                                                                                                     \
    expfmt_go_quote(var, sizeof(var), (s), (n))

/* ------------------------------------------------------------------------ character classes */

/* a table reads best in rows */
/* clang-format off */
static const unsigned char cls[256] = {
#define M1 1 /* metric name start */
#define M2 2 /* metric name continuation */
#define L1 4 /* label name start */
#define L2 8 /* label name continuation */
    ['_'] = M1 | M2 | L1 | L2,
    [':'] = M1 | M2,
    ['0'] = M2 | L2, ['1'] = M2 | L2, ['2'] = M2 | L2, ['3'] = M2 | L2, ['4'] = M2 | L2,
    ['5'] = M2 | L2, ['6'] = M2 | L2, ['7'] = M2 | L2, ['8'] = M2 | L2, ['9'] = M2 | L2,
#define AZ(c) [c] = M1 | M2 | L1 | L2
    AZ('a'), AZ('b'), AZ('c'), AZ('d'), AZ('e'), AZ('f'), AZ('g'), AZ('h'), AZ('i'), AZ('j'),
    AZ('k'), AZ('l'), AZ('m'), AZ('n'), AZ('o'), AZ('p'), AZ('q'), AZ('r'), AZ('s'), AZ('t'),
    AZ('u'), AZ('v'), AZ('w'), AZ('x'), AZ('y'), AZ('z'),
    AZ('A'), AZ('B'), AZ('C'), AZ('D'), AZ('E'), AZ('F'), AZ('G'), AZ('H'), AZ('I'), AZ('J'),
    AZ('K'), AZ('L'), AZ('M'), AZ('N'), AZ('O'), AZ('P'), AZ('Q'), AZ('R'), AZ('S'), AZ('T'),
    AZ('U'), AZ('V'), AZ('W'), AZ('X'), AZ('Y'), AZ('Z'),
#undef AZ
};
/* clang-format on */
#define IS(c, m) (cls[(unsigned char)(c)] & (m))
#define BLANK(c) ((c) == ' ' || (c) == '\t')

static char *skip_blank(char *p, const char *e)
{
    while (p < e && BLANK(*p))
        p++;
    return p;
}

/* ------------------------------------------------------------------------ families */

typedef struct {
    const tp_t *tp;
    const char *name;
    size_t len;
} fam_key_t;

static bool fam_eq(uint64_t i, const void *ctx)
{
    const fam_key_t *k = ctx;
    const tfam_t *f = &k->tp->fams[i];
    return f->namelen == k->len && memcmp(f->name, k->name, k->len) == 0;
}

/* Family index + 1 of the exact name, or 0. */
static size_t fam_lookup(tp_t *tp, const char *name, size_t len)
{
    if (tp->cur) {
        tfam_t *f = &tp->fams[tp->cur - 1];
        if (f->namelen == len && memcmp(f->name, name, len) == 0)
            return tp->cur;
    }
    fam_key_t k = {tp, name, len};
    const uint64_t *v = hashmap_find(&tp->fam_by_hash, XXH3_64bits(name, len), fam_eq, &k);
    return v ? (size_t)*v + 1 : 0;
}

/* `name` must stay valid (it points into the body or the arena). Returns index + 1 or 0. */
static size_t fam_create(tp_t *tp, const char *name, size_t len)
{
    if (tp->nfams == tp->capfams) {
        size_t ncap = tp->capfams ? tp->capfams * 2 : 32;
        tfam_t *nf = arena_try_alloc(tp->a, ncap * sizeof(*nf));
        if (!nf)
            return 0;
        if (tp->nfams)
            memcpy(nf, tp->fams, tp->nfams * sizeof(*nf));
        tp->fams = nf;
        tp->capfams = ncap;
    }
    if (hashmap_add(&tp->fam_by_hash, XXH3_64bits(name, len), tp->nfams) < 0)
        return 0;
    tfam_t *f = &tp->fams[tp->nfams];
    memset(f, 0, sizeof(*f));
    f->name = name;
    f->namelen = len;
    f->type = tp->om ? EXPFMT_UNKNOWN : EXPFMT_UNTYPED;
    return ++tp->nfams;
}

static bool ends_with(const char *s, size_t n, const char *suf, size_t sn)
{
    return n > sn && memcmp(s + n - sn, suf, sn) == 0;
}

/* Which suffixes may attach a sample name to a family of type t. */
static bool sub_allowed(bool om, expfmt_type_t t, int sub)
{
    if (!om) {
        if (t == EXPFMT_SUMMARY)
            return sub == SUB_COUNT || sub == SUB_SUM;
        if (t == EXPFMT_HISTOGRAM)
            return sub == SUB_COUNT || sub == SUB_SUM || sub == SUB_BUCKET;
        return false;
    }
    switch (t) {
    case EXPFMT_COUNTER: return sub == SUB_TOTAL || sub == SUB_CREATED;
    case EXPFMT_SUMMARY: return sub == SUB_COUNT || sub == SUB_SUM || sub == SUB_CREATED;
    case EXPFMT_HISTOGRAM: return sub == SUB_COUNT || sub == SUB_SUM || sub == SUB_BUCKET || sub == SUB_CREATED;
    case EXPFMT_GAUGE_HISTOGRAM: return sub == SUB_BUCKET || sub == SUB_GCOUNT || sub == SUB_GSUM;
    case EXPFMT_INFO: return sub == SUB_INFO;
    default: return false;
    }
}

/*
 * Go's setOrCreateCurrentMF: the family a name belongs to (exact name first, then the name minus
 * a suffix its type allows), created when none. Returns index + 1, 0 on OOM; *sub says which
 * suffix matched.
 */
static size_t fam_resolve(tp_t *tp, const char *name, size_t len, int *sub)
{
    *sub = SUB_NONE;
    size_t fi = fam_lookup(tp, name, len);
    if (fi)
        return tp->cur = fi;
    static const int text_subs[] = {SUB_COUNT, SUB_SUM, SUB_BUCKET};
    static const int om_subs[] = {SUB_TOTAL,   SUB_COUNT,  SUB_SUM,  SUB_BUCKET,
                                  SUB_CREATED, SUB_GCOUNT, SUB_GSUM, SUB_INFO};
    const int *subs = tp->om ? om_subs : text_subs;
    size_t nsubs = tp->om ? sizeof(om_subs) / sizeof(om_subs[0]) : 3;
    for (size_t i = 0; i < nsubs; i++) {
        const char *suf = sub_suffix[subs[i]];
        size_t sn = strlen(suf);
        if (!ends_with(name, len, suf, sn))
            continue;
        size_t bi = fam_lookup(tp, name, len - sn);
        if (bi && sub_allowed(tp->om, tp->fams[bi - 1].type, subs[i])) {
            *sub = subs[i];
            return tp->cur = bi;
        }
    }
    fi = fam_create(tp, name, len);
    return tp->cur = fi;
}

/* ------------------------------------------------------------------------ labels */

/* Makes room for one more label after the n already written at *lab (moving them to a fresh
 * chunk when the current one is full). */
static int lab_reserve(tp_t *tp, label_t **lab, size_t n)
{
    if (tp->lchunk && tp->lpos + n + 1 <= tp->lcap)
        return 0;
    size_t ncap = LCHUNK;
    if (ncap < 2 * (n + 1))
        ncap = 2 * (n + 1);
    label_t *c = arena_try_alloc(tp->a, ncap * sizeof(*c));
    if (!c)
        return -1;
    if (n)
        memcpy(c, *lab, n * sizeof(*c));
    tp->lchunk = c;
    tp->lpos = 0;
    tp->lcap = ncap;
    *lab = c;
    return 0;
}

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* *dup = whether lab[n] (NUL-terminated) repeats a name in lab[0..n), for n >= SET_THRESHOLD:
 * a generation-stamped hash set, so a sample with thousands of labels stays linear. */
static int lab_is_dup(tp_t *tp, label_t *lab, size_t n, bool *dup)
{
    *dup = false;
    const char *nm = lab[n].name;
    assert(n >= SET_THRESHOLD); /* below it read_labels compares directly */
    if (!tp->lset || tp->lsetcap < 2 * tp->max_labels) {
        size_t cap = 64;
        while (cap < 2 * tp->max_labels)
            cap <<= 1;
        tp->lset = arena_try_alloc(tp->a, cap * sizeof(uint32_t));
        if (!tp->lset)
            return -1;
        memset(tp->lset, 0, cap * sizeof(uint32_t));
        tp->lsetcap = cap;
        tp->lgen = 0;
    }
    size_t mask = tp->lsetcap - 1;
    if (n == SET_THRESHOLD) { /* first use for this sample: new generation, insert the rest */
        tp->lgen = (tp->lgen + 1) & 0xffff;
        if (tp->lgen == 0) {
            memset(tp->lset, 0, tp->lsetcap * sizeof(uint32_t));
            tp->lgen = 1;
        }
        for (size_t i = 0; i < n; i++) {
            size_t pos = name_hash(lab[i].name) & mask;
            while ((tp->lset[pos] >> 16) == tp->lgen)
                pos = (pos + 1) & mask;
            tp->lset[pos] = (tp->lgen << 16) | (uint32_t)i;
        }
    }
    size_t pos = name_hash(nm) & mask;
    while ((tp->lset[pos] >> 16) == tp->lgen) {
        if (strcmp(lab[tp->lset[pos] & 0xffff].name, nm) == 0) {
            *dup = true;
            return 0;
        }
        pos = (pos + 1) & mask;
    }
    tp->lset[pos] = (tp->lgen << 16) | (uint32_t)n;
    return 0;
}

/* The Pushgateway's rendering of a quantile/le value; cached since bodies repeat a few. */
static const char *float_label(tp_t *tp, const char *in, double v)
{
    for (unsigned i = 0; i < 8; i++)
        if (tp->fcache[i].in && strcmp(tp->fcache[i].in, in) == 0)
            return tp->fcache[i].out;
    buf_reset(&tp->fbuf);
    buf_put_float(&tp->fbuf, v);
    const char *out = strcmp(tp->fbuf.data, in) == 0 ? in : arena_strndup(tp->a, tp->fbuf.data, tp->fbuf.len);
    tp->fcache[tp->fnext].in = in;
    tp->fcache[tp->fnext].out = out;
    tp->fnext = (tp->fnext + 1) & 7;
    return out;
}

/* SWAR: a mask with the high bit set in the first byte of x equal to the byte in `c` (bits above
 * the first match may be spurious, so only the lowest one is meaningful). */
#define ONES UINT64_C(0x0101010101010101)
#define HIGHS UINT64_C(0x8080808080808080)
static inline uint64_t swar_eq(uint64_t x, uint64_t c)
{
    uint64_t y = x ^ c;
    return (y - ONES) & ~y & HIGHS;
}

/*
 * Reads one label value; p is at the opening quote. Unescapes in place and NUL-terminates.
 * On return *pp is at the closing quote and *ascii says whether every byte was < 0x80 (then
 * the UTF-8 check can be skipped). Returns 0, TP_EOF or a negative error.
 */
static int read_label_value(tp_t *tp, char **pp, char **val, size_t *vlen, bool *ascii)
{
    char *p = *pp + 1, *e = tp->end;
    char *start = p;
    uint64_t high = 0;
    /* Fast path, 8 bytes at a time, up to the first quote, backslash, newline or NUL. */
    while (e - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t m = swar_eq(w, ONES * '"') | swar_eq(w, ONES * '\\') | swar_eq(w, ONES * '\n') | swar_eq(w, 0);
        if (m) {
            unsigned k = (unsigned)__builtin_ctzll(m) / 8;
            uint64_t keep = k ? (~UINT64_C(0) >> (64 - 8 * k)) : 0;
            high |= w & keep & HIGHS;
            p += k;
            break;
        }
        high |= w & HIGHS;
        p += 8;
    }
    while (p < e && *p != '"' && *p != '\\' && *p != '\n' && *p != 0)
        high |= (unsigned char)*p++ & 0x80;
    char *w = p;
    for (;;) {
        if (p >= e)
            return TP_EOF;
        char c = *p;
        if (c == '"')
            break;
        if (c == '\n') {
            QUOTE(q, start, (size_t)(w - start));
            return tp_fail(tp, EXPFMT_EPARSE, "label value %s contains unescaped new-line", q);
        }
        if (c == 0)
            return tp_fail(tp, EXPFMT_EPARSE, "label value contains a NUL byte");
        if (c == '\\') {
            if (++p >= e)
                return TP_EOF;
            switch (*p) {
            case '"':
            case '\\': *w++ = *p; break;
            case 'n': *w++ = '\n'; break;
            default: return tp_fail(tp, EXPFMT_EPARSE, "invalid escape sequence '\\%c'", *p);
            }
            p++;
            continue;
        }
        high |= (unsigned char)c & 0x80;
        *w++ = c;
        p++;
    }
    *vlen = (size_t)(w - start);
    *w = 0; /* w <= p, and p (the closing quote) is consumed by the caller */
    *val = start;
    *pp = p;
    *ascii = high == 0;
    return 0;
}

/*
 * Label block; p is at '{'. On return *pp is at the first non-blank after '}'. Fills lab[0..*n)
 * (plain labels) and the last quantile/le seen (special). `fam` is for messages and types.
 */
typedef struct {
    bool has;
    double v;
    const char *raw;
} special_t;

static int read_labels(tp_t *tp, tfam_t *fam, bool exemplar, char **pp, label_t **lab, size_t *n, special_t *sp)
{
    char *p = *pp, *e = tp->end;
    size_t total = 0; /* labels incl. special, for the limit */
    uint64_t keys[SET_THRESHOLD];
    const struct lrec *prev = tp->lrec[tp->prev];
    struct lrec *cur = tp->lrec[tp->prev ^ 1];
    bool prefix = !exemplar; /* every label so far repeated the previous block's at its index */
    assert(*n == 0);
    for (;;) {
        p = skip_blank(p + 1, e);
        if (p >= e)
            return TP_EOF;
        if (*p == '}')
            break;
        /*
         * Fast path: consecutive samples (a family's subtasks, operators, quantiles) repeat most
         * labels. While this block's labels are byte-identical (`name="value"`) to the previous
         * block's at the same index, take the previous block's strings: the bytes, and so the
         * name, the value, its UTF-8 validity and its limits are the same, and a prefix of a
         * duplicate-free label list is duplicate-free. Values with escapes never match (their
         * unescaped bytes differ from the raw ones), quantile/le are left to the slow path
         * (they are special or not depending on the family), and so is anything after the
         * first label that differs.
         */
        if (prefix && *n < tp->nprev) {
            const struct lrec *q = &prev[*n];
            size_t need = (size_t)q->nlen + q->vlen + 3;
            if (q->raw && (size_t)(e - p) > need && p[q->nlen] == '=' && p[q->nlen + 1] == '"' && p[need - 1] == '"' &&
                memcmp(p, q->name, q->nlen) == 0 && memcmp(p + q->nlen + 2, q->value, q->vlen) == 0 &&
                !((q->nlen == 8 && memcmp(q->name, "quantile", 8) == 0) ||
                  (q->nlen == 2 && q->name[0] == 'l' && q->name[1] == 'e'))) {
                if (++total > tp->max_labels)
                    return tp_fail(tp, EXPFMT_ELIMIT, "more than %zu labels in one sample", tp->max_labels);
                if (lab_reserve(tp, lab, *n) < 0)
                    return tp_nomem(tp);
                (*lab)[*n].name = q->name;
                (*lab)[*n].value = q->value;
                keys[*n] = q->key;
                cur[*n] = *q;
                (*n)++;
                p = skip_blank(p + need, e);
                if (p >= e)
                    return TP_EOF;
                if (*p == ',')
                    continue;
                if (*p == '}')
                    break;
                QUOTE(qv, q->value, q->vlen);
                return tp_fail(tp, EXPFMT_EPARSE, "unexpected end of label value %s", qv);
            }
            prefix = false;
        }
        char *ln = p;
        if (!IS(*p, L1)) {
            QUOTE(q, fam->name, fam->namelen);
            return tp_fail(tp, EXPFMT_EPARSE, "invalid label name for metric %s", q);
        }
        while (++p < e && IS(*p, L2))
            ;
        if (p >= e)
            return TP_EOF;
        size_t lnlen = (size_t)(p - ln);
        if (lnlen == 8 && memcmp(ln, "__name__", 8) == 0)
            return tp_fail(tp, EXPFMT_EPARSE, "label name \"__name__\" is reserved");
        if (lnlen > tp->max_name)
            return tp_fail(tp, EXPFMT_ELIMIT, "label name longer than %zu bytes", tp->max_name);
        bool special =
            !exemplar && (((fam->type == EXPFMT_SUMMARY) && lnlen == 8 && memcmp(ln, "quantile", 8) == 0) ||
                          ((fam->type == EXPFMT_HISTOGRAM || (tp->om && fam->type == EXPFMT_GAUGE_HISTOGRAM)) &&
                           lnlen == 2 && ln[0] == 'l' && ln[1] == 'e'));
        char *lend = p;
        if (BLANK(*p)) {
            p = skip_blank(p, e);
            if (p >= e)
                return TP_EOF;
        }
        if (*p != '=') {
            char q[16];
            expfmt__go_quote_rune(q, sizeof(q), (unsigned char)*p);
            return tp_fail(tp, EXPFMT_EPARSE, "expected '=' after label name, found %s", q);
        }
        *lend = 0;
        uint64_t key = 0;
        if (++total > tp->max_labels)
            return tp_fail(tp, EXPFMT_ELIMIT, "more than %zu labels in one sample", tp->max_labels);
        if (!special && !exemplar) {
            if (lab_reserve(tp, lab, *n) < 0)
                return tp_nomem(tp);
            (*lab)[*n].name = ln;
            bool dup = false;
            key = 0;
            if (*n < SET_THRESHOLD) {
                /* compare a (length, first 7 bytes) key before strcmp: Flink's names share
                 * prefixes (task_attempt_id, task_attempt_num) */
                size_t kn = lnlen < 7 ? lnlen : 7;
                if (e - ln >= 8) { /* one load; the bytes past the name are masked off */
                    memcpy(&key, ln, 8);
                    key &= (UINT64_C(1) << (8 * kn)) - 1;
                } else {
                    for (size_t j = 0; j < kn; j++)
                        key |= (uint64_t)(unsigned char)ln[j] << (8 * j);
                }
                key |= (uint64_t)(lnlen & 0xff) << 56;
                for (size_t j = 0; j < *n && !dup; j++)
                    dup = keys[j] == key && strcmp((*lab)[j].name, ln) == 0;
                keys[*n] = key;
            } else if (lab_is_dup(tp, *lab, *n, &dup) < 0) {
                return tp_nomem(tp);
            }
            if (dup) {
                QUOTE(q, fam->name, fam->namelen);
                return tp_fail(tp, EXPFMT_EPARSE, "duplicate label names for metric %s", q);
            }
        }
        p = skip_blank(p + 1, e);
        if (p >= e)
            return TP_EOF;
        if (*p != '"') {
            char q[16];
            expfmt__go_quote_rune(q, sizeof(q), (unsigned char)*p);
            return tp_fail(tp, EXPFMT_EPARSE, "expected '\"' at start of label value, found %s", q);
        }
        char *val = NULL;
        size_t vlen = 0;
        bool ascii = false;
        char *vq = p; /* opening quote */
        int rc = read_label_value(tp, &p, &val, &vlen, &ascii);
        if (rc)
            return rc;
        bool raw = (size_t)(p - vq - 1) == vlen; /* no escapes */
        if (vlen > tp->max_value)
            return tp_fail(tp, EXPFMT_ELIMIT, "label value longer than %zu bytes", tp->max_value);
        if (!ascii && !utf8_valid(val, vlen)) {
            QUOTE(q, val, vlen);
            return tp_fail(tp, EXPFMT_EPARSE, "invalid label value %s", q);
        }
        if (special) {
            if (expfmt__parse_float(val, vlen, &sp->v) < 0) {
                QUOTE(q, val, vlen);
                return tp_fail(tp, EXPFMT_EPARSE, "expected float as value for '%s' label, got %s", ln, q);
            }
            sp->has = true;
            sp->raw = val;
        } else if (!exemplar) {
            if (*n < SET_THRESHOLD)
                cur[*n] = (struct lrec){ln, val, (uint32_t)lnlen, (uint32_t)vlen, key, raw};
            (*lab)[(*n)++].value = val;
        }
        p = skip_blank(p + 1, e);
        if (p >= e)
            return TP_EOF;
        if (*p == ',')
            continue;
        if (*p == '}')
            break;
        QUOTE(q, val, vlen);
        return tp_fail(tp, EXPFMT_EPARSE, "unexpected end of label value %s", q);
    }
    /* p at '}' */
    p = skip_blank(p + 1, e);
    if (p >= e)
        return TP_EOF;
    *pp = p;
    if (!exemplar) {
        tp->prev ^= 1;
        tp->nprev = *n < SET_THRESHOLD ? (unsigned)*n : SET_THRESHOLD;
    }
    return 0;
}

/* ------------------------------------------------------------------------ comments */

static bool kw_is(const char *s, size_t n, const char *kw)
{
    return strlen(kw) == n && memcmp(s, kw, n) == 0;
}

static int parse_type_word(bool om, const char *s, size_t n, expfmt_type_t *t)
{
    static const struct {
        const char *w;
        expfmt_type_t t;
    } text[] = {{"COUNTER", EXPFMT_COUNTER},     {"GAUGE", EXPFMT_GAUGE},
                {"SUMMARY", EXPFMT_SUMMARY},     {"UNTYPED", EXPFMT_UNTYPED},
                {"HISTOGRAM", EXPFMT_HISTOGRAM}, {"GAUGE_HISTOGRAM", EXPFMT_GAUGE_HISTOGRAM}},
      omt[] = {{"counter", EXPFMT_COUNTER},
               {"gauge", EXPFMT_GAUGE},
               {"summary", EXPFMT_SUMMARY},
               {"histogram", EXPFMT_HISTOGRAM},
               {"gaugehistogram", EXPFMT_GAUGE_HISTOGRAM},
               {"info", EXPFMT_INFO},
               {"stateset", EXPFMT_STATESET},
               {"unknown", EXPFMT_UNKNOWN}};
    if (om) {
        for (size_t i = 0; i < sizeof(omt) / sizeof(omt[0]); i++)
            if (kw_is(s, n, omt[i].w)) {
                *t = omt[i].t;
                return 0;
            }
        return -1;
    }
    for (size_t i = 0; i < sizeof(text) / sizeof(text[0]); i++) {
        const char *w = text[i].w;
        if (strlen(w) != n)
            continue;
        size_t k = 0;
        for (; k < n; k++) {
            char c = s[k];
            if (c >= 'a' && c <= 'z')
                c = (char)(c - 'a' + 'A');
            if (c != w[k])
                break;
        }
        if (k == n) {
            *t = text[i].t;
            return 0;
        }
    }
    return -1;
}

/* Go's readTokenUntilNewline(false) drops every backslash (it sets "escaped" but never reads
 * escapes in that mode): compacts p[0:nl) in place the same way and returns the new length. */
static size_t drop_backslashes(char *p, const char *nl)
{
    char *w = p;
    for (char *r = p; r < nl; r++)
        if (*r != '\\')
            *w++ = *r;
    return (size_t)(w - p);
}

/* p at '#'. On return *pp is past the line's '\n'. */
static int parse_comment(tp_t *tp, char **pp)
{
    char *p = *pp, *e = tp->end;
    p = skip_blank(p + 1, e);
    if (tp->om && (p == *pp + 1 || p >= e || *p == '\n'))
        return tp_fail(tp, EXPFMT_EPARSE, "invalid comment line");
    if (p >= e)
        return TP_EOF;
    if (*p == '\n') {
        *pp = p + 1;
        return 0;
    }
    char *kw = p;
    while (p < e && !BLANK(*p) && *p != '\n')
        p++;
    size_t kwlen = (size_t)(p - kw);
    if (tp->om && kw_is(kw, kwlen, "EOF")) {
        if (p < e && *p == '\n')
            p++;
        if (p != e)
            return tp_fail(tp, EXPFMT_EPARSE, "unexpected data after # EOF");
        *pp = p;
        return TP_DONE;
    }
    if (p >= e)
        return TP_EOF;
    enum { K_NONE, K_HELP, K_TYPE, K_UNIT } k = K_NONE;
    if (kw_is(kw, kwlen, "HELP"))
        k = K_HELP;
    else if (kw_is(kw, kwlen, "TYPE"))
        k = K_TYPE;
    else if (tp->om && kw_is(kw, kwlen, "UNIT"))
        k = K_UNIT;
    if (tp->om && k == K_NONE)
        return tp_fail(tp, EXPFMT_EPARSE, "invalid comment line (only HELP, TYPE, UNIT, EOF)");
    if (*p == '\n' || k == K_NONE) {
        char *nl = memchr(p, '\n', (size_t)(e - p));
        if (!nl)
            return TP_EOF;
        *pp = nl + 1;
        return 0;
    }
    p = skip_blank(p, e);
    if (p >= e)
        return TP_EOF;
    char *nm = p;
    if (IS(*p, M1))
        while (++p < e && IS(*p, M2))
            ;
    if (p >= e)
        return TP_EOF;
    size_t nlen = (size_t)(p - nm);
    if (*p == '\n') {
        *pp = p + 1;
        return 0;
    }
    if (!BLANK(*p))
        return tp_fail(tp, EXPFMT_EPARSE, "invalid metric name in comment");
    if (nlen > tp->max_name)
        return tp_fail(tp, EXPFMT_ELIMIT, "metric name longer than %zu bytes", tp->max_name);
    *p = 0;
    int sub;
    size_t fi = fam_resolve(tp, nm, nlen, &sub);
    if (!fi)
        return tp_nomem(tp);
    tfam_t *fam = &tp->fams[fi - 1];
    p = skip_blank(p + 1, e);
    if (p >= e)
        return TP_EOF;
    if (*p == '\n') {
        *pp = p + 1;
        return 0;
    }
    if (k == K_HELP) {
        if (fam->help_set) {
            QUOTE(q, fam->name, fam->namelen);
            return tp_fail(tp, EXPFMT_EPARSE, "second HELP line for metric name %s", q);
        }
        char *start = p, *w = p;
        for (;;) {
            if (p >= e)
                return TP_EOF;
            char c = *p;
            if (c == '\n')
                break;
            if (c == '\\') {
                if (++p >= e)
                    return TP_EOF;
                if (*p == '\\' || (tp->om && *p == '"'))
                    *w++ = *p;
                else if (*p == 'n')
                    *w++ = '\n';
                else
                    return tp_fail(tp, EXPFMT_EPARSE, "invalid escape sequence '\\%c'", *p);
                p++;
                continue;
            }
            *w++ = c;
            p++;
        }
        *w = 0;
        fam->help = start;
        fam->help_set = true;
    } else if (k == K_TYPE) {
        if (fam->type_set) {
            QUOTE(q, fam->name, fam->namelen);
            return tp_fail(tp, EXPFMT_EPARSE, "second TYPE line for metric name %s, or TYPE reported after samples", q);
        }
        char *nl = memchr(p, '\n', (size_t)(e - p));
        if (!nl)
            return TP_EOF;
        expfmt_type_t t;
        size_t tl = tp->om ? (size_t)(nl - p) : drop_backslashes(p, nl);
        if (parse_type_word(tp->om, p, tl, &t) < 0) {
            QUOTE(q, p, tl);
            return tp_fail(tp, EXPFMT_EPARSE, "unknown metric type %s", q);
        }
        fam->type = t;
        fam->type_set = true;
        p = nl;
    } else {
        if (fam->unit_set) {
            QUOTE(q, fam->name, fam->namelen);
            return tp_fail(tp, EXPFMT_EPARSE, "second UNIT line for metric name %s", q);
        }
        char *nl = memchr(p, '\n', (size_t)(e - p));
        if (!nl)
            return TP_EOF;
        *nl = 0;
        fam->unit = p;
        fam->unit_set = true;
        p = nl;
    }
    *pp = p + 1;
    return 0;
}

/* ------------------------------------------------------------------------ samples */

static const char *suffixed_name(tp_t *tp, tfam_t *f, int sub)
{
    return arena_sprintf(tp->a, "%.*s%s", (int)f->namelen, f->name, sub_suffix[sub]);
}

/* OpenMetrics exemplar after " # ": p at '{'. Parsed for syntax and dropped. */
static int skip_exemplar(tp_t *tp, tfam_t *fam, char **pp)
{
    char *p = *pp, *e = tp->end;
    if (p >= e)
        return TP_EOF;
    if (*p != '{')
        return tp_fail(tp, EXPFMT_EPARSE, "invalid exemplar: expected '{'");
    size_t n = 0;
    label_t *lab = NULL; /* exemplar labels are checked, not stored */
    special_t sp = {0};
    int rc = read_labels(tp, fam, true, &p, &lab, &n, &sp);
    if (rc)
        return rc;
    for (int field = 0; field < 2; field++) {
        char *t = p;
        while (p < e && *p != ' ' && *p != '\n')
            p++;
        if (p >= e)
            return TP_EOF;
        double v;
        if (expfmt__parse_float(t, (size_t)(p - t), &v) < 0) {
            QUOTE(q, t, (size_t)(p - t));
            return tp_fail(tp, EXPFMT_EPARSE, "invalid exemplar %s %s", field ? "timestamp" : "value", q);
        }
        if (*p == '\n')
            break;
        p++;
    }
    if (p >= e)
        return TP_EOF;
    if (*p != '\n')
        return tp_fail(tp, EXPFMT_EPARSE, "unexpected data after exemplar");
    *pp = p;
    return 0;
}

static int parse_sample(tp_t *tp, char **pp)
{
    char *p = *pp, *e = tp->end;
    char *nm = p;
    if (!IS(*p, M1))
        return tp_fail(tp, EXPFMT_EPARSE, "invalid metric name");
    /* Consecutive samples mostly share their name: one memcmp instead of a byte loop. */
    if (tp->pnlen && (size_t)(e - p) > tp->pnlen && !IS(p[tp->pnlen], M2) && memcmp(p, tp->pname, tp->pnlen) == 0)
        p += tp->pnlen;
    else
        while (++p < e && IS(*p, M2))
            ;
    if (p >= e)
        return TP_EOF;
    size_t nlen = (size_t)(p - nm);
    tp->pname = nm;
    tp->pnlen = nlen;
    if (nlen > tp->max_name)
        return tp_fail(tp, EXPFMT_ELIMIT, "metric name longer than %zu bytes", tp->max_name);
    int sub;
    size_t fi = fam_resolve(tp, nm, nlen, &sub);
    if (!fi)
        return tp_nomem(tp);
    tfam_t *fam = &tp->fams[fi - 1];
    fam->type_set = true; /* Go fixes the type at the first sample: a later TYPE is an error */
    /* NUL-terminate the name in place when its terminator is ours to overwrite; "foo+1" (a name
     * directly followed by its value) needs a copy. */
    const char *name = nm;
    char term = *p;
    if (BLANK(term) || term == '{')
        *p = 0;
    else if ((name = arena_strndup(tp->a, nm, nlen)) == NULL)
        return tp_nomem(tp);
    if (BLANK(term)) {
        p = skip_blank(p + 1, e);
        if (p >= e)
            return TP_EOF;
        term = *p;
    }
    label_t *lab = tp->lchunk ? tp->lchunk + tp->lpos : NULL;
    size_t n = 0;
    special_t sp = {0};
    if (term == '{') {
        int rc = read_labels(tp, fam, false, &p, &lab, &n, &sp);
        if (rc)
            return rc;
    }
    /* value */
    char *v = p;
    while (p < e && !BLANK(*p) && *p != '\n')
        p++;
    if (p >= e)
        return TP_EOF;
    char *v_end = p;
    double value;
    if (expfmt__parse_float(v, (size_t)(p - v), &value) < 0) {
        QUOTE(q, v, (size_t)(p - v));
        return tp_fail(tp, EXPFMT_EPARSE, "expected float as value, got %s", q);
    }
    if (!tp->om && fam->type == EXPFMT_GAUGE_HISTOGRAM) {
        QUOTE(q, fam->name, fam->namelen);
        return tp_fail(tp, EXPFMT_EPARSE, "unexpected type for metric name %s", q);
    }
    bool has_ts = false;
    int64_t ts = 0;
    if (*p != '\n') {
        p = skip_blank(p, e);
        if (p >= e)
            return TP_EOF;
        if (tp->om && *p == '#') {
            p++;
            if (p >= e)
                return TP_EOF;
            if (*p != ' ')
                return tp_fail(tp, EXPFMT_EPARSE, "invalid exemplar");
            int rc = skip_exemplar(tp, fam, &(char *){p + 1});
            if (rc)
                return rc;
            p = memchr(p, '\n', (size_t)(e - p));
            if (!p)
                return TP_EOF;
        } else {
            char *t = p;
            while (p < e && !BLANK(*p) && *p != '\n')
                p++;
            if (p >= e)
                return TP_EOF;
            if (tp->om) {
                double secs;
                if (expfmt__parse_float(t, (size_t)(p - t), &secs) < 0 || !isfinite(secs) || fabs(secs) >= 9.2e15) {
                    QUOTE(q, t, (size_t)(p - t));
                    return tp_fail(tp, EXPFMT_EPARSE, "expected float seconds as timestamp, got %s", q);
                }
                ts = (int64_t)(secs * 1000);
            } else if (expfmt__parse_int64(t, (size_t)(p - t), &ts) < 0) {
                QUOTE(q, t, (size_t)(p - t));
                return tp_fail(tp, EXPFMT_EPARSE, "expected integer as timestamp, got %s", q);
            }
            has_ts = true;
            if (tp->om && *p == ' ' && p + 2 < e && p[1] == '#' && p[2] == ' ') {
                int rc = skip_exemplar(tp, fam, &(char *){p + 3});
                if (rc)
                    return rc;
                p = memchr(p, '\n', (size_t)(e - p));
                if (!p)
                    return TP_EOF;
            }
            char *nl = memchr(p, '\n', (size_t)(e - p));
            if (!nl)
                return TP_EOF;
            size_t rest = tp->om ? (size_t)(nl - p) : drop_backslashes(p, nl);
            if (rest) {
                QUOTE(q, p, rest);
                return tp_fail(tp, EXPFMT_EPARSE, "spurious string after timestamp: %s", q);
            }
        }
    }
    /* p at the '\n' */
    *pp = p + 1;

    /* Which component of its family this is (see the top of the file for the rules). */
    expfmt_kind_t kind = EXPFMT_KIND_VALUE;
    bool trunc = false;
    switch (fam->type) {
    case EXPFMT_SUMMARY:
        if (sub == SUB_COUNT)
            kind = EXPFMT_KIND_COUNT, trunc = true;
        else if (sub == SUB_SUM)
            kind = EXPFMT_KIND_SUM;
        else if (sub == SUB_CREATED)
            kind = EXPFMT_KIND_CREATED;
        else if (sp.has)
            kind = EXPFMT_KIND_QUANTILE;
        else
            return 0; /* dropped, as the Go parser does */
        break;
    case EXPFMT_HISTOGRAM:
    case EXPFMT_GAUGE_HISTOGRAM:
        if (sub == SUB_COUNT || sub == SUB_GCOUNT)
            kind = EXPFMT_KIND_COUNT, trunc = true;
        else if (sub == SUB_SUM || sub == SUB_GSUM)
            kind = EXPFMT_KIND_SUM;
        else if (sub == SUB_CREATED)
            kind = EXPFMT_KIND_CREATED;
        else if (sp.has) {
            kind = EXPFMT_KIND_BUCKET, trunc = true;
            if (sub != SUB_BUCKET) {
                if (!fam->bucket_name && !(fam->bucket_name = suffixed_name(tp, fam, SUB_BUCKET)))
                    return tp_nomem(tp);
                name = fam->bucket_name;
            }
        } else
            return 0;
        break;
    default:
        if (sub == SUB_CREATED)
            kind = EXPFMT_KIND_CREATED;
        break;
    }
    if (trunc && !tp->om)
        value = expfmt_go_uint64_trunc(value);
    if (kind == EXPFMT_KIND_QUANTILE || kind == EXPFMT_KIND_BUCKET) {
        if (lab_reserve(tp, &lab, n) < 0)
            return tp_nomem(tp);
        lab[n].name = kind == EXPFMT_KIND_QUANTILE ? "quantile" : "le";
        if (!(lab[n].value = float_label(tp, sp.raw, sp.v)))
            return tp_nomem(tp);
        n++;
    }
    if (tp->nsmp == tp->capsmp)
        return tp_fail(tp, EXPFMT_ELIMIT, "more than %zu samples", tp->max_samples);
    expfmt_sample_t *s = &tp->smp[tp->nsmp];
    s->name = name;
    s->labels = n ? lab : NULL;
    s->nlabels = (uint32_t)n;
    s->kind = (uint8_t)kind;
    s->has_timestamp = has_ts;
    s->value = value;
    s->timestamp_ms = ts;
    tp->sfam[tp->nsmp] = (uint32_t)(fi - 1);
    if (tp->span)
        tp->span[tp->nsmp] = (expfmt_span_t){(uint32_t)(tp->line_start - tp->body), (uint32_t)(v - tp->body),
                                             (uint32_t)(v_end - tp->body)};
    if (n)
        tp->lpos += n;
    if (fam->count == 0)
        fam->first = tp->nsmp;
    else if (fam->last + 1 != tp->nsmp)
        tp->split = true;
    fam->last = tp->nsmp;
    fam->count++;
    tp->nsmp++;
    return 0;
}

/* ------------------------------------------------------------------------ driver */

static int tp_run(tp_t *tp, char *body)
{
    char *p = body, *e = tp->end;
    for (;;) {
        tp->line++;
        tp->line_start = p;
        p = skip_blank(p, e);
        if (p >= e) {
            if (tp->om)
                return tp_fail(tp, EXPFMT_EPARSE, "data does not end with # EOF");
            return 0;
        }
        int rc;
        if (*p == '\n') {
            p++;
            continue;
        }
        if (*p == '#')
            rc = parse_comment(tp, &p);
        else
            rc = parse_sample(tp, &p);
        if (rc == TP_DONE)
            return 0;
        if (rc == TP_EOF)
            return tp_eof(tp);
        if (rc < 0)
            return rc;
    }
}

static int tp_finish(tp_t *tp, expfmt_result_t *out)
{
    size_t nf = 0;
    for (size_t i = 0; i < tp->nfams; i++)
        nf += tp->fams[i].count > 0;
    expfmt_family_t *fams = arena_try_alloc(tp->a, (nf ? nf : 1) * sizeof(*fams));
    if (!fams)
        return tp_nomem(tp);
    expfmt_sample_t *smp = tp->smp;
    size_t *off = NULL;
    if (tp->split) {
        /* Families came back after other families (a, b, a): regroup in one counting pass. */
        smp = arena_try_alloc(tp->a, tp->nsmp * sizeof(*smp));
        off = arena_try_alloc(tp->a, tp->nfams * sizeof(*off));
        if (!smp || !off)
            return tp_nomem(tp);
        size_t o = 0;
        for (size_t i = 0; i < tp->nfams; i++) {
            off[i] = o;
            o += tp->fams[i].count;
        }
        expfmt_span_t *span = tp->span ? arena_try_alloc(tp->a, tp->nsmp * sizeof(*span)) : NULL;
        if (tp->span && !span)
            return tp_nomem(tp);
        for (size_t i = 0; i < tp->nsmp; i++) {
            if (span)
                span[off[tp->sfam[i]]] = tp->span[i];
            smp[off[tp->sfam[i]]++] = tp->smp[i];
        }
        tp->span = span;
        o = 0;
        for (size_t i = 0; i < tp->nfams; i++) {
            tp->fams[i].first = o;
            o += tp->fams[i].count;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < tp->nfams; i++) {
        tfam_t *f = &tp->fams[i];
        if (!f->count)
            continue;
        expfmt_family_t *F = &fams[k++];
        F->name = f->name;
        F->help = f->help;
        F->unit = f->unit;
        F->type = f->type;
        F->samples = smp + f->first;
        F->nsamples = f->count;
        /* names were NUL-terminated where they lay; a family first named by a sample whose
         * name was copied ("foo+1") still points into the body without a terminator. */
        if (f->name[f->namelen] != 0 && !(F->name = arena_strndup(tp->a, f->name, f->namelen)))
            return tp_nomem(tp);
    }
    out->families = fams;
    out->nfamilies = nf;
    out->nsamples = tp->nsmp;
    out->spans = tp->span;
    return 0;
}

static int parse_text(char *body, size_t len, bool openmetrics, bool spans, const expfmt_limits_t *lim, arena_t *a,
                      expfmt_result_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (errlen)
        err[0] = 0;
    tp_t tp;
    memset(&tp, 0, sizeof(tp));
    tp.end = body + len;
    tp.body = body;
    tp.om = openmetrics;
    tp.a = a;
    hashmap_init(&tp.fam_by_hash, a, HASHMAP_HASHED_KEYS);
    tp.err = err;
    tp.errlen = errlen;
    tp.max_samples = lim && lim->max_samples ? lim->max_samples : SIZE_MAX;
    tp.max_labels = lim && lim->max_labels ? lim->max_labels : DEF_MAX_LABELS;
    if (tp.max_labels > 65535)
        tp.max_labels = 65535;
    tp.max_name = lim && lim->max_name_len ? lim->max_name_len : DEF_MAX_NAME;
    tp.max_value = lim && lim->max_value_len ? lim->max_value_len : DEF_MAX_VALUE;

    /* A sample needs its own '\n'-terminated line: the newline count bounds the sample count. */
    size_t lines = 0;
    for (const char *q = body, *e = body + len; q < e; q++) {
        q = memchr(q, '\n', (size_t)(e - q));
        if (!q)
            break;
        lines++;
    }
    tp.capsmp = lines < tp.max_samples ? lines : tp.max_samples;
    if (tp.capsmp) {
        tp.smp = arena_try_alloc(a, tp.capsmp * sizeof(*tp.smp));
        tp.sfam = arena_try_alloc(a, tp.capsmp * sizeof(*tp.sfam));
        if (spans && len < UINT32_MAX)
            tp.span = arena_try_alloc(a, tp.capsmp * sizeof(*tp.span));
        if (!tp.smp || !tp.sfam || (spans && len < UINT32_MAX && !tp.span)) {
            tp.line = 1;
            return tp_nomem(&tp);
        }
    }
    buf_init(&tp.fbuf);
    int rc = tp_run(&tp, body);
    if (rc == 0)
        rc = tp_finish(&tp, out);
    buf_free(&tp.fbuf);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

int expfmt_parse_text(char *body, size_t len, bool openmetrics, const expfmt_limits_t *lim, arena_t *a,
                      expfmt_result_t *out, char *err, size_t errlen)
{
    return parse_text(body, len, openmetrics, false, lim, a, out, err, errlen);
}

int expfmt_parse_text_spans(char *body, size_t len, bool openmetrics, const expfmt_limits_t *lim, arena_t *a,
                            expfmt_result_t *out, char *err, size_t errlen)
{
    return parse_text(body, len, openmetrics, true, lim, a, out, err, errlen);
}
