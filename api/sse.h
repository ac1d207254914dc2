/*
 * api/sse — the plumbing shared by the endpoints that hold requests open on their worker: the
 * control long-polls and change stream (api/control) and the flow stream (api/flow).
 *
 * Lists. Every worker keeps its parked requests and stream subscribers in intrusive doubly linked
 * lists (an api_sse_link_t inside the caller's struct; API_SSE_OF gets the struct back). A list is
 * touched only by its worker's thread, so there are no locks; removing the node being visited is
 * fine when the loop saved `next` first.
 *
 * Server-Sent Events. A stream starts with status 200, `Content-Type: text/event-stream;
 * charset=utf-8`, `Cache-Control: no-store` and `X-Accel-Buffering: no` (so nginx does not buffer
 * it), then a first chunk with the reconnect delay for browsers (`retry: N`) and an optional
 * comment — a first byte for proxies. Events are written as
 *
 *   id: <id>           (only when id > 0: what a client sends back as Last-Event-ID)
 *   event: <name>
 *   data: <one line>   (callers pass JSON, which has no raw newline)
 *   <blank line>
 *
 * and `: keepalive` comments keep idle connections from being cut by proxies. A reconnecting
 * client's resume point is the `Last-Event-ID` header, or `?last_event_id=` for clients that
 * cannot set headers.
 *
 * Shutdown. api_sse_close_workers runs a caller's closer on every worker (answer parked requests,
 * end streams) and returns once each worker has run it and had a short pause to flush what it
 * queued — bounded, in case a worker is wedged.
 *
 * All functions taking an api_req_t run on that request's worker thread.
 */
#ifndef SLUICE_API_SSE_H
#define SLUICE_API_SSE_H

#include <stddef.h>
#include <stdint.h>

#include "api/router.h"
#include "api/server.h"

/* ---- per-worker lists ----------------------------------------------------------------------- */

typedef struct api_sse_link {
    struct api_sse_link *prev, *next;
} api_sse_link_t;

typedef struct {
    api_sse_link_t *head;
} api_sse_list_t;

/* The struct of type `type` whose member `member` is the link `l`. */
#define API_SSE_OF(l, type, member) ((type *)(void *)((char *)(l)-offsetof(type, member)))

/* Adds n (not on any list) at the front of l. */
void api_sse_list_push(api_sse_list_t *l, api_sse_link_t *n);
/* Takes n off l; n must be on l or on no list (then nothing happens). */
void api_sse_list_remove(api_sse_list_t *l, api_sse_link_t *n);

/* ---- event streams -------------------------------------------------------------------------- */

/* Starts an SSE reply (headers above) and sends `retry: retry_ms` and, if comment is not NULL,
 * `: comment`. on_close/ud as in api_reply_stream_start. */
void api_sse_start(api_req_t *req, int retry_ms, const char *comment, void (*on_close)(api_req_t *req, void *ud),
                   void *ud);

/* Writes one event (id omitted when 0). data is one line of len bytes. Returns 0, or -1 if the
 * client is gone (its close callback runs). */
int api_sse_send(api_req_t *req, uint64_t id, const char *event, const char *data, size_t len);

/* Writes a `: keepalive` comment. */
void api_sse_keepalive(api_req_t *req);

/* The client's resume point: Last-Event-ID, else ?last_event_id=. Returns 1 with *after set, 0 when
 * there is none (or it is empty), -1 when it is not a non-negative integer. */
int api_sse_last_event_id(api_req_t *req, uint64_t *after);

/* ---- shutdown ------------------------------------------------------------------------------- */

/* Runs close(ud, worker) on each of the server's workers and waits until all have run it, plus a
 * 20 ms pause on each loop so the answers they queued are written before the server stops the
 * loops; at most 5 s. Call from the server's on_shutdown hook (not from a worker). */
void api_sse_close_workers(api_server_t *srv, void (*close)(void *ud, int worker), void *ud);

#endif
