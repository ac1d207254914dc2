/* heap — returns freed malloc memory to the kernel; see heap.h. */
#include "internal/util/heap.h"

#include <malloc.h>
#include <stdatomic.h>

#include "internal/util/arena.h"
#include "internal/util/clock.h"
#include "internal/util/metrics.h"

static _Atomic uint64_t heap_trims;
static _Atomic uint64_t heap_trimmed_bytes;
static _Atomic uint64_t heap_trim_ns;
static _Atomic uint64_t heap_in_use; /* at the last trim */
static _Atomic int64_t heap_rss_base; /* RSS right after the last trim; 0: none yet */

#define HEAP_TRIM_AFTER_BYTES (64u << 20)

void heap_trim_after(size_t held)
{
    if (held >= HEAP_TRIM_AFTER_BYTES)
        heap_trim();
}

int64_t heap_trim(void)
{
    uint64_t t0 = clock_mono_ns();
    long long before = metrics_process_rss_bytes();
    malloc_trim(0);
    long long after = metrics_process_rss_bytes();
    struct mallinfo2 mi = mallinfo2(); /* walks the arenas too: here, not on every scrape */
    atomic_store(&heap_in_use, (uint64_t)(mi.uordblks + mi.hblkhd));
    int64_t freed = before > after ? (int64_t)(before - after) : 0;
    atomic_store(&heap_rss_base, after > 0 ? (int64_t)after : 1);
    atomic_fetch_add(&heap_trims, 1);
    atomic_fetch_add(&heap_trimmed_bytes, (uint64_t)freed);
    atomic_fetch_add(&heap_trim_ns, clock_mono_ns() - t0);
    return freed;
}

bool heap_trim_wanted(int64_t rss, int64_t base, size_t released)
{
    if (base <= 0 || released >= (size_t)HEAP_TRIM_GROWTH)
        return true;
    int64_t growth = base / 8 > HEAP_TRIM_GROWTH ? base / 8 : HEAP_TRIM_GROWTH;
    return rss - base >= growth;
}

int64_t heap_trim_tick(size_t released)
{
    if (!heap_trim_wanted(metrics_process_rss_bytes(), atomic_load(&heap_rss_base), released))
        return 0;
    return heap_trim();
}

void heap_write_metrics(void *ud, buf_t *out)
{
    (void)ud;
    buf_printf(out,
               "# HELP sluice_heap_trims_total Times freed heap memory was returned to the kernel.\n"
               "# TYPE sluice_heap_trims_total counter\nsluice_heap_trims_total %llu\n"
               "# HELP sluice_heap_trimmed_bytes_total Resident bytes given back by heap trims.\n"
               "# TYPE sluice_heap_trimmed_bytes_total counter\nsluice_heap_trimmed_bytes_total %llu\n"
               "# HELP sluice_heap_in_use_bytes Heap bytes allocated and not freed, at the last trim.\n"
               "# TYPE sluice_heap_in_use_bytes gauge\nsluice_heap_in_use_bytes %llu\n"
               "# HELP sluice_heap_trim_seconds_total Time spent in heap trims.\n"
               "# TYPE sluice_heap_trim_seconds_total counter\nsluice_heap_trim_seconds_total ",
               (unsigned long long)atomic_load(&heap_trims), (unsigned long long)atomic_load(&heap_trimmed_bytes),
               (unsigned long long)atomic_load(&heap_in_use));
    buf_put_float(out, (double)atomic_load(&heap_trim_ns) / 1e9);
    buf_printf(out,
               "\n# HELP sluice_heap_arena_cache_bytes Freed 1 MiB arena blocks kept for the next queries.\n"
               "# TYPE sluice_heap_arena_cache_bytes gauge\nsluice_heap_arena_cache_bytes %zu\n",
               arena_cache_bytes());
}
