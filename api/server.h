/*
 * server — the HTTP front: N worker threads, each with its own event_base and evhttp, all
 * accepting from one shared listening socket. Requests go to api/router.c.
 *
 * Limits enforced here: body size (413, by evhttp), header size, idle read/write timeout, a
 * deadline for a new connection to deliver its first request (so a client trickling one byte per
 * second cannot hold a connection slot), and a cap on open connections (beyond it requests get
 * 503 and the connection is closed). Connections are tracked through evhttp's bufferevent hook:
 * each worker keeps a reference to every connection's bufferevent and a sweep every 250 ms
 * notices the ones evhttp has let go, so the open-connection count is exact within that delay.
 *
 * --web.config.file adds TLS (with optional client certificates) to the listener and basic auth
 * in front of every route (server.c, api/webconfig.h).
 *
 * Shutdown: api_server_stop() stops accepting, waits (bounded) for in-flight and parked requests,
 * runs the shutdown hooks (which answer parked long-polls), then stops the loops.
 */
#ifndef SLUICE_API_SERVER_H
#define SLUICE_API_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/util/buf.h"

struct event_base;

typedef struct {
    const char *listen_address; /* ":9091", "127.0.0.1:0", "[::1]:9091" */
    int workers;                /* 0 = CPUs */
    int64_t max_connections;
    uint64_t max_body_bytes;
    uint64_t max_header_bytes;
    int64_t read_timeout_ms;
    const char *web_config_file; /* --web.config.file (api/webconfig.h): TLS, basic auth; NULL/"" = none */
} api_server_options_t;

typedef struct api_server api_server_t;

/* Binds and listens (so a bad address fails before anything else starts). NULL + err. */
api_server_t *api_server_create(const api_server_options_t *opt, char *err, size_t errlen);
/* Re-reads --web.config.file (SIGHUP): new certificates, client CA, users. The old config stays on
 * any error, and when the new one would turn TLS on or off (that needs a restart). 0 or -1 + err;
 * 0 without a file. */
int api_server_reload_web_config(api_server_t *s, char *err, size_t errlen);
/* Whether the listener speaks TLS. */
bool api_server_tls(const api_server_t *s);
/* The port actually bound (useful with :0). */
int api_server_port(const api_server_t *s);
/* Starts the worker threads. 0 or -1 + err. */
int api_server_start(api_server_t *s, char *err, size_t errlen);
/* Stops accepting, waits up to timeout_ms for in-flight requests, stops the workers, joins them. */
void api_server_stop(api_server_t *s, int64_t timeout_ms);
void api_server_destroy(api_server_t *s);
int api_server_worker_count(const api_server_t *s);
struct event_base *api_server_worker_base(api_server_t *s, int worker);
/* Runs fn(arg) on a worker's event loop thread (thread-safe). 0, or -1 (out of memory, or the
 * loops are gone: api_server_stop returned) with fn not called. A call the loops did not run
 * before they ended runs in api_server_stop, on its thread, after the workers are joined. */
int api_server_run_on(api_server_t *s, int worker, void (*fn)(void *arg), void *arg);
/* Appends sluice_http_* metrics in Prometheus text format. */
void api_server_write_metrics(api_server_t *s, buf_t *out);
/* Registers fn to run on shutdown before in-flight requests are waited for (e.g. to answer parked
 * long-polls). Call before api_server_start. */
void api_server_on_shutdown(api_server_t *s, void (*fn)(void *ud), void *ud);
/* Requests in flight (including parked ones). */
int64_t api_server_inflight(const api_server_t *s);

/* Records a finished request (used by the router). */
void api__server_observe(api_server_t *s, int route, int code, double seconds);
/* Rate limit of the refusal log: true at most once a second (per server); *held gets the number of
 * refusals not logged since the last true. */
bool api__server_may_log(api_server_t *s, uint64_t *held);
/* The server's route table (api_route_add fills it). */
struct api_router *api__server_router(api_server_t *s);
/* Appends what the non-blocking socket fd holds to buf, in large reads, at most
 * API_SERVER_READ_AHEAD bytes; returns the bytes read (0 at EOF, on an error or when nothing
 * waits: the caller's next read sees those as usual). */
#define API_SERVER_READ_AHEAD (1u << 20)
struct evbuffer;
size_t api__server_read_ahead(struct evbuffer *buf, int fd);

#endif
