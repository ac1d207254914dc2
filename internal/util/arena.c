/*
 * arena — bump allocator in a singly linked list of blocks (newest first). Allocation takes from
 * the head block; when it does not fit, a new block of max(8 KiB, 2 x last, n) is pushed.
 */
#include "internal/util/arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_MIN_BLOCK 8192
#define ARENA_ALIGN 16

typedef struct arena_block {
    struct arena_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
} arena_block_t;

struct arena {
    arena_block_t *head;
    size_t limit;
    size_t total;
};

arena_t *arena_create(size_t limit)
{
    arena_t *a = calloc(1, sizeof(*a));
    if (a)
        a->limit = limit;
    return a;
}

void arena_destroy(arena_t *a)
{
    if (!a)
        return;
    arena_block_t *b = a->head;
    while (b) {
        arena_block_t *n = b->next;
        free(b);
        b = n;
    }
    free(a);
}

void arena_reset(arena_t *a)
{
    arena_block_t *b = a->head;
    if (!b)
        return;
    arena_block_t *n = b->next;
    while (n) {
        arena_block_t *nn = n->next;
        free(n);
        n = nn;
    }
    b->next = NULL;
    b->used = 0;
    a->total = 0;
}

void *arena_try_alloc(arena_t *a, size_t n)
{
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / 2)
        return NULL;
    n = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (a->limit && a->total + n > a->limit)
        return NULL;
    arena_block_t *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t size = b ? b->size * 2 : ARENA_MIN_BLOCK;
        if (size > 1u << 20)
            size = 1u << 20;
        if (size < n)
            size = n;
        arena_block_t *nb = malloc(sizeof(*nb) + size);
        if (!nb)
            return NULL;
        nb->size = size;
        nb->used = 0;
        nb->next = a->head;
        a->head = nb;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->total += n;
    return p;
}

void *arena_alloc(arena_t *a, size_t n)
{
    void *p = arena_try_alloc(a, n);
    if (!p) {
        fputs("sluice: arena allocation failed\n", stderr);
        abort();
    }
    return p;
}

void *arena_calloc(arena_t *a, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = arena_alloc(a, n * size);
    memset(p, 0, n * size);
    return p;
}

char *arena_strndup(arena_t *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *arena_strdup(arena_t *a, const char *s)
{
    return arena_strndup(a, s, strlen(s));
}

char *arena_sprintf(arena_t *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = arena_alloc(a, (size_t)(n < 0 ? 0 : n) + 1);
    vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

size_t arena_used(const arena_t *a)
{
    return a->total;
}
