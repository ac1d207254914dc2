/*
 * forward — remote-write 1.0 sender that tails sluice's own WAL (API and lifecycle in forward.h).
 *
 * ---- Data path (per target) --------------------------------------------------------------------
 *
 *   WAL segments ──wal_watch──▶ reader thread ──round──▶ shard 0..N-1 threads ──POST──▶ receiver
 *                                 │  series id -> labels (+ external labels) map
 *                                 └─ unknown id (its series record was in a truncated segment):
 *                                    storage_series_labels (the catalog)
 *
 * The reader works in ROUNDS: it reads whole WAL records until it holds shards ×
 * max-samples-per-send samples (or reaches the end of the WAL), deals the samples to the shards
 * by series (so one series always goes through one shard, in WAL order), lets every shard send
 * its part — batches of at most max-samples-per-send, snappy-compressed WriteRequests, series
 * grouped into one TimeSeries each — and waits until all are done. Only then is the position
 * after the round's last record COMMITTED. A round ends by every batch being acknowledged (2xx)
 * or dropped for good (4xx other than an opted-in 429): 5xx, 429 with retry-on-429 and network
 * errors are retried with exponential backoff (min-backoff doubling up to max-backoff; 429 waits
 * for Retry-After when given) for as long as it takes. So a receiver that is down stalls the
 * round, the WAL keeps everything after the committed position, and nothing is lost; a 4xx batch
 * is counted (samples_failed_total), logged with the receiver's reason, and the queue goes on.
 *
 * Ordering: a series' samples leave in WAL order (one shard per series, rounds strictly one after
 * the other), which is what receivers that reject out-of-order samples need.
 *
 * ---- Positions and restarts ----------------------------------------------------------------------
 *
 * The committed position (segment, offset of the next record) is saved in
 *   <storage.path>/forward/<16 hex digits of xxh3(URL)>.pos   "sluice-forward 1\n<seg> <off>\n<url>\n"
 * at most once a second (write to .tmp, fsync, rename) and at stop. After a restart the reader
 * re-reads that segment from its start to relearn the series records in it, forwards nothing
 * before the saved offset, and goes on. What can be sent twice is bounded: the round in flight at
 * a crash or stop plus up to one second of rounds (a crash between commit and save), and a batch
 * whose 2xx was lost to a dropped connection — the "at least once" the remote-write spec expects
 * (receivers accept a resent identical sample). A target seen for the first time starts at the
 * newest segment (data accepted from now on), as Prometheus' WAL watcher does.
 *
 * ---- WAL retention interplay ---------------------------------------------------------------------
 *
 * storage_snapshot deletes WAL segments the kept snapshots cover. The sender registers a hold
 * (storage_set_wal_hold): the lowest committed segment over all targets — loaded from the .pos
 * files before recovery, so even the first snapshot after a restart keeps what is unsent. With
 * --remote-write.wal-max-hold > 0 the hold gives up segments whose last write is older than that
 * (a receiver down for days must not fill the disk): the reader then finds them gone, skips to the
 * next one, counts sluice_remote_storage_wal_segments_skipped_total and logs it. Segments are only
 * deleted at snapshots (--storage.snapshot-interval), so the WAL on disk is "unsent data, plus up
 * to two snapshot intervals" (the previous snapshot is kept as a fallback, with its segments).
 *
 * ---- Threads and locks ---------------------------------------------------------------------------
 *
 * Per target: one reader, N shards. `mu` + `cv` guard the round hand-off (gen, outstanding) and
 * the committed position (read by the hold from the snapshotting thread). Counters are atomics
 * read by /metrics. `stop_mu`/`stop_cv` (forwarder-wide) wake every sleeping thread at stop.
 */
#include "api/forward.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <snappy-c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal/net/httpc.h"
#include "internal/proto/remote.pb-c.h"
#include "internal/proto/types.pb-c.h"
#include "internal/util/arena.h"
#include "internal/util/clock.h"
#include "internal/util/hashmap.h"
#include "internal/util/log.h"
#include "storage/wal_record.h"
#include "storage/wal_watch.h"

#define FW_MAX_RESPONSE_BODY 1024

/* ---- series map ---------------------------------------------------------------------------- */

typedef struct {
    uint64_t id;
    size_t n;
    Prometheus__Label *labels;
    Prometheus__Label **plabels;
} fw_series_t;

/* Series by id (hashmap_t: id -> fw_series_t *, owned by the map). */
static fw_series_t *map_get(const hashmap_t *m, uint64_t id)
{
    uint64_t *v = hashmap_get(m, id);
    return v ? (fw_series_t *)(uintptr_t)*v : NULL;
}

static int map_put(hashmap_t *m, fw_series_t *s)
{
    return hashmap_put(m, s->id, (uint64_t)(uintptr_t)s);
}

static void map_free(hashmap_t *m)
{
    size_t pos = 0;
    for (hashmap_slot_t *e; (e = hashmap_next(m, &pos));)
        free((fw_series_t *)(uintptr_t)e->val);
    hashmap_free(m);
}

/* ---- types --------------------------------------------------------------------------------- */

typedef struct {
    fw_series_t *s;
    int64_t t;
    double v;
    uint64_t seq; /* WAL order, for a stable sort */
} fw_item_t;

typedef struct fw_target fw_target_t;

typedef struct {
    fw_target_t *t;
    int idx;
    pthread_t th;
    bool started;
    fw_item_t *items;
    size_t n, cap;
    uint64_t gen_done;
    httpc_conn_t *conn;
    /* per-send scratch */
    Prometheus__TimeSeries *ts;
    Prometheus__TimeSeries **pts;
    Prometheus__Sample *smp;
    Prometheus__Sample **psmp;
    size_t scratch_cap;
    buf_t pb, snap, hdr;
} fw_shard_t;

struct api_forward;

struct fw_target {
    struct api_forward *fw;
    char *url, *name, *pos_path;
    httpc_url_t u;
    char *headers;     /* extra "Name: value\r\n" lines, basic auth included */
    char *bearer_file; /* "" = none */
    bool retry_on_429;
    httpc_tls_t *tls; /* https:// targets: trust, client cert, server name (shared by the shards) */

    hashmap_t map; /* series id -> fw_series_t * */
    arena_t *scratch;
    fw_shard_t *shards;
    pthread_t reader;
    bool reader_started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen;        /* round number handed to the shards */
    int outstanding;     /* shards still working on round gen */
    wal_pos_t committed; /* next record to forward after a restart */
    bool have_committed;
    int64_t last_save_ms;
    wal_pos_t saved; /* what the .pos file holds */

    _Atomic uint64_t sent, failed, retried, dropped_unknown, bytes_sent, requests, segments_skipped;
    _Atomic int64_t pending, highest_sent_ms, round_min_t;
    _Atomic uint32_t segment;
    _Atomic bool failing; /* the last attempt failed (for "recovered" logs) */
};

struct api_forward {
    api_forward_options_t o;
    storage_t *storage;
    char *dir;     /* <data>/forward */
    char *wal_dir; /* <data>/wal */
    label_t *ext;  /* external labels, sorted */
    size_t next;
    char *ext_strs;
    fw_target_t *targets;
    size_t ntargets;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    _Atomic bool stopping;
    bool started, stopped;
};

/* Sleeps up to ms; returns early (true) when stopping. */
static bool fw_sleep(struct api_forward *f, int64_t ms)
{
    struct timespec ts = clock_deadline_ms(CLOCK_REALTIME, ms);
    pthread_mutex_lock(&f->stop_mu);
    while (!atomic_load(&f->stopping)) {
        if (pthread_cond_timedwait(&f->stop_cv, &f->stop_mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&f->stop_mu);
    return atomic_load(&f->stopping);
}

/* ---- small pure pieces (unit-tested) ---------------------------------------------------------- */

int64_t api_forward__backoff_ms(int64_t min_ms, int64_t max_ms, uint32_t attempt)
{
    int64_t b = min_ms;
    for (uint32_t i = 0; i < attempt && b < max_ms; i++)
        b *= 2;
    return b > max_ms ? max_ms : b;
}

int api_forward__classify(int status, bool retry_on_429)
{
    if (status >= 200 && status < 300)
        return 0;
    if (status == 429)
        return retry_on_429 ? 1 : -1;
    if (status >= 500)
        return 1;
    return -1; /* 4xx (and anything odd: 1xx/3xx) is not retried */
}

int api_forward__parse_spec(const char *spec, char **url, char **opts, char *err, size_t errlen)
{
    *url = NULL;
    *opts = NULL;
    const char *p = spec;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t ul = strcspn(p, " \t");
    if (!ul) {
        snprintf(err, errlen, "empty --remote-write.url");
        return -1;
    }
    *url = strndup(p, ul);
    buf_t b = BUF_INIT;
    buf_puts(&b, "");
    p += ul;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p)
            break;
        size_t l = strcspn(p, " \t");
        if (!memchr(p, '=', l)) {
            snprintf(err, errlen, "remote-write option \"%.*s\" is not key=value", (int)l, p);
            free(*url);
            *url = NULL;
            buf_free(&b);
            return -1;
        }
        if (b.len)
            buf_putc(&b, '\n');
        buf_append(&b, p, l);
        p += l;
    }
    *opts = buf_steal(&b, NULL);
    return 0;
}

/* ---- target setup --------------------------------------------------------------------------- */

static int target_setup(struct api_forward *f, fw_target_t *t, const char *spec, char *err, size_t errlen)
{
    char *opts = NULL;
    if (api_forward__parse_spec(spec, &t->url, &opts, err, errlen) != 0)
        return -1;
    if (httpc_url_parse(t->url, &t->u, err, errlen) != 0) {
        free(opts);
        return -1;
    }
    t->retry_on_429 = f->o.retry_on_429;
    buf_t h = BUF_INIT;
    buf_puts(&h, "");
    httpc_auth_spec_t auth = HTTPC_AUTH_SPEC_INIT;
    /* per-target TLS settings override the --remote-write.tls-* defaults */
    httpc_tls_spec_t tls = HTTPC_TLS_SPEC_INIT;
    int rc = 0;
    size_t len;
    for (const char *o = opts; o && *o && rc == 0; o = o[len] ? o + len + 1 : o + len) {
        len = strcspn(o, "\n");
        const char *eq = memchr(o, '=', len);
        size_t kl = (size_t)(eq - o);
        const char *v = eq + 1;
        size_t vl = len - kl - 1;
#define KEY(s) (kl == strlen(s) && memcmp(o, s, kl) == 0)
        int tr = httpc_tls_spec_parse(&tls, o, kl, v, vl, err, errlen);
        if (tr == 0)
            tr = httpc_auth_spec_parse(&auth, o, kl, v, vl, err, errlen);
        if (tr != 0) {
            rc = tr < 0 ? -1 : 0;
        } else if (KEY("name")) {
            free(t->name);
            t->name = strndup(v, vl);
        } else if (KEY("retry-on-429")) {
            t->retry_on_429 = vl == 4 && memcmp(v, "true", 4) == 0;
            if (!t->retry_on_429 && !(vl == 5 && memcmp(v, "false", 5) == 0)) {
                snprintf(err, errlen, "retry-on-429 must be true or false");
                rc = -1;
            }
        } else {
            snprintf(err, errlen, "unknown remote-write option \"%.*s\"", (int)kl, o);
            rc = -1;
        }
#undef KEY
    }
    if (rc == 0)
        rc = httpc_auth_spec_build(&auth, &h, err, errlen);
    free(t->bearer_file);
    t->bearer_file = auth.bearer_file; /* read per request */
    auth.bearer_file = NULL;
    httpc_auth_spec_free(&auth);
    if (rc == 0) {
        char terr[512];
        bool insecure;
        if (httpc_tls_spec_build(&tls, &f->o.tls, &t->u, &t->tls, &insecure, terr, sizeof(terr)) != 0) {
            snprintf(err, errlen, "remote write %s: %s", t->url, terr);
            rc = -1;
        } else if (insecure) {
            log_warn("forward", "TLS certificate verification is off for this target (insecure-skip-verify)",
                     LF_S("url", t->url));
        }
    }
    httpc_tls_spec_free(&tls);
    free(opts);
    buf_puts(&h, "Content-Encoding: snappy\r\nContent-Type: application/x-protobuf\r\n"
                 "X-Prometheus-Remote-Write-Version: 0.1.0\r\n");
    t->headers = buf_steal(&h, NULL);
    if (!t->bearer_file)
        t->bearer_file = strdup("");
    if (rc != 0)
        return -1;

    uint64_t hash = XXH3_64bits(t->url, strlen(t->url));
    if (!t->name) {
        char nm[16];
        snprintf(nm, sizeof(nm), "%06" PRIx64, hash & 0xffffff);
        t->name = strdup(nm);
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%016" PRIx64 ".pos", f->dir, hash);
    t->pos_path = strdup(path);
    t->fw = f;
    t->scratch = arena_create(0);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    atomic_store(&t->highest_sent_ms, 0);
    return 0;
}

/* ---- positions ------------------------------------------------------------------------------ */

static void load_position(fw_target_t *t)
{
    FILE *fp = fopen(t->pos_path, "r");
    if (!fp)
        return;
    unsigned ver = 0, seg = 0;
    unsigned long long off = 0;
    if (fscanf(fp, "sluice-forward %u\n%u %llu", &ver, &seg, &off) == 3 && ver == 1 && seg > 0) {
        t->committed = (wal_pos_t){.segment = seg, .offset = off};
        t->have_committed = true;
        log_info("forward", "resuming remote write", LF_S("remote_name", t->name), LF_S("url", t->url),
                 LF_I("segment", seg), LF_I("offset", (int64_t)off));
    } else {
        log_warn("forward", "ignoring an unreadable position file", LF_S("file", t->pos_path));
    }
    fclose(fp);
}

static void save_position(fw_target_t *t)
{
    pthread_mutex_lock(&t->mu);
    wal_pos_t p = t->committed;
    bool have = t->have_committed;
    pthread_mutex_unlock(&t->mu);
    if (!have)
        return;
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", t->pos_path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        log_error("forward", "cannot save position", LF_S("file", tmp), LF_S("err", strerror(errno)));
        return;
    }
    char body[4600];
    int n =
        snprintf(body, sizeof(body), "sluice-forward 1\n%" PRIu32 " %" PRIu64 "\n%s\n", p.segment, p.offset, t->url);
    bool ok = write(fd, body, (size_t)n) == n && fsync(fd) == 0;
    close(fd);
    if (!ok || rename(tmp, t->pos_path) != 0)
        log_error("forward", "cannot save position", LF_S("file", t->pos_path), LF_S("err", strerror(errno)));
    t->last_save_ms = clock_wall_ms();
    t->saved = p;
}

static void commit(fw_target_t *t, wal_pos_t p)
{
    pthread_mutex_lock(&t->mu);
    t->committed = p;
    t->have_committed = true;
    pthread_mutex_unlock(&t->mu);
    atomic_store(&t->segment, p.segment);
    if ((p.segment != t->saved.segment || p.offset != t->saved.offset) && clock_wall_ms() - t->last_save_ms >= 1000)
        save_position(t);
}

static bool pos_before(wal_pos_t a, wal_pos_t b)
{
    return a.segment < b.segment || (a.segment == b.segment && a.offset < b.offset);
}

/* The WAL hold: lowest committed segment, minus segments past --remote-write.wal-max-hold. */
static uint32_t fw_hold(void *ud)
{
    struct api_forward *f = ud;
    uint32_t hold = 0;
    for (size_t i = 0; i < f->ntargets; i++) {
        fw_target_t *t = &f->targets[i];
        pthread_mutex_lock(&t->mu);
        if (t->have_committed && (!hold || t->committed.segment < hold))
            hold = t->committed.segment;
        pthread_mutex_unlock(&t->mu);
    }
    if (hold && f->o.wal_max_hold_ms > 0) {
        int64_t oldest = clock_wall_ms() - f->o.wal_max_hold_ms;
        uint32_t s = hold, newest = wal_watch_last_segment(f->wal_dir);
        while (s && s < newest) {
            char path[4200];
            struct stat st;
            snprintf(path, sizeof(path), "%s/%08" PRIu32 ".wal", f->wal_dir, s);
            if (stat(path, &st) == 0 && (int64_t)st.st_mtime * 1000 >= oldest)
                break;
            s = wal_watch_next_segment(f->wal_dir, s);
        }
        if (s != hold) {
            log_warn("forward", "unsent WAL segments older than --remote-write.wal-max-hold are released",
                     LF_I("from_segment", hold), LF_I("to_segment", s));
            hold = s;
        }
    }
    return hold;
}

/* ---- series --------------------------------------------------------------------------------- */

/* Builds an entry: the series' labels merged with the external labels (a series' own label wins). */
static fw_series_t *series_new(struct api_forward *f, uint64_t id, const labels_t *ls)
{
    size_t n = 0, bytes = 0, i = 0, j = 0;
    /* count and size the merge */
    while (i < ls->n || j < f->next) {
        int c = i == ls->n ? 1 : j == f->next ? -1 : strcmp(ls->v[i].name, f->ext[j].name);
        const label_t *l = c <= 0 ? &ls->v[i] : &f->ext[j];
        if (c <= 0)
            i++;
        if (c >= 0)
            j++;
        bytes += strlen(l->name) + strlen(l->value) + 2;
        n++;
    }
    fw_series_t *s = malloc(sizeof(*s) + n * (sizeof(Prometheus__Label) + sizeof(Prometheus__Label *)) + bytes);
    if (!s)
        return NULL;
    s->id = id;
    s->n = n;
    s->labels = (Prometheus__Label *)(s + 1);
    s->plabels = (Prometheus__Label **)(s->labels + n);
    char *str = (char *)(s->plabels + n);
    i = j = n = 0;
    while (i < ls->n || j < f->next) {
        int c = i == ls->n ? 1 : j == f->next ? -1 : strcmp(ls->v[i].name, f->ext[j].name);
        const label_t *l = c <= 0 ? &ls->v[i] : &f->ext[j];
        if (c <= 0)
            i++;
        if (c >= 0)
            j++;
        Prometheus__Label init = PROMETHEUS__LABEL__INIT;
        s->labels[n] = init;
        size_t a = strlen(l->name) + 1, b = strlen(l->value) + 1;
        memcpy(str, l->name, a);
        s->labels[n].name = str;
        str += a;
        memcpy(str, l->value, b);
        s->labels[n].value = str;
        str += b;
        s->plabels[n] = &s->labels[n];
        n++;
    }
    return s;
}

static int learn_series(void *ud, uint64_t id, const labels_t *ls)
{
    fw_target_t *t = ud;
    if (map_get(&t->map, id))
        return 0;
    labels_t sorted = *ls;
    /* WAL labels are sorted already; be safe with a copy when they are not */
    label_t tmp[ls->n ? ls->n : 1];
    if (labels_check_sorted_unique(ls) != 0) {
        memcpy(tmp, ls->v, ls->n * sizeof(*tmp));
        sorted.v = tmp;
        labels_sort(&sorted);
    }
    fw_series_t *s = series_new(t->fw, id, &sorted);
    if (!s || map_put(&t->map, s) != 0) {
        free(s);
        return -1;
    }
    return 0;
}

static fw_series_t *lookup_series(fw_target_t *t, uint64_t id)
{
    fw_series_t *s = map_get(&t->map, id);
    if (s)
        return s;
    arena_reset(t->scratch);
    labels_t ls;
    if (storage_series_labels(t->fw->storage, id, t->scratch, &ls) != 0)
        return NULL;
    if (learn_series(t, id, &ls) != 0)
        return NULL;
    return map_get(&t->map, id);
}

/* ---- reader --------------------------------------------------------------------------------- */

typedef struct {
    fw_target_t *t;
    size_t n;
    uint64_t seq;
    int64_t min_t;
    uint64_t unknown;
} round_t;

static int deal_samples(void *ud, const wal_sample_t *v, size_t n)
{
    round_t *r = ud;
    fw_target_t *t = r->t;
    for (size_t i = 0; i < n; i++) {
        fw_series_t *s = lookup_series(t, v[i].series_id);
        if (!s) {
            r->unknown++;
            continue;
        }
        fw_shard_t *sh = &t->shards[hash_mix64(s->id) % t->fw->o.shards];
        if (sh->n == sh->cap) {
            size_t ncap = sh->cap ? sh->cap * 2 : 1024;
            fw_item_t *ni = realloc(sh->items, ncap * sizeof(*ni));
            if (!ni)
                return -1;
            sh->items = ni;
            sh->cap = ncap;
        }
        sh->items[sh->n++] = (fw_item_t){.s = s, .t = v[i].t_ms, .v = v[i].v, .seq = r->seq++};
        if (v[i].t_ms < r->min_t)
            r->min_t = v[i].t_ms;
        r->n++;
    }
    return 0;
}

/* Hands the round to the shards and waits. Returns 0 when every batch is settled, -1 at stop. */
static int run_round(fw_target_t *t, round_t *r)
{
    atomic_store(&t->round_min_t, r->min_t);
    atomic_fetch_add(&t->pending, (int64_t)r->n);
    pthread_mutex_lock(&t->mu);
    t->gen++;
    t->outstanding = (int)t->fw->o.shards;
    pthread_cond_broadcast(&t->cv);
    while (t->outstanding > 0 && !atomic_load(&t->fw->stopping))
        pthread_cond_wait(&t->cv, &t->mu);
    int rc = t->outstanding == 0 ? 0 : -1;
    pthread_mutex_unlock(&t->mu);
    if (rc == 0)
        atomic_store(&t->pending, 0);
    return rc;
}

static void *reader_main(void *arg)
{
    fw_target_t *t = arg;
    struct api_forward *f = t->fw;
    pthread_mutex_lock(&t->mu);
    wal_pos_t skip_before = t->committed;
    pthread_mutex_unlock(&t->mu);
    /* Re-read the committed segment from its start: its series records are needed. */
    wal_watch_t *w = wal_watch_open(f->wal_dir, (wal_pos_t){.segment = skip_before.segment, .offset = 0});
    if (!w) {
        log_error("forward", "out of memory starting the WAL reader", LF_S("remote_name", t->name));
        return NULL;
    }
    size_t limit = (size_t)f->o.shards * f->o.max_samples_per_send;
    round_t r = {.t = t, .min_t = INT64_MAX};
    wal_record_decoder_t dec;
    wal_record_decoder_init(&dec);
    uint32_t skipped_seen = 0;
    while (!atomic_load(&f->stopping)) {
        uint8_t type;
        const uint8_t *p;
        size_t len;
        wal_pos_t at;
        int rc = wal_watch_next(w, &type, &p, &len, &at);
        wal_watch_stats_t ws;
        wal_watch_get_stats(w, &ws);
        if (ws.segments_skipped != skipped_seen) {
            atomic_fetch_add(&t->segments_skipped, ws.segments_skipped - skipped_seen);
            skipped_seen = ws.segments_skipped;
        }
        if (rc == WAL_WATCH_RECORD) {
            int drc = 0;
            if (wal_record_is_series(type))
                drc = wal_record_decode_series(&dec, type, p, len, learn_series, t);
            else if (type == WAL_REC_SAMPLES && !pos_before(at, skip_before))
                drc = wal_record_decode_samples(&dec, p, len, deal_samples, &r);
            if (drc != 0)
                log_error("forward", "undecodable WAL record skipped", LF_S("remote_name", t->name),
                          LF_I("segment", at.segment), LF_I("offset", (int64_t)at.offset));
            if (r.n < limit)
                continue;
        } else if (rc < 0) {
            log_error("forward", "reading the WAL failed; retrying", LF_S("remote_name", t->name),
                      LF_S("dir", f->wal_dir));
            fw_sleep(f, 1000);
            continue;
        }
        if (r.unknown) {
            atomic_fetch_add(&t->dropped_unknown, r.unknown);
            log_error("forward", "samples of series with unknown labels dropped", LF_S("remote_name", t->name),
                      LF_I("samples", (int64_t)r.unknown));
            r.unknown = 0;
        }
        if (r.n) {
            if (run_round(t, &r) != 0)
                break; /* stopping: the round is resent after restart */
            r.n = 0;
            r.min_t = INT64_MAX;
        }
        wal_pos_t now = wal_watch_pos(w);
        if (!pos_before(now, skip_before))
            commit(t, now);
        if (rc == WAL_WATCH_EOF)
            fw_sleep(f, f->o.poll_interval_ms);
    }
    wal_watch_close(w);
    wal_record_decoder_free(&dec);
    return NULL;
}

/* ---- shards --------------------------------------------------------------------------------- */

static int item_cmp(const void *a, const void *b)
{
    const fw_item_t *x = a, *y = b;
    if (x->s != y->s)
        return x->s->id < y->s->id ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Encodes items[0..n) as a snappy-compressed WriteRequest into sh->snap. */
static int encode(fw_shard_t *sh, const fw_item_t *items, size_t n)
{
    if (n > sh->scratch_cap) {
        free(sh->ts);
        free(sh->pts);
        free(sh->smp);
        free(sh->psmp);
        sh->ts = malloc(n * sizeof(*sh->ts));
        sh->pts = malloc(n * sizeof(*sh->pts));
        sh->smp = malloc(n * sizeof(*sh->smp));
        sh->psmp = malloc(n * sizeof(*sh->psmp));
        if (!sh->ts || !sh->pts || !sh->smp || !sh->psmp) {
            sh->scratch_cap = 0;
            return -1;
        }
        sh->scratch_cap = n;
    }
    size_t nts = 0;
    for (size_t i = 0; i < n; i++) {
        Prometheus__Sample si = PROMETHEUS__SAMPLE__INIT;
        si.value = items[i].v;
        si.timestamp = items[i].t;
        sh->smp[i] = si;
        sh->psmp[i] = &sh->smp[i];
        if (i == 0 || items[i].s != items[i - 1].s) {
            Prometheus__TimeSeries ti = PROMETHEUS__TIME_SERIES__INIT;
            ti.n_labels = items[i].s->n;
            ti.labels = items[i].s->plabels;
            ti.samples = &sh->psmp[i];
            ti.n_samples = 0;
            sh->ts[nts] = ti;
            sh->pts[nts] = &sh->ts[nts];
            nts++;
        }
        sh->ts[nts - 1].n_samples++;
    }
    Prometheus__WriteRequest wr = PROMETHEUS__WRITE_REQUEST__INIT;
    wr.n_timeseries = nts;
    wr.timeseries = sh->pts;
    size_t plen = prometheus__write_request__get_packed_size(&wr);
    buf_reset(&sh->pb);
    if (buf_try_reserve(&sh->pb, plen) != 0)
        return -1;
    sh->pb.len = prometheus__write_request__pack(&wr, (uint8_t *)sh->pb.data);
    size_t clen = snappy_max_compressed_length(sh->pb.len);
    buf_reset(&sh->snap);
    if (buf_try_reserve(&sh->snap, clen) != 0)
        return -1;
    if (snappy_compress(sh->pb.data, sh->pb.len, sh->snap.data, &clen) != SNAPPY_OK)
        return -1;
    sh->snap.len = clen;
    return 0;
}

/* Sends one batch until it is settled. 0 = settled (sent or dropped), -1 = stopping. */
static int send_batch(fw_shard_t *sh, const fw_item_t *items, size_t n)
{
    fw_target_t *t = sh->t;
    struct api_forward *f = t->fw;
    if (encode(sh, items, n) != 0) {
        log_error("forward", "cannot encode a batch (out of memory); dropped", LF_S("remote_name", t->name),
                  LF_I("samples", (int64_t)n));
        atomic_fetch_add(&t->failed, n);
        atomic_fetch_sub(&t->pending, (int64_t)n);
        return 0;
    }
    httpc_response_t resp;
    httpc_response_init(&resp);
    int rc = 0;
    for (uint32_t attempt = 0;; attempt++) {
        if (atomic_load(&f->stopping)) {
            rc = -1;
            break;
        }
        buf_reset(&sh->hdr);
        buf_puts(&sh->hdr, t->headers);
        if (t->bearer_file[0]) {
            buf_t tok = BUF_INIT;
            char err[256];
            buf_puts(&tok, "");
            if (httpc_read_secret_file(t->bearer_file, &tok, err, sizeof(err)) == 0)
                buf_printf(&sh->hdr, "Authorization: Bearer %s\r\n", tok.data);
            else
                log_warn("forward", "cannot read the bearer token file", LF_S("remote_name", t->name),
                         LF_S("err", err));
            buf_free(&tok);
        }
        char err[512] = "";
        atomic_fetch_add(&t->requests, 1);
        int prc = httpc_post(sh->conn, sh->hdr.data, sh->snap.data, sh->snap.len, f->o.timeout_ms, FW_MAX_RESPONSE_BODY,
                             &resp, err, sizeof(err));
        int cls = prc != 0 ? 1 : api_forward__classify(resp.status, t->retry_on_429);
        if (cls == 0) {
            atomic_fetch_add(&t->sent, n);
            atomic_fetch_add(&t->bytes_sent, sh->snap.len);
            int64_t hi = INT64_MIN;
            for (size_t i = 0; i < n; i++)
                if (items[i].t > hi)
                    hi = items[i].t;
            int64_t cur = atomic_load(&t->highest_sent_ms);
            while (hi > cur && !atomic_compare_exchange_weak(&t->highest_sent_ms, &cur, hi))
                ;
            if (atomic_exchange(&t->failing, false))
                log_info("forward", "remote write recovered", LF_S("remote_name", t->name), LF_S("url", t->url));
            break;
        }
        if (cls < 0) {
            /* printable part of the receiver's reason */
            for (size_t i = 0; i < resp.body.len; i++)
                if ((unsigned char)resp.body.data[i] < 0x20)
                    resp.body.data[i] = ' ';
            log_error("forward", "remote write batch refused; dropped (not retried)", LF_S("remote_name", t->name),
                      LF_S("url", t->url), LF_I("status", resp.status), LF_I("samples", (int64_t)n),
                      LF_S("reason", resp.body.len ? resp.body.data : ""));
            atomic_fetch_add(&t->failed, n);
            break;
        }
        atomic_fetch_add(&t->retried, n);
        int64_t wait = api_forward__backoff_ms(f->o.min_backoff_ms, f->o.max_backoff_ms, attempt);
        if (prc == 0 && resp.status == 429 && resp.retry_after_ms >= 0)
            wait = resp.retry_after_ms;
        if (!atomic_exchange(&t->failing, true) || attempt == 0) {
            if (prc != 0)
                log_warn("forward", "remote write failed; retrying", LF_S("remote_name", t->name), LF_S("url", t->url),
                         LF_S("err", err), LF_I("backoff_ms", wait));
            else
                log_warn("forward", "remote write failed; retrying", LF_S("remote_name", t->name),
                         LF_I("status", resp.status), LF_I("backoff_ms", wait));
        }
        if (fw_sleep(f, wait)) {
            rc = -1;
            break;
        }
    }
    httpc_response_free(&resp);
    if (rc == 0)
        atomic_fetch_sub(&t->pending, (int64_t)n);
    return rc;
}

static void *shard_main(void *arg)
{
    fw_shard_t *sh = arg;
    fw_target_t *t = sh->t;
    struct api_forward *f = t->fw;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (t->gen == sh->gen_done && !atomic_load(&f->stopping))
            pthread_cond_wait(&t->cv, &t->mu);
        uint64_t gen = t->gen;
        pthread_mutex_unlock(&t->mu);
        if (atomic_load(&f->stopping))
            break;
        if (sh->n > 1)
            qsort(sh->items, sh->n, sizeof(*sh->items), item_cmp);
        int rc = 0;
        size_t per = f->o.max_samples_per_send;
        for (size_t i = 0; i < sh->n && rc == 0; i += per)
            rc = send_batch(sh, sh->items + i, sh->n - i < per ? sh->n - i : per);
        if (rc != 0)
            break;
        sh->n = 0;
        pthread_mutex_lock(&t->mu);
        sh->gen_done = gen;
        t->outstanding--;
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

static int parse_external_labels(struct api_forward *f, const char *list, char *err, size_t errlen)
{
    if (!list || !*list)
        return 0;
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == '\n';
    f->ext = calloc(n, sizeof(*f->ext));
    f->ext_strs = strdup(list);
    if (!f->ext || !f->ext_strs)
        return -1;
    for (char *save = NULL, *tok = strtok_r(f->ext_strs, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || !labels_valid_name(tok, (size_t)(eq - tok))) {
            snprintf(err, errlen, "--external-label must be name=value with a valid label name (got \"%s\")", tok);
            return -1;
        }
        *eq = 0;
        const char *v = eq + 1;
        if (v[0] == '"' && strlen(v) >= 2 && v[strlen(v) - 1] == '"') {
            eq[strlen(v)] = 0;
            v++;
        }
        for (size_t i = 0; i < f->next; i++)
            if (strcmp(f->ext[i].name, tok) == 0) {
                snprintf(err, errlen, "--external-label %s given twice", tok);
                return -1;
            }
        f->ext[f->next++] = (label_t){tok, v};
    }
    labels_t ls = {f->ext, f->next};
    labels_sort(&ls);
    return 0;
}

api_forward_t *api_forward_new(const api_forward_options_t *o, char *err, size_t errlen)
{
    err[0] = 0;
    if (!o->targets || !o->targets[0])
        return NULL;
    const char *wal_dir = storage_wal_dir(o->storage);
    if (!wal_dir) {
        snprintf(err, errlen, "remote write needs a data directory (it reads the WAL)");
        return NULL;
    }
    struct api_forward *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->o = *o;
    if (!f->o.shards)
        f->o.shards = 4;
    if (!f->o.max_samples_per_send)
        f->o.max_samples_per_send = 2000;
    if (f->o.timeout_ms <= 0)
        f->o.timeout_ms = 30000;
    if (f->o.min_backoff_ms <= 0)
        f->o.min_backoff_ms = 30;
    if (f->o.max_backoff_ms < f->o.min_backoff_ms)
        f->o.max_backoff_ms = f->o.min_backoff_ms > 5000 ? f->o.min_backoff_ms : 5000;
    if (f->o.poll_interval_ms <= 0)
        f->o.poll_interval_ms = 100;
    f->storage = o->storage;
    pthread_mutex_init(&f->stop_mu, NULL);
    pthread_cond_init(&f->stop_cv, NULL);
    f->wal_dir = strdup(wal_dir);
    size_t i = 0; /* targets set up so far: fail frees exactly those */
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/forward", o->data_dir);
    f->dir = strdup(dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        goto fail;
    }
    if (parse_external_labels(f, o->external_labels, err, errlen) != 0) {
        if (!err[0])
            snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (const char *p = o->targets; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] ? 1 : 0))
        f->ntargets += strcspn(p, "\n") > 0;
    f->targets = calloc(f->ntargets, sizeof(*f->targets));
    if (!f->targets)
        goto fail;
    for (const char *p = o->targets; *p && i < f->ntargets;) {
        size_t l = strcspn(p, "\n");
        if (l) {
            char *spec = strndup(p, l);
            int rc = target_setup(f, &f->targets[i], spec, err, errlen);
            free(spec);
            i++;
            if (rc != 0)
                goto fail;
            for (size_t k = 0; k + 1 < i; k++)
                if (strcmp(f->targets[k].url, f->targets[i - 1].url) == 0) {
                    snprintf(err, errlen, "--remote-write.url %s given twice", f->targets[k].url);
                    goto fail;
                }
            load_position(&f->targets[i - 1]);
        }
        p += l + (p[l] ? 1 : 0);
    }
    if (storage_set_wal_hold(f->storage, fw_hold, f) != 0) {
        snprintf(err, errlen, "cannot register the WAL hold (storage already recovering)");
        goto fail;
    }
    return f;
fail:
    f->ntargets = i;
    api_forward_free(f);
    return NULL;
}

int api_forward_start(api_forward_t *f, char *err, size_t errlen)
{
    uint32_t newest = wal_watch_last_segment(f->wal_dir);
    for (size_t i = 0; i < f->ntargets; i++) {
        fw_target_t *t = &f->targets[i];
        pthread_mutex_lock(&t->mu);
        if (!t->have_committed) {
            t->committed = (wal_pos_t){.segment = newest ? newest : 1, .offset = 0};
            t->have_committed = true;
            log_info("forward", "remote write starts with new data", LF_S("remote_name", t->name), LF_S("url", t->url),
                     LF_I("segment", t->committed.segment));
        }
        pthread_mutex_unlock(&t->mu);
        atomic_store(&t->segment, t->committed.segment);
        save_position(t);
        t->shards = calloc(f->o.shards, sizeof(*t->shards));
        if (!t->shards)
            goto oom;
        for (uint32_t k = 0; k < f->o.shards; k++) {
            fw_shard_t *sh = &t->shards[k];
            sh->t = t;
            sh->idx = (int)k;
            sh->conn = httpc_conn_new_tls(&t->u, t->tls);
            if (!sh->conn)
                goto oom;
            if (pthread_create(&sh->th, NULL, shard_main, sh) != 0) {
                snprintf(err, errlen, "cannot start a remote-write shard thread");
                return -1;
            }
            sh->started = true;
        }
        if (pthread_create(&t->reader, NULL, reader_main, t) != 0) {
            snprintf(err, errlen, "cannot start a remote-write reader thread");
            return -1;
        }
        t->reader_started = true;
        log_info("forward", "remote write started", LF_S("remote_name", t->name), LF_S("url", t->url),
                 LF_I("shards", f->o.shards), LF_I("max_samples_per_send", f->o.max_samples_per_send));
    }
    f->started = true;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return -1;
}

void api_forward_stop(api_forward_t *f)
{
    if (!f || f->stopped)
        return;
    f->stopped = true;
    pthread_mutex_lock(&f->stop_mu);
    atomic_store(&f->stopping, true);
    pthread_cond_broadcast(&f->stop_cv);
    pthread_mutex_unlock(&f->stop_mu);
    for (size_t i = 0; i < f->ntargets; i++) {
        fw_target_t *t = &f->targets[i];
        pthread_mutex_lock(&t->mu);
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        if (t->reader_started)
            pthread_join(t->reader, NULL);
        for (uint32_t k = 0; t->shards && k < f->o.shards; k++)
            if (t->shards[k].started)
                pthread_join(t->shards[k].th, NULL);
        save_position(t);
        log_info("forward", "remote write stopped", LF_S("remote_name", t->name), LF_I("segment", t->committed.segment),
                 LF_I("offset", (int64_t)t->committed.offset));
    }
}

void api_forward_free(api_forward_t *f)
{
    if (!f)
        return;
    api_forward_stop(f);
    for (size_t i = 0; i < f->ntargets; i++) {
        fw_target_t *t = &f->targets[i];
        for (uint32_t k = 0; t->shards && k < f->o.shards; k++) {
            fw_shard_t *sh = &t->shards[k];
            httpc_conn_free(sh->conn);
            free(sh->items);
            free(sh->ts);
            free(sh->pts);
            free(sh->smp);
            free(sh->psmp);
            buf_free(&sh->pb);
            buf_free(&sh->snap);
            buf_free(&sh->hdr);
        }
        free(t->shards);
        map_free(&t->map);
        if (t->scratch)
            arena_destroy(t->scratch);
        free(t->url);
        free(t->name);
        free(t->pos_path);
        free(t->headers);
        free(t->bearer_file);
        httpc_tls_free(t->tls); /* after the shards' connections */
        if (t->fw) {
            pthread_mutex_destroy(&t->mu);
            pthread_cond_destroy(&t->cv);
        }
    }
    free(f->targets);
    free(f->ext);
    free(f->ext_strs);
    free(f->dir);
    free(f->wal_dir);
    pthread_mutex_destroy(&f->stop_mu);
    pthread_cond_destroy(&f->stop_cv);
    free(f);
}

/* ---- metrics -------------------------------------------------------------------------------- */

static void metric_head(buf_t *b, const char *name, const char *type, const char *help)
{
    buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_line(buf_t *b, const char *name, const fw_target_t *t, double v)
{
    buf_printf(b, "%s{remote_name=", name);
    buf_put_json_string(b, t->name, strlen(t->name));
    buf_puts(b, ",url=");
    buf_put_json_string(b, t->url, strlen(t->url));
    buf_puts(b, "} ");
    buf_put_float(b, v);
    buf_putc(b, '\n');
}

void api_forward_write_metrics(void *ud, buf_t *out)
{
    struct api_forward *f = ud;
    if (!f)
        return;
    int64_t now = clock_wall_ms();
    static const struct {
        const char *name, *type, *help;
        int which;
    } m[] = {
        {"sluice_remote_storage_samples_pending", "gauge",
         "Samples read from the WAL and not yet acknowledged or dropped.", 0},
        {"sluice_remote_storage_samples_sent_total", "counter", "Samples the receiver acknowledged (2xx).", 1},
        {"sluice_remote_storage_samples_failed_total", "counter", "Samples dropped after a non-retryable answer (4xx).",
         2},
        {"sluice_remote_storage_samples_retried_total", "counter",
         "Samples in batches that were retried (5xx, 429 with retry, network errors).", 3},
        {"sluice_remote_storage_samples_dropped_unknown_series_total", "counter",
         "Samples of series whose labels could not be found.", 4},
        {"sluice_remote_storage_highest_sent_timestamp_seconds", "gauge",
         "Newest sample timestamp the receiver acknowledged.", 5},
        {"sluice_remote_storage_lag_seconds", "gauge",
         "Age of the oldest sample not yet settled (0 when nothing is pending).", 6},
        {"sluice_remote_storage_sent_bytes_total", "counter", "Compressed request bytes acknowledged.", 7},
        {"sluice_remote_storage_requests_total", "counter", "HTTP requests attempted.", 8},
        {"sluice_remote_storage_wal_segments_skipped_total", "counter",
         "WAL segments deleted before this target read them (data lost to it).", 9},
        {"sluice_remote_storage_wal_segment", "gauge", "WAL segment of the committed position.", 10},
        {"sluice_remote_storage_shards", "gauge", "Concurrent senders.", 11},
    };
    for (size_t k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
        metric_head(out, m[k].name, m[k].type, m[k].help);
        for (size_t i = 0; i < f->ntargets; i++) {
            fw_target_t *t = &f->targets[i];
            double v = 0;
            switch (m[k].which) {
            case 0: v = (double)atomic_load(&t->pending); break;
            case 1: v = (double)atomic_load(&t->sent); break;
            case 2: v = (double)atomic_load(&t->failed); break;
            case 3: v = (double)atomic_load(&t->retried); break;
            case 4: v = (double)atomic_load(&t->dropped_unknown); break;
            case 5: v = (double)atomic_load(&t->highest_sent_ms) / 1000.0; break;
            case 6: {
                int64_t mt = atomic_load(&t->round_min_t);
                v = atomic_load(&t->pending) > 0 && mt != INT64_MAX && now > mt ? (double)(now - mt) / 1000.0 : 0;
                break;
            }
            case 7: v = (double)atomic_load(&t->bytes_sent); break;
            case 8: v = (double)atomic_load(&t->requests); break;
            case 9: v = (double)atomic_load(&t->segments_skipped); break;
            case 10: v = (double)atomic_load(&t->segment); break;
            case 11: v = f->o.shards; break;
            }
            metric_line(out, m[k].name, t, v);
        }
    }
}
