/* sluicectl http — blocking HTTP/1.1 client; see http.h. */
#include "cmd/sluicectl/http.h"

#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int ctl_url_parse(const char *url, ctl_url_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (strncmp(url, "https://", 8) == 0) {
        snprintf(err, errlen, "https is not supported; use http:// (behind a TLS proxy if needed)");
        return -1;
    }
    const char *p = url;
    if (strncmp(p, "http://", 7) == 0)
        p += 7;
    const char *slash = strchr(p, '/');
    size_t hostport_len = slash ? (size_t)(slash - p) : strlen(p);
    char hp[256];
    if (hostport_len == 0 || hostport_len >= sizeof(hp)) {
        snprintf(err, errlen, "invalid server URL \"%s\"", url);
        return -1;
    }
    memcpy(hp, p, hostport_len);
    hp[hostport_len] = 0;
    const char *port = "80";
    if (hp[0] == '[') {
        char *close = strchr(hp, ']');
        if (!close) {
            snprintf(err, errlen, "invalid server URL \"%s\"", url);
            return -1;
        }
        *close = 0;
        snprintf(out->host, sizeof(out->host), "%s", hp + 1);
        if (close[1] == ':')
            port = close + 2;
    } else {
        char *colon = strrchr(hp, ':');
        if (colon) {
            *colon = 0;
            port = colon + 1;
        }
        snprintf(out->host, sizeof(out->host), "%s", hp);
    }
    snprintf(out->port, sizeof(out->port), "%s", port);
    if (!out->host[0] || !out->port[0] || strspn(out->port, "0123456789") != strlen(out->port)) {
        snprintf(err, errlen, "invalid server URL \"%s\"", url);
        return -1;
    }
    if (slash) {
        snprintf(out->prefix, sizeof(out->prefix), "%s", slash);
        size_t n = strlen(out->prefix);
        while (n && out->prefix[n - 1] == '/')
            out->prefix[--n] = 0;
    }
    return 0;
}

void ctl_url_escape(buf_t *out, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
            *p == '_' || *p == '.' || *p == '~')
            buf_putc(out, (char)*p);
        else {
            buf_putc(out, '%');
            buf_putc(out, hex[*p >> 4]);
            buf_putc(out, hex[*p & 15]);
        }
    }
}

static int ctl_connect(const ctl_url_t *url, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(url->host, url->port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", url->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        snprintf(err, errlen, "cannot connect to %s:%s: %s", url->host, url->port, strerror(saved ? saved : errno));
    return fd;
}

static int ctl_write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A read buffer over the socket. */
typedef struct {
    int fd;
    char buf[16384];
    size_t pos, len;
    bool eof;
} ctl_reader_t;

static int ctl_fill(ctl_reader_t *r)
{
    if (r->pos < r->len)
        return 0;
    ssize_t n;
    do
        n = read(r->fd, r->buf, sizeof(r->buf));
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        r->eof = true;
        return -1;
    }
    r->pos = 0;
    r->len = (size_t)n;
    return 0;
}

/* Reads one CRLF-terminated line (without the CRLF) into line. -1 at EOF or overflow. */
static int ctl_read_line(ctl_reader_t *r, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (ctl_fill(r) != 0)
            return -1;
        char c = r->buf[r->pos++];
        if (c == '\n') {
            if (n && line[n - 1] == '\r')
                n--;
            line[n] = 0;
            return 0;
        }
        if (n + 1 >= cap)
            return -1;
        line[n++] = c;
    }
}

static int ctl_deliver(const ctl_http_req_t *req, buf_t *out, const char *p, size_t n)
{
    if (req->sink)
        return req->sink(p, n, req->sink_ud);
    buf_append(out, p, n);
    return 0;
}

/* Copies up to n body bytes (n = SIZE_MAX: to EOF) to the sink. 1 if the sink stopped, 0 done,
 * -1 on a short read. */
static int ctl_copy(ctl_reader_t *r, const ctl_http_req_t *req, buf_t *out, size_t n)
{
    while (n) {
        if (ctl_fill(r) != 0)
            return n == SIZE_MAX ? 0 : -1;
        size_t take = r->len - r->pos;
        if (take > n)
            take = n;
        if (ctl_deliver(req, out, r->buf + r->pos, take) != 0)
            return 1;
        r->pos += take;
        if (n != SIZE_MAX)
            n -= take;
    }
    return 0;
}

int ctl_http_do(const ctl_url_t *url, const ctl_http_req_t *req, buf_t *body_out, char *err, size_t errlen)
{
    int fd = ctl_connect(url, err, errlen);
    if (fd < 0)
        return -1;
    buf_t head = BUF_INIT;
    bool v6 = strchr(url->host, ':') != NULL;
    buf_printf(&head, "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: sluicectl\r\nConnection: close\r\n",
               req->method, url->prefix, req->path, v6 ? "[" : "", url->host, v6 ? "]" : "", url->port);
    if (req->token)
        buf_printf(&head, "Authorization: Bearer %s\r\n", req->token);
    if (req->extra_header)
        buf_printf(&head, "%s\r\n", req->extra_header);
    if (req->body || strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0) {
        buf_printf(&head, "Content-Type: %s\r\nContent-Length: %zu\r\n",
                   req->content_type ? req->content_type : "application/json", req->body_len);
    }
    buf_puts(&head, "\r\n");
    int status = -1;
    ctl_reader_t *r = calloc(1, sizeof(*r));
    if (!r || ctl_write_all(fd, head.data, head.len) != 0 ||
        (req->body_len && ctl_write_all(fd, req->body, req->body_len) != 0)) {
        snprintf(err, errlen, "cannot send the request: %s", strerror(errno));
        goto out;
    }
    r->fd = fd;
    char line[8192];
    if (ctl_read_line(r, line, sizeof(line)) != 0 || strncmp(line, "HTTP/1.", 7) != 0 || strlen(line) < 12) {
        snprintf(err, errlen, "no HTTP response from %s:%s", url->host, url->port);
        goto out;
    }
    int code = atoi(line + 9);
    size_t clen = SIZE_MAX;
    bool chunked = false;
    for (;;) {
        if (ctl_read_line(r, line, sizeof(line)) != 0) {
            snprintf(err, errlen, "truncated response headers");
            goto out;
        }
        if (!line[0])
            break;
        if (strncasecmp(line, "Content-Length:", 15) == 0)
            clen = (size_t)strtoull(line + 15, NULL, 10);
        else if (strncasecmp(line, "Transfer-Encoding:", 18) == 0 && strstr(line + 18, "chunked"))
            chunked = true;
    }
    if (strcmp(req->method, "HEAD") == 0 || code == 304 || code == 204) {
        status = code;
        goto out;
    }
    if (chunked) {
        for (;;) {
            if (ctl_read_line(r, line, sizeof(line)) != 0) {
                snprintf(err, errlen, "connection closed in the middle of the response");
                goto out;
            }
            size_t n = (size_t)strtoull(line, NULL, 16);
            if (n == 0)
                break;
            int rc = ctl_copy(r, req, body_out, n);
            if (rc == 1)
                break;
            if (rc < 0 || ctl_read_line(r, line, sizeof(line)) != 0) {
                snprintf(err, errlen, "connection closed in the middle of the response");
                goto out;
            }
        }
    } else if (ctl_copy(r, req, body_out, clen) < 0) {
        snprintf(err, errlen, "connection closed in the middle of the response");
        goto out;
    }
    status = code;
out:
    free(r);
    buf_free(&head);
    close(fd);
    return status;
}
