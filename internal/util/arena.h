/*
 * arena — a bump allocator for request-lifetime memory: allocate freely while serving one
 * request, free everything in one call when the response is done (nginx's pool, h2o's mem_pool).
 *
 * Memory comes in blocks of at least 8 KiB; a request larger than a block gets its own block.
 * `arena_alloc` aborts on OOM; `arena_try_alloc` returns NULL (for sizes a client controls).
 * An optional limit caps the total so one request cannot grow without bound. Not thread-safe:
 * an arena belongs to one request on one worker.
 */
#ifndef SLUICE_UTIL_ARENA_H
#define SLUICE_UTIL_ARENA_H

#include <stddef.h>

typedef struct arena arena_t;

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
char *arena_strndup(arena_t *a, const char *s, size_t n);
char *arena_sprintf(arena_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Bytes handed out so far. */
size_t arena_used(const arena_t *a);

#endif
