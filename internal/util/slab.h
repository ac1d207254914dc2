/*
 * slab — fixed-size records carved from pages, for many small long-lived objects of one size
 * (a per-series state): no allocator header or size-class rounding per record (glibc's malloc
 * adds 8-24 bytes to a 160-byte request), and freed records are reused before a new page is
 * taken.
 *
 * Pages stay until slab_destroy, so a pointer to a freed record still points into the slab's
 * memory: a caller may keep an unowned "hint" pointer to a record and validate it by the
 * record's own contents (an id and a live flag it keeps), as long as it holds the lock that
 * guards the slab. Not thread-safe: the owner locks.
 */
#ifndef SLUICE_UTIL_SLAB_H
#define SLUICE_UTIL_SLAB_H

#include <stdbool.h>
#include <stddef.h>

typedef struct slab_page slab_page_t;

typedef struct {
    size_t size;     /* record size (a multiple of 16) */
    size_t per_page; /* records per page */
    slab_page_t *pages;
    void *free_list; /* freed records, linked through their first word */
    size_t used;     /* records handed out and not freed */
    size_t npages;
} slab_t;

/* Records of `size` bytes (rounded up to 16), in pages of about page_bytes (at least one record
 * per page). */
void slab_init(slab_t *s, size_t size, size_t page_bytes);
/* Frees every page (every record). */
void slab_destroy(slab_t *s);
/* A zeroed record, 16-byte aligned; NULL on OOM. */
void *slab_alloc(slab_t *s);
/* Gives p back; its memory stays in the slab (and is overwritten by the free list link). */
void slab_free(slab_t *s, void *p);
/* Bytes of the pages (what the slab holds from the allocator). */
size_t slab_bytes(const slab_t *s);
/* True if p points at the start of a record of s (handed out or free): lets a caller check a
 * hint before reading it. O(pages). */
bool slab_owns(const slab_t *s, const void *p);

#endif
