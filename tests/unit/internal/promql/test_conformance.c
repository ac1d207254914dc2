/*
 * Runs Prometheus 2.42's own PromQL test scripts ($SLUICE_SHARED_DIR/conformance/promql-2.42/
 * *.test — data kept outside the repository) through sluice's engine and asserts a floor of
 * passing eval blocks per file (today: all 566, each also checked as a range query and with @
 * pinned, as Prometheus' runner does). Failures are printed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal/promql/testscript.h"

typedef struct {
    const char *file;
    int floor; /* eval blocks that must pass */
} suite_t;

static const suite_t suites[] = {
    {"aggregators.test", 83},  {"at_modifier.test", 33}, {"collision.test", 2},
    {"functions.test", 207},    {"histograms.test", 38},  {"literals.test", 20},
    {"operators.test", 94},    {"selectors.test", 31},   {"staleness.test", 14},
    {"subquery.test", 25},     {"trig_functions.test", 19},
};

static void test_conformance(void **state)
{
    (void)state;
    const char *shared = getenv("SLUICE_SHARED_DIR");
    if (!shared) {
        fprintf(stderr, "SLUICE_SHARED_DIR not set; skipping\n");
        skip();
    }
    int total = 0, passed = 0;
    bool below = false;
    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/conformance/promql-2.42/%s", shared, suites[i].file);
        promql_script_stats_t st = {0};
        int rc = promql_script_run_file(path, stderr, &st);
        printf("%-22s %3d/%3d evals pass%s\n", suites[i].file, st.passed, st.evals, rc ? " (script errors)" : "");
        total += st.evals;
        passed += st.passed;
        if (st.passed < suites[i].floor) {
            printf("  below floor %d\n", suites[i].floor);
            below = true;
        }
    }
    printf("total: %d/%d\n", passed, total);
    assert_false(below);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conformance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
