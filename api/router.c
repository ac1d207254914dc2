/*
 * router — route table, request helpers and replies; see router.h.
 *
 * Routes live in the server's table (one per api_server_t, filled before the workers start and
 * read-only afterwards), so dispatch takes no lock. Matching is a linear scan choosing the longest matching pattern (a few
 * dozen routes; the scan is cheaper than the request parsing around it).
 */
#include "api/router.h"

#include <assert.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/server.h"
#include "internal/util/clock.h"
#include "internal/util/log.h"

enum { ROUTER_REPLIED = 1, ROUTER_PARKED = 2 };

typedef struct {
    int methods;
    char *path;
    size_t len;
    bool prefix;
    char *name;
    api_handler_fn fn;
    void *ud;
} router_route_t;

struct api_router {
    router_route_t routes[API_MAX_ROUTES];
    int n;
};

api_router_t *api__router_new(void)
{
    return calloc(1, sizeof(api_router_t));
}

void api__router_free(api_router_t *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++) {
        free(r->routes[i].path);
        free(r->routes[i].name);
    }
    free(r);
}

int api_route_add(api_server_t *srv, int methods, const char *path, const char *name, api_handler_fn fn, void *ud)
{
    api_router_t *rt = api__server_router(srv);
    assert(rt->n < API_MAX_ROUTES);
    router_route_t *r = &rt->routes[rt->n];
    size_t len = strlen(path);
    r->prefix = len > 0 && path[len - 1] == '*';
    r->len = r->prefix ? len - 1 : len;
    r->path = strndup(path, r->len);
    r->name = strdup(name);
    r->methods = methods;
    r->fn = fn;
    r->ud = ud;
    return rt->n++;
}

int api_router_count(const api_router_t *r)
{
    return r->n;
}

const char *api_router_name(const api_router_t *r, int route)
{
    return route >= 0 && route < r->n ? r->routes[route].name : "other";
}

static const char *router_allow_header(int methods, char *out, size_t cap)
{
    static const struct {
        int bit;
        const char *name;
    } names[] = {{API_GET, "GET"},       {API_HEAD, "HEAD"},       {API_POST, "POST"},  {API_PUT, "PUT"},
                 {API_DELETE, "DELETE"}, {API_OPTIONS, "OPTIONS"}, {API_PATCH, "PATCH"}};
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (methods & names[i].bit)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", names[i].name);
    return out;
}

void api_router_dispatch(const api_router_t *rt, api_req_t *req)
{
    int best = -1, allowed = 0;
    size_t best_len = 0;
    size_t plen = strlen(req->path);
    for (int i = 0; i < rt->n; i++) {
        const router_route_t *r = &rt->routes[i];
        bool match = r->prefix ? (plen >= r->len && memcmp(req->path, r->path, r->len) == 0)
                               : (plen == r->len && memcmp(req->path, r->path, r->len) == 0);
        if (!match)
            continue;
        int methods = r->methods | ((r->methods & API_GET) ? API_HEAD : 0);
        if (!(methods & req->method)) {
            allowed |= methods;
            continue;
        }
        if (best < 0 || r->len > best_len || (r->len == best_len && !r->prefix)) {
            best = i;
            best_len = r->len;
        }
    }
    if (best < 0) {
        if (allowed) {
            char allow[128];
            api_reply_header(req, "Allow", router_allow_header(allowed, allow, sizeof(allow)));
            api_reply_text(req, 405, "method not allowed\n");
        } else {
            api_reply_text(req, 404, "404 page not found\n");
        }
        return;
    }
    req->route = best;
    /* The reply frees req, so the outcome comes back through a local the request points at. */
    int outcome = 0;
    req->outcome_ = &outcome;
    rt->routes[best].fn(req, rt->routes[best].ud);
    if (outcome == ROUTER_PARKED)
        req->outcome_ = NULL;
    assert(outcome != 0 && "handler must reply or park");
    if (outcome == 0)
        api_reply_text(req, 500, "internal error: handler did not answer\n");
}

/* --- reading ---------------------------------------------------------------------------------- */

const char *api_req_header(api_req_t *req, const char *name)
{
    return evhttp_find_header(evhttp_request_get_input_headers(req->ev), name);
}

const char *api_req_peer(api_req_t *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
    char *host = NULL;
    ev_uint16_t port = 0;
    if (evcon)
        evhttp_connection_get_peer(evcon, &host, &port);
    return host;
}

const uint8_t *api_req_body(api_req_t *req, size_t *len)
{
    if (!req->body_read_) {
        struct evbuffer *in = evhttp_request_get_input_buffer(req->ev);
        size_t n = evbuffer_get_length(in);
        assert(req->arena && "the body is read before the arena is stolen");
        req->body_ = arena_alloc(req->arena, n + 1);
        /* moved, not copied: the input buffer's chains go now, not when the request is freed
         * (a queued push would otherwise hold its body twice) */
        evbuffer_remove(in, req->body_, n);
        req->body_[n] = 0;
        req->body_len_ = n;
        req->body_read_ = true;
    }
    *len = req->body_len_;
    return req->body_;
}

struct evbuffer *api_req_body_steal(api_req_t *req)
{
    assert(!req->body_read_ && "the body was read already");
    struct evbuffer *b = evbuffer_new();
    if (b && evbuffer_add_buffer(b, evhttp_request_get_input_buffer(req->ev)) != 0) {
        evbuffer_free(b);
        b = NULL;
    }
    return b;
}

typedef struct {
    const char **names;
    const char **values;
    size_t n, cap;
} router_params_t;

static void params_add(api_req_t *req, router_params_t *p, const char *s, size_t len)
{
    /* one "name=value" piece; '+' means space in form encoding */
    const char *eq = memchr(s, '=', len);
    size_t nlen = eq ? (size_t)(eq - s) : len;
    const char *v = eq ? eq + 1 : s + len;
    size_t vlen = eq ? len - nlen - 1 : 0;
    char *name = arena_strndup(req->arena, s, nlen);
    char *val = arena_strndup(req->arena, v, vlen);
    for (char *c = name; *c; c++)
        if (*c == '+')
            *c = ' ';
    for (char *c = val; *c; c++)
        if (*c == '+')
            *c = ' ';
    char *dn = evhttp_uridecode(name, 0, NULL);
    char *dv = evhttp_uridecode(val, 0, NULL);
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        const char **nn = arena_alloc(req->arena, cap * sizeof(*nn));
        const char **nv = arena_alloc(req->arena, cap * sizeof(*nv));
        if (p->n) {
            memcpy(nn, p->names, p->n * sizeof(*nn));
            memcpy(nv, p->values, p->n * sizeof(*nv));
        }
        p->names = nn;
        p->values = nv;
        p->cap = cap;
    }
    p->names[p->n] = arena_strdup(req->arena, dn ? dn : name);
    p->values[p->n] = arena_strdup(req->arena, dv ? dv : val);
    p->n++;
    free(dn);
    free(dv);
}

static void params_parse(api_req_t *req, router_params_t *p, const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && s[j] != '&' && s[j] != ';')
            j++;
        if (j > i)
            params_add(req, p, s + i, j - i);
        i = j + 1;
    }
}

static router_params_t *router_params(api_req_t *req)
{
    if (req->params_)
        return req->params_;
    assert(req->arena && "parameters are read before the arena is stolen");
    router_params_t *p = arena_calloc(req->arena, 1, sizeof(*p));
    if (req->query)
        params_parse(req, p, req->query, strlen(req->query));
    const char *ct = api_req_header(req, "Content-Type");
    if ((req->method == API_POST || req->method == API_PUT) && ct &&
        strncasecmp(ct, "application/x-www-form-urlencoded", 33) == 0) {
        size_t len;
        const uint8_t *body = api_req_body(req, &len);
        params_parse(req, p, (const char *)body, len);
    }
    req->params_ = p;
    return p;
}

const char *api_req_param(api_req_t *req, const char *name)
{
    router_params_t *p = router_params(req);
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->names[i], name) == 0)
            return p->values[i];
    return NULL;
}

size_t api_req_params(api_req_t *req, const char *name, const char ***out)
{
    router_params_t *p = router_params(req);
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++)
        n += strcmp(p->names[i], name) == 0;
    const char **v = arena_alloc(req->arena, (n ? n : 1) * sizeof(*v));
    n = 0;
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->names[i], name) == 0)
            v[n++] = p->values[i];
    *out = v;
    return n;
}

struct event_base *api_req_base(api_req_t *req)
{
    return evhttp_connection_get_base(evhttp_request_get_connection(req->ev));
}

/* --- answering ---------------------------------------------------------------------------------- */

void api__req_finish(api_req_t *req, int code)
{
    if (req->outcome_)
        *req->outcome_ = ROUTER_REPLIED;
    if (req->parked) {
        struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
        if (evcon)
            evhttp_connection_set_closecb(evcon, NULL, NULL);
    }
    double secs = (double)(clock_mono_ns() - req->start_ns) / 1e9;
    api__server_observe(req->srv, req->route, code, secs);
    arena_destroy(req->arena);
    free(req);
}

void api_reply_header(api_req_t *req, const char *name, const char *value)
{
    evhttp_add_header(evhttp_request_get_output_headers(req->ev), name, value);
}

/* A refusal of what a client sent (bad input, auth, limits, overload) is logged at warn with the
 * client's address, so an operator sees abuse and misconfigured senders; at most one line a
 * second per server (api__server_may_log), the lines it held back counted in the next. */
static void router_log_refusal(api_req_t *req, int code, const void *body, size_t len)
{
    switch (code) {
    case 400:
    case 401:
    case 403:
    case 413:
    case 415:
    case 422:
    case 429:
    case 503: break;
    default: return;
    }
    if (req->path && strcmp(req->path, "/-/ready") == 0)
        return; /* "not ready yet" answers a question; it refuses nothing */
    uint64_t held = 0;
    if (!api__server_may_log(req->srv, &held))
        return;
    const char *peer = api_req_peer(req);
    size_t n = 0; /* the reason's first line */
    while (n < len && n < 300 && ((const char *)body)[n] != '\n')
        n++;
    char reason[304];
    memcpy(reason, body ? body : "", n);
    reason[n] = 0;
    log_warn("http", "request refused", LF_I("status", code), LF_S("client", peer ? peer : "unknown"),
             LF_S("path", req->path ? req->path : ""), LF_S("reason", reason), LF_I("similar_lines_held", held));
}

void api_reply(api_req_t *req, int code, const char *content_type, const void *body, size_t len)
{
    assert(!req->replied);
    req->replied = true;
    router_log_refusal(req, code, body, len);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req->ev);
    if (content_type)
        evhttp_add_header(h, "Content-Type", content_type);
    struct evbuffer *out = evbuffer_new();
    if (out && len && req->method != API_HEAD)
        evbuffer_add(out, body, len);
    const char *reason = NULL;
    switch (code) {
    case 200: reason = "OK"; break;
    case 202: reason = "Accepted"; break;
    case 204: reason = "No Content"; break;
    case 304: reason = "Not Modified"; break;
    case 400: reason = "Bad Request"; break;
    case 404: reason = "Not Found"; break;
    case 405: reason = "Method Not Allowed"; break;
    case 413: reason = "Request Entity Too Large"; break;
    case 415: reason = "Unsupported Media Type"; break;
    case 422: reason = "Unprocessable Entity"; break;
    case 429: reason = "Too Many Requests"; break;
    case 500: reason = "Internal Server Error"; break;
    case 503: reason = "Service Unavailable"; break;
    default: reason = NULL;
    }
    evhttp_send_reply(req->ev, code, reason, out);
    if (out)
        evbuffer_free(out);
    api__req_finish(req, code);
}

void api_reply_buf(api_req_t *req, int code, const char *content_type, const buf_t *body)
{
    api_reply(req, code, content_type, body->data, body->len);
}

void api_reply_text(api_req_t *req, int code, const char *fmt, ...)
{
    buf_t b = BUF_INIT;
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    api_reply(req, code, "text/plain; charset=utf-8", b.data, b.len);
    buf_free(&b);
}

void api_reply_prom_success(api_req_t *req, const char *data_json, size_t len)
{
    buf_t b = BUF_INIT;
    buf_reserve(&b, len + 32);
    buf_puts(&b, "{\"status\":\"success\",\"data\":");
    buf_append(&b, data_json, len);
    buf_putc(&b, '}');
    api_reply(req, 200, "application/json", b.data, b.len);
    buf_free(&b);
}

int api_error_status(api_error_kind_t kind)
{
    switch (kind) {
    case API_ERR_BAD_DATA: return 400;
    case API_ERR_EXECUTION: return 422;
    case API_ERR_CANCELED: return 503;
    case API_ERR_TIMEOUT: return 503;
    case API_ERR_INTERNAL: return 500;
    case API_ERR_NOT_FOUND: return 404;
    case API_ERR_UNAVAILABLE: return 503;
    }
    return 500;
}

const char *api_error_type(api_error_kind_t kind)
{
    switch (kind) {
    case API_ERR_BAD_DATA: return "bad_data";
    case API_ERR_EXECUTION: return "execution";
    case API_ERR_CANCELED: return "canceled";
    case API_ERR_TIMEOUT: return "timeout";
    case API_ERR_INTERNAL: return "internal";
    case API_ERR_NOT_FOUND: return "not_found";
    case API_ERR_UNAVAILABLE: return "unavailable";
    }
    return "internal";
}

void api_reply_prom_error(api_req_t *req, api_error_kind_t kind, const char *fmt, ...)
{
    buf_t msg = BUF_INIT, b = BUF_INIT;
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&msg, fmt, ap);
    va_end(ap);
    buf_puts(&b, "{\"status\":\"error\",\"errorType\":");
    const char *t = api_error_type(kind);
    buf_put_json_string(&b, t, strlen(t));
    buf_puts(&b, ",\"error\":");
    buf_put_json_string(&b, msg.data ? msg.data : "", msg.len);
    buf_putc(&b, '}');
    api_reply(req, api_error_status(kind), "application/json", b.data, b.len);
    buf_free(&msg);
    buf_free(&b);
}

typedef struct router_drain {
    api_req_t *req;
    void (*drained)(api_req_t *req, void *ud);
    void *ud;
    struct router_drain *next, **pprev; /* the request's list of outstanding drains */
} router_drain_t;

/* The client went away while its request was parked: let the owner forget it, then free it.
 * evhttp frees its own request object after this callback. */
static void router_park_closed(struct evhttp_connection *evcon, void *arg)
{
    api_req_t *req = arg;
    (void)evcon;
    if (req->park_cb_)
        req->park_cb_(req, req->park_ud_);
    /* libevent 2.1 detaches an unfinished request from a connection that failed (EOF, timeout)
     * and leaves it to its owner ("remove it so that it will not be freed"); when the connection
     * is freed for other reasons the request is still attached and libevent frees it. */
    if (!evhttp_request_get_connection(req->ev))
        evhttp_request_free(req->ev);
    /* Drain callbacks of chunks still being written will never run now. */
    while (req->drains_) {
        struct router_drain *d = req->drains_;
        req->drains_ = d->next;
        free(d);
    }
    req->parked = false; /* the connection is gone: nothing to unhook */
    double secs = (double)(clock_mono_ns() - req->start_ns) / 1e9;
    api__server_observe(req->srv, req->route, 499, secs);
    arena_destroy(req->arena);
    free(req);
}

void api_req_park(api_req_t *req, void (*on_close)(api_req_t *req, void *ud), void *ud)
{
    assert(!req->replied);
    req->parked = true;
    if (req->outcome_)
        *req->outcome_ = ROUTER_PARKED;
    req->park_cb_ = on_close;
    req->park_ud_ = ud;
    struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
    if (evcon)
        evhttp_connection_set_closecb(evcon, router_park_closed, req);
}

arena_t *api_req_arena_steal(api_req_t *req)
{
    arena_t *a = req->arena;
    assert(a && "the arena was stolen already");
    req->arena = NULL;
    return a;
}

/* --- streaming ------------------------------------------------------------------------------------ */

void api_reply_stream_start(api_req_t *req, int code, const char *content_type,
                            void (*on_close)(api_req_t *req, void *ud), void *ud)
{
    assert(!req->replied && !req->streaming_);
    if (content_type)
        evhttp_add_header(evhttp_request_get_output_headers(req->ev), "Content-Type", content_type);
    api_req_park(req, on_close, ud);
    req->streaming_ = true;
    req->stream_code_ = code;
    evhttp_send_reply_start(req->ev, code, code == 200 ? "OK" : NULL);
}

static void router_chunk_written(struct evhttp_connection *evcon, void *arg)
{
    router_drain_t *d = arg;
    api_req_t *req = d->req;
    void (*fn)(api_req_t *, void *) = d->drained;
    void *ud = d->ud;
    (void)evcon;
    *d->pprev = d->next;
    if (d->next)
        d->next->pprev = d->pprev;
    free(d);
    req->stream_pending_cbs_--;
    if (fn)
        fn(req, ud);
}

int api_reply_stream_chunk(api_req_t *req, const void *data, size_t len, void (*drained)(api_req_t *req, void *ud),
                           void *ud)
{
    assert(req->streaming_);
    struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
    if (!evcon)
        return -1;
    struct evbuffer *b = evbuffer_new();
    if (!b)
        return -1;
    evbuffer_add(b, data, len);
    router_drain_t *d = NULL;
    if (drained) {
        d = malloc(sizeof(*d));
        if (!d) {
            evbuffer_free(b);
            return -1;
        }
        d->req = req;
        d->drained = drained;
        d->ud = ud;
        d->next = req->drains_;
        d->pprev = &req->drains_;
        if (d->next)
            d->next->pprev = &d->next;
        req->drains_ = d;
        req->stream_pending_cbs_++;
        evhttp_send_reply_chunk_with_cb(req->ev, b, router_chunk_written, d);
    } else {
        evhttp_send_reply_chunk(req->ev, b);
    }
    evbuffer_free(b);
    return 0;
}

size_t api_reply_stream_pending(api_req_t *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req->ev);
    if (!evcon)
        return 0;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(evcon);
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

void api_reply_stream_end(api_req_t *req)
{
    assert(req->streaming_ && !req->replied);
    req->replied = true;
    evhttp_send_reply_end(req->ev);
    api__req_finish(req, req->stream_code_);
}
