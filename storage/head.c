/*
 * head — the raw tier: per-series chunks in a ring of time blocks (contract in head.h).
 *
 * Time is cut into blocks of block_ms aligned to the Unix epoch (block number bn = floor(t / B)).
 * Every chunk lies inside one block: a chunk is cut when it reaches CUT_SAMPLES (240) samples or
 * when the next sample belongs to another block. At the usual 10 s push interval the block
 * boundary cuts first (90 samples per 15-minute block); 240 only matters for faster series. The
 * retained window starts at min_valid, a block boundary, moved forward by head_expire(now) to
 * floor((now - retention) / B) * B.
 *
 * Memory is the point of this layout (goal: <= 1 KB per active series, 2h at 10 s). Per series
 * (the index payload, one allocation with the index entry), 72 bytes:
 *
 *   field        bytes  meaning
 *   first        8      oldest closed chunk record (below), NULL if none; records form a list
 *   aux          8      the head owner's slot (storage: the roll-up's hint), NULL at creation
 *   obuf         8      open chunk bytes (malloc'd, grown in small steps, not doubled)
 *   ot, ovbits   16     open chunk encoder state: last encoded timestamp, value bits (XOR)
 *                       or value (integer chunk)
 *   pend_t/bits  16     the newest sample, kept un-encoded so a later sample in the same second
 *                       can replace it; encoded when a sample of a later second arrives
 *   onbits       4      bits written after the open chunk's 2-byte header
 *   otdelta      4      last timestamp delta (a chunk is cut before a delta exceeds INT32_MAX)
 *   ocap         2      obuf's allocated size
 *   olead/otrail 2      the open chunk's XOR window, or its integer layout's state (open_iview)
 *   flags        1      PENDING, OPEN, MARK, FRACTION, OINT
 *
 * An open chunk whose values are all integers so far (most of Flink's) is a chunk_int chunk in
 * its appendable layout (F_OINT; ~10 bits per counter sample where XOR takes ~22); the first
 * value it cannot hold (a fraction, a stale marker) turns it into XOR for the rest of its life.
 * The open chunk's first timestamp is not stored: it is the varint at obuf[2] in both encodings
 * (byte-aligned after the count). A closed chunk is one record in a block slab:
 *
 *   offset  size  field (little-endian)
 *   0       6     next record of the same series (the pointer's low 48 bits, 0 at the newest)
 *   6       3     span = maxt - mint (< 2^24 ms)
 *   9       2     len = chunk bytes (low 15 bits); top bit set: a chunk_int chunk, else XOR
 *   11      len   the chunk, header included; mint is its first varint (in both encodings)
 *
 * so a closed chunk costs its encoded bytes + 11, with no per-series array to grow. When a chunk
 * is cut and all its values are integers (F_FRACTION says when they are not, without decoding),
 * it is re-encoded as chunk_int (storage/chunk_int.c) and kept so if that is smaller: ~1 byte per
 * sample instead of ~2.7 for a Flink counter (an integer open chunk is kept as it is when its
 * closed layouts are not smaller).
 *
 * Closed chunk records are copied at their exact length into the slab of their block: a list of
 * 64 KiB pages, bump-allocated under a mutex (a cut happens once per 120 samples of a series, so the
 * mutex is cold). Dropping a block never walks samples:
 *
 *   head_expire(now)          min_valid := block start of now - retention (appends below it
 *                             now fail with TOO_OLD, and no chunk is cut into a block below it)
 *     sweep pass, sliced      for every series, `budget` at a time under its shard's write lock:
 *                             unlink chunks with mint < pass_min_valid, drop an expired open
 *                             chunk / pending sample, cut an idle open chunk into its slab,
 *                             remove a series found empty on two passes in a row
 *     end of pass             free the slab pages of every block < pass_min_valid wholesale
 *
 * No reader can still see those pages: readers copy chunk bytes only while holding the series'
 * shard (read) lock, and only chunks still linked from the series.
 *
 * Locks: index shard rwlock (read to append or read a series, write to sweep) -> stripe mutex
 * (per series, by id; guards the payload) -> blocks_lock (slab allocation). expire_lock
 * serialises head_expire callers.
 */
#include "storage/head.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal/util/varint.h"
#include "storage/chunk.h"

#define NSTRIPES 4096
/* Slab pages are mmap'd (not malloc'd): dropping a block returns its memory to the system at
 * once instead of leaving 64 KiB holes in the heap that fragment it. A block's first page is
 * 64 KiB and each further one twice the previous, up to 1 MiB: little slack for a small head,
 * few mappings for a big one (1M series x 15 minutes at 10 s is ~150 MB per block). Untouched
 * page tails are never resident. */
#define SLAB_PAGE_MIN (64 * 1024)
#define SLAB_PAGE_MAX (1024 * 1024)
/* Prometheus cuts at 120; any count <= 65535 is a valid XOR chunk for every decoder. */
#define CUT_SAMPLES 240
/* Worst case bytes of one encoded sample (chunk_xor.c: 145 bits): while this much room is free,
 * an append needs no size check (open_reserve). */
#define OPEN_RESERVE CHUNK_XOR_MAX_RECORD_BYTES
/* A new open chunk's buffer: all of malloc's 48-byte chunk, where the first sample takes 16
 * bytes and a steady one 1-4. */
#define OPEN_INIT_BYTES 40
/* A record's 16-bit length field: the chunk's length, and in the top bit its encoding. */
#define REC_LEN_MASK 0x7fff
#define REC_INT 0x8000
/* Cut before the open chunk could outgrow a record's length (at 240 samples of at most 19 bytes
 * each it never comes near). */
#define OPEN_MAX_BYTES (REC_LEN_MASK - 64)
#define REC_HDR 11
/* A record's span field is 24 bits: a chunk is cut before it could span more (the 15-minute
 * blocks of a running sluice span 900,000 ms at most). */
#define SPAN_MAX ((1u << 24) - 1)
/* A record's next field holds 48 bits of address: Linux hands a process addresses below 2^47
 * (x86-64, and arm64 with 48-bit or default 52-bit address spaces) unless it asks for higher
 * ones, which sluice never does. A slab page above this is given back and counted as OOM. */
#define REC_ADDR_LIMIT ((uintptr_t)1 << 48)
/* A closed chunk is kept as chunk_int only when that is smaller than its XOR bytes; this bounds
 * the stack buffer it is encoded into (a 240-sample XOR chunk of integers rarely passes 2 KB). */
#define INT_MAX_BYTES 2048

/* F_OINT: the open chunk is a chunk_int chunk (its appendable layout) and the encoder fields mean
 * what open_iview says. F_FRACTION: the (XOR) open chunk holds a value chunk_int cannot (a
 * fraction, NaN, -0.0...), so it stays XOR when cut, without decoding it to find out. */
enum { F_PENDING = 1, F_OPEN = 2, F_MARK = 4, F_FRACTION = 8, F_OINT = 16 };

typedef struct {
    uint8_t *first;
    void *aux;
    uint8_t *obuf;
    int64_t ot;
    uint64_t ovbits;
    int64_t pend_t;
    uint64_t pend_bits; /* raw bits: NaN payloads (stale markers) survive exactly */
    uint32_t onbits;
    int32_t otdelta;
    uint16_t ocap;
    uint8_t olead, otrail;
    uint8_t flags;
} hseries_t;

typedef struct slab_page {
    struct slab_page *next;
    uint32_t used, cap;
    uint8_t data[];
} slab_page_t;

typedef struct block {
    int64_t bn;
    uint32_t npages;
    slab_page_t *pages;
    uint64_t bytes; /* allocated page bytes */
    struct block *next;
} block_t;

struct head {
    index_t *ix;
    int64_t retention_ms, block_ms;
    bool (*may_remove)(void *ud, uint64_t id);
    void *may_remove_ud;
    _Atomic int64_t min_valid;
    _Atomic uint64_t next_id;
    pthread_mutex_t stripes[NSTRIPES];

    pthread_mutex_t blocks_lock;
    block_t *blocks; /* ascending bn */

    pthread_mutex_t expire_lock;
    bool pass_active;
    uint32_t pass_shard, pass_cursor;
    int64_t pass_min_valid, pass_now;

    _Atomic uint64_t n_chunks, closed_bytes, slab_bytes;
    _Atomic uint64_t ooo, too_old, created, removed;
    /* Counted on every append (once per call or batch, see tally_t): one shared counter would
     * bounce its cache line between appending threads, so these are spread over lines (the
     * struct is allocated line-aligned). */
    struct {
        _Alignas(64) _Atomic uint64_t appended, replaced, open_cap_bytes;
    } per_line[64];
    _Alignas(64) _Atomic int64_t min_t, max_t;
};

/* What appends under stripe locks add to the shared counters, summed over a call or batch and
 * added once at its end (tally_flush): per sample, those atomic adds on shared lines cost more
 * than the rest of a steady append's bookkeeping. */
typedef struct {
    uint64_t appended, replaced, too_old, ooo;
    int64_t min_t, max_t;
} tally_t;

static tally_t tally_init(void)
{
    return (tally_t){.min_t = INT64_MAX, .max_t = INT64_MIN};
}

/* The per_line counters of series payload s. */
#define LINE(h, s) ((h)->per_line[((uintptr_t)(s) >> 6) & 63])

static int64_t floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static double bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof(d));
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof(b));
    return b;
}

static pthread_mutex_t *stripe(head_t *h, uint64_t id)
{
    return &h->stripes[(id * 0x9E3779B97F4A7C15ULL) >> 52];
}

static void atomic_max64(_Atomic int64_t *p, int64_t v)
{
    int64_t cur = atomic_load_explicit(p, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak(p, &cur, v)) {
    }
}

static void atomic_min64(_Atomic int64_t *p, int64_t v)
{
    int64_t cur = atomic_load_explicit(p, memory_order_relaxed);
    while (v < cur && !atomic_compare_exchange_weak(p, &cur, v)) {
    }
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

head_t *head_new(const head_options_t *o)
{
    head_t *h;
    if (posix_memalign((void **)&h, 64, sizeof(*h)) != 0)
        return NULL;
    memset(h, 0, sizeof(*h));
    h->retention_ms = o && o->retention_ms > 0 ? o->retention_ms : HEAD_DEFAULT_RETENTION_MS;
    if (o) {
        h->may_remove = o->may_remove;
        h->may_remove_ud = o->may_remove_ud;
    }
    h->block_ms = o && o->block_ms > 0 ? o->block_ms : HEAD_DEFAULT_BLOCK_MS;
    h->ix = index_new(sizeof(hseries_t), o ? o->max_series : 0);
    if (!h->ix) {
        free(h);
        return NULL;
    }
    atomic_init(&h->min_valid, INT64_MIN);
    atomic_init(&h->next_id, 1);
    atomic_init(&h->min_t, INT64_MAX);
    atomic_init(&h->max_t, INT64_MIN);
    for (int i = 0; i < NSTRIPES; i++)
        pthread_mutex_init(&h->stripes[i], NULL);
    pthread_mutex_init(&h->blocks_lock, NULL);
    pthread_mutex_init(&h->expire_lock, NULL);
    return h;
}

/* ---- chunk records and the open chunk ------------------------------------------------------ */

/* Little-endian fields of n <= 8 bytes. */
static uint64_t le_get(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

static void le_put(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint8_t *rec_next(const uint8_t *r)
{
    return (uint8_t *)(uintptr_t)le_get(r, 6);
}

static void rec_set_next(uint8_t *r, const uint8_t *n)
{
    assert((uintptr_t)n < REC_ADDR_LIMIT);
    le_put(r, (uintptr_t)n, 6);
}

static uint32_t rec_span(const uint8_t *r)
{
    return (uint32_t)le_get(r + 6, 3);
}

static uint16_t rec_len(const uint8_t *r)
{
    return (uint16_t)(le_get(r + 9, 2) & REC_LEN_MASK);
}

static uint8_t rec_enc(const uint8_t *r)
{
    return (le_get(r + 9, 2) & REC_INT) ? CHUNK_ENC_INT : CHUNK_ENC_XOR;
}

static const uint8_t *rec_bytes(const uint8_t *r)
{
    return r + REC_HDR;
}

/* First timestamp of an XOR chunk: Go's varint right after the header (byte-aligned). */
static int64_t chunk_first_t(const uint8_t *b, size_t len)
{
    if (len <= CHUNK_XOR_HEADER_BYTES)
        return 0;
    const uint8_t *p = b + CHUNK_XOR_HEADER_BYTES;
    int64_t t = 0;
    varint_get_signed(&p, b + len, &t); /* sluice wrote it: it is whole */
    return t;
}

static int64_t rec_mint(const uint8_t *r)
{
    return chunk_first_t(rec_bytes(r), rec_len(r));
}

static size_t open_len(const hseries_t *s)
{
    return CHUNK_XOR_HEADER_BYTES + (size_t)((s->onbits + 7) / 8);
}

static uint16_t open_num(const hseries_t *s)
{
    return (uint16_t)(s->obuf[0] << 8 | s->obuf[1]);
}

static int64_t open_mint(const hseries_t *s)
{
    return chunk_first_t(s->obuf, open_len(s));
}

/* The codec's appender over the open chunk (it borrows obuf; store it back with open_store). */
static void open_view(const hseries_t *s, chunk_xor_appender_t *a)
{
    *a = (chunk_xor_appender_t){.bytes = s->obuf,
                                .cap = s->ocap,
                                .nbits = s->onbits,
                                .num = open_num(s),
                                .t = s->ot,
                                .tdelta = s->otdelta,
                                .vbits = s->ovbits,
                                .leading = s->olead,
                                .trailing = s->otrail};
}

static void open_store(hseries_t *s, const chunk_xor_appender_t *a)
{
    assert(a->cap <= UINT16_MAX && a->nbits <= UINT32_MAX);
    s->obuf = a->bytes;
    s->ocap = (uint16_t)a->cap;
    s->onbits = (uint32_t)a->nbits;
    s->ot = a->t;
    s->otdelta = (int32_t)a->tdelta;
    s->ovbits = a->vbits;
    s->olead = a->leading;
    s->otrail = a->trailing;
}

/* The integer open chunk's appender over obuf (store it back with open_istore). The XOR
 * encoder's fields hold its state: ot, otdelta, ovbits = last timestamp, timestamp delta and
 * value; onbits = bits after the count; olead = the Rice parameter; otrail = header bytes (low 6
 * bits), tmode (bit 6), predictor (bit 7). The predictor's D_1 is the header's last 4 bytes. */
static void open_iview(const hseries_t *s, chunk_int_appender_t *a)
{
    uint8_t hdr = s->otrail & 0x3f;
    *a = (chunk_int_appender_t){.bytes = s->obuf,
                                .cap = s->ocap,
                                .nbits = (uint64_t)s->onbits + 16,
                                .num = open_num(s),
                                .k = s->olead,
                                .tmode = (s->otrail >> 6) & 1,
                                .pred = s->otrail >> 7,
                                .hdr = hdr,
                                .t = s->ot,
                                .td = s->otdelta,
                                .v = (int64_t)s->ovbits};
    if (a->pred)
        a->d1v = (int32_t)(uint32_t)le_get(s->obuf + hdr - 4, 4);
}

static void open_istore(hseries_t *s, const chunk_int_appender_t *a)
{
    assert(a->bytes == s->obuf && a->num >= 1 && a->hdr < 64 && a->nbits >= 16 && a->td <= INT32_MAX);
    s->onbits = (uint32_t)(a->nbits - 16);
    s->ot = a->t;
    s->otdelta = (int32_t)a->td;
    s->ovbits = (uint64_t)a->v;
    s->olead = a->k;
    s->otrail = (uint8_t)(a->hdr | a->tmode << 6 | a->pred << 7);
}

/* The integer chunk bytes[0, len) as XOR (a new chunk in x, exactly sized). 0, or -1 on OOM or if
 * the bytes do not decode. */
static int int_to_xor(const uint8_t *bytes, size_t len, chunk_xor_appender_t *x)
{
    if (chunk_xor_appender_init(x) < 0)
        return -1;
    chunk_int_iter_t it;
    chunk_int_iter_init(&it, bytes, len);
    int64_t t;
    double v;
    while (chunk_int_iter_next(&it, &t, &v))
        if (chunk_xor_append(x, t, v) < 0)
            break;
    if (it.err || chunk_xor_num(x) != it.num) {
        chunk_xor_appender_free(x);
        return -1;
    }
    chunk_xor_appender_compact(x);
    return 0;
}

static void series_release(head_t *h, hseries_t *s)
{
    if (s->flags & F_OPEN) {
        atomic_fetch_sub_explicit(&LINE(h, s).open_cap_bytes, s->ocap, memory_order_relaxed);
        free(s->obuf);
        s->obuf = NULL;
        atomic_fetch_sub(&h->n_chunks, 1);
    }
    for (const uint8_t *r = s->first; r; r = rec_next(r)) {
        atomic_fetch_sub(&h->closed_bytes, rec_len(r));
        atomic_fetch_sub(&h->n_chunks, 1);
    }
    s->first = NULL;
    s->flags = 0;
}

static void payload_free(void *ud, index_series_t *is)
{
    series_release(ud, index_series_payload(is));
}

static void page_unmap(slab_page_t *p)
{
    munmap(p, sizeof(slab_page_t) + p->cap);
}

static void blocks_free_list(block_t *b)
{
    while (b) {
        block_t *nb = b->next;
        slab_page_t *p = b->pages;
        while (p) {
            slab_page_t *np = p->next;
            page_unmap(p);
            p = np;
        }
        free(b);
        b = nb;
    }
}

void head_free(head_t *h)
{
    if (!h)
        return;
    index_free(h->ix, payload_free, h);
    blocks_free_list(h->blocks);
    for (int i = 0; i < NSTRIPES; i++)
        pthread_mutex_destroy(&h->stripes[i]);
    pthread_mutex_destroy(&h->blocks_lock);
    pthread_mutex_destroy(&h->expire_lock);
    free(h);
}

index_t *head_index(head_t *h)
{
    return h->ix;
}

int64_t head_min_valid_time(const head_t *h)
{
    return atomic_load(&((head_t *)h)->min_valid);
}

/* ---- slabs --------------------------------------------------------------------------------- */

/* Copies a closed chunk into block bn's slab as a record with next = NULL. NULL if the block is
 * outside the retained window (the chunk is simply dropped) or on OOM. */
static uint8_t *slab_copy(head_t *h, int64_t bn, const uint8_t *src, size_t len, uint8_t enc, uint32_t span)
{
    assert(len <= REC_LEN_MASK);
    size_t need = REC_HDR + len;
    pthread_mutex_lock(&h->blocks_lock);
    uint8_t *res = NULL;
    int64_t mv = atomic_load(&h->min_valid);
    if (mv != INT64_MIN && bn < floordiv(mv, h->block_ms))
        goto out;
    block_t **pp = &h->blocks;
    while (*pp && (*pp)->bn < bn)
        pp = &(*pp)->next;
    block_t *b = *pp;
    if (!b || b->bn != bn) {
        b = calloc(1, sizeof(*b));
        if (!b)
            goto out;
        b->bn = bn;
        b->next = *pp;
        *pp = b;
    }
    slab_page_t *p = b->pages;
    if (!p || p->cap - p->used < need) {
        size_t size = b->npages < 8 ? (size_t)SLAB_PAGE_MIN << b->npages : SLAB_PAGE_MAX;
        if (size > SLAB_PAGE_MAX)
            size = SLAB_PAGE_MAX;
        if (size < sizeof(slab_page_t) + need)
            size = (sizeof(slab_page_t) + need + 4095) & ~(size_t)4095;
        slab_page_t *np = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (np == MAP_FAILED)
            goto out;
        if ((uintptr_t)np + size > REC_ADDR_LIMIT) {
            munmap(np, size);
            goto out;
        }
        uint32_t cap = (uint32_t)(size - sizeof(slab_page_t));
        b->npages++;
        np->used = 0;
        np->cap = cap;
        np->next = b->pages;
        b->pages = np;
        b->bytes += sizeof(slab_page_t) + cap;
        atomic_fetch_add(&h->slab_bytes, sizeof(slab_page_t) + cap);
        p = np;
    }
    res = p->data + p->used;
    p->used += (uint32_t)need;
    assert(span <= SPAN_MAX);
    rec_set_next(res, NULL);
    le_put(res + 6, span, 3);
    le_put(res + 9, len | (enc == CHUNK_ENC_INT ? REC_INT : 0), 2);
    memcpy(res + REC_HDR, src, len);
out:
    pthread_mutex_unlock(&h->blocks_lock);
    return res;
}

/* Frees every block whose start is below min_valid. */
static void slabs_free_before(head_t *h, int64_t min_valid)
{
    pthread_mutex_lock(&h->blocks_lock);
    block_t *dead = NULL, **tail = &dead;
    while (h->blocks && h->blocks->bn * h->block_ms < min_valid) {
        block_t *b = h->blocks;
        h->blocks = b->next;
        atomic_fetch_sub(&h->slab_bytes, b->bytes);
        b->next = NULL;
        *tail = b;
        tail = &b->next;
    }
    pthread_mutex_unlock(&h->blocks_lock);
    blocks_free_list(dead); /* outside the lock: freeing pages is the slow part */
}

/* ---- per-series appending (stripe lock held) ----------------------------------------------- */

/* Links record r as the newest closed chunk of s. */
static void link_record(head_t *h, hseries_t *s, uint8_t *r)
{
    if (!s->first) {
        s->first = r;
    } else {
        uint8_t *t = s->first;
        while (rec_next(t))
            t = rec_next(t);
        rec_set_next(t, r);
    }
    atomic_fetch_add(&h->closed_bytes, rec_len(r));
}

/* The closed chunk b[0..len) (encoding enc) re-encoded in chunk_int's closed layouts into out
 * (INT_MAX_BYTES), if all its values are integers (chunk_int_encode checks; F_FRACTION usually
 * spared the decoding) and that is smaller: its length, else 0 (keep the bytes as they are). */
static size_t recode_int(uint8_t enc, const uint8_t *b, size_t len, uint8_t *out)
{
    if (len < CHUNK_XOR_HEADER_BYTES)
        return 0;
    size_t num = (size_t)b[0] << 8 | b[1];
    if (num == 0 || num > CUT_SAMPLES)
        return 0;
    int64_t t[CUT_SAMPLES];
    double v[CUT_SAMPLES];
    chunk_iter_t it;
    chunk_iter_init(&it, enc, b, len);
    size_t n = 0;
    while (n < num && chunk_iter_next(&it, &t[n], &v[n]))
        n++;
    if (n != num || chunk_iter_err(&it))
        return 0;
    /* only if smaller than the XOR bytes: the capacity says so */
    return chunk_int_encode(t, v, n, out, len - 1 < INT_MAX_BYTES ? len - 1 : INT_MAX_BYTES);
}

/* Closes the open chunk: copies it into its block's slab and links it. keep_buf: the caller opens
 * the next chunk at once and reuses obuf for it (still counted in open_cap_bytes). Every series
 * of a push group cuts at the same block boundary; freeing all their buffers there and growing
 * new ones in small steps left tens of MB of holes in the heap that RSS never gave back. */
static void cut_chunk(head_t *h, hseries_t *s, bool keep_buf)
{
    assert(s->flags & F_OPEN);
    size_t len = open_len(s);
    int64_t mint = open_mint(s);
    uint8_t *r = NULL;
    if (len <= REC_LEN_MASK && (uint64_t)(s->ot - mint) <= SPAN_MAX) {
        uint8_t ibuf[INT_MAX_BYTES];
        uint8_t enc = (s->flags & F_OINT) ? CHUNK_ENC_INT : CHUNK_ENC_XOR;
        size_t ilen = (s->flags & F_FRACTION) ? 0 : recode_int(enc, s->obuf, len, ibuf);
        int64_t bn = floordiv(mint, h->block_ms);
        if (ilen)
            r = slab_copy(h, bn, ibuf, ilen, CHUNK_ENC_INT, (uint32_t)(s->ot - mint));
        else
            r = slab_copy(h, bn, s->obuf, len, enc, (uint32_t)(s->ot - mint));
    }
    if (r)
        link_record(h, s, r);
    else
        atomic_fetch_sub(&h->n_chunks, 1); /* expired block or OOM: the chunk is dropped */
    s->flags &= (uint8_t) ~(F_OPEN | F_FRACTION | F_OINT);
    if (keep_buf)
        return;
    atomic_fetch_sub_explicit(&LINE(h, s).open_cap_bytes, s->ocap, memory_order_relaxed);
    free(s->obuf);
    s->obuf = NULL;
    s->ocap = 0;
}

/* Grows obuf so sample (t, bits) fits. Steps of ~1/8 of the size, rounded to what malloc hands
 * out anyway (16-byte granules minus its 8-byte header), instead of the codec's doubling: the
 * open chunk is a tenth of a series' memory and doubling wastes a quarter of it on average.
 * While OPEN_RESERVE bytes are free nothing is computed; near the end of the buffer the record's
 * exact size decides, so the buffer does not keep a worst-case record (19 bytes, where a steady
 * series' sample takes 1-4) spare: with a quarter of a million series that spare room was ~5 MB. */
static int open_grow(head_t *h, hseries_t *s, size_t need, size_t used);

static int open_reserve(head_t *h, hseries_t *s, int64_t t, uint64_t bits)
{
    size_t used = open_len(s);
    if (used + OPEN_RESERVE <= s->ocap)
        return 0;
    chunk_xor_appender_t a;
    open_view(s, &a);
    uint64_t nbits = s->onbits + chunk_xor_record_bits(&a, t, bits_to_double(bits));
    size_t need = CHUNK_XOR_HEADER_BYTES + (size_t)((nbits + 7) / 8);
    if (need <= s->ocap)
        return 0;
    return open_grow(h, s, need, used);
}

/* Grows obuf to hold need bytes (used of them in use), in the steps open_reserve describes. */
static int open_grow(head_t *h, hseries_t *s, size_t need, size_t used)
{
    size_t want = need + (used >> 3) + 8;
    want = ((want + 8 + 15) & ~(size_t)15) - 8;
    if (want > UINT16_MAX)
        want = UINT16_MAX;
    uint8_t *p = realloc(s->obuf, want);
    if (!p)
        return -1;
    atomic_fetch_add_explicit(&LINE(h, s).open_cap_bytes, want - s->ocap, memory_order_relaxed);
    s->obuf = p;
    s->ocap = (uint16_t)want;
    return 0;
}

/* Appends an integer to the integer open chunk. The appender measures only near the end of the
 * buffer; obuf grows (by the exact size) only when the append did not fit. */
static int open_append_int(head_t *h, hseries_t *s, int64_t t, int64_t v)
{
    chunk_int_appender_t a;
    open_iview(s, &a);
    if (chunk_int_append(&a, t, v) < 0) {
        /* encode_sample cut the chunk before t could be 2^31 ms after its last sample or the
         * count could pass CUT_SAMPLES, and the caller checked v: only room can be missing */
        size_t need = chunk_int_append_size(&a, t, v);
        assert(need > s->ocap);
        if (open_grow(h, s, need, open_len(s)) < 0)
            return HEAD_ERR_NOMEM;
        a.bytes = s->obuf;
        a.cap = s->ocap;
        int rc = chunk_int_append(&a, t, v);
        assert(rc == 0);
        (void)rc;
    }
    open_istore(s, &a);
    return HEAD_OK;
}

/* A value chunk_int cannot hold arrives for an integer open chunk: the chunk goes on as XOR,
 * with the same samples. */
static int open_int_to_xor(head_t *h, hseries_t *s)
{
    chunk_xor_appender_t x;
    if (int_to_xor(s->obuf, open_len(s), &x) < 0)
        return -1;
    if (x.cap > UINT16_MAX) { /* CUT_SAMPLES samples of at most 19 bytes: never */
        chunk_xor_appender_free(&x);
        return -1;
    }
    atomic_fetch_add_explicit(&LINE(h, s).open_cap_bytes, x.cap - s->ocap, memory_order_relaxed);
    free(s->obuf);
    open_store(s, &x);
    s->flags &= (uint8_t)~F_OINT;
    return 0;
}

static int encode_sample(head_t *h, hseries_t *s, int64_t t, uint64_t bits)
{
    if (s->flags & F_OPEN) {
        /* The open chunk lies in the block of its newest sample (s->ot <= t): t stays in it iff
         * it is less than a block after that block's start, and then it is less than a block
         * after the chunk's first sample too, so the span check (which decodes the first
         * timestamp) only matters for blocks wider than a record's 24-bit span. */
        int64_t bstart = floordiv(s->ot, h->block_ms) * h->block_ms;
        bool cut = open_num(s) >= CUT_SAMPLES || t < bstart || t - bstart >= h->block_ms || t - s->ot > INT32_MAX ||
                   open_len(s) > OPEN_MAX_BYTES;
        if (!cut && h->block_ms > SPAN_MAX)
            cut = (uint64_t)(t - open_mint(s)) > SPAN_MAX;
        if (cut)
            cut_chunk(h, s, true);
    }
    double v = bits_to_double(bits);
    if (!(s->flags & F_OPEN)) {
        if (!s->obuf) { /* else cut just above: its buffer is reused */
            s->obuf = malloc(OPEN_INIT_BYTES);
            if (!s->obuf)
                return HEAD_ERR_NOMEM;
            s->ocap = OPEN_INIT_BYTES;
            atomic_fetch_add_explicit(&LINE(h, s).open_cap_bytes, s->ocap, memory_order_relaxed);
        }
        atomic_fetch_add(&h->n_chunks, 1);
        s->flags |= F_OPEN;
        if (chunk_int_holds(v)) {
            chunk_int_appender_t a;
            chunk_int_appender_init(&a, s->obuf, s->ocap);
            int rc = chunk_int_append(&a, t, (int64_t)v); /* a first sample takes <= 20 bytes */
            assert(rc == 0);
            (void)rc;
            open_istore(s, &a);
            s->flags |= F_OINT;
            return HEAD_OK;
        }
        chunk_xor_appender_t a;
        chunk_xor_appender_init_buf(&a, s->obuf, s->ocap);
        open_store(s, &a);
    } else if (s->flags & F_OINT) {
        if (chunk_int_holds(v))
            return open_append_int(h, s, t, (int64_t)v);
        if (open_int_to_xor(h, s) < 0)
            return HEAD_ERR_NOMEM;
    }
    if (open_reserve(h, s, t, bits) < 0)
        return HEAD_ERR_NOMEM;
    chunk_xor_appender_t a;
    open_view(s, &a);
    size_t cap0 = a.cap;
    if (chunk_xor_append(&a, t, bits_to_double(bits)) < 0)
        return HEAD_ERR_NOMEM;
    /* open_reserve made room, so the codec did not reallocate; stay correct if it ever does. */
    if (a.cap > UINT16_MAX) {
        chunk_xor_appender_compact(&a);
        assert(a.cap <= UINT16_MAX);
    }
    if (a.cap != cap0)
        atomic_fetch_add_explicit(&LINE(h, s).open_cap_bytes, a.cap - cap0, memory_order_relaxed);
    open_store(s, &a);
    if (!chunk_int_holds(v))
        s->flags |= F_FRACTION;
    return HEAD_OK;
}

/* Newest timestamp the series holds, or INT64_MIN. */
static int64_t series_last_t(const hseries_t *s)
{
    if (s->flags & F_PENDING)
        return s->pend_t;
    if (s->flags & F_OPEN)
        return s->ot;
    const uint8_t *r = s->first;
    if (!r)
        return INT64_MIN;
    while (rec_next(r))
        r = rec_next(r);
    return rec_mint(r) + rec_span(r);
}

static int check_locked(head_t *h, const hseries_t *s, int64_t t)
{
    if (t < atomic_load(&h->min_valid))
        return HEAD_ERR_TOO_OLD;
    int64_t last = series_last_t(s);
    if (last == INT64_MIN)
        return HEAD_OK;
    int64_t sec = floordiv(t, 1000), lsec = floordiv(last, 1000);
    if (sec < lsec)
        return HEAD_ERR_OUT_OF_ORDER;
    /* Same second is only replaceable while the sample is still pending. */
    if (sec == lsec && !(s->flags & F_PENDING))
        return HEAD_ERR_OUT_OF_ORDER;
    return HEAD_OK;
}

static void tally_refusal(tally_t *tl, int rc)
{
    tl->too_old += rc == HEAD_ERR_TOO_OLD;
    tl->ooo += rc == HEAD_ERR_OUT_OF_ORDER;
}

static void tally_flush(head_t *h, const tally_t *tl)
{
    if (tl->appended)
        atomic_fetch_add_explicit(&LINE(h, tl).appended, tl->appended, memory_order_relaxed);
    if (tl->replaced)
        atomic_fetch_add_explicit(&LINE(h, tl).replaced, tl->replaced, memory_order_relaxed);
    if (tl->too_old)
        atomic_fetch_add_explicit(&h->too_old, tl->too_old, memory_order_relaxed);
    if (tl->ooo)
        atomic_fetch_add_explicit(&h->ooo, tl->ooo, memory_order_relaxed);
    if (tl->max_t != INT64_MIN) {
        atomic_max64(&h->max_t, tl->max_t);
        atomic_min64(&h->min_t, tl->min_t);
    }
}

static void tally_time(tally_t *tl, int64_t t)
{
    if (t > tl->max_t)
        tl->max_t = t;
    if (t < tl->min_t)
        tl->min_t = t;
}

static int append_locked(head_t *h, hseries_t *s, int64_t t, double v, tally_t *tl)
{
    int rc = check_locked(h, s, t);
    if (rc) {
        tally_refusal(tl, rc);
        return rc;
    }
    uint64_t bits = double_to_bits(v);
    if ((s->flags & F_PENDING) && floordiv(t, 1000) == floordiv(s->pend_t, 1000)) {
        s->pend_t = t;
        s->pend_bits = bits;
        tl->replaced++;
        tally_time(tl, t);
        return HEAD_OK;
    }
    if (s->flags & F_PENDING) {
        rc = encode_sample(h, s, s->pend_t, s->pend_bits);
        if (rc)
            return rc;
    }
    s->pend_t = t;
    s->pend_bits = bits;
    s->flags = (uint8_t)((s->flags | F_PENDING) & ~F_MARK);
    tl->appended++;
    tally_time(tl, t);
    return HEAD_OK;
}

/* ---- public append API --------------------------------------------------------------------- */

static int get_or_create(head_t *h, const labels_t *ls, uint64_t hash, uint64_t new_id, bool look_first,
                         index_ref_t *ref, bool *created)
{
    int rc = index_get_or_create(h->ix, ls, hash, new_id, look_first, ref, created);
    if (rc == INDEX_ERR_LIMIT)
        return HEAD_ERR_LIMIT;
    if (rc != INDEX_OK)
        return HEAD_ERR_NOMEM;
    if (*created)
        atomic_fetch_add_explicit(&h->created, 1, memory_order_relaxed);
    return HEAD_OK;
}

int head_get_or_create(head_t *h, const labels_t *ls, uint64_t hash, uint64_t new_id, index_ref_t *ref, bool *created)
{
    return get_or_create(h, ls, hash, new_id, true, ref, created);
}

int head_create(head_t *h, const labels_t *ls, uint64_t hash, uint64_t new_id, index_ref_t *ref, bool *created)
{
    return get_or_create(h, ls, hash, new_id, false, ref, created);
}

int head_create_many(head_t *h, index_create_t *items, size_t n, index_next_id_fn next_id, void *ud)
{
    if (index_create_many(h->ix, items, n, next_id, ud) < 0)
        return HEAD_ERR_NOMEM;
    uint64_t made = 0;
    for (size_t i = 0; i < n; i++)
        made += items[i].rc == INDEX_OK && items[i].made != INDEX_MADE_NONE;
    atomic_fetch_add_explicit(&h->created, made, memory_order_relaxed);
    return HEAD_OK;
}

int head_check(head_t *h, const index_ref_t *ref, int64_t t)
{
    index_series_t *is = index_acquire_ref(h->ix, ref);
    if (!is)
        return HEAD_ERR_NOT_FOUND;
    pthread_mutex_t *mu = stripe(h, ref->id);
    pthread_mutex_lock(mu);
    int rc = check_locked(h, index_series_payload(is), t);
    pthread_mutex_unlock(mu);
    index_release(h->ix, is);
    tally_t tl = tally_init();
    tally_refusal(&tl, rc);
    tally_flush(h, &tl);
    return rc;
}

int head_append_ref(head_t *h, const index_ref_t *ref, int64_t t, double v)
{
    return head_append_ref_aux(h, ref, t, v, NULL);
}

int head_append_ref_aux(head_t *h, const index_ref_t *ref, int64_t t, double v, void **aux)
{
    index_series_t *is = index_acquire_ref(h->ix, ref);
    if (!is)
        return HEAD_ERR_NOT_FOUND;
    hseries_t *s = index_series_payload(is);
    pthread_mutex_t *mu = stripe(h, ref->id);
    pthread_mutex_lock(mu);
    tally_t tl = tally_init();
    int rc = append_locked(h, s, t, v, &tl);
    if (aux)
        *aux = s->aux;
    pthread_mutex_unlock(mu);
    index_release(h->ix, is);
    tally_flush(h, &tl);
    return rc;
}

bool head_set_aux(head_t *h, const index_ref_t *ref, void *aux)
{
    index_series_t *is = index_acquire_ref(h->ix, ref);
    if (!is)
        return false;
    hseries_t *s = index_series_payload(is);
    pthread_mutex_t *mu = stripe(h, ref->id);
    pthread_mutex_lock(mu);
    s->aux = aux;
    pthread_mutex_unlock(mu);
    index_release(h->ix, is);
    return true;
}

typedef struct {
    head_t *h;
    const int64_t *t;
    const double *v; /* NULL: check only (head_check_batch) */
    int8_t *rc;
    void **aux; /* head_append_batch's aux out, or NULL */
    tally_t tl;
} head_batch_t;

/* One sample of a batch, under its stripe lock: checked, or appended when the batch has values. */
static void batch_one(void *ud, uint32_t k, index_series_t *is)
{
    head_batch_t *b = ud;
    if (!is) {
        b->rc[k] = HEAD_ERR_NOT_FOUND;
        return;
    }
    pthread_mutex_t *mu = stripe(b->h, index_series_id(is));
    pthread_mutex_lock(mu);
    hseries_t *s = index_series_payload(is);
    int rc;
    if (b->v) {
        rc = append_locked(b->h, s, b->t[k], b->v[k], &b->tl);
    } else {
        rc = check_locked(b->h, s, b->t[k]);
        tally_refusal(&b->tl, rc);
        /* The append that follows the check (after the WAL write) reads the open chunk's header
         * and writes at its end: start loading both lines now, while the request's other
         * series are checked, instead of stalling on them one by one then. */
        if (rc == HEAD_OK && (s->flags & F_OPEN)) {
            __builtin_prefetch(s->obuf, 1);
            __builtin_prefetch(s->obuf + open_len(s) - 1, 1);
        }
    }
    if (b->aux)
        b->aux[k] = s->aux;
    pthread_mutex_unlock(mu);
    b->rc[k] = (int8_t)rc;
}

int head_check_batch(head_t *h, const index_ref_t *refs, const int64_t *t, const uint32_t *sel, size_t m, int8_t *rc)
{
    head_batch_t b = {.h = h, .t = t, .rc = rc, .tl = tally_init()};
    if (index_visit_refs(h->ix, refs, sel, m, batch_one, &b) != 0)
        return -1;
    tally_flush(h, &b.tl);
    return 0;
}

int head_append_batch(head_t *h, const index_ref_t *refs, const int64_t *t, const double *v, const uint32_t *sel,
                      size_t m, int8_t *rc, void **aux)
{
    assert(v);
    head_batch_t b = {.h = h, .t = t, .v = v, .rc = rc, .aux = aux, .tl = tally_init()};
    int ret = index_visit_refs(h->ix, refs, sel, m, batch_one, &b);
    tally_flush(h, &b.tl);
    return ret;
}

int head_append(head_t *h, const labels_t *ls, int64_t t, double v)
{
    uint64_t hash = labels_hash(ls);
    index_series_t *is = index_acquire(h->ix, ls, hash);
    if (!is) {
        bool created;
        int rc = index_acquire_or_create(h->ix, ls, hash, atomic_fetch_add(&h->next_id, 1), &is, &created);
        if (rc == INDEX_ERR_LIMIT)
            return HEAD_ERR_LIMIT;
        if (rc != INDEX_OK)
            return HEAD_ERR_NOMEM;
        if (created)
            atomic_fetch_add_explicit(&h->created, 1, memory_order_relaxed);
    }
    pthread_mutex_t *mu = stripe(h, index_series_id(is));
    pthread_mutex_lock(mu);
    tally_t tl = tally_init();
    int rc = append_locked(h, index_series_payload(is), t, v, &tl);
    pthread_mutex_unlock(mu);
    tally_flush(h, &tl);
    index_release(h->ix, is);
    return rc;
}

/* ---- expiry -------------------------------------------------------------------------------- */

/* Runs under the shard's write lock: no appender or reader holds this series. */
static bool sweep_series(void *ud, index_series_t *is)
{
    head_t *h = ud;
    hseries_t *s = index_series_payload(is);
    int64_t mv = h->pass_min_valid;
    /* Chunks never straddle a block and mv is a block start: mint < mv means all of it is. */
    while (s->first && rec_mint(s->first) < mv) {
        atomic_fetch_sub(&h->closed_bytes, rec_len(s->first));
        atomic_fetch_sub(&h->n_chunks, 1);
        s->first = rec_next(s->first);
    }
    if ((s->flags & F_OPEN) && open_mint(s) < mv) {
        atomic_fetch_sub_explicit(&LINE(h, s).open_cap_bytes, s->ocap, memory_order_relaxed);
        free(s->obuf);
        s->obuf = NULL;
        s->ocap = 0;
        atomic_fetch_sub(&h->n_chunks, 1);
        s->flags &= (uint8_t) ~(F_OPEN | F_FRACTION | F_OINT);
    }
    if ((s->flags & F_PENDING) && s->pend_t < mv)
        s->flags &= (uint8_t)~F_PENDING;
    /* An open chunk two blocks behind "now" will not grow again in its block: pack it into the
     * slab at its exact size. */
    if ((s->flags & F_OPEN) && floordiv(open_mint(s), h->block_ms) < floordiv(h->pass_now, h->block_ms) - 1) {
        /* The pending sample, if any, stays pending: encoding happens on the next append. */
        cut_chunk(h, s, false);
    }
    if (s->flags & (F_OPEN | F_PENDING) || s->first)
        return false;
    /* Empty. A series created a moment ago may be about to receive its first sample, so only
     * remove one found empty on two passes in a row. */
    if (!(s->flags & F_MARK)) {
        s->flags |= F_MARK;
        return false;
    }
    if (h->may_remove && !h->may_remove(h->may_remove_ud, index_series_id(is)))
        return false;
    series_release(h, s);
    atomic_fetch_add_explicit(&h->removed, 1, memory_order_relaxed);
    return true;
}

bool head_expire(head_t *h, int64_t now_ms, uint32_t budget)
{
    pthread_mutex_lock(&h->expire_lock);
    int64_t new_min = floordiv(now_ms - h->retention_ms, h->block_ms) * h->block_ms;
    atomic_max64(&h->min_valid, new_min);
    bool finished = false;
    if (!h->pass_active) {
        h->pass_active = true;
        h->pass_shard = 0;
        h->pass_cursor = 0;
        h->pass_min_valid = atomic_load(&h->min_valid);
        h->pass_now = now_ms;
    }
    while (budget > 0 && h->pass_active) {
        uint32_t step = budget < 1024 ? budget : 1024;
        bool done = index_sweep(h->ix, h->pass_shard, &h->pass_cursor, step, sweep_series, h);
        budget -= step;
        if (done && ++h->pass_shard == INDEX_SHARDS) {
            slabs_free_before(h, h->pass_min_valid);
            h->pass_active = false;
            finished = true;
        }
    }
    pthread_mutex_unlock(&h->expire_lock);
    return finished;
}

/* ---- stats --------------------------------------------------------------------------------- */

void head_get_stats(head_t *h, head_stats_t *o)
{
    memset(o, 0, sizeof(*o));
    o->series = index_num_series(h->ix);
    o->chunks = atomic_load(&h->n_chunks);
    o->slab_bytes = atomic_load(&h->slab_bytes);
    uint64_t open_cap = 0;
    for (int i = 0; i < 64; i++)
        open_cap += atomic_load_explicit(&h->per_line[i].open_cap_bytes, memory_order_relaxed);
    o->chunk_bytes = atomic_load(&h->closed_bytes) + open_cap;
    o->memory_bytes = index_memory_bytes(h->ix) + o->slab_bytes + open_cap;
    for (int i = 0; i < 64; i++) {
        o->samples_appended += atomic_load_explicit(&h->per_line[i].appended, memory_order_relaxed);
        o->samples_replaced += atomic_load_explicit(&h->per_line[i].replaced, memory_order_relaxed);
    }
    o->out_of_order = atomic_load(&h->ooo);
    o->too_old = atomic_load(&h->too_old);
    o->series_created = atomic_load(&h->created);
    o->series_removed = atomic_load(&h->removed);
    o->min_t = INT64_MAX;
    o->max_t = INT64_MIN;
    if (o->series) {
        int64_t mn = atomic_load(&h->min_t), mv = atomic_load(&h->min_valid);
        o->min_t = mn > mv ? mn : mv;
        o->max_t = atomic_load(&h->max_t);
    }
}

/* ---- reading a series into caller memory --------------------------------------------------- */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    querier_chunk_t *ch;
    size_t n, capch;
} copybuf_t;

static int cb_add(copybuf_t *b, int64_t mint, int64_t maxt, const uint8_t *bytes, size_t len, uint8_t enc)
{
    if (b->len + len > b->cap) {
        size_t nc = b->cap ? b->cap : 1024;
        while (nc < b->len + len)
            nc *= 2;
        uint8_t *p = realloc(b->buf, nc);
        if (!p)
            return -1;
        b->buf = p;
        b->cap = nc;
    }
    if (b->n == b->capch) {
        size_t nc = b->capch ? b->capch * 2 : 16;
        querier_chunk_t *p = realloc(b->ch, nc * sizeof(*p));
        if (!p)
            return -1;
        b->ch = p;
        b->capch = nc;
    }
    memcpy(b->buf + b->len, bytes, len);
    /* Offset for now; turned into a pointer once the buffer stops moving (cb_fix). */
    b->ch[b->n++] = (querier_chunk_t){
        .mint = mint, .maxt = maxt, .bytes = (const uint8_t *)(uintptr_t)b->len, .len = len, .enc = enc};
    b->len += len;
    return 0;
}

static void cb_fix(copybuf_t *b)
{
    for (size_t i = 0; i < b->n; i++)
        b->ch[i].bytes = b->buf + (uintptr_t)b->ch[i].bytes;
}

/* Open chunk plus pending sample as one chunk (a copy; the series' open chunk is untouched). */
static int open_as_chunk(const hseries_t *s, chunk_xor_appender_t *out, int64_t *mint)
{
    if (s->flags & F_OPEN) {
        open_view(s, out);
        out->cap = open_len(s) + OPEN_RESERVE;
        out->bytes = malloc(out->cap);
        if (!out->bytes)
            return -1;
        memcpy(out->bytes, s->obuf, open_len(s));
        *mint = open_mint(s);
    } else {
        if (chunk_xor_appender_init(out) < 0)
            return -1;
        *mint = s->pend_t;
    }
    if ((s->flags & F_PENDING) && chunk_xor_append(out, s->pend_t, bits_to_double(s->pend_bits)) < 0) {
        chunk_xor_appender_free(out);
        return -1;
    }
    return 0;
}

/* The integer open chunk and the pending sample: one chunk when the pending value is an integer
 * too (appended to a copy), else the open chunk and a one-sample XOR chunk after it. */
static int copy_open_int(const hseries_t *s, copybuf_t *b)
{
    size_t len = open_len(s);
    int64_t omint = open_mint(s);
    bool pend = (s->flags & F_PENDING) != 0;
    double pv = bits_to_double(s->pend_bits);
    if (pend && chunk_int_holds(pv)) {
        /* the largest open chunk (CUT_SAMPLES samples of at most 20 bytes) plus one sample */
        uint8_t tmp[CUT_SAMPLES * CHUNK_INT_APPEND_MAX_BYTES + 64];
        chunk_int_appender_t a;
        open_iview(s, &a);
        assert(len <= sizeof(tmp));
        memcpy(tmp, s->obuf, len);
        a.bytes = tmp;
        a.cap = sizeof(tmp);
        if (chunk_int_append(&a, s->pend_t, (int64_t)pv) == 0)
            return cb_add(b, omint, s->pend_t, tmp, chunk_int_appender_len(&a), CHUNK_ENC_INT);
    }
    if (cb_add(b, omint, s->ot, s->obuf, len, CHUNK_ENC_INT) < 0)
        return -1;
    if (!pend)
        return 0;
    chunk_xor_appender_t x;
    if (chunk_xor_appender_init(&x) < 0)
        return -1;
    int rc = chunk_xor_append(&x, s->pend_t, pv);
    if (rc == 0) {
        size_t xl;
        const uint8_t *xb = chunk_xor_bytes(&x, &xl);
        rc = cb_add(b, s->pend_t, s->pend_t, xb, xl, CHUNK_ENC_XOR);
    }
    chunk_xor_appender_free(&x);
    return rc;
}

/* Copies the chunks of s overlapping [mint, maxt]. Stripe lock held. */
static int copy_series_locked(const hseries_t *s, int64_t mint, int64_t maxt, copybuf_t *b)
{
    for (const uint8_t *r = s->first; r; r = rec_next(r)) {
        int64_t cmin = rec_mint(r), cmax = cmin + rec_span(r);
        if (cmin > maxt || cmax < mint)
            continue;
        if (cb_add(b, cmin, cmax, rec_bytes(r), rec_len(r), rec_enc(r)) < 0)
            return -1;
    }
    if (s->flags & (F_OPEN | F_PENDING)) {
        int64_t omint = (s->flags & F_OPEN) ? open_mint(s) : s->pend_t;
        int64_t omaxt = (s->flags & F_PENDING) ? s->pend_t : s->ot;
        if (omint <= maxt && omaxt >= mint && (s->flags & F_OINT)) {
            if (copy_open_int(s, b) < 0)
                return -1;
        } else if (omint <= maxt && omaxt >= mint) {
            chunk_xor_appender_t tmp;
            if (open_as_chunk(s, &tmp, &omint) < 0)
                return -1;
            size_t len;
            const uint8_t *bytes = chunk_xor_bytes(&tmp, &len);
            int rc = cb_add(b, omint, tmp.t, bytes, len, CHUNK_ENC_XOR);
            chunk_xor_appender_free(&tmp);
            if (rc < 0)
                return -1;
        }
    }
    return 0;
}

/* ---- querier over the head ----------------------------------------------------------------- */

typedef struct {
    labels_t labels;
    index_ref_t ref;
} cand_t;

typedef struct {
    querier_set_t base;
    head_t *h;
    arena_t *a;
    cand_t *cands;
    size_t n, pos;
    int64_t mint, maxt;
    copybuf_t cb;
    querier_series_t cur;
    char err[128];
} head_set_t;

static int cmp_cand(const void *a, const void *b)
{
    return labels_compare(&((const cand_t *)a)->labels, &((const cand_t *)b)->labels);
}

static const querier_series_t *hset_next(querier_set_t *base)
{
    head_set_t *s = (head_set_t *)base;
    while (s->pos < s->n && !s->err[0]) {
        cand_t *c = &s->cands[s->pos++];
        index_series_t *is = index_acquire_ref(s->h->ix, &c->ref);
        if (!is)
            continue; /* removed since select */
        s->cb.len = s->cb.n = 0;
        pthread_mutex_t *mu = stripe(s->h, c->ref.id);
        pthread_mutex_lock(mu);
        int rc = copy_series_locked(index_series_payload(is), s->mint, s->maxt, &s->cb);
        pthread_mutex_unlock(mu);
        index_release(s->h->ix, is);
        if (rc < 0) {
            strcpy(s->err, "out of memory reading series");
            return NULL;
        }
        if (s->cb.n == 0)
            continue;
        cb_fix(&s->cb);
        s->cur.labels = c->labels;
        s->cur.chunks = s->cb.ch;
        s->cur.nchunks = s->cb.n;
        return &s->cur;
    }
    return NULL;
}

static const char *hset_error(querier_set_t *base)
{
    head_set_t *s = (head_set_t *)base;
    return s->err[0] ? s->err : NULL;
}

static void hset_free(querier_set_t *base)
{
    head_set_t *s = (head_set_t *)base;
    arena_destroy(s->a);
    free(s->cands);
    free(s->cb.buf);
    free(s->cb.ch);
    free(s);
}

/* The candidates' labels are copied into s->a at select time. */
static bool hset_labels_stable(querier_set_t *base)
{
    (void)base;
    return true;
}

static const querier_set_ops_t hset_ops = {
    .next = hset_next, .error = hset_error, .free = hset_free, .labels_stable = hset_labels_stable};

typedef struct {
    querier_t base;
    head_t *h;
} head_querier_t;

/* Shared with storage.c through head_querier's select. */
static querier_set_t *hq_select(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt,
                                const querier_hints_t *hints)
{
    head_t *h = ((head_querier_t *)q)->h;
    head_set_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->base.ops = &hset_ops;
    s->h = h;
    s->mint = mint;
    s->maxt = maxt;
    s->a = arena_create(0);
    if (!s->a) {
        free(s);
        return NULL;
    }
    index_refs_t refs = {0};
    if (index_select(h->ix, ms, n, &refs) != INDEX_OK) {
        strcpy(s->err, "out of memory selecting series");
        return &s->base;
    }
    s->cands = malloc(sizeof(cand_t) * (refs.n ? refs.n : 1));
    if (!s->cands) {
        index_refs_free(&refs);
        strcpy(s->err, "out of memory selecting series");
        return &s->base;
    }
    for (size_t i = 0; i < refs.n; i++) {
        index_series_t *is = index_acquire_ref(h->ix, &refs.v[i]);
        if (!is)
            continue;
        index_series_labels_copy(h->ix, is, s->a, &s->cands[s->n].labels);
        index_release(h->ix, is);
        s->cands[s->n++].ref = refs.v[i];
    }
    index_refs_free(&refs);
    qsort(s->cands, s->n, sizeof(cand_t), cmp_cand);
    return &s->base;
}

static int hq_label_names(querier_t *q, const matcher_t *const *ms, size_t n, int64_t mint, int64_t maxt, arena_t *a,
                          const char ***out, size_t *count, char *err, size_t errlen)
{
    head_t *h = ((head_querier_t *)q)->h;
    if (index_label_names(h->ix, ms, n, a, out, count) != INDEX_OK) {
        if (err && errlen)
            strncpy(err, "out of memory", errlen - 1), err[errlen - 1] = 0;
        return -1;
    }
    return 0;
}

static int hq_label_values(querier_t *q, const char *name, const matcher_t *const *ms, size_t n, int64_t mint,
                           int64_t maxt, arena_t *a, const char ***out, size_t *count, char *err, size_t errlen)
{
    head_t *h = ((head_querier_t *)q)->h;
    if (index_label_values(h->ix, name, ms, n, a, out, count) != INDEX_OK) {
        if (err && errlen)
            strncpy(err, "out of memory", errlen - 1), err[errlen - 1] = 0;
        return -1;
    }
    return 0;
}

static void hq_close(querier_t *q)
{
    free(q);
}

static const querier_ops_t hq_ops = {
    .select = hq_select, .label_names = hq_label_names, .label_values = hq_label_values, .close = hq_close};

querier_t *head_querier(head_t *h)
{
    head_querier_t *q = calloc(1, sizeof(*q));
    if (!q)
        return NULL;
    q->base.ops = &hq_ops;
    q->h = h;
    return &q->base;
}

/* ---- snapshot support ----------------------------------------------------------------------- */

typedef struct {
    head_t *h;
    int (*fn)(void *ud, const head_series_state_t *st);
    void *ud;
    label_t *lbuf;
    size_t lcap;
    querier_chunk_t *cbuf;
    size_t ccap;
    bool oom;
} foreach_ctx_t;

static int foreach_one(void *ud, index_series_t *is)
{
    foreach_ctx_t *c = ud;
    size_t nl = index_series_nlabels(is);
    if (nl > c->lcap) {
        label_t *p = realloc(c->lbuf, nl * sizeof(label_t));
        if (!p) {
            c->oom = true;
            return -1;
        }
        c->lbuf = p;
        c->lcap = nl;
    }
    index_series_labels(c->h->ix, is, c->lbuf);
    uint64_t id = index_series_id(is);
    hseries_t *s = index_series_payload(is);
    pthread_mutex_t *mu = stripe(c->h, id);
    pthread_mutex_lock(mu);
    size_t nch = 0;
    for (const uint8_t *r = s->first; r; r = rec_next(r))
        nch++;
    if (nch > c->ccap) {
        querier_chunk_t *p = realloc(c->cbuf, nch * sizeof(querier_chunk_t));
        if (!p) {
            pthread_mutex_unlock(mu);
            c->oom = true;
            return -1;
        }
        c->cbuf = p;
        c->ccap = nch;
    }
    nch = 0;
    for (const uint8_t *r = s->first; r; r = rec_next(r), nch++) {
        int64_t mint = rec_mint(r);
        c->cbuf[nch] = (querier_chunk_t){
            .mint = mint, .maxt = mint + rec_span(r), .bytes = rec_bytes(r), .len = rec_len(r), .enc = rec_enc(r)};
    }
    head_series_state_t st = {.id = id,
                              .labels = {c->lbuf, nl},
                              .chunks = c->cbuf,
                              .nchunks = nch,
                              .has_pending = (s->flags & F_PENDING) != 0,
                              .pending_t = s->pend_t,
                              .pending_v = bits_to_double(s->pend_bits)};
    if (s->flags & F_OPEN) {
        st.open = s->obuf;
        st.open_len = open_len(s);
        st.open_enc = (s->flags & F_OINT) ? CHUNK_ENC_INT : CHUNK_ENC_XOR;
    }
    int rc = (st.nchunks || st.open || st.has_pending) ? c->fn(c->ud, &st) : 0;
    pthread_mutex_unlock(mu);
    return rc;
}

int head_foreach_series(head_t *h, int (*fn)(void *ud, const head_series_state_t *st), void *ud)
{
    foreach_ctx_t c = {.h = h, .fn = fn, .ud = ud};
    int rc = index_foreach(h->ix, foreach_one, &c);
    free(c.lbuf);
    free(c.cbuf);
    return c.oom ? HEAD_ERR_NOMEM : rc;
}

/* Reopens a snapshot's integer open chunk for appending: its samples appended again into a
 * buffer of the same size give the same bytes (the layout is a function of the samples) and the
 * appender's state. HEAD_ERR_OUT_OF_ORDER if they do not decode or are not a chunk sluice makes. */
static int restore_open_int(head_t *h, hseries_t *s, const uint8_t *bytes, size_t len, int64_t mv)
{
    if (len <= CHUNK_INT_HEADER_BYTES || len > OPEN_MAX_BYTES)
        return HEAD_ERR_OUT_OF_ORDER;
    if (chunk_first_t(bytes, len) < mv)
        return HEAD_OK; /* expired: dropped, as an XOR one would be */
    size_t num = (size_t)bytes[0] << 8 | bytes[1];
    uint8_t *buf = malloc(len);
    if (!buf)
        return HEAD_ERR_NOMEM;
    chunk_int_appender_t a;
    chunk_int_appender_init(&a, buf, len);
    chunk_int_iter_t it;
    chunk_int_iter_init(&it, bytes, len);
    int64_t t;
    double v;
    while (chunk_int_iter_next(&it, &t, &v))
        if (!chunk_int_holds(v) || chunk_int_append(&a, t, (int64_t)v) < 0)
            break;
    if (it.err || a.num != num || num > CUT_SAMPLES || chunk_int_appender_len(&a) != len) {
        free(buf);
        return HEAD_ERR_OUT_OF_ORDER;
    }
    s->obuf = buf;
    s->ocap = (uint16_t)len;
    open_istore(s, &a);
    s->flags |= F_OPEN | F_OINT;
    atomic_fetch_add_explicit(&LINE(h, s).open_cap_bytes, s->ocap, memory_order_relaxed);
    atomic_fetch_add(&h->n_chunks, 1);
    atomic_max64(&h->max_t, s->ot);
    atomic_min64(&h->min_t, chunk_first_t(bytes, len));
    return HEAD_OK;
}

int head_restore_series(head_t *h, const head_series_state_t *st)
{
    uint64_t hash = labels_hash(&st->labels);
    index_series_t *is;
    bool created;
    int rc = index_acquire_or_create(h->ix, &st->labels, hash, st->id, &is, &created);
    if (rc == INDEX_ERR_LIMIT)
        return HEAD_ERR_LIMIT;
    if (rc != INDEX_OK)
        return HEAD_ERR_NOMEM;
    if (created)
        atomic_fetch_add_explicit(&h->created, 1, memory_order_relaxed);
    hseries_t *s = index_series_payload(is);
    pthread_mutex_t *mu = stripe(h, index_series_id(is));
    pthread_mutex_lock(mu);
    int64_t mv = atomic_load(&h->min_valid);
    rc = HEAD_OK;
    /* Only into an empty series: restoring twice (or over live data) must not interleave. */
    if (series_last_t(s) != INT64_MIN)
        goto out;
    for (size_t i = 0; i < st->nchunks; i++) {
        const querier_chunk_t *qc = &st->chunks[i];
        if (qc->mint < mv || qc->len > REC_LEN_MASK || qc->len <= CHUNK_XOR_HEADER_BYTES || qc->maxt < qc->mint ||
            (uint64_t)(qc->maxt - qc->mint) > SPAN_MAX || chunk_first_t(qc->bytes, qc->len) != qc->mint)
            continue;
        chunk_iter_t it;
        int64_t t;
        double v;
        chunk_iter_init(&it, qc->enc, qc->bytes, qc->len);
        while (chunk_iter_next(&it, &t, &v))
            ;
        if (chunk_iter_err(&it)) {
            rc = HEAD_ERR_OUT_OF_ORDER;
            continue;
        }
        uint8_t *r =
            slab_copy(h, floordiv(qc->mint, h->block_ms), qc->bytes, qc->len, qc->enc, (uint32_t)(qc->maxt - qc->mint));
        if (r) {
            link_record(h, s, r);
            atomic_fetch_add(&h->n_chunks, 1);
        }
        atomic_max64(&h->max_t, qc->maxt);
        atomic_min64(&h->min_t, qc->mint);
    }
    if (st->open && st->open_len > 0 && st->open_enc == CHUNK_ENC_INT) {
        rc = restore_open_int(h, s, st->open, st->open_len, mv);
    } else if (st->open && st->open_len > 0) {
        chunk_xor_iter_t it;
        int64_t t, first = INT64_MIN;
        double v;
        chunk_xor_iter_init(&it, st->open, st->open_len);
        if (chunk_xor_iter_next(&it, &t, &v))
            first = t;
        chunk_xor_appender_t a;
        if (first != INT64_MIN && first >= mv && st->open_len <= OPEN_MAX_BYTES &&
            chunk_xor_appender_from_bytes(&a, st->open, st->open_len) == 0) {
            if (a.t - first > INT32_MAX || a.tdelta > INT32_MAX || a.tdelta < INT32_MIN) {
                chunk_xor_appender_free(&a); /* not a chunk we would have made */
                rc = HEAD_ERR_OUT_OF_ORDER;
            } else {
                open_store(s, &a);
                s->flags |= F_OPEN;
                atomic_fetch_add_explicit(&LINE(h, s).open_cap_bytes, s->ocap, memory_order_relaxed);
                atomic_fetch_add(&h->n_chunks, 1);
                atomic_max64(&h->max_t, s->ot);
                atomic_min64(&h->min_t, first);
            }
        } else if (first != INT64_MIN && first >= mv) {
            rc = HEAD_ERR_OUT_OF_ORDER;
        }
    }
    if (st->has_pending && st->pending_t >= mv && st->pending_t > series_last_t(s)) {
        s->pend_t = st->pending_t;
        s->pend_bits = double_to_bits(st->pending_v);
        s->flags |= F_PENDING;
        atomic_max64(&h->max_t, s->pend_t);
        atomic_min64(&h->min_t, s->pend_t);
    }
out:
    pthread_mutex_unlock(mu);
    index_release(h->ix, is);
    return rc;
}
