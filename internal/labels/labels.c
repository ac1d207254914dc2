/*
 * labels — label set helpers: sorting, validation, hashing, comparison.
 *
 * Sets are sorted by name in byte order (strcmp), exactly as Prometheus' labels.Labels, so two
 * equal sets compare equal element by element and hash identically. The hash is xxh3-64 over
 * "name \xff value \xff" for every label in order; 0xff can never occur in valid UTF-8, so
 * {a="b\xffc"} style collisions need invalid input to even be possible. Nothing here allocates.
 */
#include "internal/labels/labels.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

static int label_cmp_name(const void *a, const void *b)
{
    const label_t *x = a, *y = b;
    return strcmp(x->name, y->name);
}

void labels_sort(labels_t *ls)
{
    /* Sets are short and usually sorted already (Prometheus clients sort): check first. */
    if (ls->n < 2 || labels_check_sorted_unique(ls) == 0)
        return;
    qsort(ls->v, ls->n, sizeof(label_t), label_cmp_name);
}

int labels_check_sorted_unique(const labels_t *ls)
{
    for (size_t i = 1; i < ls->n; i++)
        if (strcmp(ls->v[i - 1].name, ls->v[i].name) >= 0)
            return -1;
    return 0;
}

uint64_t labels_hash(const labels_t *ls)
{
    /* Short sets (the common case: < 512 bytes) hash from a stack buffer in one call, which is
     * several times faster than the streaming API; longer ones stream. Both give the same value
     * because xxh3 streaming equals one-shot over the concatenation. Each string is measured
     * once, as it is copied (measuring all first, then copying, read every string twice). */
    char small[512];
    size_t off = 0;
    for (size_t i = 0; i < ls->n; i++) {
        size_t nl = strlen(ls->v[i].name), vl = strlen(ls->v[i].value);
        if (nl + vl + 2 > sizeof(small) - off)
            goto stream;
        memcpy(small + off, ls->v[i].name, nl);
        off += nl;
        small[off++] = (char)0xff;
        memcpy(small + off, ls->v[i].value, vl);
        off += vl;
        small[off++] = (char)0xff;
    }
    return XXH3_64bits(small, off);
stream:;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    static const char sep = (char)0xff;
    for (size_t i = 0; i < ls->n; i++) {
        XXH3_64bits_update(&st, ls->v[i].name, strlen(ls->v[i].name));
        XXH3_64bits_update(&st, &sep, 1);
        XXH3_64bits_update(&st, ls->v[i].value, strlen(ls->v[i].value));
        XXH3_64bits_update(&st, &sep, 1);
    }
    return XXH3_64bits_digest(&st);
}

bool labels_equal(const labels_t *a, const labels_t *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->v[i].name, b->v[i].name) != 0 || strcmp(a->v[i].value, b->v[i].value) != 0)
            return false;
    return true;
}

int labels_compare(const labels_t *a, const labels_t *b)
{
    size_t n = a->n < b->n ? a->n : b->n;
    for (size_t i = 0; i < n; i++) {
        int c = strcmp(a->v[i].name, b->v[i].name);
        if (c != 0)
            return c < 0 ? -1 : 1;
        c = strcmp(a->v[i].value, b->v[i].value);
        if (c != 0)
            return c < 0 ? -1 : 1;
    }
    return a->n < b->n ? -1 : a->n > b->n ? 1 : 0;
}

const char *labels_get(const labels_t *ls, const char *name)
{
    for (size_t i = 0; i < ls->n; i++)
        if (strcmp(ls->v[i].name, name) == 0)
            return ls->v[i].value;
    return NULL;
}

static bool is_alpha_(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool labels_valid_name(const char *s, size_t n)
{
    if (n == 0 || !is_alpha_((unsigned char)s[0]))
        return false;
    for (size_t i = 1; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!is_alpha_(c) && !(c >= '0' && c <= '9'))
            return false;
    }
    return true;
}

bool labels_valid_metric_name(const char *s, size_t n)
{
    if (n == 0 || !(is_alpha_((unsigned char)s[0]) || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!is_alpha_(c) && !(c >= '0' && c <= '9') && c != ':')
            return false;
    }
    return true;
}

size_t labels_strings_size(const labels_t *ls)
{
    size_t n = 0;
    for (size_t i = 0; i < ls->n; i++)
        n += strlen(ls->v[i].name) + strlen(ls->v[i].value) + 2;
    return n;
}

char *labels_pack(const labels_t *ls, label_t *out_v, char *p)
{
    for (size_t i = 0; i < ls->n; i++) {
        size_t nl = strlen(ls->v[i].name) + 1, vl = strlen(ls->v[i].value) + 1;
        memcpy(p, ls->v[i].name, nl);
        out_v[i].name = p;
        p += nl;
        memcpy(p, ls->v[i].value, vl);
        out_v[i].value = p;
        p += vl;
    }
    return p;
}
