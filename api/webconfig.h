/*
 * webconfig — --web.config.file: the server's TLS and basic auth, in the YAML format of the
 * Prometheus exporter-toolkit (the same file works for Prometheus, the exporters and sluice):
 *
 *   tls_server_config:
 *     cert_file: server.crt            # relative paths are relative to the file's folder
 *     key_file: server.key
 *     client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default), RequestClientCert,
 *                                      # RequireAnyClientCert, VerifyClientCertIfGiven
 *     client_ca_file: ca.crt
 *     min_version: TLS12               # TLS10..TLS13, default TLS12
 *     max_version: TLS13
 *     prefer_server_cipher_suites: true  # accepted; OpenSSL's server preference is always on
 *   http_server_config:
 *     http2: false                     # accepted; sluice speaks HTTP/1.1 only
 *   basic_auth_users:
 *     alice: $2y$10$...                # bcrypt hashes ($2a$, $2b$, $2y$)
 *
 * Keys sluice does not implement (cipher_suites, curve_preferences, headers, ...) are errors,
 * not silently ignored: a security setting that seems set but is not would be worse.
 *
 * Basic auth: every request must carry `Authorization: Basic` credentials of a listed user;
 * bcrypt (libxcrypt's crypt_rn) checks the password and the result is compared in constant time.
 * bcrypt is slow on purpose (tens of ms at cost 10), so a successful check is remembered for
 * WEBCONFIG_CACHE_TTL_MS under a SHA-256 of user, password and hash (never the password itself);
 * an unknown user costs the same bcrypt as a known one, so timing does not tell which users exist.
 *
 * A loaded config is immutable and reference counted: api/server swaps in a new one on reload
 * while requests still hold the old one.
 */
#ifndef SLUICE_API_WEBCONFIG_H
#define SLUICE_API_WEBCONFIG_H

#include <stdbool.h>
#include <stddef.h>

struct ssl_ctx_st;

typedef struct api_webconfig api_webconfig_t;

/* Reads and checks the file (certificates and keys are loaded now). NULL with a message. */
api_webconfig_t *api_webconfig_load(const char *path, char *err, size_t errlen);
void api_webconfig_ref(api_webconfig_t *wc);
void api_webconfig_unref(api_webconfig_t *wc);

/* The server TLS context, or NULL when the file configures no TLS (plain HTTP). */
struct ssl_ctx_st *api_webconfig_tls(const api_webconfig_t *wc);
/* Whether requests need basic auth. */
bool api_webconfig_has_users(const api_webconfig_t *wc);
/* Whether an Authorization header value (may be NULL) holds valid credentials. Thread-safe. */
bool api_webconfig_check_basic(api_webconfig_t *wc, const char *authorization);

#endif
