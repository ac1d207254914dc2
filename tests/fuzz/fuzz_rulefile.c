/*
 * fuzz_rulefile — internal/rules/rulefile.c: a Prometheus rule file (YAML via libyaml, every
 * expr through the PromQL parser, every label/annotation through rules/template). The loader
 * reads a path, so each input is written to one scratch file per process first. Checks: the
 * result is either errors (and nothing added) or groups whose rules all have a name, an expr and
 * a parsed AST.
 */
#include <unistd.h>

#include "internal/rules/rulefile.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof(path), "/tmp/sluice-fuzz-rules-%d.yml", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    rules_file_t rf = {0};
    buf_t errs;
    buf_init(&errs);
    int nerr = rules_file_load(&rf, path, &errs);
    if (nerr > 0) {
        FUZZ_CHECK(errs.len > 0);
        FUZZ_CHECK(rf.ngroups == 0);
    } else {
        FUZZ_CHECK(nerr == 0);
        for (size_t g = 0; g < rf.ngroups; g++) {
            FUZZ_CHECK(rf.groups[g].name != NULL);
            for (size_t i = 0; i < rf.groups[g].nrules; i++) {
                const rules_rule_def_t *r = &rf.groups[g].rules[i];
                FUZZ_CHECK(r->name && r->expr && r->ast);
            }
        }
    }
    rules_file_free(&rf);
    buf_free(&errs);
    return 0;
}
