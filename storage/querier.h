/*
 * querier — the one interface through which PromQL, remote read, the API's series/labels
 * endpoints and the dashboard read stored data, whatever holds it (the live head, roll-ups, an
 * in-memory store in tests).
 *
 * A querier is a struct whose first member is a pointer to a const table of functions
 * (querier_ops_t); implementations embed `querier_t` first and fill the table. Selecting gives a
 * series set; each series is its labels plus its data as chunks (storage/chunk.h): Prometheus' XOR
 * chunks, or, for the head's chunks of integer values, sluice's smaller integer encoding, so
 *   - remote read STREAMED_XOR_CHUNKS ships XOR chunk bytes as they are (and transcodes the
 *     others);
 *   - everyone else iterates samples with querier_iter_t, clipped to [mint, maxt].
 * Roll-up data is presented the same way: one synthetic sample per bucket (at the bucket's last
 * millisecond) whose value is the aggregate the hinted function needs (storage/querier_tiered.h
 * has the rules).
 *
 * Ownership: a series returned by querier_set_next, its labels and its chunk bytes belong to the
 * set and stay valid until the next call to querier_set_next or querier_set_free (the labels until
 * querier_set_free where the set says so: querier_set_labels_stable). Strings and
 * arrays from label_names/label_values are allocated in the caller's arena. Series come out
 * sorted by labels (labels_compare), each once.
 *
 * Thread safety: a querier may be used by one thread at a time; any number of queriers may be
 * open at once, concurrently with appends.
 */
#ifndef SLUICE_STORAGE_QUERIER_H
#define SLUICE_STORAGE_QUERIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/labels/labels.h"
#include "internal/labels/matcher.h"
#include "internal/util/arena.h"
#include "storage/chunk.h"

/* What the caller will do with the data; lets the store pick a tier. All fields optional (0 /
 * NULL = unknown): a plain select returns raw samples where they exist. */
typedef struct {
    int64_t start_ms, end_ms; /* evaluation range of the query */
    int64_t step_ms;          /* query step; 0 for instant queries */
    int64_t range_ms;         /* the range of the range-vector selector, 0 if none */
    const char *func;         /* function applied to the selector: "rate", "max_over_time", ... */
    /* Opt-in to approximate answers: the store may serve roll-ups at the query step even where raw
     * samples exist (querier_tiered.h, "step mode"). false: raw samples wherever they exist. */
    bool rollup_step;
} querier_hints_t;

typedef struct {
    int64_t mint, maxt;   /* first and last sample timestamp in the chunk (inclusive) */
    const uint8_t *bytes; /* the chunk, header included, in encoding enc */
    size_t len;
    uint8_t enc; /* CHUNK_ENC_XOR (0, what every store but the head hands out) or CHUNK_ENC_INT */
} querier_chunk_t;

typedef struct {
    labels_t labels;
    const querier_chunk_t *chunks; /* time-ordered, non-overlapping */
    size_t nchunks;
    /* Samples with t < rollup_until are synthetic roll-up samples, one per bucket of width
     * rollup_res_ms (see storage/querier_tiered.h for their timestamps and values); the rest
     * are raw. Both 0 when every sample is raw. */
    int64_t rollup_until;
    int64_t rollup_res_ms;
} querier_series_t;

typedef struct querier_set querier_set_t;

/* What kind of failure a set's error is, so the HTTP layer can answer as Prometheus does. */
typedef enum {
    QUERIER_ERR_INTERNAL = 0, /* local storage failed: 500 */
    QUERIER_ERR_REMOTE,       /* a remote store answered badly (fall-through, fail mode): 422 */
    QUERIER_ERR_UNAVAILABLE,  /* a remote store could not be reached or timed out: 503 */
} querier_err_kind_t;

typedef struct {
    const querier_series_t *(*next)(querier_set_t *set);
    const char *(*error)(querier_set_t *set);
    void (*free)(querier_set_t *set);
    /* Optional (NULL = none). Prometheus-style warnings of a partial answer (a remote store that
     * failed while the local data still answered): count, and the messages in *out, owned by the
     * set. Complete once next() returned NULL. */
    size_t (*warnings)(querier_set_t *set, const char *const **out);
    /* Optional (NULL = QUERIER_ERR_INTERNAL): the kind of the error error() reports. */
    querier_err_kind_t (*error_kind)(querier_set_t *set);
    /* Optional (NULL = false): true when the labels of every series the set returns stay valid
     * until querier_set_free, not only until the next call -- a reader that keeps the set open
     * can then keep them instead of a copy (the PromQL engine: tens of MB for a selector of tens
     * of thousands of series). */
    bool (*labels_stable)(querier_set_t *set);
} querier_set_ops_t;
struct querier_set {
    const querier_set_ops_t *ops;
};

typedef struct querier querier_t;
typedef struct {
    /* Series matching every matcher (n >= 1; see matcher.h) with samples in [mint, maxt].
     * Returns a set (never NULL except on OOM); errors surface through querier_set_error. */
    querier_set_t *(*select)(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                             const querier_hints_t *hints);
    /* Sorted distinct label names / values of `name` among series matching ms (n may be 0: all
     * series) within [mint, maxt]. Returns 0, or -1 with a message in err. */
    int (*label_names)(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, arena_t *a,
                       const char ***out, size_t *count, char *err, size_t errlen);
    int (*label_values)(querier_t *q, const char *name, const matcher_t *const *ms, size_t n, int64_t mint,
                        int64_t maxt, arena_t *a, const char ***out, size_t *count, char *err, size_t errlen);
    void (*close)(querier_t *q);
} querier_ops_t;
struct querier {
    const querier_ops_t *ops;
};

static inline querier_set_t *querier_select(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint,
                                            int64_t maxt, const querier_hints_t *hints)
{
    return q->ops->select(q, ms, n, mint, maxt, hints);
}
/* NULL at the end or on error (check querier_set_error). */
static inline const querier_series_t *querier_set_next(querier_set_t *s)
{
    return s->ops->next(s);
}
/* NULL if no error; the message is owned by the set. */
static inline const char *querier_set_error(querier_set_t *s)
{
    return s->ops->error(s);
}
/* Warnings of the set (see querier_set_ops_t.warnings); 0 when it has none. */
static inline size_t querier_set_warnings(querier_set_t *s, const char *const **out)
{
    *out = NULL;
    return s->ops->warnings ? s->ops->warnings(s, out) : 0;
}
static inline querier_err_kind_t querier_set_error_kind(querier_set_t *s)
{
    return s->ops->error_kind ? s->ops->error_kind(s) : QUERIER_ERR_INTERNAL;
}
static inline bool querier_set_labels_stable(querier_set_t *s)
{
    return s->ops->labels_stable && s->ops->labels_stable(s);
}
/* s may be NULL. */
static inline void querier_set_free(querier_set_t *s)
{
    if (s)
        s->ops->free(s);
}
static inline int querier_label_names(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                                      arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    return q->ops->label_names(q, ms, n, mint, maxt, a, out, count, err, errlen);
}
static inline int querier_label_values(querier_t *q, const char *name, const matcher_t *const *ms, size_t n,
                                       int64_t mint, int64_t maxt, arena_t *a, const char ***out, size_t *count,
                                       char *err, size_t errlen)
{
    return q->ops->label_values(q, name, ms, n, mint, maxt, a, out, count, err, errlen);
}
/* q may be NULL. */
static inline void querier_close(querier_t *q)
{
    if (q)
        q->ops->close(q);
}

/* Sample iterator over one series' chunks, clipped to [mint, maxt]. Reads the series' memory
 * (valid until the set moves on); needs no cleanup. */
typedef struct {
    const querier_series_t *s;
    size_t ci;
    bool open;
    chunk_iter_t it;
    int64_t mint, maxt;
} querier_iter_t;

static inline void querier_iter_init(querier_iter_t *it, const querier_series_t *s, int64_t mint, int64_t maxt)
{
    it->s = s;
    it->ci = 0;
    it->open = false;
    it->mint = mint;
    it->maxt = maxt;
}

/* Next sample (t, v) in time order; false at the end. Stale markers come out bit-exact. */
static inline bool querier_iter_next(querier_iter_t *it, int64_t *t, double *v)
{
    for (;;) {
        if (!it->open) {
            while (it->ci < it->s->nchunks && it->s->chunks[it->ci].maxt < it->mint)
                it->ci++;
            if (it->ci >= it->s->nchunks || it->s->chunks[it->ci].mint > it->maxt)
                return false;
            const querier_chunk_t *c = &it->s->chunks[it->ci];
            chunk_iter_init(&it->it, c->enc, c->bytes, c->len);
            it->open = true;
        }
        while (chunk_iter_next(&it->it, t, v)) {
            if (*t < it->mint)
                continue;
            if (*t > it->maxt)
                return false;
            return true;
        }
        it->open = false;
        it->ci++;
    }
}

#endif
