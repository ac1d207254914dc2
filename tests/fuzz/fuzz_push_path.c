/*
 * fuzz_push_path — the Pushgateway path parser of api/push.c (api__push_parse_path):
 * "/metrics/job[@base64]/<job>{/<name>[@base64]/<value>}" -> grouping labels, base64url decoding
 * included. The input is the path after "/metrics/" (libevent has already split off the query
 * and decoded %-escapes by then, so any byte but NUL can reach it). Checks: an accepted path
 * yields a sorted, unique set with a non-empty job and valid label names that do not start with "__".
 */
#include "api/push.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    char *path = malloc(size + sizeof("/metrics/"));
    if (!path)
        abort();
    memcpy(path, "/metrics/", 9);
    memcpy(path + 9, data, size);
    path[9 + size] = 0; /* an embedded NUL just ends the path early, as in a C string */
    arena_t *a = arena_create(16u << 20);
    labels_t ls = {0};
    char err[1024] = "";
    if (api__push_parse_path(path, a, &ls, err, sizeof(err)) == 0) {
        FUZZ_CHECK(ls.n >= 1);
        FUZZ_CHECK(labels_check_sorted_unique(&ls) == 0);
        bool job = false;
        for (size_t i = 0; i < ls.n; i++) {
            FUZZ_CHECK(labels_valid_name(ls.v[i].name, strlen(ls.v[i].name)));
            FUZZ_CHECK(strncmp(ls.v[i].name, "__", 2) != 0);
            if (strcmp(ls.v[i].name, "job") == 0)
                job = ls.v[i].value[0] != 0;
        }
        FUZZ_CHECK(job);
    } else {
        FUZZ_CHECK(err[0] != 0);
    }
    arena_destroy(a);
    free(path);
    return 0;
}
