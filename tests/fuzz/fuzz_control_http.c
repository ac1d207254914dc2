/*
 * fuzz_control_http — the flow-control API as a client reaches it: bytes on a TCP connection,
 * parsed by libevent's evhttp in api/server.c, dispatched by api/router.c to api/control.c
 * (auth, cross-site refusal, job names, long-polls, SSE, the TIS poll), and changes committed by
 * the control thread to internal/control/store.c's SQLite file. Nothing is stubbed: each server
 * is a real api_server with one worker thread on 127.0.0.1:<ephemeral>, made once (lazily: the
 * replay main has no initializer hook) with its control store in a temporary directory
 * (/dev/shm when there is one, so commits cost no disk flush), and torn down at exit.
 *
 * Input layout (all after the first three bytes optional):
 *
 *   byte 0  bit 2 clear: the client shuts down its sending side once the request is out (the
 *           server sees EOF at once, so a request cut short is not waited for), set: it keeps it
 *           open; low 2 bits: the server and the client's address:
 *             0  OPEN    no token file, client 127.0.0.1 (trusted): changes succeed
 *             1  REMOTE  no token file, client 127.0.0.2 (a remote peer): changes refused
 *             2  LOCKED  token file with a random token made at start-up (the fuzzer cannot know
 *                        it) and read auth on: everything refused
 *             3  TOKEN   token file "fuzz:" FUZZ_TOKEN, client 127.0.0.2: changes with the token
 *   byte 1  method: GET PUT POST HEAD DELETE OPTIONS PATCH or an unknown one; >= 0xf0: RAW, the
 *           rest of the input is sent as it is (request line, headers, framing and all)
 *   byte 2  path prefix from routes[] (the control routes, a job, a job's actions)
 *   rest    <path suffix and query>\n<header lines>\n\n<body>: the harness writes
 *           "METHOD prefix+suffix HTTP/1.1", each header line, a Host header and a Content-Length
 *           unless the input has its own, then the body.
 *
 * The client reads the first response (status line, headers, and a Content-Length body; an SSE
 * stream counts as answered once its headers are in), waiting at most FUZZ_WAIT_MS (a parked
 * long-poll just runs out), then resets the connection (SO_LINGER 0: no TIME_WAIT, so millions
 * of connections do not exhaust ports) — which also exercises the parked-request close paths.
 *
 * Checks: the status is one sluice or libevent can give (500 and 503 are not: nothing here runs
 * out of memory or parks 20000 polls, so they mean a leak or a broken path); LOCKED answers
 * nothing with 2xx or 304; and after every REMOTE or LOCKED request the server's job list is
 * still empty — a refused change never lands, whatever route or pipelined request carried it.
 * OPEN and TOKEN keep what the fuzzer changed; each is recreated with an empty store every
 * FUZZ_RESET_EVERY requests so neither the SQLite file nor the job cache grows without bound.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/control.h"
#include "api/server.h"
#include "internal/util/log.h"
#include "internal/util/metrics.h"
#include "tests/fuzz/fuzz.h"

#define FUZZ_TOKEN "fuzz-token-0123456789"
#define FUZZ_WAIT_MS 10
#define FUZZ_RESET_EVERY 20000
#define FUZZ_MAX_RESPONSE (1 << 20)

enum { OPEN, REMOTE, LOCKED, TOKEN, NSERVERS };

typedef struct {
    api_server_t *srv;
    api_control_t *ctl;
    char dir[256];
    const char *peer;  /* client address */
    const char *token; /* token file content's token, or NULL */
    bool read_auth;
    long requests; /* since (re)creation */
} fuzz_server_t;

static fuzz_server_t servers[NSERVERS];
static char locked_token[40];
static char token_dir[256];

/* --- set-up and tear-down -------------------------------------------------------------------------- */

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            char p[1024];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static const char *tmp_base(void)
{
    if (access("/dev/shm", W_OK) == 0)
        return "/dev/shm";
    return getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
}

/* A folder named for this process, so the next run can tell it from a live run's. */
static void make_dir(char *out, size_t cap)
{
    snprintf(out, cap, "%s/sluice-fuzz-%ld-XXXXXX", tmp_base(), (long)getpid());
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        abort();
    }
}

/* A crash (the point of fuzzing) skips the atexit clean-up: remove what dead runs left. */
static void remove_dead_runs(void)
{
    DIR *d = opendir(tmp_base());
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid;
        char dir[512];
        if (sscanf(e->d_name, "sluice-fuzz-%ld-", &pid) != 1 || pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        snprintf(dir, sizeof(dir), "%s/%s", tmp_base(), e->d_name);
        rm_dir(dir);
    }
    closedir(d);
}

static void server_up(fuzz_server_t *s)
{
    char err[512], tokfile[512] = "";
    make_dir(s->dir, sizeof(s->dir));
    if (s->token) {
        snprintf(tokfile, sizeof(tokfile), "%s/tokens", token_dir);
        snprintf(tokfile + strlen(tokfile), sizeof(tokfile) - strlen(tokfile), "-%d", (int)(s - servers));
        FILE *f = fopen(tokfile, "w");
        if (!f)
            abort();
        fprintf(f, "# fuzz\nfuzz:%s\n", s->token);
        fclose(f);
    }
    api_server_options_t so = {.listen_address = "127.0.0.1:0",
                               .workers = 1,
                               .max_connections = 1 << 20, /* the sweep frees closed ones every 250 ms */
                               .max_body_bytes = 16384,
                               .max_header_bytes = 8192,
                               .read_timeout_ms = 2000};
    s->srv = api_server_create(&so, err, sizeof(err));
    if (!s->srv) {
        fprintf(stderr, "fuzz_control_http: %s\n", err);
        abort();
    }
    api_control_options_t co = {
        .srv = s->srv, .storage_path = s->dir, .token_file = tokfile, .read_auth = s->read_auth};
    s->ctl = api_control_new(&co, err, sizeof(err));
    if (!s->ctl) {
        fprintf(stderr, "fuzz_control_http: %s\n", err);
        abort();
    }
    api_control_register_routes(s->ctl, s->srv);
    if (api_server_start(s->srv, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_control_http: %s\n", err);
        abort();
    }
    s->requests = 0;
}

/* main.c's order: stop the server, stop the control thread, free the server, free control. */
static void server_down(fuzz_server_t *s)
{
    api_server_stop(s->srv, 0);
    api_control_shutdown(s->ctl);
    api_server_destroy(s->srv);
    api_control_free(s->ctl);
    s->srv = NULL;
    s->ctl = NULL;
    rm_dir(s->dir);
}

static void teardown(void)
{
    for (int i = 0; i < NSERVERS; i++)
        if (servers[i].srv)
            server_down(&servers[i]);
    metrics_unregister_all();
    rm_dir(token_dir);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN); /* as cmd/sluice/main.c: a worker writing to a reset connection */
    log_set_level(LOG_OFF);   /* a line per change and per refused request otherwise */
    unsigned char rnd[16];
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, rnd, sizeof(rnd)) != (ssize_t)sizeof(rnd))
        abort();
    close(fd);
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(locked_token + 2 * i, 3, "%02x", rnd[i]);
    remove_dead_runs();
    make_dir(token_dir, sizeof(token_dir));
    servers[OPEN] = (fuzz_server_t){.peer = "127.0.0.1"};
    servers[REMOTE] = (fuzz_server_t){.peer = "127.0.0.2"};
    servers[LOCKED] = (fuzz_server_t){.peer = "127.0.0.1", .token = locked_token, .read_auth = true};
    servers[TOKEN] = (fuzz_server_t){.peer = "127.0.0.2", .token = FUZZ_TOKEN};
    for (int i = 0; i < NSERVERS; i++)
        server_up(&servers[i]);
    atexit(teardown);
}

/* --- the client ------------------------------------------------------------------------------------- */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

typedef struct {
    char *data;
    size_t len, cap;
} fuzz_buf_t;

static void fb_put(fuzz_buf_t *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = realloc(b->data, b->cap);
        if (!b->data)
            abort();
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void fb_puts(fuzz_buf_t *b, const char *s)
{
    fb_put(b, s, strlen(s));
}

/* Where the first non-1xx response ends in r[0:n], or 0 while it is incomplete. *status gets its
 * code (0 until the status line is in). An SSE stream (chunked) ends with its headers. */
static size_t response_end(const char *r, size_t n, bool head, int *status)
{
    size_t off = 0;
    for (;;) {
        const char *hend = memmem(r + off, n - off, "\r\n\r\n", 4);
        if (n - off >= 12 && memcmp(r + off, "HTTP/1.", 7) == 0)
            *status = atoi(r + off + 9);
        if (!hend)
            return 0;
        size_t body = (size_t)(hend - r) + 4;
        if (*status >= 100 && *status < 200) {
            off = body; /* 100 Continue: the real answer follows */
            *status = 0;
            continue;
        }
        if (head || *status == 204 || *status == 304)
            return body;
        /* headers, NUL-terminated copy for strcasestr */
        char *h = strndup(r + off, body - off);
        const char *cl = strcasestr(h, "\r\ncontent-length:");
        bool chunked = strcasestr(h, "\r\ntransfer-encoding:") != NULL;
        size_t want = cl ? strtoul(cl + 17, NULL, 10) : 0;
        free(h);
        if (chunked)
            return body;
        if (!cl)
            return 0; /* ends when the server closes */
        return n - body >= want ? body + want : 0;
    }
}

/* Sends req to s from its peer address, then (half_close) shuts down the sending side; returns the
 * first response's status (0 when none came) and, if out is given, its bytes. */
static int exchange(fuzz_server_t *s, const char *req, size_t len, bool head, bool half_close, fuzz_buf_t *out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        abort();
    struct linger lg = {1, 0}; /* close = RST: no TIME_WAIT on either side */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, s->peer, &a.sin_addr);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        perror("bind");
        abort();
    }
    a.sin_port = htons((uint16_t)api_server_port(s->srv));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    /* non-blocking from the start: libFuzzer's SIGALRM (-timeout) would interrupt a blocking
     * connect; the first POLLOUT below says it is done */
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS && errno != EINTR) {
        perror("connect");
        abort();
    }
    fuzz_buf_t r = {0};
    size_t sent = 0, end = 0;
    int status = 0;
    int64_t deadline = now_us() + FUZZ_WAIT_MS * 1000;
    bool eof = false;
    while (!eof) {
        int64_t left = (deadline - now_us() + 999) / 1000;
        if (left <= 0)
            break;
        struct pollfd p = {fd, (short)(POLLIN | (sent < len ? POLLOUT : 0)), 0};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        if ((p.revents & POLLOUT) && sent < len) {
            ssize_t w = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN)
                sent = len; /* the server closed early (413, 400): read what it said */
            if (sent == len && half_close)
                shutdown(fd, SHUT_WR);
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            char tmp[16384];
            ssize_t got = recv(fd, tmp, sizeof(tmp), 0);
            if (got <= 0) {
                if (got == 0 || errno != EAGAIN)
                    eof = true;
                continue;
            }
            if (r.len < FUZZ_MAX_RESPONSE)
                fb_put(&r, tmp, (size_t)got);
            if ((end = response_end(r.data, r.len, head, &status)) != 0)
                break;
        }
    }
    if (!end && r.len)
        response_end(r.data, r.len, head, &status); /* a body cut short by close still has a status */
    close(fd);
    if (out)
        *out = r;
    else
        free(r.data);
    return status;
}

/* The server's job list is still {"jobs":[]}. */
static void check_no_jobs(fuzz_server_t *s)
{
    char req[256];
    snprintf(req, sizeof(req),
             "GET /api/v1/control/jobs HTTP/1.1\r\nHost: sluice.test\r\n%s%s%sConnection: close\r\n\r\n",
             s->token ? "Authorization: Bearer " : "", s->token ? s->token : "", s->token ? "\r\n" : "");
    fuzz_buf_t r = {0};
    int st = 0;
    /* 0: the worker was busy past the wait (a loaded machine): ask again, for up to 5 s */
    for (int tries = 0; tries < 500 && st == 0; tries++) {
        free(r.data);
        r = (fuzz_buf_t){0};
        st = exchange(s, req, strlen(req), false, false, &r);
    }
    const char *body = r.data ? strstr(r.data, "\r\n\r\n") : NULL;
    if (st != 200 || !body || strcmp(body + 4, "{\"jobs\":[]}") != 0)
        fprintf(stderr, "a refused change landed? GET jobs: %d\n%s\n", st, r.data ? r.data : "");
    FUZZ_CHECK(st == 200 && body && strcmp(body + 4, "{\"jobs\":[]}") == 0);
    free(r.data);
}

/* --- building the request -------------------------------------------------------------------------- */

static const char *const methods[] = {"GET", "PUT", "POST", "HEAD", "DELETE", "OPTIONS", "PATCH", "BREW"};
static const char *const routes[] = {
    "/api/v1/control/jobs/",
    "/api/v1/control/jobs/flink-etl",
    "/api/v1/control/jobs/flink-etl/",
    "/api/v1/control/jobs",
    "/api/v1/control/stream",
    "/config/config.ajax",
    "/api/v1/control/jobs/flink-etl/history",
    "/",
};

static bool has_header(const char *h, size_t n, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl <= n; i++)
        if ((i == 0 || h[i - 1] == '\n') && strncasecmp(h + i, name, nl) == 0)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 65536)
        return 0;
    if (!servers[OPEN].srv)
        setup();
    fuzz_server_t *s = &servers[data[0] & 3];
    if ((s == &servers[OPEN] || s == &servers[TOKEN]) && s->requests >= FUZZ_RESET_EVERY) {
        server_down(s);
        metrics_unregister_all(); /* the registry is small; nothing here scrapes it */
        server_up(s);
    }
    s->requests++;

    fuzz_buf_t req = {0};
    bool head = false;
    const char *rest = (const char *)data + 3;
    size_t rlen = size - 3;
    if (data[1] >= 0xf0) {
        fb_put(&req, data + 1, size - 1);
    } else {
        const char *m = methods[data[1] % (sizeof(methods) / sizeof(methods[0]))];
        head = strcmp(m, "HEAD") == 0;
        const char *sep = memmem(rest, rlen, "\n\n", 2);
        size_t hlen = sep ? (size_t)(sep - rest) : rlen;
        const char *body = sep ? sep + 2 : rest + rlen;
        size_t blen = (size_t)(rest + rlen - body);
        const char *nl = memchr(rest, '\n', hlen);
        size_t plen = nl ? (size_t)(nl - rest) : hlen;
        const char *hdrs = nl ? nl + 1 : rest + hlen;
        size_t hdlen = (size_t)(rest + hlen - hdrs);
        fb_puts(&req, m);
        fb_puts(&req, " ");
        fb_puts(&req, routes[data[2] % (sizeof(routes) / sizeof(routes[0]))]);
        fb_put(&req, rest, plen);
        fb_puts(&req, " HTTP/1.1\r\n");
        for (const char *l = hdrs; l < hdrs + hdlen;) {
            const char *e = memchr(l, '\n', (size_t)(hdrs + hdlen - l));
            size_t ll = e ? (size_t)(e - l) : (size_t)(hdrs + hdlen - l);
            fb_put(&req, l, ll);
            fb_puts(&req, "\r\n");
            l += ll + 1;
        }
        if (!has_header(hdrs, hdlen, "host:"))
            fb_puts(&req, "Host: sluice.test\r\n");
        if (!has_header(hdrs, hdlen, "content-length:") && !has_header(hdrs, hdlen, "transfer-encoding:") &&
            (blen || data[1] % 8 == 1 || data[1] % 8 == 2)) {
            char cl[48];
            snprintf(cl, sizeof(cl), "Content-Length: %zu\r\n", blen);
            fb_puts(&req, cl);
        }
        fb_puts(&req, "\r\n");
        fb_put(&req, body, blen);
    }

    int64_t t0 = now_us();
    int status = exchange(s, req.data, req.len, head, !(data[0] & 4), NULL);
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("FUZZ_CONTROL_HTTP_VERBOSE") != NULL;
    if (verbose) /* which answer each input got: for checking that seeds reach what they aim at */
        fprintf(stderr, "[server %d] %d in %lld us <- %.*s\n", data[0] & 3, status, (long long)(now_us() - t0),
                (int)strcspn(req.data, "\r\n"), req.data);
    free(req.data);

    switch (status) {
    case 0:   /* no answer within the wait (a parked long-poll) or the connection was dropped */
    case 200: /* read, change, TIS poll, stream */
    case 304: /* long-poll: unchanged */
    case 400: /* bad job name, body, parameter; libevent: malformed request */
    case 401: /* token missing or wrong */
    case 403: /* remote peer, cross-site */
    case 404: /* unknown route or action */
    case 405: /* method */
    case 409: /* version conflict */
    case 411: /* libevent: length required */
    case 413: /* body or headers too large */
    case 415: /* a change whose body is not application/json */
    case 417: /* libevent: unknown Expect */
    case 501: /* libevent: unknown method */
    case 505: break;
    default: fprintf(stderr, "unexpected status %d\n", status); FUZZ_CHECK(0);
    }
    if (s == &servers[LOCKED])
        FUZZ_CHECK(status != 200 && status != 304);
    if (s == &servers[REMOTE] || s == &servers[LOCKED])
        check_no_jobs(s);
    return 0;
}
