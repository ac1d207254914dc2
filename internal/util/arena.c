/*
 * arena — bump allocator in a singly linked list of blocks (newest first). Allocation takes from
 * the head block; when it does not fit, a new block of max(8 KiB, 2 x last (at most 1 MiB), n) is
 * pushed.
 *
 * Freed 1 MiB blocks go to a process-wide cache (at most ARENA_CACHE_BYTES) that the next arena
 * takes them from: a range query allocates tens of MB in such blocks, and when every query got
 * fresh pages from the kernel, page faults were about a third of its time. (On the shared VM of
 * issue #19 a fresh page cost ~70 us, ~17 ms a MiB; a dashboard panel over 43,000 series takes
 * ~85 MiB of blocks, more than the 64 MiB the cache had: 128 MiB.) What the cache holds
 * stays resident while queries keep coming; arena_cache_release_idle(), called on a timer, frees
 * the blocks no arena took since its last call, so an idle server holds none of it.
 */
#include "internal/util/arena.h"

#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_MIN_BLOCK 8192
#define ARENA_MAX_BLOCK ((size_t)1 << 20)
#define ARENA_BIG_PIECE ((size_t)64 << 10) /* bigger pieces take a standard block (arena_try_alloc) */
#define ARENA_ALIGN 16
#define ARENA_CACHE_BYTES ((size_t)128 << 20)

typedef struct arena_block {
    struct arena_block *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
} arena_block_t;

/* Free ARENA_MAX_BLOCK blocks shared by all arenas (linked through next). Under AddressSanitizer a
 * cached block's data is poisoned, so a use after free is still caught. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CACHE_POISON(b) ASAN_POISON_MEMORY_REGION((b)->data, (b)->size)
#define CACHE_UNPOISON(b) ASAN_UNPOISON_MEMORY_REGION((b)->data, (b)->size)
#else
#define CACHE_POISON(b) ((void)(b))
#define CACHE_UNPOISON(b) ((void)(b))
#endif
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static arena_block_t *cache_head;
static size_t cache_n;
static size_t cache_low; /* fewest blocks cached since the last arena_cache_release_idle() */

static arena_block_t *cache_take(void)
{
    pthread_mutex_lock(&cache_mu);
    arena_block_t *b = cache_head;
    if (b) {
        cache_head = b->next;
        cache_n--;
        if (cache_n < cache_low)
            cache_low = cache_n;
    }
    pthread_mutex_unlock(&cache_mu);
    if (b)
        CACHE_UNPOISON(b);
    return b;
}

/* Keeps b if it is a standard block and the cache has room; false: the caller frees it. */
static bool cache_give(arena_block_t *b)
{
    if (b->size != ARENA_MAX_BLOCK)
        return false;
    pthread_mutex_lock(&cache_mu);
    bool kept = (cache_n + 1) * (sizeof(*b) + ARENA_MAX_BLOCK) <= ARENA_CACHE_BYTES;
    if (kept) {
        CACHE_POISON(b);
        b->next = cache_head;
        cache_head = b;
        cache_n++;
    }
    pthread_mutex_unlock(&cache_mu);
    return kept;
}

size_t arena_cache_bytes(void)
{
    pthread_mutex_lock(&cache_mu);
    size_t n = cache_n;
    pthread_mutex_unlock(&cache_mu);
    return n * (sizeof(arena_block_t) + ARENA_MAX_BLOCK);
}

size_t arena_cache_release_idle(void)
{
    /* The cache is a stack: its bottom cache_low blocks stayed untouched all interval. Taking them
     * from the top instead is the same count and keeps the list walk short. */
    pthread_mutex_lock(&cache_mu);
    arena_block_t *idle = NULL;
    size_t n = cache_low;
    for (size_t i = 0; i < n; i++) {
        arena_block_t *b = cache_head;
        cache_head = b->next;
        b->next = idle;
        idle = b;
    }
    cache_n -= n;
    cache_low = cache_n;
    pthread_mutex_unlock(&cache_mu);
    while (idle) {
        arena_block_t *next = idle->next;
        CACHE_UNPOISON(idle);
        free(idle);
        idle = next;
    }
    return n * (sizeof(arena_block_t) + ARENA_MAX_BLOCK);
}

struct arena {
    arena_block_t *head;
    size_t limit;
    size_t total;
    arena_budget_t *budget;
    size_t charged;       /* bytes of blocks charged to budget */
    arena_block_t *spare; /* the biggest block given back by reset/rewind, reused before malloc */
    arena_fail_fn fail;
    void *fail_ctx;
    arena_budget_t *refused; /* set by a try_alloc the budget refused */
};

arena_budget_t *arena_budget_charge(arena_budget_t *b, size_t n)
{
    for (arena_budget_t *p = b; p; p = p->parent) {
        size_t before = atomic_fetch_add(&p->used, n);
        if (p->limit && (before + n > p->limit || before + n < before)) {
            atomic_fetch_sub(&p->used, n);
            for (arena_budget_t *q = b; q != p; q = q->parent)
                atomic_fetch_sub(&q->used, n);
            atomic_fetch_add(&p->refused, 1);
            return p;
        }
        size_t peak = atomic_load(&p->peak);
        while (before + n > peak && !atomic_compare_exchange_weak(&p->peak, &peak, before + n))
            ;
    }
    return NULL;
}

void arena_budget_release(arena_budget_t *b, size_t n)
{
    for (arena_budget_t *p = b; p; p = p->parent) {
        assert(atomic_load(&p->used) >= n);
        atomic_fetch_sub(&p->used, n);
    }
}

static size_t block_bytes(const arena_block_t *b)
{
    return sizeof(*b) + b->size;
}

static void block_free(arena_t *a, arena_block_t *b)
{
    if (a->budget) {
        arena_budget_release(a->budget, block_bytes(b));
        a->charged -= block_bytes(b);
    }
    if (!cache_give(b))
        free(b);
}

/* Keeps b as the spare when it beats the current one: a loop that rewinds every iteration then
 * reuses its blocks instead of asking malloc (and, for big blocks, the kernel) each time. */
static void block_retire(arena_t *a, arena_block_t *b)
{
    if (a->spare && a->spare->size >= b->size) {
        block_free(a, b);
        return;
    }
    if (a->spare)
        block_free(a, a->spare);
    a->spare = b;
}

int arena_set_budget(arena_t *a, arena_budget_t *b, arena_fail_fn fail, void *ctx)
{
    size_t have = a->spare ? block_bytes(a->spare) : 0;
    for (arena_block_t *k = a->head; k; k = k->next)
        have += block_bytes(k);
    if (b && have && arena_budget_charge(b, have))
        return -1;
    if (a->budget)
        arena_budget_release(a->budget, a->charged);
    a->budget = b;
    a->charged = b ? have : 0;
    a->fail = fail;
    a->fail_ctx = ctx;
    return 0;
}

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
        block_free(a, b);
        b = n;
    }
    if (a->spare)
        block_free(a, a->spare);
    assert(a->charged == 0);
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
        block_retire(a, n);
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
        if (size > ARENA_MAX_BLOCK)
            size = ARENA_MAX_BLOCK;
        /* Without a budget to charge exactly, a big piece (a pushed body: ~0.6 MiB for a Flink
         * TaskManager) takes a cached standard block rather than a block of its own size: that
         * one came fresh from the kernel and page-faulted on every request (13 % of the CPU of a
         * push that creates its series, issue #15). */
        if (size < n)
            size = !a->budget && n > ARENA_BIG_PIECE && n <= ARENA_MAX_BLOCK ? ARENA_MAX_BLOCK : n;
        if (a->spare && a->spare->size >= size) {
            arena_block_t *nb = a->spare;
            a->spare = NULL;
            nb->used = 0;
            nb->next = a->head;
            a->head = nb;
            b = nb;
            goto take;
        }
        if (a->budget) {
            a->refused = arena_budget_charge(a->budget, sizeof(arena_block_t) + size);
            if (a->refused)
                return NULL;
        }
        arena_block_t *nb = size == ARENA_MAX_BLOCK ? cache_take() : NULL;
        if (!nb)
            nb = malloc(sizeof(*nb) + size);
        if (!nb) {
            if (a->budget)
                arena_budget_release(a->budget, sizeof(*nb) + size);
            return NULL;
        }
        a->charged += a->budget ? sizeof(*nb) + size : 0;
        nb->size = size;
        nb->used = 0;
        nb->next = a->head;
        a->head = nb;
        b = nb;
    }
take:;
    void *p = b->data + b->used;
    b->used += n;
    a->total += n;
    return p;
}

void *arena_alloc(arena_t *a, size_t n)
{
    a->refused = NULL;
    void *p = arena_try_alloc(a, n);
    if (!p && a->refused && a->fail)
        a->fail(a->fail_ctx, a->refused, n);
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

void *arena_memdup(arena_t *a, const void *p, size_t n)
{
    void *d = arena_alloc(a, n ? n : 1);
    if (n)
        memcpy(d, p, n);
    return d;
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

arena_mark_t arena_mark(const arena_t *a)
{
    return (arena_mark_t){a->head, a->head ? a->head->used : 0, a->total};
}

void arena_rewind(arena_t *a, arena_mark_t m)
{
    while (a->head && a->head != m.block) {
        arena_block_t *n = a->head->next;
        block_retire(a, a->head);
        a->head = n;
    }
    /* the marked block is still there unless the arena was reset since, which voids the mark */
    assert(a->head == m.block);
    if (a->head)
        a->head->used = m.used;
    a->total = m.total;
}

size_t arena_used(const arena_t *a)
{
    return a->total;
}
