/*
 * push shape — see shape.h for what it recognises and why that is sound.
 *
 * Layout: one piece per sample, in body order, plus the tail after the last sample's line; of
 * each piece only its length, and one XXH3-128 over all pieces' bytes in order (the lengths fix
 * where every piece starts and ends, so equal lengths and an equal hash mean equal pieces).
 *
 *   shape { fmt ; n ; hash ; len[n + 1] ; sample[n], the index of each piece's value in the
 *           parsed body (absent when it is the piece's own index: samples in body order) }
 *
 * 4 bytes per series: a hash per piece (16) and its sample index (4) made it 24, ~6 MB for the
 * 256k series of 200 Flink TaskManagers, kept for as long as their groups live.
 *
 * Matching walks the new body once: feed the next `len` bytes to the hash, then read the value up
 * to '\n'; at the end compare the hash.
 */
#include "internal/push/shape.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

struct push_shape {
    expfmt_format_t fmt;
    size_t npieces;   /* = samples; len[npieces] is the tail's */
    XXH128_hash_t h;  /* of every piece's bytes, in order */
    uint32_t *len;    /* bytes before each value (from the end of the previous sample's line) */
    uint32_t *sample; /* the value's index in the parsed body; NULL: the piece's own index */
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
    /* Samples in body order: the parsed order groups a family split over the body (a, b, a). */
    bool sorted = true;
    for (size_t k = 1; k < n && sorted; k++)
        sorted = parsed->spans[k].line > parsed->spans[k - 1].line;
    push_shape_t *s = calloc(1, sizeof(*s));
    uint32_t *order = sorted ? NULL : malloc((n ? n : 1) * sizeof(*order));
    XXH3_state_t *st = XXH3_createState();
    if (!s || (!sorted && !order) || !st || !(s->len = malloc((n + 1) * sizeof(*s->len))))
        goto fail;
    s->fmt = fmt;
    s->npieces = n;
    if (!sorted) {
        for (size_t k = 0; k < n; k++)
            order[k] = (uint32_t)k;
        qsort_r(order, n, sizeof(*order), span_line_cmp, parsed->spans);
    }
    XXH3_128bits_reset(st);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const expfmt_span_t *sp = &parsed->spans[order ? order[i] : i];
        /* The value must end its line: a timestamp or an exemplar after it is not recognised. */
        if (sp->value < pos || sp->value >= sp->value_end || sp->value_end >= len || body[sp->value_end] != '\n')
            goto fail;
        XXH3_128bits_update(st, body + pos, sp->value - pos);
        s->len[i] = (uint32_t)(sp->value - pos);
        pos = sp->value_end + 1;
    }
    XXH3_128bits_update(st, body + pos, len - pos);
    s->len[n] = (uint32_t)(len - pos);
    s->h = XXH3_128bits_digest(st);
    s->sample = order; /* NULL when sorted */
    XXH3_freeState(st);
    return s;
fail:
    free(order);
    XXH3_freeState(st);
    push_shape_free(s);
    return NULL;
}

void push_shape_free(push_shape_t *s)
{
    if (s) {
        free(s->len);
        free(s->sample);
        free(s);
    }
}

size_t push_shape_nvalues(const push_shape_t *s)
{
    return s->npieces;
}

bool push_shape_match(const push_shape_t *s, const char *body, size_t len, expfmt_format_t fmt, double *values)
{
    if (fmt != s->fmt)
        return false;
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    size_t pos = 0;
    for (size_t i = 0; i < s->npieces; i++) {
        uint32_t plen = s->len[i];
        if (len - pos <= plen)
            return false;
        XXH3_128bits_update(&st, body + pos, plen);
        const char *v = body + pos + plen, *e = body + len;
        const char *nl = memchr(v, '\n', (size_t)(e - v));
        if (!nl)
            return false;
        /* The parser's value token ends at a blank: one inside would be a timestamp. */
        for (const char *q = v; q < nl; q++)
            if (*q == ' ' || *q == '\t')
                return false;
        if (expfmt__parse_float(v, (size_t)(nl - v), &values[s->sample ? s->sample[i] : i]) < 0)
            return false;
        pos = (size_t)(nl - body) + 1;
    }
    if (len - pos != s->len[s->npieces])
        return false;
    XXH3_128bits_update(&st, body + pos, len - pos);
    return XXH128_isEqual(XXH3_128bits_digest(&st), s->h) != 0;
}
