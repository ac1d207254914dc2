/*
 * router + request — the one place HTTP requests are dispatched and answered.
 *
 * Handlers register once, before the server starts, with a method mask and a path (exact, or a
 * prefix when it ends in '*'). A request is matched by method + path; the longest matching path
 * wins; a path that matches with another method gets 405. Each request gets an arena freed when
 * the reply is sent. Handlers answer with one of the api_reply_* calls — or park the request
 * (long-polls, streams) and answer later from the same worker thread.
 *
 * Error mapping lives here too: api_reply_prom_error() turns the Prometheus API error kinds into
 * their status codes and JSON envelope; api_reply_text_error() is the plain-text style that the
 * Pushgateway API uses.
 */
#ifndef SLUICE_API_ROUTER_H
#define SLUICE_API_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/util/arena.h"
#include "internal/util/buf.h"

struct evhttp_request;
struct event_base;
struct evbuffer;

enum {
    API_GET = 1 << 0,
    API_POST = 1 << 1,
    API_PUT = 1 << 2,
    API_DELETE = 1 << 3,
    API_HEAD = 1 << 4,
    API_OPTIONS = 1 << 5,
    API_PATCH = 1 << 6,
};

typedef enum {
    API_ERR_BAD_DATA,    /* 400 */
    API_ERR_EXECUTION,   /* 422 */
    API_ERR_CANCELED,    /* 503 */
    API_ERR_TIMEOUT,     /* 503 */
    API_ERR_INTERNAL,    /* 500 */
    API_ERR_NOT_FOUND,   /* 404 */
    API_ERR_UNAVAILABLE, /* 503 */
} api_error_kind_t;

typedef struct api_req api_req_t;
typedef void (*api_handler_fn)(api_req_t *req, void *ud);
typedef struct api_server api_server_t; /* api/server.h */
typedef struct api_router api_router_t; /* a server's route table */

#define API_MAX_ROUTES 128

struct api_req {
    struct evhttp_request *ev;
    arena_t *arena;       /* freed when the reply is sent */
    int method;           /* one API_* bit */
    const char *path;     /* percent-decoded path, without the query */
    const char *raw_path; /* path as sent (still percent-encoded), without the query */
    const char *query;    /* raw query string or NULL */
    api_server_t *srv;    /* the server it arrived on */
    int route;            /* index of the matched route (for metrics) */
    int worker;           /* worker index */
    uint64_t start_ns;
    bool replied;
    bool parked;
    /* private */
    void *params_; /* lazily parsed query + form parameters */
    uint8_t *body_;
    size_t body_len_;
    bool body_read_;
    void (*park_cb_)(api_req_t *req, void *ud);
    void *park_ud_;
    int *outcome_; /* set while the handler runs: replied or parked */
    bool streaming_;
    int stream_code_;
    int stream_pending_cbs_;
    struct router_drain *drains_; /* chunks written with a drain callback, not yet drained */
};

/* Registers a route on srv. `path` ending in '*' is a prefix route. `name` labels /metrics
 * ("push", "query_range", ...). Not thread-safe: call before api_server_start. Returns the route
 * index. Every API module's api_X_register_routes(x, srv) calls it. */
int api_route_add(api_server_t *srv, int methods, const char *path, const char *name, api_handler_fn fn, void *ud);
/* A route table's size and the name of route i ("other" out of range), for /metrics. */
int api_router_count(const api_router_t *r);
const char *api_router_name(const api_router_t *r, int route);
/* Dispatches a request (called by the server for every request). */
void api_router_dispatch(const api_router_t *r, api_req_t *req);
/* The server makes and frees its table. */
api_router_t *api__router_new(void);
void api__router_free(api_router_t *r);

/* --- reading the request --------------------------------------------------------------------- */
const char *api_req_header(api_req_t *req, const char *name);
/* The client's address ("127.0.0.1", "::1"), or NULL when unknown. */
const char *api_req_peer(api_req_t *req);
/* A parameter from the query string or, for POST with application/x-www-form-urlencoded, the
 * body (both, like Go's r.FormValue). NULL when absent. Repeated parameters: api_req_params. */
const char *api_req_param(api_req_t *req, const char *name);
/* All values of a repeated parameter (e.g. match[]); returns count, *out arena-owned. */
size_t api_req_params(api_req_t *req, const char *name, const char ***out);
/* The whole body, contiguous, arena-owned (NUL-terminated past len). */
const uint8_t *api_req_body(api_req_t *req, size_t *len);
/* The whole body, moved (not copied) into a new evbuffer the caller frees: for a body read on
 * another thread, after the request may be gone. NULL when out of memory. The request's own body
 * is then empty; call before api_req_body, or not at all. */
struct evbuffer *api_req_body_steal(api_req_t *req);
struct event_base *api_req_base(api_req_t *req);

/* --- answering --------------------------------------------------------------------------------- */
void api_reply(api_req_t *req, int code, const char *content_type, const void *body, size_t len);
void api_reply_buf(api_req_t *req, int code, const char *content_type, const buf_t *body);
void api_reply_text(api_req_t *req, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Adds a response header; call before api_reply*. */
void api_reply_header(api_req_t *req, const char *name, const char *value);
/* {"status":"success","data":<data_json>} */
void api_reply_prom_success(api_req_t *req, const char *data_json, size_t len);
/* {"status":"error","errorType":"bad_data","error":"..."} with the matching status code. */
void api_reply_prom_error(api_req_t *req, api_error_kind_t kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int api_error_status(api_error_kind_t kind);
const char *api_error_type(api_error_kind_t kind);

/* Parks the request: the handler returns without replying and answers later on this worker's
 * event base. on_close (may be NULL) is called if the client goes away first; after it, req is
 * gone (the router frees it and libevent's request; on_close must not). */
void api_req_park(api_req_t *req, void (*on_close)(api_req_t *req, void *ud), void *ud);
/* Hands the request's arena (its path, query, body and parameters live there) to the caller, who
 * frees it; the request no longer does. For work that outlives what the request may: a parked
 * request is freed when its client goes away. Read what is needed (api_req_body, api_req_param)
 * first: the request has no arena left to read into. A reply still reads req->path (the refusal
 * log): free the arena only after replying, or once the request is gone. */
arena_t *api_req_arena_steal(api_req_t *req);

/* Streaming replies (chunked transfer encoding: SSE, streamed remote read). start sends the status
 * line and headers; the request then counts as parked (on_close as in api_req_park) until
 * api_reply_stream_end. chunk returns 0, or -1 if the client is gone. Flow control: `drained`
 * (may be NULL) is called once the chunk has been handed to the kernel, so a producer can write
 * the next piece only then and memory stays flat for a slow reader; api_reply_stream_pending
 * tells how many bytes still wait in user space. All calls on the request's worker thread. */
void api_reply_stream_start(api_req_t *req, int code, const char *content_type,
                            void (*on_close)(api_req_t *req, void *ud), void *ud);
int api_reply_stream_chunk(api_req_t *req, const void *data, size_t len, void (*drained)(api_req_t *req, void *ud),
                           void *ud);
size_t api_reply_stream_pending(api_req_t *req);
void api_reply_stream_end(api_req_t *req);

/* Internal to api/: frees the request after the reply. */
void api__req_finish(api_req_t *req, int code);

#endif
