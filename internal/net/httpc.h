/*
 * httpc — the one small blocking HTTP/1.1 client sluice uses for its outgoing calls:
 *
 *   api/forward            remote write to a distributed TSDB (auth headers, Retry-After, 4xx body)
 *   internal/remote/read_client  remote read from a distributed TSDB (fall-through)
 *   internal/rules/notifier  alert notifications to Alertmanager (JSON body, any 2xx is success)
 *
 * It sits below api/ so that internal/ modules can use it (internal/ never includes api/).
 *
 * One httpc_conn_t is one keep-alive connection to one host, used by one thread at a time. A
 * request on a kept connection that the peer has closed meanwhile is retried once on a fresh
 * connection (only when no byte of a response had arrived, so a request is never duplicated by
 * the client itself beyond what a dropped connection already implies).
 *
 * What a caller controls per request: extra headers (auth, Content-Type, ...), the body, one
 * timeout that bounds connect, send and receive together, and how much of the response body is
 * kept (the rest is read and dropped, so a chatty peer costs no memory and the connection stays
 * usable). What it gets back: the status, Retry-After, Content-Type and the kept body.
 *
 * https:// URLs speak TLS (OpenSSL, internal/net/tls): an httpc_tls_t made once from
 * httpc_tls_options_t (CA file, client certificate and key for mTLS, server name,
 * insecure-skip-verify) is shared by every connection to that target; without one, an https://
 * connection trusts the system's CA store and verifies the URL's host. The server's certificate
 * is verified by default, including its name; a failed handshake is reported as
 * "<host:port>: TLS handshake failed: certificate verify failed (unable to get local issuer
 * certificate)" and the like.
 */
#ifndef SLUICE_NET_HTTPC_H
#define SLUICE_NET_HTTPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal/net/tls.h"
#include "internal/util/buf.h"

typedef struct {
    bool tls; /* https:// */
    char host[256];
    char port[8];
    char path[2048];    /* path and query, starting with '/' */
    char hostport[272]; /* for the Host header */
} httpc_url_t;

/* Parses http[s]://host[:port][/path] (default port 80 or 443). Returns 0, or -1 with a message. */
int httpc_url_parse(const char *url, httpc_url_t *out, char *err, size_t errlen);

/* Client TLS settings of one target (fields in internal/net/tls.h: ca_file, cert_file, key_file,
 * server_name, insecure_skip_verify). Callers fill it from their flags, e.g.
 * --remote-write.tls-ca-file, and keep one httpc_tls_t per target. */
typedef tls_client_options_t httpc_tls_options_t;
typedef struct httpc_tls httpc_tls_t;

/* Loads the files now (so a bad path fails at startup). NULL with a message. */
httpc_tls_t *httpc_tls_new(const httpc_tls_options_t *o, char *err, size_t errlen);
/* After every connection made with it is freed. NULL is fine. */
void httpc_tls_free(httpc_tls_t *t);

/* The TLS keys a target spec (--remote-write.url, --remote-read.url) may carry, each overriding
 * the flag default (--remote-write.tls-*, --remote-read.tls-*) for that one target:
 *   tls-ca-file=<path>  tls-cert-file=<path>  tls-key-file=<path>  tls-server-name=<name>
 *                       (an empty value overrides with "not set": tls-cert-file= drops the
 *                       default client certificate)
 *   tls-insecure-skip-verify=true|false
 * Both spec parsers hand each key=value to httpc_tls_spec_parse and, once the spec is read, make
 * the target's httpc_tls_t with httpc_tls_spec_build, so the keys mean the same in both. */
typedef struct {
    char *ca_file, *cert_file, *key_file, *server_name; /* owned; NULL = not given */
    int insecure_skip_verify;                           /* -1 = not given, else 0 or 1 */
} httpc_tls_spec_t;

#define HTTPC_TLS_SPEC_INIT ((httpc_tls_spec_t){NULL, NULL, NULL, NULL, -1})

/* Takes one option (key of kl bytes, value of vl bytes). Returns 1 when it is a tls-* key and was
 * taken, 0 when it is not a TLS key (nothing changed), -1 with a message for a bad value or OOM. */
int httpc_tls_spec_parse(httpc_tls_spec_t *s, const char *key, size_t kl, const char *v, size_t vl, char *err,
                         size_t errlen);
/* The target's TLS: for an https:// URL, *out is made from the spec over defaults (NULL = none:
 * system store, verification on), loading the files now so a bad path stops start-up, and
 * *insecure tells whether verification ended up off (callers warn about it). For an http:// URL
 * *out is NULL, and a tls-* key in the spec is an error. 0, or -1 with a message. */
int httpc_tls_spec_build(const httpc_tls_spec_t *s, const httpc_tls_options_t *defaults, const httpc_url_t *u,
                         httpc_tls_t **out, bool *insecure, char *err, size_t errlen);
void httpc_tls_spec_free(httpc_tls_spec_t *s);

/* The auth and header options of the same specs: header=Name:value, basic-auth-username=,
 * basic-auth-password=, basic-auth-password-file=, bearer-token-file=. Parsed key by key like the
 * TLS options; httpc_auth_spec_build checks the combination and writes the fixed header lines.
 * A bearer token file is re-read for every request (tokens rotate): it stays in bearer_file. */
typedef struct {
    buf_t headers; /* "Name: value\r\n" lines from header= */
    char *user, *pass, *pass_file;
    char *bearer_file; /* NULL = none; the caller reads it per request (httpc_read_secret_file) */
} httpc_auth_spec_t;

#define HTTPC_AUTH_SPEC_INIT ((httpc_auth_spec_t){BUF_INIT, NULL, NULL, NULL, NULL})

/* 1 when key is one of the options above and was taken, 0 when it is not, -1 with a message. */
int httpc_auth_spec_parse(httpc_auth_spec_t *s, const char *key, size_t kl, const char *v, size_t vl, char *err,
                          size_t errlen);
/* Appends the header lines (headers, then Authorization: Basic) to out. 0, or -1 with a message
 * (a password without user, basic auth together with a bearer token, an unreadable file). */
int httpc_auth_spec_build(const httpc_auth_spec_t *s, buf_t *out, char *err, size_t errlen);
void httpc_auth_spec_free(httpc_auth_spec_t *s);
/* Reads a password or token file (at most 64 KiB; trailing newlines and blanks dropped) into out. */
int httpc_read_secret_file(const char *path, buf_t *out, char *err, size_t errlen);

typedef struct httpc_conn httpc_conn_t;

/* NULL on OOM. The URL is copied. An https:// URL uses the system CA store (httpc_conn_new_tls
 * for other settings). */
httpc_conn_t *httpc_conn_new(const httpc_url_t *u);
/* tls (may be NULL = defaults) is used for https:// URLs and must outlive the connection. */
httpc_conn_t *httpc_conn_new_tls(const httpc_url_t *u, httpc_tls_t *tls);
void httpc_conn_free(httpc_conn_t *c);

typedef struct {
    int status;
    int64_t retry_after_ms; /* Retry-After in ms (delta-seconds or HTTP-date), -1 if absent */
    buf_t body;             /* up to max_body bytes of the body (the rest is read and dropped) */
    char content_type[128];
} httpc_response_t;

void httpc_response_init(httpc_response_t *r);
void httpc_response_free(httpc_response_t *r);

/* POSTs body to the connection's URL path. headers: extra "Name: value\r\n" lines (may be NULL;
 * Host, User-Agent and Content-Length are always sent). timeout_ms <= 0 means 30 s. resp (from
 * httpc_response_init, owned by the caller) is overwritten; it keeps at most max_body bytes of the
 * body, NUL-terminated when any were kept. Returns 0 with resp filled (any status), or -1 with a
 * message in err for a network error or timeout (the connection is closed then). */
int httpc_post(httpc_conn_t *c, const char *headers, const void *body, size_t len, int64_t timeout_ms, size_t max_body,
               httpc_response_t *resp, char *err, size_t errlen);

/* Standard base64 (RFC 4648, with padding), for basic auth. */
void httpc_base64(buf_t *out, const void *data, size_t len);

#endif
