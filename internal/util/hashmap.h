/*
 * hashmap — the one hash table of sluice: 64-bit keys to 64-bit values, open addressing.
 *
 * The table is an array of `cap` slots (a power of two, or 0 before the first insert), each a
 * {key, val} pair of 16 bytes. A key's home slot is hash_mix64(key) & (cap - 1) (or key & (cap - 1)
 * in a table created with HASHMAP_HASHED_KEYS, whose keys are hashes already); an entry sits
 * at its home slot or after it, with no empty slot in between (linear probing), so a lookup
 * walks from the home slot until it finds the key or an empty slot:
 *
 *      home(k)
 *        v
 *   ... [a] [k'] [k] [ ] ...     a lookup of k passes a and k' (same or nearby homes) and stops at
 *                                k; a lookup of a key not present stops at the empty slot.
 *
 * Empty slots are marked in the value: val == HASHMAP_NONE (UINT64_MAX). Every key, 0 and
 * UINT64_MAX included, can be stored; the one value that cannot is HASHMAP_NONE (ids, counts,
 * indices and pointers never are). Sets store 0 as the value.
 *
 * The table grows (doubling, rehashing every entry) before an insert would fill more than half
 * of it, so probe runs stay short. Deletion shifts the entries after the hole back when their
 * home allows it (backward shift), so there are no tombstones and a table that sees as many
 * deletions as inserts does not slowly fill up. The table never shrinks.
 *
 * Two ways to use it:
 *   map       hashmap_put (insert or replace), hashmap_get, hashmap_del: one value per key.
 *   multimap  hashmap_add (insert without looking), hashmap_find (the value under a key that
 *             the caller's eq accepts), hashmap_next_of (every value under a key),
 *             hashmap_del_pair (remove one (key, value)). This is the shape of a table keyed by
 *             the hash of something stored elsewhere (a string, a label set): the table holds
 *             hash -> id or pointer and the caller settles collisions by comparing the objects.
 *             Such keys are hashes already: create the table with HASHMAP_HASHED_KEYS.
 * Do not mix hashmap_put and hashmap_add on one table.
 *
 * Memory comes from malloc, or from an arena (hashmap_init with an arena: for tables that live
 * as long as one request or one parse; the old array is left in the arena when the table grows
 * and hashmap_free only forgets it). Allocation failure is an error (-1), never an abort; a failed
 * insert leaves the table as it was.
 *
 * The struct is public so a table can be embedded and lookups inlined; its fields are read only
 * through the functions below. Not thread-safe: callers lock.
 */
#ifndef SLUICE_UTIL_HASHMAP_H
#define SLUICE_UTIL_HASHMAP_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/util/hash.h"

typedef struct arena arena_t;

#define HASHMAP_NONE UINT64_MAX /* the empty-slot marker: the one value that cannot be stored */

typedef struct {
    uint64_t key, val;
} hashmap_slot_t;

typedef struct {
    hashmap_slot_t *slots; /* cap slots, or NULL */
    size_t cap;            /* 0 or a power of two */
    size_t n;              /* entries */
    arena_t *arena;        /* NULL: slots come from malloc */
    bool hashed;           /* HASHMAP_HASHED_KEYS: keys are used as their own hash */
} hashmap_t;

/* A zeroed hashmap_t is an empty malloc-backed table of integer keys; HASHMAP_INIT spells it. */
#define HASHMAP_INIT                                                                                                   \
    {                                                                                                                  \
        NULL, 0, 0, NULL, false                                                                                        \
    }
/* The same for a table whose keys are hashes already (HASHMAP_HASHED_KEYS). */
#define HASHMAP_INIT_HASHED                                                                                            \
    {                                                                                                                  \
        NULL, 0, 0, NULL, true                                                                                         \
    }

/* hashmap_init flags. HASHMAP_HASHED_KEYS: the keys are outputs of a good hash (XXH3 of a
 * string or label set), so their low bits are used as they are, without hash_mix64 — a table
 * keyed by ids, counters or pointers must not set it. */
#define HASHMAP_HASHED_KEYS 1

/* An empty table. a: the arena its arrays come from (which must outlive the table), or NULL for
 * malloc. flags: 0 or HASHMAP_HASHED_KEYS. */
void hashmap_init(hashmap_t *m, arena_t *a, int flags);
/* Frees the slots (malloc-backed) and leaves an empty table, usable again. */
void hashmap_free(hashmap_t *m);
/* Empties the table, keeping its capacity. */
void hashmap_clear(hashmap_t *m);
/* Makes room for n entries in all, so that inserting up to n entries cannot fail. 0 or -1. */
int hashmap_reserve(hashmap_t *m, size_t n);

/* Sets key's value (inserting or replacing). 0, or -1 out of memory (table unchanged). */
int hashmap_put(hashmap_t *m, uint64_t key, uint64_t val);
/* The value of key, inserting `init` first if key is absent; *existed says which. The pointer
 * is valid until the next insert or delete. NULL if out of memory. */
uint64_t *hashmap_upsert(hashmap_t *m, uint64_t key, uint64_t init, bool *existed);
/* Inserts (key, val) without looking for key: a multimap entry. 0 or -1 out of memory. */
int hashmap_add(hashmap_t *m, uint64_t key, uint64_t val);
/* Removes key's entry (the first one found, in a multimap). True if there was one. */
bool hashmap_del(hashmap_t *m, uint64_t key);
/* Removes the entry (key, val). True if there was one. */
bool hashmap_del_pair(hashmap_t *m, uint64_t key, uint64_t val);

/* ---- lookups (inline: they are on the ingest path) ----------------------------------------- */

static inline size_t hashmap__home(const hashmap_t *m, uint64_t key)
{
    if (__builtin_expect(m->hashed, 1))
        return (size_t)key & (m->cap - 1);
    return (size_t)hash_mix64(key) & (m->cap - 1);
}

/* The first value under key for which eq(value, ctx) holds, or NULL: the lookup of a table keyed
 * by the hash of objects stored elsewhere (eq compares the object a value names with ctx). Inline
 * with a constant eq, the comparison is inlined too. */
static inline uint64_t *hashmap_find(const hashmap_t *m, uint64_t key, bool (*eq)(uint64_t val, const void *ctx),
                                     const void *ctx)
{
    if (!m->n)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = hashmap__home(m, key);; i = (i + 1) & mask) {
        hashmap_slot_t *s = &m->slots[i];
        if (s->val == HASHMAP_NONE)
            return NULL;
        if (s->key == key && eq(s->val, ctx))
            return &s->val;
    }
}

static inline bool hashmap__any(uint64_t val, const void *ctx)
{
    (void)val, (void)ctx;
    return true;
}

/* A pointer to key's value (the first one found, in a multimap), or NULL. Valid until the next
 * insert or delete; the value may be changed through it (to anything but HASHMAP_NONE). */
static inline uint64_t *hashmap_get(const hashmap_t *m, uint64_t key)
{
    return hashmap_find(m, key, hashmap__any, NULL);
}

/* True if key is in the table. */
static inline bool hashmap_has(const hashmap_t *m, uint64_t key)
{
    return hashmap_get(m, key) != NULL;
}

/* Every value stored under key, one per call: start with *pos = SIZE_MAX; NULL when done.
 *   size_t pos = SIZE_MAX;
 *   for (uint64_t *v; (v = hashmap_next_of(m, key, &pos));) ...
 * The table must not change during the walk. */
static inline uint64_t *hashmap_next_of(const hashmap_t *m, uint64_t key, size_t *pos)
{
    if (!m->n)
        return NULL;
    size_t mask = m->cap - 1;
    size_t i = *pos == SIZE_MAX ? hashmap__home(m, key) : ((*pos + 1) & mask);
    for (;; i = (i + 1) & mask) {
        hashmap_slot_t *s = &m->slots[i];
        if (s->val == HASHMAP_NONE)
            return NULL;
        if (s->key == key) {
            *pos = i;
            return &s->val;
        }
    }
}

/* Every entry in slot order, one per call: start with *pos = 0; NULL when done. The table must
 * not change during the walk (values may be changed through the slot).
 *   size_t pos = 0;
 *   for (hashmap_slot_t *e; (e = hashmap_next(m, &pos));) use(e->key, e->val);
 */
static inline hashmap_slot_t *hashmap_next(const hashmap_t *m, size_t *pos)
{
    for (size_t i = *pos; i < m->cap; i++)
        if (m->slots[i].val != HASHMAP_NONE) {
            *pos = i + 1;
            return &m->slots[i];
        }
    *pos = m->cap;
    return NULL;
}

static inline size_t hashmap_count(const hashmap_t *m)
{
    return m->n;
}

/* Bytes held by the slot array. */
static inline size_t hashmap_bytes(const hashmap_t *m)
{
    return m->cap * sizeof(hashmap_slot_t);
}

#endif
