/*
 * expfmt_check — runs sluice's push-body parsers on stdin and prints the outcome, for
 * differential tests against the real Pushgateway.
 *
 *   expfmt_check [text|openmetrics|proto] < body
 *   -> "OK <families> <samples>" and exit 0, or "ERR <message>" and exit 1
 *   expfmt_check -v ... also prints every sample: <name>{<labels>} <value> [ts]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal/expfmt/proto_parse.h"
#include "internal/expfmt/text_parse.h"

int main(int argc, char **argv)
{
    int verbose = 0, ai = 1;
    if (ai < argc && strcmp(argv[ai], "-v") == 0)
        verbose = 1, ai++;
    const char *fmt = ai < argc ? argv[ai] : "text";
    size_t cap = 1 << 16, len = 0;
    char *body = malloc(cap);
    size_t n;
    while ((n = fread(body + len, 1, cap - len, stdin)) > 0) {
        len += n;
        if (len == cap)
            body = realloc(body, cap *= 2);
    }
    arena_t *a = arena_create(256u << 20);
    expfmt_result_t r;
    char err[1024];
    int rc = strcmp(fmt, "proto") == 0
                 ? expfmt_parse_proto((const uint8_t *)body, len, NULL, a, &r, err, sizeof(err))
                 : expfmt_parse_text(body, len, strcmp(fmt, "openmetrics") == 0, NULL, a, &r, err, sizeof(err));
    if (rc) {
        printf("ERR %s\n", err);
        arena_destroy(a);
        free(body);
        return 1;
    }
    printf("OK %zu %zu\n", r.nfamilies, r.nsamples);
    for (size_t f = 0; verbose && f < r.nfamilies; f++) {
        const expfmt_family_t *F = &r.families[f];
        printf("# %s %s\n", F->name, expfmt_type_name(F->type));
        for (size_t i = 0; i < F->nsamples; i++) {
            const expfmt_sample_t *s = &F->samples[i];
            printf("%s{", s->name);
            for (uint32_t l = 0; l < s->nlabels; l++)
                printf("%s%s=\"%s\"", l ? "," : "", s->labels[l].name, s->labels[l].value);
            printf("} %.17g", s->value);
            if (s->has_timestamp)
                printf(" %lld", (long long)s->timestamp_ms);
            printf("\n");
        }
    }
    arena_destroy(a);
    free(body);
    return 0;
}
