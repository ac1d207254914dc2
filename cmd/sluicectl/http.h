/*
 * sluicectl http — a small blocking HTTP/1.1 client for the command-line tool: one request per
 * connection (Connection: close), bodies by Content-Length, chunked transfer encoding or end of
 * stream. Streaming responses (SSE) are handed to a callback piece by piece as they arrive.
 * Plain http:// only; sluice is reached on a trusted network or through a TLS proxy.
 */
#ifndef SLUICE_SLUICECTL_HTTP_H
#define SLUICE_SLUICECTL_HTTP_H

#include <stddef.h>

#include "internal/util/buf.h"

typedef struct {
    char host[260];
    char port[16];
    char prefix[512]; /* path prefix from the URL, without a trailing '/' */
} ctl_url_t;

/* Parses http://host[:port][/prefix]. 0 or -1 + err. */
int ctl_url_parse(const char *url, ctl_url_t *out, char *err, size_t errlen);

/* Called with each piece of a body as it arrives; return non-zero to stop reading. */
typedef int (*ctl_http_sink_fn)(const char *data, size_t len, void *ud);

typedef struct {
    const char *method;
    const char *path;         /* already percent-encoded, with query */
    const char *token;        /* NULL: no Authorization header */
    const char *content_type; /* for body */
    const char *body;
    size_t body_len;
    const char *extra_header; /* one "Name: value" line or NULL */
    ctl_http_sink_fn sink;    /* NULL: the body is collected into *body_out */
    void *sink_ud;
} ctl_http_req_t;

/* Performs the request. Returns the HTTP status, or -1 with err on a connection/protocol error. */
int ctl_http_do(const ctl_url_t *url, const ctl_http_req_t *req, buf_t *body_out, char *err, size_t errlen);

/* Appends s percent-encoded for use as one path segment. */
void ctl_url_escape(buf_t *out, const char *s);

#endif
