/*
 * tls — OpenSSL client and server contexts (contract in tls.h). OpenSSL 3 initialises itself on
 * first use and is thread-safe for shared contexts, so there is no global setup here.
 */
#include "internal/net/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

/* The first queued OpenSSL error as text (its reason, e.g. "no such file"), then clears the
 * queue; "unknown error" when it is empty. */
static void tls_queue_error(char *out, size_t outlen)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (r)
        snprintf(out, outlen, "%s", r);
    else if (e)
        ERR_error_string_n(e, out, outlen);
    else
        snprintf(out, outlen, "unknown error");
    ERR_clear_error();
}

/* Loads the certificate chain and key; they must match. 0 or -1 with a message. */
static int tls_load_pair(SSL_CTX *ctx, const char *cert, const char *key, const char *what, char *err, size_t errlen)
{
    char why[256];
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        tls_queue_error(why, sizeof(why));
        snprintf(err, errlen, "cannot load %s certificate %s: %s", what, cert, why);
        return -1;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        if (ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH) {
            ERR_clear_error();
            snprintf(err, errlen, "%s key %s does not match certificate %s", what, key, cert);
            return -1;
        }
        tls_queue_error(why, sizeof(why));
        snprintf(err, errlen, "cannot load %s key %s: %s", what, key, why);
        return -1;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "%s key %s does not match certificate %s", what, key, cert);
        return -1;
    }
    return 0;
}

static bool tls_set(const char *s)
{
    return s && s[0];
}

/* Marks (as the SSL's app data) a connection whose server asked for a client certificate while
 * none is configured: with TLS 1.3 the refusal only shows later, as a failed write or an alert,
 * and the log should then say what is missing. */
static char tls_cert_requested;

static int tls_no_client_cert(SSL *ssl, X509 **x509, EVP_PKEY **pkey)
{
    SSL_set_app_data(ssl, &tls_cert_requested);
    return 0; /* go on without one: the server decides */
}

SSL_CTX *tls_client_ctx_new(const tls_client_options_t *o, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "cannot create a TLS context (out of memory)");
        return NULL;
    }
    char why[256];
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (tls_set(o->ca_file)) {
        if (SSL_CTX_load_verify_locations(ctx, o->ca_file, NULL) != 1) {
            tls_queue_error(why, sizeof(why));
            snprintf(err, errlen, "cannot load CA file %s: %s", o->ca_file, why);
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        tls_queue_error(why, sizeof(why));
        snprintf(err, errlen, "cannot load the system's CA certificates: %s", why);
        goto fail;
    }
    if (tls_set(o->cert_file) != tls_set(o->key_file)) {
        snprintf(err, errlen, "a TLS client certificate needs both a cert file and a key file");
        goto fail;
    }
    if (tls_set(o->cert_file) && tls_load_pair(ctx, o->cert_file, o->key_file, "client", err, errlen) != 0)
        goto fail;
    if (!tls_set(o->cert_file))
        SSL_CTX_set_client_cert_cb(ctx, tls_no_client_cert);
    SSL_CTX_set_verify(ctx, o->insecure_skip_verify ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

SSL *tls_client_ssl_new(SSL_CTX *ctx, const char *name, bool verify, char *err, size_t errlen)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl) {
        ERR_clear_error();
        snprintf(err, errlen, "cannot create a TLS connection (out of memory)");
        return NULL;
    }
    unsigned char addr[16];
    bool is_ip = inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
    int ok = 1;
    if (!is_ip)
        ok = SSL_set_tlsext_host_name(ssl, name);
    if (ok == 1 && verify)
        ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) : SSL_set1_host(ssl, name);
    if (ok != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "invalid TLS server name \"%s\"", name);
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

int tls_client_auth_parse(const char *name, tls_client_auth_t *out)
{
    static const struct {
        const char *name;
        tls_client_auth_t v;
    } tab[] = {
        {"NoClientCert", TLS_CLIENT_AUTH_NONE},
        {"RequestClientCert", TLS_CLIENT_AUTH_REQUEST},
        {"RequireAnyClientCert", TLS_CLIENT_AUTH_REQUIRE_ANY},
        {"VerifyClientCertIfGiven", TLS_CLIENT_AUTH_VERIFY_IF_GIVEN},
        {"RequireAndVerifyClientCert", TLS_CLIENT_AUTH_REQUIRE_AND_VERIFY},
    };
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
        if (strcmp(name, tab[i].name) == 0) {
            *out = tab[i].v;
            return 0;
        }
    return -1;
}

int tls_version_parse(const char *name, int *out)
{
    static const struct {
        const char *name;
        int v;
    } tab[] = {
        {"TLS10", TLS1_VERSION}, {"TLS11", TLS1_1_VERSION}, {"TLS12", TLS1_2_VERSION}, {"TLS13", TLS1_3_VERSION}};
    for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
        if (strcmp(name, tab[i].name) == 0) {
            *out = tab[i].v;
            return 0;
        }
    return -1;
}

/* RequestClientCert and RequireAnyClientCert ask for a certificate without checking it. */
static int tls_accept_any(int preverify_ok, X509_STORE_CTX *x)
{
    return 1;
}

SSL_CTX *tls_server_ctx_new(const tls_server_options_t *o, char *err, size_t errlen)
{
    if (!tls_set(o->cert_file) || !tls_set(o->key_file)) {
        snprintf(err, errlen, "TLS needs both cert_file and key_file");
        return NULL;
    }
    bool verifies =
        o->client_auth == TLS_CLIENT_AUTH_VERIFY_IF_GIVEN || o->client_auth == TLS_CLIENT_AUTH_REQUIRE_AND_VERIFY;
    if (verifies && !tls_set(o->client_ca_file)) {
        snprintf(err, errlen, "client_auth_type %s needs client_ca_file",
                 o->client_auth == TLS_CLIENT_AUTH_VERIFY_IF_GIVEN ? "VerifyClientCertIfGiven"
                                                                   : "RequireAndVerifyClientCert");
        return NULL;
    }
    if (tls_set(o->client_ca_file) && o->client_auth == TLS_CLIENT_AUTH_NONE) {
        /* exporter-toolkit refuses this too: a CA file that is never used is a mistake */
        snprintf(err, errlen, "client_ca_file is set but client_auth_type is NoClientCert");
        return NULL;
    }
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, errlen, "cannot create a TLS context (out of memory)");
        return NULL;
    }
    char why[256];
    int minv = o->min_version ? o->min_version : TLS1_2_VERSION;
    if (SSL_CTX_set_min_proto_version(ctx, minv) != 1 ||
        (o->max_version && SSL_CTX_set_max_proto_version(ctx, o->max_version) != 1) ||
        (o->max_version && o->max_version < minv)) {
        ERR_clear_error();
        snprintf(err, errlen, "invalid TLS version range");
        goto fail;
    }
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* no renegotiation (TLS 1.2): a client cannot make the server redo a handshake */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (tls_load_pair(ctx, o->cert_file, o->key_file, "server", err, errlen) != 0)
        goto fail;
    if (tls_set(o->client_ca_file)) {
        if (SSL_CTX_load_verify_locations(ctx, o->client_ca_file, NULL) != 1) {
            tls_queue_error(why, sizeof(why));
            snprintf(err, errlen, "cannot load client_ca_file %s: %s", o->client_ca_file, why);
            goto fail;
        }
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(o->client_ca_file);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names); /* the CAs the server names in its request */
        ERR_clear_error();
    }
    /* a session id context is needed when client certificates are verified and sessions resumed */
    static const unsigned char sid[] = "sluice";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof(sid) - 1);
    switch (o->client_auth) {
    case TLS_CLIENT_AUTH_NONE: SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL); break;
    case TLS_CLIENT_AUTH_REQUEST: SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, tls_accept_any); break;
    case TLS_CLIENT_AUTH_REQUIRE_ANY:
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, tls_accept_any);
        break;
    case TLS_CLIENT_AUTH_VERIFY_IF_GIVEN: SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL); break;
    case TLS_CLIENT_AUTH_REQUIRE_AND_VERIFY:
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
        break;
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

void tls_ctx_free(SSL_CTX *ctx)
{
    SSL_CTX_free(ctx);
}

void tls_describe_error(SSL *ssl, int ssl_err, char *out, size_t outlen)
{
    int saved_errno = errno;
    unsigned long e = ERR_peek_error();
    long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    if (e && ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED && vr != X509_V_OK)
        snprintf(out, outlen, "certificate verify failed (%s)", X509_verify_cert_error_string(vr));
    else if (e && ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) >= SSL_AD_REASON_OFFSET) {
        /* an alert the peer sent: say so plainly ("sslv3 alert bad certificate" is OpenSSL's text) */
        const char *r = ERR_reason_error_string(e);
        const char *a = r ? strstr(r, "alert ") : NULL;
        snprintf(out, outlen, "the peer refused the TLS connection: %s", a ? a + 6 : (r ? r : "alert"));
        ERR_clear_error();
    } else if (e)
        tls_queue_error(out, outlen);
    else if (ssl_err == SSL_ERROR_SYSCALL && saved_errno)
        snprintf(out, outlen, "%s", strerror(saved_errno));
    else if (ssl_err == SSL_ERROR_SYSCALL || ssl_err == SSL_ERROR_ZERO_RETURN)
        snprintf(out, outlen, "connection closed by peer");
    else
        snprintf(out, outlen, "TLS error %d", ssl_err);
    ERR_clear_error();
    if (ssl && SSL_get_app_data(ssl) == &tls_cert_requested) {
        size_t n = strlen(out);
        snprintf(out + n, outlen - n, " (the server asked for a client certificate and none is configured)");
    }
}
