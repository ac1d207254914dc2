/*
 * api/control — flow-control endpoints; see control.h and docs/control.md.
 *
 * Threads and who owns what:
 *
 *   worker threads (N)                        control thread (1)
 *   ------------------                        ---------------------------------
 *   parse + validate + auth                   owns every SQLite statement (control_store_*)
 *   reads of current state (store cache)      and the expiry clock (timed wait until the
 *   park long-polls / SSE subscribers         earliest expires_at)
 *   in their own lists (ctl_worker_t)
 *        |  op (apply / history / replay)         |
 *        +--------------------------------------> |  takes every queued op; consecutive
 *        |                                        |  changes are one group commit (one fsync)
 *        |                                        |  writes each parked GET poll's answer
 *        |   (poll sockets) <-------------------- |  straight to its socket (ctl_wake_polls:
 *        |                                        |  io_uring submissions, internal/net/fanout)
 *        | <---- api_server_run_on(every worker, deliver event) -- free the answered polls,
 *        |                                        |  answer HEAD polls, SSE subscribers
 *        | <---- api_server_run_on(op's worker, op done)  ------- the op's reply
 *
 * A change is durable (committed, fsync'd) before any poll sees it, and its parked polls are
 * answered before its own request is, without a trip through each worker's event queue (where
 * the answer would wait behind pushes and queries) and without evhttp's per-reply work: the
 * answer (status line, headers, body, `Connection: close`) is rendered once per change and written
 * to every poll's socket through io_uring (internal/net/fanout: one submission per 512 sockets and
 * lane, a lane per worker). evhttp never learns what was sent, so the connection is closed after
 * the answer (the worker frees it); clients poll again on a new one. A worker's poll list is
 * guarded by its polls_mu, held by the control thread while it writes to those sockets, so a
 * poll's connection is never closed (its fd reused) under a send. Subscribers and the rest of a
 * worker's lists are touched only by that worker.
 *
 * An op belongs to whoever holds it: the control thread between enqueue and run_on, then the
 * op's worker, which frees it in ctl_op_done. If the client goes away meanwhile, the request's
 * close callback (same worker) clears op->req so the reply is skipped.
 *
 * The per-worker lists, the SSE framing and the shutdown fan-out come from api/sse.
 *
 * SSE: `id:` is the global event id from the audit log; `Last-Event-ID` (or ?last_event_id=)
 * resumes: the subscriber is registered first (live events are held back), then the missed
 * events are read from the log by the control thread, sent, and the held-back ones with a larger
 * id follow, so nothing is lost or repeated. A subscriber whose unsent output exceeds
 * CTL_SSE_MAX_PENDING is dropped (stream ended) so a stalled reader cannot grow memory.
 *
 * Auth: with --web.control-token-file, changes need `Authorization: Bearer <token>` (the token's
 * name becomes updated_by); without it, changes are accepted only from a peer whose address is
 * exactly 127.0.0.1 or ::1 — other loopback addresses (127.0.0.2, ...) count as remote, which is
 * also how the tests stand in for a remote peer. --web.control-read-auth applies the same rule
 * to reads (and to the TIS poll).
 */
#include "api/control.h"

#include <assert.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "api/router.h"
#include "api/sse.h"
#include "internal/control/control.h"
#include "internal/control/store.h"
#include "internal/net/fanout.h"
#include "internal/util/clock.h"
#include "internal/util/histogram.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "internal/util/parse.h"

#define CTL_MAX_WAIT_MS (5 * 60 * 1000)
#define CTL_MAX_PARKED 20000
#define CTL_MAX_SUBSCRIBERS 1000
#define CTL_SSE_MAX_PENDING (256 * 1024)
#define CTL_HEARTBEAT_MS 15000
/* How long the connections of polls the control thread answered stay open before their worker
 * closes them: each close sends a FIN through the receiving side's TCP path on this worker's CPU,
 * and right after a fan-out that would compete with the clients reading their answers (on a
 * client beside sluice, ~3 ms of reads per 1,000 polls) and hold back the change's own reply and
 * its SSE events, which the worker sends next. The answer carries Content-Length and
 * Connection: close, so no client waits for the close. */
#define CTL_CLOSE_DELAY_MS 20
#define CTL_REPLAY_LIMIT 10000
#define CTL_HISTORY_MAX 1000
#define CTL_GROUP_MAX 256         /* changes per group commit */
#define CTL_CHECKPOINT_FRAMES 256 /* WAL pages before the idle control thread checkpoints */

/* --- types ------------------------------------------------------------------------------------- */

typedef struct ctl_poll {
    api_req_t *req;
    char *job;
    uint64_t version; /* the version the client has: only a newer one answers it */
    int fd;           /* the connection's socket, for the control thread's direct answer; -1: none */
    bool answered;    /* the control thread wrote its answer (under polls_mu): on `answered` now */
    struct event *timer;
    api_sse_link_t link; /* on ctl->workers[worker].polls, or .answered */
    int worker;
    api_control_t *ctl;
} ctl_poll_t;

/* One event shared by every worker it is delivered to. */
typedef struct {
    control_event_t *ev;
    bool wake; /* answers the job's parked polls (not when a newer change of it is in the same group) */
    _Atomic int refs;
} ctl_shared_t;

typedef struct ctl_held {
    ctl_shared_t *sh;
    struct ctl_held *next;
} ctl_held_t;

typedef struct ctl_sub {
    api_req_t *req; /* NULL once the client left while a replay was pending */
    char *job;      /* NULL: every job */
    uint64_t last_id;
    bool replaying;
    ctl_held_t *held, *held_tail; /* live events that arrived during the replay */
    api_sse_link_t link;          /* on ctl->workers[worker].subs */
    int worker;
    api_control_t *ctl;
} ctl_sub_t;

typedef struct {
    /* polls_mu guards polls, answered and every poll's `answered`: the control thread answers
     * parked polls itself (ctl_wake_polls) and holds it while it writes to their sockets, so a
     * poll's connection cannot be closed (and its fd reused) under it. */
    pthread_mutex_t polls_mu;
    api_sse_list_t polls;    /* of ctl_poll_t, waiting */
    api_sse_list_t answered; /* of ctl_poll_t the control thread answered; the worker frees them */
    api_sse_list_t subs;     /* of ctl_sub_t */
    struct event *heartbeat;
    struct event *close_timer; /* closes `answered` CTL_CLOSE_DELAY_MS after a change */
    bool closing;
    api_control_t *ctl;
} ctl_worker_t;

typedef enum { CTL_OP_APPLY, CTL_OP_HISTORY, CTL_OP_REPLAY } ctl_op_kind_t;

/* An apply from inside the daemon (api_control_apply): the caller waits on it instead of a
 * worker getting the reply. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int code;
    uint64_t version;
    char err[256];
} ctl_sync_t;

typedef struct ctl_op {
    ctl_op_kind_t kind;
    api_req_t *req;
    int worker;
    char *job;
    /* apply */
    control_change_t chg;
    char *reason;
    char *who;
    /* history */
    uint64_t before;
    int limit;
    /* replay */
    ctl_sub_t *sub;
    uint64_t after_id;
    control_event_t **events;
    size_t nevents, cap;
    /* result */
    int code;
    buf_t body;
    char etag[32];
    ctl_sync_t *sync;     /* api_control_apply: signal it instead of replying */
    api_control_t *ctl;   /* set by ctl_submit */
    int64_t submitted_ns; /* monotonic, set by ctl_submit: the start of its propagation time */
    struct ctl_op *next;
} ctl_op_t;

/* The handle main.c makes. srv, store, workers, the tokens and read_auth are set by
 * api_control_new and not changed until shutdown; workers[w] belongs to worker w; the op queue,
 * stop and stopping are guarded by mu. Polls, subscribers, workers, ops and deliveries carry a
 * pointer back to it for the callbacks that get only them. */
struct api_control {
    api_server_t *srv;
    control_store_t *store;
    int nworkers;
    ctl_worker_t *workers;
    char **tok_names, **tok_values;
    int ntokens;
    bool have_tokens, read_auth;
    /* control thread */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ctl_op_t *head, *tail;
    bool stop;
    bool stopping;     /* shutdown hook ran: no more fan-out */
    _Atomic bool live; /* a request has been served: workers exist */
    /* expected jobs (api/availability) */
    api_control_job_hook_fn job_hook;
    void *job_hook_ud;
    /* metrics */
    _Atomic int64_t parked, subscribers;
    _Atomic uint64_t dropped, expired, polls_answered, polls_timed_out;
    /* where a change's time goes: the group commit (fsync included), the fan-out to parked polls
     * (render + the sends), and the whole from queueing the change to its polls answered */
    histogram_t commit_hist, fanout_hist, propagation_hist;
    /* the fan-out's sends (one io_uring submission per FANOUT_DEPTH polls) and its scratch arrays,
     * kept between changes; control thread only */
    fanout_t *fanout;
    ctl_poll_t **wake_polls;
    int *wake_fds;
    ssize_t *wake_res;
    size_t wake_cap;
};

/* --- small helpers ------------------------------------------------------------------------------ */

static void ctl_reply_error(api_req_t *req, int code, const char *type, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void ctl_reply_error(api_req_t *req, int code, const char *type, const char *field, const char *fmt, ...)
{
    buf_t msg = BUF_INIT, b = BUF_INIT;
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    buf_puts(&b, "{\"status\":\"error\",\"errorType\":");
    buf_put_json_string(&b, type, strlen(type));
    buf_puts(&b, ",\"error\":");
    buf_put_json_string(&b, msg.data ? msg.data : "", msg.len);
    if (field && field[0]) {
        buf_puts(&b, ",\"field\":");
        buf_put_json_string(&b, field, strlen(field));
    }
    buf_putc(&b, '}');
    api_reply_header(req, "Cache-Control", "no-store");
    api_reply(req, code, "application/json", b.data, b.len);
    buf_free(&msg);
    buf_free(&b);
}

static void ctl_reply_state(api_req_t *req, int code, const char *json, size_t len, uint64_t version)
{
    char etag[32];
    snprintf(etag, sizeof(etag), "\"%llu\"", (unsigned long long)version);
    api_reply_header(req, "ETag", etag);
    api_reply_header(req, "Cache-Control", "no-cache");
    if (code == 304)
        api_reply(req, 304, NULL, NULL, 0);
    else
        api_reply(req, code, "application/json", json, len);
}

/* --- tokens and auth -------------------------------------------------------------------------------- */

void api_control_free_tokens(char **names, char **tokens, int n)
{
    for (int i = 0; i < n; i++) {
        free(names[i]);
        if (tokens[i]) {
            /* a secret: do not leave it in freed memory */
            volatile char *p = tokens[i];
            while (*p)
                *p++ = 0;
        }
        free(tokens[i]);
    }
    free(names);
    free(tokens);
}

int api_control_load_tokens(const char *path, char ***names_out, char ***tokens_out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open control token file %s: %s", path, strerror(errno));
        return -1;
    }
    char **names = NULL, **tokens = NULL;
    int n = 0, cap = 0, lineno = 0;
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof(line) - 1 && line[len - 1] != '\n') {
            snprintf(err, errlen, "control token file %s line %d: line too long", path, lineno);
            goto fail;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s || *s == '#')
            continue;
        char *colon = strchr(s, ':');
        if (!colon || colon == s || !colon[1]) {
            snprintf(err, errlen, "control token file %s line %d: want \"name:token\"", path, lineno);
            goto fail;
        }
        *colon = 0;
        const char *tok = colon + 1;
        if (strlen(tok) < 8) {
            snprintf(err, errlen, "control token file %s line %d: token shorter than 8 characters", path, lineno);
            goto fail;
        }
        for (const char *c = s; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) {
                snprintf(err, errlen, "control token file %s line %d: control character in name", path, lineno);
                goto fail;
            }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(names, (size_t)cap * sizeof(*nn));
            if (nn)
                names = nn;
            char **nt = realloc(tokens, (size_t)cap * sizeof(*nt));
            if (nt)
                tokens = nt;
            if (!nn || !nt) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
        }
        names[n] = strdup(s);
        tokens[n] = strdup(tok);
        n++;
        if (!names[n - 1] || !tokens[n - 1]) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    fclose(f);
    if (n == 0) {
        snprintf(err, errlen, "control token file %s has no tokens", path);
        free(names);
        free(tokens);
        return -1;
    }
    *names_out = names;
    *tokens_out = tokens;
    return n;
fail:
    fclose(f);
    api_control_free_tokens(names, tokens, n);
    return -1;
}

/* Compares every byte of every token regardless of where a difference is, so the time taken does
 * not say how much of a guess was right. Returns the index of the matching token or -1. */
static int ctl_token_match(const api_control_t *ctl, const char *presented, size_t plen)
{
    int found = -1;
    for (int i = 0; i < ctl->ntokens; i++) {
        const char *t = ctl->tok_values[i];
        size_t tlen = strlen(t);
        unsigned diff = (unsigned)(tlen ^ plen);
        for (size_t k = 0; k < plen; k++)
            diff |= (unsigned char)presented[k] ^ (unsigned char)(k < tlen ? t[k] : 0);
        /* branch-free select */
        int hit = (int)(((diff | (0u - diff)) >> (sizeof(unsigned) * 8 - 1)) ^ 1u);
        found = hit ? i : found;
    }
    return found;
}

static bool ctl_peer_is_local(api_req_t *req, char *peer, size_t cap)
{
    const char *host = api_req_peer(req);
    snprintf(peer, cap, "%s", host ? host : "unknown");
    if (!host)
        return false;
    return strcmp(host, "127.0.0.1") == 0 || strcmp(host, "::1") == 0 || strcmp(host, "::ffff:127.0.0.1") == 0;
}

/* Checks the caller may do this; on refusal replies 401/403 and returns -1. who receives the name
 * recorded as updated_by. */
static int ctl_auth(api_control_t *ctl, api_req_t *req, bool mutation, char *who, size_t wholen)
{
    atomic_store(&ctl->live, true);
    if (!mutation && !ctl->read_auth) {
        snprintf(who, wholen, "anonymous");
        return 0;
    }
    if (ctl->have_tokens) {
        const char *h = api_req_header(req, "Authorization");
        if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
            api_reply_header(req, "WWW-Authenticate", "Bearer realm=\"sluice control\"");
            ctl_reply_error(req, 401, "unauthorized", NULL, "%s needs an Authorization: Bearer token",
                            mutation ? "changing flow control" : "reading flow control");
            return -1;
        }
        const char *tok = h + 7;
        while (*tok == ' ')
            tok++;
        int i = ctl_token_match(ctl, tok, strlen(tok));
        if (i < 0) {
            api_reply_header(req, "WWW-Authenticate", "Bearer realm=\"sluice control\", error=\"invalid_token\"");
            ctl_reply_error(req, 401, "unauthorized", NULL, "invalid bearer token");
            return -1;
        }
        snprintf(who, wholen, "%s", ctl->tok_names[i]);
        return 0;
    }
    char peer[64];
    if (!ctl_peer_is_local(req, peer, sizeof(peer))) {
        ctl_reply_error(req, 403, "forbidden", NULL,
                        "%s is only allowed from 127.0.0.1 or ::1 when no --web.control-token-file is set "
                        "(peer %s)",
                        mutation ? "changing flow control" : "reading flow control", peer);
        return -1;
    }
    snprintf(who, wholen, "anonymous@%s", peer);
    return 0;
}

/* --- browser cross-site requests ----------------------------------------------------------------- */

/* "http://h:80" and "h" name the same place; so do "https://h:443" and "h". */
static size_t ctl_host_len(const char *h, size_t n, bool https)
{
    const char *dflt = https ? ":443" : ":80";
    size_t dl = strlen(dflt);
    if (n > dl && strncmp(h + n - dl, dflt, dl) == 0)
        return n - dl;
    return n;
}

/* The Origin a browser sent names this server (the Host it asked for). */
static bool ctl_origin_is_host(const char *origin, const char *host)
{
    bool https = strncasecmp(origin, "https://", 8) == 0;
    if (!https && strncasecmp(origin, "http://", 7) != 0)
        return false; /* "null" (sandboxed frames, file: pages) and anything odd */
    const char *o = origin + (https ? 8 : 7);
    size_t ol = ctl_host_len(o, strlen(o), https), hl = ctl_host_len(host, strlen(host), https);
    return ol == hl && strncasecmp(o, host, ol) == 0;
}

/* A web page on any site can make the visitor's browser POST to sluice (a form, or fetch without
 * CORS), and the request then comes from the visitor's machine: loopback, which the token-less
 * mode trusts. Changes are refused unless they are plainly not that: no foreign Sec-Fetch-Site or
 * Origin, and a body (if any) of type application/json, which a cross-site page cannot send
 * without a CORS preflight that sluice never grants. 0, or -1 after replying. */
static int ctl_refuse_cross_site(api_req_t *req)
{
    const char *site = api_req_header(req, "Sec-Fetch-Site");
    if (site && strcasecmp(site, "same-origin") != 0 && strcasecmp(site, "none") != 0) {
        ctl_reply_error(req, 403, "forbidden", NULL, "cross-site request refused (Sec-Fetch-Site: %s)", site);
        return -1;
    }
    const char *origin = api_req_header(req, "Origin");
    const char *host = api_req_header(req, "Host");
    if (origin && !(host && ctl_origin_is_host(origin, host))) {
        ctl_reply_error(req, 403, "forbidden", NULL,
                        "request from origin %s refused: changes are accepted from sluice's own pages only", origin);
        return -1;
    }
    size_t len;
    api_req_body(req, &len);
    const char *ct = api_req_header(req, "Content-Type");
    if (len > 0 || ct) {
        size_t tl = ct ? strcspn(ct, "; \t") : 0;
        if (!ct || tl != strlen("application/json") || strncasecmp(ct, "application/json", tl) != 0) {
            ctl_reply_error(req, 415, "bad_data", NULL, "Content-Type must be application/json (got %s)",
                            ct ? ct : "none");
            return -1;
        }
    }
    return 0;
}

int api_control_authorize_change(api_control_t *ctl, api_req_t *req, char *who, size_t wholen)
{
    if (ctl_refuse_cross_site(req) != 0)
        return -1;
    return ctl_auth(ctl, req, true, who, wholen);
}

int api_control_authorize_read(api_control_t *ctl, api_req_t *req, char *who, size_t wholen)
{
    return ctl_auth(ctl, req, false, who, wholen);
}

void api_control_set_job_hook(api_control_t *ctl, api_control_job_hook_fn fn, void *ud)
{
    ctl->job_hook = fn;
    ctl->job_hook_ud = ud;
}

/* --- the control thread ------------------------------------------------------------------------------ */

static void ctl_deliver(void *arg);

typedef struct {
    api_control_t *ctl;
    ctl_shared_t *sh;
    int worker;
} ctl_delivery_t;

static void ctl_shared_release(ctl_shared_t *sh)
{
    if (atomic_fetch_sub(&sh->refs, 1) == 1) {
        control_event_free(sh->ev);
        free(sh);
    }
}

/* Fans one committed change out to every worker: the polls the control thread could not answer
 * itself (HEAD, a full socket buffer), the SSE subscribers, and freeing the polls it answered.
 * Takes ownership of ev. Control thread only. */
static void ctl_broadcast(api_control_t *ctl, control_event_t *ev, bool wake)
{
    pthread_mutex_lock(&ctl->mu);
    bool stopping = ctl->stopping;
    pthread_mutex_unlock(&ctl->mu);
    /* Before the first request nothing can be parked (and the workers may not exist yet); the
     * request that sets `live` reads the store after setting it, so it sees this change. */
    if (stopping || !atomic_load(&ctl->live) || ctl->nworkers == 0) {
        control_event_free(ev);
        return;
    }
    ctl_shared_t *sh = malloc(sizeof(*sh));
    if (!sh) {
        control_event_free(ev);
        return;
    }
    sh->ev = ev;
    sh->wake = wake;
    atomic_init(&sh->refs, ctl->nworkers);
    for (int w = 0; w < ctl->nworkers; w++) {
        ctl_delivery_t *d = malloc(sizeof(*d));
        if (d) {
            d->ctl = ctl;
            d->sh = sh;
            d->worker = w;
        }
        if (!d || api_server_run_on(ctl->srv, w, ctl_deliver, d) != 0) {
            free(d);
            ctl_shared_release(sh);
        }
    }
}

/* The answer every parked GET of ev's job gets, rendered once: what api_reply would send, plus
 * Connection: close (the control thread writes it straight to the socket, past evhttp, which
 * therefore cannot keep the connection for a next request; the worker closes it afterwards). */
static void ctl_render_answer(const control_event_t *ev, buf_t *out)
{
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    buf_printf(out,
               "HTTP/1.1 200 OK\r\nETag: \"%llu\"\r\nCache-Control: no-cache\r\nContent-Type: application/json\r\n"
               "Date: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
               (unsigned long long)ev->version, date, ev->json_len);
    buf_append(out, ev->json, ev->json_len);
}

/* Room for n polls in the fan-out's scratch arrays. */
static int ctl_wake_reserve(api_control_t *ctl, size_t n)
{
    if (n <= ctl->wake_cap)
        return 0;
    size_t cap = ctl->wake_cap ? ctl->wake_cap : 256;
    while (cap < n)
        cap *= 2;
    ctl_poll_t **polls = realloc(ctl->wake_polls, cap * sizeof(*polls));
    if (polls)
        ctl->wake_polls = polls;
    int *fds = realloc(ctl->wake_fds, cap * sizeof(*fds));
    if (fds)
        ctl->wake_fds = fds;
    ssize_t *res = realloc(ctl->wake_res, cap * sizeof(*res));
    if (res)
        ctl->wake_res = res;
    if (!polls || !fds || !res)
        return -1;
    ctl->wake_cap = cap;
    return 0;
}

/* Answers every parked GET long-poll of ev's job from the control thread, right after the commit,
 * without waiting for each worker's loop to come round (behind pushes and queries) and without
 * evhttp's per-reply work: the answer is rendered once and written to every poll's socket in one
 * io_uring submission per FANOUT_DEPTH polls (internal/net/fanout), with every worker's polls_mu
 * held so no poll's connection is closed under it. The worker is told by ctl_broadcast and only
 * frees what was answered. A poll whose socket buffer is full (a client that stopped reading) is
 * left to its worker; one that took part of the answer is cut off (its client sees a short body
 * and polls again). Control thread only. */
static void ctl_wake_polls(api_control_t *ctl, const control_event_t *ev)
{
    pthread_mutex_lock(&ctl->mu);
    bool stopping = ctl->stopping;
    pthread_mutex_unlock(&ctl->mu);
    if (stopping || !atomic_load(&ctl->live) || ctl->nworkers == 0)
        return;
    int64_t parked = atomic_load(&ctl->parked);
    if (parked <= 0)
        return; /* nothing to wake: skip rendering */
    int64_t t0 = clock_mono_ns();
    buf_t resp = BUF_INIT;
    ctl_render_answer(ev, &resp);
    for (int wi = 0; wi < ctl->nworkers; wi++)
        pthread_mutex_lock(&ctl->workers[wi].polls_mu);
    size_t n = 0;
    for (int wi = 0; resp.data && wi < ctl->nworkers; wi++) {
        for (api_sse_link_t *l = ctl->workers[wi].polls.head; l; l = l->next) {
            ctl_poll_t *p = API_SSE_OF(l, ctl_poll_t, link);
            if (p->fd < 0 || p->version >= ev->version || strcmp(p->job, ev->job) != 0)
                continue;
            if (ctl_wake_reserve(ctl, n + 1) != 0)
                break; /* out of memory: the workers answer the rest */
            ctl->wake_polls[n] = p;
            ctl->wake_fds[n++] = p->fd;
        }
    }
    fanout_send(ctl->fanout, ctl->wake_fds, n, resp.data, resp.len, ctl->wake_res);
    for (size_t i = 0; i < n; i++) {
        ctl_poll_t *p = ctl->wake_polls[i];
        ssize_t r = ctl->wake_res[i];
        if (r == -EAGAIN || r == -EWOULDBLOCK || r == -EINTR)
            continue; /* nothing written: the worker answers it the usual way */
        if (r >= 0 && (size_t)r < resp.len)
            shutdown(p->fd, SHUT_RDWR);
        /* r < 0 otherwise: the client is gone; the worker frees it all the same */
        ctl_worker_t *w = &ctl->workers[p->worker];
        api_sse_list_remove(&w->polls, &p->link);
        api_sse_list_push(&w->answered, &p->link);
        p->answered = true;
        atomic_fetch_sub(&ctl->parked, 1);
        atomic_fetch_add(&ctl->polls_answered, 1);
    }
    for (int wi = ctl->nworkers - 1; wi >= 0; wi--)
        pthread_mutex_unlock(&ctl->workers[wi].polls_mu);
    buf_free(&resp);
    if (n > 0)
        histogram_observe(&ctl->fanout_hist, (double)(clock_mono_ns() - t0) / 1e9);
}

static void ctl_collect_event(control_event_t *ev, void *ud)
{
    ctl_op_t *op = ud;
    if (op->nevents == op->cap) {
        size_t cap = op->cap ? op->cap * 2 : 16;
        control_event_t **n = realloc(op->events, cap * sizeof(*n));
        if (!n) {
            control_event_free(ev);
            return;
        }
        op->events = n;
        op->cap = cap;
    }
    op->events[op->nevents++] = ev;
}

static void ctl_expired_event(control_event_t *ev, void *ud)
{
    api_control_t *ctl = ud;
    atomic_fetch_add(&ctl->expired, 1);
    ctl_wake_polls(ctl, ev);
    ctl_broadcast(ctl, ev, true);
}

static void ctl_op_done(void *arg);
static void ctl_op_free(ctl_op_t *op);

/* Hands a finished op back: to the waiting caller, or to its worker for the reply. */
static void ctl_op_finish(api_control_t *ctl, ctl_op_t *op);

/* Group commit: the changes queued while the previous commit ran are written in one transaction
 * (one fsync), then every parked poll of their jobs is answered from here, then the workers get
 * the events (SSE, and what could not be answered here), then the changes' own requests. */
static void ctl_run_applies(api_control_t *ctl, ctl_op_t **ops, size_t n)
{
    control_store_item_t *items = calloc(n, sizeof(*items));
    if (!items) {
        for (size_t i = 0; i < n; i++) {
            ops[i]->code = 503;
            buf_puts(&ops[i]->body, "{\"status\":\"error\",\"errorType\":\"unavailable\",\"error\":\"out of memory\"}");
            ctl_op_finish(ctl, ops[i]);
        }
        return;
    }
    for (size_t i = 0; i < n; i++)
        items[i] = (control_store_item_t){.job = ops[i]->job, .chg = &ops[i]->chg, .updated_by = ops[i]->who};
    int64_t t0 = clock_mono_ns();
    control_store_apply_batch(ctl->store, items, n, clock_wall_ms());
    histogram_observe(&ctl->commit_hist, (double)(clock_mono_ns() - t0) / 1e9);
    for (size_t i = 0; i < n; i++) {
        ctl_op_t *op = ops[i];
        const char *err = items[i].err;
        if (items[i].rc == CONTROL_STORE_OK) {
            control_event_t *ev = items[i].ev;
            op->code = 200;
            buf_append(&op->body, ev->json, ev->json_len);
            snprintf(op->etag, sizeof(op->etag), "\"%llu\"", (unsigned long long)ev->version);
        } else if (items[i].rc == CONTROL_STORE_CONFLICT) {
            op->code = 409;
            buf_printf(&op->body,
                       "{\"status\":\"error\",\"errorType\":\"conflict\",\"error\":\"version %llu does not match "
                       "the current version %s\",\"field\":\"version\"}",
                       (unsigned long long)op->chg.expect_version, err);
        } else {
            op->code = 503;
            buf_puts(&op->body, "{\"status\":\"error\",\"errorType\":\"unavailable\",\"error\":");
            buf_put_json_string(&op->body, err, strlen(err));
            buf_putc(&op->body, '}');
            log_error("control", "cannot store a flow-control change", LF_S("job", op->job), LF_S("err", err));
        }
    }
    /* A poll gets the newest state of its job: a change followed by another of the same job in
     * this group wakes no one (SSE subscribers still get both, in order). */
    bool *wake = calloc(n, sizeof(*wake));
    for (size_t i = 0; i < n; i++) {
        if (!items[i].ev)
            continue;
        bool newest = true;
        for (size_t j = i + 1; j < n && newest; j++)
            if (items[j].ev && strcmp(items[j].ev->job, items[i].ev->job) == 0)
                newest = false;
        if (wake)
            wake[i] = newest;
        if (newest)
            ctl_wake_polls(ctl, items[i].ev);
    }
    int64_t woken = clock_mono_ns();
    for (size_t i = 0; i < n; i++)
        if (items[i].ev)
            histogram_observe(&ctl->propagation_hist, (double)(woken - ops[i]->submitted_ns) / 1e9);
    for (size_t i = 0; i < n; i++) {
        if (!items[i].ev)
            continue;
        log_info("control", "flow control changed", LF_S("job", ops[i]->job), LF_S("by", ops[i]->who),
                 LF_S("mode", control_mode_name(ops[i]->chg.spec.mode)), LF_I("version", (int64_t)items[i].ev->version),
                 LF_S("reason", ops[i]->reason ? ops[i]->reason : ""));
        ctl_broadcast(ctl, items[i].ev, wake ? wake[i] : true);
    }
    free(wake);
    free(items);
    for (size_t i = 0; i < n; i++)
        ctl_op_finish(ctl, ops[i]);
}

static void ctl_run_op(ctl_op_t *op)
{
    api_control_t *ctl = op->ctl;
    char err[256];
    switch (op->kind) {
    case CTL_OP_APPLY: ctl_run_applies(ctl, &op, 1); return;
    case CTL_OP_HISTORY:
        if (control_store_history_json(ctl->store, op->job, op->before, op->limit, &op->body, err, sizeof(err)) == 0) {
            op->code = 200;
        } else {
            op->code = 503;
            buf_reset(&op->body);
            buf_puts(&op->body, "{\"status\":\"error\",\"errorType\":\"unavailable\",\"error\":");
            buf_put_json_string(&op->body, err, strlen(err));
            buf_putc(&op->body, '}');
        }
        break;
    case CTL_OP_REPLAY:
        if (control_store_events_since(ctl->store, op->after_id, op->job, CTL_REPLAY_LIMIT, ctl_collect_event, op, err,
                                       sizeof(err)) < 0)
            log_error("control", "cannot read the audit log for an SSE resume", LF_S("err", err));
        break;
    }
    ctl_op_finish(ctl, op);
}

static void ctl_op_finish(api_control_t *ctl, ctl_op_t *op)
{
    if (op->sync) {
        ctl_sync_t *sy = op->sync;
        pthread_mutex_lock(&sy->mu);
        sy->code = op->code;
        unsigned long long v = 0;
        if (op->code == 200 && sscanf(op->etag, "\"%llu\"", &v) == 1)
            sy->version = v;
        if (op->code != 200)
            snprintf(sy->err, sizeof(sy->err), "%.*s", (int)(op->body.len < 255 ? op->body.len : 255),
                     op->body.data ? op->body.data : "");
        sy->done = true;
        pthread_cond_signal(&sy->cv);
        pthread_mutex_unlock(&sy->mu);
        ctl_op_free(op);
        return;
    }
    if (api_server_run_on(ctl->srv, op->worker, ctl_op_done, op) != 0)
        log_error("control", "cannot hand a reply back to its worker");
}

static void *ctl_thread_main(void *arg)
{
    api_control_t *ctl = arg;
    char err[256];
    pthread_setname_np(pthread_self(), "control");
    pthread_mutex_lock(&ctl->mu);
    for (;;) {
        while (!ctl->head && !ctl->stop) {
            int64_t next = control_store_next_expiry(ctl->store);
            if (next == 0) {
                pthread_cond_wait(&ctl->cv, &ctl->mu);
                continue;
            }
            if (next <= clock_wall_ms())
                break;
            struct timespec ts = {.tv_sec = next / 1000, .tv_nsec = (next % 1000) * 1000000};
            pthread_cond_timedwait(&ctl->cv, &ctl->mu, &ts);
        }
        if (ctl->stop && !ctl->head)
            break;
        /* Everything queued so far; consecutive changes are committed together. */
        ctl_op_t *list = ctl->head;
        ctl->head = ctl->tail = NULL;
        pthread_mutex_unlock(&ctl->mu);
        while (list) {
            ctl_op_t *batch[CTL_GROUP_MAX];
            size_t n = 0;
            while (list && list->kind == CTL_OP_APPLY && n < CTL_GROUP_MAX) {
                batch[n++] = list;
                list = list->next;
            }
            if (n) {
                ctl_run_applies(ctl, batch, n);
                continue;
            }
            ctl_op_t *op = list;
            list = list->next;
            ctl_run_op(op);
        }
        if (control_store_expire_due(ctl->store, clock_wall_ms(), ctl_expired_event, ctl, err, sizeof(err)) < 0) {
            log_error("control", "cannot revert an expired change; retrying in 1s", LF_S("err", err));
            struct timespec one = {1, 0};
            nanosleep(&one, NULL);
        }
        pthread_mutex_lock(&ctl->mu);
        if (!ctl->head && !ctl->stop) {
            /* Idle: copy the WAL back into control.db now rather than inside a later commit. */
            pthread_mutex_unlock(&ctl->mu);
            control_store_checkpoint(ctl->store, CTL_CHECKPOINT_FRAMES);
            pthread_mutex_lock(&ctl->mu);
        }
    }
    pthread_mutex_unlock(&ctl->mu);
    return NULL;
}

static void ctl_submit(api_control_t *ctl, ctl_op_t *op)
{
    op->ctl = ctl;
    op->submitted_ns = clock_mono_ns();
    pthread_mutex_lock(&ctl->mu);
    op->next = NULL;
    if (ctl->tail)
        ctl->tail->next = op;
    else
        ctl->head = op;
    ctl->tail = op;
    pthread_cond_signal(&ctl->cv);
    pthread_mutex_unlock(&ctl->mu);
}

static void ctl_op_free(ctl_op_t *op)
{
    free(op->job);
    free(op->reason);
    free(op->who);
    control_spec_free(&op->chg.spec);
    for (size_t i = 0; i < op->nevents; i++)
        control_event_free(op->events[i]);
    free(op->events);
    buf_free(&op->body);
    free(op);
}

static void ctl_op_closed(api_req_t *req, void *ud)
{
    ctl_op_t *op = ud;
    op->req = NULL;
}

/* --- SSE subscribers (worker thread) ---------------------------------------------------------------- */

static void ctl_sub_unlink(ctl_worker_t *w, ctl_sub_t *s)
{
    api_sse_list_remove(&w->subs, &s->link);
}

static void ctl_sub_free(ctl_sub_t *s)
{
    while (s->held) {
        ctl_held_t *h = s->held;
        s->held = h->next;
        ctl_shared_release(h->sh);
        free(h);
    }
    atomic_fetch_sub(&s->ctl->subscribers, 1);
    free(s->job);
    free(s);
}

/* Ends a subscriber's stream and forgets it. */
static void ctl_sub_end(ctl_worker_t *w, ctl_sub_t *s)
{
    ctl_sub_unlink(w, s);
    api_req_t *req = s->req;
    s->req = NULL;
    if (req)
        api_reply_stream_end(req);
    if (!s->replaying)
        ctl_sub_free(s);
    /* else: the pending replay op frees it */
}

/* Writes one SSE frame; drops the subscriber when it is too far behind. Returns -1 if dropped. */
static int ctl_sub_send(ctl_worker_t *w, ctl_sub_t *s, const control_event_t *ev)
{
    if (ev->id <= s->last_id)
        return 0;
    if (api_reply_stream_pending(s->req) > CTL_SSE_MAX_PENDING) {
        atomic_fetch_add(&s->ctl->dropped, 1);
        log_warn("control", "dropping a slow SSE subscriber",
                 LF_I("pending_bytes", (int64_t)api_reply_stream_pending(s->req)));
        ctl_sub_end(w, s);
        return -1;
    }
    api_sse_send(s->req, ev->id, "change", ev->json, ev->json_len);
    s->last_id = ev->id;
    return 0;
}

static void ctl_sub_closed(api_req_t *req, void *ud)
{
    ctl_sub_t *s = ud;
    ctl_sub_unlink(&s->ctl->workers[s->worker], s);
    s->req = NULL;
    if (!s->replaying)
        ctl_sub_free(s);
}

static void ctl_heartbeat(evutil_socket_t fd, short what, void *arg)
{
    ctl_worker_t *w = arg;
    for (api_sse_link_t *l = w->subs.head, *next; l; l = next) {
        next = l->next;
        ctl_sub_t *s = API_SSE_OF(l, ctl_sub_t, link);
        if (s->replaying || !s->req)
            continue;
        if (api_reply_stream_pending(s->req) > CTL_SSE_MAX_PENDING) {
            atomic_fetch_add(&w->ctl->dropped, 1);
            ctl_sub_end(w, s);
            continue;
        }
        api_sse_keepalive(s->req);
    }
}

/* --- long-polls (worker thread) ------------------------------------------------------------------------ */

static void ctl_poll_unlink(ctl_worker_t *w, ctl_poll_t *p)
{
    api_sse_list_remove(&w->polls, &p->link);
}

static void ctl_poll_free(ctl_poll_t *p)
{
    if (p->timer)
        event_free(p->timer);
    if (!p->answered) /* else the control thread counted it out when it answered */
        atomic_fetch_sub(&p->ctl->parked, 1);
    free(p->job);
    free(p);
}

/* The client went away. A poll the control thread answered meanwhile is on `answered`. */
static void ctl_poll_closed(api_req_t *req, void *ud)
{
    ctl_poll_t *p = ud;
    ctl_worker_t *w = &p->ctl->workers[p->worker];
    pthread_mutex_lock(&w->polls_mu);
    api_sse_list_remove(p->answered ? &w->answered : &w->polls, &p->link);
    pthread_mutex_unlock(&w->polls_mu);
    ctl_poll_free(p);
}

/* Answers a parked poll (already taken off its list) with the job's current state (or 304). */
static void ctl_poll_answer(ctl_poll_t *p, const char *json, size_t len, uint64_t version, int code)
{
    api_req_t *req = p->req;
    ctl_poll_free(p);
    ctl_reply_state(req, code, json, len, version);
}

/* A poll the control thread answered on its socket: finish the request and close the connection
 * (evhttp never wrote the answer, so it must not read a next request from it). */
static void ctl_poll_finish_answered(ctl_poll_t *p)
{
    api_req_t *req = p->req;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
    ctl_poll_free(p);
    req->replied = true;
    api__req_finish(req, 200); /* unhooks the close callback, counts the request, frees req */
    if (evcon)
        evhttp_connection_free(evcon);
}

/* Takes the worker's answered polls (polls_mu held by the caller) and returns them as a list. */
static api_sse_link_t *ctl_take_answered(ctl_worker_t *w)
{
    api_sse_link_t *l = w->answered.head;
    w->answered.head = NULL;
    return l;
}

static void ctl_free_answered(api_sse_link_t *l)
{
    while (l) {
        api_sse_link_t *next = l->next;
        ctl_poll_finish_answered(API_SSE_OF(l, ctl_poll_t, link));
        l = next;
    }
}

static void ctl_poll_timeout(evutil_socket_t fd, short what, void *arg)
{
    ctl_poll_t *p = arg;
    api_control_t *ctl = p->ctl;
    ctl_worker_t *w = &ctl->workers[p->worker];
    pthread_mutex_lock(&w->polls_mu);
    bool answered = p->answered;
    if (!answered)
        ctl_poll_unlink(w, p);
    pthread_mutex_unlock(&w->polls_mu);
    if (answered)
        return; /* answered a moment ago; the delivery on its way frees it */
    buf_t b = BUF_INIT;
    uint64_t v = control_store_get_json(ctl->store, p->job, &b);
    atomic_fetch_add(&ctl->polls_timed_out, 1);
    ctl_poll_answer(p, NULL, 0, v, 304);
    buf_free(&b);
}

/* The answered polls' connections, closed a moment after their change (close_timer). */
static void ctl_close_answered(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ctl_worker_t *w = arg;
    pthread_mutex_lock(&w->polls_mu);
    api_sse_link_t *answered = ctl_take_answered(w);
    pthread_mutex_unlock(&w->polls_mu);
    ctl_free_answered(answered);
}

/* Arms w's close_timer for the polls on `answered` (polls_mu held). Returns false when there is
 * no timer to arm (out of memory): the caller frees them now. */
static bool ctl_close_later(ctl_worker_t *w)
{
    if (!w->close_timer) {
        ctl_poll_t *p = API_SSE_OF(w->answered.head, ctl_poll_t, link);
        w->close_timer = evtimer_new(api_req_base(p->req), ctl_close_answered, w);
        if (!w->close_timer)
            return false;
    }
    if (evtimer_pending(w->close_timer, NULL))
        return true; /* an earlier change's timer closes these too */
    struct timeval tv = {0, CTL_CLOSE_DELAY_MS * 1000};
    return evtimer_add(w->close_timer, &tv) == 0;
}

/* A committed change arrives on this worker. */
static void ctl_deliver(void *arg)
{
    ctl_delivery_t *d = arg;
    ctl_shared_t *sh = d->sh;
    const control_event_t *ev = sh->ev;
    api_control_t *ctl = d->ctl;
    ctl_worker_t *w = &ctl->workers[d->worker];
    free(d);
    /* The polls the control thread answered are closed a moment later; those it could not are
     * answered here. */
    api_sse_list_t todo = {NULL};
    pthread_mutex_lock(&w->polls_mu);
    api_sse_link_t *answered = NULL;
    if (w->answered.head && (w->closing || !ctl_close_later(w)))
        answered = ctl_take_answered(w);
    for (api_sse_link_t *l = w->polls.head, *next; l && sh->wake; l = next) {
        next = l->next;
        ctl_poll_t *p = API_SSE_OF(l, ctl_poll_t, link);
        if (p->version < ev->version && strcmp(p->job, ev->job) == 0) {
            ctl_poll_unlink(w, p);
            api_sse_list_push(&todo, &p->link);
        }
    }
    pthread_mutex_unlock(&w->polls_mu);
    ctl_free_answered(answered);
    while (todo.head) {
        ctl_poll_t *p = API_SSE_OF(todo.head, ctl_poll_t, link);
        api_sse_list_remove(&todo, &p->link);
        atomic_fetch_add(&ctl->polls_answered, 1);
        ctl_poll_answer(p, ev->json, ev->json_len, ev->version, 200);
    }
    for (api_sse_link_t *l = w->subs.head, *next; l; l = next) {
        next = l->next;
        ctl_sub_t *s = API_SSE_OF(l, ctl_sub_t, link);
        if (s->job && strcmp(s->job, ev->job) != 0)
            continue;
        if (s->replaying) {
            ctl_held_t *h = malloc(sizeof(*h));
            if (!h)
                continue;
            atomic_fetch_add(&sh->refs, 1);
            h->sh = sh;
            h->next = NULL;
            if (s->held_tail)
                s->held_tail->next = h;
            else
                s->held = h;
            s->held_tail = h;
            continue;
        }
        ctl_sub_send(w, s, ev);
    }
    ctl_shared_release(sh);
}

/* An op finished on the control thread; this runs on the op's worker. */
static void ctl_op_done(void *arg)
{
    ctl_op_t *op = arg;
    if (op->kind == CTL_OP_REPLAY) {
        ctl_sub_t *s = op->sub;
        s->replaying = false;
        if (!s->req) { /* the client left during the replay */
            ctl_sub_free(s);
            ctl_op_free(op);
            return;
        }
        ctl_worker_t *w = &s->ctl->workers[s->worker];
        int dropped = 0;
        for (size_t i = 0; i < op->nevents && !dropped; i++)
            dropped = ctl_sub_send(w, s, op->events[i]);
        while (!dropped && s->held) {
            ctl_held_t *h = s->held;
            s->held = h->next;
            dropped = ctl_sub_send(w, s, h->sh->ev);
            ctl_shared_release(h->sh);
            free(h);
        }
        if (!dropped)
            s->held_tail = NULL;
        ctl_op_free(op);
        return;
    }
    if (op->req) {
        if (op->code == 200) {
            api_reply_header(op->req, "ETag", op->etag);
            api_reply_header(op->req, "Cache-Control", "no-store");
        }
        api_reply(op->req, op->code, "application/json", op->body.data, op->body.len);
    }
    ctl_op_free(op);
}

/* --- handlers ------------------------------------------------------------------------------------------- */

static void ctl_h_list(api_req_t *req, void *ud)
{
    api_control_t *ctl = ud;
    char who[160];
    if (ctl_auth(ctl, req, false, who, sizeof(who)) != 0)
        return;
    buf_t b = BUF_INIT;
    buf_puts(&b, "{\"jobs\":");
    control_store_list_json(ctl->store, &b);
    buf_putc(&b, '}');
    api_reply_header(req, "Cache-Control", "no-cache");
    api_reply(req, 200, "application/json", b.data, b.len);
    buf_free(&b);
}

/* "\"12\"", "W/\"12\"" or "12" -> 12 */
static int ctl_parse_etag(const char *s, uint64_t *out)
{
    while (*s == ' ')
        s++;
    if (strncmp(s, "W/", 2) == 0)
        s += 2;
    if (*s == '"')
        s++;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno)
        return -1;
    if (*end == '"')
        end++;
    while (*end == ' ')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

static void ctl_h_get(api_control_t *ctl, api_req_t *req, const char *job)
{
    char who[160];
    if (ctl_auth(ctl, req, false, who, sizeof(who)) != 0)
        return;
    const char *vs = api_req_param(req, "version");
    const char *ws = api_req_param(req, "wait");
    const char *inm = api_req_header(req, "If-None-Match");
    bool have_client = false;
    uint64_t client = 0;
    int64_t wait_ms = 0;
    if (vs) {
        int64_t v;
        if (parse_int64(vs, &v) != 0 || v < 0) {
            ctl_reply_error(req, 400, "bad_data", "version", "version must be a non-negative integer");
            return;
        }
        client = (uint64_t)v;
        have_client = true;
    } else if (inm && strcmp(inm, "*") != 0) {
        if (ctl_parse_etag(inm, &client) == 0)
            have_client = true;
    }
    if (ws) {
        if (parse_duration_or_seconds_ms(ws, &wait_ms) != 0 || wait_ms < 0) {
            ctl_reply_error(req, 400, "bad_data", "wait", "wait must be a duration like \"30s\"");
            return;
        }
        if (wait_ms > CTL_MAX_WAIT_MS) {
            ctl_reply_error(req, 400, "bad_data", "wait", "wait must be at most 5m");
            return;
        }
    }
    buf_t b = BUF_INIT;
    uint64_t cur = control_store_get_json(ctl->store, job, &b);
    ctl_worker_t *w = &ctl->workers[req->worker];
    if (!have_client || cur != client || wait_ms == 0 || w->closing) {
        /* A client ahead of us (cur < client) gets the state at once: it must resync. */
        ctl_reply_state(req, have_client && cur == client ? 304 : 200, b.data, b.len, cur);
        buf_free(&b);
        return;
    }
    buf_free(&b);
    if (atomic_fetch_add(&ctl->parked, 1) >= CTL_MAX_PARKED) {
        atomic_fetch_sub(&ctl->parked, 1);
        api_reply_header(req, "Retry-After", "1");
        ctl_reply_error(req, 503, "unavailable", "wait",
                        "too many parked long-polls (limit %d); retry or use the SSE stream", CTL_MAX_PARKED);
        return;
    }
    ctl_poll_t *p = calloc(1, sizeof(*p));
    if (p)
        p->job = strdup(job);
    if (p && p->job)
        p->timer = evtimer_new(api_req_base(req), ctl_poll_timeout, p);
    if (!p || !p->job || !p->timer) {
        if (p) {
            free(p->job);
            free(p);
        }
        atomic_fetch_sub(&ctl->parked, 1);
        ctl_reply_error(req, 503, "unavailable", NULL, "out of memory");
        return;
    }
    p->req = req;
    p->worker = req->worker;
    p->ctl = ctl;
    p->version = client;
    p->fd = -1;
    /* A HEAD gets no body, so it is answered by its worker through evhttp. */
    struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    if (req->method == API_GET && bev)
        p->fd = (int)bufferevent_getfd(bev);
    struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
    evtimer_add(p->timer, &tv);
    api_req_park(req, ctl_poll_closed, p);
    /* A change committed since the state was read above has already been fanned out (the cache
     * is updated before the fan-out): look again once the poll is visible to the control thread. */
    pthread_mutex_lock(&w->polls_mu);
    api_sse_list_push(&w->polls, &p->link);
    pthread_mutex_unlock(&w->polls_mu);
    control_state_t now;
    if (control_store_get(ctl->store, job, &now) == 0) {
        uint64_t v = now.version;
        control_state_free(&now);
        if (v != client) {
            pthread_mutex_lock(&w->polls_mu);
            bool answered = p->answered;
            if (!answered)
                ctl_poll_unlink(w, p);
            pthread_mutex_unlock(&w->polls_mu);
            if (!answered) {
                buf_t cb = BUF_INIT;
                uint64_t cv = control_store_get_json(ctl->store, job, &cb);
                atomic_fetch_add(&ctl->polls_answered, 1);
                ctl_poll_answer(p, cb.data, cb.len, cv, 200);
                buf_free(&cb);
            }
        }
    }
}

static void ctl_h_history(api_control_t *ctl, api_req_t *req, const char *job)
{
    char who[160];
    if (ctl_auth(ctl, req, false, who, sizeof(who)) != 0)
        return;
    int64_t limit = 50, before = 0;
    const char *ls = api_req_param(req, "limit");
    const char *bs = api_req_param(req, "before");
    if (ls && (parse_int64(ls, &limit) != 0 || limit < 1 || limit > CTL_HISTORY_MAX)) {
        ctl_reply_error(req, 400, "bad_data", "limit", "limit must be an integer between 1 and %d", CTL_HISTORY_MAX);
        return;
    }
    if (bs && (parse_int64(bs, &before) != 0 || before < 1)) {
        ctl_reply_error(req, 400, "bad_data", "before", "before must be a positive version number");
        return;
    }
    ctl_op_t *op = calloc(1, sizeof(*op));
    if (!op || !(op->job = strdup(job))) {
        free(op);
        ctl_reply_error(req, 503, "unavailable", NULL, "out of memory");
        return;
    }
    op->kind = CTL_OP_HISTORY;
    op->req = req;
    op->worker = req->worker;
    op->before = (uint64_t)before;
    op->limit = (int)limit;
    api_req_park(req, ctl_op_closed, op);
    ctl_submit(ctl, op);
}

static void ctl_h_change(api_control_t *ctl, api_req_t *req, const char *job, control_req_kind_t kind)
{
    char who[160];
    if (api_control_authorize_change(ctl, req, who, sizeof(who)) != 0)
        return;
    size_t len;
    const uint8_t *body = api_req_body(req, &len);
    ctl_op_t *op = calloc(1, sizeof(*op));
    char *reason = malloc(CONTROL_MAX_REASON_LEN + 1);
    if (!op || !reason) {
        free(op);
        free(reason);
        ctl_reply_error(req, 503, "unavailable", NULL, "out of memory");
        return;
    }
    char field[64], err[512];
    if (control_change_parse(kind, (const char *)body, len, &op->chg, reason, field, sizeof(field), err, sizeof(err)) !=
        0) {
        free(op);
        free(reason);
        ctl_reply_error(req, 400, "bad_data", field, "%s", err);
        return;
    }
    if (op->chg.reason) {
        op->reason = reason;
        op->chg.reason = reason;
    } else {
        free(reason);
    }
    op->kind = CTL_OP_APPLY;
    op->job = strdup(job);
    op->who = strdup(who);
    if (!op->job || !op->who) {
        ctl_op_free(op);
        ctl_reply_error(req, 503, "unavailable", NULL, "out of memory");
        return;
    }
    op->req = req;
    op->worker = req->worker;
    api_req_park(req, ctl_op_closed, op);
    ctl_submit(ctl, op);
}

/* /api/v1/control/jobs/{job}[/{action}] — the job is taken from the raw path and decoded here,
 * so a job name may contain an encoded '/'. */
static void ctl_h_job(api_req_t *req, void *ud)
{
    api_control_t *ctl = ud;
    static const char prefix[] = "/api/v1/control/jobs/";
    const char *rest = req->raw_path + sizeof(prefix) - 1;
    const char *slash = strchr(rest, '/');
    size_t enc_len = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *action = slash ? slash + 1 : "";
    char *enc = arena_strndup(req->arena, rest, enc_len);
    size_t jlen = 0;
    char *dec = evhttp_uridecode(enc, 0, &jlen);
    char err[256];
    if (!dec || strlen(dec) != jlen) {
        free(dec);
        ctl_reply_error(req, 400, "bad_data", "job", "job name contains a NUL byte or bad percent-encoding");
        return;
    }
    char *job = arena_strndup(req->arena, dec, jlen);
    free(dec);
    if (control_job_name_valid(job, jlen, err, sizeof(err)) != 0) {
        ctl_reply_error(req, 400, "bad_data", "job", "%s", err);
        return;
    }
    if (ctl->job_hook && ctl->job_hook(req, job, action, ctl->job_hook_ud))
        return;
    int m = req->method;
    if (!*action) {
        if (m == API_GET || m == API_HEAD)
            ctl_h_get(ctl, req, job);
        else if (m == API_PUT)
            ctl_h_change(ctl, req, job, CONTROL_REQ_PUT);
        else {
            api_reply_header(req, "Allow", "GET, HEAD, PUT");
            ctl_reply_error(req, 405, "method_not_allowed", NULL, "use GET or PUT on a job");
        }
        return;
    }
    static const struct {
        const char *name;
        control_req_kind_t kind;
    } actions[] = {{"pause", CONTROL_REQ_PAUSE},
                   {"resume", CONTROL_REQ_RESUME},
                   {"rate-limit", CONTROL_REQ_RATE_LIMIT},
                   {"drain", CONTROL_REQ_DRAIN}};
    for (size_t i = 0; i < sizeof(actions) / sizeof(actions[0]); i++)
        if (strcmp(action, actions[i].name) == 0) {
            if (m != API_POST) {
                api_reply_header(req, "Allow", "POST");
                ctl_reply_error(req, 405, "method_not_allowed", NULL, "use POST for %s", action);
                return;
            }
            ctl_h_change(ctl, req, job, actions[i].kind);
            return;
        }
    if (strcmp(action, "history") == 0) {
        if (m != API_GET && m != API_HEAD) {
            api_reply_header(req, "Allow", "GET, HEAD");
            ctl_reply_error(req, 405, "method_not_allowed", NULL, "use GET for history");
            return;
        }
        ctl_h_history(ctl, req, job);
        return;
    }
    ctl_reply_error(req, 404, "not_found", NULL,
                    "unknown action \"%s\" (want pause, resume, rate-limit, drain or history)", action);
}

static void ctl_h_stream(api_req_t *req, void *ud)
{
    api_control_t *ctl = ud;
    char who[160], err[256];
    if (ctl_auth(ctl, req, false, who, sizeof(who)) != 0)
        return;
    ctl_worker_t *w = &ctl->workers[req->worker];
    if (w->closing) {
        ctl_reply_error(req, 503, "unavailable", NULL, "shutting down");
        return;
    }
    const char *job = api_req_param(req, "job");
    if (job && control_job_name_valid(job, strlen(job), err, sizeof(err)) != 0) {
        ctl_reply_error(req, 400, "bad_data", "job", "%s", err);
        return;
    }
    uint64_t after = 0;
    int lei = api_sse_last_event_id(req, &after);
    if (lei < 0) {
        ctl_reply_error(req, 400, "bad_data", "Last-Event-ID", "Last-Event-ID must be a non-negative integer");
        return;
    }
    bool resume = lei > 0;
    if (atomic_fetch_add(&ctl->subscribers, 1) >= CTL_MAX_SUBSCRIBERS) {
        atomic_fetch_sub(&ctl->subscribers, 1);
        ctl_reply_error(req, 503, "unavailable", NULL, "too many stream subscribers (limit %d)", CTL_MAX_SUBSCRIBERS);
        return;
    }
    ctl_sub_t *s = calloc(1, sizeof(*s));
    ctl_op_t *op = resume ? calloc(1, sizeof(*op)) : NULL;
    if (!s || (job && !(s->job = strdup(job))) || (resume && !op) || (resume && job && !(op->job = strdup(job)))) {
        if (s)
            free(s->job);
        free(s);
        if (op)
            free(op->job);
        free(op);
        atomic_fetch_sub(&ctl->subscribers, 1);
        ctl_reply_error(req, 503, "unavailable", NULL, "out of memory");
        return;
    }
    if (!w->heartbeat) {
        w->heartbeat = event_new(api_req_base(req), -1, EV_PERSIST, ctl_heartbeat, w);
        struct timeval hb = {CTL_HEARTBEAT_MS / 1000, (CTL_HEARTBEAT_MS % 1000) * 1000};
        if (w->heartbeat)
            event_add(w->heartbeat, &hb);
    }
    s->req = req;
    s->worker = req->worker;
    s->ctl = ctl;
    /* Without a resume point the stream starts now: nothing older is sent. */
    s->last_id = resume ? after : control_store_last_event_id(ctl->store);
    api_sse_list_push(&w->subs, &s->link);
    /* the reconnect delay a browser EventSource should use, and a first byte for proxies */
    api_sse_start(req, 1000, "sluice control stream", ctl_sub_closed, s);
    if (resume) {
        s->replaying = true;
        op->kind = CTL_OP_REPLAY;
        op->worker = req->worker;
        op->sub = s;
        op->after_id = after;
        ctl_submit(ctl, op);
    }
}

/* TIS's HttpSource rate-controller poll (PROTOCOLS.md §10). */
static void ctl_h_tis(api_req_t *req, void *ud)
{
    api_control_t *ctl = ud;
    char who[160], err[256];
    if (ctl_auth(ctl, req, false, who, sizeof(who)) != 0)
        return;
    static const char fail_fmt[] = "{\"success\":false,\"errormsg\":[%s],\"msg\":[],\"bizresult\":null}";
    const char *action = api_req_param(req, "action");
    const char *ev = api_req_param(req, "event_submit_do_get_rate_controller");
    buf_t b = BUF_INIT, m = BUF_INIT;
    if (!action || strcmp(action, "fullbuild_workflow_action") != 0 || !ev || strcmp(ev, "true") != 0) {
        static const char only[] = "sluice answers only action=fullbuild_workflow_action&"
                                   "event_submit_do_get_rate_controller=true";
        buf_put_json_string(&m, only, sizeof(only) - 1);
        buf_printf(&b, fail_fmt, m.data);
        api_reply(req, 400, "application/json;charset=UTF-8", b.data, b.len);
        goto out;
    }
    const char *pipeline = api_req_param(req, "pipeline");
    const char *lm = api_req_param(req, "lastModified");
    int64_t last = -1;
    if (!pipeline || control_job_name_valid(pipeline, strlen(pipeline), err, sizeof(err)) != 0) {
        const char *msg = pipeline ? err : "form field pipeline is required";
        buf_put_json_string(&m, msg, strlen(msg));
        buf_printf(&b, fail_fmt, m.data);
        api_reply(req, 400, "application/json;charset=UTF-8", b.data, b.len);
        goto out;
    }
    if (lm && *lm && parse_int64(lm, &last) != 0) {
        static const char bad_lm[] = "form field lastModified must be milliseconds since the epoch";
        buf_put_json_string(&m, bad_lm, sizeof(bad_lm) - 1);
        buf_printf(&b, fail_fmt, m.data);
        api_reply(req, 400, "application/json;charset=UTF-8", b.data, b.len);
        goto out;
    }
    control_state_t s;
    if (control_store_get(ctl->store, pipeline, &s) != 0) {
        ctl_reply_error(req, 503, "unavailable", NULL, "out of memory");
        goto out;
    }
    buf_puts(&b, "{\"success\":true,\"errormsg\":[],\"msg\":[],\"bizresult\":");
    if (s.updated_at_ms > last) {
        control_state_to_tis_json(&s, &b); /* the mapping, drains included: internal/control */
    } else {
        buf_puts(&b, "{}");
    }
    buf_putc(&b, '}');
    control_state_free(&s);
    api_reply(req, 200, "application/json;charset=UTF-8", b.data, b.len);
out:
    buf_free(&b);
    buf_free(&m);
}

/* --- metrics, shutdown, registration ------------------------------------------------------------------- */

static void ctl_metrics(void *ud, buf_t *out)
{
    api_control_t *ctl = ud;
    control_store_write_metrics(ctl->store, out);
    buf_printf(out,
               "# HELP sluice_control_long_polls_parked Long-polls waiting for a flow-control change.\n"
               "# TYPE sluice_control_long_polls_parked gauge\nsluice_control_long_polls_parked %lld\n"
               "# HELP sluice_control_long_polls_answered_total Parked long-polls answered by a change.\n"
               "# TYPE sluice_control_long_polls_answered_total counter\n"
               "sluice_control_long_polls_answered_total %llu\n"
               "# HELP sluice_control_long_polls_timed_out_total Parked long-polls that reached their wait.\n"
               "# TYPE sluice_control_long_polls_timed_out_total counter\n"
               "sluice_control_long_polls_timed_out_total %llu\n"
               "# HELP sluice_control_stream_subscribers Open SSE streams of flow-control changes.\n"
               "# TYPE sluice_control_stream_subscribers gauge\nsluice_control_stream_subscribers %lld\n"
               "# HELP sluice_control_stream_dropped_total SSE subscribers dropped for reading too slowly.\n"
               "# TYPE sluice_control_stream_dropped_total counter\nsluice_control_stream_dropped_total %llu\n"
               "# HELP sluice_control_expirations_total Temporary changes reverted when their time ran out.\n"
               "# TYPE sluice_control_expirations_total counter\nsluice_control_expirations_total %llu\n",
               (long long)atomic_load(&ctl->parked), (unsigned long long)atomic_load(&ctl->polls_answered),
               (unsigned long long)atomic_load(&ctl->polls_timed_out), (long long)atomic_load(&ctl->subscribers),
               (unsigned long long)atomic_load(&ctl->dropped), (unsigned long long)atomic_load(&ctl->expired));
    histogram_write(&ctl->commit_hist, "sluice_control_commit_duration_seconds",
                    "Group commits of flow-control changes to control.db, fsync included.", out);
    histogram_write(&ctl->fanout_hist, "sluice_control_fanout_duration_seconds",
                    "Answering a change's parked long-polls from the control thread (render and sends).", out);
    histogram_write(&ctl->propagation_hist, "sluice_control_propagation_seconds",
                    "From a flow-control change reaching the control thread's queue to its parked long-polls answered.",
                    out);
}

/* Runs on each worker at shutdown: answers parked polls (304: nothing changed, come back), ends
 * streams, and from now on answers new polls at once. */
static void ctl_worker_close(void *ud, int worker)
{
    api_control_t *ctl = ud;
    ctl_worker_t *w = &ctl->workers[worker];
    w->closing = true;
    pthread_mutex_lock(&w->polls_mu);
    api_sse_link_t *answered = ctl_take_answered(w);
    api_sse_list_t todo = w->polls;
    w->polls.head = NULL;
    pthread_mutex_unlock(&w->polls_mu);
    ctl_free_answered(answered);
    while (todo.head) {
        ctl_poll_t *p = API_SSE_OF(todo.head, ctl_poll_t, link);
        api_sse_list_remove(&todo, &p->link);
        buf_t b = BUF_INIT;
        uint64_t v = control_store_get_json(ctl->store, p->job, &b);
        api_reply_header(p->req, "Connection", "close");
        ctl_poll_answer(p, NULL, 0, v, 304);
        buf_free(&b);
    }
    while (w->subs.head)
        ctl_sub_end(w, API_SSE_OF(w->subs.head, ctl_sub_t, link));
    if (w->heartbeat) {
        event_free(w->heartbeat);
        w->heartbeat = NULL;
    }
    if (w->close_timer) {
        event_free(w->close_timer);
        w->close_timer = NULL;
    }
}

static void ctl_on_shutdown(void *ud)
{
    api_control_t *ctl = ud;
    pthread_mutex_lock(&ctl->mu);
    ctl->stopping = true;
    pthread_mutex_unlock(&ctl->mu);
    if (!atomic_load(&ctl->live))
        return; /* never served a request: nothing parked, and the workers may be idle */
    /* Returns once every worker has run it: deliveries queued before it have run too (FIFO), so
     * no fan-out is left in a loop that is about to stop. */
    api_sse_close_workers(ctl->srv, ctl_worker_close, ctl);
}

api_control_t *api_control_new(const api_control_options_t *opt, char *err, size_t errlen)
{
    api_control_t *ctl = calloc(1, sizeof(*ctl));
    if (!ctl) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ctl->srv = opt->srv;
    ctl->read_auth = opt->read_auth;
    pthread_mutex_init(&ctl->mu, NULL);
    pthread_cond_init(&ctl->cv, NULL);
    /* 50 µs .. 10 s: a quiet commit is ~1 ms, a fan-out to 1,000 polls ~8 ms */
    static const double bounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01,
                                    0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   10};
    size_t nb = sizeof(bounds) / sizeof(bounds[0]);
    int hrc = histogram_init(&ctl->commit_hist, bounds, nb) | histogram_init(&ctl->fanout_hist, bounds, nb) |
              histogram_init(&ctl->propagation_hist, bounds, nb);
    assert(hrc == 0);
    (void)hrc;
    if (opt->token_file && opt->token_file[0]) {
        int n = api_control_load_tokens(opt->token_file, &ctl->tok_names, &ctl->tok_values, err, errlen);
        if (n < 0)
            goto fail;
        ctl->ntokens = n;
        ctl->have_tokens = true;
    }
    ctl->store = control_store_open(opt->storage_path, err, errlen);
    if (!ctl->store)
        goto fail;
    /* Changes that ran out while sluice was down come back now, before anyone can read them. */
    char xerr[256];
    int n = control_store_expire_due(ctl->store, clock_wall_ms(), NULL, NULL, xerr, sizeof(xerr));
    if (n < 0) {
        snprintf(err, errlen, "cannot revert expired flow-control changes: %s", xerr);
        goto fail;
    }
    atomic_store(&ctl->expired, (uint64_t)n);
    ctl->nworkers = opt->srv ? api_server_worker_count(opt->srv) : 0;
    ctl->workers = calloc(ctl->nworkers > 0 ? (size_t)ctl->nworkers : 1, sizeof(*ctl->workers));
    if (!ctl->workers) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int w = 0; w < ctl->nworkers; w++) {
        ctl->workers[w].ctl = ctl;
        pthread_mutex_init(&ctl->workers[w].polls_mu, NULL);
    }
    /* one lane per worker: a fan-out's sends run on every CPU the workers do */
    ctl->fanout = fanout_new(ctl->nworkers > 1 ? ctl->nworkers : 1, true);
    if (!ctl->fanout) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (pthread_create(&ctl->thread, NULL, ctl_thread_main, ctl) != 0) {
        snprintf(err, errlen, "cannot start the control thread: %s", strerror(errno));
        goto fail;
    }
    ctl->thread_started = true;
    log_info("control", "flow control ready", LF_I("jobs", (int64_t)control_store_job_count(ctl->store)),
             LF_I("expired_at_start", n), LF_B("token_auth", ctl->have_tokens), LF_B("read_auth", ctl->read_auth));
    return ctl;
fail:
    api_control_free(ctl);
    return NULL;
}

void api_control_register_routes(api_control_t *ctl, api_server_t *srv)
{
    assert(ctl && ctl->store);
    api_route_add(srv, API_GET, "/api/v1/control/jobs", "control_jobs", ctl_h_list, ctl);
    api_route_add(srv, API_GET | API_PUT | API_POST | API_DELETE, "/api/v1/control/jobs/*", "control_job", ctl_h_job,
                  ctl);
    api_route_add(srv, API_GET, "/api/v1/control/stream", "control_stream", ctl_h_stream, ctl);
    api_route_add(srv, API_POST, "/config/config.ajax", "control_tis", ctl_h_tis, ctl);
    metrics_register("control", ctl_metrics, ctl);
    if (ctl->srv)
        api_server_on_shutdown(ctl->srv, ctl_on_shutdown, ctl);
}

void api_control_state_json(const char *job, buf_t *out, void *ud)
{
    api_control_t *ctl = ud;
    if (ctl && ctl->store)
        control_store_get_json(ctl->store, job, out);
}

void api_control_shutdown(api_control_t *ctl)
{
    if (!ctl)
        return;
    if (ctl->thread_started) {
        pthread_mutex_lock(&ctl->mu);
        ctl->stop = true;
        pthread_cond_signal(&ctl->cv);
        pthread_mutex_unlock(&ctl->mu);
        pthread_join(ctl->thread, NULL);
        ctl->thread_started = false;
    }
    fanout_free(ctl->fanout);
    ctl->fanout = NULL;
    free(ctl->wake_polls);
    free(ctl->wake_fds);
    free(ctl->wake_res);
    ctl->wake_polls = NULL;
    ctl->wake_fds = NULL;
    ctl->wake_res = NULL;
    ctl->wake_cap = 0;
    /* Ops still queued (the server stopped before they ran) are dropped with their requests. */
    while (ctl->head) {
        ctl_op_t *op = ctl->head;
        ctl->head = op->next;
        ctl_op_free(op);
    }
    ctl->tail = NULL;
    control_store_close(ctl->store);
    ctl->store = NULL;
    for (int w = 0; ctl->workers && w < ctl->nworkers; w++)
        pthread_mutex_destroy(&ctl->workers[w].polls_mu);
    free(ctl->workers);
    ctl->workers = NULL;
    if (ctl->have_tokens)
        api_control_free_tokens(ctl->tok_names, ctl->tok_values, ctl->ntokens);
    ctl->tok_names = ctl->tok_values = NULL;
    ctl->ntokens = 0;
    ctl->have_tokens = false;
}

void api_control_free(api_control_t *ctl)
{
    if (!ctl)
        return;
    api_control_shutdown(ctl);
    pthread_mutex_destroy(&ctl->mu);
    pthread_cond_destroy(&ctl->cv);
    free(ctl);
}

/* --- changes from inside the daemon (the rules' closed loop) ------------------------------------------ */

int api_control_get_state(api_control_t *ctl, const char *job, control_state_t *out)
{
    if (!ctl || !ctl->store)
        return -1;
    return control_store_get(ctl->store, job, out);
}

int api_control_apply(api_control_t *ctl, const char *job, const control_change_t *chg, const char *updated_by,
                      uint64_t *version, char *err, size_t errlen)
{
    if (!ctl || !ctl->thread_started) {
        snprintf(err, errlen, "flow control is not running");
        return -1;
    }
    char jerr[128];
    if (control_job_name_valid(job, strlen(job), jerr, sizeof(jerr)) != 0 ||
        control_spec_validate(&chg->spec, jerr, sizeof(jerr)) != 0) {
        snprintf(err, errlen, "%s", jerr);
        return -1;
    }
    ctl_op_t *op = calloc(1, sizeof(*op));
    ctl_sync_t sy = {.done = false};
    if (!op) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&sy.mu, NULL);
    pthread_cond_init(&sy.cv, NULL);
    op->kind = CTL_OP_APPLY;
    op->worker = -1;
    op->sync = &sy;
    op->job = strdup(job);
    op->who = strdup(updated_by);
    op->chg = *chg;
    op->chg.spec = (control_spec_t){0};
    if (chg->reason) {
        op->reason = strndup(chg->reason, CONTROL_MAX_REASON_LEN);
        op->chg.reason = op->reason;
    }
    if (!op->job || !op->who || control_spec_copy(&op->chg.spec, &chg->spec) != 0) {
        ctl_op_free(op);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    ctl_submit(ctl, op);
    pthread_mutex_lock(&sy.mu);
    while (!sy.done)
        pthread_cond_wait(&sy.cv, &sy.mu);
    pthread_mutex_unlock(&sy.mu);
    pthread_mutex_destroy(&sy.mu);
    pthread_cond_destroy(&sy.cv);
    if (sy.code == 200) {
        if (version)
            *version = sy.version;
        return 0;
    }
    if (sy.code == 409)
        return 1;
    snprintf(err, errlen, "%s", sy.err);
    return -1;
}
