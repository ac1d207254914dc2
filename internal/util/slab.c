/*
 * slab — see slab.h. A page is one malloc: a header, then per_page records. Free records form
 * a singly linked list through their first word; slab_alloc pops it before carving a new
 * record from the newest page's untouched tail, and takes a new page only when both are empty.
 */
#include "internal/util/slab.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct slab_page {
    slab_page_t *next;
    size_t carved; /* records handed out from this page's tail so far */
    _Alignas(16) unsigned char data[];
};

void slab_init(slab_t *s, size_t size, size_t page_bytes)
{
    memset(s, 0, sizeof(*s));
    if (size < sizeof(void *))
        size = sizeof(void *);
    s->size = (size + 15) & ~(size_t)15;
    s->per_page = page_bytes > sizeof(slab_page_t) ? (page_bytes - sizeof(slab_page_t)) / s->size : 1;
    if (s->per_page == 0)
        s->per_page = 1;
}

void slab_destroy(slab_t *s)
{
    for (slab_page_t *p = s->pages, *n; p; p = n) {
        n = p->next;
        free(p);
    }
    s->pages = NULL;
    s->free_list = NULL;
    s->used = s->npages = 0;
}

void *slab_alloc(slab_t *s)
{
    void *r = s->free_list;
    if (r) {
        memcpy(&s->free_list, r, sizeof(void *));
    } else {
        slab_page_t *p = s->pages;
        if (!p || p->carved == s->per_page) {
            p = malloc(sizeof(*p) + s->per_page * s->size);
            if (!p)
                return NULL;
            p->next = s->pages;
            p->carved = 0;
            s->pages = p;
            s->npages++;
        }
        r = p->data + p->carved++ * s->size;
    }
    memset(r, 0, s->size);
    s->used++;
    return r;
}

void slab_free(slab_t *s, void *p)
{
    if (!p)
        return;
    assert(s->used > 0);
    memcpy(p, &s->free_list, sizeof(void *));
    s->free_list = p;
    s->used--;
}

size_t slab_bytes(const slab_t *s)
{
    return s->npages * (sizeof(slab_page_t) + s->per_page * s->size);
}

bool slab_owns(const slab_t *s, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (const slab_page_t *pg = s->pages; pg; pg = pg->next) {
        uintptr_t lo = (uintptr_t)pg->data, hi = lo + pg->carved * s->size;
        if (a >= lo && a < hi)
            return (a - lo) % s->size == 0;
    }
    return false;
}
