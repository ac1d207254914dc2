/*
 * fuzz_proto_parse — internal/expfmt/proto_parse.c, delimited io.prometheus.client.MetricFamily
 * push bodies. Same consistency checks as fuzz_text_parse.
 */
#include "internal/expfmt/family.h"
#include "internal/expfmt/proto_parse.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    arena_t *a = arena_create(64u << 20);
    expfmt_result_t r;
    char err[512] = "";
    expfmt_limits_t lim = {.max_samples = 100000};
    int rc = expfmt_parse_proto(data, size, &lim, a, &r, err, sizeof(err));
    if (rc == 0) {
        size_t n = 0;
        for (size_t i = 0; i < r.nfamilies; i++) {
            const expfmt_family_t *f = &r.families[i];
            FUZZ_CHECK(f->name && f->nsamples > 0);
            for (size_t j = 0; j < f->nsamples; j++) {
                const expfmt_sample_t *s = &f->samples[j];
                FUZZ_CHECK(s->name && s->name[0]);
                for (uint32_t k = 0; k < s->nlabels; k++)
                    FUZZ_CHECK(s->labels[k].name && s->labels[k].value);
            }
            n += f->nsamples;
        }
        FUZZ_CHECK(n == r.nsamples);
        size_t fam, s1, s2;
        char derr[512];
        int d = expfmt_check_duplicates(&r, NULL, 0, NULL, a, &fam, &s1, &s2, derr, sizeof(derr));
        FUZZ_CHECK(d == 0 || d == 1 || d == EXPFMT_ENOMEM);
    } else {
        FUZZ_CHECK(rc == EXPFMT_EPARSE || rc == EXPFMT_ELIMIT || rc == EXPFMT_ENOMEM);
        FUZZ_CHECK(err[0] != 0);
    }
    arena_destroy(a);
    return 0;
}
