/*
 * tls — OpenSSL contexts for sluice's TLS, both ends:
 *
 *   client  internal/net/httpc (remote write, remote read, Alertmanager): tls_client_ctx_new
 *   server  api/server through api/webconfig (--web.config.file):        tls_server_ctx_new
 *
 * A context holds what does not change per connection (trust store, own certificate and key,
 * protocol versions, how the peer's certificate is checked) and is shared by every connection
 * made from it; OpenSSL's SSL_CTX is reference counted and thread-safe for that use, so a context
 * can be replaced (reload) while connections made from the old one are still open.
 *
 * Defaults follow Go's crypto/tls, which the Prometheus ecosystem's peers use: TLS 1.2 at least,
 * peer certificates verified against the CA file (or the system store), the server's name checked
 * against the certificate's SANs (an IP address against IP SANs).
 */
#ifndef SLUICE_NET_TLS_H
#define SLUICE_NET_TLS_H

#include <stdbool.h>
#include <stddef.h>

struct ssl_ctx_st; /* OpenSSL's SSL_CTX */
struct ssl_st;     /* OpenSSL's SSL */

/* Client side: what a remote-write or remote-read target (or an Alertmanager) is reached with.
 * Every string may be NULL or "" (= not set). Only read during tls_client_ctx_new. */
typedef struct {
    const char *ca_file;       /* PEM bundle of CAs trusted for the server; unset = the system store */
    const char *cert_file;     /* client certificate (PEM) presented for mTLS; needs key_file */
    const char *key_file;      /* its private key (PEM) */
    const char *server_name;   /* SNI and the name verified; unset = the URL's host */
    bool insecure_skip_verify; /* accept any server certificate (testing only) */
} tls_client_options_t;

/* A client context, or NULL with a message (unreadable CA file, key not matching the cert...). */
struct ssl_ctx_st *tls_client_ctx_new(const tls_client_options_t *o, char *err, size_t errlen);

/* Prometheus exporter-toolkit's client_auth_type values, same meaning as Go's tls.ClientAuthType. */
typedef enum {
    TLS_CLIENT_AUTH_NONE,               /* NoClientCert */
    TLS_CLIENT_AUTH_REQUEST,            /* RequestClientCert: asked for, not verified, not required */
    TLS_CLIENT_AUTH_REQUIRE_ANY,        /* RequireAnyClientCert: required, not verified */
    TLS_CLIENT_AUTH_VERIFY_IF_GIVEN,    /* VerifyClientCertIfGiven */
    TLS_CLIENT_AUTH_REQUIRE_AND_VERIFY, /* RequireAndVerifyClientCert */
} tls_client_auth_t;

/* Parses a client_auth_type name; -1 when unknown. */
int tls_client_auth_parse(const char *name, tls_client_auth_t *out);
/* Parses "TLS10".."TLS13" (exporter-toolkit's names) into OpenSSL's version numbers; -1 unknown. */
int tls_version_parse(const char *name, int *out);

typedef struct {
    const char *cert_file; /* server certificate chain (PEM), required */
    const char *key_file;  /* its private key (PEM), required */
    const char *client_ca_file;
    tls_client_auth_t client_auth;
    int min_version; /* OpenSSL TLS1_x_VERSION; 0 = TLS 1.2 */
    int max_version; /* 0 = the highest OpenSSL supports */
} tls_server_options_t;

/* A server context, or NULL with a message. Verifying client certificates needs client_ca_file. */
struct ssl_ctx_st *tls_server_ctx_new(const tls_server_options_t *o, char *err, size_t errlen);
void tls_ctx_free(struct ssl_ctx_st *ctx);

/* A client connection object from ctx for a server called `name` (the URL's host, or the
 * configured server name): SNI is sent for DNS names (not for IP addresses, RFC 6066 3), and
 * unless verify is false the certificate must name it (DNS SAN, or IP SAN for an address).
 * NULL with a message. The caller attaches the socket (SSL_set_fd) and owns the result. */
struct ssl_st *tls_client_ssl_new(struct ssl_ctx_st *ctx, const char *name, bool verify, char *err, size_t errlen);

/* Describes why the last operation on ssl failed: the certificate verification result when that
 * was the cause ("certificate verify failed (unable to get local issuer certificate)"), else the
 * first OpenSSL error queued ("wrong version number"), else the system error or "connection closed
 * by peer". Drains this thread's OpenSSL error queue. ssl_err is SSL_get_error's result. */
void tls_describe_error(struct ssl_st *ssl, int ssl_err, char *out, size_t outlen);

#endif
