/*
 * push shape — see shape.h for what it recognises and why that is sound.
 *
 * Layout: one piece per sample, in body order, plus the tail after the last sample's line.
 *
 *   piece { hash: XXH3-128 of bytes [pos, pos + len) ; len ; sample: index of the value }
 *
 * Matching walks the new body once: hash the next `len` bytes, then read the value up to '\n'.
 */
#include "internal/push/shape.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct {
    XXH128_hash_t h;
    uint32_t len;    /* bytes before the value (from the end of the previous sample's line) */
    uint32_t sample; /* the value's index in the parsed body */
} push_piece_t;

struct push_shape {
    expfmt_format_t fmt;
    size_t npieces; /* = samples; pieces[npieces] is the tail */
    push_piece_t *pieces;
};

static int span_line_cmp(const void *a, const void *b, void *ud)
{
    const expfmt_span_t *sp = ud;
    uint32_t x = sp[*(const uint32_t *)a].line, y = sp[*(const uint32_t *)b].line;
    return (x > y) - (x < y);
}

push_shape_t *push_shape_build(const char *body, size_t len, expfmt_format_t fmt, const expfmt_result_t *parsed)
{
    size_t n = parsed->nsamples;
    if (!parsed->spans || len >= UINT32_MAX || fmt == EXPFMT_FORMAT_PROTO_DELIM)
        return NULL;
    push_shape_t *s = calloc(1, sizeof(*s));
    uint32_t *order = malloc((n ? n : 1) * sizeof(*order));
    if (!s || !order || !(s->pieces = malloc((n + 1) * sizeof(*s->pieces))))
        goto fail;
    s->fmt = fmt;
    s->npieces = n;
    /* Samples in body order: the parsed order groups a family split over the body (a, b, a). */
    bool sorted = true;
    for (size_t k = 0; k < n; k++) {
        order[k] = (uint32_t)k;
        sorted &= k == 0 || parsed->spans[k].line > parsed->spans[k - 1].line;
    }
    if (!sorted)
        qsort_r(order, n, sizeof(*order), span_line_cmp, parsed->spans);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const expfmt_span_t *sp = &parsed->spans[order[i]];
        /* The value must end its line: a timestamp or an exemplar after it is not recognised. */
        if (sp->value < pos || sp->value >= sp->value_end || sp->value_end >= len || body[sp->value_end] != '\n')
            goto fail;
        s->pieces[i] = (push_piece_t){XXH3_128bits(body + pos, sp->value - pos), (uint32_t)(sp->value - pos), order[i]};
        pos = sp->value_end + 1;
    }
    s->pieces[n] = (push_piece_t){XXH3_128bits(body + pos, len - pos), (uint32_t)(len - pos), UINT32_MAX};
    free(order);
    return s;
fail:
    free(order);
    push_shape_free(s);
    return NULL;
}

void push_shape_free(push_shape_t *s)
{
    if (s) {
        free(s->pieces);
        free(s);
    }
}

size_t push_shape_nvalues(const push_shape_t *s)
{
    return s->npieces;
}

static bool piece_is(const push_piece_t *p, const char *at)
{
    XXH128_hash_t h = XXH3_128bits(at, p->len);
    return h.low64 == p->h.low64 && h.high64 == p->h.high64;
}

bool push_shape_match(const push_shape_t *s, const char *body, size_t len, expfmt_format_t fmt, double *values)
{
    if (fmt != s->fmt)
        return false;
    size_t pos = 0;
    for (size_t i = 0; i < s->npieces; i++) {
        const push_piece_t *p = &s->pieces[i];
        if (len - pos <= p->len || !piece_is(p, body + pos))
            return false;
        const char *v = body + pos + p->len, *e = body + len;
        const char *nl = memchr(v, '\n', (size_t)(e - v));
        if (!nl)
            return false;
        /* The parser's value token ends at a blank: one inside would be a timestamp. */
        for (const char *q = v; q < nl; q++)
            if (*q == ' ' || *q == '\t')
                return false;
        if (expfmt__parse_float(v, (size_t)(nl - v), &values[p->sample]) < 0)
            return false;
        pos = (size_t)(nl - body) + 1;
    }
    const push_piece_t *tail = &s->pieces[s->npieces];
    return len - pos == tail->len && piece_is(tail, body + pos);
}
