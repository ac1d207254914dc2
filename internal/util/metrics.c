/* metrics — collector registry and process metrics; see metrics.h. */
#include "internal/util/metrics.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define METRICS_MAX 64

typedef struct {
    const char *name;
    metrics_collector_fn fn;         /* NULL for a stream collector */
    const metrics_stream_ops_t *ops; /* a stream collector's */
    void *ud;
    bool pushed;
} metrics_collector_t;
static metrics_collector_t metrics_collectors[METRICS_MAX];
static int metrics_n;
static double metrics_start_time;

__attribute__((constructor)) static void metrics_note_start(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    metrics_start_time = (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static int metrics_add(const char *name, metrics_collector_fn fn, const metrics_stream_ops_t *ops, void *ud,
                       bool pushed)
{
    if (metrics_n >= METRICS_MAX)
        return -1;
    metrics_collectors[metrics_n].name = name;
    metrics_collectors[metrics_n].fn = fn;
    metrics_collectors[metrics_n].ops = ops;
    metrics_collectors[metrics_n].ud = ud;
    metrics_collectors[metrics_n].pushed = pushed;
    metrics_n++;
    return 0;
}

int metrics_register(const char *name, metrics_collector_fn fn, void *ud)
{
    return metrics_add(name, fn, NULL, ud, false);
}

int metrics_register_pushed_stream(const char *name, const metrics_stream_ops_t *ops, void *ud)
{
    return metrics_add(name, NULL, ops, ud, true);
}

void metrics_unregister_all(void)
{
    metrics_n = 0;
}

struct metrics_render {
    int n;     /* collectors when it began */
    int at;    /* the collector the next piece starts in */
    void **hs; /* stream collectors' handles (NULL for the others, or when begin gave none) */
};

metrics_render_t *metrics_render_begin(void)
{
    metrics_render_t *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->n = metrics_n;
    h->hs = calloc((size_t)(h->n ? h->n : 1), sizeof(void *));
    if (!h->hs) {
        free(h);
        return NULL;
    }
    for (int i = 0; i < h->n; i++)
        if (metrics_collectors[i].ops)
            h->hs[i] = metrics_collectors[i].ops->begin(metrics_collectors[i].ud);
    return h;
}

bool metrics_render_next(metrics_render_t *h, buf_t *out, size_t max_bytes)
{
    size_t start = out->len;
    while (h->at < h->n && out->len - start < max_bytes) {
        const metrics_collector_t *c = &metrics_collectors[h->at];
        if (c->fn) {
            c->fn(c->ud, out);
            h->at++;
            continue;
        }
        size_t room = max_bytes - (out->len - start);
        if (h->hs[h->at] && c->ops->next(h->hs[h->at], out, room))
            continue; /* full */
        if (h->hs[h->at])
            c->ops->end(h->hs[h->at]);
        h->hs[h->at++] = NULL;
    }
    return h->at < h->n;
}

void metrics_render_end(metrics_render_t *h)
{
    if (!h)
        return;
    for (int i = 0; i < h->n; i++)
        if (h->hs[i])
            metrics_collectors[i].ops->end(h->hs[i]);
    free(h->hs);
    free(h);
}

static void metrics_write(buf_t *out, bool include_pushed)
{
    for (int i = 0; i < metrics_n; i++) {
        if (!include_pushed && metrics_collectors[i].pushed)
            continue;
        if (metrics_collectors[i].fn) {
            metrics_collectors[i].fn(metrics_collectors[i].ud, out);
            continue;
        }
        const metrics_stream_ops_t *ops = metrics_collectors[i].ops;
        void *h = ops->begin(metrics_collectors[i].ud);
        if (!h)
            continue;
        while (ops->next(h, out, SIZE_MAX))
            ;
        ops->end(h);
    }
}

void metrics_write_all(buf_t *out)
{
    metrics_write(out, true);
}

void metrics_write_self(buf_t *out)
{
    metrics_write(out, false);
}

double metrics_process_start_time(void)
{
    return metrics_start_time;
}

long long metrics_process_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    long long size = 0, rss = 0;
    if (fscanf(f, "%lld %lld", &size, &rss) != 2)
        rss = 0;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

void metrics_write_process(buf_t *out)
{
    long long vsize = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%lld", &vsize) != 1)
            vsize = 0;
        fclose(f);
    }
    vsize *= sysconf(_SC_PAGESIZE);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
                 (double)ru.ru_stime.tv_usec / 1e6;
    int fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.')
                fds++;
        closedir(d);
        fds--; /* the one opendir used */
    }
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    buf_puts(out, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
                  "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ");
    buf_put_float(out, cpu);
    buf_printf(out,
               "\n# HELP process_max_fds Maximum number of open file descriptors.\n"
               "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n"
               "# HELP process_open_fds Number of open file descriptors.\n"
               "# TYPE process_open_fds gauge\nprocess_open_fds %d\n"
               "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
               "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %lld\n"
               "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
               "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds ",
               (unsigned long long)rl.rlim_cur, fds, metrics_process_rss_bytes());
    buf_put_float(out, metrics_start_time);
    buf_printf(out,
               "\n# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
               "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %lld\n",
               vsize);
}
