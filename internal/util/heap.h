/*
 * heap — gives memory the process freed back to the kernel. glibc's malloc keeps freed memory
 * in its arenas (one per busy thread, up to 8 per core) and returns it only from the top of a heap
 * and only above a trim threshold that grows with the largest block ever freed; transient work
 * (a range query over 100k series, a 100 MB GET /metrics, a roll-up flush) therefore leaves
 * hundreds of MB resident but unused. The soak measured 840 MiB RSS with 364 MiB in use;
 * malloc_trim(0) brought it to 491 MiB. The main thread's timer calls heap_trim_tick, which trims
 * when RSS grew since the last trim, not on every tick.
 */
#ifndef SLUICE_UTIL_HEAP_H
#define SLUICE_UTIL_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/util/buf.h"

/* For a request that held `held` bytes and has freed them: trims when that was much. glibc keeps
 * what a thread freed in that thread's arena, where a query on another thread cannot use it;
 * without this, four queries held to a 600 MiB budget together left RSS 875 MiB up. (malloc_trim
 * walks every arena: worth it only after big requests; the main loop's timer trims the rest.) */
void heap_trim_after(size_t held);
/* Returns free pages of every arena to the kernel; the bytes RSS dropped by (0 if none). */
int64_t heap_trim(void);
/* The main loop's timer (every 10 s), after the caller freed `released` bytes of its own caches:
 * trims only when that was much, or RSS grew by HEAP_TRIM_GROWTH (or an eighth) since the last
 * trim left it. Trimming on every tick gave back the same ~10 MB each time: the pushes' working
 * set, freed between pushes and faulted in again by the next ones (a fresh page costs up to
 * ~70 us on the shared VM), while malloc_trim held each arena's lock for 50-200 ms under load,
 * stalling every thread that allocates from it. Returns what heap_trim returned, or 0. */
int64_t heap_trim_tick(size_t released);
/* heap_trim_tick's rule: RSS now, RSS after the last trim (0: none yet), bytes just released. */
bool heap_trim_wanted(int64_t rss, int64_t base, size_t released);
#define HEAP_TRIM_GROWTH ((int64_t)32 << 20)
/* sluice_heap_trims_total, sluice_heap_trimmed_bytes_total, sluice_heap_in_use_bytes (malloc's
 * own count at the last trim: RSS well above it is fragmentation or retained free memory),
 * sluice_heap_trim_seconds_total. */
void heap_write_metrics(void *ud, buf_t *out);

#endif
