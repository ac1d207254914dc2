/*
 * server — worker threads, the shared listener, connection tracking and HTTP self-metrics.
 * See server.h for the model. Threading: everything of a worker (its base, evhttp, connection
 * list) is touched only by that worker's thread, except through event_base_once (thread-safe
 * once evthread_use_pthreads() ran). Metrics are atomics shared by all workers.
 *
 * --web.config.file (api/webconfig): the current config is one reference-counted object behind
 * wc_mu; a reload swaps it. TLS: evhttp asks server_bevcb for each accepted connection's
 * bufferevent, which is then an OpenSSL one in accepting state made from the current config's
 * context (the SSL object keeps that context alive, so a reload never disturbs open connections).
 * A failed handshake (plain HTTP to the TLS port, an untrusted client certificate) is an error
 * event evhttp answers by closing the connection. Basic auth: server_gencb checks every request
 * before routing, so no endpoint is left out.
 */
#include "api/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h> /* the request's HTTP version (no accessor in libevent 2.1) */
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "api/router.h"
#include "api/webconfig.h"
#include "internal/util/clock.h"
#include "internal/util/hashmap.h"
#include "internal/util/log.h"

#define SERVER_MAX_WORKERS 256
#define SERVER_MAX_HOOKS 16
#define SERVER_MAX_SINGLE_READ (1 << 20)
#define SERVER_LIBEVENT_READ 4096           /* libevent 2.1's most per read (EVBUFFER_MAX_READ) */
#define SERVER_READ_CHUNK (128 * 1024 - 64) /* one read of api__server_read_ahead (fits a 128 KiB chain) */
#define SERVER_READ_AHEAD API_SERVER_READ_AHEAD

/* --- metrics ----------------------------------------------------------------------------------- */

static const double server_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
#define SERVER_NBUCKETS (sizeof(server_buckets) / sizeof(server_buckets[0]))

typedef struct {
    _Atomic uint64_t codes[600];
    _Atomic uint64_t bucket[SERVER_NBUCKETS];
    _Atomic uint64_t count;
    _Atomic uint64_t sum_ns;
} server_route_metrics_t;

struct server_worker;

struct api_server {
    api_server_options_t opt;
    char *listen_address;
    int fd;
    int port;
    int nworkers;
    struct server_worker *workers;
    bool started;
    struct {
        void (*fn)(void *);
        void *ud;
    } hooks[SERVER_MAX_HOOKS];
    int nhooks;
    api_router_t *router;
    /* counters for /metrics */
    server_route_metrics_t metrics[API_MAX_ROUTES + 1]; /* last = unmatched */
    _Atomic int64_t open_connections;
    _Atomic uint64_t accepted_total;
    _Atomic uint64_t rejected_total;
    _Atomic uint64_t slow_closed_total;
    _Atomic int64_t inflight;
    _Atomic int64_t busy_connections;
    int64_t max_connections;
    _Atomic int64_t refusal_logged_ms; /* monotonic ms of the last refusal logged */
    _Atomic uint64_t refusals_held;    /* refusals not logged since */
    pthread_mutex_t calls_mu;
    struct server_call *calls; /* posted with api_server_run_on, not yet run */
    bool loops_gone;           /* the workers stopped: api_server_run_on refuses (under calls_mu) */
    pthread_mutex_t wc_mu;
    api_webconfig_t *wc; /* --web.config.file; NULL = plain HTTP, no auth */
    char *web_config_file;
    bool has_web_config; /* fixed at start: the gate runs only with a file */
    bool tls;            /* fixed at start: the listener speaks TLS (a reload cannot change it) */
    _Atomic uint64_t unauthorized_total;
};

/* The current web config with a reference the caller drops (NULL when none). */
static api_webconfig_t *server_webconfig(api_server_t *s)
{
    pthread_mutex_lock(&s->wc_mu);
    api_webconfig_t *wc = s->wc;
    if (wc)
        api_webconfig_ref(wc);
    pthread_mutex_unlock(&s->wc_mu);
    return wc;
}

void api__server_observe(api_server_t *s, int route, int code, double seconds)
{
    if (route < 0 || route >= API_MAX_ROUTES)
        route = API_MAX_ROUTES;
    server_route_metrics_t *m = &s->metrics[route];
    if (code >= 100 && code < 600)
        atomic_fetch_add_explicit(&m->codes[code], 1, memory_order_relaxed);
    for (size_t i = 0; i < SERVER_NBUCKETS; i++)
        if (seconds <= server_buckets[i])
            atomic_fetch_add_explicit(&m->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->sum_ns, (uint64_t)(seconds * 1e9), memory_order_relaxed);
    atomic_fetch_sub_explicit(&s->inflight, 1, memory_order_relaxed);
}

bool api__server_may_log(api_server_t *s, uint64_t *held)
{
    int64_t now = clock_mono_ms(), last = atomic_load(&s->refusal_logged_ms);
    if ((last && now - last < 1000) || !atomic_compare_exchange_strong(&s->refusal_logged_ms, &last, now)) {
        atomic_fetch_add(&s->refusals_held, 1);
        return false;
    }
    *held = atomic_exchange(&s->refusals_held, 0);
    return true;
}

struct api_router *api__server_router(api_server_t *s)
{
    return s->router;
}

/* --- connection tracking ------------------------------------------------------------------------ */

typedef struct server_conn {
    struct api_server *srv;
    struct bufferevent *bev; /* we hold one reference */
    struct evbuffer_cb_entry *input_cb;
    struct server_conn *next;
    int64_t created_ms;
    bool saw_request;
    bool busy;       /* bytes arrived since the last request was dispatched: a request is being read */
    bool over_limit; /* opened beyond --web.max-connections: closed by the next sweep */
    bool reading_ahead; /* server_conn_input is reading the socket itself */
} server_conn_t;

typedef struct server_worker {
    struct api_server *srv;
    int index;
    pthread_t thread;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    struct event *sweep;
    struct event *resume; /* re-enables accepting after one accept (server_bevcb) */
    _Atomic uint64_t accepted;
    _Atomic int64_t open; /* connections this worker holds (read by the others' server_yield_accept) */
    int paused_for;      /* server_yield_accept: the worker the last pause waited for, */
    uint64_t paused_at;  /* and its accepted count then (this worker's thread only) */
    bool stopping; /* api_server_stop disabled accepting for good (this worker's thread only) */
    server_conn_t *conns;
    hashmap_t conn_by_bev; /* bufferevent -> its conn (this worker's thread only) */
} server_worker_t;

static server_conn_t *map_find(server_worker_t *w, const struct bufferevent *bev)
{
    uint64_t *v = hashmap_get(&w->conn_by_bev, (uintptr_t)bev);
    return v ? (server_conn_t *)(uintptr_t)*v : NULL;
}

static void server_conn_set_busy(server_conn_t *c, bool busy)
{
    if (c->busy != busy) {
        c->busy = busy;
        atomic_fetch_add(&c->srv->busy_connections, busy ? 1 : -1);
    }
}

size_t api__server_read_ahead(struct evbuffer *buf, int fd)
{
    size_t total = 0;
    while (total < SERVER_READ_AHEAD) {
        struct evbuffer_iovec v[2];
        int nv = evbuffer_reserve_space(buf, SERVER_READ_CHUNK, v, 2);
        if (nv <= 0)
            break;
        struct iovec iov[2];
        size_t want = 0, room = SERVER_READ_AHEAD - total;
        for (int i = 0; i < nv; i++) {
            iov[i].iov_base = v[i].iov_base;
            iov[i].iov_len = v[i].iov_len < room - want ? v[i].iov_len : room - want;
            want += iov[i].iov_len;
        }
        ssize_t r = readv(fd, iov, nv);
        if (r <= 0) {
            /* EOF, an error, or nothing more (EAGAIN): libevent's next read sees it as usual. */
            evbuffer_commit_space(buf, NULL, 0);
            break;
        }
        size_t left = (size_t)r;
        int used = 0;
        for (; used < nv && left; used++) {
            v[used].iov_len = left < v[used].iov_len ? left : v[used].iov_len;
            left -= v[used].iov_len;
        }
        evbuffer_commit_space(buf, v, used);
        total += (size_t)r;
        if ((size_t)r < want)
            break; /* the socket is drained */
    }
    return total;
}

/* Bytes arrived on a connection: until its request is dispatched, shutdown waits for it.
 *
 * libevent 2.1 reads at most 4 KiB per readiness (EVBUFFER_MAX_READ, which
 * bufferevent_set_max_single_read cannot raise), each read after a FIONREAD ioctl and followed
 * by evhttp's read callback: a 590 KiB push body took ~150 such rounds, near half of a steady
 * push's CPU. So when libevent's read filled those 4 KiB (the socket likely holds more), the rest
 * is read here at once into the same buffer, before evhttp's callback consumes it. Each such call
 * adds at most SERVER_READ_AHEAD, and evhttp still applies its header and body limits as it
 * consumes the buffer, so a client cannot make a connection buffer without bound. TLS
 * connections are left alone: their socket bytes are not this buffer's. */
static void server_conn_input(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    server_conn_t *c = arg;
    if (info->n_added == 0)
        return;
    server_conn_set_busy(c, true);
    if (c->srv->tls || c->reading_ahead || info->n_added < SERVER_LIBEVENT_READ)
        return;
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    if (fd < 0)
        return;
    c->reading_ahead = true; /* our own commits call back here */
    api__server_read_ahead(buf, fd);
    c->reading_ahead = false;
}

/* Every worker accepts from the one listening socket, and libevent's listener accepts until the
 * backlog is empty: a pool's burst of keep-alive connections (a pusher's 8, opened at once) all
 * landed on whichever worker woke first, and every request on them then shared one core. So a
 * worker takes one connection per pass of its loop: the listener is disabled here, inside its
 * accept loop (which then returns), and enabled again before the next wait by an event made
 * active now. That alone was not enough on this VM: the worker that woke first looped through
 * a burst of 8 before the other one's thread ran (9 to 2 per run). So a worker that holds
 * SERVER_ACCEPT_SLACK more connections than the least loaded one waits SERVER_ACCEPT_PAUSE_MS
 * before it accepts again, and the backlog goes to the others. A pause must never hold a burst up
 * (an earlier version waited until woken or its 250 ms sweep, and 1,000 long-polls opened at
 * once then took 19 s to park): it is short, and a worker pauses again only after the least
 * loaded one has accepted something since its last pause: one that is busy, or not competing,
 * costs one pause, not one per connection. */
#define SERVER_ACCEPT_SLACK 2
#define SERVER_ACCEPT_PAUSE_MS 5

static void server_yield_accept(server_worker_t *w)
{
    api_server_t *s = w->srv;
    if (s->nworkers < 2 || !w->bound || !w->resume)
        return;
    struct evconnlistener *l = evhttp_bound_socket_get_listener(w->bound);
    if (evconnlistener_disable(l) != 0)
        return;
    int64_t mine = atomic_load_explicit(&w->open, memory_order_relaxed), least = mine;
    int li = w->index;
    for (int i = 0; i < s->nworkers; i++) {
        int64_t n = atomic_load_explicit(&s->workers[i].open, memory_order_relaxed);
        if (n < least) {
            least = n;
            li = i;
        }
    }
    uint64_t progress = atomic_load_explicit(&s->workers[li].accepted, memory_order_relaxed);
    if (mine > least + SERVER_ACCEPT_SLACK && !(li == w->paused_for && progress == w->paused_at)) {
        w->paused_for = li;
        w->paused_at = progress;
        struct timeval pause = {0, SERVER_ACCEPT_PAUSE_MS * 1000};
        event_add(w->resume, &pause);
    } else {
        event_active(w->resume, EV_TIMEOUT, 0);
    }
}

static void server_resume_accept(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    server_worker_t *w = arg;
    if (!w->stopping)
        evconnlistener_enable(evhttp_bound_socket_get_listener(w->bound));
}

/* evhttp asks us for each new connection's bufferevent: keep a reference to track its life. */
static struct bufferevent *server_bevcb(struct event_base *base, void *arg)
{
    server_worker_t *w = arg;
    struct bufferevent *bev = NULL;
    SSL *ssl = NULL;
    if (w->srv->tls) {
        pthread_mutex_lock(&w->srv->wc_mu);
        ssl = SSL_new(api_webconfig_tls(w->srv->wc));
        pthread_mutex_unlock(&w->srv->wc_mu);
        if (!ssl) {
            ERR_clear_error();
            return NULL;
        }
        /* evhttp sets the socket later (bufferevent_setfd), which attaches it to ssl */
        bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
        if (!bev) {
            SSL_free(ssl);
            return NULL;
        }
        /* clients commonly close without close_notify; the HTTP framing says where a message ends */
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    } else {
        bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    }
    if (!bev)
        return NULL;
    /* bufferevent's own cap per read (16 KiB by default) is lifted, but libevent 2.1 still reads
     * at most 4 KiB at a time: server_conn_input reads the rest of what arrived. The body limit
     * (evhttp's max body size) still bounds what a request may hold. */
    bufferevent_set_max_single_read(bev, SERVER_MAX_SINGLE_READ);
    server_conn_t *c = calloc(1, sizeof(*c));
    if (!c || hashmap_put(&w->conn_by_bev, (uintptr_t)bev, (uintptr_t)c) < 0) {
        free(c);
        return bev; /* untracked but served */
    }
    bufferevent_incref(bev);
    c->srv = w->srv;
    c->bev = bev;
    c->input_cb = evbuffer_add_cb(bufferevent_get_input(bev), server_conn_input, c);
    c->created_ms = clock_mono_ms();
    c->next = w->conns;
    w->conns = c;
    c->over_limit = atomic_fetch_add(&w->srv->open_connections, 1) + 1 > w->srv->max_connections;
    atomic_fetch_add_explicit(&w->open, 1, memory_order_relaxed);
    atomic_fetch_add(&w->srv->accepted_total, 1);
    atomic_fetch_add_explicit(&w->accepted, 1, memory_order_relaxed);
    server_yield_accept(w);
    return bev;
}

static void server_conn_release(server_conn_t *c)
{
    server_conn_set_busy(c, false);
    if (c->input_cb)
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->input_cb);
    bufferevent_decref(c->bev);
}

/* Every 250 ms: release connections evhttp has freed (it clears their callbacks when it lets go)
 * and shut down connections that never delivered a complete request within the read timeout. */
static void server_sweep(evutil_socket_t fd, short what, void *arg)
{
    server_worker_t *w = arg;
    int64_t now = clock_mono_ms();
    for (server_conn_t **pp = &w->conns; *pp;) {
        server_conn_t *c = *pp;
        bufferevent_data_cb rcb = NULL, wcb = NULL;
        bufferevent_event_cb ecb = NULL;
        bufferevent_getcb(c->bev, &rcb, &wcb, &ecb, NULL);
        if (!rcb && !wcb && !ecb) {
            *pp = c->next;
            hashmap_del(&w->conn_by_bev, (uintptr_t)c->bev);
            server_conn_release(c);
            free(c);
            atomic_fetch_sub(&w->srv->open_connections, 1);
            atomic_fetch_sub_explicit(&w->open, 1, memory_order_relaxed);
            continue;
        }
        if (c->over_limit) {
            /* Beyond the limit a connection is never served (its request would get 503 and a
             * close): do not let it hold a slot until its read timeout either. */
            evutil_socket_t cfd = bufferevent_getfd(c->bev);
            if (cfd >= 0) {
                shutdown(cfd, SHUT_RDWR);
                if (!c->saw_request) /* else its request was counted when it got its 503 */
                    atomic_fetch_add(&w->srv->rejected_total, 1);
            }
            c->over_limit = false; /* once */
            c->saw_request = true;
        }
        if (!c->saw_request && now - c->created_ms > w->srv->opt.read_timeout_ms) {
            evutil_socket_t cfd = bufferevent_getfd(c->bev);
            if (cfd >= 0) {
                shutdown(cfd, SHUT_RDWR);
                atomic_fetch_add(&w->srv->slow_closed_total, 1);
            }
            c->saw_request = true; /* once */
        }
        pp = &c->next;
    }
}

/* --- requests ------------------------------------------------------------------------------------ */

static int server_method(enum evhttp_cmd_type t)
{
    switch (t) {
    case EVHTTP_REQ_GET: return API_GET;
    case EVHTTP_REQ_POST: return API_POST;
    case EVHTTP_REQ_PUT: return API_PUT;
    case EVHTTP_REQ_DELETE: return API_DELETE;
    case EVHTTP_REQ_HEAD: return API_HEAD;
    case EVHTTP_REQ_OPTIONS: return API_OPTIONS;
    case EVHTTP_REQ_PATCH: return API_PATCH;
    default: return 0;
    }
}

static void server_gencb(struct evhttp_request *ev, void *arg)
{
    server_worker_t *w = arg;
    struct evhttp_connection *evcon = evhttp_request_get_connection(ev);
    if (evcon) {
        server_conn_t *c = map_find(w, evhttp_connection_get_bufferevent(evcon));
        if (c) {
            c->saw_request = true;
            server_conn_set_busy(c, false);
        }
    }
    /* HTTP/1.x with x > 1 is answered as HTTP/1.1, the highest 1.x we speak (RFC 9110 6.2: a server
     * answers with its own version). libevent itself refuses other major versions with 400. */
    if (ev->major == 1 && ev->minor > 1)
        ev->minor = 1;
    atomic_fetch_add_explicit(&w->srv->inflight, 1, memory_order_relaxed);
    api_req_t *req = calloc(1, sizeof(*req));
    arena_t *arena = arena_create(0);
    if (!req || !arena) {
        free(req);
        arena_destroy(arena);
        evhttp_send_error(ev, 503, "out of memory");
        atomic_fetch_sub_explicit(&w->srv->inflight, 1, memory_order_relaxed);
        return;
    }
    req->ev = ev;
    req->srv = w->srv;
    req->arena = arena;
    req->worker = w->index;
    req->start_ns = clock_mono_ns();
    req->route = -1;
    req->method = server_method(evhttp_request_get_command(ev));

    const char *uri = evhttp_request_get_uri(ev);
    const char *q = strchr(uri, '?');
    size_t plen = q ? (size_t)(q - uri) : strlen(uri);
    req->raw_path = arena_strndup(arena, uri, plen);
    req->query = q ? arena_strdup(arena, q + 1) : NULL;
    if (w->srv->tls && !(evcon && bufferevent_openssl_get_ssl(evhttp_connection_get_bufferevent(evcon)))) {
        /* server_bevcb could not make a TLS connection (out of memory) and evhttp fell back to a
         * plain one: never serve plain HTTP on the TLS port */
        req->path = req->raw_path;
        api_reply_header(req, "Connection", "close");
        api_reply_text(req, 503, "cannot set up TLS for this connection\n");
        return;
    }
    if (w->srv->has_web_config) {
        api_webconfig_t *wc = server_webconfig(w->srv);
        bool ok = api_webconfig_check_basic(wc, api_req_header(req, "Authorization"));
        api_webconfig_unref(wc);
        if (!ok) {
            /* as Prometheus' exporter-toolkit answers */
            atomic_fetch_add(&w->srv->unauthorized_total, 1);
            req->path = req->raw_path;
            api_reply_header(req, "WWW-Authenticate", "Basic");
            api_reply_text(req, 401, "Unauthorized\n");
            return;
        }
    }
    size_t dlen = 0;
    char *decoded = evhttp_uridecode(req->raw_path, 0, &dlen);
    if (!decoded || strlen(decoded) != dlen) {
        free(decoded);
        req->path = req->raw_path;
        api_reply_text(req, 400, "invalid percent-encoding in path\n");
        return;
    }
    req->path = arena_strndup(arena, decoded, dlen);
    free(decoded);

    if (atomic_load(&w->srv->open_connections) > w->srv->max_connections) {
        atomic_fetch_add(&w->srv->rejected_total, 1);
        api_reply_header(req, "Connection", "close");
        api_reply_text(req, 503, "too many open connections (limit %lld)\n", (long long)w->srv->max_connections);
        return;
    }
    api_router_dispatch(w->srv->router, req);
}

/* --- lifecycle ------------------------------------------------------------------------------------ */

static int server_parse_address(const char *addr, char *host, size_t hostcap, char *port, size_t portcap)
{
    const char *colon;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':')
            return -1;
        snprintf(host, hostcap, "%.*s", (int)(close - addr - 1), addr + 1);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon)
            return -1;
        snprintf(host, hostcap, "%.*s", (int)(colon - addr), addr);
    }
    snprintf(port, portcap, "%s", colon + 1);
    if (!port[0])
        return -1;
    for (const char *p = port; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    return atoi(port) <= 65535 ? 0 : -1;
}

api_server_t *api_server_create(const api_server_options_t *opt, char *err, size_t errlen)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, (void (*)(void))evthread_use_pthreads);

    char host[256], port[16];
    if (server_parse_address(opt->listen_address, host, sizeof(host), port, sizeof(port)) != 0) {
        snprintf(err, errlen, "invalid listen address \"%s\" (want host:port, :port or [ipv6]:port)",
                 opt->listen_address);
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve listen address \"%s\": %s", opt->listen_address, gai_strerror(gai));
        return NULL;
    }
    /* Prefer IPv6 any-address (dual stack) for ":port", like Go's net.Listen. */
    struct addrinfo *pick = ai;
    if (!host[0])
        for (struct addrinfo *p = ai; p; p = p->ai_next)
            if (p->ai_family == AF_INET6)
                pick = p;
    int fd = socket(pick->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 && pick->ai_family == AF_INET6 && pick != ai) {
        pick = ai;
        fd = socket(pick->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        freeaddrinfo(ai);
        return NULL;
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (pick->ai_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, pick->ai_addr, pick->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
        snprintf(err, errlen, "listen on %s: %s", opt->listen_address, strerror(errno));
        close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                              : ntohs(((struct sockaddr_in *)&ss)->sin_port);

    api_server_t *s = calloc(1, sizeof(*s));
    api_router_t *router = api__router_new();
    if (!s || !router) {
        free(s);
        api__router_free(router);
        close(fd);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->router = router;
    s->opt = *opt;
    s->listen_address = strdup(opt->listen_address);
    s->opt.listen_address = s->listen_address;
    s->fd = fd;
    s->port = bound_port;
    s->nworkers = opt->workers > 0 ? opt->workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (s->nworkers < 1)
        s->nworkers = 1;
    if (s->nworkers > SERVER_MAX_WORKERS)
        s->nworkers = SERVER_MAX_WORKERS;
    s->max_connections = opt->max_connections > 0 ? opt->max_connections : INT64_MAX;
    pthread_mutex_init(&s->calls_mu, NULL);
    pthread_mutex_init(&s->wc_mu, NULL);
    if (opt->web_config_file && opt->web_config_file[0]) {
        s->web_config_file = strdup(opt->web_config_file);
        s->wc = api_webconfig_load(opt->web_config_file, err, errlen);
        if (!s->web_config_file || !s->wc) {
            if (s->wc)
                snprintf(err, errlen, "out of memory");
            api_server_destroy(s);
            return NULL;
        }
        s->has_web_config = true;
        s->tls = api_webconfig_tls(s->wc) != NULL;
    }
    return s;
}

int api_server_reload_web_config(api_server_t *s, char *err, size_t errlen)
{
    if (!s->web_config_file)
        return 0;
    api_webconfig_t *wc = api_webconfig_load(s->web_config_file, err, errlen);
    if (!wc)
        return -1;
    if ((api_webconfig_tls(wc) != NULL) != s->tls) {
        snprintf(err, errlen, "web config file %s: turning TLS %s needs a restart", s->web_config_file,
                 s->tls ? "off" : "on");
        api_webconfig_unref(wc);
        return -1;
    }
    pthread_mutex_lock(&s->wc_mu);
    api_webconfig_t *old = s->wc;
    s->wc = wc;
    pthread_mutex_unlock(&s->wc_mu);
    api_webconfig_unref(old);
    return 0;
}

bool api_server_tls(const api_server_t *s)
{
    return s->tls;
}

int api_server_port(const api_server_t *s)
{
    return s->port;
}
int api_server_worker_count(const api_server_t *s)
{
    return s->nworkers;
}
struct event_base *api_server_worker_base(api_server_t *s, int worker)
{
    return s->workers[worker].base;
}
int64_t api_server_inflight(const api_server_t *s)
{
    return atomic_load(&s->inflight);
}

void api_server_on_shutdown(api_server_t *s, void (*fn)(void *ud), void *ud)
{
    if (s->nhooks < SERVER_MAX_HOOKS) {
        s->hooks[s->nhooks].fn = fn;
        s->hooks[s->nhooks].ud = ud;
        s->nhooks++;
    }
}

static void *server_worker_main(void *arg)
{
    server_worker_t *w = arg;
    char name[16];
    snprintf(name, sizeof(name), "http-%d", w->index);
    pthread_setname_np(pthread_self(), name);
    event_base_dispatch(w->base);
    return NULL;
}

int api_server_start(api_server_t *s, char *err, size_t errlen)
{
    s->workers = calloc((size_t)s->nworkers, sizeof(*s->workers));
    if (!s->workers) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    struct timeval tv = {.tv_sec = s->opt.read_timeout_ms / 1000, .tv_usec = (s->opt.read_timeout_ms % 1000) * 1000};
    for (int i = 0; i < s->nworkers; i++) {
        server_worker_t *w = &s->workers[i];
        w->srv = s;
        w->index = i;
        w->base = event_base_new();
        w->http = w->base ? evhttp_new(w->base) : NULL;
        if (!w->http) {
            snprintf(err, errlen, "cannot create event loop %d", i);
            return -1;
        }
        evhttp_set_max_body_size(w->http, (ev_ssize_t)s->opt.max_body_bytes);
        evhttp_set_max_headers_size(w->http, (ev_ssize_t)s->opt.max_header_bytes);
        evhttp_set_timeout_tv(w->http, &tv);
        evhttp_set_allowed_methods(w->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                                EVHTTP_REQ_HEAD | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
        evhttp_set_default_content_type(w->http, "text/plain; charset=utf-8");
        evhttp_set_bevcb(w->http, server_bevcb, w);
        evhttp_set_gencb(w->http, server_gencb, w);
        w->bound = evhttp_accept_socket_with_handle(w->http, s->fd);
        if (!w->bound) {
            snprintf(err, errlen, "cannot accept on the listening socket");
            return -1;
        }
        w->resume = event_new(w->base, -1, 0, server_resume_accept, w);
        w->paused_for = -1;
        w->sweep = event_new(w->base, -1, EV_PERSIST, server_sweep, w);
        struct timeval period = {0, 250 * 1000};
        event_add(w->sweep, &period);
    }
    for (int i = 0; i < s->nworkers; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, server_worker_main, &s->workers[i]) != 0) {
            snprintf(err, errlen, "cannot start worker thread: %s", strerror(errno));
            return -1;
        }
    }
    s->started = true;
    return 0;
}

/* A call posted to a worker's loop. Calls still queued when the loops stop (posted during
 * shutdown) are freed by api_server_destroy, so every call is on a list until it ran. */
typedef struct server_call {
    void (*fn)(void *);
    void *arg;
    api_server_t *srv;
    struct server_call *next, *prev;
} server_call_t;

static void server_call_cb(evutil_socket_t fd, short what, void *arg)
{
    server_call_t *c = arg;
    api_server_t *s = c->srv;
    pthread_mutex_lock(&s->calls_mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&s->calls_mu);
    c->fn(c->arg);
    free(c);
}

int api_server_run_on(api_server_t *s, int worker, void (*fn)(void *arg), void *arg)
{
    server_call_t *c = malloc(sizeof(*c));
    if (!c)
        return -1;
    c->fn = fn;
    c->arg = arg;
    c->srv = s;
    c->prev = NULL;
    pthread_mutex_lock(&s->calls_mu);
    if (s->loops_gone) {
        pthread_mutex_unlock(&s->calls_mu);
        free(c);
        return -1;
    }
    c->next = s->calls;
    if (s->calls)
        s->calls->prev = c;
    s->calls = c;
    struct timeval zero = {0, 0};
    int rc = event_base_once(s->workers[worker].base, -1, EV_TIMEOUT, server_call_cb, c, &zero);
    if (rc != 0) {
        s->calls = c->next;
        if (c->next)
            c->next->prev = NULL;
    }
    pthread_mutex_unlock(&s->calls_mu);
    if (rc != 0) {
        free(c);
        return -1;
    }
    return 0;
}

static void server_stop_accepting(void *arg)
{
    server_worker_t *w = arg;
    w->stopping = true;
    if (w->bound) {
        evconnlistener_disable(evhttp_bound_socket_get_listener(w->bound));
    }
}

void api_server_stop(api_server_t *s, int64_t timeout_ms)
{
    if (!s->started)
        return;
    for (int i = 0; i < s->nworkers; i++)
        api_server_run_on(s, i, server_stop_accepting, &s->workers[i]);
    for (int i = 0; i < s->nhooks; i++)
        s->hooks[i].fn(s->hooks[i].ud);
    int64_t deadline = clock_mono_ms() + timeout_ms;
    /* Like Go's http.Server.Shutdown: wait for requests being handled and for requests still
     * being read (connections that received bytes not yet dispatched). */
    while ((atomic_load(&s->inflight) > 0 || atomic_load(&s->busy_connections) > 0) && clock_mono_ms() < deadline) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    int64_t left = atomic_load(&s->inflight), reading = atomic_load(&s->busy_connections);
    if (left > 0 || reading > 0)
        log_warn("http", "shutdown timeout: abandoning requests", LF_I("inflight", left), LF_I("reading", reading));
    /* Replies queued just now (parked requests answered by the shutdown hooks, the last
     * in-flight ones) are still in output buffers: let each loop run briefly to write them. */
    struct timeval flush = {0, 200 * 1000};
    for (int i = 0; i < s->nworkers; i++)
        event_base_loopexit(s->workers[i].base, &flush);
    for (int i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i].thread, NULL);
    s->started = false;
    /* Calls posted while the loops were ending that they did not run: they run here, the loops
     * gone (no worker thread competes), so whoever posted one still gets back what it handed
     * over (a push's job, a query's): a reply that goes nowhere now, and its memory freed. Later
     * calls are refused: the poster keeps what it would have handed over. */
    pthread_mutex_lock(&s->calls_mu);
    s->loops_gone = true;
    server_call_t *unrun = s->calls;
    s->calls = NULL;
    pthread_mutex_unlock(&s->calls_mu);
    while (unrun) {
        server_call_t *c = unrun;
        unrun = c->next;
        c->fn(c->arg);
        free(c);
    }
}

void api_server_destroy(api_server_t *s)
{
    if (!s)
        return;
    if (s->started)
        api_server_stop(s, 0);
    for (int i = 0; s->workers && i < s->nworkers; i++) {
        server_worker_t *w = &s->workers[i];
        if (w->sweep)
            event_free(w->sweep);
        if (w->resume)
            event_free(w->resume);
        if (w->http)
            evhttp_free(w->http);
        while (w->conns) {
            server_conn_t *c = w->conns;
            w->conns = c->next;
            server_conn_release(c);
            free(c);
            atomic_fetch_sub(&s->open_connections, 1);
        }
        hashmap_free(&w->conn_by_bev);
        if (w->base)
            event_base_free(w->base);
    }
    free(s->workers);
    /* Calls that never ran (posted while the loops were stopping); their events died with the
     * bases above. */
    while (s->calls) {
        server_call_t *c = s->calls;
        s->calls = c->next;
        free(c);
    }
    pthread_mutex_destroy(&s->calls_mu);
    api_webconfig_unref(s->wc);
    free(s->web_config_file);
    pthread_mutex_destroy(&s->wc_mu);
    api__router_free(s->router);
    if (s->fd >= 0)
        close(s->fd);
    free(s->listen_address);
    free(s);
}

void api_server_write_metrics(api_server_t *s, buf_t *out)
{
    int nroutes = api_router_count(s->router);
    buf_puts(out, "# HELP sluice_http_requests_total Requests answered, by handler and status code.\n"
                  "# TYPE sluice_http_requests_total counter\n");
    for (int r = 0; r <= nroutes && r <= API_MAX_ROUTES; r++) {
        int idx = r == nroutes ? API_MAX_ROUTES : r;
        const char *name = r == nroutes ? "other" : api_router_name(s->router, r);
        for (int code = 100; code < 600; code++) {
            uint64_t n = atomic_load_explicit(&s->metrics[idx].codes[code], memory_order_relaxed);
            if (n)
                buf_printf(out, "sluice_http_requests_total{code=\"%d\",handler=\"%s\"} %llu\n", code, name,
                           (unsigned long long)n);
        }
    }
    buf_puts(out, "# HELP sluice_http_request_duration_seconds Time from request read to reply queued.\n"
                  "# TYPE sluice_http_request_duration_seconds histogram\n");
    for (int r = 0; r <= nroutes && r <= API_MAX_ROUTES; r++) {
        int idx = r == nroutes ? API_MAX_ROUTES : r;
        const char *name = r == nroutes ? "other" : api_router_name(s->router, r);
        server_route_metrics_t *m = &s->metrics[idx];
        uint64_t count = atomic_load(&m->count);
        if (!count)
            continue;
        for (size_t i = 0; i < SERVER_NBUCKETS; i++) {
            buf_printf(out, "sluice_http_request_duration_seconds_bucket{handler=\"%s\",le=\"", name);
            buf_put_float(out, server_buckets[i]);
            buf_printf(out, "\"} %llu\n", (unsigned long long)atomic_load(&m->bucket[i]));
        }
        buf_printf(out, "sluice_http_request_duration_seconds_bucket{handler=\"%s\",le=\"+Inf\"} %llu\n", name,
                   (unsigned long long)count);
        buf_printf(out, "sluice_http_request_duration_seconds_sum{handler=\"%s\"} ", name);
        buf_put_float(out, (double)atomic_load(&m->sum_ns) / 1e9);
        buf_printf(out, "\nsluice_http_request_duration_seconds_count{handler=\"%s\"} %llu\n", name,
                   (unsigned long long)count);
    }
    buf_printf(
        out,
        "# HELP sluice_http_open_connections HTTP connections currently open.\n"
        "# TYPE sluice_http_open_connections gauge\nsluice_http_open_connections %lld\n"
        "# HELP sluice_http_connections_accepted_total HTTP connections accepted.\n"
        "# TYPE sluice_http_connections_accepted_total counter\nsluice_http_connections_accepted_total %llu\n"
        "# HELP sluice_http_connections_rejected_total Requests refused because of --web.max-connections.\n"
        "# TYPE sluice_http_connections_rejected_total counter\nsluice_http_connections_rejected_total %llu\n"
        "# HELP sluice_http_slow_connections_closed_total Connections closed for not sending a request within "
        "--web.read-timeout.\n"
        "# TYPE sluice_http_slow_connections_closed_total counter\nsluice_http_slow_connections_closed_total %llu\n"
        "# HELP sluice_http_requests_in_flight Requests being served, including parked long-polls.\n"
        "# TYPE sluice_http_requests_in_flight gauge\nsluice_http_requests_in_flight %lld\n"
        "# HELP sluice_http_unauthorized_total Requests answered 401 for missing or wrong basic-auth credentials "
        "(--web.config.file).\n"
        "# TYPE sluice_http_unauthorized_total counter\nsluice_http_unauthorized_total %llu\n",
        (long long)atomic_load(&s->open_connections), (unsigned long long)atomic_load(&s->accepted_total),
        (unsigned long long)atomic_load(&s->rejected_total), (unsigned long long)atomic_load(&s->slow_closed_total),
        (long long)atomic_load(&s->inflight), (unsigned long long)atomic_load(&s->unauthorized_total));
    if (s->workers) {
        buf_puts(out, "# HELP sluice_http_worker_connections_accepted_total HTTP connections accepted, by worker "
                      "thread.\n# TYPE sluice_http_worker_connections_accepted_total counter\n");
        for (int i = 0; i < s->nworkers; i++)
            buf_printf(out, "sluice_http_worker_connections_accepted_total{worker=\"%d\"} %llu\n", i,
                       (unsigned long long)atomic_load_explicit(&s->workers[i].accepted, memory_order_relaxed));
    }
}
