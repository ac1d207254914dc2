/*
 * fuzz_text_parse — internal/expfmt/text_parse.c, the body of every text push
 * (PUT/POST /metrics/job/...). The first input byte picks the dialect (odd: OpenMetrics), the rest
 * is the body. Checks: a successful parse is self-consistent (sample counts add up, every family
 * has samples, every name and label is a valid UTF-8 string of the advertised length) and the
 * duplicate check runs on it; a failed parse leaves an empty result and a message.
 */
#include <stdbool.h>

#include "internal/expfmt/family.h"
#include "internal/expfmt/text_parse.h"
#include "internal/util/utf8.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool om = data[0] & 1;
    char *body = malloc(size); /* modified in place by the parser; exact size for ASan */
    if (!body)
        abort();
    memcpy(body, data + 1, size - 1);
    arena_t *a = arena_create(64u << 20);
    expfmt_result_t r;
    char err[512] = "";
    expfmt_limits_t lim = {.max_samples = 100000};
    int rc = expfmt_parse_text(body, size - 1, om, &lim, a, &r, err, sizeof(err));
    if (rc == 0) {
        size_t n = 0;
        for (size_t i = 0; i < r.nfamilies; i++) {
            const expfmt_family_t *f = &r.families[i];
            FUZZ_CHECK(f->name && f->nsamples > 0);
            FUZZ_CHECK(utf8_valid(f->name, strlen(f->name)));
            for (size_t j = 0; j < f->nsamples; j++) {
                const expfmt_sample_t *s = &f->samples[j];
                FUZZ_CHECK(s->name && s->name[0]);
                for (uint32_t k = 0; k < s->nlabels; k++) {
                    FUZZ_CHECK(s->labels[k].name && s->labels[k].value);
                    FUZZ_CHECK(labels_valid_name(s->labels[k].name, strlen(s->labels[k].name)));
                }
            }
            n += f->nsamples;
        }
        FUZZ_CHECK(n == r.nsamples);
        size_t fam, s1, s2;
        char derr[512];
        const char *ignore[] = {"job", "instance"};
        int d = expfmt_check_duplicates(&r, ignore, 2, NULL, a, &fam, &s1, &s2, derr, sizeof(derr));
        FUZZ_CHECK(d == 0 || d == 1 || d == EXPFMT_ENOMEM);
        if (d == 1)
            FUZZ_CHECK(fam < r.nfamilies && s1 < s2 && s2 < r.families[fam].nsamples);
    } else {
        FUZZ_CHECK(rc == EXPFMT_EPARSE || rc == EXPFMT_ELIMIT || rc == EXPFMT_ENOMEM);
        FUZZ_CHECK(err[0] != 0);
    }
    arena_destroy(a);
    free(body);
    return 0;
}
