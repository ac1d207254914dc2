/*
 * promql_test — runs PromQL test scripts (Prometheus' `.test` format, see
 * internal/promql/testscript.h) and prints one line per file with its pass count, then a total.
 *
 *   promql_test [-q] FILE|DIR...     (a DIR runs every *.test in it, sorted)
 *
 * Failures are described on stderr as "file:line: message" (-q: only the summary). Exit status:
 * 0 when every eval of every file passed, 1 when some failed, 2 when a file could not be read
 * or parsed.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "internal/promql/testscript.h"

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_one(const char *path, int quiet, promql_script_stats_t *total, int *bad_files)
{
    promql_script_stats_t st = {0};
    int rc = promql_script_run_file(path, quiet ? NULL : stderr, &st);
    printf("%-60s %4d/%-4d%s\n", path, st.passed, st.evals, rc != 0 ? "  (unreadable)" : st.failed ? "  FAIL" : "");
    total->evals += st.evals;
    total->passed += st.passed;
    total->failed += st.failed;
    if (rc != 0)
        (*bad_files)++;
    return rc;
}

static void run_dir(const char *dir, int quiet, promql_script_stats_t *total, int *bad_files)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "promql_test: cannot open %s\n", dir);
        (*bad_files)++;
        return;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".test") != 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            names = realloc(names, cap * sizeof(*names));
        }
        size_t plen = strlen(dir) + len + 2;
        names[n] = malloc(plen);
        snprintf(names[n++], plen, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), name_cmp);
    for (size_t i = 0; i < n; i++) {
        run_one(names[i], quiet, total, bad_files);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    int quiet = 0, bad_files = 0, nargs = 0;
    promql_script_stats_t total = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-q") == 0) {
            quiet = 1;
            continue;
        }
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: promql_test [-q] FILE|DIR...\n");
            return 0;
        }
        nargs++;
        struct stat sb;
        if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode))
            run_dir(argv[i], quiet, &total, &bad_files);
        else
            run_one(argv[i], quiet, &total, &bad_files);
    }
    if (!nargs) {
        fprintf(stderr, "usage: promql_test [-q] FILE|DIR...\n");
        return 2;
    }
    printf("%-60s %4d/%-4d\n", "total", total.passed, total.evals);
    return bad_files ? 2 : total.failed ? 1 : 0;
}
