/*
 * httpc — blocking HTTP/1.1 client with one kept-alive connection per httpc_conn_t (contract and
 * callers in httpc.h). Non-blocking sockets + poll() give every call one deadline.
 *
 * Response reading: status line and headers (at most 64 KiB), then the body framed by
 * Content-Length, by chunked transfer coding, or by the connection's end. The connection is
 * kept when the response was fully read and the peer did not say "Connection: close".
 *
 * TLS: after the TCP connect an https:// connection runs the OpenSSL handshake on the same
 * non-blocking socket (SSL_connect, polling for whatever it wants, within the call's deadline);
 * from then on conn_send/conn_recv go through SSL_write/SSL_read, so the HTTP code above them is
 * the same for both. A peer that closes without TLS close_notify counts as an ordinary close.
 */
#include "internal/net/httpc.h"

#include <errno.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal/util/clock.h"

#define HTTPC_MAX_HEADER (64 * 1024)

struct httpc_tls {
    SSL_CTX *ctx;
    char *server_name; /* NULL = the URL's host */
    bool verify;
};

struct httpc_conn {
    httpc_url_t u;
    httpc_tls_t *tls; /* NULL: the default (system CAs) for https */
    int fd;
    SSL *ssl;        /* https, while connected */
    char ioerr[256]; /* why the last send/receive failed */
    /* bytes received past the current response (none expected without pipelining) */
    buf_t in;
};

int httpc_url_parse(const char *url, httpc_url_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (strncmp(url, "https://", 8) == 0) {
        out->tls = true;
    } else if (strncmp(url, "http://", 7) != 0) {
        snprintf(err, errlen, "URL must start with http:// or https:// (%s)", url);
        return -1;
    }
    const char *p = url + (out->tls ? 8 : 7);
    const char *slash = strchr(p, '/');
    size_t hl = slash ? (size_t)(slash - p) : strlen(p);
    if (hl == 0 || hl >= sizeof(out->hostport)) {
        snprintf(err, errlen, "invalid host in URL %s", url);
        return -1;
    }
    memcpy(out->hostport, p, hl);
    const char *hp = out->hostport;
    const char *colon;
    if (hp[0] == '[') { /* [v6]:port */
        const char *rb = strchr(hp, ']');
        if (!rb || (size_t)(rb - hp - 1) >= sizeof(out->host)) {
            snprintf(err, errlen, "invalid host in URL %s", url);
            return -1;
        }
        memcpy(out->host, hp + 1, (size_t)(rb - hp - 1));
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = strrchr(hp, ':');
        size_t n = colon ? (size_t)(colon - hp) : strlen(hp);
        if (n == 0 || n >= sizeof(out->host)) {
            snprintf(err, errlen, "invalid host in URL %s", url);
            return -1;
        }
        memcpy(out->host, hp, n);
    }
    if (colon) {
        if (!colon[1] || strlen(colon + 1) >= sizeof(out->port) ||
            strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
            snprintf(err, errlen, "invalid port in URL %s", url);
            return -1;
        }
        snprintf(out->port, sizeof(out->port), "%s", colon + 1);
    } else {
        snprintf(out->port, sizeof(out->port), "%s", out->tls ? "443" : "80");
    }
    const char *path = slash ? slash : "/";
    if (strlen(path) >= sizeof(out->path)) {
        snprintf(err, errlen, "URL path too long");
        return -1;
    }
    snprintf(out->path, sizeof(out->path), "%s", path);
    return 0;
}

httpc_tls_t *httpc_tls_new(const httpc_tls_options_t *o, char *err, size_t errlen)
{
    httpc_tls_t *t = calloc(1, sizeof(*t));
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->ctx = tls_client_ctx_new(o, err, errlen);
    t->verify = !o->insecure_skip_verify;
    if (o->server_name && o->server_name[0])
        t->server_name = strdup(o->server_name);
    if (!t->ctx || (o->server_name && o->server_name[0] && !t->server_name)) {
        if (t->ctx)
            snprintf(err, errlen, "out of memory");
        httpc_tls_free(t);
        return NULL;
    }
    return t;
}

void httpc_tls_free(httpc_tls_t *t)
{
    if (!t)
        return;
    tls_ctx_free(t->ctx);
    free(t->server_name);
    free(t);
}

static bool tls_spec_given(const httpc_tls_spec_t *s)
{
    return s->ca_file || s->cert_file || s->key_file || s->server_name || s->insecure_skip_verify >= 0;
}

int httpc_read_secret_file(const char *path, buf_t *out, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char tmp[4096];
    size_t n;
    while ((n = fread(tmp, 1, sizeof(tmp), fp)) > 0 && out->len < 65536)
        buf_append(out, tmp, n);
    fclose(fp);
    while (out->len &&
           (out->data[out->len - 1] == '\n' || out->data[out->len - 1] == '\r' || out->data[out->len - 1] == ' '))
        out->data[--out->len] = 0;
    return 0;
}

int httpc_auth_spec_parse(httpc_auth_spec_t *s, const char *key, size_t kl, const char *v, size_t vl, char *err,
                          size_t errlen)
{
#define KEY(k) (kl == strlen(k) && memcmp(key, k, kl) == 0)
    char **slot = KEY("basic-auth-username")        ? &s->user
                  : KEY("basic-auth-password")      ? &s->pass
                  : KEY("basic-auth-password-file") ? &s->pass_file
                  : KEY("bearer-token-file")        ? &s->bearer_file
                                                    : NULL;
    if (slot) {
        free(*slot);
        if (!(*slot = strndup(v, vl))) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        return 1;
    }
    if (!KEY("header"))
        return 0;
#undef KEY
    const char *colon = memchr(v, ':', vl);
    if (!colon || colon == v) {
        snprintf(err, errlen, "header option needs Name:value (got %.*s)", (int)vl, v);
        return -1;
    }
    const char *hv = colon + 1;
    while (hv < v + vl && *hv == ' ')
        hv++;
    buf_printf(&s->headers, "%.*s: %.*s\r\n", (int)(colon - v), v, (int)(v + vl - hv), hv);
    return 1;
}

int httpc_auth_spec_build(const httpc_auth_spec_t *s, buf_t *out, char *err, size_t errlen)
{
    if (s->headers.len)
        buf_append(out, s->headers.data, s->headers.len);
    if (!s->user && !s->pass && !s->pass_file)
        return 0;
    if (!s->user) {
        snprintf(err, errlen, "basic-auth-password needs basic-auth-username");
        return -1;
    }
    if (s->bearer_file) {
        snprintf(err, errlen, "basic auth and bearer-token-file are exclusive");
        return -1;
    }
    buf_t pw = BUF_INIT, cred = BUF_INIT;
    buf_puts(&pw, "");
    int rc = 0;
    if (s->pass_file)
        rc = httpc_read_secret_file(s->pass_file, &pw, err, errlen);
    else if (s->pass)
        buf_puts(&pw, s->pass);
    if (rc == 0) {
        buf_printf(&cred, "%s:%s", s->user, pw.data);
        buf_puts(out, "Authorization: Basic ");
        httpc_base64(out, cred.data, cred.len);
        buf_puts(out, "\r\n");
    }
    buf_free(&pw);
    buf_free(&cred);
    return rc;
}

void httpc_auth_spec_free(httpc_auth_spec_t *s)
{
    buf_free(&s->headers);
    free(s->user);
    free(s->pass);
    free(s->pass_file);
    free(s->bearer_file);
    *s = HTTPC_AUTH_SPEC_INIT;
}

int httpc_tls_spec_parse(httpc_tls_spec_t *s, const char *key, size_t kl, const char *v, size_t vl, char *err,
                         size_t errlen)
{
    char **field = NULL;
#define KEY(k) (kl == strlen(k) && memcmp(key, k, kl) == 0)
    if (KEY("tls-ca-file"))
        field = &s->ca_file;
    else if (KEY("tls-cert-file"))
        field = &s->cert_file;
    else if (KEY("tls-key-file"))
        field = &s->key_file;
    else if (KEY("tls-server-name"))
        field = &s->server_name;
    else if (KEY("tls-insecure-skip-verify")) {
        if (vl == 4 && memcmp(v, "true", 4) == 0)
            s->insecure_skip_verify = 1;
        else if (vl == 5 && memcmp(v, "false", 5) == 0)
            s->insecure_skip_verify = 0;
        else {
            snprintf(err, errlen, "tls-insecure-skip-verify must be true or false");
            return -1;
        }
        return 1;
    } else
        return 0;
#undef KEY
    char *dup = strndup(v, vl);
    if (!dup) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    free(*field);
    *field = dup;
    return 1;
}

int httpc_tls_spec_build(const httpc_tls_spec_t *s, const httpc_tls_options_t *defaults, const httpc_url_t *u,
                         httpc_tls_t **out, bool *insecure, char *err, size_t errlen)
{
    *out = NULL;
    *insecure = false;
    if (!u->tls) {
        if (tls_spec_given(s)) {
            snprintf(err, errlen, "tls-* options need an https:// URL");
            return -1;
        }
        return 0; /* the flag defaults are for https:// targets; a plain one ignores them */
    }
    const httpc_tls_options_t none = {0};
    const httpc_tls_options_t *d = defaults ? defaults : &none;
    httpc_tls_options_t o = {.ca_file = s->ca_file ? s->ca_file : d->ca_file,
                             .cert_file = s->cert_file ? s->cert_file : d->cert_file,
                             .key_file = s->key_file ? s->key_file : d->key_file,
                             .server_name = s->server_name ? s->server_name : d->server_name,
                             .insecure_skip_verify =
                                 s->insecure_skip_verify >= 0 ? s->insecure_skip_verify == 1 : d->insecure_skip_verify};
    *out = httpc_tls_new(&o, err, errlen);
    if (!*out)
        return -1;
    *insecure = o.insecure_skip_verify;
    return 0;
}

void httpc_tls_spec_free(httpc_tls_spec_t *s)
{
    free(s->ca_file);
    free(s->cert_file);
    free(s->key_file);
    free(s->server_name);
    *s = HTTPC_TLS_SPEC_INIT;
}

/* The context of https:// connections made without settings: system CAs, verification on. Made
 * once, on first use, and kept for the life of the process. */
static httpc_tls_t *default_tls;
static char default_tls_err[256];

static void default_tls_init(void)
{
    httpc_tls_options_t o = {0};
    default_tls = httpc_tls_new(&o, default_tls_err, sizeof(default_tls_err));
}

httpc_conn_t *httpc_conn_new_tls(const httpc_url_t *u, httpc_tls_t *tls)
{
    httpc_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->u = *u;
    c->tls = tls;
    c->fd = -1;
    buf_init(&c->in);
    return c;
}

httpc_conn_t *httpc_conn_new(const httpc_url_t *u)
{
    return httpc_conn_new_tls(u, NULL);
}

static void conn_close(httpc_conn_t *c)
{
    if (c->ssl) {
        /* best effort close_notify on a non-blocking socket; no waiting for the peer's */
        if (c->fd >= 0)
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        ERR_clear_error();
        c->ssl = NULL;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    buf_reset(&c->in);
}

void httpc_conn_free(httpc_conn_t *c)
{
    if (!c)
        return;
    conn_close(c);
    buf_free(&c->in);
    free(c);
}

void httpc_response_init(httpc_response_t *r)
{
    memset(r, 0, sizeof(*r));
    buf_init(&r->body);
    r->retry_after_ms = -1;
}

void httpc_response_free(httpc_response_t *r)
{
    buf_free(&r->body);
}

static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - clock_mono_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Waits for what OpenSSL asked for (SSL_ERROR_WANT_READ/WRITE). 0, or -1 on timeout / a
 * genuine failure (ioerr then says why). */
static int tls_wait(httpc_conn_t *c, int ret, int64_t deadline)
{
    int e = SSL_get_error(c->ssl, ret);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        ERR_clear_error();
        if (wait_fd(c->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline) == 0)
            return 0;
        snprintf(c->ioerr, sizeof(c->ioerr), "timeout");
        return -1;
    }
    tls_describe_error(c->ssl, e, c->ioerr, sizeof(c->ioerr));
    return -1;
}

static int conn_handshake(httpc_conn_t *c, int64_t deadline, char *err, size_t errlen)
{
    httpc_tls_t *t = c->tls;
    if (!t) {
        static pthread_once_t once = PTHREAD_ONCE_INIT;
        pthread_once(&once, default_tls_init);
        t = default_tls;
        if (!t) {
            snprintf(err, errlen, "%s: %s", c->u.hostport, default_tls_err);
            return -1;
        }
    }
    c->ssl = tls_client_ssl_new(t->ctx, t->server_name ? t->server_name : c->u.host, t->verify, err, errlen);
    if (!c->ssl)
        return -1;
    if (SSL_set_fd(c->ssl, c->fd) != 1) {
        ERR_clear_error();
        snprintf(err, errlen, "%s: cannot attach TLS to the socket", c->u.hostport);
        return -1;
    }
    for (;;) {
        int r = SSL_connect(c->ssl);
        if (r == 1)
            return 0;
        if (tls_wait(c, r, deadline) != 0) {
            snprintf(err, errlen, "%s: TLS handshake failed: %s", c->u.hostport, c->ioerr);
            return -1;
        }
    }
}

static int conn_open(httpc_conn_t *c, int64_t deadline, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(c->u.host, c->u.port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "resolve %s: %s", c->u.host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, p->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, p->ai_addr, p->ai_addrlen) != 0 && errno != EINPROGRESS) {
            snprintf(err, errlen, "connect %s: %s", c->u.hostport, strerror(errno));
            close(fd);
            fd = -1;
            continue;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (wait_fd(fd, POLLOUT, deadline) != 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr) {
            snprintf(err, errlen, "connect %s: %s", c->u.hostport, soerr ? strerror(soerr) : "timeout");
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return -1;
    c->fd = fd;
    if (c->u.tls && conn_handshake(c, deadline, err, errlen) != 0) {
        conn_close(c);
        return -1;
    }
    return 0;
}

/* Sends all n bytes. 0, or -1 with c->ioerr set. */
static int send_all(httpc_conn_t *c, const char *p, size_t n, int64_t deadline)
{
    size_t off = 0;
    while (off < n) {
        if (c->ssl) {
            size_t chunk = n - off > (1u << 30) ? (1u << 30) : n - off;
            int w = SSL_write(c->ssl, p + off, (int)chunk);
            if (w > 0)
                off += (size_t)w;
            else if (tls_wait(c, w, deadline) != 0)
                return -1;
            continue;
        }
        ssize_t w = send(c->fd, p + off, n - off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_fd(c->fd, POLLOUT, deadline) != 0) {
                    snprintf(c->ioerr, sizeof(c->ioerr), "timeout");
                    return -1;
                }
                continue;
            }
            snprintf(c->ioerr, sizeof(c->ioerr), "%s", strerror(errno));
            return -1;
        }
        off += (size_t)w;
    }
    return 0;
}

/* Reads more into c->in. 1 = got bytes, 0 = peer closed, -1 = error/timeout (c->ioerr says). */
static int fill(httpc_conn_t *c, int64_t deadline)
{
    buf_reserve(&c->in, 16384);
    size_t room = c->in.cap - c->in.len - 1;
    while (c->ssl) {
        int r = SSL_read(c->ssl, c->in.data + c->in.len, room > (1u << 30) ? (1 << 30) : (int)room);
        if (r > 0) {
            c->in.len += (size_t)r;
            c->in.data[c->in.len] = 0;
            return 1;
        }
        int e = SSL_get_error(c->ssl, r);
        if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0)) {
            ERR_clear_error();
            return 0; /* close_notify, or a close without one (as many servers do) */
        }
        if (tls_wait(c, r, deadline) != 0)
            return -1;
    }
    for (;;) {
        errno = 0;
        ssize_t r = recv(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len - 1, 0);
        if (r > 0) {
            c->in.len += (size_t)r;
            c->in.data[c->in.len] = 0;
            return 1;
        }
        if (r == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(c->ioerr, sizeof(c->ioerr), "%s", strerror(errno));
            return -1;
        }
        if (wait_fd(c->fd, POLLIN, deadline) != 0) {
            snprintf(c->ioerr, sizeof(c->ioerr), "timeout");
            return -1;
        }
    }
}

static void consume(buf_t *b, size_t n)
{
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    if (b->cap)
        b->data[b->len] = 0;
}

static void keep_body(httpc_response_t *r, const char *p, size_t n, size_t max_body)
{
    if (r->body.len < max_body)
        buf_append(&r->body, p, n < max_body - r->body.len ? n : max_body - r->body.len);
}

static int64_t parse_retry_after(const char *v)
{
    while (*v == ' ')
        v++;
    if (*v >= '0' && *v <= '9') {
        long long s = strtoll(v, NULL, 10);
        return s < 0 ? -1 : (int64_t)s * 1000;
    }
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    const char *end = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!end)
        return -1;
    time_t at = timegm(&tm);
    time_t now = time(NULL);
    return at > now ? (int64_t)(at - now) * 1000 : 0;
}

/* Reads one response. *started is set once a byte arrived. 0 ok, -1 error (err set). */
static int read_response(httpc_conn_t *c, int64_t deadline, size_t max_body, httpc_response_t *r, bool *started,
                         bool *keep, char *err, size_t errlen)
{
    char *eoh;
    while (!c->in.len || !(eoh = strstr(c->in.data, "\r\n\r\n"))) {
        if (c->in.len > HTTPC_MAX_HEADER) {
            snprintf(err, errlen, "response headers too large");
            return -1;
        }
        int f = fill(c, deadline);
        if (f <= 0) {
            snprintf(err, errlen, "%s: %s while waiting for the response", c->u.hostport,
                     f == 0 ? "connection closed" : c->ioerr);
            return -1;
        }
        *started = true;
    }
    size_t hlen = (size_t)(eoh - c->in.data) + 4;
    *eoh = 0;
    int minor = 1, status = 0;
    if (sscanf(c->in.data, "HTTP/1.%d %d", &minor, &status) != 2 || status < 100) {
        snprintf(err, errlen, "bad status line from %s", c->u.hostport);
        return -1;
    }
    r->status = status;
    *keep = minor >= 1;
    long long clen = -1;
    bool chunked = false;
    for (char *line = strstr(c->in.data, "\r\n"); line; line = strstr(line, "\r\n")) {
        line += 2;
        char *colon = strchr(line, ':');
        char *eol = strstr(line, "\r\n");
        if (!colon || (eol && colon > eol))
            continue;
        size_t nl = (size_t)(colon - line);
        char val[256];
        size_t vl = eol ? (size_t)(eol - colon - 1) : strlen(colon + 1);
        if (vl >= sizeof(val))
            vl = sizeof(val) - 1;
        memcpy(val, colon + 1, vl);
        val[vl] = 0;
        char *v = val;
        while (*v == ' ' || *v == '\t')
            v++;
        if (nl == 14 && strncasecmp(line, "Content-Length", nl) == 0)
            clen = strtoll(v, NULL, 10);
        else if (nl == 17 && strncasecmp(line, "Transfer-Encoding", nl) == 0)
            chunked = strcasestr(v, "chunked") != NULL;
        else if (nl == 10 && strncasecmp(line, "Connection", nl) == 0) {
            if (strcasestr(v, "close"))
                *keep = false;
        } else if (nl == 11 && strncasecmp(line, "Retry-After", nl) == 0)
            r->retry_after_ms = parse_retry_after(v);
        else if (nl == 12 && strncasecmp(line, "Content-Type", nl) == 0)
            snprintf(r->content_type, sizeof(r->content_type), "%.127s", v);
    }
    consume(&c->in, hlen);
    if (status == 204 || status == 304 || (status >= 100 && status < 200))
        return 0;
    if (chunked) {
        for (;;) {
            char *crlf;
            while (!c->in.len || !(crlf = strstr(c->in.data, "\r\n"))) {
                if (fill(c, deadline) <= 0)
                    goto short_body;
            }
            unsigned long long sz = strtoull(c->in.data, NULL, 16);
            consume(&c->in, (size_t)(crlf - c->in.data) + 2);
            if (sz == 0) {
                /* trailers end with an empty line */
                while (!c->in.len || !(crlf = strstr(c->in.data, "\r\n"))) {
                    if (fill(c, deadline) <= 0)
                        goto short_body;
                }
                if (crlf == c->in.data) {
                    consume(&c->in, 2);
                    return 0;
                }
                consume(&c->in, (size_t)(crlf - c->in.data) + 2);
                continue;
            }
            unsigned long long left = sz + 2;
            while (left) {
                if (!c->in.len && fill(c, deadline) <= 0)
                    goto short_body;
                size_t take = c->in.len < left ? c->in.len : (size_t)left;
                size_t data = left > 2 ? (size_t)(left - 2 < take ? left - 2 : take) : 0;
                keep_body(r, c->in.data, data, max_body);
                consume(&c->in, take);
                left -= take;
            }
        }
    }
    if (clen >= 0) {
        unsigned long long left = (unsigned long long)clen;
        while (left) {
            if (!c->in.len && fill(c, deadline) <= 0)
                goto short_body;
            size_t take = c->in.len < left ? c->in.len : (size_t)left;
            keep_body(r, c->in.data, take, max_body);
            consume(&c->in, take);
            left -= take;
        }
        return 0;
    }
    /* Body until the connection closes. */
    *keep = false;
    for (;;) {
        if (c->in.len) {
            keep_body(r, c->in.data, c->in.len, max_body);
            buf_reset(&c->in);
        }
        int f = fill(c, deadline);
        if (f == 0)
            return 0;
        if (f < 0)
            goto short_body;
    }
short_body:
    snprintf(err, errlen, "response body cut short by %s", c->u.hostport);
    return -1;
}

int httpc_post(httpc_conn_t *c, const char *headers, const void *body, size_t len, int64_t timeout_ms, size_t max_body,
               httpc_response_t *resp, char *err, size_t errlen)
{
    int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 30000);
    buf_t req = BUF_INIT;
    buf_printf(&req, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sluice\r\nContent-Length: %zu\r\n%s\r\n", c->u.path,
               c->u.hostport, len, headers ? headers : "");
    int rc = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused = c->fd >= 0;
        if (!reused && conn_open(c, deadline, err, errlen) != 0)
            break;
        buf_reset(&resp->body);
        resp->status = 0;
        resp->retry_after_ms = -1;
        resp->content_type[0] = 0;
        bool started = false, keep = false;
        if (send_all(c, req.data, req.len, deadline) != 0 || send_all(c, body, len, deadline) != 0) {
            snprintf(err, errlen, "send to %s: %s", c->u.hostport, c->ioerr);
            conn_close(c);
            if (reused)
                continue;
            break;
        }
        if (read_response(c, deadline, max_body, resp, &started, &keep, err, errlen) != 0) {
            conn_close(c);
            if (reused && !started)
                continue; /* a kept connection the peer had closed */
            break;
        }
        if (!keep)
            conn_close(c);
        rc = 0;
        break;
    }
    buf_free(&req);
    return rc;
}

void httpc_base64(buf_t *out, const void *data, size_t len)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t *p = data;
    size_t i = 0;
    for (; i + 2 < len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        char q[4] = {tab[v >> 18], tab[(v >> 12) & 63], tab[(v >> 6) & 63], tab[v & 63]};
        buf_append(out, q, 4);
    }
    if (len - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        char q[4] = {tab[v >> 18], tab[(v >> 12) & 63], '=', '='};
        buf_append(out, q, 4);
    } else if (len - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        char q[4] = {tab[v >> 18], tab[(v >> 12) & 63], tab[(v >> 6) & 63], '='};
        buf_append(out, q, 4);
    }
}
