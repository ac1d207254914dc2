/*
 * fuzz_push_group — internal/push/registry.c, what a text push builds for its group: each
 * sample's exposed labels (the grouping's override the body's, instance="" where neither has one,
 * strings interned and sorted with the neighbouring sample's help), the storage effect and the
 * rendered GET /metrics text. The first input byte picks the grouping (bit 0: with instance,
 * bit 1: with a third label; job is always there), the rest is the body (text 0.0.4).
 * Checks on an accepted push: every effect sample's labels are sorted and unique, carry the
 * grouping's values, and their metric-level set (less __name__, le and quantile) is one the body
 * asked for, computed here independently; every set the body asked for is in the effect; the
 * rendered GET /metrics text parses again (it did not when a family named like a histogram's
 * _bucket series stood beside it: the Pushgateway refuses such a push). A refused push leaves a
 * message.
 */
#include <stdbool.h>

#include "internal/expfmt/text_parse.h"
#include "internal/push/registry.h"
#include "internal/util/buf.h"
#include "internal/util/hashmap.h"
#include "tests/fuzz/fuzz.h"

#include <xxhash.h>

/* A label set as one string: "name\x01value\x02..." over the sorted labels, skipping __name__,
 * le, quantile and empty values (the effect drops those). Appended to b; returns its hash. */
static uint64_t set_key(const label_t *v, size_t n, buf_t *b)
{
    buf_reset(b);
    for (size_t i = 0; i < n; i++) {
        if (!v[i].value[0] || strcmp(v[i].name, "__name__") == 0 || strcmp(v[i].name, "le") == 0 ||
            strcmp(v[i].name, "quantile") == 0)
            continue;
        buf_puts(b, v[i].name);
        buf_putc(b, 1);
        buf_puts(b, v[i].value);
        buf_putc(b, 2);
    }
    return XXH3_64bits(b->data ? b->data : "", b->len);
}

static int label_name_cmp(const void *a, const void *b)
{
    return strcmp(((const label_t *)a)->name, ((const label_t *)b)->name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    label_t g[3] = {{"job", "j"}};
    size_t ng = 1;
    if (data[0] & 1)
        g[ng++] = (label_t){"instance", "i"};
    if (data[0] & 2)
        g[ng++] = (label_t){"zone", "z"};
    labels_t grouping = {g, ng};
    char *body = malloc(size); /* the parser changes it in place: a copy of exact size */
    if (!body)
        abort();
    memcpy(body, data + 1, size - 1);
    arena_t *a = arena_create(64u << 20);
    expfmt_limits_t lim = {.max_samples = 20000};
    expfmt_result_t res;
    char err[1024] = "";
    if (expfmt_parse_text(body, size - 1, false, &lim, a, &res, err, sizeof(err)) != 0) {
        arena_destroy(a);
        free(body);
        return 0;
    }
    /* The metric-level label sets the body asks for, from the parse alone. */
    hashmap_t want;
    hashmap_init(&want, NULL, HASHMAP_HASHED_KEYS);
    buf_t key = BUF_INIT;
    label_t *tmp = malloc(64 * sizeof(label_t));
    size_t tcap = 64;
    for (size_t f = 0; f < res.nfamilies; f++)
        for (size_t i = 0; i < res.families[f].nsamples; i++) {
            const expfmt_sample_t *s = &res.families[f].samples[i];
            if (s->nlabels + ng > tcap) {
                tcap = s->nlabels + ng;
                tmp = realloc(tmp, tcap * sizeof(label_t));
            }
            if (!tmp)
                abort();
            size_t n = 0;
            for (size_t k = 0; k < ng; k++)
                tmp[n++] = g[k];
            for (uint32_t k = 0; k < s->nlabels; k++) {
                bool overridden = false;
                for (size_t q = 0; q < ng; q++)
                    overridden |= strcmp(g[q].name, s->labels[k].name) == 0;
                if (!overridden)
                    tmp[n++] = s->labels[k];
            }
            qsort(tmp, n, sizeof(label_t), label_name_cmp);
            uint64_t h = set_key(tmp, n, &key);
            if (hashmap_put(&want, h, 1) < 0)
                abort();
        }

    push_registry_t *r = push_registry_new(NULL);
    push_pending_t *p;
    push_effect_t e;
    int rc = push_registry_prepare(r, &grouping, PUSH_PUT, &res, 1000, a, &p, &e, err, sizeof(err));
    if (rc == PUSH_OK) {
        hashmap_t seen;
        hashmap_init(&seen, NULL, HASHMAP_HASHED_KEYS);
        for (size_t i = 0; i < e.n; i++) {
            const labels_t *ls = &e.samples[i].labels;
            FUZZ_CHECK(labels_check_sorted_unique(ls) == 0);
            FUZZ_CHECK(labels_get(ls, "__name__") != NULL);
            for (size_t k = 0; k < ng; k++) {
                const char *v = labels_get(ls, g[k].name);
                FUZZ_CHECK(v && strcmp(v, g[k].value) == 0);
            }
            uint64_t h = set_key(ls->v, ls->n, &key);
            FUZZ_CHECK(hashmap_get(&want, h) != NULL);
            if (hashmap_put(&seen, h, 1) < 0)
                abort();
        }
        /* Every set asked for was stored (families without samples are refused by the parser). */
        FUZZ_CHECK(hashmap_count(&seen) == hashmap_count(&want));
        hashmap_free(&seen);
        push_registry_commit(r, p, NULL);
        buf_t text = BUF_INIT;
        push_registry_write_text(r, &text);
        arena_t *a2 = arena_create(64u << 20);
        expfmt_result_t back;
        char err2[1024] = "";
        expfmt_limits_t lim2 = {0};
        char *copy = malloc(text.len + 1); /* the parser changes its input: the text stays for the message */
        if (!copy)
            abort();
        if (text.len)
            memcpy(copy, text.data, text.len);
        int brc = expfmt_parse_text(copy, text.len, false, &lim2, a2, &back, err2, sizeof(err2));
        if (brc != 0)
            fprintf(stderr, "rendered text does not parse: %s\n%.*s\n", err2, (int)text.len, text.data);
        FUZZ_CHECK(brc == 0);
        free(copy);
        buf_free(&text);
        arena_destroy(a2);
    } else {
        FUZZ_CHECK(rc == PUSH_ERR_INVALID || rc == PUSH_ERR_NOMEM);
        FUZZ_CHECK(err[0] != 0);
    }
    push_registry_free(r);
    hashmap_free(&want);
    buf_free(&key);
    free(tmp);
    arena_destroy(a);
    free(body);
    return 0;
}
