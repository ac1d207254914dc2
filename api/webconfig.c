/*
 * webconfig — parsing of --web.config.file and the basic-auth check (format and rules in
 * webconfig.h). The YAML is read with libyaml's document API; the TLS context is built by
 * internal/net/tls; passwords are checked with libxcrypt's crypt_rn (bcrypt).
 */
#include "api/webconfig.h"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "internal/net/tls.h"
#include "internal/util/clock.h"

#define WEBCONFIG_MAX_USERS 1024
#define WEBCONFIG_CACHE_SLOTS 128
#define WEBCONFIG_CACHE_TTL_MS (10 * 60 * 1000)
#define WEBCONFIG_MAX_CREDENTIALS 1024 /* decoded "user:password" longer than this is refused */

typedef struct {
    char *name;
    char *hash;
} webconfig_user_t;

typedef struct {
    uint8_t key[SHA256_DIGEST_LENGTH];
    int64_t expires_ms; /* 0 = empty slot */
} webconfig_cache_slot_t;

struct api_webconfig {
    _Atomic int refs;
    struct ssl_ctx_st *tls;
    webconfig_user_t *users;
    size_t nusers;
    char *dummy_hash; /* checked for unknown users, so they cost the same time as known ones */
    pthread_mutex_t cache_mu;
    webconfig_cache_slot_t cache[WEBCONFIG_CACHE_SLOTS];
};

/* ---- loading --------------------------------------------------------------------------------- */

static const char *wc_scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* A bcrypt hash as crypt(3) writes it: $2a$/$2b$/$2y$, two-digit cost, 53 characters of salt and
 * digest. */
static bool wc_is_bcrypt(const char *h)
{
    if (strlen(h) != 60 || h[0] != '$' || h[1] != '2' || !strchr("aby", h[2]) || h[3] != '$' || h[6] != '$')
        return false;
    if (h[4] < '0' || h[4] > '3' || h[5] < '0' || h[5] > '9')
        return false;
    return strspn(h + 7, "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") == 53;
}

/* path made relative to the config file's folder (as exporter-toolkit does), malloc'd. */
static char *wc_path(const char *dir, const char *p)
{
    if (p[0] == '/' || !dir[0])
        return strdup(p);
    size_t n = strlen(dir) + strlen(p) + 2;
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%s/%s", dir, p);
    return out;
}

#define WC_FAIL(...)                                                                                                   \
    do {                                                                                                               \
        snprintf(err, errlen, __VA_ARGS__);                                                                            \
        goto fail;                                                                                                     \
    } while (0)

static int wc_parse_tls(yaml_document_t *doc, yaml_node_t *m, const char *dir, api_webconfig_t *wc, char *err,
                        size_t errlen)
{
    char *cert = NULL, *key = NULL, *ca = NULL;
    tls_server_options_t o = {.client_auth = TLS_CLIENT_AUTH_NONE};
    if (m->type != YAML_MAPPING_NODE)
        WC_FAIL("line %zu: tls_server_config must be a mapping", m->start_mark.line + 1);
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        const char *k = wc_scalar(kn), *v = wc_scalar(yaml_document_get_node(doc, p->value));
        size_t line = kn->start_mark.line + 1;
        static const char *const known[] = {"cert_file",
                                            "key_file",
                                            "client_ca_file",
                                            "client_auth_type",
                                            "min_version",
                                            "max_version",
                                            "prefer_server_cipher_suites"};
        bool is_known = false;
        for (size_t i = 0; k && i < sizeof(known) / sizeof(known[0]); i++)
            is_known = is_known || strcmp(k, known[i]) == 0;
        if (!k)
            WC_FAIL("line %zu: tls_server_config keys must be names", line);
        if (!is_known)
            WC_FAIL("line %zu: tls_server_config.%s is not supported by sluice", line, k);
        if (!v)
            WC_FAIL("line %zu: tls_server_config.%s must be a single value", line, k);
        if (strcmp(k, "cert_file") == 0 || strcmp(k, "key_file") == 0 || strcmp(k, "client_ca_file") == 0) {
            char **slot = k[0] == 'c' && k[1] == 'e' ? &cert : k[0] == 'k' ? &key : &ca;
            free(*slot);
            *slot = v[0] ? wc_path(dir, v) : NULL;
        } else if (strcmp(k, "client_auth_type") == 0) {
            if (v[0] && tls_client_auth_parse(v, &o.client_auth) != 0)
                WC_FAIL("line %zu: invalid client_auth_type \"%s\" (NoClientCert, RequestClientCert, "
                        "RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert)",
                        line, v);
        } else if (strcmp(k, "min_version") == 0 || strcmp(k, "max_version") == 0) {
            int *slot = k[1] == 'i' ? &o.min_version : &o.max_version;
            if (v[0] && tls_version_parse(v, slot) != 0)
                WC_FAIL("line %zu: unknown TLS version \"%s\" for %s (TLS10, TLS11, TLS12, TLS13)", line, v, k);
        }
        /* prefer_server_cipher_suites: server preference is always on (SSL_OP_CIPHER_SERVER_PREFERENCE) */
    }
    if (!cert && !key) {
        if (ca || o.client_auth != TLS_CLIENT_AUTH_NONE)
            WC_FAIL("tls_server_config: client certificates need TLS: set cert_file and key_file");
        return 0; /* plain HTTP, as in exporter-toolkit */
    }
    if (!cert || !key)
        WC_FAIL("tls_server_config: missing %s", cert ? "key_file" : "cert_file");
    o.cert_file = cert;
    o.key_file = key;
    o.client_ca_file = ca;
    wc->tls = tls_server_ctx_new(&o, err, errlen);
    if (!wc->tls)
        goto fail;
    free(cert);
    free(key);
    free(ca);
    return 0;
fail:
    free(cert);
    free(key);
    free(ca);
    return -1;
}

static int wc_parse_users(yaml_document_t *doc, yaml_node_t *m, api_webconfig_t *wc, char *err, size_t errlen)
{
    if (m->type == YAML_SCALAR_NODE && !m->data.scalar.length)
        return 0; /* "basic_auth_users:" with nothing */
    if (m->type != YAML_MAPPING_NODE)
        WC_FAIL("line %zu: basic_auth_users must be a mapping of user: bcrypt hash", m->start_mark.line + 1);
    size_t n = (size_t)(m->data.mapping.pairs.top - m->data.mapping.pairs.start);
    if (n > WEBCONFIG_MAX_USERS)
        WC_FAIL("basic_auth_users: more than %d users", WEBCONFIG_MAX_USERS);
    wc->users = calloc(n ? n : 1, sizeof(*wc->users));
    if (!wc->users)
        WC_FAIL("out of memory");
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        const char *k = wc_scalar(kn), *v = wc_scalar(yaml_document_get_node(doc, p->value));
        size_t line = kn->start_mark.line + 1;
        if (!k || !k[0] || strchr(k, ':'))
            WC_FAIL("line %zu: invalid basic_auth_users user name", line);
        if (!v || !wc_is_bcrypt(v))
            WC_FAIL("line %zu: basic_auth_users.%s is not a bcrypt hash ($2y$10$..., e.g. from htpasswd -nBC 10)", line,
                    k);
        for (size_t i = 0; i < wc->nusers; i++)
            if (strcmp(wc->users[i].name, k) == 0)
                WC_FAIL("line %zu: basic_auth_users: user %s is listed twice", line, k);
        webconfig_user_t *u = &wc->users[wc->nusers++];
        u->name = strdup(k);
        u->hash = strdup(v);
        if (!u->name || !u->hash)
            WC_FAIL("out of memory");
    }
    if (wc->nusers) {
        /* the dummy has the first user's cost, so a wrong user name takes as long as a wrong password */
        char salt[CRYPT_GENSALT_OUTPUT_SIZE];
        struct crypt_data *cd = calloc(1, sizeof(*cd));
        unsigned long cost = strtoul(wc->users[0].hash + 4, NULL, 10);
        const char *h = NULL;
        if (cd && crypt_gensalt_rn("$2b$", cost, NULL, 0, salt, sizeof(salt)))
            h = crypt_rn("sluice-dummy", salt, cd, sizeof(*cd));
        wc->dummy_hash = h && h[0] != '*' ? strdup(h) : NULL;
        free(cd);
        if (!wc->dummy_hash)
            WC_FAIL("cannot compute bcrypt (libcrypt lacks bcrypt?)");
    }
    return 0;
fail:
    return -1;
}

static void wc_free(api_webconfig_t *wc)
{
    if (!wc)
        return;
    tls_ctx_free(wc->tls);
    for (size_t i = 0; i < wc->nusers; i++) {
        free(wc->users[i].name);
        OPENSSL_cleanse(wc->users[i].hash, strlen(wc->users[i].hash));
        free(wc->users[i].hash);
    }
    free(wc->users);
    free(wc->dummy_hash);
    pthread_mutex_destroy(&wc->cache_mu);
    OPENSSL_cleanse(wc->cache, sizeof(wc->cache));
    free(wc);
}

api_webconfig_t *api_webconfig_load(const char *path, char *err, size_t errlen)
{
    char inner[768] = "";
    api_webconfig_t *wc = calloc(1, sizeof(*wc));
    if (!wc) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    atomic_init(&wc->refs, 1);
    pthread_mutex_init(&wc->cache_mu, NULL);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open web config file %s: %m", path);
        wc_free(wc);
        return NULL;
    }
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        dir[0] = 0;
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(err, errlen, "web config file %s: line %zu: %s", path, parser.problem_mark.line + 1,
                 parser.problem ? parser.problem : "invalid YAML");
        yaml_parser_delete(&parser);
        fclose(f);
        wc_free(wc);
        return NULL;
    }
    int rc = 0;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && !(root->type == YAML_MAPPING_NODE || (root->type == YAML_SCALAR_NODE && !root->data.scalar.length))) {
        snprintf(inner, sizeof(inner), "the file must be a mapping");
        rc = -1;
    }
    bool seen_tls = false, seen_users = false;
    for (yaml_node_pair_t *p = root && root->type == YAML_MAPPING_NODE ? root->data.mapping.pairs.start : NULL;
         rc == 0 && p && p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(&doc, p->key), *v = yaml_document_get_node(&doc, p->value);
        const char *k = wc_scalar(kn);
        if (k && strcmp(k, "tls_server_config") == 0 && !seen_tls) {
            seen_tls = true;
            if (!(v->type == YAML_SCALAR_NODE && !v->data.scalar.length))
                rc = wc_parse_tls(&doc, v, dir, wc, inner, sizeof(inner));
        } else if (k && strcmp(k, "basic_auth_users") == 0 && !seen_users) {
            seen_users = true;
            rc = wc_parse_users(&doc, v, wc, inner, sizeof(inner));
        } else if (k && strcmp(k, "http_server_config") == 0 && v->type == YAML_MAPPING_NODE) {
            for (yaml_node_pair_t *q = v->data.mapping.pairs.start; rc == 0 && q < v->data.mapping.pairs.top; q++) {
                yaml_node_t *hk = yaml_document_get_node(&doc, q->key);
                const char *h = wc_scalar(hk);
                if (!h || strcmp(h, "http2") != 0) { /* http2 is accepted: sluice speaks HTTP/1.1 either way */
                    snprintf(inner, sizeof(inner), "line %zu: http_server_config.%s is not supported by sluice",
                             hk->start_mark.line + 1, h ? h : "?");
                    rc = -1;
                }
            }
        } else {
            snprintf(inner, sizeof(inner), "line %zu: unknown or repeated key %s", kn->start_mark.line + 1,
                     k ? k : "(not a name)");
            rc = -1;
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    if (rc != 0) {
        snprintf(err, errlen, "web config file %s: %s", path, inner);
        wc_free(wc);
        return NULL;
    }
    return wc;
}

void api_webconfig_ref(api_webconfig_t *wc)
{
    atomic_fetch_add(&wc->refs, 1);
}

void api_webconfig_unref(api_webconfig_t *wc)
{
    if (wc && atomic_fetch_sub(&wc->refs, 1) == 1)
        wc_free(wc);
}

struct ssl_ctx_st *api_webconfig_tls(const api_webconfig_t *wc)
{
    return wc ? wc->tls : NULL;
}

bool api_webconfig_has_users(const api_webconfig_t *wc)
{
    return wc && wc->nusers > 0;
}

/* ---- basic auth ------------------------------------------------------------------------------ */

/* RFC 4648 base64 (padding optional). Returns the decoded length, or -1 on a bad character or a
 * result longer than cap. */
static long wc_base64_decode(const char *s, size_t n, char *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int v;
        if (c >= 'A' && c <= 'Z')
            v = c - 'A';
        else if (c >= 'a' && c <= 'z')
            v = c - 'a' + 26;
        else if (c >= '0' && c <= '9')
            v = c - '0' + 52;
        else if (c == '+')
            v = 62;
        else if (c == '/')
            v = 63;
        else if (c == '=')
            break;
        else
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap)
                return -1;
            out[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    return (long)o;
}

static void wc_cache_key(const char *user, size_t ul, const char *pw, size_t pl, const char *hash, uint8_t *key)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int len = 0;
    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 || EVP_DigestUpdate(md, user, ul) != 1 ||
        EVP_DigestUpdate(md, "", 1) != 1 || EVP_DigestUpdate(md, pw, pl) != 1 || EVP_DigestUpdate(md, "", 1) != 1 ||
        EVP_DigestUpdate(md, hash, strlen(hash)) != 1 || EVP_DigestFinal_ex(md, key, &len) != 1)
        RAND_bytes(key, SHA256_DIGEST_LENGTH); /* cannot hash: a key that never matches (no caching) */
    EVP_MD_CTX_free(md);
}

static bool wc_cache_hit(api_webconfig_t *wc, const uint8_t *key)
{
    int64_t now = clock_mono_ms();
    bool hit = false;
    pthread_mutex_lock(&wc->cache_mu);
    for (int i = 0; i < WEBCONFIG_CACHE_SLOTS; i++)
        if (wc->cache[i].expires_ms > now && CRYPTO_memcmp(wc->cache[i].key, key, SHA256_DIGEST_LENGTH) == 0)
            hit = true;
    pthread_mutex_unlock(&wc->cache_mu);
    return hit;
}

static void wc_cache_put(api_webconfig_t *wc, const uint8_t *key)
{
    int64_t now = clock_mono_ms();
    pthread_mutex_lock(&wc->cache_mu);
    int victim = 0; /* an empty or expired slot, else the one expiring first */
    for (int i = 0; i < WEBCONFIG_CACHE_SLOTS; i++) {
        if (wc->cache[i].expires_ms <= now) {
            victim = i;
            break;
        }
        if (wc->cache[i].expires_ms < wc->cache[victim].expires_ms)
            victim = i;
    }
    memcpy(wc->cache[victim].key, key, SHA256_DIGEST_LENGTH);
    wc->cache[victim].expires_ms = now + WEBCONFIG_CACHE_TTL_MS;
    pthread_mutex_unlock(&wc->cache_mu);
}

bool api_webconfig_check_basic(api_webconfig_t *wc, const char *h)
{
    if (!wc || !wc->nusers)
        return true;
    if (!h || strncasecmp(h, "Basic ", 6) != 0)
        return false;
    h += 6;
    while (*h == ' ')
        h++;
    size_t hl = strlen(h);
    while (hl && h[hl - 1] == ' ')
        hl--;
    char cred[WEBCONFIG_MAX_CREDENTIALS + 1];
    long n = wc_base64_decode(h, hl, cred, WEBCONFIG_MAX_CREDENTIALS);
    if (n < 0)
        return false;
    cred[n] = 0;
    char *colon = memchr(cred, ':', (size_t)n);
    if (!colon || memchr(cred, 0, (size_t)n)) { /* a NUL would cut the password short in crypt */
        OPENSSL_cleanse(cred, sizeof(cred));
        return false;
    }
    *colon = 0;
    const char *user = cred, *pw = colon + 1;
    size_t ul = (size_t)(colon - cred), pl = (size_t)n - ul - 1;
    const webconfig_user_t *u = NULL;
    for (size_t i = 0; i < wc->nusers; i++)
        if (strcmp(wc->users[i].name, user) == 0)
            u = &wc->users[i];
    const char *hash = u ? u->hash : wc->dummy_hash;
    uint8_t key[SHA256_DIGEST_LENGTH];
    wc_cache_key(user, ul, pw, pl, hash, key);
    bool ok = false;
    if (u && wc_cache_hit(wc, key)) {
        ok = true;
    } else {
        struct crypt_data *cd = calloc(1, sizeof(*cd));
        const char *out = cd ? crypt_rn(pw, hash, cd, sizeof(*cd)) : NULL;
        size_t hlen = strlen(hash);
        ok = u && out && strlen(out) == hlen && CRYPTO_memcmp(out, hash, hlen) == 0;
        if (cd) {
            OPENSSL_cleanse(cd, sizeof(*cd));
            free(cd);
        }
        if (ok)
            wc_cache_put(wc, key);
    }
    OPENSSL_cleanse(cred, sizeof(cred));
    return ok;
}
