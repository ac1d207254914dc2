/*
 * push registry — groups, families and the incremental consistency index; see registry.h.
 *
 * Memory layout. Every accepted push copies what it keeps into two reference-counted "batches":
 * a base, 4 KiB blocks with what does not change while the push's shape does not (names, help, label
 * sets, quantile/bucket bounds; strings and whole label sets deduplicated within the push: a Flink
 * TaskManager's ~860 metrics have ~50 distinct label sets), and one exact-size block with the
 * families, their metrics (pointing into the base), values and series refs, which holds a ref on
 * the base. A group's families point into the blocks of the pushes that delivered them and each
 * block is counted by its families, so a POST that replaces some families frees a block only
 * when none of its families is left. A repeated push (shape cache) makes only a new block over
 * the same base: per series the registry then holds ~64 bytes of metric, value and ref, and a
 * share of the base (~40 bytes).
 *
 *   registry ── groups (hash by grouping key) ── group ── families (sorted by name)
 *            └─ types (hash by metric name -> type, number of groups holding it)
 *
 * The type index answers what the Pushgateway checks across groups: that a family has one type
 * everywhere, and that no family is named like a summary's or histogram's _sum, _count (or a
 * histogram's _bucket) series beside it (client_golang will not gather those together).
 *
 * A family keeps "metrics" in the protobuf sense: one per label set, with a value (counter,
 * gauge, untyped) or sum/count plus quantiles or buckets (summary, histogram). That is the shape
 * both the text and the JSON outputs need; storage gets the component series.
 *
 * Locking: one mutex guards everything. Prepare does its heavy work (building families,
 * hashing series) outside it and takes it only to read the group and the type index; commit
 * takes it to swap families in. The caller serializes prepare/commit pairs (see registry.h).
 */
#include "internal/push/registry.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "internal/push/shape.h"
#include "internal/util/hashmap.h"

#define PUSH_TIME_NAME "push_time_seconds"
#define PUSH_FAIL_NAME "push_failure_time_seconds"
#define PUSH_TIME_HELP "Last Unix time when changing this group in the Pushgateway succeeded."
#define PUSH_FAIL_HELP "Last Unix time when changing this group in the Pushgateway failed."

/* Stale marker: the NaN Prometheus writes when a series disappears. */
static double push_stale_nan(void)
{
    uint64_t bits = 0x7ff0000000000002ULL;
    double d;
    memcpy(&d, &bits, sizeof(d));
    return d;
}

/* ---- data ---------------------------------------------------------------------------------- */

/* A base's memory: blocks of BLK_BYTES (bigger allocations get their own), filled in order. An
 * arena's blocks double (8, 16, 32 KiB...), which left a base about half empty on average. */
typedef struct push_blk {
    struct push_blk *next;
    size_t used, cap;
    _Alignas(16) char data[];
} push_blk_t;

enum { BLK_BYTES = 4096 - 64 };

typedef struct push_batch {
    /* Either a base: blocks holding names, label sets and bounds (shared by every family built
     * from one body and by its repeats), or one exact-size block `mem` with a push's families,
     * metrics, values and refs (batch_pack), holding a ref on its base. */
    push_blk_t *blks;
    void *mem;
    push_ref_t *srefs; /* in mem: the series refs of every family, in family order */
    size_t mem_bytes;  /* of mem */
    size_t nsets;      /* base: label sets stored (push_registry_memory) */
    int refs;          /* under the registry mutex: families holding it, plus renders pinning it */
    /* A repeated push (shape cache) copies the families of the push it repeats but keeps
     * pointing at their labels, bounds and names: it holds a ref on the batch that has them. */
    struct push_batch *base;
} push_batch_t;

/* What a summary or histogram metric has besides its labels: kept apart, so the metrics of
 * counters, gauges and untyped (nearly all of a Flink TaskManager's) are 32 bytes, not 64. */
typedef struct {
    double sum, count;
    double *qb, *qv; /* quantile / upper bound, and value / cumulative count */
    const char **qs; /* qb as the body wrote it, normalized (NULL after a restore: format qb) */
} push_mx_t;

typedef struct {
    label_t *labels; /* sorted by name; grouping applied; instance defaulted; no quantile/le */
    uint32_t nlabels;
    uint32_t nq;  /* quantiles (summary) or buckets (histogram); then x is set */
    double value; /* counter, gauge, untyped */
    push_mx_t *x; /* sum, count, quantiles / buckets; NULL: sum and count 0, none */
} push_metric_t;

static uint64_t dbits_of(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

static double metric_sum(const push_metric_t *m)
{
    return m->x ? m->x->sum : 0;
}
static double metric_count(const push_metric_t *m)
{
    return m->x ? m->x->count : 0;
}

typedef struct {
    const char *name;
    const char *help; /* NULL: none */
    expfmt_type_t type;
    push_metric_t *metrics;
    size_t n;
    int64_t push_ms;
    push_batch_t *batch;
    uint64_t shape; /* hash of everything but the values: a push that keeps it logs values only */
    /* The storage refs of its component series (family_each_series order), in the batch; NULL
     * for families restored from a snapshot or the WAL (refs do not outlive the process). */
    push_ref_t *refs;
    size_t nseries;
} push_family_t;

/* Where value k of a shape goes in the group's families (sorted fams, sorted metrics). */
typedef struct {
    uint32_t fam, metric;
    int32_t part; /* PART_* or the index of a quantile / bucket */
} push_dest_t;

enum { PART_VALUE = -1, PART_SUM = -2, PART_COUNT = -3, PART_NONE = -4 };

/* A group's shape cache: the shape of its last full PUT body (push/shape.h) and where each of
 * its values lands. Valid while the group holds exactly the families that push made (commit drops
 * it on any other change). */
typedef struct {
    push_shape_t *shape;
    push_dest_t *dest; /* push_shape_nvalues entries */
    bool om;           /* OpenMetrics body: counts and buckets are not truncated */
    int refs;          /* under the registry mutex: the group, plus matches in flight */
} push_cache_t;

typedef struct push_group {
    struct push_group *next; /* hash chain */
    uint64_t hash;
    char *key;         /* canonical grouping key */
    labels_t grouping; /* sorted; strings owned via `strings` */
    char *strings;
    push_family_t **fams; /* sorted by name */
    size_t nfams, cap;
    int64_t push_ms, fail_ms; /* 0 = never */
    bool last_ok;
    int64_t first_push_ms;
    double interval_ms; /* smoothed interval between successful pushes; 0 = unknown */
    uint64_t shape;     /* combined family shapes, as of the last logged full record */
    push_cache_t *cache; /* NULL: the next push is parsed in full */
    /* Heartbeat jobs (push_beat_t.jobs): recomputed when the shape changes (beat_shape). */
    const char **beat_jobs;
    size_t nbeat_jobs;
    uint64_t beat_shape;
} push_group_t;

typedef struct push_type {
    uint64_t hash;
    char *name;
    expfmt_type_t type;
    uint32_t groups;
} push_type_t;

struct push_registry {
    pthread_mutex_t mu;
    push_options_t opt;
    push_group_t **gtab;
    size_t gcap, ngroups;
    hashmap_t types; /* XXH3(name) -> push_type_t*, a multimap compared by name */
    _Atomic uint64_t pushes, failures, expired, deleted;
    _Atomic uint64_t shape_hits, shape_misses; /* repeated pushes recognised / not */
};

struct push_pending {
    char *key;
    uint64_t hash;
    labels_t grouping;
    push_mode_t mode;
    push_family_t **fams; /* sorted by name */
    size_t nfams;
    push_batch_t *batch;
    int64_t now_ms;
    arena_t *arena;         /* the request's: the pending push and its samples live there */
    push_sample_t *samples; /* what the push stores (staleness markers are added by settle) */
    size_t nsamples, samples_cap;
    push_ref_t *refs; /* nsamples refs in the batch, sliced among fams (family->refs) */
    push_registry_t *reg;
    /* Shape cache: dest (one per body sample) is recorded by build; shape is given by the caller
     * (push_registry_pending_take_shape) and installed by commit; a repeated push carries the
     * cache it matched (fast) and keeps it. */
    push_dest_t *dest;
    size_t ndest;
    push_shape_t *shape;
    bool shape_om;
    push_cache_t *fast;
};

struct push_fast {
    push_cache_t *cache; /* one ref held until push_registry_fast_release */
    char *key;
    uint64_t hash;
    double *values;
};

static uint64_t push_hash_str(const char *s)
{
    return XXH3_64bits(s, strlen(s));
}

/* ---- type index ------------------------------------------------------------------------------ */

static bool type_name_eq(uint64_t val, const void *name)
{
    return strcmp(((const push_type_t *)(uintptr_t)val)->name, name) == 0;
}

static push_type_t *type_find(push_registry_t *r, const char *name, uint64_t h)
{
    const uint64_t *v = hashmap_find(&r->types, h, type_name_eq, name);
    return v ? (push_type_t *)(uintptr_t)*v : NULL;
}

static void type_ref(push_registry_t *r, const char *name, expfmt_type_t type)
{
    uint64_t h = push_hash_str(name);
    push_type_t *t = type_find(r, name, h);
    if (t) {
        assert(t->groups == 0 || t->type == type);
        t->type = type;
        t->groups++;
        return;
    }
    t = calloc(1, sizeof(*t));
    if (!t || !(t->name = strdup(name)) || hashmap_add(&r->types, h, (uintptr_t)t) < 0)
        abort();
    t->hash = h;
    t->type = type;
    t->groups = 1;
}

static void type_unref(push_registry_t *r, const char *name)
{
    uint64_t h = push_hash_str(name);
    push_type_t *t = type_find(r, name, h);
    assert(t && t->groups > 0 && "type_unref of an unknown name");
    if (t && --t->groups == 0) {
        hashmap_del_pair(&r->types, h, (uintptr_t)t);
        free(t->name);
        free(t);
    }
}

/* ---- groups ------------------------------------------------------------------------------------ */

/* Canonical key of a sorted grouping label set (arena a). */
static char *group_key(const labels_t *g, arena_t *a)
{
    size_t len = 1;
    for (size_t i = 0; i < g->n; i++)
        len += strlen(g->v[i].name) + strlen(g->v[i].value) + 2;
    char *k = arena_alloc(a, len), *p = k;
    for (size_t i = 0; i < g->n; i++) {
        size_t nl = strlen(g->v[i].name), vl = strlen(g->v[i].value);
        memcpy(p, g->v[i].name, nl);
        p += nl;
        *p++ = '\xff';
        memcpy(p, g->v[i].value, vl);
        p += vl;
        *p++ = '\xfe';
    }
    *p = 0;
    return k;
}

static push_group_t *group_find(push_registry_t *r, const char *key, uint64_t h)
{
    if (!r->gcap)
        return NULL;
    for (push_group_t *g = r->gtab[h & (r->gcap - 1)]; g; g = g->next)
        if (g->hash == h && strcmp(g->key, key) == 0)
            return g;
    return NULL;
}

static void group_grow(push_registry_t *r)
{
    size_t ncap = r->gcap ? r->gcap * 2 : 64;
    push_group_t **nt = calloc(ncap, sizeof(*nt));
    if (!nt)
        abort();
    for (size_t i = 0; i < r->gcap; i++)
        for (push_group_t *g = r->gtab[i], *n; g; g = n) {
            n = g->next;
            g->next = nt[g->hash & (ncap - 1)];
            nt[g->hash & (ncap - 1)] = g;
        }
    free(r->gtab);
    r->gtab = nt;
    r->gcap = ncap;
}

static push_group_t *group_create(push_registry_t *r, const labels_t *grouping, const char *key, uint64_t h)
{
    if ((r->ngroups + 1) * 2 > r->gcap)
        group_grow(r);
    push_group_t *g = calloc(1, sizeof(*g));
    if (!g)
        abort();
    g->strings = malloc(strlen(key) + 1 + labels_strings_size(grouping));
    g->grouping.v = calloc(grouping->n ? grouping->n : 1, sizeof(label_t));
    if (!g->strings || !g->grouping.v)
        abort();
    char *p = g->strings;
    g->key = p;
    memcpy(p, key, strlen(key) + 1);
    p += strlen(key) + 1;
    labels_pack(grouping, g->grouping.v, p);
    g->grouping.n = grouping->n;
    g->hash = h;
    g->next = r->gtab[h & (r->gcap - 1)];
    r->gtab[h & (r->gcap - 1)] = g;
    r->ngroups++;
    return g;
}

static void batch_free(push_batch_t *b)
{
    for (push_blk_t *k = b->blks, *n; k; k = n) {
        n = k->next;
        free(k);
    }
    free(b->mem);
    free(b);
}

static void batch_unref(push_batch_t *b)
{
    if (b && --b->refs == 0) {
        push_batch_t *base = b->base;
        batch_free(b);
        batch_unref(base);
    }
}

/* n bytes (16-byte aligned) in base b; aborts on OOM, like arena_alloc. */
static void *batch_alloc(push_batch_t *b, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    push_blk_t *k = b->blks;
    if (!k || k->cap - k->used < n) {
        size_t cap = n > BLK_BYTES ? n : BLK_BYTES;
        push_blk_t *nk = malloc(sizeof(*nk) + cap);
        if (!nk)
            abort();
        nk->used = 0;
        nk->cap = cap;
        if (k && n > BLK_BYTES) { /* a big one behind the current block, which keeps filling */
            nk->next = k->next;
            k->next = nk;
            nk->used = n;
            return nk->data;
        }
        nk->next = k;
        b->blks = k = nk;
    }
    void *p = k->data + k->used;
    k->used += n;
    return p;
}

static void *batch_memdup(push_batch_t *b, const void *p, size_t n)
{
    void *c = batch_alloc(b, n);
    memcpy(c, p, n);
    return c;
}

static char *batch_strndup(push_batch_t *b, const char *s, size_t n)
{
    char *c = batch_alloc(b, n + 1);
    memcpy(c, s, n);
    c[n] = 0;
    return c;
}

static void cache_unref(push_cache_t *c)
{
    if (c && --c->refs == 0) {
        push_shape_free(c->shape);
        free(c->dest);
        free(c);
    }
}

static size_t pack_size(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static void *pack_take(char **cur, size_t n)
{
    void *p = *cur;
    *cur += pack_size(n);
    return p;
}

/* Copies families (their metrics and values; names, label sets and bounds stay shared) into a
 * new batch of one exact-size block, with room for nseries refs: every family's slice of them,
 * copied from the originals when copy_refs, else zero. out[i] gets the copy of fams[i] (out may
 * be fams). The caller sets the batch's base (and holds a ref on it for it). NULL on OOM.
 * Exact size, not an arena: its doubling blocks would leave up to half of every group's
 * families unused, and a group holds one such block for as long as it lives. */
static push_batch_t *batch_pack(push_family_t *const *fams, size_t nfams, size_t nseries, bool copy_refs,
                                push_family_t **out)
{
    size_t bytes = pack_size((nseries ? nseries : 1) * sizeof(push_ref_t));
    for (size_t i = 0; i < nfams; i++) {
        const push_family_t *of = fams[i];
        bytes += pack_size(sizeof(push_family_t)) + pack_size((of->n ? of->n : 1) * sizeof(push_metric_t));
        for (size_t m = 0; m < of->n; m++)
            if (of->metrics[m].x)
                bytes += pack_size(sizeof(push_mx_t)) + pack_size(of->metrics[m].nq * sizeof(double));
    }
    push_batch_t *nb = calloc(1, sizeof(*nb));
    char *cur = nb ? malloc(bytes) : NULL;
    if (!cur) {
        free(nb);
        return NULL;
    }
    nb->mem = cur;
    nb->mem_bytes = bytes;
    nb->srefs = pack_take(&cur, (nseries ? nseries : 1) * sizeof(push_ref_t));
    size_t off = 0;
    for (size_t i = 0; i < nfams; i++) {
        const push_family_t *of = fams[i];
        push_family_t *nf = pack_take(&cur, sizeof(*nf));
        *nf = *of;
        nf->batch = nb;
        nf->metrics = pack_take(&cur, (of->n ? of->n : 1) * sizeof(push_metric_t));
        memcpy(nf->metrics, of->metrics, of->n * sizeof(push_metric_t));
        for (size_t m = 0; m < of->n; m++)
            if (of->metrics[m].x) {
                /* sum, count and values change from push to push; bounds and their text stay */
                push_mx_t *x = nf->metrics[m].x = pack_take(&cur, sizeof(push_mx_t));
                *x = *of->metrics[m].x;
                if (of->metrics[m].nq) {
                    x->qv = pack_take(&cur, of->metrics[m].nq * sizeof(double));
                    memcpy(x->qv, of->metrics[m].x->qv, of->metrics[m].nq * sizeof(double));
                }
            }
        assert(off + of->nseries <= (nseries ? nseries : 1));
        nf->refs = nb->srefs + off;
        if (copy_refs && of->refs)
            memcpy(nf->refs, of->refs, of->nseries * sizeof(push_ref_t));
        else
            memset(nf->refs, 0, of->nseries * sizeof(push_ref_t));
        off += of->nseries;
        out[i] = nf;
    }
    assert(cur <= (char *)nb->mem + bytes);
    return nb;
}

static void family_release(push_registry_t *r, push_family_t *f)
{
    type_unref(r, f->name);
    batch_unref(f->batch);
}

static void group_unlink_free(push_registry_t *r, push_group_t *g)
{
    push_group_t **pp = &r->gtab[g->hash & (r->gcap - 1)];
    while (*pp != g)
        pp = &(*pp)->next;
    *pp = g->next;
    r->ngroups--;
    for (size_t i = 0; i < g->nfams; i++)
        family_release(r, g->fams[i]);
    cache_unref(g->cache);
    free(g->fams);
    free(g->grouping.v);
    free(g->strings);
    for (size_t i = 1; i < g->nbeat_jobs; i++)
        free((char *)g->beat_jobs[i]);
    free(g->beat_jobs);
    free(g);
}

static uint64_t group_shape(const push_group_t *g);

/* ---- heartbeats ------------------------------------------------------------------------------ */

enum { PUSH_BEAT_MAX_JOBS = 16 };

/* The job identities a group reports for: its job label, then the distinct job_name values of its
 * series (Flink's reporter labels job-scoped metrics with job_name; a session TaskManager carries
 * several). Walks every series: called only when the group's shape changed. */
static void group_beat_jobs(push_group_t *g)
{
    for (size_t i = 1; i < g->nbeat_jobs; i++)
        free((char *)g->beat_jobs[i]);
    free(g->beat_jobs);
    g->beat_jobs = calloc(PUSH_BEAT_MAX_JOBS, sizeof(*g->beat_jobs));
    if (!g->beat_jobs)
        abort();
    size_t n = 0;
    const char *job = labels_get(&g->grouping, "job");
    g->beat_jobs[n++] = job ? job : "";
    for (size_t f = 0; f < g->nfams && n < PUSH_BEAT_MAX_JOBS; f++)
        for (size_t m = 0; m < g->fams[f]->n && n < PUSH_BEAT_MAX_JOBS; m++) {
            const push_metric_t *pm = &g->fams[f]->metrics[m];
            const char *jn = NULL;
            for (uint32_t l = 0; l < pm->nlabels && !jn; l++)
                if (strcmp(pm->labels[l].name, "job_name") == 0)
                    jn = pm->labels[l].value;
            bool seen = !jn || !jn[0];
            for (size_t k = 0; k < n && !seen; k++)
                seen = strcmp(g->beat_jobs[k], jn) == 0;
            if (!seen && !(g->beat_jobs[n++] = strdup(jn)))
                abort();
        }
    g->nbeat_jobs = n;
}

/* shape: the group's current group_shape (the commit has it from delta_commit). */
static void group_beat(push_registry_t *r, push_group_t *g, int64_t now_ms, bool gone, uint64_t shape)
{
    if (!r->opt.on_beat)
        return;
    push_beat_t b = {.key = g->key, .hash = g->hash, .grouping = &g->grouping, .now_ms = now_ms, .gone = gone};
    if (!gone) {
        if (!g->beat_jobs || shape != g->beat_shape) {
            group_beat_jobs(g);
            g->beat_shape = shape;
        }
        b.jobs = g->beat_jobs;
        b.njobs = g->nbeat_jobs;
    }
    r->opt.on_beat(r->opt.beat_ud, &b);
}

/* The family named `name` in fams[0..n), sorted by name; NULL if none. */
static push_family_t *fams_find(push_family_t *const *fams, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(fams[mid]->name, name);
        if (c == 0)
            return fams[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static push_family_t *group_family(const push_group_t *g, const char *name)
{
    return fams_find(g->fams, g->nfams, name);
}

/* ---- building families from a body ----------------------------------------------------------- */

/* Interning within one push: identical strings (job names, hosts, operator names) are stored once,
 * and so are identical label sets. A Flink TaskManager's push has ~860 metrics but ~50 distinct
 * label sets (every operator metric of one subtask carries the same ~13 labels), so a metric's
 * labels are mostly a pointer to a set another metric already stored: ~200 bytes saved per
 * metric. Sets are immutable once stored and live in the batch, like the strings. */
typedef struct {
    const char **slot;
    size_t cap, n;
    arena_t *a; /* where new strings and sets go: a, or (a NULL) the base b */
    push_batch_t *b;
    label_t **sets; /* open addressing; a set's length is stored in the word before it */
    size_t scap, sn;
} push_strtab_t;

static void strtab_free(push_strtab_t *t)
{
    free(t->slot);
    free(t->sets);
    t->slot = NULL;
    t->sets = NULL;
    t->cap = t->n = t->scap = t->sn = 0;
}

static const char *strtab_intern(push_strtab_t *t, const char *s)
{
    if ((t->n + 1) * 2 > t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 1024;
        const char **ns = calloc(ncap, sizeof(*ns));
        if (!ns)
            abort();
        for (size_t i = 0; i < t->cap; i++)
            if (t->slot[i]) {
                size_t j = XXH3_64bits(t->slot[i], strlen(t->slot[i])) & (ncap - 1);
                while (ns[j])
                    j = (j + 1) & (ncap - 1);
                ns[j] = t->slot[i];
            }
        free(t->slot);
        t->slot = ns;
        t->cap = ncap;
    }
    size_t len = strlen(s);
    size_t j = XXH3_64bits(s, len) & (t->cap - 1);
    while (t->slot[j]) {
        if (strcmp(t->slot[j], s) == 0)
            return t->slot[j];
        j = (j + 1) & (t->cap - 1);
    }
    const char *c = t->a ? arena_strndup(t->a, s, len) : batch_strndup(t->b, s, len);
    t->slot[j] = c;
    t->n++;
    return c;
}

/* The word before a set stored by labelset_intern: its length, and a hash of its strings (not
 * of their pointers, which another push's sets do not share), for family_shape: a family's
 * metrics share a few dozen sets, so a set's strings are hashed once, not once per metric. */
typedef struct {
    uint32_t n, pad;
    uint64_t content;
} labelset_head_t;
_Static_assert(sizeof(labelset_head_t) == sizeof(label_t), "a set's header keeps it 16-byte aligned");

static const labelset_head_t *labelset_head(const label_t *set)
{
    return (const labelset_head_t *)(const void *)(set - 1);
}

/* Number of labels of a set stored by labelset_intern. */
static uint32_t labelset_len(const label_t *set)
{
    return labelset_head(set)->n;
}

static uint64_t labelset_content_hash(const label_t *ls, uint32_t n)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t l = 0; l < n; l++) {
        XXH3_64bits_update(&st, ls[l].name, strlen(ls[l].name) + 1);
        XXH3_64bits_update(&st, ls[l].value, strlen(ls[l].value) + 1);
    }
    return XXH3_64bits_digest(&st);
}

static uint64_t labelset_hash(const label_t *ls, uint32_t n)
{
    return XXH3_64bits(ls, n * sizeof(label_t));
}

/* The batch's copy of label set ls (n labels, strings interned in t: compared by pointer). */
static label_t *labelset_intern(push_strtab_t *t, const label_t *ls, uint32_t n)
{
    if ((t->sn + 1) * 2 > t->scap) {
        size_t ncap = t->scap ? t->scap * 2 : 64;
        label_t **ns = calloc(ncap, sizeof(*ns));
        if (!ns)
            abort();
        for (size_t i = 0; i < t->scap; i++)
            if (t->sets[i]) {
                size_t j = labelset_hash(t->sets[i], labelset_len(t->sets[i])) & (ncap - 1);
                while (ns[j])
                    j = (j + 1) & (ncap - 1);
                ns[j] = t->sets[i];
            }
        free(t->sets);
        t->sets = ns;
        t->scap = ncap;
    }
    size_t j = labelset_hash(ls, n) & (t->scap - 1);
    for (; t->sets[j]; j = (j + 1) & (t->scap - 1)) {
        const label_t *c = t->sets[j];
        if (labelset_len(c) == n && memcmp(c, ls, n * sizeof(label_t)) == 0)
            return t->sets[j];
    }
    /* One label_t-sized header keeps the set itself 16-byte aligned. */
    label_t *c = t->a ? arena_alloc(t->a, (n + 1) * sizeof(label_t)) : batch_alloc(t->b, (n + 1) * sizeof(label_t));
    labelset_head_t head = {.n = n, .content = labelset_content_hash(ls, n)};
    memcpy(c, &head, sizeof(head));
    c++;
    memcpy(c, ls, n * sizeof(label_t));
    t->sets[j] = c;
    t->sn++;
    return c;
}

static int label_cmp_name(const void *a, const void *b)
{
    return strcmp(((const label_t *)a)->name, ((const label_t *)b)->name);
}

/* What the previous sample's labels were, for the next one: neighbouring samples mostly repeat
 * their labels at the same positions (every metric of an operator's subtask carries the same
 * task, host and job strings), and a string equal to its neighbour's takes the neighbour's
 * interned copy without hashing it again; a set whose names are the neighbour's, in the same
 * order, is sorted as the neighbour's was, without comparing them again. A body name only gets
 * into pos when the grouping did not override it. */
#define PUSH_NEIGH 32
typedef struct {
    struct {
        const char *raw[2]; /* name, value as the body has them */
        const char *in[2];  /* and interned */
    } pos[PUSH_NEIGH];
    uint32_t n;                    /* labels in the previous set (0: none, or too many to keep) */
    const char *names[PUSH_NEIGH]; /* its interned names before sorting */
    uint8_t perm[PUSH_NEIGH];      /* sorted position k held names[perm[k]] */
} push_neigh_t;

/* The interned copy of str when it equals the neighbour's string at position i (NULL if not). */
static const char *neigh_hit(const push_neigh_t *nb, uint32_t i, int part, const char *str)
{
    if (i < PUSH_NEIGH && nb->pos[i].raw[part] && strcmp(nb->pos[i].raw[part], str) == 0)
        return nb->pos[i].in[part];
    return NULL;
}

/* Interns str (not a hit) and keeps it as position i's string for the next sample. */
static const char *neigh_intern(push_strtab_t *st, push_neigh_t *nb, uint32_t i, int part, const char *str)
{
    const char *in = strtab_intern(st, str);
    if (i < PUSH_NEIGH) {
        nb->pos[i].raw[part] = str;
        nb->pos[i].in[part] = in;
    }
    return in;
}

/* Sorts ls[0..n) by name, as the neighbour's set was sorted when the names are the same. */
static void neigh_sort(push_neigh_t *nb, label_t *ls, uint32_t n)
{
    if (n <= PUSH_NEIGH && n == nb->n) {
        uint32_t i = 0;
        while (i < n && ls[i].name == nb->names[i]) /* interned: pointer equality */
            i++;
        if (i == n) {
            label_t tmp[PUSH_NEIGH];
            memcpy(tmp, ls, n * sizeof(label_t));
            for (uint32_t k = 0; k < n; k++)
                ls[k] = tmp[nb->perm[k]];
            return;
        }
    }
    /* Insertion sort: a dozen labels, the grouping's first and the body's mostly in order
     * already; qsort's merge sort cost more than the rest of this function (round 1 of the push
     * bench sorts 256k of these sets). Names are unique here (the parsers refuse duplicates,
     * the grouping's replace the body's), so any correct sort gives the same order. */
    bool keep = n <= PUSH_NEIGH;
    nb->n = keep ? n : 0;
    for (uint32_t i = 0; keep && i < n; i++) {
        nb->names[i] = ls[i].name;
        nb->perm[i] = (uint8_t)i;
    }
    for (uint32_t i = 1; i < n; i++) {
        label_t x = ls[i];
        uint8_t xp = keep ? nb->perm[i] : 0;
        uint32_t j = i;
        while (j > 0 && strcmp(ls[j - 1].name, x.name) > 0) {
            ls[j] = ls[j - 1];
            if (keep)
                nb->perm[j] = nb->perm[j - 1];
            j--;
        }
        ls[j] = x;
        if (keep)
            nb->perm[j] = xp;
    }
}

/* The labels a sample is exposed with (without quantile/le): body labels overridden by grouping
 * labels, plus instance="" when absent. Sorted, in ls (room for s->nlabels + grouping->n + 1);
 * strings interned into the batch. The grouping's strings come interned already (gi, one
 * interning per push instead of one per sample), with instance (interned "instance" and ""). */
static void push_metric_labels(const expfmt_sample_t *s, const labels_t *gi, const label_t *instance, push_strtab_t *st,
                               push_neigh_t *nb, label_t *ls, uint32_t *out_n)
{
    uint32_t nbody = s->nlabels;
    if (s->kind == EXPFMT_KIND_QUANTILE || s->kind == EXPFMT_KIND_BUCKET)
        nbody--; /* the parser puts quantile/le last */
    uint32_t n = 0;
    bool has_instance = false;
    for (size_t i = 0; i < gi->n; i++) {
        ls[n] = gi->v[i];
        has_instance |= gi->v[i].name == instance->name;
        n++;
    }
    for (uint32_t i = 0; i < nbody; i++) {
        const char *name = s->labels[i].name, *value = s->labels[i].value;
        if (!(ls[n].name = neigh_hit(nb, i, 0, name))) {
            if (labels_get(gi, name))
                continue; /* the path wins */
            ls[n].name = neigh_intern(st, nb, i, 0, name);
        }
        if (!(ls[n].value = neigh_hit(nb, i, 1, value)))
            ls[n].value = neigh_intern(st, nb, i, 1, value);
        has_instance |= ls[n].name == instance->name;
        n++;
    }
    if (!has_instance)
        ls[n++] = *instance;
    neigh_sort(nb, ls, n);
    *out_n = n;
}

static bool labels_same(const label_t *a, uint32_t na, const label_t *b, uint32_t nb)
{
    if (na != nb)
        return false;
    for (uint32_t i = 0; i < na; i++)
        if (a[i].name != b[i].name || a[i].value != b[i].value) /* interned: pointer equality */
            return false;
    return true;
}

/* Go's MetricSorter: label values in order, then (ours) label names for sets of different shape. */
static int metric_cmp(const void *pa, const void *pb)
{
    const push_metric_t *a = pa, *b = pb;
    uint32_t n = a->nlabels < b->nlabels ? a->nlabels : b->nlabels;
    for (uint32_t i = 0; i < n; i++) {
        int c = strcmp(a->labels[i].value, b->labels[i].value);
        if (c)
            return c;
    }
    for (uint32_t i = 0; i < n; i++) {
        int c = strcmp(a->labels[i].name, b->labels[i].name);
        if (c)
            return c;
    }
    return (a->nlabels > b->nlabels) - (a->nlabels < b->nlabels);
}

/* Hash of a family's structure: name, type, help, every metric's labels and quantile/bucket
 * bounds — everything but the values. */
static uint64_t family_shape(const push_family_t *f)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, f->name, strlen(f->name) + 1);
    uint8_t t = (uint8_t)f->type;
    XXH3_64bits_update(&st, &t, 1);
    if (f->help)
        XXH3_64bits_update(&st, f->help, strlen(f->help) + 1);
    for (size_t i = 0; i < f->n; i++) {
        const push_metric_t *m = &f->metrics[i];
        assert(labelset_len(m->labels) == m->nlabels);
        uint64_t content = labelset_head(m->labels)->content;
        XXH3_64bits_update(&st, &content, sizeof(content));
        XXH3_64bits_update(&st, &m->nq, sizeof(m->nq));
        if (m->nq)
            XXH3_64bits_update(&st, m->x->qb, m->nq * sizeof(double));
    }
    return XXH3_64bits_digest(&st);
}

static uint64_t group_shape(const push_group_t *g)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ g->nfams;
    for (size_t i = 0; i < g->nfams; i++)
        h = (h ^ g->fams[i]->shape) * 0x100000001B3ULL + (h >> 29);
    return h;
}

static int metric_idx_cmp(const void *pa, const void *pb, void *ud)
{
    const push_metric_t *ms = ud;
    return metric_cmp(&ms[*(const uint32_t *)pa], &ms[*(const uint32_t *)pb]);
}

/* Builds one family's metrics from the body's component samples; dest[i] gets where sample i's
 * value went (metric and part; the caller fills in the family). */
static push_family_t *push_build_family(const expfmt_family_t *bf, const labels_t *gi, const label_t *instance,
                                        push_neigh_t *nb, push_strtab_t *st, push_batch_t *batch, int64_t now_ms,
                                        push_dest_t *dest, arena_t *tmp)
{
    /* What the family's repeats share (names, label sets, bounds) goes to the base; the family,
     * its metrics and values to tmp, copied to their own block by batch_pack. */
    push_family_t *f = arena_calloc(tmp, 1, sizeof(*f));
    f->name = strtab_intern(st, bf->name);
    f->help = bf->help ? batch_strndup(batch, bf->help, strlen(bf->help)) : NULL;
    f->type = bf->type;
    f->push_ms = now_ms;
    f->batch = batch;
    /* Metrics are gathered in temporary memory and copied to the batch at their exact size once
     * sorted: a metric's label set is stored once, not once per quantile/bucket sample, and its
     * quantiles/buckets grow in place instead of being copied into the arena at every step. */
    size_t ns1 = bf->nsamples ? bf->nsamples : 1;
    push_metric_t *ms = calloc(ns1, sizeof(*ms));
    uint32_t *qcap = calloc(ns1, sizeof(*qcap));
    size_t lcap = gi->n + 17;
    label_t *scratch = malloc(lcap * sizeof(*scratch));
    if (!ms || !qcap || !scratch)
        abort();
    size_t n = 0;
    bool complex = bf->type == EXPFMT_SUMMARY || bf->type == EXPFMT_HISTOGRAM || bf->type == EXPFMT_GAUGE_HISTOGRAM;
    size_t mcap = 16;
    while (complex && mcap < bf->nsamples * 2)
        mcap *= 2;
    push_metric_t **mtab = complex ? calloc(mcap, sizeof(*mtab)) : NULL;
    if (complex && !mtab)
        abort();
    for (size_t i = 0; i < bf->nsamples; i++) {
        const expfmt_sample_t *s = &bf->samples[i];
        uint32_t nl;
        if (s->nlabels + gi->n + 1 > lcap) {
            lcap = s->nlabels + gi->n + 1;
            label_t *g = realloc(scratch, lcap * sizeof(*scratch));
            if (!g)
                abort();
            scratch = g;
        }
        push_metric_labels(s, gi, instance, st, nb, scratch, &nl);
        label_t *ls = scratch;
        push_metric_t *m = NULL;
        if (complex) {
            /* Component samples of one metric share its (interned) label set. Bodies usually keep
             * them together, so check the last metric first, then a hash of the label pointers. */
            if (n && labels_same(ms[n - 1].labels, ms[n - 1].nlabels, ls, nl)) {
                m = &ms[n - 1];
            } else {
                uint64_t h = XXH3_64bits(ls, nl * sizeof(label_t));
                size_t j = h & (mcap - 1);
                for (; mtab[j]; j = (j + 1) & (mcap - 1))
                    if (labels_same(mtab[j]->labels, mtab[j]->nlabels, ls, nl)) {
                        m = mtab[j];
                        break;
                    }
                if (!m) {
                    m = &ms[n++];
                    m->labels = labelset_intern(st, ls, nl);
                    m->nlabels = nl;
                    mtab[j] = m;
                }
            }
        }
        if (!m) {
            m = &ms[n++];
            m->labels = labelset_intern(st, ls, nl);
            m->nlabels = nl;
        }
        dest[i] = (push_dest_t){0, (uint32_t)(m - ms), PART_NONE};
        bool part = s->kind == EXPFMT_KIND_QUANTILE || s->kind == EXPFMT_KIND_BUCKET || s->kind == EXPFMT_KIND_SUM ||
                    s->kind == EXPFMT_KIND_COUNT;
        if (part && !m->x)
            m->x = arena_calloc(tmp, 1, sizeof(*m->x));
        switch (s->kind) {
        case EXPFMT_KIND_VALUE: m->value = s->value, dest[i].part = PART_VALUE; break;
        case EXPFMT_KIND_SUM: m->x->sum = s->value, dest[i].part = PART_SUM; break;
        case EXPFMT_KIND_COUNT: m->x->count = s->value, dest[i].part = PART_COUNT; break;
        case EXPFMT_KIND_QUANTILE:
        case EXPFMT_KIND_BUCKET: {
            push_mx_t *x = m->x;
            dest[i].part = (int32_t)m->nq;
            const char *bs = s->labels[s->nlabels - 1].value;
            double bound = strtod(bs, NULL);
            uint32_t *cap = &qcap[m - ms];
            if (m->nq == *cap) {
                *cap = *cap ? *cap * 2 : 8;
                x->qb = realloc(x->qb, *cap * sizeof(double));
                x->qv = realloc(x->qv, *cap * sizeof(double));
                x->qs = realloc(x->qs, *cap * sizeof(char *));
                if (!x->qb || !x->qv || !x->qs)
                    abort();
            }
            x->qb[m->nq] = bound;
            x->qv[m->nq] = s->value;
            x->qs[m->nq] = strtab_intern(st, bs);
            m->nq++;
            break;
        }
        default: break; /* OpenMetrics _created: not kept by a Pushgateway */
        }
    }
    free(mtab);
    /* Sort through an index, to tell dest where each metric went. */
    uint32_t *perm = malloc((n ? n : 1) * 2 * sizeof(uint32_t)), *inv = perm + (n ? n : 1);
    push_metric_t *sorted = arena_alloc(tmp, (n ? n : 1) * sizeof(*sorted));
    if (!perm)
        abort();
    for (size_t i = 0; i < n; i++)
        perm[i] = (uint32_t)i;
    qsort_r(perm, n, sizeof(*perm), metric_idx_cmp, ms);
    for (size_t i = 0; i < n; i++) {
        push_metric_t *m = &sorted[i];
        *m = ms[perm[i]];
        inv[perm[i]] = (uint32_t)i;
        push_mx_t *x = m->x;
        if (x && m->nq) {
            double *qb = x->qb, *qv = x->qv;
            const char **qs = x->qs;
            x->qb = batch_memdup(batch, qb, m->nq * sizeof(double));
            x->qv = arena_memdup(tmp, qv, m->nq * sizeof(double));
            x->qs = batch_memdup(batch, qs, m->nq * sizeof(char *));
            free(qb);
            free(qv);
            free(qs);
        }
    }
    for (size_t i = 0; i < bf->nsamples; i++)
        dest[i].metric = inv[dest[i].metric];
    free(perm);
    free(ms);
    free(qcap);
    free(scratch);
    ms = sorted;
    f->metrics = ms;
    f->n = n;
    f->shape = family_shape(f);
    return f;
}

/* ---- series of a family (what storage sees) ----------------------------------------------------- */

/* extra_s: the quantile/le value as text when known (else NULL: format extra). */
typedef void (*push_series_fn)(void *ud, const char *name, const push_metric_t *m, const char *extra_name, double extra,
                               const char *extra_s, double v);

/* Calls fn for every component series of f: (series name, metric, quantile/le label or NULL, its
 * value as a number, sample value). Summaries without _sum/_count in the body still expose 0 in
 * the text and JSON outputs (as the Pushgateway does) but storage gets the same components. */
static void family_each_series(const push_family_t *f, push_series_fn fn, void *ud, arena_t *a)
{
    size_t nl = strlen(f->name);
    char *sum = NULL, *count = NULL, *bucket = NULL;
    if (f->type == EXPFMT_SUMMARY || f->type == EXPFMT_HISTOGRAM || f->type == EXPFMT_GAUGE_HISTOGRAM) {
        bool gh = f->type == EXPFMT_GAUGE_HISTOGRAM;
        sum = arena_sprintf(a, "%s%s", f->name, gh ? "_gsum" : "_sum");
        count = arena_sprintf(a, "%s%s", f->name, gh ? "_gcount" : "_count");
        bucket = arena_sprintf(a, "%s_bucket", f->name);
    }
    (void)nl;
    for (size_t i = 0; i < f->n; i++) {
        const push_metric_t *m = &f->metrics[i];
        switch (f->type) {
        case EXPFMT_SUMMARY:
            for (uint32_t q = 0; q < m->nq; q++)
                fn(ud, f->name, m, "quantile", m->x->qb[q], m->x->qs ? m->x->qs[q] : NULL, m->x->qv[q]);
            fn(ud, sum, m, NULL, 0, NULL, metric_sum(m));
            fn(ud, count, m, NULL, 0, NULL, metric_count(m));
            break;
        case EXPFMT_HISTOGRAM:
        case EXPFMT_GAUGE_HISTOGRAM: {
            bool has_inf = false;
            for (uint32_t q = 0; q < m->nq; q++) {
                fn(ud, bucket, m, "le", m->x->qb[q], m->x->qs ? m->x->qs[q] : NULL, m->x->qv[q]);
                has_inf |= isinf(m->x->qb[q]) && m->x->qb[q] > 0;
            }
            if (!has_inf)
                fn(ud, bucket, m, "le", INFINITY, "+Inf", metric_count(m));
            fn(ud, sum, m, NULL, 0, NULL, metric_sum(m));
            fn(ud, count, m, NULL, 0, NULL, metric_count(m));
            break;
        }
        default: fn(ud, f->name, m, NULL, 0, NULL, m->value); break;
        }
    }
}

typedef struct {
    arena_t *a;
    push_sample_t *v;
    size_t n, cap;
    double stale_value; /* when stale: every value becomes the stale marker */
    bool stale;
    /* PUT/POST: hashes of the series the push keeps, to find the ones it drops */
    uint64_t *keep;
    size_t keep_cap;
    bool collect_keep;
    bool filter_kept;
} push_collect_t;

static char *float_label(arena_t *a, double v)
{
    buf_t b = BUF_INIT;
    buf_put_float(&b, v);
    char *s = arena_strndup(a, b.data, b.len);
    buf_free(&b);
    return s;
}

static uint64_t series_hash(const char *name, const push_metric_t *m, const char *extra_name, const char *extra)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, name, strlen(name) + 1);
    for (uint32_t i = 0; i < m->nlabels; i++) {
        XXH3_64bits_update(&st, m->labels[i].name, strlen(m->labels[i].name) + 1);
        XXH3_64bits_update(&st, m->labels[i].value, strlen(m->labels[i].value) + 1);
    }
    if (extra_name) {
        XXH3_64bits_update(&st, extra_name, strlen(extra_name) + 1);
        XXH3_64bits_update(&st, extra, strlen(extra) + 1);
    }
    return XXH3_64bits_digest(&st);
}

static void keep_add(push_collect_t *c, uint64_t h)
{
    if (h == 0)
        h = 1;
    size_t j = h & (c->keep_cap - 1);
    while (c->keep[j] && c->keep[j] != h)
        j = (j + 1) & (c->keep_cap - 1);
    c->keep[j] = h;
}

static bool keep_has(const push_collect_t *c, uint64_t h)
{
    if (!c->keep_cap)
        return false;
    if (h == 0)
        h = 1;
    for (size_t j = h & (c->keep_cap - 1); c->keep[j]; j = (j + 1) & (c->keep_cap - 1))
        if (c->keep[j] == h)
            return true;
    return false;
}

static void collect_series(void *ud, const char *name, const push_metric_t *m, const char *extra_name, double extra,
                           const char *extra_str, double v)
{
    push_collect_t *c = ud;
    const char *extra_s = extra_name ? (extra_str ? extra_str : float_label(c->a, extra)) : NULL;
    if (c->stale && extra_s && extra_s == extra_str)
        extra_s = arena_strdup(c->a, extra_s); /* outlives the family, like the labels below */
    if (c->collect_keep || c->filter_kept) {
        uint64_t h = series_hash(name, m, extra_name, extra_s);
        if (c->collect_keep)
            keep_add(c, h);
        if (c->filter_kept && keep_has(c, h))
            return;
    }
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 256;
        push_sample_t *nv = arena_alloc(c->a, ncap * sizeof(*nv));
        if (c->n)
            memcpy(nv, c->v, c->n * sizeof(*nv));
        c->v = nv;
        c->cap = ncap;
    }
    uint32_t nl = m->nlabels + 1 + (extra_name ? 1 : 0);
    label_t *ls = arena_alloc(c->a, nl * sizeof(label_t));
    uint32_t k = 0;
    /* Staleness markers outlive the families they come from (a deleted group is freed before
     * its markers are stored), so their strings are copied; a push's own samples point into
     * its batch, which lives on in the registry. m->labels are sorted by name: __name__ and the
     * quantile/le label are merged in at their places (sorting every series of every push was a
     * tenth of a repeated push's CPU). */
    label_t add[2] = {{LABEL_METRIC_NAME, c->stale ? arena_strdup(c->a, name) : name}, {extra_name, extra_s}};
    uint32_t nadd = extra_name ? 2 : 1, ai = 0;
    if (nadd == 2 && strcmp(add[1].name, add[0].name) < 0) {
        label_t t = add[0];
        add[0] = add[1];
        add[1] = t;
    }
    for (uint32_t i = 0; i < m->nlabels; i++) {
        if (!m->labels[i].value[0]) /* an empty value is the same as no label */
            continue;
        while (ai < nadd && strcmp(add[ai].name, m->labels[i].name) < 0)
            ls[k++] = add[ai++];
        ls[k++] = c->stale ? (label_t){arena_strdup(c->a, m->labels[i].name), arena_strdup(c->a, m->labels[i].value)}
                           : m->labels[i];
    }
    while (ai < nadd)
        ls[k++] = add[ai++];
    labels_t set = {ls, k}; /* sorted (storage still refuses a duplicate name) */
    c->v[c->n].labels = set;
    c->v[c->n].v = c->stale ? c->stale_value : v;
    c->n++;
}

static void ser_u64(buf_t *b, uint64_t v);
static void ser_labels(buf_t *out, const label_t *ls, size_t n);
static void delta_commit(buf_t *delta, push_group_t *g);

/* Only records the hash of each series (the keep set of a push, see push_registry_settle). */
static void collect_keep_only(void *ud, const char *name, const push_metric_t *m, const char *extra_name, double extra,
                              const char *extra_str, double v)
{
    push_collect_t *c = ud;
    (void)v;
    const char *extra_s = extra_name ? (extra_str ? extra_str : float_label(c->a, extra)) : NULL;
    keep_add(c, series_hash(name, m, extra_name, extra_s));
}

/* ---- prepare / commit ------------------------------------------------------------------------------ */

push_registry_t *push_registry_new(const push_options_t *opt)
{
    push_registry_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    hashmap_init(&r->types, NULL, HASHMAP_HASHED_KEYS);
    if (opt)
        r->opt = *opt;
    return r;
}

void push_registry_free(push_registry_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->gcap; i++)
        while (r->gtab[i])
            group_unlink_free(r, r->gtab[i]);
    free(r->gtab);
    size_t pos = 0;
    for (hashmap_slot_t *e; (e = hashmap_next(&r->types, &pos));) {
        push_type_t *t = (push_type_t *)(uintptr_t)e->val;
        free(t->name);
        free(t);
    }
    hashmap_free(&r->types);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static const char *push_type_upper(expfmt_type_t t)
{
    return expfmt_type_proto_name(t);
}

static const char push_err_prefix[] = "pushed metrics are invalid or inconsistent with existing metrics: ";

static int family_idx_cmp(const void *pa, const void *pb, void *ud)
{
    push_family_t *const *fs = ud;
    return strcmp(fs[*(const uint32_t *)pa]->name, fs[*(const uint32_t *)pb]->name);
}

int push_registry_build(push_registry_t *r, const labels_t *grouping_in, push_mode_t mode, const expfmt_result_t *body,
                        int64_t now_ms, arena_t *a, push_pending_t **pending, char *err, size_t errlen)
{
    /* Sorted copy of the grouping labels. */
    labels_t grouping = {arena_alloc(a, (grouping_in->n ? grouping_in->n : 1) * sizeof(label_t)), grouping_in->n};
    memcpy(grouping.v, grouping_in->v, grouping_in->n * sizeof(label_t));
    labels_sort(&grouping);

    for (size_t i = 0; i < body->nfamilies; i++)
        for (size_t j = 0; j < body->families[i].nsamples; j++)
            if (body->families[i].samples[j].has_timestamp) {
                snprintf(err, errlen, "%spushed metrics must not have timestamps", push_err_prefix);
                return PUSH_ERR_INVALID;
            }
    const char **ignore = arena_alloc(a, (grouping.n ? grouping.n : 1) * sizeof(char *));
    for (size_t i = 0; i < grouping.n; i++)
        ignore[i] = grouping.v[i].name;
    size_t df, d1, d2;
    char derr[1024];
    /* instance="" and no instance are one series here: the metric without one gets instance="" */
    int dup = expfmt_check_duplicates(body, ignore, grouping.n, "instance", a, &df, &d1, &d2, derr, sizeof(derr));
    if (dup != 0) {
        if (dup < 0)
            return PUSH_ERR_NOMEM;
        snprintf(err, errlen, "%s%s", push_err_prefix, derr);
        return PUSH_ERR_INVALID;
    }
    for (size_t i = 0; i < body->nfamilies; i++) {
        const char *n = body->families[i].name;
        if (strcmp(n, PUSH_TIME_NAME) == 0 || strcmp(n, PUSH_FAIL_NAME) == 0) {
            snprintf(err, errlen, "%spushed metric %s is reserved for the gateway's own bookkeeping", push_err_prefix,
                     n);
            return PUSH_ERR_INVALID;
        }
    }

    /* Build the families the group will hold. */
    push_batch_t *batch = calloc(1, sizeof(*batch));
    if (!batch)
        return PUSH_ERR_NOMEM;
    push_strtab_t st = {.b = batch};
    push_pending_t *p = arena_calloc(a, 1, sizeof(*p));
    p->key = group_key(&grouping, a);
    p->hash = push_hash_str(p->key);
    p->grouping = grouping;
    p->mode = mode;
    p->batch = batch;
    p->now_ms = now_ms;
    p->arena = a;
    p->reg = r;
    p->nfams = body->nfamilies;
    size_t nf1 = body->nfamilies ? body->nfamilies : 1;
    push_family_t **inbody = arena_alloc(a, nf1 * sizeof(push_family_t *));
    p->ndest = body->nsamples;
    p->dest = arena_alloc(a, (body->nsamples ? body->nsamples : 1) * sizeof(push_dest_t));
    labels_t gi = {arena_alloc(a, (grouping.n ? grouping.n : 1) * sizeof(label_t)), grouping.n};
    for (size_t i = 0; i < grouping.n; i++)
        gi.v[i] = (label_t){strtab_intern(&st, grouping.v[i].name), strtab_intern(&st, grouping.v[i].value)};
    const label_t instance = {strtab_intern(&st, "instance"), strtab_intern(&st, "")};
    push_neigh_t nb = {0}; /* shared by the families: their metrics share labels too */
    for (size_t i = 0, k = 0; i < body->nfamilies; k += body->families[i].nsamples, i++)
        inbody[i] = push_build_family(&body->families[i], &gi, &instance, &nb, &st, batch, now_ms, p->dest + k, a);
    batch->nsets = st.sn;
    strtab_free(&st);
    /* families sorted by name (bodies have unique names), through an index for dest */
    uint32_t *order = arena_alloc(a, nf1 * sizeof(uint32_t)), *rank = arena_alloc(a, nf1 * sizeof(uint32_t));
    for (size_t i = 0; i < p->nfams; i++)
        order[i] = (uint32_t)i;
    qsort_r(order, p->nfams, sizeof(*order), family_idx_cmp, inbody);
    p->fams = arena_alloc(a, nf1 * sizeof(push_family_t *));
    for (size_t i = 0; i < p->nfams; i++) {
        p->fams[i] = inbody[order[i]];
        rank[order[i]] = (uint32_t)i;
    }
    for (size_t i = 0, k = 0; i < body->nfamilies; i++)
        for (size_t j = 0; j < body->families[i].nsamples; j++)
            p->dest[k++].fam = rank[i];
    /* The samples to store. */
    push_collect_t c = {.a = a};
    for (size_t i = 0; i < p->nfams; i++) {
        size_t before = c.n;
        family_each_series(p->fams[i], collect_series, &c, a);
        p->fams[i]->nseries = c.n - before;
    }
    p->samples = c.v;
    p->nsamples = c.n;
    p->samples_cap = c.cap;
    /* The families move to a block of their own; each gets its slice of the refs, filled by
     * settle from the group's previous push. */
    push_batch_t *vb = batch_pack(p->fams, p->nfams, c.n, false, p->fams);
    if (!vb) {
        batch_free(batch);
        return PUSH_ERR_NOMEM;
    }
    vb->base = batch;
    batch->refs = 1; /* not yet visible to anyone: no lock needed */
    p->batch = vb;
    p->refs = vb->srefs;
    *pending = p;
    return PUSH_OK;
}

/* Would the change drop any series of g? Not when every family it replaces keeps its shape
 * (the steady state: a reporter pushing the same series every interval). */
static bool push_drops_series(const push_group_t *g, const push_pending_t *p)
{
    if (p->mode == PUSH_PUT && g->nfams != p->nfams)
        return true;
    for (size_t i = 0; i < g->nfams; i++) {
        const push_family_t *of = g->fams[i];
        const push_family_t *nf = NULL;
        for (size_t j = 0; j < p->nfams && !nf; j++)
            if (strcmp(p->fams[j]->name, of->name) == 0)
                nf = p->fams[j];
        if (!nf) {
            if (p->mode == PUSH_PUT)
                return true;
            continue;
        }
        if (nf->shape != of->shape)
            return true;
    }
    return false;
}

/* The type of family `name` once the push lands, when some group will hold it: the push's own
 * family, else another group's (a PUT replaces all of g's families; a POST those it names, and
 * those are the push's own). r->mu held. */
static bool settle_held_type(push_registry_t *r, const push_pending_t *p, const push_group_t *g, const char *name,
                             expfmt_type_t *type)
{
    const push_family_t *own = fams_find(p->fams, p->nfams, name);
    if (own) {
        *type = own->type;
        return true;
    }
    push_type_t *t = type_find(r, name, push_hash_str(name));
    if (!t || t->groups - (g && p->mode == PUSH_PUT && group_family(g, name) ? 1 : 0) == 0)
        return false;
    *type = t->type;
    return true;
}

/* What a Pushgateway refuses because Prometheus' client library will not gather it together
 * (its registry's suffix check): a family named like a summary's or histogram's _sum or _count,
 * or a histogram's _bucket, beside that summary or histogram, in any group. Checked from each
 * pushed family's side, against the push and the other groups. r->mu held. */
static int settle_check_suffixes(push_registry_t *r, const push_pending_t *p, const push_group_t *g, char *err,
                                 size_t errlen)
{
    static const char *const sufs[] = {"_count", "_sum", "_bucket"};
    for (size_t i = 0; i < p->nfams; i++) {
        const push_family_t *nf = p->fams[i];
        size_t len = strlen(nf->name);
        char *other = NULL; /* the name looked for: made only when there is one to look for */
        expfmt_type_t t;
        for (size_t k = 0; k < 3; k++) {
            size_t sl = strlen(sufs[k]);
            if (len <= sl || strcmp(nf->name + len - sl, sufs[k]) != 0)
                continue;
            other = other ? other : arena_alloc(p->arena, len + sizeof("_bucket"));
            memcpy(other, nf->name, len - sl);
            other[len - sl] = 0;
            if (settle_held_type(r, p, g, other, &t) && (t == EXPFMT_HISTOGRAM || (t == EXPFMT_SUMMARY && k != 2))) {
                snprintf(err, errlen,
                         "%scollected metric named \"%s\" collides with previously collected %s named \"%s\"",
                         push_err_prefix, nf->name, t == EXPFMT_HISTOGRAM ? "histogram" : "summary", other);
                return PUSH_ERR_INVALID;
            }
        }
        if (nf->type != EXPFMT_SUMMARY && nf->type != EXPFMT_HISTOGRAM)
            continue;
        other = other ? other : arena_alloc(p->arena, len + sizeof("_bucket"));
        for (size_t k = 0; k < (nf->type == EXPFMT_HISTOGRAM ? 3u : 2u); k++) {
            memcpy(other, nf->name, len);
            strcpy(other + len, sufs[k]);
            if (settle_held_type(r, p, g, other, &t)) {
                snprintf(err, errlen,
                         "%scollected %s named \"%s\" collides with previously collected metric named \"%s\"",
                         push_err_prefix, k == 2 ? "histogram" : "histogram or summary", nf->name, other);
                return PUSH_ERR_INVALID;
            }
        }
    }
    return PUSH_OK;
}

/* Whether a series of one grouping could be a series of the other: no label name they share
 * has different values (both sorted). Groups whose groupings differ in a shared name's value
 * (every TaskManager's own instance) can never hold the same series. */
static bool groupings_overlap(const labels_t *a, const labels_t *b)
{
    for (size_t i = 0, j = 0; i < a->n && j < b->n;) {
        int c = strcmp(a->v[i].name, b->v[j].name);
        if (c == 0 && strcmp(a->v[i].value, b->v[j].value) != 0)
            return false;
        i += c <= 0;
        j += c >= 0;
    }
    return true;
}

static uint64_t metric_key(const push_metric_t *m)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (uint32_t i = 0; i < m->nlabels; i++) {
        XXH3_64bits_update(&st, m->labels[i].name, strlen(m->labels[i].name) + 1);
        XXH3_64bits_update(&st, m->labels[i].value, strlen(m->labels[i].value) + 1);
    }
    return XXH3_64bits_digest(&st);
}

typedef struct {
    const push_family_t *f; /* the other group's family, whose metric index the map holds */
    const push_metric_t *m; /* the pushed metric */
} dup_probe_t;

static bool dup_probe_eq(uint64_t val, const void *ctx)
{
    const dup_probe_t *d = ctx;
    const push_metric_t *o = &d->f->metrics[val];
    if (o->nlabels != d->m->nlabels)
        return false;
    for (uint32_t i = 0; i < o->nlabels; i++)
        if (strcmp(o->labels[i].name, d->m->labels[i].name) != 0 ||
            strcmp(o->labels[i].value, d->m->labels[i].value) != 0)
            return false;
    return true;
}

/* No metric (family name and labels, grouping applied) may be one another group holds: the
 * Pushgateway refuses it as collected twice. Only groups whose grouping overlaps this one's are
 * looked at. r->mu held. */
static int settle_check_other_groups(push_registry_t *r, const push_pending_t *p, const push_group_t *g, char *err,
                                     size_t errlen)
{
    for (size_t b = 0; b < r->gcap; b++)
        for (const push_group_t *h = r->gtab[b]; h; h = h->next) {
            if (h == g || !groupings_overlap(&p->grouping, &h->grouping))
                continue;
            for (size_t i = 0; i < p->nfams; i++) {
                const push_family_t *pf = p->fams[i], *hf = group_family(h, pf->name);
                if (!hf || !hf->n || !pf->n)
                    continue;
                hashmap_t seen;
                hashmap_init(&seen, p->arena, HASHMAP_HASHED_KEYS);
                if (hashmap_reserve(&seen, hf->n) < 0) {
                    snprintf(err, errlen, "out of memory");
                    return PUSH_ERR_NOMEM;
                }
                for (size_t k = 0; k < hf->n; k++)
                    (void)hashmap_add(&seen, metric_key(&hf->metrics[k]), k); /* reserved: cannot fail */
                for (size_t k = 0; k < pf->n; k++) {
                    const push_metric_t *m = &pf->metrics[k];
                    dup_probe_t d = {hf, m};
                    if (!hashmap_find(&seen, metric_key(m), dup_probe_eq, &d))
                        continue;
                    char q[256];
                    expfmt_go_quote(q, sizeof(q), pf->name, strlen(pf->name));
                    int off = snprintf(err, errlen, "%scollected metric %s {", push_err_prefix, q);
                    for (uint32_t l = 0; l < m->nlabels && off >= 0 && (size_t)off < errlen; l++) {
                        expfmt_go_quote(q, sizeof(q), m->labels[l].value, strlen(m->labels[l].value));
                        off += snprintf(err + off, errlen - (size_t)off, "%s%s=%s", l ? "," : "", m->labels[l].name, q);
                    }
                    if (off >= 0 && (size_t)off < errlen)
                        snprintf(err + off, errlen - (size_t)off,
                                 "} was collected before with the same name and label values");
                    return PUSH_ERR_INVALID;
                }
            }
        }
    return PUSH_OK;
}

/* Types must agree with what other groups hold (this group's own families are replaced), no
 * family may collide with a summary's or histogram's suffixed names, and no metric may be one
 * another group holds. r->mu held; g is the pushed group (NULL: new). */
static int settle_check_types(push_registry_t *r, const push_pending_t *p, const push_group_t *g, char *err,
                              size_t errlen)
{
    for (size_t i = 0; i < p->nfams; i++) {
        const push_family_t *nf = p->fams[i];
        push_type_t *t = type_find(r, nf->name, push_hash_str(nf->name));
        if (!t || t->type == nf->type)
            continue;
        uint32_t others = t->groups - (g && group_family(g, nf->name) ? 1 : 0);
        if (others > 0) {
            snprintf(err, errlen, "%scollected metric \"%s\" of type %s is not a %s, the type it has in other groups",
                     push_err_prefix, nf->name, push_type_upper(nf->type), push_type_upper(t->type));
            return PUSH_ERR_INVALID;
        }
    }
    int rc = settle_check_suffixes(r, p, g, err, errlen);
    return rc == PUSH_OK ? settle_check_other_groups(r, p, g, err, errlen) : rc;
}

/* Series refs carried over from the families this push replaces with the same shape. r->mu held. */
static void settle_carry_refs(push_pending_t *p, const push_group_t *g)
{
    for (size_t i = 0; g && i < p->nfams; i++) {
        push_family_t *nf = p->fams[i];
        const push_family_t *of = group_family(g, nf->name);
        if (of && of->refs && of->shape == nf->shape && of->nseries == nf->nseries && of->type == nf->type)
            memcpy(nf->refs, of->refs, nf->nseries * sizeof(push_ref_t));
    }
}

int push_registry_presettle(push_registry_t *r, push_pending_t *p, push_effect_t *own)
{
    char err[8];
    pthread_mutex_lock(&r->mu);
    const push_group_t *g = group_find(r, p->key, p->hash);
    int rc = settle_check_types(r, p, g, err, sizeof(err));
    if (rc == PUSH_OK)
        settle_carry_refs(p, g);
    pthread_mutex_unlock(&r->mu);
    *own = (push_effect_t){.samples = p->samples, .n = p->nsamples, .t_ms = p->now_ms,
                           .refs = p->nsamples ? p->refs : NULL, .nrefs = p->nsamples};
    return rc;
}

int push_registry_settle(push_registry_t *r, push_pending_t *p, push_effect_t *effect, char *err, size_t errlen)
{
    arena_t *a = p->arena;
    push_collect_t c = {.a = a, .v = p->samples, .n = p->nsamples, .cap = p->samples_cap};
    pthread_mutex_lock(&r->mu);
    push_group_t *g = group_find(r, p->key, p->hash);
    if (settle_check_types(r, p, g, err, errlen) != PUSH_OK) {
        pthread_mutex_unlock(&r->mu);
        return PUSH_ERR_INVALID;
    }
    settle_carry_refs(p, g);
    /* Staleness markers for the series the change drops. */
    if (g && push_drops_series(g, p)) {
        size_t nseries = p->nsamples + 16;
        c.keep_cap = 16;
        while (c.keep_cap < nseries * 2)
            c.keep_cap *= 2;
        c.keep = arena_calloc(a, c.keep_cap, sizeof(uint64_t));
        push_collect_t k = c;
        k.collect_keep = true;
        k.v = NULL;
        k.n = k.cap = 0;
        /* hash what the push keeps (the sample list itself is already built) */
        for (size_t i = 0; i < p->nfams; i++)
            family_each_series(p->fams[i], collect_keep_only, &k, a);
        c.filter_kept = true;
        c.stale = true;
        c.stale_value = push_stale_nan();
        for (size_t i = 0; i < g->nfams; i++) {
            push_family_t *of = g->fams[i];
            bool replaced = p->mode == PUSH_PUT;
            for (size_t j = 0; !replaced && j < p->nfams; j++)
                replaced = strcmp(p->fams[j]->name, of->name) == 0;
            if (replaced)
                family_each_series(of, collect_series, &c, a);
        }
    }
    pthread_mutex_unlock(&r->mu);
    effect->samples = c.v;
    effect->n = c.n;
    effect->t_ms = p->now_ms;
    effect->refs = p->nsamples ? p->refs : NULL;
    effect->nrefs = p->nsamples;
    return PUSH_OK;
}

int push_registry_prepare(push_registry_t *r, const labels_t *grouping, push_mode_t mode, const expfmt_result_t *body,
                          int64_t now_ms, arena_t *a, push_pending_t **pending, push_effect_t *effect, char *err,
                          size_t errlen)
{
    int rc = push_registry_build(r, grouping, mode, body, now_ms, a, pending, err, errlen);
    if (rc != PUSH_OK)
        return rc;
    rc = push_registry_settle(r, *pending, effect, err, errlen);
    if (rc != PUSH_OK)
        push_registry_abort(*pending);
    return rc;
}

static void group_note_push(push_group_t *g, int64_t now_ms)
{
    if (g->push_ms > 0 && now_ms > g->push_ms) {
        double iv = (double)(now_ms - g->push_ms);
        g->interval_ms = g->interval_ms > 0 ? 0.7 * g->interval_ms + 0.3 * iv : iv;
    }
    if (!g->first_push_ms)
        g->first_push_ms = now_ms;
    g->push_ms = now_ms;
    g->last_ok = true;
}

void push_registry_commit(push_registry_t *r, push_pending_t *p, buf_t *delta)
{
    pthread_mutex_lock(&r->mu);
    push_group_t *g = group_find(r, p->key, p->hash);
    if (!g)
        g = group_create(r, &p->grouping, p->key, p->hash);
    size_t keep = 0;
    push_family_t **old = g->fams;
    size_t nold = g->nfams;
    push_family_t **merged = calloc(nold + p->nfams + 1, sizeof(*merged));
    if (!merged)
        abort();
    /* Merge the sorted lists: the new families win; PUT drops every old family. */
    size_t i = 0, j = 0;
    while (i < nold || j < p->nfams) {
        int c = i >= nold ? 1 : j >= p->nfams ? -1 : strcmp(old[i]->name, p->fams[j]->name);
        if (c < 0) {
            if (p->mode == PUSH_POST)
                merged[keep++] = old[i];
            else
                family_release(r, old[i]);
            i++;
        } else {
            if (c == 0)
                family_release(r, old[i++]);
            merged[keep++] = p->fams[j];
            type_ref(r, p->fams[j]->name, p->fams[j]->type);
            p->batch->refs++;
            j++;
        }
    }
    free(old);
    g->fams = merged;
    g->nfams = keep;
    g->cap = nold + p->nfams + 1;
    /* The shape cache describes the families of one PUT: a repeat keeps it, a full PUT brings
     * its own (or none), anything else drops it. */
    if (!p->fast) {
        cache_unref(g->cache);
        g->cache = NULL;
        if (p->shape && p->mode == PUSH_PUT && p->nfams > 0) {
            push_cache_t *c = calloc(1, sizeof(*c));
            push_dest_t *d = malloc(p->ndest * sizeof(*d));
            if (c && d) {
                memcpy(d, p->dest, p->ndest * sizeof(*d));
                *c = (push_cache_t){.shape = p->shape, .dest = d, .om = p->shape_om, .refs = 1};
                g->cache = c;
                p->shape = NULL;
            } else {
                free(c);
                free(d);
            }
        }
    }
    group_note_push(g, p->now_ms);
    if (delta)
        delta_commit(delta, g); /* leaves g->shape current */
    if (r->opt.on_beat)
        group_beat(r, g, p->now_ms, false, delta ? g->shape : group_shape(g));
    /* Read under the lock: a GET /metrics render pins and unpins batches concurrently. A batch
     * no family holds cannot be found by a render, so it is ours to free. */
    bool unused = p->batch->refs == 0;
    if (unused) { /* an empty push keeps nothing */
        p->batch->refs = 1;
        batch_unref(p->batch);
    }
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&r->pushes, 1);
    push_shape_free(p->shape);
    p->shape = NULL;
    p->batch = NULL;
}

void push_registry_fail(push_registry_t *r, const labels_t *grouping_in, int64_t now_ms, buf_t *delta)
{
    arena_t *a = arena_create(0);
    if (!a)
        return;
    labels_t grouping = {arena_alloc(a, (grouping_in->n ? grouping_in->n : 1) * sizeof(label_t)), grouping_in->n};
    memcpy(grouping.v, grouping_in->v, grouping_in->n * sizeof(label_t));
    labels_sort(&grouping);
    char *key = group_key(&grouping, a);
    uint64_t h = push_hash_str(key);
    pthread_mutex_lock(&r->mu);
    push_group_t *g = group_find(r, key, h);
    if (!g)
        g = group_create(r, &grouping, key, h);
    g->fail_ms = now_ms;
    g->last_ok = false;
    if (delta) {
        buf_putc(delta, 'F');
        ser_labels(delta, grouping.v, grouping.n);
        ser_u64(delta, (uint64_t)now_ms);
    }
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&r->failures, 1);
    arena_destroy(a);
}

/* Discards a pending push that could not be stored. */
void push_registry_abort(push_pending_t *p)
{
    if (!p)
        return;
    if (p->batch && p->batch->refs == 0) {
        pthread_mutex_lock(&p->reg->mu); /* a repeat's batch holds a ref on its base */
        p->batch->refs = 1;
        batch_unref(p->batch);
        pthread_mutex_unlock(&p->reg->mu);
        p->batch = NULL;
    }
    push_shape_free(p->shape);
    p->shape = NULL;
}

void push_registry_pending_take_shape(push_pending_t *p, struct push_shape *shape, bool openmetrics)
{
    push_shape_free(p->shape);
    p->shape = shape;
    p->shape_om = openmetrics;
    if (shape && push_shape_nvalues(shape) != p->ndest) {
        push_shape_free(shape); /* not the body this push was built from */
        p->shape = NULL;
    }
}

/* ---- repeated pushes (shape cache) ------------------------------------------------------------- */

int push_registry_match(push_registry_t *r, const labels_t *grouping_in, const char *body, size_t len,
                        expfmt_format_t fmt, arena_t *a, push_fast_t **out)
{
    *out = NULL;
    labels_t grouping = {arena_alloc(a, (grouping_in->n ? grouping_in->n : 1) * sizeof(label_t)), grouping_in->n};
    memcpy(grouping.v, grouping_in->v, grouping_in->n * sizeof(label_t));
    labels_sort(&grouping);
    push_fast_t *f = arena_calloc(a, 1, sizeof(*f));
    f->key = group_key(&grouping, a);
    f->hash = push_hash_str(f->key);
    pthread_mutex_lock(&r->mu);
    push_group_t *g = group_find(r, f->key, f->hash);
    if (g && g->cache) {
        f->cache = g->cache;
        f->cache->refs++;
    }
    pthread_mutex_unlock(&r->mu);
    if (!f->cache)
        return PUSH_MISS;
    size_t n = push_shape_nvalues(f->cache->shape);
    f->values = arena_try_alloc(a, (n ? n : 1) * sizeof(double));
    if (!f->values || !push_shape_match(f->cache->shape, body, len, fmt, f->values)) {
        push_registry_fast_release(r, f);
        atomic_fetch_add(&r->shape_misses, 1);
        return PUSH_MISS;
    }
    *out = f;
    return PUSH_OK;
}

void push_registry_fast_release(push_registry_t *r, push_fast_t *f)
{
    if (!f || !f->cache)
        return;
    pthread_mutex_lock(&r->mu);
    cache_unref(f->cache);
    pthread_mutex_unlock(&r->mu);
    f->cache = NULL;
}

int push_registry_settle_fast(push_registry_t *r, push_fast_t *f, int64_t now_ms, arena_t *a, push_pending_t **pending,
                              push_effect_t *effect)
{
    pthread_mutex_lock(&r->mu);
    push_group_t *g = group_find(r, f->key, f->hash);
    /* The group may have changed since the match (a DELETE, a POST, another full PUT). */
    bool same = g && g->cache == f->cache && g->nfams > 0;
    push_batch_t *old = same ? g->fams[0]->batch : NULL;
    for (size_t i = 0; same && i < g->nfams; i++)
        same = g->fams[i]->batch == old && g->fams[i]->refs;
    push_batch_t *base = same ? (old->base ? old->base : old) : NULL;
    if (base)
        base->refs++; /* the repeat's batch will hold it */
    pthread_mutex_unlock(&r->mu);
    if (!same)
        return PUSH_MISS;
    /* The caller's push lock keeps the group's families as they are from here to the commit. */
    size_t nseries = 0;
    for (size_t i = 0; i < g->nfams; i++)
        nseries += g->fams[i]->nseries;
    push_family_t **fams = arena_alloc(a, g->nfams * sizeof(*fams));
    push_batch_t *nb = batch_pack(g->fams, g->nfams, nseries, true, fams);
    if (!nb) {
        pthread_mutex_lock(&r->mu);
        batch_unref(base);
        pthread_mutex_unlock(&r->mu);
        return PUSH_ERR_NOMEM;
    }
    nb->base = base; /* the ref taken above */
    for (size_t i = 0; i < g->nfams; i++)
        fams[i]->push_ms = now_ms;
    push_pending_t *p = arena_calloc(a, 1, sizeof(*p));
    p->key = f->key;
    p->hash = f->hash;
    p->grouping = g->grouping;
    p->mode = PUSH_PUT;
    p->batch = nb;
    p->now_ms = now_ms;
    p->arena = a;
    p->reg = r;
    p->fast = f->cache;
    p->nfams = g->nfams;
    p->fams = fams;
    p->refs = nb->srefs;
    const push_cache_t *c = f->cache;
    size_t n = push_shape_nvalues(c->shape);
    for (size_t k = 0; k < n; k++) {
        push_dest_t d = c->dest[k];
        assert(d.fam < p->nfams && d.metric < p->fams[d.fam]->n);
        push_family_t *nf = p->fams[d.fam];
        push_metric_t *m = &nf->metrics[d.metric];
        double v = f->values[k];
        /* As the text parser does: counts go through uint64 in 0.0.4 bodies. */
        bool hist = nf->type == EXPFMT_HISTOGRAM || nf->type == EXPFMT_GAUGE_HISTOGRAM;
        if (!c->om && (d.part == PART_COUNT || (d.part >= 0 && hist)))
            v = expfmt_go_uint64_trunc(v);
        switch (d.part) {
        case PART_VALUE: m->value = v; break;
        case PART_SUM: m->x->sum = v; break; /* the build that made dest made x */
        case PART_COUNT: m->x->count = v; break;
        case PART_NONE: break;
        default:
            assert((uint32_t)d.part < m->nq);
            m->x->qv[d.part] = v;
            break;
        }
    }
    push_collect_t col = {.a = a};
    for (size_t i = 0; i < p->nfams; i++)
        family_each_series(p->fams[i], collect_series, &col, a);
    assert(col.n == nseries);
    p->samples = col.v;
    p->nsamples = col.n;
    p->samples_cap = col.cap;
    *pending = p;
    effect->samples = col.v;
    effect->n = col.n;
    effect->t_ms = now_ms;
    effect->refs = col.n ? p->refs : NULL;
    effect->nrefs = col.n;
    atomic_fetch_add(&r->shape_hits, 1);
    return PUSH_OK;
}

static void group_stale_effect(push_registry_t *r, push_group_t *g, arena_t *a, push_collect_t *c)
{
    c->stale = true;
    c->stale_value = push_stale_nan();
    for (size_t i = 0; i < g->nfams; i++)
        family_each_series(g->fams[i], collect_series, c, a);
}

bool push_registry_delete(push_registry_t *r, const labels_t *grouping_in, int64_t now_ms, arena_t *a,
                          push_effect_t *effect, buf_t *delta)
{
    labels_t grouping = {arena_alloc(a, (grouping_in->n ? grouping_in->n : 1) * sizeof(label_t)), grouping_in->n};
    memcpy(grouping.v, grouping_in->v, grouping_in->n * sizeof(label_t));
    labels_sort(&grouping);
    char *key = group_key(&grouping, a);
    uint64_t h = push_hash_str(key);
    push_collect_t c = {.a = a};
    pthread_mutex_lock(&r->mu);
    push_group_t *g = group_find(r, key, h);
    if (g) {
        group_stale_effect(r, g, a, &c);
        if (delta) {
            buf_putc(delta, 'D');
            ser_labels(delta, g->grouping.v, g->grouping.n);
        }
        group_beat(r, g, now_ms, true, 0);
        group_unlink_free(r, g);
    }
    pthread_mutex_unlock(&r->mu);
    if (g)
        atomic_fetch_add(&r->deleted, 1);
    effect->samples = c.v;
    effect->n = c.n;
    effect->t_ms = now_ms;
    effect->refs = NULL;
    effect->nrefs = 0;
    return g != NULL;
}

void push_registry_wipe(push_registry_t *r, int64_t now_ms, arena_t *a, push_effect_t *effect, buf_t *delta)
{
    push_collect_t c = {.a = a};
    pthread_mutex_lock(&r->mu);
    if (delta)
        buf_putc(delta, 'W');
    for (size_t i = 0; i < r->gcap; i++)
        while (r->gtab[i]) {
            group_stale_effect(r, r->gtab[i], a, &c);
            group_beat(r, r->gtab[i], now_ms, true, 0);
            group_unlink_free(r, r->gtab[i]);
        }
    pthread_mutex_unlock(&r->mu);
    effect->samples = c.v;
    effect->n = c.n;
    effect->t_ms = now_ms;
    effect->refs = NULL;
    effect->nrefs = 0;
}

/* Storage's resolution: pushes of one second line up, so no interval counts as shorter. Without
 * this floor two PUTs a few milliseconds apart (a script, a test, a retry) teach the group an
 * interval of milliseconds and it expires before the client's next request. */
enum { PUSH_MIN_INTERVAL_MS = 1000 };

/* A group expires when it has not pushed for group_ttl, or for missed_intervals of its own
 * observed push interval (known once it pushed twice, at least PUSH_MIN_INTERVAL_MS). Groups that
 * never pushed successfully (only failures) follow the same clock from their first failure. */
static bool group_expired(const push_registry_t *r, const push_group_t *g, int64_t now_ms)
{
    int64_t last = g->push_ms > g->fail_ms ? g->push_ms : g->fail_ms;
    if (r->opt.group_ttl_ms > 0 && now_ms - last > r->opt.group_ttl_ms)
        return true;
    double interval = g->interval_ms < PUSH_MIN_INTERVAL_MS ? PUSH_MIN_INTERVAL_MS : g->interval_ms;
    if (r->opt.missed_intervals > 0 && g->interval_ms > 0 &&
        (double)(now_ms - last) > interval * r->opt.missed_intervals)
        return true;
    return false;
}

size_t push_registry_expire(push_registry_t *r, int64_t now_ms, arena_t *a, push_effect_t *effect, buf_t *delta)
{
    push_collect_t c = {.a = a};
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->gcap; i++) {
        push_group_t *g = r->gtab[i];
        while (g) {
            push_group_t *next = g->next;
            if (group_expired(r, g, now_ms)) {
                group_stale_effect(r, g, a, &c);
                if (delta) {
                    buf_putc(delta, 'D');
                    ser_labels(delta, g->grouping.v, g->grouping.n);
                }
                group_beat(r, g, now_ms, true, 0);
                group_unlink_free(r, g);
                n++;
            }
            g = next;
        }
    }
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&r->expired, n);
    effect->samples = c.v;
    effect->n = c.n;
    effect->t_ms = now_ms;
    effect->refs = NULL;
    effect->nrefs = 0;
    return n;
}

/* Adds batch b (and its base) to m once: a group's families share a few batches. */
static void memory_add_batch(push_registry_mem_t *m, const push_batch_t *b, const push_batch_t **seen, size_t *nseen,
                             size_t cap)
{
    for (; b; b = b->base) {
        bool dup = false;
        for (size_t i = 0; i < *nseen && !dup; i++)
            dup = seen[i] == b;
        if (dup)
            continue;
        if (*nseen < cap)
            seen[(*nseen)++] = b;
        m->batches++;
        m->bytes += b->mem_bytes;
        for (const push_blk_t *k = b->blks; k; k = k->next)
            m->bytes += k->cap;
        m->label_sets += b->nsets;
    }
}

void push_registry_memory(push_registry_t *r, push_registry_mem_t *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->gcap; i++)
        for (const push_group_t *g = r->gtab[i]; g; g = g->next) {
            const push_batch_t *seen[64];
            size_t nseen = 0;
            out->groups++;
            out->families += g->nfams;
            for (size_t f = 0; f < g->nfams; f++) {
                out->metrics += g->fams[f]->n;
                memory_add_batch(out, g->fams[f]->batch, seen, &nseen, 64);
            }
        }
    pthread_mutex_unlock(&r->mu);
}

size_t push_registry_group_count(push_registry_t *r)
{
    pthread_mutex_lock(&r->mu);
    size_t n = r->ngroups;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* ---- output ------------------------------------------------------------------------------------------ */

static void put_label_value(buf_t *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            buf_puts(b, "\\\\");
        else if (*v == '"')
            buf_puts(b, "\\\"");
        else if (*v == '\n')
            buf_puts(b, "\\n");
        else
            buf_putc(b, *v);
    }
}

static void put_help(buf_t *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            buf_puts(b, "\\\\");
        else if (*v == '\n')
            buf_puts(b, "\\n");
        else
            buf_putc(b, *v);
    }
}

static void put_series_line(buf_t *b, const char *name, const label_t *ls, uint32_t n, const char *extra_name,
                            double extra, double v)
{
    buf_puts(b, name);
    if (n || extra_name) {
        buf_putc(b, '{');
        for (uint32_t i = 0; i < n; i++) {
            if (i)
                buf_putc(b, ',');
            buf_puts(b, ls[i].name);
            buf_puts(b, "=\"");
            put_label_value(b, ls[i].value);
            buf_putc(b, '"');
        }
        if (extra_name) {
            if (n)
                buf_putc(b, ',');
            buf_puts(b, extra_name);
            buf_puts(b, "=\"");
            buf_put_float(b, extra);
            buf_putc(b, '"');
        }
        buf_putc(b, '}');
    }
    buf_putc(b, ' ');
    buf_put_float(b, v);
    buf_putc(b, '\n');
}

typedef struct {
    buf_t *b;
} push_text_ctx_t;

static void text_series(void *ud, const char *name, const push_metric_t *m, const char *extra_name, double extra,
                        const char *extra_s, double v)
{
    put_series_line(((push_text_ctx_t *)ud)->b, name, m->labels, m->nlabels, extra_name, extra, v);
}

typedef struct {
    const push_family_t *f;
    const push_metric_t *m;
} push_render_item_t;

static int ref_cmp(const void *pa, const void *pb)
{
    const push_render_item_t *a = pa, *b = pb;
    int c = strcmp(a->f->name, b->f->name);
    if (c)
        return c;
    return metric_cmp(a->m, b->m);
}

/* The grouping labels as a series' labels: plus instance="" when absent. Arena a. */
static label_t *group_series_labels(const push_group_t *g, arena_t *a, uint32_t *n)
{
    label_t *ls = arena_alloc(a, (g->grouping.n + 1) * sizeof(label_t));
    uint32_t k = 0;
    bool inst = false;
    for (size_t i = 0; i < g->grouping.n; i++) {
        ls[k++] = g->grouping.v[i];
        inst |= strcmp(g->grouping.v[i].name, "instance") == 0;
    }
    if (!inst)
        ls[k++] = (label_t){"instance", ""};
    qsort(ls, k, sizeof(label_t), label_cmp_name);
    *n = k;
    return ls;
}

/* The grouping labels of group_series_labels, copied into a: the group may be freed once the
 * registry is unlocked. */
static label_t *group_series_labels_copy(const push_group_t *g, arena_t *a, uint32_t *n)
{
    label_t *ls = group_series_labels(g, a, n);
    for (uint32_t i = 0; i < *n; i++)
        ls[i] = (label_t){arena_strdup(a, ls[i].name), arena_strdup(a, ls[i].value)};
    return ls;
}

struct push_render {
    push_registry_t *r;
    arena_t *a; /* the bookkeeping series' labels; above mark, one series' scratch */
    arena_mark_t mark;
    push_render_item_t *refs; /* every series, sorted */
    size_t k;
    push_family_t **pinned; /* families whose batch holds a pin */
    size_t npinned;
    size_t next;    /* first ref not yet rendered */
    size_t fam_end; /* end of the family the refs from next on belong to; next when at a new one */
};

/* GET /metrics can be 100 MB for a few hundred Flink TaskManagers, so only pinning happens under
 * the lock: each family pins its batch (families are immutable once committed and live in their
 * batch) and the bookkeeping series are copied. The arrays for that are allocated and touched
 * before the lock is taken (a fresh page costs tens of microseconds here, and every push waits
 * for this lock); listing every series (~256k references), sorting and formatting run unlocked
 * while pushes go on. */
push_render_t *push_registry_render_begin(push_registry_t *r)
{
    static const push_family_t ftime = {.name = PUSH_TIME_NAME, .help = PUSH_TIME_HELP, .type = EXPFMT_GAUGE};
    static const push_family_t ffail = {.name = PUSH_FAIL_NAME, .help = PUSH_FAIL_HELP, .type = EXPFMT_GAUGE};
    push_render_t *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->r = r;
    h->a = arena_create(0);
    if (!h->a) {
        free(h);
        return NULL;
    }
    /* Size under the lock, allocate outside it; again if pushes added families meanwhile. */
    size_t capfam = 0, capg = 0;
    push_metric_t *bookkeeping = NULL;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        size_t nfam = 0;
        for (size_t i = 0; i < r->gcap; i++)
            for (push_group_t *g = r->gtab[i]; g; g = g->next)
                nfam += g->nfams;
        size_t ng = r->ngroups;
        if (nfam <= capfam && ng <= capg)
            break; /* the lock stays held */
        pthread_mutex_unlock(&r->mu);
        capfam = nfam + nfam / 8 + 16;
        capg = ng + ng / 8 + 4;
        free(h->pinned);
        h->pinned = malloc(capfam * sizeof(*h->pinned));
        bookkeeping = arena_calloc(h->a, capg * 2, sizeof(push_metric_t));
        if (!h->pinned || !bookkeeping) {
            push_registry_render_end(h);
            return NULL;
        }
        memset(h->pinned, 0, capfam * sizeof(*h->pinned));
    }
    size_t gi = 0;
    for (size_t i = 0; i < r->gcap; i++)
        for (push_group_t *g = r->gtab[i]; g; g = g->next, gi++) {
            for (size_t f = 0; f < g->nfams; f++) {
                push_family_t *fam = g->fams[f];
                if (fam->batch)
                    fam->batch->refs++;
                h->pinned[h->npinned++] = fam;
            }
            push_metric_t *mt = &bookkeeping[gi * 2], *mf = &bookkeeping[gi * 2 + 1];
            mt->labels = group_series_labels_copy(g, h->a, &mt->nlabels);
            mt->value = (double)g->push_ms / 1000.0;
            mf->labels = mt->labels;
            mf->nlabels = mt->nlabels;
            mf->value = (double)g->fail_ms / 1000.0;
        }
    assert(gi == r->ngroups);
    pthread_mutex_unlock(&r->mu);

    size_t nref = 0;
    for (size_t i = 0; i < h->npinned; i++)
        nref += h->pinned[i]->n;
    h->refs = malloc((nref + gi * 2 + 1) * sizeof(*h->refs));
    if (!h->refs) {
        push_registry_render_end(h);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < h->npinned; i++) {
        push_family_t *fam = h->pinned[i];
        for (size_t m = 0; m < fam->n; m++)
            h->refs[k++] = (push_render_item_t){fam, &fam->metrics[m]};
    }
    /* The bookkeeping families join the sort like any other. */
    for (size_t g = 0; g < gi; g++) {
        h->refs[k++] = (push_render_item_t){&ftime, &bookkeeping[g * 2]};
        h->refs[k++] = (push_render_item_t){&ffail, &bookkeeping[g * 2 + 1]};
    }
    assert(k == nref + gi * 2);
    qsort(h->refs, k, sizeof(*h->refs), ref_cmp);
    h->k = k;
    h->mark = arena_mark(h->a);
    return h;
}

bool push_registry_render_next(push_render_t *h, buf_t *out, size_t max_bytes)
{
    size_t start = out->len;
    push_text_ctx_t ctx = {out};
    while (h->next < h->k && out->len - start < max_bytes) {
        const push_family_t *f = h->refs[h->next].f;
        if (h->next == h->fam_end) { /* a new family: its header, HELP from the first ref that has one */
            const char *help = NULL;
            size_t j = h->next;
            for (; j < h->k && strcmp(h->refs[j].f->name, f->name) == 0; j++)
                if (!help && h->refs[j].f->help)
                    help = h->refs[j].f->help;
            h->fam_end = j;
            if (help) {
                buf_puts(out, "# HELP ");
                buf_puts(out, f->name);
                buf_putc(out, ' ');
                put_help(out, help);
                buf_putc(out, '\n');
            }
            buf_puts(out, "# TYPE ");
            buf_puts(out, f->name);
            buf_putc(out, ' ');
            buf_puts(out, expfmt_type_name(f->type));
            buf_putc(out, '\n');
        }
        push_family_t one = *f;
        one.metrics = (push_metric_t *)h->refs[h->next].m;
        one.n = 1;
        family_each_series(&one, text_series, &ctx, h->a);
        arena_rewind(h->a, h->mark); /* the _sum/_count/_bucket names made for this series */
        h->next++;
    }
    return h->next < h->k;
}

void push_registry_render_end(push_render_t *h)
{
    if (!h)
        return;
    if (h->npinned) {
        pthread_mutex_lock(&h->r->mu);
        for (size_t i = 0; i < h->npinned; i++)
            batch_unref(h->pinned[i]->batch);
        pthread_mutex_unlock(&h->r->mu);
    }
    free(h->pinned);
    free(h->refs);
    arena_destroy(h->a);
    free(h);
}

void push_registry_write_text(push_registry_t *r, buf_t *out)
{
    push_render_t *h = push_registry_render_begin(r);
    if (!h)
        return;
    while (push_registry_render_next(h, out, SIZE_MAX))
        ;
    push_registry_render_end(h);
}

static void json_time(buf_t *b, int64_t ms)
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    char tmp[64];
    int frac = (int)(ms % 1000);
    if (frac)
        snprintf(tmp, sizeof(tmp), "\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\"", tm.tm_year + 1900, tm.tm_mon + 1,
                 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
    else
        snprintf(tmp, sizeof(tmp), "\"%04d-%02d-%02dT%02d:%02d:%02dZ\"", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec);
    buf_puts(b, tmp);
}

static void json_str(buf_t *b, const char *s)
{
    buf_put_json_string(b, s, strlen(s));
}

static void json_float_str(buf_t *b, double v)
{
    buf_putc(b, '"');
    buf_put_float(b, v);
    buf_putc(b, '"');
}

static void json_labels(buf_t *b, const label_t *ls, uint32_t n)
{
    buf_putc(b, '{');
    for (uint32_t i = 0; i < n; i++) {
        if (i)
            buf_putc(b, ',');
        json_str(b, ls[i].name);
        buf_putc(b, ':');
        json_str(b, ls[i].value);
    }
    buf_putc(b, '}');
}

static void json_family(buf_t *b, const push_family_t *f, int64_t ts_ms)
{
    json_str(b, f->name);
    buf_puts(b, ":{\"time_stamp\":");
    json_time(b, ts_ms);
    buf_puts(b, ",\"type\":");
    json_str(b, expfmt_type_proto_name(f->type));
    if (f->help && f->help[0]) {
        buf_puts(b, ",\"help\":");
        json_str(b, f->help);
    }
    buf_puts(b, ",\"metrics\":[");
    for (size_t i = 0; i < f->n; i++) {
        const push_metric_t *m = &f->metrics[i];
        if (i)
            buf_putc(b, ',');
        buf_puts(b, "{\"labels\":");
        json_labels(b, m->labels, m->nlabels);
        if (f->type == EXPFMT_SUMMARY || f->type == EXPFMT_HISTOGRAM || f->type == EXPFMT_GAUGE_HISTOGRAM) {
            bool summary = f->type == EXPFMT_SUMMARY;
            buf_puts(b, summary ? ",\"quantiles\":{" : ",\"buckets\":{");
            for (uint32_t q = 0; q < m->nq; q++) {
                if (q)
                    buf_putc(b, ',');
                json_float_str(b, m->x->qb[q]);
                buf_putc(b, ':');
                json_float_str(b, m->x->qv[q]);
            }
            buf_puts(b, "},\"count\":");
            json_float_str(b, metric_count(m));
            buf_puts(b, ",\"sum\":");
            json_float_str(b, metric_sum(m));
        } else {
            buf_puts(b, ",\"value\":");
            json_float_str(b, m->value);
        }
        buf_putc(b, '}');
    }
    buf_puts(b, "]}");
}

void push_registry_write_json(push_registry_t *r, buf_t *out)
{
    arena_t *a = arena_create(0);
    if (!a)
        return;
    pthread_mutex_lock(&r->mu);
    buf_putc(out, '[');
    bool first = true;
    for (size_t i = 0; i < r->gcap; i++)
        for (push_group_t *g = r->gtab[i]; g; g = g->next) {
            if (!first)
                buf_putc(out, ',');
            first = false;
            buf_puts(out, "{\"labels\":");
            json_labels(out, g->grouping.v, (uint32_t)g->grouping.n);
            buf_printf(out, ",\"last_push_successful\":%s", g->last_ok ? "true" : "false");
            for (size_t f = 0; f < g->nfams; f++) {
                buf_putc(out, ',');
                json_family(out, g->fams[f], g->fams[f]->push_ms);
            }
            push_metric_t mt = {0}, mf = {0};
            mt.labels = group_series_labels(g, a, &mt.nlabels);
            mt.value = (double)g->push_ms / 1000.0;
            mf.labels = mt.labels;
            mf.nlabels = mt.nlabels;
            mf.value = (double)g->fail_ms / 1000.0;
            int64_t ts = g->push_ms > g->fail_ms ? g->push_ms : g->fail_ms;
            push_family_t ft = {
                .name = PUSH_TIME_NAME, .help = PUSH_TIME_HELP, .type = EXPFMT_GAUGE, .metrics = &mt, .n = 1};
            push_family_t ff = {
                .name = PUSH_FAIL_NAME, .help = PUSH_FAIL_HELP, .type = EXPFMT_GAUGE, .metrics = &mf, .n = 1};
            buf_putc(out, ',');
            json_family(out, &ft, ts);
            buf_putc(out, ',');
            json_family(out, &ff, ts);
            buf_putc(out, '}');
        }
    buf_putc(out, ']');
    pthread_mutex_unlock(&r->mu);
    arena_destroy(a);
}

void push_registry_write_metrics(push_registry_t *r, buf_t *out)
{
    buf_printf(out,
               "# HELP sluice_push_groups Push groups currently held.\n# TYPE sluice_push_groups "
               "gauge\nsluice_push_groups %zu\n"
               "# HELP sluice_push_pushes_total Pushes accepted (PUT and POST).\n# TYPE sluice_push_pushes_total "
               "counter\nsluice_push_pushes_total %llu\n"
               "# HELP sluice_push_failures_total Pushes refused.\n# TYPE sluice_push_failures_total "
               "counter\nsluice_push_failures_total %llu\n"
               "# HELP sluice_push_groups_expired_total Groups removed by expiry.\n# TYPE "
               "sluice_push_groups_expired_total counter\nsluice_push_groups_expired_total %llu\n"
               "# HELP sluice_push_groups_deleted_total Groups removed by DELETE.\n# TYPE "
               "sluice_push_groups_deleted_total counter\nsluice_push_groups_deleted_total %llu\n"
               "# HELP sluice_push_repeats_total Pushes recognised as their group's previous body with new values "
               "(only the values were parsed).\n# TYPE sluice_push_repeats_total counter\nsluice_push_repeats_total %llu\n"
               "# HELP sluice_push_repeat_misses_total Pushes to a group with a known body shape that did not repeat "
               "it (parsed in full).\n# TYPE sluice_push_repeat_misses_total counter\nsluice_push_repeat_misses_total "
               "%llu\n",
               push_registry_group_count(r), (unsigned long long)atomic_load(&r->pushes),
               (unsigned long long)atomic_load(&r->failures), (unsigned long long)atomic_load(&r->expired),
               (unsigned long long)atomic_load(&r->deleted), (unsigned long long)atomic_load(&r->shape_hits),
               (unsigned long long)atomic_load(&r->shape_misses));
}

/* ---- persistence ------------------------------------------------------------------------------------
 *
 * Full state (storage snapshot), little-endian: "SPG1" u32 ngroups, group* (push_registry_restore;
 * push_registry_serialize writes ngroups 0 there and the groups as 'S' records in the pieces that
 * follow, read as deltas):
 *   "SPG1" u32 ngroups, group*
 *   group  = u32 nlabels, (str name, str value)*, i64 push_ms, i64 fail_ms, u8 last_ok,
 *            f64 interval_ms, i64 first_push_ms, u32 nfams, family*
 *   family = str name, u8 has_help, [str help], u8 type, i64 push_ms, u32 nmetrics, metric*
 *   metric = u32 nlabels, (str name, str value)*, f64 value, f64 sum, f64 count, u32 nq, (f64 bound, f64 v)*
 *   str    = u32 length + bytes.
 *
 * Deltas (WAL, one per change; a sequence of records, each a kind byte + payload). Every record
 * sets state (never adds to it), so replaying one that a snapshot already contains is harmless:
 *   'S' group             the whole group (a push that changed the group's shape), each metric's
 *                         labels as u32 0 then nlabels, (str name, str value)*: a set this record
 *                         has not had yet; or u32 k >= 1: the k-th set written so far
 *   'G' group             the same with every metric's labels written out (metric above); read
 *                         only, written by versions before 'S'
 *   'V' key, i64 push_ms, f64 interval_ms, i64 first_push_ms, u32 n, f64 value*
 *                         a push that kept the shape: the values in canonical order (families by
 *                         name, metrics in order; value, sum, count, quantile/bucket values)
 *   'F' u32 nlabels, (str, str)*, i64 fail_ms   a refused push
 *   'D' u32 nlabels, (str, str)*                a group removed (DELETE, expiry)
 *   'W'                                         every group removed (admin wipe)
 */

static void ser_u32(buf_t *b, uint32_t v)
{
    buf_append(b, &v, 4);
}
static void ser_u64(buf_t *b, uint64_t v)
{
    buf_append(b, &v, 8);
}
static void ser_f64(buf_t *b, double v)
{
    buf_append(b, &v, 8);
}
static void ser_str(buf_t *b, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    ser_u32(b, n);
    buf_append(b, s, n);
}

static void ser_labels(buf_t *out, const label_t *ls, size_t n)
{
    ser_u32(out, (uint32_t)n);
    for (size_t l = 0; l < n; l++) {
        ser_str(out, ls[l].name);
        ser_str(out, ls[l].value);
    }
}

/* The number an 'S' record gives a label set, by the set's address: a group's metrics share
 * their sets (labelset_intern; a Flink TaskManager's ~860 metrics have ~50), so each distinct
 * set is written once and later uses name its number (4 bytes instead of the whole set: ~320 KiB
 * less WAL per new Flink TaskManager in bench/push_bench). Open addressing, sized for the metrics. */
typedef struct {
    const label_t *set;
    uint32_t nlabels;
    uint32_t no; /* 1-based, in the order the sets were written */
} ser_setmemo_t;

static void ser_metric_labels(buf_t *out, const push_metric_t *pm, ser_setmemo_t *memo, size_t cap, uint32_t *nsets)
{
    size_t j = 0;
    if (memo) {
        uintptr_t k = (uintptr_t)pm->labels;
        j = (size_t)((k >> 4) * 0x9E3779B97F4A7C15ull >> 32) & (cap - 1);
        for (; memo[j].set; j = (j + 1) & (cap - 1))
            if (memo[j].set == pm->labels && memo[j].nlabels == pm->nlabels) {
                ser_u32(out, memo[j].no);
                return;
            }
    }
    ser_u32(out, 0);
    ser_labels(out, pm->labels, pm->nlabels);
    ++*nsets;
    if (memo)
        memo[j] = (ser_setmemo_t){pm->labels, pm->nlabels, *nsets};
}

static void ser_group(buf_t *out, const push_group_t *g)
{
    size_t nmetrics = 0;
    for (size_t f = 0; f < g->nfams; f++)
        nmetrics += g->fams[f]->n;
    size_t cap = 16;
    while (cap < nmetrics * 2)
        cap *= 2;
    ser_setmemo_t *memo = nmetrics > 1 ? calloc(cap, sizeof(*memo)) : NULL; /* NULL: write each */
    uint32_t nsets = 0;
    ser_labels(out, g->grouping.v, g->grouping.n);
    ser_u64(out, (uint64_t)g->push_ms);
    ser_u64(out, (uint64_t)g->fail_ms);
    buf_putc(out, g->last_ok ? 1 : 0);
    ser_f64(out, g->interval_ms);
    ser_u64(out, (uint64_t)g->first_push_ms);
    ser_u32(out, (uint32_t)g->nfams);
    for (size_t f = 0; f < g->nfams; f++) {
        const push_family_t *fam = g->fams[f];
        ser_str(out, fam->name);
        buf_putc(out, fam->help ? 1 : 0);
        if (fam->help)
            ser_str(out, fam->help);
        buf_putc(out, (char)fam->type);
        ser_u64(out, (uint64_t)fam->push_ms);
        ser_u32(out, (uint32_t)fam->n);
        for (size_t m = 0; m < fam->n; m++) {
            const push_metric_t *pm = &fam->metrics[m];
            ser_metric_labels(out, pm, memo, cap, &nsets);
            ser_f64(out, pm->value);
            ser_f64(out, metric_sum(pm));
            ser_f64(out, metric_count(pm));
            ser_u32(out, pm->nq);
            for (uint32_t q = 0; q < pm->nq; q++) {
                ser_f64(out, pm->x->qb[q]);
                ser_f64(out, pm->x->qv[q]);
            }
        }
    }
    free(memo);
}

/* Number of value slots of a group in canonical order. */
static size_t group_value_count(const push_group_t *g)
{
    size_t n = 0;
    for (size_t f = 0; f < g->nfams; f++)
        for (size_t m = 0; m < g->fams[f]->n; m++)
            n += 3 + g->fams[f]->metrics[m].nq;
    return n;
}

/* Written in one reserved run: it is the whole of a steady-state push's record, made under the
 * caller's push lock (thousands of values; one append call each cost more than the copying). */
static void ser_values(buf_t *out, const push_group_t *g)
{
    size_t n = group_value_count(g);
    ser_u32(out, (uint32_t)n);
    buf_reserve(out, n * sizeof(double));
    char *w = out->data + out->len;
    for (size_t f = 0; f < g->nfams; f++)
        for (size_t m = 0; m < g->fams[f]->n; m++) {
            const push_metric_t *pm = &g->fams[f]->metrics[m];
            double v3[3] = {pm->value, metric_sum(pm), metric_count(pm)};
            memcpy(w, v3, sizeof(v3));
            w += sizeof(v3);
            if (pm->nq) {
                memcpy(w, pm->x->qv, pm->nq * sizeof(double));
                w += pm->nq * sizeof(double);
            }
        }
    assert((size_t)(w - (out->data + out->len)) == n * sizeof(double));
    out->len += n * sizeof(double);
}

int push_registry_serialize(push_registry_t *r, size_t piece_bytes, push_registry_put_fn put, void *ctx)
{
    buf_t b = BUF_INIT;
    buf_append(&b, "SPG1", 4);
    ser_u32(&b, 0);
    pthread_mutex_lock(&r->mu);
    int rc = put(ctx, b.data, b.len);
    buf_reset(&b);
    for (size_t i = 0; i < r->gcap && rc == 0; i++)
        for (push_group_t *g = r->gtab[i]; g && rc == 0; g = g->next) {
            buf_putc(&b, 'S');
            ser_group(&b, g);
            if (b.len >= piece_bytes) {
                rc = put(ctx, b.data, b.len);
                buf_reset(&b);
            }
        }
    if (rc == 0 && b.len)
        rc = put(ctx, b.data, b.len);
    pthread_mutex_unlock(&r->mu);
    buf_free(&b);
    return rc;
}

/* The delta of a commit: the whole group when its shape changed, else just its values. */
static void delta_commit(buf_t *delta, push_group_t *g)
{
    uint64_t shape = group_shape(g);
    if (shape != g->shape || !g->shape) {
        g->shape = shape;
        buf_putc(delta, 'S');
        ser_group(delta, g);
        return;
    }
    buf_putc(delta, 'V');
    ser_str(delta, g->key);
    ser_u64(delta, (uint64_t)g->push_ms);
    ser_f64(delta, g->interval_ms);
    ser_u64(delta, (uint64_t)g->first_push_ms);
    ser_values(delta, g);
}

typedef struct {
    const uint8_t *p, *end;
    bool bad;
} push_reader_t;

static const void *rd_bytes(push_reader_t *rd, size_t n)
{
    if (rd->bad || (size_t)(rd->end - rd->p) < n) {
        rd->bad = true;
        return NULL;
    }
    const void *v = rd->p;
    rd->p += n;
    return v;
}
static uint32_t rd_u32(push_reader_t *rd)
{
    uint32_t v = 0;
    const void *p = rd_bytes(rd, 4);
    if (p)
        memcpy(&v, p, 4);
    return v;
}
static uint64_t rd_u64(push_reader_t *rd)
{
    uint64_t v = 0;
    const void *p = rd_bytes(rd, 8);
    if (p)
        memcpy(&v, p, 8);
    return v;
}
static double rd_f64(push_reader_t *rd)
{
    double v = 0;
    const void *p = rd_bytes(rd, 8);
    if (p)
        memcpy(&v, p, 8);
    return v;
}
static uint8_t rd_u8(push_reader_t *rd)
{
    const uint8_t *p = rd_bytes(rd, 1);
    return p ? *p : 0;
}
static const char *rd_str(push_reader_t *rd, push_strtab_t *st)
{
    uint32_t n = rd_u32(rd);
    const char *p = rd_bytes(rd, n);
    if (!p || memchr(p, 0, n)) {
        rd->bad = true;
        return "";
    }
    char tmp[256];
    char *s = n < sizeof(tmp) ? tmp : malloc(n + 1);
    if (!s) {
        rd->bad = true;
        return "";
    }
    memcpy(s, p, n);
    s[n] = 0;
    const char *r = strtab_intern(st, s);
    if (s != tmp)
        free(s);
    return r;
}

/* A count read from untrusted bytes: each element takes at least `min_bytes`, so more elements
 * than the remaining bytes allow means the input is corrupt. */
static uint32_t rd_count(push_reader_t *rd, size_t min_bytes)
{
    uint32_t n = rd_u32(rd);
    if ((size_t)(rd->end - rd->p) / min_bytes < n)
        rd->bad = true;
    return rd->bad ? 0 : n;
}

/* Reads grouping labels into `scratch` (strings interned in st) and returns the group key. */
static char *rd_grouping(push_reader_t *rd, push_strtab_t *st, arena_t *scratch, labels_t *grouping)
{
    uint32_t nl = rd_count(rd, 8);
    grouping->v = arena_alloc(scratch, (nl ? nl : 1) * sizeof(label_t));
    grouping->n = nl;
    for (uint32_t l = 0; l < nl; l++) {
        grouping->v[l].name = rd_str(rd, st);
        grouping->v[l].value = rd_str(rd, st);
    }
    labels_sort(grouping);
    return group_key(grouping, scratch);
}

/* Reads one group record ('S': label sets by number, else 'G'), replacing any group with the same
 * key. Called with r->mu held. */
static void rd_group(push_registry_t *r, push_reader_t *rd, arena_t *scratch, bool numbered)
{
    /* 'S': the label sets read so far, by number - 1 (interned in st: they live in the batch) */
    struct {
        label_t *v;
        uint32_t n;
    } *sets = NULL;
    size_t nsets = 0, setcap = 0;
    push_batch_t *batch = calloc(1, sizeof(*batch));
    if (!batch)
        abort();
    push_strtab_t st = {.b = batch};
    labels_t grouping;
    char *key = rd_grouping(rd, &st, scratch, &grouping);
    uint64_t h = push_hash_str(key);
    push_group_t *g = rd->bad ? NULL : group_find(r, key, h);
    if (g)
        group_unlink_free(r, g);
    g = rd->bad ? NULL : group_create(r, &grouping, key, h);
    int64_t push_ms = (int64_t)rd_u64(rd), fail_ms = (int64_t)rd_u64(rd);
    bool last_ok = rd_u8(rd) != 0;
    double interval = rd_f64(rd);
    int64_t first = (int64_t)rd_u64(rd);
    uint32_t nf = rd_count(rd, 22);
    if (g) {
        g->push_ms = push_ms;
        g->fail_ms = fail_ms;
        g->last_ok = last_ok;
        g->interval_ms = interval;
        g->first_push_ms = first;
        g->fams = calloc(nf + 1, sizeof(*g->fams));
        if (!g->fams)
            abort();
        g->cap = nf + 1;
    }
    for (uint32_t fi = 0; g && fi < nf && !rd->bad; fi++) {
        push_family_t *f = batch_alloc(batch, sizeof(*f));
        memset(f, 0, sizeof(*f));
        f->name = rd_str(rd, &st);
        f->help = rd_u8(rd) ? rd_str(rd, &st) : NULL;
        f->type = (expfmt_type_t)rd_u8(rd);
        f->push_ms = (int64_t)rd_u64(rd);
        f->n = rd_count(rd, 32);
        f->batch = batch;
        f->metrics = batch_alloc(batch, (f->n ? f->n : 1) * sizeof(push_metric_t));
        memset(f->metrics, 0, (f->n ? f->n : 1) * sizeof(push_metric_t));
        for (size_t m = 0; m < f->n && !rd->bad; m++) {
            push_metric_t *pm = &f->metrics[m];
            uint32_t no = numbered ? rd_u32(rd) : 0;
            if (no) {
                if (no > nsets) {
                    rd->bad = true;
                    break;
                }
                pm->labels = sets[no - 1].v;
                pm->nlabels = sets[no - 1].n;
            } else {
                pm->nlabels = rd_count(rd, 8);
                label_t *ls = arena_alloc(scratch, (pm->nlabels ? pm->nlabels : 1) * sizeof(label_t));
                for (uint32_t l = 0; l < pm->nlabels; l++) {
                    ls[l].name = rd_str(rd, &st);
                    ls[l].value = rd_str(rd, &st);
                }
                pm->labels = labelset_intern(&st, ls, pm->nlabels);
                if (numbered) {
                    if (nsets == setcap) {
                        setcap = setcap ? 2 * setcap : 64;
                        sets = realloc(sets, setcap * sizeof(*sets));
                        if (!sets)
                            abort(); /* as batch_alloc: restore has no way back */
                    }
                    sets[nsets].v = pm->labels;
                    sets[nsets++].n = pm->nlabels;
                }
            }
            pm->value = rd_f64(rd);
            double sum = rd_f64(rd), count = rd_f64(rd);
            pm->nq = rd_count(rd, 16);
            /* A counter's or gauge's sum and count are 0 (written as such: metric_sum) */
            bool complex =
                f->type == EXPFMT_SUMMARY || f->type == EXPFMT_HISTOGRAM || f->type == EXPFMT_GAUGE_HISTOGRAM;
            if (complex || pm->nq || dbits_of(sum) || dbits_of(count)) {
                push_mx_t *x = pm->x = batch_alloc(batch, sizeof(*pm->x));
                *x = (push_mx_t){.sum = sum, .count = count};
                x->qb = batch_alloc(batch, (pm->nq ? pm->nq : 1) * sizeof(double));
                x->qv = batch_alloc(batch, (pm->nq ? pm->nq : 1) * sizeof(double));
                for (uint32_t q = 0; q < pm->nq; q++) {
                    x->qb[q] = rd_f64(rd);
                    x->qv[q] = rd_f64(rd);
                }
            }
        }
        if (rd->bad || f->type > EXPFMT_UNKNOWN || group_family(g, f->name)) {
            rd->bad = true;
            break;
        }
        f->shape = family_shape(f);
        size_t pos = g->nfams; /* insert sorted */
        while (pos > 0 && strcmp(g->fams[pos - 1]->name, f->name) > 0) {
            g->fams[pos] = g->fams[pos - 1];
            pos--;
        }
        g->fams[pos] = f;
        g->nfams++;
        batch->refs++;
        type_ref(r, f->name, f->type);
    }
    if (g && rd->bad) {
        /* Not half a group: a bad record leaves none (a snapshot piece or WAL delta that fails
         * its checksum never gets here; this is for bytes that pass it yet do not parse). */
        bool owned = batch->refs > 0;
        group_unlink_free(r, g); /* releasing its last family frees the batch */
        g = NULL;
        if (owned)
            batch = NULL;
    }
    if (g)
        g->shape = group_shape(g);
    if (batch)
        batch->nsets = st.sn;
    strtab_free(&st);
    if (batch && batch->refs == 0)
        batch_free(batch);
    free(sets);
}

static void registry_clear_locked(push_registry_t *r)
{
    for (size_t i = 0; i < r->gcap; i++)
        while (r->gtab[i])
            group_unlink_free(r, r->gtab[i]);
}

int push_registry_restore(push_registry_t *r, const void *data, size_t len)
{
    push_reader_t rd = {data, (const uint8_t *)data + len, false};
    const char *magic = rd_bytes(&rd, 4);
    if (!magic || memcmp(magic, "SPG1", 4) != 0)
        return -1;
    arena_t *scratch = arena_create(0);
    if (!scratch)
        return -1;
    pthread_mutex_lock(&r->mu);
    registry_clear_locked(r);
    uint32_t ng = rd_count(&rd, 4);
    for (uint32_t gi = 0; gi < ng && !rd.bad; gi++)
        rd_group(r, &rd, scratch, false);
    bool bad = rd.bad || rd.p != rd.end;
    if (bad)
        registry_clear_locked(r);
    pthread_mutex_unlock(&r->mu);
    arena_destroy(scratch);
    return bad ? -1 : 0;
}

/* Sets a group's values from a 'V' record; the group must have the shape the record was made
 * for (same number of slots), else the record is skipped. */
static void rd_values(push_registry_t *r, push_reader_t *rd, arena_t *scratch)
{
    push_strtab_t st = {.a = scratch};
    const char *key = rd_str(rd, &st);
    strtab_free(&st);
    int64_t push_ms = (int64_t)rd_u64(rd);
    double interval = rd_f64(rd);
    int64_t first = (int64_t)rd_u64(rd);
    uint32_t n = rd_count(rd, 8);
    if (rd->bad)
        return;
    push_group_t *g = group_find(r, key, push_hash_str(key));
    if (!g || group_value_count(g) != n) {
        rd_bytes(rd, (size_t)n * 8);
        return;
    }
    for (size_t f = 0; f < g->nfams; f++) {
        g->fams[f]->push_ms = push_ms;
        for (size_t m = 0; m < g->fams[f]->n; m++) {
            push_metric_t *pm = &g->fams[f]->metrics[m];
            pm->value = rd_f64(rd);
            double sum = rd_f64(rd), count = rd_f64(rd);
            if (pm->x) {
                pm->x->sum = sum;
                pm->x->count = count;
            }
            for (uint32_t q = 0; q < pm->nq; q++)
                pm->x->qv[q] = rd_f64(rd);
        }
    }
    g->push_ms = push_ms;
    g->interval_ms = interval;
    g->first_push_ms = first;
    g->last_ok = true;
}

int push_registry_apply_delta(push_registry_t *r, const void *data, size_t len)
{
    push_reader_t rd = {data, (const uint8_t *)data + len, false};
    arena_t *scratch = arena_create(0);
    if (!scratch)
        return -1;
    pthread_mutex_lock(&r->mu);
    while (!rd.bad && rd.p < rd.end) {
        uint8_t kind = rd_u8(&rd);
        switch (kind) {
        case 'G': rd_group(r, &rd, scratch, false); break;
        case 'S': rd_group(r, &rd, scratch, true); break;
        case 'V': rd_values(r, &rd, scratch); break;
        case 'F':
        case 'D': {
            push_strtab_t st = {.a = scratch};
            labels_t grouping;
            char *key = rd_grouping(&rd, &st, scratch, &grouping);
            strtab_free(&st);
            int64_t fail_ms = kind == 'F' ? (int64_t)rd_u64(&rd) : 0;
            if (rd.bad)
                break;
            uint64_t h = push_hash_str(key);
            push_group_t *g = group_find(r, key, h);
            if (kind == 'D') {
                if (g)
                    group_unlink_free(r, g);
            } else {
                if (!g)
                    g = group_create(r, &grouping, key, h);
                g->fail_ms = fail_ms;
                g->last_ok = false;
            }
            break;
        }
        case 'W': registry_clear_locked(r); break;
        default: rd.bad = true;
        }
        arena_reset(scratch);
    }
    pthread_mutex_unlock(&r->mu);
    arena_destroy(scratch);
    return rd.bad ? -1 : 0;
}
