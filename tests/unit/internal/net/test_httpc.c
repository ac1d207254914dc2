/* Unit tests for internal/net/httpc.c: URL parsing and base64 (pure), and the client against a
 * scripted one-connection-at-a-time server on 127.0.0.1 in a thread. They cover what its two
 * callers rely on: api/forward (extra auth headers, Retry-After, a bounded reason body, keep-alive
 * with the silent reconnect) and internal/rules/notifier (Content-Type, any 2xx, a timeout that
 * bounds a silent peer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal/net/httpc.h"

/* ---- scripted server ------------------------------------------------------------------------- */

typedef struct {
    const char *resp; /* written after the request was read in full */
    int close_after;  /* close the connection after the response (without saying so) */
    int no_reply;     /* read the request, answer nothing, wait for the client to hang up */
} step_t;

#define SRV_MAX_STEPS 8

typedef struct {
    int lfd, port;
    pthread_t th;
    const step_t *steps;
    size_t nsteps;
    int conns;                 /* connections accepted */
    char *reqs[SRV_MAX_STEPS]; /* each request as received, head and body */
    size_t nreqs;
} srv_t;

static int srv_accept(srv_t *s)
{
    struct pollfd p = {.fd = s->lfd, .events = POLLIN};
    if (poll(&p, 1, 5000) <= 0)
        return -1;
    int fd = accept(s->lfd, NULL, NULL);
    if (fd >= 0)
        s->conns++;
    return fd;
}

/* Reads one request (head + Content-Length body). Returns it malloc'd, or NULL when the client
 * closed the connection first. */
static char *srv_read_request(int fd)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    size_t need = (size_t)-1;
    while (len < need && len < cap) {
        ssize_t r = recv(fd, b + len, cap - len, 0);
        if (r <= 0) {
            free(b);
            return NULL;
        }
        len += (size_t)r;
        b[len] = 0;
        char *eoh = strstr(b, "\r\n\r\n");
        if (eoh && need == (size_t)-1) {
            char *cl = strcasestr(b, "Content-Length:");
            need = (size_t)(eoh - b) + 4 + (cl ? strtoul(cl + 15, NULL, 10) : 0);
        }
    }
    return b;
}

static void *srv_main(void *arg)
{
    srv_t *s = arg;
    int fd = -1;
    for (size_t i = 0; i < s->nsteps; i++) {
        char *req = NULL;
        while (!req) {
            if (fd < 0 && (fd = srv_accept(s)) < 0)
                goto out;
            req = srv_read_request(fd);
            if (!req) { /* the client hung up: it will come back on a new connection */
                close(fd);
                fd = -1;
            }
        }
        s->reqs[s->nreqs++] = req;
        const step_t *st = &s->steps[i];
        if (st->no_reply) {
            char c;
            while (recv(fd, &c, 1, 0) > 0)
                ;
        } else {
            size_t off = 0, n = strlen(st->resp);
            while (off < n) {
                ssize_t w = send(fd, st->resp + off, n - off, MSG_NOSIGNAL);
                if (w <= 0)
                    break;
                off += (size_t)w;
            }
        }
        if (st->close_after || st->no_reply) {
            close(fd);
            fd = -1;
        }
    }
out:
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void srv_start(srv_t *s, const step_t *steps, size_t n)
{
    memset(s, 0, sizeof(*s));
    assert_true(n <= SRV_MAX_STEPS);
    s->steps = steps;
    s->nsteps = n;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(s->lfd, 8), 0);
    socklen_t al = sizeof(a);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s->th, NULL, srv_main, s), 0);
}

/* Waits for the script to end; the recorded requests stay until srv_free. */
static void srv_stop(srv_t *s)
{
    pthread_join(s->th, NULL);
    close(s->lfd);
}

static void srv_free(srv_t *s)
{
    for (size_t i = 0; i < s->nreqs; i++)
        free(s->reqs[i]);
}

static httpc_conn_t *conn_to(const srv_t *s, const char *path)
{
    char url[128], err[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", s->port, path);
    httpc_url_t u;
    assert_int_equal(httpc_url_parse(url, &u, err, sizeof(err)), 0);
    httpc_conn_t *c = httpc_conn_new(&u);
    assert_non_null(c);
    return c;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One scripted server and one connection to it. */
typedef struct {
    srv_t s;
    httpc_conn_t *c;
    httpc_response_t r;
} client_t;

static void client_start(client_t *cl, const step_t *steps, size_t n)
{
    srv_start(&cl->s, steps, n);
    cl->c = conn_to(&cl->s, "/w");
    httpc_response_init(&cl->r);
}

/* POSTs one byte; the call must succeed. Returns the status. */
static int client_post(client_t *cl, size_t max_body)
{
    char err[256] = "";
    int rc = httpc_post(cl->c, NULL, "a", 1, 2000, max_body, &cl->r, err, sizeof(err));
    if (rc != 0)
        fail_msg("httpc_post: %s", err);
    return cl->r.status;
}

/* Frees the client, waits for the server's script to end; returns the connections it accepted. */
static int client_end(client_t *cl)
{
    httpc_response_free(&cl->r);
    httpc_conn_free(cl->c);
    srv_stop(&cl->s);
    srv_free(&cl->s);
    return cl->s.conns;
}

/* ---- pure pieces ------------------------------------------------------------------------------ */

static void test_url_parse(void **state)
{
    (void)state;
    httpc_url_t u;
    char err[256];
    assert_int_equal(
        httpc_url_parse("http://vm.example:8480/insert/0/prometheus/api/v1/write?x=1", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "vm.example");
    assert_string_equal(u.port, "8480");
    assert_string_equal(u.path, "/insert/0/prometheus/api/v1/write?x=1");
    assert_string_equal(u.hostport, "vm.example:8480");
    assert_int_equal(httpc_url_parse("http://h", &u, err, sizeof(err)), 0);
    assert_string_equal(u.port, "80");
    assert_string_equal(u.path, "/");
    assert_int_equal(httpc_url_parse("http://[::1]:9090/api/v1/write", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.port, "9090");
    assert_int_equal(httpc_url_parse("http://[::1]/api/v2/alerts", &u, err, sizeof(err)), 0);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.port, "80");
    assert_string_equal(u.path, "/api/v2/alerts");
    assert_int_equal(httpc_url_parse("https://h/w", &u, err, sizeof(err)), 0);
    assert_true(u.tls);
    assert_string_equal(u.port, "443");
    assert_int_equal(httpc_url_parse("https://[::1]:9443/w", &u, err, sizeof(err)), 0);
    assert_true(u.tls);
    assert_string_equal(u.port, "9443");
    assert_int_equal(httpc_url_parse("http://h/w", &u, err, sizeof(err)), 0);
    assert_false(u.tls);
    /* TLS settings are checked when loaded: a missing CA file or a cert without its key */
    httpc_tls_options_t to = {.ca_file = "/nonexistent/ca.crt"};
    assert_null(httpc_tls_new(&to, err, sizeof(err)));
    assert_non_null(strstr(err, "/nonexistent/ca.crt"));
    to = (httpc_tls_options_t){.cert_file = "/x.crt"};
    assert_null(httpc_tls_new(&to, err, sizeof(err)));
    assert_non_null(strstr(err, "key file"));
    to = (httpc_tls_options_t){.insecure_skip_verify = true};
    httpc_tls_t *t = httpc_tls_new(&to, err, sizeof(err));
    assert_non_null(t);
    httpc_tls_free(t);
    assert_int_equal(httpc_url_parse("ftp://h/w", &u, err, sizeof(err)), -1);
    assert_int_equal(httpc_url_parse("http://h:x/w", &u, err, sizeof(err)), -1);
    assert_int_equal(httpc_url_parse("http:///w", &u, err, sizeof(err)), -1);
}

/* The tls-* target options shared by the remote-write and remote-read specs. */
static void test_tls_spec(void **state)
{
    (void)state;
    char err[256];
    httpc_tls_spec_t s = HTTPC_TLS_SPEC_INIT;
#define PARSE(k, v) httpc_tls_spec_parse(&s, k, strlen(k), v, strlen(v), err, sizeof(err))
    assert_int_equal(PARSE("name", "x"), 0); /* not a TLS key: left to the caller */
    assert_int_equal(PARSE("tls-ca", "x"), 0);
    assert_int_equal(PARSE("tls-ca-file", "/first"), 1);
    assert_int_equal(PARSE("tls-ca-file", "/nonexistent/spec-ca.crt"), 1); /* the last one wins */
    assert_string_equal(s.ca_file, "/nonexistent/spec-ca.crt");
    assert_int_equal(PARSE("tls-cert-file", ""), 1);
    assert_string_equal(s.cert_file, "");
    assert_int_equal(PARSE("tls-server-name", "prom.example"), 1);
    assert_int_equal(s.insecure_skip_verify, -1);
    assert_int_equal(PARSE("tls-insecure-skip-verify", "1"), -1);
    assert_non_null(strstr(err, "true or false"));
    assert_int_equal(PARSE("tls-insecure-skip-verify", "true"), 1);
    assert_int_equal(s.insecure_skip_verify, 1);

    httpc_url_t plain, secure;
    assert_int_equal(httpc_url_parse("http://h:9090/api/v1/read", &plain, err, sizeof(err)), 0);
    assert_int_equal(httpc_url_parse("https://h:9090/api/v1/read", &secure, err, sizeof(err)), 0);
    httpc_tls_t *t = (httpc_tls_t *)&s; /* overwritten with NULL on every path */
    bool insecure = true;
    /* a plain URL: no context, and tls-* keys are an error */
    assert_int_equal(httpc_tls_spec_build(&s, NULL, &plain, &t, &insecure, err, sizeof(err)), -1);
    assert_null(t);
    assert_non_null(strstr(err, "need an https:// URL"));
    /* https: the spec's CA file is loaded (and missing) */
    assert_int_equal(httpc_tls_spec_build(&s, NULL, &secure, &t, &insecure, err, sizeof(err)), -1);
    assert_null(t);
    assert_non_null(strstr(err, "/nonexistent/spec-ca.crt"));
    /* the spec's empty tls-cert-file= wins over a default certificate (without a key: an error) */
    httpc_tls_options_t d = {.cert_file = "/nonexistent/default.crt", .insecure_skip_verify = false};
    assert_int_equal(PARSE("tls-ca-file", ""), 1);
    assert_int_equal(httpc_tls_spec_build(&s, &d, &secure, &t, &insecure, err, sizeof(err)), 0);
    assert_non_null(t);
    assert_true(insecure); /* the spec's tls-insecure-skip-verify=true over the default false */
    httpc_tls_free(t);
    httpc_tls_spec_free(&s);
    assert_null(s.ca_file);
    /* nothing in the spec: the defaults, and a plain URL ignores them */
    assert_int_equal(httpc_tls_spec_build(&s, &d, &secure, &t, &insecure, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "key file"));
    assert_int_equal(httpc_tls_spec_build(&s, &d, &plain, &t, &insecure, err, sizeof(err)), 0);
    assert_null(t);
    assert_false(insecure);
    d = (httpc_tls_options_t){.insecure_skip_verify = true};
    assert_int_equal(PARSE("tls-insecure-skip-verify", "false"), 1);
    assert_int_equal(httpc_tls_spec_build(&s, &d, &secure, &t, &insecure, err, sizeof(err)), 0);
    assert_false(insecure);
    httpc_tls_free(t);
    httpc_tls_spec_free(&s);
#undef PARSE
}

static void test_base64(void **state)
{
    (void)state;
    const char *in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar", "u:s3cret"};
    const char *out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy", "dTpzM2NyZXQ="};
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        buf_t b = BUF_INIT;
        buf_puts(&b, "");
        httpc_base64(&b, in[i], strlen(in[i]));
        assert_string_equal(b.data, out[i]);
        buf_free(&b);
    }
}

/* ---- against a server ------------------------------------------------------------------------- */

/* Headers and body arrive as given; two requests share one kept connection. */
static void test_post_keeps_connection(void **state)
{
    (void)state;
    static const step_t steps[] = {
        {.resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"},
        {.resp = "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"},
    };
    srv_t s;
    srv_start(&s, steps, 2);
    httpc_conn_t *c = conn_to(&s, "/api/v2/alerts");
    httpc_response_t r;
    httpc_response_init(&r);
    char err[256];
    assert_int_equal(httpc_post(c, "Content-Type: application/json\r\nAuthorization: Basic dTpw\r\n", "[{}]", 4, 2000,
                                1024, &r, err, sizeof(err)),
                     0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body.data, "ok");
    assert_string_equal(r.content_type, "text/plain");
    assert_int_equal(r.retry_after_ms, -1);
    assert_int_equal(httpc_post(c, NULL, "x", 1, 2000, 1024, &r, err, sizeof(err)), 0);
    assert_int_equal(r.status, 202);
    assert_int_equal(r.body.len, 0);
    httpc_response_free(&r);
    httpc_conn_free(c);
    srv_stop(&s);
    assert_int_equal(s.conns, 1);
    assert_int_equal(s.nreqs, 2);
    char host[64];
    snprintf(host, sizeof(host), "\r\nHost: 127.0.0.1:%d\r\n", s.port);
    assert_true(strncmp(s.reqs[0], "POST /api/v2/alerts HTTP/1.1\r\n", 30) == 0);
    assert_non_null(strstr(s.reqs[0], host));
    assert_non_null(strstr(s.reqs[0], "\r\nContent-Length: 4\r\n"));
    assert_non_null(strstr(s.reqs[0], "\r\nContent-Type: application/json\r\n"));
    assert_non_null(strstr(s.reqs[0], "\r\nAuthorization: Basic dTpw\r\n"));
    assert_non_null(strstr(s.reqs[0], "\r\n\r\n[{}]"));
    assert_non_null(strstr(s.reqs[1], "\r\n\r\nx"));
    srv_free(&s);
}

/* Chunked bodies are joined; max_body keeps only a prefix but the whole body is consumed, so the
 * connection stays usable. */
static void test_chunked_and_max_body(void **state)
{
    (void)state;
    static const step_t steps[] = {
        {.resp = "HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "4\r\nout \r\nb\r\nof order sa\r\n6\r\nmples.\r\n0\r\n\r\n"},
        {.resp = "HTTP/1.1 500 Oops\r\nContent-Length: 26\r\n\r\nabcdefghijklmnopqrstuvwxyz"},
        {.resp = "HTTP/1.1 204 No Content\r\n\r\n"},
    };
    client_t cl;
    client_start(&cl, steps, 3);
    assert_int_equal(client_post(&cl, 1024), 400);
    assert_string_equal(cl.r.body.data, "out of order samples.");
    assert_int_equal(client_post(&cl, 5), 500);
    assert_int_equal(cl.r.body.len, 5);
    assert_string_equal(cl.r.body.data, "abcde");
    assert_int_equal(client_post(&cl, 1024), 204);
    assert_int_equal(cl.r.body.len, 0);
    assert_int_equal(client_end(&cl), 1);
}

/* Retry-After in seconds; a body framed by the connection's end; Connection: close and HTTP/1.0
 * make the next request open a new connection. */
static void test_retry_after_and_close(void **state)
{
    (void)state;
    static const step_t steps[] = {
        {.resp = "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
         .close_after = 1},
        {.resp = "HTTP/1.0 503 Service Unavailable\r\n\r\nbusy", .close_after = 1},
        {.resp = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
    };
    client_t cl;
    client_start(&cl, steps, 3);
    assert_int_equal(client_post(&cl, 1024), 429);
    assert_int_equal(cl.r.retry_after_ms, 7000);
    assert_int_equal(client_post(&cl, 1024), 503);
    assert_int_equal(cl.r.retry_after_ms, -1);
    assert_string_equal(cl.r.body.data, "busy");
    assert_int_equal(client_post(&cl, 1024), 200);
    assert_int_equal(client_end(&cl), 3);
}

/* A kept connection the peer closed without a word is reopened once, transparently. */
static void test_reconnects_after_silent_close(void **state)
{
    (void)state;
    static const step_t steps[] = {
        {.resp = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", .close_after = 1},
        {.resp = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo"},
    };
    client_t cl;
    client_start(&cl, steps, 2);
    assert_int_equal(client_post(&cl, 1024), 200);
    usleep(50 * 1000); /* let the close arrive */
    assert_int_equal(client_post(&cl, 1024), 200);
    assert_string_equal(cl.r.body.data, "two");
    assert_int_equal(client_end(&cl), 2);
}

/* A peer that never answers costs the timeout and no more; a closed port fails at once. */
static void test_timeout_and_refused(void **state)
{
    (void)state;
    static const step_t steps[] = {{.no_reply = 1}};
    srv_t s;
    srv_start(&s, steps, 1);
    httpc_conn_t *c = conn_to(&s, "/w");
    httpc_response_t r;
    httpc_response_init(&r);
    char err[256] = "";
    int64_t t0 = mono_ms();
    assert_int_equal(httpc_post(c, NULL, "a", 1, 300, 1024, &r, err, sizeof(err)), -1);
    int64_t took = mono_ms() - t0;
    assert_true(took >= 250 && took < 3000);
    assert_true(err[0] != 0);
    httpc_conn_free(c); /* the server sees the hang-up and ends */
    srv_stop(&s);
    srv_free(&s);

    int port = s.port; /* nobody listens there any more */
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/w", port);
    httpc_url_t u;
    assert_int_equal(httpc_url_parse(url, &u, err, sizeof(err)), 0);
    c = httpc_conn_new(&u);
    err[0] = 0;
    assert_int_equal(httpc_post(c, NULL, "a", 1, 2000, 1024, &r, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "connect"));
    httpc_response_free(&r);
    httpc_conn_free(c);
}

/* The auth options both remote-write and remote-read specs take. */
static void test_auth_spec(void **state)
{
    char err[256];
    httpc_auth_spec_t a = HTTPC_AUTH_SPEC_INIT;
#define P(k, v) httpc_auth_spec_parse(&a, k, strlen(k), v, strlen(v), err, sizeof(err))
    assert_int_equal(P("tls-ca-file", "x"), 0); /* not an auth key */
    assert_int_equal(P("header", "X-Scope-OrgID:  t1"), 1);
    assert_int_equal(P("header", ":nameless"), -1);
    assert_int_equal(P("basic-auth-username", "u"), 1);
    assert_int_equal(P("basic-auth-password", "p"), 1);
    buf_t h = BUF_INIT;
    buf_puts(&h, "");
    assert_int_equal(httpc_auth_spec_build(&a, &h, err, sizeof(err)), 0);
    assert_string_equal(h.data, "X-Scope-OrgID: t1\r\nAuthorization: Basic dTpw\r\n");
    assert_int_equal(P("bearer-token-file", "/nonexistent"), 1);
    assert_int_equal(httpc_auth_spec_build(&a, &h, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "exclusive"));
    httpc_auth_spec_free(&a);
    assert_int_equal(P("basic-auth-password", "p"), 1);
    assert_int_equal(httpc_auth_spec_build(&a, &h, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "needs basic-auth-username"));
    httpc_auth_spec_free(&a);
#undef P
    buf_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_tls_spec), cmocka_unit_test(test_auth_spec),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_post_keeps_connection),
        cmocka_unit_test(test_chunked_and_max_body),
        cmocka_unit_test(test_retry_after_and_close),
        cmocka_unit_test(test_reconnects_after_silent_close),
        cmocka_unit_test(test_timeout_and_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
