/*
 * replay_main — a main() for the fuzz targets when libFuzzer is not linked: runs
 * LLVMFuzzerTestOneInput once on every regular file under each argument (files or directories,
 * one level deep). Used by ctest fuzz/replay/<name> to keep the seed corpus and every crash
 * reproducer (tests/fuzz/regressions/<name>/) passing under the ordinary ASan/UBSan build.
 * Exit 0 when every input ran (a crash aborts), 1 when an argument cannot be read or no input
 * was found at all (a missing corpus must not pass silently).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (n == cap)
            b = realloc(b, cap *= 2);
        size_t got = fread(b + n, 1, cap - n, f);
        if (got == 0)
            break;
        n += got;
    }
    fclose(f);
    /* An exact-size copy so ASan sees reads one past the input. */
    uint8_t *in = malloc(n ? n : 1);
    memcpy(in, b, n);
    free(b);
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    size_t total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 1;
            total++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 1;
        }
        char **names = NULL;
        size_t nn = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            names = realloc(names, (nn + 1) * sizeof(char *));
            names[nn++] = strdup(e->d_name);
        }
        closedir(d);
        if (nn) /* an empty folder (only a .gitkeep): qsort must not see NULL */
            qsort(names, nn, sizeof(char *), cmp_str);
        for (size_t j = 0; j < nn; j++) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], names[j]);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                if (run_file(path) != 0)
                    return 1;
                total++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("replayed %zu inputs\n", total);
    return total ? 0 : 1;
}
