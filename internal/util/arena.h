/*
 * arena — a bump allocator for request-lifetime memory: allocate freely while serving one
 * request, free everything in one call when the response is done (nginx's pool, h2o's mem_pool).
 *
 * Memory comes in blocks of at least 8 KiB; a request larger than a block gets its own block.
 * `arena_alloc` aborts on OOM; `arena_try_alloc` returns NULL (for sizes a client controls).
 * An optional limit caps the total so one request cannot grow without bound. Not thread-safe:
 * an arena belongs to one request on one worker.
 *
 * Budgets bound memory across arenas and threads: an arena given a budget charges every block it
 * takes (and releases it when the block is freed) to the budget and its parents, so one query's
 * arenas share a per-query budget whose parent is the process-wide query budget. A block that
 * would pass any limit is refused before it is allocated: arena_try_alloc returns NULL, and
 * arena_alloc calls the arena's fail handler (which must not return; the PromQL engine longjmps
 * out of the evaluation) or aborts when there is none.
 */
#ifndef SLUICE_UTIL_ARENA_H
#define SLUICE_UTIL_ARENA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct arena arena_t;

typedef struct arena_budget {
    _Atomic size_t used;
    size_t limit;                  /* 0: no limit of its own */
    struct arena_budget *parent;   /* charged too; may be NULL */
    _Atomic unsigned long refused; /* charges refused by this budget's own limit */
    _Atomic size_t peak;           /* the most `used` has been */
} arena_budget_t;

/* Charges n bytes to b and every parent; when any would pass its limit nothing is charged and the
 * budget that refused is returned (NULL: charged). Thread-safe. b may be NULL. */
arena_budget_t *arena_budget_charge(arena_budget_t *b, size_t n);
void arena_budget_release(arena_budget_t *b, size_t n);

/* Called by arena_alloc when a block is refused by a budget (not on malloc failure): `refused` is
 * the budget that said no, `want` the bytes asked for. Must not return. */
typedef void (*arena_fail_fn)(void *ctx, const arena_budget_t *refused, size_t want);
/* From now on a's blocks (those it already holds included) are charged to b. Returns -1 (and
 * charges nothing) when a's current blocks do not fit in b. */
int arena_set_budget(arena_t *a, arena_budget_t *b, arena_fail_fn fail, void *ctx);

/* limit = 0: no limit. Returns NULL on OOM. Free with arena_destroy. */
arena_t *arena_create(size_t limit);
void arena_destroy(arena_t *a);
/* Frees every block but the first; the arena can be used again. */
void arena_reset(arena_t *a);
/* 16-byte aligned; aborts on OOM or when the limit is hit. */
void *arena_alloc(arena_t *a, size_t n);
__attribute__((warn_unused_result)) void *arena_try_alloc(arena_t *a, size_t n);
void *arena_calloc(arena_t *a, size_t n, size_t size);
char *arena_strdup(arena_t *a, const char *s);
/* A copy of n bytes at p (n may be 0: then a valid, empty allocation). */
void *arena_memdup(arena_t *a, const void *p, size_t n);
char *arena_strndup(arena_t *a, const char *s, size_t n);
char *arena_sprintf(arena_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A position in an arena; rewinding to it frees everything allocated after it (blocks taken
 * since are given back) so a loop can drop each iteration's temporaries. */
typedef struct {
    void *block;
    size_t used, total;
} arena_mark_t;
arena_mark_t arena_mark(const arena_t *a);
void arena_rewind(arena_t *a, arena_mark_t m);
/* Bytes handed out so far. */
size_t arena_used(const arena_t *a);
/* Bytes of freed blocks kept for reuse by the next arenas (process-wide, bounded). */
size_t arena_cache_bytes(void);
/* Frees the cached blocks that no arena took since the previous call (the fewest the cache held
 * in between) and returns their bytes: called on a timer, so the cache shrinks to nothing when
 * queries stop and stays as large as they use while they come. */
size_t arena_cache_release_idle(void);

#endif
