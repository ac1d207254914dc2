/*
 * tests/fuzz — shared bits of the libFuzzer targets.
 *
 * Each tests/fuzz/fuzz_<surface>.c defines LLVMFuzzerTestOneInput for one input surface sluice
 * exposes to clients or reads from disk. It is built two ways (CMakeLists.txt, "fuzzing" block):
 *   - with -DSLUICE_FUZZ=ON (clang): linked with libFuzzer + ASan + UBSan -> tests/fuzz/<name>;
 *     tests/fuzz/run.sh runs each for N seconds from tests/fuzz/corpus/<name>/;
 *   - in every other build: linked with tests/fuzz/replay_main.c -> tests/fuzz/replay_<name>,
 *     which feeds it every file of corpus/<name>/ and regressions/<name>/ once (ctest
 *     fuzz/replay/<name>), so a crash found once stays fixed under the ordinary ASan build.
 * A target must not leak, must not keep state between inputs — except what it cannot rebuild per
 * input (fuzz_control_http's servers, fuzz_promql_eval's data set): that is made on first use
 * (replay_main calls no initializer), freed at exit, and kept from growing without bound — and
 * checks properties with FUZZ_CHECK (abort on failure, so libFuzzer records the input as a crash).
 */
#ifndef SLUICE_TESTS_FUZZ_H
#define SLUICE_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond);                              \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* A NUL-terminated heap copy of data[0:size] (inputs are not terminated). Caller frees. */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    if (size)
        memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif
