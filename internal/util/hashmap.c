/*
 * hashmap — inserting, growing and deleting (see hashmap.h for the structure; lookups are inline
 * there).
 *
 * Growth: an insert that would take the table above half full first moves every entry into an
 * array of twice the size (16 slots the first time). The new array is allocated before the old
 * one is touched, so a failed allocation leaves the table as it was.
 *
 * Deletion (backward shift): after the hole at i, each following entry j of the run is moved
 * back into the hole unless its home h lies cyclically in (i, j] — then it is already as near its
 * home as the hole would put it, and moving it would place it before its home, where lookups
 * never look. The run ends at the first empty slot, which the last hole becomes.
 */
#include "internal/util/hashmap.h"

#include <stdlib.h>
#include <string.h>

#include "internal/util/arena.h"

#define HASHMAP_MIN_CAP 16

/* ---- allocation ---------------------------------------------------------------------------- */

static hashmap_slot_t *slots_alloc(hashmap_t *m, size_t cap)
{
    if (cap > SIZE_MAX / sizeof(hashmap_slot_t))
        return NULL;
    size_t bytes = cap * sizeof(hashmap_slot_t);
    hashmap_slot_t *s = m->arena ? arena_try_alloc(m->arena, bytes) : malloc(bytes);
    if (s)
        memset(s, 0xff, bytes); /* every val = HASHMAP_NONE */
    return s;
}

static void slots_free(hashmap_t *m, hashmap_slot_t *s)
{
    if (!m->arena)
        free(s);
}

void hashmap_init(hashmap_t *m, arena_t *a, int flags)
{
    memset(m, 0, sizeof(*m));
    m->arena = a;
    m->hashed = (flags & HASHMAP_HASHED_KEYS) != 0;
}

void hashmap_free(hashmap_t *m)
{
    slots_free(m, m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

void hashmap_clear(hashmap_t *m)
{
    if (m->slots)
        memset(m->slots, 0xff, m->cap * sizeof(hashmap_slot_t));
    m->n = 0;
}

/* ---- inserting ----------------------------------------------------------------------------- */

/* The empty slot key would go to; the table has room. */
static size_t free_slot(const hashmap_t *m, uint64_t key)
{
    size_t mask = m->cap - 1, i = hashmap__home(m, key);
    while (m->slots[i].val != HASHMAP_NONE)
        i = (i + 1) & mask;
    return i;
}

static int rehash(hashmap_t *m, size_t ncap)
{
    hashmap_slot_t *ns = slots_alloc(m, ncap);
    if (!ns)
        return -1;
    hashmap_t nm = {ns, ncap, m->n, m->arena, m->hashed};
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].val != HASHMAP_NONE)
            ns[free_slot(&nm, m->slots[i].key)] = m->slots[i];
    slots_free(m, m->slots);
    *m = nm;
    return 0;
}

int hashmap_reserve(hashmap_t *m, size_t n)
{
    if (n > SIZE_MAX / 4)
        return -1;
    size_t cap = m->cap ? m->cap : HASHMAP_MIN_CAP;
    while (n * 2 > cap)
        cap *= 2;
    return cap == m->cap ? 0 : rehash(m, cap);
}

/* Room for one more entry. */
static int make_room(hashmap_t *m)
{
    if ((m->n + 1) * 2 <= m->cap)
        return 0;
    return rehash(m, m->cap ? m->cap * 2 : HASHMAP_MIN_CAP);
}

int hashmap_add(hashmap_t *m, uint64_t key, uint64_t val)
{
    assert(val != HASHMAP_NONE);
    if (make_room(m) < 0)
        return -1;
    hashmap_slot_t *s = &m->slots[free_slot(m, key)];
    s->key = key;
    s->val = val;
    m->n++;
    return 0;
}

uint64_t *hashmap_upsert(hashmap_t *m, uint64_t key, uint64_t init, bool *existed)
{
    assert(init != HASHMAP_NONE);
    uint64_t *v = hashmap_get(m, key);
    if (existed)
        *existed = v != NULL;
    if (v)
        return v;
    if (make_room(m) < 0)
        return NULL;
    hashmap_slot_t *s = &m->slots[free_slot(m, key)];
    s->key = key;
    s->val = init;
    m->n++;
    return &s->val;
}

int hashmap_put(hashmap_t *m, uint64_t key, uint64_t val)
{
    assert(val != HASHMAP_NONE);
    bool existed;
    uint64_t *v = hashmap_upsert(m, key, val, &existed);
    if (!v)
        return -1;
    *v = val;
    return 0;
}

/* ---- deleting ------------------------------------------------------------------------------ */

static void delete_at(hashmap_t *m, size_t i)
{
    size_t mask = m->cap - 1;
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (m->slots[j].val == HASHMAP_NONE)
            break;
        size_t h = hashmap__home(m, m->slots[j].key);
        bool home_in_between = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!home_in_between) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].val = HASHMAP_NONE;
    m->n--;
}

bool hashmap_del(hashmap_t *m, uint64_t key)
{
    size_t pos = SIZE_MAX;
    if (!hashmap_next_of(m, key, &pos))
        return false;
    delete_at(m, pos);
    return true;
}

bool hashmap_del_pair(hashmap_t *m, uint64_t key, uint64_t val)
{
    size_t pos = SIZE_MAX;
    for (uint64_t *v; (v = hashmap_next_of(m, key, &pos));)
        if (*v == val) {
            delete_at(m, pos);
            return true;
        }
    return false;
}
