/*
 * index — interned strings, series identity and postings (see index.h for the contract).
 *
 * Layout of one series (one record from its shard's pool, see "series memory"; 140 bytes for 11
 * labels and head's 72-byte payload, 144 with the pool's 8-byte rounding):
 *
 *   offset                 size            field
 *   0                      8               id (stable, from the catalog)
 *   8                      8               names: the shared name list (below), which has L
 *   16                     4               low 32 bits of labels_hash(labels); the shard is
 *                                          this % INDEX_SHARDS
 *   20                     4               slot in its shard
 *   24                     payload_size    owner's payload (rounded up to 8)
 *   24+P                   4*L             value symbol ids, in label (name) order
 *
 * Name lists. Series of one kind share their label names (every Flink operator metric has the
 * same ten), so the name symbol ids live once in a refcounted list found by hash (nl_lock), and
 * a series keeps a pointer to it: 4 bytes per label instead of 8. The list holds one reference
 * on each name symbol; a series holds one on each value symbol.
 *
 * Symbols. A global table maps strings to uint32 ids. Entries live in fixed pages reached through
 * an array of atomic page pointers, so resolving an id to its string takes no lock: an id a
 * reader holds comes from a series it holds, which keeps the symbol alive (every series holds
 * one reference per value, its name list one per name). Interning and releasing take the table's
 * write lock; creation takes it once for a whole batch of series (index_create_many), as it does
 * the names table's and the name lists' locks.
 * When the last reference goes, the string is freed and the id put on a free list for reuse
 * — memory follows the live series, not the history of every label value ever seen.
 *
 * Shards. Series are spread over INDEX_SHARDS shards by hash. A shard holds:
 *   slots[]   slot -> series (free slots are chained for reuse)
 *   byhash    open-addressing table of slots keyed by series hash (linear probing, tagged
 *             4-byte entries, up to 3/4 full; duplicate hashes allowed, resolved by comparing
 *             labels)
 *   pairs     (name id << 32 | value id) -> postings: sorted array of slots (2 bytes each while
 *             the shard has under 65,536 slots, 4 after)
 *   pool      the shard's series records, packed in pages by size (see "series memory")
 *   departed  labels hash -> id of series that left the shard (index.h): a series leaving puts its
 *             entry, one created under that hash deletes it, both under the shard's write lock, so
 *             a creator that misses the series and then looks here sees one or the other
 * Postings are per shard so appenders on different shards never share a lock.
 *
 * Names. A global table name id -> array of value ids plus a pair table (name,value) -> series
 * count, under its own rwlock. Selection evaluates each matcher once against the distinct values
 * of its label, producing value ids; then each shard turns value ids into postings:
 *
 *   matcher does not match ""  ->  union of postings of matching values       (a positive set)
 *   matcher matches ""         ->  all slots minus postings of non-matching values
 *
 * which is exactly "a series without the label counts as having value ''". Positive sets are
 * intersected, then negative sets subtracted. Plans are computed before the shards are scanned;
 * if a new label pair appeared or a symbol id was freed meanwhile (two generation counters), the
 * shard's candidates are re-checked against their labels, so concurrent creation never lets a
 * non-matching series through.
 */
#include "storage/index.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "internal/util/hashmap.h"

/* Under ASan, series records not handed out are poisoned (storage/index.c "series memory"), so
 * a series used after its removal is reported as when each record was its own malloc. */
#if defined(__SANITIZE_ADDRESS__)
#define INDEX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define INDEX_ASAN 1
#endif
#endif
#ifdef INDEX_ASAN
#include <sanitizer/asan_interface.h>
#define SP_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define SP_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define SP_POISON(p, n) ((void)(p), (void)(n))
#define SP_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define EMPTY32 UINT32_MAX
#define SYM_PAGE_BITS 12
#define SYM_PAGE_SIZE (1u << SYM_PAGE_BITS)
#define SYM_MAX_PAGES 4096 /* 16M distinct strings alive at once */

/* ---- tables (util/hashmap) ------------------------------------------------------------------ */

/* Frees every value of m (each a malloc'd pointer) and m's slots. */
static void free_values(hashmap_t *m)
{
    size_t pos = 0;
    for (const hashmap_slot_t *e; (e = hashmap_next(m, &pos));)
        free((void *)(uintptr_t)e->val);
    hashmap_free(m);
}

/* ---- sorted uint32 lists ------------------------------------------------------------------- */

typedef struct {
    uint32_t *v;
    size_t n, cap;
} u32vec_t;

static int vec_push(u32vec_t *v, uint32_t x)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        uint32_t *p = realloc(v->v, nc * sizeof(uint32_t));
        if (!p)
            return -1;
        v->v = p;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void vec_sort_unique(u32vec_t *v)
{
    if (v->n < 2)
        return;
    qsort(v->v, v->n, sizeof(uint32_t), cmp_u32);
    size_t u = 1;
    for (size_t i = 1; i < v->n; i++)
        if (v->v[i] != v->v[u - 1])
            v->v[u++] = v->v[i];
    v->n = u;
}

/* a := a ∩ b (both sorted). */
static void vec_intersect(u32vec_t *a, const uint32_t *b, size_t bn)
{
    size_t i = 0, j = 0, o = 0;
    while (i < a->n && j < bn) {
        if (a->v[i] < b[j])
            i++;
        else if (a->v[i] > b[j])
            j++;
        else {
            a->v[o++] = a->v[i];
            i++, j++;
        }
    }
    a->n = o;
}

/* a := a \ b (both sorted). */
static void vec_subtract(u32vec_t *a, const uint32_t *b, size_t bn)
{
    size_t i = 0, j = 0, o = 0;
    while (i < a->n) {
        while (j < bn && b[j] < a->v[i])
            j++;
        if (j < bn && b[j] == a->v[i]) {
            i++;
            continue;
        }
        a->v[o++] = a->v[i++];
    }
    a->n = o;
}

/* ---- postings: a sorted array of slots with its header in one allocation ------------------- */

/* A shard's postings hold its slots in 2 bytes each while the shard has fewer than NARROW_SLOTS
 * slots (every shard does until the index holds about a million series), in 4 after: the shard
 * converts all its lists once, when it hands out slot NARROW_SLOTS (shard_widen). Postings are a
 * dozen entries per series, so narrow slots save ~25 bytes per series. `wide` says which. */
#define NARROW_SLOTS 65536u

typedef struct {
    uint32_t n, cap;
    uint16_t v[]; /* cap entries: uint16_t slots, or in a wide shard uint32_t ones (2 v's each) */
} postings_t;

static inline uint32_t postings_at(const postings_t *p, bool wide, uint32_t i)
{
    return wide ? ((const uint32_t *)(const void *)p->v)[i] : p->v[i];
}

static size_t postings_size(uint32_t cap, bool wide)
{
    return sizeof(postings_t) + (size_t)cap * (wide ? 4 : 2);
}

static postings_t *postings_add(postings_t *p, bool wide, uint32_t slot)
{
    assert(wide || slot < NARROW_SLOTS);
    if (!p || p->n == p->cap) {
        /* 1.25x, not 2x: postings are ~12 entries per series, and doubling leaves a quarter of
         * them empty on average; the copies stay amortised O(1). The first size fills malloc's
         * smallest chunk (24 usable bytes) anyway. */
        uint32_t nc = p ? p->cap + p->cap / 4 + 2 : (wide ? 4 : 8);
        postings_t *q = realloc(p, postings_size(nc, wide));
        if (!q)
            return NULL;
        if (!p)
            q->n = 0;
        q->cap = nc;
        p = q;
    }
    /* Slots are handed out mostly increasing; the common case is an append. */
    uint32_t i = p->n;
    while (i > 0 && postings_at(p, wide, i - 1) > slot)
        i--;
    size_t w = wide ? 4 : 2;
    memmove((char *)p->v + (i + 1) * w, (char *)p->v + i * w, (p->n - i) * w);
    if (wide)
        ((uint32_t *)(void *)p->v)[i] = slot;
    else
        p->v[i] = (uint16_t)slot;
    p->n++;
    return p;
}

static void postings_remove(postings_t *p, bool wide, uint32_t slot)
{
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (postings_at(p, wide, (uint32_t)mid) < slot)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < p->n && postings_at(p, wide, (uint32_t)lo) == slot) {
        size_t w = wide ? 4 : 2;
        memmove((char *)p->v + lo * w, (char *)p->v + (lo + 1) * w, (p->n - lo - 1) * w);
        p->n--;
    }
}

/* ---- series memory: per-shard pages of equal-sized records ----------------------------------- */

/* Series records are a few hundred thousand allocations of a handful of sizes (one per label
 * count), made and freed under their shard's write lock. malloc gives each an 8-byte header and
 * rounds it to 16 bytes: a 140-byte Flink series takes 160. Here a shard carves them from ~16 KiB
 * pages of one size each, at their 8-byte-rounded size (140 -> 144): ~12 bytes a series.
 *
 *   page (one malloc of SP_PAGE bytes: a 16 KiB malloc chunk)
 *   +---------+-----------------------------------------------+
 *   | header  | record | record | ... | (not handed out yet)  |
 *   +---------+-----------------------------------------------+
 *   header: links in its size's list of pages with room, free records (a list through their
 *   first 8 bytes), live count, bump offset, record size
 *
 * A freed record finds its page by binary search in the shard's array of pages sorted by
 * address (a removal is rare next to appends; a million series are ~9,000 pages). A page whose
 * last record is freed goes back to malloc at once, so memory still follows the live series (and
 * the periodic malloc_trim can return it). Records above SP_MAX_RECORD (label sets of ~200
 * labels) are plain mallocs. */
#define SP_PAGE (16384u - 8u)
#define SP_MAX_RECORD 1024u

typedef struct sp_page {
    struct sp_page *next, *prev; /* pages of this size with room */
    void *free;                  /* freed records */
    uint32_t live;               /* records handed out and not freed */
    uint32_t bump;               /* offset of the first record never handed out */
    uint32_t size;
    uint32_t pad_;
} sp_page_t;

#define SP_FIRST ((uint32_t)((sizeof(sp_page_t) + 7) & ~(size_t)7))

typedef struct {
    sp_page_t *room[SP_MAX_RECORD / 8 + 1]; /* by record size / 8: pages with room */
    sp_page_t **pages;                      /* every page, by address */
    uint32_t npages, cappages;
} series_pool_t;

static bool sp_page_has_room(const sp_page_t *p)
{
    return p->free || p->bump + p->size <= SP_PAGE;
}

static void sp_unlink(series_pool_t *pool, sp_page_t *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        pool->room[p->size / 8] = p->next;
    if (p->next)
        p->next->prev = p->prev;
    p->next = p->prev = NULL;
}

static void sp_link(series_pool_t *pool, sp_page_t *p)
{
    sp_page_t **head = &pool->room[p->size / 8];
    p->prev = NULL;
    p->next = *head;
    if (*head)
        (*head)->prev = p;
    *head = p;
}

/* Index of the last page at or below address r (pool->npages > 0, r in some page). */
static uint32_t sp_find(const series_pool_t *pool, const void *r)
{
    uint32_t lo = 0, hi = pool->npages;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)pool->pages[mid] <= (uintptr_t)r)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static sp_page_t *sp_page_new(series_pool_t *pool, size_t size)
{
    if (pool->npages == pool->cappages) {
        uint32_t nc = pool->cappages ? pool->cappages * 2 : 16;
        sp_page_t **v = realloc(pool->pages, nc * sizeof(*v));
        if (!v)
            return NULL;
        pool->pages = v;
        pool->cappages = nc;
    }
    sp_page_t *p = malloc(SP_PAGE);
    if (!p)
        return NULL;
    *p = (sp_page_t){.bump = SP_FIRST, .size = (uint32_t)size};
    SP_POISON((char *)p + SP_FIRST, SP_PAGE - SP_FIRST);
    uint32_t at = pool->npages && (uintptr_t)pool->pages[0] < (uintptr_t)p ? sp_find(pool, p) + 1 : 0;
    memmove(pool->pages + at + 1, pool->pages + at, (pool->npages - at) * sizeof(*pool->pages));
    pool->pages[at] = p;
    pool->npages++;
    sp_link(pool, p);
    return p;
}

/* A zeroed record of `size` bytes (a multiple of 8), or NULL. Shard write lock held. */
static void *sp_alloc(series_pool_t *pool, size_t size)
{
    assert(size % 8 == 0 && size >= sizeof(void *));
    if (size > SP_MAX_RECORD)
        return calloc(1, size);
    sp_page_t *p = pool->room[size / 8];
    if (!p && !(p = sp_page_new(pool, size)))
        return NULL;
    void *r;
    if (p->free) {
        r = p->free;
        SP_UNPOISON(r, size);
        memcpy(&p->free, r, sizeof(void *));
    } else {
        r = (char *)p + p->bump;
        SP_UNPOISON(r, size);
        p->bump += p->size;
    }
    p->live++;
    if (!sp_page_has_room(p))
        sp_unlink(pool, p);
    memset(r, 0, size);
    return r;
}

/* Frees a record sp_alloc(pool, size) returned (NULL: nothing). Shard write lock held. */
static void sp_free(series_pool_t *pool, void *r, size_t size)
{
    if (!r)
        return;
    if (size > SP_MAX_RECORD) {
        free(r);
        return;
    }
    uint32_t at = sp_find(pool, r);
    sp_page_t *p = pool->pages[at];
    assert((uintptr_t)r >= (uintptr_t)p + SP_FIRST && (uintptr_t)r < (uintptr_t)p + SP_PAGE);
    assert(p->size == size && p->live > 0);
    bool had_room = sp_page_has_room(p);
    memcpy(r, &p->free, sizeof(void *));
    p->free = r;
    SP_POISON(r, size);
    if (--p->live > 0) {
        if (!had_room)
            sp_link(pool, p);
        return;
    }
    if (had_room)
        sp_unlink(pool, p);
    memmove(pool->pages + at, pool->pages + at + 1, (pool->npages - at - 1) * sizeof(*pool->pages));
    pool->npages--;
    SP_UNPOISON(p, SP_PAGE);
    free(p);
}

/* ---- structures ---------------------------------------------------------------------------- */

/* The label names of a series, shared by every series with the same names (Flink's series of
 * one scope all have the same 10 or so names): refcounted, found by hash under nl_lock. */
typedef struct namelist {
    uint64_t hash;
    uint32_t refs;
    uint32_t n;
    uint32_t ids[]; /* name symbol ids, in the series' label order */
} namelist_t;

/* 24 bytes: the label count is the name list's, the shard is hash32 % INDEX_SHARDS (the shard of
 * the full hash, as INDEX_SHARDS divides 2^32), and the full hash is recomputed from the labels
 * the one time it is needed (series_hash). */
struct index_series {
    uint64_t id;
    const namelist_t *names;
    uint32_t hash32; /* low half of labels_hash: the byhash key, compared before the labels */
    uint32_t slot;
    /* payload, then uint32_t value symbol ids[names->n] */
};

typedef struct {
    char *s;
    uint32_t len;
    uint32_t refs; /* 0 = free entry; next free id kept in len */
} sym_t;

typedef struct {
    pthread_rwlock_t lock;
    index_series_t **slots;
    uint32_t nslots, capslots;
    uint32_t free_head; /* EMPTY32 or a free slot; free slots store the next in slots[] as tagged */
    /* Slots by hash, EMPTY32 = empty. Not a util/hashmap: a 4-byte entry whose key (the series
     * hash) is read from the series, where a hashmap slot would take 16 bytes per entry —
     * about 36 more bytes per series at the table's load. */
    uint32_t *byhash;
    uint32_t bh_cap, bh_n;
    hashmap_t pairs;    /* pair -> postings_t* */
    hashmap_t departed; /* labels hash -> id of a series that left (or was noted), see index.h */
    bool wide;          /* postings hold 4-byte slots (nslots passed NARROW_SLOTS once) */
    series_pool_t pool; /* the shard's series records */
    uint32_t nseries;
    uint64_t postings_bytes;
} shard_t;

typedef struct {
    uint32_t n, cap;
    uint32_t v[];
} values_t;

struct index {
    size_t payload_size; /* rounded up to 8 */
    uint64_t max_series;
    _Atomic uint64_t nseries;
    _Atomic uint64_t series_bytes;
    shard_t shards[INDEX_SHARDS];

    pthread_rwlock_t sym_lock;
    _Atomic(sym_t *) sym_pages[SYM_MAX_PAGES];
    uint32_t sym_next;     /* ids below this have been handed out */
    uint32_t sym_free;     /* head of the free-id list, EMPTY32 if none */
    hashmap_t sym_by_hash; /* xxh3(string) -> id (a multimap: ids of equal hashes) */
    uint64_t sym_bytes;
    _Atomic uint64_t sym_gen;   /* bumped when an id is freed (and so may be reused) */
    _Atomic uint64_t pairs_gen; /* bumped when a (name, value) pair appears in the names table */

    pthread_rwlock_t names_lock;
    hashmap_t names;      /* name id -> values_t* */
    hashmap_t pair_count; /* (name << 32 | value) -> number of series */

    pthread_mutex_t nl_lock;
    hashmap_t nl_by_hash; /* xxh3(name ids) -> namelist_t* (a multimap) */
    uint64_t nl_bytes;
};

/* Bytes of the record of a series with n labels (its pool size class). */
static size_t series_size(const index_t *ix, size_t n)
{
    return (sizeof(index_series_t) + ix->payload_size + 4 * n + 7) & ~(size_t)7;
}

static uint32_t *series_vals(const index_t *ix, const index_series_t *s)
{
    return (uint32_t *)((char *)s + sizeof(index_series_t) + ix->payload_size);
}

static sym_t *sym_entry(const index_t *ix, uint32_t id)
{
    sym_t *page = atomic_load_explicit(&((index_t *)ix)->sym_pages[id >> SYM_PAGE_BITS], memory_order_acquire);
    return &page[id & (SYM_PAGE_SIZE - 1)];
}

static const char *sym_str(const index_t *ix, uint32_t id)
{
    return sym_entry(ix, id)->s;
}

/* ---- symbols ------------------------------------------------------------------------------- */

typedef struct {
    const index_t *ix;
    const char *s;
    size_t len;
} sym_key_t;

static bool sym_eq(uint64_t id, const void *ctx)
{
    const sym_key_t *k = ctx;
    const sym_t *e = sym_entry(k->ix, (uint32_t)id);
    return e->len == k->len && memcmp(e->s, k->s, k->len) == 0;
}

/* Looks a string up; caller holds sym_lock (either mode). */
static uint32_t sym_find_locked(const index_t *ix, const char *s, size_t len, uint64_t h)
{
    sym_key_t k = {ix, s, len};
    const uint64_t *v = hashmap_find(&ix->sym_by_hash, h, sym_eq, &k);
    return v ? (uint32_t)*v : EMPTY32;
}

static uint32_t sym_lookup(index_t *ix, const char *s)
{
    size_t len = strlen(s);
    uint64_t h = XXH3_64bits(s, len);
    pthread_rwlock_rdlock(&ix->sym_lock);
    uint32_t id = sym_find_locked(ix, s, len, h);
    pthread_rwlock_unlock(&ix->sym_lock);
    return id;
}

/* Takes a reference on s, interning it if new. Caller holds sym_lock for writing. */
static uint32_t sym_ref_locked(index_t *ix, const char *s)
{
    size_t len = strlen(s);
    uint64_t h = XXH3_64bits(s, len);
    uint32_t id = sym_find_locked(ix, s, len, h);
    if (id != EMPTY32) {
        sym_entry(ix, id)->refs++;
        return id;
    }
    if (ix->sym_free != EMPTY32) {
        id = ix->sym_free;
        ix->sym_free = sym_entry(ix, id)->len;
    } else {
        id = ix->sym_next;
        if ((id >> SYM_PAGE_BITS) >= SYM_MAX_PAGES)
            return EMPTY32;
        if ((id & (SYM_PAGE_SIZE - 1)) == 0) {
            sym_t *page = calloc(SYM_PAGE_SIZE, sizeof(sym_t));
            if (!page)
                return EMPTY32;
            atomic_store_explicit(&ix->sym_pages[id >> SYM_PAGE_BITS], page, memory_order_release);
        }
        ix->sym_next++;
    }
    sym_t *e = sym_entry(ix, id);
    char *copy = malloc(len + 1);
    if (!copy || hashmap_add(&ix->sym_by_hash, h, id) < 0) {
        free(copy);
        e->refs = 0;
        e->len = ix->sym_free;
        ix->sym_free = id;
        return EMPTY32;
    }
    memcpy(copy, s, len + 1);
    e->s = copy;
    e->len = (uint32_t)len;
    e->refs = 1;
    ix->sym_bytes += len + 1 + sizeof(sym_t) + 2 * sizeof(hashmap_slot_t);
    return id;
}

static void sym_unref_locked(index_t *ix, uint32_t id)
{
    sym_t *e = sym_entry(ix, id);
    assert(e->refs > 0);
    if (e->refs == 0)
        return;
    if (--e->refs > 0)
        return;
    hashmap_del_pair(&ix->sym_by_hash, XXH3_64bits(e->s, e->len), id);
    ix->sym_bytes -= e->len + 1 + sizeof(sym_t) + 2 * sizeof(hashmap_slot_t);
    free(e->s);
    e->s = NULL;
    e->len = ix->sym_free;
    ix->sym_free = id;
    atomic_fetch_add(&ix->sym_gen, 1);
}

/* ---- names table --------------------------------------------------------------------------- */

/* Caller holds names_lock for writing. */
static int names_pair_ref(index_t *ix, uint32_t name, uint32_t value)
{
    uint64_t key = (uint64_t)name << 32 | value;
    uint64_t *cnt = hashmap_get(&ix->pair_count, key);
    if (cnt) {
        (*cnt)++;
        return 0;
    }
    if (hashmap_put(&ix->pair_count, key, 1) < 0)
        return -1;
    atomic_fetch_add(&ix->pairs_gen, 1);
    uint64_t *vp = hashmap_get(&ix->names, name);
    values_t *vals = vp ? (values_t *)(uintptr_t)*vp : NULL;
    if (!vals || vals->n == vals->cap) {
        uint32_t nc = vals ? vals->cap * 2 : 4;
        values_t *nv = realloc(vals, sizeof(values_t) + nc * sizeof(uint32_t));
        if (!nv) {
            hashmap_del(&ix->pair_count, key);
            return -1;
        }
        if (!vals) {
            nv->n = 0;
            if (hashmap_put(&ix->names, name, (uint64_t)(uintptr_t)nv) < 0) {
                free(nv);
                hashmap_del(&ix->pair_count, key);
                return -1;
            }
        } else {
            *vp = (uint64_t)(uintptr_t)nv;
        }
        nv->cap = nc;
        vals = nv;
    }
    vals->v[vals->n++] = value;
    return 0;
}

static void names_pair_unref(index_t *ix, uint32_t name, uint32_t value)
{
    uint64_t key = (uint64_t)name << 32 | value;
    uint64_t *cnt = hashmap_get(&ix->pair_count, key);
    if (!cnt)
        return;
    if (--(*cnt) > 0)
        return;
    hashmap_del(&ix->pair_count, key);
    uint64_t *vp = hashmap_get(&ix->names, name);
    if (!vp)
        return;
    values_t *vals = (values_t *)(uintptr_t)*vp;
    for (uint32_t i = 0; i < vals->n; i++)
        if (vals->v[i] == value) {
            vals->v[i] = vals->v[--vals->n];
            break;
        }
    if (vals->n == 0) {
        hashmap_del(&ix->names, name);
        free(vals);
    }
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

index_t *index_new(size_t payload_size, uint64_t max_series)
{
    index_t *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return NULL;
    ix->payload_size = (payload_size + 7) & ~(size_t)7;
    ix->max_series = max_series;
    hashmap_init(&ix->sym_by_hash, NULL, HASHMAP_HASHED_KEYS);
    hashmap_init(&ix->nl_by_hash, NULL, HASHMAP_HASHED_KEYS);
    ix->sym_free = EMPTY32;
    pthread_rwlock_init(&ix->sym_lock, NULL);
    pthread_rwlock_init(&ix->names_lock, NULL);
    pthread_mutex_init(&ix->nl_lock, NULL);
    for (int i = 0; i < INDEX_SHARDS; i++) {
        pthread_rwlock_init(&ix->shards[i].lock, NULL);
        ix->shards[i].free_head = EMPTY32;
        /* Not HASHMAP_HASHED_KEYS: the hashes of one shard share their low bits (the shard). */
        hashmap_init(&ix->shards[i].departed, NULL, 0);
    }
    return ix;
}

void index_free(index_t *ix, void (*payload_free)(void *ud, index_series_t *s), void *ud)
{
    if (!ix)
        return;
    for (int i = 0; i < INDEX_SHARDS; i++) {
        shard_t *sh = &ix->shards[i];
        for (uint32_t j = 0; j < sh->nslots; j++) {
            index_series_t *s = sh->slots[j];
            if ((uintptr_t)s & 1 || !s)
                continue;
            if (payload_free)
                payload_free(ud, s);
            sp_free(&sh->pool, s, series_size(ix, s->names->n));
        }
        assert(sh->pool.npages == 0); /* the last record of a page frees the page */
        free(sh->pool.pages);
        free(sh->slots);
        free(sh->byhash);
        free_values(&sh->pairs);
        hashmap_free(&sh->departed);
        pthread_rwlock_destroy(&sh->lock);
    }
    for (uint32_t p = 0; p < SYM_MAX_PAGES; p++) {
        sym_t *page = atomic_load(&ix->sym_pages[p]);
        if (!page)
            break;
        for (uint32_t k = 0; k < SYM_PAGE_SIZE; k++)
            if (page[k].refs)
                free(page[k].s);
        free(page);
    }
    hashmap_free(&ix->sym_by_hash);
    free_values(&ix->names);
    hashmap_free(&ix->pair_count);
    free_values(&ix->nl_by_hash);
    pthread_mutex_destroy(&ix->nl_lock);
    pthread_rwlock_destroy(&ix->sym_lock);
    pthread_rwlock_destroy(&ix->names_lock);
    free(ix);
}

void index_refs_free(index_refs_t *r)
{
    free(r->v);
    r->v = NULL;
    r->n = r->cap = 0;
}

static int refs_push(index_refs_t *r, index_ref_t ref)
{
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 64;
        index_ref_t *p = realloc(r->v, nc * sizeof(*p));
        if (!p)
            return -1;
        r->v = p;
        r->cap = nc;
    }
    r->v[r->n++] = ref;
    return 0;
}

/* ---- series access ------------------------------------------------------------------------- */

uint64_t index_series_id(const index_series_t *s)
{
    return s->id;
}

index_ref_t index_series_ref(const index_series_t *s)
{
    return (index_ref_t){.id = s->id, .shard = s->hash32 % INDEX_SHARDS, .slot = s->slot};
}

void *index_series_payload(index_series_t *s)
{
    return (char *)s + sizeof(index_series_t);
}

size_t index_series_nlabels(const index_series_t *s)
{
    return s->names->n;
}

void index_series_labels(const index_t *ix, const index_series_t *s, label_t *out)
{
    const uint32_t *vals = series_vals(ix, s);
    for (uint16_t i = 0; i < s->names->n; i++) {
        out[i].name = sym_str(ix, s->names->ids[i]);
        out[i].value = sym_str(ix, vals[i]);
    }
}

void index_series_labels_copy(const index_t *ix, const index_series_t *s, arena_t *a, labels_t *out)
{
    out->n = s->names->n;
    out->v = arena_alloc(a, sizeof(label_t) * (out->n ? out->n : 1));
    const uint32_t *vals = series_vals(ix, s);
    for (uint16_t i = 0; i < s->names->n; i++) {
        const sym_t *n = sym_entry(ix, s->names->ids[i]), *v = sym_entry(ix, vals[i]);
        out->v[i].name = arena_strndup(a, n->s, n->len);
        out->v[i].value = arena_strndup(a, v->s, v->len);
    }
}

/* labels_hash of s's labels (the series keeps only its low half); false if out of memory. */
static bool series_hash(const index_t *ix, const index_series_t *s, uint64_t *out)
{
    size_t n = s->names->n;
    label_t stack[32], *v = n <= 32 ? stack : malloc(n * sizeof(label_t));
    if (!v)
        return false;
    index_series_labels(ix, s, v);
    labels_t ls = {v, n};
    *out = labels_hash(&ls);
    if (v != stack)
        free(v);
    return true;
}

static bool series_equal(const index_t *ix, const index_series_t *s, const labels_t *ls)
{
    if (s->names->n != ls->n)
        return false;
    const uint32_t *vals = series_vals(ix, s);
    for (size_t i = 0; i < ls->n; i++)
        if (strcmp(sym_str(ix, vals[i]), ls->v[i].value) != 0 ||
            strcmp(sym_str(ix, s->names->ids[i]), ls->v[i].name) != 0)
            return false;
    return true;
}

/* byhash entries: the slot in the low BH_SLOT_BITS bits, a tag (the top 8 bits of the key's mix,
 * whose low bits pick the home) in the high 8. A probe reads a series only when the tag matches,
 * so the table runs up to 3/4 full at about one series read per lookup, where untagged slots at
 * 1/2 cost a read per probe. Slots stay below BH_SLOT_MASK, so no entry is EMPTY32. */
#define BH_SLOT_BITS 24
#define BH_SLOT_MASK ((1u << BH_SLOT_BITS) - 1)

static uint32_t bh_entry(uint64_t mix, uint32_t slot)
{
    return (uint32_t)(mix >> 56) << BH_SLOT_BITS | slot;
}

static index_series_t *shard_find(const index_t *ix, const shard_t *sh, const labels_t *ls, uint64_t hash)
{
    if (!sh->bh_cap)
        return NULL;
    uint32_t h32 = (uint32_t)hash;
    uint64_t mix = hash_mix64(h32);
    uint32_t tag = (uint32_t)(mix >> 56), mask = sh->bh_cap - 1, i = (uint32_t)mix & mask;
    for (uint32_t e; (e = sh->byhash[i]) != EMPTY32; i = (i + 1) & mask) {
        if (e >> BH_SLOT_BITS != tag)
            continue;
        index_series_t *s = sh->slots[e & BH_SLOT_MASK];
        if (s->hash32 == h32 && series_equal(ix, s, ls))
            return s;
    }
    return NULL;
}

static bool slot_is_free(const shard_t *sh, uint32_t slot);

static void byhash_put(shard_t *sh, uint32_t h32, uint32_t slot)
{
    uint64_t mix = hash_mix64(h32);
    uint32_t mask = sh->bh_cap - 1, i = (uint32_t)mix & mask;
    while (sh->byhash[i] != EMPTY32)
        i = (i + 1) & mask;
    sh->byhash[i] = bh_entry(mix, slot);
    sh->bh_n++;
}

/* Doubles the table; `adding` (a live slot not in the table yet) is left to the caller. The
 * entries are re-inserted in slot order, not the old table's: records were handed out in slot
 * order, so their hashes are read nearly sequentially. In the old table's order each one was a
 * cache miss, ~12,000 of them per shard at 196k series, under the shard's write lock, and every
 * shard grew within the same few pushes: the slowest stretch of the push bench's first round. */
static int byhash_grow(shard_t *sh, uint32_t adding)
{
    uint32_t ncap = sh->bh_cap ? sh->bh_cap * 2 : 64;
    uint32_t *t = malloc(ncap * sizeof(uint32_t));
    if (!t)
        return -1;
    memset(t, 0xff, ncap * sizeof(uint32_t));
    uint32_t had = sh->bh_n;
    free(sh->byhash);
    sh->byhash = t;
    sh->bh_cap = ncap;
    sh->bh_n = 0;
    for (uint32_t slot = 0; slot < sh->nslots; slot++) {
        if (slot + 8 < sh->nslots && !slot_is_free(sh, slot + 8))
            __builtin_prefetch(sh->slots[slot + 8]);
        if (slot != adding && !slot_is_free(sh, slot))
            byhash_put(sh, sh->slots[slot]->hash32, slot);
    }
    assert(sh->bh_n == had && "every live slot but the one being added is in the table");
    (void)had;
    return 0;
}

static int byhash_insert(shard_t *sh, uint32_t h32, uint32_t slot)
{
    assert(slot < BH_SLOT_MASK);
    if (((uint64_t)sh->bh_n + 1) * 4 > (uint64_t)sh->bh_cap * 3 && byhash_grow(sh, slot) < 0)
        return -1;
    byhash_put(sh, h32, slot);
    return 0;
}

static void byhash_remove(shard_t *sh, uint32_t h32, uint32_t slot)
{
    uint32_t mask = sh->bh_cap - 1, i = (uint32_t)hash_mix64(h32) & mask;
    for (; sh->byhash[i] != EMPTY32; i = (i + 1) & mask)
        if ((sh->byhash[i] & BH_SLOT_MASK) == slot)
            break;
    if (sh->byhash[i] == EMPTY32)
        return;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (sh->byhash[j] == EMPTY32)
            break;
        uint32_t k = (uint32_t)hash_mix64(sh->slots[sh->byhash[j] & BH_SLOT_MASK]->hash32) & mask;
        bool home_between = i <= j ? (k > i && k <= j) : (k > i || k <= j);
        if (!home_between) {
            sh->byhash[i] = sh->byhash[j];
            i = j;
        }
    }
    sh->byhash[i] = EMPTY32;
    sh->bh_n--;
}

/* Free slots hold (next << 1 | 1) so they can never be mistaken for a series pointer. */
static bool slot_is_free(const shard_t *sh, uint32_t slot)
{
    return ((uintptr_t)sh->slots[slot] & 1) != 0;
}

/* Converts every postings list of sh to 4-byte slots, all or none (0, or -1 out of memory). */
static int shard_widen(shard_t *sh)
{
    size_t n = hashmap_count(&sh->pairs), k = 0, pos = 0;
    postings_t **nw = malloc((n ? n : 1) * sizeof(*nw));
    if (!nw)
        return -1;
    for (const hashmap_slot_t *e; (e = hashmap_next(&sh->pairs, &pos));) {
        const postings_t *p = (const postings_t *)(uintptr_t)e->val;
        postings_t *q = malloc(postings_size(p->cap, true));
        if (!q) {
            while (k)
                free(nw[--k]);
            free(nw);
            return -1;
        }
        q->n = p->n;
        q->cap = p->cap;
        for (uint32_t i = 0; i < p->n; i++)
            ((uint32_t *)(void *)q->v)[i] = p->v[i];
        nw[k++] = q;
    }
    pos = 0;
    k = 0;
    for (hashmap_slot_t *e; (e = hashmap_next(&sh->pairs, &pos));) {
        postings_t *p = (postings_t *)(uintptr_t)e->val;
        sh->postings_bytes += postings_size(p->cap, true) - postings_size(p->cap, false);
        free(p);
        e->val = (uint64_t)(uintptr_t)nw[k++];
    }
    free(nw);
    sh->wide = true;
    return 0;
}

static int slot_alloc(shard_t *sh, uint32_t *out)
{
    if (sh->free_head != EMPTY32) {
        *out = sh->free_head;
        sh->free_head = (uint32_t)((uintptr_t)sh->slots[*out] >> 1);
        return 0;
    }
    if (sh->nslots >= BH_SLOT_MASK) /* 16.7M series in one shard, 268M in all */
        return -1;
    if (!sh->wide && sh->nslots >= NARROW_SLOTS && shard_widen(sh) < 0)
        return -1;
    if (sh->nslots == sh->capslots) {
        /* 1.5x: a pointer per series, where doubling leaves up to half of them unused */
        uint32_t nc = sh->capslots ? sh->capslots + sh->capslots / 2 : 64;
        index_series_t **p = realloc(sh->slots, nc * sizeof(*p));
        if (!p)
            return -1;
        sh->slots = p;
        sh->capslots = nc;
    }
    *out = sh->nslots++;
    return 0;
}

static void slot_free(shard_t *sh, uint32_t slot)
{
    sh->slots[slot] = (index_series_t *)(((uintptr_t)sh->free_head << 1) | 1);
    sh->free_head = slot;
}

/* ---- acquire / create / release ------------------------------------------------------------ */

/* The series ref names in a shard its caller holds, or NULL. */
static index_series_t *shard_ref_locked(const shard_t *sh, const index_ref_t *ref)
{
    if (ref->slot < sh->nslots && !slot_is_free(sh, ref->slot) && sh->slots[ref->slot]->id == ref->id)
        return sh->slots[ref->slot];
    return NULL;
}

index_series_t *index_acquire(index_t *ix, const labels_t *ls, uint64_t hash)
{
    shard_t *sh = &ix->shards[hash % INDEX_SHARDS];
    pthread_rwlock_rdlock(&sh->lock);
    index_series_t *s = shard_find(ix, sh, ls, hash);
    if (!s)
        pthread_rwlock_unlock(&sh->lock);
    return s;
}

index_series_t *index_acquire_ref(index_t *ix, const index_ref_t *ref)
{
    if (ref->shard >= INDEX_SHARDS)
        return NULL;
    shard_t *sh = &ix->shards[ref->shard];
    pthread_rwlock_rdlock(&sh->lock);
    index_series_t *s = shard_ref_locked(sh, ref);
    if (!s)
        pthread_rwlock_unlock(&sh->lock);
    return s;
}

void index_release(index_t *ix, index_series_t *s)
{
    pthread_rwlock_unlock(&ix->shards[s->hash32 % INDEX_SHARDS].lock);
}

int index_visit_refs(index_t *ix, const index_ref_t *refs, const uint32_t *sel, size_t m, index_ref_fn fn, void *ud)
{
    /* Counting sort of sel by shard (refs with an impossible shard go last, visited unlocked as
     * NULL). */
    size_t start[INDEX_SHARDS + 2] = {0};
    for (size_t j = 0; j < m; j++) {
        uint32_t sh = refs[sel[j]].shard;
        start[(sh < INDEX_SHARDS ? sh : INDEX_SHARDS) + 1]++;
    }
    for (size_t k = 1; k < INDEX_SHARDS + 2; k++)
        start[k] += start[k - 1];
    uint32_t stack[1024], *order = m <= 1024 ? stack : malloc(m * sizeof(uint32_t));
    if (!order)
        return -1;
    size_t fill[INDEX_SHARDS + 1];
    memcpy(fill, start, sizeof(fill));
    for (size_t j = 0; j < m; j++) {
        uint32_t sh = refs[sel[j]].shard;
        order[fill[sh < INDEX_SHARDS ? sh : INDEX_SHARDS]++] = sel[j];
    }
    for (uint32_t k = 0; k < INDEX_SHARDS; k++) {
        if (start[k] == start[k + 1])
            continue;
        shard_t *sh = &ix->shards[k];
        pthread_rwlock_rdlock(&sh->lock);
        for (size_t j = start[k]; j < start[k + 1]; j++) {
            /* The series are scattered over the heap: ask for the next ones while this one is
             * worked on. */
            if (j + 4 < start[k + 1]) {
                const index_ref_t *r = &refs[order[j + 4]];
                if (r->slot < sh->nslots)
                    __builtin_prefetch(&sh->slots[r->slot]);
            }
            if (j + 2 < start[k + 1]) {
                const index_ref_t *r = &refs[order[j + 2]];
                if (r->slot < sh->nslots && !slot_is_free(sh, r->slot))
                    __builtin_prefetch(sh->slots[r->slot]);
            }
            uint32_t i = order[j];
            fn(ud, i, shard_ref_locked(sh, &refs[i]));
        }
        pthread_rwlock_unlock(&sh->lock);
    }
    for (size_t j = start[INDEX_SHARDS]; j < m; j++)
        fn(ud, order[j], NULL);
    if (order != stack)
        free(order);
    return 0;
}

/* ---- name lists ---------------------------------------------------------------------------- */

/* Drops a reference; the last one frees the list and its name symbol references. */
static void namelist_release(index_t *ix, const namelist_t *cnl)
{
    namelist_t *nl = (namelist_t *)cnl;
    pthread_mutex_lock(&ix->nl_lock);
    bool last = --nl->refs == 0;
    if (last) {
        hashmap_del_pair(&ix->nl_by_hash, nl->hash, (uint64_t)(uintptr_t)nl);
        ix->nl_bytes -= sizeof(namelist_t) + 4 * (uint64_t)nl->n;
    }
    pthread_mutex_unlock(&ix->nl_lock);
    if (!last)
        return;
    pthread_rwlock_wrlock(&ix->sym_lock);
    for (uint32_t i = 0; i < nl->n; i++)
        sym_unref_locked(ix, nl->ids[i]);
    pthread_rwlock_unlock(&ix->sym_lock);
    free(nl);
}

/* Removes s from its shard (write lock held) and frees it; the payload must be released. */
static void shard_remove(index_t *ix, shard_t *sh, index_series_t *s)
{
    const uint32_t *vals = series_vals(ix, s), *nm = s->names->ids, nm_n = s->names->n;
    for (uint16_t i = 0; i < s->names->n; i++) {
        uint64_t key = (uint64_t)nm[i] << 32 | vals[i];
        uint64_t *pp = hashmap_get(&sh->pairs, key);
        if (!pp)
            continue;
        postings_t *p = (postings_t *)(uintptr_t)*pp;
        postings_remove(p, sh->wide, s->slot);
        if (p->n == 0) {
            sh->postings_bytes -= postings_size(p->cap, sh->wide) + 2 * sizeof(hashmap_slot_t);
            hashmap_del(&sh->pairs, key);
            free(p);
        }
    }
    byhash_remove(sh, s->hash32, s->slot);
    slot_free(sh, s->slot);
    sh->nseries--;
    /* Out of memory, the id is forgotten: the labels would get a new id on return (not fatal). */
    uint64_t hash;
    if (series_hash(ix, s, &hash))
        (void)hashmap_put(&sh->departed, hash, s->id);
    pthread_rwlock_wrlock(&ix->names_lock);
    for (uint16_t i = 0; i < s->names->n; i++)
        names_pair_unref(ix, nm[i], vals[i]);
    pthread_rwlock_unlock(&ix->names_lock);
    pthread_rwlock_wrlock(&ix->sym_lock);
    for (uint16_t i = 0; i < s->names->n; i++)
        sym_unref_locked(ix, vals[i]);
    pthread_rwlock_unlock(&ix->sym_lock);
    namelist_release(ix, s->names);
    atomic_fetch_sub(&ix->nseries, 1);
    atomic_fetch_sub(&ix->series_bytes, series_size(ix, nm_n));
    sp_free(&sh->pool, s, series_size(ix, nm_n));
}

/* ---- creation ------------------------------------------------------------------------------ */

/* How far the creation of one series got, for index_create_many's undo. */
typedef struct {
    uint32_t *syms;  /* 2 * labels->n ids: name, value, name, value ... */
    uint32_t nsym;   /* symbol references taken (a prefix of syms) */
    uint32_t npair;  /* names-table pair references taken (a prefix of the pairs) */
    namelist_t *nl;  /* its name list (a reference taken), or NULL */
    bool nl_existed; /* nl was there already: the name references in syms are surplus */
    bool undo;       /* not created: every reference above is given back */
    bool names_gone; /* undone, and the name references went with the list it had made */
} create_t;

typedef struct {
    const uint32_t *syms; /* names at syms[0], syms[2], ... */
    uint32_t n;
} nl_key_t;

static bool namelist_key_eq(uint64_t v, const void *ctx)
{
    const namelist_t *nl = (const namelist_t *)(uintptr_t)v;
    const nl_key_t *k = ctx;
    if (nl->n != k->n)
        return false;
    for (uint32_t i = 0; i < k->n; i++)
        if (nl->ids[i] != k->syms[2 * i])
            return false;
    return true;
}

/* The shared list for the names at syms[0], syms[2], ... (a reference taken), or NULL on OOM;
 * nl_lock held. *existed: the list was there already, so the caller's references on the name
 * symbols are surplus (a new list takes them over). */
static namelist_t *namelist_acquire_locked(index_t *ix, const uint32_t *syms, size_t n, bool *existed)
{
    uint32_t stack[64] = {0}, *ids = n <= 64 ? stack : malloc(4 * n);
    if (!ids)
        return NULL;
    for (size_t i = 0; i < n; i++)
        ids[i] = syms[2 * i];
    uint64_t hash = XXH3_64bits(ids, 4 * n);
    if (ids != stack)
        free(ids);
    nl_key_t key = {syms, (uint32_t)n};
    const uint64_t *v = hashmap_find(&ix->nl_by_hash, hash, namelist_key_eq, &key);
    if (v) {
        namelist_t *nl = (namelist_t *)(uintptr_t)*v;
        nl->refs++;
        *existed = true;
        return nl;
    }
    namelist_t *nl = malloc(sizeof(namelist_t) + 4 * (n ? n : 1));
    if (!nl)
        return NULL;
    for (size_t i = 0; i < n; i++)
        nl->ids[i] = syms[2 * i];
    nl->n = (uint32_t)n;
    nl->refs = 1;
    nl->hash = hash;
    if (hashmap_add(&ix->nl_by_hash, hash, (uint64_t)(uintptr_t)nl) < 0) {
        free(nl);
        return NULL;
    }
    ix->nl_bytes += sizeof(namelist_t) + 4 * n;
    *existed = false;
    return nl;
}

/* Puts the series of `it` into its shard sh (write lock held), with the symbols, pairs and name
 * list c took. INDEX_OK (created; it->ref and it->made set), or an error with the shard as it was. */
static int create_in_shard(index_t *ix, shard_t *sh, uint32_t shard, index_create_t *it, const create_t *c,
                           index_next_id_fn next_id, void *ud)
{
    const labels_t *ls = it->labels;
    if (ix->max_series && atomic_load(&ix->nseries) >= ix->max_series)
        return INDEX_ERR_LIMIT;
    size_t size = series_size(ix, ls->n);
    index_series_t *s = sp_alloc(&sh->pool, size);
    uint32_t slot;
    if (!s || slot_alloc(sh, &slot) < 0) {
        sp_free(&sh->pool, s, size);
        return INDEX_ERR_NOMEM;
    }
    s->hash32 = (uint32_t)it->hash;
    s->slot = slot;
    size_t nposted = 0;
    int rc = 0;
    for (; nposted < ls->n; nposted++) {
        uint64_t key = (uint64_t)c->syms[2 * nposted] << 32 | c->syms[2 * nposted + 1];
        uint64_t *pp = hashmap_get(&sh->pairs, key);
        postings_t *old = pp ? (postings_t *)(uintptr_t)*pp : NULL;
        uint32_t oldcap = old ? old->cap : 0;
        postings_t *p = postings_add(old, sh->wide, slot);
        if (!p) {
            rc = -1;
            break;
        }
        if (pp) {
            *pp = (uint64_t)(uintptr_t)p;
        } else if (hashmap_put(&sh->pairs, key, (uint64_t)(uintptr_t)p) < 0) {
            free(p);
            rc = -1;
            break;
        } else {
            sh->postings_bytes += sizeof(postings_t) + 2 * sizeof(hashmap_slot_t);
        }
        sh->postings_bytes += postings_size(p->cap, sh->wide) - postings_size(oldcap, sh->wide);
    }
    sh->slots[slot] = s;
    if (rc == 0 && byhash_insert(sh, (uint32_t)it->hash, slot) < 0)
        rc = -1;
    if (rc != 0) {
        /* Roll back: postings added so far, the slot, the record. */
        for (size_t i = 0; i < nposted; i++) {
            uint64_t key = (uint64_t)c->syms[2 * i] << 32 | c->syms[2 * i + 1];
            uint64_t *pp = hashmap_get(&sh->pairs, key);
            if (pp) {
                postings_t *p = (postings_t *)(uintptr_t)*pp;
                postings_remove(p, sh->wide, slot);
                if (p->n == 0) {
                    hashmap_del(&sh->pairs, key);
                    free(p);
                }
            }
        }
        slot_free(sh, slot);
        sp_free(&sh->pool, s, size);
        return INDEX_ERR_NOMEM;
    }
    s->names = c->nl;
    uint32_t *vals = series_vals(ix, s);
    for (size_t i = 0; i < ls->n; i++)
        vals[i] = c->syms[2 * i + 1];
    /* The id: the caller's (also a 0 without next_id, as given), else the one these labels had
     * when they left, else a fresh one. */
    const uint64_t *dep = hashmap_count(&sh->departed) ? hashmap_get(&sh->departed, it->hash) : NULL;
    if (it->id || !next_id) {
        s->id = it->id;
        it->made = INDEX_MADE_NEW;
    } else if (dep) {
        s->id = *dep;
        it->made = INDEX_MADE_RETURNED;
    } else {
        s->id = next_id(ud);
        it->made = INDEX_MADE_NEW;
    }
    if (dep)
        hashmap_del(&sh->departed, it->hash); /* the id lives in the series now */
    sh->nseries++;
    atomic_fetch_add(&ix->nseries, 1);
    atomic_fetch_add(&ix->series_bytes, size);
    it->ref = (index_ref_t){.id = s->id, .shard = shard, .slot = slot};
    return INDEX_OK;
}

/* A shard's creations are a cache miss per label three times over (the pair's slot in the
 * postings table, the postings list's header, its tail) and one in the series-hash table, each
 * waiting for the one before: most of create_in_shard's time in a push of new series. So while
 * one series is made, the next ones' lines are fetched, one step of that chain per series: the
 * pair slots CREATE_AHEAD series ahead, the lists' headers half-way, their tails the series
 * after. Only hints: the tables may change before the series' turn. */
#define CREATE_AHEAD 6

static bool create_wanted(const index_create_t *it, const create_t *c)
{
    return it->rc == INDEX_OK && c->nsym == 2 * it->labels->n;
}

static void create_prefetch(const shard_t *sh, const index_create_t *it, const create_t *c, int stage)
{
    if (!create_wanted(it, c) || !sh->pairs.n)
        return;
    uint32_t n = (uint32_t)it->labels->n;
    if (stage == 0 && sh->bh_cap)
        __builtin_prefetch(&sh->byhash[(uint32_t)hash_mix64((uint32_t)it->hash) & (sh->bh_cap - 1)]);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)c->syms[2 * i] << 32 | c->syms[2 * i + 1];
        if (stage == 0) {
            __builtin_prefetch(&sh->pairs.slots[hashmap__home(&sh->pairs, key)]);
            continue;
        }
        /* Looked up again at each stage, not kept from the one before: a list grown by a
         * series made meanwhile has moved, and stage 2 reads its header. */
        const uint64_t *pp = hashmap_get(&sh->pairs, key);
        if (!pp)
            continue;
        const postings_t *p = (const postings_t *)(uintptr_t)*pp;
        if (stage == 1)
            __builtin_prefetch(p, 1);
        else
            __builtin_prefetch((const char *)p->v + (size_t)p->n * (sh->wide ? 4 : 2), 1);
    }
}

int index_create_many(index_t *ix, index_create_t *it, size_t n, index_next_id_fn next_id, void *ud)
{
    if (!n)
        return 0;
    /* At the series limit nothing is interned only to be given back: a client sending new series
     * to a full index (cardinality abuse) costs a lookup per series, not a symbol's life. The
     * shards check again for a limit reached during the batch. */
    bool full = ix->max_series && atomic_load(&ix->nseries) >= ix->max_series;
    size_t nsyms = 0;
    for (size_t k = 0; k < n; k++) {
        it[k].made = INDEX_MADE_NONE;
        it[k].rc = full ? INDEX_ERR_LIMIT : it[k].labels->n > UINT16_MAX ? INDEX_ERR_NOMEM : INDEX_OK;
        if (it[k].rc == INDEX_OK)
            nsyms += 2 * it[k].labels->n;
    }
    /* One series (the common caller) needs no heap. */
    create_t cstack[1];
    uint32_t sstack[64], ostack[1];
    create_t *c = n == 1 ? cstack : malloc(n * sizeof(*c));
    uint32_t *syms = nsyms <= 64 ? sstack : malloc(nsyms * sizeof(uint32_t));
    uint32_t *order = n == 1 ? ostack : malloc(n * sizeof(uint32_t));
    int rc = 0;
    if (!c || !syms || !order) {
        rc = -1;
        goto out;
    }
    for (size_t k = 0, at = 0; k < n; k++) {
        c[k] = (create_t){.syms = syms + at};
        if (it[k].rc == INDEX_OK)
            at += 2 * it[k].labels->n;
    }

    /* Symbols, the names table and the name lists: each lock once for the whole batch. */
    pthread_rwlock_wrlock(&ix->sym_lock);
    for (size_t k = 0; k < n; k++) {
        const labels_t *ls = it[k].labels;
        /* Neighbours in a batch share most strings at the same places (a TaskManager's job,
         * host and task names on all its series): those take the previous item's symbols without
         * hashing them again. */
        const labels_t *pl = k > 0 && c[k - 1].nsym == 2 * it[k - 1].labels->n ? it[k - 1].labels : NULL;
        for (size_t i = 0; it[k].rc == INDEX_OK && i < ls->n; i++) {
            for (int part = 0; part < 2; part++) {
                const char *str = part ? ls->v[i].value : ls->v[i].name;
                const char *was = !pl || i >= pl->n ? NULL : part ? pl->v[i].value : pl->v[i].name;
                uint32_t id;
                if (was && (was == str || strcmp(was, str) == 0)) {
                    id = c[k - 1].syms[2 * i + (size_t)part];
                    sym_entry(ix, id)->refs++;
                } else if ((id = sym_ref_locked(ix, str)) == EMPTY32) {
                    it[k].rc = INDEX_ERR_NOMEM;
                    break;
                }
                c[k].syms[c[k].nsym++] = id;
            }
        }
    }
    pthread_rwlock_unlock(&ix->sym_lock);
    pthread_rwlock_wrlock(&ix->names_lock);
    for (size_t k = 0; k < n; k++)
        for (; it[k].rc == INDEX_OK && c[k].npair < it[k].labels->n; c[k].npair++)
            if (names_pair_ref(ix, c[k].syms[2 * c[k].npair], c[k].syms[2 * c[k].npair + 1]) < 0)
                it[k].rc = INDEX_ERR_NOMEM;
    pthread_rwlock_unlock(&ix->names_lock);
    pthread_mutex_lock(&ix->nl_lock);
    for (size_t k = 0; k < n; k++)
        if (it[k].rc == INDEX_OK &&
            !(c[k].nl = namelist_acquire_locked(ix, c[k].syms, it[k].labels->n, &c[k].nl_existed)))
            it[k].rc = INDEX_ERR_NOMEM;
    pthread_mutex_unlock(&ix->nl_lock);

    /* The shards, each write-locked once, in batch order within a shard (a series that appears
     * twice is made by its first item and found by the second). */
    size_t start[INDEX_SHARDS + 1] = {0};
    for (size_t k = 0; k < n; k++)
        start[it[k].hash % INDEX_SHARDS + 1]++;
    for (size_t h = 1; h <= INDEX_SHARDS; h++)
        start[h] += start[h - 1];
    size_t fill[INDEX_SHARDS];
    memcpy(fill, start, sizeof(fill));
    for (size_t k = 0; k < n; k++)
        order[fill[it[k].hash % INDEX_SHARDS]++] = (uint32_t)k;
    for (uint32_t h = 0; h < INDEX_SHARDS; h++) {
        if (start[h] == start[h + 1])
            continue;
        shard_t *sh = &ix->shards[h];
        pthread_rwlock_wrlock(&sh->lock);
        for (size_t j = start[h]; j < start[h + 1]; j++) {
            if (j + CREATE_AHEAD < start[h + 1])
                create_prefetch(sh, &it[order[j + CREATE_AHEAD]], &c[order[j + CREATE_AHEAD]], 0);
            if (j + CREATE_AHEAD / 2 < start[h + 1])
                create_prefetch(sh, &it[order[j + CREATE_AHEAD / 2]], &c[order[j + CREATE_AHEAD / 2]], 1);
            if (j + 1 < start[h + 1])
                create_prefetch(sh, &it[order[j + 1]], &c[order[j + 1]], 2);
            uint32_t k = order[j];
            /* Someone else made it meanwhile, or an earlier item did (also when the index is
             * full: a series that exists is found, not refused). */
            bool look = it[k].rc == INDEX_OK || it[k].rc == INDEX_ERR_LIMIT;
            index_series_t *s = look ? shard_find(ix, sh, it[k].labels, it[k].hash) : NULL;
            if (s) {
                it[k].ref = index_series_ref(s);
                it[k].rc = INDEX_OK;
            }
            if (s || it[k].rc != INDEX_OK) {
                c[k].undo = true;
                continue;
            }
            it[k].rc = create_in_shard(ix, sh, h, &it[k], &c[k], next_id, ud);
            c[k].undo = it[k].rc != INDEX_OK;
        }
        pthread_rwlock_unlock(&sh->lock);
    }

    /* What was not created gives its references back; a created series whose name list was
     * there already drops its surplus name references. */
    bool any_undo = false;
    for (size_t k = 0; k < n; k++)
        any_undo |= c[k].undo;
    if (any_undo) {
        pthread_rwlock_wrlock(&ix->names_lock);
        for (size_t k = 0; k < n; k++)
            for (uint32_t i = 0; c[k].undo && i < c[k].npair; i++)
                names_pair_unref(ix, c[k].syms[2 * i], c[k].syms[2 * i + 1]);
        pthread_rwlock_unlock(&ix->names_lock);
    }
    /* A name list this batch made for a series it did not create goes first: its last reference
     * takes the list's name references (the item's own) with it. */
    for (size_t k = 0; k < n; k++)
        if (c[k].undo && c[k].nl && !c[k].nl_existed) {
            namelist_release(ix, c[k].nl);
            c[k].nl = NULL;
            c[k].names_gone = true;
        }
    pthread_rwlock_wrlock(&ix->sym_lock);
    for (size_t k = 0; k < n; k++) {
        if (!c[k].undo) {
            for (uint32_t i = 0; c[k].nl_existed && i < it[k].labels->n; i++)
                sym_unref_locked(ix, c[k].syms[2 * i]);
            continue;
        }
        for (uint32_t i = c[k].names_gone; i < c[k].nsym; i += 1 + c[k].names_gone)
            sym_unref_locked(ix, c[k].syms[i]);
    }
    pthread_rwlock_unlock(&ix->sym_lock);
    for (size_t k = 0; k < n; k++)
        if (c[k].undo && c[k].nl)
            namelist_release(ix, c[k].nl);
out:
    if (c != cstack)
        free(c);
    if (syms != sstack)
        free(syms);
    if (order != ostack)
        free(order);
    return rc;
}

/* index_acquire_or_create and index_get_or_create: look_first does the read-locked lookup
 * first; out (the series, read-locked) or, when out is NULL, ref_out (nothing held). */
static int acquire_or_create(index_t *ix, const labels_t *ls, uint64_t hash, uint64_t id, bool look_first,
                             index_series_t **out, index_ref_t *ref_out, bool *created)
{
    *created = false;
    index_series_t *s = look_first ? index_acquire(ix, ls, hash) : NULL;
    if (s) {
        if (out) {
            *out = s;
        } else {
            *ref_out = index_series_ref(s);
            index_release(ix, s);
        }
        return INDEX_OK;
    }
    index_create_t it = {.labels = ls, .hash = hash, .id = id};
    if (index_create_many(ix, &it, 1, NULL, NULL) < 0)
        return INDEX_ERR_NOMEM;
    if (it.rc != INDEX_OK)
        return it.rc;
    *created = it.made != INDEX_MADE_NONE;
    if (!out) {
        *ref_out = it.ref;
        return INDEX_OK;
    }
    /* The series cannot vanish before this read lock unless a sweep removes it (only when its
     * payload says it is empty — a freshly created series has not been appended to yet), so it
     * is looked up again rather than trusted. */
    index_series_t *again = index_acquire_ref(ix, &it.ref);
    if (!again)
        return acquire_or_create(ix, ls, hash, id, true, out, ref_out, created);
    *out = again;
    return INDEX_OK;
}

int index_acquire_or_create(index_t *ix, const labels_t *ls, uint64_t hash, uint64_t id, index_series_t **out,
                            bool *created)
{
    return acquire_or_create(ix, ls, hash, id, true, out, NULL, created);
}

int index_get_or_create(index_t *ix, const labels_t *ls, uint64_t hash, uint64_t id, bool look_first, index_ref_t *ref,
                        bool *created)
{
    return acquire_or_create(ix, ls, hash, id, look_first, NULL, ref, created);
}

/* ---- departed series ----------------------------------------------------------------------- */

bool index_departed_id(index_t *ix, uint64_t hash, uint64_t *id)
{
    shard_t *sh = &ix->shards[hash % INDEX_SHARDS];
    pthread_rwlock_rdlock(&sh->lock);
    const uint64_t *v = hashmap_get(&sh->departed, hash);
    if (v)
        *id = *v;
    pthread_rwlock_unlock(&sh->lock);
    return v != NULL;
}

int index_departed_note(index_t *ix, uint64_t hash, uint64_t id)
{
    if (id == HASHMAP_NONE)
        return INDEX_ERR_NOMEM; /* the one value a table cannot hold; no catalog id is */
    shard_t *sh = &ix->shards[hash % INDEX_SHARDS];
    pthread_rwlock_wrlock(&sh->lock);
    int rc = hashmap_put(&sh->departed, hash, id) < 0 ? INDEX_ERR_NOMEM : INDEX_OK;
    pthread_rwlock_unlock(&sh->lock);
    return rc;
}

/* ---- selection ----------------------------------------------------------------------------- */

typedef struct {
    uint32_t name;   /* symbol id, or EMPTY32 if no series has the label */
    bool negative;   /* values lists postings to subtract (matcher matches "") */
    bool everything; /* matches every series: no constraint */
    bool nothing;    /* matches no series */
    u32vec_t values; /* value symbol ids */
} plan_t;

static int plan_matcher(index_t *ix, const matcher_t *m, plan_t *p)
{
    memset(p, 0, sizeof(*p));
    bool empty = matcher_matches_empty(m);
    p->negative = empty;
    p->name = sym_lookup(ix, matcher_name(m));
    if (p->name == EMPTY32) {
        /* Nobody has this label: every series sees "". */
        if (empty)
            p->everything = true;
        else
            p->nothing = true;
        return 0;
    }
    const char *const *set;
    size_t nset = matcher_literal_set(m, &set);
    matcher_type_t t = matcher_type(m);
    bool pos_type = t == MATCHER_EQ || t == MATCHER_RE;
    /* Fast path: a literal set S names exactly the values to union (=, =~ without "") or to
     * subtract (!=, !~ when "" is not in S). */
    if (nset && pos_type != empty) {
        for (size_t i = 0; i < nset; i++) {
            uint32_t v = sym_lookup(ix, set[i]);
            if (v != EMPTY32 && vec_push(&p->values, v) < 0)
                return -1;
        }
    } else {
        pthread_rwlock_rdlock(&ix->names_lock);
        uint64_t *vp = hashmap_get(&ix->names, p->name);
        const values_t *vals = vp ? (const values_t *)(uintptr_t)*vp : NULL;
        int rc = 0;
        for (uint32_t i = 0; vals && i < vals->n && rc == 0; i++) {
            const sym_t *e = sym_entry(ix, vals->v[i]);
            bool match = matcher_matches(m, e->s, e->len);
            /* positive plan collects matching values, negative plan the non-matching ones */
            if (match != empty)
                rc = vec_push(&p->values, vals->v[i]);
        }
        pthread_rwlock_unlock(&ix->names_lock);
        if (rc < 0)
            return -1;
    }
    vec_sort_unique(&p->values);
    if (!empty && p->values.n == 0)
        p->nothing = true;
    if (empty && p->values.n == 0)
        p->everything = true;
    return 0;
}

/* Union of the postings of plan p's values in shard sh, into out (sorted, unique). */
static int shard_union(const shard_t *sh, const plan_t *p, u32vec_t *out)
{
    out->n = 0;
    for (size_t i = 0; i < p->values.n; i++) {
        uint64_t *pp = hashmap_get(&sh->pairs, (uint64_t)p->name << 32 | p->values.v[i]);
        if (!pp)
            continue;
        const postings_t *ps = (const postings_t *)(uintptr_t)*pp;
        for (uint32_t k = 0; k < ps->n; k++)
            if (vec_push(out, postings_at(ps, sh->wide, k)) < 0)
                return -1;
    }
    vec_sort_unique(out);
    return 0;
}

static bool series_matches(const index_t *ix, const index_series_t *s, const matcher_t *const *ms, size_t n)
{
    const uint32_t *vals = series_vals(ix, s);
    for (size_t i = 0; i < n; i++) {
        const sym_t *val = NULL;
        for (uint16_t k = 0; k < s->names->n && !val; k++)
            if (strcmp(sym_str(ix, s->names->ids[k]), matcher_name(ms[i])) == 0)
                val = sym_entry(ix, vals[k]);
        if (!matcher_matches(ms[i], val ? val->s : "", val ? val->len : 0))
            return false;
    }
    return true;
}

int index_select(index_t *ix, const matcher_t *const *ms, size_t n, index_refs_t *out)
{
    plan_t *plans = calloc(n ? n : 1, sizeof(plan_t));
    if (!plans)
        return INDEX_ERR_NOMEM;
    int rc = INDEX_OK;
    bool nothing = false;
    uint64_t gen = atomic_load(&ix->sym_gen), pgen = atomic_load(&ix->pairs_gen);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (plan_matcher(ix, ms[i], &plans[i]) < 0)
            rc = INDEX_ERR_NOMEM;
        nothing |= plans[i].nothing;
    }
    u32vec_t cur = {0}, tmp = {0};
    for (uint32_t si = 0; si < INDEX_SHARDS && rc == 0 && !nothing; si++) {
        shard_t *sh = &ix->shards[si];
        pthread_rwlock_rdlock(&sh->lock);
        bool have = false;
        cur.n = 0;
        for (size_t i = 0; i < n && rc == 0; i++) {
            if (plans[i].negative || plans[i].everything)
                continue;
            if (shard_union(sh, &plans[i], have ? &tmp : &cur) < 0) {
                rc = INDEX_ERR_NOMEM;
                break;
            }
            if (have)
                vec_intersect(&cur, tmp.v, tmp.n);
            have = true;
            if (cur.n == 0)
                break;
        }
        if (!have) {
            for (uint32_t s = 0; s < sh->nslots && rc == 0; s++)
                if (!slot_is_free(sh, s) && vec_push(&cur, s) < 0)
                    rc = INDEX_ERR_NOMEM;
        }
        for (size_t i = 0; i < n && rc == 0 && cur.n > 0; i++) {
            if (!plans[i].negative || plans[i].everything)
                continue;
            if (shard_union(sh, &plans[i], &tmp) < 0)
                rc = INDEX_ERR_NOMEM;
            else
                vec_subtract(&cur, tmp.v, tmp.n);
        }
        /* The plans describe the index as it was before this shard was locked. A series visible
         * now whose labels were not (a new value a negative matcher never saw, or a symbol id
         * freed and reused for another string) could be wrongly in cur; both bump a generation
         * before the series is published, so if neither moved the plans are exact here. Else
         * check the candidates against their labels (cheap for literal matchers). */
        bool verify = n > 0 && (atomic_load(&ix->sym_gen) != gen || atomic_load(&ix->pairs_gen) != pgen);
        for (size_t k = 0; k < cur.n && rc == 0; k++) {
            index_series_t *s = sh->slots[cur.v[k]];
            if (verify && !series_matches(ix, s, ms, n))
                continue;
            if (refs_push(out, (index_ref_t){.id = s->id, .shard = si, .slot = s->slot}) < 0)
                rc = INDEX_ERR_NOMEM;
        }
        pthread_rwlock_unlock(&sh->lock);
    }
    for (size_t i = 0; i < n; i++)
        free(plans[i].values.v);
    free(plans);
    free(cur.v);
    free(tmp.v);
    return rc;
}

/* ---- label names / values ------------------------------------------------------------------ */

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts ids' strings into an arena array, deduplicated. */
static int strings_from_syms(index_t *ix, u32vec_t *ids, arena_t *a, const char ***out, size_t *count)
{
    vec_sort_unique(ids);
    const char **v = arena_alloc(a, sizeof(char *) * (ids->n ? ids->n : 1));
    for (size_t i = 0; i < ids->n; i++) {
        const sym_t *e = sym_entry(ix, ids->v[i]);
        v[i] = arena_strndup(a, e->s, e->len);
    }
    qsort(v, ids->n, sizeof(char *), cmp_cstr);
    *out = v;
    *count = ids->n;
    return INDEX_OK;
}

/* Collects, for the series in refs, the symbol ids of names (want_name) or of the values of
 * label `name`. Strings are copied while the series is held. */
static int collect_from_series(index_t *ix, const index_refs_t *refs, uint32_t name, arena_t *a, const char ***out,
                               size_t *count)
{
    const char **v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < refs->n; i++) {
        index_series_t *s = index_acquire_ref(ix, &refs->v[i]);
        if (!s)
            continue;
        const uint32_t *vals = series_vals(ix, s);
        for (uint16_t k = 0; k < s->names->n; k++) {
            if (name != EMPTY32 && s->names->ids[k] != name)
                continue;
            const sym_t *e = sym_entry(ix, name == EMPTY32 ? s->names->ids[k] : vals[k]);
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                const char **nv = realloc(v, nc * sizeof(char *));
                if (!nv) {
                    index_release(ix, s);
                    free(v);
                    return INDEX_ERR_NOMEM;
                }
                v = nv;
                cap = nc;
            }
            v[n++] = arena_strndup(a, e->s, e->len);
        }
        index_release(ix, s);
    }
    if (n)
        qsort(v, n, sizeof(char *), cmp_cstr);
    const char **res = arena_alloc(a, sizeof(char *) * (n ? n : 1));
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || strcmp(res[u - 1], v[i]) != 0)
            res[u++] = v[i];
    free(v);
    *out = res;
    *count = u;
    return INDEX_OK;
}

int index_label_names(index_t *ix, const matcher_t *const *ms, size_t n, arena_t *a, const char ***names, size_t *count)
{
    if (n > 0) {
        index_refs_t refs = {0};
        int rc = index_select(ix, ms, n, &refs);
        if (rc == INDEX_OK)
            rc = collect_from_series(ix, &refs, EMPTY32, a, names, count);
        index_refs_free(&refs);
        return rc;
    }
    u32vec_t ids = {0};
    int rc = INDEX_OK;
    /* names_lock keeps every name in the table alive (its pairs hold symbol references). */
    pthread_rwlock_rdlock(&ix->names_lock);
    size_t pos = 0;
    for (const hashmap_slot_t *e; rc == 0 && (e = hashmap_next(&ix->names, &pos));)
        if (vec_push(&ids, (uint32_t)e->key) < 0)
            rc = INDEX_ERR_NOMEM;
    if (rc == 0)
        rc = strings_from_syms(ix, &ids, a, names, count);
    pthread_rwlock_unlock(&ix->names_lock);
    free(ids.v);
    return rc;
}

int index_label_values(index_t *ix, const char *name, const matcher_t *const *ms, size_t n, arena_t *a,
                       const char ***values, size_t *count)
{
    uint32_t nid = sym_lookup(ix, name);
    if (nid == EMPTY32) {
        *values = arena_alloc(a, sizeof(char *));
        *count = 0;
        return INDEX_OK;
    }
    if (n > 0) {
        index_refs_t refs = {0};
        int rc = index_select(ix, ms, n, &refs);
        if (rc == INDEX_OK)
            rc = collect_from_series(ix, &refs, nid, a, values, count);
        index_refs_free(&refs);
        return rc;
    }
    u32vec_t ids = {0};
    int rc = INDEX_OK;
    pthread_rwlock_rdlock(&ix->names_lock);
    uint64_t *vp = hashmap_get(&ix->names, nid);
    const values_t *vals = vp ? (const values_t *)(uintptr_t)*vp : NULL;
    for (uint32_t i = 0; vals && i < vals->n && rc == 0; i++)
        if (vec_push(&ids, vals->v[i]) < 0)
            rc = INDEX_ERR_NOMEM;
    if (rc == 0)
        rc = strings_from_syms(ix, &ids, a, values, count);
    pthread_rwlock_unlock(&ix->names_lock);
    free(ids.v);
    return rc;
}

/* ---- sweeping and iteration ---------------------------------------------------------------- */

bool index_sweep(index_t *ix, uint32_t shard, uint32_t *cursor, uint32_t budget,
                 bool (*fn)(void *ud, index_series_t *s), void *ud)
{
    shard_t *sh = &ix->shards[shard];
    pthread_rwlock_wrlock(&sh->lock);
    uint32_t i = *cursor, end = i + budget;
    for (; i < sh->nslots && i < end; i++) {
        if (slot_is_free(sh, i))
            continue;
        index_series_t *s = sh->slots[i];
        if (fn(ud, s))
            shard_remove(ix, sh, s);
    }
    bool done = i >= sh->nslots;
    pthread_rwlock_unlock(&sh->lock);
    *cursor = done ? 0 : i;
    return done;
}

int index_foreach(index_t *ix, int (*fn)(void *ud, index_series_t *s), void *ud)
{
    for (uint32_t si = 0; si < INDEX_SHARDS; si++) {
        shard_t *sh = &ix->shards[si];
        pthread_rwlock_rdlock(&sh->lock);
        for (uint32_t i = 0; i < sh->nslots; i++) {
            if (slot_is_free(sh, i))
                continue;
            int rc = fn(ud, sh->slots[i]);
            if (rc) {
                pthread_rwlock_unlock(&sh->lock);
                return rc;
            }
        }
        pthread_rwlock_unlock(&sh->lock);
    }
    return 0;
}

uint64_t index_num_series(const index_t *ix)
{
    return atomic_load(&((index_t *)ix)->nseries);
}

uint64_t index_memory_bytes(const index_t *ix)
{
    index_t *m = (index_t *)ix;
    uint64_t total = atomic_load(&m->series_bytes);
    for (int i = 0; i < INDEX_SHARDS; i++) {
        shard_t *sh = &m->shards[i];
        pthread_rwlock_rdlock(&sh->lock);
        total += sh->postings_bytes + sh->capslots * sizeof(void *) + sh->bh_cap * sizeof(uint32_t) +
                 hashmap_bytes(&sh->pairs) + hashmap_bytes(&sh->departed);
        pthread_rwlock_unlock(&sh->lock);
    }
    pthread_rwlock_rdlock(&m->sym_lock);
    total += m->sym_bytes;
    pthread_rwlock_unlock(&m->sym_lock);
    pthread_mutex_lock(&m->nl_lock);
    total += m->nl_bytes + hashmap_bytes(&m->nl_by_hash);
    pthread_mutex_unlock(&m->nl_lock);
    return total;
}

/* ---- statistics ---------------------------------------------------------------------------- */

static int cmp_stat_desc(const void *a, const void *b)
{
    const index_stat_t *x = a, *y = b;
    if (x->value != y->value)
        return x->value > y->value ? -1 : 1;
    return strcmp(x->name, y->name);
}

typedef struct {
    index_stat_t *v;
    size_t n, cap;
} statvec_t;

static void stat_push(statvec_t *s, const char *name, uint64_t value)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 32;
        index_stat_t *p = realloc(s->v, nc * sizeof(*p));
        if (!p)
            return; /* statistics are best effort */
        s->v = p;
        s->cap = nc;
    }
    s->v[s->n++] = (index_stat_t){name, value};
}

static void stat_top(statvec_t *s, size_t top, arena_t *a, index_stat_t **out, size_t *n)
{
    if (s->n)
        qsort(s->v, s->n, sizeof(index_stat_t), cmp_stat_desc);
    size_t k = s->n < top ? s->n : top;
    *out = arena_alloc(a, sizeof(index_stat_t) * (k ? k : 1));
    for (size_t i = 0; i < k; i++) {
        (*out)[i].name = arena_strdup(a, s->v[i].name);
        (*out)[i].value = s->v[i].value;
    }
    *n = k;
    free(s->v);
    *s = (statvec_t){0};
}

typedef struct {
    uint32_t name, value;
    uint64_t count;
} pairstat_t;

static int cmp_pairstat_desc(const void *a, const void *b)
{
    const pairstat_t *x = a, *y = b;
    return x->count != y->count ? (x->count > y->count ? -1 : 1) : 0;
}

int index_stats(index_t *ix, size_t top, arena_t *a, index_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    statvec_t by_metric = {0}, by_name = {0}, mem = {0};
    pairstat_t *pairs = NULL;
    size_t npairs = 0, cappairs = 0;
    pthread_rwlock_rdlock(&ix->names_lock);
    /* Looked up under names_lock: a name in the table cannot be freed while it is held. */
    uint32_t metric = sym_lookup(ix, LABEL_METRIC_NAME);
    size_t pos = 0;
    for (const hashmap_slot_t *ent; (ent = hashmap_next(&ix->names, &pos));) {
        uint32_t name = (uint32_t)ent->key;
        const values_t *vals = (const values_t *)(uintptr_t)ent->val;
        const char *ns = sym_str(ix, name);
        uint64_t bytes = 0;
        for (uint32_t k = 0; k < vals->n; k++) {
            const sym_t *e = sym_entry(ix, vals->v[k]);
            bytes += e->len;
            uint64_t *cnt = hashmap_get(&ix->pair_count, (uint64_t)name << 32 | vals->v[k]);
            uint64_t c = cnt ? *cnt : 0;
            if (name == metric)
                stat_push(&by_metric, e->s, c);
            if (npairs == cappairs) {
                size_t nc = cappairs ? cappairs * 2 : 64;
                pairstat_t *p = realloc(pairs, nc * sizeof(*p));
                if (!p)
                    continue;
                pairs = p;
                cappairs = nc;
            }
            pairs[npairs++] = (pairstat_t){name, vals->v[k], c};
        }
        stat_push(&by_name, ns, vals->n);
        stat_push(&mem, ns, bytes);
    }
    stat_top(&by_metric, top, a, &out->series_by_metric, &out->n_series_by_metric);
    stat_top(&by_name, top, a, &out->values_by_name, &out->n_values_by_name);
    stat_top(&mem, top, a, &out->memory_by_name, &out->n_memory_by_name);
    if (npairs)
        qsort(pairs, npairs, sizeof(pairstat_t), cmp_pairstat_desc);
    size_t k = npairs < top ? npairs : top;
    out->series_by_pair = arena_alloc(a, sizeof(index_stat_t) * (k ? k : 1));
    for (size_t i = 0; i < k; i++) {
        out->series_by_pair[i].name =
            arena_sprintf(a, "%s=%s", sym_str(ix, pairs[i].name), sym_str(ix, pairs[i].value));
        out->series_by_pair[i].value = pairs[i].count;
    }
    out->n_series_by_pair = k;
    pthread_rwlock_unlock(&ix->names_lock);
    free(pairs);
    return INDEX_OK;
}
